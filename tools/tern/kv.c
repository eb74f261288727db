/* `tern kv`: the KV store of running ternds over the native RPC, on
 * whatever fabric auto:// finds (or the one a URI names).
 *
 *   tern kv get ADDRESS KEY            the value, as stored, on stdout
 *   tern kv put ADDRESS KEY VALUE      VALUE "-": standard input
 *   tern kv del ADDRESS KEY
 *   tern kv scan ADDRESS [--match GLOB] [--limit N] [--values]
 *   tern kv stat ADDRESS               keys, servers and the fabric taken
 *
 * ADDRESS is HOST:PORT or a URI, or several comma-separated: the servers
 * of a sharded store (their ranges must cover the hash space), or with
 * --replicas the replicas of one replicated shard. Exit status: 0 done,
 * 1 no such key (get, del, ttl, expire), 2 usage or another error. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "opt.h"
#include "tern/kv.h"
#include "tern/log.h"
#include "tern/rpc.h"
#include "terncli.h"

#define MAX_SERVERS 16
#define VALUE_MAX (64u << 20)

static const char usage_line[] =
    "kv: get|put|del|ttl|expire|scan|stat ADDRESS ... [--ttl MS] [--replicas] [-w one|majority|all] "
    "[--timeout MS] [--key-file F] (tern kv --help)";

struct kv_args {
    const char *cmd, *addr, *key, *val, *match, *key_file;
    bool replicas, values;
    int w;                          /* enum tern_kv_write_concern, -1: default */
    uint64_t timeout_ms, limit;
    uint64_t ttl_ms;                /* put --ttl: 0 none */
};

static void help(void)
{
    printf("usage: tern kv get ADDRESS KEY           the value, as stored, on stdout\n"
           "       tern kv put ADDRESS KEY VALUE     VALUE - reads standard input\n"
           "       tern kv del ADDRESS KEY\n"
           "       tern kv put ADDRESS KEY VALUE --ttl MS   the key expires MS from now\n"
           "       tern kv ttl ADDRESS KEY           milliseconds left, or \"none\"\n"
           "       tern kv expire ADDRESS KEY MS     expire it MS from now (0: never)\n"
           "       tern kv scan ADDRESS [--match GLOB] [--limit N] [--values]\n"
           "                                          every key (and value), hash order\n"
           "       tern kv stat ADDRESS              keys, servers, the fabric taken\n"
           "options: --replicas (ADDRESS lists one shard's replicas), -w one|majority|all\n"
           "         (a replicated write's concern), --timeout MS (default 5000),\n"
           "         --key-file F (else $TERN_KEY_FILE)\n"
           "ADDRESS: HOST:PORT (auto://: the best fabric both ends have) or a URI;\n"
           "several comma-separated for a sharded store. Exit status: 0 done, 1 no such\n"
           "key (get, del), 2 usage or another error.\n");
}

