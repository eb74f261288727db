/* rpcbench kv: YCSB core workloads on the key-value service.
 *
 * Per fabric, a child process creates the service on a fresh pool file,
 * registers it (and rpcbench's bench service, for server RSS and the echo
 * baseline) and listens. This process opens the kv client on it, loads
 * `records` keys (untimed, async puts), then times `iters` operations of
 * each workload with `window` in flight into a histogram and prints a row
 * as echo does. GETs are checked (status, length, and the key number the
 * first 8 bytes of every value carry); any failed operation fails the run.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv.h"
#include "kv_service_internal.h"
#include "kv/kv_store.h"
#include "kv/kv_wire.h"
#include "kvbench.h"
#include "opt.h"
#include "spawn.h"
#include "ycsb.h"

#define KV_SWEEP 16
#define KV_LOAD_WINDOW 32
#define KV_PATHS 4                   /* rpc, onesided, auto, push */
#define KV_TIMEOUT_NS (10ull * 1000000000u)
#define KV_CONNECT_NS (5ull * 1000000000u)
#define KV_MAX_ERRORS 100
#define MIB (1ull << 20)

struct kv_opts {
    const char *fabric, *pool_dir;
    const struct ycsb_workload *workloads[KV_SWEEP];
    unsigned n_workloads;
    bool zipfian, json, baseline;
    uint64_t records, iters, pool_size;
    size_t sizes[KV_SWEEP];
    unsigned n_sizes;
    unsigned windows[KV_SWEEP];
    unsigned n_windows;
    size_t key_size;
    int cpu_client, cpu_server;
    enum tern_kv_path paths[KV_PATHS];
    unsigned n_paths;
    unsigned cache;              /* one-sided GET cache entries */
    bool append_only;            /* server: no in-place updates */
};

static const char *path_name(enum tern_kv_path p)
{
    return p == TERN_KV_PATH_ONESIDED ? "onesided"
           : p == TERN_KV_PATH_AUTO   ? "auto"
           : p == TERN_KV_PATH_PUSH   ? "push"
                                      : "rpc";
}

static uint64_t warmup_of(uint64_t iters)
{
    return iters / 10 < 10000 ? iters / 10 : 10000;
}

static size_t max_value(const struct kv_opts *o)
{
    size_t m = 0;

    for (unsigned i = 0; i < o->n_sizes; i++)
        if (o->sizes[i] > m)
            m = o->sizes[i];
    return m;
}

/* Keys a value size's runs may insert beyond `records` (workload D): at
 * most every operation of every D run. */
static uint64_t max_inserts(const struct kv_opts *o)
{
    uint64_t n = 0;

    for (unsigned i = 0; i < o->n_workloads; i++)
        if (o->workloads[i]->insert > 0)
            n += (uint64_t)o->n_windows * (o->iters + warmup_of(o->iters));
    return n;
}

static struct tern_rpc_config kv_rpc_config(const struct kv_opts *o)
{
    size_t need = max_value(o) + o->key_size + 4096;

    return (struct tern_rpc_config){
        .mode = TERN_TP_POLL_BUSY,
        .max_msg = need < MIB ? MIB : need,
        .credits = 256,
    };
}

/* ---- server ---- */

struct kv_server_args {
    const struct kv_opts *o;
    const char *listen, *pool_path;
    uint64_t pool_size;
    uint32_t seg_size;
    bool force_pmem;
};

static struct tern_rpc_ep *kv_server_ep;
static volatile sig_atomic_t kv_server_stop;

static void kv_on_signal(int sig)
{
    kv_server_stop = 1;
}

/* Reports "URI\0flush" or "URI\0msync" (how the pool makes writes durable). */
static int kv_server_child(void *arg, int fd)
{
    const struct kv_server_args *a = arg;
    struct tern_kv_service_opts so = {.pool_path = a->pool_path, .pool_size = a->pool_size,
                                      .seg_size = a->seg_size,
                                      .append_only = a->o->append_only};
    struct tern_rpc_config cfg = kv_rpc_config(a->o);
    struct tern_kv_service *svc = NULL;
    struct kvs_stats st;
    char msg[200], bound[160];
    int rc, n;

    bench_pin(a->o->cpu_server);
    /* tmpfs stands in for PM here: libpmem then flushes cache lines
     * instead of calling msync. */
    if (a->force_pmem)
        setenv("PMEM_IS_PMEM_FORCE", "1", 1);
    rc = tern_kv_service_open(&so, &svc);
    if (rc < 0) {
        fprintf(stderr, "rpcbench kv server: %s: %s\n", a->pool_path, tern_strerror(rc));
        goto fail;
    }
    rc = tern_rpc_open(&cfg, &kv_server_ep);
    if (rc == 0)
        rc = tern_rpc_register(kv_server_ep, tern_kv_service_def(svc));
    if (rc == 0)
        rc = tern_rpc_register(kv_server_ep, &bench_service);
    if (rc == 0)
        rc = tern_rpc_listen(kv_server_ep, a->listen, bound, sizeof(bound));
    if (rc == 0)
        rc = tern_kv_service_enable_onesided(svc, kv_server_ep, NULL);
    if (rc < 0) {
        fprintf(stderr, "rpcbench kv server: %s: %s\n", a->listen, tern_strerror(rc));
        goto fail;
    }
    kvs_get_stats(kv_service_store(svc), &st);
    signal(SIGTERM, kv_on_signal);
    signal(SIGINT, kv_on_signal);
    n = snprintf(msg, sizeof(msg), "%s%c%s", bound, 0, st.pool.is_pmem ? "flush" : "msync");
    if (write(fd, msg, (size_t)n + 1) != n + 1)
        goto fail;
    close(fd);
    bench_serve_busy(kv_server_ep, &kv_server_stop);
    tern_rpc_close(kv_server_ep);
    tern_kv_service_close(svc);
    return 0;
fail:
    if (kv_server_ep)
        tern_rpc_close(kv_server_ep);
    if (svc)
        tern_kv_service_close(svc);
    (void)!write(fd, "-", 1);
    return 1;
}

