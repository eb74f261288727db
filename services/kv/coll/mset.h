/* The members of a Redis-style collection (a hash's fields, a set's
 * members, a sorted set's members) in DRAM: a chained hash table of
 * byte strings, keyed by kv_hash() of the bytes.
 *
 * Ownership: the set allocates each member with its bytes inline and owns
 * it. A member's address is stable until kvm_remove() or kvm_free(), since
 * rehashing relinks members instead of copying them, so other structures
 * (a sorted set's skiplist, zskip.h) may keep pointers to members. The
 * score and node fields are the caller's; the set only zeroes them.
 *
 * Sizing: the table doubles when there are more members than buckets and
 * halves when fewer than one per eight buckets (never below 4), rehashing
 * all at once. A failed allocation for a resize keeps the old table, so
 * only the allocation of a member itself can make kvm_add() fail.
 *
 * Threads: one thread owns a set; nothing here locks. */
#ifndef TERN_KV_MSET_H
#define TERN_KV_MSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvz_node;                     /* a sorted set's skiplist node (zskip.h) */

/* One member, allocated by the set with its bytes inline. */
struct kvm_member {
    struct kvm_member *next;         /* the bucket's chain */
    uint64_t hash;                   /* kv_hash() of the bytes */
    double score;                    /* sorted sets: the member's score; else 0 */
    union {
        struct kvz_node *node;       /* sorted sets: its node in the order; else NULL */
        void *data;                  /* a set of keys: what the key names (the user's) */
    };
    uint32_t len;
    uint8_t bytes[];
};

struct kvm_set {
    struct kvm_member **buckets;     /* NULL while empty and never grown */
    uint64_t mask;                   /* buckets - 1 */
    uint64_t n;                      /* members */
};

/* Empty; allocates nothing. */
void kvm_init(struct kvm_set *s);
/* Frees every member and the table; leaves the set empty. */
void kvm_free(struct kvm_set *s);
/* The member with these bytes, or NULL. */
struct kvm_member *kvm_find(const struct kvm_set *s, const void *b, uint32_t len);
/* Add b unless present: 1 and *out = the new member (score 0, node NULL),
 * 0 and *out = the member already there, or TERN_ENOMEM (nothing changed). */
int kvm_add(struct kvm_set *s, const void *b, uint32_t len, struct kvm_member **out);
/* Unlink and free m, which must be in s. */
void kvm_remove(struct kvm_set *s, struct kvm_member *m);
/* A member picked at random, or NULL if the set is empty. rnd returns
 * uniform 64-bit values. Like Redis's dictGetRandomKey it picks a bucket,
 * then a member of its chain, so members on short chains are a little more
 * likely. */
struct kvm_member *kvm_random(const struct kvm_set *s, uint64_t (*rnd)(void));

typedef void (*kvm_visit_fn)(void *arg, struct kvm_member *m);

/* Redis's SCAN over the set: visit whole buckets from cursor (0 starts) in
 * reverse-binary order until at least count members were seen; returns the
 * next cursor, 0 when done. Every member present for the whole scan is
 * visited at least once even if the table grows or shrinks between calls
 * (some may be visited twice). fn must not change the set. */
uint64_t kvm_scan(const struct kvm_set *s, uint64_t cursor, unsigned count, kvm_visit_fn fn,
                  void *arg);
/* Visit every member once; fn must not change the set. */
void kvm_each(const struct kvm_set *s, kvm_visit_fn fn, void *arg);

#endif
