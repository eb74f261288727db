/* doc_store: the document store on a pool file (case doc_store) and the
 * B+tree under its indexes (doc_btree, in test_doc_btree.c): writes,
 * unique indexes, recovery, dropping, cleaning. */
#include "tern_config.h"

#if TERN_HAVE_DOC

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc_match.h"
#include "doc_query.h"
#include "doc_store.h"
#include "helpers.h"
#include "suites.h"

static char dpath[128];

static void setup(void)
{
    snprintf(dpath, sizeof(dpath), "/tmp/tern-doc-store-%d.pool", (int)getpid());
    unlink(dpath);
}

static void teardown(void)
{
    unlink(dpath);
}

/* A small pool of small segments, so that churn makes the cleaner run. */
static struct doc_store *open_small(void)
{
    struct doc_store_opts o = {.pool_size = 16u << 20, .seg_size = 1u << 20, .create = true};
    struct doc_store *s;
    struct doc_err e = {0};

    ck_assert_msg(doc_store_open(dpath, &o, &s, &e) == 0, "open: %s", e.msg);
    return s;
}

static void mkdoc(bson_t *d, int64_t id, int64_t x, const char *pad)
{
    bson_init(d);
    BSON_APPEND_INT64(d, "_id", id);
    BSON_APPEND_INT64(d, "x", x);
    BSON_APPEND_UTF8(d, "pad", pad);
}

static int64_t field_of(const bson_t *d, const char *f)
{
    bson_iter_t it;

    ck_assert(bson_iter_init_find(&it, d, f));
    return bson_iter_as_int64(&it);
}

static doc_ref by_id(struct doc_coll *c, int64_t id)
{
    bson_value_t v = {.value_type = BSON_TYPE_INT64, .value.v_int64 = id};

    return doc_find_id(c, &v);
}

START_TEST(insert_replace_delete_survive_reopen)
{
    struct doc_store *s = open_small();
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "test", "c", true, &e);
    bson_t d, v;

    ck_assert_ptr_nonnull(c);
    /* The first document (slot 0) clashes like any other. */
    mkdoc(&d, 0, 0, "x");
    ck_assert_int_eq(doc_insert(c, &d, &e), 0);
    ck_assert_int_lt(doc_insert(c, &d, &e), 0);
    ck_assert_int_eq(e.code, DOC_DuplicateKey);
    ck_assert_int_eq(doc_delete(c, by_id(c, 0), &e), 0);
    bson_destroy(&d);
    for (int64_t i = 0; i < 500; i++) {
        mkdoc(&d, i, i * 10, "x");
        ck_assert_msg(doc_insert(c, &d, &e) == 0, "insert %lld: %s", (long long)i, e.msg);
        bson_destroy(&d);
    }
    /* A duplicate _id, as an int32 and a double of the same value. */
    bson_init(&d);
    BSON_APPEND_INT32(&d, "_id", 7);
    ck_assert_int_lt(doc_insert(c, &d, &e), 0);
    ck_assert_int_eq(e.code, DOC_DuplicateKey);
    ck_assert_msg(strstr(e.msg, "E11000 duplicate key error collection: test.c index: _id_"),
                  "%s", e.msg);
    bson_destroy(&d);
    for (int64_t i = 0; i < 500; i += 2) {
        mkdoc(&d, i, i * 10 + 1, "replaced");
        ck_assert_msg(doc_replace(c, by_id(c, i), &d, &e) == 0, "replace: %s", e.msg);
        bson_destroy(&d);
    }
    for (int64_t i = 0; i < 500; i += 5)
        ck_assert_int_eq(doc_delete(c, by_id(c, i), &e), 0);
    ck_assert_int_eq(doc_store_sync(s, &e), 0);
    ck_assert_uint_eq(doc_coll_count(c), 400);
    doc_store_close(s);

    s = open_small();
    c = doc_coll_get(s, "test", "c", false, &e);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(doc_coll_count(c), 400);
    for (int64_t i = 0; i < 500; i++) {
        doc_ref r = by_id(c, i);

        if (i % 5 == 0) {
            ck_assert_uint_eq(r, 0);
            continue;
        }
        ck_assert(doc_read(c, r, &v));
        ck_assert_int_eq(field_of(&v, "x"), i * 10 + (i % 2 == 0));
    }
    doc_store_close(s);
}
END_TEST

