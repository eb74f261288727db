/* The MongoDB wire protocol: see mongo_wire.h.
 *
 * Nothing here trusts a length: each is checked against the bytes that
 * hold it before anything is read through it, and the arithmetic is done
 * in size_t on lengths already known to be below MONGO_MAX_MESSAGE, so it
 * cannot wrap. A document is a bson_init_static view of the caller's
 * bytes; nothing is copied or allocated.
 */
#include <string.h>

#include "doc_err.h"
#include "mongo_wire.h"

#define OP_MSG_MIN (MONGO_HDR_LEN + 4 + 1)     /* flags and one section's kind */
#define OP_QUERY_MIN (MONGO_HDR_LEN + 4 + 1 + 4 + 4 + 5)
#define DOC_MIN 5
/* OP_MSG flag bits 0-15 are required: one tern does not know is an error. */
#define MSG_REQUIRED_MASK 0xffffu
#define MSG_KNOWN (MONGO_MSG_CHECKSUM | MONGO_MSG_MORE_TO_COME)
#define OP_REPLY_EXTRA (4 + 8 + 4 + 4)

static const uint32_t crc32c_table[256] = {
    0x00000000u, 0xf26b8303u, 0xe13b70f7u, 0x1350f3f4u, 0xc79a971fu, 0x35f1141cu,
    0x26a1e7e8u, 0xd4ca64ebu, 0x8ad958cfu, 0x78b2dbccu, 0x6be22838u, 0x9989ab3bu,
    0x4d43cfd0u, 0xbf284cd3u, 0xac78bf27u, 0x5e133c24u, 0x105ec76fu, 0xe235446cu,
    0xf165b798u, 0x030e349bu, 0xd7c45070u, 0x25afd373u, 0x36ff2087u, 0xc494a384u,
    0x9a879fa0u, 0x68ec1ca3u, 0x7bbcef57u, 0x89d76c54u, 0x5d1d08bfu, 0xaf768bbcu,
    0xbc267848u, 0x4e4dfb4bu, 0x20bd8edeu, 0xd2d60dddu, 0xc186fe29u, 0x33ed7d2au,
    0xe72719c1u, 0x154c9ac2u, 0x061c6936u, 0xf477ea35u, 0xaa64d611u, 0x580f5512u,
    0x4b5fa6e6u, 0xb93425e5u, 0x6dfe410eu, 0x9f95c20du, 0x8cc531f9u, 0x7eaeb2fau,
    0x30e349b1u, 0xc288cab2u, 0xd1d83946u, 0x23b3ba45u, 0xf779deaeu, 0x05125dadu,
    0x1642ae59u, 0xe4292d5au, 0xba3a117eu, 0x4851927du, 0x5b016189u, 0xa96ae28au,
    0x7da08661u, 0x8fcb0562u, 0x9c9bf696u, 0x6ef07595u, 0x417b1dbcu, 0xb3109ebfu,
    0xa0406d4bu, 0x522bee48u, 0x86e18aa3u, 0x748a09a0u, 0x67dafa54u, 0x95b17957u,
    0xcba24573u, 0x39c9c670u, 0x2a993584u, 0xd8f2b687u, 0x0c38d26cu, 0xfe53516fu,
    0xed03a29bu, 0x1f682198u, 0x5125dad3u, 0xa34e59d0u, 0xb01eaa24u, 0x42752927u,
    0x96bf4dccu, 0x64d4cecfu, 0x77843d3bu, 0x85efbe38u, 0xdbfc821cu, 0x2997011fu,
    0x3ac7f2ebu, 0xc8ac71e8u, 0x1c661503u, 0xee0d9600u, 0xfd5d65f4u, 0x0f36e6f7u,
    0x61c69362u, 0x93ad1061u, 0x80fde395u, 0x72966096u, 0xa65c047du, 0x5437877eu,
    0x4767748au, 0xb50cf789u, 0xeb1fcbadu, 0x197448aeu, 0x0a24bb5au, 0xf84f3859u,
    0x2c855cb2u, 0xdeeedfb1u, 0xcdbe2c45u, 0x3fd5af46u, 0x7198540du, 0x83f3d70eu,
    0x90a324fau, 0x62c8a7f9u, 0xb602c312u, 0x44694011u, 0x5739b3e5u, 0xa55230e6u,
    0xfb410cc2u, 0x092a8fc1u, 0x1a7a7c35u, 0xe811ff36u, 0x3cdb9bddu, 0xceb018deu,
    0xdde0eb2au, 0x2f8b6829u, 0x82f63b78u, 0x709db87bu, 0x63cd4b8fu, 0x91a6c88cu,
    0x456cac67u, 0xb7072f64u, 0xa457dc90u, 0x563c5f93u, 0x082f63b7u, 0xfa44e0b4u,
    0xe9141340u, 0x1b7f9043u, 0xcfb5f4a8u, 0x3dde77abu, 0x2e8e845fu, 0xdce5075cu,
    0x92a8fc17u, 0x60c37f14u, 0x73938ce0u, 0x81f80fe3u, 0x55326b08u, 0xa759e80bu,
    0xb4091bffu, 0x466298fcu, 0x1871a4d8u, 0xea1a27dbu, 0xf94ad42fu, 0x0b21572cu,
    0xdfeb33c7u, 0x2d80b0c4u, 0x3ed04330u, 0xccbbc033u, 0xa24bb5a6u, 0x502036a5u,
    0x4370c551u, 0xb11b4652u, 0x65d122b9u, 0x97baa1bau, 0x84ea524eu, 0x7681d14du,
    0x2892ed69u, 0xdaf96e6au, 0xc9a99d9eu, 0x3bc21e9du, 0xef087a76u, 0x1d63f975u,
    0x0e330a81u, 0xfc588982u, 0xb21572c9u, 0x407ef1cau, 0x532e023eu, 0xa145813du,
    0x758fe5d6u, 0x87e466d5u, 0x94b49521u, 0x66df1622u, 0x38cc2a06u, 0xcaa7a905u,
    0xd9f75af1u, 0x2b9cd9f2u, 0xff56bd19u, 0x0d3d3e1au, 0x1e6dcdeeu, 0xec064eedu,
    0xc38d26c4u, 0x31e6a5c7u, 0x22b65633u, 0xd0ddd530u, 0x0417b1dbu, 0xf67c32d8u,
    0xe52cc12cu, 0x1747422fu, 0x49547e0bu, 0xbb3ffd08u, 0xa86f0efcu, 0x5a048dffu,
    0x8ecee914u, 0x7ca56a17u, 0x6ff599e3u, 0x9d9e1ae0u, 0xd3d3e1abu, 0x21b862a8u,
    0x32e8915cu, 0xc083125fu, 0x144976b4u, 0xe622f5b7u, 0xf5720643u, 0x07198540u,
    0x590ab964u, 0xab613a67u, 0xb831c993u, 0x4a5a4a90u, 0x9e902e7bu, 0x6cfbad78u,
    0x7fab5e8cu, 0x8dc0dd8fu, 0xe330a81au, 0x115b2b19u, 0x020bd8edu, 0xf0605beeu,
    0x24aa3f05u, 0xd6c1bc06u, 0xc5914ff2u, 0x37faccf1u, 0x69e9f0d5u, 0x9b8273d6u,
    0x88d28022u, 0x7ab90321u, 0xae7367cau, 0x5c18e4c9u, 0x4f48173du, 0xbd23943eu,
    0xf36e6f75u, 0x0105ec76u, 0x12551f82u, 0xe03e9c81u, 0x34f4f86au, 0xc69f7b69u,
    0xd5cf889du, 0x27a40b9eu, 0x79b737bau, 0x8bdcb4b9u, 0x988c474du, 0x6ae7c44eu,
    0xbe2da0a5u, 0x4c4623a6u, 0x5f16d052u, 0xad7d5351u,
};

