/* kv_onesided: GETs by server push (TERN_KV_PATH_PUSH, case kv_push) on
 * every fabric: values of every size by push or inline, more GETs in flight
 * than staging slots, overwrites; and GETs that fall back to RPC when no
 * call can be sent (case kv_fallback).
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <stdio.h>
#include <string.h>

#include "kv_onesided_fixture.h"

/* ---- GET by server push (TERN_KV_PATH_PUSH) ---- */

/* Does a GET of a value this long come by push? The client offers a
 * staging slot of 64 KiB + 256 bytes (kv_client_path.c STAGE_SLOT): a
 * record that does not fit comes inline in the reply. A record longer than
 * the session's one-sided limit (tern_session_rma_max: on ntb one ring
 * record, ~16 KiB) cannot be put by the server (TERN_EMSGSIZE), so its value
 * comes inline as well. The sizes tested stay clear of both edges: 8 B and
 * 1 KiB are pushed everywhere, 56 KiB where the limit allows, and 100 KiB
 * nowhere. */
static bool push_fits(size_t rma_max, size_t vlen)
{
    return vlen <= 56 * KIB && fits_onesided(rma_max, vlen);
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
    size_t rma_max;
    char k[32];
    int kl;

    /* 256 KiB segments: the store takes values bigger than a staging slot. */
    start_os_server(0, _i, &(struct test_kv_srv){.seg_size = 256 * KIB});
    ep = test_rpc_ep(NULL);
    test_rpc_assert_fabric(ep, test_kv_uri(0), _i);
    push = kv_open_path(ep, 1, TERN_KV_PATH_PUSH);
    rpc = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    rma_max = server_rma_max(ep, 0);

    for (unsigned s = 0; s < NS; s++) {
        bool fits = push_fits(rma_max, sizes[s]);

        test_pattern(val[s], sizes[s], (unsigned)s + 1);
        /* Written by RPC, read by push (or inline, if it does not fit). */
        kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[s]);
        kv_must_put(rpc, k, (size_t)kl, val[s], sizes[s], &v_rpc[s]);
        st0 = os_stats(push);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
        st1 = os_stats(push);
        expect_gets(&st0, &st1, fits, !fits, k);
        /* Written by the push client (its PUTs go as TERN_KV_PATH_ONESIDED
         * does: into a lease where they fit one), read by both. */
        kl = snprintf(k, sizeof(k), "push2rpc-%zu", sizes[s]);
        if (fits && fits_onesided(rma_max, sizes[s]))
            must_os_put(push, ep, k, (size_t)kl, val[s], sizes[s], &v_push[s]);
        else
            kv_must_put(push, k, (size_t)kl, val[s], sizes[s], &v_push[s]);
        ck_assert_uint_gt(v_push[s], v_rpc[s]);
        kv_expect_get(rpc, k, (size_t)kl, val[s], sizes[s], v_push[s]);
        st0 = os_stats(push);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_push[s]);
        st1 = os_stats(push);
        expect_gets(&st0, &st1, fits, !fits, k);
        want += fits ? 2 : 0;
    }
    ck_assert_uint_gt(os_stats(push).puts, 0);
    /* Everything again, in the other order. */
    st0 = os_stats(push);
    for (unsigned s = NS; s-- > 0;) {
        kl = snprintf(k, sizeof(k), "push2rpc-%zu", sizes[s]);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_push[s]);
        kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[s]);
        kv_expect_get(push, k, (size_t)kl, val[s], sizes[s], v_rpc[s]);
    }
    st1 = os_stats(push);
    expect_gets(&st0, &st1, want, 2 * NS - want, "second round");
    /* Big values, over and over: 100 KiB inline, 56 KiB pushed, or inline
     * on ntb after a put that could not be posted. More of those than the
     * server has push slots and pins: whatever it held for them, it let
     * go, or the small GET after them would come inline. */
    st0 = os_stats(push);
    for (unsigned r = 0; r < 140; r++) {
        kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[NS - 1 - r % 2]);
        kv_expect_get(push, k, (size_t)kl, val[NS - 1 - r % 2], sizes[NS - 1 - r % 2],
                   v_rpc[NS - 1 - r % 2]);
    }
    kl = snprintf(k, sizeof(k), "rpc2push-%zu", sizes[1]);
    kv_expect_get(push, k, (size_t)kl, val[1], sizes[1], v_rpc[1]);
    st1 = os_stats(push);
    CHECK(st1.gets_pushed - st0.gets_pushed == 1 + (push_fits(rma_max, sizes[NS - 2]) ? 70 : 0),
          "%llu of 141 GETs pushed", (unsigned long long)(st1.gets_pushed - st0.gets_pushed));

    /* More GETs in flight than staging slots (32): the rest go by RPC, all
     * complete with the right value, and every slot comes back. */
    pa = (struct push_async){.want = val[1], .len = sizes[1], .version = v_rpc[1]};
    st0 = os_stats(push);
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
    st1 = os_stats(push);
    CHECK(st1.gets_pushed > st0.gets_pushed &&
              st1.gets_pushed - st0.gets_pushed + st1.gets_rpc - st0.gets_rpc == N_ASYNC,
          "%llu pushed and %llu by RPC of %u", (unsigned long long)(st1.gets_pushed - st0.gets_pushed),
          (unsigned long long)(st1.gets_rpc - st0.gets_rpc), N_ASYNC);
    st0 = os_stats(push);
    for (unsigned i = 0; i < 40; i++)
        kv_expect_get(push, k, (size_t)kl, val[1], sizes[1], v_rpc[1]);
    st1 = os_stats(push);
    expect_gets(&st0, &st1, 40, 0, "40 GETs after the burst");

    /* Too small a buffer: TERN_EMSGSIZE with the size needed. */
    {
        size_t got = 0;
        int rc = tern_kv_get(push, k, (size_t)kl, small, sizeof(small), &got, NULL);

        CHECK(rc == TERN_EMSGSIZE && got == sizes[1], "get into 64 bytes: %s, %zu",
              tern_err_name(rc), got);
    }

    /* Absent and deleted keys: TERN_ENOENT from the server, nothing pushed. */
    st0 = os_stats(push);
    kv_expect_enoent(push, "never-written", 13);
    kv_must_put(rpc, "doomed", 6, "soon gone", 9, &v1);
    kv_expect_get(push, "doomed", 6, "soon gone", 9, v1);
    ck_assert_int_eq(tern_kv_del(push, "doomed", 6), 0);
    kv_expect_enoent(push, "doomed", 6);
    kv_expect_enoent(rpc, "doomed", 6);
    st1 = os_stats(push);
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
        st0 = os_stats(push);
        kv_expect_get(push, "over", 4, val[0], len, v2);
        st1 = os_stats(push);
        expect_gets(&st0, &st1, 1, 0, "overwritten key");
    }
    tern_kv_close(rpc);
    test_kv_end(ep, push, 1);
}
END_TEST

/* ---- GETs that fall back to RPC when no call can be sent ---- */

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

void kv_os_add_push(const struct kv_os_cases *c)
{
    tcase_add_loop_test(c->push, push_roundtrip_every_fabric, 0, test_fabric_count());
    tcase_add_test(c->fallback, fallback_without_call_slots);
}

#endif /* TERN_HAVE_SERVICES */
