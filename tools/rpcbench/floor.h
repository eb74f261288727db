/* rpcbench floor: the physical floor of a same-host round trip, a cache
 * line bounced between two processes on two CPUs. */
#ifndef RPCBENCH_FLOOR_H
#define RPCBENCH_FLOOR_H

#include <stdbool.h>
#include <stdint.h>

/* Ping-pong one cache line `iters` times between a child pinned to
 * cpu_b and this process pinned to cpu_a (-1: no pinning); print p50/p99
 * round trip as a table row or JSON. Returns 0 or 1 on failure. */
int run_floor(uint64_t iters, int cpu_a, int cpu_b, bool json);

#endif
