/* The native document API (doc.h) across processes: a doc server
 * (tern_doc_service, tests/lib/doc_servers.h) in a forked child, the test
 * process the client, on every fabric built. Covers each call, sync and
 * async; MongoDB's errors as tern codes and as last_error (a duplicate
 * key, a bad filter, an unknown command); a cursor over 10,000 documents
 * on each result path, and RMongo's one-sided path where the fabric has
 * puts (the counters say it carried the batches); a client that dies
 * mid-cursor and a session that closes (the server frees their cursors);
 * hostile requests on a raw session. */
#include "tern_config.h"

#if TERN_HAVE_DOC_SERVICE

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "doc.h"
#include "doc_servers.h"
#include "doc_wire.h"
#include "fabrics.h"
#include "helpers.h"
#include "procs.h"
#include "rpc_util.h"
#include "suites.h"

#define SEC 1000000000ull
#define DB "test"

static struct tern_doc *open_doc(struct tern_rpc_ep *ep, int srv)
{
    const char *uri = test_doc_uri(srv);
    struct tern_doc *doc = NULL;
    int rc = tern_doc_open(ep, &uri, 1, 5 * SEC, &doc);

    ck_assert_msg(rc == 0, "tern_doc_open: %s", tern_err_name(rc));
    /* Generous: the CI machine is slow and shared. */
    tern_doc_set_timeout(doc, 30 * SEC);
    return doc;
}

/* A server on fabric row `row`, one-sided results on. */
static struct tern_doc *start(int row, struct tern_rpc_ep **ep)
{
    struct test_doc_srv o = {.listen = test_fabric_listen(row), .onesided = true};

    test_doc_start(0, &o);
    *ep = test_rpc_ep(NULL);
    test_rpc_assert_fabric(*ep, test_doc_uri(0), row);
    return open_doc(*ep, 0);
}

static void finish(struct tern_doc *doc, struct tern_rpc_ep *ep)
{
    tern_doc_close(doc);
    tern_rpc_close(ep);
    test_doc_finish(0);
    test_doc_cleanup();
}

static int64_t field_int(const bson_t *d, const char *key)
{
    bson_iter_t it;

    ck_assert_msg(bson_iter_init_find(&it, d, key) && BSON_ITER_HOLDS_NUMBER(&it),
                  "no number %s", key);
    return bson_iter_as_int64(&it);
}

#define MUST(call)                                                                           \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        ck_assert_msg(rc_ == 0, "%s: %s (%d %s: %s)", #call, tern_err_name(rc_),             \
                      tern_doc_last_error(doc)->code, tern_doc_last_error(doc)->code_name,   \
                      tern_doc_last_error(doc)->errmsg);                                     \
    } while (0)

/* ---- every call ---- */

struct async_res {
    int done, status;
    int64_t n;
};

static void async_cb(void *arg, int status, const bson_t *reply)
{
    struct async_res *r = arg;
    bson_iter_t it;

    r->done++;
    r->status = status;
    if (reply && bson_iter_init_find(&it, reply, "n"))
        r->n = bson_iter_as_int64(&it);
}

static void wait_async(struct tern_rpc_ep *ep, struct async_res *r)
{
    ck_assert(test_rpc_poll_until(ep, &r->done, 1, 30000));
}

