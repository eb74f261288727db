/* rpc: misbehaving peers played at the transport level (tern_tp_*, RPC
 * frames built by hand from wire.h): clients that break the protocol or
 * never say HELLO, a server (on its own thread, rpc_fixture.h) that answers
 * wrongly, and a client that never reads its replies.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_fixture.h"
#include "rpc_internal.h"
#include "wire.h"

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
        poll_eps();
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

void rpc_add_hostile(const struct rpc_cases *c)
{
    tcase_add_loop_test(c->bad, server_survives_bad_client, BAD_SHORT, BAD_TYPE + 1);
    tcase_add_test(c->own, silent_clients_time_out);
    tcase_add_test(c->own, hostile_server_handshake);
    tcase_add_test(c->own, connect_to_other_rpc_version);
    tcase_add_test(c->own, hostile_server_replies);
    tcase_add_test(c->own, hostile_server_short_message);
    tcase_add_test(c->own, backpressure_unread_replies);
}
