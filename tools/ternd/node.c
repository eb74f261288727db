/* ternd's node service, peer sessions and metrics (node.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "node.h"
#include "replica.h"
#include "node_proto.h"
#include "tern_config.h"
#if TERN_HAVE_CLUSTER
#include "member.h"
#endif

#define PING_EVERY_NS 200000000ull
#define PING_TIMEOUT_NS 1000000000ull
#define CONNECT_TIMEOUT_NS 1000000000ull
#define RETRY_MIN_MS 500u
#define RETRY_MAX_MS 5000u
#define MAX_LISTEN_SHOWN 16

enum peer_state { PEER_DOWN, PEER_CONNECTING, PEER_UP };
static const char *const state_names[] = {"down", "connecting", "up"};

/* What the peers thread publishes of a peer (under the node's lock). */
struct peer_view {
    enum peer_state state;
    char fabric[8];
    char policy[256];
    uint64_t calls, errors, bytes, failovers, moves;   /* over every session */
    double calls_per_s;
    unsigned credits;
    double rtt_us;
    bool standby;
    char last_error[96];
};

/* The peers thread's own state of a peer. */
struct peer_run {
    const struct ternd_peer *cfg;
    struct tern_session *s;
    enum peer_state state;
    uint64_t retry_at;
    unsigned backoff_ms;
    char policy[256];
    bool pinging;
    uint64_t ping_sent, ping_seq;
    double rtt_us;
    /* counters of sessions gone: Prometheus counters never go back */
    uint64_t base_calls, base_errors, base_bytes, base_failovers, base_moves;
    uint64_t rate_calls, rate_t;
    double calls_per_s;
    char last_error[96];
};

struct ternd_node {
    const struct ternd_opts *o;
    char services[64];
    uint64_t started;                /* CLOCK_MONOTONIC ns */
    char *listen[MAX_LISTEN_SHOWN];
    unsigned n_listen;
    struct tern_service def;
    /* shared with the peers and metrics threads */
    pthread_mutex_t lock;
    struct peer_view *view;
    struct ternd_policy policy;
    unsigned policy_gen;
    /* the peers thread */
    pthread_t thread;
    bool thread_on;
    volatile int stop;
    struct tern_rpc_ep *pep;
    struct peer_run *run;
    unsigned seen_gen;
    /* metrics */
    struct MHD_Daemon *mhd;
    int metrics_port;
#if TERN_HAVE_CLUSTER
    struct cl_member *member;        /* [cluster]: registration in etcd */
#endif
    struct ternd_replica *replica;   /* [cluster] kv_shard */
    struct ternd_replica *doc_replica;   /* [cluster] doc_shard */
    char mongo[128];                 /* the MongoDB gateway, "HOST:PORT" or "" */
};

/* ---- text building ---- */

