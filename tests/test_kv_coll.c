/* Collections on a pool of their own (services/kv/coll/coll.c): lists,
 * hashes, sets and sorted sets written, read back after a reopen, checked
 * against a shadow model; what a crash leaves behind (elements of no
 * collection, empty heads, an interrupted RENAME, a list with gaps)
 * repaired at open; malformed records refused; deadlines; the deferred
 * deletion of a big collection; a full pool; SCAN and RANDOMKEY; limits.
 * Records are forged with kvs_* on the pool file, in the grammar coll.h
 * describes. The clock is the test's; every random run has a fixed seed. */
#include <check.h>
#include <endian.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "kv/coll/coll.h"
#include "kv/kv_store.h"
#include "pm/pm_layout.h"
#include "suites.h"

#define SEG (64u * 1024)
#define POOL (8ull << 20)
#define T0 1700000000000ull

static char path[128];
static uint64_t fake_now;
static uint64_t (*saved_kvs_now)(void);

static uint64_t fake_clock(void)
{
    return fake_now;
}

static void setup(void)
{
    fake_now = T0;
    saved_kvs_now = kvs_now_ms;
    kvs_now_ms = fake_clock;
    kvc_now_ms = fake_clock;
    test_pool_file(path, sizeof(path), "kvc");
}

static void teardown(void)
{
    kvc_now_ms = NULL;
    kvs_now_ms = saved_kvs_now;
    test_pool_file_remove(path);
}

/* ---- the engine and the store under it ---- */

static struct kvc *open_sized(uint64_t pool)
{
    struct kvc_opts o = {.path = path, .pool_size = pool, .seg_size = SEG};
    struct kvc *e = NULL;
    int rc = kvc_open(&o, &e);

    ck_assert_msg(rc == 0, "kvc_open: %s", tern_strerror(rc));
    ck_assert_ptr_nonnull(e);
    return e;
}

static struct kvc *open_eng(void)
{
    return open_sized(POOL);
}

static struct kvc *reopen(struct kvc *e)
{
    ck_assert_int_eq(kvc_sync(e), 0);
    kvc_close(e);
    return open_eng();
}

/* The collection pool as a plain store (the engine closed). */
static struct kvs *raw_open(void)
{
    struct kvs_opts o = {.path = path, .pool_size = POOL, .seg_size = SEG};
    struct kvs *s = NULL;
    int rc = kvs_open(&o, &s);

    ck_assert_msg(rc == 0, "kvs_open: %s", tern_strerror(rc));
    return s;
}

static size_t head_k(uint8_t *buf, const char *key)
{
    size_t n = strlen(key);

    buf[0] = 'K';
    memcpy(buf + 1, key, n);
    return n + 1;
}

static size_t elem_k(uint8_t *buf, uint64_t gen, const void *suffix, size_t slen)
{
    uint64_t be = htobe64(gen);

    buf[0] = 'M';
    memcpy(buf + 1, &be, 8);
    memcpy(buf + 9, suffix, slen);
    return slen + 9;
}

static size_t seq_k(uint8_t *buf, uint64_t gen, int64_t seq)
{
    uint64_t be = htobe64((uint64_t)seq ^ (1ull << 63));

    return elem_k(buf, gen, &be, 8);
}

static void head_v(uint8_t v[24], int type, uint64_t gen, uint64_t deadline)
{
    uint64_t g = htole64(gen), d = htole64(deadline);

    memset(v, 0, 24);
    v[0] = (uint8_t)type;
    memcpy(v + 8, &g, 8);
    memcpy(v + 16, &d, 8);
}

static void raw_put(struct kvs *s, const void *k, size_t klen, const void *v, size_t vlen)
{
    int rc = kvs_put(s, k, klen, v, vlen, 0, NULL);

    ck_assert_msg(rc == 0, "kvs_put: %s", tern_strerror(rc));
}

/* The generation in key's head record. */
static uint64_t raw_gen(struct kvs *s, const char *key)
{
    uint8_t k[64];
    const void *v;
    uint32_t len;
    uint64_t gen;

    ck_assert_int_eq(kvs_get(s, k, head_k(k, key), &v, &len, NULL), 0);
    ck_assert_uint_eq(len, 24);
    memcpy(&gen, (const uint8_t *)v + 8, 8);
    return le64toh(gen);
}

static bool raw_has(struct kvs *s, const void *k, size_t klen)
{
    const void *v;
    uint32_t len;
    int rc = kvs_get(s, k, klen, &v, &len, NULL);

    ck_assert_msg(rc == 0 || rc == TERN_ENOENT, "kvs_get: %s", tern_strerror(rc));
    return rc == 0;
}

static bool raw_head(struct kvs *s, const char *key)
{
    uint8_t k[64];

    return raw_has(s, k, head_k(k, key));
}

/* Records in the pool file, the engine closed. */
static uint64_t raw_count(void)
{
    struct kvs *s = raw_open();
    uint64_t n = kvs_count(s);

    kvs_close(s);
    return n;
}

/* ---- collections by C-string key ---- */

static struct kvc_coll *find(struct kvc *e, const char *k)
{
    return kvc_find(e, k, strlen(k));
}

static struct kvc_coll *must(struct kvc *e, const char *k)
{
    struct kvc_coll *c = find(e, k);

    ck_assert_msg(c != NULL, "no collection %s", k);
    return c;
}

static struct kvc_coll *find_or_make(struct kvc *e, const char *k, enum kvc_type t)
{
    struct kvc_coll *c = find(e, k);

    if (!c)
        ck_assert_int_eq(kvc_create(e, k, strlen(k), t, &c), 0);
    ck_assert_int_eq(c->type, t);
    return c;
}

static void push(struct kvc *e, const char *k, bool left, const char *v)
{
    int rc = kvc_list_push(e, find_or_make(e, k, KVC_LIST), left, v, strlen(v));

    ck_assert_msg(rc == 0, "push %s: %s", k, tern_strerror(rc));
}

static int hset(struct kvc *e, const char *k, const void *f, size_t flen, const char *v)
{
    return kvc_hash_set(e, find_or_make(e, k, KVC_HASH), f, flen, v, strlen(v));
}

static int sadd(struct kvc *e, const char *k, const char *m)
{
    return kvc_set_add(e, find_or_make(e, k, KVC_SET), m, strlen(m));
}

static int zput(struct kvc *e, const char *k, const char *m, double score)
{
    return kvc_zset_put(e, find_or_make(e, k, KVC_ZSET), m, strlen(m), score, NULL);
}

static int mdel(struct kvc *e, const char *k, const void *m, size_t mlen)
{
    struct kvc_coll *c = must(e, k);
    struct kvm_member *mm = kvc_member(c, m, mlen);

    ck_assert_ptr_nonnull(mm);
    return kvc_member_del(e, c, mm);
}

static void list_is(struct kvc *e, const char *k, const char *const *want, size_t n)
{
    struct kvc_coll *c = must(e, k);

    ck_assert_int_eq(c->type, KVC_LIST);
    ck_assert_uint_eq(kvc_len(c), n);
    for (size_t i = 0; i < n; i++) {
        const void *v;
        uint32_t len;
        int rc = kvc_list_at(e, c, i, &v, &len);

        ck_assert_msg(rc == 0, "%s[%zu]: %s", k, i, tern_strerror(rc));
        ck_assert_msg(len == strlen(want[i]) && memcmp(v, want[i], len) == 0,
                      "%s[%zu] is %.*s, not %s", k, i, (int)len, (const char *)v, want[i]);
    }
    ck_assert_int_eq(kvc_list_at(e, c, n, &(const void *){NULL}, &(uint32_t){0}), TERN_ERANGE);
}

static void hash_is(struct kvc *e, const char *k, const void *f, size_t flen, const char *want)
{
    struct kvc_coll *c = must(e, k);
    struct kvm_member *m = kvc_member(c, f, flen);
    const void *v;
    uint32_t len;

    ck_assert_msg(m != NULL, "%s has no field %.*s", k, (int)flen, (const char *)f);
    ck_assert_int_eq(kvc_hash_value(e, c, m, &v, &len), 0);
    ck_assert_msg(len == strlen(want) && memcmp(v, want, len) == 0, "%s.%.*s is %.*s, not %s",
                  k, (int)flen, (const char *)f, (int)len, (const char *)v, want);
}

/* A sorted set's order, member by member: names[r] at rank r. */
static void zset_is(struct kvc *e, const char *k, const char *const *names, const double *scores,
                    size_t n)
{
    struct kvc_coll *c = must(e, k);

    ck_assert_int_eq(c->type, KVC_ZSET);
    ck_assert_uint_eq(kvc_len(c), n);
    ck_assert_uint_eq(c->order.len, n);
    for (size_t r = 0; r < n; r++) {
        struct kvm_member *m = kvz_at(&c->order, r);

        ck_assert_ptr_nonnull(m);
        ck_assert_msg(m->len == strlen(names[r]) && memcmp(m->bytes, names[r], m->len) == 0,
                      "%s rank %zu is %.*s, not %s", k, r, (int)m->len, (const char *)m->bytes,
                      names[r]);
        ck_assert_msg(m->score == scores[r], "%s.%s scores %g, not %g", k, names[r], m->score,
                      scores[r]);
        ck_assert_uint_eq(kvz_rank(&c->order, m), r);
        ck_assert_ptr_eq(kvc_member(c, names[r], strlen(names[r])), m);
    }
    ck_assert_ptr_null(kvz_at(&c->order, n));
}

/* ---- the whole state as text (to compare before and after a reopen) ---- */

struct sbuf {
    char *p;
    size_t n, cap;
};

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        ck_assert_int_ge(n, 0);
        if (b->p && b->n + (size_t)n < b->cap)
            break;
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
        b->p[b->n] = '\0';
    }
    b->n += (size_t)n;
}

