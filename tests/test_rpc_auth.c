/* The cluster key, over every fabric: sessions between holders work,
 * one-sided access included; a peer without the key, with another key, or
 * a server without one is refused with TERN_EAUTH and the server keeps
 * serving; a transport connection that never authenticated cannot touch a
 * registered window; a session's token opens nothing without the
 * session's secret, while the session itself fails over and back with
 * it; and a server in protected mode (no key) takes only processes of
 * its own host. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fabrics.h"
#include "procs.h"
#include "rpc.h"
#include "rpc_internal.h"
#include "suites.h"
#include "transport.h"

#define SEC 1000000000ull
#define SVC 0x7a75
#define M_ECHO 1
#define M_WINDOW 2                   /* the rkey of the server's window */
#define M_DROP 3                     /* echo, and the connection dies */
#define WIN 4096

static const uint8_t key_a[32] = "tern cluster key A: 32 bytes...";
static const uint8_t key_b[32] = "tern cluster key B: 32 bytes...";

static struct tern_rpc_mr *window;

static int p_echo(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, len);

    (void)ctx;
    if (len && !out)
        return TERN_EMSGSIZE;
    if (len)
        memcpy(out, data, len);
    return 0;
}

static int p_window(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_tp_rkey rk, *out;
    int rc;

    (void)data;
    (void)len;
    (void)ctx;
    if ((rc = tern_rpc_mr_rkey(window, tern_req_session(req), &rk)) < 0)
        return rc;
    out = tern_reply_alloc(req, sizeof(rk));
    if (!out)
        return TERN_ENOMEM;
    *out = rk;
    return 0;
}

static int p_drop(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    rpc_test_drop(req);
    return p_echo(req, data, len, ctx);
}

static const struct tern_method methods[] = {
    {.id = M_ECHO, .name = "echo", .handler = p_echo},
    {.id = M_WINDOW, .name = "window", .handler = p_window},
    {.id = M_DROP, .name = "drop", .handler = p_drop},
};

static const struct tern_service service = {
    .name = "auth", .id = SVC, .methods = methods,
    .n_methods = sizeof(methods) / sizeof(methods[0]),
};

static const char *extra_listen;     /* the server's second address, or NULL */

static void setup(struct tern_rpc_ep *ep)
{
    if (tern_rpc_register(ep, &service) < 0 ||
        tern_rpc_mr_alloc(ep, WIN, TERN_TP_ACCESS_LOCAL | TERN_TP_ACCESS_REMOTE_WRITE |
                                       TERN_TP_ACCESS_REMOTE_READ, &window) < 0)
        _exit(7);
    memset(tern_rpc_mr_addr(window), 0x5a, WIN);
    if (extra_listen && tern_rpc_listen(ep, extra_listen, NULL, 0) < 0)
        _exit(8);
}

static struct tern_rpc_config keyed(const uint8_t *key)
{
    return (struct tern_rpc_config){.size = sizeof(struct tern_rpc_config), .key = key,
                                    .key_len = key ? 32 : 0};
}

static pid_t serve(int row, const uint8_t *key, char *uri, size_t len)
{
    struct tern_rpc_config cfg = keyed(key);
    pid_t pid = spawn_rpc_server_at(setup, &cfg, test_fabric_listen(row), uri, len);

    ck_assert_int_gt(pid, 0);
    return pid;
}

static int client(const uint8_t *key, const char *uri, struct tern_rpc_ep **ep,
                  struct tern_session **s)
{
    struct tern_rpc_config cfg = keyed(key);

    ck_assert_int_eq(tern_rpc_open(&cfg, ep), 0);
    return tern_rpc_connect(*ep, uri, 3 * SEC, s);
}

static void assert_echo(struct tern_session *s)
{
    char out[16];
    size_t n = 0;
    int rc = tern_call_sync(s, SVC, M_ECHO, "hello", 5, out, sizeof(out), &n, 3 * SEC);

    ck_assert_msg(rc == 0, "echo: %s", tern_strerror(rc));
    ck_assert_uint_eq(n, 5);
    ck_assert(memcmp(out, "hello", 5) == 0);
}

/* ---- holders of the key ---- */

static void put_done(void *arg, int status)
{
    *(int *)arg = status;
}

