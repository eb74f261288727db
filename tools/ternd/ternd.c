/* ternd: the tern daemon. It hosts the key-value service (kv.pool), the
 * document service (doc.pool) and, with [chain] enabled, the block-sync
 * service (chain.pool: tools/ternd/chain.c) on pools under data_dir,
 * serves them over tern RPC (TCP, plus shm for clients on this host that
 * come in through auto://), with resp_port also speaks the Redis protocol
 * on the KV store (its lists, hashes, sets and sorted sets on
 * collections.pool), and with mongo_port MongoDB's wire protocol on the
 * document store (on 127.0.0.1, or mongo_host). Its settings come from a
 * configuration file and flags (opts.h; ternd(8) lists them).
 *
 *   ternd [--config FILE [--check]] [options]
 *   ternd --help | --version
 *
 * One thread runs everything: RPC handlers and gateway commands touch the
 * stores without locks. When all have been idle for spin_us it sleeps on
 * one epoll set holding the RPC endpoint's fd and the gateways'. With
 * flush_helpers, that many more threads take pieces of the store's large
 * flushes (tern_kv_service_help) and touch nothing else. SIGTERM and
 * SIGINT stop it cleanly: clients are closed, the pool is synced and
 * unlocked. SIGHUP reloads [policy] from the file and reopens log_file.
 * Once serving it prints one line, "ternd ready ...", on stdout; logs go to
 * stderr (or log_file) in tern's one format (log.h). A start that fails
 * (exit 1) removes the pool file it created, if it created one; usage and
 * configuration errors exit 2.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include "doc_repl.h"
#include "doc_service.h"
#include "doc_wire.h"
#include "mongo_gw.h"
#endif
#include "kv.h"
#include "kv_service_internal.h"
#include "replica.h"
#if TERN_HAVE_CLUSTER
#include "member.h"
#endif
#include "log.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "opt.h"
#include "resp.h"
#include "rpc.h"
#include "node.h"
#include "opts.h"
#include "ternd_chain.h"

#define MAX_HELPERS TERND_MAX_HELPERS

static struct tern_rpc_ep *g_ep;
static volatile int g_stop;     /* a sig_atomic_t; the chain's catch-up reads it too */

static volatile sig_atomic_t g_hup;
static struct ternd_policy g_policy;   /* [policy] as last (re)loaded */
static struct ternd_node *g_node;
static struct ternd_replica *g_replica;    /* [cluster] kv_shard */
static struct ternd_replica *g_doc_replica; /* [cluster] doc_shard */

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
    if (g_ep)
        tern_rpc_stop(g_ep);
}

static void on_hup(int sig)
{
    (void)sig;
    g_hup = 1;
    if (g_ep)
        tern_rpc_stop(g_ep);
}

/* stderr to log_file (appended), so the library's lines go there too. */
static int open_log(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);

    if (fd < 0)
        return -errno;
    if (dup2(fd, STDERR_FILENO) < 0) {
        int e = errno;

        close(fd);
        return -e;
    }
    close(fd);
    return 0;
}

/* SIGHUP: a log rotated away is let go, and [policy] is read again (a
 * mistake in the file keeps the policy in force and says why). */
