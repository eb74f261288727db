/* doc_repl: the document store as a replica (services/doc/doc_repl.h). A
 * primary's store reports its records through the tap; a replica's store
 * applies them, or a full copy of them, and must come out the same: the
 * same collections, indexes, documents, retryable-write records and
 * version, before and after it reopens. Records a primary could not have
 * written are refused. */
#include "tern_config.h"

#if TERN_HAVE_DOC

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc_repl.h"
#include "doc_store.h"
#include "error.h"
#include "helpers.h"
#include "suites.h"

static char ppath[128], rpath[128];

static void setup(void)
{
    snprintf(ppath, sizeof(ppath), "/tmp/tern-doc-repl-p-%d.pool", (int)getpid());
    snprintf(rpath, sizeof(rpath), "/tmp/tern-doc-repl-r-%d.pool", (int)getpid());
    unlink(ppath);
    unlink(rpath);
}

static void teardown(void)
{
    unlink(ppath);
    unlink(rpath);
}

static struct doc_store *open_at(const char *path)
{
    struct doc_store_opts o = {.pool_size = 32u << 20, .seg_size = 1u << 20, .create = true};
    struct doc_store *s;
    struct doc_err e = {0};

    ck_assert_msg(doc_store_open(path, &o, &s, &e) == 0, "open %s: %s", path, e.msg);
    return s;
}

/* ---- the records the tap saw ---- */

struct rec {
    bool tomb;
    uint8_t *key, *val;
    uint16_t klen;
    uint32_t len;
    uint64_t version;
};

static struct rec recs[4096];
static unsigned nrecs;

static void tap(void *arg, bool tomb, const void *key, uint16_t klen, const void *val,
                uint32_t len, uint64_t version)
{
    struct rec *r = &recs[nrecs++];

    (void)arg;
    ck_assert_uint_lt(nrecs, sizeof(recs) / sizeof(recs[0]));
    *r = (struct rec){.tomb = tomb, .klen = klen, .len = len, .version = version};
    r->key = malloc(klen);
    memcpy(r->key, key, klen);
    r->val = malloc(len ? len : 1);
    if (len)
        memcpy(r->val, val, len);
}

static void recs_free(void)
{
    for (unsigned i = 0; i < nrecs; i++) {
        free(recs[i].key);
        free(recs[i].val);
    }
    nrecs = 0;
}

static void apply_range(struct doc_store *s, unsigned from, unsigned to)
{
    for (unsigned i = from; i < to; i++)
        ck_assert_int_eq(doc_store_apply(s, recs[i].tomb, recs[i].key, recs[i].klen,
                                         recs[i].val, recs[i].len, recs[i].version), 0);
    ck_assert_int_eq(doc_store_sync(s, &(struct doc_err){0}), 0);
}

static void apply_from(struct doc_store *s, unsigned from)
{
    apply_range(s, from, nrecs);
}

/* ---- what a store holds, as text ---- */

struct dump {
    char *p;
    size_t len;
};

static void put(struct dump *d, const char *s)
{
    size_t n = strlen(s);

    d->p = realloc(d->p, d->len + n + 2);
    memcpy(d->p + d->len, s, n);
    d->len += n;
    d->p[d->len++] = '\n';
    d->p[d->len] = 0;
}

static int dump_coll(void *arg, struct doc_coll *c)
{
    struct dump *d = arg;
    bson_t ixs = BSON_INITIALIZER, v;
    struct doc_scan *sc;
    struct doc_plan plan;
    struct doc_err e = {0};
    doc_ref ref;
    char *js, line[400];

    snprintf(line, sizeof(line), "%s.%s count=%llu", doc_coll_db(c), doc_coll_name(c),
             (unsigned long long)doc_coll_count(c));
    put(d, line);
    doc_index_list(c, &ixs);
    js = bson_as_relaxed_extended_json(&ixs, NULL);
    put(d, js);
    bson_free(js);
    bson_destroy(&ixs);
    ck_assert_int_eq(doc_scan_open(c, NULL, NULL, &sc, &plan, &e), 0);
    while (doc_scan_next(sc, &v, &ref) == 1) {
        js = bson_as_relaxed_extended_json(&v, NULL);
        put(d, js);
        bson_free(js);
    }
    doc_scan_close(sc);
    return 0;
}

struct dump_db {
    struct doc_store *s;
    struct dump *d;
};

