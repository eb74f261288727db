/* The CRUD script of tests/mongo/README.md through the MongoDB C driver
 * (Debian's libmongoc 1.23). Prints the canonical transcript on stdout,
 * one JSON line per step, as crud.py and crud.js do; tests/mongo/run.sh
 * diffs them.
 *
 *   crud URI DB
 *
 * Exit 0 once every step has run (a step that failed unexpectedly prints
 * an "unexpected_error" line, which no expected line matches), 1 if the
 * server could not be reached, 2 on usage. */
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h"

#define NPEOPLE 20
#define NBIG 10000

static mongoc_client_t *g_client;
static mongoc_database_t *g_db;
static mongoc_collection_t *g_people, *g_big;

static void emit_error(const char *step, const bson_error_t *err)
{
    bson_t *f = bson_new();
    char msg[600];

    snprintf(msg, sizeof(msg), "domain %u code %u: %s", err->domain, err->code, err->message);
    BSON_APPEND_UTF8(f, "unexpected_error", msg);
    canon_emit(step, f);
}

/* ---- reading replies ---- */

static int64_t reply_int(const bson_t *reply, const char *key)
{
    bson_iter_t it;

    if (bson_iter_init_find(&it, reply, key) &&
        (BSON_ITER_HOLDS_INT32(&it) || BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_DOUBLE(&it)))
        return bson_iter_as_int64(&it);
    return -1;
}

/* The documents of a cursor into an array under `key` of `out`; false
 * with *err if the cursor failed. Destroys the cursor. */
static bool append_cursor(bson_t *out, const char *key, mongoc_cursor_t *cur, bson_error_t *err)
{
    const bson_t *d;
    bson_t arr;
    char idx[16];
    const char *ks;
    uint32_t i = 0;
    bool ok;

    bson_append_array_begin(out, key, -1, &arr);
    while (mongoc_cursor_next(cur, &d)) {
        bson_uint32_to_string(i++, &ks, idx, sizeof(idx));
        bson_append_document(&arr, ks, -1, d);
    }
    bson_append_array_end(out, &arr);
    ok = !mongoc_cursor_error(cur, err);
    mongoc_cursor_destroy(cur);
    return ok;
}

/* find(filter, opts) with its documents under "docs". */
static void step_find(const char *step, mongoc_collection_t *c, bson_t *filter, bson_t *opts)
{
    bson_t *f = bson_new();
    bson_error_t err;

    if (append_cursor(f, "docs", mongoc_collection_find_with_opts(c, filter, opts, NULL), &err))
        canon_emit(step, f);
    else {
        bson_destroy(f);
        emit_error(step, &err);
    }
    bson_destroy(filter);
    if (opts)
        bson_destroy(opts);
}

/* find_one: the first document or null under "doc". */
static void step_find_one(const char *step, bson_t *filter)
{
    bson_t *opts = BCON_NEW("limit", BCON_INT64(1), "singleBatch", BCON_BOOL(true));
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(g_people, filter, opts, NULL);
    const bson_t *d;
    bson_error_t err;
    bson_t *f = bson_new();

    if (mongoc_cursor_next(cur, &d))
        BSON_APPEND_DOCUMENT(f, "doc", d);
    else
        BSON_APPEND_NULL(f, "doc");
    if (mongoc_cursor_error(cur, &err)) {
        bson_destroy(f);
        emit_error(step, &err);
    } else {
        canon_emit(step, f);
    }
    mongoc_cursor_destroy(cur);
    bson_destroy(opts);
    bson_destroy(filter);
}

static bool insert_docs(mongoc_collection_t *c, bson_t **docs, size_t n, const bson_t *opts,
                        bson_t *reply, bson_error_t *err)
{
    bool ok = mongoc_collection_insert_many(c, (const bson_t **)docs, n, opts, reply, err);

    for (size_t i = 0; i < n; i++)
        bson_destroy(docs[i]);
    return ok;
}

