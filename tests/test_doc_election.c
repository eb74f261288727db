/* The native document client while its replica set elects a primary
 * (doc_client.c): every replica refuses writes (NotWritablePrimary) for a
 * while. A sync call waits that out and is done once one answers, within
 * its deadline; past the deadline it ends with TERN_ENOTPRIMARY, or with
 * TERN_ENOTCONN when no replica was there at all. An async call ends after
 * its round of the replicas, and a client of one server does not wait.
 *
 * The replicas are stand-ins: endpoints of this process, each polled by a
 * thread of its own, serving the document service's id and answering as
 * a member that is, or is not yet, the primary. */
#include "tern_config.h"

#if TERN_HAVE_DOC_SERVICE

#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "doc.h"
#include "doc_wire.h"
#include "error.h"
#include "log.h"
#include "rpc.h"
#include "suites.h"

#define MS 1000000ull

struct member {
    struct tern_service svc;
    struct tern_rpc_ep *ep;
    char uri[128];
    pthread_t th;
    int stop;
    uint64_t primary_from;          /* tern_now_ns() it takes writes from; 0: never */
    unsigned refused, served;       /* writes, under __atomic */
    bool up;
};

static struct member members[2];
static struct tern_rpc_ep *cep;

static int reply_doc(struct tern_req *req, const bson_t *d)
{
    uint8_t *out = tern_reply_alloc(req, sizeof(struct doc_rep) + d->len);

    if (!out)
        return TERN_EMSGSIZE;
    memset(out, 0, sizeof(struct doc_rep));
    memcpy(out + sizeof(struct doc_rep), bson_get_data(d), d->len);
    return 0;
}

static int h_stats(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct doc_wire_stats *st = tern_reply_alloc(req, sizeof(*st));

    (void)data, (void)len, (void)ctx;
    if (!st)
        return TERN_EMSGSIZE;
    memset(st, 0, sizeof(*st));
    return 0;
}

/* hello answers as a member with no map; anything else is a write, taken
 * by the primary and refused before it is one. */
static int h_cmd(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct member *m = ctx;
    bson_t cmd, r = BSON_INITIALIZER;
    bson_iter_t it;
    int rc;

    if (len < sizeof(struct doc_req) + 5 ||
        !bson_init_static(&cmd, (const uint8_t *)data + sizeof(struct doc_req),
                          len - sizeof(struct doc_req)) ||
        !bson_iter_init(&it, &cmd) || !bson_iter_next(&it))
        return TERN_EPROTO;
    if (!strcmp(bson_iter_key(&it), "hello")) {
        BSON_APPEND_DOUBLE(&r, "ok", 1.0);
    } else if (m->primary_from && tern_now_ns() >= m->primary_from) {
        __atomic_add_fetch(&m->served, 1, __ATOMIC_RELAXED);
        BSON_APPEND_INT32(&r, "n", 1);
        BSON_APPEND_DOUBLE(&r, "ok", 1.0);
    } else {
        __atomic_add_fetch(&m->refused, 1, __ATOMIC_RELAXED);
        BSON_APPEND_DOUBLE(&r, "ok", 0.0);
        BSON_APPEND_INT32(&r, "code", 10107);
        BSON_APPEND_UTF8(&r, "codeName", "NotWritablePrimary");
        BSON_APPEND_UTF8(&r, "errmsg", "not primary");
    }
    rc = reply_doc(req, &r);
    bson_destroy(&r);
    return rc;
}

static const struct tern_method methods[] = {
    {.id = DOC_M_CMD, .name = "cmd", .handler = h_cmd},
    {.id = DOC_M_STATS, .name = "stats", .handler = h_stats},
};

static void *member_loop(void *arg)
{
    struct member *m = arg;

    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE))
        tern_rpc_poll(m->ep);
    return NULL;
}

/* Start member i (on its old port, if it had one), taking writes from
 * `primary_from` (0: never). */
static void member_start(unsigned i, uint64_t primary_from)
{
    struct member *m = &members[i];
    char listen[128];

    m->svc = (struct tern_service){.name = "doc", .id = TERN_DOC_SERVICE_ID,
                                   .methods = methods,
                                   .n_methods = sizeof(methods) / sizeof(methods[0]),
                                   .ctx = m};
    ck_assert_int_eq(tern_rpc_open(NULL, &m->ep), 0);
    ck_assert_int_eq(tern_rpc_register(m->ep, &m->svc), 0);
    snprintf(listen, sizeof(listen), "%s", m->uri[0] ? m->uri : "tcp://127.0.0.1:0");
    ck_assert_int_eq(tern_rpc_listen(m->ep, listen, m->uri, sizeof(m->uri)), 0);
    m->primary_from = primary_from;
    m->stop = 0;
    ck_assert_int_eq(pthread_create(&m->th, NULL, member_loop, m), 0);
    m->up = true;
}

static void member_stop(unsigned i)
{
    struct member *m = &members[i];

    if (!m->up)
        return;
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
    pthread_join(m->th, NULL);
    tern_rpc_close(m->ep);
    m->up = false;
}

static void setup(void)
{
    if (!getenv("TERN_LOG"))
        tern_log_set_level(TERN_LOG_ERROR);
    memset(members, 0, sizeof(members));
    ck_assert_int_eq(tern_rpc_open(NULL, &cep), 0);
}

static void teardown(void)
{
    tern_rpc_close(cep);
    member_stop(0);
    member_stop(1);
}

static struct tern_doc *open_client(unsigned n)
{
    const char *uris[2] = {members[0].uri, members[1].uri};
    struct tern_doc *doc;

