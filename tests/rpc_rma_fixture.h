/* The rpc suite's fixtures for one-sided access through sessions (the
 * "rma" case): a second service on the servers of these tests that hands
 * out keys to its regions, reads, fills and deregisters them on request,
 * and pushes data into the caller's memory. Tests look at the server's
 * memory through it, so they run the same against a server in this
 * process (rma_pair_open) or in a child (rma_proc_open).
 */
#ifndef TERN_TEST_RPC_RMA_FIXTURE_H
#define TERN_TEST_RPC_RMA_FIXTURE_H

#include "rpc_fixture.h"

#define RSVC 8
#define SRV_MR_LEN (64u * 1024)

enum {
    R_KEY = 0,      /* struct rreq (region); reply: its tern_tp_rkey */
    R_PUSH = 1,     /* struct push_req; puts, then replies at once (empty) */
    R_DROP = 2,     /* replies, but the reply is lost with the session */
    R_READ = 3,     /* struct rreq; reply: the region's bytes */
    R_FILL = 4,     /* struct rreq; fills the bytes with rma_fill(seed) */
    R_DEREG = 5,    /* struct rreq (region) */
    R_PUSHED = 6,   /* reply: int32_t completions of R_PUSH's puts, last status */
};

struct rreq {
    uint32_t region;
    uint32_t len;
    uint64_t off;
    uint32_t seed;
    uint32_t pad;
};

struct push_req {
    struct tern_tp_rkey rk;     /* the caller's region */
    uint64_t roff;
    uint32_t len;
    uint8_t byte;               /* the server's region 0 is filled with it first */
    uint8_t drop;               /* then lose the session (rpc_test_drop) */
};

/* The server's regions, allocated before it listens anywhere (so that
 * they are on no fabric yet), and its puts' completions. */
extern struct tern_rpc_mr *srv_mrs[2];
extern int push_runs, push_status;

/* With push_again, the completion of R_PUSH's put tries another put on its
 * session; that one's result. */
extern bool push_again;
extern int push_again_rc;

/* A status for a message: "0" or the code's name. */
const char *status_name(int status);

/* The bytes R_FILL writes. */
void rma_fill(void *p, size_t len, unsigned seed);

/* Both services and the two regions on a server endpoint. */
int rma_setup_ep(struct tern_rpc_ep *ep);

/* The loop tests run over every row of the fabric matrix (fabrics.h); the
 * in-process ones (rma_pair_open) on tcp's row. */
#define FAB_TCP test_fabric_row("tcp")

/* The server in this process (srv), with a listener on `fab` and a client
 * session to it; its regions are registered before the listener. */
void rma_pair_open(int fab, const struct tern_rpc_config *ccfg);
void rma_pair_close(void);

/* The server in a child process (procs.h). The loop tests use one: rdma
 * endpoints of one process share the emulated NIC's context, whose
 * progress is not safe from two threads at once, and tern_rpc_connect
 * needs the server polled while it waits. false (with a log line) if the
 * fabric is not built in. */
bool rma_proc_open(int fab);
void rma_proc_close(void);

/* What a one-sided completion saw. */
struct rma_rec {
    int runs;
    int status;
};

void rma_cb(void *arg, int status);

/* A call of the rma service on `s` that completes with `want`; the reply
 * is copied to out (cap bytes at most) and its length returned. */
size_t call_expect(struct tern_session *s, uint16_t method, const void *req, size_t len,
                   int want, void *out, size_t cap);

/* The key of server region `i` for session `s` (asked over `s`). */
struct tern_tp_rkey srv_key(struct tern_session *s, uint32_t i);

/* Server region `i`'s bytes at [off, off+len) must equal `want`. */
void srv_expect(struct tern_session *s, uint32_t i, uint64_t off, uint32_t len,
                const void *want, const char *what);

/* Have the server fill region `i` at [off, off+len) with rma_fill(seed). */
void srv_fill(struct tern_session *s, uint32_t i, uint64_t off, uint32_t len, unsigned seed);

/* Start a put or get, polling while the fabric says EAGAIN (shm turns a
 * key direct after its first use, and waits for served ones first). */
int rma_start_retry(struct tern_session *s, bool put, struct tern_rpc_mr *lmr, size_t loff,
                    size_t len, const struct tern_tp_rkey *rk, uint64_t roff,
                    struct rma_rec *r);

/* A put or get that must complete, once, with `want`. */
void rma_expect(struct tern_session *s, bool put, struct tern_rpc_mr *lmr, size_t loff,
                size_t len, const struct tern_tp_rkey *rk, uint64_t roff, int want);

/* The server puts `len` bytes of `byte` into the client's `cmr` at `off`
 * from a handler and replies at once: the data is there when the reply
 * is. Its put then completes without error. */
void expect_push(struct tern_session *s, struct tern_rpc_mr *cmr, size_t off, size_t len,
                 uint8_t byte);

#endif
