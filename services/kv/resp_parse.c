/* RESP2 request parsing: see resp_parse.h. */
#include "resp_parse.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A length line holds at most this many digits; more cannot be a length
 * the gateway accepts and would overflow the accumulator. */
#define NUM_DIGITS_MAX 18

/* The smallest element, `$0\r\n\r\n`, bounds how many a request can hold. */
#define MIN_ELEMENT 6

/* An argument array this large came from one unusual command; give the
 * memory back rather than keep it for the client's lifetime. */
#define ARGV_KEEP_MAX 65536

void resp_parser_init(struct resp_parser *p, size_t max_request)
{
    memset(p, 0, sizeof(*p));
    p->max_request = max_request;
    p->left = -1;
}

void resp_parser_free(struct resp_parser *p)
{
    free(p->argv);
    p->argv = NULL;
    p->argv_cap = 0;
}

void resp_parser_reset(struct resp_parser *p)
{
    p->pos = 0;
    p->need = 0;
    p->left = -1;
    p->argc = 0;
    p->error = NULL;
    if (p->argv_cap > ARGV_KEEP_MAX)
        resp_parser_free(p);
}

static enum resp_status fail(struct resp_parser *p, const char *why)
{
    p->error = why;
    return RESP_ERROR;
}

static enum resp_status more(struct resp_parser *p, size_t need)
{
    p->need = need;
    return RESP_MORE;
}

static bool push_arg(struct resp_parser *p, size_t off, size_t len)
{
    if (p->argc == p->argv_cap) {
        size_t cap = p->argv_cap ? p->argv_cap * 2 : 16;
        struct resp_arg *a = realloc(p->argv, cap * sizeof(*a));

        if (!a)
            return false;
        p->argv = a;
        p->argv_cap = cap;
    }
    p->argv[p->argc].off = off;
    p->argv[p->argc].len = len;
    p->argc++;
    return true;
}

/* The number after a type byte, up to its CRLF: 1 with *v and *used (bytes
 * including the CRLF) set, 0 if the line is incomplete so far, -1 if it is
 * not a number followed by CRLF. */
static int parse_num_line(const char *s, size_t avail, long long *v, size_t *used)
{
    size_t i = 0, digits;
    long long n = 0;
    bool neg = false;

    if (avail > 0 && s[0] == '-') {
        neg = true;
        i++;
    }
    digits = i;
    for (; i < avail && s[i] >= '0' && s[i] <= '9'; i++) {
        if (i - digits == NUM_DIGITS_MAX)
            return -1;
        n = n * 10 + (s[i] - '0');
    }
    if (i == avail)
        return 0;
    if (i == digits || s[i] != '\r')
        return -1;
    if (i + 1 == avail)
        return 0;
    if (s[i + 1] != '\n')
        return -1;
    *v = neg ? -n : n;
    *used = i + 2;
    return 1;
}

static bool is_blank(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* A line as telnet or `redis-cli` in a pipe sends it. Quotes are not
 * interpreted: an argument is a run of non-blank bytes. */
static enum resp_status parse_inline(struct resp_parser *p, const char *buf, size_t len)
{
    size_t limit = p->max_request < RESP_INLINE_MAX ? p->max_request : RESP_INLINE_MAX;
    const char *nl = memchr(buf, '\n', len < limit ? len : limit);
    size_t end, i = 0;

    if (!nl)
        return len >= limit ? fail(p, "too big inline request") : more(p, len + 1);
    end = (size_t)(nl - buf);
    while (i < end) {
        size_t start;

        while (i < end && is_blank(buf[i]))
            i++;
        if (i == end)
            break;
        start = i;
        while (i < end && !is_blank(buf[i]))
            i++;
        if (!push_arg(p, start, i - start))
            return RESP_NOMEM;
    }
    p->pos = end + 1;
    return RESP_CMD;
}

/* `*N\r\n`. Like Redis, N <= 0 is an empty command that gets no reply. */
static enum resp_status parse_header(struct resp_parser *p, const char *buf, size_t len)
{
    long long n;
    size_t used;
    int rc = parse_num_line(buf + 1, len - 1, &n, &used);

    if (rc == 0)
        return more(p, len + 1);
    if (rc < 0 || (n > 0 && (unsigned long long)n > p->max_request / MIN_ELEMENT))
        return fail(p, "invalid multibulk length");
    p->pos = 1 + used;
    if (n <= 0)
        return RESP_CMD;
    p->left = n;
    return RESP_MORE;
}

static enum resp_status parse_bulks(struct resp_parser *p, const char *buf, size_t len)
{
    while (p->left > 0) {
        size_t at = p->pos, used, data, end;
        long long n;
        int rc;

        if (at >= len)
            return more(p, at + 1);
        if (buf[at] != '$') {
            unsigned char ch = (unsigned char)buf[at];

            if (ch >= 0x20 && ch < 0x7f)
                snprintf(p->error_buf, sizeof(p->error_buf), "expected '$', got '%c'", ch);
            else
                snprintf(p->error_buf, sizeof(p->error_buf), "expected '$', got byte 0x%02x",
                         ch);
            return fail(p, p->error_buf);
        }
        rc = parse_num_line(buf + at + 1, len - at - 1, &n, &used);
        if (rc == 0)
            return more(p, len + 1);
        if (rc < 0 || n < 0 || (unsigned long long)n > p->max_request)
            return fail(p, "invalid bulk length");
        data = at + 1 + used;
        end = data + (size_t)n + 2;
        if (end > p->max_request)
            return fail(p, "request too large");
        if (len < end)
            return more(p, end);
        if (buf[end - 2] != '\r' || buf[end - 1] != '\n')
            return fail(p, "expected CRLF after bulk data");
        if (!push_arg(p, data, (size_t)n))
            return RESP_NOMEM;
        p->pos = end;
        p->left--;
    }
    return RESP_CMD;
}

enum resp_status resp_parse(struct resp_parser *p, const char *buf, size_t len)
{
    if (p->left < 0) {
        enum resp_status rc;

        if (len == 0)
            return more(p, 1);
        if (buf[0] != '*')
            return parse_inline(p, buf, len);
        rc = parse_header(p, buf, len);
        if (rc != RESP_MORE || p->left < 0)
            return rc;
    }
    return parse_bulks(p, buf, len);
}