START_TEST(every_call_every_fabric)
{
    struct tern_rpc_ep *ep;
    struct tern_doc *doc = start(_i, &ep);
    struct tern_doc_update_result ur;
    struct async_res ar = {0};
    bson_t *docs[100], *f, *u, out, reply;
    const bson_t *view;
    struct tern_doc_cursor *cur;
    bson_value_t id = {.value_type = BSON_TYPE_INT32};
    uint64_t n = 0;
    int seen = 0, rc;

    /* insert one and many, find by _id, count */
    f = BCON_NEW("_id", BCON_INT32(-1), "name", BCON_UTF8("first"), "v", BCON_INT32(0));
    MUST(tern_doc_insert_one(doc, DB, "c", f));
    bson_destroy(f);
    for (int i = 0; i < 100; i++)
        docs[i] = BCON_NEW("_id", BCON_INT32(i), "v", BCON_INT32(i % 10), "sub", "{",
                           "x", BCON_INT32(i), "}");
    MUST(tern_doc_insert_many(doc, DB, "c", (const bson_t *const *)docs, 100, true, &n));
    ck_assert_uint_eq(n, 100);
    for (int i = 0; i < 100; i++)
        bson_destroy(docs[i]);
    id.value.v_int32 = 42;
    MUST(tern_doc_find_id(doc, DB, "c", &id, &out));
    ck_assert_int_eq(field_int(&out, "_id"), 42);
    ck_assert_int_eq(field_int(&out, "v"), 2);
    bson_destroy(&out);
    id.value.v_int32 = 4242;
    rc = tern_doc_find_id(doc, DB, "c", &id, &out);
    ck_assert_msg(rc == TERN_ENOENT, "find_id of a missing _id: %s", tern_err_name(rc));
    MUST(tern_doc_count(doc, DB, "c", NULL, &n));
    ck_assert_uint_eq(n, 101);
    f = BCON_NEW("v", BCON_INT32(3));
    MUST(tern_doc_count(doc, DB, "c", f, &n));
    ck_assert_uint_eq(n, 10);

    /* find with a filter, projection, sort and limit */
    {
        bson_t *opts = BCON_NEW("projection", "{", "v", BCON_INT32(1), "}", "sort", "{", "_id",
                                BCON_INT32(-1), "}", "limit", BCON_INT64(4));
        int64_t want[] = {93, 83, 73, 63};

        MUST(tern_doc_find(doc, DB, "c", f, opts, &cur));
        while ((rc = tern_doc_cursor_next(cur, &view)) == 1) {
            bson_iter_t it;

            ck_assert_int_lt(seen, 4);
            ck_assert_int_eq(field_int(view, "_id"), want[seen]);
            ck_assert(!bson_iter_init_find(&it, view, "sub"));    /* projected out */
            seen++;
        }
        ck_assert_int_eq(rc, 0);
        ck_assert_int_eq(seen, 4);
        tern_doc_cursor_close(cur);
        bson_destroy(opts);
    }

    /* update one, many, with upsert */
    u = BCON_NEW("$set", "{", "tag", BCON_UTF8("three"), "}");
    MUST(tern_doc_update_one(doc, DB, "c", f, u, false, &ur));
    ck_assert_uint_eq(ur.matched, 1);
    ck_assert_uint_eq(ur.modified, 1);
    ck_assert(!ur.upserted);
    MUST(tern_doc_update_many(doc, DB, "c", f, u, false, &ur));
    ck_assert_uint_eq(ur.matched, 10);
    ck_assert_uint_eq(ur.modified, 9);          /* one had it already */
    bson_destroy(f);
    bson_destroy(u);
    f = BCON_NEW("name", BCON_UTF8("nobody"));
    u = BCON_NEW("$inc", "{", "hits", BCON_INT32(1), "}");
    MUST(tern_doc_update_many(doc, DB, "c", f, u, true, &ur));
    ck_assert(ur.upserted);
    ck_assert_uint_eq(ur.matched, 0);
    MUST(tern_doc_update_many(doc, DB, "c", f, u, true, &ur));
    ck_assert(!ur.upserted);
    ck_assert_uint_eq(ur.matched, 1);
    MUST(tern_doc_count(doc, DB, "c", NULL, &n));
    ck_assert_uint_eq(n, 102);
    bson_destroy(u);

    /* delete one and many */
    MUST(tern_doc_delete_one(doc, DB, "c", f, &n));
    ck_assert_uint_eq(n, 1);
    bson_destroy(f);
    f = BCON_NEW("v", "{", "$gte", BCON_INT32(5), "}");
    MUST(tern_doc_delete_many(doc, DB, "c", f, &n));
    ck_assert_uint_eq(n, 50);
    MUST(tern_doc_count(doc, DB, "c", NULL, &n));
    ck_assert_uint_eq(n, 51);
    bson_destroy(f);

    /* aggregate: documents per v, v < 5 */
    {
        bson_t *pipe = BCON_NEW("0", "{", "$match", "{", "v", "{", "$lt", BCON_INT32(5), "}", "}",
                                "}", "1", "{", "$group", "{", "_id", BCON_UTF8("$v"), "n", "{",
                                "$sum", BCON_INT32(1), "}", "}", "}", "2", "{", "$sort", "{",
                                "_id", BCON_INT32(1), "}", "}");

        MUST(tern_doc_aggregate(doc, DB, "c", pipe, NULL, &cur));
        seen = 0;
        while ((rc = tern_doc_cursor_next(cur, &view)) == 1) {
            ck_assert_int_eq(field_int(view, "_id"), seen);
            /* -1 and 0..99 with v 0: eleven; the others ten */
            ck_assert_int_eq(field_int(view, "n"), seen == 0 ? 11 : 10);
            seen++;
        }
        ck_assert_int_eq(rc, 0);
        ck_assert_int_eq(seen, 5);
        tern_doc_cursor_close(cur);
        bson_destroy(pipe);
    }

    /* indexes */
    {
        bson_t *k = BCON_NEW("sub.x", BCON_INT32(1));
        bson_t *cmd = BCON_NEW("listIndexes", BCON_UTF8("c"));
        bson_iter_t it;

        MUST(tern_doc_create_index(doc, DB, "c", k, NULL, true));
        MUST(tern_doc_create_index(doc, DB, "c", k, NULL, true));   /* the same again: fine */
        MUST(tern_doc_command(doc, DB, cmd, &reply));
        ck_assert(bson_iter_init(&it, &reply) &&
                  bson_iter_find_descendant(&it, "cursor.firstBatch.1.name", &it));
        ck_assert_str_eq(bson_iter_utf8(&it, NULL), "sub.x_1");
        bson_destroy(&reply);
        MUST(tern_doc_drop_index(doc, DB, "c", "sub.x_1"));
        rc = tern_doc_drop_index(doc, DB, "c", "sub.x_1");
        ck_assert_msg(rc == TERN_ENOENT, "drop a dropped index: %s", tern_err_name(rc));
        ck_assert_int_eq(tern_doc_last_error(doc)->code, 27);
        bson_destroy(k);
        bson_destroy(cmd);
    }

    /* the async forms */
    {
        bson_t *two[2] = {BCON_NEW("_id", BCON_UTF8("a1")), BCON_NEW("_id", BCON_UTF8("a2"))};

        ck_assert_int_eq(tern_doc_insert_many_async(doc, DB, "c", (const bson_t *const *)two, 2,
                                                    false, async_cb, &ar), 0);
        bson_destroy(two[0]);   /* copied at the call */
        bson_destroy(two[1]);
        wait_async(ep, &ar);
        ck_assert_int_eq(ar.status, 0);
        ck_assert_int_eq(ar.n, 2);
        f = BCON_NEW("_id", "{", "$in", "[", BCON_UTF8("a1"), BCON_UTF8("a2"), "]", "}");
        MUST(tern_doc_delete_many(doc, DB, "c", f, &n));
        ck_assert_uint_eq(n, 2);
        bson_destroy(f);
        ar = (struct async_res){0};
    }
    f = BCON_NEW("_id", BCON_UTF8("async"));
    ck_assert_int_eq(tern_doc_insert_one_async(doc, DB, "c", f, async_cb, &ar), 0);
    wait_async(ep, &ar);
    ck_assert_int_eq(ar.status, 0);
    ck_assert_int_eq(ar.n, 1);
    ar = (struct async_res){0};
    ck_assert_int_eq(tern_doc_count_async(doc, DB, "c", NULL, async_cb, &ar), 0);
    wait_async(ep, &ar);
    ck_assert_int_eq(ar.status, 0);
    ck_assert_int_eq(ar.n, 52);
    u = BCON_NEW("$set", "{", "done", BCON_BOOL(true), "}");
    ar = (struct async_res){0};
    ck_assert_int_eq(tern_doc_update_async(doc, DB, "c", f, u, false, false, async_cb, &ar), 0);
    wait_async(ep, &ar);
    ck_assert_int_eq(ar.status, 0);
    ck_assert_int_eq(ar.n, 1);
    id = (bson_value_t){.value_type = BSON_TYPE_UTF8,
                        .value.v_utf8 = {.str = (char *)"async", .len = 5}};
    ar = (struct async_res){0};
    ck_assert_int_eq(tern_doc_find_id_async(doc, DB, "c", &id, async_cb, &ar), 0);
    wait_async(ep, &ar);
    ck_assert_int_eq(ar.status, 0);
    ar = (struct async_res){0};
    ck_assert_int_eq(tern_doc_delete_async(doc, DB, "c", f, false, async_cb, &ar), 0);
    wait_async(ep, &ar);
    ck_assert_int_eq(ar.status, 0);
    ck_assert_int_eq(ar.n, 1);
    ar = (struct async_res){0};
    {
        bson_t *ping = BCON_NEW("ping", BCON_INT32(1));

        ck_assert_int_eq(tern_doc_command_async(doc, "admin", ping, async_cb, &ar), 0);
        bson_destroy(ping);     /* copied at the call */
    }
    wait_async(ep, &ar);
    ck_assert_int_eq(ar.status, 0);
    bson_destroy(f);
    bson_destroy(u);

    /* drop */
    MUST(tern_doc_drop(doc, DB, "c"));
    MUST(tern_doc_count(doc, DB, "c", NULL, &n));
    ck_assert_uint_eq(n, 0);
    finish(doc, ep);
}
END_TEST

