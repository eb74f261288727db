/* The document store: databases and collections of BSON documents on one
 * persistent-memory pool (services/pm), with their indexes in DRAM.
 *
 * On the pool, everything is a record (key, value, version, checksum):
 *   - a collection's catalog entry: key "C" + "db.coll", value a BSON
 *     document {id: <int64 collection id>, indexes: [{key, name, unique}]}
 *     (a tombstone when the collection is dropped);
 *   - a document: key "D" + collection id (8 bytes, big-endian) + the key
 *     string of its _id (doc_bson.h), value the document's BSON; a
 *     tombstone when it is deleted.
 * A document is one record, so a write is atomic per document: recovery
 * finds the old version or the new one, never a mix. Collection ids are
 * never reused while a record of the old id may remain, so dropping a
 * collection is one tombstone; its documents are dead at once and go as
 * the cleaner reaches them.
 *
 * Indexes: the _id index (unique) and secondary ones, single-field or
 * compound, unique or not, on dotted paths, multikey over arrays (a
 * document has one entry per distinct element; a unique multikey index
 * refuses an element another document has). All are ordered maps of key
 * strings in DRAM, rebuilt at open from the records; index specs persist
 * in the catalog entry.
 *
 * Durability: a write is in the pool when the call returns, durable after
 * the next doc_store_sync(), which makes every write since the last one
 * durable with one flush (group commit: the server runs a batch of
 * commands from all its clients, syncs once, then replies).
 *
 * Threads: one thread owns a store and makes every call. Nothing is
 * global: a process may hold several stores (one per core, later). */
#ifndef TERN_DOC_STORE_H
#define TERN_DOC_STORE_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "doc_err.h"
#include "doc_match.h"
#include "doc_query.h"

