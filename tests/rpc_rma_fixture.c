/* The rpc suite's fixtures for one-sided access (rpc_rma_fixture.h). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <inttypes.h>

#include "rpc_internal.h"
#include "rpc_rma_fixture.h"

struct tern_rpc_mr *srv_mrs[2];
int push_runs, push_status;

const char *status_name(int status)
{
    return status ? tern_err_name(status) : "0";
}

void rma_fill(void *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        ((uint8_t *)p)[i] = (uint8_t)(seed * 37 + i * 13 + (i >> 8));
}

bool push_again;
int push_again_rc;
static struct tern_session *push_sess;
static struct push_req push_last;

static void push_done(void *arg, int status)
{
    push_runs++;
    push_status = status;
    if (push_again)
        push_again_rc = tern_session_put(push_sess, srv_mrs[0], 0, push_last.len, &push_last.rk,
                                         push_last.roff, NULL, NULL);
}

/* The request's region and range, or NULL. */
static uint8_t *rreq_at(const void *data, size_t len, struct rreq *q)
{
    if (len != sizeof(*q))
        return NULL;
    memcpy(q, data, sizeof(*q));
    if (q->region >= 2 || !srv_mrs[q->region] || q->off > SRV_MR_LEN ||
        q->len > SRV_MR_LEN - q->off)
        return NULL;
    return (uint8_t *)tern_rpc_mr_addr(srv_mrs[q->region]) + q->off;
}

static int r_key(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_tp_rkey rk, *out;
    struct rreq q;
    int rc;

    if (!rreq_at(data, len, &q))
        return TERN_EINVAL;
    rc = tern_rpc_mr_rkey(srv_mrs[q.region], tern_req_session(req), &rk);
    if (rc < 0)
        return rc;
    out = tern_reply_alloc(req, sizeof(rk));
    if (!out)
        return TERN_ENOMEM;
    memcpy(out, &rk, sizeof(rk));
    return 0;
}

/* Put first: tcp and shm refuse a put (EAGAIN) while a reply is being
 * built in the send buffer. The reply goes without waiting for the put. */
static int r_push(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct push_req p;
    int rc;

    if (len != sizeof(p) || !srv_mrs[0])
        return TERN_EINVAL;
    memcpy(&p, data, sizeof(p));
    if (p.len > SRV_MR_LEN)
        return TERN_EINVAL;
    memset(tern_rpc_mr_addr(srv_mrs[0]), p.byte, p.len);
    push_sess = tern_req_session(req);
    push_last = p;
    rc = tern_session_put(push_sess, srv_mrs[0], 0, p.len, &p.rk, p.roff, push_done, NULL);
    if (p.drop)
        rpc_test_drop(req);
    return rc;
}

static int r_drop(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    rpc_test_drop(req);
    return 0;
}

static int r_read(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct rreq q;
    uint8_t *at = rreq_at(data, len, &q), *out;

    if (!at)
        return TERN_EINVAL;
    out = tern_reply_alloc(req, q.len);
    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, at, q.len);
    return 0;
}

static int r_fill(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct rreq q;
    uint8_t *at = rreq_at(data, len, &q);

    if (!at)
        return TERN_EINVAL;
    rma_fill(at, q.len, q.seed);
    return 0;
}

static int r_dereg(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct rreq q;

    if (!rreq_at(data, len, &q))
        return TERN_EINVAL;
    tern_rpc_mr_dereg(srv_mrs[q.region]);
    srv_mrs[q.region] = NULL;
    return 0;
}

static int r_pushed(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    int32_t *out = tern_reply_alloc(req, 2 * sizeof(*out));

    if (!out)
        return TERN_ENOMEM;
    out[0] = push_runs;
    out[1] = push_status;
    return 0;
}

static const struct tern_method rma_methods[] = {
    {.id = R_KEY, .name = "key", .handler = r_key},
    {.id = R_PUSH, .name = "push", .handler = r_push},
    {.id = R_DROP, .name = "drop", .handler = r_drop},
    {.id = R_READ, .name = "read", .handler = r_read},
    {.id = R_FILL, .name = "fill", .handler = r_fill},
    {.id = R_DEREG, .name = "dereg", .handler = r_dereg},
    {.id = R_PUSHED, .name = "pushed", .handler = r_pushed},
};

static const struct tern_service rma_service = {
    .name = "rma", .id = RSVC, .methods = rma_methods,
    .n_methods = sizeof(rma_methods) / sizeof(rma_methods[0]),
};

