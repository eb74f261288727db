/* mongo-load: a closed-loop load of ~1 KiB documents through the MongoDB C
 * driver (Debian's libmongoc), for compare-postgres.sh: the same documents
 * and operations as its pgbench scripts, against any server that speaks
 * the MongoDB protocol (ternd --mongo-port).
 *
 *   mongo-load --uri URI [--db DB] [--coll C] --op OP [--clients N]
 *              [--seconds S] [--records N] [--keys K] [--seed X]
 *
 * OP is one of
 *   load    create the index on f1, then insert documents 0..N-1 (batches
 *           of 1000, one client)
 *   insert  insert one new document per call (ids above 2^40, apart per
 *           client and per --seed)
 *   read    find {_id: k}, limit 1, k uniform in 0..N-1
 *   find    find {f1: v} (the indexed field), v uniform in 0..K-1, every hit
 *           read (N/K documents each; K is N/10+1 unless --keys says)
 *   update  update {_id: k} with {$inc: {cnt: 1}, $set: {f2: <96 chars>}}
 * Each of N clients is a thread with its own connection, one call at a
 * time (as pgbench's clients), for S seconds. Prints one line:
 *   op=read clients=4 seconds=10.00 ops=123456 ops_per_s=12345.6 misses=0 errors=0
 * where misses counts reads that found nothing and updates that matched
 * nothing (a wrong load). Exit 1 on any error.
 *
 * The document is rpcbench doc's (tools/rpcbench/doc.c), which
 * compare-postgres.sh's mkdoc() builds as JSONB: _id (int64), f1 the
 * decimal text of id mod K, f0 and f2..f9 96 copies of the letter
 * 'a' + (id + j) mod 26, cnt (int32 0). About 1 KiB of BSON. */
#include <mongoc/mongoc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FIELD_LEN 96
#define INSERT_BASE (1ll << 40)
#define LOAD_BATCH 1000
#define MAX_CLIENTS 256

enum op { OP_LOAD, OP_INSERT, OP_READ, OP_FIND, OP_UPDATE };

static const char *g_uri = "mongodb://127.0.0.1:27017", *g_db = "bench", *g_coll = "docs";
static enum op g_op;
static unsigned g_clients = 1;
static double g_seconds = 10;
static int64_t g_records = 200000, g_keys;
static uint64_t g_seed = 1;
static atomic_bool g_stop;

struct worker {
    pthread_t t;
    unsigned id;
    uint64_t ops, misses, errors;
    char err[600];
};

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void f1_of(int64_t id, char *out)
{
    snprintf(out, FIELD_LEN + 1, "%lld", (long long)(id % g_keys));
}

