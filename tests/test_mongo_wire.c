/* The MongoDB wire decoder (services/doc/mongo_wire.c) and the gateway
 * (services/doc/mongo_gw.c).
 *
 * The decoder is fed messages built here byte by byte, good ones and every
 * way of lying we know of. The gateway runs in the test process with a
 * runner of the test's own that echoes each command back (so the wire and
 * the event loop are tested apart from the command layer); each client
 * writes with MSG_DONTWAIT and, while it waits, polls the gateway itself.
 * Every hostile client is paired with a well-behaved one that must keep
 * being served.
 *
 * Layouts are MongoDB's: https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/
 * and mongodb/specifications source/message/OP_MSG.md.
 */
#include <arpa/inet.h>
#include <bson/bson.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "doc_cmd.h"
#include "doc_store.h"
#include "mongo_gw.h"
#include "repl.h"
#include "mongo_wire.h"
#include "procs.h"
#include "suites.h"

/* Polls of 10 ms a client waits for at most: a bound, not a timing. */
#define MAX_PUMPS 3000

/* ---- building messages ---- */

struct mb {
    uint8_t *p;
    size_t len, cap;
};

static void mb_put(struct mb *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

static void mb_u32(struct mb *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};

    mb_put(b, x, 4);
}

static void mb_u8(struct mb *b, uint8_t v)
{
    mb_put(b, &v, 1);
}

static void mb_doc(struct mb *b, const bson_t *d)
{
    mb_put(b, bson_get_data(d), d->len);
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void mb_hdr(struct mb *b, int32_t req, int32_t op)
{
    b->len = 0;
    mb_u32(b, 0);
    mb_u32(b, (uint32_t)req);
    mb_u32(b, 0);
    mb_u32(b, (uint32_t)op);
}

/* Set messageLength to what was built. */
static void mb_end(struct mb *b)
{
    put32(b->p, (uint32_t)b->len);
}

static void msg_begin(struct mb *b, int32_t req, uint32_t flags)
{
    mb_hdr(b, req, MONGO_OP_MSG);
    mb_u32(b, flags);
}

static void sec0(struct mb *b, const bson_t *d)
{
    mb_u8(b, 0);
    mb_doc(b, d);
}

/* A kind-1 section of `n` copies of `d`. */
static void sec1(struct mb *b, const char *id, const bson_t *d, int n)
{
    size_t at;

    mb_u8(b, 1);
    at = b->len;
    mb_u32(b, 0);
    mb_put(b, id, strlen(id) + 1);
    for (int i = 0; i < n; i++)
        mb_doc(b, d);
    put32(b->p + at, (uint32_t)(b->len - at));
}

static void msg_end_crc(struct mb *b)
{
    put32(b->p, (uint32_t)(b->len + 4));
    mb_u32(b, mongo_crc32c(0, b->p, b->len));
}

/* {ping: 1, $db: "admin"} and friends. */
static bson_t *cmd(const char *name, const char *db)
{
    bson_t *d = bson_new();

    BSON_APPEND_INT32(d, name, 1);
    BSON_APPEND_UTF8(d, "$db", db);
    return d;
}

static void simple_msg(struct mb *b, int32_t req, const char *name)
{
    bson_t *d = cmd(name, "admin");

    msg_begin(b, req, 0);
    sec0(b, d);
    mb_end(b);
    bson_destroy(d);
}

/* A document nested `depth` levels below the top ({a: {a: ... {}}}),
 * built as bytes so that any depth costs linear time. */
static uint8_t *nested(unsigned depth, size_t *len)
{
    /* Level i starts at 7 * i (length, type 3, key "a") and is closed by
     * one of the NULs at the end: n - 8 * i bytes long. */
    size_t n = 5 + (size_t)depth * 8;
    uint8_t *p = malloc(n);

    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i <= depth; i++) {
        put32(p + 7 * i, (uint32_t)(n - 8 * i));
        if (i < depth) {
            p[7 * i + 4] = 0x03;
            p[7 * i + 5] = 'a';
            p[7 * i + 6] = 0;
        }
    }
    memset(p + 7 * (size_t)depth + 4, 0, (size_t)depth + 1);
    *len = n;
    return p;
}

/* ---- the decoder ---- */

static int parse(const struct mb *b, struct mongo_msg *m, struct doc_err *e)
{
    memset(e, 0, sizeof(*e));
    return mongo_parse(b->p, b->len, m, e);
}

static void parse_fails(const struct mb *b, int code, const char *words)
{
    struct mongo_msg m;
    struct doc_err e;
    int rc = parse(b, &m, &e);

    ck_assert_msg(rc < 0, "parsed, want error %d (%s)", code, words);
    ck_assert_msg(e.code == code, "code %d (%s), want %d", e.code, e.msg, code);
    ck_assert_msg(strstr(e.msg, words), "errmsg \"%s\" lacks \"%s\"", e.msg, words);
    ck_assert_int_eq(m.h.request_id, get32(b->p + 4));
}

START_TEST(crc32c_known_answer)
{
    /* The check value of CRC-32C (RFC 3720, B.4: "123456789"). */
    ck_assert_uint_eq(mongo_crc32c(0, "123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(mongo_crc32c(mongo_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
    ck_assert_uint_eq(mongo_crc32c(0, "", 0), 0);
}
END_TEST

START_TEST(frame_lengths)
{
    struct mb b = {0};
    struct mongo_hdr h;
    struct doc_err e = {0};

    simple_msg(&b, 7, "ping");
    for (size_t n = 0; n < b.len; n++)
        ck_assert_int_eq(mongo_frame(b.p, n, MONGO_MAX_MESSAGE, &h, &e), 0);
    ck_assert_int_eq(mongo_frame(b.p, b.len, MONGO_MAX_MESSAGE, &h, &e), (long)b.len);
    ck_assert_int_eq(h.request_id, 7);
    ck_assert_int_eq(h.op, MONGO_OP_MSG);
    /* More bytes behind it belong to the next message. */
    mb_put(&b, "xyz", 3);
    ck_assert_int_eq(mongo_frame(b.p, b.len, MONGO_MAX_MESSAGE, &h, &e), (long)b.len - 3);
    /* An incomplete message says how long it will be. */
    ck_assert_int_eq(mongo_frame(b.p, 16, MONGO_MAX_MESSAGE, &h, &e), 0);
    ck_assert_int_eq(h.len, (int32_t)b.len - 3);

    /* Lengths that cannot be: below the header, negative, past the limit. */
    put32(b.p, 15);
    ck_assert_int_lt(mongo_frame(b.p, b.len, MONGO_MAX_MESSAGE, &h, &e), 0);
    ck_assert_int_eq(e.code, DOC_ProtocolError);
    ck_assert_int_eq(h.request_id, 7);
    put32(b.p, 0x80000000u);
    ck_assert_int_lt(mongo_frame(b.p, b.len, MONGO_MAX_MESSAGE, &h, &e), 0);
    put32(b.p, MONGO_MAX_MESSAGE + 1);
    ck_assert_int_lt(mongo_frame(b.p, b.len, (size_t)-1, &h, &e), 0);
    ck_assert_ptr_nonnull(strstr(e.msg, "48000000"));
    put32(b.p, 1000);
    ck_assert_int_lt(mongo_frame(b.p, b.len, 999, &h, &e), 0);
    ck_assert_int_eq(mongo_frame(b.p, b.len, 1000, &h, &e), 0);
    free(b.p);
}
END_TEST

START_TEST(op_msg_body_and_sequences)
{
    struct mb b = {0};
    struct mongo_msg m;
    struct doc_err e;
    bson_t *body = cmd("insert", "test"), *d = bson_new();
    bson_iter_t it;

    BSON_APPEND_UTF8(d, "x", "y");
    /* A kind-1 section may come before the body. */
    msg_begin(&b, 9, MONGO_MSG_EXHAUST | 0x800000u);
    sec1(&b, "documents", d, 3);
    sec0(&b, body);
    sec1(&b, "updates", d, 0);
    mb_end(&b);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    ck_assert(!m.legacy);
    ck_assert_int_eq(m.h.request_id, 9);
    ck_assert_uint_eq(m.flags, MONGO_MSG_EXHAUST | 0x800000u);
    ck_assert(bson_equal(&m.body, body));
    /* A view into the message, not a copy. */
    ck_assert(bson_get_data(&m.body) >= b.p && bson_get_data(&m.body) < b.p + b.len);
    ck_assert_uint_eq(m.nseq, 2);
    ck_assert_uint_eq(m.seqs[0].id_len, 9);
    ck_assert(memcmp(m.seqs[0].id, "documents", 9) == 0);
    ck_assert_uint_eq(m.seqs[0].len, 3 * d->len);
    ck_assert(memcmp(m.seqs[0].docs, bson_get_data(d), d->len) == 0);
    ck_assert_uint_eq(m.seqs[1].len, 0);
    ck_assert(bson_iter_init_find(&it, &m.body, "$db"));
    bson_destroy(body);
    bson_destroy(d);
    free(b.p);
}
END_TEST

START_TEST(op_msg_checksum)
{
    struct mb b = {0};
    struct mongo_msg m;
    struct doc_err e;
    bson_t *body = cmd("ping", "admin");

    msg_begin(&b, 3, MONGO_MSG_CHECKSUM);
    sec0(&b, body);
    msg_end_crc(&b);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    /* The checksum is not a section. */
    ck_assert(bson_equal(&m.body, body));
    ck_assert_uint_eq(m.nseq, 0);
    b.p[b.len - 1] ^= 1;
    parse_fails(&b, DOC_ProtocolError, "checksum");
    b.p[b.len - 1] ^= 1;
    b.p[25] ^= 0x40;       /* a byte of the body: the CRC catches it */
    parse_fails(&b, DOC_ProtocolError, "checksum");
    /* The flag without room for a checksum. */
    msg_begin(&b, 3, MONGO_MSG_CHECKSUM);
    mb_u8(&b, 0);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "too short for its checksum");
    bson_destroy(body);
    free(b.p);
}
END_TEST

START_TEST(op_msg_flags)
{
    struct mb b = {0};
    struct mongo_msg m;
    struct doc_err e;
    bson_t *body = cmd("ping", "admin");

    /* Each unknown required bit (2-15) is an error; optional ones (16-31)
     * are not. */
    for (unsigned bit = 2; bit < 32; bit++) {
        msg_begin(&b, 5, 1u << bit);
        sec0(&b, body);
        mb_end(&b);
        if (bit < 16) {
            parse_fails(&b, DOC_IllegalOpMsgFlag, "flags");
        } else {
            ck_assert_int_eq(parse(&b, &m, &e), 0);
        }
    }
    msg_begin(&b, 5, MONGO_MSG_MORE_TO_COME);
    sec0(&b, body);
    mb_end(&b);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    ck_assert_uint_eq(m.flags, MONGO_MSG_MORE_TO_COME);
    bson_destroy(body);
    free(b.p);
}
END_TEST

START_TEST(op_msg_sections_that_lie)
{
    struct mb b = {0};
    bson_t *body = cmd("insert", "test"), *d = bson_new();
    size_t at;

    BSON_APPEND_INT32(d, "_id", 1);

    /* No section at all. */
    msg_begin(&b, 1, 0);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "too short");
    /* Only a kind-1 section: no body. */
    msg_begin(&b, 1, 0);
    sec1(&b, "documents", d, 1);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "no body");
    /* Two bodies. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    sec0(&b, body);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "more than one body");
    /* Two sequences of one name. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    sec1(&b, "documents", d, 1);
    sec1(&b, "documents", d, 2);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "two document sequences named 'documents'");
    /* Too many sequences. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    for (int i = 0; i <= MONGO_MAX_SECTIONS; i++) {
        char id[8];

        snprintf(id, sizeof(id), "s%d", i);
        sec1(&b, id, d, 1);
    }
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "more than 8");
    /* A section kind that does not exist. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    mb_u8(&b, 2);
    mb_doc(&b, d);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "unknown kind 2");

    /* The body's length runs past the message. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    mb_end(&b);
    put32(b.p + 21, body->len + 1);
    parse_fails(&b, DOC_InvalidBSON, "overruns");
    /* ... or is below the smallest document. */
    put32(b.p + 21, 4);
    parse_fails(&b, DOC_InvalidBSON, "length 4 is invalid");
    put32(b.p + 21, 0xffffffffu);
    parse_fails(&b, DOC_InvalidBSON, "length -1 is invalid");
    /* ... or is shorter than the document it frames (then the rest is
     * read as a section and must fail). */
    put32(b.p + 21, body->len - 1);
    {
        struct mongo_msg m;
        struct doc_err e;

        ck_assert_int_lt(parse(&b, &m, &e), 0);
    }
    /* The body cut short by the message. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    b.len -= 3;
    mb_end(&b);
    parse_fails(&b, DOC_InvalidBSON, "overruns");

    /* A kind-1 size past the message. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    at = b.len + 1;
    sec1(&b, "documents", d, 2);
    mb_end(&b);
    put32(b.p + at, get32(b.p + at) + 1);
    parse_fails(&b, DOC_ProtocolError, "overruns the message");
    /* Below 4 + 1: no room for even an empty identifier. */
    for (uint32_t size = 0; size < 5; size++) {
        put32(b.p + at, size);
        parse_fails(&b, DOC_ProtocolError, "is invalid");
    }
    put32(b.p + at, 0x80000000u);
    parse_fails(&b, DOC_ProtocolError, "is invalid");
    /* A size that ends inside a document: that document overruns its
     * section. */
    put32(b.p + at, 4 + 10 + d->len + 6);
    parse_fails(&b, DOC_InvalidBSON, "overruns");
    put32(b.p + at, 4 + 10 + d->len + 2);
    parse_fails(&b, DOC_InvalidBSON, "cannot hold a document");
    /* A size that ends inside the identifier. */
    put32(b.p + at, 4 + 5);
    parse_fails(&b, DOC_ProtocolError, "not terminated");
    /* A section cut short (truncated after its size). */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    mb_u8(&b, 1);
    mb_u8(&b, 9);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "truncated");
    /* A document inside a sequence whose own length lies. */
    msg_begin(&b, 1, 0);
    sec0(&b, body);
    at = b.len + 1 + 4 + 10;
    sec1(&b, "documents", d, 2);
    mb_end(&b);
    put32(b.p + at, d->len + 1);
    parse_fails(&b, DOC_InvalidBSON, "document sequence");
    put32(b.p + at, d->len - 1);
    parse_fails(&b, DOC_InvalidBSON, "document sequence");

    bson_destroy(body);
    bson_destroy(d);
    free(b.p);
}
END_TEST

