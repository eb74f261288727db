/* rpc: sleeping in the application's own loop (tern_rpc_wait_fd and
 * tern_rpc_arm): the descriptor before listening, woken by a request,
 * events owed when arming, and an endpoint on two fabrics.
 */
#include <check.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc_fixture.h"
#include "rpc_internal.h"

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
        ck_assert(poll_until(&r.runs, 1, WAIT_MS));
        ck_assert_int_eq(r.status, 0);
        ck_assert(r.len == 3 && memcmp(r.buf, name, 3) == 0);
        free(r.buf);
    }
    pair_close();
}
END_TEST

void rpc_add_wait(const struct rpc_cases *c)
{
    tcase_add_test(c->own, wait_fd_before_listen);
    tcase_add_test(c->basic, wait_fd_wakes_on_request);
    tcase_add_test(c->own, wait_arm_reports_owed_events);
    tcase_add_test(c->own, wait_fd_two_fabrics);
}
