/* Per-peer fabric choice: which advertised fabrics are reachable, and how
 * policy and scores order them. */
#include <signal.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "suites.h"
#include "tern_config.h"
#include "helpers.h"
#include "rpc.h"
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
 * emulated NIC ("soft:") reaches its own host only (any namespace). */
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
    /* The same host in another network namespace (same boot id, another
     * namespace inode): softverbs reaches it, shm does not. */
    {
        size_t boot = strcspn(me, ".");

        snprintf(ads, sizeof(ads), "shm://x@%.*s.1;rdma://soft:10.1.0.2:7000@%.*s.1",
                 (int)boot, me, (int)boot, me);
        ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), 0);
        ck_assert_str_eq(uri, "rdma://soft:10.1.0.2:7000");
    }
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
    /* An entry without an address: nothing to connect to (the selection
     * once picked "shm://", a URI no fabric takes). */
    snprintf(ads, sizeof(ads), "shm://@%s;ntb://@%s", me, me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), TERN_ENOENT);
    snprintf(ads, sizeof(ads), "shm://@%s;ntb://emu:d@%s", me, me);
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, sizeof(uri)), 0);
    ck_assert_str_eq(uri, "ntb://emu:d");
    /* Too small a buffer is an error, not a truncated address. */
    ck_assert_int_eq(tern_tp_select(ads, NULL, uri, 5), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_select(NULL, NULL, uri, sizeof(uri)), TERN_EINVAL);
}
END_TEST

/* What each fabric's descriptor says of itself, through the public calls
 * that tools and tests use instead of comparing fabric names. */
START_TEST(descriptors_answer_for_every_fabric)
{
    char uri[128], label[32];
    int n = 0;

    for (const char *const *f = tern_tp_fabric_names(); *f; f++, n++) {
        /* Every fabric has a local address, and it names that fabric. */
        ck_assert_int_eq(tern_tp_local_uri(*f, "selftest", uri, sizeof(uri)), 0);
        ck_assert_int_eq(tern_tp_uri_fabric(uri), n);
        /* Its label is the fabric's name, or NAME-emu on an emulated device. */
        tern_tp_uri_label(uri, label, sizeof(label));
        ck_assert_msg(strncmp(label, *f, strlen(*f)) == 0 &&
                          (!label[strlen(*f)] || strcmp(label + strlen(*f), "-emu") == 0),
                      "%s labelled %s", *f, label);
        ck_assert_uint_ne(tern_tp_fabric_caps(*f) & TERN_TP_CAP_MSG, 0);
        /* Offloaded one-sided access needs the operations themselves. */
        if (tern_tp_fabric_caps(*f) & TERN_TP_CAP_RMA_OFFLOAD)
            ck_assert_uint_eq(tern_tp_fabric_caps(*f) & (TERN_TP_CAP_PUT | TERN_TP_CAP_GET),
                              TERN_TP_CAP_PUT | TERN_TP_CAP_GET);
        /* One the fabric names itself. */
        ck_assert_int_eq(tern_tp_local_uri(*f, NULL, uri, sizeof(uri)), 0);
        ck_assert_int_eq(tern_tp_uri_fabric(uri), n);
        /* Too small a buffer, a tag no address can hold. */
        ck_assert_int_eq(tern_tp_local_uri(*f, "selftest", uri, 4), TERN_EINVAL);
    }
    /* The conformance rows follow the matrix, one per fabric. */
    ck_assert_int_eq(n_fabric_cases, n);
    for (int i = 0; i < n_fabric_cases; i++)
        ck_assert_int_eq(test_fabric_row(fabric_cases[i].fabric), i);
    ck_assert_int_eq(tern_tp_local_uri("carrier-pigeon", "x", uri, sizeof(uri)), TERN_ENOFABRIC);
    ck_assert_int_eq(tern_tp_local_uri("shm", "bad name!", uri, sizeof(uri)), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_local_uri("ntb", "bad name!", uri, sizeof(uri)), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_uri_fabric("carrier-pigeon://x"), TERN_ENOFABRIC);
    ck_assert_int_eq(tern_tp_uri_fabric("no-scheme"), TERN_EBADADDR);
    ck_assert_int_eq(tern_tp_uri_fabric("tcp://"), TERN_EBADADDR);
    ck_assert_str_eq(tern_tp_uri_label("ntb://emu:x", label, sizeof(label)), "ntb-emu");
    ck_assert_str_eq(tern_tp_uri_label("ntb://hw", label, sizeof(label)), "ntb");
    ck_assert_str_eq(tern_tp_uri_label("what://x", label, sizeof(label)), "?");
    /* Only the fabrics a session may move to offload one-sided work. */
    ck_assert_uint_eq(tern_tp_fabric_caps("tcp") & TERN_TP_CAP_RMA_OFFLOAD, 0);
    ck_assert_uint_eq(tern_tp_fabric_caps("ntb") & TERN_TP_CAP_RMA_OFFLOAD, 0);
    ck_assert_uint_ne(tern_tp_fabric_caps("shm") & TERN_TP_CAP_RMA_OFFLOAD, 0);
}
END_TEST

