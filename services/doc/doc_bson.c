/* BSON comparison order, key strings and dotted paths (doc_bson.h).
 *
 * Numbers compare and encode through one decomposition, (d, r): d is the
 * largest double not above the value and r the integer rest (0 but for an
 * int64 beyond 2^53 that no double holds, where r < 2^11). Two numbers
 * order as their (d, r) pairs do, exactly, so an int64 never meets a
 * double through a lossy conversion; the key string writes d's bits in
 * memcmp order and r in two bytes, and doc_val_cmp compares the same
 * pair, which is what keeps the two orders the same. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "doc_bson.h"

enum {
    RANK_MINKEY = 1,
    RANK_NULL,
    RANK_NUMBER,
    RANK_STRING,
    RANK_DOCUMENT,
    RANK_ARRAY,
    RANK_BINARY,
    RANK_OID,
    RANK_BOOL,
    RANK_DATE,
    RANK_TIMESTAMP,
    RANK_REGEX,
    RANK_DBPOINTER,
    RANK_CODE,
    RANK_CODEWSCOPE,
    RANK_MAXKEY,
};

/* The byte after a document's or an array's last element: below every
 * rank byte, so the shorter of two with a common prefix sorts first. */
#define KEY_END 0x00

/* By type code; 0 (EOD, a missing field) with null; the codes no type
 * has (0x14..0x7e, 0x80..0xfe) after everything, as MaxKey. */
static const uint8_t ranks[256] = {
    [BSON_TYPE_EOD] = RANK_NULL,
    [BSON_TYPE_DOUBLE] = RANK_NUMBER,
    [BSON_TYPE_UTF8] = RANK_STRING,
    [BSON_TYPE_DOCUMENT] = RANK_DOCUMENT,
    [BSON_TYPE_ARRAY] = RANK_ARRAY,
    [BSON_TYPE_BINARY] = RANK_BINARY,
    [BSON_TYPE_UNDEFINED] = RANK_NULL,
    [BSON_TYPE_OID] = RANK_OID,
    [BSON_TYPE_BOOL] = RANK_BOOL,
    [BSON_TYPE_DATE_TIME] = RANK_DATE,
    [BSON_TYPE_NULL] = RANK_NULL,
    [BSON_TYPE_REGEX] = RANK_REGEX,
    [BSON_TYPE_DBPOINTER] = RANK_DBPOINTER,
    [BSON_TYPE_CODE] = RANK_CODE,
    [BSON_TYPE_SYMBOL] = RANK_STRING,
    [BSON_TYPE_CODEWSCOPE] = RANK_CODEWSCOPE,
    [BSON_TYPE_INT32] = RANK_NUMBER,
    [BSON_TYPE_TIMESTAMP] = RANK_TIMESTAMP,
    [BSON_TYPE_INT64] = RANK_NUMBER,
    [BSON_TYPE_DECIMAL128] = RANK_NUMBER,
    [BSON_TYPE_MAXKEY] = RANK_MAXKEY,
    [BSON_TYPE_MINKEY] = RANK_MINKEY,
};

int doc_type_rank(bson_type_t t)
{
    unsigned r = ranks[(uint8_t)t];

    return r ? (int)r : RANK_MAXKEY;
}

/* Spaced out so that a range of one type, [b, b + 1), never takes in
 * the next type's keys, and so that KEY_END stays below all of them. */
uint8_t doc_key_rank_byte(bson_type_t t)
{
    return (uint8_t)(0x10 + 8 * doc_type_rank(t));
}

/* ---- numbers ---- */

struct num {
    bool nan;
    double d;
    uint16_t r;
};

static double dec128_to_double(const bson_decimal128_t *dec)
{
    char s[BSON_DECIMAL128_STRING];

    bson_decimal128_to_string(dec, s);
    return strtod(s, NULL);
}

/* 2^63 as a double: the first double no int64 reaches. */
#define TWO63 9223372036854775808.0

static struct num num_of(const bson_value_t *v)
{
    struct num n = {false, 0, 0};
    int64_t x;

