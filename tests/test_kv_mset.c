/* The members of a collection (services/kv/coll/mset.c): a hash set of byte
 * strings checked against a shadow model, its growth and shrink, random
 * picks and Redis's SCAN guarantee across resizes. Every test draws from a
 * fixed seed, so a failure repeats. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "helpers.h"
#include "kv/coll/mset.h"
#include "kv/kv_hash.h"
#include "suites.h"

#define MAXLEN 40

/* The universe the tests draw members from; a member's score holds its
 * index here, so a visit can tell which one it saw. */
struct item {
    uint8_t b[MAXLEN];
    uint32_t len;
    struct kvm_member *m;            /* the shadow: its member while in the set */
};

static struct item *items;
static size_t n_items;

/* Distinct strings of 0..40 bytes over a tiny alphabet with NUL in it, so
 * that many differ only in length or in one byte. */
static void make_items(size_t n)
{
    static const uint8_t alpha[] = {0, 1, 'a', 0xff};

    items = calloc(n, sizeof(*items));
    ck_assert_ptr_nonnull(items);
    n_items = n;
    for (size_t i = 0; i < n; i++) {
        struct item *it = &items[i];
        bool dup;

        do {
            it->len = (uint32_t)(test_rng() % (MAXLEN + 1));
            for (uint32_t j = 0; j < it->len; j++)
                it->b[j] = alpha[test_rng() % sizeof(alpha)];
            dup = false;
            for (size_t k = 0; k < i && !dup; k++)
                dup = items[k].len == it->len && !memcmp(items[k].b, it->b, it->len);
        } while (dup);
    }
}

static void free_items(void)
{
    free(items);
    items = NULL;
    n_items = 0;
}

static uint64_t n_buckets(const struct kvm_set *s)
{
    return s->buckets ? s->mask + 1 : 0;
}

static size_t tag(const struct kvm_member *m)
{
    return (size_t)m->score;
}

/* The set's structure against the shadow: every member in its own bucket,
 * the count, the load bounds, and the shadow's members all there. */
static void check_table(const struct kvm_set *s, uint64_t want_n)
{
    uint64_t nb = n_buckets(s), seen = 0;

    ck_assert_uint_eq(s->n, want_n);
    if (!s->buckets) {
        ck_assert_uint_eq(want_n, 0);
        return;
    }
    ck_assert_uint_eq(nb & (nb - 1), 0);
    ck_assert_uint_ge(nb, 4);
    ck_assert_uint_le(s->n, nb);
    ck_assert(nb == 4 || s->n >= nb / 8);
    for (uint64_t i = 0; i < nb; i++) {
        for (const struct kvm_member *m = s->buckets[i]; m; m = m->next) {
            ck_assert_uint_eq(m->hash & s->mask, i);
            ck_assert_uint_eq(m->hash, kv_hash(m->bytes, m->len));
            ck_assert_uint_lt(tag(m), n_items);
            ck_assert_ptr_eq(items[tag(m)].m, m);
            seen++;
        }
    }
    ck_assert_uint_eq(seen, want_n);
}

static void add_item(struct kvm_set *s, size_t i)
{
    struct kvm_member *m = NULL;
    int rc = kvm_add(s, items[i].b, items[i].len, &m);

    if (items[i].m) {
        ck_assert_int_eq(rc, 0);
        ck_assert_ptr_eq(m, items[i].m);
        return;
    }
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(m->len, items[i].len);
    ck_assert(!memcmp(m->bytes, items[i].b, items[i].len));
    ck_assert_uint_eq(m->hash, kv_hash(items[i].b, items[i].len));
    ck_assert(m->score == 0);
    ck_assert_ptr_null(m->node);
    m->score = (double)i;
    items[i].m = m;
}

static void visit_count(void *arg, struct kvm_member *m)
{
    (void)m;
    (*(uint64_t *)arg)++;
}

