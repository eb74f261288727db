/* The order of a sorted set (services/kv/coll/zskip.c): ranks, neighbours
 * and score ranges against a shadow model, a sorted array kept beside the
 * skiplist through random inserts, deletes and score moves. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/coll/zskip.h"
#include "suites.h"

static struct kvm_member *member(const void *b, uint32_t len, double score)
{
    struct kvm_member *m = malloc(sizeof(*m) + len);

    ck_assert_ptr_nonnull(m);
    memset(m, 0, sizeof(*m));
    memcpy(m->bytes, b, len);
    m->len = len;
    m->score = score;
    return m;
}

/* The model's order, written apart from zskip.c's so a shared mistake is
 * less likely. */
static int model_cmp(const struct kvm_member *a, const struct kvm_member *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    int c;

    if (a->score < b->score)
        return -1;
    if (a->score > b->score)
        return 1;
    c = memcmp(a->bytes, b->bytes, n);
    if (c != 0)
        return c < 0 ? -1 : 1;
    if (a->len == b->len)
        return 0;
    return a->len < b->len ? -1 : 1;
}

struct model {
    struct kvm_member **a;
    size_t n, cap;
};

static void model_add(struct model *md, struct kvm_member *m)
{
    size_t i = md->n;

    if (md->n == md->cap) {
        md->cap = md->cap ? md->cap * 2 : 64;
        md->a = realloc(md->a, md->cap * sizeof(*md->a));
        ck_assert_ptr_nonnull(md->a);
    }
    while (i > 0 && model_cmp(md->a[i - 1], m) > 0) {
        md->a[i] = md->a[i - 1];
        i--;
    }
    md->a[i] = m;
    md->n++;
}

static void model_del(struct model *md, size_t i)
{
    memmove(&md->a[i], &md->a[i + 1], (md->n - i - 1) * sizeof(*md->a));
    md->n--;
}

static struct kvm_member *model_find(const struct model *md, const uint8_t *b, uint32_t len)
{
    for (size_t i = 0; i < md->n; i++)
        if (md->a[i]->len == len && memcmp(md->a[i]->bytes, b, len) == 0)
            return md->a[i];
    return NULL;
}

static struct kvm_member *model_first_from(const struct model *md, double min, bool excl)
{
    for (size_t i = 0; i < md->n; i++)
        if (excl ? md->a[i]->score > min : md->a[i]->score >= min)
            return md->a[i];
    return NULL;
}

static struct kvm_member *model_last_to(const struct model *md, double max, bool excl)
{
    for (size_t i = md->n; i > 0; i--)
        if (excl ? md->a[i - 1]->score < max : md->a[i - 1]->score <= max)
            return md->a[i - 1];
    return NULL;
}

static void check_range(const struct kvz_list *z, const struct model *md, double s)
{
    for (int excl = 0; excl < 2; excl++) {
        struct kvm_member *got = kvz_first_from(z, s, excl);
        struct kvm_member *want = model_first_from(md, s, excl);

        if (got != want)
            ck_abort_msg("first_from(%g, %d): %p, model %p", s, excl, (void *)got,
                         (void *)want);
        got = kvz_last_to(z, s, excl);
        want = model_last_to(md, s, excl);
        if (got != want)
            ck_abort_msg("last_to(%g, %d): %p, model %p", s, excl, (void *)got, (void *)want);
    }
}

static const double probes[] = {-INFINITY, -1e300, -2.5, -1, -0.0, 0, 0.5, 1, 2, 3, 7,
                                1e300, INFINITY};

