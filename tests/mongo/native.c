/* The CRUD script of tests/mongo/README.md through tern's native document
 * API (include/tern/doc.h) over tern RPC, printing the same canonical
 * transcript as the MongoDB drivers' scripts: run.sh diffs them, so the
 * gateway and the native service are seen to give the same answers.
 *
 *   native URI DB          (URI: ternd's tern RPC address, tcp://...)
 *
 * Where doc.h's helpers return less than the script records (the _id of an
 * upsert, the number of write errors of a batch), the helper's async form
 * is used, whose callback gets the server's whole reply. The count with
 * skip and limit and the list of indexes have no helper: they go through
 * tern_doc_command, as a driver sends them. Exit 0 once every step has
 * run, 1 if ternd could not be reached, 2 on usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h"
#include "doc.h"
#include "error.h"
#include "rpc.h"

#define NPEOPLE 20
#define NBIG 10000
#define SEC 1000000000ull

static struct tern_rpc_ep *g_ep;
static struct tern_doc *g_doc;
static const char *g_db;

static void emit_error(const char *step, const char *what, int rc)
{
    const struct tern_doc_error *e = tern_doc_last_error(g_doc);
    bson_t *f = bson_new();
    char msg[800];

    snprintf(msg, sizeof(msg), "%s: %s (code %d %s: %s)", what, tern_strerror(rc), e->code,
             e->code_name, e->errmsg);
    BSON_APPEND_UTF8(f, "unexpected_error", msg);
    canon_emit(step, f);
}

/* ---- async calls, waited for: the whole reply ---- */

struct wait {
    bool done;
    int status;
    bson_t reply;
};

static void on_reply(void *arg, int status, const bson_t *reply)
{
    struct wait *w = arg;

    w->status = status;
    if (reply)
        bson_copy_to(reply, &w->reply);
    else
        bson_init(&w->reply);
    w->done = true;
}

/* Poll until the call started with `rc` completes; its status. */
static int wait_reply(int rc, struct wait *w)
{
    if (rc < 0) {
        bson_init(&w->reply);
        return rc;
    }
    for (unsigned long i = 0; !w->done && i < 100000000ul; i++)
        tern_rpc_poll(g_ep);
    if (!w->done) {
        bson_init(&w->reply);
        return TERN_ETIMEDOUT;
    }
    return w->status;
}

static int64_t reply_int(const bson_t *reply, const char *key)
{
    bson_iter_t it;

    if (bson_iter_init_find(&it, reply, key) &&
        (BSON_ITER_HOLDS_INT32(&it) || BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_DOUBLE(&it)))
        return bson_iter_as_int64(&it);
    return -1;
}

/* ---- steps ---- */

/* The documents of a cursor into an array under `key` of `out`. */
static int append_cursor(bson_t *out, const char *key, struct tern_doc_cursor *cur)
{
    const bson_t *d;
    bson_t arr;
    char idx[16];
    const char *ks;
    uint32_t i = 0;
    int rc;

    bson_append_array_begin(out, key, -1, &arr);
    while ((rc = tern_doc_cursor_next(cur, &d)) == 1) {
        bson_uint32_to_string(i++, &ks, idx, sizeof(idx));
        bson_append_document(&arr, ks, -1, d);
    }
    bson_append_array_end(out, &arr);
    tern_doc_cursor_close(cur);
    return rc;
}

static void step_find(const char *step, const char *coll, bson_t *filter, bson_t *opts)
{
    struct tern_doc_cursor *cur;
    bson_t *f = bson_new();
    int rc = tern_doc_find(g_doc, g_db, coll, filter, opts, &cur);

    if (rc == 0)
        rc = append_cursor(f, "docs", cur);
    if (rc < 0) {
        bson_destroy(f);
        emit_error(step, "find", rc);
    } else {
        canon_emit(step, f);
    }
    bson_destroy(filter);
    if (opts)
        bson_destroy(opts);
}

