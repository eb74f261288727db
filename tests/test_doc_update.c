/* The update operators (services/doc/doc_update.c): tables of (document,
 * update, result or error code), most of them the examples of the
 * operators' pages of the MongoDB manual ("Update Operators",
 * docs.mongodb.com/manual/reference/operator/update/), the rest the edge
 * cases those pages state in words (type promotion, conflicts, _id, paths
 * through scalars and arrays).
 *
 * Documents are written as relaxed extended JSON: 1 is an int32, 1.0 a
 * double, {"$numberLong": "1"} an int64. Results are compared byte for
 * byte, so field order and numeric types count.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc_update.h"
#include "suites.h"

#define NOW_MS 1700000000123LL

struct ucase {
    const char *doc, *upd;
    const char *want;           /* NULL: an error */
    int code;                   /* the error's code */
};

static bson_t *json(const char *s)
{
    bson_error_t err;
    bson_t *b = bson_new_from_json((const uint8_t *)s, -1, &err);

    ck_assert_msg(b != NULL, "bad JSON in the table: %s: %s", s, err.message);
    return b;
}

static char *js(const bson_t *b)
{
    return bson_as_relaxed_extended_json(b, NULL);
}

/* One row: compile and apply (inserting as given); the result must be
 * `want` byte for byte, and the return say whether it differs from doc. */
static void run_case(const struct ucase *c, bool inserting, int i)
{
    bson_t *doc = json(c->doc), *upd = json(c->upd), out;
    struct doc_update *u = NULL;
    struct doc_err e = {0};
    int rc;

    bson_init(&out);
    rc = doc_update_compile(upd, &u, &e);
    if (rc == 0) {
        rc = doc_update_apply(u, doc, inserting, NOW_MS, &out, &e);
        doc_update_free(u);
    }
    if (!c->want) {
        char *got = rc >= 0 ? js(&out) : NULL;

        ck_assert_msg(rc < 0, "row %d: %s on %s: wanted error %d, got %s", i, c->upd, c->doc,
                      c->code, got);
        ck_assert_msg(e.code == c->code, "row %d: %s on %s: wanted error %d, got %d (%s)", i,
                      c->upd, c->doc, c->code, e.code, e.msg);
        ck_assert_msg(e.msg[0] != '\0', "row %d: error without a message", i);
    } else {
        bson_t *want = json(c->want);
        bool same_as_doc = doc->len == want->len &&
                           memcmp(bson_get_data(doc), bson_get_data(want), doc->len) == 0;
        char *got;

        ck_assert_msg(rc >= 0, "row %d: %s on %s: error %d %s", i, c->upd, c->doc, e.code, e.msg);
        got = js(&out);
        ck_assert_msg(bson_equal(&out, want), "row %d: %s on %s:\n  got  %s\n  want %s", i, c->upd,
                      c->doc, got, c->want);
        ck_assert_msg(rc == !same_as_doc, "row %d: %s on %s: returned %d", i, c->upd, c->doc, rc);
        bson_free(got);
        bson_destroy(want);
    }
    bson_destroy(&out);
    bson_destroy(doc);
    bson_destroy(upd);
}

#define ROWS(t) (int)(sizeof(t) / sizeof((t)[0]))

/* ---- $set: manual, "$set" ---- */

#define SET_DOC "{\"_id\": 100, \"quantity\": 250, \"instock\": true, \"reorder\": false, " \
    "\"details\": {\"model\": \"14QQ\", \"make\": \"Clothes Corp\"}, " \
    "\"tags\": [\"apparel\", \"clothing\"], \"ratings\": [{\"by\": \"Customer007\", \"rating\": 4}]}"

static const struct ucase set_rows[] = {
    /* Set top-level fields */
    {SET_DOC, "{\"$set\": {\"quantity\": 500, \"details\": {\"model\": \"2600\", \"make\": \"Fashionaires\"}, "
              "\"tags\": [\"coats\", \"outerwear\", \"clothing\"]}}",
     "{\"_id\": 100, \"quantity\": 500, \"instock\": true, \"reorder\": false, "
     "\"details\": {\"model\": \"2600\", \"make\": \"Fashionaires\"}, "
     "\"tags\": [\"coats\", \"outerwear\", \"clothing\"], \"ratings\": [{\"by\": \"Customer007\", \"rating\": 4}]}", 0},
    /* Set fields in embedded documents */
    {SET_DOC, "{\"$set\": {\"details.make\": \"Kustom Kidz\"}}",
     "{\"_id\": 100, \"quantity\": 250, \"instock\": true, \"reorder\": false, "
     "\"details\": {\"model\": \"14QQ\", \"make\": \"Kustom Kidz\"}, "
     "\"tags\": [\"apparel\", \"clothing\"], \"ratings\": [{\"by\": \"Customer007\", \"rating\": 4}]}", 0},
    /* Set elements in arrays */
    {SET_DOC, "{\"$set\": {\"tags.1\": \"rain gear\", \"ratings.0.rating\": 2}}",
     "{\"_id\": 100, \"quantity\": 250, \"instock\": true, \"reorder\": false, "
     "\"details\": {\"model\": \"14QQ\", \"make\": \"Clothes Corp\"}, "
     "\"tags\": [\"apparel\", \"rain gear\"], \"ratings\": [{\"by\": \"Customer007\", \"rating\": 2}]}", 0},
    /* a field that is not there is added, after the others */
    {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"b\": 2}}", "{\"_id\": 1, \"a\": 1, \"b\": 2}", 0},
    /* new fields in lexicographic order, numeric names in numeric order (5.0+) */
    {"{\"_id\": 1}", "{\"$set\": {\"z\": 1, \"a\": 2}}", "{\"_id\": 1, \"a\": 2, \"z\": 1}", 0},
    {"{\"_id\": 1}", "{\"$set\": {\"x.10\": 1, \"x.9\": 2}}",
     "{\"_id\": 1, \"x\": {\"9\": 2, \"10\": 1}}", 0},
    /* a dotted path creates the sub-documents it needs */
    {"{\"_id\": 1}", "{\"$set\": {\"a.b.c\": 1}}", "{\"_id\": 1, \"a\": {\"b\": {\"c\": 1}}}", 0},
    {"{\"_id\": 1, \"a\": {\"x\": 1}}", "{\"$set\": {\"a.b.c\": 1, \"a.b.d\": 2, \"a.x\": 3}}",
     "{\"_id\": 1, \"a\": {\"x\": 3, \"b\": {\"c\": 1, \"d\": 2}}}", 0},
    /* a numeric component of a missing path names a field, not a position */
    {"{\"_id\": 1}", "{\"$set\": {\"a.0\": 1}}", "{\"_id\": 1, \"a\": {\"0\": 1}}", 0},
    /* the same value: no change */
    {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"a\": 1}}", "{\"_id\": 1, \"a\": 1}", 0},
    {"{\"_id\": 1, \"a\": {\"b\": [1, 2]}}", "{\"$set\": {\"a\": {\"b\": [1, 2]}}}",
     "{\"_id\": 1, \"a\": {\"b\": [1, 2]}}", 0},
    /* an equal value of another type is a change */
    {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"a\": 1.0}}", "{\"_id\": 1, \"a\": 1.0}", 0},
    /* "Update Operators", Behavior: "a.2" before "a.10", numeric order */
    {"{\"_id\": 1, \"a\": []}", "{\"$set\": {\"a.10\": 1, \"a.2\": 2}}",
     "{\"_id\": 1, \"a\": [null, null, 2, null, null, null, null, null, null, null, 1]}", 0},
    /* a position past the end pads with nulls */
    {"{\"_id\": 1, \"a\": [1]}", "{\"$set\": {\"a.3\": 4}}", "{\"_id\": 1, \"a\": [1, null, null, 4]}", 0},
    {"{\"_id\": 1, \"a\": [{\"b\": 1}, {\"b\": 2}]}", "{\"$set\": {\"a.1.b\": 3, \"a.2.c\": 4}}",
     "{\"_id\": 1, \"a\": [{\"b\": 1}, {\"b\": 3}, {\"c\": 4}]}", 0},
    {"{\"_id\": 1, \"a\": [{}]}", "{\"$set\": {\"a.2.b\": 1}}",
     "{\"_id\": 1, \"a\": [{}, null, {\"b\": 1}]}", 0},
    {"{\"_id\": 1, \"a\": [[1, 2], [3]]}", "{\"$set\": {\"a.1.1\": 9}}",
     "{\"_id\": 1, \"a\": [[1, 2], [3, 9]]}", 0},
    /* through a scalar, or a name in an array: PathNotViable */
    {"{\"_id\": 1, \"a\": 5}", "{\"$set\": {\"a.b\": 1}}", NULL, DOC_PathNotViable},
    {"{\"_id\": 1, \"a\": {\"b\": null}}", "{\"$set\": {\"a.b.c\": 1}}", NULL, DOC_PathNotViable},
    {"{\"_id\": 1, \"a\": [1]}", "{\"$set\": {\"a.x\": 1}}", NULL, DOC_PathNotViable},
    {"{\"_id\": 1, \"a\": [{\"b\": 1}]}", "{\"$set\": {\"a.b\": 1}}", NULL, DOC_PathNotViable},
    /* _id cannot change; setting it to itself is no change */
    {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"_id\": 2}}", NULL, DOC_ImmutableField},
    {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"_id\": 1}}", "{\"_id\": 1, \"a\": 1}", 0},
    {"{\"_id\": {\"x\": 0}}", "{\"$set\": {\"_id.x\": 1}}", NULL, DOC_ImmutableField},
    {"{\"_id\": 1, \"a\": 1}", "{\"$set\": {\"_id\": 1.0}}", NULL, DOC_ImmutableField},
};

