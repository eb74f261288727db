/* Connections of the rdma fabric: set-up over rdma_cm (address and route
 * resolution, the connect request carrying our ring, accept or reject),
 * rings and queue pairs, and teardown. */
#include <endian.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../addr.h"
#include "log.h"
#include "rdma_internal.h"

#define RESOLVE_MS 2000
#define SOFT_PREFIX "soft:"

static struct tern_log_limit refused_log;

/* ---- QP number table ---- */

struct rdma_conn *trdma_conn_by_qpn(struct rdma_ep *ep, uint32_t qpn)
{
    struct rdma_conn *c = ep->qp_tab[qpn & ep->qp_mask];

    while (c && c->qpn != qpn)
        c = c->qp_next;
    return c;
}

static void qpn_add(struct rdma_conn *c)
{
    struct rdma_ep *ep = REP(c->base.ep);
    struct rdma_conn **b = &ep->qp_tab[c->qpn & ep->qp_mask];

    c->qp_next = *b;
    *b = c;
}

static void qpn_del(struct rdma_conn *c)
{
    struct rdma_ep *ep = REP(c->base.ep);

    for (struct rdma_conn **pp = &ep->qp_tab[c->qpn & ep->qp_mask]; *pp;
         pp = &(*pp)->qp_next)
        if (*pp == c) {
            *pp = c->qp_next;
            return;
        }
}

/* ---- states ---- */

static bool setting_up(enum rdma_conn_state s)
{
    return s == RC_RESOLVING || s == RC_CONNECTING || s == RC_ACCEPTING;
}

/* Connections in set-up make every poll look at the CM channel. */
static void set_state(struct rdma_conn *c, enum rdma_conn_state s)
{
    struct rdma_ep *ep = REP(c->base.ep);

    ep->cm_pending += setting_up(s);
    ep->cm_pending -= setting_up(c->state);
    c->state = s;
}

/* ---- rings ---- */

static void ring_free(struct rdma_ep *ep, uint8_t **p, uint64_t size, struct ibv_mr **mr)
{
    if (*mr)
        ep->api->dereg_mr(*mr);
    if (*p && ep->api->buf_free)
        ep->api->buf_free(*p, size);    /* its own, or anonymous pages */
    else if (*p)
        munmap(*p, size);
    *mr = NULL;
    *p = NULL;
}

/* A ring peers write into comes from the provider where it has memory for
 * that (rdma_api.h); otherwise, and if that fails, anonymous pages, whose
 * untouched parts cost nothing until a NIC registration pins them. */
static int ring_alloc(struct rdma_ep *ep, uint64_t size, int access, uint8_t **p,
                      struct ibv_mr **mr)
{
    *p = NULL;
    if (ep->api->buf_alloc && (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND)))
        *p = ep->api->buf_alloc(size);
    if (!*p)
        *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*p == MAP_FAILED) {
        *p = NULL;
        return TERN_ENOMEM;
    }
    *mr = ep->api->reg_mr(ep->pd, *p, size, access);
    if (!*mr) {
        ring_free(ep, p, size, mr);
        return TERN_ENOMEM;
    }
    return 0;
}

/* ---- memory windows ---- */

/* A window over [addr, addr+len) of registration `over` for the peer of
 * `c`, bound by the next flush (before any message posted after this). */
static struct rdma_win *win_new(struct rdma_conn *c, const struct tern_tp_mr *mr,
                                struct ibv_mr *over, uint64_t addr, uint64_t len,
                                uint32_t access)
{
    struct rdma_win *w = calloc(1, sizeof(*w)), **tail = &c->wins;

    if (!w)
        return NULL;
    w->mw = ibv_alloc_mw(REP(c->base.ep)->pd, IBV_MW_TYPE_2);
    if (!w->mw) {
        free(w);
        return NULL;
    }
    w->mr = mr;
    w->over = over;
    w->addr = addr;
    w->len = len;
    w->access = access;
    w->rkey = ibv_inc_rkey(w->mw->rkey);
    while (*tail)       /* binds go in the order asked */
        tail = &(*tail)->next;
    *tail = w;
    c->wins_unposted++;
    trdma_mark_dirty(c);
    return w;
}

static void win_free(struct rdma_conn *c, struct rdma_win *w)
{
    if (!w->posted)
        c->wins_unposted--;
    ibv_dealloc_mw(w->mw);
    free(w);
}

