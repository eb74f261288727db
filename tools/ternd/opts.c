/* ternd's settings from the configuration file and the command line
 * (opts.h). One table names each setting's section, key and flag and the
 * function that checks and stores it; the file is read first and the
 * flags after, so a flag wins. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "key.h"
#include "log.h"
#include "opt.h"
#include "opts.h"
#include "resp.h"
#include "tern_config.h"

#define POOL_MAX (1ull << 44)
#define DEFAULT_SEG (1ull << 20)     /* the pool's defaults (pm.h) */
#define DEFAULT_POOL (256ull << 20)
#define VALUE_MAX (INI_MAX_LINE - 40)   /* a value, with room for its key */

static const char *const fabric_names[] = {"tcp", "shm", "ntb", "rdma", NULL};
static const char *const level_names[] = {"error", "warn", "info", "debug", NULL};
static const char *const fault_names[] = {"none", "stall", "merkle", "truncate", "order",
                                          "parent", NULL};

/* Where a value comes from, for its checks and their messages. */
struct ctx {
    struct ternd_opts *o;
    char prog[512];                  /* "ternd" or "ternd: FILE:LINE" */
    char name[96];                   /* "--pool-size" or "[kv] pool_size" */
    bool flags;                      /* from the command line */
    bool reload;                     /* SIGHUP: messages go to the log */
    const char *pool_size;           /* checked at the end, against seg_size */
    char pool_size_prog[512], pool_size_name[96];
    char seg_size_prog[512], seg_size_name[96];
};

static void say(const struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const struct ctx *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->reload)
        tern_log(TERN_LOG_ERROR, "ternd", "%s: %s: %s",
                 strncmp(c->prog, "ternd: ", 7) == 0 ? c->prog + 7 : c->prog, c->name, msg);
    else
        fprintf(stderr, "%s: %s: %s\n", c->prog, c->name, msg);
}

/* ---- strings the file gave: kept until ternd_opts_free ---- */

static char **owned;
static unsigned n_owned, cap_owned;

static const char *keep(const char *s)
{
    char *d = strdup(s);

    if (!d || (n_owned == cap_owned &&
               !(owned = realloc(owned, (cap_owned = cap_owned ? 2 * cap_owned : 32) *
                                            sizeof(*owned))))) {
        fprintf(stderr, "ternd: out of memory\n");
        exit(1);
    }
    owned[n_owned++] = d;
    return d;
}

/* ---- setters: each checks one value and stores it ---- */

static bool num(struct ctx *c, const char *v, uint64_t lo, uint64_t hi, unsigned fl, uint64_t *out)
{
    return opt_num(c->prog, c->name, v, lo, hi, fl, out);
}

static bool boolean(struct ctx *c, const char *v, bool *out)
{
    static const char *const yes[] = {"yes", "true", "on", "1", NULL};
    static const char *const no[] = {"no", "false", "off", "0", NULL};

    for (const char *const *p = yes; *p; p++)
        if (strcasecmp(v, *p) == 0)
            return *out = true;
    for (const char *const *p = no; *p; p++)
        if (strcasecmp(v, *p) == 0)
            return !(*out = false);
    say(c, "%s is not yes or no", v);
    return false;
}

static bool name_ok(struct ctx *c, const char *v, char *out)
{
    size_t n = strlen(v);

    if (n == 0 || n >= TERND_NAME_MAX) {
        say(c, "'%s' is not 1..%d characters", v, TERND_NAME_MAX - 1);
        return false;
    }
    for (const char *p = v; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-", *p)) {
            say(c, "'%s' has '%c': names are letters, digits, '.', '_' and '-'", v, *p);
            return false;
        }
    memcpy(out, v, n + 1);
    return true;
}

static bool set_name(struct ctx *c, const char *v) { return name_ok(c, v, c->o->name); }
static bool set_rack(struct ctx *c, const char *v) { return name_ok(c, v, c->o->rack); }

static bool set_data_dir(struct ctx *c, const char *v)
{
    if (!*v) {
        say(c, "empty");
        return false;
    }
    c->o->data_dir = c->flags ? v : keep(v);
    return true;
}

/* SCHEME://REST, printable, no blanks. */
static bool uri_ok(struct ctx *c, const char *v)
{
    size_t scheme = strspn(v, "abcdefghijklmnopqrstuvwxyz");

    if (!scheme || strncmp(v + scheme, "://", 3) != 0 || !v[scheme + 3]) {
        say(c, "'%s' is not a URI (tcp://HOST:PORT, shm://NAME, ntb://DEV, rdma://...)", v);
        return false;
    }
    for (const char *p = v; *p; p++)
        if (!isgraph((unsigned char)*p)) {
            say(c, "'%s' has a blank or a control character", v);
            return false;
        }
    return true;
}

static bool set_listen(struct ctx *c, const char *v)
{
    if (!uri_ok(c, v))
        return false;
    if (c->o->n_listen == TERND_MAX_LISTEN) {
        say(c, "at most %d addresses", TERND_MAX_LISTEN);
        return false;
    }
    c->o->listen[c->o->n_listen++] = c->flags ? v : keep(v);
    return true;
}

static bool set_shm(struct ctx *c, const char *v) { return boolean(c, v, &c->o->shm); }
static bool set_busy(struct ctx *c, const char *v) { return boolean(c, v, &c->o->busy); }

static bool set_spin(struct ctx *c, const char *v)
{
    uint64_t x;

    if (!num(c, v, 0, TERND_SPIN_MAX_US, 0, &x))
        return false;
    c->o->spin_us = (unsigned)x;
    return true;
}

static bool set_log_level(struct ctx *c, const char *v)
{
    int k = opt_choice(c->prog, c->name, v, level_names, NULL);

    c->o->log_level = k >= 0 ? k : c->o->log_level;
    return k >= 0;
}

static bool set_log_file(struct ctx *c, const char *v)
{
    if (v[0] != '/') {
        say(c, "'%s' is not an absolute path (the file is reopened on SIGHUP)", v);
        return false;
    }
    c->o->log_file = c->flags ? v : keep(v);
    return true;
}