static int parse(int argc, char **argv, struct kv_args *a)
{
    const char *pos[4];
    unsigned npos = 0, want;

    *a = (struct kv_args){.w = -1, .timeout_ms = 5000};
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];

        if (strcmp(o, "--replicas") == 0) {
            a->replicas = true;
        } else if (strcmp(o, "--values") == 0) {
            a->values = true;
        } else if (strcmp(o, "--match") == 0 && i + 1 < argc) {
            a->match = argv[++i];
        } else if (strcmp(o, "--key-file") == 0 && i + 1 < argc) {
            a->key_file = argv[++i];
        } else if (strcmp(o, "--limit") == 0 && i + 1 < argc) {
            if (!opt_num("tern kv", "--limit", argv[++i], 1, UINT32_MAX, 0, &a->limit))
                return OPT_USAGE;
        } else if (strcmp(o, "--ttl") == 0 && i + 1 < argc) {
            if (!opt_num("tern kv", "--ttl", argv[++i], 1, UINT32_MAX * 1000ull, 0, &a->ttl_ms))
                return OPT_USAGE;
        } else if (strcmp(o, "--timeout") == 0 && i + 1 < argc) {
            if (!opt_num("tern kv", "--timeout", argv[++i], 1, 3600000, 0, &a->timeout_ms))
                return OPT_USAGE;
        } else if (strcmp(o, "-w") == 0 && i + 1 < argc) {
            const char *w = argv[++i];

            a->w = strcmp(w, "one") == 0        ? TERN_KV_W_ONE
                   : strcmp(w, "majority") == 0 ? TERN_KV_W_MAJORITY
                   : strcmp(w, "all") == 0      ? TERN_KV_W_ALL
                                                : -2;
            if (a->w == -2)
                return opt_usage_error("tern kv", "-w: %s is not one of one, majority, all", w);
        } else if (strcmp(o, "--") == 0) {
            for (i++; i < argc; i++) {
                if (npos == 4)
                    return opt_usage_error("tern kv", "%s", usage_line);
                pos[npos++] = argv[i];
            }
        } else if (o[0] == '-' && o[1] && !(npos == 3 && strcmp(o, "-") == 0)) {
            return opt_usage_error("tern kv", "unknown option '%s'", o);
        } else {
            if (npos == 4)
                return opt_usage_error("tern kv", "%s", usage_line);
            pos[npos++] = o;
        }
    }
    if (npos < 2)
        return opt_usage_error("tern kv", "%s", usage_line);
    a->cmd = pos[0];
    a->addr = pos[1];
    want = strcmp(a->cmd, "put") == 0 || strcmp(a->cmd, "expire") == 0 ? 4
           : strcmp(a->cmd, "get") == 0 || strcmp(a->cmd, "del") == 0 ||
                   strcmp(a->cmd, "ttl") == 0 ? 3
           : strcmp(a->cmd, "scan") == 0 || strcmp(a->cmd, "stat") == 0 ? 2
                                                                    : 0;
    if (!want)
        return opt_usage_error("tern kv",
                               "unknown command '%s' (get, put, del, ttl, expire, scan, stat)",
                               a->cmd);
    if (npos != want)
        return opt_usage_error("tern kv", "%s: %s", a->cmd,
                               want == 4 ? "ADDRESS KEY VALUE" : want == 3 ? "ADDRESS KEY"
                                                                          : "ADDRESS");
    a->key = want >= 3 ? pos[2] : NULL;
    a->val = want == 4 ? pos[3] : NULL;
    if (a->key && !*a->key)
        return opt_usage_error("tern kv", "%s: the key is empty", a->cmd);
    if (a->ttl_ms && strcmp(a->cmd, "put") != 0)
        return opt_usage_error("tern kv", "--ttl goes with put");
    if (strcmp(a->cmd, "expire") == 0) {
        uint64_t ms;

        if (!opt_num("tern kv", "expire MS", a->val, 0, UINT32_MAX * 1000ull, 0, &ms))
            return OPT_USAGE;
        a->ttl_ms = ms;
    }
    return 0;
}

/* Deadlines are wall-clock Unix milliseconds, judged by the server's
 * clock: a TTL given here assumes the two clocks agree. */
static uint64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The value of "-": standard input, whole (up to VALUE_MAX). */
static char *read_stdin(size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);

    while (buf) {
        size_t got;

        if (n == cap) {
            char *more = cap < VALUE_MAX ? realloc(buf, cap * 2) : NULL;

            if (!more) {
                free(buf);
                return NULL;
            }
            buf = more;
            cap *= 2;
        }
        got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0)
            break;
    }
    *len = n;
    return buf;
}

/* A key or value as a line: printable bytes as they are, others \xNN. */
static void put_escaped(const void *p, size_t len)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < len; i++) {
        if (b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\\')
            putchar(b[i]);
        else
            printf("\\x%02x", b[i]);
    }
}

struct scan_state {
    const struct kv_args *a;
    uint64_t shown;
};

static void on_key(void *arg, const void *key, size_t klen, const void *val, size_t len,
                   uint64_t version)
{
    struct scan_state *st = arg;
    char name[1025];

    (void)version;
    if (st->a->limit && st->shown >= st->a->limit)
        return;
    if (st->a->match) {
        size_t n = klen < sizeof(name) - 1 ? klen : sizeof(name) - 1;

        memcpy(name, key, n);
        name[n] = 0;
        if (memchr(key, 0, klen) || fnmatch(st->a->match, name, 0) != 0)
            return;
    }
    put_escaped(key, klen);
    if (st->a->values) {
        putchar('\t');
        put_escaped(val, len);
    }
    putchar('\n');
    st->shown++;
}

