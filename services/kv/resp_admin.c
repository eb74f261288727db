/* The RESP gateway's server commands: INFO, CONFIG, SLOWLOG, AUTH, and the
 * refusal of MONITOR. What they report uses Redis's field names where the
 * meaning is the same, so that redis-cli --stat and exporters read it;
 * tern's own figures carry a tern_ prefix. None of this is on the data
 * path.
 */
#include <limits.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp.h"
#include "resp_internal.h"
#include "rpc.h"
#include "tern_config.h"

/* ---- INFO ---- */

/* INFO text, built on the stack. */
struct text {
    char buf[8192];
    size_t len;
};

__attribute__((format(printf, 2, 3)))
static void text_add(struct text *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->len >= sizeof(t->buf))
        return;
    va_start(ap, fmt);
    n = vsnprintf(t->buf + t->len, sizeof(t->buf) - t->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len += (size_t)n < sizeof(t->buf) - t->len ? (size_t)n : sizeof(t->buf) - t->len - 1;
}

static void text_section(struct text *t, const char *name)
{
    text_add(t, "%s# %s\r\n", t->len ? "\r\n" : "", name);
}

/* Keys removed at their deadline: strings and collections. */
static uint64_t expired(const struct resp_gw *gw, const struct kvs_stats *st)
{
    return st->expired + (gw->coll ? kvc_expired(gw->coll) : 0);
}

static bool info_wants(const struct cmd *m, const char *section)
{
    if (m->argc == 1)
        return true;
    for (size_t i = 1; i < m->argc; i++)
        if (arg_is(m, i, section) || arg_is(m, i, "all") || arg_is(m, i, "everything") ||
            arg_is(m, i, "default"))
            return true;
    return false;
}

/* Resident bytes of this process (/proc/self/statm), 0 if unknown. */
static uint64_t rss_bytes(void)
{
    unsigned long size, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* "1.50M", as Redis's *_human fields. */
static void human(char *out, size_t cap, uint64_t v)
{
    static const char units[] = "BKMGT";
    double d = (double)v;
    int u = 0;

    while (d >= 1024 && u < 4) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, cap, "%lluB", (unsigned long long)v);
    else
        snprintf(out, cap, "%.2f%c", d, units[u]);
}

/* Commands a second over the last 1.6 s, from samples taken every 100 ms
 * by the expiry cycle's beat (resp_admin_sample). */
static uint64_t ops_per_sec(const struct resp_gw *gw)
{
    unsigned n = gw->ops_n < RESP_OPS_SAMPLES ? gw->ops_n : RESP_OPS_SAMPLES;
    unsigned newest = (gw->ops_n + RESP_OPS_SAMPLES - 1) % RESP_OPS_SAMPLES;
    unsigned oldest = (gw->ops_n + RESP_OPS_SAMPLES - n) % RESP_OPS_SAMPLES;
    uint64_t dt;

    if (n < 2)
        return 0;
    dt = gw->ops_ns[newest] - gw->ops_ns[oldest];
    return dt ? (gw->ops_cmds[newest] - gw->ops_cmds[oldest]) * 1000000000ull / dt : 0;
}

void resp_admin_sample(struct resp_gw *gw, uint64_t now_ns)
{
    unsigned i = gw->ops_n % RESP_OPS_SAMPLES;

    gw->ops_ns[i] = now_ns;
    gw->ops_cmds[i] = gw->total_cmds;
    gw->ops_n++;
}

