/* Direct one-sided access on shm: once a peer has mapped a region from
 * tern_tp_mr_alloc, its put and get complete without the owner polling at
 * all; a read-only region cannot be written, a deregistered one and an
 * out-of-bounds access are refused, and regions registered with
 * tern_tp_mr_reg stay served. */
#include <string.h>

#include "helpers.h"
#include "suites.h"

#define REGION 65536

static const struct fabric_case *shm_case(void)
{
    for (int i = 0; i < n_fabric_cases; i++)
        if (strcmp(fabric_cases[i].fabric, "shm") == 0)
            return &fabric_cases[i];
    ck_abort_msg("no shm fabric case");
    return NULL;
}

/* One operation's completion on `p.a`, with `p.b` polled too or not. */
static struct tern_tp_event done(struct tp_pair *p, bool owner_polls, int ms)
{
    struct tern_tp_event ev;
    bool got = owner_polls ? tp_next2(p->a, p->b, &ev, ms) : tp_next(p->a, &ev, ms);

    ck_assert_msg(got, "no completion within %d ms (the owner %s)", ms,
                  owner_polls ? "polled" : "did not poll");
    ck_assert_msg(ev.type == TERN_TP_EV_PUT_DONE || ev.type == TERN_TP_EV_GET_DONE, "event %d",
                  ev.type);
    return ev;
}

/* Use `rkey` until a get completes with the owner not polling: the first
 * operation is served (and asks for the mapping), the answer comes over
 * the link socket. */
static void map_it(struct tp_pair *p, struct tern_tp_mr *lmr, const struct tern_tp_rkey *rkey)
{
    struct tern_tp_event ev;

    ck_assert_int_eq(tern_tp_get(p->client, lmr, 0, 8, rkey, 0, 1), 0);
    ck_assert_int_eq(done(p, true, 5000).status, 0);
    for (int i = 0; i < 200; i++) {
        tp_next(p->b, &ev, 1);      /* the owner answers the map request */
        ck_assert_int_eq(tern_tp_get(p->client, lmr, 0, 8, rkey, 0, 2), 0);
        if (tp_next(p->a, &ev, 20)) {
            ck_assert_int_eq(ev.status, 0);
            return;
        }
        ck_assert_int_eq(done(p, true, 5000).status, 0);
    }
    ck_abort_msg("the region was never mapped");
}

START_TEST(put_and_get_without_the_owner)
{
    struct tp_pair p;
    struct tern_tp_mr *remote, *local;
    struct tern_tp_rkey rkey;
    uint8_t *r, *l;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, REGION, TERN_TP_ACCESS_REMOTE_READ |
                                                      TERN_TP_ACCESS_REMOTE_WRITE, &remote), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
    rkey = tern_tp_mr_rkey(remote);
    r = tern_tp_mr_addr(remote);
    l = tern_tp_mr_addr(local);
    map_it(&p, local, &rkey);

    /* From here on the owner (b) is not polled once. */
    for (unsigned i = 0; i < 100; i++) {
        memset(l + i * 64, (int)i + 1, 64);
        ck_assert_int_eq(tern_tp_put(p.client, local, i * 64, 64, &rkey, 1000 + i * 64, 100 + i),
                         0);
        struct tern_tp_event ev = done(&p, false, 1000);

        ck_assert_int_eq(ev.type, TERN_TP_EV_PUT_DONE);
        ck_assert_int_eq(ev.status, 0);
        ck_assert_uint_eq(ev.token, 100 + i);
        ck_assert_uint_eq(r[1000 + i * 64], i + 1);
        ck_assert_uint_eq(r[1000 + i * 64 + 63], i + 1);
    }
    /* Several in flight complete in order. */
    for (unsigned i = 0; i < 8; i++)
        ck_assert_int_eq(tern_tp_put(p.client, local, 0, 4096, &rkey, i * 4096, 500 + i), 0);
    for (unsigned i = 0; i < 8; i++)
        ck_assert_uint_eq(done(&p, false, 1000).token, 500 + i);

    memset(r + REGION - 4096, 0xab, 4096);
    ck_assert_int_eq(tern_tp_get(p.client, local, 8192, 4096, &rkey, REGION - 4096, 7), 0);
    ck_assert_int_eq(done(&p, false, 1000).status, 0);
    for (unsigned i = 0; i < 4096; i++)
        ck_assert_uint_eq(l[8192 + i], 0xab);

    tern_tp_mr_dereg(local);
    tern_tp_mr_dereg(remote);
    tp_pair_close(&p);
}
END_TEST

