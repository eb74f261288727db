/* The RESP gateway's expiry and key commands: EXPIRE and its kin, TTL,
 * PERSIST, SETEX, GETEX, GETDEL, TYPE, SCAN, KEYS, RANDOMKEY, RENAME,
 * APPEND, STRLEN, GETRANGE, SETRANGE, MSETNX. Redis 7's replies and
 * errors, word for word where clients look at them.
 *
 * Deadlines live in the store (kvs_put_until): a key past its deadline is
 * absent to every command at once, and the gateway's poll removes it
 * within about 100 ms (resp_expire_cycle). Commands that rewrite a value
 * (APPEND, SETRANGE, INCR, RENAME) keep its deadline, as Redis does; SET
 * drops it unless told KEEPTTL.
 */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp_internal.h"
#include "rpc.h"

/* Most keys removed in one cycle; more due: the next poll goes on. */
#define EXPIRE_BATCH 1000u
#define EXPIRE_EVERY_NS 100000000ull

/* Redis's limit on a string (proto-max-bulk-len), for SETRANGE's offset. */
#define STRING_MAX (512ull << 20)

static void out_int_err(struct client *c)
{
    OUT_LIT(c, "-ERR value is not an integer or out of range\r\n");
}

/* A value copied out of the pool (the next write may move it), in the
 * gateway's scratch buffer: NULL without memory (the client is told). */
static char *scratch(struct resp_gw *gw, struct client *c, size_t n)
{
    if (n > gw->scratch_cap) {
        char *p = realloc(gw->scratch, n);

        if (!p) {
            OUT_LIT(c, "-OOM out of memory copying the value\r\n");
            return NULL;
        }
        gw->scratch = p;
        gw->scratch_cap = n;
    }
    return gw->scratch;
}

/* The key's deadline (a string's or a collection's), 0 for none;
 * TERN_ENOENT if the key is absent. */
static int deadline_of(struct resp_gw *gw, const char *key, size_t klen, uint64_t *at)
{
    struct kvc_coll *k;
    int rc;

    if (klen == 0 || klen > KV_KEY_MAX)
        return TERN_ENOENT;
    rc = kvs_expiry(gw->store, key, klen, at);
    if (rc == TERN_ENOENT && (k = resp_coll_find(gw, key, klen))) {
        *at = k->deadline;
        return 0;
    }
    return rc;
}

/* Give a present key (either kind) a new deadline; 0 takes it away. */
static int set_deadline(struct resp_gw *gw, const char *key, size_t klen, uint64_t at)
{
    int rc = kvs_set_expiry(gw->store, key, klen, at, 0, NULL);
    struct kvc_coll *k;

    if (rc == TERN_ENOENT && (k = resp_coll_find(gw, key, klen)))
        rc = kvc_set_expiry(gw->coll, k, at);
    return rc > 0 ? 0 : rc;
}

/* A relative time in `unit` ms from now, or an absolute one (unit 0: ms
 * already, 1000: seconds), as a deadline in Unix ms. False if it
 * overflows, as Redis's "invalid expire time". */
static bool to_deadline(long long v, long long unit, bool relative, uint64_t *at)
{
    long long ms, base = relative ? (long long)kvs_now_ms() : 0;

    if (__builtin_mul_overflow(v, unit, &ms) || __builtin_add_overflow(ms, base, &ms))
        return false;
    *at = ms <= 0 ? 1 : (uint64_t)ms;  /* past: 1 ms after the epoch, never "none" */
    return true;
}

static void out_bad_time(struct client *c, const char *cmd)
{
    resp_out_err(c, "ERR invalid expire time in '%s' command", cmd);
}

/* ---- EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT ---- */

