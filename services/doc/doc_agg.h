/* Aggregation: a pipeline of stages over a stream of documents.
 *
 * Stages: $match, $group (accumulators $sum $avg $min $max $push $first
 * $last $count; _id an expression: a field path "$a.b", a document of
 * them, or a constant), $sort, $limit, $skip, $project (inclusion,
 * exclusion, renaming {x: "$a.b"}, literals), $unwind (a path, or
 * {path, includeArrayIndex, preserveNullAndEmptyArrays}), $count.
 * Expressions inside $group and $project: field paths, constants, and the
 * operators $add $subtract $multiply $divide $concat $toLower $toUpper
 * $cond $ifNull $size $literal. Anything else is DOC_BadValue or, for a
 * stage tern does not have, MongoDB's "Unrecognized pipeline stage name"
 * (code 40324 in MongoDB; DOC_BadValue here with that message).
 *
 * Memory: $group and $sort hold what they collect; past max_bytes the run
 * fails with DOC_QueryExceededMemoryLimitNoDiskUseAllowed, as MongoDB
 * without allowDiskUse. A compiled pipeline is immutable; each run has its
 * own state. */
#ifndef TERN_DOC_AGG_H
#define TERN_DOC_AGG_H

#include <bson/bson.h>
#include <stddef.h>

#include "doc_err.h"
#include "doc_match.h"
#include "doc_query.h"

#ifdef __cplusplus
extern "C" {
#endif

struct doc_pipeline;

/* `stages`: the pipeline array as a BSON document ("0": {...}, "1": ...). */
int doc_agg_compile(const bson_t *stages, struct doc_pipeline **out, struct doc_err *e);
void doc_agg_free(struct doc_pipeline *p);

/* The pipeline's leading $match (NULL if it does not start with one), and
 * a leading $sort right after it (or first): the caller may have the
 * source produce documents already filtered and in that order (an index)
 * and tell doc_agg_run to skip those stages. */
const struct doc_matcher *doc_agg_leading_match(const struct doc_pipeline *p);
const struct doc_sort *doc_agg_leading_sort(const struct doc_pipeline *p);

/* The source: fills *doc with a view of the next document (valid until
 * the next call); 1, 0 at the end, <0 with *e on error. */
typedef int (*doc_source_fn)(void *arg, bson_t *doc, struct doc_err *e);
/* The sink: takes each result (a view: copy what it keeps); 0 to go on,
 * <0 with *e to stop the run with that error. */
typedef int (*doc_sink_fn)(void *arg, const bson_t *doc, struct doc_err *e);

struct doc_agg_run_opts {
    unsigned skip_leading;      /* stages the source already did (0, 1 or 2,
                                 * per doc_agg_leading_*) */
    size_t max_bytes;           /* 0 = 100 MiB, as MongoDB's per-stage limit */
};

int doc_agg_run(const struct doc_pipeline *p, const struct doc_agg_run_opts *o,
                doc_source_fn src, void *src_arg, doc_sink_fn sink, void *sink_arg,
                struct doc_err *e);

#ifdef __cplusplus
}
#endif

#endif