static void sb_bytes(struct sbuf *b, const void *p, size_t n)
{
    const uint8_t *q = p;

    sb_printf(b, "%zu:", n);
    for (size_t i = 0; i < n; i++)
        sb_printf(b, "%02x", q[i]);
}

struct keyset {
    struct kvm_set set;              /* keys visited */
};

static void key_visit(void *arg, struct kvc_coll *c)
{
    struct keyset *ks = arg;
    struct kvm_member *m;
    uint32_t klen;
    const void *k = kvc_key(c, &klen);

    ck_assert_int_ge(kvm_add(&ks->set, k, klen, &m), 0);
}

static void scan_keys(struct kvc *e, struct keyset *ks)
{
    uint64_t cur = 0;
    unsigned calls = 0;

    kvm_init(&ks->set);
    do {
        cur = kvc_scan(e, cur, 16, key_visit, ks);
        ck_assert_uint_lt(++calls, 1000000);
    } while (cur);
}

struct mlist {
    struct kvm_member **m;
    size_t n, cap;
};

static void mlist_add(void *arg, struct kvm_member *m)
{
    struct mlist *l = arg;

    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->m = realloc(l->m, l->cap * sizeof(*l->m));
        ck_assert_ptr_nonnull(l->m);
    }
    l->m[l->n++] = m;
}

static int bytes_cmp(const void *a, uint32_t alen, const void *b, uint32_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);

    if (c)
        return c < 0 ? -1 : 1;
    return alen < blen ? -1 : alen > blen;
}

static int member_cmp(const void *a, const void *b)
{
    const struct kvm_member *x = *(struct kvm_member *const *)a, *y = *(struct kvm_member *const *)b;

    return bytes_cmp(x->bytes, x->len, y->bytes, y->len);
}

/* c's members, sorted by bytes. */
static struct mlist sorted_members(const struct kvc_coll *c)
{
    struct mlist l = {0};

    kvm_each(&c->members, mlist_add, &l);
    if (l.n)
        qsort(l.m, l.n, sizeof(*l.m), member_cmp);
    return l;
}

/* A sorted set's order must be by score, then bytes; its ranks must agree. */
static void check_order(const struct kvc_coll *c)
{
    struct kvm_member *prev = NULL;

    ck_assert_uint_eq(c->order.len, c->members.n);
    for (uint64_t r = 0; r < c->order.len; r++) {
        struct kvm_member *m = kvz_at(&c->order, r);

        ck_assert_ptr_nonnull(m);
        ck_assert_uint_eq(kvz_rank(&c->order, m), r);
        ck_assert_ptr_eq(kvm_find(&c->members, m->bytes, m->len), m);
        if (prev)
            ck_assert(prev->score < m->score ||
                      (prev->score == m->score &&
                       bytes_cmp(prev->bytes, prev->len, m->bytes, m->len) < 0));
        prev = m;
    }
    ck_assert_ptr_null(kvz_at(&c->order, c->order.len));
}

static void dump_coll(struct kvc *e, struct kvc_coll *c, struct sbuf *b)
{
    uint32_t klen;
    const void *k = kvc_key(c, &klen);

    sb_bytes(b, k, klen);
    sb_printf(b, " %c len %llu dl %llu:", c->type, (unsigned long long)kvc_len(c),
              (unsigned long long)c->deadline);
    if (c->type == KVC_LIST) {
        for (uint64_t i = 0; i < kvc_len(c); i++) {
            const void *v;
            uint32_t len;

            ck_assert_int_eq(kvc_list_at(e, c, i, &v, &len), 0);
            sb_printf(b, " ");
            sb_bytes(b, v, len);
        }
    } else if (c->type == KVC_ZSET) {
        check_order(c);
        for (uint64_t r = 0; r < c->order.len; r++) {
            struct kvm_member *m = kvz_at(&c->order, r);

            sb_printf(b, " ");
            sb_bytes(b, m->bytes, m->len);
            sb_printf(b, "=%.17g", m->score);
        }
    } else {
        struct mlist l = sorted_members(c);

        for (size_t i = 0; i < l.n; i++) {
            sb_printf(b, " ");
            sb_bytes(b, l.m[i]->bytes, l.m[i]->len);
            if (c->type == KVC_HASH) {
                const void *v;
                uint32_t len;

                ck_assert_int_eq(kvc_hash_value(e, c, l.m[i], &v, &len), 0);
                sb_printf(b, "=");
                sb_bytes(b, v, len);
            }
        }
        free(l.m);
    }
    sb_printf(b, "\n");
}

/* Every collection (found by kvc_scan), by key; the caller frees it. */
static char *dump(struct kvc *e)
{
    struct keyset ks;
    struct mlist keys = {0};
    struct sbuf b = {0};

    scan_keys(e, &ks);
    kvm_each(&ks.set, mlist_add, &keys);
    if (keys.n)
        qsort(keys.m, keys.n, sizeof(*keys.m), member_cmp);
    ck_assert_uint_eq(keys.n, kvc_count(e));
    sb_printf(&b, "%llu collections, %llu expiring\n", (unsigned long long)kvc_count(e),
              (unsigned long long)kvc_expiring(e));
    for (size_t i = 0; i < keys.n; i++) {
        struct kvc_coll *c = kvc_find(e, keys.m[i]->bytes, keys.m[i]->len);

        ck_assert_ptr_nonnull(c);
        dump_coll(e, c, &b);
    }
    free(keys.m);
    kvm_free(&ks.set);
    return b.p;
}

static void same_dump(const char *before, const char *after)
{
    if (strcmp(before, after) != 0) {
        size_t i = 0;

        while (before[i] && before[i] == after[i])
            i++;
        ck_abort_msg("the state changed across a reopen at byte %zu:\nbefore: %.200s\nafter:  %.200s",
                     i, before + (i > 40 ? i - 40 : 0), after + (i > 40 ? i - 40 : 0));
    }
}

/* ---- 1. persistence ---- */

/* Every kind of write, then a reopen: the same lists in the same order,
 * hash values, members, sorted orders, deadlines and renames. */
