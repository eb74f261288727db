/* The RESP gateway and collections (kv/coll): how a key is found in
 * either store, and what the list, hash, set and sorted-set commands
 * share. A key is a string (the store) or a collection (the engine),
 * never both; where both turn up, the string wins (coll.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "log.h"
#include "resp_internal.h"

struct kvc_coll *resp_coll_find(struct resp_gw *gw, const char *key, size_t klen)
{
    if (!gw->coll || klen == 0 || klen > KVC_KEY_MAX)
        return NULL;
    return kvc_find(gw->coll, key, klen);
}

int resp_coll_drop(struct resp_gw *gw, const char *key, size_t klen)
{
    struct kvc_coll *k = resp_coll_find(gw, key, klen);

    return k ? kvc_delete(gw->coll, k) : 0;
}

static void out_wrongtype(struct client *c)
{
    OUT_LIT(c, "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
}

struct kvc_coll *resp_coll_get(struct resp_gw *gw, struct client *c, const char *key,
                               size_t klen, enum kvc_type type, bool *failed)
{
    const void *val;
    uint32_t len;
    uint64_t version;
    struct kvc_coll *k;

    *failed = true;
    if (!gw->coll) {
        OUT_LIT(c, "-ERR this gateway has no pool for lists, hashes, sets and sorted sets\r\n");
        return NULL;
    }
    if (klen && klen <= KV_KEY_MAX && kvs_get(gw->store, key, klen, &val, &len, &version) == 0) {
        k = kvc_find(gw->coll, key, klen);
        if (k)
            kvc_delete(gw->coll, k);    /* both: the string wins, as a SET would */
        out_wrongtype(c);
        return NULL;
    }
    k = resp_coll_find(gw, key, klen);
    if (k && k->type != type) {
        out_wrongtype(c);
        return NULL;
    }
    *failed = false;
    return k;
}

struct kvc_coll *resp_coll_make(struct resp_gw *gw, struct client *c, const char *key,
                                size_t klen, enum kvc_type type)
{
    struct kvc_coll *k;
    bool failed;
    int rc;

    if (klen == 0) {
        OUT_LIT(c, "-ERR empty keys are not supported\r\n");
        return NULL;
    }
    if (klen > KVC_KEY_MAX) {
        OUT_LIT(c, "-ERR key too large for the store\r\n");
        return NULL;
    }
    k = resp_coll_get(gw, c, key, klen, type, &failed);
    if (k || failed)
        return k;
    rc = kvc_create(gw->coll, key, klen, type, &k);
    if (rc < 0) {
        resp_out_store_err(c, rc);
        return NULL;
    }
    return k;
}

void resp_coll_out_len(struct resp_gw *gw, struct client *c, const struct cmd *m,
                       enum kvc_type type)
{
    bool failed;
    struct kvc_coll *k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), type, &failed);

    if (!failed)
        resp_out_num(c, ':', k ? (long long)kvc_len(k) : 0);
}

void resp_coll_del_members(struct resp_gw *gw, struct client *c, const struct cmd *m,
                           struct kvc_coll *k)
{
    long long n = 0;

    for (size_t i = 2; k && i < m->argc; i++) {
        struct kvm_member *e = kvc_member(k, arg(m, i), arglen(m, i));
        int rc;

        if (!e)
            continue;
        rc = kvc_member_del(gw->coll, k, e);
        if (rc < 0) {
            resp_out_store_err(c, rc);
            return;
        }
        n++;
        if (rc == 1)
            break;              /* the last member: the collection is gone */
    }
    resp_out_num(c, ':', n);
}

const char *resp_coll_type_name(enum kvc_type t)
{
    switch (t) {
    case KVC_LIST:
        return "list";
    case KVC_HASH:
        return "hash";
    case KVC_SET:
        return "set";
    case KVC_ZSET:
        return "zset";
    }
    return "none";
}

void **resp_tmp(struct resp_gw *gw, struct client *c, size_t n)
{
    if (n > gw->tmp_cap) {
        size_t cap = gw->tmp_cap ? gw->tmp_cap : 64;
        void **p;

        while (cap < n)
            cap *= 2;
        p = realloc(gw->tmp, cap * sizeof(*p));
        if (!p) {
            OUT_LIT(c, "-OOM out of memory\r\n");
            return NULL;
        }
        gw->tmp = p;
        gw->tmp_cap = cap;
    }
    return gw->tmp;
}

/* ---- numbers ---- */

bool resp_double_parse(const char *s, size_t n, double *out)
{
    char buf[256], *end;
    double d;

    if (n == 0 || n >= sizeof(buf) || s[0] == ' ' || s[0] == '\t' || s[0] == '\n' ||
        s[0] == '\r' || s[0] == '\v' || s[0] == '\f')
        return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    d = strtod(buf, &end);
    if ((size_t)(end - buf) != n || isnan(d) || (errno == ERANGE && (d == HUGE_VAL ||
                                                                     d == -HUGE_VAL || d == 0)))
        return false;
    *out = d;
    return true;
}

