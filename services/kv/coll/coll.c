/* Collections on a pool of their own; see coll.h for the record grammar. */
#include <endian.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv/kv_store.h"
#include "log.h"

#define HEAD_BYTES 24u          /* struct kvc_head as stored */
#define REAP_NOW 64u            /* collections this small are deleted at once */

struct kvc {
    struct kvs *s;
    struct kvm_set map;              /* key -> collection (member data) */
    struct kvc_coll **exp;           /* collections with a deadline */
    uint32_t n_exp, cap_exp, exp_next;
    struct kvc_coll *graves;         /* deleted, elements still to delete */
    uint8_t key[PM_KEY_MAX];         /* a record key being built */
    uint8_t *vbuf;                   /* a value copied out of the pool */
    size_t vcap;
};

#define grave_next(c) ((c)->next_grave)

uint64_t (*kvc_now_ms)(void);

static uint64_t now_ms(void)
{
    return kvc_now_ms ? kvc_now_ms() : kvs_now_ms();
}

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

static inline struct kvc_coll *coll_of(const struct kvm_member *m)
{
    return (struct kvc_coll *)m->data;
}

/* ---- record keys and values ---- */

static size_t head_key(struct kvc *e, const void *key, size_t klen)
{
    e->key[0] = 'K';
    memcpy(e->key + 1, key, klen);
    return klen + 1;
}

static size_t elem_key(struct kvc *e, uint64_t gen, const void *suffix, size_t slen)
{
    uint64_t be = htobe64(gen);

    e->key[0] = 'M';
    memcpy(e->key + 1, &be, 8);
    memcpy(e->key + 9, suffix, slen);
    return slen + 9;
}

/* Positions are signed (LPUSH goes below 0); stored biased, so that their
 * bytes sort as the numbers do. */
static size_t seq_key(struct kvc *e, uint64_t gen, int64_t seq)
{
    uint64_t be = htobe64((uint64_t)seq ^ (1ull << 63));

    return elem_key(e, gen, &be, 8);
}

static int64_t seq_of(const uint8_t *suffix)
{
    uint64_t be;

    memcpy(&be, suffix, 8);
    return (int64_t)(be64toh(be) ^ (1ull << 63));
}

static void head_value(const struct kvc_coll *c, uint8_t v[HEAD_BYTES])
{
    uint64_t gen = htole64(c->gen), dl = htole64(c->deadline);

    memset(v, 0, HEAD_BYTES);
    v[0] = (uint8_t)c->type;
    memcpy(v + 8, &gen, 8);
    memcpy(v + 16, &dl, 8);
}

static bool type_ok(unsigned t)
{
    return t == KVC_LIST || t == KVC_HASH || t == KVC_SET || t == KVC_ZSET;
}

static void put_score(uint8_t v[8], double score)
{
    uint64_t bits;

    memcpy(&bits, &score, 8);
    bits = htole64(bits);
    memcpy(v, &bits, 8);
}

static double get_score(const uint8_t *v)
{
    uint64_t bits;
    double d;

    memcpy(&bits, v, 8);
    bits = le64toh(bits);
    memcpy(&d, &bits, 8);
    return d;
}

/* ---- DRAM ---- */

static void exp_track(struct kvc *e, struct kvc_coll *c)
{
    if (c->deadline && !c->exp_slot) {
        if (e->n_exp == e->cap_exp) {
            uint32_t cap = e->cap_exp ? e->cap_exp * 2 : 64;
            struct kvc_coll **p = realloc(e->exp, cap * sizeof(*p));

            if (!p)
                return;         /* found by kvc_find (lazily) instead */
            e->exp = p;
            e->cap_exp = cap;
        }
        e->exp[e->n_exp++] = c;
        c->exp_slot = e->n_exp;
    } else if (!c->deadline && c->exp_slot) {
        struct kvc_coll *last = e->exp[--e->n_exp];

        e->exp[c->exp_slot - 1] = last;
        last->exp_slot = c->exp_slot;
        c->exp_slot = 0;
    }
}

static void coll_free_members(struct kvc_coll *c)
{
    if (c->type == KVC_ZSET)
        kvz_free(&c->order);
    kvm_free(&c->members);
}

