/* The client side: sessions, call slots, credits, deadlines, cancellation.
 *
 * Calls live in a fixed slot table allocated with the endpoint, so starting
 * and completing a call allocates nothing. A call id is the slot index plus a
 * generation, so a late reply to a reused slot is recognised and dropped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <string.h>

#include "log.h"
#include "rpc_internal.h"

#define SLOT(id) ((uint32_t)(id))
#define GEN(id) ((uint32_t)((id) >> 32))

/* now + timeout, saturating: a huge timeout means "never", not "at once". */
static uint64_t deadline_after(uint64_t timeout_ns)
{
    uint64_t now = tern_now_ns();

    return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

int rpc_calls_init(struct tern_rpc_ep *ep)
{
    unsigned n = ep->cfg.max_calls;

    ep->calls = calloc(n, sizeof(*ep->calls));
    ep->free_slots = calloc(n, sizeof(*ep->free_slots));
    if (!ep->calls || !ep->free_slots) {
        free(ep->calls);
        free(ep->free_slots);
        return TERN_ENOMEM;
    }
    for (unsigned i = 0; i < n; i++) {
        ep->calls[i].id = (1ull << 32) | i;   /* generation 1: no id is 0 */
        ep->free_slots[i] = n - 1 - i;  /* hand out low slots first */
    }
    ep->n_free = n;
    return 0;
}

unsigned tern_rpc_calls_in_flight(const struct tern_rpc_ep *ep)
{
    return ep->cfg.max_calls - ep->n_free;
}

static void list_push(struct call_list *l, struct rpc_call *c)
{
    c->next = NULL;
    c->prev = l->tail;
    if (l->tail)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
    l->n++;
}

static void list_del(struct call_list *l, struct rpc_call *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    l->n--;
}

static struct call_list *list_of(struct rpc_call *c)
{
    return c->state == CALL_QUEUED ? &c->s->queued : &c->s->sent;
}

/* Take the call off its session and give its slot back; returns what the
 * continuation needs. The generation bump makes the old id stale. */
static void call_release(struct tern_rpc_ep *ep, struct rpc_call *c)
{
    list_del(list_of(c), c);
    if (c->timeout)
        ep->n_deadlines--;
    c->timeout = 0;
    c->deadline = 0;
    c->state = CALL_FREE;
    c->id = ((uint64_t)(GEN(c->id) + 1) << 32) | SLOT(c->id);
    ep->free_slots[ep->n_free++] = SLOT(c->id);
}

static void call_finish(struct tern_rpc_ep *ep, struct rpc_call *c, int status,
                        const void *reply, size_t len)
{
    tern_cont_fn cont = c->cont;
    void *arg = c->arg;

    if (c->s) {
        c->s->n_calls++;
        c->s->n_errors += status < 0;
    }
    call_release(ep, c);
    if (cont)
        cont(arg, status, reply, len);
}

/* Put the call on the wire. TERN_EAGAIN leaves it queued. */
static int call_send(struct tern_session *s, struct rpc_call *c, uint64_t *now)
{
    struct rpc_hdr h = {
        .type = RPC_REQ, .version = RPC_VERSION, .svc = c->svc, .method = c->method,
        .flags = c->resent ? RPC_F_RESENT : 0, .req_id = c->id,
    };
    uint8_t *buf;
    int rc;

    if (c->timeout) {
        uint64_t left = c->timeout / 1000u;

        if (c->deadline) {
            if (!*now)  /* read the clock once per pump, and only if needed */
                *now = tern_now_ns();
            left = c->deadline > *now ? (c->deadline - *now) / 1000u : 0;
        }
        h.budget_us = left ? (left > UINT32_MAX ? UINT32_MAX : (uint32_t)left) : 1;
    }
    rc = tern_tp_msg_alloc(s->conn, sizeof(h) + c->len, (void **)&buf);
    if (rc < 0)
        return rc;
    memcpy(buf, &h, sizeof(h));
    for (size_t i = 0, off = sizeof(h); i < c->niov; off += c->iov[i].iov_len, i++)
        if (c->iov[i].iov_len)      /* an empty piece may have no buffer */
            memcpy(buf + off, c->iov[i].iov_base, c->iov[i].iov_len);
    s->bytes_out += sizeof(h) + c->len;
    return tern_tp_msg_post(s->conn, buf, sizeof(h) + c->len);
}

/* Send queued calls while credits and send space last. Never runs a
 * continuation: it is called from tern_call, where the caller's stack may
 * not expect one. A call that cannot be sent stays queued; if the
 * connection is gone, its CLOSED event fails the call inside a poll.
 * `now` is the caller's clock reading if it has one (0: read if needed). */
static void pump_at(struct tern_session *s, uint64_t now)
{
    while (s->state == SESS_OPEN && !s->blocked && s->queued.head &&
           s->sent.n < s->credits) {
        struct rpc_call *c = s->queued.head;

        if (call_send(s, c, &now) < 0) {
            s->blocked = true;      /* EAGAIN: WRITABLE unblocks; else CLOSED */
            break;
        }
        list_del(&s->queued, c);
        c->state = CALL_SENT;
        list_push(&s->sent, c);
    }
    /* Inside a poll the flush at its end sends the batch; outside, now. */
    if (!s->ep->polling)
        tern_tp_flush(tern_tp_conn_ep(s->conn));
}

static void pump(struct tern_session *s)
{
    pump_at(s, 0);
}

int tern_call(struct tern_session *s, uint16_t svc, uint16_t method, const void *req,
              size_t len, uint64_t timeout_ns, tern_cont_fn cont, void *arg,
              uint64_t *call_id)
{
    struct iovec iov = {.iov_base = (void *)req, .iov_len = len};

    if (!req && len)
        return TERN_EINVAL;
    return tern_callv(s, svc, method, &iov, len ? 1 : 0, timeout_ns, cont, arg, call_id);
}

int tern_callv(struct tern_session *s, uint16_t svc, uint16_t method, const struct iovec *iov,
               unsigned iovcnt, uint64_t timeout_ns, tern_cont_fn cont, void *arg,
               uint64_t *call_id)
{
    struct tern_rpc_ep *ep;
    struct rpc_call *c;
    uint64_t now;
    size_t len = 0;

    if (!s || iovcnt > TERN_CALL_IOV_MAX || (iovcnt && !iov))
        return TERN_EINVAL;
    for (unsigned i = 0; i < iovcnt; i++) {
        if (!iov[i].iov_base && iov[i].iov_len)
            return TERN_EINVAL;
        /* Summed against the limit piece by piece, so that no set of
         * lengths can wrap around to a small total. */
        if (iov[i].iov_len > SIZE_MAX - len)
            return TERN_EMSGSIZE;
        len += iov[i].iov_len;
    }
    ep = s->ep;
    if (s->state == SESS_DEAD)
        return s->status ? s->status : TERN_ENOTCONN;
    if (len > ep->cfg.max_msg || len > s->peer_max_msg)
        return TERN_EMSGSIZE;
    if (!ep->n_free)
        return TERN_ENOBUFS;
    c = &ep->calls[ep->free_slots[--ep->n_free]];
    c->state = CALL_QUEUED;
    c->s = s;
    c->resent = false;
    for (unsigned i = 0; i < iovcnt; i++)
        c->iov[i] = iov[i];
    c->niov = (uint8_t)iovcnt;
    c->len = len;
    c->svc = svc;
    c->method = method;
    c->cont = cont;
    c->arg = arg;
    c->timeout = timeout_ns;
    c->deadline = 0;
    now = 0;
    if (timeout_ns)
        ep->n_deadlines++;
    if (call_id)
        *call_id = c->id;
    /* The common case, straight onto the wire: nothing queued ahead of
     * it, a credit free and room to send. Its budget is the whole timeout,
     * and its deadline is stamped at the poll loop's next clock reading
     * (at most 64 polls away): a clock read costs as much as a tenth of a
     * round trip on shm, and every call would pay it. */
    if (!s->queued.head && s->state == SESS_OPEN && !s->blocked && s->sent.n < s->credits &&
        call_send(s, c, &now) == 0) {
        c->state = CALL_SENT;
        list_push(&s->sent, c);
        if (timeout_ns) {
            if (ep->n_unstamped == RPC_UNSTAMPED)
                rpc_stamp_calls(ep, tern_now_ns());
            ep->unstamped[ep->n_unstamped++] = c->id;
        }
        if (!ep->polling)
            tern_tp_flush(tern_tp_conn_ep(s->conn));
        return 0;
    }
    /* A call that waits in the queue counts its time from now. */
    if (timeout_ns) {
        now = tern_now_ns();
        c->deadline = timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
    }
    list_push(&s->queued, c);
    pump_at(s, now);
    return 0;
}

void rpc_stamp_calls(struct tern_rpc_ep *ep, uint64_t now)
{
    for (unsigned i = 0; i < ep->n_unstamped; i++) {
        struct rpc_call *c = &ep->calls[SLOT(ep->unstamped[i])];

        /* Skip calls that completed (their slot moved on) meanwhile. */
        if (c->state != CALL_FREE && c->id == ep->unstamped[i] && !c->deadline)
            c->deadline = c->timeout > UINT64_MAX - now ? UINT64_MAX : now + c->timeout;
    }
    ep->n_unstamped = 0;
}

int tern_call_cancel(struct tern_session *s_in, uint64_t call_id)
{
    struct tern_rpc_ep *ep;
    struct rpc_call *c;

    if (!s_in)
        return TERN_EINVAL;
    ep = s_in->ep;
    if (SLOT(call_id) >= ep->cfg.max_calls)
        return TERN_ENOENT;
    c = &ep->calls[SLOT(call_id)];
    /* An id names a call of the session it was started on, and no other. */
    if (c->state == CALL_FREE || c->id != call_id || c->s != s_in)
        return TERN_ENOENT;
    /* The server may still run it; its reply will carry a stale id and be
     * dropped. The credit comes back now so queued calls are not held up. */
    {
        struct tern_session *s = c->s;
        tern_cont_fn cont = c->cont;
        void *arg = c->arg;

        /* Pump before the continuation runs: it may close the session,
         * and outside a poll that frees it at once. */
        call_release(ep, c);
        pump(s);    /* the freed credit may let a queued call go */
        if (cont)
            cont(arg, TERN_ECANCELED, NULL, 0);
    }
    return 0;
}

/* Time out expired calls. Continuations may cancel other calls or close
 * sessions, so expired ids are collected first and each is finished only if
 * its slot still holds that same call. */
void rpc_expire_calls(struct tern_rpc_ep *ep, uint64_t now)
{
    enum { BATCH = 64 };
    uint64_t ids[BATCH];
    unsigned n;

    do {
        n = 0;
        for (struct tern_session *s = ep->sessions; s && n < BATCH; s = s->next) {
            struct call_list *lists[2] = {&s->sent, &s->queued};

            for (int l = 0; l < 2 && n < BATCH; l++)
                for (struct rpc_call *c = lists[l]->head; c && n < BATCH; c = c->next)
                    if (c->deadline && c->deadline <= now)
                        ids[n++] = c->id;
        }
        for (unsigned i = 0; i < n; i++) {
            struct rpc_call *c = &ep->calls[SLOT(ids[i])];

            if (c->state != CALL_FREE && c->id == ids[i])
                call_finish(ep, c, TERN_ETIMEDOUT, NULL, 0);
        }
    } while (n == BATCH);
    /* Expired calls gave credits back. */
    for (struct tern_session *s = ep->sessions; s; s = s->next)
        if (s->role == ROLE_CLIENT && s->queued.head)
            pump(s);
}

static void list_push_front(struct call_list *l, struct rpc_call *c)
{
    c->prev = NULL;
    c->next = l->head;
    if (l->head)
        l->head->prev = c;
    else
        l->tail = c;
    l->head = c;
    l->n++;
}

void rpc_client_requeue_sent(struct tern_session *s)
{
    /* Calls sent on the old path go again, first and in their order, with
     * their request ids: the server answers those it already ran from its
     * replay cache. */
    while (s->sent.tail) {
        struct rpc_call *c = s->sent.tail;

        list_del(&s->sent, c);
        c->state = CALL_QUEUED;
        c->resent = true;
        list_push_front(&s->queued, c);
    }
    s->blocked = false;
}

bool rpc_client_failover(struct tern_session *s, int status)
{
    struct tern_rpc_ep *ep = s->ep;
    struct tern_tp_conn *old = s->conn;

    if (!s->standby || s->state != SESS_OPEN)
        return false;
    tern_log(TERN_LOG_WARN, "rpc", "%s failed (%s); session moves to %s, re-sending %u calls",
             tern_tp_conn_peer(old), tern_strerror(status), tern_tp_conn_peer(s->standby),
             s->sent.n);
    s->conn = s->standby;
    s->standby = NULL;
    s->failovers++;
    /* The old connection goes after this poll: later events of the batch
     * may still name it, and find no session. */
    rpc_doom(ep, old);
    rpc_client_requeue_sent(s);
    if (s->paths)
        rpc_paths_failed_over(s);
    pump(s);
    /* Keys and pointers the user learned on the old path are stale now;
     * its one-sided operations are lost with it (the fabric normally
     * failed them before reporting the close). Last: their callbacks may
     * close the session. */
    s->epoch++;
    rpc_rma_fail(s, old, status);
    return true;
}

/* Fail every call of the session and mark it dead. */
void rpc_client_fail(struct tern_session *s, int status)
{
    if (s->state != SESS_DEAD) {
        if (s->state == SESS_OPEN)
            tern_log(TERN_LOG_WARN, "rpc", "session to %s lost: %s",
                     tern_tp_conn_peer(s->conn), tern_strerror(status));
        s->state = SESS_DEAD;
        s->status = status;
    }
    while (s->sent.head)
        call_finish(s->ep, s->sent.head, status, NULL, 0);
    while (s->queued.head)
        call_finish(s->ep, s->queued.head, status, NULL, 0);
    rpc_rma_fail(s, NULL, status);
}

void rpc_client_writable(struct tern_session *s)
{
    s->blocked = false;
    pump(s);
}

/* The server proved it holds our key (or the session's secret): prove we
 * do too, and keep the session's secret for its further paths. */
static int auth_answer(struct tern_session *s, const struct rpc_auth_ack *aa)
{
    struct rpc_auth_state *a = s->auth;
    struct rpc_hdr h = {.type = RPC_AUTH, .version = RPC_VERSION};
    struct rpc_auth_proof p;
    uint8_t want[RPC_AUTH_MAC];
    uint8_t *buf;

    memcpy(a->nonce_s, aa->nonce, RPC_AUTH_NONCE);
    if (rpc_auth_mac(a->key, a->key_len, "server", s->token, a->nonce_c, a->nonce_s, want) < 0)
        return TERN_EIO;
    if (!rpc_auth_equal(want, aa->proof))
        return TERN_EAUTH;
    if (rpc_auth_mac(a->key, a->key_len, "client", s->token, a->nonce_c, a->nonce_s,
                     p.proof) < 0)
        return TERN_EIO;
    if (a->first) {
        if (rpc_auth_mac(a->key, a->key_len, "session", s->token, a->nonce_c, a->nonce_s,
                         s->secret) < 0)
            return TERN_EIO;
    } else {
        memcpy(s->secret, a->key, RPC_AUTH_MAC);
    }
    s->has_secret = true;
    /* Before any request: the connection keeps the order. */
    if (tern_tp_msg_alloc(s->conn, sizeof(h) + sizeof(p), (void **)&buf) < 0)
        return TERN_ENOBUFS;
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &p, sizeof(p));
    tern_tp_msg_post(s->conn, buf, sizeof(h) + sizeof(p));
    explicit_bzero(a, sizeof(*a));
    free(a);
    s->auth = NULL;
    tern_tp_conn_open_rma(s->conn);  /* the server is who it must be */
    return 0;
}