void resp_cmd_info(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct kvs_stats st;
    struct text t = {.len = 0};

    kvs_get_stats(gw->store, &st);
    if (info_wants(m, "server")) {
        text_section(&t, "Server");
        text_add(&t, "redis_version:7.0.0\r\nredis_mode:standalone\r\ntern_version:%s\r\n"
                 "os:Linux\r\narch_bits:%zu\r\nmultiplexing_api:epoll\r\nprocess_id:%ld\r\n"
                 "tcp_port:%u\r\nuptime_in_seconds:%lld\r\nuptime_in_days:%lld\r\nhz:10\r\n",
                 TERN_VERSION, sizeof(void *) * 8, (long)getpid(), gw->port,
                 (long long)(time(NULL) - gw->started),
                 (long long)(time(NULL) - gw->started) / 86400);
    }
    if (info_wants(m, "clients")) {
        size_t pending = 0;

        for (const struct client *k = gw->clients; k; k = k->next)
            pending += resp_out_pending(k);
        text_section(&t, "Clients");
        text_add(&t, "connected_clients:%u\r\nmaxclients:%u\r\nblocked_clients:0\r\n"
                 "tern_output_limit:%zu\r\ntern_output_pending:%zu\r\n"
                 "tern_output_buffer_peak:%zu\r\n", gw->n_clients, gw->max_clients,
                 gw->max_output, pending, gw->out_peak);
    }
    if (info_wants(m, "memory")) {
        /* used_memory: what the allocator holds for this process (the
         * index, buffers); the pool is a mapped file, reported apart. */
        struct mallinfo2 mi = mallinfo2();
        uint64_t used = mi.uordblks + mi.hblkhd, rss = rss_bytes();

        /* An allocator that keeps no such count (a sanitizer's) says 0:
         * the resident size is the nearest truth then. */
        if (!used)
            used = rss;
        char h_used[32], h_rss[32], h_peak[32];

        if (used > gw->mem_peak)
            gw->mem_peak = used;
        human(h_used, sizeof(h_used), used);
        human(h_rss, sizeof(h_rss), rss);
        human(h_peak, sizeof(h_peak), gw->mem_peak);
        text_section(&t, "Memory");
        text_add(&t, "used_memory:%llu\r\nused_memory_human:%s\r\nused_memory_rss:%llu\r\n"
                 "used_memory_rss_human:%s\r\nused_memory_peak:%llu\r\n"
                 "used_memory_peak_human:%s\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\n"
                 "maxmemory_policy:noeviction\r\nmem_fragmentation_ratio:%.2f\r\n"
                 "mem_allocator:libc\r\ntern_pool_bytes:%llu\r\ntern_pool_bytes_live:%llu\r\n",
                 (unsigned long long)used, h_used, (unsigned long long)rss, h_rss,
                 (unsigned long long)gw->mem_peak, h_peak, used ? (double)rss / (double)used : 0,
                 (unsigned long long)st.pool.size, (unsigned long long)st.pool.bytes_live);
    }
    if (info_wants(m, "persistence")) {
        text_section(&t, "Persistence");
        text_add(&t, "loading:0\r\naof_enabled:0\r\nrdb_changes_since_last_save:0\r\n"
                 "tern_pool_bytes:%llu\r\ntern_pool_seg_bytes:%u\r\ntern_pool_segs:%u\r\n"
                 "tern_pool_segs_used:%u\r\ntern_pool_bytes_committed:%llu\r\n"
                 "tern_pool_bytes_live:%llu\r\ntern_pool_is_pmem:%d\r\ntern_syncs:%llu\r\n"
                 "tern_segs_cleaned:%llu\r\n",
                 (unsigned long long)st.pool.size, st.pool.seg_size, st.pool.n_segs,
                 st.pool.segs_used, (unsigned long long)st.pool.bytes_committed,
                 (unsigned long long)st.pool.bytes_live, st.pool.is_pmem ? 1 : 0,
                 (unsigned long long)st.syncs, (unsigned long long)st.segs_cleaned);
    }
    if (info_wants(m, "stats")) {
        text_section(&t, "Stats");
        text_add(&t, "total_connections_received:%llu\r\ntotal_commands_processed:%llu\r\n"
                 "instantaneous_ops_per_sec:%llu\r\ntotal_net_input_bytes:%llu\r\n"
                 "total_net_output_bytes:%llu\r\nrejected_connections:%llu\r\n"
                 "expired_keys:%llu\r\nevicted_keys:0\r\n"
                 "keyspace_hits:%llu\r\nkeyspace_misses:%llu\r\ntern_coalesced_waits:%llu\r\n"
                 "tern_auth_failures:%llu\r\n",
                 (unsigned long long)gw->total_conns, (unsigned long long)gw->total_cmds,
                 (unsigned long long)ops_per_sec(gw), (unsigned long long)gw->net_in,
                 (unsigned long long)gw->net_out, (unsigned long long)gw->rejected,
                 (unsigned long long)(expired(gw, &st) - gw->base_expired),
                 (unsigned long long)(st.hits - gw->base_hits),
                 (unsigned long long)((st.gets - st.hits) - gw->base_misses),
                 (unsigned long long)gw->coalesced_waits,
                 (unsigned long long)gw->auth_failures);
    }
    if (info_wants(m, "replication")) {
        /* The gateway serves only stores that are not replicated. */
        text_section(&t, "Replication");
        text_add(&t, "role:master\r\nconnected_slaves:0\r\nmaster_repl_offset:0\r\n");
    }
    if (info_wants(m, "cpu")) {
        struct rusage self, kids;

        getrusage(RUSAGE_SELF, &self);
        getrusage(RUSAGE_CHILDREN, &kids);
        text_section(&t, "CPU");
        text_add(&t, "used_cpu_sys:%ld.%06ld\r\nused_cpu_user:%ld.%06ld\r\n"
                 "used_cpu_sys_children:%ld.%06ld\r\nused_cpu_user_children:%ld.%06ld\r\n",
                 (long)self.ru_stime.tv_sec, (long)self.ru_stime.tv_usec,
                 (long)self.ru_utime.tv_sec, (long)self.ru_utime.tv_usec,
                 (long)kids.ru_stime.tv_sec, (long)kids.ru_stime.tv_usec,
                 (long)kids.ru_utime.tv_sec, (long)kids.ru_utime.tv_usec);
    }
    if (info_wants(m, "keyspace")) {
        text_section(&t, "Keyspace");
        /* Like Redis, an empty database is not listed. */
        uint64_t colls = gw->coll ? kvc_count(gw->coll) : 0;

        if (st.keys + colls)
            text_add(&t, "db0:keys=%llu,expires=%llu,avg_ttl=0\r\n",
                     (unsigned long long)(st.keys + colls),
                     (unsigned long long)(kvs_expiring(gw->store) +
                                          (gw->coll ? kvc_expiring(gw->coll) : 0)));
    }
    resp_out_bulk(c, t.buf, t.len);
}

