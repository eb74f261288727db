/* The DRAM index of a key-value store: a chained hash table from key to the
 * key's newest record in the pool. Keys are not copied into DRAM; a lookup
 * compares against the key in the record. Entries live in one array and
 * chain by index, so nothing is allocated per key once the array has grown.
 *
 * Deleted keys keep an entry pointing at their tombstone while older
 * records of the key still lie in the pool (n_old counts them): dropping the
 * tombstone earlier would let an old value come back at recovery. */
#ifndef TERN_KV_INDEX_H
#define TERN_KV_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "pm/pm.h"

#define KV_TOMB (1ull << 63)         /* loc flag: the key's newest record is a tombstone */
#define KV_FREE UINT64_MAX           /* loc of an unused entry */

struct kv_ent {
    uint64_t hash;
    uint64_t loc;                    /* pm_loc | KV_TOMB, or KV_FREE */
    uint32_t next;                   /* next entry in the chain + 1; 0 ends it */
    uint32_t n_old;                  /* older records of this key still in the pool */
    uint64_t base_ver;               /* n_old counts records from this version on: a
                                      * key written again after its entry was retired
                                      * does not count the records of its past life */
    uint32_t wslot;                  /* its bucket in the index window + 1; 0 = none */
    uint32_t gen;                    /* the store's sync generation when its newest
                                      * record was written: while it is the current
                                      * one, nobody was told of that record */
    uint64_t old_loc;                /* an older record of the key, superseded by a
                                      * durable one: a slot a PUT may rewrite in
                                      * place (0 = none; no record lies at 0) */
};

struct kv_index {
    uint32_t *buckets;               /* first entry + 1; 0 = empty */
    uint32_t mask;                   /* buckets - 1 */
    struct kv_ent *ents;
    uint32_t cap, top;               /* entries allocated, entries ever used */
    uint32_t free_head;              /* free list through next (+1) */
    uint32_t n;                      /* entries in use */
};

int kv_index_init(struct kv_index *ix, uint32_t buckets);
void kv_index_free(struct kv_index *ix);

/* The entry for key (hash `h`), or NULL. */
struct kv_ent *kv_index_find(const struct kv_index *ix, const struct pm_pool *pool,
                             uint64_t h, const void *key, uint16_t klen);

/* Make sure the next kv_index_add() needs no memory. 0 or TERN_ENOMEM. */
int kv_index_reserve(struct kv_index *ix);

/* A new entry for hash `h` (the caller sets loc), or NULL without memory.
 * May move entries: pointers from earlier calls become stale. */
struct kv_ent *kv_index_add(struct kv_index *ix, uint64_t h);

/* Unlink and free an entry. */
void kv_index_remove(struct kv_index *ix, struct kv_ent *e);

/* Visit whole buckets from `cursor` (Redis's reverse-binary order, stable
 * across growth) until at least `max` entries were seen; returns the next
 * cursor (0: done). fn returns nonzero to stop after the current bucket. */
typedef int (*kv_index_visit_fn)(void *arg, struct kv_ent *e);
uint64_t kv_index_scan(struct kv_index *ix, uint64_t cursor, unsigned max,
                       kv_index_visit_fn fn, void *arg);

#endif
