/* rpcbench feed: the block feed under a generator. One node (a child
 * process) takes blocks from a producer at --rate blocks a second; N
 * subscribers (threads, each with its own endpoint and session) follow it
 * from the next block, each spending --read-ms on every block it is given
 * (the slow ones ten times that). Lag is a block's arrival at a
 * subscriber less the moment the producer sent it; the run reports the
 * normal subscribers' worst and 99th-percentile lag against the block
 * interval, the slow ones' worst lag in time and blocks, and any block a
 * subscriber did not get (the feed client checks each block follows the
 * last, so a gap is an error, not a count). */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bs_feed.h"
#include "bs_gen.h"
#include "bs_service.h"
#include "bs_store.h"
#include "bsbench.h"
#include "opt.h"
#include "rpc.h"
#include "spawn.h"

#define ME "rpcbench feed"
#define CHAIN 0xfeedbe7cull
#define MAX_SUBS 1000
#define MAX_BLOCKS 100000
#define LAG_BUCKETS 4096             /* 0.1 ms each: up to 409.6 ms, the last holds the rest */

struct feed_opts {
    const char *fabric, *dir;
    unsigned subs, slow;
    double rate, read_ms, seconds;
    bool json;
};

struct subscriber {
    const struct feed_opts *o;
    const char *uri;
    bool slow;
    pthread_t t;
    uint64_t got, max_lag_ns, max_lag_blocks, first;
    int rc;
    uint32_t hist[LAG_BUCKETS];
};

static _Atomic uint64_t sent_ns[MAX_BLOCKS];     /* by height - base */
static uint64_t base_height;
static _Atomic uint64_t final_head;              /* set once the producer is done */
static _Atomic bool producing;

/* ---- the node ---- */

struct node_args {
    const char *listen, *path;
};

static volatile sig_atomic_t node_stop;

static void node_on_signal(int sig)
{
    (void)sig;
    node_stop = 1;
}

static int node_child(void *arg, int fd)
{
    const struct node_args *a = arg;
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .mode = TERN_TP_POLL_ADAPTIVE,
                                  .max_sessions = MAX_SUBS + 16};
    struct bs_service_opts so = {.allow_append = true};
    struct bs_store *st;
    struct bs_service *svc;
    struct tern_rpc_ep *ep;
    char bound[160];

    if (bs_store_open(a->path, NULL, &st) < 0 || bs_service_new(st, &so, &svc) < 0 ||
        tern_rpc_open(&cfg, &ep) < 0 || tern_rpc_register(ep, bs_service_def(svc)) < 0 ||
        tern_rpc_listen(ep, a->listen, bound, sizeof(bound)) < 0) {
        if (write(fd, "-", 2) < 0)
            return 1;
        return 1;
    }
    signal(SIGTERM, node_on_signal);
    if (write(fd, bound, strlen(bound) + 1) < 0)
        return 1;
    close(fd);
    while (!node_stop)
        tern_rpc_run(ep, 100000000);
    tern_rpc_close(ep);
    bs_service_free(svc);
    bs_store_close(st);
    return 0;
}

/* ---- subscribers ---- */

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};

    while (nanosleep(&ts, &ts) < 0)
        ;
}

static int on_block(void *arg, uint64_t height, const uint8_t *p, size_t len)
{
    struct subscriber *sb = arg;
    uint64_t now = tern_now_ns(), sent;
    uint64_t i = height - base_height, lag, b;

    (void)p;
    (void)len;
    if (i >= MAX_BLOCKS)
        return TERN_ERANGE;
    sent = atomic_load(&sent_ns[i]);
    lag = sent && now > sent ? now - sent : 0;
    if (lag > sb->max_lag_ns)
        sb->max_lag_ns = lag;
    b = lag / 100000;
    sb->hist[b < LAG_BUCKETS ? b : LAG_BUCKETS - 1]++;
    sb->got++;
    return 0;
}

