/* The shm fabric's parts: links (link.c) and connections (shm.c).
 *
 * A link joins two endpoints: one Unix seqpacket socket and one pair of
 * windows with `n_chan` channels each. Channel 0 carries the link's own
 * control records (OPEN and CLOSE of a channel); every connection between
 * the two endpoints gets one of the other channels. Only the connecting side
 * allocates channels, and a channel is never reused on its link, so no close
 * handshake is needed: when a link's channels run out, the next connection
 * opens a new link.
 *
 * The ntb fabric runs the same connections over an NTB link (ntb_link.c):
 * one window pair per device, found by a handshake in the windows instead
 * of a socket, both sides opening channels, and a heartbeat instead of a
 * socket hang-up to tell that the peer is gone. */
#ifndef TERN_SHM_INTERNAL_H
#define TERN_SHM_INTERNAL_H

#include <stdbool.h>
#include <sys/epoll.h>

#include "../conn_events.h"
#include "../ring/ring.h"
#include "../transport_internal.h"

#define SHM_NAME_MAX 64
#define SHM_RINGS_OFF 64   /* a window starts with one cache line for its link */

/* NTB links: geometry, heartbeat period and how long a silent peer lives. */
#define NTB_CHANNELS 512
#define NTB_RING_BYTES (64u * 1024)
#define NTB_BEAT_MS 100
#define NTB_PARTS 8        /* partitions of each window, one link each */

enum shm_kind { KIND_LISTENER, KIND_LINK };

/* The first cache line of each window, written by the peer. Socket links
 * use only peer_sleeping; NTB links also say hello and beat here. */
struct link_ctl {
    volatile uint32_t peer_sleeping;  /* the peer sleeps: ring its doorbell */
    volatile uint32_t magic, version, n_chan, ring_bytes;
    uint32_t pad0;
    volatile uint64_t nonce;          /* the peer's incarnation; 0: none yet */
    volatile uint64_t seen;           /* our nonce the peer saw (it stopped old writes) */
    volatile uint64_t ready;          /* our nonce the peer cleaned its rings for */
    volatile uint64_t beat;           /* the peer's heartbeat counter */
    uint64_t pad1;
};

_Static_assert(sizeof(struct link_ctl) == SHM_RINGS_OFF, "link_ctl is the window's first line");

struct ntb_link;

struct shm_obj {
    enum shm_kind kind;
    int fd;
};

struct shm_listener {
    struct shm_obj obj;
    struct shm_listener *next;
};

enum link_state { LINK_ACCEPTING, LINK_OPEN, LINK_DEAD };

struct shm_conn;

struct shm_link {
    struct shm_obj obj;
    struct shm_ep *ep;
    struct shm_link *next;
    enum link_state state;
    bool client;                   /* we connected: we allocate channels */
    bool published;                /* a record went out since the doorbell check */
    char name[SHM_NAME_MAX + 1];   /* client: the listener's name */
    struct ring_geometry g;
    uint8_t *mine, *peers;         /* our window (read), the peer's (write) */
    size_t win_size;
    struct ring_tx ctl_tx;         /* channel 0 */
    struct ring_rx ctl_rx;
    uint32_t next_chan;            /* client: next channel to hand out */
    unsigned nconns;
    long long born_s;              /* accepted at (HELLO timeout) */
    struct shm_conn **chan;        /* connection on each channel, or NULL */
    struct ntb_link *ntb;          /* NTB links only (ntb_link.c) */
    /* direct one-sided access (direct.c) */
    struct shm_rmap *rmap;         /* the peer's regions we know, by key slot */
    const struct shm_mrpub *peer_tab;  /* the peer's published regions */
    unsigned map_refusals;         /* map requests of the peer we refused */
};

/* One published region in an endpoint's table, which peers map read-only
 * to check that a key they use directly is still registered. */
struct shm_mrpub {
    volatile uint32_t key;         /* 0: none */
    uint32_t access;
    uint64_t len;
};

enum shm_state { ST_OPEN, ST_DRAINING, ST_DEAD, ST_CONNECTING /* ntb: link not up yet */ };

struct shm_conn {
    struct tern_tp_conn base;
    struct shm_link *link;
    uint32_t chan;
    enum shm_state state;
    struct tp_conn_events ev;      /* owed events, one-sided in flight */
    bool want_writable;
    char peer[SHM_NAME_MAX + 16];

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
    struct shm_conn *pending_next; /* ST_CONNECTING: next waiting for the link */
};