int trdma_conn_rkey(struct tern_tp_conn *conn, struct tern_tp_mr *mr, struct tern_tp_rkey *out)
{
    struct rdma_conn *c = RCONN(conn);
    struct rdma_win *w;
    uint32_t access = 0;

    *out = tern_tp_mr_rkey(mr);
    if (mr->access & TERN_TP_ACCESS_REMOTE_READ)
        access |= IBV_ACCESS_REMOTE_READ;
    if (mr->access & TERN_TP_ACCESS_REMOTE_WRITE)
        access |= IBV_ACCESS_REMOTE_WRITE;
    /* Without windows the region's key is every connection's; a region
     * without remote rights or bytes has nothing to bind. */
    if (!REP(conn->ep)->mw || !access || !mr->fab)
        return 0;
    if (c->state == RC_CLOSING || c->state == RC_DEAD)
        return TERN_ENOTCONN;
    for (w = c->wins; w; w = w->next)
        if (w->mr == mr)
            break;
    if (!w)
        w = win_new(c, mr, mr->fab, (uintptr_t)mr->addr, mr->len, access);
    if (!w)
        return TERN_ENOMEM;
    out->key = w->rkey;
    return 0;
}

void trdma_windows_drop(struct rdma_ep *ep, const struct tern_tp_mr *mr)
{
    for (struct tern_tp_conn *b = ep->base.conns; b; b = b->next) {
        struct rdma_conn *c = RCONN(b);

        for (struct rdma_win **pp = &c->wins; *pp;) {
            struct rdma_win *w = *pp;

            if (w->mr != mr) {
                pp = &w->next;
                continue;
            }
            *pp = w->next;
            win_free(c, w);
        }
    }
}

/* ---- rings ---- */

static uint8_t ring_log2(const struct rdma_ep *ep)
{
    uint8_t l = RDMA_RING_MIN_LOG2;

    while (((uint64_t)1 << l) < ep->base.cfg.conn_buf ||
           ((uint64_t)1 << l) < 2 * rec_size(ep->base.cfg.max_msg))
        l++;
    return l;
}

static struct rdma_hello hello_of(const struct rdma_conn *c)
{
    const struct rdma_ep *ep = REP(c->base.ep);

    return (struct rdma_hello){
        .magic = htole32(RDMA_HELLO_MAGIC), .version = htole16(RDMA_HELLO_VERSION),
        .ring_log2 = ring_log2(ep), .flags = ep->mw ? RDMA_HELLO_KEY_IN_BAND : 0,
        .ring_addr = htole64((uintptr_t)c->rx),
        .ring_rkey = htole32(ep->mw ? 0 : c->rx_mr->rkey),
        .max_msg = htole32((uint32_t)ep->base.cfg.max_msg)};
}

/* A peer's hello, checked: its ring must hold two of its largest records. */
static bool hello_parse(const void *data, size_t len, struct rdma_hello *h)
{
    if (!data || len < sizeof(*h))
        return false;
    memcpy(h, data, sizeof(*h));
    h->magic = le32toh(h->magic);
    h->version = le16toh(h->version);
    h->ring_addr = le64toh(h->ring_addr);
    h->ring_rkey = le32toh(h->ring_rkey);
    h->max_msg = le32toh(h->max_msg);
    return h->magic == RDMA_HELLO_MAGIC && h->version == RDMA_HELLO_VERSION &&
           !(h->flags & ~RDMA_HELLO_KEY_IN_BAND) &&
           h->ring_log2 >= RDMA_RING_MIN_LOG2 && h->ring_log2 <= RDMA_RING_MAX_LOG2 &&
           2 * rec_size(h->max_msg) <= ((uint64_t)1 << h->ring_log2) && h->ring_addr;
}

static void peer_ring_set(struct rdma_conn *c, const struct rdma_hello *h)
{
    c->peer_ring_addr = h->ring_addr;
    c->peer_rkey = h->ring_rkey;
    c->peer_keyed = !(h->flags & RDMA_HELLO_KEY_IN_BAND);
    c->peer_max_msg = h->max_msg;
}

/* The active side staged records for a ring of its own size; the peer's
 * differs. Lay them out again for the peer's ring (nothing was sent yet).
 * A record the peer cannot take fails the connection. */
