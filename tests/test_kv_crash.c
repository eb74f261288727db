/* Suite kv_crash: kill -9 the KV server at random points while a client
 * keeps puts and deletes in flight, restart it on the same pool, and check
 * that every acknowledged write is there with its last acknowledged value
 * (or the value of a write that was in flight when the server died), that
 * no acknowledged delete came back, and that every committed record passes
 * its checksum. The pool is small, so cleaning runs all the time and kills
 * land in the middle of it too.
 *
 * The same loop runs once per variant (_i, see variants[]): the client on
 * the RPC path over TCP and shared memory, and on the one-sided fast paths
 * (kv.h: TERN_KV_PATH_ONESIDED, TERN_KV_PATH_AUTO) against servers that
 * serve them, where PUTs are records the client writes into a leased
 * segment and GETs read the server's index window and pool directly. Those
 * variants also check that the fast paths carried a good share of the PUTs
 * and of verify()'s GETs, so that they cannot pass on RPC alone.
 *
 * TERN_CRASH_ROUNDS sets the number of kill points of every variant
 * (default: 100 for the RPC one, 60 for the others); TERN_CRASH_VERBOSE=1
 * prints what each variant did and how long it took. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "kv_servers.h"
#include "kv.h"
#include "pm/pm.h"
#include "suites.h"
#include "tern_config.h"

#define SEG (64u * 1024)
#define KEYS 200
#define WINDOW 8
#define VAL_CAP 2048                 /* longest value of any variant, and some */
#define AUTO_MIN 1024u               /* AUTO PUTs of this much value go one-sided (kv.h) */

/* ---- variants ---- */

struct variant {
    const char *name;
    enum tern_kv_path path;
    bool onesided;                   /* the server serves the one-sided paths */
    const char *listen[2];           /* fabric of even and odd rounds (a row of
                                      * tests/lib/fabrics.h, by name); NULL:
                                      * every fabric of the matrix in turn */
    const char *last;                /* fabric of the final check */
    unsigned pad_min, pad_span;      /* value padding: pad_min + [0, pad_span) bytes */
    unsigned rounds;                 /* kill points by default */
};

/* The fast-path variants run 60 rounds by default (TERN_CRASH_ROUNDS sets
 * every variant's): with the RPC variant's 100 the suite, which CI runs
 * twice (plain and sanitized builds), stays within about a minute on a
 * loaded two-CPU host. Mutants of the one-sided PUT's durability (no
 * commit, the reply before the commit, leased records never committed)
 * failed every fast-path variant within a few rounds, AUTO (which leases
 * only half its PUTs) within about 25. */
static const struct variant variants[] = {
    /* The RPC path, each round on the next fabric of the matrix (tcp,
     * shm, ntb on an emulated device, rdma where built); values from 8 to
     * ~700 bytes, so records straddle cache lines and pages. */
    {"rpc", TERN_KV_PATH_RPC, false, {NULL, NULL}, "tcp",
     0, 700, 100},
    /* Every PUT through a leased segment once a lease is granted (the
     * first ones of a round, and those while a full segment is replaced,
     * go by RPC meanwhile), every GET from the window and the pool. */
    {"onesided-shm", TERN_KV_PATH_ONESIDED, true, {"shm", "shm"}, "shm",
     0, 700, 60},
    /* AUTO: values of 1 KiB and more go one-sided, smaller ones inline in
     * an RPC; the lengths (~520 to ~1550 bytes) straddle 1 KiB, so each
     * round mixes both paths on the same keys. */
    {"auto-shm", TERN_KV_PATH_AUTO, true, {"shm", "shm"}, "shm",
     AUTO_MIN / 2, AUTO_MIN, 60},
#if TERN_HAVE_RDMA
    /* The same over rdma (softverbs unless TERN_RDMA_LOCAL_IP names a NIC's
     * address): a record goes by RDMA WRITE from a staging slot and its
     * LPUT right behind it on the same session; a GET is two RDMA READs. */
    {"onesided-rdma", TERN_KV_PATH_ONESIDED, true, {"rdma", "rdma"}, "rdma",
     0, 700, 60},
    {"auto-rdma", TERN_KV_PATH_AUTO, true, {"rdma", "rdma"}, "rdma",
     AUTO_MIN / 2, AUTO_MIN, 60},
#endif
};
#define N_VARIANTS ((int)(sizeof(variants) / sizeof(variants[0])))