/* find_one: the first document, or null. */
static void step_find_one(const char *step, bson_t *filter)
{
    bson_t *opts = BCON_NEW("limit", BCON_INT64(1));
    struct tern_doc_cursor *cur;
    const bson_t *d;
    bson_t *f = bson_new();
    int rc = tern_doc_find(g_doc, g_db, "people", filter, opts, &cur);

    if (rc == 0) {
        rc = tern_doc_cursor_next(cur, &d);
        if (rc == 1)
            BSON_APPEND_DOCUMENT(f, "doc", d);
        else if (rc == 0)
            BSON_APPEND_NULL(f, "doc");
        tern_doc_cursor_close(cur);
    }
    if (rc < 0) {
        bson_destroy(f);
        emit_error(step, "find", rc);
    } else {
        canon_emit(step, f);
    }
    bson_destroy(opts);
    bson_destroy(filter);
}

static int insert_docs(const char *coll, bson_t **docs, size_t n, bool ordered, uint64_t *inserted)
{
    int rc = tern_doc_insert_many(g_doc, g_db, coll, (const bson_t *const *)docs, n, ordered,
                                  inserted);

    for (size_t i = 0; i < n; i++)
        bson_destroy(docs[i]);
    return rc;
}

/* update_many; MongoDB's reply says n (matched + upserted), nModified and
 * upserted: [{index, _id}]. */
static void step_update(const char *step, bson_t *sel, bson_t *upd, bool upsert)
{
    struct wait w = {0};
    int rc = wait_reply(tern_doc_update_async(g_doc, g_db, "people", sel, upd, upsert, true,
                                              on_reply, &w), &w);
    bson_iter_t it, up;

    if (rc < 0) {
        emit_error(step, "update", rc);
    } else {
        bson_t *f = bson_new();
        int64_t ups = 0;
        bool have_id = false;
        bson_iter_t id;

        if (bson_iter_init_find(&it, &w.reply, "upserted") && BSON_ITER_HOLDS_ARRAY(&it) &&
            bson_iter_recurse(&it, &up))
            while (bson_iter_next(&up))
                if (ups++ == 0 && bson_iter_recurse(&up, &id) && bson_iter_find(&id, "_id"))
                    have_id = true;
        if (have_id)
            BSON_APPEND_VALUE(f, "upserted_id", bson_iter_value(&id));
        else
            BSON_APPEND_NULL(f, "upserted_id");
        BSON_APPEND_INT64(f, "matched", reply_int(&w.reply, "n") - ups);
        BSON_APPEND_INT64(f, "modified", reply_int(&w.reply, "nModified"));
        canon_emit(step, f);
    }
    bson_destroy(&w.reply);
    bson_destroy(sel);
    bson_destroy(upd);
}

static void step_delete(const char *step, bson_t *sel, bool many)
{
    uint64_t n = 0;
    int rc = many ? tern_doc_delete_many(g_doc, g_db, "people", sel, &n)
                  : tern_doc_delete_one(g_doc, g_db, "people", sel, &n);

    if (rc < 0)
        emit_error(step, "delete", rc);
    else
        canon_emit(step, BCON_NEW("n", BCON_INT64((int64_t)n)));
    bson_destroy(sel);
}

static int count(const char *coll, bson_t *filter, int64_t *n)
{
    uint64_t c = 0;
    int rc = tern_doc_count(g_doc, g_db, coll, filter, &c);

    *n = (int64_t)c;
    bson_destroy(filter);
    return rc;
}

/* An insert that must fail with a duplicate key: MongoDB's code, or null
 * if it went in. */
static void step_dup_one(const char *step, bson_t *doc)
{
    int rc = tern_doc_insert_one(g_doc, g_db, "people", doc);

    if (rc == 0)
        canon_emit(step, BCON_NEW("code", BCON_NULL));
    else if (rc == TERN_EEXIST)
        canon_emit(step, BCON_NEW("code", BCON_INT64(tern_doc_last_error(g_doc)->code)));
    else
        emit_error(step, "insert", rc);
    bson_destroy(doc);
}

/* insert_many of `n` docs that must hit one duplicate key: the first
 * write error's code and index, how many errors, how many went in. */
