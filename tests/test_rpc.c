/* The RPC layer in one process: a server endpoint and a client endpoint,
 * both polled by the test (rpc_fixture.h). The suite is assembled here
 * from files that share rpc_fixture.h:
 *
 *   test_rpc.c              (this file) registration, round trips and
 *                           handler outcomes, errors and addresses, the
 *                           size limits the peer announced
 *   test_rpc_calls.c        many calls: credits and slots, gathered
 *                           requests, the largest reply
 *   test_rpc_cancel.c       cancellation, closing and deadlines
 *   test_rpc_wait.c         sleeping in the application's own loop
 *   test_rpc_hostile.c      misbehaving clients and servers played at the
 *                           transport level, a client that never reads
 *   test_rpc_rma.c          one-sided access through sessions
 *   test_rpc_rma_faults.c   one-sided operations when sessions fail
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_fixture.h"
#include "suites.h"

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

void rpc_add_basics(const struct rpc_cases *c)
{
    tcase_add_test(c->basic, register_errors);
    tcase_add_test(c->basic, echo_sizes);
    tcase_add_test(c->basic, request_over_max_msg);
    tcase_add_test(c->basic, call_argument_errors);
    tcase_add_test(c->basic, unknown_service_and_method);
    tcase_add_test(c->basic, handler_ids);
    tcase_add_test(c->basic, handler_error_codes);
    tcase_add_test(c->basic, alloc_then_error);
    tcase_add_test(c->basic, reply_shrink);
    tcase_add_test(c->basic, reply_alloc_once);
    tcase_add_test(c->basic, empty_reply);
    tcase_add_test(c->own, strerror_for_used_codes);
    tcase_add_test(c->own, connect_refused);
    tcase_add_test(c->basic, connect_bad_uris);
    tcase_add_test(c->basic, listen_bad_uris);
    tcase_add_test(c->own, reply_over_client_max_msg);
    tcase_add_test(c->own, request_over_server_max_msg);
}

TCase *rpc_hold_tcase(void);     /* test_rpc_hold.c */
TCase *rpc_gate_tcase(void);     /* test_rpc_hold.c */

Suite *suite_rpc(void)
{
    Suite *s = suite_create("rpc");
    struct rpc_cases c = {
        .basic = tcase_create("basic"),
        .own = tcase_create("own_pair"),
        .rma = tcase_create("rma"),
        .bad = tcase_create("bad_clients"),
    };

    /* Tests that share the default server/client pair. */
    tcase_add_checked_fixture(c.basic, setup_default, pair_close);
    tcase_set_timeout(c.basic, 30);
    /* Tests that build their own pair with a particular configuration. */
    tcase_set_timeout(c.own, 60);
    /* One-sided access through sessions. */
    tcase_set_timeout(c.rma, 60);
    tcase_add_checked_fixture(c.bad, setup_default, pair_close);
    tcase_set_timeout(c.bad, 30);
    rpc_add_basics(&c);
    rpc_add_calls(&c);
    rpc_add_cancel(&c);
    rpc_add_wait(&c);
    rpc_add_hostile(&c);
    rpc_add_rma(&c);
    rpc_add_rma_faults(&c);
    suite_add_tcase(s, c.basic);
    suite_add_tcase(s, c.own);
    suite_add_tcase(s, c.rma);
    suite_add_tcase(s, c.bad);
    suite_add_tcase(s, rpc_hold_tcase());
    suite_add_tcase(s, rpc_gate_tcase());
    return s;
}