/* http://HOST:PORT, comma-separated: etcd's client URLs. */
static bool set_etcd(struct ctx *c, const char *v)
{
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");

        if (n <= 7 || strncmp(p, "http://", 7) != 0) {
            say(c, "'%.*s' is not an http://HOST:PORT URL", (int)n, p);
            return false;
        }
        for (size_t i = 0; i < n; i++)
            if (!isgraph((unsigned char)p[i])) {
                say(c, "'%s' has a blank or a control character", v);
                return false;
            }
        p += n + (p[n] == ',');
    }
    if (!*v) {
        say(c, "empty");
        return false;
    }
    c->o->etcd = c->flags ? v : keep(v);
    return true;
}

/* A key prefix: /NAME[/NAME...], names as a node's. */
static bool set_prefix(struct ctx *c, const char *v)
{
    size_t n = strlen(v);

    if (v[0] != '/' || n < 2 || n >= TERND_NAME_MAX || v[n - 1] == '/' || strstr(v, "//")) {
        say(c, "'%s' is not /NAME[/NAME...] under %d characters", v, TERND_NAME_MAX);
        return false;
    }
    for (const char *p = v; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-/", *p)) {
            say(c, "'%s' has '%c'", v, *p);
            return false;
        }
    memcpy(c->o->prefix, v, n + 1);
    return true;
}

static bool set_lease_ttl(struct ctx *c, const char *v)
{
    uint64_t x;

    if (!num(c, v, TERND_LEASE_MIN, TERND_LEASE_MAX, 0, &x))
        return false;
    c->o->lease_ttl = (unsigned)x;
    return true;
}

static bool set_shard(struct ctx *c, const char *v)
{
    if (c->o->n_shards == TERND_MAX_SHARDS) {
        say(c, "at most %d shards", TERND_MAX_SHARDS);
        return false;
    }
    for (unsigned i = 0; i < c->o->n_shards; i++)
        if (strcmp(c->o->shards[i], v) == 0) {
            say(c, "shard %s named twice", v);
            return false;
        }
    if (!name_ok(c, v, c->o->shards[c->o->n_shards]))
        return false;
    c->o->n_shards++;
    return true;
}

static bool set_kv_shard(struct ctx *c, const char *v)
{
    return name_ok(c, v, c->o->kv_shard);
}

static bool set_doc_shard(struct ctx *c, const char *v)
{
    return name_ok(c, v, c->o->doc_shard);
}

static bool set_repl_log_mb(struct ctx *c, const char *v)
{
    uint64_t x;

    if (!num(c, v, 1, 4096, 0, &x))
        return false;
    c->o->repl_log_mb = (unsigned)x;
    return true;
}

static bool set_repl_ship(struct ctx *c, const char *v)
{
    static const char *const names[] = {"auto", "one-sided", "call"};

    for (unsigned i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) {
            c->o->repl_ship = (uint8_t)i;
            return true;
        }
    say(c, "'%s' is not auto, one-sided or call", v);
    return false;
}

static bool set_key_file(struct ctx *c, const char *v)
{
    char why[160];

    if (key_load(v, c->o->key, &c->o->key_len, why, sizeof(why)) < 0) {
        say(c, "%s: %s", v, why);
        return false;
    }
    c->o->key_file = c->flags ? v : keep(v);
    return true;
}

/* The gateway's password: the file's first line, the file readable by its
 * owner alone (it is a secret, as the key file is). */
static bool set_resp_password_file(struct ctx *c, const char *v)
{
    char *line = c->o->resp_password;
    struct stat st;
    FILE *f = fopen(v, "r");
    bool ok;

    if (!f || fstat(fileno(f), &st) < 0) {
        say(c, "%s: %s", v, strerror(errno));
        if (f)
            fclose(f);
        return false;
    }
    if (st.st_mode & 077) {
        fclose(f);
        say(c, "%s: readable by others (mode %o): chmod 600 it", v, (unsigned)(st.st_mode & 0777));
        return false;
    }
    ok = fgets(line, sizeof(c->o->resp_password), f) != NULL;
    fclose(f);
    line[ok ? strcspn(line, "\r\n") : 0] = '\0';
    if (!line[0] || strlen(line) >= sizeof(c->o->resp_password) - 1) {
        say(c, "%s: the first line must hold the password (1..254 bytes)", v);
        line[0] = '\0';
        return false;
    }
    c->o->resp_password_file = c->flags ? v : keep(v);
    return true;
}

static bool set_protect(struct ctx *c, const char *v) { return boolean(c, v, &c->o->protect); }

static bool set_pool_size(struct ctx *c, const char *v)
{
    /* Its least depends on seg_size, which may come later. */
    c->pool_size = c->flags ? v : keep(v);
    snprintf(c->pool_size_prog, sizeof(c->pool_size_prog), "%s", c->prog);
    snprintf(c->pool_size_name, sizeof(c->pool_size_name), "%s", c->name);
    return true;
}

static bool set_seg_size(struct ctx *c, const char *v)
{
    uint64_t x;

    if (!num(c, v, 64u << 10, 1u << 30, OPT_SIZE, &x))
        return false;
    c->o->seg_size = (uint32_t)x;
    snprintf(c->seg_size_prog, sizeof(c->seg_size_prog), "%s", c->prog);
    snprintf(c->seg_size_name, sizeof(c->seg_size_name), "%s", c->name);
    return true;
}

/* "LO:HI", both 32-bit, LO <= HI. */
static bool set_range(struct ctx *c, const char *v)
{
    const char *colon = strchr(v, ':');
    uint64_t lo, hi;
    char los[32];

    if (!colon || (size_t)(colon - v) >= sizeof(los)) {
        say(c, "%s is not LO:HI", v);
        return false;
    }
    snprintf(los, sizeof(los), "%.*s", (int)(colon - v), v);
    if (!num(c, los, 0, UINT32_MAX, 0, &lo) || !num(c, colon + 1, 0, UINT32_MAX, 0, &hi))
        return false;
    if (lo > hi) {
        say(c, "%s is empty (LO is above HI)", v);
        return false;
    }
    c->o->range_lo = (uint32_t)lo;
    c->o->range_hi = (uint32_t)hi;
    return true;
}

static bool port(struct ctx *c, const char *v, int *out)
{
    uint64_t x;

    if (strcasecmp(v, "off") == 0) {
        *out = -1;
        return true;
    }
    if (!num(c, v, 0, 65535, 0, &x))
        return false;
    *out = (int)x;
    return true;
}

static bool set_resp_port(struct ctx *c, const char *v) { return port(c, v, &c->o->resp_port); }
static bool set_mongo_port(struct ctx *c, const char *v) { return port(c, v, &c->o->mongo_port); }

