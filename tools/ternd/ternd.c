/* ternd: the tern daemon. It hosts the key-value service (kv.pool), the
 * document service (doc.pool) and, with --chain, the block-sync service
 * (chain.pool: tools/ternd/chain.c) on pools under --data-dir, serves them
 * over tern RPC (TCP, plus shm for clients on this host that come in through
 * auto://), with --resp-port also speaks the Redis protocol on the KV
 * store, and with --mongo-port MongoDB's wire protocol on the document
 * store.
 *
 *   ternd [--data-dir DIR] [--listen URI]... [--no-shm] [--resp-port PORT]
 *         [--mongo-port PORT] [--no-doc] [--doc-pool-size SIZE]
 *         [--pool-size SIZE] [--seg-size SIZE] [--range LO:HI]
 *         [--spin-us N] [--resp-coalesce-us N] [--busy] [--flush-helpers N]
 *         [--chain [--chain-id ID] [--chain-size SIZE] [--chain-peer URI]...
 *          [--chain-producers] [--chain-workers N]]
 *   ternd --help | --version
 *
 * One thread runs everything: RPC handlers and gateway commands touch the
 * stores without locks. When all have been idle for --spin-us it sleeps on
 * one epoll set holding the RPC endpoint's fd and the gateways'. With
 * --flush-helpers, that many more threads take pieces of the store's large
 * flushes (tern_kv_service_help) and touch nothing else. SIGTERM and
 * SIGINT stop it cleanly: clients are closed, the pool is synced and
 * unlocked. SIGHUP is ignored. Once serving it prints one line,
 * "ternd ready ...", on stdout; errors go to stderr. A start that fails
 * (exit 1) removes the pool file it created, if it created one; usage
 * errors exit 2.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tern_config.h"
#if TERN_HAVE_DOC
#include "doc.h"
#include "doc_cmd.h"
#include "doc_service.h"
#include "doc_wire.h"
#include "mongo_gw.h"
#endif
#include "kv.h"
#include "kv_service_internal.h"
#include "kv_store.h"
#include "opt.h"
#include "resp.h"
#include "rpc.h"
#include "ternd_chain.h"

#define MAX_LISTEN 8
#define MAX_HELPERS 64
#define SPIN_MAX_US 1000000u         /* a second: past that --busy is meant */
#define DEFAULT_SEG (1ull << 20)     /* the pool's defaults (pm.h) */
#define DEFAULT_POOL (256ull << 20)
#define POOL_MAX (1ull << 44)

struct opts {
    const char *data_dir;
    const char *listen[MAX_LISTEN];
    unsigned n_listen;
    bool shm, busy;
    int resp_port;                   /* -1: no gateway */
    int mongo_port;                  /* -1: no gateway */
    bool doc;                        /* host the document service */
    uint64_t doc_pool_size;
    uint64_t pool_size;
    uint32_t seg_size;
    uint32_t range_lo, range_hi;
    unsigned spin_us;
    unsigned coalesce_us;
    unsigned helpers;                /* --flush-helpers */
    struct ternd_chain_opts chain;   /* --chain... */
};

