/* rpcbench failover: YCSB-A on a replicated KV shard while its primary is
 * killed (by a script beside it), checking that no acknowledged write is
 * lost and timing how long writes stop.
 *
 *   rpcbench failover --replicas URI,URI,URI [--records N] [--seconds S]
 *                     [--window W] [--w majority|one|all] [--mix a|put] [--json]
 *
 * With --mix put (updates only) and --window 1 it measures what a write
 * costs: the median and 99th percentile of acknowledged PUTs. Give it one
 * plain ternd's URI for the same figure without replication.
 *
 * Each value names its key and a sequence number, counted per key; one
 * call per key is in flight at a time, so the order of acknowledgements is
 * the order of writes. The checks:
 * - a GET answers the sequence number of a write this run made to that
 *   key, no older than the newest acknowledged when the GET was sent;
 * - at the end every key is read again the same way (after the writes
 *   stop), so a write acknowledged and then lost in a failover shows;
 * - a write that failed (no primary to be found in its time) is only
 *   counted: it was never acknowledged, so it may or may not be there.
 * SIGUSR1 ends the run early (the checks still follow).
 * The cluster key, if the shard's nodes want one: $TERN_KEY_FILE.
 * --no-load skips the load and the final reads (with --mix put: a probe
 * that only counts which writes were acknowledged, as a partition test
 * asks of a client left with a cut-off primary).
 * Writes stop while the shard elects a new primary: every pause between
 * two acknowledged writes longer than 100 ms is reported as an outage.
 */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hist.h"
#include "key.h"
#include "kv.h"
#include "kvbench.h"
#include "opt.h"
#include "rpc.h"
#include "ycsb.h"

#define MAX_REPLICAS 7
#define MAX_WINDOW 256
#define MAX_OUTAGES 4096
#define OUTAGE_NS 100000000ull

struct key_state {
    uint64_t acked;                 /* newest acknowledged sequence number */
    uint64_t acked_version;         /* the version its acknowledgment named */
    uint64_t issued;                /* newest sent */
    bool busy;                      /* a call in flight */
};

struct slot {
    struct fo *fo;
    bool busy, is_put;
    uint64_t sent_ns;
    uint64_t key, seq, acked_then;
    char kbuf[24], vbuf[64];
};

struct fo {
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    struct key_state *keys;
    uint64_t records;
    struct slot slots[MAX_WINDOW];
    unsigned window;
    uint64_t puts_ok, puts_failed, gets_ok, gets_failed, lost, stale_reads;
    uint64_t last_put_ok;           /* ns */
    uint64_t outage[MAX_OUTAGES];
    unsigned n_outages;
    uint64_t outage_start[MAX_OUTAGES];
    bool loading;
    struct hist put_lat;            /* ns, acknowledged PUTs of the run */
};

/* SIGUSR1: end the run now (then verify), for a script that decides when. */
static volatile sig_atomic_t g_enough;

static void on_usr1(int sig)
{
    (void)sig;
    g_enough = 1;
}

static uint64_t parse_seq(const char *v, size_t len, uint64_t key, bool *ok)
{
    char buf[64];
    unsigned long long k, seq;
    int used = 0;

    *ok = false;
    if (len >= sizeof(buf))
        return 0;
    memcpy(buf, v, len);
    buf[len] = 0;
    if (sscanf(buf, "k%llu#%llu%n", &k, &seq, &used) != 2 || (size_t)used != len || k != key)
        return 0;
    *ok = true;
    return seq;
}

