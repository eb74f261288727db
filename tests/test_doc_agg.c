/* The aggregation pipeline (services/doc/doc_agg.c): tables of cases from
 * MongoDB's manual (the pages of $group, $unwind, $count, $project, $sort,
 * $limit, $skip and of each accumulator and expression operator), the
 * pipeline pymongo's count_documents sends, errors, the memory limit, and
 * generated documents checked against a direct computation.
 *
 * Documents are relaxed extended JSON; results must equal the expected
 * ones byte for byte (field order and numeric types count). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc_agg.h"
#include "suites.h"

static bson_t *J(const char *json)
{
    bson_error_t err;
    bson_t *b = bson_new_from_json((const uint8_t *)json, -1, &err);

    ck_assert_msg(b != NULL, "bad test JSON %s: %s", json, err.message);
    return b;
}

/* The array under "a" of {"a": [...]}, as a document of its own. */
static void J_array(const char *json_array, bson_t **holder, bson_t *arr)
{
    char *w = malloc(strlen(json_array) + 16);
    bson_iter_t it;
    uint32_t len;
    const uint8_t *data;

    sprintf(w, "{\"a\": %s}", json_array);
    *holder = J(w);
    free(w);
    ck_assert(bson_iter_init_find(&it, *holder, "a") && BSON_ITER_HOLDS_ARRAY(&it));
    bson_iter_array(&it, &len, &data);
    ck_assert(bson_init_static(arr, data, len));
}

struct src {
    bson_iter_t it;
    int calls;
};

static int src_next(void *arg, bson_t *doc, struct doc_err *e)
{
    struct src *s = arg;
    uint32_t len;
    const uint8_t *data;

    s->calls++;
    if (!bson_iter_next(&s->it))
        return 0;
    ck_assert(BSON_ITER_HOLDS_DOCUMENT(&s->it));
    bson_iter_document(&s->it, &len, &data);
    ck_assert(bson_init_static(doc, data, len));
    (void)e;
    return 1;
}

struct sink {
    bson_t out;                 /* the results as an array document */
    uint32_t n;
};

static int sink_take(void *arg, const bson_t *doc, struct doc_err *e)
{
    struct sink *k = arg;
    char buf[16];
    const char *key;
    size_t kl = bson_uint32_to_string(k->n++, &key, buf, sizeof(buf));

    bson_append_document(&k->out, key, (int)kl, doc);
    (void)e;
    return 0;
}

/* Compile and run `pipeline` over `docs` (JSON arrays); the results in
 * k->out. Returns doc_agg_run's result; compile must succeed. */
static int run(const char *pipeline, const char *docs, const struct doc_agg_run_opts *o,
               struct sink *k, struct doc_err *e, int *src_calls)
{
    bson_t *ph, *dh, pa, da;
    struct doc_pipeline *p;
    struct src s;
    int rc;

    J_array(pipeline, &ph, &pa);
    J_array(docs, &dh, &da);
    ck_assert_msg(doc_agg_compile(&pa, &p, e) == 0, "%s: %s", pipeline, e->msg);
    ck_assert(bson_iter_init(&s.it, &da));
    s.calls = 0;
    bson_init(&k->out);
    k->n = 0;
    rc = doc_agg_run(p, o, src_next, &s, sink_take, k, e);
    if (src_calls)
        *src_calls = s.calls;
    doc_agg_free(p);
    bson_destroy(ph);
    bson_destroy(dh);
    return rc;
}

static void assert_results(struct sink *k, const char *want_array, const char *what)
{
    bson_t *wh, wa;
    char *g, *w;

    J_array(want_array, &wh, &wa);
    g = bson_as_relaxed_extended_json(&k->out, NULL);
    w = bson_as_relaxed_extended_json(&wa, NULL);
    ck_assert_msg(bson_equal(&k->out, &wa), "%s:\n got  %s\n want %s", what, g, w);
    bson_free(g);
    bson_free(w);
    bson_destroy(wh);
}

/* ---- tables ---- */

/* $group's page, "Group by Item Having" data (prices as numbers here). */
static const char *sales =
    "[{\"_id\": 1, \"item\": \"abc\", \"price\": 10, \"quantity\": 2},"
    " {\"_id\": 2, \"item\": \"jkl\", \"price\": 20, \"quantity\": 1},"
    " {\"_id\": 3, \"item\": \"xyz\", \"price\": 5, \"quantity\": 10},"
    " {\"_id\": 4, \"item\": \"xyz\", \"price\": 5, \"quantity\": 20},"
    " {\"_id\": 5, \"item\": \"abc\", \"price\": 10, \"quantity\": 10},"
    " {\"_id\": 6, \"item\": \"def\", \"price\": 7.5, \"quantity\": 5},"
    " {\"_id\": 7, \"item\": \"def\", \"price\": 7.5, \"quantity\": 10},"
    " {\"_id\": 8, \"item\": \"abc\", \"price\": 10, \"quantity\": 5}]";