#ifdef __cplusplus
extern "C" {
#endif

struct doc_store;
struct doc_coll;

struct doc_store_opts {
    uint64_t pool_size;          /* create: bytes; 0 = 1 GiB (a sparse file) */
    uint32_t seg_size;           /* create: segment bytes; 0 = 32 MiB, so that a
                                  * 16 MiB document fits */
    bool create;
    size_t max_doc;              /* largest document; 0 = 16 MiB, never more than
                                  * a record the pool can hold */
};

int doc_store_open(const char *path, const struct doc_store_opts *o, struct doc_store **out,
                   struct doc_err *e);
void doc_store_close(struct doc_store *s);

/* Make every write since the last sync durable (one flush). */
int doc_store_sync(struct doc_store *s, struct doc_err *e);

/* The largest document a write may store (bytes of BSON). */
size_t doc_store_max_doc(const struct doc_store *s);

/* ---- namespaces ---- */

/* Names: a database is 1-63 bytes without '/', '\\', '.', ' ', '"', '$'
 * or NUL; a collection 1-200 bytes, not starting with "system." nor
 * containing '$' or NUL (DOC_InvalidNamespace otherwise). */

/* The collection, or NULL (DOC_NamespaceNotFound in *e) if it does not
 * exist and `create` is false. Creating writes its catalog entry (durable
 * at the next sync). The pointer stays valid until the collection is
 * dropped or the store closed. */
struct doc_coll *doc_coll_get(struct doc_store *s, const char *db, const char *coll,
                              bool create, struct doc_err *e);

/* Explicit create: DOC_NamespaceExists if it is there. */
int doc_coll_create(struct doc_store *s, const char *db, const char *coll, struct doc_err *e);

/* Drop a collection (its documents and indexes), or a whole database. 1
 * if something was dropped, 0 if there was nothing. */
int doc_coll_drop(struct doc_store *s, const char *db, const char *coll, struct doc_err *e);
int doc_db_drop(struct doc_store *s, const char *db, struct doc_err *e);

/* Visit databases (each once, sorted, with its collections' total size in
 * bytes) and a database's collections (sorted). fn returns 0 to go on. */
int doc_db_each(struct doc_store *s,
                int (*fn)(void *arg, const char *db, uint64_t bytes), void *arg);
int doc_coll_each(struct doc_store *s, const char *db,
                  int (*fn)(void *arg, struct doc_coll *c), void *arg);

const char *doc_coll_name(const struct doc_coll *c);      /* "coll" */
const char *doc_coll_db(const struct doc_coll *c);        /* "db" */
uint64_t doc_coll_count(const struct doc_coll *c);
uint64_t doc_coll_bytes(const struct doc_coll *c);        /* BSON bytes of its documents */

/* ---- indexes ---- */

struct doc_index_spec {
    const bson_t *key;          /* {a: 1, "b.c": -1}: 1..DOC_INDEX_FIELDS_MAX fields */
    const char *name;           /* NULL: MongoDB's default ("a_1_b.c_-1") */
    bool unique;
};
#define DOC_INDEX_FIELDS_MAX 32
#define DOC_INDEXES_MAX 64

/* Build an index over the collection's documents. 1 if created, 0 if the
 * same index (key and options) exists already; DOC_IndexOptionsConflict /
 * DOC_IndexKeySpecsConflict for a name or key taken by a different one;
 * DOC_DuplicateKey if a unique index finds two documents with one key
 * (nothing is created). */
int doc_index_create(struct doc_coll *c, const struct doc_index_spec *spec, struct doc_err *e);

/* By name, or "*" for all but _id_. DOC_IndexNotFound; _id_ cannot be
 * dropped (DOC_InvalidOptions). */
int doc_index_drop(struct doc_coll *c, const char *name, struct doc_err *e);

/* Append the collection's indexes to `arr` (an array being built) as
 * listIndexes shows them: {v: 2, key, name, [unique: true]}. */
int doc_index_list(const struct doc_coll *c, bson_t *arr);

/* ---- writes (atomic per document) ---- */

/* Insert `doc`. It must have an _id (the caller adds an ObjectId first if
 * it has none: doc_new_oid), that is not an array, a regex or undefined
 * (DOC_InvalidIdField). DOC_DuplicateKey, with MongoDB's errmsg ("E11000
 * duplicate key error collection: db.c index: _id_ dup key: { _id: 1 }"),
 * if a unique index has the key; DOC_BSONObjectTooLarge over max_doc;
 * DOC_OutOfDiskSpace when the pool is full. Nothing is written on error. */
int doc_insert(struct doc_coll *c, const bson_t *doc, struct doc_err *e);

/* A document found by a scan, by its position in the collection: valid
 * until the next write to the collection. */
typedef uint64_t doc_ref;

/* Replace the document at `ref` with `doc` (same _id: the caller checked,
 * DOC_ImmutableField otherwise). Unique indexes as in doc_insert. */
int doc_replace(struct doc_coll *c, doc_ref ref, const bson_t *doc, struct doc_err *e);

/* Delete the document at `ref`. */
int doc_delete(struct doc_coll *c, doc_ref ref, struct doc_err *e);

/* ---- reads ---- */

/* The document at `ref`, as a read-only view into the pool (valid until
 * the next write to the collection). */
bool doc_read(struct doc_coll *c, doc_ref ref, bson_t *view);

/* The document whose _id equals `id`: its ref, or 0 if none. */
doc_ref doc_find_id(struct doc_coll *c, const bson_value_t *id);

/* A scan: the documents matching a filter, in an index's order or the _id
 * order, chosen by the planner from the filter's bounds
 * (doc_match_bounds) and the sort: an index whose fields come first in
 * the filter's equalities and ranges, or whose key pattern (or its
 * reverse) is the sort's. A scan is a position in an index (the last key
 * it returned), never a pointer into it, so it survives writes to the
 * collection between calls (a getMore after updates): a document changed
 * meanwhile is seen in its new form if its key is still ahead, at most
 * once per scan. */
struct doc_scan;

struct doc_plan {
    char index[128];            /* the index used; "" = collection scan (_id order) */
    bool sorted;                /* the scan's order is the sort's: no sort stage */
    bool reverse;
    unsigned intervals;
};

/* `sort` may be NULL. The matcher and sort must outlive the scan. */
int doc_scan_open(struct doc_coll *c, const struct doc_matcher *m, const struct doc_sort *sort,
                  struct doc_scan **out, struct doc_plan *plan, struct doc_err *e);

/* The next matching document: 1 with *view (as doc_read) and *ref, 0 at
 * the end. `examined` counts index entries and documents looked at. */
int doc_scan_next(struct doc_scan *sc, bson_t *view, doc_ref *ref);
void doc_scan_close(struct doc_scan *sc);

struct doc_scan_stats {
    uint64_t keys_examined, docs_examined;
};
void doc_scan_stats(const struct doc_scan *sc, struct doc_scan_stats *st);

/* The collection a scan reads (NULL once it was dropped: the scan ends). */
struct doc_coll *doc_scan_coll(const struct doc_scan *sc);

/* ---- retryable writes ----
 *
 * A session's last write (a driver's lsid, 16 bytes, and txnNumber) with
 * its reply, in a record the shard's replicas have too, so that a driver
 * retrying the write here or on the next primary gets the first answer
 * instead of running it twice. At most DOC_SESSIONS_MAX (100000) sessions;
 * those unused for a while go (doc_txn_expire). */

/* 1 with *txn and *reply (a view, valid until the next write) if the
 * session has a record, else 0. */
int doc_txn_get(struct doc_store *s, const uint8_t lsid[16], int64_t *txn, bson_t *reply);

/* No room for another session's record. */
bool doc_txn_full(const struct doc_store *s);

/* Record the session's write (durable at the next sync). */
int doc_txn_put(struct doc_store *s, const uint8_t lsid[16], int64_t txn, const bson_t *reply,
                struct doc_err *e);

/* Drop the records last used before `older_than_ms` (wall clock), looking
 * at up to `budget` of them from where the last call stopped. How many
 * went. */
unsigned doc_txn_expire(struct doc_store *s, int64_t older_than_ms, unsigned budget);

/* ---- the store as a whole ---- */

struct doc_store_info {
    uint64_t pool_size, pool_used, pool_live;
    uint64_t databases, collections, documents, indexes;
    uint64_t recover_ms;        /* time the last open spent rebuilding indexes */
    bool is_pmem;
};
void doc_store_info(const struct doc_store *s, struct doc_store_info *info);

#ifdef __cplusplus
}
#endif

#endif