START_TEST(everything_reads_back)
{
    struct kvc *e = open_eng();
    struct kvc_coll *c;
    const char nul_field[] = {'f', 0, 'x'};
    char *before, *after;

    /* list L: y z a b c, then ends dropped, a set, a removal, a push */
    push(e, "L", false, "a");
    push(e, "L", false, "b");
    push(e, "L", false, "c");
    push(e, "L", true, "z");
    push(e, "L", true, "y");
    ck_assert_int_eq(kvc_list_drop(e, must(e, "L"), true, 1), 0);     /* z a b c */
    ck_assert_int_eq(kvc_list_drop(e, must(e, "L"), false, 1), 0);    /* z a b */
    push(e, "L", false, "d");
    push(e, "L", false, "e");                                         /* z a b d e */
    ck_assert_int_eq(kvc_list_set(e, must(e, "L"), 1, "A", 1), 0);    /* z A b d e */
    ck_assert_int_eq(kvc_list_remove_at(e, must(e, "L"), 2), 0);      /* z A d e */
    push(e, "L", true, "x");                                          /* x z A d e */
    {
        const char *want[] = {"x", "z", "A", "d", "e"};

        list_is(e, "L", want, 5);
    }
    /* a list emptied from both ends is gone */
    push(e, "gone", false, "1");
    push(e, "gone", true, "0");
    ck_assert_int_eq(kvc_list_drop(e, must(e, "gone"), false, 1), 0);
    ck_assert_int_eq(kvc_list_drop(e, must(e, "gone"), true, 1), 1);
    ck_assert_ptr_null(find(e, "gone"));
    /* a long list, pushed from both ends */
    for (int i = 0; i < 300; i++) {
        char v[16];

        snprintf(v, sizeof(v), "v%d", i);
        push(e, "long", i % 3 == 0, v);
    }

    /* hash H: f1 f2 f3, f2 replaced, f1 removed, a field with a NUL */
    ck_assert_int_eq(hset(e, "H", "f1", 2, "v1"), 1);
    ck_assert_int_eq(hset(e, "H", "f2", 2, "v2"), 1);
    ck_assert_int_eq(hset(e, "H", "f3", 2, "v3"), 1);
    ck_assert_int_eq(hset(e, "H", "f2", 2, "a longer v2"), 0);
    ck_assert_int_eq(hset(e, "H", nul_field, sizeof(nul_field), ""), 1);
    ck_assert_int_eq(mdel(e, "H", "f1", 2), 0);

    /* set S: m0..m49, every third removed, one added twice */
    for (int i = 0; i < 50; i++) {
        char m[16];

        snprintf(m, sizeof(m), "m%d", i);
        ck_assert_int_eq(sadd(e, "S", m), 1);
    }
    ck_assert_int_eq(sadd(e, "S", "m7"), 0);
    for (int i = 0; i < 50; i += 3) {
        char m[16];

        snprintf(m, sizeof(m), "m%d", i);
        ck_assert_int_eq(mdel(e, "S", m, strlen(m)), 0);
    }

    /* sorted set Z: scores set, moved (down and up), a member removed, ties */
    ck_assert_int_eq(zput(e, "Z", "a", 3), 1);
    ck_assert_int_eq(zput(e, "Z", "b", 1), 1);
    ck_assert_int_eq(zput(e, "Z", "c", 2), 1);
    ck_assert_int_eq(zput(e, "Z", "d", 2), 1);
    ck_assert_int_eq(zput(e, "Z", "a", 0), 0);
    ck_assert_int_eq(zput(e, "Z", "d", -1.5), 0);
    ck_assert_int_eq(zput(e, "Z", "e", 1), 1);
    ck_assert_int_eq(zput(e, "Z", "f", INFINITY), 1);
    ck_assert_int_eq(zput(e, "Z", "g", 5), 1);
    ck_assert_int_eq(zput(e, "Z", "g", 1), 0);
    ck_assert_int_eq(mdel(e, "Z", "c", 1), 0);
    {
        const char *names[] = {"d", "a", "b", "e", "g", "f"};
        const double scores[] = {-1.5, 0, 1, 1, 1, INFINITY};

        zset_is(e, "Z", names, scores, 6);
    }

    /* deadlines: set, moved, taken away */
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "H"), T0 + 100000), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "L"), T0 + 50000), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "L"), T0 + 60000), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "Z"), T0 + 70000), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "Z"), 0), 0);
    ck_assert_uint_eq(kvc_expiring(e), 2);

    /* renames: H (with its deadline) and S; Z renamed twice, back again */
    ck_assert_int_eq(kvc_rename(e, must(e, "H"), "hash", 4), 0);
    ck_assert_int_eq(kvc_rename(e, must(e, "S"), "set", 3), 0);
    ck_assert_int_eq(kvc_rename(e, must(e, "Z"), "zz", 2), 0);
    ck_assert_int_eq(kvc_rename(e, must(e, "zz"), "Z", 1), 0);
    ck_assert_int_eq(kvc_rename(e, must(e, "Z"), "L", 1), TERN_EEXIST);
    ck_assert_ptr_null(find(e, "H"));
    ck_assert_ptr_null(find(e, "S"));
    ck_assert_ptr_null(find(e, "zz"));
    ck_assert_uint_eq(kvc_count(e), 5);

    before = dump(e);
    ck_assert_int_eq(kvc_sync(e), 0);
    ck_assert(!kvc_dirty(e));
    kvc_close(e);
    e = open_eng();
    after = dump(e);
    same_dump(before, after);
    free(after);

    /* and each piece explicitly */
    ck_assert_uint_eq(kvc_count(e), 5);
    ck_assert_uint_eq(kvc_expiring(e), 2);
    ck_assert_ptr_null(find(e, "H"));
    ck_assert_ptr_null(find(e, "S"));
    ck_assert_ptr_null(find(e, "zz"));
    ck_assert_ptr_null(find(e, "gone"));
    {
        const char *want[] = {"x", "z", "A", "d", "e"};

        list_is(e, "L", want, 5);
        ck_assert_uint_eq(must(e, "L")->deadline, T0 + 60000);
    }
    c = must(e, "long");
    ck_assert_uint_eq(kvc_len(c), 300);
    for (int i = 0, front = 0, back = 0; i < 300; i++) {
        /* v(3k) went left, the others right: the left ones in reverse */
        int n_left = 100, idx = i % 3 == 0 ? n_left - 1 - front++ : n_left + back++;
        const void *v;
        uint32_t len;
        char want[16];

        snprintf(want, sizeof(want), "v%d", i);
        ck_assert_int_eq(kvc_list_at(e, c, (uint64_t)idx, &v, &len), 0);
        ck_assert_msg(len == strlen(want) && memcmp(v, want, len) == 0, "long[%d]", idx);
    }
    c = must(e, "hash");
    ck_assert_int_eq(c->type, KVC_HASH);
    ck_assert_uint_eq(kvc_len(c), 3);
    ck_assert_uint_eq(c->deadline, T0 + 100000);
    ck_assert_ptr_null(kvc_member(c, "f1", 2));
    hash_is(e, "hash", "f2", 2, "a longer v2");
    hash_is(e, "hash", "f3", 2, "v3");
    hash_is(e, "hash", nul_field, sizeof(nul_field), "");
    c = must(e, "set");
    ck_assert_int_eq(c->type, KVC_SET);
    ck_assert_uint_eq(kvc_len(c), 33);
    ck_assert_uint_eq(c->deadline, 0);
    for (int i = 0; i < 50; i++) {
        char m[16];

        snprintf(m, sizeof(m), "m%d", i);
        ck_assert_msg((kvc_member(c, m, strlen(m)) != NULL) == (i % 3 != 0), "member %s", m);
    }
    {
        const char *names[] = {"d", "a", "b", "e", "g", "f"};
        const double scores[] = {-1.5, 0, 1, 1, 1, INFINITY};

        zset_is(e, "Z", names, scores, 6);
        ck_assert_uint_eq(must(e, "Z")->deadline, 0);
    }
    /* and once more, with nothing written in between */
    e = reopen(e);
    after = dump(e);
    same_dump(before, after);
    free(after);
    free(before);
    kvc_close(e);
}
END_TEST

/* ---- the shadow model ---- */

#define NSLOT 20
#define NMEM 40
#define LMAX 160
#define VMAX 160
#define MMAX 300

struct mval {
    uint16_t len;
    uint8_t b[VMAX];
};

struct mcoll {
    bool used;
    char name[24];
    enum kvc_type type;
    uint64_t deadline;
    unsigned n;                      /* a list's length */
    struct mval list[LMAX];
    bool has[NMEM];                  /* members */
    struct mval hv[NMEM];            /* hash values */
    double score[NMEM];
};

static struct mcoll *model;
static unsigned name_seq;

/* Member j's bytes: one empty, some with a NUL, some long. */
static size_t mem_bytes(unsigned j, uint8_t *b)
{
    if (j == 0)
        return 0;
    if (j % 7 == 3) {
        b[0] = 0;
        return (size_t)snprintf((char *)b + 1, MMAX - 1, "x%02u", j) + 1;
    }
    if (j % 11 == 5) {
        int n = snprintf((char *)b, MMAX, "long%02u-", j);

        test_pattern(b + n, MMAX - (size_t)n, j);
        return MMAX;
    }
    return (size_t)snprintf((char *)b, MMAX, "mem%02u", j);
}

static void rand_val(struct mval *v)
{
    uint64_t r = test_rng();

    v->len = (uint16_t)(r % VMAX);
    test_pattern(v->b, v->len, (unsigned)(r >> 32));
}

static double rand_score(void)
{
    uint64_t r = test_rng();

    if (r % 40 == 0)
        return INFINITY;
    if (r % 40 == 1)
        return -INFINITY;
    return ((double)(int)((r >> 8) % 21) - 10) * 0.5;
}

static unsigned popcount_has(const struct mcoll *m)
{
    unsigned n = 0;

    for (unsigned j = 0; j < NMEM; j++)
        n += m->has[j];
    return n;
}

static struct mcoll *zsort_model;

static int zmodel_cmp(const void *a, const void *b)
{
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    uint8_t bx[MMAX], by[MMAX];
    size_t lx, ly;

    if (zsort_model->score[x] != zsort_model->score[y])
        return zsort_model->score[x] < zsort_model->score[y] ? -1 : 1;
    lx = mem_bytes(x, bx);
    ly = mem_bytes(y, by);
    return bytes_cmp(bx, (uint32_t)lx, by, (uint32_t)ly);
}

/* The engine holds what the model does, collection by collection. */
static void check_model(struct kvc *e)
{
    uint64_t count = 0, expiring = 0;

    for (unsigned s = 0; s < NSLOT; s++) {
        struct mcoll *m = &model[s];
        struct kvc_coll *c;

        if (!m->used)
            continue;
        count++;
        expiring += m->deadline != 0;
        c = must(e, m->name);
        ck_assert_int_eq(c->type, m->type);
        ck_assert_uint_eq(c->deadline, m->deadline);
        if (m->type == KVC_LIST) {
            ck_assert_uint_eq(kvc_len(c), m->n);
            for (unsigned i = 0; i < m->n; i++) {
                const void *v;
                uint32_t len;

                ck_assert_int_eq(kvc_list_at(e, c, i, &v, &len), 0);
                ck_assert_msg(len == m->list[i].len && memcmp(v, m->list[i].b, len) == 0,
                              "%s[%u] differs", m->name, i);
            }
            continue;
        }
        ck_assert_uint_eq(kvc_len(c), popcount_has(m));
        for (unsigned j = 0; j < NMEM; j++) {
            uint8_t b[MMAX];
            size_t len = mem_bytes(j, b);
            struct kvm_member *mm = kvc_member(c, b, len);

            ck_assert_msg((mm != NULL) == m->has[j], "%s member %u: %d", m->name, j, mm != NULL);
            if (!mm)
                continue;
            if (m->type == KVC_HASH) {
                const void *v;
                uint32_t vlen;

                ck_assert_int_eq(kvc_hash_value(e, c, mm, &v, &vlen), 0);
                ck_assert_msg(vlen == m->hv[j].len && memcmp(v, m->hv[j].b, vlen) == 0,
                              "%s field %u differs", m->name, j);
            } else if (m->type == KVC_ZSET) {
                ck_assert_msg(mm->score == m->score[j], "%s member %u scores %g, not %g",
                              m->name, j, mm->score, m->score[j]);
            }
        }
        if (m->type == KVC_ZSET) {
            unsigned order[NMEM], n = 0;

            for (unsigned j = 0; j < NMEM; j++)
                if (m->has[j])
                    order[n++] = j;
            zsort_model = m;
            qsort(order, n, sizeof(*order), zmodel_cmp);
            check_order(c);
            for (unsigned r = 0; r < n; r++) {
                uint8_t b[MMAX];
                size_t len = mem_bytes(order[r], b);
                struct kvm_member *at = kvz_at(&c->order, r);

                ck_assert_msg(at && at->len == len && memcmp(at->bytes, b, len) == 0,
                              "%s rank %u is not member %u", m->name, r, order[r]);
            }
        }
    }
    ck_assert_uint_eq(kvc_count(e), count);
    ck_assert_uint_eq(kvc_expiring(e), expiring);
}

