/* The RESP gateway's sorted-set commands: ZADD, ZINCRBY, ZSCORE,
 * ZMSCORE, ZCARD, ZREM, ZRANK, ZREVRANK, ZCOUNT, ZRANGE (by rank or
 * score, REV, LIMIT, WITHSCORES), ZREVRANGE, ZRANGEBYSCORE,
 * ZREVRANGEBYSCORE, ZPOPMIN, ZPOPMAX, ZSCAN, ZREMRANGEBYRANK and
 * ZREMRANGEBYSCORE, with Redis 7.0's replies and errors. Lexical ranges
 * (BYLEX, ZRANGEBYLEX) are not served.
 *
 * A member is one record holding its score; scores and order are in
 * DRAM (kv/coll/zskip.h), so ranks and ranges never read the pool. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp_internal.h"

static struct kvc_coll *zset_get(struct resp_gw *gw, struct client *c, const struct cmd *m,
                                 bool *failed)
{
    return resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_ZSET, failed);
}

static void out_float_err(struct client *c)
{
    OUT_LIT(c, "-ERR value is not a valid float\r\n");
}

/* ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...];
 * ZINCRBY key increment member is ZADD INCR. Every score is read before
 * the first change. */
static void zadd(struct resp_gw *gw, struct client *c, const struct cmd *m, bool incr)
{
    bool nx = false, xx = false, gt = false, lt = false, ch = false, failed;
    size_t at = 2, pairs, processed = 0;
    long long added = 0, updated = 0;
    double score = 0, *scores;
    struct kvc_coll *k;

    for (; !incr && at < m->argc; at++) {
        if (arg_is(m, at, "NX"))
            nx = true;
        else if (arg_is(m, at, "XX"))
            xx = true;
        else if (arg_is(m, at, "GT"))
            gt = true;
        else if (arg_is(m, at, "LT"))
            lt = true;
        else if (arg_is(m, at, "CH"))
            ch = true;
        else if (arg_is(m, at, "INCR"))
            incr = true;
        else
            break;
    }
    pairs = (m->argc - at) / 2;
    if ((m->argc - at) % 2 || !pairs) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    if (nx && xx) {
        OUT_LIT(c, "-ERR XX and NX options at the same time are not compatible\r\n");
        return;
    }
    if ((gt && nx) || (lt && nx) || (gt && lt)) {
        OUT_LIT(c, "-ERR GT, LT, and/or NX options at the same time are not compatible\r\n");
        return;
    }
    if (incr && pairs > 1) {
        OUT_LIT(c, "-ERR INCR option supports a single increment-element pair\r\n");
        return;
    }
    scores = (double *)resp_tmp(gw, c, pairs);
    if (!scores)
        return;
    for (size_t j = 0; j < pairs; j++) {
        if (!resp_double_parse(arg(m, at + 2 * j), arglen(m, at + 2 * j), &scores[j])) {
            out_float_err(c);
            return;
        }
        scores[j] += 0.0;       /* -0 is 0, as Redis keeps it */
        if (arglen(m, at + 2 * j + 1) > KVC_MEMBER_MAX) {
            resp_out_store_err(c, TERN_E2BIG);
            return;
        }
    }
    k = resp_coll_get(gw, c, arg(m, 1), arglen(m, 1), KVC_ZSET, &failed);
    if (failed)
        return;
    if (!k && !xx && !(k = resp_coll_make(gw, c, arg(m, 1), arglen(m, 1), KVC_ZSET)))
        return;
    for (size_t j = 0; k && j < pairs; j++) {
        const char *mb = arg(m, at + 2 * j + 1);
        size_t mlen = arglen(m, at + 2 * j + 1);
        struct kvm_member *e = kvc_member(k, mb, mlen);
        int rc;

        score = scores[j];
        if (e) {
            if (nx)
                continue;
            if (incr) {
                score += e->score;
                if (isnan(score)) {
                    OUT_LIT(c, "-ERR resulting score is not a number (NaN)\r\n");
                    return;
                }
            }
            if ((lt && score >= e->score) || (gt && score <= e->score))
                continue;
            processed++;
            if (score == e->score)
                continue;
            updated++;
        } else {
            if (xx)
                continue;
            processed++;
            added++;
        }
        rc = kvc_zset_put(gw->coll, k, mb, mlen, score, NULL);
        if (rc < 0) {
            resp_out_store_err(c, rc);
            return;
        }
    }
    if (incr && processed)
        resp_out_double(c, score);
    else if (incr)
        resp_out_null(c);
    else
        resp_out_num(c, ':', ch ? added + updated : added);
}

