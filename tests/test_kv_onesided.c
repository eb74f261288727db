/* The KV service's one-sided paths across processes (kv.h: "one-sided
 * paths"; kv_service_onesided.c and kv_client_path.c): servers run tern_kv_service
 * with tern_kv_service_enable_onesided in forked children, the test process
 * is the client, on every fabric that is built. Covers GETs that read the
 * index window and the pool, PUTs into leased segments, the client cache,
 * durability of one-sided PUTs across a restart and a kill -9, torn reads
 * under concurrent writers, leases taken back from idle and dead clients,
 * hostile LEASE/LPUT requests on a raw session, the window's own functions
 * (kv_window.h) without any process, and GETs by server push
 * (TERN_KV_PATH_PUSH, case kv_push): round trips, hostile PGET requests, a
 * server that lies about what it pushed, and pushes racing updates in place.
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "kv.h"
#include "kv_client.h"
#include "kv_servers.h"
#include "kv_store.h"
#include "kv_window.h"
#include "kv_wire.h"
#include "pm/pm.h"
#include "rpc.h"
#include "rpc_util.h"
#include "suites.h"

#define SEC 1000000000ull
#define KIB 1024u
#define SVC TERN_KV_SERVICE_ID
#define INTENT_BIT (1ull << 63)

/* ---- fabrics (tests/lib/fabrics.h) ---- */

/* Where TERN_KV_PATH_AUTO goes one-sided: one-sided access costs the server
 * nothing there (the NIC, or plain loads and stores, do the work). */
static bool fabric_is_fast(int i)
{
    return (test_fabric_caps(i) & TERN_TP_CAP_RMA_OFFLOAD) != 0;
}

/* The emulated NTB device: one-sided operations go as ring records, and it
 * links one peer endpoint at a time. */
static bool is_ntb(int i)
{
    return i == test_fabric_row("ntb");
}

/* How TERN_KV_PATH_AUTO sends GETs to a server on the fabric (kv_client_path.c
 * get_way): window reads where they cost the server nothing (shm: loads,
 * rdma: the NIC), RPC on tcp and ntb (on ntb both a window read and a push
 * lose to an RPC reply, docs/KV.md). The one place to change when
 * get_way's choice for a fabric changes: AUTO_PUSH for ntb if it pushes. */
enum auto_way { AUTO_RPC, AUTO_WINDOW, AUTO_PUSH };

static enum auto_way auto_get_way(int i)
{
    if (fabric_is_fast(i))
        return AUTO_WINDOW;
    if (is_ntb(i))
        return AUTO_RPC;
    return AUTO_RPC;
}

/* ---- servers (tests/lib/kv_servers.h) and clients ---- */

#define MAX_SERVERS 2

/* Start server i on fabric row `fabric` with the one-sided paths on, and
 * the rest as `o` says (NULL: the defaults). */
static void start_os_server(int i, int fabric, const struct test_kv_srv *o)
{
    struct test_kv_srv so = o ? *o : (struct test_kv_srv){0};

    so.listen = test_fabric_listen(fabric);
    so.onesided = true;
    test_kv_start(i, &so);
}

/* A client of servers 0..n-1 on `path`. */
static struct tern_kv *kv_open_path(struct tern_rpc_ep *ep, int n, enum tern_kv_path path)
{
    struct tern_kv *kv = test_kv_client(ep, n, NULL);
    int rc = tern_kv_set_path(kv, path);

    CHECK(rc == 0, "tern_kv_set_path %d: %s", (int)path, tern_err_name(rc));
    return kv;
}

static struct tern_kv_onesided_stats stats(const struct tern_kv *kv)
{
    struct tern_kv_onesided_stats st;

    tern_kv_get_onesided_stats(kv, &st);
    return st;
}

/* PUT until one goes through a leased segment (the first ones go by RPC
 * while the lease is asked for, and so does one that does not fit the
 * rest of a lease). *version is the last PUT's. */
static void must_os_put(struct tern_kv *kv, struct tern_rpc_ep *ep, const void *key,
                        size_t klen, const void *val, size_t len, uint64_t *version)
{
    for (int tries = 0; tries < 20; tries++) {
        uint64_t before = stats(kv).puts;

        kv_must_put(kv, key, klen, val, len, version);
        if (stats(kv).puts > before)
            return;
        test_rpc_poll_for(ep, 2);
    }
    ck_abort_msg("no PUT of %.*s (%zu bytes) went one-sided in 20 tries", (int)klen,
                 (const char *)key, len);
}

/* GET until one is answered from the window and the pool. */
static void warm_get(struct tern_kv *kv, struct tern_rpc_ep *ep, const void *key, size_t klen)
{
    static uint8_t buf[128 * KIB];

    for (int tries = 0; tries < 50; tries++) {
        uint64_t before = stats(kv).gets_direct;
        size_t got;
        int rc = tern_kv_get(kv, key, klen, buf, sizeof(buf), &got, NULL);

        CHECK(rc == 0, "warm-up get: %s", tern_err_name(rc));
        if (stats(kv).gets_direct > before)
            return;
        test_rpc_poll_for(ep, 2);
    }
    ck_abort_msg("no GET of %.*s was answered one-sidedly", (int)klen, (const char *)key);
}

/* ---- 1: round trips on every fabric ---- */

/* Can a record with this much value go one-sided on the fabric? On ntb a
 * one-sided operation is one ring record, at most a quarter of its 64 KiB
 * ring (transport/shm: onesided_max), and the client does not split reads:
 * bigger ones go by RPC. */
static bool fits_onesided(int fabric, size_t vlen)
{
    return !is_ntb(fabric) || vlen <= 8 * KIB;
}

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
    char k[32];
    int kl;

    start_os_server(0, _i, NULL);
    ep = test_rpc_ep(NULL);
    test_rpc_assert_fabric(ep, test_kv_uri(0), _i);
    os = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    rpc = kv_open_path(ep, 1, TERN_KV_PATH_RPC);

    /* Set up the lease and the mappings. */
    must_os_put(os, ep, "warm", 4, "up", 2, &v1);
    warm_get(os, ep, "warm", 4);

    for (unsigned s = 0; s < NS; s++) {
        test_pattern(val[s], sizes[s], (unsigned)s + 1);
        /* Written by RPC, read one-sidedly. */
        kl = snprintf(k, sizeof(k), "rpc2os-%zu", sizes[s]);
        kv_must_put(rpc, k, (size_t)kl, val[s], sizes[s], &v_rpc[s]);
        st0 = stats(os);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
        st1 = stats(os);
        CHECK(st1.gets_direct == st0.gets_direct + 1 || !fits_onesided(_i, sizes[s]),
              "GET of %zu bytes written by RPC was not one-sided", sizes[s]);
        /* Written one-sidedly, read by RPC and one-sidedly. */
        kl = snprintf(k, sizeof(k), "os2rpc-%zu", sizes[s]);
        if (fits_onesided(_i, sizes[s]))
            must_os_put(os, ep, k, (size_t)kl, val[s], sizes[s], &v_os[s]);
        else
            kv_must_put(os, k, (size_t)kl, val[s], sizes[s], &v_os[s]);
        ck_assert_uint_gt(v_os[s], v_rpc[s]);
        kv_expect_get(rpc, k, (size_t)kl, val[s], sizes[s], v_os[s]);
        st0 = stats(os);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_os[s]);
        st1 = stats(os);
        CHECK(st1.gets_direct == st0.gets_direct + 1 || !fits_onesided(_i, sizes[s]),
              "GET of %zu bytes written one-sidedly was not one-sided", sizes[s]);
    }
    /* Everything again, in the other order: still whole, still direct. */
    st0 = stats(os);
    for (unsigned s = 0; s < NS; s++) {
        kl = snprintf(k, sizeof(k), "rpc2os-%zu", sizes[s]);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
        kl = snprintf(k, sizeof(k), "os2rpc-%zu", sizes[s]);
        kv_expect_get(os, k, (size_t)kl, val[s], sizes[s], v_os[s]);
        kv_expect_get(rpc, k, (size_t)kl, val[s], sizes[s], v_os[s]);
    }
    st1 = stats(os);
    {
        unsigned want = 0;

        for (unsigned s = 0; s < NS; s++)
            want += fits_onesided(_i, sizes[s]) ? 2 : 0;
        CHECK(st1.gets_direct - st0.gets_direct == want, "%llu one-sided GETs of %u",
              (unsigned long long)(st1.gets_direct - st0.gets_direct), want);
    }
    ck_assert_uint_gt(st1.puts, 0);
    ck_assert_uint_gt(st1.leases, 0);
    ck_assert_uint_eq(stats(rpc).gets_direct, 0);

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

/* ---- 2: TERN_KV_PATH_AUTO, and servers without the one-sided paths ---- */

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
    st = stats(kv);
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
    st0 = stats(kv);
    for (unsigned i = 0; i < 10; i++) {
        kl = snprintf(k, sizeof(k), "small-%u", i);
        kv_must_put(kv, k, (size_t)kl, val, 8 + i * 100, &ver[i]);
        kv_expect_get(kv, k, (size_t)kl, val, 8 + i * 100, ver[i]);
    }
    CHECK(stats(kv).puts == st0.puts, "%s: %llu small AUTO PUTs went one-sided",
          test_fabric_listen(_i), (unsigned long long)(stats(kv).puts - st0.puts));
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
    ck_assert_uint_eq(stats(kv).gets_direct, 0);
    ck_assert_uint_eq(stats(kv).puts, 0);
    ck_assert_uint_eq(stats(kv).leases, 0);
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

/* ---- 3: one-sided PUTs survive a restart and a kill -9 ---- */

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
    unsigned present = 0;
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
    }
    /* Overwrites one-sided and by RPC, and deletes, in between. */
    for (unsigned i = 0; i < N_DUR; i += 3) {
        dur_key(k, sizeof(k), &kl, "dur", i);
        dur[i].len = 1500 + i % 500;
        test_pattern(dur[i].val, dur[i].len, i + 5000);
        kv_must_put(os, k, (size_t)kl, dur[i].val, dur[i].len, &dur[i].version);
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
    }
    st = stats(os);
    CHECK(st.leases >= 4, "only %llu leases for ~300 KiB of one-sided PUTs",
          (unsigned long long)st.leases);
    CHECK(st.puts >= N_DUR, "only %llu one-sided PUTs", (unsigned long long)st.puts);
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
    before = stats(os).gets_direct;
    check_all(os, dur, N_DUR, "dur");
    ck_assert_uint_eq(stats(os).gets_direct - before, present);

    /* One-sided PUTs, then kill -9 right after the last acknowledgement. */
    must_os_put(os, ep, "warm", 4, "again", 5, NULL);
    for (unsigned i = 0; i < N_KILL; i++) {
        dur_key(k, sizeof(k), &kl, "killed", i);
        killed[i].len = 1000 + i * 7;
        test_pattern(killed[i].val, killed[i].len, i + 123);
        kv_must_put(os, k, (size_t)kl, killed[i].val, killed[i].len, &killed[i].version);
    }
    ck_assert_uint_ge(stats(os).puts, N_KILL / 2);
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

/* ---- 4: the client cache ---- */

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
    st0 = stats(a);
    for (int i = 0; i < 10; i++)
        kv_expect_get(a, "hot", 3, v1, sizeof(v1), ver1);
    st1 = stats(a);
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
    st0 = stats(a);
    for (int i = 0; i < 5; i++)
        kv_expect_get(a, "hot", 3, v3, sizeof(v3), ver3);
    ck_assert_uint_ge(stats(a).cache_hits - st0.cache_hits, 4);
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
        st0 = stats(a);
        for (int i = 0; i < 3; i++)
            kv_expect_get(a, "big", 3, big, sizeof(big), ver);
        ck_assert_uint_eq(stats(a).cache_hits, st0.cache_hits);
    }
    tern_kv_close(c);
    tern_kv_close(b);
    test_kv_end(ep, a, 1);
}
END_TEST

/* ---- 5: torn reads under a writer, and concurrent writers ---- */

/* The emulated NTB device links one peer endpoint at a time, so there the
 * writers are clients on the test's own endpoint, driven by its polls (the
 * server still interleaves their PUTs with the reader's served reads);
 * elsewhere they are processes of their own. */
static bool one_peer_only(int fabric)
{
    return is_ntb(fabric);
}

#define TORN_MAX 200000
#define TORN_READS 30000

struct torn_shared {
    int stop;                        /* set by the test: writers end */
    int err;                         /* a writer's failed call */
    uint64_t n;                      /* PUTs acknowledged */
    uint64_t os_puts;
    uint64_t ver[TORN_MAX + 1];      /* version of counter c's PUT */
};

static struct torn_shared *torn;

/* Counter c's value: 8 bytes of c, then its low byte over and over; two
 * sizes, so that in-place rewrites, appends and cleaning all happen. Set
 * before the writer forks: on ntb one-sided operations carry at most a
 * quarter of a 64 KiB ring, so there the values are smaller. */
static size_t torn_unit = 8 * KIB;

static size_t torn_len(uint64_t c)
{
    return c & 1 ? 3 * torn_unit : 2 * torn_unit;
}

/* Index of the first of n bytes that is not b (n if none). */
static size_t first_not(const uint8_t *p, size_t n, uint8_t b)
{
    size_t i = 0;

    while (i < n && p[i] == b)
        i++;
    return i;
}

static void torn_fill(uint8_t *p, uint64_t c)
{
    size_t len = torn_len(c);

    memcpy(p, &c, sizeof(c));
    memset(p + sizeof(c), (int)(uint8_t)c, len - sizeof(c));
}

/* The writer: rewrites "torn" with counters 1, 2, ... mostly by RPC (which
 * rewrites older records in place, the hazard for readers) and every
 * fourth PUT one-sidedly. Each PUT starts from the last one's callback. */
struct torn_writer {
    struct tern_kv *kv;
    uint64_t c;
    bool busy;
    uint8_t val[24 * KIB];
};

static void torn_next(struct torn_writer *w);

static void torn_done(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct torn_writer *w = arg;

    (void)val;
    (void)len;
    w->busy = false;
    if (status < 0) {
        torn->err = status;
        return;
    }
    torn->ver[w->c] = version;
    __atomic_store_n(&torn->n, w->c, __ATOMIC_RELEASE);
    torn_next(w);
}

static void torn_next(struct torn_writer *w)
{
    int rc;

    if (__atomic_load_n(&torn->stop, __ATOMIC_ACQUIRE) || w->c >= TORN_MAX)
        return;
    w->c++;
    tern_kv_set_path(w->kv, w->c % 4 == 3 ? TERN_KV_PATH_ONESIDED : TERN_KV_PATH_RPC);
    torn_fill(w->val, w->c);
    rc = tern_kv_put_async(w->kv, "torn", 4, w->val, torn_len(w->c), torn_done, w);
    if (rc < 0)
        torn->err = rc;
    else
        w->busy = true;
}

static int torn_writer_proc(void *arg)
{
    static struct torn_writer w;
    struct tern_rpc_ep *ep;
    const char *u = test_kv_uri(0);
    double t0 = now_ms();

    (void)arg;
    if (tern_rpc_open(NULL, &ep) < 0 || tern_kv_open(ep, &u, 1, 5 * SEC, &w.kv) < 0 ||
        tern_kv_set_path(w.kv, TERN_KV_PATH_ONESIDED) < 0)
        return 3;
    torn_next(&w);
    /* Never outlive a test that lost track of us. */
    while (w.busy && now_ms() - t0 < 30000)
        tern_rpc_poll(ep);
    torn->os_puts = stats(w.kv).puts;
    tern_kv_close(w.kv);
    tern_rpc_close(ep);
    return torn->err ? 4 : 0;
}