START_TEST(bad_bson_refused)
{
    struct mb b = {0};
    bson_t *d = bson_new();
    size_t at;

    /* Strings, keys and code that are not UTF-8 (a lone lead byte, a
     * bad continuation, a truncated sequence). */
    static const char *const bad[] = {"\xff\xfe", "\xc3\x28", "ab\xe2\x82"};
    bson_t *scope = bson_new();

    for (int i = 0; i < 3; i++) {
        for (int where = 0; where < 4; where++) {
            bson_reinit(d);
            BSON_APPEND_INT32(d, "ping", 1);
            if (where == 0)
                BSON_APPEND_UTF8(d, "s", bad[i]);
            else if (where == 1)
                BSON_APPEND_INT32(d, bad[i], 1);
            else if (where == 2)
                BSON_APPEND_SYMBOL(d, "s", bad[i]);
            else
                ck_assert(bson_append_code_with_scope(d, "c", -1, bad[i], scope));
            msg_begin(&b, 1, 0);
            sec0(&b, d);
            mb_end(&b);
            parse_fails(&b, DOC_InvalidBSON, "not UTF-8");
        }
    }
    bson_destroy(scope);
    /* A NUL inside a string is UTF-8 (MongoDB stores it). */
    bson_reinit(d);
    BSON_APPEND_INT32(d, "ping", 1);
    bson_append_utf8(d, "s", -1, "a\0b", 3);
    msg_begin(&b, 1, 0);
    sec0(&b, d);
    mb_end(&b);
    {
        struct mongo_msg m;
        struct doc_err e;

        ck_assert_int_eq(parse(&b, &m, &e), 0);
    }
    /* An element type that does not exist. */
    bson_reinit(d);
    BSON_APPEND_INT32(d, "ping", 1);
    msg_begin(&b, 1, 0);
    at = b.len + 1 + 4;
    sec0(&b, d);
    mb_end(&b);
    b.p[at] = 0x7f - 2;
    parse_fails(&b, DOC_InvalidBSON, "invalid BSON");
    /* A string whose length runs past its document. */
    bson_reinit(d);
    BSON_APPEND_UTF8(d, "s", "abc");
    msg_begin(&b, 1, 0);
    at = b.len + 1 + 4 + 3;
    sec0(&b, d);
    mb_end(&b);
    put32(b.p + at, 100);
    parse_fails(&b, DOC_InvalidBSON, "invalid BSON");
    /* An embedded document or array without its closing NUL (found by
     * fuzz_mongo_wire: bson_iter_recurse does not look, and bson_validate
     * passes over such a document). */
    for (int arr = 0; arr < 2; arr++) {
        bson_t sub;

        bson_reinit(d);
        BSON_APPEND_INT32(d, "ping", 1);
        if (arr)
            bson_append_array_begin(d, "a", -1, &sub);
        else
            bson_append_document_begin(d, "a", -1, &sub);
        BSON_APPEND_UTF8(&sub, "0", "x");
        if (arr)
            bson_append_array_end(d, &sub);
        else
            bson_append_document_end(d, &sub);
        BSON_APPEND_INT32(d, "z", 1);
        msg_begin(&b, 1, 0);
        sec0(&b, d);
        mb_end(&b);
        /* The sub-document's NUL is 6 bytes from the end (int32 "z", the
         * closing NUL). */
        ck_assert_uint_eq(b.p[b.len - 9], 0);
        b.p[b.len - 9] = 0x10;
        parse_fails(&b, DOC_InvalidBSON, "bad embedded document");
    }
    /* A document without its closing NUL. */
    bson_reinit(d);
    BSON_APPEND_INT32(d, "ping", 1);
    msg_begin(&b, 1, 0);
    sec0(&b, d);
    mb_end(&b);
    b.p[b.len - 1] = 1;
    parse_fails(&b, DOC_InvalidBSON, "invalid BSON");
    bson_destroy(d);
    free(b.p);
}
END_TEST

static void nested_msg(struct mb *b, unsigned depth)
{
    size_t n;
    uint8_t *doc = nested(depth, &n);

    msg_begin(b, 11, 0);
    mb_u8(b, 0);
    mb_put(b, doc, n);
    mb_end(b);
    free(doc);
}

START_TEST(depth_capped)
{
    struct mb b = {0};
    struct mongo_msg m;
    struct doc_err e;
    bson_t *scope = bson_new(), *next;

    /* MongoDB's maxBSONDepth: 200 levels below the top are too many. */
    nested_msg(&b, MONGO_MAX_DEPTH - 1);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    nested_msg(&b, MONGO_MAX_DEPTH);
    parse_fails(&b, DOC_Overflow, "nested object depth");
    nested_msg(&b, 1000);
    parse_fails(&b, DOC_Overflow, "nested object depth");

    /* Code-with-scope nests too: libbson validates a scope by recursion. */
    for (int i = 0; i < 1000; i++) {
        next = bson_new();
        ck_assert(bson_append_code_with_scope(next, "c", -1, "x", scope));
        bson_destroy(scope);
        scope = next;
    }
    msg_begin(&b, 11, 0);
    sec0(&b, scope);
    mb_end(&b);
    parse_fails(&b, DOC_Overflow, "nested object depth");
    bson_destroy(scope);
    free(b.p);
}
END_TEST

/* The largest document the limit lets through, nested as deep as its size
 * allows (two million levels): libbson's recursive validation would need
 * far more stack than a thread has. It must be refused, not crash. */
START_TEST(depth_capped_before_validation)
{
    struct mb b = {0};
    /* The same with code-with-scope ({c: Code("x", {c: Code("x", ...)})}):
     * a level is 17 bytes in front and its closing NUL. */
    size_t depth = (MONGO_MAX_BSON - 5) / 18, n = 5 + depth * 18;
    uint8_t *p = calloc(1, n);

    nested_msg(&b, (MONGO_MAX_BSON - 5) / 8);
    parse_fails(&b, DOC_Overflow, "nested object depth");

    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i <= depth; i++) {
        uint8_t *l = p + 17 * i;
        uint32_t len = (uint32_t)(n - 18 * i);

        put32(l, len);
        if (i < depth) {
            l[4] = 0x0f;
            l[5] = 'c';
            put32(l + 7, len - 4 - 3 - 1);      /* the element's own total */
            put32(l + 11, 2);
            l[15] = 'x';
        }
    }
    msg_begin(&b, 11, 0);
    mb_u8(&b, 0);
    mb_put(&b, p, n);
    mb_end(&b);
    parse_fails(&b, DOC_Overflow, "nested object depth");
    free(p);
    free(b.p);
}
END_TEST

START_TEST(document_too_large)
{
    struct mb b = {0};
    struct mongo_msg m;
    struct doc_err e;
    bson_t *d = cmd("insert", "test"), *big = bson_new();
    size_t pad = MONGO_MAX_BSON_INTERNAL - 64;
    char *s = malloc(pad + 1);

    ck_assert_ptr_nonnull(s);
    memset(s, 'x', pad);
    s[pad] = 0;
    /* Just under the limit: fine. */
    BSON_APPEND_UTF8(big, "s", s);
    ck_assert_uint_le(big->len, MONGO_MAX_BSON_INTERNAL);
    msg_begin(&b, 4, 0);
    sec0(&b, d);
    sec1(&b, "documents", big, 1);
    mb_end(&b);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    /* 17 MiB, in a sequence and as the body. */
    bson_reinit(big);
    s = realloc(s, (17u << 20) + 1);
    memset(s, 'x', 17u << 20);
    s[17u << 20] = 0;
    BSON_APPEND_UTF8(big, "s", s);
    msg_begin(&b, 4, 0);
    sec0(&b, d);
    sec1(&b, "documents", big, 1);
    mb_end(&b);
    parse_fails(&b, DOC_BSONObjectTooLarge, "is invalid");
    msg_begin(&b, 4, 0);
    sec0(&b, big);
    mb_end(&b);
    parse_fails(&b, DOC_BSONObjectTooLarge, "is invalid");
    free(s);
    bson_destroy(d);
    bson_destroy(big);
    free(b.p);
}
END_TEST

