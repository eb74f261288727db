/* rpcbench get|put: the latency of one-sided operations, transport level. */
#ifndef RPCBENCH_ONESIDED_H
#define RPCBENCH_ONESIDED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct onesided_opts {
    const char *fabric;     /* tcp, shm or ntb (the emulated device) */
    bool put;               /* put, else get */
    bool served;            /* the owner registers its own memory (served path) */
    size_t size;
    uint64_t iters;
    bool json;
    int cpu_client, cpu_server;
};

/* Fork an owner of a region, time `iters` operations on it one at a time,
 * print one line (or JSON). Returns 0, or 1 on failure. */
int run_onesided(const struct onesided_opts *o);

#endif
