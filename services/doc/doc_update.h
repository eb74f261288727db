/* Updates: a MongoDB update document compiled once and applied to
 * documents, each application building a new document (a document is one
 * atomic record: the store swaps it in whole or not at all).
 *
 * Either a replacement (no field starts with '$'; `_id` may be absent, or
 * equal to the old one's) or operators: $set $unset $inc $mul $min $max
 * $rename $push (with $each, $position, $slice, $sort) $pull $addToSet
 * (with $each) $pop $currentDate $setOnInsert, on dotted paths, creating
 * the sub-documents a path needs. MongoDB's errors, at compile time where
 * the update alone shows them:
 *   - two operators on one path, or a path and its prefix:
 *     DOC_ConflictingUpdateOperators;
 *   - a replacement with a '$' field name: DOC_DollarPrefixedFieldName;
 *   - an unknown operator, an empty one, a non-numeric $inc: DOC_BadValue
 *     (or DOC_TypeMismatch as MongoDB says);
 * and when applied:
 *   - changing `_id`: DOC_ImmutableField;
 *   - $inc on a non-number, $pop on a non-array: DOC_TypeMismatch ($push,
 *     $addToSet and $pull on a non-array: DOC_BadValue, as MongoDB says);
 *   - a path through a scalar: DOC_PathNotViable.
 *
 * A compiled update is immutable; apply may run on any thread. */
#ifndef TERN_DOC_UPDATE_H
#define TERN_DOC_UPDATE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "doc_err.h"
#include "doc_match.h"

#ifdef __cplusplus
extern "C" {
#endif

struct doc_update;

int doc_update_compile(const bson_t *u, struct doc_update **out, struct doc_err *e);
void doc_update_free(struct doc_update *u);

bool doc_update_is_replacement(const struct doc_update *u);

/* Apply to `doc`, writing the result into `out` (an initialised, empty
 * bson_t the caller owns). `inserting` says the document is being created
 * by an upsert ($setOnInsert applies only then); `now_ms` is the time
 * $currentDate writes (milliseconds since the epoch). 1 if the result
 * differs from doc, 0 if it is the same (out is then a copy of doc), <0
 * with *e on error (out is then undefined: reinit it). Fields keep their
 * order; new fields go at the end, as MongoDB puts them. */
int doc_update_apply(const struct doc_update *u, const bson_t *doc, bool inserting,
                     int64_t now_ms, bson_t *out, struct doc_err *e);

/* The document an upsert inserts when nothing matched `query`: the
 * query's top-level equalities (doc_match_each_eq; dotted paths build
 * sub-documents), then the update applied with inserting = true (or, for a
 * replacement, the replacement with the query's _id if it has none). The
 * caller adds an _id if the result still has none. */
int doc_update_upsert_doc(const struct doc_update *u, const struct doc_matcher *query,
                          int64_t now_ms, bson_t *out, struct doc_err *e);

#ifdef __cplusplus
}
#endif

#endif
