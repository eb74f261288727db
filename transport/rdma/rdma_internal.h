/* The rdma fabric's objects, shared by its three files:
 *   rdma.c       the endpoint: device resources, poll, blocking mode
 *   rdma_conn.c  connection set-up and teardown over rdma_cm
 *   rdma_data.c  the message path, one-sided operations, completions
 *
 * The message path (docs/RDMA.md explains the choice): each side of a
 * connection owns a receive ring, registered for remote write. The sender
 * keeps a local copy of the peer's ring layout (its tx ring), builds each
 * message there in place and copies it into the same offset of the peer's
 * ring with one RDMA WRITE_WITH_IMM. The immediate carries the sender's own
 * receive progress (credit for the reverse direction); the completion on
 * the receiver, taken from a shared receive queue of zero-length receives,
 * says a record landed. Credit goes back piggybacked on records, or alone
 * as a zero-length SEND_WITH_IMM when the sender is running short.
 *
 * Isolation (docs/RDMA.md): on a device with type 2 memory windows no
 * memory is registered with remote rights of its own. Each connection's
 * receive ring, and each region a peer is given a key for
 * (tern_tp_conn_mr_rkey), is reached through a window bound to that
 * connection's queue pair, so a key seen or guessed by another peer is
 * refused by the NIC. The ring's window key cannot ride in the CM hello
 * (the QP can bind it only once it is up): the hello says KEY_IN_BAND, and
 * the first work request that reaches the peer's receive queue is a
 * zero-length SEND_WITH_IMM carrying the key, after the bind on the same
 * send queue. Until the peer's key arrives, records stay staged. */
#ifndef TERN_RDMA_INTERNAL_H
#define TERN_RDMA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "../conn_events.h"
#include "../transport_internal.h"
#include "rdma_api.h"

#define RDMA_ALIGN 64u          /* records start on cache lines */
#define RDMA_HDR 8u             /* struct rdma_rec ahead of each payload */
#define RDMA_SQ_DEPTH 128u      /* send work requests per connection */
#define RDMA_SIGNAL_EVERY 32u   /* selective signalling: one completion per */
#define RDMA_MAX_INLINE 128u    /* asked of the device; it may give less */
#define RDMA_CQ_MAX 16383       /* CQ entries, if the device has them */
#define RDMA_SRQ_MAX 1024u      /* zero-length receives in the SRQ */
#define RDMA_SRQ_REPOST 16u     /* receives are put back in batches */
#define RDMA_WC_BATCH 32
#define RDMA_FLUSH_BATCH 32     /* work requests per ibv_post_send */
#define RDMA_CM_EVERY 256u      /* busy polls between looks at the CM */
#define RDMA_RING_MIN_LOG2 12
#define RDMA_RING_MAX_LOG2 30   /* the credit in an immediate has 31 bits */
#define RDMA_STAGE_MAX 4096u    /* bytes staged before the peer's ring is known
                                 * (the smallest ring a peer may have) */

#define RDMA_HELLO_MAGIC 0x4d445274u    /* "tRDM" */
#define RDMA_HELLO_VERSION 2u           /* 2: the ring key may come in band */
#define RDMA_HELLO_KEY_IN_BAND 1u       /* flags: ring_rkey follows, see above */

/* What each side tells the other in the CM private data (little endian;
 * fits the 56 bytes a connect request carries). */
struct rdma_hello {
    uint32_t magic;
    uint16_t version;
    uint8_t ring_log2;
    uint8_t flags;              /* RDMA_HELLO_KEY_IN_BAND */
    uint64_t ring_addr;
    uint32_t ring_rkey;
    uint32_t max_msg;
};

/* The head of every record in a ring. */
enum { REC_MSG = 0x4d, REC_PAD = 0x50 };   /* PAD: local tx ring only */
struct rdma_rec {
    uint32_t len;               /* payload bytes (PAD: bytes skipped) */
    uint32_t kind;
};

/* Immediate data: our receive progress, and a flag asking for credit. */
#define IMM_CREDIT_MASK 0x7fffffffu
#define IMM_LOW (1u << 31)

/* Send work request ids: the kind in the top bits, the connection's
 * send sequence number below. */
enum { WR_MSG = 1, WR_CREDIT = 2, WR_ONESIDED = 3, WR_MARKER = 4, WR_BIND = 5, WR_KEY = 6 };
#define WR_ID(kind, seq) ((uint64_t)(kind) << 32 | (uint32_t)(seq))
#define WR_KIND(id) ((unsigned)((id) >> 32))
#define WR_SEQ(id) ((uint32_t)(id))

