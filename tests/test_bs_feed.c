/* bs_feed: the block feed between processes (services/blocksync/bs_feed.h):
 * a subscriber from a height, from the next block or from the latest,
 * whole blocks or headers only, live blocks as a producer appends them,
 * resume after a reconnect, "forked" where the chain parted, and the
 * limits of one session. */
#include "tern_config.h"

#if TERN_HAVE_BLOCKSYNC

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bs_feed.h"
#include "bs_gen.h"
#include "bs_service.h"
#include "bs_store.h"
#include "error.h"
#include "helpers.h"
#include "suites.h"

#define CHAIN 0xfeedull
#define NB 300

static char dir[96], src[256], srv_path[256];
static struct bs_hasher *hs;
static uint8_t ids[NB + 64][BS_ID_LEN];

static void make_chain(const char *path, uint64_t seed, uint64_t n, uint8_t (*out)[BS_ID_LEN])
{
    struct bs_store_opts o = {.size = 32 << 20, .chain = CHAIN, .create = true};
    size_t cap = bs_gen_block_max(BS_SHAPE_EOS), len;
    uint8_t *blk = malloc(cap);
    struct bs_store *st;
    struct bs_gen g;

    ck_assert_int_eq(bs_store_open(path, &o, &st), 0);
    bs_gen_init(&g, BS_SHAPE_EOS, CHAIN, seed);
    while (g.height < n) {
        uint64_t h = g.height;
        uint8_t id[BS_ID_LEN];
        ck_assert_int_eq(bs_gen_next(&g, hs, blk, cap, &len, id), 0);
        ck_assert_int_eq(bs_store_append(st, blk, len, id), 0);
        if (out)
            memcpy(out[h], id, BS_ID_LEN);
    }
    ck_assert_int_eq(bs_store_commit(st), 0);
    bs_store_close(st);
    free(blk);
}

static void setup(void)
{
    test_tmpdir(dir, sizeof(dir), "bs_feed");
    hs = bs_hasher_new();
    snprintf(src, sizeof(src), "%s/src.chain", dir);
    make_chain(src, 1, NB, ids);
}

static void teardown(void)
{
    bs_hasher_free(hs);
}

static void serve_setup(struct tern_rpc_ep *ep)
{
    struct bs_store *st;
    struct bs_service *svc;
    struct bs_service_opts so = {.allow_append = true};

    if (bs_store_open(srv_path, NULL, &st) < 0 || bs_service_new(st, &so, &svc) < 0 ||
        tern_rpc_register(ep, bs_service_def(svc)) < 0)
        _exit(7);
}

static pid_t serve(const char *chain, const char *name, char *uri)
{
    char cmd[600];

    snprintf(srv_path, sizeof(srv_path), "%s/%s.chain", dir, name);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", chain, srv_path);
    ck_assert_int_eq(system(cmd), 0);
    return spawn_rpc_server_at(serve_setup, NULL, "tcp://127.0.0.1:0", uri, 128);
}

static struct tern_session *connect_to(struct tern_rpc_ep *ep, const char *uri)
{
    struct tern_session *s;

    ck_assert_int_eq(tern_rpc_connect(ep, uri, 5000000000ull, &s), 0);
    return s;
}

/* What a subscriber got: heights in order, sizes. */
struct got {
    uint64_t first, n, bytes;
    bool headers;
};

static int take(void *arg, uint64_t height, const uint8_t *p, size_t len)
{
    struct got *g = arg;
    uint8_t id[BS_ID_LEN];

    if (g->n == 0)
        g->first = height;
    CHECK(height == g->first + g->n, "height %llu out of order", (unsigned long long)height);
    if (height < NB) {
        bs_header_id(hs, p, id);
        CHECK(!memcmp(id, ids[height], BS_ID_LEN), "block %llu is not the chain's",
              (unsigned long long)height);
    }
    CHECK(g->headers ? len == BS_HDR_SIZE : len > BS_HDR_SIZE, "length %zu", len);
    g->n++;
    g->bytes += len;
    return 0;
}

static void drain(struct bs_feed_sub *sub, struct got *g, uint64_t until)
{
    for (int i = 0; i < 10000 && sub->next < until; i++)
        ck_assert_int_ge(bs_feed_poll(sub, take, g), 0);
    ck_assert_uint_eq(sub->next, until);
}