START_TEST(unknown_opcodes)
{
    static const int32_t ops[] = {MONGO_OP_COMPRESSED, 2002 /* OP_INSERT */, 2001 /* UPDATE */,
                                  2005 /* GET_MORE */, 2006, 2007, MONGO_OP_REPLY, 0, -1,
                                  12345};
    struct mb b = {0};
    bson_t *d = cmd("ping", "admin");

    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        mb_hdr(&b, 77, ops[i]);
        mb_u32(&b, 0);
        mb_doc(&b, d);
        mb_end(&b);
        parse_fails(&b, DOC_ProtocolError,
                    ops[i] == MONGO_OP_COMPRESSED ? "OP_COMPRESSED" : "unsupported opcode");
    }
    /* A bare header. */
    mb_hdr(&b, 77, MONGO_OP_MSG);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "too short");
    /* A message whose length is not what was framed. */
    simple_msg(&b, 77, "ping");
    put32(b.p, (uint32_t)b.len + 1);
    parse_fails(&b, DOC_ProtocolError, "framed");
    bson_destroy(d);
    free(b.p);
}
END_TEST

static void query_msg(struct mb *b, int32_t req, const char *ns, const bson_t *q,
                      const bson_t *fields)
{
    mb_hdr(b, req, MONGO_OP_QUERY);
    mb_u32(b, 0);
    mb_put(b, ns, strlen(ns) + 1);
    mb_u32(b, 0);
    mb_u32(b, (uint32_t)-1);
    if (q)
        mb_doc(b, q);
    if (fields)
        mb_doc(b, fields);
    mb_end(b);
}

START_TEST(op_query_handshake)
{
    struct mb b = {0};
    struct mongo_msg m;
    struct doc_err e;
    bson_t *q = bson_new(), *wrapped = bson_new(), *empty = bson_new();

    BSON_APPEND_INT32(q, "isMaster", 1);
    query_msg(&b, 21, "admin.$cmd", q, NULL);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    ck_assert(m.legacy);
    ck_assert(bson_equal(&m.body, q));
    ck_assert_uint_eq(m.db_len, 5);
    ck_assert(memcmp(m.db, "admin", 5) == 0);
    ck_assert_uint_eq(m.nseq, 0);
    /* With a field selector. */
    query_msg(&b, 21, "admin.$cmd", q, empty);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    /* Wrapped for a mongos: the inner command runs. */
    BSON_APPEND_DOCUMENT(wrapped, "$query", q);
    BSON_APPEND_UTF8(wrapped, "$readPreference", "primary");
    query_msg(&b, 21, "test.$cmd", wrapped, NULL);
    ck_assert_int_eq(parse(&b, &m, &e), 0);
    ck_assert(bson_equal(&m.body, q));

    /* Not a command: refused, as MongoDB 6 does; still an OP_REPLY. */
    query_msg(&b, 22, "test.coll", q, NULL);
    parse_fails(&b, DOC_ProtocolError, "only served on a $cmd collection (got 'test.coll')");
    parse(&b, &m, &e);
    ck_assert(m.legacy);
    query_msg(&b, 22, "$cmd", q, NULL);
    parse_fails(&b, DOC_ProtocolError, "$cmd collection");
    query_msg(&b, 22, "a.$cmdx", q, NULL);
    parse_fails(&b, DOC_ProtocolError, "$cmd collection");
    /* A name that quotes bytes no client could decode. */
    query_msg(&b, 22, "\xff\x01.c", q, NULL);
    parse_fails(&b, DOC_ProtocolError, "'??.c'");
    /* No NUL after the name. */
    mb_hdr(&b, 22, MONGO_OP_QUERY);
    mb_u32(&b, 0);
    mb_put(&b, "admin.$cmdadmin.$cmdadmin.$cmd", 30);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "not terminated");
    /* No query document. */
    query_msg(&b, 22, "admin.$cmd", NULL, NULL);
    mb_put(&b, "\0\0\0\0\0", 5);
    mb_end(&b);
    parse_fails(&b, DOC_InvalidBSON, "OP_QUERY query");
    /* Bytes after the selector. */
    query_msg(&b, 22, "admin.$cmd", q, empty);
    mb_put(&b, "\0\0", 2);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "2 bytes after its documents");
    query_msg(&b, 22, "admin.$cmd", q, NULL);
    mb_put(&b, "\7\0\0\0\0", 5);
    mb_end(&b);
    parse_fails(&b, DOC_InvalidBSON, "returnFieldsSelector");
    query_msg(&b, 22, "admin.$cmd", q, empty);
    mb_doc(&b, empty);
    mb_end(&b);
    parse_fails(&b, DOC_ProtocolError, "after its documents");
    bson_destroy(q);
    bson_destroy(wrapped);
    bson_destroy(empty);
    free(b.p);
}
END_TEST

START_TEST(reply_layouts)
{
    struct mongo_hdr h = {.request_id = 0x01020304};
    bson_t *d = cmd("ok", "x");
    uint8_t out[256];
    size_t n;

    /* Too small: nothing written, the size said. */
    memset(out, 0xee, sizeof(out));
    n = mongo_reply(&h, false, 5, d, out, 10);
    ck_assert_uint_eq(n, 16 + 5 + d->len);
    ck_assert_uint_eq(out[0], 0xee);

    n = mongo_reply(&h, false, 5, d, out, sizeof(out));
    ck_assert_uint_eq(n, 16 + 5 + d->len);
    ck_assert_uint_eq(get32(out), n);
    ck_assert_uint_eq(get32(out + 4), 5);
    ck_assert_uint_eq(get32(out + 8), 0x01020304);
    ck_assert_uint_eq(get32(out + 12), MONGO_OP_MSG);
    ck_assert_uint_eq(get32(out + 16), 0);   /* flags 0: no checksum */
    ck_assert_uint_eq(out[20], 0);           /* one kind-0 section */
    ck_assert(memcmp(out + 21, bson_get_data(d), d->len) == 0);

    n = mongo_reply(&h, true, 6, d, out, sizeof(out));
    ck_assert_uint_eq(n, 16 + 20 + d->len);
    ck_assert_uint_eq(get32(out + 12), MONGO_OP_REPLY);
    ck_assert_uint_eq(get32(out + 8), 0x01020304);
    ck_assert_uint_eq(get32(out + 16), 0);   /* responseFlags */
    ck_assert_uint_eq(get32(out + 20), 0);   /* cursorID */
    ck_assert_uint_eq(get32(out + 24), 0);
    ck_assert_uint_eq(get32(out + 28), 0);   /* startingFrom */
    ck_assert_uint_eq(get32(out + 32), 1);   /* numberReturned */
    ck_assert(memcmp(out + 36, bson_get_data(d), d->len) == 0);
    bson_destroy(d);
}
END_TEST

START_TEST(error_doc_shape)
{
    struct doc_err e;
    bson_t *d = bson_new();
    bson_iter_t it;

    doc_errf(&e, DOC_ProtocolError, "bad %s", "thing");
    mongo_error_doc(&e, d);
    ck_assert(bson_iter_init_find(&it, d, "ok") && bson_iter_as_double(&it) == 0.0);
    ck_assert(bson_iter_init_find(&it, d, "errmsg"));
    ck_assert_str_eq(bson_iter_utf8(&it, NULL), "bad thing");
    ck_assert(bson_iter_init_find(&it, d, "code") && bson_iter_int32(&it) == 17);
    ck_assert(bson_iter_init_find(&it, d, "codeName"));
    ck_assert_str_eq(bson_iter_utf8(&it, NULL), "ProtocolError");
    bson_destroy(d);
}
END_TEST

/* ---- the gateway, with a runner that echoes ---- */

static struct mongo_gw *gw;
static int fake_srv;
static struct doc_server *const srv = (struct doc_server *)&fake_srv;

struct fake_client {
    unsigned runs;
};

static unsigned clients_live, syncs, ticks;
static bool sync_fails;
static int replies_early;       /* syncs that found a reply already sent */
static int sync_watch[4] = {-1, -1, -1, -1};   /* clients the sync checks */

static struct doc_client *fake_client_new(struct doc_server *s, const char *peer)
{
    ck_assert_ptr_eq(s, srv);
    ck_assert_ptr_nonnull(strstr(peer, "127.0.0.1:"));
    clients_live++;
    return (struct doc_client *)calloc(1, sizeof(struct fake_client));
}

static void fake_client_free(struct doc_client *c)
{
    clients_live--;
    free(c);
}

/* {ok: 1, echo: <the command>, seqs: {<id>: <count of documents>}};
 * a command named "write" wrote. */
static int fake_run(struct doc_client *c, const bson_t *cmdoc, const struct doc_seq *seqs,
                    unsigned nseq, bson_t *reply)
{
    bson_iter_t it;
    bson_t sub;

    ((struct fake_client *)c)->runs++;
    ck_assert_uint_eq(reply->len, 5);
    BSON_APPEND_DOUBLE(reply, "ok", 1.0);
    BSON_APPEND_DOCUMENT(reply, "echo", cmdoc);
    bson_append_document_begin(reply, "seqs", -1, &sub);
    for (unsigned i = 0; i < nseq; i++) {
        bson_reader_t *r = bson_reader_new_from_data(seqs[i].docs, seqs[i].len);
        char id[64];
        int n = 0;
        bool eof = false;

        while (bson_reader_read(r, &eof))
            n++;
        ck_assert(eof);
        bson_reader_destroy(r);
        snprintf(id, sizeof(id), "%.*s", (int)seqs[i].id_len, seqs[i].id);
        BSON_APPEND_INT32(&sub, id, n);
    }
    bson_append_document_end(reply, &sub);
    return bson_iter_init(&it, cmdoc) && bson_iter_next(&it) &&
                   strcmp(bson_iter_key(&it), "write") == 0
               ? DOC_CMD_WROTE
               : 0;
}

static int fake_sync(struct doc_server *s, struct doc_err *e)
{
    ck_assert_ptr_eq(s, srv);
    syncs++;
    for (int i = 0; i < 4; i++) {
        char x;

        if (sync_watch[i] >= 0 && recv(sync_watch[i], &x, 1, MSG_PEEK | MSG_DONTWAIT) > 0)
            replies_early++;
    }
    if (sync_fails)
        return doc_errf(e, DOC_OutOfDiskSpace, "the pool is full");
    return 0;
}

static void fake_sync_failed(const struct doc_err *e, bson_t *reply)
{
    mongo_error_doc(e, reply);
    BSON_APPEND_BOOL(reply, "fake", true);
}

static void fake_tick(struct doc_server *s, uint64_t now_ms)
{
    ticks++;
}