static void reload(const struct ternd_opts *o)
{
    struct ternd_policy p;
    char a[64], b[64];
    int rc;

    if (o->log_file && (rc = open_log(o->log_file)) < 0)
        tern_log(TERN_LOG_ERROR, "ternd", "log_file %s: %s: logging on where it was",
                 o->log_file, strerror(-rc));
    if (!o->config) {
        tern_log(TERN_LOG_INFO, "ternd", "SIGHUP: log reopened; no configuration file to reload");
        return;
    }
    if (ternd_opts_reload_policy(o, &p) < 0) {
        tern_log(TERN_LOG_ERROR, "ternd", "SIGHUP: %s not reloaded: the policy stays as it was",
                 o->config);
        return;
    }
    g_policy = p;
    ternd_node_set_policy(g_node, &p);
    ternd_fabric_list_text(&p.same_rack, a, sizeof(a));
    ternd_fabric_list_text(&p.other_rack, b, sizeof(b));
    tern_log(TERN_LOG_INFO, "ternd", "SIGHUP: policy reloaded from %s: same_rack=%s "
             "other_rack=%s, %u subnet rule%s", o->config, a, b, p.n_subnets,
             p.n_subnets == 1 ? "" : "s");
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

/* ---- replicated stores ---- */

static void kv_attach(void *arg, struct repl *r)
{
    kv_service_replicate(arg, r);
}

#if TERN_HAVE_DOC
/* The document store's records go to its group's log. */
static void doc_tap(void *arg, bool tomb, const void *key, uint16_t klen, const void *val,
                    uint32_t len, uint64_t version)
{
    repl_written(arg, tomb ? REPL_DEL : REPL_SET, key, klen, val, len, version);
}

/* What a replica-set member's hello says of the set: drivers find the
 * members (hosts: their MongoDB gateways, from their registrations), the
 * primary, and which of two primaries is newer (electionId: the epoch,
 * as MongoDB's term). */
static void doc_hello(void *arg, bson_t *reply, bool primary)
{
    const struct ternd_opts *o = arg;
    struct cl_shard_role role;
    bson_t hosts;
    const char *me = "", *prim = "";
    char idx[16];

    bson_append_utf8(reply, "setName", -1, o->doc_shard, -1);
    bson_append_int32(reply, "setVersion", -1, 1);
    if (!ternd_replica_role(g_doc_replica, &role))
        return;
    /* Learners are MongoDB's passives (members that never stand); drivers
     * read from one only once its hello says secondary (it holds a whole
     * copy). */
    for (int passive = 0; passive < 2; passive++) {
        unsigned k = 0;

        if (!passive)
            bson_append_array_begin(reply, "hosts", -1, &hosts);
        for (unsigned i = 0; i < role.n_replicas; i++) {
            if (!role.mongo[i][0] || (role.vote[i] == CL_LEARNER) != passive)
                continue;
            if (k == 0 && passive)
                bson_append_array_begin(reply, passive ? "passives" : "hosts", -1, &hosts);
            snprintf(idx, sizeof(idx), "%u", k++);
            bson_append_utf8(&hosts, idx, -1, role.mongo[i], -1);
            if (!strcmp(role.replicas[i], o->name))
                me = role.mongo[i];
            if (!strcmp(role.replicas[i], role.primary))
                prim = role.mongo[i];
        }
        if (k || !passive)
            bson_append_array_end(reply, &hosts);
    }
    /* Not MongoDB's (drivers pass over it): where the members serve tern
     * RPC, for native clients (tern_doc) to learn the set from any of them. */
    {
        unsigned k = 0;

        bson_append_array_begin(reply, "ternMembers", -1, &hosts);
        for (unsigned i = 0; i < role.n_replicas; i++) {
            if (!role.addrs[i][0])
                continue;
            snprintf(idx, sizeof(idx), "%u", k++);
            bson_append_utf8(&hosts, idx, -1, role.addrs[i], -1);
        }
        bson_append_array_end(reply, &hosts);
    }
    if (me[0])
        bson_append_utf8(reply, "me", -1, me, -1);
    if (prim[0])
        bson_append_utf8(reply, "primary", -1, prim, -1);
    if (primary) {
        bson_oid_t oid;
        uint8_t b[12] = {0x7f, 0xff, 0xff, 0xff};

        for (int i = 0; i < 8; i++)
            b[4 + i] = (uint8_t)(role.epoch >> (56 - 8 * i));
        bson_oid_init_from_data(&oid, b);
        bson_append_oid(reply, "electionId", -1, &oid);
    }
}

/* The address the MongoDB gateway is reached at, "HOST:PORT", for the
 * node's registration and so for every member's hello (hosts, primary,
 * me): drivers on other hosts connect to what it says. mongo_host as
 * given, unless it is a wildcard (0.0.0.0, ::), which no driver can
 * dial: then this node's own address, from its first tcp:// listen
 * address that names one, else its host name. */
static void mongo_advertise(const struct ternd_opts *o, char (*bound)[256], unsigned n_bound,
                            uint16_t port, char *out, size_t cap)
{
    const char *host = o->mongo_host ? o->mongo_host : "127.0.0.1";
    unsigned char a[sizeof(struct in6_addr)];
    char name[256];

    if ((inet_pton(AF_INET, host, a) == 1 && !memcmp(a, "\0\0\0", 4)) ||
        (inet_pton(AF_INET6, host, a) == 1 && !memcmp(a, &in6addr_any, sizeof(in6addr_any)))) {
        for (unsigned i = 0; i < n_bound; i++) {
            const char *h = bound[i] + 6, *colon = strrchr(bound[i], ':');

            if (strncmp(bound[i], "tcp://", 6) != 0 || !colon || colon <= h ||
                !strncmp(h, "0.0.0.0:", 8) || !strncmp(h, "[::]:", 5))
                continue;
            snprintf(out, cap, "%.*s:%u", (int)(colon - h), h, port);
            return;
        }
        if (gethostname(name, sizeof(name)) != 0 || !name[0])
            snprintf(name, sizeof(name), "%s", o->name);
        name[sizeof(name) - 1] = 0;
        tern_log(TERN_LOG_WARN, "ternd", "[doc] mongo_host = %s: no tcp:// listen address "
                 "names this host, so the gateway is registered as %s:%u (the host name)",
                 host, name, port);
        host = name;
    }
    snprintf(out, cap, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
}

struct doc_link {
    const struct ternd_opts *o;
    struct doc_store *store;
    struct doc_server *srv;
};

static void doc_attach(void *arg, struct repl *r)
{
    struct doc_link *d = arg;

    doc_store_set_tap(d->store, r ? doc_tap : NULL, r);
    doc_server_replicate(d->srv, r, r ? doc_hello : NULL, (void *)d->o);
}
#endif

/* A store named as a shard: etcd and the shard among [cluster] shard. */
static int shard_ok(const struct ternd_opts *o, const char *what, const char *shard)
{
    bool listed = false;

    for (unsigned i = 0; i < o->n_shards; i++)
        listed |= strcmp(o->shards[i], shard) == 0;
    if (o->etcd && listed)
        return 0;
    tern_log(TERN_LOG_ERROR, "ternd", "[cluster] %s = %s needs etcd and the shard among "
             "[cluster] shard", what, shard);
    return TERN_EINVAL;
}

/* The loop. RPC is "hot" for --spin-us after its last event: it is polled
 * every round (its fabrics are polled without system calls where they can
 * be), and the gateways every 16th. Once RPC is quiet the thread blocks in
 * the first gateway's epoll, which watches the next gateway's epoll fd,
 * and the last watches the endpoint's fd: a gateway-only load costs one
 * epoll_wait per batch, as in Redis. */
static void serve(const struct ternd_opts *o, struct tern_rpc_ep *ep, struct gw *gws, unsigned ngw,
                  struct tern_kv_service *svc)
{
    uint64_t spin = (uint64_t)o->spin_us * 1000u, last_rpc = tern_now_ns(), next_rpc = 0;
    uint64_t next_expire = 0;
    bool due = false;                /* a full batch of expired keys went: more wait */
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
        /* One clock read a pass: it is most of an idle pass's cost. */
        uint64_t now = tern_now_ns();
        bool hot = o->busy || now - last_rpc < spin;

        if (g_hup) {
            g_hup = 0;
            reload(o);
        }
        int n = 0;

        /* Quiet RPC is still polled every 10 ms: its housekeeping (a
         * handshake's deadline, a path to mend) and the sessions a
         * replication group opens need the poll, not only its fd. */
        if (hot || !ngw || now >= next_rpc) {
            n = tern_rpc_poll(ep);
            next_rpc = now + 10000000u;
            if (n > 0)
                last_rpc = now;
        }
        /* Records shipped one-sided raise no event: whatever they freed
         * (a gateway's held reply) is seen by polling hot, not by a wait. */
        bool freed = ternd_replica_tick(g_replica, now);

        freed = ternd_replica_tick(g_doc_replica, now) || freed;
        if (freed) {
            last_rpc = now;
            hot = true;
        }
        /* Keys past their deadline, ten times a second (Redis's hz), or at
         * once again while a full batch was due. */
        if (now >= next_expire) {
            int removed = tern_kv_service_tick(svc, 0);

            due = removed >= 1000;
            next_expire = now + (due ? 0 : 100000000u);
        }
        if (ngw && (!hot || (++tick & 15) == 0)) {
            int timeout = 0;

            /* Block only when RPC is quiet and armed; if it has work
             * owed, poll it hot instead. */
            if (!hot && !due) {
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
        if (n > 0 || sleeper < 0 || hot || due)
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
    struct kvc *coll = NULL;
#if TERN_HAVE_DOC
    struct mongo_gw *mgw = NULL;
    struct doc_store *dstore = NULL;
    struct doc_server *dsrv = NULL;
    struct doc_link dlink;
    struct tern_doc_service *dsvc = NULL;
#endif
    struct ternd_chain *chain = NULL;
    struct gw gws[2];
    unsigned ngw = 0;
    struct kvs_stats st;
    char pool[4096], bound[256], line[1400];
    char bound_uris[TERND_MAX_LISTEN + 1 + 2 * TERND_MAX_PEERS][256];
    unsigned n_bound = 0;
    bool made_dir, new_pool, new_cpool = false;
    char cpool[PATH_MAX] = "";
#if TERN_HAVE_DOC
    char dpool[4096], maddr[128] = "";
    bool new_dpool = false;
#endif
    struct stat pst;
    struct ternd_opts o;
    size_t at;
    int rc;

    /* A hang-up before the handler is in must not stop the store. */
    signal(SIGHUP, SIG_IGN);
    rc = ternd_opts_parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;       /* -1: --help or --version */
    if (o.check) {
        ternd_opts_print(stdout, &o);
        ternd_opts_free(&o);
        return 0;
    }
    if (o.log_level >= 0)
        tern_log_set_level((enum tern_log_level)o.log_level);
    else if (!getenv("TERN_LOG"))
        tern_log_set_level(TERN_LOG_INFO);   /* a daemon says when it starts and stops */
    else
        tern_log_enabled(TERN_LOG_INFO);     /* a TERN_LOG that names no level is said now */
    if (o.log_file && (rc = open_log(o.log_file)) < 0) {
        fprintf(stderr, "ternd: log_file %s: %s\n", o.log_file, strerror(-rc));
        return 1;
    }
    g_policy = o.policy;
    tern_log(TERN_LOG_DEBUG, "ternd", "node %s%s%s starting%s%s", o.name, o.rack[0] ? " rack " : "",
             o.rack, o.config ? " from " : "", o.config ? o.config : "");
    made_dir = mkdir(o.data_dir, 0700) == 0;
    if (!made_dir && errno != EEXIST) {
        tern_log(TERN_LOG_ERROR, "ternd", "%s: %s", o.data_dir, strerror(errno));
        return 1;
    }
    snprintf(pool, sizeof(pool), "%s/kv.pool", o.data_dir);
    new_pool = stat(pool, &pst) < 0 && errno == ENOENT;
    ko = (struct tern_kv_service_opts){.pool_path = pool, .pool_size = o.pool_size,
                                       .seg_size = o.seg_size, .range_lo = o.range_lo,
                                       .range_hi = o.range_hi};
    rc = tern_kv_service_open(&ko, &svc);
    if (rc < 0) {
        tern_log(TERN_LOG_ERROR, "ternd", "pool %s: %s", pool, tern_strerror(rc));
        if (rc == TERN_ECORRUPT)
            tern_log(TERN_LOG_ERROR, "ternd", "run `tern pool check %s` for the offset; the file was "
                    "left as it is", pool);
        if (made_dir)
            rmdir(o.data_dir);
        return 1;
    }
#if TERN_HAVE_DOC
    /* The document store, its commands (shared by RPC and the MongoDB
     * gateway) and its RPC service. */
    if (o.doc) {
        /* A replicated store's documents must each fit a replication
         * batch, which is at most a message (1 MiB with its headers). */
        struct doc_store_opts dso = {.pool_size = o.doc_pool_size, .create = true,
                                     .max_doc = o.doc_shard[0] ? 1000u << 10 : 0};
        struct doc_err de = {0};

        snprintf(dpool, sizeof(dpool), "%s/doc.pool", o.data_dir);
        new_dpool = stat(dpool, &pst) < 0 && errno == ENOENT;
        rc = doc_store_open(dpool, &dso, &dstore, &de);
        if (rc < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "document pool %s: %s", dpool, de.msg);
        if (rc == 0 && (rc = doc_server_open(dstore, NULL, &dsrv)) < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "document service: %s", tern_strerror(rc));
        if (rc == 0 && (rc = doc_service_new(dsrv, 0, &dsvc)) < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "document service: %s", tern_strerror(rc));
        dlink = (struct doc_link){.o = &o, .store = dstore, .srv = dsrv};
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
    /* Who is served: holders of the cluster key, or without one (the
     * embedded default) processes of this host, unless protected = no. */
    cfg.size = sizeof(cfg);
    cfg.key = o.key_len ? o.key : NULL;
    cfg.key_len = o.key_len;
    cfg.local_only = !o.key_len && o.protect;
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
    if (rc == 0 && !o.kv_shard[0] &&
        (rc = tern_kv_service_enable_onesided(svc, g_ep, NULL)) < 0)
        tern_log(TERN_LOG_ERROR, "ternd", "one-sided paths: %s", tern_strerror(rc));
#if TERN_HAVE_DOC
    /* Large document results go one-sided to clients that take them. */
    if (rc == 0 && dsvc && (rc = tern_doc_service_enable_onesided(dsvc, g_ep, 0)) < 0)
        tern_log(TERN_LOG_ERROR, "ternd", "document one-sided batches: %s", tern_strerror(rc));
#endif
    at = (size_t)snprintf(line, sizeof(line), "ternd ready");
    for (unsigned i = 0; rc == 0 && i < o.n_listen; i++) {
        rc = tern_rpc_listen(g_ep, o.listen[i], bound, sizeof(bound));
        if (rc < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "listen %s: %s", o.listen[i], tern_strerror(rc));
        else if (at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " %s", bound);
        if (rc == 0 && n_bound < sizeof(bound_uris) / sizeof(bound_uris[0]))
            snprintf(bound_uris[n_bound++], sizeof(bound_uris[0]), "%s", bound);
    }
    /* Each NTB cable to a peer: this end's two partitions (opts.h). */
    for (unsigned i = 0; rc == 0 && i < o.n_peers; i++)
        for (unsigned k = 0; rc == 0 && o.peers[i].ntb[0] && k < 2; k++) {
            char uri[128];

            snprintf(uri, sizeof(uri), "ntb://%s/%u", o.peers[i].ntb,
                     ternd_ntb_part(o.name, o.peers[i].name, k));
            rc = tern_rpc_listen(g_ep, uri, bound, sizeof(bound));
            if (rc < 0)
                tern_log(TERN_LOG_ERROR, "ternd", "listen %s (the cable to %s): %s", uri,
                         o.peers[i].name, tern_strerror(rc));
            else if (at < sizeof(line))
                at += (size_t)snprintf(line + at, sizeof(line) - at, " %s", bound);
            if (rc == 0 && n_bound < sizeof(bound_uris) / sizeof(bound_uris[0]))
                snprintf(bound_uris[n_bound++], sizeof(bound_uris[0]), "%s", bound);
        }
    /* Same-host clients that come in by auto:// move to shared memory. */
    if (rc == 0 && o.shm) {
        rc = tern_rpc_listen(g_ep, "shm://auto", bound, sizeof(bound));
        if (rc < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "listen shm: %s", tern_strerror(rc));
        else if (at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " %s", bound);
        if (rc == 0 && n_bound < sizeof(bound_uris) / sizeof(bound_uris[0]))
            snprintf(bound_uris[n_bound++], sizeof(bound_uris[0]), "%s", bound);
    }
#if TERN_HAVE_DOC
    /* The MongoDB gateway listens now (its address goes into the node's
     * registration) and serves once the loop runs. */
    if (rc == 0 && o.mongo_port >= 0) {
        struct mongo_gw_config mc = {.host = o.mongo_host, .port = (uint16_t)o.mongo_port};

        rc = mongo_gw_create(dsrv, &mc, &mgw);
        if (rc < 0) {
            tern_log(TERN_LOG_ERROR, "ternd", "--mongo-port: %s:%d: %s",
                     o.mongo_host ? o.mongo_host : "127.0.0.1", o.mongo_port, tern_strerror(rc));
        } else {
            const char *mh = o.mongo_host ? o.mongo_host : "127.0.0.1";

            /* The cluster key covers tern RPC only: say what is exposed. */
            if (strncmp(mh, "127.", 4) != 0 && strcmp(mh, "::1") != 0 &&
                strcmp(mh, "localhost") != 0)
                tern_log(TERN_LOG_WARN, "ternd", "[doc] mongo_host = %s: the MongoDB gateway "
                         "has no authentication (the cluster key covers tern RPC only): "
                         "whoever reaches port %u there reads and writes every document", mh,
                         mongo_gw_port(mgw));
            mongo_advertise(&o, bound_uris, n_bound, mongo_gw_port(mgw), maddr, sizeof(maddr));
            if (at < sizeof(line))
                at += (size_t)snprintf(line + at, sizeof(line) - at, " mongo=%s", maddr);
        }
    }
#endif
    /* The node service, the peer sessions and the metrics. */
    if (rc == 0) {
        char svcs[64];

        snprintf(svcs, sizeof(svcs), "kv%s%s",
#if TERN_HAVE_DOC
                 dsvc ? ",doc" : "",
#else
                 "",
#endif
                 chain ? ",blocksync" : "");
        rc = ternd_node_start(&o, svcs, g_ep, &g_node);
        if (rc < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "node service: %s", tern_strerror(rc));
        for (unsigned i = 0; rc == 0 && i < n_bound; i++)
            ternd_node_add_listen(g_node, bound_uris[i]);
#if TERN_HAVE_DOC
        if (rc == 0 && mgw)
            ternd_node_set_mongo(g_node, maddr);
#endif
        if (rc == 0 && (rc = ternd_node_join(g_node)) < 0)
            tern_log(TERN_LOG_ERROR, "ternd", "[cluster] etcd: %s", tern_strerror(rc));
        else if (rc == 0 && o.etcd && at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " etcd=%s%s", o.etcd, o.prefix);
        if (rc == 0 && o.kv_shard[0]) {
            struct ternd_replica_def def = {.shard = o.kv_shard, .state_file = "kv.repl",
                                            .ops = &kv_repl_ops, .ctx = svc,
                                            .attach = kv_attach, .attach_arg = svc};

            if ((rc = shard_ok(&o, "kv_shard", o.kv_shard)) < 0) {
                /* said */
            } else if ((rc = ternd_replica_open(&o, g_node, g_ep, &def, &g_replica)) < 0) {
                tern_log(TERN_LOG_ERROR, "ternd", "[cluster] kv_shard = %s: %s", o.kv_shard,
                         tern_strerror(rc));
            } else {
                ternd_node_set_replica(g_node, g_replica);
                if (at < sizeof(line))
                    at += (size_t)snprintf(line + at, sizeof(line) - at, " kv_shard=%s",
                                           o.kv_shard);
            }
        }
#if TERN_HAVE_DOC
        if (rc == 0 && o.doc_shard[0]) {
            struct ternd_replica_def def = {.shard = o.doc_shard, .state_file = "doc.repl",
                                            .ops = &doc_repl_ops, .ctx = dstore,
                                            .attach = doc_attach, .attach_arg = &dlink};

            if ((rc = shard_ok(&o, "doc_shard", o.doc_shard)) < 0) {
                /* said */
            } else if ((rc = ternd_replica_open(&o, g_node, g_ep, &def, &g_doc_replica)) < 0) {
                tern_log(TERN_LOG_ERROR, "ternd", "[cluster] doc_shard = %s: %s", o.doc_shard,
                         tern_strerror(rc));
            } else {
                ternd_node_set_doc_replica(g_node, g_doc_replica);
                if (at < sizeof(line))
                    at += (size_t)snprintf(line + at, sizeof(line) - at, " doc_shard=%s",
                                           o.doc_shard);
            }
        }
#endif
        if (rc == 0 && ternd_node_metrics_port(g_node) >= 0 && at < sizeof(line))
            at += (size_t)snprintf(line + at, sizeof(line) - at, " metrics=127.0.0.1:%d",
                                   ternd_node_metrics_port(g_node));
    }
    /* The RESP gateway writes the store directly, with no write concern
     * and on any replica: not on a replicated store. */
    if (rc == 0 && o.resp_port >= 0 && g_replica) {
        tern_log(TERN_LOG_WARN, "ternd", "[kv] resp_port: no RESP gateway on a replicated "
                 "store (kv_shard = %s); use the KV protocol", o.kv_shard);
        o.resp_port = -1;
    }
    if (rc == 0 && o.resp_port >= 0) {
        struct resp_config rc_cfg = {.port = (uint16_t)o.resp_port,
                                          .coalesce_us = o.coalesce_us};
        char key_hex[2 * sizeof(o.key) + 1];

        /* AUTH: the password file's, else the cluster key's hex digits. */
        if (o.resp_password[0]) {
            rc_cfg.password = o.resp_password;
        } else if (o.key_len) {
            for (size_t i = 0; i < o.key_len; i++)
                snprintf(key_hex + 2 * i, 3, "%02x", o.key[i]);
            rc_cfg.password = key_hex;
        }

        struct stat cst;
        struct kvc_opts co = {.path = cpool, .pool_size = o.coll_pool_size ? o.coll_pool_size
                                                                           : 256ull << 20};

        snprintf(cpool, sizeof(cpool), "%s/collections.pool", o.data_dir);
        new_cpool = stat(cpool, &cst) < 0 && errno == ENOENT;
        rc = kvc_open(&co, &coll);
        if (rc < 0) {
            tern_log(TERN_LOG_ERROR, "ternd", "%s: %s", cpool, tern_strerror(rc));
        } else {
            rc_cfg.collections = coll;
            rc = resp_gw_create(kv_service_store(svc), &rc_cfg, &gw);
            if (rc < 0)
                tern_log(TERN_LOG_ERROR, "ternd", "--resp-port: 127.0.0.1:%d: %s", o.resp_port,
                        tern_strerror(rc));
            else if (at < sizeof(line))
                at += (size_t)snprintf(line + at, sizeof(line) - at, " resp=127.0.0.1:%u",
                                       resp_gw_port(gw));
        }
    }
    /* A replica's store may be wiped for a full copy (its pool made anew):
     * no thread may hold on to the pool then. */
    if (rc == 0 && g_replica && o.helpers) {
        tern_log(TERN_LOG_WARN, "ternd", "[kv] flush_helpers: none on a replicated store");
        o.helpers = 0;
    }
    if (rc == 0 && (rc = start_helpers(svc, o.helpers)) < 0)
        tern_log(TERN_LOG_ERROR, "ternd", "flush helpers: %s", tern_strerror(rc));
    if (rc < 0) {
        stop_helpers();
        ternd_replica_close(g_replica);
        ternd_replica_close(g_doc_replica);
        ternd_node_stop(g_node);
#if TERN_HAVE_DOC
        mongo_gw_destroy(mgw);
#endif
        resp_gw_destroy(gw);
        kvc_close(coll);
        if (new_cpool)
            unlink(cpool);
        tern_rpc_close(g_ep);
        ternd_replica_free(g_replica);
        ternd_replica_free(g_doc_replica);
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
    /* Once serving (a start that fails says one line, its reason). */
    if (o.key_len)
        tern_log(TERN_LOG_INFO, "ternd", "peers and clients prove they hold the cluster key "
                 "of %s", o.key_file);
    else if (o.protect)
        tern_log(TERN_LOG_WARN, "ternd", "no cluster key: only processes of this host are "
                 "served (protected mode); set [node] key_file, or protected = no to serve "
                 "any host");
    else
        tern_log(TERN_LOG_WARN, "ternd", "no cluster key and protected = no: every host that "
                 "reaches a listen address is served, unauthenticated");
    printf("%s\n", line);
    fflush(stdout);

    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGHUP, on_hup);
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
    serve(&o, g_ep, gws, ngw, svc);

    stop_helpers();
    ternd_replica_close(g_replica);
    ternd_replica_close(g_doc_replica);
    ternd_node_stop(g_node);
#if TERN_HAVE_DOC
    mongo_gw_destroy(mgw);
#endif
    resp_gw_destroy(gw);
    kvc_close(coll);
    tern_rpc_close(g_ep);
    ternd_replica_free(g_replica);
    ternd_replica_free(g_doc_replica);
#if TERN_HAVE_DOC
    tern_doc_service_close(dsvc);
    doc_server_close(dsrv);
    doc_store_close(dstore);
#endif
    ternd_chain_close(chain, false);
    tern_kv_service_close(svc);
    tern_log(TERN_LOG_INFO, "ternd", "stopped");
    explicit_bzero(o.key, sizeof(o.key));
    ternd_opts_free(&o);
    return 0;
}
