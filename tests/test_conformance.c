/* The transport conformance suite: the same tests on every fabric in
 * fabric_cases (lib/helpers.c). Each test is a Check loop test whose index picks
 * the fabric, so a new fabric joins by adding one row there. */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "suites.h"
#include "transport_internal.h"

#define FC (&fabric_cases[_i])

/* Send `len` bytes of pattern `seed` and check they arrive whole. */
static void fill_pattern(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seed * 31u + i * 7u);
}

static int check_pattern(const uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(seed * 31u + i * 7u))
            return 0;
    return 1;
}

START_TEST(caps_match_ops)
{
    const struct tern_tp_fabric *f = tp_fabric_find(FC->fabric);
    struct tern_tp_ep *ep = tp_open(FC->fabric, 0);
    uint32_t caps;

    ck_assert_ptr_nonnull(f);
    ck_assert(tp_caps_match_ops(f));
    caps = tern_tp_caps(ep);
    ck_assert_uint_eq(caps, f->caps);
    ck_assert_str_eq(tern_tp_fabric(ep), FC->fabric);
    ck_assert(caps & TERN_TP_CAP_MSG);
    tern_tp_close(ep);
}
END_TEST

START_TEST(message_sizes)
{
    static const size_t sizes[] = {0, 1, 7, 63, 64, 65, 4095, 4096, 65535};
    struct tp_pair p;
    struct tern_tp_event ev;

    tp_pair_open(&p, FC, 65535);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        void *buf;

        ck_assert_int_eq(tern_tp_msg_alloc(p.client, sizes[i], &buf), 0);
        ck_assert_uint_eq((uintptr_t)buf % 8, 0);
        fill_pattern(buf, sizes[i], (unsigned)i);
        ck_assert_int_eq(tern_tp_msg_post(p.client, buf, sizes[i]), 0);
        ck_assert(tp_next2(p.b, p.a, &ev, 5000));
        ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
        ck_assert_ptr_eq(ev.conn, p.server);
        ck_assert_uint_eq(ev.len, sizes[i]);
        /* Whatever came before, a view is aligned for the structs in it. */
        ck_assert_uint_eq((uintptr_t)ev.data % 8, 0);
        ck_assert(check_pattern(ev.data, ev.len, (unsigned)i));
        tern_tp_msg_release(ev.conn, ev.data);
    }
    tp_pair_close(&p);
}
END_TEST

START_TEST(both_directions_in_order)
{
    struct tp_pair p;
    struct tern_tp_event ev;
    enum { N = 5000 };
    unsigned got_a = 0, got_b = 0;

    tp_pair_open(&p, FC, 0);
    for (unsigned i = 0; i < N; i++) {
        ck_assert_int_eq(tern_tp_msg_send(p.client, &i, sizeof(i)), 0);
        ck_assert_int_eq(tern_tp_msg_send(p.server, &i, sizeof(i)), 0);
        /* Drain as we go so that neither send path fills up. */
        while (tp_next(p.b, &ev, 0)) {
            ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
            ck_assert_uint_eq(*(const unsigned *)ev.data, got_b++);
            tern_tp_msg_release(ev.conn, ev.data);
        }
        while (tp_next(p.a, &ev, 0)) {
            ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
            ck_assert_uint_eq(*(const unsigned *)ev.data, got_a++);
            tern_tp_msg_release(ev.conn, ev.data);
        }
    }
    while (got_a < N || got_b < N) {
        struct tern_tp_ep *ep = got_a < N ? p.a : p.b;
        unsigned *got = got_a < N ? &got_a : &got_b;

        ck_assert(tp_next2(ep, ep == p.a ? p.b : p.a, &ev, 5000));
        ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
        ck_assert_uint_eq(*(const unsigned *)ev.data, (*got)++);
        tern_tp_msg_release(ev.conn, ev.data);
    }
    tp_pair_close(&p);
}
END_TEST

/* Messages far larger than a ring record (the window fabrics fragment and
 * reassemble them) arrive whole and in order, between small ones. */
START_TEST(large_messages)
{
    static const size_t sizes[] = {300000, 1, 1u << 20, 70000, 8, (1u << 20) - 1};
    static uint8_t buf[1u << 20];
    struct tp_pair p;
    struct tern_tp_event ev;
    size_t sent = 0, got = 0;

    tp_pair_open(&p, FC, 1u << 20);
    while (got < sizeof(sizes) / sizeof(sizes[0])) {
        if (sent < sizeof(sizes) / sizeof(sizes[0])) {
            fill_pattern(buf, sizes[sent], (unsigned)sent);
            int rc = tern_tp_msg_send(p.client, buf, sizes[sent]);

            if (rc == 0)
                sent++;
            else
                ck_assert_int_eq(rc, TERN_EAGAIN);
        }
        if (!tp_next2(p.b, p.a, &ev, 10))
            continue;
        ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
        ck_assert_uint_eq(ev.len, sizes[got]);
        ck_assert_msg(check_pattern(ev.data, ev.len, (unsigned)got), "message %zu corrupted", got);
        tern_tp_msg_release(ev.conn, ev.data);
        got++;
    }
    tp_pair_close(&p);
}
END_TEST

/* Views stay valid while later messages arrive, and are released in order. */
START_TEST(held_views_stay_valid)
{
    struct tp_pair p;
    struct tern_tp_event ev[16];
    char msg[100];

    tp_pair_open(&p, FC, 0);
    for (unsigned i = 0; i < 16; i++) {
        memset(msg, 'a' + (int)i, sizeof(msg));
        ck_assert_int_eq(tern_tp_msg_send(p.client, msg, sizeof(msg)), 0);
    }
    for (unsigned i = 0; i < 16; i++) {
        ck_assert(tp_next2(p.b, p.a, &ev[i], 5000));
        ck_assert_int_eq(ev[i].type, TERN_TP_EV_RECV);
    }
    for (unsigned i = 0; i < 16; i++) {
        const char *d = ev[i].data;

        ck_assert_uint_eq(ev[i].len, sizeof(msg));
        ck_assert_int_eq(d[0], 'a' + (int)i);
        ck_assert_int_eq(d[sizeof(msg) - 1], 'a' + (int)i);
    }
    for (unsigned i = 0; i < 16; i++)
        tern_tp_msg_release(ev[i].conn, ev[i].data);
    tp_pair_close(&p);
}
END_TEST

