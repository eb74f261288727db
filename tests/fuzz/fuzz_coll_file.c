/* The collection pool's records as kvc_open reads them back
 * (services/kv/coll/coll.c): heads, elements, orphans, gaps, two heads of
 * one generation, lying types, lengths and scores. kvc_open may only
 * refuse (a negative tern code); an engine that opens must hold what its
 * records say (every collection found by key, list elements at every
 * index, members by bytes, a sorted set's order sorted by score and
 * member), its repairs must be done once (a second open writes nothing and
 * finds the same), and it must take writes that a third open loads.
 *
 * The input is a list of ops, each written as a record with kvs_put or
 * kvs_del on a fresh 4 MiB pool (64 KiB segments) in /dev/shm; the pool is
 * then closed and opened with kvc_open. An op is one byte, its low 3 bits
 * the kind and its high 5 bits `m`, then the kind's fields:
 *
 *   0 head     KEY, type byte (m & 1: "lhsz"[t & 3], else any byte), GEN,
 *              deadline byte (0 none, 1..0x7f past, 0x80..0xfe future,
 *              0xff: u64); the record 'K' KEY -> type, 7 zeros, gen LE,
 *              deadline LE (24 bytes), or when (m & 6) == 6 a VALUE
 *   1 list     GEN, SEQ, VALUE: 'M' gen BE, seq (8 bytes, biased BE)
 *   2 member   GEN, KEY (the suffix), SCORE: 'M' gen BE suffix
 *   3 run      GEN, count byte (1 + c % 64), SEQ, step byte, value length
 *              byte: count list elements from SEQ, step apart (0 = 1)
 *   4 members  GEN, count byte (1 + c % 64), SCORE: count members "m<i>"
 *              with scores around SCORE's (ties on purpose)
 *   5 delete   history byte: a tombstone for a key written before
 *   6 raw      length byte, key bytes, VALUE (any key: 'X', short 'M'...)
 *   7 rewrite  history byte, VALUE: a key written before, another value
 *
 *   KEY    length byte (& 0x3f), bytes
 *   VALUE  length byte (0xff: a u16 follows, at most 16 KiB), bytes (zeros
 *          past the input's end)
 *   GEN    < 0x80: a head's generation (head i % heads; none yet: fresh);
 *          0x80..0xbf fresh (the store's version + 1, as the engine makes
 *          them); 0xc0..0xfc: that - 0xc0 (0 included); 0xfd: UINT64_MAX;
 *          0xfe: a u64; 0xff: fresh
 *   SEQ    < 0xf0: that - 0x78; 0xf0 INT64_MIN, 0xf1 INT64_MAX, 0xf2
 *          INT64_MIN + 1, 0xf3 INT64_MAX - 1, 0xf4 a u64 (as stored);
 *          0xf5..0xff: the last SEQ + 1 + (that - 0xf5) (runs and gaps)
 *   SCORE  0 NaN, 1 another NaN, 2 +inf, 3 -inf, 4 -0.0, 5 a u64's bits,
 *          6 no value, 7 a VALUE, 8 DBL_MAX, 9 the least denormal, else
 *          (that - 136) / 4 as an 8-byte LE double
 */
#include <float.h>
#include <math.h>
#include <unistd.h>

#include "error.h"
#include "fuzz.h"
#include "kv/coll/coll.h"
#include "kv/kv_store.h"
#include "log.h"

#define POOL_SIZE (4u << 20)
#define SEG_SIZE (64u * 1024)
#define MAX_RECORDS 2048u
#define MAX_VALUE (16u * 1024)
#define HIST 128u
#define HEADS 64u
#define FAR_FUTURE (1ull << 50)
#define NOW_USE (1ull << 41)         /* the clock of the writes after the checks */

static const char *path;
static uint64_t clock_ms;

static uint64_t fixed_clock(void)
{
    return clock_ms;
}

/* ---- writing the records ---- */

struct writer {
    struct fz f;
    struct kvs *s;
    unsigned records;
    uint64_t gens[HEADS];
    unsigned n_gens;
    int64_t last_seq;
    uint8_t key[PM_KEY_MAX];
    uint8_t val[MAX_VALUE + 64];
    uint8_t hist[HIST][PM_KEY_MAX];
    uint16_t hist_len[HIST];
    unsigned n_hist;
};

static struct writer w;

