/* Collections on a pool of their own: records, DRAM and every call but
 * opening (coll_open.c). coll.h has the record grammar. */
#include <endian.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv/coll/coll_internal.h"
#include "kv/kv_store.h"
#include "log.h"

#define REAP_NOW 64u            /* collections this small are deleted at once */

#define grave_next(c) ((c)->next_grave)

uint64_t (*kvc_now_ms)(void);

static uint64_t now_ms(void)
{
    return kvc_now_ms ? kvc_now_ms() : kvs_now_ms();
}

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;

void coll_seed(uint64_t seed)
{
    rnd_state ^= seed << 1;     /* odd stays odd: never 0 */
}

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

size_t coll_head_key(struct kvc *e, const void *key, size_t klen)
{
    e->key[0] = 'K';
    memcpy(e->key + 1, key, klen);
    return klen + 1;
}

size_t coll_elem_key(struct kvc *e, uint64_t gen, const void *suffix, size_t slen)
{
    uint64_t be = htobe64(gen);

    e->key[0] = 'M';
    memcpy(e->key + 1, &be, 8);
    memcpy(e->key + 9, suffix, slen);
    return slen + 9;
}

/* Positions are signed (LPUSH goes below 0); stored biased, so that their
 * bytes sort as the numbers do. */
size_t coll_seq_key(struct kvc *e, uint64_t gen, int64_t seq)
{
    uint64_t be = htobe64((uint64_t)seq ^ (1ull << 63));

    return coll_elem_key(e, gen, &be, 8);
}

int64_t coll_seq_of(const uint8_t *suffix)
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

bool coll_type_ok(unsigned t)
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

double coll_get_score(const uint8_t *v)
{
    uint64_t bits;
    double d;

    memcpy(&bits, v, 8);
    bits = le64toh(bits);
    memcpy(&d, &bits, 8);
    return d;
}

/* ---- DRAM ---- */

void coll_exp_track(struct kvc *e, struct kvc_coll *c)
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

void coll_free_members(struct kvc_coll *c)
{
    if (c->type == KVC_ZSET)
        kvz_free(&c->order);
    kvm_free(&c->members);
}

struct kvc_coll *coll_new(struct kvc *e, const void *key, size_t klen, enum kvc_type t)
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
void coll_unmap(struct kvc *e, struct kvc_coll *c)
{
    uint64_t dl = c->deadline;

    c->deadline = 0;
    coll_exp_track(e, c);
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
    size_t n = coll_head_key(e, key, klen);

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

int coll_del_elem(struct kvc *e, size_t klen)
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
            if (coll_del_elem(e, coll_seq_key(e, c->gen, c->head)) < 0)
                return false;
        return c->head >= c->tail;
    }
    while (c->members.n && *max) {
        struct batch b = {.n = 0};

        kvm_scan(&c->members, 0, *max < 256 ? *max : 256, batch_add, &b);
        for (unsigned i = 0; i < b.n && *max; i++, (*max)--) {
            if (coll_del_elem(e, coll_elem_key(e, c->gen, b.m[i]->bytes, b.m[i]->len)) < 0)
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
        int rc = kvs_del(e->s, e->key, coll_head_key(e, key, klen), 0, NULL);

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
        e->expired++;
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
    if (!coll_type_ok(type) || kvm_find(&e->map, key, (uint32_t)klen))
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
            rc = kvs_del(e->s, e->key, coll_head_key(e, okey, olen), 0, NULL);
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
    coll_exp_track(e, c);
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
    e->expired += done;
    reap_graves(e, max * 4);
    return done;
}

uint64_t kvc_expired(const struct kvc *e)
{
    return e->expired;
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
    rc = kvs_put(e->s, e->key, coll_seq_key(e, c->gen, seq), v, len, 0, NULL);
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
    return kvs_get(e->s, e->key, coll_seq_key(e, c->gen, c->head + (int64_t)i), v, len, NULL);
}

int kvc_list_set(struct kvc *e, struct kvc_coll *c, uint64_t i, const void *v, size_t len)
{
    if (i >= kvc_len(c))
        return TERN_ERANGE;
    return kvs_put(e->s, e->key, coll_seq_key(e, c->gen, c->head + (int64_t)i), v, len, 0, NULL);
}

int kvc_list_drop(struct kvc *e, struct kvc_coll *c, bool left, uint64_t n)
{
    for (; n && kvc_len(c); n--) {
        int64_t seq = left ? c->head : c->tail - 1;
        int rc = coll_del_elem(e, coll_seq_key(e, c->gen, seq));

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
    return kvs_get(e->s, e->key, coll_elem_key(e, c->gen, m->bytes, m->len), v, len, NULL);
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
        rc = kvs_put(e->s, e->key, coll_elem_key(e, c->gen, mb, mlen), v, vlen, 0, NULL);
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
        rc = kvs_put(e->s, e->key, coll_elem_key(e, c->gen, mb, mlen), v, vlen, 0, NULL);
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
    int rc = coll_del_elem(e, coll_elem_key(e, c->gen, m->bytes, m->len));

    if (rc < 0)
        return rc;
    if (c->type == KVC_ZSET)
        kvz_delete(&c->order, m);
    kvm_remove(&c->members, m);
    return settle(e, c);
}
