/* softverbs internals: the shared segment every process exposes to its
 * peers (node.c), the objects behind the ibv_* handles (verbs.c) and the
 * data path (post.c). */
#ifndef SV_H
#define SV_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "softverbs.h"

#define SV_MAGIC 0x73766e31u        /* "svn1" */
#define SV_MAX_MR 4096
#define SV_MAX_QP 1024
#define SV_MAX_SRQ 64
#define SV_MAX_CQ 32
#define SV_MAX_SGE 4
#define SV_MAX_WR 1024              /* per receive queue and per send queue */
#define SV_MAX_CQE 16384
#define SV_MAX_INLINE 256
#define SV_MAX_MSG (1u << 30)       /* what the port reports as max_msg_sz */
#define SV_BK_PATH 192              /* a region's backing file's path */

/* QP numbers: the table index in the low bits, a generation above it, so
 * that a stale QP number never reaches a reused slot. Keys the other way
 * round, as on a NIC: the index in the top SV_MR_BITS and a generation
 * below, whose low 8 bits a memory window's owner picks at each bind
 * (ibv_inc_rkey). */
#define SV_MR_BITS 12
#define SV_QP_BITS 10
#define SV_KEY_IDX(key) ((key) >> (32 - SV_MR_BITS))

/* A receive work request, as a peer reads it to deliver a SEND. */
struct sv_wqe {
    uint64_t wr_id;
    uint32_t num_sge;
    struct ibv_sge sge[SV_MAX_SGE];
};

/* A receive queue (of a QP or an SRQ), filled by its owner, drained by the
 * peers that send to it. */
struct sv_rq {
    pthread_mutex_t lock;           /* process-shared, robust */
    uint32_t head, tail;            /* tail: next to post; head: next to take */
    uint32_t depth;
    struct sv_wqe wqe[SV_MAX_WR];
};

/* A completion queue: written by its owner (send completions) and by peers
 * (receive completions), read by its owner. */
struct sv_cq {
    pthread_mutex_t lock;
    uint32_t in_use, gen;
    uint32_t head, tail, depth;
    uint32_t armed;                 /* ibv_req_notify_cq was called */
    uint32_t overrun;               /* a CQE was lost: the CQ is in error */
    int32_t channel;                /* completion channel index, or -1 */
    struct ibv_wc wc[SV_MAX_CQE];
};

/* A memory region, or a memory window (type 2: bound to one QP, and
 * reached only through that QP; its bind states the range and the rights
 * within a region registered with IBV_ACCESS_MW_BIND). */
struct sv_mr_ent {
    uint32_t key;                   /* 0: free */
    uint32_t access;                /* a window: remote rights only, none
                                     * while unbound */
    uint64_t addr, len;
    uint32_t pd;
    uint32_t mw;                    /* 1: a window */
    uint32_t qpn;                   /* a bound window: its QP */
    uint32_t mr_key;                /* a bound window: its region's key */
    /* A region whose memory is a shared mapping of a file, which peers
     * may map too (map.c): how to open it (SV_BK_FILE: the segment's
     * bk_path; SV_BK_FD: /proc/PID/fd/bk_fd), its identity and the file
     * offset of `addr`. SV_BK_NONE: peers copy by system call. */
    uint32_t bk;
    int32_t bk_fd;
    uint64_t bk_dev, bk_ino, bk_off;
};

enum { SV_BK_NONE, SV_BK_FILE, SV_BK_FD };

/* What a peer needs to know of one of our QPs. */
struct sv_qp_ent {
    uint32_t qpn;                   /* 0: free */
    uint32_t state;                 /* enum ibv_qp_state */
    uint32_t pd;
    uint32_t recv_cq;               /* CQ index */
    int32_t srq;                    /* SRQ index, or -1: the QP's own rq */
    uint32_t min_rnr_timer;
    union ibv_gid dgid;             /* the peer it is connected to */
    uint32_t dest_qpn;
    struct sv_rq rq;
};

struct sv_srq_ent {
    uint32_t in_use;
    uint32_t pd;
    struct sv_rq rq;
};

/* The segment: /dev/shm/softverbs.PID. */
struct sv_seg {
    uint32_t magic, version;
    pid_t pid;
    uint64_t incarnation;
    pthread_mutex_t mr_lock;        /* held across a remote access: a
                                     * deregistration waits for it */
    uint32_t mr_gen;                /* bumped when an entry is freed: peers
                                     * then drop their maps of it (map.c) */
    struct sv_mr_ent mr[SV_MAX_MR];
    char bk_path[SV_MAX_MR][SV_BK_PATH];
    struct sv_qp_ent qp[SV_MAX_QP];
    struct sv_srq_ent srq[SV_MAX_SRQ];
    struct sv_cq cq[SV_MAX_CQ];
};

/* A peer's segment, mapped once per context. */
struct sv_peer {
    struct sv_peer *next;
    union ibv_gid gid;
    struct sv_seg *seg;
    /* sv_peer_alive's cache: when the process was last seen alive, and
     * whether it was found dead (for good). Threads race on them
     * harmlessly: at worst two look at once. */
    uint64_t seen_ns;
    bool dead;
    /* The peer's regions mapped into this process (map.c), guarded by the
     * peer's mr_lock, which every access to its memory holds. */
    struct sv_map *maps;
    uint32_t n_maps, maps_gen;
};

/* ---- node.c ---- */