static int dump_db(void *arg, const char *db, uint64_t bytes)
{
    struct dump_db *x = arg;

    (void)bytes;
    return doc_coll_each(x->s, db, dump_coll, x->d);
}

static char *dump(struct doc_store *s)
{
    struct dump d = {0};
    struct dump_db x = {.s = s, .d = &d};
    char line[64];

    doc_db_each(s, dump_db, &x);
    snprintf(line, sizeof(line), "version %llu", (unsigned long long)doc_store_version(s));
    put(&d, line);
    return d.p;
}

static void same(struct doc_store *a, struct doc_store *b)
{
    char *x = dump(a), *y = dump(b);

    ck_assert_str_eq(x, y);
    free(x);
    free(y);
}

/* ---- writes on the primary ---- */

static struct doc_coll *coll(struct doc_store *s, const char *name)
{
    struct doc_err e = {0};
    struct doc_coll *c = doc_coll_get(s, "test", name, true, &e);

    ck_assert_msg(c != NULL, "%s", e.msg);
    return c;
}

static void ins(struct doc_coll *c, int64_t id, int64_t x)
{
    struct doc_err e = {0};
    bson_t d;

    bson_init(&d);
    BSON_APPEND_INT64(&d, "_id", id);
    BSON_APPEND_INT64(&d, "x", x);
    BSON_APPEND_UTF8(&d, "pad", "some bytes to make it a document");
    ck_assert_msg(doc_insert(c, &d, &e) == 0, "%s", e.msg);
    bson_destroy(&d);
}

static doc_ref ref_of(struct doc_coll *c, int64_t id)
{
    bson_value_t v = {.value_type = BSON_TYPE_INT64, .value.v_int64 = id};
    doc_ref r = doc_find_id(c, &v);

    ck_assert(r != 0);
    return r;
}

static void set_x(struct doc_coll *c, int64_t id, int64_t x)
{
    struct doc_err e = {0};
    bson_t d;

    bson_init(&d);
    BSON_APPEND_INT64(&d, "_id", id);
    BSON_APPEND_INT64(&d, "x", x);
    ck_assert_msg(doc_replace(c, ref_of(c, id), &d, &e) == 0, "%s", e.msg);
    bson_destroy(&d);
}

static void index_on(struct doc_coll *c, const char *field, bool unique)
{
    struct doc_err e = {0};
    bson_t key = BSON_INITIALIZER;
    struct doc_index_spec spec = {.key = &key, .unique = unique};

    BSON_APPEND_INT32(&key, field, 1);
    ck_assert_msg(doc_index_create(c, &spec, &e) == 1, "%s", e.msg);
    bson_destroy(&key);
}

static const uint8_t lsid[16] = {0xab, 0xcd, 0xef, 0x12, 0x34, 0x56, 0x78, 0x90,
                                  0xab, 0xcd, 0xef, 0x12, 0x34, 0x56, 0x78, 0x90};

/* The session's record: its txnNumber, and the reply {n: 1}. */
static void session_is(struct doc_store *s, int64_t want)
{
    int64_t txn = 0;
    bson_t reply;
    bson_iter_t it;

    ck_assert_int_eq(doc_txn_get(s, lsid, &txn, &reply), 1);
    ck_assert_int_eq(txn, want);
    ck_assert(bson_iter_init_find(&it, &reply, "n") && bson_iter_as_int64(&it) == 1);
}

