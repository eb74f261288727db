/* The TCP fabric: kernel sockets, the fallback that always works.
 *
 * Every connection carries length-prefixed frames (tcp_wire.h). Messages are
 * written in place into the connection's send buffer and sent from there;
 * received messages are views into the receive buffer, which is compacted only
 * when no view is held. One-sided put/get travel as frames that the peer's
 * progress engine (this file's poll) checks against its registered regions and
 * answers in order, so completions come back in FIFO order.
 *
 * Readiness comes from one level-triggered epoll set per endpoint; connections
 * with leftover work (more frames than the caller's event array took, pending
 * close events) sit on a ready list that poll serves first.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../conn_events.h"
#include "log.h"
#include "../addr.h"
#include "../transport_internal.h"
#include "tcp_wire.h"

#define TCP_BUF_INIT (32u * 1024)
#define TCP_EPOLL_BATCH 64
#define TCP_MAX_VIOLATIONS 16 /* refused one-sided accesses before we hang up */
#define TCP_DIRECT_MAX 4    /* busy mode: connections read without epoll */
#define TCP_DIRECT_EPOLL 32 /* ... but ask epoll every this many polls */

enum tcp_kind { KIND_LISTENER, KIND_CONN };

struct tcp_obj {
    enum tcp_kind kind;
    int fd;
};

struct tcp_listener {
    struct tcp_obj obj;
    struct tcp_listener *next;
};

enum tcp_state { ST_CONNECTING, ST_OPEN, ST_DEAD };

struct tcp_conn {
    struct tern_tp_conn base;
    struct tcp_obj obj;
    struct tcp_conn *dirty_next;      /* posted frames not yet sent */
    bool dirty;
    enum tcp_state state;
    struct tp_conn_events ev;         /* owed events, one-sided in flight */
    bool want_writable;               /* an alloc failed with EAGAIN */
    bool epollout, rx_paused, rx_more, rx_eof;
    bool in_epoll;                    /* fd is in the epoll set */
    bool rx_wait_tx;                  /* parsing waits for send space */
    unsigned violations;              /* refused one-sided accesses */
    char peer[64];

    uint8_t *rx;
    size_t rx_cap, rx_len, rx_parse;
    unsigned rx_views;

    uint8_t *tx;
    size_t tx_cap, tx_head, tx_tail;
    uint8_t *tx_resv;                 /* open reservation (payload start) */
    size_t tx_resv_len;

};

struct tcp_ep {
    struct tern_tp_ep base;
    int epfd;
    struct tcp_listener *listeners;
    struct tcp_conn *dirty;
    unsigned spins;
    struct epoll_event evbuf[TCP_EPOLL_BATCH];
};

#define TEP(ep) ((struct tcp_ep *)(ep))
#define TCONN(c) ((struct tcp_conn *)(c))
#define LOG_WHO "tcp"

/* ---- small helpers ---- */

static void ready_push(struct tcp_conn *c)
{
    tp_ready_push(&c->base);
}

/* Posted frames are sent by the next flush (tern_tp_flush, or the start and
 * end of tern_tp_poll), so that everything posted while handling one batch of
 * events leaves in one send() per connection. */
static void dirty_push(struct tcp_conn *c)
{
    struct tcp_ep *ep = TEP(c->base.ep);

    if (c->dirty)
        return;
    c->dirty = true;
    c->dirty_next = ep->dirty;
    ep->dirty = c;
}

static void dirty_remove(struct tcp_conn *c)
{
    struct tcp_conn **pp = &TEP(c->base.ep)->dirty;

    if (!c->dirty)
        return;
    while (*pp && *pp != c)
        pp = &(*pp)->dirty_next;
    if (*pp)
        *pp = c->dirty_next;
    c->dirty = false;
}

/* Keep the epoll registration in line with what the connection waits for.
 * A connection that waits for nothing leaves the set entirely: epoll reports
 * ERR/HUP even with no events asked, and a paused connection must not wake
 * sleepers over and over. The error is found when it reads again. */
static void epoll_set(struct tcp_conn *c)
{
    struct epoll_event e = {.data.ptr = &c->obj};
    int epfd = TEP(c->base.ep)->epfd;

    if (c->obj.fd < 0)
        return;
    e.events = (c->rx_paused || c->rx_wait_tx ? 0 : EPOLLIN) | (c->epollout ? EPOLLOUT : 0);
    if (!e.events) {
        if (c->in_epoll)
            epoll_ctl(epfd, EPOLL_CTL_DEL, c->obj.fd, NULL);
        c->in_epoll = false;
        return;
    }
    epoll_ctl(epfd, c->in_epoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->obj.fd, &e);
    c->in_epoll = true;
}