/* ---- errors ---- */

START_TEST(errors_every_fabric)
{
    struct tern_rpc_ep *ep;
    struct tern_doc *doc = start(_i, &ep);
    const struct tern_doc_error *e = tern_doc_last_error(doc);
    struct tern_doc_cursor *cur = NULL;
    bson_t *d[4], *k, *bad, *cmd, reply;
    uint64_t n = 99;
    int rc;

    /* A duplicate _id: TERN_EEXIST, with MongoDB's 11000 behind it. */
    for (int i = 0; i < 4; i++)
        d[i] = BCON_NEW("_id", BCON_INT32(i == 2 ? 1 : i), "email", BCON_UTF8("a@b"));
    MUST(tern_doc_insert_one(doc, DB, "e", d[0]));
    MUST(tern_doc_insert_one(doc, DB, "e", d[1]));
    rc = tern_doc_insert_one(doc, DB, "e", d[1]);
    ck_assert_msg(rc == TERN_EEXIST, "duplicate _id: %s", tern_err_name(rc));
    ck_assert_int_eq(e->code, 11000);
    ck_assert_str_eq(e->code_name, "DuplicateKey");
    ck_assert_msg(strstr(e->errmsg, "E11000") != NULL, "errmsg: %s", e->errmsg);
    /* Ordered: stops at the duplicate, index 1 of the batch; unordered goes
     * on past it. */
    rc = tern_doc_insert_many(doc, DB, "e2", (const bson_t *const *)d + 1, 3, true, &n);
    ck_assert_int_eq(rc, TERN_EEXIST);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(e->index, 1);
    ck_assert_int_eq(e->code, 11000);
    ck_assert_str_eq(e->code_name, "DuplicateKey");
    rc = tern_doc_insert_many(doc, DB, "e3", (const bson_t *const *)d, 4, false, &n);
    ck_assert_int_eq(rc, TERN_EEXIST);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(e->index, 2);

    /* A unique index refuses what would be a second key, and cannot be
     * built over documents that already share one. */
    k = BCON_NEW("email", BCON_INT32(1));
    rc = tern_doc_create_index(doc, DB, "e3", k, NULL, true);
    ck_assert_msg(rc == TERN_EEXIST, "unique index over duplicates: %s", tern_err_name(rc));
    ck_assert_int_eq(e->code, 11000);
    MUST(tern_doc_create_index(doc, DB, "e3", k, "by_email", false));
    bson_destroy(k);

    /* A bad filter: BadValue, as TERN_EINVAL, by each call that takes one;
     * nothing was changed. */
    bad = BCON_NEW("email", "{", "$nosuch", BCON_INT32(1), "}");
    rc = tern_doc_find(doc, DB, "e3", bad, NULL, &cur);
    ck_assert_msg(rc == TERN_EINVAL, "find with a bad filter: %s", tern_err_name(rc));
    ck_assert_ptr_null(cur);
    ck_assert_int_eq(e->code, 2);
    ck_assert_str_eq(e->code_name, "BadValue");
    ck_assert_int_eq(tern_doc_count(doc, DB, "e3", bad, &n), TERN_EINVAL);
    ck_assert_int_eq(tern_doc_delete_many(doc, DB, "e3", bad, &n), TERN_EINVAL);
    ck_assert_int_eq(tern_doc_count(doc, DB, "e3", NULL, &n), 0);
    ck_assert_uint_eq(n, 3);
    bson_destroy(bad);

    /* An unknown command: CommandNotFound (59), TERN_EDOC, and the reply
     * says so too. */
    cmd = BCON_NEW("frobnicate", BCON_INT32(1));
    rc = tern_doc_command(doc, DB, cmd, &reply);
    ck_assert_msg(rc == TERN_EDOC, "unknown command: %s", tern_err_name(rc));
    ck_assert_int_eq(e->code, 59);
    ck_assert_int_eq(field_int(&reply, "code"), 59);
    bson_destroy(&reply);
    bson_destroy(cmd);

    /* 20,000 documents, 1.9 MB, more than one message holds: they go in
     * several commands, as drivers split them, and a duplicate in the
     * second is reported at its index in the caller's array. */
    {
        enum { BIG = 20000, DUP = 15000 };
        bson_t **many = calloc(BIG, sizeof(*many));

        ck_assert_ptr_nonnull(many);
        for (int i = 0; i < BIG; i++)
            many[i] = BCON_NEW("_id", BCON_INT32(i == DUP ? 3 : i), "pad",
                               BCON_UTF8("0123456789abcdef0123456789abcdef0123456789abcdef"));
        rc = tern_doc_insert_many(doc, DB, "big_u", (const bson_t *const *)many, BIG, false, &n);
        ck_assert_msg(rc == TERN_EEXIST, "unordered: %s", tern_err_name(rc));
        ck_assert_uint_eq(n, BIG - 1);
        ck_assert_int_eq(e->index, DUP);
        ck_assert_int_eq(e->code, 11000);
        MUST(tern_doc_count(doc, DB, "big_u", NULL, &n));
        ck_assert_uint_eq(n, BIG - 1);
        rc = tern_doc_insert_many(doc, DB, "big_o", (const bson_t *const *)many, BIG, true, &n);
        ck_assert_msg(rc == TERN_EEXIST, "ordered: %s", tern_err_name(rc));
        ck_assert_uint_eq(n, DUP);
        ck_assert_int_eq(e->index, DUP);
        MUST(tern_doc_count(doc, DB, "big_o", NULL, &n));
        ck_assert_uint_eq(n, DUP);
        for (int i = 0; i < BIG; i++)
            bson_destroy(many[i]);
        free(many);
    }

    /* A call that works clears the last error. */
    MUST(tern_doc_count(doc, DB, "e", NULL, &n));
    ck_assert_int_eq(e->code, 0);

    /* Bad arguments never leave the client. */
    ck_assert_int_eq(tern_doc_insert_one(doc, "", "e", d[0]), TERN_EINVAL);
    ck_assert_int_eq(tern_doc_insert_one(doc, DB, NULL, d[0]), TERN_EINVAL);
    ck_assert_int_eq(tern_doc_insert_many(doc, DB, "e", NULL, 1, true, &n), TERN_EINVAL);
    ck_assert_int_eq(tern_doc_set_path(doc, (enum tern_doc_path)7), TERN_EINVAL);
    for (int i = 0; i < 4; i++)
        bson_destroy(d[i]);
    finish(doc, ep);
}
END_TEST