static struct kvc_coll *coll_new(struct kvc *e, const void *key, size_t klen, enum kvc_type t)
{
    struct kvc_coll *c = calloc(1, sizeof(*c));
    struct kvm_member *m;

    if (!c)
        return NULL;
    c->type = t;
    kvm_init(&c->members);
    if (t == KVC_ZSET && kvz_init(&c->order) < 0) {
        free(c);
        return NULL;
    }
    if (kvm_add(&e->map, key, (uint32_t)klen, &m) != 1) {
        coll_free_members(c);
        free(c);
        return NULL;
    }
    m->data = c;
    c->entry = m;
    return c;
}

/* Take c out of the map (its elements may still be in the pool). */
static void coll_unmap(struct kvc *e, struct kvc_coll *c)
{
    uint64_t dl = c->deadline;

    c->deadline = 0;
    exp_track(e, c);
    c->deadline = dl;
    kvm_remove(&e->map, c->entry);
    c->entry = NULL;
}

/* ---- writes ---- */

static int write_head(struct kvc *e, struct kvc_coll *c)
{
    uint8_t v[HEAD_BYTES];
    uint32_t klen;
    const void *key = kvc_key(c, &klen);
    size_t n = head_key(e, key, klen);

    head_value(c, v);
    return kvs_put(e->s, e->key, n, v, HEAD_BYTES, 0, NULL);
}

/* A collection is written with its first element. */
static int ensure_head(struct kvc *e, struct kvc_coll *c)
{
    int rc;

    if (c->gen)
        return 0;
    c->gen = kvs_version(e->s) + 1;
    rc = write_head(e, c);
    if (rc < 0)
        c->gen = 0;
    return rc;
}

static int del_elem(struct kvc *e, size_t klen)
{
    int rc = kvs_del(e->s, e->key, klen, 0, NULL);

    return rc == TERN_ENOENT ? 0 : rc;
}

struct batch {
    struct kvm_member *m[256];
    unsigned n;
};

static void batch_add(void *arg, struct kvm_member *m)
{
    struct batch *b = arg;

    if (b->n < 256)
        b->m[b->n++] = m;
}

/* Delete up to max elements of a dead collection; true when none is left. */
static bool reap(struct kvc *e, struct kvc_coll *c, unsigned *max)
{
    if (c->type == KVC_LIST) {
        for (; c->head < c->tail && *max; c->head++, (*max)--)
            if (del_elem(e, seq_key(e, c->gen, c->head)) < 0)
                return false;
        return c->head >= c->tail;
    }
    while (c->members.n && *max) {
        struct batch b = {.n = 0};

        kvm_scan(&c->members, 0, *max < 256 ? *max : 256, batch_add, &b);
        for (unsigned i = 0; i < b.n && *max; i++, (*max)--) {
            if (del_elem(e, elem_key(e, c->gen, b.m[i]->bytes, b.m[i]->len)) < 0)
                return false;
            kvm_remove(&c->members, b.m[i]);
        }
    }
    return c->members.n == 0;
}

static void bury(struct kvc *e, struct kvc_coll *c)
{
    unsigned max = REAP_NOW;

    if (c->type == KVC_ZSET) {
        kvz_free(&c->order);
        c->type = KVC_SET;      /* the order is gone; reap as a set */
    }
    if (!c->gen || reap(e, c, &max)) {
        coll_free_members(c);
        free(c);
        return;
    }
    grave_next(c) = e->graves;
    e->graves = c;
}

/* Delete up to max elements of buried collections. */
static unsigned reap_graves(struct kvc *e, unsigned max)
{
    unsigned left = max;

    while (e->graves && left) {
        struct kvc_coll *c = e->graves;

        if (!reap(e, c, &left))
            break;              /* a full pool: try again later */
        e->graves = grave_next(c);
        coll_free_members(c);
        free(c);
    }
    return max - left;
}

int kvc_delete(struct kvc *e, struct kvc_coll *c)
{
    if (c->gen) {
        uint32_t klen;
        const void *key = kvc_key(c, &klen);
        int rc = kvs_del(e->s, e->key, head_key(e, key, klen), 0, NULL);

        if (rc < 0 && rc != TERN_ENOENT)
            return rc;
    }
    coll_unmap(e, c);
    bury(e, c);
    return 0;
}