START_TEST(replica_follows_every_kind_of_record)
{
    struct doc_store *p = open_at(ppath), *r = open_at(rpath);
    struct doc_err e = {0};
    struct doc_coll *a, *b;

    doc_store_set_tap(p, tap, NULL);
    a = coll(p, "a");
    for (int i = 0; i < 50; i++)
        ins(a, i, i % 7);
    index_on(a, "x", false);
    b = coll(p, "b");
    index_on(b, "x", true);
    ins(b, 1, 10);
    ins(b, 2, 20);
    set_x(a, 3, 100);
    ck_assert_int_eq(doc_delete(a, ref_of(a, 4), &e), 0);
    ck_assert_int_eq(doc_index_drop(a, "x_1", &e), 1);
    index_on(a, "pad", false);
    /* Dropped and made again: a new collection id under the old name. */
    ck_assert_int_eq(doc_coll_drop(p, "test", "b", &e), 1);
    b = coll(p, "b");
    ins(b, 7, 70);
    coll(p, "gone");
    ck_assert_int_eq(doc_coll_drop(p, "test", "gone", &e), 1);
    /* A session's retryable write, recorded twice (the second wins). */
    {
        bson_t reply = BSON_INITIALIZER;

        BSON_APPEND_INT32(&reply, "n", 1);
        ck_assert_int_eq(doc_txn_put(p, lsid, 4, &reply, &e), 0);
        ck_assert_int_eq(doc_txn_put(p, lsid, 5, &reply, &e), 0);
        bson_destroy(&reply);
    }
    ck_assert_int_eq(doc_store_sync(p, &e), 0);

    apply_from(r, 0);
    same(p, r);
    /* Again, and the newer half again (a batch sent twice): every record
     * is one the replica has. */
    apply_from(r, 0);
    same(p, r);
    apply_range(r, nrecs / 2, nrecs);
    same(p, r);
    session_is(r, 5);
    /* As recovery rebuilds it. */
    doc_store_close(r);
    r = open_at(rpath);
    same(p, r);
    session_is(r, 5);
    /* A replica that becomes primary writes past what it applied: new
     * versions and a new collection id. */
    {
        struct doc_coll *c2 = coll(r, "after");

        ins(c2, 1, 1);
        ck_assert_uint_gt(doc_store_version(r), doc_store_version(p));
    }
    recs_free();
    doc_store_close(p);
    doc_store_close(r);
}
END_TEST

/* A full copy in pieces of one record each, so that writes fall between
 * them. */
struct one {
    bool got;
    struct doc_store *to;
};

static int one_rec(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                   uint64_t version)
{
    struct one *x = arg;

    if (x->got)
        return 1;
    x->got = true;
    ck_assert_int_eq(doc_store_apply(x->to, false, key, klen, val, len, version), 0);
    return 0;
}

/* Copy from `p` into `r` a record at a time; after the `at`-th, call
 * `between`. The number of pieces. */
static unsigned copy_by_ones(struct doc_store *p, struct doc_store *r, unsigned at,
                             void (*between)(void *), void *arg)
{
    uint64_t cursor = 0, next;
    unsigned n = 0;

    for (;;) {
        struct one o = {.to = r};

        ck_assert_int_eq(doc_store_snapshot(p, cursor, one_rec, &o, &next), 0);
        if (o.got)
            n++;
        if (n == at && between)
            between(arg);
        if (!next)
            break;
        cursor = next;
    }
    ck_assert_int_eq(doc_store_sync(r, &(struct doc_err){0}), 0);
    return n;
}

static void move_x(void *arg)
{
    struct doc_coll *c = arg;

    /* x=1 moves from _id 1 (copied already) to _id 9 (not yet). */
    set_x(c, 1, 100);
    set_x(c, 9, 1);
}

/* A full copy taken while the primary writes: the replica may hold two
 * documents with one unique key for a while (a document copied before its
 * change, another after its own), must open with them, and the records
 * written since resolve it. */
START_TEST(full_copy_tolerates_a_passing_clash)
{
    struct doc_store *p = open_at(ppath), *r = open_at(rpath);
    struct doc_coll *c = coll(p, "u");

    index_on(c, "x", true);
    for (int i = 0; i < 10; i++)
        ins(c, i, i);
    doc_store_set_tap(p, tap, NULL);
    /* catalog, _id 0, _id 1: then the move */
    ck_assert_uint_eq(copy_by_ones(p, r, 3, move_x, c), 11);
    ck_assert_uint_eq(nrecs, 2);
    doc_store_close(r);
    r = open_at(rpath);
    apply_from(r, 0);
    same(p, r);
    recs_free();
    doc_store_close(p);
    doc_store_close(r);
}
END_TEST

/* A replica that parted from its primary is wiped and copied anew, while
 * a scan on it is open (a secondary read's cursor): the scan ends. */