/* What the CM id's context points at. */
enum rdma_obj_kind { OBJ_LISTENER = 1, OBJ_CONN = 2 };

struct rdma_listener {
    enum rdma_obj_kind kind;
    struct rdma_cm_id *id;
    struct rdma_listener *next;
};

enum rdma_conn_state {
    RC_RESOLVING,   /* active: address and route */
    RC_CONNECTING,  /* active: request sent */
    RC_ACCEPTING,   /* passive: accepted, waiting for the peer's RTU */
    RC_OPEN,
    RC_CLOSING,     /* QP in error, waiting for its work requests to drain */
    RC_DEAD,
};

/* A one-sided operation, staged until the next flush. Index i matches
 * entry i of the connection's tp_conn_events pending list. */
struct rdma_os {
    bool is_put;
    int local_status;           /* refused here, never posted (0: post it) */
    uint64_t after;             /* goes out after the records before this */
    uint64_t laddr, raddr;
    uint32_t len, lkey, rkey;
    uint32_t seq;               /* its work request's, once posted */
};

/* A memory window bound to one connection's queue pair: over its receive
 * ring (mr NULL), or over a region a key was asked for. */
struct rdma_win {
    struct rdma_win *next;
    const struct tern_tp_mr *mr;
    struct ibv_mw *mw;
    struct ibv_mr *over;        /* the registration it lies in */
    uint64_t addr, len;
    uint32_t rkey;              /* what the bind gives it */
    uint32_t access;            /* IBV_ACCESS_REMOTE_* */
    bool posted;                /* its bind is on the send queue */
};

struct rdma_conn {
    struct tern_tp_conn base;
    enum rdma_obj_kind kind;    /* OBJ_CONN: the CM id's context */
    enum rdma_conn_state state;
    bool active;                /* we connected (vs accepted) */
    bool opened;                /* it reached RC_OPEN */
    bool announced;             /* the user knows of it (ACCEPTED owed/sent) */
    struct tp_conn_events ev;
    struct rdma_cm_id *id;
    struct ibv_qp *qp;
    uint32_t qpn;
    struct rdma_conn *qp_next;  /* the endpoint's QP number table */
    struct rdma_conn *dirty_next;
    bool dirty, want_writable;
    uint32_t max_inline;
    int fail_status;            /* why it is closing */
    char peer[64];

    /* Receive ring: the peer writes records into it. */
    uint8_t *rx;
    uint64_t rx_size;
    struct ibv_mr *rx_mr;
    uint64_t rx_seen;           /* stream position after the last record */
    uint64_t rx_consumed;       /* released up to here */
    uint64_t rx_credit_sent;    /* rx_consumed as last told to the peer */
    unsigned rx_views;
    bool peer_low;              /* the peer's last record asked for credit */
    bool credit_owed;

    /* Transmit ring: the layout of the peer's receive ring. */
    uint8_t *tx;
    uint64_t tx_size;
    struct ibv_mr *tx_mr;
    uint64_t peer_ring_addr;
    uint32_t peer_rkey, peer_max_msg;
    uint64_t tx_head;           /* records published up to here */
    uint64_t tx_sent;           /* handed to the QP up to here */
    uint64_t tx_credit;         /* the peer's rx_consumed, as last heard */
    uint8_t *resv;              /* open reservation (payload start) */
    size_t resv_len;
    uint64_t resv_start;        /* its record's stream position */
    uint64_t resv_skip;         /* the ring tail it skips (PAD), if any */
    uint8_t relayout_log2;      /* the peer's ring differs from the one we
                                 * staged into: re-lay once no reservation
                                 * is open (rdma_conn.c) */

    /* Windows bound (or to be bound) to the QP, bound in list order. */
    struct rdma_win *wins;
    struct rdma_win *ring_win;  /* the one over rx (with windows), also on the list */
    unsigned wins_unposted;
    bool key_owed;              /* our ring's key, in band, not yet posted */
    bool peer_keyed;            /* the peer's ring key is known */

    /* Send queue: sequence numbers of work requests posted and known done. */
    uint32_t sq_posted, sq_done, sq_last_signal;
    bool marker_posted;

    struct rdma_os os[TP_PEND_MAX];
    unsigned os_posted;         /* pend index of the next one to post */
};

