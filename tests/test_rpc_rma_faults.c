/* rpc: one-sided operations when sessions fail (case rma,
 * rpc_rma_fixture.h). A session closed, lost on the server's side, or
 * killed by a protocol error with operations in flight (each completes
 * once), a server that goes away, operation slots run out, a get that
 * times out, and an auto:// session failing over from shm to tcp.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rpc_rma_fixture.h"
#include "rpc_internal.h"

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
    poll_for(100);
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
    ck_assert(poll_until(&push_runs, 1, WAIT_MS));
    ck_assert_msg(push_status == TERN_ECONNRESET, "server's put: %s",
                  status_name(push_status));
    ck_assert_msg(push_again_rc == TERN_ENOTCONN, "a put from the callback: %s",
                  status_name(push_again_rc));
    push_again = false;
    ck_assert(poll_until(&r.runs, 1, WAIT_MS));
    ck_assert_int_eq(r.status, TERN_ECONNRESET);
    poll_for(100);
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
    poll_for(50);
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
        poll_eps();
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
    poll_for(50);                   /* the server answers late */
    ck_assert_int_eq(r.runs, 1);
    /* All four slots at once: the late answer freed the orphan's. */
    {
        struct rma_rec q[4] = {{0}};
        int done = 0;

        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(tern_session_get(sess, cmr, 0, 100, &srk, 0, rma_cb, &q[i]), 0);
        for (double end = now_ms() + WAIT_MS; done < 4 && now_ms() < end;) {
            poll_eps();
            done = q[0].runs + q[1].runs + q[2].runs + q[3].runs;
        }
        ck_assert_int_eq(done, 4);
        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(q[i].status, 0);
    }
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
    rma_fill(tern_rpc_mr_addr(cmr), 8192, 10);
    rma_expect(sess, true, cmr, 0, 100, &srk_shm, 0, 0);
    expect_push(sess, cmr, 4096, 100, 0x42);
    ck_assert_uint_eq(tern_session_epoch(sess), epoch);

    /* The server loses the shm path after answering; a put follows the
     * call on that path. */
    rec_init(&r, 0);
    ck_assert_int_eq(tern_call(sess, RSVC, R_DROP, NULL, 0, 0, rec_cont, &r, NULL), 0);
    ck_assert_int_eq(rma_start_retry(sess, true, cmr, 0, 64, &srk_shm, 0, &put), 0);
    ck_assert(poll_until(&r.runs, 1, WAIT_MS));
    ck_assert_msg(r.status == 0, "the dropped call: %s", status_name(r.status));
    ck_assert(poll_until(&put.runs, 1, WAIT_MS));
    poll_for(50);
    ck_assert_msg(put.runs == 1, "the put on the dead path completed %d times", put.runs);
    ck_assert_str_eq(tern_session_fabric(sess), "tcp");
    ck_assert_int_eq(tern_session_status(sess), 0);
    ck_assert_msg(tern_session_epoch(sess) != epoch, "epoch unchanged after a failover");

    /* New keys on the new fabric, on both sides. */
    srk_tcp = srv_key(sess, 0);
    ck_assert(srk_tcp.key != srk_shm.key);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, sess, &c_tcp), 0);
    ck_assert(c_tcp.key != c_shm.key);
    rma_fill(tern_rpc_mr_addr(cmr), 8192, 11);
    rma_expect(sess, true, cmr, 0, 300, &srk_tcp, 1000, 0);
    srv_expect(sess, 0, 1000, 300, tern_rpc_mr_addr(cmr), "put after the failover");
    expect_push(sess, cmr, 5000, 100, 0x24);
    rma_pair_close();
}
END_TEST

void rpc_add_rma_faults(const struct rpc_cases *c)
{
    tcase_add_test(c->rma, rma_close_fails_ops_once);
    tcase_add_test(c->rma, rma_server_session_gone);
    tcase_add_test(c->rma, rma_server_gone);
    tcase_add_test(c->rma, rma_protocol_error_fails_ops_once);
    tcase_add_test(c->rma, rma_slot_exhaustion);
    tcase_add_test(c->rma, rma_timeout);
    tcase_add_test(c->rma, rma_epoch_failover);
}
