/* Query filters (services/doc/doc_match.c).
 *
 * The cases are the MongoDB manual's examples: each operator's page under
 * reference/operator/query/ and the tutorials "Query an Array", "Query an
 * Array of Embedded Documents", "Query on Embedded/Nested Documents" and
 * "Query for Null or Missing Fields", on the collections those pages
 * insert (with an _id each), and the _ids the pages say come back. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "doc_match.h"
#include "suites.h"

/* Copy `from` into `to`, a key "%op" becoming "$op": libbson's JSON
 * reader takes {"$type": ...} and {"$regex": ..., "$options": ...} for
 * extended JSON, so the tables spell those operators with '%'. */
static void unpercent(bson_t *to, const bson_t *from)
{
    bson_iter_t it;

    ck_assert(bson_iter_init(&it, from));
    while (bson_iter_next(&it)) {
        char key[64];
        const char *k = bson_iter_key(&it);

        snprintf(key, sizeof(key), "%s", k);
        if (key[0] == '%')
            key[0] = '$';
        if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
            bson_t sub, in, out;
            const uint8_t *data;
            uint32_t len;

            if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
                bson_iter_document(&it, &len, &data);
                bson_append_document_begin(to, key, -1, &out);
            } else {
                bson_iter_array(&it, &len, &data);
                bson_append_array_begin(to, key, -1, &out);
            }
            ck_assert(bson_init_static(&in, data, len));
            unpercent(&out, &in);
            if (BSON_ITER_HOLDS_DOCUMENT(&it))
                bson_append_document_end(to, &out);
            else
                bson_append_array_end(to, &out);
            (void)sub;
        } else {
            bson_append_value(to, key, -1, bson_iter_value(&it));
        }
    }
}

static void doc_of(bson_t *d, const char *json)
{
    bson_error_t err;
    bson_t raw;

    ck_assert_msg(bson_init_from_json(&raw, json, -1, &err), "%s: %s", json, err.message);
    bson_init(d);
    unpercent(d, &raw);
    bson_destroy(&raw);
}

/* ---- collections from the manual ---- */

static const char *const eq_inventory[] = {   /* $eq */
    "{\"_id\": 1, \"item\": {\"name\": \"ab\", \"code\": \"123\"}, \"qty\": 15, \"tags\": [\"A\", \"B\", \"C\"]}",
    "{\"_id\": 2, \"item\": {\"name\": \"cd\", \"code\": \"123\"}, \"qty\": 20, \"tags\": [\"B\"]}",
    "{\"_id\": 3, \"item\": {\"name\": \"ij\", \"code\": \"456\"}, \"qty\": 25, \"tags\": [\"A\", \"B\"]}",
    "{\"_id\": 4, \"item\": {\"name\": \"xy\", \"code\": \"456\"}, \"qty\": 30, \"tags\": [\"B\", \"A\"]}",
    "{\"_id\": 5, \"item\": {\"name\": \"mn\", \"code\": \"000\"}, \"qty\": 20, \"tags\": [[\"A\", \"B\"], \"C\"]}",
    NULL};

static const char *const in_inventory[] = {   /* $in, $nin */
    "{\"_id\": 1, \"item\": \"Pens\", \"quantity\": 350, \"tags\": [\"school\", \"office\"]}",
    "{\"_id\": 2, \"item\": \"Erasers\", \"quantity\": 15, \"tags\": [\"school\", \"home\"]}",
    "{\"_id\": 3, \"item\": \"Maps\", \"tags\": [\"office\", \"storage\"]}",
    "{\"_id\": 4, \"item\": \"Books\", \"quantity\": 5, \"tags\": [\"school\", \"storage\", \"home\"]}",
    NULL};

static const char *const all_inventory[] = {  /* $all */
    "{\"_id\": 1, \"code\": \"xyz\", \"tags\": [\"school\", \"book\", \"bag\", \"headphone\", \"appliance\"],"
    " \"qty\": [{\"size\": \"S\", \"num\": 10, \"color\": \"blue\"}, {\"size\": \"M\", \"num\": 45, \"color\": \"blue\"},"
    " {\"size\": \"L\", \"num\": 100, \"color\": \"green\"}]}",
    "{\"_id\": 2, \"code\": \"abc\", \"tags\": [\"appliance\", \"school\", \"book\"],"
    " \"qty\": [{\"size\": \"6\", \"num\": 100, \"color\": \"green\"}, {\"size\": \"6\", \"num\": 50, \"color\": \"blue\"},"
    " {\"size\": \"8\", \"num\": 100, \"color\": \"brown\"}]}",
    "{\"_id\": 3, \"code\": \"efg\", \"tags\": [\"school\", \"book\"],"
    " \"qty\": [{\"size\": \"S\", \"num\": 10, \"color\": \"blue\"}, {\"size\": \"M\", \"num\": 100, \"color\": \"blue\"},"
    " {\"size\": \"L\", \"num\": 100, \"color\": \"green\"}]}",
    "{\"_id\": 4, \"code\": \"ijk\", \"tags\": [\"electronics\", \"school\"],"
    " \"qty\": [{\"size\": \"M\", \"num\": 100, \"color\": \"green\"}]}",
    NULL};

static const char *const scores[] = {         /* $elemMatch */
    "{\"_id\": 1, \"results\": [82, 85, 88]}",
    "{\"_id\": 2, \"results\": [75, 88, 89]}",
    NULL};

static const char *const survey[] = {         /* $elemMatch */
    "{\"_id\": 1, \"results\": [{\"product\": \"abc\", \"score\": 10}, {\"product\": \"xyz\", \"score\": 5}]}",
    "{\"_id\": 2, \"results\": [{\"product\": \"abc\", \"score\": 8}, {\"product\": \"xyz\", \"score\": 7}]}",
    "{\"_id\": 3, \"results\": [{\"product\": \"abc\", \"score\": 7}, {\"product\": \"xyz\", \"score\": 8}]}",
    "{\"_id\": 4, \"results\": [{\"product\": \"abc\", \"score\": 7}, {\"product\": \"def\", \"score\": 8}]}",
    NULL};

static const char *const spices[] = {         /* $exists */
    "{\"_id\": 1, \"saffron\": 5, \"cinnamon\": 5, \"mustard\": null}",
    "{\"_id\": 2, \"saffron\": 3, \"cinnamon\": null, \"mustard\": 8}",
    "{\"_id\": 3, \"saffron\": null, \"cinnamon\": 3, \"mustard\": 9}",
    "{\"_id\": 4, \"saffron\": 1, \"cinnamon\": 2, \"mustard\": 3}",
    "{\"_id\": 5, \"saffron\": 2, \"mustard\": 5}",
    "{\"_id\": 6, \"saffron\": 3, \"cinnamon\": 2}",
    "{\"_id\": 7, \"saffron\": 4}",
    "{\"_id\": 8, \"cinnamon\": 2, \"mustard\": 4}",
    "{\"_id\": 9, \"cinnamon\": 2}",
    "{\"_id\": 10, \"mustard\": 6}",
    NULL};

static const char *const address_book[] = {   /* $type */
    "{\"_id\": 1, \"address\": \"2030 Martian Way\", \"zipCode\": \"90698345\"}",
    "{\"_id\": 2, \"address\": \"156 Lunar Place\", \"zipCode\": 43339374.0}",
    "{\"_id\": 3, \"address\": \"2324 Pluto Place\", \"zipCode\": {\"$numberLong\": \"3921412\"}}",
    "{\"_id\": 4, \"address\": \"55 Saturn Ring\", \"zipCode\": 88602117}",
    "{\"_id\": 5, \"address\": \"104 Venus Drive\", \"zipCode\": [\"834847278\", \"1893289032\"]}",
    NULL};