static void *sub_main(void *arg)
{
    struct subscriber *sb = arg;
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .mode = TERN_TP_POLL_ADAPTIVE,
                                  .max_msg = 256u << 10};
    uint64_t read_ns = (uint64_t)(sb->o->read_ms * 1e6) * (sb->slow ? 10 : 1);
    uint64_t nap = 200000;
    struct tern_rpc_ep *ep = NULL;
    struct tern_session *s = NULL;
    struct bs_feed_sub sub;
    int rc;

    rc = tern_rpc_open(&cfg, &ep);
    if (rc == 0)
        rc = tern_rpc_connect(ep, sb->uri, 5000000000ull, &s);
    if (rc == 0)
        rc = bs_feed_subscribe(&sub, s, BS_FROM_HEIGHT, base_height, NULL, 0, 1, 256u << 10);
    sb->first = base_height;
    while (rc == 0) {
        uint64_t head_done = atomic_load(&final_head);

        if (!atomic_load(&producing) && sub.next >= head_done)
            break;
        /* One block a poll: each is read (the sleep) before the next is
         * asked for, as an application that processes blocks would. */
        rc = bs_feed_poll(&sub, on_block, sb);
        if (rc > 0) {
            uint64_t behind = sub.head > sub.next ? sub.head - sub.next : 0;
            if (behind > sb->max_lag_blocks)
                sb->max_lag_blocks = behind;
            sleep_ns(read_ns);
            nap = 200000;
            rc = 0;
        } else if (rc == 0) {
            /* At the head: ask again soon, a little later each time. */
            sleep_ns(nap);
            nap = nap * 2 > 2000000 ? 2000000 : nap * 2;
        }
    }
    sb->rc = rc;
    if (s)
        bs_feed_sub_free(&sub);
    if (ep)
        tern_rpc_close(ep);
    return NULL;
}

/* ---- the run ---- */

static double pct(const uint32_t *h, uint64_t n, double q)
{
    uint64_t want = (uint64_t)((double)n * q), acc = 0;

    if (!n)
        return 0;

    for (unsigned i = 0; i < LAG_BUCKETS; i++) {
        acc += h[i];
        if (acc > want)
            return (i + 1) * 0.1;
    }
    return LAG_BUCKETS * 0.1;
}

