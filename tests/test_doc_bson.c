/* BSON comparison order, key strings and dotted paths (services/doc/doc_bson.c).
 *
 * The order is MongoDB's "Comparison/Sort Order" (manual: reference/bson-type-
 * comparison-order): one table of values of every type, in that order, with
 * equal values in one group; every pair is checked against the table, and
 * the memcmp of their key strings against doc_val_cmp. The path walks are
 * the manual's "Query on Embedded/Nested Documents" and "Query an Array of
 * Embedded Documents" rules. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "doc_bson.h"
#include "suites.h"

/* ---- the ordered table ---- */

static bson_t table;        /* an array document: the values, in order */
static int group[256];      /* equal groups ascend with the order */
static int nvals;
static int cur_group;

#define NEXT() (group[nvals] = ++cur_group)
#define SAME() (group[nvals] = cur_group)
#define KEY() (snprintf(kbuf, sizeof(kbuf), "%d", nvals), nvals++, kbuf)

static void doc_of(bson_t *d, const char *json)
{
    bson_error_t err;

    ck_assert_msg(bson_init_from_json(d, json, -1, &err), "%s: %s", json, err.message);
}

static void add_json(bool same, const char *json)
{
    bson_t d;
    bson_iter_t it;
    char kbuf[16];

    doc_of(&d, json);
    ck_assert(bson_iter_init(&it, &d) && bson_iter_next(&it));
    same ? SAME() : NEXT();
    ck_assert(bson_append_value(&table, KEY(), -1, bson_iter_value(&it)));
    bson_destroy(&d);
}

static void add_i64(bool same, int64_t x)
{
    char kbuf[16];

    same ? SAME() : NEXT();
    bson_append_int64(&table, KEY(), -1, x);
}

static void add_i32(bool same, int32_t x)
{
    char kbuf[16];

    same ? SAME() : NEXT();
    bson_append_int32(&table, KEY(), -1, x);
}

static void add_dbl(bool same, double x)
{
    char kbuf[16];

    same ? SAME() : NEXT();
    bson_append_double(&table, KEY(), -1, x);
}

static void add_dec(bool same, const char *s)
{
    bson_decimal128_t d;
    char kbuf[16];

    ck_assert(bson_decimal128_from_string(s, &d));
    same ? SAME() : NEXT();
    bson_append_decimal128(&table, KEY(), -1, &d);
}

static void add_str(bool same, const char *s, size_t n)
{
    char kbuf[16];

    same ? SAME() : NEXT();
    bson_append_utf8(&table, KEY(), -1, s, (int)n);
}

static void add_bin(bool same, bson_subtype_t st, const char *s, size_t n)
{
    char kbuf[16];

    same ? SAME() : NEXT();
    bson_append_binary(&table, KEY(), -1, st, (const uint8_t *)s, (uint32_t)n);
}

#define TWO53 9007199254740992LL