static void set_epollout(struct tcp_conn *c, bool on)
{
    if (c->epollout != on) {
        c->epollout = on;
        epoll_set(c);
    }
}

/* ---- connection lifetime ---- */

/* How long data sent may go unacknowledged before the connection counts as
 * dead (TCP_USER_TIMEOUT; TERN_TCP_DEAD_MS, default 2 s as for NTB links).
 * Without it a peer cut off for a while keeps a connection that looks open:
 * what was sent into the cut sits in the send queue while retransmissions
 * back off (25 s after a 15 s cut), so the connection stays silent long
 * after the path is back, and then delivers requests whose callers gave up
 * long ago, a write among them that overwrites the writes made since. A
 * dead connection drops its queue; a caller dials again. */
static unsigned dead_ms(void)
{
    static unsigned v;

    if (!v) {
        const char *e = getenv("TERN_TCP_DEAD_MS");
        long n = e ? strtol(e, NULL, 10) : 0;

        v = n >= 100 && n <= 600000 ? (unsigned)n : 2000;
    }
    return v;
}

static struct tcp_conn *conn_new(struct tcp_ep *ep, int fd)
{
    struct tcp_conn *c = calloc(1, sizeof(*c));
    struct epoll_event e = {.events = EPOLLIN};
    int one = 1;

    if (!c)
        return NULL;
    c->rx = malloc(TCP_BUF_INIT);
    c->tx = malloc(TCP_BUF_INIT);
    if (!c->rx || !c->tx)
        goto fail;
    c->rx_cap = c->tx_cap = TCP_BUF_INIT;
    c->base.ep = &ep->base;
    c->obj = (struct tcp_obj){.kind = KIND_CONN, .fd = fd};
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &(unsigned){dead_ms()}, sizeof(unsigned));
    e.data.ptr = &c->obj;
    if (epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
        goto fail;
    c->in_epoll = true;
    tp_conn_add(&ep->base, &c->base);
    return c;
fail:
    free(c->rx);
    free(c->tx);
    free(c);
    return NULL;
}

/* The connection failed or the peer left: stop using the socket, and owe the
 * application the completions of whatever was in flight, then CLOSED. */
static void conn_fail(struct tcp_conn *c, int status, const char *why)
{
    if (c->state == ST_DEAD)
        return;
    if (status < 0)
        tern_log(TERN_LOG_WARN, LOG_WHO, "connection %s closed: %s (%s)", c->peer, why,
                 tern_strerror(status));
    else
        tern_log(TERN_LOG_DEBUG, LOG_WHO, "connection %s closed by peer", c->peer);
    tp_conn_dead(&c->ev, status, c->state == ST_CONNECTING);
    c->state = ST_DEAD;
    if (c->obj.fd >= 0) {
        if (c->in_epoll)
            epoll_ctl(TEP(c->base.ep)->epfd, EPOLL_CTL_DEL, c->obj.fd, NULL);
        close(c->obj.fd);
        c->obj.fd = -1;
    }
    ready_push(c);
}

static void tcp_disconnect(struct tern_tp_conn *conn)
{
    struct tcp_conn *c = TCONN(conn);
    struct tcp_ep *ep = TEP(conn->ep);

    if (c->obj.fd >= 0) {
        if (c->in_epoll)
            epoll_ctl(ep->epfd, EPOLL_CTL_DEL, c->obj.fd, NULL);
        close(c->obj.fd);
    }
    dirty_remove(c);
    tp_conn_del(&c->base);
    free(c->rx);
    free(c->tx);
    free(c);
}

static const char *tcp_conn_peer(const struct tern_tp_conn *conn)
{
    return TCONN(conn)->peer;
}

/* Loopback, or an address of this host's own (the peer dialed itself). */
static bool tcp_conn_local(const struct tern_tp_conn *conn)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof(me), pl = sizeof(peer);
    int fd = TCONN(conn)->obj.fd;

    if (fd < 0 || getsockname(fd, (struct sockaddr *)&me, &ml) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) < 0 || me.ss_family != peer.ss_family)
        return false;
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *p = (const void *)&peer, *m = (const void *)&me;

        return (ntohl(p->sin_addr.s_addr) >> 24) == 127 || p->sin_addr.s_addr == m->sin_addr.s_addr;
    }
    if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const void *)&peer, *m = (const void *)&me;

        return IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) ||
               memcmp(&p->sin6_addr, &m->sin6_addr, sizeof(p->sin6_addr)) == 0;
    }
    return false;
}

/* ---- send path ---- */