/* ---- client ---- */

struct kv_run;

struct kv_slot {
    struct kv_run *r;
    uint64_t start, keynum;
    enum ycsb_op op;
    bool put_phase;              /* the write (of an update, insert, RMW) is next */
    char *key;
    uint8_t *val;
};

struct kv_run {
    struct tern_kv *kv;
    const struct ycsb_workload *w;   /* NULL: the load phase */
    size_t vsize, klen;
    uint64_t issued, done, warmup, target, t0;
    unsigned inflight;               /* slots with an operation under way */
    uint64_t errors;
    int first_error;
    const char *first_what;
    uint64_t first_key;
    bool stop;
    struct hist *hist;
    struct ycsb_rng *rng;
    struct ycsb_scrambled *zipf;     /* NULL: uniform */
    struct ycsb_latest *latest;
    uint64_t records;                /* A, B, C, F, get, put: keys [0, records) */
    uint64_t load_next;
    uint64_t insert_next, acked;     /* D: keys [0, acked] are readable */
    uint64_t ack_base, ack_cap;
    uint8_t *ack_bits;
    struct kv_slot *slots, **pending, **retry, **ready;
    unsigned n_slots, n_pending, n_ready;
};

static void kv_error(struct kv_run *r, struct kv_slot *sl, int status, const char *what)
{
    if (!r->errors++) {
        r->first_error = status;
        r->first_what = what;
        r->first_key = sl->keynum;
    }
    if (r->errors >= KV_MAX_ERRORS)
        r->stop = true;
}

static void kv_make_key(struct kv_run *r, struct kv_slot *sl)
{
    snprintf(sl->key, r->klen + 1, "user%0*llu", (int)(r->klen - 4),
             (unsigned long long)sl->keynum);
}

/* Every value carries its key's number in its first 8 bytes. */
static void kv_stamp(struct kv_run *r, struct kv_slot *sl)
{
    if (r->vsize >= 8)
        memcpy(sl->val, &sl->keynum, 8);
    if (r->vsize > 8)
        sl->val[8]++;
}

static uint64_t kv_pick(struct kv_run *r)
{
    if (r->w->latest)
        return ycsb_latest_next(r->latest, r->rng, r->acked);
    if (r->zipf)
        return ycsb_scrambled_next(r->zipf, r->rng);
    return ycsb_rng_below(r->rng, r->records);
}

static void kv_ack(struct kv_run *r, uint64_t keynum)
{
    uint64_t i = keynum - r->ack_base;

    if (i >= r->ack_cap)
        return;
    r->ack_bits[i / 8] |= (uint8_t)(1u << (i % 8));
    for (i = r->acked + 1 - r->ack_base;
         i < r->ack_cap && (r->ack_bits[i / 8] & (1u << (i % 8))); i++)
        r->acked++;
}

static void kv_send(struct kv_slot *sl);

static void kv_start(struct kv_slot *sl, uint64_t now)
{
    struct kv_run *r = sl->r;

    sl->start = now;
    if (!r->w) {
        sl->op = YCSB_INSERT;
        sl->keynum = r->load_next++;
    } else {
        sl->op = ycsb_next_op(r->w, r->rng);
        sl->keynum = sl->op == YCSB_INSERT ? r->insert_next++ : kv_pick(r);
    }
    sl->put_phase = sl->op == YCSB_UPDATE || sl->op == YCSB_INSERT;
    kv_make_key(r, sl);
    if (sl->put_phase)
        kv_stamp(r, sl);
    kv_send(sl);
}

static void kv_complete(struct kv_slot *sl)
{
    struct kv_run *r = sl->r;
    uint64_t now = tern_now_ns();

    if (r->done++ >= r->warmup)
        hist_add(r->hist, now - sl->start);
    if (r->done == r->warmup)
        r->t0 = now;
    /* The completion time is the next operation's start, as echo does. The
     * start waits for kv_drive: a one-sided GET can complete inside the
     * call that issued it, and starting the next one from here would nest
     * a call per operation. */
    if (r->issued < r->target && !r->stop) {
        r->issued++;
        sl->start = now;
        r->ready[r->n_ready++] = sl;
    } else {
        r->inflight--;
    }
}