static void remember(const uint8_t *k, size_t klen)
{
    unsigned i = w.n_hist++ % HIST;

    memcpy(w.hist[i], k, klen);
    w.hist_len[i] = (uint16_t)klen;
}

static void put(size_t klen, const void *v, size_t vlen)
{
    if (w.records++ >= MAX_RECORDS)
        return;
    /* A full pool or an over-long value is the input's business. */
    if (kvs_put(w.s, w.key, klen, v, vlen, 0, NULL) == 0)
        remember(w.key, klen);
}

static uint64_t fresh_gen(void)
{
    return kvs_version(w.s) + 1;
}

static uint64_t read_gen(void)
{
    uint8_t g = fz_u8(&w.f);

    if (g < 0x80)
        return w.n_gens ? w.gens[g % w.n_gens] : fresh_gen();
    if (g < 0xc0 || g == 0xff)
        return fresh_gen();
    if (g < 0xfd)
        return g - 0xc0u;
    if (g == 0xfd)
        return UINT64_MAX;
    return fz_u64(&w.f);
}

static int64_t read_seq(void)
{
    uint8_t b = fz_u8(&w.f);
    int64_t s;

    switch (b) {
    case 0xf0: s = INT64_MIN; break;
    case 0xf1: s = INT64_MAX; break;
    case 0xf2: s = INT64_MIN + 1; break;
    case 0xf3: s = INT64_MAX - 1; break;
    case 0xf4: s = (int64_t)(fz_u64(&w.f) ^ (1ull << 63)); break;
    default:
        if (b < 0xf0)
            s = (int64_t)b - 0x78;
        else
            s = (int64_t)((uint64_t)w.last_seq + 1 + (b - 0xf5u));
    }
    w.last_seq = s;
    return s;
}

/* KEY into buf at off; its length. */
static size_t read_key(uint8_t *buf, size_t off)
{
    size_t n = fz_u8(&w.f) & 0x3f;
    const uint8_t *b;

    n = fz_take(&w.f, n, &b);
    memcpy(buf + off, b, n);
    return n;
}

/* VALUE into w.val; its length. */
static size_t read_value(void)
{
    size_t n = fz_u8(&w.f), got;
    const uint8_t *b;

    if (n == 0xff)
        n = fz_u16(&w.f) % (MAX_VALUE + 1);
    got = fz_take(&w.f, n, &b);
    memcpy(w.val, b, got);
    memset(w.val + got, 0, n - got);
    return n;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * (7 - i)));
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_double(uint8_t *p, double d)
{
    uint64_t bits;

    memcpy(&bits, &d, 8);
    put_le64(p, bits);
}

/* SCORE (plus `add`) into w.val; its length. */
static size_t read_score(double add)
{
    uint8_t b = fz_u8(&w.f);
    double d;

    switch (b) {
    case 0: d = NAN; break;
    case 1: put_le64(w.val, 0x7ff0000000000001ull); return 8;   /* a signalling NaN */
    case 2: d = INFINITY; break;
    case 3: d = -INFINITY; break;
    case 4: d = -0.0; break;
    case 5: put_le64(w.val, fz_u64(&w.f)); return 8;
    case 6: return 0;
    case 7: return read_value();
    case 8: d = DBL_MAX; break;
    case 9: d = 4.9406564584124654e-324; break;
    default: d = ((int)b - 136) / 4.0; break;
    }
    put_double(w.val, d + add);
    return 8;
}

/* 'M' gen: the element key's first 9 bytes. */
static void elem_prefix(uint64_t gen)
{
    w.key[0] = 'M';
    put_be64(w.key + 1, gen);
}

static void put_list_elem(uint64_t gen, int64_t seq, const void *v, size_t len)
{
    elem_prefix(gen);
    put_be64(w.key + 9, (uint64_t)seq ^ (1ull << 63));
    put(17, v, len);
}

static void op_head(unsigned m)
{
    size_t klen = 1 + read_key(w.key, 1);
    uint8_t t = fz_u8(&w.f), d;
    uint64_t gen, dl;

    w.key[0] = 'K';
    if (m & 1)
        t = (uint8_t)"lhsz"[t & 3];
    gen = read_gen();
    d = fz_u8(&w.f);
    dl = d == 0 ? 0 : d < 0x80 ? d * 1000ull : d < 0xff ? FAR_FUTURE + d : fz_u64(&w.f);
    if ((m & 6) == 6) {
        size_t n = read_value();

        if (n >= 16)
            gen = get_le64(w.val + 8);
        put(klen, w.val, n);
    } else {
        memset(w.val, 0, 24);
        w.val[0] = t;
        put_le64(w.val + 8, gen);
        put_le64(w.val + 16, dl);
        put(klen, w.val, 24);
    }
    w.gens[w.n_gens++ % HEADS] = gen;
    if (w.n_gens > HEADS)
        w.n_gens = HEADS;
}

