/* The RPC layer in one process: a server endpoint and a client endpoint,
 * both polled by the test.
 *
 * tern_call_sync() polls only the client's endpoint, so it cannot be used
 * here: calls are started with tern_call() and the test polls both
 * endpoints until the continuation has run. tern_rpc_connect() also waits
 * for the handshake polling only the client, so while it runs a helper
 * thread polls the server (the server endpoint is handed back to the test
 * thread once that thread is joined).
 *
 * The last tests play a misbehaving peer at the transport level (tern_tp_*,
 * RPC frames built by hand from wire.h): clients that break the protocol or
 * never say HELLO, a server (on its own thread) that answers wrongly, one on a
 * plain socket that resets the connection, and a client that never reads its
 * replies.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "helpers.h"
#include "rpc.h"
#include "rpc_util.h"
#include "rpc_internal.h"
#include "suites.h"
#include "tern_config.h"
#include "tcp/tcp_wire.h"
#include "transport.h"
#include "wire.h"

#define SVC 7
#define MAX_MSG (64u * 1024)
#define WAIT_MS 5000
#define SEC 1000000000ull

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

/* Handler runs, to tell "the server never ran it" from "it ran". */
static int server_runs;

static int h_echo(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, len);

    server_runs++;
    if (!out)
        return TERN_ENOMEM;
    if (len)
        memcpy(out, data, len);
    return 0;
}

static int h_enoent(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    server_runs++;
    return TERN_ENOENT;
}

static int h_positive(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    server_runs++;
    return 5;
}

static int h_alloc_fail(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    size_t n = len == 1 ? MAX_MSG : 128;    /* one-byte request: reserve the maximum */
    uint8_t *out = tern_reply_alloc(req, n);

    server_runs++;
    if (out)
        memset(out, 0xAB, n);
    return TERN_EIO;
}

static int h_shrink(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint8_t *out = tern_reply_alloc(req, 100);

    server_runs++;
    if (!out)
        return TERN_ENOMEM;
    for (int i = 0; i < 100; i++)
        out[i] = (uint8_t)i;
    tern_reply_set_len(req, 10);
    return 0;
}

static int h_deadline(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint64_t d = tern_req_deadline(req);
    void *out = tern_reply_alloc(req, sizeof(d));

    server_runs++;
    if (!out)
        return TERN_ENOMEM;
    memcpy(out, &d, sizeof(d));
    return 0;
}

static int h_big(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint32_t want;
    uint8_t *out;

    server_runs++;
    if (len != sizeof(want))
        return TERN_EINVAL;
    memcpy(&want, data, sizeof(want));
    out = tern_reply_alloc(req, want);
    if (!out)
        return TERN_EMSGSIZE;
    memset(out, 0x5A, want);
    return 0;
}

static int h_ids(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint16_t ids[2] = {tern_req_service(req), tern_req_method(req)};
    void *out = tern_reply_alloc(req, sizeof(ids));

    server_runs++;
    if (!out)
        return TERN_ENOMEM;
    memcpy(out, ids, sizeof(ids));
    return 0;
}

static int h_alloc_twice(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint8_t *a = tern_reply_alloc(req, 8), *b;

    server_runs++;
    if (!a)
        return TERN_ENOMEM;
    memcpy(a, "first!!!", 8);
    b = tern_reply_alloc(req, 4);
    if (b)
        return TERN_EEXIST;     /* the caller sees that the second one worked */
    return 0;
}

static int h_empty(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    server_runs++;
    return 0;
}

static const struct tern_method methods[] = {
    {.id = M_ECHO, .name = "echo", .handler = h_echo},
    {.id = M_ENOENT, .name = "enoent", .handler = h_enoent},
    {.id = M_POSITIVE, .name = "positive", .handler = h_positive},
    {.id = M_ALLOC_FAIL, .name = "alloc_fail", .handler = h_alloc_fail},
    {.id = M_SHRINK, .name = "shrink", .handler = h_shrink},
    {.id = M_DEADLINE, .name = "deadline", .handler = h_deadline},
    {.id = M_BIG, .name = "big", .handler = h_big},
    {.id = M_IDS, .name = "ids", .handler = h_ids},
    {.id = M_ALLOC_TWICE, .name = "alloc_twice", .handler = h_alloc_twice},
    {.id = M_EMPTY, .name = "empty", .handler = h_empty},
};

static const struct tern_service service = {
    .name = "test", .id = SVC, .methods = methods,
    .n_methods = sizeof(methods) / sizeof(methods[0]),
};

/* ---- the in-process pair ---- */

static struct tern_rpc_ep *srv, *cli;
static struct tern_session *sess;
static char uri[128];

/* Polls an endpoint from another thread until told to stop. */
struct bg_poller {
    struct tern_rpc_ep *ep;
    atomic_bool stop;
    pthread_t th;
};

static void *bg_main(void *arg)
{
    struct bg_poller *b = arg;

    while (!atomic_load(&b->stop))
        tern_rpc_poll(b->ep);
    return NULL;
}

/* tern_rpc_connect with the server endpoint served meanwhile. */
static int connect_inproc_timeout(struct tern_rpc_ep *ep, const char *to, uint64_t timeout_ns,
                                  struct tern_session **out)
{
    struct bg_poller b = {.ep = srv};
    int rc;

    atomic_init(&b.stop, false);
    ck_assert_int_eq(pthread_create(&b.th, NULL, bg_main, &b), 0);
    rc = tern_rpc_connect(ep, to, timeout_ns, out);
    atomic_store(&b.stop, true);
    pthread_join(b.th, NULL);
    return rc;
}

static int connect_inproc(struct tern_rpc_ep *ep, const char *to, struct tern_session **out)
{
    return connect_inproc_timeout(ep, to, 5 * SEC, out);
}

/* Server with the test service listening on loopback; a client endpoint;
 * a session between them. NULL configs mean max_msg = MAX_MSG. */
static void pair_open(const struct tern_rpc_config *scfg, const struct tern_rpc_config *ccfg)
{
    struct tern_rpc_config dflt = {.max_msg = MAX_MSG};
    int rc;

    server_runs = 0;
    rc = tern_rpc_open(scfg ? scfg : &dflt, &srv);
    ck_assert_msg(rc == 0, "server ep: %s", tern_strerror(rc));
    ck_assert_int_eq(tern_rpc_register(srv, &service), 0);
    rc = tern_rpc_listen(srv, "tcp://127.0.0.1:0", uri, sizeof(uri));
    ck_assert_msg(rc == 0, "listen: %s", tern_strerror(rc));
    rc = tern_rpc_open(ccfg ? ccfg : &dflt, &cli);
    ck_assert_msg(rc == 0, "client ep: %s", tern_strerror(rc));
    rc = connect_inproc(cli, uri, &sess);
    ck_assert_msg(rc == 0, "connect %s: %s", uri, tern_strerror(rc));
    ck_assert_int_eq(tern_session_status(sess), 0);
}

static void pair_close(void)
{
    tern_rpc_close(cli);
    tern_rpc_close(srv);
    cli = srv = NULL;
    sess = NULL;
}

static void setup_default(void)
{
    pair_open(NULL, NULL);
}

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

static int total_runs;  /* continuations run, all calls together */

static void rec_cont(void *arg, int status, const void *reply, size_t len)
{
    struct rec *r = arg;

    r->runs++;
    total_runs++;
    r->status = status;
    r->reply_null = reply == NULL;
    r->len = len;
    if (reply && r->buf)
        memcpy(r->buf, reply, len < r->cap ? len : r->cap);
}

static void rec_init(struct rec *r, size_t cap)
{
    *r = (struct rec){.cap = cap, .buf = cap ? calloc(1, cap) : NULL};
    ck_assert(!cap || r->buf);
}

static void poll_both(void)
{
    tern_rpc_poll(cli);
    tern_rpc_poll(srv);
}

/* Poll both endpoints until *counter reaches want; false on timeout. */
static bool poll_until(const int *counter, int want, int ms)
{
    double end = now_ms() + ms;

    while (*counter < want) {
        if (now_ms() > end)
            return false;
        poll_both();
    }
    return true;
}

static void poll_for(int ms)
{
    double end = now_ms() + ms;

    while (now_ms() < end)
        poll_both();
}

/* Call and wait for the continuation; the result lands in r. */
static void call_wait(uint16_t svc, uint16_t method, const void *req, size_t len,
                      uint64_t timeout_ns, struct rec *r)
{
    int rc = tern_call(sess, svc, method, req, len, timeout_ns, rec_cont, r, NULL);

    ck_assert_msg(rc == 0, "tern_call %u.%u: %s", svc, method, tern_strerror(rc));
    ck_assert_msg(poll_until(&r->runs, 1, WAIT_MS), "call %u.%u never completed", svc, method);
}

/* An error reply: the status, and no payload. */
static void expect_error(uint16_t svc, uint16_t method, int want)
{
    struct rec r;

    rec_init(&r, 0);
    call_wait(svc, method, "x", 1, 0, &r);
    ck_assert_msg(r.status == want, "%u.%u: got %s, want %s", svc, method,
                  tern_err_name(r.status), tern_err_name(want));
    ck_assert_msg(r.reply_null, "%u.%u: an error came with a reply pointer", svc, method);
    ck_assert_uint_eq(r.len, 0);
}

/* An echo call of `len` bytes must come back intact. */
static void expect_echo(size_t len)
{
    uint8_t *req = malloc(len ? len : 1);
    struct rec r;

    ck_assert(req);
    for (size_t i = 0; i < len; i++)
        req[i] = (uint8_t)(i * 31 + len);
    rec_init(&r, len ? len : 1);
    call_wait(SVC, M_ECHO, req, len, 0, &r);
    ck_assert_msg(r.status == 0, "echo %zu: %s", len, tern_err_name(r.status));
    ck_assert_uint_eq(r.len, len);
    if (len)
        ck_assert_msg(memcmp(r.buf, req, len) == 0, "echo %zu: payload differs", len);
    free(req);
    free(r.buf);
}

/* ---- registration ---- */

START_TEST(register_errors)
{
    static const struct tern_method other_methods[] = {
        {.id = M_ECHO, .name = "not-echo", .handler = h_enoent},
    };
    static const struct tern_service dup_id = {
        .name = "dup", .id = SVC, .methods = other_methods, .n_methods = 1};
    static const struct tern_method dup_methods[] = {
        {.id = 3, .name = "a", .handler = h_echo},
        {.id = 3, .name = "b", .handler = h_enoent},
    };
    static const struct tern_service dup_m = {
        .name = "dupm", .id = 20, .methods = dup_methods, .n_methods = 2};
    static const struct tern_method null_methods[] = {
        {.id = 0, .name = "ok", .handler = h_echo},
        {.id = 1, .name = "null", .handler = NULL},
    };
    static const struct tern_service null_h = {
        .name = "nullh", .id = 21, .methods = null_methods, .n_methods = 2};
    static const struct tern_service fine20 = {
        .name = "fine20", .id = 20, .methods = other_methods, .n_methods = 1};
    static const struct tern_service fine21 = {
        .name = "fine21", .id = 21, .methods = other_methods, .n_methods = 1};

    ck_assert_int_eq(tern_rpc_register(srv, &dup_id), TERN_EEXIST);
    ck_assert_int_eq(tern_rpc_register(srv, &dup_m), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_register(srv, &null_h), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_register(srv, NULL), TERN_EINVAL);

    /* The refused registrations left nothing behind: their ids are free,
     * and the original service still answers (echo, not ENOENT). */
    ck_assert_int_eq(tern_rpc_register(srv, &fine20), 0);
    ck_assert_int_eq(tern_rpc_register(srv, &fine21), 0);
    expect_echo(3);
    expect_error(20, M_ECHO, TERN_ENOENT);
    expect_error(21, M_ECHO, TERN_ENOENT);
}
END_TEST

/* ---- round trips and handler outcomes ---- */

START_TEST(echo_sizes)
{
    static const size_t sizes[] = {0, 1, 4096, MAX_MSG - 1, MAX_MSG};

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        expect_echo(sizes[i]);
    ck_assert_int_eq(server_runs, 5);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
}
END_TEST

START_TEST(request_over_max_msg)
{
    static uint8_t big[MAX_MSG + 1];
    struct rec r;
    int rc;

    rec_init(&r, 0);
    rc = tern_call(sess, SVC, M_ECHO, big, sizeof(big), 0, rec_cont, &r, NULL);
    ck_assert_msg(rc == TERN_EMSGSIZE, "got %s", tern_err_name(rc));
    poll_for(50);
    ck_assert_msg(r.runs == 0, "a refused call ran its continuation");
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    ck_assert_int_eq(server_runs, 0);
    expect_echo(8);     /* the session is unharmed */
}
END_TEST

START_TEST(call_argument_errors)
{
    struct rec r;

    rec_init(&r, 0);
    ck_assert_int_eq(tern_call(NULL, SVC, M_ECHO, "x", 1, 0, rec_cont, &r, NULL), TERN_EINVAL);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, NULL, 4, 0, rec_cont, &r, NULL), TERN_EINVAL);
    ck_assert_int_eq(r.runs, 0);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
}
END_TEST

START_TEST(unknown_service_and_method)
{
    expect_error(SVC + 1, M_ECHO, TERN_ENOSERVICE);
    expect_error(0xFFFF, M_ECHO, TERN_ENOSERVICE);
    expect_error(SVC, 7, TERN_ENOMETHOD);       /* a hole in the table */
    expect_error(SVC, M_EMPTY + 1, TERN_ENOMETHOD); /* past the last method */
    expect_error(SVC, 0xFFFF, TERN_ENOMETHOD);
    ck_assert_int_eq(server_runs, 0);
    expect_echo(16);
}
END_TEST

START_TEST(handler_ids)
{
    struct rec r;
    uint16_t ids[2];

    rec_init(&r, sizeof(ids));
    call_wait(SVC, M_IDS, NULL, 0, 0, &r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_uint_eq(r.len, sizeof(ids));
    memcpy(ids, r.buf, sizeof(ids));
    ck_assert_uint_eq(ids[0], SVC);
    ck_assert_uint_eq(ids[1], M_IDS);
    free(r.buf);
}
END_TEST

START_TEST(handler_error_codes)
{
    expect_error(SVC, M_ENOENT, TERN_ENOENT);
    expect_error(SVC, M_POSITIVE, TERN_EHANDLER);
    ck_assert_int_eq(server_runs, 2);
    expect_echo(5);
}
END_TEST

START_TEST(alloc_then_error)
{
    /* The caller gets the error only, and the half-built reply does not
     * leak into the stream: later calls still get their own replies. */
    struct rec r;

    expect_error(SVC, M_ALLOC_FAIL, TERN_EIO);
    expect_echo(64);
    rec_init(&r, 0);
    call_wait(SVC, M_ALLOC_FAIL, "1", 1, 0, &r);    /* reserves MAX_MSG */
    ck_assert_int_eq(r.status, TERN_EIO);
    ck_assert(r.reply_null);
    ck_assert_uint_eq(r.len, 0);
    expect_echo(MAX_MSG);
    ck_assert_int_eq(server_runs, 4);
}
END_TEST

START_TEST(reply_shrink)
{
    struct rec r;

    rec_init(&r, 100);
    call_wait(SVC, M_SHRINK, NULL, 0, 0, &r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_uint_eq(r.len, 10);
    for (int i = 0; i < 10; i++)
        ck_assert_uint_eq(r.buf[i], (uint8_t)i);
    free(r.buf);
    expect_echo(33);    /* the 90 dropped bytes did not reach the stream */
}
END_TEST

START_TEST(reply_alloc_once)
{
    struct rec r;

    rec_init(&r, 16);
    call_wait(SVC, M_ALLOC_TWICE, NULL, 0, 0, &r);
    ck_assert_msg(r.status == 0, "second tern_reply_alloc: %s", tern_err_name(r.status));
    ck_assert_uint_eq(r.len, 8);
    ck_assert_mem_eq(r.buf, "first!!!", 8);
    free(r.buf);
    expect_echo(5);
}
END_TEST

START_TEST(empty_reply)
{
    struct rec r;

    rec_init(&r, 0);
    call_wait(SVC, M_EMPTY, "abc", 3, 0, &r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_uint_eq(r.len, 0);
    expect_echo(6);
}
END_TEST

/* ---- many calls, credits, slots ---- */

START_TEST(many_async_calls_with_8_credits)
{
    enum { N = 500 };
    static uint32_t req[N];
    static struct rec r[N];
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = 8};

    pair_open(&scfg, NULL);
    ck_assert_uint_eq(tern_session_credits(sess), 8);
    total_runs = 0;
    for (int i = 0; i < N; i++) {
        int rc;

        req[i] = 0xC0DE0000u + (uint32_t)i;
        rec_init(&r[i], sizeof(uint32_t));
        rc = tern_call(sess, SVC, M_ECHO, &req[i], sizeof(req[i]), 0, rec_cont, &r[i], NULL);
        ck_assert_msg(rc == 0, "call %d: %s", i, tern_strerror(rc));
    }
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), N);
    ck_assert_msg(poll_until(&total_runs, N, 20000), "only %d of %d calls completed",
                  total_runs, N);
    poll_for(50);       /* nothing may complete twice */
    ck_assert_int_eq(total_runs, N);
    for (int i = 0; i < N; i++) {
        uint32_t got;

        ck_assert_msg(r[i].runs == 1, "call %d ran %d times", i, r[i].runs);
        ck_assert_msg(r[i].status == 0, "call %d: %s", i, tern_err_name(r[i].status));
        ck_assert_uint_eq(r[i].len, sizeof(got));
        memcpy(&got, r[i].buf, sizeof(got));
        ck_assert_msg(got == req[i], "call %d got the reply of another call", i);
        free(r[i].buf);
    }
    ck_assert_int_eq(server_runs, N);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    pair_close();
}
END_TEST

START_TEST(client_credits_cap_server_grant)
{
    /* The client asks for 4, the server would give 32: 4 it is. */
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .credits = 4};

    pair_open(NULL, &ccfg);
    ck_assert_uint_eq(tern_session_credits(sess), 4);
    expect_echo(4);
    pair_close();
}
END_TEST