struct buf {
    char *p;
    size_t len, cap;
    bool full;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->full)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len) {
        b->full = true;
        return;
    }
    b->len += (size_t)n;
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void put_json_str(struct buf *b, const char *s)
{
    put(b, "\"");
    for (; *s && !b->full; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\')
            put(b, "\\%c", c);
        else if (c < 0x20)
            put(b, "\\u%04x", c);
        else
            put(b, "%c", c);
    }
    put(b, "\"");
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static void put_label(struct buf *b, const char *s)
{
    for (; *s && !b->full; s++) {
        if (*s == '\\' || *s == '"')
            put(b, "\\%c", *s);
        else if (*s == '\n')
            put(b, "\\n");
        else
            put(b, "%c", *s);
    }
}

/* ---- the fabric policy of a peer ---- */

/* Subnet rules first (the peer's IPv4 address), then the rack: the same
 * as ours, or another. TCP is always the last resort. */
static void policy_for(const struct ternd_policy *pol, const char *me, const char *my_rack,
                       const struct ternd_peer *p, char *out, size_t len)
{
    const struct ternd_fabric_list *l;
    char host[64];
    const char *h = p->address + 6, *colon = strrchr(h, ':');
    struct in_addr a;
    size_t at;

    snprintf(host, sizeof(host), "%.*s", colon ? (int)(colon - h) : (int)strlen(h), h);
    if (inet_pton(AF_INET, host, &a) == 1)
        for (unsigned i = 0; i < pol->n_subnets; i++)
            if ((ntohl(a.s_addr) & pol->subnet[i].mask) == pol->subnet[i].net) {
                snprintf(out, len, "%s%s", pol->subnet[i].fabric,
                         strcmp(pol->subnet[i].fabric, "tcp") ? ",tcp" : "");
                return;
            }
    l = my_rack[0] && strcmp(my_rack, p->rack) == 0 ? &pol->same_rack : &pol->other_rack;
    out[0] = 0;
    at = 0;
    for (unsigned i = 0; i < l->n && at < len; i++) {
        /* NTB by its cable: the partition the peer listens on for us. */
        if (strcmp(l->name[i], "ntb") == 0 && p->ntb[0])
            at += (size_t)snprintf(out + at, len - at, "%sntb://%s/%u", at ? "," : "", p->ntb,
                                   ternd_ntb_part(p->name, me, 0));
        else
            at += (size_t)snprintf(out + at, len - at, "%s%s", at ? "," : "", l->name[i]);
    }
    if (!strstr(out, "tcp") && at + 4 < len)
        snprintf(out + at, len - at, "%stcp", at ? "," : "");
}

/* ---- the peers thread ---- */

static void publish(struct ternd_node *n)
{
    pthread_mutex_lock(&n->lock);
    for (unsigned i = 0; i < n->o->n_peers; i++) {
        struct peer_run *r = &n->run[i];
        struct peer_view *v = &n->view[i];
        struct tern_session_info si = {.size = sizeof(si)};

        v->state = r->state;
        snprintf(v->policy, sizeof(v->policy), "%s", r->policy);
        snprintf(v->last_error, sizeof(v->last_error), "%s", r->last_error);
        v->calls = r->base_calls;
        v->errors = r->base_errors;
        v->bytes = r->base_bytes;
        v->failovers = r->base_failovers;
        v->moves = r->base_moves;
        v->fabric[0] = 0;
        v->credits = 0;
        v->standby = false;
        if (r->s && tern_session_info(r->s, &si) == 0) {
            snprintf(v->fabric, sizeof(v->fabric), "%s", si.fabric);
            v->calls += si.calls;
            v->errors += si.errors;
            v->bytes += si.bytes_out + si.bytes_in;
            v->failovers += si.failovers;
            v->moves += si.moves;
            v->credits = si.credits;
            v->standby = si.standby;
        }
        v->calls_per_s = r->calls_per_s;
        v->rtt_us = r->rtt_us;
    }
    pthread_mutex_unlock(&n->lock);
}

static void drop_session(struct peer_run *r, const char *why)
{
    struct tern_session_info si = {.size = sizeof(si)};

    if (r->s && tern_session_info(r->s, &si) == 0) {
        r->base_calls += si.calls;
        r->base_errors += si.errors;
        r->base_bytes += si.bytes_out + si.bytes_in;
        r->base_failovers += si.failovers;
        r->base_moves += si.moves;
    }
    if (r->s)
        tern_rpc_disconnect(r->s);
    r->s = NULL;
    r->pinging = false;
    r->state = PEER_DOWN;
    r->rate_t = 0;
    r->calls_per_s = 0;
    r->rtt_us = 0;                   /* no round trip to show while it is down */
    snprintf(r->last_error, sizeof(r->last_error), "%s", why);
}

static void ping_done(void *arg, int status, const void *reply, size_t len)
{
    struct peer_run *r = arg;

    r->pinging = false;
    if (status < 0) {
        snprintf(r->last_error, sizeof(r->last_error), "ping: %s", tern_strerror(status));
        return;
    }
    if (len == sizeof(r->ping_seq) && memcmp(reply, &r->ping_seq, len) == 0) {
        double us = (double)(tern_now_ns() - r->ping_sent) / 1e3;

        r->rtt_us = r->rtt_us > 0 ? 0.8 * r->rtt_us + 0.2 * us : us;
    }
}

static void connect_peer(struct ternd_node *n, struct peer_run *r, uint64_t now)
{
    static struct tern_log_limit limit;
    char uri[192];
    int rc;

    snprintf(uri, sizeof(uri), "auto://%s", r->cfg->address + 6);
    r->state = PEER_CONNECTING;
    publish(n);
    rc = tern_rpc_connect_with(n->pep, uri, r->policy, CONNECT_TIMEOUT_NS, &r->s);
    if (rc < 0) {
        r->s = NULL;
        r->state = PEER_DOWN;
        snprintf(r->last_error, sizeof(r->last_error), "connect: %s", tern_strerror(rc));
        if (tern_log_allow(&limit))
            tern_log(TERN_LOG_WARN, "ternd", "peer %s (%s): %s; again in %u ms", r->cfg->name,
                     r->cfg->address, tern_strerror(rc), r->backoff_ms);
        r->retry_at = now + (uint64_t)r->backoff_ms * 1000000u;
        r->backoff_ms = r->backoff_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : r->backoff_ms * 2;
        return;
    }
    r->state = PEER_UP;
    r->backoff_ms = RETRY_MIN_MS;
    r->last_error[0] = 0;
    tern_log(TERN_LOG_INFO, "ternd", "peer %s (%s) up over %s (policy %s)", r->cfg->name,
             r->cfg->address, tern_session_fabric(r->s), r->policy);
}

static void tend_peer(struct ternd_node *n, struct peer_run *r, uint64_t now)
{
    int st;

    if (!r->s) {
        if (now >= r->retry_at)
            connect_peer(n, r, now);
        return;
    }
    if ((st = tern_session_status(r->s)) < 0) {
        tern_log(TERN_LOG_WARN, "ternd", "peer %s lost: %s", r->cfg->name, tern_strerror(st));
        drop_session(r, tern_strerror(st));
        r->retry_at = now;           /* at once: the node may be back already */
        return;
    }
    if (!r->pinging && now - r->ping_sent >= PING_EVERY_NS) {
        r->ping_seq++;
        r->ping_sent = now;
        if (tern_call(r->s, NODE_SERVICE_ID, NODE_M_PING, &r->ping_seq, sizeof(r->ping_seq),
                      PING_TIMEOUT_NS, ping_done, r, NULL) == 0)
            r->pinging = true;
    }
    if (!r->rate_t || now - r->rate_t >= 1000000000ull) {
        struct tern_session_info si = {.size = sizeof(si)};

        if (tern_session_info(r->s, &si) == 0) {
            if (r->rate_t)
                r->calls_per_s = (double)(si.calls - r->rate_calls) * 1e9 /
                                 (double)(now - r->rate_t);
            r->rate_calls = si.calls;
            r->rate_t = now;
        }
    }
}

/* A reloaded policy: peers whose fabric list changed start again. */
static void take_policy(struct ternd_node *n)
{
    struct ternd_policy pol;
    unsigned gen;

    pthread_mutex_lock(&n->lock);
    pol = n->policy;
    gen = n->policy_gen;
    pthread_mutex_unlock(&n->lock);
    if (gen == n->seen_gen)
        return;
    n->seen_gen = gen;
    for (unsigned i = 0; i < n->o->n_peers; i++) {
        struct peer_run *r = &n->run[i];
        char p[256];

        policy_for(&pol, n->o->name, n->o->rack, r->cfg, p, sizeof(p));
        if (strcmp(p, r->policy) == 0)
            continue;
        if (r->policy[0])
            tern_log(TERN_LOG_INFO, "ternd", "peer %s: policy %s -> %s", r->cfg->name,
                     r->policy, p);
        snprintf(r->policy, sizeof(r->policy), "%s", p);
        if (r->s) {
            drop_session(r, "policy changed");
            r->last_error[0] = 0;
        }
        r->retry_at = 0;
        r->backoff_ms = RETRY_MIN_MS;
    }
}

static void *peers_main(void *arg)
{
    struct ternd_node *n = arg;

    while (!n->stop) {
        uint64_t now = tern_now_ns();

        take_policy(n);
        for (unsigned i = 0; i < n->o->n_peers && !n->stop; i++)
            tend_peer(n, &n->run[i], now);
        publish(n);
        tern_rpc_run(n->pep, 50000000);     /* 50 ms, sleeping when idle */
    }
    for (unsigned i = 0; i < n->o->n_peers; i++)
        if (n->run[i].s)
            drop_session(&n->run[i], "stopping");
    return NULL;
}

/* ---- the node service ---- */

static int on_ping(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out;

    (void)ctx;
    if (len > NODE_PING_MAX)
        return TERN_EMSGSIZE;
    out = tern_reply_alloc(req, len);
    if (len && !out)
        return TERN_EMSGSIZE;
    if (len)
        memcpy(out, data, len);
    return 0;
}

/* [cluster]: where the node is registered, or null when it runs alone. */
static void cluster_json(struct ternd_node *n, struct buf *b)
{
#if TERN_HAVE_CLUSTER
    struct cl_member_state st;

    if (!n->member) {
        put(b, "null");
        return;
    }
    cl_member_state(n->member, &st);
    put(b, "{\"etcd\":");
    put_json_str(b, n->o->etcd);
    put(b, ",\"prefix\":");
    put_json_str(b, n->o->prefix);
    put(b, ",\"registered\":%s,\"lease\":\"%llx\",\"registrations\":%" PRIu64 ",\"error\":",
        st.registered ? "true" : "false", (unsigned long long)st.lease, st.registrations);
    if (st.error[0])
        put_json_str(b, st.error);
    else
        put(b, "null");
    put(b, ",\"shards\":[");
    for (unsigned i = 0; i < n->o->n_shards; i++) {
        static const char *const roles[] = {"none", "primary", "backup"};
        struct cl_shard_role r;

        if (cl_member_role(n->member, n->o->shards[i], &r) < 0)
            continue;
        put(b, "%s{\"id\":", i ? "," : "");
        put_json_str(b, n->o->shards[i]);
        put(b, ",\"role\":\"%s\",\"epoch\":%" PRIu64 ",\"lease_alive\":%s,\"primary\":",
            roles[r.role], r.epoch, r.lease_alive ? "true" : "false");
        if (r.primary[0])
            put_json_str(b, r.primary);
        else
            put(b, "null");
        put(b, "}");
    }
    put(b, "]}");
#else
    (void)n;
    put(b, "null");
#endif
}

/* [cluster] kv_shard or doc_shard: the replicated store's group, or null. */
static void repl_json(struct ternd_replica *r, struct buf *b)
{
    struct repl_status st;

    if (!ternd_replica_status(r, &st)) {
        put(b, "null");
        return;
    }
    put(b, "{\"shard\":");
    put_json_str(b, ternd_replica_shard(r));
    put(b, ",\"state\":\"%s\",\"epoch\":%" PRIu64 ",\"epoch_seen\":%" PRIu64
           ",\"position\":\"%" PRIx64 "\",\"committed\":\"%" PRIx64 "\",\"log_from\":\"%"
           PRIx64 "\",\"held\":%u,\"shipped_batches\":%" PRIu64 ",\"applied_records\":%"
           PRIu64 ",\"refused_stale\":%" PRIu64 ",\"lease_in_doubt\":%s,\"vote\":\"%s\","
           "\"handing_over\":%s,\"replicas\":[",
        st.state, st.epoch, st.epoch_seen, st.position, st.committed, st.log_base, st.held,
        st.shipped_batches, st.applied_records, st.refused_stale,
        st.lease_doubt ? "true" : "false", st.vote ? st.vote : "voter",
        st.handing_over ? "true" : "false");
    for (unsigned i = 0; i < st.n; i++) {
        put(b, "%s{\"node\":", i ? "," : "");
        put_json_str(b, st.replicas[i].name);
        put(b, ",\"state\":\"%s\",\"position\":\"%" PRIx64 "\",\"lag\":%" PRIu64
               ",\"shipping\":\"%s\",\"vote\":\"%s\"}",
            st.replicas[i].state, st.replicas[i].position, st.replicas[i].lag,
            st.replicas[i].path ? st.replicas[i].path : "-",
            st.replicas[i].vote ? st.replicas[i].vote : "voter");
    }
    put(b, "]}");
}

static void status_json(struct ternd_node *n, struct buf *b)
{
    const struct ternd_opts *o = n->o;
    const char *s = n->services;

    put(b, "{\"node\":");
    put_json_str(b, o->name);
    put(b, ",\"rack\":");
    put_json_str(b, o->rack);
    put(b, ",\"uptime_s\":%.3f,\"pid\":%d,\"version\":\"%s\",\"services\":[",
        (double)(tern_now_ns() - n->started) / 1e9, (int)getpid(), TERN_VERSION);
    for (bool first = true; *s; first = false) {
        size_t k = strcspn(s, ",");

        put(b, "%s\"%.*s\"", first ? "" : ",", (int)k, s);
        s += k + (s[k] == ',');
    }
    put(b, "],\"listen\":[");
    for (unsigned i = 0; i < n->n_listen; i++) {
        put(b, i ? "," : "");
        put_json_str(b, n->listen[i]);
    }
    put(b, "],\"cluster\":");
    cluster_json(n, b);
    put(b, ",\"replication\":");
    repl_json(n->replica, b);
    put(b, ",\"doc_replication\":");
    repl_json(n->doc_replica, b);
    put(b, ",\"peers\":[");
    pthread_mutex_lock(&n->lock);
    for (unsigned i = 0; i < o->n_peers; i++) {
        const struct peer_view *v = &n->view[i];

        put(b, "%s{\"node\":", i ? "," : "");
        put_json_str(b, o->peers[i].name);
        put(b, ",\"rack\":");
        put_json_str(b, o->peers[i].rack);
        put(b, ",\"address\":");
        put_json_str(b, o->peers[i].address);
        put(b, ",\"state\":\"%s\",\"fabric\":", state_names[v->state]);
        if (v->fabric[0])
            put_json_str(b, v->fabric);
        else
            put(b, "null");
        put(b, ",\"policy\":");
        put_json_str(b, v->policy);
        put(b, ",\"calls\":%" PRIu64 ",\"calls_per_s\":%.1f,\"errors\":%" PRIu64
               ",\"bytes\":%" PRIu64 ",\"failovers\":%" PRIu64 ",\"moves\":%" PRIu64
               ",\"credits\":%u,\"rtt_us\":%.1f,\"standby\":%s,\"last_error\":",
            v->calls, v->calls_per_s, v->errors, v->bytes, v->failovers, v->moves, v->credits,
            v->rtt_us, v->standby ? "true" : "false");
        if (v->last_error[0])
            put_json_str(b, v->last_error);
        else
            put(b, "null");
        put(b, "}");
    }
    pthread_mutex_unlock(&n->lock);
    put(b, "]}");
}

static int on_status(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct ternd_node *n = ctx;
    size_t cap = tern_reply_max(req);
    struct buf b;

    (void)data;
    if (len)
        return TERN_EINVAL;
    b = (struct buf){.p = tern_reply_alloc(req, cap), .cap = cap};
    if (!b.p)
        return TERN_ENOMEM;
    status_json(n, &b);
    if (b.full)
        return TERN_EMSGSIZE;        /* more peers than a message holds */
    tern_reply_set_len(req, b.len);
    return 0;
}

static const struct tern_method node_methods[] = {
    {.id = NODE_M_PING, .name = "ping", .handler = on_ping},
    {.id = NODE_M_STATUS, .name = "status", .handler = on_status},
};

/* ---- metrics ---- */

static void metrics_text(struct ternd_node *n, struct buf *b)
{
    const struct ternd_opts *o = n->o;

    put(b, "# HELP tern_uptime_seconds Seconds since ternd started.\n"
           "# TYPE tern_uptime_seconds gauge\ntern_uptime_seconds{node=\"");
    put_label(b, o->name);
    put(b, "\",rack=\"");
    put_label(b, o->rack);
    put(b, "\"} %.3f\n", (double)(tern_now_ns() - n->started) / 1e9);
    static const struct {
        const char *name, *type, *help;
    } m[] = {
        {"tern_peer_up", "gauge", "1 while the session to the peer is up."},
        {"tern_peer_fabric", "gauge", "1 for the fabric the session to the peer runs on."},
        {"tern_peer_calls_total", "counter", "Calls to the peer completed."},
        {"tern_peer_errors_total", "counter", "Calls to the peer that failed."},
        {"tern_peer_bytes_total", "counter", "Bytes to and from the peer."},
        {"tern_peer_failovers_total", "counter", "Moves to a standby path after a failure."},
        {"tern_peer_moves_total", "counter", "Moves back to a better path."},
        {"tern_peer_credits", "gauge", "Calls the peer lets this node have in flight."},
        {"tern_peer_rtt_seconds", "gauge", "Smoothed ping round trip to the peer."},
    };
#if TERN_HAVE_CLUSTER
    if (n->member) {
        struct cl_member_state st;

        cl_member_state(n->member, &st);
        put(b, "# HELP tern_cluster_registered 1 while the node is registered in etcd.\n"
               "# TYPE tern_cluster_registered gauge\ntern_cluster_registered %d\n"
               "# HELP tern_cluster_registrations_total Times the node registered in etcd.\n"
               "# TYPE tern_cluster_registrations_total counter\n"
               "tern_cluster_registrations_total %" PRIu64 "\n",
            st.registered, st.registrations);
        put(b, "# HELP tern_shard_primary 1 while this node is the shard's primary.\n"
               "# TYPE tern_shard_primary gauge\n"
               "# HELP tern_shard_epoch The shard's epoch as this node knows it.\n"
               "# TYPE tern_shard_epoch gauge\n");
        for (unsigned i = 0; i < o->n_shards; i++) {
            struct cl_shard_role r;

            if (cl_member_role(n->member, o->shards[i], &r) < 0)
                continue;
            put(b, "tern_shard_primary{shard=\"");
            put_label(b, o->shards[i]);
            put(b, "\"} %d\ntern_shard_epoch{shard=\"", r.role == CL_ROLE_PRIMARY);
            put_label(b, o->shards[i]);
            put(b, "\"} %" PRIu64 "\n", r.epoch);
        }
    }
#endif
    pthread_mutex_lock(&n->lock);
    for (unsigned k = 0; k < sizeof(m) / sizeof(m[0]); k++) {
        put(b, "# HELP %s %s\n# TYPE %s %s\n", m[k].name, m[k].help, m[k].name, m[k].type);
        for (unsigned i = 0; i < o->n_peers; i++) {
            const struct peer_view *v = &n->view[i];

            if (k == 1 && !v->fabric[0])
                continue;
            put(b, "%s{peer=\"", m[k].name);
            put_label(b, o->peers[i].name);
            put(b, "\",rack=\"");
            put_label(b, o->peers[i].rack);
            if (k == 1) {
                put(b, "\",fabric=\"");
                put_label(b, v->fabric);
            }
            put(b, "\"} ");
            switch (k) {
            case 0: put(b, "%d\n", v->state == PEER_UP); break;
            case 1: put(b, "1\n"); break;
            case 2: put(b, "%" PRIu64 "\n", v->calls); break;
            case 3: put(b, "%" PRIu64 "\n", v->errors); break;
            case 4: put(b, "%" PRIu64 "\n", v->bytes); break;
            case 5: put(b, "%" PRIu64 "\n", v->failovers); break;
            case 6: put(b, "%" PRIu64 "\n", v->moves); break;
            case 7: put(b, "%u\n", v->credits); break;
            default: put(b, "%.6f\n", v->rtt_us / 1e6); break;
            }
        }
    }
    pthread_mutex_unlock(&n->lock);
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_len, void **con_cls)
{
    struct ternd_node *n = cls;
    struct MHD_Response *resp;
    unsigned code = MHD_HTTP_OK;
    enum MHD_Result rc;
    struct buf b = {0};
    char small[64];

    (void)version;
    (void)upload;
    (void)con_cls;
    if (*upload_len)                 /* a body: not ours to read */
        return MHD_NO;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        snprintf(small, sizeof(small), "GET /metrics\n");
    } else if (strcmp(url, "/metrics") != 0) {
        code = MHD_HTTP_NOT_FOUND;
        snprintf(small, sizeof(small), "not found: try /metrics\n");
    } else {
        b.cap = 4096 + (size_t)n->o->n_peers * 2048;
        b.p = malloc(b.cap);
        if (b.p)
            metrics_text(n, &b);
        if (!b.p || b.full) {
            free(b.p);
            return MHD_NO;
        }
    }
    if (code == MHD_HTTP_OK)
        resp = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
    else
        resp = MHD_create_response_from_buffer(strlen(small), small, MHD_RESPMEM_MUST_COPY);
    if (!resp) {
        free(b.p);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type",
                            code == MHD_HTTP_OK ? "text/plain; version=0.0.4" : "text/plain");
    rc = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    return rc;
}

