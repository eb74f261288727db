/* The test runner: every suite in one table, each test in its own process
 * (Check's fork mode), and a closing "N passed, N failed" line.
 *
 *   tern-tests                 run every suite
 *   tern-tests --suite NAME    run one suite (names below)
 *   CK_RUN_CASE=... / CK_RUN_SUITE=...   Check's own filters also work
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "suites.h"
#include "tern_config.h"

#if TERN_HAVE_RDMA
#include <softverbs.h>
#endif

static const struct {
    const char *name;
    Suite *(*make)(void);
} suites[] = {
    {"error", suite_error},
    {"hist", suite_hist},
    {"conformance", suite_conformance},
    {"tcp_wire", suite_tcp_wire},
    {"rpc", suite_rpc},
    {"rpc_procs", suite_rpc_procs},
    {"rpc_auth", suite_rpc_auth},
    {"ring", suite_ring},
    {"ntb", suite_ntb},
    {"ntb_link", suite_ntb_link},
    {"select", suite_select},
    {"shm", suite_shm},
    {"shm_direct", suite_shm_direct},
#if TERN_HAVE_RDMA
    {"softverbs", suite_softverbs},
    {"rdma", suite_rdma},
#endif
#if TERN_HAVE_SERVICES
    {"kv", suite_kv},
    {"kv_crash", suite_kv_crash},
    {"kv_procs", suite_kv_procs},
    {"kv_onesided", suite_kv_onesided},
    {"resp", suite_resp},
    {"resp_admin", suite_resp_admin},
    {"kv_expiry", suite_kv_expiry},
    {"kv_mset", suite_kv_mset},
    {"kv_coll", suite_kv_coll},
    {"kv_zskip", suite_kv_zskip},
    {"resp_keys", suite_resp_keys},
    {"resp_coll", suite_resp_coll},
    {"pm", suite_pm},
    {"repl", suite_repl},
#endif
#if TERN_HAVE_DOC
    {"doc_bson", suite_doc_bson},
    {"doc_match", suite_doc_match},
    {"doc_update", suite_doc_update},
    {"doc_query", suite_doc_query},
    {"doc_agg", suite_doc_agg},
    {"doc_store", suite_doc_store},
    {"doc_repl", suite_doc_repl},
    {"doc_cmd", suite_doc_cmd},
#endif
#if TERN_HAVE_BLOCKSYNC
    {"bs_block", suite_bs_block},
    {"bs_store", suite_bs_store},
    {"bs_sync", suite_bs_sync},
    {"bs_feed", suite_bs_feed},
#endif
#if TERN_HAVE_CLUSTER
    {"cluster", suite_cluster},
#endif
#if TERN_HAVE_DOC_SERVICE
    {"doc_native", suite_doc_native},
    {"mongo_wire", suite_mongo_wire},
    {"doc_crash", suite_doc_crash},
    {"doc_election", suite_doc_election},
#endif
};

int main(int argc, char **argv)
{
    const char *only = NULL;
    SRunner *sr = NULL;
    int run, failed;

    if (argc == 3 && strcmp(argv[1], "--suite") == 0)
        only = argv[2];
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [--suite NAME]\n", argv[0]);
        return 2;
    }
    /* Tests provoke errors on purpose; keep their logs quiet unless asked. */
    if (!getenv("TERN_LOG"))
        tern_log_set_level(TERN_LOG_ERROR);
    for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++) {
        if (only && strcmp(only, suites[i].name) != 0)
            continue;
        if (!sr)
            sr = srunner_create(suites[i].make());
        else
            srunner_add_suite(sr, suites[i].make());
    }
    if (!sr) {
        fprintf(stderr, "no suite called %s\n", only);
        return 2;
    }
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
#if TERN_HAVE_RDMA
    sv_sweep_dead();    /* segments of the servers the tests SIGKILLed */
#endif
    run = srunner_ntests_run(sr);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("%d passed, %d failed\n", run - failed, failed);
    return failed ? 1 : 0;
}