static void kv_on_put(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct kv_slot *sl = arg;
    struct kv_run *r = sl->r;

    if (status < 0)
        kv_error(r, sl, status, sl->op == YCSB_RMW ? "RMW put" : "PUT");
    else if (sl->op == YCSB_INSERT && r->w)
        kv_ack(r, sl->keynum);
    kv_complete(sl);
}

static void kv_on_get(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct kv_slot *sl = arg;
    struct kv_run *r = sl->r;

    if (status < 0) {
        kv_error(r, sl, status, "GET");
    } else if (len != r->vsize) {
        kv_error(r, sl, 0, "GET of the wrong length");
    } else if (r->vsize >= 8 && memcmp(val, &sl->keynum, 8) != 0) {
        kv_error(r, sl, 0, "GET of another key's value");
    } else if (sl->op == YCSB_RMW) {
        memcpy(sl->val, val, len);
        kv_stamp(r, sl);
        sl->put_phase = true;
        kv_send(sl);
        return;
    }
    kv_complete(sl);
}

static void kv_send(struct kv_slot *sl)
{
    struct kv_run *r = sl->r;
    int rc;

    if (sl->put_phase)
        rc = tern_kv_put_async(r->kv, sl->key, r->klen, sl->val, r->vsize, kv_on_put, sl);
    else
        rc = tern_kv_get_async(r->kv, sl->key, r->klen, kv_on_get, sl);
    if (rc == TERN_ENOBUFS) {            /* poll, then send again */
        r->pending[r->n_pending++] = sl;
    } else if (rc < 0) {
        kv_error(r, sl, rc, sl->put_phase ? "PUT issue" : "GET issue");
        r->stop = true;
        r->inflight--;
    }
}

/* Run until `target` operations are done (or an error stops it), then
 * until none is under way. */
static void kv_drive(struct tern_rpc_ep *ep, struct kv_run *r, const char *label)
{
    bool tty = isatty(2);
    uint64_t t_last = tern_now_ns(), t_begin = t_last;

    r->t0 = t_last;
    for (unsigned i = 0; i < r->n_slots && r->issued < r->target && !r->stop; i++) {
        r->inflight++;
        r->issued++;
        kv_start(&r->slots[i], tern_now_ns());
    }
    while (r->inflight) {
        while (r->n_ready) {
            struct kv_slot *sl = r->ready[--r->n_ready];

            kv_start(sl, sl->start);
        }
        if (!r->inflight)
            break;
        tern_rpc_poll(ep);
        if (r->n_pending) {       /* refused for want of call slots: again */
            struct kv_slot **again = r->pending;
            unsigned n = r->n_pending;

            r->pending = r->retry;
            r->retry = again;
            r->n_pending = 0;
            for (unsigned i = 0; i < n; i++) {
                if (r->stop)
                    r->inflight--;
                else
                    kv_send(again[i]);
            }
        }
        if (((r->done & 0xfff) == 0) &&
            tern_now_ns() - t_last > (tty ? 1000000000ull : 10000000000ull)) {
            t_last = tern_now_ns();
            fprintf(stderr, "%s%s: %llu/%llu ops%s", tty ? "\r" : "", label,
                    (unsigned long long)r->done, (unsigned long long)r->target,
                    tty ? "" : "\n");
        }
    }
    if (tty && tern_now_ns() - t_begin > 1000000000ull)
        fprintf(stderr, "\r%70s\r", "");
}

/* ---- one fabric ---- */

struct kv_ctx {
    const struct kv_opts *o;
    struct tern_rpc_ep *ep;
    struct tern_session *s;      /* to the bench service: stats, echo baseline */
    struct tern_kv *kv;
    char fabric[16];
    const char *persist;
    uint64_t live;               /* keys [0, live) hold values of the current size */
    uint64_t total;              /* distinct keys in the store */
    struct ycsb_rng rng;
    struct ycsb_scrambled zipf;
    bool header;
};

static int kv_alloc_slots(struct kv_run *r, unsigned n)
{
    r->n_slots = n;
    r->slots = calloc(n, sizeof(*r->slots));
    r->pending = calloc(n, sizeof(*r->pending));
    r->retry = calloc(n, sizeof(*r->retry));
    r->ready = calloc(n, sizeof(*r->ready));
    if (!r->slots || !r->pending || !r->retry || !r->ready)
        return TERN_ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        r->slots[i].r = r;
        r->slots[i].key = malloc(r->klen + 1);
        r->slots[i].val = malloc(r->vsize ? r->vsize : 1);
        if (!r->slots[i].key || !r->slots[i].val)
            return TERN_ENOMEM;
        memset(r->slots[i].val, (int)(i + 1), r->vsize);
    }
    return 0;
}