START_TEST(torn_reads_single_writer)
{
    static uint8_t buf[32 * KIB];
    static uint64_t seen_c[TORN_READS], seen_v[TORN_READS];
    static struct torn_writer local;
    struct tern_kv_onesided_stats st0, st1;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    uint64_t last_v = 0, last_c = 0;
    unsigned reads = 0;
    bool in_proc = one_peer_only(_i);
    pid_t writer = 0;
    double t0;
    int rc;

    torn = test_shared_alloc(sizeof(*torn));
    torn_unit = in_proc ? 2 * KIB : 8 * KIB;
    start_os_server(0, _i, NULL);
    if (!in_proc)
        writer = test_fork(torn_writer_proc, NULL);
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    if (in_proc) {
        local = (struct torn_writer){.kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED)};
        torn_next(&local);
    }
    t0 = now_ms();
    while (__atomic_load_n(&torn->n, __ATOMIC_ACQUIRE) < 1) {
        CHECK(now_ms() - t0 < 5000 && !torn->err, "the writer never wrote (%s)",
              tern_err_name(torn->err));
        tern_rpc_poll(ep);
    }
    warm_get(kv, ep, "torn", 4);
    st0 = stats(kv);
    t0 = now_ms();
    for (; reads < TORN_READS && now_ms() - t0 < 2000; reads++) {
        size_t len = 0, bad;
        uint64_t v = 0, c;

        rc = tern_kv_get(kv, "torn", 4, buf, sizeof(buf), &len, &v);
        CHECK(rc == 0, "read %u: %s", reads, tern_err_name(rc));
        CHECK(len >= 8, "read %u: %zu bytes", reads, len);
        memcpy(&c, buf, sizeof(c));
        CHECK(c >= 1 && c <= TORN_MAX, "read %u: counter %llu", reads, (unsigned long long)c);
        CHECK(len == torn_len(c), "read %u: counter %llu with %zu bytes", reads,
              (unsigned long long)c, len);
        bad = first_not(buf + 8, len - 8, (uint8_t)c);
        CHECK(bad == len - 8, "read %u: torn value: counter %llu, byte %zu is 0x%02x", reads,
              (unsigned long long)c, bad + 8, buf[8 + bad]);
        /* One writer, and every read after the one before: never older. */
        CHECK(v >= last_v && c >= last_c,
              "read %u: version %llu (counter %llu) after %llu (counter %llu)", reads,
              (unsigned long long)v, (unsigned long long)c, (unsigned long long)last_v,
              (unsigned long long)last_c);
        last_v = v;
        last_c = c;
        seen_c[reads] = c;
        seen_v[reads] = v;
    }
    st1 = stats(kv);
    __atomic_store_n(&torn->stop, 1, __ATOMIC_RELEASE);
    if (in_proc) {
        t0 = now_ms();
        while (local.busy && now_ms() - t0 < 5000)
            tern_rpc_poll(ep);
        CHECK(!local.busy && !torn->err, "writer: %s", tern_err_name(torn->err));
        torn->os_puts = stats(local.kv).puts;
        tern_kv_close(local.kv);
    } else {
        rc = test_child_wait(&writer);
        CHECK(rc == 0, "writer exited with %d (%s)", rc, tern_err_name(torn->err));
    }
    CHECK(reads >= 500, "only %u reads", reads);
    CHECK(torn->n >= 20, "the writer wrote only %llu values", (unsigned long long)torn->n);
    /* Most reads really were one-sided (the rest retried and asked). */
    CHECK(st1.gets_direct - st0.gets_direct >= reads / 2, "%llu of %u reads were one-sided",
          (unsigned long long)(st1.gets_direct - st0.gets_direct), reads);
    CHECK(torn->os_puts > 0, "the writer's PUTs never went one-sided");
    /* Each value came with the version its PUT was given. */
    for (unsigned r = 0; r < reads; r++)
        CHECK(seen_c[r] <= torn->n && torn->ver[seen_c[r]] == seen_v[r],
              "read %u: counter %llu with version %llu, its PUT got %llu", r,
              (unsigned long long)seen_c[r], (unsigned long long)seen_v[r],
              (unsigned long long)torn->ver[seen_c[r]]);
    /* The writer is done: its last value is the one read now. */
    {
        static uint8_t want[32 * KIB];

        torn_fill(want, torn->n);
        kv_expect_get(kv, "torn", 4, want, torn_len(torn->n), torn->ver[torn->n]);
    }
    munmap(torn, sizeof(*torn));
    test_kv_end(ep, kv, 1);
}
END_TEST

#define N_WRITERS 3
#define W_PUTS 150

struct multi_shared {
    int go;
    int err[N_WRITERS];
    uint64_t os_puts[N_WRITERS];
    uint64_t ver[N_WRITERS][W_PUTS];
};

static struct multi_shared *multi;

static size_t multi_val(uint8_t *p, uint32_t w, uint32_t seq)
{
    size_t len = 256 + (seq % 5) * 64;

    memcpy(p, &w, 4);
    memcpy(p + 4, &seq, 4);
    memset(p + 8, (int)(uint8_t)(w * 31 + seq), len - 8);
    return len;
}

/* One of the writers: W_PUTS one-sided PUTs of "contended", each started
 * from the last one's callback. */
struct multi_writer {
    struct tern_kv *kv;
    uint32_t w, seq;
    bool busy;
    uint8_t val[1024];
};

static void multi_next(struct multi_writer *m);

static void multi_done(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct multi_writer *m = arg;

    (void)val;
    (void)len;
    m->busy = false;
    if (status < 0) {
        multi->err[m->w] = status;
        return;
    }
    multi->ver[m->w][m->seq++] = version;
    multi_next(m);
}

static void multi_next(struct multi_writer *m)
{
    int rc;

    if (m->seq >= W_PUTS)
        return;
    rc = tern_kv_put_async(m->kv, "contended", 9, m->val, multi_val(m->val, m->w, m->seq),
                           multi_done, m);
    if (rc < 0)
        multi->err[m->w] = rc;
    else
        m->busy = true;
}

static int multi_writer_proc(void *arg)
{
    static struct multi_writer m;
    struct tern_rpc_ep *ep;
    const char *u = test_kv_uri(0);
    double t0 = now_ms();

    m.w = (uint32_t)(uintptr_t)arg;
    if (tern_rpc_open(NULL, &ep) < 0 || tern_kv_open(ep, &u, 1, 5 * SEC, &m.kv) < 0 ||
        tern_kv_set_path(m.kv, TERN_KV_PATH_ONESIDED) < 0)
        return 3;
    while (!__atomic_load_n(&multi->go, __ATOMIC_ACQUIRE)) {
        tern_rpc_poll(ep);
        if (now_ms() - t0 > 10000)
            return 5;
    }
    multi_next(&m);
    while (m.busy && now_ms() - t0 < 30000)
        tern_rpc_poll(ep);
    multi->os_puts[m.w] = stats(m.kv).puts;
    tern_kv_close(m.kv);
    tern_rpc_close(ep);
    return multi->err[m.w] || m.seq != W_PUTS ? 4 : 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* Are the writers done? Reaps the processes, or looks at the local ones. */
static bool writers_done(const struct multi_writer *local, pid_t *writers, bool in_proc)
{
    bool done = true;

    for (int i = 0; i < N_WRITERS; i++) {
        int code;

        if (in_proc) {
            CHECK(!multi->err[i], "writer %d: %s", i, tern_err_name(multi->err[i]));
            done = done && !local[i].busy;
            continue;
        }
        if (test_child_exited(&writers[i], &code))
            CHECK(code == 0, "writer %d failed: %s", i, tern_err_name(multi->err[i]));
        done = done && writers[i] == 0;
    }
    return done;
}

START_TEST(concurrent_writers_one_key)
{
    static uint64_t all[N_WRITERS * W_PUTS];
    static struct multi_writer local[N_WRITERS];
    pid_t writers[N_WRITERS] = {0};
    uint8_t buf[1024], want[1024];
    struct tern_rpc_ep *ep;
    struct tern_kv *os, *rpc;
    uint64_t vmax = 0, v = 0, last_v = 0;
    uint32_t wmax = 0, smax = 0;
    unsigned reads = 0, n = 0;
    bool in_proc = one_peer_only(_i);
    double t0;
    int rc;

    multi = test_shared_alloc(sizeof(*multi));
    start_os_server(0, _i, NULL);
    if (!in_proc)
        for (uint32_t w = 0; w < N_WRITERS; w++)
            writers[w] = test_fork(multi_writer_proc, (void *)(uintptr_t)w);
    ep = test_rpc_ep(NULL);
    os = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    rpc = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    kv_must_put(rpc, "contended", 9, "start", 5, NULL);
    if (in_proc) {
        for (uint32_t w = 0; w < N_WRITERS; w++) {
            local[w] = (struct multi_writer){.kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED),
                                             .w = w};
            multi_next(&local[w]);
        }
    }
    __atomic_store_n(&multi->go, 1, __ATOMIC_RELEASE);
    /* Read while they write: every value whole, never older than the last. */
    t0 = now_ms();
    while (!writers_done(local, writers, in_proc)) {
        size_t len = 0;
        uint32_t w, seq;

        CHECK(now_ms() - t0 < 15000, "writers never finished");
        rc = tern_kv_get(os, "contended", 9, buf, sizeof(buf), &len, &v);
        CHECK(rc == 0, "read %u: %s", reads, tern_err_name(rc));
        CHECK(v >= last_v, "read %u: version %llu after %llu", reads, (unsigned long long)v,
              (unsigned long long)last_v);
        last_v = v;
        reads++;
        if (len == 5)
            continue;   /* "start" */
        CHECK(len >= 8, "read %u: %zu bytes", reads, len);
        memcpy(&w, buf, 4);
        memcpy(&seq, buf + 4, 4);
        CHECK(w < N_WRITERS && seq < W_PUTS, "read %u: writer %u seq %u", reads, w, seq);
        CHECK(len == multi_val(want, w, seq) && memcmp(buf, want, len) == 0,
              "read %u: torn value (writer %u seq %u, %zu bytes)", reads, w, seq, len);
    }
    for (uint32_t w = 0; w < N_WRITERS; w++) {
        if (in_proc) {
            multi->os_puts[w] = stats(local[w].kv).puts;
            tern_kv_close(local[w].kv);
        }
        CHECK(multi->os_puts[w] >= W_PUTS / 2, "writer %u: %llu one-sided PUTs", w,
              (unsigned long long)multi->os_puts[w]);
        for (uint32_t s = 0; s < W_PUTS; s++) {
            uint64_t x = multi->ver[w][s];

            CHECK(x > 0, "writer %u put %u has no version", w, s);
            CHECK(!s || x > multi->ver[w][s - 1], "writer %u: versions went back", w);
            all[n++] = x;
            if (x > vmax) {
                vmax = x;
                wmax = w;
                smax = s;
            }
        }
    }
    qsort(all, n, sizeof(all[0]), cmp_u64);
    for (unsigned i = 1; i < n; i++)
        CHECK(all[i] != all[i - 1], "version %llu acknowledged twice",
              (unsigned long long)all[i]);
    /* The newest acknowledged PUT is the value, by either path. */
    kv_expect_get(os, "contended", 9, want, multi_val(want, wmax, smax), vmax);
    kv_expect_get(rpc, "contended", 9, want, multi_val(want, wmax, smax), vmax);
    munmap(multi, sizeof(*multi));
    tern_kv_close(rpc);
    test_kv_end(ep, os, 1);
}
END_TEST

/* A window that lies. The tests above catch a reader that trusts torn data
 * only when a race happens to strike; here a fake server publishes a
 * window and a pool made by hand, one key per kind of damage, and answers
 * GETs by RPC with a value of its own: whatever the reader must not trust
 * shows as a value that did not come from the RPC. Deterministic, on every
 * fabric (mapped reads on shm, staged reads elsewhere). */

#define FAKE_SEG (64 * KIB)
#define FAKE_SEGS 4u
#define FAKE_BLOCKS 64u
#define FAKE_RPC_VERSION 777u

enum fake_kind {
    F_GOOD,                          /* whole and right: read one-sidedly */
    F_ODD_SEQ,                       /* bucket caught mid-write */
    F_BUCKET_SUM,                    /* bucket checksum wrong */
    F_VERSION,                       /* record is another version than the bucket says */
    F_RECORD_SUM,                    /* a value byte flipped under the record's sum */
    F_OTHER_KEY,                     /* record of another key of the same length */
    F_SIZE,                          /* bucket's size is not the record's */
    F_PAST_SEGMENT,                  /* record would run past its segment */
    F_HUGE,                          /* size of 1 GiB */
    F_N
};

static const char *const fake_what[F_N] = {
    "good", "odd sequence", "bucket sum", "version", "record sum", "other key",
    "size", "past the segment", "huge size",
};

/* Kind k's key: the first "fake-<k>-<n>" whose block no earlier kind uses,
 * so that no bucket stands in another key's block. */
static size_t fake_key(unsigned k, char *out, size_t cap)
{
    for (unsigned n = 0;; n++) {
        size_t len = (size_t)snprintf(out, cap, "fake-%u-%u", k, n);
        uint32_t blk = kvw_block_of(kv_hash(out, len), FAKE_BLOCKS);
        bool taken = false;

        for (unsigned j = 0; j < k && !taken; j++) {
            char o[32];
            size_t ol = fake_key(j, o, sizeof(o));

            taken = kvw_block_of(kv_hash(o, ol), FAKE_BLOCKS) == blk;
        }
        if (!taken)
            return len;
    }
}

static struct tern_rpc_mr *fake_window_mr, *fake_pool_mr;

static int fake_info(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct kv_info *out = tern_reply_alloc(req, sizeof(*out));

    (void)data;
    (void)len;
    (void)ctx;
    if (!out)
        return TERN_EMSGSIZE;
    *out = (struct kv_info){.range_hi = UINT32_MAX, .keys = F_N,
                            .pool_size = FAKE_SEGS * FAKE_SEG, .key_max = PM_KEY_MAX,
                            .val_max = FAKE_SEG / 2};
    return 0;
}

static int fake_os_info(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct kv_onesided_info *out = tern_reply_alloc(req, sizeof(*out));
    int rc;

    (void)data;
    (void)len;
    (void)ctx;
    if (!out)
        return TERN_EMSGSIZE;
    memset(out, 0, sizeof(*out));
    rc = tern_rpc_mr_rkey(fake_window_mr, tern_req_session(req), &out->window);
    if (rc == 0)
        rc = tern_rpc_mr_rkey(fake_pool_mr, tern_req_session(req), &out->pool);
    out->seg0 = 0;
    out->seg_size = FAKE_SEG;
    out->n_blocks = FAKE_BLOCKS;
    return rc;
}

/* Every GET by RPC: "rpc:" and the key, at FAKE_RPC_VERSION. */
static int fake_get(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct kv_key h;
    uint8_t *out;

    (void)ctx;
    if (len < sizeof(h))
        return TERN_EPROTO;
    memcpy(&h, data, sizeof(h));
    if (len != sizeof(h) + h.klen)
        return TERN_EPROTO;
    out = tern_reply_alloc(req, sizeof(struct kv_val) + 4 + h.klen);
    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, &(uint64_t){FAKE_RPC_VERSION}, sizeof(uint64_t));
    memcpy(out + sizeof(struct kv_val), "rpc:", 4);
    memcpy(out + sizeof(struct kv_val) + 4, (const uint8_t *)data + sizeof(h), h.klen);
    return 0;
}

static int fake_enotsup(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    (void)req;
    (void)data;
    (void)len;
    (void)ctx;
    return TERN_ENOTSUP;
}

static int fake_pget(struct tern_req *req, const void *data, size_t len, void *ctx);
static void fake_push_records(uint8_t *pool);

static const struct tern_method fake_methods[] = {
    {.id = KV_M_GET, .name = "get", .handler = fake_get},
    {.id = KV_M_PGET, .name = "pget", .handler = fake_pget},
    {.id = KV_M_INFO, .name = "info", .handler = fake_info},
    {.id = KV_M_ONESIDED_INFO, .name = "os_info", .handler = fake_os_info},
    {.id = KV_M_LEASE, .name = "lease", .handler = fake_enotsup},
};

static const struct tern_service fake_service = {
    .name = "fake-kv", .id = SVC, .methods = fake_methods,
    .n_methods = sizeof(fake_methods) / sizeof(fake_methods[0]),
};

static uint32_t put_record(uint8_t *dst, const void *key, uint16_t klen, const void *val,
                           uint32_t vlen, uint64_t intent, uint8_t type);

/* The fake server's window and pool: kind k's record at segment 1, offset
 * 64 + 512 k, version 100 + k, then the damage. */
static void setup_fake(struct tern_rpc_ep *ep)
{
    static const uint8_t uuid[16] = {7};
    struct kv_window w;
    uint8_t *pool;

    if (tern_rpc_mr_alloc(ep, kvw_bytes(FAKE_BLOCKS), TERN_TP_ACCESS_REMOTE_READ,
                          &fake_window_mr) < 0 ||
        tern_rpc_mr_alloc(ep, FAKE_SEGS * FAKE_SEG, TERN_TP_ACCESS_REMOTE_READ,
                          &fake_pool_mr) < 0 ||
        tern_rpc_register(ep, &fake_service) < 0)
        _exit(8);
    kv_window_init(&w, tern_rpc_mr_addr(fake_window_mr), FAKE_BLOCKS, uuid);
    pool = tern_rpc_mr_addr(fake_pool_mr);
    fake_push_records(pool);
    for (unsigned k = 0; k < F_N; k++) {
        char key[32], val[32];
        size_t kl = fake_key(k, key, sizeof(key));
        int vl = snprintf(val, sizeof(val), "win:%s", fake_what[k]);
        uint32_t off = 64 + 512 * k, slot = 0, size;
        uint8_t *rec = pool + FAKE_SEG + off;
        struct pm_rec *r = (void *)rec;
        struct kvw_bucket *b;

        size = put_record(rec, key, (uint16_t)kl, val, (uint32_t)vl, 100 + k, PM_VALUE);
        kv_window_set(&w, &slot, kv_hash(key, kl), 1ull << 32 | off, 100 + k, size);
        if (!slot)
            _exit(9);
        b = &w.bk[slot - 1];
        switch (k) {
        case F_ODD_SEQ:
            b->seq++;
            b->sum = kvw_bucket_sum(b);
            break;
        case F_BUCKET_SUM:
            b->sum ^= 1;
            break;
        case F_VERSION:
            r->version += 1000;
            r->sum = pm_rec_sum_of(r);
            break;
        case F_RECORD_SUM:
            rec[sizeof(*r) + kl + 1] ^= 0x01;
            break;
        case F_OTHER_KEY:
            rec[sizeof(*r)] = 'F';
            r->sum = pm_rec_sum_of(r);
            break;
        case F_SIZE:
            b->size += 8;
            b->sum = kvw_bucket_sum(b);
            break;
        case F_PAST_SEGMENT:
            b->loc = 1ull << 32 | (FAKE_SEG - 16);
            b->sum = kvw_bucket_sum(b);
            break;
        case F_HUGE:
            b->size = 1u << 30;
            b->sum = kvw_bucket_sum(b);
            break;
        default:
            break;
        }
    }
}