static void on_hello_ack(struct tern_session *s, const void *body, size_t len)
{
    struct rpc_hello ack;
    struct rpc_auth_ack aa;
    size_t at = sizeof(ack);
    int rc;

    if (s->state != SESS_CONNECTING || len < sizeof(ack)) {
        rpc_bad_frame(s, "unexpected HELLO_ACK");
        return;
    }
    memcpy(&ack, body, sizeof(ack));
    if (ack.magic != RPC_MAGIC || ack.credits == 0 || ack.max_msg == 0) {
        rpc_bad_frame(s, "bad HELLO_ACK");
        return;
    }
    /* Both hold a key, or neither: a server that does not prove one is
     * not trusted with our calls, and one that asks for a proof we cannot
     * give has already refused us. */
    if (s->auth && !(ack.token & RPC_ACK_AUTH)) {
        tern_log(TERN_LOG_WARN, "rpc", "%s: the server holds no cluster key; not trusted",
                 tern_tp_conn_peer(s->conn));
        rpc_client_fail(s, TERN_EAUTH);
        return;
    }
    if (ack.token & RPC_ACK_AUTH) {
        if (!s->auth || len < at + sizeof(aa)) {
            rpc_client_fail(s, TERN_EAUTH);
            return;
        }
        memcpy(&aa, (const uint8_t *)body + at, sizeof(aa));
        at += sizeof(aa);
        if ((rc = auth_answer(s, &aa)) < 0) {
            tern_log(TERN_LOG_WARN, "rpc", "%s: %s", tern_tp_conn_peer(s->conn),
                     rc == TERN_EAUTH ? "the server's proof is wrong: it holds another key"
                                      : tern_strerror(rc));
            rpc_client_fail(s, rc);
            return;
        }
    }
    /* After the fixed part: the server's other fabrics, NUL-terminated. */
    if (len > at) {
        const char *ads = (const char *)body + at;
        size_t n = strnlen(ads, len - at);

        free(s->peer_ads);
        s->peer_ads = strndup(ads, n);
    }
    s->peer_max_msg = ack.max_msg < s->ep->cfg.max_msg ? ack.max_msg : s->ep->cfg.max_msg;
    s->credits = ack.credits < s->ep->cfg.credits ? ack.credits : s->ep->cfg.credits;
    s->state = SESS_OPEN;
    s->connect_by = 0;
    if (!s->ep->key_len)             /* the server we chose to call: no key to prove */
        tern_tp_conn_open_rma(s->conn);
    /* Opened without waiting from an auto:// URI: now that the server's
     * fabrics are known, the housekeeping tick dials the best of them. */
    if (s->auto_start) {
        if (rpc_paths_init(s, s->auto_start->boot, s->auto_start->policy,
                           s->auto_start->boot) < 0)
            tern_log(TERN_LOG_WARN, "rpc", "%s: stays on TCP (no memory for its paths)",
                     s->auto_start->boot);
        free(s->auto_start);
        s->auto_start = NULL;
    }
    pump(s);
}

