/* rpc: replies held for a hold hook (tern_req_hold), a service's group
 * commit: every held reply leaves only after the hook ran, once for the
 * batch; replies after a held one in the same poll wait too; a failing
 * hook turns them into TERN_EIO; a session that goes meanwhile loses its
 * replies, nobody else's. And gates (tern_req_gate): replies held over
 * many polls until their ticket passes, in ticket order. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "rpc_fixture.h"

#define HSVC 21
enum { HM_WRITE = 0, HM_READ = 1 };

static int writes, durable, hooks_run, hook_fail;
static int replied_before_durable;

/* A write: counted now, "durable" when the hook runs. */
static int h_write(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint32_t *out;

    (void)ctx;
    tern_req_hold(req);
    writes++;
    out = tern_reply_alloc(req, sizeof(*out));
    if (!out)
        return TERN_EMSGSIZE;
    *out = (uint32_t)writes;     /* the write's number */
    (void)data;
    (void)len;
    return 0;
}

/* A read after writes of the same poll: sees them (so must wait too). */
static int h_read(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint32_t *out = tern_reply_alloc(req, sizeof(*out));

    (void)ctx;
    (void)data;
    (void)len;
    if (!out)
        return TERN_EMSGSIZE;
    *out = (uint32_t)writes;
    return 0;
}

static const struct tern_method hmethods[] = {
    {HM_WRITE, "write", h_write, 0},
    {HM_READ, "read", h_read, 0},
};
static const struct tern_service hold_service = {"hold", HSVC, hmethods, 2, NULL, NULL};

static int hook(void *arg)
{
    (void)arg;
    hooks_run++;
    if (hook_fail)
        return TERN_EIO;
    durable = writes;
    return 0;
}

struct hrec {
    int status;
    uint32_t seen;
    bool done;
};
static int hdone;

static void on_reply(void *arg, int status, const void *reply, size_t len)
{
    struct hrec *r = arg;

    r->status = status;
    if (status == 0 && len == sizeof(r->seen))
        memcpy(&r->seen, reply, sizeof(r->seen));
    /* In-process: the server's state is ours to look at. A reply that
     * shows (or made) a write that is not durable yet came too early. */
    if (status == 0 && r->seen > (uint32_t)durable)
        replied_before_durable++;
    r->done = true;
    hdone++;
}

static void hold_setup(void)
{
    pair_open(NULL, NULL);
    ck_assert_int_eq(tern_rpc_register(srv, &hold_service), 0);
    writes = durable = hooks_run = hook_fail = replied_before_durable = hdone = 0;
}

START_TEST(held_replies_wait_for_the_hook)
{
    enum { N = 24 };
    static struct hrec r[N];

    ck_assert_int_eq(tern_rpc_add_hold_hook(srv, hook, NULL), 0);
    /* Writes and reads mixed, all in flight at once: the server reads them
     * in a few polls, so the hook runs far fewer times than there are
     * writes, and no reply shows a write before it is durable. */
    for (int i = 0; i < N; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        ck_assert_int_eq(tern_call(sess, HSVC, i % 3 == 2 ? HM_READ : HM_WRITE, "x", 1, 0,
                                   on_reply, &r[i], NULL), 0);
    }
    ck_assert_msg(poll_until(&hdone, N, WAIT_MS), "%d of %d replies", hdone, N);
    for (int i = 0; i < N; i++)
        ck_assert_msg(r[i].status == 0, "call %d: %s", i, tern_err_name(r[i].status));
    ck_assert_int_eq(replied_before_durable, 0);
    ck_assert_int_eq(durable, writes);
    ck_assert_int_ge(hooks_run, 1);
    ck_assert_msg(hooks_run < writes, "the hook ran %d times for %d writes: no batching",
                  hooks_run, writes);
}
END_TEST

