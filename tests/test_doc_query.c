/* Projection and sort keys (services/doc/doc_query.c): tables of cases from
 * MongoDB's manual, "Project Fields to Return from Query", the $slice and
 * $elemMatch (projection) pages, and cursor.sort / "Comparison/Sort Order".
 *
 * Documents are written as relaxed extended JSON; a result must equal the
 * expected document byte for byte, so field order and numeric types count. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc_query.h"
#include "suites.h"

static bson_t *J(const char *json)
{
    bson_error_t err;
    bson_t *b = bson_new_from_json((const uint8_t *)json, -1, &err);

    ck_assert_msg(b != NULL, "bad test JSON %s: %s", json, err.message);
    return b;
}

static void assert_doc(const bson_t *got, const char *want_json, const char *what)
{
    bson_t *want = J(want_json);
    char *g = bson_as_relaxed_extended_json(got, NULL);
    char *w = bson_as_relaxed_extended_json(want, NULL);

    ck_assert_msg(bson_equal(got, want), "%s:\n got  %s\n want %s", what, g, w);
    bson_free(g);
    bson_free(w);
    bson_destroy(want);
}

/* ---- projection ---- */

/* The manual's inventory document (Project Fields to Return from Query),
 * with a second stock entry and a nested array for the array rules. */
static const char *inventory =
    "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\","
    " \"size\": {\"h\": 14, \"w\": 21, \"uom\": \"cm\"},"
    " \"instock\": [{\"warehouse\": \"A\", \"qty\": 5}, {\"warehouse\": \"C\", \"qty\": 15}]}";

