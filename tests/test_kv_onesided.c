/* The KV service's one-sided paths across processes (kv.h: "one-sided
 * paths"; kv_service_onesided.c and kv_client_path.c): servers run
 * tern_kv_service with tern_kv_service_enable_onesided in forked children,
 * the test process is the client, on every fabric of the matrix. The
 * suite is assembled here from files that share kv_onesided_fixture.h:
 *
 *   test_kv_onesided.c      (this file) round trips by window reads and PUTs
 *                           into leased segments, TERN_KV_PATH_AUTO, servers
 *                           without the one-sided paths, durability across a
 *                           restart and a kill -9, the client cache
 *   test_kv_os_races.c      torn reads under writers, concurrent writers,
 *                           pushes racing updates in place
 *   test_kv_os_liars.c      a fake server whose window and pushes lie
 *   test_kv_os_leases.c     leases taken back from idle, quiet and dead
 *                           clients; the pool's share of leases
 *   test_kv_os_hostile.c    hostile LEASE/LPUT/PGET requests and lessees
 *   test_kv_os_window.c     the window's own functions, without processes
 *   test_kv_os_push.c       GETs by server push; GETs that fall back to RPC
 *   test_kv_os_pool_lock.c  a lessee and the server's pool lock (shm)
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <stdio.h>
#include <string.h>

#include "kv_onesided_fixture.h"
#include "suites.h"

/* How TERN_KV_PATH_AUTO sends GETs to a server on the fabric (kv_client_path.c
 * get_way): window reads where they cost the server nothing (shm: loads,
 * rdma: the NIC), RPC on tcp and ntb (on ntb both a window read and a push
 * lose to an RPC reply, docs/KV.md). The one place to change when
 * get_way's choice for a fabric changes: AUTO_PUSH for ntb if it pushes. */
enum auto_way { AUTO_RPC, AUTO_WINDOW, AUTO_PUSH };

static enum auto_way auto_get_way(int i)
{
    return fabric_is_fast(i) ? AUTO_WINDOW : AUTO_RPC;
}

/* ---- round trips on every fabric ---- */

