/* The rpc suite's shared fixtures (rpc_fixture.h). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_fixture.h"
#include "rpc_internal.h"
#include "wire.h"

/* ---- the test service ---- */

int server_runs;

int h_echo(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, len);

    server_runs++;
    if (!out)
        return TERN_ENOMEM;
    if (len)
        memcpy(out, data, len);
    return 0;
}

int h_enoent(struct tern_req *req, const void *data, size_t len, void *ctx)
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

const struct tern_service test_service = {
    .name = "test", .id = SVC, .methods = methods,
    .n_methods = sizeof(methods) / sizeof(methods[0]),
};

/* ---- the in-process pair ---- */

struct tern_rpc_ep *srv, *cli;
struct tern_session *sess;
char uri[128];
struct tern_rpc_ep *cli2;

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
int connect_inproc_timeout(struct tern_rpc_ep *ep, const char *to, uint64_t timeout_ns,
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

int connect_inproc(struct tern_rpc_ep *ep, const char *to, struct tern_session **out)
{
    return connect_inproc_timeout(ep, to, 5 * SEC, out);
}

/* Server with the test service listening on loopback; a client endpoint;
 * a session between them. NULL configs mean max_msg = MAX_MSG. */
void pair_open(const struct tern_rpc_config *scfg, const struct tern_rpc_config *ccfg)
{
    struct tern_rpc_config dflt = {.max_msg = MAX_MSG};
    int rc;

    server_runs = 0;
    rc = tern_rpc_open(scfg ? scfg : &dflt, &srv);
    ck_assert_msg(rc == 0, "server ep: %s", tern_strerror(rc));
    ck_assert_int_eq(tern_rpc_register(srv, &test_service), 0);
    rc = tern_rpc_listen(srv, "tcp://127.0.0.1:0", uri, sizeof(uri));
    ck_assert_msg(rc == 0, "listen: %s", tern_strerror(rc));
    rc = tern_rpc_open(ccfg ? ccfg : &dflt, &cli);
    ck_assert_msg(rc == 0, "client ep: %s", tern_strerror(rc));
    rc = connect_inproc(cli, uri, &sess);
    ck_assert_msg(rc == 0, "connect %s: %s", uri, tern_strerror(rc));
    ck_assert_int_eq(tern_session_status(sess), 0);
}

void pair_close(void)
{
    tern_rpc_close(cli2);
    tern_rpc_close(cli);
    tern_rpc_close(srv);
    cli2 = cli = srv = NULL;
    sess = NULL;
}

void setup_default(void)
{
    pair_open(NULL, NULL);
}

/* ---- calls ---- */

int total_runs;

void rec_cont(void *arg, int status, const void *reply, size_t len)
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

void rec_init(struct rec *r, size_t cap)
{
    *r = (struct rec){.cap = cap, .buf = cap ? calloc(1, cap) : NULL};
    ck_assert(!cap || r->buf);
}

void poll_eps(void)
{
    if (cli)
        tern_rpc_poll(cli);
    if (srv)
        tern_rpc_poll(srv);
    if (cli2)
        tern_rpc_poll(cli2);
}

bool poll_until(const int *counter, int want, int ms)
{
    double end = now_ms() + ms;

    while (*counter < want) {
        if (now_ms() > end)
            return false;
        poll_eps();
    }
    return true;
}

void poll_for(int ms)
{
    double end = now_ms() + ms;

    while (now_ms() < end)
        poll_eps();
}

/* Call and wait for the continuation; the result lands in r. */
void call_wait(uint16_t svc, uint16_t method, const void *req, size_t len,
               uint64_t timeout_ns, struct rec *r)
{
    int rc = tern_call(sess, svc, method, req, len, timeout_ns, rec_cont, r, NULL);

    ck_assert_msg(rc == 0, "tern_call %u.%u: %s", svc, method, tern_strerror(rc));
    ck_assert_msg(poll_until(&r->runs, 1, WAIT_MS), "call %u.%u never completed", svc, method);
}

/* An error reply: the status, and no payload. */
void expect_error(uint16_t svc, uint16_t method, int want)
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
void expect_echo(size_t len)
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

/* ---- a server played at the transport level ---- */

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

void fake_start(struct fake *f, enum fake_mode mode)
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

void fake_stop(struct fake *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    tern_tp_close(f->tp);
}
