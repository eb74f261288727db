/* Per-peer fabric choice: which advertised fabrics are reachable, and how
 * policy and scores order them. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "suites.h"
#include "tern_config.h"
#include "transport.h"

static char me[128];

static void node(void)
{
    ck_assert_int_eq(tern_tp_node_id(me, sizeof(me)), 0);
}

START_TEST(node_id_is_stable)
{
    char again[128];

    node();
    ck_assert_uint_gt(strlen(me), 30);
    ck_assert_ptr_nonnull(strchr(me, '.'));
    ck_assert_int_eq(tern_tp_node_id(again, sizeof(again)), 0);
    ck_assert_str_eq(me, again);
}
END_TEST

START_TEST(shm_only_on_the_same_node)
{
    char ads[512], uri[128];

    node();
    snprintf(ads, sizeof(ads), "shm://srv@%s;", me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), 0);
    ck_assert_str_eq(uri, "shm://srv");
    /* Another host, or another network namespace: not reachable. */
    ck_assert_int_eq(tern_tp_select("shm://srv@someone-else.1;", NULL, uri, sizeof(uri)),
                     TERN_ENOENT);
    snprintf(ads, sizeof(ads), "shm://srv@%s9;", me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), TERN_ENOENT);
}
END_TEST

/* An emulated NTB device is reachable on its own host, below shm; a
 * hardware NTB address is not guessed at. */
START_TEST(ntb_emulated_on_the_same_node)
{
    char ads[512], uri[128];

    node();
    snprintf(ads, sizeof(ads), "ntb://emu:rack/2@%s;shm://srv@%s", me, me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), 0);
    ck_assert_str_eq(uri, "shm://srv");
    ck_assert_int_eq(tern_tp_select(ads, "ntb,shm", uri, sizeof(uri)), 0);
    ck_assert_str_eq(uri, "ntb://emu:rack/2");
    snprintf(ads, sizeof(ads), "ntb://emu:rack@other.1;ntb://hw/0@%s", me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), TERN_ENOENT);
}
END_TEST

#if TERN_HAVE_RDMA
/* RDMA needs a NIC at both ends: the peer advertises it only if it has
 * one, and this side takes it only if it has one too (probe says). An
 * emulated NIC ("soft:") reaches its own node only. */
START_TEST(rdma_only_when_both_sides_can)
{
    char ads[512], uri[128], desc[160];
    bool here = tern_tp_probe("rdma", NULL, desc, sizeof(desc)) == 0;

    node();
    snprintf(ads, sizeof(ads), "rdma://soft:127.0.0.1:7000@%s;tcp://x:1@%s", me, me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), 0);
    ck_assert_str_eq(uri, "rdma://soft:127.0.0.1:7000");
    snprintf(ads, sizeof(ads), "rdma://soft:127.0.0.1:7000@other.1");
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), TERN_ENOENT);
    /* A NIC's address, from another node: only with a NIC here. */
    snprintf(ads, sizeof(ads), "rdma://10.0.0.7:7000@other.1");
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), here ? 0 : TERN_ENOENT);
    ck_assert_int_eq(tern_tp_probe("rdma", "soft", desc, sizeof(desc)), 0);
}
END_TEST
#endif

START_TEST(policy_filters_and_orders)
{
    char ads[512], uri[128];

    node();
    snprintf(ads, sizeof(ads), "shm://a@%s;shm://b@%s", me, me);
    ck_assert_int_eq(tern_tp_select(ads, "shm,tcp", uri, sizeof(uri)), 0);
    ck_assert_str_eq(uri, "shm://a");   /* equal scores: the first advertised */
    ck_assert_int_eq(tern_tp_select(ads, "tcp", uri, sizeof(uri)), TERN_ENOENT);
    ck_assert_int_eq(tern_tp_select(ads, "", uri, sizeof(uri)), 0);
}
END_TEST

START_TEST(malformed_ads_are_ignored)
{
    char ads[512], uri[128];

    node();
    ck_assert_int_eq(tern_tp_select("", NULL, uri, sizeof(uri)), TERN_ENOENT);
    ck_assert_int_eq(tern_tp_select("garbage;;@;://@", NULL, uri, sizeof(uri)), TERN_ENOENT);
    ck_assert_int_eq(tern_tp_select("warp://x@y", NULL, uri, sizeof(uri)), TERN_ENOENT);
    snprintf(ads, sizeof(ads), "nonsense;shm://ok@%s", me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), 0);
    ck_assert_str_eq(uri, "shm://ok");
    /* Too small a buffer is an error, not a truncated address. */
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, 5), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_select(NULL, NULL, uri, sizeof(uri)), TERN_EINVAL);
}
END_TEST

Suite *suite_select(void)
{
    Suite *s = suite_create("select");
    TCase *tc = tcase_create("choice");

    tcase_add_test(tc, node_id_is_stable);
    tcase_add_test(tc, shm_only_on_the_same_node);
    tcase_add_test(tc, ntb_emulated_on_the_same_node);
#if TERN_HAVE_RDMA
    tcase_add_test(tc, rdma_only_when_both_sides_can);
#endif
    tcase_add_test(tc, policy_filters_and_orders);
    tcase_add_test(tc, malformed_ads_are_ignored);
    suite_add_tcase(s, tc);
    return s;
}
