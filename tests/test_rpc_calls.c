/* rpc: many calls at once and what bounds them. Credits, call slots and
 * max_calls; requests gathered from pieces (tern_callv) and their limits;
 * the largest reply a handler may build (tern_reply_max).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "rpc_fixture.h"
#include "rpc_internal.h"

/* ---- many calls, credits, slots ---- */

START_TEST(many_async_calls_with_8_credits)
{
    enum { N = 500 };
    static uint32_t req[N];
    static struct rec r[N];
    struct tern_rpc_config scfg = {.max_msg = MAX_MSG, .credits = 8};

    pair_open(&scfg, NULL);
    ck_assert_uint_eq(tern_session_credits(sess), 8);
    total_runs = 0;
    for (int i = 0; i < N; i++) {
        int rc;

        req[i] = 0xC0DE0000u + (uint32_t)i;
        rec_init(&r[i], sizeof(uint32_t));
        rc = tern_call(sess, SVC, M_ECHO, &req[i], sizeof(req[i]), 0, rec_cont, &r[i], NULL);
        ck_assert_msg(rc == 0, "call %d: %s", i, tern_strerror(rc));
    }
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), N);
    ck_assert_msg(poll_until(&total_runs, N, 20000), "only %d of %d calls completed",
                  total_runs, N);
    poll_for(50);       /* nothing may complete twice */
    ck_assert_int_eq(total_runs, N);
    for (int i = 0; i < N; i++) {
        uint32_t got;

        ck_assert_msg(r[i].runs == 1, "call %d ran %d times", i, r[i].runs);
        ck_assert_msg(r[i].status == 0, "call %d: %s", i, tern_err_name(r[i].status));
        ck_assert_uint_eq(r[i].len, sizeof(got));
        memcpy(&got, r[i].buf, sizeof(got));
        ck_assert_msg(got == req[i], "call %d got the reply of another call", i);
        free(r[i].buf);
    }
    ck_assert_int_eq(server_runs, N);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    pair_close();
}
END_TEST

START_TEST(client_credits_cap_server_grant)
{
    /* The client asks for 4, the server would give 32: 4 it is. */
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .credits = 4};

    pair_open(NULL, &ccfg);
    ck_assert_uint_eq(tern_session_credits(sess), 4);
    expect_echo(4);
    pair_close();
}
END_TEST

START_TEST(no_call_slots)
{
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .max_calls = 4, .credits = 4};
    struct rec r[6];
    int rc;

    pair_open(NULL, &ccfg);
    total_runs = 0;
    for (int i = 0; i < 4; i++) {
        rec_init(&r[i], 0);
        rc = tern_call(sess, SVC, M_ECHO, "abc", 3, 0, rec_cont, &r[i], NULL);
        ck_assert_msg(rc == 0, "call %d: %s", i, tern_strerror(rc));
    }
    rec_init(&r[4], 0);
    rc = tern_call(sess, SVC, M_ECHO, "abc", 3, 0, rec_cont, &r[4], NULL);
    ck_assert_msg(rc == TERN_ENOBUFS, "fifth call: %s, want TERN_ENOBUFS", tern_err_name(rc));
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 4);
    ck_assert(poll_until(&total_runs, 4, WAIT_MS));
    poll_for(20);
    ck_assert_int_eq(r[4].runs, 0);
    ck_assert_int_eq(total_runs, 4);
    /* The slots came back. */
    rec_init(&r[5], 0);
    rc = tern_call(sess, SVC, M_ECHO, "abc", 3, 0, rec_cont, &r[5], NULL);
    ck_assert_msg(rc == 0, "call after completions: %s", tern_strerror(rc));
    ck_assert(poll_until(&r[5].runs, 1, WAIT_MS));
    ck_assert_int_eq(r[5].status, 0);
    pair_close();
}
END_TEST

START_TEST(max_calls_below_default_credits)
{
    /* Only max_calls is set; credits is left at its default (0 = 32), which
     * is more than 4. A configuration that only lowers the number of slots
     * should be accepted, with the credits defaulting to what fits. */
    struct tern_rpc_config cfg = {.max_calls = 4};
    struct tern_rpc_ep *ep = NULL;
    int rc = tern_rpc_open(&cfg, &ep);

    ck_assert_msg(rc == 0, "max_calls=4 with default credits refused: %s", tern_err_name(rc));
    tern_rpc_close(ep);
}
END_TEST