/* A host name: labels of 1..63 letters, digits and '-', not starting or
 * ending with '-', joined by '.' (RFC 1123); *last gets its last label. */
static bool host_name_ok(const char *v, const char **last)
{
    const char *p = v;

    if (!*v)
        return false;
    for (;;) {
        size_t k = strcspn(p, ".");

        if (k < 1 || k > 63 || p[0] == '-' || p[k - 1] == '-')
            return false;
        for (size_t i = 0; i < k; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '-')
                return false;
        *last = p;
        if (!p[k])
            return true;
        p += k + 1;
    }
}

/* Where the MongoDB gateway listens: an IPv4 or IPv6 address, or a host
 * name that resolves. Checked here, so that a typo is said with its file
 * and line before any pool is opened, not as a failed bind after. */
static bool set_mongo_host(struct ctx *c, const char *v)
{
    unsigned char a[sizeof(struct in6_addr)];
    const char *last = v;

    if (strlen(v) > TERND_MONGO_HOST_MAX) {
        say(c, "longer than %d characters (it is registered in etcd as HOST:PORT)",
            TERND_MONGO_HOST_MAX);
        return false;
    }
    if (inet_pton(AF_INET, v, a) == 1 || inet_pton(AF_INET6, v, a) == 1) {
        c->o->mongo_host = c->flags ? v : keep(v);
        return true;
    }
    if (v[0] == '[') {
        say(c, "'%s': write an IPv6 address without brackets", v);
        return false;
    }
    if (!host_name_ok(v, &last)) {
        say(c, "'%s' is not an IPv4 or IPv6 address nor a host name", v);
        return false;
    }
    /* All digits and dots is an IPv4 address that inet_pton refused
     * ("10.1.2", "010.0.0.1"): the resolver would read it its own way. */
    if (strspn(last, "0123456789") == strlen(last)) {
        say(c, "'%s' is not an IPv4 address (A.B.C.D, each 0..255)", v);
        return false;
    }
#ifndef TERND_OPTS_NO_RESOLVE
    /* (The fuzz target checks the syntax only: no resolver per input.) */
    {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
        int rc = getaddrinfo(v, NULL, &hints, &ai);

        if (rc != 0) {
            say(c, "host name '%s' does not resolve: %s", v,
                rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
            return false;
        }
        freeaddrinfo(ai);
    }
#endif
    c->o->mongo_host = c->flags ? v : keep(v);
    return true;
}
static bool set_metrics_port(struct ctx *c, const char *v)
{
    return port(c, v, &c->o->metrics_port);
}

static bool set_coalesce(struct ctx *c, const char *v)
{
    uint64_t x;

    if (!num(c, v, 0, RESP_COALESCE_MAX_US, 0, &x))
        return false;
    c->o->coalesce_us = (unsigned)x;
    return true;
}

static bool set_helpers(struct ctx *c, const char *v)
{
    uint64_t x;

    if (!num(c, v, 0, TERND_MAX_HELPERS, 0, &x))
        return false;
    c->o->helpers = (unsigned)x;
    return true;
}

static bool set_doc(struct ctx *c, const char *v) { return boolean(c, v, &c->o->doc); }

static bool set_doc_pool(struct ctx *c, const char *v)
{
    /* 4 KiB of header and four 32 MiB segments at least. */
    return num(c, v, 4096 + (128ull << 20), POOL_MAX, OPT_SIZE, &c->o->doc_pool_size);
}

static bool set_coll_pool(struct ctx *c, const char *v)
{
    /* 4 KiB of header and four 1 MiB segments at least. */
    return num(c, v, 4096 + (4ull << 20), POOL_MAX, OPT_SIZE, &c->o->coll_pool_size);
}

static bool set_chain(struct ctx *c, const char *v) { return boolean(c, v, &c->o->chain.on); }

static bool set_chain_id(struct ctx *c, const char *v)
{
    return num(c, v, 1, UINT64_MAX, 0, &c->o->chain.chain);
}

static bool set_chain_size(struct ctx *c, const char *v)
{
    return num(c, v, 8u << 20, POOL_MAX, OPT_SIZE, &c->o->chain.size);
}

static bool set_chain_peer(struct ctx *c, const char *v)
{
    if (!uri_ok(c, v))
        return false;
    if (c->o->chain.n_peers == TERND_CHAIN_PEERS) {
        say(c, "at most %d", TERND_CHAIN_PEERS);
        return false;
    }
    c->o->chain.peers[c->o->chain.n_peers++] = c->flags ? v : keep(v);
    return true;
}

static bool set_producers(struct ctx *c, const char *v)
{
    return boolean(c, v, &c->o->chain.producers);
}

static bool set_chain_workers(struct ctx *c, const char *v)
{
    uint64_t x;

    if (strcasecmp(v, "auto") == 0) {
        c->o->chain.workers = UINT32_MAX;
        return true;
    }
    if (!num(c, v, 0, 16, 0, &x))
        return false;
    c->o->chain.workers = (unsigned)x;
    return true;
}

static bool set_chain_fault(struct ctx *c, const char *v)
{
    int k = opt_choice(c->prog, c->name, v, fault_names, NULL);

    c->o->chain.fault = k >= 0 ? k : 0;
    return k >= 0;
}

static bool fabric_list(struct ctx *c, const char *v, struct ternd_fabric_list *out)
{
    struct ternd_fabric_list l = {0};
    const char *p = v;

    while (*p) {
        size_t n = strcspn(p, ",");
        int k = -1;

        for (int i = 0; fabric_names[i]; i++)
            if (strlen(fabric_names[i]) == n && strncmp(p, fabric_names[i], n) == 0)
                k = i;
        if (k < 0) {
            say(c, "'%.*s' is not a fabric (tcp, shm, ntb, rdma)", (int)n, p);
            return false;
        }
        for (unsigned i = 0; i < l.n; i++)
            if (strcmp(l.name[i], fabric_names[k]) == 0) {
                say(c, "%s is named twice", fabric_names[k]);
                return false;
            }
        snprintf(l.name[l.n++], sizeof(l.name[0]), "%s", fabric_names[k]);
        p += n;
        if (*p == ',' && *++p == 0) {
            say(c, "a list may not end with ','");
            return false;
        }
    }
    if (!l.n) {
        say(c, "empty (say which fabrics, best first: ntb,rdma,tcp)");
        return false;
    }
    *out = l;
    return true;
}

static bool set_same_rack(struct ctx *c, const char *v)
{
    return fabric_list(c, v, &c->o->policy.same_rack);
}

static bool set_other_rack(struct ctx *c, const char *v)
{
    return fabric_list(c, v, &c->o->policy.other_rack);
}

/* "10.1.0.0/16 tcp": peers in that IPv4 subnet use that fabric. */
static bool set_subnet(struct ctx *c, const char *v)
{
    struct ternd_policy *p = &c->o->policy;
    char net[32], fab[16], extra;
    unsigned bits;
    struct in_addr a;
    struct ternd_fabric_list l;

    if (sscanf(v, "%31[0-9.]/%u %15s %c", net, &bits, fab, &extra) != 3 || bits > 32 ||
        inet_pton(AF_INET, net, &a) != 1) {
        say(c, "'%s' is not 'A.B.C.D/BITS FABRIC'", v);
        return false;
    }
    if (!fabric_list(c, fab, &l))
        return false;
    if (p->n_subnets == TERND_MAX_SUBNETS) {
        say(c, "at most %d subnets", TERND_MAX_SUBNETS);
        return false;
    }
    p->subnet[p->n_subnets].mask = bits ? ~0u << (32 - bits) : 0;
    p->subnet[p->n_subnets].net = ntohl(a.s_addr) & p->subnet[p->n_subnets].mask;
    p->subnet[p->n_subnets].bits = (uint8_t)bits;
    snprintf(p->subnet[p->n_subnets].fabric, sizeof(p->subnet[0].fabric), "%s", l.name[0]);
    p->n_subnets++;
    return true;
}

/* ---- the table ---- */

struct key {
    const char *section, *key;
    const char *flag;                /* NULL: file only */
    int has_arg;                     /* the flag takes a value */
    const char *implied;             /* no_argument flags: the value they stand for */
    bool (*set)(struct ctx *c, const char *v);
    bool repeat;
    const char *help;
};

static const struct key keys[] = {
    {"node", "name", "name", 1, NULL, set_name, false, "this node's name (default: the host name)"},
    {"node", "rack", "rack", 1, NULL, set_rack, false, "the rack it stands in (peers of the same rack prefer NTB)"},
    {"node", "data_dir", "data-dir", 1, NULL, set_data_dir, false, "pool files live here (default ./tern-data)"},
    {"node", "listen", "listen", 1, NULL, set_listen, true, "tern RPC address, up to 8 (default tcp://127.0.0.1:7300)"},
    {"node", "shm", "no-shm", 0, "no", set_shm, false, "offer shared memory to auto:// clients on this host (default yes)"},
    {"node", "spin_us", "spin-us", 1, NULL, set_spin, false, "poll this long after the last work before sleeping (0..1000000, default 20)"},
    {"node", "busy", "busy", 0, "yes", set_busy, false, "never sleep (lowest latency, one core always busy)"},
    {"node", "log_level", "log-level", 1, NULL, set_log_level, false, "error, warn, info or debug (default: TERN_LOG, else info)"},
    {"node", "metrics_port", "metrics-port", 1, NULL, set_metrics_port, false, "serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any; default off)"},
    {"node", "key_file", "key-file", 1, NULL, set_key_file, false, "the cluster key (64 hex digits, mode 600): peers and clients must prove they hold it"},
    {"node", "protected", "no-protected", 0, "no", set_protect, false, "without a key, serve processes of this host only (default yes)"},
    {"node", "log_file", "log-file", 1, NULL, set_log_file, false, "append logs here, an absolute path (default stderr); SIGHUP reopens it"},
    {"kv", "pool_size", "pool-size", 1, NULL, set_pool_size, false, "size of a new KV pool, k/m/g/t, at least four segments and 4k (default 256m)"},
    {"kv", "seg_size", "seg-size", 1, NULL, set_seg_size, false, "log segment size of a new KV pool, a power of two in 64k..1g (default 1m)"},
    {"kv", "range", "range", 1, NULL, set_range, false, "LO:HI, the 32-bit key-hash range this node owns (default all)"},
    {"kv", "resp_port", "resp-port", 1, NULL, set_resp_port, false, "serve the Redis protocol on 127.0.0.1:PORT (0: any; default off)"},
    {"kv", "resp_password_file", "resp-password-file", 1, NULL, set_resp_password_file, false, "clients of the RESP gateway AUTH with this file's first line (mode 600; default: the cluster key's hex digits if key_file is set, else no password)"},
    {"kv", "collections_pool_size", "collections-pool-size", 1, NULL, set_coll_pool, false, "size of a new pool for the RESP gateway's lists, hashes, sets and sorted sets (collections.pool), k/m/g/t (default 256m)"},
    {"kv", "resp_coalesce_us", "resp-coalesce-us", 1, NULL, set_coalesce, false, "under load, gather RESP commands this long before sleeping (0 off, default 50)"},
    {"kv", "flush_helpers", "flush-helpers", 1, NULL, set_helpers, false, "threads that take pieces of large flushes (PM pools; 0..64, default 0)"},
    {"doc", "enabled", "no-doc", 0, "no", set_doc, false, "host the document service on doc.pool (default yes)"},
    {"doc", "pool_size", "doc-pool-size", 1, NULL, set_doc_pool, false, "size of a new document pool, k/m/g/t (default 1g, sparse, 32m segments)"},
    {"doc", "mongo_port", "mongo-port", 1, NULL, set_mongo_port, false, "serve MongoDB's wire protocol on mongo_host:PORT (0: any; default off)"},
    {"doc", "mongo_host", "mongo-host", 1, NULL, set_mongo_host, false, "the gateway's listen address, IPv4, IPv6 or a host name (default 127.0.0.1; 0.0.0.0: every address)"},
    {"chain", "enabled", "chain", 0, "yes", set_chain, false, "host the block-sync service on chain.pool (default no)"},
    {"chain", "id", "chain-id", 1, NULL, set_chain_id, false, "a new chain file's chain id (default 0x7465726e)"},
    {"chain", "size", "chain-size", 1, NULL, set_chain_size, false, "a new chain file's size, k/m/g/t (default 1g, sparse)"},
    {"chain", "peer", "chain-peer", 1, NULL, set_chain_peer, true, "catch up from this peer once serving, up to 16"},
    {"chain", "producers", "chain-producers", 0, "yes", set_producers, false, "take new blocks from producers (tern chain append --uri)"},
    {"chain", "workers", "chain-workers", 1, NULL, set_chain_workers, false, "threads that check ranges while catching up (auto: one per core but one, at most 4)"},
    {"chain", "fault", "chain-fault", 1, NULL, set_chain_fault, false, "for tests: serve ranges badly (stall, merkle, truncate, order, parent)"},
    {"cluster", "etcd", "etcd", 1, NULL, set_etcd, false, "etcd's client URLs, http://HOST:PORT[,...]: register there under a lease (default: none, alone)"},
    {"cluster", "prefix", "etcd-prefix", 1, NULL, set_prefix, false, "the cluster's keys in etcd live under it (default /tern)"},
    {"cluster", "lease_ttl", "lease-ttl", 1, NULL, set_lease_ttl, false, "seconds a silent node stays registered (2..60, default 5)"},
    {"cluster", "shard", "shard", 1, NULL, set_shard, true, "a shard this node replicates (its map defined in etcd: tern shard define); up to 16"},
    {"cluster", "kv_shard", "kv-shard", 1, NULL, set_kv_shard, false, "the KV store is this shard (one of `shard`): writes go to its primary and are shipped to its other replicas (default: none, the store stands alone)"},
    {"cluster", "doc_shard", "doc-shard", 1, NULL, set_doc_shard, false, "the document store is this shard (one of `shard`), a MongoDB replica set of that name to drivers (default: none, the store stands alone)"},
    {"cluster", "repl_ship", "repl-ship", 1, NULL, set_repl_ship, false, "how a primary ships records to its backups: auto (into their rings where that needs no help from their CPU, else by call), one-sided (into their rings wherever the fabric can put) or call (default auto)"},
    {"cluster", "repl_log_mb", "repl-log-mb", 1, NULL, set_repl_log_mb, false, "MiB of recent writes kept in memory for replicas that fall behind (1..4096, default 32)"},
    {"policy", "same_rack", NULL, 0, NULL, set_same_rack, false, "fabrics for peers of this rack, best first (default shm,ntb,rdma,tcp)"},
    {"policy", "other_rack", NULL, 0, NULL, set_other_rack, false, "fabrics for peers of other racks (default rdma,tcp)"},
    {"policy", "subnet", NULL, 0, NULL, set_subnet, true, "'A.B.C.D/BITS FABRIC': peers in that subnet use that fabric, up to 16"},
};

#define N_KEYS (sizeof(keys) / sizeof(keys[0]))
/* A key's flag returns its index from getopt_long: below '?' and ':'. */
_Static_assert(N_KEYS < ':', "too many keys for getopt_long's values");

/* ---- the file ---- */

struct file {
    struct ctx *c;
    FILE *f;
    const char *path;
    unsigned line;                   /* of the text inih has now */
    unsigned set_at[N_KEYS];         /* line each key was set on */
    bool policy_only;                /* SIGHUP */
    bool failed;
    char section[64];                /* "peer NAME" sections: their peer */
    int peer;
};

/* inih's reader: fgets, counting lines. The lines inih would pass over
 * or cut are refused here, where their number is known: one longer than
 * INI_MAX_LINE, a '[' without ']', a line with no '=' (inih's indented
 * continuation lines included: one value per line). */
static char *read_line(char *buf, int len, void *arg)
{
    struct file *fl = arg;
    char *s = fgets(buf, len, fl->f);
    const char *p;
    size_t n;

    if (!s)
        return NULL;
    fl->line++;
    if (fl->failed)
        return s;
    n = strlen(s);
    snprintf(fl->c->prog, sizeof(fl->c->prog), "ternd: %s:%u", fl->path, fl->line);
    snprintf(fl->c->name, sizeof(fl->c->name), "syntax");
    for (p = s; *p && isspace((unsigned char)*p); p++)
        ;
    if (n == (size_t)len - 1 && s[n - 1] != '\n' && !feof(fl->f)) {
        say(fl->c, "line longer than %d characters", len - 2);
        fl->failed = true;
    } else if (*p && p != s && *p != ';' && *p != '#') {
        say(fl->c, "an indented line (inih would join it to the value above): one value "
            "per line, keys at the start of the line");
        fl->failed = true;
    } else if (*p == '[' ? !strchr(p, ']') : *p && *p != ';' && *p != '#' && !strchr(p, '=')) {
        say(fl->c, "not 'key = value' nor '[section]'");
        fl->failed = true;
    }
    return s;
}

static struct ternd_peer *peer_section(struct file *fl, const char *section)
{
    struct ternd_opts *o = fl->c->o;
    const char *name = section + 5;

    while (*name == ' ')
        name++;
    if (strcmp(fl->section, section) == 0)
        return &o->peers[fl->peer];
    snprintf(fl->c->name, sizeof(fl->c->name), "[%s]", section);
    for (unsigned i = 0; i < o->n_peers; i++)
        if (strcmp(o->peers[i].name, name) == 0) {
            say(fl->c, "a second section for peer %s", name);
            return NULL;
        }
    if (o->n_peers == TERND_MAX_PEERS) {
        say(fl->c, "at most %d peers", TERND_MAX_PEERS);
        return NULL;
    }
    if (!name_ok(fl->c, name, o->peers[o->n_peers].name))
        return NULL;
    snprintf(fl->section, sizeof(fl->section), "%s", section);
    fl->peer = (int)o->n_peers++;
    return &o->peers[fl->peer];
}

static bool peer_key(struct file *fl, struct ternd_peer *p, const char *key, const char *v)
{
    struct ctx *c = fl->c;

    if ((strcmp(key, "rack") == 0 && p->rack[0]) || (strcmp(key, "address") == 0 && p->address) ||
        (strcmp(key, "ntb") == 0 && p->ntb[0])) {
        say(c, "set twice");
        return false;
    }
    if (strcmp(key, "rack") == 0)
        return name_ok(c, v, p->rack);
    if (strcmp(key, "address") == 0) {
        if (strncmp(v, "tcp://", 6) != 0 || !strchr(v + 6, ':')) {
            say(c, "'%s' is not tcp://HOST:PORT (sessions to peers start on TCP)", v);
            return false;
        }
        p->address = keep(v);
        return true;
    }
    if (strcmp(key, "ntb") == 0) {
        /* The device whose other end is this peer: "hw" or "emu:NAME". */
        if (strcmp(v, "hw") != 0 && (strncmp(v, "emu:", 4) != 0 || !v[4] ||
                                     strspn(v + 4, "abcdefghijklmnopqrstuvwxyz"
                                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
                                         strlen(v + 4) || strlen(v) > 48)) {
            say(c, "'%s' is not an NTB device (hw, or emu:NAME of letters, digits, '.', '_', "
                "'-', at most 44)", v);
            return false;
        }
        snprintf(p->ntb, sizeof(p->ntb), "%s", v);
        return true;
    }
    say(c, "unknown key (a peer has address, rack and ntb)");
    return false;
}

static int on_pair(void *arg, const char *section, const char *key, const char *value)
{
    struct file *fl = arg;
    struct ctx *c = fl->c;

    if (fl->failed)
        return 1;                    /* the first mistake is the one said */
    snprintf(c->prog, sizeof(c->prog), "ternd: %s:%u", fl->path, fl->line);
    snprintf(c->name, sizeof(c->name), "[%s] %s", section, key);
    if (!*section) {
        snprintf(c->name, sizeof(c->name), "%s", key);
        say(c, "outside a section ([node], [kv], ...)");
        goto bad;
    }
    /* So that --check's "key = value" fits inih's line too. */
    if (strlen(value) > VALUE_MAX) {
        say(c, "longer than %d characters", VALUE_MAX);
        goto bad;
    }
    if (value[0] == ';') {           /* "key =;x": --check would print a comment */
        say(c, "a value may not start with ';'");
        goto bad;
    }
    if (strncmp(section, "peer ", 5) == 0) {
        struct ternd_peer *p;

        if (fl->policy_only)
            return 1;
        if (!(p = peer_section(fl, section)))
            goto bad;
        snprintf(c->name, sizeof(c->name), "[%s] %s", section, key);
        if (!peer_key(fl, p, key, value))
            goto bad;
        return 1;
    }
    for (unsigned i = 0; i < N_KEYS; i++) {
        if (strcmp(keys[i].section, section) != 0 || strcmp(keys[i].key, key) != 0)
            continue;
        if (fl->policy_only && strcmp(section, "policy") != 0)
            return 1;
        if (fl->set_at[i] && !keys[i].repeat) {
            say(c, "set twice (first on line %u)", fl->set_at[i]);
            goto bad;
        }
        fl->set_at[i] = fl->line;
        if (!keys[i].set(c, value))
            goto bad;
        return 1;
    }
    if (fl->policy_only)
        return 1;
    for (unsigned i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].section, section) == 0) {
            say(c, "unknown key (see ternd(8) or docs/TERND.md)");
            goto bad;
        }
    snprintf(c->name, sizeof(c->name), "[%s]", section);
    say(c, "unknown section (node, kv, doc, chain, cluster, policy, peer NAME)");
bad:
    fl->failed = true;
    return 1;
}