/* After a call that may have emptied c: delete it if so (1). */
static int settle(struct kvc *e, struct kvc_coll *c)
{
    if (kvc_len(c))
        return 0;
    if (kvc_delete(e, c) < 0) {
        /* Its head stays: an empty collection until the next open, which
         * deletes it. Hide it meanwhile. */
        coll_unmap(e, c);
        bury(e, c);
    }
    return 1;
}

/* ---- open ---- */

struct gen_ref {
    uint64_t gen, version;
    uint64_t count;                  /* a list's elements */
    struct kvc_coll *c;
};

struct keylist {
    uint8_t **k;
    uint16_t *len;
    size_t n, cap;
};

static int keylist_add(struct keylist *l, const void *key, size_t klen)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        uint8_t **k = realloc(l->k, cap * sizeof(*k));
        uint16_t *len;

        if (!k)
            return TERN_ENOMEM;
        l->k = k;
        len = realloc(l->len, cap * sizeof(*len));
        if (!len)
            return TERN_ENOMEM;
        l->len = len;
        l->cap = cap;
    }
    l->k[l->n] = malloc(klen ? klen : 1);
    if (!l->k[l->n])
        return TERN_ENOMEM;
    memcpy(l->k[l->n], key, klen);
    l->len[l->n++] = (uint16_t)klen;
    return 0;
}

static void keylist_free(struct keylist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->k[i]);
    free(l->k);
    free(l->len);
}

struct load {
    struct kvc *e;
    int rc;
    struct gen_ref *refs;
    size_t n_refs, cap_refs;
    struct keylist dead;             /* records to delete once loaded */
    bool gaps;                       /* some list has gaps */
};

static int load_head(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                     uint64_t version)
{
    struct load *l = arg;
    const uint8_t *k = key, *v = val;
    struct kvc_coll *c;
    uint64_t gen, dl;

    if (l->rc < 0)
        return 1;
    if (k[0] == 'M')
        return 0;
    if (k[0] != 'K' || klen < 2 || len != HEAD_BYTES || !type_ok(v[0])) {
        tern_log(TERN_LOG_ERROR, "kv", "collections: a malformed head record");
        l->rc = TERN_ECORRUPT;
        return 1;
    }
    memcpy(&gen, v + 8, 8);
    memcpy(&dl, v + 16, 8);
    gen = le64toh(gen);
    if (!gen) {
        l->rc = TERN_ECORRUPT;
        return 1;
    }
    if (l->n_refs == l->cap_refs) {
        size_t cap = l->cap_refs ? l->cap_refs * 2 : 256;
        struct gen_ref *r = realloc(l->refs, cap * sizeof(*r));

        if (!r) {
            l->rc = TERN_ENOMEM;
            return 1;
        }
        l->refs = r;
        l->cap_refs = cap;
    }
    c = coll_new(l->e, k + 1, klen - 1, (enum kvc_type)v[0]);
    if (!c) {
        /* kvm_add returns 0 for a key twice: impossible in one store */
        l->rc = kvm_find(&l->e->map, k + 1, (uint32_t)klen - 1) ? TERN_ECORRUPT : TERN_ENOMEM;
        return 1;
    }
    c->gen = gen;
    c->deadline = le64toh(dl);
    c->head = INT64_MAX;            /* lists: min and max positions seen */
    c->tail = INT64_MIN;
    l->refs[l->n_refs++] = (struct gen_ref){.gen = gen, .version = version, .c = c};
    return 0;
}

static int ref_cmp(const void *a, const void *b)
{
    const struct gen_ref *x = a, *y = b;

    return x->gen < y->gen ? -1 : x->gen > y->gen;
}

static struct gen_ref *ref_find(struct load *l, uint64_t gen)
{
    struct gen_ref key = {.gen = gen};

    if (!l->n_refs)
        return NULL;            /* refs is NULL: bsearch may not take it */
    return bsearch(&key, l->refs, l->n_refs, sizeof(key), ref_cmp);
}