/* $unwind's page, "preserveNullAndEmptyArrays" and "includeArrayIndex". */
static const char *clothing =
    "[{\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": [\"S\", \"M\", \"L\"]},"
    " {\"_id\": 2, \"item\": \"EFG\", \"price\": 120, \"sizes\": []},"
    " {\"_id\": 3, \"item\": \"IJK\", \"price\": 160, \"sizes\": \"M\"},"
    " {\"_id\": 4, \"item\": \"LMN\", \"price\": 10},"
    " {\"_id\": 5, \"item\": \"XYZ\", \"price\": 5.75, \"sizes\": null}]";

/* Values of every kind for the accumulators' rules on non-numbers, null
 * and missing ($sum, $avg, $min, $max, $first, $last, $push pages). */
static const char *mixed =
    "[{\"_id\": 1, \"v\": 1}, {\"_id\": 2, \"v\": \"str\"}, {\"_id\": 3},"
    " {\"_id\": 4, \"v\": null}, {\"_id\": 5, \"v\": [1, 2]}, {\"_id\": 6, \"v\": 2.5},"
    " {\"_id\": 7, \"v\": {\"$numberLong\": \"4\"}}]";

static const char *one =
    "[{\"_id\": 1, \"a\": 5, \"b\": 2, \"s\": \"Hello\", \"arr\": [1, 2, 3], \"n\": null, \"f\": 2.5,"
    " \"d\": {\"$date\": \"2020-01-01T00:00:00Z\"}, \"o\": [{\"k\": 1}, {\"k\": 2}, {\"z\": 0}],"
    " \"o2\": [{\"k\": 1}, [{\"k\": 3}], 7, {\"k\": [2]}]}]";

static const struct agg_case {
    const char *what, *pipeline, **docs, *want;
} cases[] = {
    {"group by item with every accumulator",
     "[{\"$group\": {\"_id\": \"$item\", \"total\": {\"$sum\": {\"$multiply\": [\"$price\", \"$quantity\"]}},"
     " \"avgPrice\": {\"$avg\": \"$price\"}, \"n\": {\"$sum\": 1}, \"cnt\": {\"$count\": {}},"
     " \"firstQ\": {\"$first\": \"$quantity\"}, \"lastQ\": {\"$last\": \"$quantity\"},"
     " \"minQ\": {\"$min\": \"$quantity\"}, \"maxQ\": {\"$max\": \"$quantity\"}, \"qs\": {\"$push\": \"$quantity\"}}}]",
     &sales,
     "[{\"_id\": \"abc\", \"total\": 170, \"avgPrice\": 10.0, \"n\": 3, \"cnt\": 3, \"firstQ\": 2, \"lastQ\": 5,"
     " \"minQ\": 2, \"maxQ\": 10, \"qs\": [2, 10, 5]},"
     " {\"_id\": \"jkl\", \"total\": 20, \"avgPrice\": 20.0, \"n\": 1, \"cnt\": 1, \"firstQ\": 1, \"lastQ\": 1,"
     " \"minQ\": 1, \"maxQ\": 1, \"qs\": [1]},"
     " {\"_id\": \"xyz\", \"total\": 150, \"avgPrice\": 5.0, \"n\": 2, \"cnt\": 2, \"firstQ\": 10, \"lastQ\": 20,"
     " \"minQ\": 10, \"maxQ\": 20, \"qs\": [10, 20]},"
     " {\"_id\": \"def\", \"total\": 112.5, \"avgPrice\": 7.5, \"n\": 2, \"cnt\": 2, \"firstQ\": 5, \"lastQ\": 10,"
     " \"minQ\": 5, \"maxQ\": 10, \"qs\": [5, 10]}]"},
    {"group by null: one group of everything",
     "[{\"$group\": {\"_id\": null, \"total\": {\"$sum\": \"$quantity\"}, \"avg\": {\"$avg\": \"$quantity\"}}}]",
     &sales, "[{\"_id\": null, \"total\": 63, \"avg\": 7.875}]"},
    {"group by a document of paths",
     "[{\"$group\": {\"_id\": {\"p\": \"$price\"}, \"ids\": {\"$push\": \"$_id\"}}}, {\"$sort\": {\"_id.p\": 1}}]",
     &sales,
     "[{\"_id\": {\"p\": 5}, \"ids\": [3, 4]}, {\"_id\": {\"p\": 7.5}, \"ids\": [6, 7]},"
     " {\"_id\": {\"p\": 10}, \"ids\": [1, 5, 8]}, {\"_id\": {\"p\": 20}, \"ids\": [2]}]"},
    {"1, 1.0 and NumberLong(1) are one group, named as first seen",
     "[{\"$group\": {\"_id\": \"$v\", \"n\": {\"$sum\": 1}}}]",
     (const char *[]){"[{\"v\": 1}, {\"v\": 1.0}, {\"v\": 2}, {\"v\": {\"$numberLong\": \"1\"}}]"},
     "[{\"_id\": 1, \"n\": 3}, {\"_id\": 2, \"n\": 1}]"},
    {"pymongo count_documents",
     "[{\"$match\": {}}, {\"$skip\": 1}, {\"$limit\": 3}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}]",
     &sales, "[{\"_id\": 1, \"n\": 3}]"},
    {"pymongo count_documents with a filter",
     "[{\"$match\": {\"item\": \"abc\"}}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}]", &sales,
     "[{\"_id\": 1, \"n\": 3}]"},
    {"pymongo count_documents of nothing: no document",
     "[{\"$match\": {}}, {\"$skip\": 10}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}]", &sales, "[]"},
    {"accumulators over non-numbers, null and missing",
     "[{\"$group\": {\"_id\": null, \"s\": {\"$sum\": \"$v\"}, \"a\": {\"$avg\": \"$v\"}, \"mn\": {\"$min\": \"$v\"},"
     " \"mx\": {\"$max\": \"$v\"}, \"f\": {\"$first\": \"$v\"}, \"l\": {\"$last\": \"$v\"}, \"p\": {\"$push\": \"$v\"}}}]",
     &mixed,
     "[{\"_id\": null, \"s\": 7.5, \"a\": 2.5, \"mn\": 1, \"mx\": [1, 2], \"f\": 1, \"l\": {\"$numberLong\": \"4\"},"
     " \"p\": [1, \"str\", null, [1, 2], 2.5, {\"$numberLong\": \"4\"}]}]"},
    {"$sum of nothing numeric is 0, $avg null, $min null; $first of missing null",
     "[{\"$match\": {\"_id\": 2}}, {\"$group\": {\"_id\": \"$_id\", \"s\": {\"$sum\": \"$v\"}, \"a\": {\"$avg\": \"$v\"},"
     " \"mn\": {\"$min\": \"$nope\"}, \"f\": {\"$first\": \"$nope\"}, \"p\": {\"$push\": \"$nope\"}}}]",
     &mixed, "[{\"_id\": 2, \"s\": 0, \"a\": null, \"mn\": null, \"f\": null, \"p\": []}]"},
    {"$sum widens int to long on overflow",
     "[{\"$group\": {\"_id\": null, \"s\": {\"$sum\": \"$v\"}}}]",
     (const char *[]){"[{\"v\": 2147483647}, {\"v\": 1}]"}, "[{\"_id\": null, \"s\": {\"$numberLong\": \"2147483648\"}}]"},
    {"$sum and $avg of doubles sum without losing what rounding drops (ten 0.1s are 1.0)",
     "[{\"$group\": {\"_id\": null, \"s\": {\"$sum\": \"$v\"}, \"a\": {\"$avg\": \"$v\"}}}]",
     (const char *[]){"[{\"v\": 0.1}, {\"v\": 0.1}, {\"v\": 0.1}, {\"v\": 0.1}, {\"v\": 0.1},"
                      " {\"v\": 0.1}, {\"v\": 0.1}, {\"v\": 0.1}, {\"v\": 0.1}, {\"v\": 0.1}]"},
     "[{\"_id\": null, \"s\": 1.0, \"a\": 0.1}]"},
    {"$group of no input: no document", "[{\"$group\": {\"_id\": null, \"n\": {\"$sum\": 1}}}]",
     (const char *[]){"[]"}, "[]"},

    {"$unwind a path", "[{\"$unwind\": \"$sizes\"}]", &clothing,
     "[{\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"S\"},"
     " {\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"M\"},"
     " {\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"L\"},"
     " {\"_id\": 3, \"item\": \"IJK\", \"price\": 160, \"sizes\": \"M\"}]"},
    {"$unwind preserveNullAndEmptyArrays",
     "[{\"$unwind\": {\"path\": \"$sizes\", \"preserveNullAndEmptyArrays\": true}}]", &clothing,
     "[{\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"S\"},"
     " {\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"M\"},"
     " {\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"L\"},"
     " {\"_id\": 2, \"item\": \"EFG\", \"price\": 120},"
     " {\"_id\": 3, \"item\": \"IJK\", \"price\": 160, \"sizes\": \"M\"},"
     " {\"_id\": 4, \"item\": \"LMN\", \"price\": 10},"
     " {\"_id\": 5, \"item\": \"XYZ\", \"price\": 5.75, \"sizes\": null}]"},
    {"$unwind includeArrayIndex",
     "[{\"$unwind\": {\"path\": \"$sizes\", \"includeArrayIndex\": \"arrayIndex\"}}]", &clothing,
     "[{\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"S\", \"arrayIndex\": {\"$numberLong\": \"0\"}},"
     " {\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"M\", \"arrayIndex\": {\"$numberLong\": \"1\"}},"
     " {\"_id\": 1, \"item\": \"ABC\", \"price\": 80, \"sizes\": \"L\", \"arrayIndex\": {\"$numberLong\": \"2\"}},"
     " {\"_id\": 3, \"item\": \"IJK\", \"price\": 160, \"sizes\": \"M\", \"arrayIndex\": null}]"},
    {"$unwind both options",
     "[{\"$unwind\": {\"path\": \"$sizes\", \"includeArrayIndex\": \"i\", \"preserveNullAndEmptyArrays\": true}},"
     " {\"$match\": {\"_id\": {\"$gte\": 2}}}]", &clothing,
     "[{\"_id\": 2, \"item\": \"EFG\", \"price\": 120, \"i\": null},"
     " {\"_id\": 3, \"item\": \"IJK\", \"price\": 160, \"sizes\": \"M\", \"i\": null},"
     " {\"_id\": 4, \"item\": \"LMN\", \"price\": 10, \"i\": null},"
     " {\"_id\": 5, \"item\": \"XYZ\", \"price\": 5.75, \"sizes\": null, \"i\": null}]"},
    {"$unwind a dotted path; the index replaces a field of that name in place",
     "[{\"$unwind\": {\"path\": \"$a.b\", \"includeArrayIndex\": \"i\"}}]",
     (const char *[]){"[{\"i\": \"old\", \"a\": {\"b\": [7, 8], \"c\": 1}}]"},
     "[{\"i\": {\"$numberLong\": \"0\"}, \"a\": {\"b\": 7, \"c\": 1}}, {\"i\": {\"$numberLong\": \"1\"}, \"a\": {\"b\": 8, \"c\": 1}}]"},
    {"$unwind then $group: the sizes counted",
     "[{\"$unwind\": \"$sizes\"}, {\"$group\": {\"_id\": \"$sizes\", \"n\": {\"$sum\": 1}}}]", &clothing,
     "[{\"_id\": \"S\", \"n\": 1}, {\"_id\": \"M\", \"n\": 2}, {\"_id\": \"L\", \"n\": 1}]"},

    {"$sort, $skip, $limit, $project",
     "[{\"$sort\": {\"quantity\": -1, \"_id\": 1}}, {\"$skip\": 1}, {\"$limit\": 3}, {\"$project\": {\"_id\": 1}}]",
     &sales, "[{\"_id\": 3}, {\"_id\": 5}, {\"_id\": 7}]"},
    {"$limit then $sort", "[{\"$limit\": 3}, {\"$sort\": {\"quantity\": 1}}, {\"$project\": {\"quantity\": 1}}]",
     &sales, "[{\"_id\": 2, \"quantity\": 1}, {\"_id\": 1, \"quantity\": 2}, {\"_id\": 3, \"quantity\": 10}]"},
    {"$count ($count page: passing scores)",
     "[{\"$match\": {\"item\": \"abc\"}}, {\"$count\": \"abc_sales\"}]", &sales, "[{\"abc_sales\": 3}]"},
    {"$count of nothing: no document", "[{\"$match\": {\"item\": \"zzz\"}}, {\"$count\": \"n\"}]", &sales, "[]"},
    {"$project with expressions",
     "[{\"$limit\": 1}, {\"$project\": {\"item\": 1, \"total\": {\"$multiply\": [\"$price\", \"$quantity\"]},"
     " \"name\": {\"$toUpper\": \"$item\"}}}]",
     &sales, "[{\"_id\": 1, \"item\": \"abc\", \"total\": 20, \"name\": \"ABC\"}]"},
    {"$project exclusion", "[{\"$limit\": 2}, {\"$project\": {\"_id\": 0, \"price\": 0}}]", &sales,
     "[{\"item\": \"abc\", \"quantity\": 2}, {\"item\": \"jkl\", \"quantity\": 1}]"},
    {"$project renaming, _id excluded",
     "[{\"$limit\": 1}, {\"$project\": {\"_id\": 0, \"what\": \"$item\", \"q\": \"$quantity\"}}]", &sales,
     "[{\"what\": \"abc\", \"q\": 2}]"},
    {"empty pipeline", "[]", (const char *[]){"[{\"a\": 1}, {\"b\": 2}]"}, "[{\"a\": 1}, {\"b\": 2}]"},
};

START_TEST(test_agg_table)
{
    const struct agg_case *c = &cases[_i];
    struct sink k;
    struct doc_err e = {0};

    ck_assert_msg(run(c->pipeline, *c->docs, NULL, &k, &e, NULL) == 0, "%s: %s", c->what, e.msg);
    assert_results(&k, c->want, c->what);
    bson_destroy(&k.out);
}
END_TEST

/* ---- expressions: each in a $project on one document ---- */

static const struct {
    const char *expr, *want;    /* want: the projected document */
} exprs[] = {
    /* $add */
    {"{\"$add\": [1, 2]}", "{\"r\": 3}"},
    {"{\"$add\": [\"$a\", \"$f\"]}", "{\"r\": 7.5}"},
    {"{\"$add\": [2147483647, 1]}", "{\"r\": {\"$numberLong\": \"2147483648\"}}"},
    {"{\"$add\": [{\"$numberLong\": \"1\"}, 1]}", "{\"r\": {\"$numberLong\": \"2\"}}"},
    {"{\"$add\": [\"$a\", null]}", "{\"r\": null}"},
    {"{\"$add\": [\"$a\", \"$nope\"]}", "{\"r\": null}"},
    {"{\"$add\": [\"$d\", 1000]}", "{\"r\": {\"$date\": \"2020-01-01T00:00:01Z\"}}"},
    {"{\"$add\": []}", "{\"r\": 0}"},
    /* $subtract */
    {"{\"$subtract\": [\"$a\", \"$b\"]}", "{\"r\": 3}"},
    {"{\"$subtract\": [\"$b\", \"$f\"]}", "{\"r\": -0.5}"},
    {"{\"$subtract\": [\"$d\", \"$d\"]}", "{\"r\": {\"$numberLong\": \"0\"}}"},
    {"{\"$subtract\": [\"$d\", 60000]}", "{\"r\": {\"$date\": \"2019-12-31T23:59:00Z\"}}"},
    {"{\"$subtract\": [\"$n\", 1]}", "{\"r\": null}"},
    {"{\"$subtract\": [-2147483648, 1]}", "{\"r\": {\"$numberLong\": \"-2147483649\"}}"},
    /* $multiply, $divide */
    {"{\"$multiply\": [\"$a\", \"$b\", \"$f\"]}", "{\"r\": 25.0}"},
    {"{\"$multiply\": [65536, 65536]}", "{\"r\": {\"$numberLong\": \"4294967296\"}}"},
    {"{\"$divide\": [\"$a\", \"$b\"]}", "{\"r\": 2.5}"},
    {"{\"$divide\": [4, 2]}", "{\"r\": 2.0}"},
    {"{\"$divide\": [\"$nope\", 2]}", "{\"r\": null}"},
    /* $concat, $toLower, $toUpper */
    {"{\"$concat\": [\"$s\", \" \", \"world\"]}", "{\"r\": \"Hello world\"}"},
    {"{\"$concat\": [\"$s\", \"$nope\"]}", "{\"r\": null}"},
    {"{\"$concat\": []}", "{\"r\": \"\"}"},
    {"{\"$toLower\": \"$s\"}", "{\"r\": \"hello\"}"},
    {"{\"$toUpper\": [\"$s\"]}", "{\"r\": \"HELLO\"}"},
    {"{\"$toUpper\": \"$nope\"}", "{\"r\": \"\"}"},
    {"{\"$toLower\": 12}", "{\"r\": \"12\"}"},
    {"{\"$toLower\": 0.1}", "{\"r\": \"0.1\"}"},
    {"{\"$toUpper\": \"$f\"}", "{\"r\": \"2.5\"}"},
    {"{\"$toUpper\": 2.0}", "{\"r\": \"2\"}"},
    /* $cond, $ifNull */
    {"{\"$cond\": [\"$a\", \"yes\", \"no\"]}", "{\"r\": \"yes\"}"},
    {"{\"$cond\": {\"if\": \"$n\", \"then\": 1, \"else\": 2}}", "{\"r\": 2}"},
    {"{\"$cond\": [0, 1, 2]}", "{\"r\": 2}"},
    {"{\"$cond\": [[], 1, 2]}", "{\"r\": 1}"},
    {"{\"$ifNull\": [\"$nope\", \"dflt\"]}", "{\"r\": \"dflt\"}"},
    {"{\"$ifNull\": [\"$n\", \"$a\"]}", "{\"r\": 5}"},
    {"{\"$ifNull\": [\"$s\", \"x\"]}", "{\"r\": \"Hello\"}"},
    {"{\"$ifNull\": [\"$n\", \"$nope\", 3]}", "{\"r\": 3}"},
    /* $size, $literal, paths, objects and arrays of expressions */
    {"{\"$size\": \"$arr\"}", "{\"r\": 3}"},
    {"{\"$size\": [[]]}", "{\"r\": 0}"},
    {"{\"$literal\": \"$a\"}", "{\"r\": \"$a\"}"},
    {"{\"$literal\": {\"$add\": 1}}", "{\"r\": {\"$add\": 1}}"},
    {"\"$arr\"", "{\"r\": [1, 2, 3]}"},
    {"\"$nope\"", "{}"},
    {"\"$o.k\"", "{\"r\": [1, 2]}"},
    {"\"$o2.k\"", "{\"r\": [1, [2]]}"},
    {"\"$$ROOT.a\"", "{\"r\": 5}"},
    {"\"$$CURRENT.s\"", "{\"r\": \"Hello\"}"},
    {"{\"x\": \"$a\", \"y\": [\"$b\", \"$nope\"], \"z\": \"$nope\"}", "{\"r\": {\"x\": 5, \"y\": [2, null]}}"},
    {"\"plain string\"", "{\"r\": \"plain string\"}"},
    {"{\"$add\": [\"$a\", {\"$multiply\": [\"$b\", {\"$size\": \"$arr\"}]}]}", "{\"r\": 11}"},
};

START_TEST(test_agg_exprs)
{
    char pipeline[512];
    struct sink k;
    struct doc_err e = {0};
    char want[256];

    snprintf(pipeline, sizeof(pipeline), "[{\"$project\": {\"_id\": 0, \"r\": %s}}]", exprs[_i].expr);
    snprintf(want, sizeof(want), "[%s]", exprs[_i].want);
    ck_assert_msg(run(pipeline, one, NULL, &k, &e, NULL) == 0, "%s: %s", exprs[_i].expr, e.msg);
    assert_results(&k, want, exprs[_i].expr);
    bson_destroy(&k.out);
}
END_TEST

/* Errors while running: the run fails with MongoDB's error, and the sink
 * saw nothing of that document. */
static const struct {
    const char *expr;
    int code;
    const char *msg;
} run_errs[] = {
    {"{\"$divide\": [\"$a\", 0]}", DOC_BadValue, "can't $divide by zero"},
    {"{\"$add\": [\"$s\", 1]}", DOC_TypeMismatch, "$add only supports numeric or date types, not string"},
    {"{\"$multiply\": [\"$d\", 1]}", DOC_TypeMismatch, "$multiply only supports numeric types, not date"},
    {"{\"$add\": [\"$d\", \"$d\"]}", DOC_BadValue, "only one date allowed"},
    {"{\"$subtract\": [1, \"$d\"]}", DOC_TypeMismatch, "can't $subtract date from int"},
    {"{\"$size\": \"$a\"}", DOC_BadValue, "The argument to $size must be an array. Type of argument is int"},
    {"{\"$size\": \"$nope\"}", DOC_BadValue, "Type of argument is missing"},
    {"{\"$concat\": [\"$s\", 1]}", DOC_TypeMismatch, "$concat only supports strings, not int"},
    {"{\"$toUpper\": \"$arr\"}", DOC_TypeMismatch, "can't convert from BSON type array to String"},
};

START_TEST(test_agg_run_errors)
{
    char pipeline[512];
    struct sink k;
    struct doc_err e = {0};

    snprintf(pipeline, sizeof(pipeline), "[{\"$project\": {\"r\": %s}}]", run_errs[_i].expr);
    ck_assert_int_lt(run(pipeline, one, NULL, &k, &e, NULL), 0);
    ck_assert_msg(e.code == run_errs[_i].code, "%s: code %d (%s)", run_errs[_i].expr, e.code, e.msg);
    ck_assert_msg(strstr(e.msg, run_errs[_i].msg), "%s: '%s'", run_errs[_i].expr, e.msg);
    ck_assert_uint_eq(k.n, 0);
    bson_destroy(&k.out);
}
END_TEST

/* ---- compile errors ---- */

static const struct {
    const char *pipeline, *msg;
} comp_errs[] = {
    {"[{\"$nosuch\": {}}]", "Unrecognized pipeline stage name: '$nosuch'"},
    {"[{\"$match\": {}, \"$limit\": 1}]", "must contain exactly one field"},
    {"[{}]", "must contain exactly one field"},
    {"[5]", "must contain exactly one field"},
    {"[{\"$limit\": 0}]", "the limit must be positive"},
    {"[{\"$limit\": -1}]", "the limit must be positive"},
    {"[{\"$limit\": 1.5}]", "Expected an integer"},
    {"[{\"$limit\": \"1\"}]", "Expected an integer"},
    {"[{\"$skip\": -1}]", "Expected a non-negative number"},
    {"[{\"$match\": 1}]", "must be an expression in an object"},
    {"[{\"$sort\": {}}]", "at least one sort key"},
    {"[{\"$sort\": {\"a\": 0}}]", "must be 1 (for ascending) or -1"},
    {"[{\"$sort\": {\"$natural\": 1}}]", "$natural"},
    {"[{\"$project\": {}}]", "at least one output field"},
    {"[{\"$project\": {\"a\": {\"$slice\": 1}}}]", "Unrecognized expression '$slice'"},
    {"[{\"$project\": {\"a\": {\"$nosuch\": 1}}}]", "Unrecognized expression '$nosuch'"},
    {"[{\"$project\": {\"a\": {\"$add\": 1, \"$multiply\": 2}}}]", "exactly one field"},
    {"[{\"$project\": {\"a\": {\"$subtract\": [1]}}}]", "Expression $subtract takes exactly 2 arguments. 1 were passed in."},
    {"[{\"$project\": {\"a\": {\"$cond\": {\"if\": 1, \"then\": 2}}}}]", "Missing 'else' parameter to $cond"},
    {"[{\"$project\": {\"a\": {\"$ifNull\": [1]}}}]", "needs at least 2 arguments"},
    {"[{\"$project\": {\"a\": \"$\"}}]", "'$' by itself is not a valid FieldPath"},
    {"[{\"$project\": {\"a\": \"$$nosuch\"}}]", "Use of undefined variable: nosuch"},
    {"[{\"$project\": {\"a\": \"$b..c\"}}]", "may not be empty"},
    {"[{\"$group\": {\"_id\": {\"x.y\": \"$a\"}}}]", "may not contain '.'"},
    {"[{\"$group\": {\"n\": {\"$sum\": 1}}}]", "a group specification must include an _id"},
    {"[{\"$group\": 1}]", "must be specified in an object"},
    {"[{\"$group\": {\"_id\": null, \"n\": {\"$median\": 1}}}]", "Unknown group operator '$median'"},
    {"[{\"$group\": {\"_id\": null, \"n\": 1}}]", "The field 'n' must be an accumulator object"},
    {"[{\"$group\": {\"_id\": null, \"n\": {\"$sum\": 1, \"$avg\": 1}}}]", "The field 'n' must specify one accumulator"},
    {"[{\"$group\": {\"_id\": null, \"a.b\": {\"$sum\": 1}}}]", "The field name 'a.b' cannot contain '.'"},
    {"[{\"$group\": {\"_id\": null, \"n\": {\"$count\": 1}}}]", "$count takes no arguments"},
    {"[{\"$group\": {\"_id\": null, \"n\": {\"$sum\": [1, 2]}}}]", "unary operator"},
    {"[{\"$group\": {\"_id\": {\"$nosuch\": 1}}}]", "Unrecognized expression '$nosuch'"},
    {"[{\"$unwind\": \"sizes\"}]", "should be prefixed with a '$'"},
    {"[{\"$unwind\": 1}]", "expected either a string or an object"},
    {"[{\"$unwind\": {\"includeArrayIndex\": \"i\"}}]", "no path specified to $unwind stage"},
    {"[{\"$unwind\": {\"path\": \"$a\", \"bogus\": 1}}]", "unrecognized option to $unwind stage: bogus"},
    {"[{\"$unwind\": {\"path\": \"$a\", \"preserveNullAndEmptyArrays\": 1}}]", "expected a boolean"},
    {"[{\"$unwind\": {\"path\": \"$a\", \"includeArrayIndex\": \"$i\"}}]", "should not be prefixed with a '$'"},
    {"[{\"$count\": \"\"}]", "the count field must be a non-empty string"},
    {"[{\"$count\": 1}]", "the count field must be a non-empty string"},
    {"[{\"$count\": \"$n\"}]", "cannot be a $-prefixed path"},
    {"[{\"$count\": \"a.b\"}]", "cannot contain '.'"},
    {"[{\"$limit\": 1}, {\"$bogus\": 1}]", "Unrecognized pipeline stage name: '$bogus'"},
};

START_TEST(test_agg_compile_errors)
{
    bson_t *h, a;
    struct doc_pipeline *p = (struct doc_pipeline *)1;
    struct doc_err e = {0};

    J_array(comp_errs[_i].pipeline, &h, &a);
    ck_assert_int_lt(doc_agg_compile(&a, &p, &e), 0);
    ck_assert_ptr_null(p);
    ck_assert_msg(e.code == DOC_BadValue, "%s: code %d (%s)", comp_errs[_i].pipeline, e.code, e.msg);
    ck_assert_msg(strstr(e.msg, comp_errs[_i].msg), "%s: '%s'", comp_errs[_i].pipeline, e.msg);
    bson_destroy(h);
}
END_TEST

/* $project mixing inclusion and exclusion: MongoDB's code, not BadValue. */
START_TEST(test_agg_project_mixing)
{
    bson_t *h, a;
    struct doc_pipeline *p;
    struct doc_err e = {0};

    J_array("[{\"$project\": {\"a\": 1, \"b\": 0}}]", &h, &a);
    ck_assert_int_lt(doc_agg_compile(&a, &p, &e), 0);
    ck_assert_int_eq(e.code, DOC_Location31254);
    ck_assert_str_eq(e.msg, "Cannot do exclusion on field b in inclusion projection");
    bson_destroy(h);
}
END_TEST

/* ---- the memory limit ---- */

START_TEST(test_agg_memory_limit)
{
    struct doc_agg_run_opts o = {.max_bytes = 600};
    struct sink k;
    struct doc_err e = {0};

    /* $sort holds every document: past the limit the run fails. */
    ck_assert_int_lt(run("[{\"$sort\": {\"quantity\": 1}}]", sales, &o, &k, &e, NULL), 0);
    ck_assert_int_eq(e.code, DOC_QueryExceededMemoryLimitNoDiskUseAllowed);
    ck_assert_ptr_nonnull(strstr(e.msg, "Sort exceeded memory limit of 600 bytes"));
    ck_assert_uint_eq(k.n, 0);
    bson_destroy(&k.out);

    /* $group: one group per document. */
    e.code = 0;
    ck_assert_int_lt(run("[{\"$group\": {\"_id\": \"$_id\", \"all\": {\"$push\": \"$$ROOT\"}}}]", sales, &o, &k,
                         &e, NULL), 0);
    ck_assert_int_eq(e.code, DOC_QueryExceededMemoryLimitNoDiskUseAllowed);
    ck_assert_ptr_nonnull(strstr(e.msg, "Exceeded memory limit for $group"));
    ck_assert_uint_eq(k.n, 0);
    bson_destroy(&k.out);

    /* The same runs fit the default limit; and streaming stages hold
     * nothing, so a small limit does not touch them. */
    ck_assert_int_eq(run("[{\"$sort\": {\"quantity\": 1}}]", sales, NULL, &k, &e, NULL), 0);
    ck_assert_uint_eq(k.n, 8);
    bson_destroy(&k.out);
    ck_assert_int_eq(run("[{\"$group\": {\"_id\": \"$_id\", \"all\": {\"$push\": \"$$ROOT\"}}}]", sales, NULL,
                         &k, &e, NULL), 0);
    ck_assert_uint_eq(k.n, 8);
    bson_destroy(&k.out);
    o.max_bytes = 1;
    ck_assert_int_eq(run("[{\"$project\": {\"item\": 1}}, {\"$unwind\": \"$item\"}, {\"$limit\": 5}]", sales, &o,
                         &k, &e, NULL), 0);
    ck_assert_uint_eq(k.n, 5);
    bson_destroy(&k.out);
}
END_TEST

/* ---- the source stops early; the leading stages ---- */

START_TEST(test_agg_limit_stops_source)
{
    struct sink k;
    struct doc_err e = {0};
    int calls = 0;

    ck_assert_int_eq(run("[{\"$limit\": 2}]", sales, NULL, &k, &e, &calls), 0);
    ck_assert_uint_eq(k.n, 2);
    ck_assert_int_eq(calls, 2);
    bson_destroy(&k.out);
    /* Past a $group the limit cannot stop the source. */
    ck_assert_int_eq(run("[{\"$group\": {\"_id\": \"$item\"}}, {\"$limit\": 1}]", sales, NULL, &k, &e, &calls),
                     0);
    ck_assert_uint_eq(k.n, 1);
    ck_assert_int_eq(calls, 9);
    bson_destroy(&k.out);
}
END_TEST

/* An endless source of {a: 1}. */
static int src_next_one(bson_t *doc)
{
    static const uint8_t one_doc[] = {12, 0, 0, 0, 0x10, 'a', 0, 1, 0, 0, 0, 0};

    ck_assert(bson_init_static(doc, one_doc, sizeof(one_doc)));
    return 1;
}

static int sink_fail(void *arg, const bson_t *doc, struct doc_err *e)
{
    int *n = arg;

    (void)doc;
    if (++*n == 2)
        return doc_errf(e, DOC_InternalError, "sink full");
    return 0;
}

START_TEST(test_agg_sink_error)
{
    bson_t *ph, pa, *dh, da;
    struct doc_pipeline *p;
    struct doc_err e = {0};
    struct src s;
    int n = 0;

    J_array("[{\"$sort\": {\"_id\": -1}}]", &ph, &pa);
    J_array(sales, &dh, &da);
    ck_assert_int_eq(doc_agg_compile(&pa, &p, &e), 0);
    ck_assert(bson_iter_init(&s.it, &da));
    ck_assert_int_lt(doc_agg_run(p, NULL, src_next, &s, sink_fail, &n, &e), 0);
    ck_assert_int_eq(e.code, DOC_InternalError);
    ck_assert_str_eq(e.msg, "sink full");
    ck_assert_int_eq(n, 2);
    doc_agg_free(p);
    bson_destroy(ph);
    bson_destroy(dh);
}
END_TEST

static int src_fail(void *arg, bson_t *doc, struct doc_err *e)
{
    int *calls = arg;

    if (++*calls == 3)
        return doc_errf(e, DOC_InternalError, "source broke");
    return src_next_one(doc);
}

/* A source's error ends the run with it; the blocking stage sends nothing. */
START_TEST(test_agg_source_error)
{
    bson_t *ph, pa;
    struct doc_pipeline *p;
    struct doc_err e = {0};
    struct sink k;
    int calls = 0;

    J_array("[{\"$group\": {\"_id\": \"$a\", \"n\": {\"$sum\": 1}}}]", &ph, &pa);
    ck_assert_int_eq(doc_agg_compile(&pa, &p, &e), 0);
    bson_init(&k.out);
    k.n = 0;
    ck_assert_int_lt(doc_agg_run(p, NULL, src_fail, &calls, sink_take, &k, &e), 0);
    ck_assert_int_eq(e.code, DOC_InternalError);
    ck_assert_str_eq(e.msg, "source broke");
    ck_assert_int_eq(calls, 3);
    ck_assert_uint_eq(k.n, 0);
    bson_destroy(&k.out);
    doc_agg_free(p);
    bson_destroy(ph);
}
END_TEST

START_TEST(test_agg_leading)
{
    static const struct {
        const char *pipeline;
        bool match;
        const char *sort;
    } t[] = {
        {"[{\"$match\": {\"item\": \"abc\"}}, {\"$sort\": {\"quantity\": -1}}, {\"$limit\": 1}]", true, "quantity"},
        {"[{\"$sort\": {\"price\": 1}}, {\"$match\": {\"item\": \"abc\"}}]", false, "price"},
        {"[{\"$match\": {\"item\": \"abc\"}}, {\"$limit\": 1}, {\"$sort\": {\"price\": 1}}]", true, NULL},
        {"[{\"$group\": {\"_id\": null}}, {\"$sort\": {\"price\": 1}}]", false, NULL},
        {"[]", false, NULL},
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        bson_t *h, a;
        struct doc_pipeline *p;
        struct doc_err e = {0};
        const struct doc_sort *s;
        int dir;

        J_array(t[i].pipeline, &h, &a);
        ck_assert_int_eq(doc_agg_compile(&a, &p, &e), 0);
        ck_assert_msg((doc_agg_leading_match(p) != NULL) == t[i].match, "%s", t[i].pipeline);
        s = doc_agg_leading_sort(p);
        if (t[i].sort)
            ck_assert_str_eq(doc_sort_path(s, 0, &dir), t[i].sort);
        else
            ck_assert_ptr_null(s);
        doc_agg_free(p);
        bson_destroy(h);
    }
}
END_TEST

/* The caller's source did the leading $match and $sort: the run starts at
 * the stage after them. */
START_TEST(test_agg_skip_leading)
{
    struct doc_agg_run_opts o = {.skip_leading = 2};
    struct sink k;
    struct doc_err e = {0};

    ck_assert_int_eq(run("[{\"$match\": {\"item\": \"none\"}}, {\"$sort\": {\"_id\": -1}}, {\"$limit\": 2},"
                         " {\"$project\": {\"_id\": 1}}]", sales, &o, &k, &e, NULL), 0);
    assert_results(&k, "[{\"_id\": 1}, {\"_id\": 2}]", "skip_leading 2");
    bson_destroy(&k.out);
    o.skip_leading = 1;
    ck_assert_int_eq(run("[{\"$match\": {\"item\": \"none\"}}, {\"$limit\": 1}]", sales, &o, &k, &e, NULL), 0);
    assert_results(&k, "[{\"_id\": 1, \"item\": \"abc\", \"price\": 10, \"quantity\": 2}]", "skip_leading 1");
    bson_destroy(&k.out);
    o.skip_leading = 3;
    ck_assert_int_lt(run("[{\"$limit\": 1}]", sales, &o, &k, &e, NULL), 0);
    ck_assert_int_eq(e.code, DOC_BadValue);
    bson_destroy(&k.out);
}
END_TEST

/* ---- generated documents against a direct computation ---- */

#define GEN_DOCS 400
#define GEN_CATS 5
#define GEN_TAGS 4

struct gen {
    int n;                      /* 0..999 */
    int cat;
    int xkind;                  /* 0 double, 1 missing, 2 string */
    double x;
    int ntags, tags[3];
};

static void generate(struct gen *g, bson_t *arr)
{
    uint32_t r = 12345;

    bson_init(arr);
    for (int i = 0; i < GEN_DOCS; i++) {
        bson_t d;
        char k[16], c[8];

        r = r * 1103515245u + 12345u;
        g[i].n = (int)((r >> 8) % 1000);
        g[i].cat = (i * 7 + (int)(r >> 20)) % GEN_CATS;
        g[i].xkind = i % 5 == 0 ? 1 : i % 7 == 0 ? 2 : 0;
        g[i].x = (double)((r >> 4) % 400) / 4.0;     /* exact in binary: sums are too */
        g[i].ntags = (int)((r >> 12) % 4);
        snprintf(k, sizeof(k), "%d", i);
        bson_append_document_begin(arr, k, -1, &d);
        bson_append_int32(&d, "_id", 3, i);
        snprintf(c, sizeof(c), "c%d", g[i].cat);
        bson_append_utf8(&d, "cat", 3, c, -1);
        bson_append_int32(&d, "n", 1, g[i].n);
        if (g[i].xkind == 0)
            bson_append_double(&d, "x", 1, g[i].x);
        else if (g[i].xkind == 2)
            bson_append_utf8(&d, "x", 1, "not a number", -1);
        {
            bson_t t;

            bson_append_array_begin(&d, "tags", 4, &t);
            for (int j = 0; j < g[i].ntags; j++) {
                char tk[16], tv[16];

                g[i].tags[j] = (int)((r >> (16 + 2 * j)) % GEN_TAGS);
                snprintf(tk, sizeof(tk), "%d", j);
                snprintf(tv, sizeof(tv), "t%d", g[i].tags[j]);
                bson_append_utf8(&t, tk, -1, tv, -1);
            }
            bson_append_array_end(&d, &t);
        }
        bson_append_document_end(arr, &d);
    }
}

static struct doc_pipeline *compile(const char *pipeline)
{
    bson_t *h, a;
    struct doc_pipeline *p;
    struct doc_err e = {0};

    J_array(pipeline, &h, &a);
    ck_assert_msg(doc_agg_compile(&a, &p, &e) == 0, "%s", e.msg);
    bson_destroy(h);
    return p;
}

static double get_num(const bson_t *d, const char *path, bson_type_t *t)
{
    bson_iter_t it, f;

    ck_assert_msg(bson_iter_init(&it, d) && bson_iter_find_descendant(&it, path, &f), "no %s", path);
    *t = bson_iter_type(&f);
    return *t == BSON_TYPE_NULL ? 0 : bson_iter_as_double(&f);
}

START_TEST(test_agg_generated_group)
{
    static struct gen g[GEN_DOCS];
    struct {
        int cnt, nx, mn, mx;
        double tot;
    } want[GEN_CATS][GEN_TAGS] = {{{0}}};
    bson_t arr;
    struct doc_pipeline *p;
    struct src s;
    struct sink k;
    struct doc_err e = {0};
    bson_iter_t it;
    int seen = 0;

    generate(g, &arr);
    for (int i = 0; i < GEN_DOCS; i++)
        for (int j = 0; j < g[i].ntags; j++) {
            __typeof__(want[0][0]) *w = &want[g[i].cat][g[i].tags[j]];

            if (g[i].n < 100)
                continue;
            if (!w->cnt || g[i].n < w->mn)
                w->mn = g[i].n;
            if (!w->cnt || g[i].n > w->mx)
                w->mx = g[i].n;
            w->cnt++;
            if (g[i].xkind == 0) {
                w->nx++;
                w->tot += g[i].x;
            }
        }
    p = compile("[{\"$match\": {\"n\": {\"$gte\": 100}}}, {\"$unwind\": \"$tags\"},"
                " {\"$group\": {\"_id\": {\"c\": \"$cat\", \"t\": \"$tags\"}, \"cnt\": {\"$sum\": 1},"
                " \"tot\": {\"$sum\": \"$x\"}, \"mn\": {\"$min\": \"$n\"}, \"mx\": {\"$max\": \"$n\"},"
                " \"av\": {\"$avg\": \"$x\"}}}, {\"$sort\": {\"_id.c\": 1, \"_id.t\": 1}}]");
    ck_assert(bson_iter_init(&s.it, &arr));
    bson_init(&k.out);
    k.n = 0;
    ck_assert_msg(doc_agg_run(p, NULL, src_next, &s, sink_take, &k, &e) == 0, "%s", e.msg);

    ck_assert(bson_iter_init(&it, &k.out));
    for (int c = 0; c < GEN_CATS; c++)
        for (int t = 0; t < GEN_TAGS; t++) {
            bson_t d;
            uint32_t len;
            const uint8_t *data;
            bson_iter_t f;
            bson_type_t ty;
            char cs[8], ts[8];

            if (!want[c][t].cnt)
                continue;
            ck_assert_msg(bson_iter_next(&it), "group c%d t%d missing", c, t);
            bson_iter_document(&it, &len, &data);
            bson_init_static(&d, data, len);
            snprintf(cs, sizeof(cs), "c%d", c);
            snprintf(ts, sizeof(ts), "t%d", t);
            ck_assert(bson_iter_init(&f, &d) && bson_iter_find_descendant(&f, "_id.c", &f));
            ck_assert_str_eq(bson_iter_utf8(&f, NULL), cs);
            ck_assert(bson_iter_init(&f, &d) && bson_iter_find_descendant(&f, "_id.t", &f));
            ck_assert_str_eq(bson_iter_utf8(&f, NULL), ts);
            ck_assert_int_eq((int)get_num(&d, "cnt", &ty), want[c][t].cnt);
            ck_assert_int_eq(ty, BSON_TYPE_INT32);
            ck_assert_int_eq((int)get_num(&d, "mn", &ty), want[c][t].mn);
            ck_assert_int_eq((int)get_num(&d, "mx", &ty), want[c][t].mx);
            if (want[c][t].nx) {
                ck_assert(get_num(&d, "tot", &ty) == want[c][t].tot);
                ck_assert_int_eq(ty, BSON_TYPE_DOUBLE);
                ck_assert(get_num(&d, "av", &ty) == want[c][t].tot / want[c][t].nx);
            } else {
                ck_assert(get_num(&d, "tot", &ty) == 0);
                ck_assert_int_eq(ty, BSON_TYPE_INT32);
                get_num(&d, "av", &ty);
                ck_assert_int_eq(ty, BSON_TYPE_NULL);
            }
            seen++;
        }
    ck_assert_msg(!bson_iter_next(&it), "more groups than expected");
    ck_assert_int_gt(seen, 10);
    bson_destroy(&k.out);
    doc_agg_free(p);
    bson_destroy(&arr);
}
END_TEST

static const struct gen *cmp_gen;

static int by_n_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;

    if (cmp_gen[x].n != cmp_gen[y].n)
        return cmp_gen[y].n - cmp_gen[x].n;
    return x - y;
}

