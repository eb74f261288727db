/* RPC endpoints: transport endpoints per fabric, the service registry,
 * sessions, and the poll loop that turns transport events into handler and
 * continuation runs. */
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "cfg.h"
#include "rpc_internal.h"

/* tern 0.1's struct tern_rpc_config: every field it has today. A field
 * added later makes this offsetof(struct tern_rpc_config, that_field). */
/* size 0: the fields of tern 0.1, up to `fabrics`. */
#define TERN_RPC_CONFIG_V0_1 offsetof(struct tern_rpc_config, key)

uint64_t tern_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void free_zombies(struct tern_rpc_ep *ep);

/* Disconnect `conn` once the current poll is over: later events of its
 * batch may still name it. Outside a poll it goes at once. */
void rpc_doom(struct tern_rpc_ep *ep, struct tern_tp_conn *conn)
{
    tern_tp_conn_set_user(conn, NULL);
    if (!ep->polling) {
        rpc_disconnect(ep, conn);
        return;
    }
    if (ep->n_doomed == ep->cap_doomed) {
        unsigned cap = ep->cap_doomed ? 2 * ep->cap_doomed : 16;
        struct tern_tp_conn **d = realloc(ep->doomed, cap * sizeof(*d));

        if (!d) {               /* last resort: it goes with the endpoint */
            tern_log(TERN_LOG_ERROR, "rpc", "out of memory: connection kept until close");
            return;
        }
        ep->doomed = d;
        ep->cap_doomed = cap;
    }
    ep->doomed[ep->n_doomed++] = conn;
}
void rpc_disconnect(struct tern_rpc_ep *ep, struct tern_tp_conn *conn)
{
    tern_tp_disconnect(conn);
    rpc_rma_conn_gone(ep, conn);
}

static void rpc_housekeeping(struct tern_rpc_ep *ep);

int tern_rpc_open(const struct tern_rpc_config *cfg, struct tern_rpc_ep **out)
{
    struct tern_rpc_ep *ep;
    int rc;

    if (!out)
        return TERN_EINVAL;
    *out = NULL;
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return TERN_ENOMEM;
    ep->wait_epfd = -1;
    tp_cfg_copy(&ep->cfg, sizeof(ep->cfg), cfg, TERN_RPC_CONFIG_V0_1);
    if (ep->cfg.key) {
        if (ep->cfg.key_len < 16 || ep->cfg.key_len > sizeof(ep->key)) {
            free(ep);
            return TERN_EINVAL;
        }
        memcpy(ep->key, ep->cfg.key, ep->cfg.key_len);
        ep->key_len = ep->cfg.key_len;
    }
    ep->cfg.key = NULL;              /* the caller's memory is not kept */
    ep->cfg.key_len = 0;
    if (!ep->cfg.spin_ns)
        ep->cfg.spin_ns = 50000;
    if (!ep->cfg.max_msg)
        ep->cfg.max_msg = 1u << 20;
    if (!ep->cfg.credits)
        ep->cfg.credits = 32;
    if (!ep->cfg.max_calls)
        ep->cfg.max_calls = 4096;
    if (!ep->cfg.max_sessions)
        ep->cfg.max_sessions = 4096;
    if (!ep->cfg.hello_timeout_ns)
        ep->cfg.hello_timeout_ns = 5000000000ull;
    if (!ep->cfg.rma_timeout_ns)
        ep->cfg.rma_timeout_ns = 10000000000ull;
    if (ep->cfg.credits > ep->cfg.max_calls)
        ep->cfg.credits = ep->cfg.max_calls;
    if (ep->cfg.max_calls > (1u << 24) || ep->cfg.max_msg > (1u << 30)) {
        free(ep);
        return TERN_EINVAL;
    }
    rc = rpc_calls_init(ep);
    if (rc < 0) {
        free(ep);
        return rc;
    }
    *out = ep;
    return 0;
}