static void tx_flush(struct tcp_conn *c)
{
    while (c->state == ST_OPEN && c->tx_head < c->tx_tail) {
        ssize_t n = send(c->obj.fd, c->tx + c->tx_head, c->tx_tail - c->tx_head,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            size_t want = c->tx_tail - c->tx_head;

            c->tx_head += (size_t)n;
            if ((size_t)n < want) {     /* the socket is full: wait for it */
                set_epollout(c, true);
                return;
            }
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_epollout(c, true);
            return;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == ETIMEDOUT)
            conn_fail(c, TERN_ETIMEDOUT, "the peer acknowledged nothing in time "
                                         "(TERN_TCP_DEAD_MS)");
        else
            conn_fail(c, TERN_ECONNRESET, "send failed");
        return;
    }
    if (c->tx_head == c->tx_tail && !c->tx_resv) {
        c->tx_head = c->tx_tail = 0;
        if (c->state == ST_OPEN)
            set_epollout(c, false);
        if (c->want_writable) {
            c->want_writable = false;
            c->ev.writable = true;
            ready_push(c);
        }
        if (c->rx_wait_tx) {            /* answers fit again: parse on */
            c->rx_wait_tx = false;
            epoll_set(c);
            ready_push(c);
        }
    }
}

/* Room for `need` contiguous bytes at the tail of the send buffer, or NULL. */
static uint8_t *tx_reserve(struct tcp_conn *c, size_t need)
{
    size_t limit = c->base.ep->cfg.conn_buf;

    if (c->tx_cap - c->tx_tail >= need)
        return c->tx + c->tx_tail;
    if (c->tx_head > 0) {   /* slide the unsent bytes to the front */
        memmove(c->tx, c->tx + c->tx_head, c->tx_tail - c->tx_head);
        c->tx_tail -= c->tx_head;
        c->tx_head = 0;
        if (c->tx_cap - c->tx_tail >= need)
            return c->tx + c->tx_tail;
    }
    if (c->tx_tail + need <= limit) {
        size_t cap = c->tx_cap * 2;
        uint8_t *p;

        while (cap < c->tx_tail + need)
            cap *= 2;
        if (cap > limit)
            cap = limit;
        p = realloc(c->tx, cap);
        if (p) {
            c->tx = p;
            c->tx_cap = cap;
            return c->tx + c->tx_tail;
        }
    }
    return NULL;
}

static void frame_hdr(uint8_t *p, uint8_t type, size_t body_len)
{
    struct tcp_hdr h = {
        .magic = htole16(TCP_MAGIC), .version = TCP_VERSION, .type = type,
        .len = htole32((uint32_t)body_len),
    };
    memcpy(p, &h, sizeof(h));
}

static void tx_commit(struct tcp_conn *c, uint8_t *frame, uint8_t type, size_t body_len)
{
    size_t used = sizeof(struct tcp_hdr) + body_len, total = TCP_FRAME_LEN(body_len);

    frame_hdr(frame, type, body_len);
    memset(frame + used, 0, total - used);
    c->tx_tail = (size_t)(frame - c->tx) + total;
    dirty_push(c);
}

static int tcp_flush(struct tern_tp_ep *base)
{
    struct tcp_ep *ep = TEP(base);

    while (ep->dirty) {
        struct tcp_conn *c = ep->dirty;

        ep->dirty = c->dirty_next;
        c->dirty = false;
        tx_flush(c);
    }
    return 0;
}

static int tcp_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf)
{
    struct tcp_conn *c = TCONN(conn);
    uint8_t *p;

    if (c->state == ST_DEAD)
        return TERN_ENOTCONN;
    if (c->tx_resv)
        return TERN_EINVAL;
    p = tx_reserve(c, TCP_FRAME_LEN(len));
    if (!p) {
        c->want_writable = true;
        return TERN_EAGAIN;
    }
    c->tx_resv = p + sizeof(struct tcp_hdr);
    c->tx_resv_len = len;
    *buf = c->tx_resv;
    return 0;
}

static int tcp_msg_post(struct tern_tp_conn *conn, void *buf, size_t len)
{
    struct tcp_conn *c = TCONN(conn);
    uint8_t *frame;

    if (!c->tx_resv || buf != c->tx_resv)
        return TERN_EINVAL;
    if (len > c->tx_resv_len)
        return TERN_EMSGSIZE;
    frame = c->tx_resv - sizeof(struct tcp_hdr);
    c->tx_resv = NULL;
    if (c->state == ST_DEAD)
        return TERN_ENOTCONN;
    tx_commit(c, frame, TCP_MSG, len);
    return 0;
}

