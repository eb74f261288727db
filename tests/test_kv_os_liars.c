/* kv_onesided: a fake KV server that lies. It publishes a window and a
 * pool made by hand, one key per kind of damage (odd sequence, wrong sums,
 * versions, keys, sizes), and pushes records of its own making with
 * replies that lie about them; the client must trust none of it and ask
 * by RPC, on every fabric.
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kv_onesided_fixture.h"
#include "kv_store.h"
#include "kv_window.h"
#include "pm/pm.h"

/* A window that lies. The torn-read tests (test_kv_os_races.c) catch a
 * reader that trusts torn data only when a race happens to strike; here a
 * fake server publishes a window and a pool made by hand, one key per kind
 * of damage, and answers GETs by RPC with a value of its own: whatever the
 * reader must not trust shows as a value that did not come from the RPC.
 * Deterministic, on every fabric (mapped reads on shm, staged reads
 * elsewhere). */

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
            st0 = os_stats(kv);
            kv_expect_get(kv, key, kl, want, wl, k == F_GOOD ? 100 : FAKE_RPC_VERSION);
            st1 = os_stats(kv);
            CHECK((st1.gets_direct - st0.gets_direct == 1) == (k == F_GOOD),
                  "%s: %llu one-sided answers", fake_what[k],
                  (unsigned long long)(st1.gets_direct - st0.gets_direct));
        }
    test_kv_end(ep, kv, 1);
}
END_TEST

/* ---- a server that lies about what it pushed ---- */

/* The fake server (above) answers KV_M_PGET for keys "plie-<k>": it
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
            st0 = os_stats(kv);
            kv_expect_get(kv, key, kl, want, wl, honest ? LIE_VERSION : FAKE_RPC_VERSION);
            st1 = os_stats(kv);
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

        st0 = os_stats(kv);
        tern_kv_set_timeout(kv, 100 * 1000000ull);
        rc = tern_kv_get(kv, "plie-slow", 9, buf, sizeof(buf), &got, NULL);
        CHECK(rc == TERN_ETIMEDOUT, "slow push: %s", rc ? tern_err_name(rc) : "success");
        tern_kv_set_timeout(kv, 5 * SEC);
        test_rpc_poll_for(ep, 400);
        st1 = os_stats(kv);
        CHECK(st1.stage_lost == st0.stage_lost + 1, "%llu slots retired",
              (unsigned long long)(st1.stage_lost - st0.stage_lost));
        for (unsigned i = 0; i < 40; i++)
            kv_expect_get(kv, key, kl, want, wl, LIE_VERSION);
        st0 = os_stats(kv);
        expect_gets(&st1, &st0, 40, 0, "GETs after a slot was retired");
    }
    munmap(lie_pgets, L_N * sizeof(*lie_pgets));
    test_kv_end(ep, kv, 1);
}
END_TEST

void kv_os_add_liars(const struct kv_os_cases *c)
{
    tcase_add_loop_test(c->os, lying_window_never_trusted, 0, test_fabric_count());
    tcase_add_loop_test(c->push, lying_push_never_trusted, 0, test_fabric_count());
}

#endif /* TERN_HAVE_SERVICES */