START_TEST(test_agg_generated_sort)
{
    static struct gen g[GEN_DOCS];
    int idx[GEN_DOCS], m = 0;
    bson_t arr;
    struct doc_pipeline *p;
    struct src s;
    struct sink k;
    struct doc_err e = {0};
    bson_iter_t it;

    generate(g, &arr);
    for (int i = 0; i < GEN_DOCS; i++)
        if (g[i].n >= 500)
            idx[m++] = i;
    cmp_gen = g;
    qsort(idx, (size_t)m, sizeof(idx[0]), by_n_desc);
    ck_assert_int_gt(m, 70);

    p = compile("[{\"$match\": {\"n\": {\"$gte\": 500}}}, {\"$sort\": {\"n\": -1, \"_id\": 1}}, {\"$skip\": 10},"
                " {\"$limit\": 50}, {\"$project\": {\"n\": 1, \"cat\": {\"$toUpper\": \"$cat\"}}}]");
    ck_assert(bson_iter_init(&s.it, &arr));
    bson_init(&k.out);
    k.n = 0;
    ck_assert_msg(doc_agg_run(p, NULL, src_next, &s, sink_take, &k, &e) == 0, "%s", e.msg);
    ck_assert_uint_eq(k.n, 50);
    ck_assert(bson_iter_init(&it, &k.out));
    for (int i = 10; i < 60; i++) {
        char want[96];
        bson_t d;
        uint32_t len;
        const uint8_t *data;
        bson_t *w;

        ck_assert(bson_iter_next(&it));
        bson_iter_document(&it, &len, &data);
        bson_init_static(&d, data, len);
        snprintf(want, sizeof(want), "{\"_id\": %d, \"n\": %d, \"cat\": \"C%d\"}", idx[i], g[idx[i]].n,
                 g[idx[i]].cat);
        w = J(want);
        ck_assert_msg(bson_equal(&d, w), "position %d: want %s", i, want);
        bson_destroy(w);
    }
    bson_destroy(&k.out);
    doc_agg_free(p);
    bson_destroy(&arr);
}
END_TEST