void resp_cmd_expire(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool nx = false, xx = false, gt = false, lt = false, ms = tolower(arg(m, 0)[0]) == 'p',
         at = arglen(m, 0) > (ms ? 7u : 6u);
    char name[16];
    long long v;
    uint64_t when, old;
    int rc;

    snprintf(name, sizeof(name), "%.*s", (int)arglen(m, 0), arg(m, 0));
    for (char *p = name; *p; p++)
        *p = (char)tolower(*p);
    for (size_t i = 3; i < m->argc; i++) {
        if (arg_is(m, i, "NX")) {
            nx = true;
        } else if (arg_is(m, i, "XX")) {
            xx = true;
        } else if (arg_is(m, i, "GT")) {
            gt = true;
        } else if (arg_is(m, i, "LT")) {
            lt = true;
        } else {
            resp_out_err(c, "ERR Unsupported option %.*s", (int)(arglen(m, i) < 64 ? arglen(m, i) : 64),
                         arg(m, i));
            return;
        }
    }
    if (nx && (xx || gt || lt)) {
        OUT_LIT(c, "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n");
        return;
    }
    if (gt && lt) {
        OUT_LIT(c, "-ERR GT and LT options at the same time are not compatible\r\n");
        return;
    }
    if (!resp_ll_parse(arg(m, 2), arglen(m, 2), &v)) {
        out_int_err(c);
        return;
    }
    if (!to_deadline(v, ms ? 1 : 1000, !at, &when)) {
        out_bad_time(c, name);
        return;
    }
    rc = deadline_of(gw, arg(m, 1), arglen(m, 1), &old);
    if (rc == TERN_ENOENT) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    if (rc < 0) {
        resp_out_store_err(c, rc);
        return;
    }
    /* No deadline counts as an infinite one for GT and LT. */
    if ((nx && old) || (xx && !old) || (gt && (!old || when <= old)) ||
        (lt && old && when >= old)) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    rc = set_deadline(gw, arg(m, 1), arglen(m, 1), when);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        OUT_LIT(c, ":1\r\n");
}

/* TTL and PTTL: -2 for an absent key, -1 for one without a deadline.
 * TTL rounds to the nearest second, as Redis does. */
void resp_cmd_ttl(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool ms = tolower(arg(m, 0)[0]) == 'p';
    uint64_t at, now;
    int rc = deadline_of(gw, arg(m, 1), arglen(m, 1), &at);

    if (rc == TERN_ENOENT) {
        OUT_LIT(c, ":-2\r\n");
    } else if (rc < 0) {
        resp_out_store_err(c, rc);
    } else if (!at) {
        OUT_LIT(c, ":-1\r\n");
    } else {
        now = kvs_now_ms();
        at = at > now ? at - now : 0;
        resp_out_num(c, ':', (long long)(ms ? at : (at + 500) / 1000));
    }
}

void resp_cmd_persist(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    uint64_t at;
    int rc = deadline_of(gw, arg(m, 1), arglen(m, 1), &at);

    if (rc == 0 && at)
        rc = set_deadline(gw, arg(m, 1), arglen(m, 1), 0);
    else if (rc == 0 || rc == TERN_ENOENT)
        rc = 1;         /* nothing to take away */
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', rc == 0);
}

/* SETEX key seconds value, PSETEX key milliseconds value. */
void resp_cmd_setex(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool ms = tolower(arg(m, 0)[0]) == 'p';
    long long v;
    uint64_t at;
    int rc;

    if (!resp_ll_parse(arg(m, 2), arglen(m, 2), &v)) {
        out_int_err(c);
        return;
    }
    if (v <= 0 || !to_deadline(v, ms ? 1 : 1000, true, &at)) {
        out_bad_time(c, ms ? "psetex" : "setex");
        return;
    }
    if (!resp_key_ok(c, arglen(m, 1)))
        return;
    rc = resp_coll_drop(gw, arg(m, 1), arglen(m, 1));
    if (rc == 0)
        rc = kvs_put_until(gw->store, arg(m, 1), arglen(m, 1), arg(m, 3), arglen(m, 3), at, 0,
                           NULL);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        OUT_LIT(c, "+OK\r\n");
}