static int load_elem(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                     uint64_t version)
{
    struct load *l = arg;
    const uint8_t *k = key;
    struct gen_ref *r;
    struct kvc_coll *c;
    struct kvm_member *m;
    uint64_t gen;
    int rc;

    (void)version;
    if (l->rc < 0)
        return 1;
    if (k[0] != 'M')
        return 0;
    if (klen < 9) {
        l->rc = TERN_ECORRUPT;
        return 1;
    }
    memcpy(&gen, k + 1, 8);
    r = ref_find(l, be64toh(gen));
    if (!r) {
        l->rc = keylist_add(&l->dead, key, klen);     /* its collection is gone */
        return l->rc < 0;
    }
    c = r->c;
    k += 9;
    klen -= 9;
    switch (c->type) {
    case KVC_LIST: {
        int64_t seq;

        seq = seq_of(k);
        /* The engine never writes INT64_MAX: a list's end [head, tail)
         * could not hold it (see kvc_list_push). */
        if (klen != 8 || seq == INT64_MAX)
            goto corrupt;
        if (seq < c->head)
            c->head = seq;
        if (seq > c->tail)
            c->tail = seq;
        r->count++;
        return 0;
    }
    case KVC_SET:
        if (len != 0)
            goto corrupt;
        break;
    case KVC_ZSET:
        if (len != 8 || isnan(get_score(val)))
            goto corrupt;
        break;
    case KVC_HASH:
        break;
    }
    rc = kvm_add(&c->members, k, (uint32_t)klen, &m);
    if (rc == 0)
        goto corrupt;
    if (rc < 0) {
        l->rc = rc;
        return 1;
    }
    if (c->type == KVC_ZSET) {
        m->score = get_score(val);
        if (kvz_insert(&c->order, m) < 0) {
            l->rc = TERN_ENOMEM;
            return 1;
        }
    }
    return 0;
corrupt:
    tern_log(TERN_LOG_ERROR, "kv", "collections: a malformed element record");
    l->rc = TERN_ECORRUPT;
    return 1;
}

static int scan_all(struct kvs *s, tern_kv_scan_fn fn, struct load *l)
{
    uint64_t cur = 0;

    do {
        int rc = kvs_scan(s, cur, 1024, fn, l, &cur);

        if (rc < 0)
            return rc;
        if (l->rc < 0)
            return l->rc;
    } while (cur);
    return 0;
}

/* A list whose positions have gaps: renumber from its first one. */
struct seqs {
    uint64_t gen;
    int64_t *v;
    size_t n, cap;
    int rc;
};

static int collect_seq(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                       uint64_t version)
{
    struct seqs *s = arg;
    const uint8_t *k = key;
    uint64_t gen;

    (void)val, (void)len, (void)version;
    if (klen != 17 || k[0] != 'M')
        return 0;
    memcpy(&gen, k + 1, 8);
    if (be64toh(gen) != s->gen)
        return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        int64_t *v = realloc(s->v, cap * sizeof(*v));

        if (!v) {
            s->rc = TERN_ENOMEM;
            return 1;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = seq_of(k + 9);
    return 0;
}

static int seq_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x < y ? -1 : x > y;
}

static int close_gaps(struct kvc *e, struct kvc_coll *c)
{
    struct seqs s = {.gen = c->gen};
    uint64_t cur = 0;
    int rc = 0;

    do {
        rc = kvs_scan(e->s, cur, 1024, collect_seq, &s, &cur);
    } while (rc == 0 && s.rc == 0 && cur);
    if (rc == 0)
        rc = s.rc;
    qsort(s.v, s.n, sizeof(*s.v), seq_cmp);
    tern_log(TERN_LOG_WARN, "kv", "collections: a list with gaps (an interrupted remove): "
             "renumbering its %zu elements", s.n);
    for (size_t i = 0; rc == 0 && i < s.n; i++) {
        int64_t want = c->head + (int64_t)i;
        const void *v;
        uint32_t len;

        if (s.v[i] == want)
            continue;
        rc = kvs_get(e->s, e->key, seq_key(e, c->gen, s.v[i]), &v, &len, NULL);
        if (rc < 0)
            break;
        if (len > e->vcap) {
            uint8_t *p = realloc(e->vbuf, len);

            if (!p) {
                rc = TERN_ENOMEM;
                break;
            }
            e->vbuf = p;
            e->vcap = len;
        }
        if (len)                /* vbuf is NULL until a value needs it */
            memcpy(e->vbuf, v, len);
        rc = kvs_put(e->s, e->key, seq_key(e, c->gen, want), e->vbuf, len, 0, NULL);
        if (rc == 0)
            rc = del_elem(e, seq_key(e, c->gen, s.v[i]));
    }
    c->tail = c->head + (int64_t)s.n;
    free(s.v);
    return rc;
}