START_TEST(holders_of_the_key_talk_on_every_fabric)
{
    char uri[160];
    pid_t pid = serve(_i, key_a, uri, sizeof(uri));
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    int rc = client(key_a, uri, &ep, &s);

    ck_assert_msg(rc == 0, "%s: %s", test_fabric_name(_i), tern_strerror(rc));
    assert_echo(s);
    /* One-sided access, once authenticated. */
    if (tern_session_caps(s) & TERN_TP_CAP_PUT) {
        struct tern_tp_rkey rk;
        struct tern_rpc_mr *mine;
        size_t n = 0;
        int st = 1;

        ck_assert_int_eq(tern_call_sync(s, SVC, M_WINDOW, NULL, 0, &rk, sizeof(rk), &n, 3 * SEC),
                         0);
        ck_assert_int_eq(tern_rpc_mr_alloc(ep, 64, TERN_TP_ACCESS_LOCAL, &mine), 0);
        ck_assert_int_eq(tern_session_put(s, mine, 0, 64, &rk, 0, put_done, &st), 0);
        for (uint64_t t0 = tern_now_ns(); st == 1 && tern_now_ns() - t0 < 20 * SEC;)
            tern_rpc_poll(ep);
        ck_assert_msg(st == 0, "%s: put: %s", test_fabric_name(_i), tern_strerror(st));
    }
    tern_rpc_close(ep);
    ck_assert_int_eq(stop_server(pid), 0);
}
END_TEST

/* ---- refusals ---- */

START_TEST(a_peer_without_the_key_is_refused)
{
    char uri[160], plain_uri[160];
    pid_t pid = serve(_i, key_a, uri, sizeof(uri)), plain;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    int rc;

    /* No key, another key: TERN_EAUTH, said by the server. */
    rc = client(NULL, uri, &ep, &s);
    ck_assert_msg(rc == TERN_EAUTH, "%s, no key: %s", test_fabric_name(_i), tern_strerror(rc));
    tern_rpc_close(ep);
    rc = client(key_b, uri, &ep, &s);
    ck_assert_msg(rc == TERN_EAUTH, "%s, key B: %s", test_fabric_name(_i), tern_strerror(rc));
    tern_rpc_close(ep);
    /* The server serves the holders all the same. */
    ck_assert_int_eq(client(key_a, uri, &ep, &s), 0);
    assert_echo(s);
    tern_rpc_close(ep);
    ck_assert_int_eq(stop_server(pid), 0);

    /* A server without a key is not trusted by a client with one. */
    plain = serve(_i, NULL, plain_uri, sizeof(plain_uri));
    rc = client(key_a, plain_uri, &ep, &s);
    ck_assert_msg(rc == TERN_EAUTH, "%s, keyless server: %s", test_fabric_name(_i),
                  tern_strerror(rc));
    tern_rpc_close(ep);
    ck_assert_int_eq(stop_server(plain), 0);
}
END_TEST

/* ---- windows ---- */

/* A transport connection that never says HELLO, with the window's real
 * key (learnt by a holder, who stays connected where the fabric takes two
 * peers): its put is refused, and the window is as it was. On rdma the NIC serves one-sided access
 * without the server's CPU: the key is a memory window bound to the
 * holder's connection, which the NIC refuses on any other. */