static void build_table(void)
{
    char kbuf[16];
    bson_oid_t o1, o2;
    bson_t scope;

    bson_init(&table);
    nvals = cur_group = 0;

    NEXT();
    bson_append_minkey(&table, KEY(), -1);
    NEXT();
    bson_append_null(&table, KEY(), -1);
    SAME();
    bson_append_undefined(&table, KEY(), -1);

    /* numbers: NaN below all of them, then by value across types */
    add_dbl(false, NAN);
    add_dec(true, "NaN");
    add_dbl(false, -INFINITY);
    add_dec(true, "-Infinity");
    add_dbl(false, -1e300);
    add_dbl(false, -9223372036854777856.0);         /* below INT64_MIN */
    add_i64(false, INT64_MIN);
    add_dbl(true, -9223372036854775808.0);
    add_i64(false, INT64_MIN + 1);
    add_i64(false, -TWO53 - 1);
    add_dbl(false, (double)-TWO53);
    add_i64(true, -TWO53);
    add_dbl(false, -1.5);
    add_i32(false, -1);
    add_i64(true, -1);
    add_dbl(true, -1.0);
    add_dec(true, "-1");
    add_dbl(false, -1e-300);
    add_dbl(false, 0.0);
    add_dbl(true, -0.0);
    add_i32(true, 0);
    add_i64(true, 0);
    add_dec(true, "0");
    add_dbl(false, 1e-300);
    add_dbl(false, 0.5);
    add_dec(true, "0.5");
    add_i32(false, 1);
    add_i64(true, 1);
    add_dbl(true, 1.0);
    add_dec(true, "1.0");
    add_dec(true, "1");
    add_dbl(false, 1.5);
    add_i32(false, INT32_MAX);
    add_i64(true, INT32_MAX);
    add_i64(false, TWO53 - 1);
    add_i64(false, TWO53);
    add_dbl(true, (double)TWO53);
    add_i64(false, TWO53 + 1);     /* no double holds it */
    add_dbl(false, (double)(TWO53 + 2));
    add_i64(true, TWO53 + 2);
    add_i64(false, TWO53 + 3);
    add_i64(false, 4611686018427387904LL + 1);      /* 2^62 + 1 */
    add_i64(false, INT64_MAX - 1024);
    add_i64(false, INT64_MAX - 1);
    add_i64(false, INT64_MAX);
    add_dbl(false, 9223372036854775808.0);          /* 2^63 */
    add_dbl(false, 1e300);
    add_dbl(false, INFINITY);
    add_dec(true, "Infinity");

    /* strings: bytes, shorter first; a symbol compares as its string */
    add_str(false, "", 0);
    add_str(false, "\0", 1);
    add_str(false, "\0\0", 2);
    add_str(false, "\x01", 1);
    add_str(false, "a", 1);
    NEXT();
    bson_append_symbol(&table, KEY(), -1, "a\0", 2);
    add_str(false, "a\0b", 3);
    add_str(false, "a\x01", 2);
    add_str(false, "ab", 2);
    add_str(false, "b", 1);
    add_str(false, "\xc3\xa9", 2);

    /* documents: field by field, type rank before name before value */
    add_json(false, "{\"v\": {}}");
    add_json(false, "{\"v\": {\"b\": null}}");
    add_json(false, "{\"v\": {\"a\": 1}}");
    add_json(true, "{\"v\": {\"a\": 1.0}}");
    add_json(true, "{\"v\": {\"a\": {\"$numberLong\": \"1\"}}}");
    add_json(false, "{\"v\": {\"a\": 1, \"b\": 1}}");
    add_json(false, "{\"v\": {\"a\": 2}}");
    add_json(false, "{\"v\": {\"b\": 1}}");
    add_json(false, "{\"v\": {\"a\": \"x\"}}");
    add_json(false, "{\"v\": {\"a\": {}}}");
    add_json(false, "{\"v\": {\"a\": []}}");
    add_json(false, "{\"v\": {\"a\": true}}");

    /* arrays: element by element, the prefix first */
    add_json(false, "{\"v\": []}");
    add_json(false, "{\"v\": [null]}");
    add_json(false, "{\"v\": [1]}");
    add_json(true, "{\"v\": [1.0]}");
    add_json(false, "{\"v\": [1, 2]}");
    add_json(false, "{\"v\": [1, \"a\"]}");
    add_json(false, "{\"v\": [2]}");
    add_json(false, "{\"v\": [\"a\"]}");
    add_json(false, "{\"v\": [[1]]}");

    /* binary: length, then subtype, then bytes */
    add_bin(false, BSON_SUBTYPE_BINARY, "", 0);
    add_bin(false, BSON_SUBTYPE_BINARY, "\x02", 1);
    add_bin(false, BSON_SUBTYPE_BINARY, "\x03", 1);
    add_bin(false, BSON_SUBTYPE_FUNCTION, "\x01", 1);
    add_bin(false, BSON_SUBTYPE_BINARY, "\x00\x00", 2);

    bson_oid_init_from_string(&o1, "000000000000000000000001");
    bson_oid_init_from_string(&o2, "ff0000000000000000000000");
    NEXT();
    bson_append_oid(&table, KEY(), -1, &o1);
    NEXT();
    bson_append_oid(&table, KEY(), -1, &o2);
    NEXT();
    bson_append_bool(&table, KEY(), -1, false);
    NEXT();
    bson_append_bool(&table, KEY(), -1, true);
    NEXT();
    bson_append_date_time(&table, KEY(), -1, INT64_MIN);
    NEXT();
    bson_append_date_time(&table, KEY(), -1, -1);
    NEXT();
    bson_append_date_time(&table, KEY(), -1, 0);
    NEXT();
    bson_append_date_time(&table, KEY(), -1, 1700000000000LL);
    NEXT();
    bson_append_timestamp(&table, KEY(), -1, 1, 5);
    NEXT();
    bson_append_timestamp(&table, KEY(), -1, 2, 1);
    NEXT();
    bson_append_timestamp(&table, KEY(), -1, 0xffffffffu, 0xffffffffu);
    NEXT();
    bson_append_regex(&table, KEY(), -1, "a", "");
    NEXT();
    bson_append_regex(&table, KEY(), -1, "a", "i");
    NEXT();
    bson_append_regex(&table, KEY(), -1, "ab", "");
    NEXT();
    bson_append_regex(&table, KEY(), -1, "b", "");
    NEXT();
    bson_append_dbpointer(&table, KEY(), -1, "c", &o1);
    NEXT();
    bson_append_dbpointer(&table, KEY(), -1, "c", &o2);
    NEXT();
    bson_append_code(&table, KEY(), -1, "f()");
    NEXT();
    bson_append_code(&table, KEY(), -1, "g()");
    doc_of(&scope, "{\"x\": 1}");
    NEXT();
    bson_append_code_with_scope(&table, KEY(), -1, "f()", &scope);
    bson_destroy(&scope);
    NEXT();
    bson_append_maxkey(&table, KEY(), -1);
    ck_assert_int_lt(nvals, 256);
}