/* Both services and the two regions on a server endpoint. */
int rma_setup_ep(struct tern_rpc_ep *ep)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    int rc;

    push_runs = push_status = 0;
    if ((rc = tern_rpc_register(ep, &test_service)) < 0 ||
        (rc = tern_rpc_register(ep, &rma_service)) < 0)
        return rc;
    for (int i = 0; i < 2; i++)
        if ((rc = tern_rpc_mr_alloc(ep, SRV_MR_LEN, rw, &srv_mrs[i])) < 0)
            return rc;
    return 0;
}

static void rma_setup_child(struct tern_rpc_ep *ep)
{
    if (rma_setup_ep(ep) < 0)
        _exit(6);
}

/* Where a server of matrix row `fab` listens. */
static const char *rma_listen(int fab)
{
    return test_fabric_listen(fab);
}

/* The server in this process (srv), with a listener on `fab` and a client
 * session to it; its regions are registered before the listener. */
void rma_pair_open(int fab, const struct tern_rpc_config *ccfg)
{
    struct tern_rpc_config dflt = {.max_msg = MAX_MSG};
    int rc;

    server_runs = 0;
    ck_assert_int_eq(tern_rpc_open(&dflt, &srv), 0);
    rc = rma_setup_ep(srv);
    ck_assert_msg(rc == 0, "server set-up: %s", tern_strerror(rc));
    rc = tern_rpc_listen(srv, rma_listen(fab), uri, sizeof(uri));
    ck_assert_msg(rc == 0, "listen %s: %s", rma_listen(fab), tern_strerror(rc));
    ck_assert_int_eq(tern_rpc_open(ccfg ? ccfg : &dflt, &cli), 0);
    rc = connect_inproc(cli, uri, &sess);
    ck_assert_msg(rc == 0, "connect %s: %s", uri, tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(sess), test_fabric_name(fab));
}

void rma_pair_close(void)
{
    pair_close();
    srv_mrs[0] = srv_mrs[1] = NULL;
}

/* The server in a child process (procs.h). The loop tests use one: rdma
 * endpoints of one process share the emulated NIC's context, whose
 * progress is not safe from two threads at once, and tern_rpc_connect
 * needs the server polled while it waits. */
static pid_t rma_pid;

/* false (with a log line) if the fabric is not built in. */
bool rma_proc_open(int fab)
{
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG};
    int rc;

    if (!(test_fabric_caps(fab) & TERN_TP_CAP_PUT)) {
        printf("SKIP: %s has no one-sided operations\n", test_fabric_name(fab));
        return false;
    }
    rma_pid = spawn_rpc_server_at(rma_setup_child, &cfg, rma_listen(fab), uri, sizeof(uri));
    ck_assert_int_gt(rma_pid, 0);
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli), 0);
    rc = tern_rpc_connect(cli, uri, 5 * SEC, &sess);
    ck_assert_msg(rc == 0, "connect %s: %s", uri, tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(sess), test_fabric_name(fab));
    return true;
}

void rma_proc_close(void)
{
    pid_t pid = rma_pid;

    tern_rpc_close(cli);
    cli = NULL;
    sess = NULL;
    rma_pid = 0;
    ck_assert_msg(stop_server(pid) == 0, "server process did not exit cleanly");
}

void rma_cb(void *arg, int status)
{
    struct rma_rec *r = arg;

    r->runs++;
    r->status = status;
}

/* A call on `s` that completes with `want`; the reply is copied to out
 * (cap bytes at most) and its length returned. */
size_t call_expect(struct tern_session *s, uint16_t method, const void *req, size_t len,
                   int want, void *out, size_t cap)
{
    struct rec r;
    size_t got;
    int rc;

    rec_init(&r, cap ? cap : 1);
    rc = tern_call(s, RSVC, method, req, len, 0, rec_cont, &r, NULL);
    ck_assert_msg(rc == 0, "call %u: %s", method, tern_strerror(rc));
    ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "call %u never completed", method);
    ck_assert_msg(r.status == want, "call %u: %s, want %s", method, status_name(r.status),
                  status_name(want));
    if (out && cap)
        memcpy(out, r.buf, r.len < cap ? r.len : cap);
    got = r.len;
    free(r.buf);
    return got;
}

/* The key of server region `i` for session `s` (asked over `s`). */
struct tern_tp_rkey srv_key(struct tern_session *s, uint32_t i)
{
    struct rreq q = {.region = i};
    struct tern_tp_rkey rk;

    ck_assert_uint_eq(call_expect(s, R_KEY, &q, sizeof(q), 0, &rk, sizeof(rk)), sizeof(rk));
    return rk;
}

