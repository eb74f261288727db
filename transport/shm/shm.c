/* The shm fabric: connections between processes of one host over shared
 * memory windows, driven by the ring protocol of ring/ring.h. It is also the
 * emulation of an NTB link: the data path only writes the peer's window and
 * reads its own, exactly as on PCIe.
 *
 * Set-up and liveness go over a Unix seqpacket socket in the abstract
 * namespace ("shm://NAME" -> "\0tern-shm/NAME"). The connecting side creates
 * both windows (memfd, sealed against resizing) and hands them over with
 * SCM_RIGHTS, so it can send at once, before the listener has accepted. The
 * socket then only serves to notice a dead peer (HUP) and, in adaptive mode,
 * to ring a doorbell at a peer that went to sleep. No system call is made on
 * the data path while both sides poll.
 *
 * Messages up to a ring record go straight into the peer's window (zero
 * copy: the caller writes into peer memory). Larger ones are staged and sent
 * as FRAG records, a few per connection per poll, and reassembled by the
 * receiver. One-sided put/get travel as CTL records served by the peer's
 * poll, with the same checks as every fabric. (Stores straight into
 * registered window memory are the next step; see docs/DESIGN.md.)
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../conn_events.h"
#include "../log.h"
#include "../ring/ring.h"
#include "../transport_internal.h"

#define SHM_MAGIC 0x74736d68u      /* "tsmh" */
#define SHM_VERSION 1
#define SHM_RING_BYTES (1024u * 1024)
#define SHM_RX_BATCH 16            /* records per connection per poll */
#define SHM_FRAG_BATCH 4           /* fragments per connection per poll */
#define SHM_EPOLL_EVERY 32         /* busy mode: epoll once per this many polls */
#define SHM_MAX_VIOLATIONS 16
#define SHM_NAME_MAX 64
#define LOG_WHO "shm"

/* The first cache line of each window is the link's own control block,
 * written by the peer: it tells the owner that the peer sleeps. */
struct shm_link_ctl {
    volatile uint32_t peer_sleeping;
    uint32_t pad[15];
};

#define SHM_RINGS_OFF sizeof(struct shm_link_ctl)

struct shm_hello {
    uint32_t magic;
    uint32_t version;
    uint32_t ring_bytes;
    uint32_t pad;
};

/* CTL record payload, followed by data for PUT and GET_RESP. */
enum shm_ctl_op { CTL_PUT = 1, CTL_GET = 2, CTL_ACK = 3, CTL_GET_RESP = 4 };

struct shm_ctl {
    uint8_t op;
    uint8_t pad[3];
    int32_t status;
    uint32_t key;
    uint32_t len;
    uint64_t off;
};

/* FRAG record prefix. */
struct shm_frag {
    uint32_t total;
    uint32_t offset;
};

enum shm_kind { KIND_LISTENER, KIND_CONN };
enum shm_state { ST_ACCEPTING, ST_OPEN, ST_DRAINING, ST_DEAD };

struct shm_obj {
    enum shm_kind kind;
    int fd;
};

struct shm_listener {
    struct shm_obj obj;
    struct shm_listener *next;
};

struct shm_conn {
    struct tern_tp_conn base;
    struct shm_obj obj;
    struct shm_conn *prev, *next, *ready_next;
    bool on_ready;
    enum shm_state state;
    struct tp_conn_events ev;      /* owed events, one-sided in flight */
    bool want_writable;
    char peer[SHM_NAME_MAX + 16];

    uint8_t *mine, *peers;         /* our window (read), the peer's (write) */
    size_t win_size;
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
    bool published;                /* since the last doorbell check */
};

struct shm_ep {
    struct tern_tp_ep base;
    int epfd;
    struct shm_listener *listeners;
    struct shm_conn *conns, *ready;
    unsigned nconns, polls, auto_names;
    bool armed;                    /* peers were told we sleep */
    struct ring_geometry g;
    struct epoll_event evbuf[64];
};

#define SEP(ep) ((struct shm_ep *)(ep))
#define SCONN(c) ((struct shm_conn *)(c))

/* ---- helpers ---- */

