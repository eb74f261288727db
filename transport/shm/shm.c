/* The shm fabric: connections between processes of one host over shared
 * memory windows, driven by the ring engine (ring/chan.h). This file is its
 * window provider and its descriptor.
 *
 * A link is a Unix seqpacket socket (an abstract name, "tern-shm/NAME") and
 * a pair of windows. The connecting side creates both windows (memfd,
 * sealed against shrinking, so the other side cannot be made to fault) and
 * hands them over with SCM_RIGHTS in its HELLO, so it can send at once.
 * After that the socket carries only the hang-up of a dead peer, doorbells
 * to a peer that sleeps and the map requests of direct one-sided access
 * (direct.c); channel opens and closes travel as control records on
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

#include "log.h"
#include "shm_internal.h"

#define SHM_MAGIC 0x74736d68u      /* "tsmh" */
#define SHM_VERSION 2
#define SHM_RING_BYTES (1024u * 1024)
#define SHM_CHANNELS 64             /* per link, channel 0 for the link itself */
#define SHM_MAX_REFUSALS 16         /* refused rkey_ptr calls before hanging up */
#define HELLO_TIMEOUT_S 5           /* an accepted link must say HELLO by then */
#define LOG_WHO "shm"

struct hello {
    uint32_t magic;
    uint32_t version;
    uint32_t n_chan;
    uint32_t ring_bytes;
};

/* ---- small helpers ---- */

/* ---- small helpers ---- */

/* "NAME" -> abstract socket address; false if the name is not acceptable. */
static bool sock_addr(const char *name, struct sockaddr_un *sa, socklen_t *len)
{
    size_t n = strlen(name);

    if (n == 0 || n > RING_NAME_MAX)
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


/* ---- set-up ---- */

/* Map the windows and bind channel 0 once the geometry is known. */
static int link_map(struct ring_link *l, int mine_fd, int peers_fd)
{
    l->win_size = RING_LINK_OFF + ring_window_size(&l->g);
    l->mine = map_window(mine_fd, l->win_size);
    l->peers = map_window(peers_fd, l->win_size);
    if (!l->mine || !l->peers)
        return TERN_ENOMEM;
    return ring_link_bind(l, l->mine, l->peers);
}


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
static int accept_hello(struct ring_link *l)
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
        !window_ok(fds[0], RING_LINK_OFF + ring_window_size(&l->g)) ||
        !window_ok(fds[1], RING_LINK_OFF + ring_window_size(&l->g)))
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

static int shm_listen(struct ring_ep *ep, const char *addr, char *bound, size_t bound_len)
{
    struct sockaddr_un sa;
    socklen_t sl;
    char name[RING_NAME_MAX + 1];
    int fd, rc;

    /* An auto name is this process's: but a child forked by an earlier
     * process of the same pid may still hold that one's listener (fork
     * keeps it open), so a name found taken is skipped for the next. */
    for (int tries = 0;; tries++) {
        bool automatic = strcmp(addr, "auto") == 0;

        if (automatic)
            snprintf(name, sizeof(name), "auto-%d-%u", (int)getpid(), ++ep->auto_names);
        else
            snprintf(name, sizeof(name), "%s", addr);
        if (!sock_addr(name, &sa, &sl))
            return TERN_EBADADDR;
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -errno;
        if (bind(fd, (struct sockaddr *)&sa, sl) == 0 && listen(fd, 1024) == 0)
            break;
        rc = errno == EADDRINUSE ? TERN_EADDRINUSE : -errno;
        close(fd);
        if (!automatic || rc != TERN_EADDRINUSE || tries == 64)
            return rc;
    }
    rc = ring_listener_add(ep, fd);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    if (bound && bound_len)
        snprintf(bound, bound_len, "%s", name);
    return 0;
}

static int link_connect(struct ring_ep *ep, const char *name, struct ring_link **out)
{
    struct hello h = {.magic = SHM_MAGIC, .version = SHM_VERSION, .n_chan = ep->g.n_chan,
                      .ring_bytes = ep->g.ring_bytes};
    size_t size = RING_LINK_OFF + ring_window_size(&ep->g);
    struct sockaddr_un sa;
    socklen_t sl;
    struct ring_link *l;
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
    l = ring_link_new(ep, fd);
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
        ring_link_free(l);
        return rc;
    }
    l->state = LINK_OPEN;
    *out = l;
    return 0;
}

