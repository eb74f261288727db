/* rpcbench blocksync: a fresh node catches up a synthetic chain from 1..k
 * peers over each fabric, against the ceiling of the same link measured
 * in the same run.
 *
 * The chain (tern chain gen's, from a fixed seed) is made once in the
 * chain directory and kept for later runs; k servers, one process each,
 * serve it read-only from that one file; this process is the fresh node
 * (its store on a fresh file beside it), syncing with bs_sync_run. Its
 * rows say the bytes of log moved, checked and committed per second, and
 * how that compares with the ceiling: iperf3 over loopback for tcp, a
 * streaming copy between two processes on two cores (what a shm or
 * emulated-NTB link can move at best) for the others.
 *
 * --staller and --liar add a peer that stalls (answers no range for 60 s)
 * or lies (a bad Merkle root in every range) to the k honest ones. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bs_gen.h"
#include "bs_service.h"
#include "bs_store.h"
#include "bs_sync.h"
#include "bsbench.h"
#include "opt.h"
#include "rpc.h"
#include "spawn.h"

#define MAX_PEERS 8
#define ME "rpcbench blocksync"

struct bs_opts {
    const char *fabric, *dir;
    enum bs_shape shape;
    uint64_t bytes;
    uint64_t peers[MAX_PEERS];
    unsigned n_peers;
    int one_sided;                   /* -1 both, 0 inline, 1 one-sided */
    unsigned workers, depth;
    uint64_t range_max, window;
    size_t max_msg;
    bool json, staller, liar, no_ceiling, verify;
    double ceiling_secs;
};

/* ---- the chain ---- */

static void gen_progress(void *arg, uint64_t blocks, uint64_t bytes)
{
    (void)arg;
    fprintf(stderr, ME ": making the chain: %" PRIu64 " blocks, %" PRIu64 " MiB\n", blocks,
            bytes >> 20);
}

/* The source chain of this shape and size, made if it is not there (or is
 * not whole). */
static int source_chain(const struct bs_opts *o, char *path, size_t len)
{
    struct bs_store_opts ro = {.read_only = true};
    struct bs_store_info info;
    struct bs_hasher *hs;
    struct bs_store *st;
    struct bs_gen g;
    int rc;

    snprintf(path, len, "%s/rpcbench-chain-%s-%" PRIu64 "m.chain", o->dir,
             bs_shape_name(o->shape), o->bytes >> 20);
    if (bs_store_open(path, &ro, &st) == 0) {
        bs_store_info(st, &info);
        bs_store_close(st);
        if (info.data_used >= o->bytes)
            return 0;
    }
    unlink(path);
    hs = bs_hasher_new();
    struct bs_store_opts so = {.size = o->bytes + o->bytes / 8 + (64u << 20), .chain = 0xbe7c4,
                               .create = true};
    rc = hs ? bs_store_open(path, &so, &st) : TERN_ENOMEM;
    if (rc == 0) {
        bs_gen_init(&g, o->shape, 0xbe7c4, 1);
        rc = bs_gen_fill(&g, hs, st, 0, o->bytes, 100, 0, gen_progress, NULL);
        bs_store_close(st);
    }
    bs_hasher_free(hs);
    if (rc < 0)
        fprintf(stderr, ME ": %s: %s\n", path, tern_strerror(rc));
    return rc;
}

/* ---- servers ---- */

struct srv_args {
    const struct bs_opts *o;
    const char *listen, *chain;
    enum bs_fault fault;
};

static volatile sig_atomic_t srv_stop;

static void srv_on_signal(int sig)
{
    (void)sig;
    srv_stop = 1;
}