/* Add or set a random member (or push) of m's collection c, as the model. */
static void model_add(struct kvc *e, struct mcoll *m, struct kvc_coll *c)
{
    uint64_t r = test_rng();
    int rc;

    if (m->type == KVC_LIST) {
        bool left = r & 1;
        struct mval v;

        rand_val(&v);
        rc = kvc_list_push(e, c, left, v.b, v.len);
        ck_assert_msg(rc == 0, "push: %s", tern_strerror(rc));
        if (left) {
            memmove(m->list + 1, m->list, m->n * sizeof(*m->list));
            m->list[0] = v;
        } else {
            m->list[m->n] = v;
        }
        m->n++;
        return;
    }
    unsigned j = (unsigned)((r >> 8) % NMEM);
    uint8_t b[MMAX];
    size_t len = mem_bytes(j, b);

    if (m->type == KVC_HASH) {
        struct mval v;

        rand_val(&v);
        rc = kvc_hash_set(e, c, b, len, v.b, v.len);
        m->hv[j] = v;
    } else if (m->type == KVC_SET) {
        rc = kvc_set_add(e, c, b, len);
    } else {
        double sc = rand_score();
        struct kvm_member *out = NULL;

        rc = kvc_zset_put(e, c, b, len, sc, &out);
        ck_assert_ptr_nonnull(out);
        ck_assert(out->score == sc);
        m->score[j] = sc;
    }
    ck_assert_msg(rc == !m->has[j], "add of member %u to %s: %d", j, m->name, rc);
    m->has[j] = true;
}

static void model_step(struct kvc *e)
{
    struct mcoll *m = &model[test_rng() % NSLOT];
    uint64_t r = test_rng();
    unsigned op = (unsigned)(r % 100);
    struct kvc_coll *c;
    int rc;

    if (!m->used) {
        static const enum kvc_type types[] = {KVC_LIST, KVC_HASH, KVC_SET, KVC_ZSET};

        memset(m, 0, sizeof(*m));
        m->type = types[(r >> 8) % 4];
        snprintf(m->name, sizeof(m->name), "k%u", name_seq++);
        ck_assert_ptr_null(find(e, m->name));
        ck_assert_int_eq(kvc_create(e, m->name, strlen(m->name), m->type, &c), 0);
        m->used = true;
        model_add(e, m, c);
        return;
    }
    c = must(e, m->name);
    if (op < 2) {
        ck_assert_int_eq(kvc_delete(e, c), 0);
        m->used = false;
    } else if (op < 5) {
        char old[24];

        snprintf(old, sizeof(old), "%s", m->name);
        snprintf(m->name, sizeof(m->name), "k%u", name_seq++);
        ck_assert_int_eq(kvc_rename(e, c, m->name, strlen(m->name)), 0);
        ck_assert_ptr_null(find(e, old));
    } else if (op < 9) {
        uint64_t at = (r >> 8) % 3 == 0 ? 0 : fake_now + 1000000 + (r >> 16) % 100000;

        ck_assert_int_eq(kvc_set_expiry(e, c, at), 0);
        m->deadline = at;
    } else if (m->type == KVC_LIST) {
        uint64_t i = m->n ? (r >> 8) % m->n : 0;

        if (op < 55 && m->n < LMAX) {
            model_add(e, m, c);
        } else if (op < 70 || m->n == LMAX) {
            bool left = (r >> 8) & 1;
            unsigned k = 1 + (unsigned)((r >> 16) % 3);

            if (k > m->n)
                k = m->n;
            rc = kvc_list_drop(e, c, left, k);
            ck_assert_int_eq(rc, k == m->n);
            if (left)
                memmove(m->list, m->list + k, (m->n - k) * sizeof(*m->list));
            m->n -= k;
            m->used = m->n != 0;
        } else if (op < 85) {
            struct mval v;

            rand_val(&v);
            ck_assert_int_eq(kvc_list_set(e, c, i, v.b, v.len), 0);
            m->list[i] = v;
        } else {
            rc = kvc_list_remove_at(e, c, i);
            ck_assert_int_eq(rc, m->n == 1);
            memmove(m->list + i, m->list + i + 1, (m->n - i - 1) * sizeof(*m->list));
            m->n--;
            m->used = m->n != 0;
        }
    } else {
        unsigned j = (unsigned)((r >> 8) % NMEM);

        if (op < 70 || !m->has[j]) {
            model_add(e, m, c);
        } else {
            uint8_t b[MMAX];
            size_t len = mem_bytes(j, b);
            struct kvm_member *mm = kvc_member(c, b, len);

            ck_assert_ptr_nonnull(mm);
            m->has[j] = false;
            rc = kvc_member_del(e, c, mm);
            ck_assert_int_eq(rc, popcount_has(m) == 0);
            m->used = rc == 0;
        }
    }
}

/* Thousands of random writes over twenty collections of every type, the
 * pool small enough that it is cleaned meanwhile; the engine is checked
 * against the model before and after a reopen every 500 writes. */
START_TEST(random_against_a_model)
{
    struct kvc *e = open_sized(1u << 20);
    struct kvs_stats st;
    uint64_t cleaned = 0;

    model = calloc(NSLOT, sizeof(*model));
    ck_assert_ptr_nonnull(model);
    name_seq = 0;
    test_rng_seed(0xc011ec7104ull);
    for (unsigned i = 1; i <= 10000; i++) {
        model_step(e);
        if (i % 500 == 0) {
            char *before, *after;

            check_model(e);
            before = dump(e);
            kvs_get_stats(kvc_store(e), &st);
            cleaned += st.segs_cleaned;
            e = reopen(e);
            check_model(e);
            after = dump(e);
            same_dump(before, after);
            free(before);
            free(after);
        }
    }
    ck_assert_msg(cleaned > 0, "the pool was never cleaned");
    kvc_close(e);
    free(model);
}
END_TEST

/* ---- 2. crash leftovers ---- */

/* Elements whose head is gone (a crash while deleting a collection) are
 * deleted at open; the other collections keep theirs. */
START_TEST(orphan_elements_deleted)
{
    struct kvc *e = open_eng();
    struct kvs *s;
    uint8_t k[64];

    for (int i = 0; i < 10; i++) {
        char m[8];

        snprintf(m, sizeof(m), "m%d", i);
        ck_assert_int_eq(sadd(e, "s", m), 1);
    }
    for (int i = 0; i < 5; i++)
        push(e, "l", false, "x");
    ck_assert_int_eq(zput(e, "z", "a", 1), 1);
    ck_assert_int_eq(zput(e, "z", "b", 2), 1);
    for (int i = 0; i < 3; i++) {
        char f[8];

        snprintf(f, sizeof(f), "f%d", i);
        ck_assert_int_eq(hset(e, "keep", f, strlen(f), "v"), 1);
    }
    kvc_close(e);

    s = raw_open();
    ck_assert_uint_eq(kvs_count(s), 4 + 10 + 5 + 2 + 3);
    ck_assert_int_eq(kvs_del(s, k, head_k(k, "s"), 0, NULL), 0);
    ck_assert_int_eq(kvs_del(s, k, head_k(k, "l"), 0, NULL), 0);
    ck_assert_int_eq(kvs_del(s, k, head_k(k, "z"), 0, NULL), 0);
    raw_put(s, k, elem_k(k, 1ull << 50, "stray", 5), "v", 1);    /* a generation never used */
    ck_assert_uint_eq(kvs_count(s), 10 + 5 + 2 + 4 + 1);
    kvs_close(s);

    e = open_eng();
    ck_assert_uint_eq(kvs_count(kvc_store(e)), 4);
    ck_assert_uint_eq(kvc_count(e), 1);
    ck_assert_ptr_null(find(e, "s"));
    ck_assert_ptr_null(find(e, "l"));
    ck_assert_ptr_null(find(e, "z"));
    hash_is(e, "keep", "f2", 2, "v");
    ck_assert_uint_eq(kvc_len(must(e, "keep")), 3);
    kvc_close(e);
    ck_assert_uint_eq(raw_count(), 4);      /* deleted for good */
}
END_TEST

/* A head without elements (a crash between a collection's first writes,
 * or in the middle of deleting one) is deleted at open. */
START_TEST(empty_heads_deleted)
{
    struct kvc *e = open_eng();
    struct kvs *s;
    uint8_t k[64], v[24];

    ck_assert_int_eq(sadd(e, "keep", "m"), 1);
    kvc_close(e);
    s = raw_open();
    head_v(v, KVC_HASH, 1ull << 40, 0);
    raw_put(s, k, head_k(k, "empty-hash"), v, 24);
    head_v(v, KVC_LIST, (1ull << 40) + 1, T0 + 5000);
    raw_put(s, k, head_k(k, "empty-list"), v, 24);
    head_v(v, KVC_ZSET, (1ull << 40) + 2, 0);
    raw_put(s, k, head_k(k, "empty-zset"), v, 24);
    kvs_close(s);

    e = open_eng();
    ck_assert_uint_eq(kvc_count(e), 1);
    ck_assert_uint_eq(kvc_expiring(e), 0);
    ck_assert_ptr_null(find(e, "empty-hash"));
    ck_assert_ptr_null(find(e, "empty-list"));
    ck_assert_ptr_null(find(e, "empty-zset"));
    ck_assert_ptr_nonnull(kvc_member(must(e, "keep"), "m", 1));
    kvc_close(e);
    s = raw_open();
    ck_assert(!raw_head(s, "empty-hash"));
    ck_assert(!raw_head(s, "empty-list"));
    ck_assert(!raw_head(s, "empty-zset"));
    ck_assert_uint_eq(kvs_count(s), 2);
    kvs_close(s);
}
END_TEST

/* Two heads of one generation (a crash in the middle of RENAME): the
 * newer head wins, whichever key it has, and the other is deleted. */
