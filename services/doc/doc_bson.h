/* What every part of the document service needs from BSON values beyond
 * libbson's codec: MongoDB's comparison order, an order-preserving byte
 * encoding of values (the "key string" that indexes and sorts compare
 * with memcmp), and the walk of a dotted path through sub-documents and
 * arrays.
 *
 * Values are libbson's `bson_value_t`; those that come from a bson_iter_t
 * (bson_iter_value) point into the document and live as long as it does.
 * Nothing here allocates except the growing buffer of doc_buf. All of it
 * is pure: any thread, no shared state. */
#ifndef TERN_DOC_BSON_H
#define TERN_DOC_BSON_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- comparison (MongoDB's "BSON comparison order") ----
 *
 * Types rank MinKey < Null (and undefined, and a missing field in a sort)
 * < numbers (int32, int64, double, decimal128 compared by value across
 * types; NaN below every other number, equal to itself) < symbol, string
 * (binary, no collation) < document < array < binary (length, subtype,
 * bytes) < ObjectId < bool < date < timestamp < regex < MaxKey. Documents
 * compare field by field (type rank, name, value), arrays element by
 * element; the shorter one first when one is a prefix of the other. */

/* The rank of a type in that order (equal for types that compare by
 * value with each other). */
int doc_type_rank(bson_type_t t);

/* MongoDB's name of a type, as its error messages and $type give it
 * ("int", "objectId"); "missing" for BSON_TYPE_EOD. Static strings. */
const char *doc_type_name(bson_type_t t);

/* <0, 0, >0 as a sorts before, equal to, after b. */
int doc_val_cmp(const bson_value_t *a, const bson_value_t *b);

/* doc_val_cmp() == 0. */
bool doc_val_eq(const bson_value_t *a, const bson_value_t *b);

/* Whole documents, as doc_val_cmp compares embedded ones. */
int doc_cmp(const bson_t *a, const bson_t *b);

/* ---- a growing byte buffer ---- */

struct doc_buf {
    uint8_t *p;
    size_t len, cap;
    bool oom;                   /* an append failed to grow: contents are short */
};

void doc_buf_free(struct doc_buf *b);
void doc_buf_reset(struct doc_buf *b);        /* len = 0, memory kept */
void doc_buf_add(struct doc_buf *b, const void *p, size_t n);

/* ---- key strings: values as bytes whose memcmp order is doc_val_cmp's ----
 *
 * doc_key_add appends the encoding of one value. The encoding is
 * self-delimiting (no encoding is a proper prefix of another), so the
 * concatenation of the encodings of several values compares as the tuple
 * of those values (compound index keys, multi-field sort keys), and equal
 * values (1, 1.0 and NumberLong(1)) encode to the same bytes: a key
 * string is also the identity of an `_id` in a unique index. The first
 * byte of an encoding is doc_key_rank_byte() of the value's type, so a
 * range "all numbers" is [rank_byte(number), rank_byte(number) + 1).
 * `descending` complements every byte, for a descending field of a
 * compound key or a sort. Decimal128 values are ordered through their
 * double approximation (exact for the values drivers send as decimal of
 * integers and short fractions; two distinct decimals that round to the
 * same double compare equal). */
void doc_key_add(struct doc_buf *b, const bson_value_t *v, bool descending);

/* The first byte every key string of a value of type t starts with. */
uint8_t doc_key_rank_byte(bson_type_t t);

/* The encoding of MinKey/MaxKey: below/above any other value's. */
void doc_key_add_min(struct doc_buf *b);
void doc_key_add_max(struct doc_buf *b);

/* ---- dotted paths ----
 *
 * MongoDB's rule for "a.b.c" on a document: a field name looks into a
 * sub-document; on an array it looks into each element that is a
 * document (and a numeric component such as "a.0.b" also selects that
 * element by position). The walk calls `fn` once for each value the path
 * reaches, in document order, with `in_array` true when the value is an
 * element reached by expanding an array (or is itself the array at the
 * end of the path: it is reported once as a whole, then, if
 * DOC_WALK_EXPAND_LEAF, once per element). A path that reaches nothing
 * calls fn zero times; walks report "missing" by that. fn returns 0 to go
 * on, anything else to stop the walk, which then returns that value. */

enum doc_walk_flags {
    DOC_WALK_EXPAND_LEAF = 1,   /* an array at the end: also each element */
};

typedef int (*doc_walk_fn)(void *arg, const bson_value_t *v, bool in_array);

int doc_walk(const bson_t *doc, const char *path, unsigned flags, doc_walk_fn fn, void *arg);

/* The one value at `path` with no array expansion (sub-documents only, a
 * numeric component indexes an array): true and *out if it is there. */
bool doc_get(const bson_t *doc, const char *path, bson_value_t *out);

/* A 12-byte ObjectId for a new document: 4 bytes of seconds, 5 random
 * bytes fixed per process, a 3-byte counter (libbson's bson_oid_init). */
void doc_new_oid(bson_oid_t *oid);

#ifdef __cplusplus
}
#endif

#endif
