/* Ring fabrics: connections over a pair of memory windows (ring.h's
 * records), shared by the fabrics whose data path is "write the peer's
 * window, read your own": windows of shared memory between processes of a
 * host, or the windows of a PCIe device.
 *
 * A link joins two endpoints: one pair of windows with `n_chan` channels
 * each. Channel 0 carries the link's own control records (OPEN, CLOSE and
 * FREE of a channel); every connection between the two endpoints gets one
 * of the other channels. A connection that stops reading blocks only its
 * own channel, and thousands of connections share a few links.
 *
 * What differs between fabrics is where the windows come from, how a link
 * is set up and torn down, how a sleeping peer is woken and how a dead one
 * is noticed. A fabric says so in a `ring_link_ops` table (the window
 * provider); the engine (chan.c: connections, link.c: links) calls it and
 * never asks which fabric it runs on. Only transport/ includes this file. */
#ifndef TERN_RING_CHAN_H
#define TERN_RING_CHAN_H

#include <stdbool.h>
#include <sys/epoll.h>

#include "../conn_events.h"
#include "../transport_internal.h"
#include "ring.h"

#define RING_NAME_MAX 64
#define RING_LINK_OFF 64   /* a window starts with one cache line for its link */

enum ring_obj_kind { RING_OBJ_LISTENER, RING_OBJ_LINK };

/* The first cache line of each window, written by the peer. Every link uses
 * peer_sleeping; providers that set links up in the windows themselves
 * also say hello and beat here. */
struct ring_link_ctl {
    volatile uint32_t peer_sleeping;  /* the peer sleeps: ring its doorbell */
    volatile uint32_t magic, version, n_chan, ring_bytes;
    uint32_t pad0;
    volatile uint64_t nonce;          /* the peer's incarnation; 0: none yet */
    volatile uint64_t seen;           /* our nonce the peer saw (it stopped old writes) */
    volatile uint64_t ready;          /* our nonce the peer cleaned its rings for */
    volatile uint64_t beat;           /* the peer's heartbeat counter */
    uint64_t pad1;
};

_Static_assert(sizeof(struct ring_link_ctl) == RING_LINK_OFF,
               "ring_link_ctl is the window's first line");

/* Something with a file descriptor in the endpoint's epoll set. */
struct ring_obj {
    enum ring_obj_kind kind;
    int fd;
};

struct ring_listener {
    struct ring_obj obj;
    struct ring_listener *next;
};

enum ring_link_state { LINK_ACCEPTING, LINK_OPEN, LINK_DEAD };

struct ring_ep;
struct ring_conn;

/* A link. Providers that need more state allocate a larger struct with this
 * one first (ring_link_ops.link_size). */
struct ring_link {
    struct ring_obj obj;           /* fd: the provider's (socket, doorbell), or -1 */
    struct ring_ep *ep;
    struct ring_link *next;
    enum ring_link_state state;
    bool client;                   /* we connected: we allocate channels */
    bool published;                /* a record went out since the doorbell check */
    char name[RING_NAME_MAX + 1];  /* the address it was opened for, or the peer's */
    struct ring_geometry g;
    uint8_t *mine, *peers;         /* our window (read), the peer's (write) */
    size_t win_size;
    struct ring_tx ctl_tx;         /* channel 0 */
    struct ring_rx ctl_rx;
    uint32_t next_chan;            /* client: next channel to hand out */
    unsigned nconns;
    long long born_s;              /* accepted at (set-up timeout) */
    struct ring_conn **chan;       /* connection on each channel, or NULL */
};

enum ring_conn_state {
    ST_OPEN, ST_DRAINING, ST_DEAD,
    ST_CONNECTING,                 /* waiting for its link to come up */
};

struct ring_conn {
    struct tern_tp_conn base;
    struct ring_link *link;
    uint32_t chan;
    enum ring_conn_state state;
    struct tp_conn_events ev;      /* owed events, one-sided in flight */
    bool want_writable;
    char peer[RING_NAME_MAX + 16];

    struct ring_tx tx;
    struct ring_rx rx;

    /* a large message on its way out, FRAG by FRAG */
    uint8_t *stage;
    size_t stage_cap, frag_total, frag_off;
    bool stage_resv, frag_pending;