START_TEST(interrupted_rename)
{
    struct kvc *e = open_eng();
    struct kvs *s;
    uint8_t k[64], v[24];
    const void *p;
    uint32_t len;

    for (int i = 0; i < 3; i++) {
        char f[8];

        snprintf(f, sizeof(f), "f%d", i);
        ck_assert_int_eq(hset(e, "a", f, strlen(f), f), 1);
        ck_assert_int_eq(zput(e, "c", f, i), 1);
    }
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "c"), T0 + 9000), 0);
    kvc_close(e);

    s = raw_open();
    /* "a" renamed to "b": b's head written, a's not yet deleted */
    ck_assert_int_eq(kvs_get(s, k, head_k(k, "a"), &p, &len, NULL), 0);
    memcpy(v, p, 24);
    raw_put(s, k, head_k(k, "b"), v, 24);
    /* "c" was renamed to "d" and back: d's head, then c's again (newer) */
    ck_assert_int_eq(kvs_get(s, k, head_k(k, "c"), &p, &len, NULL), 0);
    memcpy(v, p, 24);
    raw_put(s, k, head_k(k, "d"), v, 24);
    raw_put(s, k, head_k(k, "c"), v, 24);
    kvs_close(s);

    e = open_eng();
    ck_assert_uint_eq(kvc_count(e), 2);
    ck_assert_ptr_null(find(e, "a"));
    ck_assert_ptr_null(find(e, "d"));
    ck_assert_uint_eq(kvc_len(must(e, "b")), 3);
    hash_is(e, "b", "f0", 2, "f0");
    hash_is(e, "b", "f2", 2, "f2");
    {
        const char *names[] = {"f0", "f1", "f2"};
        const double scores[] = {0, 1, 2};

        zset_is(e, "c", names, scores, 3);
    }
    ck_assert_uint_eq(must(e, "c")->deadline, T0 + 9000);
    ck_assert_uint_eq(kvc_expiring(e), 1);
    kvc_close(e);
    s = raw_open();
    ck_assert(!raw_head(s, "a"));
    ck_assert(!raw_head(s, "d"));
    ck_assert(raw_head(s, "b"));
    ck_assert(raw_head(s, "c"));
    kvs_close(s);
    e = open_eng();
    ck_assert_uint_eq(kvc_count(e), 2);
    hash_is(e, "b", "f1", 2, "f1");
    kvc_close(e);
}
END_TEST

/* A list with holes in its positions (a crash in the middle of removing
 * from it) is renumbered at open: its length and order are right, pushes
 * at both ends after it land right, and it stays right. */
START_TEST(list_gaps_renumbered)
{
    struct kvc *e = open_eng();
    struct kvs *s;
    uint8_t k[64];
    uint64_t gen;
    char v[8];

    for (int i = 0; i < 10; i++) {
        snprintf(v, sizeof(v), "e%d", i);
        push(e, "l", false, v);                 /* positions 0..9 */
    }
    push(e, "l", true, "n1");                   /* -1 */
    push(e, "l", true, "n2");                   /* -2 */
    kvc_close(e);

    s = raw_open();
    gen = raw_gen(s, "l");
    /* the elements at indexes 1 (n1), 4 (e2) and 8 (e6) go */
    ck_assert_int_eq(kvs_del(s, k, seq_k(k, gen, -1), 0, NULL), 0);
    ck_assert_int_eq(kvs_del(s, k, seq_k(k, gen, 2), 0, NULL), 0);
    ck_assert_int_eq(kvs_del(s, k, seq_k(k, gen, 6), 0, NULL), 0);
    kvs_close(s);

    e = open_eng();
    {
        const char *want[] = {"n2", "e0", "e1", "e3", "e4", "e5", "e7", "e8", "e9"};

        list_is(e, "l", want, 9);
    }
    ck_assert_uint_eq(kvs_count(kvc_store(e)), 1 + 9);
    push(e, "l", true, "h");
    push(e, "l", false, "t");
    ck_assert_int_eq(kvc_list_remove_at(e, must(e, "l"), 4), 0);   /* e3 */
    {
        const char *want[] = {"h", "n2", "e0", "e1", "e4", "e5", "e7", "e8", "e9", "t"};

        list_is(e, "l", want, 10);
        e = reopen(e);
        list_is(e, "l", want, 10);
        ck_assert_uint_eq(kvs_count(kvc_store(e)), 1 + 10);
        e = reopen(e);
        list_is(e, "l", want, 10);
    }
    kvc_close(e);
}
END_TEST

/* ---- 3. malformed records ---- */

enum bad {
    BAD_NONE,               /* the control: well formed */
    BAD_TYPE,
    BAD_HEAD_SHORT,
    BAD_HEAD_LONG,
    BAD_GEN0,
    BAD_SCORE_SHORT,
    BAD_SCORE_LONG,
    BAD_SCORE_NAN,
    BAD_SET_VALUE,
    BAD_LIST_SUFFIX_SHORT,
    BAD_LIST_SUFFIX_LONG,
    BAD_PREFIX,
    BAD_ELEM_SHORT,
    BAD_EMPTY_KEY,
    BAD_COUNT
};

static void forge(enum bad which)
{
    struct kvs *s = raw_open();
    uint8_t k[64], v[32];
    uint64_t g = 1ull << 40;
    double not_a_number = NAN, one = 1;

    /* a well-formed set, list, zset beside the bad record */
    head_v(v, KVC_SET, g, 0);
    raw_put(s, k, head_k(k, "s"), v, 24);
    raw_put(s, k, elem_k(k, g, "m", 1), "", 0);
    head_v(v, KVC_LIST, g + 1, 0);
    raw_put(s, k, head_k(k, "l"), v, 24);
    raw_put(s, k, seq_k(k, g + 1, 0), "x", 1);
    head_v(v, KVC_ZSET, g + 2, 0);
    raw_put(s, k, head_k(k, "z"), v, 24);
    raw_put(s, k, elem_k(k, g + 2, "a", 1), &one, 8);
    switch (which) {
    case BAD_NONE:
    case BAD_COUNT:
        break;
    case BAD_TYPE:
        head_v(v, 'q', g + 9, 0);
        raw_put(s, k, head_k(k, "bad"), v, 24);
        break;
    case BAD_HEAD_SHORT:
        head_v(v, KVC_SET, g + 9, 0);
        raw_put(s, k, head_k(k, "bad"), v, 23);
        break;
    case BAD_HEAD_LONG:
        head_v(v, KVC_SET, g + 9, 0);
        raw_put(s, k, head_k(k, "bad"), v, 25);
        break;
    case BAD_GEN0:
        head_v(v, KVC_SET, 0, 0);
        raw_put(s, k, head_k(k, "bad"), v, 24);
        break;
    case BAD_SCORE_SHORT:
        raw_put(s, k, elem_k(k, g + 2, "b", 1), &one, 4);
        break;
    case BAD_SCORE_LONG:
        memcpy(v, &one, 8);
        raw_put(s, k, elem_k(k, g + 2, "b", 1), v, 9);
        break;
    case BAD_SCORE_NAN:
        raw_put(s, k, elem_k(k, g + 2, "b", 1), &not_a_number, 8);
        break;
    case BAD_SET_VALUE:
        raw_put(s, k, elem_k(k, g, "n", 1), "v", 1);
        break;
    case BAD_LIST_SUFFIX_SHORT:
        raw_put(s, k, elem_k(k, g + 1, "1234567", 7), "y", 1);
        break;
    case BAD_LIST_SUFFIX_LONG:
        raw_put(s, k, elem_k(k, g + 1, "123456789", 9), "y", 1);
        break;
    case BAD_PREFIX:
        head_v(v, KVC_SET, g + 9, 0);       /* a head's value, but not a head's key */
        raw_put(s, "Xfoo", 4, v, 24);
        break;
    case BAD_ELEM_SHORT:
        raw_put(s, "M1234", 5, "v", 1);
        break;
    case BAD_EMPTY_KEY:
        head_v(v, KVC_SET, g + 9, 0);
        raw_put(s, "K", 1, v, 24);
        break;
    }
    kvs_close(s);
}

/* A record that breaks the grammar fails the open (TERN_ECORRUPT), every
 * time, and changes nothing; the well-formed control opens. */
START_TEST(malformed_records_refused)
{
    for (int b = BAD_NONE; b < BAD_COUNT; b++) {
        struct kvc_opts o = {.path = path, .pool_size = POOL, .seg_size = SEG};
        struct kvc *e = NULL;
        uint64_t before;
        int rc;

        unlink(path);
        forge((enum bad)b);
        before = raw_count();
        rc = kvc_open(&o, &e);
        if (b == BAD_NONE) {
            ck_assert_msg(rc == 0, "the control: %s", tern_strerror(rc));
            ck_assert_uint_eq(kvc_count(e), 3);
            ck_assert_double_eq(kvc_member(must(e, "z"), "a", 1)->score, 1);
            kvc_close(e);
            continue;
        }
        ck_assert_msg(rc == TERN_ECORRUPT, "case %d: %s", b, tern_strerror(rc));
        ck_assert_ptr_null(e);
        ck_assert_int_eq(kvc_open(&o, &e), TERN_ECORRUPT);
        ck_assert_uint_eq(raw_count(), before);
    }
}
END_TEST

/* ---- 4. expiry ---- */

