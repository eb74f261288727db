/* rpcbench: round-trip latency and throughput of tern RPCs.
 *
 *   rpcbench echo   [options]           server + client on this host
 *   rpcbench server --listen URI        server only
 *   rpcbench client --connect URI [opts] client only
 *   rpcbench get|put [--served]         one-sided latency (transport level)
 *   rpcbench kv     [options]           YCSB workloads on the key-value service (kv.c)
 *   rpcbench doc    [options]           YCSB-style work on the document service (doc.c)
 *   rpcbench blocksync [options]        chain catch-up from 1..k peers (blocksync.c)
 *   rpcbench feed   [options]           the block feed: N subscribers, a generator (feed.c)
 *   rpcbench --help | --version
 *
 * The echo service answers every request with its own payload. The client
 * keeps `window` calls in flight, times each round trip into a fixed-size
 * histogram, and prints a table row (or a JSON object with --json) per
 * (size, window) pair of the sweep.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "floor.h"
#include "hist.h"
#include "bsbench.h"
#include "docbench.h"
#include "kvbench.h"
#include "onesided.h"
#include "opt.h"
#include "spawn.h"
#include "rpc.h"
#include "tern_config.h"

#define SVC_BENCH 0x7b01
#define M_ECHO 1
#define M_STATS 2
#define M_SINK 3
#define M_BUSY 4

uint64_t bench_busy_ns;
#define MAX_SWEEP 16

struct opts {
    const char *fabric, *listen, *connect;
    const char *also_listen[4];  /* server: further --listen URIs */
    unsigned n_also;
    const char *workload;        /* "echo" or "sink" */
    const char *eal;             /* probe: DPDK EAL arguments for ntb */
    size_t sizes[MAX_SWEEP];
    unsigned n_sizes;
    unsigned windows[MAX_SWEEP];
    unsigned n_windows;
    uint64_t iters;
    bool json, adaptive, served;
    int cpu_client, cpu_server;
};

/* ---- server ---- */

long rss_kb(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static int h_echo(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, len);

    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, data, len);
    return 0;
}

/* One-way traffic: the request carries the payload, the reply is empty.
 * The handler reads every byte, as a real service would: without it a
 * zero-copy fabric would count data that never reached the server's core
 * (the rings stay in the sender's cache), and a comparison with a library
 * that copies into the receiver's buffer would flatter tern. */
static volatile uint64_t sink_sum;

/* Sum of `len` bytes as 64-bit words, a cache line per step in four
 * independent vector sums: the load of each line is what it costs, not a
 * chain of dependent adds. */
static uint64_t sum_bytes(const uint8_t *p, size_t len)
{
    typedef uint64_t u64x2 __attribute__((vector_size(16)));
    u64x2 s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0, v;
    uint64_t sum = 0;
    size_t i = 0;

    for (; i + 64 <= len; i += 64) {
        memcpy(&v, p + i, 16);
        s0 += v;
        memcpy(&v, p + i + 16, 16);
        s1 += v;
        memcpy(&v, p + i + 32, 16);
        s2 += v;
        memcpy(&v, p + i + 48, 16);
        s3 += v;
    }
    s0 += s1 + s2 + s3;
    sum = s0[0] + s0[1];
    for (; i < len; i++)
        sum += p[i];
    return sum;
}

static int h_sink(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    sink_sum += sum_bytes(data, len);
    return 0;
}

static int h_stats(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    long *out = tern_reply_alloc(req, sizeof(long));

    if (!out)
        return TERN_EMSGSIZE;
    *out = rss_kb();
    return 0;
}

static int h_busy(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint64_t *out = tern_reply_alloc(req, sizeof(*out));

    if (!out)
        return TERN_EMSGSIZE;
    *out = bench_busy_ns;
    return 0;
}

static const struct tern_method bench_methods[] = {
    {.id = M_ECHO, .name = "echo", .handler = h_echo},
    {.id = M_STATS, .name = "stats", .handler = h_stats},
    {.id = M_SINK, .name = "sink", .handler = h_sink},
    {.id = M_BUSY, .name = "busy", .handler = h_busy},
};