static void step_update(const char *step, bson_t *sel, bson_t *upd, bool upsert)
{
    bson_t *opts = BCON_NEW("upsert", BCON_BOOL(upsert));
    bson_t reply, *f;
    bson_error_t err;
    bson_iter_t it;

    if (!mongoc_collection_update_many(g_people, sel, upd, opts, &reply, &err)) {
        emit_error(step, &err);
    } else {
        f = bson_new();
        BSON_APPEND_INT64(f, "matched", reply_int(&reply, "matchedCount"));
        BSON_APPEND_INT64(f, "modified", reply_int(&reply, "modifiedCount"));
        if (bson_iter_init_find(&it, &reply, "upsertedId"))
            BSON_APPEND_VALUE(f, "upserted_id", bson_iter_value(&it));
        else
            BSON_APPEND_NULL(f, "upserted_id");
        canon_emit(step, f);
    }
    bson_destroy(&reply);
    bson_destroy(opts);
    bson_destroy(sel);
    bson_destroy(upd);
}

static void step_delete(const char *step, bson_t *sel, bool many)
{
    bson_t reply;
    bson_error_t err;
    bool ok = many ? mongoc_collection_delete_many(g_people, sel, NULL, &reply, &err)
                   : mongoc_collection_delete_one(g_people, sel, NULL, &reply, &err);

    if (ok)
        canon_emit(step, BCON_NEW("n", BCON_INT64(reply_int(&reply, "deletedCount"))));
    else
        emit_error(step, &err);
    bson_destroy(&reply);
    bson_destroy(sel);
}

/* count_documents; -1 and *err on failure. */
static int64_t count(mongoc_collection_t *c, bson_t *filter, bson_t *opts, bson_error_t *err)
{
    int64_t n = mongoc_collection_count_documents(c, filter, opts, NULL, NULL, err);

    bson_destroy(filter);
    if (opts)
        bson_destroy(opts);
    return n;
}

/* An insert that must fail with a duplicate key: its code, or null if it
 * went in. */
static void step_dup_one(const char *step, bson_t *doc)
{
    bson_error_t err;
    bson_t *f = bson_new();

    if (mongoc_collection_insert_one(g_people, doc, NULL, NULL, &err))
        BSON_APPEND_NULL(f, "code");
    else if (err.domain == MONGOC_ERROR_SERVER || err.domain == MONGOC_ERROR_WRITE_CONCERN)
        BSON_APPEND_INT64(f, "code", err.code);
    else {
        bson_destroy(f);
        emit_error(step, &err);
        bson_destroy(doc);
        return;
    }
    canon_emit(step, f);
    bson_destroy(doc);
}

/* insert_many of `n` docs that must hit one duplicate key: the first
 * write error's code and index, how many errors, how many went in. */
static void step_dup_many(const char *step, bson_t **docs, size_t n, bool ordered)
{
    bson_t *opts = BCON_NEW("ordered", BCON_BOOL(ordered));
    bson_t reply, *f = bson_new();
    bson_error_t err;
    bson_iter_t it, we;

    if (insert_docs(g_people, docs, n, opts, &reply, &err)) {
        BSON_APPEND_NULL(f, "code");
    } else if (bson_iter_init_find(&it, &reply, "writeErrors") && BSON_ITER_HOLDS_ARRAY(&it) &&
               bson_iter_recurse(&it, &we) && bson_iter_next(&we)) {
        bson_iter_t e = we, x;
        int64_t errors = 1;

        if (bson_iter_recurse(&e, &x) && bson_iter_find(&x, "code"))
            BSON_APPEND_INT64(f, "code", bson_iter_as_int64(&x));
        if (bson_iter_recurse(&e, &x) && bson_iter_find(&x, "index"))
            BSON_APPEND_INT64(f, "index", bson_iter_as_int64(&x));
        while (bson_iter_next(&we))
            errors++;
        BSON_APPEND_INT64(f, "errors", errors);
        BSON_APPEND_INT64(f, "inserted", reply_int(&reply, "insertedCount"));
    } else {
        bson_destroy(f);
        emit_error(step, &err);
        f = NULL;
    }
    if (f)
        canon_emit(step, f);
    bson_destroy(&reply);
    bson_destroy(opts);
}

/* drop, where a collection that is not there is no error (as pymongo). */
static bool drop(mongoc_collection_t *c, bson_error_t *err)
{
    if (mongoc_collection_drop_with_opts(c, NULL, err))
        return true;
    return err->domain == MONGOC_ERROR_SERVER &&
           (err->code == 26 || strstr(err->message, "ns not found"));
}