/* ---- $setOnInsert: manual, "$setOnInsert" ---- */

static const struct ucase soi_rows[] = {
    /* not inserting: nothing, not even a path through a scalar */
    {"{\"_id\": 1, \"a\": 5}", "{\"$setOnInsert\": {\"a.b\": 1, \"c\": 1}}", "{\"_id\": 1, \"a\": 5}", 0},
    {"{\"_id\": 1, \"item\": \"apple\"}",
     "{\"$set\": {\"item\": \"apple\"}, \"$setOnInsert\": {\"defaultQty\": 100}}",
     "{\"_id\": 1, \"item\": \"apple\"}", 0},
};

static const struct ucase soi_insert_rows[] = {
    {"{\"_id\": 1, \"item\": \"apple\"}",
     "{\"$set\": {\"item\": \"apple\"}, \"$setOnInsert\": {\"defaultQty\": 100}}",
     "{\"_id\": 1, \"item\": \"apple\", \"defaultQty\": 100}", 0},
    {"{\"_id\": 1}", "{\"$setOnInsert\": {\"a.b\": 1, \"c\": 2}}",
     "{\"_id\": 1, \"a\": {\"b\": 1}, \"c\": 2}", 0},
};

/* ---- $unset: manual, "$unset" ---- */

static const struct ucase unset_rows[] = {
    {"{\"item\": \"chisel\", \"sku\": \"C001\", \"quantity\": 4, \"instock\": true}",
     "{\"$unset\": {\"quantity\": \"\", \"instock\": \"\"}}", "{\"item\": \"chisel\", \"sku\": \"C001\"}", 0},
    /* a field that is not there: no change */
    {"{\"_id\": 1, \"a\": 1}", "{\"$unset\": {\"b\": 1}}", "{\"_id\": 1, \"a\": 1}", 0},
    {"{\"_id\": 1, \"a\": 5}", "{\"$unset\": {\"a.b\": 1}}", "{\"_id\": 1, \"a\": 5}", 0},
    {"{\"_id\": 1, \"a\": [1]}", "{\"$unset\": {\"a.x\": 1, \"a.5\": 1}}", "{\"_id\": 1, \"a\": [1]}", 0},
    {"{\"_id\": 1, \"a\": {\"b\": 1, \"c\": 2}}", "{\"$unset\": {\"a.b\": 1}}",
     "{\"_id\": 1, \"a\": {\"c\": 2}}", 0},
    /* an array element becomes null: the array keeps its length */
    {"{\"_id\": 1, \"a\": [1, 2, 3]}", "{\"$unset\": {\"a.1\": \"\"}}", "{\"_id\": 1, \"a\": [1, null, 3]}", 0},
    {"{\"_id\": 1}", "{\"$unset\": {\"_id\": 1}}", NULL, DOC_ImmutableField},
};

/* ---- $inc: manual, "$inc" ---- */

static const struct ucase inc_rows[] = {
    {"{\"_id\": 1, \"sku\": \"abc123\", \"quantity\": 10, \"metrics\": {\"orders\": 2, \"ratings\": 3.5}}",
     "{\"$inc\": {\"quantity\": -2, \"metrics.orders\": 1}}",
     "{\"_id\": 1, \"sku\": \"abc123\", \"quantity\": 8, \"metrics\": {\"orders\": 3, \"ratings\": 3.5}}", 0},
    /* a field that is not there gets the increment */
    {"{\"_id\": 1}", "{\"$inc\": {\"a\": 5, \"b.c\": {\"$numberLong\": \"7\"}}}",
     "{\"_id\": 1, \"a\": 5, \"b\": {\"c\": {\"$numberLong\": \"7\"}}}", 0},
    /* int32 overflows into int64 */
    {"{\"_id\": 1, \"a\": 2147483647}", "{\"$inc\": {\"a\": 1}}",
     "{\"_id\": 1, \"a\": {\"$numberLong\": \"2147483648\"}}", 0},
    {"{\"_id\": 1, \"a\": -2147483648}", "{\"$inc\": {\"a\": -1}}",
     "{\"_id\": 1, \"a\": {\"$numberLong\": \"-2147483649\"}}", 0},
    /* int64 stays int64, even when small */
    {"{\"_id\": 1, \"a\": 1}", "{\"$inc\": {\"a\": {\"$numberLong\": \"1\"}}}",
     "{\"_id\": 1, \"a\": {\"$numberLong\": \"2\"}}", 0},
    {"{\"_id\": 1, \"a\": {\"$numberLong\": \"5\"}}", "{\"$inc\": {\"a\": 1}}",
     "{\"_id\": 1, \"a\": {\"$numberLong\": \"6\"}}", 0},
    /* int64 overflow is an error */
    {"{\"_id\": 1, \"a\": {\"$numberLong\": \"9223372036854775807\"}}", "{\"$inc\": {\"a\": 1}}", NULL,
     DOC_BadValue},
    /* a double makes a double */
    {"{\"_id\": 1, \"a\": 1}", "{\"$inc\": {\"a\": 0.5}}", "{\"_id\": 1, \"a\": 1.5}", 0},
    {"{\"_id\": 1, \"a\": 1.5}", "{\"$inc\": {\"a\": 1}}", "{\"_id\": 1, \"a\": 2.5}", 0},
    /* by zero: the same bytes, no change */
    {"{\"_id\": 1, \"a\": 3}", "{\"$inc\": {\"a\": 0}}", "{\"_id\": 1, \"a\": 3}", 0},
    {"{\"_id\": 1, \"a\": \"x\"}", "{\"$inc\": {\"a\": 1}}", NULL, DOC_TypeMismatch},
    {"{\"_id\": 1, \"a\": 1}", "{\"$inc\": {\"a\": \"x\"}}", NULL, DOC_TypeMismatch},
    {"{\"_id\": 1, \"a\": [1, 2]}", "{\"$inc\": {\"a.1\": 5}}", "{\"_id\": 1, \"a\": [1, 7]}", 0},
};

/* ---- $mul: manual, "$mul" ---- */

static const struct ucase mul_rows[] = {
    {"{\"_id\": 1, \"item\": \"Hats\", \"price\": 10.5, \"quantity\": 25}",
     "{\"$mul\": {\"price\": 1.25, \"quantity\": 2}}",
     "{\"_id\": 1, \"item\": \"Hats\", \"price\": 13.125, \"quantity\": 50}", 0},
    /* a field that is not there: zero of the multiplier's type */
    {"{\"_id\": 2, \"item\": \"Unknown\"}", "{\"$mul\": {\"price\": {\"$numberLong\": \"100\"}}}",
     "{\"_id\": 2, \"item\": \"Unknown\", \"price\": {\"$numberLong\": \"0\"}}", 0},
    {"{\"_id\": 2}", "{\"$mul\": {\"a\": 2.5, \"b\": 3}}", "{\"_id\": 2, \"a\": 0.0, \"b\": 0}", 0},
    /* mixed types: int64 times int32 is an int64 */
    {"{\"_id\": 3, \"item\": \"Scarf\", \"price\": {\"$numberLong\": \"10\"}}", "{\"$mul\": {\"price\": 5}}",
     "{\"_id\": 3, \"item\": \"Scarf\", \"price\": {\"$numberLong\": \"50\"}}", 0},
    {"{\"_id\": 1, \"a\": 65536}", "{\"$mul\": {\"a\": 65536}}",
     "{\"_id\": 1, \"a\": {\"$numberLong\": \"4294967296\"}}", 0},
    {"{\"_id\": 1, \"a\": {\"$numberLong\": \"4611686018427387904\"}}", "{\"$mul\": {\"a\": 2}}", NULL,
     DOC_BadValue},
    {"{\"_id\": 1, \"a\": 3}", "{\"$mul\": {\"a\": 0.5}}", "{\"_id\": 1, \"a\": 1.5}", 0},
    {"{\"_id\": 1, \"a\": null}", "{\"$mul\": {\"a\": 2}}", NULL, DOC_TypeMismatch},
    {"{\"_id\": 1}", "{\"$mul\": {\"a\": true}}", NULL, DOC_TypeMismatch},
};