START_TEST(no_window_before_authentication)
{
    char uri[160];
    struct tern_tp_config tc = {.fabric = test_fabric_name(_i)};
    struct tern_tp_event ev[8];
    struct tern_tp_rkey rk;
    struct tern_tp_ep *tp;
    struct tern_tp_conn *conn;
    struct tern_tp_mr *mr;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    static uint8_t buf[64];
    size_t n = 0;
    int status = 1, rc;
    bool p2p;
    pid_t pid;

    if (!(test_fabric_caps(_i) & TERN_TP_CAP_PUT))
        return;
    p2p = test_fabric_caps(_i) & TERN_TP_CAP_POINT_TO_POINT;
    pid = serve(_i, key_a, uri, sizeof(uri));
    ck_assert_int_eq(client(key_a, uri, &ep, &s), 0);
    ck_assert_int_eq(tern_call_sync(s, SVC, M_WINDOW, NULL, 0, &rk, sizeof(rk), &n, 3 * SEC), 0);
    /* An NTB link takes one peer: there the holder makes room. */
    if (p2p)
        tern_rpc_close(ep);

    ck_assert_int_eq(tern_tp_open(&tc, &tp), 0);
    ck_assert_int_eq(tern_tp_mr_reg(tp, buf, sizeof(buf), TERN_TP_ACCESS_LOCAL, &mr), 0);
    ck_assert_int_eq(tern_tp_connect(tp, strstr(uri, "://") + 3, &conn), 0);
    /* Until the put completes or the connection goes: by the clock, not
     * a count of polls (a loaded machine sets an NTB link up slowly). */
    for (uint64_t t0 = tern_now_ns(); status == 1 && tern_now_ns() - t0 < 20 * SEC;) {
        int got = tern_tp_poll(tp, ev, 8);

        for (int e = 0; e < got; e++) {
            if (ev[e].type == TERN_TP_EV_CONNECTED) {
                ck_assert_int_eq(ev[e].status, 0);
                rc = tern_tp_put(conn, mr, 0, sizeof(buf), &rk, 0, 42);
                ck_assert_msg(rc == 0, "put: %s", tern_strerror(rc));
            } else if (ev[e].type == TERN_TP_EV_PUT_DONE) {
                status = ev[e].status;
            } else if (ev[e].type == TERN_TP_EV_CLOSED) {
                status = ev[e].status ? ev[e].status : TERN_ECONNRESET;
            } else if (ev[e].type == TERN_TP_EV_RECV) {
                tern_tp_msg_release(ev[e].conn, ev[e].data);
            }
        }
    }
    ck_assert_msg(status < 0, "%s: a put without authentication: %s", test_fabric_name(_i),
                  tern_strerror(status));
    tern_tp_disconnect(conn);
    tern_tp_mr_dereg(mr);
    tern_tp_close(tp);
    /* The holder reads the window back: untouched (the put was zeros). */
    if (p2p) {
        ck_assert_int_eq(client(key_a, uri, &ep, &s), 0);
        ck_assert_int_eq(tern_call_sync(s, SVC, M_WINDOW, NULL, 0, &rk, sizeof(rk), &n, 3 * SEC),
                         0);
    }
    {
        struct tern_rpc_mr *lmr;
        uint8_t *got;

        ck_assert_int_eq(tern_rpc_mr_alloc(ep, sizeof(buf), TERN_TP_ACCESS_LOCAL, &lmr), 0);
        status = 1;
        ck_assert_int_eq(tern_session_get(s, lmr, 0, sizeof(buf), &rk, 0, put_done, &status), 0);
        for (uint64_t t0 = tern_now_ns(); status == 1 && tern_now_ns() - t0 < 5 * SEC;)
            tern_rpc_poll(ep);
        ck_assert_msg(status == 0, "%s: the holder's get: %s", test_fabric_name(_i),
                      tern_strerror(status));
        got = tern_rpc_mr_addr(lmr);
        for (size_t i = 0; i < sizeof(buf); i++)
            ck_assert_uint_eq(got[i], 0x5a);
        tern_rpc_mr_dereg(lmr);
    }
    tern_rpc_close(ep);
    ck_assert_int_eq(stop_server(pid), 0);
}
END_TEST

/* ---- the token ---- */

static bool on_fabric(struct tern_session *s, const char *f)
{
    return strcmp(tern_session_fabric(s), f) == 0;
}

/* An auto:// session with the key moves to shm, fails over when its shm
 * connection dies and moves back (its paths prove the session's secret);
 * another holder of the key that presents the session's token is refused
 * (it cannot prove the secret), and the session goes on. */
