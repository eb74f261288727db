/* The client side of KV tests against the servers of kv_servers.h: a
 * client of the first n of them, raw sessions and calls of the KV service
 * (kv_wire.h), keys of a hash range, and assertions on what a client gets
 * back. */
#ifndef TERN_TEST_KV_CLIENT_H
#define TERN_TEST_KV_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "kv_wire.h"
#include "rpc.h"

/* A client of servers order[0..n-1] (NULL: 0..n-1); it must open. */
struct tern_kv *test_kv_client(struct tern_rpc_ep *ep, int n, const int *order);

/* Close the client (if any) and the endpoint, SIGTERM servers 0..n-1 (each
 * must exit cleanly) and remove the pools: the end of a test. */
void test_kv_end(struct tern_rpc_ep *ep, struct tern_kv *kv, int n_servers);

/* A session of its own to server i; it must connect. */
struct tern_session *test_kv_session(struct tern_rpc_ep *ep, int i);

/* A call of the KV service's `method` on a raw session (5 s). */
int test_kv_call(struct tern_session *s, uint16_t method, const void *req, size_t len,
                 void *rep, size_t cap, size_t *got);

/* KV_M_INFO on a raw session; the call must succeed. */
struct kv_info test_kv_info(struct tern_session *s);

/* The top 32 bits of a key's hash: what the servers' ranges split. */
uint32_t kv_top32(const void *key, size_t klen);

/* A key "<prefix>-<n>" whose top32 falls in [lo, hi]; *klen set. */
void kv_key_in_range(char *key, size_t cap, size_t *klen, const char *prefix, uint32_t lo,
                     uint32_t hi);

/* A GET of key must give len bytes of val (and `version`, if not 0). */
void kv_expect_get(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                   size_t len, uint64_t version);

/* A GET of key must give TERN_ENOENT. */
void kv_expect_enoent(struct tern_kv *kv, const void *key, size_t klen);

/* A PUT must succeed; its version to *version (may be NULL). */
void kv_must_put(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                 size_t len, uint64_t *version);

#endif
