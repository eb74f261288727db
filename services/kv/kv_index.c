/* Chained hash index; see kv_index.h. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv_index.h"

int kv_index_init(struct kv_index *ix, uint32_t buckets)
{
    uint32_t n = 1024;

    while (n < buckets && n < (1u << 30))
        n <<= 1;
    memset(ix, 0, sizeof(*ix));
    ix->buckets = calloc(n, sizeof(*ix->buckets));
    ix->ents = malloc(n * sizeof(*ix->ents));
    if (!ix->buckets || !ix->ents) {
        kv_index_free(ix);
        return TERN_ENOMEM;
    }
    ix->mask = n - 1;
    ix->cap = n;
    return 0;
}

void kv_index_free(struct kv_index *ix)
{
    free(ix->buckets);
    free(ix->ents);
    memset(ix, 0, sizeof(*ix));
}

struct kv_ent *kv_index_find(const struct kv_index *ix, const struct pm_pool *pool,
                             uint64_t h, const void *key, uint16_t klen)
{
    for (uint32_t i = ix->buckets[h & ix->mask]; i; i = ix->ents[i - 1].next) {
        struct kv_ent *e = &ix->ents[i - 1];
        pm_loc loc = e->loc & ~KV_TOMB;
        struct pm_rec r;

        if (e->hash != h)
            continue;
        /* Checked: a lessee may have rewritten the record's header. */
        if (pm_rec_read(pool, loc, &r) == 0 && r.key_len == klen &&
            memcmp(pm_rec_key(pm_rec_at(pool, loc)), key, klen) == 0)
            return e;
    }
    return NULL;
}

/* Double the buckets and re-chain every entry (a pause of O(keys), paid
 * once per doubling). */
static int grow_buckets(struct kv_index *ix)
{
    uint32_t n = (ix->mask + 1) * 2;
    uint32_t *b = calloc(n, sizeof(*b));

    if (!b)
        return TERN_ENOMEM;
    for (uint32_t i = 0; i < ix->top; i++) {
        struct kv_ent *e = &ix->ents[i];

        if (e->loc == KV_FREE)
            continue;
        e->next = b[e->hash & (n - 1)];
        b[e->hash & (n - 1)] = i + 1;
    }
    free(ix->buckets);
    ix->buckets = b;
    ix->mask = n - 1;
    return 0;
}

int kv_index_reserve(struct kv_index *ix)
{
    if (ix->n >= ix->mask + 1 && ix->mask < (1u << 30) && grow_buckets(ix) < 0)
        return TERN_ENOMEM;
    if (!ix->free_head && ix->top == ix->cap) {
        struct kv_ent *ents;

        if (ix->cap >= (1u << 31))
            return TERN_ENOMEM;
        ents = realloc(ix->ents, (size_t)ix->cap * 2 * sizeof(*ents));
        if (!ents)
            return TERN_ENOMEM;
        ix->ents = ents;
        ix->cap *= 2;
    }
    return 0;
}

struct kv_ent *kv_index_add(struct kv_index *ix, uint64_t h)
{
    uint32_t i;

    if (kv_index_reserve(ix) < 0)
        return NULL;
    if (ix->free_head) {
        i = ix->free_head - 1;
        ix->free_head = ix->ents[i].next;
    } else {
        i = ix->top++;
    }
    ix->ents[i] = (struct kv_ent){.hash = h, .next = ix->buckets[h & ix->mask]};  /* base_ver 0 */
    ix->buckets[h & ix->mask] = i + 1;
    ix->n++;
    return &ix->ents[i];
}

void kv_index_remove(struct kv_index *ix, struct kv_ent *e)
{
    uint32_t idx = (uint32_t)(e - ix->ents) + 1;
    uint32_t *link = &ix->buckets[e->hash & ix->mask];

    while (*link && *link != idx)
        link = &ix->ents[*link - 1].next;
    if (*link)
        *link = e->next;
    e->loc = KV_FREE;
    e->next = ix->free_head;
    ix->free_head = idx;
    ix->n--;
}

static uint64_t rev64(uint64_t v)
{
    v = ((v >> 1) & 0x5555555555555555ull) | ((v & 0x5555555555555555ull) << 1);
    v = ((v >> 2) & 0x3333333333333333ull) | ((v & 0x3333333333333333ull) << 2);
    v = ((v >> 4) & 0x0f0f0f0f0f0f0f0full) | ((v & 0x0f0f0f0f0f0f0f0full) << 4);
    return __builtin_bswap64(v);
}

uint64_t kv_index_scan(struct kv_index *ix, uint64_t cursor, unsigned max,
                       kv_index_visit_fn fn, void *arg)
{
    uint64_t mask = ix->mask;
    unsigned seen = 0;
    bool stop = false;

    /* Increment the cursor's bits from the top down, so that buckets that
     * split when the table doubles are already behind the cursor. */
    do {
        for (uint32_t i = ix->buckets[cursor & mask]; i;) {
            struct kv_ent *e = &ix->ents[i - 1];

            i = e->next;    /* read first: fn may not remove, but be safe */
            seen++;
            if (fn(arg, e))
                stop = true;
        }
        cursor |= ~mask;
        cursor = rev64(rev64(cursor) + 1);
    } while (cursor && seen < max && !stop);
    return cursor;
}