static struct tern_rpc_ep *g_ep;
static volatile int g_stop;     /* a sig_atomic_t; the chain's catch-up reads it too */

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
    if (g_ep)
        tern_rpc_stop(g_ep);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ternd [--data-dir DIR] [--listen URI]... [--no-shm] [--resp-port PORT]\n"
            "             [--mongo-port PORT] [--no-doc] [--doc-pool-size SIZE]\n"
            "             [--pool-size SIZE] [--seg-size SIZE] [--range LO:HI]\n"
            "             [--spin-us N] [--resp-coalesce-us N] [--busy] [--flush-helpers N]\n"
            "             [--chain [--chain-id ID] [--chain-size SIZE] [--chain-peer URI]...\n"
            "              [--chain-producers] [--chain-workers N]]\n"
            "       ternd --help | --version\n"
            "  --data-dir DIR    pool files live here (default ./tern-data)\n"
            "  --listen URI      tern RPC address, repeatable up to %d times\n"
            "                    (default tcp://127.0.0.1:7300)\n"
            "  --no-shm          do not offer shared memory to auto:// clients on this host\n"
            "  --resp-port PORT  also serve the Redis protocol on 127.0.0.1:PORT (0: any)\n"
            "  --mongo-port PORT also serve MongoDB's wire protocol on 127.0.0.1:PORT\n"
            "                    (0: any), on the document store\n"
            "  --no-doc          do not host the document service (doc.pool)\n"
            "  --doc-pool-size SIZE  size of a new document pool, k/m/g/t (default 1g, a\n"
            "                    sparse file of 32m segments)\n"
            "  --pool-size SIZE  size of a new pool, k/m/g/t, at least four segments and\n"
            "                    4k (default 256m)\n"
            "  --seg-size SIZE   log segment size of a new pool, a power of two in\n"
            "                    64k..1g (default 1m)\n"
            "  --range LO:HI     the 32-bit key-hash range this server owns (default all)\n"
            "  --spin-us N       poll this long after the last work before sleeping\n"
            "                    (0..%u, default 20)\n"
            "  --resp-coalesce-us N  under load, gather RESP commands this long before\n"
            "                    sleeping; 0 turns it off (0..%u, default 50)\n"
            "  --busy            never sleep (lowest latency, one core always busy)\n"
            "  --flush-helpers N start N threads that take pieces of large flushes off\n"
            "                    the serving thread (PM pools only; 0..%u, default 0)\n"
            "  --chain           host the block-sync service on chain.pool\n"
            "  --chain-id ID     a new chain file's chain id (default 0x7465726e)\n"
            "  --chain-size SIZE a new chain file's size, k/m/g/t (default 1g, sparse)\n"
            "  --chain-peer URI  catch up from this peer once serving; repeatable (%d)\n"
            "  --chain-producers take new blocks from producers (tern chain append --uri)\n"
            "  --chain-workers N threads that check ranges while catching up (default:\n"
            "                    one per core but one, at most 4; 0: the serving thread)\n"
            "  --chain-fault F   for tests: serve ranges badly (stall, merkle, truncate,\n"
            "                    order, parent)\n"
            "SIGTERM and SIGINT stop ternd cleanly; SIGHUP is ignored (it logs to\n"
            "stderr and has no configuration file to reload).\n",
            MAX_LISTEN, SPIN_MAX_US, RESP_COALESCE_MAX_US, MAX_HELPERS, TERND_CHAIN_PEERS);
}

/* "LO:HI", both 32-bit, LO <= HI. */
static bool parse_range(const char *arg, struct opts *o)
{
    const char *colon = strchr(arg, ':');
    uint64_t lo, hi;
    char los[32];

    if (!colon || (size_t)(colon - arg) >= sizeof(los)) {
        fprintf(stderr, "ternd: --range: %s is not LO:HI\n", arg);
        return false;
    }
    snprintf(los, sizeof(los), "%.*s", (int)(colon - arg), arg);
    if (!opt_num("ternd", "--range", los, 0, UINT32_MAX, 0, &lo) ||
        !opt_num("ternd", "--range", colon + 1, 0, UINT32_MAX, 0, &hi))
        return false;
    if (lo > hi) {
        fprintf(stderr, "ternd: --range: %s is empty (LO is above HI)\n", arg);
        return false;
    }
    o->range_lo = (uint32_t)lo;
    o->range_hi = (uint32_t)hi;
    return true;
}

/* A new pool's sizes, checked here because the pool would only say
 * "invalid argument". They do not matter to an existing pool, but a
 * command line that could not create one is wrong all the same. */
