/* The deadlines of a store's expiring keys, soonest first: a binary
 * min-heap of (deadline, index entry), so that removing what is due costs
 * nothing for the keys that are not.
 *
 * The heap is a hint, never the truth: a key set again, deleted or given
 * another deadline leaves its old item behind, and whoever pops an item
 * checks the key's record before acting on it. Stale items are bounded by
 * rebuilding the heap from the index once it holds more items than the
 * index has keys (see kvs_expire). Owned by the store's thread. */
#ifndef TERN_KV_DEADLINE_H
#define TERN_KV_DEADLINE_H

#include <stdbool.h>
#include <stdint.h>

struct kv_deadline {
    uint64_t at_ms;                  /* Unix milliseconds */
    uint32_t ent;                    /* index entry (kv_index.ents) */
    uint32_t reserved;
};

struct kv_deadlines {
    struct kv_deadline *h;
    uint32_t n, cap;
    bool lost;                       /* an item could not be added: rebuild */
};

/* Add an item. Without memory the item is left out and `lost` is set, so
 * that the owner rebuilds the heap once it can: a lost item only delays
 * the key's removal in the background (reads check deadlines themselves). */
void kv_deadline_push(struct kv_deadlines *d, uint64_t at_ms, uint32_t ent);

/* The soonest item, or NULL if there is none. */
static inline const struct kv_deadline *kv_deadline_top(const struct kv_deadlines *d)
{
    return d->n ? &d->h[0] : 0;
}

/* Remove the soonest item (there must be one). */
void kv_deadline_pop(struct kv_deadlines *d);

/* Forget every item (keeps the memory). */
void kv_deadline_clear(struct kv_deadlines *d);

void kv_deadline_free(struct kv_deadlines *d);

#endif