static const struct mongo_gw_runner fake = {fake_client_new, fake_client_free, fake_run,
                                            fake_sync, fake_sync_failed, fake_tick,
                                            NULL, NULL, NULL, NULL};

/* A replicated server's waits: each write's reply waits for ticket n
 * (the n-th write), until the test passes up to it or fails them all. */
static uint64_t hold_seq, pass_upto;
static bool holds_fail;

static bool fake_wait(struct doc_server *s, int flags, struct repl_wait *w)
{
    if (!(flags & DOC_CMD_WROTE))
        return false;
    *w = (struct repl_wait){.target = ++hold_seq};
    return true;
}

static int fake_waited(struct doc_server *s, const struct repl_wait *w, struct doc_err *e)
{
    if (holds_fail)
        return doc_errf(e, DOC_PrimarySteppedDown, "no longer primary");
    return w->target <= pass_upto;
}

static const struct mongo_gw_runner fake_held = {fake_client_new, fake_client_free, fake_run,
                                                 fake_sync, fake_sync_failed, fake_tick,
                                                 fake_wait, fake_waited, NULL, NULL};

/* Awaitable hello, as the command layer reports it: a "hello" with
 * topologyVersion {processId, counter} and maxAwaitTimeMS returns
 * DOC_CMD_AWAIT, and is current when its processId is "p" and its
 * counter is the test's topology counter (topo); every hello's reply
 * says that counter, and how many hellos the client has run. */
static int64_t topo;
static unsigned topo_looks;

struct fake_await_client {
    struct fake_client f;
    struct doc_await aw;
    unsigned hellos;
};

static struct doc_client *fake_aw_client_new(struct doc_server *s, const char *peer)
{
    ck_assert_ptr_eq(s, srv);
    clients_live++;
    return (struct doc_client *)calloc(1, sizeof(struct fake_await_client));
}

static int fake_aw_run(struct doc_client *dc, const bson_t *cmdoc, const struct doc_seq *seqs,
                       unsigned nseq, bson_t *reply)
{
    struct fake_await_client *c = (struct fake_await_client *)dc;
    bson_iter_t it, tv;
    int rc = fake_run(dc, cmdoc, seqs, nseq, reply);

    if (!bson_iter_init(&it, cmdoc) || !bson_iter_next(&it) ||
        strcmp(bson_iter_key(&it), "hello") != 0)
        return rc;
    c->hellos++;
    c->aw = (struct doc_await){.counter = topo};
    BSON_APPEND_INT64(reply, "counter", topo);
    BSON_APPEND_INT32(reply, "hellos", (int32_t)c->hellos);
    if (!bson_iter_init_find(&it, cmdoc, "maxAwaitTimeMS"))
        return rc;
    c->aw.max_ms = (uint64_t)bson_iter_as_int64(&it);
    ck_assert(bson_iter_init(&it, cmdoc) &&
              bson_iter_find_descendant(&it, "topologyVersion.processId", &tv));
    c->aw.current = !strcmp(bson_iter_utf8(&tv, NULL), "p");
    ck_assert(bson_iter_init(&it, cmdoc) &&
              bson_iter_find_descendant(&it, "topologyVersion.counter", &tv));
    c->aw.current &= bson_iter_as_int64(&tv) == topo;
    return rc | DOC_CMD_AWAIT;
}

static void fake_await(const struct doc_client *dc, struct doc_await *a)
{
    *a = ((const struct fake_await_client *)dc)->aw;
}

static int64_t fake_topology(struct doc_server *s)
{
    ck_assert_ptr_eq(s, srv);
    topo_looks++;
    return topo;
}

static const struct mongo_gw_runner fake_aw = {fake_aw_client_new, fake_client_free, fake_aw_run,
                                               fake_sync, fake_sync_failed, fake_tick,
                                               NULL, NULL, fake_await, fake_topology};
static const struct mongo_gw_runner *runner = &fake;

static unsigned max_clients;

static void gw_open(size_t max_request, size_t max_output)
{
    struct mongo_gw_config cfg = {.runner = runner, .max_request = max_request,
                                  .max_output = max_output, .max_clients = max_clients};
    int rc;

    if (gw)
        mongo_gw_destroy(gw);
    rc = mongo_gw_create(srv, &cfg, &gw);
    ck_assert_msg(rc == 0, "gateway: %s", tern_strerror(rc));
    ck_assert_uint_ne(mongo_gw_port(gw), 0);
}

static void gw_setup(void)
{
    clients_live = syncs = ticks = 0;
    sync_fails = false;
    replies_early = 0;
    max_clients = 0;
    for (int i = 0; i < 4; i++)
        sync_watch[i] = -1;
    gw_open(0, 0);
}

static void gw_teardown(void)
{
    mongo_gw_destroy(gw);
    gw = NULL;
    runner = &fake;
    ck_assert_uint_eq(clients_live, 0);
}

static int pump(void)
{
    int rc = mongo_gw_poll(gw, 10);

    ck_assert_msg(rc >= 0, "poll: %s", tern_strerror(rc));
    return rc;
}

struct conn {
    int fd;
    bool eof;
    uint8_t *buf;
    size_t len, cap;
};