static int link_for(struct ring_ep *ep, const char *name, struct ring_link **out)
{
    for (struct ring_link *l = ep->links; l; l = l->next)
        if (l->client && l->state == LINK_OPEN && l->next_chan < l->g.n_chan &&
            strcmp(l->name, name) == 0) {
            *out = l;
            return 0;
        }
    return link_connect(ep, name, out);
}

/* A channel on a link to the listener `addr`; a failure to reach it is
 * reported as a connection that failed, as tcp does. */
static int shm_connect(struct ring_ep *ep, const char *addr, struct ring_conn *c)
{
    struct ring_link *l = NULL;
    int rc = link_for(ep, addr, &l);

    if (rc == TERN_EBADADDR)
        return rc;
    c->ev.connected = true;
    if (rc == 0) {
        l->nconns++;
        ring_conn_bind(c, l, l->next_chan++);
        rc = ring_link_send(l, OP_OPEN, c->chan);
    }
    if (rc < 0) {
        c->state = ST_OPEN;
        ring_conn_fail(c, rc, "connect failed");
    }
    ring_conn_ready(c);
    return 0;
}

/* ---- sockets ---- */

static void shm_accept(struct ring_ep *ep, struct ring_listener *ls)
{
    for (;;) {
        int fd = accept4(ls->obj.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct ring_link *l;

        if (fd < 0)
            return;
        /* Each link costs a socket and two mappings: no more of them than
         * connections this endpoint may have. */
        if (ep->nlinks >= ep->base.cfg.max_conns || !(l = ring_link_new(ep, fd))) {
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
        l->born_s = ring_now_s();
        /* The HELLO is usually there already. */
        switch (accept_hello(l)) {
        case 1:
            l->state = LINK_OPEN;
            break;
        case 0:
            break;
        default:
            tern_log(TERN_LOG_WARN, LOG_WHO, "bad HELLO; dropping the link");
            ring_link_free(l);
            break;
        }
    }
}

static void shm_on_fd(struct ring_link *l, uint32_t events)
{
    char buf[64];
    ssize_t r;

    if (l->state == LINK_ACCEPTING) {
        int rc = accept_hello(l);

        if (rc == 1) {
            l->state = LINK_OPEN;
        } else if (rc < 0 || (events & (EPOLLHUP | EPOLLERR))) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "bad or missing HELLO; dropping the link");
            ring_link_free(l);
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
        shm_direct_on_socket(SHLINK(l), buf, (size_t)r, fds, nfds);
        while (nfds)
            close(fds[--nfds]);     /* what was mapped holds its own reference */
    }
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
        (events & (EPOLLHUP | EPOLLERR)))
        ring_link_dead(l);
}


/* An accepted link that never said HELLO goes after HELLO_TIMEOUT_S. */
static bool shm_link_poll(struct ring_link *l, bool tick)
{
    if (tick && l->state == LINK_ACCEPTING && ring_now_s() - l->born_s > HELLO_TIMEOUT_S) {
        tern_log(TERN_LOG_WARN, LOG_WHO, "link %s sent no HELLO; dropping it", l->name);
        ring_link_free(l);
        return false;
    }
    return true;
}

/* One byte on the socket: the peer's epoll wakes. */
static void shm_doorbell(struct ring_link *l)
{
    if (send(l->obj.fd, "d", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN)
        tern_log(TERN_LOG_DEBUG, LOG_WHO, "doorbell to %s: %s", l->name, strerror(errno));
}

static void shm_link_release(struct ring_link *l)
{
    shm_direct_link_free(SHLINK(l));
    if (l->mine)
        munmap(l->mine, l->win_size);
    if (l->peers)
        munmap(l->peers, l->win_size);
}

static const struct ring_link_ops shm_link_ops = {
    .link_size = sizeof(struct shm_link),
    .geometry = {.n_chan = SHM_CHANNELS, .ring_bytes = SHM_RING_BYTES},
    .listen = shm_listen,
    .connect = shm_connect,
    .accept = shm_accept,
    .on_fd = shm_on_fd,
    .link_poll = shm_link_poll,
    .doorbell = shm_doorbell,
    .link_release = shm_link_release,
};

/* ---- one-sided: direct where the peer's memory is mapped, else served ---- */

static int shm_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, const void *src, size_t len,
                   const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    int rc = shm_direct(RCONN(conn), true, (void *)src, len, rkey, roff, token,
                        ring_conn_onesided_max(RCONN(conn)));

    if (rc)
        return rc < 0 ? rc : 0;
    return ring_tp_put(conn, lmr, src, len, rkey, roff, token);
}

