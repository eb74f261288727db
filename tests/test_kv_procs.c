/* The KV service across processes: servers (tern_kv_service on an RPC
 * endpoint) run in forked children and the test process is the client, on
 * every fabric that is built. Covers the client library's contract (kv.h):
 * sync and async calls, mget split over several replies, scans, servers with
 * split hash ranges, hostile requests on a raw session (kv_wire.h), a full
 * pool, a restart on the same pool, and a server killed mid-run.
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "kv_client.h"
#include "kv_servers.h"
#include "kv.h"
#include "kv_store.h"
#include "kv_wire.h"
#include "rpc.h"
#include "rpc_util.h"
#include "suites.h"

#define SEC 1000000000ull
#define KIB 1024u
#define SVC TERN_KV_SERVICE_ID

/* ---- servers (tests/lib/kv_servers.h) and clients (kv_client.h), over the fabric matrix ---- */

/* Keys stored on one server, asked over a session of its own. */
static uint64_t server_keys(struct tern_rpc_ep *ep, int i)
{
    struct tern_session *s = test_kv_session(ep, i);
    struct kv_info info = test_kv_info(s);

    tern_rpc_disconnect(s);
    return info.keys;
}

/* ---- 1: the basic calls on every fabric ---- */

START_TEST(basic_ops_every_fabric)
{
    /* 128 KiB segments: a 64 KiB value needs more than one 64 KiB segment
     * (the segment header and the record header take their share). */
    static uint8_t big[64 * KIB], small[16];
    static const uint8_t bin_key[] = {'k', 0, 'e', 'y', 0, 0xff};
    uint8_t bin_val[256];
    struct test_kv_srv o = {.listen = test_fabric_listen(_i), .seg_size = 128 * KIB};
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    uint64_t v1 = 0, v2 = 0, v3 = 0, keys = 99;
    size_t got = 0;
    int rc;

    test_kv_start(0, &o);
    ep = test_rpc_ep(NULL);
    test_rpc_assert_fabric(ep, test_kv_uri(0), _i);
    kv = test_kv_client(ep, 1, NULL);

    rc = tern_kv_count(kv, &keys);
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(keys, 0);

    kv_must_put(kv, "alpha", 5, "one", 3, &v1);
    ck_assert_uint_gt(v1, 0);
    kv_expect_get(kv, "alpha", 5, "one", 3, v1);
    kv_must_put(kv, "alpha", 5, "two, longer", 11, &v2);
    ck_assert_uint_gt(v2, v1);
    kv_expect_get(kv, "alpha", 5, "two, longer", 11, v2);
    kv_must_put(kv, "alpha", 5, "3", 1, &v3);
    ck_assert_uint_gt(v3, v2);
    kv_expect_get(kv, "alpha", 5, "3", 1, v3);
    ck_assert_int_eq(tern_kv_del(kv, "alpha", 5), 0);
    rc = tern_kv_get(kv, "alpha", 5, small, sizeof(small), &got, NULL);
    ck_assert_msg(rc == TERN_ENOENT, "get after del: %s", tern_err_name(rc));
    rc = tern_kv_del(kv, "alpha", 5);
    ck_assert_msg(rc == TERN_ENOENT, "second del: %s", tern_err_name(rc));
    rc = tern_kv_get(kv, "never", 5, small, sizeof(small), &got, NULL);
    ck_assert_int_eq(rc, TERN_ENOENT);
    /* A deleted key comes back with a newer version. */
    kv_must_put(kv, "alpha", 5, "again", 5, &v1);
    ck_assert_uint_gt(v1, v3);
    kv_expect_get(kv, "alpha", 5, "again", 5, v1);

    /* Binary keys and values, zero bytes included, and an empty value. */
    for (int j = 0; j < 256; j++)
        bin_val[j] = (uint8_t)(j * 7);
    bin_val[0] = bin_val[100] = bin_val[255] = 0;
    kv_must_put(kv, bin_key, sizeof(bin_key), bin_val, sizeof(bin_val), &v1);
    kv_expect_get(kv, bin_key, sizeof(bin_key), bin_val, sizeof(bin_val), v1);
    rc = tern_kv_get(kv, bin_key, 2, small, sizeof(small), &got, NULL);  /* "k\0" */
    ck_assert_int_eq(rc, TERN_ENOENT);
    kv_must_put(kv, "empty", 5, NULL, 0, &v1);
    got = 77;
    rc = tern_kv_get(kv, "empty", 5, small, sizeof(small), &got, &v2);
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(got, 0);
    ck_assert_uint_eq(v2, v1);

    /* 64 KiB, and a buffer too small for it: the size needed comes back. */
    test_pattern(big, sizeof(big), 1);
    kv_must_put(kv, "big", 3, big, sizeof(big), &v1);
    kv_expect_get(kv, "big", 3, big, sizeof(big), v1);
    got = 0;
    rc = tern_kv_get(kv, "big", 3, small, sizeof(small), &got, NULL);
    ck_assert_msg(rc == TERN_EMSGSIZE, "get into a small buffer: %s", tern_err_name(rc));
    ck_assert_uint_eq(got, sizeof(big));
    got = 0;
    {
        uint8_t *exact = malloc(sizeof(big));

        ck_assert_ptr_nonnull(exact);
        rc = tern_kv_get(kv, "big", 3, exact, sizeof(big), &got, NULL);
        ck_assert_int_eq(rc, 0);
        ck_assert_uint_eq(got, sizeof(big));
        ck_assert(memcmp(exact, big, sizeof(big)) == 0);
        rc = tern_kv_get(kv, "big", 3, exact, sizeof(big) - 1, &got, NULL);
        ck_assert_int_eq(rc, TERN_EMSGSIZE);
        ck_assert_uint_eq(got, sizeof(big));
        free(exact);
    }

    /* alpha, the binary key, empty, big, and ten more. */
    for (int j = 0; j < 10; j++) {
        char k[16];
        int kl = snprintf(k, sizeof(k), "k%d", j);

        kv_must_put(kv, k, (size_t)kl, k, (size_t)kl, NULL);
        kv_must_put(kv, k, (size_t)kl, "x", 1, NULL);      /* overwrites count once */
    }
    ck_assert_int_eq(tern_kv_del(kv, "k3", 2), 0);
    ck_assert_int_eq(tern_kv_count(kv, &keys), 0);
    ck_assert_uint_eq(keys, 4 + 9);

    /* Deadlines: set, read, moved, taken away; a key gone at its deadline
     * to GET whatever path the client takes. The server's clock decides;
     * this host's is the same one. */
    {
        uint64_t now = test_wall_ms(), at = 1;

        ck_assert_int_eq(tern_kv_put_until(kv, "ttl", 3, "val", 3, now + 100000, &v1), 0);
        kv_expect_get(kv, "ttl", 3, "val", 3, v1);
        ck_assert_int_eq(tern_kv_expiry(kv, "ttl", 3, &at), 0);
        ck_assert_uint_eq(at, now + 100000);
        ck_assert_int_eq(tern_kv_expire(kv, "ttl", 3, 0), 0);
        ck_assert_int_eq(tern_kv_expiry(kv, "ttl", 3, &at), 0);
        ck_assert_uint_eq(at, 0);
        ck_assert_int_eq(tern_kv_expire(kv, "ttl", 3, now + 300), 0);
        ck_assert_int_eq(tern_kv_expiry(kv, "ttl", 3, &at), 0);
        ck_assert_uint_eq(at, now + 300);
        ck_assert_int_eq(tern_kv_expiry(kv, "none", 4, &at), TERN_ENOENT);
        ck_assert_int_eq(tern_kv_expire(kv, "none", 4, now + 300), TERN_ENOENT);
        ck_assert_int_eq(tern_kv_put_until(kv, "past", 4, "x", 1, now - 1, NULL), 0);
        rc = tern_kv_get(kv, "past", 4, small, sizeof(small), &got, NULL);
        ck_assert_int_eq(rc, TERN_ENOENT);
        while (test_wall_ms() <= now + 300)
            usleep(10000);
        rc = tern_kv_get(kv, "ttl", 3, small, sizeof(small), &got, NULL);
        ck_assert_msg(rc == TERN_ENOENT, "get past the deadline: %s", tern_err_name(rc));
        ck_assert_int_eq(tern_kv_expiry(kv, "ttl", 3, &at), TERN_ENOENT);
        kv_must_put(kv, "ttl", 3, "back", 4, &v1);     /* a plain put: no deadline */
        ck_assert_int_eq(tern_kv_expiry(kv, "ttl", 3, &at), 0);
        ck_assert_uint_eq(at, 0);
    }
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 2: async calls with a window, and mget with missing keys ---- */

#define N_ASYNC 1000
#define WINDOW 64

static char akey[N_ASYNC][24];
static size_t aklen[N_ASYNC];
static uint8_t aval[N_ASYNC][320];
static size_t avlen[N_ASYNC];

struct acall {
    unsigned i;
    int runs, status;
    uint64_t version, put_version;
    bool value_ok;
};

static struct acall acalls[N_ASYNC];
static unsigned a_done, a_bad;

static void put_cb(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct acall *c = arg;

    c->runs++;
    c->status = status;
    c->put_version = version;
    a_done++;
}

static void get_cb(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct acall *c = arg;

    c->runs++;
    c->status = status;
    c->version = version;
    c->value_ok = status == 0 && len == avlen[c->i] && memcmp(val, aval[c->i], len) == 0;
    if (!c->value_ok)
        a_bad++;
    a_done++;
}

static void make_async_keys(void)
{
    for (unsigned i = 0; i < N_ASYNC; i++) {
        aklen[i] = (size_t)snprintf(akey[i], sizeof(akey[i]), "async-key-%u", i);
        avlen[i] = 1 + (i * 37) % sizeof(aval[i]);
        test_pattern(aval[i], avlen[i], i + 100);
    }
}

/* Results of an mget, by index. */
#define N_MGET_MAX 512

struct mget_seen {
    int runs[N_MGET_MAX];
    int status[N_MGET_MAX];
    uint64_t version[N_MGET_MAX];
    bool value_ok[N_MGET_MAX];
    const uint8_t *want[N_MGET_MAX];
    size_t want_len[N_MGET_MAX];
    unsigned n, calls;
};

static void mget_cb(void *arg, unsigned i, int status, const void *val, size_t len,
                    uint64_t version)
{
    struct mget_seen *m = arg;

    m->calls++;
    if (i >= m->n)
        return;     /* counted in calls, caught by the caller */
    m->runs[i]++;
    m->status[i] = status;
    m->version[i] = version;
    m->value_ok[i] = status == 0 && len == m->want_len[i] &&
                     (len == 0 || memcmp(val, m->want[i], len) == 0);
}

START_TEST(async_window_and_mget)
{
    static struct mget_seen m;
    enum { N_MGET = 300 };
    static char missing[N_MGET][24];
    const void *keys[N_MGET];
    size_t klens[N_MGET];
    unsigned issued = 0, n_missing = 0;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    uint64_t keys_n = 0;
    double t0;
    int rc;

    make_async_keys();
    test_kv_start(0, &(struct test_kv_srv){0});
    ep = test_rpc_ep(NULL);
    kv = test_kv_client(ep, 1, NULL);

    /* 1000 PUTs, at most 64 in flight. */
    memset(acalls, 0, sizeof(acalls));
    a_done = a_bad = 0;
    t0 = now_ms();
    while (a_done < N_ASYNC) {
        ck_assert_msg(now_ms() - t0 < 20000, "puts stuck at %u of %u", a_done, N_ASYNC);
        while (issued < N_ASYNC && issued - a_done < WINDOW) {
            acalls[issued].i = issued;
            rc = tern_kv_put_async(kv, akey[issued], aklen[issued], aval[issued],
                                   avlen[issued], put_cb, &acalls[issued]);
            ck_assert_msg(rc == 0, "put_async %u: %s", issued, tern_err_name(rc));
            issued++;
        }
        tern_rpc_poll(ep);
    }
    for (unsigned i = 0; i < N_ASYNC; i++) {
        ck_assert_msg(acalls[i].runs == 1, "put %u: callback ran %d times", i, acalls[i].runs);
        ck_assert_msg(acalls[i].status == 0, "put %u: %s", i, tern_err_name(acalls[i].status));
        ck_assert_uint_gt(acalls[i].put_version, 0);
        for (unsigned j = 0; j < i; j++)
            ck_assert_msg(acalls[j].put_version != acalls[i].put_version,
                          "puts %u and %u got version %llu", j, i,
                          (unsigned long long)acalls[i].put_version);
    }
    ck_assert_int_eq(tern_kv_count(kv, &keys_n), 0);
    ck_assert_uint_eq(keys_n, N_ASYNC);

    /* Every GET at once; callbacks check the values. */
    a_done = 0;
    for (unsigned i = 0; i < N_ASYNC; i++) {
        acalls[i].runs = 0;
        while ((rc = tern_kv_get_async(kv, akey[i], aklen[i], get_cb, &acalls[i])) ==
               TERN_ENOBUFS)
            tern_rpc_poll(ep);
        ck_assert_msg(rc == 0, "get_async %u: %s", i, tern_err_name(rc));
    }
    t0 = now_ms();
    while (a_done < N_ASYNC) {
        ck_assert_msg(now_ms() - t0 < 20000, "gets stuck at %u of %u", a_done, N_ASYNC);
        tern_rpc_poll(ep);
    }
    ck_assert_msg(a_bad == 0, "%u gets returned a wrong value", a_bad);
    for (unsigned i = 0; i < N_ASYNC; i++) {
        ck_assert_int_eq(acalls[i].runs, 1);
        ck_assert_uint_eq(acalls[i].version, acalls[i].put_version);
    }

    /* MGET: 300 keys, every 15th (20 of them) missing. */
    memset(&m, 0, sizeof(m));
    m.n = N_MGET;
    for (unsigned i = 0; i < N_MGET; i++) {
        if (i % 15 == 7) {
            klens[i] = (size_t)snprintf(missing[i], sizeof(missing[i]), "missing-%u", i);
            keys[i] = missing[i];
            n_missing++;
        } else {
            unsigned j = (i * 7 + 3) % N_ASYNC;

            keys[i] = akey[j];
            klens[i] = aklen[j];
            m.want[i] = aval[j];
            m.want_len[i] = avlen[j];
        }
    }
    ck_assert_uint_eq(n_missing, 20);
    rc = tern_kv_mget(kv, N_MGET, keys, klens, mget_cb, &m);
    ck_assert_msg(rc == 0, "mget: %s", tern_err_name(rc));
    ck_assert_uint_eq(m.calls, N_MGET);
    for (unsigned i = 0; i < N_MGET; i++) {
        ck_assert_msg(m.runs[i] == 1, "mget index %u reported %d times", i, m.runs[i]);
        if (i % 15 == 7) {
            ck_assert_msg(m.status[i] == TERN_ENOENT, "missing key %u: %s", i,
                          tern_err_name(m.status[i]));
        } else {
            ck_assert_msg(m.status[i] == 0, "key %u: %s", i, tern_err_name(m.status[i]));
            ck_assert_msg(m.value_ok[i], "mget index %u: wrong value", i);
            ck_assert_uint_eq(m.version[i], acalls[(i * 7 + 3) % N_ASYNC].put_version);
        }
    }
    /* An empty mget is a no-op. */
    ck_assert_int_eq(tern_kv_mget(kv, 0, NULL, NULL, mget_cb, &m), 0);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 3: an mget whose reply does not fit in one message ---- */

START_TEST(mget_larger_than_one_message)
{
    enum { N = 100, VLEN = 1024 };
    static struct mget_seen m;
    static uint8_t vals[N][VLEN];
    static char keyb[N][16];
    static uint8_t req[8192], rep[32 * KIB];
    const struct tern_rpc_config small = {.max_msg = 16 * KIB};
    const void *keys[N];
    size_t klens[N], off = sizeof(struct kv_mget), got = 0;
    struct kv_mget q = {.n = N};
    struct kv_mget_rep r;
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    int rc;

    test_kv_start(0, &(struct test_kv_srv){0});
    ep = test_rpc_ep(&small);
    kv = test_kv_client(ep, 1, NULL);
    for (unsigned i = 0; i < N; i++) {
        klens[i] = (size_t)snprintf(keyb[i], sizeof(keyb[i]), "kib-%u", i);
        keys[i] = keyb[i];
        test_pattern(vals[i], VLEN, i + 7);
        kv_must_put(kv, keyb[i], klens[i], vals[i], VLEN, NULL);
        m.want[i] = vals[i];
        m.want_len[i] = VLEN;
    }
    m.n = N;
    rc = tern_kv_mget(kv, N, keys, klens, mget_cb, &m);
    ck_assert_msg(rc == 0, "mget: %s", tern_err_name(rc));
    ck_assert_uint_eq(m.calls, N);
    for (unsigned i = 0; i < N; i++) {
        ck_assert_msg(m.runs[i] == 1, "index %u reported %d times", i, m.runs[i]);
        ck_assert_msg(m.status[i] == 0 && m.value_ok[i], "index %u: %s", i,
                      tern_err_name(m.status[i]));
    }

    /* The same request by hand: the server answers only part of it, so the
     * library really had to ask again. */
    memcpy(req, &q, sizeof(q));
    for (unsigned i = 0; i < N; i++) {
        uint16_t kl = (uint16_t)klens[i];

        memcpy(req + off, &kl, sizeof(kl));
        memcpy(req + off + sizeof(kl), keys[i], kl);
        off += sizeof(kl) + kl;
    }
    s = test_kv_session(ep, 0);
    rc = tern_call_sync(s, SVC, KV_M_MGET, req, off, rep, sizeof(rep), &got, 5 * SEC);
    ck_assert_msg(rc == 0, "raw mget: %s", tern_err_name(rc));
    ck_assert_uint_ge(got, sizeof(r));
    ck_assert_uint_le(got, 16 * KIB);
    memcpy(&r, rep, sizeof(r));
    ck_assert_msg(r.n_done > 0 && r.n_done < N, "one reply held %u of %u", r.n_done, N);
    ck_assert_uint_eq(got, sizeof(r) + r.n_done * kv_item_size(0, VLEN));
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 4: scans ---- */

#define N_SCAN 2000

struct scan_seen {
    int seen[N_SCAN];
    unsigned visits, bad, foreign;
    unsigned call_visits, max_call_visits;
};

static size_t scan_val(unsigned i, uint8_t *out)
{
    size_t len = 8 + i % 90;

    test_pattern(out, len, i * 3 + 1);
    return len;
}

static void scan_cb(void *arg, const void *key, size_t klen, const void *val, size_t len,
                    uint64_t version)
{
    struct scan_seen *sc = arg;
    uint8_t want[128];
    char k[32];
    unsigned i;

    sc->visits++;
    sc->call_visits++;
    if (klen >= sizeof(k)) {
        sc->foreign++;
        return;
    }
    memcpy(k, key, klen);
    k[klen] = 0;
    if (sscanf(k, "scan-%u", &i) != 1 || i >= N_SCAN) {
        sc->foreign++;
        return;
    }
    sc->seen[i]++;
    if (len != scan_val(i, want) || memcmp(val, want, len) != 0 || version == 0)
        sc->bad++;
}

/* Scan everything with calls of `max`; returns the number of calls. */
static unsigned scan_all(struct tern_kv *kv, struct scan_seen *sc, unsigned max)
{
    uint64_t cursor = 0;
    unsigned calls = 0;

    memset(sc, 0, sizeof(*sc));
    do {
        int rc;

        sc->call_visits = 0;
        rc = tern_kv_scan(kv, &cursor, max, scan_cb, sc);
        ck_assert_msg(rc == 0, "scan call %u: %s", calls, tern_err_name(rc));
        if (sc->call_visits > sc->max_call_visits)
            sc->max_call_visits = sc->call_visits;
        ck_assert_msg(++calls < 100000, "the scan does not end");
    } while (cursor);
    return calls;
}

static void assert_scanned_all(const struct scan_seen *sc, unsigned n)
{
    ck_assert_msg(sc->bad == 0, "%u keys had a wrong value", sc->bad);
    ck_assert_msg(sc->foreign == 0, "%u unknown keys", sc->foreign);
    for (unsigned i = 0; i < n; i++)
        ck_assert_msg(sc->seen[i] >= 1, "key %u never visited", i);
}

START_TEST(scan_every_key)
{
    static struct scan_seen sc;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    uint64_t cursor = 0;
    unsigned calls;
    int rc;

    test_kv_start(0, &(struct test_kv_srv){0});
    ep = test_rpc_ep(NULL);
    kv = test_kv_client(ep, 1, NULL);

    /* An empty store: done at the first call, nothing visited. */
    memset(&sc, 0, sizeof(sc));
    rc = tern_kv_scan(kv, &cursor, 100, scan_cb, &sc);
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(cursor, 0);
    ck_assert_uint_eq(sc.visits, 0);
    /* Bad arguments. */
    ck_assert_int_eq(tern_kv_scan(kv, &cursor, 0, scan_cb, &sc), TERN_EINVAL);
    cursor = 5ull << 56;    /* server 5 of 1 */
    ck_assert_int_eq(tern_kv_scan(kv, &cursor, 10, scan_cb, &sc), TERN_EINVAL);

    for (unsigned i = 0; i < N_SCAN; i++) {
        uint8_t v[128];
        char k[32];
        int kl = snprintf(k, sizeof(k), "scan-%u", i);

        kv_must_put(kv, k, (size_t)kl, v, scan_val(i, v), NULL);
    }
    /* Deleted keys are not visited. */
    for (unsigned i = 0; i < 50; i++) {
        char k[32];
        int kl = snprintf(k, sizeof(k), "scan-gone-%u", i);

        kv_must_put(kv, k, (size_t)kl, "x", 1, NULL);
        ck_assert_int_eq(tern_kv_del(kv, k, (size_t)kl), 0);
    }
    calls = scan_all(kv, &sc, 100);
    assert_scanned_all(&sc, N_SCAN);
    ck_assert_msg(calls >= N_SCAN / 100 / 2, "%u calls of up to 100 keys for %u keys", calls,
                  N_SCAN);
    /* Whole buckets: a call may go past max by the rest of one bucket. */
    ck_assert_msg(sc.max_call_visits <= 100 + 8, "a call of max 100 visited %u keys",
                  sc.max_call_visits);
    calls = scan_all(kv, &sc, 7);
    assert_scanned_all(&sc, N_SCAN);
    ck_assert_uint_ge(calls, N_SCAN / 7 / 2);
    calls = scan_all(kv, &sc, 100000);
    assert_scanned_all(&sc, N_SCAN);
    ck_assert_uint_le(sc.visits, N_SCAN);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 5: two servers with split ranges ---- */

START_TEST(two_servers_split_ranges)
{
    enum { N = 400 };
    static struct mget_seen m;
    static struct scan_seen sc;
    static uint8_t vals[N][128];
    static char keyb[N][24];
    static const int reversed[2] = {1, 0};
    const void *keys[N];
    size_t klens[N];
    unsigned on_lo = 0;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    struct tern_session *raw;
    uint64_t count = 0;
    int rc;

    test_kv_start(0, &(struct test_kv_srv){.lo = 0, .hi = 0x7fffffff});
    test_kv_start(1, &(struct test_kv_srv){.lo = 0x80000000u, .hi = 0xffffffffu});
    ep = test_rpc_ep(NULL);
    kv = test_kv_client(ep, 2, reversed);   /* the library sorts them */
    for (unsigned i = 0; i < N; i++) {
        klens[i] = (size_t)snprintf(keyb[i], sizeof(keyb[i]), "scan-%u", i);
        keys[i] = keyb[i];
        test_pattern(vals[i], sizeof(vals[i]), i);
        kv_must_put(kv, keyb[i], klens[i], vals[i], scan_val(i, vals[i]), NULL);
        on_lo += kv_top32(keyb[i], klens[i]) <= 0x7fffffffu;
        m.want[i] = vals[i];
        m.want_len[i] = scan_val(i, vals[i]);
    }
    /* Both servers got their own share, exactly. */
    ck_assert_msg(on_lo > N / 4 && on_lo < 3 * N / 4, "%u of %u keys hash low", on_lo, N);
    ck_assert_uint_eq(server_keys(ep, 0), on_lo);
    ck_assert_uint_eq(server_keys(ep, 1), N - on_lo);
    ck_assert_int_eq(tern_kv_count(kv, &count), 0);
    ck_assert_uint_eq(count, N);

    /* A key sent to the wrong server by hand is refused there. */
    raw = test_kv_session(ep, 1);
    for (unsigned i = 0; i < N; i++) {
        uint8_t req[64];
        struct kv_key h = {.klen = (uint16_t)klens[i]};

        if (kv_top32(keyb[i], klens[i]) > 0x7fffffffu)
            continue;
        memcpy(req, &h, sizeof(h));
        memcpy(req + sizeof(h), keyb[i], klens[i]);
        rc = tern_call_sync(raw, SVC, KV_M_GET, req, sizeof(h) + klens[i], NULL, 0, NULL,
                            5 * SEC);
        ck_assert_msg(rc == TERN_EWRONGNODE, "get of a low key on the high server: %s",
                      tern_err_name(rc));
        break;
    }
    tern_rpc_disconnect(raw);

    m.n = N;
    rc = tern_kv_mget(kv, N, keys, klens, mget_cb, &m);
    ck_assert_msg(rc == 0, "mget: %s", tern_err_name(rc));
    ck_assert_uint_eq(m.calls, N);
    for (unsigned i = 0; i < N; i++)
        ck_assert_msg(m.runs[i] == 1 && m.status[i] == 0 && m.value_ok[i],
                      "mget index %u: runs %d, %s", i, m.runs[i], tern_err_name(m.status[i]));

    scan_all(kv, &sc, 50);
    assert_scanned_all(&sc, N);
    ck_assert_uint_ge(sc.visits, N);
    /* Deletes go to the right server too. */
    for (unsigned i = 0; i < N; i += 2)
        ck_assert_int_eq(tern_kv_del(kv, keyb[i], klens[i]), 0);
    ck_assert_int_eq(tern_kv_count(kv, &count), 0);
    ck_assert_uint_eq(count, N / 2);
    test_kv_end(ep, kv, 2);
}
END_TEST

/* Ranges that overlap, leave a gap or miss the top: tern_kv_open refuses. */
START_TEST(bad_ranges_refused)
{
    static const struct {
        uint32_t lo0, hi0, lo1, hi1;
        int n;
    } cases[] = {
        {0, 0x80000000u, 0x80000000u, 0xffffffffu, 2},    /* overlap of one */
        {0, 0x7ffffffeu, 0x80000000u, 0xffffffffu, 2},    /* gap of one */
        {0, 0xffffffffu, 0x80000000u, 0xffffffffu, 2},    /* one inside the other */
        {0, 0x7fffffffu, 0, 0, 1},                        /* the top is missing */
        {0x00000001u, 0xffffffffu, 0, 0, 1},              /* the bottom is missing */
    };
    struct tern_rpc_ep *ep = test_rpc_ep(NULL);

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const char *u[2];
        struct tern_kv *kv = NULL;
        int rc;

        test_kv_start(0, &(struct test_kv_srv){.lo = cases[c].lo0, .hi = cases[c].hi0});
        if (cases[c].n == 2)
            test_kv_start(1, &(struct test_kv_srv){.lo = cases[c].lo1, .hi = cases[c].hi1});
        u[0] = test_kv_uri(0);
        u[1] = test_kv_uri(1);
        rc = tern_kv_open(ep, u, (unsigned)cases[c].n, 5 * SEC, &kv);
        ck_assert_msg(rc == TERN_EINVAL, "case %zu: tern_kv_open gave %s", c, tern_err_name(rc));
        ck_assert_ptr_null(kv);     /* no half-open client handed out */
        for (int i = 0; i < cases[c].n; i++)
            test_kv_finish(i);
    }
    /* The control: the halves of case 0 done right open fine. */
    test_kv_start(0, &(struct test_kv_srv){.lo = 0, .hi = 0x7fffffff});
    test_kv_start(1, &(struct test_kv_srv){.lo = 0x80000000u, .hi = 0xffffffffu});
    {
        struct tern_kv *kv = test_kv_client(ep, 2, NULL);

        test_kv_end(ep, kv, 2);
    }
}
END_TEST

/* ---- 6: hostile requests on a raw session ---- */

/* A kv_key request: header (klen/flags/vlen as given), then `body`. */
static size_t build_key_req(uint8_t *out, uint16_t klen, uint16_t flags, uint32_t vlen,
                            const void *body, size_t body_len)
{
    struct kv_key h = {.klen = klen, .flags = flags, .vlen = vlen};

    memcpy(out, &h, sizeof(h));
    if (body_len)
        memcpy(out + sizeof(h), body, body_len);
    return sizeof(h) + body_len;
}

/* A PUT then a GET of key/val over a raw session, both right. */
static void raw_put_get(struct tern_session *s, const char *key, size_t klen, const char *val)
{
    uint8_t req[256], rep[256], body[200];
    size_t vlen = strlen(val), len, got = 0;
    struct kv_val kv_v;
    int rc;

    memcpy(body, key, klen);
    memcpy(body + klen, val, vlen);
    len = build_key_req(req, (uint16_t)klen, 0, (uint32_t)vlen, body, klen + vlen);
    rc = test_kv_call(s, KV_M_PUT, req, len, rep, sizeof(rep), &got);
    ck_assert_msg(rc == 0, "raw put: %s", tern_err_name(rc));
    ck_assert_uint_eq(got, sizeof(kv_v));
    len = build_key_req(req, (uint16_t)klen, 0, 0, key, klen);
    rc = test_kv_call(s, KV_M_GET, req, len, rep, sizeof(rep), &got);
    ck_assert_msg(rc == 0, "raw get: %s", tern_err_name(rc));
    ck_assert_uint_eq(got, sizeof(kv_v) + vlen);
    ck_assert(memcmp(rep + sizeof(kv_v), val, vlen) == 0);
}

/* One hostile request of a round: all of a round's share the bytes in req. */
struct bad_case {
    const char *what;
    uint16_t method;
    size_t len;
    int want;
};

START_TEST(bad_input_keeps_serving)
{
    static uint8_t req[4096], rep[4096], huge[2u << 20];
    struct bad_case bad[8];
    char in[64], out[64], in16[20];
    size_t kin, kout, len = 0, got;
    struct tern_session *s, *s2;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    struct kv_info info;
    uint8_t *p;
    int rc, nb;

    /* Server 0 owns the low half (the raw tests), server 1 the high half
     * (so that the library can open both). */
    test_kv_start(0, &(struct test_kv_srv){.lo = 0, .hi = 0x7fffffff});
    test_kv_start(1, &(struct test_kv_srv){.lo = 0x80000000u, .hi = 0xffffffffu});
    ep = test_rpc_ep(NULL);
    s = test_kv_session(ep, 0);
    kv_key_in_range(in, sizeof(in), &kin, "in", 0, 0x7fffffff);
    kv_key_in_range(out, sizeof(out), &kout, "out", 0x80000000u, 0xffffffffu);
    raw_put_get(s, in, kin, "first");

#define BAD(w, m, l, e) (bad[nb++] = (struct bad_case){w, m, l, e})
    for (int round = 0;; round++) {
        struct kv_mget mg = {.n = 2};
        struct kv_scan sq = {.max = 10};
        uint16_t kl;

        nb = 0;
        switch (round) {
        case 0: /* GET with half a header */
            len = build_key_req(req, (uint16_t)kin, 0, 0, NULL, 0) - 4;
            BAD("get, truncated header", KV_M_GET, len, TERN_EPROTO);
            break;
        case 1: /* GET whose klen runs past the payload */
            len = build_key_req(req, (uint16_t)(kin + 5), 0, 0, in, kin);
            BAD("get, klen past the end", KV_M_GET, len, TERN_EPROTO);
            break;
        case 2: /* GET with bytes after the key */
            len = build_key_req(req, (uint16_t)kin, 0, 0, in, kin) + 3;
            BAD("get, trailing bytes", KV_M_GET, len, TERN_EPROTO);
            break;
        case 3: /* GET that claims a value */
            memcpy(req + sizeof(struct kv_key) + kin, "abc", 3);
            len = build_key_req(req, (uint16_t)kin, 0, 3, in, kin) + 3;
            BAD("get with a value", KV_M_GET, len, TERN_EPROTO);
            break;
        case 4: /* GET with flags set */
            len = build_key_req(req, (uint16_t)kin, 1, 0, in, kin);
            BAD("get with flags", KV_M_GET, len, TERN_EPROTO);
            break;
        case 5: /* PUT whose vlen is larger than the value sent */
            len = build_key_req(req, (uint16_t)kin, 0, 100, in, kin);
            memset(req + len, 'v', 50);
            len += 50;
            BAD("put, vlen over the payload", KV_M_PUT, len, TERN_EPROTO);
            break;
        case 6: /* PUT whose vlen is smaller than the value sent */
            len = build_key_req(req, (uint16_t)kin, 0, 10, in, kin);
            memset(req + len, 'v', 50);
            len += 50;
            BAD("put, vlen under the payload", KV_M_PUT, len, TERN_EPROTO);
            break;
        case 7: /* PUT with a vlen near 4 GiB (no wrap in the length sum) */
            len = build_key_req(req, (uint16_t)kin, 0, UINT32_MAX, in, kin);
            memset(req + len, 'v', 8);
            len += 8;
            BAD("put, vlen 4 GiB", KV_M_PUT, len, TERN_EPROTO);
            break;
        case 8: /* zero-length key, GET, PUT and DEL */
            len = build_key_req(req, 0, 0, 0, NULL, 0);
            BAD("get, empty key", KV_M_GET, len, TERN_EINVAL);
            BAD("del, empty key", KV_M_DEL, len, TERN_EINVAL);
            break;
        case 9:
            len = build_key_req(req, 0, 0, 3, "abc", 3);
            BAD("put, empty key", KV_M_PUT, len, TERN_EINVAL);
            break;
        case 10: /* MGET whose second key runs past the end */
            memcpy(req, &mg, sizeof(mg));
            p = req + sizeof(mg);
            kl = (uint16_t)kin;
            memcpy(p, &kl, 2);
            memcpy(p + 2, in, kin);
            p += 2 + kin;
            kl = 50;
            memcpy(p, &kl, 2);
            memcpy(p + 2, "0123456789", 10);
            p += 12;
            len = (size_t)(p - req);
            BAD("mget, key past the end", KV_M_MGET, len, TERN_EPROTO);
            break;
        case 11: /* MGET with a key length cut in half */
            memcpy(req, &mg, sizeof(mg));
            p = req + sizeof(mg);
            kl = (uint16_t)kin;
            memcpy(p, &kl, 2);
            memcpy(p + 2, in, kin);
            p += 2 + kin;
            *p++ = 1;
            len = (size_t)(p - req);
            BAD("mget, half a key length", KV_M_MGET, len, TERN_EPROTO);
            break;
        case 12: /* MGET with more bytes than its keys */
            mg.n = 1;
            memcpy(req, &mg, sizeof(mg));
            p = req + sizeof(mg);
            kl = (uint16_t)kin;
            memcpy(p, &kl, 2);
            memcpy(p + 2, in, kin);
            p += 2 + kin + 5;
            len = (size_t)(p - req);
            BAD("mget, trailing bytes", KV_M_MGET, len, TERN_EPROTO);
            break;
        case 13: /* MGET with an empty key, and with a short header */
            mg.n = 1;
            memcpy(req, &mg, sizeof(mg));
            memset(req + sizeof(mg), 0, 2);
            len = sizeof(mg) + 2;
            BAD("mget, empty key", KV_M_MGET, len, TERN_EPROTO);
            BAD("mget, short header", KV_M_MGET, 4, TERN_EPROTO);
            break;
        case 14: /* SCAN of the wrong size, and with max 0 */
            memcpy(req, &sq, sizeof(sq));
            BAD("scan, short", KV_M_SCAN, sizeof(sq) - 1, TERN_EPROTO);
            BAD("scan, long", KV_M_SCAN, sizeof(sq) + 1, TERN_EPROTO);
            BAD("scan, empty", KV_M_SCAN, 0, TERN_EPROTO);
            break;
        case 15:
            sq.max = 0;
            memcpy(req, &sq, sizeof(sq));
            BAD("scan, max 0", KV_M_SCAN, sizeof(sq), TERN_EINVAL);
            break;
        case 16: /* INFO with a payload; unknown methods */
            memset(req, 0, 8);
            BAD("info with a payload", KV_M_INFO, 8, TERN_EPROTO);
            BAD("method 0", 0, 8, TERN_ENOMETHOD);
            BAD("method 14", KV_M_EXPIRE + 1, 8, TERN_ENOMETHOD);
            BAD("members, with a payload", KV_M_MEMBERS, 8, TERN_EPROTO);
            BAD("method 0xffff", 0xffff, 0, TERN_ENOMETHOD);
            break;
        case 17: /* a key of the other server's half */
            len = build_key_req(req, (uint16_t)kout, 0, 0, out, kout);
            BAD("get, key out of range", KV_M_GET, len, TERN_EWRONGNODE);
            BAD("del, key out of range", KV_M_DEL, len, TERN_EWRONGNODE);
            break;
        case 18:
            memcpy(req + sizeof(struct kv_key) + kout, "val", 3);
            len = build_key_req(req, (uint16_t)kout, 0, 3, out, kout) + 3;
            BAD("put, key out of range", KV_M_PUT, len, TERN_EWRONGNODE);
            break;
        case 19: /* DEL of an absent key */
            len = build_key_req(req, 6, 0, 0, "absent", 6);
            BAD("del, absent key", KV_M_DEL, len, TERN_ENOENT);
            break;
        case 20: /* a PUT that says it has a deadline, with a value too short for one */
            len = build_key_req(req, (uint16_t)kin, KV_F_DEADLINE, 5, in, kin);
            memset(req + len, 'd', 5);
            len += 5;
            BAD("put, deadline cut short", KV_M_PUT, len, TERN_EPROTO);
            break;
        case 21: /* EXPIRE without its 8 bytes, or with more; EXPIRY with a value */
            len = build_key_req(req, (uint16_t)kin, 0, 4, in, kin);
            memset(req + len, 0, 4);
            len += 4;
            BAD("expire, 4-byte deadline", KV_M_EXPIRE, len, TERN_EPROTO);
            BAD("expiry with a value", KV_M_EXPIRY, len, TERN_EPROTO);
            break;
        case 22: /* the deadline of an absent key */
            len = build_key_req(req, 6, 0, 0, "absent", 6);
            BAD("expiry, absent key", KV_M_EXPIRY, len, TERN_ENOENT);
            BAD("expire, absent key", KV_M_EXPIRE, len, TERN_EPROTO);
            break;
        case 23: /* the deadline of a key of the other half */
            len = build_key_req(req, (uint16_t)kout, 0, 0, out, kout);
            BAD("expiry, key out of range", KV_M_EXPIRY, len, TERN_EWRONGNODE);
            break;
        default:
            goto done;
        }
        for (int b = 0; b < nb; b++) {
            got = 999;
            rc = test_kv_call(s, bad[b].method, req, bad[b].len, rep, sizeof(rep), &got);
            ck_assert_msg(rc == bad[b].want, "%s: got %s, want %s", bad[b].what,
                          tern_err_name(rc), tern_err_name(bad[b].want));
            ck_assert_msg(tern_session_status(s) == 0, "%s: the session died", bad[b].what);
        }
        /* The server still serves this session. */
        raw_put_get(s, in, kin, round % 2 ? "odd" : "even");
    }
done:
#undef BAD
    /* MGET with a key of the other half answers that key's status only. */
    {
        struct kv_mget mg = {.n = 2};
        struct kv_mget_rep r;
        struct kv_item it;
        uint16_t kl;

        memcpy(req, &mg, sizeof(mg));
        p = req + sizeof(mg);
        kl = (uint16_t)kout;
        memcpy(p, &kl, 2);
        memcpy(p + 2, out, kout);
        p += 2 + kout;
        kl = (uint16_t)kin;
        memcpy(p, &kl, 2);
        memcpy(p + 2, in, kin);
        p += 2 + kin;
        rc = test_kv_call(s, KV_M_MGET, req, (size_t)(p - req), rep, sizeof(rep), &got);
        ck_assert_msg(rc == 0, "mget, one key out of range: %s", tern_err_name(rc));
        memcpy(&r, rep, sizeof(r));
        ck_assert_uint_eq(r.n_done, 2);
        memcpy(&it, rep + sizeof(r), sizeof(it));
        ck_assert_int_eq(it.status, TERN_EWRONGNODE);
        ck_assert_uint_eq(it.vlen, 0);
        memcpy(&it, rep + sizeof(r) + kv_item_size(0, 0), sizeof(it));
        ck_assert_int_eq(it.status, 0);
        ck_assert_uint_eq(it.vlen, 3);   /* "odd" from round 19 */
        ck_assert(memcmp(rep + sizeof(r) + kv_item_size(0, 0) + sizeof(it), "odd", 3) == 0);
        ck_assert_uint_eq(got, sizeof(r) + kv_item_size(0, 0) + kv_item_size(0, 3));
    }
    /* And a session opened after all that. */
    s2 = test_kv_session(ep, 0);
    raw_put_get(s2, in, kin, "second session");
    raw_put_get(s, in, kin, "first session");

    /* Limits through the library: a 1025-byte key stops in the client; a
     * value over what a 64 KiB segment holds is refused by the server's
     * store (E2BIG); one over max_msg (1 MiB) never leaves the client
     * (EMSGSIZE from tern_callv). */
    kv = test_kv_client(ep, 2, NULL);
    memset(huge, 'k', 1025);
    rc = tern_kv_put(kv, huge, 1025, "v", 1, NULL);
    ck_assert_msg(rc == TERN_E2BIG, "1025-byte key put: %s", tern_err_name(rc));
    rc = tern_kv_get(kv, huge, 1025, rep, sizeof(rep), &got, NULL);
    ck_assert_msg(rc == TERN_E2BIG, "1025-byte key get: %s", tern_err_name(rc));
    rc = tern_kv_del(kv, huge, 1025);
    ck_assert_msg(rc == TERN_E2BIG, "1025-byte key del: %s", tern_err_name(rc));
    kv_must_put(kv, huge, 1024, "v", 1, NULL);     /* the longest key is fine */
    kv_expect_get(kv, huge, 1024, "v", 1, 0);

    info = test_kv_info(s);
    ck_assert_uint_eq(info.key_max, 1024);
    ck_assert_uint_eq(info.range_lo, 0);
    ck_assert_uint_eq(info.range_hi, 0x7fffffff);
    ck_assert_uint_gt(info.val_max, 60 * KIB);
    ck_assert_uint_lt(info.val_max, 64 * KIB);
    /* val_max is for a 16-byte key: the boundary exactly (either server). */
    snprintf(in16, sizeof(in16), "sixteen-byte-key");
    test_pattern(huge, info.val_max + 1, 9);
    ck_assert_uint_eq(strlen(in16), 16);
    rc = tern_kv_put(kv, in16, 16, huge, info.val_max + 1, NULL);
    ck_assert_msg(rc == TERN_E2BIG, "value of val_max + 1: %s", tern_err_name(rc));
    kv_must_put(kv, in16, 16, huge, info.val_max, NULL);
    kv_expect_get(kv, in16, 16, huge, info.val_max, 0);
    rc = tern_kv_put(kv, "v64k", 4, huge, 64 * KIB, NULL);
    ck_assert_msg(rc == TERN_E2BIG, "64 KiB value in 64 KiB segments: %s", tern_err_name(rc));
    rc = tern_kv_put(kv, "v2m", 3, huge, sizeof(huge), NULL);
    ck_assert_msg(rc == TERN_EMSGSIZE, "2 MiB value over max_msg: %s", tern_err_name(rc));
    rc = tern_kv_get(kv, "v64k", 4, rep, sizeof(rep), &got, NULL);
    ck_assert_int_eq(rc, TERN_ENOENT);
    /* Empty keys, from the library. */
    ck_assert_int_eq(tern_kv_put(kv, "", 0, "v", 1, NULL), TERN_EINVAL);
    ck_assert_int_eq(tern_kv_get(kv, "", 0, rep, sizeof(rep), &got, NULL), TERN_EINVAL);
    raw_put_get(s, in, kin, "still here");
    raw_put_get(s2, in, kin, "and here");
    test_kv_end(ep, kv, 2);
}
END_TEST

/* ---- 7: a full pool over RPC ---- */

START_TEST(full_pool_over_rpc)
{
    enum { VLEN = 1000, MAXK = 400 };
    static uint8_t vals[MAXK][VLEN];
    static uint64_t vers[MAXK];
    char k[32];
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    unsigned n = 0, deleted = 0, added = 0;
    uint64_t count = 0;
    int rc = 0, kl;

    test_kv_start(0, &(struct test_kv_srv){.pool_size = 4 * 64 * KIB + 4096, .seg_size = 64 * KIB});
    ep = test_rpc_ep(NULL);
    kv = test_kv_client(ep, 1, NULL);
    tern_kv_set_timeout(kv, 2 * SEC);   /* a server stuck on a full pool fails fast */
    for (n = 0; n < MAXK; n++) {
        kl = snprintf(k, sizeof(k), "full-%u", n);
        test_pattern(vals[n], VLEN, n);
        rc = tern_kv_put(kv, k, (size_t)kl, vals[n], VLEN, &vers[n]);
        if (rc < 0)
            break;
    }
    ck_assert_msg(rc == TERN_ENOSPC, "after %u puts: %s", n, tern_err_name(rc));
    /* Four 64 KiB segments hold at most 4 * 63 records of 1 KiB; the pool
     * may keep segments in reserve (for tombstones and the cleaner), but
     * one segment's worth at least must have gone in. */
    ck_assert_msg(n >= 63 && n <= 4 * 63, "the pool took %u values of 1000 bytes", n);
    /* Still full; and the failed key is not there. */
    rc = tern_kv_put(kv, "one-more", 8, vals[0], VLEN, NULL);
    ck_assert_msg(rc == TERN_ENOSPC, "put into a full pool: %s", tern_err_name(rc));
    rc = tern_kv_get(kv, k, (size_t)kl, NULL, 0, NULL, NULL);
    ck_assert_msg(rc == TERN_ENOENT, "the refused key: %s", tern_err_name(rc));
    for (unsigned i = 0; i < n; i++) {
        kl = snprintf(k, sizeof(k), "full-%u", i);
        kv_expect_get(kv, k, (size_t)kl, vals[i], VLEN, vers[i]);
    }
    ck_assert_int_eq(tern_kv_count(kv, &count), 0);
    ck_assert_uint_eq(count, n);

    /* Delete every other key: cleaning takes the space back. */
    for (unsigned i = 0; i < n; i += 2) {
        kl = snprintf(k, sizeof(k), "full-%u", i);
        rc = tern_kv_del(kv, k, (size_t)kl);
        ck_assert_msg(rc == 0, "del %u of a full pool: %s", i, tern_err_name(rc));
        deleted++;
    }
    for (unsigned i = 0; i < n / 4; i++) {
        kl = snprintf(k, sizeof(k), "new-%u", i);
        rc = tern_kv_put(kv, k, (size_t)kl, vals[i], VLEN, NULL);
        ck_assert_msg(rc == 0, "put %u after deleting %u keys: %s", i, deleted,
                      tern_err_name(rc));
        added++;
    }
    for (unsigned i = 1; i < n; i += 2) {
        kl = snprintf(k, sizeof(k), "full-%u", i);
        kv_expect_get(kv, k, (size_t)kl, vals[i], VLEN, vers[i]);
    }
    for (unsigned i = 0; i < added; i++) {
        kl = snprintf(k, sizeof(k), "new-%u", i);
        kv_expect_get(kv, k, (size_t)kl, vals[i], VLEN, 0);
    }
    ck_assert_int_eq(tern_kv_count(kv, &count), 0);
    ck_assert_uint_eq(count, n - deleted + added);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 8: a restart on the same pool ---- */

START_TEST(durable_across_restart)
{
    enum { N = 500, GONE = 50 };
    static uint8_t vals[N][100];
    static uint64_t vers[N];
    char k[32];
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    uint64_t count = 0, v_after = 0, v_max = 0;
    int kl;

    test_kv_start(0, &(struct test_kv_srv){0});
    ep = test_rpc_ep(NULL);
    kv = test_kv_client(ep, 1, NULL);
    for (unsigned i = 0; i < N; i++) {
        kl = snprintf(k, sizeof(k), "durable-%u", i);
        test_pattern(vals[i], sizeof(vals[i]), i);
        kv_must_put(kv, k, (size_t)kl, vals[i], 1 + i % sizeof(vals[i]), &vers[i]);
    }
    /* Overwrite a fifth, and delete other keys, before the restart. */
    for (unsigned i = 0; i < N; i += 5) {
        kl = snprintf(k, sizeof(k), "durable-%u", i);
        test_pattern(vals[i], sizeof(vals[i]), i + 1000);
        kv_must_put(kv, k, (size_t)kl, vals[i], 1 + i % sizeof(vals[i]), &vers[i]);
    }
    for (unsigned i = 0; i < GONE; i++) {
        kl = snprintf(k, sizeof(k), "gone-%u", i);
        kv_must_put(kv, k, (size_t)kl, "x", 1, NULL);
        ck_assert_int_eq(tern_kv_del(kv, k, (size_t)kl), 0);
    }
    for (unsigned i = 0; i < N; i++)
        v_max = vers[i] > v_max ? vers[i] : v_max;
    tern_kv_close(kv);
    test_kv_finish(0);

    test_kv_start(0, &(struct test_kv_srv){0});     /* the same pool file */
    kv = test_kv_client(ep, 1, NULL);
    ck_assert_int_eq(tern_kv_count(kv, &count), 0);
    ck_assert_uint_eq(count, N);
    for (unsigned i = 0; i < N; i++) {
        kl = snprintf(k, sizeof(k), "durable-%u", i);
        kv_expect_get(kv, k, (size_t)kl, vals[i], 1 + i % sizeof(vals[i]), vers[i]);
    }
    for (unsigned i = 0; i < GONE; i++) {
        kl = snprintf(k, sizeof(k), "gone-%u", i);
        ck_assert_int_eq(tern_kv_get(kv, k, (size_t)kl, NULL, 0, NULL, NULL), TERN_ENOENT);
    }
    /* Versions keep growing after recovery. */
    kv_must_put(kv, "after", 5, "restart", 7, &v_after);
    ck_assert_uint_gt(v_after, v_max);
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- 9: a server killed mid-run ---- */

static unsigned dead_done, dead_bad;

static void dead_cb(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    int *runs = arg;

    (*runs)++;
    dead_done++;
    if (status > 0)
        dead_bad++;
}

START_TEST(server_killed_mid_run)
{
    enum { N = 64 };
    static int runs[N];
    static uint8_t val[512];
    static char keyb[N][16];
    struct test_kv_srv o = {.listen = test_fabric_listen(_i)};
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    double t0, el;
    size_t got;
    int rc;

    test_kv_start(0, &o);
    ep = test_rpc_ep(NULL);
    kv = test_kv_client(ep, 1, NULL);
    tern_kv_set_timeout(kv, 1 * SEC);
    kv_must_put(kv, "before", 6, "x", 1, NULL);

    /* Calls in flight when the server dies: each ends once, some way. */
    memset(runs, 0, sizeof(runs));
    dead_done = dead_bad = 0;
    for (int i = 0; i < N; i++) {
        snprintf(keyb[i], sizeof(keyb[i]), "dying-%d", i);
        rc = tern_kv_put_async(kv, keyb[i], strlen(keyb[i]), val, sizeof(val), dead_cb,
                               &runs[i]);
        ck_assert_int_eq(rc, 0);
    }
    tern_rpc_poll(ep);
    test_kv_kill(0);
    t0 = now_ms();
    while (dead_done < N) {
        ck_assert_msg(now_ms() - t0 < 5000, "%u of %d calls never ended", dead_done, N);
        tern_rpc_poll(ep);
    }
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(runs[i], 1);
    ck_assert_uint_eq(dead_bad, 0);

    /* The next sync calls fail, and fast. */
    t0 = now_ms();
    rc = tern_kv_get(kv, "before", 6, val, sizeof(val), &got, NULL);
    el = now_ms() - t0;
    ck_assert_msg(rc < 0 && rc != TERN_ENOENT, "get from a dead server: %s", tern_err_name(rc));
    ck_assert_msg(el < 2500, "get from a dead server took %.0f ms", el);
    t0 = now_ms();
    rc = tern_kv_put(kv, "after", 5, "y", 1, NULL);
    ck_assert_msg(rc < 0, "put to a dead server: %s", tern_err_name(rc));
    ck_assert_msg(now_ms() - t0 < 2500, "put to a dead server took %.0f ms", now_ms() - t0);
    {
        uint64_t count;

        rc = tern_kv_count(kv, &count);
        ck_assert_msg(rc < 0, "count from a dead server: %s", tern_err_name(rc));
    }
    tern_kv_close(kv);
    tern_rpc_close(ep);
    test_kv_cleanup();
}
END_TEST

Suite *suite_kv_procs(void)
{
    Suite *s = suite_create("kv_procs");
    TCase *tc = tcase_create("kv_procs");

    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, basic_ops_every_fabric, 0, test_fabric_count());
    tcase_add_test(tc, async_window_and_mget);
    tcase_add_test(tc, mget_larger_than_one_message);
    tcase_add_test(tc, scan_every_key);
    tcase_add_test(tc, two_servers_split_ranges);
    tcase_add_test(tc, bad_ranges_refused);
    tcase_add_test(tc, bad_input_keeps_serving);
    tcase_add_test(tc, full_pool_over_rpc);
    tcase_add_test(tc, durable_across_restart);
    tcase_add_loop_test(tc, server_killed_mid_run, 0, test_fabric_count());
    suite_add_tcase(s, tc);
    return s;
}

#endif /* TERN_HAVE_SERVICES */