void tern_rpc_close(struct tern_rpc_ep *ep)
{
    if (!ep)
        return;
    ep->polling = 0;
    free_zombies(ep);
    while (ep->n_doomed)
        rpc_disconnect(ep, ep->doomed[--ep->n_doomed]);
    while (ep->sessions)
        tern_rpc_disconnect(ep->sessions);
    /* Regions go before their fabrics: closing one frees its registrations. */
    rpc_rma_destroy(ep);
    for (unsigned i = 0; i < ep->n_tp; i++)
        tern_tp_close(ep->tp[i]);
    for (unsigned i = 0; i < ep->n_services; i++)
        free(ep->services[i].by_method);
    free(ep->calls);
    free(ep->free_slots);
    free(ep->doomed);
    free(ep->held);
    free(ep->held_buf);
    rpc_gates_detach(ep);
    if (ep->wait_epfd >= 0)
        close(ep->wait_epfd);
    explicit_bzero(ep->key, sizeof(ep->key));
    free(ep);
}

int tern_rpc_register(struct tern_rpc_ep *ep, const struct tern_service *svc)
{
    struct rpc_service *rs;
    uint32_t n = 0;

    if (!svc || !svc->methods || !svc->n_methods)
        return TERN_EINVAL;
    if (rpc_service_find(ep, svc->id))
        return TERN_EEXIST;
    if (ep->n_services == RPC_MAX_SERVICES)
        return TERN_ENOBUFS;
    for (size_t i = 0; i < svc->n_methods; i++) {
        if (!svc->methods[i].handler)
            return TERN_EINVAL;
        if (svc->methods[i].id >= n)
            n = svc->methods[i].id + 1u;
    }
    rs = &ep->services[ep->n_services];
    rs->by_method = calloc(n, sizeof(*rs->by_method));
    if (!rs->by_method)
        return TERN_ENOMEM;
    for (size_t i = 0; i < svc->n_methods; i++) {
        if (rs->by_method[svc->methods[i].id]) {
            free(rs->by_method);
            rs->by_method = NULL;
            return TERN_EINVAL;
        }
        rs->by_method[svc->methods[i].id] = svc->methods[i].handler;
    }
    rs->svc = svc;
    rs->n_slots = n;
    ep->n_services++;
    ep->svc_slot[svc->id] = (uint8_t)ep->n_services;
    return 0;
}

const struct rpc_service *rpc_service_find(const struct tern_rpc_ep *ep, uint16_t id)
{
    uint8_t slot = ep->svc_slot[id];

    return slot ? &ep->services[slot - 1] : NULL;
}

static void rpc_housekeeping(struct tern_rpc_ep *ep)
{
    uint64_t now = tern_now_ns(), limit = ep->cfg.hello_timeout_ns;

    if (now < ep->next_housekeeping)
        return;
    ep->next_housekeeping = now + 100000000u;   /* 100 ms */
    rpc_paths_tick(ep, now);
    for (struct tern_session *s = ep->sessions, *next; s; s = next) {
        next = s->next;
        /* A handshake started without waiting, past its deadline. */
        if (s->role == ROLE_CLIENT && s->connect_by && s->state != SESS_OPEN &&
            s->state != SESS_DEAD && now > s->connect_by) {
            rpc_client_fail(s, TERN_ETIMEDOUT);
            continue;
        }
        /* A client that never says HELLO, or never proves the key after
         * it, holds a connection for nothing. */
        if (s->role == ROLE_SERVER &&
            (s->state == SESS_CONNECTING || s->state == SESS_AUTH) && now - s->created > limit) {
            tern_log(TERN_LOG_WARN, "rpc", "%s sent no %s in %llu ms; closing",
                     tern_tp_conn_peer(s->conn), s->state == SESS_AUTH ? "AUTH" : "HELLO",
                     (unsigned long long)(ep->cfg.hello_timeout_ns / 1000000u));
            rpc_session_free(s);
        }
    }
}

/* Split "fabric://addr" and return (opening on first use) that fabric's
 * transport endpoint. */
int rpc_tp_for(struct tern_rpc_ep *ep, const char *uri, const char **addr,
               struct tern_tp_ep **tp)
{
    int id = tern_tp_uri_fabric(uri);
    int rc;