START_TEST(lying_window_never_trusted)
{
    struct tern_kv_onesided_stats st0, st1;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;

    test_kv_start_with(0, test_fabric_listen(_i), setup_fake);
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    {
        char key[32];
        size_t kl = fake_key(F_GOOD, key, sizeof(key));

        warm_get(kv, ep, key, kl);
    }
    /* Twice: a reader that remembered anything from the first round (the
     * cache is off) would show it in the second. */
    for (unsigned round = 0; round < 2; round++)
        for (unsigned k = 0; k < F_N; k++) {
            char key[32], want[48];
            size_t kl = fake_key(k, key, sizeof(key));
            size_t wl;

            if (k == F_GOOD)
                wl = (size_t)snprintf(want, sizeof(want), "win:%s", fake_what[k]);
            else
                wl = (size_t)snprintf(want, sizeof(want), "rpc:%s", key);
            st0 = stats(kv);
            kv_expect_get(kv, key, kl, want, wl, k == F_GOOD ? 100 : FAKE_RPC_VERSION);
            st1 = stats(kv);
            CHECK((st1.gets_direct - st0.gets_direct == 1) == (k == F_GOOD),
                  "%s: %llu one-sided answers", fake_what[k],
                  (unsigned long long)(st1.gets_direct - st0.gets_direct));
        }
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 6: an idle lease is taken back ---- */

START_TEST(idle_lease_taken_back)
{
    struct test_kv_srv o = {.os = {.max_leases = 1, .lease_idle_ns = 50000000ull}};
    struct tern_rpc_ep *ep_a, *ep_b;
    struct tern_kv *a, *b;
    struct tern_kv_onesided_stats sa, sb;
    uint64_t va[4] = {0}, vb[8] = {0};
    char k[32];
    int kl, rc;

    start_os_server(0, _i, &o);
    ep_a = test_rpc_ep(NULL);
    /* B's own endpoint, except where the fabric links one peer endpoint
     * only: there its own sessions (leases are per session) on A's. */
    ep_b = one_peer_only(_i) ? ep_a : test_rpc_ep(NULL);
    a = kv_open_path(ep_a, 1, TERN_KV_PATH_ONESIDED);
    b = kv_open_path(ep_b, 1, TERN_KV_PATH_ONESIDED);
    must_os_put(a, ep_a, "a-0", 3, "first of a", 10, &va[0]);
    ck_assert_uint_eq(stats(a).leases, 1);
    usleep(100 * 1000);

    /* B asks while A's lease sits idle: A's is taken back, B gets it. */
    for (int i = 0; i < 8; i++) {
        kl = snprintf(k, sizeof(k), "b-%d", i);
        kv_must_put(b, k, (size_t)kl, k, (size_t)kl, &vb[i]);
        test_rpc_poll_for(ep_b, 1);
    }
    sb = stats(b);
    CHECK(sb.leases > 0 && sb.puts > 0,
          "B never leased past A's idle lease (leases %llu, puts %llu)",
          (unsigned long long)sb.leases, (unsigned long long)sb.puts);

    /* A still thinks it holds its lease: its PUT must still be stored. */
    for (int i = 1; i < 4; i++) {
        kl = snprintf(k, sizeof(k), "a-%d", i);
        rc = tern_kv_put(a, k, (size_t)kl, k, (size_t)kl, &va[i]);
        CHECK(rc == 0, "A's put %d after its lease was taken back: %s", i,
              tern_err_name(rc));
        kv_expect_get(b, k, (size_t)kl, k, (size_t)kl, va[i]);
    }
    /* Nothing is lost, seen from either client. */
    kv_expect_get(b, "a-0", 3, "first of a", 10, va[0]);
    kv_expect_get(a, "a-0", 3, "first of a", 10, va[0]);
    for (int i = 0; i < 8; i++) {
        kl = snprintf(k, sizeof(k), "b-%d", i);
        kv_expect_get(a, k, (size_t)kl, k, (size_t)kl, vb[i]);
        kv_expect_get(b, k, (size_t)kl, k, (size_t)kl, vb[i]);
    }
    for (int i = 1; i < 4; i++) {
        kl = snprintf(k, sizeof(k), "a-%d", i);
        kv_expect_get(a, k, (size_t)kl, k, (size_t)kl, va[i]);
    }
    /* Once B idles in turn, A leases again and writes one-sidedly. */
    usleep(100 * 1000);
    must_os_put(a, ep_a, "a-again", 7, "x", 1, &va[0]);
    sa = stats(a);
    CHECK(sa.leases >= 2, "A leased %llu times", (unsigned long long)sa.leases);
    kv_expect_get(b, "a-again", 7, "x", 1, va[0]);
    tern_kv_close(b);
    if (ep_b != ep_a)
        tern_rpc_close(ep_b);
    test_kv_end(ep_a, a, 1);
}
END_TEST

/* Leases taken back from clients that then stay quiet (connected, not
 * writing) must not keep a third client from taking back an idle lease
 * (kv.h: an idle lease is taken back when another client needs one), and
 * the quiet clients' next PUTs must still be stored, although their lease
 * is gone without a word to them. */
START_TEST(quiet_revoked_lessees_do_not_starve)
{
    struct test_kv_srv o = {.os = {.max_leases = 1, .lease_idle_ns = 50000000ull}};
    struct tern_rpc_ep *ep_a, *ep_b, *ep_c;
    struct tern_kv *a, *b, *c;
    struct tern_kv_onesided_stats sc = {0};
    uint64_t va, vb, va2 = 0, vb2 = 0, vc[8] = {0};
    char k[32];
    int kl;

    start_os_server(0, _i, &o);
    ep_a = test_rpc_ep(NULL);
    ep_b = one_peer_only(_i) ? ep_a : test_rpc_ep(NULL);
    ep_c = one_peer_only(_i) ? ep_a : test_rpc_ep(NULL);
    a = kv_open_path(ep_a, 1, TERN_KV_PATH_ONESIDED);
    b = kv_open_path(ep_b, 1, TERN_KV_PATH_ONESIDED);
    c = kv_open_path(ep_c, 1, TERN_KV_PATH_ONESIDED);
    must_os_put(a, ep_a, "a", 1, "from a", 6, &va);
    usleep(100 * 1000);
    must_os_put(b, ep_b, "b", 1, "from b", 6, &vb);     /* takes A's */
    ck_assert_uint_eq(stats(b).leases, 1);
    usleep(100 * 1000);
    /* A and B both idle past lease_idle_ns: C's turn. */
    for (int i = 0; i < 8; i++) {
        kl = snprintf(k, sizeof(k), "c-%d", i);
        kv_must_put(c, k, (size_t)kl, k, (size_t)kl, &vc[i]);
        test_rpc_poll_for(ep_c, 1);
        sc = stats(c);
        if (sc.leases > 0 && sc.puts > 0)
            break;
    }
    CHECK(sc.leases > 0 && sc.puts > 0,
          "C never leased although every lease out was idle (leases %llu, puts %llu)",
          (unsigned long long)sc.leases, (unsigned long long)sc.puts);
    /* A and B still hold what they were granted, as far as they know: their
     * next PUTs must be stored all the same (by RPC, or a new lease). */
    {
        int rc = tern_kv_put(a, "a2", 2, "again a", 7, &va2);

        CHECK(rc == 0, "A's put after its lease was taken back and dropped: %s",
              tern_err_name(rc));
        rc = tern_kv_put(b, "b2", 2, "again b", 7, &vb2);
        CHECK(rc == 0, "B's put after its lease was taken back: %s", tern_err_name(rc));
    }
    kv_expect_get(c, "a", 1, "from a", 6, va);
    kv_expect_get(c, "b", 1, "from b", 6, vb);
    kv_expect_get(c, "a2", 2, "again a", 7, va2);
    kv_expect_get(c, "b2", 2, "again b", 7, vb2);
    for (int i = 0; i < 8 && vc[i]; i++) {
        kl = snprintf(k, sizeof(k), "c-%d", i);
        kv_expect_get(a, k, (size_t)kl, k, (size_t)kl, vc[i]);
    }
    tern_kv_close(c);
    tern_kv_close(b);
    if (ep_c != ep_a)
        tern_rpc_close(ep_c);
    if (ep_b != ep_a)
        tern_rpc_close(ep_b);
    test_kv_end(ep_a, a, 1);
}
END_TEST

/* ---- 7: a dead client's lease comes back at once ---- */

struct dead_shared {
    int state;                       /* 1: leased and wrote, 2: failed */
    unsigned n;
    uint64_t ver[16];
};

static struct dead_shared *dead;

static int dead_lessee(void *arg)
{
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    const char *u = test_kv_uri(0);

    (void)arg;
    if (tern_rpc_open(NULL, &ep) < 0 || tern_kv_open(ep, &u, 1, 5 * SEC, &kv) < 0 ||
        tern_kv_set_path(kv, TERN_KV_PATH_ONESIDED) < 0) {
        __atomic_store_n(&dead->state, 2, __ATOMIC_RELEASE);
        return 3;
    }
    for (unsigned i = 0; i < 16; i++) {
        char k[16];
        int kl = snprintf(k, sizeof(k), "dead-%u", i);

        if (tern_kv_put(kv, k, (size_t)kl, k, (size_t)kl, &dead->ver[i]) < 0)
            break;
        dead->n = i + 1;
        if (stats(kv).puts >= 3)
            break;
        for (int p = 0; p < 100; p++)
            tern_rpc_poll(ep);
    }
    __atomic_store_n(&dead->state, stats(kv).puts > 0 ? 1 : 2, __ATOMIC_RELEASE);
    for (;;)
        pause();        /* holding the lease, until SIGKILL */
}

START_TEST(dead_lessee_reclaimed)
{
    struct test_kv_srv o = {.os = {.max_leases = 1, .lease_idle_ns = 60000000000ull}};
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    struct tern_kv_onesided_stats st;
    pid_t lessee;
    double t0, took;
    unsigned n;

    dead = test_shared_alloc(sizeof(*dead));
    start_os_server(0, _i, &o);
    lessee = test_fork(dead_lessee, NULL);
    t0 = now_ms();
    while (!__atomic_load_n(&dead->state, __ATOMIC_ACQUIRE)) {
        CHECK(now_ms() - t0 < 5000, "the child never leased");
        usleep(1000);
    }
    CHECK(dead->state == 1, "the child's PUTs did not go one-sided");
    test_child_kill(&lessee);

    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    t0 = now_ms();
    for (unsigned i = 0;; i++) {
        char k[16];
        int kl = snprintf(k, sizeof(k), "live-%u", i);

        kv_must_put(kv, k, (size_t)kl, k, (size_t)kl, NULL);
        st = stats(kv);
        if (st.leases == 1 && st.puts > 0)
            break;
        took = now_ms() - t0;
        CHECK(took < 3000, "no lease %.0f ms after the lessee died (leases %llu)",
              took, (unsigned long long)st.leases);
        test_rpc_poll_for(ep, 5);
    }
    /* What the dead client had acknowledged is there. */
    n = dead->n;
    for (unsigned i = 0; i < n; i++) {
        char k[16];
        int kl = snprintf(k, sizeof(k), "dead-%u", i);

        kv_expect_get(kv, k, (size_t)kl, k, (size_t)kl, dead->ver[i]);
    }
    munmap(dead, sizeof(*dead));
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 8: hostile LEASE / LPUT on raw sessions ---- */

static struct kv_lease raw_lease(struct tern_session *s)
{
    struct kv_lease_req q = {0};
    struct kv_lease l;
    size_t got = 0;
    int rc = test_kv_call(s, KV_M_LEASE, &q, sizeof(q), &l, sizeof(l), &got);

    CHECK(rc == 0, "lease: %s", tern_err_name(rc));
    ck_assert_uint_eq(got, sizeof(l));
    ck_assert_uint_lt(l.next, l.end);
    return l;
}

/* Where the lessee writes at offset `off` of its segment (shm: a store). */
static uint8_t *lease_ptr(struct tern_rpc_ep *ep, struct tern_session *s,
                          const struct kv_lease *l, uint32_t off, size_t len)
{
    double t0 = now_ms();
    void *p = NULL;
    int rc;

    ck_assert_uint_ge(off, l->base);
    while ((rc = tern_session_rkey_ptr(s, &l->rkey, off - l->base, len,
                                       TERN_TP_ACCESS_REMOTE_WRITE, &p)) == TERN_EAGAIN) {
        CHECK(now_ms() - t0 < 3000, "the lease's mapping never came");
        tern_rpc_poll(ep);
    }
    CHECK(rc == 0, "rkey_ptr of the lease: %s", tern_err_name(rc));
    return p;
}

/* Lay a record out as a client does: header (version = `intent`), key,
 * value, zero padding, and the sum over all of it (the lessee's job).
 * Returns its size. */
static uint32_t put_record(uint8_t *dst, const void *key, uint16_t klen, const void *val,
                           uint32_t vlen, uint64_t intent, uint8_t type)
{
    struct pm_rec h = {.val_len = vlen, .version = intent, .key_len = klen, .type = type};
    uint32_t size = pm_rec_size(klen, vlen);

    memcpy(dst, &h, sizeof(h));
    memcpy(dst + sizeof(h), key, klen);
    memcpy(dst + sizeof(h) + klen, val, vlen);
    memset(dst + sizeof(h) + klen + vlen, 0, size - sizeof(h) - klen - vlen);
    h.sum = pm_rec_sum_of((const struct pm_rec *)dst);
    memcpy(dst, &h.sum, sizeof(h.sum));
    return size;
}

static int lput(struct tern_session *s, uint32_t seg, uint32_t off, uint64_t intent,
                uint64_t *version)
{
    struct kv_lput q = {.seg = seg, .off = off, .intent = intent};
    struct kv_val v = {0};
    size_t got = 0;
    int rc = test_kv_call(s, KV_M_LPUT, &q, sizeof(q), &v, sizeof(v), &got);

    if (rc == 0) {
        ck_assert_uint_eq(got, sizeof(v));
        if (version)
            *version = v.version;
    }
    return rc;
}

#define EXPECT_RC(call, want, what)                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        CHECK(rc_ == (want), "%s: %s, want %s", what, tern_err_name(rc_),           \
              tern_err_name(want));                                                  \
    } while (0)