static void tcp_msg_abort(struct tern_tp_conn *conn, void *buf)
{
    struct tcp_conn *c = TCONN(conn);

    if (c->tx_resv == buf)
        c->tx_resv = NULL;
}

static void tcp_msg_release(struct tern_tp_conn *conn, const void *view)
{
    struct tcp_conn *c = TCONN(conn);

    if (!c->rx_views)
        return;
    if (--c->rx_views == 0 && c->rx_paused) {
        c->rx_paused = false;
        epoll_set(c);
        ready_push(c);
    }
}

/* ---- one-sided operations (requester side) ---- */

static int onesided_prep(struct tcp_conn *c, size_t body, uint8_t **frame)
{
    if (c->state == ST_DEAD)
        return TERN_ENOTCONN;
    if (c->tx_resv)
        return TERN_EAGAIN;
    if (tp_pend_full(&c->ev))
        return TERN_EAGAIN;
    *frame = tx_reserve(c, TCP_FRAME_LEN(body));
    if (!*frame) {
        c->want_writable = true;
        return TERN_EAGAIN;
    }
    return 0;
}

static int tcp_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, const void *src, size_t len,
                   const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    struct tcp_conn *c = TCONN(conn);
    struct tcp_onesided req = {.key = htole32(rkey->key), .len = htole32((uint32_t)len),
                               .off = htole64(roff)};
    uint8_t *frame;
    int rc = onesided_prep(c, sizeof(req) + len, &frame);

    if (rc < 0)
        return rc;
    memcpy(frame + sizeof(struct tcp_hdr), &req, sizeof(req));
    memcpy(frame + sizeof(struct tcp_hdr) + sizeof(req), src, len);
    tp_pend_push(&c->ev, true, NULL, len, token);
    tx_commit(c, frame, TCP_PUT, sizeof(req) + len);
    return 0;
}

static int tcp_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, void *dst, size_t len,
                   const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    struct tcp_conn *c = TCONN(conn);
    struct tcp_onesided req = {.key = htole32(rkey->key), .len = htole32((uint32_t)len),
                               .off = htole64(roff)};
    uint8_t *frame;
    int rc = onesided_prep(c, sizeof(req), &frame);

    if (rc < 0)
        return rc;
    memcpy(frame + sizeof(struct tcp_hdr), &req, sizeof(req));
    tp_pend_push(&c->ev, false, dst, len, token);
    tx_commit(c, frame, TCP_GET_REQ, sizeof(req));
    return 0;
}

/* ---- receive path ---- */

/* Largest body a frame of `type` may carry, or 0 for an unknown type. */
static size_t body_limit(const struct tcp_conn *c, uint8_t type)
{
    size_t max = c->base.ep->cfg.max_msg;

    switch (type) {
    case TCP_MSG: return max;
    case TCP_PUT: return sizeof(struct tcp_onesided) + max;
    case TCP_GET_REQ: return sizeof(struct tcp_onesided);
    case TCP_ACK: return sizeof(struct tcp_ack);
    case TCP_GET_RESP: return sizeof(struct tcp_ack) + max;
    }
    return 0;
}

/* The peer asks us to write (PUT) or read (GET_REQ) our registered memory:
 * check it as a NIC would and answer. Returns 1 if handled, 0 if the send
 * path has no room yet (try again later). */
static int serve_onesided(struct tcp_conn *c, uint8_t type, const uint8_t *body, size_t blen)
{
    struct tcp_onesided req;
    uint32_t len;
    uint8_t *where = NULL, *frame;
    int status;
    size_t resp_len;

    memcpy(&req, body, sizeof(req));
    len = le32toh(req.len);
    if ((type == TCP_PUT && len != blen - sizeof(req)) || len > c->base.ep->cfg.max_msg)
        status = TERN_EREMACCESS;
    else
        status = tp_mr_check(&c->base, le32toh(req.key), le64toh(req.off), len,
                                  type == TCP_PUT ? TERN_TP_ACCESS_REMOTE_WRITE
                                                  : TERN_TP_ACCESS_REMOTE_READ,
                                  &where);
    /* A NIC breaks the queue pair on the first bad access; we allow a few
     * (callers probe bounds) but not a key search. */
    if (status < 0 && ++c->violations > TCP_MAX_VIOLATIONS) {
        conn_fail(c, TERN_EREMACCESS, "too many refused one-sided accesses");
        return 1;
    }
    resp_len = sizeof(struct tcp_ack) + (type == TCP_GET_REQ && status == 0 ? len : 0);
    if (c->tx_resv)
        return 0;
    frame = tx_reserve(c, TCP_FRAME_LEN(resp_len));
    if (!frame) {
        /* Park until the send path drains (tx_flush unparks): a peer that
         * asks without reading gets TCP backpressure, not our CPU. */
        if (status < 0)
            c->violations--;    /* counted again when retried */
        c->rx_wait_tx = true;
        epoll_set(c);
        return 0;
    }
    if (status == 0 && type == TCP_PUT)
        memcpy(where, body + sizeof(req), len);
    struct tcp_ack ack = {.status = (int32_t)htole32((uint32_t)status)};
    memcpy(frame + sizeof(struct tcp_hdr), &ack, sizeof(ack));
    if (resp_len > sizeof(ack))
        memcpy(frame + sizeof(struct tcp_hdr) + sizeof(ack), where, len);
    tx_commit(c, frame, type == TCP_PUT ? TCP_ACK : TCP_GET_RESP, resp_len);
    return 1;
}