static void kv_free_slots(struct kv_run *r)
{
    for (unsigned i = 0; r->slots && i < r->n_slots; i++) {
        free(r->slots[i].key);
        free(r->slots[i].val);
    }
    free(r->slots);
    free(r->pending);
    free(r->retry);
    free(r->ready);
    free(r->ack_bits);
}

static int kv_report_errors(const struct kv_ctx *c, const struct kv_run *r, const char *what,
                            size_t vsize)
{
    /* first_error 0: the reply came but was wrong. */
    fprintf(stderr,
            "rpcbench kv: %s %s %zuB: %llu failed operation%s (first: %s, key %llu%s%s)\n",
            c->fabric, what, vsize, (unsigned long long)r->errors, r->errors == 1 ? "" : "s",
            r->first_what, (unsigned long long)r->first_key, r->first_error ? ": " : "",
            r->first_error ? tern_strerror(r->first_error) : "");
    return r->first_error < 0 ? r->first_error : TERN_EPROTO;
}

/* The store should hold exactly c->total keys. */
static int kv_check_count(struct kv_ctx *c, const char *after)
{
    uint64_t n = 0;
    int rc = tern_kv_count(c->kv, &n);

    if (rc < 0) {
        fprintf(stderr, "rpcbench kv: %s: count after %s: %s\n", c->fabric, after,
                tern_strerror(rc));
        return rc;
    }
    if (n != c->total) {
        fprintf(stderr, "rpcbench kv: %s: %llu keys after %s, expected %llu\n", c->fabric,
                (unsigned long long)n, after, (unsigned long long)c->total);
        return TERN_EPROTO;
    }
    return 0;
}

/* Write keys [0, records) with values of `vsize` bytes. */
static int kv_load(struct kv_ctx *c, size_t vsize)
{
    struct kv_run r = {.kv = c->kv, .vsize = vsize, .klen = c->o->key_size,
                       .target = c->o->records, .warmup = c->o->records};
    static struct hist dummy;
    char label[48];
    int rc;

    hist_reset(&dummy);
    r.hist = &dummy;
    rc = kv_alloc_slots(&r, KV_LOAD_WINDOW);
    if (rc == 0) {
        snprintf(label, sizeof(label), "%s load %zuB", c->fabric, vsize);
        kv_drive(c->ep, &r, label);
        if (r.errors)
            rc = kv_report_errors(c, &r, "load", vsize);
    }
    kv_free_slots(&r);
    if (rc < 0)
        return rc;
    c->live = c->o->records;
    if (c->total < c->live)
        c->total = c->live;
    return kv_check_count(c, "load");
}

static void kv_print_info(const struct kv_ctx *c)
{
    const struct kv_opts *o = c->o;
    bool d = false;

    for (unsigned i = 0; i < o->n_workloads; i++)
        d = d || o->workloads[i]->latest;
    printf("kv: %llu records, %zu B keys, dist %s%s, persist %s (%s)\n",
           (unsigned long long)o->records, o->key_size, o->zipfian ? "zipfian" : "uniform",
           d ? " (D: latest)" : "", c->persist,
           strcmp(c->persist, "flush") == 0 ? "cache-line flushes: PM, or tmpfs standing in"
                                            : "msync of the written range");
}

/* The server's pool figures (KV_M_INFO on the bench session). */
static int kv_server_info(struct kv_ctx *c, struct kv_info *info)
{
    size_t len = 0;
    int rc = tern_call_sync(c->s, TERN_KV_SERVICE_ID, KV_M_INFO, NULL, 0, info, sizeof(*info),
                            &len, KV_TIMEOUT_NS);

    return rc == 0 && len != sizeof(*info) ? TERN_EPROTO : rc;
}

/* The row's extra columns: path, server CPU per operation, then x_echo. */
#define KV_EXTRA_HDR "     path srv_us/op"
#define KV_EXTRA_HDR_ECHO KV_EXTRA_HDR "   x_echo"