START_TEST(unique_secondary_index)
{
    struct doc_store *s = open_small();
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "test", "u", true, &e);
    bson_t key = BSON_INITIALIZER, d;
    struct doc_index_spec spec = {.key = &key, .unique = true};

    for (int64_t i = 0; i < 50; i++) {
        mkdoc(&d, i, i, "p");
        ck_assert_int_eq(doc_insert(c, &d, &e), 0);
        bson_destroy(&d);
    }
    BSON_APPEND_INT32(&key, "x", 1);
    ck_assert_msg(doc_index_create(c, &spec, &e) == 1, "%s", e.msg);
    ck_assert_int_eq(doc_index_create(c, &spec, &e), 0);
    mkdoc(&d, 100, 7, "p");
    ck_assert_int_lt(doc_insert(c, &d, &e), 0);
    ck_assert_int_eq(e.code, DOC_DuplicateKey);
    ck_assert_msg(strstr(e.msg, "index: x_1 dup key: { x: 7 }"), "%s", e.msg);
    bson_destroy(&d);
    /* Replacing a document keeps its own key: no clash with itself. */
    mkdoc(&d, 7, 7, "again");
    ck_assert_msg(doc_replace(c, by_id(c, 7), &d, &e) == 0, "%s", e.msg);
    bson_destroy(&d);
    mkdoc(&d, 8, 7, "clash");
    ck_assert_int_lt(doc_replace(c, by_id(c, 8), &d, &e), 0);
    ck_assert_int_eq(e.code, DOC_DuplicateKey);
    bson_destroy(&d);
    ck_assert_int_eq(doc_store_sync(s, &e), 0);
    doc_store_close(s);
    /* The index comes back from the catalog, unique still. */
    s = open_small();
    c = doc_coll_get(s, "test", "u", false, &e);
    mkdoc(&d, 101, 9, "p");
    ck_assert_int_lt(doc_insert(c, &d, &e), 0);
    ck_assert_int_eq(e.code, DOC_DuplicateKey);
    bson_destroy(&d);
    ck_assert_int_eq(doc_index_drop(c, "x_1", &e), 1);
    mkdoc(&d, 101, 9, "p");
    ck_assert_int_eq(doc_insert(c, &d, &e), 0);
    bson_destroy(&d);
    bson_destroy(&key);
    doc_store_close(s);
}
END_TEST

/* Dropped collections stay dropped across reopen, and a new collection of
 * the same name starts empty. */
START_TEST(drop_and_recreate)
{
    struct doc_store *s = open_small();
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "db1", "a", true, &e);
    bson_t d;

    for (int64_t i = 0; i < 100; i++) {
        mkdoc(&d, i, i, "p");
        ck_assert_int_eq(doc_insert(c, &d, &e), 0);
        bson_destroy(&d);
    }
    ck_assert_ptr_nonnull(doc_coll_get(s, "db1", "b", true, &e));
    ck_assert_ptr_nonnull(doc_coll_get(s, "db2", "a", true, &e));
    ck_assert_int_eq(doc_coll_drop(s, "db1", "a", &e), 1);
    ck_assert_int_eq(doc_coll_drop(s, "db1", "a", &e), 0);
    c = doc_coll_get(s, "db1", "a", true, &e);
    ck_assert_uint_eq(doc_coll_count(c), 0);
    mkdoc(&d, 5, 55, "new");
    ck_assert_int_eq(doc_insert(c, &d, &e), 0);
    bson_destroy(&d);
    ck_assert_int_eq(doc_db_drop(s, "db2", &e), 1);
    ck_assert_int_eq(doc_store_sync(s, &e), 0);
    doc_store_close(s);
    s = open_small();
    c = doc_coll_get(s, "db1", "a", false, &e);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(doc_coll_count(c), 1);
    ck_assert_ptr_null(doc_coll_get(s, "db2", "a", false, &e));
    ck_assert_int_eq(e.code, DOC_NamespaceNotFound);
    ck_assert_ptr_nonnull(doc_coll_get(s, "db1", "b", false, &e));
    ck_assert_int_lt(doc_coll_create(s, "db1", "b", &e), 0);
    ck_assert_int_eq(e.code, DOC_NamespaceExists);
    ck_assert_ptr_null(doc_coll_get(s, "bad.db", "x", true, &e));
    ck_assert_int_eq(e.code, DOC_InvalidNamespace);
    doc_store_close(s);
}
END_TEST