START_TEST(empty_and_basics)
{
    struct kvm_set s;
    struct kvm_member *a = NULL, *b = NULL, *e = NULL;
    uint64_t calls = 0;

    kvm_init(&s);
    ck_assert_ptr_null(s.buckets);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_ptr_null(kvm_find(&s, "x", 1));
    ck_assert_ptr_null(kvm_find(&s, NULL, 0));
    ck_assert_ptr_null(kvm_random(&s, test_rng));
    ck_assert_uint_eq(kvm_scan(&s, 0, 10, visit_count, &calls), 0);
    kvm_each(&s, visit_count, &calls);
    ck_assert_uint_eq(calls, 0);
    kvm_free(&s);
    ck_assert_ptr_null(s.buckets);

    /* The empty string is a member like any other, with or without a
     * pointer; "a" and "a\0" are two. */
    ck_assert_int_eq(kvm_add(&s, NULL, 0, &e), 1);
    ck_assert_uint_eq(e->len, 0);
    ck_assert_int_eq(kvm_add(&s, "a", 1, &a), 1);
    ck_assert_int_eq(kvm_add(&s, "a\0", 2, &b), 1);
    ck_assert_ptr_ne(a, b);
    ck_assert_ptr_eq(kvm_find(&s, "", 0), e);
    ck_assert_ptr_eq(kvm_find(&s, "a", 1), a);
    ck_assert_ptr_eq(kvm_find(&s, "a\0", 2), b);
    ck_assert_ptr_null(kvm_find(&s, "a\0\0", 3));
    ck_assert_int_eq(kvm_add(&s, "zz", 0, &a), 0);
    ck_assert_ptr_eq(a, e);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_uint_eq(n_buckets(&s), 4);
    kvm_each(&s, visit_count, &calls);
    ck_assert_uint_eq(calls, 3);

    kvm_remove(&s, e);
    ck_assert_ptr_null(kvm_find(&s, NULL, 0));
    ck_assert_uint_eq(s.n, 2);
    kvm_free(&s);
    ck_assert_ptr_null(s.buckets);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_ptr_null(kvm_find(&s, "a", 1));

    /* Usable again after kvm_free. */
    ck_assert_int_eq(kvm_add(&s, "b", 1, &a), 1);
    ck_assert_ptr_eq(kvm_find(&s, "b", 1), a);
    kvm_free(&s);
}
END_TEST

/* 100k random adds, finds and removes against the shadow, in phases that
 * fill the set, drain it and churn it, so the table grows and shrinks
 * many times. */
START_TEST(shadow_model)
{
    struct kvm_set s;
    uint64_t count = 0, grows = 0, shrinks = 0, max_nb = 0, min_nb = UINT64_MAX;

    test_rng_seed(0x6d736574u);
    make_items(3000);
    kvm_init(&s);
    for (int op = 0; op < 100000; op++) {
        static const unsigned add_pcts[] = {80, 2, 80, 2, 50};
        unsigned add_pct = add_pcts[op / 20000];
        unsigned r = (unsigned)(test_rng() % 100);
        size_t i = (size_t)(test_rng() % n_items);
        uint64_t nb = n_buckets(&s);

        if (r < add_pct) {
            if (!items[i].m)
                count++;
            add_item(&s, i);
        } else if (r < add_pct + (100 - add_pct) * 3 / 4) {
            if (items[i].m) {
                kvm_remove(&s, items[i].m);
                items[i].m = NULL;
                count--;
            }
            ck_assert_ptr_null(kvm_find(&s, items[i].b, items[i].len));
        } else {
            ck_assert_ptr_eq(kvm_find(&s, items[i].b, items[i].len), items[i].m);
        }
        ck_assert_uint_eq(s.n, count);
        if (nb && n_buckets(&s) > nb)
            grows++;
        if (n_buckets(&s) < nb)
            shrinks++;
        if (n_buckets(&s) > max_nb)
            max_nb = n_buckets(&s);
        if (op > 20000 && n_buckets(&s) < min_nb)
            min_nb = n_buckets(&s);
        if (op % 997 == 0)
            check_table(&s, count);
    }
    check_table(&s, count);
    for (size_t i = 0; i < n_items; i++)
        ck_assert_ptr_eq(kvm_find(&s, items[i].b, items[i].len), items[i].m);
    ck_assert_uint_ge(max_nb, 4096);
    ck_assert_uint_le(min_nb, 1024);
    ck_assert_uint_ge(grows, 8);
    ck_assert_uint_ge(shrinks, 4);
    kvm_free(&s);
    ck_assert_ptr_null(s.buckets);
    ck_assert_uint_eq(s.n, 0);
    free_items();
}
END_TEST