/* ---- gathered requests (tern_callv) ---- */

/* Pieces for tern_callv: `n` iovecs over separate buffers, each with its
 * own byte pattern, and the request the handler should see (their
 * concatenation) in `want`. A length of 0 with `null_empty` gives the piece
 * a NULL base, which is allowed for an empty piece. */
struct gather {
    struct iovec iov[TERN_CALL_IOV_MAX + 1];
    uint8_t *bufs[TERN_CALL_IOV_MAX + 1];
    unsigned n;
    uint8_t *want;
    size_t len;
};

static void gather_make(struct gather *g, unsigned n, const size_t *lens, bool null_empty,
                        uint8_t seed)
{
    size_t at = 0;

    ck_assert(n <= TERN_CALL_IOV_MAX + 1);
    *g = (struct gather){.n = n};
    for (unsigned i = 0; i < n; i++)
        g->len += lens[i];
    g->want = malloc(g->len ? g->len : 1);
    ck_assert(g->want);
    for (unsigned i = 0; i < n; i++) {
        if (!lens[i] && null_empty) {
            g->iov[i] = (struct iovec){.iov_base = NULL, .iov_len = 0};
            continue;
        }
        g->bufs[i] = malloc(lens[i] ? lens[i] : 1);
        ck_assert(g->bufs[i]);
        for (size_t j = 0; j < lens[i]; j++)
            g->bufs[i][j] = (uint8_t)(seed + 61 * i + 7 * j + (j >> 8));
        memcpy(g->want + at, g->bufs[i], lens[i]);
        at += lens[i];
        g->iov[i] = (struct iovec){.iov_base = g->bufs[i], .iov_len = lens[i]};
    }
}

static void gather_free(struct gather *g)
{
    for (unsigned i = 0; i < TERN_CALL_IOV_MAX + 1; i++)
        free(g->bufs[i]);
    free(g->want);
}

/* The echo of a gathered request is the concatenation, byte for byte. */
static void expect_gathered(const struct rec *r, const struct gather *g, const char *what)
{
    ck_assert_msg(r->runs == 1, "%s: continuation ran %d times", what, r->runs);
    ck_assert_msg(r->status == 0, "%s: %s", what, tern_err_name(r->status));
    ck_assert_msg(r->len == g->len, "%s: handler got %zu bytes, want %zu", what, r->len,
                  g->len);
    if (g->len)
        ck_assert_msg(memcmp(r->buf, g->want, g->len) == 0,
                      "%s: the request is not the concatenation of its pieces", what);
}

START_TEST(callv_gathers_pieces)
{
    static const struct {
        unsigned n;
        size_t lens[TERN_CALL_IOV_MAX];
        bool null_empty;
    } cases[] = {
        {0, {0}, false},                /* no pieces: an empty request */
        {1, {5}, false},
        {1, {0}, true},                 /* one empty piece with no buffer */
        {2, {3, 200}, false},
        {2, {4096, 1}, false},
        {3, {0, 17, 1}, false},         /* an empty piece with a buffer */
        {3, {9, 0, 9}, true},           /* ... and one without, in the middle */
        {4, {64, 0, 1, 100}, true},
        {4, {1, 2, 3, 4}, false},
        {4, {0, 0, 0, 0}, false},
        {4, {1000, 3000, 5, 20000}, false},
    };
    const unsigned n_cases = sizeof(cases) / sizeof(cases[0]);

    for (unsigned i = 0; i < n_cases; i++) {
        struct gather g;
        struct rec r;
        char what[32];
        int rc;

        snprintf(what, sizeof(what), "case %u (%u pieces)", i, cases[i].n);
        gather_make(&g, cases[i].n, cases[i].lens, cases[i].null_empty, (uint8_t)(i * 13));
        rec_init(&r, g.len + 1);
        rc = tern_callv(sess, SVC, M_ECHO, g.n ? g.iov : NULL, g.n, 0, rec_cont, &r, NULL);
        ck_assert_msg(rc == 0, "%s: tern_callv: %s", what, tern_err_name(rc));
        ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "%s: never completed", what);
        expect_gathered(&r, &g, what);
        free(r.buf);
        gather_free(&g);
    }
    ck_assert_int_eq(server_runs, (int)n_cases);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
}
END_TEST

