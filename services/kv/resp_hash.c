/* The RESP gateway's hash commands: HSET, HMSET, HSETNX, HGET, HMGET,
 * HDEL, HLEN, HEXISTS, HGETALL, HKEYS, HVALS, HINCRBY, HINCRBYFLOAT,
 * HSTRLEN and HSCAN, with Redis 7.0's replies and errors.
 *
 * A field is one record (its value in the pool); the fields' names are
 * in DRAM too (kv/coll/mset.h), so HGETALL and HSCAN walk them without
 * reading the pool for anything but the values. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp_internal.h"

static struct kvc_coll *hash_get(struct resp_gw *gw, struct client *c, const struct cmd *m,
                                 bool *failed)
{
    return resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_HASH, failed);
}

/* HSET key field value [field value ...] (the fields added); HMSET (OK). */
void resp_cmd_hset(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct kvc_coll *k;
    long long added = 0;

    if (m->argc % 2) {
        resp_out_err(c, "ERR wrong number of arguments for '%s' command",
                     arglen(m, 0) == 4 ? "hset" : "hmset");
        return;
    }
    for (size_t i = 2; i < m->argc; i += 2) {
        if (arglen(m, i) > KVC_MEMBER_MAX) {
            resp_out_store_err(c, TERN_E2BIG);
            return;
        }
    }
    k = resp_coll_make(gw, c, arg(m, 1), arglen(m, 1), KVC_HASH);
    if (!k)
        return;
    for (size_t i = 2; i < m->argc; i += 2) {
        int rc = kvc_hash_set(gw->coll, k, arg(m, i), arglen(m, i), arg(m, i + 1),
                              arglen(m, i + 1));

        if (rc < 0) {
            resp_out_store_err(c, rc);      /* the fields before it stay set */
            return;
        }
        added += rc;
    }
    if (arglen(m, 0) == 5)
        OUT_LIT(c, "+OK\r\n");
    else
        resp_out_num(c, ':', added);
}

void resp_cmd_hsetnx(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct kvc_coll *k;
    bool failed;
    int rc;

    k = hash_get(gw, c, m, &failed);
    if (failed)
        return;
    if (k && kvc_member(k, arg(m, 2), arglen(m, 2))) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    if (arglen(m, 2) > KVC_MEMBER_MAX) {
        resp_out_store_err(c, TERN_E2BIG);
        return;
    }
    if (!k && !(k = resp_coll_make(gw, c, arg(m, 1), arglen(m, 1), KVC_HASH)))
        return;
    rc = kvc_hash_set(gw->coll, k, arg(m, 2), arglen(m, 2), arg(m, 3), arglen(m, 3));
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        OUT_LIT(c, ":1\r\n");
}

/* A field's value: 0 with *v, TERN_ENOENT without the field. */
static int field(struct resp_gw *gw, struct kvc_coll *k, const char *f, size_t flen,
                 const void **v, uint32_t *len)
{
    struct kvm_member *fm = k ? kvc_member(k, f, flen) : NULL;

    return fm ? kvc_hash_value(gw->coll, k, fm, v, len) : TERN_ENOENT;
}

void resp_cmd_hget(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = hash_get(gw, c, m, &failed);
    const void *v;
    uint32_t len;
    int rc;

    if (failed)
        return;
    rc = field(gw, k, arg(m, 2), arglen(m, 2), &v, &len);
    if (rc == 0)
        resp_out_bulk(c, v, len);
    else if (rc == TERN_ENOENT)
        resp_out_null(c);
    else
        resp_out_store_err(c, rc);
}

void resp_cmd_hmget(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = hash_get(gw, c, m, &failed);

    if (failed)
        return;
    resp_out_num(c, '*', (long long)(m->argc - 2));
    for (size_t i = 2; i < m->argc && !c->over; i++) {
        const void *v;
        uint32_t len;

        if (field(gw, k, arg(m, i), arglen(m, i), &v, &len) == 0)
            resp_out_bulk(c, v, len);
        else
            resp_out_null(c);
    }
}

void resp_cmd_hdel(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = hash_get(gw, c, m, &failed);

    if (!failed)
        resp_coll_del_members(gw, c, m, k);
}

void resp_cmd_hlen(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    resp_coll_out_len(gw, c, m, KVC_HASH);
}

void resp_cmd_hexists(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = hash_get(gw, c, m, &failed);

    if (!failed)
        resp_out_num(c, ':', k && kvc_member(k, arg(m, 2), arglen(m, 2)));
}

void resp_cmd_hstrlen(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = hash_get(gw, c, m, &failed);
    const void *v;
    uint32_t len = 0;

    if (failed)
        return;
    if (field(gw, k, arg(m, 2), arglen(m, 2), &v, &len) < 0)
        len = 0;
    resp_out_num(c, ':', len);
}

struct walk {
    struct resp_gw *gw;
    struct client *c;
    struct kvc_coll *k;
    bool keys, vals;
    const char *pat;
    size_t plen;
    void **out;
    size_t n, cap;
};

static void collect(void *arg, struct kvm_member *f)
{
    struct walk *w = arg;

    if (w->pat && !resp_glob(w->pat, w->plen, (const char *)f->bytes, f->len))
        return;
    if (w->n < w->cap)
        w->out[w->n++] = f;
}

static void out_fields(struct walk *w)
{
    resp_out_num(w->c, '*', (long long)(w->n * ((w->keys && w->vals) ? 2 : 1)));
    for (size_t i = 0; i < w->n && !w->c->over && !w->c->dead; i++) {
        struct kvm_member *f = w->out[i];
        const void *v;
        uint32_t len;

        if (w->keys)
            resp_out_bulk(w->c, f->bytes, f->len);
        if (!w->vals)
            continue;
        if (kvc_hash_value(w->gw->coll, w->k, f, &v, &len) == 0)
            resp_out_bulk(w->c, v, len);
        else
            resp_out_null(w->c);
    }
}

