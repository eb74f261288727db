/* Every Check suite of the test binary; main.c lists them in one table. */
#ifndef TERN_TEST_SUITES_H
#define TERN_TEST_SUITES_H

#include <check.h>

Suite *suite_error(void);
Suite *suite_hist(void);
Suite *suite_conformance(void);
Suite *suite_tcp_wire(void);
Suite *suite_rpc(void);
Suite *suite_rpc_procs(void);
Suite *suite_rpc_auth(void);
Suite *suite_ring(void);
Suite *suite_ntb(void);
Suite *suite_ntb_link(void);
Suite *suite_select(void);
Suite *suite_shm(void);
Suite *suite_shm_direct(void);
Suite *suite_softverbs(void);   /* built with rdma-core's headers only */
Suite *suite_rdma(void);
Suite *suite_kv(void);          /* the services: built with libpmem */
Suite *suite_kv_crash(void);
Suite *suite_kv_procs(void);
Suite *suite_kv_onesided(void);
Suite *suite_resp(void);
Suite *suite_resp_admin(void);
Suite *suite_kv_expiry(void);
Suite *suite_kv_mset(void);
Suite *suite_kv_coll(void);
Suite *suite_kv_zskip(void);
Suite *suite_resp_keys(void);
Suite *suite_resp_coll(void);
Suite *suite_pm(void);
Suite *suite_repl(void);       /* services/repl */
Suite *suite_doc_bson(void);     /* the document service: with libbson and PCRE2 */
Suite *suite_doc_match(void);
Suite *suite_doc_update(void);
Suite *suite_doc_query(void);
Suite *suite_doc_agg(void);
Suite *suite_doc_store(void);
Suite *suite_doc_repl(void);
Suite *suite_doc_cmd(void);
Suite *suite_doc_native(void);  /* with the document service */
Suite *suite_doc_election(void);
Suite *suite_mongo_wire(void);
Suite *suite_doc_crash(void);
Suite *suite_bs_block(void);    /* with libcrypto (services/blocksync) */
Suite *suite_bs_store(void);
Suite *suite_bs_sync(void);
Suite *suite_bs_feed(void);
Suite *suite_cluster(void);     /* with libcurl and json-c (services/cluster) */

#endif
