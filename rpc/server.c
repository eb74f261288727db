/* The server side: handshake, dispatch to handlers, replies.
 *
 * A request is handled in place in the receive buffer and its reply is built
 * in the transport's send buffer. Only when the send path is full (a client
 * that does not read its replies) does a reply go to a heap "spill" buffer;
 * the session then holds further requests, unreleased, which stops the
 * transport from reading more of them: backpressure reaches the client
 * without the server dropping or reordering anything.
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rpc_internal.h"

#define HDR sizeof(struct rpc_hdr)

/* Send space for a reply. A connection that can no longer send (its peer
 * left: the ring says so, not "full") is marked: its session is dropped
 * at the next request instead of keeping replies and requests for a
 * WRITABLE that cannot come (which would also keep the views a closing
 * connection waits for). */
static int alloc_out(struct tern_session *s, size_t len, void **buf)
{
    int rc = tern_tp_msg_alloc(s->conn, len, buf);

    if (rc < 0 && rc != TERN_EAGAIN && !s->send_dead)
        s->send_dead = rc;
    return rc;
}

void *tern_reply_alloc(struct tern_req *r, size_t len)
{
    uint8_t *buf;
    int rc;

    /* The client said in its HELLO how large a reply it can take. */
    if (r->reply_taken || len > r->s->peer_max_msg)
        return NULL;
    r->reply_taken = true;
    r->reply_len = len;
    rc = alloc_out(r->s, HDR + len, (void **)&buf);
    if (rc == 0) {
        r->reply = buf + HDR;
        return r->reply;
    }
    r->spilled = malloc(sizeof(*r->spilled) + HDR + len);
    if (!r->spilled)
        return NULL;
    r->spilled->next = NULL;
    return r->spilled->data + HDR;
}

size_t tern_reply_max(const struct tern_req *r)
{
    size_t own = r->s->ep->cfg.max_msg;

    return r->s->peer_max_msg < own ? r->s->peer_max_msg : own;
}

void tern_reply_set_len(struct tern_req *r, size_t len)
{
    if (len < r->reply_len)
        r->reply_len = len;
}

uint64_t tern_req_deadline(const struct tern_req *r)
{
    /* Computed on demand: a fresh request arrived just now, and most
     * handlers never ask, so the common path reads no clock. */
    if (!r->hdr->budget_us)
        return 0;
    return (r->arrived ? r->arrived : tern_now_ns()) + (uint64_t)r->hdr->budget_us * 1000u;
}

uint16_t tern_req_service(const struct tern_req *r)
{
    return r->hdr->svc;
}

uint16_t tern_req_method(const struct tern_req *r)
{
    return r->hdr->method;
}

static void spill_push(struct tern_session *s, struct spill *sp, size_t len)
{
    sp->len = len;
    sp->next = NULL;
    *s->spill_tail = sp;
    s->spill_tail = &sp->next;
}

void tern_req_hold(struct tern_req *r)
{
    r->hold = true;
}

int tern_rpc_add_hold_hook(struct tern_rpc_ep *ep, int (*fn)(void *arg), void *arg)
{
    if (!ep || !fn)
        return TERN_EINVAL;
    if (ep->n_hooks == RPC_HOLD_HOOKS)
        return TERN_ENOSPC;
    ep->hooks[ep->n_hooks].fn = fn;
    ep->hooks[ep->n_hooks++].arg = arg;
    return 0;
}

void tern_rpc_remove_hold_hook(struct tern_rpc_ep *ep, int (*fn)(void *arg), void *arg)
{
    for (unsigned i = 0; ep && i < ep->n_hooks; i++)
        if (ep->hooks[i].fn == fn && ep->hooks[i].arg == arg) {
            ep->hooks[i] = ep->hooks[--ep->n_hooks];
            return;
        }
}

/* Every hook, once: the first failure is the result (the others still
 * run: each service makes what it can durable). */