static int kv_bench(struct kv_ctx *c, const struct ycsb_workload *w, size_t vsize,
                    unsigned window, uint64_t echo_p50, enum tern_kv_path path)
{
    const struct kv_opts *o = c->o;
    static struct hist hist;
    struct kv_run r = {.kv = c->kv, .w = w, .vsize = vsize, .klen = o->key_size,
                       .rng = &c->rng, .zipf = o->zipfian ? &c->zipf : NULL,
                       .records = o->records, .hist = &hist};
    struct ycsb_latest latest;
    struct result res = {.fabric = c->fabric, .size = vsize, .hist = &hist};
    char workload[16], label[80], json_extra[400], row_extra[64];
    struct tern_kv_onesided_stats os0, os1;
    struct kv_info info = {0};
    uint64_t t_end, busy0, busy1;
    double srv_us;
    int rc;

    rc = tern_kv_set_path(c->kv, path);
    if (rc == 0 && path != TERN_KV_PATH_RPC && o->cache)
        rc = tern_kv_set_cache(c->kv, o->cache, vsize);
    if (rc < 0) {
        fprintf(stderr, "rpcbench kv: %s: path %s: %s\n", c->fabric, path_name(path),
                tern_strerror(rc));
        return rc;
    }

    if (window > tern_session_credits(c->s))
        window = tern_session_credits(c->s);
    hist_reset(&hist);
    r.warmup = warmup_of(o->iters);
    r.target = o->iters + r.warmup;
    if (w->insert > 0) {
        r.insert_next = r.ack_base = c->live;
        r.acked = c->live - 1;
        r.ack_cap = r.target;
        r.ack_bits = calloc(r.ack_cap / 8 + 1, 1);
        if (!r.ack_bits)
            return TERN_ENOMEM;
    }
    if (w->latest) {
        r.acked = c->live - 1;
        ycsb_latest_init(&latest, r.acked);
        r.latest = &latest;
    }
    rc = kv_alloc_slots(&r, window);
    if (rc < 0) {
        kv_free_slots(&r);
        return rc;
    }
    snprintf(workload, sizeof(workload), "kv-%s", w->name);
    snprintf(label, sizeof(label), "%s %s %zuB w%u %s", c->fabric, workload, vsize, window,
             path_name(path));
    res.workload = workload;
    res.window = window;
    res.srv_rss[0] = server_rss(c->s);
    res.rss[0] = rss_kb();
    tern_kv_get_onesided_stats(c->kv, &os0);
    busy0 = server_busy_ns(c->s);
    kv_drive(c->ep, &r, label);
    t_end = tern_now_ns();
    busy1 = server_busy_ns(c->s);
    tern_kv_get_onesided_stats(c->kv, &os1);
    kv_server_info(c, &info);
    /* The whole run, warm-up included, over every operation it issued. */
    srv_us = r.done ? (double)(busy1 - busy0) / 1e3 / (double)r.done : 0;
    if (w->insert > 0) {
        c->live = r.acked + 1;
        if (c->total < r.insert_next)
            c->total = r.insert_next;
    }
    if (r.errors) {
        rc = kv_report_errors(c, &r, workload, vsize);
    } else {
        res.rss[1] = rss_kb();
        res.srv_rss[1] = server_rss(c->s);
        res.iters = hist.count;
        res.secs = (double)(t_end - r.t0) / 1e9;
        snprintf(json_extra, sizeof(json_extra),
                 ",\"dist\":\"%s\",\"records\":%llu,\"persist\":\"%s\",\"path\":\"%s\","
                 "\"server_busy_us_per_op\":%.3f,\"gets_direct\":%llu,\"gets_rpc\":%llu,"
                 "\"torn_reads\":%llu,\"cache_hits\":%llu,\"puts_onesided\":%llu,"
                 "\"gets_pushed\":%llu,"
                 "\"pool_used_bytes\":%llu,\"in_place_total\":%llu",
                 w->latest ? "latest" : o->zipfian ? "zipfian" : "uniform",
                 (unsigned long long)o->records, c->persist, path_name(path), srv_us,
                 (unsigned long long)(os1.gets_direct - os0.gets_direct),
                 (unsigned long long)(os1.gets_rpc - os0.gets_rpc),
                 (unsigned long long)(os1.torn - os0.torn),
                 (unsigned long long)(os1.cache_hits - os0.cache_hits),
                 (unsigned long long)(os1.puts - os0.puts),
                 (unsigned long long)(os1.gets_pushed - os0.gets_pushed),
                 (unsigned long long)info.pool_used, (unsigned long long)info.in_place);
        snprintf(row_extra, sizeof(row_extra), " %8s %9.2f", path_name(path), srv_us);
        if (o->baseline && echo_p50) {
            double ratio = (double)hist_quantile(&hist, 0.5) / (double)echo_p50;
            size_t n = strlen(json_extra);

            snprintf(json_extra + n, sizeof(json_extra) - n, ",\"ratio_to_echo_p50\":%.4g",
                     ratio);
            n = strlen(row_extra);
            snprintf(row_extra + n, sizeof(row_extra) - n, " %8.2f", ratio);
        }
        res.json_extra = json_extra;
        res.row_extra = row_extra;
        if (c->header && !o->json)
            bench_print_header(o->baseline ? KV_EXTRA_HDR_ECHO : KV_EXTRA_HDR);
        c->header = false;
        bench_print(o->json, &res);
    }
    kv_free_slots(&r);
    if (rc == 0)
        rc = kv_check_count(c, workload);
    return rc;
}