static const char *const grades[] = {         /* $type with an array of types */
    "{\"_id\": 1, \"name\": \"Alice King\", \"classAverage\": 87.333333333333333}",
    "{\"_id\": 2, \"name\": \"Bob Jenkins\", \"classAverage\": \"83.52\"}",
    "{\"_id\": 3, \"name\": \"Cathy Hart\", \"classAverage\": \"94.06\"}",
    "{\"_id\": 4, \"name\": \"Drew Williams\", \"classAverage\": 93}",
    NULL};

static const char *const products[] = {       /* $regex */
    "{\"_id\": 100, \"sku\": \"abc123\", \"description\": \"Single line description.\"}",
    "{\"_id\": 101, \"sku\": \"abc789\", \"description\": \"First line\\nSecond line\"}",
    "{\"_id\": 102, \"sku\": \"xyz456\", \"description\": \"Many spaces before     line\"}",
    "{\"_id\": 103, \"sku\": \"xyz789\", \"description\": \"Multiple\\nline description\"}",
    "{\"_id\": 104, \"sku\": \"Abc789\", \"description\": \"SKU starts with A\"}",
    NULL};

static const char *const sized[] = {          /* $size */
    "{\"_id\": 1, \"field\": [\"red\", \"green\"]}",
    "{\"_id\": 2, \"field\": \"red\"}",
    "{\"_id\": 3, \"field\": [\"apple\", \"lime\"]}",
    "{\"_id\": 4, \"field\": [\"fruit\"]}",
    "{\"_id\": 5, \"field\": [[\"a\", \"b\"]]}",
    NULL};

static const char *const supplies[] = {       /* $not, $or, $and, $nor */
    "{\"_id\": 1, \"item\": \"Flour\", \"qty\": 5, \"price\": 1.99, \"sale\": true}",
    "{\"_id\": 2, \"item\": \"Sugar\", \"qty\": 60, \"price\": 1.99}",
    "{\"_id\": 3, \"item\": \"Salt\", \"qty\": 20, \"price\": 10, \"sale\": false}",
    "{\"_id\": 4, \"item\": \"Pepper\", \"qty\": 100, \"sale\": true, \"price\": 4}",
    "{\"_id\": 5, \"item\": \"Cumin\"}",
    NULL};

static const char *const arrays[] = {         /* "Query an Array" */
    "{\"_id\": 1, \"item\": \"journal\", \"qty\": 25, \"tags\": [\"blank\", \"red\"], \"dim_cm\": [14, 21]}",
    "{\"_id\": 2, \"item\": \"notebook\", \"qty\": 50, \"tags\": [\"red\", \"blank\"], \"dim_cm\": [14, 21]}",
    "{\"_id\": 3, \"item\": \"paper\", \"qty\": 100, \"tags\": [\"red\", \"blank\", \"plain\"], \"dim_cm\": [14, 21]}",
    "{\"_id\": 4, \"item\": \"planner\", \"qty\": 75, \"tags\": [\"blank\", \"red\"], \"dim_cm\": [22.85, 30]}",
    "{\"_id\": 5, \"item\": \"postcard\", \"qty\": 45, \"tags\": [\"blue\"], \"dim_cm\": [10, 15.25]}",
    NULL};

static const char *const instock[] = {        /* "Query an Array of Embedded Documents" */
    "{\"_id\": 1, \"item\": \"journal\", \"instock\": [{\"warehouse\": \"A\", \"qty\": 5}, {\"warehouse\": \"C\", \"qty\": 15}]}",
    "{\"_id\": 2, \"item\": \"notebook\", \"instock\": [{\"warehouse\": \"C\", \"qty\": 5}]}",
    "{\"_id\": 3, \"item\": \"paper\", \"instock\": [{\"warehouse\": \"A\", \"qty\": 60}, {\"warehouse\": \"B\", \"qty\": 15}]}",
    "{\"_id\": 4, \"item\": \"planner\", \"instock\": [{\"warehouse\": \"A\", \"qty\": 40}, {\"warehouse\": \"B\", \"qty\": 5}]}",
    "{\"_id\": 5, \"item\": \"postcard\", \"instock\": [{\"warehouse\": \"B\", \"qty\": 15}, {\"warehouse\": \"C\", \"qty\": 35}]}",
    NULL};

static const char *const nested[] = {         /* "Query on Embedded/Nested Documents" */
    "{\"_id\": 1, \"item\": \"journal\", \"size\": {\"h\": 14, \"w\": 21, \"uom\": \"cm\"}, \"status\": \"A\"}",
    "{\"_id\": 2, \"item\": \"notebook\", \"size\": {\"h\": 8.5, \"w\": 11, \"uom\": \"in\"}, \"status\": \"A\"}",
    "{\"_id\": 3, \"item\": \"paper\", \"size\": {\"h\": 8.5, \"w\": 11, \"uom\": \"in\"}, \"status\": \"D\"}",
    "{\"_id\": 4, \"item\": \"planner\", \"size\": {\"h\": 22.85, \"w\": 30, \"uom\": \"cm\"}, \"status\": \"D\"}",
    "{\"_id\": 5, \"item\": \"postcard\", \"size\": {\"h\": 10, \"w\": 15.25, \"uom\": \"cm\"}, \"status\": \"A\"}",
    NULL};

static const char *const nulls[] = {          /* "Query for Null or Missing Fields" */
    "{\"_id\": 1, \"item\": null}",
    "{\"_id\": 2}",
    NULL};

/* Numbers across types, and type brackets (manual: "Comparison/Sort
 * Order", and $gt: "only documents whose field is a number"). */
static const char *const numbers[] = {
    "{\"_id\": 1, \"a\": 1}",
    "{\"_id\": 2, \"a\": 1.0}",
    "{\"_id\": 3, \"a\": {\"$numberLong\": \"1\"}}",
    "{\"_id\": 4, \"a\": {\"$numberDecimal\": \"1.0\"}}",
    "{\"_id\": 5, \"a\": \"1\"}",
    "{\"_id\": 6, \"a\": {\"$numberLong\": \"9007199254740993\"}}",
    "{\"_id\": 7, \"a\": NaN}",
    "{\"_id\": 8, \"a\": [2, \"x\"]}",
    "{\"_id\": 9, \"a\": {\"$minKey\": 1}}",
    "{\"_id\": 10, \"a\": {\"$maxKey\": 1}}",
    NULL};

struct mcase {
    const char *const *coll;
    const char *filter;
    const char *ids;            /* the matching _ids, comma-separated */
};