/* $sort then $limit (or $skip and $limit) keeps only the first ones, as
 * MongoDB's top-k sort does: 400 documents do not fit the limit given
 * here, the 15 it keeps do; the order is the direct computation's. */
START_TEST(test_agg_generated_topk)
{
    static struct gen g[GEN_DOCS];
    static const char *const pipelines[] = {
        "[{\"$sort\": {\"n\": -1, \"_id\": 1}}, {\"$skip\": 10}, {\"$limit\": 5}, {\"$project\": {\"n\": 1}}]",
        "[{\"$sort\": {\"n\": -1, \"_id\": 1}}, {\"$limit\": 15}, {\"$skip\": 10}, {\"$project\": {\"n\": 1}}]",
    };
    struct doc_agg_run_opts o = {.max_bytes = 14000};
    int idx[GEN_DOCS];
    bson_t arr;

    generate(g, &arr);
    ck_assert_uint_gt(arr.len, 2 * o.max_bytes);
    for (int i = 0; i < GEN_DOCS; i++)
        idx[i] = i;
    cmp_gen = g;
    qsort(idx, GEN_DOCS, sizeof(idx[0]), by_n_desc);
    for (size_t t = 0; t < 2; t++) {
        struct doc_pipeline *p = compile(pipelines[t]);
        struct src s;
        struct sink k;
        struct doc_err e = {0};
        bson_iter_t it;

        ck_assert(bson_iter_init(&s.it, &arr));
        bson_init(&k.out);
        k.n = 0;
        ck_assert_msg(doc_agg_run(p, &o, src_next, &s, sink_take, &k, &e) == 0, "%s: %s", pipelines[t],
                      e.msg);
        ck_assert_uint_eq(k.n, 5);
        ck_assert(bson_iter_init(&it, &k.out));
        for (int i = 10; i < 15; i++) {
            char want[64];
            bson_t d, *w;
            uint32_t len;
            const uint8_t *data;

            ck_assert(bson_iter_next(&it));
            bson_iter_document(&it, &len, &data);
            bson_init_static(&d, data, len);
            snprintf(want, sizeof(want), "{\"_id\": %d, \"n\": %d}", idx[i], g[idx[i]].n);
            w = J(want);
            ck_assert_msg(bson_equal(&d, w), "%s: position %d: want %s", pipelines[t], i, want);
            bson_destroy(w);
        }
        bson_destroy(&k.out);
        doc_agg_free(p);
    }
    bson_destroy(&arr);
}
END_TEST