static int run_fabric(const struct feed_opts *o, const char *fabric)
{
    char listen[96], tag[48], uri[160], path[4096], label[32];
    struct node_args na;
    struct subscriber *subs = calloc(o->subs, sizeof(*subs));
    uint32_t *fast = calloc(LAG_BUCKETS, sizeof(*fast));
    struct tern_rpc_ep *ep = NULL;
    struct tern_session *prod = NULL;
    struct bs_hasher *hs = bs_hasher_new();
    struct bs_store_opts so = {.size = 256u << 20, .chain = CHAIN, .create = true};
    struct bs_store *st;
    struct bs_gen g;
    uint64_t interval = (uint64_t)(1e9 / o->rate), t0, n_blocks, fast_max = 0, fast_n = 0;
    uint64_t slow_max = 0, slow_blocks = 0, lost = 0;
    size_t cap = sizeof(struct bs_append_req) + bs_gen_block_max(BS_SHAPE_EOS);
    uint8_t *msg = malloc(cap);
    int rc = 0, errors = 0;
    pid_t pid;

    snprintf(tag, sizeof(tag), "rpcbench-feed-%d", (int)getpid());
    if (tern_tp_local_uri(fabric, tag, listen, sizeof(listen)) < 0)
        return 0;
    /* Every subscriber here has an endpoint of its own, and a link of a
     * point-to-point fabric (NTB) has one peer endpoint. */
    if ((tern_tp_fabric_caps(fabric) & TERN_TP_CAP_POINT_TO_POINT) && o->subs > 1) {
        if (!o->json)
            printf("%-9s skipped: a link has one peer endpoint, and each subscriber here "
                   "has its own\n", fabric);
        return 0;
    }
    /* A chain of 10 blocks to start from. */
    snprintf(path, sizeof(path), "%s/rpcbench-feed-%d.chain", o->dir, (int)getpid());
    unlink(path);
    if (!subs || !fast || !hs || !msg || bs_store_open(path, &so, &st) < 0)
        return 1;
    bs_gen_init(&g, BS_SHAPE_EOS, CHAIN, 7);
    bs_gen_fill(&g, hs, st, 10, 0, 0, 0, NULL, NULL);
    base_height = bs_store_committed(st);
    bs_store_close(st);
    na = (struct node_args){.listen = listen, .path = path};
    pid = bench_spawn(node_child, &na, uri, sizeof(uri));
    if (pid < 0 || strlen(uri) <= 1 || uri[0] == '-') {
        fprintf(stderr, ME ": %s node did not start\n", fabric);
        unlink(path);
        return 1;
    }
    tern_tp_uri_label(uri, label, sizeof(label));
    memset(sent_ns, 0, sizeof(sent_ns));
    atomic_store(&producing, true);
    atomic_store(&final_head, UINT64_MAX);
    for (unsigned i = 0; i < o->subs; i++) {
        subs[i] = (struct subscriber){.o = o, .uri = uri, .slow = i < o->slow};
        pthread_create(&subs[i].t, NULL, sub_main, &subs[i]);
    }
    usleep(300000);                  /* everyone subscribed */
    rc = tern_rpc_open(NULL, &ep);
    if (rc == 0)
        rc = tern_rpc_connect(ep, uri, 5000000000ull, &prod);
    bs_gen_init(&g, BS_SHAPE_EOS, CHAIN, 7);
    n_blocks = (uint64_t)(o->rate * o->seconds);
    if (n_blocks > MAX_BLOCKS)
        n_blocks = MAX_BLOCKS;
    t0 = tern_now_ns();
    uint64_t made = 0;
    for (uint64_t i = 0; rc == 0 && i < n_blocks; i++) {
        struct bs_append_req q = {0};
        struct bs_append_rep rep;
        size_t len, got;
        uint8_t id[BS_ID_LEN];
        uint64_t due = t0 + i * interval, now = tern_now_ns();

        if (now < due)
            sleep_ns(due - now);
        memcpy(msg, &q, sizeof(q));
        if (i == 0) {
            /* The generator's chain is the node's: the same seed, resumed
             * at the node's head from an INFO. */
            struct bs_info in;
            size_t gl;
            rc = tern_call_sync(prod, BS_SERVICE_ID, BS_M_INFO, NULL, 0, &in, sizeof(in), &gl,
                                5000000000ull);
            if (rc < 0)
                break;
            bs_gen_resume(&g, in.committed, in.head_id);
        }
        if ((rc = bs_gen_next(&g, hs, msg + sizeof(q), cap - sizeof(q), &len, id)) < 0)
            break;
        atomic_store(&sent_ns[i], tern_now_ns());
        rc = tern_call_sync(prod, BS_SERVICE_ID, BS_M_APPEND, msg, sizeof(q) + len, &rep,
                            sizeof(rep), &got, 5000000000ull);
        if (rc == 0 && rep.verdict != BS_VALID)
            rc = TERN_EPROTO;
        if (rc == 0)
            made++;
    }
    if (rc < 0)
        fprintf(stderr, ME ": %s: the producer stopped after %" PRIu64 " blocks: %s\n", fabric,
                made, tern_strerror(rc));
    n_blocks = made;
    atomic_store(&final_head, base_height + n_blocks);
    atomic_store(&producing, false);
    for (unsigned i = 0; i < o->subs; i++)
        pthread_join(subs[i].t, NULL);
    for (unsigned i = 0; i < o->subs; i++) {
        struct subscriber *sb = &subs[i];

        if (sb->rc < 0) {
            fprintf(stderr, ME ": subscriber %u: %s\n", i, tern_strerror(sb->rc));
            errors++;
        }
        lost += sb->got < n_blocks ? n_blocks - sb->got : 0;
        if (sb->slow) {
            if (sb->max_lag_ns > slow_max)
                slow_max = sb->max_lag_ns;
            if (sb->max_lag_blocks > slow_blocks)
                slow_blocks = sb->max_lag_blocks;
            continue;
        }
        if (sb->max_lag_ns > fast_max)
            fast_max = sb->max_lag_ns;
        for (unsigned k = 0; k < LAG_BUCKETS; k++)
            fast[k] += sb->hist[k];
        fast_n += sb->got;
    }
    if (o->json)
        printf("{\"workload\":\"blocksync-feed\",\"fabric\":\"%s\",\"subscribers\":%u,"
               "\"slow\":%u,\"rate\":%.1f,\"interval_ms\":%.1f,\"blocks\":%" PRIu64 ","
               "\"read_ms\":%.2f,\"lag_p99_ms\":%.2f,\"lag_max_ms\":%.2f,"
               "\"slow_lag_max_ms\":%.1f,\"slow_lag_max_blocks\":%" PRIu64 ","
               "\"lost\":%" PRIu64 ",\"errors\":%d,\"status\":\"%s\"}\n",
               label, o->subs, o->slow, o->rate, interval / 1e6, n_blocks, o->read_ms,
               pct(fast, fast_n, 0.99), fast_max / 1e6, slow_max / 1e6, slow_blocks, lost,
               errors, rc ? tern_strerror(rc) : "ok");
    else
        printf("%-9s %5u %4u %7.1f %8.1f %7" PRIu64 " %8.2f %8.2f %9.1f %7" PRIu64 " %5" PRIu64
               "  %s\n", label, o->subs, o->slow, o->rate, interval / 1e6, n_blocks,
               pct(fast, fast_n, 0.99), fast_max / 1e6, slow_max / 1e6, slow_blocks, lost,
               rc ? tern_strerror(rc) : errors ? "subscriber errors" : "ok");
    fflush(stdout);
    if (ep)
        tern_rpc_close(ep);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(path);
    free(subs);
    free(fast);
    free(msg);
    bs_hasher_free(hs);
    return rc || errors || lost ? 1 : 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: rpcbench feed [--fabric FABRIC|all] [options]\n"
            "  The block feed: a node takes --rate blocks a second from a producer while\n"
            "  N subscribers follow it, each reading every block for --read-ms (the slow\n"
            "  ones ten times as long).\n"
            "  --fabric F        tcp, shm, ntb, rdma or all (default shm)\n"
            "  --subscribers N   (default 100)\n"
            "  --slow N          how many of them are slow (default 1)\n"
            "  --rate R          blocks a second (default 50)\n"
            "  --read-ms MS      a normal subscriber's time per block (default 4)\n"
            "  --seconds S       how long the producer runs (default 10)\n"
            "  --json            one JSON object per fabric\n");
}