static int run_hooks(struct tern_rpc_ep *ep)
{
    int rc = 0;

    for (unsigned i = 0; i < ep->n_hooks; i++) {
        int r = ep->hooks[i].fn(ep->hooks[i].arg);

        if (r < 0 && rc == 0)
            rc = r;
    }
    return rc;
}

/* Put a built reply on hold: header and payload are copied into the
 * endpoint's held buffer (grown, never shrunk: no allocation per reply once
 * warm) and sent by rpc_release_held. false if there is no memory for it
 * (the reply then goes now). */
static bool hold_reply(struct tern_session *s, const struct rpc_hdr *h, const void *body,
                       size_t len)
{
    struct tern_rpc_ep *ep = s->ep;

    if (ep->n_held == ep->cap_held) {
        unsigned cap = ep->cap_held ? 2 * ep->cap_held : 64;
        struct rpc_held *n = realloc(ep->held, cap * sizeof(*n));

        if (!n)
            return false;
        ep->held = n;
        ep->cap_held = cap;
    }
    if (ep->held_len + len > ep->held_cap) {
        size_t cap = ep->held_cap ? ep->held_cap : 64 * 1024;
        uint8_t *n;

        while (cap < ep->held_len + len)
            cap *= 2;
        n = realloc(ep->held_buf, cap);
        if (!n)
            return false;
        ep->held_buf = n;
        ep->held_cap = cap;
    }
    if (len)
        memcpy(ep->held_buf + ep->held_len, body, len);
    ep->held[ep->n_held++] = (struct rpc_held){.s = s, .h = *h, .off = ep->held_len, .len = len};
    ep->held_len += len;
    return true;
}

/* Send the reply of `r` with `status`. */
static void send_reply(struct tern_session *s, struct tern_req *r, int status)
{
    struct rpc_hdr h = {.type = RPC_RESP, .version = RPC_VERSION, .svc = r->hdr->svc,
                        .method = r->hdr->method, .status = status,
                        .req_id = r->hdr->req_id};
    size_t body = status == 0 ? r->reply_len : 0;
    uint8_t *buf;

    if (status < 0 || !r->reply_taken) {
        /* Drop any half-built reply; an error carries no payload. */
        if (r->reply)
            tern_tp_msg_abort(s->conn, r->reply - HDR);
        free(r->spilled);
        r->reply = NULL;
        r->spilled = NULL;
        if (alloc_out(s, HDR, (void **)&buf) == 0) {
            r->reply = buf + HDR;
        } else {
            r->spilled = malloc(sizeof(*r->spilled) + HDR);
            if (!r->spilled) {
                tern_log(TERN_LOG_ERROR, "rpc", "out of memory: reply to %s lost",
                         tern_tp_conn_peer(s->conn));
                return;
            }
        }
        body = 0;
    }
    /* Gated: it waits for its ticket, however many polls that takes. */
    if (r->gate) {
        const void *payload = r->reply ? (const void *)r->reply
                              : r->spilled ? (const void *)(r->spilled->data + HDR) : NULL;
        bool kept = rpc_gate_hold(r->gate, s, &h, payload, payload ? body : 0, r->ticket);

        if (r->reply)
            tern_tp_msg_abort(s->conn, r->reply - HDR);
        free(r->spilled);
        if (!kept) {
            /* Never early: a gated reply may promise what is not yet true. */
            h.status = TERN_ENOMEM;
            rpc_emit(s, &h, NULL, 0);
        }
        return;
    }
    /* Held: this reply, and every later one of the poll (they may show
     * what the held ones wrote), wait for the hook. */
    if (s->ep->n_hooks && (r->hold || s->ep->n_held)) {
        const void *payload = r->reply ? (const void *)r->reply
                              : r->spilled ? (const void *)(r->spilled->data + HDR) : NULL;

        if (hold_reply(s, &h, payload, payload ? body : 0)) {
            if (r->reply)
                tern_tp_msg_abort(s->conn, r->reply - HDR);
            free(r->spilled);
            return;
        }
        /* No memory to hold it: the hook runs now instead, for it alone. */
        if (run_hooks(s->ep) < 0) {
            if (r->reply)
                tern_tp_msg_abort(s->conn, r->reply - HDR);
            free(r->spilled);
            r->reply = NULL;
            r->spilled = NULL;
            h.status = TERN_EIO;
            rpc_emit(s, &h, NULL, 0);
            return;
        }
    }
    if (s->replay)
        rpc_replay_add(s->replay, &h, status,
                       r->reply ? (const void *)r->reply
                                : r->spilled ? (const void *)(r->spilled->data + HDR) : NULL,
                       r->reply || r->spilled ? body : 0);
    if (s->drop_after_reply) {
        /* Test hook: the reply is remembered but lost with the session. */
        if (r->reply)
            tern_tp_msg_abort(s->conn, r->reply - HDR);
        free(r->spilled);
        rpc_session_free(s);
        return;
    }
    if (r->reply) {
        memcpy(r->reply - HDR, &h, HDR);
        tern_tp_msg_post(s->conn, r->reply - HDR, HDR + body);
    } else if (r->spilled) {
        memcpy(r->spilled->data, &h, HDR);
        spill_push(s, r->spilled, HDR + body);
    }
}