/* Redis 7.0's d2string: integers as integers, others with 17 digits. */
size_t resp_double_text(char *dst, double d)
{
    if (isinf(d))
        return (size_t)sprintf(dst, d > 0 ? "inf" : "-inf");
    if (d == 0)
        return (size_t)sprintf(dst, signbit(d) ? "-0" : "0");
    if (d > -4503599627370495.0 && d < 4503599627370496.0 && d == (double)(long long)d)
        return resp_ll_text(dst, (long long)d);
    return (size_t)sprintf(dst, "%.17g", d);
}

void resp_out_double(struct client *c, double d)
{
    char text[40];

    resp_out_bulk(c, text, resp_double_text(text, d));
}

bool resp_arg_ll(struct client *c, const struct cmd *m, size_t i, long long *out)
{
    if (resp_ll_parse(arg(m, i), arglen(m, i), out))
        return true;
    OUT_LIT(c, "-ERR value is not an integer or out of range\r\n");
    return false;
}

/* Redis's index rules: negative from the end, then clipped to the
 * collection. False if the range is empty. */
bool resp_range(long long start, long long stop, uint64_t len, uint64_t *from, uint64_t *to)
{
    long long n = (long long)len;

    if (start < 0)
        start += n;
    if (stop < 0)
        stop += n;
    if (start < 0)
        start = 0;
    if (start > stop || start >= n)
        return false;
    if (stop >= n)
        stop = n - 1;
    *from = (uint64_t)start;
    *to = (uint64_t)stop;
    return true;
}

/* ---- SCAN's share ---- */

/* The options HSCAN, SSCAN and ZSCAN take after the cursor. */
int resp_scan_opts(struct client *c, const struct cmd *m, size_t from, const char **pat,
                   size_t *plen, long long *count)
{
    *pat = NULL;
    *plen = 0;
    *count = 10;
    for (size_t i = from; i < m->argc; i += 2) {
        if (i + 1 == m->argc) {
            OUT_LIT(c, "-ERR syntax error\r\n");
            return -1;
        }
        if (arg_is(m, i, "MATCH")) {
            *pat = arg(m, i + 1);
            *plen = arglen(m, i + 1);
            if (*plen == 1 && **pat == '*')
                *pat = NULL;
        } else if (arg_is(m, i, "COUNT")) {
            if (!resp_arg_ll(c, m, i + 1, count))
                return -1;
            if (*count < 1) {
                OUT_LIT(c, "-ERR syntax error\r\n");
                return -1;
            }
        } else {
            OUT_LIT(c, "-ERR syntax error\r\n");
            return -1;
        }
    }
    if (*count > 100000)
        *count = 100000;
    return 0;
}

bool resp_cursor_parse(struct client *c, const char *s, size_t n, uint64_t *out)
{
    unsigned long long v = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(s[i] - '0');

        if (d > 9 || n > 20 || v > (ULLONG_MAX - d) / 10) {
            OUT_LIT(c, "-ERR invalid cursor\r\n");
            return false;
        }
        v = v * 10 + d;
    }
    if (!n) {
        OUT_LIT(c, "-ERR invalid cursor\r\n");
        return false;
    }
    *out = v;
    return true;
}

/* ---- both stores ---- */

struct clash {
    struct resp_gw *gw;
    void **v;
    size_t n, cap;
    int rc;
};

static void find_clash(void *arg, struct kvc_coll *k)
{
    struct clash *cl = arg;
    uint32_t klen;
    const void *key = kvc_key(k, &klen), *val;
    uint32_t len;
    uint64_t version;

    if (cl->rc < 0 || klen > KV_KEY_MAX ||
        kvs_get(cl->gw->store, key, klen, &val, &len, &version) != 0)
        return;
    if (cl->n == cl->cap) {
        size_t cap = cl->cap ? cl->cap * 2 : 16;
        void **v = realloc(cl->v, cap * sizeof(*v));

        if (!v) {
            cl->rc = TERN_ENOMEM;
            return;
        }
        cl->v = v;
        cl->cap = cap;
    }
    cl->v[cl->n++] = k;
}

int resp_coll_reconcile(struct resp_gw *gw)
{
    struct clash cl = {.gw = gw};
    uint64_t cursor = 0;

    if (!gw->coll)
        return 0;
    do
        cursor = kvc_scan(gw->coll, cursor, 1024, find_clash, &cl);
    while (cursor && cl.rc == 0);
    for (size_t i = 0; i < cl.n && cl.rc == 0; i++)
        cl.rc = kvc_delete(gw->coll, cl.v[i]);
    if (cl.rc == 0 && cl.n) {
        tern_log(TERN_LOG_WARN, "resp", "%zu keys were both a string and a collection: the "
                 "collections were deleted", cl.n);
        cl.rc = kvc_sync(gw->coll);
    }
    free(cl.v);
    return cl.rc;
}