uint32_t mongo_crc32c(uint32_t crc, const void *p, size_t n)
{
    const uint8_t *b = p;

    crc = ~crc;
    while (n--)
        crc = crc32c_table[(crc ^ *b++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static int32_t rd32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* Client bytes quoted in an errmsg, which must be UTF-8 for the client to
 * decode the reply: printable ASCII, others as '?', at most 64 bytes. */
static const char *quote(const void *p, size_t n, char out[68])
{
    const uint8_t *b = p;
    size_t i;

    for (i = 0; i < n && i < 64; i++)
        out[i] = b[i] >= 0x20 && b[i] < 0x7f ? (char)b[i] : '?';
    if (n > 64)
        out[i++] = '~';
    out[i] = 0;
    return out;
}

static void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

long mongo_frame(const uint8_t *buf, size_t len, size_t max, struct mongo_hdr *h,
                 struct doc_err *e)
{
    if (max > MONGO_MAX_MESSAGE)
        max = MONGO_MAX_MESSAGE;
    if (len < MONGO_HDR_LEN)
        return 0;
    h->len = rd32(buf);
    h->request_id = rd32(buf + 4);
    h->response_to = rd32(buf + 8);
    h->op = rd32(buf + 12);
    if (h->len < MONGO_HDR_LEN || (size_t)h->len > max)
        return doc_errf(e, DOC_ProtocolError,
                        "message length %d is invalid: min %d, max %zu", h->len,
                        MONGO_HDR_LEN, max);
    if (len < (size_t)h->len)
        return 0;
    return h->len;
}

/* The nesting depth of a document, walked without recursion (libbson's
 * bson_validate recurses per level, so this bounds its stack before it
 * runs): 0, or <0 with *e if the document nests past MONGO_MAX_DEPTH or
 * its elements do not parse. A code-with-scope's scope is a level too:
 * libbson validates it by recursion as well. */
static int check_depth(const bson_t *doc, const char *what, struct doc_err *e)
{
    /* A struct: bson_iter_t is aligned past its size, so no array of it. */
    struct level {
        bson_iter_t it;
    } stack[MONGO_MAX_DEPTH];
    bson_t sub;
    int top = 0;

    if (!bson_iter_init(&stack[0].it, doc))
        return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON: bad document length", what);
    for (;;) {
        bson_iter_t *it = &stack[top].it;
        const uint8_t *sdata;
        const char *key, *str;
        uint32_t code_len, slen;

        if (!bson_iter_next(it)) {
            if (it->err_off)
                return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON at offset %u",
                                what, it->err_off);
            if (top == 0)
                return 0;
            top--;
            continue;
        }
        /* bson_validate(BSON_VALIDATE_UTF8) of libbson 1.23 lets a
         * string of bad UTF-8 through ("\xc3\x28"): check here. */
        key = bson_iter_key(it);
        if (!bson_utf8_validate(key, strlen(key), false))
            return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON: a key is not UTF-8",
                            what);
        switch (bson_iter_type(it)) {
        case BSON_TYPE_UTF8:
            str = bson_iter_utf8(it, &slen);
            goto utf8;
        case BSON_TYPE_CODE:
            str = bson_iter_code(it, &slen);
            goto utf8;
        case BSON_TYPE_SYMBOL:
            str = bson_iter_symbol(it, &slen);
utf8:
            if (!bson_utf8_validate(str, slen, true))
                return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON: a string is not UTF-8",
                                what);
            break;
        /* Each level through bson_init_static, which checks the length
         * and the closing NUL: bson_iter_recurse checks neither, and
         * bson_validate (1.23) skips, as if valid, an embedded document
         * that bson_init_static refuses. */
        case BSON_TYPE_DOCUMENT:
            bson_iter_document(it, &slen, &sdata);
            goto level;
        case BSON_TYPE_ARRAY:
            bson_iter_array(it, &slen, &sdata);
            goto level;
        case BSON_TYPE_CODEWSCOPE:
            str = bson_iter_codewscope(it, &code_len, &slen, &sdata);
            if (!bson_utf8_validate(str, code_len, true))
                return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON: code is not UTF-8",
                                what);
level:
            if (top + 1 == MONGO_MAX_DEPTH)
                goto deep;
            if (!bson_init_static(&sub, sdata, slen) ||
                !bson_iter_init(&stack[top + 1].it, &sub))
                return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON: bad embedded document",
                                what);
            top++;
            break;
        default:
            break;
        }
    }
