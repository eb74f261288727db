/* The RESP gateway's set commands: SADD, SREM, SISMEMBER, SMISMEMBER,
 * SCARD, SMEMBERS, SPOP, SRANDMEMBER, SSCAN, SMOVE, SINTER, SUNION, SDIFF
 * and their STORE forms, with Redis 7.0's replies and errors.
 *
 * A member is one record with an empty value; membership is answered
 * from DRAM (kv/coll/mset.h) without reading the pool. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp_internal.h"

static uint64_t rnd_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

static struct kvc_coll *set_get(struct resp_gw *gw, struct client *c, const struct cmd *m,
                                size_t i, bool *failed)
{
    return resp_coll_get(gw, c, arg(m, i), arglen(m, i), KVC_SET, failed);
}

void resp_cmd_sadd(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct kvc_coll *k;
    long long added = 0;

    for (size_t i = 2; i < m->argc; i++) {
        if (arglen(m, i) > KVC_MEMBER_MAX) {
            resp_out_store_err(c, TERN_E2BIG);
            return;
        }
    }
    k = resp_coll_make(gw, c, arg(m, 1), arglen(m, 1), KVC_SET);
    if (!k)
        return;
    for (size_t i = 2; i < m->argc; i++) {
        int rc = kvc_set_add(gw->coll, k, arg(m, i), arglen(m, i));

        if (rc < 0) {
            resp_out_store_err(c, rc);
            return;
        }
        added += rc;
    }
    resp_out_num(c, ':', added);
}

void resp_cmd_srem(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = set_get(gw, c, m, 1, &failed);

    if (!failed)
        resp_coll_del_members(gw, c, m, k);
}

void resp_cmd_sismember(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = set_get(gw, c, m, 1, &failed);

    if (!failed)
        resp_out_num(c, ':', k && kvc_member(k, arg(m, 2), arglen(m, 2)));
}

void resp_cmd_smismember(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = set_get(gw, c, m, 1, &failed);

    if (failed)
        return;
    resp_out_num(c, '*', (long long)(m->argc - 2));
    for (size_t i = 2; i < m->argc; i++)
        resp_out_num(c, ':', k && kvc_member(k, arg(m, i), arglen(m, i)));
}

void resp_cmd_scard(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    resp_coll_out_len(gw, c, m, KVC_SET);
}

struct gather {
    void **out;
    size_t n, cap;
    const char *pat;
    size_t plen;
};

static void gather(void *arg, struct kvm_member *e)
{
    struct gather *g = arg;

    if (g->pat && !resp_glob(g->pat, g->plen, (const char *)e->bytes, e->len))
        return;
    if (g->n < g->cap)
        g->out[g->n++] = e;
}

static void out_members(struct client *c, void **v, size_t n)
{
    resp_out_num(c, '*', (long long)n);
    for (size_t i = 0; i < n && !c->over && !c->dead; i++) {
        struct kvm_member *e = v[i];

        resp_out_bulk(c, e->bytes, e->len);
    }
}

void resp_cmd_smembers(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = set_get(gw, c, m, 1, &failed);
    struct gather g = {0};

    if (failed)
        return;
    if (!k) {
        OUT_LIT(c, "*0\r\n");
        return;
    }
    g.cap = kvc_len(k);
    g.out = resp_tmp(gw, c, g.cap);
    if (!g.out)
        return;
    kvm_each(&k->members, gather, &g);
    out_members(c, g.out, g.n);
}

void resp_cmd_sscan(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    struct gather g = {0};
    uint64_t cursor, next = 0;
    long long count;
    char text[24];

    if (!resp_cursor_parse(c, arg(m, 2), arglen(m, 2), &cursor) ||
        resp_scan_opts(c, m, 3, &g.pat, &g.plen, &count) < 0)
        return;
    k = set_get(gw, c, m, 1, &failed);
    if (failed)
        return;
    if (k) {
        g.cap = kvc_len(k);
        g.out = resp_tmp(gw, c, g.cap);
        if (!g.out)
            return;
        next = kvm_scan(&k->members, cursor, (unsigned)count, gather, &g);
    }
    OUT_LIT(c, "*2\r\n");
    resp_out_bulk(c, text, resp_u64_text(text, next));
    out_members(c, g.out, g.n);
}

/* `want` distinct members at random (want < n): a partial shuffle of
 * them all when many are wanted, else draws with the repeats skipped. */