static void op_list(void)
{
    uint64_t gen = read_gen();
    int64_t seq = read_seq();
    size_t n = read_value();

    put_list_elem(gen, seq, w.val, n);
}

static void op_member(void)
{
    uint64_t gen = read_gen();
    size_t slen = read_key(w.key, 9), n;

    elem_prefix(gen);
    n = read_score(0);
    put(9 + slen, w.val, n);
}

static void op_run(void)
{
    uint64_t gen = read_gen();
    unsigned count = 1 + fz_u8(&w.f) % 64;
    int64_t seq = read_seq();
    unsigned step = fz_u8(&w.f), vlen = fz_u8(&w.f);

    if (!step)
        step = 1;
    for (unsigned i = 0; i < count && w.records < MAX_RECORDS; i++) {
        memset(w.val, 'a' + i % 26, vlen);
        put_list_elem(gen, seq, w.val, vlen);
        w.last_seq = seq;
        seq = (int64_t)((uint64_t)seq + step);
    }
}

static void op_members(void)
{
    uint64_t gen = read_gen();
    unsigned count = 1 + fz_u8(&w.f) % 64;
    struct fz at = w.f;

    for (unsigned i = 0; i < count && w.records < MAX_RECORDS; i++) {
        size_t n;
        int klen;

        w.f = at;       /* the same SCORE each time, shifted */
        n = read_score((double)(i % 3));
        elem_prefix(gen);
        klen = snprintf((char *)w.key + 9, 16, "m%u", i);
        put(9 + (size_t)klen, w.val, n);
    }
}

static void op_delete(void)
{
    uint8_t h = fz_u8(&w.f);
    unsigned i;

    if (!w.n_hist)
        return;
    i = h % (w.n_hist < HIST ? w.n_hist : HIST);
    if (w.records++ < MAX_RECORDS)
        kvs_del(w.s, w.hist[i], w.hist_len[i], 0, NULL);
}

static void op_raw(void)
{
    size_t klen = fz_u8(&w.f);
    const uint8_t *b;
    size_t n;

    klen = fz_take(&w.f, klen, &b);
    memcpy(w.key, b, klen);
    n = read_value();
    put(klen, w.val, n);
}

static void op_rewrite(void)
{
    uint8_t h = fz_u8(&w.f);
    size_t n = read_value();
    unsigned i;

    if (!w.n_hist)
        return;
    i = h % (w.n_hist < HIST ? w.n_hist : HIST);
    memcpy(w.key, w.hist[i], w.hist_len[i]);
    put(w.hist_len[i], w.val, n);
}

static void write_pool(const uint8_t *data, size_t size)
{
    struct kvs_opts o = {.path = path, .pool_size = POOL_SIZE, .seg_size = SEG_SIZE};
    int rc;

    unlink(path);
    rc = kvs_open(&o, &w.s);
    FZ_CHECK(rc == 0, "a fresh pool: %d", rc);
    w.f = (struct fz){data, size};
    w.records = w.n_gens = w.n_hist = 0;
    w.last_seq = 0;
    while (w.f.n && w.records < MAX_RECORDS) {
        uint8_t op = fz_u8(&w.f);

        switch (op & 7) {
        case 0: op_head(op >> 3); break;
        case 1: op_list(); break;
        case 2: op_member(); break;
        case 3: op_run(); break;
        case 4: op_members(); break;
        case 5: op_delete(); break;
        case 6: op_raw(); break;
        case 7: op_rewrite(); break;
        }
    }
    kvs_close(w.s);
    w.s = NULL;
}

/* ---- checking what opened ---- */

struct seen {
    struct kvc_coll **c;
    size_t n, cap;
};

static void collect(void *arg, struct kvc_coll *c)
{
    struct seen *s = arg;

    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->c = realloc(s->c, s->cap * sizeof(*s->c));
        FZ_CHECK(s->c, "no memory");
    }
    s->c[s->n++] = c;
}

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;

    return x < y ? -1 : x > y;
}