static void values(bson_value_t *v)
{
    bson_iter_t it;
    int i = 0;

    ck_assert(bson_iter_init(&it, &table));
    while (bson_iter_next(&it))
        v[i++] = *bson_iter_value(&it);
    ck_assert_int_eq(i, nvals);
}

static int sign(int x)
{
    return (x > 0) - (x < 0);
}

static int key_cmp(const struct doc_buf *a, const struct doc_buf *b)
{
    int c = memcmp(a->p, b->p, a->len < b->len ? a->len : b->len);

    return c ? sign(c) : (a->len > b->len) - (a->len < b->len);
}

static void key_of(struct doc_buf *b, const bson_value_t *v, bool desc)
{
    doc_buf_reset(b);
    doc_key_add(b, v, desc);
    ck_assert(!b->oom);
}

/* Every pair: doc_val_cmp agrees with the table, the key strings (both
 * directions) with doc_val_cmp, and equal values have equal keys. */
START_TEST(order_every_pair)
{
    static bson_value_t v[256];
    struct doc_buf ka = {0}, kb = {0};

    build_table();
    values(v);
    for (int i = 0; i < nvals; i++) {
        for (int j = 0; j < nvals; j++) {
            int want = sign(group[i] - group[j]);
            int got = sign(doc_val_cmp(&v[i], &v[j]));

            ck_assert_msg(got == want, "doc_val_cmp(#%d, #%d) = %d, want %d", i, j, got, want);
            ck_assert(doc_val_eq(&v[i], &v[j]) == (want == 0));
            key_of(&ka, &v[i], false);
            key_of(&kb, &v[j], false);
            ck_assert_msg(key_cmp(&ka, &kb) == want, "keys of #%d, #%d: %d, want %d", i, j,
                          key_cmp(&ka, &kb), want);
            if (want == 0)
                ck_assert(ka.len == kb.len && memcmp(ka.p, kb.p, ka.len) == 0);
            ck_assert_int_eq(ka.p[0], doc_key_rank_byte(v[i].value_type));
            key_of(&ka, &v[i], true);
            key_of(&kb, &v[j], true);
            ck_assert_msg(key_cmp(&ka, &kb) == -want, "descending keys of #%d, #%d", i, j);
        }
    }
    doc_buf_free(&ka);
    doc_buf_free(&kb);
    bson_destroy(&table);
}
END_TEST