START_TEST(no_call_slots)
{
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .max_calls = 4, .credits = 4};
    struct rec r[6];
    int rc;

    pair_open(NULL, &ccfg);
    total_runs = 0;
    for (int i = 0; i < 4; i++) {
        rec_init(&r[i], 0);
        rc = tern_call(sess, SVC, M_ECHO, "abc", 3, 0, rec_cont, &r[i], NULL);
        ck_assert_msg(rc == 0, "call %d: %s", i, tern_strerror(rc));
    }
    rec_init(&r[4], 0);
    rc = tern_call(sess, SVC, M_ECHO, "abc", 3, 0, rec_cont, &r[4], NULL);
    ck_assert_msg(rc == TERN_ENOBUFS, "fifth call: %s, want TERN_ENOBUFS", tern_err_name(rc));
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 4);
    ck_assert(poll_until(&total_runs, 4, WAIT_MS));
    poll_for(20);
    ck_assert_int_eq(r[4].runs, 0);
    ck_assert_int_eq(total_runs, 4);
    /* The slots came back. */
    rec_init(&r[5], 0);
    rc = tern_call(sess, SVC, M_ECHO, "abc", 3, 0, rec_cont, &r[5], NULL);
    ck_assert_msg(rc == 0, "call after completions: %s", tern_strerror(rc));
    ck_assert(poll_until(&r[5].runs, 1, WAIT_MS));
    ck_assert_int_eq(r[5].status, 0);
    pair_close();
}
END_TEST

START_TEST(max_calls_below_default_credits)
{
    /* Only max_calls is set; credits is left at its default (0 = 32), which
     * is more than 4. A configuration that only lowers the number of slots
     * should be accepted, with the credits defaulting to what fits. */
    struct tern_rpc_config cfg = {.max_calls = 4};
    struct tern_rpc_ep *ep = NULL;
    int rc = tern_rpc_open(&cfg, &ep);

    ck_assert_msg(rc == 0, "max_calls=4 with default credits refused: %s", tern_err_name(rc));
    tern_rpc_close(ep);
}
END_TEST

/* ---- cancellation and closing ---- */

START_TEST(cancel_sent_call)
{
    struct rec a, b;
    uint64_t id;
    int rc;

    rec_init(&a, 16);
    rec_init(&b, 16);
    rc = tern_call(sess, SVC, M_ECHO, "AAAA", 4, 0, rec_cont, &a, &id);
    ck_assert_int_eq(rc, 0);
    poll_both();    /* let it go out */
    ck_assert_int_eq(tern_call_cancel(sess, id), 0);
    ck_assert_int_eq(a.runs, 1);
    ck_assert_int_eq(a.status, TERN_ECANCELED);
    ck_assert(a.reply_null);
    ck_assert_int_eq(tern_call_cancel(sess, id), TERN_ENOENT);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);

    /* The next call probably reuses the slot; the late "AAAA" reply must
     * not be taken for its answer. */
    rc = tern_call(sess, SVC, M_ECHO, "BBBB", 4, 0, rec_cont, &b, NULL);
    ck_assert_int_eq(rc, 0);
    ck_assert(poll_until(&b.runs, 1, WAIT_MS));
    ck_assert_int_eq(b.status, 0);
    ck_assert_uint_eq(b.len, 4);
    ck_assert_mem_eq(b.buf, "BBBB", 4);
    poll_for(50);
    ck_assert_int_eq(a.runs, 1);
    ck_assert_int_eq(b.runs, 1);
    ck_assert_int_eq(server_runs, 2);  /* the cancelled call did run remotely */
    ck_assert_int_eq(tern_session_status(sess), 0);
    free(a.buf);
    free(b.buf);
}
END_TEST

START_TEST(cancel_queued_call)
{
    /* One credit: the second call waits in the queue and is cancelled
     * there, so the server never sees it. */
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = 1};
    struct rec a, b;
    uint64_t ida, idb;

    pair_open(&scfg, NULL);
    rec_init(&a, 0);
    rec_init(&b, 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "a", 1, 0, rec_cont, &a, &ida), 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "b", 1, 0, rec_cont, &b, &idb), 0);
    ck_assert(ida != idb);
    ck_assert_int_eq(tern_call_cancel(sess, idb), 0);
    ck_assert_int_eq(b.runs, 1);
    ck_assert_int_eq(b.status, TERN_ECANCELED);
    ck_assert(poll_until(&a.runs, 1, WAIT_MS));
    ck_assert_int_eq(a.status, 0);
    poll_for(50);
    ck_assert_int_eq(b.runs, 1);
    ck_assert_int_eq(server_runs, 1);
    ck_assert_int_eq(tern_call_cancel(sess, ida), TERN_ENOENT);  /* completed */
    pair_close();
}
END_TEST

/* b, queued behind a whose credit came back early, gets its own reply;
 * each continuation ran once; nothing is left in flight. */
static void expect_b_alone(struct rec *a, struct rec *b)
{
    ck_assert(poll_until(&b->runs, 1, WAIT_MS));
    ck_assert_int_eq(b->status, 0);
    ck_assert_uint_eq(b->len, 2);
    ck_assert_mem_eq(b->buf, "bb", 2);     /* its own reply, not a's late one */
    poll_for(50);
    ck_assert_int_eq(a->runs, 1);
    ck_assert_int_eq(b->runs, 1);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    free(b->buf);
    pair_close();
}

START_TEST(cancel_sends_queued_call)
{
    /* One credit: b waits behind a. Cancelling a gives the credit back, and
     * that alone must send b. Nothing else would: the test starts no other
     * call, and only the server is polled, so no reply (a's late one is
     * dropped anyway) reaches the client to pump its queue. */
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = 1};
    struct rec a, b;
    uint64_t ida;

    pair_open(&scfg, NULL);
    rec_init(&a, 0);
    rec_init(&b, 8);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "a", 1, 0, rec_cont, &a, &ida), 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "bb", 2, 0, rec_cont, &b, NULL), 0);
    ck_assert_int_eq(tern_call_cancel(sess, ida), 0);
    ck_assert_int_eq(a.runs, 1);
    ck_assert_int_eq(a.status, TERN_ECANCELED);
    ck_assert_msg(test_rpc_poll_until(srv, &server_runs, 2, WAIT_MS),
                  "the credit freed by tern_call_cancel was not used: the queued call "
                  "never reached the server (%d served)", server_runs);
    expect_b_alone(&a, &b);
}
END_TEST

START_TEST(expiry_sends_queued_call)
{
    /* The same with a deadline: a times out (the server is not polled, so
     * it cannot answer first), its credit comes back, and the expiry must
     * send b without any new tern_call. */
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = 1};
    struct rec a, b;

    pair_open(&scfg, NULL);
    rec_init(&a, 0);
    rec_init(&b, 8);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "a", 1, 20 * 1000000ull, rec_cont, &a, NULL),
                     0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "bb", 2, 0, rec_cont, &b, NULL), 0);
    ck_assert(test_rpc_poll_until(cli, &a.runs, 1, WAIT_MS));
    ck_assert_int_eq(a.status, TERN_ETIMEDOUT);
    ck_assert_int_eq(b.runs, 0);
    /* a's request is still in the server's socket; b must follow it. */
    ck_assert_msg(test_rpc_poll_until(srv, &server_runs, 2, WAIT_MS),
                  "the credit freed by an expired call was not used: the queued call "
                  "never reached the server (%d served)", server_runs);
    expect_b_alone(&a, &b);
}
END_TEST

/* Calls sent straight onto the wire get their deadline stamped at the
 * poll loop's next clock reading, not in tern_call. More of them than the
 * stamping batch holds, to a server that never answers: every one times
 * out, and none before its timeout has passed. */
START_TEST(many_deadlines_sent_at_once)
{
    enum { N = 150, TIMEOUT_MS = 40 };
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG, .credits = 256, .max_calls = 512};
    static struct rec r[N];
    double t0;

    pair_open(&cfg, &cfg);
    t0 = now_ms();
    for (int i = 0; i < N; i++) {
        rec_init(&r[i], 0);
        ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "x", 1, TIMEOUT_MS * 1000000ull, rec_cont,
                                   &r[i], NULL),
                         0);
    }
    total_runs = 0;
    while (total_runs < N && now_ms() - t0 < WAIT_MS) {
        tern_rpc_poll(cli);
        /* No call may time out early. */
        ck_assert_msg(total_runs == 0 || now_ms() - t0 >= TIMEOUT_MS,
                      "%d calls timed out after %.1f ms of %d", total_runs, now_ms() - t0,
                      TIMEOUT_MS);
    }
    ck_assert_int_eq(total_runs, N);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(r[i].status, TERN_ETIMEDOUT);
}
END_TEST

START_TEST(cancel_unknown_ids)
{
    struct tern_session *other;
    struct rec a;
    uint64_t id;

    ck_assert_int_eq(tern_call_cancel(sess, 0), TERN_ENOENT);
    ck_assert_int_eq(tern_call_cancel(sess, 12345), TERN_ENOENT);
    ck_assert_int_eq(tern_call_cancel(sess, UINT64_MAX), TERN_ENOENT);
    ck_assert_int_eq(tern_call_cancel(NULL, 1), TERN_EINVAL);
    /* A call is cancelled through the session it was started on only. */
    ck_assert_int_eq(connect_inproc(cli, uri, &other), 0);
    rec_init(&a, 16);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "AAAA", 4, 0, rec_cont, &a, &id), 0);
    ck_assert_int_eq(tern_call_cancel(other, id), TERN_ENOENT);
    ck_assert(poll_until(&a.runs, 1, WAIT_MS));
    ck_assert_int_eq(a.status, 0);
    free(a.buf);
}
END_TEST

START_TEST(session_close_cancels_in_flight)
{
    /* Two credits: two calls on the wire, four queued. */
    enum { N = 6 };
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = 2};
    struct tern_session *s2;
    struct rec r[N];

    pair_open(&scfg, NULL);
    total_runs = 0;
    for (int i = 0; i < N; i++) {
        rec_init(&r[i], 0);
        ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "zz", 2, 0, rec_cont, &r[i], NULL), 0);
    }
    poll_both();
    ck_assert_int_eq(total_runs, 0);
    tern_rpc_disconnect(sess);
    sess = NULL;
    for (int i = 0; i < N; i++) {
        ck_assert_msg(r[i].runs == 1, "call %d ran %d times", i, r[i].runs);
        ck_assert_msg(r[i].status == TERN_ECANCELED, "call %d: %s", i,
                      tern_err_name(r[i].status));
    }
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    poll_for(100);      /* late replies find nobody, and run nothing */
    ck_assert_int_eq(total_runs, N);

    /* The server shrugged it off: a new session works. */
    ck_assert_int_eq(connect_inproc(cli, uri, &s2), 0);
    sess = s2;
    expect_echo(7);
    pair_close();
}
END_TEST

/* A continuation that closes its own session. */
static struct tern_session *close_me;

static void closing_cont(void *arg, int status, const void *reply, size_t len)
{
    rec_cont(arg, status, reply, len);
    tern_rpc_disconnect(close_me);
    close_me = NULL;
}

START_TEST(close_from_continuation)
{
    struct rec first, rest[4];
    struct tern_session *s2;

    total_runs = 0;
    close_me = sess;
    rec_init(&first, 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "1", 1, 0, closing_cont, &first, NULL), 0);
    for (int i = 0; i < 4; i++) {
        rec_init(&rest[i], 0);
        ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "2", 1, 0, rec_cont, &rest[i], NULL), 0);
    }
    ck_assert(poll_until(&total_runs, 5, WAIT_MS));
    sess = NULL;
    poll_for(100);
    ck_assert_int_eq(first.runs, 1);
    ck_assert_int_eq(first.status, 0);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(rest[i].runs == 1, "call %d ran %d times", i, rest[i].runs);
        /* Replies that arrive in the same batch as the first one may be
         * dropped or delivered; what matters is exactly once. */
        ck_assert_msg(rest[i].status == TERN_ECANCELED || rest[i].status == 0,
                      "call %d: %s", i, tern_err_name(rest[i].status));
    }
    ck_assert_int_eq(total_runs, 5);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    ck_assert_int_eq(connect_inproc(cli, uri, &s2), 0);
    sess = s2;
    expect_echo(2);
}
END_TEST

START_TEST(call_on_closed_session_fails)
{
    /* After the server goes away the session reports why, and new calls
     * are refused at once. */
    struct rec r;
    int rc;
    double end = now_ms() + WAIT_MS;

    tern_rpc_close(srv);
    srv = NULL;
    while (tern_session_status(sess) == 0 && now_ms() < end)
        tern_rpc_poll(cli);
    ck_assert_msg(tern_session_status(sess) < 0, "session still open after the server left");
    rec_init(&r, 0);
    rc = tern_call(sess, SVC, M_ECHO, "x", 1, 0, rec_cont, &r, NULL);
    ck_assert_msg(rc < 0, "call on a dead session accepted");
    ck_assert_int_eq(r.runs, 0);
    tern_rpc_close(cli);
    cli = NULL;
}
END_TEST

/* ---- deadlines ---- */

START_TEST(handler_sees_deadline)
{
    struct rec r;
    uint64_t d, t0, t1;
    const uint64_t timeout = 2 * SEC;

    rec_init(&r, sizeof(d));
    call_wait(SVC, M_DEADLINE, NULL, 0, 0, &r);
    ck_assert_int_eq(r.status, 0);
    memcpy(&d, r.buf, sizeof(d));
    ck_assert_msg(d == 0, "no timeout, yet the handler saw deadline %llu",
                  (unsigned long long)d);
    free(r.buf);

    rec_init(&r, sizeof(d));
    t0 = tern_now_ns();
    call_wait(SVC, M_DEADLINE, NULL, 0, timeout, &r);
    t1 = tern_now_ns();
    ck_assert_int_eq(r.status, 0);
    memcpy(&d, r.buf, sizeof(d));
    /* The budget travels in microseconds from send time and is added to the
     * arrival time, so the handler's deadline lies within the call's span
     * shifted by the timeout (1 ms slack for rounding). */
    ck_assert_msg(d + 1000000 >= t0 + timeout && d <= t1 + timeout + 1000000,
                  "deadline %llu outside [%llu, %llu]", (unsigned long long)d,
                  (unsigned long long)(t0 + timeout), (unsigned long long)(t1 + timeout));
    free(r.buf);
}
END_TEST

START_TEST(local_deadline_expires)
{
    /* The server is never polled: the call can only end by its deadline. */
    struct rec r;
    double t0, el;
    int rc;

    rec_init(&r, 0);
    t0 = now_ms();
    rc = tern_call(sess, SVC, M_ECHO, "late", 4, 30 * 1000000ull, rec_cont, &r, NULL);
    ck_assert_int_eq(rc, 0);
    while (r.runs == 0 && now_ms() - t0 < WAIT_MS)
        tern_rpc_poll(cli);
    el = now_ms() - t0;
    ck_assert_int_eq(r.runs, 1);
    ck_assert_int_eq(r.status, TERN_ETIMEDOUT);
    ck_assert_msg(el >= 29 && el < 1000, "timed out after %.1f ms, want ~30", el);
    /* The late reply is dropped; the session goes on. */
    poll_for(50);
    ck_assert_int_eq(r.runs, 1);
    expect_echo(9);
}
END_TEST

START_TEST(timeout_max_means_no_deadline)
{
    /* A timeout of UINT64_MAX is "never": now + UINT64_MAX must saturate,
     * not wrap around to a deadline in the past. */
    struct tern_session *s2 = (struct tern_session *)&s2;
    struct rec r;
    uint64_t d, t0 = tern_now_ns();
    int rc;

    rec_init(&r, sizeof(d));
    ck_assert_int_eq(tern_call(sess, SVC, M_DEADLINE, NULL, 0, UINT64_MAX, rec_cont, &r, NULL),
                     0);
    /* Only the client is polled: the call could only end by its deadline. */
    for (double end = now_ms() + 100; now_ms() < end;)
        tern_rpc_poll(cli);
    ck_assert_msg(r.runs == 0, "a call with timeout UINT64_MAX ended at once: %s",
                  tern_err_name(r.status));
    ck_assert(poll_until(&r.runs, 1, WAIT_MS));
    ck_assert_int_eq(r.status, 0);
    memcpy(&d, r.buf, sizeof(d));
    /* The budget on the wire saturates too (32-bit microseconds, ~71 min):
     * the handler sees a far deadline, not an expired one. */
    ck_assert_msg(d == 0 || d > t0 + 3600 * SEC, "handler saw deadline now + %.3f s",
                  ((double)d - (double)t0) / 1e9);
    free(r.buf);

    /* tern_rpc_connect: the handshake is waited for, and a refusal is
     * reported as such, not as TERN_ETIMEDOUT. */
    rc = connect_inproc_timeout(cli, uri, UINT64_MAX, &s2);
    ck_assert_msg(rc == 0, "connect with timeout UINT64_MAX: %s", tern_err_name(rc));
    ck_assert_int_eq(tern_session_status(s2), 0);
    tern_rpc_disconnect(s2);
    rc = tern_rpc_connect(cli, "tcp://127.0.0.1:1", UINT64_MAX, &s2);
    ck_assert_msg(rc == TERN_ECONNREFUSED, "connect to a closed port, timeout UINT64_MAX: %s",
                  tern_err_name(rc));
    ck_assert_ptr_null(s2);
    expect_echo(3);
}
END_TEST

START_TEST(queued_call_expires)
{
    /* One credit and a server that is not polled: the second call never
     * leaves the queue, and its deadline must still fire there. */
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = 1};
    struct rec a, b;
    uint64_t idb;
    double t0 = now_ms();

    pair_open(&scfg, NULL);
    rec_init(&a, 0);
    rec_init(&b, 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "a", 1, 0, rec_cont, &a, NULL), 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "b", 1, 20 * 1000000ull, rec_cont, &b, &idb),
                     0);
    while (b.runs == 0 && now_ms() - t0 < WAIT_MS)
        tern_rpc_poll(cli);
    ck_assert_int_eq(b.runs, 1);
    ck_assert_int_eq(b.status, TERN_ETIMEDOUT);
    ck_assert_int_eq(a.runs, 0);
    ck_assert_int_eq(tern_call_cancel(sess, idb), TERN_ENOENT);
    ck_assert(poll_until(&a.runs, 1, WAIT_MS));
    ck_assert_int_eq(a.status, 0);
    poll_for(50);
    ck_assert_int_eq(b.runs, 1);
    ck_assert_int_eq(server_runs, 1);      /* the expired call was never sent */
    pair_close();
}
END_TEST

/* Two calls that expire in the same deadline scan; the first one's
 * continuation ends the second (by cancelling it, or by closing the session)
 * before the scan reaches it. */
static uint64_t other_id;

static void cancel_other_cont(void *arg, int status, const void *reply, size_t len)
{
    rec_cont(arg, status, reply, len);
    tern_call_cancel(sess, other_id);
}

