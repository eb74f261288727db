/* What the KV client's files share: kv_client.c (routing, RPC calls, the
 * sync forms) and kv_client_path.c (the one-sided paths). */
#ifndef TERN_KV_CLIENT_INTERNAL_H
#define TERN_KV_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kv.h"
#include "kv_window.h"
#include "kv_wire.h"
#include "pm/pm_record.h"

#define KV_OPS 4096                  /* async calls in flight per client */

/* A server's one-sided state, learned through KV_M_ONESIDED_INFO and KV_M_LEASE. */
struct kv_onesided_srv {
    enum { OS_UNKNOWN, OS_ASKING, OS_READY, OS_OFF } state;
    uint32_t epoch;                  /* tern_session_epoch when learned */
    bool offload;   /* one-sided operations cost the server no CPU */
    struct kv_onesided_info info;
    bool leasing, leased;            /* a LEASE call in flight; a lease held */
    bool populated;                  /* the lease's pages are mapped in (shm) */
    struct kv_lease lease;
    uint32_t next;                   /* where the next record goes in the lease */
    struct kv_lease_req lreq;        /* the LEASE request while in flight */
    struct tern_tp_rkey stage_rkey;  /* our staging slots, for this server's pushes */
};

struct kv_server {
    struct tern_kv *kv;
    struct tern_session *s;
    uint32_t lo, hi;
    struct kv_onesided_srv os;
};

struct kv_op {
    struct tern_kv *kv;
    tern_kv_cb cb;
    void *arg;
    struct kv_key hdr;
    uint32_t next_free;              /* + 1; 0 ends the free list */
    /* one-sided ops */
    struct kv_server *srv;
    const void *key, *val;
    uint16_t klen;
    uint32_t vlen;
    uint64_t hash;
    int stage;                       /* staging slot, or -1 */
    unsigned tries;
    struct kvw_bucket bk;            /* the key's bucket as read */
    struct kv_lput lput;             /* the LPUT request while in flight */
    uint16_t method;                 /* RPC: to send again to another replica */
    struct tern_session *to;         /* RPC: where it was sent */
    struct kv_pget pget;             /* the PGET request while in flight */
    bool has_deadline;               /* PUT: deadline_le goes before the value */
    uint64_t deadline_le;            /* PUT, EXPIRE: the deadline as sent */
};

struct kv_onesided;

/* The replicas of one replicated shard (tern_kv_open_replicas): a session
 * to each that answers, and which one is taken for the primary now. */
#define KV_REPLICAS_MAX 7
struct kv_replicas {
    unsigned n, cur;
    unsigned reader;                            /* the last replica a READ_ANY GET went to */
    char uris[KV_REPLICAS_MAX][256];
    struct tern_session *s[KV_REPLICAS_MAX];    /* NULL: not connected */
    uint64_t retry_at[KV_REPLICAS_MAX];
    /* A replica a call timed out on (stopped, or cut off with its sessions
     * still open) is passed over until then, while others answer. */
    uint64_t suspect_until[KV_REPLICAS_MAX];
    uint64_t connect_ns;
    bool closing;                               /* calls cancelled now end */
    /* the shard's members, asked of a replica every MEMBERS_NS: ones the
     * application did not name (added since) are dialled too */
    uint64_t members_at;
    bool members_asked;
};

struct tern_kv {
    struct tern_rpc_ep *ep;
    struct kv_server *srv;           /* sorted by range */
    unsigned n;
    uint64_t timeout;
    enum tern_kv_path path;
    struct kv_onesided *os;          /* NULL until a one-sided path is chosen */
    struct kv_op ops[KV_OPS];
    uint32_t free_head;
    struct kv_replicas *rep;         /* NULL: partitioned servers (tern_kv_open) */
    uint16_t w_flags;                /* write concern of PUT and DEL (KV_F_W_*) */
    bool read_any;                   /* GETs to any replica (tern_kv_set_read_from) */
};

/* ---- the one-sided paths' state (kv_client_path.c) ---- */

#define STAGE_SLOTS 32u                      /* one-sided ops with a staging slot */
#define STAGE_SLOT (64u * 1024 + 256)        /* a block and a record up to ~64 KiB */
#define MAX_TRIES 16u                        /* torn reads before asking by RPC */
#define MAX_DEPTH 4u                         /* nested inline GETs with their own scratch */
/* TERN_KV_PATH_AUTO sends smaller values inline in an RPC: below this, the
 * record's trip through the pool's cache lines costs more than the server's
 * copy it saves (Chequer puts its threshold between 512 B and 2 KiB). */