START_TEST(deadlines)
{
    struct kvc *e = open_eng();
    uint64_t base;

    ck_assert_int_eq(sadd(e, "a", "m"), 1);
    ck_assert_int_eq(hset(e, "b", "f", 1, "v"), 1);
    push(e, "c", false, "x");
    ck_assert_int_eq(zput(e, "d", "m", 1), 1);
    ck_assert_int_eq(sadd(e, "keep", "m"), 1);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "a"), T0 + 100), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "b"), T0 + 200), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "c"), T0 + 300), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "d"), T0 + 400), 0);
    ck_assert_uint_eq(kvc_expiring(e), 4);
    ck_assert_uint_eq(kvs_count(kvc_store(e)), 10);
    base = 2;                                   /* keep's records */

    /* nothing is due yet */
    ck_assert_uint_eq(kvc_expire(e, fake_now, 10), 0);
    fake_now = T0 + 99;
    ck_assert_ptr_nonnull(find(e, "a"));
    /* at the deadline: gone on lookup, and from the pool */
    fake_now = T0 + 100;
    ck_assert_ptr_null(find(e, "a"));
    ck_assert_uint_eq(kvc_count(e), 4);
    ck_assert_uint_eq(kvc_expiring(e), 3);
    ck_assert_uint_eq(kvs_count(kvc_store(e)), 8);
    ck_assert_int_eq(sadd(e, "a", "new"), 1);   /* the key is free again */
    ck_assert_uint_eq(must(e, "a")->deadline, 0);
    ck_assert_uint_eq(kvc_len(must(e, "a")), 1);
    base += 2;

    /* b and c due: kvc_expire takes at most max, leaves d and keep */
    fake_now = T0 + 350;
    ck_assert_uint_eq(kvc_expire(e, fake_now, 1), 1);
    ck_assert_uint_eq(kvc_count(e), 4);
    ck_assert_uint_eq(kvc_expiring(e), 2);
    ck_assert_uint_eq(kvc_expire(e, fake_now, 10), 1);
    ck_assert_uint_eq(kvc_expire(e, fake_now, 10), 0);
    ck_assert_ptr_null(find(e, "b"));
    ck_assert_ptr_null(find(e, "c"));
    ck_assert_uint_eq(kvc_count(e), 3);
    ck_assert_uint_eq(kvc_expiring(e), 1);
    ck_assert_uint_eq(must(e, "d")->deadline, T0 + 400);
    ck_assert_uint_eq(kvs_count(kvc_store(e)), base + 2);

    /* d's deadline and a new one survive a reopen; a deadline taken away too */
    ck_assert_int_eq(sadd(e, "e", "m"), 1);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "e"), T0 + 5000), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "e"), T0 + 6000), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "keep"), T0 + 7000), 0);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "keep"), 0), 0);
    ck_assert_uint_eq(kvc_expiring(e), 2);
    e = reopen(e);
    ck_assert_uint_eq(kvc_expiring(e), 2);
    ck_assert_uint_eq(must(e, "d")->deadline, T0 + 400);
    ck_assert_uint_eq(must(e, "e")->deadline, T0 + 6000);
    ck_assert_uint_eq(must(e, "keep")->deadline, 0);
    /* d falls due while closed: absent after the next open */
    kvc_close(e);
    fake_now = T0 + 400;
    e = open_eng();
    ck_assert_uint_eq(kvc_expire(e, fake_now, 10), 1);
    ck_assert_ptr_null(find(e, "d"));
    ck_assert_uint_eq(kvc_expiring(e), 1);
    fake_now = T0 + 5999;
    ck_assert_uint_eq(kvc_expire(e, fake_now, 10), 0);
    fake_now = T0 + 6000;
    ck_assert_uint_eq(kvc_expire(e, fake_now, 10), 1);
    ck_assert_ptr_null(find(e, "e"));
    ck_assert_uint_eq(kvc_expiring(e), 0);

    /* a deadline already past deletes at once (1), now included */
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "a"), fake_now - 1), 1);
    ck_assert_ptr_null(find(e, "a"));
    ck_assert_int_eq(sadd(e, "f", "m"), 1);
    ck_assert_int_eq(kvc_set_expiry(e, must(e, "f"), fake_now), 1);
    ck_assert_ptr_null(find(e, "f"));
    ck_assert_uint_eq(kvc_count(e), 1);
    ck_assert_uint_eq(kvc_expiring(e), 0);
    e = reopen(e);
    ck_assert_uint_eq(kvc_count(e), 1);
    ck_assert_uint_eq(kvs_count(kvc_store(e)), 2);
    ck_assert_ptr_nonnull(find(e, "keep"));

    /* a deadline on a collection not written yet goes with its first write */
    {
        struct kvc_coll *c;

        ck_assert_int_eq(kvc_create(e, "g", 1, KVC_HASH, &c), 0);
        ck_assert_int_eq(kvc_set_expiry(e, c, fake_now + 50), 0);
        ck_assert_int_eq(kvc_hash_set(e, c, "f", 1, "v", 1), 1);
    }
    e = reopen(e);
    ck_assert_uint_eq(must(e, "g")->deadline, fake_now + 50);
    fake_now += 50;
    ck_assert_ptr_null(find(e, "g"));
    kvc_close(e);
}
END_TEST

/* ---- 5. a big collection deleted ---- */

START_TEST(big_delete_deferred)
{
    struct kvc *e = open_eng();
    struct kvs_stats st0, st1;
    uint64_t base;
    unsigned calls = 0;
    char m[16];

    ck_assert_int_eq(hset(e, "other", "f", 1, "v"), 1);
    base = kvs_count(kvc_store(e));
    ck_assert_uint_eq(base, 2);
    for (int i = 0; i < 5000; i++) {
        snprintf(m, sizeof(m), "member%d", i);
        ck_assert_int_eq(sadd(e, "big", m), 1);
    }
    ck_assert_uint_eq(kvs_count(kvc_store(e)), base + 5001);
    kvs_get_stats(kvc_store(e), &st0);
    ck_assert_int_eq(kvc_delete(e, must(e, "big")), 0);
    kvs_get_stats(kvc_store(e), &st1);
    /* at once: the head and a few elements, not 5000 */
    ck_assert_uint_le(st1.dels - st0.dels, 1 + 100);
    ck_assert_ptr_null(find(e, "big"));
    ck_assert_uint_eq(kvc_count(e), 1);
    ck_assert_uint_gt(kvs_count(kvc_store(e)), base + 4000);
    /* a new collection at the key is not confused with the dead one */
    ck_assert_int_eq(sadd(e, "big", "member1"), 1);
    ck_assert_uint_eq(kvc_len(must(e, "big")), 1);
    base += 2;
    while (kvs_count(kvc_store(e)) > base) {
        uint64_t was = kvs_count(kvc_store(e));

        ck_assert_uint_eq(kvc_expire(e, fake_now, 100), 0);
        ck_assert_uint_lt(kvs_count(kvc_store(e)), was);
        ck_assert_uint_lt(++calls, 1000);
    }
    ck_assert_uint_gt(calls, 1);
    ck_assert_uint_eq(kvs_count(kvc_store(e)), base);
    ck_assert_uint_eq(kvc_len(must(e, "big")), 1);
    ck_assert_ptr_nonnull(kvc_member(must(e, "big"), "member1", 7));
    ck_assert_int_eq(kvc_delete(e, must(e, "big")), 0);
    base -= 2;

    /* a big list and a big sorted set, deleted; a reopen before their
     * elements are all gone deletes the rest */
    for (int i = 0; i < 5000; i++) {
        snprintf(m, sizeof(m), "member%d", i);
        push(e, "biglist", i & 1, m);
        ck_assert_int_eq(zput(e, "bigz", m, i % 17), 1);
    }
    ck_assert_uint_eq(kvs_count(kvc_store(e)), base + 10002);
    ck_assert_int_eq(kvc_delete(e, must(e, "biglist")), 0);
    ck_assert_int_eq(kvc_delete(e, must(e, "bigz")), 0);
    ck_assert_uint_eq(kvc_expire(e, fake_now, 100), 0);
    ck_assert_uint_gt(kvs_count(kvc_store(e)), base + 5000);
    e = reopen(e);
    ck_assert_uint_eq(kvs_count(kvc_store(e)), base);
    ck_assert_uint_eq(kvc_count(e), 1);
    hash_is(e, "other", "f", 1, "v");
    kvc_close(e);
    ck_assert_uint_eq(raw_count(), base);
}
END_TEST

/* ---- 6. a full pool ---- */

#define FULL_POOL (2ull << 20)
#define FILL_M 200

static size_t fill_member(unsigned i, uint8_t *b)
{
    int n = snprintf((char *)b, FILL_M, "%08u-", i);

    test_pattern(b + n, FILL_M - (size_t)n, i);
    return FILL_M;
}

/* Writes fail with TERN_ENOSPC once the pool is full of live records;
 * each failed call changes nothing (DRAM agrees with the pool: a reopen
 * reads back the state before it), and a new collection whose first
 * write failed is not left behind. */
