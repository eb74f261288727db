/* The shm fabric's parts: the window provider (shm.c: a Unix seqpacket
 * socket and a pair of memfd windows per link) and direct one-sided access
 * (direct.c). Connections and links are the ring engine's (ring/chan.h).
 *
 * Only the connecting side allocates channels, and a channel is never
 * reused on its link, so no close handshake is needed: when a link's
 * channels run out, the next connection opens a new link. The socket
 * carries the set-up, the hang-up of a dead peer, doorbells, and the map
 * requests of direct access. */
#ifndef TERN_SHM_INTERNAL_H
#define TERN_SHM_INTERNAL_H

#include "../ring/chan.h"

/* One published region in an endpoint's table, which peers map read-only
 * to check that a key they use directly is still registered. */
struct shm_mrpub {
    volatile uint32_t key;         /* 0: none */
    uint32_t access;
    uint64_t len;
};

struct shm_rmap;

struct shm_ep {
    struct ring_ep r;
    struct shm_mrpub *tab;         /* our published regions, or NULL */
    int tab_fd;
};

struct shm_link {
    struct ring_link r;
    /* direct one-sided access (direct.c) */
    struct shm_rmap *rmap;         /* the peer's regions we know, by key slot */
    const struct shm_mrpub *peer_tab;  /* the peer's published regions */
    unsigned map_refusals;         /* map requests of the peer we refused */
};

#define SHEP(ep) ((struct shm_ep *)(ep))
#define SHLINK(l) ((struct shm_link *)(l))

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
int shm_direct(struct ring_conn *c, bool put, void *local, size_t len,
               const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token, size_t max_len);
/* tern_tp_rkey_ptr on a shm connection (the caller counts refusals). */
int shm_direct_ptr(struct ring_conn *c, const struct tern_tp_rkey *rkey, uint64_t roff,
                   size_t len, uint32_t need, void **ptr);

#endif