/* The peer answered our oldest one-sided operation. */
static int complete_onesided(struct tcp_conn *c, uint8_t type, const uint8_t *body,
                             size_t blen, struct tern_tp_event *ev)
{
    struct tp_onesided *p = tp_pend_front(&c->ev);
    struct tcp_ack ack;
    int status;

    if (!p || (type == TCP_ACK) != p->is_put)
        return TERN_EPROTO;
    memcpy(&ack, body, sizeof(ack));
    status = (int32_t)le32toh((uint32_t)ack.status);
    if (status > 0 || (status == 0 && type == TCP_GET_RESP &&
                       blen != sizeof(ack) + p->len))
        return TERN_EPROTO;
    if (status == 0 && type == TCP_GET_RESP)
        memcpy(p->dst, body + sizeof(ack), p->len);
    tp_pend_pop(&c->ev);
    *ev = (struct tern_tp_event){
        .type = type == TCP_ACK ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE,
        .status = status, .conn = &c->base, .token = p->token,
    };
    return 1;
}

/* Make room for a frame of `total` bytes starting at rx_parse. */
static bool rx_make_room(struct tcp_conn *c, size_t total)
{
    if (c->rx_cap - c->rx_parse >= total)
        return true;
    if (c->rx_views)
        return false;   /* views pin the buffer; wait for their release */
    memmove(c->rx, c->rx + c->rx_parse, c->rx_len - c->rx_parse);
    c->rx_len -= c->rx_parse;
    c->rx_parse = 0;
    if (c->rx_cap < total) {
        size_t cap = c->rx_cap;
        uint8_t *p;

        while (cap < total)
            cap *= 2;
        p = realloc(c->rx, cap);
        if (!p)
            return false;
        c->rx = p;
        c->rx_cap = cap;
    }
    return true;
}

/* Parse whole frames into events. Returns the number of events written. */
static int rx_parse(struct tcp_conn *c, struct tern_tp_event *ev, int max)
{
    int n = 0;

    while (n < max && c->state != ST_DEAD) {
        size_t avail = c->rx_len - c->rx_parse, total, blen;
        uint8_t *f = c->rx + c->rx_parse;
        struct tcp_hdr h;
        int rc;

        if (avail < sizeof(h)) {
            if (!c->rx_views && c->rx_parse && c->rx_parse == c->rx_len)
                c->rx_parse = c->rx_len = 0;
            break;
        }
        memcpy(&h, f, sizeof(h));
        blen = le32toh(h.len);
        if (le16toh(h.magic) != TCP_MAGIC || h.version != TCP_VERSION) {
            conn_fail(c, TERN_EPROTO, "bad magic or version in frame header");
            break;
        }
        if (!body_limit(c, h.type) || blen > body_limit(c, h.type) ||
            ((h.type == TCP_PUT || h.type == TCP_GET_REQ || h.type == TCP_ACK ||
              h.type == TCP_GET_RESP) &&
             blen < (h.type == TCP_PUT || h.type == TCP_GET_REQ ? sizeof(struct tcp_onesided)
                                                                : sizeof(struct tcp_ack))) ||
            (h.type == TCP_GET_REQ && blen != sizeof(struct tcp_onesided))) {
            tern_log(TERN_LOG_WARN, LOG_WHO, "%s: frame type %u with %zu-byte body refused",
                     c->peer, h.type, blen);
            conn_fail(c, TERN_EPROTO, "unknown frame type or oversized length");
            break;
        }
        total = TCP_FRAME_LEN(blen);
        if (avail < total) {
            if (!rx_make_room(c, total)) {
                if (!c->rx_views) {
                    conn_fail(c, TERN_ENOMEM, "no memory for a large frame");
                } else {
                    c->rx_paused = true;
                    epoll_set(c);
                }
            }
            break;
        }
        switch (h.type) {
        case TCP_MSG:
            ev[n++] = (struct tern_tp_event){.type = TERN_TP_EV_RECV, .conn = &c->base,
                                             .data = f + sizeof(h), .len = blen};
            c->rx_views++;
            break;
        case TCP_PUT:
        case TCP_GET_REQ:
            if (!serve_onesided(c, h.type, f + sizeof(h), blen))
                return n;   /* no room for the answer: resume later */
            break;
        default:
            rc = complete_onesided(c, h.type, f + sizeof(h), blen, &ev[n]);
            if (rc < 0) {
                conn_fail(c, rc, "unexpected one-sided answer");
                return n;
            }
            n++;
            break;
        }
        c->rx_parse += total;
    }
    return n;
}