int resp_set_deadline(struct client *c, const struct cmd *m, size_t from,
                      bool (*is_other)(const struct cmd *m, size_t i), uint64_t *at_ms,
                      bool *keep)
{
    static const struct {
        const char *word;
        long long unit;
        bool relative;
    } kinds[] = {{"EX", 1000, true}, {"PX", 1, true}, {"EXAT", 1000, false}, {"PXAT", 1, false}};
    unsigned given = 0;

    *at_ms = 0;
    *keep = false;
    for (size_t i = from; i < m->argc; i++) {
        size_t k;

        if (is_other && is_other(m, i))
            continue;
        if (arg_is(m, i, "KEEPTTL") || arg_is(m, i, "PERSIST")) {
            *keep = arg_is(m, i, "KEEPTTL");
            given++;
            continue;
        }
        for (k = 0; k < sizeof(kinds) / sizeof(kinds[0]) && !arg_is(m, i, kinds[k].word); k++)
            ;
        if (k == sizeof(kinds) / sizeof(kinds[0]) || i + 1 == m->argc) {
            OUT_LIT(c, "-ERR syntax error\r\n");
            return -1;
        }
        long long v;

        if (!resp_ll_parse(arg(m, i + 1), arglen(m, i + 1), &v)) {
            out_int_err(c);
            return -1;
        }
        if (v <= 0 || !to_deadline(v, kinds[k].unit, kinds[k].relative, at_ms)) {
            char name[16];

            snprintf(name, sizeof(name), "%.*s", (int)arglen(m, 0), arg(m, 0));
            for (char *p = name; *p; p++)
                *p = (char)tolower(*p);
            out_bad_time(c, name);
            return -1;
        }
        given++;
        i++;
    }
    if (given > 1) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return -1;
    }
    return 0;
}

/* GETEX key [EX s | PX ms | EXAT t | PXAT t | PERSIST]. */
void resp_cmd_getex(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const void *val;
    uint32_t len;
    uint64_t at;
    size_t start = resp_out_pending(c);
    bool keep;
    int rc;

    if (resp_set_deadline(c, m, 2, NULL, &at, &keep) < 0)
        return;
    if (keep) {                 /* KEEPTTL is SET's word, not GETEX's */
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);
    if (rc == TERN_ENOENT) {
        resp_out_null(c);
        return;
    }
    if (rc < 0) {
        resp_out_store_err(c, rc);
        return;
    }
    resp_out_bulk(c, val, len);   /* before the write, which may move it */
    if (m->argc > 2 && !c->over && !c->dead) {
        rc = kvs_set_expiry(gw->store, arg(m, 1), arglen(m, 1), at, 0, NULL);
        if (rc < 0) {
            c->out.len = c->out.off + start;
            resp_out_store_err(c, rc);
        }
    }
}

void resp_cmd_getdel(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const void *val;
    uint32_t len;
    size_t start = resp_out_pending(c);
    int rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);

    if (rc == TERN_ENOENT) {
        resp_out_null(c);
        return;
    }
    if (rc < 0) {
        resp_out_store_err(c, rc);
        return;
    }
    resp_out_bulk(c, val, len);
    if (c->over || c->dead)
        return;
    rc = kvs_del(gw->store, arg(m, 1), arglen(m, 1), 0, NULL);
    if (rc < 0) {
        c->out.len = c->out.off + start;     /* the value was not taken after all */
        resp_out_store_err(c, rc);
    }
}

void resp_cmd_type(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const void *val;
    uint32_t len;
    int rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);

    if (rc == 0) {
        OUT_LIT(c, "+string\r\n");
    } else if (rc == RESP_EWRONGTYPE) {
        struct kvc_coll *k = resp_coll_find(gw, arg(m, 1), arglen(m, 1));

        OUT_LIT(c, "+");
        resp_out_add(c, resp_coll_type_name(k->type), strlen(resp_coll_type_name(k->type)));
        OUT_LIT(c, "\r\n");
    } else if (rc == TERN_ENOENT)
        OUT_LIT(c, "+none\r\n");
    else
        resp_out_store_err(c, rc);
}

/* ---- SCAN and KEYS ---- */