static size_t pick(struct resp_gw *gw, struct client *c, struct kvc_coll *k, size_t want)
{
    size_t n = kvc_len(k);
    void **v = resp_tmp(gw, c, want * 3 < n ? want : n);
    struct gather g = {.out = v, .cap = n};
    size_t got = 0;

    if (!v)
        return SIZE_MAX;
    if (want * 3 >= n) {
        kvm_each(&k->members, gather, &g);
        for (size_t i = 0; i < want; i++) {
            size_t j = i + (size_t)(rnd() % (n - i));
            void *t = v[i];

            v[i] = v[j];
            v[j] = t;
        }
        return want;
    }
    while (got < want) {
        struct kvm_member *e = kvm_random(&k->members, rnd);
        size_t i;

        for (i = 0; i < got && v[i] != e; i++)
            ;
        if (i == got)
            v[got++] = e;
    }
    return got;
}

/* SPOP key [count]. */
void resp_cmd_spop(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    long long count = 1;
    size_t n, start = resp_out_pending(c);
    void **v;
    int rc = 0;

    if (m->argc == 3) {
        if (!resp_arg_ll(c, m, 2, &count))
            return;
        if (count < 0) {
            OUT_LIT(c, "-ERR value is out of range, must be positive\r\n");
            return;
        }
    }
    k = set_get(gw, c, m, 1, &failed);
    if (failed)
        return;
    if (!k || (m->argc == 3 && count == 0)) {
        if (m->argc == 3)
            OUT_LIT(c, "*0\r\n");
        else
            resp_out_null(c);
        return;
    }
    n = (uint64_t)count >= kvc_len(k) ? kvc_len(k) : (size_t)count;
    if (pick(gw, c, k, n) == SIZE_MAX)
        return;
    v = gw->tmp;
    if (m->argc == 3) {
        out_members(c, v, n);
    } else {
        struct kvm_member *e = v[0];

        resp_out_bulk(c, e->bytes, e->len);
    }
    /* The reply holds copies: the members may go now. */
    for (size_t i = 0; i < n && rc == 0 && !c->over && !c->dead; i++)
        rc = kvc_member_del(gw->coll, k, v[i]);
    if (rc < 0) {
        c->out.len = c->out.off + start;
        resp_out_store_err(c, rc);
    }
}

/* SRANDMEMBER key [count]: a negative count may repeat members. */
void resp_cmd_srandmember(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    long long count = 1;

    if (m->argc == 3 && !resp_arg_ll(c, m, 2, &count))
        return;
    if (count == LLONG_MIN) {
        OUT_LIT(c, "-ERR value is out of range, value must between -9223372036854775807 and "
                   "9223372036854775807\r\n");
        return;
    }
    k = set_get(gw, c, m, 1, &failed);
    if (failed)
        return;
    if (!k || (m->argc == 3 && count == 0)) {
        if (m->argc == 3)
            OUT_LIT(c, "*0\r\n");
        else
            resp_out_null(c);
        return;
    }
    if (m->argc == 2) {
        struct kvm_member *e = kvm_random(&k->members, rnd);

        resp_out_bulk(c, e->bytes, e->len);
    } else if (count < 0) {
        resp_out_num(c, '*', -count);
        for (long long i = 0; i < -count && !c->over && !c->dead; i++) {
            struct kvm_member *e = kvm_random(&k->members, rnd);

            resp_out_bulk(c, e->bytes, e->len);
        }
    } else {
        size_t n = (uint64_t)count >= kvc_len(k) ? kvc_len(k) : (size_t)count;

        if (pick(gw, c, k, n) != SIZE_MAX)
            out_members(c, gw->tmp, n);
    }
}

void resp_cmd_smove(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *src, *dst;
    struct kvm_member *e;
    int rc;

    src = set_get(gw, c, m, 1, &failed);
    if (failed)
        return;
    if (!src) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    dst = set_get(gw, c, m, 2, &failed);
    if (failed)
        return;
    e = kvc_member(src, arg(m, 3), arglen(m, 3));
    if (src == dst || !e) {
        resp_out_num(c, ':', e != NULL);
        return;
    }
    if (!dst && !(dst = resp_coll_make(gw, c, arg(m, 2), arglen(m, 2), KVC_SET)))
        return;
    rc = kvc_set_add(gw->coll, dst, arg(m, 3), arglen(m, 3));
    if (rc >= 0)
        rc = kvc_member_del(gw->coll, src, e);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        OUT_LIT(c, ":1\r\n");
}

/* ---- SINTER, SUNION, SDIFF and their STORE forms ---- */

enum set_op { OP_INTER, OP_UNION, OP_DIFF };

struct op_ctx {
    enum set_op op;
    struct kvc_coll **sets;          /* NULL for an absent key */
    size_t n;
    struct kvm_set *out;
    int rc;
};

