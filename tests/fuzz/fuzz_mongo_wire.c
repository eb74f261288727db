/* The MongoDB wire decoder (services/doc/mongo_wire.c) on a client's byte
 * stream: mongo_frame cuts it into messages and mongo_parse decodes each,
 * as the gateway (mongo_gw.c) does. Input: a limit index (which
 * max_request), a count of read sizes, the sizes, then the stream.
 *
 * The stream is framed twice, whole and as it would arrive in reads of
 * the fuzzer's sizes (framing again after each read, with the consumed
 * bytes dropped from the front); both must find the same messages and end
 * the same way. Whatever the bytes, a parsed message must only point
 * inside itself (body, sequences and their identifiers), every document
 * in it must be sound BSON no deeper than MONGO_MAX_DEPTH, a reply to it
 * must parse back to the same body, and an error must carry a code and an
 * errmsg a client can decode (UTF-8). */
#include <bson/bson.h>

#include "doc_err.h"
#include "fuzz.h"
#include "mongo_wire.h"

#define MAX_MSGS 64

struct outcome {
    unsigned n_msgs;
    uint64_t digest;            /* of every message's bytes and its parse result */
    long last;                  /* what ended the framing: 0 (more) or <0 */
};

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;

    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static bool inside(const void *p, size_t n, const uint8_t *msg, size_t len)
{
    const uint8_t *b = p;

    return b >= msg && b <= msg + len && n <= (size_t)(msg + len - b);
}

/* Depth of a sound document, counted by recursion: the harness's own
 * stack is fine with MONGO_MAX_DEPTH levels. */
static int depth_of(const bson_t *d)
{
    bson_iter_t it;
    int max = 0;

    FZ_CHECK(bson_iter_init(&it, d), "a parsed document does not iterate");
    while (bson_iter_next(&it)) {
        if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
            const uint8_t *data;
            uint32_t len;
            bson_t sub;
            int k;

            if (BSON_ITER_HOLDS_DOCUMENT(&it))
                bson_iter_document(&it, &len, &data);
            else
                bson_iter_array(&it, &len, &data);
            FZ_CHECK(bson_init_static(&sub, data, len), "bad embedded document \"%s\" of %u bytes",
                     bson_iter_key(&it), len);
            k = 1 + depth_of(&sub);
            if (k > max)
                max = k;
        }
    }
    return max;
}

static void check_doc(const bson_t *d)
{
    size_t off;

    FZ_CHECK(bson_validate(d, BSON_VALIDATE_NONE, &off), "a parsed document is not valid");
    FZ_CHECK(d->len <= MONGO_MAX_BSON_INTERNAL, "a document of %u bytes", d->len);
    FZ_CHECK(depth_of(d) < MONGO_MAX_DEPTH, "a document deeper than %d", MONGO_MAX_DEPTH);
}

static void check_parsed(const uint8_t *msg, size_t len, const struct mongo_msg *m)
{
    static uint8_t out[MONGO_HDR_LEN + 5 + MONGO_MAX_BSON_INTERNAL];
    struct mongo_msg back;
    struct doc_err e = {0};
    size_t n;

    FZ_CHECK(inside(bson_get_data(&m->body), m->body.len, msg, len), "body outside the message");
    check_doc(&m->body);
    FZ_CHECK(m->nseq <= MONGO_MAX_SECTIONS, "%u sequences", m->nseq);
    FZ_CHECK(m->legacy == (m->h.op == MONGO_OP_QUERY), "legacy %d for op %d", m->legacy,
             m->h.op);
    for (unsigned i = 0; i < m->nseq; i++) {
        const struct doc_seq *s = &m->seqs[i];
        bson_reader_t *r;
        const bson_t *d;
        bool eof = false;

        FZ_CHECK(inside(s->id, s->id_len + 1, msg, len) && s->id[s->id_len] == 0 &&
                     strlen(s->id) == s->id_len,
                 "identifier %u not inside or not terminated", i);
        for (unsigned j = 0; j < i; j++)
            FZ_CHECK(m->seqs[j].id_len != s->id_len || memcmp(m->seqs[j].id, s->id, s->id_len),
                     "identifiers %u and %u are the same", j, i);
        FZ_CHECK(inside(s->docs, s->len, msg, len), "sequence %u outside the message", i);
        r = bson_reader_new_from_data(s->docs, s->len);
        while ((d = bson_reader_read(r, &eof)))
            check_doc(d);
        FZ_CHECK(eof, "sequence %u does not end with its last document", i);
        bson_reader_destroy(r);
    }
    /* A reply carrying the body parses back as a request with that body. */
    n = mongo_reply(&m->h, false, 1, &m->body, out, sizeof(out));
    FZ_CHECK(n == MONGO_HDR_LEN + 5 + m->body.len, "reply of %zu bytes", n);
    FZ_CHECK(mongo_parse(out, n, &back, &e) == 0, "a reply does not parse: %s", e.msg);
    FZ_CHECK(bson_equal(&back.body, &m->body) && back.h.response_to == m->h.request_id,
             "a reply parses back to another body");
}

