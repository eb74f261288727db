/* kv_onesided: hostile clients on raw sessions. LEASE and LPUT requests
 * that are malformed, replayed, out of range or on another's lease; a
 * taken-back lease as the wire shows it; a lessee that damages all it can
 * reach before a restart or a kill; PGET requests with bad lengths, keys
 * and destinations (nothing written where it was not asked, no pin left).
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kv_onesided_fixture.h"
#include "kv_store.h"
#include "kv_window.h"
#include "pm/pm.h"

/* ---- hostile LEASE / LPUT on raw sessions ---- */

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

/* ---- hostile PGET requests on raw sessions ---- */

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
    st0 = os_stats(kv);
    kv_expect_get(kv, in, kin, val, sizeof(val), ver);
    kv_expect_get(kv, out, kout, "far", 3, 0);
    kv_expect_enoent(kv, absent, kabsent);
    st1 = os_stats(kv);
    expect_gets(&st0, &st1, 2, 0, "a normal client after the hostile one");
    tern_rpc_disconnect(s);
    tern_rpc_mr_dereg(mr);
    tern_kv_close(rpc);
    test_kv_end(ep, kv, 2);
}
END_TEST

void kv_os_add_hostile(const struct kv_os_cases *c)
{
    tcase_add_test(c->os, lease_take_back_on_the_wire);
    tcase_add_test(c->os, hostile_lput);
    tcase_add_loop_test(c->os, hostile_lessee_header, 0, 3);
    tcase_add_loop_test(c->push, hostile_pget, 0, test_fabric_count());
}

#endif /* TERN_HAVE_SERVICES */