START_TEST(reservation_rules)
{
    struct tp_pair p;
    struct tern_tp_event ev;
    void *buf, *buf2;

    tp_pair_open(&p, FC, 4096);
    ck_assert_int_eq(tern_tp_msg_alloc(p.client, 4097, &buf), TERN_EMSGSIZE);
    ck_assert_int_eq(tern_tp_msg_alloc(p.client, 100, &buf), 0);
    /* One reservation at a time. */
    ck_assert_int_eq(tern_tp_msg_alloc(p.client, 10, &buf2), TERN_EINVAL);
    /* Posting more than was reserved is refused. */
    ck_assert_int_eq(tern_tp_msg_post(p.client, buf, 101), TERN_EMSGSIZE);
    tern_tp_msg_abort(p.client, buf);
    ck_assert_int_eq(tern_tp_msg_alloc(p.client, 50, &buf), 0);
    memcpy(buf, "hello", 5);
    /* Posting less than reserved sends only that much. */
    ck_assert_int_eq(tern_tp_msg_post(p.client, buf, 5), 0);
    ck_assert_int_eq(tern_tp_msg_post(p.client, buf, 5), TERN_EINVAL);
    ck_assert(tp_next2(p.b, p.a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    ck_assert_uint_eq(ev.len, 5);
    ck_assert(memcmp(ev.data, "hello", 5) == 0);
    tern_tp_msg_release(ev.conn, ev.data);
    /* The aborted reservation never reached the peer. */
    ck_assert(!tp_next2(p.b, p.a, &ev, 50));
    tp_pair_close(&p);
}
END_TEST

/* A receiver that does not poll makes the sender see TERN_EAGAIN, then
 * WRITABLE once it drains; nothing is lost or reordered. */
START_TEST(backpressure)
{
    struct tp_pair p;
    struct tern_tp_event ev;
    unsigned sent = 0, got = 0;
    uint8_t msg[4096];
    bool writable = false;
    int rc;

    memset(msg, 0, sizeof(msg));
    tp_pair_open(&p, FC, 4096);
    for (;;) {
        void *buf;

        rc = tern_tp_msg_alloc(p.client, sizeof(msg), &buf);
        if (rc == TERN_EAGAIN)
            break;
        ck_assert_int_eq(rc, 0);
        fill_pattern(buf, sizeof(msg), sent++);
        ck_assert_int_eq(tern_tp_msg_post(p.client, buf, sizeof(msg)), 0);
        ck_assert_uint_lt(sent, 1000000);
        /* Let the sender's progress engine push what the kernel takes. */
        if (sent % 64 == 0)
            while (tp_next(p.a, &ev, 0))
                ;
    }
    ck_assert_uint_gt(sent, 0);
    while (got < sent || !writable) {
        if (tp_next(p.a, &ev, 0)) {
            if (ev.type == TERN_TP_EV_WRITABLE)
                writable = true;
            continue;
        }
        if (!tp_next(p.b, &ev, 10))
            continue;
        ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
        ck_assert_uint_eq(ev.len, sizeof(msg));
        ck_assert_msg(check_pattern(ev.data, ev.len, got), "message %u corrupted", got);
        got++;
        tern_tp_msg_release(ev.conn, ev.data);
    }
    ck_assert(writable);
    ck_assert_int_eq(tern_tp_msg_send(p.client, msg, 10), 0);
    tp_pair_close(&p);
}
END_TEST

struct onesided {
    struct tp_pair p;
    uint8_t remote_mem[8192], local_mem[8192];
    struct tern_tp_mr *rmr, *lmr;
    struct tern_tp_rkey rkey;
};

static void onesided_open(struct onesided *o, const struct fabric_case *fc, uint32_t access)
{
    tp_pair_open(&o->p, fc, 0);
    memset(o->remote_mem, 0, sizeof(o->remote_mem));
    ck_assert_int_eq(tern_tp_mr_reg(o->p.b, o->remote_mem, sizeof(o->remote_mem), access,
                                    &o->rmr), 0);
    ck_assert_int_eq(tern_tp_mr_reg(o->p.a, o->local_mem, sizeof(o->local_mem),
                                    TERN_TP_ACCESS_LOCAL, &o->lmr), 0);
    o->rkey = tp_pair_rkey(&o->p, o->rmr);
    ck_assert_uint_eq(o->rkey.len, sizeof(o->remote_mem));
}

/* Start a put or get from `lmr` on p->client and wait for its completion;
 * returns its status (or the code the call returned). */
static int pair_op(struct tp_pair *p, struct tern_tp_mr *lmr, bool put, size_t loff, size_t len,
                   const struct tern_tp_rkey *rk, uint64_t roff, uint64_t token)
{
    struct tern_tp_event ev;
    int rc = put ? tern_tp_put(p->client, lmr, loff, len, rk, roff, token)
                 : tern_tp_get(p->client, lmr, loff, len, rk, roff, token);

    if (rc < 0)
        return rc;
    ck_assert(tp_next2(p->a, p->b, &ev, 5000));
    ck_assert_int_eq(ev.type, put ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE);
    ck_assert_uint_eq(ev.token, token);
    ck_assert_ptr_eq(ev.conn, p->client);
    return ev.status;
}

static int onesided_op(struct onesided *o, bool put, size_t loff, size_t len,
                       const struct tern_tp_rkey *rk, uint64_t roff, uint64_t token)
{
    return pair_op(&o->p, o->lmr, put, loff, len, rk, roff, token);
}

START_TEST(put_get_roundtrip)
{
    struct onesided o;

    onesided_open(&o, FC, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE);
    fill_pattern(o.local_mem, 3000, 5);
    ck_assert_int_eq(onesided_op(&o, true, 0, 3000, &o.rkey, 1000, 42), 0);
    /* The bytes landed in the peer's memory, at the offset, nowhere else. */
    ck_assert(check_pattern(o.remote_mem + 1000, 3000, 5));
    ck_assert_uint_eq(o.remote_mem[999], 0);
    ck_assert_uint_eq(o.remote_mem[4000], 0);
    memset(o.local_mem, 0, sizeof(o.local_mem));
    ck_assert_int_eq(onesided_op(&o, false, 4096, 3000, &o.rkey, 1000, 43), 0);
    ck_assert(check_pattern(o.local_mem + 4096, 3000, 5));
    /* Whole region, edge to edge. */
    ck_assert_int_eq(onesided_op(&o, false, 0, 8192, &o.rkey, 0, 44), 0);
    ck_assert_int_eq(onesided_op(&o, true, 8191, 1, &o.rkey, 8191, 45), 0);
    tp_pair_close(&o.p);
}
END_TEST

START_TEST(put_get_many_in_flight)
{
    struct onesided o;
    struct tern_tp_event ev;
    enum { N = 200 };

    onesided_open(&o, FC, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE);
    for (unsigned i = 0; i < N; i++) {
        o.local_mem[i] = (uint8_t)i;
        ck_assert_int_eq(tern_tp_put(o.p.client, o.lmr, i, 1, &o.rkey, i, i), 0);
    }
    for (unsigned i = 0; i < N; i++) {
        ck_assert(tp_next2(o.p.a, o.p.b, &ev, 5000));
        ck_assert_int_eq(ev.type, TERN_TP_EV_PUT_DONE);
        ck_assert_int_eq(ev.status, 0);
        ck_assert_uint_eq(ev.token, i);     /* completions in order */
    }
    for (unsigned i = 0; i < N; i++)
        ck_assert_uint_eq(o.remote_mem[i], (uint8_t)i);
    tp_pair_close(&o.p);
}
END_TEST

/* Regions from tern_tp_mr_alloc work like registered ones on every
 * fabric; on shm their operations turn direct partway through, with some
 * in flight, and completions must still come in order. */
/* tern_tp_rma_max is what the fabric takes: a put and a get of exactly
 * that many bytes work, one byte more is refused with TERN_EMSGSIZE and
 * the connection goes on. A fabric without one-sided operations says 0. */
START_TEST(rma_max_is_the_limit)
{
    struct tp_pair p;
    struct tern_tp_mr *rmr, *lmr;
    struct tern_tp_rkey rkey;
    struct tern_tp_event ev;
    size_t max, len;
    uint8_t *r, *l;

    tp_pair_open(&p, FC, 0);
    max = tern_tp_rma_max(p.client);
    if (!(tern_tp_caps(p.a) & (TERN_TP_CAP_PUT | TERN_TP_CAP_GET))) {
        ck_assert_uint_eq(max, 0);
        tp_pair_close(&p);
        return;
    }
    ck_assert_uint_gt(max, 0);
    ck_assert_uint_le(max, tern_tp_max_msg(p.a));
    len = max + 1;
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, len, TERN_TP_ACCESS_REMOTE_READ |
                                                    TERN_TP_ACCESS_REMOTE_WRITE, &rmr), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, len, 0, &lmr), 0);
    r = tern_tp_mr_addr(rmr);
    l = tern_tp_mr_addr(lmr);
    rkey = tp_pair_rkey(&p, rmr);
    fill_pattern(l, max, 7);
    ck_assert_int_eq(tern_tp_put(p.client, lmr, 0, max + 1, &rkey, 0, 1), TERN_EMSGSIZE);
    ck_assert_int_eq(tern_tp_get(p.client, lmr, 0, max + 1, &rkey, 0, 2), TERN_EMSGSIZE);
    ck_assert_int_eq(tern_tp_put(p.client, lmr, 0, max, &rkey, 0, 3), 0);
    ck_assert(tp_next2(p.a, p.b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_PUT_DONE);
    ck_assert_int_eq(ev.status, 0);
    ck_assert(check_pattern(r, max, 7));
    memset(l, 0, len);
    ck_assert_int_eq(tern_tp_get(p.client, lmr, 1, max, &rkey, 0, 4), 0);
    ck_assert(tp_next2(p.a, p.b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_GET_DONE);
    ck_assert_int_eq(ev.status, 0);
    ck_assert(check_pattern(l + 1, max, 7));
    tp_pair_close(&p);
}
END_TEST

START_TEST(allocated_regions)
{
    struct tp_pair p;
    struct tern_tp_mr *rmr, *lmr;
    struct tern_tp_rkey rkey;
    struct tern_tp_event ev;
    uint8_t *r, *l;
    enum { LEN = 16384, ROUNDS = 60, BATCH = 4 };

    tp_pair_open(&p, FC, 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, LEN, TERN_TP_ACCESS_REMOTE_READ |
                                                   TERN_TP_ACCESS_REMOTE_WRITE, &rmr), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, LEN, 0, &lmr), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, 0, 0, &lmr), TERN_EINVAL);
    r = tern_tp_mr_addr(rmr);
    l = tern_tp_mr_addr(lmr);
    ck_assert_uint_eq(r[LEN - 1], 0);   /* zeroed */
    rkey = tp_pair_rkey(&p, rmr);
    for (unsigned round = 0; round < ROUNDS; round++) {
        /* Put BATCH slots, then get them back into the other half. */
        for (unsigned i = 0; i < BATCH; i++) {
            memset(l + i * 64, (int)(round * BATCH + i), 64);
            ck_assert_int_eq(tern_tp_put(p.client, lmr, i * 64, 64, &rkey, i * 64, i), 0);
        }
        for (unsigned i = 0; i < BATCH; i++)
            ck_assert_int_eq(tern_tp_get(p.client, lmr, LEN / 2 + i * 64, 64, &rkey, i * 64,
                                         BATCH + i),
                             0);
        for (unsigned i = 0; i < 2 * BATCH; i++) {
            ck_assert(tp_next2(p.a, p.b, &ev, 5000));
            ck_assert_int_eq(ev.status, 0);
            ck_assert_uint_eq(ev.token, i);     /* in order, served or direct */
            ck_assert_int_eq(ev.type, i < BATCH ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE);
        }
        for (unsigned i = 0; i < BATCH; i++) {
            ck_assert_uint_eq(r[i * 64 + 63], (uint8_t)(round * BATCH + i));
            ck_assert_uint_eq(l[LEN / 2 + i * 64], (uint8_t)(round * BATCH + i));
        }
    }
    ck_assert_int_eq(tern_tp_mr_dereg(lmr), 0);
    ck_assert_int_eq(tern_tp_mr_dereg(rmr), 0);
    ck_assert_int_eq(tern_tp_mr_dereg(rmr), TERN_EINVAL);
    tp_pair_close(&p);
}
END_TEST