static int shm_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, void *dst, size_t len,
                   const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    int rc = shm_direct(RCONN(conn), false, dst, len, rkey, roff, token,
                        ring_conn_onesided_max(RCONN(conn)));

    if (rc)
        return rc < 0 ? rc : 0;
    return ring_tp_get(conn, lmr, dst, len, rkey, roff, token);
}

/* A pointer into the peer's region. Refusals count like refused put and
 * get: a caller that keeps making them is hung up on, as a NIC breaks the
 * queue pair, and the peer is told. */
static int shm_rkey_ptr(struct tern_tp_conn *conn, const struct tern_tp_rkey *rkey,
                        uint64_t roff, size_t len, uint32_t need, void **ptr)
{
    struct ring_conn *c = RCONN(conn);
    int rc = shm_direct_ptr(c, rkey, roff, len, need, ptr);

    if (rc == TERN_EREMACCESS && ++c->ptr_refusals > SHM_MAX_REFUSALS) {
        ring_link_send_close(c->link, c->chan);
        ring_conn_fail(c, TERN_EREMACCESS, "too many refused direct accesses");
    }
    return rc;
}

/* ---- endpoint and descriptor ---- */

static int shm_ep_open(struct tern_tp_ep *base)
{
    struct shm_ep *ep = SHEP(base);
    int rc;

    ep->tab_fd = -1;
    rc = ring_ep_open(base, &shm_link_ops);
    if (rc < 0)
        return rc;
    /* Without the table, one-sided operations are all served. */
    rc = shm_direct_ep_open(ep);
    if (rc < 0) {
        tern_log(TERN_LOG_INFO, LOG_WHO, "no direct one-sided access: %s", tern_strerror(rc));
        shm_direct_ep_close(ep);
    }
    return 0;
}

static void shm_ep_close(struct tern_tp_ep *base)
{
    ring_tp_ep_close(base);
    shm_direct_ep_close(SHEP(base));
}

/* Shared memory reaches processes of this node only. */
static bool shm_conn_local(const struct tern_tp_conn *conn)
{
    (void)conn;
    return true;
}

static const struct tern_tp_ops shm_ops = {
    .conn_local = shm_conn_local,
    RING_TP_OPS,
    .ep_open = shm_ep_open,
    .ep_close = shm_ep_close,
    .put = shm_put,
    .get = shm_get,
    .rkey_ptr = shm_rkey_ptr,
    .mr_publish = shm_direct_publish,
};

/* Processes of this host (same boot and network namespace: the listener
 * is an abstract socket of the namespace). */
static bool shm_reachable(const char *addr, size_t len, bool same_node, bool same_host)
{
    (void)same_host;
    return same_node;
}

static int shm_local_addr(const char *tag, char *buf, size_t len)
{
    struct sockaddr_un sa;
    socklen_t sl;

    if (!tag)
        return snprintf(buf, len, "auto") < (int)len ? 0 : TERN_EINVAL;
    if (snprintf(buf, len, "tern-%s", tag) >= (int)len || !sock_addr(buf, &sa, &sl))
        return TERN_EINVAL;
    return 0;
}

/* Direct one-sided access makes put and get plain stores and loads into the
 * peer's memory where it registered a file (tern_tp_mr_reg_fd,
 * tern_tp_mr_alloc); other regions are served by its poll. */
const struct tern_tp_fabric tp_fabric_shm = {
    .name = "shm",
    .caps = TERN_TP_CAP_MSG | TERN_TP_CAP_PUT | TERN_TP_CAP_GET | TERN_TP_CAP_WAIT_FD |
            TERN_TP_CAP_LISTEN | TERN_TP_CAP_CONNECT | TERN_TP_CAP_RKEY_PTR |
            TERN_TP_CAP_RMA_OFFLOAD,
    .ep_size = sizeof(struct shm_ep),
    .ops = &shm_ops,
    .latency_ns = 300,
    .bandwidth_gbs = 20,
    .reachable = shm_reachable,
    .local_addr = shm_local_addr,
};