static void done(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct slot *sl = arg;
    struct fo *fo = sl->fo;
    struct key_state *ks = &fo->keys[sl->key];
    uint64_t now = tern_now_ns();

    sl->busy = false;
    ks->busy = false;
    if (sl->is_put) {
        if (status < 0) {
            fo->puts_failed++;
            return;
        }
        fo->puts_ok++;
        hist_add(&fo->put_lat, now - sl->sent_ns);
        if (sl->seq > ks->acked) {
            ks->acked = sl->seq;
            ks->acked_version = version;
        }
        if (fo->last_put_ok && now - fo->last_put_ok > OUTAGE_NS && fo->n_outages < MAX_OUTAGES) {
            fo->outage_start[fo->n_outages] = fo->last_put_ok;
            fo->outage[fo->n_outages++] = now - fo->last_put_ok;
        }
        fo->last_put_ok = now;
        return;
    }
    if (status == TERN_ENOENT && sl->acked_then == 0) {
        fo->gets_ok++;
        return;
    }
    if (status < 0) {
        if (status == TERN_ENOENT) {
            fo->lost++;
            fprintf(stderr, "rpcbench failover: key %" PRIu64 " is gone; write %" PRIu64
                    " of it was acknowledged\n", sl->key, sl->acked_then);
        } else {
            fo->gets_failed++;
        }
        return;
    }
    {
        bool ok;
        uint64_t seq = parse_seq(val, len, sl->key, &ok);

        if (!ok || seq > ks->issued) {
            fo->lost++;
            fprintf(stderr, "rpcbench failover: key %" PRIu64 " holds '%.*s', which this run "
                    "never wrote\n", sl->key, (int)(len < 60 ? len : 60), (const char *)val);
        } else if (seq < sl->acked_then) {
            fo->lost++;
            fprintf(stderr, "rpcbench failover: key %" PRIu64 " holds write %" PRIu64
                    " (version %" PRIx64 "), but write %" PRIu64 " was acknowledged (at "
                    "version %" PRIx64 " or after): lost\n", sl->key, seq, version,
                    sl->acked_then, ks->acked_version);
        } else {
            fo->gets_ok++;
        }
    }
}

static struct slot *free_slot(struct fo *fo)
{
    for (unsigned i = 0; i < fo->window; i++)
        if (!fo->slots[i].busy)
            return &fo->slots[i];
    return NULL;
}

static int start(struct fo *fo, struct slot *sl, uint64_t key, bool put)
{
    struct key_state *ks = &fo->keys[key];
    int kl = snprintf(sl->kbuf, sizeof(sl->kbuf), "k%" PRIu64, key);
    int rc;

    sl->fo = fo;
    sl->key = key;
    sl->is_put = put;
    sl->acked_then = ks->acked;
    sl->sent_ns = tern_now_ns();
    if (put) {
        sl->seq = ks->issued + 1;
        int vl = snprintf(sl->vbuf, sizeof(sl->vbuf), "k%" PRIu64 "#%" PRIu64, key, sl->seq);

        rc = tern_kv_put_async(fo->kv, sl->kbuf, (size_t)kl, sl->vbuf, (size_t)vl, done, sl);
        if (rc == 0)
            ks->issued = sl->seq;
    } else {
        rc = tern_kv_get_async(fo->kv, sl->kbuf, (size_t)kl, done, sl);
    }
    if (rc == 0) {
        sl->busy = true;
        ks->busy = true;
    }
    return rc;
}

static void drain(struct fo *fo)
{
    for (;;) {
        bool busy = false;

        for (unsigned i = 0; i < fo->window; i++)
            busy |= fo->slots[i].busy;
        if (!busy)
            return;
        tern_rpc_poll(fo->ep);
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: rpcbench failover --replicas URI,URI,... [--records N] [--seconds S]\n"
               "                          [--window W] [--w majority|one|all] [--mix a|put]\n"
               "                          [--no-load] [--json]\n");
}