static const struct proj_case {
    const char *spec, *doc, *want;
} proj_cases[] = {
    /* Return the specified fields and the _id field only. */
    {"{\"item\": 1, \"status\": 1}", NULL, "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\"}"},
    /* Suppress _id. */
    {"{\"item\": 1, \"status\": 1, \"_id\": 0}", NULL, "{\"item\": \"journal\", \"status\": \"A\"}"},
    /* Return all but the excluded fields. */
    {"{\"status\": 0, \"instock\": 0}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"size\": {\"h\": 14, \"w\": 21, \"uom\": \"cm\"}}"},
    /* Specific fields in embedded documents, dotted and nested forms. */
    {"{\"item\": 1, \"status\": 1, \"size.uom\": 1}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\", \"size\": {\"uom\": \"cm\"}}"},
    {"{\"item\": 1, \"status\": 1, \"size\": {\"uom\": 1}}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\", \"size\": {\"uom\": \"cm\"}}"},
    /* Suppress specific fields in embedded documents. */
    {"{\"size.uom\": 0}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\", \"size\": {\"h\": 14, \"w\": 21},"
     " \"instock\": [{\"warehouse\": \"A\", \"qty\": 5}, {\"warehouse\": \"C\", \"qty\": 15}]}"},
    /* Projection on embedded documents in an array. */
    {"{\"item\": 1, \"status\": 1, \"instock.qty\": 1}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\", \"instock\": [{\"qty\": 5}, {\"qty\": 15}]}"},
    /* Project specific array elements: $slice keeps the rest of the document... */
    {"{\"item\": 1, \"status\": 1, \"instock\": {\"$slice\": -1}}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\", \"instock\": [{\"warehouse\": \"C\", \"qty\": 15}]}"},
    /* ...and alone it is an exclusion projection (every other field). */
    {"{\"instock\": {\"$slice\": 1}}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\", \"size\": {\"h\": 14, \"w\": 21, \"uom\": \"cm\"},"
     " \"instock\": [{\"warehouse\": \"A\", \"qty\": 5}]}"},
    {"{\"status\": 0, \"size\": 0, \"instock\": {\"$slice\": [1, 5]}}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"instock\": [{\"warehouse\": \"C\", \"qty\": 15}]}"},
    /* _id alone: only _id; _id: 0 alone: everything else. */
    {"{\"_id\": 1}", NULL, "{\"_id\": 1}"},
    {"{\"_id\": 0, \"size\": 0, \"instock\": 0}", NULL, "{\"item\": \"journal\", \"status\": \"A\"}"},
    /* true and non-zero numbers include, false excludes. */
    {"{\"item\": true, \"status\": 2.5, \"_id\": false}", NULL,
     "{\"item\": \"journal\", \"status\": \"A\"}"},
    /* Fields come in the document's order, not the spec's. */
    {"{\"status\": 1, \"item\": 1}", NULL, "{\"_id\": 1, \"item\": \"journal\", \"status\": \"A\"}"},
    /* A missing included field is just absent. */
    {"{\"nope\": 1, \"size.nope\": 1}", NULL, "{\"_id\": 1, \"size\": {}}"},

    /* $slice forms ($slice (projection) page): n, -n, [skip, limit], -skip,
     * more than there is, and a non-array value returned as it is. */
    {"{\"a\": {\"$slice\": 2}, \"_id\": 0}", "{\"a\": [1, 2, 3, 4]}", "{\"a\": [1, 2]}"},
    {"{\"a\": {\"$slice\": -3}, \"_id\": 0}", "{\"a\": [1, 2, 3, 4]}", "{\"a\": [2, 3, 4]}"},
    {"{\"a\": {\"$slice\": [1, 2]}, \"_id\": 0}", "{\"a\": [1, 2, 3, 4]}", "{\"a\": [2, 3]}"},
    {"{\"a\": {\"$slice\": [-3, 2]}, \"_id\": 0}", "{\"a\": [1, 2, 3, 4]}", "{\"a\": [2, 3]}"},
    {"{\"a\": {\"$slice\": [-9, 2]}, \"_id\": 0}", "{\"a\": [1, 2, 3, 4]}", "{\"a\": [1, 2]}"},
    {"{\"a\": {\"$slice\": [9, 2]}, \"_id\": 0}", "{\"a\": [1, 2, 3, 4]}", "{\"a\": []}"},
    {"{\"a\": {\"$slice\": 10}, \"_id\": 0}", "{\"a\": [1, 2]}", "{\"a\": [1, 2]}"},
    {"{\"a\": {\"$slice\": 0}, \"_id\": 0}", "{\"a\": [1, 2]}", "{\"a\": []}"},
    {"{\"a\": {\"$slice\": 1}, \"_id\": 0}", "{\"a\": \"str\", \"b\": 1}", "{\"a\": \"str\", \"b\": 1}"},
    /* $slice on an array inside an array of documents. */
    {"{\"a.b\": {\"$slice\": 1}}", "{\"a\": [{\"b\": [1, 2]}, {\"b\": [3, 4], \"c\": 5}]}",
     "{\"a\": [{\"b\": [1]}, {\"b\": [3], \"c\": 5}]}"},

    /* Dotted paths through arrays: inclusion keeps documents (and arrays of
     * them), drops other elements; exclusion keeps them. */
    {"{\"a.b\": 1, \"_id\": 0}", "{\"a\": [{\"b\": 1, \"c\": 2}, 5, [{\"b\": 3, \"c\": 4}], {\"c\": 6}]}",
     "{\"a\": [{\"b\": 1}, [{\"b\": 3}], {}]}"},
    {"{\"a.b\": 0}", "{\"a\": [{\"b\": 1, \"c\": 2}, 5, [{\"b\": 3, \"c\": 4}]]}",
     "{\"a\": [{\"c\": 2}, 5, [{\"c\": 4}]]}"},
    /* A path through a scalar includes nothing of it. */
    {"{\"a.b\": 1, \"_id\": 0}", "{\"a\": 5, \"z\": 1}", "{}"},
    {"{\"a.b\": 0}", "{\"a\": 5, \"z\": 1}", "{\"a\": 5, \"z\": 1}"},
    /* Sub-fields of _id. */
    {"{\"_id.x\": 1}", "{\"_id\": {\"x\": 1, \"y\": 2}, \"z\": 3}", "{\"_id\": {\"x\": 1}}"},

    /* $elemMatch (projection page, the schools collection): the first
     * matching element only; the field goes last; no match, no field. */
    {"{\"students\": {\"$elemMatch\": {\"school\": 102}}}",
     "{\"_id\": 1, \"zipcode\": \"63109\", \"students\": [{\"name\": \"john\", \"school\": 102, \"age\": 10},"
     " {\"name\": \"jess\", \"school\": 102, \"age\": 11}, {\"name\": \"jeff\", \"school\": 108, \"age\": 15}]}",
     "{\"_id\": 1, \"students\": [{\"name\": \"john\", \"school\": 102, \"age\": 10}]}"},
    {"{\"students\": {\"$elemMatch\": {\"school\": 102, \"age\": {\"$gt\": 10}}}}",
     "{\"_id\": 1, \"zipcode\": \"63109\", \"students\": [{\"name\": \"john\", \"school\": 102, \"age\": 10},"
     " {\"name\": \"jess\", \"school\": 102, \"age\": 11}, {\"name\": \"jeff\", \"school\": 108, \"age\": 15}]}",
     "{\"_id\": 1, \"students\": [{\"name\": \"jess\", \"school\": 102, \"age\": 11}]}"},
    {"{\"students\": {\"$elemMatch\": {\"school\": 102}}}",
     "{\"_id\": 3, \"zipcode\": \"63109\", \"students\": [{\"name\": \"ajax\", \"school\": 100, \"age\": 7}]}",
     "{\"_id\": 3}"},
    {"{\"games\": {\"$elemMatch\": {\"score\": {\"$gt\": 5}}}, \"joined\": 1, \"lastLogin\": 1}",
     "{\"_id\": 1, \"games\": [{\"game\": \"abc\", \"score\": 8}, {\"game\": \"xyz\", \"score\": 5}],"
     " \"joined\": \"2020-01-01\", \"lastLogin\": \"2020-05-01\"}",
     "{\"_id\": 1, \"joined\": \"2020-01-01\", \"lastLogin\": \"2020-05-01\","
     " \"games\": [{\"game\": \"abc\", \"score\": 8}]}"},
    {"{\"a\": {\"$elemMatch\": {\"$gt\": 2}}, \"_id\": 0}", "{\"a\": [1, 3, 5]}", "{\"a\": [3]}"},

    /* Computed fields (MongoDB 4.4+ find projections): after the included
     * ones; a missing path leaves the field out. */
    {"{\"x\": \"$size.h\", \"item\": 1, \"lit\": {\"$literal\": 1}, \"m\": \"$nope\"}", NULL,
     "{\"_id\": 1, \"item\": \"journal\", \"x\": 14, \"lit\": 1}"},
    {"{\"size.area\": {\"$multiply\": [\"$size.h\", \"$size.w\"]}, \"size.uom\": 1, \"_id\": 0}", NULL,
     "{\"size\": {\"uom\": \"cm\", \"area\": 294}}"},
    {"{\"n.v\": \"$item\", \"_id\": 0}", NULL, "{\"n\": {\"v\": \"journal\"}}"},
};