/* ---- CONFIG ---- */

enum { P_RO, P_INT, P_PASS };

static const struct param {
    const char *name;
    int kind;
    long long lo, hi;           /* P_INT: the values allowed */
} params[] = {
    {"save", P_RO, 0, 0},
    {"appendonly", P_RO, 0, 0},
    {"databases", P_RO, 0, 0},
    {"maxmemory", P_RO, 0, 0},
    {"port", P_RO, 0, 0},
    {"bind", P_RO, 0, 0},
    {"hz", P_RO, 0, 0},
    {"timeout", P_RO, 0, 0},
    {"proto-max-bulk-len", P_RO, 0, 0},
    {"maxclients", P_INT, 1, 1000000},
    {"slowlog-log-slower-than", P_INT, -1, LLONG_MAX / 1000},
    {"slowlog-max-len", P_INT, 0, RESP_SLOW_MAX},
    {"requirepass", P_PASS, 0, 0},
    /* tern's own: the output cap (resp_config.max_output) and coalescing */
    {"tern-output-limit", P_INT, 4096, 1ll << 40},
    {"tern-coalesce-us", P_INT, 0, RESP_COALESCE_MAX_US},
};
#define N_PARAMS (sizeof(params) / sizeof(params[0]))

/* The value of params[k] as CONFIG GET shows it. */
static void param_value(const struct resp_gw *gw, size_t k, char *out, size_t cap)
{
    const char *name = params[k].name;

    if (!strcmp(name, "save") || !strcmp(name, "requirepass"))
        snprintf(out, cap, "%s", !strcmp(name, "save") ? "" : gw->password);
    else if (!strcmp(name, "appendonly"))
        snprintf(out, cap, "no");
    else if (!strcmp(name, "databases"))
        snprintf(out, cap, "1");
    else if (!strcmp(name, "maxmemory") || !strcmp(name, "timeout"))
        snprintf(out, cap, "0");
    else if (!strcmp(name, "port"))
        snprintf(out, cap, "%u", gw->port);
    else if (!strcmp(name, "bind"))
        snprintf(out, cap, "%s", gw->host);
    else if (!strcmp(name, "hz"))
        snprintf(out, cap, "10");
    else if (!strcmp(name, "proto-max-bulk-len"))
        snprintf(out, cap, "%zu", gw->max_request);
    else if (!strcmp(name, "maxclients"))
        snprintf(out, cap, "%u", gw->max_clients);
    else if (!strcmp(name, "slowlog-log-slower-than"))
        snprintf(out, cap, "%lld", gw->slow_us);
    else if (!strcmp(name, "tern-output-limit"))
        snprintf(out, cap, "%zu", gw->max_output);
    else if (!strcmp(name, "tern-coalesce-us"))
        snprintf(out, cap, "%u", gw->coalesce_us);
    else
        snprintf(out, cap, "%u", gw->slow_max);
}