/* Redis's glob (stringmatchlen): '*', '?', '[...]' with ranges and '^'
 * for "not", '\' quoting the next byte; binary-safe. One star is
 * backtracked to at a time, so a pattern of many stars costs
 * O(pattern x key), not an exponential search. */
static inline char fold(char ch, bool nocase)
{
    return nocase && ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch;
}

static bool class_match(const char **pp, const char *pe, char ch, bool nocase)
{
    const char *p = *pp + 1;
    bool neg = p < pe && *p == '^', hit = false;

    if (neg)
        p++;
    ch = fold(ch, nocase);
    for (; p < pe && *p != ']'; p++) {
        if (*p == '\\' && p + 1 < pe) {
            p++;
            hit |= fold(*p, nocase) == ch;
        } else if (p + 2 < pe && p[1] == '-' && p[2] != ']') {
            unsigned char lo = (unsigned char)fold(p[0], nocase), hi = (unsigned char)fold(p[2], nocase);

            if (lo > hi) {
                unsigned char t = lo;

                lo = hi;
                hi = t;
            }
            hit |= (unsigned char)ch >= lo && (unsigned char)ch <= hi;
            p += 2;
        } else {
            hit |= fold(*p, nocase) == ch;
        }
    }
    *pp = p < pe ? p : pe - 1;      /* on the ']' (or the last byte) */
    return hit != neg;
}

static bool glob(const char *pat, size_t plen, const char *s, size_t slen, bool nocase)
{
    const char *p = pat, *pe = pat + plen, *se = s + slen;
    const char *star = NULL, *resume = NULL;

    while (s < se) {
        if (p < pe && *p == '*') {
            while (p < pe && *p == '*')
                p++;
            if (p == pe)
                return true;
            star = p;
            resume = s;
            continue;
        }
        if (p < pe) {
            const char *q = p;
            bool ok;

            if (*q == '?') {
                ok = true;
            } else if (*q == '[') {
                ok = class_match(&q, pe, *s, nocase);
            } else if (*q == '\\' && q + 1 < pe) {
                q++;
                ok = fold(*q, nocase) == fold(*s, nocase);
            } else {
                ok = fold(*q, nocase) == fold(*s, nocase);
            }
            if (ok) {
                p = q + 1;
                s++;
                continue;
            }
        }
        if (!star)
            return false;
        p = star;
        s = ++resume;
    }
    while (p < pe && *p == '*')
        p++;
    return p == pe;
}

bool resp_glob(const char *pat, size_t plen, const char *s, size_t slen)
{
    return glob(pat, plen, s, slen, false);
}

bool resp_glob_nocase(const char *pat, size_t plen, const char *s, size_t slen)
{
    return glob(pat, plen, s, slen, true);
}

/* Keys gathered for a reply whose length comes first: "$len\r\nkey\r\n"
 * each, in the scratch buffer. */
struct gather {
    struct resp_gw *gw;
    struct client *c;
    const char *pat;
    size_t plen;
    int want;                   /* TYPE: 0 any, 'S' strings, a kvc_type, '?' none */
    size_t used, n, limit;
    bool failed;                /* out of memory or over the output cap */
};

static int gather_key(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                      uint64_t version)
{
    struct gather *g = arg;
    size_t need = klen + 26;
    char *p;

    (void)val, (void)len, (void)version;
    if ((g->want && g->want != 'S') || (g->pat && !resp_glob(g->pat, g->plen, key, klen)))
        return 0;
    if (g->used + need > g->limit) {
        g->failed = true;
        return 1;
    }
    if (g->used + need > g->gw->scratch_cap) {
        size_t cap = g->gw->scratch_cap ? g->gw->scratch_cap : 4096;

        while (cap < g->used + need)
            cap *= 2;
        p = realloc(g->gw->scratch, cap);
        if (!p) {
            g->failed = true;
            return 1;
        }
        g->gw->scratch = p;
        g->gw->scratch_cap = cap;
    }
    p = g->gw->scratch + g->used;
    p[0] = '$';
    need = 1 + resp_u64_text(p + 1, klen);
    memcpy(p + need, "\r\n", 2);
    memcpy(p + need + 2, key, klen);
    memcpy(p + need + 2 + klen, "\r\n", 2);
    g->used += need + 4 + klen;
    g->n++;
    return 0;
}

