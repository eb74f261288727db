/* kv_onesided: leases over time. An idle lease is taken back for another
 * client, quiet clients whose leases were taken do not starve a third, a
 * dead client's lease comes back at once, leases take at most their share
 * of the pool (per pool and per session), and an idle lease gives its
 * segment back when the pool fills up.
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kv_onesided_fixture.h"
#include "pm/pm.h"

/* ---- an idle lease is taken back ---- */

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
    ck_assert_uint_eq(os_stats(a).leases, 1);
    usleep(100 * 1000);

    /* B asks while A's lease sits idle: A's is taken back, B gets it. */
    for (int i = 0; i < 8; i++) {
        kl = snprintf(k, sizeof(k), "b-%d", i);
        kv_must_put(b, k, (size_t)kl, k, (size_t)kl, &vb[i]);
        test_rpc_poll_for(ep_b, 1);
    }
    sb = os_stats(b);
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
    sa = os_stats(a);
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
    ck_assert_uint_eq(os_stats(b).leases, 1);
    usleep(100 * 1000);
    /* A and B both idle past lease_idle_ns: C's turn. */
    for (int i = 0; i < 8; i++) {
        kl = snprintf(k, sizeof(k), "c-%d", i);
        kv_must_put(c, k, (size_t)kl, k, (size_t)kl, &vc[i]);
        test_rpc_poll_for(ep_c, 1);
        sc = os_stats(c);
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

/* ---- a dead client's lease comes back at once ---- */

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
        if (os_stats(kv).puts >= 3)
            break;
        for (int p = 0; p < 100; p++)
            tern_rpc_poll(ep);
    }
    __atomic_store_n(&dead->state, os_stats(kv).puts > 0 ? 1 : 2, __ATOMIC_RELEASE);
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
        st = os_stats(kv);
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

/* ---- leases cannot crowd the pool's other writers out ---- */

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

void kv_os_add_leases(const struct kv_os_cases *c)
{
    tcase_add_loop_test(c->os, idle_lease_taken_back, 0, test_fabric_count());
    tcase_add_loop_test(c->os, quiet_revoked_lessees_do_not_starve, 0, test_fabric_count());
    tcase_add_test(c->os, many_lessees_leave_room_for_puts);
    tcase_add_test(c->os, session_lease_quota);
    tcase_add_loop_test(c->os, idle_lease_returns_to_pool, 0, 2);
    tcase_add_loop_test(c->os, dead_lessee_reclaimed, 0, test_fabric_count());
}

#endif /* TERN_HAVE_SERVICES */
