/* Query filters: a MongoDB filter document compiled once into a tree and
 * matched against documents.
 *
 * Operators: $eq $ne $gt $gte $lt $lte $in $nin $and $or $nor $not $exists
 * $type $regex (with $options; PCRE2) $all $elemMatch $size, implicit
 * equality ({a: 5}, {a: /re/}), dotted paths with MongoDB's array rules
 * (a predicate on a path holds if it holds for the array as a whole or for
 * any element the path reaches; $ne and $nin hold when it holds for none),
 * comparisons within a type bracket ({a: {$gt: 5}} never matches a
 * string) and across numeric types. An operator tern does not know, or a
 * malformed one, is DOC_BadValue with MongoDB's message ("unknown
 * operator: $foo"), at compile time.
 *
 * A compiled matcher is immutable and owns its own copy of every value it
 * needs (the filter may be freed after compiling). doc_match may be called
 * from any number of threads at once. */
#ifndef TERN_DOC_MATCH_H
#define TERN_DOC_MATCH_H

#include <bson/bson.h>
#include <stdbool.h>

#include "doc_bson.h"
#include "doc_err.h"

#ifdef __cplusplus
extern "C" {
#endif

struct doc_matcher;

/* Compile `filter` (an empty document matches everything). Nesting deeper
 * than DOC_MATCH_DEPTH_MAX is DOC_BadValue. */
#define DOC_MATCH_DEPTH_MAX 100
int doc_match_compile(const bson_t *filter, struct doc_matcher **out, struct doc_err *e);

bool doc_match(const struct doc_matcher *m, const bson_t *doc);

void doc_match_free(struct doc_matcher *m);

/* ---- what the planner may ask ----
 *
 * The values a field must have for the filter to match, as implied by the
 * predicates on `path` in the filter's top-level conjunction (the filter
 * itself, or the operands of a top-level $and; $or, $nor and $not are
 * never looked into). The answer is a superset: every matching document
 * has at some value of `path` (or an element of it) a key string inside
 * one of the intervals; the caller still runs doc_match on what it finds.
 *
 * Intervals are on key strings (doc_key_add, ascending): [lo, hi] with
 * each end inclusive or not; an empty `lo` is "from the start", an empty
 * `hi` "to the end". They come sorted and disjoint. A $regex with a fixed
 * prefix gives the strings with that prefix; $in gives one point per
 * value; $eq: null gives null and missing (MinKey's neighbour, see
 * doc_bson.h: missing fields index as null). */
struct doc_interval {
    struct doc_buf lo, hi;
    bool lo_incl, hi_incl;
};

struct doc_bounds {
    struct doc_interval *iv;
    unsigned n;
    bool exact;                 /* the intervals say all the filter says about
                                 * `path` (no residual predicate on it) */
    bool point;                 /* every interval is a single value */
};

/* 1 and *b filled if the filter constrains `path`; 0 if it does not (a
 * full scan of the index), <0 on out of memory. */
int doc_match_bounds(const struct doc_matcher *m, const char *path, struct doc_bounds *b);

/* The same for an index with no array on `path` in any document (not
 * multikey): one value then meets every predicate, so their intervals
 * are intersected ({a: {$gt: 1, $lt: 5}} is (1, 5), where
 * doc_match_bounds gives one side). Not for a multikey index. */
int doc_match_bounds_scalar(const struct doc_matcher *m, const char *path, struct doc_bounds *b);
void doc_bounds_free(struct doc_bounds *b);

/* The filter's top-level equality on `path` ({path: v} or {path: {$eq: v}},
 * v not a regex, a document with operators, nor an array), for upserts that
 * seed a new document from the query: true and *v (pointing into the
 * matcher, valid while it lives). */
bool doc_match_eq_value(const struct doc_matcher *m, const char *path, bson_value_t *v);

/* Call fn for each top-level equality (path, value), in filter order, as
 * doc_match_eq_value would return them: what an upsert copies into the
 * document it inserts. fn returns 0 to go on. */
int doc_match_each_eq(const struct doc_matcher *m,
                      int (*fn)(void *arg, const char *path, const bson_value_t *v), void *arg);

#ifdef __cplusplus
}
#endif

#endif