/* ---- random documents: properties every result must have ---- */

static uint32_t rnd_state;

static uint32_t rnd(uint32_t n)
{
    rnd_state = rnd_state * 1103515245u + 12345u;
    return (rnd_state >> 8) % n;
}

static void rnd_value(bson_t *d, const char *k, unsigned depth);

static void rnd_fields(bson_t *d, unsigned depth)
{
    static const char *const names[] = {"a", "b", "c", "d"};

    for (int i = 0; i < 4; i++)
        if (rnd(3))
            rnd_value(d, names[i], depth);
}

static void rnd_value(bson_t *d, const char *k, unsigned depth)
{
    bson_t sub;

    switch (rnd(depth < 3 ? 9 : 7)) {
    case 0: bson_append_int32(d, k, -1, (int32_t)rnd(7) - 3); break;
    case 1: bson_append_int64(d, k, -1, (int64_t)rnd(7) - 3); break;
    case 2: bson_append_double(d, k, -1, (double)rnd(13) / 4 - 1); break;
    case 3: bson_append_utf8(d, k, -1, rnd(2) ? "x" : "y", -1); break;
    case 4: bson_append_null(d, k, -1); break;
    case 5: bson_append_bool(d, k, -1, rnd(2)); break;
    case 6: bson_append_utf8(d, k, -1, "", -1); break;
    case 7:
        bson_append_document_begin(d, k, -1, &sub);
        rnd_fields(&sub, depth + 1);
        bson_append_document_end(d, &sub);
        break;
    default: {
        unsigned n = rnd(4);

        bson_append_array_begin(d, k, -1, &sub);
        for (unsigned i = 0; i < n; i++) {
            char ik[12];

            snprintf(ik, sizeof(ik), "%u", i);
            rnd_value(&sub, ik, depth + 1);
        }
        bson_append_array_end(d, &sub);
    }
    }
}