START_TEST(roundtrip_every_fabric)
{
    /* The largest nearly fills a lease: 64 KiB less the page before it. */
    static const size_t sizes[] = {8, 1 * KIB, 56 * KIB};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    static uint8_t val[NS][60 * KIB], val2[60 * KIB];
    uint64_t v_rpc[NS], v_os[NS], v1, v2, v3;
    struct tern_kv_onesided_stats st0, st1;
    struct tern_rpc_ep *ep;
    struct tern_kv *os, *rpc;
    size_t rma_max;
    char k[32];
    int kl;

    start_os_server(0, _i, NULL);
    ep = test_rpc_ep(NULL);
    test_rpc_assert_fabric(ep, test_kv_uri(0), _i);
    os = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    rpc = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    rma_max = server_rma_max(ep, 0);

    /* Set up the lease and the mappings. */
    must_os_put(os, ep, "warm", 4, "up", 2, &v1);
    warm_get(os, ep, "warm", 4);

    for (unsigned s = 0; s < NS; s++) {
        test_pattern(val[s], sizes[s], (unsigned)s + 1);
        /* Written by RPC, read one-sidedly. */
        kl = snprintf(k, sizeof(k), "rpc2os-%zu", sizes[s]);
        kv_must_put(rpc, k, (size_t)kl, val[s], sizes[s], &v_rpc[s]);
        st0 = os_stats(os);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
        st1 = os_stats(os);
        CHECK(st1.gets_direct == st0.gets_direct + 1 || !fits_onesided(rma_max, sizes[s]),
              "GET of %zu bytes written by RPC was not one-sided", sizes[s]);
        /* Written one-sidedly, read by RPC and one-sidedly. */
        kl = snprintf(k, sizeof(k), "os2rpc-%zu", sizes[s]);
        if (fits_onesided(rma_max, sizes[s]))
            must_os_put(os, ep, k, (size_t)kl, val[s], sizes[s], &v_os[s]);
        else
            kv_must_put(os, k, (size_t)kl, val[s], sizes[s], &v_os[s]);
        ck_assert_uint_gt(v_os[s], v_rpc[s]);
        kv_expect_get(rpc, k, (size_t)kl, val[s], sizes[s], v_os[s]);
        st0 = os_stats(os);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_os[s]);
        st1 = os_stats(os);
        CHECK(st1.gets_direct == st0.gets_direct + 1 || !fits_onesided(rma_max, sizes[s]),
              "GET of %zu bytes written one-sidedly was not one-sided", sizes[s]);
    }
    /* Everything again, in the other order: still whole, still direct. */
    st0 = os_stats(os);
    for (unsigned s = 0; s < NS; s++) {
        kl = snprintf(k, sizeof(k), "rpc2os-%zu", sizes[s]);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
        kl = snprintf(k, sizeof(k), "os2rpc-%zu", sizes[s]);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_os[s]);
        kv_expect_get(rpc, k, (size_t)kl, val[s], sizes[s], v_os[s]);
    }
    st1 = os_stats(os);
    {
        unsigned want = 0;

        for (unsigned s = 0; s < NS; s++)
            want += fits_onesided(rma_max, sizes[s]) ? 2 : 0;
        CHECK(st1.gets_direct - st0.gets_direct == want, "%llu one-sided GETs of %u",
              (unsigned long long)(st1.gets_direct - st0.gets_direct), want);
    }
    ck_assert_uint_gt(st1.puts, 0);
    ck_assert_uint_gt(st1.leases, 0);
    ck_assert_uint_eq(os_stats(rpc).gets_direct, 0);

    /* Absent and deleted keys: the window does not have them, the server
     * says so. */
    kv_expect_enoent(os, "never-written", 13);
    must_os_put(os, ep, "doomed", 6, "soon gone", 9, &v1);
    kv_expect_get(os, "doomed", 6, "soon gone", 9, v1);
    ck_assert_int_eq(tern_kv_del(os, "doomed", 6), 0);
    kv_expect_enoent(os, "doomed", 6);
    kv_expect_enoent(rpc, "doomed", 6);

    /* Overwrites, by either path and of other sizes: the newest wins. */
    test_pattern(val2, sizeof(val2), 99);
    must_os_put(os, ep, "over", 4, val2, 8, &v1);
    kv_expect_get(os, "over", 4, val2, 8, v1);
    kv_must_put(rpc, "over", 4, val2 + 1, 1 * KIB, &v2);
    ck_assert_uint_gt(v2, v1);
    kv_expect_get(os, "over", 4, val2 + 1, 1 * KIB, v2);
    must_os_put(os, ep, "over", 4, val2 + 2, 16, &v3);
    ck_assert_uint_gt(v3, v2);
    kv_expect_get(os, "over", 4, val2 + 2, 16, v3);
    kv_expect_get(rpc, "over", 4, val2 + 2, 16, v3);
    kv_must_put(rpc, "over", 4, val2 + 3, 8, &v1);     /* in place over an older record */
    ck_assert_uint_gt(v1, v3);
    kv_expect_get(os, "over", 4, val2 + 3, 8, v1);
    /* A deleted key written again one-sidedly comes back. */
    must_os_put(os, ep, "doomed", 6, "back", 4, &v2);
    ck_assert_uint_gt(v2, v1);
    kv_expect_get(os, "doomed", 6, "back", 4, v2);
    tern_kv_close(rpc);
    test_kv_end(ep, os, 1);
}
END_TEST

/* ---- TERN_KV_PATH_AUTO, and servers without the one-sided paths ---- */