/* A refused tern_callv: nothing reaches the server and no continuation runs. */
static void expect_callv_refused(const struct iovec *iov, unsigned n, int want, const char *what)
{
    int runs = server_runs;
    struct rec r;
    int rc;

    rec_init(&r, 0);
    rc = tern_callv(sess, SVC, M_ECHO, iov, n, 0, rec_cont, &r, NULL);
    ck_assert_msg(rc == want, "%s: got %s, want %s", what, tern_err_name(rc),
                  tern_err_name(want));
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), 0);
    poll_for(50);
    ck_assert_msg(r.runs == 0, "%s: a refused call ran its continuation", what);
    ck_assert_msg(server_runs == runs, "%s: the server ran a refused call", what);
}

START_TEST(callv_limits)
{
    /* Pieces that add up to exactly the limit go through; one byte more is
     * TERN_EMSGSIZE; one piece more than TERN_CALL_IOV_MAX is TERN_EINVAL. */
    const size_t q = MAX_MSG / TERN_CALL_IOV_MAX;
    const size_t exact[TERN_CALL_IOV_MAX] = {q, q, q, MAX_MSG - 3 * q};
    const size_t over[TERN_CALL_IOV_MAX] = {q, q + 1, q, MAX_MSG - 3 * q};
    const size_t five[TERN_CALL_IOV_MAX + 1] = {1, 1, 1, 1, 1};
    struct gather g;
    struct iovec bad;
    struct rec r;

    _Static_assert(TERN_CALL_IOV_MAX == 4, "the tables above have 4 pieces");
    gather_make(&g, TERN_CALL_IOV_MAX + 1, five, false, 1);
    expect_callv_refused(g.iov, TERN_CALL_IOV_MAX + 1, TERN_EINVAL, "5 pieces");
    expect_callv_refused(g.iov, UINT32_MAX, TERN_EINVAL, "UINT_MAX pieces");
    gather_free(&g);

    gather_make(&g, TERN_CALL_IOV_MAX, over, false, 2);
    ck_assert_uint_eq(g.len, MAX_MSG + 1);
    expect_callv_refused(g.iov, g.n, TERN_EMSGSIZE, "max_msg + 1 bytes");
    gather_free(&g);

    /* Lengths whose sum wraps to 1: refused, never copied. */
    static char byte[2];
    struct iovec wrap[2] = {{.iov_base = byte, .iov_len = SIZE_MAX},
                            {.iov_base = byte, .iov_len = 2}};
    expect_callv_refused(wrap, 2, TERN_EMSGSIZE, "lengths that wrap around");

    expect_callv_refused(NULL, 2, TERN_EINVAL, "NULL iov with 2 pieces");
    bad = (struct iovec){.iov_base = NULL, .iov_len = 3};
    expect_callv_refused(&bad, 1, TERN_EINVAL, "a 3-byte piece with no buffer");

    gather_make(&g, TERN_CALL_IOV_MAX, exact, false, 3);
    ck_assert_uint_eq(g.len, MAX_MSG);
    rec_init(&r, g.len + 1);
    ck_assert_int_eq(tern_callv(sess, SVC, M_ECHO, g.iov, g.n, 0, rec_cont, &r, NULL), 0);
    ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "max_msg in 4 pieces never completed");
    expect_gathered(&r, &g, "max_msg in 4 pieces");
    free(r.buf);
    gather_free(&g);

    ck_assert_int_eq(server_runs, 1);
    expect_echo(8);     /* the session is unharmed */
    ck_assert_int_eq(tern_session_status(sess), 0);
}
END_TEST

START_TEST(callv_over_server_max_msg)
{
    /* The server takes 4 KiB (HELLO_ACK), the client 64 KiB: gathered
     * requests are held to the smaller limit at tern_callv. */
    struct tern_rpc_config scfg = {.max_msg = 4096};
    const size_t exact[TERN_CALL_IOV_MAX] = {1024, 1024, 1024, 1024};
    const size_t over[TERN_CALL_IOV_MAX] = {1024, 1024, 1025, 1024};
    struct gather g;
    struct rec r;

    pair_open(&scfg, NULL);
    gather_make(&g, TERN_CALL_IOV_MAX, over, false, 4);
    expect_callv_refused(g.iov, g.n, TERN_EMSGSIZE, "4097 bytes to a 4 KiB server");
    gather_free(&g);

    gather_make(&g, TERN_CALL_IOV_MAX, exact, false, 5);
    rec_init(&r, g.len + 1);
    ck_assert_int_eq(tern_callv(sess, SVC, M_ECHO, g.iov, g.n, 0, rec_cont, &r, NULL), 0);
    ck_assert_msg(poll_until(&r.runs, 1, WAIT_MS), "4096 bytes never completed");
    expect_gathered(&r, &g, "4096 bytes to a 4 KiB server");
    free(r.buf);
    gather_free(&g);
    ck_assert_int_eq(tern_session_status(sess), 0);
    pair_close();
}
END_TEST