void trdma_conn_relayout(struct rdma_conn *c)
{
    struct rdma_ep *ep = REP(c->base.ep);
    uint64_t size = (uint64_t)1 << c->relayout_log2, pos = 0;
    struct ibv_mr *mr;
    uint8_t *ring;

    c->relayout_log2 = 0;
    if (ring_alloc(ep, size, IBV_ACCESS_LOCAL_WRITE, &ring, &mr) < 0) {
        trdma_conn_fail(c, TERN_ENOMEM);
        return;
    }
    for (uint64_t at = 0; at < c->tx_head;) {
        const struct rdma_rec *rec = (const void *)(c->tx + (at & (c->tx_size - 1)));
        uint64_t rs = rec_size(rec->len), off = pos & (size - 1);
        uint64_t skip = size - off < rs ? size - off : 0;

        at += rec->kind == REC_PAD ? rec->len : rs;
        if (rec->kind == REC_PAD)
            continue;
        if (rec->len > c->peer_max_msg || pos + skip + rs > size) {
            ring_free(ep, &ring, size, &mr);
            trdma_conn_fail(c, TERN_EMSGSIZE);
            return;
        }
        if (skip)
            *(struct rdma_rec *)(void *)(ring + off) =
                (struct rdma_rec){.len = (uint32_t)skip, .kind = REC_PAD};
        memcpy(ring + ((pos + skip) & (size - 1)), rec, RDMA_HDR + rec->len);
        pos += skip + rs;
    }
    ring_free(ep, &c->tx, c->tx_size, &c->tx_mr);
    c->tx = ring;
    c->tx_mr = mr;
    c->tx_size = size;
    c->tx_head = pos;
    /* Not before CONNECTED: opened() says WRITABLE then. */
    if (c->want_writable && c->opened) {
        c->want_writable = false;
        c->ev.writable = true;
        tp_ready_push(&c->base);
    }
    trdma_mark_dirty(c);
}

/* The receive ring and the queue pair, on the CM id. */
static int conn_resources(struct rdma_conn *c)
{
    struct rdma_ep *ep = REP(c->base.ep);
    struct ibv_qp_init_attr qa = {
        .send_cq = ep->cq, .recv_cq = ep->cq, .srq = ep->srq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = RDMA_SQ_DEPTH + 1, .max_send_sge = 1, .max_recv_sge = 1,
                .max_inline_data = RDMA_MAX_INLINE},
    };
    int rc;

    c->rx_size = (uint64_t)1 << ring_log2(ep);
    /* With windows the ring itself grants nothing remote: the peer writes
     * through the window bound to this connection's QP. */
    rc = ring_alloc(ep, c->rx_size,
                    IBV_ACCESS_LOCAL_WRITE |
                        (ep->mw ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_WRITE),
                    &c->rx, &c->rx_mr);
    if (rc < 0)
        return rc;
    if (ep->mw) {
        c->ring_win = win_new(c, NULL, c->rx_mr, (uintptr_t)c->rx, c->rx_size,
                              IBV_ACCESS_REMOTE_WRITE);
        if (!c->ring_win)
            return TERN_ENOMEM;
        c->key_owed = true;
    }
    /* Some devices inline less than we ask: ask again for none. */
    if (ep->api->create_qp(c->id, ep->pd, &qa) != 0) {
        qa.cap.max_inline_data = 0;
        if (ep->api->create_qp(c->id, ep->pd, &qa) != 0)
            return TERN_ENOMEM;
    }
    c->qp = c->id->qp;
    c->qpn = c->qp->qp_num;
    c->max_inline = qa.cap.max_inline_data;
    qpn_add(c);
    return 0;
}

static struct rdma_conn_param conn_param(const struct rdma_ep *ep, const struct rdma_hello *h)
{
    return (struct rdma_conn_param){
        .private_data = h, .private_data_len = sizeof(*h),
        .responder_resources = ep->rd_atomic, .initiator_depth = ep->rd_atomic,
        .retry_count = 7, .rnr_retry_count = 7,    /* 7: retry a full SRQ for ever */
    };
}

static struct rdma_conn *conn_new(struct rdma_ep *ep, bool active)
{
    struct rdma_conn *c;