static int start_metrics(struct ternd_node *n, int port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    const union MHD_DaemonInfo *info;

    n->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)port, NULL, NULL,
                              on_http, n, MHD_OPTION_SOCK_ADDR, &sin,
                              MHD_OPTION_CONNECTION_LIMIT, 16u,
                              MHD_OPTION_CONNECTION_TIMEOUT, 5u, MHD_OPTION_END);
    if (!n->mhd)
        return errno ? -errno : TERN_EIO;
    info = MHD_get_daemon_info(n->mhd, MHD_DAEMON_INFO_BIND_PORT);
    n->metrics_port = info ? info->port : port;
    return 0;
}

/* ---- start and stop ---- */

int ternd_node_start(const struct ternd_opts *o, const char *services, struct tern_rpc_ep *ep,
                     struct ternd_node **out)
{
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .mode = TERN_TP_POLL_ADAPTIVE,
                                  .key = o->key_len ? o->key : NULL, .key_len = o->key_len};
    struct ternd_node *n = calloc(1, sizeof(*n));
    sigset_t block, old;
    int rc;

    *out = NULL;
    if (!n)
        return TERN_ENOMEM;
    n->o = o;
    n->started = tern_now_ns();
    n->metrics_port = -1;
    snprintf(n->services, sizeof(n->services), "%s", services);
    pthread_mutex_init(&n->lock, NULL);
    n->policy = o->policy;
    n->policy_gen = 1;
    n->view = calloc(o->n_peers ? o->n_peers : 1, sizeof(*n->view));
    n->run = calloc(o->n_peers ? o->n_peers : 1, sizeof(*n->run));
    if (!n->view || !n->run) {
        ternd_node_stop(n);
        return TERN_ENOMEM;
    }
    for (unsigned i = 0; i < o->n_peers; i++) {
        n->run[i].cfg = &o->peers[i];
        n->run[i].backoff_ms = RETRY_MIN_MS;
    }
    n->def = (struct tern_service){.name = "node", .id = NODE_SERVICE_ID,
                                   .methods = node_methods,
                                   .n_methods = sizeof(node_methods) / sizeof(node_methods[0]),
                                   .ctx = n};
    if ((rc = tern_rpc_register(ep, &n->def)) < 0) {
        ternd_node_stop(n);
        return rc;
    }
    /* The threads leave the signals to the serving thread. */
    sigfillset(&block);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    rc = 0;
    if (o->metrics_port >= 0 && (rc = start_metrics(n, o->metrics_port)) < 0)
        tern_log(TERN_LOG_ERROR, "ternd", "metrics_port 127.0.0.1:%d: %s", o->metrics_port,
                 tern_strerror(rc));
    if (rc == 0 && o->n_peers) {
        rc = tern_rpc_open(&cfg, &n->pep);
        if (rc == 0) {
            rc = -pthread_create(&n->thread, NULL, peers_main, n);
            n->thread_on = rc == 0;
        }
        if (rc < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "peer sessions: %s", tern_strerror(rc));
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) {
        ternd_node_stop(n);
        return rc;
    }
    *out = n;
    return 0;
}