static bool load_stream(struct ctx *c, FILE *f, const char *path, bool policy_only)
{
    struct file fl = {.c = c, .f = f, .path = path, .policy_only = policy_only, .peer = -1};
    int rc;

    rc = ini_parse_stream(read_line, &fl, on_pair, &fl);
    if (fl.failed)
        return false;
    if (rc > 0) {                    /* inih's own: no '=' or an unclosed '[' */
        snprintf(c->prog, sizeof(c->prog), "ternd: %s:%d", path, rc);
        snprintf(c->name, sizeof(c->name), "syntax");
        say(c, "not 'key = value' nor '[section]'");
        return false;
    }
    if (rc < 0) {
        snprintf(c->prog, sizeof(c->prog), "ternd");
        snprintf(c->name, sizeof(c->name), "%s", path);
        say(c, "cannot be read");
        return false;
    }
    for (unsigned i = 0; !policy_only && i < c->o->n_peers; i++)
        if (!c->o->peers[i].address) {
            snprintf(c->prog, sizeof(c->prog), "ternd: %s", path);
            snprintf(c->name, sizeof(c->name), "[peer %s]", c->o->peers[i].name);
            say(c, "no address");
            return false;
        }
    return true;
}

static bool load_file(struct ctx *c, const char *path, bool policy_only)
{
    FILE *f = fopen(path, "r");
    bool ok;

    if (!f) {
        snprintf(c->prog, sizeof(c->prog), "ternd");
        snprintf(c->name, sizeof(c->name), "%s", path);
        say(c, "%s", strerror(errno));
        return false;
    }
    ok = load_stream(c, f, path, policy_only);
    fclose(f);
    return ok;
}

