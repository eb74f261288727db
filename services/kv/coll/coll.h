/* Collections: Redis's lists, hashes, sets and sorted sets, kept on a pool
 * of their own beside the string store, for the RESP gateway.
 *
 * How they are stored. The collection store is an ordinary kvs (one pool
 * file) whose keys nobody else writes, so it can give them a grammar:
 *
 *   'K' key                 the collection's head: struct kvc_head (its type,
 *                           its generation, its deadline)
 *   'M' gen(8, BE) suffix   one element: a list's element at position `seq`
 *                           (suffix = seq, 8 bytes BE; value = the element),
 *                           a hash's field (suffix = field; value = its value),
 *                           a set's member (value empty) or a sorted set's
 *                           member (value = its score, 8 bytes LE double)
 *
 * An element is one record, so LPUSH, SADD, HSET and ZADD each append one
 * record: none rewrites the collection. Elements name their collection by
 * its generation (the store's version when it was made), not by its key:
 * RENAME rewrites the head only, and a deleted collection's elements are
 * dead at once, whatever is left of them, even when a new collection takes
 * the key.
 *
 * What lives in DRAM. A map from key to collection; for a hash, set or
 * sorted set the set of its members (mset.h), for a sorted set their order
 * too (zskip.h); for a list its first and last positions (the elements
 * themselves are read from the pool by position). All of it is rebuilt
 * from the pool at open. Elements whose collection is gone (a crash in
 * the middle of deleting one) are deleted then; a list whose positions have
 * gaps (a crash in the middle of LREM across segments) is renumbered.
 *
 * Keys and the string store. A key is a string or a collection, never
 * both. The gateway keeps it so; where both turn up (a crash between the
 * two stores' syncs in one batch, or a native client's put of a key that
 * is a collection), the string wins, as a SET would: kvc_open's caller and
 * the gateway drop the collection.
 *
 * Durability is the store's: writes are durable after kvc_sync().
 *
 * One thread owns an engine and everything it hands out. A struct kvc_coll
 * or kvm_member pointer stays valid until the next write to the engine;
 * a value pointer (into the pool) until the next write as well.
 */
#ifndef TERN_KV_COLL_H
#define TERN_KV_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/coll/mset.h"
#include "kv/coll/zskip.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvs;
struct kvc;

enum kvc_type {
    KVC_LIST = 'l',
    KVC_HASH = 'h',
    KVC_SET = 's',
    KVC_ZSET = 'z',
};

/* Longest key of a collection, and longest field or member. */
#define KVC_KEY_MAX 1023u
#define KVC_MEMBER_MAX 1015u

/* One collection (read its fields; change it only through the calls). */
struct kvc_coll {
    enum kvc_type type;
    uint64_t gen;                    /* names its elements */
    uint64_t deadline;               /* Unix ms; 0 = none */
    uint32_t exp_slot;               /* its place among the expiring + 1; 0 = none */
    int64_t head, tail;              /* a list's positions: [head, tail) */
    struct kvm_set members;          /* hash, set, sorted set */
    struct kvz_list order;           /* sorted set */
    struct kvm_member *entry;        /* its entry in the engine's map (the key) */
    struct kvc_coll *next_grave;     /* deleted, elements still being deleted */
};

struct kvc_opts {
    const char *path;                /* pool file (created if absent) */
    uint64_t pool_size;              /* create: 0 = 64 MiB */
    uint32_t seg_size;               /* create: 0 = 1 MiB */
};

/* Open (or create) the collection pool and rebuild everything from it.
 * Errors: kvs_open's; TERN_ECORRUPT for a record of the grammar above that
 * is malformed (a head of an unknown type, a score that is not a number,
 * ...); TERN_ENOMEM. */
int kvc_open(const struct kvc_opts *o, struct kvc **out);

/* Sync, close the pool and free everything. */
void kvc_close(struct kvc *e);

/* The store underneath (stats, one-off reads). */
struct kvs *kvc_store(const struct kvc *e);

/* Make every write so far durable; true if writes wait for it. */
int kvc_sync(struct kvc *e);
bool kvc_dirty(const struct kvc *e);

/* The clock deadlines are judged by (Unix ms); kvs_now_ms by default. */
extern uint64_t (*kvc_now_ms)(void);

/* ---- any collection ---- */

/* The collection at key, or NULL. One whose deadline has passed is
 * deleted here (as Redis's lazy expiry does) and NULL returned. */
struct kvc_coll *kvc_find(struct kvc *e, const void *key, size_t klen);

/* The key of c (in DRAM). */
static inline const void *kvc_key(const struct kvc_coll *c, uint32_t *klen)
{
    *klen = c->entry->len;
    return c->entry->bytes;
}

/* Elements in c. */
uint64_t kvc_len(const struct kvc_coll *c);

/* A new, empty collection at key (which must be free: check kvc_find
 * first). It is written when its first element is; a collection left
 * empty by a call below is deleted by that call (Redis keeps no empty
 * collections). TERN_E2BIG for a key over KVC_KEY_MAX, TERN_EINVAL for an
 * empty one, TERN_ENOMEM. */