static void step_dup_many(const char *step, bson_t **docs, size_t n, bool ordered)
{
    struct wait w = {0};
    int rc = wait_reply(tern_doc_insert_many_async(g_doc, g_db, "people",
                                                   (const bson_t *const *)docs, n, ordered,
                                                   on_reply, &w), &w);
    bson_iter_t it, we;

    for (size_t i = 0; i < n; i++)
        bson_destroy(docs[i]);
    if (rc == 0) {
        canon_emit(step, BCON_NEW("code", BCON_NULL));
    } else if (bson_iter_init_find(&it, &w.reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY(&it) &&
               bson_iter_recurse(&it, &we) && bson_iter_next(&we)) {
        bson_t *f = bson_new();
        bson_iter_t e = we, x;
        int64_t errors = 1;

        if (bson_iter_recurse(&e, &x) && bson_iter_find(&x, "code"))
            BSON_APPEND_INT64(f, "code", bson_iter_as_int64(&x));
        if (bson_iter_recurse(&e, &x) && bson_iter_find(&x, "index"))
            BSON_APPEND_INT64(f, "index", bson_iter_as_int64(&x));
        while (bson_iter_next(&we))
            errors++;
        BSON_APPEND_INT64(f, "errors", errors);
        BSON_APPEND_INT64(f, "inserted", reply_int(&w.reply, "n"));
        canon_emit(step, f);
    } else {
        emit_error(step, "insert", rc);
    }
    bson_destroy(&w.reply);
}

static int drop(const char *coll)
{
    int rc = tern_doc_drop(g_doc, g_db, coll);

    return rc == TERN_ENOENT ? 0 : rc;
}

static void people_docs(bson_t **docs)
{
    static const char *const cities[] = {"Oslo", "Lima", "Pune", "Kyiv"};
    char name[16];
    bson_t arr;

    for (int i = 0; i < NPEOPLE; i++) {
        snprintf(name, sizeof(name), "p%02d", i);
        docs[i] = BCON_NEW("_id", BCON_INT32(i), "name", BCON_UTF8(name),
                           "age", BCON_INT32(20 + (i * 7) % 30), "city", BCON_UTF8(cities[i % 4]));
        bson_append_array_begin(docs[i], "tags", -1, &arr);
        if (i % 3 == 0)
            BSON_APPEND_UTF8(&arr, "0", "a");
        if (i % 3 != 2)
            BSON_APPEND_UTF8(&arr, i % 3 == 0 ? "1" : "0", "b");
        bson_append_array_end(docs[i], &arr);
        BSON_APPEND_DOUBLE(docs[i], "score", i / 2.0);
    }
}

static void cursor_steps(void)
{
    bson_t *opts = BCON_NEW("sort", "{", "_id", BCON_INT32(1), "}", "batchSize", BCON_INT64(500));
    bson_t *filter = BCON_NEW("v", "{", "$lt", BCON_INT32(10), "}");
    int64_t cnt = 0, first = -1, last = -1, prev = -1, sum_v = 0;
    struct tern_doc_cursor *cur;
    bool ordered = true;
    const bson_t *d;
    bson_iter_t it;
    int rc = tern_doc_find(g_doc, g_db, "big", NULL, opts, &cur);

    if (rc == 0) {
        while ((rc = tern_doc_cursor_next(cur, &d)) == 1) {
            int64_t id = bson_iter_init_find(&it, d, "_id") ? bson_iter_as_int64(&it) : -1;

            if (first < 0)
                first = id;
            last = id;
            ordered = ordered && id > prev;
            prev = id;
            if (bson_iter_init_find(&it, d, "v"))
                sum_v += bson_iter_as_int64(&it);
            cnt++;
        }
        tern_doc_cursor_close(cur);
    }
    if (rc < 0)
        emit_error("cursor", "find", rc);
    else
        canon_emit("cursor", BCON_NEW("n", BCON_INT64(cnt), "first", BCON_INT64(first),
                                      "last", BCON_INT64(last), "ordered", BCON_BOOL(ordered),
                                      "sum_v", BCON_INT64(sum_v)));
    bson_destroy(opts);

    rc = tern_doc_find(g_doc, g_db, "big", filter, NULL, &cur);
    if (rc == 0) {
        for (cnt = 0; (rc = tern_doc_cursor_next(cur, &d)) == 1;)
            cnt++;
        tern_doc_cursor_close(cur);
    }
    if (rc < 0)
        emit_error("cursor_filter", "find", rc);
    else
        canon_emit("cursor_filter", BCON_NEW("n", BCON_INT64(cnt)));
    bson_destroy(filter);
}

static void count_steps(void)
{
    bson_t *cmd = BCON_NEW("count", "people", "query", "{", "}", "skip", BCON_INT64(2),
                           "limit", BCON_INT64(5));
    int64_t n[5] = {0};
    bson_t reply;
    int rc = count("people", bson_new(), &n[0]);

    if (rc == 0)
        rc = count("people", BCON_NEW("city", "Lima"), &n[1]);
    if (rc == 0)
        rc = count("people", BCON_NEW("city", "Atlantis"), &n[2]);
    if (rc == 0) {
        rc = tern_doc_command(g_doc, g_db, cmd, &reply);
        n[3] = reply_int(&reply, "n");
        bson_destroy(&reply);
    }
    if (rc == 0)
        rc = count("big", bson_new(), &n[4]);
    if (rc == 0)
        canon_emit("count", BCON_NEW("all", BCON_INT64(n[0]), "lima", BCON_INT64(n[1]),
                                     "none", BCON_INT64(n[2]), "skip_limit", BCON_INT64(n[3]),
                                     "big", BCON_INT64(n[4])));
    else
        emit_error("count", "count", rc);
    bson_destroy(cmd);
}

/* Only key, name and unique of each index, sorted by name, as crud.py. */
static void list_indexes(void)
{
    bson_t *cmd = BCON_NEW("listIndexes", "people"), reply, *ix[8], *f, a;
    bson_iter_t it, b;
    size_t nix = 0;
    int rc = tern_doc_command(g_doc, g_db, cmd, &reply);

    if (rc < 0) {
        emit_error("list_indexes", "listIndexes", rc);
        goto out;
    }
    if (bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "cursor.firstBatch", &b) &&
        BSON_ITER_HOLDS_ARRAY(&b) && bson_iter_recurse(&b, &it))
        while (nix < 8 && bson_iter_next(&it)) {
            static const char *const keep[] = {"key", "name", "unique"};
            const uint8_t *data;
            uint32_t len;
            bson_t d;
            bson_iter_t x;

            if (!BSON_ITER_HOLDS_DOCUMENT(&it))
                continue;
            bson_iter_document(&it, &len, &data);
            if (!bson_init_static(&d, data, len))
                continue;
            ix[nix] = bson_new();
            for (int k = 0; k < 3; k++)
                if (bson_iter_init_find(&x, &d, keep[k]))
                    BSON_APPEND_VALUE(ix[nix], keep[k], bson_iter_value(&x));
            nix++;
        }
    for (size_t i = 1; i < nix; i++)
        for (size_t j = i; j > 0; j--) {
            bson_iter_t x, y;
            bson_t *t;

            if (!bson_iter_init_find(&x, ix[j - 1], "name") ||
                !bson_iter_init_find(&y, ix[j], "name") ||
                strcmp(bson_iter_utf8(&x, NULL), bson_iter_utf8(&y, NULL)) <= 0)
                break;
            t = ix[j - 1];
            ix[j - 1] = ix[j];
            ix[j] = t;
        }
    f = bson_new();
    bson_append_array_begin(f, "indexes", -1, &a);
    for (uint32_t i = 0; i < nix; i++) {
        const char *ks;
        char idx[16];

        bson_uint32_to_string(i, &ks, idx, sizeof(idx));
        bson_append_document(&a, ks, -1, ix[i]);
        bson_destroy(ix[i]);
    }
    bson_append_array_end(f, &a);
    canon_emit("list_indexes", f);
out:
    bson_destroy(&reply);
    bson_destroy(cmd);
}