static bool check_sizes(struct opts *o, const char *pool_size)
{
    uint64_t seg = o->seg_size ? o->seg_size : DEFAULT_SEG, min;
    char segs[32], mins[32];

    if (seg & (seg - 1)) {
        opt_format(segs, sizeof(segs), seg, OPT_SIZE);
        fprintf(stderr, "ternd: --seg-size: %s is not a power of two\n", segs);
        return false;
    }
    /* The pool's smallest: its 4 KiB header and four segments (one to
     * write to and the reserves). */
    min = 4096 + 4 * seg;
    if (pool_size)
        return opt_num("ternd", "--pool-size", pool_size, min, POOL_MAX, OPT_SIZE,
                       &o->pool_size);
    if (DEFAULT_POOL < min) {
        opt_format(segs, sizeof(segs), seg, OPT_SIZE);
        opt_format(mins, sizeof(mins), 4 * seg, OPT_SIZE);
        fprintf(stderr, "ternd: --seg-size: %s segments need a --pool-size of %s + 4k at "
                "least (four segments and the header; the default is 256m)\n", segs, mins);
        return false;
    }
    return true;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option longs[] = {
        {"data-dir", required_argument, NULL, 'd'}, {"listen", required_argument, NULL, 'l'},
        {"no-shm", no_argument, NULL, 'n'},         {"resp-port", required_argument, NULL, 'r'},
        {"pool-size", required_argument, NULL, 'p'}, {"seg-size", required_argument, NULL, 's'},
        {"range", required_argument, NULL, 'R'},    {"spin-us", required_argument, NULL, 'S'},
        {"resp-coalesce-us", required_argument, NULL, 'C'},
        {"busy", no_argument, NULL, 'b'},           {"help", no_argument, NULL, 'h'},
        {"flush-helpers", required_argument, NULL, 'F'},
        {"mongo-port", required_argument, NULL, 'm'}, {"no-doc", no_argument, NULL, 'N'},
        {"doc-pool-size", required_argument, NULL, 'Z'},
        {"version", no_argument, NULL, 'V'},
        {"chain", no_argument, NULL, 'c'},          {"chain-id", required_argument, NULL, 'I'},
        {"chain-size", required_argument, NULL, 'z'},
        {"chain-peer", required_argument, NULL, 'P'},
        {"chain-producers", no_argument, NULL, 'A'},
        {"chain-workers", required_argument, NULL, 'W'},
        {"chain-fault", required_argument, NULL, 'X'},
        {0},
    };
    const char *pool_size = NULL;
    uint64_t v = 0;
    int c;

    static const char *const faults[] = {"none", "stall", "merkle", "truncate", "order",
                                         "parent", NULL};
    int k;

    *o = (struct opts){.data_dir = "./tern-data", .shm = true, .resp_port = -1, .spin_us = 20,
                         .coalesce_us = 50, .mongo_port = -1, .doc = true,
                         .chain = {.chain = 0x7465726eull, .size = 1ull << 30,
                                   .workers = UINT32_MAX}};
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        bool ok = true;

        switch (c) {
        case 'd': o->data_dir = optarg; break;
        case 'l':
            if (o->n_listen == MAX_LISTEN)
                return opt_usage_error("ternd", "--listen: at most %d addresses", MAX_LISTEN);
            o->listen[o->n_listen++] = optarg;
            break;
        case 'n': o->shm = false; break;
        case 'm':
            ok = opt_num("ternd", "--mongo-port", optarg, 0, 65535, 0, &v);
            o->mongo_port = (int)v;
            break;
        case 'N': o->doc = false; break;
        case 'Z':
            /* 4 KiB of header and four 32 MiB segments at least. */
            ok = opt_num("ternd", "--doc-pool-size", optarg, 4096 + (128ull << 20), POOL_MAX,
                         OPT_SIZE, &o->doc_pool_size);
            break;
        case 'r':
            ok = opt_num("ternd", "--resp-port", optarg, 0, 65535, 0, &v);
            o->resp_port = (int)v;
            break;
        case 'p': pool_size = optarg; break;     /* its least depends on --seg-size */
        case 's':
            ok = opt_num("ternd", "--seg-size", optarg, 64u << 10, 1u << 30, OPT_SIZE, &v);
            o->seg_size = (uint32_t)v;
            break;
        case 'R': ok = parse_range(optarg, o); break;
        case 'S':
            ok = opt_num("ternd", "--spin-us", optarg, 0, SPIN_MAX_US, 0, &v);
            o->spin_us = (unsigned)v;
            break;
        case 'C':
            ok = opt_num("ternd", "--resp-coalesce-us", optarg, 0, RESP_COALESCE_MAX_US, 0,
                         &v);
            o->coalesce_us = (unsigned)v;
            break;
        case 'b': o->busy = true; break;
        case 'F':
            ok = opt_num("ternd", "--flush-helpers", optarg, 0, MAX_HELPERS, 0, &v);
            o->helpers = (unsigned)v;
            break;
        case 'c': o->chain.on = true; break;
        case 'I': ok = opt_num("ternd", "--chain-id", optarg, 1, UINT64_MAX, 0, &o->chain.chain);
            break;
        case 'z':
            ok = opt_num("ternd", "--chain-size", optarg, 8u << 20, POOL_MAX, OPT_SIZE,
                         &o->chain.size);
            break;
        case 'P':
            if (o->chain.n_peers == TERND_CHAIN_PEERS)
                return opt_usage_error("ternd", "--chain-peer: at most %d", TERND_CHAIN_PEERS);
            o->chain.peers[o->chain.n_peers++] = optarg;
            break;
        case 'A': o->chain.producers = true; break;
        case 'W':
            ok = opt_num("ternd", "--chain-workers", optarg, 0, 16, 0, &v);
            o->chain.workers = (unsigned)v;
            break;
        case 'X':
            ok = (k = opt_choice("ternd", "--chain-fault", optarg, faults, NULL)) >= 0;
            o->chain.fault = k;
            break;
        case 'h': usage(stdout); return -1;
        case 'V': opt_version("ternd"); return -1;
        default:                             /* getopt said what */
            fprintf(stderr, "Try 'ternd --help' for the options.\n");
            return OPT_USAGE;
        }
        if (!ok)
            return OPT_USAGE;
    }
    if (optind != argc)
        return opt_usage_error("ternd", "unexpected argument '%s'", argv[optind]);
    if (!check_sizes(o, pool_size))
        return OPT_USAGE;
