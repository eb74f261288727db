/* The RESP gateway's replies and numbers; see resp_internal.h. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp_internal.h"

/* ---- numbers ---- */

size_t resp_u64_text(char *dst, unsigned long long v)
{
    char tmp[20];
    size_t n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        dst[i] = tmp[n - 1 - i];
    return n;
}

size_t resp_ll_text(char *dst, long long v)
{
    if (v >= 0)
        return resp_u64_text(dst, (unsigned long long)v);
    dst[0] = '-';
    return 1 + resp_u64_text(dst + 1, 0ull - (unsigned long long)v);
}

/* A decimal int64 exactly as Redis accepts it: no blanks, no '+', no
 * leading zeros, no "-0". */
bool resp_ll_parse(const char *s, size_t n, long long *out)
{
    unsigned long long v = 0, limit;
    bool neg = false;
    size_t i = 0;

    if (n == 0 || n > 20)
        return false;
    if (n == 1 && s[0] == '0') {
        *out = 0;
        return true;
    }
    if (s[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == n || s[i] < '1' || s[i] > '9')
        return false;
    limit = neg ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX;
    for (; i < n; i++) {
        unsigned d;

        if (s[i] < '0' || s[i] > '9')
            return false;
        d = (unsigned)(s[i] - '0');
        if (v > (limit - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = neg ? (long long)(0ull - v) : (long long)v;
    return true;
}

/* ---- output ---- */

/* Room for n more bytes of output; NULL (and the client is dropped) if
 * memory runs out, or (c->over) if a capped reply would take the output
 * past max_output. */
char *resp_out_reserve(struct client *c, size_t n)
{
    struct buf *b = &c->out;
    size_t cap;
    char *p;

    if (c->capped && (c->over || b->len - b->off + n > c->gw->max_output)) {
        c->over = true;
        return NULL;
    }
    if (b->cap - b->len >= n)
        return b->p + b->len;
    if (b->off > 0) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->cap - b->len >= n)
            return b->p + b->len;
    }
    cap = b->cap ? b->cap : OUT_INITIAL;
    while (cap - b->len < n)
        cap *= 2;
    p = realloc(b->p, cap);
    if (!p) {
        c->dead = true;
        return NULL;
    }
    b->p = p;
    b->cap = cap;
    if (cap > c->gw->out_peak)
        c->gw->out_peak = cap;
    return b->p + b->len;
}

void resp_out_add(struct client *c, const void *s, size_t n)
{
    char *p = n ? resp_out_reserve(c, n) : NULL;   /* s may be NULL when n is 0 */

    if (p) {
        memcpy(p, s, n);
        c->out.len += n;
    }
}

/* ":v\r\n", "*v\r\n" or "$v\r\n". */
void resp_out_num(struct client *c, char type, long long v)
{
    char *p = resp_out_reserve(c, 24);
    size_t n;

    if (!p)
        return;
    p[0] = type;
    n = 1 + resp_ll_text(p + 1, v);
    p[n++] = '\r';
    p[n++] = '\n';
    c->out.len += n;
}

void resp_out_bulk(struct client *c, const void *data, size_t len)
{
    char *p = resp_out_reserve(c, len + 26);
    size_t n;

    if (!p)
        return;
    p[0] = '$';
    n = 1 + resp_u64_text(p + 1, len);
    p[n++] = '\r';
    p[n++] = '\n';
    if (len)
        memcpy(p + n, data, len);
    n += len;
    p[n++] = '\r';
    p[n++] = '\n';
    c->out.len += n;
}

void resp_out_null(struct client *c)
{
    OUT_LIT(c, "$-1\r\n");
}

/* "-<text>\r\n". The text may quote what the client sent, so line breaks
 * in it become blanks: they would end the error early. */
void resp_out_err(struct client *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(line))
        n = sizeof(line) - 1;
    for (int i = 0; i < n; i++)
        if (line[i] == '\r' || line[i] == '\n')
            line[i] = ' ';
    OUT_LIT(c, "-");
    resp_out_add(c, line, (size_t)n);
    OUT_LIT(c, "\r\n");
}

void resp_out_store_err(struct client *c, int rc)
{
    if (rc == RESP_EWRONGTYPE)
        OUT_LIT(c, "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
    else if (rc == TERN_E2BIG)
        OUT_LIT(c, "-ERR value too large for the store\r\n");
    else if (rc == TERN_ENOSPC)
        OUT_LIT(c, "-OOM pool is full\r\n");
    else
        resp_out_err(c, "ERR %s", tern_strerror(rc));
}

size_t resp_out_pending(const struct client *c)
{
    return c->out.len - c->out.off;
}

/* ---- store access ---- */

/* A key the store can hold; otherwise the client gets an error. */
bool resp_key_ok(struct client *c, size_t klen)
{
    if (klen == 0) {
        OUT_LIT(c, "-ERR empty keys are not supported\r\n");
        return false;
    }
    if (klen > KV_KEY_MAX) {
        OUT_LIT(c, "-ERR key too large for the store\r\n");
        return false;
    }
    return true;
}

/* A key the store cannot hold cannot be in it: no need to ask. */
int resp_lookup(struct resp_gw *gw, const char *key, size_t klen, const void **val,
                  uint32_t *len)
{
    uint64_t version;
    int rc;

    if (klen == 0 || klen > KV_KEY_MAX)
        return TERN_ENOENT;
    rc = kvs_get(gw->store, key, klen, val, len, &version);
    if (rc == TERN_ENOENT && gw->coll && resp_coll_find(gw, key, klen))
        return RESP_EWRONGTYPE;
    return rc;
}

void resp_out_lines(struct client *c, const char *const *lines, size_t n)
{
    resp_out_num(c, '*', (long long)n);
    for (size_t i = 0; i < n; i++) {
        OUT_LIT(c, "+");
        resp_out_add(c, lines[i], strlen(lines[i]));
        OUT_LIT(c, "\r\n");
    }
}

void resp_out_str(struct client *c, const char *s)
{
    resp_out_bulk(c, s, strlen(s));
}