static const struct param *param_named(const char *s, size_t n)
{
    for (size_t k = 0; k < N_PARAMS; k++)
        if (strlen(params[k].name) == n && strncasecmp(s, params[k].name, n) == 0)
            return &params[k];
    return NULL;
}

static void config_get(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool match[N_PARAMS] = {false};
    char value[RESP_PASSWORD_MAX + 32];
    long long n = 0;

    for (size_t i = 2; i < m->argc; i++)
        for (size_t k = 0; k < N_PARAMS; k++)
            if (!match[k] && resp_glob_nocase(arg(m, i), arglen(m, i), params[k].name,
                                              strlen(params[k].name))) {
                match[k] = true;
                n++;
            }
    resp_out_num(c, '*', 2 * n);
    for (size_t k = 0; k < N_PARAMS; k++)
        if (match[k]) {
            param_value(gw, k, value, sizeof(value));
            resp_out_str(c, params[k].name);
            resp_out_str(c, value);
        }
}

static void out_set_failed(struct client *c, const struct cmd *m, size_t i, const char *why)
{
    resp_out_err(c, "ERR CONFIG SET failed (possibly related to argument '%.*s') - %s",
                 (int)(arglen(m, i) < 64 ? arglen(m, i) : 64), arg(m, i), why);
}

/* CONFIG SET name value [name value ...]: every pair is checked before
 * any is applied, as Redis 7 does. */
static void config_set(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long v;

    if (m->argc < 4 || m->argc % 2) {
        OUT_LIT(c, "-ERR wrong number of arguments for 'config|set' command\r\n");
        return;
    }
    for (size_t i = 2; i < m->argc; i += 2) {
        const struct param *p = param_named(arg(m, i), arglen(m, i));

        if (!p) {
            resp_out_err(c, "ERR Unknown option or number of arguments for CONFIG SET - '%.*s'",
                         (int)(arglen(m, i) < 64 ? arglen(m, i) : 64), arg(m, i));
            return;
        }
        if (p->kind == P_RO) {
            out_set_failed(c, m, i, "can't set immutable config");
            return;
        }
        if (p->kind == P_INT && !resp_ll_parse(arg(m, i + 1), arglen(m, i + 1), &v)) {
            out_set_failed(c, m, i, "argument couldn't be parsed into an integer");
            return;
        }
        if (p->kind == P_INT && (v < p->lo || v > p->hi)) {
            out_set_failed(c, m, i, "argument must be between the limits shown by CONFIG HELP");
            return;
        }
        if (p->kind == P_PASS && arglen(m, i + 1) >= RESP_PASSWORD_MAX) {
            out_set_failed(c, m, i, "password too long");
            return;
        }
    }
    for (size_t i = 2; i < m->argc; i += 2) {
        const struct param *p = param_named(arg(m, i), arglen(m, i));

        if (p->kind == P_PASS) {
            memcpy(gw->password, arg(m, i + 1), arglen(m, i + 1));
            gw->password[arglen(m, i + 1)] = '\0';
            c->authed = true;   /* the one who set it is in */
            continue;
        }
        resp_ll_parse(arg(m, i + 1), arglen(m, i + 1), &v);
        if (!strcmp(p->name, "maxclients"))
            gw->max_clients = (unsigned)v;
        else if (!strcmp(p->name, "slowlog-log-slower-than"))
            gw->slow_us = v;
        else if (!strcmp(p->name, "tern-output-limit"))
            gw->max_output = (size_t)v;     /* replies already queued stay */
        else if (!strcmp(p->name, "tern-coalesce-us"))
            gw->coalesce_us = (unsigned)v;
        else
            resp_slow_resize(gw, (unsigned)v);
    }
    OUT_LIT(c, "+OK\r\n");
}