int feed_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"fabric", required_argument, NULL, 'f'}, {"subscribers", required_argument, NULL, 'n'},
        {"slow", required_argument, NULL, 's'},   {"rate", required_argument, NULL, 'r'},
        {"read-ms", required_argument, NULL, 'm'}, {"seconds", required_argument, NULL, 'S'},
        {"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const char *const all[] = {"all", NULL};
    struct feed_opts o = {.fabric = "shm", .subs = 100, .slow = 1, .rate = 50, .read_ms = 4,
                          .seconds = 10, .dir = bench_default_pool_dir()};
    const char *const *names;
    uint64_t v;
    int c, failed = 0;

    optind = 2;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;

        switch (c) {
        case 'f':
            o.fabric = optarg;
            ok = opt_choice(ME, "--fabric", optarg, tern_tp_fabric_names(), all) >= 0;
            break;
        case 'n':
            ok = opt_num(ME, "--subscribers", optarg, 1, MAX_SUBS, 0, &v);
            o.subs = (unsigned)v;
            break;
        case 's':
            ok = opt_num(ME, "--slow", optarg, 0, MAX_SUBS, 0, &v);
            o.slow = (unsigned)v;
            break;
        case 'r':
            ok = opt_num(ME, "--rate", optarg, 1, 10000, 0, &v);
            o.rate = (double)v;
            break;
        case 'm':
            ok = opt_num(ME, "--read-ms", optarg, 0, 10000, 0, &v);
            o.read_ms = (double)v;
            break;
        case 'S':
            ok = opt_num(ME, "--seconds", optarg, 1, 3600, 0, &v);
            o.seconds = (double)v;
            break;
        case 'j': o.json = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return OPT_USAGE;
        }
        if (!ok)
            return OPT_USAGE;
    }
    if (o.slow > o.subs)
        return opt_usage_error(ME, "--slow %u is more than --subscribers %u", o.slow, o.subs);
    if (!o.json)
        printf("%-9s %5s %4s %7s %8s %7s %8s %8s %9s %7s %5s  %s\n", "fabric", "subs", "slow",
               "rate/s", "intvl_ms", "blocks", "p99_ms", "max_ms", "slow_ms", "slow_bl",
               "lost", "status");
    for (names = tern_tp_fabric_names(); *names; names++)
        if (!strcmp(o.fabric, "all") || !strcmp(o.fabric, *names))
            failed += run_fabric(&o, *names);
    return failed ? 1 : 0;
}