/* Map (creating) this process's segment; NULL with errno on failure. */
struct sv_seg *sv_seg_create(void);
void sv_seg_destroy(struct sv_seg *seg);
/* Map the segment of the process that `gid` names; NULL if it is gone. */
struct sv_seg *sv_seg_attach(const union ibv_gid *gid);
void sv_seg_detach(struct sv_seg *seg);
/* The GID that names a segment's process. */
void sv_seg_gid(const struct sv_seg *seg, union ibv_gid *gid);
/* True while the process behind `seg` lives. */
bool sv_seg_alive(const struct sv_seg *seg);
/* The same for a peer, asking the kernel at most every SV_ALIVE_NS: a NIC
 * learns of a dead peer from a timeout, not on every work request. Between
 * looks a copy into a dead process fails with ESRCH anyway. */
#define SV_ALIVE_NS 1000000ull
bool sv_peer_alive(struct sv_peer *p, uint64_t now_ns);
/* Lock a process-shared mutex, recovering it from a dead owner; it spins
 * SV_LOCK_SPINS tries before it sleeps. */
#define SV_LOCK_SPINS 2000u

static inline void sv_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}
void sv_lock(pthread_mutex_t *m);
void sv_unlock(pthread_mutex_t *m);
int sv_mutex_init(pthread_mutex_t *m);

/* ---- map.c: peers' regions mapped, so that an access is a memcpy ---- */

/* Fill in the backing fields of `e` (a region over [e->addr, e->len)) and
 * `path`: where a peer can map the same memory from, if anywhere. */
void sv_backing_probe(struct sv_mr_ent *e, char path[SV_BK_PATH]);
/* Where remote address `addr` of region or window `e` of peer `p` is in
 * this process, for `len` bytes; NULL: copy by system call. Caller holds
 * the peer's mr_lock and has checked the access against `e`. */
void *sv_map_addr(struct sv_peer *p, const struct sv_mr_ent *e, uint64_t addr, uint64_t len);
/* Unmap everything of `p` (it died, or the context closes). Caller holds
 * the peer's mr_lock or is the only user of `p`. */
void sv_map_drop(struct sv_peer *p);
/* False when SOFTVERBS_MAP=0: every copy is a system call, as before. */
bool sv_map_enabled(void);

/* ---- verbs.c: the objects behind the handles ---- */

/* One context serves every thread of the process (rdma_cm hands out one
 * per device), each thread with its own objects on it, as on a NIC. The
 * context's lock guards what they share: the slots of the segment's
 * tables, the lists and arrays below, and the walk of sv_progress. */
struct sv_context {
    struct ibv_context ibv;
    struct sv_seg *seg;
    union ibv_gid gid;              /* the segment's: what peers' QPs name */
    pthread_mutex_t lock;
    struct sv_peer *peers;
    struct sv_qp *qps;              /* every QP, for send progress */
    struct sv_cq_h *cqs[SV_MAX_CQ];
    struct sv_channel *channels[SV_MAX_CQ];
};

struct sv_pd {
    struct ibv_pd ibv;
    uint32_t id;
};

struct sv_mr {
    struct ibv_mr ibv;
    uint32_t idx;
};

struct sv_mw {
    struct ibv_mw ibv;
    uint32_t idx;
};

struct sv_cq_h {
    struct ibv_cq ibv;
    uint32_t idx;
};

struct sv_channel {
    struct ibv_comp_channel ibv;
    uint32_t idx;
    uint32_t events;                /* delivered, not yet acknowledged */
};

struct sv_srq {
    struct ibv_srq ibv;
    uint32_t idx;
};

/* A posted send, waiting for the peer (RNR) or for its turn. */
struct sv_swr {
    struct ibv_send_wr wr;
    struct ibv_sge sge[SV_MAX_SGE];
    bool signaled;
    unsigned rnr_tries;
    uint64_t retry_at_ns;
    uint64_t first_try_ns;          /* transport retries began */
    uint8_t inline_data[SV_MAX_INLINE];     /* last: not cleared per post */
};

struct sv_qp {
    struct ibv_qp ibv;
    /* Its owner posts and modifies it; any thread's poll may carry out its
     * pending sends (sv_progress). This orders the two: it guards the send
     * queue, the state and the peer. */
    pthread_mutex_t lock;
    struct sv_qp *next;             /* the context's QPs */
    uint32_t idx;
    bool sq_sig_all;
    uint32_t send_cq;               /* CQ index */
    uint32_t max_send_wr, max_inline;
    uint32_t rnr_retry, retry_cnt, timeout;
    struct sv_peer *peer;           /* set at RTR */
    struct sv_swr *sq;              /* ring of pending sends */
    uint32_t sq_head, sq_tail;
};

static inline struct sv_context *sv_ctx(struct ibv_context *c)
{
    return (struct sv_context *)(void *)c;
}

/* The peer named by `gid`, mapped and cached on the context. */
struct sv_peer *sv_peer_get(struct sv_context *ctx, const union ibv_gid *gid);

/* Push a completion onto CQ `idx` of `seg` (ours or a peer's) and ring its
 * channel if armed. False if the CQ overran. */
bool sv_cq_push(struct sv_seg *seg, uint32_t idx, const struct ibv_wc *wc);

/* ---- post.c: the data path (installed in the context's ops) ---- */

int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int sv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int sv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
/* Move a QP to the error state: pending sends complete as flushed. The
 * caller holds the QP's lock. */
void sv_qp_error(struct sv_qp *qp);
/* Work on pending sends of every QP of the context (RNR retries) that no
 * other thread is working on. */
void sv_progress(struct sv_context *ctx);

#endif