    /* Every connection sets aside the completion entry of its final
     * marker (trdma_conn_drain). */
    if (ep->base.nconns >= ep->base.cfg.max_conns || ep->cq_free <= 1)
        return NULL;
    c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->kind = OBJ_CONN;
    c->active = active;
    c->state = RC_DEAD;     /* until set_state */
    ep->cq_free--;
    tp_conn_add(&ep->base, &c->base);
    return c;
}

void trdma_conn_free(struct rdma_conn *c)
{
    struct rdma_ep *ep = REP(c->base.ep);

    if (c->id) {
        if (c->state == RC_OPEN || c->state == RC_ACCEPTING)
            ep->api->disconnect(c->id);     /* the peer hears of it */
        if (c->qp)
            ep->api->destroy_qp(c->id);
        ep->api->destroy_id(c->id);
    }
    if (c->qp)
        qpn_del(c);
    while (c->wins) {
        struct rdma_win *w = c->wins;

        c->wins = w->next;
        win_free(c, w);
    }
    c->ring_win = NULL;
    /* Completions of its work requests may still sit in the CQ: their
     * entries come back once it is seen empty. */
    ep->cq_deferred += (long)(c->sq_posted - c->sq_done) + !c->marker_posted;
    ring_free(ep, &c->rx, c->rx_size, &c->rx_mr);
    ring_free(ep, &c->tx, c->tx_size, &c->tx_mr);
    if (c->dirty)
        for (struct rdma_conn **pp = &ep->dirty; *pp; pp = &(*pp)->dirty_next)
            if (*pp == c) {
                *pp = c->dirty_next;
                break;
            }
    set_state(c, RC_DEAD);
    tp_conn_del(&c->base);
    free(c);
}

void trdma_conn_fail(struct rdma_conn *c, int status)
{
    struct rdma_ep *ep = REP(c->base.ep);

    if (c->state == RC_CLOSING || c->state == RC_DEAD)
        return;
    if (!c->active && !c->announced) {
        trdma_conn_free(c);      /* never reported: drop it quietly */
        return;
    }
    c->fail_status = status;
    tern_log(TERN_LOG_DEBUG, "rdma", "%s: closing: %s", c->peer, tern_strerror(status));
    if (c->state == RC_OPEN) {
        /* Tell the peer, move the QP to the error state, and let the
         * flushed work requests drain before CLOSED. */
        ep->api->disconnect(c->id);
        set_state(c, RC_CLOSING);
        trdma_conn_drain(c);
        return;
    }
    set_state(c, RC_DEAD);
    tp_conn_dead(&c->ev, status, c->active);
    tp_ready_push(&c->base);
}

void trdma_disconnect(struct tern_tp_conn *conn)
{
    trdma_conn_free(RCONN(conn));
}

const char *trdma_conn_peer(const struct tern_tp_conn *conn)
{
    return RCONN(conn)->peer;
}

static void opened(struct rdma_conn *c)
{
    set_state(c, RC_OPEN);
    c->opened = true;
    if (c->want_writable) {
        c->want_writable = false;
        c->ev.writable = true;
    }
    tp_ready_push(&c->base);
    trdma_mark_dirty(c);
}

void trdma_conn_usable(struct rdma_conn *c)
{
    if (!c->active || c->opened)
        return;
    c->ev.connected = true;
    opened(c);
}

void trdma_conn_established(struct rdma_conn *c)
{
    if (c->state == RC_ACCEPTING)
        opened(c);
}

/* ---- addresses ---- */

/* "host:port", with "soft:" in front for an endpoint on softverbs (its
 * peers must be on the same host). */
static int parse_addr(struct rdma_ep *ep, const char *addr, bool passive, struct addrinfo **ai)
{
    if (strncmp(addr, SOFT_PREFIX, strlen(SOFT_PREFIX)) == 0) {
        if (!ep->api->emulated)
            return TERN_EBADADDR;
        addr += strlen(SOFT_PREFIX);
    }
    return tp_addr_resolve(addr, passive, ai);
}