START_TEST(hostile_lput)
{
    static uint8_t big[64];
    struct tern_rpc_ep *ep;
    struct tern_session *s1, *s2;
    struct tern_kv *kv;
    struct kv_lease l, l2;
    struct kv_onesided_info oi;
    struct kv_info info;
    char in[32], in2[32], out[32];
    size_t kin, kin2, kout, got;
    uint64_t keys0, ver = 0, ver2 = 0, intent = INTENT_BIT | 0x1234;
    uint32_t size, next;
    uint8_t *p;
    int shm = test_fabric_row("shm");
    int rc;

    /* Server 0 owns the low half (the raw tests), server 1 the high half
     * (so that the library can open both at the end). */
    start_os_server(0, shm, &(struct test_kv_srv){.lo = 0, .hi = 0x7fffffff});
    start_os_server(1, shm, &(struct test_kv_srv){.lo = 0x80000000u, .hi = 0xffffffffu});
    ep = test_rpc_ep(NULL);
    s1 = test_kv_session(ep, 0);
    s2 = test_kv_session(ep, 0);
    kv_key_in_range(in, sizeof(in), &kin, "in", 0, 0x7fffffff);
    kv_key_in_range(in2, sizeof(in2), &kin2, "in2", 0, 0x7fffffff);
    kv_key_in_range(out, sizeof(out), &kout, "out", 0x80000000u, 0xffffffffu);

    /* What OS_INFO says matches the pool. */
    rc = test_kv_call(s1, KV_M_ONESIDED_INFO, NULL, 0, &oi, sizeof(oi), &got);
    CHECK(rc == 0, "os_info: %s", tern_err_name(rc));
    ck_assert_uint_eq(got, sizeof(oi));
    rc = test_kv_call(s1, KV_M_INFO, NULL, 0, &info, sizeof(info), &got);
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(oi.seg_size, 64 * KIB);
    ck_assert(oi.n_blocks && !(oi.n_blocks & (oi.n_blocks - 1)));
    ck_assert(memcmp(oi.uuid, info.uuid, sizeof(oi.uuid)) == 0);
    keys0 = info.keys;

    /* LPUT without any lease. */
    EXPECT_RC(lput(s2, 0, 64, intent, NULL), TERN_ENOLEASE, "lput, no lease, seg 0");
    EXPECT_RC(lput(s2, 77, 64, intent, NULL), TERN_ENOLEASE, "lput, no lease, seg 77");
    EXPECT_RC(lput(s2, UINT32_MAX, 64, intent, NULL), TERN_ENOLEASE, "lput, seg ~0");

    /* s1 leases and writes a good record; s2 claims it. */
    l = raw_lease(s1);
    ck_assert_uint_eq(l.end, 64 * KIB);
    ck_assert_uint_ge(l.next, PM_SEG_HDR);
    p = lease_ptr(ep, s1, &l, l.next, 1024);
    size = put_record(p, in, (uint16_t)kin, "hello", 5, intent, PM_VALUE);
    EXPECT_RC(lput(s2, l.seg, l.next, intent, NULL), TERN_ENOLEASE, "lput on s1's segment");
    ck_assert_uint_eq(test_kv_info(s2).keys, keys0);

    /* s1 itself, wrong: offset, intent without its top bit, intent that is
     * not the record's. Nothing is stored by any of them. */
    EXPECT_RC(lput(s1, l.seg, l.next + 8, intent, NULL), TERN_EINVAL, "lput, offset + 8");
    EXPECT_RC(lput(s1, l.seg, l.next - 8, intent, NULL), TERN_EINVAL, "lput, offset - 8");
    EXPECT_RC(lput(s1, l.seg, 0, intent, NULL), TERN_EINVAL, "lput, offset 0");
    EXPECT_RC(lput(s1, l.seg, UINT32_MAX - 7, intent, NULL), TERN_EINVAL, "lput, offset ~0");
    put_record(p, in, (uint16_t)kin, "hello", 5, 5, PM_VALUE);
    EXPECT_RC(lput(s1, l.seg, l.next, 5, NULL), TERN_EPROTO, "lput, intent 5 (a version)");
    put_record(p, in, (uint16_t)kin, "hello", 5, intent, PM_VALUE);
    EXPECT_RC(lput(s1, l.seg, l.next, intent + 1, NULL), TERN_EPROTO,
              "lput, intent not the record's");
    EXPECT_RC(lput(s1, l.seg, l.next, intent & ~INTENT_BIT, NULL), TERN_EPROTO,
              "lput, the record's intent without its top bit");
    ck_assert_uint_eq(test_kv_info(s1).keys, keys0);

    /* Now right: stored, with a version, at the offset that was free. */
    EXPECT_RC(lput(s1, l.seg, l.next, intent, &ver), 0, "good lput");
    ck_assert_uint_gt(ver, 0);
    ck_assert_uint_lt(ver, INTENT_BIT);
    ck_assert_uint_eq(test_kv_info(s1).keys, keys0 + 1);
    next = l.next + size;
    /* The same LPUT again: that offset is taken now. */
    EXPECT_RC(lput(s1, l.seg, l.next, intent, NULL), TERN_EINVAL, "replayed lput");
    ck_assert_uint_eq(test_kv_info(s1).keys, keys0 + 1);

    /* Malformed records: refused, nothing changes, the lease goes on. */
    {
        /* Room left in the segment from `next` on, for a record of a
         * 4-byte key: one byte more than that runs past the end. */
        const uint32_t room = 64 * KIB - next - (uint32_t)sizeof(struct pm_rec) - 4;
        const struct {
            const char *what;
            uint16_t klen;
            uint32_t vlen;
            uint8_t type, flags;
            uint32_t slot;
        } bad[] = {
            {"key_len 0", 0, 5, PM_VALUE, 0, 0},
            {"key_len over the maximum", PM_KEY_MAX + 1, 5, PM_VALUE, 0, 0},
            {"type 0", 4, 5, 0, 0, 0},
            {"type 9", 4, 5, 9, 0, 0},
            {"flags set", 4, 5, PM_VALUE, PM_F_REWRITTEN, 0},
            {"slot set", 4, 5, PM_VALUE, 0, 4096},
            {"val_len of a whole segment", 4, 64 * KIB, PM_VALUE, 0, 0},
            {"val_len one byte past the segment's end", 4, room + 1, PM_VALUE, 0, 0},
            {"val_len ~0", 4, UINT32_MAX, PM_VALUE, 0, 0},
            {"val_len ~0 - 31", 4, UINT32_MAX - 31, PM_VALUE, 0, 0},
        };

        p = lease_ptr(ep, s1, &l, next, 1024);
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            struct pm_rec h = {.val_len = bad[b].vlen, .version = ++intent,
                                    .key_len = bad[b].klen, .type = bad[b].type,
                                    .flags = bad[b].flags, .slot = bad[b].slot};

            memcpy(p, &h, sizeof(h));
            memcpy(p + sizeof(h), "keyXvalue", 9);
            /* Summed where the lengths are sane, so that the field under
             * test is all that is wrong. */
            if (bad[b].klen <= 4 && bad[b].vlen <= 5) {
                h.sum = pm_rec_sum_of((const struct pm_rec *)p);
                memcpy(p, &h.sum, sizeof(h.sum));
            }
            rc = lput(s1, l.seg, next, intent, NULL);
            CHECK(rc < 0, "record with %s: stored", bad[b].what);
            CHECK(rc == TERN_EPROTO || rc == TERN_EINVAL, "record with %s: %s",
                  bad[b].what, tern_err_name(rc));
            ck_assert_uint_eq(test_kv_info(s1).keys, keys0 + 1);
        }
        /* The same offset takes a good record afterwards. */
        size = put_record(p, in2, (uint16_t)kin2, "second", 6, ++intent, PM_VALUE);
        EXPECT_RC(lput(s1, l.seg, next, intent, &ver2), 0, "good lput after bad ones");
        ck_assert_uint_gt(ver2, ver);
        next += size;
    }

    /* A tombstone is not a value: refused, and it ends the lease. */
    p = lease_ptr(ep, s1, &l, next, 1024);
    put_record(p, in, (uint16_t)kin, "", 0, ++intent, PM_TOMBSTONE);
    EXPECT_RC(lput(s1, l.seg, next, intent, NULL), TERN_EPROTO, "tombstone record");
    put_record(p, in, (uint16_t)kin, "again", 5, ++intent, PM_VALUE);
    EXPECT_RC(lput(s1, l.seg, next, intent, NULL), TERN_ENOLEASE, "lput after a tombstone");
    ck_assert_uint_eq(test_kv_info(s1).keys, keys0 + 2);

    /* A key of the other server's half: TERN_EWRONGNODE, and the lease is
     * gone with the record. */
    l = raw_lease(s1);
    p = lease_ptr(ep, s1, &l, l.next, 1024);
    put_record(p, out, (uint16_t)kout, "elsewhere", 9, ++intent, PM_VALUE);
    EXPECT_RC(lput(s1, l.seg, l.next, intent, NULL), TERN_EWRONGNODE, "key out of range");
    put_record(p, in, (uint16_t)kin, "again", 5, ++intent, PM_VALUE);
    EXPECT_RC(lput(s1, l.seg, l.next, intent, NULL), TERN_ENOLEASE,
              "lput after a wrong-node record");
    ck_assert_uint_eq(test_kv_info(s1).keys, keys0 + 2);

    /* Asking for a lease again hands the old one back. */
    l = raw_lease(s1);
    l2 = raw_lease(s1);
    p = lease_ptr(ep, s1, &l2, l2.next, 1024);
    put_record(p, in, (uint16_t)kin, "new lease", 9, ++intent, PM_VALUE);
    if (l.seg != l2.seg)
        EXPECT_RC(lput(s1, l.seg, l2.next, intent, NULL), TERN_ENOLEASE,
                  "lput on a returned lease");
    EXPECT_RC(lput(s1, l2.seg, l2.next, intent, &ver), 0, "lput on the new lease");

    /* Truncated and oversized payloads. */
    memset(big, 0, sizeof(big));
    EXPECT_RC(test_kv_call(s1, KV_M_LPUT, big, 0, NULL, 0, NULL), TERN_EPROTO, "lput, empty");
    EXPECT_RC(test_kv_call(s1, KV_M_LPUT, big, sizeof(struct kv_lput) - 1, NULL, 0, NULL),
              TERN_EPROTO, "lput, truncated");
    EXPECT_RC(test_kv_call(s1, KV_M_LPUT, big, sizeof(struct kv_lput) + 8, NULL, 0, NULL),
              TERN_EPROTO, "lput, oversized");
    EXPECT_RC(test_kv_call(s1, KV_M_LEASE, big, 0, NULL, 0, NULL), TERN_EPROTO, "lease, empty");
    EXPECT_RC(test_kv_call(s1, KV_M_LEASE, big, sizeof(struct kv_lease_req) - 1, NULL, 0, NULL),
              TERN_EPROTO, "lease, truncated");
    EXPECT_RC(test_kv_call(s1, KV_M_LEASE, big, sizeof(struct kv_lease_req) + 8, NULL, 0, NULL),
              TERN_EPROTO, "lease, oversized");
    {
        struct kv_lease_req q = {.flags = 1};

        EXPECT_RC(test_kv_call(s1, KV_M_LEASE, &q, sizeof(q), NULL, 0, NULL), TERN_EPROTO,
                  "lease with flags");
        q = (struct kv_lease_req){.reserved = 1};
        EXPECT_RC(test_kv_call(s1, KV_M_LEASE, &q, sizeof(q), NULL, 0, NULL), TERN_EPROTO,
                  "lease with reserved bits");
    }
    EXPECT_RC(test_kv_call(s1, KV_M_ONESIDED_INFO, big, 8, NULL, 0, NULL), TERN_EPROTO,
              "os_info, payload");

    /* After all of it: the values that were accepted, a normal client. */
    kv = kv_open_path(ep, 2, TERN_KV_PATH_ONESIDED);
    kv_expect_get(kv, in, kin, "new lease", 9, ver);
    kv_expect_get(kv, in2, kin2, "second", 6, ver2);
    kv_expect_enoent(kv, out, kout);
    must_os_put(kv, ep, "normal", 6, "client", 6, &ver);
    kv_expect_get(kv, "normal", 6, "client", 6, ver);
    tern_rpc_disconnect(s1);
    tern_rpc_disconnect(s2);
    test_kv_end(ep, kv, 2);
}
END_TEST

/* Take-back as the wire shows it: a taken-back lease's LPUTs are refused
 * (its client must lease again), and asking again while the only lease is
 * busy gets TERN_ENOBUFS. Raw sessions, shm. */
START_TEST(lease_take_back_on_the_wire)
{
    struct test_kv_srv o = {.os = {.max_leases = 1, .lease_idle_ns = 50000000ull}};
    struct tern_rpc_ep *ep;
    struct tern_session *s1, *s2;
    struct kv_lease l1, l2;
    struct kv_lease_req q = {0};
    uint64_t intent = INTENT_BIT | 7, ver = 0;
    uint8_t *p;

    start_os_server(0, test_fabric_row("shm"), &o);
    ep = test_rpc_ep(NULL);
    s1 = test_kv_session(ep, 0);
    s2 = test_kv_session(ep, 0);
    l1 = raw_lease(s1);
    /* The only lease is out and busy: no second one. */
    EXPECT_RC(test_kv_call(s2, KV_M_LEASE, &q, sizeof(q), NULL, 0, NULL), TERN_ENOBUFS,
              "second lease while the first is fresh");
    usleep(100 * 1000);
    l2 = raw_lease(s2);                 /* s1's sat idle: taken back */
    ck_assert_uint_ne(l1.seg, l2.seg);
    p = lease_ptr(ep, s1, &l1, l1.next, 256);
    put_record(p, "late", 4, "write", 5, ++intent, PM_VALUE);
    EXPECT_RC(lput(s1, l1.seg, l1.next, intent, NULL), TERN_ENOLEASE,
              "lput on a lease taken back");
    /* s2's is fresh: s1 cannot take it back yet. */
    EXPECT_RC(test_kv_call(s1, KV_M_LEASE, &q, sizeof(q), NULL, 0, NULL), TERN_ENOBUFS,
              "lease while the other is fresh");
    p = lease_ptr(ep, s2, &l2, l2.next, 256);
    put_record(p, "s2", 2, "mine", 4, ++intent, PM_VALUE);
    EXPECT_RC(lput(s2, l2.seg, l2.next, intent, &ver), 0, "lput on the new lease");
    ck_assert_uint_gt(ver, 0);
    usleep(100 * 1000);
    l1 = raw_lease(s1);                 /* now s2's is idle */
    p = lease_ptr(ep, s2, &l2, l2.next + pm_rec_size(2, 4), 256);
    put_record(p, "s2b", 3, "late", 4, ++intent, PM_VALUE);
    EXPECT_RC(lput(s2, l2.seg, l2.next + pm_rec_size(2, 4), intent, NULL), TERN_ENOLEASE,
              "lput on the second lease taken back");
    ck_assert_uint_eq(test_kv_info(s1).keys, 1);      /* only s2's good record */
    tern_rpc_disconnect(s1);
    tern_rpc_disconnect(s2);
    test_kv_end(ep, NULL, 1);
}
END_TEST

/* ---- 8b: leases cannot crowd the pool's other writers out ---- */

/* A PUT by RPC on a raw session. */
static int raw_put(struct tern_session *s, const char *key, const void *val, uint32_t len)
{
    static uint8_t req[64 * KIB];
    struct kv_key k = {.klen = (uint16_t)strlen(key), .vlen = len};
    struct kv_val v;

    ck_assert_uint_le(sizeof(k) + k.klen + len, sizeof(req));
    memcpy(req, &k, sizeof(k));
    memcpy(req + sizeof(k), key, k.klen);
    memcpy(req + sizeof(k) + k.klen, val, len);
    return test_kv_call(s, KV_M_PUT, req, sizeof(k) + k.klen + len, &v, sizeof(v), NULL);
}

/* 300 sessions each ask for a lease, as many clients starting at once
 * would: leases take at most their share of the pool (a quarter of its 128
 * segments by default), the others are told TERN_ENOSPC, and PUTs by RPC
 * still find room for far more than what was left to them before (the
 * pool's last two segments). */