/* ---- a cursor over 10,000 documents, on each path ---- */

#define MANY 10000

static void fill(struct tern_doc *doc, const char *coll)
{
    static bson_t *d[1000];
    uint64_t n;

    for (int b = 0; b < MANY / 1000; b++) {
        for (int i = 0; i < 1000; i++)
            d[i] = BCON_NEW("_id", BCON_INT32(b * 1000 + i), "pad",
                            BCON_UTF8("0123456789abcdef0123456789abcdef0123456789abcdef"),
                            "k", BCON_INT32((b * 1000 + i) % 7));
        MUST(tern_doc_insert_many(doc, DB, coll, (const bson_t *const *)d, 1000, true, &n));
        ck_assert_uint_eq(n, 1000);
        for (int i = 0; i < 1000; i++)
            bson_destroy(d[i]);
    }
}

/* Read every document in _id order by batches of `batch`; the number of
 * batches it took. */
static unsigned read_all(struct tern_doc *doc, int batch)
{
    bson_t *opts = BCON_NEW("sort", "{", "_id", BCON_INT32(1), "}", "batchSize",
                            BCON_INT32(batch));
    struct tern_doc_stats before, after;
    struct tern_doc_cursor *cur;
    const bson_t *view;
    int rc, i = 0;

    tern_doc_get_stats(doc, &before);
    MUST(tern_doc_find(doc, DB, "many", NULL, opts, &cur));
    while ((rc = tern_doc_cursor_next(cur, &view)) == 1) {
        ck_assert_int_eq(field_int(view, "_id"), i);
        ck_assert_int_eq(field_int(view, "k"), i % 7);
        i++;
    }
    ck_assert_msg(rc == 0, "cursor: %s", tern_err_name(rc));
    ck_assert_int_eq(i, MANY);
    ck_assert_int_eq(tern_doc_cursor_next(cur, &view), 0);     /* stays at its end */
    tern_doc_cursor_close(cur);
    bson_destroy(opts);
    tern_doc_get_stats(doc, &after);
    return (unsigned)(after.batches_inline + after.batches_pushed - before.batches_inline -
                      before.batches_pushed);
}