START_TEST(a_token_opens_nothing_without_its_session)
{
    struct tern_rpc_config cfg = keyed(key_a);
    struct tern_rpc_ep *ep, *thief;
    struct tern_session *s, *t = NULL;
    char uri[160], auto_uri[200], out[16];
    size_t n;
    pid_t pid;
    int rc;

    extra_listen = "shm://auto";
    pid = spawn_rpc_server_at(setup, &cfg, "tcp://127.0.0.1:0", uri, sizeof(uri));
    extra_listen = NULL;
    ck_assert_int_gt(pid, 0);
    snprintf(auto_uri, sizeof(auto_uri), "auto://%s", uri + 6);
    ck_assert_int_eq(tern_rpc_open(&cfg, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect_with(ep, auto_uri, "shm,tcp", 3 * SEC, &s), 0);
    /* On a loaded machine the move to shm can miss the connect's wait and
     * come from a later retry (paths.c): wait for it, calling meanwhile. */
    for (int k = 0; k < 1000 && !on_fabric(s, "shm"); k++) {
        assert_echo(s);
        usleep(10000);
    }
    ck_assert_str_eq(tern_session_fabric(s), "shm");
    assert_echo(s);

    /* The thief holds the key and the token, not the secret. */
    ck_assert_int_eq(tern_rpc_open(&cfg, &thief), 0);
    rc = rpc_connect_start(thief, uri, s->token, NULL, &t);
    for (uint64_t t0 = tern_now_ns(); rc == 0 && t->state == SESS_CONNECTING &&
                                      tern_now_ns() - t0 < 20 * SEC;)
        tern_rpc_poll(thief);
    ck_assert_msg(rc == 0 && t->state == SESS_DEAD && t->status == TERN_EAUTH,
                  "the thief's session: rc %d state %d status %d", rc, (int)t->state,
                  t ? t->status : 0);
    tern_rpc_close(thief);

    /* The session: shm dies under a call, TCP takes it, shm again. */
    n = 0;
    ck_assert_int_eq(tern_call_sync(s, SVC, M_DROP, "x", 1, out, sizeof(out), &n, 3 * SEC), 0);
    for (int k = 0; k < 200 && !on_fabric(s, "tcp"); k++) {
        assert_echo(s);
        usleep(10000);
    }
    for (int k = 0; k < 300 && !on_fabric(s, "shm"); k++) {
        assert_echo(s);
        usleep(10000);
    }
    ck_assert_msg(on_fabric(s, "shm"), "not back on shm: %s", tern_session_fabric(s));
    assert_echo(s);
    tern_rpc_close(ep);
    ck_assert_int_eq(stop_server(pid), 0);
}
END_TEST

/* ---- protected mode ---- */

START_TEST(protected_mode_takes_only_this_host)
{
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .local_only = 1};
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    char uri[160];
    bool local = strcmp(test_fabric_name(_i), "tcp") == 0 || strcmp(test_fabric_name(_i), "shm") == 0;
    pid_t pid = spawn_rpc_server_at(setup, &cfg, test_fabric_listen(_i), uri, sizeof(uri));
    int rc;

    ck_assert_int_gt(pid, 0);
    rc = client(NULL, uri, &ep, &s);
    /* tcp over loopback and shm are this host; an NTB cable and a NIC,
     * emulated or not, stand for another. */
    if (local) {
        ck_assert_msg(rc == 0, "%s: %s", test_fabric_name(_i), tern_strerror(rc));
        assert_echo(s);
    } else {
        ck_assert_msg(rc == TERN_EACCES, "%s: %s", test_fabric_name(_i), tern_strerror(rc));
    }
    tern_rpc_close(ep);
    ck_assert_int_eq(stop_server(pid), 0);
}
END_TEST

/* A client that says HELLO and never proves the key (here: one with
 * another key, which finds the server's proof wrong and stops) holds a
 * connection only until the HELLO timeout. */
START_TEST(a_client_that_never_proves_is_dropped)
{
    struct tern_rpc_config scfg = keyed(key_a), ccfg = keyed(key_b);
    struct tern_rpc_ep *srv, *cli;
    struct tern_session *s;
    char bound[128];
    uint64_t t0;
    bool waiting = false;

    scfg.hello_timeout_ns = 200000000;
    ck_assert_int_eq(tern_rpc_open(&scfg, &srv), 0);
    ck_assert_int_eq(tern_rpc_register(srv, &service), 0);
    ck_assert_int_eq(tern_rpc_listen(srv, "tcp://127.0.0.1:0", bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_rpc_open(&ccfg, &cli), 0);
    ck_assert_int_eq(rpc_connect_start(cli, bound, 0, NULL, &s), 0);
    t0 = tern_now_ns();
    while (tern_now_ns() - t0 < 150000000ull) {
        tern_rpc_poll(srv);
        tern_rpc_poll(cli);
        for (struct tern_session *x = srv->sessions; x; x = x->next)
            waiting |= x->state == SESS_AUTH;
    }
    ck_assert_msg(waiting, "the server never waited for AUTH");
    ck_assert_int_eq(tern_session_status(s), TERN_EAUTH);
    while (tern_now_ns() - t0 < 1000000000ull && srv->n_sessions)
        tern_rpc_poll(srv);
    ck_assert_uint_eq(srv->n_sessions, 0);
    tern_rpc_close(cli);
    tern_rpc_close(srv);
}
END_TEST

Suite *suite_rpc_auth(void)
{
    Suite *s = suite_create("rpc_auth");
    TCase *tc = tcase_create("auth");

    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, holders_of_the_key_talk_on_every_fabric, 0, test_fabric_count());
    tcase_add_loop_test(tc, a_peer_without_the_key_is_refused, 0, test_fabric_count());
    tcase_add_loop_test(tc, no_window_before_authentication, 0, test_fabric_count());
    tcase_add_test(tc, a_token_opens_nothing_without_its_session);
    tcase_add_test(tc, a_client_that_never_proves_is_dropped);
    tcase_add_loop_test(tc, protected_mode_takes_only_this_host, 0, test_fabric_count());
    suite_add_tcase(s, tc);
    return s;
}
