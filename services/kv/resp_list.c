/* The RESP gateway's list commands: LPUSH, RPUSH, LPUSHX, RPUSHX, LPOP,
 * RPOP, LLEN, LRANGE, LINDEX, LSET, LTRIM, LREM, LINSERT, LMOVE and
 * RPOPLPUSH, with Redis 7.0's replies and errors.
 *
 * A list's elements are records named by position (kv/coll/coll.h), so
 * the ends cost one record each and LINDEX or LRANGE read by position;
 * LREM and LINSERT move the elements after the change by one, O(n), as
 * Redis's do. Values read from the pool are valid only until the next
 * write: they go to the reply (or a copy) before it. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp_internal.h"

static bool is_left(const struct cmd *m)
{
    return tolower((unsigned char)arg(m, 0)[0]) == 'l';
}

/* LPUSH and RPUSH key element [element ...]: the new length. */
void resp_cmd_lpush(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct kvc_coll *k = resp_coll_make(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST);
    bool left = is_left(m);

    if (!k)
        return;
    for (size_t i = 2; i < m->argc; i++) {
        int rc = kvc_list_push(gw->coll, k, left, arg(m, i), arglen(m, i));

        if (rc < 0) {
            resp_out_store_err(c, rc);      /* the elements before it stay */
            return;
        }
    }
    resp_out_num(c, ':', (long long)kvc_len(k));
}

/* LPUSHX and RPUSHX: only onto a list that exists. */
void resp_cmd_lpushx(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);

    if (failed)
        return;
    if (!k) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    resp_cmd_lpush(gw, c, m);
}

/* Elements [from, to] of k, in order (or reversed), as an array. */
static int out_range(struct resp_gw *gw, struct client *c, struct kvc_coll *k, uint64_t from,
                     uint64_t to, bool reverse)
{
    resp_out_num(c, '*', (long long)(to - from + 1));
    for (uint64_t i = 0; i <= to - from && !c->over && !c->dead; i++) {
        const void *v;
        uint32_t len;
        int rc = kvc_list_at(gw->coll, k, reverse ? to - i : from + i, &v, &len);

        if (rc < 0)
            return rc;
        resp_out_bulk(c, v, len);
    }
    return 0;
}

/* LPOP and RPOP key [count]. */
void resp_cmd_lpop(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool left = is_left(m), failed;
    long long count = 0;
    struct kvc_coll *k;
    uint64_t n;
    size_t start = resp_out_pending(c);
    int rc;

    if (m->argc == 3) {
        if (!resp_arg_ll(c, m, 2, &count))
            return;
        if (count < 0) {
            OUT_LIT(c, "-ERR value is out of range, must be positive\r\n");
            return;
        }
    }
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!k) {
        if (m->argc == 3)
            OUT_LIT(c, "*-1\r\n");
        else
            resp_out_null(c);
        return;
    }
    if (m->argc == 3 && count == 0) {
        OUT_LIT(c, "*0\r\n");
        return;
    }
    n = m->argc == 3 && (uint64_t)count < kvc_len(k) ? (uint64_t)count : kvc_len(k);
    if (m->argc == 2) {
        const void *v;
        uint32_t len;

        n = 1;
        rc = kvc_list_at(gw->coll, k, left ? 0 : kvc_len(k) - 1, &v, &len);
        if (rc == 0)
            resp_out_bulk(c, v, len);
    } else {
        rc = left ? out_range(gw, c, k, 0, n - 1, false)
                  : out_range(gw, c, k, kvc_len(k) - n, kvc_len(k) - 1, true);
    }
    if (rc == 0 && !c->over && !c->dead)
        rc = kvc_list_drop(gw->coll, k, left, n);
    if (rc < 0) {
        c->out.len = c->out.off + start;
        resp_out_store_err(c, rc);
    }
}

void resp_cmd_llen(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    resp_coll_out_len(gw, c, m, KVC_LIST);
}

void resp_cmd_lrange(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long start, stop;
    uint64_t from, to;
    bool failed;
    struct kvc_coll *k;
    int rc;

    if (!resp_arg_ll(c, m, 2, &start) || !resp_arg_ll(c, m, 3, &stop))
        return;
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!k || !resp_range(start, stop, kvc_len(k), &from, &to)) {
        OUT_LIT(c, "*0\r\n");
        return;
    }
    rc = out_range(gw, c, k, from, to, false);
    if (rc < 0)
        resp_out_store_err(c, rc);
}

