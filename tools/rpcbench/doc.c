/* rpcbench doc: YCSB-style work on the document service (services/doc),
 * one local server per fabric on a fresh pool, as rpcbench kv does.
 *
 * Documents are about 1 KiB: _id (int64), ten 96-byte strings f0..f9, f1
 * holding a small number as text (indexed: records/10 distinct values, so
 * a find by f1 returns about ten documents), and a counter cnt. Workloads:
 *   insert   insert_one of new documents
 *   read     find by _id
 *   find     find by the indexed field f1 (a cursor: one at a time, so the
 *            window does not apply; --path decides how its batches travel)
 *   update   {$inc: {cnt: 1}, $set: {f2: ...}} by _id
 *   delete   delete_one by _id, each loaded document once at most
 *   A B C F  YCSB's mixes of read and update (F: read, then update)
 * Every row is timed after a warm-up of a tenth of --iters. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "doc.h"
#include "doc_service.h"
#include "docbench.h"
#include "kvbench.h"
#include "opt.h"
#include "spawn.h"
#include "ycsb.h"

#define DB "bench"
#define COLL "docs"
#define DOC_SWEEP 16
#define DOC_PATHS 3
#define DOC_TIMEOUT_NS (10ull * 1000000000u)
#define DOC_CONNECT_NS (5ull * 1000000000u)
#define DOC_MAX_ERRORS 100
#define LOAD_BATCH 100
#define FIELD_LEN 96

enum dop { OP_INSERT, OP_READ, OP_FIND, OP_UPDATE, OP_DELETE, OP_MIX };

struct dwork {
    const char *name;
    enum dop op;
    const struct ycsb_workload *mix;     /* OP_MIX */
};

struct doc_opts {
    const char *fabric, *pool_dir;
    struct dwork works[DOC_SWEEP];
    unsigned n_works;
    enum tern_doc_path paths[DOC_PATHS];
    unsigned n_paths;
    uint64_t records, iters;
    unsigned window;
    bool zipfian, json;
    int cpu_client, cpu_server;
};

static const char *path_name(enum tern_doc_path p)
{
    return p == TERN_DOC_PATH_ONESIDED ? "onesided" : p == TERN_DOC_PATH_AUTO ? "auto" : "rpc";
}

/* ---- the server ---- */

struct srv_args {
    const struct doc_opts *o;
    const char *listen, *pool_path;
    bool force_pmem;
};

static volatile sig_atomic_t srv_stop;

static void srv_on_signal(int sig)
{
    (void)sig;
    srv_stop = 1;
}

static int srv_child(void *arg, int fd)
{
    const struct srv_args *a = arg;
    struct tern_doc_service_opts so = {.pool_path = a->pool_path,
                                       .pool_size = 4ull << 30};
    struct tern_rpc_config cfg = {.max_msg = 1u << 20, .credits = 256};
    struct tern_doc_service *svc = NULL;
    struct tern_rpc_ep *ep = NULL;
    char msg[200], bound[160];
    int rc, n;

    bench_pin(a->o->cpu_server);
    if (a->force_pmem)
        setenv("PMEM_IS_PMEM_FORCE", "1", 1);
    rc = tern_doc_service_open(&so, &svc);
    if (rc < 0) {
        fprintf(stderr, "rpcbench doc server: %s: %s\n", a->pool_path, tern_strerror(rc));
        goto fail;
    }
    rc = tern_rpc_open(&cfg, &ep);
    if (rc == 0)
        rc = tern_rpc_register(ep, tern_doc_service_def(svc));
    if (rc == 0)
        rc = tern_rpc_register(ep, &bench_service);
    if (rc == 0)
        rc = tern_rpc_listen(ep, a->listen, bound, sizeof(bound));
    if (rc == 0)
        rc = tern_doc_service_enable_onesided(svc, ep, 0);
    if (rc == 0)
        rc = tern_doc_service_group_commit(svc, ep);
    if (rc < 0) {
        fprintf(stderr, "rpcbench doc server: %s: %s\n", a->listen, tern_strerror(rc));
        goto fail;
    }
    signal(SIGTERM, srv_on_signal);
    signal(SIGINT, srv_on_signal);
    n = snprintf(msg, sizeof(msg), "%s%c%s", bound, 0, a->force_pmem ? "flush" : "msync");
    if (write(fd, msg, (size_t)n + 1) != n + 1)
        goto fail;
    close(fd);
    bench_serve_busy(ep, &srv_stop);
    tern_rpc_close(ep);
    tern_doc_service_close(svc);
    return 0;
fail:
    if (ep)
        tern_rpc_close(ep);
    if (svc)
        tern_doc_service_close(svc);
    (void)!write(fd, "-", 1);
    return 1;
}