/* ---- $min and $max: manual, "$min", "$max" ---- */

static const struct ucase minmax_rows[] = {
    {"{\"_id\": 1, \"highScore\": 800, \"lowScore\": 200}", "{\"$min\": {\"lowScore\": 150}}",
     "{\"_id\": 1, \"highScore\": 800, \"lowScore\": 150}", 0},
    {"{\"_id\": 1, \"highScore\": 800, \"lowScore\": 150}", "{\"$min\": {\"lowScore\": 250}}",
     "{\"_id\": 1, \"highScore\": 800, \"lowScore\": 150}", 0},
    {"{\"_id\": 1, \"highScore\": 800, \"lowScore\": 200}", "{\"$max\": {\"highScore\": 950}}",
     "{\"_id\": 1, \"highScore\": 950, \"lowScore\": 200}", 0},
    {"{\"_id\": 1, \"highScore\": 950, \"lowScore\": 200}", "{\"$max\": {\"highScore\": 870}}",
     "{\"_id\": 1, \"highScore\": 950, \"lowScore\": 200}", 0},
    /* an equal value is left as it is, even of another type */
    {"{\"_id\": 1, \"a\": 5}", "{\"$min\": {\"a\": 5.0}}", "{\"_id\": 1, \"a\": 5}", 0},
    /* across types, by BSON order: numbers before strings */
    {"{\"_id\": 1, \"a\": 5}", "{\"$min\": {\"a\": \"x\"}}", "{\"_id\": 1, \"a\": 5}", 0},
    {"{\"_id\": 1, \"a\": 5}", "{\"$max\": {\"a\": \"x\"}}", "{\"_id\": 1, \"a\": \"x\"}", 0},
    {"{\"_id\": 1}", "{\"$min\": {\"a.b\": 3}}", "{\"_id\": 1, \"a\": {\"b\": 3}}", 0},
    {"{\"_id\": 1, \"d\": {\"$date\": {\"$numberLong\": \"1000\"}}}",
     "{\"$max\": {\"d\": {\"$date\": {\"$numberLong\": \"2000\"}}}}",
     "{\"_id\": 1, \"d\": {\"$date\": {\"$numberLong\": \"2000\"}}}", 0},
};

/* ---- $currentDate: manual, "$currentDate" ---- */

static const struct ucase date_rows[] = {
    {"{\"_id\": 1, \"status\": \"a\", \"lastModified\": {\"$date\": {\"$numberLong\": \"0\"}}}",
     "{\"$currentDate\": {\"lastModified\": true, \"cancellation.date\": {\"$type\": \"timestamp\"}}, "
     "\"$set\": {\"cancellation.reason\": \"user request\", \"status\": \"D\"}}",
     "{\"_id\": 1, \"status\": \"D\", \"lastModified\": {\"$date\": {\"$numberLong\": \"1700000000123\"}}, "
     "\"cancellation\": {\"date\": {\"$timestamp\": {\"t\": 1700000000, \"i\": 124}}, "
     "\"reason\": \"user request\"}}", 0},
    {"{\"_id\": 1}", "{\"$currentDate\": {\"e\": false}}",
     "{\"_id\": 1, \"e\": {\"$date\": {\"$numberLong\": \"1700000000123\"}}}", 0},
    {"{\"_id\": 1}", "{\"$currentDate\": {\"d\": 1}}", NULL, DOC_BadValue},
};

/* ---- $rename: manual, "$rename" ---- */

static const struct ucase rename_rows[] = {
    /* Rename a field: the new name comes at the end */
    {"{\"_id\": 1, \"alias\": [\"The American Cincinnatus\", \"The American Fabius\"], "
     "\"mobile\": \"555-555-5555\", \"nmae\": {\"first\": \"george\", \"last\": \"washington\"}, \"x\": 1}",
     "{\"$rename\": {\"nmae\": \"name\"}}",
     "{\"_id\": 1, \"alias\": [\"The American Cincinnatus\", \"The American Fabius\"], "
     "\"mobile\": \"555-555-5555\", \"x\": 1, \"name\": {\"first\": \"george\", \"last\": \"washington\"}}", 0},
    /* Rename a field in an embedded document */
    {"{\"_id\": 1, \"name\": {\"first\": \"george\", \"last\": \"washington\"}}",
     "{\"$rename\": {\"name.first\": \"name.fname\"}}",
     "{\"_id\": 1, \"name\": {\"last\": \"washington\", \"fname\": \"george\"}}", 0},
    /* Rename a field that does not exist: nothing happens, not even to the target */
    {"{\"_id\": 1, \"spouse\": 1}", "{\"$rename\": {\"wife\": \"spouse\"}}", "{\"_id\": 1, \"spouse\": 1}", 0},
    /* onto a field that is there: it goes, the new one comes at the end */
    {"{\"_id\": 1, \"a\": 1, \"b\": 2, \"c\": 3}", "{\"$rename\": {\"a\": \"b\"}}",
     "{\"_id\": 1, \"c\": 3, \"b\": 1}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{\"$rename\": {\"a\": \"b.c\"}}", "{\"_id\": 1, \"b\": {\"c\": 1}}", 0},
    {"{\"_id\": 1, \"a\": {\"b\": 1}}", "{\"$rename\": {\"a.b\": \"c\", \"a.x\": \"d\"}}",
     "{\"_id\": 1, \"a\": {}, \"c\": 1}", 0},
    /* arrays: neither side may be in one */
    {"{\"_id\": 1, \"a\": [{\"b\": 1}]}", "{\"$rename\": {\"a.0.b\": \"c\"}}", NULL, DOC_BadValue},
    {"{\"_id\": 1, \"a\": [1], \"x\": 1}", "{\"$rename\": {\"x\": \"a.0\"}}", NULL, DOC_BadValue},
    {"{\"_id\": 1, \"a\": 5, \"x\": 1}", "{\"$rename\": {\"x\": \"a.b\"}}", NULL, DOC_PathNotViable},
    {"{\"_id\": 1, \"a\": 5}", "{\"$rename\": {\"x\": \"a.b\"}}", "{\"_id\": 1, \"a\": 5}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{\"$rename\": {\"a\": \"a\"}}", NULL, DOC_BadValue},
    {"{\"_id\": 1, \"a\": 1}", "{\"$rename\": {\"a\": \"a.b\"}}", NULL, DOC_BadValue},
    {"{\"_id\": 1, \"a\": 1}", "{\"$rename\": {\"a.b\": \"a\"}}", NULL, DOC_BadValue},
    {"{\"_id\": 1, \"a\": 1}", "{\"$rename\": {\"a\": 1}}", NULL, DOC_BadValue},
    {"{\"_id\": 1, \"a\": 1}", "{\"$rename\": {\"_id\": \"b\"}}", NULL, DOC_ImmutableField},
};

/* ---- $push and its modifiers: manual, "$push", "$each", "$position",
 * "$slice", "$sort" ---- */