/* Two heads of one generation: an interrupted RENAME. The newer wins.
 * Before any element is loaded, so the loser has none. */
static int dedupe(struct kvc *e, struct load *l)
{
    size_t w = 0;

    for (size_t i = 0; i < l->n_refs; i++) {
        struct gen_ref *r = &l->refs[i];

        if (w && l->refs[w - 1].gen == r->gen) {
            struct gen_ref *keep = &l->refs[w - 1];
            struct gen_ref old = *r;
            uint32_t klen;
            const void *key;
            int rc;

            if (keep->version < r->version) {
                old = *keep;
                *keep = *r;
            }
            key = kvc_key(old.c, &klen);
            rc = kvs_del(e->s, e->key, head_key(e, key, klen), 0, NULL);
            if (rc < 0)
                return rc;
            coll_unmap(e, old.c);
            coll_free_members(old.c);
            free(old.c);
            continue;
        }
        l->refs[w++] = *r;
    }
    l->n_refs = w;
    return 0;
}

/* What an open found wanting: elements of no collection, empty
 * collections, lists with gaps. */
static int repair(struct kvc *e, struct load *l)
{
    int rc = 0;

    for (size_t i = 0; i < l->n_refs; i++) {
        struct kvc_coll *c = l->refs[i].c;

        if (!c || c->type != KVC_LIST)
            continue;
        uint64_t n = l->refs[i].count;

        /* Unsigned: positions from a pool may lie 2^63 or more apart. */
        if (n && (uint64_t)c->tail - (uint64_t)c->head + 1 != n) {
            rc = close_gaps(e, c);
            if (rc < 0)
                return rc;
        } else if (n) {
            c->tail++;
        } else {
            c->head = c->tail = 0;
        }
    }
    for (size_t i = 0; i < l->dead.n; i++) {
        memcpy(e->key, l->dead.k[i], l->dead.len[i]);
        rc = del_elem(e, l->dead.len[i]);
        if (rc < 0)
            return rc;
    }
    for (size_t i = 0; i < l->n_refs; i++) {
        struct kvc_coll *c = l->refs[i].c;

        if (c && !kvc_len(c)) {
            rc = kvc_delete(e, c);
            if (rc < 0)
                return rc;
        } else if (c) {
            exp_track(e, c);
        }
    }
    if (l->dead.n)
        tern_log(TERN_LOG_WARN, "kv", "collections: deleted %zu elements of deleted collections",
                 l->dead.n);
    return kvs_sync(e->s);
}