void resp_cmd_zadd(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    zadd(gw, c, m, false);
}

void resp_cmd_zincrby(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    zadd(gw, c, m, true);
}

void resp_cmd_zscore(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = zset_get(gw, c, m, &failed);
    struct kvm_member *e;

    if (failed)
        return;
    e = k ? kvc_member(k, arg(m, 2), arglen(m, 2)) : NULL;
    if (e)
        resp_out_double(c, e->score);
    else
        resp_out_null(c);
}

void resp_cmd_zmscore(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = zset_get(gw, c, m, &failed);

    if (failed)
        return;
    resp_out_num(c, '*', (long long)(m->argc - 2));
    for (size_t i = 2; i < m->argc; i++) {
        struct kvm_member *e = k ? kvc_member(k, arg(m, i), arglen(m, i)) : NULL;

        if (e)
            resp_out_double(c, e->score);
        else
            resp_out_null(c);
    }
}

void resp_cmd_zcard(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    resp_coll_out_len(gw, c, m, KVC_ZSET);
}

void resp_cmd_zrem(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k = zset_get(gw, c, m, &failed);

    if (!failed)
        resp_coll_del_members(gw, c, m, k);
}

/* ZRANK and ZREVRANK key member. */
void resp_cmd_zrank(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed, rev = arglen(m, 0) == 8;     /* ZREVRANK */
    struct kvc_coll *k = zset_get(gw, c, m, &failed);
    struct kvm_member *e;
    uint64_t r;

    if (failed)
        return;
    e = k ? kvc_member(k, arg(m, 2), arglen(m, 2)) : NULL;
    if (!e) {
        resp_out_null(c);
        return;
    }
    r = kvz_rank(&k->order, e);
    resp_out_num(c, ':', (long long)(rev ? kvc_len(k) - 1 - r : r));
}

/* A score range's end: "(" makes it exclusive; "-inf" and "+inf" work. */
struct bound {
    double v;
    bool excl;
};

static bool bound_parse(const char *s, size_t n, struct bound *b)
{
    b->excl = n && s[0] == '(';
    return resp_double_parse(s + b->excl, n - b->excl, &b->v);
}

static bool in_min(double v, const struct bound *min)
{
    return min->excl ? v > min->v : v >= min->v;
}

static bool in_max(double v, const struct bound *max)
{
    return max->excl ? v < max->v : v <= max->v;
}

void resp_cmd_zcount(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    struct bound min, max;
    struct kvm_member *lo, *hi;

    if (!bound_parse(arg(m, 2), arglen(m, 2), &min) ||
        !bound_parse(arg(m, 3), arglen(m, 3), &max)) {
        OUT_LIT(c, "-ERR min or max is not a float\r\n");
        return;
    }
    k = zset_get(gw, c, m, &failed);
    if (failed)
        return;
    lo = k ? kvz_first_from(&k->order, min.v, min.excl) : NULL;
    hi = k ? kvz_last_to(&k->order, max.v, max.excl) : NULL;
    if (!lo || !hi || kvz_rank(&k->order, hi) < kvz_rank(&k->order, lo))
        OUT_LIT(c, ":0\r\n");
    else
        resp_out_num(c, ':', (long long)(kvz_rank(&k->order, hi) - kvz_rank(&k->order, lo) + 1));
}

static void out_pairs(struct client *c, void **v, size_t n, bool scores)
{
    resp_out_num(c, '*', (long long)(scores ? 2 * n : n));
    for (size_t i = 0; i < n && !c->over && !c->dead; i++) {
        struct kvm_member *e = v[i];

        resp_out_bulk(c, e->bytes, e->len);
        if (scores)
            resp_out_double(c, e->score);
    }
}

/* The members of k in [lo, hi] by score (reversed: from hi down), after
 * skipping `offset`, at most `limit` (negative: all), into the gateway's
 * tmp; how many, or SIZE_MAX after an error reply. */
