/* The key-value engine under the KV service and the RESP gateway: a pool
 * (services/pm) for the data and a DRAM hash index from key to record.
 *
 * One thread owns a store. Values are read in place: a pointer returned by
 * kvs_get() points into the pool and stays valid until the next
 * write on the store (a write may clean segments and move records).
 *
 * Writes are durable only after kvs_sync(); TERN_KV_SYNC makes
 * one write sync by itself. A caller that answers many writes at once (the
 * RESP gateway's pipelined batches) writes them all and syncs once before it
 * replies: one flush for the batch.
 */
#ifndef TERN_KV_STORE_H
#define TERN_KV_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_hash.h"
#include "kv_wire.h"
#include "pm/pm.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tern_kv_flags {
    TERN_KV_SYNC = 1u << 0,          /* durable before the call returns */
};

struct kvs_opts {
    const char *path;                /* pool file (created if absent) */
    uint64_t pool_size;              /* create: 0 = 256 MiB */
    uint32_t seg_size;               /* create: 0 = 1 MiB */
    bool append_only;                /* never rewrite an older record in place */
    uint32_t split_flush;            /* see pm_opts; 0 = its default */
};

struct kvs_stats {
    uint64_t keys;                   /* live keys */
    uint64_t gets, puts, dels, hits;
    uint64_t syncs;                  /* commits that wrote something */
    uint64_t segs_cleaned;
    uint64_t in_place;               /* PUTs written over an older record */
    uint64_t expired;                /* keys removed by kvs_expire */
    struct pm_info pool;
};

struct kvs;

/* Open the pool and rebuild the index from its log (newest version of each
 * key wins, tombstones delete). Errors: those of pm_open and
 * pm_recover (TERN_ECORRUPT, TERN_EBUSY, ...), TERN_ENOMEM. */
int kvs_open(const struct kvs_opts *o, struct kvs **out);

/* Sync, then close the pool and free the index. */
void kvs_close(struct kvs *s);

/* Look a key up. 0 with *val (in the pool), *len and *version set, or
 * TERN_ENOENT (also for a key past its deadline). *val is valid until the
 * next write to the store. */
int kvs_get(struct kvs *s, const void *key, size_t klen,
                      const void **val, uint32_t *len, uint64_t *version);

/* ---- expiry ----
 *
 * A key may have a deadline (Unix milliseconds, wall-clock time, kept in
 * its record: it holds across restarts and replicas). From the deadline
 * on, the key is absent to every call here; kvs_expire() removes it for
 * good (a tombstone) in the background. Any write of the key without a
 * deadline (kvs_put, a one-sided put) drops the deadline, as SET does in
 * Redis. */

/* The clock deadlines are judged by: Unix milliseconds (CLOCK_REALTIME).
 * Tests may point it elsewhere, before opening a store. */
extern uint64_t (*kvs_now_ms)(void);

/* kvs_put with a deadline (0: none, as kvs_put). The value may be
 * PM_EXPIRY_BYTES shorter than kvs_val_max() allows. A deadline already
 * past is written as it is: the key reads as absent. */
int kvs_put_until(struct kvs *s, const void *key, size_t klen, const void *val, size_t len,
                  uint64_t at_ms, unsigned flags, uint64_t *version);

/* The key's deadline: 0 with *at_ms (0: none), or TERN_ENOENT. */
int kvs_expiry(struct kvs *s, const void *key, size_t klen, uint64_t *at_ms);

/* Give a present key a new deadline (rewriting its value), or with at_ms 0
 * take its deadline away (a key without one is left alone, 0). A deadline
 * already past deletes the key. TERN_ENOENT if it is absent; else as
 * kvs_put. */
int kvs_set_expiry(struct kvs *s, const void *key, size_t klen, uint64_t at_ms,
                   unsigned flags, uint64_t *version);