static void gather_coll(void *arg, struct kvc_coll *k)
{
    struct gather *g = arg;
    uint32_t klen;
    const void *key = kvc_key(k, &klen);
    int want = g->want;

    if (g->failed || (want && want != (int)k->type))
        return;
    g->want = 0;
    gather_key(g, key, klen, NULL, 0, 0);
    g->want = want;
}

/* TYPE's argument as gather.want. */
static int type_wanted(const struct cmd *m, size_t i)
{
    static const struct {
        const char *name;
        int want;
    } types[] = {{"string", 'S'}, {"list", KVC_LIST}, {"hash", KVC_HASH}, {"set", KVC_SET},
                 {"zset", KVC_ZSET}};

    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        if (arg_is(m, i, types[t].name))
            return types[t].want;
    return '?';
}

static void out_gathered(struct client *c, const struct gather *g)
{
    resp_out_num(c, '*', (long long)g->n);
    resp_out_add(c, g->gw->scratch, g->used);
}

static void gather_failed(struct resp_gw *gw, struct client *c)
{
    resp_out_err(c, "ERR reply exceeds the gateway's output limit of %zu bytes (or memory ran out)",
                 gw->max_output);
}

/* SCAN's cursor walks the strings (the store's cursor, kvs_scan), then
 * the collections (the engine's, with this bit set). Either keeps
 * Redis's promise: every key present for the whole scan comes back at
 * least once, however the tables grow or shrink meanwhile. */
#define SCAN_COLLS (1ull << 62)

/* SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]. */
void resp_cmd_scan(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct gather g = {.gw = gw, .c = c, .limit = gw->max_output};
    uint64_t cursor;
    long long count = 10;
    uint64_t next;
    char text[24];

    if (!resp_cursor_parse(c, arg(m, 1), arglen(m, 1), &cursor))
        return;
    for (size_t i = 2; i < m->argc; i += 2) {
        if (i + 1 == m->argc) {
            OUT_LIT(c, "-ERR syntax error\r\n");
            return;
        }
        if (arg_is(m, i, "MATCH")) {
            g.pat = arg(m, i + 1);
            g.plen = arglen(m, i + 1);
            if (g.plen == 1 && g.pat[0] == '*')
                g.pat = NULL;
        } else if (arg_is(m, i, "COUNT")) {
            if (!resp_ll_parse(arg(m, i + 1), arglen(m, i + 1), &count)) {
                out_int_err(c);
                return;
            }
            if (count < 1) {
                OUT_LIT(c, "-ERR syntax error\r\n");
                return;
            }
        } else if (arg_is(m, i, "TYPE")) {
            g.want = type_wanted(m, i + 1);
        } else {
            OUT_LIT(c, "-ERR syntax error\r\n");
            return;
        }
    }
    if (count > 100000)
        count = 100000;         /* one reply stays small; the cursor goes on */
    if (cursor & SCAN_COLLS) {
        next = gw->coll ? kvc_scan(gw->coll, cursor & ~SCAN_COLLS, (unsigned)count, gather_coll, &g)
                        : 0;
        if (next)
            next |= SCAN_COLLS;
    } else {
        kvs_scan(gw->store, cursor, (unsigned)count, gather_key, &g, &next);
        if (!next && gw->coll && kvc_count(gw->coll))
            next = SCAN_COLLS;
    }
    if (g.failed) {
        gather_failed(gw, c);
        return;
    }
    OUT_LIT(c, "*2\r\n");
    resp_out_bulk(c, text, resp_u64_text(text, next));
    out_gathered(c, &g);
}