static size_t by_score(struct resp_gw *gw, struct client *c, struct kvc_coll *k,
                       const struct bound *lo, const struct bound *hi, bool rev,
                       long long offset, long long limit)
{
    void **v = resp_tmp(gw, c, kvc_len(k) ? kvc_len(k) : 1);
    struct kvm_member *e;
    size_t n = 0;

    if (!v)
        return SIZE_MAX;
    if (offset < 0)
        return 0;
    e = rev ? kvz_last_to(&k->order, hi->v, hi->excl) : kvz_first_from(&k->order, lo->v, lo->excl);
    for (; e && offset; offset--)
        e = rev ? kvz_prev(e) : kvz_next(e);
    for (; e && limit; limit--) {
        if (rev ? !in_min(e->score, lo) : !in_max(e->score, hi))
            break;
        v[n++] = e;
        e = rev ? kvz_prev(e) : kvz_next(e);
    }
    return n;
}

/* Ranks [from, to] (reversed: counted from the end) into tmp. */
static size_t by_rank(struct resp_gw *gw, struct client *c, struct kvc_coll *k, uint64_t from,
                      uint64_t to, bool rev)
{
    void **v = resp_tmp(gw, c, to - from + 1);
    struct kvm_member *e;
    size_t n = 0;

    if (!v)
        return SIZE_MAX;
    e = kvz_at(&k->order, rev ? kvc_len(k) - 1 - from : from);
    for (uint64_t i = from; e && i <= to; i++) {
        v[n++] = e;
        e = rev ? kvz_prev(e) : kvz_next(e);
    }
    return n;
}

/* ZRANGE key start stop [BYSCORE] [REV] [LIMIT offset count] [WITHSCORES],
 * and the older ZREVRANGE, ZRANGEBYSCORE and ZREVRANGEBYSCORE. */
void resp_cmd_zrange(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool rev = false, byscore = false, scores = false, failed, has_limit = false;
    long long offset = 0, limit = -1;
    size_t lo_i = 2, hi_i = 3, n;
    struct kvc_coll *k;

    if (arg_is(m, 0, "ZREVRANGE")) {
        rev = true;
    } else if (arg_is(m, 0, "ZRANGEBYSCORE")) {
        byscore = true;
    } else if (arg_is(m, 0, "ZREVRANGEBYSCORE")) {
        byscore = rev = true;
    }
    for (size_t j = 4; j < m->argc; j++) {
        bool old = !arg_is(m, 0, "ZRANGE");

        if (arg_is(m, j, "WITHSCORES")) {
            scores = true;
        } else if (arg_is(m, j, "LIMIT") && j + 2 < m->argc) {
            if (!resp_arg_ll(c, m, j + 1, &offset) || !resp_arg_ll(c, m, j + 2, &limit))
                return;
            has_limit = true;
            j += 2;
        } else if (!old && arg_is(m, j, "REV") && !rev) {
            rev = true;
        } else if (!old && arg_is(m, j, "BYSCORE") && !byscore) {
            byscore = true;
        } else if (!old && arg_is(m, j, "BYLEX")) {
            OUT_LIT(c, "-ERR BYLEX ranges are not served by this gateway\r\n");
            return;
        } else {
            OUT_LIT(c, "-ERR syntax error\r\n");
            return;
        }
    }
    if (has_limit && !byscore) {
        OUT_LIT(c, "-ERR syntax error, LIMIT is only supported in combination with either "
                   "BYSCORE or BYLEX\r\n");
        return;
    }
    if (byscore) {
        struct bound lo, hi;

        if (rev) {
            lo_i = 3;
            hi_i = 2;
        }
        if (!bound_parse(arg(m, lo_i), arglen(m, lo_i), &lo) ||
            !bound_parse(arg(m, hi_i), arglen(m, hi_i), &hi)) {
            OUT_LIT(c, "-ERR min or max is not a float\r\n");
            return;
        }
        k = zset_get(gw, c, m, &failed);
        if (failed)
            return;
        if (!k) {
            OUT_LIT(c, "*0\r\n");
            return;
        }
        n = by_score(gw, c, k, &lo, &hi, rev, offset, limit);
    } else {
        long long start, stop;
        uint64_t from, to;

        if (!resp_arg_ll(c, m, 2, &start) || !resp_arg_ll(c, m, 3, &stop))
            return;
        k = zset_get(gw, c, m, &failed);
        if (failed)
            return;
        if (!k || !resp_range(start, stop, kvc_len(k), &from, &to)) {
            OUT_LIT(c, "*0\r\n");
            return;
        }
        n = by_rank(gw, c, k, from, to, rev);
    }
    if (n != SIZE_MAX)
        out_pairs(c, gw->tmp, n, scores);
}