/* HGETALL, HKEYS and HVALS. */
void resp_cmd_hgetall(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = hash_get(gw, c, m, &failed);
    struct walk w = {.gw = gw, .c = c, .k = k};

    if (failed)
        return;
    w.keys = !arg_is(m, 0, "HVALS");
    w.vals = !arg_is(m, 0, "HKEYS");
    if (!k) {
        OUT_LIT(c, "*0\r\n");
        return;
    }
    w.cap = kvc_len(k);
    w.out = resp_tmp(gw, c, w.cap);
    if (!w.out)
        return;
    kvm_each(&k->members, collect, &w);
    out_fields(&w);
}

/* HSCAN key cursor [MATCH pattern] [COUNT count]. */
void resp_cmd_hscan(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    struct walk w = {.gw = gw, .c = c, .keys = true, .vals = true};
    uint64_t cursor, next = 0;
    long long count;
    char text[24];

    if (!resp_cursor_parse(c, arg(m, 2), arglen(m, 2), &cursor) ||
        resp_scan_opts(c, m, 3, &w.pat, &w.plen, &count) < 0)
        return;
    k = hash_get(gw, c, m, &failed);
    if (failed)
        return;
    w.k = k;
    if (k) {
        /* A bucket may hold more than count: room for all of them. */
        w.cap = kvc_len(k);
        w.out = resp_tmp(gw, c, w.cap ? w.cap : 1);
        if (!w.out)
            return;
        next = kvm_scan(&k->members, cursor, (unsigned)count, collect, &w);
    }
    OUT_LIT(c, "*2\r\n");
    resp_out_bulk(c, text, resp_u64_text(text, next));
    out_fields(&w);
}

void resp_cmd_hincrby(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    long long by, cur = 0;
    const void *v;
    uint32_t len;
    char text[24];
    int rc;

    if (!resp_arg_ll(c, m, 3, &by))
        return;
    k = hash_get(gw, c, m, &failed);
    if (failed)
        return;
    rc = field(gw, k, arg(m, 2), arglen(m, 2), &v, &len);
    if (rc == 0 && !resp_ll_parse(v, len, &cur)) {
        OUT_LIT(c, "-ERR hash value is not an integer\r\n");
        return;
    }
    if (rc < 0 && rc != TERN_ENOENT) {
        resp_out_store_err(c, rc);
        return;
    }
    if (__builtin_add_overflow(cur, by, &cur)) {
        OUT_LIT(c, "-ERR increment or decrement would overflow\r\n");
        return;
    }
    if (arglen(m, 2) > KVC_MEMBER_MAX) {
        resp_out_store_err(c, TERN_E2BIG);
        return;
    }
    if (!k && !(k = resp_coll_make(gw, c, arg(m, 1), arglen(m, 1), KVC_HASH)))
        return;
    rc = kvc_hash_set(gw->coll, k, arg(m, 2), arglen(m, 2), text, resp_ll_text(text, cur));
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', cur);
}

/* Redis's string2ld: the whole text, no blanks first, not NaN. */
static bool ld_parse(const void *s, size_t n, long double *out)
{
    char buf[5120], *end;
    const char *p = s;

    if (n == 0 || n >= sizeof(buf) || isspace((unsigned char)p[0]))
        return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    *out = strtold(buf, &end);
    return (size_t)(end - buf) == n && !isnan(*out) && errno != ERANGE;
}

/* Redis's ld2string(LD_STR_HUMAN): 17 decimals, trailing zeros cut. */
static size_t ld_text(char *buf, size_t cap, long double v)
{
    int l = snprintf(buf, cap, "%.17Lf", v);

    if (l < 0 || (size_t)l >= cap)
        return 0;
    if (strchr(buf, '.')) {
        while (buf[l - 1] == '0')
            l--;
        if (buf[l - 1] == '.')
            l--;
    }
    if (l == 2 && buf[0] == '-' && buf[1] == '0') {
        buf[0] = '0';
        l = 1;
    }
    return (size_t)l;
}

void resp_cmd_hincrbyfloat(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    long double by, cur = 0;
    const void *v;
    uint32_t len;
    char text[5200];
    size_t n;
    int rc;

    if (!ld_parse(arg(m, 3), arglen(m, 3), &by)) {
        OUT_LIT(c, "-ERR value is not a valid float\r\n");
        return;
    }
    k = hash_get(gw, c, m, &failed);
    if (failed)
        return;
    rc = field(gw, k, arg(m, 2), arglen(m, 2), &v, &len);
    if (rc == 0 && !ld_parse(v, len, &cur)) {
        OUT_LIT(c, "-ERR hash value is not a float\r\n");
        return;
    }
    if (rc < 0 && rc != TERN_ENOENT) {
        resp_out_store_err(c, rc);
        return;
    }
    cur += by;
    if (isnan(cur) || isinf(cur)) {
        OUT_LIT(c, "-ERR increment would produce NaN or Infinity\r\n");
        return;
    }
    n = ld_text(text, sizeof(text), cur);
    if (!n || arglen(m, 2) > KVC_MEMBER_MAX) {
        resp_out_store_err(c, TERN_E2BIG);
        return;
    }
    if (!k && !(k = resp_coll_make(gw, c, arg(m, 1), arglen(m, 1), KVC_HASH)))
        return;
    rc = kvc_hash_set(gw->coll, k, arg(m, 2), arglen(m, 2), text, n);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_bulk(c, text, n);
}