void resp_cmd_keys(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct gather g = {.gw = gw, .c = c, .pat = arg(m, 1), .plen = arglen(m, 1),
                       .limit = gw->max_output};
    uint64_t cursor = 0;

    if (g.plen == 1 && g.pat[0] == '*')
        g.pat = NULL;
    do
        kvs_scan(gw->store, cursor, 1024, gather_key, &g, &cursor);
    while (cursor && !g.failed);
    while (gw->coll && !g.failed && (cursor = kvc_scan(gw->coll, cursor, 1024, gather_coll, &g)))
        ;
    if (g.failed)
        gather_failed(gw, c);
    else
        out_gathered(c, &g);
}

struct first {
    struct client *c;
    bool found;
};

static int first_key(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                     uint64_t version)
{
    struct first *f = arg;

    (void)val, (void)len, (void)version;
    resp_out_bulk(f->c, key, klen);
    f->found = true;
    return 1;
}

/* A random bucket's first key: buckets are picked at random, keys within
 * one are not (as Redis picks a random bucket, then a random key). */
void resp_cmd_randomkey(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    struct first f = {.c = c};
    uint64_t next;

    (void)m;
    /* A collection, in proportion to how many keys are collections. */
    if (gw->coll && kvc_count(gw->coll) &&
        (uint64_t)random() % (kvs_count(gw->store) + kvc_count(gw->coll)) >= kvs_count(gw->store)) {
        struct kvc_coll *k = kvc_random(gw->coll);

        if (k) {
            uint32_t klen;
            const void *key = kvc_key(k, &klen);

            resp_out_bulk(c, key, klen);
            return;
        }
    }
    for (unsigned tries = 0; tries < 64 && !f.found && kvs_count(gw->store); tries++) {
        uint64_t cursor = ((uint64_t)random() << 33) ^ ((uint64_t)random() << 2) ^
                          (uint64_t)random();

        kvs_scan(gw->store, cursor, 1, first_key, &f, &next);
    }
    /* Many tombstones and expired keys: walk from the start instead. */
    for (uint64_t cursor = 0; !f.found && kvs_count(gw->store);) {
        kvs_scan(gw->store, cursor, 1024, first_key, &f, &cursor);
        if (!cursor)
            break;
    }
    if (!f.found)
        resp_out_null(c);
}

/* ---- rewriting values ---- */

/* Write key = val, keeping the deadline `at` (0: none). */
static int put_keep(struct resp_gw *gw, const char *key, size_t klen, const void *val,
                    size_t len, uint64_t at)
{
    return kvs_put_until(gw->store, key, klen, val, len, at, 0, NULL);
}

/* RENAME of a collection: its head moves, its elements stay (they are
 * named by generation). Whatever the new key held goes. */
static void rename_coll(struct resp_gw *gw, struct client *c, const struct cmd *m, bool nx)
{
    struct kvc_coll *k = resp_coll_find(gw, arg(m, 1), arglen(m, 1)), *old;
    uint64_t dummy;
    int rc;

    if (arglen(m, 2) == 0 || arglen(m, 2) > KVC_KEY_MAX) {
        resp_key_ok(c, arglen(m, 2) ? KV_KEY_MAX + 1 : 0);
        return;
    }
    if (arglen(m, 1) == arglen(m, 2) && memcmp(arg(m, 1), arg(m, 2), arglen(m, 1)) == 0) {
        if (nx)
            OUT_LIT(c, ":0\r\n");
        else
            OUT_LIT(c, "+OK\r\n");
        return;
    }
    if (nx && deadline_of(gw, arg(m, 2), arglen(m, 2), &dummy) == 0) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    rc = kvs_del(gw->store, arg(m, 2), arglen(m, 2), 0, NULL);
    if (rc == 0 || rc == TERN_ENOENT)
        rc = (old = resp_coll_find(gw, arg(m, 2), arglen(m, 2))) ? kvc_delete(gw->coll, old) : 0;
    if (rc == 0)
        rc = kvc_rename(gw->coll, k, arg(m, 2), arglen(m, 2));
    if (rc < 0)
        resp_out_store_err(c, rc);
    else if (nx)
        OUT_LIT(c, ":1\r\n");
    else
        OUT_LIT(c, "+OK\r\n");
}