static void ready_push(struct shm_conn *c)
{
    struct shm_ep *ep = SEP(c->base.ep);

    if (!c->on_ready) {
        c->on_ready = true;
        c->ready_next = ep->ready;
        ep->ready = c;
    }
}

static void ready_remove(struct shm_conn *c)
{
    struct shm_conn **pp = &SEP(c->base.ep)->ready;

    while (c->on_ready && *pp && *pp != c)
        pp = &(*pp)->ready_next;
    if (c->on_ready && *pp)
        *pp = c->ready_next;
    c->on_ready = false;
}

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

static size_t window_size(const struct shm_ep *ep)
{
    return SHM_RINGS_OFF + ring_window_size(&ep->g);
}

static uint8_t *map_window(int fd, size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

    return p == MAP_FAILED ? NULL : p;
}

/* A window the connecting side creates: zeroed, sized and sealed, so the
 * other side cannot be made to fault by a later shrink. */
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

static void bind_rings(struct shm_conn *c)
{
    struct shm_ep *ep = SEP(c->base.ep);

    ring_tx_init(&c->tx, c->mine + SHM_RINGS_OFF, c->peers + SHM_RINGS_OFF, &ep->g, 0);
    ring_rx_init(&c->rx, c->mine + SHM_RINGS_OFF, c->peers + SHM_RINGS_OFF, &ep->g, 0);
}

static struct shm_conn *conn_new(struct shm_ep *ep, int fd)
{
    struct shm_conn *c = calloc(1, sizeof(*c));
    struct epoll_event e = {.events = EPOLLIN};

    if (!c)
        return NULL;
    c->base.ep = &ep->base;
    c->obj = (struct shm_obj){.kind = KIND_CONN, .fd = fd};
    e.data.ptr = &c->obj;
    if (epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
        free(c);
        return NULL;
    }
    c->next = ep->conns;
    if (ep->conns)
        ep->conns->prev = c;
    ep->conns = c;
    ep->nconns++;
    return c;
}

static void conn_fail(struct shm_conn *c, int status, const char *why)
{
    if (c->state == ST_DEAD)
        return;
    if (status < 0)
        tern_log(TERN_LOG_WARN, LOG_WHO, "connection %s closed: %s (%s)", c->peer, why,
                 tern_strerror(status));
    tp_conn_dead(&c->ev, status, false);
    c->state = ST_DEAD;
    if (c->obj.fd >= 0) {
        epoll_ctl(SEP(c->base.ep)->epfd, EPOLL_CTL_DEL, c->obj.fd, NULL);
        close(c->obj.fd);
        c->obj.fd = -1;
    }
    ready_push(c);
}

static void shm_disconnect(struct tern_tp_conn *conn)
{
    struct shm_conn *c = SCONN(conn);
    struct shm_ep *ep = SEP(conn->ep);

    if (c->obj.fd >= 0) {
        epoll_ctl(ep->epfd, EPOLL_CTL_DEL, c->obj.fd, NULL);
        close(c->obj.fd);
    }
    ready_remove(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        ep->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    ep->nconns--;
    if (c->mine)
        munmap(c->mine, c->win_size);
    if (c->peers)
        munmap(c->peers, c->win_size);
    free(c->stage);
    free(c->reasm);
    free(c);
}

static const char *shm_conn_peer(const struct tern_tp_conn *conn)
{
    return SCONN(conn)->peer;
}

/* ---- set-up ---- */

static int send_fds(int sock, const struct shm_hello *h, const int *fds, int nfds)
{
    char cbuf[CMSG_SPACE(2 * sizeof(int))] = {0};
    struct iovec iov = {.iov_base = (void *)h, .iov_len = sizeof(*h)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int))};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);

    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    return sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)sizeof(*h) ? 0 : -1;
}

/* Read the connecting side's HELLO with its two windows. Returns 1 when the
 * connection is open, 0 if the HELLO has not arrived yet, <0 on error. */
