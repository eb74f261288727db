/* tern persistent-memory pool.
 *
 * A pool is one file mapped with libpmem. After a 4 KiB header (magic,
 * version, UUID, sizes, checksum) it is cut into equal log segments. Each
 * segment starts with a 64-byte header whose commit word holds the segment's
 * commit point: records are appended after it, made durable, and only then is
 * the commit point advanced by one persisted 8-byte store. Bytes past it are
 * never read, so a crash mid-append leaves no torn record behind. Every
 * header word recovery trusts is checked (pm_layout.h).
 *
 * Records carry a key, a value, a type (value or tombstone), a version from
 * one pool-wide counter (the newest version of a key wins at recovery) and a
 * 32-bit checksum (XXH3) over everything after the checksum field. The pool
 * keeps no index: recovery hands every committed record to the caller, which
 * rebuilds its own (services/kv keeps a DRAM hash). Space comes back by
 * cleaning: the segment with the fewest live bytes has its live records
 * copied to the head and is then freed.
 *
 * On real PM (or with PMEM_IS_PMEM_FORCE=1) durability is cache-line flushes
 * and a fence; on an ordinary file it is msync() of the dirty range.
 *
 * One thread owns a pool and makes every call below, with one exception:
 * pm_help(), which any other thread may call to take a share of a
 * large flush (BOOM-KV's cooperative write-back). Once some thread has
 * called it, the owner cuts a dirty range of opts.split_flush bytes or more
 * into pieces and posts them on a board in the pool; helpers take pieces
 * by an atomic compare-and-swap, the owner runs those nobody took and waits
 * for the rest before it moves a commit point (on PM only briefly: a
 * helper preempted while it holds a piece has the piece flushed again by
 * the owner). Nothing here takes a lock.
 */
#ifndef TERN_PM_H
#define TERN_PM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pm_record.h"