START_TEST(from_a_height_whole_or_headers)
{
    char uri[128];
    pid_t a = serve(src, "a", uri);
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct bs_feed_sub sub, hsub;
    struct got g = {0}, gh = {.headers = true};

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    s = connect_to(ep, uri);
    ck_assert_int_eq(bs_feed_subscribe(&sub, s, BS_FROM_HEIGHT, 0, NULL, 0, 16, 0), 0);
    drain(&sub, &g, NB);
    ck_assert_uint_eq(g.first, 0);
    ck_assert_uint_eq(g.n, NB);
    /* At the head: nothing more, not an error. */
    ck_assert_int_eq(bs_feed_poll(&sub, take, &g), 0);
    ck_assert_uint_eq(sub.head, NB);

    ck_assert_int_eq(bs_feed_subscribe(&hsub, s, BS_FROM_HEIGHT, 100, ids[99],
                                       BS_SUB_HEADERS, 1000, 0), 0);
    drain(&hsub, &gh, NB);
    ck_assert_uint_eq(gh.first, 100);
    ck_assert_uint_eq(gh.n, NB - 100);
    ck_assert_uint_eq(gh.bytes, (NB - 100) * BS_HDR_SIZE);
    bs_feed_sub_free(&sub);
    bs_feed_sub_free(&hsub);
    tern_rpc_close(ep);
    stop_server(a);
}
END_TEST

/* Live blocks: from the next block and from the latest, as a producer
 * appends; the feed's stats show each subscriber's lag. */
START_TEST(live_blocks_and_lag)
{
    char uri[128];
    pid_t a = serve(src, "b", uri);
    struct tern_rpc_ep *ep;
    struct tern_session *s, *prod;
    struct bs_feed_sub next, latest;
    struct got gn = {0}, gl = {0};
    size_t cap = sizeof(struct bs_append_req) + bs_gen_block_max(BS_SHAPE_EOS), len;
    uint8_t *msg = malloc(cap);
    struct bs_gen gen;
    uint8_t buf[4096];
    struct bs_feed_stats_rep *fs = (struct bs_feed_stats_rep *)buf;
    size_t got;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    s = connect_to(ep, uri);
    prod = connect_to(ep, uri);
    ck_assert_int_eq(bs_feed_subscribe(&next, s, BS_FROM_NEXT, 0, NULL, 0, 4, 0), 0);
    ck_assert_uint_eq(next.next, NB);
    ck_assert_int_eq(bs_feed_subscribe(&latest, s, BS_FROM_LATEST, 0, NULL, 0, 4, 0), 0);
    ck_assert_uint_eq(latest.next, NB - 1);
    ck_assert_int_eq(bs_feed_poll(&next, take, &gn), 0);

    bs_gen_init(&gen, BS_SHAPE_EOS, CHAIN, 1);
    bs_gen_resume(&gen, NB, ids[NB - 1]);
    for (int i = 0; i < 20; i++) {
        struct bs_append_rep rep;
        memset(msg, 0, sizeof(struct bs_append_req));
        ck_assert_int_eq(bs_gen_next(&gen, hs, msg + sizeof(struct bs_append_req),
                                     cap - sizeof(struct bs_append_req), &len,
                                     ids[NB + i]), 0);
        ck_assert_int_eq(tern_call_sync(prod, BS_SERVICE_ID, BS_M_APPEND, msg,
                                        sizeof(struct bs_append_req) + len, &rep, sizeof(rep),
                                        &got, 5000000000ull), 0);
        ck_assert_uint_eq(rep.verdict, BS_VALID);
        if (i == 9)                  /* a poll in the middle: 4 credits at a time */
            ck_assert_int_eq(bs_feed_poll(&next, take, &gn), 4);
    }
    /* Lag: `next` acknowledged up to NB+4 (its last poll's start), so it
     * lags 16 behind the head of NB+20. */
    ck_assert_int_eq(bs_feed_poll(&next, take, &gn), 4);
    ck_assert_int_eq(tern_call_sync(s, BS_SERVICE_ID, BS_M_FEED_STATS, NULL, 0, buf,
                                    sizeof(buf), &got, 5000000000ull), 0);
    ck_assert_uint_eq(fs->head, NB + 20);
    ck_assert_uint_eq(fs->n, 2);
    {
        struct bs_sub_stat *ss = (struct bs_sub_stat *)(fs + 1);
        int k = ss[0].sub == next.id ? 0 : 1;
        ck_assert_uint_eq(ss[k].next, NB + 4);
        ck_assert_uint_eq(ss[k].lag, 16);
    }
    drain(&next, &gn, NB + 20);
    drain(&latest, &gl, NB + 20);
    ck_assert_uint_eq(gn.n, 20);
    ck_assert_uint_eq(gl.first, NB - 1);
    ck_assert_uint_eq(gl.n, 21);
    free(msg);
    bs_feed_sub_free(&next);
    bs_feed_sub_free(&latest);
    tern_rpc_close(ep);
    stop_server(a);
}
END_TEST

