/* Suite doc_crash: kill -9 the document server at random points while a
 * client keeps inserts, updates and deletes in flight, restart it on the
 * same pool, and check that every acknowledged write is there, that no
 * acknowledged delete came back, and that no document is torn.
 *
 * Each update changes three fields of a document together ($inc a and b,
 * $set s to a string made from the new a), so a document with a != b, or
 * with an s that is not its a's, is a half-applied update. A write that
 * was in flight when the server died may or may not have happened: the
 * check allows both, never anything else. The pool is small (1 MiB
 * segments), so cleaning runs all the time and kills land in it too.
 * Round r runs on row r of the fabric matrix, modulo its size (tcp, shm,
 * ntb-emu, rdma-emu).
 *
 * TERN_CRASH_ROUNDS sets the number of kill points (default 100). */
#include "tern_config.h"

#if TERN_HAVE_DOC

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc.h"
#include "doc_servers.h"
#include "error.h"
#include "fabrics.h"
#include "helpers.h"
#include "suites.h"

#define KEYS 300
#define WINDOW 8
#define DB "crash"
#define COLL "c"
#define PAD 700
#define SEC 1000000000ull

enum kstate { K_ABSENT, K_PRESENT };

struct key {
    enum kstate st;              /* as last acknowledged */
    int64_t a;                   /* acknowledged a (present) */
    bool busy;                   /* a write is in flight */
    /* The write in flight, if the server died under it: */
    enum { W_NONE, W_INSERT, W_UPDATE, W_DELETE } w;
};

static struct key keys[KEYS];

struct op {
    struct crash *cr;
    unsigned k;
    bson_t q, u;
    bool used;
};

struct crash {
    struct tern_doc *doc;
    struct op ops[WINDOW];
    unsigned inflight;
    uint64_t acked, failed;
    bool dead;                   /* the server was killed: nothing new is sent */
};

static void str_of(char *s, size_t cap, unsigned k, int64_t a)
{
    snprintf(s, cap, "k%u-a%lld-", k, (long long)a);
}

static void make_doc(bson_t *d, unsigned k, int64_t a)
{
    char s[64], pad[PAD + 1];

    memset(pad, 'a' + (int)(k % 26), PAD);
    pad[PAD] = 0;
    str_of(s, sizeof(s), k, a);
    bson_init(d);
    BSON_APPEND_INT32(d, "_id", (int32_t)k);
    BSON_APPEND_INT64(d, "a", a);
    BSON_APPEND_UTF8(d, "s", s);
    BSON_APPEND_UTF8(d, "pad", pad);
    BSON_APPEND_INT64(d, "b", a);
}

static void done(void *arg, int status, const bson_t *reply)
{
    struct op *op = arg;
    struct crash *cr = op->cr;
    struct key *kk = &keys[op->k];

    (void)reply;
    cr->inflight--;
    op->used = false;
    if (status < 0) {
        /* The server died under it (or refused it): its outcome is
         * unknown, kk->w says what may have happened. */
        cr->failed++;
        return;
    }
    cr->acked++;
    switch (kk->w) {
    case W_INSERT:
        kk->st = K_PRESENT;
        kk->a = 0;
        break;
    case W_UPDATE:
        kk->a++;
        break;
    case W_DELETE:
        kk->st = K_ABSENT;
        break;
    default:
        break;
    }
    kk->w = W_NONE;
    kk->busy = false;
}

/* Start one write on a key nobody is writing. */
static void start(struct crash *cr, struct op *op)
{
    unsigned k;
    struct key *kk;
    int rc;

    do
        k = (unsigned)(test_rng() % KEYS);
    while (keys[k].busy);
    kk = &keys[k];
    op->k = k;
    bson_reinit(&op->q);
    BSON_APPEND_INT32(&op->q, "_id", (int32_t)k);
    if (kk->st == K_ABSENT) {
        kk->w = W_INSERT;
        bson_destroy(&op->u);
        make_doc(&op->u, k, 0);
        rc = tern_doc_insert_one_async(cr->doc, DB, COLL, &op->u, done, op);
    } else if (test_rng() % 10 == 0) {
        kk->w = W_DELETE;
        rc = tern_doc_delete_async(cr->doc, DB, COLL, &op->q, false, done, op);
    } else {
        bson_t inc, set;
        char s[64];

        kk->w = W_UPDATE;
        str_of(s, sizeof(s), k, kk->a + 1);
        bson_reinit(&op->u);
        BSON_APPEND_DOCUMENT_BEGIN(&op->u, "$inc", &inc);
        BSON_APPEND_INT64(&inc, "a", 1);
        BSON_APPEND_INT64(&inc, "b", 1);
        bson_append_document_end(&op->u, &inc);
        BSON_APPEND_DOCUMENT_BEGIN(&op->u, "$set", &set);
        BSON_APPEND_UTF8(&set, "s", s);
        bson_append_document_end(&op->u, &set);
        rc = tern_doc_update_async(cr->doc, DB, COLL, &op->q, &op->u, false, false, done, op);
    }
    if (rc < 0) {
        /* Not sent at all (the session is gone): nothing happened. */
        kk->w = W_NONE;
        return;
    }
    kk->busy = true;
    op->used = true;
    cr->inflight++;
}

static int64_t get_i64(const bson_t *d, const char *f)
{
    bson_iter_t it;

    ck_assert_msg(bson_iter_init_find(&it, d, f), "no field %s", f);
    return bson_iter_as_int64(&it);
}