static uint64_t pow2_at_least(uint64_t n)
{
    uint64_t p = 4;

    while (p < n)
        p <<= 1;
    return p;
}

/* The exact sizes: doubling when members outnumber buckets, halving below
 * one member per eight buckets down to 4, members' addresses unchanged. */
START_TEST(grow_and_shrink)
{
    enum { N = 10000 };
    struct kvm_set s;
    struct kvm_member **ms = calloc(N, sizeof(*ms));
    uint32_t *order = calloc(N, sizeof(*order));

    ck_assert_ptr_nonnull(ms);
    ck_assert_ptr_nonnull(order);
    test_rng_seed(0x67726f77u);
    kvm_init(&s);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t key[2] = {i, ~i};

        ck_assert_int_eq(kvm_add(&s, key, sizeof(key), &ms[i]), 1);
        ck_assert_uint_eq(s.n, i + 1);
        ck_assert_uint_eq(n_buckets(&s), pow2_at_least(i + 1));
        order[i] = i;
    }
    ck_assert_uint_eq(n_buckets(&s), 16384);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t key[2] = {i, ~i};

        ck_assert_ptr_eq(kvm_find(&s, key, sizeof(key)), ms[i]);
    }
    for (uint32_t i = N - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(test_rng() % (i + 1)), t = order[i];

        order[i] = order[j];
        order[j] = t;
    }
    for (uint32_t k = 0; k < N; k++) {
        uint64_t nb = n_buckets(&s), left = N - k - 1;

        kvm_remove(&s, ms[order[k]]);
        ms[order[k]] = NULL;
        ck_assert_uint_eq(s.n, left);
        ck_assert_uint_eq(n_buckets(&s), nb > 4 && left < nb / 8 ? nb / 2 : nb);
        if ((left & (left - 1)) == 0) {
            for (uint32_t i = 0; i < N; i++) {
                uint32_t key[2] = {i, ~i};

                ck_assert_ptr_eq(kvm_find(&s, key, sizeof(key)), ms[i]);
            }
        }
    }
    ck_assert_uint_eq(n_buckets(&s), 4);
    ck_assert_ptr_null(kvm_random(&s, test_rng));
    kvm_free(&s);
    free(ms);
    free(order);
}
END_TEST

/* Draws until every member of the set came up, at most max_draws. */
static void draws_hit_all(struct kvm_set *s, unsigned max_draws)
{
    bool *hit = calloc(n_items, sizeof(*hit));
    uint64_t want = s->n, got = 0;

    ck_assert_ptr_nonnull(hit);
    for (unsigned d = 0; d < max_draws && got < want; d++) {
        struct kvm_member *m = kvm_random(s, test_rng);

        ck_assert_ptr_nonnull(m);
        ck_assert_uint_lt(tag(m), n_items);
        ck_assert_ptr_eq(items[tag(m)].m, m);
        if (!hit[tag(m)]) {
            hit[tag(m)] = true;
            got++;
        }
    }
    ck_assert_uint_eq(got, want);
    free(hit);
}

static unsigned zero_calls;

static uint64_t rnd_zero(void)
{
    zero_calls++;
    return 0;
}