START_TEST(test_proj_table)
{
    const struct proj_case *c = &proj_cases[_i];
    bson_t *spec = J(c->spec), *doc = J(c->doc ? c->doc : inventory), out;
    struct doc_proj *p;
    struct doc_err e = {0};
    char what[256];

    ck_assert_msg(doc_proj_compile(spec, &p, &e) == 0, "%s: %s", c->spec, e.msg);
    ck_assert_ptr_nonnull(p);
    bson_init(&out);
    ck_assert_msg(doc_proj_apply(p, doc, &out, &e) == 0, "%s: %s", c->spec, e.msg);
    snprintf(what, sizeof(what), "projection %s", c->spec);
    assert_doc(&out, c->want, what);
    bson_destroy(&out);
    doc_proj_free(p);
    bson_destroy(spec);
    bson_destroy(doc);
}
END_TEST

static const struct proj_err {
    const char *spec;
    int code;
    const char *msg;
} proj_errs[] = {
    {"{\"item\": 1, \"status\": 0}", DOC_Location31254,
     "Cannot do exclusion on field status in inclusion projection"},
    {"{\"status\": 0, \"item\": 1}", DOC_Location31253,
     "Cannot do inclusion on field item in exclusion projection"},
    {"{\"size.uom\": 0, \"size.h\": 1}", DOC_Location31253,
     "Cannot do inclusion on field size.h in exclusion projection"},
    {"{\"a\": 0, \"b\": \"$x\"}", DOC_Location31253,
     "Cannot do inclusion on field b in exclusion projection"},
    {"{\"a\": 0, \"b\": {\"$elemMatch\": {\"x\": 1}}}", DOC_Location31253,
     "Cannot do inclusion on field b in exclusion projection"},
    {"{\"size\": 1, \"size.uom\": 1}", DOC_Location31250, "Path collision at size.uom"},
    {"{\"size.uom\": 1, \"size\": 1}", DOC_Location31250, "Path collision at size"},
    {"{\"a\": {}}", DOC_BadValue, "An empty sub-projection"},
    {"{\"a.$\": 1}", DOC_BadValue, "positional projection"},
    {"{\"$a\": 1}", DOC_BadValue, "may not start with '$'"},
    {"{\"a..b\": 1}", DOC_BadValue, "may not be empty"},
    {"{\"a\": {\"$meta\": \"textScore\"}}", DOC_BadValue, "$meta"},
    {"{\"a\": {\"$slice\": \"x\"}}", DOC_BadValue, "$slice only supports numbers"},
    {"{\"a\": {\"$slice\": [1, 0]}}", DOC_BadValue, "$slice limit must be positive"},
    {"{\"a\": {\"$slice\": [1, 2, 3]}}", DOC_BadValue, "$slice only supports numbers"},
    {"{\"a\": {\"$slice\": 1, \"$x\": 2}}", DOC_BadValue, "more than one field"},
    {"{\"a.b\": {\"$elemMatch\": {\"x\": 1}}}", DOC_BadValue, "nested field"},
    {"{\"a\": {\"$elemMatch\": 1}}", DOC_BadValue, "object required"},
    {"{\"a\": {\"$nosuch\": 1}}", DOC_BadValue, "Unrecognized expression '$nosuch'"},
};