static const struct ucase push_rows[] = {
    {"{\"_id\": 1, \"scores\": [44, 78, 38, 80]}", "{\"$push\": {\"scores\": 89}}",
     "{\"_id\": 1, \"scores\": [44, 78, 38, 80, 89]}", 0},
    {"{\"_id\": 1, \"scores\": [44, 78, 38, 80, 89]}", "{\"$push\": {\"scores\": {\"$each\": [90, 92, 85]}}}",
     "{\"_id\": 1, \"scores\": [44, 78, 38, 80, 89, 90, 92, 85]}", 0},
    /* Use $push Operator with Multiple Modifiers */
    {"{\"_id\": 5, \"quizzes\": [{\"wk\": 1, \"score\": 10}, {\"wk\": 2, \"score\": 8}, "
     "{\"wk\": 3, \"score\": 5}, {\"wk\": 4, \"score\": 6}]}",
     "{\"$push\": {\"quizzes\": {\"$each\": [{\"wk\": 5, \"score\": 8}, {\"wk\": 6, \"score\": 7}, "
     "{\"wk\": 7, \"score\": 6}], \"$sort\": {\"score\": -1}, \"$slice\": 3}}}",
     "{\"_id\": 5, \"quizzes\": [{\"wk\": 1, \"score\": 10}, {\"wk\": 2, \"score\": 8}, "
     "{\"wk\": 5, \"score\": 8}]}", 0},
    /* $position */
    {"{\"_id\": 1, \"scores\": [100]}", "{\"$push\": {\"scores\": {\"$each\": [50, 60, 70], \"$position\": 0}}}",
     "{\"_id\": 1, \"scores\": [50, 60, 70, 100]}", 0},
    {"{\"_id\": 1, \"scores\": [50, 60, 70, 100]}",
     "{\"$push\": {\"scores\": {\"$each\": [20, 30], \"$position\": 2}}}",
     "{\"_id\": 1, \"scores\": [50, 60, 20, 30, 70, 100]}", 0},
    {"{\"_id\": 1, \"scores\": [50, 60, 20, 30, 70, 100]}",
     "{\"$push\": {\"scores\": {\"$each\": [90, 80], \"$position\": -2}}}",
     "{\"_id\": 1, \"scores\": [50, 60, 20, 30, 90, 80, 70, 100]}", 0},
    {"{\"_id\": 1, \"s\": [1, 2]}", "{\"$push\": {\"s\": {\"$each\": [3], \"$position\": 10}}}",
     "{\"_id\": 1, \"s\": [1, 2, 3]}", 0},
    {"{\"_id\": 1, \"s\": [1, 2]}", "{\"$push\": {\"s\": {\"$each\": [3], \"$position\": -10}}}",
     "{\"_id\": 1, \"s\": [3, 1, 2]}", 0},
    /* the most negative position and slice: everything, from the start */
    {"{\"_id\": 1, \"s\": [1, 2]}",
     "{\"$push\": {\"s\": {\"$each\": [3], \"$position\": {\"$numberLong\": \"-9223372036854775808\"}}}}",
     "{\"_id\": 1, \"s\": [3, 1, 2]}", 0},
    {"{\"_id\": 1, \"s\": [1, 2]}",
     "{\"$push\": {\"s\": {\"$each\": [3], \"$slice\": {\"$numberLong\": \"-9223372036854775808\"}}}}",
     "{\"_id\": 1, \"s\": [1, 2, 3]}", 0},
    /* $slice */
    {"{\"_id\": 1, \"scores\": [40, 50, 60]}", "{\"$push\": {\"scores\": {\"$each\": [80, 78, 86], \"$slice\": -5}}}",
     "{\"_id\": 1, \"scores\": [50, 60, 80, 78, 86]}", 0},
    {"{\"_id\": 2, \"scores\": [89, 90]}", "{\"$push\": {\"scores\": {\"$each\": [100, 20], \"$slice\": 3}}}",
     "{\"_id\": 2, \"scores\": [89, 90, 100]}", 0},
    {"{\"_id\": 3, \"scores\": [89, 70, 100, 20]}", "{\"$push\": {\"scores\": {\"$each\": [], \"$slice\": -3}}}",
     "{\"_id\": 3, \"scores\": [70, 100, 20]}", 0},
    {"{\"_id\": 3, \"scores\": [89, 70]}", "{\"$push\": {\"scores\": {\"$each\": [1], \"$slice\": 0}}}",
     "{\"_id\": 3, \"scores\": []}", 0},
    /* $sort: whole elements, and fields of documents (a stable sort) */
    {"{\"_id\": 2, \"tests\": [89, 70, 89, 50]}", "{\"$push\": {\"tests\": {\"$each\": [40, 60], \"$sort\": 1}}}",
     "{\"_id\": 2, \"tests\": [40, 50, 60, 70, 89, 89]}", 0},
    {"{\"_id\": 3, \"tests\": [89, 70, 100, 20]}", "{\"$push\": {\"tests\": {\"$each\": [], \"$sort\": -1}}}",
     "{\"_id\": 3, \"tests\": [100, 89, 70, 20]}", 0},
    {"{\"_id\": 1, \"quizzes\": [{\"id\": 1, \"score\": 6}, {\"id\": 2, \"score\": 9}]}",
     "{\"$push\": {\"quizzes\": {\"$each\": [{\"id\": 3, \"score\": 8}, {\"id\": 4, \"score\": 7}, "
     "{\"id\": 5, \"score\": 6}], \"$sort\": {\"score\": 1}}}}",
     "{\"_id\": 1, \"quizzes\": [{\"id\": 1, \"score\": 6}, {\"id\": 5, \"score\": 6}, "
     "{\"id\": 4, \"score\": 7}, {\"id\": 3, \"score\": 8}, {\"id\": 2, \"score\": 9}]}", 0},
    {"{\"_id\": 1, \"q\": [{\"a\": {\"b\": 2}}, 5, {\"a\": {\"b\": 1}}]}",
     "{\"$push\": {\"q\": {\"$each\": [], \"$sort\": {\"a.b\": 1}}}}",
     "{\"_id\": 1, \"q\": [5, {\"a\": {\"b\": 1}}, {\"a\": {\"b\": 2}}]}", 0},
    /* a field that is not there becomes an array; an array is pushed whole */
    {"{\"_id\": 1}", "{\"$push\": {\"a.b\": 1}}", "{\"_id\": 1, \"a\": {\"b\": [1]}}", 0},
    {"{\"_id\": 1, \"a\": [[0]]}", "{\"$push\": {\"a.0\": 1, \"a.2\": 2}}",
     "{\"_id\": 1, \"a\": [[0, 1], null, [2]]}", 0},
    {"{\"_id\": 1, \"a\": []}", "{\"$push\": {\"a\": [1, 2]}}", "{\"_id\": 1, \"a\": [[1, 2]]}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{\"$push\": {\"a\": 2}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": 1}}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": [1], \"$slice\": \"x\"}}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": [1], \"$slice\": 1.5}}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": [1], \"$sort\": 2}}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": [1], \"$sort\": {}}}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": [1], \"$position\": \"x\"}}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$push\": {\"a\": {\"$each\": [1], \"$foo\": 1}}}", NULL, DOC_BadValue},
};

/* ---- $addToSet: manual, "$addToSet" ---- */

static const struct ucase ats_rows[] = {
    {"{\"_id\": 1, \"letters\": [\"a\", \"b\"]}", "{\"$addToSet\": {\"letters\": [\"c\", \"d\"]}}",
     "{\"_id\": 1, \"letters\": [\"a\", \"b\", [\"c\", \"d\"]]}", 0},
    {"{\"_id\": 1, \"item\": \"polarizing_filter\", \"tags\": [\"electronics\", \"camera\"]}",
     "{\"$addToSet\": {\"tags\": \"accessories\"}}",
     "{\"_id\": 1, \"item\": \"polarizing_filter\", \"tags\": [\"electronics\", \"camera\", \"accessories\"]}", 0},
    {"{\"_id\": 1, \"item\": \"polarizing_filter\", \"tags\": [\"electronics\", \"camera\", \"accessories\"]}",
     "{\"$addToSet\": {\"tags\": \"camera\"}}",
     "{\"_id\": 1, \"item\": \"polarizing_filter\", \"tags\": [\"electronics\", \"camera\", \"accessories\"]}", 0},
    {"{\"_id\": 2, \"item\": \"cable\", \"tags\": [\"electronics\", \"supplies\"]}",
     "{\"$addToSet\": {\"tags\": {\"$each\": [\"camera\", \"electronics\", \"accessories\"]}}}",
     "{\"_id\": 2, \"item\": \"cable\", \"tags\": [\"electronics\", \"supplies\", \"camera\", \"accessories\"]}", 0},
    /* equal by value across numeric types; duplicates within $each added once */
    {"{\"_id\": 1, \"a\": [1]}", "{\"$addToSet\": {\"a\": {\"$each\": [1.0, 2, 2]}}}",
     "{\"_id\": 1, \"a\": [1, 2]}", 0},
    /* documents are equal only with their fields in the same order */
    {"{\"_id\": 1, \"a\": [{\"x\": 1, \"y\": 2}]}", "{\"$addToSet\": {\"a\": {\"y\": 2, \"x\": 1}}}",
     "{\"_id\": 1, \"a\": [{\"x\": 1, \"y\": 2}, {\"y\": 2, \"x\": 1}]}", 0},
    {"{\"_id\": 1}", "{\"$addToSet\": {\"a\": {\"$each\": [3, 3]}}}", "{\"_id\": 1, \"a\": [3]}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{\"$addToSet\": {\"a\": 2}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$addToSet\": {\"a\": {\"$each\": [1], \"x\": 1}}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$addToSet\": {\"a\": {\"$each\": 1}}}", NULL, DOC_BadValue},
};

