/* shm links: the Unix socket and the window pair that connections between
 * two endpoints share (see shm_internal.h).
 *
 * The connecting side creates both windows (memfd, sealed against
 * shrinking, so the other side cannot be made to fault) and hands them over
 * with SCM_RIGHTS in its HELLO, so it can send at once. After that the
 * socket carries only the hang-up of a dead peer and doorbells to a peer
 * that sleeps; channel opens and closes travel as control records on
 * channel 0 of the windows. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../log.h"
#include "shm_internal.h"

#define SHM_MAGIC 0x74736d68u      /* "tsmh" */
#define SHM_VERSION 2
#define LOG_WHO "shm"
#define HELLO_TIMEOUT_S 5           /* an accepted link must say HELLO by then */

#define RINGS_OFF SHM_RINGS_OFF

struct hello {
    uint32_t magic;
    uint32_t version;
    uint32_t n_chan;
    uint32_t ring_bytes;
};

struct link_msg {
    uint32_t op;
    uint32_t chan;
};

/* ---- small helpers ---- */

/* "NAME" -> abstract socket address; false if the name is not acceptable. */
static bool sock_addr(const char *name, struct sockaddr_un *sa, socklen_t *len)
{
    size_t n = strlen(name);

    if (n == 0 || n > SHM_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
            return false;
    }
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                       (size_t)snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
                                        "tern-shm/%s", name));
    return true;
}

static uint8_t *map_window(int fd, size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

    return p == MAP_FAILED ? NULL : p;
}

static int make_window(size_t size)
{
    int fd = memfd_create("tern-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool window_ok(int fd, size_t size)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);

    return seals >= 0 && (seals & F_SEAL_SHRINK) && fstat(fd, &st) == 0 &&
           (size_t)st.st_size >= size;
}

struct shm_link *shm_link_new(struct shm_ep *ep, int fd)
{
    struct shm_link *l = calloc(1, sizeof(*l));
    struct epoll_event e = {.events = EPOLLIN};

    if (!l)
        return NULL;
    l->ep = ep;
    l->obj = (struct shm_obj){.kind = KIND_LINK, .fd = fd};
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

static long long now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return ts.tv_sec;
}

/* Bind channel 0 to a window pair of the link's geometry. */
int shm_link_bind(struct shm_link *l, uint8_t *mine, uint8_t *peers)
{
    if (!l->chan && !(l->chan = calloc(l->g.n_chan, sizeof(*l->chan))))
        return TERN_ENOMEM;
    ring_tx_init(&l->ctl_tx, mine + RINGS_OFF, peers + RINGS_OFF, &l->g, 0);
    ring_rx_init(&l->ctl_rx, mine + RINGS_OFF, peers + RINGS_OFF, &l->g, 0);
    l->next_chan = 1;
    return 0;
}

/* Map the windows and bind channel 0 once the geometry is known. */
static int link_map(struct shm_link *l, int mine_fd, int peers_fd)
{
    l->win_size = RINGS_OFF + ring_window_size(&l->g);
    l->mine = map_window(mine_fd, l->win_size);
    l->peers = map_window(peers_fd, l->win_size);
    if (!l->mine || !l->peers)
        return TERN_ENOMEM;
    return shm_link_bind(l, l->mine, l->peers);
}

void shm_link_free(struct shm_link *l)
{
    struct shm_link **pp = &l->ep->links;

    while (*pp && *pp != l)
        pp = &(*pp)->next;
    if (*pp)
        *pp = l->next;
    l->ep->nlinks--;
    if (l->obj.fd >= 0) {
        epoll_ctl(l->ep->epfd, EPOLL_CTL_DEL, l->obj.fd, NULL);
        close(l->obj.fd);
    }
    shm_direct_link_free(l);
    if (l->ntb) {
        ntb_link_close(l);      /* the device's windows are not ours to unmap */
    } else {
        if (l->mine)
            munmap(l->mine, l->win_size);
        if (l->peers)
            munmap(l->peers, l->win_size);
    }
    free(l->chan);
    free(l);
}

/* The peer is gone: its connections hand out what it published, then close.
 * (An NTB link stays: ntb_link.c brings it up again.) */
void shm_link_dead(struct shm_link *l)
{
    if (l->state == LINK_DEAD)
        return;
    l->state = LINK_DEAD;
    if (l->obj.fd >= 0 && !l->ntb) {
        epoll_ctl(l->ep->epfd, EPOLL_CTL_DEL, l->obj.fd, NULL);
        close(l->obj.fd);
        l->obj.fd = -1;
    }
    for (uint32_t i = 1; l->chan && i < l->g.n_chan; i++)
        if (l->chan[i])
            shm_conn_peer_gone(l->chan[i]);
    if (!l->nconns && !l->ntb)
        shm_link_free(l);
}

void shm_link_drop_conn(struct shm_link *l, struct shm_conn *c)
{
    if (c->chan < l->g.n_chan && l->chan[c->chan] == c)
        l->chan[c->chan] = NULL;
    l->nconns--;
    if (l->ntb) {
        ntb_link_conn_gone(l, c);
        return;
    }
    /* A dead link, or a client link with no channel left to give, goes with
     * its last connection. */
    if (!l->nconns && (l->state == LINK_DEAD || (l->client && l->next_chan >= l->g.n_chan)))
        shm_link_free(l);
}

/* ---- control records on channel 0 ---- */

int shm_link_send(struct shm_link *l, uint32_t op, uint32_t chan)
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
    shm_link_published(l);
    return 0;
}