static bson_t *make_doc(int64_t id)
{
    bson_t *d = bson_sized_new(1100);
    char key[3] = {'f', 0, 0}, val[FIELD_LEN + 1];

    BSON_APPEND_INT64(d, "_id", id);
    for (int j = 0; j < 10; j++) {
        key[1] = (char)('0' + j);
        if (j == 1) {
            f1_of(id, val);
        } else {
            memset(val, 'a' + (int)((id + j) % 26), FIELD_LEN);
            val[FIELD_LEN] = 0;
        }
        bson_append_utf8(d, key, 2, val, -1);
    }
    BSON_APPEND_INT32(d, "cnt", 0);
    return d;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static mongoc_client_t *connect_client(void)
{
    mongoc_client_t *c = mongoc_client_new(g_uri);

    if (c)
        mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
    return c;
}

static void fail(struct worker *w, const char *what, const bson_error_t *e)
{
    if (!w->errors++)
        snprintf(w->err, sizeof(w->err), "%s: %s", what, e->message);
}

/* Every document of a find, counted. */
static int64_t drain(mongoc_cursor_t *cur, struct worker *w)
{
    const bson_t *d;
    bson_error_t e;
    int64_t n = 0;

    while (mongoc_cursor_next(cur, &d))
        n++;
    if (mongoc_cursor_error(cur, &e)) {
        fail(w, "find", &e);
        n = -1;
    }
    mongoc_cursor_destroy(cur);
    return n;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    mongoc_client_t *cl = connect_client();
    mongoc_collection_t *coll;
    uint64_t rnd = g_seed * 0x9E3779B97F4A7C15ull + w->id + 1;
    /* New ids: above the loaded ones, apart per client and per --seed. */
    int64_t next_id = INSERT_BASE + (int64_t)(g_seed & 0x3fff) * (1ll << 48) +
                      (int64_t)w->id * (1ll << 40);
    bson_t *one = BCON_NEW("limit", BCON_INT64(1), "singleBatch", BCON_BOOL(true));
    char f2[FIELD_LEN + 1], v[FIELD_LEN + 1];
    bson_error_t e;

    memset(f2, 'u', FIELD_LEN);
    f2[FIELD_LEN] = 0;
    if (!cl) {
        snprintf(w->err, sizeof(w->err), "bad URI %s", g_uri);
        w->errors++;
        bson_destroy(one);
        return NULL;
    }
    coll = mongoc_client_get_collection(cl, g_db, g_coll);
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        int64_t k = (int64_t)(xorshift(&rnd) % (uint64_t)g_records), n;
        bson_t *q, *u, reply;

        switch (g_op) {
        case OP_INSERT:
            q = make_doc(next_id++);
            if (!mongoc_collection_insert_one(coll, q, NULL, NULL, &e))
                fail(w, "insert", &e);
            bson_destroy(q);
            break;
        case OP_READ:
            q = BCON_NEW("_id", BCON_INT64(k));
            n = drain(mongoc_collection_find_with_opts(coll, q, one, NULL), w);
            w->misses += n == 0;
            bson_destroy(q);
            break;
        case OP_FIND:
            f1_of((int64_t)(xorshift(&rnd) % (uint64_t)g_keys), v);
            q = BCON_NEW("f1", BCON_UTF8(v));
            n = drain(mongoc_collection_find_with_opts(coll, q, NULL, NULL), w);
            w->misses += n == 0;
            bson_destroy(q);
            break;
        case OP_UPDATE:
            q = BCON_NEW("_id", BCON_INT64(k));
            u = BCON_NEW("$inc", "{", "cnt", BCON_INT32(1), "}", "$set", "{", "f2", BCON_UTF8(f2), "}");
            if (!mongoc_collection_update_one(coll, q, u, NULL, &reply, &e)) {
                fail(w, "update", &e);
            } else {
                bson_iter_t it;

                if (!bson_iter_init_find(&it, &reply, "matchedCount") ||
                    bson_iter_as_int64(&it) != 1)
                    w->misses++;
            }
            bson_destroy(&reply);
            bson_destroy(q);
            bson_destroy(u);
            break;
        case OP_LOAD:
            break;
        }
        w->ops++;
        if (w->errors)
            break;
    }
    bson_destroy(one);
    mongoc_collection_destroy(coll);
    mongoc_client_destroy(cl);
    return NULL;
}

