/* Record checksums (pm_record.h). */
#include <xxhash.h>

#include "pm_record.h"

uint32_t pm_sum(const void *p, size_t n)
{
    return (uint32_t)XXH3_64bits(p, n);
}

/* A record's checksum is the hash of its body (everything from key_len on:
 * the rest of the header, key, value) XORed with a hash of its version
 * seeded with its value length. The version enters alone so that it can be
 * changed without reading the body: a lessee sums its record with its own
 * intent id in the version field, and the pool swaps in the real version
 * in O(1) (pm_lease_append), never reading the value the client wrote. */
uint32_t pm_rec_meta_sum(uint64_t version, uint32_t val_len)
{
    return (uint32_t)XXH3_64bits_withSeed(&version, sizeof(version), val_len);
}

uint32_t pm_rec_sum(const struct pm_rec *r)
{
    const uint8_t *body = (const uint8_t *)&r->key_len;

    return pm_sum(body, sizeof(*r) - offsetof(struct pm_rec, key_len) + r->key_len +
                            r->val_len) ^
           pm_rec_meta_sum(r->version, r->val_len);
}

uint32_t pm_rec_sum_of(const struct pm_rec *r)
{
    return pm_rec_sum(r);
}