#if !TERN_HAVE_DOC
    if (o->mongo_port >= 0)
        return opt_usage_error("ternd", "--mongo-port: built without the document service "
                               "(libbson, PCRE2)");
    o->doc = false;
#endif
    if (o->mongo_port >= 0 && !o->doc)
        return opt_usage_error("ternd", "--mongo-port serves the document store: not with --no-doc");
    if (!o->n_listen)
        o->listen[o->n_listen++] = "tcp://127.0.0.1:7300";
    if (!o->chain.on && (o->chain.n_peers || o->chain.producers || o->chain.fault))
        return opt_usage_error("ternd", "the --chain-... options need --chain");
#if !TERN_HAVE_BLOCKSYNC
    if (o->chain.on)
        return opt_usage_error("ternd", "--chain: built without the block-sync service "
                               "(libcrypto, libpmem)");
#endif
    return 0;
}

/* Without a gateway: one epoll set over the endpoint's fd, to sleep on. */
static int make_sleeper(struct tern_rpc_ep *ep)
{
    int fd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN};

    if (fd >= 0 && tern_rpc_wait_fd(ep) >= 0)
        epoll_ctl(fd, EPOLL_CTL_ADD, tern_rpc_wait_fd(ep), &e);
    return fd;
}

/* A gateway (RESP, MongoDB) as the loop sees it. */
struct gw {
    void *g;
    int (*poll)(void *g, int timeout_ms);
    bool (*ready)(void *g);          /* its watched fd was readable */
    int (*watch)(void *g, int fd);
    int (*fd)(void *g);
};