START_TEST(wipe_then_copy_makes_the_same_store)
{
    struct doc_store *p = open_at(ppath), *r = open_at(rpath);
    struct doc_coll *c = coll(p, "w"), *mine = coll(r, "mine");
    struct doc_scan *sc;
    struct doc_plan plan;
    struct doc_err e = {0};
    bson_t v;
    doc_ref ref;

    index_on(c, "x", false);
    for (int i = 0; i < 300; i++)
        ins(c, i, i % 11);
    {
        bson_t reply = BSON_INITIALIZER;
        struct doc_err e2 = {0};

        BSON_APPEND_INT32(&reply, "n", 1);
        ck_assert_int_eq(doc_txn_put(p, lsid, 9, &reply, &e2), 0);
        bson_destroy(&reply);
    }
    for (int i = 0; i < 5; i++)
        ins(mine, i, i);
    ck_assert_int_eq(doc_scan_open(mine, NULL, NULL, &sc, &plan, &e), 0);
    ck_assert_int_eq(doc_scan_next(sc, &v, &ref), 1);
    ck_assert_int_eq(doc_store_wipe(r), 0);
    ck_assert_int_eq(doc_scan_next(sc, &v, &ref), 0);
    doc_scan_close(sc);
    ck_assert_uint_eq(doc_store_version(r), 0);
    ck_assert_uint_eq(copy_by_ones(p, r, 0, NULL, NULL), 302);
    same(p, r);
    session_is(r, 9);
    doc_store_close(r);
    r = open_at(rpath);
    same(p, r);
    doc_store_close(p);
    doc_store_close(r);
}
END_TEST

static int refused(struct doc_store *s, bool tomb, const void *key, size_t klen, const char *json,
                   uint64_t version)
{
    bson_t *b = NULL;
    int rc;

    if (json) {
        b = bson_new_from_json((const uint8_t *)json, -1, NULL);
        ck_assert_ptr_nonnull(b);
    }
    rc = doc_store_apply(s, tomb, key, klen, b ? bson_get_data(b) : (const uint8_t *)"",
                         b ? b->len : 0, version);
    bson_destroy(b);
    return rc;
}

/* A lying or broken primary: records this store could never have written
 * are refused, and what it holds stays as it was. */
START_TEST(records_no_primary_writes_are_refused)
{
    struct doc_store *p = open_at(ppath), *r = open_at(rpath);
    char *before;

    doc_store_set_tap(p, tap, NULL);
    ins(coll(p, "c"), 1, 1);
    apply_from(r, 0);
    before = dump(r);
    /* Keys: empty, unknown kind, a document key too short, version 0. */
    ck_assert_int_eq(refused(r, false, "", 0, "{}", 90), TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, "Xtest.c", 7, "{}", 90), TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, "D1234", 5, "{}", 90), TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, recs[1].key, recs[1].klen, "{\"_id\": 1}", 0),
                     TERN_EPROTO);
    /* A catalog record: not BSON, missing fields, naming another
     * collection, reusing a collection id under a new name. */
    ck_assert_int_eq(doc_store_apply(r, false, "Ctest.d", 7, "\x05\0\0\0\x01", 5, 91),
                     TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, "Ctest.d", 7, "{\"db\": \"test\"}", 92), TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, "Ctest.d", 7,
                             "{\"id\": {\"$numberLong\": \"5\"}, \"db\": \"test\", \"coll\": \"e\"}",
                             93), TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, "Ctest.d", 7,
                             "{\"id\": {\"$numberLong\": \"1\"}, \"db\": \"test\", \"coll\": \"d\"}",
                             94), TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, "Ct\0st.d", 7, "{}", 95), TERN_EPROTO);
    /* A document whose _id is not its key's, and one that is not BSON. */
    ck_assert_int_eq(refused(r, false, recs[1].key, recs[1].klen, "{\"_id\": 2}", 96),
                     TERN_EPROTO);
    ck_assert_int_eq(doc_store_apply(r, false, recs[1].key, recs[1].klen, "\x07\0\0\0\x10", 5,
                                     97), TERN_EPROTO);
    ck_assert_int_eq(refused(r, false, recs[1].key, recs[1].klen, "{\"x\": 1}", 98),
                     TERN_EPROTO);
    {
        char *after;

        ck_assert_int_eq(doc_store_sync(r, &(struct doc_err){0}), 0);
        after = dump(r);
        ck_assert_str_eq(before, after);
        free(after);
    }
    free(before);
    recs_free();
    doc_store_close(p);
    doc_store_close(r);
}
END_TEST

Suite *suite_doc_repl(void)
{
    Suite *s = suite_create("doc_repl");
    TCase *tc = tcase_create("doc_repl");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, replica_follows_every_kind_of_record);
    tcase_add_test(tc, full_copy_tolerates_a_passing_clash);
    tcase_add_test(tc, wipe_then_copy_makes_the_same_store);
    tcase_add_test(tc, records_no_primary_writes_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

#endif