    ck_assert_int_eq(tern_doc_open(cep, uris, n, 2000 * MS, &doc), 0);
    return doc;
}

static int insert(struct tern_doc *doc)
{
    bson_t d = BSON_INITIALIZER;
    int rc;

    BSON_APPEND_INT32(&d, "_id", 1);
    rc = tern_doc_insert_one(doc, "test", "c", &d);
    bson_destroy(&d);
    return rc;
}

/* With a deadline of 300 ms, an insert ends with `want` once it has
 * passed, and not long after. */
static void ends_at_deadline(struct tern_doc *doc, int want)
{
    uint64_t t0, took;

    tern_doc_set_timeout(doc, 300 * MS);
    t0 = tern_now_ns();
    ck_assert_int_eq(insert(doc), want);
    took = tern_now_ns() - t0;
    ck_assert_msg(took >= 250 * MS && took < 3000 * MS, "took %llu ms",
                  (unsigned long long)(took / MS));
}

static unsigned served(unsigned i)
{
    return __atomic_load_n(&members[i].served, __ATOMIC_RELAXED);
}

static unsigned refused(unsigned i)
{
    return __atomic_load_n(&members[i].refused, __ATOMIC_RELAXED);
}

/* Both refuse for 300 ms, then the second takes writes: the sync insert
 * is done, by it, once, after the election. */
START_TEST(sync_call_waits_out_an_election)
{
    struct tern_doc *doc;
    uint64_t t0;

    member_start(0, 0);
    member_start(1, tern_now_ns() + 300 * MS);
    doc = open_client(2);
    t0 = tern_now_ns();
    ck_assert_int_eq(insert(doc), 0);
    ck_assert_uint_ge(tern_now_ns() - t0, 250 * MS);
    ck_assert_uint_eq(served(1), 1);
    ck_assert_uint_eq(served(0), 0);
    ck_assert_uint_ge(refused(0), 2);
    tern_doc_close(doc);
}
END_TEST

/* No primary within the call's deadline: TERN_ENOTPRIMARY once it has
 * passed, and not long after; nothing written. */
START_TEST(sync_call_ends_at_its_deadline)
{
    struct tern_doc *doc;

    member_start(0, 0);
    member_start(1, 0);
    doc = open_client(2);
    ends_at_deadline(doc, TERN_ENOTPRIMARY);
    ck_assert_uint_eq(served(0) + served(1), 0);
    tern_doc_close(doc);
}
END_TEST

static void async_done(void *arg, int status, const bson_t *reply)
{
    int *out = arg;

    (void)reply;
    *out = status;
}

/* An async call goes twice round the replicas and ends with the refusal;
 * a client of one server is not told of others and does not wait. */
START_TEST(async_and_lone_calls_do_not_wait)
{
    struct tern_doc *doc;
    bson_t d = BSON_INITIALIZER;
    int status = 1;
    uint64_t t0;

    member_start(0, 0);
    member_start(1, 0);
    doc = open_client(2);
    BSON_APPEND_INT32(&d, "_id", 1);
    ck_assert_int_eq(tern_doc_insert_one_async(doc, "test", "c", &d, async_done, &status), 0);
    t0 = tern_now_ns();
    while (status == 1 && tern_now_ns() - t0 < 5000 * MS)
        tern_rpc_poll(cep);
    ck_assert_int_eq(status, TERN_ENOTPRIMARY);
    ck_assert_uint_le(refused(0) + refused(1), 5);
    tern_doc_close(doc);
    doc = open_client(1);
    t0 = tern_now_ns();
    ck_assert_int_eq(insert(doc), TERN_ENOTPRIMARY);
    ck_assert_uint_lt(tern_now_ns() - t0, 250 * MS);
    tern_doc_close(doc);
    bson_destroy(&d);
}
END_TEST

/* Restart member 1 after `arg` ms, taking writes. */
static void *restart_later(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg * 1000);
    member_start(1, 1);
    return NULL;
}

/* The primary gone, then back on its port: the sync call waits for it
 * (redialled meanwhile) and is done there. Both gone for longer than
 * the deadline: TERN_ENOTCONN once it has passed. */
START_TEST(sync_call_waits_for_a_replica_to_return)
{
    struct tern_doc *doc;
    pthread_t th;
    uint64_t t0;

    member_start(0, 0);
    member_start(1, 1);
    doc = open_client(2);
    ck_assert_int_eq(insert(doc), 0);
    ck_assert_uint_eq(served(1), 1);
    member_stop(1);
    ck_assert_int_eq(pthread_create(&th, NULL, restart_later, (void *)(uintptr_t)400), 0);
    ck_assert_int_eq(insert(doc), 0);
    pthread_join(th, NULL);
    ck_assert_uint_eq(served(1), 2);
    ck_assert_uint_eq(served(0), 0);
    member_stop(0);
    member_stop(1);
    /* Seen gone first: a call sent on a session that dies under it may
     * have run, and ends with TERN_ECONNRESET instead. */
    for (t0 = tern_now_ns(); tern_now_ns() - t0 < 300 * MS;)
        tern_rpc_poll(cep);
    ends_at_deadline(doc, TERN_ENOTCONN);
    tern_doc_close(doc);
}
END_TEST

Suite *suite_doc_election(void)
{
    Suite *s = suite_create("doc_election");
    TCase *tc = tcase_create("doc_election");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, sync_call_waits_out_an_election);
    tcase_add_test(tc, sync_call_ends_at_its_deadline);
    tcase_add_test(tc, async_and_lone_calls_do_not_wait);
    tcase_add_test(tc, sync_call_waits_for_a_replica_to_return);
    suite_add_tcase(s, tc);
    return s;
}

#endif