/* The server said why it will not serve us, and closes. */
static void on_refuse(struct tern_session *s, const struct rpc_hdr *h, const void *body,
                      size_t len)
{
    int status = h->status < 0 ? h->status : TERN_ECONNREFUSED;
    const uint8_t *b = body;
    char why[201];
    size_t n = 0;

    /* Its words, printable ones only: a log line is not the peer's to shape. */
    for (size_t i = 0; i < len && n < sizeof(why) - 1; i++)
        why[n++] = b[i] >= 0x20 && b[i] < 0x7f ? (char)b[i] : '?';
    why[n] = 0;
    tern_log(TERN_LOG_WARN, "rpc", "%s refused us: %s", tern_tp_conn_peer(s->conn), why);
    rpc_client_fail(s, status);
}

void rpc_client_recv(struct tern_session *s, const struct rpc_hdr *h, const void *body,
                     size_t len)
{
    struct tern_rpc_ep *ep = s->ep;
    struct rpc_call *c;

    if (h->type == RPC_REFUSE) {
        on_refuse(s, h, body, len);
        return;
    }
    if (h->type == RPC_HELLO_ACK) {
        on_hello_ack(s, body, len);
        if (s->parent && s->state == SESS_OPEN)
            rpc_paths_dial_open(s);
        return;
    }
    s->bytes_in += sizeof(*h) + len;
    if (h->type != RPC_RESP || s->state != SESS_OPEN) {
        rpc_bad_frame(s, "unexpected message type from server");
        return;
    }
    if (h->status > 0) {
        rpc_bad_frame(s, "positive status in reply");
        return;
    }
    c = SLOT(h->req_id) < ep->cfg.max_calls ? &ep->calls[SLOT(h->req_id)] : NULL;
    /* A reply to a cancelled or timed-out call is dropped. */
    if (c && c->state == CALL_SENT && c->id == h->req_id && c->s == s)
        call_finish(ep, c, h->status, h->status ? NULL : body, h->status ? 0 : len);
    if (!s->zombie && !s->closing)
        pump(s);
}

