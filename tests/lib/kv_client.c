#include <check.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"
#include "kv_client.h"
#include "kv_servers.h"
#include "kv_store.h"
#include "rpc_util.h"

#define SEC 1000000000ull

struct tern_kv *test_kv_client(struct tern_rpc_ep *ep, int n, const int *order)
{
    const char *u[TEST_KV_SERVERS];
    struct tern_kv *kv = NULL;
    int rc;

    ck_assert(n > 0 && n <= TEST_KV_SERVERS);
    for (int i = 0; i < n; i++)
        u[i] = test_kv_uri(order ? order[i] : i);
    rc = tern_kv_open(ep, u, (unsigned)n, 5 * SEC, &kv);
    CHECK(rc == 0, "tern_kv_open %s: %s", u[0], tern_err_name(rc));
    ck_assert_ptr_nonnull(kv);
    return kv;
}

void test_kv_end(struct tern_rpc_ep *ep, struct tern_kv *kv, int n_servers)
{
    if (kv)
        tern_kv_close(kv);
    tern_rpc_close(ep);
    for (int i = 0; i < n_servers; i++)
        test_kv_finish(i);
    test_kv_cleanup();
}

struct tern_session *test_kv_session(struct tern_rpc_ep *ep, int i)
{
    return test_rpc_connect(ep, test_kv_uri(i));
}

int test_kv_call(struct tern_session *s, uint16_t method, const void *req, size_t len,
                 void *rep, size_t cap, size_t *got)
{
    return tern_call_sync(s, TERN_KV_SERVICE_ID, method, req, len, rep, cap, got, 5 * SEC);
}

struct kv_info test_kv_info(struct tern_session *s)
{
    struct kv_info info;
    size_t got = 0;
    int rc = test_kv_call(s, KV_M_INFO, NULL, 0, &info, sizeof(info), &got);

    CHECK(rc == 0 && got == sizeof(info), "info: %s (%zu bytes)", tern_err_name(rc), got);
    return info;
}

uint32_t kv_top32(const void *key, size_t klen)
{
    return (uint32_t)(kv_hash(key, klen) >> 32);
}

void kv_key_in_range(char *key, size_t cap, size_t *klen, const char *prefix, uint32_t lo,
                     uint32_t hi)
{
    for (unsigned n = 0; n < 1000000; n++) {
        int k = snprintf(key, cap, "%s-%u", prefix, n);
        uint32_t t = kv_top32(key, (size_t)k);

        if (t >= lo && t <= hi) {
            *klen = (size_t)k;
            return;
        }
    }
    ck_abort_msg("no key in range");
}

void kv_expect_get(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                   size_t len, uint64_t version)
{
    static uint8_t buf[256 * 1024];
    size_t got = 12345;
    uint64_t ver = 0;
    int rc = tern_kv_get(kv, key, klen, buf, sizeof(buf), &got, &ver);

    CHECK(rc == 0, "get %.*s: %s", (int)klen, (const char *)key, tern_err_name(rc));
    CHECK(got == len, "get %.*s: %zu bytes, want %zu", (int)klen, (const char *)key, got,
          len);
    if (len)
        CHECK(memcmp(buf, val, len) == 0, "value of %.*s differs", (int)klen,
              (const char *)key);
    if (version)
        CHECK(ver == version, "get %.*s: version %llu, want %llu", (int)klen,
              (const char *)key, (unsigned long long)ver, (unsigned long long)version);
}

void kv_expect_enoent(struct tern_kv *kv, const void *key, size_t klen)
{
    uint8_t buf[64];
    size_t got = 0;
    int rc = tern_kv_get(kv, key, klen, buf, sizeof(buf), &got, NULL);

    CHECK(rc == TERN_ENOENT, "get %.*s: %s, want TERN_ENOENT", (int)klen,
          (const char *)key, tern_err_name(rc));
}

void kv_must_put(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                 size_t len, uint64_t *version)
{
    int rc = tern_kv_put(kv, key, klen, val, len, version);

    CHECK(rc == 0, "put %.*s (%zu bytes): %s", (int)klen, (const char *)key, len,
          tern_err_name(rc));
}