    /* a large message coming in */
    uint8_t *reasm;
    size_t reasm_cap, reasm_total, reasm_got;
    bool reasm_held;

    unsigned violations;           /* the peer's accesses we refused */
    unsigned ptr_refusals;         /* our tern_tp_rkey_ptr calls refused */
    struct ring_conn *pending_next; /* ST_CONNECTING: next waiting for the link */
};

/* What a window provider does for the engine. Every hook but the marked
 * ones is optional: NULL means the behaviour named beside it. */
struct ring_link_ops {
    size_t link_size;              /* bytes of the provider's link (ring_link first) */
    struct ring_geometry geometry; /* of the links this endpoint opens */
    /* Both sides open channels and a channel is reused once both closed it
     * (and FREE was exchanged); otherwise only the client opens channels and
     * never reuses one. */
    bool shared_channels;
    /* A dead link stays and is brought up again by link_poll; otherwise it
     * goes with its last connection. */
    bool keeps_links;
    /* Wake at least this often from tern_tp_wait (heartbeats); 0: never. */
    int beat_ms;

    /* Required: accept connections at `addr`. */
    int (*listen)(struct ring_ep *ep, const char *addr, char *bound, size_t bound_len);
    /* Required: `c` (named, on the endpoint's list) wants a channel to
     * `addr`. The provider binds it, queues it until its link is up, or
     * fails it (ring_conn_fail with ev.connected set). A negative return
     * means the address itself is bad: the engine frees `c` and returns it. */
    int (*connect)(struct ring_ep *ep, const char *addr, struct ring_conn *c);
    /* A listener's fd is readable. NULL: the provider has no listeners. */
    void (*accept)(struct ring_ep *ep, struct ring_listener *ls);
    /* A link's fd is readable. NULL: its fd only wakes the endpoint. */
    void (*on_fd)(struct ring_link *l, uint32_t events);
    /* Set-up, liveness, timeouts; `tick` at the socket pace. False if the
     * link was freed. */
    bool (*link_poll)(struct ring_link *l, bool tick);
    /* The peer opened `chan`. NULL: accepted if we are not the client. */
    bool (*accepts)(struct ring_link *l, uint32_t chan);
    /* A CLOSE for `chan` was sent (sent) or received (!sent); a FREE was
     * received. Only for shared_channels. */
    void (*on_close)(struct ring_link *l, uint32_t chan, bool sent);
    void (*on_free)(struct ring_link *l, uint32_t chan);
    /* A connection left the link (the engine has unbound it). */
    void (*conn_gone)(struct ring_link *l, struct ring_conn *c);
    /* Required: wake the peer, which said it sleeps. */
    void (*doorbell)(struct ring_link *l);
    /* Let go of the windows and whatever else the link holds (not its fd:
     * the engine closes that). */
    void (*link_release)(struct ring_link *l);
};

struct ring_ep {
    struct tern_tp_ep base;
    const struct ring_link_ops *ops;
    int epfd;
    struct ring_listener *listeners;
    struct ring_link *links;
    unsigned nlinks, polls, auto_names;
    uint64_t sockets_at;           /* when the sockets were last looked at (ns) */
    bool armed;                    /* peers were told we sleep */
    bool bells;                    /* some link has `published` set */
    struct ring_geometry g;        /* for links we open */
    struct epoll_event evbuf[64];
};

#define REP(ep) ((struct ring_ep *)(ep))
#define RCONN(c) ((struct ring_conn *)(c))

/* ---- endpoint (chan.c) ---- */

/* Set the endpoint up for `ops`; providers call it from their ep_open. */
int ring_ep_open(struct tern_tp_ep *base, const struct ring_link_ops *ops);
/* The largest one-sided operation the served path carries on `c`. */
size_t ring_conn_onesided_max(const struct ring_conn *c);

/* The tern_tp_ops every ring fabric shares. A provider's table adds
 * ep_open, ep_close, put and get: ring_tp_* or its own, which call them. */
