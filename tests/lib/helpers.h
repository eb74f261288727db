/* The test harness every suite includes: the fabric matrix (fabrics.h),
 * processes and folders (procs.h), and here the conformance suite's rows,
 * event queues over tern_tp_poll, cheap checks, and deterministic bytes and
 * random numbers. RPC plumbing is in rpc_util.h, KV servers and clients in
 * kv_servers.h and kv_client.h. */
#ifndef TERN_TEST_HELPERS_H
#define TERN_TEST_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fabrics.h"
#include "procs.h"
#include "rpc.h"
#include "transport.h"

/* One row per fabric the conformance suite runs on. */
struct fabric_case {
    const char *fabric;
    const char *listen;     /* address to listen on (any free port/name) */
    const char *refused;    /* an address nobody listens on */
    const char *bad;        /* an address the fabric cannot parse */
};

extern const struct fabric_case fabric_cases[];
extern const int n_fabric_cases;

/* Open an endpoint with small buffers unless max_msg says otherwise. */
struct tern_tp_ep *tp_open(const char *fabric, size_t max_msg);

/* Next event of `ep`, polling up to `ms` milliseconds; false on timeout. */
bool tp_next(struct tern_tp_ep *ep, struct tern_tp_event *out, int ms);

/* Next event of `ep` while also making progress on `other` (its events are
 * queued for its own tp_next). */
bool tp_next2(struct tern_tp_ep *ep, struct tern_tp_ep *other, struct tern_tp_event *out,
              int ms);

/* A connected pair: `client` on `a`, `server` on `b`. */
struct tp_pair {
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *client, *server;
    char bound[128];        /* where b listens */
};

/* Listen on b, connect from a, wait for CONNECTED and ACCEPTED. */
void tp_pair_open(struct tp_pair *p, const struct fabric_case *fc, size_t max_msg);
/* The same with TERN_RDMA_MW set to mw_a for a's opening and mw_b for b's
 * ("" or NULL: unset), and unset afterwards. */
void tp_pair_open_with(struct tp_pair *p, const struct fabric_case *fc, size_t max_msg,
                       const char *mw_a, const char *mw_b);
void tp_pair_close(struct tp_pair *p);
/* The key with which the client reaches b's region `rmr`, asked on the
 * server's connection and carried to the client in a message on it, as
 * tern_tp_conn_mr_rkey says a key must travel. */
struct tern_tp_rkey tp_pair_rkey(struct tp_pair *p, struct tern_tp_mr *rmr);

/* Milliseconds since an arbitrary start. */
double now_ms(void);

/* Wall-clock time in Unix milliseconds: what the KV store judges key
 * deadlines by. */
uint64_t test_wall_ms(void);

/* An assertion that costs nothing while it holds: Check's own report each
 * passing check to the runner through a pipe, which loops of thousands of
 * checks cannot afford. */
#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond))                                                                         \
            ck_abort_msg(__VA_ARGS__);                                                       \
    } while (0)

/* Deterministic bytes of `seed`, zeros included. */
void test_pattern(uint8_t *p, size_t len, unsigned seed);

/* A deterministic stream of random numbers (xorshift), started by a seed. */
void test_rng_seed(uint64_t seed);
uint64_t test_rng(void);

#endif