START_TEST(test_proj_errors)
{
    const struct proj_err *c = &proj_errs[_i];
    bson_t *spec = J(c->spec);
    struct doc_proj *p = (struct doc_proj *)1;
    struct doc_err e = {0};

    ck_assert_int_lt(doc_proj_compile(spec, &p, &e), 0);
    ck_assert_ptr_null(p);
    ck_assert_msg(e.code == c->code, "%s: code %d (%s), want %d", c->spec, e.code, e.msg, c->code);
    ck_assert_msg(strstr(e.msg, c->msg), "%s: message '%s' lacks '%s'", c->spec, e.msg, c->msg);
    bson_destroy(spec);
}
END_TEST

START_TEST(test_proj_empty_and_codes)
{
    bson_t empty = BSON_INITIALIZER;
    struct doc_proj *p = (struct doc_proj *)1;
    struct doc_err e = {0};

    ck_assert_int_eq(doc_proj_compile(&empty, &p, &e), 0);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(doc_proj_compile(NULL, &p, &e), 0);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(doc_code_name(DOC_Location31254), "Location31254");
    ck_assert_str_eq(doc_code_name(DOC_Location31253), "Location31253");
}
END_TEST

/* One compiled projection applied to many documents of different shapes:
 * the output of each is whole and nothing carries over between them. */