static void rx_read(struct tcp_conn *c)
{
    size_t room;
    ssize_t r;

    if (c->state != ST_OPEN || c->rx_paused || c->rx_wait_tx)
        return;
    if (c->rx_len == c->rx_cap) {
        if (c->rx_views) {      /* held views pin the buffer: stop reading */
            c->rx_paused = true;
            epoll_set(c);
            return;
        }
        if (!c->rx_parse)
            return;             /* a whole frame waits to be parsed */
        memmove(c->rx, c->rx + c->rx_parse, c->rx_len - c->rx_parse);
        c->rx_len -= c->rx_parse;
        c->rx_parse = 0;
    }
    room = c->rx_cap - c->rx_len;
    r = recv(c->obj.fd, c->rx + c->rx_len, room, MSG_DONTWAIT);
    if (r > 0) {
        c->rx_len += (size_t)r;
        c->rx_more = (size_t)r == room;
    } else if (r == 0) {
        c->rx_eof = true;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        c->rx_more = false;
    } else if (errno == ETIMEDOUT) {
        conn_fail(c, TERN_ETIMEDOUT, "the peer acknowledged nothing in time (TERN_TCP_DEAD_MS)");
    } else {
        conn_fail(c, TERN_ECONNRESET, "recv failed");
    }
}

/* Finish a non-blocking connect once the socket is writable. */
static void connect_done(struct tcp_conn *c)
{
    int err = 0;
    socklen_t len = sizeof(err);

    getsockopt(c->obj.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
        conn_fail(c, err == ECONNREFUSED ? TERN_ECONNREFUSED : TERN_ECONNRESET,
                  "connect failed");
        return;
    }
    c->state = ST_OPEN;
    c->ev.connected = true;
    set_epollout(c, false);
    tx_flush(c);
    ready_push(c);
}

/* True if a whole frame waits at rx_parse. */
static bool rx_frame_ready(const struct tcp_conn *c)
{
    struct tcp_hdr h;

    if (c->rx_len - c->rx_parse < sizeof(h))
        return false;
    memcpy(&h, c->rx + c->rx_parse, sizeof(h));
    return c->rx_len - c->rx_parse >= TCP_FRAME_LEN(le32toh(h.len));
}

/* All the work one connection can do now; returns events written. */
static int conn_progress(struct tcp_conn *c, struct tern_tp_event *ev, int max)
{
    int n = tp_emit_owed(&c->ev, &c->base, ev, max);

    if (c->state == ST_OPEN) {
        if (c->tx_head < c->tx_tail)
            tx_flush(c);
        n += rx_parse(c, ev + n, max - n);
        if (n < max && c->state == ST_OPEN) {
            rx_read(c);
            n += rx_parse(c, ev + n, max - n);
        }
        if (c->rx_eof && c->state == ST_OPEN && c->rx_parse == c->rx_len)
            conn_fail(c, 0, "eof");
        else if (c->rx_eof && c->state == ST_OPEN && n < max && !c->rx_wait_tx &&
                 !rx_frame_ready(c))
            conn_fail(c, TERN_EPROTO, "peer closed in the middle of a frame");
    }
    if (c->state == ST_DEAD)
        n += tp_emit_dead(&c->ev, &c->base, ev + n, max - n);
    return n;
}

static bool conn_has_work(const struct tcp_conn *c)
{
    if (tp_events_owed(&c->ev))
        return true;
    if (c->state == ST_DEAD)
        return false;
    if (c->rx_wait_tx)
        return false;
    if (c->rx_paused)
        return rx_frame_ready(c);
    return c->rx_more || c->rx_eof || rx_frame_ready(c);
}

/* ---- listeners ---- */