const struct tern_service bench_service = {
    .name = "rpcbench", .id = SVC_BENCH, .methods = bench_methods,
    .n_methods = sizeof(bench_methods) / sizeof(bench_methods[0]),
};

static struct tern_rpc_ep *server_ep;

static void on_signal(int sig)
{
    if (server_ep)
        tern_rpc_stop(server_ep);
}

static struct tern_rpc_config rpc_config(const struct opts *o, size_t max_size)
{
    return (struct tern_rpc_config){
        .mode = o->adaptive ? TERN_TP_POLL_ADAPTIVE : TERN_TP_POLL_BUSY,
        .max_msg = max_size < (1u << 20) ? (1u << 20) : max_size,
        .credits = 256,
    };
}

static size_t max_size(const struct opts *o)
{
    size_t m = 0;

    for (unsigned i = 0; i < o->n_sizes; i++)
        if (o->sizes[i] > m)
            m = o->sizes[i];
    return m;
}

/* Listen on `uri`, report the bound URI on `report_fd` (if >= 0) and serve
 * until SIGTERM/SIGINT. */
static int run_server(const struct opts *o, const char *uri, int report_fd)
{
    struct tern_rpc_config cfg = rpc_config(o, max_size(o));
    char bound[160];
    int rc;

    bench_pin(o->cpu_server);
    rc = tern_rpc_open(&cfg, &server_ep);
    if (rc == 0)
        rc = tern_rpc_register(server_ep, &bench_service);
    if (rc == 0 && strncmp(uri, "auto://", 7) == 0) {
        /* auto: listen on TCP for the handshake and on every same-host
         * fabric; clients move to the best one. */
        char tcp[160];

        snprintf(tcp, sizeof(tcp), "tcp://%s", uri + 7);
        rc = tern_rpc_listen(server_ep, tcp, bound, sizeof(bound));
        if (rc == 0)
            rc = tern_rpc_listen(server_ep, "shm://auto", NULL, 0);
        if (rc == 0) {                  /* "tcp://h:p" -> "auto://h:p" */
            snprintf(tcp, sizeof(tcp), "%.150s", bound + 6);
            snprintf(bound, sizeof(bound), "auto://%.150s", tcp);
        }
    } else if (rc == 0) {
        rc = tern_rpc_listen(server_ep, uri, bound, sizeof(bound));
    }
    /* More addresses (say an NTB cable's partition beside auto://). */
    for (unsigned i = 0; rc == 0 && report_fd < 0 && i < o->n_also; i++)
        if ((rc = tern_rpc_listen(server_ep, o->also_listen[i], NULL, 0)) < 0)
            uri = o->also_listen[i];
    if (rc < 0) {
        fprintf(stderr, "rpcbench server: %s: %s\n", uri, tern_strerror(rc));
        if (report_fd >= 0 && write(report_fd, "-", 1) < 0)
            return 1;
        return 1;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    if (report_fd >= 0) {
        size_t n = strlen(bound) + 1;

        if (write(report_fd, bound, n) != (ssize_t)n)
            return 1;
        close(report_fd);
    } else {
        printf("rpcbench server listening on %s\n", bound);
        fflush(stdout);
    }
    tern_rpc_run(server_ep, -1);
    tern_rpc_close(server_ep);
    return 0;
}

/* ---- client ---- */

struct slot {
    struct bench *b;
    uint64_t start;
    uint8_t *buf;
};

struct bench {
    struct tern_session *s;
    size_t size, reply_size;
    uint16_t method;
    uint64_t issued, done, warmup, target;
    int error;
    struct hist *hist;
    struct slot *slots;
};

static void issue(struct slot *sl, uint64_t now);

static void on_reply(void *arg, int status, const void *reply, size_t len)
{
    struct slot *sl = arg;
    struct bench *b = sl->b;
    uint64_t now = tern_now_ns();

    if (status < 0 || len != b->reply_size) {
        if (!b->error)
            b->error = status < 0 ? status : TERN_EPROTO;
        return;
    }
    if (b->done++ >= b->warmup)
        hist_add(b->hist, now - sl->start);
    /* The reply's arrival time is the next call's start: one clock read
     * per call, as ucx_perftest does. */
    if (b->issued < b->target && !b->error)
        issue(sl, now);
}

static void issue(struct slot *sl, uint64_t now)
{
    struct bench *b = sl->b;
    int rc;

    sl->start = now;
    b->issued++;
    rc = tern_call(b->s, SVC_BENCH, b->method, sl->buf, b->size, 10ull * 1000000000u, on_reply,
                   sl, NULL);
    if (rc < 0 && !b->error)
        b->error = rc;
}

uint64_t server_busy_ns(struct tern_session *s)
{
    uint64_t v = 0;
    size_t len;

    if (tern_call_sync(s, SVC_BENCH, M_BUSY, NULL, 0, &v, sizeof(v), &len, 2000000000ull) < 0)
        return 0;
    return v;
}

void bench_serve_busy(struct tern_rpc_ep *ep, volatile sig_atomic_t *stop)
{
    while (!*stop) {
        uint64_t t0 = tern_now_ns();

        if (tern_rpc_poll(ep) > 0)
            bench_busy_ns += tern_now_ns() - t0;
    }
}

long server_rss(struct tern_session *s)
{
    long v = 0;
    size_t len;

    if (tern_call_sync(s, SVC_BENCH, M_STATS, NULL, 0, &v, sizeof(v), &len, 2000000000ull) < 0)
        return -1;
    return v;
}

void bench_print_header(const char *extra)
{
    printf("%-8s %-8s %6s %6s %10s %9s %9s %9s %9s %11s %9s%s\n", "workload", "fabric", "size",
           "window", "iters", "p50_us", "p90_us", "p99_us", "p99.9_us", "ops/s", "MB/s",
           extra ? extra : "");
}

void bench_print(bool json, const struct result *r)
{
    double ops = (double)r->iters / r->secs, mbs = ops * (double)r->size / 1e6;
    const struct hist *h = r->hist;

    if (json) {
        printf("{\"workload\":\"%s\",\"fabric\":\"%s\",\"size\":%zu,\"window\":%u,"
               "\"iters\":%llu,\"p50_ns\":%llu,\"p90_ns\":%llu,\"p99_ns\":%llu,"
               "\"p999_ns\":%llu,\"min_ns\":%llu,\"max_ns\":%llu,\"mean_ns\":%.0f,"
               "\"ops_per_s\":%.0f,\"mb_per_s\":%.2f,\"client_rss_kb\":[%ld,%ld],"
               "\"server_rss_kb\":[%ld,%ld]%s}\n",
               r->workload, r->fabric, r->size, r->window, (unsigned long long)r->iters,
               (unsigned long long)hist_quantile(h, 0.5), (unsigned long long)hist_quantile(h, 0.9),
               (unsigned long long)hist_quantile(h, 0.99),
               (unsigned long long)hist_quantile(h, 0.999), (unsigned long long)h->min,
               (unsigned long long)h->max, h->count ? h->sum / (double)h->count : 0.0, ops, mbs,
               r->rss[0], r->rss[1], r->srv_rss[0], r->srv_rss[1],
               r->json_extra ? r->json_extra : "");
    } else {
        printf("%-8s %-8s %6zu %6u %10llu %9.2f %9.2f %9.2f %9.2f %11.0f %9.2f%s\n",
               r->workload, r->fabric, r->size, r->window, (unsigned long long)r->iters,
               hist_quantile(h, 0.5) / 1e3, hist_quantile(h, 0.9) / 1e3,
               hist_quantile(h, 0.99) / 1e3, hist_quantile(h, 0.999) / 1e3, ops, mbs,
               r->row_extra ? r->row_extra : "");
    }
    fflush(stdout);
}

static void print_result(const struct opts *o, const struct result *r, bool header)
{
    if (header && !o->json)
        bench_print_header(NULL);
    bench_print(o->json, r);
}

static int bench_one(const struct opts *o, struct tern_rpc_ep *ep, struct tern_session *s,
                     const char *fabric, size_t size, unsigned window, bool header,
                     uint64_t *p50)
{
    static struct hist hist;
    bool sink = strcmp(o->workload, "sink") == 0;
    struct bench b = {.s = s, .size = size, .hist = &hist, .method = sink ? M_SINK : M_ECHO,
                      .reply_size = sink ? 0 : size};
    struct result r = {.workload = o->workload, .fabric = fabric, .size = size,
                       .window = window, .hist = &hist};
    uint64_t t0, t_last, t_end;
    bool tty = isatty(2);
    int rc = 0;

    if (window > tern_session_credits(s))
        window = tern_session_credits(s);
    r.window = window;
    hist_reset(&hist);
    b.warmup = o->iters / 10 < 10000 ? o->iters / 10 : 10000;
    b.target = o->iters + b.warmup;
    b.slots = calloc(window, sizeof(*b.slots));
    for (unsigned i = 0; b.slots && i < window; i++) {
        b.slots[i].b = &b;
        b.slots[i].buf = malloc(size ? size : 1);
        if (!b.slots[i].buf)
            return TERN_ENOMEM;
        memset(b.slots[i].buf, (int)(i + 1), size);
    }
    if (!b.slots)
        return TERN_ENOMEM;
    r.srv_rss[0] = server_rss(s);
    r.rss[0] = rss_kb();
    t0 = t_last = tern_now_ns();
    for (unsigned i = 0; i < window && b.issued < b.target; i++)
        issue(&b.slots[i], tern_now_ns());
    while (b.done < b.target && !b.error) {
        tern_rpc_poll(ep);
        /* A progress line each second on a terminal, each 10 s in a log. */
        if (((b.done & 0xfff) == 0) &&
            tern_now_ns() - t_last > (tty ? 1000000000ull : 10000000000ull)) {
            t_last = tern_now_ns();
            fprintf(stderr, "%s%s %zuB w%u: %llu/%llu calls%s", tty ? "\r" : "", fabric, size,
                    window, (unsigned long long)b.done, (unsigned long long)b.target,
                    tty ? "" : "\n");
        }
        if (b.done == b.warmup && hist.count == 0)
            t0 = tern_now_ns();
    }
    t_end = tern_now_ns();
    if (tty && t_end - t0 > 1000000000ull)
        fprintf(stderr, "\r%60s\r", "");
    if (b.error) {
        fprintf(stderr, "rpcbench: %s size %zu window %u: %s\n", fabric, size, window,
                tern_strerror(b.error));
        rc = b.error;
    } else {
        r.rss[1] = rss_kb();
        r.srv_rss[1] = server_rss(s);
        r.iters = hist.count;
        r.secs = (double)(t_end - t0) / 1e9;
        print_result(o, &r, header);
        if (p50)
            *p50 = hist_quantile(&hist, 0.5);
    }
    /* Drain calls still in flight after an error before freeing buffers. */
    while (tern_rpc_calls_in_flight(ep) && tern_session_status(s) == 0)
        tern_rpc_poll(ep);
    for (unsigned i = 0; i < window; i++)
        free(b.slots[i].buf);
    free(b.slots);
    return rc;
}

static int run_client(const struct opts *o, const char *uri, bool header)
{
    struct tern_rpc_config cfg = rpc_config(o, max_size(o));
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    char fabric[16] = "?";
    int rc;

    bench_pin(o->cpu_client);
    rc = tern_rpc_open(&cfg, &ep);
    if (rc < 0)
        return rc;
    rc = tern_rpc_connect(ep, uri, 5000000000ull, &s);
    if (rc < 0) {
        fprintf(stderr, "rpcbench: connect %s: %s\n", uri, tern_strerror(rc));
        tern_rpc_close(ep);
        return rc;
    }
    /* With auto:// this is the fabric the selection chose; results say
     * when it runs on an emulated device ("ntb-emu", "rdma-emu"). */
    if (tern_tp_uri_fabric(uri) >= 0)
        tern_tp_uri_label(uri, fabric, sizeof(fabric));
    else
        snprintf(fabric, sizeof(fabric), "%s", tern_session_fabric(s));
    for (unsigned i = 0; i < o->n_sizes && rc == 0; i++)
        for (unsigned w = 0; w < o->n_windows && rc == 0; w++, header = false)
            rc = bench_one(o, ep, s, fabric, o->sizes[i], o->windows[w], header, NULL);
    tern_rpc_close(ep);
    return rc;
}

int bench_echo(struct tern_rpc_ep *ep, struct tern_session *s, const char *fabric,
               size_t size, unsigned window, uint64_t iters, bool json, uint64_t *p50)
{
    struct opts o = {.workload = "echo", .iters = iters, .json = json};

    return bench_one(&o, ep, s, fabric, size, window, false, p50);
}

struct server_args {
    const struct opts *o;
    const char *listen;
};

static int server_child(void *arg, int fd)
{
    const struct server_args *sa = arg;

    return run_server(sa->o, sa->listen, fd);
}

/* Fork a server on this host, wait for its address, run the client. */
static int run_local(const struct opts *o)
{
    const char *const *names = tern_tp_fabric_names();
    bool header = true;
    int failed = 0;

    static const char *const auto_only[] = {"auto", NULL};

    if (strcmp(o->fabric, "auto") == 0)
        names = auto_only;
    for (; *names; names++) {
        char uri[160], listen[64], tag[32];
        struct server_args sa;
        int status;
        pid_t pid;

        if (strcmp(o->fabric, "all") != 0 && strcmp(o->fabric, *names) != 0)
            continue;
        snprintf(tag, sizeof(tag), "rpcbench-%d", (int)getpid());
        if (names == auto_only)
            snprintf(listen, sizeof(listen), "auto://127.0.0.1:0");
        else if (tern_tp_local_uri(*names, tag, listen, sizeof(listen)) < 0)
            continue;
        sa = (struct server_args){o, listen};
        pid = bench_spawn(server_child, &sa, uri, sizeof(uri));
        if (pid < 0)
            return 1;
        if (strlen(uri) <= 1 || uri[0] == '-') {
            fprintf(stderr, "rpcbench: %s server did not start\n", *names);
            failed++;
        } else if (run_client(o, uri, header) < 0) {
            failed++;
        }
        header = o->json;
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
    }
    return failed ? 1 : 0;
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: rpcbench echo   [--fabric FABRIC|auto|all] [options]\n"
            "       rpcbench sink   [...]     like echo, but one-way: the server reads every byte, replies are empty\n"
            "       rpcbench server --listen URI [--listen URI]... [--adaptive]\n"
            "       rpcbench client --connect URI [options]\n"
            "       rpcbench floor  [--iters N] [--cpu C,S]   cache-line ping-pong floor\n"
            "       rpcbench get|put [--fabric FABRIC] [--size N] [--served]\n"
            "                        one-sided latency, window 1; --served: the owner\n"
            "                        registers its own memory (no direct access)\n"
            "       rpcbench probe  --fabric FABRIC [--eal 'EAL ARGS']   is the hardware there?\n"
            "       rpcbench kv     [--fabric FABRIC|all] [--workload A,B,C,D,F,get,put]\n"
            "                       YCSB workloads on the key-value service (rpcbench kv --help)\n"
            "       rpcbench doc    [--fabric FABRIC|all] [--workload insert,read,find,update,...]\n"
            "                       YCSB-style work on the document service (rpcbench doc --help)\n"
            "       rpcbench blocksync [--fabric FABRIC|all] [--shape eos|btc] [--bytes SIZE]\n"
            "                       chain catch-up from 1..k peers (rpcbench blocksync --help)\n"
            "       rpcbench feed   [--subscribers N] [--slow N] [--rate R]\n"
            "                       the block feed under a generator (rpcbench feed --help)\n"
            "       rpcbench --help | --version\n"
            "FABRIC: one of");
    for (const char *const *n = tern_tp_fabric_names(); *n; n++)
        fprintf(f, " %s", *n);
    fprintf(f,
            " (this build; default tcp)\n"
            "options:\n"
            "  --size N[,N...]     payload bytes, 0..64m (default 64; k/m suffixes)\n"
            "  --window N[,N...]   calls in flight, 1..256 (default 1)\n"
            "  --iters N           measured calls per run (default 200000; k/m suffixes)\n"
            "  --json              one JSON object per run\n"
            "  --adaptive          sleep when idle instead of busy polling\n"
            "  --cpu C,S           pin client to cpu C and server to cpu S\n"
            "  --workload W        client mode: echo (default) or sink\n"
            "URIs: tcp://host:port, shm://name, ntb://emu:NAME or ntb://hw (NTB device),\n"
            "      rdma://host:port (a NIC; rdma://soft:host:port when emulated by softverbs),\n"
            "      auto://host:port (picks the best fabric)\n"
            "Exit status: 0 done, 1 a run failed, 2 usage error.\n");
}