START_TEST(test_proj_reuse)
{
    bson_t *spec = J("{\"a.b\": 1, \"c\": {\"$slice\": -1}, \"_id\": 0}");
    struct doc_proj *p;
    struct doc_err e = {0};

    ck_assert_int_eq(doc_proj_compile(spec, &p, &e), 0);
    for (int i = 0; i < 200; i++) {
        char json[256], want[256];
        bson_t *doc, out;

        snprintf(json, sizeof(json),
                 "{\"_id\": %d, \"a\": [{\"b\": %d, \"x\": 1}, {\"b\": \"s%d\"}], \"c\": [%d, %d], \"d\": 1}",
                 i, i, i, i, i + 1);
        snprintf(want, sizeof(want), "{\"a\": [{\"b\": %d}, {\"b\": \"s%d\"}], \"c\": [%d]}", i, i, i + 1);
        doc = J(json);
        bson_init(&out);
        ck_assert_int_eq(doc_proj_apply(p, doc, &out, &e), 0);
        assert_doc(&out, want, "reused projection");
        bson_destroy(&out);
        bson_destroy(doc);
    }
    doc_proj_free(p);
    bson_destroy(spec);
}
END_TEST

/* {a: [[[...[]...]]]}, `depth` arrays around an empty one, written as raw
 * BSON (libbson's builders would need one bson_t per level): the array i
 * levels out is 5 + 8 i bytes (its length, 0x04 "0\\0", the one inside,
 * and its terminating 0). */
static uint8_t *deep_arrays(unsigned depth, uint32_t *len)
{
    uint32_t total = 4 + 3 + (5 + 8 * depth) + 1, v;
    uint8_t *buf = malloc(total), *p = buf;

    ck_assert_ptr_nonnull(buf);
    memcpy(p, &total, 4);
    memcpy(p + 4, "\x04" "a", 3);
    p += 7;
    for (unsigned i = depth; i >= 1; i--) {
        v = 5 + 8 * i;
        memcpy(p, &v, 4);
        memcpy(p + 4, "\x04" "0", 3);
        p += 7;
    }
    memcpy(p, "\x05\0\0\0\0", 5);
    p += 5;
    memset(p, 0, depth + 1);
    *len = total;
    return buf;
}

/* {key: {key: ... {key: 1}}}, `depth` documents around the innermost one,
 * as raw BSON: each level adds its length, 0x03, the key and its NUL, and
 * a terminating 0. */
static uint8_t *nested_docs(const char *key, unsigned depth, uint32_t *len)
{
    size_t kl = strlen(key) + 1, per = 4 + 1 + kl + 1;
    uint32_t inner = (uint32_t)(4 + 1 + kl + 4 + 1), total = inner + (uint32_t)(per * depth), v;
    uint8_t *buf = malloc(total), *p = buf;
    int32_t one = 1;

    ck_assert_ptr_nonnull(buf);
    for (unsigned i = depth; i >= 1; i--) {
        v = inner + (uint32_t)(per * i);
        memcpy(p, &v, 4);
        p[4] = 0x03;
        memcpy(p + 5, key, kl);
        p += 5 + kl;
    }
    memcpy(p, &inner, 4);
    p[4] = 0x10;
    memcpy(p + 5, key, kl);
    memcpy(p + 5 + kl, &one, 4);
    p += 5 + kl + 4;
    memset(p, 0, depth + 1);
    *len = total;
    return buf;
}

/* Specs nested 100,000 deep (hostile input) are refused, not recursed
 * into: expressions by depth, nested projections by the length of the
 * path they make. */