static void close_session_cont(void *arg, int status, const void *reply, size_t len)
{
    rec_cont(arg, status, reply, len);
    if (sess) {
        tern_rpc_disconnect(sess);
        sess = NULL;
    }
}

static void expire_two(tern_cont_fn first_cont)
{
    struct rec a, b, c;
    struct tern_session *s2;
    double t0 = now_ms();

    total_runs = 0;
    rec_init(&a, 0);
    rec_init(&b, 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "a", 1, 10 * 1000000ull, first_cont, &a,
                               NULL), 0);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "b", 1, 10 * 1000000ull, rec_cont, &b,
                               &other_id), 0);
    /* Only the client is polled, once both deadlines have passed, so one
     * scan finds both expired. */
    while (now_ms() - t0 < 30)
        ;
    while (total_runs < 2 && now_ms() - t0 < WAIT_MS)
        tern_rpc_poll(cli);
    poll_for(50);
    ck_assert_int_eq(a.runs, 1);
    ck_assert_int_eq(a.status, TERN_ETIMEDOUT);
    ck_assert_msg(b.runs == 1, "the second call's continuation ran %d times", b.runs);
    ck_assert_int_eq(b.status, TERN_ECANCELED);
    ck_assert_msg(tern_rpc_calls_in_flight(cli) == 0, "%u calls in flight, want 0",
                  tern_rpc_calls_in_flight(cli));

    /* The slot table is intact: calls still work and complete once. */
    if (!sess) {
        ck_assert_int_eq(connect_inproc(cli, uri, &s2), 0);
        sess = s2;
    }
    for (int i = 0; i < 3; i++) {
        rec_init(&c, 0);
        call_wait(SVC, M_ECHO, "c", 1, 0, &c);
        ck_assert_int_eq(c.status, 0);
    }
    poll_for(20);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
}

START_TEST(expiry_continuation_cancels_other)
{
    expire_two(cancel_other_cont);
}
END_TEST

START_TEST(expiry_continuation_closes_session)
{
    expire_two(close_session_cont);
}
END_TEST

START_TEST(client_send_path_full)
{
    /* 256 calls of 64 KiB issued back to back, with the server not polled:
     * the client's send path fills (TERN_EAGAIN inside), the calls wait in
     * the queue, and WRITABLE sends them on. All complete once, intact. */
    enum { N = 256 };
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG, .credits = N};
    static struct rec r[N];
    uint8_t *req = calloc(N, MAX_MSG);

    ck_assert(req);
    pair_open(&cfg, &cfg);
    ck_assert_uint_eq(tern_session_credits(sess), N);
    total_runs = 0;
    for (int i = 0; i < N; i++) {
        uint8_t *p = req + (size_t)i * MAX_MSG;

        for (size_t j = 0; j < MAX_MSG; j += 512)
            p[j] = (uint8_t)(i + j / 512);
        memcpy(p, &i, sizeof(i));
        rec_init(&r[i], MAX_MSG);
        ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, p, MAX_MSG, 0, rec_cont, &r[i], NULL),
                         0);
    }
    ck_assert_msg(poll_until(&total_runs, N, 30000), "%d of %d calls completed", total_runs,
                  N);
    poll_for(20);
    ck_assert_int_eq(total_runs, N);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(r[i].runs == 1 && r[i].status == 0, "call %d: %d runs, %s", i,
                      r[i].runs, tern_err_name(r[i].status));
        ck_assert_uint_eq(r[i].len, MAX_MSG);
        ck_assert_msg(memcmp(r[i].buf, req + (size_t)i * MAX_MSG, MAX_MSG) == 0,
                      "call %d: wrong payload", i);
        free(r[i].buf);
    }
    free(req);
    pair_close();
}
END_TEST

/* ---- errors and addresses ---- */

START_TEST(strerror_for_used_codes)
{
    static const int codes[] = {
        TERN_EEXIST, TERN_EINVAL, TERN_EMSGSIZE, TERN_ENOSERVICE, TERN_ENOMETHOD,
        TERN_ENOENT, TERN_EHANDLER, TERN_EIO, TERN_ENOBUFS, TERN_ECANCELED,
        TERN_ETIMEDOUT, TERN_ECONNREFUSED, TERN_ECONNRESET, TERN_EBADADDR,
        TERN_ENOFABRIC, TERN_EPROTO, TERN_ENOTCONN, TERN_ENOMEM, TERN_EVERSION,
    };

    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        const char *s = tern_strerror(codes[i]), *name = tern_err_name(codes[i]);

        ck_assert_msg(s && *s, "no text for %d", codes[i]);
        ck_assert_msg(name && strcmp(name, "TERN_UNKNOWN") != 0, "no name for %d", codes[i]);
        for (size_t j = 0; j < i; j++)
            ck_assert_msg(strcmp(s, tern_strerror(codes[j])) != 0, "%s and %s share a text",
                          name, tern_err_name(codes[j]));
    }
}
END_TEST

START_TEST(connect_refused)
{
    struct tern_rpc_ep *ep;
    struct tern_session *s = (struct tern_session *)&s;
    int rc;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    rc = tern_rpc_connect(ep, "tcp://127.0.0.1:1", 2 * SEC, &s);
    ck_assert_msg(rc == TERN_ECONNREFUSED, "got %s", tern_err_name(rc));
    ck_assert_ptr_null(s);
    tern_rpc_close(ep);
}
END_TEST

START_TEST(connect_bad_uris)
{
    static const struct {
        const char *uri;
        int want;
    } cases[] = {
        {"nope", TERN_EBADADDR},
        {"tcp://", TERN_EBADADDR},
        {"://127.0.0.1:1", TERN_EBADADDR},
        {"zzz://x:1", TERN_ENOFABRIC},
        {"tcp://127.0.0.1", TERN_EBADADDR},         /* no port */
        {"tcp://127.0.0.1:port", TERN_EBADADDR},
        {"tcp://127.0.0.1:", TERN_EBADADDR},
        {NULL, TERN_EBADADDR},
    };
    struct tern_session *s;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc;

        s = (struct tern_session *)&s;
        rc = tern_rpc_connect(cli, cases[i].uri, SEC, &s);
        ck_assert_msg(rc == cases[i].want, "\"%s\": got %s, want %s",
                      cases[i].uri ? cases[i].uri : "(null)", tern_err_name(rc),
                      tern_err_name(cases[i].want));
        ck_assert_ptr_null(s);
    }
    /* None of it hurt the endpoint. */
    expect_echo(12);
    ck_assert_int_eq(connect_inproc(cli, uri, &s), 0);
    tern_rpc_disconnect(s);
}
END_TEST

START_TEST(listen_bad_uris)
{
    char bound[64];

    ck_assert_int_eq(tern_rpc_listen(srv, "nope", bound, sizeof(bound)), TERN_EBADADDR);
    ck_assert_int_eq(tern_rpc_listen(srv, "zzz://127.0.0.1:0", bound, sizeof(bound)),
                     TERN_ENOFABRIC);
    /* The port the server already has. */
    ck_assert_int_eq(tern_rpc_listen(srv, uri, bound, sizeof(bound)), TERN_EADDRINUSE);
}
END_TEST

/* ---- size limits the peer announced ---- */

START_TEST(reply_over_client_max_msg)
{
    /* The client takes 4 KiB and says so in HELLO; the server's limit is
     * 64 KiB. A handler that builds an 8 KiB reply must fail that call, not
     * the session: the client's transport would refuse the frame and take
     * every call of the session down with it. */
    struct tern_rpc_config ccfg = {.max_msg = 4096};
    uint32_t want = 8192;
    struct rec r;

    pair_open(NULL, &ccfg);
    rec_init(&r, 0);
    call_wait(SVC, M_BIG, &want, sizeof(want), 0, &r);
    ck_assert_msg(r.status < 0, "an oversized reply came back with status 0");
    ck_assert_msg(tern_session_status(sess) == 0,
                  "one oversized reply killed the session (%s)",
                  tern_err_name(tern_session_status(sess)));
    expect_echo(100);
    pair_close();
}
END_TEST

START_TEST(request_over_server_max_msg)
{
    /* The server takes 4 KiB and says so in HELLO_ACK; the client allows
     * 64 KiB. The client knows the server's limit, so an 8 KiB request
     * should be refused at tern_call (TERN_EMSGSIZE) rather than sent and
     * the session lost. */
    struct tern_rpc_config scfg = {.max_msg = 4096};
    static uint8_t big[8192];
    struct rec r;
    int rc;

    pair_open(&scfg, NULL);
    rec_init(&r, 0);
    rc = tern_call(sess, SVC, M_ECHO, big, sizeof(big), 0, rec_cont, &r, NULL);
    if (rc == 0) {
        ck_assert(poll_until(&r.runs, 1, WAIT_MS));
        rc = r.status;
    }
    ck_assert_msg(rc == TERN_EMSGSIZE, "request over the server's limit: %s",
                  tern_err_name(rc));
    ck_assert_msg(tern_session_status(sess) == 0, "the session died (%s)",
                  tern_err_name(tern_session_status(sess)));
    expect_echo(100);
    pair_close();
}
END_TEST

/* ---- gathered requests (tern_callv) ---- */

/* Pieces for tern_callv: `n` iovecs over separate buffers, each with its
 * own byte pattern, and the request the handler should see (their
 * concatenation) in `want`. A length of 0 with `null_empty` gives the piece
 * a NULL base, which is allowed for an empty piece. */
struct gather {
    struct iovec iov[TERN_CALL_IOV_MAX + 1];
    uint8_t *bufs[TERN_CALL_IOV_MAX + 1];
    unsigned n;
    uint8_t *want;
    size_t len;
};

static void gather_make(struct gather *g, unsigned n, const size_t *lens, bool null_empty,
                        uint8_t seed)
{
    size_t at = 0;

    ck_assert(n <= TERN_CALL_IOV_MAX + 1);
    *g = (struct gather){.n = n};
    for (unsigned i = 0; i < n; i++)
        g->len += lens[i];
    g->want = malloc(g->len ? g->len : 1);
    ck_assert(g->want);
    for (unsigned i = 0; i < n; i++) {
        if (!lens[i] && null_empty) {
            g->iov[i] = (struct iovec){.iov_base = NULL, .iov_len = 0};
            continue;
        }
        g->bufs[i] = malloc(lens[i] ? lens[i] : 1);
        ck_assert(g->bufs[i]);
        for (size_t j = 0; j < lens[i]; j++)
            g->bufs[i][j] = (uint8_t)(seed + 61 * i + 7 * j + (j >> 8));
        memcpy(g->want + at, g->bufs[i], lens[i]);
        at += lens[i];
        g->iov[i] = (struct iovec){.iov_base = g->bufs[i], .iov_len = lens[i]};
    }
}

static void gather_free(struct gather *g)
{
    for (unsigned i = 0; i < TERN_CALL_IOV_MAX + 1; i++)
        free(g->bufs[i]);
    free(g->want);
}

/* The echo of a gathered request is the concatenation, byte for byte. */
static void expect_gathered(const struct rec *r, const struct gather *g, const char *what)
{
    ck_assert_msg(r->runs == 1, "%s: continuation ran %d times", what, r->runs);
    ck_assert_msg(r->status == 0, "%s: %s", what, tern_err_name(r->status));
    ck_assert_msg(r->len == g->len, "%s: handler got %zu bytes, want %zu", what, r->len,
                  g->len);
    if (g->len)
        ck_assert_msg(memcmp(r->buf, g->want, g->len) == 0,
                      "%s: the request is not the concatenation of its pieces", what);
}

START_TEST(callv_gathers_pieces)
{
    static const struct {
        unsigned n;
        size_t lens[TERN_CALL_IOV_MAX];
        bool null_empty;
    } cases[] = {
        {0, {0}, false},                /* no pieces: an empty request */
        {1, {5}, false},
        {1, {0}, true},                 /* one empty piece with no buffer */
        {2, {3, 200}, false},
        {2, {4096, 1}, false},
        {3, {0, 17, 1}, false},         /* an empty piece with a buffer */
        {3, {9, 0, 9}, true},           /* ... and one without, in the middle */
        {4, {64, 0, 1, 100}, true},
        {4, {1, 2, 3, 4}, false},
        {4, {0, 0, 0, 0}, false},
        {4, {1000, 3000, 5, 20000}, false},
    };
    const unsigned n_cases = sizeof(cases) / sizeof(cases[0]);

    for (unsigned i = 0; i < n_cases; i++) {
        struct gather g;
        struct rec r;
        char what[32];
        int rc;

        snprintf(what, sizeof(what), "case %u (%u pieces)", i, cases[i].n);
        gather_make(&g, cases[i].n, cases[i].lens, cases[i].null_empty, (uint8_t)(i * 13));
        rec_init(&r, g.len + 1);
        rc = tern_callv(sess, SVC, M_ECHO, g.n ? g.iov : NULL, g.n, 0, rec_cont, &r, NULL);
        ck_assert_msg(rc == 0, "%s: tern_callv: %s", what, tern_err_name(rc));
        ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "%s: never completed", what);
        expect_gathered(&r, &g, what);
        free(r.buf);
        gather_free(&g);
    }
    ck_assert_int_eq(server_runs, (int)n_cases);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
}
END_TEST

/* A refused tern_callv: nothing reaches the server and no continuation runs. */
static void expect_callv_refused(const struct iovec *iov, unsigned n, int want, const char *what)
{
    int runs = server_runs;
    struct rec r;
    int rc;

    rec_init(&r, 0);
    rc = tern_callv(sess, SVC, M_ECHO, iov, n, 0, rec_cont, &r, NULL);
    ck_assert_msg(rc == want, "%s: got %s, want %s", what, tern_err_name(rc),
                  tern_err_name(want));
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    poll_for(50);
    ck_assert_msg(r.runs == 0, "%s: a refused call ran its continuation", what);
    ck_assert_msg(server_runs == runs, "%s: the server ran a refused call", what);
}

START_TEST(callv_limits)
{
    /* Pieces that add up to exactly the limit go through; one byte more is
     * TERN_EMSGSIZE; one piece more than TERN_CALL_IOV_MAX is TERN_EINVAL. */
    const size_t q = MAX_MSG / TERN_CALL_IOV_MAX;
    const size_t exact[TERN_CALL_IOV_MAX] = {q, q, q, MAX_MSG - 3 * q};
    const size_t over[TERN_CALL_IOV_MAX] = {q, q + 1, q, MAX_MSG - 3 * q};
    const size_t five[TERN_CALL_IOV_MAX + 1] = {1, 1, 1, 1, 1};
    struct gather g;
    struct iovec bad;
    struct rec r;

    _Static_assert(TERN_CALL_IOV_MAX == 4, "the tables above have 4 pieces");
    gather_make(&g, TERN_CALL_IOV_MAX + 1, five, false, 1);
    expect_callv_refused(g.iov, TERN_CALL_IOV_MAX + 1, TERN_EINVAL, "5 pieces");
    expect_callv_refused(g.iov, UINT32_MAX, TERN_EINVAL, "UINT_MAX pieces");
    gather_free(&g);

    gather_make(&g, TERN_CALL_IOV_MAX, over, false, 2);
    ck_assert_uint_eq(g.len, MAX_MSG + 1);
    expect_callv_refused(g.iov, g.n, TERN_EMSGSIZE, "max_msg + 1 bytes");
    gather_free(&g);

    /* Lengths whose sum wraps to 1: refused, never copied. */
    static char byte[2];
    struct iovec wrap[2] = {{.iov_base = byte, .iov_len = SIZE_MAX},
                            {.iov_base = byte, .iov_len = 2}};
    expect_callv_refused(wrap, 2, TERN_EMSGSIZE, "lengths that wrap around");

    expect_callv_refused(NULL, 2, TERN_EINVAL, "NULL iov with 2 pieces");
    bad = (struct iovec){.iov_base = NULL, .iov_len = 3};
    expect_callv_refused(&bad, 1, TERN_EINVAL, "a 3-byte piece with no buffer");

    gather_make(&g, TERN_CALL_IOV_MAX, exact, false, 3);
    ck_assert_uint_eq(g.len, MAX_MSG);
    rec_init(&r, g.len + 1);
    ck_assert_int_eq(tern_callv(sess, SVC, M_ECHO, g.iov, g.n, 0, rec_cont, &r, NULL), 0);
    ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "max_msg in 4 pieces never completed");
    expect_gathered(&r, &g, "max_msg in 4 pieces");
    free(r.buf);
    gather_free(&g);

    ck_assert_int_eq(server_runs, 1);
    expect_echo(8);     /* the session is unharmed */
    ck_assert_int_eq(tern_session_status(sess), 0);
}
END_TEST

START_TEST(callv_over_server_max_msg)
{
    /* The server takes 4 KiB (HELLO_ACK), the client 64 KiB: gathered
     * requests are held to the smaller limit at tern_callv. */
    struct tern_rpc_config scfg = {.max_msg = 4096};
    const size_t exact[TERN_CALL_IOV_MAX] = {1024, 1024, 1024, 1024};
    const size_t over[TERN_CALL_IOV_MAX] = {1024, 1024, 1025, 1024};
    struct gather g;
    struct rec r;

    pair_open(&scfg, NULL);
    gather_make(&g, TERN_CALL_IOV_MAX, over, false, 4);
    expect_callv_refused(g.iov, g.n, TERN_EMSGSIZE, "4097 bytes to a 4 KiB server");
    gather_free(&g);

    gather_make(&g, TERN_CALL_IOV_MAX, exact, false, 5);
    rec_init(&r, g.len + 1);
    ck_assert_int_eq(tern_callv(sess, SVC, M_ECHO, g.iov, g.n, 0, rec_cont, &r, NULL), 0);
    ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "4096 bytes never completed");
    expect_gathered(&r, &g, "4096 bytes to a 4 KiB server");
    free(r.buf);
    gather_free(&g);
    ck_assert_int_eq(tern_session_status(sess), 0);
    pair_close();
}
END_TEST