static int kv_client(struct kv_ctx *c, const char *uri)
{
    const struct kv_opts *o = c->o;
    struct tern_rpc_config cfg = kv_rpc_config(o);
    int rc;

    bench_pin(o->cpu_client);
    rc = tern_rpc_open(&cfg, &c->ep);
    if (rc < 0)
        return rc;
    rc = tern_rpc_connect(c->ep, uri, KV_CONNECT_NS, &c->s);
    if (rc == 0)
        rc = tern_kv_open(c->ep, &uri, 1, KV_CONNECT_NS, &c->kv);
    if (rc < 0) {
        fprintf(stderr, "rpcbench kv: connect %s: %s\n", uri, tern_strerror(rc));
        tern_rpc_close(c->ep);
        return rc;
    }
    tern_kv_set_timeout(c->kv, KV_TIMEOUT_NS);
    tern_tp_uri_label(uri, c->fabric, sizeof(c->fabric));   /* "ntb-emu" and the like */
    ycsb_rng_seed(&c->rng, 0x6b76ull);
    if (o->zipfian)
        ycsb_scrambled_init(&c->zipf, 0, o->records - 1);
    for (unsigned i = 0; i < o->n_sizes && rc == 0; i++) {
        uint64_t echo_p50[KV_SWEEP] = {0};

        rc = kv_load(c, o->sizes[i]);
        for (unsigned w = 0; o->baseline && w < o->n_windows && rc == 0; w++) {
            if (c->header && !o->json)
                bench_print_header(KV_EXTRA_HDR_ECHO);
            c->header = false;
            rc = bench_echo(c->ep, c->s, c->fabric, o->sizes[i], o->windows[w], o->iters,
                            o->json, &echo_p50[w]);
        }
        for (unsigned k = 0; k < o->n_workloads && rc == 0; k++)
            for (unsigned w = 0; w < o->n_windows && rc == 0; w++)
                for (unsigned p = 0; p < o->n_paths && rc == 0; p++)
                    rc = kv_bench(c, o->workloads[k], o->sizes[i], o->windows[w], echo_p50[w],
                                  o->paths[p]);
    }
    tern_kv_close(c->kv);
    tern_rpc_close(c->ep);
    return rc;
}

/* The pool's segment size: 0 (the pool's 1 MiB) unless a segment of that
 * size could not hold two records. */
static uint32_t kv_seg_size(const struct kv_opts *o)
{
    uint64_t per = max_value(o) + o->key_size + 64;
    uint32_t seg = 0;

    if (per * 2 > MIB) {
        seg = 1u << 20;
        while (seg < per * 2)
            seg <<= 1;
    }
    return seg;
}

static int kv_run_local(const struct kv_opts *o)
{
    const char *const *names = tern_tp_fabric_names();
    const char *printed_persist = NULL;
    uint64_t pool = o->pool_size, per = max_value(o) + o->key_size + 64;
    uint32_t seg = kv_seg_size(o);
    bool tmpfs = bench_on_tmpfs(o->pool_dir), header = true;
    int failed = 0;

    if (!pool) {
        pool = 4 * (o->records + max_inserts(o)) * per;
        pool = pool < 64 * MIB ? 64 * MIB : (pool + MIB - 1) / MIB * MIB;
        if (seg && pool < 16ull * seg)
            pool = 16ull * seg;
    }
    for (; *names; names++) {
        char uri[200], listen[64], tag[32], pool_path[4096];
        struct kv_server_args sa;
        struct kv_ctx c = {.o = o, .header = header};
        int status;
        pid_t pid;

        if (strcmp(o->fabric, "all") != 0 && strcmp(o->fabric, *names) != 0)
            continue;
        snprintf(tag, sizeof(tag), "rpcbench-kv-%d", (int)getpid());
        if (tern_tp_local_uri(*names, tag, listen, sizeof(listen)) < 0)
            continue;
        snprintf(pool_path, sizeof(pool_path), "%s/rpcbench-kv-%d-%s.pool", o->pool_dir,
                 (int)getpid(), *names);
        unlink(pool_path);
        sa = (struct kv_server_args){.o = o, .listen = listen, .pool_path = pool_path,
                                     .pool_size = pool, .seg_size = seg, .force_pmem = tmpfs};
        memset(uri, 0, sizeof(uri));
        pid = bench_spawn(kv_server_child, &sa, uri, sizeof(uri));
        if (pid < 0)
            return 1;
        /* The server has the pool open and mapped: the name can go now, so
         * that nothing is left behind whatever happens next. */
        unlink(pool_path);
        if (strlen(uri) <= 1 || uri[0] == '-') {
            fprintf(stderr, "rpcbench kv: %s server did not start\n", *names);
            failed++;
        } else {
            c.persist = strcmp(uri + strlen(uri) + 1, "flush") == 0 ? "flush" : "msync";
            if (!o->json && (!printed_persist || strcmp(printed_persist, c.persist) != 0)) {
                kv_print_info(&c);
                printed_persist = c.persist;
            }
            if (kv_client(&c, uri) < 0)
                failed++;
            header = c.header;
        }
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rpcbench kv: %s server exited badly (status %#x)\n", *names,
                    status);
            failed++;
        }
        unlink(pool_path);
    }
    return failed ? 1 : 0;
}

/* ---- options ---- */