static void check_error(const struct doc_err *e)
{
    bson_t d;

    FZ_CHECK(e->code != 0 && e->msg[0], "an error without a code or message");
    FZ_CHECK(bson_utf8_validate(e->msg, strlen(e->msg), false), "errmsg is not UTF-8: %s",
             e->msg);
    bson_init(&d);
    mongo_error_doc(e, &d);
    FZ_CHECK(bson_validate(&d, BSON_VALIDATE_UTF8, NULL), "error document not valid");
    bson_destroy(&d);
}

static void take_msg(const uint8_t *msg, size_t len, struct outcome *o)
{
    struct mongo_msg m;
    struct doc_err e = {0};
    int rc = mongo_parse(msg, len, &m, &e);

    FZ_CHECK(m.h.len == (int32_t)len, "header length %d for %zu bytes", m.h.len, len);
    if (rc == 0)
        check_parsed(msg, len, &m);
    else
        check_error(&e);
    o->digest = mix(o->digest, msg, len);
    o->digest = mix(o->digest, &rc, sizeof(rc));
    o->digest = mix(o->digest, &e.code, sizeof(e.code));
    o->n_msgs++;
}

/* Frame what is there: the bytes of complete messages taken, and `*end`
 * the status that stopped it. */
static size_t frame_all(const uint8_t *buf, size_t len, size_t max, struct outcome *o,
                        long *end)
{
    size_t used = 0;

    for (;;) {
        struct mongo_hdr h;
        struct doc_err e = {0};
        long n = mongo_frame(buf + used, len - used, max, &h, &e);

        if (n <= 0 || o->n_msgs == MAX_MSGS) {
            if (n < 0)
                check_error(&e);
            if (n == 0 && len - used >= MONGO_HDR_LEN)
                FZ_CHECK((size_t)h.len > len - used && (size_t)h.len <= max,
                         "incomplete, but the header says %d of %zu", h.len, len - used);
            *end = n < 0 ? n : 0;
            return used;
        }
        FZ_CHECK((size_t)n <= len - used && n >= MONGO_HDR_LEN, "frame of %ld in %zu", n,
                 len - used);
        take_msg(buf + used, (size_t)n, o);
        used += (size_t)n;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    static const size_t limits[] = {MONGO_MAX_MESSAGE, 16, 21, 64, 256, 4096, 65536, 1u << 20};
    size_t max = limits[fz_u8(&f) % 8];
    uint8_t n_steps = fz_u8(&f);
    const uint8_t *steps_p, *stream;
    size_t steps_n = fz_take(&f, n_steps, &steps_p);
    size_t n = fz_take(&f, f.n, &stream);
    struct fz steps = {steps_p, steps_n};
    struct outcome a = {0}, b = {0};
    uint8_t *buf = malloc(n ? n : 1);
    size_t used, len = 0, sent = 0;
    long end_a, end_b = 0;

    FZ_CHECK(buf, "no memory");
    /* Whole. */
    memcpy(buf, stream, n);
    frame_all(buf, n, max, &a, &end_a);
    /* In pieces, into a buffer holding only what is not framed yet (the
     * copy also moves each message, as the gateway's compaction does). */
    while (sent < n) {
        size_t step = steps.n ? 1 + (size_t)fz_u8(&steps) % 64 : n - sent;

        if (step > n - sent)
            step = n - sent;
        memcpy(buf + len, stream + sent, step);
        len += step;
        sent += step;
        used = frame_all(buf, len, max, &b, &end_b);
        memmove(buf, buf + used, len - used);
        len -= used;
        if (end_b < 0 || b.n_msgs == MAX_MSGS)
            break;
    }
    free(buf);
    FZ_CHECK(a.n_msgs == b.n_msgs && a.digest == b.digest,
             "whole: %u messages, in pieces: %u (or other results)", a.n_msgs, b.n_msgs);
    FZ_CHECK(end_a == end_b || a.n_msgs == MAX_MSGS, "whole ends with %ld, in pieces with %ld",
             end_a, end_b);
    return 0;
}