START_TEST(callv_queued_keeps_pieces)
{
    /* With one credit, gathered calls wait in the queue and are copied into
     * the send buffer later. Only the pieces must outlive the call (the KV
     * client passes an iovec array on its stack): the array is reused for
     * every call and wiped before any of them is sent. */
    enum { N = 6 };
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .credits = 1};
    const size_t lens[N][TERN_CALL_IOV_MAX] = {
        {100, 2, 0, 7}, {1, 1, 1, 1}, {0, 300, 0, 5}, {4000, 1, 2, 3}, {9, 8, 7, 6}, {0, 0, 0, 1},
    };
    struct gather g[N];
    struct rec r[N];
    struct iovec shared[TERN_CALL_IOV_MAX];

    pair_open(NULL, &ccfg);
    ck_assert_uint_eq(tern_session_credits(sess), 1);
    for (int i = 0; i < N; i++) {
        gather_make(&g[i], TERN_CALL_IOV_MAX, lens[i], true, (uint8_t)(40 + i));
        rec_init(&r[i], g[i].len + 1);
        memcpy(shared, g[i].iov, sizeof(shared));
        ck_assert_int_eq(tern_callv(sess, SVC, M_ECHO, shared, TERN_CALL_IOV_MAX, 0, rec_cont,
                                    &r[i], NULL),
                         0);
        memset(shared, 0xEE, sizeof(shared));   /* garbage if tern_callv kept a pointer */
    }
    ck_assert_msg(server_runs == 0, "the server ran calls nobody polled it for");
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), N);
    total_runs = 0;
    ck_assert_msg(poll_until(&total_runs, N, WAIT_MS), "queued gathered calls never completed");
    for (int i = 0; i < N; i++) {
        char what[32];

        snprintf(what, sizeof(what), "queued call %d", i);
        expect_gathered(&r[i], &g[i], what);
        free(r[i].buf);
        gather_free(&g[i]);
    }
    ck_assert_int_eq(server_runs, N);
    pair_close();
}
END_TEST

/* ---- the largest reply (tern_reply_max) ---- */

#define SVC_LIMITS 30
enum {
    ML_MAX = 0,     /* reply = tern_reply_max() as a uint64_t */
    ML_FILL = 1,    /* request: int32 delta; reply: tern_reply_max() + delta bytes */
};

static int fill_refused;    /* ML_FILL calls whose tern_reply_alloc gave NULL */

static uint8_t fill_byte(size_t i)
{
    return (uint8_t)(i * 131 + (i >> 10) + 1);
}

static int h_reply_max(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint64_t m = tern_reply_max(req);
    void *out = tern_reply_alloc(req, sizeof(m));

    server_runs++;
    if (!out)
        return TERN_ENOMEM;
    memcpy(out, &m, sizeof(m));
    return 0;
}

static int h_fill(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    int32_t delta;
    size_t n;
    uint8_t *out;

    server_runs++;
    if (len != sizeof(delta))
        return TERN_EINVAL;
    memcpy(&delta, data, sizeof(delta));
    n = tern_reply_max(req) + (size_t)(ptrdiff_t)delta;
    out = tern_reply_alloc(req, n);
    if (!out) {
        fill_refused++;
        return TERN_EMSGSIZE;   /* what rpc.h says a handler does then */
    }
    for (size_t i = 0; i < n; i++)
        out[i] = fill_byte(i);
    return 0;
}

static const struct tern_method limit_methods[] = {
    {.id = ML_MAX, .name = "reply_max", .handler = h_reply_max},
    {.id = ML_FILL, .name = "fill", .handler = h_fill},
};

static const struct tern_service limit_service = {
    .name = "limits", .id = SVC_LIMITS, .methods = limit_methods,
    .n_methods = sizeof(limit_methods) / sizeof(limit_methods[0]),
};

/* A reply of tern_reply_max() + delta bytes: its status, and the payload
 * checked when it came. */
static int fill_call(int32_t delta, size_t max)
{
    size_t want = max + (size_t)(ptrdiff_t)delta;
    struct rec r;
    int status;

    rec_init(&r, want + 1);
    call_wait(SVC_LIMITS, ML_FILL, &delta, sizeof(delta), 0, &r);
    status = r.status;
    if (status == 0) {
        ck_assert_msg(r.len == want, "delta %d: reply of %zu bytes, want %zu", delta, r.len,
                      want);
        for (size_t i = 0; i < want; i++)
            if (r.buf[i] != fill_byte(i))
                ck_abort_msg("delta %d: reply byte %zu differs", delta, i);
    } else {
        ck_assert_msg(r.reply_null && r.len == 0, "delta %d: an error came with a reply",
                      delta);
    }
    free(r.buf);
    return status;
}

/* Server max_msg, client max_msg (0: the 1 MiB default), and what
 * tern_reply_max() must say: the smaller of the two. */
static const struct {
    size_t srv, cli, want;
} reply_max_cases[] = {
    {MAX_MSG, MAX_MSG, MAX_MSG},
    {MAX_MSG, 4096, 4096},          /* the client's HELLO lowers it */
    {4096, MAX_MSG, 4096},          /* the server's own limit */
    {0, 0, 1u << 20},               /* both default */
    {0, 100000, 100000},
};

START_TEST(reply_max_limits)
{
    struct tern_rpc_config scfg = {.max_msg = reply_max_cases[_i].srv};
    struct tern_rpc_config ccfg = {.max_msg = reply_max_cases[_i].cli};
    size_t want = reply_max_cases[_i].want;
    uint64_t seen = 0;
    struct rec r;
    int rc;

    pair_open(&scfg, &ccfg);
    ck_assert_int_eq(tern_rpc_register(srv, &limit_service), 0);
    fill_refused = 0;

    rec_init(&r, sizeof(seen));
    call_wait(SVC_LIMITS, ML_MAX, NULL, 0, 0, &r);
    ck_assert_msg(r.status == 0 && r.len == sizeof(seen), "reply_max: %s",
                  tern_err_name(r.status));
    memcpy(&seen, r.buf, sizeof(seen));
    free(r.buf);
    ck_assert_msg(seen == want, "server %zu, client %zu: tern_reply_max %llu, want %zu",
                  reply_max_cases[_i].srv, reply_max_cases[_i].cli, (unsigned long long)seen,
                  want);

    /* Exactly the maximum goes through; one byte more is refused by
     * tern_reply_alloc and the call (only it) fails with TERN_EMSGSIZE. */
    rc = fill_call(0, want);
    ck_assert_msg(rc == 0, "a reply of tern_reply_max() bytes: %s", tern_err_name(rc));
    ck_assert_int_eq(fill_refused, 0);
    rc = fill_call(1, want);
    ck_assert_msg(rc == TERN_EMSGSIZE, "a reply one byte over tern_reply_max(): %s",
                  tern_err_name(rc));
    ck_assert_msg(fill_refused == 1, "tern_reply_alloc gave one byte over the maximum");
    ck_assert_msg(tern_session_status(sess) == 0, "the session died (%s)",
                  tern_err_name(tern_session_status(sess)));

    /* The server goes on serving, at the limit too. */
    expect_echo(100);
    ck_assert_int_eq(fill_call(-1, want), 0);
    ck_assert_int_eq(fill_call(0, want), 0);
    ck_assert_int_eq(fill_refused, 1);
    ck_assert_int_eq(server_runs, 6);
    pair_close();
}
END_TEST

/* ---- sleeping in the application's own loop (tern_rpc_wait_fd/arm) ---- */

/* Does `fd` poll readable within `ms`? */
static bool fd_readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;

    do
        n = poll(&p, 1, ms);
    while (n < 0 && errno == EINTR);
    ck_assert_msg(n >= 0, "poll: %s", strerror(errno));
    return n == 1 && (p.revents & POLLIN);
}

/* Both ends idle: nothing owed, and their fds stay quiet. */
static void expect_idle(int sfd, int cfd, const char *when)
{
    ck_assert_msg(tern_rpc_arm(srv) == 0, "%s: server arm says work is pending", when);
    ck_assert_msg(tern_rpc_arm(cli) == 0, "%s: client arm says work is pending", when);
    ck_assert_msg(!fd_readable(sfd, 50), "%s: the server's fd is readable", when);
    ck_assert_msg(!fd_readable(cfd, 50), "%s: the client's fd is readable", when);
}

START_TEST(wait_fd_before_listen)
{
    struct tern_rpc_ep *ep;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(tern_rpc_wait_fd(ep), -1);
    tern_rpc_close(ep);
}
END_TEST

START_TEST(wait_fd_wakes_on_request)
{
    int sfd = tern_rpc_wait_fd(srv), cfd = tern_rpc_wait_fd(cli);
    double end;
    struct rec r;

    /* After a listen (server) and a connect (client), there is an fd. */
    ck_assert_msg(sfd >= 0, "server wait fd %d", sfd);
    ck_assert_msg(cfd >= 0, "client wait fd %d", cfd);
    ck_assert_int_eq(tern_rpc_wait_fd(srv), sfd);
    expect_idle(sfd, cfd, "after connect");

    /* A request makes the server's fd readable; nobody polls the server
     * meanwhile. */
    rec_init(&r, 16);
    ck_assert_int_eq(tern_call(sess, SVC, M_ECHO, "ping", 4, 0, rec_cont, &r, NULL), 0);
    ck_assert_msg(fd_readable(sfd, WAIT_MS), "a request did not make the server's fd readable");
    ck_assert_int_eq(r.runs, 0);

    /* The server handles it; its reply makes the client's fd readable. */
    end = now_ms() + WAIT_MS;
    while (server_runs == 0 && now_ms() < end)
        tern_rpc_poll(srv);
    ck_assert_int_eq(server_runs, 1);
    ck_assert_msg(fd_readable(cfd, WAIT_MS), "a reply did not make the client's fd readable");
    ck_assert(test_rpc_poll_until(cli, &r.runs, 1, WAIT_MS));
    ck_assert_int_eq(r.status, 0);
    ck_assert_uint_eq(r.len, 4);
    ck_assert(memcmp(r.buf, "ping", 4) == 0);
    free(r.buf);

    /* All done: safe to sleep again, and nothing wakes either end. */
    expect_idle(sfd, cfd, "after the call");
}
END_TEST

/* A continuation that starts `n` echo calls inside the client's poll, so
 * that they leave in one write at the end of that poll and reach the server
 * together. */
struct burst {
    int n;
    struct rec *recs;
    const int *ids;     /* the requests: they must outlive the calls */
    bool started;
    int failed;     /* tern_call errors */
};

static void burst_cont(void *arg, int status, const void *reply, size_t len)
{
    struct burst *b = arg;

    b->started = true;
    for (int i = 0; i < b->n; i++)
        if (tern_call(sess, SVC, M_ECHO, &b->ids[i], sizeof(b->ids[i]), 0, rec_cont, &b->recs[i],
                      NULL) < 0)
            b->failed++;
}

START_TEST(wait_arm_reports_owed_events)
{
    /* More requests than one poll hands out arrive at once: the server
     * reads them all, serves one batch, and holds the rest. Its fd says
     * nothing about those; tern_rpc_arm() must (TERN_EAGAIN: poll again). Polling
     * only while arm says 1 must serve every request. */
    enum { N = 100 };
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG, .credits = 128};
    struct rec recs[N];
    int ids[N];
    struct burst b = {.n = N, .recs = recs, .ids = ids};
    int sfd, cfd, n, polls = 0;
    double end;

    pair_open(&cfg, &cfg);
    ck_assert_uint_ge(tern_session_credits(sess), N);
    sfd = tern_rpc_wait_fd(srv);
    cfd = tern_rpc_wait_fd(cli);
    ck_assert(sfd >= 0 && cfd >= 0);
    for (int i = 0; i < N; i++) {
        rec_init(&recs[i], sizeof(int));
        ids[i] = i;
    }

    /* An empty call whose continuation starts the burst. */
    ck_assert_int_eq(tern_call(sess, SVC, M_EMPTY, NULL, 0, 0, burst_cont, &b, NULL), 0);
    ck_assert_msg(fd_readable(sfd, WAIT_MS), "the first request did not wake the server");
    end = now_ms() + WAIT_MS;
    while (server_runs == 0 && now_ms() < end)
        tern_rpc_poll(srv);
    ck_assert_int_eq(server_runs, 1);
    ck_assert_msg(fd_readable(cfd, WAIT_MS), "the reply did not wake the client");
    while (!b.started && now_ms() < end)
        tern_rpc_poll(cli);
    ck_assert_msg(b.started, "the first call never completed");
    ck_assert_int_eq(b.failed, 0);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), N);
    server_runs = 0;

    ck_assert_msg(fd_readable(sfd, WAIT_MS), "the burst did not wake the server");
    n = tern_rpc_poll(srv);
    ck_assert_msg(n > 0 && n < N, "one poll handed out %d of %d requests", n, N);
    ck_assert_int_eq(server_runs, n);
    ck_assert_msg(tern_rpc_arm(srv) == TERN_EAGAIN, "%d requests are owed and arm says sleep",
                  N - server_runs);

    /* Poll while arm says so: no request may be stranded. */
    while (tern_rpc_arm(srv) == TERN_EAGAIN) {
        ck_assert_msg(++polls < 10 * N, "arm keeps saying work is pending");
        tern_rpc_poll(srv);
    }
    ck_assert_msg(server_runs == N, "arm said sleep with %d of %d requests served",
                  server_runs, N);

    total_runs = 0;
    ck_assert(poll_until(&total_runs, N, WAIT_MS));
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(recs[i].status, 0);
        ck_assert_uint_eq(recs[i].len, sizeof(int));
        ck_assert(memcmp(recs[i].buf, &i, sizeof(int)) == 0);
        free(recs[i].buf);
    }
    expect_idle(sfd, cfd, "after the burst");
    pair_close();
}
END_TEST

/* Poll the server, the client and `other` until *counter reaches want. */
static bool poll_three_until(struct tern_rpc_ep *other, const int *counter, int want, int ms)
{
    double end = now_ms() + ms;

    while (*counter < want) {
        if (now_ms() > end)
            return false;
        poll_both();
        tern_rpc_poll(other);
    }
    return true;
}

START_TEST(wait_fd_two_fabrics)
{
    /* ternd's set-up: one endpoint listening on tcp and shm. Its wait fd is
     * then one epoll set over both fabrics, and a request on either must
     * wake it (on shm once tern_rpc_arm() has told the peers that the
     * endpoint sleeps). A shm doorbell may keep the fd readable for some
     * polls after its request was served (the fd says "may have work"),
     * but polling must drain it: an endpoint that stays readable with
     * nothing to do would never let its owner sleep. */
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG};
    struct tern_rpc_ep *cli2;
    struct tern_session *s2;
    char shm_uri[128];
    struct rec r;
    int sfd, rc;

    pair_open(NULL, NULL);
    rc = tern_rpc_listen(srv, "shm://auto", shm_uri, sizeof(shm_uri));
    ck_assert_msg(rc == 0, "listen shm: %s", tern_strerror(rc));
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli2), 0);
    rc = connect_inproc(cli2, shm_uri, &s2);
    ck_assert_msg(rc == 0, "connect %s: %s", shm_uri, tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(s2), "shm");
    sfd = tern_rpc_wait_fd(srv);
    ck_assert_msg(sfd >= 0, "server wait fd %d", sfd);

    for (int round = 0; round < 4; round++) {
        struct tern_session *via = round % 2 ? s2 : sess;
        const char *name = round % 2 ? "shm" : "tcp";
        int runs = server_runs;
        double end = now_ms() + WAIT_MS;

        /* Settle: poll until nothing is owed and the fd is quiet. */
        while ((tern_rpc_arm(srv) != 0 || fd_readable(sfd, 0)) && now_ms() < end)
            tern_rpc_poll(srv);
        ck_assert_msg(tern_rpc_arm(srv) == 0, "round %d: arm says work is pending", round);
        ck_assert_msg(!fd_readable(sfd, 50), "round %d: the idle server's fd stays readable",
                      round);

        rec_init(&r, 8);
        ck_assert_int_eq(tern_call(via, SVC, M_ECHO, name, 3, 0, rec_cont, &r, NULL), 0);
        ck_assert_msg(fd_readable(sfd, WAIT_MS), "a request over %s did not wake the server",
                      name);
        end = now_ms() + WAIT_MS;
        while (server_runs == runs && now_ms() < end)
            tern_rpc_poll(srv);
        ck_assert_msg(server_runs == runs + 1, "the %s request was not served", name);
        ck_assert(poll_three_until(cli2, &r.runs, 1, WAIT_MS));
        ck_assert_int_eq(r.status, 0);
        ck_assert(r.len == 3 && memcmp(r.buf, name, 3) == 0);
        free(r.buf);
    }
    tern_rpc_close(cli2);
    pair_close();
}
END_TEST

/* ---- a misbehaving client at the transport level ---- */

struct raw {
    struct tern_tp_ep *tp;
    struct tern_tp_conn *conn;
};

/* Next event of the raw client, one at a time (so none is lost), while both
 * RPC endpoints make progress. */
static bool raw_next(struct raw *rw, struct tern_tp_event *ev, int ms)
{
    double end = now_ms() + ms;

    do {
        int n = tern_tp_poll(rw->tp, ev, 1);

        ck_assert_int_ge(n, 0);
        if (n == 1)
            return true;
        poll_both();
    } while (now_ms() < end);
    return false;
}

static void raw_open(struct raw *rw, size_t max_msg, size_t conn_buf)
{
    struct tern_tp_config cfg = {.fabric = "tcp", .max_msg = max_msg, .conn_buf = conn_buf};
    struct tern_tp_event ev;
    int rc;

    rc = tern_tp_open(&cfg, &rw->tp);
    ck_assert_msg(rc == 0, "tp open: %s", tern_strerror(rc));
    /* uri is "tcp://host:port"; the transport wants "host:port". */
    rc = tern_tp_connect(rw->tp, uri + strlen("tcp://"), &rw->conn);
    ck_assert_msg(rc == 0, "tp connect: %s", tern_strerror(rc));
    ck_assert(raw_next(rw, &ev, WAIT_MS));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert_int_eq(ev.status, 0);
}

static void raw_send_rpc(struct raw *rw, uint8_t type, uint8_t version, uint64_t req_id,
                         const void *body, size_t body_len)
{
    struct rpc_hdr h = {.type = type, .version = version, .svc = SVC, .method = M_ECHO,
                        .req_id = req_id};
    uint8_t *buf;
    int rc = tern_tp_msg_alloc(rw->conn, sizeof(h) + body_len, (void **)&buf);

    ck_assert_msg(rc == 0, "msg_alloc: %s", tern_strerror(rc));
    memcpy(buf, &h, sizeof(h));
    if (body_len)
        memcpy(buf + sizeof(h), body, body_len);
    ck_assert_int_eq(tern_tp_msg_post(rw->conn, buf, sizeof(h) + body_len), 0);
}

static void raw_hello(struct raw *rw, uint32_t magic, uint32_t credits)
{
    struct rpc_hello hello = {.magic = magic, .credits = credits, .max_msg = MAX_MSG};

    raw_send_rpc(rw, RPC_HELLO, RPC_VERSION, 0, &hello, sizeof(hello));
}