static void kv_usage(FILE *f)
{
    fprintf(f,
            "usage: rpcbench kv [--fabric FABRIC|all] [options]\n"
            "  YCSB workloads on the key-value service: a local server per fabric on a\n"
            "  fresh pool; keys are loaded (untimed), then each workload is timed.\n"
            "FABRIC: one of");
    for (const char *const *n = tern_tp_fabric_names(); *n; n++)
        fprintf(f, " %s", *n);
    fprintf(f,
            " (this build; default tcp)\n"
            "options:\n"
            "  --workload W[,W...]   A (50%% read/50%% update), B (95/5), C (100%% read),\n"
            "                        D (95%% read of the latest keys/5%% insert),\n"
            "                        F (50%% read/50%% read-modify-write), get, put (default A)\n"
            "  --dist uniform|zipfian  request distribution (zipfian 0.99, scrambled, as\n"
            "                        YCSB; D always uses latest; default uniform)\n"
            "  --records N           keys loaded (default 10000; k/m suffixes)\n"
            "  --value-size N[,N...] value bytes, 1..64m (default 64; k/m suffixes)\n"
            "  --key-size N          key bytes, \"user\" and a zero-padded number,\n"
            "                        8..%u (default 16)\n"
            "  --iters N             measured operations per run (default 100000)\n"
            "  --window N[,N...]     operations in flight, 1..256 (default 1)\n"
            "  --path P[,P...]       rpc (every call an RPC), onesided (GET reads the\n"
            "                        server's index window and pool, PUT writes into a\n"
            "                        leased segment, on every fabric), push (GET: the\n"
            "                        server writes the record into the client's buffer;\n"
            "                        PUT as onesided) and/or auto (onesided on shm and\n"
            "                        rdma, push GETs on ntb, rpc elsewhere); each run\n"
            "                        once per path, side by side (default rpc)\n"
            "  --cache N             onesided: client cache of N values validated by version\n"
            "                        (0..16m)\n"
            "  --append-only         server: never update in place (the baseline of BOOM-KV's\n"
            "                        hybrid update; JSON pool_used_bytes shows the space)\n"
            "  --baseline            echo at the same size and window first, and each kv\n"
            "                        row's median as a multiple of echo's (x_echo)\n"
            "  --json                one JSON object per run\n"
            "  --cpu C,S             pin client to cpu C and server to cpu S\n"
            "  --pool-dir DIR        where the server's pool file goes (default /dev/shm,\n"
            "                        else $TMPDIR or /tmp); on tmpfs writes are made\n"
            "                        durable by cache-line flushes (PMEM_IS_PMEM_FORCE=1),\n"
            "                        elsewhere by msync\n"
            "  --pool-size N         pool bytes (k/m/g/t; default max(64 MiB,\n"
            "                        4 x keys x (value + key + 64)); at least four\n"
            "                        segments and 4k)\n",
            KV_KEY_MAX);
}

static bool parse_workloads(const char *arg, struct kv_opts *o)
{
    char buf[256], *save = NULL;

    if (strlen(arg) >= sizeof(buf)) {
        fprintf(stderr, "rpcbench kv: --workload: %.32s... is too long\n", arg);
        return false;
    }
    snprintf(buf, sizeof(buf), "%s", arg);
    o->n_workloads = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const struct ycsb_workload *w = ycsb_workload_find(t);

        if (!w) {
            fprintf(stderr, "rpcbench kv: --workload: %s is not one of A, B, C, D, F, get, "
                    "put\n", t);
            return false;
        }
        if (o->n_workloads == KV_SWEEP) {
            fprintf(stderr, "rpcbench kv: --workload: more than %d workloads\n", KV_SWEEP);
            return false;
        }
        o->workloads[o->n_workloads++] = w;
    }
    if (!o->n_workloads)
        fprintf(stderr, "rpcbench kv: --workload: none given\n");
    return o->n_workloads > 0;
}

static bool parse_paths(const char *arg, struct kv_opts *o)
{
    static const char *const names[] = {"rpc", "onesided", "auto", "push", NULL};
    static const enum tern_kv_path paths[] = {TERN_KV_PATH_RPC, TERN_KV_PATH_ONESIDED,
                                              TERN_KV_PATH_AUTO, TERN_KV_PATH_PUSH};
    char buf[64], *save = NULL;

    if (strlen(arg) >= sizeof(buf)) {
        fprintf(stderr, "rpcbench kv: --path: %.32s... is too long\n", arg);
        return false;
    }
    snprintf(buf, sizeof(buf), "%s", arg);
    o->n_paths = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int i = opt_choice("rpcbench kv", "--path", t, names, NULL);

        if (i < 0)
            return false;
        if (o->n_paths == KV_PATHS) {
            fprintf(stderr, "rpcbench kv: --path: more than %d paths\n", KV_PATHS);
            return false;
        }
        o->paths[o->n_paths++] = paths[i];
    }
    if (!o->n_paths)
        fprintf(stderr, "rpcbench kv: --path: none given\n");
    return o->n_paths > 0;
}