/* A stream of put(slot, i), get(slot) pairs with a window of operations
 * always in flight: every get reads the put just before it (a connection's
 * operations take effect in order), whether they were served or direct,
 * and whenever a stream turns from one to the other. TERN_EAGAIN means
 * "retry after a completion". */
START_TEST(ordered_put_then_get_stream)
{
    struct tp_pair p;
    struct tern_tp_mr *rmr, *lmr;
    struct tern_tp_rkey rkey;
    struct tern_tp_event ev;
    uint64_t *l;
    enum { N = 1500, WINDOW = 8 };
    unsigned issued = 0, completed = 0;

    tp_pair_open(&p, FC, 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, 4096, TERN_TP_ACCESS_REMOTE_READ |
                                                     TERN_TP_ACCESS_REMOTE_WRITE, &rmr), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, (2 * N + 1) * sizeof(uint64_t), 0, &lmr), 0);
    l = tern_tp_mr_addr(lmr);
    rkey = tp_pair_rkey(&p, rmr);
    while (completed < 2 * N) {
        /* Keep the window full: even ops put i, odd ops get it back. */
        while (issued < 2 * N && issued - completed < WINDOW) {
            unsigned i = issued / 2;
            int rc;

            if (issued % 2 == 0) {
                l[2 * i] = i + 1;
                rc = tern_tp_put(p.client, lmr, 2 * i * 8, 8, &rkey, 64, issued);
            } else {
                rc = tern_tp_get(p.client, lmr, (2 * i + 1) * 8, 8, &rkey, 64, issued);
            }
            if (rc == TERN_EAGAIN)
                break;
            ck_assert_int_eq(rc, 0);
            issued++;
        }
        ck_assert(tp_next2(p.a, p.b, &ev, 5000));
        ck_assert_int_eq(ev.status, 0);
        ck_assert_uint_eq(ev.token, completed);
        if (completed % 2)
            ck_assert_msg(l[completed] == completed / 2 + 1,
                          "get %u read %llu, wanted the put before it (%u)", completed / 2,
                          (unsigned long long)l[completed], completed / 2 + 1);
        completed++;
    }
    tern_tp_mr_dereg(lmr);
    tern_tp_mr_dereg(rmr);
    tp_pair_close(&p);
}
END_TEST

/* Accesses outside what the remote key grants (past the end, straddling
 * it, an offset that wraps, a put into a read-only region) complete with
 * TERN_EREMACCESS, touch nothing, and leave the connection usable. */
START_TEST(remote_range_and_rights_errors)
{
    struct onesided o;
    struct tern_tp_mr *ro_mr;
    struct tern_tp_rkey ro;
    static uint8_t ro_mem[256];

    onesided_open(&o, FC, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE);
    fill_pattern(o.local_mem, 4096, 9);     /* gets land above 4096 */
    ck_assert_int_eq(onesided_op(&o, true, 0, 16, &o.rkey, 8192, 3), TERN_EREMACCESS);
    ck_assert_int_eq(onesided_op(&o, true, 0, 16, &o.rkey, 8180, 4), TERN_EREMACCESS);
    ck_assert_int_eq(onesided_op(&o, false, 4096, 16, &o.rkey, UINT64_MAX - 4, 5),
                     TERN_EREMACCESS);
    for (size_t i = 0; i < sizeof(o.remote_mem); i++)
        ck_assert_uint_eq(o.remote_mem[i], 0);
    /* Permissions: a read-only region refuses puts, allows gets. */
    ck_assert_int_eq(tern_tp_mr_reg(o.p.b, ro_mem, sizeof(ro_mem), TERN_TP_ACCESS_REMOTE_READ,
                                    &ro_mr), 0);
    ro = tp_pair_rkey(&o.p, ro_mr);
    ck_assert_int_eq(onesided_op(&o, true, 0, 16, &ro, 0, 6), TERN_EREMACCESS);
    ck_assert_uint_eq(ro_mem[0], 0);
    ck_assert_int_eq(onesided_op(&o, false, 4096, 16, &ro, 0, 7), 0);
    /* And the connection still works. */
    ck_assert_int_eq(onesided_op(&o, true, 0, 16, &o.rkey, 0, 9), 0);
    ck_assert(check_pattern(o.remote_mem, 16, 9));
    tp_pair_close(&o.p);
}
END_TEST