static int srv_child(void *arg, int fd)
{
    const struct srv_args *a = arg;
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .mode = TERN_TP_POLL_ADAPTIVE,
                                  .max_msg = a->o->max_msg};
    struct bs_store_opts ro = {.read_only = true};
    struct bs_service_opts so = {.fault = a->fault, .stall_ms = 60000};
    struct bs_service *svc = NULL;
    struct bs_store *st = NULL;
    struct tern_rpc_ep *ep = NULL;
    char bound[160];
    int rc;

    rc = bs_store_open(a->chain, &ro, &st);
    if (rc == 0) {
        bs_store_prefault(st);       /* a node that holds the chain has it mapped */
        rc = bs_service_new(st, &so, &svc);
    }
    if (rc == 0)
        rc = tern_rpc_open(&cfg, &ep);
    if (rc == 0)
        rc = tern_rpc_register(ep, bs_service_def(svc));
    if (rc == 0)
        rc = tern_rpc_listen(ep, a->listen, bound, sizeof(bound));
    if (rc == 0 && bs_service_enable_put(svc, ep) < 0)
        fprintf(stderr, ME " server: no one-sided source: ranges go inline\n");
    if (rc < 0) {
        fprintf(stderr, ME " server: %s: %s\n", a->listen, tern_strerror(rc));
        if (write(fd, "-", 2) < 0)
            rc = TERN_EIO;
        return 1;
    }
    signal(SIGTERM, srv_on_signal);
    if (write(fd, bound, strlen(bound) + 1) < 0)
        return 1;
    close(fd);
    while (!srv_stop)
        tern_rpc_run(ep, 100000000);
    tern_rpc_close(ep);
    bs_service_free(svc);
    bs_store_close(st);
    return 0;
}