void rpc_emit(struct tern_session *s, struct rpc_hdr *h, const void *body, size_t len)
{
    uint8_t *buf;

    if (h->status < 0)
        len = 0;
    if (s->replay)
        rpc_replay_add(s->replay, h, h->status, body, len);
    if (alloc_out(s, HDR + len, (void **)&buf) == 0) {
        memcpy(buf, h, HDR);
        if (len)
            memcpy(buf + HDR, body, len);
        tern_tp_msg_post(s->conn, buf, HDR + len);
        return;
    }
    struct spill *sp = malloc(sizeof(*sp) + HDR + len);

    if (!sp) {
        tern_log(TERN_LOG_ERROR, "rpc", "out of memory: reply to %s lost",
                 tern_tp_conn_peer(s->conn));
        return;
    }
    memcpy(sp->data, h, HDR);
    if (len)
        memcpy(sp->data + HDR, body, len);
    spill_push(s, sp, HDR + len);
}

void rpc_release_held(struct tern_rpc_ep *ep)
{
    int rc;

    if (!ep->n_held)
        return;
    /* Once for the whole poll: a service's group commit. If it fails,
     * every held reply says so instead of what it said. */
    rc = run_hooks(ep);
    for (unsigned i = 0; i < ep->n_held; i++) {
        struct rpc_held *e = &ep->held[i];

        if (!e->s)
            continue;
        if (rc < 0)
            e->h.status = TERN_EIO;
        rpc_emit(e->s, &e->h, ep->held_buf + e->off, e->len);
    }
    ep->n_held = 0;
    ep->held_len = 0;
}

void rpc_forget_held(struct tern_session *s)
{
    rpc_gate_forget(s);
    for (unsigned i = 0; i < s->ep->n_held; i++)
        if (s->ep->held[i].s == s)
            s->ep->held[i].s = NULL;
}

void rpc_test_drop(struct tern_req *req)
{
    req->s->drop_after_reply = true;
}

/* A call re-sent after a fabric failure that already ran: answer it again
 * from the replay cache, or with TERN_ECONNRESET if only its id was kept
 * (it ran; its reply was lost with the connection). */
static void send_replayed(struct tern_session *s, const struct rpc_hdr *req,
                          const struct rpc_replay_ent *e)
{
    struct rpc_hdr h = {.type = RPC_RESP, .version = RPC_VERSION, .svc = req->svc,
                        .method = req->method, .status = e ? e->status : TERN_ECONNRESET,
                        .req_id = req->req_id};
    size_t len = e && e->status == 0 ? e->len : 0;
    uint8_t *buf;

    if (alloc_out(s, HDR + len, (void **)&buf) == 0) {
        memcpy(buf, &h, HDR);
        if (len)
            memcpy(buf + HDR, e->buf, len);
        tern_tp_msg_post(s->conn, buf, HDR + len);
        return;
    }
    struct spill *sp = malloc(sizeof(*sp) + HDR + len);

    if (!sp)
        return;
    memcpy(sp->data, &h, HDR);
    if (len)
        memcpy(sp->data + HDR, e->buf, len);
    spill_push(s, sp, HDR + len);
}