/* Remove up to `max` keys whose deadline is at or before now_ms, soonest
 * first, and return how many (max: more may be due; call again soon). The
 * tombstones are written like kvs_del's (sync them). Only the store's
 * writer calls it: a replica's primary, never a backup, which is sent the
 * primary's deletes. */
unsigned kvs_expire(struct kvs *s, uint64_t now_ms, unsigned max);

/* Live keys that have a deadline (due or not). */
uint64_t kvs_expiring(const struct kvs *s);

/* Set key = val; the value is copied into the pool once. *version (if not
 * NULL) gets the version written. TERN_E2BIG for a key over KV_KEY_MAX
 * or a value over kvs_val_max(); TERN_EINVAL for an empty key;
 * TERN_ENOSPC when the pool is full of live data (nothing is changed). */
int kvs_put(struct kvs *s, const void *key, size_t klen,
                      const void *val, size_t len, unsigned flags, uint64_t *version);

/* Delete a key (writes a tombstone). TERN_ENOENT if it is absent (a key
 * past its deadline is: kvs_expire deletes it). */
int kvs_del(struct kvs *s, const void *key, size_t klen,
                      unsigned flags, uint64_t *version);

/* Make every write so far durable (one flush and commit for all of them). */
int kvs_sync(struct kvs *s);

/* True if writes are waiting for kvs_sync(). */
bool kvs_dirty(const struct kvs *s);

/* Scan in hash order. Start with cursor 0; each call visits whole buckets
 * until at least `max` keys were seen, calling fn for each (a nonzero return
 * stops after the current bucket),
 * and stores in *next the cursor to continue from, 0 when the scan is
 * complete. Every key present for the whole scan is visited at least once,
 * even if the index grows meanwhile. fn must not write to the store. */
typedef int (*tern_kv_scan_fn)(void *arg, const void *key, size_t klen, const void *val,
                               uint32_t len, uint64_t version);
int kvs_scan(struct kvs *s, uint64_t cursor, unsigned max,
                       tern_kv_scan_fn fn, void *arg, uint64_t *next);

/* kvs_scan, but each key's newest record as it is: its type, and its value
 * with the deadline of a PM_EXPIRING one (due or not). For copying a store
 * whole (a replica's snapshot). */
typedef int (*kvs_rec_fn)(void *arg, enum pm_rec_type type, const void *key, size_t klen,
                          const void *val, uint32_t len, uint64_t version);
int kvs_scan_records(struct kvs *s, uint64_t cursor, unsigned max, kvs_rec_fn fn, void *arg,
                     uint64_t *next);

/* Delete every key. */
int kvs_clear(struct kvs *s, unsigned flags);

/* Number of live keys. */
uint64_t kvs_count(const struct kvs *s);

/* Largest value a key of `klen` bytes may have. */
size_t kvs_val_max(const struct kvs *s, size_t klen);

/* Counters and pool figures. */
void kvs_get_stats(const struct kvs *s, struct kvs_stats *st);

/* ---- one-sided access ---- */

/* The pool behind the store (to register it for one-sided access). */
struct pm_pool *kvs_pool(const struct kvs *s);

/* Mirror the index into `mem` (kvw_bytes(n_blocks) zeroed bytes, n_blocks a
 * power of two) from now on, for clients that read it one-sidedly (see
 * kv_window.h). */
void kvs_attach_window(struct kvs *s, void *mem, uint32_t n_blocks);

/* Where the key's newest record lies, to send it from the pool as it is:
 * 0 with *loc, *size (the record's bytes) and *version, or TERN_ENOENT
 * (also for a deleted key). Counts as a GET. */
int kvs_locate(struct kvs *s, const void *key, size_t klen,
                         pm_loc *loc, uint32_t *size, uint64_t *version);

/* Records sent from the pool while the send is in flight: a pinned record
 * is never rewritten in place (BOOM-KV's third condition); pins nest.
 * TERN_ENOBUFS with TERN_KV_PINS records pinned already. */