struct rdma_ep {
    struct tern_tp_ep base;
    struct tern_rdma_dev dev;
    const struct tern_rdma_api *api;
    struct ibv_pd *pd;
    struct ibv_comp_channel *cc;
    struct ibv_cq *cq;
    struct ibv_srq *srq;
    struct rdma_event_channel *cm;
    int epfd;                   /* the wait fd: completion and CM channels */
    uint32_t cq_depth, srq_depth;
    uint8_t rd_atomic;          /* RDMA READs in flight per QP, each way */
    bool mw;                    /* type 2 memory windows isolate connections */
    long cq_free;               /* CQ entries no work request can claim */
    long cq_deferred;           /* freed once the CQ is next seen empty */
    uint32_t srq_missing;       /* receives taken, not yet put back */
    struct ibv_wc wc[RDMA_WC_BATCH];
    int wc_head, wc_n;          /* polled, not yet handled */
    struct rdma_conn *dirty;    /* connections with work to post */
    struct rdma_listener *listeners;
    struct rdma_conn **qp_tab;  /* QP number -> connection */
    uint32_t qp_mask;
    unsigned polls, cm_pending;
    int failed;                 /* endpoint-wide failure (the CQ overran):
                                 * every poll reports it once the events
                                 * taken before it are out */
};

#define REP(ep) ((struct rdma_ep *)(void *)(ep))
#define RCONN(c) ((struct rdma_conn *)(void *)(c))

static inline uint64_t rec_size(uint64_t len)
{
    return (RDMA_HDR + len + RDMA_ALIGN - 1) & ~(uint64_t)(RDMA_ALIGN - 1);
}

/* ---- rdma_conn.c ---- */
int trdma_listen(struct tern_tp_ep *ep, const char *addr, char *bound, size_t bound_len);
int trdma_connect(struct tern_tp_ep *ep, const char *addr, struct tern_tp_conn **out);
void trdma_disconnect(struct tern_tp_conn *conn);
const char *trdma_conn_peer(const struct tern_tp_conn *conn);
/* Handle what the CM channel holds. */
void trdma_cm_poll(struct rdma_ep *ep);
/* Move a connection towards CLOSED with `status`: its QP to the error
 * state, then (rdma_data.c) drain its work requests. */
void trdma_conn_fail(struct rdma_conn *c, int status);
/* Free a connection and everything it holds. */
void trdma_conn_free(struct rdma_conn *c);
struct rdma_conn *trdma_conn_by_qpn(struct rdma_ep *ep, uint32_t qpn);
/* The pending re-layout of the staged records, now that no reservation
 * is open. */
void trdma_conn_relayout(struct rdma_conn *c);
/* The passive side is up: its ESTABLISHED, or data only an up peer sends. */
void trdma_conn_established(struct rdma_conn *c);
/* The active side has the peer's ring key: CONNECTED. */
void trdma_conn_usable(struct rdma_conn *c);
void trdma_listeners_close(struct rdma_ep *ep);
/* tern_tp_conn_mr_rkey: a window over `mr` bound to the connection. */
int trdma_conn_rkey(struct tern_tp_conn *conn, struct tern_tp_mr *mr, struct tern_tp_rkey *out);
/* Free the windows of every connection over `mr` (it is being
 * deregistered). */
void trdma_windows_drop(struct rdma_ep *ep, const struct tern_tp_mr *mr);

/* ---- rdma_data.c ---- */
int trdma_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf);
int trdma_msg_post(struct tern_tp_conn *conn, void *buf, size_t len);
void trdma_msg_abort(struct tern_tp_conn *conn, void *buf);
void trdma_msg_release(struct tern_tp_conn *conn, const void *view);
int trdma_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, const void *src, size_t len,
             const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);
int trdma_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, void *dst, size_t len,
             const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);
int trdma_flush(struct tern_tp_ep *ep);
void trdma_mark_dirty(struct rdma_conn *c);
/* Handle polled completions into events; returns how many were written
 * (on a CQ overrun, those taken before it, with ep->failed set). */
int trdma_wc_handle(struct rdma_ep *ep, struct tern_tp_event *ev, int max);
/* The CQ overran: the endpoint has failed. */
void trdma_cq_overrun(struct rdma_ep *ep);
/* Put back the receives the SRQ has handed out. */
void trdma_srq_refill(struct rdma_ep *ep, bool all);
/* After the QP moved to error: post the marker whose flush says every
 * earlier work request is accounted for. */
void trdma_conn_drain(struct rdma_conn *c);

#endif