START_TEST(auto_path_every_fabric)
{
    static uint8_t val[4 * KIB];
    struct tern_kv_onesided_stats st, st0;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    uint64_t ver[20];
    char k[32];
    int kl;

    start_os_server(0, _i, NULL);
    ep = test_rpc_ep(NULL);
    test_rpc_assert_fabric(ep, test_kv_uri(0), _i);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_AUTO);
    /* 1 KiB and more: values AUTO may write into a lease (kv.h). */
    for (unsigned i = 0; i < 20; i++) {
        kl = snprintf(k, sizeof(k), "auto-%u", i);
        test_pattern(val, sizeof(val), i);
        kv_must_put(kv, k, (size_t)kl, val, 1 * KIB + i * 150, &ver[i]);
        test_rpc_poll_for(ep, 1);
    }
    for (unsigned r = 0; r < 3; r++)
        for (unsigned i = 0; i < 20; i++) {
            kl = snprintf(k, sizeof(k), "auto-%u", i);
            test_pattern(val, sizeof(val), i);
            kv_expect_get(kv, k, (size_t)kl, val, 1 * KIB + i * 150, ver[i]);
        }
    st = os_stats(kv);
    /* PUTs into leases on shm and rdma only. */
    if (fabric_is_fast(_i)) {
        CHECK(st.puts > 0 && st.leases > 0, "%s: AUTO PUTs stayed on RPC (puts %llu, leases %llu)",
              test_fabric_listen(_i), (unsigned long long)st.puts, (unsigned long long)st.leases);
    } else {
        CHECK(st.puts == 0 && st.leases == 0,
              "%s: AUTO PUTs went one-sided (puts %llu, leases %llu)", test_fabric_listen(_i),
              (unsigned long long)st.puts, (unsigned long long)st.leases);
    }
    /* Each of the 60 GETs went the fabric's way (most of them: a torn read
     * or a push that could not be posted ends by RPC), none another way. */
    CHECK(st.gets_direct + st.gets_pushed + st.gets_rpc == 60,
          "%s: %llu direct + %llu pushed + %llu by RPC for 60 GETs", test_fabric_listen(_i),
          (unsigned long long)st.gets_direct, (unsigned long long)st.gets_pushed,
          (unsigned long long)st.gets_rpc);
    switch (auto_get_way(_i)) {
    case AUTO_WINDOW:
        CHECK(st.gets_direct >= 30 && st.gets_pushed == 0,
              "%s: AUTO GETs not from the window (direct %llu, pushed %llu)",
              test_fabric_listen(_i),
              (unsigned long long)st.gets_direct, (unsigned long long)st.gets_pushed);
        break;
    case AUTO_PUSH:
        CHECK(st.gets_pushed >= 30 && st.gets_direct == 0,
              "%s: AUTO GETs not pushed (direct %llu, pushed %llu)", test_fabric_listen(_i),
              (unsigned long long)st.gets_direct, (unsigned long long)st.gets_pushed);
        break;
    case AUTO_RPC:
        CHECK(st.gets_rpc == 60, "%s: AUTO GETs went one-sided (direct %llu, pushed %llu)",
              test_fabric_listen(_i), (unsigned long long)st.gets_direct,
              (unsigned long long)st.gets_pushed);
        break;
    }
    /* Under 1 KiB AUTO PUTs go inline in an RPC, a lease or not. */
    st0 = os_stats(kv);
    for (unsigned i = 0; i < 10; i++) {
        kl = snprintf(k, sizeof(k), "small-%u", i);
        kv_must_put(kv, k, (size_t)kl, val, 8 + i * 100, &ver[i]);
        kv_expect_get(kv, k, (size_t)kl, val, 8 + i * 100, ver[i]);
    }
    CHECK(os_stats(kv).puts == st0.puts, "%s: %llu small AUTO PUTs went one-sided",
          test_fabric_listen(_i), (unsigned long long)(os_stats(kv).puts - st0.puts));
    test_kv_end(ep, kv, 1);
}
END_TEST

/* A server that never enabled the one-sided paths: a one-sided client
 * quietly uses RPC. */