#define TERN_KV_PINS 64u
int kvs_pin(struct kvs *s, pm_loc loc);
void kvs_unpin(struct kvs *s, pm_loc loc);

/* Keys in the window, and keys left out because their block was full. */
void kvs_window_counts(const struct kvs *s, uint64_t *mirrored,
                                 uint64_t *unplaced);

/* Lease a free segment to a client that writes records into it (cleaning
 * first if free segments run low). A lease never takes one of the free
 * segments the store keeps for its own writes (a sixteenth of the pool, at
 * least two): TERN_ENOSPC when that is all there is. */
int kvs_lease(struct kvs *s, uint32_t *seg);

/* Have fn(arg) called whenever the store runs short of free segments, before
 * it cleans: an owner that keeps segments out of the cleaner's reach
 * (leases) gives back those it can spare there. fn may end leases
 * (kvs_lease_end) but must not write. NULL removes it. */
void kvs_on_short(struct kvs *s, void (*fn)(void *arg), void *arg);

/* End a lease; records not yet committed in it are dropped. */
void kvs_lease_end(struct kvs *s, uint32_t seg);

/* The lessee of `seg` wrote a value record at `off`, with `intent` in its
 * version field (anything else there: TERN_EPROTO, nothing changed): check it, give it a
 * version and make it the key's newest, as kvs_put would. A
 * malformed record is refused by the pool and changes nothing
 * (TERN_EPROTO, TERN_EINVAL). A key whose hash>>32 is outside [range_lo,
 * range_hi] (TERN_EWRONGNODE) or a record that is not a value (TERN_EPROTO)
 * is found only once the record is in, so it ends the lease, dropping the
 * record: *ended says so. */
int kvs_lease_put(struct kvs *s, uint32_t seg, uint32_t off,
                            uint64_t intent, uint32_t range_lo, uint32_t range_hi,
                            unsigned flags, uint64_t *version, bool *ended);

/* ---- replication (services/repl) ----
 *
 * A replicated store's versions are its log positions: the shard's epoch in
 * bits 40..62, a count below (the primary raises the counter to epoch << 40
 * when it takes office). Every write of a new version is reported to the
 * tap, so that the primary can ship it; a backup writes what it is shipped
 * with kvs_apply, under the shipped version. */

/* Called for every write of a new version (put, delete, one-sided put,
 * expiry), with the record's type and value as in the pool, after the index points at it and before it is synced. The key and value
 * are valid only during the call (copy them). Not called for kvs_apply. */
typedef void (*kvs_tap_fn)(void *arg, enum pm_rec_type type, const void *key, uint16_t klen,
                           const void *val, uint32_t len, uint64_t version);
void kvs_set_tap(struct kvs *s, kvs_tap_fn fn, void *arg);

/* The highest version written to the pool (recovered at open). */
uint64_t kvs_version(const struct kvs *s);

/* Let the next new version be above v (an epoch's first). */
void kvs_raise_version(struct kvs *s, uint64_t v);

/* Write a shipped record under its own version: a value (PM_VALUE or
 * PM_EXPIRING, its deadline first in val) or a delete (PM_TOMBSTONE). A key that has this version or a newer one already
 * is left alone (0: shipping a record twice is harmless). A delete of a key
 * that is absent writes a dead tombstone, so that the version is still
 * the pool's highest. Errors: those of kvs_put. */
int kvs_apply(struct kvs *s, enum pm_rec_type type, const void *key, size_t klen,
              const void *val, size_t len, uint64_t version, unsigned flags);

/* Empty the store at once, by making a new pool file in place of the old
 * (a replica about to take a full copy: no tombstones, no versions). 0, or
 * TERN_EBUSY with the index window attached or records pinned; any other
 * error leaves the store unusable (close it). */
int kvs_wipe(struct kvs *s);

#ifdef __cplusplus
}
#endif

#endif
