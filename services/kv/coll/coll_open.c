/* Opening a collection pool: rebuild the engine's DRAM from the records
 * (coll.h has their grammar), and repair what a crash can leave. */
#include <endian.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv/coll/coll_internal.h"
#include "kv/kv_store.h"
#include "log.h"


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
    if (k[0] != 'K' || klen < 2 || len != HEAD_BYTES || !coll_type_ok(v[0])) {
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

        seq = coll_seq_of(k);
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
        if (len != 8 || isnan(coll_get_score(val)))
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
        m->score = coll_get_score(val);
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
    s->v[s->n++] = coll_seq_of(k + 9);
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
        rc = kvs_get(e->s, e->key, coll_seq_key(e, c->gen, s.v[i]), &v, &len, NULL);
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
        rc = kvs_put(e->s, e->key, coll_seq_key(e, c->gen, want), e->vbuf, len, 0, NULL);
        if (rc == 0)
            rc = coll_del_elem(e, coll_seq_key(e, c->gen, s.v[i]));
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
            rc = kvs_del(e->s, e->key, coll_head_key(e, key, klen), 0, NULL);
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
        rc = coll_del_elem(e, l->dead.len[i]);
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
            coll_exp_track(e, c);
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
    coll_seed((uint64_t)time(NULL));   /* RANDOMKEY differs run to run */
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
