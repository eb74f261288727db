/* The document store as one shard of a replication group (services/repl).
 *
 * The store is records (doc_store.h): catalog entries and documents, each a
 * key, a value and a version from the pool's counter. Replication ships
 * those records as they are written, so a replica's pool holds the same
 * records under the same versions as its primary's, and its DRAM state
 * (collections, indexes) is derived from them as recovery derives it:
 *
 * - the tap reports every record the store writes on its own account
 *   (a primary's writes), never one it was told to apply;
 * - doc_store_apply writes a shipped record under its version and brings
 *   the DRAM state along: a catalog record creates the collection or
 *   brings its indexes to the record's list, a document record inserts,
 *   replaces or deletes by _id. Records come in version order (a stream,
 *   or a full copy and then the stream from where the copy began): a
 *   record older than what its key holds does nothing, and so does one
 *   applied again. (A value older than a deletion whose tombstone is gone
 *   would come back, but the order forbids it.) Unique indexes are not
 *   checked (the primary checked them): a full copy taken while the
 *   primary writes may hold a clash for a while, which the records after
 *   it resolve;
 * - doc_store_snapshot walks the live records for a full copy, each
 *   collection's catalog record before its documents, then the sessions'
 *   retryable-write records.
 *
 * Threads: the store's owner makes every call. */
#ifndef TERN_DOC_REPL_H
#define TERN_DOC_REPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct doc_store;
struct repl_store_ops;

/* Called for each record the store writes (key and value are views valid
 * for the call): `tomb` for a deletion. */
typedef void (*doc_tap_fn)(void *arg, bool tomb, const void *key, uint16_t klen,
                           const void *val, uint32_t len, uint64_t version);
void doc_store_set_tap(struct doc_store *s, doc_tap_fn fn, void *arg);

/* The highest version the store holds or handed out (durable once synced,
 * as far as records of it are). */
uint64_t doc_store_version(const struct doc_store *s);

/* New versions from now on above v. */
void doc_store_raise_version(struct doc_store *s, uint64_t v);

/* Write a shipped record (a catalog entry "C" + ns or a document "D" + id
 * + _id key) under `version` (nonzero). 0, or TERN_EPROTO for a record
 * that is not one this store could have written (bad key, BSON that does
 * not validate, a document whose _id is not its key's, a collection id
 * given to two names), TERN_ENOSPC (the pool is full), TERN_E2BIG (over
 * this store's max_doc), TERN_ENOMEM, TERN_EIO. Durable after
 * doc_store_sync. */
int doc_store_apply(struct doc_store *s, bool tomb, const void *key, size_t klen,
                    const void *val, size_t len, uint64_t version);

/* Empty the store: every collection is forgotten (scans on them end) and
 * the pool is made anew. Errors of pm_open; after one the store is
 * unusable. */
int doc_store_wipe(struct doc_store *s);

/* Visit the live records from `cursor` (0: the start) in the order a
 * replica can apply them: fn returns 0 to go on, nonzero to stop before
 * that record (it was not taken). *next is where to resume, 0 once every
 * record was visited. TERN_ERANGE past 2^31 collections or 2^32 slots. */
typedef int (*doc_snap_fn)(void *arg, const void *key, size_t klen, const void *val,
                           uint32_t len, uint64_t version);
int doc_store_snapshot(struct doc_store *s, uint64_t cursor, doc_snap_fn fn, void *arg,
                       uint64_t *next);

/* The group's view of the store (ctx = the struct doc_store). */
extern const struct repl_store_ops doc_repl_ops;

#endif