START_TEST(callv_queued_keeps_pieces)
{
    /* With one credit, gathered calls wait in the queue and are copied into
     * the send buffer later. Only the pieces must outlive the call (the KV
     * client passes an iovec array on its stack): the array is reused for
     * every call and wiped before any of them is sent. */
    enum { N = 6 };
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .credits = 1};
    const size_t lens[N][TERN_CALL_IOV_MAX] = {
        {100, 2, 0, 7}, {1, 1, 1, 1}, {0, 300, 0, 5}, {4000, 1, 2, 3}, {9, 8, 7, 6}, {0, 0, 0, 1},
    };
    struct gather g[N];
    struct rec r[N];
    struct iovec shared[TERN_CALL_IOV_MAX];

    pair_open(NULL, &ccfg);
    ck_assert_uint_eq(tern_session_credits(sess), 1);
    for (int i = 0; i < N; i++) {
        gather_make(&g[i], TERN_CALL_IOV_MAX, lens[i], true, (uint8_t)(40 + i));
        rec_init(&r[i], g[i].len + 1);
        memcpy(shared, g[i].iov, sizeof(shared));
        ck_assert_int_eq(tern_callv(sess, SVC, M_ECHO, shared, TERN_CALL_IOV_MAX, 0, rec_cont,
                                    &r[i], NULL),
                         0);
        memset(shared, 0xEE, sizeof(shared));   /* garbage if tern_callv kept a pointer */
    }
    ck_assert_msg(server_runs == 0, "the server ran calls nobody polled it for");
    ck_assert_uint_eq(tern_rpc_calls_in_flight(cli), N);
    total_runs = 0;
    ck_assert_msg(poll_until(&total_runs, N, WAIT_MS), "queued gathered calls never completed");
    for (int i = 0; i < N; i++) {
        char what[32];

        snprintf(what, sizeof(what), "queued call %d", i);
        expect_gathered(&r[i], &g[i], what);
        free(r[i].buf);
        gather_free(&g[i]);
    }
    ck_assert_int_eq(server_runs, N);
    pair_close();
}
END_TEST

/* ---- the largest reply (tern_reply_max) ---- */

#define SVC_LIMITS 30
enum {
    ML_MAX = 0,     /* reply = tern_reply_max() as a uint64_t */
    ML_FILL = 1,    /* request: int32 delta; reply: tern_reply_max() + delta bytes */
};

static int fill_refused;    /* ML_FILL calls whose tern_reply_alloc gave NULL */

static uint8_t fill_byte(size_t i)
{
    return (uint8_t)(i * 131 + (i >> 10) + 1);
}

static int h_reply_max(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint64_t m = tern_reply_max(req);
    void *out = tern_reply_alloc(req, sizeof(m));

    server_runs++;
    if (!out)
        return TERN_ENOMEM;
    memcpy(out, &m, sizeof(m));
    return 0;
}

static int h_fill(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    int32_t delta;
    size_t n;
    uint8_t *out;

    server_runs++;
    if (len != sizeof(delta))
        return TERN_EINVAL;
    memcpy(&delta, data, sizeof(delta));
    n = tern_reply_max(req) + (size_t)(ptrdiff_t)delta;
    out = tern_reply_alloc(req, n);
    if (!out) {
        fill_refused++;
        return TERN_EMSGSIZE;   /* what rpc.h says a handler does then */
    }
    for (size_t i = 0; i < n; i++)
        out[i] = fill_byte(i);
    return 0;
}

static const struct tern_method limit_methods[] = {
    {.id = ML_MAX, .name = "reply_max", .handler = h_reply_max},
    {.id = ML_FILL, .name = "fill", .handler = h_fill},
};

static const struct tern_service limit_service = {
    .name = "limits", .id = SVC_LIMITS, .methods = limit_methods,
    .n_methods = sizeof(limit_methods) / sizeof(limit_methods[0]),
};