/* Wait for HELLO_ACK on the raw connection; returns the credits granted. */
static uint32_t raw_expect_hello_ack(struct raw *rw)
{
    struct tern_tp_event ev;
    struct rpc_hdr h;
    struct rpc_hello ack;

    ck_assert_msg(raw_next(rw, &ev, WAIT_MS), "no HELLO_ACK");
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    /* The fixed part, then the server's advertised fabrics as a
     * NUL-terminated string (empty here: it listens on tcp only). */
    ck_assert_uint_eq(ev.len, sizeof(h) + sizeof(ack) + 1);
    ck_assert_int_eq(((const char *)ev.data)[ev.len - 1], 0);
    memcpy(&h, ev.data, sizeof(h));
    memcpy(&ack, (const uint8_t *)ev.data + sizeof(h), sizeof(ack));
    tern_tp_msg_release(ev.conn, ev.data);
    ck_assert_uint_eq(h.type, RPC_HELLO_ACK);
    ck_assert_uint_eq(h.version, RPC_VERSION);
    ck_assert_uint_eq(ack.magic, RPC_MAGIC);
    ck_assert_uint_eq(ack.max_msg, MAX_MSG);
    return ack.credits;
}

/* The server hangs up on the raw client without answering anything. */
static void raw_expect_hangup(struct raw *rw, const char *what)
{
    struct tern_tp_event ev;

    ck_assert_msg(raw_next(rw, &ev, WAIT_MS), "%s: the server kept the connection", what);
    ck_assert_msg(ev.type == TERN_TP_EV_CLOSED, "%s: got event %d instead of CLOSED", what,
                  ev.type);
    tern_tp_close(rw->tp);
    rw->tp = NULL;
}

enum bad_kind {
    BAD_SHORT, BAD_REQ_BEFORE_HELLO, BAD_MAGIC, BAD_ZERO_CREDITS, BAD_HELLO_LEN,
    BAD_VERSION, BAD_HELLO_TWICE, BAD_RESP_FROM_CLIENT, BAD_ZERO_MAX_MSG, BAD_TYPE,
};

static const char *const bad_names[] = {
    "message shorter than rpc_hdr", "REQ before HELLO", "HELLO with a bad magic",
    "HELLO with zero credits", "HELLO of the wrong size", "RPC version 2",
    "second HELLO", "RESP sent by a client", "HELLO with max_msg 0", "unknown RPC type",
};

START_TEST(server_survives_bad_client)
{
    enum bad_kind kind = (enum bad_kind)_i;
    const char *what = bad_names[kind];
    struct raw rw = {0};
    uint8_t junk[sizeof(struct rpc_hdr) + 32] = {RPC_REQ, RPC_VERSION};
    struct rpc_hello hello = {.magic = RPC_MAGIC, .credits = 4, .max_msg = MAX_MSG};

    expect_echo(10);    /* the good session, before */
    raw_open(&rw, 0, 0);
    switch (kind) {
    case BAD_SHORT:
        ck_assert_int_eq(tern_tp_msg_send(rw.conn, junk, sizeof(struct rpc_hdr) - 1), 0);
        break;
    case BAD_REQ_BEFORE_HELLO:
        raw_send_rpc(&rw, RPC_REQ, RPC_VERSION, 1, "hi", 2);
        break;
    case BAD_MAGIC:
        raw_hello(&rw, RPC_MAGIC ^ 1, 4);
        break;
    case BAD_ZERO_CREDITS:
        raw_hello(&rw, RPC_MAGIC, 0);
        break;
    case BAD_HELLO_LEN:
        raw_send_rpc(&rw, RPC_HELLO, RPC_VERSION, 0, &hello, sizeof(hello) - 1);
        break;
    case BAD_VERSION:
        raw_send_rpc(&rw, RPC_HELLO, RPC_VERSION + 1, 0, &hello, sizeof(hello));
        break;
    case BAD_HELLO_TWICE:
        raw_hello(&rw, RPC_MAGIC, 4);
        ck_assert_uint_eq(raw_expect_hello_ack(&rw), 4);
        raw_hello(&rw, RPC_MAGIC, 4);
        break;
    case BAD_RESP_FROM_CLIENT:
        raw_hello(&rw, RPC_MAGIC, 4);
        ck_assert_uint_eq(raw_expect_hello_ack(&rw), 4);
        raw_send_rpc(&rw, RPC_RESP, RPC_VERSION, 1, NULL, 0);
        break;
    case BAD_ZERO_MAX_MSG:
        hello.max_msg = 0;
        raw_send_rpc(&rw, RPC_HELLO, RPC_VERSION, 0, &hello, sizeof(hello));
        break;
    case BAD_TYPE:
        raw_hello(&rw, RPC_MAGIC, 4);
        ck_assert_uint_eq(raw_expect_hello_ack(&rw), 4);
        raw_send_rpc(&rw, 99, RPC_VERSION, 1, NULL, 0);
        break;
    }
    raw_expect_hangup(&rw, what);
    ck_assert_int_eq(server_runs, 1);   /* nothing of the bad client was served */
    ck_assert_int_eq(tern_session_status(sess), 0);
    expect_echo(11);    /* the good session, after */
    /* And new clients are still welcome. */
    {
        struct tern_session *s2;

        ck_assert_int_eq(connect_inproc(cli, uri, &s2), 0);
        tern_rpc_disconnect(s2);
    }
}
END_TEST

START_TEST(silent_clients_time_out)
{
    /* Connections that never say HELLO hold server sessions. With
     * max_sessions 5, one real session and four silent sockets fill the
     * server, and a fifth client is turned away. The silent ones must be
     * dropped after hello_timeout_ns, not before, and nobody else with them;
     * then new clients get in again. */
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .max_sessions = 5,
                                   .hello_timeout_ns = 1000000000ull};
    struct raw silent[4];
    struct tern_session *s2;
    struct tern_tp_event ev;
    double t0, first = 0;
    int rc;

    pair_open(&scfg, NULL);
    t0 = now_ms();
    for (int i = 0; i < 4; i++) {
        silent[i] = (struct raw){0};
        raw_open(&silent[i], 0, 0);
    }
    poll_for(100);      /* the server has accepted all four */
    rc = connect_inproc_timeout(cli, uri, 2 * SEC, &s2);
    ck_assert_msg(rc < 0, "a sixth session was accepted with max_sessions 5");

    for (int i = 0; i < 4; i++) {
        ck_assert_msg(raw_next(&silent[i], &ev, 5000),
                      "silent connection %d still open %.0f ms after connecting", i,
                      now_ms() - t0);
        ck_assert_msg(ev.type == TERN_TP_EV_CLOSED, "silent connection %d got event %d", i,
                      ev.type);
        if (!first)
            first = now_ms() - t0;
        tern_tp_close(silent[i].tp);
    }
    /* A client gets the whole timeout to say HELLO (100 ms slack for the
     * clock readings around the connects). */
    ck_assert_msg(first >= 900, "a silent client was dropped after %.0f ms, before the "
                  "1000 ms HELLO timeout", first);

    /* The session that did say HELLO is untouched, and there is room again. */
    ck_assert_int_eq(tern_session_status(sess), 0);
    expect_echo(21);
    rc = connect_inproc(cli, uri, &s2);
    ck_assert_msg(rc == 0, "connect after the silent clients were dropped: %s",
                  tern_err_name(rc));
    tern_rpc_disconnect(s2);
    pair_close();
}
END_TEST

/* ---- a misbehaving server, played at the transport level ---- */

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

static void fake_send(struct tern_tp_conn *conn, uint8_t type, uint8_t version,
                      uint64_t req_id, int32_t status, const void *body, size_t len)
{
    struct rpc_hdr h = {.type = type, .version = version, .status = status, .req_id = req_id};
    uint8_t *buf;

    if (tern_tp_msg_alloc(conn, sizeof(h) + len, (void **)&buf) < 0)
        return;     /* the test will notice the missing answer */
    memcpy(buf, &h, sizeof(h));
    if (len)
        memcpy(buf + sizeof(h), body, len);
    tern_tp_msg_post(conn, buf, sizeof(h) + len);
}

static void fake_on_msg(struct fake *f, struct tern_tp_conn *conn, const uint8_t *data,
                        size_t len)
{
    struct rpc_hello ack = {.magic = RPC_MAGIC, .credits = 4, .max_msg = MAX_MSG};
    struct rpc_hdr h;

    if (len < sizeof(h))
        return;
    memcpy(&h, data, sizeof(h));
    if (h.type == RPC_HELLO) {
        switch (f->mode) {
        case F_ACK_BAD_MAGIC: ack.magic ^= 1; break;
        case F_ACK_ZERO_CREDITS: ack.credits = 0; break;
        case F_ACK_ZERO_MAX_MSG: ack.max_msg = 0; break;
        case F_ACK_SHORT:
            fake_send(conn, RPC_HELLO_ACK, RPC_VERSION, 0, 0, &ack, sizeof(ack) - 4);
            return;
        case F_RESP_FIRST:
            fake_send(conn, RPC_RESP, RPC_VERSION, 0, 0, NULL, 0);
            return;
        case F_HANGUP:
            tern_tp_disconnect(conn);
            return;
        case F_SILENT:
            return;
        case F_ACK_VERSION:
            fake_send(conn, RPC_HELLO_ACK, RPC_VERSION + 1, 0, 0, &ack, sizeof(ack));
            return;
        default: break;
        }
        fake_send(conn, RPC_HELLO_ACK, RPC_VERSION, 0, 0, &ack, sizeof(ack));
        return;
    }
    if (h.type != RPC_REQ)
        return;
    switch (f->mode) {
    case F_REQ_POSITIVE_STATUS:
        fake_send(conn, RPC_RESP, RPC_VERSION, h.req_id, 3, NULL, 0);
        break;
    case F_REQ_SHORT:
        fake_send(conn, RPC_RESP, RPC_VERSION, h.req_id, 0, NULL, 0);
        /* ...and then a message shorter than any header */
        tern_tp_msg_send(conn, "short", 5);
        break;
    case F_REQ_SECOND_ACK:
        fake_send(conn, RPC_HELLO_ACK, RPC_VERSION, 0, 0, &ack, sizeof(ack));
        break;
    case F_REQ_UNKNOWN_ID_FIRST:
        fake_send(conn, RPC_RESP, RPC_VERSION, h.req_id + 0x1234567ull, 0, "bogus", 5);
        fake_send(conn, RPC_RESP, RPC_VERSION, h.req_id ^ (1ull << 40), 0, "stale", 5);
        fake_send(conn, RPC_RESP, RPC_VERSION, h.req_id, 0, data + sizeof(h), len - sizeof(h));
        break;
    case F_REQ_ERROR_WITH_BODY:
        fake_send(conn, RPC_RESP, RPC_VERSION, h.req_id, TERN_ENOENT, "extra", 5);
        break;
    default:
        break;
    }
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;

    while (!atomic_load(&f->stop)) {
        struct tern_tp_event ev;

        if (tern_tp_poll(f->tp, &ev, 1) != 1)
            continue;
        if (ev.type == TERN_TP_EV_RECV) {
            /* Copy first: F_HANGUP frees the connection under the view. */
            uint8_t copy[256];
            size_t n = ev.len < sizeof(copy) ? ev.len : sizeof(copy);

            memcpy(copy, ev.data, n);
            tern_tp_msg_release(ev.conn, ev.data);
            fake_on_msg(f, ev.conn, copy, n);
        } else if (ev.type == TERN_TP_EV_CLOSED) {
            tern_tp_disconnect(ev.conn);
        }
    }
    return NULL;
}

static void fake_start(struct fake *f, enum fake_mode mode)
{
    struct tern_tp_config cfg = {.fabric = "tcp", .max_msg = MAX_MSG + sizeof(struct rpc_hdr)};
    char bound[96];

    f->mode = mode;
    atomic_init(&f->stop, false);
    ck_assert_int_eq(tern_tp_open(&cfg, &f->tp), 0);
    ck_assert_int_eq(tern_tp_listen(f->tp, "127.0.0.1:0", bound, sizeof(bound)), 0);
    snprintf(f->uri, sizeof(f->uri), "tcp://%s", bound);
    ck_assert_int_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(struct fake *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    tern_tp_close(f->tp);
}

START_TEST(hostile_server_handshake)
{
    static const struct {
        enum fake_mode mode;
        int want;
        const char *what;
    } cases[] = {
        {F_ACK_BAD_MAGIC, TERN_EPROTO, "HELLO_ACK with a bad magic"},
        {F_ACK_ZERO_CREDITS, TERN_EPROTO, "HELLO_ACK granting 0 credits"},
        {F_ACK_ZERO_MAX_MSG, TERN_EPROTO, "HELLO_ACK with max_msg 0"},
        {F_ACK_SHORT, TERN_EPROTO, "short HELLO_ACK"},
        {F_RESP_FIRST, TERN_EPROTO, "RESP before HELLO_ACK"},
        {F_HANGUP, TERN_ECONNRESET, "hang-up on HELLO"},
        {F_SILENT, TERN_ETIMEDOUT, "no answer to HELLO"},
    };
    struct tern_rpc_ep *ep;
    struct fake f;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct tern_session *s = (struct tern_session *)&s;
        double t0;
        int rc;

        fake_start(&f, cases[i].mode);
        t0 = now_ms();
        rc = tern_rpc_connect(ep, f.uri, 200 * 1000000ull, &s);
        ck_assert_msg(rc == cases[i].want, "%s: connect returned %s, want %s", cases[i].what,
                      tern_err_name(rc), tern_err_name(cases[i].want));
        ck_assert_ptr_null(s);
        if (cases[i].mode == F_SILENT)
            ck_assert_msg(now_ms() - t0 >= 190 && now_ms() - t0 < 2000,
                          "200 ms connect timeout took %.0f ms", now_ms() - t0);
        fake_stop(&f);
    }
    ck_assert_uint_eq(tern_rpc_calls_in_flight(ep), 0);
    tern_rpc_close(ep);
}
END_TEST

START_TEST(connect_to_other_rpc_version)
{
    /* rpc.h lists TERN_EVERSION among tern_rpc_connect's errors, and the
     * error table has "peer speaks an incompatible protocol version" for
     * exactly this: a server that answers in RPC version 2. */
    struct tern_rpc_ep *ep;
    struct tern_session *s = NULL;
    struct fake f;
    int rc;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    fake_start(&f, F_ACK_VERSION);
    rc = tern_rpc_connect(ep, f.uri, SEC, &s);
    fake_stop(&f);
    ck_assert_msg(rc == TERN_EVERSION, "connect to an RPC v%d server: %s, want TERN_EVERSION",
                  RPC_VERSION + 1, tern_err_name(rc));
    tern_rpc_close(ep);
}
END_TEST

START_TEST(hostile_server_replies)
{
    static const struct {
        enum fake_mode mode;
        int want;           /* the call's status */
        bool session_dies;
        const char *what;
    } cases[] = {
        {F_REQ_POSITIVE_STATUS, TERN_EPROTO, true, "RESP with a positive status"},
        {F_REQ_SECOND_ACK, TERN_EPROTO, true, "second HELLO_ACK"},
        {F_REQ_UNKNOWN_ID_FIRST, 0, false, "replies to unknown ids first"},
        {F_REQ_ERROR_WITH_BODY, TERN_ENOENT, false, "error status with a body"},
    };
    struct tern_rpc_ep *ep;
    struct fake f;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct tern_session *s;
        struct rec r;
        uint64_t id;
        int rc;

        fake_start(&f, cases[i].mode);
        rc = tern_rpc_connect(ep, f.uri, 2 * SEC, &s);
        ck_assert_msg(rc == 0, "%s: connect %s", cases[i].what, tern_err_name(rc));
        rec_init(&r, 16);
        ck_assert_int_eq(tern_call(s, SVC, M_ECHO, "hello", 5, 2 * SEC, rec_cont, &r, &id), 0);
        for (double end = now_ms() + WAIT_MS; r.runs == 0 && now_ms() < end;)
            tern_rpc_poll(ep);
        ck_assert_msg(r.runs == 1, "%s: continuation ran %d times", cases[i].what, r.runs);
        ck_assert_msg(r.status == cases[i].want, "%s: call ended with %s, want %s",
                      cases[i].what, tern_err_name(r.status), tern_err_name(cases[i].want));
        if (r.status == 0) {
            ck_assert_uint_eq(r.len, 5);
            ck_assert_mem_eq(r.buf, "hello", 5);
        } else {
            ck_assert_msg(r.reply_null && r.len == 0, "%s: an error came with a payload",
                          cases[i].what);
        }
        if (cases[i].session_dies) {
            ck_assert_msg(tern_session_status(s) < 0, "%s: session still usable",
                          cases[i].what);
            ck_assert_msg(tern_call(s, SVC, M_ECHO, "x", 1, 0, rec_cont, &r, NULL) < 0,
                          "%s: call accepted on a dead session", cases[i].what);
        } else {
            ck_assert_msg(tern_session_status(s) == 0, "%s: session died (%s)", cases[i].what,
                          tern_err_name(tern_session_status(s)));
        }
        tern_rpc_disconnect(s);
        fake_stop(&f);
        free(r.buf);
    }
    tern_rpc_close(ep);
}
END_TEST

START_TEST(hostile_server_short_message)
{
    /* A good reply, then a message shorter than rpc_hdr: the call already
     * completed stays completed, the session dies with EPROTO. */
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct rec r;
    struct fake f;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    fake_start(&f, F_REQ_SHORT);
    ck_assert_int_eq(tern_rpc_connect(ep, f.uri, 2 * SEC, &s), 0);
    rec_init(&r, 0);
    ck_assert_int_eq(tern_call(s, SVC, M_ECHO, NULL, 0, 2 * SEC, rec_cont, &r, NULL), 0);
    for (double end = now_ms() + WAIT_MS; tern_session_status(s) == 0 && now_ms() < end;)
        tern_rpc_poll(ep);
    ck_assert_int_eq(r.runs, 1);
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_eq(tern_session_status(s), TERN_EPROTO);
    tern_rpc_disconnect(s);
    fake_stop(&f);
    tern_rpc_close(ep);
}
END_TEST

/* ---- a connection that dies under tern_call ---- */

/* A server on a plain socket: it accepts one client and answers its HELLO,
 * then hands the connection to the test (which resets it). */
struct rst_server {
    int lfd, fd;
    char uri[64];
    pthread_t th;
};