/* ---- $pop: manual, "$pop" ---- */

static const struct ucase pop_rows[] = {
    {"{\"_id\": 1, \"scores\": [8, 9, 10]}", "{\"$pop\": {\"scores\": -1}}", "{\"_id\": 1, \"scores\": [9, 10]}", 0},
    {"{\"_id\": 10, \"scores\": [9, 10]}", "{\"$pop\": {\"scores\": 1}}", "{\"_id\": 10, \"scores\": [9]}", 0},
    {"{\"_id\": 1, \"scores\": []}", "{\"$pop\": {\"scores\": 1}}", "{\"_id\": 1, \"scores\": []}", 0},
    {"{\"_id\": 1}", "{\"$pop\": {\"scores\": 1}}", "{\"_id\": 1}", 0},
    {"{\"_id\": 1, \"scores\": 1}", "{\"$pop\": {\"scores\": 1}}", NULL, DOC_TypeMismatch},
    {"{\"_id\": 1, \"scores\": [1]}", "{\"$pop\": {\"scores\": 2}}", NULL, DOC_FailedToParse},
    {"{\"_id\": 1, \"scores\": [1]}", "{\"$pop\": {\"scores\": \"x\"}}", NULL, DOC_FailedToParse},
};

/* ---- $pull by value and $pullAll: manual, "$pull", "$pullAll" ---- */

static const struct ucase pull_rows[] = {
    {"{\"_id\": 1, \"fruits\": [\"apples\", \"pears\", \"oranges\", \"grapes\", \"bananas\"], "
     "\"vegetables\": [\"carrots\", \"celery\", \"squash\", \"carrots\"]}",
     "{\"$pull\": {\"fruits\": \"apples\", \"vegetables\": \"carrots\"}}",
     "{\"_id\": 1, \"fruits\": [\"pears\", \"oranges\", \"grapes\", \"bananas\"], "
     "\"vegetables\": [\"celery\", \"squash\"]}", 0},
    {"{\"_id\": 1, \"a\": [1, 1.0, [1], 2]}", "{\"$pull\": {\"a\": 1}}", "{\"_id\": 1, \"a\": [[1], 2]}", 0},
    {"{\"_id\": 1, \"a\": [[1, 2], [2, 1]]}", "{\"$pull\": {\"a\": [1, 2]}}", "{\"_id\": 1, \"a\": [[2, 1]]}", 0},
    {"{\"_id\": 1, \"a\": [2]}", "{\"$pull\": {\"a\": 1}}", "{\"_id\": 1, \"a\": [2]}", 0},
    {"{\"_id\": 1}", "{\"$pull\": {\"a\": 1}}", "{\"_id\": 1}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{\"$pull\": {\"a\": 1}}", NULL, DOC_BadValue},
    {"{\"_id\": 1, \"scores\": [0, 2, 5, 5, 1, 0]}", "{\"$pullAll\": {\"scores\": [0, 5]}}",
     "{\"_id\": 1, \"scores\": [2, 1]}", 0},
    {"{\"_id\": 1}", "{\"$pullAll\": {\"scores\": 1}}", NULL, DOC_BadValue},
};

/* ---- $pull with conditions: manual, "$pull" ---- */

static const struct ucase pull_cond_rows[] = {
    /* Remove All Items That Match a Specified $pull Condition */
    {"{\"_id\": 1, \"votes\": [3, 5, 6, 7, 7, 8]}", "{\"$pull\": {\"votes\": {\"$gte\": 6}}}",
     "{\"_id\": 1, \"votes\": [3, 5]}", 0},
    /* Remove Items from an Array of Documents: a query on each element */
    {"{\"_id\": 1, \"results\": [{\"item\": \"A\", \"score\": 5}, {\"item\": \"B\", \"score\": 8}]}",
     "{\"$pull\": {\"results\": {\"score\": 8, \"item\": \"B\"}}}",
     "{\"_id\": 1, \"results\": [{\"item\": \"A\", \"score\": 5}]}", 0},
    {"{\"_id\": 2, \"results\": [{\"item\": \"C\", \"score\": 8}, {\"item\": \"B\", \"score\": 4}]}",
     "{\"$pull\": {\"results\": {\"score\": 8, \"item\": \"B\"}}}",
     "{\"_id\": 2, \"results\": [{\"item\": \"C\", \"score\": 8}, {\"item\": \"B\", \"score\": 4}]}", 0},
    /* an element with more fields than the condition names still matches */
    {"{\"_id\": 1, \"r\": [{\"item\": \"B\", \"comment\": \"x\"}, {\"item\": \"C\"}]}",
     "{\"$pull\": {\"r\": {\"item\": \"B\"}}}", "{\"_id\": 1, \"r\": [{\"item\": \"C\"}]}", 0},
    /* Remove Documents from Nested Arrays: $elemMatch */
    {"{\"_id\": 1, \"results\": [{\"item\": \"A\", \"score\": 5, \"answers\": [{\"q\": 1, \"a\": 4}, "
     "{\"q\": 2, \"a\": 6}]}, {\"item\": \"B\", \"score\": 8, \"answers\": [{\"q\": 1, \"a\": 8}, "
     "{\"q\": 2, \"a\": 9}]}]}",
     "{\"$pull\": {\"results\": {\"answers\": {\"$elemMatch\": {\"q\": 2, \"a\": {\"$gte\": 8}}}}}}",
     "{\"_id\": 1, \"results\": [{\"item\": \"A\", \"score\": 5, \"answers\": [{\"q\": 1, \"a\": 4}, "
     "{\"q\": 2, \"a\": 6}]}]}", 0},
    /* Remove All Items That Equal a Specified Value, with $in */
    {"{\"_id\": 1, \"fruits\": [\"apples\", \"pears\", \"oranges\", \"grapes\", \"bananas\"], "
     "\"vegetables\": [\"carrots\", \"celery\", \"squash\", \"carrots\"]}",
     "{\"$pull\": {\"fruits\": {\"$in\": [\"apples\", \"oranges\"]}, \"vegetables\": \"carrots\"}}",
     "{\"_id\": 1, \"fruits\": [\"pears\", \"grapes\", \"bananas\"], \"vegetables\": [\"celery\", \"squash\"]}",
     0},
    /* a query on documents leaves the other elements alone */
    {"{\"_id\": 1, \"a\": [1, {\"b\": 1}, {\"b\": 2}]}", "{\"$pull\": {\"a\": {\"b\": 1}}}",
     "{\"_id\": 1, \"a\": [1, {\"b\": 2}]}", 0},
    {"{\"_id\": 1, \"a\": [{\"x\": 1}, {\"x\": 2}, {\"x\": 3}]}",
     "{\"$pull\": {\"a\": {\"$or\": [{\"x\": 1}, {\"x\": 3}]}}}", "{\"_id\": 1, \"a\": [{\"x\": 2}]}", 0},
    {"{\"_id\": 1, \"a\": [\"x\", \"yy\", 3]}", "{\"$pull\": {\"a\": {\"$type\": \"string\"}}}",
     "{\"_id\": 1, \"a\": [3]}", 0},
    {"{\"_id\": 1, \"a\": [5]}", "{\"$pull\": {\"a\": {\"$gt\": 6}}}", "{\"_id\": 1, \"a\": [5]}", 0},
    {"{\"_id\": 1, \"a\": [5]}", "{\"$pull\": {\"a\": {\"$foo\": 6}}}", NULL, DOC_BadValue},
};

/* ---- replacement documents ---- */

static const struct ucase repl_rows[] = {
    /* _id is kept, first; the other fields are the replacement's */
    {"{\"_id\": 1, \"a\": 1, \"b\": 2}", "{\"c\": 3}", "{\"_id\": 1, \"c\": 3}", 0},
    {"{\"a\": 1, \"_id\": 1}", "{\"c\": 3, \"_id\": 1}", "{\"_id\": 1, \"c\": 3}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{\"a\": 1}", "{\"_id\": 1, \"a\": 1}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{}", "{\"_id\": 1}", 0},
    {"{\"a\": 1}", "{\"b\": 2}", "{\"b\": 2}", 0},
    {"{\"_id\": 1, \"a\": 1}", "{\"_id\": 2, \"a\": 1}", NULL, DOC_ImmutableField},
    {"{\"_id\": 1, \"a\": 1}", "{\"a\": 1, \"$set\": {\"b\": 1}}", NULL, DOC_DollarPrefixedFieldName},
};