static const struct mcase cases[] = {
    /* $eq */
    {eq_inventory, "{\"qty\": {\"$eq\": 20}}", "2,5"},
    {eq_inventory, "{\"qty\": 20}", "2,5"},
    {eq_inventory, "{\"item.name\": {\"$eq\": \"ab\"}}", "1"},
    {eq_inventory, "{\"tags\": {\"$eq\": \"B\"}}", "1,2,3,4"},
    {eq_inventory, "{\"tags\": {\"$eq\": [\"A\", \"B\"]}}", "3,5"},
    {eq_inventory, "{\"item\": {\"name\": \"ab\", \"code\": \"123\"}}", "1"},
    {eq_inventory, "{\"item\": {\"code\": \"123\", \"name\": \"ab\"}}", ""},
    {eq_inventory, "{}", "1,2,3,4,5"},
    /* $ne, $gt, $gte, $lt, $lte */
    {eq_inventory, "{\"qty\": {\"$ne\": 20}}", "1,3,4"},
    {eq_inventory, "{\"tags\": {\"$ne\": \"A\"}}", "2,5"},
    {eq_inventory, "{\"qty\": {\"$gt\": 20}}", "3,4"},
    {eq_inventory, "{\"qty\": {\"$gte\": 20}}", "2,3,4,5"},
    {eq_inventory, "{\"qty\": {\"$lt\": 20}}", "1"},
    {eq_inventory, "{\"qty\": {\"$lte\": 20}}", "1,2,5"},
    {eq_inventory, "{\"item.code\": {\"$gt\": \"123\"}}", "3,4"},
    /* $in, $nin */
    {in_inventory, "{\"quantity\": {\"$in\": [5, 15]}}", "2,4"},
    {in_inventory, "{\"tags\": {\"$in\": [{\"$regularExpression\": {\"pattern\": \"^be\", \"options\": \"\"}}, {\"$regularExpression\": {\"pattern\": \"^st\", \"options\": \"\"}}]}}", "3,4"},
    {in_inventory, "{\"tags\": {\"$in\": [\"home\", \"nowhere\"]}}", "2,4"},
    {in_inventory, "{\"quantity\": {\"$nin\": [5, 15]}}", "1,3"},
    {in_inventory, "{\"tags\": {\"$nin\": [\"school\"]}}", "3"},
    {in_inventory, "{\"quantity\": {\"$in\": [null]}}", "3"},
    {in_inventory, "{\"quantity\": {\"$in\": []}}", ""},
    {in_inventory, "{\"quantity\": {\"$nin\": []}}", "1,2,3,4"},
    /* $all */
    {all_inventory, "{\"tags\": {\"$all\": [\"appliance\", \"school\", \"book\"]}}", "1,2"},
    {all_inventory, "{\"qty\": {\"$all\": [{\"$elemMatch\": {\"size\": \"M\", \"num\": {\"$gt\": 50}}},"
                    " {\"$elemMatch\": {\"num\": 100, \"color\": \"green\"}}]}}", "3,4"},
    {all_inventory, "{\"qty.num\": {\"$all\": [50]}}", "2"},
    {all_inventory, "{\"qty.num\": 50}", "2"},
    {all_inventory, "{\"tags\": {\"$all\": []}}", ""},
    {all_inventory, "{\"tags\": {\"$all\": [{\"$regularExpression\": {\"pattern\": \"^app\", \"options\": \"\"}}, \"bag\"]}}", "1"},
    /* $elemMatch */
    {scores, "{\"results\": {\"$elemMatch\": {\"$gte\": 80, \"$lt\": 85}}}", "1"},
    {scores, "{\"results\": {\"$gte\": 80, \"$lt\": 85}}", "1,2"},
    {survey, "{\"results\": {\"$elemMatch\": {\"product\": \"xyz\", \"score\": {\"$gte\": 8}}}}", "3"},
    {survey, "{\"results\": {\"$elemMatch\": {\"product\": \"xyz\"}}}", "1,2,3"},
    {survey, "{\"results.product\": \"xyz\"}", "1,2,3"},
    {survey, "{\"results\": {\"$elemMatch\": {\"product\": {\"$ne\": \"xyz\"}}}}", "1,2,3,4"},
    {survey, "{\"results.product\": {\"$ne\": \"xyz\"}}", "4"},
    {survey, "{\"results\": {\"$elemMatch\": {\"$or\": [{\"score\": 10}, {\"product\": \"def\"}]}}}", "1,4"},
    {scores, "{\"results\": {\"$elemMatch\": {\"$not\": {\"$gt\": 80}}}}", "2"},
    {scores, "{\"_id\": {\"$elemMatch\": {\"$gt\": 0}}}", ""},
    /* $exists */
    {spices, "{\"saffron\": {\"$exists\": true}}", "1,2,3,4,5,6,7"},
    {spices, "{\"cinnamon\": {\"$exists\": false}}", "5,7,10"},
    {spices, "{\"saffron\": {\"$exists\": 1, \"$nin\": [5, 15]}}", "2,3,4,5,6,7"},
    {spices, "{\"mustard\": {\"$exists\": 0}}", "6,7,9"},
    /* $type */
    {address_book, "{\"zipCode\": {\"%type\": 2}}", "1,5"},
    {address_book, "{\"zipCode\": {\"%type\": \"string\"}}", "1,5"},
    {address_book, "{\"zipCode\": {\"%type\": 1}}", "2"},
    {address_book, "{\"zipCode\": {\"%type\": \"double\"}}", "2"},
    {address_book, "{\"zipCode\": {\"%type\": \"number\"}}", "2,3,4"},
    {address_book, "{\"zipCode\": {\"%type\": \"long\"}}", "3"},
    {address_book, "{\"zipCode\": {\"%type\": 16}}", "4"},
    {address_book, "{\"zipCode\": {\"%type\": \"array\"}}", "5"},
    {address_book, "{\"zipCode\": {\"%type\": 4.0}}", "5"},
    {grades, "{\"classAverage\": {\"%type\": [2, 1]}}", "1,2,3"},
    {grades, "{\"classAverage\": {\"%type\": [\"string\", \"double\"]}}", "1,2,3"},
    {grades, "{\"classAverage\": {\"%type\": [\"number\"]}}", "1,4"},
    /* $regex */
    {products, "{\"sku\": {\"%regex\": {\"$regularExpression\": {\"pattern\": \"789$\", \"options\": \"\"}}}}", "101,103,104"},
    {products, "{\"sku\": {\"%regex\": \"789$\"}}", "101,103,104"},
    {products, "{\"sku\": {\"$regularExpression\": {\"pattern\": \"789$\", \"options\": \"\"}}}", "101,103,104"},
    {products, "{\"sku\": {\"%regex\": {\"$regularExpression\": {\"pattern\": \"^ABC\", \"options\": \"i\"}}}}", "100,101,104"},
    {products, "{\"sku\": {\"%regex\": \"^ABC\", \"%options\": \"i\"}}", "100,101,104"},
    {products, "{\"description\": {\"%regex\": \"^S\", \"%options\": \"m\"}}", "100,101,104"},
    {products, "{\"description\": {\"%regex\": \"^S\"}}", "100,104"},
    {products, "{\"description\": {\"%regex\": \"m.*line\", \"%options\": \"si\"}}", "102,103"},
    {products, "{\"description\": {\"%regex\": \"m.*line\", \"%options\": \"i\"}}", "102"},
    {products, "{\"sku\": {\"%regex\": \"abc #category code\\n123 #item number\", \"%options\": \"x\"}}", "100"},
    {products, "{\"sku\": {\"$in\": [{\"$regularExpression\": {\"pattern\": \"^abc\", \"options\": \"\"}}, \"xyz456\"]}}", "100,101,102"},
    {products, "{\"sku\": {\"$not\": {\"$regularExpression\": {\"pattern\": \"^abc\", \"options\": \"\"}}}}", "102,103,104"},
    {products, "{\"sku\": {\"$eq\": {\"$regularExpression\": {\"pattern\": \"^abc\", \"options\": \"\"}}}}", ""},
    {products, "{\"sku\": {\"$not\": {\"%regex\": \"^abc\"}}}", "102,103,104"},
    {products, "{\"sku\": {\"$not\": {\"%regex\": \"^ABC\", \"%options\": \"i\"}}}", "102,103"},
    {in_inventory, "{\"tags\": {\"$elemMatch\": {\"%regex\": \"^st\"}}}", "3,4"},
    {in_inventory, "{\"tags\": {\"$elemMatch\": {\"$in\": [\"home\"], \"$ne\": \"x\"}}}", "2,4"},
    /* $size */
    {sized, "{\"field\": {\"$size\": 2}}", "1,3"},
    {sized, "{\"field\": {\"$size\": 1}}", "4,5"},
    {sized, "{\"field\": {\"$size\": 0}}", ""},
    {sized, "{\"field\": {\"$size\": 2.0}}", "1,3"},
    /* $not, $or, $and, $nor */
    {supplies, "{\"price\": {\"$not\": {\"$gt\": 1.99}}}", "1,2,5"},
    {supplies, "{\"price\": {\"$lte\": 1.99}}", "1,2"},
    {supplies, "{\"$or\": [{\"qty\": {\"$lt\": 20}}, {\"price\": 10}]}", "1,3"},
    {supplies, "{\"$nor\": [{\"price\": 1.99}, {\"sale\": true}]}", "3,5"},
    {supplies, "{\"$and\": [{\"$or\": [{\"qty\": {\"$lt\": 10}}, {\"qty\": {\"$gt\": 50}}]},"
               " {\"$or\": [{\"sale\": true}, {\"price\": {\"$lt\": 5}}]}]}", "1,2,4"},
    {supplies, "{\"$and\": [{\"price\": {\"$ne\": 1.99}}, {\"price\": {\"$exists\": true}}]}", "3,4"},
    {supplies, "{\"item\": {\"$not\": {\"$regularExpression\": {\"pattern\": \"^S\", \"options\": \"\"}}}}", "1,4,5"},
    {supplies, "{\"$comment\": \"why\", \"qty\": 5}", "1"},
    /* "Query an Array" */
    {arrays, "{\"tags\": [\"red\", \"blank\"]}", "2"},
    {arrays, "{\"tags\": {\"$all\": [\"red\", \"blank\"]}}", "1,2,3,4"},
    {arrays, "{\"tags\": \"red\"}", "1,2,3,4"},
    {arrays, "{\"dim_cm\": {\"$gt\": 25}}", "4"},
    {arrays, "{\"dim_cm\": {\"$gt\": 15, \"$lt\": 20}}", "1,2,3,5"},
    {arrays, "{\"dim_cm\": {\"$elemMatch\": {\"$gt\": 22, \"$lt\": 30}}}", "4"},
    {arrays, "{\"dim_cm.1\": {\"$gt\": 25}}", "4"},
    {arrays, "{\"tags\": {\"$size\": 3}}", "3"},
    /* "Query an Array of Embedded Documents" */
    {instock, "{\"instock\": {\"warehouse\": \"A\", \"qty\": 5}}", "1"},
    {instock, "{\"instock\": {\"qty\": 5, \"warehouse\": \"A\"}}", ""},
    {instock, "{\"instock.0.qty\": {\"$lte\": 20}}", "1,2,5"},
    {instock, "{\"instock.qty\": {\"$lte\": 20}}", "1,2,3,4,5"},
    {instock, "{\"instock\": {\"$elemMatch\": {\"qty\": 5, \"warehouse\": \"A\"}}}", "1"},
    {instock, "{\"instock\": {\"$elemMatch\": {\"qty\": {\"$gt\": 10, \"$lte\": 20}}}}", "1,3,5"},
    {instock, "{\"instock.qty\": {\"$gt\": 10, \"$lte\": 20}}", "1,3,4,5"},
    {instock, "{\"instock.qty\": 5, \"instock.warehouse\": \"A\"}", "1,4"},
    /* "Query on Embedded/Nested Documents" */
    {nested, "{\"size\": {\"h\": 14, \"w\": 21, \"uom\": \"cm\"}}", "1"},
    {nested, "{\"size\": {\"w\": 21, \"h\": 14, \"uom\": \"cm\"}}", ""},
    {nested, "{\"size.uom\": \"in\"}", "2,3"},
    {nested, "{\"size.h\": {\"$lt\": 15}}", "1,2,3,5"},
    {nested, "{\"size.h\": {\"$lt\": 15}, \"size.uom\": \"in\", \"status\": \"D\"}", "3"},
    {nested, "{\"size.h.x\": null}", "1,2,3,4,5"},
    /* "Query for Null or Missing Fields" */
    {nulls, "{\"item\": null}", "1,2"},
    {nulls, "{\"item\": {\"%type\": 10}}", "1"},
    {nulls, "{\"item\": {\"%type\": \"null\"}}", "1"},
    {nulls, "{\"item\": {\"$exists\": false}}", "2"},
    {nulls, "{\"item\": {\"$ne\": null}}", ""},
    {nulls, "{\"item\": {\"$gte\": null}}", "1,2"},
    {nulls, "{\"item\": {\"$gt\": null}}", ""},
    {nulls, "{\"item\": {\"$nin\": [null]}}", ""},
    /* numbers and type brackets */
    {numbers, "{\"a\": 1}", "1,2,3,4"},
    {numbers, "{\"a\": {\"$numberDecimal\": \"1\"}}", "1,2,3,4"},
    {numbers, "{\"a\": {\"$gt\": 0}}", "1,2,3,4,6,8"},
    {numbers, "{\"a\": {\"$gt\": 9007199254740992.0}}", "6"},
    {numbers, "{\"a\": {\"$lte\": 9007199254740992.0}}", "1,2,3,4,8"},
    {numbers, "{\"a\": {\"$gte\": \"\"}}", "5,8"},
    {numbers, "{\"a\": NaN}", "7"},
    {numbers, "{\"a\": {\"$lt\": Infinity}}", "1,2,3,4,6,8"},
    {numbers, "{\"a\": {\"$gte\": NaN}}", "7"},
    {numbers, "{\"a\": {\"$gt\": {\"$minKey\": 1}}}", "1,2,3,4,5,6,7,8,10"},
    {numbers, "{\"a\": {\"$lt\": {\"$maxKey\": 1}}}", "1,2,3,4,5,6,7,8,9"},
    {numbers, "{\"a\": {\"$minKey\": 1}}", "9"},
    {numbers, "{\"a\": {\"%type\": \"minKey\"}}", "9"},
    {numbers, "{\"a\": {\"%type\": -1}}", "9"},
    {numbers, "{\"a\": {\"%type\": 127}}", "10"},
    {numbers, "{\"a\": {\"$gt\": [1]}}", "8"},
};