/* ---- defaults, checks that need every value, the whole parse ---- */

static void defaults(struct ternd_opts *o)
{
    *o = (struct ternd_opts){.data_dir = "./tern-data", .shm = true, .resp_port = -1,
                             .spin_us = 20, .coalesce_us = 50, .mongo_port = -1, .doc = true,
                             .log_level = -1, .metrics_port = -1, .protect = true,
                             .chain = {.chain = 0x7465726eull, .size = 1ull << 30,
                                       .workers = UINT32_MAX}};
    if (gethostname(o->name, sizeof(o->name)) != 0 || !o->name[0])
        snprintf(o->name, sizeof(o->name), "ternd");
    o->name[sizeof(o->name) - 1] = 0;
    /* Inside a rack, NTB first (shm when the peer is on this host);
     * across racks, RDMA; TCP reaches all. */
    o->policy.same_rack = (struct ternd_fabric_list){4, {"shm", "ntb", "rdma", "tcp"}};
    o->policy.other_rack = (struct ternd_fabric_list){2, {"rdma", "tcp"}};
    snprintf(o->prefix, sizeof(o->prefix), "/tern");
    o->lease_ttl = 5;
    o->repl_log_mb = 32;
}

/* A new pool's sizes, checked here because the pool would only say
 * "invalid argument". */