/* ---- documents ---- */

static void make_doc(bson_t *d, uint64_t id, uint64_t records)
{
    char f[FIELD_LEN + 1], name[4];

    bson_init(d);
    BSON_APPEND_INT64(d, "_id", (int64_t)id);
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof(name), "f%d", i);
        if (i == 1) {
            snprintf(f, sizeof(f), "%llu", (unsigned long long)(id % (records / 10 + 1)));
        } else {
            memset(f, 'a' + (int)((id + (uint64_t)i) % 26), FIELD_LEN);
            f[FIELD_LEN] = 0;
        }
        BSON_APPEND_UTF8(d, name, f);
    }
    BSON_APPEND_INT32(d, "cnt", 0);
}

/* ---- a run ---- */

struct run;

struct slot {
    struct run *r;
    uint64_t start, key;
    enum dop op;
    bool second;                 /* F: the update after the read */
    bson_t q, u;                 /* filter and update, rebuilt per operation */
};

struct run {
    struct tern_doc *doc;
    const struct dwork *w;
    uint64_t records, issued, done, warmup, target, t0;
    uint64_t next_insert, next_delete;
    unsigned inflight;
    uint64_t errors;
    int first_error;
    char first_msg[600];
    bool stop;
    struct hist *hist;
    struct ycsb_rng *rng;
    struct ycsb_scrambled *zipf;
    struct slot *slots, **ready;
    unsigned n_slots, n_ready;
    uint64_t found;              /* find: documents returned */
};

static void run_error(struct run *r, int status, const char *what)
{
    if (!r->errors++) {
        const struct tern_doc_error *de = tern_doc_last_error(r->doc);

        r->first_error = status;
        snprintf(r->first_msg, sizeof(r->first_msg), "%s%s%s", what, de && de->code ? ": " : "",
                 de && de->code ? de->errmsg : "");
    }
    if (r->errors >= DOC_MAX_ERRORS)
        r->stop = true;
}

static uint64_t pick(struct run *r)
{
    return r->zipf ? ycsb_scrambled_next(r->zipf, r->rng) : ycsb_rng_below(r->rng, r->records);
}

static void send_op(struct slot *sl);

static void complete(struct slot *sl)
{
    struct run *r = sl->r;
    uint64_t now = tern_now_ns();

    if (r->done++ >= r->warmup)
        hist_add(r->hist, now - sl->start);
    if (r->done == r->warmup)
        r->t0 = now;
    if (r->issued < r->target && !r->stop) {
        r->issued++;
        sl->start = now;
        r->ready[r->n_ready++] = sl;
    } else {
        r->inflight--;
    }
}

static void on_reply(void *arg, int status, const bson_t *reply)
{
    struct slot *sl = arg;
    struct run *r = sl->r;

    (void)reply;
    if (status < 0) {
        run_error(r, status, sl->op == OP_READ ? "read" : sl->op == OP_INSERT ? "insert"
                             : sl->op == OP_DELETE ? "delete" : "update");
    } else if (sl->op == OP_READ && r->w->op == OP_MIX && r->w->mix->rmw > 0 && !sl->second &&
               sl->key != UINT64_MAX) {
        /* F: the write half of a read-modify-write. */
        sl->second = true;
        sl->op = OP_UPDATE;
        send_op(sl);
        return;
    }
    complete(sl);
}