/* A reply of tern_reply_max() + delta bytes: its status, and the payload
 * checked when it came. */
static int fill_call(int32_t delta, size_t max)
{
    size_t want = max + (size_t)(ptrdiff_t)delta;
    struct rec r;
    int status;

    rec_init(&r, want + 1);
    call_wait(SVC_LIMITS, ML_FILL, &delta, sizeof(delta), 0, &r);
    status = r.status;
    if (status == 0) {
        ck_assert_msg(r.len == want, "delta %d: reply of %zu bytes, want %zu", delta, r.len,
                      want);
        for (size_t i = 0; i < want; i++)
            if (r.buf[i] != fill_byte(i))
                ck_abort_msg("delta %d: reply byte %zu differs", delta, i);
    } else {
        ck_assert_msg(r.reply_null && r.len == 0, "delta %d: an error came with a reply",
                      delta);
    }
    free(r.buf);
    return status;
}

/* Server max_msg, client max_msg (0: the 1 MiB default), and what
 * tern_reply_max() must say: the smaller of the two. */
static const struct {
    size_t srv, cli, want;
} reply_max_cases[] = {
    {MAX_MSG, MAX_MSG, MAX_MSG},
    {MAX_MSG, 4096, 4096},          /* the client's HELLO lowers it */
    {4096, MAX_MSG, 4096},          /* the server's own limit */
    {0, 0, 1u << 20},               /* both default */
    {0, 100000, 100000},
};

START_TEST(reply_max_limits)
{
    struct tern_rpc_config scfg = {.max_msg = reply_max_cases[_i].srv};
    struct tern_rpc_config ccfg = {.max_msg = reply_max_cases[_i].cli};
    size_t want = reply_max_cases[_i].want;
    uint64_t seen = 0;
    struct rec r;
    int rc;

    pair_open(&scfg, &ccfg);
    ck_assert_int_eq(tern_rpc_register(srv, &limit_service), 0);
    fill_refused = 0;

    rec_init(&r, sizeof(seen));
    call_wait(SVC_LIMITS, ML_MAX, NULL, 0, 0, &r);
    ck_assert_msg(r.status == 0 && r.len == sizeof(seen), "reply_max: %s",
                  tern_err_name(r.status));
    memcpy(&seen, r.buf, sizeof(seen));
    free(r.buf);
    ck_assert_msg(seen == want, "server %zu, client %zu: tern_reply_max %llu, want %zu",
                  reply_max_cases[_i].srv, reply_max_cases[_i].cli, (unsigned long long)seen,
                  want);

    /* Exactly the maximum goes through; one byte more is refused by
     * tern_reply_alloc and the call (only it) fails with TERN_EMSGSIZE. */
    rc = fill_call(0, want);
    ck_assert_msg(rc == 0, "a reply of tern_reply_max() bytes: %s", tern_err_name(rc));
    ck_assert_int_eq(fill_refused, 0);
    rc = fill_call(1, want);
    ck_assert_msg(rc == TERN_EMSGSIZE, "a reply one byte over tern_reply_max(): %s",
                  tern_err_name(rc));
    ck_assert_msg(fill_refused == 1, "tern_reply_alloc gave one byte over the maximum");
    ck_assert_msg(tern_session_status(sess) == 0, "the session died (%s)",
                  tern_err_name(tern_session_status(sess)));

    /* The server goes on serving, at the limit too. */
    expect_echo(100);
    ck_assert_int_eq(fill_call(-1, want), 0);
    ck_assert_int_eq(fill_call(0, want), 0);
    ck_assert_int_eq(fill_refused, 1);
    ck_assert_int_eq(server_runs, 6);
    pair_close();
}
END_TEST

void rpc_add_calls(const struct rpc_cases *c)
{
    tcase_add_test(c->own, many_async_calls_with_8_credits);
    tcase_add_test(c->own, client_credits_cap_server_grant);
    tcase_add_test(c->own, no_call_slots);
    tcase_add_test(c->own, max_calls_below_default_credits);
    tcase_add_test(c->basic, callv_gathers_pieces);
    tcase_add_test(c->basic, callv_limits);
    tcase_add_test(c->own, callv_over_server_max_msg);
    tcase_add_test(c->own, callv_queued_keeps_pieces);
    tcase_add_loop_test(c->own, reply_max_limits, 0,
                        sizeof(reply_max_cases) / sizeof(reply_max_cases[0]));
}
