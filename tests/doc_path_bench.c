/* How a result batch of the document service should travel, per fabric:
 * inline in the reply (the server copies the batch into the send buffer,
 * the client copies it out of the reply into its cursor) or by one-sided
 * put (the server copies it into a registered staging slot and puts it
 * into the client's buffer, the reply says only its size, the client
 * reads it in place). Both sides do what doc_service.c and doc_client.c
 * do with a batch, without the command itself, which costs the same
 * either way. Prints batches/s and MB/s for 16 KiB .. 1 MiB per fabric.
 *
 * With `doc`, the same through the document service itself (when built):
 * a find whose first batch is the size asked, read through a cursor, on
 * TERN_DOC_PATH_RPC against TERN_DOC_PATH_ONESIDED.
 *
 *   doc-path-bench [seconds per point, default 0.5] [doc]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rpc.h"
#include "tern_config.h"
#include "transport.h"
#if TERN_HAVE_DOC_SERVICE
#include "doc.h"
#include "doc_service.h"
#endif

#define SVC 0x6462
#define M_INLINE 1
#define M_PUSH 2
#define MAX_BATCH (1u << 20)
#define MAX_MSG (MAX_BATCH + 4096)
#define SLOTS 8
#define ROUNDS 5
/* Adaptive: the machine has few cores, shared; spinning pollers starve
 * each other. */
#define MODE TERN_TP_POLL_ADAPTIVE

struct push_req {
    uint32_t len;
    uint32_t slot;
    struct tern_tp_rkey dst;
};

static uint8_t *batch;             /* the server's "reply document" */
static struct tern_rpc_mr *stage;
static struct tern_rpc_ep *srv_ep;

static int h_inline(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint32_t n;
    uint8_t *out;

    (void)ctx;
    if (len != sizeof(n))
        return TERN_EPROTO;
    memcpy(&n, data, sizeof(n));
    out = tern_reply_alloc(req, 16 + n);
    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out + 16, batch, n);
    return 0;
}

static unsigned pending[SLOTS];

static void put_done(void *arg, int status)
{
    (void)status;
    pending[(unsigned *)arg - pending]--;
}

/* The largest put the fabric took so far. */
static size_t chunk = MAX_BATCH;

/* Put the batch in pieces as large as the fabric takes (ntb: one ring
 * record), halved until one goes, as doc_service.c does. */
static int put_pieces(struct tern_req *req, const struct push_req *q, int i)
{
    size_t soff = (size_t)i * MAX_BATCH;
    int rc = 0;

    memcpy((uint8_t *)tern_rpc_mr_addr(stage) + soff, batch, q->len);
    for (size_t off = 0; off < q->len;) {
        size_t n = q->len - off < chunk ? q->len - off : chunk;

        rc = tern_session_put(tern_req_session(req), stage, soff + off, n, &q->dst,
                              (uint64_t)q->slot * MAX_BATCH + off, put_done, &pending[i]);
        if (rc == TERN_EMSGSIZE && n > 4096) {
            chunk = n / 2;
            continue;
        }
        if (rc < 0)
            return rc;
        pending[i]++;
        off += n;
    }
    return 0;
}

static int h_push(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_session *s = tern_req_session(req);
    struct push_req q;
    uint8_t *out;
    void *p;
    int i, rc;

    (void)ctx;
    if (len != sizeof(q))
        return TERN_EPROTO;
    memcpy(&q, data, sizeof(q));
    for (i = 0; i < SLOTS && pending[i]; i++)
        ;
    if (i == SLOTS)
        return TERN_EAGAIN;
    if (tern_session_caps(s) & TERN_TP_CAP_RKEY_PTR) {
        /* shm: straight into the client's mapped buffer; inline while it
         * is being mapped (as doc_service.c) */
        rc = tern_session_rkey_ptr(s, &q.dst, (uint64_t)q.slot * MAX_BATCH, q.len,
                                   TERN_TP_ACCESS_REMOTE_WRITE, &p);
        if (rc == 0)
            memcpy(p, batch, q.len);
    } else {
        rc = put_pieces(req, &q, i);
    }
    if (rc < 0) {
        /* Not mapped yet, the fabric's queue full: the batch goes inline. */
        out = tern_reply_alloc(req, 16 + q.len);
        if (!out)
            return TERN_EMSGSIZE;
        memset(out, 1, 16);
        memcpy(out + 16, batch, q.len);
        return 0;
    }
    out = tern_reply_alloc(req, 16);
    if (!out)
        return TERN_EMSGSIZE;
    memset(out, 0, 16);
    return 0;
}