START_TEST(random_picks)
{
    struct kvm_set s;
    size_t next = 0;

    test_rng_seed(0x72616e64u);
    make_items(2000);
    kvm_init(&s);

    /* Sets of 1 to 24 members in tables of 4 to 32 buckets. */
    for (int size = 1; size <= 24; size++) {
        add_item(&s, next++);
        draws_hit_all(&s, 20000);
    }

    /* Grown to 2048 buckets and drained to a sparse table. */
    while (next < n_items)
        add_item(&s, next++);
    draws_hit_all(&s, 200000);
    for (size_t i = 0; i < n_items && s.n > 6; i++) {
        kvm_remove(&s, items[i].m);
        items[i].m = NULL;
    }
    ck_assert_uint_ge(n_buckets(&s), 32);
    draws_hit_all(&s, 20000);
    kvm_free(&s);
    for (size_t i = 0; i < n_items; i++)
        items[i].m = NULL;

    /* A generator stuck on an empty bucket: the walk ends the search after
     * a bounded number of draws. */
    kvm_init(&s);
    for (size_t i = 0; i < n_items && s.n < 3; i++) {
        if (kv_hash(items[i].b, items[i].len) & 3)
            add_item(&s, i);
    }
    ck_assert_uint_eq(n_buckets(&s), 4);
    ck_assert_ptr_null(s.buckets[0]);
    for (int k = 0; k < 10; k++) {
        struct kvm_member *m;

        zero_calls = 0;
        m = kvm_random(&s, rnd_zero);
        ck_assert_ptr_nonnull(m);
        ck_assert_ptr_eq(items[tag(m)].m, m);
        ck_assert_uint_le(zero_calls, 102);
    }
    kvm_free(&s);
    free_items();
}
END_TEST

struct scan_state {
    uint32_t *visits;                /* per item */
    uint64_t total;
};

static void visit_scan(void *arg, struct kvm_member *m)
{
    struct scan_state *st = arg;

    /* A scan must never hand out a member that is not in the set. */
    ck_assert_uint_lt(tag(m), n_items);
    ck_assert_ptr_eq(items[tag(m)].m, m);
    st->visits[tag(m)]++;
    st->total++;
}

/* Without changes between calls a scan visits each member exactly once,
 * whatever the count. */
START_TEST(scan_static)
{
    static const unsigned counts[] = {0, 1, 10, 333, 100000};
    struct kvm_set s;
    struct scan_state st;

    test_rng_seed(0x7363616eu);
    make_items(3000);
    st.visits = calloc(n_items, sizeof(*st.visits));
    ck_assert_ptr_nonnull(st.visits);
    kvm_init(&s);
    for (size_t i = 0; i < n_items; i++) {
        if (test_rng() % 3)
            add_item(&s, i);
    }
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        uint64_t cursor = 0, calls = 0;

        memset(st.visits, 0, n_items * sizeof(*st.visits));
        st.total = 0;
        do {
            cursor = kvm_scan(&s, cursor, counts[c], visit_scan, &st);
            calls++;
            ck_assert_uint_le(calls, n_buckets(&s));
        } while (cursor);
        ck_assert_uint_eq(st.total, s.n);
        for (size_t i = 0; i < n_items; i++)
            ck_assert_uint_eq(st.visits[i], items[i].m ? 1 : 0);
        if (counts[c] >= s.n)
            ck_assert_uint_eq(calls, 1);
    }
    kvm_free(&s);
    free(st.visits);
    free_items();
}
END_TEST

enum churn_mode { OSCILLATE, GROW, SHRINK };

/* How far a cursor is through the scan, in eighths: the cursor counts in
 * reverse-binary, so its bits reversed grow from 0 to the end. */
static unsigned progress_eighths(uint64_t cursor)
{
    uint64_t r = 0;

    for (int i = 0; i < 64; i++, cursor >>= 1)
        r = (r << 1) | (cursor & 1);
    return (unsigned)(r >> 61);
}

/* The churn members wanted in the set at a point of the scan: the changes
 * come after the scan's first eighth and before its end, so the cursor is
 * mid-table when the table resizes under it. */
static uint64_t churn_target(enum churn_mode mode, unsigned eighth, uint64_t full)
{
    static const bool oscillate[8] = {false, true, true, false, false, true, true, false};

    switch (mode) {
    case GROW:
        return eighth >= 1 ? full : 0;
    case SHRINK:
        return eighth >= 1 ? 0 : full;
    default:
        return oscillate[eighth] ? full : 0;
    }
}

/* One scan of a set whose stable members stay put while churn members come
 * and go between calls: about step changes per call, mostly towards the
 * target and sometimes against it, picked at random so chains reorder.
 * Every stable member must come up, and the table must have resized under
 * the scan in the mode's directions. */