/* Many times the pool's size written through a few hundred documents:
 * only cleaning makes room; deleted documents stay deleted through it and
 * through reopening (their tombstones outlive their older records). */
START_TEST(churn_cleans_and_recovers)
{
    struct doc_store *s = open_small();
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "t", "churn", true, &e);
    static char pad[8000];
    int64_t ver[300] = {0};
    bson_t d, v;

    memset(pad, 'p', sizeof(pad) - 1);
    for (int round = 1; round <= 30; round++) {
        for (int64_t i = 0; i < 300; i++) {
            doc_ref r = by_id(c, i);
            int rc;

            if ((i + round) % 7 == 0) {
                if (r) {
                    ck_assert_int_eq(doc_delete(c, r, &e), 0);
                    ver[i] = 0;
                }
                continue;
            }
            mkdoc(&d, i, round, pad);
            rc = r ? doc_replace(c, r, &d, &e) : doc_insert(c, &d, &e);
            ck_assert_msg(rc == 0, "round %d doc %lld: %s", round, (long long)i, e.msg);
            ver[i] = round;
            bson_destroy(&d);
        }
        ck_assert_int_eq(doc_store_sync(s, &e), 0);
    }
    doc_store_close(s);
    s = open_small();
    c = doc_coll_get(s, "t", "churn", false, &e);
    for (int64_t i = 0; i < 300; i++) {
        doc_ref r = by_id(c, i);

        if (!ver[i]) {
            ck_assert_msg(r == 0, "doc %lld was deleted, and is back", (long long)i);
            continue;
        }
        ck_assert(doc_read(c, r, &v));
        ck_assert_int_eq(field_of(&v, "x"), ver[i]);
    }
    doc_store_close(s);
}
END_TEST

/* A scan survives writes between its steps: every document present
 * throughout is returned once. */
START_TEST(scan_survives_writes)
{
    struct doc_store *s = open_small();
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "t", "scan", true, &e);
    struct doc_scan *sc;
    struct doc_plan plan;
    static bool got[2000];
    bson_t d, v;
    doc_ref r;
    unsigned n = 0;

    for (int64_t i = 0; i < 1000; i++) {
        mkdoc(&d, i * 2, i, "p");
        ck_assert_int_eq(doc_insert(c, &d, &e), 0);
        bson_destroy(&d);
    }
    ck_assert_int_eq(doc_scan_open(c, NULL, NULL, &sc, &plan, &e), 0);
    while (doc_scan_next(sc, &v, &r) == 1) {
        int64_t id = field_of(&v, "_id");

        ck_assert(!got[id]);
        got[id] = true;
        n++;
        /* Odd ids appear meanwhile, each just ahead of the scan, which
         * returns them too. */
        if (id % 2)
            continue;
        mkdoc(&d, id + 1, 0, "new");
        ck_assert_msg(doc_insert(c, &d, &e) == 0, "%s", e.msg);
        bson_destroy(&d);
    }
    doc_scan_close(sc);
    for (int64_t i = 0; i < 2000; i++)
        ck_assert_msg(got[i], "id %lld never came", (long long)i);
    ck_assert_uint_eq(n, 2000);
    doc_store_close(s);
}
END_TEST

static struct doc_matcher *filter_of(const char *json)
{
    bson_error_t be;
    bson_t *f = bson_new_from_json((const uint8_t *)json, -1, &be);
    struct doc_matcher *m;
    struct doc_err e = {0};