static bool fd_read_all(int fd, void *buf, size_t len)
{
    for (size_t got = 0; got < len;) {
        ssize_t n = recv(fd, (uint8_t *)buf + got, len - got, 0);

        if (n <= 0)
            return false;
        got += (size_t)n;
    }
    return true;
}

static void *rst_main(void *arg)
{
    struct rst_server *rs = arg;
    struct timeval tv = {.tv_sec = 5};     /* never hang the test */
    uint8_t hello[TCP_FRAME_LEN(sizeof(struct rpc_hdr) + sizeof(struct rpc_hello))];
    uint8_t ack[TCP_FRAME_LEN(sizeof(struct rpc_hdr) + sizeof(struct rpc_hello))] = {0};
    struct tcp_hdr th = {.magic = TCP_MAGIC, .version = TCP_VERSION, .type = TCP_MSG,
                         .len = sizeof(struct rpc_hdr) + sizeof(struct rpc_hello)};
    struct rpc_hdr h = {.type = RPC_HELLO_ACK, .version = RPC_VERSION};
    struct rpc_hello body = {.magic = RPC_MAGIC, .credits = 8, .max_msg = MAX_MSG};
    int fd = accept(rs->lfd, NULL, NULL);

    if (fd < 0)
        return NULL;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (!fd_read_all(fd, hello, sizeof(hello))) {
        close(fd);
        return NULL;
    }
    memcpy(ack, &th, sizeof(th));
    memcpy(ack + sizeof(th), &h, sizeof(h));
    memcpy(ack + sizeof(th) + sizeof(h), &body, sizeof(body));
    if (send(fd, ack, sizeof(ack), MSG_NOSIGNAL) != (ssize_t)sizeof(ack)) {
        close(fd);
        return NULL;
    }
    rs->fd = fd;
    return NULL;
}

static void rst_server_start(struct rst_server *rs)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);

    rs->fd = -1;
    rs->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(rs->lfd, 0);
    ck_assert_int_eq(bind(rs->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(rs->lfd, 4), 0);
    ck_assert_int_eq(getsockname(rs->lfd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(rs->uri, sizeof(rs->uri), "tcp://127.0.0.1:%u", ntohs(sa.sin_port));
    ck_assert_int_eq(pthread_create(&rs->th, NULL, rst_main, rs), 0);
}

START_TEST(no_continuation_inside_tern_call)
{
    /* The server resets the connection while the client is not polling.
     * The next tern_call's send() meets the reset; the one after cannot
     * even reserve send space. Neither may run a continuation inside
     * tern_call: the caller's stack does not expect one, and this one
     * closes the session, which outside a poll frees it under tern_call
     * (a use-after-free). Both calls must fail later, inside a poll. */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    struct rst_server rs;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct rec a, b;
    int rc;

    rst_server_start(&rs);
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    rc = tern_rpc_connect(ep, rs.uri, 5 * SEC, &s);
    pthread_join(rs.th, NULL);
    ck_assert_msg(rc == 0, "connect to the raw server: %s", tern_err_name(rc));
    ck_assert_int_ge(rs.fd, 0);
    setsockopt(rs.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(rs.fd);       /* RST */
    close(rs.lfd);
    usleep(100000);     /* the reset has arrived; the client has not polled */

    total_runs = 0;
    close_me = s;
    rec_init(&a, 0);
    rec_init(&b, 0);
    ck_assert_int_eq(tern_call(s, SVC, M_ECHO, "a", 1, 0, rec_cont, &a, NULL), 0);
    ck_assert_msg(a.runs == 0, "a continuation ran inside tern_call (%s)",
                  tern_err_name(a.status));
    ck_assert_int_eq(tern_call(s, SVC, M_ECHO, "b", 1, 0, closing_cont, &b, NULL), 0);
    ck_assert_msg(a.runs == 0 && b.runs == 0, "a continuation ran inside tern_call");

    for (double end = now_ms() + WAIT_MS; total_runs < 2 && now_ms() < end;)
        tern_rpc_poll(ep);
    ck_assert_msg(a.runs == 1 && b.runs == 1, "continuations ran %d and %d times", a.runs,
                  b.runs);
    ck_assert_msg(a.status < 0 && b.status < 0, "calls on a reset connection: %s, %s",
                  tern_err_name(a.status), tern_err_name(b.status));
    ck_assert_ptr_null(close_me);      /* the session was closed by b's continuation */
    ck_assert_uint_eq(tern_rpc_calls_in_flight(ep), 0);
    test_rpc_poll_for(ep, 20);
    tern_rpc_close(ep);
}
END_TEST

/* ---- backpressure: a client that does not read its replies ---- */

/* Loopback TCP buffers several MiB per direction when nobody reads (about
 * 4 MiB on a stock Linux); 256 replies of 64 KiB (16 MiB) are well past
 * that, so the server's send path must fill up and spill. */
#define BP_N 256
#define BP_FIRST_ID 1000

static uint8_t bp_byte(unsigned i, size_t j)
{
    return (uint8_t)(i * 31 + j * 7 + (j >> 8));
}

/* Check one reply: the k-th to arrive must answer the k-th request. */
static void bp_check(unsigned k, const void *data, size_t len)
{
    struct rpc_hdr h;
    const uint8_t *p = (const uint8_t *)data + sizeof(h);

    ck_assert_msg(len == sizeof(h) + MAX_MSG, "reply %u: %zu bytes", k, len);
    memcpy(&h, data, sizeof(h));
    ck_assert_uint_eq(h.type, RPC_RESP);
    ck_assert_msg(h.status == 0, "reply %u: %s", k, tern_err_name(h.status));
    ck_assert_msg(h.req_id == BP_FIRST_ID + k, "reply %u answers request %llu", k,
                  (unsigned long long)(h.req_id - BP_FIRST_ID));
    for (size_t j = 0; j < MAX_MSG; j++)
        if (p[j] != bp_byte(k, j))
            ck_abort_msg("reply %u: payload differs at byte %zu", k, j);
}

START_TEST(backpressure_unread_replies)
{
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = BP_N};
    struct raw rw = {0};
    struct tern_tp_event ev;
    static struct {
        const void *data;
        size_t len;
    } held[BP_N];
    unsigned n_held = 0, got = 0;
    int served_while_stalled;
    double end;

    pair_open(&scfg, NULL);
    /* A send buffer for every request, so that the client can post them all
     * at once however slowly the server takes them. */
    raw_open(&rw, sizeof(struct rpc_hdr) + MAX_MSG, 2 * BP_N * (MAX_MSG + 64));
    raw_hello(&rw, RPC_MAGIC, BP_N);
    ck_assert_uint_eq(raw_expect_hello_ack(&rw), BP_N);

    for (unsigned i = 0; i < BP_N; i++) {
        struct rpc_hdr h = {.type = RPC_REQ, .version = RPC_VERSION, .svc = SVC,
                            .method = M_ECHO, .req_id = BP_FIRST_ID + i};
        uint8_t *buf;
        int rc = tern_tp_msg_alloc(rw.conn, sizeof(h) + MAX_MSG, (void **)&buf);

        ck_assert_msg(rc == 0, "request %u: msg_alloc %s", i, tern_strerror(rc));
        memcpy(buf, &h, sizeof(h));
        for (size_t j = 0; j < MAX_MSG; j++)
            buf[sizeof(h) + j] = bp_byte(i, j);
        ck_assert_int_eq(tern_tp_msg_post(rw.conn, buf, sizeof(h) + MAX_MSG), 0);
    }

    /* Phase 1: keep every reply view, so the client stops reading and the
     * server's send path fills up. The server must neither drop nor block. */
    end = now_ms() + 500;
    while (now_ms() < end) {
        int n = tern_tp_poll(rw.tp, &ev, 1);

        ck_assert_int_ge(n, 0);
        if (n == 1) {
            ck_assert_msg(ev.type == TERN_TP_EV_RECV, "event %d while stalled", ev.type);
            ck_assert_uint_lt(n_held, BP_N);
            held[n_held].data = ev.data;
            held[n_held++].len = ev.len;
        }
        tern_rpc_poll(srv);
    }
    served_while_stalled = server_runs;
    /* 16 MiB of replies is far more than the buffers hold: the server must
     * have held requests back instead of queueing replies without bound. */
    ck_assert_msg(served_while_stalled < BP_N,
                  "the server served all %d requests of a client that reads nothing",
                  served_while_stalled);

    /* Phase 2: read everything, in order, in waves: hold the views until
     * the stream goes quiet (the client's buffer is pinned), then release
     * them all. The server stalls and resumes many times over. */
    for (unsigned k = 0; k < n_held; k++) {
        bp_check(got++, held[k].data, held[k].len);
        tern_tp_msg_release(rw.conn, held[k].data);
    }
    n_held = 0;
    end = now_ms() + 20000;
    while (got < BP_N && now_ms() < end) {
        double quiet = now_ms() + 1;

        while (now_ms() < quiet) {
            int n = tern_tp_poll(rw.tp, &ev, 1);

            ck_assert_int_ge(n, 0);
            if (n == 1) {
                ck_assert_msg(ev.type == TERN_TP_EV_RECV, "event %d (status %s)", ev.type,
                              tern_err_name(ev.status));
                ck_assert_uint_lt(got + n_held, BP_N);
                held[n_held].data = ev.data;
                held[n_held++].len = ev.len;
                quiet = now_ms() + 1;
            }
            tern_rpc_poll(srv);
        }
        for (unsigned k = 0; k < n_held; k++) {
            bp_check(got++, held[k].data, held[k].len);
            tern_tp_msg_release(rw.conn, held[k].data);
        }
        n_held = 0;
    }
    ck_assert_msg(got == BP_N, "%u of %d replies arrived (%d served while stalled)", got,
                  BP_N, served_while_stalled);
    ck_assert_int_eq(server_runs, BP_N);

    /* Nothing extra, and the connection still answers. */
    end = now_ms() + 50;
    while (now_ms() < end) {
        ck_assert_int_eq(tern_tp_poll(rw.tp, &ev, 1), 0);
        tern_rpc_poll(srv);
    }
    raw_send_rpc(&rw, RPC_REQ, RPC_VERSION, 77, "tail", 4);
    ck_assert(raw_next(&rw, &ev, WAIT_MS));
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    ck_assert_uint_eq(ev.len, sizeof(struct rpc_hdr) + 4);
    ck_assert_uint_eq(((const struct rpc_hdr *)ev.data)->req_id, 77);
    tern_tp_msg_release(ev.conn, ev.data);
    tern_tp_close(rw.tp);
    pair_close();
}
END_TEST

/* ---- one-sided access through sessions ---- */

/* A second service on the servers of these tests: it hands out keys to its
 * regions, reads, fills and deregisters them on request, and pushes data
 * into the caller's memory. Tests look at the server's memory through it,
 * so they run the same against a server in this process or in a child. */
#define RSVC 8
#define SRV_MR_LEN (64u * 1024)

enum {
    R_KEY = 0,      /* struct rreq (region); reply: its tern_tp_rkey */
    R_PUSH = 1,     /* struct push_req; puts, then replies at once (empty) */
    R_DROP = 2,     /* replies, but the reply is lost with the session */
    R_READ = 3,     /* struct rreq; reply: the region's bytes */
    R_FILL = 4,     /* struct rreq; fills the bytes with fill(seed) */
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
static struct tern_rpc_mr *srv_mrs[2];
static int push_runs, push_status;

/* A status for a message: "0" or the code's name. */
static const char *status_name(int status)
{
    return status ? tern_err_name(status) : "0";
}

static void fill(void *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        ((uint8_t *)p)[i] = (uint8_t)(seed * 37 + i * 13 + (i >> 8));
}

/* With push_again, the completion tries another put on its session. */
static bool push_again;
static int push_again_rc;
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
    fill(at, q.len, q.seed);
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
static int rma_setup_ep(struct tern_rpc_ep *ep)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    int rc;

    push_runs = push_status = 0;
    if ((rc = tern_rpc_register(ep, &service)) < 0 ||
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

/* The fabrics the loop tests run on, rows of the matrix (fabrics.h): tcp,
 * shm, rdma (softverbs unless the host has a NIC). */
enum { FAB_TCP, FAB_SHM, FAB_RDMA, N_FABS };
static const char *const rma_fabric[N_FABS] = {"tcp", "shm", "rdma"};

/* Where a server of loop row `fab` listens. */
static const char *rma_listen(int fab)
{
    return test_fabric_listen(test_fabric_row(rma_fabric[fab]));
}

/* A second client endpoint some tests poll too. */
static struct tern_rpc_ep *cli2;

static void rma_poll(void)
{
    if (cli)
        tern_rpc_poll(cli);
    if (srv)
        tern_rpc_poll(srv);
    if (cli2)
        tern_rpc_poll(cli2);
}

static bool rma_until(const int *counter, int want, int ms)
{
    double end = now_ms() + ms;

    while (*counter < want) {
        if (now_ms() > end)
            return false;
        rma_poll();
    }
    return true;
}

static void rma_poll_for(int ms)
{
    for (double end = now_ms() + ms; now_ms() < end;)
        rma_poll();
}

/* The server in this process (srv), with a listener on `fab` and a client
 * session to it; its regions are registered before the listener. */
static void rma_pair_open(int fab, const struct tern_rpc_config *ccfg)
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
    ck_assert_str_eq(tern_session_fabric(sess), rma_fabric[fab]);
}

static void rma_pair_close(void)
{
    tern_rpc_close(cli2);
    cli2 = NULL;
    pair_close();
    srv_mrs[0] = srv_mrs[1] = NULL;
}

/* The server in a child process (procs.h). The loop tests use one: rdma
 * endpoints of one process share the emulated NIC's context, whose
 * progress is not safe from two threads at once, and tern_rpc_connect
 * needs the server polled while it waits. */
static pid_t rma_pid;

/* false (with a log line) if the fabric is not built in. */
static bool rma_proc_open(int fab)
{
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG};
    int rc;

    if (test_fabric_row(rma_fabric[fab]) < 0) {
        printf("SKIP: %s not built in; this one-sided test runs on the others only\n",
               rma_fabric[fab]);
        return false;
    }
    rma_pid = spawn_rpc_server_at(rma_setup_child, &cfg, rma_listen(fab), uri, sizeof(uri));
    ck_assert_int_gt(rma_pid, 0);
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli), 0);
    rc = tern_rpc_connect(cli, uri, 5 * SEC, &sess);
    ck_assert_msg(rc == 0, "connect %s: %s", uri, tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(sess), rma_fabric[fab]);
    return true;
}

static void rma_proc_close(void)
{
    pid_t pid = rma_pid;

    tern_rpc_close(cli);
    cli = NULL;
    sess = NULL;
    rma_pid = 0;
    ck_assert_msg(stop_server(pid) == 0, "server process did not exit cleanly");
}

/* What a one-sided completion saw. */
struct rma_rec {
    int runs;
    int status;
};

static void rma_cb(void *arg, int status)
{
    struct rma_rec *r = arg;

    r->runs++;
    r->status = status;
}

/* A call on `s` that completes with `want`; the reply is copied to out
 * (cap bytes at most) and its length returned. */
static size_t call_expect(struct tern_session *s, uint16_t method, const void *req, size_t len,
                          int want, void *out, size_t cap)
{
    struct rec r;
    size_t got;
    int rc;

    rec_init(&r, cap ? cap : 1);
    rc = tern_call(s, RSVC, method, req, len, 0, rec_cont, &r, NULL);
    ck_assert_msg(rc == 0, "call %u: %s", method, tern_strerror(rc));
    ck_assert_msg(rma_until(&r.runs, 1, WAIT_MS), "call %u never completed", method);
    ck_assert_msg(r.status == want, "call %u: %s, want %s", method, status_name(r.status),
                  status_name(want));
    if (out && cap)
        memcpy(out, r.buf, r.len < cap ? r.len : cap);
    got = r.len;
    free(r.buf);
    return got;
}

/* The key of server region `i` for session `s` (asked over `s`). */
static struct tern_tp_rkey srv_key(struct tern_session *s, uint32_t i)
{
    struct rreq q = {.region = i};
    struct tern_tp_rkey rk;

    ck_assert_uint_eq(call_expect(s, R_KEY, &q, sizeof(q), 0, &rk, sizeof(rk)), sizeof(rk));
    return rk;
}

/* Server region `i`'s bytes at [off, off+len) must equal `want`. */
static void srv_expect(struct tern_session *s, uint32_t i, uint64_t off, uint32_t len,
                       const void *want, const char *what)
{
    struct rreq q = {.region = i, .off = off, .len = len};
    uint8_t *got = malloc(len);

    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(call_expect(s, R_READ, &q, sizeof(q), 0, got, len), len);
    ck_assert_msg(memcmp(got, want, len) == 0, "%s: the server's memory differs", what);
    free(got);
}

static void srv_fill(struct tern_session *s, uint32_t i, uint64_t off, uint32_t len,
                     unsigned seed)
{
    struct rreq q = {.region = i, .off = off, .len = len, .seed = seed};

    call_expect(s, R_FILL, &q, sizeof(q), 0, NULL, 0);
}

/* Start a put or get, polling while the fabric says EAGAIN (shm turns a
 * key direct after its first use, and waits for served ones first). */
static int rma_start_retry(struct tern_session *s, bool put, struct tern_rpc_mr *lmr,
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
        rma_poll();
    }
}