int failover_main(int argc, char **argv)
{
    static const struct option longs[] = {
        {"replicas", required_argument, NULL, 'r'}, {"records", required_argument, NULL, 'n'},
        {"seconds", required_argument, NULL, 's'},  {"window", required_argument, NULL, 'w'},
        {"w", required_argument, NULL, 'c'},        {"json", no_argument, NULL, 'j'},
        {"mix", required_argument, NULL, 'm'},      {"no-load", no_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    static const char *const concerns[] = {"majority", "one", "all", NULL};
    static const char *const mixes[] = {"a", "put", NULL};
    int mix = 0;
    static struct fo fo;
    const char *uris[MAX_REPLICAS];
    char *list = NULL;
    unsigned n_uris = 0;
    uint64_t seconds = 30, t0, end, worst = 0, total = 0;
    struct tern_rpc_ep *ep;
    struct ycsb_scrambled zipf;
    struct ycsb_rng rng;
    bool json = false, no_load = false;
    int w = 0, c, rc;

    fo.records = 10000;
    fo.window = 16;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        uint64_t v;

        switch (c) {
        case 'r':
            list = optarg;
            break;
        case 'n':
            if (!opt_num("rpcbench failover", "--records", optarg, 1, 10000000, 0,
                         &fo.records))
                return OPT_USAGE;
            break;
        case 's':
            if (!opt_num("rpcbench failover", "--seconds", optarg, 1, 86400, 0, &seconds))
                return OPT_USAGE;
            break;
        case 'w':
            if (!opt_num("rpcbench failover", "--window", optarg, 1, MAX_WINDOW, 0, &v))
                return OPT_USAGE;
            fo.window = (unsigned)v;
            break;
        case 'c':
            w = opt_choice("rpcbench failover", "--w", optarg, concerns, NULL);
            if (w < 0)
                return OPT_USAGE;
            break;
        case 'j':
            json = true;
            break;
        case 'L':
            no_load = true;
            break;
        case 'm':
            mix = opt_choice("rpcbench failover", "--mix", optarg, mixes, NULL);
            if (mix < 0)
                return OPT_USAGE;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return OPT_USAGE;
        }
    }
    if (!list) {
        usage(stderr);
        return OPT_USAGE;
    }
    for (char *save = NULL, *u = strtok_r(list, ",", &save); u && n_uris < MAX_REPLICAS;
         u = strtok_r(NULL, ",", &save))
        uris[n_uris++] = u;
    fo.keys = calloc(fo.records, sizeof(*fo.keys));
    if (!fo.keys)
        return 1;
    {
        /* The rack's nodes take only clients that hold its key. */
        struct tern_rpc_config cfg = {.size = sizeof(cfg)};
        const char *path = getenv("TERN_KEY_FILE");
        uint8_t key[KEY_MAX];
        size_t key_len = 0;
        char why[160];

        if (path && *path) {
            if (key_load(path, key, &key_len, why, sizeof(why)) < 0) {
                fprintf(stderr, "rpcbench failover: key file %s: %s\n", path, why);
                return 1;
            }
            cfg.key = key;
            cfg.key_len = key_len;
        }
        rc = tern_rpc_open(&cfg, &ep);
        explicit_bzero(key, sizeof(key));
    }
    fo.ep = ep;
    if (rc == 0)
        rc = tern_kv_open_replicas(ep, uris, n_uris, 1000000000u, &fo.kv);
    if (rc < 0) {
        fprintf(stderr, "rpcbench failover: %s\n", tern_strerror(rc));
        return 1;
    }
    tern_kv_set_timeout(fo.kv, 2000000000u);
    tern_kv_set_write_concern(fo.kv, (enum tern_kv_write_concern)(w == 1 ? TERN_KV_W_ONE
                                                                  : w == 2 ? TERN_KV_W_ALL
                                                                           : TERN_KV_W_MAJORITY));
    ycsb_rng_seed(&rng, (uint64_t)getpid() * 7919u + 1);
    ycsb_scrambled_init(&zipf, 0, fo.records - 1);
    /* Load: every key once, until each is acknowledged. */
    for (uint64_t k = 0; k < fo.records && !no_load;) {
        struct slot *sl = free_slot(&fo);

        if (sl && fo.keys[k].acked == 0 && !fo.keys[k].busy) {
            if (start(&fo, sl, k, true) < 0)
                tern_rpc_poll(ep);
        } else if (fo.keys[k].acked) {
            k++;
            continue;
        }
        tern_rpc_poll(ep);
        if (!fo.keys[k].busy && !fo.keys[k].acked)
            usleep(1000);       /* refused: an election, or no primary yet */
    }
    drain(&fo);
    fo.puts_ok = fo.puts_failed = 0;
    fo.n_outages = 0;
    hist_reset(&fo.put_lat);
    /* Run: YCSB-A, half reads, half updates. */
    t0 = tern_now_ns();
    fo.last_put_ok = t0;
    end = t0 + seconds * 1000000000ull;
    signal(SIGUSR1, on_usr1);
    while (tern_now_ns() < end && !g_enough) {
        struct slot *sl = free_slot(&fo);

        if (sl) {
            uint64_t key = ycsb_scrambled_next(&zipf, &rng);

            if (!fo.keys[key].busy &&
                start(&fo, sl, key, mix == 1 || ycsb_rng_below(&rng, 2) == 0) < 0)
                usleep(200);
        }
        tern_rpc_poll(ep);
    }
    drain(&fo);
    if (tern_now_ns() - fo.last_put_ok > OUTAGE_NS && fo.n_outages < MAX_OUTAGES) {
        fo.outage_start[fo.n_outages] = fo.last_put_ok;
        fo.outage[fo.n_outages++] = tern_now_ns() - fo.last_put_ok;
    }
    /* Verify: every key read once more, after the last write. */
    for (uint64_t k = 0; k < fo.records && !no_load; k++) {
        struct slot *sl;

        while (!(sl = free_slot(&fo)))
            tern_rpc_poll(ep);
        while (start(&fo, sl, k, false) < 0)
            tern_rpc_poll(ep);
    }
    drain(&fo);
    for (unsigned i = 0; i < fo.n_outages; i++) {
        total += fo.outage[i];
        if (fo.outage[i] > worst)
            worst = fo.outage[i];
    }
    if (json) {
        printf("{\"records\":%" PRIu64 ",\"seconds\":%" PRIu64 ",\"puts_ok\":%" PRIu64
               ",\"puts_failed\":%" PRIu64 ",\"gets_ok\":%" PRIu64 ",\"gets_failed\":%" PRIu64
               ",\"lost\":%" PRIu64 ",\"outages\":[",
               fo.records, seconds, fo.puts_ok, fo.puts_failed, fo.gets_ok, fo.gets_failed,
               fo.lost);
        for (unsigned i = 0; i < fo.n_outages; i++)
            printf("%s{\"at_s\":%.3f,\"ms\":%.1f}", i ? "," : "",
                   (double)(fo.outage_start[i] - t0) / 1e9, (double)fo.outage[i] / 1e6);
        printf("],\"worst_outage_ms\":%.1f,\"put_p50_us\":%.2f,\"put_p99_us\":%.2f}\n",
               (double)worst / 1e6, (double)hist_quantile(&fo.put_lat, 0.5) / 1e3,
               (double)hist_quantile(&fo.put_lat, 0.99) / 1e3);
    } else {
        printf("failover: %" PRIu64 " s, %" PRIu64 " records, w=%s: %" PRIu64 " puts acknowledged, "
               "%" PRIu64 " failed; %" PRIu64 " gets checked, %" PRIu64 " failed; lost %" PRIu64
               "\n", seconds, fo.records, concerns[w], fo.puts_ok, fo.puts_failed, fo.gets_ok,
               fo.gets_failed, fo.lost);
        for (unsigned i = 0; i < fo.n_outages; i++)
            printf("outage at %.3f s: %.1f ms without an acknowledged write\n",
                   (double)(fo.outage_start[i] - t0) / 1e9, (double)fo.outage[i] / 1e6);
        printf("worst outage %.1f ms, %u outages, %.1f ms in all\n", (double)worst / 1e6,
               fo.n_outages, (double)total / 1e6);
        printf("acknowledged PUTs: median %.2f us, p99 %.2f us\n",
               (double)hist_quantile(&fo.put_lat, 0.5) / 1e3,
               (double)hist_quantile(&fo.put_lat, 0.99) / 1e3);
    }
    tern_kv_close(fo.kv);
    tern_rpc_close(ep);
    free(fo.keys);
    return fo.lost ? 3 : 0;
}