static const struct tern_method methods[] = {
    {.id = M_INLINE, .name = "inline", .handler = h_inline},
    {.id = M_PUSH, .name = "push", .handler = h_push},
};
static const struct tern_service service = {.name = "bench", .id = SVC, .methods = methods,
                                            .n_methods = 2};

static void stop(int sig)
{
    (void)sig;
    tern_rpc_stop(srv_ep);
}

static pid_t serve(const char *listen, char *uri, size_t cap)
{
    int fds[2];
    pid_t pid;

    if (pipe(fds) < 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        struct tern_rpc_config cfg = {.size = sizeof(cfg), .max_msg = MAX_MSG, .mode = MODE};
        char bound[128];

        batch = malloc(MAX_BATCH);
        memset(batch, 0x5a, MAX_BATCH);
        if (tern_rpc_open(&cfg, &srv_ep) < 0 || tern_rpc_register(srv_ep, &service) < 0 ||
            tern_rpc_mr_alloc(srv_ep, (size_t)SLOTS * MAX_BATCH, TERN_TP_ACCESS_LOCAL, &stage) < 0 ||
            tern_rpc_listen(srv_ep, listen, bound, sizeof(bound)) < 0)
            _exit(2);
        signal(SIGTERM, stop);
        if (write(fds[1], bound, strlen(bound) + 1) < 0)
            _exit(3);
        tern_rpc_run(srv_ep, 120000000000ll);
        tern_rpc_close(srv_ep);
        _exit(0);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], uri, cap - 1);
    close(fds[0]);
    uri[n > 0 ? n : 0] = 0;
    return n > 1 ? pid : -1;
}

#if TERN_HAVE_DOC_SERVICE
/* ---- through the document service ---- */

#define DOC_BYTES 1000      /* documents of about 1 KiB */
#define DOCS 2200           /* 2 MiB: the largest batch and then some */

static char pool_path[128];

static void doc_setup(void)
{
    struct tern_doc_service_opts o = {.pool_path = pool_path, .pool_size = 256u << 20,
                                      .max_msg = MAX_MSG};
    struct tern_doc_service *svc;

    if (tern_doc_service_open(&o, &svc) < 0 || tern_rpc_register(srv_ep, tern_doc_service_def(svc)) < 0 ||
        tern_doc_service_enable_onesided(svc, srv_ep, 0) < 0)
        _exit(2);
}

static pid_t doc_serve(const char *listen, char *uri, size_t cap)
{
    int fds[2];
    pid_t pid;

    if (pipe(fds) < 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        struct tern_rpc_config cfg = {.size = sizeof(cfg), .max_msg = MAX_MSG, .mode = MODE};
        char bound[128];

        if (tern_rpc_open(&cfg, &srv_ep) < 0)
            _exit(2);
        doc_setup();
        if (tern_rpc_listen(srv_ep, listen, bound, sizeof(bound)) < 0)
            _exit(2);
        signal(SIGTERM, stop);
        if (write(fds[1], bound, strlen(bound) + 1) < 0)
            _exit(3);
        tern_rpc_run(srv_ep, 300000000000ll);
        tern_rpc_close(srv_ep);
        _exit(0);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], uri, cap - 1);
    close(fds[0]);
    uri[n > 0 ? n : 0] = 0;
    return n > 1 ? pid : -1;
}

/* One find whose first batch holds `k` documents, read to its end. */
static int doc_batch(struct tern_doc *doc, int32_t k)
{
    bson_t *opts = BCON_NEW("batchSize", BCON_INT32(k), "limit", BCON_INT64(k));
    struct tern_doc_cursor *cur;
    const bson_t *view;
    int rc = tern_doc_find(doc, "bench", "b", NULL, opts, &cur), n = 0;

    if (rc == 0) {
        while ((rc = tern_doc_cursor_next(cur, &view)) == 1)
            n++;
        tern_doc_cursor_close(cur);
    }
    bson_destroy(opts);
    return rc < 0 ? rc : n;
}