/* ---- connect and close ---- */

static int connect_one(struct tern_rpc_ep *ep, const char *uri, uint64_t timeout_ns,
                       uint64_t token, const uint8_t *secret, struct tern_session **out);

/* auto://host:port: bootstrap over TCP, then move to the best fabric the
 * server advertised. Staying on TCP is never an error. */
static int connect_auto(struct tern_rpc_ep *ep, const char *hostport, const char *policy,
                        uint64_t timeout_ns, struct tern_session **out)
{
    struct tern_session *s, *better = NULL;
    char uri[256], boot[RPC_URI_MAX], cand[RPC_PATHS_MAX - 1][RPC_URI_MAX];
    int rc, n, k;

    uint64_t token = 0;

    /* The token names the session on every path, so that the server can
     * answer calls re-sent after a fabric failure from its replay cache. */
    while (!token)
        if (getrandom(&token, sizeof(token), 0) != sizeof(token))
            token = tern_now_ns() ^ (uint64_t)(uintptr_t)ep;
    if ((size_t)snprintf(boot, sizeof(boot), "tcp://%s", hostport) >= sizeof(boot))
        return TERN_EBADADDR;
    rc = connect_one(ep, boot, timeout_ns, token, NULL, &s);
    if (rc < 0)
        return rc;
    *out = s;
    n = rpc_paths_candidates(s->peer_ads, policy, cand, RPC_PATHS_MAX - 1);
    /* The best path that answers; the others are tried again later. */
    for (k = 0, rc = -1; k < n && rc < 0; k++) {
        memcpy(uri, cand[k], RPC_URI_MAX);
        rc = connect_one(ep, uri, timeout_ns, token, s->has_secret ? s->secret : NULL,
                         &better);
        if (rc < 0)
            tern_log(TERN_LOG_WARN, "rpc", "auto: %s failed (%s)", uri, tern_strerror(rc));
    }
    if (rc < 0) {
        if (rpc_paths_init(s, boot, policy, boot) == 0)
            for (unsigned i = 0; i + 1 < s->paths->n; i++)
                s->paths->cand[i].retry_at = tern_now_ns() + 200000000u;
        return 0;
    }
    tern_log(TERN_LOG_INFO, "rpc", "auto: %s chose %s", hostport, uri);
    /* Keep the TCP connection, idle, as the path to fail over to. */
    better->standby = s->conn;
    tern_tp_conn_set_user(s->conn, better);
    s->conn = NULL;
    free(better->peer_ads);
    better->peer_ads = s->peer_ads;
    s->peer_ads = NULL;
    if (s->has_secret && !better->has_secret) {
        memcpy(better->secret, s->secret, sizeof(better->secret));
        better->has_secret = true;
    }
    tern_rpc_disconnect(s);
    *out = better;
    /* Without its paths the session still works: it only cannot move back
     * after a failover. */
    rpc_paths_init(better, boot, policy, uri);
    return 0;
}