bool bench_parse_cpu(const char *prog, const char *arg, int *client, int *server)
{
    const char *comma = strchr(arg, ',');
    uint64_t c, s;
    char first[32];

    if (!comma || (size_t)(comma - arg) >= sizeof(first)) {
        fprintf(stderr, "%s: --cpu: %s is not C,S (the client's cpu, the server's)\n", prog,
                arg);
        return false;
    }
    snprintf(first, sizeof(first), "%.*s", (int)(comma - arg), arg);
    if (!opt_num(prog, "--cpu", first, 0, CPU_SETSIZE - 1, 0, &c) ||
        !opt_num(prog, "--cpu", comma + 1, 0, CPU_SETSIZE - 1, 0, &s))
        return false;
    *client = (int)c;
    *server = (int)s;
    return true;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"fabric", required_argument, NULL, 'f'}, {"size", required_argument, NULL, 's'},
        {"window", required_argument, NULL, 'w'}, {"iters", required_argument, NULL, 'n'},
        {"json", no_argument, NULL, 'j'},         {"adaptive", no_argument, NULL, 'a'},
        {"listen", required_argument, NULL, 'l'}, {"connect", required_argument, NULL, 'c'},
        {"cpu", required_argument, NULL, 'p'},    {"help", no_argument, NULL, 'h'},
        {"workload", required_argument, NULL, 'W'},
        {"eal", required_argument, NULL, 'E'},
        {"served", no_argument, NULL, 'S'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    static const char *const commands[] = {"echo", "sink", "server", "client", "floor", "get",
                                           "put", "probe", "kv", "doc", "blocksync", "feed",
                                           "failover", NULL};
    static const char *const workloads[] = {"echo", "sink", NULL};
    static const char *const all_auto[] = {"all", "auto", NULL};
    struct opts o = {.workload = "echo", .fabric = "tcp", .sizes = {64}, .n_sizes = 1,
                     .windows = {1}, .n_windows = 1, .iters = 200000, .cpu_client = -1,
                     .cpu_server = -1};
    const char *cmd;
    uint64_t tmp[MAX_SWEEP];
    bool one_fabric;
    int c;

    if (argc < 2) {
        usage(stderr);
        return OPT_USAGE;
    }
    cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0)
        return opt_version("rpcbench");
    if (cmd[0] == '-')
        return opt_usage_error("rpcbench", "the command comes first (echo, kv, ...), not '%s'",
                               cmd);
    for (c = 0; commands[c] && strcmp(commands[c], cmd) != 0; c++)
        ;
    if (!commands[c])
        return opt_usage_error("rpcbench", "unknown command '%s'", cmd);
    if (strcmp(cmd, "kv") == 0) {
#if defined(TERN_HAVE_SERVICES) && TERN_HAVE_SERVICES
        return kv_main(argc, argv);
#else
        fprintf(stderr, "rpcbench kv: built without the services (libpmem, xxhash)\n");
        return 2;
#endif
    }
    if (strcmp(cmd, "failover") == 0) {
#if defined(TERN_HAVE_SERVICES) && TERN_HAVE_SERVICES
        return failover_main(argc, argv);
#else
        fprintf(stderr, "rpcbench failover: built without the services (libpmem, xxhash)\n");
        return 2;
#endif
    }
    if (strcmp(cmd, "doc") == 0) {
#if defined(TERN_HAVE_DOC) && TERN_HAVE_DOC
        return doc_main(argc, argv);
#else
        fprintf(stderr, "rpcbench doc: built without the document service (libbson, "
                "libpcre2, libpmem)\n");
        return 2;
#endif
    }
    if (strcmp(cmd, "blocksync") == 0 || strcmp(cmd, "feed") == 0) {
#if defined(TERN_HAVE_BLOCKSYNC) && TERN_HAVE_BLOCKSYNC
        return cmd[0] == 'f' ? feed_main(argc, argv) : blocksync_main(argc, argv);
#else
        fprintf(stderr, "rpcbench blocksync: built without the block-sync service (libcrypto, "
                "libpmem)\n");
        return 2;
#endif
    }
    /* get, put and probe take one real fabric; the others also all and auto. */
    one_fabric = strcmp(cmd, "get") == 0 || strcmp(cmd, "put") == 0 || strcmp(cmd, "probe") == 0;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;

        switch (c) {
        case 'f':
            o.fabric = optarg;
            ok = opt_choice("rpcbench", "--fabric", optarg, tern_tp_fabric_names(),
                            one_fabric ? NULL : all_auto) >= 0;
            break;
        case 's':
            o.n_sizes = opt_list("rpcbench", "--size", optarg, 0, 64u << 20, OPT_SIZE, tmp,
                                 MAX_SWEEP);
            for (unsigned i = 0; i < o.n_sizes; i++)
                o.sizes[i] = (size_t)tmp[i];
            ok = o.n_sizes > 0;
            break;
        case 'w':
            o.n_windows = opt_list("rpcbench", "--window", optarg, 1, 256, 0, tmp, MAX_SWEEP);
            for (unsigned i = 0; i < o.n_windows; i++)
                o.windows[i] = (unsigned)tmp[i];
            ok = o.n_windows > 0;
            break;
        case 'n':
            ok = opt_num("rpcbench", "--iters", optarg, 1, 1ull << 40, OPT_SIZE, &o.iters);
            break;
        case 'j': o.json = true; break;
        case 'a': o.adaptive = true; break;
        case 'l':
            if (!o.listen)
                o.listen = optarg;
            else if (o.n_also < 4)
                o.also_listen[o.n_also++] = optarg;
            else
                return opt_usage_error("rpcbench", "--listen: at most 5 addresses");
            break;
        case 'c': o.connect = optarg; break;
        case 'p': ok = bench_parse_cpu("rpcbench", optarg, &o.cpu_client, &o.cpu_server); break;
        case 'h': usage(stdout); return 0;
        case 'V': return opt_version("rpcbench");
        case 'E': o.eal = optarg; break;
        case 'S': o.served = true; break;
        case 'W':
            o.workload = optarg;
            ok = opt_choice("rpcbench", "--workload", optarg, workloads, NULL) >= 0;
            break;
        default:                             /* getopt said what */
            fprintf(stderr, "Try 'rpcbench --help' for the options.\n");
            return OPT_USAGE;
        }
        if (!ok)
            return OPT_USAGE;
    }
    if (optind < argc)
        return opt_usage_error("rpcbench", "unexpected argument '%s'", argv[optind]);
    if (strcmp(cmd, "echo") == 0 || strcmp(cmd, "sink") == 0) {
        o.workload = cmd;
        return run_local(&o);
    }
    if (strcmp(cmd, "probe") == 0) {
        char desc[200];
        int rc = tern_tp_probe(o.fabric, o.eal, desc, sizeof(desc));

        printf("%s: %s\n", o.fabric, desc);
        return rc == 0 ? 0 : 1;
    }
    if (strcmp(cmd, "get") == 0 || strcmp(cmd, "put") == 0) {
        int failed = 0;

        for (unsigned i = 0; i < o.n_sizes; i++) {
            struct onesided_opts so = {
                .fabric = o.fabric, .put = strcmp(cmd, "put") == 0, .served = o.served,
                .size = o.sizes[i], .iters = o.iters, .json = o.json,
                .cpu_client = o.cpu_client, .cpu_server = o.cpu_server};

            failed |= run_onesided(&so);
        }
        return failed;
    }
    if (strcmp(cmd, "floor") == 0)
        return run_floor(o.iters, o.cpu_client, o.cpu_server, o.json);
    if (strcmp(cmd, "server") == 0) {
        if (!o.listen)
            return opt_usage_error("rpcbench", "server: --listen URI is needed");
        return run_server(&o, o.listen, -1);
    }
    if (!o.connect)
        return opt_usage_error("rpcbench", "client: --connect URI is needed");
    return run_client(&o, o.connect, true) < 0 ? 1 : 0;
}