static void start_op(struct slot *sl, uint64_t now)
{
    struct run *r = sl->r;

    sl->start = now;
    sl->second = false;
    switch (r->w->op) {
    case OP_MIX: {
        enum ycsb_op y = ycsb_next_op(r->w->mix, r->rng);

        sl->op = y == YCSB_UPDATE ? OP_UPDATE : OP_READ;
        sl->key = pick(r);
        break;
    }
    case OP_INSERT:
        sl->op = OP_INSERT;
        sl->key = r->next_insert++;
        break;
    case OP_DELETE:
        sl->op = OP_DELETE;
        sl->key = r->next_delete++;
        break;
    default:
        sl->op = r->w->op;
        sl->key = pick(r);
        break;
    }
    send_op(sl);
}

static void send_op(struct slot *sl)
{
    struct run *r = sl->r;
    bson_value_t id = {.value_type = BSON_TYPE_INT64, .value.v_int64 = (int64_t)sl->key};
    int rc;

    bson_reinit(&sl->q);
    BSON_APPEND_INT64(&sl->q, "_id", (int64_t)sl->key);
    switch (sl->op) {
    case OP_READ:
        rc = tern_doc_find_id_async(r->doc, DB, COLL, &id, on_reply, sl);
        break;
    case OP_INSERT:
        bson_destroy(&sl->u);
        make_doc(&sl->u, sl->key, r->records);
        rc = tern_doc_insert_one_async(r->doc, DB, COLL, &sl->u, on_reply, sl);
        break;
    case OP_DELETE:
        rc = tern_doc_delete_async(r->doc, DB, COLL, &sl->q, false, on_reply, sl);
        break;
    default: {
        bson_t inc, set;
        char f[FIELD_LEN + 1];

        memset(f, 'A' + (int)(r->issued % 26), FIELD_LEN);
        f[FIELD_LEN] = 0;
        bson_reinit(&sl->u);
        BSON_APPEND_DOCUMENT_BEGIN(&sl->u, "$inc", &inc);
        BSON_APPEND_INT32(&inc, "cnt", 1);
        bson_append_document_end(&sl->u, &inc);
        BSON_APPEND_DOCUMENT_BEGIN(&sl->u, "$set", &set);
        BSON_APPEND_UTF8(&set, "f2", f);
        bson_append_document_end(&sl->u, &set);
        rc = tern_doc_update_async(r->doc, DB, COLL, &sl->q, &sl->u, false, false, on_reply, sl);
        break;
    }
    }
    if (rc == TERN_ENOBUFS) {
        /* Too many in flight: poll, then again (as a ready slot). */
        r->ready[r->n_ready++] = sl;
        sl->second = sl->op == OP_UPDATE && sl->second;
    } else if (rc < 0) {
        run_error(r, rc, "issue");
        r->stop = true;
        r->inflight--;
    }
}

static void drive(struct tern_rpc_ep *ep, struct run *r)
{
    r->t0 = tern_now_ns();
    for (unsigned i = 0; i < r->n_slots && r->issued < r->target && !r->stop; i++) {
        r->inflight++;
        r->issued++;
        start_op(&r->slots[i], tern_now_ns());
    }
    while (r->inflight) {
        while (r->n_ready) {
            struct slot *sl = r->ready[--r->n_ready];

            if (sl->second)
                send_op(sl);
            else
                start_op(sl, sl->start);
        }
        if (r->inflight)
            tern_rpc_poll(ep);
    }
}

/* find: one cursor at a time (the window does not apply). */
static void drive_find(struct run *r)
{
    char v[32];
    bson_t q;

    r->t0 = tern_now_ns();
    bson_init(&q);
    for (; r->done < r->target && !r->stop;) {
        struct tern_doc_cursor *cur;
        const bson_t *d;
        uint64_t t = tern_now_ns();
        int rc;

        snprintf(v, sizeof(v), "%llu", (unsigned long long)(pick(r) % (r->records / 10 + 1)));
        bson_reinit(&q);
        BSON_APPEND_UTF8(&q, "f1", v);
        rc = tern_doc_find(r->doc, DB, COLL, &q, NULL, &cur);
        if (rc == 0) {
            while ((rc = tern_doc_cursor_next(cur, &d)) == 1)
                r->found++;
            tern_doc_cursor_close(cur);
        }
        if (rc < 0) {
            run_error(r, rc, "find");
            break;
        }
        if (r->done++ >= r->warmup)
            hist_add(r->hist, tern_now_ns() - t);
        if (r->done == r->warmup)
            r->t0 = tern_now_ns();
    }
    bson_destroy(&q);
}