static void do_accept(struct tcp_ep *ep, struct tcp_listener *l)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        struct tcp_conn *c;
        int fd = accept4(l->obj.fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED)
                tern_log(TERN_LOG_WARN, LOG_WHO, "accept: %s", strerror(errno));
            if (errno == ECONNABORTED || errno == EINTR)
                continue;
            return;
        }
        if (ep->base.nconns >= ep->base.cfg.max_conns || !(c = conn_new(ep, fd))) {
            static struct tern_log_limit limit;

            if (tern_log_allow(&limit)) {
                tern_log(TERN_LOG_WARN, LOG_WHO,
                         "refusing connection: %u connections open (%u more refused)",
                         ep->base.nconns, limit.held);
                limit.held = 0;
            }
            close(fd);
            continue;
        }
        tp_addr_text((struct sockaddr *)&ss, c->peer, sizeof(c->peer));
        c->state = ST_OPEN;
        c->ev.accepted = true;
        ready_push(c);
    }
}

static int tcp_listen(struct tern_tp_ep *base, const char *addr, char *bound, size_t bound_len)
{
    struct tcp_ep *ep = TEP(base);
    struct addrinfo *ai;
    struct tcp_listener *l;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    struct epoll_event e = {.events = EPOLLIN};
    int fd, one = 1, rc = tp_addr_resolve(addr, true, &ai);

    if (rc < 0)
        return rc;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return -errno;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        rc = errno == EADDRINUSE ? TERN_EADDRINUSE : -errno;
        freeaddrinfo(ai);
        close(fd);
        return rc;
    }
    freeaddrinfo(ai);
    l = calloc(1, sizeof(*l));
    if (!l) {
        close(fd);
        return TERN_ENOMEM;
    }
    l->obj = (struct tcp_obj){.kind = KIND_LISTENER, .fd = fd};
    e.data.ptr = &l->obj;
    epoll_ctl(ep->epfd, EPOLL_CTL_ADD, fd, &e);
    l->next = ep->listeners;
    ep->listeners = l;
    if (bound && bound_len) {
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        tp_addr_text((struct sockaddr *)&ss, bound, bound_len);
    }
    return 0;
}

static int tcp_connect(struct tern_tp_ep *base, const char *addr, struct tern_tp_conn **out)
{
    struct tcp_ep *ep = TEP(base);
    struct addrinfo *ai;
    struct tcp_conn *c;
    int fd, rc = tp_addr_resolve(addr, false, &ai);

    if (rc < 0)
        return rc;
    if (ep->base.nconns >= base->cfg.max_conns) {
        freeaddrinfo(ai);
        return TERN_ENOBUFS;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return -errno;
    }
    c = conn_new(ep, fd);
    if (!c) {
        freeaddrinfo(ai);
        close(fd);
        return TERN_ENOMEM;
    }
    tp_addr_text(ai->ai_addr, c->peer, sizeof(c->peer));
    c->state = ST_CONNECTING;
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc == 0) {
        c->state = ST_OPEN;
        c->ev.connected = true;
        ready_push(c);
    } else if (errno == EINPROGRESS) {
        set_epollout(c, true);
    } else {
        conn_fail(c, errno == ECONNREFUSED ? TERN_ECONNREFUSED : -errno, "connect failed");
    }
    *out = &c->base;
    return 0;
}

/* ---- endpoint ---- */

static int tcp_ep_open(struct tern_tp_ep *base)
{
    struct tcp_ep *ep = TEP(base);

    ep->epfd = epoll_create1(EPOLL_CLOEXEC);
    return ep->epfd < 0 ? -errno : 0;
}

static void tcp_ep_close(struct tern_tp_ep *base)
{
    struct tcp_ep *ep = TEP(base);

    while (base->conns)
        tcp_disconnect(base->conns);
    while (ep->listeners) {
        struct tcp_listener *l = ep->listeners;

        ep->listeners = l->next;
        close(l->obj.fd);
        free(l);
    }
    close(ep->epfd);
}