/* The variant under test. */
static const struct variant *var;

/* Server 0 of tests/lib/kv_servers.h on `fabric`, on the one pool. */
static void start_server(const char *fabric)
{
    static const struct tern_rpc_config busy = {0};
    struct test_kv_srv o = {.listen = test_fabric_listen(test_fabric_row(fabric)),
                            .pool_size = 24 * SEG + 4096, .seg_size = SEG,
                            .onesided = var->onesided, .cfg = &busy};

    ck_assert_int_ge(test_fabric_row(fabric), 0);
    test_kv_start(0, &o);
}

/* ---- the writer and what it expects ---- */

/* What a key may hold: its state after the last acknowledged write, or
 * after any write still in flight (seq 0: absent). */
struct key_state {
    uint64_t acked;                  /* value seq after the last ack; 0 = absent */
    uint64_t inflight[WINDOW + 1];   /* results of writes not yet acknowledged */
    unsigned n_inflight;
};

static struct key_state keys[KEYS];
static char vals[WINDOW * 2][VAL_CAP + 64];

struct pending {
    int key;
    uint64_t result;                 /* the seq the key holds once this applies */
    bool busy;
    int len;                         /* of the value (a PUT) */
    bool lease_held;                 /* sent after the round's first lease came */
    char *val;
};

static struct pending pend[WINDOW];
static unsigned n_busy;
static uint64_t n_acked;
static uint64_t n_puts_acked, n_big_puts_acked;    /* big: AUTO_MIN bytes and more */
/* The fast paths: a round's PUTs go by RPC until its first lease comes.
 * Acknowledged writes sent after that (all of them on the RPC path), and
 * of them the PUTs that could have gone through the lease (AUTO: the big
 * ones). */
static uint64_t n_leased_acks, n_eligible;

/* "key:seq:" and then padding that depends on seq and position, so that a
 * record put together from two writes, or shifted, does not pass. */
static int value_of(uint64_t seq, int key, char *buf)
{
    int pad = (int)(var->pad_min + (seq * 2654435761u) % var->pad_span);
    int n = snprintf(buf, VAL_CAP + 64, "%d:%llu:", key, (unsigned long long)seq);

    for (int j = 0; j < pad; j++)
        buf[n + j] = (char)('a' + (seq * 7 + (uint64_t)j * 13) % 26);
    buf[n + pad] = '\0';
    return n + pad;
}

static void drop_inflight(struct key_state *ks, uint64_t result)
{
    for (unsigned i = 0; i < ks->n_inflight; i++)
        if (ks->inflight[i] == result) {
            ks->inflight[i] = ks->inflight[--ks->n_inflight];
            return;
        }
}

static void on_ack(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct pending *p = arg;
    struct key_state *ks = &keys[p->key];

    (void)val;
    (void)len;
    (void)version;
    p->busy = false;
    n_busy--;
    /* An ENOENT delete changed nothing, like an acknowledged one. */
    if (status == 0 || (p->result == 0 && status == TERN_ENOENT)) {
        ks->acked = p->result;
        drop_inflight(ks, p->result);
        n_acked++;
        n_leased_acks += p->lease_held;
        if (status == 0 && p->result) {
            bool big = p->len >= (int)AUTO_MIN;

            n_puts_acked++;
            n_big_puts_acked += big;
            n_eligible += p->lease_held && (big || var->path != TERN_KV_PATH_AUTO);
        }
    }
    /* Any other failure (the server died) leaves the write in doubt: it
     * stays in the in-flight set. */
}