#define RND_DOCS 200

static void rnd_docs(bson_t *arr)
{
    bson_init(arr);
    for (int i = 0; i < RND_DOCS; i++) {
        char k[8];
        bson_t d;

        snprintf(k, sizeof(k), "%d", i);
        bson_append_document_begin(arr, k, -1, &d);
        bson_append_int32(&d, "_id", 3, i);
        rnd_fields(&d, 1);
        bson_append_document_end(arr, &d);
    }
}

static void run_on(const char *pipeline, const bson_t *arr, struct sink *k)
{
    struct doc_pipeline *p = compile(pipeline);
    struct src s;
    struct doc_err e = {0};

    ck_assert(bson_iter_init(&s.it, arr));
    bson_init(&k->out);
    k->n = 0;
    ck_assert_msg(doc_agg_run(p, NULL, src_next, &s, sink_take, k, &e) == 0, "%s: %s", pipeline, e.msg);
    doc_agg_free(p);
}

static void out_doc(bson_iter_t *it, bson_t *d)
{
    uint32_t len;
    const uint8_t *data;

    ck_assert(bson_iter_next(it) && BSON_ITER_HOLDS_DOCUMENT(it));
    bson_iter_document(it, &len, &data);
    ck_assert(bson_init_static(d, data, len));
    ck_assert(bson_validate(d, 0, NULL));
}