/* The rank byte brackets a type: every number's key is inside
 * [rank(number), rank(number) + 1), and MinKey/MaxKey's keys are below and
 * above every value's. */
START_TEST(rank_bytes_bracket_types)
{
    static bson_value_t v[256];
    struct doc_buf k = {0}, lo = {0}, hi = {0};
    uint8_t nb = doc_key_rank_byte(BSON_TYPE_DOUBLE);

    build_table();
    values(v);
    ck_assert_int_eq(nb, doc_key_rank_byte(BSON_TYPE_INT32));
    ck_assert_int_eq(nb, doc_key_rank_byte(BSON_TYPE_INT64));
    ck_assert_int_eq(nb, doc_key_rank_byte(BSON_TYPE_DECIMAL128));
    ck_assert_int_eq(doc_key_rank_byte(BSON_TYPE_UTF8), doc_key_rank_byte(BSON_TYPE_SYMBOL));
    ck_assert_int_eq(doc_key_rank_byte(BSON_TYPE_NULL), doc_key_rank_byte(BSON_TYPE_UNDEFINED));
    ck_assert_int_eq(doc_type_rank(BSON_TYPE_INT32), doc_type_rank(BSON_TYPE_DECIMAL128));
    ck_assert_int_lt(doc_type_rank(BSON_TYPE_NULL), doc_type_rank(BSON_TYPE_INT32));
    doc_key_add_min(&lo);
    doc_key_add_max(&hi);
    for (int i = 0; i < nvals; i++) {
        bool number = doc_type_rank(v[i].value_type) == doc_type_rank(BSON_TYPE_DOUBLE);

        key_of(&k, &v[i], false);
        ck_assert(number == (k.p[0] == nb));
        if (v[i].value_type != BSON_TYPE_MINKEY)
            ck_assert_int_gt(key_cmp(&k, &lo), 0);
        if (v[i].value_type != BSON_TYPE_MAXKEY)
            ck_assert_int_lt(key_cmp(&k, &hi), 0);
    }
    doc_buf_free(&k);
    doc_buf_free(&lo);
    doc_buf_free(&hi);
    bson_destroy(&table);
}
END_TEST

/* Keys of two values, concatenated, compare as the pair; with the second
 * descending, as the pair with the second order reversed. A subset of the
 * table (every third value) keeps this to ~10^6 comparisons. */
START_TEST(concatenation_is_tuple_order)
{
    static bson_value_t v[256];
    struct doc_buf ka = {0}, kb = {0};
    int idx[96], n = 0;

    build_table();
    values(v);
    for (int i = 0; i < nvals && n < 96; i += 3)
        idx[n++] = i;
    for (int desc = 0; desc < 2; desc++)
        for (int a1 = 0; a1 < n; a1++)
            for (int a2 = 0; a2 < n; a2 += 2)
                for (int b1 = 0; b1 < n; b1++)
                    for (int b2 = 0; b2 < n; b2 += 5) {
                        const bson_value_t *x1 = &v[idx[a1]], *x2 = &v[idx[a2]];
                        const bson_value_t *y1 = &v[idx[b1]], *y2 = &v[idx[b2]];
                        int want = sign(doc_val_cmp(x1, y1));

                        if (!want)
                            want = sign(doc_val_cmp(x2, y2)) * (desc ? -1 : 1);
                        doc_buf_reset(&ka);
                        doc_buf_reset(&kb);
                        doc_key_add(&ka, x1, false);
                        doc_key_add(&ka, x2, desc);
                        doc_key_add(&kb, y1, false);
                        doc_key_add(&kb, y2, desc);
                        ck_assert_msg(key_cmp(&ka, &kb) == want, "(%d,%d) vs (%d,%d) desc %d",
                                      idx[a1], idx[a2], idx[b1], idx[b2], desc);
                    }
    doc_buf_free(&ka);
    doc_buf_free(&kb);
    bson_destroy(&table);
}
END_TEST