    ck_assert_msg(f, "%s: %s", json, be.message);
    ck_assert_msg(doc_match_compile(f, &m, &e) == 0, "%s: %s", json, e.msg);
    bson_destroy(f);
    return m;
}

/* The planner picks the index the filter bounds (or the sort follows),
 * and the scan looks at no more than the bounds let in. */
START_TEST(planner_uses_bounds_and_sort)
{
    static const struct {
        const char *filter, *sort, *index;
        unsigned results, max_examined;
        bool sorted;
    } cases[] = {
        {"{\"x\": {\"$gte\": 190}}", NULL, "x_1", 10, 10, false},
        {"{\"x\": {\"$lt\": 20}}", NULL, "x_1", 20, 20, false},
        /* Both sides at once: x is never an array here. */
        {"{\"x\": {\"$gte\": 10, \"$lt\": 20}}", NULL, "x_1", 10, 10, false},
        {"{\"x\": {\"$in\": [3, 300, 7]}}", NULL, "x_1", 2, 2, false},
        {"{\"x\": 5, \"y\": \"odd\"}", NULL, "x_1", 1, 1, false},
        {"{\"_id\": 42}", NULL, "_id_", 1, 1, false},
        {"{\"y\": \"even\"}", NULL, "", 100, 200, false},
        {"{}", "{\"x\": -1}", "x_1", 200, 200, true},
        {"{\"x\": {\"$gt\": 190}}", "{\"x\": -1}", "x_1", 9, 9, true},
        {"{\"x\": {\"$gt\": \"a\"}}", NULL, "x_1", 0, 0, false},
    };
    struct doc_store *s = open_small();
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "t", "plan", true, &e);
    bson_t key = BSON_INITIALIZER, d, v;
    struct doc_index_spec spec = {.key = &key};

    for (int64_t i = 0; i < 200; i++) {
        bson_init(&d);
        BSON_APPEND_INT64(&d, "_id", i);
        BSON_APPEND_INT64(&d, "x", i);
        BSON_APPEND_UTF8(&d, "y", i % 2 ? "odd" : "even");
        ck_assert_int_eq(doc_insert(c, &d, &e), 0);
        bson_destroy(&d);
    }
    BSON_APPEND_INT32(&key, "x", 1);
    ck_assert_int_eq(doc_index_create(c, &spec, &e), 1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct doc_matcher *m = filter_of(cases[i].filter);
        struct doc_sort *so = NULL;
        struct doc_scan *sc;
        struct doc_plan plan;
        struct doc_scan_stats st;
        unsigned n = 0;
        int64_t prev = INT64_MAX;
        doc_ref r;

        if (cases[i].sort) {
            bson_error_t be;
            bson_t *sj = bson_new_from_json((const uint8_t *)cases[i].sort, -1, &be);

            ck_assert_int_eq(doc_sort_compile(sj, &so, &e), 0);
            bson_destroy(sj);
        }
        ck_assert_int_eq(doc_scan_open(c, m, so, &sc, &plan, &e), 0);
        ck_assert_msg(strcmp(plan.index, cases[i].index) == 0, "%s: index '%s', not '%s'",
                      cases[i].filter, plan.index, cases[i].index);
        ck_assert_msg(plan.sorted == cases[i].sorted, "%s: sorted %d", cases[i].filter,
                      plan.sorted);
        while (doc_scan_next(sc, &v, &r) == 1) {
            n++;
            if (cases[i].sorted) {
                ck_assert_int_lt(field_of(&v, "x"), prev);
                prev = field_of(&v, "x");
            }
        }
        doc_scan_stats(sc, &st);
        ck_assert_msg(n == cases[i].results, "%s: %u results", cases[i].filter, n);
        ck_assert_msg(st.docs_examined <= cases[i].max_examined, "%s: %llu examined",
                      cases[i].filter, (unsigned long long)st.docs_examined);
        doc_scan_close(sc);
        doc_sort_free(so);
        doc_match_free(m);
    }
    bson_destroy(&key);
    doc_store_close(s);
}
END_TEST

