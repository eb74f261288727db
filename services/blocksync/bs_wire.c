/* Decoders of the block-sync messages (bs_wire.h). */
#include "bs_wire.h"

#include <string.h>

#include "error.h"

static const char *const refusals[BS_R_MAX] = {
    [BS_OK] = "ok",
    [BS_R_CHAIN] = "wrong chain",
    [BS_R_FORKED] = "forked",
    [BS_R_UNLINKABLE] = "unlinkable",
    [BS_R_INVALID] = "validation failed",
    [BS_R_SELF] = "self",
    [BS_R_DUPLICATE] = "duplicate",
    [BS_R_VERSION] = "protocol version",
};

const char *bs_refusal_name(unsigned r)
{
    return r < BS_R_MAX ? refusals[r] : "unknown refusal";
}

static int bad(const char **why, const char *what)
{
    *why = what;
    return TERN_EPROTO;
}

static int hello_check(const struct bs_hello *h, const char **why)
{
    if (h->flags)
        return bad(why, "hello: unknown flags");
    if (h->lib > h->head)
        return bad(why, "hello: irreversible past the head");
    return 0;
}

int bs_hello_decode(const void *p, size_t len, struct bs_hello *out, const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "hello: wrong length");
    memcpy(out, p, sizeof(*out));
    return hello_check(out, why);
}

int bs_hello_rep_decode(const void *p, size_t len, struct bs_hello_rep *out, const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "hello reply: wrong length");
    memcpy(out, p, sizeof(*out));
    if (out->refusal >= BS_R_MAX || out->reserved)
        return bad(why, "hello reply: unknown refusal");
    return hello_check(&out->hello, why);
}

int bs_headers_req_decode(const void *p, size_t len, struct bs_headers_req *out,
                          const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "headers request: wrong length");
    memcpy(out, p, sizeof(*out));
    if (out->reserved)
        return bad(why, "headers request: reserved bytes set");
    if (out->from > UINT64_MAX - out->max)
        return bad(why, "headers request: heights overflow");
    return 0;
}

int bs_headers_rep_decode(const void *p, size_t len, struct bs_headers_rep *out,
                          const uint8_t **hdrs, const char **why)
{
    if (len < sizeof(*out))
        return bad(why, "headers reply: too short");
    memcpy(out, p, sizeof(*out));
    if (out->reserved)
        return bad(why, "headers reply: reserved bytes set");
    if ((uint64_t)out->n * BS_HDR_SIZE != len - sizeof(*out))
        return bad(why, "headers reply: count and length disagree");
    if (out->from > UINT64_MAX - out->n)
        return bad(why, "headers reply: heights overflow");
    *hdrs = (const uint8_t *)p + sizeof(*out);
    return 0;
}

int bs_range_req_decode(const void *p, size_t len, struct bs_range_req *out, const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "range request: wrong length");
    memcpy(out, p, sizeof(*out));
    if (out->from >= out->to)
        return bad(why, "range request: empty or reversed range");
    if (out->flags & ~(uint32_t)BS_RANGE_PUT)
        return bad(why, "range request: unknown flags");
    if (!out->max)
        return bad(why, "range request: asks for no bytes");
    if ((out->flags & BS_RANGE_PUT) &&
        (out->roff > out->dst.len || out->max > out->dst.len - out->roff))
        return bad(why, "range request: put outside its buffer");
    return 0;
}

int bs_range_rep_decode(const void *p, size_t len, struct bs_range_rep *out,
                        const uint8_t **bytes, const char **why)
{
    if (len < sizeof(*out))
        return bad(why, "range reply: too short");
    memcpy(out, p, sizeof(*out));
    if (out->flags & ~(uint32_t)BS_RANGE_PUT)
        return bad(why, "range reply: unknown flags");
    if (out->off > out->span_len || out->n > out->span_len - out->off)
        return bad(why, "range reply: bytes past the span");
    if (out->flags & BS_RANGE_PUT) {
        if (len != sizeof(*out))
            return bad(why, "range reply: put and inline at once");
        *bytes = NULL;
    } else {
        if (len - sizeof(*out) != out->n)
            return bad(why, "range reply: count and length disagree");
        *bytes = (const uint8_t *)p + sizeof(*out);
    }
    return 0;
}