static void serve(struct tern_session *s, const void *view, size_t len, uint64_t arrived)
{
    /* The header is copied out before it is checked: on the window fabrics
     * the view is memory the client can still write. */
    struct rpc_hdr hc;
    const struct rpc_hdr *h = &hc;

    memcpy(&hc, view, sizeof(hc));
    const struct rpc_service *rs = rpc_service_find(s->ep, h->svc);
    /* The budget counts from when the request was read off the fabric
     * (`arrived` is set for requests that waited in the session's queue). */
    struct tern_req r = {.s = s, .hdr = h, .arrived = arrived};
    const struct rpc_replay_ent *seen;
    int status;

    /* Only a call re-sent after a failover can have run already; after the
     * first one, an original still queued on the dead path can arrive after
     * its copy, so from then on every call of the token is checked. */
    if (s->replay && ((h->flags & RPC_F_RESENT) || s->replay->failed_over)) {
        s->replay->failed_over = true;
        if (rpc_replay_find(s->replay, h, &seen)) {
            send_replayed(s, h, seen);
            return;
        }
    }

    if (!rs)
        status = TERN_ENOSERVICE;
    else if (h->method >= rs->n_slots || !rs->by_method[h->method])
        status = TERN_ENOMETHOD;
    else if (arrived && h->budget_us && tern_now_ns() > tern_req_deadline(&r))
        status = TERN_ETIMEDOUT;    /* it waited, and its caller gave up */
    else
        status = rs->by_method[h->method](&r, (const uint8_t *)view + HDR, len - HDR,
                                          rs->svc->ctx);
    if (status > 0) {
        tern_log(TERN_LOG_WARN, "rpc", "handler %u.%u returned %d; replying EHANDLER",
                 h->svc, h->method, status);
        status = TERN_EHANDLER;
    }
    send_reply(s, &r, status);
}

static bool stalled(const struct tern_session *s)
{
    return s->spill_head || s->n_deferred;
}

static bool defer(struct tern_session *s, const void *view, size_t len)
{
    if (s->n_deferred == s->cap_deferred) {
        unsigned cap = s->cap_deferred ? 2 * s->cap_deferred : 16;
        struct deferred *d = realloc(s->deferred, cap * sizeof(*d));

        if (!d)
            return false;
        s->deferred = d;
        s->cap_deferred = cap;
    }
    s->deferred[s->n_deferred++] = (struct deferred){view, len, tern_now_ns()};
    return true;
}

void rpc_server_refuse(struct tern_session *s, int status, const char *why)
{
    struct rpc_hdr h = {.type = RPC_REFUSE, .version = RPC_VERSION, .status = status};
    size_t n = strlen(why);
    uint8_t *buf;

    rpc_auth_refused(s, why);
    if (tern_tp_msg_alloc(s->conn, HDR + n, (void **)&buf) == 0) {
        memcpy(buf, &h, HDR);
        memcpy(buf + HDR, why, n);
        tern_tp_msg_post(s->conn, buf, HDR + n);
        tern_tp_flush(tern_tp_conn_ep(s->conn));
    }
    s->state = SESS_DEAD;
    rpc_session_free(s);
}

/* With a cluster key: the key of this handshake (the key, or for a further
 * path of an authenticated session its secret), a nonce, and the proof of
 * this side. The client's proof comes in RPC_AUTH. */
static int auth_begin(struct tern_session *s, uint64_t token, const struct rpc_auth_hello *ah,
                      struct rpc_auth_ack *out)
{
    struct tern_rpc_ep *ep = s->ep;
    struct rpc_auth_state *a = calloc(1, sizeof(*a));