static int accept_hello(struct shm_conn *c)
{
    struct shm_ep *ep = SEP(c->base.ep);
    char cbuf[CMSG_SPACE(2 * sizeof(int))];
    struct shm_hello h;
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *cm;
    int fds[2] = {-1, -1}, rc = TERN_EPROTO;
    ssize_t n = recvmsg(c->obj.fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    cm = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;
    if (cm && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(2 * sizeof(int)))
        memcpy(fds, CMSG_DATA(cm), sizeof(fds));
    else if (cm && cm->cmsg_type == SCM_RIGHTS)   /* wrong count: close what came */
        for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
            close(((int *)(void *)CMSG_DATA(cm))[i]);
    c->win_size = window_size(ep);
    if (n != sizeof(h) || fds[0] < 0 || h.magic != SHM_MAGIC || h.version != SHM_VERSION ||
        h.ring_bytes != ep->g.ring_bytes || !window_ok(fds[0], c->win_size) ||
        !window_ok(fds[1], c->win_size))
        goto out;
    /* The connector's window 0 is its own (we write it), window 1 ours. */
    c->peers = map_window(fds[0], c->win_size);
    c->mine = map_window(fds[1], c->win_size);
    if (!c->peers || !c->mine) {
        rc = TERN_ENOMEM;
        goto out;
    }
    bind_rings(c);
    rc = 1;
out:
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    return rc;
}

static int shm_listen(struct tern_tp_ep *base, const char *addr, char *bound, size_t bound_len)
{
    struct shm_ep *ep = SEP(base);
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

static int shm_connect(struct tern_tp_ep *base, const char *addr, struct tern_tp_conn **out)
{
    struct shm_ep *ep = SEP(base);
    struct shm_hello h = {.magic = SHM_MAGIC, .version = SHM_VERSION,
                          .ring_bytes = ep->g.ring_bytes};
    struct sockaddr_un sa;
    socklen_t sl;
    struct shm_conn *c;
    int fd, fds[2] = {-1, -1}, rc = 0;

    if (!sock_addr(addr, &sa, &sl))
        return TERN_EBADADDR;
    if (ep->nconns >= base->cfg.max_conns)
        return TERN_ENOBUFS;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    c = conn_new(ep, fd);
    if (!c) {
        close(fd);
        return TERN_ENOMEM;
    }
    snprintf(c->peer, sizeof(c->peer), "shm://%s", addr);
    c->win_size = window_size(ep);
    if (connect(fd, (struct sockaddr *)&sa, sl) < 0) {
        rc = errno == ECONNREFUSED || errno == ENOENT ? TERN_ECONNREFUSED : -errno;
        goto fail;
    }
    fds[0] = make_window(c->win_size);   /* ours: the listener writes it */
    fds[1] = make_window(c->win_size);   /* the listener's: we write it */
    if (fds[0] < 0 || fds[1] < 0 || !(c->mine = map_window(fds[0], c->win_size)) ||
        !(c->peers = map_window(fds[1], c->win_size)) || send_fds(fd, &h, fds, 2) < 0) {
        rc = TERN_ECONNREFUSED;
        goto fail;
    }
    bind_rings(c);
    c->state = ST_OPEN;
fail:
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    c->ev.connected = true;
    if (rc < 0)
        conn_fail(c, rc, "connect failed");
    ready_push(c);
    *out = &c->base;
    return 0;
}

/* ---- send path ---- */

static int shm_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf)
{
    struct shm_conn *c = SCONN(conn);
    uint8_t *p;

    if (c->state != ST_OPEN)
        return TERN_ENOTCONN;
    if (c->tx.resv || c->stage_resv)
        return TERN_EINVAL;
    /* A large message still leaving keeps later ones behind it, in order. */
    if (c->frag_pending) {
        c->want_writable = true;
        return TERN_EAGAIN;
    }
    if (len <= ring_max_record(c->tx.size)) {
        p = ring_tx_reserve(&c->tx, (uint32_t)len);
        if (!p) {
            c->want_writable = true;
            return TERN_EAGAIN;
        }
        *buf = p;
        return 0;
    }
    if (c->stage_cap < len) {
        uint8_t *s = realloc(c->stage, len);

        if (!s)
            return TERN_ENOMEM;
        c->stage = s;
        c->stage_cap = len;
    }
    c->stage_resv = true;
    c->frag_total = len;
    *buf = c->stage;
    return 0;
}

/* Push fragments of the staged message while credit lasts (at most
 * SHM_FRAG_BATCH per call, so one elephant cannot hog the poll). */
static void push_frags(struct shm_conn *c)
{
    uint32_t chunk = ring_max_record(c->tx.size) - (uint32_t)sizeof(struct shm_frag);

    for (int i = 0; i < SHM_FRAG_BATCH && c->frag_pending; i++) {
        size_t left = c->frag_total - c->frag_off;
        uint32_t n = left < chunk ? (uint32_t)left : chunk;
        struct shm_frag f = {.total = (uint32_t)c->frag_total, .offset = (uint32_t)c->frag_off};
        uint8_t *p = ring_tx_reserve(&c->tx, n + (uint32_t)sizeof(f));

        if (!p)
            return;
        memcpy(p, &f, sizeof(f));
        memcpy(p + sizeof(f), c->stage + c->frag_off, n);
        ring_tx_publish(&c->tx, n + (uint32_t)sizeof(f), RING_FRAG);
        c->published = true;
        c->frag_off += n;
        if (c->frag_off == c->frag_total)
            c->frag_pending = false;
    }
}

static int shm_msg_post(struct tern_tp_conn *conn, void *buf, size_t len)
{
    struct shm_conn *c = SCONN(conn);

    if (c->stage_resv && buf == c->stage) {
        c->stage_resv = false;
        if (len > c->frag_total)
            return TERN_EMSGSIZE;
        if (c->state != ST_OPEN)
            return TERN_ENOTCONN;
        if (len <= ring_max_record(c->tx.size)) {
            /* Shrunk to fit one record after all. */
            void *p = ring_tx_reserve(&c->tx, (uint32_t)len);

            if (p) {
                memcpy(p, c->stage, len);
                ring_tx_publish(&c->tx, (uint32_t)len, RING_MSG);
                c->published = true;
                return 0;
            }
        }
        c->frag_total = len;
        c->frag_off = 0;
        c->frag_pending = true;
        push_frags(c);
        return 0;
    }
    if (!c->tx.resv || buf != c->tx.resv)
        return TERN_EINVAL;
    if (len > c->tx.resv_len)
        return TERN_EMSGSIZE;
    ring_tx_publish(&c->tx, (uint32_t)len, RING_MSG);
    c->published = true;
    return 0;
}

static void shm_msg_abort(struct tern_tp_conn *conn, void *buf)
{
    struct shm_conn *c = SCONN(conn);

    if (c->stage_resv && buf == c->stage)
        c->stage_resv = false;
    else if (c->tx.resv == buf)
        ring_tx_abort(&c->tx);
}

static void shm_msg_release(struct tern_tp_conn *conn, const void *view)
{
    struct shm_conn *c = SCONN(conn);

    if (c->reasm_held && view == c->reasm) {
        c->reasm_held = false;
        ready_push(c);      /* a stalled FRAG may go on now */
        return;
    }
    if (c->rx.views)
        ring_rx_release(&c->rx);
}

/* ---- one-sided (requester) ---- */

static int ctl_send(struct shm_conn *c, const struct shm_ctl *ctl, const void *data,
                    uint32_t len)
{
    uint8_t *p;

    if (c->tx.resv || c->stage_resv || c->frag_pending)
        return TERN_EAGAIN;
    p = ring_tx_reserve(&c->tx, (uint32_t)sizeof(*ctl) + len);
    if (!p)
        return TERN_EAGAIN;
    memcpy(p, ctl, sizeof(*ctl));
    if (len)
        memcpy(p + sizeof(*ctl), data, len);
    ring_tx_publish(&c->tx, (uint32_t)sizeof(*ctl) + len, RING_CTL);
    c->published = true;
    return 0;
}

static int onesided(struct shm_conn *c, uint8_t op, const void *src, uint8_t *dst, size_t len,
                    const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    struct shm_ctl ctl = {.op = op, .key = rkey->key, .len = (uint32_t)len, .off = roff};
    int rc;

    if (c->state != ST_OPEN)
        return TERN_ENOTCONN;
    if (len + sizeof(ctl) > ring_max_record(c->tx.size))
        return TERN_EMSGSIZE;
    if (tp_pend_full(&c->ev))
        return TERN_EAGAIN;
    rc = ctl_send(c, &ctl, src, op == CTL_PUT ? (uint32_t)len : 0);
    if (rc == TERN_EAGAIN)
        c->want_writable = true;
    if (rc < 0)
        return rc;
    return tp_pend_push(&c->ev, op == CTL_PUT, dst, len, token);
}

static int shm_put(struct tern_tp_conn *conn, const void *src, size_t len,
                   const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    return onesided(SCONN(conn), CTL_PUT, src, NULL, len, rkey, roff, token);
}

static int shm_get(struct tern_tp_conn *conn, void *dst, size_t len,
                   const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    return onesided(SCONN(conn), CTL_GET, NULL, dst, len, rkey, roff, token);
}

/* ---- receive path ---- */

/* Serve or complete a CTL record. Returns 1 handled (ev may be filled:
 * *got = 1), 0 to retry later (no room to answer), <0 protocol error. */
static int on_ctl(struct shm_conn *c, const uint8_t *p, uint32_t len, struct tern_tp_event *ev,
                  int *got)
{
    struct shm_ctl ctl, ans = {0};
    uint8_t *where = NULL;
    struct tp_onesided *pd;

    if (len < sizeof(ctl))
        return TERN_EPROTO;
    /* It is released at once, so no view before it may still be held. */
    if (c->rx.views > 1)
        return 0;
    memcpy(&ctl, p, sizeof(ctl));
    if (ctl.op == CTL_PUT || ctl.op == CTL_GET) {
        int status;

        if (ctl.op == CTL_PUT && ctl.len != len - sizeof(ctl))
            return TERN_EPROTO;
        if (ctl.op == CTL_GET && len != sizeof(ctl))
            return TERN_EPROTO;
        status = ctl.len + sizeof(ctl) > ring_max_record(c->tx.size)
                     ? TERN_EREMACCESS
                     : tern_tp_mr_check(c->base.ep, ctl.key, ctl.off, ctl.len,
                                        ctl.op == CTL_PUT ? TERN_TP_ACCESS_REMOTE_WRITE
                                                          : TERN_TP_ACCESS_REMOTE_READ,
                                        &where);
        if (status < 0 && c->violations + 1 > SHM_MAX_VIOLATIONS) {
            conn_fail(c, TERN_EREMACCESS, "too many refused one-sided accesses");
            return 1;
        }
        ans.op = ctl.op == CTL_PUT ? CTL_ACK : CTL_GET_RESP;
        ans.status = status;
        ans.len = ctl.op == CTL_GET && status == 0 ? ctl.len : 0;
        if (ctl_send(c, &ans, where, ans.len) < 0)
            return 0;
        if (status < 0)
            c->violations++;
        else if (ctl.op == CTL_PUT)
            memcpy(where, p + sizeof(ctl), ctl.len);
        return 1;
    }
    if (ctl.op != CTL_ACK && ctl.op != CTL_GET_RESP)
        return TERN_EPROTO;
    pd = tp_pend_front(&c->ev);
    if (!pd || (ctl.op == CTL_ACK) != pd->is_put || ctl.status > 0 ||
        (ctl.status == 0 && ctl.op == CTL_GET_RESP &&
         (ctl.len != pd->len || len != sizeof(ctl) + pd->len)))
        return TERN_EPROTO;
    if (ctl.status == 0 && ctl.op == CTL_GET_RESP)
        memcpy(pd->dst, p + sizeof(ctl), pd->len);
    tp_pend_pop(&c->ev);
    *ev = (struct tern_tp_event){
        .type = ctl.op == CTL_ACK ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE,
        .status = ctl.status, .conn = &c->base, .token = pd->token,
    };
    *got = 1;
    return 1;
}

/* A FRAG record. Returns 1 consumed (ev filled when the message is whole),
 * 0 to retry later (a view is still held), <0 protocol error. */
static int on_frag(struct shm_conn *c, const uint8_t *p, uint32_t len, struct tern_tp_event *ev,
                   int *got)
{
    struct shm_frag f;
    size_t n;

    if (len < sizeof(f))
        return TERN_EPROTO;
    memcpy(&f, p, sizeof(f));
    n = len - sizeof(f);
    /* The reassembly buffer holds one message; ring records before this
     * one must be released first, as views go back in order. */
    if (c->reasm_held || c->rx.views > 1)
        return 0;
    if (f.offset == 0) {
        if (f.total > c->base.ep->cfg.max_msg || f.total < n)
            return TERN_EPROTO;
        if (c->reasm_cap < f.total) {
            uint8_t *r = realloc(c->reasm, f.total);

            if (!r)
                return TERN_ENOMEM;
            c->reasm = r;
            c->reasm_cap = f.total;
        }
        c->reasm_total = f.total;
        c->reasm_got = 0;
    }
    if (f.offset != c->reasm_got || f.total != c->reasm_total || n > f.total - f.offset)
        return TERN_EPROTO;
    memcpy(c->reasm + f.offset, p + sizeof(f), n);
    c->reasm_got += n;
    if (c->reasm_got == c->reasm_total) {
        c->reasm_held = true;
        *ev = (struct tern_tp_event){.type = TERN_TP_EV_RECV, .conn = &c->base,
                                     .data = c->reasm, .len = c->reasm_total};
        *got = 1;
    }
    return 1;
}

/* Up to SHM_RX_BATCH records of one connection (fairness bound). */
static int rx_progress(struct shm_conn *c, struct tern_tp_event *ev, int max)
{
    int n = 0;

    for (int i = 0; i < SHM_RX_BATCH && n < max && c->state != ST_DEAD; i++) {
        const void *view;
        uint32_t len;
        enum ring_type type;
        int rc = ring_rx_peek(&c->rx, &view, &len, &type), got = 0;

        if (rc == 0)
            break;
        if (rc < 0) {
            conn_fail(c, rc, "corrupt ring");
            break;
        }
        if (type == RING_MSG) {
            ev[n++] = (struct tern_tp_event){.type = TERN_TP_EV_RECV, .conn = &c->base,
                                             .data = view, .len = len};
            continue;
        }
        rc = type == RING_FRAG ? on_frag(c, view, len, &ev[n], &got)
                               : on_ctl(c, view, len, &ev[n], &got);
        if (rc < 0) {
            conn_fail(c, rc, "malformed record");
            break;
        }
        if (rc == 0) {
            ring_rx_unpeek(&c->rx, len);
            break;
        }
        ring_rx_release(&c->rx);    /* FRAG and CTL records are copied out */
        n += got;
    }
    ring_rx_credit(&c->rx);
    return n;
}

static int conn_progress(struct shm_conn *c, struct tern_tp_event *ev, int max)
{
    bool open = c->state == ST_OPEN || c->state == ST_DRAINING;
    int n;

    if (open) {
        if (c->frag_pending)
            push_frags(c);
        if (c->want_writable && !c->frag_pending && ring_tx_room(&c->tx) >= c->tx.size / 4) {
            c->want_writable = false;
            c->ev.writable = true;
        }
    }
    n = tp_emit_owed(&c->ev, &c->base, ev, max);
    if (open) {
        n += rx_progress(c, ev + n, max - n);
        /* The peer left: everything it published has been handed out. */
        if (c->state == ST_DRAINING && n < max && !c->rx.views && !c->reasm_held) {
            const void *v;
            uint32_t l;
            enum ring_type t;

            if (ring_rx_peek(&c->rx, &v, &l, &t) == 0)
                conn_fail(c, 0, "peer left");
            else
                ring_rx_unpeek(&c->rx, l);
        }
    }
    if (c->state == ST_DEAD)
        n += tp_emit_dead(&c->ev, &c->base, ev + n, max - n);
    return n;
}

static bool conn_owes(const struct shm_conn *c)
{
    return tp_events_owed(&c->ev) || c->state == ST_DRAINING;
}

/* ---- sockets: accepts, HELLOs, hang-ups, doorbells ---- */

static void do_accept(struct shm_ep *ep, struct shm_listener *l)
{
    for (;;) {
        int fd = accept4(l->obj.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct shm_conn *c;

        if (fd < 0)
            return;
        if (ep->nconns >= ep->base.cfg.max_conns || !(c = conn_new(ep, fd))) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "refusing connection: %u open", ep->nconns);
            close(fd);
            continue;
        }
        snprintf(c->peer, sizeof(c->peer), "shm-peer");
        c->state = ST_ACCEPTING;
        /* The HELLO is usually there already. */
        switch (accept_hello(c)) {
        case 1:
            c->state = ST_OPEN;
            c->ev.accepted = true;
            ready_push(c);
            break;
        case 0:
            break;
        default:
            shm_disconnect(&c->base);
            break;
        }
    }
}