/* After a refused key the NIC breaks the queue pair: the operation fails
 * with TERN_EREMACCESS, then the connection closes with that status. */
static void expect_key_error_close(struct onesided *o, uint64_t token)
{
    struct tern_tp_event ev;

    ck_assert(tp_next2(o->p.a, o->p.b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
    ck_assert_ptr_eq(ev.conn, o->p.client);
    ck_assert_int_eq(ev.status, TERN_EREMACCESS);
    ck_assert_int_eq(tern_tp_get(o->p.client, o->lmr, 0, 16, &o->rkey, 0, token),
                     TERN_ENOTCONN);
    tp_pair_close(&o->p);
}

/* A wrong key, and the key of a region deregistered since, complete with
 * TERN_EREMACCESS and touch nothing. Fabrics that check keys in software
 * keep the connection; on a NIC it closes (and a new one works). */
START_TEST(remote_key_errors)
{
    struct onesided o;
    struct tern_tp_rkey bad;
    struct tern_tp_mr *gone_mr;
    struct tern_tp_rkey gone;
    static uint8_t gone_mem[256];

    onesided_open(&o, FC, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE);
    fill_pattern(o.local_mem, 4096, 9);
    bad = o.rkey;
    bad.key ^= 0x100000;
    ck_assert_int_eq(onesided_op(&o, true, 0, 16, &bad, 0, 1), TERN_EREMACCESS);
    for (size_t i = 0; i < sizeof(o.remote_mem); i++)
        ck_assert_uint_eq(o.remote_mem[i], 0);
    if (tern_tp_fabric_caps(FC->fabric) & TERN_TP_CAP_STRICT_RKEY) {
        expect_key_error_close(&o, 2);
        onesided_open(&o, FC, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE);
        fill_pattern(o.local_mem, 4096, 9);
    } else {
        ck_assert_int_eq(onesided_op(&o, false, 4096, 16, &bad, 0, 2), TERN_EREMACCESS);
    }
    /* A deregistered region is gone for good. */
    ck_assert_int_eq(tern_tp_mr_reg(o.p.b, gone_mem, sizeof(gone_mem),
                                    TERN_TP_ACCESS_REMOTE_READ, &gone_mr), 0);
    gone = tp_pair_rkey(&o.p, gone_mr);
    ck_assert_int_eq(onesided_op(&o, false, 4096, 16, &gone, 0, 7), 0);
    ck_assert_int_eq(tern_tp_mr_dereg(gone_mr), 0);
    ck_assert_int_eq(onesided_op(&o, false, 4096, 16, &gone, 0, 8), TERN_EREMACCESS);
    if (tern_tp_fabric_caps(FC->fabric) & TERN_TP_CAP_STRICT_RKEY) {
        expect_key_error_close(&o, 9);
        return;
    }
    ck_assert_int_eq(onesided_op(&o, true, 0, 16, &o.rkey, 0, 9), 0);
    ck_assert(check_pattern(o.remote_mem, 16, 9));
    tp_pair_close(&o.p);
}
END_TEST

/* ---- regions of the caller's files (tern_tp_mr_reg_fd) ---- */

enum { PG = 4096, FILE_PAGES = 6, FD_OFF = 2 * PG, FD_LEN = 3 * PG + 100 };

/* A file of FILE_PAGES pages, mapped MAP_SHARED from FD_OFF for FD_LEN
 * bytes: a plain file (unlinked at once) or a memfd that allows sealing. */
struct test_file {
    int fd;
    uint8_t *mem;
};

static void test_file_open(struct test_file *f, bool memfd)
{
    if (memfd) {
        f->fd = memfd_create("tern-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    } else {
        char path[] = "/tmp/tern-fdmr-XXXXXX";

        f->fd = mkostemp(path, O_CLOEXEC);
        unlink(path);
    }
    ck_assert_int_ge(f->fd, 0);
    ck_assert_int_eq(ftruncate(f->fd, FILE_PAGES * PG), 0);
    f->mem = mmap(NULL, FD_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, FD_OFF);
    ck_assert(f->mem != MAP_FAILED);
}

static void test_file_close(struct test_file *f)
{
    munmap(f->mem, FD_LEN);
    close(f->fd);
}

/* Does the file hold pattern `seed` at [off, off+len)? */
static bool file_has(int fd, uint64_t off, size_t len, unsigned seed)
{
    uint8_t buf[4096];

    ck_assert_uint_le(len, sizeof(buf));
    ck_assert_int_eq(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    return check_pattern(buf, len, seed);
}

static bool file_zero(int fd, uint64_t off, size_t len)
{
    uint8_t buf[4096];

    ck_assert_uint_le(len, sizeof(buf));
    ck_assert_int_eq(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    for (size_t i = 0; i < len; i++)
        if (buf[i])
            return false;
    return true;
}


/* Put and get through a file region, rounds of them (on shm they turn
 * direct partway): the bytes land at the region's offset in the file, and
 * gets read what the owner wrote to the file. */
static void file_region_rounds(struct tp_pair *p, struct test_file *f, struct tern_tp_mr *lmr,
                               const struct tern_tp_rkey *rk)
{
    uint8_t *l = tern_tp_mr_addr(lmr);

    for (unsigned round = 0; round < 40; round++) {
        uint64_t roff = (round * 1000) % (FD_LEN - 3000);
        uint8_t buf[3000];

        fill_pattern(l, 3000, round);
        ck_assert_int_eq(pair_op(p, lmr, true, 0, 3000, rk, roff, 2 * round), 0);
        ck_assert_msg(file_has(f->fd, FD_OFF + roff, 3000, round),
                      "round %u: the put did not land at file offset %llu", round,
                      (unsigned long long)(FD_OFF + roff));
        ck_assert(check_pattern(f->mem + roff, 3000, round));
        /* The owner writes the file; a get reads it back. */
        fill_pattern(buf, sizeof(buf), round + 1000);
        ck_assert_int_eq(pwrite(f->fd, buf, sizeof(buf), FD_OFF + (off_t)roff),
                         (ssize_t)sizeof(buf));
        ck_assert_int_eq(pair_op(p, lmr, false, 4096, 3000, rk, roff, 2 * round + 1), 0);
        ck_assert(check_pattern(l + 4096, 3000, round + 1000));
    }
    /* Nothing landed before the region's offset. */
    for (uint64_t off = 0; off < FD_OFF; off += 4096)
        ck_assert(file_zero(f->fd, off, 4096));
}

/* Regions of a plain file and of a memfd, at an offset, with a length that
 * is not a page multiple: put and get work on every fabric, accesses past
 * the end and puts into a read-only region are refused, the endpoint keeps
 * its own descriptor (the caller may close theirs) and lets it go at
 * deregistration, and leaves the caller's mapping alone. */
START_TEST(file_regions)
{
    struct tp_pair p;
    struct tern_tp_mr *lmr, *rmr, *ro_mr;
    struct tern_tp_rkey rk, ro;
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;

    tp_pair_open(&p, FC, 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, 8192, 0, &lmr), 0);
    for (int memfd = 0; memfd < 2; memfd++) {
        struct test_file f;
        uint8_t byte;
        unsigned fds;
        int tmp;

        test_file_open(&f, memfd);
        fds = test_open_fds();
        tmp = dup(f.fd);
        ck_assert_int_ge(tmp, 0);
        ck_assert_int_eq(tern_tp_mr_reg_fd(p.b, f.mem, FD_LEN, tmp, FD_OFF, rw, &rmr), 0);
        close(tmp);     /* the endpoint has its own */
        ck_assert_uint_eq(test_open_fds(), fds + 1);
        ck_assert_ptr_eq(tern_tp_mr_addr(rmr), f.mem);
        rk = tp_pair_rkey(&p, rmr);
        ck_assert_uint_eq(rk.len, FD_LEN);
        file_region_rounds(&p, &f, lmr, &rk);

        /* Up to the last byte, not past it (the mapping is longer). */
        fill_pattern(tern_tp_mr_addr(lmr), 64, 77);
        ck_assert_int_eq(pair_op(&p, lmr, true, 0, 16, &rk, FD_LEN - 16, 100), 0);
        ck_assert(file_has(f.fd, FD_OFF + FD_LEN - 16, 16, 77));
        ck_assert_int_eq(pair_op(&p, lmr, true, 0, 32, &rk, FD_LEN - 16, 101), TERN_EREMACCESS);
        ck_assert_int_eq(pair_op(&p, lmr, false, 0, 1, &rk, FD_LEN, 102), TERN_EREMACCESS);
        ck_assert(file_zero(f.fd, FD_OFF + FD_LEN, 100));

        /* A read-only region over the file's first page. */
        uint8_t *first = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd, 0);

        ck_assert(first != MAP_FAILED);
        ck_assert_int_eq(tern_tp_mr_reg_fd(p.b, first, PG, f.fd, 0,
                                           TERN_TP_ACCESS_REMOTE_READ, &ro_mr), 0);
        ro = tp_pair_rkey(&p, ro_mr);
        fill_pattern(first, PG, 5);
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(pair_op(&p, lmr, true, 0, 64, &ro, 0, 200 + i), TERN_EREMACCESS);
            ck_assert(check_pattern(first, PG, 5));
            ck_assert_int_eq(pair_op(&p, lmr, false, 0, 64, &ro, 64, 300 + i), 0);
            ck_assert(memcmp(tern_tp_mr_addr(lmr), first + 64, 64) == 0);
        }

        /* Deregistration lets go of the descriptor, not of the mapping. */
        ck_assert_int_eq(tern_tp_mr_dereg(ro_mr), 0);
        ck_assert_int_eq(tern_tp_mr_dereg(rmr), 0);
        ck_assert_uint_eq(test_open_fds(), fds);
        f.mem[0] = 0x42;
        first[0] = 0x43;
        ck_assert_int_eq(pread(f.fd, &byte, 1, FD_OFF), 1);
        ck_assert_uint_eq(byte, 0x42);
        ck_assert_int_eq(pread(f.fd, &byte, 1, 0), 1);
        ck_assert_uint_eq(byte, 0x43);
        munmap(first, PG);
        test_file_close(&f);
    }
    tp_pair_close(&p);
}
END_TEST

/* tern_tp_mr_reg_fd checks its arguments on every fabric. */
START_TEST(file_region_argument_errors)
{
    struct tern_tp_ep *ep = tp_open(FC->fabric, 0);
    struct tern_tp_mr *mr;
    struct test_file f;
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    int closed;

    test_file_open(&f, false);
    closed = dup(f.fd);
    close(closed);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, FD_LEN, -1, FD_OFF, rw, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, FD_LEN, closed, FD_OFF, rw, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, FD_LEN, f.fd, FD_OFF + 8, rw, &mr),
                     TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem + 8, FD_LEN - 8, f.fd, FD_OFF, rw, &mr),
                     TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, FD_LEN, f.fd, FD_OFF, 0xff, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, 0, f.fd, FD_OFF, rw, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, FD_LEN, f.fd, FD_OFF, rw, NULL), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, FD_LEN, f.fd, FD_OFF, rw, &mr), 0);
    ck_assert_int_eq(tern_tp_mr_dereg(mr), 0);
    /* Closing the endpoint with a region still registered leaves the
     * caller's mapping alone too. */
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f.mem, FD_LEN, f.fd, FD_OFF, rw, &mr), 0);
    tern_tp_close(ep);
    f.mem[FD_LEN - 1] = 1;
    test_file_close(&f);
}
END_TEST

