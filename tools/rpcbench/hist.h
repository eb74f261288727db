/* A fixed-size log-linear latency histogram (HDR style): 64 sub-buckets per
 * power of two, so any recorded value reads back within 1.6%, and memory
 * stays the same however many samples go in. */
#ifndef RPCBENCH_HIST_H
#define RPCBENCH_HIST_H

#include <stdint.h>

#define HIST_SUB_BITS 6
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_BUCKETS (64u * HIST_SUB)

struct hist {
    uint64_t count;
    uint64_t min, max;
    double sum;
    uint64_t bins[HIST_BUCKETS];
};

/* Empty the histogram. */
void hist_reset(struct hist *h);

/* Record one value (nanoseconds). */
void hist_add(struct hist *h, uint64_t v);

/* Value at quantile q in [0, 1]; 0 if empty. */
uint64_t hist_quantile(const struct hist *h, double q);

#endif