START_TEST(many_lessees_leave_room_for_puts)
{
    enum { N_SESS = 300, N_PUTS = 40, VLEN = 30 * KIB };
    static struct tern_session *ss[N_SESS];
    static uint8_t val[VLEN];
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    unsigned granted = 0;
    char k[32];

    start_os_server(0, test_fabric_row("tcp"), NULL);
    ep = test_rpc_ep(NULL);
    for (int i = 0; i < N_SESS; i++) {
        struct kv_lease_req q = {0};
        struct kv_lease l;
        size_t got = 0;
        int rc;

        ss[i] = test_kv_session(ep, 0);
        rc = test_kv_call(ss[i], KV_M_LEASE, &q, sizeof(q), &l, sizeof(l), &got);
        CHECK(rc == 0 || rc == TERN_ENOSPC, "lease %d: %s", i, tern_err_name(rc));
        granted += rc == 0;
    }
    CHECK(granted >= 1 && granted <= 128 / 4, "%u leases granted of a 128-segment pool",
          granted);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    for (int i = 0; i < N_PUTS; i++) {
        int kl = snprintf(k, sizeof(k), "after-leases-%d", i);

        test_pattern(val, sizeof(val), (unsigned)i);
        kv_must_put(kv, k, (size_t)kl, val, sizeof(val), NULL);
    }
    for (int i = 0; i < N_PUTS; i += 13) {
        int kl = snprintf(k, sizeof(k), "after-leases-%d", i);

        test_pattern(val, sizeof(val), (unsigned)i);
        kv_expect_get(kv, k, (size_t)kl, val, sizeof(val), 0);
    }
    /* A session that holds a lease still stores by RPC. */
    EXPECT_RC(raw_put(ss[0], "by-rpc", "v", 1), 0, "RPC PUT on a lessee's session");
    for (int i = 0; i < N_SESS; i++)
        tern_rpc_disconnect(ss[i]);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* One session asking for lease after lease without filling them: after
 * session_leases (4 by default) handed back under half written, it is
 * refused with TERN_EBUSY, and stays refused while other sessions still
 * lease and it still stores by RPC. A lease it filled at least half way
 * does not count against it. Raw session on shm. */
START_TEST(session_lease_quota)
{
    enum { BIG = 31 * KIB };
    static uint8_t big[BIG];
    struct kv_lease_req q = {0};
    struct tern_rpc_ep *ep;
    struct tern_session *s, *s2;
    struct kv_lease l;
    uint64_t intent = INTENT_BIT | 77, ver = 0;
    uint8_t *p;

    start_os_server(0, test_fabric_row("shm"), NULL);
    ep = test_rpc_ep(NULL);
    s = test_kv_session(ep, 0);
    s2 = test_kv_session(ep, 0);
    /* Filled past half (64 KiB segments, a page before the records): this
     * one does not count. */
    l = raw_lease(s);
    test_pattern(big, sizeof(big), 5);
    p = lease_ptr(ep, s, &l, l.next, pm_rec_size(3, BIG));
    put_record(p, "big", 3, big, BIG, ++intent, PM_VALUE);
    CHECK((uint64_t)pm_rec_size(3, BIG) * 2 >= l.end - l.base, "the record fills %u of %u",
          pm_rec_size(3, BIG), l.end - l.base);
    EXPECT_RC(lput(s, l.seg, l.next, intent, &ver), 0, "lput of the big record");
    /* Four more, each handed back empty by the next ask: the ask after
     * the fourth is refused. */
    for (int i = 0; i < 4; i++)
        l = raw_lease(s);
    EXPECT_RC(test_kv_call(s, KV_M_LEASE, &q, sizeof(q), NULL, 0, NULL), TERN_EBUSY,
              "lease after four handed back unused");
    EXPECT_RC(test_kv_call(s, KV_M_LEASE, &q, sizeof(q), NULL, 0, NULL), TERN_EBUSY,
              "lease asked again");
    /* The refusal handed its last lease back: it is gone. */
    EXPECT_RC(lput(s, l.seg, l.next, ++intent, NULL), TERN_ENOLEASE, "lput after the refusal");
    /* Others are not affected, and the refused session stores by RPC. */
    l = raw_lease(s2);
    EXPECT_RC(raw_put(s, "rpc-after-refusal", "stored", 6), 0, "RPC PUT of a refused session");
    ck_assert_uint_eq(test_kv_info(s2).keys, 2);
    tern_rpc_disconnect(s);
    tern_rpc_disconnect(s2);
    test_kv_end(ep, NULL, 1);
}
END_TEST

/* A lease left idle gives its segment back once the pool needs it: the pool
 * (12 segments of 64 KiB, 3 records of ~21 KB each) takes exactly as many
 * records as it would with no lease at all, 3 for each segment but the two
 * kept free. Filling stops at TERN_ENOSPC; the client waits a little (the
 * idle lease's key is withdrawn first, its lease ends a while later) and
 * goes on, a few times at most. The quiet lessee then finds its key
 * withdrawn (where the client maps it: shm) and its LPUT refused. _i: tcp,
 * shm. */
START_TEST(idle_lease_returns_to_pool)
{
    enum { SEGS = 12, PER_SEG = 3, VLEN = 21000 };
    static const char *const fabrics[] = {"tcp", "shm"};
    struct test_kv_srv o = {.pool_size = SEGS * 64ull * KIB + 4096,
                            .os = {.lease_idle_ns = 50000000ull}};
    int fabric = test_fabric_row(fabrics[_i]);
    static uint8_t val[VLEN];
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct tern_kv *kv;
    struct kv_lease l;
    unsigned stored = 0;
    char k[32];

    ck_assert_uint_eq(PER_SEG * pm_rec_size(6, VLEN) <= 64 * KIB - 64 &&
                      (PER_SEG + 1) * pm_rec_size(6, VLEN) > 64 * KIB - 64, 1);
    start_os_server(0, fabric, &o);
    ep = test_rpc_ep(NULL);
    s = test_kv_session(ep, 0);
    l = raw_lease(s);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    usleep(100 * 1000);                 /* past lease_idle_ns */
    for (int round = 0; round < 5 && stored < (SEGS - 2) * PER_SEG; round++) {
        int rc = 0;

        while (rc == 0) {
            int kl = snprintf(k, sizeof(k), "r%05u", stored);

            test_pattern(val, sizeof(val), stored);
            rc = tern_kv_put(kv, k, (size_t)kl, val, sizeof(val), NULL);
            CHECK(rc == 0 || rc == TERN_ENOSPC, "put %s: %s", k, tern_err_name(rc));
            stored += rc == 0;
        }
        usleep(150 * 1000);             /* past the withdrawn key's grace */
    }
    CHECK(stored == (SEGS - 2) * PER_SEG, "%u records stored, want %u: the idle lease's "
          "segment never came back", stored, (SEGS - 2) * PER_SEG);
    for (unsigned i = 0; i < stored; i += 7) {
        int kl = snprintf(k, sizeof(k), "r%05u", i);

        test_pattern(val, sizeof(val), i);
        kv_expect_get(kv, k, (size_t)kl, val, sizeof(val), 0);
    }
    if (test_fabric_caps(fabric) & TERN_TP_CAP_RKEY_PTR) {
        double t0 = now_ms();
        void *p;
        int rc;

        while ((rc = tern_session_rkey_ptr(s, &l.rkey, 0, 256, TERN_TP_ACCESS_REMOTE_WRITE,
                                           &p)) == TERN_EAGAIN) {
            CHECK(now_ms() - t0 < 3000, "no answer about the withdrawn key");
            tern_rpc_poll(ep);
        }
        CHECK(rc == TERN_EREMACCESS, "the reclaimed lease's key: %s", tern_err_name(rc));
    }
    EXPECT_RC(lput(s, l.seg, l.next, INTENT_BIT | 1, NULL), TERN_ENOLEASE,
              "lput on the reclaimed lease");
    tern_rpc_disconnect(s);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* A lessee that damages what its lease lets it write: the pool must still
 * open after a restart, with every value other clients were told was
 * stored. The segment's header is out of its reach: the lease starts a
 * page in, it ends at the segment's end, and the pool's key is read-only.
 * _i 0: the lessee fills everything it can reach past its record with
 * junk, then leaves, and the server stops cleanly; _i 1: the same, but the
 * server is killed while the lease is live, after acknowledging a later
 * record of the same lease (whose commit moves the header's commit point);
 * _i 2: it sends a record whose body does not match its sum (the pool does
 * not read the body: the lessee's loss, pm.h), then a good one, and the
 * server is killed. */
START_TEST(hostile_lessee_header)
{
    struct kvs_opts so = {0};
    struct kvs *st = NULL;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct tern_kv *kv;
    struct kv_lease l;
    uint64_t v, v2, mine = 0, intent = INTENT_BIT | 99;
    uint32_t next, size;
    uint8_t *p;
    int rc;

    start_os_server(0, test_fabric_row("shm"), NULL);
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    kv_must_put(kv, "victim", 6, "safe", 4, &v);
    s = test_kv_session(ep, 0);
    l = raw_lease(s);
    p = lease_ptr(ep, s, &l, l.next, 256);
    next = l.next + put_record(p, "mine", 4, "ok", 2, intent, PM_VALUE);
    EXPECT_RC(lput(s, l.seg, l.next, intent, &mine), 0, "lessee's own record");
    if (_i == 2) {
        p = lease_ptr(ep, s, &l, next, 256);
        size = put_record(p, "liar", 4, "honest", 6, ++intent, PM_VALUE);
        p[sizeof(struct pm_rec) + 4] ^= 0x20;     /* "Honest" */
        rc = lput(s, l.seg, next, intent, NULL);
        CHECK(rc == 0 || rc == TERN_EPROTO, "record with a wrong sum: %s", tern_err_name(rc));
        next += rc == 0 ? size : 0;
        p = lease_ptr(ep, s, &l, next, 256);
        put_record(p, "after", 5, "ok", 2, ++intent, PM_VALUE);
        rc = lput(s, l.seg, next, intent, NULL);
        CHECK(rc == 0 || rc == TERN_ENOLEASE, "record after the liar's: %s", tern_err_name(rc));
        kv_must_put(kv, "victim2", 7, "also safe", 9, &v2);
        test_kv_kill(0);
        tern_rpc_disconnect(s);
        tern_kv_close(kv);
        tern_rpc_close(ep);
        goto restart;
    }
    /* The lease's first byte is a page boundary past the header... */
    ck_assert_uint_ge(l.base, PM_SEG_HDR);
    ck_assert_uint_eq(l.base % (uint32_t)sysconf(_SC_PAGESIZE), 0);
    ck_assert_uint_eq(l.next, l.base);
    /* ...its key reaches the segment's end and no further... */
    {
        void *q;
        struct kv_onesided_info oi;
        size_t got = 0;

        EXPECT_RC(tern_session_rkey_ptr(s, &l.rkey, l.end - l.base, 1,
                                        TERN_TP_ACCESS_REMOTE_WRITE, &q),
                  TERN_EREMACCESS, "a byte past the lease's end");
        /* ...and the pool's key, which reaches the header, is read-only. */
        EXPECT_RC(test_kv_call(s, KV_M_ONESIDED_INFO, NULL, 0, &oi, sizeof(oi), &got), 0,
                  "os_info");
        lease_ptr(ep, s, &l, l.base, 1);   /* (maps the pool's file) */
        while ((rc = tern_session_rkey_ptr(s, &oi.pool, oi.seg0 + l.seg * (uint64_t)oi.seg_size,
                                           PM_SEG_HDR, TERN_TP_ACCESS_REMOTE_WRITE,
                                           &q)) == TERN_EAGAIN)
            tern_rpc_poll(ep);
        EXPECT_RC(rc, TERN_EREMACCESS, "the segment's header, for writing, by the pool's key");
    }
    /* Junk in everything the lease reaches past the lessee's record. */
    p = lease_ptr(ep, s, &l, next, l.end - next);
    memset(p, 0xa5, l.end - next);
    if (_i == 0) {
        tern_rpc_disconnect(s);
        kv_must_put(kv, "victim2", 7, "also safe", 9, &v2);
        tern_kv_close(kv);
        tern_rpc_close(ep);
        test_kv_finish(0);
    } else {
        p = lease_ptr(ep, s, &l, next, 256);
        put_record(p, "mine2", 5, "ok", 2, ++intent, PM_VALUE);
        EXPECT_RC(lput(s, l.seg, next, intent, NULL), 0, "lessee's second record");
        kv_must_put(kv, "victim2", 7, "also safe", 9, &v2);
        test_kv_kill(0);
        tern_rpc_disconnect(s);
        tern_kv_close(kv);
        tern_rpc_close(ep);
    }

restart:
    so.path = test_kv_pool(0);
    rc = kvs_open(&so, &st);
    CHECK(rc == 0, "the pool no longer opens after a lessee %s (%s): %s",
          _i == 2 ? "sent a record with a wrong sum" : "wrote junk into its segment",
          _i ? "server killed" : "server stopped", tern_err_name(rc));
    kvs_close(st);
    start_os_server(0, test_fabric_row("shm"), NULL);
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    kv_expect_get(kv, "victim", 6, "safe", 4, v);
    kv_expect_get(kv, "victim2", 7, "also safe", 9, v2);
    /* The liar keeps what it wrote before its lie (recovery cuts the
     * segment at the bad record, not before). */
    if (_i == 2)
        kv_expect_get(kv, "mine", 4, "ok", 2, mine);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 9: the window's functions, without processes ---- */

/* A hash in block `block` (of n) whose tag is built from `t`. */
static uint64_t hash_in(uint32_t block, uint32_t t)
{
    return (uint64_t)(t * 2 + 2) << 20 | block;
}

/* Look the hash up in the window as a reader does: copy its block, find a
 * whole bucket with its tag. */
static bool window_find(const struct kv_window *w, uint64_t h, struct kvw_bucket *out)
{
    struct kvw_block blk;

    memcpy(&blk, (const uint8_t *)w->hdr + kvw_block_off(kvw_block_of(h, w->n_blocks)),
           sizeof(blk));
    for (unsigned i = 0; i < KVW_BUCKETS; i++)
        if (kvw_bucket_whole(&blk.b[i]) && blk.b[i].tag == kvw_tag(h)) {
            *out = blk.b[i];
            return true;
        }
    return false;
}

START_TEST(window_unit)
{
    enum { NB = 4 };
    static const uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    struct kv_window w, off = {0};
    struct kvw_bucket b, t;
    uint32_t slot = 0, slots[KVW_BUCKETS + 1] = {0}, s0;
    uint64_t h = hash_in(2, 1);
    void *mem = calloc(1, kvw_bytes(NB));

    ck_assert_ptr_nonnull(mem);
    ck_assert_uint_eq(kvw_bytes(NB), sizeof(struct kvw_hdr) + NB * 256);
    kv_window_init(&w, mem, NB, uuid);
    ck_assert_uint_eq(w.hdr->magic, KVW_MAGIC);
    ck_assert_uint_eq(w.hdr->n_blocks, NB);
    ck_assert(memcmp(w.hdr->pool_uuid, uuid, 16) == 0);
    ck_assert(!window_find(&w, h, &b));

    /* A set bucket is found whole, with what was set, in its block. */
    kv_window_set(&w, &slot, h, 3ull << 32 | 128, 77, 64);
    ck_assert_uint_ne(slot, 0);
    ck_assert_uint_eq((slot - 1) / KVW_BUCKETS, 2);
    ck_assert_uint_eq(w.mirrored, 1);
    ck_assert(window_find(&w, h, &b));
    ck_assert_uint_eq(b.tag, kvw_tag(h));
    ck_assert_uint_ne(b.tag, 0);
    ck_assert_uint_eq(b.loc, 3ull << 32 | 128);
    ck_assert_uint_eq(b.version, 77);
    ck_assert_uint_eq(b.size, 64);
    ck_assert_uint_eq(b.seq & 1, 0);
    ck_assert_uint_ne(b.seq, 0);
    /* Updated in its bucket, under a new even sequence. */
    s0 = slot;
    kv_window_set(&w, &slot, h, 4ull << 32 | 256, 78, 72);
    ck_assert_uint_eq(slot, s0);
    ck_assert_uint_eq(w.mirrored, 1);
    ck_assert(window_find(&w, h, &t));
    ck_assert_uint_eq(t.version, 78);
    ck_assert_uint_eq(t.loc, 4ull << 32 | 256);
    ck_assert_uint_eq(t.size, 72);
    ck_assert_uint_eq(t.seq, b.seq + 2);
    b = t;

    /* Odd sequence (with a checksum that fits it) or any flipped bit: not
     * whole. */
    t = b;
    t.seq++;
    t.sum = kvw_bucket_sum(&t);
    ck_assert(!kvw_bucket_whole(&t));
    for (size_t i = 0; i < sizeof(b) * 8; i++) {
        t = b;
        ((uint8_t *)&t)[i / 8] ^= (uint8_t)(1u << (i % 8));
        CHECK(!kvw_bucket_whole(&t), "bit %zu flipped: still whole", i);
    }
    ck_assert(kvw_bucket_whole(&b));

    /* A full block: 8 keys placed in 8 buckets, the 9th left out. */
    for (unsigned i = 0; i <= KVW_BUCKETS; i++)
        kv_window_set(&w, &slots[i], hash_in(1, 10 + i), (uint64_t)i << 32 | 64, 100 + i, 40);
    for (unsigned i = 0; i < KVW_BUCKETS; i++) {
        ck_assert_uint_eq((slots[i] - 1) / KVW_BUCKETS, 1);
        for (unsigned j = 0; j < i; j++)
            ck_assert_uint_ne(slots[i], slots[j]);
        ck_assert(window_find(&w, hash_in(1, 10 + i), &t));
        ck_assert_uint_eq(t.version, 100 + i);
    }
    ck_assert_uint_eq(slots[KVW_BUCKETS], 0);
    ck_assert_uint_eq(w.unplaced, 1);
    ck_assert_uint_eq(w.mirrored, 1 + KVW_BUCKETS);
    ck_assert(!window_find(&w, hash_in(1, 10 + KVW_BUCKETS), &t));
    /* The other blocks are untouched by it. */
    ck_assert(window_find(&w, h, &t));
    ck_assert_uint_eq(t.version, 78);

    /* Cleared: gone, its bucket whole and empty, and free for another key. */
    s0 = slots[3];
    kv_window_clear(&w, &slots[3]);
    ck_assert_uint_eq(slots[3], 0);
    ck_assert_uint_eq(w.mirrored, KVW_BUCKETS);
    ck_assert(!window_find(&w, hash_in(1, 13), &t));
    t = w.bk[s0 - 1];
    ck_assert(kvw_bucket_whole(&t));
    ck_assert_uint_eq(t.tag, 0);
    kv_window_clear(&w, &slots[3]);     /* not in the window: nothing */
    ck_assert_uint_eq(w.mirrored, KVW_BUCKETS);
    kv_window_set(&w, &slots[KVW_BUCKETS], hash_in(1, 10 + KVW_BUCKETS), 9ull << 32 | 64, 200,
                  40);
    ck_assert_uint_eq(slots[KVW_BUCKETS], s0);
    ck_assert(window_find(&w, hash_in(1, 10 + KVW_BUCKETS), &t));
    ck_assert_uint_eq(t.version, 200);
    /* A detached window takes nothing. */
    slot = 0;
    kv_window_set(&off, &slot, h, 1, 1, 40);
    ck_assert_uint_eq(slot, 0);
    free(mem);

    /* Records: whole only with the right version, key, bytes and size. */
    {
        static uint8_t rec[512];
        struct pm_rec *r = (void *)rec;
        uint8_t val[100];
        uint32_t size = pm_rec_size(7, sizeof(val));

        test_pattern(val, sizeof(val), 5);
        put_record(rec, "rec-key", 7, val, sizeof(val), 55, PM_VALUE);
        ck_assert(kvw_record_valid(rec, size, "rec-key", 7, 55));
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 56));
        ck_assert(!kvw_record_valid(rec, size, "rec-kex", 7, 55));
        ck_assert(!kvw_record_valid(rec, size, "rec-ke", 6, 55));
        ck_assert(!kvw_record_valid(rec, size + 8, "rec-key", 7, 55));
        ck_assert(!kvw_record_valid(rec, size - 8, "rec-key", 7, 55));
        ck_assert(!kvw_record_valid(rec, 8, "rec-key", 7, 55));
        rec[sizeof(*r) + 7 + 50] ^= 0x10;
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 55));
        rec[sizeof(*r) + 7 + 50] ^= 0x10;
        ck_assert(kvw_record_valid(rec, size, "rec-key", 7, 55));
        r->version = 56;        /* rewritten in place, sum and all */
        r->sum = pm_rec_sum_of(r);
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 55));
        ck_assert(kvw_record_valid(rec, size, "rec-key", 7, 56));
        r->type = PM_TOMBSTONE;
        r->sum = pm_rec_sum_of(r);
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 56));
    }
}
END_TEST

/* ---- 10: GET by server push (TERN_KV_PATH_PUSH) ---- */

/* Does a GET of a value this long come by push on the fabric? The client
 * offers a staging slot of 64 KiB + 256 bytes (kv_client_path.c STAGE_SLOT):
 * a record that does not fit comes inline in the reply. On ntb a one-sided
 * operation is one ring record (~16 KiB, see fits_onesided): the server's
 * put of a bigger record cannot be posted (TERN_EMSGSIZE), so the value
 * comes inline there as well. The sizes tested stay clear of both edges:
 * 8 B and 1 KiB are pushed everywhere, 56 KiB everywhere but on ntb, and
 * 100 KiB nowhere. */
static bool push_fits(int fabric, size_t vlen)
{
    return vlen <= 56 * KIB &&
           (!is_ntb(fabric) || vlen <= 8 * KIB);
}

/* What one GET (or a batch of them) did to a client's counters. */
static void expect_gets(const struct tern_kv_onesided_stats *a, const struct tern_kv_onesided_stats *b,
                        uint64_t pushed, uint64_t rpc, const char *what)
{
    CHECK(b->gets_pushed - a->gets_pushed == pushed && b->gets_rpc - a->gets_rpc == rpc &&
              b->gets_direct == a->gets_direct && b->torn == a->torn,
          "%s: %llu pushed (want %llu), %llu by RPC or inline (want %llu), %llu direct, "
          "%llu torn", what, (unsigned long long)(b->gets_pushed - a->gets_pushed),
          (unsigned long long)pushed, (unsigned long long)(b->gets_rpc - a->gets_rpc),
          (unsigned long long)rpc, (unsigned long long)(b->gets_direct - a->gets_direct),
          (unsigned long long)(b->torn - a->torn));
}

struct push_async {
    const uint8_t *want;
    size_t len;
    uint64_t version;
    unsigned done;
    int err;
};

static void push_async_done(void *arg, int status, const void *val, size_t len,
                            uint64_t version)
{
    struct push_async *pa = arg;

    pa->done++;
    if (status < 0)
        pa->err = status;
    else if (len != pa->len || memcmp(val, pa->want, len) != 0 || version != pa->version)
        pa->err = TERN_EPROTO;
}