/* What the owner did not grant is refused, with the owner's poll as the
 * judge: writes to a read-only region, accesses past the end, and any
 * access after deregistration. */
START_TEST(refusals_are_served)
{
    struct tp_pair p;
    struct tern_tp_mr *ro, *rw, *local;
    struct tern_tp_rkey rok, rwk;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, REGION, TERN_TP_ACCESS_REMOTE_READ, &ro), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, REGION, TERN_TP_ACCESS_REMOTE_READ |
                                                      TERN_TP_ACCESS_REMOTE_WRITE, &rw), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
    rok = tern_tp_mr_rkey(ro);
    rwk = tern_tp_mr_rkey(rw);
    map_it(&p, local, &rok);
    map_it(&p, local, &rwk);
    memset(tern_tp_mr_addr(ro), 0x5a, 64);

    /* Read-only: reads are direct, a write is refused and changes nothing. */
    ck_assert_int_eq(tern_tp_get(p.client, local, 0, 64, &rok, 0, 1), 0);
    ck_assert_int_eq(done(&p, false, 1000).status, 0);
    memset(tern_tp_mr_addr(local), 0x11, 64);
    ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rok, 0, 2), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);
    ck_assert_uint_eq(((uint8_t *)tern_tp_mr_addr(ro))[0], 0x5a);

    /* Past the end of a mapped region. */
    ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rwk, REGION - 32, 3), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);

    /* Deregistered: the next access learns it and is refused. */
    ck_assert_int_eq(tern_tp_mr_dereg(rw), 0);
    ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rwk, 0, 4), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);
    ck_assert_int_eq(tern_tp_get(p.client, local, 0, 64, &rwk, 0, 5), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);

    tern_tp_mr_dereg(local);
    tern_tp_mr_dereg(ro);
    tp_pair_close(&p);
}
END_TEST

/* Memory the application registered itself is not shareable: every
 * operation on it is served by the owner's poll, and works. */
START_TEST(registered_memory_stays_served)
{
    struct tp_pair p;
    static uint8_t mem[4096], buf[4096];
    struct tern_tp_mr *remote, *local;
    struct tern_tp_rkey rkey;
    struct tern_tp_event ev;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_reg(p.b, mem, sizeof(mem), TERN_TP_ACCESS_REMOTE_READ |
                                                              TERN_TP_ACCESS_REMOTE_WRITE, &remote),
                     0);
    ck_assert_int_eq(tern_tp_mr_reg(p.a, buf, sizeof(buf), 0, &local), 0);
    rkey = tern_tp_mr_rkey(remote);
    for (int i = 0; i < 5; i++) {
        buf[0] = (uint8_t)(i + 1);
        ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rkey, 0, (uint64_t)i), 0);
        /* The owner does not poll: nothing completes. */
        ck_assert(!tp_next(p.a, &ev, 30));
        ck_assert_int_eq(done(&p, true, 5000).status, 0);
        ck_assert_uint_eq(mem[0], i + 1);
    }
    tp_pair_close(&p);
}
END_TEST

Suite *suite_shm_direct(void)
{
    Suite *s = suite_create("shm_direct");
    TCase *tc = tcase_create("direct");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, put_and_get_without_the_owner);
    tcase_add_test(tc, refusals_are_served);
    tcase_add_test(tc, registered_memory_stays_served);
    suite_add_tcase(s, tc);
    return s;
}