START_TEST(failed_hook_fails_held_replies)
{
    static struct hrec w, rd;

    ck_assert_int_eq(tern_rpc_add_hold_hook(srv, hook, NULL), 0);
    hook_fail = 1;
    ck_assert_int_eq(tern_call(sess, HSVC, HM_WRITE, "x", 1, 0, on_reply, &w, NULL), 0);
    ck_assert_int_eq(tern_call(sess, HSVC, HM_READ, "x", 1, 0, on_reply, &rd, NULL), 0);
    ck_assert(poll_until(&hdone, 2, WAIT_MS));
    ck_assert_int_eq(w.status, TERN_EIO);
    /* The read came in the same poll after the write, or in a later one:
     * held and failed with it, or answered on its own. */
    ck_assert(rd.status == TERN_EIO || rd.status == 0);
    hook_fail = 0;
    memset(&w, 0, sizeof(w));
    ck_assert_int_eq(tern_call(sess, HSVC, HM_WRITE, "x", 1, 0, on_reply, &w, NULL), 0);
    ck_assert(poll_until(&hdone, 3, WAIT_MS));
    ck_assert_int_eq(w.status, 0);
}
END_TEST

/* Without a hook, tern_req_hold does nothing: replies go at once. */
START_TEST(hold_without_hook_is_plain)
{
    static struct hrec w;

    ck_assert_int_eq(tern_call(sess, HSVC, HM_WRITE, "x", 1, 0, on_reply, &w, NULL), 0);
    ck_assert(poll_until(&hdone, 1, WAIT_MS));
    ck_assert_int_eq(w.status, 0);
    ck_assert_int_eq(hooks_run, 0);
    ck_assert_int_eq(tern_rpc_add_hold_hook(srv, NULL, NULL), TERN_EINVAL);
    static int args[8];

    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(tern_rpc_add_hold_hook(srv, hook, &args[i]), 0);
    ck_assert_int_eq(tern_rpc_add_hold_hook(srv, hook, NULL), TERN_ENOSPC);
    tern_rpc_remove_hold_hook(srv, hook, &args[3]);
    ck_assert_int_eq(tern_rpc_add_hold_hook(srv, hook, NULL), 0);
}
END_TEST

/* ---- gates ---- */

#define GSVC 22
static struct tern_rpc_gate *gate;
static uint64_t next_ticket;

/* A write whose reply waits for its ticket (say, for its backups). */
static int g_write(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint32_t *out = tern_reply_alloc(req, sizeof(*out));

    (void)ctx;
    (void)data;
    (void)len;
    if (!out)
        return TERN_EMSGSIZE;
    *out = (uint32_t)++next_ticket;
    tern_req_gate(req, gate, next_ticket);
    return 0;
}

/* An error is gated too: it must not overtake the replies before it. */
static int g_fail(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    (void)ctx;
    (void)data;
    (void)len;
    tern_req_gate(req, gate, ++next_ticket);
    return TERN_ENOSPC;
}

static const struct tern_method gmethods[] = {
    {0, "write", g_write, 0},
    {1, "fail", g_fail, 0},
};
static const struct tern_service gate_service = {"gate", GSVC, gmethods, 2, NULL, NULL};

static void gate_setup(void)
{
    hold_setup();
    ck_assert_int_eq(tern_rpc_register(srv, &gate_service), 0);
    ck_assert_int_eq(tern_rpc_gate_open(srv, &gate), 0);
    next_ticket = 0;
}

static void gate_teardown(void)
{
    tern_rpc_gate_close(gate);
    gate = NULL;
    pair_close();
}