/* Every collection once (with the clock at 0 none is due). */
static void all_colls(struct kvc *e, struct seen *s)
{
    uint64_t cur = 0;
    size_t w2 = 0;
    int rounds = 0;

    s->n = 0;
    do {
        cur = kvc_scan(e, cur, 16, collect, s);
        FZ_CHECK(++rounds < 1000000, "kvc_scan never ends");
    } while (cur);
    if (s->n)
        qsort(s->c, s->n, sizeof(*s->c), ptr_cmp);
    for (size_t i = 0; i < s->n; i++)
        if (!w2 || s->c[w2 - 1] != s->c[i])
            s->c[w2++] = s->c[i];
    s->n = w2;
}

struct members {
    struct kvm_member **m;
    size_t n, cap;
};

static void collect_member(void *arg, struct kvm_member *m)
{
    struct members *s = arg;

    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->m = realloc(s->m, s->cap * sizeof(*s->m));
        FZ_CHECK(s->m, "no memory");
    }
    s->m[s->n++] = m;
}

static uint8_t sink;

static void touch(const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sink ^= ((const uint8_t *)p)[i];
}

/* The element record of member m of c, straight from the store. */
static int elem_get(struct kvc *e, const struct kvc_coll *c, const struct kvm_member *m,
                    const void **v, uint32_t *len)
{
    static uint8_t k[PM_KEY_MAX];

    k[0] = 'M';
    put_be64(k + 1, c->gen);
    memcpy(k + 9, m->bytes, m->len);
    return kvs_get(kvc_store(e), k, 9 + (size_t)m->len, v, len, NULL);
}

static bool member_before(const struct kvm_member *a, const struct kvm_member *b)
{
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c;

    if (a->score != b->score)
        return a->score < b->score;
    c = memcmp(a->bytes, b->bytes, n);
    return c < 0 || (c == 0 && a->len < b->len);
}

static uint64_t check_members(struct kvc *e, struct kvc_coll *c)
{
    struct members ms = {0};
    uint64_t n = kvc_len(c);

    kvm_each(&c->members, collect_member, &ms);
    FZ_CHECK(ms.n == n && n == c->members.n, "%zu members walked, kvc_len %llu", ms.n,
             (unsigned long long)n);
    for (size_t i = 0; i < ms.n; i++) {
        struct kvm_member *m = ms.m[i];
        const void *v;
        uint32_t len;
        int rc;

        FZ_CHECK(kvc_member(c, m->bytes, m->len) == m, "a member not found by its bytes");
        rc = elem_get(e, c, m, &v, &len);
        FZ_CHECK(rc == 0, "a member without its record: %d", rc);
        switch (c->type) {
        case KVC_HASH:
            rc = kvc_hash_value(e, c, m, &v, &len);
            FZ_CHECK(rc == 0, "a hash field without its value: %d", rc);
            touch(v, len);
            break;
        case KVC_SET:
            FZ_CHECK(len == 0, "a set member with a value of %u bytes", len);
            break;
        case KVC_ZSET: {
            uint64_t bits, want;

            FZ_CHECK(len == 8, "a score of %u bytes", len);
            memcpy(&want, &m->score, 8);
            bits = get_le64(v);
            FZ_CHECK(bits == want, "a member's score is not its record's");
            FZ_CHECK(!isnan(m->score), "a NaN score");
            break;
        }
        default:
            FZ_CHECK(0, "a list with members");
        }
    }
    if (c->type == KVC_ZSET) {
        const struct kvm_member *prev = NULL;

        FZ_CHECK(c->order.len == n, "the order holds %llu of %llu members",
                 (unsigned long long)c->order.len, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            struct kvm_member *m = kvz_at(&c->order, i);

            FZ_CHECK(m, "no member at rank %llu of %llu", (unsigned long long)i,
                     (unsigned long long)n);
            FZ_CHECK(kvc_member(c, m->bytes, m->len) == m, "the order holds a stranger");
            FZ_CHECK(kvz_rank(&c->order, m) == i, "rank %llu is not its member's rank",
                     (unsigned long long)i);
            FZ_CHECK(!prev || member_before(prev, m), "the order is not sorted at %llu",
                     (unsigned long long)i);
            FZ_CHECK(!prev || kvz_next(prev) == m, "next is not the next rank");
            prev = m;
        }
        FZ_CHECK(!kvz_at(&c->order, n), "a member past the end of the order");
        FZ_CHECK(kvz_last(&c->order) == prev, "the last member is not the last rank");
    }
    free(ms.m);
    return n;
}