START_TEST(push_roundtrip_every_fabric)
{
    static const size_t sizes[] = {8, 1 * KIB, 56 * KIB, 100 * KIB};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]), N_ASYNC = 64 };
    static uint8_t val[NS][100 * KIB], small[64];
    uint64_t v_rpc[NS], v_push[NS], v1, v2;
    struct tern_kv_onesided_stats st0, st1;
    struct push_async pa;
    struct tern_rpc_ep *ep;
    struct tern_kv *push, *rpc;
    unsigned want = 0;
    char k[32];
    int kl;

    /* 256 KiB segments: the store takes values bigger than a staging slot. */
    start_os_server(0, _i, &(struct test_kv_srv){.seg_size = 256 * KIB});
    ep = test_rpc_ep(NULL);
    test_rpc_assert_fabric(ep, test_kv_uri(0), _i);
    push = kv_open_path(ep, 1, TERN_KV_PATH_PUSH);
    rpc = kv_open_path(ep, 1, TERN_KV_PATH_RPC);

    for (unsigned s = 0; s < NS; s++) {
        bool fits = push_fits(_i, sizes[s]);

        test_pattern(val[s], sizes[s], (unsigned)s + 1);
        /* Written by RPC, read by push (or inline, if it does not fit). */
        kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[s]);
        kv_must_put(rpc, k, (size_t)kl, val[s], sizes[s], &v_rpc[s]);
        st0 = stats(push);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
        st1 = stats(push);
        expect_gets(&st0, &st1, fits, !fits, k);
        /* Written by the push client (its PUTs go as TERN_KV_PATH_ONESIDED
         * does: into a lease where they fit one), read by both. */
        kl = snprintf(k, sizeof(k), "push2rpc-%zu", sizes[s]);
        if (fits && fits_onesided(_i, sizes[s]))
            must_os_put(push, ep, k, (size_t)kl, val[s], sizes[s], &v_push[s]);
        else
            kv_must_put(push, k, (size_t)kl, val[s], sizes[s], &v_push[s]);
        ck_assert_uint_gt(v_push[s], v_rpc[s]);
        kv_expect_get(rpc, k, (size_t)kl, val[s], sizes[s], v_push[s]);
        st0 = stats(push);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_push[s]);
        st1 = stats(push);
        expect_gets(&st0, &st1, fits, !fits, k);
        want += fits ? 2 : 0;
    }
    ck_assert_uint_gt(stats(push).puts, 0);
    /* Everything again, in the other order. */
    st0 = stats(push);
    for (unsigned s = NS; s-- > 0;) {
        kl = snprintf(k, sizeof(k), "push2rpc-%zu", sizes[s]);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_push[s]);
        kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[s]);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
    }
    st1 = stats(push);
    expect_gets(&st0, &st1, want, 2 * NS - want, "second round");
    /* Big values, over and over: 100 KiB inline, 56 KiB pushed, or inline
     * on ntb after a put that could not be posted. More of those than the
     * server has push slots and pins: whatever it held for them, it let
     * go, or the small GET after them would come inline. */
    st0 = stats(push);
    for (unsigned r = 0; r < 140; r++) {
        kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[NS - 1 - r % 2]);
        kv_expect_get(push, k, (size_t)kl, val[NS - 1 - r % 2], sizes[NS - 1 - r % 2],
                   v_rpc[NS - 1 - r % 2]);
    }
    kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[1]);
    kv_expect_get(push, k, (size_t)kl, val[1], sizes[1], v_rpc[1]);
    st1 = stats(push);
    CHECK(st1.gets_pushed - st0.gets_pushed == 1 + (push_fits(_i, sizes[NS - 2]) ? 70 : 0),
          "%llu of 141 GETs pushed", (unsigned long long)(st1.gets_pushed - st0.gets_pushed));

    /* More GETs in flight than staging slots (32): the rest go by RPC, all
     * complete with the right value, and every slot comes back. */
    pa = (struct push_async){.want = val[1], .len = sizes[1], .version = v_rpc[1]};
    st0 = stats(push);
    for (unsigned i = 0; i < N_ASYNC; i++) {
        int rc = tern_kv_get_async(push, k, (size_t)kl, push_async_done, &pa);

        CHECK(rc == 0, "async get %u: %s", i, tern_err_name(rc));
    }
    {
        double t0 = now_ms();

        while (pa.done < N_ASYNC) {
            CHECK(now_ms() - t0 < 5000, "%u of %u async GETs done", pa.done, N_ASYNC);
            tern_rpc_poll(ep);
        }
    }
    CHECK(!pa.err, "async GET: %s", tern_err_name(pa.err));
    st1 = stats(push);
    CHECK(st1.gets_pushed > st0.gets_pushed &&
              st1.gets_pushed - st0.gets_pushed + st1.gets_rpc - st0.gets_rpc == N_ASYNC,
          "%llu pushed and %llu by RPC of %u", (unsigned long long)(st1.gets_pushed - st0.gets_pushed),
          (unsigned long long)(st1.gets_rpc - st0.gets_rpc), N_ASYNC);
    st0 = stats(push);
    for (unsigned i = 0; i < 40; i++)
        kv_expect_get(push, k, (size_t)kl, val[1], sizes[1], v_rpc[1]);
    st1 = stats(push);
    expect_gets(&st0, &st1, 40, 0, "40 GETs after the burst");

    /* Too small a buffer: TERN_EMSGSIZE with the size needed. */
    {
        size_t got = 0;
        int rc = tern_kv_get(push, k, (size_t)kl, small, sizeof(small), &got, NULL);

        CHECK(rc == TERN_EMSGSIZE && got == sizes[1], "get into 64 bytes: %s, %zu",
              tern_err_name(rc), got);
    }

    /* Absent and deleted keys: TERN_ENOENT from the server, nothing pushed. */
    st0 = stats(push);
    kv_expect_enoent(push, "never-written", 13);
    kv_must_put(rpc, "doomed", 6, "soon gone", 9, &v1);
    kv_expect_get(push, "doomed", 6, "soon gone", 9, v1);
    ck_assert_int_eq(tern_kv_del(push, "doomed", 6), 0);
    kv_expect_enoent(push, "doomed", 6);
    kv_expect_enoent(rpc, "doomed", 6);
    st1 = stats(push);
    ck_assert_uint_eq(st1.gets_pushed - st0.gets_pushed, 1);
    kv_must_put(push, "doomed", 6, "back", 4, &v2);
    ck_assert_uint_gt(v2, v1);
    kv_expect_get(push, "doomed", 6, "back", 4, v2);

    /* Overwrites of one size (in place over the older record from the
     * third on) and of another: each GET pushes the newest. */
    for (unsigned r = 0; r < 8; r++) {
        size_t len = r == 5 ? 700 : 300;

        test_pattern(val[0], len, 1000 + r);
        if (r % 3 == 2)
            kv_must_put(push, "over", 4, val[0], len, &v2);
        else
            kv_must_put(rpc, "over", 4, val[0], len, &v2);
        ck_assert_uint_gt(v2, v1);
        v1 = v2;
        st0 = stats(push);
        kv_expect_get(push, "over", 4, val[0], len, v2);
        st1 = stats(push);
        expect_gets(&st0, &st1, 1, 0, "overwritten key");
    }
    tern_kv_close(rpc);
    test_kv_end(ep, push, 1);
}
END_TEST

/* ---- 11: hostile PGET requests on raw sessions ---- */

#define PG_REGION (128 * KIB)

static uint8_t pg_reply[PG_REGION];

/* KV_M_PGET with the header `q` and `klen` bytes of key (q->klen may lie),
 * or `len` bytes of it when len is not (size_t)-1. The reply's header goes
 * to *rep, an inline value to pg_reply + sizeof(*rep); *got is the reply's
 * length. */
static int raw_pget(struct tern_session *s, const struct kv_pget *q, const void *key,
                    size_t klen, size_t len, struct kv_pget_rep *rep, size_t *got)
{
    static uint8_t req[sizeof(struct kv_pget) + 2048];
    int rc;

    memcpy(req, q, sizeof(*q));
    memcpy(req + sizeof(*q), key, klen);
    *got = 0;
    memset(rep, 0, sizeof(*rep));
    rc = test_kv_call(s, KV_M_PGET, req, len == (size_t)-1 ? sizeof(*q) + klen : len, pg_reply,
                  sizeof(pg_reply), got);
    if (rc == 0 && *got >= sizeof(*rep))
        memcpy(rep, pg_reply, sizeof(*rep));
    return rc;
}

/* The record of key/val at `version` was pushed into `region` at `off`, and
 * nothing else of the region (all 0xee before) was written. */
static void expect_pushed(const uint8_t *region, uint64_t off, const void *key, size_t klen,
                          const void *val, size_t vlen, uint64_t version, const char *what)
{
    uint32_t size = pm_rec_size((uint32_t)klen, (uint32_t)vlen);
    const struct pm_rec *r = (const void *)(region + off);

    CHECK(kvw_record_valid(region + off, size, key, (uint16_t)klen, version),
          "%s: no whole record of version %llu pushed", what, (unsigned long long)version);
    CHECK(r->val_len == vlen && memcmp(pm_rec_val(r), val, vlen) == 0,
          "%s: the pushed record holds another value", what);
    CHECK(first_not(region, off, 0xee) == off, "%s: bytes before the record written", what);
    CHECK(first_not(region + off + size, PG_REGION - off - size, 0xee) ==
              PG_REGION - off - size, "%s: bytes after the record written", what);
}

/* The reply to a PGET that did not push: the value inline, and the
 * region as it was. */
static void expect_inline(const struct kv_pget_rep *rep, size_t got, const uint8_t *region,
                          const void *val, size_t vlen, uint64_t version, const char *what)
{
    CHECK(rep->size == 0 && rep->vlen == vlen && got == sizeof(*rep) + vlen &&
              rep->version == version,
          "%s: reply size %u vlen %u version %llu (%zu bytes), want inline %zu at %llu", what,
          rep->size, rep->vlen, (unsigned long long)rep->version, got, vlen,
          (unsigned long long)version);
    CHECK(memcmp(pg_reply + sizeof(*rep), val, vlen) == 0, "%s: inline value differs", what);
    CHECK(first_not(region, PG_REGION, 0xee) == PG_REGION, "%s: the region was written", what);
}

START_TEST(hostile_pget)
{
    static uint8_t val[300], longkey[KV_KEY_MAX + 40];
    struct tern_rpc_ep *ep;
    struct tern_session *s, *s2;
    struct tern_rpc_mr *mr;
    struct tern_tp_rkey rk;
    struct tern_kv *rpc, *kv;
    struct kv_pget_rep rep;
    struct kv_pget q;
    struct tern_kv_onesided_stats st0, st1;
    char in[32], out[32], absent[32];
    size_t kin, kout, kabsent, klong, got;
    uint64_t ver, in_place0;
    uint32_t size;
    uint8_t *region;
    int rc;

    /* Server 0 owns the low half (the raw requests), server 1 the high. */
    start_os_server(0, _i, &(struct test_kv_srv){.lo = 0, .hi = 0x7fffffff});
    start_os_server(1, _i, &(struct test_kv_srv){.lo = 0x80000000u, .hi = 0xffffffffu});
    ep = test_rpc_ep(NULL);
    rpc = kv_open_path(ep, 2, TERN_KV_PATH_RPC);
    kv_key_in_range(in, sizeof(in), &kin, "in", 0, 0x7fffffff);
    kv_key_in_range(out, sizeof(out), &kout, "out", 0x80000000u, 0xffffffffu);
    kv_key_in_range(absent, sizeof(absent), &kabsent, "absent", 0, 0x7fffffff);
    memset(longkey, 'L', sizeof(longkey));
    for (unsigned n = 0;; n++) {
        int w = snprintf((char *)longkey, 16, "%u", n);

        longkey[w] = 'L';
        klong = KV_KEY_MAX + 8;
        if (kv_top32(longkey, klong) <= 0x7fffffff)
            break;
    }
    test_pattern(val, sizeof(val), 42);
    kv_must_put(rpc, in, kin, val, sizeof(val), &ver);
    kv_must_put(rpc, out, kout, "far", 3, NULL);
    size = pm_rec_size((uint32_t)kin, sizeof(val));

    s = test_kv_session(ep, 0);
    rc = tern_rpc_mr_alloc(ep, PG_REGION, TERN_TP_ACCESS_REMOTE_WRITE, &mr);
    CHECK(rc == 0, "mr_alloc: %s", tern_err_name(rc));
    region = tern_rpc_mr_addr(mr);
    rc = tern_rpc_mr_rkey(mr, s, &rk);
    CHECK(rc == 0, "rkey: %s", tern_err_name(rc));
    in_place0 = test_kv_info(s).in_place;

    /* A good request first: the record lands where it was asked to, and
     * nowhere else; the reply says so. */
    memset(region, 0xee, PG_REGION);
    q = (struct kv_pget){.klen = (uint16_t)kin, .cap = PG_REGION, .off = 4096, .dst = rk};
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), 0, "good pget");
    CHECK(got == sizeof(rep) && rep.size == size && rep.vlen == sizeof(val) &&
              rep.version == ver,
          "good pget: size %u vlen %u version %llu (%zu bytes), want %u %zu %llu", rep.size,
          rep.vlen, (unsigned long long)rep.version, got, size, sizeof(val),
          (unsigned long long)ver);
    expect_pushed(region, 4096, in, kin, val, sizeof(val), ver, "good pget");

    /* Malformed: refused, nothing pushed. */
    memset(region, 0xee, PG_REGION);
    EXPECT_RC(raw_pget(s, &q, in, kin, 0, &rep, &got), TERN_EPROTO, "pget, empty");
    EXPECT_RC(raw_pget(s, &q, in, kin, sizeof(q) - 1, &rep, &got), TERN_EPROTO,
              "pget, truncated header");
    EXPECT_RC(raw_pget(s, &q, in, kin, sizeof(q) + kin - 1, &rep, &got), TERN_EPROTO,
              "pget, key cut short");
    EXPECT_RC(raw_pget(s, &q, in, kin + 8, (size_t)-1, &rep, &got), TERN_EPROTO,
              "pget, bytes past the key");
    q.flags = 1;
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), TERN_EPROTO, "pget, flags 1");
    q.flags = 0x8000;
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), TERN_EPROTO,
              "pget, flags 0x8000");
    q.flags = 0;
    q.klen = (uint16_t)(kin + 1);
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), TERN_EPROTO, "pget, klen + 1");
    q.klen = (uint16_t)(kin - 1);
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), TERN_EPROTO, "pget, klen - 1");
    q.klen = UINT16_MAX;
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), TERN_EPROTO, "pget, klen ~0");
    q.klen = 0;
    EXPECT_RC(raw_pget(s, &q, in, 0, (size_t)-1, &rep, &got), TERN_EINVAL, "pget, klen 0");
    q.klen = (uint16_t)kout;
    EXPECT_RC(raw_pget(s, &q, out, kout, (size_t)-1, &rep, &got), TERN_EWRONGNODE,
              "pget, the other server's key");
    q.klen = (uint16_t)kabsent;
    EXPECT_RC(raw_pget(s, &q, absent, kabsent, (size_t)-1, &rep, &got), TERN_ENOENT,
              "pget, absent key");
    q.klen = (uint16_t)klong;
    EXPECT_RC(raw_pget(s, &q, longkey, klong, (size_t)-1, &rep, &got), TERN_E2BIG,
              "pget, key over the maximum");
    CHECK(first_not(region, PG_REGION, 0xee) == PG_REGION, "a refused pget wrote the region");

    /* Too small a buffer: the value inline. One byte short is too small,
     * the record's size is enough. */
    q.klen = (uint16_t)kin;
    q.cap = 0;
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), 0, "pget, cap 0");
    expect_inline(&rep, got, region, val, sizeof(val), ver, "cap 0");
    q.cap = 8;
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), 0, "pget, cap 8");
    expect_inline(&rep, got, region, val, sizeof(val), ver, "cap 8");
    q.cap = size - 1;
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), 0, "pget, cap size - 1");
    expect_inline(&rep, got, region, val, sizeof(val), ver, "cap size - 1");
    q.cap = size;
    q.off = PG_REGION - size;
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), 0, "pget, cap size");
    CHECK(rep.size == size && got == sizeof(rep), "cap of the record's size: not pushed");
    expect_pushed(region, PG_REGION - size, in, kin, val, sizeof(val), ver,
                  "pget into the region's last bytes");

    /* Destinations the put cannot reach: the value comes inline (the put
     * could not be posted), or the reply says "pushed" and the put fails
     * on its way (the region stays as it was: a client would find no
     * record there), or the call fails cleanly; never a crash, and no
     * byte of the region is written. Each on a session of its own: a
     * fabric may hang up on a peer that makes refused accesses (rdma: at
     * the first bad key). */
    {
        const struct {
            const char *what;
            uint64_t off;
            uint32_t cap;
            int key;         /* 0: ours, 1: zeroed, 2: another key number, 3: ours, longer */
        } bad[] = {
            {"zeroed key", 0, PG_REGION, 1},
            {"offset: the region's end", PG_REGION, UINT32_MAX, 0},
            {"offset: across the region's end", PG_REGION - size + 8, UINT32_MAX, 0},
            {"offset: 2^63", 1ull << 63, UINT32_MAX, 0},
            {"offset: wraps around", UINT64_MAX - 64, UINT32_MAX, 0},
            {"offset past the region, under a key that claims more", PG_REGION, UINT32_MAX, 3},
            {"another key number", 0, PG_REGION, 2},
        };

        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            struct tern_tp_rkey k2;

            s2 = test_kv_session(ep, 0);
            CHECK(tern_rpc_mr_rkey(mr, s2, &k2) == 0, "rkey for s2");
            if (bad[b].key == 1)
                memset(&k2, 0, sizeof(k2));
            else if (bad[b].key == 2)
                k2.key ^= 0x5a5a0000u;
            else if (bad[b].key == 3)
                k2.len = 1ull << 40;
            memset(region, 0xee, PG_REGION);
            q = (struct kv_pget){.klen = (uint16_t)kin, .cap = bad[b].cap, .off = bad[b].off,
                                 .dst = k2};
            rc = raw_pget(s2, &q, in, kin, (size_t)-1, &rep, &got);
            if (rc == 0 && rep.size == 0)
                expect_inline(&rep, got, region, val, sizeof(val), ver, bad[b].what);
            else if (rc == 0)
                CHECK(rep.size == size && got == sizeof(rep) && rep.version == ver,
                      "%s: reply size %u version %llu (%zu bytes)", bad[b].what, rep.size,
                      (unsigned long long)rep.version, got);
            /* (rc < 0: the fabric hung up on the session.) */
            test_rpc_poll_for(ep, 5);     /* a failed put's refusal, a hang-up: let them land */
            CHECK(first_not(region, PG_REGION, 0xee) == PG_REGION,
                  "%s: the region was written (%s, reply size %u)", bad[b].what,
                  rc ? tern_err_name(rc) : "success", rep.size);
            CHECK(test_kv_alive(0), "%s: the server died", bad[b].what);
            tern_rpc_disconnect(s2);
        }
    }

    /* Refused pushes in numbers beyond the server's push slots and pins
     * (64 each): whatever they held was let go. A few per session, as a
     * fabric hangs up on a peer after 16 refused accesses. */
    for (unsigned n = 0; n < 8; n++) {
        s2 = test_kv_session(ep, 0);
        CHECK(tern_rpc_mr_rkey(mr, s2, &rk) == 0, "rkey for s2");
        q = (struct kv_pget){.klen = (uint16_t)kin, .cap = UINT32_MAX, .off = PG_REGION,
                             .dst = rk};
        for (unsigned i = 0; i < 10; i++) {
            rc = raw_pget(s2, &q, in, kin, (size_t)-1, &rep, &got);
            CHECK(rc == 0, "refused push %u.%u: %s", n, i, tern_err_name(rc));
        }
        tern_rpc_disconnect(s2);
    }
    test_rpc_poll_for(ep, 5);

    /* After all of it the server serves as before: a good raw push... */
    CHECK(test_kv_alive(0) && test_kv_alive(1), "a server died");
    CHECK(tern_rpc_mr_rkey(mr, s, &rk) == 0, "rkey for s");
    memset(region, 0xee, PG_REGION);
    q = (struct kv_pget){.klen = (uint16_t)kin, .cap = PG_REGION, .off = 64, .dst = rk};
    EXPECT_RC(raw_pget(s, &q, in, kin, (size_t)-1, &rep, &got), 0, "good pget at the end");
    CHECK(rep.size == size, "good pget at the end: not pushed (size %u)", rep.size);
    expect_pushed(region, 64, in, kin, val, sizeof(val), ver, "good pget at the end");
    /* ...no pin left on the key's record: its second PUT from now is
     * written over it in place (the first appends: no older record)... */
    CHECK(test_kv_info(s).in_place == in_place0, "in-place updates during the test");
    kv_must_put(rpc, in, kin, val, sizeof(val), NULL);
    ck_assert_uint_eq(test_kv_info(s).in_place, in_place0);
    test_pattern(val, sizeof(val), 43);
    kv_must_put(rpc, in, kin, val, sizeof(val), &ver);
    CHECK(test_kv_info(s).in_place == in_place0 + 1,
          "the record pushed (and refused) was not rewritten in place: still pinned?");
    /* ...and a normal push client on both servers. */
    kv = kv_open_path(ep, 2, TERN_KV_PATH_PUSH);
    st0 = stats(kv);
    kv_expect_get(kv, in, kin, val, sizeof(val), ver);
    kv_expect_get(kv, out, kout, "far", 3, 0);
    kv_expect_enoent(kv, absent, kabsent);
    st1 = stats(kv);
    expect_gets(&st0, &st1, 2, 0, "a normal client after the hostile one");
    tern_rpc_disconnect(s);
    tern_rpc_mr_dereg(mr);
    tern_kv_close(rpc);
    test_kv_end(ep, kv, 2);
}
END_TEST