int trdma_listen(struct tern_tp_ep *base, const char *addr, char *bound, size_t bound_len)
{
    struct rdma_ep *ep = REP(base);
    struct rdma_listener *l;
    struct addrinfo *ai;
    char text[80];
    int rc = parse_addr(ep, addr, true, &ai);

    if (rc < 0)
        return rc;
    l = calloc(1, sizeof(*l));
    if (!l) {
        freeaddrinfo(ai);
        return TERN_ENOMEM;
    }
    l->kind = OBJ_LISTENER;
    if (ep->api->create_id(ep->cm, &l->id, l, RDMA_PS_TCP) != 0) {
        freeaddrinfo(ai);
        free(l);
        return TERN_ENOMEM;
    }
    rc = ep->api->bind_addr(l->id, ai->ai_addr) != 0 ? -errno : 0;
    freeaddrinfo(ai);
    if (rc == 0 && l->id->verbs && l->id->verbs != ep->dev.ctx)
        rc = TERN_EBADADDR;     /* an address of another device */
    if (rc == 0 && ep->api->listen(l->id, 128) != 0)
        rc = -errno;
    if (rc < 0) {
        ep->api->destroy_id(l->id);
        free(l);
        return rc == TERN_EADDRINUSE || rc == TERN_EBADADDR ? rc : TERN_EIO;
    }
    l->next = ep->listeners;
    ep->listeners = l;
    if (bound && bound_len) {
        tp_addr_text(&l->id->route.addr.src_addr, text, sizeof(text));
        snprintf(bound, bound_len, "%s%s", ep->api->emulated ? SOFT_PREFIX : "", text);
    }
    return 0;
}

void trdma_listeners_close(struct rdma_ep *ep)
{
    while (ep->listeners) {
        struct rdma_listener *l = ep->listeners;

        ep->listeners = l->next;
        ep->api->destroy_id(l->id);
        free(l);
    }
}

int trdma_connect(struct tern_tp_ep *base, const char *addr, struct tern_tp_conn **out)
{
    struct rdma_ep *ep = REP(base);
    struct rdma_conn *c;
    struct addrinfo *ai;
    int rc = parse_addr(ep, addr, false, &ai);

    if (rc < 0)
        return rc;
    c = conn_new(ep, true);
    if (!c) {
        freeaddrinfo(ai);
        return TERN_ENOBUFS;
    }
    tp_addr_text(ai->ai_addr, c->peer, sizeof(c->peer));
    /* Messages may be staged before the peer's ring is known: lay them
     * out for a ring like ours, and again if the peer's differs. */
    c->tx_size = (uint64_t)1 << ring_log2(ep);
    c->peer_max_msg = (uint32_t)ep->base.cfg.max_msg;
    rc = ring_alloc(ep, c->tx_size, IBV_ACCESS_LOCAL_WRITE, &c->tx, &c->tx_mr);
    if (rc == 0 && ep->api->create_id(ep->cm, &c->id, &c->kind, RDMA_PS_TCP) != 0)
        rc = TERN_ENOMEM;
    if (rc < 0) {
        freeaddrinfo(ai);
        trdma_conn_free(c);
        return rc;
    }
    set_state(c, RC_RESOLVING);
    if (ep->api->resolve_addr(c->id, NULL, ai->ai_addr, RESOLVE_MS) != 0)
        trdma_conn_fail(c, TERN_ECONNREFUSED);
    freeaddrinfo(ai);
    *out = &c->base;
    /* Take the set-up as far as it goes now (resolution is often done at
     * once), so that the request leaves without waiting for a poll. */
    trdma_cm_poll(ep);
    return 0;
}

/* ---- CM events ---- */

static void on_route(struct rdma_conn *c)
{
    struct rdma_ep *ep = REP(c->base.ep);
    struct rdma_hello h;
    struct rdma_conn_param p;

    if (conn_resources(c) < 0) {
        trdma_conn_fail(c, TERN_ENOMEM);
        return;
    }
    h = hello_of(c);
    p = conn_param(ep, &h);
    if (ep->api->connect(c->id, &p) != 0) {
        trdma_conn_fail(c, TERN_ECONNREFUSED);
        return;
    }
    set_state(c, RC_CONNECTING);
}