deep:
    return doc_errf(e, DOC_Overflow, "%s: BSONObj exceeded maximum nested object depth: %d",
                    what, MONGO_MAX_DEPTH);
}

/* The document at p, which must end within `room` bytes: its length, or
 * <0 with *e. *doc is a view of it. */
static long take_doc(const uint8_t *p, size_t room, bson_t *doc, const char *what,
                     struct doc_err *e)
{
    size_t off = 0;
    int32_t n;

    if (room < DOC_MIN)
        return doc_errf(e, DOC_InvalidBSON, "%s: %zu bytes cannot hold a document", what,
                        room);
    n = rd32(p);
    if (n < DOC_MIN)
        return doc_errf(e, DOC_InvalidBSON, "%s: document length %d is invalid", what, n);
    if ((size_t)n > room)
        return doc_errf(e, DOC_InvalidBSON,
                        "%s: document of %d bytes overruns its %zu bytes", what, n, room);
    if ((size_t)n > MONGO_MAX_BSON_INTERNAL)
        return doc_errf(e, DOC_BSONObjectTooLarge,
                        "%s: BSONObj size: %d is invalid. Size must be between 0 and %u",
                        what, n, MONGO_MAX_BSON_INTERNAL);
    if (!bson_init_static(doc, p, (size_t)n))
        return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON", what);
    if (check_depth(doc, what, e) < 0)
        return -1;
    if (!bson_validate(doc, BSON_VALIDATE_UTF8 | BSON_VALIDATE_UTF8_ALLOW_NULL, &off))
        return doc_errf(e, DOC_InvalidBSON, "%s: invalid BSON at offset %zu", what, off);
    return n;
}