const char *tern_session_fabric(const struct tern_session *s)
{
    return tern_tp_fabric(tern_tp_conn_ep(s->conn));
}

uint32_t tern_session_caps(const struct tern_session *s)
{
    return tern_tp_caps(tern_tp_conn_ep(s->conn));
}

int tern_rpc_connect(struct tern_rpc_ep *ep, const char *uri, uint64_t timeout_ns,
                     struct tern_session **out)
{
    if (!out)
        return TERN_EINVAL;
    *out = NULL;
    if (uri && strncmp(uri, "auto://", 7) == 0)
        return connect_auto(ep, uri + 7,
                            ep->cfg.fabrics ? ep->cfg.fabrics : getenv("TERN_FABRICS"),
                            timeout_ns, out);
    return connect_one(ep, uri, timeout_ns, 0, NULL, out);
}

int tern_rpc_connect_start(struct tern_rpc_ep *ep, const char *uri, uint64_t timeout_ns,
                           struct tern_session **out)
{
    struct rpc_auto_start *a = NULL;
    struct tern_session *s;
    const char *policy;
    uint64_t token = 0;
    int rc;

    if (!ep || !uri || !out)
        return TERN_EINVAL;
    *out = NULL;
    if (strncmp(uri, "auto://", 7) == 0) {
        policy = ep->cfg.fabrics ? ep->cfg.fabrics : getenv("TERN_FABRICS");
        a = calloc(1, sizeof(*a));
        if (!a)
            return TERN_ENOMEM;
        if ((size_t)snprintf(a->boot, sizeof(a->boot), "tcp://%s", uri + 7) >= sizeof(a->boot)) {
            free(a);
            return TERN_EBADADDR;
        }
        snprintf(a->policy, sizeof(a->policy), "%s", policy ? policy : "");
        /* The token names the session on every path it will take. */
        while (!token)
            if (getrandom(&token, sizeof(token), 0) != sizeof(token))
                token = tern_now_ns() ^ (uint64_t)(uintptr_t)ep;
    }
    rc = rpc_connect_start(ep, a ? a->boot : uri, token, NULL, &s);
    if (rc < 0 || !s) {
        if (s)
            tern_rpc_disconnect(s);
        free(a);
        return rc < 0 ? rc : TERN_ENOMEM;
    }
    s->auto_start = a;
    s->connect_by = deadline_after(timeout_ns ? timeout_ns : 5000000000ull);
    *out = s;
    return 0;
}