    switch (v->value_type) {
    case BSON_TYPE_INT32:
        n.d = v->value.v_int32;
        return n;
    case BSON_TYPE_INT64:
        x = v->value.v_int64;
        n.d = (double)x;
        /* Rounded to nearest: step down when that went above x (only
         * where |x| > 2^53, so d is no zero and the next double down is
         * one ulp of the bits away). */
        if (n.d >= TWO63 || (int64_t)n.d > x) {
            uint64_t u;

            memcpy(&u, &n.d, 8);
            u = n.d > 0 ? u - 1 : u + 1;
            memcpy(&n.d, &u, 8);
        }
        n.r = (uint16_t)((uint64_t)x - (uint64_t)(int64_t)n.d);
        return n;
    case BSON_TYPE_DOUBLE:
        n.d = v->value.v_double;
        break;
    case BSON_TYPE_DECIMAL128:
        n.d = dec128_to_double(&v->value.v_decimal128);
        break;
    default:
        return n;
    }
    if (isnan(n.d)) {
        n.nan = true;
        n.d = 0;
    } else if (n.d == 0) {
        n.d = 0; /* -0.0 is 0 */
    }
    return n;
}

static int num_cmp(const bson_value_t *a, const bson_value_t *b)
{
    struct num x = num_of(a), y = num_of(b);

    if (x.nan || y.nan)
        return x.nan && y.nan ? 0 : x.nan ? -1 : 1;
    if (x.d != y.d)
        return x.d < y.d ? -1 : 1;
    return (x.r > y.r) - (x.r < y.r);
}

/* ---- comparison ---- */

static int bytes_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);

    if (c)
        return c < 0 ? -1 : 1;
    return (alen > blen) - (alen < blen);
}

static int doc_bytes_cmp(const uint8_t *a, uint32_t alen, const uint8_t *b, uint32_t blen);

static int str_cmp(const char *a, const char *b)
{
    return bytes_cmp(a, strlen(a), b, strlen(b));
}

int doc_val_cmp(const bson_value_t *a, const bson_value_t *b)
{
    int ra = doc_type_rank(a->value_type), rb = doc_type_rank(b->value_type);
    int c;

    if (ra != rb)
        return ra < rb ? -1 : 1;
    switch (ra) {
    case RANK_MINKEY:
    case RANK_NULL:
    case RANK_MAXKEY:
        return 0;
    case RANK_NUMBER:
        return num_cmp(a, b);
    case RANK_STRING: {
        const char *sa, *sb;
        size_t la, lb;

        if (a->value_type == BSON_TYPE_UTF8)
            sa = a->value.v_utf8.str, la = a->value.v_utf8.len;
        else
            sa = a->value.v_symbol.symbol, la = a->value.v_symbol.len;
        if (b->value_type == BSON_TYPE_UTF8)
            sb = b->value.v_utf8.str, lb = b->value.v_utf8.len;
        else
            sb = b->value.v_symbol.symbol, lb = b->value.v_symbol.len;
        return bytes_cmp(sa, la, sb, lb);
    }
    case RANK_DOCUMENT:
    case RANK_ARRAY:
        return doc_bytes_cmp(a->value.v_doc.data, a->value.v_doc.data_len,
                             b->value.v_doc.data, b->value.v_doc.data_len);
    case RANK_BINARY:
        if (a->value.v_binary.data_len != b->value.v_binary.data_len)
            return a->value.v_binary.data_len < b->value.v_binary.data_len ? -1 : 1;
        if (a->value.v_binary.subtype != b->value.v_binary.subtype)
            return a->value.v_binary.subtype < b->value.v_binary.subtype ? -1 : 1;
        return bytes_cmp(a->value.v_binary.data, a->value.v_binary.data_len,
                         b->value.v_binary.data, b->value.v_binary.data_len);
    case RANK_OID:
        return bytes_cmp(&a->value.v_oid, 12, &b->value.v_oid, 12);
    case RANK_BOOL:
        return (int)a->value.v_bool - (int)b->value.v_bool;
    case RANK_DATE:
        return (a->value.v_datetime > b->value.v_datetime) -
               (a->value.v_datetime < b->value.v_datetime);
    case RANK_TIMESTAMP: {
        uint64_t x = (uint64_t)a->value.v_timestamp.timestamp << 32 | a->value.v_timestamp.increment;
        uint64_t y = (uint64_t)b->value.v_timestamp.timestamp << 32 | b->value.v_timestamp.increment;

        return (x > y) - (x < y);
    }
    case RANK_REGEX:
        c = str_cmp(a->value.v_regex.regex, b->value.v_regex.regex);
        return c ? c : str_cmp(a->value.v_regex.options, b->value.v_regex.options);
    case RANK_DBPOINTER:
        c = bytes_cmp(a->value.v_dbpointer.collection, a->value.v_dbpointer.collection_len,
                      b->value.v_dbpointer.collection, b->value.v_dbpointer.collection_len);
        return c ? c : bytes_cmp(&a->value.v_dbpointer.oid, 12, &b->value.v_dbpointer.oid, 12);
    case RANK_CODE:
        return bytes_cmp(a->value.v_code.code, a->value.v_code.code_len,
                         b->value.v_code.code, b->value.v_code.code_len);
    case RANK_CODEWSCOPE:
        c = bytes_cmp(a->value.v_codewscope.code, a->value.v_codewscope.code_len,
                      b->value.v_codewscope.code, b->value.v_codewscope.code_len);
        return c ? c : doc_bytes_cmp(a->value.v_codewscope.scope_data,
                                     a->value.v_codewscope.scope_len,
                                     b->value.v_codewscope.scope_data,
                                     b->value.v_codewscope.scope_len);
    }
    return 0;
}

