/* The paths of an auto:// session (rpc_internal.h, struct rpc_paths).
 *
 * A session starts on the best fabric the server advertised, with the TCP
 * bootstrap connection kept idle as its standby. When its path fails it
 * moves to the standby at once (client.c, rpc_client_failover); from then
 * on the housekeeping tick (every 100 ms) works to get back what was lost:
 *
 *   - a better path than the current one whose retry time has come is
 *     dialed, and once its HELLO_ACK is in, the session moves onto it
 *     (the calls in flight are re-sent there, answered from the server's
 *     replay cache if they ran); the path it leaves becomes the standby if
 *     it is TCP and there is none, else it is closed;
 *   - without a standby (it was used), a new TCP connection is dialed as
 *     one, so that a second failure has somewhere to go too.
 *
 * A dial that fails or takes over 2 s puts its candidate back by a
 * backoff, 200 ms doubling to 5 s; a path that failed again within 10 s
 * of being taken keeps its doubled backoff (a flapping link is not taken
 * back every 200 ms). Every dial is a session of its own, in state
 * CONNECTING, whose `parent` is the session it works for: the endpoint
 * polls it like any other, and on_hello_ack hands it over here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rpc_internal.h"

#define BACKOFF_MIN_MS 200u
#define BACKOFF_MAX_MS 5000u
#define DIAL_TIMEOUT_NS 2000000000ull
#define STABLE_NS 10000000000ull     /* a path up this long was not flapping */

