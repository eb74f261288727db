/* rpc: calls that do not end with their reply. Cancelled calls, sent or
 * queued; sessions closed with calls in flight or from a continuation;
 * deadlines that the handler sees, that expire locally and in the queue,
 * and continuations of expiries that cancel or close; a connection that
 * dies under tern_call (no continuation runs inside it).
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rpc_fixture.h"
#include "rpc_internal.h"
#include "tcp/tcp_wire.h"
#include "wire.h"

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
    poll_eps();    /* let it go out */
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
    poll_eps();
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

void rpc_add_cancel(const struct rpc_cases *c)
{
    tcase_add_test(c->basic, cancel_sent_call);
    tcase_add_test(c->own, cancel_queued_call);
    tcase_add_test(c->own, cancel_sends_queued_call);
    tcase_add_test(c->own, expiry_sends_queued_call);
    tcase_add_test(c->own, many_deadlines_sent_at_once);
    tcase_add_test(c->basic, cancel_unknown_ids);
    tcase_add_test(c->own, session_close_cancels_in_flight);
    tcase_add_test(c->basic, close_from_continuation);
    tcase_add_test(c->basic, call_on_closed_session_fails);
    tcase_add_test(c->basic, handler_sees_deadline);
    tcase_add_test(c->basic, local_deadline_expires);
    tcase_add_test(c->basic, timeout_max_means_no_deadline);
    tcase_add_test(c->own, queued_call_expires);
    tcase_add_test(c->basic, expiry_continuation_cancels_other);
    tcase_add_test(c->basic, expiry_continuation_closes_session);
    tcase_add_test(c->own, client_send_path_full);
    tcase_add_test(c->own, no_continuation_inside_tern_call);
}