int tern_rpc_connect_with(struct tern_rpc_ep *ep, const char *uri, const char *fabrics,
                          uint64_t timeout_ns, struct tern_session **out)
{
    if (!out || !fabrics)
        return TERN_EINVAL;
    *out = NULL;
    if (!uri || strncmp(uri, "auto://", 7) != 0)
        return TERN_EINVAL;
    return connect_auto(ep, uri + 7, fabrics, timeout_ns, out);
}

int tern_session_info(const struct tern_session *s, struct tern_session_info *out)
{
    struct tern_session_info i = {.size = sizeof(i)};
    size_t n;

    if (!s || !out || out->size == 0)
        return TERN_EINVAL;
    i.fabric = s->conn ? tern_session_fabric(s) : "none";
    i.peer = s->conn ? tern_tp_conn_peer(s->conn) : "";
    i.calls = s->n_calls;
    i.errors = s->n_errors;
    i.bytes_out = s->bytes_out;
    i.bytes_in = s->bytes_in;
    i.failovers = s->failovers;
    i.moves = s->moves;
    i.credits = s->credits;
    i.in_flight = s->sent.n;
    i.queued = s->queued.n;
    i.standby = s->standby != NULL;
    i.epoch = s->epoch;
    /* As much as the caller's struct holds (an older caller's is smaller). */
    n = out->size < sizeof(i) ? out->size : sizeof(i);
    i.size = (uint32_t)n;
    memcpy(out, &i, n);
    return 0;
}