static void run_case(const struct mcase *c)
{
    struct doc_matcher *m = NULL;
    struct doc_err e = {0};
    bson_t f;
    char got[256] = "";

    doc_of(&f, c->filter);
    ck_assert_msg(doc_match_compile(&f, &m, &e) == 0, "%s: %s", c->filter, e.msg);
    bson_destroy(&f);
    for (int i = 0; c->coll[i]; i++) {
        bson_t d;
        bson_iter_t it;

        doc_of(&d, c->coll[i]);
        if (doc_match(m, &d)) {
            ck_assert(bson_iter_init_find(&it, &d, "_id"));
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%d", got[0] ? "," : "",
                     bson_iter_int32(&it));
        }
        bson_destroy(&d);
    }
    doc_match_free(m);
    ck_assert_msg(strcmp(got, c->ids) == 0, "%s: matched [%s], want [%s]", c->filter, got, c->ids);
}

START_TEST(manual_examples)
{
    run_case(&cases[_i]);
}
END_TEST

/* ---- errors ---- */

struct ecase {
    const char *filter;
    int code;
    const char *msg;            /* the start of errmsg */
};

static const struct ecase errors[] = {
    {"{\"a\": {\"$foo\": 1}}", DOC_BadValue, "unknown operator: $foo"},
    {"{\"a\": {\"$gt\": 1, \"b\": 2}}", DOC_BadValue, "unknown operator: b"},
    {"{\"$foo\": 1}", DOC_BadValue, "unknown top level operator: $foo"},
    {"{\"$not\": {\"a\": 1}}", DOC_BadValue, "unknown top level operator: $not"},
    {"{\"a\": {\"$in\": 5}}", DOC_BadValue, "$in needs an array"},
    {"{\"a\": {\"$nin\": {\"x\": 1}}}", DOC_BadValue, "$nin needs an array"},
    {"{\"a\": {\"$in\": [{\"$gt\": 1}]}}", DOC_BadValue, "cannot nest $ under $in"},
    {"{\"$and\": []}", DOC_BadValue, "$and/$or/$nor must be a nonempty array"},
    {"{\"$or\": 5}", DOC_BadValue, "$and/$or/$nor must be a nonempty array"},
    {"{\"$nor\": [5]}", DOC_BadValue, "$or/$and/$nor entries need to be full objects"},
    {"{\"$or\": [{\"a\": {\"$bad\": 1}}]}", DOC_BadValue, "unknown operator: $bad"},
    {"{\"a\": {\"$all\": 5}}", DOC_BadValue, "$all needs an array"},
    {"{\"a\": {\"$all\": [{\"$gt\": 1}]}}", DOC_BadValue, "no $ expressions in $all"},
    {"{\"a\": {\"$all\": [{\"$elemMatch\": {\"b\": 1}}, 5]}}", DOC_BadValue,
     "$all/$elemMatch has to be consistent"},
    {"{\"a\": {\"$size\": \"x\"}}", DOC_BadValue, "$size needs a number"},
    {"{\"a\": {\"$size\": 1.5}}", DOC_BadValue, "$size must be a whole number"},
    {"{\"a\": {\"$size\": -1}}", DOC_BadValue, "$size may not be negative"},
    {"{\"a\": {\"%type\": \"foo\"}}", DOC_BadValue, "Unknown type name alias: foo"},
    {"{\"a\": {\"%type\": 99}}", DOC_BadValue, "Invalid numerical type code: 99"},
    {"{\"a\": {\"%type\": 2.5}}", DOC_BadValue, "Invalid numerical type code: 2.5"},
    {"{\"a\": {\"%type\": true}}", DOC_TypeMismatch, "type must be represented as a number or a string"},
    {"{\"a\": {\"%type\": [2, \"nope\"]}}", DOC_BadValue, "Unknown type name alias: nope"},
    {"{\"a\": {\"%regex\": 5}}", DOC_BadValue, "$regex has to be a string"},
    {"{\"a\": {\"%regex\": \"a\", \"%options\": 5}}", DOC_BadValue, "$options has to be a string"},
    {"{\"a\": {\"%options\": \"i\"}}", DOC_BadValue, "$options needs a $regex"},
    {"{\"a\": {\"%regex\": \"(\"}}", DOC_BadValue, "Regular expression is invalid: "},
    {"{\"a\": {\"%regex\": \"a\", \"%options\": \"z\"}}", DOC_BadValue, "invalid flag in regex options: z"},
    {"{\"a\": {\"%regex\": {\"$regularExpression\": {\"pattern\": \"a\", \"options\": \"i\"}}, \"%options\": \"m\"}}",
     DOC_BadValue, "options set in both $regex and $options"},
    {"{\"a\": {\"$in\": [{\"$regularExpression\": {\"pattern\": \"[\", \"options\": \"\"}}]}}",
     DOC_BadValue, "Regular expression is invalid: "},
    {"{\"a\": {\"$not\": 5}}", DOC_BadValue, "$not needs a regex or a document"},
    {"{\"a\": {\"$not\": {}}}", DOC_BadValue, "$not cannot be empty"},
    {"{\"a\": {\"$not\": {\"b\": 1}}}", DOC_BadValue, "unknown operator: b"},
    {"{\"a\": {\"$ne\": {\"$regularExpression\": {\"pattern\": \"a\", \"options\": \"\"}}}}",
     DOC_BadValue, "Can't have regex as arg to $ne."},
    {"{\"a\": {\"$elemMatch\": 5}}", DOC_BadValue, "$elemMatch needs an Object"},
    {"{\"a\": {\"$elemMatch\": {\"$gt\": 1, \"$foo\": 2}}}", DOC_BadValue, "unknown operator: $foo"},
};