static const char *const config_help[] = {
    "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET <pattern>", "    Return parameters matching the glob-like <pattern> and their values.",
    "SET <directive> <value> [<directive> <value> ...]",
    "    Set the configuration <directive> to <value>. tern sets maxclients (1..1000000),",
    "    slowlog-log-slower-than (microseconds, -1 off), slowlog-max-len (0..1024),",
    "    requirepass, tern-output-limit (a client's unsent reply bytes, 4096..2^40) and",
    "    tern-coalesce-us (0..1000000); the others CONFIG GET shows are fixed.",
    "RESETSTAT", "    Reset statistics reported by the INFO command.",
    "HELP", "    Print this help.",
};

void resp_cmd_config(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    if (arg_is(m, 1, "GET")) {
        if (m->argc < 3)
            OUT_LIT(c, "-ERR wrong number of arguments for 'config|get' command\r\n");
        else
            config_get(gw, c, m);
    } else if (arg_is(m, 1, "SET")) {
        config_set(gw, c, m);
    } else if (arg_is(m, 1, "RESETSTAT") && m->argc == 2) {
        struct kvs_stats st;

        kvs_get_stats(gw->store, &st);
        gw->total_conns = gw->total_cmds = gw->net_in = gw->net_out = gw->rejected = 0;
        gw->coalesced_waits = 0;
        gw->base_expired = expired(gw, &st);
        gw->base_hits = st.hits;
        gw->base_misses = st.gets - st.hits;
        gw->ops_n = 0;
        OUT_LIT(c, "+OK\r\n");
    } else if (arg_is(m, 1, "HELP") && m->argc == 2) {
        resp_out_lines(c, config_help, sizeof(config_help) / sizeof(config_help[0]));
    } else {
        resp_out_err(c, "ERR unknown subcommand or wrong number of arguments for '%.*s'. Try "
                     "CONFIG HELP.", (int)(arglen(m, 1) < 64 ? arglen(m, 1) : 64), arg(m, 1));
    }
}

/* ---- SLOWLOG ---- */

void resp_slow_resize(struct resp_gw *gw, unsigned max)
{
    free(gw->slow);
    gw->slow = NULL;
    gw->slow_n = gw->slow_head = 0;
    gw->slow_max = max;
}

void resp_slow_note(struct resp_gw *gw, const struct client *c, const struct cmd *m,
                    uint64_t us)
{
    struct resp_slow *e;

    if (!gw->slow_max)
        return;
    if (!gw->slow) {
        gw->slow = calloc(gw->slow_max, sizeof(*gw->slow));
        if (!gw->slow)
            return;     /* the log is best effort: nothing else depends on it */
    }
    e = &gw->slow[gw->slow_head];
    gw->slow_head = (gw->slow_head + 1) % gw->slow_max;
    if (gw->slow_n < gw->slow_max)
        gw->slow_n++;
    *e = (struct resp_slow){.id = gw->slow_next_id++, .at = time(NULL), .us = us,
                            .argc = (uint32_t)m->argc};
    for (size_t i = 0; i < m->argc && i < RESP_SLOW_ARGS; i++) {
        size_t n = arglen(m, i) < RESP_SLOW_ARG_BYTES ? arglen(m, i) : RESP_SLOW_ARG_BYTES;

        memcpy(e->arg[i], arg(m, i), n);
        e->len[i] = (uint16_t)n;
        e->full[i] = (uint32_t)arglen(m, i);
        e->n++;
    }
    snprintf(e->addr, sizeof(e->addr), "%s", c->addr);
    snprintf(e->name, sizeof(e->name), "%s", c->name);
}

/* One entry, as Redis 7 gives it: id, Unix time, microseconds, the
 * arguments (at most 32, each at most 128 bytes, the cut said), the
 * client's address and name. */