bool doc_val_eq(const bson_value_t *a, const bson_value_t *b)
{
    return doc_val_cmp(a, b) == 0;
}

/* Field by field: type rank, then name, then value. A document that does
 * not parse compares as empty (callers validate what they store). */
static int doc_bytes_cmp(const uint8_t *a, uint32_t alen, const uint8_t *b, uint32_t blen)
{
    bson_iter_t ia, ib;
    bool ma, mb;

    if (!bson_iter_init_from_data(&ia, a, alen))
        alen = 0;
    if (!bson_iter_init_from_data(&ib, b, blen))
        blen = 0;
    for (;;) {
        ma = alen && bson_iter_next(&ia);
        mb = blen && bson_iter_next(&ib);
        if (!ma || !mb)
            return (int)ma - (int)mb;
        int ra = doc_type_rank(bson_iter_type(&ia)), rb = doc_type_rank(bson_iter_type(&ib));

        if (ra != rb)
            return ra < rb ? -1 : 1;
        int c = bytes_cmp(bson_iter_key(&ia), bson_iter_key_len(&ia),
                          bson_iter_key(&ib), bson_iter_key_len(&ib));

        if (c)
            return c;
        c = doc_val_cmp(bson_iter_value(&ia), bson_iter_value(&ib));
        if (c)
            return c;
    }
}

int doc_cmp(const bson_t *a, const bson_t *b)
{
    return doc_bytes_cmp(bson_get_data(a), a->len, bson_get_data(b), b->len);
}

/* ---- buffer ---- */