/* Documents 0..N-1 and the index on f1, from one client. */
static int load(void)
{
    mongoc_client_t *cl = connect_client();
    mongoc_database_t *db;
    mongoc_collection_t *coll;
    bson_t *batch[LOAD_BATCH], *cmd, reply;
    bson_error_t e;
    double t0 = now_s();
    int rc = 0;

    if (!cl) {
        fprintf(stderr, "mongo-load: bad URI %s\n", g_uri);
        return 1;
    }
    db = mongoc_client_get_database(cl, g_db);
    coll = mongoc_client_get_collection(cl, g_db, g_coll);
    if (!mongoc_collection_drop_with_opts(coll, NULL, &e) && e.code != 26 &&
        !strstr(e.message, "ns not found")) {
        fprintf(stderr, "mongo-load: drop: %s\n", e.message);
        rc = 1;
    }
    cmd = BCON_NEW("createIndexes", BCON_UTF8(g_coll), "indexes", "[",
                   "{", "key", "{", "f1", BCON_INT32(1), "}", "name", "f1_1", "}", "]");
    if (rc == 0 && !mongoc_database_write_command_with_opts(db, cmd, NULL, &reply, &e)) {
        fprintf(stderr, "mongo-load: createIndexes: %s\n", e.message);
        rc = 1;
    }
    if (rc == 0)
        bson_destroy(&reply);     /* initialised by the call only if it ran */
    bson_destroy(cmd);
    for (int64_t id = 0; rc == 0 && id < g_records; id += LOAD_BATCH) {
        size_t n = 0;

        for (; n < LOAD_BATCH && id + (int64_t)n < g_records; n++)
            batch[n] = make_doc(id + (int64_t)n);
        if (!mongoc_collection_insert_many(coll, (const bson_t **)batch, n, NULL, NULL, &e)) {
            fprintf(stderr, "mongo-load: insert at %lld: %s\n", (long long)id, e.message);
            rc = 1;
        }
        for (size_t i = 0; i < n; i++)
            bson_destroy(batch[i]);
    }
    if (rc == 0)
        printf("op=load records=%lld seconds=%.2f\n", (long long)g_records, now_s() - t0);
    mongoc_collection_destroy(coll);
    mongoc_database_destroy(db);
    mongoc_client_destroy(cl);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mongo-load --uri URI [--db DB] [--coll C] --op load|insert|read|find|update\n"
               "                  [--clients N] [--seconds S] [--records N] [--keys K] [--seed X]\n");
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"load", "insert", "read", "find", "update"};
    static struct worker w[MAX_CLIENTS];
    uint64_t total = 0, misses = 0, errors = 0;
    bool have_op = false;
    double t0, secs;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--uri"))
            g_uri = v;
        else if (!strcmp(a, "--db"))
            g_db = v;
        else if (!strcmp(a, "--coll"))
            g_coll = v;
        else if (!strcmp(a, "--clients"))
            g_clients = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--seconds"))
            g_seconds = strtod(v, NULL);
        else if (!strcmp(a, "--records"))
            g_records = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--keys"))
            g_keys = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--seed"))
            g_seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--op")) {
            for (unsigned k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
                if (!strcmp(v, ops[k])) {
                    g_op = (enum op)k;
                    have_op = true;
                }
            if (!have_op) {
                fprintf(stderr, "mongo-load: --op: no such op '%s'\n", v);
                return 2;
            }
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!g_keys)
        g_keys = g_records / 10 + 1;
    if (!have_op || g_clients < 1 || g_clients > MAX_CLIENTS || g_records < 1 || g_keys < 1 ||
        g_seconds <= 0) {
        usage(stderr);
        return 2;
    }
    mongoc_init();
    if (g_op == OP_LOAD) {
        int rc = load();

        mongoc_cleanup();
        return rc;
    }
    t0 = now_s();
    for (unsigned i = 0; i < g_clients; i++) {
        w[i].id = i;
        if (pthread_create(&w[i].t, NULL, work, &w[i])) {
            fprintf(stderr, "mongo-load: cannot start client %u\n", i);
            return 1;
        }
    }
    usleep((useconds_t)(g_seconds * 1e6));
    atomic_store(&g_stop, true);
    for (unsigned i = 0; i < g_clients; i++) {
        pthread_join(w[i].t, NULL);
        total += w[i].ops;
        misses += w[i].misses;
        errors += w[i].errors;
        if (w[i].errors)
            fprintf(stderr, "mongo-load: client %u: %s\n", i, w[i].err);
    }
    secs = now_s() - t0;
    printf("op=%s clients=%u seconds=%.2f ops=%llu ops_per_s=%.1f misses=%llu errors=%llu\n",
           ops[g_op], g_clients, secs, (unsigned long long)total, total / secs,
           (unsigned long long)misses, (unsigned long long)errors);
    mongoc_cleanup();
    return errors ? 1 : 0;
}