/* RENAME key newkey, RENAMENX key newkey: the value and its deadline
 * move together; both writes go in the batch's one commit. */
void resp_cmd_rename(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool nx = arglen(m, 0) == 8;
    const void *val;
    uint32_t len;
    uint64_t at, dummy;
    char *copy;
    int rc = deadline_of(gw, arg(m, 1), arglen(m, 1), &at);

    if (rc == TERN_ENOENT) {
        OUT_LIT(c, "-ERR no such key\r\n");
        return;
    }
    if (rc == 0)
        rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);
    if (rc == RESP_EWRONGTYPE) {
        rename_coll(gw, c, m, nx);
        return;
    }
    if (rc < 0) {
        resp_out_store_err(c, rc);
        return;
    }
    if (!resp_key_ok(c, arglen(m, 2)))
        return;
    if (nx && deadline_of(gw, arg(m, 2), arglen(m, 2), &dummy) == 0) {
        OUT_LIT(c, ":0\r\n");
        return;
    }
    if (arglen(m, 1) == arglen(m, 2) && memcmp(arg(m, 1), arg(m, 2), arglen(m, 1)) == 0) {
        if (nx)
            OUT_LIT(c, ":0\r\n");
        else
            OUT_LIT(c, "+OK\r\n");
        return;
    }
    copy = scratch(gw, c, len ? len : 1);
    if (!copy)
        return;
    memcpy(copy, val, len);
    rc = resp_coll_drop(gw, arg(m, 2), arglen(m, 2));
    if (rc == 0)
        rc = put_keep(gw, arg(m, 2), arglen(m, 2), copy, len, at);
    if (rc == 0)
        rc = kvs_del(gw->store, arg(m, 1), arglen(m, 1), 0, NULL);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else if (nx)
        OUT_LIT(c, ":1\r\n");
    else
        OUT_LIT(c, "+OK\r\n");
}

/* The old value, copied to scratch with room for `extra` more bytes
 * after it: 0 (also for an absent key: *len 0), or -1 after an error
 * reply. */
static int value_copy(struct resp_gw *gw, struct client *c, const struct cmd *m, size_t extra,
                      char **buf, uint32_t *len, uint64_t *at)
{
    const void *val;
    int rc;

    *len = 0;
    *at = 0;
    if (!resp_key_ok(c, arglen(m, 1)))
        return -1;
    rc = deadline_of(gw, arg(m, 1), arglen(m, 1), at);
    if (rc == 0)
        rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, len);
    if (rc < 0 && rc != TERN_ENOENT) {
        resp_out_store_err(c, rc);
        return -1;
    }
    if ((size_t)*len + extra > kvs_val_max(gw->store, arglen(m, 1)) - (*at ? 8 : 0)) {
        resp_out_store_err(c, TERN_E2BIG);
        return -1;
    }
    *buf = scratch(gw, c, (size_t)*len + extra + 1);
    if (!*buf)
        return -1;
    if (rc == 0)
        memcpy(*buf, val, *len);
    return 0;
}

void resp_cmd_append(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    uint32_t len;
    uint64_t at;
    char *buf;
    int rc;

    if (value_copy(gw, c, m, arglen(m, 2), &buf, &len, &at) < 0)
        return;
    memcpy(buf + len, arg(m, 2), arglen(m, 2));
    rc = put_keep(gw, arg(m, 1), arglen(m, 1), buf, len + arglen(m, 2), at);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', (long long)(len + arglen(m, 2)));
}

void resp_cmd_strlen(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const void *val;
    uint32_t len = 0;
    int rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);

    if (rc < 0 && rc != TERN_ENOENT)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', rc == 0 ? (long long)len : 0);
}