/* A kind-1 section at p (after its kind byte), `room` bytes left in the
 * message: its size, or <0. */
static long take_seq(const uint8_t *p, size_t room, struct mongo_msg *m, struct doc_err *e)
{
    const uint8_t *nul, *d, *end;
    struct doc_seq *s;
    int32_t size;
    char q[68];

    if (room < 4)
        return doc_errf(e, DOC_ProtocolError, "OP_MSG document sequence truncated");
    size = rd32(p);
    if (size < 4 + 1)
        return doc_errf(e, DOC_ProtocolError, "OP_MSG document sequence size %d is invalid",
                        size);
    if ((size_t)size > room)
        return doc_errf(e, DOC_ProtocolError,
                        "OP_MSG document sequence of %d bytes overruns the message (%zu left)",
                        size, room);
    end = p + size;
    nul = memchr(p + 4, 0, (size_t)size - 4);
    if (!nul)
        return doc_errf(e, DOC_ProtocolError,
                        "OP_MSG document sequence identifier is not terminated");
    for (unsigned i = 0; i < m->nseq; i++)
        if (m->seqs[i].id_len == (size_t)(nul - (p + 4)) &&
            memcmp(m->seqs[i].id, p + 4, m->seqs[i].id_len) == 0)
            return doc_errf(e, DOC_ProtocolError,
                            "OP_MSG has two document sequences named '%s'",
                            quote(m->seqs[i].id, m->seqs[i].id_len, q));
    if (m->nseq == MONGO_MAX_SECTIONS)
        return doc_errf(e, DOC_ProtocolError, "OP_MSG has more than %d document sequences",
                        MONGO_MAX_SECTIONS);
    for (d = nul + 1; d < end;) {
        bson_t doc;
        long n = take_doc(d, (size_t)(end - d), &doc, "OP_MSG document sequence", e);

        if (n < 0)
            return n;
        d += n;
    }
    s = &m->seqs[m->nseq++];
    s->id = (const char *)(p + 4);
    s->id_len = (size_t)(nul - (p + 4));
    s->docs = nul + 1;
    s->len = (size_t)(end - (nul + 1));
    return size;
}