    if (id < 0)
        return id == TERN_ENOFABRIC ? TERN_ENOFABRIC : TERN_EBADADDR;
    *addr = strstr(uri, "://") + 3;
    for (unsigned i = 0; i < ep->n_tp; i++) {
        if (tern_tp_fabric_id(ep->tp[i]) == id) {
            *tp = ep->tp[i];
            return ep->tp_failed[i];
        }
    }
    if (ep->n_tp == RPC_MAX_FABRICS)
        return TERN_ENOBUFS;
    struct tern_tp_config tc = {
        .fabric = tern_tp_fabric_names()[id], .mode = ep->cfg.mode,
        .max_msg = ep->cfg.max_msg + sizeof(struct rpc_hdr),
        .max_conns = ep->cfg.max_sessions,
    };
    rc = tern_tp_open(&tc, tp);
    if (rc < 0)
        return rc;
    /* No window before a peer is known: authenticated (a key), or a
     * process of this host (protected mode). */
    if (ep->key_len || ep->cfg.local_only)
        tern_tp_ep_gate_rma(*tp);
    ep->tp[ep->n_tp++] = *tp;
    /* One fd to sleep on for all fabrics (see rpc_sleep). */
    if (ep->wait_epfd < 0)
        ep->wait_epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ep->wait_epfd >= 0 && tern_tp_wait_fd(*tp) >= 0) {
        struct epoll_event e = {.events = EPOLLIN};

        epoll_ctl(ep->wait_epfd, EPOLL_CTL_ADD, tern_tp_wait_fd(*tp), &e);
    }
    return 0;
}

int tern_rpc_listen(struct tern_rpc_ep *ep, const char *uri, char *bound, size_t bound_len)
{
    struct tern_tp_ep *tp;
    const char *addr;
    char tb[128];
    int rc = rpc_tp_for(ep, uri, &addr, &tp);

    if (rc < 0)
        return rc;
    rc = tern_tp_listen(tp, addr, tb, sizeof(tb));
    if (rc < 0)
        return rc;
    if (bound && bound_len)
        snprintf(bound, bound_len, "%s://%s", tern_tp_fabric(tp), tb);
    /* Clients that arrive over TCP learn about the faster ways in. */
    if (tern_tp_selectable(tp)) {
        char node[128];
        size_t used = strlen(ep->ads);

        if (tern_tp_node_id(node, sizeof(node)) == 0)
            snprintf(ep->ads + used, sizeof(ep->ads) - used, "%s://%s@%s;",
                     tern_tp_fabric(tp), tb, node);
    }
    return 0;
}

struct tern_session *rpc_session_new(struct tern_rpc_ep *ep, struct tern_tp_conn *conn,
                                     enum session_role role)
{
    struct tern_session *s;

    if (ep->n_sessions >= ep->cfg.max_sessions)
        return NULL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->ep = ep;
    s->conn = conn;
    s->role = role;
    s->state = SESS_CONNECTING;
    s->peer_max_msg = ep->cfg.max_msg;  /* until the handshake says more */
    s->spill_tail = &s->spill_head;
    s->next = ep->sessions;
    if (ep->sessions)
        ep->sessions->prev = s;
    ep->sessions = s;
    ep->n_sessions++;
    tern_tp_conn_set_user(conn, s);
    return s;
}

static void session_destroy(struct tern_session *s)
{
    free(s->peer_ads);
    if (s->standby)
        rpc_disconnect(s->ep, s->standby);
    rpc_replay_put(s->ep, s->replay);
    if (s->role == ROLE_SERVER)
        rpc_server_drop(s);
    if (s->conn)
        rpc_disconnect(s->ep, s->conn);
    if (s->auth) {
        explicit_bzero(s->auth, sizeof(*s->auth));
        free(s->auth);
    }
    explicit_bzero(s->secret, sizeof(s->secret));
    free(s);
}

/* Inside a poll, later events of the same batch may still name this
 * session's connection, so the session becomes a zombie that the end of the
 * poll frees; outside a poll it goes at once. */
void rpc_session_free(struct tern_session *s)
{
    struct tern_rpc_ep *ep = s->ep;

    if (s->zombie)
        return;
    rpc_forget_held(s);
    if (s->prev)
        s->prev->next = s->next;
    else
        ep->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    ep->n_sessions--;
    /* Nothing new starts on it from here on, not even from the callbacks
     * of its one-sided operations, which complete now. */
    s->zombie = true;
    rpc_paths_free(s);
    free(s->auto_start);
    s->auto_start = NULL;
    rpc_rma_fail(s, NULL, s->state == SESS_DEAD && s->status ? s->status : TERN_ECONNRESET);
    /* Services may keep state per client (the KV service's leases). */
    if (s->role == ROLE_SERVER)
        for (unsigned i = 0; i < ep->n_services; i++)
            if (ep->services[i].svc->session_closed)
                ep->services[i].svc->session_closed(s, ep->services[i].svc->ctx);
    if (ep->polling) {
        s->next = ep->zombies;
        ep->zombies = s;
        return;
    }
    session_destroy(s);
}