/* Everything the list answers, against the model. */
static void check_all(const struct kvz_list *z, const struct model *md)
{
    size_t n = md->n;
    struct kvm_member *w = kvz_first(z);

    ck_assert_uint_eq(z->len, n);
    ck_assert_ptr_eq(kvz_first(z), n ? md->a[0] : NULL);
    ck_assert_ptr_eq(kvz_last(z), n ? md->a[n - 1] : NULL);
    ck_assert_ptr_null(kvz_at(z, n));
    ck_assert_ptr_null(kvz_at(z, n + 1));
    ck_assert_ptr_null(kvz_at(z, UINT64_MAX));
    for (size_t i = 0; i < n; i++) {
        struct kvm_member *m = md->a[i];
        struct kvm_member *at = kvz_at(z, i);
        uint64_t r = kvz_rank(z, m);

        if (at != m)
            ck_abort_msg("at(%zu) is not the model's member (n %zu)", i, n);
        if (r != i)
            ck_abort_msg("rank of the model's #%zu is %llu", i, (unsigned long long)r);
        if (w != m)
            ck_abort_msg("walk by next: #%zu differs", i);
        if (!m->node)
            ck_abort_msg("#%zu has no node", i);
        if (kvz_prev(m) != (i ? md->a[i - 1] : NULL))
            ck_abort_msg("prev of #%zu", i);
        if (kvz_next(m) != (i + 1 < n ? md->a[i + 1] : NULL))
            ck_abort_msg("next of #%zu", i);
        w = kvz_next(m);
        /* At members' own scores, and just around them. */
        if (i % (n / 64 + 1) == 0) {
            check_range(z, md, m->score);
            check_range(z, md, nextafter(m->score, INFINITY));
            check_range(z, md, nextafter(m->score, -INFINITY));
        }
    }
    ck_assert_ptr_null(w);
    /* Backwards from the last as well: the backward pointers. */
    w = kvz_last(z);
    for (size_t i = n; i > 0; i--) {
        if (w != md->a[i - 1])
            ck_abort_msg("walk by prev: #%zu differs", i - 1);
        w = kvz_prev(w);
    }
    ck_assert_ptr_null(w);
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++)
        check_range(z, md, probes[i]);
}

START_TEST(empty_list)
{
    struct kvz_list z;

    ck_assert_int_eq(kvz_init(&z), 0);
    ck_assert_uint_eq(z.len, 0);
    ck_assert_ptr_null(kvz_first(&z));
    ck_assert_ptr_null(kvz_last(&z));
    ck_assert_ptr_null(kvz_at(&z, 0));
    ck_assert_ptr_null(kvz_first_from(&z, -INFINITY, false));
    ck_assert_ptr_null(kvz_last_to(&z, INFINITY, false));
    kvz_free(&z);
    kvz_free(&z);                    /* a freed list is an empty one */
}
END_TEST

/* Equal scores fall back to memcmp over the common length, shorter first:
 * the bytes are not C strings. */
START_TEST(ties_by_member_bytes)
{
    static const struct {
        const char *b;
        uint32_t len;
    } want[] = {
        {"", 0}, {"\0", 1}, {"\0\0", 2}, {"\0a", 2}, {"a", 1}, {"a\0", 2},
        {"a\0b", 3}, {"aa", 2}, {"b", 1}, {"\xff", 1},
    };
    const size_t n = sizeof(want) / sizeof(want[0]);
    struct kvm_member *m[sizeof(want) / sizeof(want[0])];
    struct kvm_member *lo = member("z", 1, -INFINITY), *hi = member("", 0, INFINITY);
    struct kvz_list z;

    ck_assert_int_eq(kvz_init(&z), 0);
    ck_assert_int_eq(kvz_insert(&z, hi), 0);
    /* In an order that is neither sorted nor reversed. */
    for (size_t k = 0; k < n; k++) {
        size_t i = (k * 7 + 3) % n;

        m[i] = member(want[i].b, want[i].len, 1.0);
        ck_assert_int_eq(kvz_insert(&z, m[i]), 0);
        ck_assert_ptr_nonnull(m[i]->node);
    }
    ck_assert_int_eq(kvz_insert(&z, lo), 0);
    ck_assert_uint_eq(z.len, n + 2);
    ck_assert_ptr_eq(kvz_first(&z), lo);
    ck_assert_ptr_eq(kvz_last(&z), hi);
    for (size_t i = 0; i < n; i++) {
        ck_assert_ptr_eq(kvz_at(&z, i + 1), m[i]);
        ck_assert_uint_eq(kvz_rank(&z, m[i]), i + 1);
    }
    ck_assert_ptr_eq(kvz_first_from(&z, 1.0, false), m[0]);
    ck_assert_ptr_eq(kvz_first_from(&z, 1.0, true), hi);
    ck_assert_ptr_eq(kvz_last_to(&z, 1.0, false), m[n - 1]);
    ck_assert_ptr_eq(kvz_last_to(&z, 1.0, true), lo);
    ck_assert_ptr_eq(kvz_first_from(&z, -INFINITY, false), lo);
    ck_assert_ptr_eq(kvz_first_from(&z, -INFINITY, true), m[0]);
    ck_assert_ptr_eq(kvz_last_to(&z, INFINITY, false), hi);
    ck_assert_ptr_eq(kvz_last_to(&z, INFINITY, true), m[n - 1]);
    ck_assert_ptr_null(kvz_first_from(&z, INFINITY, true));
    ck_assert_ptr_null(kvz_last_to(&z, -INFINITY, true));

    /* "a\0" to the top and back, then "a" past it in place of a tie. */
    ck_assert_int_eq(kvz_update(&z, m[5], INFINITY), 0);
    ck_assert_ptr_eq(kvz_last(&z), m[5]);    /* "a\0" > "" at +inf */
    ck_assert_ptr_eq(kvz_prev(m[5]), hi);
    ck_assert_int_eq(kvz_update(&z, m[5], 1.0), 0);
    ck_assert_uint_eq(kvz_rank(&z, m[5]), 6);
    ck_assert_ptr_eq(kvz_next(m[4]), m[5]);

    for (size_t i = 0; i < n; i++) {
        kvz_delete(&z, m[i]);
        ck_assert_ptr_null(m[i]->node);
        free(m[i]);
    }
    ck_assert_uint_eq(z.len, 2);
    ck_assert_ptr_eq(kvz_next(lo), hi);
    ck_assert_ptr_eq(kvz_prev(hi), lo);
    ck_assert_ptr_null(kvz_prev(lo));
    kvz_free(&z);
    free(lo);
    free(hi);
}
END_TEST