static int run(struct tern_kv *kv, const struct kv_args *a, unsigned n_servers)
{
    size_t klen = a->key ? strlen(a->key) : 0;
    int rc;

    if (strcmp(a->cmd, "get") == 0) {
        size_t cap = 4096, len = 0;
        char *buf = malloc(cap);

        rc = buf ? tern_kv_get(kv, a->key, klen, buf, cap, &len, NULL) : TERN_ENOMEM;
        if (rc == TERN_EMSGSIZE) {
            free(buf);
            cap = len;
            buf = malloc(cap ? cap : 1);
            rc = buf ? tern_kv_get(kv, a->key, klen, buf, cap, &len, NULL) : TERN_ENOMEM;
        }
        if (rc == 0) {
            fwrite(buf, 1, len, stdout);
            if (isatty(STDOUT_FILENO))
                putchar('\n');
        }
        free(buf);
    } else if (strcmp(a->cmd, "put") == 0) {
        size_t len = strlen(a->val);
        char *in = NULL;
        uint64_t version = 0;

        if (strcmp(a->val, "-") == 0 && !(in = read_stdin(&len))) {
            fprintf(stderr, "tern: kv put: standard input: %s\n", tern_strerror(TERN_E2BIG));
            return 2;
        }
        rc = a->ttl_ms ? tern_kv_put_until(kv, a->key, klen, in ? in : a->val, len,
                                           wall_ms() + a->ttl_ms, &version)
                       : tern_kv_put(kv, a->key, klen, in ? in : a->val, len, &version);
        if (rc == 0)
            printf("version %llx\n", (unsigned long long)version);
        free(in);
    } else if (strcmp(a->cmd, "del") == 0) {
        rc = tern_kv_del(kv, a->key, klen);
    } else if (strcmp(a->cmd, "ttl") == 0) {
        uint64_t at = 0, now;

        rc = tern_kv_expiry(kv, a->key, klen, &at);
        now = wall_ms();
        if (rc == 0 && at)
            printf("%llu\n", (unsigned long long)(at > now ? at - now : 0));
        else if (rc == 0)
            printf("none\n");
    } else if (strcmp(a->cmd, "expire") == 0) {
        rc = tern_kv_expire(kv, a->key, klen, a->ttl_ms ? wall_ms() + a->ttl_ms : 0);
    } else if (strcmp(a->cmd, "scan") == 0) {
        struct scan_state st = {.a = a};
        uint64_t cursor = 0;

        do
            rc = tern_kv_scan(kv, &cursor, 256, on_key, &st);
        while (rc == 0 && cursor && !(a->limit && st.shown >= a->limit));
    } else {
        uint64_t keys = 0;

        rc = tern_kv_count(kv, &keys);
        if (rc == 0)
            printf("keys %llu\nservers %u%s\n", (unsigned long long)keys, n_servers,
                   a->replicas ? " (replicas of one shard)" : "");
    }
    if (rc == TERN_ENOENT) {
        fprintf(stderr, "tern: kv %s: %s: no such key\n", a->cmd, a->key ? a->key : "");
        return 1;
    }
    if (rc < 0) {
        fprintf(stderr, "tern: kv %s: %s\n", a->cmd, tern_strerror(rc));
        return 2;
    }
    return 0;
}

/* The library's own lines (a refused connection, a retry) stay out of a
 * command's output, which says what failed once; TERN_LOG brings them. */
static void quiet(enum tern_log_level level, const char *who, const char *msg, void *arg)
{
    (void)level, (void)who, (void)msg, (void)arg;
}

int tern_kv_cmd(int argc, char **argv)
{
    char list[4096], uris[MAX_SERVERS][256];
    const char *ptrs[MAX_SERVERS];
    unsigned n = 0;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    struct kv_args a;
    int rc;

    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            help();
            return 0;
        }
    if ((rc = parse(argc, argv, &a)) != 0)
        return rc;
    if (!getenv("TERN_LOG"))
        tern_log_set_handler(quiet, NULL);
    snprintf(list, sizeof(list), "%s", a.addr);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == MAX_SERVERS)
            return opt_usage_error("tern kv", "at most %d addresses", MAX_SERVERS);
        tern_cli_uri(t, uris[n], sizeof(uris[n]));
        ptrs[n] = uris[n];
        n++;
    }
    if (!n)
        return opt_usage_error("tern kv", "%s", usage_line);
    if (tern_cli_endpoint(a.key_file, &ep) < 0)
        return 2;
    rc = a.replicas ? tern_kv_open_replicas(ep, ptrs, n, a.timeout_ms * 1000000u, &kv)
                    : tern_kv_open(ep, ptrs, n, a.timeout_ms * 1000000u, &kv);
    if (rc < 0) {
        fprintf(stderr, "tern: kv: %s: %s\n", a.addr, tern_strerror(rc));
        tern_rpc_close(ep);
        return 2;
    }
    tern_kv_set_timeout(kv, a.timeout_ms * 1000000u);
    if (a.w >= 0)
        tern_kv_set_write_concern(kv, (enum tern_kv_write_concern)a.w);
    rc = run(kv, &a, n);
    tern_kv_close(kv);
    tern_rpc_close(ep);
    return rc;
}