static int tcp_poll(struct tern_tp_ep *base, struct tern_tp_event *ev, int max)
{
    struct tcp_ep *ep = TEP(base);
    struct tern_tp_conn *todo;
    int n = 0, ne;

    tcp_flush(base);
    /* Connections with leftover work first, but they get at most three
     * quarters of the events: a flooder that always has frames buffered must
     * not keep the others (and new accepts) from being looked at. */
    todo = tp_ready_take(base);
    while (todo) {
        struct tcp_conn *c = TCONN(todo);
        int cap = max >= 4 ? max - max / 4 : max;

        todo = todo->ready_next;
        c->base.on_ready = false;
        if (n < cap)
            n += conn_progress(c, ev + n, cap - n);
        if (conn_has_work(c))
            ready_push(c);
    }
    if (n >= max)
        goto out;

    /* Spinning on a few connections: one recv() each per poll costs one
     * system call where epoll_wait() + recv() costs two when data comes.
     * epoll still runs every TCP_DIRECT_EPOLL polls for accepts, connects
     * and EPOLLOUT. */
    if (base->cfg.mode == TERN_TP_POLL_BUSY && ep->base.nconns <= TCP_DIRECT_MAX &&
        ++ep->spins % TCP_DIRECT_EPOLL) {
        for (struct tern_tp_conn *b = base->conns; b && n < max; b = b->next) {
            struct tcp_conn *c = TCONN(b);

            if (c->state != ST_OPEN || b->on_ready || c->rx_paused || c->rx_wait_tx) {
                if (c->tx_head < c->tx_tail && c->state == ST_OPEN)
                    tx_flush(c);
                continue;
            }
            n += conn_progress(c, ev + n, max - n);
            if (conn_has_work(c))
                ready_push(c);
        }
        goto owed;
    }

    ne = epoll_wait(ep->epfd, ep->evbuf, TCP_EPOLL_BATCH, 0);
    for (int i = 0; i < ne; i++) {
        struct tcp_obj *o = ep->evbuf[i].data.ptr;
        struct tcp_conn *c;

        if (o->kind == KIND_LISTENER) {
            do_accept(ep, (struct tcp_listener *)o);
            continue;
        }
        c = (struct tcp_conn *)((char *)o - offsetof(struct tcp_conn, obj));
        if (c->state == ST_CONNECTING) {
            connect_done(c);
            continue;
        }
        if (ep->evbuf[i].events & EPOLLOUT)
            tx_flush(c);
        if (c->state == ST_OPEN && (ep->evbuf[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
            if (n < max && !c->base.on_ready)
                n += conn_progress(c, ev + n, max - n);
            if (conn_has_work(c))
                ready_push(c);
        }
    }
owed:
    /* Events owed by accepts and failures found above. */
    while (n < max && base->ready) {
        struct tcp_conn *c = TCONN(base->ready);
        int got;

        base->ready = c->base.ready_next;
        c->base.on_ready = false;
        got = conn_progress(c, ev + n, max - n);
        n += got;
        if (conn_has_work(c)) {
            ready_push(c);
            if (!got)
                break;
        }
    }
out:
    /* Answers to one-sided operations found in this batch leave now. */
    if (ep->dirty)
        tcp_flush(base);
    return n;
}

static int tcp_wait_fd(struct tern_tp_ep *base)
{
    return TEP(base)->epfd;
}

static int tcp_arm(struct tern_tp_ep *base)
{
    return base->ready ? TERN_EAGAIN : 0;
}

static int tcp_wait(struct tern_tp_ep *base, int timeout_ms)
{
    struct tcp_ep *ep = TEP(base);
    struct epoll_event e;

    if (base->ready)
        return 1;
    /* Level-triggered: whatever this reports, the next poll sees again. */
    return epoll_wait(ep->epfd, &e, 1, timeout_ms) > 0;
}

static const struct tern_tp_ops tcp_ops = {
    .ep_open = tcp_ep_open,
    .ep_close = tcp_ep_close,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .disconnect = tcp_disconnect,
    .conn_peer = tcp_conn_peer,
    .conn_local = tcp_conn_local,
    .msg_alloc = tcp_msg_alloc,
    .msg_post = tcp_msg_post,
    .msg_abort = tcp_msg_abort,
    .msg_release = tcp_msg_release,
    .put = tcp_put,
    .get = tcp_get,
    .poll = tcp_poll,
    .flush = tcp_flush,
    .wait_fd = tcp_wait_fd,
    .arm = tcp_arm,
    .wait = tcp_wait,
};

/* The loopback interface, any free port. */
static int tcp_local_addr(const char *tag, char *buf, size_t len)
{
    return snprintf(buf, len, "127.0.0.1:0") < (int)len ? 0 : TERN_EINVAL;
}

const struct tern_tp_fabric tp_fabric_tcp = {
    .name = "tcp",
    .caps = TERN_TP_CAP_MSG | TERN_TP_CAP_PUT | TERN_TP_CAP_GET | TERN_TP_CAP_WAIT_FD |
            TERN_TP_CAP_LISTEN | TERN_TP_CAP_CONNECT,
    .ep_size = sizeof(struct tcp_ep),
    .ops = &tcp_ops,
    .latency_ns = 10000,
    .bandwidth_gbs = 2,
    .local_addr = tcp_local_addr,
};