int rpc_connect_start(struct tern_rpc_ep *ep, const char *uri, uint64_t token,
                      const uint8_t *secret, struct tern_session **out)
{
    struct rpc_hello hello = {.magic = RPC_MAGIC, .credits = ep->cfg.credits,
                              .max_msg = ep->cfg.max_msg, .token = token};
    struct rpc_hdr h = {.type = RPC_HELLO, .version = RPC_VERSION};
    struct tern_tp_conn *conn;
    struct tern_tp_ep *tp;
    struct tern_session *s;
    const char *addr;
    uint8_t *buf;
    size_t len;
    int rc;

    *out = NULL;
    rc = rpc_tp_for(ep, uri, &addr, &tp);
    if (rc < 0)
        return rc;
    rc = tern_tp_connect(tp, addr, &conn);
    if (rc < 0)
        return rc;
    s = rpc_session_new(ep, conn, ROLE_CLIENT);
    if (!s) {
        tern_tp_disconnect(conn);
        return TERN_ENOBUFS;
    }
    s->token = token;
    /* With a key: a nonce for the server to answer, and the key of this
     * handshake (the session's secret for a further path of it). */
    if (ep->key_len) {
        struct rpc_auth_state *a = calloc(1, sizeof(*a));

        if (!a || rpc_auth_nonce(a->nonce_c) < 0) {
            free(a);
            *out = s;
            return TERN_EIO;
        }
        if (secret) {
            memcpy(a->key, secret, RPC_AUTH_MAC);
            a->key_len = RPC_AUTH_MAC;
        } else {
            memcpy(a->key, ep->key, ep->key_len);
            a->key_len = ep->key_len;
            a->first = true;
        }
        s->auth = a;
    }
    len = sizeof(h) + sizeof(hello) + (s->auth ? sizeof(struct rpc_auth_hello) : 0);
    rc = tern_tp_msg_alloc(conn, len, (void **)&buf);
    if (rc == 0) {
        memcpy(buf, &h, sizeof(h));
        memcpy(buf + sizeof(h), &hello, sizeof(hello));
        if (s->auth)
            memcpy(buf + sizeof(h) + sizeof(hello), s->auth->nonce_c, RPC_AUTH_NONCE);
        rc = tern_tp_msg_post(conn, buf, len);
    }
    if (rc == 0)
        tern_tp_flush(tp);
    *out = s;
    return rc;
}