/* A list index (negative from the end): false if outside the list. */
static bool index_of(struct kvc_coll *k, long long i, uint64_t *out)
{
    long long n = (long long)kvc_len(k);

    if (i < 0)
        i += n;
    if (i < 0 || i >= n)
        return false;
    *out = (uint64_t)i;
    return true;
}

void resp_cmd_lindex(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long i;
    uint64_t at;
    bool failed;
    struct kvc_coll *k;
    const void *v;
    uint32_t len;
    int rc;

    if (!resp_arg_ll(c, m, 2, &i))
        return;
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!k || !index_of(k, i, &at)) {
        resp_out_null(c);
        return;
    }
    rc = kvc_list_at(gw->coll, k, at, &v, &len);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_bulk(c, v, len);
}

void resp_cmd_lset(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long i;
    uint64_t at;
    bool failed;
    struct kvc_coll *k;
    int rc;

    if (!resp_arg_ll(c, m, 2, &i))
        return;
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!k) {
        OUT_LIT(c, "-ERR no such key\r\n");
        return;
    }
    if (!index_of(k, i, &at)) {
        OUT_LIT(c, "-ERR index out of range\r\n");
        return;
    }
    rc = kvc_list_set(gw->coll, k, at, arg(m, 3), arglen(m, 3));
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        OUT_LIT(c, "+OK\r\n");
}

void resp_cmd_ltrim(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long start, stop;
    uint64_t from, to, n;
    bool failed;
    struct kvc_coll *k;
    int rc;

    if (!resp_arg_ll(c, m, 2, &start) || !resp_arg_ll(c, m, 3, &stop))
        return;
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!k) {
        OUT_LIT(c, "+OK\r\n");
        return;
    }
    n = kvc_len(k);
    if (!resp_range(start, stop, n, &from, &to)) {
        rc = kvc_delete(gw->coll, k);
    } else {
        rc = kvc_list_drop(gw->coll, k, false, n - 1 - to);
        if (rc == 0)
            rc = kvc_list_drop(gw->coll, k, true, from);
    }
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        OUT_LIT(c, "+OK\r\n");
}

/* The value at index i, copied (the writes that follow may move it). */
static int copy_at(struct resp_gw *gw, struct client *c, struct kvc_coll *k, uint64_t i,
                   char **out, uint32_t *len)
{
    const void *v;
    int rc = kvc_list_at(gw->coll, k, i, &v, len);

    if (rc < 0)
        return rc;
    if (*len + 1 > gw->scratch_cap) {
        char *p = realloc(gw->scratch, *len + 1);

        if (!p)
            return TERN_ENOMEM;
        gw->scratch = p;
        gw->scratch_cap = *len + 1;
    }
    memcpy(gw->scratch, v, *len);
    *out = gw->scratch;
    (void)c;
    return 0;
}

static bool elem_is(struct resp_gw *gw, struct kvc_coll *k, uint64_t i, const char *want,
                    size_t wlen, int *rc)
{
    const void *v;
    uint32_t len;

    *rc = kvc_list_at(gw->coll, k, i, &v, &len);
    return *rc == 0 && len == wlen && memcmp(v, want, wlen) == 0;
}

/* LREM key count element: one pass that moves the elements kept over
 * those removed, then cuts the end (the head, for a negative count). */
void resp_cmd_lrem(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long count;
    bool failed, back;
    struct kvc_coll *k;
    uint64_t n, w = 0, removed = 0, limit;
    int rc = 0;

    if (!resp_arg_ll(c, m, 2, &count))
        return;
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!k) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    back = count < 0;
    limit = count == 0 ? UINT64_MAX : back ? 0ull - (uint64_t)count : (uint64_t)count;
    n = kvc_len(k);
    for (uint64_t j = 0; j < n && rc == 0; j++) {
        uint64_t i = back ? n - 1 - j : j;      /* read from here ... */
        uint64_t to = back ? n - 1 - w : w;     /* ... and write it here */
        char *v;
        uint32_t len;

        if (removed < limit && elem_is(gw, k, i, arg(m, 3), arglen(m, 3), &rc)) {
            removed++;
            continue;
        }
        if (rc == 0 && to != i && (rc = copy_at(gw, c, k, i, &v, &len)) == 0)
            rc = kvc_list_set(gw->coll, k, to, v, len);
        w++;
    }
    if (rc == 0 && removed)
        rc = kvc_list_drop(gw->coll, k, back, removed);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', (long long)removed);
}