static void slow_entry(struct client *c, const struct resp_slow *e)
{
    char more[64];
    size_t shown = e->argc > RESP_SLOW_ARGS ? RESP_SLOW_ARGS - 1 : e->n;

    OUT_LIT(c, "*6\r\n");
    resp_out_num(c, ':', (long long)e->id);
    resp_out_num(c, ':', (long long)e->at);
    resp_out_num(c, ':', (long long)e->us);
    resp_out_num(c, '*', (long long)(shown + (e->argc > shown)));
    for (size_t i = 0; i < shown; i++) {
        if (e->full[i] > e->len[i]) {
            char buf[RESP_SLOW_ARG_BYTES + 48];
            int n = snprintf(buf, sizeof(buf), "%.*s... (%u more bytes)", (int)e->len[i],
                             e->arg[i], e->full[i] - e->len[i]);

            resp_out_bulk(c, buf, (size_t)n);
        } else {
            resp_out_bulk(c, e->arg[i], e->len[i]);
        }
    }
    if (e->argc > shown) {
        snprintf(more, sizeof(more), "... (%u more arguments)", e->argc - (unsigned)shown);
        resp_out_str(c, more);
    }
    resp_out_str(c, e->addr);
    resp_out_str(c, e->name);
}

static const char *const slowlog_help[] = {
    "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET [<count>]", "    Return top <count> entries from the slowlog (default: 10, -1 means all).",
    "    Entries are made of: id, timestamp, time in microseconds, arguments array,",
    "    client IP and port, client name",
    "LEN", "    Return the length of the slowlog.",
    "RESET", "    Reset the slowlog.",
    "HELP", "    Print this help.",
};

void resp_cmd_slowlog(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long want = 10;

    if (arg_is(m, 1, "GET") && m->argc <= 3) {
        if (m->argc == 3 && (!resp_ll_parse(arg(m, 2), arglen(m, 2), &want) || want < -1)) {
            OUT_LIT(c, "-ERR count should be greater than or equal to -1\r\n");
            return;
        }
        if (want == -1 || want > (long long)gw->slow_n)
            want = gw->slow_n;
        resp_out_num(c, '*', want);
        /* Newest first. */
        for (long long i = 0; i < want; i++)
            slow_entry(c, &gw->slow[(gw->slow_head + gw->slow_max - 1 - (unsigned)i) %
                                    gw->slow_max]);
    } else if (arg_is(m, 1, "LEN") && m->argc == 2) {
        resp_out_num(c, ':', gw->slow_n);
    } else if (arg_is(m, 1, "RESET") && m->argc == 2) {
        gw->slow_n = gw->slow_head = 0;
        OUT_LIT(c, "+OK\r\n");
    } else if (arg_is(m, 1, "HELP") && m->argc == 2) {
        resp_out_lines(c, slowlog_help, sizeof(slowlog_help) / sizeof(slowlog_help[0]));
    } else {
        resp_out_err(c, "ERR unknown subcommand or wrong number of arguments for '%.*s'. Try "
                     "SLOWLOG HELP.", (int)(arglen(m, 1) < 64 ? arglen(m, 1) : 64), arg(m, 1));
    }
}

/* ---- AUTH and MONITOR ---- */

/* Compared in time that does not depend on where they differ. */
static bool same_secret(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned char d = alen != blen;

    for (size_t i = 0; i < alen; i++)
        d |= (unsigned char)(a[i] ^ b[i < blen ? i : 0]);
    return d == 0 && blen;
}

bool resp_auth_check(struct resp_gw *gw, struct client *c, const char *user, size_t ulen,
                     const char *pass, size_t plen)
{
    if (!gw->password[0]) {
        OUT_LIT(c, "-ERR AUTH <password> called without any password configured for the "
                   "default user. Are you sure your configuration is correct?\r\n");
        return false;
    }
    if ((user && (ulen != 7 || strncmp(user, "default", 7) != 0)) ||
        !same_secret(pass, plen, gw->password)) {
        gw->auth_failures++;
        OUT_LIT(c, "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
        return false;
    }
    c->authed = true;
    return true;
}

void resp_cmd_auth(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool two = m->argc == 3;

    if (m->argc > 3) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    if (resp_auth_check(gw, c, two ? arg(m, 1) : NULL, two ? arglen(m, 1) : 0,
                        arg(m, m->argc - 1), arglen(m, m->argc - 1)))
        OUT_LIT(c, "+OK\r\n");
}

void resp_cmd_monitor(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    OUT_LIT(c, "-ERR MONITOR is not served by tern's gateway: it would copy every command "
               "of every client to one socket; use SLOWLOG, INFO or CLIENT LIST\r\n");
}
