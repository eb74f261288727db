/* The index window; see kv_window.h. */
#include <string.h>
#include <xxhash.h>

#include "kv_window.h"
#include "pm/pm_record.h"

uint32_t kvw_bucket_sum(const struct kvw_bucket *b)
{
    return (uint32_t)XXH3_64bits(b, offsetof(struct kvw_bucket, sum));
}

bool kvw_record_valid(const void *rec, uint32_t size, const void *key, uint16_t klen,
                      uint64_t version)
{
    const struct pm_rec *r = rec;

    if (size < sizeof(*r) || r->version != version || r->key_len != klen ||
        r->type != PM_VALUE || pm_rec_size(r->key_len, r->val_len) != size)
        return false;
    return memcmp(pm_rec_key(r), key, klen) == 0 && pm_rec_sum(r) == r->sum;
}

void kv_window_init(struct kv_window *w, void *mem, uint32_t n_blocks, const uint8_t uuid[16])
{
    *w = (struct kv_window){.hdr = mem, .n_blocks = n_blocks,
                            .bk = (struct kvw_bucket *)((uint8_t *)mem + sizeof(struct kvw_hdr))};
    w->hdr->n_blocks = n_blocks;
    memcpy(w->hdr->pool_uuid, uuid, sizeof(w->hdr->pool_uuid));
    __atomic_store_n(&w->hdr->magic, KVW_MAGIC, __ATOMIC_RELEASE);
}

/* Rewrite a bucket under its sequence word. Readers copy buckets while this
 * runs; the odd sequence, and the checksum over the final contents, tell
 * them to read again. */
static void bucket_write(struct kvw_bucket *b, uint32_t tag, pm_loc loc, uint64_t version,
                         uint32_t size)
{
    struct kvw_bucket nb = {.seq = b->seq + 2, .tag = tag, .loc = loc, .version = version,
                            .size = size};

    nb.sum = kvw_bucket_sum(&nb);
    __atomic_store_n(&b->seq, nb.seq - 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);     /* odd before any field */
    __atomic_store_n(&b->tag, tag, __ATOMIC_RELAXED);
    __atomic_store_n(&b->loc, loc, __ATOMIC_RELAXED);
    __atomic_store_n(&b->version, version, __ATOMIC_RELAXED);
    __atomic_store_n(&b->size, size, __ATOMIC_RELAXED);
    __atomic_store_n(&b->sum, nb.sum, __ATOMIC_RELAXED);
    __atomic_store_n(&b->seq, nb.seq, __ATOMIC_RELEASE);
}

void kv_window_set(struct kv_window *w, uint32_t *slot, uint64_t hash, pm_loc loc,
                   uint64_t version, uint32_t size)
{
    if (!w->hdr)
        return;
    if (!*slot) {
        uint32_t first = kvw_block_of(hash, w->n_blocks) * KVW_BUCKETS;

        for (uint32_t i = first; i < first + KVW_BUCKETS; i++)
            if (!w->bk[i].tag) {
                *slot = i + 1;
                w->mirrored++;
                break;
            }
        if (!*slot) {
            w->unplaced++;
            return;
        }
    }
    bucket_write(&w->bk[*slot - 1], kvw_tag(hash), loc, version, size);
}

void kv_window_clear(struct kv_window *w, uint32_t *slot)
{
    if (!w->hdr || !*slot)
        return;
    bucket_write(&w->bk[*slot - 1], 0, 0, 0, 0);
    *slot = 0;
    w->mirrored--;
}