static void on_established(struct rdma_conn *c, const void *data, size_t len)
{
    struct rdma_hello h;

    if (!c->active) {
        trdma_conn_established(c);
        return;
    }
    if (c->state != RC_CONNECTING)
        return;
    if (!hello_parse(data, len, &h)) {
        /* Up at the CM level, so the peer must hear that we hang up. */
        set_state(c, RC_OPEN);
        trdma_conn_fail(c, TERN_EPROTO);
        return;
    }
    peer_ring_set(c, &h);
    /* Up, and our window's bind and key can go; the user hears CONNECTED
     * once the peer's key is here too (at once if its hello had it), so
     * that what it posts then leaves at the next flush. */
    set_state(c, RC_OPEN);
    trdma_mark_dirty(c);
    if (c->peer_keyed)
        trdma_conn_usable(c);
    if (((uint64_t)1 << h.ring_log2) != c->tx_size || h.max_msg < REP(c->base.ep)->base.cfg.max_msg) {
        c->relayout_log2 = h.ring_log2;
        if (!c->resv)
            trdma_conn_relayout(c);
    }
}

static void on_request(struct rdma_ep *ep, struct rdma_cm_id *id, const void *data, size_t len)
{
    struct rdma_hello h, mine;
    struct rdma_conn_param p;
    struct rdma_conn *c = NULL;
    const char *why;

    if (!hello_parse(data, len, &h)) {
        why = "bad hello";
    } else if (h.ring_log2 > ring_log2(ep) + 4 && h.ring_log2 > 26) {
        why = "ring too large";     /* we would mirror it: refuse the memory */
    } else {
        why = "out of connections";
        if (id->verbs == ep->dev.ctx)
            c = conn_new(ep, false);
        else
            why = "request on another device";
    }
    if (!c) {
        if (tern_log_allow(&refused_log))
            tern_log(TERN_LOG_WARN, "rdma", "refused a connection: %s", why);
        ep->api->reject(id, NULL, 0);
        ep->api->destroy_id(id);
        return;
    }
    c->id = id;
    id->context = &c->kind;
    tp_addr_text(&id->route.addr.dst_addr, c->peer, sizeof(c->peer));
    peer_ring_set(c, &h);
    c->tx_size = (uint64_t)1 << h.ring_log2;
    set_state(c, RC_ACCEPTING);
    if (conn_resources(c) < 0 ||
        ring_alloc(ep, c->tx_size, IBV_ACCESS_LOCAL_WRITE, &c->tx, &c->tx_mr) < 0) {
        ep->api->reject(id, NULL, 0);
        trdma_conn_free(c);
        return;
    }
    mine = hello_of(c);
    p = conn_param(ep, &mine);
    if (ep->api->accept(id, &p) != 0) {
        trdma_conn_free(c);
        return;
    }
    /* The user hears of it now; messages are staged until the peer is up
     * (its RTU, or its first record), since before that the NIC's retries
     * could run out while the connector has not yet taken our answer. */
    c->announced = true;
    c->ev.accepted = true;
    tp_ready_push(&c->base);
}

static void on_event(struct rdma_ep *ep, enum rdma_cm_event_type type, struct rdma_cm_id *id,
                     const void *data, size_t len)
{
    struct rdma_conn *c;

    if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
        on_request(ep, id, data, len);
        return;
    }
    if (!id->context || *(const enum rdma_obj_kind *)id->context != OBJ_CONN)
        return;
    c = (struct rdma_conn *)(void *)((char *)id->context - offsetof(struct rdma_conn, kind));
    switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (ep->api->resolve_route(id, RESOLVE_MS) != 0)
            trdma_conn_fail(c, TERN_ECONNREFUSED);
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        on_route(c);
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        on_established(c, data, len);
        break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
        trdma_conn_fail(c, c->opened ? TERN_ECONNRESET : TERN_ECONNREFUSED);
        break;
    case RDMA_CM_EVENT_UNREACHABLE:
        trdma_conn_fail(c, TERN_ETIMEDOUT);
        break;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        trdma_conn_fail(c, TERN_ECONNRESET);
        break;
    default:
        break;
    }
}

void trdma_cm_poll(struct rdma_ep *ep)
{
    struct rdma_cm_event *e;

    /* Each event is copied and acknowledged before it is handled, so that
     * handling may destroy its id. */
    while (ep->api->get_cm_event(ep->cm, &e) == 0) {
        uint8_t data[256];
        size_t len = e->param.conn.private_data_len;
        enum rdma_cm_event_type type = e->event;
        struct rdma_cm_id *id = e->id;

        if (len > sizeof(data))
            len = sizeof(data);
        if (len && e->param.conn.private_data)
            memcpy(data, e->param.conn.private_data, len);
        else
            len = 0;
        ep->api->ack_cm_event(e);
        on_event(ep, type, id, data, len);
    }
}