static void free_zombies(struct tern_rpc_ep *ep)
{
    while (ep->zombies) {
        struct tern_session *s = ep->zombies;

        ep->zombies = s->next;
        session_destroy(s);
    }
}

/* A peer sent something we cannot parse: it loses its session, nobody else
 * notices. */
void rpc_bad_frame(struct tern_session *s, const char *why)
{
    if (s->state == SESS_DEAD)
        return;     /* said once; a hostile peer cannot flood the log */
    tern_log(TERN_LOG_WARN, "rpc", "session with %s: %s; closing it",
             s->conn ? tern_tp_conn_peer(s->conn) : "?", why);
    if (s->role == ROLE_CLIENT) {
        rpc_client_fail(s, TERN_EPROTO);
    } else {
        rpc_session_free(s);
    }
}

static void on_accept(struct tern_rpc_ep *ep, struct tern_tp_conn *conn)
{
    struct tern_session *s = rpc_session_new(ep, conn, ROLE_SERVER);

    if (!s) {
        static struct tern_log_limit limit;

        if (tern_log_allow(&limit)) {
            tern_log(TERN_LOG_WARN, "rpc", "refusing %s: session limit %u reached (%u more)",
                     tern_tp_conn_peer(conn), ep->cfg.max_sessions, limit.held);
            limit.held = 0;
        }
        /* Later events of this batch may name the conn: hang up after it. */
        rpc_doom(ep, conn);
        return;
    }
    s->created = tern_now_ns();
}

static void on_recv(struct tern_session *s, const struct tern_tp_event *e)
{
    struct rpc_hdr h;

    if (e->len < sizeof(h)) {
        tern_tp_msg_release(e->conn, e->data);
        rpc_bad_frame(s, "message shorter than the RPC header");
        return;
    }
    memcpy(&h, e->data, sizeof(h));
    if (h.version != RPC_VERSION) {
        tern_tp_msg_release(e->conn, e->data);
        if (s->role == ROLE_CLIENT) {
            tern_log(TERN_LOG_WARN, "rpc", "%s speaks RPC version %u, we speak %u",
                     tern_tp_conn_peer(s->conn), h.version, RPC_VERSION);
            rpc_client_fail(s, TERN_EVERSION);
        } else {
            rpc_bad_frame(s, "unsupported RPC version");
        }
        return;
    }
    if (s->role == ROLE_SERVER) {
        if (!rpc_server_recv(s, e->data, e->len))
            tern_tp_msg_release(e->conn, e->data);
        return;
    }
    rpc_client_recv(s, &h, (const uint8_t *)e->data + sizeof(h), e->len - sizeof(h));
    /* Even if a continuation closed the session, its conn lives until the
     * end of this poll (see rpc_session_free). */
    tern_tp_msg_release(e->conn, e->data);
}

static void on_event(struct tern_rpc_ep *ep, const struct tern_tp_event *e)
{
    struct tern_session *s = e->conn ? tern_tp_conn_user(e->conn) : NULL;

    /* Found by their token, whatever became of the session since. */
    if (e->type == TERN_TP_EV_PUT_DONE || e->type == TERN_TP_EV_GET_DONE) {
        rpc_rma_done(ep, e);
        return;
    }
    if (e->type == TERN_TP_EV_ACCEPTED) {
        on_accept(ep, e->conn);
        return;
    }
    if (!s) {
        /* A connection on its way out (rpc_doom): just give views back. */
        if (e->type == TERN_TP_EV_RECV)
            tern_tp_msg_release(e->conn, e->data);
        return;
    }
    if (s->zombie) {
        if (e->type == TERN_TP_EV_RECV)
            tern_tp_msg_release(e->conn, e->data);
        return;
    }
    if (e->conn == s->standby) {
        /* The idle fallback path: only its loss matters. */
        if (e->type == TERN_TP_EV_RECV)
            tern_tp_msg_release(e->conn, e->data);
        if (e->type == TERN_TP_EV_CLOSED) {
            rpc_doom(ep, s->standby);
            s->standby = NULL;
        }
        return;
    }
    switch (e->type) {
    case TERN_TP_EV_RECV:
        on_recv(s, e);
        break;
    case TERN_TP_EV_CONNECTED:
        if (e->status < 0 && !rpc_client_failover(s, e->status))
            rpc_client_fail(s, e->status);
        break;
    case TERN_TP_EV_CLOSED:
        if (s->role == ROLE_CLIENT) {
            int status = e->status < 0 ? e->status : TERN_ECONNRESET;

            if (!rpc_client_failover(s, status))
                rpc_client_fail(s, status);
        } else {
            tern_log(TERN_LOG_DEBUG, "rpc", "client %s left", tern_tp_conn_peer(e->conn));
            rpc_session_free(s);
        }
        break;
    case TERN_TP_EV_WRITABLE:
        if (s->role == ROLE_CLIENT)
            rpc_client_writable(s);
        else
            rpc_server_writable(s);
        break;
    default:
        break;
    }
}

