/* Keys with deadlines in the KV store (kv_store.c): absent from their
 * deadline on, removed in the background, kept in the record through
 * cleaning, restarts and replication. The clock is the test's. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "kv_store.h"
#include "suites.h"

#define SEG (64u * 1024)

static char path[128];
static uint64_t fake_now = 1700000000000ull;

static uint64_t fake_clock(void)
{
    return fake_now;
}

static void setup(void)
{
    kvs_now_ms = fake_clock;
    test_pool_file(path, sizeof(path), "kvx");
}

static void teardown(void)
{
    test_pool_file_remove(path);
}

static struct kvs *open_store(uint64_t size, bool append_only)
{
    struct kvs_opts o = {.path = path, .pool_size = size, .seg_size = SEG,
                         .append_only = append_only};
    struct kvs *s = NULL;
    int rc = kvs_open(&o, &s);

    ck_assert_msg(rc == 0, "open: %s", tern_strerror(rc));
    return s;
}

static void put_until(struct kvs *s, const char *k, const char *v, uint64_t at)
{
    int rc = kvs_put_until(s, k, strlen(k), v, strlen(v), at, 0, NULL);

    ck_assert_msg(rc == 0, "put %s: %s", k, tern_strerror(rc));
}

/* The value of k (NULL if absent) in buf. */
static const char *value(struct kvs *s, const char *k, char *buf, size_t cap)
{
    const void *val;
    uint32_t len;
    int rc = kvs_get(s, k, strlen(k), &val, &len, NULL);

    if (rc == TERN_ENOENT)
        return NULL;
    ck_assert_msg(rc == 0, "get %s: %s", k, tern_strerror(rc));
    ck_assert_uint_lt(len, cap);
    memcpy(buf, val, len);
    buf[len] = '\0';
    return buf;
}

static uint64_t deadline(struct kvs *s, const char *k)
{
    uint64_t at = 123;

    ck_assert_int_eq(kvs_expiry(s, k, strlen(k), &at), 0);
    return at;
}

/* A key past its deadline reads as absent everywhere at once, cannot be
 * deleted by a caller (it is not there), and is removed by kvs_expire;
 * an older plain value behind it never comes back, before or after a
 * restart. */
START_TEST(absent_from_the_deadline_on)
{
    struct kvs *s = open_store(4u << 20, false);
    char buf[64];
    uint64_t at;

    ck_assert_int_eq(kvs_put(s, "k", 1, "old", 3, TERN_KV_SYNC, NULL), 0);
    put_until(s, "k", "new", fake_now + 1000);
    put_until(s, "gone", "x", fake_now + 10);
    ck_assert_int_eq(kvs_sync(s), 0);
    ck_assert_str_eq(value(s, "k", buf, sizeof(buf)), "new");
    ck_assert_uint_eq(deadline(s, "k"), fake_now + 1000);
    ck_assert_uint_eq(kvs_expiring(s), 2);
    fake_now += 10;
    ck_assert_ptr_null(value(s, "gone", buf, sizeof(buf)));
    ck_assert_int_eq(kvs_expiry(s, "gone", 4, &at), TERN_ENOENT);
    ck_assert_int_eq(kvs_del(s, "gone", 4, 0, NULL), TERN_ENOENT);
    ck_assert_uint_eq(kvs_count(s), 2);     /* still there until removed */
    fake_now += 990;
    ck_assert_ptr_null(value(s, "k", buf, sizeof(buf)));
    kvs_close(s);
    s = open_store(4u << 20, false);
    ck_assert_ptr_null(value(s, "k", buf, sizeof(buf)));
    ck_assert_uint_eq(kvs_expiring(s), 2);
    ck_assert_uint_eq(kvs_expire(s, fake_now, 1), 1);      /* at most max */
    ck_assert_uint_eq(kvs_expire(s, fake_now, 10), 1);
    ck_assert_uint_eq(kvs_expire(s, fake_now, 10), 0);
    ck_assert_int_eq(kvs_sync(s), 0);
    ck_assert_uint_eq(kvs_count(s), 0);
    ck_assert_uint_eq(kvs_expiring(s), 0);
    kvs_close(s);
    s = open_store(4u << 20, false);
    ck_assert_ptr_null(value(s, "k", buf, sizeof(buf)));
    ck_assert_uint_eq(kvs_count(s), 0);
    kvs_close(s);
}
END_TEST