START_TEST(compile_errors)
{
    const struct ecase *c = &errors[_i];
    struct doc_matcher *m = NULL;
    struct doc_err e = {0};
    bson_t f;

    doc_of(&f, c->filter);
    ck_assert_msg(doc_match_compile(&f, &m, &e) < 0, "%s compiled", c->filter);
    ck_assert_ptr_null(m);
    ck_assert_msg(e.code == c->code, "%s: code %d, want %d (%s)", c->filter, e.code, c->code, e.msg);
    ck_assert_msg(strncmp(e.msg, c->msg, strlen(c->msg)) == 0, "%s: [%s], want [%s]", c->filter,
                  e.msg, c->msg);
    bson_destroy(&f);
}
END_TEST

START_TEST(regex_with_nul_refused)
{
    struct doc_matcher *m = NULL;
    struct doc_err e = {0};
    bson_t f = BSON_INITIALIZER, ops;

    bson_append_document_begin(&f, "a", 1, &ops);
    bson_append_utf8(&ops, "$regex", 6, "a\0b", 3);
    bson_append_document_end(&f, &ops);
    ck_assert_int_lt(doc_match_compile(&f, &m, &e), 0);
    ck_assert_int_eq(e.code, DOC_BadValue);
    ck_assert_str_eq(e.msg, "Regular expression cannot contain an embedded null byte");
    bson_destroy(&f);
}
END_TEST

START_TEST(invalid_bson_refused)
{
    static const uint8_t bad[] = {12, 0, 0, 0, 0x02, 'a', 0, 5, 0, 0, 0, 0};  /* a string past the end */
    struct doc_matcher *m = NULL;
    struct doc_err e = {0};
    bson_t f;

    ck_assert(bson_init_static(&f, bad, sizeof(bad)));
    ck_assert_int_lt(doc_match_compile(&f, &m, &e), 0);
    ck_assert_int_eq(e.code, DOC_InvalidBSON);
}
END_TEST

/* Nesting: DOC_MATCH_DEPTH_MAX levels of $and, $elemMatch or $not
 * compile, one more does not (libbson's JSON reader stops short of that
 * depth, so the filters are built here). */
enum nest { NEST_AND, NEST_ELEM, NEST_NOT };

static int compile_nested(enum nest how, int levels, struct doc_err *e)
{
    struct doc_matcher *m = NULL;
    bson_t *cur = bson_new(), *next, d;
    int rc;

    if (how == NEST_NOT)
        BSON_APPEND_INT32(cur, "$gt", 1);
    else
        BSON_APPEND_INT32(cur, "a", 1);
    for (int i = 0; i < levels; i++) {
        bson_t child, grand;

        next = bson_new();
        if (how == NEST_AND) {
            bson_append_array_begin(next, "$and", -1, &child);
            bson_append_document(&child, "0", -1, cur);
            bson_append_array_end(next, &child);
        } else if (how == NEST_ELEM) {
            bson_append_document_begin(next, "a", -1, &child);
            bson_append_document(&child, "$elemMatch", -1, cur);
            bson_append_document_end(next, &child);
        } else {
            bson_append_document(next, "$not", -1, cur);
        }
        (void)grand;
        bson_destroy(cur);
        cur = next;
    }
    if (how == NEST_NOT) {
        next = bson_new();
        bson_append_document(next, "a", -1, cur);
        bson_destroy(cur);
        cur = next;
    }
    rc = doc_match_compile(cur, &m, e);
    if (rc == 0) {
        doc_of(&d, "{\"a\": [{\"a\": [{\"a\": 1}]}]}");
        doc_match(m, &d);
        bson_destroy(&d);
    }
    doc_match_free(m);
    bson_destroy(cur);
    return rc;
}

