#include <check.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_servers.h"
#include "procs.h"

static pid_t pids[TEST_KV_SERVERS];
static char uris[TEST_KV_SERVERS][128];
static char pools[TEST_KV_SERVERS][128];
static char dir[64];

/* What the next forked server runs: set before spawning, copied by fork. */
static struct test_kv_srv next;
static const char *next_pool;

static void setup_kv(struct tern_rpc_ep *ep)
{
    struct tern_kv_service_opts o = {
        .pool_path = next_pool, .pool_size = next.pool_size ? next.pool_size : 8u << 20,
        .seg_size = next.seg_size ? next.seg_size : 64u << 10, .range_lo = next.lo,
        .range_hi = next.hi, .append_only = next.append_only, .split_flush = next.split_flush,
    };
    struct tern_kv_service *svc;

    /* The service lives as long as the child, which _exit()s: every write
     * it acknowledged was durable before the reply left. */
    if (tern_kv_service_open(&o, &svc) < 0)
        _exit(7);
    if (tern_rpc_register(ep, tern_kv_service_def(svc)) < 0)
        _exit(8);
    if (next.onesided && tern_kv_service_enable_onesided(svc, ep, &next.os) < 0)
        _exit(9);
}

static void ensure_dir(void)
{
    if (dir[0])
        return;
    test_tmpdir(dir, sizeof(dir), "kvs");
    for (int k = 0; k < TEST_KV_SERVERS; k++)
        snprintf(pools[k], sizeof(pools[k]), "%s/pool%d", dir, k);
}

static const struct tern_rpc_config adaptive = {.mode = TERN_TP_POLL_ADAPTIVE};

void test_kv_start(int i, const struct test_kv_srv *o)
{
    ck_assert(i >= 0 && i < TEST_KV_SERVERS);
    ensure_dir();
    next = *o;
    next_pool = pools[i];
    pids[i] = spawn_rpc_server_at(setup_kv, o->cfg ? o->cfg : &adaptive,
                                  o->listen ? o->listen : "tcp://127.0.0.1:0", uris[i],
                                  sizeof(uris[i]));
    ck_assert_int_gt(pids[i], 0);
}

void test_kv_start_with(int i, const char *listen, void (*setup)(struct tern_rpc_ep *ep))
{
    ck_assert(i >= 0 && i < TEST_KV_SERVERS);
    pids[i] = spawn_rpc_server_at(setup, &adaptive, listen, uris[i], sizeof(uris[i]));
    ck_assert_int_gt(pids[i], 0);
}

bool test_kv_alive(int i)
{
    int status;

    return pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == 0;
}

void test_kv_finish(int i)
{
    pid_t pid = pids[i];

    pids[i] = 0;
    ck_assert_msg(stop_server(pid) == 0, "server %d did not exit cleanly", i);
}

void test_kv_kill(int i)
{
    test_child_kill(&pids[i]);
}

const char *test_kv_uri(int i)
{
    return uris[i];
}

pid_t test_kv_pid(int i)
{
    return pids[i];
}

const char *test_kv_pool(int i)
{
    ensure_dir();
    return pools[i];
}

const char *test_kv_dir(void)
{
    return dir;
}

void test_kv_cleanup(void)
{
    for (int i = 0; i < TEST_KV_SERVERS; i++)
        test_child_kill(&pids[i]);
    if (dir[0])
        test_tmpdir_remove(dir);
    dir[0] = 0;
}
