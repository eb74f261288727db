/* Links of the ring fabrics (chan.h): the window pair that connections
 * between two endpoints share, its control records on channel 0, doorbells
 * and the sleep protocol. Where the windows come from, and how a link is set
 * up and found dead, is the provider's (ring_link_ops). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "chan.h"

#define LOG_WHO "ring"

struct link_msg {
    uint32_t op;
    uint32_t chan;
};

struct ring_link *ring_link_new(struct ring_ep *ep, int fd)
{
    size_t size = ep->ops->link_size > sizeof(struct ring_link) ? ep->ops->link_size
                                                                  : sizeof(struct ring_link);
    struct ring_link *l = calloc(1, size);
    struct epoll_event e = {.events = EPOLLIN};

    if (!l)
        return NULL;
    l->ep = ep;
    l->obj = (struct ring_obj){.kind = RING_OBJ_LINK, .fd = fd};
    e.data.ptr = &l->obj;
    if (fd >= 0 && epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
        free(l);
        return NULL;
    }
    l->next = ep->links;
    ep->links = l;
    ep->nlinks++;
    return l;
}

long long ring_now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return ts.tv_sec;
}

/* Bind channel 0 to a window pair of the link's geometry. */
int ring_link_bind(struct ring_link *l, uint8_t *mine, uint8_t *peers)
{
    if (!l->chan && !(l->chan = calloc(l->g.n_chan, sizeof(*l->chan))))
        return TERN_ENOMEM;
    ring_tx_init(&l->ctl_tx, mine + RING_LINK_OFF, peers + RING_LINK_OFF, &l->g, 0);
    ring_rx_init(&l->ctl_rx, mine + RING_LINK_OFF, peers + RING_LINK_OFF, &l->g, 0);
    l->next_chan = 1;
    return 0;
}

void ring_link_free(struct ring_link *l)
{
    struct ring_link **pp = &l->ep->links;

    while (*pp && *pp != l)
        pp = &(*pp)->next;
    if (*pp)
        *pp = l->next;
    l->ep->nlinks--;
    if (l->obj.fd >= 0) {
        epoll_ctl(l->ep->epfd, EPOLL_CTL_DEL, l->obj.fd, NULL);
        close(l->obj.fd);
    }
    if (l->ep->ops->link_release)
        l->ep->ops->link_release(l);
    free(l->chan);
    free(l);
}

void ring_link_dead(struct ring_link *l)
{
    if (l->state == LINK_DEAD)
        return;
    l->state = LINK_DEAD;
    if (l->obj.fd >= 0 && !l->ep->ops->keeps_links) {
        epoll_ctl(l->ep->epfd, EPOLL_CTL_DEL, l->obj.fd, NULL);
        close(l->obj.fd);
        l->obj.fd = -1;
    }
    for (uint32_t i = 1; l->chan && i < l->g.n_chan; i++)
        if (l->chan[i])
            ring_conn_peer_gone(l->chan[i]);
    if (!l->nconns && !l->ep->ops->keeps_links)
        ring_link_free(l);
}

void ring_link_drop_conn(struct ring_link *l, struct ring_conn *c)
{
    if (c->chan < l->g.n_chan && l->chan[c->chan] == c)
        l->chan[c->chan] = NULL;
    l->nconns--;
    if (l->ep->ops->conn_gone) {
        l->ep->ops->conn_gone(l, c);
        return;
    }
    /* A dead link, or a client link with no channel left to give, goes with
     * its last connection. */
    if (!l->nconns && (l->state == LINK_DEAD || (l->client && l->next_chan >= l->g.n_chan)))
        ring_link_free(l);
}

/* ---- control records on channel 0 ---- */

int ring_link_send(struct ring_link *l, uint32_t op, uint32_t chan)
{
    struct link_msg m = {.op = op, .chan = chan};
    void *p;

    if (l->state != LINK_OPEN)
        return TERN_ENOTCONN;
    p = ring_tx_reserve(&l->ctl_tx, sizeof(m));
    if (!p)
        return TERN_EAGAIN;
    memcpy(p, &m, sizeof(m));
    ring_tx_publish(&l->ctl_tx, sizeof(m), RING_CTL);
    ring_link_published(l);
    return 0;
}

void ring_link_send_close(struct ring_link *l, uint32_t chan)
{
    /* Best effort: if channel 0 is full or the link is gone, the peer
     * learns of the close when the link itself goes. */
    if (ring_link_send(l, OP_CLOSE, chan) == 0 && l->ep->ops->on_close)
        l->ep->ops->on_close(l, chan, true);
}

