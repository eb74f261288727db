/* The order of a sorted set: an order-statistic skiplist (Redis's zskiplist,
 * with spans) over the set's members, ordered by score ascending, then by
 * member bytes (memcmp over the common length, the shorter first).
 *
 * Why a skiplist beside the set's hash: ZRANGE by rank, ZRANK and ZPOPMIN
 * need the n-th member and a member's rank, which the spans give in
 * O(log n); score ranges (ZRANGEBYSCORE) start from a descent in O(log n)
 * and then walk the bottom level.
 *
 * Ownership: the list owns its nodes; the members are owned by the set in
 * mset.h. A member in the list points at its node (m->node) and the node at
 * the member, so next/prev/rank start from the member with no lookup.
 * kvz_free() frees the nodes without reading the members, so the set may
 * free its members before or after.
 *
 * Members must be distinct by bytes (as in a set): two equal keys would make
 * the order ambiguous. Scores are never NaN (the caller refuses it); -inf
 * and +inf are valid.
 *
 * Threads: a list belongs to the one thread that owns its store; nothing
 * here locks. Node levels come from a xorshift generator with a fixed seed
 * in thread-local state, so runs are reproducible and stores owned by
 * different threads do not share it. */
#ifndef TERN_KV_ZSKIP_H
#define TERN_KV_ZSKIP_H

#include <stdbool.h>
#include <stdint.h>

#include "mset.h"

#define KVZ_MAX_LEVEL 32             /* enough for 4^32 members at p = 1/4 */

struct kvz_node;

struct kvz_list {                    /* opaque to callers beyond these fields */
    struct kvz_node *head;           /* sentinel with KVZ_MAX_LEVEL levels, no member */
    struct kvz_node *tail;           /* last node or NULL */
    uint64_t len;
    int level;                       /* levels in use, >= 1 */
};

/* 0 or TERN_ENOMEM. */
int kvz_init(struct kvz_list *z);
/* Frees the nodes, never the members (their node pointers are left stale). */
void kvz_free(struct kvz_list *z);

/* Insert m at m->score; sets m->node. 0 or TERN_ENOMEM (nothing changed).
 * m must not be in z. */
int kvz_insert(struct kvz_list *z, struct kvm_member *m);
/* Remove m (in z) and free its node; m->node = NULL. */
void kvz_delete(struct kvz_list *z, struct kvm_member *m);
/* Move m (in z) to a new score: in place when the order does not change
 * (Redis's zslUpdateScore), else unlinked and relinked in its own node.
 * Allocates nothing, so it always returns 0; the int is kept so a caller
 * checks it like the others. */
int kvz_update(struct kvz_list *z, struct kvm_member *m, double score);

/* m's 0-based rank; m must be in z. */
uint64_t kvz_rank(const struct kvz_list *z, const struct kvm_member *m);
/* The member at a 0-based rank, or NULL if rank >= len. */
struct kvm_member *kvz_at(const struct kvz_list *z, uint64_t rank);
/* Neighbours of m (in a list), or NULL at the ends. */
struct kvm_member *kvz_next(const struct kvm_member *m);
struct kvm_member *kvz_prev(const struct kvm_member *m);
/* NULL when empty. */
struct kvm_member *kvz_first(const struct kvz_list *z);
struct kvm_member *kvz_last(const struct kvz_list *z);
/* The first member with score >= min (> min if excl), or NULL. */
struct kvm_member *kvz_first_from(const struct kvz_list *z, double min, bool excl);
/* The last member with score <= max (< max if excl), or NULL. */
struct kvm_member *kvz_last_to(const struct kvz_list *z, double max, bool excl);

#endif