START_TEST(full_pool)
{
    struct kvc *e = open_sized(FULL_POOL);
    struct kvc_coll *c;
    uint8_t b[FILL_M], big[600];
    unsigned n_set = 0, n_list = 0, n_hash = 0;
    uint64_t count;
    char *before, *after;
    int rc = 0;

    push(e, "L", false, "first");
    ck_assert_int_eq(hset(e, "H", "f0", 2, "old"), 1);
    ck_assert_int_eq(zput(e, "Z", "a", 1), 1);
    /* the set fills the pool */
    for (unsigned i = 0; i < 100000; i++) {
        size_t len = fill_member(i, b);

        rc = kvc_set_add(e, find_or_make(e, "S", KVC_SET), b, len);
        if (rc != 1)
            break;
        n_set++;
    }
    ck_assert_msg(rc == TERN_ENOSPC, "set_add: %s", tern_strerror(rc));
    ck_assert_uint_gt(n_set, 1000);
    c = must(e, "S");
    ck_assert_uint_eq(kvc_len(c), n_set);
    ck_assert_ptr_null(kvc_member(c, b, fill_member(n_set, b)));
    /* then smaller records, until they do not fit either */
    for (unsigned i = 0; i < 100000; i++) {
        char v[100];

        memset(v, 'a' + (int)(i % 26), sizeof(v));
        rc = kvc_list_push(e, must(e, "L"), i & 1, v, sizeof(v));
        if (rc != 0)
            break;
        n_list++;
    }
    ck_assert_msg(rc == TERN_ENOSPC, "list_push: %s", tern_strerror(rc));
    ck_assert_uint_eq(kvc_len(must(e, "L")), 1 + n_list);
    for (unsigned i = 0; i < 100000; i++) {
        char f[16];

        snprintf(f, sizeof(f), "g%u", i);
        rc = hset(e, "H", f, strlen(f), "a value of some forty bytes, more or less");
        if (rc != 1)
            break;
        n_hash++;
    }
    ck_assert_msg(rc == TERN_ENOSPC, "hash_set: %s", tern_strerror(rc));
    ck_assert_uint_eq(kvc_len(must(e, "H")), 1 + n_hash);
    ck_assert_ptr_null(kvc_member(must(e, "H"), "g", 1));

    /* failed calls on full collections change nothing */
    memset(big, 'B', sizeof(big));
    ck_assert_int_eq(kvc_hash_set(e, must(e, "H"), "f0", 2, big, sizeof(big)), TERN_ENOSPC);
    hash_is(e, "H", "f0", 2, "old");
    ck_assert_int_eq(kvc_zset_put(e, must(e, "Z"), big, 500, 2, NULL), TERN_ENOSPC);
    /* a score moved: a record small enough that it may still fit */
    ck_assert_int_eq(kvc_sync(e), 0);
    rc = kvc_zset_put(e, must(e, "Z"), "a", 1, 7, NULL);
    ck_assert_msg(rc == 0 || rc == TERN_ENOSPC, "zset_put: %s", tern_strerror(rc));
    {
        const char *names[] = {"a"};
        const double scores[] = {rc == 0 ? 7 : 1};

        zset_is(e, "Z", names, scores, 1);
    }
    ck_assert_int_eq(kvc_list_push(e, must(e, "L"), false, big, sizeof(big)), TERN_ENOSPC);
    ck_assert_int_eq(kvc_list_set(e, must(e, "L"), 0, big, sizeof(big)), TERN_ENOSPC);
    ck_assert_uint_eq(kvc_len(must(e, "L")), 1 + n_list);

    /* new collections whose first write fails are not left behind */
    count = kvc_count(e);
    ck_assert_int_eq(kvc_create(e, "fresh-set", 9, KVC_SET, &c), 0);
    ck_assert_int_eq(kvc_set_add(e, c, big, 500), TERN_ENOSPC);
    ck_assert_int_eq(kvc_create(e, "fresh-list", 10, KVC_LIST, &c), 0);
    ck_assert_int_eq(kvc_list_push(e, c, true, big, sizeof(big)), TERN_ENOSPC);
    ck_assert_int_eq(kvc_create(e, "fresh-hash", 10, KVC_HASH, &c), 0);
    ck_assert_int_eq(kvc_hash_set(e, c, "f", 1, big, sizeof(big)), TERN_ENOSPC);
    ck_assert_int_eq(kvc_create(e, "fresh-zset", 10, KVC_ZSET, &c), 0);
    ck_assert_int_eq(kvc_zset_put(e, c, big, 500, 1, NULL), TERN_ENOSPC);
    ck_assert_ptr_null(find(e, "fresh-set"));
    ck_assert_ptr_null(find(e, "fresh-list"));
    ck_assert_ptr_null(find(e, "fresh-hash"));
    ck_assert_ptr_null(find(e, "fresh-zset"));
    ck_assert_uint_eq(kvc_count(e), count);

    /* the pool holds what DRAM did */
    before = dump(e);
    e = reopen(e);
    after = dump(e);
    same_dump(before, after);
    free(after);
    free(before);
    ck_assert_uint_eq(kvc_count(e), count);
    ck_assert_uint_eq(kvc_len(must(e, "S")), n_set);
    ck_assert_uint_eq(kvc_len(must(e, "L")), 1 + n_list);
    ck_assert_uint_eq(kvc_len(must(e, "H")), 1 + n_hash);
    ck_assert_ptr_null(find(e, "fresh-set"));
    ck_assert_ptr_null(find(e, "fresh-list"));
    for (unsigned i = 0; i < n_set; i += 97)
        ck_assert_ptr_nonnull(kvc_member(must(e, "S"), b, fill_member(i, b)));
    hash_is(e, "H", "f0", 2, "old");
    kvc_close(e);
}
END_TEST

/* ---- 7. SCAN and RANDOMKEY ---- */

static void scan_mark(void *arg, struct kvc_coll *c)
{
    bool *seen = arg;
    uint32_t klen;
    const char *k = kvc_key(c, &klen);
    char buf[32];

    if (klen > 4 && klen < sizeof(buf) && memcmp(k, "base", 4) == 0) {
        memcpy(buf, k, klen);
        buf[klen] = '\0';
        seen[atoi(buf + 4)] = true;
    }
}

/* Every collection present for the whole scan is visited while others come
 * and go between the calls (the map grows, then shrinks). */
START_TEST(scan_while_changing)
{
    enum { NBASE = 150 };
    struct kvc *e = open_eng();
    bool seen[NBASE] = {false};
    uint64_t cur = 0;
    unsigned calls = 0, made = 0, gone = 0;
    char k[32];

    for (int i = 0; i < NBASE; i++) {
        snprintf(k, sizeof(k), "base%d", i);
        ck_assert_int_eq(sadd(e, k, "m"), 1);
    }
    do {
        cur = kvc_scan(e, cur, 4, scan_mark, seen);
        calls++;
        if (calls < 20) {
            /* grow: the map doubles a few times */
            for (int j = 0; j < 100; j++) {
                snprintf(k, sizeof(k), "tmp%u", made++);
                push(e, k, false, "v");
            }
        } else if (gone < made) {
            /* shrink: delete them again, fast */
            for (int j = 0; j < 200 && gone < made; j++) {
                snprintf(k, sizeof(k), "tmp%u", gone++);
                ck_assert_int_eq(kvc_delete(e, must(e, k)), 0);
            }
        }
        ck_assert_uint_lt(calls, 100000);
    } while (cur);
    ck_assert_uint_eq(gone, made);
    ck_assert_uint_eq(kvc_count(e), NBASE);
    for (int i = 0; i < NBASE; i++)
        ck_assert_msg(seen[i], "base%d was never visited (%u calls)", i, calls);
    kvc_close(e);
}
END_TEST

/* kvc_random returns live collections only: never one past its deadline
 * (still in the map), never a deleted one; NULL when none is live. SCAN
 * skips the due ones as well. */
START_TEST(random_is_live)
{
    struct kvc *e = open_eng();
    bool hit[40] = {false};
    unsigned nonnull = 0, distinct = 0;
    char k[32];

    for (int i = 0; i < 40; i++) {
        snprintf(k, sizeof(k), "%s%d", i % 2 ? "due" : "live", i);
        ck_assert_int_eq(sadd(e, k, "m"), 1);
        if (i % 2)
            ck_assert_int_eq(kvc_set_expiry(e, must(e, k), T0 + 10), 0);
    }
    for (int i = 0; i < 40; i += 4) {
        snprintf(k, sizeof(k), "live%d", i);
        ck_assert_int_eq(kvc_delete(e, must(e, k)), 0);
    }
    fake_now = T0 + 10;
    for (int n = 0; n < 3000; n++) {
        struct kvc_coll *c = kvc_random(e);
        uint32_t klen;
        const char *key;
        char buf[32];
        int i;

        if (!c)
            continue;
        nonnull++;
        key = kvc_key(c, &klen);
        ck_assert_msg(klen > 4 && klen < sizeof(buf) && memcmp(key, "live", 4) == 0,
                      "random gave %.*s", (int)klen, key);
        ck_assert(c->deadline == 0);
        memcpy(buf, key, klen);
        buf[klen] = '\0';
        i = atoi(buf + 4);
        ck_assert_int_ne(i % 4, 0);
        if (!hit[i]) {
            hit[i] = true;
            distinct++;
        }
    }
    ck_assert_uint_gt(nonnull, 1000);
    ck_assert_uint_eq(distinct, 10);
    /* SCAN skips the due ones too */
    {
        struct keyset ks;

        scan_keys(e, &ks);
        ck_assert_uint_eq(ks.set.n, 10);
        for (int i = 2; i < 40; i += 4) {
            snprintf(k, sizeof(k), "live%d", i);
            ck_assert_ptr_nonnull(kvm_find(&ks.set, k, (uint32_t)strlen(k)));
        }
        kvm_free(&ks.set);
    }
    /* only due ones left: NULL */
    for (int i = 2; i < 40; i += 4) {
        snprintf(k, sizeof(k), "live%d", i);
        ck_assert_int_eq(kvc_delete(e, must(e, k)), 0);
    }
    for (int n = 0; n < 200; n++)
        ck_assert_ptr_null(kvc_random(e));
    ck_assert_uint_eq(kvc_expire(e, fake_now, 100), 20);
    ck_assert_uint_eq(kvc_count(e), 0);
    ck_assert_ptr_null(kvc_random(e));
    kvc_close(e);
}
END_TEST

/* ---- 8. limits ---- */