START_TEST(test_proj_deep_specs)
{
    static const struct {
        const char *key, *msg;
    } t[] = {{"$toUpper", "expression nested deeper than 100 levels"}, {"a", "projection path too long"}};

    for (int i = 0; i < 2; i++) {
        uint32_t len;
        uint8_t *raw = nested_docs(t[i].key, 100000, &len);
        bson_t inner, spec = BSON_INITIALIZER;
        struct doc_proj *p = (struct doc_proj *)1;
        struct doc_err e = {0};

        ck_assert(bson_init_static(&inner, raw, len));
        bson_append_document(&spec, "r", 1, &inner);
        ck_assert_int_lt(doc_proj_compile(&spec, &p, &e), 0);
        ck_assert_ptr_null(p);
        ck_assert_int_eq(e.code, DOC_BadValue);
        ck_assert_msg(strstr(e.msg, t[i].msg), "%s", e.msg);
        bson_destroy(&spec);
        free(raw);
    }
}
END_TEST

/* A document of arrays nested 200,000 deep (hostile input) is projected
 * without recursing that deep. */
START_TEST(test_proj_deep_arrays)
{
    static const char *const specs[] = {"{\"a.b\": 1}", "{\"a.b\": 0}"};
    uint32_t len;
    uint8_t *raw = deep_arrays(200000, &len);
    bson_t doc;

    /* Not bson_validate: it recurses as deep as the document goes. */
    ck_assert(bson_init_static(&doc, raw, len));
    for (int i = 0; i < 2; i++) {
        bson_t *spec = J(specs[i]), out;
        struct doc_proj *p;
        struct doc_err e = {0};

        ck_assert_int_eq(doc_proj_compile(spec, &p, &e), 0);
        bson_init(&out);
        ck_assert_int_eq(doc_proj_apply(p, &doc, &out, &e), 0);
        ck_assert(bson_has_field(&out, "a"));
        if (i == 0)                             /* arrays of no documents: 100 deep */
            ck_assert(bson_validate(&out, 0, NULL));
        else                                    /* nothing to exclude */
            ck_assert(out.len == len && memcmp(bson_get_data(&out), raw, len) == 0);
        bson_destroy(&out);
        doc_proj_free(p);
        bson_destroy(spec);
    }
    free(raw);
}
END_TEST

/* ---- sort ---- */

/* Sort the documents by their keys (ties in the order given) and compare
 * the order of their _id with `want`. */