START_TEST(cursor_10000_every_path_every_fabric)
{
    struct tern_rpc_ep *ep;
    struct tern_doc *doc = start(_i, &ep);
    struct tern_doc_stats st0, st;
    bool puts = test_fabric_caps(_i) & TERN_TP_CAP_PUT;
    bool offload = test_fabric_caps(_i) & TERN_TP_CAP_RMA_OFFLOAD;
    struct doc_wire_stats ws;
    unsigned batches;

    fill(doc, "many");

    /* RPC: every batch inline. 10,000 by 500: 20 batches at least (one
     * more, empty, if the server learns only then that it is done). */
    MUST(tern_doc_set_path(doc, TERN_DOC_PATH_RPC));
    tern_doc_get_stats(doc, &st0);
    batches = read_all(doc, 500);
    tern_doc_get_stats(doc, &st);
    ck_assert_uint_ge(batches, 20);
    ck_assert_uint_eq(st.batches_pushed, st0.batches_pushed);

    /* One-sided: where the fabric has puts, the server put the batches
     * (all but any that found its fabric's queue full, or came while shm
     * was mapping our buffer), and said so. Batches of about 17 KiB: over
     * what one put may carry on ntb (one record of a 64 KiB ring), so the
     * server puts them in pieces there. */
    MUST(tern_doc_set_path(doc, TERN_DOC_PATH_ONESIDED));
    /* A first pass has our buffer mapped on shm: its first batches come
     * inline while the server asks for the mapping, how many depending on
     * how soon this side's poll answers (22 of 51 on a loaded machine). */
    read_all(doc, 200);
    tern_doc_get_stats(doc, &st0);
    batches = read_all(doc, 200);
    tern_doc_get_stats(doc, &st);
    if (puts) {
        ck_assert_msg(st.batches_pushed - st0.batches_pushed >= batches / 2,
                      "%s: %llu of %u batches pushed", test_fabric_name(_i),
                      (unsigned long long)(st.batches_pushed - st0.batches_pushed), batches);
        ck_assert_uint_gt(st.bytes_pushed, st0.bytes_pushed + 10000ull * 60 / 2);
        ws = test_doc_stats(ep, 0);
        ck_assert_uint_eq(ws.batches_pushed, st.batches_pushed);
    } else {
        ck_assert_uint_eq(st.batches_pushed, st0.batches_pushed);
    }

    /* A buffer per open cursor: with all of them taken, the next cursor's
     * batches come inline. */
    {
        struct tern_doc_cursor *cs[TERN_DOC_BUF_SLOTS + 1];
        bson_t *opts = BCON_NEW("batchSize", BCON_INT32(10));
        const bson_t *view;

        st0 = st;
        for (int i = 0; i <= TERN_DOC_BUF_SLOTS; i++) {
            MUST(tern_doc_find(doc, DB, "many", NULL, opts, &cs[i]));
            ck_assert_int_eq(tern_doc_cursor_next(cs[i], &view), 1);
        }
        tern_doc_get_stats(doc, &st);
        ck_assert_uint_eq(st.batches_pushed - st0.batches_pushed, puts ? TERN_DOC_BUF_SLOTS : 0);
        ck_assert_uint_eq(st.batches_inline - st0.batches_inline, puts ? 1 : TERN_DOC_BUF_SLOTS + 1);
        for (int i = 0; i <= TERN_DOC_BUF_SLOTS; i++)
            tern_doc_cursor_close(cs[i]);
        bson_destroy(opts);
    }

    /* Auto: small batches inline everywhere; large ones pushed only where
     * the fabric's puts cost the server's CPU nothing. 5000 documents of
     * 85 bytes with their index keys make a batch of some 420 KiB, over
     * the 64 KiB threshold, and over what one put may carry on shm (one
     * ring record: the server puts it in pieces). Our buffer is mapped on
     * shm by now (the one-sided pass), so every piece goes at once. */
    MUST(tern_doc_set_path(doc, TERN_DOC_PATH_AUTO));
    st0 = st;
    read_all(doc, 20);
    tern_doc_get_stats(doc, &st);
    ck_assert_uint_eq(st.batches_pushed, st0.batches_pushed);
    st0 = st;
    read_all(doc, 5000);
    tern_doc_get_stats(doc, &st);
    if (offload)
        ck_assert_msg(st.batches_pushed - st0.batches_pushed == 2, "%s: %llu batches pushed",
                      test_fabric_name(_i),
                      (unsigned long long)(st.batches_pushed - st0.batches_pushed));
    else
        ck_assert_uint_eq(st.batches_pushed, st0.batches_pushed);
    finish(doc, ep);
}
END_TEST