int ternd_node_metrics_port(const struct ternd_node *n)
{
    return n ? n->metrics_port : -1;
}

void ternd_node_set_policy(struct ternd_node *n, const struct ternd_policy *p)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->lock);
    n->policy = *p;
    n->policy_gen++;
    pthread_mutex_unlock(&n->lock);
    if (n->pep)
        tern_rpc_stop(n->pep);       /* the peers thread looks now */
}

void ternd_node_add_listen(struct ternd_node *n, const char *uri)
{
    if (n && n->n_listen < MAX_LISTEN_SHOWN && (n->listen[n->n_listen] = strdup(uri)))
        n->n_listen++;
}

int ternd_node_join(struct ternd_node *n)
{
#if TERN_HAVE_CLUSTER
    const struct ternd_opts *o = n->o;
    struct buf b = {.cap = 4096};
    int rc;

    if (!o->etcd)
        return 0;
    b.p = malloc(b.cap);
    /* What the node says of itself: how to reach it and what it hosts. */
    put(&b, "{\"node\":");
    put_json_str(&b, o->name);
    put(&b, ",\"rack\":");
    put_json_str(&b, o->rack);
    put(&b, ",\"pid\":%d,\"version\":\"%s\",\"services\":[", (int)getpid(), TERN_VERSION);
    for (const char *s = n->services; *s;) {
        size_t k = strcspn(s, ",");

        put(&b, "%s\"%.*s\"", s == n->services ? "" : ",", (int)k, s);
        s += k + (s[k] == ',');
    }
    put(&b, "],\"listen\":[");
    for (unsigned i = 0; i < n->n_listen; i++) {
        put(&b, i ? "," : "");
        put_json_str(&b, n->listen[i]);
    }
    put(&b, "]");
    if (n->mongo[0]) {
        put(&b, ",\"mongo\":");
        put_json_str(&b, n->mongo);
    }
    put(&b, "}");
    if (b.full || !b.p) {
        free(b.p);
        return TERN_ENOMEM;
    }
    {
        struct cl_member_config mc = {.endpoints = o->etcd, .prefix = o->prefix,
                                      .name = o->name, .value = b.p, .ttl_s = o->lease_ttl,
                                      .n_shards = o->n_shards};

        for (unsigned i = 0; i < o->n_shards; i++)
            mc.shards[i] = o->shards[i];
        rc = cl_member_start(&mc, &n->member);
    }
    free(b.p);
    return rc;
#else
    return n->o->etcd ? TERN_ENOTSUP : 0;
#endif
}