START_TEST(depth_limit)
{
    struct doc_err e = {0};
    int max = DOC_MATCH_DEPTH_MAX;

    for (int how = NEST_AND; how <= NEST_NOT; how++) {
        ck_assert_msg(compile_nested(how, max, &e) == 0, "%d: %s", how, e.msg);
        memset(&e, 0, sizeof(e));
        ck_assert_int_lt(compile_nested(how, max + 1, &e), 0);
        ck_assert_int_eq(e.code, DOC_BadValue);
        ck_assert_str_eq(e.msg, "exceeded maximum query tree depth of 100");
    }
}
END_TEST

/* The matcher keeps its own copy: the filter may go first. */
START_TEST(filter_freed_after_compile)
{
    struct doc_matcher *m = NULL;
    struct doc_err e = {0};
    bson_t *f = bson_new_from_json((const uint8_t *)"{\"a\": {\"$in\": [\"x\", \"y\"]}, \"b\": {\"$regularExpression\": {\"pattern\": \"^q\", \"options\": \"\"}}}",
                                   -1, NULL);
    bson_t d;

    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(doc_match_compile(f, &m, &e), 0);
    memset((uint8_t *)bson_get_data(f), 0xee, f->len);
    bson_destroy(f);
    doc_of(&d, "{\"a\": \"y\", \"b\": \"qq\"}");
    ck_assert(doc_match(m, &d));
    bson_destroy(&d);
    doc_match_free(m);
}
END_TEST

/* ---- bounds ---- */

static struct doc_matcher *compile(const char *json)
{
    struct doc_matcher *m = NULL;
    struct doc_err e = {0};
    bson_t f;

    doc_of(&f, json);
    ck_assert_msg(doc_match_compile(&f, &m, &e) == 0, "%s: %s", json, e.msg);
    bson_destroy(&f);
    return m;
}

static void key_json(struct doc_buf *b, const char *json)
{
    bson_t d;
    bson_iter_t it;

    doc_of(&d, json);
    ck_assert(bson_iter_init(&it, &d) && bson_iter_next(&it));
    doc_buf_reset(b);
    doc_key_add(b, bson_iter_value(&it), false);
    bson_destroy(&d);
}

static bool buf_is(const struct doc_buf *b, const struct doc_buf *want)
{
    return b->len == want->len && memcmp(b->p, want->p, b->len) == 0;
}

static bool buf_is_byte(const struct doc_buf *b, uint8_t c)
{
    return b->len == 1 && b->p[0] == c;
}