/* An update that keeps the order changes the score alone, one that passes
 * neighbours moves the member; either way the ranks follow. */
START_TEST(update_in_place_and_moving)
{
    struct kvm_member *m[5];
    struct kvz_list z;

    ck_assert_int_eq(kvz_init(&z), 0);
    for (int i = 0; i < 5; i++) {
        char b = (char)('a' + i);

        m[i] = member(&b, 1, i * 10.0);
        ck_assert_int_eq(kvz_insert(&z, m[i]), 0);
    }
    ck_assert_int_eq(kvz_update(&z, m[2], 15.0), 0);     /* between 10 and 30 */
    ck_assert(m[2]->score == 15.0);
    ck_assert_uint_eq(kvz_rank(&z, m[2]), 2);
    ck_assert_int_eq(kvz_update(&z, m[2], 10.0), 0);     /* ties "b" at 10: "c" after */
    ck_assert_uint_eq(kvz_rank(&z, m[2]), 2);
    ck_assert_int_eq(kvz_update(&z, m[0], 10.0), 0);     /* "a" before "b" at 10 */
    ck_assert_uint_eq(kvz_rank(&z, m[0]), 0);
    ck_assert_int_eq(kvz_update(&z, m[0], 35.0), 0);     /* past "d" */
    ck_assert_uint_eq(kvz_rank(&z, m[0]), 3);
    ck_assert_ptr_eq(kvz_at(&z, 0), m[1]);
    ck_assert_ptr_eq(kvz_at(&z, 1), m[2]);
    ck_assert_ptr_eq(kvz_at(&z, 2), m[3]);
    ck_assert_ptr_eq(kvz_at(&z, 4), m[4]);
    ck_assert_int_eq(kvz_update(&z, m[4], -INFINITY), 0); /* the last to the first */
    ck_assert_ptr_eq(kvz_first(&z), m[4]);
    ck_assert_ptr_eq(kvz_last(&z), m[0]);
    ck_assert_ptr_null(kvz_prev(m[4]));
    ck_assert_ptr_null(kvz_next(m[0]));
    ck_assert_int_eq(kvz_update(&z, m[4], INFINITY), 0);  /* and back past all */
    ck_assert_ptr_eq(kvz_last(&z), m[4]);
    ck_assert_ptr_eq(kvz_prev(m[4]), m[0]);
    ck_assert_ptr_null(kvz_next(m[4]));
    kvz_free(&z);
    for (int i = 0; i < 5; i++)
        free(m[i]);
}
END_TEST