static void aggregate_steps(void)
{
    bson_t *pipe = BCON_NEW("0", "{", "$match", "{", "age", "{", "$gte", BCON_INT32(20), "}", "}", "}",
                            "1", "{", "$group", "{", "_id", "$city", "n", "{", "$sum", BCON_INT32(1), "}",
                            "avg_age", "{", "$avg", "$age", "}",
                            "min_age", "{", "$min", "$age", "}",
                            "max_age", "{", "$max", "$age", "}", "}", "}",
                            "2", "{", "$sort", "{", "_id", BCON_INT32(1), "}", "}");
    struct tern_doc_cursor *cur;
    bson_t *f = bson_new();
    int rc = tern_doc_aggregate(g_doc, g_db, "people", pipe, NULL, &cur);

    if (rc == 0)
        rc = append_cursor(f, "docs", cur);
    if (rc < 0) {
        bson_destroy(f);
        emit_error("aggregate", "aggregate", rc);
    } else {
        canon_emit("aggregate", f);
    }
    bson_destroy(pipe);
    pipe = BCON_NEW("0", "{", "$group", "{", "_id", BCON_NULL, "n", "{", "$sum", BCON_INT32(1), "}",
                    "total", "{", "$sum", "$v", "}", "}", "}");
    f = bson_new();
    rc = tern_doc_aggregate(g_doc, g_db, "big", pipe, NULL, &cur);
    if (rc == 0)
        rc = append_cursor(f, "docs", cur);
    if (rc < 0) {
        bson_destroy(f);
        emit_error("aggregate_big", "aggregate", rc);
    } else {
        canon_emit("aggregate_big", f);
    }
    bson_destroy(pipe);
}