/* Deadlines set, moved and taken away, in place (same batch, and over an
 * older record) and appended: the count of expiring keys follows, and
 * only what is due is removed, whatever stale deadlines the heap holds. */
START_TEST(moved_deadlines_and_counts)
{
    struct kvs *s = open_store(8u << 20, false);
    char buf[64];

    for (int i = 1; i <= 3000; i++) {
        put_until(s, "k", "v", fake_now + (uint64_t)i);
        if (i % 7 == 0)
            ck_assert_int_eq(kvs_sync(s), 0);
    }
    ck_assert_uint_eq(kvs_expiring(s), 1);
    ck_assert_int_eq(kvs_set_expiry(s, "k", 1, fake_now + 100000, 0, NULL), 0);
    fake_now += 5000;
    ck_assert_uint_eq(kvs_expire(s, fake_now, 10000), 0);
    ck_assert_str_eq(value(s, "k", buf, sizeof(buf)), "v");
    ck_assert_int_eq(kvs_set_expiry(s, "k", 1, 0, 0, NULL), 0);    /* persist */
    ck_assert_uint_eq(kvs_expiring(s), 0);
    ck_assert_uint_eq(deadline(s, "k"), 0);
    ck_assert_int_eq(kvs_set_expiry(s, "k", 1, 0, 0, NULL), 0);    /* nothing to take */
    fake_now += 200000;
    ck_assert_uint_eq(kvs_expire(s, fake_now, 10000), 0);
    ck_assert_str_eq(value(s, "k", buf, sizeof(buf)), "v");
    /* Plain over expiring, expiring over plain, delete of expiring. */
    put_until(s, "a", "1", fake_now + 50);
    ck_assert_int_eq(kvs_put(s, "a", 1, "2", 1, 0, NULL), 0);
    ck_assert_uint_eq(kvs_expiring(s), 0);
    put_until(s, "a", "3", fake_now + 50);
    ck_assert_uint_eq(kvs_expiring(s), 1);
    ck_assert_int_eq(kvs_del(s, "a", 1, 0, NULL), 0);
    ck_assert_uint_eq(kvs_expiring(s), 0);
    ck_assert_int_eq(kvs_set_expiry(s, "a", 1, fake_now + 5, 0, NULL), TERN_ENOENT);
    /* A deadline already past deletes at once. */
    ck_assert_int_eq(kvs_set_expiry(s, "k", 1, fake_now - 1, 0, NULL), 0);
    ck_assert_uint_eq(kvs_count(s), 0);
    ck_assert_int_eq(kvs_clear(s, TERN_KV_SYNC), 0);
    kvs_close(s);
}
END_TEST

/* Cleaning copies expiring records with their deadlines; a reopened store
 * has them all. */
START_TEST(cleaning_keeps_deadlines)
{
    struct kvs *s = open_store(1u << 20, true);
    char key[32], big[2000];
    struct kvs_stats st;

    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "x%d", i);
        put_until(s, key, "v", fake_now + 1000000 + (uint64_t)i);
    }
    for (int round = 0; round < 2000; round++) {
        snprintf(key, sizeof(key), "churn%d", round % 10);
        ck_assert_int_eq(kvs_put(s, key, strlen(key), big, sizeof(big), 0, NULL), 0);
        if (round % 50 == 0)
            ck_assert_int_eq(kvs_sync(s), 0);
    }
    ck_assert_int_eq(kvs_sync(s), 0);
    kvs_get_stats(s, &st);
    ck_assert_uint_gt(st.segs_cleaned, 0);
    kvs_close(s);
    s = open_store(1u << 20, true);
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "x%d", i);
        ck_assert_uint_eq(deadline(s, key), fake_now + 1000000 + (uint64_t)i);
    }
    ck_assert_uint_eq(kvs_expiring(s), 200);
    kvs_close(s);
}
END_TEST