START_TEST(bounds_gt_is_to_end_of_numbers)
{
    struct doc_matcher *m = compile("{\"a\": {\"$gt\": 5}, \"b\": 1}");
    struct doc_bounds b;
    struct doc_buf k = {0};

    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert_uint_eq(b.n, 1);
    key_json(&k, "{\"v\": 5}");
    ck_assert(buf_is(&b.iv[0].lo, &k) && !b.iv[0].lo_incl);
    ck_assert(buf_is_byte(&b.iv[0].hi, doc_key_rank_byte(BSON_TYPE_DOUBLE) + 1));
    ck_assert(!b.iv[0].hi_incl);
    ck_assert(b.exact && !b.point);
    doc_bounds_free(&b);
    ck_assert_int_eq(doc_match_bounds(m, "c", &b), 0);
    doc_match_free(m);

    /* $lte: from just above NaN (no comparison matches NaN) */
    m = compile("{\"a\": {\"$lte\": 5}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    key_json(&k, "{\"v\": NaN}");
    ck_assert(buf_is(&b.iv[0].lo, &k) && !b.iv[0].lo_incl);
    key_json(&k, "{\"v\": 5}");
    ck_assert(buf_is(&b.iv[0].hi, &k) && b.iv[0].hi_incl);
    doc_bounds_free(&b);
    doc_match_free(m);

    m = compile("{\"a\": {\"$gte\": \"x\"}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    key_json(&k, "{\"v\": \"x\"}");
    ck_assert(buf_is(&b.iv[0].lo, &k) && b.iv[0].lo_incl);
    ck_assert(buf_is_byte(&b.iv[0].hi, doc_key_rank_byte(BSON_TYPE_UTF8) + 1));
    doc_bounds_free(&b);
    doc_match_free(m);
    doc_buf_free(&k);
}
END_TEST

START_TEST(bounds_in_sorted_points)
{
    struct doc_matcher *m = compile("{\"a\": {\"$in\": [3, \"z\", 1, 2, 1.0, {\"$numberLong\": \"3\"}]}}");
    struct doc_bounds b;
    struct doc_buf k = {0};
    static const char *const want[] = {"{\"v\": 1}", "{\"v\": 2}", "{\"v\": 3}", "{\"v\": \"z\"}"};

    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert_uint_eq(b.n, 4);
    for (unsigned i = 0; i < 4; i++) {
        key_json(&k, want[i]);
        ck_assert(buf_is(&b.iv[i].lo, &k) && buf_is(&b.iv[i].hi, &k));
        ck_assert(b.iv[i].lo_incl && b.iv[i].hi_incl);
    }
    ck_assert(b.point && b.exact);
    doc_bounds_free(&b);
    doc_match_free(m);

    /* {a: 5} and {$and: [{a: {$eq: 5}}]}: one point */
    m = compile("{\"$and\": [{\"a\": {\"$eq\": 5}}]}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert(b.n == 1 && b.point && b.exact);
    doc_bounds_free(&b);
    doc_match_free(m);

    /* an empty $in: nothing can match */
    m = compile("{\"a\": {\"$in\": []}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert_uint_eq(b.n, 0);
    doc_bounds_free(&b);
    doc_match_free(m);
    doc_buf_free(&k);
}
END_TEST

START_TEST(bounds_regex_prefix)
{
    struct doc_matcher *m = compile("{\"a\": {\"%regex\": \"^abc.*\"}}");
    struct doc_bounds b;
    uint8_t sb = doc_key_rank_byte(BSON_TYPE_UTF8);
    uint8_t lo[4] = {sb, 'a', 'b', 'c'}, hi[4] = {sb, 'a', 'b', 'd'};

    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    /* the strings with the prefix, and the regex itself as a value */
    ck_assert_uint_eq(b.n, 2);
    ck_assert(b.iv[0].lo.len == 4 && memcmp(b.iv[0].lo.p, lo, 4) == 0 && b.iv[0].lo_incl);
    ck_assert(b.iv[0].hi.len == 4 && memcmp(b.iv[0].hi.p, hi, 4) == 0 && !b.iv[0].hi_incl);
    ck_assert(b.iv[1].lo.p[0] == doc_key_rank_byte(BSON_TYPE_REGEX));
    ck_assert(!b.exact && !b.point);
    doc_bounds_free(&b);
    doc_match_free(m);

    /* a quantifier takes its character back; 'i' allows no prefix */
    m = compile("{\"a\": {\"%regex\": \"^abc?\"}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert(b.iv[0].lo.len == 3 && memcmp(b.iv[0].lo.p, lo, 3) == 0);
    doc_bounds_free(&b);
    doc_match_free(m);
    m = compile("{\"a\": {\"%regex\": \"^abc\", \"%options\": \"i\"}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert(buf_is_byte(&b.iv[0].lo, sb) && buf_is_byte(&b.iv[0].hi, sb + 1));
    doc_bounds_free(&b);
    doc_match_free(m);
}
END_TEST

START_TEST(bounds_null_and_conjunction_only)
{
    struct doc_matcher *m = compile("{\"a\": null}");
    struct doc_bounds b;
    struct doc_buf k = {0};

    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    key_json(&k, "{\"v\": null}");
    ck_assert(b.n == 1 && buf_is(&b.iv[0].lo, &k) && b.point && !b.exact);
    doc_bounds_free(&b);
    doc_match_free(m);

    /* $or, $nor, $not and $ne are not looked into */
    m = compile("{\"$or\": [{\"a\": 1}, {\"a\": 2}], \"b\": {\"$ne\": 1}, \"c\": {\"$not\": {\"$gt\": 1}}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 0);
    ck_assert_int_eq(doc_match_bounds(m, "b", &b), 0);
    ck_assert_int_eq(doc_match_bounds(m, "c", &b), 0);
    doc_match_free(m);

    /* a residual predicate makes them inexact */
    m = compile("{\"a\": 1, \"$or\": [{\"a\": 2}, {\"b\": 1}]}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert(b.point && !b.exact);
    doc_bounds_free(&b);
    doc_match_free(m);
    doc_buf_free(&k);
}
END_TEST

/* Two ranges on one path may be met by two elements of an array
 * ({dim_cm: [10, 30]} matches {$gt: 15, $lt: 20}): they are not
 * intersected; one element meeting both ($elemMatch) is. */
START_TEST(bounds_ranges_not_intersected_across_elements)
{
    struct doc_matcher *m = compile("{\"a\": {\"$gt\": 15, \"$lt\": 20}}");
    struct doc_bounds b;
    struct doc_buf k = {0};

    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert_uint_eq(b.n, 1);
    ck_assert(!b.exact);
    doc_bounds_free(&b);
    doc_match_free(m);

    m = compile("{\"a\": {\"$elemMatch\": {\"$gt\": 15, \"$lt\": 20}}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert_uint_eq(b.n, 1);
    key_json(&k, "{\"v\": 15}");
    ck_assert(buf_is(&b.iv[0].lo, &k) && !b.iv[0].lo_incl);
    key_json(&k, "{\"v\": 20}");
    ck_assert(buf_is(&b.iv[0].hi, &k) && !b.iv[0].hi_incl);
    doc_bounds_free(&b);
    doc_match_free(m);

    /* points beat ranges */
    m = compile("{\"a\": {\"$gt\": 15, \"$in\": [16, 17]}}");
    ck_assert_int_eq(doc_match_bounds(m, "a", &b), 1);
    ck_assert(b.n == 2 && b.point);
    doc_bounds_free(&b);
    doc_match_free(m);
    doc_buf_free(&k);
}
END_TEST

/* Without arrays one value meets every predicate: intersected. */
START_TEST(bounds_scalar_intersects)
{
    struct doc_matcher *m = compile("{\"a\": {\"$gt\": 15, \"$lt\": 20}}");
    struct doc_bounds b;
    struct doc_buf k = {0};

    ck_assert_int_eq(doc_match_bounds_scalar(m, "a", &b), 1);
    ck_assert_uint_eq(b.n, 1);
    key_json(&k, "{\"v\": 15}");
    ck_assert(buf_is(&b.iv[0].lo, &k) && !b.iv[0].lo_incl);
    key_json(&k, "{\"v\": 20}");
    ck_assert(buf_is(&b.iv[0].hi, &k) && !b.iv[0].hi_incl);
    ck_assert(b.exact && !b.point);
    doc_bounds_free(&b);
    doc_match_free(m);

    m = compile("{\"a\": {\"$in\": [1, 2, 3], \"$gt\": 1}}");
    ck_assert_int_eq(doc_match_bounds_scalar(m, "a", &b), 1);
    ck_assert(b.n == 2 && b.point && b.exact);
    key_json(&k, "{\"v\": 2}");
    ck_assert(buf_is(&b.iv[0].lo, &k));
    doc_bounds_free(&b);
    doc_match_free(m);

    m = compile("{\"$and\": [{\"a\": {\"$gt\": 5}}, {\"a\": {\"$lt\": 3}}]}");
    ck_assert_int_eq(doc_match_bounds_scalar(m, "a", &b), 1);
    ck_assert_uint_eq(b.n, 0);
    doc_bounds_free(&b);
    doc_match_free(m);

    /* $exists gives no interval: what is left is inexact */
    m = compile("{\"a\": {\"$gt\": 1, \"$exists\": true}}");
    ck_assert_int_eq(doc_match_bounds_scalar(m, "a", &b), 1);
    ck_assert(b.n == 1 && !b.exact);
    doc_bounds_free(&b);
    doc_match_free(m);
    doc_buf_free(&k);
}
END_TEST

/* Every value of `a` in a mixed table, against every filter: when the
 * document matches, the key of the value (or of one of its elements, or
 * null when it is missing) is inside the bounds. */
static bool key_inside(const struct doc_bounds *b, const struct doc_buf *k)
{
    for (unsigned i = 0; i < b->n; i++) {
        const struct doc_interval *iv = &b->iv[i];
        int lo = 1, hi = -1;

        if (iv->lo.len) {
            lo = memcmp(k->p, iv->lo.p, k->len < iv->lo.len ? k->len : iv->lo.len);
            if (!lo)
                lo = (k->len > iv->lo.len) - (k->len < iv->lo.len);
        }
        if (iv->hi.len) {
            hi = memcmp(k->p, iv->hi.p, k->len < iv->hi.len ? k->len : iv->hi.len);
            if (!hi)
                hi = (k->len > iv->hi.len) - (k->len < iv->hi.len);
        }
        if ((lo > 0 || (lo == 0 && iv->lo_incl)) && (hi < 0 || (hi == 0 && iv->hi_incl)))
            return true;
    }
    return false;
}

START_TEST(bounds_hold_every_match)
{
    static const char *const vals[] = {
        "null", "1", "5", "5.5", "6", "{\"$numberLong\": \"7\"}", "NaN", "-Infinity", "\"\"",
        "\"abc\"", "\"abd\"", "\"ab\"", "\"x\"", "[]", "[1, 6]", "[[5]]", "[null]", "{}",
        "{\"b\": 1}", "true", "{\"$regularExpression\": {\"pattern\": \"^abc\", \"options\": \"\"}}",
        "{\"$minKey\": 1}", "{\"$maxKey\": 1}", "[\"abcd\", 2]", "{\"$date\": \"2020-01-01T00:00:00Z\"}",
    };
    static const char *const filters[] = {
        "{\"a\": 5}", "{\"a\": {\"$gt\": 5}}", "{\"a\": {\"$gte\": 5}}", "{\"a\": {\"$lt\": 6}}",
        "{\"a\": {\"$lte\": 6}}", "{\"a\": {\"$in\": [1, \"x\", null, [5]]}}", "{\"a\": null}",
        "{\"a\": {\"%regex\": \"^ab\"}}", "{\"a\": {\"%regex\": \"^abc\"}}", "{\"a\": {\"$regularExpression\": {\"pattern\": \"b\", \"options\": \"\"}}}",
        "{\"a\": []}", "{\"a\": [1, 6]}", "{\"a\": {\"%type\": \"number\"}}",
        "{\"a\": {\"%type\": [\"string\", \"null\"]}}", "{\"a\": {\"$gte\": null}}",
        "{\"a\": {\"$lt\": {\"$maxKey\": 1}}}", "{\"a\": {\"$lte\": {\"$minKey\": 1}}}",
        "{\"a\": {\"$gte\": NaN}}", "{\"a\": {\"$elemMatch\": {\"$gt\": 0, \"$lt\": 2}}}",
        "{\"a\": {\"$gt\": \"ab\", \"$lt\": \"abd\"}}", "{\"a\": {\"$in\": [{\"$regularExpression\": {\"pattern\": \"^ab\", \"options\": \"\"}}, 5]}}",
        "{\"a\": {\"b\": 1}}", "{\"a\": {\"$gt\": {}}}", "{\"a\": true}",
        "{\"a\": {\"$eq\": {\"$regularExpression\": {\"pattern\": \"^abc\", \"options\": \"\"}}}}",
        "{\"a\": {\"$gt\": {\"$date\": \"2019-01-01T00:00:00Z\"}}}",
        "{\"a\": {\"$elemMatch\": {\"$elemMatch\": {\"$gt\": 4}}}}",
        "{\"a\": {\"$gte\": 1, \"$lt\": 6, \"$ne\": 5}}", "{\"a\": {\"$in\": [1, 5, \"x\"], \"$gt\": 1}}",
        "{\"a\": {\"$gt\": \"a\", \"%regex\": \"^ab\"}}", "{\"$and\": [{\"a\": {\"$lte\": 6}}, {\"a\": {\"$gt\": 5}}]}",
        "{\"a\": {\"$elemMatch\": {\"$lt\": 9, \"$elemMatch\": {\"$gt\": 4}}}}",
    };
    struct doc_buf k = {0};
    char json[256];

    for (size_t f = 0; f < sizeof(filters) / sizeof(filters[0]); f++) {
        struct doc_matcher *m = compile(filters[f]);
        struct doc_bounds b, sb;
        int rc = doc_match_bounds(m, "a", &b);
        int src = doc_match_bounds_scalar(m, "a", &sb);

        ck_assert_int_ge(rc, 0);
        ck_assert_int_eq(src, rc);
        for (size_t v = 0; rc == 1 && v < sizeof(vals) / sizeof(vals[0]) + 1; v++) {
            bson_t d;
            bson_iter_t it;
            bool inside = false;

            if (v < sizeof(vals) / sizeof(vals[0]))
                snprintf(json, sizeof(json), "{\"a\": %s}", vals[v]);
            else
                snprintf(json, sizeof(json), "{}");
            doc_of(&d, json);
            if (!doc_match(m, &d)) {
                bson_destroy(&d);
                continue;
            }
            if (!bson_iter_init_find(&it, &d, "a")) {
                key_json(&k, "{\"v\": null}");
                inside = key_inside(&b, &k);
                ck_assert_msg(key_inside(&sb, &k), "%s matches {} outside the scalar bounds",
                              filters[f]);
            } else {
                doc_buf_reset(&k);
                doc_key_add(&k, bson_iter_value(&it), false);
                inside = key_inside(&b, &k);
                if (!BSON_ITER_HOLDS_ARRAY(&it))
                    ck_assert_msg(key_inside(&sb, &k), "%s matches %s outside the scalar bounds",
                                  filters[f], json);
                if (BSON_ITER_HOLDS_ARRAY(&it)) {
                    bson_iter_t el;

                    bson_iter_recurse(&it, &el);
                    while (!inside && bson_iter_next(&el)) {
                        doc_buf_reset(&k);
                        doc_key_add(&k, bson_iter_value(&el), false);
                        inside = key_inside(&b, &k);
                    }
                }
            }
            ck_assert_msg(inside, "%s matches %s outside the bounds", filters[f], json);
            bson_destroy(&d);
        }
        if (rc == 1) {
            doc_bounds_free(&b);
            doc_bounds_free(&sb);
        }
        doc_match_free(m);
    }
    doc_buf_free(&k);
}
END_TEST

/* ---- equalities ---- */

static int collect_eq(void *arg, const char *path, const bson_value_t *v)
{
    char *out = arg;

    snprintf(out + strlen(out), 256 - strlen(out), "%s%s:%d", out[0] ? " " : "", path,
             v->value_type);
    return 0;
}

START_TEST(top_level_equalities)
{
    struct doc_matcher *m = compile(
        "{\"a\": 5, \"b\": {\"$gt\": 1}, \"c\": {\"$eq\": \"x\"}, \"d\": {\"$regularExpression\": {\"pattern\": \"re\", \"options\": \"\"}}, \"e\": [1],"
        " \"$and\": [{\"f\": {\"k\": 2}}, {\"g\": {\"$in\": [1]}}], \"$or\": [{\"h\": 1}],"
        " \"i\": {\"$not\": {\"$eq\": 1}}, \"j\": {\"$eq\": {\"$regularExpression\": {\"pattern\": \"x\", \"options\": \"\"}}}}");
    char out[256] = "";
    bson_value_t v;

    ck_assert_int_eq(doc_match_each_eq(m, collect_eq, out), 0);
    ck_assert_str_eq(out, "a:16 c:2 f:3");
    ck_assert(doc_match_eq_value(m, "c", &v));
    ck_assert(v.value_type == BSON_TYPE_UTF8 && strcmp(v.value.v_utf8.str, "x") == 0);
    ck_assert(doc_match_eq_value(m, "f", &v));
    ck_assert(v.value_type == BSON_TYPE_DOCUMENT);
    ck_assert(!doc_match_eq_value(m, "b", &v));
    ck_assert(!doc_match_eq_value(m, "d", &v));
    ck_assert(!doc_match_eq_value(m, "e", &v));
    ck_assert(!doc_match_eq_value(m, "g", &v));
    ck_assert(!doc_match_eq_value(m, "h", &v));
    ck_assert(!doc_match_eq_value(m, "i", &v));
    ck_assert(!doc_match_eq_value(m, "j", &v));
    ck_assert(!doc_match_eq_value(m, "z", &v));
    doc_match_free(m);
}
END_TEST

Suite *suite_doc_match(void)
{
    Suite *s = suite_create("doc_match");
    TCase *match = tcase_create("match");
    TCase *err = tcase_create("errors");
    TCase *bounds = tcase_create("bounds");

    tcase_add_loop_test(match, manual_examples, 0, (int)(sizeof(cases) / sizeof(cases[0])));
    tcase_add_test(match, filter_freed_after_compile);
    tcase_add_test(match, top_level_equalities);
    suite_add_tcase(s, match);

    tcase_add_loop_test(err, compile_errors, 0, (int)(sizeof(errors) / sizeof(errors[0])));
    tcase_add_test(err, regex_with_nul_refused);
    tcase_add_test(err, invalid_bson_refused);
    tcase_add_test(err, depth_limit);
    suite_add_tcase(s, err);

    tcase_add_test(bounds, bounds_gt_is_to_end_of_numbers);
    tcase_add_test(bounds, bounds_in_sorted_points);
    tcase_add_test(bounds, bounds_regex_prefix);
    tcase_add_test(bounds, bounds_null_and_conjunction_only);
    tcase_add_test(bounds, bounds_ranges_not_intersected_across_elements);
    tcase_add_test(bounds, bounds_scalar_intersects);
    tcase_add_test(bounds, bounds_hold_every_match);
    suite_add_tcase(s, bounds);
    return s;
}