/* Fabric `t` failed as a whole (say its completion queue overran): its
 * connections will never report anything again. Sessions on it end as
 * if their connection had closed with `status` (a client moves to its
 * standby path if it has one); the fabric is not polled nor used again. */
static void fabric_failed(struct tern_rpc_ep *ep, unsigned t, int status)
{
    struct tern_tp_ep *tp = ep->tp[t];
    struct tern_session *s = ep->sessions;

    tern_log(TERN_LOG_ERROR, "rpc", "fabric %s failed: %s; its sessions fail",
             tern_tp_fabric(tp), tern_strerror(status));
    ep->tp_failed[t] = status;
    if (ep->wait_epfd >= 0 && tern_tp_wait_fd(tp) >= 0)
        epoll_ctl(ep->wait_epfd, EPOLL_CTL_DEL, tern_tp_wait_fd(tp), NULL);
    /* Continuations run by a failure may close other sessions: after
     * each, start over (a session handled no longer matches). */
    while (s) {
        bool on_tp = s->conn && tern_tp_conn_ep(s->conn) == tp && !s->zombie &&
                     (s->role == ROLE_SERVER || s->state != SESS_DEAD);

        if (s->standby && tern_tp_conn_ep(s->standby) == tp) {
            rpc_doom(ep, s->standby);
            s->standby = NULL;
        }
        if (!on_tp) {
            s = s->next;
            continue;
        }
        if (s->role == ROLE_SERVER)
            rpc_session_free(s);
        else if (!rpc_client_failover(s, status))
            rpc_client_fail(s, status);
        s = ep->sessions;
    }
}

int tern_rpc_poll(struct tern_rpc_ep *ep)
{
    int total = 0, failed = 0;

    ep->polling++;
    for (unsigned t = 0; t < ep->n_tp; t++) {
        int n;

        /* With several fabrics, one that has been quiet for a while (say
         * the idle TCP path an auto:// session keeps for failover) is
         * polled every 64th time only: its poll may be a system call, and
         * the busy fabric should not pay for it on every round trip. */
        if (ep->tp_failed[t] ||
            (ep->n_tp > 1 && ep->tp_idle[t] > 64 && (ep->polls & 63) != t))
            continue;
        n = tern_tp_poll(ep->tp[t], ep->ev, RPC_EVENT_BATCH);
        if (n < 0) {
            fabric_failed(ep, t, n);
            failed = n;
            continue;
        }
        for (int i = 0; i < n; i++)
            on_event(ep, &ep->ev[i]);
        /* Held replies go before the next fabric's batch: its requests
         * must not wait on this one's. */
        rpc_release_held(ep);
        if (n > 0) {
            total += n;
            ep->tp_idle[t] = 0;
        } else if (ep->tp_idle[t] <= 64) {
            ep->tp_idle[t]++;
        }
    }
    /* Clock reads stay off the spinning path: a busy endpoint looks at the
     * time every 64 polls; an adaptive one, which may poll only after a
     * sleep, on every idle poll. */
    bool tick = (++ep->polls & 63) == 0 || (ep->cfg.mode == TERN_TP_POLL_ADAPTIVE && !total);

    /* Drop clients that never said HELLO (at most every 100 ms). */
    if (tick)
        rpc_housekeeping(ep);
    /* Deadlines, scanned at most every 100 us: precise enough for timeouts,
     * and cheap when calls complete on time. */
    if (ep->n_deadlines && tick) {
        uint64_t now = tern_now_ns();

        if (ep->n_unstamped)
            rpc_stamp_calls(ep, now);
        if (now >= ep->next_deadline_scan) {
            ep->next_deadline_scan = now + 100000;
            rpc_expire_calls(ep, now);
        }
    }
    if (tick && rpc_rma_busy(ep)) {
        uint64_t now = tern_now_ns();

        if (now >= ep->next_rma_scan) {
            ep->next_rma_scan = now + 1000000;
            rpc_rma_expire(ep, now);
        }
    }
    /* Replies and calls posted by handlers, continuations and expiries of
     * this poll leave together: one doorbell per connection. */
    for (unsigned t = 0; t < ep->n_tp; t++)
        if (!ep->tp_failed[t])
            tern_tp_flush(ep->tp[t]);
    if (--ep->polling == 0) {
        if (ep->zombies)
            free_zombies(ep);
        while (ep->n_doomed)
            rpc_disconnect(ep, ep->doomed[--ep->n_doomed]);
    }
    return failed ? failed : total;
}