struct summary {
    uint64_t colls, elems, expiring, version;
};

static struct summary check(struct kvc *e, bool fresh)
{
    static struct seen s;
    struct summary sum = {0};
    uint64_t saved = clock_ms;

    clock_ms = 0;           /* nothing is due: every collection is walked */
    all_colls(e, &s);
    FZ_CHECK(s.n == kvc_count(e), "kvc_scan found %zu collections of %llu", s.n,
             (unsigned long long)kvc_count(e));
    for (size_t i = 0; i < s.n; i++) {
        struct kvc_coll *c = s.c[i];
        uint32_t klen;
        const void *key = kvc_key(c, &klen);

        FZ_CHECK(c->type == KVC_LIST || c->type == KVC_HASH || c->type == KVC_SET ||
                 c->type == KVC_ZSET, "a collection of type %d", (int)c->type);
        FZ_CHECK(klen >= 1 && klen <= KVC_KEY_MAX + 1, "a key of %u bytes", klen);
        FZ_CHECK(kvc_find(e, key, klen) == c, "a collection not found by its key");
        FZ_CHECK(c->gen, "a collection without a generation");
        FZ_CHECK(kvc_len(c) > 0, "an empty collection");
        if (c->deadline)
            sum.expiring++;
        if (c->type == KVC_LIST) {
            uint64_t n = kvc_len(c);

            FZ_CHECK(c->head < c->tail, "a list's positions [%lld, %lld)", (long long)c->head,
                     (long long)c->tail);
            for (uint64_t j = 0; j < n; j++) {
                const void *v;
                uint32_t len;
                int rc = kvc_list_at(e, c, j, &v, &len);

                FZ_CHECK(rc == 0, "list element %llu of %llu: %d", (unsigned long long)j,
                         (unsigned long long)n, rc);
                touch(v, len);
            }
            FZ_CHECK(kvc_list_at(e, c, n, &(const void *){0}, &(uint32_t){0}) < 0,
                     "a list element past the end");
            sum.elems += n;
        } else {
            sum.elems += check_members(e, c);
        }
    }
    sum.colls = s.n;
    FZ_CHECK(sum.expiring == kvc_expiring(e), "%llu deadlines, %llu tracked",
             (unsigned long long)sum.expiring, (unsigned long long)kvc_expiring(e));
    /* Just opened: every record is a head or one of its elements (the
     * dead ones were deleted). */
    if (fresh)
        FZ_CHECK(kvs_count(kvc_store(e)) == sum.colls + sum.elems,
                 "the pool holds %llu keys for %llu collections and %llu elements",
                 (unsigned long long)kvs_count(kvc_store(e)), (unsigned long long)sum.colls,
                 (unsigned long long)sum.elems);
    sum.version = kvs_version(kvc_store(e));
    clock_ms = saved;
    return sum;
}

/* 0, a negative tern code, or (max 1) the 1 of a write that emptied,
 * added or deleted; false for an error. */
static bool check_rc(int rc, int max, const char *what)
{
    FZ_CHECK((rc >= 0 && rc <= max) || (rc < 0 && strcmp(tern_err_name(rc), "TERN_UNKNOWN") != 0),
             "%s returned %d", what, rc);
    return rc >= 0;
}

static bool use_ok;

static void wrote(int rc, const char *what)
{
    if (!check_rc(rc, 1, what))
        use_ok = false;
}

/* ---- writes on what opened ---- */

static uint8_t keys[32][KVC_KEY_MAX + 2];
static uint32_t key_lens[32];

static void save_key(void *arg, struct kvc_coll *c)
{
    unsigned *n = arg;
    uint32_t klen;
    const void *k = kvc_key(c, &klen);

    if (*n < 32 && klen <= KVC_KEY_MAX) {
        memcpy(keys[*n], k, klen);
        key_lens[(*n)++] = klen;
    }
}

