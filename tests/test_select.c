/* Per-peer fabric choice: which advertised fabrics are reachable, and how
 * policy and scores order them. */
#include <stdio.h>
#include <string.h>

#include "suites.h"
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
    tcase_add_test(tc, policy_filters_and_orders);
    tcase_add_test(tc, malformed_ads_are_ignored);
    suite_add_tcase(s, tc);
    return s;
}