int bs_append_req_decode(const void *p, size_t len, struct bs_append_req *out,
                         const uint8_t **block, size_t *block_len, const char **why)
{
    if (len < sizeof(*out))
        return bad(why, "append: too short");
    memcpy(out, p, sizeof(*out));
    if (out->flags || out->reserved)
        return bad(why, "append: unknown flags");
    *block = (const uint8_t *)p + sizeof(*out);
    *block_len = len - sizeof(*out);
    return 0;
}

int bs_append_rep_decode(const void *p, size_t len, struct bs_append_rep *out,
                         const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "append reply: wrong length");
    memcpy(out, p, sizeof(*out));
    if (out->reserved || (out->verdict > BS_BAD_MERKLE && out->verdict != BS_APPEND_MALFORMED))
        return bad(why, "append reply: unknown verdict");
    return 0;
}

int bs_info_decode(const void *p, size_t len, struct bs_info *out, const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "info: wrong length");
    memcpy(out, p, sizeof(*out));
    if (out->irreversible > out->committed || out->data_used > out->data_cap)
        return bad(why, "info: heights or sizes do not add up");
    return 0;
}

int bs_sub_req_decode(const void *p, size_t len, struct bs_sub_req *out, const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "subscribe: wrong length");
    memcpy(out, p, sizeof(*out));
    if (out->from > BS_FROM_LATEST)
        return bad(why, "subscribe: unknown start");
    if (out->flags & ~(uint32_t)BS_SUB_HEADERS)
        return bad(why, "subscribe: unknown flags");
    return 0;
}

int bs_sub_rep_decode(const void *p, size_t len, struct bs_sub_rep *out, const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "subscribe reply: wrong length");
    memcpy(out, p, sizeof(*out));
    if (out->reserved || (out->refusal != BS_OK && out->refusal != BS_R_FORKED))
        return bad(why, "subscribe reply: unknown refusal");
    return 0;
}

int bs_feed_req_decode(const void *p, size_t len, struct bs_feed_req *out, const char **why)
{
    if (len != sizeof(*out))
        return bad(why, "feed: wrong length");
    memcpy(out, p, sizeof(*out));
    if (!out->credits || !out->max_bytes)
        return bad(why, "feed: no credit");
    return 0;
}

int bs_feed_rep_decode(const void *p, size_t len, struct bs_feed_rep *out,
                       int (*fn)(void *arg, uint64_t height, const uint8_t *rec, size_t rec_len),
                       void *arg, const char **why)
{
    const uint8_t *at = (const uint8_t *)p + sizeof(*out), *end = (const uint8_t *)p + len;

    if (len < sizeof(*out))
        return bad(why, "feed reply: too short");
    memcpy(out, p, sizeof(*out));
    if (out->reserved || (out->refusal != BS_OK && out->refusal != BS_R_FORKED) ||
        (out->flags & ~(uint32_t)BS_SUB_HEADERS))
        return bad(why, "feed reply: unknown flags or refusal");
    if (out->refusal != BS_OK && out->n)
        return bad(why, "feed reply: refused with blocks");
    if (out->n && (out->next > out->head || out->n > out->head - out->next))
        return bad(why, "feed reply: blocks past the head");
    for (uint32_t i = 0; i < out->n; i++) {
        size_t n;
        int rc;

        if (out->flags & BS_SUB_HEADERS) {
            n = BS_HDR_SIZE;
        } else {
            uint32_t l;
            if ((size_t)(end - at) < 4)
                return bad(why, "feed reply: cut short");
            memcpy(&l, at, 4);
            at += 4;
            n = l;
        }
        if ((size_t)(end - at) < n)
            return bad(why, "feed reply: cut short");
        if (fn && (rc = fn(arg, out->next + i, at, n)) < 0)
            return rc;
        at += n;
    }
    if (at != end)
        return bad(why, "feed reply: bytes past its blocks");
    return 0;
}