/* ---- cursors die with their client ---- */

struct child_arg {
    char uri[128];
    int *ready;             /* shared: 1 once the cursor is open */
};

/* Open a cursor, read one document of it, and die without a word. */
static int die_mid_cursor(void *p)
{
    struct child_arg *a = p;
    const char *uri = a->uri;
    bson_t *opts = BCON_NEW("batchSize", BCON_INT32(10));
    struct tern_doc_cursor *cur;
    struct tern_rpc_ep *ep;
    struct tern_doc *doc;
    const bson_t *view;

    if (tern_rpc_open(NULL, &ep) < 0 || tern_doc_open(ep, &uri, 1, 5 * SEC, &doc) < 0)
        return 2;
    if (tern_doc_find(doc, DB, "many", NULL, opts, &cur) < 0 ||
        tern_doc_cursor_next(cur, &view) != 1)
        return 3;
    __atomic_store_n(a->ready, 1, __ATOMIC_RELEASE);
    _exit(0);
}

/* The server's open cursors, once they drop to `want` (bounded wait: a
 * dead peer is noticed when its connection closes). */
static uint64_t cursors_settle(struct tern_rpc_ep *ep, uint64_t want)
{
    struct doc_wire_stats ws = test_doc_stats(ep, 0);

    for (int i = 0; i < 3000 && ws.cursors_open != want; i++) {
        test_rpc_poll_for(ep, 10);
        ws = test_doc_stats(ep, 0);
    }
    return ws.cursors_open;
}