/* A put or get that must complete, once, with `want`. */
static void rma_expect(struct tern_session *s, bool put, struct tern_rpc_mr *lmr, size_t loff,
                       size_t len, const struct tern_tp_rkey *rk, uint64_t roff, int want)
{
    const char *what = put ? "put" : "get";
    struct rma_rec r = {0};
    int rc = rma_start_retry(s, put, lmr, loff, len, rk, roff, &r);

    ck_assert_msg(rc == 0, "%s of %zu bytes at %" PRIu64 ": %s", what, len, roff,
                  status_name(rc));
    ck_assert_msg(rma_until(&r.runs, 1, WAIT_MS), "%s never completed", what);
    ck_assert_msg(r.status == want, "%s of %zu bytes at %" PRIu64 ": %s, want %s", what, len,
                  roff, status_name(r.status), status_name(want));
    rma_poll_for(5);
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
static void expect_push(struct tern_session *s, struct tern_rpc_mr *cmr, size_t off, size_t len,
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
    ck_assert(rma_until(&seen.r.runs, 1, WAIT_MS));
    ck_assert_msg(seen.r.status == 0, "push: %s", status_name(seen.r.status));
    ck_assert_msg(seen.all_there, "the reply came before the server's put had landed");
    for (double end = now_ms() + WAIT_MS; (runs = srv_pushed(s, &status)) == before &&
                                          now_ms() < end;)
        rma_poll();
    ck_assert_msg(runs == before + 1, "server's put: %d completions", runs - before);
    ck_assert_msg(status == 0, "server's put: %s", status_name(status));
}

/* Put and get between a client's regions and a server's, and a handler
 * that pushes into the client before it replies. */
START_TEST(rma_put_get)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct tern_rpc_mr *cmr, *plain, *filed;
    struct tern_tp_rkey srk;
    uint8_t *c, *heap, *fmap, want[2000];
    int fd;

    if (!rma_proc_open(_i))
        return;
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 40000, rw, &cmr), 0);
    c = tern_rpc_mr_addr(cmr);
    ck_assert_uint_eq(tern_rpc_mr_len(cmr), 40000);
    ck_assert_msg(((uintptr_t)c & (page - 1)) == 0, "tern_rpc_mr_alloc memory not page-aligned");
    for (size_t i = 0; i < 40000; i++)
        ck_assert_msg(c[i] == 0, "tern_rpc_mr_alloc memory not zeroed at %zu", i);
    srk = srv_key(sess, 0);
    ck_assert_uint_eq(srk.len, SRV_MR_LEN);

    fill(c, 40000, 1);
    rma_expect(sess, true, cmr, 0, 1000, &srk, 100, 0);
    srv_expect(sess, 0, 100, 1000, c, "put");
    rma_expect(sess, true, cmr, 5000, 30000, &srk, SRV_MR_LEN - 30000, 0);
    srv_expect(sess, 0, SRV_MR_LEN - 30000, 30000, c + 5000, "large put");

    srv_fill(sess, 0, 20000, 2000, 2);
    fill(want, 2000, 2);
    rma_expect(sess, false, cmr, 38000, 2000, &srk, 20000, 0);
    ck_assert_msg(memcmp(c + 38000, want, 2000) == 0, "get: client memory differs");

    /* Memory the caller keeps: plain heap, and a file mapping whose
     * descriptor the caller closes before the region is first used. */
    heap = calloc(1, 4096);
    ck_assert_ptr_nonnull(heap);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, heap, 4096, -1, 0, rw, &plain), 0);
    fill(heap, 4096, 3);
    rma_expect(sess, true, plain, 0, 4096, &srk, 4096, 0);
    srv_expect(sess, 0, 4096, 4096, heap, "put from the heap");
    fd = memfd_create("rma-test", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 2 * (off_t)page), 0);
    fmap = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)page);
    ck_assert(fmap != MAP_FAILED);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, fmap, page, fd, page, rw, &filed), 0);
    close(fd);
    srv_fill(sess, 0, 9000, (uint32_t)page, 4);
    rma_expect(sess, false, filed, 0, page, &srk, 9000, 0);
    fill(heap, page, 4);
    ck_assert_msg(memcmp(fmap, heap, page) == 0, "get into a file mapping: memory differs");
    tern_rpc_mr_dereg(filed);
    munmap(fmap, page);
    tern_rpc_mr_dereg(plain);
    free(heap);

    /* The server pushes into the client's memory from a handler. */
    expect_push(sess, cmr, 7000, 3000, 0x5c);
    expect_push(sess, cmr, 0, 1, 0xa7);
    ck_assert_int_eq(tern_session_status(sess), 0);
    tern_rpc_mr_dereg(cmr);
    rma_proc_close();
}
END_TEST

/* A key the server never gave, or a range outside the region: refused
 * with TERN_EREMACCESS, and the session goes on. (On rdma a wrong key
 * breaks the queue pair, so there only the range is tried: what the key
 * states itself is checked before posting.) */
START_TEST(rma_bad_rkey)
{
    struct tern_rpc_mr *cmr;
    struct tern_tp_rkey srk, bad;

    if (!rma_proc_open(_i))
        return;
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 8192, TERN_TP_ACCESS_REMOTE_WRITE, &cmr), 0);
    srk = srv_key(sess, 0);
    if (_i != FAB_RDMA) {
        bad = srk;
        bad.key ^= 0x5a5a0000;  /* same slot, another nonce */
        rma_expect(sess, true, cmr, 0, 100, &bad, 0, TERN_EREMACCESS);
        rma_expect(sess, false, cmr, 0, 100, &bad, 0, TERN_EREMACCESS);
    }
    rma_expect(sess, true, cmr, 0, 100, &srk, SRV_MR_LEN - 50, TERN_EREMACCESS);
    rma_expect(sess, false, cmr, 0, 100, &srk, SRV_MR_LEN + 4096, TERN_EREMACCESS);
    ck_assert_int_eq(tern_session_status(sess), 0);
    fill(tern_rpc_mr_addr(cmr), 100, 5);
    rma_expect(sess, true, cmr, 0, 100, &srk, 0, 0);
    srv_expect(sess, 0, 0, 100, tern_rpc_mr_addr(cmr), "put after refused ones");
    rma_proc_close();
}
END_TEST

/* Direct pointers exist on shm only; elsewhere TERN_ENOTSUP. */
START_TEST(rma_rkey_ptr)
{
    const uint32_t rd = TERN_TP_ACCESS_REMOTE_READ, wr = TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_tp_rkey srk;
    uint8_t want[64];
    void *p = NULL;
    int rc;

    if (!rma_proc_open(_i))
        return;
    srk = srv_key(sess, 0);
    srv_fill(sess, 0, 0, 64, 8);
    rc = tern_session_rkey_ptr(sess, &srk, 0, 64, rd, &p);
    for (double end = now_ms() + WAIT_MS; rc == TERN_EAGAIN && now_ms() < end;) {
        rma_poll();
        rc = tern_session_rkey_ptr(sess, &srk, 0, 64, rd, &p);
    }
    if (!(test_fabric_caps(test_fabric_row(rma_fabric[_i])) & TERN_TP_CAP_RKEY_PTR)) {
        ck_assert_msg(rc == TERN_ENOTSUP, "rkey_ptr on %s: %s", rma_fabric[_i],
                      status_name(rc));
    } else if (rc == TERN_ENOTSUP &&
               !(tern_tp_caps(tern_tp_conn_ep(sess->conn)) & TERN_TP_CAP_RKEY_PTR)) {
        printf("SKIP: shm rkey_ptr: the transport has no direct pointers\n");
    } else {
        ck_assert_msg(rc == 0, "rkey_ptr on shm: %s", status_name(rc));
        fill(want, 64, 8);
        ck_assert_msg(memcmp(p, want, 64) == 0, "rkey_ptr: not the server's bytes");
        rc = tern_session_rkey_ptr(sess, &srk, 128, 64, rd | wr, &p);
        ck_assert_msg(rc == 0, "writable rkey_ptr on shm: %s", status_name(rc));
        memset(p, 0x77, 64);
        memset(want, 0x77, 64);
        srv_expect(sess, 0, 128, 64, want, "store through rkey_ptr");
        rc = tern_session_rkey_ptr(sess, &srk, SRV_MR_LEN - 8, 64, rd, &p);
        ck_assert_msg(rc == TERN_EREMACCESS, "rkey_ptr out of range: %s", status_name(rc));
    }
    ck_assert_int_eq(tern_session_rkey_ptr(sess, NULL, 0, 64, rd, &p), TERN_EINVAL);
    ck_assert_int_eq(tern_session_status(sess), 0);
    rma_proc_close();
}
END_TEST

/* Deregistration: a server region's key stops working at once; a client
 * region with gets in flight completes them now with an error, and keeps
 * its memory until the fabric is done with them (their data still lands). */
START_TEST(rma_dereg)
{
    struct tern_rpc_mr *cmr, *cmr2;
    struct tern_tp_rkey srk0, srk1;
    struct rreq q = {.region = 1};
    struct rma_rec g[3] = {{0}};

    if (!rma_proc_open(_i))
        return;
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 8192, TERN_TP_ACCESS_REMOTE_WRITE, &cmr), 0);
    srk0 = srv_key(sess, 0);
    srk1 = srv_key(sess, 1);
    rma_expect(sess, true, cmr, 0, 100, &srk1, 0, 0);
    call_expect(sess, R_DEREG, &q, sizeof(q), 0, NULL, 0);
    if (_i != FAB_RDMA) {   /* on rdma the NIC refuses it by breaking the queue pair */
        rma_expect(sess, true, cmr, 0, 100, &srk1, 0, TERN_EREMACCESS);
        rma_expect(sess, false, cmr, 0, 100, &srk1, 0, TERN_EREMACCESS);
    }
    rma_expect(sess, true, cmr, 0, 100, &srk0, 0, 0);

    /* Gets in flight into a region deregistered under them. */
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 3 * 4096, TERN_TP_ACCESS_LOCAL, &cmr2), 0);
    srv_fill(sess, 0, 0, 3 * 4096, 9);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(rma_start_retry(sess, false, cmr2, (size_t)i * 4096, 4096, &srk0,
                                         (uint64_t)i * 4096, &g[i]), 0);
    tern_rpc_mr_dereg(cmr2);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(g[i].runs == 1, "get %d: %d completions at dereg", i, g[i].runs);
        ck_assert_msg(g[i].status == TERN_ECANCELED, "get %d: %s", i,
                      status_name(g[i].status));
    }
    rma_poll_for(100);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(g[i].runs == 1, "get %d completed again", i);
    ck_assert_uint_eq(cli->n_rma_free, cli->cfg.max_calls);
    ck_assert_int_eq(tern_session_status(sess), 0);
    rma_expect(sess, false, cmr, 0, 4096, &srk0, 0, 0);
    expect_push(sess, cmr, 0, 64, 0x99);
    rma_proc_close();
}
END_TEST

/* Keys are per fabric, and a region is registered on a fabric only when a
 * session there first needs it. */
START_TEST(rma_rkeys_per_fabric)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG};
    struct tern_tp_rkey k_tcp, k_shm, c_tcp, c_shm;
    struct tern_rpc_mr *cmr, *cmr2;
    struct tern_session *s2;
    char shm_uri[128];
    uint8_t *sm;
    int rc;

    ck_assert_int_eq(tern_rpc_open(&cfg, &srv), 0);
    ck_assert_int_eq(rma_setup_ep(srv), 0);
    ck_assert_int_eq(tern_rpc_listen(srv, "tcp://127.0.0.1:0", uri, sizeof(uri)), 0);
    ck_assert_int_eq(tern_rpc_listen(srv, "shm://auto", shm_uri, sizeof(shm_uri)), 0);
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli), 0);
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli2), 0);
    ck_assert_int_eq(connect_inproc(cli, uri, &sess), 0);
    rc = connect_inproc(cli2, shm_uri, &s2);
    ck_assert_msg(rc == 0, "connect %s: %s", shm_uri, tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(s2), "shm");
    for (int i = 0; i < RPC_MAX_FABRICS; i++)
        ck_assert_msg(!srv_mrs[0]->tp[i], "region registered on fabric %d before any use", i);

    k_tcp = srv_key(sess, 0);
    for (unsigned i = 0; i < srv->n_tp; i++)
        ck_assert_msg(!srv_mrs[0]->tp[i] == (strcmp(tern_tp_fabric(srv->tp[i]), "tcp") != 0),
                      "after a tcp key: %s registered: %d", tern_tp_fabric(srv->tp[i]),
                      srv_mrs[0]->tp[i] != NULL);
    k_shm = srv_key(s2, 0);
    for (unsigned i = 0; i < srv->n_tp; i++)
        ck_assert_msg(srv_mrs[0]->tp[i], "after both keys: %s not registered",
                      tern_tp_fabric(srv->tp[i]));
    ck_assert_msg(k_tcp.key != k_shm.key, "tcp and shm keys are the same (%#x)", k_tcp.key);
    ck_assert_uint_eq(k_tcp.len, k_shm.len);

    /* The client side too: nothing until its own key is asked. */
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, rw, &cmr), 0);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli2, 4096, rw, &cmr2), 0);
    ck_assert(!cmr->tp[0] && !cmr2->tp[0]);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, sess, &c_tcp), 0);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr2, s2, &c_shm), 0);
    ck_assert(cmr->tp[0] && cmr2->tp[0]);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, s2, &c_shm), TERN_EINVAL);   /* other endpoint */

    /* Each key works over its own fabric; the tcp key means nothing on shm. */
    sm = tern_rpc_mr_addr(srv_mrs[0]);
    fill(tern_rpc_mr_addr(cmr), 4096, 6);
    fill(tern_rpc_mr_addr(cmr2), 4096, 7);
    rma_expect(sess, true, cmr, 0, 4096, &k_tcp, 0, 0);
    ck_assert(memcmp(sm, tern_rpc_mr_addr(cmr), 4096) == 0);
    rma_expect(s2, true, cmr2, 0, 4096, &k_shm, 4096, 0);
    ck_assert(memcmp(sm + 4096, tern_rpc_mr_addr(cmr2), 4096) == 0);
    rma_expect(s2, true, cmr2, 0, 64, &k_tcp, 0, TERN_EREMACCESS);
    expect_push(s2, cmr2, 100, 200, 0x33);
    expect_push(sess, cmr, 100, 200, 0x34);
    rma_pair_close();
}
END_TEST

/* A client that closes its session: its operations in flight complete at
 * once with TERN_ECANCELED, and never again. */
START_TEST(rma_close_fails_ops_once)
{
    struct tern_rpc_mr *cmr;
    struct tern_tp_rkey srk;
    struct rma_rec r[6] = {{0}};

    rma_pair_open(FAB_TCP, NULL);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 8192, TERN_TP_ACCESS_LOCAL, &cmr), 0);
    srk = srv_key(sess, 0);
    /* The server is not polled: all stay in flight. */
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq((i & 1 ? tern_session_get : tern_session_put)(
                             sess, cmr, (size_t)i * 1000, 1000, &srk, (uint64_t)i * 1000,
                             rma_cb, &r[i]), 0);
    tern_rpc_disconnect(sess);
    sess = NULL;
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(r[i].runs == 1, "op %d: %d completions at close", i, r[i].runs);
        ck_assert_msg(r[i].status == TERN_ECANCELED, "op %d: %s", i, status_name(r[i].status));
    }
    rma_poll_for(100);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(r[i].runs == 1, "op %d completed again after the close", i);
    /* Its slots came back with the connection. */
    ck_assert_uint_eq(cli->n_rma_free, cli->cfg.max_calls);
    tern_rpc_mr_dereg(cmr);
    rma_pair_close();
}
END_TEST

/* A server session that goes (its client lost) while a put of the server's
 * is in flight: that put completes once, with TERN_ECONNRESET, and its
 * callback can start nothing more on that session. */
START_TEST(rma_server_session_gone)
{
    struct tern_rpc_mr *cmr;
    struct push_req p = {.roff = 0, .len = 512, .byte = 0x11, .drop = 1};
    struct rec r;

    rma_pair_open(FAB_TCP, NULL);
    push_again = true;
    push_again_rc = 1;
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, TERN_TP_ACCESS_REMOTE_WRITE, &cmr), 0);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, sess, &p.rk), 0);
    rec_init(&r, 0);
    ck_assert_int_eq(tern_call(sess, RSVC, R_PUSH, &p, sizeof(p), 0, rec_cont, &r, NULL), 0);
    ck_assert(rma_until(&push_runs, 1, WAIT_MS));
    ck_assert_msg(push_status == TERN_ECONNRESET, "server's put: %s",
                  status_name(push_status));
    ck_assert_msg(push_again_rc == TERN_ENOTCONN, "a put from the callback: %s",
                  status_name(push_again_rc));
    push_again = false;
    ck_assert(rma_until(&r.runs, 1, WAIT_MS));
    ck_assert_int_eq(r.status, TERN_ECONNRESET);
    rma_poll_for(100);
    ck_assert_msg(push_runs == 1, "the server's put completed %d times", push_runs);
    ck_assert_uint_eq(srv->n_rma_free, srv->cfg.max_calls);
    tern_rpc_mr_dereg(cmr);
    rma_pair_close();
}
END_TEST

/* The server goes away with gets in flight: they fail once, and the dead
 * session refuses new operations and keys. */
START_TEST(rma_server_gone)
{
    struct tern_rpc_mr *cmr;
    struct tern_tp_rkey srk, k;
    struct rma_rec r[3] = {{0}};

    rma_pair_open(FAB_TCP, NULL);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 8192, TERN_TP_ACCESS_LOCAL, &cmr), 0);
    srk = srv_key(sess, 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(tern_session_get(sess, cmr, (size_t)i * 100, 100, &srk, 0, rma_cb,
                                          &r[i]), 0);
    tern_rpc_close(srv);
    srv = NULL;
    srv_mrs[0] = srv_mrs[1] = NULL;
    for (double end = now_ms() + WAIT_MS; tern_session_status(sess) == 0 && now_ms() < end;)
        tern_rpc_poll(cli);
    ck_assert_int_lt(tern_session_status(sess), 0);
    rma_poll_for(50);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(r[i].runs == 1, "get %d: %d completions", i, r[i].runs);
        ck_assert_msg(r[i].status == TERN_ECONNRESET, "get %d: %s", i,
                      status_name(r[i].status));
    }
    ck_assert_int_eq(tern_session_put(sess, cmr, 0, 10, &srk, 0, rma_cb, &r[0]),
                     TERN_ENOTCONN);
    ck_assert_int_eq(tern_session_get(sess, cmr, 0, 10, &srk, 0, rma_cb, &r[0]),
                     TERN_ENOTCONN);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, sess, &k), TERN_ENOTCONN);
    ck_assert_int_eq(r[0].runs, 1);
    tern_rpc_mr_dereg(cmr);
    rma_pair_close();
}
END_TEST

/* A completion that tries to start another operation on its session. */
struct again {
    struct rma_rec r;
    struct tern_session *s;
    struct tern_rpc_mr *mr;
    const struct tern_tp_rkey *rk;
    int rc;
};

static void again_cb(void *arg, int status)
{
    struct again *a = arg;

    rma_cb(&a->r, status);
    a->rc = tern_session_put(a->s, a->mr, 0, 64, a->rk, 0, rma_cb, &a->r);
}

/* The session dies of a protocol error while its connection lives on: a
 * put in flight completes with the session's error, once (and its callback
 * can start nothing more on that session), and the fabric's late answer to
 * it is dropped. */