int kv_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"fabric", required_argument, NULL, 'f'},   {"workload", required_argument, NULL, 'W'},
        {"dist", required_argument, NULL, 'D'},     {"records", required_argument, NULL, 'r'},
        {"value-size", required_argument, NULL, 's'}, {"size", required_argument, NULL, 's'},
        {"key-size", required_argument, NULL, 'k'}, {"iters", required_argument, NULL, 'n'},
        {"window", required_argument, NULL, 'w'},   {"json", no_argument, NULL, 'j'},
        {"cpu", required_argument, NULL, 'p'},      {"pool-dir", required_argument, NULL, 'd'},
        {"pool-size", required_argument, NULL, 'P'}, {"baseline", no_argument, NULL, 'b'},
        {"path", required_argument, NULL, 'T'},     {"cache", required_argument, NULL, 'C'},
        {"append-only", no_argument, NULL, 'A'},
        {"help", no_argument, NULL, 'h'},           {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    static const char *const all[] = {"all", NULL};
    static const char *const dists[] = {"uniform", "zipfian", NULL};
    static const char *const me = "rpcbench kv";
    struct kv_opts o = {.fabric = "tcp", .records = 10000, .sizes = {64}, .n_sizes = 1,
                        .windows = {1}, .n_windows = 1, .iters = 100000, .key_size = 16,
                        .cpu_client = -1, .cpu_server = -1,
                        .paths = {TERN_KV_PATH_RPC}, .n_paths = 1};
    const char *pool_size = NULL;
    uint64_t tmp[KV_SWEEP], max_key, digits_max = 1, v = 0, seg;
    int c;

    o.workloads[0] = ycsb_workload_find("A");
    o.n_workloads = 1;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;

        switch (c) {
        case 'f':
            o.fabric = optarg;
            ok = opt_choice(me, "--fabric", optarg, tern_tp_fabric_names(), all) >= 0;
            break;
        case 'W': ok = parse_workloads(optarg, &o); break;
        case 'D':
            o.zipfian = strcmp(optarg, "zipfian") == 0;
            ok = opt_choice(me, "--dist", optarg, dists, NULL) >= 0;
            break;
        case 'r': ok = opt_num(me, "--records", optarg, 1, 1ull << 40, OPT_SIZE, &o.records); break;
        case 's':
            o.n_sizes = opt_list(me, "--value-size", optarg, 1, 64u << 20, OPT_SIZE, tmp,
                                 KV_SWEEP);
            for (unsigned i = 0; i < o.n_sizes; i++)
                o.sizes[i] = (size_t)tmp[i];
            ok = o.n_sizes > 0;
            break;
        case 'k':
            ok = opt_num(me, "--key-size", optarg, 8, KV_KEY_MAX, 0, &v);
            o.key_size = (size_t)v;
            break;
        case 'n': ok = opt_num(me, "--iters", optarg, 1, 1ull << 40, OPT_SIZE, &o.iters); break;
        case 'w':
            o.n_windows = opt_list(me, "--window", optarg, 1, 256, 0, tmp, KV_SWEEP);
            for (unsigned i = 0; i < o.n_windows; i++)
                o.windows[i] = (unsigned)tmp[i];
            ok = o.n_windows > 0;
            break;
        case 'j': o.json = true; break;
        case 'p': ok = bench_parse_cpu(me, optarg, &o.cpu_client, &o.cpu_server); break;
        case 'd': o.pool_dir = optarg; break;
        case 'P': pool_size = optarg; break;    /* its least depends on the value sizes */
        case 'b': o.baseline = true; break;
        case 'T': ok = parse_paths(optarg, &o); break;
        case 'A': o.append_only = true; break;
        case 'C':
            ok = opt_num(me, "--cache", optarg, 0, 1u << 24, OPT_SIZE, &v);
            o.cache = (unsigned)v;
            break;
        case 'h': kv_usage(stdout); return 0;
        case 'V': return opt_version("rpcbench");
        default:                             /* getopt said what */
            fprintf(stderr, "Try 'rpcbench kv --help' for the options.\n");
            return OPT_USAGE;
        }
        if (!ok)
            return OPT_USAGE;
    }
    if (optind < argc)
        return opt_usage_error(me, "unexpected argument '%s'", argv[optind]);
    /* The pool's least: its 4 KiB header and four segments. */
    seg = kv_seg_size(&o) ? kv_seg_size(&o) : MIB;
    if (pool_size && !opt_num(me, "--pool-size", pool_size, 4096 + 4 * seg, 1ull << 44,
                              OPT_SIZE, &o.pool_size))
        return OPT_USAGE;
    /* Every key number must fit the key's digits. */
    max_key = o.records + max_inserts(&o);
    for (size_t d = 0; d < o.key_size - 4 && digits_max <= max_key; d++)
        digits_max *= 10;
    if (digits_max <= max_key) {
        fprintf(stderr, "rpcbench kv: --key-size %zu is too short for %llu keys\n", o.key_size,
                (unsigned long long)max_key);
        return OPT_USAGE;
    }
    if (!o.pool_dir)
        o.pool_dir = bench_default_pool_dir();
    return kv_run_local(&o);
}
