/* The shm fabric's parts: links (link.c) and connections (shm.c).
 *
 * A link joins two endpoints: one Unix seqpacket socket and one pair of
 * windows with `n_chan` channels each. Channel 0 carries the link's own
 * control records (OPEN and CLOSE of a channel); every connection between
 * the two endpoints gets one of the other channels. Only the connecting side
 * allocates channels, and a channel is never reused on its link, so no close
 * handshake is needed: when a link's channels run out, the next connection
 * opens a new link. */
#ifndef TERN_SHM_INTERNAL_H
#define TERN_SHM_INTERNAL_H

#include <stdbool.h>
#include <sys/epoll.h>

#include "../conn_events.h"
#include "../ring/ring.h"
#include "../transport_internal.h"

#define SHM_NAME_MAX 64
#define SHM_RINGS_OFF 64   /* a window starts with one cache line for its link */

enum shm_kind { KIND_LISTENER, KIND_LINK };

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
};

enum shm_state { ST_OPEN, ST_DRAINING, ST_DEAD };

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

    unsigned violations;
};

struct shm_ep {
    struct tern_tp_ep base;
    int epfd;
    struct shm_listener *listeners;
    struct shm_link *links;
    unsigned nlinks, polls, auto_names;
    bool armed;                    /* peers were told we sleep */
    bool bells;                    /* some link has `published` set */
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

/* shm.c, called by link.c */
struct shm_conn *shm_conn_attach(struct shm_link *l, uint32_t chan, bool accepted);
void shm_conn_peer_gone(struct shm_conn *c);
void shm_ready_push(struct shm_conn *c);

#endif
