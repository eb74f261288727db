/* The rpc suite's shared fixtures: the test service, the in-process
 * server/client pair that the tests poll themselves, continuations that
 * record what they saw, and a fake server played at the transport level;
 * and the suite's cases, which several files fill (test_rpc.c assembles
 * the suite).
 *
 * tern_call_sync() polls only the client's endpoint, so it cannot be used
 * with the pair: calls are started with tern_call() and the test polls both
 * endpoints until the continuation has run. tern_rpc_connect() also waits
 * for the handshake polling only the client, so while it runs a helper
 * thread polls the server (the server endpoint is handed back to the test
 * thread once that thread is joined).
 */
#ifndef TERN_TEST_RPC_FIXTURE_H
#define TERN_TEST_RPC_FIXTURE_H

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "helpers.h"
#include "rpc.h"
#include "rpc_util.h"
#include "transport.h"

#define SVC 7
#define MAX_MSG (64u * 1024)
#define WAIT_MS 5000
#define SEC 1000000000ull

/* ---- the test service ---- */

enum {
    M_ECHO = 0,         /* reply = request */
    M_ENOENT = 1,       /* fails with TERN_ENOENT */
    M_POSITIVE = 2,     /* returns 5, which is not a tern code */
    M_ALLOC_FAIL = 3,   /* reserves a reply, then fails with TERN_EIO */
    M_SHRINK = 4,       /* reserves 100 bytes, sends 10 */
    M_DEADLINE = 5,     /* reply = tern_req_deadline() as a uint64_t */
    M_BIG = 6,          /* reply of the size asked for (uint32_t request) */
    /* 7 and 8 are a hole in the table */
    M_IDS = 9,          /* reply = service and method ids seen by the handler */
    M_ALLOC_TWICE = 10, /* a second tern_reply_alloc must fail */
    M_EMPTY = 11,       /* returns 0 without building a reply */
};

extern const struct tern_service test_service;     /* SVC, the methods above */

/* Handler runs, to tell "the server never ran it" from "it ran". */
extern int server_runs;

/* M_ECHO's and M_ENOENT's handlers, for services of a test's own. */
int h_echo(struct tern_req *req, const void *data, size_t len, void *ctx);
int h_enoent(struct tern_req *req, const void *data, size_t len, void *ctx);

/* ---- the in-process pair ---- */

extern struct tern_rpc_ep *srv, *cli;
extern struct tern_session *sess;
extern char uri[128];                   /* where srv listens */

/* A second client endpoint some tests poll too (NULL: none). */
extern struct tern_rpc_ep *cli2;

/* tern_rpc_connect with the server endpoint (srv) served meanwhile. */
int connect_inproc_timeout(struct tern_rpc_ep *ep, const char *to, uint64_t timeout_ns,
                           struct tern_session **out);
int connect_inproc(struct tern_rpc_ep *ep, const char *to, struct tern_session **out);

/* Server with the test service listening on loopback; a client endpoint;
 * a session between them. NULL configs mean max_msg = MAX_MSG. */
void pair_open(const struct tern_rpc_config *scfg, const struct tern_rpc_config *ccfg);

/* Close cli2, cli and srv (those open). */
void pair_close(void);

/* The default pair: the checked fixture of the cases that share it. */
void setup_default(void);

/* ---- calls ---- */

/* What a continuation saw. */
struct rec {
    int runs;
    int status;
    bool reply_null;
    size_t len;
    uint8_t *buf;       /* a copy of the reply (cap bytes at most) */
    size_t cap;
};

extern int total_runs;  /* continuations run, all calls together */

/* A continuation that records into the struct rec it is given. */
void rec_cont(void *arg, int status, const void *reply, size_t len);
void rec_init(struct rec *r, size_t cap);

/* Poll the test's endpoints, cli, srv and cli2 (those open): once, until
 * *counter reaches want (false on timeout), or for `ms` milliseconds. */
void poll_eps(void);
bool poll_until(const int *counter, int want, int ms);
void poll_for(int ms);

/* Call and wait for the continuation; the result lands in r. */
void call_wait(uint16_t svc, uint16_t method, const void *req, size_t len,
               uint64_t timeout_ns, struct rec *r);

/* An error reply: the status, and no payload. */
void expect_error(uint16_t svc, uint16_t method, int want);

/* An echo call of `len` bytes must come back intact. */
void expect_echo(size_t len);

/* ---- a server played at the transport level (tcp, its own thread) ---- */

/* How the fake server answers HELLO, then requests. */
enum fake_mode {
    /* tern_rpc_connect must fail */
    F_ACK_BAD_MAGIC, F_ACK_ZERO_CREDITS, F_ACK_ZERO_MAX_MSG, F_ACK_SHORT, F_RESP_FIRST,
    F_HANGUP, F_SILENT,
    /* the handshake works; the reply to the first request is bad */
    F_REQ_POSITIVE_STATUS, F_REQ_SHORT, F_REQ_SECOND_ACK,
    /* the handshake works; odd but legal replies */
    F_REQ_UNKNOWN_ID_FIRST, F_REQ_ERROR_WITH_BODY,
    /* only the RPC version differs */
    F_ACK_VERSION,
};

struct fake {
    enum fake_mode mode;
    struct tern_tp_ep *tp;
    char uri[128];
    atomic_bool stop;
    pthread_t th;
};

/* Listen on loopback (f->uri) and answer as `mode` says, until fake_stop. */
void fake_start(struct fake *f, enum fake_mode mode);
void fake_stop(struct fake *f);

/* ---- the suite's cases, filled by the files of the suite ---- */

struct rpc_cases {
    TCase *basic;       /* tests that share the default pair (setup_default) */
    TCase *own;         /* tests that build their own pair */
    TCase *rma;         /* one-sided access through sessions */
    TCase *bad;         /* bad clients of the default pair */
};

void rpc_add_basics(const struct rpc_cases *c);     /* test_rpc.c */
void rpc_add_calls(const struct rpc_cases *c);      /* test_rpc_calls.c */
void rpc_add_cancel(const struct rpc_cases *c);     /* test_rpc_cancel.c */
void rpc_add_wait(const struct rpc_cases *c);       /* test_rpc_wait.c */
void rpc_add_hostile(const struct rpc_cases *c);    /* test_rpc_hostile.c */
void rpc_add_rma(const struct rpc_cases *c);        /* test_rpc_rma.c */
void rpc_add_rma_faults(const struct rpc_cases *c); /* test_rpc_rma_faults.c */

#endif