    if (!a)
        return TERN_ENOMEM;
    memcpy(a->nonce_c, ah->nonce, RPC_AUTH_NONCE);
    if (s->replay && s->replay->has_secret) {
        memcpy(a->key, s->replay->secret, RPC_AUTH_MAC);
        a->key_len = RPC_AUTH_MAC;
    } else {
        memcpy(a->key, ep->key, ep->key_len);
        a->key_len = ep->key_len;
        a->first = true;
    }
    if (rpc_auth_nonce(a->nonce_s) < 0 ||
        rpc_auth_mac(a->key, a->key_len, "server", token, a->nonce_c, a->nonce_s, out->proof) < 0) {
        explicit_bzero(a, sizeof(*a));
        free(a);
        return TERN_EIO;
    }
    memcpy(out->nonce, a->nonce_s, RPC_AUTH_NONCE);
    s->auth = a;
    return 0;
}

static void on_auth(struct tern_session *s, const void *view, size_t len)
{
    struct rpc_auth_state *a = s->auth;
    struct rpc_auth_proof p;
    uint8_t want[RPC_AUTH_MAC];

    if (s->state != SESS_AUTH || !a || len != HDR + sizeof(p)) {
        rpc_bad_frame(s, "unexpected AUTH");
        return;
    }
    memcpy(&p, (const uint8_t *)view + HDR, sizeof(p));
    if (rpc_auth_mac(a->key, a->key_len, "client", s->token, a->nonce_c, a->nonce_s, want) < 0 ||
        !rpc_auth_equal(want, p.proof)) {
        rpc_server_refuse(s, TERN_EAUTH, a->first ? "wrong cluster key"
                                                  : "wrong session secret for its token");
        return;
    }
    /* The session's first path: its secret binds the token from now on. */
    if (a->first && s->replay && !s->replay->has_secret &&
        rpc_auth_mac(a->key, a->key_len, "session", s->token, a->nonce_c, a->nonce_s,
                     s->replay->secret) == 0)
        s->replay->has_secret = true;
    explicit_bzero(a, sizeof(*a));
    free(a);
    s->auth = NULL;
    s->state = SESS_OPEN;
    tern_tp_conn_open_rma(s->conn);
}

static void on_hello(struct tern_session *s, const void *view, size_t len)
{
    struct tern_rpc_ep *ep = s->ep;
    struct rpc_hdr h = {.type = RPC_HELLO_ACK, .version = RPC_VERSION};
    struct rpc_hello hello, ack = {.magic = RPC_MAGIC, .max_msg = ep->cfg.max_msg};
    struct rpc_auth_hello ah;
    struct rpc_auth_ack aa;
    bool with_auth = len == HDR + sizeof(hello) + sizeof(ah);
    size_t ads, extra = 0;
    uint8_t *buf;

    if (s->state != SESS_CONNECTING || (len != HDR + sizeof(hello) && !with_auth)) {
        rpc_bad_frame(s, "malformed or repeated HELLO");
        return;
    }
    memcpy(&hello, (const uint8_t *)view + HDR, sizeof(hello));
    if (hello.magic != RPC_MAGIC || hello.credits == 0 || hello.max_msg == 0) {
        rpc_bad_frame(s, "HELLO with a bad magic, zero credits or zero max_msg");
        return;
    }
    if (ep->key_len && !with_auth) {
        rpc_server_refuse(s, TERN_EAUTH, "no cluster key: this node takes only peers that "
                                         "hold it");
        return;
    }
    if (!ep->key_len && ep->cfg.local_only && !tern_tp_conn_local(s->conn)) {
        rpc_server_refuse(s, TERN_EACCES, "not a process of this host, and this node has no "
                                          "cluster key (protected mode)");
        return;
    }
    if (hello.max_msg < s->peer_max_msg)
        s->peer_max_msg = hello.max_msg;
    /* A client that may fail over: share its replay cache across paths
     * (with a key, only a path that proves the session's secret). */
    if (hello.token && !s->replay) {
        s->token = hello.token;
        s->replay = rpc_replay_get(ep, hello.token);
    }
    if (ep->key_len) {
        memcpy(&ah, (const uint8_t *)view + HDR + sizeof(hello), sizeof(ah));
        if (auth_begin(s, hello.token, &ah, &aa) < 0) {
            rpc_bad_frame(s, "no memory or randomness for the handshake");
            return;
        }
        ack.token = RPC_ACK_AUTH;
        extra = sizeof(aa);
    }
    ack.credits = hello.credits < ep->cfg.credits ? hello.credits : ep->cfg.credits;
    /* The answer carries the other fabrics we listen on, for auto://. */
    ads = strlen(ep->ads) + 1;
    if (tern_tp_msg_alloc(s->conn, HDR + sizeof(ack) + extra + ads, (void **)&buf) < 0) {
        rpc_bad_frame(s, "no room to answer HELLO");
        return;
    }
    memcpy(buf, &h, HDR);
    memcpy(buf + HDR, &ack, sizeof(ack));
    if (extra)
        memcpy(buf + HDR + sizeof(ack), &aa, sizeof(aa));
    memcpy(buf + HDR + sizeof(ack) + extra, ep->ads, ads);
    tern_tp_msg_post(s->conn, buf, HDR + sizeof(ack) + extra + ads);
    s->state = ep->key_len ? SESS_AUTH : SESS_OPEN;
    if (!ep->key_len)                /* protected mode: a process of this host */
        tern_tp_conn_open_rma(s->conn);
}