/* ---- one fabric ---- */

struct ctx {
    const struct doc_opts *o;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct tern_doc *doc;
    char fabric[16];
    const char *persist;
    uint64_t live_hi;            /* documents [live_lo, live_hi) are there */
    uint64_t live_lo;
    struct ycsb_rng rng;
    struct ycsb_scrambled zipf;
    bool header;
};

static int load(struct ctx *c)
{
    const struct doc_opts *o = c->o;
    bson_t docs[LOAD_BATCH];
    const bson_t *ptrs[LOAD_BATCH];
    bson_t key = BSON_INITIALIZER;
    uint64_t done = 0;
    int rc = 0;

    tern_doc_drop(c->doc, DB, COLL);
    BSON_APPEND_INT32(&key, "f1", 1);
    rc = tern_doc_create_index(c->doc, DB, COLL, &key, NULL, false);
    bson_destroy(&key);
    for (uint64_t at = 0; rc == 0 && at < o->records; at += LOAD_BATCH) {
        size_t n = o->records - at < LOAD_BATCH ? (size_t)(o->records - at) : LOAD_BATCH;

        for (size_t i = 0; i < n; i++) {
            make_doc(&docs[i], at + i, o->records);
            ptrs[i] = &docs[i];
        }
        rc = tern_doc_insert_many(c->doc, DB, COLL, ptrs, n, true, &done);
        for (size_t i = 0; i < n; i++)
            bson_destroy(&docs[i]);
    }
    if (rc < 0)
        fprintf(stderr, "rpcbench doc: %s: load: %s (%s)\n", c->fabric, tern_strerror(rc),
                tern_doc_last_error(c->doc)->errmsg);
    c->live_lo = 0;
    c->live_hi = o->records;
    return rc;
}

#define DOC_EXTRA_HDR "     path  srv_us/op"

static int bench(struct ctx *c, const struct dwork *w, enum tern_doc_path path)
{
    const struct doc_opts *o = c->o;
    static struct hist hist;
    struct run r = {.doc = c->doc, .w = w, .records = c->live_hi, .hist = &hist,
                    .rng = &c->rng, .zipf = o->zipfian && w->op != OP_DELETE ? &c->zipf : NULL,
                    .next_insert = c->live_hi, .next_delete = c->live_lo};
    struct result res = {.fabric = c->fabric, .size = 1024, .hist = &hist};
    struct tern_doc_stats st0, st1;
    char workload[24], json_extra[400], row_extra[64];
    uint64_t busy0, busy1, t_end;
    unsigned window = w->op == OP_FIND ? 1 : o->window;
    double srv_us;
    int rc = tern_doc_set_path(c->doc, path);

    if (rc < 0)
        return rc;
    hist_reset(&hist);
    r.warmup = o->iters / 10;
    r.target = o->iters + r.warmup;
    if (w->op == OP_DELETE && r.target > c->live_hi - c->live_lo) {
        fprintf(stderr, "rpcbench doc: delete: %llu operations need as many documents "
                "(--records, or fewer --iters)\n", (unsigned long long)r.target);
        return TERN_EINVAL;
    }
    if (window > tern_session_credits(c->s))
        window = tern_session_credits(c->s);
    r.n_slots = window;
    r.slots = calloc(window, sizeof(*r.slots));
    r.ready = calloc(window * 2, sizeof(*r.ready));
    if (!r.slots || !r.ready) {
        free(r.slots);
        free(r.ready);
        return TERN_ENOMEM;
    }
    for (unsigned i = 0; i < window; i++) {
        r.slots[i].r = &r;
        bson_init(&r.slots[i].q);
        bson_init(&r.slots[i].u);
    }
    snprintf(workload, sizeof(workload), "doc-%s", w->name);
    res.workload = workload;
    res.window = window;
    res.srv_rss[0] = server_rss(c->s);
    res.rss[0] = rss_kb();
    tern_doc_get_stats(c->doc, &st0);
    busy0 = server_busy_ns(c->s);
    if (w->op == OP_FIND)
        drive_find(&r);
    else
        drive(c->ep, &r);
    t_end = tern_now_ns();
    busy1 = server_busy_ns(c->s);
    tern_doc_get_stats(c->doc, &st1);
    srv_us = r.done ? (double)(busy1 - busy0) / 1e3 / (double)r.done : 0;
    if (w->op == OP_INSERT)
        c->live_hi = r.next_insert;
    if (w->op == OP_DELETE)
        c->live_lo = r.next_delete;
    for (unsigned i = 0; i < window; i++) {
        bson_destroy(&r.slots[i].q);
        bson_destroy(&r.slots[i].u);
    }
    free(r.slots);
    free(r.ready);
    if (r.errors) {
        fprintf(stderr, "rpcbench doc: %s %s: %llu failed operation%s (first: %s%s%s)\n",
                c->fabric, workload, (unsigned long long)r.errors, r.errors == 1 ? "" : "s",
                r.first_msg, r.first_error ? ": " : "",
                r.first_error ? tern_strerror(r.first_error) : "");
        return TERN_EPROTO;
    }
    res.rss[1] = rss_kb();
    res.srv_rss[1] = server_rss(c->s);
    res.iters = hist.count;
    res.secs = (double)(t_end - r.t0) / 1e9;
    snprintf(json_extra, sizeof(json_extra),
             ",\"dist\":\"%s\",\"records\":%llu,\"persist\":\"%s\",\"path\":\"%s\","
             "\"server_busy_us_per_op\":%.3f,\"batches_inline\":%llu,\"batches_pushed\":%llu,"
             "\"docs_found\":%llu",
             o->zipfian ? "zipfian" : "uniform", (unsigned long long)o->records, c->persist,
             path_name(path), srv_us,
             (unsigned long long)(st1.batches_inline - st0.batches_inline),
             (unsigned long long)(st1.batches_pushed - st0.batches_pushed),
             (unsigned long long)r.found);
    snprintf(row_extra, sizeof(row_extra), " %8s %9.2f", path_name(path), srv_us);
    res.json_extra = json_extra;
    res.row_extra = row_extra;
    if (c->header && !o->json)
        bench_print_header(DOC_EXTRA_HDR);
    c->header = false;
    bench_print(o->json, &res);
    return 0;
}