int kvc_open(const struct kvc_opts *o, struct kvc **out)
{
    struct kvs_opts so = {.path = o->path,
                          .pool_size = o->pool_size ? o->pool_size : 64ull << 20,
                          .seg_size = o->seg_size};
    struct load l = {.rc = 0};
    struct kvc *e = calloc(1, sizeof(*e));
    int rc;

    if (!e)
        return TERN_ENOMEM;
    kvm_init(&e->map);
    rnd_state ^= (uint64_t)time(NULL) << 1;    /* RANDOMKEY differs run to run */
    rc = kvs_open(&so, &e->s);
    if (rc < 0) {
        free(e);
        return rc;
    }
    l.e = e;
    rc = scan_all(e->s, load_head, &l);
    if (rc == 0) {
        if (l.n_refs)           /* refs is NULL while no head was found */
            qsort(l.refs, l.n_refs, sizeof(*l.refs), ref_cmp);
        rc = dedupe(e, &l);
    }
    if (rc == 0) {
        rc = scan_all(e->s, load_elem, &l);
    }
    if (rc == 0)
        rc = repair(e, &l);
    free(l.refs);
    keylist_free(&l.dead);
    if (rc < 0) {
        kvc_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

static void free_coll_entry(void *arg, struct kvm_member *m)
{
    struct kvc_coll *c = coll_of(m);

    (void)arg;
    coll_free_members(c);
    free(c);
}

static void free_all(struct kvc *e)
{
    kvm_each(&e->map, free_coll_entry, NULL);
    kvm_free(&e->map);
    while (e->graves) {
        struct kvc_coll *c = e->graves;

        e->graves = grave_next(c);
        kvm_free(&c->members);
        free(c);
    }
    free(e->exp);
    e->exp = NULL;
    e->n_exp = e->cap_exp = 0;
}

void kvc_close(struct kvc *e)
{
    if (!e)
        return;
    if (e->s)
        kvs_close(e->s);
    free_all(e);
    free(e->vbuf);
    free(e);
}

struct kvs *kvc_store(const struct kvc *e)
{
    return e->s;
}

int kvc_sync(struct kvc *e)
{
    return kvs_sync(e->s);
}

bool kvc_dirty(const struct kvc *e)
{
    return kvs_dirty(e->s);
}

/* ---- any collection ---- */

static bool due(const struct kvc_coll *c, uint64_t now)
{
    return c->deadline && c->deadline <= now;
}

struct kvc_coll *kvc_find(struct kvc *e, const void *key, size_t klen)
{
    struct kvm_member *m;
    struct kvc_coll *c;

    if (klen > KVC_KEY_MAX || !(m = kvm_find(&e->map, key, (uint32_t)klen)))
        return NULL;
    c = coll_of(m);
    if (due(c, now_ms())) {
        if (kvc_delete(e, c) < 0) {
            coll_unmap(e, c);
            bury(e, c);
        }
        return NULL;
    }
    return c;
}

uint64_t kvc_len(const struct kvc_coll *c)
{
    return c->type == KVC_LIST ? (uint64_t)(c->tail - c->head) : c->members.n;
}

int kvc_create(struct kvc *e, const void *key, size_t klen, enum kvc_type type,
               struct kvc_coll **out)
{
    struct kvc_coll *c;

    if (!klen)
        return TERN_EINVAL;
    if (klen > KVC_KEY_MAX)
        return TERN_E2BIG;
    if (!type_ok(type) || kvm_find(&e->map, key, (uint32_t)klen))
        return TERN_EINVAL;
    c = coll_new(e, key, klen, type);
    if (!c)
        return TERN_ENOMEM;
    *out = c;
    return 0;
}

int kvc_rename(struct kvc *e, struct kvc_coll *c, const void *key, size_t klen)
{
    struct kvm_member *m, *old = c->entry;
    uint32_t olen;
    const void *okey;
    int rc;

    if (!klen)
        return TERN_EINVAL;
    if (klen > KVC_KEY_MAX)
        return TERN_E2BIG;
    rc = kvm_add(&e->map, key, (uint32_t)klen, &m);
    if (rc != 1)
        return rc < 0 ? rc : TERN_EEXIST;
    m->data = c;
    c->entry = m;
    if (c->gen) {
        rc = write_head(e, c);
        if (rc == 0) {
            okey = old->bytes;
            olen = old->len;
            rc = kvs_del(e->s, e->key, head_key(e, okey, olen), 0, NULL);
            if (rc < 0) {
                /* Both heads stand; the newer (this one) wins at open. */
                tern_log(TERN_LOG_WARN, "kv", "collections: rename left the old head: %s",
                         tern_strerror(rc));
                rc = 0;
            }
        }
        if (rc < 0) {
            c->entry = old;
            kvm_remove(&e->map, m);
            return rc;
        }
    }
    kvm_remove(&e->map, old);
    return 0;
}

int kvc_set_expiry(struct kvc *e, struct kvc_coll *c, uint64_t at_ms)
{
    uint64_t was = c->deadline;
    int rc;

    if (at_ms && at_ms <= now_ms()) {
        rc = kvc_delete(e, c);
        return rc < 0 ? rc : 1;
    }
    c->deadline = at_ms;
    if (c->gen && (rc = write_head(e, c)) < 0) {
        c->deadline = was;
        return rc;
    }
    exp_track(e, c);
    return 0;
}

unsigned kvc_expire(struct kvc *e, uint64_t now, unsigned max)
{
    unsigned done = 0, looked = 0;

    while (done < max && e->n_exp && looked < 20 * max) {
        struct kvc_coll *c;

        if (e->exp_next >= e->n_exp)
            e->exp_next = 0;
        c = e->exp[e->exp_next];
        looked++;
        if (!due(c, now)) {
            e->exp_next++;
            continue;
        }
        if (kvc_delete(e, c) < 0)
            break;
        done++;
    }
    reap_graves(e, max * 4);
    return done;
}

uint64_t kvc_count(const struct kvc *e)
{
    return e->map.n;
}

uint64_t kvc_expiring(const struct kvc *e)
{
    return e->n_exp;
}

struct scan_adapter {
    kvc_visit_fn fn;
    void *arg;
    uint64_t now;
};

static void scan_one(void *arg, struct kvm_member *m)
{
    struct scan_adapter *a = arg;

    if (!due(coll_of(m), a->now))
        a->fn(a->arg, coll_of(m));
}

uint64_t kvc_scan(struct kvc *e, uint64_t cursor, unsigned count, kvc_visit_fn fn, void *arg)
{
    struct scan_adapter a = {.fn = fn, .arg = arg, .now = now_ms()};

    return kvm_scan(&e->map, cursor, count, scan_one, &a);
}

struct kvc_coll *kvc_random(struct kvc *e)
{
    uint64_t now = now_ms();

    for (int i = 0; i < 16 && e->map.n; i++) {
        struct kvm_member *m = kvm_random(&e->map, rnd);

        if (m && !due(coll_of(m), now))
            return coll_of(m);
    }
    return NULL;
}

int kvc_clear(struct kvc *e)
{
    int rc = kvs_clear(e->s, 0);

    if (rc < 0)
        return rc;
    free_all(e);
    kvm_init(&e->map);
    return 0;
}

/* ---- lists ---- */

int kvc_list_push(struct kvc *e, struct kvc_coll *c, bool left, const void *v, size_t len)
{
    int64_t seq;
    int rc;

    /* Positions end at the int64 range's ends (reached only from a pool
     * written so); a list there grows at its other end only. */
    if (left ? c->head == INT64_MIN : c->tail == INT64_MAX)
        return TERN_ERANGE;
    rc = ensure_head(e, c);
    if (rc < 0) {
        settle(e, c);
        return rc;
    }
    seq = left ? c->head - 1 : c->tail;
    rc = kvs_put(e->s, e->key, seq_key(e, c->gen, seq), v, len, 0, NULL);
    if (rc < 0) {
        settle(e, c);
        return rc;
    }
    if (left)
        c->head = seq;
    else
        c->tail = seq + 1;
    return 0;
}

int kvc_list_at(struct kvc *e, struct kvc_coll *c, uint64_t i, const void **v, uint32_t *len)
{
    if (i >= kvc_len(c))
        return TERN_ERANGE;
    return kvs_get(e->s, e->key, seq_key(e, c->gen, c->head + (int64_t)i), v, len, NULL);
}

int kvc_list_set(struct kvc *e, struct kvc_coll *c, uint64_t i, const void *v, size_t len)
{
    if (i >= kvc_len(c))
        return TERN_ERANGE;
    return kvs_put(e->s, e->key, seq_key(e, c->gen, c->head + (int64_t)i), v, len, 0, NULL);
}

int kvc_list_drop(struct kvc *e, struct kvc_coll *c, bool left, uint64_t n)
{
    for (; n && kvc_len(c); n--) {
        int64_t seq = left ? c->head : c->tail - 1;
        int rc = del_elem(e, seq_key(e, c->gen, seq));

        if (rc < 0)
            return rc;
        if (left)
            c->head++;
        else
            c->tail--;
    }
    return settle(e, c);
}

int kvc_list_remove_at(struct kvc *e, struct kvc_coll *c, uint64_t i)
{
    uint64_t n = kvc_len(c);

    if (i >= n)
        return TERN_ERANGE;
    for (uint64_t j = i; j + 1 < n; j++) {
        const void *v;
        uint32_t len;
        int rc = kvc_list_at(e, c, j + 1, &v, &len);

        if (rc < 0)
            return rc;
        if (len > e->vcap) {
            uint8_t *p = realloc(e->vbuf, len);

            if (!p)
                return TERN_ENOMEM;
            e->vbuf = p;
            e->vcap = len;
        }
        if (len)                /* vbuf is NULL until a value needs it */
            memcpy(e->vbuf, v, len);
        rc = kvc_list_set(e, c, j, e->vbuf, len);
        if (rc < 0)
            return rc;
    }
    return kvc_list_drop(e, c, false, 1);
}

/* ---- members ---- */

struct kvm_member *kvc_member(const struct kvc_coll *c, const void *m, size_t mlen)
{
    if (c->type == KVC_LIST || mlen > KVC_MEMBER_MAX)
        return NULL;
    return kvm_find(&c->members, m, (uint32_t)mlen);
}

int kvc_hash_value(struct kvc *e, struct kvc_coll *c, const struct kvm_member *m,
                   const void **v, uint32_t *len)
{
    return kvs_get(e->s, e->key, elem_key(e, c->gen, m->bytes, m->len), v, len, NULL);
}

/* Write member bytes m with value v; add it to c first if new. */
static int put_member(struct kvc *e, struct kvc_coll *c, const void *mb, size_t mlen,
                      const void *v, size_t vlen, double score, struct kvm_member **out)
{
    struct kvm_member *m;
    int added, rc;

    if (mlen > KVC_MEMBER_MAX) {
        settle(e, c);           /* a new collection is left empty: deleted */
        return TERN_E2BIG;
    }
    rc = ensure_head(e, c);
    if (rc < 0) {
        settle(e, c);
        return rc;
    }
    added = kvm_add(&c->members, mb, (uint32_t)mlen, &m);
    if (added < 0) {
        settle(e, c);
        return added;
    }
    if (c->type == KVC_ZSET) {
        double was = m->score;

        if (!added && was == score) {
            if (out)
                *out = m;
            return 0;
        }
        /* kvz_update finds the member by its old score, then sets it. */
        if (added)
            m->score = score;
        rc = added ? kvz_insert(&c->order, m) : kvz_update(&c->order, m, score);
        if (rc < 0) {
            if (added)
                kvm_remove(&c->members, m);
            settle(e, c);
            return rc;
        }
        rc = kvs_put(e->s, e->key, elem_key(e, c->gen, mb, mlen), v, vlen, 0, NULL);
        if (rc < 0) {
            if (added) {
                kvz_delete(&c->order, m);
                kvm_remove(&c->members, m);
            } else if (kvz_update(&c->order, m, was) < 0) {
                tern_log(TERN_LOG_ERROR, "kv", "collections: a sorted set's order lost a member");
            }
            settle(e, c);
            return rc;
        }
    } else if (c->type == KVC_SET && !added) {
        return 0;
    } else {
        rc = kvs_put(e->s, e->key, elem_key(e, c->gen, mb, mlen), v, vlen, 0, NULL);
        if (rc < 0) {
            if (added)
                kvm_remove(&c->members, m);
            settle(e, c);
            return rc;
        }
    }
    if (out)
        *out = m;
    return added;
}

int kvc_hash_set(struct kvc *e, struct kvc_coll *c, const void *f, size_t flen, const void *v,
                 size_t vlen)
{
    return put_member(e, c, f, flen, v, vlen, 0, NULL);
}

int kvc_set_add(struct kvc *e, struct kvc_coll *c, const void *m, size_t mlen)
{
    return put_member(e, c, m, mlen, "", 0, 0, NULL);
}

int kvc_zset_put(struct kvc *e, struct kvc_coll *c, const void *m, size_t mlen, double score,
                 struct kvm_member **out)
{
    uint8_t v[8];

    if (isnan(score)) {
        settle(e, c);           /* as put_member's refusals */
        return TERN_EINVAL;
    }
    put_score(v, score);
    return put_member(e, c, m, mlen, v, 8, score, out);
}

int kvc_member_del(struct kvc *e, struct kvc_coll *c, struct kvm_member *m)
{
    int rc = del_elem(e, elem_key(e, c->gen, m->bytes, m->len));

    if (rc < 0)
        return rc;
    if (c->type == KVC_ZSET)
        kvz_delete(&c->order, m);
    kvm_remove(&c->members, m);
    return settle(e, c);
}