struct shm_ep {
    struct tern_tp_ep base;
    int epfd;
    struct shm_listener *listeners;
    struct shm_link *links;
    unsigned nlinks, polls, auto_names;
    uint64_t sockets_at;           /* when the sockets were last looked at (ns) */
    struct shm_mrpub *tab;         /* our published regions (shm only), or NULL */
    int tab_fd;
    bool armed;                    /* peers were told we sleep */
    bool bells;                    /* some link has `published` set */
    bool ntb;                      /* the ntb fabric: links are NTB links */
    struct ring_geometry g;        /* for links we open */
    struct epoll_event evbuf[64];
};

#define SEP(ep) ((struct shm_ep *)(ep))
#define SCONN(c) ((struct shm_conn *)(c))

/* link.c */
int shm_link_listen(struct shm_ep *ep, const char *addr, char *bound, size_t bound_len);
/* A link to `name` with a free channel (an existing one or a new one). */
int shm_link_for(struct shm_ep *ep, const char *name, struct shm_link **out);
/* Tell the peer a channel opened / closed (control records on channel 0). */
int shm_link_send_open(struct shm_link *l, uint32_t chan);
void shm_link_send_close(struct shm_link *l, uint32_t chan);
/* A connection left its link; the link goes when nothing uses it. */
void shm_link_drop_conn(struct shm_link *l, struct shm_conn *c);
/* Sockets (accepts, HELLOs, hang-ups, doorbells) and control records. */
void shm_links_poll(struct shm_ep *ep, bool sockets);
void shm_links_doorbells(struct shm_ep *ep);

/* A record went out on `l`: check at the end of the poll whether its peer
 * sleeps and needs the doorbell. */
static inline void shm_link_published(struct shm_link *l)
{
    l->published = true;
    l->ep->bells = true;
}
/* Sleep protocol: tell peers we sleep / are awake. */
void shm_links_set_sleeping(struct shm_ep *ep, bool sleeping);
void shm_links_close_all(struct shm_ep *ep);

/* Shared with ntb_link.c. */
struct shm_link *shm_link_new(struct shm_ep *ep, int fd);
int shm_link_bind(struct shm_link *l, uint8_t *mine, uint8_t *peers);
void shm_link_free(struct shm_link *l);
void shm_link_dead(struct shm_link *l);
int shm_link_send(struct shm_link *l, uint32_t op, uint32_t chan);
enum shm_link_op { OP_OPEN = 1, OP_CLOSE = 2, OP_FREE = 3 /* ntb: channel clean */ };

/* ntb_link.c */
int ntb_link_listen(struct shm_ep *ep, const char *addr, char *bound, size_t bound_len);
/* Attach to the device `addr` (once per endpoint) and add `c` to it: at once
 * if the link is up, else when it comes up. */
int ntb_link_connect(struct shm_ep *ep, const char *addr, struct shm_conn *c);
/* Handshake, heartbeat, liveness: called from shm_links_poll. */
void ntb_link_poll(struct shm_link *l, bool tick);
/* Channel bookkeeping on NTB links (both sides open channels and reuse them). */
bool ntb_link_accepts(struct shm_link *l, uint32_t chan);
void ntb_link_on_close(struct shm_link *l, uint32_t chan, bool sent);
void ntb_link_on_free(struct shm_link *l, uint32_t chan);
void ntb_link_conn_gone(struct shm_link *l, struct shm_conn *c);
void ntb_link_ring(struct shm_link *l);
void ntb_link_close(struct shm_link *l);

/* direct.c: put and get as loads and stores into the peer's memory */
int shm_direct_ep_open(struct shm_ep *ep);
void shm_direct_ep_close(struct shm_ep *ep);
int shm_direct_publish(struct tern_tp_ep *base, struct tern_tp_mr *mr, bool up);
void shm_direct_link_free(struct shm_link *l);
/* A message on the link socket: true if it was a map request or answer. */
bool shm_direct_on_socket(struct shm_link *l, const void *buf, size_t n, const int *fds,
                          int nfds);
/* Do a put/get directly: 1 if done (its completion is queued), 0 if it
 * must go the served way (not mapped yet, refused), TERN_EAGAIN while served
 * operations are in flight (order). */
int shm_direct(struct shm_conn *c, bool put, void *local, size_t len,
               const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token, size_t max_len);
/* tern_tp_rkey_ptr on a shm connection (the caller counts refusals). */
int shm_direct_ptr(struct shm_conn *c, const struct tern_tp_rkey *rkey, uint64_t roff,
                   size_t len, uint32_t need, void **ptr);

/* shm.c, called by link.c and ntb_link.c */
struct shm_conn *shm_conn_attach(struct shm_link *l, uint32_t chan, bool accepted);
void shm_conn_bind(struct shm_conn *c, struct shm_link *l, uint32_t chan);
void shm_conn_fail(struct shm_conn *c, int status, const char *why);
void shm_conn_peer_gone(struct shm_conn *c);
void shm_ready_push(struct shm_conn *c);

#endif