/* ---- errors of the update alone ---- */

static const struct ucase compile_rows[] = {
    /* two operators on one path, or on a path and its prefix */
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1, \"a.b\": 2}}", NULL, DOC_ConflictingUpdateOperators},
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1, \"a\": 2}}", NULL, DOC_ConflictingUpdateOperators},
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1}, \"$inc\": {\"a\": 1}}", NULL, DOC_ConflictingUpdateOperators},
    {"{\"_id\": 1}", "{\"$set\": {\"a.b.c\": 1}, \"$unset\": {\"a.b\": 1}}", NULL,
     DOC_ConflictingUpdateOperators},
    {"{\"_id\": 1}", "{\"$set\": {\"a.b\": 1}, \"$rename\": {\"x\": \"a\"}}", NULL,
     DOC_ConflictingUpdateOperators},
    {"{\"_id\": 1}", "{\"$set\": {\"x\": 1}, \"$rename\": {\"x\": \"y\"}}", NULL,
     DOC_ConflictingUpdateOperators},
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1}, \"$setOnInsert\": {\"a\": 2}}", NULL,
     DOC_ConflictingUpdateOperators},
    {"{\"_id\": 1}", "{\"$set\": {\"a.b\": 1, \"a.10\": 1, \"a.9.x\": 1}, \"$push\": {\"a.9\": 1}}", NULL,
     DOC_ConflictingUpdateOperators},
    /* neighbours that are not prefixes do not conflict */
    {"{\"_id\": 1}", "{\"$set\": {\"ab\": 1, \"a\": 2, \"a-b\": 3}, \"$inc\": {\"a0\": 1}}",
     "{\"_id\": 1, \"a\": 2, \"a-b\": 3, \"a0\": 1, \"ab\": 1}", 0},
    {"{\"_id\": 1}", "{\"$set\": {\"a.b\": 1}, \"$inc\": {\"a.c\": 1}}",
     "{\"_id\": 1, \"a\": {\"b\": 1, \"c\": 1}}", 0},
    /* unknown and empty operators, an operator that is not a document */
    {"{\"_id\": 1}", "{\"$foo\": {\"a\": 1}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$set\": {}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$set\": 1}", NULL, DOC_FailedToParse},
    {"{\"_id\": 1}", "{\"$set\": {\"a\": 1}, \"b\": 2}", NULL, DOC_FailedToParse},
    /* paths */
    {"{\"_id\": 1}", "{\"$set\": {\"\": 1}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$set\": {\"a..b\": 1}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$set\": {\"a.\": 1}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$set\": {\"a.$x\": 1}}", NULL, DOC_DollarPrefixedFieldName},
    {"{\"_id\": 1}", "{\"$set\": {\"a.$\": 1}}", NULL, DOC_BadValue},
    {"{\"_id\": 1}", "{\"$set\": {\"a.$[]\": 1}}", NULL, DOC_NotImplemented},
};

static void run_rows(const struct ucase *rows, int n, bool inserting)
{
    for (int i = 0; i < n; i++)
        run_case(&rows[i], inserting, i);
}

START_TEST(op_set) { run_rows(set_rows, ROWS(set_rows), false); }
END_TEST
START_TEST(op_setoninsert)
{
    run_rows(soi_rows, ROWS(soi_rows), false);
    run_rows(soi_insert_rows, ROWS(soi_insert_rows), true);
}
END_TEST
START_TEST(op_unset) { run_rows(unset_rows, ROWS(unset_rows), false); }
END_TEST
START_TEST(op_inc) { run_rows(inc_rows, ROWS(inc_rows), false); }
END_TEST
START_TEST(op_mul) { run_rows(mul_rows, ROWS(mul_rows), false); }
END_TEST
START_TEST(op_minmax) { run_rows(minmax_rows, ROWS(minmax_rows), false); }
END_TEST
/* {$type: "date"} is legacy extended JSON for binary to libbson's
 * parser: these updates are built by hand. */
static void currentdate_type(const char *type, const char *extra, int code)
{
    bson_t upd, op, spec, out;
    bson_t *doc = json("{\"_id\": 1}");
    struct doc_update *u = NULL;
    struct doc_err e = {0};
    bson_iter_t it;

    bson_init(&upd);
    bson_append_document_begin(&upd, "$currentDate", -1, &op);
    bson_append_document_begin(&op, "d", -1, &spec);
    bson_append_utf8(&spec, "$type", -1, type, -1);
    if (extra)
        bson_append_int32(&spec, extra, -1, 1);
    bson_append_document_end(&op, &spec);
    bson_append_document_end(&upd, &op);
    if (code) {
        ck_assert_int_eq(doc_update_compile(&upd, &u, &e), -1);
        ck_assert_int_eq(e.code, code);
    } else {
        ck_assert_int_eq(doc_update_compile(&upd, &u, &e), 0);
        bson_init(&out);
        ck_assert_int_eq(doc_update_apply(u, doc, false, NOW_MS, &out, &e), 1);
        ck_assert(bson_iter_init_find(&it, &out, "d"));
        if (strcmp(type, "date") == 0) {
            ck_assert(BSON_ITER_HOLDS_DATE_TIME(&it));
            ck_assert_int_eq(bson_iter_date_time(&it), NOW_MS);
        } else {
            uint32_t t, i;

            ck_assert(BSON_ITER_HOLDS_TIMESTAMP(&it));
            bson_iter_timestamp(&it, &t, &i);
            ck_assert_uint_eq(t, NOW_MS / 1000);
        }
        bson_destroy(&out);
        doc_update_free(u);
    }
    bson_destroy(&upd);
    bson_destroy(doc);
}

START_TEST(op_currentdate)
{
    run_rows(date_rows, ROWS(date_rows), false);
    currentdate_type("date", NULL, 0);
    currentdate_type("timestamp", NULL, 0);
    currentdate_type("string", NULL, DOC_BadValue);
    currentdate_type("date", "x", DOC_BadValue);
}
END_TEST
START_TEST(op_rename) { run_rows(rename_rows, ROWS(rename_rows), false); }
END_TEST
START_TEST(op_push) { run_rows(push_rows, ROWS(push_rows), false); }
END_TEST
START_TEST(op_addtoset) { run_rows(ats_rows, ROWS(ats_rows), false); }
END_TEST
START_TEST(op_pop) { run_rows(pop_rows, ROWS(pop_rows), false); }
END_TEST
START_TEST(op_pull_values) { run_rows(pull_rows, ROWS(pull_rows), false); }
END_TEST
START_TEST(op_pull_conditions) { run_rows(pull_cond_rows, ROWS(pull_cond_rows), false); }
END_TEST
START_TEST(replacement) { run_rows(repl_rows, ROWS(repl_rows), false); }
END_TEST
START_TEST(compile_errors) { run_rows(compile_rows, ROWS(compile_rows), false); }
END_TEST

/* A compiled update is reused: applying it to many documents gives each
 * its own result, and is_replacement tells the two kinds apart. */
START_TEST(reuse_and_kind)
{
    bson_t *upd = json("{\"$inc\": {\"n\": 1}, \"$push\": {\"l\": {\"$each\": [1], \"$slice\": -2}}}");
    bson_t *rep = json("{\"x\": 1}");
    struct doc_update *u, *r;
    struct doc_err e = {0};
    bson_t *doc = json("{\"_id\": 1}");

    ck_assert_int_eq(doc_update_compile(upd, &u, &e), 0);
    ck_assert_int_eq(doc_update_compile(rep, &r, &e), 0);
    ck_assert(!doc_update_is_replacement(u));
    ck_assert(doc_update_is_replacement(r));
    for (int i = 0; i < 5; i++) {
        bson_t out;
        bson_iter_t it;

        bson_init(&out);
        ck_assert_int_eq(doc_update_apply(u, doc, false, NOW_MS, &out, &e), 1);
        ck_assert(bson_iter_init_find(&it, &out, "n"));
        ck_assert_int_eq(bson_iter_int32(&it), i + 1);
        bson_destroy(doc);
        doc = bson_copy(&out);
        bson_destroy(&out);
    }
    {
        bson_t *want = json("{\"_id\": 1, \"l\": [1, 1], \"n\": 5}");

        char *got = js(doc);

        ck_assert_msg(bson_equal(doc, want), "got %s", got);
        bson_free(got);
        bson_destroy(want);
    }
    doc_update_free(u);
    doc_update_free(r);
    doc_update_free(NULL);
    bson_destroy(doc);
    bson_destroy(upd);
    bson_destroy(rep);
}
END_TEST