/* The index holds what the planner's bounds assume: {"a.b": null}
 * finds a document whose array has an element without b, a whole array
 * is a key too, and documents nested past 100 levels are refused. */
START_TEST(index_keys_as_bounds_assume)
{
    static const char *const docs[] = {
        "{\"_id\": 1, \"a\": [{\"b\": 1}, {\"c\": 2}]}",
        "{\"_id\": 2, \"a\": {\"b\": [1, 2]}}",
        "{\"_id\": 3, \"a\": 5}",
        "{\"_id\": 4}",
        "{\"_id\": 5, \"a\": [{\"b\": 7}]}",
    };
    static const struct {
        const char *filter;
        unsigned n;
    } q[] = {
        {"{\"a.b\": null}", 3},            /* 1, 3, 4 */
        {"{\"a.b\": 1}", 2},               /* 1, 2 */
        {"{\"a.b\": [1, 2]}", 1},          /* 2: the whole array */
        {"{\"a.b\": {\"$gt\": 1}}", 2},  /* 2, 5 */
        /* 2's two elements meet one predicate each: a multikey index
         * must not intersect them into (1, 2). */
        {"{\"a.b\": {\"$gt\": 1, \"$lt\": 2}}", 1},
    };
    struct doc_store *s = open_small();
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "t", "keys", true, &e);
    bson_t key = BSON_INITIALIZER, deep, v;
    struct doc_index_spec spec = {.key = &key};

    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        bson_error_t be;
        bson_t *d = bson_new_from_json((const uint8_t *)docs[i], -1, &be);

        ck_assert_msg(doc_insert(c, d, &e) == 0, "%s", e.msg);
        bson_destroy(d);
    }
    BSON_APPEND_INT32(&key, "a.b", 1);
    ck_assert_int_eq(doc_index_create(c, &spec, &e), 1);
    for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++) {
        struct doc_matcher *m = filter_of(q[i].filter);
        struct doc_scan *sc;
        struct doc_plan plan;
        unsigned n = 0;
        doc_ref r;

        ck_assert_int_eq(doc_scan_open(c, m, NULL, &sc, &plan, &e), 0);
        ck_assert_str_eq(plan.index, "a.b_1");
        while (doc_scan_next(sc, &v, &r) == 1)
            n++;
        ck_assert_msg(n == q[i].n, "%s: %u documents, not %u", q[i].filter, n, q[i].n);
        doc_scan_close(sc);
        doc_match_free(m);
    }
    /* 101 levels of {x: ...}. */
    bson_init(&deep);
    {
        bson_t lv[102];

        bson_init(&lv[0]);
        BSON_APPEND_INT32(&lv[0], "_id", 9);
        for (int i = 1; i <= 101; i++)
            bson_append_document_begin(&lv[i - 1], "x", 1, &lv[i]);
        for (int i = 101; i >= 1; i--)
            bson_append_document_end(&lv[i - 1], &lv[i]);
        ck_assert_int_lt(doc_insert(c, &lv[0], &e), 0);
        ck_assert_int_eq(e.code, DOC_Overflow);
        bson_destroy(&lv[0]);
    }
    bson_destroy(&deep);
    bson_destroy(&key);
    doc_store_close(s);
}
END_TEST

void doc_btree_tcase(Suite *s);

Suite *suite_doc_store(void)
{
    Suite *s = suite_create("doc_store");
    TCase *tc = tcase_create("doc_store");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, insert_replace_delete_survive_reopen);
    tcase_add_test(tc, unique_secondary_index);
    tcase_add_test(tc, drop_and_recreate);
    tcase_add_test(tc, churn_cleans_and_recovers);
    tcase_add_test(tc, scan_survives_writes);
    tcase_add_test(tc, planner_uses_bounds_and_sort);
    tcase_add_test(tc, index_keys_as_bounds_assume);
    suite_add_tcase(s, tc);
    doc_btree_tcase(s);
    return s;
}

#endif