static double stop_child(pid_t pid)
{
    struct rusage ru;
    int status;
    pid_t got = 0;

    /* A stalling peer is stuck in its handler: it gets two seconds to
     * stop, then SIGKILL. */
    kill(pid, SIGTERM);
    for (int i = 0; i < 200 && (got = wait4(pid, &status, WNOHANG, &ru)) == 0; i++)
        usleep(10000);
    if (got == 0) {
        kill(pid, SIGKILL);
        got = wait4(pid, &status, 0, &ru);
    }
    if (got < 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* ---- ceilings ---- */

/* iperf3 over loopback, one stream, for `secs`: GB/s, or 0 without it. */
static double iperf3_ceiling(double secs)
{
    char cmd[256], buf[65536];
    const char *at;
    double bps = 0;
    size_t n;
    FILE *p;
    int port = 20000 + (int)(getpid() % 20000);

    if (system("command -v iperf3 >/dev/null 2>&1") != 0) {
        fprintf(stderr, ME ": iperf3 not found (apt-get install iperf3): no tcp ceiling\n");
        return 0;
    }
    snprintf(cmd, sizeof(cmd),
             "iperf3 -s -1 -p %d >/dev/null 2>&1 & sleep 0.3; iperf3 -c 127.0.0.1 -p %d -t %.0f "
             "-J 2>/dev/null; wait", port, port, secs < 1 ? 1 : secs);
    p = popen(cmd, "r");
    if (!p)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, p);
    pclose(p);
    buf[n] = 0;
    at = strstr(buf, "\"sum_received\"");
    if (at && (at = strstr(at, "\"bits_per_second\"")))
        bps = strtod(strchr(at, ':') + 1, NULL);
    return bps / 8 / 1e9;
}

/* A streaming copy between two processes on two cores: the writer copies
 * 1 MiB chunks into a ring of shared memory, the reader copies them out,
 * as a server and a node do over shm. GB/s over `bytes`. */
#define CP_CHUNK (1u << 20)
#define CP_SLOTS 16u

struct cp_ring {
    _Atomic uint64_t written, read;
    uint8_t pad[48];
    uint8_t slot[CP_SLOTS][CP_CHUNK];
};

static void pin(int cpu)
{
    cpu_set_t set;

    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

static double copy_ceiling(uint64_t bytes)
{
    uint64_t chunks = bytes / CP_CHUNK, t0;
    struct cp_ring *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                             -1, 0);
    size_t buf_len = 64u << 20;
    uint8_t *buf = malloc(buf_len);
    double secs;
    pid_t pid;

    if (r == MAP_FAILED || !buf || chunks < 16)
        return 0;
    memset(buf, 0x5a, buf_len);
    memset(r->slot, 0, sizeof(r->slot));
    pid = fork();
    if (pid == 0) {
        pin(1);
        for (uint64_t i = 0; i < chunks; i++) {
            while (atomic_load_explicit(&r->written, memory_order_acquire) <= i)
                ;
            memcpy(buf + (i * CP_CHUNK) % buf_len, r->slot[i % CP_SLOTS], CP_CHUNK);
            atomic_store_explicit(&r->read, i + 1, memory_order_release);
        }
        _exit(0);
    }
    pin(0);
    t0 = tern_now_ns();
    for (uint64_t i = 0; i < chunks; i++) {
        while (i - atomic_load_explicit(&r->read, memory_order_acquire) >= CP_SLOTS)
            ;
        memcpy(r->slot[i % CP_SLOTS], buf + (i * CP_CHUNK) % buf_len, CP_CHUNK);
        atomic_store_explicit(&r->written, i + 1, memory_order_release);
    }
    while (atomic_load_explicit(&r->read, memory_order_acquire) < chunks)
        ;
    secs = (double)(tern_now_ns() - t0) / 1e9;
    waitpid(pid, NULL, 0);
    {
        cpu_set_t all;
        CPU_ZERO(&all);
        for (int c = 0; c < CPU_SETSIZE; c++)
            CPU_SET(c, &all);
        sched_setaffinity(0, sizeof(all), &all);
    }
    munmap(r, sizeof(*r));
    free(buf);
    return (double)chunks * CP_CHUNK / secs / 1e9;
}

/* ---- one run ---- */

static void sync_progress(void *arg, const struct bs_sync_progress *p)
{
    (void)arg;
    fprintf(stderr, ME ": %" PRIu64 "/%" PRIu64 " blocks, %.2f GB, %.1f s, %u peers\n",
            p->committed, p->target, (double)p->bytes / 1e9, p->seconds, p->peers);
}

static double cpu_self(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

struct run_result {
    struct bs_sync_stats s;
    double client_cpu, server_cpu;
    int rc;
    bool verified;
};

static int one_run(const struct bs_opts *o, const char *fabric, const char *chain,
                   unsigned honest, bool one_sided, struct run_result *res, char *label,
                   size_t label_len)
{
    char listen[MAX_PEERS + 2][96], tag[48], uris[MAX_PEERS + 2][160], dst[4096];
    const char *peers[MAX_PEERS + 2];
    pid_t pids[MAX_PEERS + 2];
    unsigned n = 0, extra = 0;
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .mode = TERN_TP_POLL_ADAPTIVE,
                                  .max_msg = o->max_msg};
    struct tern_rpc_ep *ep = NULL;
    struct bs_store_opts so = {.size = 0, .chain = 0xbe7c4, .create = true};
    struct bs_store *st = NULL;
    struct bs_store_info si;
    int rc = 0;

    memset(res, 0, sizeof(*res));
    for (unsigned i = 0; i < MAX_PEERS + 2; i++) {
        snprintf(tag, sizeof(tag), "rpcbench-bs-%d-%u", (int)getpid(), i);
        if (tern_tp_local_uri(fabric, tag, listen[i], sizeof(listen[i])) < 0)
            return TERN_ENOFABRIC;
    }
    /* The faulty peers first: they are the first asked. */
    enum bs_fault faults[MAX_PEERS + 2];
    if (o->liar)
        faults[extra++] = BS_FAULT_MERKLE;
    if (o->staller)
        faults[extra++] = BS_FAULT_STALL;
    for (unsigned i = 0; i < honest; i++)
        faults[extra + i] = BS_FAULT_NONE;
    for (n = 0; n < extra + honest; n++) {
        struct srv_args sa = {.o = o, .listen = listen[n], .chain = chain, .fault = faults[n]};

        pids[n] = bench_spawn(srv_child, &sa, uris[n], sizeof(uris[n]));
        if (pids[n] < 0 || strlen(uris[n]) <= 1 || uris[n][0] == '-') {
            fprintf(stderr, ME ": %s server did not start\n", fabric);
            rc = TERN_EIO;
            if (pids[n] > 0)
                n++;
            goto out;
        }
        peers[n] = uris[n];
    }
    tern_tp_uri_label(uris[0], label, label_len);
    snprintf(dst, sizeof(dst), "%s/rpcbench-bs-%d-node.chain", o->dir, (int)getpid());
    unlink(dst);
    {
        struct bs_store_opts ro = {.read_only = true};
        struct bs_store *src;
        if ((rc = bs_store_open(chain, &ro, &src)) < 0)
            goto out;
        bs_store_info(src, &si);
        so.size = si.size;
        so.max_blocks = si.idx_cap;
        bs_store_close(src);
    }
    if ((rc = bs_store_open(dst, &so, &st)) < 0 || (rc = tern_rpc_open(&cfg, &ep)) < 0)
        goto out;
    {
        struct bs_sync_opts sy = {.peers = peers, .n_peers = n, .one_sided = one_sided,
                                  .workers = o->workers, .depth = o->depth,
                                  .range_max = o->range_max, .window = o->window,
                                  .progress = o->json ? NULL : sync_progress,
                                  .progress_ns = 2000000000ull, .stall_ns = 1000000000ull};
        double c0 = cpu_self();

        rc = bs_sync_run(ep, st, &sy, &res->s);
        res->client_cpu = cpu_self() - c0;
    }
    if (rc == 0 && o->verify) {
        struct bs_hasher *hs = bs_hasher_new();
        uint64_t bad;
        const char *why;
        res->verified = hs && bs_store_verify(st, hs, &bad, &why) == 0;
        bs_hasher_free(hs);
    }
out:
    res->rc = rc;
    if (ep)
        tern_rpc_close(ep);
    for (unsigned i = 0; i < n; i++)
        res->server_cpu += stop_child(pids[i]);
    bs_store_close(st);
    unlink(dst);
    return rc;
}

/* ---- output ---- */

static void print_row(const struct bs_opts *o, const char *label, unsigned honest,
                      bool one_sided, const struct run_result *r, double ceiling,
                      const char *ceiling_kind)
{
    double gbps = r->s.seconds > 0 ? (double)r->s.bytes / r->s.seconds / 1e9 : 0;
    double bps = r->s.seconds > 0 ? (double)r->s.blocks / r->s.seconds : 0;
    const char *dropped = NULL;

    for (unsigned i = 0; i < r->s.n_peers; i++)
        if (r->s.peer[i].dropped && !dropped)
            dropped = r->s.peer[i].dropped;
    if (o->json) {
        printf("{\"workload\":\"blocksync\",\"fabric\":\"%s\",\"chain\":\"%s\",\"peers\":%u,"
               "\"blocks\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"seconds\":%.3f,"
               "\"gb_per_s\":%.3f,\"blocks_per_s\":%.0f,", label, bs_shape_name(o->shape),
               honest, r->s.blocks, r->s.bytes, r->s.seconds, gbps, bps);
        if (ceiling > 0)
            printf("\"ceiling_gb_per_s\":%.3f,\"ceiling_ratio\":%.3f,", ceiling, gbps / ceiling);
        else
            printf("\"ceiling_gb_per_s\":null,\"ceiling_ratio\":null,");
        printf("\"ceiling\":\"%s\",\"client_cpu_s\":%.2f,\"server_cpu_s\":%.2f,"
               "\"one_sided\":%s,\"workers\":%u,\"staller\":%s,\"liar\":%s,"
               "\"refetched\":%" PRIu64 ",\"check_s\":%.3f,\"commit_s\":%.3f,"
               "\"dropped\":%s%s%s,\"status\":\"%s\"%s}\n",
               ceiling_kind, r->client_cpu, r->server_cpu, one_sided ? "true" : "false",
               o->workers, o->staller ? "true" : "false", o->liar ? "true" : "false",
               r->s.refetched, r->s.check_seconds, r->s.commit_seconds, dropped ? "\"" : "", dropped ? dropped : "null",
               dropped ? "\"" : "", r->rc ? tern_strerror(r->rc) : "ok",
               o->verify ? (r->verified ? ",\"verified\":true" : ",\"verified\":false") : "");
        fflush(stdout);
        return;
    }
    printf("%-9s %-4s %5u %-6s %9" PRIu64 " %8.2f %7.2f %9.3f %9.0f ", label,
           bs_shape_name(o->shape), honest, one_sided ? "put" : "inline", r->s.blocks,
           (double)r->s.bytes / 1e9, r->s.seconds, gbps, bps);
    if (ceiling > 0)
        printf("%8.3f %6.2f ", ceiling, gbps / ceiling);
    else
        printf("%8s %6s ", "-", "-");
    printf("%7.2f %7.2f %6.2f %6.2f  %s%s%s\n", r->client_cpu, r->server_cpu,
           r->s.check_seconds, r->s.commit_seconds,
           r->rc ? tern_strerror(r->rc) : "ok", dropped ? "; dropped: " : "",
           dropped ? dropped : "");
    fflush(stdout);
}

static int run_all(const struct bs_opts *o)
{
    const char *const *names = tern_tp_fabric_names();
    char chain[4096];
    double copy = 0;
    int failed = 0;
    bool header = !o->json;

    if (source_chain(o, chain, sizeof(chain)) < 0)
        return 1;
    /* On tmpfs the node's store persists as it would on PM: cache-line
     * flushes, not msync (as rpcbench kv and doc do). */
    if (bench_on_tmpfs(o->dir))
        setenv("PMEM_IS_PMEM_FORCE", "1", 1);
    if (!o->no_ceiling)
        copy = copy_ceiling(o->bytes < (2ull << 30) ? o->bytes : (2ull << 30));
    for (; *names; names++) {
        double ceiling;
        const char *kind;

        if (strcmp(o->fabric, "all") != 0 && strcmp(o->fabric, *names) != 0)
            continue;
        if (!strcmp(*names, "tcp")) {
            ceiling = o->no_ceiling ? 0 : iperf3_ceiling(o->ceiling_secs);
            kind = "iperf3 loopback";
        } else {
            ceiling = copy;
            kind = "two-process copy";
        }
        if (header) {
            printf("# blocksync: a fresh node catches up %.2f GB of %s-like chain into %s "
                   "(%s); ceiling GB/s: iperf3 loopback (tcp), two-process copy (others)\n",
                   (double)o->bytes / 1e9, bs_shape_name(o->shape), o->dir,
                   bench_on_tmpfs(o->dir) ? "tmpfs, cache-line flushes as on PM"
                                          : "a file, msync");
            printf("%-9s %-4s %5s %-6s %9s %8s %7s %9s %9s %8s %6s %7s %7s %6s %6s  %s\n",
                   "fabric", "chain", "peers", "path", "blocks", "GB", "s", "GB/s", "blocks/s",
                   "ceiling", "ratio", "cli_cpu", "srv_cpu", "check", "commit", "status");
            header = false;
        }
        for (unsigned p = 0; p < o->n_peers; p++)
            for (int os = 0; os < 2; os++) {
                struct run_result r;
                char label[32];

                if ((o->one_sided == 0 && os) || (o->one_sided == 1 && !os))
                    continue;
                snprintf(label, sizeof(label), "%s", *names);
                if (one_run(o, *names, chain, (unsigned)o->peers[p], os, &r, label,
                            sizeof(label)) == TERN_ENOFABRIC)
                    break;
                print_row(o, label, (unsigned)o->peers[p], os, &r, ceiling, kind);
                failed += r.rc != 0 || (o->verify && !r.verified);
            }
    }
    return failed ? 1 : 0;
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: rpcbench blocksync [--fabric FABRIC|all] [options]\n"
            "  A fresh node catches up a synthetic chain from 1..k peers (one process each,\n"
            "  serving one chain file), against the link's ceiling measured in the same run.\n"
            "  --fabric F         tcp, shm, ntb, rdma or all (default all)\n"
            "  --shape eos|btc    EOS-like (~4.5 KB blocks) or Bitcoin-like (1-1.7 MB)\n"
            "  --bytes SIZE       chain log bytes (default 256m)\n"
            "  --peers K[,K...]   honest peers (default 1,2)\n"
            "  --path inline|put|both  ranges in replies or put by the peer (default both)\n"
            "  --staller          add a peer that stalls; --liar: one that lies\n"
            "  --workers N        checking threads beside the receive loop (default: one\n"
            "                     per core but one, at most 4; 0: the loop checks)\n"
            "  --depth N --window SIZE --range-max SIZE   the syncer's knobs (bs_sync.h)\n"
            "  --max-msg SIZE     RPC message size (default 1m)\n"
            "  --dir DIR          where the chains go (default /dev/shm or $TMPDIR)\n"
            "  --verify           re-check the whole synced chain afterwards\n"
            "  --no-ceiling       skip the ceiling measurements\n"
            "  --json             one JSON object per run\n");
}