START_TEST(rma_protocol_error_fails_ops_once)
{
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG};
    struct tern_tp_rkey rk = {.addr = 0, .len = 4096, .key = 12345,
                              .access = TERN_TP_ACCESS_REMOTE_WRITE};
    struct tern_rpc_mr *cmr;
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    struct again put = {.rk = &rk};
    struct tern_tp_rkey k;
    struct rec r;
    struct fake f;
    void *p;

    ck_assert_int_eq(tern_rpc_open(&cfg, &ep), 0);
    ck_assert_int_eq(tern_rpc_mr_alloc(ep, 4096, TERN_TP_ACCESS_LOCAL, &cmr), 0);
    fake_start(&f, F_REQ_POSITIVE_STATUS);
    ck_assert_int_eq(tern_rpc_connect(ep, f.uri, 2 * SEC, &s), 0);
    /* The call goes first: its bad reply arrives before the answer to the
     * put (the fake's transport refuses the unknown key). */
    rec_init(&r, 0);
    ck_assert_int_eq(tern_call(s, SVC, M_ECHO, "x", 1, 0, rec_cont, &r, NULL), 0);
    put.s = s;
    put.mr = cmr;
    ck_assert_int_eq(tern_session_put(s, cmr, 0, 64, &rk, 0, again_cb, &put), 0);
    for (double end = now_ms() + WAIT_MS; r.runs == 0 && now_ms() < end;)
        tern_rpc_poll(ep);
    ck_assert_int_eq(r.status, TERN_EPROTO);
    ck_assert_int_eq(put.r.runs, 1);
    ck_assert_msg(put.r.status == TERN_EPROTO, "put: %s, want the session's TERN_EPROTO",
                  status_name(put.r.status));
    ck_assert_msg(put.rc == TERN_ENOTCONN, "a put from the callback of the dead session: %s",
                  status_name(put.rc));
    for (double end = now_ms() + 200; now_ms() < end;)
        tern_rpc_poll(ep);
    ck_assert_msg(put.r.runs == 1, "the put completed %d times", put.r.runs);
    /* The connection is still there; the session is not. */
    ck_assert_int_eq(tern_session_get(s, cmr, 0, 64, &rk, 0, rma_cb, &put.r), TERN_ENOTCONN);
    ck_assert_int_eq(tern_session_rkey_ptr(s, &rk, 0, 64, TERN_TP_ACCESS_REMOTE_READ, &p),
                     TERN_ENOTCONN);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, s, &k), TERN_ENOTCONN);
    /* The fabric answered it meanwhile: its slot is back. */
    ck_assert_uint_eq(ep->n_rma_free, ep->cfg.max_calls);
    tern_rpc_disconnect(s);
    fake_stop(&f);
    tern_rpc_mr_dereg(cmr);
    tern_rpc_close(ep);
}
END_TEST

/* More operations in flight than the endpoint has slots: TERN_ENOBUFS,
 * until one completes. */
START_TEST(rma_slot_exhaustion)
{
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .max_calls = 4};
    struct tern_rpc_mr *cmr;
    struct tern_tp_rkey srk;
    struct rma_rec r[6] = {{0}};
    int done = 0;

    rma_pair_open(FAB_TCP, &ccfg);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, TERN_TP_ACCESS_LOCAL, &cmr), 0);
    srk = srv_key(sess, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(tern_session_put(sess, cmr, 0, 100, &srk, 0, rma_cb, &r[i]), 0);
    ck_assert_int_eq(tern_session_put(sess, cmr, 0, 100, &srk, 0, rma_cb, &r[4]),
                     TERN_ENOBUFS);
    ck_assert_int_eq(tern_session_get(sess, cmr, 0, 100, &srk, 0, rma_cb, &r[4]),
                     TERN_ENOBUFS);
    ck_assert_int_eq(r[4].runs, 0);
    /* Calls have slots of their own. */
    expect_echo(8);
    for (double end = now_ms() + WAIT_MS; done < 4 && now_ms() < end;) {
        rma_poll();
        done = r[0].runs + r[1].runs + r[2].runs + r[3].runs;
    }
    ck_assert_int_eq(done, 4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(r[i].status, 0);
    rma_expect(sess, false, cmr, 0, 100, &srk, 0, 0);
    rma_pair_close();
}
END_TEST

/* A get the peer never serves (on tcp the server's progress engine serves
 * it, and the server is not polled) completes with TERN_ETIMEDOUT after
 * rma_timeout_ns, once; the late answer, when the server runs again, is
 * dropped; and the slot comes back, so operations go on. */
START_TEST(rma_timeout)
{
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .max_calls = 4, .rma_timeout_ns = 100000000ull};
    struct tern_rpc_mr *cmr;
    struct tern_tp_rkey srk;
    struct rma_rec r = {0};
    double t0, waited;

    rma_pair_open(FAB_TCP, &ccfg);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, TERN_TP_ACCESS_LOCAL, &cmr), 0);
    srk = srv_key(sess, 0);
    t0 = now_ms();
    ck_assert_int_eq(tern_session_get(sess, cmr, 0, 100, &srk, 0, rma_cb, &r), 0);
    while (!r.runs && now_ms() - t0 < 3000)
        tern_rpc_poll(cli);
    waited = now_ms() - t0;
    ck_assert_msg(r.runs == 1, "a get nobody serves never completed");
    ck_assert_msg(r.status == TERN_ETIMEDOUT, "status %s", status_name(r.status));
    ck_assert_msg(waited >= 100 && waited < 2000, "timed out after %.0f ms (rma_timeout_ns 100)",
                  waited);
    rma_poll_for(50);                   /* the server answers late */
    ck_assert_int_eq(r.runs, 1);
    /* All four slots at once: the late answer freed the orphan's. */
    {
        struct rma_rec q[4] = {{0}};
        int done = 0;

        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(tern_session_get(sess, cmr, 0, 100, &srk, 0, rma_cb, &q[i]), 0);
        for (double end = now_ms() + WAIT_MS; done < 4 && now_ms() < end;) {
            rma_poll();
            done = q[0].runs + q[1].runs + q[2].runs + q[3].runs;
        }
        ck_assert_int_eq(done, 4);
        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(q[i].status, 0);
    }
    rma_pair_close();
}
END_TEST

/* Completions that start the next operation, and at the end a call, from
 * inside the callback; one slot is enough, as the slot is free when the
 * callback runs. */
struct chain {
    struct tern_session *s;
    struct tern_rpc_mr *mr;
    struct tern_tp_rkey rk;
    int done, failed, first_error;
    int limit;
    struct rec call;
};

static void chain_cb(void *arg, int status)
{
    struct chain *c = arg;
    int rc;

    c->done++;
    if (status < 0 && !c->failed++)
        c->first_error = status;
    if (c->done == c->limit) {
        rc = tern_call(c->s, SVC, M_ECHO, "end", 3, 0, rec_cont, &c->call, NULL);
        if (rc < 0 && !c->failed++)
            c->first_error = rc;
        return;
    }
    rc = (c->done & 1 ? tern_session_get : tern_session_put)(
        c->s, c->mr, (size_t)c->done, 64, &c->rk, (uint64_t)c->done * 64, chain_cb, c);
    if (rc < 0 && !c->failed++)
        c->first_error = rc;
}

START_TEST(rma_callback_chains)
{
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .max_calls = 1};
    struct chain c = {.limit = 50};

    rma_pair_open(FAB_TCP, &ccfg);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, TERN_TP_ACCESS_LOCAL, &c.mr), 0);
    c.s = sess;
    c.rk = srv_key(sess, 0);
    rec_init(&c.call, 8);
    ck_assert_int_eq(tern_session_put(sess, c.mr, 0, 64, &c.rk, 0, chain_cb, &c), 0);
    for (double end = now_ms() + WAIT_MS; !c.call.runs && !c.failed && now_ms() < end;)
        rma_poll();
    ck_assert_msg(!c.failed, "%d operations failed, first: %s", c.failed,
                  status_name(c.first_error));
    ck_assert_int_eq(c.done, c.limit);
    ck_assert_int_eq(c.call.runs, 1);
    ck_assert_int_eq(c.call.status, 0);
    free(c.call.buf);
    rma_pair_close();
}
END_TEST

START_TEST(rma_argument_errors)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_rpc_mr *cmr, *mr = (struct tern_rpc_mr *)&mr;
    struct tern_tp_rkey srk, k;
    struct rma_rec r = {0};
    uint8_t buf[64];
    int fd;

    rma_pair_open(FAB_TCP, NULL);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, NULL, 64, -1, 0, rw, &mr), TERN_EINVAL);
    ck_assert_ptr_null(mr);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 0, -1, 0, rw, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, -1, 0, 8, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, -1, 0, rw, NULL), TERN_EINVAL);
    fd = memfd_create("rma-args", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, fd, 100, rw, &mr), TERN_EINVAL);
    close(fd);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, fd, 0, rw, &mr), TERN_EINVAL);  /* closed */
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 0, rw, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 64, 1u << 7, &mr), TERN_EINVAL);

    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, rw, &cmr), 0);
    srk = srv_key(sess, 0);
    ck_assert_int_eq(tern_session_put(sess, cmr, 0, 64, NULL, 0, rma_cb, &r), TERN_EINVAL);
    ck_assert_int_eq(tern_session_put(sess, NULL, 0, 64, &srk, 0, rma_cb, &r), TERN_EINVAL);
    ck_assert_int_eq(tern_session_get(NULL, cmr, 0, 64, &srk, 0, rma_cb, &r), TERN_EINVAL);
    ck_assert_int_eq(tern_session_put(sess, cmr, 4000, 200, &srk, 0, rma_cb, &r), TERN_ERANGE);
    ck_assert_int_eq(tern_session_get(sess, cmr, 0, 0, &srk, 0, rma_cb, &r), TERN_EINVAL);
    /* A region of another endpoint. */
    ck_assert_int_eq(tern_session_put(sess, srv_mrs[0], 0, 64, &srk, 0, rma_cb, &r),
                     TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_rkey(srv_mrs[0], sess, &k), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, NULL, &k), TERN_EINVAL);
    ck_assert_int_eq(r.runs, 0);
    /* None of those took a slot. */
    ck_assert_uint_eq(cli->n_rma_free, cli->cfg.max_calls);
    ck_assert_ptr_null(tern_rpc_mr_addr(NULL));
    ck_assert_uint_eq(tern_rpc_mr_len(NULL), 0);
    tern_rpc_mr_dereg(NULL);
    ck_assert_uint_eq(tern_session_epoch(sess), 0);
    rma_expect(sess, true, cmr, 0, 64, &srk, 0, 0);
    /* Regions left registered go with the endpoint (ASan sees leaks). */
    rma_pair_close();
}
END_TEST

/* An auto:// session that fails over from shm to tcp: its epoch changes,
 * its keys change with the fabric, and one-sided access goes on over the
 * new path. */
START_TEST(rma_epoch_failover)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG};
    struct tern_tp_rkey srk_shm, srk_tcp, c_shm, c_tcp;
    struct tern_rpc_mr *cmr;
    struct rma_rec put = {0};
    char auto_uri[160];
    uint32_t epoch;
    struct rec r;
    int rc;

    ck_assert_int_eq(tern_rpc_open(&cfg, &srv), 0);
    ck_assert_int_eq(rma_setup_ep(srv), 0);
    ck_assert_int_eq(tern_rpc_listen(srv, "tcp://127.0.0.1:0", uri, sizeof(uri)), 0);
    ck_assert_int_eq(tern_rpc_listen(srv, "shm://auto", NULL, 0), 0);
    snprintf(auto_uri, sizeof(auto_uri), "auto://%s", uri + strlen("tcp://"));
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli), 0);
    rc = connect_inproc(cli, auto_uri, &sess);
    ck_assert_msg(rc == 0, "connect %s: %s", auto_uri, tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(sess), "shm");
    epoch = tern_session_epoch(sess);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 8192, rw, &cmr), 0);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, sess, &c_shm), 0);
    srk_shm = srv_key(sess, 0);
    fill(tern_rpc_mr_addr(cmr), 8192, 10);
    rma_expect(sess, true, cmr, 0, 100, &srk_shm, 0, 0);
    expect_push(sess, cmr, 4096, 100, 0x42);
    ck_assert_uint_eq(tern_session_epoch(sess), epoch);

    /* The server loses the shm path after answering; a put follows the
     * call on that path. */
    rec_init(&r, 0);
    ck_assert_int_eq(tern_call(sess, RSVC, R_DROP, NULL, 0, 0, rec_cont, &r, NULL), 0);
    ck_assert_int_eq(rma_start_retry(sess, true, cmr, 0, 64, &srk_shm, 0, &put), 0);
    ck_assert(rma_until(&r.runs, 1, WAIT_MS));
    ck_assert_msg(r.status == 0, "the dropped call: %s", status_name(r.status));
    ck_assert(rma_until(&put.runs, 1, WAIT_MS));
    rma_poll_for(50);
    ck_assert_msg(put.runs == 1, "the put on the dead path completed %d times", put.runs);
    ck_assert_str_eq(tern_session_fabric(sess), "tcp");
    ck_assert_int_eq(tern_session_status(sess), 0);
    ck_assert_msg(tern_session_epoch(sess) != epoch, "epoch unchanged after a failover");

    /* New keys on the new fabric, on both sides. */
    srk_tcp = srv_key(sess, 0);
    ck_assert(srk_tcp.key != srk_shm.key);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, sess, &c_tcp), 0);
    ck_assert(c_tcp.key != c_shm.key);
    fill(tern_rpc_mr_addr(cmr), 8192, 11);
    rma_expect(sess, true, cmr, 0, 300, &srk_tcp, 1000, 0);
    srv_expect(sess, 0, 1000, 300, tern_rpc_mr_addr(cmr), "put after the failover");
    expect_push(sess, cmr, 5000, 100, 0x24);
    rma_pair_close();
}
END_TEST

Suite *suite_rpc(void)
{
    Suite *s = suite_create("rpc");
    TCase *basic = tcase_create("basic");
    TCase *own = tcase_create("own_pair");
    TCase *bad = tcase_create("bad_clients");
    TCase *rma = tcase_create("rma");

    /* Tests that share the default server/client pair. */
    tcase_add_checked_fixture(basic, setup_default, pair_close);
    tcase_set_timeout(basic, 30);
    tcase_add_test(basic, register_errors);
    tcase_add_test(basic, echo_sizes);
    tcase_add_test(basic, request_over_max_msg);
    tcase_add_test(basic, call_argument_errors);
    tcase_add_test(basic, unknown_service_and_method);
    tcase_add_test(basic, handler_ids);
    tcase_add_test(basic, handler_error_codes);
    tcase_add_test(basic, alloc_then_error);
    tcase_add_test(basic, reply_shrink);
    tcase_add_test(basic, reply_alloc_once);
    tcase_add_test(basic, empty_reply);
    tcase_add_test(basic, expiry_continuation_cancels_other);
    tcase_add_test(basic, expiry_continuation_closes_session);
    tcase_add_test(basic, cancel_sent_call);
    tcase_add_test(basic, cancel_unknown_ids);
    tcase_add_test(basic, close_from_continuation);
    tcase_add_test(basic, call_on_closed_session_fails);
    tcase_add_test(basic, handler_sees_deadline);
    tcase_add_test(basic, local_deadline_expires);
    tcase_add_test(basic, timeout_max_means_no_deadline);
    tcase_add_test(basic, connect_bad_uris);
    tcase_add_test(basic, listen_bad_uris);
    tcase_add_test(basic, callv_gathers_pieces);
    tcase_add_test(basic, callv_limits);
    tcase_add_test(basic, wait_fd_wakes_on_request);
    suite_add_tcase(s, basic);

    /* Tests that build their own pair with a particular configuration. */
    tcase_set_timeout(own, 60);
    tcase_add_test(own, strerror_for_used_codes);
    tcase_add_test(own, connect_refused);
    tcase_add_test(own, many_async_calls_with_8_credits);
    tcase_add_test(own, client_credits_cap_server_grant);
    tcase_add_test(own, no_call_slots);
    tcase_add_test(own, max_calls_below_default_credits);
    tcase_add_test(own, cancel_queued_call);
    tcase_add_test(own, cancel_sends_queued_call);
    tcase_add_test(own, expiry_sends_queued_call);
    tcase_add_test(own, many_deadlines_sent_at_once);
    tcase_add_test(own, no_continuation_inside_tern_call);
    tcase_add_test(own, silent_clients_time_out);
    tcase_add_test(own, session_close_cancels_in_flight);
    tcase_add_test(own, reply_over_client_max_msg);
    tcase_add_test(own, request_over_server_max_msg);
    tcase_add_test(own, backpressure_unread_replies);
    tcase_add_test(own, queued_call_expires);
    tcase_add_test(own, client_send_path_full);
    tcase_add_test(own, hostile_server_handshake);
    tcase_add_test(own, connect_to_other_rpc_version);
    tcase_add_test(own, hostile_server_replies);
    tcase_add_test(own, hostile_server_short_message);
    tcase_add_test(own, callv_over_server_max_msg);
    tcase_add_test(own, callv_queued_keeps_pieces);
    tcase_add_loop_test(own, reply_max_limits, 0,
                        sizeof(reply_max_cases) / sizeof(reply_max_cases[0]));
    tcase_add_test(own, wait_fd_before_listen);
    tcase_add_test(own, wait_arm_reports_owed_events);
    tcase_add_test(own, wait_fd_two_fabrics);
    suite_add_tcase(s, own);

    /* One-sided access through sessions. */
    tcase_set_timeout(rma, 60);
    tcase_add_loop_test(rma, rma_put_get, 0, N_FABS);
    tcase_add_loop_test(rma, rma_bad_rkey, 0, N_FABS);
    tcase_add_loop_test(rma, rma_rkey_ptr, 0, N_FABS);
    tcase_add_loop_test(rma, rma_dereg, 0, N_FABS);
    tcase_add_test(rma, rma_rkeys_per_fabric);
    tcase_add_test(rma, rma_close_fails_ops_once);
    tcase_add_test(rma, rma_server_session_gone);
    tcase_add_test(rma, rma_server_gone);
    tcase_add_test(rma, rma_protocol_error_fails_ops_once);
    tcase_add_test(rma, rma_slot_exhaustion);
    tcase_add_test(rma, rma_timeout);
    tcase_add_test(rma, rma_callback_chains);
    tcase_add_test(rma, rma_argument_errors);
    tcase_add_test(rma, rma_epoch_failover);
    suite_add_tcase(s, rma);

    tcase_add_checked_fixture(bad, setup_default, pair_close);
    tcase_set_timeout(bad, 30);
    tcase_add_loop_test(bad, server_survives_bad_client, BAD_SHORT, BAD_TYPE + 1);
    suite_add_tcase(s, bad);
    return s;
}
