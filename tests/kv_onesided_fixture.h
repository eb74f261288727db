/* The kv_onesided suite's shared fixtures: what its fabrics can do, its
 * servers (one-sided paths on) and clients, leases on raw sessions, and the
 * suite's cases, which several files fill (test_kv_onesided.c assembles
 * the suite). */
#ifndef TERN_TEST_KV_ONESIDED_FIXTURE_H
#define TERN_TEST_KV_ONESIDED_FIXTURE_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "helpers.h"
#include "kv.h"
#include "kv_client.h"
#include "kv_servers.h"
#include "kv_wire.h"
#include "rpc.h"
#include "rpc_util.h"

#define SEC 1000000000ull
#define KIB 1024u
#define SVC TERN_KV_SERVICE_ID
#define INTENT_BIT (1ull << 63)

/* A call's result must be `want`. */
#define EXPECT_RC(call, want, what)                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        CHECK(rc_ == (want), "%s: %s, want %s", what, tern_err_name(rc_),                    \
              tern_err_name(want));                                                          \
    } while (0)

/* ---- fabrics (tests/lib/fabrics.h) ---- */

/* Does one-sided access cost the server nothing on row i (the NIC, or
 * plain loads and stores, do the work)? Where TERN_KV_PATH_AUTO goes
 * one-sided. */
bool fabric_is_fast(int i);

/* Does row i link one peer endpoint at a time? Then a test's writers are
 * clients on the test's own endpoint, driven by its polls (the server
 * still interleaves their PUTs with the reader's served reads); elsewhere
 * they are processes of their own. */
bool one_peer_only(int fabric);

/* The longest one-sided operation a session with server `srv` carries
 * (tern_session_rma_max): on a ring fabric one ring record. */
size_t server_rma_max(struct tern_rpc_ep *ep, int srv);

/* Can a record with this much value go one-sided within `rma_max`? */
bool fits_onesided(size_t rma_max, size_t vlen);

/* ---- servers (tests/lib/kv_servers.h) and clients ---- */

/* Start server i on fabric row `fabric` with the one-sided paths on, and
 * the rest as `o` says (NULL: the defaults). */
void start_os_server(int i, int fabric, const struct test_kv_srv *o);

/* A client of servers 0..n-1 on `path`. */
struct tern_kv *kv_open_path(struct tern_rpc_ep *ep, int n, enum tern_kv_path path);

/* The client's one-sided counters now. */
struct tern_kv_onesided_stats os_stats(const struct tern_kv *kv);

/* PUT until one goes through a leased segment; *version is the last PUT's. */
void must_os_put(struct tern_kv *kv, struct tern_rpc_ep *ep, const void *key, size_t klen,
                 const void *val, size_t len, uint64_t *version);

/* GET until one is answered from the window and the pool. */
void warm_get(struct tern_kv *kv, struct tern_rpc_ep *ep, const void *key, size_t klen);

/* What one GET (or a batch of them) did to a client's counters, from a to
 * b: `pushed` by push, `rpc` by RPC or inline, none direct, none torn. */
void expect_gets(const struct tern_kv_onesided_stats *a, const struct tern_kv_onesided_stats *b,
                 uint64_t pushed, uint64_t rpc, const char *what);

/* Index of the first of n bytes that is not b (n if none). */
size_t first_not(const uint8_t *p, size_t n, uint8_t b);

/* ---- records and leases on raw sessions ---- */

/* Lay a record out as a client does: header (version = `intent`), key,
 * value, zero padding, and the sum over all of it (the lessee's job).
 * Returns its size. */
uint32_t put_record(uint8_t *dst, const void *key, uint16_t klen, const void *val,
                    uint32_t vlen, uint64_t intent, uint8_t type);

/* KV_M_LEASE on a raw session; it must be granted. */
struct kv_lease raw_lease(struct tern_session *s);

/* Where the lessee writes at offset `off` of its segment (shm: a store). */
uint8_t *lease_ptr(struct tern_rpc_ep *ep, struct tern_session *s, const struct kv_lease *l,
                   uint32_t off, size_t len);

/* KV_M_LPUT of the record at seg/off with `intent`; its version to
 * *version (may be NULL). */
int lput(struct tern_session *s, uint32_t seg, uint32_t off, uint64_t intent,
         uint64_t *version);

/* ---- the suite's cases, filled by the files of the suite ---- */

struct kv_os_cases {
    TCase *os;                       /* "kv_onesided" */
    TCase *push;                     /* "kv_push": GET by server push */
    TCase *fallback;                 /* "kv_fallback" */
    TCase *pool_lock;                /* "kv_pool_lock": the pool's lock and lessees on shm */
};

void kv_os_add_paths(const struct kv_os_cases *c);       /* test_kv_onesided.c */
void kv_os_add_races(const struct kv_os_cases *c);       /* test_kv_os_races.c */
void kv_os_add_liars(const struct kv_os_cases *c);       /* test_kv_os_liars.c */
void kv_os_add_leases(const struct kv_os_cases *c);      /* test_kv_os_leases.c */
void kv_os_add_hostile(const struct kv_os_cases *c);     /* test_kv_os_hostile.c */
void kv_os_add_window(const struct kv_os_cases *c);      /* test_kv_os_window.c */
void kv_os_add_push(const struct kv_os_cases *c);        /* test_kv_os_push.c */
void kv_os_add_pool_lock(const struct kv_os_cases *c);   /* test_kv_os_pool_lock.c */

#endif
