/* The shm fabric's own properties beyond the conformance suite: many
 * connections share a few links (sockets and window pairs), so thousands of
 * connections are cheap, and each keeps its own ordered stream. */
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "shm/shm_internal.h"
#include "suites.h"

static unsigned count_links(struct tern_tp_ep *ep)
{
    unsigned n = 0;

    for (struct ring_link *l = REP(ep)->links; l; l = l->next)
        n++;
    return n;
}


/* An auto name taken by someone else (a child an earlier process of this
 * pid forked keeps that process's listener open) is skipped. */
START_TEST(auto_name_taken_is_skipped)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct tern_tp_ep *ep = tp_open("shm", 4096);
    char bound[128], want[64];
    socklen_t sl;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);

    /* The first auto name of a new endpoint of this process. */
    sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                     (size_t)snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1,
                                      "tern-shm/auto-%d-1", (int)getpid()));
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sl), 0);
    ck_assert_int_eq(tern_tp_listen(ep, "auto", bound, sizeof(bound)), 0);
    snprintf(want, sizeof(want), "auto-%d-2", (int)getpid());
    ck_assert_str_eq(bound, want);
    close(fd);
    tern_tp_close(ep);
}
END_TEST

START_TEST(thousands_of_connections)
{
    enum { NC = 3000, NM = 3 };
    struct tern_tp_config cfg = {.fabric = "shm", .max_msg = 4096};
    struct tern_tp_ep *a, *b;
    static struct tern_tp_conn *conns[NC];
    static unsigned next[NC];
    struct tern_tp_event ev;
    char bound[128];
    unsigned accepted = 0, connected = 0, got = 0, fds_before = test_open_fds();

    ck_assert_int_eq(tern_tp_open(&cfg, &a), 0);
    ck_assert_int_eq(tern_tp_open(&cfg, &b), 0);
    ck_assert_int_eq(tern_tp_listen(b, "auto", bound, sizeof(bound)), 0);
    for (unsigned i = 0; i < NC; i++)
        ck_assert_int_eq(tern_tp_connect(a, bound, &conns[i]), 0);
    /* 63 connections per link (channel 0 is the link's own). */
    ck_assert_uint_eq(count_links(a), (NC + 62) / 63);
    /* A socket per link per side and nothing per connection. */
    ck_assert_uint_le(test_open_fds() - fds_before, 2 * count_links(a) + 8);
    for (unsigned m = 0; m < NM; m++)
        for (unsigned i = 0; i < NC; i++) {
            unsigned v[2] = {i, m};

            ck_assert_int_eq(tern_tp_msg_send(conns[i], v, sizeof(v)), 0);
        }
    while (got < NC * NM || connected < NC) {
        if (tp_next(a, &ev, 0)) {
            ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
            ck_assert_int_eq(ev.status, 0);
            connected++;
            continue;
        }
        if (!tp_next(b, &ev, 10))
            continue;
        if (ev.type == TERN_TP_EV_ACCEPTED) {
            tern_tp_conn_set_user(ev.conn, (void *)(uintptr_t)accepted++);
            continue;
        }
        ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
        {
            const unsigned *v = ev.data;

            ck_assert_uint_lt(v[0], NC);
            ck_assert_uint_eq(v[1], next[v[0]]++);
        }
        tern_tp_msg_release(ev.conn, ev.data);
        got++;
    }
    ck_assert_uint_eq(accepted, NC);
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* Closing one connection closes only its channel: its peer sees CLOSED,
 * the other connections on the same link carry on, and the next connection
 * gets a fresh channel. */
START_TEST(close_one_channel)
{
    struct tern_tp_config cfg = {.fabric = "shm", .max_msg = 4096};
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *c1, *c2, *s1 = NULL, *s2 = NULL, *c3;
    struct tern_tp_event ev;
    char bound[128];
    int closed = 0, got = 0;

    ck_assert_int_eq(tern_tp_open(&cfg, &a), 0);
    ck_assert_int_eq(tern_tp_open(&cfg, &b), 0);
    ck_assert_int_eq(tern_tp_listen(b, "auto", bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &c1), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &c2), 0);
    ck_assert_uint_eq(count_links(a), 1);
    ck_assert_int_eq(tern_tp_msg_send(c1, "1", 1), 0);
    ck_assert_int_eq(tern_tp_msg_send(c2, "2", 1), 0);
    while (!s1 || !s2) {
        ck_assert(tp_next2(b, a, &ev, 5000));
        if (ev.type == TERN_TP_EV_RECV) {
            if (*(const char *)ev.data == '1')
                s1 = ev.conn;
            else
                s2 = ev.conn;
            tern_tp_msg_release(ev.conn, ev.data);
        }
    }
    /* The server closes connection 1: client 1 sees CLOSED, client 2 not. */
    tern_tp_disconnect(s1);
    ck_assert_int_eq(tern_tp_msg_send(c2, "x", 1), 0);
    while (!closed || !got) {
        ck_assert(tp_next2(a, b, &ev, 5000) || tp_next(b, &ev, 0));
        if (ev.conn == c1 && ev.type == TERN_TP_EV_CLOSED)
            closed++;
        else if (ev.conn == s2 && ev.type == TERN_TP_EV_RECV) {
            got++;
            tern_tp_msg_release(ev.conn, ev.data);
        } else
            ck_assert_msg(ev.type == TERN_TP_EV_CONNECTED, "unexpected event %d", ev.type);
        if (!got && tp_next(b, &ev, 0)) {
            ck_assert_ptr_eq(ev.conn, s2);
            ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
            got++;
            tern_tp_msg_release(ev.conn, ev.data);
        }
    }
    tern_tp_disconnect(c1);
    /* A new connection reuses the link with a new channel. */
    ck_assert_int_eq(tern_tp_connect(a, bound, &c3), 0);
    ck_assert_uint_eq(count_links(a), 1);
    ck_assert_int_eq(tern_tp_msg_send(c3, "3", 1), 0);
    for (;;) {
        ck_assert(tp_next2(b, a, &ev, 5000));
        if (ev.type == TERN_TP_EV_RECV) {
            ck_assert_int_eq(*(const char *)ev.data, '3');
            tern_tp_msg_release(ev.conn, ev.data);
            break;
        }
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* A connected pair on its own endpoints, with small messages. */
static void shm_pair(struct tern_tp_ep **a, struct tern_tp_ep **b, struct tern_tp_conn **ca,
                     struct tern_tp_conn **cb, unsigned max_conns)
{
    struct tern_tp_config cfg = {.fabric = "shm", .max_msg = 4096};
    struct tern_tp_config bcfg = {.fabric = "shm", .max_msg = 4096, .max_conns = max_conns};
    struct tern_tp_event ev;
    char bound[128];

    ck_assert_int_eq(tern_tp_open(&cfg, a), 0);
    ck_assert_int_eq(tern_tp_open(&bcfg, b), 0);
    ck_assert_int_eq(tern_tp_listen(*b, "auto", bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(*a, bound, ca), 0);
    ck_assert(tp_next2(*b, *a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
    *cb = ev.conn;
    ck_assert(tp_next(*a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
}

/* Fill the ring from `from` until the receiver's credit runs out. */
static unsigned fill(struct tern_tp_conn *from)
{
    static char msg[4000];
    unsigned n = 0;

    while (tern_tp_msg_send(from, msg, sizeof(msg)) == 0)
        n++;
    return n;
}

/* A peer that leaves with a one-sided request we cannot answer (no credit
 * left to answer with) still ends in CLOSED, not in an endless drain. */
START_TEST(drain_ends_with_unanswerable_request)
{
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *ca, *cb;
    struct tern_tp_event ev;
    struct tern_tp_mr *lmr;
    struct tern_tp_rkey bogus = {.key = 12345, .len = 64};
    static uint8_t mem[64];
    double t0;

    shm_pair(&a, &b, &ca, &cb, 0);
    ck_assert_uint_gt(fill(cb), 0);
    ck_assert_int_eq(tern_tp_mr_reg(a, mem, sizeof(mem), 0, &lmr), 0);
    ck_assert_int_eq(tern_tp_get(ca, lmr, 0, 64, &bogus, 0, 1), 0);
    tern_tp_flush(a);
    tern_tp_disconnect(ca);
    t0 = now_ms();
    for (;;) {
        ck_assert_msg(now_ms() - t0 < 3000, "still not closed after 3 s");
        if (!tp_next(b, &ev, 10))
            continue;
        if (ev.type == TERN_TP_EV_CLOSED) {
            ck_assert_ptr_eq(ev.conn, cb);
            break;
        }
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

struct drainer {
    struct tern_tp_ep *b;
    unsigned want;
};

static void *drain_later(void *arg)
{
    struct drainer *d = arg;
    struct tern_tp_event ev[32];
    unsigned got = 0;

    usleep(100000);
    while (got < d->want) {
        int n = tern_tp_poll(d->b, ev, 32);

        for (int i = 0; i < n; i++)
            if (ev[i].type == TERN_TP_EV_RECV) {
                tern_tp_msg_release(ev[i].conn, ev[i].data);
                got++;
            }
    }
    for (int i = 0; i < 100; i++)   /* let the flush ring the doorbell */
        tern_tp_poll(d->b, ev, 32);
    return NULL;
}

/* A sender out of credit sleeps instead of spinning, and the receiver's
 * credit answer wakes it through the doorbell. */
START_TEST(sender_sleeps_until_credit_returns)
{
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *ca, *cb;
    struct drainer d;
    pthread_t t;
    struct timespec c0, c1;
    double t0, waited;
    int woke;

    shm_pair(&a, &b, &ca, &cb, 0);
    d = (struct drainer){.b = b, .want = fill(ca)};
    ck_assert_uint_gt(d.want, 0);
    /* Nobody drains yet: the wait must sleep its full 100 ms, not spin. */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    t0 = now_ms();
    ck_assert_int_eq(tern_tp_wait(a, 100000000ll), 0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    ck_assert(now_ms() - t0 >= 90);
    ck_assert((c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) / 1e6 < 50);
    /* Now a reader drains after 100 ms; the doorbell ends a 5 s wait. */
    ck_assert_int_eq(pthread_create(&t, NULL, drain_later, &d), 0);
    t0 = now_ms();
    woke = tern_tp_wait(a, 5000000000ll);
    waited = now_ms() - t0;
    pthread_join(t, NULL);
    ck_assert_int_eq(woke, 1);
    ck_assert_msg(waited < 3000, "woke only after %.0f ms", waited);
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* A channel the listener refuses (connection limit) is closed back to the
 * connecting side at once. */
START_TEST(refused_channel_is_closed)
{
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *ca, *cb, *extra;
    struct tern_tp_event ev;
    char bound[128];
    double t0;

    shm_pair(&a, &b, &ca, &cb, 1);
    ck_assert_int_eq(tern_tp_listen(b, "auto", bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &extra), 0);
    t0 = now_ms();
    for (;;) {
        ck_assert_msg(now_ms() - t0 < 3000, "refused channel never closed");
        if (!tp_next2(a, b, &ev, 10))
            continue;
        if (ev.conn == extra && ev.type == TERN_TP_EV_CLOSED)
            break;
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

Suite *suite_shm(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("links");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, thousands_of_connections);
    tcase_add_test(tc, close_one_channel);
    tcase_add_test(tc, drain_ends_with_unanswerable_request);
    tcase_add_test(tc, sender_sleeps_until_credit_returns);
    tcase_add_test(tc, refused_channel_is_closed);
    tcase_add_test(tc, auto_name_taken_is_skipped);
    suite_add_tcase(s, tc);
    return s;
}
