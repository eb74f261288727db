/* Internal to doc_query.c and doc_agg.c: aggregation expressions (field
 * paths, constants, the operators doc_agg.h lists) and the projection
 * engine that both find's projection and $project use.
 *
 * Values computed by an expression (a $concat's string, an object built
 * from expressions) live in a scratch arena that the caller resets between
 * documents: its memory is kept, so a run does not allocate per document.
 * A missing value (a field path that reaches nothing) is a bson_value_t of
 * type BSON_TYPE_EOD. */
#ifndef TERN_DOC_EXPR_H
#define TERN_DOC_EXPR_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

#include "doc_err.h"
#include "doc_query.h"

struct doc_arena_blk;

struct doc_arena {
    struct doc_arena_blk *head;  /* newest first */
    size_t total;                /* bytes of all blocks */
};

void *doc_arena_alloc(struct doc_arena *a, size_t n);
void doc_arena_reset(struct doc_arena *a);
void doc_arena_free(struct doc_arena *a);

struct doc_expr;

/* Compile an expression: a "$path" string, a {$op: args} document, a
 * document or array of expressions, or any other constant. */
int doc_expr_compile(const bson_value_t *v, struct doc_expr **out, struct doc_err *e);
void doc_expr_free(struct doc_expr *x);

/* Evaluate on `root`; *out may point into root, into x, or into `a`. */
int doc_expr_eval(const struct doc_expr *x, const bson_t *root, struct doc_arena *a,
                  bson_value_t *out, struct doc_err *e);

/* MongoDB's truth of a value: false, null, missing and zeros are false. */
bool doc_value_true(const bson_value_t *v);

/* The projection: `agg` for $project (expressions only; no find-only
 * $slice / $elemMatch operators, and an empty spec is an error). */
int doc_proj_compile_x(const bson_t *spec, bool agg, struct doc_proj **out, struct doc_err *e);
/* doc_proj_apply with the caller's scratch arena, reset by the caller. */
int doc_proj_apply_x(const struct doc_proj *p, const bson_t *doc, bson_t *out,
                     struct doc_arena *a, struct doc_err *e);

#endif