static int doc_bench(double secs)
{
    static const uint32_t sizes[] = {16u << 10, 64u << 10, 256u << 10, 1u << 20};
    const char *const *names = tern_tp_fabric_names();
    char pad[DOC_BYTES];

    memset(pad, 'x', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = 0;
    printf("%-6s %8s %14s %14s %10s %10s %7s  (document service, find + cursor)\n", "fabric",
           "batch", "inline b/s", "pushed b/s", "inl MB/s", "push MB/s", "push/in");
    for (int f = 0; names[f]; f++) {
        struct tern_rpc_config cfg = {.size = sizeof(cfg), .max_msg = MAX_MSG, .mode = MODE};
        char listen[128], uri[128];
        const char *u = uri;
        struct tern_rpc_ep *ep;
        struct tern_doc *doc;
        struct tern_doc_stats st;
        pid_t pid;

        snprintf(pool_path, sizeof(pool_path), "/dev/shm/doc-path-bench-%d-%d.pool", (int)getpid(), f);
        if (tern_tp_local_uri(names[f], NULL, listen, sizeof(listen)) < 0)
            continue;
        pid = doc_serve(listen, uri, sizeof(uri));
        if (pid < 0 || tern_rpc_open(&cfg, &ep) < 0 || tern_doc_open(ep, &u, 1, 5000000000ull, &doc) < 0) {
            fprintf(stderr, "%s: no server\n", names[f]);
            if (pid > 0)
                kill(pid, SIGKILL);
            continue;
        }
        for (int i = 0; i < DOCS; i += 100) {
            bson_t *d[100];

            for (int j = 0; j < 100; j++)
                d[j] = BCON_NEW("_id", BCON_INT32(i + j), "pad", BCON_UTF8(pad));
            if (tern_doc_insert_many(doc, "bench", "b", (const bson_t *const *)d, 100, true, NULL) < 0)
                fprintf(stderr, "%s: insert failed\n", names[f]);
            for (int j = 0; j < 100; j++)
                bson_destroy(d[j]);
        }
        doc_batch(doc, 1);
        for (unsigned k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            /* documents of ~1 KiB with their index keys: sizes[k] of batch */
            int32_t n = (int32_t)(sizes[k] / (DOC_BYTES + 30));
            uint64_t ops_of[2] = {0, 0}, ns_of[2] = {0, 0};
            double rate[2];

            for (int round = 0; round < 2 * ROUNDS; round++) {
                int way = round & 1;
                uint64_t t0 = tern_now_ns(), end = t0 + (uint64_t)(secs * 1e9 / ROUNDS);

                tern_doc_set_path(doc, way ? TERN_DOC_PATH_ONESIDED : TERN_DOC_PATH_RPC);
                do {
                    int rc = doc_batch(doc, n);

                    if (rc != n) {
                        fprintf(stderr, "%s %d docs: %s\n", names[f], n, rc < 0 ? tern_strerror(rc) : "short");
                        break;
                    }
                    ops_of[way]++;
                } while (tern_now_ns() < end);
                ns_of[way] += tern_now_ns() - t0;
            }
            for (int way = 0; way < 2; way++)
                rate[way] = (double)ops_of[way] / ((double)ns_of[way] / 1e9);
            printf("%-6s %7uK %14.0f %14.0f %10.0f %10.0f %7.2f\n", names[f], sizes[k] >> 10, rate[0],
                   rate[1], rate[0] * sizes[k] / 1e6, rate[1] * sizes[k] / 1e6, rate[1] / rate[0]);
            fflush(stdout);
        }
        tern_doc_get_stats(doc, &st);
        printf("%-6s pushed %llu, inline %llu batches\n", names[f],
               (unsigned long long)st.batches_pushed, (unsigned long long)st.batches_inline);
        tern_doc_close(doc);
        tern_rpc_close(ep);
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        unlink(pool_path);
    }
    return 0;
}
#endif

int main(int argc, char **argv)
{
    static const uint32_t sizes[] = {16u << 10, 64u << 10, 256u << 10, 1u << 20};
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    const char *const *names = tern_tp_fabric_names();
    static uint8_t reply[MAX_MSG], cursor[MAX_BATCH];

#if TERN_HAVE_DOC_SERVICE
    if (argc > 2 && !strcmp(argv[2], "doc"))
        return doc_bench(secs);
#endif

    printf("%-6s %8s %14s %14s %10s %10s %7s %8s\n", "fabric", "batch", "inline b/s", "pushed b/s",
           "inl MB/s", "push MB/s", "push/in", "fell");
    for (int f = 0; names[f]; f++) {
        struct tern_rpc_config cfg = {.size = sizeof(cfg), .max_msg = MAX_MSG, .mode = MODE};
        char listen[128], uri[128];
        struct tern_rpc_ep *ep;
        struct tern_session *s;
        struct tern_rpc_mr *buf;
        struct tern_tp_rkey rkey;
        pid_t pid;

        if (tern_tp_local_uri(names[f], NULL, listen, sizeof(listen)) < 0)
            continue;
        pid = serve(listen, uri, sizeof(uri));
        if (pid < 0 || tern_rpc_open(&cfg, &ep) < 0 ||
            tern_rpc_connect(ep, uri, 5000000000ull, &s) < 0 ||
            tern_rpc_mr_alloc(ep, (size_t)SLOTS * MAX_BATCH,
                              TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE, &buf) < 0 ||
            tern_rpc_mr_rkey(buf, s, &rkey) < 0) {
            fprintf(stderr, "%s: no server\n", names[f]);
            if (pid > 0)
                kill(pid, SIGKILL);
            continue;
        }
        for (unsigned k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            uint32_t n = sizes[k];
            double rate[2];

            uint64_t ops_of[2] = {0, 0}, ns_of[2] = {0, 0}, fell = 0;

            /* Rounds of each way in turn, so that the load of a shared
             * machine falls on both alike. */
            for (int round = 0; round < 2 * ROUNDS; round++) {
                int way = round & 1;
                uint64_t t0 = tern_now_ns(), end = t0 + (uint64_t)(secs * 1e9 / ROUNDS), ops = 0;
                volatile uint8_t sink = 0;

                do {
                    size_t len;
                    int rc;

                    if (way == 0) {
                        rc = tern_call_sync(s, SVC, M_INLINE, &n, sizeof(n), reply, sizeof(reply),
                                            &len, 5000000000ull);
                        /* the cursor keeps the batch past the reply */
                        if (rc == 0)
                            memcpy(cursor, reply + 16, n);
                        sink ^= cursor[n - 1];
                    } else {
                        struct push_req q = {.len = n, .slot = (uint32_t)(ops % SLOTS), .dst = rkey};

                        rc = tern_call_sync(s, SVC, M_PUSH, &q, sizeof(q), reply, sizeof(reply),
                                            &len, 5000000000ull);
                        if (rc == 0 && len > 16) {
                            memcpy(cursor, reply + 16, n);     /* fell back inline */
                            fell++;
                        }
                        sink ^= ((uint8_t *)tern_rpc_mr_addr(buf))[(size_t)q.slot * MAX_BATCH + n - 1];
                    }
                    if (rc < 0) {
                        fprintf(stderr, "%s %u %s: %s\n", names[f], n, way ? "push" : "inline",
                                tern_strerror(rc));
                        break;
                    }
                    ops++;
                } while (tern_now_ns() < end);
                (void)sink;
                ops_of[way] += ops;
                ns_of[way] += tern_now_ns() - t0;
            }
            for (int way = 0; way < 2; way++)
                rate[way] = (double)ops_of[way] / ((double)ns_of[way] / 1e9);
            printf("%-6s %7uK %14.0f %14.0f %10.0f %10.0f %7.2f %8.3f\n", names[f], n >> 10, rate[0],
                   rate[1], rate[0] * n / 1e6, rate[1] * n / 1e6, rate[1] / rate[0],
                   ops_of[1] ? (double)fell / (double)ops_of[1] : 0.0);
            fflush(stdout);
        }
        tern_rpc_mr_dereg(buf);
        tern_rpc_close(ep);
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    return 0;
}