void doc_buf_free(struct doc_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

void doc_buf_reset(struct doc_buf *b)
{
    b->len = 0;
    b->oom = false;
}

static bool buf_grow(struct doc_buf *b, size_t n)
{
    size_t cap;
    uint8_t *p;

    if (b->oom)
        return false;
    if (n <= b->cap - b->len)
        return true;
    cap = b->cap ? b->cap : 64;
    while (cap - b->len < n) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return false;
        }
        cap *= 2;
    }
    p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void doc_buf_add(struct doc_buf *b, const void *p, size_t n)
{
    if (!n || !buf_grow(b, n))
        return;
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void buf_byte(struct doc_buf *b, uint8_t c)
{
    doc_buf_add(b, &c, 1);
}

static void buf_be64(struct doc_buf *b, uint64_t x)
{
    uint8_t o[8];

    for (int i = 0; i < 8; i++)
        o[i] = (uint8_t)(x >> (56 - 8 * i));
    doc_buf_add(b, o, 8);
}

/* ---- key strings ----
 *
 * Every encoding below is written ascending; doc_key_add complements the
 * bytes it appended when asked for descending. */

/* Bytes with NUL as 00 FF and the end as 00 00: memcmp order of the
 * encodings is that of the bytes, and no encoding is a prefix of another. */
static void key_bytes(struct doc_buf *b, const void *p, size_t n)
{
    const uint8_t *s = p, *end = s + n;
    static const uint8_t nul[2] = {0x00, 0xff}, fin[2] = {0x00, 0x00};

    while (s < end) {
        const uint8_t *z = memchr(s, 0, (size_t)(end - s));

        if (!z) {
            doc_buf_add(b, s, (size_t)(end - s));
            break;
        }
        doc_buf_add(b, s, (size_t)(z - s));
        doc_buf_add(b, nul, 2);
        s = z + 1;
    }
    doc_buf_add(b, fin, 2);
}

static void key_body(struct doc_buf *b, const bson_value_t *v);

/* Elements as (rank byte, name for a document, body), then KEY_END. */
static void key_elements(struct doc_buf *b, const uint8_t *data, uint32_t len, bool names)
{
    bson_iter_t it;

    if (bson_iter_init_from_data(&it, data, len)) {
        while (bson_iter_next(&it)) {
            buf_byte(b, doc_key_rank_byte(bson_iter_type(&it)));
            if (names)
                key_bytes(b, bson_iter_key(&it), bson_iter_key_len(&it));
            key_body(b, bson_iter_value(&it));
        }
    }
    buf_byte(b, KEY_END);
}

static void key_body(struct doc_buf *b, const bson_value_t *v)
{
    switch (v->value_type) {
    case BSON_TYPE_DOUBLE:
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DECIMAL128: {
        struct num n = num_of(v);
        uint64_t u = 0;
        uint8_t r[2];

        /* Sign-magnitude to offset binary; NaN takes 0, below -inf. */
        if (!n.nan) {
            memcpy(&u, &n.d, 8);
            u = (u >> 63) ? ~u : u | (1ull << 63);
        }
        buf_be64(b, u);
        r[0] = (uint8_t)(n.r >> 8);
        r[1] = (uint8_t)n.r;
        doc_buf_add(b, r, 2);
        break;
    }
    case BSON_TYPE_UTF8:
        key_bytes(b, v->value.v_utf8.str, v->value.v_utf8.len);
        break;
    case BSON_TYPE_SYMBOL:
        key_bytes(b, v->value.v_symbol.symbol, v->value.v_symbol.len);
        break;
    case BSON_TYPE_DOCUMENT:
        key_elements(b, v->value.v_doc.data, v->value.v_doc.data_len, true);
        break;
    case BSON_TYPE_ARRAY:
        key_elements(b, v->value.v_doc.data, v->value.v_doc.data_len, false);
        break;
    case BSON_TYPE_BINARY: {
        uint8_t h[5];
        uint32_t n = v->value.v_binary.data_len;

        h[0] = (uint8_t)(n >> 24);
        h[1] = (uint8_t)(n >> 16);
        h[2] = (uint8_t)(n >> 8);
        h[3] = (uint8_t)n;
        h[4] = (uint8_t)v->value.v_binary.subtype;
        doc_buf_add(b, h, 5);
        doc_buf_add(b, v->value.v_binary.data, n);
        break;
    }
    case BSON_TYPE_OID:
        doc_buf_add(b, &v->value.v_oid, 12);
        break;
    case BSON_TYPE_BOOL:
        buf_byte(b, v->value.v_bool ? 1 : 0);
        break;
    case BSON_TYPE_DATE_TIME:
        buf_be64(b, (uint64_t)v->value.v_datetime ^ (1ull << 63));
        break;
    case BSON_TYPE_TIMESTAMP:
        buf_be64(b, (uint64_t)v->value.v_timestamp.timestamp << 32 |
                        v->value.v_timestamp.increment);
        break;
    case BSON_TYPE_REGEX:
        key_bytes(b, v->value.v_regex.regex, strlen(v->value.v_regex.regex));
        key_bytes(b, v->value.v_regex.options, strlen(v->value.v_regex.options));
        break;
    case BSON_TYPE_DBPOINTER:
        key_bytes(b, v->value.v_dbpointer.collection, v->value.v_dbpointer.collection_len);
        doc_buf_add(b, &v->value.v_dbpointer.oid, 12);
        break;
    case BSON_TYPE_CODE:
        key_bytes(b, v->value.v_code.code, v->value.v_code.code_len);
        break;
    case BSON_TYPE_CODEWSCOPE:
        key_bytes(b, v->value.v_codewscope.code, v->value.v_codewscope.code_len);
        key_elements(b, v->value.v_codewscope.scope_data, v->value.v_codewscope.scope_len, true);
        break;
    default: /* MinKey, null, undefined, MaxKey: the rank byte says it all */
        break;
    }
}

void doc_key_add(struct doc_buf *b, const bson_value_t *v, bool descending)
{
    size_t start = b->len;

    buf_byte(b, doc_key_rank_byte(v->value_type));
    key_body(b, v);
    if (descending && !b->oom)
        for (size_t i = start; i < b->len; i++)
            b->p[i] = (uint8_t)~b->p[i];
}

void doc_key_add_min(struct doc_buf *b)
{
    buf_byte(b, doc_key_rank_byte(BSON_TYPE_MINKEY));
}

void doc_key_add_max(struct doc_buf *b)
{
    buf_byte(b, doc_key_rank_byte(BSON_TYPE_MAXKEY));
}

/* ---- dotted paths ---- */

struct walk {
    unsigned flags;
    doc_walk_fn fn;
    void *arg;
};

/* A component that names an array position: digits, no leading zero
 * (the element names "0", "1", ... are what it has to equal). */
static bool comp_index(const char *c, size_t n, uint32_t *idx)
{
    uint64_t x = 0;

    if (n == 0 || n > 9 || (n > 1 && c[0] == '0'))
        return false;
    for (size_t i = 0; i < n; i++) {
        if (c[i] < '0' || c[i] > '9')
            return false;
        x = x * 10 + (uint64_t)(c[i] - '0');
    }
    *idx = (uint32_t)x;
    return true;
}

/* bson_iter_find_w_len, without its strncmp per field: names of another
 * length are skipped unread. */
static bool find_field(bson_iter_t *it, const char *name, size_t n)
{
    while (bson_iter_next(it))
        if (bson_iter_key_len(it) == n && memcmp(bson_iter_key(it), name, n) == 0)
            return true;
    return false;
}

static int walk_leaf(struct walk *w, const bson_value_t *v, bool in_array)
{
    bson_iter_t it;
    int rc;

    if (v->value_type != BSON_TYPE_ARRAY)
        return w->fn(w->arg, v, in_array);
    rc = w->fn(w->arg, v, true);
    if (rc || !(w->flags & DOC_WALK_EXPAND_LEAF))
        return rc;
    if (!bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len))
        return 0;
    while (bson_iter_next(&it))
        if ((rc = w->fn(w->arg, bson_iter_value(&it), true)))
            return rc;
    return 0;
}