#ifdef __cplusplus
extern "C" {
#endif

struct pm_opts {
    uint64_t size;       /* create: pool bytes (4 segments at least); 0 = 256 MiB */
    uint32_t seg_size;   /* create: segment bytes, a power of two >= 64 KiB; 0 = 1 MiB */
    bool create;         /* create the file if it does not exist */
    uint32_t split_flush;  /* once a thread has called pm_help(), a dirty
                            * range this long or longer is flushed in pieces
                            * helpers may take; 0 = 256 KiB on PM and never on
                            * a file (one msync costs a device flush, whatever
                            * its size), UINT32_MAX = never */
    bool strict_commit;  /* on a file, keep every commit word exact: two
                          * flushes per commit (the records, then the words)
                          * instead of one with the words a commit behind
                          * (PM_SEG_TAIL, pm_layout.h). PM always orders. */
};

struct pm_info {
    uint8_t uuid[16];
    uint32_t version;        /* layout version of the file */
    uint64_t size;           /* pool bytes */
    uint32_t seg_size;
    uint32_t n_segs;
    uint32_t segs_used;      /* segments holding records */
    uint64_t bytes_committed;  /* record bytes below the commit points */
    uint64_t bytes_live;     /* of which still live (as reported by the owner) */
    uint64_t records;        /* committed records (recover/check only) */
    uint64_t max_version;
    bool is_pmem;            /* flushes are cache-line flushes, not msync */
};

struct pm_pool;

/* Open (or create) the pool at `path`. The file is locked against a second
 * opener (TERN_EBUSY). A file that is not a tern pool, or has a bad header,
 * fails with TERN_ECORRUPT and a log line saying what and where. */
int pm_open(const char *path, const struct pm_opts *o, struct pm_pool **out);

/* Unmap and unlock. Records appended but not committed are lost. */
void pm_close(struct pm_pool *p);

/* Recovery: hand every committed record to `fn`, segment by segment: the
 * segments the pool appended to, newest first, then those that were leased.
 * Two records of one key and one version are a cleaner's copy and its
 * original, left by a crash between the copy's commit and the victim's
 * free; the copy comes first, so that a caller that keeps the first of
 * them keeps the copy, and the victim, all dead, is freed by the next
 * clean without a byte to copy. Must be called once after open and before
 * any append. A record
 * that fails its checksum or bounds below a commit point stops the walk with
 * TERN_ECORRUPT (logged with its file offset), with two exceptions: an
 * interrupted rewrite (PM_F_REWRITTEN, sane slot) is skipped, and a
 * bad record in a segment that was leased ends that segment (its commit
 * point is cut back to the record, persistently). fn may stop the walk with
 * a negative return, which is passed back. No lease survives recovery. */
typedef int (*pm_visit_fn)(void *arg, pm_loc loc, const struct pm_rec *r);
int pm_recover(struct pm_pool *p, pm_visit_fn fn, void *arg);

/* The record at `loc` (a location this pool handed out). */
const struct pm_rec *pm_rec_at(const struct pm_pool *p, pm_loc loc);

/* The header of the record at `loc`, copied once and checked: a key of 1
 * to PM_KEY_MAX bytes, a known type, and the whole record inside the bytes
 * its segment holds. 0, or TERN_ECORRUPT for a record a lessee rewrote
 * after the pool took it (its segment may be leased still, and the header
 * may change again at any time: use the copy, never the pool's). */
int pm_rec_read(const struct pm_pool *p, pm_loc loc, struct pm_rec *hdr);

/* Largest value a record with `key_len` bytes of key may hold. */
uint32_t pm_val_max(const struct pm_pool *p, uint32_t key_len);

/* The next version number (one counter per pool, strictly increasing). */
uint64_t pm_next_version(struct pm_pool *p);

/* The highest version handed out or found in the pool. */
uint64_t pm_version(const struct pm_pool *p);

/* Raise the version counter to at least v (the next version is above it). */
void pm_raise_version(struct pm_pool *p, uint64_t v);

/* Append a record: the key and value are copied into the pool once, but the
 * record is neither flushed, durable nor visible to recovery until
 * pm_commit(). TERN_E2BIG for a key over PM_KEY_MAX or a record
 * larger than a segment; TERN_ENOSPC when no segment is free (clean first;
 * tombstones and the cleaner's copies may use reserved segments). */
int pm_append(struct pm_pool *p, enum pm_rec_type type, uint64_t version,
                   const void *key, uint16_t key_len, const void *val, uint32_t val_len,
                   pm_loc *loc);

/* Make every appended (or rewritten) record durable and move the commit
 * points of every segment written to over them, leased ones included.
 * After it returns, recovery sees those records. */
int pm_commit(struct pm_pool *p);

/* From any thread but the owner, at any time while the pool is open: take
 * one piece of a large flush the owner posted and run it (flush and fence,
 * or msync; a failed msync stops the pool's commits, as the owner's own
 * would). 1 if it ran a piece, 0 if none was posted. Never blocks. The
 * caller must have stopped calling it (every call returned) before
 * pm_close(); whoever starts helpers and closes the pool sees to that
 * (ternd joins its helpers before it destroys the service). */
int pm_help(struct pm_pool *p);

/* Bytes the record at `loc` occupies: its slot, at least its own size. */
uint32_t pm_slot_size(const struct pm_pool *p, pm_loc loc);

/* Hybrid update (BOOM-KV): write a new record of the same key over the
 * older record at `loc`, in place, keeping the slot's size so that recovery
 * still walks the segment. The caller guarantees that `loc` is not the
 * key's newest version and that nobody reads it in flight; readers that
 * validate versions and checksums (one-sided GET) retry. The new record
 * must fit the slot (TERN_E2BIG, nothing changed). The old record is
 * marked as being rewritten and that mark persisted before the new bytes go
 * in (records appended but not committed are committed first, so that the
 * newer version the caller relies on is durable by then); the new record is
 * durable at the next pm_commit(). Not in a segment under lease
 * (TERN_EINVAL), nor over another key's record. */
int pm_overwrite(struct pm_pool *p, pm_loc loc, enum pm_rec_type type,
                      uint64_t version, const void *key, uint16_t key_len, const void *val,
                      uint32_t val_len);

/* As pm_overwrite, for a caller that knows the key's newer version is
 * durable already (an earlier pm_commit() covered it): records appended
 * since stay pending rather than being committed first, and only the old
 * record's mark is persisted (if it carries none yet), so that a caller that
 * commits a batch of writes at once keeps one commit per batch. */
int pm_overwrite_behind(struct pm_pool *p, pm_loc loc,
                             enum pm_rec_type type, uint64_t version, const void *key,
                             uint16_t key_len, const void *val, uint32_t val_len);

/* Write a new record of the same key over the record at `loc`, which the
 * caller wrote since it last made its writes durable and has told nobody
 * about (a batch that is committed before it is acknowledged): in place,
 * keeping the slot's size. Allowed over a record past its segment's commit
 * point, which recovery never reads, or over a slot rewritten in place
 * before, whose mark is persisted: a crash mid-rewrite leaves a torn record
 * that recovery skips, and the key falls back to an older version, as for
 * any write not yet acknowledged. Any other record: TERN_EINVAL (append
 * instead); one too small: TERN_E2BIG. Nothing changes on failure; the new
 * record is durable at the next pm_commit(). Not in a leased segment. */
int pm_rewrite_pending(struct pm_pool *p, pm_loc loc,
                            enum pm_rec_type type, uint64_t version, const void *key,
                            uint16_t key_len, const void *val, uint32_t val_len);

/* ---- leased segments: a client appends records by one-sided writes ---- */

/* Take a free segment and open it for one lessee, who writes records into
 * it directly, from byte pm_lease_next() of the segment on to its end.
 * That first byte is a page boundary, past the segment's header: give the
 * lessee access from there on only, and the header stays out of its reach.
 * Nobody else appends there. The segment is marked leased in its header,
 * so recovery knows its records came from outside.
 * TERN_ENOSPC keeps the same reserves as appends of values; TERN_ENOTSUP
 * if a page is more than half a segment. */
int pm_lease(struct pm_pool *p, uint32_t *seg);

/* Where a segment lies in the pool file (page aligned), and how many bytes
 * of records it holds at most (they start at byte 64 of the segment, or a
 * page in if it was leased). */
uint64_t pm_seg_file_off(const struct pm_pool *p, uint32_t seg);
uint32_t pm_seg_room(const struct pm_pool *p);

/* The lessee of `seg` wrote a record at byte `off` of the segment (the
 * segment's append point, pm_lease_next()): a whole record, flags and
 * slot 0, any version of its own, summed (pm_rec_sum_of). The pool
 * copies the header out once, checks it (type, key length, sizes, room,
 * flags and slot 0), swaps `version` in (adjusting the sum without reading
 * the value) and appends it as pm_append would: not durable until
 * pm_commit(). TERN_EPROTO for a malformed header, TERN_EINVAL for a
 * segment not leased or a wrong offset; nothing changes on failure. A
 * record whose body does not match its sum is the lessee's loss: readers
 * refuse it and recovery cuts the segment there. */
int pm_lease_append(struct pm_pool *p, uint32_t seg, uint32_t off, uint64_t version,
                         pm_loc *loc);

/* The byte offset in `seg` where the lessee's next record goes (0 if `seg`
 * is not leased). */
uint32_t pm_lease_next(const struct pm_pool *p, uint32_t seg);

/* End a lease (the lessee is done, gone, or the segment is full): bytes
 * past the commit point are ignored and the segment takes no more records;
 * cleaning may pick it from now on. Call it after the lessee has lost
 * access to the segment. */
void pm_lease_end(struct pm_pool *p, uint32_t seg);

/* The pool's mapping and file, for registering it for one-sided access.
 * pm_fd is an open file description of its own, without the pool's
 * lock: whoever receives a duplicate of it (a shm peer mapping a lease)
 * can neither drop the lock while the owner runs nor keep the pool locked
 * after the owner dies. */
void *pm_base(const struct pm_pool *p);
size_t pm_map_len(const struct pm_pool *p);
int pm_fd(const struct pm_pool *p);

/* Tell the pool that the record at `loc` is no longer live (superseded or
 * deleted); cleaning prefers segments with few live bytes. */
void pm_dead(struct pm_pool *p, pm_loc loc);

/* Free segments left; appends need one when the head fills. */
uint32_t pm_free_segs(const struct pm_pool *p);

/* Segments in the pool. */
uint32_t pm_seg_count(const struct pm_pool *p);

/* The owner's view of a record during cleaning. */
struct pm_cleaner {
    /* Is this record still needed? */
    bool (*is_live)(void *arg, pm_loc loc, const struct pm_rec *r);
    /* A live record was copied to `to` (same version); repoint the index. */
    void (*moved)(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r);
    /* After the victim is freed, for each of its records (live ones were
     * copied first): an old copy or a dead record is gone for good. */
    void (*dropped)(void *arg, pm_loc loc, const struct pm_rec *r);
    void *arg;
};

/* Clean up to `max_segs` segments whose live share is below `max_live_pct`
 * percent, fewest live bytes first: copy their live records to the head,
 * commit, then free them. Returns the number of segments freed (0 if none
 * qualified) or a negative code (TERN_ENOSPC: no room to copy into). */
int pm_clean(struct pm_pool *p, const struct pm_cleaner *c,
                  unsigned max_segs, unsigned max_live_pct);

/* Sizes and counts of an open pool. */
void pm_get_info(const struct pm_pool *p, struct pm_info *info);

/* Make a rename into the directory of `path` durable (fsync of the
 * directory): a file made under another name and renamed into place is
 * there after a crash only once this returns. 0 or TERN_EIO. Shared by
 * every file the services create that way (pools, chains). */
int pm_sync_dir_of(const char *path);

/* Inspect a pool file read-only without opening it for use: the header, and
 * with `deep` every committed record's bounds and checksum. Writes a report
 * to `out` (may be NULL). Returns 0 if the pool is sound, TERN_ECORRUPT with
 * the first bad offset in *bad_off (if not NULL), or another error. */
int pm_check(const char *path, bool deep, FILE *out, struct pm_info *info,
                  uint64_t *bad_off);

#ifdef __cplusplus
}
#endif

#endif