bool rpc_server_recv(struct tern_session *s, const void *view, size_t len)
{
    const struct rpc_hdr *h = view;

    switch (h->type) {
    case RPC_HELLO:
        on_hello(s, view, len);
        return false;
    case RPC_AUTH:
        on_auth(s, view, len);
        return false;
    case RPC_REQ:
        if (s->state != SESS_OPEN) {
            rpc_bad_frame(s, s->state == SESS_AUTH ? "request before AUTH"
                                                   : "request before HELLO");
            return false;
        }
        if (!s->send_dead) {
            if (stalled(s) && defer(s, view, len))
                return true;
            serve(s, view, len, 0);
        }
        if (s->send_dead) {
            tern_log(TERN_LOG_DEBUG, "rpc", "client %s: replies cannot go (%s); closing",
                     tern_tp_conn_peer(s->conn), tern_strerror(s->send_dead));
            rpc_session_free(s);
        }
        return false;
    default:
        rpc_bad_frame(s, "unexpected message type from client");
        return false;
    }
}

void rpc_server_writable(struct tern_session *s)
{
    unsigned done = 0;

    while (s->spill_head) {
        struct spill *sp = s->spill_head;

        if (tern_tp_msg_send(s->conn, sp->data, sp->len) < 0)
            return;     /* still full; another WRITABLE will come */
        s->spill_head = sp->next;
        if (!s->spill_head)
            s->spill_tail = &s->spill_head;
        free(sp);
    }
    /* Serve held requests in arrival order until the send path fills again. */
    while (done < s->n_deferred && !s->spill_head && !s->zombie) {
        struct deferred *d = &s->deferred[done++];

        serve(s, d->view, d->len, d->arrived);
        tern_tp_msg_release(s->conn, d->view);
    }
    /* A session that never held a request back has no array to move. */
    if (!done)
        return;
    memmove(s->deferred, s->deferred + done, (s->n_deferred - done) * sizeof(*s->deferred));
    s->n_deferred -= done;
}

void rpc_server_drop(struct tern_session *s)
{
    while (s->spill_head) {
        struct spill *sp = s->spill_head;

        s->spill_head = sp->next;
        free(sp);
    }
    s->spill_tail = &s->spill_head;
    free(s->deferred);
    s->deferred = NULL;
    s->n_deferred = s->cap_deferred = 0;
}