START_TEST(server_without_onesided)
{
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    struct tern_session *s;
    uint64_t v;
    int rc;

    test_kv_start(0, &(struct test_kv_srv){.listen = test_fabric_listen(test_fabric_row("shm"))});
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    for (int i = 0; i < 5; i++) {
        kv_must_put(kv, "plain", 5, "value", 5, &v);
        kv_expect_get(kv, "plain", 5, "value", 5, v);
    }
    ck_assert_uint_eq(os_stats(kv).gets_direct, 0);
    ck_assert_uint_eq(os_stats(kv).puts, 0);
    ck_assert_uint_eq(os_stats(kv).leases, 0);
    s = NULL;
    rc = tern_rpc_connect(ep, test_kv_uri(0), 5 * SEC, &s);
    ck_assert_int_eq(rc, 0);
    rc = tern_call_sync(s, SVC, KV_M_ONESIDED_INFO, NULL, 0, NULL, 0, NULL, 5 * SEC);
    CHECK(rc == TERN_ENOTSUP, "OS_INFO: %s", tern_err_name(rc));
    rc = tern_call_sync(s, SVC, KV_M_LEASE, &(struct kv_lease_req){0},
                        sizeof(struct kv_lease_req), NULL, 0, NULL, 5 * SEC);
    CHECK(rc == TERN_ENOTSUP, "LEASE: %s", tern_err_name(rc));
    tern_rpc_disconnect(s);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- one-sided PUTs survive a restart and a kill -9 ---- */

#define N_DUR 200
#define N_KILL 60

struct expect {
    uint8_t val[2 * KIB];
    size_t len;
    uint64_t version;                /* 0: deleted */
};

static void dur_key(char *k, size_t cap, int *kl, const char *prefix, unsigned i)
{
    *kl = snprintf(k, cap, "%s-%u", prefix, i);
}

static void check_all(struct tern_kv *kv, const struct expect *e, unsigned n,
                      const char *prefix)
{
    char k[32];
    int kl;

    for (unsigned i = 0; i < n; i++) {
        dur_key(k, sizeof(k), &kl, prefix, i);
        if (e[i].version)
            kv_expect_get(kv, k, (size_t)kl, e[i].val, e[i].len, e[i].version);
        else
            kv_expect_enoent(kv, k, (size_t)kl);
    }
}

START_TEST(durable_onesided_puts)
{
    static struct expect dur[N_DUR], killed[N_KILL];
    struct tern_kv_onesided_stats st;
    struct tern_rpc_ep *ep;
    struct tern_kv *os, *rpc;
    struct test_kv_srv o = {.seg_size = 64 * KIB};
    unsigned present = 0, os_puts = 0;
    uint64_t before;
    char k[32];
    int kl;

    start_os_server(0, _i, &o);
    ep = test_rpc_ep(NULL);
    os = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    rpc = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    must_os_put(os, ep, "warm", 4, "up", 2, NULL);
    /* ~1 KiB records in 64 KiB segments: a lease every ~60 PUTs. */
    for (unsigned i = 0; i < N_DUR; i++) {
        dur_key(k, sizeof(k), &kl, "dur", i);
        dur[i].len = 900 + i % 200;
        test_pattern(dur[i].val, dur[i].len, i);
        kv_must_put(os, k, (size_t)kl, dur[i].val, dur[i].len, &dur[i].version);
        os_puts++;
    }
    /* Overwrites one-sided and by RPC, and deletes, in between. */
    for (unsigned i = 0; i < N_DUR; i += 3) {
        dur_key(k, sizeof(k), &kl, "dur", i);
        dur[i].len = 1500 + i % 500;
        test_pattern(dur[i].val, dur[i].len, i + 5000);
        kv_must_put(os, k, (size_t)kl, dur[i].val, dur[i].len, &dur[i].version);
        os_puts++;
    }
    for (unsigned i = 1; i < N_DUR; i += 7) {
        dur_key(k, sizeof(k), &kl, "dur", i);
        dur[i].len = 100;
        test_pattern(dur[i].val, dur[i].len, i + 9000);
        kv_must_put(rpc, k, (size_t)kl, dur[i].val, dur[i].len, &dur[i].version);
    }
    for (unsigned i = 2; i < N_DUR; i += 11) {
        dur_key(k, sizeof(k), &kl, "dur", i);
        ck_assert_int_eq(tern_kv_del(os, k, (size_t)kl), 0);
        dur[i].version = 0;
    }
    /* The last word on some keys is one-sided again. */
    for (unsigned i = 2; i < N_DUR; i += 22) {
        dur_key(k, sizeof(k), &kl, "dur", i);
        dur[i].len = 33;
        test_pattern(dur[i].val, dur[i].len, i + 7000);
        kv_must_put(os, k, (size_t)kl, dur[i].val, dur[i].len, &dur[i].version);
        os_puts++;
    }
    st = os_stats(os);
    CHECK(st.leases >= 4, "only %llu leases for ~300 KiB of one-sided PUTs",
          (unsigned long long)st.leases);
    /* Only a PUT that finds its lease full goes by RPC (while the next lease
     * is asked for): one per lease, on every fabric, however slow. */
    CHECK(st.puts + st.leases >= os_puts, "only %llu of %u PUTs went one-sided, with %llu leases",
          (unsigned long long)st.puts, os_puts, (unsigned long long)st.leases);
    check_all(os, dur, N_DUR, "dur");
    tern_kv_close(os);
    tern_kv_close(rpc);
    tern_rpc_close(ep);
    test_kv_finish(0);

    /* SIGTERM, then a new server on the same pool: all of it is there, by
     * either path (the window is rebuilt from the recovered index). */
    start_os_server(0, _i, &o);
    ep = test_rpc_ep(NULL);
    os = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    rpc = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    check_all(rpc, dur, N_DUR, "dur");
    for (unsigned i = 0; i < N_DUR; i++)
        present += dur[i].version != 0;
    dur_key(k, sizeof(k), &kl, "dur", 0);
    warm_get(os, ep, k, (size_t)kl);
    before = os_stats(os).gets_direct;
    check_all(os, dur, N_DUR, "dur");
    ck_assert_uint_eq(os_stats(os).gets_direct - before, present);

    /* One-sided PUTs, then kill -9 right after the last acknowledgement. */
    must_os_put(os, ep, "warm", 4, "again", 5, NULL);
    for (unsigned i = 0; i < N_KILL; i++) {
        dur_key(k, sizeof(k), &kl, "killed", i);
        killed[i].len = 1000 + i * 7;
        test_pattern(killed[i].val, killed[i].len, i + 123);
        kv_must_put(os, k, (size_t)kl, killed[i].val, killed[i].len, &killed[i].version);
    }
    ck_assert_uint_ge(os_stats(os).puts, N_KILL / 2);
    test_kv_kill(0);
    tern_kv_close(os);
    tern_kv_close(rpc);
    tern_rpc_close(ep);

    start_os_server(0, _i, &o);
    ep = test_rpc_ep(NULL);
    os = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    check_all(os, killed, N_KILL, "killed");
    check_all(os, dur, N_DUR, "dur");
    /* Versions keep growing past every recovered one. */
    {
        uint64_t v = 0, vmax = 0;

        for (unsigned i = 0; i < N_KILL; i++)
            vmax = killed[i].version > vmax ? killed[i].version : vmax;
        kv_must_put(os, "after", 5, "kill", 4, &v);
        ck_assert_uint_gt(v, vmax);
    }
    test_kv_end(ep, os, 1);
}
END_TEST

/* ---- the client cache ---- */

START_TEST(cache_every_fabric)
{
    enum { NK = 200, VL = 100 };
    static uint8_t v1[1 * KIB], v2[1 * KIB], v3[1 * KIB], vals[NK][VL];
    struct tern_kv_onesided_stats st0, st1;
    struct tern_rpc_ep *ep;
    struct tern_kv *a, *b, *c;
    uint64_t ver, ver1, ver2, ver3, vers[NK];
    char k[32];
    int kl;

    start_os_server(0, _i, NULL);
    ep = test_rpc_ep(NULL);
    a = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    b = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    c = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    ck_assert_int_eq(tern_kv_set_cache(a, 64, 4096), 0);
    /* Same-sized values: a stale one shows only by its bytes. */
    memset(v1, 0x11, sizeof(v1));
    memset(v2, 0x22, sizeof(v2));
    memset(v3, 0x33, sizeof(v3));
    kv_must_put(c, "hot", 3, v1, sizeof(v1), &ver1);
    warm_get(a, ep, "hot", 3);
    st0 = os_stats(a);
    for (int i = 0; i < 10; i++)
        kv_expect_get(a, "hot", 3, v1, sizeof(v1), ver1);
    st1 = os_stats(a);
    CHECK(st1.cache_hits - st0.cache_hits >= 9, "%llu cache hits in 10 GETs",
          (unsigned long long)(st1.cache_hits - st0.cache_hits));
    ck_assert_uint_eq(st1.gets_direct - st0.gets_direct, 10);

    /* Another client's one-sided PUT: the next GET sees it. */
    must_os_put(b, ep, "hot", 3, v2, sizeof(v2), &ver2);
    ck_assert_uint_gt(ver2, ver1);
    kv_expect_get(a, "hot", 3, v2, sizeof(v2), ver2);
    kv_expect_get(a, "hot", 3, v2, sizeof(v2), ver2);
    /* An RPC PUT (in place over the older record): the same. */
    kv_must_put(c, "hot", 3, v3, sizeof(v3), &ver3);
    kv_expect_get(a, "hot", 3, v3, sizeof(v3), ver3);
    /* And back to hits with the new value. */
    st0 = os_stats(a);
    for (int i = 0; i < 5; i++)
        kv_expect_get(a, "hot", 3, v3, sizeof(v3), ver3);
    ck_assert_uint_ge(os_stats(a).cache_hits - st0.cache_hits, 4);
    /* Deleted and written again with the old bytes: a new version. */
    ck_assert_int_eq(tern_kv_del(c, "hot", 3), 0);
    kv_expect_enoent(a, "hot", 3);
    kv_must_put(c, "hot", 3, v1, sizeof(v1), &ver);
    kv_expect_get(a, "hot", 3, v1, sizeof(v1), ver);

    /* More keys than entries: evictions never hand out another key's value. */
    for (unsigned i = 0; i < NK; i++) {
        kl = snprintf(k, sizeof(k), "many-%u", i);
        test_pattern(vals[i], VL, i);
        kv_must_put(c, k, (size_t)kl, vals[i], VL, &vers[i]);
    }
    for (unsigned r = 0; r < 2; r++)
        for (unsigned i = 0; i < NK; i++) {
            kl = snprintf(k, sizeof(k), "many-%u", i);
            kv_expect_get(a, k, (size_t)kl, vals[i], VL, vers[i]);
        }
    for (unsigned i = 0; i < NK; i += 2) {
        kl = snprintf(k, sizeof(k), "many-%u", i);
        test_pattern(vals[i], VL, i + 1000);
        kv_must_put(b, k, (size_t)kl, vals[i], VL, &vers[i]);
    }
    for (unsigned r = 0; r < 2; r++)
        for (unsigned i = NK; i-- > 0;) {
            kl = snprintf(k, sizeof(k), "many-%u", i);
            kv_expect_get(a, k, (size_t)kl, vals[i], VL, vers[i]);
        }
    /* Values over max_val are read, not cached. */
    {
        static uint8_t big[8 * KIB];

        test_pattern(big, sizeof(big), 77);
        kv_must_put(c, "big", 3, big, sizeof(big), &ver);
        warm_get(a, ep, "big", 3);
        st0 = os_stats(a);
        for (int i = 0; i < 3; i++)
            kv_expect_get(a, "big", 3, big, sizeof(big), ver);
        ck_assert_uint_eq(os_stats(a).cache_hits, st0.cache_hits);
    }
    tern_kv_close(c);
    tern_kv_close(b);
    test_kv_end(ep, a, 1);
}
END_TEST

void kv_os_add_paths(const struct kv_os_cases *c)
{
    tcase_add_loop_test(c->os, roundtrip_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(c->os, auto_path_every_fabric, 0, test_fabric_count());
    tcase_add_test(c->os, server_without_onesided);
    tcase_add_loop_test(c->os, durable_onesided_puts, 0, test_fabric_count());
    tcase_add_loop_test(c->os, cache_every_fabric, 0, test_fabric_count());
}

Suite *suite_kv_onesided(void)
{
    Suite *s = suite_create("kv_onesided");
    struct kv_os_cases c = {
        .os = tcase_create("kv_onesided"),
        /* GET by server push: a case of its own (CK_RUN_CASE=kv_push). */
        .push = tcase_create("kv_push"),
        .fallback = tcase_create("kv_fallback"),
        /* The pool's lock and lessees on shm (CK_RUN_CASE=kv_pool_lock). */
        .pool_lock = tcase_create("kv_pool_lock"),
    };
    TCase *all[] = {c.os, c.push, c.fallback, c.pool_lock};

    kv_os_add_window(&c);
    kv_os_add_paths(&c);
    kv_os_add_races(&c);
    kv_os_add_liars(&c);
    kv_os_add_leases(&c);
    kv_os_add_hostile(&c);
    kv_os_add_push(&c);
    kv_os_add_pool_lock(&c);
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        tcase_set_timeout(all[i], 60);
        suite_add_tcase(s, all[i]);
    }
    return s;
}

#endif /* TERN_HAVE_SERVICES */