/* tern_tp_rkey_ptr: TERN_ENOTSUP without the capability; with it, a
 * pointer into a file region of the peer once it is mapped (polling in
 * between), and TERN_ENOTSUP for memory the peer registered without a file.
 * Argument errors are the core's. */
START_TEST(rkey_ptr_by_capability)
{
    struct tp_pair p;
    struct tern_tp_mr *fmr, *plain;
    struct tern_tp_rkey fk, pk;
    struct test_file f;
    static uint8_t mem[4096];
    void *ptr = &ptr;
    double end;
    int rc;

    tp_pair_open(&p, FC, 0);
    test_file_open(&f, true);
    ck_assert_int_eq(tern_tp_mr_reg_fd(p.b, f.mem, FD_LEN, f.fd, FD_OFF,
                                       TERN_TP_ACCESS_REMOTE_READ, &fmr), 0);
    ck_assert_int_eq(tern_tp_mr_reg(p.b, mem, sizeof(mem), TERN_TP_ACCESS_REMOTE_READ, &plain), 0);
    fk = tp_pair_rkey(&p, fmr);
    pk = tp_pair_rkey(&p, plain);
    fill_pattern(f.mem, 64, 3);
    if (!(tern_tp_caps(p.a) & TERN_TP_CAP_RKEY_PTR)) {
        ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &fk, 0, 8, TERN_TP_ACCESS_REMOTE_READ, &ptr),
                         TERN_ENOTSUP);
        ck_assert_ptr_null(ptr);
        ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &fk, 0, 8, 0xff, &ptr), TERN_ENOTSUP);
        tp_pair_close(&p);
        test_file_close(&f);
        return;
    }
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &fk, 0, 0, TERN_TP_ACCESS_REMOTE_READ, &ptr),
                     TERN_EINVAL);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &fk, 0, 8, 0xff, &ptr), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, NULL, 0, 8, 0, &ptr), TERN_EINVAL);
    for (int k = 0; k < 2; k++) {
        const struct tern_tp_rkey *rk = k ? &pk : &fk;
        struct tern_tp_event ev[4];

        end = now_ms() + 5000;
        while ((rc = tern_tp_rkey_ptr(p.client, rk, 0, 64, TERN_TP_ACCESS_REMOTE_READ, &ptr)) ==
               TERN_EAGAIN) {
            ck_assert_msg(now_ms() < end, "rkey_ptr: still TERN_EAGAIN after 5 s");
            ck_assert_int_eq(tern_tp_poll(p.a, ev, 4), 0);
            ck_assert_int_eq(tern_tp_poll(p.b, ev, 4), 0);
        }
        ck_assert_int_eq(rc, k ? TERN_ENOTSUP : 0);
    }
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &fk, 0, 64, TERN_TP_ACCESS_REMOTE_READ, &ptr), 0);
    ck_assert(check_pattern(ptr, 64, 3));
    tp_pair_close(&p);
    test_file_close(&f);
}
END_TEST