static void on_socket(struct shm_conn *c, uint32_t events)
{
    char buf[64];
    ssize_t r;

    if (c->state == ST_ACCEPTING) {
        int rc = accept_hello(c);

        if (rc == 1) {
            c->state = ST_OPEN;
            c->ev.accepted = true;
            ready_push(c);
        } else if (rc < 0 || (events & (EPOLLHUP | EPOLLERR))) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "bad or missing HELLO; dropping connection");
            shm_disconnect(&c->base);
        }
        return;
    }
    /* After set-up the socket carries only doorbells and the hang-up. */
    while ((r = recv(c->obj.fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
        ;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
        (events & (EPOLLHUP | EPOLLERR))) {
        if (c->state == ST_OPEN) {
            c->state = ST_DRAINING;
            epoll_ctl(SEP(c->base.ep)->epfd, EPOLL_CTL_DEL, c->obj.fd, NULL);
        }
    }
    ready_push(c);
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
 * fence pairs with the one in shm_arm (flag store, fence, ring check). The
 * peer clears its flag itself when it wakes. */
static void shm_doorbell(struct shm_conn *c)
{
    struct shm_link_ctl *me = (struct shm_link_ctl *)(void *)c->mine;

    c->published = false;
    full_fence();
    if (__atomic_load_n(&me->peer_sleeping, __ATOMIC_RELAXED) && c->obj.fd >= 0 &&
        send(c->obj.fd, "d", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN)
        tern_log(TERN_LOG_DEBUG, LOG_WHO, "doorbell to %s: %s", c->peer, strerror(errno));
}

static int shm_flush(struct tern_tp_ep *base)
{
    for (struct shm_conn *c = SEP(base)->conns; c; c = c->next)
        if (c->published && c->state == ST_OPEN)
            shm_doorbell(c);
    return 0;
}

static void wake_up(struct shm_ep *ep);

static void epoll_pass(struct shm_ep *ep)
{
    int ne = epoll_wait(ep->epfd, ep->evbuf, 64, 0);

    for (int i = 0; i < ne; i++) {
        struct shm_obj *o = ep->evbuf[i].data.ptr;

        if (o->kind == KIND_LISTENER)
            do_accept(ep, (struct shm_listener *)o);
        else
            on_socket((struct shm_conn *)((char *)o - offsetof(struct shm_conn, obj)),
                      ep->evbuf[i].events);
    }
}

static int shm_poll(struct tern_tp_ep *base, struct tern_tp_event *ev, int max)
{
    struct shm_ep *ep = SEP(base);
    struct shm_conn *todo;
    int n = 0;

    if (ep->armed)
        wake_up(ep);
    /* Sockets only carry set-up, hang-ups and doorbells: look at them every
     * few polls, not on each, to keep system calls off the data path. */
    if (++ep->polls % SHM_EPOLL_EVERY == 0)
        epoll_pass(ep);
    /* Owed events first. */
    todo = ep->ready;
    ep->ready = NULL;
    while (todo) {
        struct shm_conn *c = todo;

        todo = c->ready_next;
        c->on_ready = false;
        if (n < max)
            n += conn_progress(c, ev + n, max - n);
        if (conn_owes(c))
            ready_push(c);
    }
    /* Then every open connection, a bounded batch each. */
    for (struct shm_conn *c = ep->conns; c && n < max; c = c->next)
        if (c->state == ST_OPEN && !c->on_ready)
            n += conn_progress(c, ev + n, max - n);
    shm_flush(base);
    return n;
}

/* ---- blocking ---- */

static bool conn_has_input(struct shm_conn *c)
{
    const void *v;
    uint32_t l;
    enum ring_type t;
    int rc = ring_rx_peek(&c->rx, &v, &l, &t);

    if (rc == 1)
        ring_rx_unpeek(&c->rx, l);
    return rc != 0;
}

static int shm_arm(struct tern_tp_ep *base)
{
    struct shm_ep *ep = SEP(base);

    if (ep->ready)
        return TERN_EAGAIN;
    /* Tell every peer we sleep, then look once more: a message published
     * before the peer saw the flag is found here, one after it rings. */
    for (struct shm_conn *c = ep->conns; c; c = c->next)
        if (c->state == ST_OPEN && c->peers)
            __atomic_store_n(&((struct shm_link_ctl *)(void *)c->peers)->peer_sleeping, 1,
                             __ATOMIC_RELAXED);
    ep->armed = true;
    full_fence();
    for (struct shm_conn *c = ep->conns; c; c = c->next)
        if (c->state == ST_OPEN && c->mine && (conn_has_input(c) || c->frag_pending ||
                                                c->want_writable))
            return TERN_EAGAIN;
    return 0;
}

static void wake_up(struct shm_ep *ep)
{
    ep->armed = false;
    for (struct shm_conn *c = ep->conns; c; c = c->next)
        if (c->state == ST_OPEN && c->peers)
            __atomic_store_n(&((struct shm_link_ctl *)(void *)c->peers)->peer_sleeping, 0,
                             __ATOMIC_RELAXED);
}

static int shm_wait(struct tern_tp_ep *base, int timeout_ms)
{
    struct shm_ep *ep = SEP(base);
    struct epoll_event e;
    int rc;

    if (shm_arm(base) < 0) {
        wake_up(ep);
        return 1;
    }
    rc = epoll_wait(ep->epfd, &e, 1, timeout_ms);
    wake_up(ep);
    if (rc > 0)     /* a socket spoke: let the next poll read it */
        ep->polls = SHM_EPOLL_EVERY - 1;
    return rc > 0;
}

static int shm_wait_fd(struct tern_tp_ep *base)
{
    return SEP(base)->epfd;
}

/* ---- endpoint ---- */

static int shm_ep_open(struct tern_tp_ep *base)
{
    struct shm_ep *ep = SEP(base);

    ep->g = (struct ring_geometry){.n_chan = 1, .ring_bytes = SHM_RING_BYTES};
    ep->epfd = epoll_create1(EPOLL_CLOEXEC);
    return ep->epfd < 0 ? -errno : 0;
}

static void shm_ep_close(struct tern_tp_ep *base)
{
    struct shm_ep *ep = SEP(base);

    while (ep->conns)
        shm_disconnect(&ep->conns->base);
    while (ep->listeners) {
        struct shm_listener *l = ep->listeners;

        ep->listeners = l->next;
        close(l->obj.fd);
        free(l);
    }
    close(ep->epfd);
}

static const struct tern_tp_ops shm_ops = {
    .ep_open = shm_ep_open,
    .ep_close = shm_ep_close,
    .listen = shm_listen,
    .connect = shm_connect,
    .disconnect = shm_disconnect,
    .conn_peer = shm_conn_peer,
    .msg_alloc = shm_msg_alloc,
    .msg_post = shm_msg_post,
    .msg_abort = shm_msg_abort,
    .msg_release = shm_msg_release,
    .put = shm_put,
    .get = shm_get,
    .poll = shm_poll,
    .flush = shm_flush,
    .wait_fd = shm_wait_fd,
    .arm = shm_arm,
    .wait = shm_wait,
};

const struct tern_tp_fabric tern_tp_fabric_shm = {
    .name = "shm",
    .caps = TERN_TP_CAP_MSG | TERN_TP_CAP_PUT | TERN_TP_CAP_GET | TERN_TP_CAP_WAIT_FD |
            TERN_TP_CAP_LISTEN | TERN_TP_CAP_CONNECT,
    .ep_size = sizeof(struct shm_ep),
    .ops = &shm_ops,
};