/* Depth: a path or a value that would nest the document deeper than 100
 * levels is refused; 100 is allowed. */
START_TEST(depth_limit)
{
    char path[512];
    size_t n = 0;
    struct doc_update *u;
    struct doc_err e = {0};
    bson_t upd, set;

    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(path + n, sizeof(path) - n, i ? ".a" : "a");
    bson_init(&upd);
    bson_append_document_begin(&upd, "$set", -1, &set);
    bson_append_int32(&set, path, -1, 1);
    bson_append_document_end(&upd, &set);
    ck_assert_int_eq(doc_update_compile(&upd, &u, &e), 0);
    {
        bson_t *doc = json("{\"_id\": 1}"), out;

        bson_init(&out);
        ck_assert_int_eq(doc_update_apply(u, doc, false, NOW_MS, &out, &e), 1);
        bson_destroy(&out);
        bson_destroy(doc);
    }
    doc_update_free(u);
    bson_destroy(&upd);

    /* one more component */
    snprintf(path + n, sizeof(path) - n, ".a");
    bson_init(&upd);
    bson_append_document_begin(&upd, "$set", -1, &set);
    bson_append_int32(&set, path, -1, 1);
    bson_append_document_end(&upd, &set);
    ck_assert_int_eq(doc_update_compile(&upd, &u, &e), -1);
    ck_assert_int_eq(e.code, DOC_BadValue);
    bson_destroy(&upd);

    /* 99 components and a value two deep */
    path[n - 2] = '\0';
    bson_init(&upd);
    bson_append_document_begin(&upd, "$set", -1, &set);
    {
        bson_t v, w;

        bson_append_document_begin(&set, path, -1, &v);
        bson_append_document_begin(&v, "x", -1, &w);
        bson_append_document_end(&v, &w);
        bson_append_document_end(&set, &v);
    }
    bson_append_document_end(&upd, &set);
    ck_assert_int_eq(doc_update_compile(&upd, &u, &e), -1);
    ck_assert_int_eq(e.code, DOC_BadValue);
    bson_destroy(&upd);
}
END_TEST

/* Compile {op: {path: value}} for a path of n components "a.a...". */
static int compile_deep(const char *op, unsigned n, const char *value_json, struct doc_err *e)
{
    char path[512];
    size_t len = 0;
    bson_t upd, inner, *v = json(value_json);
    bson_iter_t it;
    struct doc_update *u = NULL;
    int rc;

    for (unsigned i = 0; i < n; i++)
        len += (size_t)snprintf(path + len, sizeof(path) - len, i ? ".a" : "a");
    ck_assert(bson_iter_init_find(&it, v, "v"));
    bson_init(&upd);
    bson_append_document_begin(&upd, op, -1, &inner);
    bson_append_iter(&inner, path, -1, &it);
    bson_append_document_end(&upd, &inner);
    rc = doc_update_compile(&upd, &u, e);
    doc_update_free(u);
    bson_destroy(&upd);
    bson_destroy(v);
    return rc;
}

/* $push and $addToSet put their values one level down, in the array at
 * the path, however they are given. */
START_TEST(depth_limit_arrays)
{
    struct doc_err e = {0};

    ck_assert_int_eq(compile_deep("$push", 99, "{\"v\": 1}", &e), 0);
    ck_assert_int_eq(compile_deep("$push", 99, "{\"v\": {\"$each\": [1]}}", &e), 0);
    ck_assert_int_eq(compile_deep("$addToSet", 99, "{\"v\": {\"$each\": [1]}}", &e), 0);
    ck_assert_int_eq(compile_deep("$push", 100, "{\"v\": 1}", &e), -1);
    ck_assert_int_eq(e.code, DOC_BadValue);
    ck_assert_int_eq(compile_deep("$push", 99, "{\"v\": {\"$each\": [{}]}}", &e), -1);
    ck_assert_int_eq(compile_deep("$addToSet", 100, "{\"v\": 1}", &e), -1);
    ck_assert_int_eq(compile_deep("$set", 99, "{\"v\": [1]}", &e), 0);
    ck_assert_int_eq(compile_deep("$set", 99, "{\"v\": [[1]]}", &e), -1);
}
END_TEST

/* Padding an array to a far position is bounded as MongoDB bounds it. */
START_TEST(pad_limit)
{
    static const struct ucase rows[] = {
        {"{\"_id\": 1, \"a\": []}", "{\"$set\": {\"a.1500001\": 1}}", NULL, DOC_BadValue},
        {"{\"_id\": 1, \"a\": []}", "{\"$unset\": {\"a.1500001\": 1}}", "{\"_id\": 1, \"a\": []}", 0},
    };

    run_rows(rows, ROWS(rows), false);
}
END_TEST

/* ---- upsert: manual, "upsert" of update() and "Upsert with Dotted
 * _id Query" / "$setOnInsert": the query's equalities seed the new
 * document ---- */

struct upcase {
    const char *query, *upd;
    const char *want;           /* NULL: an error */
    int code;
};

static const struct upcase upsert_rows[] = {
    {"{\"a\": 1, \"b.c\": 2}", "{\"$set\": {\"d\": 3}}", "{\"a\": 1, \"b\": {\"c\": 2}, \"d\": 3}", 0},
    {"{\"a\": 1, \"b.c\": 2}", "{\"$set\": {\"b.d\": 3, \"a\": 5}}",
     "{\"a\": 5, \"b\": {\"c\": 2, \"d\": 3}}", 0},
    {"{\"x\": 1, \"_id\": 7}", "{\"$inc\": {\"n\": 1}}", "{\"_id\": 7, \"x\": 1, \"n\": 1}", 0},
    /* _id first, whatever the order of the names */
    {"{\"B\": 1, \"_id\": 7}", "{\"$set\": {\"A\": 1}}", "{\"_id\": 7, \"B\": 1, \"A\": 1}", 0},
    {"{\"a\": {\"$gt\": 1}, \"b\": {\"$eq\": 2}}", "{\"$set\": {\"c\": 1}}", "{\"b\": 2, \"c\": 1}", 0},
    {"{\"$and\": [{\"a\": 1}, {\"b\": 2}]}", "{\"$set\": {\"c\": 1}}", "{\"a\": 1, \"b\": 2, \"c\": 1}", 0},
    {"{\"$or\": [{\"a\": 1}, {\"b\": 2}]}", "{\"$set\": {\"c\": 1}}", "{\"c\": 1}", 0},
    /* $setOnInsert applies when the upsert inserts */
    {"{\"_id\": 1}", "{\"$set\": {\"item\": \"apple\"}, \"$setOnInsert\": {\"defaultQty\": 100}}",
     "{\"_id\": 1, \"defaultQty\": 100, \"item\": \"apple\"}", 0},
    {"{}", "{\"$push\": {\"l\": 1}, \"$currentDate\": {\"t\": true}}",
     "{\"l\": [1], \"t\": {\"$date\": {\"$numberLong\": \"1700000000123\"}}}", 0},
    /* the query's _id cannot be changed by the update */
    {"{\"_id\": 1}", "{\"$set\": {\"_id\": 2}}", NULL, DOC_ImmutableField},
    /* two equalities on one path, or a path and its prefix */
    {"{\"a\": 1, \"a.b\": 2}", "{\"$set\": {\"c\": 1}}", NULL, DOC_NotSingleValueField},
    /* a replacement takes only the query's _id */
    {"{\"_id\": 5, \"x\": 1}", "{\"y\": 2}", "{\"_id\": 5, \"y\": 2}", 0},
    {"{\"x\": 1}", "{\"y\": 2}", "{\"y\": 2}", 0},
    {"{\"y\": 1}", "{\"y\": 2, \"_id\": 6}", "{\"_id\": 6, \"y\": 2}", 0},
    {"{\"_id\": 6}", "{\"y\": 2, \"_id\": 6}", "{\"_id\": 6, \"y\": 2}", 0},
    {"{\"_id\": 5}", "{\"y\": 2, \"_id\": 6}", NULL, DOC_ImmutableField},
};