START_TEST(gated_replies_wait_for_their_ticket)
{
    enum { N = 24 };    /* under the session's 32 credits: all reach the server */
    static struct hrec r[N];
    uint64_t low = 99;

    for (int i = 0; i < N; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        ck_assert_int_eq(tern_call(sess, GSVC, i == 7 ? 1 : 0, "x", 1, 0, on_reply, &r[i],
                                   NULL), 0);
    }
    /* Served, none answered, however long we poll. */
    poll_for(100);
    ck_assert_int_eq(hdone, 0);
    ck_assert_uint_eq(tern_rpc_gate_waiting(gate, &low), N);
    ck_assert_uint_eq(low, 1);
    /* Up to 10: exactly those ten, in order, the error among them. */
    tern_rpc_gate_pass(gate, 10);
    ck_assert(poll_until(&hdone, 10, WAIT_MS));
    poll_for(50);
    ck_assert_int_eq(hdone, 10);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(r[i].status, i == 7 ? TERN_ENOSPC : 0);
        if (i != 7)
            ck_assert_uint_eq(r[i].seen, (uint32_t)i + 1);
    }
    ck_assert_uint_eq(tern_rpc_gate_waiting(gate, &low), N - 10);
    ck_assert_uint_eq(low, 11);
    /* More work while some wait: tickets keep their order. */
    static struct hrec more;
    ck_assert_int_eq(tern_call(sess, GSVC, 0, "x", 1, 0, on_reply, &more, NULL), 0);
    poll_for(50);
    tern_rpc_gate_pass(gate, 20);
    ck_assert(poll_until(&hdone, 20, WAIT_MS));
    ck_assert(!more.done);
    /* Losing the office: the rest fail, none is left behind. */
    tern_rpc_gate_fail(gate, TERN_ENOTPRIMARY);
    ck_assert(poll_until(&hdone, N + 1, WAIT_MS));
    for (int i = 20; i < N; i++)
        ck_assert_int_eq(r[i].status, TERN_ENOTPRIMARY);
    ck_assert_int_eq(more.status, TERN_ENOTPRIMARY);
    ck_assert_uint_eq(tern_rpc_gate_waiting(gate, NULL), 0);
}
END_TEST

/* A client that goes while its replies wait takes nothing with it but its
 * own: the gate still passes the others', and closing the gate with replies
 * in it answers them (TERN_ESHUTDOWN). */
START_TEST(gate_survives_a_client_leaving)
{
    static struct hrec mine, theirs, late;
    struct tern_session *s2;

    ck_assert_int_eq(connect_inproc(cli, uri, &s2), 0);
    ck_assert_int_eq(tern_call(s2, GSVC, 0, "x", 1, 0, on_reply, &theirs, NULL), 0);
    ck_assert_int_eq(tern_call(sess, GSVC, 0, "x", 1, 0, on_reply, &mine, NULL), 0);
    poll_for(50);
    ck_assert_uint_eq(tern_rpc_gate_waiting(gate, NULL), 2);
    tern_rpc_disconnect(s2);
    poll_for(50);
    tern_rpc_gate_pass(gate, UINT64_MAX);
    ck_assert(poll_until(&hdone, 2, WAIT_MS));
    ck_assert_int_eq(mine.status, 0);
    ck_assert_int_eq(tern_call(sess, GSVC, 0, "x", 1, 0, on_reply, &late, NULL), 0);
    poll_for(50);
    tern_rpc_gate_close(gate);
    gate = NULL;
    ck_assert(poll_until(&hdone, 3, WAIT_MS));
    ck_assert_int_eq(late.status, TERN_ESHUTDOWN);
}
END_TEST

TCase *rpc_hold_tcase(void);
TCase *rpc_hold_tcase(void)
{
    TCase *tc = tcase_create("hold");

    tcase_add_checked_fixture(tc, hold_setup, pair_close);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, held_replies_wait_for_the_hook);
    tcase_add_test(tc, failed_hook_fails_held_replies);
    tcase_add_test(tc, hold_without_hook_is_plain);
    return tc;
}

TCase *rpc_gate_tcase(void);
TCase *rpc_gate_tcase(void)
{
    TCase *tc = tcase_create("gate");

    tcase_add_checked_fixture(tc, gate_setup, gate_teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, gated_replies_wait_for_their_ticket);
    tcase_add_test(tc, gate_survives_a_client_leaving);
    return tc;
}