#define AUTO_PUT_MIN 1024u

struct kv_stage {
    struct kv_onesided *c;
    uint32_t idx;
};

struct kv_cache_ent {
    uint64_t hash, version;
    uint32_t vlen;
    uint16_t klen;
    uint32_t next;                           /* hash chain, index + 1 */
    uint32_t prev_lru, next_lru;             /* index + 1 */
    uint8_t *data;                           /* key, then value */
};

struct kv_cache {
    unsigned n;                              /* 0: off */
    size_t max_val, key_max;
    struct kv_cache_ent *ents;
    uint32_t *heads, mask;
    uint32_t lru_head, lru_tail;             /* most / least recently used */
    uint32_t used;
    uint8_t *arena;
};

struct kv_onesided {
    struct tern_kv *kv;
    struct tern_rpc_mr *stage_mr;
    uint32_t stage_free;                     /* bit i: slot i is free */
    struct kv_stage stages[STAGE_SLOTS];
    uint8_t *scratch[MAX_DEPTH];
    size_t scratch_len[MAX_DEPTH];
    unsigned depth;
    uint64_t intent;                         /* next intent id (top bit set) */
    struct kv_cache cache;
    struct tern_kv_onesided_stats st;
};

/* kv_client.c: routing, call slots, the RPC path */
struct kv_server *kv_route(struct tern_kv *kv, const void *key, size_t klen);
struct kv_op *kv_op_get(struct tern_kv *kv);
void kv_op_put(struct tern_kv *kv, struct kv_op *op);
/* Send op (filled by the caller: kv, cb, arg) as an RPC. Frees op on failure. */
int kv_op_call(struct kv_op *op, uint16_t method, const void *key, size_t klen,
               const void *val, size_t len);

/* The continuation of GET, PUT and DEL by RPC. */
void kv_op_done(void *arg, int status, const void *reply, size_t len);

/* kv_client_replicas.c: a call that failed on a replica because it is not
 * (or no longer) the primary, or is gone: true if it was sent on to
 * another replica (the op lives on), false to end it with its status. */
bool kv_replica_retry(struct kv_op *op, int status);
/* Before a call: sessions lost to replicas that may be back are opened
 * again (outside tern_rpc_poll: it waits for the handshake). */
void kv_replicas_mend(struct tern_kv *kv);
void kv_replicas_free(struct tern_kv *kv);
/* A READ_ANY GET's replica: the next live one in turn (NULL: none). */
struct tern_session *kv_replica_reader(struct tern_kv *kv);

/* kv_client_path.c: the one place that chooses how a GET or PUT goes */
int kv_path_get(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb, void *arg);
int kv_path_put(struct tern_kv *kv, const void *key, size_t klen, const void *val, size_t len,
                tern_kv_cb cb, void *arg);
void kv_onesided_free(struct tern_kv *kv);
/* What every path shares: ending an op, handing it to RPC, staging slots. */
void kv_op_finish(struct kv_op *op, int status, const void *val, size_t len, uint64_t version);
int kv_op_by_rpc(struct kv_op *op, uint16_t method);
void kv_op_by_rpc_or_end(struct kv_op *op, uint16_t method, int status);
int kv_stage_get(struct kv_onesided *c);
void kv_stage_put(struct kv_onesided *c, int i);
uint8_t *kv_stage_mem(struct kv_onesided *c, int i);
void kv_stage_retire(struct kv_op *op, int status);

/* One file per path. Each takes an op routed to op->srv and either starts
 * it (0) or hands it to RPC itself; a negative return means nothing was
 * started and the op is freed. */
int kv_window_get(struct kv_op *op);      /* kv_client_window.c: read the index window */
void kv_cache_free(struct kv_cache *c);
int kv_push_get(struct kv_op *op);        /* kv_client_push.c: the server pushes the record */
int kv_lease_put(struct kv_op *op);       /* kv_client_lease.c: write into a leased segment */
void kv_lease_ask(struct tern_kv *kv, struct kv_server *srv);

#endif