/* Server region `i`'s bytes at [off, off+len) must equal `want`. */
void srv_expect(struct tern_session *s, uint32_t i, uint64_t off, uint32_t len,
                const void *want, const char *what)
{
    struct rreq q = {.region = i, .off = off, .len = len};
    uint8_t *got = malloc(len);

    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(call_expect(s, R_READ, &q, sizeof(q), 0, got, len), len);
    ck_assert_msg(memcmp(got, want, len) == 0, "%s: the server's memory differs", what);
    free(got);
}

void srv_fill(struct tern_session *s, uint32_t i, uint64_t off, uint32_t len,
              unsigned seed)
{
    struct rreq q = {.region = i, .off = off, .len = len, .seed = seed};

    call_expect(s, R_FILL, &q, sizeof(q), 0, NULL, 0);
}

/* Start a put or get, polling while the fabric says EAGAIN (shm turns a
 * key direct after its first use, and waits for served ones first). */
int rma_start_retry(struct tern_session *s, bool put, struct tern_rpc_mr *lmr,
                    size_t loff, size_t len, const struct tern_tp_rkey *rk,
                    uint64_t roff, struct rma_rec *r)
{
    double end = now_ms() + WAIT_MS;
    int rc;

    for (;;) {
        rc = put ? tern_session_put(s, lmr, loff, len, rk, roff, rma_cb, r)
                 : tern_session_get(s, lmr, loff, len, rk, roff, rma_cb, r);
        if (rc != TERN_EAGAIN || now_ms() > end)
            return rc;
        poll_eps();
    }
}

/* A put or get that must complete, once, with `want`. */
void rma_expect(struct tern_session *s, bool put, struct tern_rpc_mr *lmr, size_t loff,
                size_t len, const struct tern_tp_rkey *rk, uint64_t roff, int want)
{
    const char *what = put ? "put" : "get";
    struct rma_rec r = {0};
    int rc = rma_start_retry(s, put, lmr, loff, len, rk, roff, &r);

    ck_assert_msg(rc == 0, "%s of %zu bytes at %" PRIu64 ": %s", what, len, roff,
                  status_name(rc));
    ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "%s never completed", what);
    ck_assert_msg(r.status == want, "%s of %zu bytes at %" PRIu64 ": %s, want %s", what, len,
                  roff, status_name(r.status), status_name(want));
    poll_for(5);
    ck_assert_msg(r.runs == 1, "%s completed %d times", what, r.runs);
}

/* Checked by the continuation of a push, when the reply arrives. */
struct push_seen {
    struct rec r;
    const uint8_t *at;          /* the client's bytes the server put */
    size_t len;
    uint8_t byte;
    bool all_there;
};

static void push_cont(void *arg, int status, const void *reply, size_t len)
{
    struct push_seen *p = arg;

    p->all_there = true;
    for (size_t i = 0; i < p->len; i++)
        if (p->at[i] != p->byte)
            p->all_there = false;
    rec_cont(&p->r, status, reply, len);
}

/* The server's put completions so far, and the last one's status. */
static int srv_pushed(struct tern_session *s, int *status)
{
    int32_t got[2];

    ck_assert_uint_eq(call_expect(s, R_PUSHED, NULL, 0, 0, got, sizeof(got)), sizeof(got));
    *status = got[1];
    return got[0];
}

/* The server puts `len` bytes of `byte` into the client's `cmr` at `off`
 * from a handler and replies at once: the data is there when the reply
 * is. Its put then completes without error. */
void expect_push(struct tern_session *s, struct tern_rpc_mr *cmr, size_t off, size_t len,
                 uint8_t byte)
{
    struct push_req p = {.roff = off, .len = (uint32_t)len, .byte = byte};
    struct push_seen seen = {.at = (uint8_t *)tern_rpc_mr_addr(cmr) + off, .len = len,
                             .byte = byte};
    int before, runs, status = 0;

    before = srv_pushed(s, &status);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, s, &p.rk), 0);
    memset((uint8_t *)tern_rpc_mr_addr(cmr) + off, byte ^ 0xff, len);
    rec_init(&seen.r, 0);
    ck_assert_int_eq(tern_call(s, RSVC, R_PUSH, &p, sizeof(p), 0, push_cont, &seen, NULL), 0);
    ck_assert(poll_until(&seen.r.runs, 1, WAIT_MS));
    ck_assert_msg(seen.r.status == 0, "push: %s", status_name(seen.r.status));
    ck_assert_msg(seen.all_there, "the reply came before the server's put had landed");
    for (double end = now_ms() + WAIT_MS; (runs = srv_pushed(s, &status)) == before &&
                                          now_ms() < end;)
        poll_eps();
    ck_assert_msg(runs == before + 1, "server's put: %d completions", runs - before);
    ck_assert_msg(status == 0, "server's put: %s", status_name(status));
}