static bool check_sizes(struct ctx *c)
{
    struct ternd_opts *o = c->o;
    uint64_t seg = o->seg_size ? o->seg_size : DEFAULT_SEG, min = 4096 + 4 * seg;
    char segs[32], mins[32];

    if (seg & (seg - 1)) {
        opt_format(segs, sizeof(segs), seg, OPT_SIZE);
        fprintf(stderr, "%s: %s: %s is not a power of two\n", c->seg_size_prog,
                c->seg_size_name, segs);
        return false;
    }
    if (c->pool_size)
        return opt_num(c->pool_size_prog, c->pool_size_name, c->pool_size, min, POOL_MAX,
                       OPT_SIZE, &o->pool_size);
    if (DEFAULT_POOL < min) {
        opt_format(segs, sizeof(segs), seg, OPT_SIZE);
        opt_format(mins, sizeof(mins), 4 * seg, OPT_SIZE);
        fprintf(stderr, "%s: %s: %s segments need a pool_size of %s + 4k at least (four "
                "segments and the header; the default is 256m)\n", c->seg_size_prog,
                c->seg_size_name, segs, mins);
        return false;
    }
    return true;
}

static void usage_flags(FILE *f)
{
    fprintf(f, "usage: ternd [--config FILE [--check]] [options]\n"
               "       ternd --help | --version\n"
               "Every setting of the file has a flag, which wins over the file:\n");
    for (unsigned i = 0; i < N_KEYS; i++) {
        char left[48];

        if (!keys[i].flag)
            continue;
        snprintf(left, sizeof(left), "--%s%s", keys[i].flag, keys[i].has_arg ? " V" : "");
        fprintf(f, "  %-22s [%s] %s%s%s\n  %-22s   %s\n", left, keys[i].section, keys[i].key,
                keys[i].implied ? " = " : "", keys[i].implied ? keys[i].implied : "", "",
                keys[i].help);
    }
    fprintf(f, "  --config FILE          read the settings from FILE (INI) first\n"
               "  --check                print the resolved settings and exit (nothing is\n"
               "                         created; a mistake names the file, line and key)\n"
               "File only: [policy] same_rack, other_rack, subnet; [peer NAME] address\n"
               "(tcp://HOST:PORT), rack and ntb (the NTB device cabled to it): the nodes\n"
               "this one keeps sessions to. ternd(8) and docs/TERND.md say what each does. SIGTERM and SIGINT\n"
               "stop ternd cleanly; SIGHUP reloads [policy] and reopens the log file.\n");
}