/* The exact int64/double boundary, spelled out: 2^53 + 1 is no double, and
 * converting it to one would make it equal 2^53. */
START_TEST(int64_beyond_double)
{
    bson_value_t a = {.value_type = BSON_TYPE_INT64};
    bson_value_t d = {.value_type = BSON_TYPE_DOUBLE};

    a.value.v_int64 = TWO53 + 1;
    d.value.v_double = (double)TWO53;
    ck_assert_int_gt(doc_val_cmp(&a, &d), 0);
    ck_assert_int_lt(doc_val_cmp(&d, &a), 0);
    d.value.v_double = (double)(TWO53 + 2);
    ck_assert_int_lt(doc_val_cmp(&a, &d), 0);
    a.value.v_int64 = INT64_MAX;
    d.value.v_double = 9223372036854775808.0;
    ck_assert_int_lt(doc_val_cmp(&a, &d), 0);
    a.value.v_int64 = INT64_MIN;
    d.value.v_double = -9223372036854775808.0;
    ck_assert_int_eq(doc_val_cmp(&a, &d), 0);
}
END_TEST

START_TEST(whole_documents)
{
    bson_t a, b, c;

    doc_of(&a, "{\"x\": 1, \"y\": [1, 2]}");
    doc_of(&b, "{\"x\": 1.0, \"y\": [1, {\"$numberLong\": \"2\"}]}");
    doc_of(&c, "{\"y\": [1, 2], \"x\": 1}");
    ck_assert_int_eq(doc_cmp(&a, &b), 0);
    /* field order counts: x before y */
    ck_assert_int_lt(doc_cmp(&a, &c), 0);
    ck_assert_int_gt(doc_cmp(&c, &a), 0);
    bson_destroy(&a);
    bson_destroy(&b);
    bson_destroy(&c);
}
END_TEST

START_TEST(buffer_grows_and_resets)
{
    struct doc_buf b = {0};
    char chunk[1000];

    memset(chunk, 'x', sizeof(chunk));
    for (int i = 0; i < 100; i++)
        doc_buf_add(&b, chunk, sizeof(chunk));
    ck_assert(!b.oom);
    ck_assert_uint_eq(b.len, 100000);
    ck_assert_uint_ge(b.cap, 100000);
    ck_assert_int_eq(b.p[99999], 'x');
    doc_buf_reset(&b);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_uint_ge(b.cap, 100000);
    doc_buf_free(&b);
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.cap, 0);
}
END_TEST

/* ---- walks ---- */

struct seen {
    char out[512];
    int stop_after;
    int n;
};

/* Each value as relaxed extended JSON, "*" after it for in_array, joined
 * by " ". */
static int collect(void *arg, const bson_value_t *v, bool in_array)
{
    struct seen *s = arg;
    bson_t d = BSON_INITIALIZER;
    char *json;
    size_t n, len = strlen(s->out);

    bson_append_value(&d, "v", 1, v);
    json = bson_as_relaxed_extended_json(&d, &n);
    /* "{ "v" : X }" -> X */
    snprintf(s->out + len, sizeof(s->out) - len, "%s%.*s%s", len ? " " : "", (int)(n - 10),
             json + 8, in_array ? "*" : "");
    bson_free(json);
    bson_destroy(&d);
    return ++s->n == s->stop_after ? 7 : 0;
}