static int client(struct ctx *c, const char *uri)
{
    const struct doc_opts *o = c->o;
    struct tern_rpc_config cfg = {.max_msg = 1u << 20, .credits = 256};
    int rc;

    bench_pin(o->cpu_client);
    rc = tern_rpc_open(&cfg, &c->ep);
    if (rc < 0)
        return rc;
    rc = tern_rpc_connect(c->ep, uri, DOC_CONNECT_NS, &c->s);
    if (rc == 0)
        rc = tern_doc_open(c->ep, &uri, 1, DOC_CONNECT_NS, &c->doc);
    if (rc < 0) {
        fprintf(stderr, "rpcbench doc: connect %s: %s\n", uri, tern_strerror(rc));
        tern_rpc_close(c->ep);
        return rc;
    }
    tern_doc_set_timeout(c->doc, DOC_TIMEOUT_NS);
    tern_tp_uri_label(uri, c->fabric, sizeof(c->fabric));
    ycsb_rng_seed(&c->rng, 0x646f63ull);
    if (o->zipfian)
        ycsb_scrambled_init(&c->zipf, 0, o->records - 1);
    rc = load(c);
    for (unsigned k = 0; k < o->n_works && rc == 0; k++)
        for (unsigned p = 0; p < o->n_paths && rc == 0; p++) {
            /* Only a find's batches have a path to choose: the others
             * run once. */
            if (p > 0 && o->works[k].op != OP_FIND)
                break;
            rc = bench(c, &o->works[k], o->paths[p]);
        }
    tern_doc_close(c->doc);
    tern_rpc_close(c->ep);
    return rc;
}