START_TEST(upsert_seed)
{
    for (int i = 0; i < ROWS(upsert_rows); i++) {
        const struct upcase *c = &upsert_rows[i];
        bson_t *q = json(c->query), *upd = json(c->upd), out;
        struct doc_matcher *m = NULL;
        struct doc_update *u = NULL;
        struct doc_err e = {0};
        int rc;

        ck_assert_int_eq(doc_match_compile(q, &m, &e), 0);
        ck_assert_int_eq(doc_update_compile(upd, &u, &e), 0);
        bson_init(&out);
        rc = doc_update_upsert_doc(u, m, NOW_MS, &out, &e);
        if (!c->want) {
            ck_assert_msg(rc < 0, "row %d: wanted error %d", i, c->code);
            ck_assert_msg(e.code == c->code, "row %d: wanted error %d, got %d (%s)", i, c->code,
                          e.code, e.msg);
        } else {
            bson_t *want = json(c->want);
            char *got;

            ck_assert_msg(rc == 0, "row %d: error %d %s", i, e.code, e.msg);
            got = js(&out);
            ck_assert_msg(bson_equal(&out, want), "row %d: %s with %s:\n  got  %s\n  want %s", i,
                          c->upd, c->query, got, c->want);
            bson_free(got);
            bson_destroy(want);
        }
        bson_destroy(&out);
        doc_update_free(u);
        doc_match_free(m);
        bson_destroy(q);
        bson_destroy(upd);
    }
}
END_TEST

/* ---- random updates on random documents ----
 *
 * Paths and documents drawn from a small alphabet ("a", "b", "0", "1",
 * "2"), so that paths meet each other, arrays, scalars and positions past
 * the end often. Every application must either fail with one of the codes
 * the header lists or give valid BSON in which each $set path (that did
 * not go through an array) holds its value. A fixed seed: the same cases
 * every run. */

static uint64_t rng_state;

static unsigned rnd(unsigned n)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((rng_state >> 33) % n);
}

static const char *const names[] = {"a", "b", "0", "1", "2"};

static void random_value(bson_t *b, const char *key, int depth)
{
    bson_t sub;
    unsigned n;

    switch (depth > 0 ? rnd(6) : rnd(3)) {
    case 0:
        bson_append_int32(b, key, -1, (int32_t)rnd(5));
        break;
    case 1:
        bson_append_utf8(b, key, -1, names[rnd(5)], -1);
        break;
    case 2:
        bson_append_null(b, key, -1);
        break;
    case 3:
    case 4:
        bson_append_array_begin(b, key, -1, &sub);
        n = rnd(4);
        for (unsigned i = 0; i < n; i++) {
            char k[12];

            snprintf(k, sizeof(k), "%u", i);
            random_value(&sub, k, depth - 1);
        }
        bson_append_array_end(b, &sub);
        break;
    default:
        bson_append_document_begin(b, key, -1, &sub);
        n = rnd(4);
        for (unsigned i = 0; i < n; i++)
            random_value(&sub, names[rnd(5)], depth - 1);
        bson_append_document_end(b, &sub);
        break;
    }
}

static void random_path(char *p, size_t cap)
{
    unsigned n = 1 + rnd(3);
    size_t len = 0;

    for (unsigned i = 0; i < n; i++)
        len += (size_t)snprintf(p + len, cap - len, "%s%s", i ? "." : "", names[rnd(5)]);
}

static bool via_array(const bson_t *doc, const char *path)
{
    char prefix[64];
    bson_value_t v;

    for (const char *dot = strchr(path, '.'); dot; dot = strchr(dot + 1, '.')) {
        snprintf(prefix, sizeof(prefix), "%.*s", (int)(dot - path), path);
        if (doc_get(doc, prefix, &v) && v.value_type == BSON_TYPE_ARRAY)
            return true;
    }
    return false;
}

START_TEST(random_updates)
{
    static const char *const ops[] = {"$set", "$unset", "$inc", "$mul", "$min", "$max", "$push",
                                      "$addToSet", "$pull", "$pop", "$rename", "$setOnInsert"};
    static const int allowed[] = {DOC_BadValue, DOC_TypeMismatch, DOC_PathNotViable,
                                  DOC_ConflictingUpdateOperators, DOC_ImmutableField,
                                  DOC_FailedToParse};
    unsigned ok = 0;

    rng_state = 18;
    for (int iter = 0; iter < 3000; iter++) {
        bson_t doc = BSON_INITIALIZER, upd = BSON_INITIALIZER, out;
        struct doc_update *u = NULL;
        struct doc_err e = {0};
        unsigned nf = rnd(5), nops = 1 + rnd(3);
        bool only_set = true;
        int rc;

        bson_append_int32(&doc, "_id", 3, iter);
        for (unsigned i = 0; i < nf; i++)
            random_value(&doc, names[rnd(5)], 3);
        for (unsigned i = 0; i < nops; i++) {
            const char *op = ops[rnd(sizeof(ops) / sizeof(ops[0]))];
            bson_t args;
            unsigned na = 1 + rnd(3);

            only_set &= strcmp(op, "$set") == 0;
            bson_append_document_begin(&upd, op, -1, &args);
            for (unsigned j = 0; j < na; j++) {
                char path[64];

                random_path(path, sizeof(path));
                if (strcmp(op, "$rename") == 0) {
                    char to[64];

                    random_path(to, sizeof(to));
                    bson_append_utf8(&args, path, -1, to, -1);
                } else if (strcmp(op, "$pop") == 0) {
                    bson_append_int32(&args, path, -1, rnd(2) ? 1 : -1);
                } else if (strcmp(op, "$inc") == 0 || strcmp(op, "$mul") == 0) {
                    bson_append_int32(&args, path, -1, (int32_t)rnd(7) - 3);
                } else {
                    random_value(&args, path, 2);
                }
            }
            bson_append_document_end(&upd, &args);
        }
        bson_init(&out);
        rc = doc_update_compile(&upd, &u, &e);
        if (rc == 0)
            rc = doc_update_apply(u, &doc, rnd(2), NOW_MS, &out, &e);
        if (rc < 0) {
            bool known = false;

            for (size_t k = 0; k < sizeof(allowed) / sizeof(allowed[0]); k++)
                known |= e.code == allowed[k];
            ck_assert_msg(known, "iteration %d: error %d %s", iter, e.code, e.msg);
        } else {
            bson_iter_t it, args, setv;
            size_t off;

            ok++;
            ck_assert_msg(bson_validate(&out, BSON_VALIDATE_NONE, &off), "iteration %d: invalid BSON",
                          iter);
            if (only_set && bson_iter_init(&it, &upd))
                while (bson_iter_next(&it)) {
                    bson_iter_recurse(&it, &args);
                    while (bson_iter_next(&args)) {
                        const char *p = bson_iter_key(&args);
                        bson_value_t got;

                        if (via_array(&doc, p))
                            continue;
                        ck_assert_msg(doc_get(&out, p, &got), "iteration %d: %s missing", iter, p);
                        setv = args;
                        ck_assert_msg(doc_val_eq(&got, bson_iter_value(&setv)),
                                      "iteration %d: %s has another value", iter, p);
                    }
                }
        }
        doc_update_free(u);
        bson_destroy(&out);
        bson_destroy(&doc);
        bson_destroy(&upd);
    }
    /* the alphabet is small enough for conflicts, not so small that
     * nothing applies */
    ck_assert_uint_gt(ok, 300);
}
END_TEST

Suite *suite_doc_update(void)
{
    Suite *s = suite_create("doc_update");
    TCase *ops = tcase_create("operators");
    TCase *other = tcase_create("other");

    tcase_add_test(ops, op_set);
    tcase_add_test(ops, op_setoninsert);
    tcase_add_test(ops, op_unset);
    tcase_add_test(ops, op_inc);
    tcase_add_test(ops, op_mul);
    tcase_add_test(ops, op_minmax);
    tcase_add_test(ops, op_currentdate);
    tcase_add_test(ops, op_rename);
    tcase_add_test(ops, op_push);
    tcase_add_test(ops, op_addtoset);
    tcase_add_test(ops, op_pop);
    tcase_add_test(ops, op_pull_values);
    tcase_add_test(ops, op_pull_conditions);
    suite_add_tcase(s, ops);

    tcase_add_test(other, replacement);
    tcase_add_test(other, compile_errors);
    tcase_add_test(other, reuse_and_kind);
    tcase_add_test(other, depth_limit);
    tcase_add_test(other, depth_limit_arrays);
    tcase_add_test(other, pad_limit);
    tcase_add_test(other, upsert_seed);
    tcase_add_test(other, random_updates);
    suite_add_tcase(s, other);
    return s;
}