/* A subscriber that reconnects goes on where it stopped; on a node whose
 * chain parted from what it followed it is told "forked". */
START_TEST(resume_and_forked)
{
    char uri[128], uri2[128], other[256];
    pid_t a = serve(src, "c", uri), b;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct bs_feed_sub sub, bad;
    struct got g = {0};

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    s = connect_to(ep, uri);
    ck_assert_int_eq(bs_feed_subscribe(&sub, s, BS_FROM_HEIGHT, 0, NULL, 0, 50, 0), 0);
    drain(&sub, &g, 150);
    tern_rpc_disconnect(s);
    s = connect_to(ep, uri);
    ck_assert_int_eq(bs_feed_resume(&sub, s), 0);
    drain(&sub, &g, NB);
    ck_assert_uint_eq(g.n, NB);

    /* Another chain (same id, another seed): a resume there is forked,
     * and so is a subscription that names a parent it does not have. */
    snprintf(other, sizeof(other), "%s/other.chain", dir);
    make_chain(other, 2, NB, NULL);
    b = serve(other, "d", uri2);
    tern_rpc_disconnect(s);
    s = connect_to(ep, uri2);
    ck_assert_int_eq(bs_feed_resume(&sub, s), TERN_EFORKED);
    ck_assert_int_eq(bs_feed_subscribe(&bad, s, BS_FROM_HEIGHT, 10, ids[9], 0, 8, 0),
                     TERN_EFORKED);
    bs_feed_sub_free(&bad);
    bs_feed_sub_free(&sub);
    tern_rpc_close(ep);
    stop_server(a);
    stop_server(b);
}
END_TEST

START_TEST(one_session_takes_its_share)
{
    char uri[128];
    pid_t a = serve(src, "e", uri);
    struct tern_rpc_ep *ep;
    struct tern_session *s, *s2;
    struct bs_feed_sub subs[BS_FEED_PER_SESSION + 1];
    struct bs_feed_req q = {.sub = 999999, .credits = 1, .max_bytes = 4096};
    uint8_t buf[256];
    size_t got;
    int i;

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    s = connect_to(ep, uri);
    for (i = 0; i < BS_FEED_PER_SESSION; i++)
        ck_assert_int_eq(bs_feed_subscribe(&subs[i], s, BS_FROM_NEXT, 0, NULL, 0, 1, 4096), 0);
    ck_assert_int_eq(bs_feed_subscribe(&subs[i], s, BS_FROM_NEXT, 0, NULL, 0, 1, 4096),
                     TERN_ENOSPC);
    /* Another session still may; an id not its own is unknown to it. */
    s2 = connect_to(ep, uri);
    q.sub = subs[0].id;
    ck_assert_int_eq(tern_call_sync(s2, BS_SERVICE_ID, BS_M_FEED, &q, sizeof(q), buf,
                                    sizeof(buf), &got, 5000000000ull), TERN_ENOENT);
    ck_assert_int_eq(bs_feed_subscribe(&subs[i], s2, BS_FROM_NEXT, 0, NULL, 0, 1, 4096), 0);
    /* Malformed requests are refused, and the node serves on. */
    q.credits = 0;
    ck_assert_int_eq(tern_call_sync(s2, BS_SERVICE_ID, BS_M_FEED, &q, sizeof(q), buf,
                                    sizeof(buf), &got, 5000000000ull), TERN_EPROTO);
    ck_assert_int_eq(tern_call_sync(s2, BS_SERVICE_ID, BS_M_SUBSCRIBE, &q, 7, buf,
                                    sizeof(buf), &got, 5000000000ull), TERN_EPROTO);
    /* The first session's subscriptions end with it. */
    tern_rpc_disconnect(s);
    {
        struct bs_info in;
        for (int k = 0; k < 100; k++) {
            ck_assert_int_eq(tern_call_sync(s2, BS_SERVICE_ID, BS_M_INFO, NULL, 0, &in,
                                            sizeof(in), &got, 5000000000ull), 0);
            if (in.subscribers == 1)
                break;
            usleep(10000);
        }
        ck_assert_uint_eq(in.subscribers, 1);
    }
    for (int k = 0; k <= i; k++)
        bs_feed_sub_free(&subs[k]);
    tern_rpc_close(ep);
    stop_server(a);
}
END_TEST

Suite *suite_bs_feed(void)
{
    Suite *s = suite_create("bs_feed");
    TCase *tc = tcase_create("feed");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, from_a_height_whole_or_headers);
    tcase_add_test(tc, live_blocks_and_lag);
    tcase_add_test(tc, resume_and_forked);
    tcase_add_test(tc, one_session_takes_its_share);
    suite_add_tcase(s, tc);
    return s;
}

#endif