int shm_link_send_open(struct shm_link *l, uint32_t chan)
{
    return shm_link_send(l, OP_OPEN, chan);
}

void shm_link_send_close(struct shm_link *l, uint32_t chan)
{
    /* Best effort: if channel 0 is full or the link is gone, the peer
     * learns of the close when the link itself goes. */
    if (shm_link_send(l, OP_CLOSE, chan) == 0 && l->ntb)
        ntb_link_on_close(l, chan, true);
}

static void link_control(struct shm_link *l)
{
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
            shm_link_dead(l);
            return;
        }
        memcpy(&m, v, sizeof(m));
        ring_rx_release(&l->ctl_rx);
        if (m.chan == 0 || m.chan >= l->g.n_chan) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "link %s: control record for channel %u",
                     l->name, m.chan);
            shm_link_dead(l);
            return;
        }
        if (m.op == OP_OPEN && (l->ntb ? ntb_link_accepts(l, m.chan) : !l->client) &&
            !l->chan[m.chan]) {
            if (!shm_conn_attach(l, m.chan, true)) {
                tern_log(TERN_LOG_WARN, LOG_WHO, "refusing channel %u: connection limit or no memory",
                         m.chan);
                shm_link_send_close(l, m.chan);     /* the peer sees CLOSED */
            }
        } else if (m.op == OP_CLOSE) {
            if (l->chan[m.chan])
                shm_conn_peer_gone(l->chan[m.chan]);
            if (l->ntb)
                ntb_link_on_close(l, m.chan, false);
        } else if (m.op == OP_FREE && l->ntb) {
            ntb_link_on_free(l, m.chan);
        }
    }
    ring_rx_credit(&l->ctl_rx);
    if (l->ctl_rx.answered) {
        l->ctl_rx.answered = false;
        shm_link_published(l);
    }
}

/* ---- set-up ---- */

static int send_hello(int sock, const struct hello *h, const int fds[2])
{
    char cbuf[CMSG_SPACE(2 * sizeof(int))] = {0};
    struct iovec iov = {.iov_base = (void *)h, .iov_len = sizeof(*h)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);

    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, 2 * sizeof(int));
    return sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)sizeof(*h) ? 0 : -1;
}

static bool geometry_ok(const struct ring_geometry *g)
{
    size_t size = ring_window_size(g);

    /* A peer must not make us map more than 1 GiB per window. */
    return g->n_chan >= 2 && g->n_chan <= 4096 && g->ring_bytes <= (16u << 20) && size &&
           size <= (1u << 30);
}

/* Read the connecting side's HELLO with its two windows: 1 when the link
 * is open, 0 if the HELLO has not arrived yet, <0 on error. */