/* Keep WINDOW writes going until `until_ms`, or until the session dies.
 * On a host so loaded that fewer than ROUND_ACKS writes were acknowledged
 * by then (on the fast paths: since the round's first lease came), go on
 * until they are, for up to 2 s more: every kill should find writes of the
 * path under test in flight. Unloaded rounds see hundreds. */
#define ROUND_ACKS 12
static void write_until(struct tern_rpc_ep *ep, struct tern_kv *kv, uint64_t *seq,
                        double until_ms, unsigned *rnd)
{
    uint64_t acked0 = n_leased_acks;
    bool leased = var->path == TERN_KV_PATH_RPC;
    double now;

    while ((now = now_ms()) < until_ms ||
           (n_leased_acks - acked0 < ROUND_ACKS && now < until_ms + 2000)) {
        for (unsigned w = 0; w < WINDOW && n_busy < WINDOW; w++) {
            struct pending *p = &pend[w];
            char k[16];
            int rc, klen;

            if (p->busy)
                continue;
            p->key = (int)(rand_r(rnd) % KEYS);
            /* One write per key at a time keeps "in flight" simple. */
            if (keys[p->key].n_inflight)
                continue;
            klen = snprintf(k, sizeof(k), "k%d", p->key);
            p->val = vals[w];
            if (!leased) {
                struct tern_kv_onesided_stats st;

                tern_kv_get_onesided_stats(kv, &st);
                leased = st.leases > 0;
            }
            p->lease_held = leased;
            if (rand_r(rnd) % 8 == 0) {
                p->result = 0;
                p->len = 0;
                rc = tern_kv_del_async(kv, k, (size_t)klen, on_ack, p);
            } else {
                p->result = ++*seq;
                p->len = value_of(p->result, p->key, p->val);
                rc = tern_kv_put_async(kv, k, (size_t)klen, p->val, (size_t)p->len, on_ack, p);
            }
            if (rc < 0)
                return;     /* the session is gone */
            p->busy = true;
            n_busy++;
            struct key_state *ks = &keys[p->key];
            ks->inflight[ks->n_inflight++] = p->result;
        }
        if (tern_rpc_poll(ep) < 0)
            return;
    }
}

static bool allowed(const struct key_state *ks, uint64_t got)
{
    if (got == ks->acked)
        return true;
    for (unsigned i = 0; i < ks->n_inflight; i++)
        if (ks->inflight[i] == got)
            return true;
    return false;
}

/* After a restart: every key holds an allowed state; that state becomes
 * the acknowledged one. Returns how many keys were present. */
static unsigned verify(struct tern_kv *kv, unsigned round)
{
    static char buf[VAL_CAP + 64], want[VAL_CAP + 64];
    unsigned present = 0;

    for (int i = 0; i < KEYS; i++) {
        struct key_state *ks = &keys[i];
        unsigned long long seq = 0;
        size_t len = 0;
        char k[16];
        int key = -1, rc;

        snprintf(k, sizeof(k), "k%d", i);
        rc = tern_kv_get(kv, k, strlen(k), buf, sizeof(buf) - 1, &len, NULL);
        if (rc == 0) {
            buf[len] = '\0';
            ck_assert_msg(sscanf(buf, "%d:%llu:", &key, &seq) == 2 && key == i,
                          "%s round %u: %s holds a foreign or torn value", var->name, round, k);
            ck_assert_int_eq(value_of(seq, i, want), (int)len);
            ck_assert_msg(memcmp(buf, want, len) == 0, "%s round %u: %s value torn",
                          var->name, round, k);
            present++;
        } else {
            ck_assert_msg(rc == TERN_ENOENT, "%s round %u: get %s: %s", var->name, round, k,
                          tern_strerror(rc));
        }
        ck_assert_msg(allowed(ks, seq),
                      "%s round %u: %s holds seq %llu, acknowledged %llu (%u in flight)",
                      var->name, round, k, seq, (unsigned long long)ks->acked, ks->n_inflight);
        ks->acked = seq;
        ks->n_inflight = 0;
    }
    return present;
}