static void scan_churn(uint64_t seed, enum churn_mode mode, unsigned count, unsigned step)
{
    enum { STABLE = 60, CHURN = 4000 };
    struct kvm_set s;
    struct scan_state st;
    uint64_t cursor = 0, calls = 0, grows = 0, shrinks = 0, live = 0;
    uint32_t *churn = calloc(CHURN, sizeof(*churn));   /* in the set: churn[0..live) */

    test_rng_seed(seed);
    make_items(STABLE + CHURN);
    st.visits = calloc(n_items, sizeof(*st.visits));
    st.total = 0;
    ck_assert_ptr_nonnull(st.visits);
    ck_assert_ptr_nonnull(churn);
    kvm_init(&s);
    for (size_t i = 0; i < STABLE; i++)
        add_item(&s, i);
    for (uint32_t i = 0; i < CHURN; i++)
        churn[i] = STABLE + i;
    if (mode == SHRINK) {
        for (; live < CHURN; live++)
            add_item(&s, churn[live]);
    }
    do {
        uint64_t nb, target;

        cursor = kvm_scan(&s, cursor, count, visit_scan, &st);
        calls++;
        ck_assert_uint_lt(calls, 1000000);
        if (!cursor)
            break;
        target = churn_target(mode, progress_eighths(cursor), CHURN);
        nb = n_buckets(&s);
        for (unsigned k = 0; k < step && live != target; k++) {
            bool add = live < target ? test_rng() % 8 != 0 : test_rng() % 8 == 0;
            uint64_t j;
            uint32_t t;

            if (add && live < CHURN) {
                j = live + test_rng() % (CHURN - live);
                t = churn[j];
                churn[j] = churn[live];
                churn[live++] = t;
                add_item(&s, t);
            } else if (!add && live > 0) {
                j = test_rng() % live;
                t = churn[j];
                kvm_remove(&s, items[t].m);
                items[t].m = NULL;
                churn[j] = churn[--live];
                churn[live] = t;
            }
        }
        if (n_buckets(&s) > nb)
            grows++;
        if (n_buckets(&s) < nb)
            shrinks++;
    } while (cursor);

    for (size_t i = 0; i < STABLE; i++)
        ck_assert_msg(st.visits[i] >= 1, "seed %llx mode %d count %u: stable member %zu missed",
                      (unsigned long long)seed, mode, count, i);
    if (mode != SHRINK)
        ck_assert_uint_ge(grows, 1);
    if (mode != GROW)
        ck_assert_uint_ge(shrinks, 1);
    kvm_free(&s);
    free(st.visits);
    free(churn);
    free_items();
}

/* Each mode with a slow scan and gradual resizes (one at a time between
 * calls), a faster scan, and sudden jumps of several sizes at once. */
static void scan_churn_variants(enum churn_mode mode)
{
    for (uint64_t seed = 1; seed <= 3; seed++) {
        scan_churn(seed, mode, 1, 40);
        scan_churn(seed * 77, mode, 16, 200);
        scan_churn(seed * 1009, mode, 4, 100000);
    }
}

START_TEST(scan_while_growing)
{
    scan_churn_variants(GROW);
}
END_TEST

START_TEST(scan_while_shrinking)
{
    scan_churn_variants(SHRINK);
}
END_TEST

START_TEST(scan_while_resizing)
{
    scan_churn_variants(OSCILLATE);
}
END_TEST

Suite *suite_kv_mset(void)
{
    Suite *s = suite_create("kv_mset");
    TCase *tc = tcase_create("mset");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, empty_and_basics);
    tcase_add_test(tc, shadow_model);
    tcase_add_test(tc, grow_and_shrink);
    tcase_add_test(tc, random_picks);
    tcase_add_test(tc, scan_static);
    tcase_add_test(tc, scan_while_growing);
    tcase_add_test(tc, scan_while_shrinking);
    tcase_add_test(tc, scan_while_resizing);
    suite_add_tcase(s, tc);
    return s;
}