START_TEST(cursors_freed_with_their_client_every_fabric)
{
    struct tern_rpc_ep *ep;
    struct tern_doc *doc = start(_i, &ep);
    struct child_arg *a = test_shared_alloc(sizeof(*a) + sizeof(int));
    bson_t *opts = BCON_NEW("batchSize", BCON_INT32(10));
    struct tern_doc_cursor *cur, *cur2, *cur3;
    struct tern_doc *other;
    const bson_t *view;
    pid_t pid;

    fill(doc, "many");
    ck_assert_uint_eq(cursors_settle(ep, 0), 0);

    /* A client process dies holding a cursor: the session's end frees it.
     * Not where a listener takes one peer endpoint only (ntb: ours holds
     * the link); there the session that closes below is the case. */
    if (!(test_fabric_caps(_i) & TERN_TP_CAP_POINT_TO_POINT)) {
        a->ready = (int *)(a + 1);
        snprintf(a->uri, sizeof(a->uri), "%s", test_doc_uri(0));
        pid = test_fork(die_mid_cursor, a);
        ck_assert_int_eq(test_child_wait(&pid), 0);
        ck_assert_int_eq(*a->ready, 1);
        ck_assert_uint_eq(cursors_settle(ep, 0), 0);
    }

    /* A session that closes: its two cursors go; another client's stays. */
    other = open_doc(ep, 0);
    MUST(tern_doc_find(doc, DB, "many", NULL, opts, &cur));
    ck_assert_int_eq(tern_doc_find(other, DB, "many", NULL, opts, &cur2), 0);
    ck_assert_int_eq(tern_doc_cursor_next(cur2, &view), 1);
    ck_assert_int_eq(tern_doc_find(other, DB, "many", NULL, opts, &cur3), 0);
    ck_assert_uint_eq(test_doc_stats(ep, 0).cursors_open, 3);
    tern_doc_close(other);
    ck_assert_uint_eq(cursors_settle(ep, 1), 1);
    /* The closed client's cursors only close now; ours reads on. */
    ck_assert_int_eq(tern_doc_cursor_next(cur2, &view), TERN_ENOTCONN);
    tern_doc_cursor_close(cur2);
    tern_doc_cursor_close(cur3);
    for (int i = 0; i < 25; i++)
        ck_assert_int_eq(tern_doc_cursor_next(cur, &view), 1);
    ck_assert_int_eq(field_int(view, "_id"), 24);
    /* Closing a cursor kills it on the server. */
    tern_doc_cursor_close(cur);
    ck_assert_uint_eq(cursors_settle(ep, 0), 0);
    bson_destroy(opts);
    munmap(a, sizeof(*a) + sizeof(int));
    finish(doc, ep);
}
END_TEST

/* ---- hostile requests ---- */

static int raw_cmd(struct tern_session *s, const void *req, size_t len)
{
    static uint8_t rep[1 << 16];
    size_t got;

    return tern_call_sync(s, TERN_DOC_SERVICE_ID, DOC_M_CMD, req, len, rep, sizeof(rep), &got,
                          10 * SEC);
}

/* {ping: 1, $db: "admin", x: {a: {a: ... {}}}} with `levels` documents
 * below x, written by hand (BCON would recurse as deep); its length. */
static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static size_t nested_ping(uint8_t *p, int levels)
{
    static const uint8_t head[] = {0x10, 'p', 'i', 'n', 'g', 0, 1, 0, 0, 0,
                                   0x02, '$', 'd', 'b', 0, 6, 0, 0, 0, 'a', 'd', 'm', 'i', 'n', 0};
    size_t off = 4;

    memcpy(p + off, head, sizeof(head));
    off += sizeof(head);
    p[off++] = 0x03;
    p[off++] = 'x';
    p[off++] = 0;
    /* document i (1..levels) holds "a": document i + 1; the last is empty */
    for (int i = 1; i <= levels; i++) {
        put32(p + off, 5u + 8u * (uint32_t)(levels - i));
        off += 4;
        if (i < levels) {
            p[off++] = 0x03;
            p[off++] = 'a';
            p[off++] = 0;
        }
    }
    for (int i = 0; i <= levels; i++)
        p[off++] = 0;           /* each one's end, then the command's */
    put32(p, (uint32_t)off);
    return off;
}

