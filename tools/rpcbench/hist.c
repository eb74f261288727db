#include <string.h>

#include "hist.h"

void hist_reset(struct hist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

/* Values below HIST_SUB map to themselves; above, the top HIST_SUB_BITS + 1
 * significant bits pick the bin. */
static unsigned bin_of(uint64_t v)
{
    unsigned msb, shift;

    if (v < HIST_SUB)
        return (unsigned)v;
    msb = 63u - (unsigned)__builtin_clzll(v);
    shift = msb - HIST_SUB_BITS;
    return (shift + 1) * HIST_SUB + (unsigned)((v >> shift) - HIST_SUB);
}

/* Midpoint of a bin's value range. */
static uint64_t value_of(unsigned bin)
{
    unsigned shift;

    if (bin < HIST_SUB)
        return bin;
    shift = bin / HIST_SUB - 1;
    return ((uint64_t)(bin % HIST_SUB + HIST_SUB) << shift) + ((1ull << shift) >> 1);
}

void hist_add(struct hist *h, uint64_t v)
{
    unsigned b = bin_of(v);

    if (b >= HIST_BUCKETS)
        b = HIST_BUCKETS - 1;
    h->bins[b]++;
    h->count++;
    h->sum += (double)v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

uint64_t hist_quantile(const struct hist *h, double q)
{
    uint64_t rank, seen = 0;

    if (!h->count)
        return 0;
    rank = (uint64_t)(q * (double)(h->count - 1)) + 1;
    if (rank >= h->count)
        return h->max;
    if (rank == 1)
        return h->min;
    for (unsigned b = 0; b < HIST_BUCKETS; b++) {
        seen += h->bins[b];
        if (seen >= rank) {
            uint64_t v = value_of(b);

            return v < h->min ? h->min : v > h->max ? h->max : v;
        }
    }
    return h->max;
}
