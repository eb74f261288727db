/* The kv_onesided suite's shared fixtures (kv_onesided_fixture.h). */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <string.h>

#include "kv_onesided_fixture.h"
#include "pm/pm.h"

/* ---- fabrics ---- */

bool fabric_is_fast(int i)
{
    return (test_fabric_caps(i) & TERN_TP_CAP_RMA_OFFLOAD) != 0;
}

bool one_peer_only(int fabric)
{
    return (test_fabric_caps(fabric) & TERN_TP_CAP_POINT_TO_POINT) != 0;
}

size_t server_rma_max(struct tern_rpc_ep *ep, int srv)
{
    struct tern_session *s = test_rpc_connect(ep, test_kv_uri(srv));
    size_t max = tern_session_rma_max(s);

    tern_rpc_disconnect(s);
    return max;
}

/* A one-sided read or push moves the record (header, key and value) in one
 * operation, and the client does not split it: a record longer than the
 * session's limit goes by RPC. 1 KiB covers the header and the test's keys. */
bool fits_onesided(size_t rma_max, size_t vlen)
{
    return vlen + 1 * KIB <= rma_max;
}

/* ---- servers and clients ---- */

void start_os_server(int i, int fabric, const struct test_kv_srv *o)
{
    struct test_kv_srv so = o ? *o : (struct test_kv_srv){0};

    so.listen = test_fabric_listen(fabric);
    so.onesided = true;
    test_kv_start(i, &so);
}

struct tern_kv *kv_open_path(struct tern_rpc_ep *ep, int n, enum tern_kv_path path)
{
    struct tern_kv *kv = test_kv_client(ep, n, NULL);
    int rc = tern_kv_set_path(kv, path);

    CHECK(rc == 0, "tern_kv_set_path %d: %s", (int)path, tern_err_name(rc));
    return kv;
}

struct tern_kv_onesided_stats os_stats(const struct tern_kv *kv)
{
    struct tern_kv_onesided_stats st;

    tern_kv_get_onesided_stats(kv, &st);
    return st;
}

/* The first PUTs go by RPC while the lease is asked for, and so does one
 * that does not fit the rest of a lease. */
void must_os_put(struct tern_kv *kv, struct tern_rpc_ep *ep, const void *key, size_t klen,
                 const void *val, size_t len, uint64_t *version)
{
    for (int tries = 0; tries < 20; tries++) {
        uint64_t before = os_stats(kv).puts;

        kv_must_put(kv, key, klen, val, len, version);
        if (os_stats(kv).puts > before)
            return;
        test_rpc_poll_for(ep, 2);
    }
    ck_abort_msg("no PUT of %.*s (%zu bytes) went one-sided in 20 tries", (int)klen,
                 (const char *)key, len);
}

void warm_get(struct tern_kv *kv, struct tern_rpc_ep *ep, const void *key, size_t klen)
{
    static uint8_t buf[128 * KIB];

    for (int tries = 0; tries < 50; tries++) {
        uint64_t before = os_stats(kv).gets_direct;
        size_t got;
        int rc = tern_kv_get(kv, key, klen, buf, sizeof(buf), &got, NULL);

        CHECK(rc == 0, "warm-up get: %s", tern_err_name(rc));
        if (os_stats(kv).gets_direct > before)
            return;
        test_rpc_poll_for(ep, 2);
    }
    ck_abort_msg("no GET of %.*s was answered one-sidedly", (int)klen, (const char *)key);
}

void expect_gets(const struct tern_kv_onesided_stats *a, const struct tern_kv_onesided_stats *b,
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

size_t first_not(const uint8_t *p, size_t n, uint8_t b)
{
    size_t i = 0;

    while (i < n && p[i] == b)
        i++;
    return i;
}

/* ---- records and leases ---- */

uint32_t put_record(uint8_t *dst, const void *key, uint16_t klen, const void *val,
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

struct kv_lease raw_lease(struct tern_session *s)
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

uint8_t *lease_ptr(struct tern_rpc_ep *ep, struct tern_session *s, const struct kv_lease *l,
                   uint32_t off, size_t len)
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

int lput(struct tern_session *s, uint32_t seg, uint32_t off, uint64_t intent,
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

#endif /* TERN_HAVE_SERVICES */