/* ---- 12: a server that lies about what it pushed ---- */

/* The fake server (section 5) answers KV_M_PGET for keys "plie-<k>": it
 * pushes a record of its own making into the client's slot and replies,
 * one lie per kind. A client that believed a lie would return "push:..."
 * bytes; one that does not retries, then asks by RPC and returns the fake
 * server's "rpc:<key>". */
enum push_lie {
    L_GOOD,                          /* whole and right: pushed */
    L_INLINE,                        /* the value inline, honestly */
    L_VERSION,                       /* the record is another version than the reply */
    L_SIZE_BIG,                      /* the reply's size is 8 more than the record's */
    L_SIZE_SMALL,                    /* ... 8 less */
    L_RECORD_SUM,                    /* a value byte flipped under the record's sum */
    L_OTHER_KEY,                     /* another key's record (of the same length) */
    L_TOMBSTONE,                     /* a tombstone of the key, at the reply's version */
    L_NOTHING,                       /* "pushed", but no put at all */
    L_HUGE,                          /* a size of 1 GiB */
    L_INLINE_SHORT,                  /* inline, vlen 200 with 11 bytes after the header */
    L_INLINE_LONG,                   /* inline, vlen 4 with 11 bytes after the header */
    L_SHORT_REPLY,                   /* a reply of 8 bytes */
    L_N
};

static const char *const lie_what[L_N] = {
    "good", "inline", "version", "size + 8", "size - 8", "record sum", "other key",
    "tombstone", "nothing pushed", "huge size", "inline short", "inline long", "short reply",
};

#define LIE_VERSION 500u
#define LIE_AT(k) (2 * FAKE_SEG + 1024 * (k))  /* where kind k's record lies in the pool */

static unsigned *lie_pgets;          /* PGETs the fake served per kind (shared) */

static size_t lie_key(unsigned k, char *out, size_t cap)
{
    return (size_t)snprintf(out, cap, "plie-%u", k);
}

/* Lay out kind k's record at LIE_AT(k) in the fake pool; its size. */
static uint32_t lie_record(uint8_t *pool, unsigned k)
{
    char key[16], v[32];
    size_t kl = lie_key(k, key, sizeof(key));
    int vl = snprintf(v, sizeof(v), "push:%s", lie_what[k]);
    uint8_t *rec = pool + LIE_AT(k);
    struct pm_rec *r = (void *)rec;
    uint32_t size;

    if (k == L_TOMBSTONE)
        return put_record(rec, key, (uint16_t)kl, "", 0, LIE_VERSION, PM_TOMBSTONE);
    size = put_record(rec, key, (uint16_t)kl, v, (uint32_t)vl, LIE_VERSION, PM_VALUE);
    switch (k) {
    case L_VERSION:
        r->version = LIE_VERSION + 1;
        r->sum = pm_rec_sum_of(r);
        break;
    case L_RECORD_SUM:
        rec[sizeof(*r) + kl + 2] ^= 0x01;
        break;
    case L_OTHER_KEY:
        rec[sizeof(*r)] = 'P';
        r->sum = pm_rec_sum_of(r);
        break;
    default:
        break;
    }
    return size;
}

static void fake_push_records(uint8_t *pool)
{
    for (unsigned k = 0; k < L_N; k++)
        lie_record(pool, k);
}

static int fake_pget(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    const uint8_t *key = (const uint8_t *)data + sizeof(struct kv_pget);
    uint8_t *pool = tern_rpc_mr_addr(fake_pool_mr);
    struct kv_pget_rep *rep;
    struct kv_pget q;
    unsigned k;
    char want[32];
    uint32_t size;
    int vl;

    (void)ctx;
    if (len < sizeof(q))
        return TERN_EPROTO;
    memcpy(&q, data, sizeof(q));
    if (len != sizeof(q) + q.klen)
        return TERN_EPROTO;
    for (k = 0; k < L_N; k++)
        if (lie_key(k, want, sizeof(want)) == q.klen && memcmp(want, key, q.klen) == 0)
            break;
    if (q.klen == 9 && memcmp(key, "plie-slow", 9) == 0) {
        /* Answers (and pushes the good record) after the client gave up. */
        usleep(300 * 1000);
        k = L_GOOD;
    } else if (k == L_N) {
        return TERN_ENOENT;
    }
    __atomic_fetch_add(&lie_pgets[k], 1, __ATOMIC_RELAXED);
    size = lie_record(pool, k);      /* (as laid out: no change) */
    vl = snprintf(want, sizeof(want), "push:%s", lie_what[k]);
    if (k == L_INLINE || k == L_INLINE_SHORT || k == L_INLINE_LONG) {
        rep = tern_reply_alloc(req, sizeof(*rep) + 11);
        if (!rep)
            return TERN_EMSGSIZE;
        *rep = (struct kv_pget_rep){.version = LIE_VERSION,
                                    .vlen = k == L_INLINE_SHORT ? 200 : k == L_INLINE_LONG ? 4 : 11};
        memcpy(rep + 1, "push:inline", 11);
        return 0;
    }
    if (k == L_SHORT_REPLY) {
        uint8_t *r8 = tern_reply_alloc(req, 8);

        if (!r8)
            return TERN_EMSGSIZE;
        memcpy(r8, "push:sho", 8);
        return 0;
    }
    /* The put first, so that the reply follows its data (rpc.h). */
    if (k != L_NOTHING && k != L_HUGE &&
        tern_session_put(tern_req_session(req), fake_pool_mr, LIE_AT(k), size, &q.dst, q.off,
                         NULL, NULL) < 0)
        return TERN_EIO;
    rep = tern_reply_alloc(req, sizeof(*rep));
    if (!rep)
        return TERN_EMSGSIZE;
    *rep = (struct kv_pget_rep){.version = LIE_VERSION, .size = size, .vlen = (uint32_t)vl};
    if (k == L_SIZE_BIG)
        rep->size += 8;
    else if (k == L_SIZE_SMALL)
        rep->size -= 8;
    else if (k == L_HUGE)
        rep->size = 1u << 30;
    else if (k == L_TOMBSTONE)
        rep->vlen = 0;
    return 0;
}

START_TEST(lying_push_never_trusted)
{
    struct tern_kv_onesided_stats st0, st1;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;

    lie_pgets = test_shared_alloc(L_N * sizeof(*lie_pgets));
    test_kv_start_with(0, test_fabric_listen(_i), setup_fake);
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_PUSH);
    /* Twice: nothing may be remembered from the first round (a slot still
     * holding an earlier record must not pass for a new one). */
    for (unsigned round = 0; round < 2; round++)
        for (unsigned k = 0; k < L_N; k++) {
            char key[16], want[48];
            size_t kl = lie_key(k, key, sizeof(key)), wl;
            unsigned n0 = __atomic_load_n(&lie_pgets[k], __ATOMIC_RELAXED), n;
            bool honest = k == L_GOOD || k == L_INLINE;

            if (honest)
                wl = (size_t)snprintf(want, sizeof(want), "push:%s", lie_what[k]);
            else
                wl = (size_t)snprintf(want, sizeof(want), "rpc:%s", key);
            if (k >= L_INLINE_SHORT) {
                /* A reply malformed as such: an error, or the value asked
                 * again by RPC; never the reply's bytes (nor bytes past
                 * its end). */
                static uint8_t buf[1024];
                size_t got = 0;
                uint64_t v = 0;
                int rc = tern_kv_get(kv, key, kl, buf, sizeof(buf), &got, &v);

                CHECK(rc == TERN_EPROTO ||
                          (rc == 0 && got == wl && memcmp(buf, want, wl) == 0 &&
                           v == FAKE_RPC_VERSION),
                      "%s: %s, %zu bytes \"%.*s\" at version %llu", lie_what[k],
                      rc ? tern_err_name(rc) : "success", got, (int)(got < 64 ? got : 64), (const char *)buf,
                      (unsigned long long)v);
                continue;
            }
            st0 = stats(kv);
            kv_expect_get(kv, key, kl, want, wl, honest ? LIE_VERSION : FAKE_RPC_VERSION);
            st1 = stats(kv);
            n = __atomic_load_n(&lie_pgets[k], __ATOMIC_RELAXED) - n0;
            if (honest) {
                expect_gets(&st0, &st1, k == L_GOOD, k == L_INLINE, lie_what[k]);
                CHECK(n == 1, "%s: %u PGETs", lie_what[k], n);
            } else {
                /* Asked again (the record may have been caught mid-write),
                 * then by RPC; never pushed. */
                CHECK(st1.torn - st0.torn == n && n > 1,
                      "%s: %llu torn for %u PGETs", lie_what[k],
                      (unsigned long long)(st1.torn - st0.torn), n);
                CHECK(st1.gets_pushed == st0.gets_pushed && st1.gets_rpc == st0.gets_rpc + 1,
                      "%s: %llu pushed, %llu by RPC", lie_what[k],
                      (unsigned long long)(st1.gets_pushed - st0.gets_pushed),
                      (unsigned long long)(st1.gets_rpc - st0.gets_rpc));
            }
        }
    /* A push that comes after the GET timed out: the GET fails, its slot
     * is retired (the put may still land in it), and later GETs go on
     * right, through the other slots. */
    {
        char key[16], want[48];
        size_t kl = lie_key(L_GOOD, key, sizeof(key));
        size_t wl = (size_t)snprintf(want, sizeof(want), "push:%s", lie_what[L_GOOD]);
        uint8_t buf[64];
        size_t got = 0;
        int rc;

        st0 = stats(kv);
        tern_kv_set_timeout(kv, 100 * 1000000ull);
        rc = tern_kv_get(kv, "plie-slow", 9, buf, sizeof(buf), &got, NULL);
        CHECK(rc == TERN_ETIMEDOUT, "slow push: %s", rc ? tern_err_name(rc) : "success");
        tern_kv_set_timeout(kv, 5 * SEC);
        test_rpc_poll_for(ep, 400);
        st1 = stats(kv);
        CHECK(st1.stage_lost == st0.stage_lost + 1, "%llu slots retired",
              (unsigned long long)(st1.stage_lost - st0.stage_lost));
        for (unsigned i = 0; i < 40; i++)
            kv_expect_get(kv, key, kl, want, wl, LIE_VERSION);
        st0 = stats(kv);
        expect_gets(&st1, &st0, 40, 0, "GETs after a slot was retired");
    }
    munmap(lie_pgets, L_N * sizeof(*lie_pgets));
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 13: pushes in flight while the record is rewritten in place ---- */

/* A writer rewrites "torn" by RPC with counters 1, 2, ... (torn_fill; in
 * place over the older record whenever it is not pinned), several PUTs in
 * flight at once, while a push client keeps many GETs of it in flight. A
 * push whose put is still to be carried out (on rdma the NIC reads the pool
 * when the server flushes, after every request of its batch was handled)
 * must not see its record rewritten: the server pins it until the put is
 * done. The client checks every pushed record all the same, so a rewrite
 * shows as a torn (retried) push, not as a wrong value. Every GET must
 * return a whole value with the version its PUT was given. */

#define RACE_DEPTH 24                /* GETs in flight (staging slots: 32) */
#define RACE_READS 40000
#define RACE_WDEPTH 4                /* PUTs in flight */

struct race_put {
    struct race_writer *w;
    uint64_t c;
    uint8_t val[24 * KIB];
};

struct race_writer {
    struct tern_kv *kv;
    uint64_t next;                   /* the last counter sent */
    unsigned busy;                   /* PUTs in flight */
    struct race_put puts[RACE_WDEPTH];
};

static void race_put_next(struct race_put *p);

static void race_put_done(void *arg, int status, const void *val, size_t len,
                          uint64_t version)
{
    struct race_put *p = arg;

    (void)val;
    (void)len;
    p->w->busy--;
    if (status < 0) {
        torn->err = status;
        return;
    }
    torn->ver[p->c] = version;
    /* One session answers in order: the highest counter acknowledged. */
    __atomic_store_n(&torn->n, p->c, __ATOMIC_RELEASE);
    race_put_next(p);
}

static void race_put_next(struct race_put *p)
{
    struct race_writer *w = p->w;
    int rc;

    if (__atomic_load_n(&torn->stop, __ATOMIC_ACQUIRE) || torn->err || w->next >= TORN_MAX)
        return;
    p->c = ++w->next;
    torn_fill(p->val, p->c);
    rc = tern_kv_put_async(w->kv, "torn", 4, p->val, torn_len(p->c), race_put_done, p);
    if (rc < 0)
        torn->err = rc;
    else
        w->busy++;
}

static void race_writer_start(struct race_writer *w)
{
    for (unsigned i = 0; i < RACE_WDEPTH; i++) {
        w->puts[i].w = w;
        race_put_next(&w->puts[i]);
    }
}

static int race_writer_proc(void *arg)
{
    static struct race_writer w;
    struct tern_rpc_ep *ep;
    const char *u = test_kv_uri(0);
    double t0 = now_ms();

    (void)arg;
    if (tern_rpc_open(NULL, &ep) < 0 || tern_kv_open(ep, &u, 1, 5 * SEC, &w.kv) < 0)
        return 3;
    race_writer_start(&w);
    while (w.busy && now_ms() - t0 < 30000)
        tern_rpc_poll(ep);
    tern_kv_close(w.kv);
    tern_rpc_close(ep);
    return torn->err ? 4 : 0;
}

struct race_reader {
    struct tern_kv *kv;
    unsigned in_flight, done;
    uint64_t *seen_c, *seen_v;
};

static void race_done(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct race_reader *r = arg;
    const uint8_t *p = val;
    uint64_t c;
    size_t bad;

    r->in_flight--;
    CHECK(status == 0, "read %u: %s", r->done, tern_err_name(status));
    CHECK(len >= 8, "read %u: %zu bytes", r->done, len);
    memcpy(&c, p, sizeof(c));
    CHECK(c >= 1 && c <= TORN_MAX, "read %u: counter %llu", r->done, (unsigned long long)c);
    CHECK(len == torn_len(c), "read %u: counter %llu with %zu bytes", r->done,
          (unsigned long long)c, len);
    bad = first_not(p + 8, len - 8, (uint8_t)c);
    CHECK(bad == len - 8, "read %u: torn value: counter %llu, byte %zu is 0x%02x", r->done,
          (unsigned long long)c, bad + 8, p[8 + bad]);
    if (r->done < RACE_READS) {
        r->seen_c[r->done] = c;
        r->seen_v[r->done] = version;
    }
    r->done++;
}