int main(int argc, char **argv)
{
    static const char *const cities[] = {"Oslo", "Lima", "Pune", "Kyiv"};
    bson_t *docs[NBIG], *f, *cmd, reply, arr;
    mongoc_cursor_t *cur;
    const bson_t *d;
    bson_error_t err;
    bson_iter_t it;
    mongoc_uri_t *uri;
    char name[16];
    int64_t n[5];
    int rc = 0;

    if (argc != 3) {
        fprintf(stderr, "usage: %s URI DB\n", argv[0]);
        return 2;
    }
    mongoc_init();
    uri = mongoc_uri_new_with_error(argv[1], &err);
    if (!uri) {
        fprintf(stderr, "crud: %s: %s\n", argv[1], err.message);
        return 2;
    }
    mongoc_uri_set_option_as_int32(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, 20000);
    g_client = mongoc_client_new_from_uri(uri);
    mongoc_uri_destroy(uri);
    mongoc_client_set_error_api(g_client, MONGOC_ERROR_API_VERSION_2);
    mongoc_client_set_appname(g_client, "tern-crud-c");
    g_db = mongoc_client_get_database(g_client, argv[2]);
    g_people = mongoc_client_get_collection(g_client, argv[2], "people");
    g_big = mongoc_client_get_collection(g_client, argv[2], "big");
    if (!drop(g_people, &err) || !drop(g_big, &err)) {
        fprintf(stderr, "crud: drop: %s\n", err.message);
        rc = 1;
        goto out;
    }

    /* insert_many */
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
    if (insert_docs(g_people, docs, NPEOPLE, NULL, &reply, &err))
        canon_emit("insert_many", BCON_NEW("n", BCON_INT64(reply_int(&reply, "insertedCount"))));
    else
        emit_error("insert_many", &err);
    bson_destroy(&reply);

    /* A raw insert without _id: the server makes the ObjectId. */
    cmd = BCON_NEW("insert", "people", "documents", "[",
                   "{", "name", "noid", "age", BCON_INT32(60), "city", "Oslo",
                   "tags", "[", "z", "]", "score", BCON_DOUBLE(0.25), "}", "]");
    if (mongoc_database_write_command_with_opts(g_db, cmd, NULL, &reply, &err)) {
        bson_t sub;

        f = bson_new();
        bson_append_document_begin(f, "reply", -1, &sub);
        if (bson_iter_init_find(&it, &reply, "n"))
            BSON_APPEND_VALUE(&sub, "n", bson_iter_value(&it));
        if (bson_iter_init_find(&it, &reply, "ok"))
            BSON_APPEND_VALUE(&sub, "ok", bson_iter_value(&it));
        bson_append_document_end(f, &sub);
        canon_emit("insert_noid", f);
    } else {
        emit_error("insert_noid", &err);
    }
    bson_destroy(&reply);
    bson_destroy(cmd);
    step_find_one("find_noid", BCON_NEW("name", "noid"));

    step_find("find", g_people,
              BCON_NEW("age", "{", "$gte", BCON_INT32(30), "}",
                       "city", "{", "$in", "[", "Oslo", "Lima", "]", "}"),
              BCON_NEW("projection", "{", "name", BCON_INT32(1), "age", BCON_INT32(1),
                       "_id", BCON_INT32(0), "}",
                       "sort", "{", "age", BCON_INT32(-1), "name", BCON_INT32(1), "}",
                       "limit", BCON_INT64(4)));
    step_find("find_array", g_people, BCON_NEW("tags", "b"),
              BCON_NEW("projection", "{", "tags", BCON_INT32(0), "score", BCON_INT32(0), "}",
                       "sort", "{", "_id", BCON_INT32(1), "}",
                       "skip", BCON_INT64(1), "limit", BCON_INT64(3)));
    step_find_one("find_one_missing", BCON_NEW("name", "nobody"));

    /* 10,000 documents and a cursor over them. */
    {
        char pad[101];

        memset(pad, 'x', 100);
        pad[100] = 0;
        for (int i = 0; i < NBIG; i++)
            docs[i] = BCON_NEW("_id", BCON_INT32(i), "v", BCON_INT32(i % 97), "pad", BCON_UTF8(pad));
    }
    if (insert_docs(g_big, docs, NBIG, NULL, &reply, &err))
        canon_emit("insert_big", BCON_NEW("n", BCON_INT64(reply_int(&reply, "insertedCount"))));
    else
        emit_error("insert_big", &err);
    bson_destroy(&reply);
    {
        bson_t *filter = bson_new(), *opts = BCON_NEW("sort", "{", "_id", BCON_INT32(1), "}",
                                                      "batchSize", BCON_INT64(500));
        int64_t cnt = 0, first = -1, last = -1, prev = -1, sum_v = 0;
        bool ordered = true;

        cur = mongoc_collection_find_with_opts(g_big, filter, opts, NULL);
        while (mongoc_cursor_next(cur, &d)) {
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
        if (mongoc_cursor_error(cur, &err))
            emit_error("cursor", &err);
        else
            canon_emit("cursor", BCON_NEW("n", BCON_INT64(cnt), "first", BCON_INT64(first),
                                    "last", BCON_INT64(last), "ordered", BCON_BOOL(ordered),
                                    "sum_v", BCON_INT64(sum_v)));
        mongoc_cursor_destroy(cur);
        bson_destroy(filter);
        bson_destroy(opts);

        filter = BCON_NEW("v", "{", "$lt", BCON_INT32(10), "}");
        cur = mongoc_collection_find_with_opts(g_big, filter, NULL, NULL);
        for (cnt = 0; mongoc_cursor_next(cur, &d);)
            cnt++;
        if (mongoc_cursor_error(cur, &err))
            emit_error("cursor_filter", &err);
        else
            canon_emit("cursor_filter", BCON_NEW("n", BCON_INT64(cnt)));
        mongoc_cursor_destroy(cur);
        bson_destroy(filter);
    }

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
    step_find("find_upserted", g_people, BCON_NEW("age", "{", "$gte", BCON_INT32(50), "}"),
              BCON_NEW("projection", "{", "_id", BCON_INT32(0), "name", BCON_INT32(1),
                       "age", BCON_INT32(1), "city", BCON_INT32(1), "visited", BCON_INT32(1), "}",
                       "sort", "{", "name", BCON_INT32(1), "}"));

    step_delete("delete_one", BCON_NEW("name", "p03"), false);
    step_delete("delete_many", BCON_NEW("age", "{", "$lt", BCON_INT32(25), "}"), true);
    step_delete("delete_none", BCON_NEW("name", "nobody"), true);

    n[0] = count(g_people, bson_new(), NULL, &err);
    if (n[0] >= 0)
        n[1] = count(g_people, BCON_NEW("city", "Lima"), NULL, &err);
    if (n[0] >= 0 && n[1] >= 0)
        n[2] = count(g_people, BCON_NEW("city", "Atlantis"), NULL, &err);
    if (n[0] >= 0 && n[1] >= 0 && n[2] >= 0)
        n[3] = count(g_people, bson_new(), BCON_NEW("skip", BCON_INT64(2), "limit", BCON_INT64(5)),
                     &err);
    if (n[0] >= 0 && n[1] >= 0 && n[2] >= 0 && n[3] >= 0)
        n[4] = count(g_big, bson_new(), NULL, &err);
    if (n[0] >= 0 && n[1] >= 0 && n[2] >= 0 && n[3] >= 0 && n[4] >= 0)
        canon_emit("count", BCON_NEW("all", BCON_INT64(n[0]), "lima", BCON_INT64(n[1]),
                               "none", BCON_INT64(n[2]), "skip_limit", BCON_INT64(n[3]),
                               "big", BCON_INT64(n[4])));
    else
        emit_error("count", &err);

    /* libmongoc 1.23 has no create_index helper that is not deprecated:
     * its manual's way is the createIndexes command, which names the index
     * as the other drivers do (key_direction). */
    cmd = BCON_NEW("createIndexes", "people", "indexes", "[",
                   "{", "key", "{", "name", BCON_INT32(1), "}", "name", "name_1",
                   "unique", BCON_BOOL(true), "}", "]");
    if (mongoc_database_write_command_with_opts(g_db, cmd, NULL, &reply, &err))
        canon_emit("create_index", BCON_NEW("name", "name_1"));
    else
        emit_error("create_index", &err);
    bson_destroy(&reply);
    bson_destroy(cmd);
    {
        /* Only key, name and unique, sorted by name, as crud.py. */
        bson_t *ix[8];
        size_t nix = 0;

        cur = mongoc_collection_find_indexes_with_opts(g_people, NULL);
        while (nix < 8 && mongoc_cursor_next(cur, &d)) {
            static const char *const keep[] = {"key", "name", "unique"};

            ix[nix] = bson_new();
            for (int k = 0; k < 3; k++)
                if (bson_iter_init_find(&it, d, keep[k]))
                    BSON_APPEND_VALUE(ix[nix], keep[k], bson_iter_value(&it));
            nix++;
        }
        if (mongoc_cursor_error(cur, &err)) {
            emit_error("list_indexes", &err);
        } else {
            bson_t a;
            const char *ks;
            char idx[16];

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
                bson_uint32_to_string(i, &ks, idx, sizeof(idx));
                bson_append_document(&a, ks, -1, ix[i]);
            }
            bson_append_array_end(f, &a);
            canon_emit("list_indexes", f);
        }
        for (size_t i = 0; i < nix; i++)
            bson_destroy(ix[i]);
        mongoc_cursor_destroy(cur);
    }

    step_dup_one("dup_one", BCON_NEW("_id", BCON_INT32(200), "name", "p01"));
    step_dup_one("dup_id", BCON_NEW("_id", BCON_INT32(1), "name", "other"));
    docs[0] = BCON_NEW("_id", BCON_INT32(300), "name", "q1");
    docs[1] = BCON_NEW("_id", BCON_INT32(301), "name", "p02");
    docs[2] = BCON_NEW("_id", BCON_INT32(302), "name", "q3");
    step_dup_many("dup_many", docs, 3, true);
    docs[0] = BCON_NEW("_id", BCON_INT32(303), "name", "p04");
    docs[1] = BCON_NEW("_id", BCON_INT32(304), "name", "q4");
    step_dup_many("dup_unordered", docs, 2, false);
    n[0] = count(g_people, bson_new(), NULL, &err);
    if (n[0] >= 0)
        canon_emit("count_after", BCON_NEW("all", BCON_INT64(n[0])));
    else
        emit_error("count_after", &err);

    {
        bson_t *pipe = BCON_NEW("pipeline", "[",
                                "{", "$match", "{", "age", "{", "$gte", BCON_INT32(20), "}", "}", "}",
                                "{", "$group", "{", "_id", "$city", "n", "{", "$sum", BCON_INT32(1), "}",
                                "avg_age", "{", "$avg", "$age", "}",
                                "min_age", "{", "$min", "$age", "}",
                                "max_age", "{", "$max", "$age", "}", "}", "}",
                                "{", "$sort", "{", "_id", BCON_INT32(1), "}", "}", "]");

        f = bson_new();
        if (append_cursor(f, "docs", mongoc_collection_aggregate(g_people, MONGOC_QUERY_NONE, pipe,
                                                                 NULL, NULL), &err))
            canon_emit("aggregate", f);
        else {
            bson_destroy(f);
            emit_error("aggregate", &err);
        }
        bson_destroy(pipe);
        pipe = BCON_NEW("pipeline", "[", "{", "$group", "{", "_id", BCON_NULL,
                        "n", "{", "$sum", BCON_INT32(1), "}", "total", "{", "$sum", "$v", "}",
                        "}", "}", "]");
        f = bson_new();
        if (append_cursor(f, "docs", mongoc_collection_aggregate(g_big, MONGOC_QUERY_NONE, pipe,
                                                                 NULL, NULL), &err))
            canon_emit("aggregate_big", f);
        else {
            bson_destroy(f);
            emit_error("aggregate_big", &err);
        }
        bson_destroy(pipe);
    }
out:
    mongoc_collection_destroy(g_people);
    mongoc_collection_destroy(g_big);
    mongoc_database_destroy(g_db);
    mongoc_client_destroy(g_client);
    mongoc_cleanup();
    return rc;
}