static unsigned rounds(void)
{
    const char *e = getenv("TERN_CRASH_ROUNDS");
    unsigned n = e ? (unsigned)atoi(e) : 0;

    return n ? n : var->rounds;
}

/* ---- the fast paths' share ---- */

struct os_tally {
    uint64_t gets_direct, puts, leases, torn;
    uint64_t present;                /* verify() GETs of present keys */
};

static void os_add(struct os_tally *t, const struct tern_kv_onesided_stats *st)
{
    t->gets_direct += st->gets_direct;
    t->puts += st->puts;
    t->leases += st->leases;
    t->torn += st->torn;
}

/* A client for `uri` on the variant's path. */
static struct tern_kv *open_kv(struct tern_rpc_ep *ep, const char *uri)
{
    const char *uris[] = {uri};
    struct tern_kv *kv;
    int rc;

    rc = tern_kv_open(ep, uris, 1, 2000000000ull, &kv);
    ck_assert_msg(rc == 0, "%s: open %s: %s", var->name, uri, tern_strerror(rc));
    tern_kv_set_timeout(kv, 2000000000ull);
    if (var->path != TERN_KV_PATH_RPC) {
        rc = tern_kv_set_path(kv, var->path);
        ck_assert_msg(rc == 0, "%s: set_path: %s", var->name, tern_strerror(rc));
    }
    return kv;
}

/* Poll `ep` until no process holds the pool's lock (pm_open's flock)
 * any more. The lock dies with the server: a lessee's mapping of its
 * segment was handed out through a descriptor of its own that holds none
 * (pm_fd), so this should take no poll at all. Returns the polls it
 * took. */
static unsigned wait_pool_unlocked(struct tern_rpc_ep *ep, unsigned round)
{
    double end = now_ms() + 10000;
    unsigned polls = 0;

    for (;;) {
        int fd = open(test_kv_pool(0), O_RDONLY | O_CLOEXEC);
        bool free_now;

        ck_assert_int_ge(fd, 0);
        free_now = flock(fd, LOCK_EX | LOCK_NB) == 0;
        close(fd);
        if (free_now)
            return polls;
        ck_assert_msg(now_ms() < end, "%s round %u: the killed server's pool stays locked",
                      var->name, round);
        tern_rpc_poll(ep);
        polls++;
    }
}