START_TEST(push_races_in_place_updates)
{
    static uint64_t seen_c[RACE_READS], seen_v[RACE_READS];
    static struct race_writer local;
    struct race_reader rd = {.seen_c = seen_c, .seen_v = seen_v};
    struct tern_kv_onesided_stats st0, st1;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    bool in_proc = one_peer_only(_i);
    uint64_t in_place0, in_place1;
    pid_t writer = 0;
    double t0;
    int rc;

    torn = test_shared_alloc(sizeof(*torn));
    /* Records that fit a staging slot, and on ntb a ring record. */
    torn_unit = in_proc ? 2 * KIB : 8 * KIB;
    start_os_server(0, _i, NULL);
    ep = test_rpc_ep(NULL);
    s = test_kv_session(ep, 0);
    rd.kv = kv_open_path(ep, 1, TERN_KV_PATH_PUSH);
    if (in_proc) {
        local = (struct race_writer){.kv = kv_open_path(ep, 1, TERN_KV_PATH_RPC)};
        race_writer_start(&local);
    } else {
        writer = test_fork(race_writer_proc, NULL);
    }
    t0 = now_ms();
    while (__atomic_load_n(&torn->n, __ATOMIC_ACQUIRE) < 2) {
        CHECK(now_ms() - t0 < 5000 && !torn->err, "the writer never wrote (%s)",
              tern_err_name(torn->err));
        tern_rpc_poll(ep);
    }
    in_place0 = test_kv_info(s).in_place;
    st0 = stats(rd.kv);
    t0 = now_ms();
    while (rd.done + rd.in_flight < RACE_READS && now_ms() - t0 < 2000) {
        while (rd.in_flight < RACE_DEPTH && rd.done + rd.in_flight < RACE_READS) {
            rc = tern_kv_get_async(rd.kv, "torn", 4, race_done, &rd);
            if (rc == TERN_ENOBUFS)
                break;
            CHECK(rc == 0, "get_async: %s", tern_err_name(rc));
            rd.in_flight++;
        }
        tern_rpc_poll(ep);
    }
    while (rd.in_flight) {
        CHECK(now_ms() - t0 < 10000, "%u GETs never completed", rd.in_flight);
        tern_rpc_poll(ep);
    }
    st1 = stats(rd.kv);
    in_place1 = test_kv_info(s).in_place;
    __atomic_store_n(&torn->stop, 1, __ATOMIC_RELEASE);
    if (in_proc) {
        t0 = now_ms();
        while (local.busy && now_ms() - t0 < 5000)
            tern_rpc_poll(ep);
        CHECK(!local.busy && !torn->err, "writer: %s", tern_err_name(torn->err));
        tern_kv_close(local.kv);
    } else {
        rc = test_child_wait(&writer);
        CHECK(rc == 0, "writer exited with %d (%s)", rc, tern_err_name(torn->err));
    }
    CHECK(rd.done >= 1000, "only %u reads", rd.done);
    CHECK(torn->n >= 20, "the writer wrote only %llu values", (unsigned long long)torn->n);
    /* The race was on: values were rewritten in place meanwhile, and most
     * GETs were pushed (the rest came inline: no slot, or no put). */
    CHECK(in_place1 - in_place0 >= 10, "only %llu in-place updates during the reads",
          (unsigned long long)(in_place1 - in_place0));
    CHECK(st1.gets_pushed - st0.gets_pushed >= rd.done / 2, "%llu of %u reads were pushed",
          (unsigned long long)(st1.gets_pushed - st0.gets_pushed), rd.done);
    /* Each value came with the version its PUT was given. */
    for (unsigned r = 0; r < rd.done && r < RACE_READS; r++)
        CHECK(seen_c[r] <= torn->n && torn->ver[seen_c[r]] == seen_v[r],
              "read %u: counter %llu with version %llu, its PUT got %llu", r,
              (unsigned long long)seen_c[r], (unsigned long long)seen_v[r],
              (unsigned long long)torn->ver[seen_c[r]]);
    /* No push saw its record rewritten in place (pinned). Without the pins
     * about one push in ten is torn on rdma; a rare one may still be: the
     * cleaner does not look at pins, and a segment it frees may be written
     * again before a put from a dead record in it is carried out. */
    CHECK((st1.torn - st0.torn) * 100 <= rd.done,
          "%llu of %u pushes were torn: a record was rewritten under its push",
          (unsigned long long)(st1.torn - st0.torn), rd.done);
    /* The writer is done: its last value is the one pushed now. */
    {
        static uint8_t want[32 * KIB];

        torn_fill(want, torn->n);
        kv_expect_get(rd.kv, "torn", 4, want, torn_len(torn->n), torn->ver[torn->n]);
    }
    tern_rpc_disconnect(s);
    munmap(torn, sizeof(*torn));
    test_kv_end(ep, rd.kv, 1);
}
END_TEST


/* ---- 14: GETs that fall back to RPC when no call can be sent ---- */

/* A client endpoint with 8 call slots (and 8 one-sided operation slots):
 * on tcp, window reads of absent keys end by RPC, and with every call slot
 * taken that RPC cannot be sent. Each GET must still end exactly once
 * (with an error if need be), and the client's own op slots must stay
 * sound: each later GET gets its own answer, once. */
struct once {
    int want;                        /* the value's last byte, or 0: absent */
    int status;
    unsigned calls;
    bool wrong;
};

static void once_done(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct once *o = arg;

    (void)version;
    o->calls++;
    o->status = status;
    if (status == 0)
        o->wrong = !o->want || len != 4 || ((const uint8_t *)val)[3] != o->want;
}

START_TEST(fallback_without_call_slots)
{
    static const struct tern_rpc_config few = {.max_calls = 8};
    static struct once abs_gets[16], gets[40];
    static char keys[16][16];
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    unsigned issued = 0, ended = 0;
    double t0;
    int rc;

    start_os_server(0, test_fabric_row("tcp"), NULL);
    rc = tern_rpc_open(&few, &ep);
    CHECK(rc == 0, "client ep: %s", tern_err_name(rc));
    kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    kv_must_put(kv, "key1", 4, "val1", 4, NULL);
    kv_must_put(kv, "key2", 4, "val2", 4, NULL);
    /* 8 window reads, then 8 GETs by RPC (no operation slot left for a
     * read): when the reads find nothing, every call slot is taken. */
    for (int i = 0; i < 16; i++) {
        int kl = snprintf(keys[i], sizeof(keys[i]), "absent-%d", i);

        abs_gets[i] = (struct once){0};
        rc = tern_kv_get_async(kv, keys[i], (size_t)kl, once_done, &abs_gets[i]);
        CHECK(rc == 0 || rc == TERN_ENOBUFS, "get %d: %s", i, tern_err_name(rc));
        if (rc < 0)
            abs_gets[i].calls = 1;       /* refused at once: ended */
    }
    t0 = now_ms();
    while (now_ms() - t0 < 3000) {
        ended = 0;
        for (int i = 0; i < 16; i++)
            ended += abs_gets[i].calls > 0;
        if (ended == 16)
            break;
        tern_rpc_poll(ep);
    }
    test_rpc_poll_for(ep, 20);
    for (int i = 0; i < 16; i++)
        CHECK(abs_gets[i].calls == 1 && abs_gets[i].status < 0,
              "absent key %d: %u callbacks, %s", i, abs_gets[i].calls,
              tern_err_name(abs_gets[i].status));
    /* Then present keys, as many as the client takes at once. */
    for (int i = 0; i < 40; i++) {
        gets[i] = (struct once){.want = i % 2 ? '2' : '1'};
        rc = tern_kv_get_async(kv, i % 2 ? "key2" : "key1", 4, once_done, &gets[i]);
        if (rc == 0)
            issued++;
        else
            gets[i].calls = 1;
    }
    t0 = now_ms();
    while (now_ms() - t0 < 3000) {
        ended = 0;
        for (int i = 0; i < 40; i++)
            ended += gets[i].calls > 0;
        if (ended == 40)
            break;
        tern_rpc_poll(ep);
    }
    test_rpc_poll_for(ep, 20);
    CHECK(issued >= 8, "only %u GETs taken", issued);
    for (int i = 0; i < 40; i++)
        CHECK(gets[i].calls == 1 && !gets[i].wrong, "get %d of key%c: %u callbacks (%s)%s", i,
              gets[i].want, gets[i].calls,
              !gets[i].calls ? "none" : gets[i].status ? tern_err_name(gets[i].status) : "success",
              gets[i].wrong ? ", another key's value" : "");
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 13: a lessee and the server's pool lock (shm) ---- */

/* A lessee that keeps what it is sent. The shm fabric hands a peer the
 * file of a region it maps over the link socket (SCM_RIGHTS) and closes it
 * once mapped; a hostile client need not. This binary's recvmsg (the
 * fabric's objects are linked into it, so their calls bind here) keeps a
 * duplicate of every descriptor received while keep_sent_fds is set, which
 * only the hostile lessee child below sets. */
static bool keep_sent_fds;
static int sent_fds[16];
static unsigned n_sent_fds;

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    static void *real;
    ssize_t (*fn)(int, struct msghdr *, int);
    ssize_t n;

    if (!__atomic_load_n(&real, __ATOMIC_ACQUIRE))
        __atomic_store_n(&real, dlsym(RTLD_NEXT, "recvmsg"), __ATOMIC_RELEASE);
    fn = (ssize_t (*)(int, struct msghdr *, int))__atomic_load_n(&real, __ATOMIC_ACQUIRE);
    n = fn(fd, msg, flags);
    if (n < 0 || !keep_sent_fds)
        return n;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int got;

            memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(got));
            if (n_sent_fds < sizeof(sent_fds) / sizeof(sent_fds[0]))
                sent_fds[n_sent_fds++] = fcntl(got, F_DUPFD_CLOEXEC, 0);
        }
    }
    return n;
}

struct lock_shared {
    int state;                       /* 1: wrote through its lease, 2: failed */
    unsigned n;                      /* PUTs acknowledged */
    uint64_t ver[64];
    int pool_fds;                    /* descriptors of the pool file it kept (hostile) */
    int locked;                      /* flock(LOCK_EX) on one of them succeeded */
};

static struct lock_shared *lk;

static void lock_key(char *k, size_t cap, int *kl, unsigned i)
{
    *kl = snprintf(k, cap, "lock-%u", i);
}

/* A client child that PUTs until one went through its leased segment,
 * which on shm it maps (a PUT by lease is a store through the mapping):
 * its mapping holds the file the server sent. If `arg` is not NULL it is
 * hostile: it keeps the descriptors it was sent, and on every one of the
 * pool file tries to take the pool's lock and then drops it. Then it
 * lives on, holding the lease, until SIGKILL. */
static int lock_lessee(void *arg)
{
    bool hostile = arg != NULL;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    const char *u = test_kv_uri(0);
    struct stat pool, st;
    double t0 = now_ms();

    keep_sent_fds = hostile;
    if (tern_rpc_open(NULL, &ep) < 0 || tern_kv_open(ep, &u, 1, 5 * SEC, &kv) < 0 ||
        tern_kv_set_path(kv, TERN_KV_PATH_ONESIDED) < 0) {
        __atomic_store_n(&lk->state, 2, __ATOMIC_RELEASE);
        return 3;
    }
    for (unsigned i = 0; i < 64 && now_ms() - t0 < 10000; i++) {
        char k[16];
        int kl;

        lock_key(k, sizeof(k), &kl, i);
        if (tern_kv_put(kv, k, (size_t)kl, k, (size_t)kl, &lk->ver[i]) < 0)
            break;
        lk->n = i + 1;
        if (stats(kv).puts > 0)
            break;
        for (int p = 0; p < 100; p++)
            tern_rpc_poll(ep);
    }
    if (hostile && stat(test_kv_pool(0), &pool) == 0)
        for (unsigned i = 0; i < n_sent_fds; i++) {
            if (sent_fds[i] < 0 || fstat(sent_fds[i], &st) < 0 || st.st_dev != pool.st_dev ||
                st.st_ino != pool.st_ino)
                continue;
            lk->pool_fds++;
            if (flock(sent_fds[i], LOCK_EX | LOCK_NB) == 0)
                lk->locked++;
            flock(sent_fds[i], LOCK_UN);
        }
    __atomic_store_n(&lk->state, stats(kv).puts > 0 ? 1 : 2, __ATOMIC_RELEASE);
    for (;;)
        pause();
}

static void wait_lessee(void)
{
    double t0 = now_ms();

    while (!__atomic_load_n(&lk->state, __ATOMIC_ACQUIRE)) {
        CHECK(now_ms() - t0 < 15000, "the lessee child never got going");
        usleep(1000);
    }
    CHECK(lk->state == 1, "the lessee child's PUTs did not go through a lease");
}

/* Every PUT the lessee had acknowledged is there. */
static void expect_lessee_puts(struct tern_kv *kv)
{
    for (unsigned i = 0; i < lk->n; i++) {
        char k[16];
        int kl;

        lock_key(k, sizeof(k), &kl, i);
        kv_expect_get(kv, k, (size_t)kl, k, (size_t)kl, lk->ver[i]);
    }
}

/* The server dies (kill -9) while a client maps its lease: a server
 * started again on the pool must be able to lock it. The lease used to be
 * registered with the descriptor that holds the pool's flock, so the
 * client's mapping shared the lock's open file description and kept the
 * pool locked (TERN_EBUSY) for as long as the client lived. */
START_TEST(lessee_keeps_no_lock_of_dead_server)
{
    int shm = test_fabric_row("shm");
    pid_t lessee;
    struct pm_opts po = {0};
    struct pm_pool *p;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    int rc;

    lk = test_shared_alloc(sizeof(*lk));
    start_os_server(0, shm, NULL);
    lessee = test_fork(lock_lessee, NULL);
    wait_lessee();
    test_kv_kill(0);
    rc = pm_open(test_kv_pool(0), &po, &p);
    CHECK(rc == 0, "the dead server's pool, while its lessee lives: %s", tern_err_name(rc));
    pm_close(p);
    /* A whole server, with the lessee still there. */
    start_os_server(0, shm, NULL);
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    expect_lessee_puts(kv);
    kv_must_put(kv, "after", 5, "restart", 7, NULL);
    test_child_kill(&lessee);
    munmap(lk, sizeof(*lk));
    test_kv_end(ep, kv, 1);
}
END_TEST

/* A hostile lessee keeps the descriptor of the pool the server sent it and
 * tries to take the pool's lock and to drop it: it holds no lock there to
 * drop, and a third opener still finds the pool in use by the server,
 * which serves on. */
START_TEST(lessee_cannot_unlock_live_server)
{
    int shm = test_fabric_row("shm");
    pid_t lessee;
    struct pm_opts po = {0};
    struct pm_pool *p = NULL;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    int rc;

    lk = test_shared_alloc(sizeof(*lk));
    start_os_server(0, shm, NULL);
    lessee = test_fork(lock_lessee, (void *)1);
    wait_lessee();
    CHECK(lk->pool_fds > 0, "the lessee was sent no descriptor of the pool");
    CHECK(lk->locked == 0, "the lessee's descriptor of the pool holds the server's lock");
    rc = pm_open(test_kv_pool(0), &po, &p);
    if (rc == 0)
        pm_close(p);
    CHECK(rc == TERN_EBUSY, "a third opener of a live server's pool: %s, not TERN_EBUSY",
          rc ? tern_err_name(rc) : "opened it");
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    expect_lessee_puts(kv);
    kv_must_put(kv, "after", 5, "unlock", 6, NULL);
    test_child_kill(&lessee);
    munmap(lk, sizeof(*lk));
    test_kv_end(ep, kv, 1);
}
END_TEST

Suite *suite_kv_onesided(void)
{
    Suite *s = suite_create("kv_onesided");
    TCase *tc = tcase_create("kv_onesided");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, window_unit);
    tcase_add_loop_test(tc, roundtrip_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(tc, auto_path_every_fabric, 0, test_fabric_count());
    tcase_add_test(tc, server_without_onesided);
    tcase_add_loop_test(tc, durable_onesided_puts, 0, test_fabric_count());
    tcase_add_loop_test(tc, cache_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(tc, torn_reads_single_writer, 0, test_fabric_count());
    tcase_add_loop_test(tc, concurrent_writers_one_key, 0, test_fabric_count());
    tcase_add_loop_test(tc, lying_window_never_trusted, 0, test_fabric_count());
    tcase_add_loop_test(tc, idle_lease_taken_back, 0, test_fabric_count());
    tcase_add_loop_test(tc, quiet_revoked_lessees_do_not_starve, 0, test_fabric_count());
    tcase_add_test(tc, lease_take_back_on_the_wire);
    tcase_add_test(tc, many_lessees_leave_room_for_puts);
    tcase_add_test(tc, session_lease_quota);
    tcase_add_loop_test(tc, idle_lease_returns_to_pool, 0, 2);
    tcase_add_loop_test(tc, dead_lessee_reclaimed, 0, test_fabric_count());
    tcase_add_test(tc, hostile_lput);
    tcase_add_loop_test(tc, hostile_lessee_header, 0, 3);
    suite_add_tcase(s, tc);
    /* GET by server push: a case of its own (CK_RUN_CASE=kv_push). */
    tc = tcase_create("kv_push");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, push_roundtrip_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(tc, hostile_pget, 0, test_fabric_count());
    tcase_add_loop_test(tc, lying_push_never_trusted, 0, test_fabric_count());
    tcase_add_loop_test(tc, push_races_in_place_updates, 0, test_fabric_count());
    suite_add_tcase(s, tc);
    tc = tcase_create("kv_fallback");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fallback_without_call_slots);
    suite_add_tcase(s, tc);
    /* The pool's lock and lessees on shm (CK_RUN_CASE=kv_pool_lock). */
    tc = tcase_create("kv_pool_lock");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lessee_keeps_no_lock_of_dead_server);
    tcase_add_test(tc, lessee_cannot_unlock_live_server);
    suite_add_tcase(s, tc);
    return s;
}

#endif /* TERN_HAVE_SERVICES */