static void check_sort(const char *spec_json, const char *const *docs, int n, const int *want)
{
    bson_t *spec = J(spec_json);
    struct doc_sort *s;
    struct doc_err e = {0};
    struct doc_buf keys[16] = {{0}};
    int order[16];

    ck_assert_int_le(n, 16);
    ck_assert_msg(doc_sort_compile(spec, &s, &e) == 0, "%s: %s", spec_json, e.msg);
    for (int i = 0; i < n; i++) {
        bson_t *d = J(docs[i]);

        doc_sort_key(s, d, &keys[i]);
        ck_assert(!keys[i].oom);
        bson_destroy(d);
        order[i] = i;
    }
    /* Insertion sort: stable, so equal keys keep the input order. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            struct doc_buf *a = &keys[order[j - 1]], *b = &keys[order[j]];
            size_t m = a->len < b->len ? a->len : b->len;
            int c = memcmp(a->p, b->p, m);

            if (c < 0 || (c == 0 && a->len <= b->len))
                break;
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        bson_t *d = J(docs[order[i]]);
        bson_iter_t it;

        ck_assert(bson_iter_init_find(&it, d, "_id"));
        ck_assert_msg(bson_iter_int32(&it) == want[i], "%s: position %d has _id %d, want %d",
                      spec_json, i, bson_iter_int32(&it), want[i]);
        bson_destroy(d);
    }
    for (int i = 0; i < n; i++)
        doc_buf_free(&keys[i]);
    doc_sort_free(s);
    bson_destroy(spec);
}

/* cursor.sort, "Ascending/Descending Sort" with arrays: the smallest
 * element ascending, the largest descending; a missing field and null are
 * equal (kept in input order); an empty array below null (Comparison/Sort
 * Order); numbers before strings. */
static const char *const arr_docs[] = {
    "{\"_id\": 1, \"x\": [5, 1]}", "{\"_id\": 2, \"x\": 3}",   "{\"_id\": 3}",
    "{\"_id\": 4, \"x\": null}",   "{\"_id\": 5, \"x\": \"s\"}", "{\"_id\": 6, \"x\": [4]}",
    "{\"_id\": 7, \"x\": []}",
};

START_TEST(test_sort_arrays)
{
    static const int asc[] = {7, 3, 4, 1, 2, 6, 5}, desc[] = {5, 1, 6, 2, 3, 4, 7};

    check_sort("{\"x\": 1}", arr_docs, 7, asc);
    check_sort("{\"x\": -1}", arr_docs, 7, desc);
}
END_TEST

START_TEST(test_sort_compound_and_paths)
{
    /* Compound: a ascending, then b descending; numbers across types. */
    static const char *const d1[] = {
        "{\"_id\": 1, \"a\": 2, \"b\": 1}", "{\"_id\": 2, \"a\": 1.5, \"b\": 1}",
        "{\"_id\": 3, \"a\": {\"$numberLong\": \"2\"}, \"b\": 7}", "{\"_id\": 4, \"a\": 1, \"b\": 1}",
        "{\"_id\": 5, \"a\": 2.0, \"b\": 3}",
    };
    static const int w1[] = {4, 2, 3, 5, 1};
    /* A dotted path into an array of documents; an element without the
     * field counts as null. */
    static const char *const d2[] = {
        "{\"_id\": 1, \"a\": [{\"b\": 5}, {\"b\": 2}]}", "{\"_id\": 2, \"a\": {\"b\": 3}}",
        "{\"_id\": 3, \"a\": [{\"b\": 4}, {\"c\": 1}]}", "{\"_id\": 4, \"a\": 7}",
    };
    static const int w2a[] = {3, 4, 1, 2}, w2d[] = {1, 3, 2, 4};
    /* Nested arrays compare as whole arrays (arrays above numbers). */
    static const char *const d3[] = {
        "{\"_id\": 1, \"a\": [[1, 2]]}", "{\"_id\": 2, \"a\": [9]}", "{\"_id\": 3, \"a\": [[0]]}",
    };
    static const int w3[] = {2, 3, 1};
    /* A numeric component is a position in the array. */
    static const char *const d4[] = {
        "{\"_id\": 1, \"a\": [3, 1]}", "{\"_id\": 2, \"a\": [2, 9]}", "{\"_id\": 3, \"a\": [{\"b\": 1}]}",
    };
    static const int w4[] = {2, 1, 3};

    check_sort("{\"a\": 1, \"b\": -1}", d1, 5, w1);
    check_sort("{\"a.b\": 1}", d2, 4, w2a);
    check_sort("{\"a.b\": -1}", d2, 4, w2d);
    check_sort("{\"a\": 1}", d3, 3, w3);
    check_sort("{\"a.0\": 1}", d4, 3, w4);
}
END_TEST

START_TEST(test_sort_spec)
{
    struct doc_err e = {0};
    struct doc_sort *s;
    bson_t *spec;
    int dir = 0;

    spec = J("{\"a.b\": 1, \"c\": -1.0, \"d\": {\"$numberLong\": \"-1\"}}");
    ck_assert_int_eq(doc_sort_compile(spec, &s, &e), 0);
    ck_assert_uint_eq(doc_sort_nkeys(s), 3);
    ck_assert_int_eq(doc_sort_natural(s), 0);
    ck_assert_str_eq(doc_sort_path(s, 0, &dir), "a.b");
    ck_assert_int_eq(dir, 1);
    ck_assert_str_eq(doc_sort_path(s, 1, &dir), "c");
    ck_assert_int_eq(dir, -1);
    ck_assert_str_eq(doc_sort_path(s, 2, &dir), "d");
    ck_assert_int_eq(dir, -1);
    ck_assert_ptr_null(doc_sort_path(s, 3, &dir));
    doc_sort_free(s);
    bson_destroy(spec);

    spec = J("{\"$natural\": -1}");
    ck_assert_int_eq(doc_sort_compile(spec, &s, &e), 0);
    ck_assert_int_eq(doc_sort_natural(s), -1);
    ck_assert_uint_eq(doc_sort_nkeys(s), 0);
    doc_sort_free(s);
    bson_destroy(spec);

    spec = J("{}");
    ck_assert_int_eq(doc_sort_compile(spec, &s, &e), 0);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(doc_sort_natural(s), 0);
    bson_destroy(spec);
}
END_TEST

static const struct {
    const char *spec, *msg;
} sort_errs[] = {
    {"{\"a\": 2}", "must be 1 (for ascending) or -1"},
    {"{\"a\": 0}", "must be 1 (for ascending) or -1"},
    {"{\"a\": \"asc\"}", "must be 1 (for ascending) or -1"},
    {"{\"a\": 1, \"b\": true}", "must be 1 (for ascending) or -1"},
    {"{\"a\": {\"$meta\": \"textScore\"}}", "$meta"},
    {"{\"$natural\": 1, \"a\": 1}", "$natural"},
    {"{\"a\": 1, \"$natural\": 1}", "$natural"},
    {"{\"$natural\": 2}", "must be 1 (for ascending) or -1"},
    {"{\"a..b\": 1}", "bad sort field name"},
    {"{\"$a\": 1}", "bad sort field name"},
};

START_TEST(test_sort_errors)
{
    bson_t *spec = J(sort_errs[_i].spec);
    struct doc_sort *s = (struct doc_sort *)1;
    struct doc_err e = {0};

    ck_assert_int_lt(doc_sort_compile(spec, &s, &e), 0);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(e.code, DOC_BadValue);
    ck_assert_msg(strstr(e.msg, sort_errs[_i].msg), "%s: '%s'", sort_errs[_i].spec, e.msg);
    bson_destroy(spec);
}
END_TEST

START_TEST(test_sort_keys_max)
{
    bson_t spec = BSON_INITIALIZER;
    struct doc_sort *s;
    struct doc_err e = {0};
    char k[16];

    for (int i = 0; i < DOC_SORT_KEYS_MAX; i++) {
        snprintf(k, sizeof(k), "f%d", i);
        bson_append_int32(&spec, k, -1, 1);
    }
    ck_assert_int_eq(doc_sort_compile(&spec, &s, &e), 0);
    ck_assert_uint_eq(doc_sort_nkeys(s), DOC_SORT_KEYS_MAX);
    doc_sort_free(s);
    bson_append_int32(&spec, "one_more", -1, 1);
    ck_assert_int_lt(doc_sort_compile(&spec, &s, &e), 0);
    ck_assert_int_eq(e.code, DOC_BadValue);
    bson_destroy(&spec);
}
END_TEST

Suite *suite_doc_query(void)
{
    Suite *s = suite_create("doc_query");
    TCase *tc = tcase_create("proj");

    tcase_add_loop_test(tc, test_proj_table, 0, sizeof(proj_cases) / sizeof(proj_cases[0]));
    tcase_add_loop_test(tc, test_proj_errors, 0, sizeof(proj_errs) / sizeof(proj_errs[0]));
    tcase_add_test(tc, test_proj_empty_and_codes);
    tcase_add_test(tc, test_proj_reuse);
    tcase_add_test(tc, test_proj_deep_arrays);
    tcase_add_test(tc, test_proj_deep_specs);
    suite_add_tcase(s, tc);
    tc = tcase_create("sort");
    tcase_add_test(tc, test_sort_arrays);
    tcase_add_test(tc, test_sort_compound_and_paths);
    tcase_add_test(tc, test_sort_spec);
    tcase_add_loop_test(tc, test_sort_errors, 0, sizeof(sort_errs) / sizeof(sort_errs[0]));
    tcase_add_test(tc, test_sort_keys_max);
    suite_add_tcase(s, tc);
    return s;
}
