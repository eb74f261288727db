/* Shared test plumbing: fabrics to run the conformance suite on, event
 * queues over tern_tp_poll, and server processes for multi-process tests. */
#ifndef TERN_TEST_HELPERS_H
#define TERN_TEST_HELPERS_H

#include <stdbool.h>
#include <sys/types.h>

#include "rpc.h"
#include "transport.h"

/* One row per fabric the conformance suite runs on. */
struct fabric_case {
    const char *fabric;
    const char *listen;     /* address to listen on (any free port/name) */
    const char *refused;    /* an address nobody listens on */
    const char *bad;        /* an address the fabric cannot parse */
    bool key_errors_close;  /* a wrong remote key breaks the connection, as
                             * the NIC breaks its queue pair (rdma) */
};

extern const struct fabric_case fabric_cases[];
extern const int n_fabric_cases;

/* The address rdma tests listen on: TERN_TEST_RDMA_IP (an address of
 * the NIC's netdev, e.g. for soft-RoCE), else 127.0.0.1 (softverbs). */
const char *test_rdma_ip(void);

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
void tp_pair_close(struct tp_pair *p);

/* Fork a process that serves an RPC endpoint (cfg may be NULL) with the
 * services `setup` registers, listening on tcp://127.0.0.1:0. Its URI is
 * written to `uri`. */
pid_t spawn_rpc_server(void (*setup)(struct tern_rpc_ep *ep),
                       const struct tern_rpc_config *cfg, char *uri, size_t uri_len);

/* The same, listening on `listen_uri` (e.g. "shm://auto"). */
pid_t spawn_rpc_server_at(void (*setup)(struct tern_rpc_ep *ep),
                          const struct tern_rpc_config *cfg, const char *listen_uri,
                          char *uri, size_t uri_len);

/* SIGTERM the server and reap it; returns its exit status (-1 if killed). */
int stop_server(pid_t pid);

/* A fresh directory for a test's pool files, named after `name`: on tmpfs
 * (/dev/shm) when there is one, where a persist is a cheap msync, else in
 * /tmp. Written to buf (at least 64 bytes); returns buf. */
char *test_pool_dir(char *buf, size_t len, const char *name);

/* Milliseconds since an arbitrary start. */
double now_ms(void);

#endif
