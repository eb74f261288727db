/* The rdma fabric beyond the conformance suite: a shared receive queue run
 * dry, a peer process killed, a connect request that is not ours, and
 * peers whose rings differ in size. The fabric runs on the host's NIC if
 * it has one, else on softverbs; the test of a foreign request talks
 * rdma_cm itself and so always uses softverbs. */
#include <endian.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <softverbs.h>

#include "../transport/rdma/rdma_internal.h"   /* the attacker's knowledge: a ring's address and key */
#include "helpers.h"
#include "suites.h"

static const struct fabric_case *rdma_case(void)
{
    int i = test_fabric_row("rdma");   /* the conformance rows follow the matrix */

    if (i >= 0 && i < n_fabric_cases)
        return &fabric_cases[i];
    ck_abort_msg("no rdma row in fabric_cases");
    return NULL;
}

static void send_seq(struct tern_tp_conn *c, unsigned i, size_t len)
{
    uint8_t msg[4096] = {0};

    memcpy(msg, &i, sizeof(i));
    ck_assert_int_eq(tern_tp_msg_send(c, msg, len), 0);
}

static void expect_seq(struct tern_tp_ep *ep, struct tern_tp_ep *other, unsigned i, size_t len)
{
    struct tern_tp_event ev;

    ck_assert_msg(tp_next2(ep, other, &ev, 5000), "message %u never came", i);
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    ck_assert_uint_eq(ev.len, len);
    ck_assert_uint_eq(*(const unsigned *)ev.data, i);
    tern_tp_msg_release(ev.conn, ev.data);
}

/* A receiver whose SRQ holds 16 receives, sent 300 messages over three
 * connections before it polls: the NIC's receiver-not-ready retries hold
 * the rest back until receives are put back, and nothing is lost or
 * reordered. */