/* What a primary ships (the tap) a backup writes as it is (kvs_apply):
 * the deadline goes with the value; a snapshot's records carry it too;
 * the backup's reads judge it by the same clock. */
struct shipped {
    struct kvs *to;
    int n;
};

static void ship(void *arg, enum pm_rec_type type, const void *key, uint16_t klen,
                 const void *val, uint32_t len, uint64_t version)
{
    struct shipped *sh = arg;

    ck_assert_int_eq(kvs_apply(sh->to, type, key, klen, val, len, version, 0), 0);
    sh->n++;
}

static int count_rec(void *arg, enum pm_rec_type type, const void *key, size_t klen,
                     const void *val, uint32_t len, uint64_t version)
{
    int *n = arg;

    if (type == PM_EXPIRING)
        n[0]++;
    else if (type == PM_VALUE)
        n[1]++;
    return 0;
}

static int count_key(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                     uint64_t version)
{
    (*(int *)arg)++;
    return 0;
}

START_TEST(shipped_with_the_value)
{
    char path2[160];
    struct kvs_opts o = {.pool_size = 4u << 20, .seg_size = SEG};
    struct kvs *a = open_store(4u << 20, false), *b;
    struct shipped sh = {0};
    char buf[64];
    int n[2] = {0, 0}, keys = 0;
    uint64_t next;

    snprintf(path2, sizeof(path2), "%s.b", path);
    o.path = path2;
    ck_assert_int_eq(kvs_open(&o, &b), 0);
    sh.to = b;
    kvs_set_tap(a, ship, &sh);
    put_until(a, "e", "val", fake_now + 500);
    ck_assert_int_eq(kvs_put(a, "p", 1, "plain", 5, 0, NULL), 0);
    put_until(a, "soon", "x", fake_now + 5);
    ck_assert_int_eq(sh.n, 3);
    ck_assert_uint_eq(deadline(b, "e"), fake_now + 500);
    ck_assert_str_eq(value(b, "e", buf, sizeof(buf)), "val");
    ck_assert_uint_eq(kvs_expiring(b), 2);
    ck_assert_int_eq(kvs_scan_records(a, 0, 100, count_rec, n, &next), 0);
    ck_assert_uint_eq(next, 0);
    ck_assert_int_eq(n[0], 2);
    ck_assert_int_eq(n[1], 1);
    fake_now += 5;
    ck_assert_int_eq(kvs_scan(a, 0, 100, count_key, &keys, &next), 0);
    ck_assert_int_eq(keys, 2);          /* "soon" is due: not listed */
    ck_assert_ptr_null(value(b, "soon", buf, sizeof(buf)));
    /* The primary's removal is shipped as a delete. */
    ck_assert_uint_eq(kvs_expire(a, fake_now, 10), 1);
    ck_assert_int_eq(sh.n, 4);
    ck_assert_uint_eq(kvs_count(b), 2);
    ck_assert_uint_eq(kvs_expiring(b), 1);
    /* A malformed expiring record (shorter than its deadline) is refused. */
    ck_assert_int_eq(kvs_apply(b, PM_EXPIRING, "z", 1, "1234567", 7, kvs_version(b) + 1, 0),
                     TERN_EINVAL);
    kvs_set_tap(a, NULL, NULL);
    kvs_close(a);
    kvs_close(b);
    unlink(path2);
}
END_TEST

Suite *suite_kv_expiry(void)
{
    Suite *s = suite_create("kv_expiry");
    TCase *tc = tcase_create("expiry");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, absent_from_the_deadline_on);
    tcase_add_test(tc, moved_deadlines_and_counts);
    tcase_add_test(tc, cleaning_keeps_deadlines);
    tcase_add_test(tc, shipped_with_the_value);
    suite_add_tcase(s, tc);
    return s;
}