static int parse_msg(const uint8_t *msg, size_t len, struct mongo_msg *m, struct doc_err *e)
{
    const uint8_t *p, *end = msg + len;
    bool body = false;

    if (len < OP_MSG_MIN)
        return doc_errf(e, DOC_ProtocolError, "OP_MSG of %zu bytes is too short", len);
    m->flags = (uint32_t)rd32(msg + MONGO_HDR_LEN);
    if (m->flags & MSG_REQUIRED_MASK & ~MSG_KNOWN)
        return doc_errf(e, DOC_IllegalOpMsgFlag, "Unrecognized required flags in OP_MSG: 0x%x",
                        m->flags & MSG_REQUIRED_MASK & ~MSG_KNOWN);
    if (m->flags & MONGO_MSG_CHECKSUM) {
        if (len < OP_MSG_MIN + 4)
            return doc_errf(e, DOC_ProtocolError,
                            "OP_MSG of %zu bytes is too short for its checksum", len);
        end -= 4;
        if (mongo_crc32c(0, msg, len - 4) != (uint32_t)rd32(end))
            return doc_errf(e, DOC_ProtocolError, "OP_MSG checksum does not match contents");
    }
    for (p = msg + MONGO_HDR_LEN + 4; p < end;) {
        uint8_t kind = *p++;
        long n;

        if (kind == 0) {
            if (body)
                return doc_errf(e, DOC_ProtocolError,
                                "OP_MSG has more than one body section");
            n = take_doc(p, (size_t)(end - p), &m->body, "OP_MSG body", e);
            body = true;
        } else if (kind == 1) {
            n = take_seq(p, (size_t)(end - p), m, e);
        } else {
            return doc_errf(e, DOC_ProtocolError, "OP_MSG section of unknown kind %u", kind);
        }
        if (n < 0)
            return -1;
        p += n;
    }
    if (!body)
        return doc_errf(e, DOC_ProtocolError, "OP_MSG has no body section");
    return 0;
}

static int parse_query(const uint8_t *msg, size_t len, struct mongo_msg *m, struct doc_err *e)
{
    const uint8_t *p = msg + MONGO_HDR_LEN + 4, *end = msg + len, *nul;
    static const char cmd[] = ".$cmd";
    size_t ns_len;
    bson_t fields;
    bson_iter_t it;
    char q[68];
    long n;

    m->legacy = true;
    if (len < OP_QUERY_MIN)
        return doc_errf(e, DOC_ProtocolError, "OP_QUERY of %zu bytes is too short", len);
    nul = memchr(p, 0, (size_t)(end - p));
    if (!nul)
        return doc_errf(e, DOC_ProtocolError, "OP_QUERY collection name is not terminated");
    ns_len = (size_t)(nul - p);
    if (ns_len <= sizeof(cmd) - 1 ||
        memcmp(nul - (sizeof(cmd) - 1), cmd, sizeof(cmd) - 1) != 0)
        return doc_errf(e, DOC_ProtocolError,
                        "OP_QUERY is only served on a $cmd collection (got '%s'); the "
                        "client driver may require an upgrade",
                        quote(p, ns_len, q));
    m->db = (const char *)p;
    m->db_len = ns_len - (sizeof(cmd) - 1);
    if ((size_t)(end - nul) <= 1 + 4 + 4)
        return doc_errf(e, DOC_ProtocolError, "OP_QUERY truncated after its collection");
    p = nul + 1 + 4 + 4;        /* skip, numberToReturn */
    n = take_doc(p, (size_t)(end - p), &m->body, "OP_QUERY query", e);
    if (n < 0)
        return -1;
    p += n;
    if (p < end) {
        n = take_doc(p, (size_t)(end - p), &fields, "OP_QUERY returnFieldsSelector", e);
        if (n < 0)
            return -1;
        if ((size_t)n != (size_t)(end - p))
            return doc_errf(e, DOC_ProtocolError,
                            "OP_QUERY has %zu bytes after its documents",
                            (size_t)(end - p) - (size_t)n);
    }
    /* Drivers wrap a command as {$query: {...}, $readPreference: ...} for
     * a mongos; MongoDB runs the inner one. */
    if (bson_iter_init(&it, &m->body) && bson_iter_next(&it) &&
        strcmp(bson_iter_key(&it), "$query") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
        const uint8_t *data;
        uint32_t dlen;

        bson_iter_document(&it, &dlen, &data);
        if (!bson_init_static(&m->body, data, dlen))
            return doc_errf(e, DOC_InvalidBSON, "OP_QUERY $query is not a document");
    }
    return 0;
}