static int run_local(const struct doc_opts *o)
{
    const char *const *names = tern_tp_fabric_names();
    bool tmpfs = bench_on_tmpfs(o->pool_dir), header = true;
    int failed = 0;

    for (; *names; names++) {
        char uri[200], listen[64], tag[32], pool_path[4096];
        struct srv_args sa;
        struct ctx c = {.o = o, .header = header};
        int status;
        pid_t pid;

        if (strcmp(o->fabric, "all") != 0 && strcmp(o->fabric, *names) != 0)
            continue;
        snprintf(tag, sizeof(tag), "rpcbench-doc-%d", (int)getpid());
        if (tern_tp_local_uri(*names, tag, listen, sizeof(listen)) < 0)
            continue;
        snprintf(pool_path, sizeof(pool_path), "%s/rpcbench-doc-%d-%s.pool", o->pool_dir,
                 (int)getpid(), *names);
        unlink(pool_path);
        sa = (struct srv_args){.o = o, .listen = listen, .pool_path = pool_path,
                               .force_pmem = tmpfs};
        memset(uri, 0, sizeof(uri));
        pid = bench_spawn(srv_child, &sa, uri, sizeof(uri));
        if (pid < 0)
            return 1;
        unlink(pool_path);
        if (strlen(uri) <= 1 || uri[0] == '-') {
            fprintf(stderr, "rpcbench doc: %s server did not start\n", *names);
            failed++;
        } else {
            c.persist = strcmp(uri + strlen(uri) + 1, "flush") == 0 ? "flush" : "msync";
            if (!o->json && header)
                printf("# document service on a pool in %s (%s), %llu documents of ~1 KiB, "
                       "index on f1\n", o->pool_dir, c.persist,
                       (unsigned long long)o->records);
            if (client(&c, uri) < 0)
                failed++;
            header = c.header;
        }
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rpcbench doc: %s server exited badly (status %#x)\n", *names,
                    status);
            failed++;
        }
        unlink(pool_path);
    }
    return failed ? 1 : 0;
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: rpcbench doc [--fabric FABRIC|all] [options]\n"
            "  YCSB-style work on the document service: a local server per fabric on a\n"
            "  fresh pool; ~1 KiB documents with ten fields are loaded (untimed) with an\n"
            "  index on f1, then each workload is timed.\n"
            "FABRIC: one of");
    for (const char *const *n = tern_tp_fabric_names(); *n; n++)
        fprintf(f, " %s", *n);
    fprintf(f,
            " (this build; default tcp)\n"
            "options:\n"
            "  --workload W[,W...]   insert, read (by _id), find (by the indexed field),\n"
            "                        update ($inc and $set by _id), delete, and YCSB's\n"
            "                        A (50%% read/50%% update), B (95/5), C (read),\n"
            "                        F (read-modify-write) (default A)\n"
            "  --dist uniform|zipfian  request distribution (default uniform)\n"
            "  --records N           documents loaded (default 10000)\n"
            "  --iters N             measured operations per run (default 20000)\n"
            "  --window N            operations in flight, 1..256 (default 1; find: 1)\n"
            "  --path P[,P...]       how find's result batches travel: rpc (inline),\n"
            "                        onesided (written into the client's buffer), auto;\n"
            "                        find runs once per path (default auto)\n"
            "  --json                one JSON object per run\n"
            "  --cpu C,S             pin client to cpu C and server to cpu S\n"
            "  --pool-dir DIR        where the server's pool goes (default /dev/shm, else\n"
            "                        $TMPDIR or /tmp); on tmpfs writes are made durable by\n"
            "                        cache-line flushes (PMEM_IS_PMEM_FORCE=1), elsewhere\n"
            "                        by msync\n");
}

static bool parse_works(const char *arg, struct doc_opts *o)
{
    static const struct {
        const char *name;
        enum dop op;
    } ops[] = {{"insert", OP_INSERT}, {"read", OP_READ},     {"find", OP_FIND},
               {"update", OP_UPDATE}, {"delete", OP_DELETE}};
    char buf[256], *save = NULL;

    if (strlen(arg) >= sizeof(buf))
        return false;
    snprintf(buf, sizeof(buf), "%s", arg);
    o->n_works = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        struct dwork w = {0};
        static char names[DOC_SWEEP][16];

        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
            if (strcmp(t, ops[i].name) == 0)
                w = (struct dwork){.name = ops[i].name, .op = ops[i].op};
        if (!w.name && strlen(t) == 1 && strchr("ABCFabcf", t[0])) {
            w.mix = ycsb_workload_find(t);
            w.op = OP_MIX;
            snprintf(names[o->n_works % DOC_SWEEP], sizeof(names[0]), "%c", t[0] & ~0x20);
            w.name = names[o->n_works % DOC_SWEEP];
        }
        if (!w.name) {
            fprintf(stderr, "rpcbench doc: --workload: %s is not one of insert, read, find, "
                    "update, delete, A, B, C, F\n", t);
            return false;
        }
        if (o->n_works == DOC_SWEEP) {
            fprintf(stderr, "rpcbench doc: --workload: more than %d\n", DOC_SWEEP);
            return false;
        }
        o->works[o->n_works++] = w;
    }
    return o->n_works > 0;
}