START_TEST(test_agg_random)
{
    static const char *const paths[] = {"a", "b", "a.b", "c.d", "a.a.a"};
    bson_t arr;

    rnd_state = 777u + (uint32_t)_i;
    rnd_docs(&arr);
    for (size_t pi = 0; pi < sizeof(paths) / sizeof(paths[0]); pi++) {
        const char *path = paths[pi];
        char pl[256];
        struct sink k;
        bson_iter_t it, in;
        struct doc_sort *so;
        struct doc_err e = {0};
        struct doc_buf prev = {0}, key = {0};
        bson_t *spec;
        int64_t total = 0;

        /* $sort: every document, in key order. */
        for (int dir = -1; dir <= 1; dir += 2) {
            snprintf(pl, sizeof(pl), "[{\"$sort\": {\"%s\": %d}}]", path, dir);
            run_on(pl, &arr, &k);
            ck_assert_uint_eq(k.n, RND_DOCS);
            snprintf(pl, sizeof(pl), "{\"%s\": %d}", path, dir);
            spec = J(pl);
            ck_assert_int_eq(doc_sort_compile(spec, &so, &e), 0);
            ck_assert(bson_iter_init(&it, &k.out));
            doc_buf_reset(&prev);
            for (int i = 0; i < RND_DOCS; i++) {
                bson_t d;

                out_doc(&it, &d);
                doc_buf_reset(&key);
                doc_sort_key(so, &d, &key);
                if (i) {
                    size_t m = prev.len < key.len ? prev.len : key.len;
                    int c = memcmp(prev.p, key.p, m);

                    ck_assert_msg(c < 0 || (c == 0 && prev.len <= key.len), "%s: out of order at %d",
                                  pl, i);
                }
                doc_buf_reset(&prev);
                doc_buf_add(&prev, key.p, key.len);
            }
            doc_sort_free(so);
            bson_destroy(spec);
            bson_destroy(&k.out);
        }

        /* $group: the counts add up, and no two groups have equal _ids. */
        snprintf(pl, sizeof(pl), "[{\"$group\": {\"_id\": \"$%s\", \"n\": {\"$sum\": 1}}}]", path);
        run_on(pl, &arr, &k);
        ck_assert(bson_iter_init(&it, &k.out));
        for (uint32_t g = 0; g < k.n; g++) {
            bson_t d;
            bson_iter_t f, o;

            out_doc(&it, &d);
            ck_assert(bson_iter_init_find(&f, &d, "n") && BSON_ITER_HOLDS_INT32(&f));
            total += bson_iter_int32(&f);
            ck_assert(bson_iter_init_find(&f, &d, "_id"));
            ck_assert(bson_iter_init(&o, &k.out));
            for (uint32_t h = 0; h < g; h++) {
                bson_t od;
                bson_iter_t of;

                out_doc(&o, &od);
                ck_assert(bson_iter_init_find(&of, &od, "_id"));
                ck_assert_msg(!doc_val_eq(bson_iter_value(&f), bson_iter_value(&of)), "%s: groups %u and %u",
                              pl, h, g);
            }
        }
        ck_assert_int_eq(total, RND_DOCS);
        bson_destroy(&k.out);

        /* Inclusion keeps only _id and the path's first field; exclusion of
         * a top-level field removes just it. */
        for (int incl = 0; incl <= 1; incl++) {
            size_t flen = strcspn(path, ".");

            snprintf(pl, sizeof(pl), "[{\"$project\": {\"%s\": %d}}]", path, incl);
            run_on(pl, &arr, &k);
            ck_assert_uint_eq(k.n, RND_DOCS);
            ck_assert(bson_iter_init(&it, &k.out));
            ck_assert(bson_iter_init(&in, &arr));
            for (int i = 0; i < RND_DOCS; i++) {
                bson_t d, src;
                bson_iter_t f;

                out_doc(&it, &d);
                out_doc(&in, &src);
                ck_assert(bson_iter_init(&f, &d));
                while (bson_iter_next(&f)) {
                    const char *name = bson_iter_key(&f);

                    if (incl)
                        ck_assert_msg(strcmp(name, "_id") == 0 ||
                                          (strlen(name) == flen && strncmp(name, path, flen) == 0),
                                      "%s: field %s", pl, name);
                    else
                        ck_assert(bson_has_field(&src, name));
                }
                if (!incl && !strchr(path, '.'))
                    ck_assert_uint_eq(bson_count_keys(&d),
                                      bson_count_keys(&src) - (bson_has_field(&src, path) ? 1 : 0));
            }
            bson_destroy(&k.out);
        }
        doc_buf_free(&prev);
        doc_buf_free(&key);
    }

    /* $unwind then $count against a count of the elements; $skip/$limit. */
    {
        struct sink k;
        bson_iter_t in, f;
        int want = 0;

        ck_assert(bson_iter_init(&in, &arr));
        for (int i = 0; i < RND_DOCS; i++) {
            bson_t src;

            out_doc(&in, &src);
            if (!bson_iter_init_find(&f, &src, "a") || BSON_ITER_HOLDS_NULL(&f))
                continue;
            if (BSON_ITER_HOLDS_ARRAY(&f)) {
                bson_iter_t a;

                bson_iter_recurse(&f, &a);
                while (bson_iter_next(&a))
                    want++;
            } else {
                want++;
            }
        }
        run_on("[{\"$unwind\": \"$a\"}, {\"$count\": \"n\"}]", &arr, &k);
        ck_assert_uint_eq(k.n, want ? 1 : 0);
        if (want) {
            bson_t d;

            ck_assert(bson_iter_init(&in, &k.out));
            out_doc(&in, &d);
            ck_assert(bson_iter_init_find(&f, &d, "n"));
            ck_assert_int_eq(bson_iter_int32(&f), want);
        }
        bson_destroy(&k.out);
        run_on("[{\"$skip\": 150}, {\"$limit\": 70}]", &arr, &k);
        ck_assert_uint_eq(k.n, RND_DOCS - 150);
        bson_destroy(&k.out);
    }
    bson_destroy(&arr);
}
END_TEST