START_TEST(hostile_requests)
{
    struct tern_rpc_ep *ep;
    struct tern_doc *doc = start(test_fabric_row("tcp"), &ep);
    struct tern_session *s = test_rpc_connect(ep, test_doc_uri(0));
    uint8_t buf[256] = {0};
    struct doc_req q = {0};
    bson_t *ping = BCON_NEW("ping", BCON_INT32(1), "$db", BCON_UTF8("admin"));
    uint64_t n;

    /* Too short for a header; flags unknown; no document; a document whose
     * length lies; a truncated one. */
    ck_assert_int_eq(raw_cmd(s, buf, sizeof(q) - 1), TERN_EPROTO);
    q.flags = 0x80;
    memcpy(buf, &q, sizeof(q));
    memcpy(buf + sizeof(q), bson_get_data(ping), ping->len);
    ck_assert_int_eq(raw_cmd(s, buf, sizeof(q) + ping->len), TERN_EPROTO);
    q.flags = 0;
    memcpy(buf, &q, sizeof(q));
    ck_assert_int_eq(raw_cmd(s, buf, sizeof(q)), TERN_EPROTO);
    ck_assert_int_eq(raw_cmd(s, buf, sizeof(q) + ping->len), 0);
    buf[sizeof(q)] ^= 0x40;
    ck_assert_int_eq(raw_cmd(s, buf, sizeof(q) + ping->len), TERN_EPROTO);
    buf[sizeof(q)] ^= 0x40;
    ck_assert_int_eq(raw_cmd(s, buf, sizeof(q) + ping->len - 1), TERN_EPROTO);
    /* Pushes the server cannot make: into a buffer too small, or past the
     * end of the region the key names (refused before it is posted). The
     * batch comes inline. */
    {
        bson_t *find = BCON_NEW("find", BCON_UTF8("h"), "$db", BCON_UTF8(DB));
        bson_t *one = BCON_NEW("_id", BCON_INT32(1), "x", BCON_UTF8("some bytes to find"));
        const struct doc_req bad[] = {
            /* an array is 5 bytes at least */
            {.flags = DOC_REQ_PUSH, .cap = 4, .dst = {.addr = 0, .len = 1 << 20, .key = 1}},
            {.flags = DOC_REQ_PUSH, .cap = 4096, .dst = {.addr = 0, .len = 4, .key = 1}},
        };

        MUST(tern_doc_insert_one(doc, DB, "h", one));
        for (unsigned i = 0; i < 2; i++) {
            static uint8_t rep[1 << 16];
            struct doc_rep r;
            bson_t body;
            bson_iter_t it;
            size_t got;

            memcpy(buf, &bad[i], sizeof(bad[i]));
            memcpy(buf + sizeof(q), bson_get_data(find), find->len);
            ck_assert_int_eq(tern_call_sync(s, TERN_DOC_SERVICE_ID, DOC_M_CMD, buf,
                                            sizeof(q) + find->len, rep, sizeof(rep), &got,
                                            10 * SEC), 0);
            memcpy(&r, rep, sizeof(r));
            ck_assert_uint_eq(r.flags, 0);
            ck_assert(bson_init_static(&body, rep + sizeof(r), got - sizeof(r)));
            ck_assert(bson_iter_init(&it, &body) &&
                      bson_iter_find_descendant(&it, "cursor.firstBatch.0.x", &it));
        }
        bson_destroy(find);
        bson_destroy(one);
    }
    /* Nesting: 50 levels is a command like any other; 100,000 (8 bytes a
     * level, within one message) is MongoDB's Overflow, answered before
     * anything recurses into it (libbson's validation would overflow the
     * server's stack), and the session goes on. */
    {
        size_t cap = 100000 * 8 + 64, got;
        uint8_t *deep = malloc(sizeof(q) + cap), *rep = malloc(1 << 16);
        struct doc_rep r;
        bson_t body;

        ck_assert_ptr_nonnull(deep);
        ck_assert_ptr_nonnull(rep);
        for (int levels = 50; levels <= 100000; levels = levels == 50 ? 100000 : levels + 1) {
            size_t dl = nested_ping(deep + sizeof(q), levels);

            memset(deep, 0, sizeof(q));
            ck_assert_int_eq(tern_call_sync(s, TERN_DOC_SERVICE_ID, DOC_M_CMD, deep, sizeof(q) + dl,
                                            rep, 1 << 16, &got, 30 * SEC), 0);
            memcpy(&r, rep, sizeof(r));
            ck_assert(bson_init_static(&body, rep + sizeof(r), got - sizeof(r)));
            if (levels == 50) {
                ck_assert_int_eq(field_int(&body, "ok"), 1);
            } else {
                ck_assert_int_eq(field_int(&body, "ok"), 0);
                ck_assert_int_eq(field_int(&body, "code"), 15);     /* Overflow */
            }
        }
        /* An embedded document whose length lies: InvalidBSON, as the
         * gateway answers it. */
        {
            size_t dl = nested_ping(deep + sizeof(q), 2);

            put32(deep + sizeof(q) + 4 + 25 + 3, 200);
            ck_assert_int_eq(tern_call_sync(s, TERN_DOC_SERVICE_ID, DOC_M_CMD, deep, sizeof(q) + dl,
                                            rep, 1 << 16, &got, 30 * SEC), 0);
            memcpy(&r, rep, sizeof(r));
            ck_assert(bson_init_static(&body, rep + sizeof(r), got - sizeof(r)));
            ck_assert_int_eq(field_int(&body, "ok"), 0);
            ck_assert_int_eq(field_int(&body, "code"), 22);     /* InvalidBSON */
        }
        free(deep);
        free(rep);
    }
    /* The server serves on, this session and the client's. */
    ck_assert_int_eq(tern_session_status(s), 0);
    MUST(tern_doc_count(doc, DB, "h", NULL, &n));
    ck_assert_uint_eq(n, 1);
    tern_rpc_disconnect(s);
    bson_destroy(ping);
    finish(doc, ep);
}
END_TEST

Suite *suite_doc_native(void)
{
    Suite *s = suite_create("doc_native");
    TCase *tc = tcase_create("fabrics");

    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, every_call_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(tc, errors_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(tc, cursor_10000_every_path_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(tc, cursors_freed_with_their_client_every_fabric, 0,
                        test_fabric_count());
    tcase_add_test(tc, hostile_requests);
    suite_add_tcase(s, tc);
    return s;
}

#endif