static int resp_poll_(void *g, int t) { return resp_gw_poll(g, t); }
static bool resp_ready_(void *g) { return resp_gw_watch_ready(g); }
static int resp_watch_(void *g, int fd) { return resp_gw_watch_fd(g, fd); }
static int resp_fd_(void *g) { return resp_gw_fd(g); }
#if TERN_HAVE_DOC
static int mongo_poll_(void *g, int t) { return mongo_gw_poll(g, t); }
static bool mongo_ready_(void *g) { return mongo_gw_watch_ready(g); }
static int mongo_watch_(void *g, int fd) { return mongo_gw_watch_fd(g, fd); }
static int mongo_fd_(void *g) { return mongo_gw_fd(g); }
#endif

/* Poll gateway i and those it watches: true if the RPC endpoint's fd was
 * found readable at the end of the chain. */
static bool poll_chain(struct gw *gws, unsigned n, unsigned i, int timeout)
{
    gws[i].poll(gws[i].g, timeout);
    if (!gws[i].ready(gws[i].g))
        return false;
    return i + 1 < n ? poll_chain(gws, n, i + 1, 0) : true;
}

/* The loop. RPC is "hot" for --spin-us after its last event: it is polled
 * every round (its fabrics are polled without system calls where they can
 * be), and the gateways every 16th. Once RPC is quiet the thread blocks in
 * the first gateway's epoll, which watches the next gateway's epoll fd,
 * and the last watches the endpoint's fd: a gateway-only load costs one
 * epoll_wait per batch, as in Redis. */
static void serve(const struct opts *o, struct tern_rpc_ep *ep, struct gw *gws, unsigned ngw)
{
    uint64_t spin = (uint64_t)o->spin_us * 1000u, last_rpc = tern_now_ns();
    int sleeper = -1;
    unsigned tick = 0;

    if (ngw && !o->busy && tern_rpc_wait_fd(ep) >= 0) {
        for (unsigned i = 0; i + 1 < ngw; i++)
            gws[i].watch(gws[i].g, gws[i + 1].fd(gws[i + 1].g));
        gws[ngw - 1].watch(gws[ngw - 1].g, tern_rpc_wait_fd(ep));
    } else if (!ngw && !o->busy) {
        sleeper = make_sleeper(ep);
    }
    while (!g_stop) {
        bool hot = o->busy || tern_now_ns() - last_rpc < spin;
        int n = 0;

        if (hot || !ngw) {
            n = tern_rpc_poll(ep);
            if (n > 0)
                last_rpc = tern_now_ns();
        }
        if (ngw && (!hot || (++tick & 15) == 0)) {
            int timeout = 0;

            /* Block only when RPC is quiet and armed; if it has work
             * owed, poll it hot instead. */
            if (!hot) {
                if (tern_rpc_arm(ep) == 0)
                    timeout = 100;
                else
                    last_rpc = tern_now_ns();
            }
            if (hot) {
                for (unsigned i = 0; i < ngw; i++)
                    gws[i].poll(gws[i].g, 0);
            } else if (poll_chain(gws, ngw, 0, timeout)) {
                last_rpc = tern_now_ns();   /* RPC work: poll it hot again */
            }
            continue;
        }
        if (n > 0 || sleeper < 0 || hot)
            continue;
        if (tern_rpc_arm(ep) == 0) {
            struct epoll_event e;

            epoll_wait(sleeper, &e, 1, 100);
        }
        last_rpc = tern_now_ns();
    }
    if (sleeper >= 0)
        close(sleeper);
}

/* ---- flush helpers ---- */

/* A commit's pieces come in a burst, and a helper asleep when it starts
 * finds them taken (the serving thread runs them itself): after a piece, a
 * helper keeps polling for 1 ms, longer than it takes to receive and store
 * the next large value (~0.6 ms for 900 KiB, measured), then naps between
 * polls, 30 us at first, twice as long after each empty one up to 1 ms,
 * so that an idle helper costs about 1% of a core (measured on a VM), not
 * a whole one. */
#define HELPER_SPIN_NS 1000000
#define HELPER_NAP_NS 30000
#define HELPER_NAP_MAX_NS 1000000