int rpc_paths_candidates(const char *ads, const char *policy, char (*out)[RPC_URI_MAX],
                         unsigned max)
{
    unsigned n = 0;
    int k;

    if (!policy || !*policy) {
        k = ads ? tern_tp_select_list(ads, NULL, &out[0][0], RPC_URI_MAX, max) : 0;
        return k < 0 ? 0 : k;
    }
    for (const char *p = policy; *p && n < max;) {
        size_t len = strcspn(p, ",");
        char item[RPC_URI_MAX];

        if (len < sizeof(item)) {
            memcpy(item, p, len);
            item[len] = 0;
            if (strstr(item, "://")) {
                /* A path named outright (an NTB cable's partition): the
                 * configuration knows it reaches the peer. */
                memcpy(out[n++], item, len + 1);
            } else if (strcmp(item, "tcp") != 0 && ads) {
                k = tern_tp_select_list(ads, item, &out[n][0], RPC_URI_MAX, max - n);
                n += k > 0 ? (unsigned)k : 0;
            }
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return (int)n;
}

int rpc_paths_init(struct tern_session *s, const char *boot_uri, const char *policy,
                   const char *uri)
{
    struct rpc_paths *p = calloc(1, sizeof(*p));
    char list[RPC_PATHS_MAX - 1][RPC_URI_MAX];
    int n;

    if (!p)
        return TERN_ENOMEM;
    snprintf(p->policy, sizeof(p->policy), "%s", policy ? policy : "");
    n = rpc_paths_candidates(s->peer_ads, policy, list, RPC_PATHS_MAX - 1);
    for (int i = 0; i < n; i++)
        memcpy(p->cand[p->n++].uri, list[i], RPC_URI_MAX);
    snprintf(p->cand[p->n++].uri, RPC_URI_MAX, "%s", boot_uri);
    p->cur = p->n - 1;
    for (unsigned i = 0; i < p->n; i++)
        if (strcmp(p->cand[i].uri, uri) == 0)
            p->cur = i;
    for (unsigned i = 0; i < p->n; i++)
        p->cand[i].backoff_ms = BACKOFF_MIN_MS;
    p->since = tern_now_ns();
    p->dial_cand = -1;
    s->paths = p;
    return 0;
}

static void backoff(struct rpc_paths *p, unsigned i, uint64_t now)
{
    p->cand[i].retry_at = now + (uint64_t)p->cand[i].backoff_ms * 1000000u;
    p->cand[i].backoff_ms = p->cand[i].backoff_ms * 2 > BACKOFF_MAX_MS
                                ? BACKOFF_MAX_MS : p->cand[i].backoff_ms * 2;
}

void rpc_paths_failed_over(struct tern_session *s)
{
    struct rpc_paths *p = s->paths;
    uint64_t now = tern_now_ns();
    unsigned lost = p->cur;

    /* The standby is the TCP bootstrap's kind: the last candidate. */
    if (now - p->since >= STABLE_NS)
        p->cand[lost].backoff_ms = BACKOFF_MIN_MS;
    backoff(p, lost, now);
    p->cur = p->n - 1;
    p->since = now;
}

/* Start dialing candidate `i` (-1: a TCP standby). */
static void dial(struct tern_session *s, int i, uint64_t now)
{
    struct rpc_paths *p = s->paths;
    const char *uri = p->cand[i < 0 ? (int)p->n - 1 : i].uri;
    struct tern_session *d;
    int rc = rpc_connect_start(s->ep, uri, s->token, s->has_secret ? s->secret : NULL, &d);

    if (rc < 0 || !d) {
        if (d)
            tern_rpc_disconnect(d);
        tern_log(TERN_LOG_DEBUG, "rpc", "dialing %s: %s", uri, tern_strerror(rc));
        backoff(p, i < 0 ? p->n - 1 : (unsigned)i, now);
        return;
    }
    d->parent = s;
    p->dial = d;
    p->dial_cand = i;
    p->dial_start = now;
}

static void dial_failed(struct tern_session *s, uint64_t now, const char *why)
{
    struct rpc_paths *p = s->paths;
    struct tern_session *d = p->dial;
    unsigned i = p->dial_cand < 0 ? p->n - 1 : (unsigned)p->dial_cand;

    tern_log(TERN_LOG_DEBUG, "rpc", "path %s: %s", p->cand[i].uri, why);
    backoff(p, i, now);
    p->dial = NULL;
    d->parent = NULL;
    tern_rpc_disconnect(d);
}

static void tick_one(struct tern_session *s, uint64_t now)
{
    struct rpc_paths *p = s->paths;
    unsigned tcp = p->n - 1;

    if (p->dial) {
        if (p->dial->state == SESS_DEAD)
            dial_failed(s, now, tern_strerror(tern_session_status(p->dial)));
        else if (now - p->dial_start > DIAL_TIMEOUT_NS)
            dial_failed(s, now, "no HELLO_ACK in 2 s");
        return;
    }
    if (s->state != SESS_OPEN)
        return;
    /* A better path whose time has come. */
    for (unsigned i = 0; i < p->cur; i++)
        if (p->cand[i].retry_at <= now) {
            dial(s, (int)i, now);
            return;
        }
    /* Else a standby, where one is needed: off TCP, or after a failover. */
    if (!s->standby && (p->cur != tcp || s->failovers) && p->cand[tcp].retry_at <= now)
        dial(s, -1, now);
}

void rpc_paths_tick(struct tern_rpc_ep *ep, uint64_t now)
{
    for (struct tern_session *s = ep->sessions, *next; s; s = next) {
        next = s->next;
        if (s->paths && !s->zombie && !s->closing)
            tick_one(s, now);
    }
}

void rpc_paths_dial_open(struct tern_session *d)
{
    struct tern_session *s = d->parent;
    struct rpc_paths *p = s->paths;
    struct tern_tp_conn *old = s->conn, *conn = d->conn;
    int i = p->dial_cand;

    p->dial = NULL;
    d->parent = NULL;
    /* The parent takes the dial's connection; the dial goes without it. */
    d->conn = NULL;
    tern_tp_conn_set_user(conn, s);
    tern_rpc_disconnect(d);
    if (i < 0) {
        s->standby = conn;
        p->cand[p->n - 1].backoff_ms = BACKOFF_MIN_MS;
        tern_log(TERN_LOG_INFO, "rpc", "session to %s has a standby again",
                 p->cand[p->n - 1].uri);
        return;
    }
    tern_log(TERN_LOG_INFO, "rpc", "session to %s moves from %s to %s (%u calls re-sent)",
             p->cand[p->n - 1].uri, p->cand[p->cur].uri, p->cand[i].uri, s->sent.n);
    s->conn = conn;
    s->moves++;
    rpc_client_requeue_sent(s);
    if (p->cur == p->n - 1 && !s->standby) {
        s->standby = old;            /* the TCP path waits again */
    } else {
        rpc_doom(s->ep, old);
    }
    p->cur = (unsigned)i;
    p->since = tern_now_ns();
    /* Keys and pointers learned on the old path are stale; its one-sided
     * operations end (the caller sees the epoch move). */
    s->epoch++;
    rpc_rma_fail(s, old, TERN_ECONNRESET);
    rpc_client_writable(s);
}

void rpc_paths_free(struct tern_session *s)
{
    if (s->parent) {                 /* a dial: its parent forgets it */
        s->parent->paths->dial = NULL;
        s->parent = NULL;
    }
    if (!s->paths)
        return;
    if (s->paths->dial) {
        struct tern_session *d = s->paths->dial;

        s->paths->dial = NULL;
        d->parent = NULL;
        tern_rpc_disconnect(d);
    }
    free(s->paths);
    s->paths = NULL;
}