static int connect_one(struct tern_rpc_ep *ep, const char *uri, uint64_t timeout_ns,
                       uint64_t token, const uint8_t *secret, struct tern_session **out)
{
    struct tern_session *s;
    uint64_t end;
    int rc;

    if (!out)
        return TERN_EINVAL;
    *out = NULL;
    rc = rpc_connect_start(ep, uri, token, secret, &s);
    if (!s)
        return rc;
    end = deadline_after(timeout_ns ? timeout_ns : 5000000000ull);
    while (rc == 0 && s->state == SESS_CONNECTING) {
        tern_rpc_poll(ep);
        if (tern_now_ns() > end)
            rc = TERN_ETIMEDOUT;
    }
    if (rc == 0 && s->state == SESS_DEAD)
        rc = s->status ? s->status : TERN_ECONNRESET;
    if (rc < 0) {
        tern_rpc_disconnect(s);
        return rc;
    }
    *out = s;
    return 0;
}

void tern_rpc_disconnect(struct tern_session *s)
{
    /* A continuation run by this very close may close the session again. */
    if (!s || s->closing)
        return;
    s->closing = true;
    if (s->role == ROLE_CLIENT) {
        if (s->state != SESS_DEAD) {
            s->state = SESS_DEAD;
            s->status = TERN_ECANCELED;
        }
        rpc_client_fail(s, TERN_ECANCELED);
    }
    rpc_session_free(s);
}

int tern_session_status(const struct tern_session *s)
{
    if (s->state == SESS_DEAD)
        return s->status ? s->status : TERN_ENOTCONN;
    return s->state == SESS_OPEN ? 0 : TERN_EINPROGRESS;
}

unsigned tern_session_credits(const struct tern_session *s)
{
    return s->credits;
}

/* ---- synchronous wrapper ---- */

struct sync_wait {
    bool done;
    int status;
    void *buf;
    size_t cap, len;
};

static void sync_cont(void *arg, int status, const void *reply, size_t len)
{
    struct sync_wait *w = arg;

    w->done = true;
    w->status = status;
    w->len = len;
    if (status == 0 && len > w->cap)
        w->status = TERN_EMSGSIZE;
    else if (status == 0 && len)
        memcpy(w->buf, reply, len);
}

int tern_call_sync(struct tern_session *s, uint16_t svc, uint16_t method, const void *req,
                   size_t len, void *reply, size_t reply_cap, size_t *reply_len,
                   uint64_t timeout_ns)
{
    struct sync_wait w = {.buf = reply, .cap = reply ? reply_cap : 0};
    int rc = tern_call(s, svc, method, req, len, timeout_ns, sync_cont, &w, NULL);

    uint64_t idle_since = 0;

    if (rc < 0)
        return rc;
    /* In adaptive mode the wait sleeps on the fabrics' fd once it has
     * spun spin_ns, as tern_rpc_run does: a thread that waits for a slow
     * reply gives its core to the peer that makes it. */
    while (!w.done) {
        struct tern_rpc_ep *ep = s->ep;

        if (tern_rpc_poll(ep) > 0 || ep->cfg.mode != TERN_TP_POLL_ADAPTIVE || !ep->n_tp) {
            idle_since = 0;
            continue;
        }
        if (!idle_since)
            idle_since = tern_now_ns();
        else if (tern_now_ns() - idle_since > ep->cfg.spin_ns && !w.done)
            rpc_sleep(ep, 1);
    }
    if (reply_len)
        *reply_len = w.status == 0 ? w.len : 0;
    return w.status;
}

size_t tern_session_msg_max(const struct tern_session *s)
{
    return s ? s->peer_max_msg : 0;
}