static pthread_t g_helper[MAX_HELPERS];
static unsigned g_n_helpers;
static bool g_helpers_stop;

static inline void cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *helper_main(void *arg)
{
    struct tern_kv_service *svc = arg;
    uint64_t last = tern_now_ns();
    long nap = HELPER_NAP_NS;
    unsigned polls = 0;

    while (!__atomic_load_n(&g_helpers_stop, __ATOMIC_RELAXED)) {
        if (tern_kv_service_help(svc) > 0) {
            last = tern_now_ns();
            nap = HELPER_NAP_NS;
        } else if ((++polls & 255) || tern_now_ns() - last < HELPER_SPIN_NS) {
            cpu_pause();
        } else {
            nanosleep(&(struct timespec){.tv_nsec = nap}, NULL);
            nap = nap * 2 < HELPER_NAP_MAX_NS ? nap * 2 : HELPER_NAP_MAX_NS;
        }
    }
    return NULL;
}

/* Helpers block SIGTERM and SIGINT: the serving thread's handler must run,
 * as it is the one to wake. */
static int start_helpers(struct tern_kv_service *svc, unsigned n)
{
    sigset_t stop, old;
    int rc = 0;

    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, &old);
    while (g_n_helpers < n && rc == 0) {
        rc = pthread_create(&g_helper[g_n_helpers], NULL, helper_main, svc);
        if (rc == 0)
            g_n_helpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return -rc;
}

/* Before the service goes: tern_kv_service_help must not run past it. */
static void stop_helpers(void)
{
    __atomic_store_n(&g_helpers_stop, true, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < g_n_helpers; i++)
        pthread_join(g_helper[i], NULL);
    g_n_helpers = 0;
}