static int walk_val(struct walk *w, const bson_value_t *v, const char *path, bool in_array);

/* Field `path`'s first component in the document, then the rest. */
static int walk_doc(struct walk *w, const uint8_t *data, uint32_t len, const char *path,
                    bool in_array)
{
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    bson_iter_t it;

    if (!bson_iter_init_from_data(&it, data, len) ||
        !find_field(&it, path, n))
        return 0;
    if (!dot)
        return walk_leaf(w, bson_iter_value(&it), in_array);
    return walk_val(w, bson_iter_value(&it), dot + 1, in_array);
}

/* The rest of a path (at least one component) from a value: into a
 * document, or across an array: its element at a numeric component's
 * position, and every element that is a document (arrays in the array
 * are not looked into). */
static int walk_val(struct walk *w, const bson_value_t *v, const char *path, bool in_array)
{
    const char *dot;
    bson_iter_t it;
    uint32_t idx = 0, i = 0;
    bool positional;
    int rc;

    if (v->value_type == BSON_TYPE_DOCUMENT)
        return walk_doc(w, v->value.v_doc.data, v->value.v_doc.data_len, path, in_array);
    if (v->value_type != BSON_TYPE_ARRAY)
        return 0;
    dot = strchr(path, '.');
    positional = comp_index(path, dot ? (size_t)(dot - path) : strlen(path), &idx);
    if (!bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len))
        return 0;
    for (; bson_iter_next(&it); i++) {
        const bson_value_t *e = bson_iter_value(&it);

        if (positional && i == idx) {
            rc = dot ? walk_val(w, e, dot + 1, in_array) : walk_leaf(w, e, in_array);
            if (rc)
                return rc;
        }
        if (e->value_type == BSON_TYPE_DOCUMENT &&
            (rc = walk_doc(w, e->value.v_doc.data, e->value.v_doc.data_len, path, true)))
            return rc;
    }
    return 0;
}