static const char *walk(const char *json, const char *path, unsigned flags)
{
    static struct seen s;
    bson_t d;

    memset(&s, 0, sizeof(s));
    doc_of(&d, json);
    ck_assert_int_eq(doc_walk(&d, path, flags, collect, &s), 0);
    bson_destroy(&d);
    return s.out;
}

#define WALK(json, path, flags, want)                                            \
    do {                                                                         \
        const char *got_ = walk(json, path, flags);                              \
        ck_assert_msg(strcmp(got_, want) == 0, "%s on %s: got [%s], want [%s]", \
                      path, json, got_, want);                                   \
    } while (0)

#define X DOC_WALK_EXPAND_LEAF

START_TEST(walk_documented_paths)
{
    /* Embedded documents (manual: "Query on Embedded/Nested Documents") */
    WALK("{\"size\": {\"h\": 14, \"uom\": \"cm\"}}", "size.uom", 0, "\"cm\"");
    WALK("{\"size\": {\"h\": 14}}", "size.w", 0, "");
    WALK("{\"size\": 5}", "size.h", 0, "");
    WALK("{\"a\": {\"b\": {\"c\": 1}}}", "a.b.c", 0, "1");
    WALK("{\"a\": {\"b\": {\"c\": 1}}}", "a.b", 0, "{ \"c\" : 1 }");
    /* A leaf array: the whole, then (expanded) each element, nested arrays
     * whole (manual: "Query an Array": {tags: "red"}, {dim_cm: [14, 21]}) */
    WALK("{\"tags\": [\"red\", \"blank\"]}", "tags", 0, "[ \"red\", \"blank\" ]*");
    WALK("{\"tags\": [\"red\", [\"x\"]]}", "tags", X,
         "[ \"red\", [ \"x\" ] ]* \"red\"* [ \"x\" ]*");
    WALK("{\"tags\": []}", "tags", X, "[  ]*");   /* libbson prints [] so */
    /* Arrays of documents (manual: "Query an Array of Embedded Documents":
     * {"instock.qty": {$lte: 20}}) */
    WALK("{\"instock\": [{\"wh\": \"A\", \"qty\": 5}, {\"wh\": \"C\", \"qty\": 15}]}",
         "instock.qty", 0, "5* 15*");
    WALK("{\"instock\": [{\"wh\": \"A\"}, 3, {\"qty\": 15}]}", "instock.qty", 0, "15*");
    WALK("{\"a\": [{\"b\": [1, 2]}, {\"b\": 3}]}", "a.b", X, "[ 1, 2 ]* 1* 2* 3*");
    WALK("{\"a\": [{\"b\": {\"c\": 1}}, {\"b\": [{\"c\": 2}, {\"c\": 3}]}]}", "a.b.c", 0,
         "1* 2* 3*");
    /* One level of arrays only: an array in an array is not looked into by
     * a field name. */
    WALK("{\"a\": [[{\"b\": 1}], {\"b\": 2}]}", "a.b", 0, "2*");
    /* A numeric component is a position ("instock.0.qty") and also a field
     * name in element documents. */
    WALK("{\"instock\": [{\"qty\": 5}, {\"qty\": 15}]}", "instock.0.qty", 0, "5");
    WALK("{\"instock\": [{\"qty\": 5}, {\"qty\": 15}]}", "instock.1", 0, "{ \"qty\" : 15 }");
    WALK("{\"instock\": [{\"qty\": 5}]}", "instock.1", 0, "");
    WALK("{\"a\": [[1, 2], [3]]}", "a.0", X, "[ 1, 2 ]* 1* 2*");
    WALK("{\"a\": [[{\"b\": 1}, {\"b\": 2}]]}", "a.0.b", 0, "1* 2*");
    WALK("{\"a\": [{\"0\": 7}, 8]}", "a.0", 0, "{ \"0\" : 7 } 7*");
    WALK("{\"a\": {\"0\": 7}}", "a.0", 0, "7");
    WALK("{\"a\": [5, 6]}", "a.01", 0, "");
    WALK("{\"a\": [5, 6]}", "a.b", 0, "");
    WALK("{\"a\": 1}", "b", 0, "");
}
END_TEST