START_TEST(local_argument_errors)
{
    struct onesided o;
    struct tern_tp_mr *other;
    uint8_t mem[64];

    onesided_open(&o, FC, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE);
    ck_assert_int_eq(tern_tp_put(o.p.client, o.lmr, 8190, 16, &o.rkey, 0, 0), TERN_ERANGE);
    ck_assert_int_eq(tern_tp_get(o.p.client, o.lmr, 0, 0, &o.rkey, 0, 0), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_put(o.p.client, o.lmr, 0, 16, NULL, 0, 0), TERN_EINVAL);
    /* A region of another endpoint is not ours to send from. */
    ck_assert_int_eq(tern_tp_mr_reg(o.p.b, mem, sizeof(mem), 0, &other), 0);
    ck_assert_int_eq(tern_tp_put(o.p.client, other, 0, 16, &o.rkey, 0, 0), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_reg(o.p.a, mem, sizeof(mem), 0xff, &other), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_mr_dereg(o.lmr), 0);
    ck_assert_int_eq(tern_tp_mr_dereg(o.lmr), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_get(o.p.client, o.lmr, 0, 16, &o.rkey, 0, 0), TERN_EINVAL);
    tp_pair_close(&o.p);
}
END_TEST

START_TEST(peer_close_reported)
{
    struct tp_pair p;
    struct tern_tp_event ev;
    void *buf;

    tp_pair_open(&p, FC, 0);
    tern_tp_disconnect(p.server);
    ck_assert(tp_next2(p.a, p.b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
    ck_assert_ptr_eq(ev.conn, p.client);
    ck_assert_int_le(ev.status, 0);
    ck_assert_int_eq(tern_tp_msg_alloc(p.client, 8, &buf), TERN_ENOTCONN);
    tern_tp_disconnect(p.client);
    tp_pair_close(&p);
}
END_TEST

/* One-sided operations in flight when the peer goes away still complete,
 * with an error, before CLOSED. */
START_TEST(inflight_ops_fail_on_close)
{
    struct onesided o;
    struct tern_tp_event ev;
    bool done = false, closed = false;

    onesided_open(&o, FC, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE);
    ck_assert_int_eq(tern_tp_get(o.p.client, o.lmr, 0, 64, &o.rkey, 0, 77), 0);
    /* The peer vanishes without serving it. */
    tern_tp_close(o.p.b);
    while (!closed) {
        ck_assert(tp_next(o.p.a, &ev, 5000));
        if (ev.type == TERN_TP_EV_GET_DONE) {
            ck_assert(!closed);
            ck_assert_uint_eq(ev.token, 77);
            ck_assert_int_lt(ev.status, 0);
            done = true;
        } else {
            ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
            closed = true;
        }
    }
    ck_assert(done);
    tern_tp_close(o.p.a);
}
END_TEST

START_TEST(connect_refused)
{
    struct tern_tp_ep *ep = tp_open(FC->fabric, 0);
    struct tern_tp_conn *c;
    struct tern_tp_event ev;

    ck_assert_int_eq(tern_tp_connect(ep, FC->refused, &c), 0);
    ck_assert(tp_next(ep, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert_int_eq(ev.status, TERN_ECONNREFUSED);
    ck_assert(tp_next(ep, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
    tern_tp_disconnect(c);
    ck_assert_int_eq(tern_tp_connect(ep, FC->bad, &c), TERN_EBADADDR);
    ck_assert_int_eq(tern_tp_listen(ep, FC->bad, NULL, 0), TERN_EBADADDR);
    tern_tp_close(ep);
}
END_TEST

START_TEST(wait_fd_wakes)
{
    struct tp_pair p;
    struct tern_tp_event ev;
    struct pollfd pfd;
    double t0;

    tp_pair_open(&p, FC, 0);
    ck_assert(tern_tp_caps(p.b) & TERN_TP_CAP_WAIT_FD);
    pfd = (struct pollfd){.fd = tern_tp_wait_fd(p.b), .events = POLLIN};
    ck_assert_int_ge(pfd.fd, 0);
    /* Idle: the fd stays quiet and wait times out. */
    ck_assert_int_eq(tern_tp_arm(p.b), 0);
    ck_assert_int_eq(poll(&pfd, 1, 20), 0);
    t0 = now_ms();
    ck_assert_int_eq(tern_tp_wait(p.b, 30000000ll), 0);
    ck_assert(now_ms() - t0 >= 25);
    /* Sleeping on the fd needs an arm first (it tells window peers to
     * ring a doorbell). */
    ck_assert_int_eq(tern_tp_arm(p.b), 0);
    ck_assert_int_eq(tern_tp_msg_send(p.client, "x", 1), 0);
    /* A flush alone sends it: the sender does not have to poll. */
    ck_assert_int_eq(tern_tp_flush(p.a), 0);
    ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
    ck_assert_int_eq(tern_tp_wait(p.b, 5000000000ll), 1);
    ck_assert(tp_next(p.b, &ev, 1000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    tern_tp_msg_release(ev.conn, ev.data);
    tp_pair_close(&p);
}
END_TEST

/* Take `want` events of `type` from ep one poll (max 1) at a time, sleeping
 * on the wait fd whenever tern_tp_arm() says that is safe, as its comment
 * tells callers to. RECV views are released. A sleep that times out while
 * events are still to come means arm said "safe" when it was not. */
static void take_sleeping(struct tern_tp_ep *ep, enum tern_tp_event_type type, int want,
                          const char *what)
{
    struct pollfd pfd = {.fd = tern_tp_wait_fd(ep), .events = POLLIN};
    struct tern_tp_event ev;
    int got = 0;

    while (got < want) {
        int rc = tern_tp_arm(ep), n;

        ck_assert_msg(rc == 0 || rc == TERN_EAGAIN, "%s: tern_tp_arm: %s", what,
                      tern_err_name(rc));
        if (rc == 0)
            ck_assert_msg(poll(&pfd, 1, 5000) == 1,
                          "%s: tern_tp_arm said sleeping was safe with %d of %d events "
                          "still to come, and the wait fd never woke", what, want - got, want);
        n = tern_tp_poll(ep, &ev, 1);
        ck_assert_int_ge(n, 0);
        ck_assert_msg(rc == 0 || n == 1, "%s: tern_tp_arm said events were owed, poll "
                      "returned none", what);
        if (n == 0)
            continue;
        ck_assert_int_eq(ev.type, type);
        if (ev.type == TERN_TP_EV_RECV)
            tern_tp_msg_release(ev.conn, ev.data);
        got++;
    }
}

/* The first event of `type`, polling with max 1 (a poll may come back empty
 * even though the wait fd is readable: busy mode looks at some sources only
 * every few polls). */
static void first_event(struct tern_tp_ep *ep, enum tern_tp_event_type type)
{
    struct tern_tp_event ev;
    double end = now_ms() + 5000;
    int n;

    while ((n = tern_tp_poll(ep, &ev, 1)) == 0)
        ck_assert_msg(now_ms() < end, "no event within 5 s");
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ev.type, type);
    if (ev.type == TERN_TP_EV_RECV)
        tern_tp_msg_release(ev.conn, ev.data);
}

/* Poll until nothing comes, then nothing may be owed. */
static void drain_then_armed(struct tern_tp_ep *ep, const char *what)
{
    struct tern_tp_event ev[8];
    int n;

    while ((n = tern_tp_poll(ep, ev, 8)) > 0)
        for (int i = 0; i < n; i++)
            if (ev[i].type == TERN_TP_EV_RECV)
                tern_tp_msg_release(ev[i].conn, ev[i].data);
    ck_assert_int_eq(n, 0);
    n = tern_tp_arm(ep);
    ck_assert_msg(n == 0, "%s: drained, yet tern_tp_arm returns %d (%s)", what, n,
                  tern_err_name(n));
}

/* A poll with a small max may leave events inside the endpoint, where they
 * do not make the wait fd readable. tern_tp_arm() must say so: TERN_EAGAIN
 * while such events are owed (unless the fd is readable anyway), 0 once
 * they are all handed out, and 0 on an idle endpoint. */
START_TEST(arm_before_sleeping)
{
    struct tp_pair p;
    struct tern_tp_conn *extra[3];
    struct pollfd pfd;
    char bound[128];
    int rc;

    tp_pair_open(&p, FC, 0);
    if (!(tern_tp_caps(p.b) & TERN_TP_CAP_WAIT_FD)) {
        ck_assert_int_eq(tern_tp_arm(p.b), TERN_ENOTSUP);
        tp_pair_close(&p);
        return;
    }
    pfd = (struct pollfd){.fd = tern_tp_wait_fd(p.b), .events = POLLIN};
    ck_assert_int_ge(pfd.fd, 0);
    ck_assert_int_eq(tern_tp_arm(p.a), 0);
    ck_assert_int_eq(tern_tp_arm(p.b), 0);

    /* Three messages sent together, taken one per poll. */
    for (unsigned i = 0; i < 3; i++)
        ck_assert_int_eq(tern_tp_msg_send(p.client, &i, sizeof(i)), 0);
    ck_assert_int_eq(tern_tp_flush(p.a), 0);
    ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
    usleep(20000);      /* all three have landed */
    first_event(p.b, TERN_TP_EV_RECV);
    rc = tern_tp_arm(p.b);
    ck_assert_msg(rc == TERN_EAGAIN || poll(&pfd, 1, 0) == 1,
                  "two messages owed, the wait fd quiet, and tern_tp_arm returns %d", rc);
    take_sleeping(p.b, TERN_TP_EV_RECV, 2, "messages");
    drain_then_armed(p.b, "messages");

    /* Three connections accepted at once: ACCEPTED events owed. An NTB
     * device joins exactly two endpoints, so there they go over the link
     * that is up; elsewhere to a second listener. */
    if (tern_tp_fabric_caps(FC->fabric) & TERN_TP_CAP_POINT_TO_POINT)
        snprintf(bound, sizeof(bound), "%s", p.bound);
    else
        ck_assert_int_eq(tern_tp_listen(p.b, FC->listen, bound, sizeof(bound)), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(tern_tp_connect(p.a, bound, &extra[i]), 0);
    ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
    usleep(20000);      /* all three are waiting to be accepted */
    first_event(p.b, TERN_TP_EV_ACCEPTED);
    rc = tern_tp_arm(p.b);
    ck_assert_msg(rc == TERN_EAGAIN || poll(&pfd, 1, 0) == 1,
                  "two accepts owed, the wait fd quiet, and tern_tp_arm returns %d", rc);
    take_sleeping(p.b, TERN_TP_EV_ACCEPTED, 2, "accepts");
    drain_then_armed(p.b, "accepts");
    tp_pair_close(&p);
}
END_TEST

/* Many connections on one endpoint, each with its own ordered stream. */
START_TEST(many_connections)
{
    enum { NC = 200, NM = 20 };
    struct tern_tp_ep *a = tp_open(FC->fabric, 0), *b = tp_open(FC->fabric, 0);
    struct tern_tp_conn *conns[NC];
    unsigned next[NC] = {0};
    struct tern_tp_event ev;
    char bound[128];
    unsigned accepted = 0, connected = 0, got = 0;

    ck_assert_int_eq(tern_tp_listen(b, FC->listen, bound, sizeof(bound)), 0);
    for (unsigned i = 0; i < NC; i++) {
        ck_assert_int_eq(tern_tp_connect(a, bound, &conns[i]), 0);
        tern_tp_conn_set_user(conns[i], (void *)(uintptr_t)i);
    }
    while (connected < NC || accepted < NC) {
        if (tp_next(a, &ev, 0)) {
            ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
            ck_assert_int_eq(ev.status, 0);
            connected++;
        } else if (tp_next(b, &ev, 10)) {
            ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
            accepted++;
        }
    }
    for (unsigned m = 0; m < NM; m++)
        for (unsigned i = 0; i < NC; i++) {
            unsigned v[2] = {i, m};

            ck_assert_int_eq(tern_tp_msg_send(conns[i], v, sizeof(v)), 0);
        }
    while (got < NC * NM) {
        const unsigned *v;

        ck_assert(tp_next2(b, a, &ev, 5000));
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

/* One connection that always has large messages queued must not starve
 * another doing small ping-pongs on the same endpoints: each fabric bounds
 * what one connection gets per poll. (A correctness bound, generous for
 * noisy machines, not a speed target.) */
START_TEST(greedy_connection_does_not_starve_others)
{
    struct tern_tp_ep *a = tp_open(FC->fabric, 256 * 1024), *b = tp_open(FC->fabric, 256 * 1024);
    struct tern_tp_conn *greedy_a = NULL, *greedy_b = NULL, *ping_a = NULL, *ping_b = NULL;
    struct tern_tp_event ev[32];
    static uint8_t big[200 * 1024];
    char bound[128];
    unsigned pongs = 0, bulk = 0, up = 0;
    double start, worst = 0, sent_at = 0;
    bool waiting = false;

    ck_assert_int_eq(tern_tp_listen(b, FC->listen, bound, sizeof(bound)), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &greedy_a), 0);
    ck_assert_int_eq(tern_tp_connect(a, bound, &ping_a), 0);
    /* Accepts arrive in order; tell the two apart by their first message. */
    ck_assert_int_eq(tern_tp_msg_send(greedy_a, "G", 1), 0);
    ck_assert_int_eq(tern_tp_msg_send(ping_a, "P", 1), 0);
    tern_tp_flush(a);
    start = now_ms();
    while ((!greedy_b || !ping_b || up < 2) && now_ms() - start < 5000) {
        int n = tern_tp_poll(a, ev, 32);

        for (int i = 0; i < n; i++)
            up += ev[i].type == TERN_TP_EV_CONNECTED;
        n = tern_tp_poll(b, ev, 32);
        for (int i = 0; i < n; i++) {
            if (ev[i].type != TERN_TP_EV_RECV)
                continue;
            if (*(const char *)ev[i].data == 'G')
                greedy_b = ev[i].conn;
            else
                ping_b = ev[i].conn;
            tern_tp_msg_release(ev[i].conn, ev[i].data);
        }
    }
    ck_assert(greedy_b && ping_b && up == 2);
    start = now_ms();
    while (pongs < 200) {
        void *buf;
        int n;

        ck_assert_msg(now_ms() - start < 20000, "only %u ping-pongs in 20 s", pongs);
        /* Keep the greedy connection's send path full. */
        while (tern_tp_msg_alloc(greedy_a, sizeof(big), &buf) == 0)
            ck_assert_int_eq(tern_tp_msg_post(greedy_a, buf, sizeof(big)), 0);
        if (!waiting) {
            ck_assert_int_eq(tern_tp_msg_send(ping_a, &pongs, sizeof(pongs)), 0);
            sent_at = now_ms();
            waiting = true;
        }
        n = tern_tp_poll(a, ev, 32);
        for (int i = 0; i < n; i++) {
            if (ev[i].type != TERN_TP_EV_RECV)
                continue;
            ck_assert_ptr_eq(ev[i].conn, ping_a);
            ck_assert_uint_eq(*(const unsigned *)ev[i].data, pongs);
            tern_tp_msg_release(ev[i].conn, ev[i].data);
            if (now_ms() - sent_at > worst)
                worst = now_ms() - sent_at;
            pongs++;
            waiting = false;
        }
        n = tern_tp_poll(b, ev, 32);
        for (int i = 0; i < n; i++) {
            if (ev[i].type != TERN_TP_EV_RECV)
                continue;
            if (ev[i].conn == ping_b)
                ck_assert_int_eq(tern_tp_msg_send(ping_b, ev[i].data, ev[i].len), 0);
            else
                bulk++;
            tern_tp_msg_release(ev[i].conn, ev[i].data);
        }
    }
    /* Both made progress, and no ping waited behind the bulk for long. */
    ck_assert_uint_gt(bulk, 0);
    ck_assert_msg(worst < 1000, "a ping-pong took %.0f ms behind the greedy connection", worst);
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* ---- the core itself: NULL ops answer TERN_ENOTSUP ---- */

static int null_poll(struct tern_tp_ep *ep, struct tern_tp_event *ev, int max)
{
    return 0;
}

static int null_wait_fd(struct tern_tp_ep *ep)
{
    return -1;
}

static int null_wait(struct tern_tp_ep *ep, int timeout_ms)
{
    return 0;
}

static const struct tern_tp_ops sparse_ops = {.poll = null_poll};

/* A wait fd and wait, but no arm: callers could not tell when sleeping is
 * safe, so the fabric may not claim TERN_TP_CAP_WAIT_FD. */
static const struct tern_tp_ops no_arm_ops = {
    .poll = null_poll, .wait_fd = null_wait_fd, .wait = null_wait,
};

static int null_rkey_ptr(struct tern_tp_conn *conn, const struct tern_tp_rkey *rkey, uint64_t roff,
                         size_t len, uint32_t need, void **ptr)
{
    return TERN_EIO;
}

static const struct tern_tp_ops ptr_only_ops = {.poll = null_poll, .rkey_ptr = null_rkey_ptr};

static const struct tern_tp_fabric sparse_fabric = {
    .name = "sparse", .caps = 0, .ep_size = sizeof(struct tern_tp_ep), .ops = &sparse_ops,
};

START_TEST(null_ops_enotsup)
{
    struct tern_tp_config cfg = {.fabric = "sparse"};
    struct tern_tp_ep *ep;
    struct tern_tp_conn *c;
    struct tern_tp_conn fake = {0};
    struct tern_tp_rkey rk = {0};
    struct tern_tp_event ev;
    void *buf;

    ck_assert_int_eq(tp_open_fabric(&sparse_fabric, &cfg, &ep), 0);
    fake.ep = ep;
    ck_assert_int_eq(tern_tp_listen(ep, "x", NULL, 0), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_connect(ep, "x", &c), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_msg_alloc(&fake, 1, &buf), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_msg_post(&fake, NULL, 1), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_put(&fake, NULL, 0, 1, &rk, 0, 0), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_get(&fake, NULL, 0, 1, &rk, 0, 0), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_rkey_ptr(&fake, &rk, 0, 1, 0, &buf), TERN_ENOTSUP);
    ck_assert_ptr_null(buf);
    ck_assert_int_eq(tern_tp_wait_fd(ep), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_wait(ep, 0), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_arm(ep), TERN_ENOTSUP);
    ck_assert_int_eq(tern_tp_poll(ep, &ev, 1), 0);
    ck_assert_int_eq(tern_tp_poll(ep, &ev, 0), TERN_EINVAL);
    tern_tp_close(ep);
}
END_TEST

START_TEST(caps_that_lie_are_refused)
{
    struct tern_tp_fabric liar = sparse_fabric;
    struct tern_tp_config cfg = {.fabric = "liar"};
    struct tern_tp_ep *ep;

    liar.caps = TERN_TP_CAP_PUT;    /* claims put, has no put op */
    ck_assert(!tp_caps_match_ops(&liar));
    ck_assert_int_eq(tp_open_fabric(&liar, &cfg, &ep), TERN_EINVAL);
    liar.caps = TERN_TP_CAP_RKEY_PTR;   /* claims direct pointers, has no op */
    ck_assert(!tp_caps_match_ops(&liar));
    ck_assert_int_eq(tp_open_fabric(&liar, &cfg, &ep), TERN_EINVAL);
    liar.caps = 0;
    liar.ops = &ptr_only_ops;           /* has the op, does not say so */
    ck_assert(!tp_caps_match_ops(&liar));
    liar.caps = TERN_TP_CAP_RKEY_PTR;
    ck_assert(tp_caps_match_ops(&liar));
    liar.caps = TERN_TP_CAP_WAIT_FD;
    liar.ops = &no_arm_ops;
    ck_assert(!tp_caps_match_ops(&liar));
    ck_assert_int_eq(tp_open_fabric(&liar, &cfg, &ep), TERN_EINVAL);
}
END_TEST

START_TEST(open_errors)
{
    struct tern_tp_config cfg = {.fabric = "no-such-fabric"};
    struct tern_tp_ep *ep;

    ck_assert_int_eq(tern_tp_open(&cfg, &ep), TERN_ENOFABRIC);
    ck_assert_int_eq(tern_tp_open(NULL, &ep), TERN_EINVAL);
    cfg.fabric = "tcp";
    cfg.max_msg = 1 << 20;
    cfg.conn_buf = 1 << 10;     /* smaller than one message */
    ck_assert_int_eq(tern_tp_open(&cfg, &ep), TERN_EINVAL);
    ck_assert_str_eq(tern_tp_fabric_names()[0], "tcp");
}
END_TEST

Suite *suite_conformance(void)
{
    Suite *s = suite_create("conformance");
    TCase *tc = tcase_create("fabrics");
    TCase *core = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, caps_match_ops, 0, n_fabric_cases);
    tcase_add_loop_test(tc, message_sizes, 0, n_fabric_cases);
    tcase_add_loop_test(tc, both_directions_in_order, 0, n_fabric_cases);
    tcase_add_loop_test(tc, large_messages, 0, n_fabric_cases);
    tcase_add_loop_test(tc, held_views_stay_valid, 0, n_fabric_cases);
    tcase_add_loop_test(tc, reservation_rules, 0, n_fabric_cases);
    tcase_add_loop_test(tc, backpressure, 0, n_fabric_cases);
    tcase_add_loop_test(tc, put_get_roundtrip, 0, n_fabric_cases);
    tcase_add_loop_test(tc, put_get_many_in_flight, 0, n_fabric_cases);
    tcase_add_loop_test(tc, allocated_regions, 0, n_fabric_cases);
    tcase_add_loop_test(tc, rma_max_is_the_limit, 0, n_fabric_cases);
    tcase_add_loop_test(tc, ordered_put_then_get_stream, 0, n_fabric_cases);
    tcase_add_loop_test(tc, remote_range_and_rights_errors, 0, n_fabric_cases);
    tcase_add_loop_test(tc, remote_key_errors, 0, n_fabric_cases);
    tcase_add_loop_test(tc, file_regions, 0, n_fabric_cases);
    tcase_add_loop_test(tc, file_region_argument_errors, 0, n_fabric_cases);
    tcase_add_loop_test(tc, rkey_ptr_by_capability, 0, n_fabric_cases);
    tcase_add_loop_test(tc, local_argument_errors, 0, n_fabric_cases);
    tcase_add_loop_test(tc, peer_close_reported, 0, n_fabric_cases);
    tcase_add_loop_test(tc, inflight_ops_fail_on_close, 0, n_fabric_cases);
    tcase_add_loop_test(tc, connect_refused, 0, n_fabric_cases);
    tcase_add_loop_test(tc, wait_fd_wakes, 0, n_fabric_cases);
    tcase_add_loop_test(tc, arm_before_sleeping, 0, n_fabric_cases);
    tcase_add_loop_test(tc, many_connections, 0, n_fabric_cases);
    tcase_add_loop_test(tc, greedy_connection_does_not_starve_others, 0, n_fabric_cases);
    suite_add_tcase(s, tc);
    tcase_add_test(core, null_ops_enotsup);
    tcase_add_test(core, caps_that_lie_are_refused);
    tcase_add_test(core, open_errors);
    suite_add_tcase(s, core);
    return s;
}