int main(int argc, char **argv)
{
    struct tern_rpc_config cfg = {.mode = TERN_TP_POLL_ADAPTIVE};
    struct tern_kv_service_opts ko = {0};
    struct tern_kv_service *svc = NULL;
    struct resp_gw *gw = NULL;
#if TERN_HAVE_DOC
    struct mongo_gw *mgw = NULL;
    struct doc_store *dstore = NULL;
    struct doc_server *dsrv = NULL;
    struct tern_doc_service *dsvc = NULL;
#endif
    struct ternd_chain *chain = NULL;
    struct gw gws[2];
    unsigned ngw = 0;
    struct kvs_stats st;
    char pool[4096], bound[256], line[1400];
    bool made_dir, new_pool;
#if TERN_HAVE_DOC
    char dpool[4096];
    bool new_dpool = false;
#endif
    struct stat pst;
    struct opts o;
    size_t at;
    int rc;

    /* A hang-up of the terminal or of a supervisor that sends SIGHUP for
     * "reload" must not stop the store: there is nothing to reload (no
     * configuration file; logs go to stderr). */
    signal(SIGHUP, SIG_IGN);
    rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;       /* -1: --help or --version */
    made_dir = mkdir(o.data_dir, 0700) == 0;
    if (!made_dir && errno != EEXIST) {
        fprintf(stderr, "ternd: %s: %s\n", o.data_dir, strerror(errno));
        return 1;
    }
    snprintf(pool, sizeof(pool), "%s/kv.pool", o.data_dir);
    new_pool = stat(pool, &pst) < 0 && errno == ENOENT;
    ko = (struct tern_kv_service_opts){.pool_path = pool, .pool_size = o.pool_size,
                                       .seg_size = o.seg_size, .range_lo = o.range_lo,
                                       .range_hi = o.range_hi};
    rc = tern_kv_service_open(&ko, &svc);
    if (rc < 0) {
        fprintf(stderr, "ternd: pool %s: %s\n", pool, tern_strerror(rc));
        if (rc == TERN_ECORRUPT)
            fprintf(stderr, "ternd: run `tern pool check %s` for the offset; the file was "
                    "left as it is\n", pool);
        if (made_dir)
            rmdir(o.data_dir);
        return 1;
    }
#if TERN_HAVE_DOC
    /* The document store, its commands (shared by RPC and the MongoDB
     * gateway) and its RPC service. */
    if (o.doc) {
        struct doc_store_opts dso = {.pool_size = o.doc_pool_size, .create = true};
        struct doc_err de = {0};

        snprintf(dpool, sizeof(dpool), "%s/doc.pool", o.data_dir);
        new_dpool = stat(dpool, &pst) < 0 && errno == ENOENT;
        rc = doc_store_open(dpool, &dso, &dstore, &de);
        if (rc < 0)
            fprintf(stderr, "ternd: document pool %s: %s\n", dpool, de.msg);
        if (rc == 0 && (rc = doc_server_open(dstore, NULL, &dsrv)) < 0)
            fprintf(stderr, "ternd: document service: %s\n", tern_strerror(rc));
        if (rc == 0 && (rc = doc_service_new(dsrv, 0, &dsvc)) < 0)
            fprintf(stderr, "ternd: document service: %s\n", tern_strerror(rc));
        if (rc < 0) {
            doc_server_close(dsrv);
            doc_store_close(dstore);
            tern_kv_service_close(svc);
            if (new_dpool)
                unlink(dpool);
            if (new_pool)
                unlink(pool);
            if (made_dir)
                rmdir(o.data_dir);
            return 1;
        }
    }
#endif
    if (o.chain.on && ternd_chain_open(&o.chain, o.data_dir, &chain) < 0) {
#if TERN_HAVE_DOC
        tern_doc_service_close(dsvc);
        doc_server_close(dsrv);
        doc_store_close(dstore);
        if (new_dpool)
            unlink(dpool);
#endif
        tern_kv_service_close(svc);
        if (new_pool)
            unlink(pool);
        if (made_dir)
            rmdir(o.data_dir);
        return 1;
    }
    if (o.busy)
        cfg.mode = TERN_TP_POLL_BUSY;
    rc = tern_rpc_open(&cfg, &g_ep);
    if (rc == 0 && chain)
        rc = ternd_chain_register(chain, g_ep);
    if (rc == 0)
        rc = tern_rpc_register(g_ep, tern_kv_service_def(svc));
#if TERN_HAVE_DOC
    if (rc == 0 && dsvc)
        rc = tern_rpc_register(g_ep, tern_doc_service_def(dsvc));
    /* Writers of one poll share a flush. */
    if (rc == 0 && dsvc)
        rc = tern_doc_service_group_commit(dsvc, g_ep);
#endif
    /* Clients that ask for the one-sided paths (tern_kv_set_path) get them. */
    if (rc == 0 && (rc = tern_kv_service_enable_onesided(svc, g_ep, NULL)) < 0)
        fprintf(stderr, "ternd: one-sided paths: %s\n", tern_strerror(rc));
#if TERN_HAVE_DOC
    /* Large document results go one-sided to clients that take them. */
    if (rc == 0 && dsvc && (rc = tern_doc_service_enable_onesided(dsvc, g_ep, 0)) < 0)
        fprintf(stderr, "ternd: document one-sided batches: %s\n", tern_strerror(rc));
#endif
    at = (size_t)snprintf(line, sizeof(line), "ternd ready");
    for (unsigned i = 0; rc == 0 && i < o.n_listen; i++) {
        rc = tern_rpc_listen(g_ep, o.listen[i], bound, sizeof(bound));
        if (rc < 0)
            fprintf(stderr, "ternd: listen %s: %s\n", o.listen[i], tern_strerror(rc));
        else if (at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " %s", bound);
    }
    /* Same-host clients that come in by auto:// move to shared memory. */
    if (rc == 0 && o.shm) {
        rc = tern_rpc_listen(g_ep, "shm://auto", bound, sizeof(bound));
        if (rc < 0)
            fprintf(stderr, "ternd: listen shm: %s\n", tern_strerror(rc));
        else if (at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " %s", bound);
    }
    if (rc == 0 && o.resp_port >= 0) {
        struct resp_config rc_cfg = {.port = (uint16_t)o.resp_port,
                                          .coalesce_us = o.coalesce_us};

        rc = resp_gw_create(kv_service_store(svc), &rc_cfg, &gw);
        if (rc < 0)
            fprintf(stderr, "ternd: --resp-port: 127.0.0.1:%d: %s\n", o.resp_port,
                    tern_strerror(rc));
        else if (at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " resp=127.0.0.1:%u",
                                   resp_gw_port(gw));
    }
#if TERN_HAVE_DOC
    if (rc == 0 && o.mongo_port >= 0) {
        struct mongo_gw_config mc = {.port = (uint16_t)o.mongo_port};

        rc = mongo_gw_create(dsrv, &mc, &mgw);
        if (rc < 0)
            fprintf(stderr, "ternd: --mongo-port: 127.0.0.1:%d: %s\n", o.mongo_port,
                    tern_strerror(rc));
        else if (at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " mongo=127.0.0.1:%u",
                                   mongo_gw_port(mgw));
    }
#endif
    if (rc == 0 && (rc = start_helpers(svc, o.helpers)) < 0)
        fprintf(stderr, "ternd: flush helpers: %s\n", tern_strerror(rc));
    if (rc < 0) {
        stop_helpers();
#if TERN_HAVE_DOC
        mongo_gw_destroy(mgw);
#endif
        resp_gw_destroy(gw);
        tern_rpc_close(g_ep);
#if TERN_HAVE_DOC
        tern_doc_service_close(dsvc);
        doc_server_close(dsrv);
        doc_store_close(dstore);
        if (new_dpool)
            unlink(dpool);
#endif
        ternd_chain_close(chain, true);
        tern_kv_service_close(svc);
        /* A pool this run created holds nothing yet: a start that failed
         * (an address in use, a typo in --listen) leaves no file behind.
         * The service had it locked until now, so it was ours. */
        if (new_pool)
            unlink(pool);
        if (made_dir)
            rmdir(o.data_dir);
        return 1;
    }
    kvs_get_stats(kv_service_store(svc), &st);
    if (at < sizeof(line))
        at += (size_t)snprintf(line + at, sizeof(line) - at, " pool=%.900s keys=%llu persist=%s",
                               pool, (unsigned long long)st.keys,
                               st.pool.is_pmem ? "flush" : "msync");
#if TERN_HAVE_DOC
    if (dstore && at < sizeof(line)) {
        struct doc_store_info di;

        doc_store_info(dstore, &di);
        at += (size_t)snprintf(line + at, sizeof(line) - at, " doc=%.300s documents=%llu",
                               dpool, (unsigned long long)di.documents);
    }
#endif
    if (chain && at < sizeof(line))
        ternd_chain_ready(chain, line + at, sizeof(line) - at);
    printf("%s\n", line);
    fflush(stdout);

    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    /* Catch up from the chain's peers, serving everyone on RPC meanwhile
     * (the gateways wait until it is done). */
    if (chain)
        ternd_chain_catch_up(chain, g_ep, &g_stop);
#if TERN_HAVE_DOC
    if (mgw)
        gws[ngw++] = (struct gw){mgw, mongo_poll_, mongo_ready_, mongo_watch_, mongo_fd_};
#endif
    if (gw)
        gws[ngw++] = (struct gw){gw, resp_poll_, resp_ready_, resp_watch_, resp_fd_};
    serve(&o, g_ep, gws, ngw);

    stop_helpers();
#if TERN_HAVE_DOC
    mongo_gw_destroy(mgw);
#endif
    resp_gw_destroy(gw);
    tern_rpc_close(g_ep);
#if TERN_HAVE_DOC
    tern_doc_service_close(dsvc);
    doc_server_close(dsrv);
    doc_store_close(dstore);
#endif
    ternd_chain_close(chain, false);
    tern_kv_service_close(svc);
    fprintf(stderr, "ternd: stopped\n");
    return 0;
}