START_TEST(srq_exhaustion_is_waited_out)
{
    enum { NC = 3, NM = 100 };
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *c[NC];
    unsigned next[NC] = {0}, got = 0, up = 0, in = 0;
    struct tern_tp_event ev;
    char bound[128];

    setenv("TERN_RDMA_SRQ_DEPTH", "16", 1);
    a = tp_open("rdma", 0);
    b = tp_open("rdma", 0);
    ck_assert_int_eq(tern_tp_listen(b, rdma_case()->listen, bound, sizeof(bound)), 0);
    for (unsigned i = 0; i < NC; i++) {
        ck_assert_int_eq(tern_tp_connect(a, bound, &c[i]), 0);
        tern_tp_conn_set_user(c[i], (void *)(uintptr_t)i);
    }
    while (up < NC || in < NC) {
        ck_assert(tp_next2(a, b, &ev, 5000));
        ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
        ck_assert_int_eq(ev.status, 0);
        up++;
        while (in < NC && tp_next(b, &ev, 0)) {
            ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
            in++;
        }
    }
    for (unsigned m = 0; m < NM; m++)
        for (unsigned i = 0; i < NC; i++) {
            unsigned v[2] = {i, m};

            ck_assert_int_eq(tern_tp_msg_send(c[i], v, sizeof(v)), 0);
        }
    ck_assert_int_eq(tern_tp_flush(a), 0);
    while (got < NC * NM) {
        const unsigned *v;

        ck_assert_msg(tp_next2(b, a, &ev, 5000), "%u of %u arrived", got, NC * NM);
        ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
        v = ev.data;
        ck_assert_uint_lt(v[0], NC);
        ck_assert_uint_eq(v[1], next[v[0]]++);
        tern_tp_msg_release(ev.conn, ev.data);
        got++;
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* A peer process that is killed: a get in flight fails, then the
 * connection closes; the endpoint serves a new connection afterwards. */
START_TEST(killed_peer_closes_the_connection)
{
    struct tern_tp_ep *a = tp_open("rdma", 0);
    struct tern_tp_mr *lmr;
    struct tern_tp_conn *c;
    struct tern_tp_event ev;
    struct tern_tp_rkey rkey;
    char bound[128] = "";
    int fds[2];
    pid_t pid;
    bool failed = false, closed = false;

    ck_assert_int_eq(pipe(fds), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* The peer: listen, publish a region, then serve until killed. */
        struct tern_tp_ep *b = tp_open("rdma", 0);
        struct tern_tp_mr *rmr;

        if (tern_tp_listen(b, rdma_case()->listen, bound, sizeof(bound)) < 0 ||
            tern_tp_mr_alloc(b, 4096, TERN_TP_ACCESS_REMOTE_READ, &rmr) < 0)
            _exit(2);
        if (write(fds[1], bound, sizeof(bound)) < 0)
            _exit(3);
        /* Each connection gets the region's key in its first message. */
        for (;;)
            while (tern_tp_poll(b, &ev, 1) > 0)
                if (ev.type == TERN_TP_EV_RECV)
                    tern_tp_msg_release(ev.conn, ev.data);
                else if (ev.type == TERN_TP_EV_ACCEPTED &&
                         (tern_tp_conn_mr_rkey(ev.conn, rmr, &rkey) < 0 ||
                          tern_tp_msg_send(ev.conn, &rkey, sizeof(rkey)) < 0))
                    _exit(4);
    }
    ck_assert_int_eq(read(fds[0], bound, sizeof(bound)), (ssize_t)sizeof(bound));
    ck_assert_int_eq(tern_tp_mr_alloc(a, 4096, 0, &lmr), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &c), 0);
    ck_assert(tp_next(a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert_int_eq(ev.status, 0);
    ck_assert(tp_next(a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    ck_assert_uint_eq(ev.len, sizeof(rkey));
    memcpy(&rkey, ev.data, sizeof(rkey));
    tern_tp_msg_release(ev.conn, ev.data);
    send_seq(c, 1, 64);
    ck_assert_int_eq(tern_tp_get(c, lmr, 0, 64, &rkey, 0, 5), 0);
    ck_assert(tp_next(a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_GET_DONE);
    ck_assert_int_eq(ev.status, 0);

    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_assert_int_eq(tern_tp_get(c, lmr, 0, 64, &rkey, 0, 6), 0);
    while (!closed) {
        ck_assert_msg(tp_next(a, &ev, 10000), "the dead peer was never noticed");
        if (ev.type == TERN_TP_EV_GET_DONE) {
            ck_assert_uint_eq(ev.token, 6);
            ck_assert_int_lt(ev.status, 0);
            failed = true;
            continue;
        }
        ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
        ck_assert_int_lt(ev.status, 0);
        closed = true;
    }
    ck_assert(failed);
    tern_tp_disconnect(c);
    tern_tp_close(a);
}
END_TEST

/* A client that speaks softverbs's rdma_cm and verbs itself, to send
 * what tern never would. */
struct raw {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    uint8_t buf[65536];
    uint8_t reply[256];     /* the private data of the answer */
    size_t reply_len;
};

/* Connect to `bound` (where endpoint b listens) with `pdata`, polling b
 * meanwhile; returns the final CM event (ESTABLISHED or REJECTED). */
static enum rdma_cm_event_type raw_connect(struct raw *r, struct tern_tp_ep *b,
                                           const char *bound, const void *pdata,
                                           uint8_t plen)
{
    struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct rdma_conn_param param = {.private_data = pdata, .private_data_len = plen,
                                    .retry_count = 7, .rnr_retry_count = 7};
    enum rdma_cm_event_type want = RDMA_CM_EVENT_ADDR_RESOLVED;
    struct rdma_cm_event *cme;
    struct tern_tp_event ev;
    struct addrinfo *ai;

    ck_assert_int_eq(getaddrinfo("127.0.0.1", strrchr(bound, ':') + 1, NULL, &ai), 0);
    r->ch = sv_rdma_create_event_channel();
    ck_assert_ptr_nonnull(r->ch);
    ck_assert_int_eq(fcntl(r->ch->fd, F_SETFL, O_NONBLOCK), 0);
    ck_assert_int_eq(sv_rdma_create_id(r->ch, &r->id, NULL, RDMA_PS_TCP), 0);
    ck_assert_int_eq(sv_rdma_resolve_addr(r->id, NULL, ai->ai_addr, 1000), 0);
    freeaddrinfo(ai);
    /* Drive both ends: the raw client's CM events, the endpoint's poll
     * (whose events other than ACCEPTED are none of ours here). */
    for (double end = now_ms() + 5000;;) {
        enum rdma_cm_event_type got;

        ck_assert_msg(now_ms() < end, "stuck waiting for rdma_cm event %d", (int)want);
        if (tern_tp_poll(b, &ev, 1) == 1)
            ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
        if (sv_rdma_get_cm_event(r->ch, &cme) != 0)
            continue;
        got = cme->event;
        r->reply_len = cme->param.conn.private_data_len;
        if (r->reply_len > sizeof(r->reply))
            r->reply_len = sizeof(r->reply);
        if (r->reply_len)
            memcpy(r->reply, cme->param.conn.private_data, r->reply_len);
        sv_rdma_ack_cm_event(cme);
        if (got == RDMA_CM_EVENT_REJECTED || got == RDMA_CM_EVENT_ESTABLISHED)
            return got;
        ck_assert_int_eq(got, want);
        if (want == RDMA_CM_EVENT_ADDR_RESOLVED) {
            ck_assert_int_eq(sv_rdma_resolve_route(r->id, 1000), 0);
            want = RDMA_CM_EVENT_ROUTE_RESOLVED;
        } else {
            r->pd = sv_alloc_pd(r->id->verbs);
            r->cq = sv_create_cq(r->id->verbs, 16, NULL, NULL, 0);
            r->mr = sv_reg_mr(r->pd, r->buf, sizeof(r->buf),
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
            ck_assert(r->pd && r->cq && r->mr);
            qa.send_cq = qa.recv_cq = r->cq;
            ck_assert_int_eq(sv_rdma_create_qp(r->id, r->pd, &qa), 0);
            /* Zero-length receives, for what the server sends first (its
             * ring's key, when it comes in band). */
            for (int i = 0; i < 4; i++) {
                struct ibv_recv_wr rw = {.wr_id = (uint64_t)i}, *rbad;

                ck_assert_int_eq(ibv_post_recv(r->id->qp, &rw, &rbad), 0);
            }
            ck_assert_int_eq(sv_rdma_connect(r->id, &param), 0);
            want = RDMA_CM_EVENT_ESTABLISHED;
        }
    }
}

static void raw_close(struct raw *r)
{
    sv_rdma_destroy_qp(r->id);
    sv_rdma_destroy_id(r->id);
    sv_rdma_destroy_event_channel(r->ch);
    sv_dereg_mr(r->mr);
    sv_destroy_cq(r->cq);
    sv_dealloc_pd(r->pd);
}

/* The wire format, as a peer must speak it (rdma_internal.h). */
struct wire_hello {
    uint32_t magic;
    uint16_t version;
    uint8_t ring_log2, flags;
    uint64_t ring_addr;
    uint32_t ring_rkey, max_msg;
};
#define WIRE_VERSION 2
#define WIRE_KEY_IN_BAND 1

/* The server's ring key, as the raw client learns it: in band (the first
 * receive on its QP) if the server's hello says so, else in the hello.
 * Polls b meanwhile. */
static uint32_t raw_server_key(struct raw *r, struct tern_tp_ep *b, const struct wire_hello *th)
{
    struct tern_tp_event ev;
    struct ibv_wc wc;

    if (!(th->flags & WIRE_KEY_IN_BAND))
        return le32toh(th->ring_rkey);
    for (double end = now_ms() + 5000;;) {
        ck_assert_msg(now_ms() < end, "no ring key from the server");
        if (tern_tp_poll(b, &ev, 1) == 1 && ev.type == TERN_TP_EV_RECV)
            tern_tp_msg_release(ev.conn, ev.data);
        if (ibv_poll_cq(r->cq, 1, &wc) == 1) {
            ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
            ck_assert_int_eq(wc.opcode, IBV_WC_RECV);
            ck_assert(wc.wc_flags & IBV_WC_WITH_IMM);
            return be32toh(wc.imm_data);
        }
    }
}

/* A connect request whose private data is not our hello (another
 * program on the port, or a bad version) is rejected, and the listener
 * keeps serving. */
START_TEST(foreign_connect_request_is_rejected)
{
    static const char junk[] = "GET / HTTP/1.0";
    static struct raw r;
    struct wire_hello h;
    struct tern_tp_ep *b;
    struct tern_tp_event ev;
    char bound[128];
    struct tp_pair p;

    setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
    b = tp_open("rdma", 0);
    ck_assert_int_eq(tern_tp_listen(b, "127.0.0.1:0", bound, sizeof(bound)), 0);
    ck_assert_int_eq(raw_connect(&r, b, bound, junk, sizeof(junk)), RDMA_CM_EVENT_REJECTED);
    raw_close(&r);
    /* A proper hello asking us to mirror a 1 GiB ring: refused too. */
    h = (struct wire_hello){.magic = htole32(0x4d445274u), .version = htole16(WIRE_VERSION),
                            .ring_log2 = 30, .ring_addr = htole64(4096),
                            .max_msg = htole32(4096)};
    ck_assert_int_eq(raw_connect(&r, b, bound, &h, sizeof(h)), RDMA_CM_EVENT_REJECTED);
    raw_close(&r);
    /* Nothing reached the user, and a real client still gets in. */
    ck_assert(!tp_next(b, &ev, 50));
    tern_tp_close(b);
    tp_pair_open(&p, rdma_case(), 0);
    send_seq(p.client, 7, 64);
    expect_seq(p.b, p.a, 7, 64);
    tp_pair_close(&p);
}
END_TEST

/* A peer that says hello properly, then writes a record whose header
 * disagrees with the length that landed (row 0), or a sound record longer
 * than the largest message the server takes, though its ring would hold
 * it (row 1): that connection closes with TERN_EPROTO; another one is
 * served meanwhile. */
START_TEST(malformed_record_closes_only_its_connection)
{
    static struct raw r;
    struct tern_tp_ep *b;
    struct tern_tp_event ev;
    struct wire_hello h, theirs;
    struct tp_pair p;
    struct ibv_sge sge;
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    struct ibv_wc wc;
    char bound[128];
    bool closed = false;

    setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
    b = tp_open("rdma", _i ? 4096 : 0);
    ck_assert_int_eq(tern_tp_listen(b, "127.0.0.1:0", bound, sizeof(bound)), 0);
    h = (struct wire_hello){.magic = htole32(0x4d445274u), .version = htole16(WIRE_VERSION),
                            .ring_log2 = 16, .ring_addr = htole64((uintptr_t)r.buf),
                            .max_msg = htole32(4096)};
    /* The server never writes records back here: the ring's key can stay
     * 0 (and in the hello). */
    ck_assert_int_eq(raw_connect(&r, b, bound, &h, sizeof(h)), RDMA_CM_EVENT_ESTABLISHED);
    ck_assert_uint_ge(r.reply_len, sizeof(theirs));
    memcpy(&theirs, r.reply, sizeof(theirs));
    ck_assert_uint_eq(le32toh(theirs.magic), 0x4d445274u);
    theirs.ring_rkey = htole32(raw_server_key(&r, b, &theirs));
    /* Row 0: the header says 100 bytes; 58 land. Row 1: 5000 say and
     * land, in a 16 KiB ring of a server whose largest message is 4096. */
    ((uint32_t *)(void *)r.buf)[0] = _i ? 5000 : 100;
    ((uint32_t *)(void *)r.buf)[1] = 0x4d;
    sge = (struct ibv_sge){.addr = (uintptr_t)r.buf, .length = _i ? 5008 : 58,
                           .lkey = r.mr->lkey};
    wr.wr.rdma.remote_addr = le64toh(theirs.ring_addr);
    wr.wr.rdma.rkey = le32toh(theirs.ring_rkey);
    ck_assert_int_eq(ibv_post_send(r.id->qp, &wr, &bad), 0);
    while (ibv_poll_cq(r.cq, 1, &wc) == 0)
        ;
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    /* A well-behaved client connects while that is sorted out. */
    tp_pair_open(&p, rdma_case(), 0);
    while (!closed) {
        ck_assert(tp_next2(b, p.b, &ev, 5000));
        if (ev.type == TERN_TP_EV_ACCEPTED)
            continue;
        ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
        ck_assert_int_eq(ev.status, TERN_EPROTO);
        closed = true;
        tern_tp_disconnect(ev.conn);
    }
    ck_assert(!tp_next(b, &ev, 50));
    send_seq(p.client, 8, 64);
    expect_seq(p.b, p.a, 8, 64);
    tp_pair_close(&p);
    raw_close(&r);
    tern_tp_close(b);
}
END_TEST

/* Messages staged before the connection is up are laid out for a ring
 * like the sender's own (at most 4 KiB of them, the smallest ring a peer
 * may have, or one record); a peer with a larger or smaller ring gets them
 * re-laid, and a later message larger than the peer takes is refused. */
START_TEST(peers_with_different_rings)
{
    struct tern_tp_ep *small = tp_open("rdma", 4096), *big = tp_open("rdma", 65536);
    struct tern_tp_conn *c;
    struct tern_tp_event ev;
    char bound[128];
    void *buf;

    /* small -> big: staged in a 16 KiB ring, re-laid for 256 KiB; the
     * last reservation is still open when CONNECTED comes, so the
     * re-laying waits for its post. Staging stops at 4 KiB. */
    ck_assert_int_eq(tern_tp_listen(big, rdma_case()->listen, bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(small, bound, &c), 0);
    for (unsigned i = 0; i < 3; i++)
        send_seq(c, i, 1000);
    ck_assert_int_eq(tern_tp_msg_alloc(c, 1000, &buf), 0);
    memset(buf, 0, 1000);
    *(unsigned *)buf = 3;
    ck_assert(tp_next2(small, big, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert_int_eq(ev.status, 0);
    ck_assert(tp_next2(big, small, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
    ck_assert_int_eq(tern_tp_msg_post(c, buf, 1000), 0);
    for (unsigned i = 0; i < 4; i++)
        expect_seq(big, small, i, 1000);

    /* big -> small: more than 4 KiB waits for the connection. */
    ck_assert_int_eq(tern_tp_listen(small, rdma_case()->listen, bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(big, bound, &c), 0);
    for (unsigned i = 0; i < 4; i++)
        send_seq(c, 10 + i, 1000);
    ck_assert_int_eq(tern_tp_msg_alloc(c, 1000, &buf), TERN_EAGAIN);
    ck_assert(tp_next2(big, small, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert(tp_next2(big, small, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_WRITABLE);
    ck_assert(tp_next2(small, big, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
    send_seq(c, 14, 1000);
    for (unsigned i = 0; i < 5; i++)
        expect_seq(small, big, 10 + i, 1000);
    ck_assert_int_eq(tern_tp_msg_send(c, bound, 5000), TERN_EMSGSIZE);
    tern_tp_close(small);
    tern_tp_close(big);
}
END_TEST

/* big -> small with a message staged that the small side cannot take:
 * CONNECTED, then CLOSED with TERN_EMSGSIZE. */
START_TEST(staged_message_too_large_for_peer)
{
    struct tern_tp_ep *small = tp_open("rdma", 4096), *big = tp_open("rdma", 65536);
    struct tern_tp_conn *c;
    struct tern_tp_event ev;
    static uint8_t msg[5000];
    char bound[128];

    ck_assert_int_eq(tern_tp_listen(small, rdma_case()->listen, bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(big, bound, &c), 0);
    ck_assert_int_eq(tern_tp_msg_send(c, msg, sizeof(msg)), 0);
    ck_assert(tp_next2(big, small, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert(tp_next2(big, small, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
    ck_assert_int_eq(ev.status, TERN_EMSGSIZE);
    tern_tp_close(small);
    tern_tp_close(big);
}
END_TEST

/* Found by review (each failed before its fix). */
static void round_trip(struct tern_tp_ep *a, struct tern_tp_ep *b, struct tern_tp_conn *c,
                 unsigned v, size_t len, unsigned *got)
{
    struct tern_tp_event ev;
    uint8_t msg[4096] = {0};

    memcpy(msg, &v, sizeof(v));
    ck_assert_int_eq(tern_tp_msg_send(c, msg, len), 0);
    ck_assert_msg(tp_next2(b, a, &ev, 5000), "message %u never came", v);
    ck_assert_msg(ev.type == TERN_TP_EV_RECV, "msg %u: event %d status %d", v, ev.type, ev.status);
    *got = *(const unsigned *)ev.data;
    tern_tp_msg_release(ev.conn, ev.data);
}

/* A reservation that skipped the ring's tail, posted shorter so that
 * the short record would have fitted before the end. */
START_TEST(short_post_after_a_skipped_tail)
{
    struct tp_pair p;
    struct tern_tp_event ev;
    unsigned got;
    void *buf;

    tp_pair_open(&p, rdma_case(), 4096);    /* 16 KiB rings, 64-byte records */
    for (unsigned i = 0; i < 256; i++) {     /* lap 1: every line written */
        round_trip(p.a, p.b, p.client, i, 56, &got);
        ck_assert_uint_eq(got, i);
    }
    for (unsigned i = 0; i < 254; i++) {     /* lap 2, up to 128 bytes before the end */
        round_trip(p.a, p.b, p.client, 1000 + i, 56, &got);
        ck_assert_uint_eq(got, 1000 + i);
    }
    ck_assert_int_eq(tern_tp_msg_alloc(p.client, 4000, &buf), 0);
    memset(buf, 0, 56);
    *(unsigned *)buf = 5000;
    ck_assert_int_eq(tern_tp_msg_post(p.client, buf, 56), 0);
    ck_assert(tp_next2(p.b, p.a, &ev, 5000));
    ck_assert_msg(ev.type == TERN_TP_EV_RECV, "event %d status %d", ev.type, ev.status);
    ck_assert_msg(*(const unsigned *)ev.data == 5000, "got stale message %u instead of 5000",
                  *(const unsigned *)ev.data);
    tern_tp_msg_release(ev.conn, ev.data);
    tp_pair_close(&p);
}
END_TEST

/* Arm must not say "safe to sleep" while a locally refused put's PUT_DONE is owed. */
START_TEST(arm_sees_a_refused_put)
{
    struct tp_pair p;
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk;
    struct tern_tp_event ev;
    int rc;

    tp_pair_open(&p, rdma_case(), 4096);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, 4096, TERN_TP_ACCESS_REMOTE_WRITE, &mr), 0);
    rk = tern_tp_mr_rkey(mr);
    rk.access = 0;      /* refused before posting */
    ck_assert_int_eq(tern_tp_put(p.client, mr, 0, 64, &rk, 0, 77), 0);
    rc = tern_tp_arm(p.a);
    ck_assert_msg(rc == TERN_EAGAIN, "arm returned %d with a PUT_DONE owed", rc);
    ck_assert(tp_next(p.a, &ev, 100));
    ck_assert_int_eq(ev.type, TERN_TP_EV_PUT_DONE);
    tp_pair_close(&p);
}
END_TEST

/* A put refused for a full pending list forgets the WRITABLE owed
 * to an earlier msg_alloc EAGAIN. */
START_TEST(writable_survives_a_full_pending_list)
{
    struct tp_pair p;
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk;
    struct tern_tp_event ev, held[512];
    int nheld = 0, rc;
    void *buf;
    bool writable = false;
    uint8_t msg[1000] = {0};

    tp_pair_open(&p, rdma_case(), 4096);
    while ((rc = tern_tp_msg_send(p.client, msg, sizeof(msg))) == 0) {
        tern_tp_flush(p.a);
        while (tp_next(p.b, &ev, 20))
            held[nheld++] = ev;
    }
    ck_assert_int_eq(rc, TERN_EAGAIN);
    for (int i = 0; i < 10 && tp_next(p.b, &ev, 20); i++)
        held[nheld++] = ev;
    ck_assert_int_eq(tern_tp_msg_alloc(p.client, sizeof(msg), &buf), TERN_EAGAIN);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, 4096, TERN_TP_ACCESS_REMOTE_WRITE, &mr), 0);
    rk = tern_tp_mr_rkey(mr);
    rk.access = 0;
    for (int i = 0; i < 256; i++)
        ck_assert_int_eq(tern_tp_put(p.client, mr, 0, 64, &rk, 0, (uint64_t)i), 0);
    ck_assert_int_eq(tern_tp_put(p.client, mr, 0, 64, &rk, 0, 999), TERN_EAGAIN);
    for (int i = 0; i < nheld; i++) {
        ck_assert_int_eq(held[i].type, TERN_TP_EV_RECV);
        tern_tp_msg_release(held[i].conn, held[i].data);
    }
    for (int i = 0; i < 400 && tp_next2(p.a, p.b, &ev, 200); i++)
        if (ev.type == TERN_TP_EV_WRITABLE)
            writable = true;
    ck_assert_msg(writable, "credit came back but no WRITABLE");
    tp_pair_close(&p);
}
END_TEST

/* The acceptor sends at once; the connector does not poll for 2 s. Then
 * both poll: the connector's CONNECTED needs the acceptor's ring key,
 * which the acceptor sends once it sees the connector up. */
START_TEST(acceptor_sends_before_the_connector_polls)
{
    struct tern_tp_ep *a = tp_open("rdma", 4096), *b = tp_open("rdma", 4096);
    struct tern_tp_conn *c, *s = NULL;
    struct tern_tp_event ev;
    char bound[128];
    double t0;

    ck_assert_int_eq(tern_tp_listen(b, rdma_case()->listen, bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &c), 0);
    ck_assert(tp_next(b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
    s = ev.conn;
    send_seq(s, 42, 64);
    t0 = now_ms();
    while (now_ms() - t0 < 2000)
        if (tp_next(b, &ev, 10))
            ck_abort_msg("server event %d status %d (client slow to poll)", ev.type, ev.status);
    ck_assert(tp_next2(a, b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    expect_seq(a, b, 42, 64);
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* The acceptor's key and its first record reach the connector in one
 * batch of completions: CONNECTED still comes first. Each side is polled
 * alone in turn so that the batch forms: the connector takes ESTABLISHED
 * and sends its key, the acceptor takes that key and then sends its own
 * with the record behind it. */
START_TEST(connected_comes_before_the_first_record)
{
    struct tern_tp_ep *a = tp_open("rdma", 4096), *b = tp_open("rdma", 4096);
    struct tern_tp_conn *c;
    struct tern_tp_event ev;
    char bound[128];
    double t0;

    ck_assert_int_eq(tern_tp_listen(b, rdma_case()->listen, bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &c), 0);
    ck_assert(tp_next(b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
    send_seq(ev.conn, 43, 64);
    for (t0 = now_ms(); now_ms() - t0 < 200;)
        ck_assert_msg(!tp_next(a, &ev, 10), "connector event %d before the acceptor's key",
                      ev.type);
    for (t0 = now_ms(); now_ms() - t0 < 200;)
        ck_assert_msg(!tp_next(b, &ev, 10), "acceptor event %d", ev.type);
    ck_assert(tp_next(a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    expect_seq(a, b, 43, 64);
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* Two endpoints in one process, each on its own thread, over one
 * softverbs context (rdma_cm gives the process one): they open at once and
 * exchange messages both ways. Any thread's poll carried out the pending
 * sends of every QP of the context, also while another thread was posting
 * to its own: records went twice or not at all, and the pair hung. Each
 * thread gives up at a deadline, and the main thread stops waiting at
 * another, so a hang fails the test. */
#define MT_MSGS 5000u

struct mt_side {
    pthread_barrier_t *start;
    bool listens;
    unsigned sent, got;
    int err;
    char why[128];
};

static char mt_bound[128];
static int mt_have_bound, mt_done;

static void mt_fail(struct mt_side *sd, int err, const char *why)
{
    sd->err = err;
    snprintf(sd->why, sizeof(sd->why), "%s", why);
}

static void *mt_run(void *arg)
{
    struct mt_side *sd = arg;
    struct tern_tp_config cfg = {.fabric = "rdma", .max_msg = 4096};
    struct tern_tp_ep *ep = NULL;
    struct tern_tp_conn *c = NULL;
    struct tern_tp_event ev[32];
    double end = now_ms() + 30000;
    bool up = false, counted = false;
    int rc;

    pthread_barrier_wait(sd->start);
    rc = tern_tp_open(&cfg, &ep);
    if (rc < 0) {
        mt_fail(sd, rc, "open");
        __atomic_add_fetch(&mt_done, 2, __ATOMIC_RELEASE);
        return NULL;
    }
    if (sd->listens) {
        rc = tern_tp_listen(ep, "127.0.0.1:0", mt_bound, sizeof(mt_bound));
        __atomic_store_n(&mt_have_bound, rc < 0 ? -1 : 1, __ATOMIC_RELEASE);
    } else {
        while (!(rc = __atomic_load_n(&mt_have_bound, __ATOMIC_ACQUIRE)) && now_ms() < end)
            ;
        rc = rc == 1 ? tern_tp_connect(ep, mt_bound, &c) : TERN_ETIMEDOUT;
    }
    if (rc < 0)
        mt_fail(sd, rc, "listen or connect");
    /* Until both sides have all they were sent: the last records and
     * credits need the sender's polls too. */
    while (!sd->err && __atomic_load_n(&mt_done, __ATOMIC_ACQUIRE) < 2) {
        int n = tern_tp_poll(ep, ev, 32);

        if (now_ms() > end) {
            mt_fail(sd, TERN_ETIMEDOUT, "stuck");
            break;
        }
        if (n < 0)
            mt_fail(sd, n, "poll");
        for (int i = 0; i < n && !sd->err; i++) {
            unsigned v;

            switch (ev[i].type) {
            case TERN_TP_EV_ACCEPTED:
                c = ev[i].conn;
                up = true;
                break;
            case TERN_TP_EV_CONNECTED:
                up = ev[i].status == 0;
                if (!up)
                    mt_fail(sd, ev[i].status, "connect");
                break;
            case TERN_TP_EV_RECV:
                memcpy(&v, ev[i].data, sizeof(v));
                if (v != sd->got || ev[i].len != 64 + v % 937)
                    mt_fail(sd, TERN_EPROTO, "message out of order, twice or cut");
                sd->got++;
                tern_tp_msg_release(ev[i].conn, ev[i].data);
                break;
            case TERN_TP_EV_WRITABLE:
                break;
            default:
                mt_fail(sd, ev[i].status < 0 ? ev[i].status : TERN_EPROTO, "event");
                break;
            }
        }
        /* A window of 16 ahead of what came back keeps both rings busy. */
        while (up && !sd->err && sd->sent < MT_MSGS && sd->sent < sd->got + 16) {
            uint8_t m[1024] = {0};

            memcpy(m, &sd->sent, sizeof(sd->sent));
            rc = tern_tp_msg_send(c, m, 64 + sd->sent % 937);
            if (rc == TERN_EAGAIN)
                break;
            if (rc < 0)
                mt_fail(sd, rc, "send");
            else
                sd->sent++;
        }
        if (!counted && sd->got == MT_MSGS && sd->sent == MT_MSGS) {
            counted = true;
            __atomic_add_fetch(&mt_done, 1, __ATOMIC_RELEASE);
        }
    }
    if (!counted)
        __atomic_add_fetch(&mt_done, 2, __ATOMIC_RELEASE);  /* the other stops too */
    /* Close once both are done with the connection. */
    while (__atomic_load_n(&mt_done, __ATOMIC_ACQUIRE) < 2)
        ;
    tern_tp_close(ep);
    return NULL;
}

START_TEST(two_endpoints_on_two_threads)
{
    struct mt_side sd[2] = {{.listens = true}, {.listens = false}};
    pthread_barrier_t start;
    pthread_t t[2];
    struct timespec deadline;

    setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
    pthread_barrier_init(&start, NULL, 2);
    for (int i = 0; i < 2; i++) {
        sd[i].start = &start;
        ck_assert_int_eq(pthread_create(&t[i], NULL, mt_run, &sd[i]), 0);
    }
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 45;
    for (int i = 0; i < 2; i++)
        ck_assert_msg(pthread_timedjoin_np(t[i], NULL, &deadline) == 0,
                      "thread %d hung (sent %u, got %u)", i, sd[i].sent, sd[i].got);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(!sd[i].err, "thread %d: %s: %s (sent %u, got %u of %u)", i, sd[i].why,
                      tern_strerror(sd[i].err), sd[i].sent, sd[i].got, MT_MSGS);
    pthread_barrier_destroy(&start);
}
END_TEST

/* A CQ that overruns (softverbs made to hold 8 entries whatever its
 * size): the completions taken from it before the overrun come out as
 * events, their views intact, and the endpoint's failure comes with the
 * next poll and every poll after. */
START_TEST(cq_overrun_hands_out_what_was_taken)
{
    enum { HOLD = 8, SENT = 20 };
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *c;
    struct tern_tp_event ev[32];
    char bound[128];
    bool up = false, in = false;
    int n;

    setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
    setenv("SOFTVERBS_CQ_ENTRIES", "8", 1);
    a = tp_open("rdma", 4096);
    unsetenv("SOFTVERBS_CQ_ENTRIES");
    b = tp_open("rdma", 4096);
    ck_assert_int_eq(tern_tp_listen(a, "127.0.0.1:0", bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(b, bound, &c), 0);
    while (!up || !in) {
        ck_assert(tp_next2(up ? a : b, up ? b : a, ev, 5000));
        if (ev[0].type == TERN_TP_EV_CONNECTED) {
            ck_assert_int_eq(ev[0].status, 0);
            up = true;
        } else {
            ck_assert_int_eq(ev[0].type, TERN_TP_EV_ACCEPTED);
            in = true;
        }
    }
    /* The sender's NIC (this thread) lands every record at once: eight
     * completions fit, the ninth overruns the receiver's CQ. */
    for (unsigned i = 0; i < SENT; i++)
        send_seq(c, i, 64);
    ck_assert_int_eq(tern_tp_flush(b), 0);
    n = tern_tp_poll(a, ev, 32);
    ck_assert_msg(n == HOLD, "poll after the overrun returned %d (%s), not the %d messages taken",
                  n, n < 0 ? tern_strerror(n) : "", HOLD);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(ev[i].type, TERN_TP_EV_RECV);
        ck_assert_uint_eq(ev[i].len, 64);
        ck_assert_uint_eq(*(const unsigned *)ev[i].data, (unsigned)i);
        tern_tp_msg_release(ev[i].conn, ev[i].data);
    }
    ck_assert_int_eq(tern_tp_poll(a, ev, 32), TERN_EIO);
    ck_assert_int_eq(tern_tp_arm(a), TERN_EAGAIN);     /* never sleeps on it */
    ck_assert_int_eq(tern_tp_poll(a, ev, 32), TERN_EIO);
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* The same overrun under RPC: a server process replies to 32 calls while
 * the client, whose CQ holds 4 entries, does not poll. The replies taken
 * before the overrun complete their calls; the fabric's failure is not
 * taken for idleness: tern_rpc_poll reports it once, the other calls and
 * the session fail with it, and the fabric is not used again. */
struct overrun_server {
    unsigned handled;   /* requests answered (the server's count) */
    unsigned flushed;   /* ... and their replies sent */
};
static struct overrun_server *ovs;

static int overrun_echo(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, len);

    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, data, len);
    ovs->handled++;
    return 0;
}

static const struct tern_method overrun_methods[] = {{.id = 1, .name = "echo",
                                                      .handler = overrun_echo}};
static const struct tern_service overrun_svc = {.name = "overrun", .id = 77,
                                                .methods = overrun_methods, .n_methods = 1};

struct overrun_call {
    bool done;
    int status;
};

static void overrun_cont(void *arg, int status, const void *reply, size_t len)
{
    struct overrun_call *c = arg;

    c->done = true;
    c->status = status;
}

START_TEST(rpc_sessions_fail_with_their_fabric)
{
    enum { N = 32 };
    static struct overrun_call calls[N];
    static unsigned seq[N];
    struct tern_rpc_ep *ep;
    struct tern_session *s, *s2;
    char bound[128] = "";
    unsigned done = 0, ok = 0, errors = 0;
    int fds[2];
    pid_t pid;

    setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
    ovs = mmap(NULL, sizeof(*ovs), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(ovs, MAP_FAILED);
    ck_assert_int_eq(pipe(fds), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct tern_rpc_ep *sep;

        if (tern_rpc_open(NULL, &sep) < 0 || tern_rpc_register(sep, &overrun_svc) < 0 ||
            tern_rpc_listen(sep, "rdma://127.0.0.1:0", bound, sizeof(bound)) < 0 ||
            write(fds[1], bound, sizeof(bound)) != (ssize_t)sizeof(bound))
            _exit(2);
        for (;;) {      /* until killed */
            tern_rpc_poll(sep);
            __atomic_store_n(&ovs->flushed, ovs->handled, __ATOMIC_RELEASE);
        }
    }
    ck_assert_int_eq(read(fds[0], bound, sizeof(bound)), (ssize_t)sizeof(bound));
    setenv("SOFTVERBS_CQ_ENTRIES", "4", 1);
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect(ep, bound, 5000000000ull, &s), 0);
    unsetenv("SOFTVERBS_CQ_ENTRIES");
    /* Outside a poll each call leaves at once. */
    for (unsigned i = 0; i < N; i++) {
        seq[i] = i;
        ck_assert_int_eq(tern_call(s, 77, 1, &seq[i], sizeof(seq[i]), 0, overrun_cont,
                                   &calls[i], NULL), 0);
    }
    for (double end = now_ms() + 10000; __atomic_load_n(&ovs->flushed, __ATOMIC_ACQUIRE) < N;)
        ck_assert_msg(now_ms() < end, "the server answered %u of %u calls", ovs->flushed, N);
    for (double end = now_ms() + 10000; done < N;) {
        int rc = tern_rpc_poll(ep);

        if (rc < 0) {
            ck_assert_int_eq(rc, TERN_EIO);
            errors++;
        }
        done = 0;
        for (unsigned i = 0; i < N; i++)
            done += calls[i].done;
        ck_assert_msg(now_ms() < end, "%u of %u calls completed: the fabric's failure was "
                      "taken for idleness", done, N);
    }
    for (unsigned i = 0; i < N; i++) {
        ck_assert_msg(calls[i].status == 0 || calls[i].status == TERN_EIO,
                      "call %u: %s", i, tern_strerror(calls[i].status));
        ok += calls[i].status == 0;
    }
    ck_assert_uint_ge(ok, 1);               /* the replies taken before it */
    ck_assert_uint_lt(ok, N);
    ck_assert_uint_eq(errors, 1);
    ck_assert_int_eq(tern_session_status(s), TERN_EIO);
    ck_assert_int_eq(tern_rpc_poll(ep), 0);
    ck_assert_int_eq(tern_rpc_connect(ep, bound, 1000000000ull, &s2), TERN_EIO);
    tern_rpc_disconnect(s);
    tern_rpc_close(ep);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    sv_sweep_dead();
    munmap(ovs, sizeof(*ovs));
}
END_TEST

/* ---- isolation between connections ---- */

/* A peer that knows another connection's receive ring exactly (its
 * address and its key, as if guessed) writes a well-formed record into it
 * through its own queue pair. With memory windows (row 0) the NIC refuses
 * it: the ring answers only to its connection's QP. Without (row 1,
 * TERN_RDMA_MW=0, as on a device that has none) the write lands: what the
 * windows are for, shown. */
START_TEST(another_connections_ring_is_out_of_reach)
{
    static struct raw r;
    struct tp_pair p;
    struct rdma_conn *victim;
    struct wire_hello h;
    struct ibv_sge sge;
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    struct ibv_wc wc;
    bool windows = _i == 0;
    uint32_t key;

    setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
    if (!windows)
        setenv("TERN_RDMA_MW", "0", 1);
    tp_pair_open(&p, rdma_case(), 4096);
    unsetenv("TERN_RDMA_MW");
    victim = RCONN(p.server);
    ck_assert_int_eq(victim->ring_win != NULL, windows);
    key = windows ? victim->ring_win->rkey : victim->rx_mr->rkey;

    h = (struct wire_hello){.magic = htole32(0x4d445274u), .version = htole16(WIRE_VERSION),
                            .ring_log2 = 16, .ring_addr = htole64((uintptr_t)r.buf),
                            .max_msg = htole32(4096)};
    ck_assert_int_eq(raw_connect(&r, p.b, p.bound, &h, sizeof(h)), RDMA_CM_EVENT_ESTABLISHED);
    /* A record the victim's server would take: header and 56 bytes. */
    memset(r.buf, 0, 64);
    ((uint32_t *)(void *)r.buf)[0] = 56;
    ((uint32_t *)(void *)r.buf)[1] = 0x4d;
    memcpy(r.buf + 8, "forged", 6);
    sge = (struct ibv_sge){.addr = (uintptr_t)r.buf, .length = 64, .lkey = r.mr->lkey};
    wr.wr.rdma.remote_addr = (uintptr_t)victim->rx;
    wr.wr.rdma.rkey = key;
    ck_assert_int_eq(ibv_post_send(r.id->qp, &wr, &bad), 0);
    for (double end = now_ms() + 5000; ibv_poll_cq(r.cq, 1, &wc) != 1;)
        ck_assert_msg(now_ms() < end, "the forged write never completed");
    if (windows) {
        ck_assert_int_eq(wc.status, IBV_WC_REM_ACCESS_ERR);
        for (int i = 0; i < 64; i++)
            ck_assert_uint_eq(victim->rx[i], 0);
        /* The victim's connection carries on. */
        send_seq(p.client, 5, 64);
        expect_seq(p.b, p.a, 5, 64);
    } else {
        ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
        ck_assert(memcmp(victim->rx + 8, "forged", 6) == 0);
    }
    raw_close(&r);
    tp_pair_close(&p);
}
END_TEST

static int get_status(struct tern_tp_ep *ep, struct tern_tp_ep *other, struct tern_tp_conn *c,
                      struct tern_tp_mr *lmr, const struct tern_tp_rkey *rk, uint64_t token)
{
    struct tern_tp_event ev;
    int rc = tern_tp_get(c, lmr, 0, 64, rk, 0, token);

    if (rc < 0)
        return rc;
    for (;;) {
        ck_assert_msg(tp_next2(ep, other, &ev, 5000), "get %llu never completed",
                      (unsigned long long)token);
        if (ev.type == TERN_TP_EV_GET_DONE && ev.token == token)
            return ev.status;
        if (ev.type == TERN_TP_EV_CLOSED && ev.conn == c)
            return ev.status ? ev.status : TERN_ECONNRESET;
    }
}

/* The key a region's owner gives one connection is refused on another
 * connection of the same two endpoints, and after the region is gone;
 * the connection it was given to keeps its access. */
START_TEST(a_window_key_is_good_on_its_own_connection_only)
{
    struct tp_pair p;
    struct tern_tp_conn *c2, *s2 = NULL;
    struct tern_tp_mr *rmr, *lmr;
    struct tern_tp_rkey rk, rk2;
    struct tern_tp_event ev;
    uint8_t *l;
    int st;

    tp_pair_open(&p, rdma_case(), 4096);
    ck_assert_int_eq(tern_tp_connect(p.a, p.bound, &c2), 0);
    while (!s2) {
        ck_assert(tp_next2(p.b, p.a, &ev, 5000));
        if (ev.type == TERN_TP_EV_ACCEPTED)
            s2 = ev.conn;
    }
    ck_assert(tp_next2(p.a, p.b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, 4096, TERN_TP_ACCESS_REMOTE_READ |
                                                     TERN_TP_ACCESS_REMOTE_WRITE, &rmr), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, 4096, 0, &lmr), 0);
    memset(tern_tp_mr_addr(rmr), 0x33, 4096);
    l = tern_tp_mr_addr(lmr);
    rk = tp_pair_rkey(&p, rmr);
    ck_assert_int_eq(get_status(p.a, p.b, p.client, lmr, &rk, 1), 0);
    ck_assert_uint_eq(l[63], 0x33);
    /* Asked again, the same key: one window per region and connection. */
    ck_assert_int_eq(tern_tp_conn_mr_rkey(p.server, rmr, &rk2), 0);
    ck_assert_uint_eq(rk2.key, rk.key);
    /* The second connection's own key differs, and the first one's is
     * refused there (a NIC breaks that queue pair). */
    ck_assert_int_eq(tern_tp_conn_mr_rkey(s2, rmr, &rk2), 0);
    ck_assert_uint_ne(rk2.key, rk.key);
    st = get_status(p.a, p.b, c2, lmr, &rk, 2);
    ck_assert_msg(st == TERN_EREMACCESS, "another connection's key: %s", tern_strerror(st));
    ck_assert_int_eq(get_status(p.a, p.b, p.client, lmr, &rk, 3), 0);
    /* The region goes: its windows go with it. */
    ck_assert_int_eq(tern_tp_mr_dereg(rmr), 0);
    st = get_status(p.a, p.b, p.client, lmr, &rk, 4);
    ck_assert_msg(st == TERN_EREMACCESS, "a key of a gone region: %s", tern_strerror(st));
    tp_pair_close(&p);
}
END_TEST

/* A key asked for before the connection is up: its bind waits until the
 * queue pair is, and both directions work. (Asked before the route is
 * resolved, the window would be the first on the connection's list, ahead
 * of the ring's; rdma_conn.c keeps the ring's apart for that, which
 * softverbs, resolving at once, cannot show.) */
START_TEST(a_key_asked_before_the_connection_is_up)
{
    struct tern_tp_ep *a = tp_open("rdma", 4096), *b = tp_open("rdma", 4096);
    struct tern_tp_conn *c, *s = NULL;
    struct tern_tp_mr *rmr, *lmr;
    struct tern_tp_rkey rk;
    struct tern_tp_event ev;
    char bound[128];
    int st = 1;

    ck_assert_int_eq(tern_tp_listen(b, rdma_case()->listen, bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(a, 4096, TERN_TP_ACCESS_REMOTE_WRITE, &rmr), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(b, 4096, 0, &lmr), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &c), 0);
    ck_assert_int_eq(tern_tp_conn_mr_rkey(c, rmr, &rk), 0);
    ck_assert_int_eq(tern_tp_msg_send(c, &rk, sizeof(rk)), 0);
    while (!s || st == 1) {
        ck_assert(tp_next2(b, a, &ev, 5000));
        if (ev.type == TERN_TP_EV_ACCEPTED) {
            s = ev.conn;
        } else if (ev.type == TERN_TP_EV_RECV) {
            ck_assert_uint_eq(ev.len, sizeof(rk));
            memcpy(&rk, ev.data, sizeof(rk));
            tern_tp_msg_release(ev.conn, ev.data);
            memset(tern_tp_mr_addr(lmr), 0x66, 64);
            ck_assert_int_eq(tern_tp_put(s, lmr, 0, 64, &rk, 0, 9), 0);
            st = 2;
        }
    }
    while (st == 2) {
        ck_assert(tp_next2(b, a, &ev, 5000));
        if (ev.type == TERN_TP_EV_PUT_DONE)
            st = ev.status;
    }
    ck_assert_int_eq(st, 0);
    ck_assert_uint_eq(((uint8_t *)tern_tp_mr_addr(rmr))[63], 0x66);
    send_seq(s, 77, 64);      /* into a's ring, by the ring's key */
    for (;;) {
        ck_assert(tp_next2(a, b, &ev, 5000));
        if (ev.type == TERN_TP_EV_CONNECTED)
            continue;
        ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
        ck_assert_uint_eq(*(const unsigned *)ev.data, 77);
        tern_tp_msg_release(ev.conn, ev.data);
        break;
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* One side without windows (its hello carries its ring's key, its
 * regions' keys are the registrations'), the other with: they talk and
 * reach each other's regions both ways. */
START_TEST(a_peer_without_windows_talks_to_one_with)
{
    struct tp_pair p, q;
    struct tern_tp_mr *rmr, *lmr;
    struct tern_tp_rkey rk;

    for (int side = 0; side < 2; side++) {
        struct tp_pair *x = side ? &q : &p;

        setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
        tp_pair_open_with(x, rdma_case(), 4096, side ? "" : "0", side ? "0" : "");
        send_seq(x->client, 1, 64);
        expect_seq(x->b, x->a, 1, 64);
        send_seq(x->server, 2, 64);
        expect_seq(x->a, x->b, 2, 64);
        ck_assert_int_eq(tern_tp_mr_alloc(x->b, 4096, TERN_TP_ACCESS_REMOTE_READ, &rmr), 0);
        ck_assert_int_eq(tern_tp_mr_alloc(x->a, 4096, 0, &lmr), 0);
        memset(tern_tp_mr_addr(rmr), 0x44, 4096);
        rk = tp_pair_rkey(x, rmr);
        ck_assert_int_eq(get_status(x->a, x->b, x->client, lmr, &rk, 1), 0);
        ck_assert_uint_eq(((uint8_t *)tern_tp_mr_addr(lmr))[10], 0x44);
        tp_pair_close(x);
    }
}
END_TEST

Suite *suite_rdma(void)
{
    Suite *s = suite_create("rdma");
    TCase *tc = tcase_create("rdma");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, srq_exhaustion_is_waited_out);
    tcase_add_test(tc, killed_peer_closes_the_connection);
    tcase_add_test(tc, foreign_connect_request_is_rejected);
    tcase_add_loop_test(tc, malformed_record_closes_only_its_connection, 0, 2);
    tcase_add_test(tc, peers_with_different_rings);
    tcase_add_test(tc, staged_message_too_large_for_peer);
    tcase_add_test(tc, short_post_after_a_skipped_tail);
    tcase_add_test(tc, arm_sees_a_refused_put);
    tcase_add_test(tc, writable_survives_a_full_pending_list);
    tcase_add_test(tc, acceptor_sends_before_the_connector_polls);
    tcase_add_test(tc, connected_comes_before_the_first_record);
    tcase_add_test(tc, cq_overrun_hands_out_what_was_taken);
    tcase_add_test(tc, rpc_sessions_fail_with_their_fabric);
    tcase_add_test(tc, two_endpoints_on_two_threads);
    tcase_add_loop_test(tc, another_connections_ring_is_out_of_reach, 0, 2);
    tcase_add_test(tc, a_window_key_is_good_on_its_own_connection_only);
    tcase_add_test(tc, a_peer_without_windows_talks_to_one_with);
    tcase_add_test(tc, a_key_asked_before_the_connection_is_up);
    suite_add_tcase(s, tc);
    return s;
}
