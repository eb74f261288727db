/* Suite kv_crash: kill -9 the KV server at random points while a client
 * keeps puts and deletes in flight, restart it on the same pool, and check
 * that every acknowledged write is there with its last acknowledged value
 * (or the value of a write that was in flight when the server died), that
 * no acknowledged delete came back, and that every committed record passes
 * its checksum. The pool is small, so cleaning runs all the time and kills
 * land in the middle of it too.
 *
 * TERN_CRASH_ROUNDS sets the number of kill points (default 100). */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "kv.h"
#include "pm/pm.h"
#include "suites.h"

#define SEG (64u * 1024)
#define KEYS 200
#define WINDOW 8
#define MAX_VAL 700

static char dir[64], pool_path[128];

static void kv_setup(struct tern_rpc_ep *ep)
{
    struct tern_kv_service_opts o = {.pool_path = pool_path, .pool_size = 24 * SEG + 4096,
                                     .seg_size = SEG};
    struct tern_kv_service *svc;

    if (tern_kv_service_create(&o, &svc) != 0 || tern_rpc_register(ep, tern_kv_service_def(svc)))
        _exit(3);
}

/* What a key may hold: its state after the last acknowledged write, or
 * after any write still in flight (seq 0: absent). */
struct key_state {
    uint64_t acked;                  /* value seq after the last ack; 0 = absent */
    uint64_t inflight[WINDOW + 1];   /* results of writes not yet acknowledged */
    unsigned n_inflight;
};

static struct key_state keys[KEYS];
static char vals[WINDOW * 2][MAX_VAL + 64];

struct pending {
    int key;
    uint64_t result;                 /* the seq the key holds once this applies */
    bool busy;
    char *val;
};

static struct pending pend[WINDOW];
static unsigned n_busy;
static uint64_t n_acked;

static int value_of(uint64_t seq, int key, char *buf)
{
    /* Lengths from 8 to ~MAX_VAL bytes, so records straddle cache lines
     * and pages. */
    int pad = (int)((seq * 2654435761u) % MAX_VAL);

    return snprintf(buf, MAX_VAL + 64, "%d:%llu:%0*d", key, (unsigned long long)seq, pad, 0);
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

    p->busy = false;
    n_busy--;
    /* An ENOENT delete changed nothing, like an acknowledged one. */
    if (status == 0 || (p->result == 0 && status == TERN_ENOENT)) {
        ks->acked = p->result;
        drop_inflight(ks, p->result);
        n_acked++;
    }
    /* Any other failure (the server died) leaves the write in doubt: it
     * stays in the in-flight set. */
}

/* Keep WINDOW writes going until `until_ms`, or until the session dies. */
static void write_until(struct tern_rpc_ep *ep, struct tern_kv *kv, uint64_t *seq,
                        double until_ms, unsigned *rnd)
{
    while (now_ms() < until_ms) {
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
            if (rand_r(rnd) % 8 == 0) {
                p->result = 0;
                rc = tern_kv_del_async(kv, k, (size_t)klen, on_ack, p);
            } else {
                p->result = ++*seq;
                int len = value_of(p->result, p->key, p->val);

                rc = tern_kv_put_async(kv, k, (size_t)klen, p->val, (size_t)len, on_ack, p);
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
 * the acknowledged one. */
static void verify(struct tern_kv *kv, unsigned round)
{
    static char buf[MAX_VAL + 64], want[MAX_VAL + 64];

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
                          "round %u: %s holds a foreign or torn value", round, k);
            ck_assert_int_eq(value_of(seq, i, want), (int)len);
            ck_assert_msg(memcmp(buf, want, len) == 0, "round %u: %s value torn", round, k);
        } else {
            ck_assert_msg(rc == TERN_ENOENT, "round %u: get %s: %s", round, k, tern_strerror(rc));
        }
        ck_assert_msg(allowed(ks, seq),
                      "round %u: %s holds seq %llu, acknowledged %llu (%u in flight)", round, k,
                      seq, (unsigned long long)ks->acked, ks->n_inflight);
        ks->acked = seq;
        ks->n_inflight = 0;
    }
}

static unsigned rounds(void)
{
    const char *e = getenv("TERN_CRASH_ROUNDS");
    unsigned n = e ? (unsigned)atoi(e) : 100;

    return n ? n : 100;
}

START_TEST(kill9_loses_no_acknowledged_write)
{
    struct tern_rpc_ep *ep;
    unsigned rnd = (unsigned)getpid(), n = rounds();
    uint64_t seq = 0;

    test_pool_dir(dir, sizeof(dir), "crash");
    snprintf(pool_path, sizeof(pool_path), "%s/kv.pool", dir);
    ck_assert_int_eq(tern_rpc_ep_create(NULL, &ep), 0);
    for (unsigned round = 0; round < n; round++) {
        /* Alternate the fabric: TCP and shared memory. */
        char uri[160];
        const char *listen = round % 2 ? "shm://auto" : "tcp://127.0.0.1:0";
        pid_t pid = spawn_rpc_server_at(kv_setup, NULL, listen, uri, sizeof(uri));
        struct tern_kv *kv;
        const char *uris[] = {uri};
        int st;

        ck_assert_int_gt(pid, 0);
        ck_assert_int_eq(tern_kv_open(ep, uris, 1, 2000000000ull, &kv), 0);
        tern_kv_set_timeout(kv, 2000000000ull);
        verify(kv, round);              /* what the last kill left */
        write_until(ep, kv, &seq, now_ms() + 2 + rand_r(&rnd) % 30, &rnd);
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        /* Let the in-flight calls fail (the session sees the death). */
        while (n_busy)
            tern_rpc_poll(ep);
        tern_kv_close(kv);
        /* Nothing torn below a commit point. */
        ck_assert_msg(tern_pm_check(pool_path, true, NULL, NULL, NULL) == 0,
                      "round %u: the pool fails its check after kill -9", round);
    }
    /* A last restart to verify the final kill's state. */
    {
        char uri[160];
        pid_t pid = spawn_rpc_server_at(kv_setup, NULL, "tcp://127.0.0.1:0", uri, sizeof(uri));
        struct tern_kv *kv;
        const char *uris[] = {uri};

        ck_assert_int_eq(tern_kv_open(ep, uris, 1, 2000000000ull, &kv), 0);
        verify(kv, n);
        tern_kv_close(kv);
        stop_server(pid);
    }
    ck_assert_uint_gt(n_acked, 10 * n);     /* the rounds did write */
    tern_rpc_ep_destroy(ep);
    unlink(pool_path);
    rmdir(dir);
}
END_TEST

Suite *suite_kv_crash(void)
{
    Suite *s = suite_create("kv_crash");
    TCase *tc = tcase_create("kill9");

    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, kill9_loses_no_acknowledged_write);
    suite_add_tcase(s, tc);
    return s;
}