int main(int argc, char **argv)
{
    static bson_t *docs[NBIG];
    const char *uri, *uris[7];
    unsigned n_uris = 0;
    bson_t *cmd, reply, *keys;
    uint64_t inserted = 0;
    int64_t n;
    int rc;

    if (argc != 3) {
        fprintf(stderr, "usage: %s URI[,URI...] DB\n", argv[0]);
        return 2;
    }
    /* Several: the replicas of a replicated store, the primary found and
     * followed by the client. */
    uri = argv[1];
    for (char *at = argv[1], *comma; at && n_uris < 7; at = comma ? comma + 1 : NULL) {
        comma = strchr(at, ',');
        if (comma)
            *comma = 0;
        uris[n_uris++] = at;
    }
    g_db = argv[2];
    rc = tern_rpc_open(NULL, &g_ep);
    if (rc == 0)
        rc = tern_doc_open(g_ep, uris, n_uris, 20 * SEC, &g_doc);
    if (rc < 0) {
        fprintf(stderr, "native: %s: %s\n", uri, tern_strerror(rc));
        return 1;
    }
    tern_doc_set_timeout(g_doc, 60 * SEC);
    if ((rc = drop("people")) < 0 || (rc = drop("big")) < 0) {
        fprintf(stderr, "native: drop: %s\n", tern_strerror(rc));
        tern_doc_close(g_doc);
        tern_rpc_close(g_ep);
        return 1;
    }

    people_docs(docs);
    rc = insert_docs("people", docs, NPEOPLE, true, &inserted);
    if (rc < 0)
        emit_error("insert_many", "insert", rc);
    else
        canon_emit("insert_many", BCON_NEW("n", BCON_INT64((int64_t)inserted)));

    /* A raw insert without _id: the server makes the ObjectId. */
    cmd = BCON_NEW("insert", "people", "documents", "[",
                   "{", "name", "noid", "age", BCON_INT32(60), "city", "Oslo",
                   "tags", "[", "z", "]", "score", BCON_DOUBLE(0.25), "}", "]");
    rc = tern_doc_command(g_doc, g_db, cmd, &reply);
    if (rc < 0) {
        emit_error("insert_noid", "insert", rc);
    } else {
        bson_t *f = bson_new(), sub;
        bson_iter_t it;

        bson_append_document_begin(f, "reply", -1, &sub);
        if (bson_iter_init_find(&it, &reply, "n"))
            BSON_APPEND_VALUE(&sub, "n", bson_iter_value(&it));
        if (bson_iter_init_find(&it, &reply, "ok"))
            BSON_APPEND_VALUE(&sub, "ok", bson_iter_value(&it));
        bson_append_document_end(f, &sub);
        canon_emit("insert_noid", f);
    }
    bson_destroy(&reply);
    bson_destroy(cmd);
    step_find_one("find_noid", BCON_NEW("name", "noid"));

    step_find("find", "people",
              BCON_NEW("age", "{", "$gte", BCON_INT32(30), "}",
                       "city", "{", "$in", "[", "Oslo", "Lima", "]", "}"),
              BCON_NEW("projection", "{", "name", BCON_INT32(1), "age", BCON_INT32(1),
                       "_id", BCON_INT32(0), "}",
                       "sort", "{", "age", BCON_INT32(-1), "name", BCON_INT32(1), "}",
                       "limit", BCON_INT64(4)));
    step_find("find_array", "people", BCON_NEW("tags", "b"),
              BCON_NEW("projection", "{", "tags", BCON_INT32(0), "score", BCON_INT32(0), "}",
                       "sort", "{", "_id", BCON_INT32(1), "}",
                       "skip", BCON_INT64(1), "limit", BCON_INT64(3)));
    step_find_one("find_one_missing", BCON_NEW("name", "nobody"));

    {
        char pad[101];

        memset(pad, 'x', 100);
        pad[100] = 0;
        for (int i = 0; i < NBIG; i++)
            docs[i] = BCON_NEW("_id", BCON_INT32(i), "v", BCON_INT32(i % 97), "pad", BCON_UTF8(pad));
    }
    rc = insert_docs("big", docs, NBIG, true, &inserted);
    if (rc < 0)
        emit_error("insert_big", "insert", rc);
    else
        canon_emit("insert_big", BCON_NEW("n", BCON_INT64((int64_t)inserted)));
    cursor_steps();

    step_update("update_many", BCON_NEW("city", "Oslo"),
                BCON_NEW("$inc", "{", "age", BCON_INT32(1), "}",
                         "$set", "{", "visited", BCON_BOOL(true), "}"), false);
    step_update("upsert_many", BCON_NEW("name", "zed"),
                BCON_NEW("$set", "{", "age", BCON_INT32(99), "}",
                         "$setOnInsert", "{", "city", "Nowhere", "}"), true);
    step_update("upsert_id", BCON_NEW("_id", BCON_INT32(100)),
                BCON_NEW("$set", "{", "name", "hundred", "age", BCON_INT32(50), "}"), true);
    step_update("upsert_again", BCON_NEW("name", "zed"),
                BCON_NEW("$set", "{", "age", BCON_INT32(98), "}"), true);
    step_find("find_upserted", "people", BCON_NEW("age", "{", "$gte", BCON_INT32(50), "}"),
              BCON_NEW("projection", "{", "_id", BCON_INT32(0), "name", BCON_INT32(1),
                       "age", BCON_INT32(1), "city", BCON_INT32(1), "visited", BCON_INT32(1), "}",
                       "sort", "{", "name", BCON_INT32(1), "}"));

    step_delete("delete_one", BCON_NEW("name", "p03"), false);
    step_delete("delete_many", BCON_NEW("age", "{", "$lt", BCON_INT32(25), "}"), true);
    step_delete("delete_none", BCON_NEW("name", "nobody"), true);
    count_steps();

    keys = BCON_NEW("name", BCON_INT32(1));
    rc = tern_doc_create_index(g_doc, g_db, "people", keys, NULL, true);
    if (rc < 0)
        emit_error("create_index", "createIndexes", rc);
    else
        canon_emit("create_index", BCON_NEW("name", "name_1"));
    bson_destroy(keys);
    list_indexes();

    step_dup_one("dup_one", BCON_NEW("_id", BCON_INT32(200), "name", "p01"));
    step_dup_one("dup_id", BCON_NEW("_id", BCON_INT32(1), "name", "other"));
    docs[0] = BCON_NEW("_id", BCON_INT32(300), "name", "q1");
    docs[1] = BCON_NEW("_id", BCON_INT32(301), "name", "p02");
    docs[2] = BCON_NEW("_id", BCON_INT32(302), "name", "q3");
    step_dup_many("dup_many", docs, 3, true);
    docs[0] = BCON_NEW("_id", BCON_INT32(303), "name", "p04");
    docs[1] = BCON_NEW("_id", BCON_INT32(304), "name", "q4");
    step_dup_many("dup_unordered", docs, 2, false);
    rc = count("people", bson_new(), &n);
    if (rc < 0)
        emit_error("count_after", "count", rc);
    else
        canon_emit("count_after", BCON_NEW("all", BCON_INT64(n)));
    aggregate_steps();

    tern_doc_close(g_doc);
    tern_rpc_close(g_ep);
    return 0;
}