int blocksync_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"fabric", required_argument, NULL, 'f'}, {"shape", required_argument, NULL, 's'},
        {"bytes", required_argument, NULL, 'b'},  {"peers", required_argument, NULL, 'p'},
        {"path", required_argument, NULL, 'P'},   {"staller", no_argument, NULL, 'S'},
        {"liar", no_argument, NULL, 'L'},         {"workers", required_argument, NULL, 'w'},
        {"depth", required_argument, NULL, 'd'},  {"window", required_argument, NULL, 'W'},
        {"range-max", required_argument, NULL, 'r'}, {"max-msg", required_argument, NULL, 'm'},
        {"dir", required_argument, NULL, 'D'},    {"verify", no_argument, NULL, 'v'},
        {"no-ceiling", no_argument, NULL, 'n'},   {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    static const char *const shapes[] = {"eos", "btc", NULL};
    static const char *const paths[] = {"inline", "put", "both", NULL};
    static const char *const all[] = {"all", NULL};
    struct bs_opts o = {.fabric = "all", .shape = BS_SHAPE_EOS, .bytes = 256ull << 20,
                        .peers = {1, 2}, .n_peers = 2, .one_sided = -1, .max_msg = 1u << 20,
                        .ceiling_secs = 3, .dir = bench_default_pool_dir(),
                        .workers = bs_sync_auto_workers()};
    uint64_t v;
    int c, k;

    optind = 2;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;

        switch (c) {
        case 'f':
            o.fabric = optarg;
            ok = opt_choice(ME, "--fabric", optarg, tern_tp_fabric_names(), all) >= 0;
            break;
        case 's':
            ok = (k = opt_choice(ME, "--shape", optarg, shapes, NULL)) >= 0;
            o.shape = k == 1 ? BS_SHAPE_BTC : BS_SHAPE_EOS;
            break;
        case 'b': ok = opt_num(ME, "--bytes", optarg, 16u << 20, 1ull << 40, OPT_SIZE, &o.bytes);
            break;
        case 'p':
            o.n_peers = opt_list(ME, "--peers", optarg, 1, MAX_PEERS, 0, o.peers, MAX_PEERS);
            ok = o.n_peers > 0;
            break;
        case 'P':
            ok = (k = opt_choice(ME, "--path", optarg, paths, NULL)) >= 0;
            o.one_sided = k == 2 ? -1 : k;
            break;
        case 'S': o.staller = true; break;
        case 'L': o.liar = true; break;
        case 'w':
            ok = opt_num(ME, "--workers", optarg, 0, 16, 0, &v);
            o.workers = (unsigned)v;
            break;
        case 'd':
            ok = opt_num(ME, "--depth", optarg, 1, 64, 0, &v);
            o.depth = (unsigned)v;
            break;
        case 'W': ok = opt_num(ME, "--window", optarg, 1u << 20, 1ull << 34, OPT_SIZE, &o.window);
            break;
        case 'r':
            ok = opt_num(ME, "--range-max", optarg, 64u << 10, 1ull << 30, OPT_SIZE, &o.range_max);
            break;
        case 'm':
            ok = opt_num(ME, "--max-msg", optarg, 64u << 10, 64u << 20, OPT_SIZE, &v);
            o.max_msg = (size_t)v;
            break;
        case 'D': o.dir = optarg; break;
        case 'v': o.verify = true; break;
        case 'n': o.no_ceiling = true; break;
        case 'j': o.json = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return OPT_USAGE;
        }
        if (!ok)
            return OPT_USAGE;
    }
    if (optind < argc)
        return opt_usage_error(ME, "unexpected argument '%s'", argv[optind]);
    return run_all(&o);
}