static void link_control(struct ring_link *l)
{
    const struct ring_link_ops *ops = l->ep->ops;
    const void *v;
    uint32_t len;
    enum ring_type t;
    int rc;

    if (ring_rx_quiet(&l->ctl_rx))
        return;
    while (l->state == LINK_OPEN && (rc = ring_rx_peek(&l->ctl_rx, &v, &len, &t)) != 0) {
        struct link_msg m;

        if (rc < 0 || t != RING_CTL || len != sizeof(m)) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "link %s: bad control record; closing it",
                     l->name);
            ring_link_dead(l);
            return;
        }
        memcpy(&m, v, sizeof(m));
        ring_rx_release(&l->ctl_rx);
        if (m.chan == 0 || m.chan >= l->g.n_chan) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "link %s: control record for channel %u",
                     l->name, m.chan);
            ring_link_dead(l);
            return;
        }
        if (m.op == OP_OPEN && !l->chan[m.chan] &&
            (ops->accepts ? ops->accepts(l, m.chan) : !l->client)) {
            if (!ring_conn_attach(l, m.chan, true)) {
                tern_log(TERN_LOG_WARN, LOG_WHO, "refusing channel %u: connection limit or no memory",
                         m.chan);
                ring_link_send_close(l, m.chan);     /* the peer sees CLOSED */
            }
        } else if (m.op == OP_CLOSE) {
            if (l->chan[m.chan])
                ring_conn_peer_gone(l->chan[m.chan]);
            if (ops->on_close)
                ops->on_close(l, m.chan, false);
        } else if (m.op == OP_FREE && ops->on_free) {
            ops->on_free(l, m.chan);
        }
    }
    ring_rx_credit(&l->ctl_rx);
    if (l->ctl_rx.answered) {
        l->ctl_rx.answered = false;
        ring_link_published(l);
    }
}

void ring_links_poll(struct ring_ep *ep, bool sockets)
{
    const struct ring_link_ops *ops = ep->ops;

    if (sockets) {
        int ne = epoll_wait(ep->epfd, ep->evbuf, 64, 0);

        for (int i = 0; i < ne; i++) {
            struct ring_obj *o = ep->evbuf[i].data.ptr;

            if (o->kind == RING_OBJ_LISTENER && ops->accept)
                ops->accept(ep, (struct ring_listener *)o);
            else if (o->kind == RING_OBJ_LINK && ops->on_fd)
                ops->on_fd((struct ring_link *)o, ep->evbuf[i].events);
        }
    }
    for (struct ring_link *l = ep->links, *next; l; l = next) {
        next = l->next;
        if (ops->link_poll && !ops->link_poll(l, sockets))
            continue;
        if (l->state == LINK_OPEN)
            link_control(l);
    }
}

/* A store-load barrier. On x86 a locked add to the stack is one that costs
 * less than mfence (Linux's smp_mb does the same). */
static inline void full_fence(void)
{
#if defined(__x86_64__)
    __asm__ __volatile__("lock; addl $0,-8(%%rsp)" ::: "memory", "cc");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

/* After publishing: if the peer sleeps, wake it with one byte on the
 * socket. Only then, so the polling data path makes no system call. The
 * fence pairs with the one in ring_links_set_sleeping (flag store, fence,
 * ring check). The peer clears its flag itself when it wakes. */
void ring_links_doorbells(struct ring_ep *ep)
{
    if (!ep->bells)
        return;
    ep->bells = false;
    for (struct ring_link *l = ep->links; l; l = l->next) {
        struct ring_link_ctl *me;

        if (!l->published || l->state != LINK_OPEN)
            continue;
        l->published = false;
        me = (struct ring_link_ctl *)(void *)l->mine;
        full_fence();
        if (!__atomic_load_n(&me->peer_sleeping, __ATOMIC_RELAXED))
            continue;
        ep->ops->doorbell(l);
    }
}

void ring_links_set_sleeping(struct ring_ep *ep, bool sleeping)
{
    for (struct ring_link *l = ep->links; l; l = l->next)
        if (l->state == LINK_OPEN)
            __atomic_store_n(&((struct ring_link_ctl *)(void *)l->peers)->peer_sleeping,
                             sleeping ? 1u : 0u, __ATOMIC_RELAXED);
    ep->armed = sleeping;
    if (sleeping)
        full_fence();
}

void ring_links_close_all(struct ring_ep *ep)
{
    while (ep->links)
        ring_link_free(ep->links);
    while (ep->listeners) {
        struct ring_listener *l = ep->listeners;

        ep->listeners = l->next;
        close(l->obj.fd);
        free(l);
    }
}

int ring_listener_add(struct ring_ep *ep, int fd)
{
    struct ring_listener *ls = calloc(1, sizeof(*ls));
    struct epoll_event e = {.events = EPOLLIN};

    if (!ls)
        return TERN_ENOMEM;
    ls->obj = (struct ring_obj){.kind = RING_OBJ_LISTENER, .fd = fd};
    e.data.ptr = &ls->obj;
    if (epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
        free(ls);
        return -errno;
    }
    ls->next = ep->listeners;
    ep->listeners = ls;
    return 0;
}