/* ZPOPMIN and ZPOPMAX key [count]: member, score, ... */
void resp_cmd_zpopmin(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool max = tolower((unsigned char)arg(m, 0)[5]) == 'a', failed;
    long long count = 1;
    struct kvc_coll *k;
    size_t start = resp_out_pending(c), n;
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
    k = zset_get(gw, c, m, &failed);
    if (failed)
        return;
    if (!k || count == 0) {
        OUT_LIT(c, "*0\r\n");
        return;
    }
    n = (uint64_t)count < kvc_len(k) ? (size_t)count : kvc_len(k);
    if (by_rank(gw, c, k, 0, n - 1, max) == SIZE_MAX)
        return;
    v = gw->tmp;
    out_pairs(c, v, n, true);
    for (size_t i = 0; i < n && rc == 0 && !c->over && !c->dead; i++)
        rc = kvc_member_del(gw->coll, k, v[i]);
    if (rc < 0) {
        c->out.len = c->out.off + start;
        resp_out_store_err(c, rc);
    }
}

struct scan {
    void **v;
    size_t n, cap;
    const char *pat;
    size_t plen;
};

static void scan_one(void *arg, struct kvm_member *e)
{
    struct scan *s = arg;

    if ((!s->pat || resp_glob(s->pat, s->plen, (const char *)e->bytes, e->len)) && s->n < s->cap)
        s->v[s->n++] = e;
}

void resp_cmd_zscan(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    struct scan s = {0};
    uint64_t cursor, next = 0;
    long long count;
    char text[24];

    if (!resp_cursor_parse(c, arg(m, 2), arglen(m, 2), &cursor) ||
        resp_scan_opts(c, m, 3, &s.pat, &s.plen, &count) < 0)
        return;
    k = zset_get(gw, c, m, &failed);
    if (failed)
        return;
    if (k) {
        s.cap = kvc_len(k);
        s.v = resp_tmp(gw, c, s.cap);
        if (!s.v)
            return;
        next = kvm_scan(&k->members, cursor, (unsigned)count, scan_one, &s);
    }
    OUT_LIT(c, "*2\r\n");
    resp_out_bulk(c, text, resp_u64_text(text, next));
    out_pairs(c, s.v, s.n, true);
}

static void remove_gathered(struct resp_gw *gw, struct client *c, struct kvc_coll *k, size_t n)
{
    int rc = 0;
    size_t i;

    for (i = 0; i < n && rc == 0; i++)
        rc = kvc_member_del(gw->coll, k, gw->tmp[i]);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', (long long)i);
}

void resp_cmd_zremrangebyrank(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    long long start, stop;
    uint64_t from, to;
    size_t n;

    if (!resp_arg_ll(c, m, 2, &start) || !resp_arg_ll(c, m, 3, &stop))
        return;
    k = zset_get(gw, c, m, &failed);
    if (failed)
        return;
    if (!k || !resp_range(start, stop, kvc_len(k), &from, &to)) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    n = by_rank(gw, c, k, from, to, false);
    if (n != SIZE_MAX)
        remove_gathered(gw, c, k, n);
}

void resp_cmd_zremrangebyscore(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool failed;
    struct kvc_coll *k;
    struct bound lo, hi;
    size_t n;

    if (!bound_parse(arg(m, 2), arglen(m, 2), &lo) || !bound_parse(arg(m, 3), arglen(m, 3), &hi)) {
        OUT_LIT(c, "-ERR min or max is not a float\r\n");
        return;
    }
    k = zset_get(gw, c, m, &failed);
    if (failed)
        return;
    if (!k) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    n = by_score(gw, c, k, &lo, &hi, false, 0, -1);
    if (n != SIZE_MAX)
        remove_gathered(gw, c, k, n);
}