/* Sleep until any fabric has work. With one fabric its own wait does it;
 * with several, every fabric is armed (shm tells its peers to ring) and the
 * endpoint sleeps on all their fds at once. */
void rpc_sleep(struct tern_rpc_ep *ep, int ms)
{
    struct epoll_event e;

    if (ep->n_tp == 1 && !ep->tp_failed[0]) {
        tern_tp_wait(ep->tp[0], (int64_t)ms * 1000000);
        return;
    }
    for (unsigned t = 0; t < ep->n_tp; t++)
        if (!ep->tp_failed[t] && tern_tp_arm(ep->tp[t]) < 0)
            goto awake;
    if (ep->wait_epfd >= 0)
        epoll_wait(ep->wait_epfd, &e, 1, ms);
awake:
    /* Look at every fabric on the next poll, however quiet it was. */
    for (unsigned t = 0; t < ep->n_tp; t++)
        ep->tp_idle[t] = 0;
}

int tern_rpc_wait_fd(const struct tern_rpc_ep *ep)
{
    return ep->n_tp == 1 ? tern_tp_wait_fd(ep->tp[0]) : ep->wait_epfd;
}

int tern_rpc_arm(struct tern_rpc_ep *ep)
{
    for (unsigned t = 0; t < ep->n_tp; t++) {
        int rc = ep->tp_failed[t] ? 0 : tern_tp_arm(ep->tp[t]);

        ep->tp_idle[t] = 0;      /* after a sleep, look at every fabric */
        if (rc < 0)
            return rc;
    }
    return 0;
}

int tern_rpc_run(struct tern_rpc_ep *ep, int64_t timeout_ns)
{
    uint64_t start = tern_now_ns(), idle_since = start;
    uint64_t end = timeout_ns < 0 ? UINT64_MAX : start + (uint64_t)timeout_ns;
    int total = 0;

    while (!__atomic_load_n(&ep->stop, __ATOMIC_RELAXED)) {
        int n = tern_rpc_poll(ep);
        uint64_t now;

        if (n < 0)
            return n;
        total += n;
        /* A busy loop with no end to watch needs no clock: a clock read
         * costs as much as an idle poll and delays noticing a message. */
        if (end == UINT64_MAX && ep->cfg.mode != TERN_TP_POLL_ADAPTIVE)
            continue;
        now = tern_now_ns();
        if (now >= end)
            break;
        if (n > 0) {
            idle_since = now;
            continue;
        }
        if (ep->cfg.mode == TERN_TP_POLL_ADAPTIVE && ep->n_tp &&
            now - idle_since > ep->cfg.spin_ns) {
            /* Sleep at most 10 ms (1 ms with deadlines to watch). */
            int ms = !ep->n_deadlines ? 10 : 1;

            if (end != UINT64_MAX && (end - now) / 1000000u < (uint64_t)ms)
                ms = (int)((end - now) / 1000000u) + 1;
            rpc_sleep(ep, ms);
        }
    }
    /* A stop is consumed by the run it ended (or the next one, if it came
     * before that run started). */
    __atomic_store_n(&ep->stop, 0, __ATOMIC_RELAXED);
    return total;
}

void tern_rpc_stop(struct tern_rpc_ep *ep)
{
    __atomic_store_n(&ep->stop, 1, __ATOMIC_RELAXED);
}