START_TEST(limits)
{
    struct kvc *e = open_eng();
    struct kvc_coll *c;
    static uint8_t key[KVC_KEY_MAX + 2], mem[KVC_MEMBER_MAX + 2], big[2 * SEG];

    memset(key, 'k', sizeof(key));
    memset(mem, 'm', sizeof(mem));
    memset(big, 'v', sizeof(big));
    ck_assert_int_eq(kvc_create(e, key, KVC_KEY_MAX + 1, KVC_SET, &c), TERN_E2BIG);
    ck_assert_int_eq(kvc_create(e, key, 0, KVC_SET, &c), TERN_EINVAL);
    ck_assert_ptr_null(kvc_find(e, key, KVC_KEY_MAX + 1));
    ck_assert_uint_eq(kvc_count(e), 0);

    /* the longest key and member fit, and read back */
    ck_assert_int_eq(kvc_create(e, key, KVC_KEY_MAX, KVC_SET, &c), 0);
    ck_assert_int_eq(kvc_set_add(e, c, mem, KVC_MEMBER_MAX), 1);
    ck_assert_int_eq(kvc_set_add(e, c, mem, KVC_MEMBER_MAX + 1), TERN_E2BIG);
    ck_assert_ptr_null(kvc_member(c, mem, KVC_MEMBER_MAX + 1));
    ck_assert_int_eq(kvc_rename(e, c, key + 1, KVC_KEY_MAX + 1), TERN_E2BIG);
    ck_assert_int_eq(kvc_rename(e, c, key, 0), TERN_EINVAL);
    ck_assert_ptr_eq(kvc_find(e, key, KVC_KEY_MAX), c);
    ck_assert_uint_eq(kvc_len(c), 1);

    ck_assert_int_eq(hset(e, "h", "f", 1, "v"), 1);
    c = must(e, "h");
    ck_assert_int_eq(kvc_hash_set(e, c, mem, KVC_MEMBER_MAX + 1, "v", 1), TERN_E2BIG);
    ck_assert_int_eq(kvc_hash_set(e, c, "f", 1, big, sizeof(big)), TERN_E2BIG);
    ck_assert_int_eq(kvc_hash_set(e, c, mem, KVC_MEMBER_MAX, "w", 1), 1);
    ck_assert_uint_eq(kvc_len(c), 2);
    hash_is(e, "h", "f", 1, "v");

    ck_assert_int_eq(zput(e, "z", "a", 1), 1);
    c = must(e, "z");
    ck_assert_int_eq(kvc_zset_put(e, c, "a", 1, NAN, NULL), TERN_EINVAL);
    ck_assert_int_eq(kvc_zset_put(e, c, "b", 1, NAN, NULL), TERN_EINVAL);
    ck_assert_int_eq(kvc_zset_put(e, c, mem, KVC_MEMBER_MAX + 1, 1, NULL), TERN_E2BIG);
    ck_assert_int_eq(kvc_zset_put(e, c, mem, KVC_MEMBER_MAX, -INFINITY, NULL), 1);
    ck_assert_uint_eq(kvc_len(c), 2);
    ck_assert_double_eq(kvc_member(c, "a", 1)->score, 1);

    push(e, "l", false, "x");
    ck_assert_int_eq(kvc_list_push(e, must(e, "l"), false, big, sizeof(big)), TERN_E2BIG);
    ck_assert_int_eq(kvc_list_set(e, must(e, "l"), 0, big, sizeof(big)), TERN_E2BIG);
    ck_assert_int_eq(kvc_list_set(e, must(e, "l"), 1, "y", 1), TERN_ERANGE);
    {
        const char *want[] = {"x"};

        list_is(e, "l", want, 1);
    }
    /* a new list whose first push is too big is not left behind */
    ck_assert_int_eq(kvc_create(e, "l2", 2, KVC_LIST, &c), 0);
    ck_assert_int_eq(kvc_list_push(e, c, false, big, sizeof(big)), TERN_E2BIG);
    ck_assert_ptr_null(find(e, "l2"));
    ck_assert_uint_eq(kvc_count(e), 4);
    /* nor any new collection whose first write is refused, whatever the
     * reason: the call leaves it empty, so it deletes it */
    ck_assert_int_eq(kvc_create(e, "n1", 2, KVC_SET, &c), 0);
    ck_assert_int_eq(kvc_set_add(e, c, mem, KVC_MEMBER_MAX + 1), TERN_E2BIG);
    ck_assert_ptr_null(find(e, "n1"));
    ck_assert_int_eq(kvc_create(e, "n2", 2, KVC_HASH, &c), 0);
    ck_assert_int_eq(kvc_hash_set(e, c, mem, KVC_MEMBER_MAX + 1, "v", 1), TERN_E2BIG);
    ck_assert_ptr_null(find(e, "n2"));
    ck_assert_int_eq(kvc_create(e, "n3", 2, KVC_HASH, &c), 0);
    ck_assert_int_eq(kvc_hash_set(e, c, "f", 1, big, sizeof(big)), TERN_E2BIG);
    ck_assert_ptr_null(find(e, "n3"));
    ck_assert_int_eq(kvc_create(e, "n4", 2, KVC_ZSET, &c), 0);
    ck_assert_int_eq(kvc_zset_put(e, c, "a", 1, NAN, NULL), TERN_EINVAL);
    ck_assert_ptr_null(find(e, "n4"));
    ck_assert_int_eq(kvc_create(e, "n5", 2, KVC_ZSET, &c), 0);
    ck_assert_int_eq(kvc_zset_put(e, c, mem, KVC_MEMBER_MAX + 1, 1, NULL), TERN_E2BIG);
    ck_assert_ptr_null(find(e, "n5"));
    ck_assert_uint_eq(kvc_count(e), 4);

    e = reopen(e);
    ck_assert_uint_eq(kvc_count(e), 4);
    c = kvc_find(e, key, KVC_KEY_MAX);
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_nonnull(kvc_member(c, mem, KVC_MEMBER_MAX));
    ck_assert_uint_eq(kvc_len(must(e, "h")), 2);
    ck_assert_double_eq(kvc_member(must(e, "z"), mem, KVC_MEMBER_MAX)->score, -INFINITY);
    kvc_close(e);
}
END_TEST

/* Members of `size`-byte records (unique by i) added to set "S". */
static int fill_rec(struct kvc *e, unsigned i, uint32_t size)
{
    uint8_t b[FILL_M];
    size_t len = size - pm_rec_size(9, 0);

    ck_assert_uint_le(len, FILL_M);
    ck_assert_uint_ge(len, 8);
    ck_assert_uint_eq(pm_rec_size(9 + (uint32_t)len, 0), size);
    memset(b, 'p', len);
    snprintf((char *)b, 8, "%07u", i);
    return kvc_set_add(e, find_or_make(e, "S", KVC_SET), b, len);
}

static uint32_t segs_used(struct kvc *e)
{
    struct kvs_stats st;

    kvs_get_stats(kvc_store(e), &st);
    return st.pool.segs_used;
}

/* A new collection whose head takes the very last bytes a value may have
 * in a full pool: its first element does not fit, and the collection is
 * gone again, from DRAM and the pool (its head deleted), across reopens. */
START_TEST(full_pool_head_fits_element_not)
{
    const uint32_t rec = pm_rec_size(9 + FILL_M, 0);        /* a member of FILL_M bytes */
    const uint32_t head = pm_rec_size(1 + 5, 24);           /* "Kfresh" */
    struct kvc *e = open_sized(1u << 20);
    struct kvc_coll *c;
    struct kvs_stats st0, st1;
    uint32_t last_seg, room;
    uint64_t count;
    unsigned i;
    int rc = 0;
    char *before, *after;

    /* how many segments writes get: fill a pool once to find out */
    for (i = 0; i < 100000 && (rc = fill_rec(e, i, rec)) == 1; i++)
        ;
    ck_assert_int_eq(rc, TERN_ENOSPC);
    last_seg = segs_used(e);
    kvc_close(e);
    unlink(path);

    /* again, up to the write that opens the last of them */
    e = open_sized(1u << 20);
    for (i = 0; segs_used(e) < last_seg; i++)
        ck_assert_int_eq(fill_rec(e, i, rec), 1);
    room = SEG - PM_SEG_HDR - rec;
    /* then exactly to `head` bytes short of the end */
    while (room > head) {
        uint32_t left = room - head;
        uint32_t size = left <= rec ? left : left >= 2 * rec ? rec : (left / 2) & ~7u;

        ck_assert_int_eq(fill_rec(e, i++, size), 1);
        room -= size;
    }
    ck_assert_uint_eq(room, head);
    ck_assert_uint_eq(segs_used(e), last_seg);
    count = kvc_count(e);
    ck_assert_int_eq(kvc_sync(e), 0);
    before = dump(e);

    ck_assert_int_eq(kvc_create(e, "fresh", 5, KVC_SET, &c), 0);
    kvs_get_stats(kvc_store(e), &st0);
    ck_assert_int_eq(kvc_set_add(e, c, "member", 6), TERN_ENOSPC);
    kvs_get_stats(kvc_store(e), &st1);
    ck_assert_uint_eq(st1.puts, st0.puts + 1);         /* the head went in, the member not */
    ck_assert_ptr_null(find(e, "fresh"));
    ck_assert_uint_eq(kvc_count(e), count);
    {
        uint8_t k[16];

        /* nor is the head left: the pool keeps room for deletes */
        ck_assert(!raw_has(kvc_store(e), k, head_k(k, "fresh")));
    }
    after = dump(e);
    same_dump(before, after);
    free(after);
    ck_assert_int_eq(kvc_sync(e), 0);
    kvc_close(e);

    e = open_sized(1u << 20);
    ck_assert_ptr_null(find(e, "fresh"));
    ck_assert_uint_eq(kvc_count(e), count);
    after = dump(e);
    same_dump(before, after);
    free(after);
    e = reopen(e);
    after = dump(e);
    same_dump(before, after);
    free(after);
    free(before);
    kvc_close(e);
}
END_TEST

Suite *suite_kv_coll(void)
{
    Suite *s = suite_create("kv_coll");
    TCase *tc = tcase_create("coll");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, everything_reads_back);
    tcase_add_test(tc, random_against_a_model);
    tcase_add_test(tc, orphan_elements_deleted);
    tcase_add_test(tc, empty_heads_deleted);
    tcase_add_test(tc, interrupted_rename);
    tcase_add_test(tc, list_gaps_renumbered);
    tcase_add_test(tc, malformed_records_refused);
    tcase_add_test(tc, deadlines);
    tcase_add_test(tc, big_delete_deferred);
    tcase_add_test(tc, full_pool);
    tcase_add_test(tc, scan_while_changing);
    tcase_add_test(tc, random_is_live);
    tcase_add_test(tc, limits);
    tcase_add_test(tc, full_pool_head_fits_element_not);
    suite_add_tcase(s, tc);
    return s;
}