int doc_walk(const bson_t *doc, const char *path, unsigned flags, doc_walk_fn fn, void *arg)
{
    struct walk w = {flags, fn, arg};

    return walk_doc(&w, bson_get_data(doc), doc->len, path, false);
}

bool doc_get(const bson_t *doc, const char *path, bson_value_t *out)
{
    const uint8_t *data = bson_get_data(doc);
    uint32_t len = doc->len;
    bool array = false;

    for (;;) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        bson_iter_t it;
        uint32_t idx = 0, i = 0;
        bool found = false;

        if (!bson_iter_init_from_data(&it, data, len))
            return false;
        if (!array) {
            found = find_field(&it, path, n);
        } else if (comp_index(path, n, &idx)) {
            while (!found && bson_iter_next(&it))
                found = i++ == idx;
        }
        if (!found)
            return false;
        if (!dot) {
            *out = *bson_iter_value(&it);
            return true;
        }
        if (BSON_ITER_HOLDS_DOCUMENT(&it))
            bson_iter_document(&it, &len, &data);
        else if (BSON_ITER_HOLDS_ARRAY(&it))
            bson_iter_array(&it, &len, &data);
        else
            return false;
        array = BSON_ITER_HOLDS_ARRAY(&it);
        path = dot + 1;
    }
}

void doc_new_oid(bson_oid_t *oid)
{
    bson_oid_init(oid, NULL);
}

const char *doc_type_name(bson_type_t t)
{
    switch (t) {
    case BSON_TYPE_EOD: return "missing";
    case BSON_TYPE_DOUBLE: return "double";
    case BSON_TYPE_UTF8: return "string";
    case BSON_TYPE_DOCUMENT: return "object";
    case BSON_TYPE_ARRAY: return "array";
    case BSON_TYPE_BINARY: return "binData";
    case BSON_TYPE_UNDEFINED: return "undefined";
    case BSON_TYPE_OID: return "objectId";
    case BSON_TYPE_BOOL: return "bool";
    case BSON_TYPE_DATE_TIME: return "date";
    case BSON_TYPE_NULL: return "null";
    case BSON_TYPE_REGEX: return "regex";
    case BSON_TYPE_DBPOINTER: return "dbPointer";
    case BSON_TYPE_CODE: return "javascript";
    case BSON_TYPE_SYMBOL: return "symbol";
    case BSON_TYPE_CODEWSCOPE: return "javascriptWithScope";
    case BSON_TYPE_INT32: return "int";
    case BSON_TYPE_TIMESTAMP: return "timestamp";
    case BSON_TYPE_INT64: return "long";
    case BSON_TYPE_DECIMAL128: return "decimal";
    case BSON_TYPE_MAXKEY: return "maxKey";
    case BSON_TYPE_MINKEY: return "minKey";
    default: return "unknown";
    }
}