Suite *suite_doc_agg(void)
{
    Suite *s = suite_create("doc_agg");
    TCase *tc = tcase_create("stages");

    tcase_add_loop_test(tc, test_agg_table, 0, sizeof(cases) / sizeof(cases[0]));
    tcase_add_loop_test(tc, test_agg_exprs, 0, sizeof(exprs) / sizeof(exprs[0]));
    tcase_add_loop_test(tc, test_agg_run_errors, 0, sizeof(run_errs) / sizeof(run_errs[0]));
    tcase_add_loop_test(tc, test_agg_compile_errors, 0, sizeof(comp_errs) / sizeof(comp_errs[0]));
    tcase_add_test(tc, test_agg_project_mixing);
    tcase_add_test(tc, test_agg_memory_limit);
    tcase_add_test(tc, test_agg_limit_stops_source);
    tcase_add_test(tc, test_agg_sink_error);
    tcase_add_test(tc, test_agg_source_error);
    tcase_add_test(tc, test_agg_leading);
    tcase_add_test(tc, test_agg_skip_leading);
    suite_add_tcase(s, tc);
    tc = tcase_create("generated");
    tcase_add_test(tc, test_agg_generated_group);
    tcase_add_test(tc, test_agg_generated_sort);
    tcase_add_test(tc, test_agg_generated_topk);
    tcase_add_loop_test(tc, test_agg_random, 0, 8);
    suite_add_tcase(s, tc);
    return s;
}
