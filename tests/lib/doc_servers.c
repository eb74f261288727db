#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "doc.h"
#include "error.h"
#include "doc_servers.h"
#include "doc_service.h"
#include "procs.h"

static pid_t pids[TEST_DOC_SERVERS];
static char uris[TEST_DOC_SERVERS][128];
static char pools[TEST_DOC_SERVERS][128];
static char dir[64];

/* What the next forked server runs: set before spawning, copied by fork. */
static struct test_doc_srv next;
static const char *next_pool;

static void setup_doc(struct tern_rpc_ep *ep)
{
    struct tern_doc_service_opts o = {
        .pool_path = next_pool, .pool_size = next.pool_size ? next.pool_size : 256u << 20,
        .max_msg = next.max_msg, .seg_size = next.seg_size,
    };
    struct tern_doc_service *svc;

    /* The service lives as long as the child, which _exit()s: every write
     * it acknowledged was durable before the reply left. */
    int rc = tern_doc_service_open(&o, &svc);

    if (rc < 0) {
        fprintf(stderr, "doc server: %s: %s\n", next_pool, tern_strerror(rc));
        _exit(7);
    }
    if (tern_rpc_register(ep, tern_doc_service_def(svc)) < 0 ||
        tern_doc_service_group_commit(svc, ep) < 0)
        _exit(8);
    if (next.onesided && tern_doc_service_enable_onesided(svc, ep, 0) < 0)
        _exit(9);
}

static void ensure_dir(void)
{
    if (dir[0])
        return;
    test_tmpdir(dir, sizeof(dir), "docs");
    for (int k = 0; k < TEST_DOC_SERVERS; k++)
        snprintf(pools[k], sizeof(pools[k]), "%s/pool%d", dir, k);
}

void test_doc_start(int i, const struct test_doc_srv *o)
{
    /* Adaptive: servers sleep when idle, as they share few CPUs with the
     * client. */
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .mode = TERN_TP_POLL_ADAPTIVE,
                                  .max_msg = o->max_msg};

    ck_assert(i >= 0 && i < TEST_DOC_SERVERS);
    ensure_dir();
    next = *o;
    next_pool = pools[i];
    pids[i] = spawn_rpc_server_at(setup_doc, &cfg, o->listen ? o->listen : "tcp://127.0.0.1:0",
                                  uris[i], sizeof(uris[i]));
    ck_assert_int_gt(pids[i], 0);
}

void test_doc_finish(int i)
{
    pid_t pid = pids[i];

    pids[i] = 0;
    ck_assert_msg(stop_server(pid) == 0, "doc server %d did not exit cleanly", i);
}

void test_doc_kill(int i)
{
    test_child_kill(&pids[i]);
}

const char *test_doc_uri(int i)
{
    return uris[i];
}

struct doc_wire_stats test_doc_stats(struct tern_rpc_ep *ep, int i)
{
    struct doc_wire_stats st = {0};
    struct tern_session *s;
    size_t len = 0;

    ck_assert_int_eq(tern_rpc_connect(ep, uris[i], 5000000000ull, &s), 0);
    ck_assert_int_eq(tern_call_sync(s, TERN_DOC_SERVICE_ID, DOC_M_STATS, NULL, 0, &st,
                                    sizeof(st), &len, 5000000000ull), 0);
    ck_assert_uint_eq(len, sizeof(st));
    tern_rpc_disconnect(s);
    return st;
}

void test_doc_cleanup(void)
{
    for (int i = 0; i < TEST_DOC_SERVERS; i++)
        test_child_kill(&pids[i]);
    if (dir[0])
        test_tmpdir_remove(dir);
    dir[0] = 0;
}
