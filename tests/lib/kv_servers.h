/* KV servers of a multi-process test: up to TEST_KV_SERVERS forked
 * processes, server i on pool file i of one folder of the test (made at
 * the first start, removed at any exit of the test process and by the
 * janitor). A server survives being killed and started again on the same
 * pool: that is how recovery is tested. */
#ifndef TERN_TEST_KV_SERVERS_H
#define TERN_TEST_KV_SERVERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kv.h"

#define TEST_KV_SERVERS 4

struct test_kv_srv {
    const char *listen;              /* NULL: tcp://127.0.0.1:0 */
    uint64_t pool_size;              /* 0: 8 MiB */
    uint32_t seg_size;               /* 0: 64 KiB */
    uint32_t lo, hi;                 /* 0, 0: the whole hash space */
    bool append_only;
    uint32_t split_flush;
    const struct tern_rpc_config *cfg;   /* NULL: adaptive (servers sleep when idle:
                                          * they share few CPUs with the client) */
    bool onesided;                   /* serve the one-sided paths */
    struct tern_kv_onesided_opts os;
};

/* Start server i (its pool is created at its first start). */
void test_kv_start(int i, const struct test_kv_srv *o);

/* Start a server of the test's own making as server i: an RPC endpoint on
 * `listen` with whatever `setup` registers (a fake KV service), set up as
 * test_kv_start sets up its servers. */
void test_kv_start_with(int i, const char *listen, void (*setup)(struct tern_rpc_ep *ep));

/* SIGTERM server i; it must exit cleanly (asserted). */
void test_kv_finish(int i);

/* SIGKILL server i. */
void test_kv_kill(int i);

/* Is server i's process still there (not crashed, not reaped)? */
bool test_kv_alive(int i);

/* Server i's bound URI, process, pool file. */
const char *test_kv_uri(int i);
pid_t test_kv_pid(int i);
const char *test_kv_pool(int i);

/* The folder of the pools ("" before the first start or pool asked for). */
const char *test_kv_dir(void);

/* Kill every server and remove the pools and their folder. */
void test_kv_cleanup(void);

#endif