void ring_tp_ep_close(struct tern_tp_ep *base);
int ring_tp_listen(struct tern_tp_ep *base, const char *addr, char *bound, size_t bound_len);
int ring_tp_connect(struct tern_tp_ep *base, const char *addr, struct tern_tp_conn **out);
void ring_tp_disconnect(struct tern_tp_conn *conn);
const char *ring_tp_conn_peer(const struct tern_tp_conn *conn);
int ring_tp_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf);
int ring_tp_msg_post(struct tern_tp_conn *conn, void *buf, size_t len);
void ring_tp_msg_abort(struct tern_tp_conn *conn, void *buf);
void ring_tp_msg_release(struct tern_tp_conn *conn, const void *view);
size_t ring_tp_rma_max(const struct tern_tp_conn *conn);
int ring_tp_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, const void *src, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);
int ring_tp_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, void *dst, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);
int ring_tp_poll(struct tern_tp_ep *base, struct tern_tp_event *ev, int max);
int ring_tp_flush(struct tern_tp_ep *base);
int ring_tp_wait_fd(struct tern_tp_ep *base);
int ring_tp_arm(struct tern_tp_ep *base);
int ring_tp_wait(struct tern_tp_ep *base, int timeout_ms);

#define RING_TP_OPS \
    .listen = ring_tp_listen, \
    .connect = ring_tp_connect, \
    .disconnect = ring_tp_disconnect, \
    .conn_peer = ring_tp_conn_peer, \
    .msg_alloc = ring_tp_msg_alloc, \
    .msg_post = ring_tp_msg_post, \
    .msg_abort = ring_tp_msg_abort, \
    .msg_release = ring_tp_msg_release, \
    .rma_max = ring_tp_rma_max, \
    .poll = ring_tp_poll, \
    .flush = ring_tp_flush, \
    .wait_fd = ring_tp_wait_fd, \
    .arm = ring_tp_arm, \
    .wait = ring_tp_wait

/* ---- connections (chan.c), for providers ---- */

/* A new connection on channel `chan` of `l` (counted on the link);
 * `accepted`: report it as TERN_TP_EV_ACCEPTED. NULL at the connection
 * limit or without memory. */
struct ring_conn *ring_conn_attach(struct ring_link *l, uint32_t chan, bool accepted);
/* Put `c` on channel `chan` of `l` (the link counts it already). */
void ring_conn_bind(struct ring_conn *c, struct ring_link *l, uint32_t chan);
void ring_conn_fail(struct ring_conn *c, int status, const char *why);
/* The peer closed the channel or the whole link: hand out what it
 * published, then report CLOSED. */
void ring_conn_peer_gone(struct ring_conn *c);
/* The next poll serves `c` first. */
void ring_conn_ready(struct ring_conn *c);

/* ---- links (link.c) ---- */

enum ring_link_op { OP_OPEN = 1, OP_CLOSE = 2, OP_FREE = 3 /* shared channels: clean */ };

/* A link of the provider's size on the endpoint, with `fd` (or -1) in its
 * epoll set. */
struct ring_link *ring_link_new(struct ring_ep *ep, int fd);
/* Bind channel 0 to a window pair of the link's geometry. */
int ring_link_bind(struct ring_link *l, uint8_t *mine, uint8_t *peers);
void ring_link_free(struct ring_link *l);
/* The peer is gone: its connections hand out what it published, then
 * close. The link goes too, unless the provider keeps links. */
void ring_link_dead(struct ring_link *l);
/* A control record on channel 0. */
int ring_link_send(struct ring_link *l, uint32_t op, uint32_t chan);
void ring_link_send_close(struct ring_link *l, uint32_t chan);
/* A connection left its link; the link goes when nothing uses it. */
void ring_link_drop_conn(struct ring_link *l, struct ring_conn *c);
/* Sockets (when `sockets`), provider hooks and control records. */
void ring_links_poll(struct ring_ep *ep, bool sockets);
void ring_links_doorbells(struct ring_ep *ep);
/* Sleep protocol: tell peers we sleep / are awake. */
void ring_links_set_sleeping(struct ring_ep *ep, bool sleeping);
void ring_links_close_all(struct ring_ep *ep);
/* Add a listener on `fd` to the endpoint. */
int ring_listener_add(struct ring_ep *ep, int fd);
/* Seconds on a coarse monotonic clock. */
long long ring_now_s(void);

/* A record went out on `l`: check at the end of the poll whether its peer
 * sleeps and needs the doorbell. */
static inline void ring_link_published(struct ring_link *l)
{
    l->published = true;
    l->ep->bells = true;
}

#endif