static int accept_hello(struct shm_link *l)
{
    char cbuf[CMSG_SPACE(2 * sizeof(int))];
    struct hello h;
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *cm;
    int fds[2] = {-1, -1}, rc = TERN_EPROTO;
    ssize_t n = recvmsg(l->obj.fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    cm = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;
    if (cm && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(2 * sizeof(int)))
        memcpy(fds, CMSG_DATA(cm), sizeof(fds));
    else if (cm && cm->cmsg_type == SCM_RIGHTS)   /* wrong count: close what came */
        for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
            close(((int *)(void *)CMSG_DATA(cm))[i]);
    if (n != sizeof(h) || fds[0] < 0 || h.magic != SHM_MAGIC || h.version != SHM_VERSION)
        goto out;
    l->g = (struct ring_geometry){.n_chan = h.n_chan, .ring_bytes = h.ring_bytes};
    if (!geometry_ok(&l->g) ||
        !window_ok(fds[0], RINGS_OFF + ring_window_size(&l->g)) ||
        !window_ok(fds[1], RINGS_OFF + ring_window_size(&l->g)))
        goto out;
    /* The connector's window 0 is its own (we write it), window 1 ours. */
    rc = link_map(l, fds[1], fds[0]);
    if (rc == 0)
        rc = 1;
out:
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    return rc;
}

int shm_link_listen(struct shm_ep *ep, const char *addr, char *bound, size_t bound_len)
{
    struct sockaddr_un sa;
    socklen_t sl;
    char name[SHM_NAME_MAX + 1];
    struct shm_listener *l;
    struct epoll_event e = {.events = EPOLLIN};
    int fd;

    if (strcmp(addr, "auto") == 0)
        snprintf(name, sizeof(name), "auto-%d-%u", (int)getpid(), ++ep->auto_names);
    else
        snprintf(name, sizeof(name), "%s", addr);
    if (!sock_addr(name, &sa, &sl))
        return TERN_EBADADDR;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sa, sl) < 0 || listen(fd, 1024) < 0) {
        int rc = errno == EADDRINUSE ? TERN_EADDRINUSE : -errno;

        close(fd);
        return rc;
    }
    l = calloc(1, sizeof(*l));
    if (!l) {
        close(fd);
        return TERN_ENOMEM;
    }
    l->obj = (struct shm_obj){.kind = KIND_LISTENER, .fd = fd};
    e.data.ptr = &l->obj;
    epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &e);
    l->next = ep->listeners;
    ep->listeners = l;
    if (bound && bound_len)
        snprintf(bound, bound_len, "%s", name);
    return 0;
}

static int link_connect(struct shm_ep *ep, const char *name, struct shm_link **out)
{
    struct hello h = {.magic = SHM_MAGIC, .version = SHM_VERSION, .n_chan = ep->g.n_chan,
                      .ring_bytes = ep->g.ring_bytes};
    size_t size = RINGS_OFF + ring_window_size(&ep->g);
    struct sockaddr_un sa;
    socklen_t sl;
    struct shm_link *l;
    int fd, fds[2] = {-1, -1}, rc = 0;

    if (!sock_addr(name, &sa, &sl))
        return TERN_EBADADDR;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sl) < 0) {
        rc = errno == ECONNREFUSED || errno == ENOENT ? TERN_ECONNREFUSED : -errno;
        close(fd);
        return rc;
    }
    l = shm_link_new(ep, fd);
    if (!l) {
        close(fd);
        return TERN_ENOMEM;
    }
    l->client = true;
    l->g = ep->g;
    snprintf(l->name, sizeof(l->name), "%s", name);
    fds[0] = make_window(size);   /* ours: the listener writes it */
    fds[1] = make_window(size);   /* the listener's: we write it */
    if (fds[0] < 0 || fds[1] < 0 || link_map(l, fds[0], fds[1]) < 0 ||
        send_hello(fd, &h, fds) < 0)
        rc = TERN_ECONNREFUSED;
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    if (rc < 0) {
        shm_link_free(l);
        return rc;
    }
    l->state = LINK_OPEN;
    *out = l;
    return 0;
}

int shm_link_for(struct shm_ep *ep, const char *name, struct shm_link **out)
{
    for (struct shm_link *l = ep->links; l; l = l->next)
        if (l->client && l->state == LINK_OPEN && l->next_chan < l->g.n_chan &&
            strcmp(l->name, name) == 0) {
            *out = l;
            return 0;
        }
    return link_connect(ep, name, out);
}

/* ---- sockets ---- */