/* Every key as acknowledged, or as its write in flight left it. */
static void verify(struct tern_doc *doc, unsigned round)
{
    for (unsigned k = 0; k < KEYS; k++) {
        struct key *kk = &keys[k];
        bson_value_t id = {.value_type = BSON_TYPE_INT32, .value.v_int32 = (int32_t)k};
        bson_t got;
        int rc = tern_doc_find_id(doc, DB, COLL, &id, &got);
        bool present = rc == 0;

        ck_assert_msg(rc == 0 || rc == TERN_ENOENT, "round %u key %u: %s", round, k,
                      tern_strerror(rc));
        if (present) {
            int64_t a = get_i64(&got, "a"), b = get_i64(&got, "b");
            bson_t want;
            char s[64];
            bson_iter_t it;

            /* Torn: the three fields of one update disagree. */
            ck_assert_msg(a == b, "round %u key %u: a %lld, b %lld: half an update", round, k,
                          (long long)a, (long long)b);
            str_of(s, sizeof(s), k, a);
            ck_assert(bson_iter_init_find(&it, &got, "s"));
            ck_assert_msg(strcmp(bson_iter_utf8(&it, NULL), s) == 0,
                          "round %u key %u: s is %s with a %lld", round, k,
                          bson_iter_utf8(&it, NULL), (long long)a);
            make_doc(&want, k, a);
            ck_assert(bson_iter_init_find(&it, &got, "pad"));
            ck_assert_msg(strlen(bson_iter_utf8(&it, NULL)) == PAD, "round %u key %u: pad",
                          round, k);
            bson_destroy(&want);
            bson_destroy(&got);
            if (kk->st == K_PRESENT)
                ck_assert_msg(a == kk->a || (kk->w == W_UPDATE && a == kk->a + 1),
                              "round %u key %u: a %lld, acknowledged %lld", round, k,
                              (long long)a, (long long)kk->a);
            else
                ck_assert_msg(kk->w == W_INSERT && a == 0,
                              "round %u key %u: present, but its delete was acknowledged "
                              "(or it was never inserted)", round, k);
            kk->st = K_PRESENT;
            kk->a = a;
        } else {
            ck_assert_msg(kk->st == K_ABSENT || kk->w == W_DELETE,
                          "round %u key %u: an acknowledged document is gone", round, k);
            kk->st = K_ABSENT;
        }
        kk->w = W_NONE;
        kk->busy = false;
    }
}

START_TEST(kill9_loses_no_acknowledged_write)
{
    const char *e = getenv("TERN_CRASH_ROUNDS");
    unsigned rounds = e && atoi(e) > 0 ? (unsigned)atoi(e) : 100;
    struct test_doc_srv o = {.pool_size = 24u << 20, .seg_size = 1u << 20};
    uint64_t total_acked = 0, total_failed = 0;

    test_rng_seed(0xd0c5eedull);
    memset(keys, 0, sizeof(keys));
    for (unsigned round = 0; round < rounds; round++) {
        struct crash cr = {0};
        struct tern_rpc_ep *ep;
        const char *uri;
        uint64_t kill_after = 20 + test_rng() % 400;
        double t0;

        /* Each round on the next fabric of the matrix. */
        o.listen = test_fabric_listen((int)(round % (unsigned)test_fabric_count()));
        test_doc_start(0, &o);
        ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
        uri = test_doc_uri(0);
        ck_assert_int_eq(tern_doc_open(ep, &uri, 1, 5 * SEC, &cr.doc), 0);
        verify(cr.doc, round);
        for (unsigned i = 0; i < WINDOW; i++) {
            cr.ops[i].cr = &cr;
            bson_init(&cr.ops[i].q);
            bson_init(&cr.ops[i].u);
        }
        /* Writes, a window of them, until the kill point; then SIGKILL
         * with writes in flight, and wait for each to fail or land. */
        t0 = now_ms();
        while (!cr.dead || cr.inflight) {
            for (unsigned i = 0; !cr.dead && i < WINDOW; i++)
                if (!cr.ops[i].used)
                    start(&cr, &cr.ops[i]);
            /* Right after a window went out: the kill cuts some short. */
            if (!cr.dead && cr.acked >= kill_after) {
                test_doc_kill(0);
                cr.dead = true;
            }
            tern_rpc_poll(ep);
            ck_assert_msg(now_ms() - t0 < 60000, "round %u: stuck (%u in flight)", round,
                          cr.inflight);
        }
        total_acked += cr.acked;
        total_failed += cr.failed;
        for (unsigned i = 0; i < WINDOW; i++) {
            bson_destroy(&cr.ops[i].q);
            bson_destroy(&cr.ops[i].u);
        }
        tern_doc_close(cr.doc);
        tern_rpc_close(ep);
    }
    /* The last kill's aftermath. */
    {
        struct tern_rpc_ep *ep;
        struct tern_doc *doc;
        const char *uri;

        o.listen = test_fabric_listen(test_fabric_row("tcp"));
        test_doc_start(0, &o);
        ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
        uri = test_doc_uri(0);
        ck_assert_int_eq(tern_doc_open(ep, &uri, 1, 5 * SEC, &doc), 0);
        verify(doc, rounds);
        tern_doc_close(doc);
        tern_rpc_close(ep);
        test_doc_finish(0);
    }
    if (getenv("TERN_CRASH_VERBOSE"))
        fprintf(stderr, "doc_crash: %u rounds, %llu writes acknowledged, %llu cut short\n",
                rounds, (unsigned long long)total_acked, (unsigned long long)total_failed);
    /* The kills were real: writes were cut short, and many landed. */
    ck_assert_uint_gt(total_failed, 0);
    ck_assert_uint_gt(total_acked, (uint64_t)rounds * 20);
}
END_TEST

static void teardown(void)
{
    test_doc_cleanup();
}

Suite *suite_doc_crash(void)
{
    Suite *s = suite_create("doc_crash");
    TCase *tc = tcase_create("doc_crash");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, kill9_loses_no_acknowledged_write);
    suite_add_tcase(s, tc);
    return s;
}

#endif