/* rcvbuf: a receive buffer of that size (no autotuning); 0 = the default. */
static struct conn *conn_open_rcvbuf(int rcvbuf)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(mongo_gw_port(gw))};
    struct conn *c = calloc(1, sizeof(*c));

    ck_assert_ptr_nonnull(c);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(c->fd, 0);
    if (rcvbuf)
        ck_assert_int_eq(setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    ck_assert_int_eq(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    c->cap = 4096;
    c->buf = malloc(c->cap);
    ck_assert_ptr_nonnull(c->buf);
    return c;
}

static struct conn *conn_open(void)
{
    return conn_open_rcvbuf(0);
}

static void conn_close(struct conn *c)
{
    close(c->fd);
    free(c->buf);
    free(c);
}

static void conn_drain(struct conn *c)
{
    for (;;) {
        ssize_t n;

        if (c->cap - c->len < 65536) {
            c->cap = c->cap * 2 + 65536;
            c->buf = realloc(c->buf, c->cap);
            ck_assert_ptr_nonnull(c->buf);
        }
        n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
        if (n > 0) {
            c->len += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            c->eof = true;
        return;
    }
}

/* Send it all, serving the gateway while the socket is full; `reading`:
 * take in replies meanwhile (a client that never reads does not). */
static void conn_send_r(struct conn *c, const void *data, size_t len, bool reading)
{
    const uint8_t *p = data;

    for (int i = 0; len; i++) {
        ssize_t n = send(c->fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            c->eof = true;
            return;
        }
        ck_assert_msg(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "send: %s",
                      strerror(errno));
        ck_assert_msg(i < MAX_PUMPS * 10, "send never finished");
        pump();
        if (reading)
            conn_drain(c);
    }
}

static void conn_send(struct conn *c, const struct mb *b)
{
    conn_send_r(c, b->p, b->len, true);
}

/* Wait for one whole reply; false if the connection ended first. */
static bool conn_wait_reply(struct conn *c)
{
    conn_drain(c);
    for (int i = 0; i < MAX_PUMPS; i++) {
        if (c->len >= 4 && c->len >= get32(c->buf))
            return true;
        if (c->eof)
            return false;
        pump();
        conn_drain(c);
    }
    ck_abort_msg("no reply");
    return false;
}

/* The next reply: an OP_MSG (flags 0, one kind-0 section) or an OP_REPLY
 * (one document) answering request `req`; its document into *doc. */
static void next_reply(struct conn *c, int32_t req, bool legacy, bson_t *doc)
{
    uint32_t len;
    size_t off = legacy ? 36 : 21;
    bson_t view;

    ck_assert_msg(conn_wait_reply(c), "connection closed, no reply to %d", req);
    len = get32(c->buf);
    ck_assert_uint_eq(get32(c->buf + 8), (uint32_t)req);
    ck_assert_uint_eq(get32(c->buf + 12), legacy ? MONGO_OP_REPLY : MONGO_OP_MSG);
    if (legacy) {
        ck_assert_uint_eq(get32(c->buf + 16), 0);
        ck_assert_uint_eq(get32(c->buf + 32), 1);
    } else {
        ck_assert_uint_eq(get32(c->buf + 16), 0);
        ck_assert_uint_eq(c->buf[20], 0);
    }
    ck_assert_uint_eq(get32(c->buf + off), len - off);
    ck_assert(bson_init_static(&view, c->buf + off, len - off));
    ck_assert(bson_validate(&view, BSON_VALIDATE_NONE, NULL));
    bson_copy_to(&view, doc);
    memmove(c->buf, c->buf + len, c->len - len);
    c->len -= len;
}

static int reply_code(const bson_t *d)
{
    bson_iter_t it;

    if (bson_iter_init_find(&it, d, "ok") && bson_iter_as_double(&it) == 1.0)
        return 0;
    ck_assert_msg(bson_iter_init_find(&it, d, "errmsg") && BSON_ITER_HOLDS_UTF8(&it),
                  "an error reply without errmsg");
    ck_assert(bson_iter_init_find(&it, d, "codeName"));
    ck_assert(bson_iter_init_find(&it, d, "code"));
    return bson_iter_int32(&it);
}

/* The reply to request `req` is an echo of command `name` (ok) or an
 * error of `code`. */
static void expect_reply(struct conn *c, int32_t req, bool legacy, const char *name, int code)
{
    bson_t d;
    bson_iter_t it;

    next_reply(c, req, legacy, &d);
    ck_assert_msg(reply_code(&d) == code, "reply to %d: code %d, want %d", req,
                  reply_code(&d), code);
    if (!code) {
        char path[80];

        snprintf(path, sizeof(path), "echo.%s", name);
        ck_assert(bson_iter_init(&it, &d));
        ck_assert_msg(bson_iter_find_descendant(&it, path, &it), "no %s", path);
    }
    bson_destroy(&d);
}

static bool conn_closed(struct conn *c)
{
    conn_drain(c);
    for (int i = 0; i < MAX_PUMPS && !c->eof; i++) {
        pump();
        conn_drain(c);
    }
    return c->eof;
}

/* A well-behaved client is served: a ping in, its echo out. */
static void served(struct conn *good, int32_t req)
{
    struct mb b = {0};

    simple_msg(&b, req, "ping");
    conn_send(good, &b);
    expect_reply(good, req, false, "ping", 0);
    free(b.p);
}

START_TEST(handshake_then_op_msg)
{
    struct conn *c = conn_open();
    struct mb b = {0};
    bson_t *q = bson_new(), *body = cmd("insert", "test"), *d = bson_new(), r;
    bson_iter_t it;

    BSON_APPEND_INT32(q, "isMaster", 1);
    query_msg(&b, 100, "admin.$cmd", q, NULL);
    conn_send(c, &b);
    expect_reply(c, 100, true, "isMaster", 0);
    /* The command layer sees the OP_QUERY's database as $db. */
    query_msg(&b, 99, "test.$cmd", q, NULL);
    conn_send(c, &b);
    next_reply(c, 99, true, &r);
    ck_assert(bson_iter_init(&it, &r) && bson_iter_find_descendant(&it, "echo.$db", &it));
    ck_assert_str_eq(bson_iter_utf8(&it, NULL), "test");
    bson_destroy(&r);

    BSON_APPEND_INT32(d, "_id", 1);
    msg_begin(&b, 101, 0);
    sec0(&b, body);
    sec1(&b, "documents", d, 3);
    mb_end(&b);
    conn_send(c, &b);
    next_reply(c, 101, false, &r);
    ck_assert(bson_iter_init(&it, &r) && bson_iter_find_descendant(&it, "seqs.documents", &it));
    ck_assert_int_eq(bson_iter_int32(&it), 3);
    bson_destroy(&r);

    /* A checksummed request is answered without one. */
    msg_begin(&b, 102, MONGO_MSG_CHECKSUM);
    sec0(&b, body);
    msg_end_crc(&b);
    conn_send(c, &b);
    expect_reply(c, 102, false, "insert", 0);
    conn_close(c);
    bson_destroy(q);
    bson_destroy(body);
    bson_destroy(d);
    free(b.p);
}
END_TEST

START_TEST(more_to_come_gets_no_reply)
{
    struct conn *c = conn_open();
    struct mb b = {0}, all = {0};
    bson_t *body = cmd("write", "test");

    /* w:0 writes, a moreToCome request that fails, then a ping. */
    msg_begin(&b, 200, MONGO_MSG_MORE_TO_COME);
    sec0(&b, body);
    mb_end(&b);
    mb_put(&all, b.p, b.len);
    mb_put(&all, b.p, b.len);
    msg_begin(&b, 201, MONGO_MSG_MORE_TO_COME);
    mb_u8(&b, 7);
    mb_end(&b);
    mb_put(&all, b.p, b.len);
    simple_msg(&b, 202, "ping");
    mb_put(&all, b.p, b.len);
    conn_send(c, &all);
    expect_reply(c, 202, false, "ping", 0);
    /* The writes were still made durable. */
    ck_assert_uint_ge(syncs, 1);
    conn_drain(c);
    ck_assert_uint_eq(c->len, 0);
    conn_close(c);
    bson_destroy(body);
    free(b.p);
    free(all.p);
}
END_TEST

START_TEST(group_commit_before_replies)
{
    struct conn *a = conn_open(), *b2 = conn_open();
    struct mb b = {0}, wa = {0}, wb = {0};
    bson_t *w = cmd("write", "test");

    served(a, 1);
    served(b2, 2);
    ck_assert_uint_eq(syncs, 0);        /* reads do not sync */
    sync_watch[0] = a->fd;
    sync_watch[1] = b2->fd;
    /* Both clients' writes are in before the gateway looks: one batch. */
    for (int i = 0; i < 3; i++) {
        msg_begin(&b, 10 + i, 0);
        sec0(&b, w);
        mb_end(&b);
        mb_put(&wa, b.p, b.len);
        msg_begin(&b, 20 + i, 0);
        sec0(&b, w);
        mb_end(&b);
        mb_put(&wb, b.p, b.len);
    }
    simple_msg(&b, 13, "ping");
    mb_put(&wa, b.p, b.len);
    ck_assert_int_eq(send(a->fd, wa.p, wa.len, 0), (ssize_t)wa.len);
    ck_assert_int_eq(send(b2->fd, wb.p, wb.len, 0), (ssize_t)wb.len);
    for (int i = 0; i < MAX_PUMPS && syncs == 0; i++)
        pump();
    ck_assert_uint_eq(syncs, 1);
    ck_assert_int_eq(replies_early, 0);
    for (int i = 0; i < 3; i++) {
        expect_reply(a, 10 + i, false, "write", 0);
        expect_reply(b2, 20 + i, false, "write", 0);
    }
    expect_reply(a, 13, false, "ping", 0);
    ck_assert_uint_eq(syncs, 1);
    conn_close(a);
    conn_close(b2);
    bson_destroy(w);
    free(b.p);
    free(wa.p);
    free(wb.p);
}
END_TEST

START_TEST(sync_failure_fails_writes_only)
{
    struct conn *c = conn_open();
    struct mb b = {0}, all = {0};
    bson_t *w = cmd("write", "test"), *q = bson_new(), d;
    bson_iter_t it;

    BSON_APPEND_INT32(q, "write", 1);
    sync_fails = true;
    /* read, write, read, write (legacy), read: in one batch. */
    simple_msg(&b, 1, "ping");
    mb_put(&all, b.p, b.len);
    msg_begin(&b, 2, 0);
    sec0(&b, w);
    mb_end(&b);
    mb_put(&all, b.p, b.len);
    simple_msg(&b, 3, "find");
    mb_put(&all, b.p, b.len);
    query_msg(&b, 4, "test.$cmd", q, NULL);
    mb_put(&all, b.p, b.len);
    simple_msg(&b, 5, "ping");
    mb_put(&all, b.p, b.len);
    ck_assert_int_eq(send(c->fd, all.p, all.len, 0), (ssize_t)all.len);
    expect_reply(c, 1, false, "ping", 0);
    next_reply(c, 2, false, &d);
    ck_assert_int_eq(reply_code(&d), DOC_OutOfDiskSpace);
    ck_assert(bson_iter_init_find(&it, &d, "fake"));
    bson_destroy(&d);
    expect_reply(c, 3, false, "find", 0);
    next_reply(c, 4, true, &d);
    ck_assert_int_eq(reply_code(&d), DOC_OutOfDiskSpace);
    bson_destroy(&d);
    expect_reply(c, 5, false, "ping", 0);
    ck_assert_uint_eq(syncs, 1);
    /* The next batch syncs again and succeeds. */
    sync_fails = false;
    msg_begin(&b, 6, 0);
    sec0(&b, w);
    mb_end(&b);
    conn_send(c, &b);
    expect_reply(c, 6, false, "write", 0);
    conn_close(c);
    bson_destroy(w);
    bson_destroy(q);
    free(b.p);
    free(all.p);
}
END_TEST

/* Nothing has come on c after a few polls. */
static void nothing_yet(struct conn *c)
{
    for (int i = 0; i < 5; i++)
        pump();
    conn_drain(c);
    ck_assert_uint_eq(c->len, 0);
    ck_assert(!c->eof);
}

/* On a replicated server a write's reply waits for the replicas: it and
 * the client's next messages, however many, wait while other clients are
 * served; then all go in order, or the held reply becomes the error the
 * server gives. */
START_TEST(held_replies_wait_for_the_replicas)
{
    struct conn *c, *good;
    struct mb b = {0}, all = {0};
    bson_t *w = cmd("write", "test");
    bson_t d;

    runner = &fake_held;
    hold_seq = pass_upto = 0;
    holds_fail = false;
    gw_open(4096, 0);
    c = conn_open();
    good = conn_open();
    msg_begin(&b, 1, 0);
    sec0(&b, w);
    mb_end(&b);
    mb_put(&all, b.p, b.len);
    /* More behind it than the gateway's input buffer holds. */
    for (int i = 0; i < 1000; i++) {
        simple_msg(&b, 100 + i, "ping");
        mb_put(&all, b.p, b.len);
    }
    ck_assert_uint_gt(all.len, 48 * 1024);
    conn_send_r(c, all.p, all.len, false);
    nothing_yet(c);
    served(good, 10);
    nothing_yet(c);
    pass_upto = 1;
    expect_reply(c, 1, false, "write", 0);
    for (int i = 0; i < 1000; i++)
        expect_reply(c, 100 + i, false, "ping", 0);
    /* Held, then the node loses its office. */
    msg_begin(&b, 2, 0);
    sec0(&b, w);
    mb_end(&b);
    conn_send(c, &b);
    nothing_yet(c);
    holds_fail = true;
    next_reply(c, 2, false, &d);
    ck_assert_int_eq(reply_code(&d), DOC_PrimarySteppedDown);
    bson_destroy(&d);
    served(c, 3);
    conn_close(c);
    conn_close(good);
    bson_destroy(w);
    free(b.p);
    free(all.p);
}
END_TEST

/* A held reply freed between two polls (the replicas confirmed while
 * the RPC side ran) goes at the next poll at once: nothing on the socket
 * wakes the gateway for it, and it must not sit out the poll's timeout. */
START_TEST(a_freed_held_reply_does_not_wait_out_the_poll)
{
    struct conn *c;
    struct mb b = {0};
    bson_t *w = cmd("write", "test");
    struct timespec t0, t1;
    long ms;

    runner = &fake_held;
    hold_seq = pass_upto = 0;
    holds_fail = false;
    gw_open(0, 0);
    c = conn_open();
    msg_begin(&b, 1, 0);
    sec0(&b, w);
    mb_end(&b);
    conn_send(c, &b);
    nothing_yet(c);
    pass_upto = 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_ge(mongo_gw_poll(gw, 5000), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    /* Well under the timeout, with room for a loaded machine. */
    ck_assert_msg(ms < 2500, "the poll waited %ld ms", ms);
    expect_reply(c, 1, false, "write", 0);
    conn_close(c);
    bson_destroy(w);
    free(b.p);
}
END_TEST

/* ---- awaitable hello ---- */

/* {hello: 1, topologyVersion: {processId: pid, counter}, maxAwaitTimeMS} */
static void await_msg(struct mb *b, int32_t req, uint32_t flags, const char *pid,
                      int64_t counter, int64_t ms)
{
    bson_t *d = cmd("hello", "admin"), tv;

    BSON_APPEND_DOCUMENT_BEGIN(d, "topologyVersion", &tv);
    BSON_APPEND_UTF8(&tv, "processId", pid);
    BSON_APPEND_INT64(&tv, "counter", counter);
    bson_append_document_end(d, &tv);
    BSON_APPEND_INT64(d, "maxAwaitTimeMS", ms);
    msg_begin(b, req, flags);
    sec0(b, d);
    mb_end(b);
    bson_destroy(d);
}

/* The next reply answers `to` with flagBits `flags` and says topology
 * counter `counter`; returns its requestID (what a streamed reply after
 * it answers). */
static int32_t next_hello(struct conn *c, int32_t to, uint32_t flags, int64_t counter)
{
    uint32_t len;
    int32_t id;
    bson_t view;
    bson_iter_t it;

    ck_assert_msg(conn_wait_reply(c), "connection closed, no reply to %d", to);
    len = get32(c->buf);
    id = (int32_t)get32(c->buf + 4);
    ck_assert_int_eq((int32_t)get32(c->buf + 8), to);
    ck_assert_uint_eq(get32(c->buf + 12), MONGO_OP_MSG);
    ck_assert_uint_eq(get32(c->buf + 16), flags);
    ck_assert(bson_init_static(&view, c->buf + 21, len - 21));
    ck_assert(bson_iter_init_find(&it, &view, "echo") && BSON_ITER_HOLDS_DOCUMENT(&it));
    /* the reply is built from the hello less its awaiting fields... */
    ck_assert(bson_iter_init(&it, &view) &&
              bson_iter_find_descendant(&it, "echo.hello", &it));
    /* ...when it goes: it says the counter of then */
    ck_assert(bson_iter_init_find(&it, &view, "counter"));
    ck_assert_int_eq(bson_iter_int64(&it), counter);
    memmove(c->buf, c->buf + len, c->len - len);
    c->len -= len;
    return id;
}

static unsigned awaiting(void)
{
    struct mongo_gw_stats st;

    mongo_gw_stats(gw, &st);
    return st.awaiting;
}

/* A hello that knows the topology waits for it to change, other clients
 * served meanwhile, and its connection's next message waits behind it. */
START_TEST(awaitable_hello_waits_for_the_topology)
{
    struct conn *c, *good;
    struct mb b = {0}, all = {0};

    runner = &fake_aw;
    topo = 7;
    gw_open(0, 0);
    c = conn_open();
    good = conn_open();
    await_msg(&b, 1, 0, "p", 7, 60000);
    mb_put(&all, b.p, b.len);
    simple_msg(&b, 2, "ping");
    mb_put(&all, b.p, b.len);
    conn_send(c, &all);
    nothing_yet(c);
    ck_assert_uint_eq(awaiting(), 1);
    served(good, 10);
    nothing_yet(c);
    topo_looks = 0;
    topo = 8;
    next_hello(c, 1, 0, 8);
    ck_assert_uint_gt(topo_looks, 0);
    expect_reply(c, 2, false, "ping", 0);
    ck_assert_uint_eq(awaiting(), 0);
    served(c, 3);
    conn_close(c);
    conn_close(good);
    free(b.p);
    free(all.p);
}
END_TEST

/* Not current (another process's, an older counter): answered at once,
 * whatever maxAwaitTimeMS; a wait of 0 goes at once too. A hello of the
 * current version goes after maxAwaitTimeMS with no change. */
START_TEST(awaitable_hello_answered_at_once_or_in_time)
{
    struct conn *c;
    struct mb b = {0};
    uint64_t t0;

    runner = &fake_aw;
    topo = 3;
    gw_open(0, 0);
    c = conn_open();
    /* Were it held, it would wait past MAX_PUMPS: next_hello fails. */
    await_msg(&b, 1, 0, "q", 3, 60000);
    conn_send(c, &b);
    next_hello(c, 1, 0, 3);
    await_msg(&b, 2, 0, "p", 2, 60000);
    conn_send(c, &b);
    next_hello(c, 2, 0, 3);
    await_msg(&b, 3, 0, "p", 3, 0);
    conn_send(c, &b);
    next_hello(c, 3, 0, 3);
    ck_assert_uint_eq(awaiting(), 0);
    t0 = tern_now_ns();
    await_msg(&b, 4, 0, "p", 3, 1500);
    conn_send(c, &b);
    nothing_yet(c);
    next_hello(c, 4, 0, 3);
    /* not before its time (a lower bound: the machine's speed cannot
     * make it early) */
    ck_assert_uint_ge(tern_now_ns() - t0, 1500 * 1000000ull);
    served(c, 5);
    conn_close(c);
    free(b.p);
}
END_TEST

/* exhaustAllowed: answers with moreToCome, each addressed to the one
 * before, one per topology change, or per maxAwaitTimeMS; the client's
 * closing ends it. */
START_TEST(awaitable_hello_streams_with_exhaust)
{
    struct conn *c, *d;
    struct mb b = {0};
    int32_t id;
    uint64_t t0;

    runner = &fake_aw;
    topo = 1;
    gw_open(0, 0);
    c = conn_open();
    await_msg(&b, 1, MONGO_MSG_EXHAUST, "p", 1, 60000);
    conn_send(c, &b);
    nothing_yet(c);
    topo = 2;
    id = next_hello(c, 1, MONGO_MSG_MORE_TO_COME, 2);
    /* It waits again on its own, on the version it just sent. */
    nothing_yet(c);
    ck_assert_uint_eq(awaiting(), 1);
    topo = 3;
    id = next_hello(c, id, MONGO_MSG_MORE_TO_COME, 3);
    topo = 4;
    next_hello(c, id, MONGO_MSG_MORE_TO_COME, 4);
    conn_close(c);
    for (int i = 0; i < MAX_PUMPS && (awaiting() || clients_live); i++)
        pump();
    ck_assert_uint_eq(awaiting(), 0);
    ck_assert_uint_eq(clients_live, 0);

    /* A stale one with exhaust: answered at once, then streamed; with a
     * short maxAwaitTimeMS the stream goes on without changes. */
    d = conn_open();
    t0 = tern_now_ns();
    await_msg(&b, 9, MONGO_MSG_EXHAUST, "q", 0, 300);
    conn_send(d, &b);
    id = next_hello(d, 9, MONGO_MSG_MORE_TO_COME, 4);
    id = next_hello(d, id, MONGO_MSG_MORE_TO_COME, 4);
    id = next_hello(d, id, MONGO_MSG_MORE_TO_COME, 4);
    ck_assert_uint_ge(tern_now_ns() - t0, 2 * 300 * 1000000ull);
    /* Done sending (a half close): the last answer without moreToCome. */
    ck_assert_int_eq(shutdown(d->fd, SHUT_WR), 0);
    ck_assert(conn_closed(d));
    while (d->len && get32(d->buf + 16) == MONGO_MSG_MORE_TO_COME && d->len >= get32(d->buf))
        id = next_hello(d, id, MONGO_MSG_MORE_TO_COME, 4);
    next_hello(d, id, 0, 4);
    ck_assert_uint_eq(awaiting(), 0);
    conn_close(d);
    free(b.p);
}
END_TEST

/* A client gone while its hello waits: freed, nothing held. */
START_TEST(awaitable_hello_of_a_client_gone)
{
    struct conn *c[3];
    struct mb b = {0};

    runner = &fake_aw;
    topo = 5;
    gw_open(0, 0);
    for (int i = 0; i < 3; i++) {
        c[i] = conn_open();
        await_msg(&b, 1, i == 1 ? MONGO_MSG_EXHAUST : 0, "p", 5, 60000);
        conn_send(c[i], &b);
    }
    for (int i = 0; i < 5; i++)
        pump();
    ck_assert_uint_eq(awaiting(), 3);
    for (int i = 0; i < 3; i++)
        conn_close(c[i]);
    for (int i = 0; i < MAX_PUMPS && clients_live; i++)
        pump();
    ck_assert_uint_eq(clients_live, 0);
    ck_assert_uint_eq(awaiting(), 0);
    free(b.p);
}
END_TEST

/* A hostile message gets error `code` and the connection goes on (a good
 * client is served meanwhile). */
static void hostile(const struct mb *bad, int32_t req, bool legacy, int code)
{
    struct conn *c = conn_open(), *good = conn_open();

    served(good, 1);
    conn_send(c, bad);
    expect_reply(c, req, legacy, NULL, code);
    served(good, 2);
    /* The hostile connection still works. */
    served(c, 3);
    conn_close(c);
    conn_close(good);
}

START_TEST(hostile_messages_answered)
{
    struct mb b = {0};
    bson_t *body = cmd("insert", "test"), *d = bson_new(), *q = bson_new();
    size_t at;

    BSON_APPEND_INT32(d, "_id", 1);
    BSON_APPEND_INT32(q, "find", 1);
    /* A section longer than the message. */
    msg_begin(&b, 50, 0);
    sec0(&b, body);
    at = b.len + 1;
    sec1(&b, "documents", d, 1);
    mb_end(&b);
    put32(b.p + at, 1000);
    hostile(&b, 50, false, DOC_ProtocolError);
    /* A kind-1 size below 4 + 1. */
    put32(b.p + at, 4);
    hostile(&b, 50, false, DOC_ProtocolError);
    /* A document longer than its section. */
    put32(b.p + at, 4 + 10 + 2);
    hostile(&b, 50, false, DOC_InvalidBSON);
    /* 1,000 levels deep. */
    nested_msg(&b, 1000);
    hostile(&b, 11, false, DOC_Overflow);
    /* Unknown opcodes. */
    mb_hdr(&b, 51, MONGO_OP_COMPRESSED);
    mb_u32(&b, MONGO_OP_MSG);
    mb_u32(&b, 100);
    mb_u8(&b, 0);
    mb_end(&b);
    hostile(&b, 51, false, DOC_ProtocolError);
    mb_hdr(&b, 52, 2002);
    mb_u32(&b, 0);
    mb_put(&b, "test.c", 7);
    mb_doc(&b, d);
    mb_end(&b);
    hostile(&b, 52, false, DOC_ProtocolError);
    /* A required flag bit tern does not know. */
    msg_begin(&b, 53, 1u << 5);
    sec0(&b, body);
    mb_end(&b);
    hostile(&b, 53, false, DOC_IllegalOpMsgFlag);
    /* A checksum that does not match. */
    msg_begin(&b, 54, MONGO_MSG_CHECKSUM);
    sec0(&b, body);
    msg_end_crc(&b);
    b.p[b.len - 2] ^= 0x10;
    hostile(&b, 54, false, DOC_ProtocolError);
    /* OP_QUERY on a collection: an OP_REPLY error. */
    query_msg(&b, 55, "test.c", q, NULL);
    hostile(&b, 55, true, DOC_ProtocolError);
    /* No body; two bodies. */
    msg_begin(&b, 56, 0);
    sec1(&b, "documents", d, 1);
    mb_end(&b);
    hostile(&b, 56, false, DOC_ProtocolError);
    msg_begin(&b, 57, 0);
    sec0(&b, body);
    sec0(&b, body);
    mb_end(&b);
    hostile(&b, 57, false, DOC_ProtocolError);
    ck_assert_uint_eq(syncs, 0);
    bson_destroy(body);
    bson_destroy(d);
    bson_destroy(q);
    free(b.p);
}
END_TEST

START_TEST(document_of_17_mib)
{
    struct conn *c = conn_open(), *good = conn_open();
    struct mb b = {0};
    bson_t *body = cmd("insert", "test"), *big = bson_new();
    size_t n = 17u << 20;
    char *s = malloc(n + 1);
    struct mongo_gw_stats st;

    ck_assert_ptr_nonnull(s);
    memset(s, 'y', n);
    s[n] = 0;
    BSON_APPEND_UTF8(big, "s", s);
    free(s);
    msg_begin(&b, 60, 0);
    sec0(&b, body);
    sec1(&b, "documents", big, 1);
    mb_end(&b);
    served(good, 1);
    conn_send(c, &b);
    expect_reply(c, 60, false, NULL, DOC_BSONObjectTooLarge);
    served(good, 2);
    served(c, 3);
    mongo_gw_stats(gw, &st);
    ck_assert_uint_eq(st.errors, 1);
    conn_close(c);
    conn_close(good);
    bson_destroy(body);
    bson_destroy(big);
    free(b.p);
}
END_TEST

/* A header that cannot be believed: one error reply, then the close. */
START_TEST(unframeable_stream_closed)
{
    static const uint32_t lens[] = {0, 15, 0xffffffffu, MONGO_MAX_MESSAGE + 1};
    struct mb b = {0};

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        struct conn *c = conn_open(), *good = conn_open();

        simple_msg(&b, 70, "ping");
        put32(b.p, lens[i]);
        served(good, 1);
        conn_send(c, &b);
        expect_reply(c, 70, false, NULL, DOC_ProtocolError);
        ck_assert(conn_closed(c));
        served(good, 2);
        conn_close(c);
        conn_close(good);
    }
    /* A handshake's header that lies is answered as a handshake. */
    {
        struct conn *c = conn_open();

        mb_hdr(&b, 71, MONGO_OP_QUERY);
        put32(b.p, 8);
        conn_send(c, &b);
        expect_reply(c, 71, true, NULL, DOC_ProtocolError);
        ck_assert(conn_closed(c));
        conn_close(c);
    }
    /* Past a gateway's own lower limit. */
    gw_open(4096, 0);
    {
        struct conn *c = conn_open(), *good = conn_open();
        bson_t *d = bson_new();
        char pad[5000];

        memset(pad, 'z', sizeof(pad) - 1);
        pad[sizeof(pad) - 1] = 0;
        BSON_APPEND_UTF8(d, "ping", pad);
        msg_begin(&b, 72, 0);
        sec0(&b, d);
        mb_end(&b);
        conn_send(c, &b);
        expect_reply(c, 72, false, NULL, DOC_ProtocolError);
        ck_assert(conn_closed(c));
        served(good, 1);
        conn_close(c);
        conn_close(good);
        bson_destroy(d);
    }
    free(b.p);
}
END_TEST

/* Truncated: a client that sends part of a message and stops is left
 * waiting, costs nothing more, and is freed when it goes. */
START_TEST(truncated_message_waits)
{
    struct conn *c = conn_open(), *good = conn_open();
    struct mb b = {0};

    served(good, 1);
    ck_assert_uint_eq(clients_live, 2);
    simple_msg(&b, 80, "ping");
    conn_send_r(c, b.p, b.len - 3, true);
    for (int i = 0; i < 5; i++) {
        served(good, 2 + i);
        conn_drain(c);
        ck_assert_uint_eq(c->len, 0);
        ck_assert(!c->eof);
    }
    /* It hangs up mid-message: its doc_client goes with it. */
    conn_close(c);
    for (int i = 0; i < MAX_PUMPS && clients_live == 2; i++)
        pump();
    ck_assert_uint_eq(clients_live, 1);
    served(good, 10);
    conn_close(good);
    free(b.p);
}
END_TEST

/* A slow client: a message a byte at a time, the other served between. */
START_TEST(slow_client)
{
    struct conn *c = conn_open(), *good = conn_open();
    struct mb b = {0};
    bson_t *body = cmd("insert", "test"), *d = bson_new();

    BSON_APPEND_UTF8(d, "k", "some value");
    msg_begin(&b, 90, 0);
    sec1(&b, "documents", d, 2);
    sec0(&b, body);
    mb_end(&b);
    for (size_t i = 0; i < b.len; i++) {
        conn_send_r(c, b.p + i, 1, true);
        if (i % 16 == 0)
            served(good, (int32_t)(1000 + i));
        else
            pump();
    }
    expect_reply(c, 90, false, "insert", 0);
    conn_close(c);
    conn_close(good);
    bson_destroy(body);
    bson_destroy(d);
    free(b.p);
}
END_TEST

/* A client that never reads its replies: its output is held to
 * max_output, after which its messages wait unread, while another client
 * is served; when it reads at last, it gets every reply, in order. */
START_TEST(client_that_never_reads)
{
    /* 16 MiB of replies: more than the kernel holds between the two (the
     * gateway's send buffer, a few MiB at most, and the client's receive
     * buffer, made small here), so the gateway must hold the rest back. */
    enum { N = 1000, PAD = 16 * 1024, OUT_CAP = 64 * 1024 };
    struct conn *c, *good;
    struct mb b = {0}, all = {0};
    bson_t *d = bson_new();
    char *pad = malloc(PAD);
    struct mongo_gw_stats st1, st2;
    const uint8_t *p;
    size_t left;
    int idle = 0;

    ck_assert_ptr_nonnull(pad);
    gw_open(0, OUT_CAP);
    c = conn_open_rcvbuf(64 * 1024);
    good = conn_open();
    memset(pad, 'p', PAD - 1);
    pad[PAD - 1] = 0;
    BSON_APPEND_INT32(d, "ping", 1);
    BSON_APPEND_UTF8(d, "pad", pad);
    for (int i = 0; i < N; i++) {
        msg_begin(&b, 5000 + i, 0);
        sec0(&b, d);
        mb_end(&b);
        mb_put(&all, b.p, b.len);
    }
    /* Send without reading until nothing more goes in 20 polls running. */
    p = all.p;
    left = all.len;
    for (int i = 0; left && idle < 20; i++) {
        ssize_t n = send(c->fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);

        ck_assert_int_lt(i, 100000);
        if (n > 0) {
            p += n;
            left -= (size_t)n;
            idle = 0;
        } else {
            idle++;
        }
        pump();
        if (i % 50 == 0)
            served(good, 1 + i);
    }
    /* However long the gateway runs, it runs none of them now, and the
     * other client is served. */
    mongo_gw_stats(gw, &st1);
    for (int i = 0; i < 20; i++)
        pump();
    served(good, 7);
    mongo_gw_stats(gw, &st2);
    ck_assert_uint_eq(st2.messages, st1.messages + 1);
    ck_assert_msg(st1.messages < N, "all %lu messages ran without a reader",
                  (unsigned long)st1.messages);
    /* Now it reads: everything comes, in order. */
    for (int i = 0; i < N; i++) {
        if (left) {
            ssize_t n = send(c->fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);

            if (n > 0) {
                p += n;
                left -= (size_t)n;
            }
        }
        expect_reply(c, 5000 + i, false, "ping", 0);
    }
    ck_assert_uint_eq(left, 0);
    served(good, 9);
    conn_close(c);
    conn_close(good);
    bson_destroy(d);
    free(pad);
    free(b.p);
    free(all.p);
}
END_TEST

/* Within one read, too: messages stop running once max_output of replies
 * wait, and go on as they are sent. */
START_TEST(output_cap_within_a_read)
{
    enum { N = 100, OUT_CAP = 1024 };
    struct mb b = {0}, all = {0};
    struct mongo_gw_stats st;
    struct conn *c;
    int rc;

    gw_open(0, OUT_CAP);
    c = conn_open();
    for (int i = 0; i < MAX_PUMPS && clients_live == 0; i++)
        pump();
    ck_assert_uint_eq(clients_live, 1);
    for (int i = 0; i < N; i++) {
        simple_msg(&b, 300 + i, "ping");
        mb_put(&all, b.p, b.len);
    }
    ck_assert_int_eq(send(c->fd, all.p, all.len, 0), (ssize_t)all.len);
    /* One poll: one read takes them all in (a few KiB). */
    rc = mongo_gw_poll(gw, 1000);
    ck_assert_int_gt(rc, 0);
    mongo_gw_stats(gw, &st);
    /* An echo is longer than its ping, so past this many the cap held
     * none back. */
    ck_assert_msg(st.messages <= OUT_CAP / b.len + 1,
                  "%lu of %d messages ran in one poll past a %d-byte output cap",
                  (unsigned long)st.messages, N, OUT_CAP);
    for (int i = 0; i < N; i++)
        expect_reply(c, 300 + i, false, "ping", 0);
    conn_close(c);
    free(b.p);
    free(all.p);
}
END_TEST

START_TEST(clients_freed_and_ticked)
{
    struct conn *c[3];

    for (int i = 0; i < 3; i++) {
        c[i] = conn_open();
        served(c[i], i + 1);
    }
    ck_assert_uint_eq(clients_live, 3);
    ck_assert_uint_ge(ticks, 1);
    conn_close(c[1]);
    for (int i = 0; i < MAX_PUMPS && clients_live == 3; i++)
        pump();
    ck_assert_uint_eq(clients_live, 2);
    served(c[0], 10);
    served(c[2], 11);
    conn_close(c[0]);
    conn_close(c[2]);
    /* gw_teardown checks the rest go with the gateway. */
}
END_TEST

START_TEST(max_clients_refused)
{
    struct conn *a, *b2, *c;

    max_clients = 2;
    gw_open(0, 0);
    a = conn_open();
    b2 = conn_open();
    served(a, 1);
    served(b2, 2);
    /* The third is closed unserved; the others go on. */
    c = conn_open();
    ck_assert(conn_closed(c));
    ck_assert_uint_eq(clients_live, 2);
    served(a, 3);
    /* Once one leaves there is room again. */
    conn_close(b2);
    for (int i = 0; i < MAX_PUMPS && clients_live == 2; i++)
        pump();
    conn_close(c);
    c = conn_open();
    served(c, 4);
    served(a, 5);
    conn_close(a);
    conn_close(c);
}
END_TEST

START_TEST(watched_fd_wakes_poll)
{
    int p[2];

    ck_assert_int_eq(pipe(p), 0);
    ck_assert_int_eq(mongo_gw_watch_fd(gw, p[0]), 0);
    ck_assert_int_eq(mongo_gw_watch_fd(gw, p[0]), TERN_EINVAL);
    ck_assert_int_eq(mongo_gw_poll(gw, 0), 0);
    ck_assert(!mongo_gw_watch_ready(gw));
    ck_assert_int_eq(write(p[1], "x", 1), 1);
    ck_assert_int_eq(mongo_gw_poll(gw, 1000), 0);
    ck_assert(mongo_gw_watch_ready(gw));
    close(p[0]);
    close(p[1]);
}
END_TEST

/* ---- the gateway on the real command layer and store ---- */

static char real_dir[128], real_path[192];
static struct doc_store *real_store;
static struct doc_server *real_srv;

static void real_open(bool create)
{
    struct doc_store_opts so = {.pool_size = 256u << 20, .create = create};
    struct doc_err e = {0};
    int rc;

    rc = doc_store_open(real_path, &so, &real_store, &e);
    ck_assert_msg(rc == 0, "store: %s", e.msg);
    rc = doc_server_open(real_store, NULL, &real_srv);
    ck_assert_int_eq(rc, 0);
    rc = mongo_gw_create(real_srv, NULL, &gw);
    ck_assert_msg(rc == 0, "gateway: %s", tern_strerror(rc));
}

static void real_close(void)
{
    mongo_gw_destroy(gw);
    gw = NULL;
    doc_server_close(real_srv);
    real_srv = NULL;
    doc_store_close(real_store);
    real_store = NULL;
}

static void real_setup(void)
{
    test_pool_dir(real_dir, sizeof(real_dir), "mongo");
    snprintf(real_path, sizeof(real_path), "%s/pool", real_dir);
    real_open(true);
}

static void real_teardown(void)
{
    if (gw)
        real_close();
    unlink(real_path);
    rmdir(real_dir);
}

static double doc_num(const bson_t *d, const char *path)
{
    bson_iter_t it;

    ck_assert_msg(bson_iter_init(&it, d) && bson_iter_find_descendant(&it, path, &it),
                  "no %s", path);
    return bson_iter_as_double(&it);
}

static int batch_len(const bson_t *d, const char *path)
{
    bson_iter_t it, sub;
    int n = 0;

    ck_assert_msg(bson_iter_init(&it, d) && bson_iter_find_descendant(&it, path, &it) &&
                      BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &sub),
                  "no array %s", path);
    while (bson_iter_next(&sub))
        n++;
    return n;
}

/* A command with `$db: test` after the caller's fields. */
static void run_cmd(struct conn *c, int32_t req, bson_t *body, const char *seq_id,
                    const bson_t *docs, int ndocs, bson_t *reply)
{
    struct mb b = {0};

    BSON_APPEND_UTF8(body, "$db", "test");
    msg_begin(&b, req, 0);
    sec0(&b, body);
    if (seq_id) {
        mb_u8(&b, 1);
        {
            size_t at = b.len;

            mb_u32(&b, 0);
            mb_put(&b, seq_id, strlen(seq_id) + 1);
            for (int i = 0; i < ndocs; i++)
                mb_doc(&b, &docs[i]);
            put32(b.p + at, (uint32_t)(b.len - at));
        }
    }
    mb_end(&b);
    conn_send(c, &b);
    next_reply(c, req, false, reply);
    free(b.p);
}

START_TEST(real_stack_crud_and_hostile)
{
    struct conn *c = conn_open(), *bad = conn_open();
    struct mb b = {0};
    bson_t *q = bson_new(), body, reply, docs[3];
    struct mongo_gw_stats st;
    bson_iter_t it;

    /* The handshake, as pymongo sends it. */
    BSON_APPEND_INT32(q, "ismaster", 1);
    query_msg(&b, 1, "admin.$cmd", q, NULL);
    conn_send(c, &b);
    next_reply(c, 1, true, &reply);
    ck_assert(doc_num(&reply, "ok") == 1.0);
    ck_assert(doc_num(&reply, "maxWireVersion") >= 9);
    ck_assert(doc_num(&reply, "minWireVersion") <= 2);
    bson_destroy(&reply);

    /* insert_many: a kind-1 "documents" sequence. */
    for (int i = 0; i < 3; i++) {
        bson_init(&docs[i]);
        BSON_APPEND_INT32(&docs[i], "_id", i);
        BSON_APPEND_UTF8(&docs[i], "v", "value");
    }
    bson_init(&body);
    BSON_APPEND_UTF8(&body, "insert", "c");
    BSON_APPEND_BOOL(&body, "ordered", true);
    run_cmd(c, 2, &body, "documents", docs, 3, &reply);
    ck_assert_msg(doc_num(&reply, "ok") == 1.0 && doc_num(&reply, "n") == 3, "insert failed");
    bson_destroy(&reply);
    bson_destroy(&body);
    mongo_gw_stats(gw, &st);
    ck_assert_uint_eq(st.syncs, 1);

    /* A hostile client between: its error, and nothing else changes. */
    nested_msg(&b, 1000);
    conn_send(bad, &b);
    expect_reply(bad, 11, false, NULL, DOC_Overflow);
    /* Its duplicate key: a write error inside an ok:1 reply. */
    bson_init(&body);
    BSON_APPEND_UTF8(&body, "insert", "c");
    run_cmd(bad, 12, &body, "documents", docs, 1, &reply);
    ck_assert(doc_num(&reply, "ok") == 1.0 && doc_num(&reply, "n") == 0);
    ck_assert(doc_num(&reply, "writeErrors.0.code") == DOC_DuplicateKey);
    bson_destroy(&reply);
    bson_destroy(&body);

    bson_init(&body);
    BSON_APPEND_UTF8(&body, "find", "c");
    run_cmd(c, 3, &body, NULL, NULL, 0, &reply);
    ck_assert(doc_num(&reply, "ok") == 1.0);
    ck_assert_int_eq(batch_len(&reply, "cursor.firstBatch"), 3);
    bson_destroy(&reply);
    bson_destroy(&body);

    /* An unknown command: CommandNotFound with an errmsg, and the
     * connection goes on. */
    bson_init(&body);
    BSON_APPEND_INT32(&body, "frobnicate", 1);
    run_cmd(c, 4, &body, NULL, NULL, 0, &reply);
    ck_assert_int_eq(reply_code(&reply), DOC_CommandNotFound);
    ck_assert(bson_iter_init_find(&it, &reply, "errmsg") &&
              strstr(bson_iter_utf8(&it, NULL), "frobnicate"));
    bson_destroy(&reply);
    bson_destroy(&body);
    conn_close(c);
    conn_close(bad);

    /* What was acknowledged is in the pool after a reopen. */
    real_close();
    real_open(false);
    c = conn_open();
    bson_init(&body);
    BSON_APPEND_UTF8(&body, "count", "c");
    run_cmd(c, 5, &body, NULL, NULL, 0, &reply);
    ck_assert(doc_num(&reply, "ok") == 1.0 && doc_num(&reply, "n") == 3);
    bson_destroy(&reply);
    bson_destroy(&body);
    conn_close(c);
    for (int i = 0; i < 3; i++)
        bson_destroy(&docs[i]);
    bson_destroy(q);
    free(b.p);
}
END_TEST

/* The command layer's awaitable hello through the gateway, as pymongo
 * 3.11's monitor streams it: the version from a plain hello, then
 * {ismaster, topologyVersion, maxAwaitTimeMS} with exhaustAllowed. A
 * server alone never changes, so each answer comes after maxAwaitTimeMS,
 * with moreToCome; a malformed one is an error, answered at once. */
START_TEST(real_stack_awaitable_hello)
{
    struct conn *c = conn_open();
    struct mb b = {0};
    bson_t body, reply, tv, *h;
    bson_iter_t it;
    uint64_t t0;
    uint32_t len;

    bson_init(&body);
    BSON_APPEND_INT32(&body, "ismaster", 1);
    run_cmd(c, 1, &body, NULL, NULL, 0, &reply);
    ck_assert(bson_iter_init(&it, &reply) &&
              bson_iter_find_descendant(&it, "topologyVersion", &it) &&
              BSON_ITER_HOLDS_DOCUMENT(&it));
    ck_assert_int_eq(doc_num(&reply, "topologyVersion.counter"), 0);
    h = cmd("ismaster", "admin");
    {
        const uint8_t *data;
        uint32_t n;

        bson_iter_document(&it, &n, &data);
        ck_assert(bson_init_static(&tv, data, n));
        BSON_APPEND_DOCUMENT(h, "topologyVersion", &tv);
    }
    BSON_APPEND_INT32(h, "maxAwaitTimeMS", 300);
    t0 = tern_now_ns();
    msg_begin(&b, 2, MONGO_MSG_EXHAUST);
    sec0(&b, h);
    mb_end(&b);
    conn_send(c, &b);
    for (int k = 0; k < 2; k++) {
        bson_t view;

        ck_assert(conn_wait_reply(c));
        len = get32(c->buf);
        ck_assert_uint_eq(get32(c->buf + 16), MONGO_MSG_MORE_TO_COME);
        ck_assert(bson_init_static(&view, c->buf + 21, len - 21));
        ck_assert(doc_num(&view, "ok") == 1.0);
        ck_assert(doc_num(&view, "ismaster") == 1.0);
        ck_assert_int_eq(doc_num(&view, "topologyVersion.counter"), 0);
        memmove(c->buf, c->buf + len, c->len - len);
        c->len -= len;
    }
    ck_assert_uint_ge(tern_now_ns() - t0, 2 * 300 * 1000000ull);
    conn_close(c);

    /* maxAwaitTimeMS without topologyVersion: MongoDB's 31368, at once,
     * and no stream. */
    c = conn_open();
    bson_reinit(h);
    BSON_APPEND_INT32(h, "hello", 1);
    BSON_APPEND_INT32(h, "maxAwaitTimeMS", 300);
    BSON_APPEND_UTF8(h, "$db", "admin");
    msg_begin(&b, 3, MONGO_MSG_EXHAUST);
    sec0(&b, h);
    mb_end(&b);
    conn_send(c, &b);
    expect_reply(c, 3, false, NULL, 31368);
    bson_destroy(&reply);
    bson_reinit(&body);
    BSON_APPEND_INT32(&body, "ping", 1);
    run_cmd(c, 4, &body, NULL, NULL, 0, &reply);
    ck_assert(doc_num(&reply, "ok") == 1.0);
    conn_close(c);
    bson_destroy(h);
    bson_destroy(&body);
    bson_destroy(&reply);
    free(b.p);
}
END_TEST

Suite *suite_mongo_wire(void)
{
    Suite *s = suite_create("mongo_wire");
    TCase *p = tcase_create("parse");
    TCase *g = tcase_create("gateway");
    TCase *r = tcase_create("real");

    tcase_set_timeout(p, 60);
    tcase_add_test(p, crc32c_known_answer);
    tcase_add_test(p, frame_lengths);
    tcase_add_test(p, op_msg_body_and_sequences);
    tcase_add_test(p, op_msg_checksum);
    tcase_add_test(p, op_msg_flags);
    tcase_add_test(p, op_msg_sections_that_lie);
    tcase_add_test(p, bad_bson_refused);
    tcase_add_test(p, depth_capped);
    tcase_add_test(p, depth_capped_before_validation);
    tcase_add_test(p, document_too_large);
    tcase_add_test(p, unknown_opcodes);
    tcase_add_test(p, op_query_handshake);
    tcase_add_test(p, reply_layouts);
    tcase_add_test(p, error_doc_shape);
    suite_add_tcase(s, p);

    tcase_add_checked_fixture(g, gw_setup, gw_teardown);
    tcase_set_timeout(g, 120);
    tcase_add_test(g, handshake_then_op_msg);
    tcase_add_test(g, more_to_come_gets_no_reply);
    tcase_add_test(g, group_commit_before_replies);
    tcase_add_test(g, sync_failure_fails_writes_only);
    tcase_add_test(g, held_replies_wait_for_the_replicas);
    tcase_add_test(g, a_freed_held_reply_does_not_wait_out_the_poll);
    tcase_add_test(g, hostile_messages_answered);
    tcase_add_test(g, document_of_17_mib);
    tcase_add_test(g, unframeable_stream_closed);
    tcase_add_test(g, truncated_message_waits);
    tcase_add_test(g, slow_client);
    tcase_add_test(g, client_that_never_reads);
    tcase_add_test(g, output_cap_within_a_read);
    tcase_add_test(g, clients_freed_and_ticked);
    tcase_add_test(g, max_clients_refused);
    tcase_add_test(g, watched_fd_wakes_poll);
    tcase_add_test(g, awaitable_hello_waits_for_the_topology);
    tcase_add_test(g, awaitable_hello_answered_at_once_or_in_time);
    tcase_add_test(g, awaitable_hello_streams_with_exhaust);
    tcase_add_test(g, awaitable_hello_of_a_client_gone);
    suite_add_tcase(s, g);

    tcase_add_checked_fixture(r, real_setup, real_teardown);
    tcase_set_timeout(r, 120);
    tcase_add_test(r, real_stack_crud_and_hostile);
    tcase_add_test(r, real_stack_awaitable_hello);
    suite_add_tcase(s, r);
    return s;
}