/* GETRANGE key start end: inclusive, negative counting from the end. */
void resp_cmd_getrange(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const void *val;
    uint32_t len = 0;
    long long a, b;
    int rc;

    if (!resp_ll_parse(arg(m, 2), arglen(m, 2), &a) ||
        !resp_ll_parse(arg(m, 3), arglen(m, 3), &b)) {
        out_int_err(c);
        return;
    }
    rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);
    if (rc < 0 && rc != TERN_ENOENT) {
        resp_out_store_err(c, rc);
        return;
    }
    if (a < 0 && b < 0 && a > b) {
        OUT_LIT(c, "$0\r\n\r\n");
        return;
    }
    if (a < 0)
        a += len;
    if (b < 0)
        b += len;
    if (a < 0)
        a = 0;
    if (b < 0)
        b = 0;
    if (b >= (long long)len)
        b = (long long)len - 1;
    if (!len || a > b) {
        OUT_LIT(c, "$0\r\n\r\n");
        return;
    }
    resp_out_bulk(c, (const char *)val + a, (size_t)(b - a + 1));
}

/* SETRANGE key offset value: zeros fill any gap; the new length back. */
void resp_cmd_setrange(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    size_t n = arglen(m, 3);
    long long off;
    uint32_t len;
    uint64_t at;
    size_t end;
    char *buf;
    int rc;

    if (!resp_ll_parse(arg(m, 2), arglen(m, 2), &off)) {
        out_int_err(c);
        return;
    }
    if (off < 0) {
        OUT_LIT(c, "-ERR offset is out of range\r\n");
        return;
    }
    if ((unsigned long long)off + n > STRING_MAX) {
        OUT_LIT(c, "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n");
        return;
    }
    if (n == 0) {               /* nothing written: the length as it is */
        const void *val;

        len = 0;
        rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);
        if (rc < 0 && rc != TERN_ENOENT)
            resp_out_store_err(c, rc);
        else
            resp_out_num(c, ':', (long long)len);
        return;
    }
    if (value_copy(gw, c, m, (size_t)off + n, &buf, &len, &at) < 0)
        return;
    end = (size_t)off + n > len ? (size_t)off + n : len;
    if ((size_t)off > len)
        memset(buf + len, 0, (size_t)off - len);
    memcpy(buf + off, arg(m, 3), n);
    rc = put_keep(gw, arg(m, 1), arglen(m, 1), buf, end, at);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', (long long)end);
}

/* MSETNX: all the keys are set, or none if any exists. */
void resp_cmd_msetnx(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    if (m->argc % 2 == 0) {
        OUT_LIT(c, "-ERR wrong number of arguments for 'msetnx' command\r\n");
        return;
    }
    for (size_t i = 1; i < m->argc; i += 2) {
        const void *val;
        uint32_t len;

        if (!resp_key_ok(c, arglen(m, i)))
            return;
        if (arglen(m, i + 1) > kvs_val_max(gw->store, arglen(m, i))) {
            resp_out_store_err(c, TERN_E2BIG);
            return;
        }
        int rc = resp_lookup(gw, arg(m, i), arglen(m, i), &val, &len);

        if (rc == 0 || rc == RESP_EWRONGTYPE) {
            OUT_LIT(c, ":0\r\n");
            return;
        }
    }
    for (size_t i = 1; i < m->argc; i += 2) {
        int rc = kvs_put(gw->store, arg(m, i), arglen(m, i), arg(m, i + 1), arglen(m, i + 1),
                         0, NULL);

        if (rc < 0) {
            resp_out_store_err(c, rc);
            return;
        }
    }
    OUT_LIT(c, ":1\r\n");
}

/* ---- active expiry ---- */

void resp_expire_cycle(struct resp_gw *gw, uint64_t now_ns)
{
    unsigned n;

    if (now_ns < gw->next_expire_ns)
        return;
    resp_admin_sample(gw, now_ns);
    n = kvs_expire(gw->store, kvs_now_ms(), EXPIRE_BATCH);
    gw->expired += n;
    if (gw->coll) {
        unsigned k = kvc_expire(gw->coll, kvs_now_ms(), EXPIRE_BATCH);

        gw->expired += k;
        n = n > k ? n : k;
    }
    /* A full batch: more are due; come back at the next poll. */
    gw->next_expire_ns = n == EXPIRE_BATCH ? 0 : now_ns + EXPIRE_EVERY_NS;
}
