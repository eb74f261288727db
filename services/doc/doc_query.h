/* What a find does to the documents it matched: projection and sort.
 *
 * Projection: inclusion ({a: 1, "b.c": 1}) or exclusion ({a: 0}), never
 * both except for `_id`, which is included unless excluded; dotted paths
 * reach into sub-documents and arrays of them; {a: {$slice: n}} and
 * {a: {$elemMatch: {...}}} on arrays. A mix of inclusion and exclusion is
 * MongoDB's DOC_Location31254 ("Cannot do exclusion on field b in inclusion
 * projection") or DOC_Location31253 (the reverse); {a: 1, "a.b": 1} is
 * DOC_Location31250 ("Path collision at a.b"); other bad specs BadValue.
 *
 * Sort: {a: 1, b: -1}, keys compared in BSON order; a missing field sorts
 * as null; an array field sorts by its smallest element ascending, by its
 * largest descending (MongoDB's rule). {$natural: 1} is insertion order,
 * which the caller handles (doc_sort_natural).
 *
 * Compiled objects are immutable: any thread. */
#ifndef TERN_DOC_QUERY_H
#define TERN_DOC_QUERY_H

#include <bson/bson.h>
#include <stdbool.h>

#include "doc_bson.h"
#include "doc_err.h"

#ifdef __cplusplus
extern "C" {
#endif

struct doc_proj;

/* An empty spec (or NULL) compiles to NULL: "the whole document". */
int doc_proj_compile(const bson_t *spec, struct doc_proj **out, struct doc_err *e);
void doc_proj_free(struct doc_proj *p);

/* Write the projection of `doc` into `out` (initialised, empty). */
int doc_proj_apply(const struct doc_proj *p, const bson_t *doc, bson_t *out,
                   struct doc_err *e);

struct doc_sort;

#define DOC_SORT_KEYS_MAX 32
int doc_sort_compile(const bson_t *spec, struct doc_sort **out, struct doc_err *e);
void doc_sort_free(struct doc_sort *s);

/* {$natural: 1|-1}: 1 or -1; 0 for any other sort. */
int doc_sort_natural(const struct doc_sort *s);

/* The fields, in order: path and direction (1 or -1), for the planner,
 * which uses an index whose key pattern matches (or is the reverse). */
unsigned doc_sort_nkeys(const struct doc_sort *s);
const char *doc_sort_path(const struct doc_sort *s, unsigned i, int *dir);

/* Append doc's sort key to `key`: a key string (doc_bson.h) whose memcmp
 * order is the sort's order, directions included. Sort by comparing
 * these, with a tie-breaker of the caller's (MongoDB's sort is not
 * stable; tern's is, by the order documents came in). */
void doc_sort_key(const struct doc_sort *s, const bson_t *doc, struct doc_buf *key);

#ifdef __cplusplus
}
#endif

#endif