int kvc_create(struct kvc *e, const void *key, size_t klen, enum kvc_type type,
               struct kvc_coll **out);

/* Delete c and every element of it (c is freed). Errors: kvs_put's (the
 * head could not be deleted: c is unchanged). Elements whose deletes do not
 * fit (a full pool) are dead anyway and are deleted at the next open. */
int kvc_delete(struct kvc *e, struct kvc_coll *c);

/* Give c another key, which must be free. As kvc_create and kvs_put. */
int kvc_rename(struct kvc *e, struct kvc_coll *c, const void *key, size_t klen);

/* Set c's deadline (0: none). A deadline already past deletes c (1
 * returned: c is freed). Errors: kvs_put's. */
int kvc_set_expiry(struct kvc *e, struct kvc_coll *c, uint64_t at_ms);

/* Delete up to max collections whose deadline has passed; how many. */
unsigned kvc_expire(struct kvc *e, uint64_t now_ms, unsigned max);

/* Collections removed because their deadline passed (by kvc_expire, or
 * when a lookup found them due), since the engine was opened. */
uint64_t kvc_expired(const struct kvc *e);

/* Collections in the engine, and how many of them have a deadline. */
uint64_t kvc_count(const struct kvc *e);
uint64_t kvc_expiring(const struct kvc *e);

/* SCAN over the collections (mset.h's cursor: every collection present
 * for the whole scan is visited at least once). fn must not write. Due
 * collections are skipped. */
typedef void (*kvc_visit_fn)(void *arg, struct kvc_coll *c);
uint64_t kvc_scan(struct kvc *e, uint64_t cursor, unsigned count, kvc_visit_fn fn, void *arg);

/* A collection at random (NULL if none). */
struct kvc_coll *kvc_random(struct kvc *e);

/* Delete every collection. Errors: kvs_clear's. */
int kvc_clear(struct kvc *e);

/* ---- lists: elements by index, 0 .. kvc_len-1 from the head ---- */

/* Add an element at the head (left) or the tail. Errors: TERN_E2BIG for a
 * value the pool cannot hold, TERN_ERANGE at the end of the positions'
 * range (2^63 pushes at one end, or a pool written so), kvs_put's. */
int kvc_list_push(struct kvc *e, struct kvc_coll *c, bool left, const void *v, size_t len);

/* The element at index i (< kvc_len): 0 with *v (in the pool) and *len. */
int kvc_list_at(struct kvc *e, struct kvc_coll *c, uint64_t i, const void **v, uint32_t *len);

/* Overwrite the element at index i. */
int kvc_list_set(struct kvc *e, struct kvc_coll *c, uint64_t i, const void *v, size_t len);

/* Remove n elements (n <= kvc_len) from the head or the tail. Returns 1 if
 * that left c empty (c is deleted and freed), else 0; or kvs_put's errors
 * (the elements removed before it stay removed). */
int kvc_list_drop(struct kvc *e, struct kvc_coll *c, bool left, uint64_t n);

/* Remove the element at index i, moving those after it up by one (O(n)).
 * Returns as kvc_list_drop. */
int kvc_list_remove_at(struct kvc *e, struct kvc_coll *c, uint64_t i);

/* ---- hashes, sets and sorted sets: members ---- */

/* c's member m, or NULL. */
struct kvm_member *kvc_member(const struct kvc_coll *c, const void *m, size_t mlen);

/* A hash field's value: 0 with *v (in the pool) and *len. */
int kvc_hash_value(struct kvc *e, struct kvc_coll *c, const struct kvm_member *m,
                   const void **v, uint32_t *len);

/* Set a hash field: 1 if it is new, 0 if it was replaced. Errors:
 * TERN_E2BIG for a field over KVC_MEMBER_MAX or a value the pool cannot
 * hold, TERN_ENOMEM, kvs_put's: nothing changed, except that a collection
 * left empty (one made by kvc_create for this call) is deleted and freed. */
int kvc_hash_set(struct kvc *e, struct kvc_coll *c, const void *f, size_t flen, const void *v,
                 size_t vlen);

/* Add a set member: 1 if it is new, 0 if it was there. As kvc_hash_set. */
int kvc_set_add(struct kvc *e, struct kvc_coll *c, const void *m, size_t mlen);

/* Give a sorted set's member a score (not NaN), adding it if new: 1 if it
 * is new, 0 if it was there. *out (if not NULL) gets the member. As
 * kvc_hash_set. */
int kvc_zset_put(struct kvc *e, struct kvc_coll *c, const void *m, size_t mlen, double score,
                 struct kvm_member **out);

/* Remove member m of c: 1 if that left c empty (deleted and freed), else
 * 0; or kvs_put's errors (nothing changed). */
int kvc_member_del(struct kvc *e, struct kvc_coll *c, struct kvm_member *m);

#ifdef __cplusplus
}
#endif

#endif