static bool parse_paths(const char *arg, struct doc_opts *o)
{
    static const char *const names[] = {"rpc", "onesided", "auto", NULL};
    static const enum tern_doc_path paths[] = {TERN_DOC_PATH_RPC, TERN_DOC_PATH_ONESIDED,
                                               TERN_DOC_PATH_AUTO};
    char buf[64], *save = NULL;

    if (strlen(arg) >= sizeof(buf))
        return false;
    snprintf(buf, sizeof(buf), "%s", arg);
    o->n_paths = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int i = opt_choice("rpcbench doc", "--path", t, names, NULL);

        if (i < 0 || o->n_paths == DOC_PATHS)
            return false;
        o->paths[o->n_paths++] = paths[i];
    }
    return o->n_paths > 0;
}

int doc_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"fabric", required_argument, NULL, 'f'},  {"workload", required_argument, NULL, 'W'},
        {"dist", required_argument, NULL, 'D'},    {"records", required_argument, NULL, 'r'},
        {"iters", required_argument, NULL, 'n'},   {"window", required_argument, NULL, 'w'},
        {"json", no_argument, NULL, 'j'},          {"cpu", required_argument, NULL, 'p'},
        {"pool-dir", required_argument, NULL, 'd'}, {"path", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},          {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    static const char *const all[] = {"all", NULL};
    static const char *const dists[] = {"uniform", "zipfian", NULL};
    static const char *const me = "rpcbench doc";
    struct doc_opts o = {.fabric = "tcp", .records = 10000, .iters = 20000, .window = 1,
                         .cpu_client = -1, .cpu_server = -1,
                         .paths = {TERN_DOC_PATH_AUTO}, .n_paths = 1};
    uint64_t v = 0;
    int c;

    o.works[0] = (struct dwork){.name = "A", .op = OP_MIX, .mix = ycsb_workload_find("A")};
    o.n_works = 1;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;

        switch (c) {
        case 'f':
            o.fabric = optarg;
            ok = opt_choice(me, "--fabric", optarg, tern_tp_fabric_names(), all) >= 0;
            break;
        case 'W': ok = parse_works(optarg, &o); break;
        case 'D':
            o.zipfian = strcmp(optarg, "zipfian") == 0;
            ok = opt_choice(me, "--dist", optarg, dists, NULL) >= 0;
            break;
        case 'r': ok = opt_num(me, "--records", optarg, 10, 1ull << 32, OPT_SIZE, &o.records); break;
        case 'n': ok = opt_num(me, "--iters", optarg, 1, 1ull << 40, OPT_SIZE, &o.iters); break;
        case 'w':
            ok = opt_num(me, "--window", optarg, 1, 256, 0, &v);
            o.window = (unsigned)v;
            break;
        case 'j': o.json = true; break;
        case 'p': ok = bench_parse_cpu(me, optarg, &o.cpu_client, &o.cpu_server); break;
        case 'd': o.pool_dir = optarg; break;
        case 'T': ok = parse_paths(optarg, &o); break;
        case 'h': usage(stdout); return 0;
        case 'V': return opt_version("rpcbench");
        default:
            fprintf(stderr, "Try 'rpcbench doc --help' for the options.\n");
            return OPT_USAGE;
        }
        if (!ok)
            return OPT_USAGE;
    }
    if (optind < argc)
        return opt_usage_error(me, "unexpected argument '%s'", argv[optind]);
    if (!o.pool_dir)
        o.pool_dir = bench_default_pool_dir();
    return run_local(&o);
}