static void use(struct kvc *e)
{
    unsigned n = 0;
    uint64_t cur = 0;

    use_ok = true;
    clock_ms = NOW_USE;
    kvc_expire(e, NOW_USE, 1000);
    do
        cur = kvc_scan(e, cur, 16, save_key, &n);
    while (cur && n < 32);
    for (unsigned i = 0; i < n; i++) {
        struct kvc_coll *c = kvc_find(e, keys[i], key_lens[i]);
        struct kvm_member *m;

        if (!c)
            continue;
        switch (c->type) {
        case KVC_LIST:
            wrote(kvc_list_push(e, c, true, "L", 1), "lpush");
            if ((c = kvc_find(e, keys[i], key_lens[i])))
                wrote(kvc_list_push(e, c, false, "R", 1), "rpush");
            if ((c = kvc_find(e, keys[i], key_lens[i])) && kvc_len(c) > 2)
                wrote(kvc_list_remove_at(e, c, kvc_len(c) / 2), "remove_at");
            if ((c = kvc_find(e, keys[i], key_lens[i])))
                wrote(kvc_list_drop(e, c, i & 1, 1), "drop");
            break;
        case KVC_HASH:
            wrote(kvc_hash_set(e, c, "f", 1, "v", 1), "hset");
            break;
        case KVC_SET:
            wrote(kvc_set_add(e, c, "s", 1), "sadd");
            break;
        case KVC_ZSET:
            wrote(kvc_zset_put(e, c, "z", 1, 1.5, NULL), "zadd");
            if ((c = kvc_find(e, keys[i], key_lens[i])))
                wrote(kvc_zset_put(e, c, "z", 1, -1.0, NULL), "zadd again");
            if ((c = kvc_find(e, keys[i], key_lens[i])) && (m = kvz_first(&c->order)))
                wrote(kvc_member_del(e, c, m), "zrem");
            break;
        }
        if (!(c = kvc_find(e, keys[i], key_lens[i])))
            continue;
        if (i % 3 == 0) {
            keys[i][key_lens[i]] = '~';
            if (!kvc_find(e, keys[i], key_lens[i] + 1))
                wrote(kvc_rename(e, c, keys[i], key_lens[i] + 1), "rename");
        } else if (i % 3 == 1) {
            wrote(kvc_set_expiry(e, c, NOW_USE + 1000 * i), "expire");
        } else if (kvc_len(c) < 8) {
            wrote(kvc_delete(e, c), "delete");
        }
    }
    wrote(kvc_sync(e), "sync");
    check(e, false);
}

/* ---- the run ---- */

static void remove_file(void)
{
    unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static char buf[64];

    (void)argc, (void)argv;
    tern_log_set_level((enum tern_log_level)(TERN_LOG_ERROR + 1));
    snprintf(buf, sizeof(buf), "/dev/shm/tern-fuzz-coll.%d", (int)getpid());
    path = buf;
    unlink(path);
    atexit(remove_file);
    kvc_now_ms = fixed_clock;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvc_opts o = {.path = path, .pool_size = POOL_SIZE, .seg_size = SEG_SIZE};
    struct summary first, again;
    struct kvs_stats st;
    uint64_t count;
    struct kvc *e;
    int rc;

    write_pool(data, size);
    clock_ms = 0;
    rc = kvc_open(&o, &e);
    check_rc(rc, 0, "kvc_open");
    if (rc < 0)
        return 0;
    first = check(e, true);
    kvc_close(e);

    /* Repairs are done once: the second open finds the same and writes
     * nothing. */
    rc = kvc_open(&o, &e);
    FZ_CHECK(rc == 0, "a second open failed: %d (%s)", rc, tern_err_name(rc));
    again = check(e, true);
    FZ_CHECK(again.colls == first.colls && again.elems == first.elems &&
             again.version == first.version,
             "the second open: %llu collections, %llu elements, version %llu; the first: "
             "%llu, %llu, %llu", (unsigned long long)again.colls,
             (unsigned long long)again.elems, (unsigned long long)again.version,
             (unsigned long long)first.colls, (unsigned long long)first.elems,
             (unsigned long long)first.version);

    /* What the engine writes on the state it took, it loads again. */
    use(e);
    count = kvc_count(e);
    kvs_get_stats(kvc_store(e), &st);
    kvc_close(e);
    clock_ms = 0;
    rc = kvc_open(&o, &e);
    /* Its repairs (elements of collections deleted above) need room. */
    if (!use_ok || st.pool.bytes_live > POOL_SIZE / 2) {
        check_rc(rc, 0, "kvc_open after writes");
        if (rc == 0)
            kvc_close(e);
        return 0;
    }
    FZ_CHECK(rc == 0, "an open after writes failed: %d (%s)", rc, tern_err_name(rc));
    FZ_CHECK(kvc_count(e) == count, "%llu collections written, %llu opened",
             (unsigned long long)count, (unsigned long long)kvc_count(e));
    check(e, true);
    kvc_close(e);
    return 0;
}