START_TEST(walk_stops_when_told)
{
    static struct seen s;
    bson_t d;

    memset(&s, 0, sizeof(s));
    s.stop_after = 2;
    doc_of(&d, "{\"a\": [{\"b\": 1}, {\"b\": 2}, {\"b\": 3}]}");
    ck_assert_int_eq(doc_walk(&d, "a.b", 0, collect, &s), 7);
    ck_assert_str_eq(s.out, "1* 2*");
    bson_destroy(&d);
}
END_TEST

START_TEST(get_without_expansion)
{
    bson_t d;
    bson_value_t v;

    doc_of(&d, "{\"a\": {\"b\": [10, {\"c\": \"x\"}]}, \"n\": null}");
    ck_assert(doc_get(&d, "a.b.0", &v));
    ck_assert(v.value_type == BSON_TYPE_INT32 && v.value.v_int32 == 10);
    ck_assert(doc_get(&d, "a.b.1.c", &v));
    ck_assert(v.value_type == BSON_TYPE_UTF8 && strcmp(v.value.v_utf8.str, "x") == 0);
    ck_assert(doc_get(&d, "a.b", &v));
    ck_assert(v.value_type == BSON_TYPE_ARRAY);
    ck_assert(doc_get(&d, "n", &v));
    ck_assert(v.value_type == BSON_TYPE_NULL);
    ck_assert(!doc_get(&d, "a.b.c", &v));     /* no expansion */
    ck_assert(!doc_get(&d, "a.b.2", &v));
    ck_assert(!doc_get(&d, "a.b.01", &v));
    ck_assert(!doc_get(&d, "a.x", &v));
    ck_assert(!doc_get(&d, "n.x", &v));
    bson_destroy(&d);
}
END_TEST

START_TEST(new_oids_differ)
{
    bson_oid_t a, b;

    doc_new_oid(&a);
    doc_new_oid(&b);
    ck_assert(!bson_oid_equal(&a, &b));
    ck_assert_int_lt(bson_oid_compare(&a, &b), 0);
}
END_TEST

/* The names MongoDB's messages and $type use, one table for every caller. */
START_TEST(type_names)
{
    ck_assert_str_eq(doc_type_name(BSON_TYPE_INT32), "int");
    ck_assert_str_eq(doc_type_name(BSON_TYPE_INT64), "long");
    ck_assert_str_eq(doc_type_name(BSON_TYPE_OID), "objectId");
    ck_assert_str_eq(doc_type_name(BSON_TYPE_CODEWSCOPE), "javascriptWithScope");
    ck_assert_str_eq(doc_type_name(BSON_TYPE_MAXKEY), "maxKey");
    ck_assert_str_eq(doc_type_name(BSON_TYPE_EOD), "missing");
}
END_TEST

Suite *suite_doc_bson(void)
{
    Suite *s = suite_create("doc_bson");
    TCase *order = tcase_create("order");
    TCase *paths = tcase_create("paths");

    tcase_set_timeout(order, 120);
    tcase_add_test(order, order_every_pair);
    tcase_add_test(order, type_names);
    tcase_add_test(order, rank_bytes_bracket_types);
    tcase_add_test(order, concatenation_is_tuple_order);
    tcase_add_test(order, int64_beyond_double);
    tcase_add_test(order, whole_documents);
    tcase_add_test(order, buffer_grows_and_resets);
    suite_add_tcase(s, order);

    tcase_add_test(paths, walk_documented_paths);
    tcase_add_test(paths, walk_stops_when_told);
    tcase_add_test(paths, get_without_expansion);
    tcase_add_test(paths, new_oids_differ);
    suite_add_tcase(s, paths);
    return s;
}