int mongo_parse(const uint8_t *msg, size_t len, struct mongo_msg *m, struct doc_err *e)
{
    memset(m, 0, sizeof(*m));
    if (len < MONGO_HDR_LEN)
        return doc_errf(e, DOC_ProtocolError, "message of %zu bytes has no header", len);
    m->h.len = rd32(msg);
    m->h.request_id = rd32(msg + 4);
    m->h.response_to = rd32(msg + 8);
    m->h.op = rd32(msg + 12);
    if (m->h.len < MONGO_HDR_LEN || (size_t)m->h.len != len)
        return doc_errf(e, DOC_ProtocolError, "message length %d, but %zu bytes framed",
                        m->h.len, len);
    switch (m->h.op) {
    case MONGO_OP_MSG:
        return parse_msg(msg, len, m, e);
    case MONGO_OP_QUERY:
        return parse_query(msg, len, m, e);
    case MONGO_OP_COMPRESSED:
        return doc_errf(e, DOC_ProtocolError,
                        "OP_COMPRESSED is not supported: tern offers no compressor");
    default:
        return doc_errf(e, DOC_ProtocolError, "unsupported opcode %d", m->h.op);
    }
}

size_t mongo_reply(const struct mongo_hdr *h, bool legacy, int32_t request_id, const bson_t *doc,
                   uint8_t *out, size_t cap)
{
    size_t extra = legacy ? OP_REPLY_EXTRA : 4 + 1;
    size_t total = MONGO_HDR_LEN + extra + doc->len;
    uint8_t *p = out;

    if (total > cap)
        return total;
    wr32(p, (uint32_t)total);
    wr32(p + 4, (uint32_t)request_id);
    wr32(p + 8, (uint32_t)h->request_id);
    wr32(p + 12, legacy ? MONGO_OP_REPLY : MONGO_OP_MSG);
    p += MONGO_HDR_LEN;
    if (legacy) {
        memset(p, 0, 4 + 8 + 4);        /* responseFlags, cursorID, startingFrom */
        wr32(p + 16, 1);                /* numberReturned */
    } else {
        memset(p, 0, 4 + 1);            /* flagBits, kind 0 */
    }
    memcpy(p + extra, bson_get_data(doc), doc->len);
    return total;
}

void mongo_error_doc(const struct doc_err *e, bson_t *doc)
{
    BSON_APPEND_DOUBLE(doc, "ok", 0.0);
    BSON_APPEND_UTF8(doc, "errmsg", e->msg);
    BSON_APPEND_INT32(doc, "code", e->code);
    BSON_APPEND_UTF8(doc, "codeName", doc_code_name(e->code));
}