struct cl_member *ternd_node_member(struct ternd_node *n)
{
#if TERN_HAVE_CLUSTER
    return n ? n->member : NULL;
#else
    (void)n;
    return NULL;
#endif
}

void ternd_node_set_replica(struct ternd_node *n, struct ternd_replica *r)
{
    n->replica = r;
}

void ternd_node_set_doc_replica(struct ternd_node *n, struct ternd_replica *r)
{
    n->doc_replica = r;
}

void ternd_node_set_mongo(struct ternd_node *n, const char *addr)
{
    snprintf(n->mongo, sizeof(n->mongo), "%s", addr);
}

void ternd_node_stop(struct ternd_node *n)
{
    if (!n)
        return;
    n->stop = 1;
#if TERN_HAVE_CLUSTER
    cl_member_stop(n->member);      /* the key goes with the lease */
#endif
    if (n->thread_on) {
        tern_rpc_stop(n->pep);
        pthread_join(n->thread, NULL);
    }
    if (n->pep)
        tern_rpc_close(n->pep);
    if (n->mhd)
        MHD_stop_daemon(n->mhd);
    for (unsigned i = 0; i < n->n_listen; i++)
        free(n->listen[i]);
    pthread_mutex_destroy(&n->lock);
    free(n->view);
    free(n->run);
    free(n);
}