static uint64_t seed;

static uint64_t rnd(void)
{
    /* splitmix64: the test's own stream, apart from the list's levels. */
    uint64_t x = (seed += 0x9e3779b97f4a7c15ull);

    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Many ties: small integers, halves, the infinities, both zeros. */
static double random_score(void)
{
    static const double special[] = {-INFINITY, INFINITY, -0.0, 0.0, -1e300, 1e300, 0.5, -2.5};
    uint64_t r = rnd();

    switch (r % 4) {
    case 0:
        return special[(r >> 8) % (sizeof(special) / sizeof(special[0]))];
    case 1:
        return (double)((r >> 8) % 2001) / 100.0 - 10.0;
    default:
        return (double)((int)((r >> 8) % 9) - 1);
    }
}

/* Names of up to 8 bytes over {NUL, 'a', 'b', 0xff}: prefixes, embedded NULs,
 * and names drawn again while present. */
static uint32_t random_name(uint8_t *b)
{
    static const uint8_t alpha[] = {0, 'a', 'b', 0xff};
    uint64_t r = rnd();
    uint32_t len = (uint32_t)(r % 9);

    r >>= 4;
    for (uint32_t i = 0; i < len; i++, r >>= 2)
        b[i] = alpha[r & 3];
    return len;
}

START_TEST(random_ops_against_model)
{
    struct model md = {0};
    struct kvz_list z;
    uint64_t counts[3] = {0};

    seed = 20240611;
    ck_assert_int_eq(kvz_init(&z), 0);
    for (int op = 1; op <= 50000; op++) {
        uint64_t kind = rnd() % 100;

        if (kind < 50 || md.n == 0) {
            uint8_t b[8];
            uint32_t len = random_name(b);
            struct kvm_member *m;

            if (model_find(&md, b, len))
                continue;
            m = member(b, len, random_score());
            ck_assert_int_eq(kvz_insert(&z, m), 0);
            model_add(&md, m);
            counts[0]++;
        } else if (kind < 80) {
            size_t i = rnd() % md.n;
            struct kvm_member *m = md.a[i];
            /* Nudges as well as jumps, so both ways of kvz_update run. */
            double s = (rnd() & 1) ? random_score() : m->score + 0.001;

            model_del(&md, i);
            ck_assert_int_eq(kvz_update(&z, m, s), 0);
            ck_assert(m->score == s);
            model_add(&md, m);
            counts[1]++;
        } else {
            size_t i = rnd() % md.n;
            struct kvm_member *m = md.a[i];

            kvz_delete(&z, m);
            ck_assert_ptr_null(m->node);
            model_del(&md, i);
            free(m);
            counts[2]++;
        }
        if (op % 1000 == 0)
            check_all(&z, &md);
    }
    check_all(&z, &md);
    /* The run went where it was meant to: a list of some thousands with
     * several levels, every kind of operation many times. */
    ck_assert_uint_gt(md.n, 1500);
    ck_assert_int_ge(z.level, 4);
    ck_assert_uint_gt(counts[0], 9000);
    ck_assert_uint_gt(counts[1], 9000);
    ck_assert_uint_gt(counts[2], 9000);
    /* Empty it from the front, as ZPOPMIN does. */
    while (md.n) {
        struct kvm_member *m = kvz_first(&z);

        ck_assert_ptr_eq(m, md.a[0]);
        kvz_delete(&z, m);
        model_del(&md, 0);
        free(m);
        if (md.n % 97 == 0)
            check_all(&z, &md);
    }
    ck_assert_uint_eq(z.len, 0);
    ck_assert_ptr_null(kvz_first(&z));
    ck_assert_ptr_null(kvz_last(&z));
    kvz_free(&z);
    free(md.a);
}
END_TEST

Suite *suite_kv_zskip(void)
{
    Suite *s = suite_create("kv_zskip");
    TCase *tc = tcase_create("zskip");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, empty_list);
    tcase_add_test(tc, ties_by_member_bytes);
    tcase_add_test(tc, update_in_place_and_moving);
    tcase_add_test(tc, random_ops_against_model);
    suite_add_tcase(s, tc);
    return s;
}