/* An emulated NTB device that a SIGKILLed process left behind is swept; one
 * that a live endpoint holds is not. */
START_TEST(sweep_removes_only_orphaned_devices)
{
    struct tern_tp_config cfg = {.fabric = "ntb", .max_msg = 4096};
    struct tern_tp_ep *live;
    char orphan[64], held[64], path[96];
    int status;
    pid_t pid;

    snprintf(orphan, sizeof(orphan), "emu:sweep-orphan-%d", (int)getpid());
    snprintf(held, sizeof(held), "emu:sweep-held-%d", (int)getpid());
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct tern_tp_ep *ep;

        if (tern_tp_open(&cfg, &ep) < 0 || tern_tp_listen(ep, orphan, NULL, 0) < 0)
            _exit(1);
        raise(SIGKILL);     /* no chance to remove its device */
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status));
    snprintf(path, sizeof(path), "/dev/shm/tern-ntb.%s", orphan + 4);
    ck_assert_int_eq(access(path, F_OK), 0);
    ck_assert_int_eq(tern_tp_open(&cfg, &live), 0);
    ck_assert_int_eq(tern_tp_listen(live, held, NULL, 0), 0);
    tern_tp_sweep();
    ck_assert_int_ne(access(path, F_OK), 0);
    snprintf(path, sizeof(path), "/dev/shm/tern-ntb.%s", held + 4);
    ck_assert_int_eq(access(path, F_OK), 0);
    tern_tp_close(live);    /* the last side out removes its own */
    ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

/* A configuration is read as far as its size says: a caller built against
 * an older header never has bytes past its struct taken for new fields. */
START_TEST(config_read_as_far_as_its_size)
{
    struct tern_tp_config c = {.fabric = "tcp", .max_msg = 4096, .conn_buf = 1};
    struct tern_rpc_config r = {.max_msg = 4096, .credits = 4, .max_calls = 1u << 25};
    struct tern_tp_ep *ep;
    struct tern_rpc_ep *rep;

    /* conn_buf 1 is below max_msg: refused when read... */
    ck_assert_int_eq(tern_tp_open(&c, &ep), TERN_EINVAL);
    c.size = sizeof(c);
    ck_assert_int_eq(tern_tp_open(&c, &ep), TERN_EINVAL);
    /* ...and its default when the caller's struct ended before it. */
    c.size = (uint32_t)offsetof(struct tern_tp_config, conn_buf);
    ck_assert_int_eq(tern_tp_open(&c, &ep), 0);
    ck_assert_uint_eq(tern_tp_max_msg(ep), 4096);
    tern_tp_close(ep);
    /* A newer caller's larger struct: what this build knows is read. */
    c.size = (uint32_t)sizeof(c) + 64;
    c.conn_buf = 0;
    ck_assert_int_eq(tern_tp_open(&c, &ep), 0);
    tern_tp_close(ep);
    /* The same for RPC endpoints: 2^25 call slots are refused... */
    ck_assert_int_eq(tern_rpc_open(&r, &rep), TERN_EINVAL);
    /* ...unless the caller's struct predates max_calls. */
    r.size = (uint32_t)offsetof(struct tern_rpc_config, max_calls);
    ck_assert_int_eq(tern_rpc_open(&r, &rep), 0);
    tern_rpc_close(rep);
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
    tcase_add_test(tc, descriptors_answer_for_every_fabric);
    tcase_add_test(tc, sweep_removes_only_orphaned_devices);
    tcase_add_test(tc, config_read_as_far_as_its_size);
    suite_add_tcase(s, tc);
    return s;
}