int ternd_opts_parse(int argc, char **argv, struct ternd_opts *o)
{
    struct option longs[N_KEYS + 5];
    bool cleared[N_KEYS] = {0};
    struct ctx c = {.o = o};
    unsigned n = 0;
    int k;

    defaults(o);
    for (unsigned i = 0; i < N_KEYS; i++)
        if (keys[i].flag)
            longs[n++] = (struct option){keys[i].flag, keys[i].has_arg ? required_argument
                                                                        : no_argument,
                                         NULL, (int)i};
    longs[n++] = (struct option){"config", required_argument, NULL, 1000};
    longs[n++] = (struct option){"check", no_argument, NULL, 1001};
    longs[n++] = (struct option){"help", no_argument, NULL, 1002};
    longs[n++] = (struct option){"version", no_argument, NULL, 1003};
    longs[n] = (struct option){0};

    /* First the file (and --help, --version), then every other flag. */
    opterr = 0;
    while ((k = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        if (k == 1000)
            o->config = optarg;
        else if (k == 1001)
            o->check = true;
        else if (k == 1002) {
            usage_flags(stdout);
            return -1;
        } else if (k == 1003) {
            opt_version("ternd");
            return -1;
        }
    }
    if (o->config && !load_file(&c, o->config, false))
        return OPT_USAGE;
    optind = 1;
    opterr = 1;
    c.flags = true;
    snprintf(c.prog, sizeof(c.prog), "ternd");
    while ((k = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        const struct key *key;

        if (k >= 1000)
            continue;
        if (k < 0 || k >= (int)N_KEYS) {     /* getopt said what */
            fprintf(stderr, "Try 'ternd --help' for the options.\n");
            return OPT_USAGE;
        }
        key = &keys[k];
        snprintf(c.name, sizeof(c.name), "--%s", key->flag);
        /* A repeatable flag replaces the file's list. */
        if (key->repeat && !cleared[k]) {
            cleared[k] = true;
            if (key->set == set_listen)
                o->n_listen = 0;
            else if (key->set == set_chain_peer)
                o->chain.n_peers = 0;
            else if (key->set == set_shard)
                o->n_shards = 0;
        }
        if (!key->set(&c, key->has_arg ? optarg : key->implied))
            return OPT_USAGE;
    }
    if (optind != argc)
        return opt_usage_error("ternd", "unexpected argument '%s'", argv[optind]);
    if (o->check && !o->config)
        return opt_usage_error("ternd", "--check checks a --config FILE");
    if (!check_sizes(&c))
        return OPT_USAGE;
#if !TERN_HAVE_DOC
    if (o->mongo_port >= 0)
        return opt_usage_error("ternd", "--mongo-port: built without the document service "
                               "(libbson, PCRE2)");
    o->doc = false;
#endif
    if (o->mongo_port >= 0 && !o->doc)
        return opt_usage_error("ternd", "--mongo-port serves the document store: not with --no-doc");
    if (o->mongo_host && o->mongo_port < 0)
        return opt_usage_error("ternd", "--mongo-host is where the MongoDB gateway listens: it "
                               "needs --mongo-port");
    if (o->doc_shard[0] && !o->doc)
        return opt_usage_error("ternd", "--doc-shard replicates the document store: not with "
                               "--no-doc");
    if (o->doc_shard[0] && o->kv_shard[0] && strcmp(o->doc_shard, o->kv_shard) == 0)
        return opt_usage_error("ternd", "--doc-shard and --kv-shard name one shard: each store "
                               "is a shard of its own");
    if (!o->n_listen)
        o->listen[o->n_listen++] = "tcp://127.0.0.1:7300";
    if (!o->chain.on && (o->chain.n_peers || o->chain.producers || o->chain.fault))
        return opt_usage_error("ternd", "the --chain-... options need --chain");
#if !TERN_HAVE_BLOCKSYNC
    if (o->chain.on)
        return opt_usage_error("ternd", "--chain: built without the block-sync service "
                               "(libcrypto, libpmem)");
#endif
    for (unsigned i = 0; i < o->n_peers; i++)
        if (strcmp(o->peers[i].name, o->name) == 0)
            return opt_usage_error("ternd", "%s: [peer %s] is this node's own name",
                                   o->config, o->name);
    return 0;
}

int ternd_opts_load_stream(FILE *f, const char *name, struct ternd_opts *o)
{
    struct ctx c = {.o = o};

    defaults(o);
    o->config = name;
    if (!load_stream(&c, f, name, false))
        return OPT_USAGE;
    return check_sizes(&c) ? 0 : OPT_USAGE;
}

int ternd_opts_reload_policy(const struct ternd_opts *o, struct ternd_policy *policy)
{
    struct ternd_opts tmp;
    struct ctx c = {.o = &tmp, .reload = true};

    if (!o->config)
        return 0;
    defaults(&tmp);
    if (!load_file(&c, o->config, true))
        return -1;
    *policy = tmp.policy;
    return 0;
}

void ternd_fabric_list_text(const struct ternd_fabric_list *l, char *buf, size_t len)
{
    size_t at = 0;

    buf[0] = 0;
    for (unsigned i = 0; i < l->n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "," : "", l->name[i]);
}

static const char *yes_no(bool b) { return b ? "yes" : "no"; }

void ternd_opts_print(FILE *f, const struct ternd_opts *o)
{
    char a[64], b[64];

    fprintf(f, "# ternd's settings as resolved from %s and the flags\n", o->config);
    fprintf(f, "[node]\nname = %s\n", o->name);
    if (o->rack[0])
        fprintf(f, "rack = %s\n", o->rack);
    fprintf(f, "data_dir = %s\n", o->data_dir);
    for (unsigned i = 0; i < o->n_listen; i++)
        fprintf(f, "listen = %s\n", o->listen[i]);
    fprintf(f, "shm = %s\nspin_us = %u\nbusy = %s\nlog_level = %s\n", yes_no(o->shm), o->spin_us,
            yes_no(o->busy), o->log_level >= 0 ? level_names[o->log_level] : "warn");
    if (o->log_file)
        fprintf(f, "log_file = %s\n", o->log_file);
    if (o->metrics_port >= 0)
        fprintf(f, "metrics_port = %d\n", o->metrics_port);
    if (o->key_file)
        fprintf(f, "key_file = %s\n", o->key_file);
    fprintf(f, "protected = %s\n", yes_no(o->protect));
    opt_format(a, sizeof(a), o->pool_size ? o->pool_size : DEFAULT_POOL, OPT_SIZE);
    opt_format(b, sizeof(b), o->seg_size ? o->seg_size : DEFAULT_SEG, OPT_SIZE);
    fprintf(f, "\n[kv]\npool_size = %s\nseg_size = %s\nrange = %u:%u\n", a, b, o->range_lo,
            o->range_hi || o->range_lo ? o->range_hi : UINT32_MAX);
    if (o->resp_port >= 0)
        fprintf(f, "resp_port = %d\n", o->resp_port);
    else
        fprintf(f, "resp_port = off\n");
    if (o->resp_password_file)
        fprintf(f, "resp_password_file = %s\n", o->resp_password_file);
    opt_format(a, sizeof(a), o->coll_pool_size ? o->coll_pool_size : 256ull << 20, OPT_SIZE);
    fprintf(f, "collections_pool_size = %s\n", a);
    fprintf(f, "resp_coalesce_us = %u\nflush_helpers = %u\n", o->coalesce_us, o->helpers);
    opt_format(a, sizeof(a), o->doc_pool_size ? o->doc_pool_size : 1ull << 30, OPT_SIZE);
    fprintf(f, "\n[doc]\nenabled = %s\npool_size = %s\n", yes_no(o->doc), a);
    if (o->mongo_port >= 0)
        fprintf(f, "mongo_port = %d\nmongo_host = %s\n", o->mongo_port,
                o->mongo_host ? o->mongo_host : "127.0.0.1");
    else
        fprintf(f, "mongo_port = off\n");
    opt_format(a, sizeof(a), o->chain.size, OPT_SIZE);
    fprintf(f, "\n[chain]\nenabled = %s\nid = 0x%llx\nsize = %s\n", yes_no(o->chain.on),
            (unsigned long long)o->chain.chain, a);
    for (unsigned i = 0; i < o->chain.n_peers; i++)
        fprintf(f, "peer = %s\n", o->chain.peers[i]);
    fprintf(f, "producers = %s\n", yes_no(o->chain.producers));
    if (o->chain.workers == UINT32_MAX)
        fprintf(f, "workers = auto\n");
    else
        fprintf(f, "workers = %u\n", o->chain.workers);
    if (o->chain.fault)
        fprintf(f, "fault = %s\n", fault_names[o->chain.fault]);
    if (o->etcd) {
        fprintf(f, "\n[cluster]\netcd = %s\nprefix = %s\nlease_ttl = %u\n", o->etcd, o->prefix,
                o->lease_ttl);
        for (unsigned i = 0; i < o->n_shards; i++)
            fprintf(f, "shard = %s\n", o->shards[i]);
        if (o->kv_shard[0])
            fprintf(f, "kv_shard = %s\n", o->kv_shard);
        if (o->doc_shard[0])
            fprintf(f, "doc_shard = %s\n", o->doc_shard);
        if (o->kv_shard[0] || o->doc_shard[0])
            fprintf(f, "repl_log_mb = %u\nrepl_ship = %s\n", o->repl_log_mb,
                    o->repl_ship == 1 ? "one-sided" : o->repl_ship == 2 ? "call" : "auto");
    }
    ternd_fabric_list_text(&o->policy.same_rack, a, sizeof(a));
    ternd_fabric_list_text(&o->policy.other_rack, b, sizeof(b));
    fprintf(f, "\n[policy]\nsame_rack = %s\nother_rack = %s\n", a, b);
    for (unsigned i = 0; i < o->policy.n_subnets; i++) {
        struct in_addr in = {.s_addr = htonl(o->policy.subnet[i].net)};
        char net[INET_ADDRSTRLEN];

        inet_ntop(AF_INET, &in, net, sizeof(net));
        fprintf(f, "subnet = %s/%u %s\n", net, o->policy.subnet[i].bits,
                o->policy.subnet[i].fabric);
    }
    for (unsigned i = 0; i < o->n_peers; i++) {
        fprintf(f, "\n[peer %s]\naddress = %s\n", o->peers[i].name, o->peers[i].address);
        if (o->peers[i].rack[0])
            fprintf(f, "rack = %s\n", o->peers[i].rack);
        if (o->peers[i].ntb[0])
            fprintf(f, "ntb = %s\n", o->peers[i].ntb);
    }
}

void ternd_opts_free(struct ternd_opts *o)
{
    for (unsigned i = 0; i < n_owned; i++)
        free(owned[i]);
    free(owned);
    owned = NULL;
    n_owned = cap_owned = 0;
    (void)o;
}