START_TEST(kill9_loses_no_acknowledged_write)
{
    struct tern_rpc_ep *ep;
    struct os_tally t = {0};
    struct tern_kv_onesided_stats st;
    unsigned rnd = (unsigned)getpid(), n;
    uint64_t seq = 0;
    unsigned max_polls = 0;
    double t0 = now_ms();

    var = &variants[_i];
    n = rounds();
    /* Fresh state whether or not Check forks for each variant. */
    memset(keys, 0, sizeof(keys));
    memset(pend, 0, sizeof(pend));
    n_busy = 0;
    n_acked = n_puts_acked = n_big_puts_acked = n_leased_acks = n_eligible = 0;
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    for (unsigned round = 0; round < n; round++) {
        struct tern_kv *kv;

        start_server(var->listen[0] ? var->listen[round % 2]
                                    : test_fabric_name((int)(round % (unsigned)test_fabric_count())));
        kv = open_kv(ep, test_kv_uri(0));
        t.present += verify(kv, round);    /* what the last kill left */
        write_until(ep, kv, &seq, now_ms() + 2 + rand_r(&rnd) % 30, &rnd);
        test_kv_kill(0);
        /* Let the in-flight calls fail (the session sees the death). */
        while (n_busy)
            tern_rpc_poll(ep);
        tern_kv_get_onesided_stats(kv, &st);
        os_add(&t, &st);
        tern_kv_close(kv);
        {
            unsigned polls = wait_pool_unlocked(ep, round);

            max_polls = polls > max_polls ? polls : max_polls;
        }
        /* Nothing torn below a commit point. */
        ck_assert_msg(pm_check(test_kv_pool(0), true, NULL, NULL, NULL) == 0,
                      "%s round %u: the pool fails its check after kill -9", var->name, round);
    }
    /* A last restart to verify the final kill's state. */
    {
        struct tern_kv *kv;

        start_server(var->last);
        kv = open_kv(ep, test_kv_uri(0));

        t.present += verify(kv, n);
        tern_kv_get_onesided_stats(kv, &st);
        os_add(&t, &st);
        tern_kv_close(kv);
        test_kv_finish(0);
    }
    /* TERN_CRASH_VERBOSE=1: what each variant did, and how long it took. */
    if (getenv("TERN_CRASH_VERBOSE"))
        fprintf(stderr,
                "kv_crash %s: %u rounds, %.0f ms; %llu acked (%llu puts, %llu of 1 KiB+); "
                "one-sided: %llu of %llu puts, %llu leases, %llu of %llu GETs, %llu torn; "
                "%u polls for the pool lock\n",
                var->name, n, now_ms() - t0, (unsigned long long)n_acked,
                (unsigned long long)n_puts_acked, (unsigned long long)n_big_puts_acked,
                (unsigned long long)t.puts, (unsigned long long)n_eligible,
                (unsigned long long)t.leases,
                (unsigned long long)t.gets_direct, (unsigned long long)t.present,
                (unsigned long long)t.torn, max_polls);
    ck_assert_uint_gt(n_acked, 10 * n);     /* the rounds did write */
    if (var->path == TERN_KV_PATH_RPC) {
        ck_assert_uint_eq(t.puts + t.gets_direct + t.leases, 0);
    } else {
        /* The fast paths did the work. A PUT goes by RPC while a lease is
         * asked for: a round's first ones, and those while a full segment
         * is replaced (in this small pool, after some cleaning). Of those
         * sent once the round had a lease, about 65% go one-sided on shm
         * with ONESIDED and 95% on rdma; of AUTO's big ones 45-55% on shm
         * and 90% on rdma; more on a loaded host, where rounds are short.
         * The bars below leave room under the lowest of those. AUTO takes
         * no small PUT one-sided. Every GET of a present key is answered
         * from the window and the pool: nothing writes while verify()
         * reads. */
        unsigned share = var->path == TERN_KV_PATH_AUTO ? 25 : 40;     /* percent */

        ck_assert_msg(t.leases >= n / 4, "%s: %llu leases in %u rounds", var->name,
                      (unsigned long long)t.leases, n);
        ck_assert_msg(t.puts <= n_eligible, "%s: %llu one-sided PUTs, only %llu could be",
                      var->name, (unsigned long long)t.puts, (unsigned long long)n_eligible);
        ck_assert_msg(n_eligible >= n && t.puts * 100 >= n_eligible * share,
                      "%s: %llu of %llu PUTs went one-sided, less than %u%%", var->name,
                      (unsigned long long)t.puts, (unsigned long long)n_eligible, share);
        ck_assert_msg(t.present > 10 * n && t.gets_direct * 10 >= t.present * 9,
                      "%s: %llu of %llu GETs of present keys were one-sided", var->name,
                      (unsigned long long)t.gets_direct, (unsigned long long)t.present);
    }
    tern_rpc_close(ep);
    test_kv_cleanup();
}
END_TEST

Suite *suite_kv_crash(void)
{
    Suite *s = suite_create("kv_crash");
    TCase *tc = tcase_create("kill9");

    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, kill9_loses_no_acknowledged_write, 0, N_VARIANTS);
    suite_add_tcase(s, tc);
    return s;
}