static void do_accept(struct shm_ep *ep, struct shm_listener *ls)
{
    for (;;) {
        int fd = accept4(ls->obj.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct shm_link *l;

        if (fd < 0)
            return;
        /* Each link costs a socket and two mappings: no more of them than
         * connections this endpoint may have. */
        if (ep->nlinks >= ep->base.cfg.max_conns || !(l = shm_link_new(ep, fd))) {
            static struct tern_log_limit limit;

            if (tern_log_allow(&limit)) {
                tern_log(TERN_LOG_WARN, LOG_WHO, "refusing a link: %u open (%u more refused)",
                         ep->nlinks, limit.held);
                limit.held = 0;
            }
            close(fd);
            continue;
        }
        snprintf(l->name, sizeof(l->name), "peer-%d", fd);
        l->state = LINK_ACCEPTING;
        l->born_s = now_s();
        /* The HELLO is usually there already. */
        switch (accept_hello(l)) {
        case 1:
            l->state = LINK_OPEN;
            break;
        case 0:
            break;
        default:
            tern_log(TERN_LOG_WARN, LOG_WHO, "bad HELLO; dropping the link");
            shm_link_free(l);
            break;
        }
    }
}

static void on_socket(struct shm_link *l, uint32_t events)
{
    char buf[64];
    ssize_t r;

    if (l->state == LINK_ACCEPTING) {
        int rc = accept_hello(l);

        if (rc == 1) {
            l->state = LINK_OPEN;
        } else if (rc < 0 || (events & (EPOLLHUP | EPOLLERR))) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "bad or missing HELLO; dropping the link");
            shm_link_free(l);
        }
        return;
    }
    /* After set-up the socket carries doorbells, the hang-up and, for
     * direct one-sided access, map requests and answers (direct.c). */
    for (;;) {
        char cbuf[CMSG_SPACE(4 * sizeof(int))];
        struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                           .msg_controllen = sizeof(cbuf)};
        struct cmsghdr *cm;
        int fds[4], nfds = 0;

        r = recvmsg(l->obj.fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r <= 0)
            break;
        for (cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                    int fd = ((int *)(void *)CMSG_DATA(cm))[i];

                    if (nfds < 4)
                        fds[nfds++] = fd;
                    else
                        close(fd);
                }
        if (!l->ntb)
            shm_direct_on_socket(l, buf, (size_t)r, fds, nfds);
        while (nfds)
            close(fds[--nfds]);     /* what was mapped holds its own reference */
    }
    if (l->ntb)
        return;     /* a doorbell datagram socket: no hang-up to see */
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
        (events & (EPOLLHUP | EPOLLERR)))
        shm_link_dead(l);
}

void shm_links_poll(struct shm_ep *ep, bool sockets)
{
    if (sockets) {
        int ne = epoll_wait(ep->epfd, ep->evbuf, 64, 0);

        for (int i = 0; i < ne; i++) {
            struct shm_obj *o = ep->evbuf[i].data.ptr;

            if (o->kind == KIND_LISTENER)
                do_accept(ep, (struct shm_listener *)o);
            else
                on_socket((struct shm_link *)o, ep->evbuf[i].events);
        }
    }
    for (struct shm_link *l = ep->links, *next; l; l = next) {
        next = l->next;
        if (l->ntb)
            ntb_link_poll(l, sockets);     /* handshake, heartbeat */
        if (l->state == LINK_OPEN) {
            link_control(l);
        } else if (sockets && !l->ntb && l->state == LINK_ACCEPTING &&
                   now_s() - l->born_s > HELLO_TIMEOUT_S) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "link %s sent no HELLO; dropping it", l->name);
            shm_link_free(l);
        }
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
 * fence pairs with the one in shm_links_set_sleeping (flag store, fence,
 * ring check). The peer clears its flag itself when it wakes. */
void shm_links_doorbells(struct shm_ep *ep)
{
    if (!ep->bells)
        return;
    ep->bells = false;
    for (struct shm_link *l = ep->links; l; l = l->next) {
        struct link_ctl *me;

        if (!l->published || l->state != LINK_OPEN)
            continue;
        l->published = false;
        me = (struct link_ctl *)(void *)l->mine;
        full_fence();
        if (!__atomic_load_n(&me->peer_sleeping, __ATOMIC_RELAXED))
            continue;
        if (l->ntb)
            ntb_link_ring(l);
        else if (send(l->obj.fd, "d", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN)
            tern_log(TERN_LOG_DEBUG, LOG_WHO, "doorbell to %s: %s", l->name, strerror(errno));
    }
}

void shm_links_set_sleeping(struct shm_ep *ep, bool sleeping)
{
    for (struct shm_link *l = ep->links; l; l = l->next)
        if (l->state == LINK_OPEN)
            __atomic_store_n(&((struct link_ctl *)(void *)l->peers)->peer_sleeping,
                             sleeping ? 1u : 0u, __ATOMIC_RELAXED);
    ep->armed = sleeping;
    if (sleeping)
        full_fence();
}

void shm_links_close_all(struct shm_ep *ep)
{
    while (ep->links)
        shm_link_free(ep->links);
    while (ep->listeners) {
        struct shm_listener *l = ep->listeners;

        ep->listeners = l->next;
        close(l->obj.fd);
        free(l);
    }
}