static void op_member(void *arg, struct kvm_member *e)
{
    struct op_ctx *o = arg;
    struct kvm_member *added;
    bool keep = true;

    for (size_t i = 1; i < o->n && keep; i++) {
        bool in = o->sets[i] && kvm_find(&o->sets[i]->members, e->bytes, e->len);

        keep = o->op == OP_INTER ? in : !in;
    }
    if (keep && o->rc == 0 && kvm_add(o->out, e->bytes, e->len, &added) < 0)
        o->rc = TERN_ENOMEM;
}

static void union_member(void *arg, struct kvm_member *e)
{
    struct op_ctx *o = arg;
    struct kvm_member *added;

    if (o->rc == 0 && kvm_add(o->out, e->bytes, e->len, &added) < 0)
        o->rc = TERN_ENOMEM;
}

/* The result of op over the keys argv[from..] into out (copies), or -1
 * after an error reply. */
static int set_op(struct resp_gw *gw, struct client *c, const struct cmd *m, size_t from,
                  enum set_op op, struct kvm_set *out)
{
    struct op_ctx o = {.op = op, .n = m->argc - from, .out = out};
    bool failed;
    void **tmp = resp_tmp(gw, c, o.n);

    if (!tmp)
        return -1;
    o.sets = (struct kvc_coll **)tmp;
    for (size_t i = 0; i < o.n; i++) {
        o.sets[i] = set_get(gw, c, m, from + i, &failed);
        if (failed)
            return -1;
    }
    if (op == OP_INTER) {
        /* Walk the smallest; an absent key makes the result empty. */
        size_t small = 0;

        for (size_t i = 0; i < o.n; i++) {
            if (!o.sets[i])
                return 0;
            if (kvc_len(o.sets[i]) < kvc_len(o.sets[small]))
                small = i;
        }
        struct kvc_coll *t = o.sets[0];

        o.sets[0] = o.sets[small];
        o.sets[small] = t;
        kvm_each(&o.sets[0]->members, op_member, &o);
    } else if (op == OP_DIFF) {
        if (o.sets[0])
            kvm_each(&o.sets[0]->members, op_member, &o);
    } else {
        for (size_t i = 0; i < o.n; i++)
            if (o.sets[i])
                kvm_each(&o.sets[i]->members, union_member, &o);
    }
    if (o.rc < 0) {
        resp_out_store_err(c, o.rc);
        return -1;
    }
    return 0;
}

static enum set_op op_of(const struct cmd *m)
{
    const char *s = arg(m, 0);

    return (s[1] | 0x20) == 'i' ? OP_INTER : (s[1] | 0x20) == 'u' ? OP_UNION : OP_DIFF;
}

static void out_kvm(void *arg, struct kvm_member *e)
{
    struct client *c = arg;

    if (!c->over && !c->dead)
        resp_out_bulk(c, e->bytes, e->len);
}

/* SINTER, SUNION and SDIFF key [key ...]. */
void resp_cmd_sinter(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct kvm_set out;

    kvm_init(&out);
    if (set_op(gw, c, m, 1, op_of(m), &out) == 0) {
        resp_out_num(c, '*', (long long)out.n);
        kvm_each(&out, out_kvm, c);
    }
    kvm_free(&out);
}

struct store_ctx {
    struct resp_gw *gw;
    struct kvc_coll *k;
    int rc;
};

static void store_member(void *arg, struct kvm_member *e)
{
    struct store_ctx *s = arg;

    if (s->rc >= 0)
        s->rc = kvc_set_add(s->gw->coll, s->k, e->bytes, e->len);
}

/* SINTERSTORE, SUNIONSTORE and SDIFFSTORE destination key [key ...]: the
 * destination is replaced, whatever it held. */
void resp_cmd_sinterstore(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct kvm_set out;
    struct store_ctx s = {.gw = gw};
    const char *dk = arg(m, 1);
    size_t dlen = arglen(m, 1);
    int rc;

    if (!resp_key_ok(c, dlen))
        return;
    kvm_init(&out);
    if (set_op(gw, c, m, 2, op_of(m), &out) < 0) {
        kvm_free(&out);
        return;
    }
    rc = kvs_del(gw->store, dk, dlen, 0, NULL);
    if (rc == 0 || rc == TERN_ENOENT)
        rc = resp_coll_drop(gw, dk, dlen);
    if (rc == 0 && out.n) {
        s.k = resp_coll_make(gw, c, dk, dlen, KVC_SET);
        if (!s.k) {
            kvm_free(&out);
            return;
        }
        kvm_each(&out, store_member, &s);
        rc = s.rc < 0 ? s.rc : 0;
    }
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', (long long)out.n);
    kvm_free(&out);
}