/* LINSERT key BEFORE|AFTER pivot element: the new length, -1 without the
 * pivot, 0 without the key. */
void resp_cmd_linsert(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool after = arg_is(m, 2, "AFTER"), failed;
    struct kvc_coll *k;
    uint64_t n, at = UINT64_MAX;
    int rc = 0;

    if (!after && !arg_is(m, 2, "BEFORE")) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!k) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    n = kvc_len(k);
    for (uint64_t i = 0; i < n && at == UINT64_MAX && rc == 0; i++)
        if (elem_is(gw, k, i, arg(m, 3), arglen(m, 3), &rc))
            at = after ? i + 1 : i;
    if (rc == 0 && at == UINT64_MAX) {
        OUT_LIT(c, ":-1\r\n");
        return;
    }
    /* Grow by one at the nearer end, then shift towards it. */
    if (rc == 0 && at == n) {
        rc = kvc_list_push(gw->coll, k, false, arg(m, 4), arglen(m, 4));
    } else if (rc == 0 && at < n - at) {
        char *v;
        uint32_t len;

        rc = copy_at(gw, c, k, 0, &v, &len);
        if (rc == 0)
            rc = kvc_list_push(gw->coll, k, true, v, len);
        for (uint64_t i = 1; rc == 0 && i < at; i++)
            if ((rc = copy_at(gw, c, k, i + 1, &v, &len)) == 0)
                rc = kvc_list_set(gw->coll, k, i, v, len);
        if (rc == 0)
            rc = kvc_list_set(gw->coll, k, at, arg(m, 4), arglen(m, 4));
    } else if (rc == 0) {
        char *v;
        uint32_t len;

        rc = copy_at(gw, c, k, n - 1, &v, &len);
        if (rc == 0)
            rc = kvc_list_push(gw->coll, k, false, v, len);
        for (uint64_t i = n - 1; rc == 0 && i > at; i--)
            if ((rc = copy_at(gw, c, k, i - 1, &v, &len)) == 0)
                rc = kvc_list_set(gw->coll, k, i, v, len);
        if (rc == 0)
            rc = kvc_list_set(gw->coll, k, at, arg(m, 4), arglen(m, 4));
    }
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', (long long)kvc_len(k));
}

/* Pop from one list's end, push onto another's; the element is the
 * reply. The destination's type is checked before anything moves. */
static void move(struct resp_gw *gw, struct client *c, const struct cmd *m, bool from_left,
                 bool to_left)
{
    bool failed;
    struct kvc_coll *src, *dst;
    char *v;
    uint32_t len;
    int rc;

    src = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_LIST, &failed);
    if (failed)
        return;
    if (!src) {
        resp_out_null(c);
        return;
    }
    dst = resp_coll_make(gw, c, arg(m, 2), arglen(m, 2), KVC_LIST);
    if (!dst)
        return;
    rc = copy_at(gw, c, src, from_left ? 0 : kvc_len(src) - 1, &v, &len);
    if (rc == 0)
        rc = kvc_list_push(gw->coll, dst, to_left, v, len);
    /* Onto the same list: the push moved nothing at the end popped, unless
     * it is the same end, where it pops the element just pushed. */
    if (rc == 0)
        rc = kvc_list_drop(gw->coll, src, from_left, 1);
    if (rc < 0) {
        resp_out_store_err(c, rc);
        return;
    }
    resp_out_bulk(c, gw->scratch, len);
}

void resp_cmd_lmove(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool fl = arg_is(m, 3, "LEFT"), tl = arg_is(m, 4, "LEFT");

    if ((!fl && !arg_is(m, 3, "RIGHT")) || (!tl && !arg_is(m, 4, "RIGHT"))) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    move(gw, c, m, fl, tl);
}

void resp_cmd_rpoplpush(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    move(gw, c, m, false, true);
}
