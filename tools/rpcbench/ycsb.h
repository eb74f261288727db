/* YCSB core workloads for rpcbench kv: the operation mixes and the request
 * distributions of YCSB's CoreWorkload, written after its generators.
 *
 *   ZipfianGenerator     Gray et al., "Quickly generating billion-record
 *                        synthetic databases" (SIGMOD 1994), as in YCSB;
 *   ScrambledZipfian     a zipfian over 10^10 items (zeta precomputed for
 *                        0.99), FNV-64 hashed onto [min, max]: the popular
 *                        items are spread over the key space;
 *   SkewedLatest         last - zipfian(last): the newest keys are hottest.
 */
#ifndef RPCBENCH_YCSB_H
#define RPCBENCH_YCSB_H

#include <stdbool.h>
#include <stdint.h>

#define YCSB_ZIPF_THETA 0.99

/* xoshiro256** seeded through splitmix64. */
struct ycsb_rng {
    uint64_t s[4];
};

void ycsb_rng_seed(struct ycsb_rng *r, uint64_t seed);
uint64_t ycsb_rng_next(struct ycsb_rng *r);
/* Uniform in [0, 1). */
double ycsb_rng_double(struct ycsb_rng *r);
/* Uniform in [0, n). */
uint64_t ycsb_rng_below(struct ycsb_rng *r, uint64_t n);

/* YCSB's Utils.fnvhash64: FNV-1a over the 8 bytes, low first, made
 * non-negative as a Java long. */
uint64_t ycsb_fnv64(uint64_t v);

/* sum_{i=from}^{n-1} 1 / (i + 1)^theta, added to `sum`. */
double ycsb_zeta(uint64_t from, uint64_t n, double theta, double sum);

struct ycsb_zipf {
    uint64_t base, items;         /* values in [base, base + items) */
    double theta, alpha, zeta2, zetan, eta;
    uint64_t count_for_zeta;      /* items zetan was computed for */
};

/* Zipfian over [min, max]; item min is the most popular. zetan <= 0:
 * computed here (O(items)). */
void ycsb_zipf_init(struct ycsb_zipf *z, uint64_t min, uint64_t max, double theta,
                    double zetan);
/* A value in [min, max]. */
uint64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *r);
/* A value in [min, min + n): the item count may grow between calls (zeta is
 * extended by the new terms only), as YCSB's nextLong(itemcount). */
uint64_t ycsb_zipf_next_n(struct ycsb_zipf *z, struct ycsb_rng *r, uint64_t n);

struct ycsb_scrambled {
    struct ycsb_zipf z;
    uint64_t min, items;
};

/* Scrambled zipfian (theta 0.99) over [min, max]. */
void ycsb_scrambled_init(struct ycsb_scrambled *s, uint64_t min, uint64_t max);
uint64_t ycsb_scrambled_next(struct ycsb_scrambled *s, struct ycsb_rng *r);

struct ycsb_latest {
    struct ycsb_zipf z;
};

/* Skewed-latest over [0, last]: last (the newest key) is hottest. */
void ycsb_latest_init(struct ycsb_latest *l, uint64_t last);
/* `last` may have grown since the previous call. Returns a value in (0, last]
 * (last itself when last == 0). */
uint64_t ycsb_latest_next(struct ycsb_latest *l, struct ycsb_rng *r, uint64_t last);

enum ycsb_op {
    YCSB_READ,
    YCSB_UPDATE,
    YCSB_INSERT,
    YCSB_RMW,        /* read, then write the same key: one operation */
};

/* An operation mix: proportions add up to 1. */
struct ycsb_workload {
    const char *name;            /* "A".."F", "get", "put" */
    double read, update, insert, rmw;
    bool latest;                 /* requests follow the latest distribution */
};

/* A, B, C, D, F (case-insensitive), get (100% read), put (100% update). */
const struct ycsb_workload *ycsb_workload_find(const char *name);

/* Draw an operation from the mix. */
enum ycsb_op ycsb_next_op(const struct ycsb_workload *w, struct ycsb_rng *r);

#endif
