#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "tern_config.h"

static char rdma_listen[80] = "127.0.0.1:0", rdma_refused[80] = "127.0.0.1:1";

__attribute__((constructor)) static void rdma_addresses(void)
{
    snprintf(rdma_listen, sizeof(rdma_listen), "%s:0", test_rdma_ip());
    snprintf(rdma_refused, sizeof(rdma_refused), "%s:1", test_rdma_ip());
}

const struct fabric_case fabric_cases[] = {
    {"tcp", "127.0.0.1:0", "127.0.0.1:1", "no-port-here"},
    {"shm", "auto", "nobody-listens-here", "bad name!"},
    /* An emulated NTB device (a shared-memory file with both windows): the
     * same link rules as on PCIe, runnable anywhere. */
    {"ntb", "emu:auto", "emu:nobody-attached", "emu:bad name!"},
#if TERN_HAVE_RDMA
    /* RDMA verbs: a NIC if the host has one, else softverbs (the tests
     * then run the fabric's code against the emulated NIC). On a NIC the
     * address must be one of its own: TERN_RDMA_LOCAL_IP. */
    {"rdma", rdma_listen, rdma_refused, "no-port-here"},
#endif
};
const int n_fabric_cases = sizeof(fabric_cases) / sizeof(fabric_cases[0]);

double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

uint64_t test_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void test_pattern(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t j = 0; j < len; j++)
        p[j] = (uint8_t)((seed * 2654435761u + j * 31u) >> 3);
}

static uint64_t rng_state;

void test_rng_seed(uint64_t seed)
{
    rng_state = seed;
}

uint64_t test_rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

struct tern_tp_ep *tp_open(const char *fabric, size_t max_msg)
{
    struct tern_tp_config cfg = {.fabric = fabric, .max_msg = max_msg ? max_msg : 65536};
    struct tern_tp_ep *ep = NULL;
    int rc = tern_tp_open(&cfg, &ep);

    ck_assert_msg(rc == 0, "open %s: %s", fabric, tern_strerror(rc));
    return ep;
}

/* Events polled but not yet handed out, per endpoint. */
#define QCAP 256
static struct evq {
    struct tern_tp_ep *ep;
    struct tern_tp_event ev[QCAP];
    int head, n;
} queues[4];

static struct evq *queue_of(struct tern_tp_ep *ep)
{
    for (int i = 0; i < 4; i++)
        if (queues[i].ep == ep)
            return &queues[i];
    /* A free slot, else one whose endpoint has nothing queued (an endpoint
     * of an earlier test that is closed by now). */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 4; i++)
            if (!queues[i].ep || (pass && queues[i].n == 0)) {
                queues[i] = (struct evq){.ep = ep};
                return &queues[i];
            }
    ck_abort_msg("too many endpoints in one test");
    return NULL;
}

static void fill(struct evq *q)
{
    struct tern_tp_event ev[32];
    int room = QCAP - q->n, n;

    if (room <= 0)
        return;
    n = tern_tp_poll(q->ep, ev, room < 32 ? room : 32);
    ck_assert_int_ge(n, 0);
    for (int i = 0; i < n; i++)
        q->ev[(q->head + q->n++) % QCAP] = ev[i];
}

bool tp_next2(struct tern_tp_ep *ep, struct tern_tp_ep *other, struct tern_tp_event *out,
              int ms)
{
    struct evq *q = queue_of(ep), *o = other ? queue_of(other) : NULL;
    double end = now_ms() + ms;

    do {
        if (!q->n)
            fill(q);
        if (o)
            fill(o);
        if (q->n) {
            *out = q->ev[q->head];
            q->head = (q->head + 1) % QCAP;
            q->n--;
            return true;
        }
    } while (now_ms() < end);
    return false;
}

bool tp_next(struct tern_tp_ep *ep, struct tern_tp_event *out, int ms)
{
    return tp_next2(ep, NULL, out, ms);
}

static void env_for(const char *name, const char *value)
{
    if (value && *value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

void tp_pair_open_with(struct tp_pair *p, const struct fabric_case *fc, size_t max_msg,
                       const char *mw_a, const char *mw_b)
{
    struct tern_tp_event ev;
    int rc;

    memset(queues, 0, sizeof(queues));
    env_for("TERN_RDMA_MW", mw_a);
    p->a = tp_open(fc->fabric, max_msg);
    env_for("TERN_RDMA_MW", mw_b);
    p->b = tp_open(fc->fabric, max_msg);
    unsetenv("TERN_RDMA_MW");
    rc = tern_tp_listen(p->b, fc->listen, p->bound, sizeof(p->bound));
    ck_assert_msg(rc == 0, "listen: %s", tern_strerror(rc));
    rc = tern_tp_connect(p->a, p->bound, &p->client);
    ck_assert_msg(rc == 0, "connect: %s", tern_strerror(rc));
    ck_assert(tp_next2(p->b, p->a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_ACCEPTED);
    p->server = ev.conn;
    ck_assert(tp_next2(p->a, p->b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CONNECTED);
    ck_assert_int_eq(ev.status, 0);
    ck_assert_ptr_eq(ev.conn, p->client);
}

void tp_pair_open(struct tp_pair *p, const struct fabric_case *fc, size_t max_msg)
{
    const char *mw = getenv("TERN_RDMA_MW");
    char keep[8] = "";

    if (mw)
        snprintf(keep, sizeof(keep), "%s", mw);
    tp_pair_open_with(p, fc, max_msg, keep, keep);
}

struct tern_tp_rkey tp_pair_rkey(struct tp_pair *p, struct tern_tp_mr *rmr)
{
    struct tern_tp_rkey rk;
    struct tern_tp_event ev;
    int rc = tern_tp_conn_mr_rkey(p->server, rmr, &rk);

    ck_assert_msg(rc == 0, "rkey: %s", tern_strerror(rc));
    ck_assert_int_eq(tern_tp_msg_send(p->server, &rk, sizeof(rk)), 0);
    ck_assert_int_eq(tern_tp_flush(p->b), 0);
    ck_assert(tp_next2(p->a, p->b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    ck_assert_uint_eq(ev.len, sizeof(rk));
    memcpy(&rk, ev.data, sizeof(rk));
    tern_tp_msg_release(ev.conn, ev.data);
    return rk;
}

void tp_pair_close(struct tp_pair *p)
{
    tern_tp_close(p->a);
    tern_tp_close(p->b);
}
