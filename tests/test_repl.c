/* Replication (services/repl) of the KV store between replicas in one
 * process, each on a thread of its own with its own endpoint, as ternd
 * runs one; the test plays the cluster (who is primary at which epoch).
 *
 * - the wire: batches that are malformed in any field are refused whole;
 *   the DRAM log keeps the newest records and says what it no longer has;
 *   the state file takes only what it writes;
 * - a write's reply waits for its concern: majority with one backup down,
 *   never `all` with one down;
 * - a backup that comes back catches up from the primary's log;
 * - a new primary takes the records it lacks from the most advanced
 *   replica it hears from, so a write acknowledged on a majority survives
 *   the old primary and a lagging backup;
 * - a deposed primary is fenced: its backups refuse its epoch, and it
 *   acknowledges nothing after that.
 */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "kv.h"
#include "kv_service_internal.h"
#include "kv_store.h"
#include "kv_wire.h"
#include "procs.h"
#include "repl.h"
#include "repl_internal.h"
#include "repl_log.h"
#include "rpc.h"
#include "suites.h"

/* ---- the wire, the log, the state file ---- */

static size_t make_batch(uint8_t *buf, uint64_t prev, unsigned n, uint64_t first)
{
    struct repl_batch b = {.epoch = 1, .prev = prev, .n = n};
    size_t off = sizeof(b);

    strcpy(b.shard, "s1");
    for (unsigned i = 0; i < n; i++) {
        char key[16], val[40];
        int kl = snprintf(key, sizeof(key), "k%u", i);
        int vl = snprintf(val, sizeof(val), "value number %u", i);

        repl_rec_write(buf + off, REPL_SET, first + i, key, (uint16_t)kl, val, (uint32_t)vl);
        off += repl_rec_size((size_t)kl, (size_t)vl);
    }
    b.bytes = (uint32_t)(off - sizeof(b));
    memcpy(buf, &b, sizeof(b));
    return off;
}

static int count_rec(void *arg, const struct repl_rec *r, const void *key, const void *val)
{
    (void)r;
    (void)key;
    (void)val;
    (*(int *)arg)++;
    return 0;
}

START_TEST(batch_walk_refuses_any_fault)
{
    static uint8_t buf[4096], bad[4096];
    size_t len = make_batch(buf, 10, 5, 11);
    struct repl_batch h;
    int n = 0;

    _Static_assert(sizeof(struct repl_batch) == 96, "batch header");
    ck_assert_int_eq(repl_batch_walk(buf, len, &h, count_rec, &n), 0);
    ck_assert_int_eq(n, 5);
    ck_assert_uint_eq(h.prev, 10);
    /* Every single byte flipped: refused, but for the fields the walk
     * leaves to the handler (the shard's name, the epoch) or to nobody
     * (the commit point, for lag only). Every length cut: refused. */
    for (size_t i = 0; i < len; i++) {
        bool free_field = i < 3 || (i >= offsetof(struct repl_batch, epoch) &&
                                    i < offsetof(struct repl_batch, epoch) + 8) ||
                          (i >= offsetof(struct repl_batch, commit) &&
                           i < offsetof(struct repl_batch, commit) + 8);
        int rc;

        memcpy(bad, buf, len);
        bad[i] ^= 0x40;
        rc = repl_batch_walk(bad, len, NULL, NULL, NULL);
        ck_assert_msg(rc == (free_field ? 0 : TERN_EPROTO), "byte %zu flipped: %d", i, rc);
    }
    for (size_t cut = 0; cut < len; cut++)
        ck_assert_int_eq(repl_batch_walk(buf, cut, NULL, NULL, NULL), TERN_EPROTO);
    /* Versions must rise above prev. */
    len = make_batch(buf, 11, 5, 11);
    ck_assert_int_eq(repl_batch_walk(buf, len, NULL, NULL, NULL), TERN_EPROTO);
}
END_TEST

START_TEST(log_keeps_the_newest_and_says_what_it_lost)
{
    struct repl_log l;
    static uint8_t out[1 << 20];
    static char val[3000];
    uint32_t n;
    uint64_t last;
    long got;

    ck_assert_int_eq(repl_log_init(&l, 64 * 1024), 0);
    repl_log_reset(&l, 100);
    memset(val, 'v', sizeof(val));
    for (uint64_t v = 101; v <= 400; v++) {
        char key[16];
        int kl = snprintf(key, sizeof(key), "key%llu", (unsigned long long)v);

        ck_assert_int_eq(repl_log_add(&l, REPL_SET, v, key, (uint16_t)kl, val,
                                      (uint32_t)(v % 7 == 0 ? 2900 : 40 + v % 100)), 0);
    }
    ck_assert_int_eq(repl_log_add(&l, REPL_SET, 400, "k", 1, "", 0), TERN_EINVAL);
    ck_assert_uint_gt(l.base, 100);         /* the oldest went */
    ck_assert_uint_eq(l.last, 400);
    ck_assert_int_eq(repl_log_read(&l, 100, out, sizeof(out), &n, &last), TERN_ERANGE);
    ck_assert(!repl_log_has(&l, l.base - 1));
    /* From the base: every record kept, in order, each sound. */
    got = repl_log_read(&l, l.base, out + sizeof(struct repl_batch),
                        sizeof(out) - sizeof(struct repl_batch), &n, &last);
    ck_assert_int_gt(got, 0);
    ck_assert_uint_eq(last, 400);
    ck_assert_uint_eq(n, 400 - l.base);
    {
        struct repl_batch b = {.prev = l.base, .n = n, .bytes = (uint32_t)got};
        int seen = 0;

        strcpy(b.shard, "s1");
        memcpy(out, &b, sizeof(b));
        ck_assert_int_eq(repl_batch_walk(out, sizeof(b) + (size_t)got, NULL, count_rec, &seen),
                         0);
        ck_assert_int_eq(seen, (int)n);
    }
    /* From the middle, a little at a time. */
    got = repl_log_read(&l, 350, out, 200, &n, &last);
    ck_assert_int_ge(got, 0);
    ck_assert_uint_eq(last, 350 + n);
    ck_assert_int_eq(repl_log_read(&l, 401, out, sizeof(out), &n, &last), TERN_ERANGE);
    ck_assert_int_eq(repl_log_read(&l, 400, out, sizeof(out), &n, &last), 0);
    repl_log_free(&l);
}
END_TEST

START_TEST(state_file_takes_only_its_own_form)
{
    static const char *const bad[] = {
        "", "tern-repl 1\nshard s1\nepoch 5\ncopying 0", "tern-repl 1\nshard s1\nepoch 5\n",
        "tern-repl 1\nshard s1\nepoch 05\ncopying 0\n",
        "tern-repl 1\nshard s1\nepoch -5\ncopying 0\n",
        "tern-repl 1\nshard s1\nepoch  5\ncopying 0\n",
        "tern-repl 2\nshard s1\nepoch 5\ncopying 0\n",
        "tern-repl 1\nshards1\nepoch 5\ncopying 0\n",
        "tern-repl 1\nshard s/1\nepoch 5\ncopying 0\n",
        "tern-repl 1\nshard s1\nepoch 5\ncopying 2\n",
        "tern-repl 1\nshard s1\nepoch 5\ncopying 0\n\n",
        "tern-repl 1\nshard s1\nepoch 99999999999999999999999\ncopying 0\n",
        "tern-repl 1\nshard s1\nepoch 8388608\ncopying 0\n",
        "tern-repl 1\nshard s1\nepoch \ncopying 0\n",
    };
    static const char good[] = "tern-repl 1\nshard s1\nepoch 5\ncopying 1\n";
    uint64_t seen = 7;
    bool copying = false;

    ck_assert_int_eq(repl_state_parse(good, strlen(good), "s1", &seen, &copying), 0);
    ck_assert_uint_eq(seen, 5);
    ck_assert(copying);
    ck_assert_int_eq(repl_state_parse("tern-repl 1\nshard s1\nepoch 0\ncopying 0\n", 39, "s1",
                                      &seen, &copying), 0);
    ck_assert_uint_eq(seen, 0);
    ck_assert(!copying);
    ck_assert_int_eq(repl_state_parse(good, strlen(good), "s2", &seen, &copying), TERN_EINVAL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(repl_state_parse(bad[i], strlen(bad[i]), "s1", &seen, &copying) ==
                          TERN_ECORRUPT, "taken: %s", bad[i]);
}
END_TEST

/* ---- replicas on threads ---- */

/* The ring's frames (repl_ring.h): one counts only when it is whole, of
 * the grant, at the place expected, and sound; a WRAP ends the lap. */
START_TEST(ring_frames_count_only_whole)
{
    enum { SIZE = 64u << 10 };
    static uint8_t ring[SIZE];
    const uint8_t *batch;
    uint32_t len;
    uint64_t next, head = 3u * SIZE + 1024;     /* the fourth lap */
    uint8_t *at = ring + head % SIZE;
    size_t n;

    memset(ring, 0, sizeof(ring));
    n = make_batch(at + sizeof(struct repl_frame), 0, 3, 1);
    /* Nothing there yet, then the frame. */
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next), 0);
    repl_frame_seal(at, 7, head, REPL_FRAME_BATCH, (uint32_t)n);
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next), 1);
    ck_assert_ptr_eq(batch, at + sizeof(struct repl_frame));
    ck_assert_uint_eq(len, n);
    ck_assert_uint_eq(next, head + repl_frame_span((uint32_t)n));
    ck_assert_int_eq(repl_batch_walk(batch, len, NULL, NULL, NULL), 0);
    /* Another grant's, an older lap's, a misaligned place: not for us. */
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 8, head, &batch, &len, &next), 0);
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head - SIZE, &batch, &len, &next), 0);
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head + 8, &batch, &len, &next), 0);
    /* Any byte of it changed (a torn or half-landed frame): not yet. */
    for (size_t i = 0; i < sizeof(struct repl_frame) + n; i += 13) {
        at[i] ^= 0x20;
        ck_assert_msg(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next) == 0,
                      "byte %zu", i);
        at[i] ^= 0x20;
    }
    /* A length past the lap's end, or an unknown kind, even if summed. */
    repl_frame_seal(at, 7, head, REPL_FRAME_BATCH, SIZE);
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next), 0);
    repl_frame_seal(at, 7, head, 9, (uint32_t)n);
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next), 0);
    repl_frame_seal(at, 7, head, REPL_FRAME_BATCH, 8);     /* shorter than a batch header */
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next), 0);
    /* A WRAP: the rest of the lap is skipped. */
    repl_frame_seal(at, 7, head, REPL_FRAME_WRAP, 0);
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next), 1);
    ck_assert_uint_eq(len, 0);
    ck_assert_uint_eq(next, 4u * SIZE);
    /* The last 64 bytes of a lap still hold a frame header. */
    head = 4u * SIZE - 64;
    repl_frame_seal(ring + SIZE - 64, 7, head, REPL_FRAME_WRAP, 0);
    ck_assert_int_eq(repl_frame_next(ring, SIZE, 7, head, &batch, &len, &next), 1);
    ck_assert_uint_eq(next, 4u * SIZE);
}
END_TEST

#define NODES 3

struct view {
    enum repl_role role;
    uint64_t epoch;
    char primary[16];
    unsigned cut;               /* bit i: this node cannot reach node i */
    bool doubt;                 /* the lease is in doubt (etcd away) */
    uint8_t vote[NODES];        /* enum repl_vote of each node; NOT_IN: out of the map */
};
#define NOT_IN 0xff

struct node {
    char name[16];
    char dir[128], pool[192], state[192];
    char uri[128];
    struct tern_rpc_ep *ep;
    struct tern_kv_service *kv;
    struct repl_host *host;
    struct repl *r;
    pthread_t th;
    int stop;
    int sleepy;                 /* no pass of its own: frames only on calls */
    bool up;
    pthread_mutex_t mu;
    bool view_pending;
    struct view v;
    struct repl_status st;      /* the thread's last look, under mu */
    enum repl_step step;        /* and the members' step it found due */
    char step_name[64];
};

static struct node nodes[NODES];
static struct tern_rpc_ep *cep;     /* the test's client endpoint */
/* The replicas also listen on shm and reach each other by auto://, so that
 * records are shipped by direct stores into each other's rings. */
static bool over_shm;

/* The URI by which the replicas reach node i. */
static void peer_uri(unsigned i, char *out, size_t cap)
{
    if (over_shm)
        snprintf(out, cap, "auto://%.120s", nodes[i].uri + strlen("tcp://"));
    else
        snprintf(out, cap, "%.127s", nodes[i].uri);
}

static struct repl_status status_of(unsigned i);

static void *node_loop(void *arg)
{
    struct node *n = arg;

    while (!__atomic_load_n(&n->stop, __ATOMIC_ACQUIRE)) {
        tern_rpc_poll(n->ep);
        pthread_mutex_lock(&n->mu);
        if (n->view_pending) {
            struct repl_peer peers[NODES];
            unsigned k = 0;

            for (unsigned i = 0; i < NODES; i++) {
                if (n->v.vote[i] == NOT_IN)
                    continue;
                snprintf(peers[k].name, sizeof(peers[k].name), "%.15s", nodes[i].name);
                if ((n->v.cut >> i) & 1)
                    snprintf(peers[k].uri, sizeof(peers[k].uri), "tcp://127.0.0.1:1");
                else
                    peer_uri(i, peers[k].uri, sizeof(peers[k].uri));
                peers[k++].vote = n->v.vote[i];
            }
            repl_set_view(n->r, n->v.role, n->v.epoch, n->v.primary, peers, k);
            repl_set_lease(n->r, !n->v.doubt);
            n->view_pending = false;
        }
        pthread_mutex_unlock(&n->mu);
        /* A sleepy backup is ternd's asleep in epoll: it takes its ring's
         * frames only when a call comes in (group_of drains first). */
        if (!__atomic_load_n(&n->sleepy, __ATOMIC_ACQUIRE))
            repl_tick(n->r);
        pthread_mutex_lock(&n->mu);
        repl_status(n->r, &n->st);
        n->step = repl_members_step(n->r, n->step_name);
        pthread_mutex_unlock(&n->mu);
    }
    return NULL;
}

/* Start node i on its pool and state (kept from an earlier life). */
static void node_start(unsigned i)
{
    struct node *n = &nodes[i];
    struct tern_kv_service_opts ko = {.pool_path = n->pool, .pool_size = 32u << 20,
                                      .seg_size = 256u << 10};
    struct repl_config rc = {.shard = "kv0", .me = n->name, .state_path = n->state,
                             .log_bytes = 4u << 20, .timeout_ns = 500000000u,
                             .ops = &kv_repl_ops, .ring_bytes = REPL_RING_MIN};
    char listen[128];

    ck_assert_int_eq(tern_rpc_open(NULL, &n->ep), 0);
    ck_assert_int_eq(tern_kv_service_open(&ko, &n->kv), 0);
    ck_assert_int_eq(tern_rpc_register(n->ep, tern_kv_service_def(n->kv)), 0);
    /* The same port across lives: the others know it. */
    snprintf(listen, sizeof(listen), "%s", n->uri[0] ? n->uri : "tcp://127.0.0.1:0");
    ck_assert_int_eq(tern_rpc_listen(n->ep, listen, n->uri, sizeof(n->uri)), 0);
    if (over_shm)
        ck_assert_int_eq(tern_rpc_listen(n->ep, "shm://auto", NULL, 0), 0);
    ck_assert_int_eq(repl_host_open(n->ep, &n->host), 0);
    rc.ctx = n->kv;
    ck_assert_int_eq(repl_open(n->host, &rc, &n->r), 0);
    kv_service_replicate(n->kv, n->r);
    n->stop = 0;
    n->sleepy = 0;
    n->view_pending = false;
    n->up = true;
    ck_assert_int_eq(pthread_create(&n->th, NULL, node_loop, n), 0);
}

/* Stop node i as a crash would, as far as the others can tell: its
 * sessions break, it answers nothing more. What it synced stays. */
static void node_kill(unsigned i)
{
    struct node *n = &nodes[i];

    if (!n->up)
        return;
    __atomic_store_n(&n->stop, 1, __ATOMIC_RELEASE);
    pthread_join(n->th, NULL);
    kv_service_replicate(n->kv, NULL);
    repl_close(n->r);
    tern_rpc_close(n->ep);
    repl_host_close(n->host);
    tern_kv_service_close(n->kv);
    n->up = false;
}

/* Node i's view, taken whole by its thread; `cut`: the nodes it cannot
 * reach (bit i). */
static void set_view_cut(unsigned i, enum repl_role role, uint64_t epoch, unsigned primary,
                         unsigned cut)
{
    struct node *n = &nodes[i];

    pthread_mutex_lock(&n->mu);
    n->v.role = role;
    n->v.epoch = epoch;
    memcpy(n->v.primary, nodes[primary].name, sizeof(n->v.primary));
    n->v.cut = cut;
    n->v.doubt = false;
    n->view_pending = true;
    pthread_mutex_unlock(&n->mu);
}

static void set_view(unsigned i, enum repl_role role, uint64_t epoch, unsigned primary)
{
    set_view_cut(i, role, epoch, primary, 0);
}

/* Node i's lease in doubt, or sure again; true once its thread took it. */
static bool set_doubt(unsigned i, bool doubt)
{
    struct node *n = &nodes[i];

    pthread_mutex_lock(&n->mu);
    n->v.doubt = doubt;
    n->view_pending = true;
    pthread_mutex_unlock(&n->mu);
    for (int t = 0; t < 2000; t += 5) {
        if (status_of(i).lease_doubt == doubt)
            return true;
        usleep(5000);
    }
    return false;
}

/* What every node's map says each one counts for (NOT_IN: out of it). */
static void set_votes(uint8_t v0, uint8_t v1, uint8_t v2)
{
    for (unsigned i = 0; i < NODES; i++) {
        struct node *n = &nodes[i];

        pthread_mutex_lock(&n->mu);
        n->v.vote[0] = v0;
        n->v.vote[1] = v1;
        n->v.vote[2] = v2;
        n->view_pending = true;
        pthread_mutex_unlock(&n->mu);
    }
}

/* Until node i finds `step` due (on `name`, if not NULL). */
static bool wait_step(unsigned i, enum repl_step step, const char *name, int ms)
{
    for (int t = 0; t < ms; t += 5) {
        bool ok;

        pthread_mutex_lock(&nodes[i].mu);
        ok = nodes[i].step == step && (!name || !strcmp(nodes[i].step_name, name));
        pthread_mutex_unlock(&nodes[i].mu);
        if (ok)
            return true;
        usleep(5000);
    }
    return false;
}

/* Everyone up learns: `primary` leads at `epoch`. */
static void elect(unsigned primary, uint64_t epoch)
{
    for (unsigned i = 0; i < NODES; i++)
        if (nodes[i].up)
            set_view(i, i == primary ? REPL_PRIMARY : REPL_BACKUP, epoch, primary);
}

static struct repl_status status_of(unsigned i)
{
    struct repl_status st;

    pthread_mutex_lock(&nodes[i].mu);
    st = nodes[i].st;
    pthread_mutex_unlock(&nodes[i].mu);
    return st;
}

static bool wait_state(unsigned i, const char *state, int ms)
{
    for (int t = 0; t < ms; t += 5) {
        struct repl_status st = status_of(i);

        if (st.state && !strcmp(st.state, state))
            return true;
        usleep(5000);
    }
    return false;
}

static bool wait_position(unsigned i, uint64_t pos, int ms)
{
    for (int t = 0; t < ms; t += 5) {
        if (status_of(i).position >= pos)
            return true;
        usleep(5000);
    }
    return false;
}

/* Until node i has sent a full copy (its count is published each pass). */
static bool wait_copies_sent(unsigned i, int ms)
{
    for (int t = 0; t < ms; t += 5) {
        if (status_of(i).copies_sent >= 1)
            return true;
        usleep(5000);
    }
    return false;
}

static void repl_setup(void)
{
    char base[96];

    if (!getenv("TERN_LOG"))
        tern_log_set_level(TERN_LOG_ERROR);
    test_tmpdir(base, sizeof(base), "repl");
    for (unsigned i = 0; i < NODES; i++) {
        struct node *n = &nodes[i];

        memset(n, 0, sizeof(*n));
        pthread_mutex_init(&n->mu, NULL);
        snprintf(n->name, sizeof(n->name), "n%u", i);
        snprintf(n->pool, sizeof(n->pool), "%.96s/n%u.pool", base, i);
        snprintf(n->state, sizeof(n->state), "%.96s/n%u.repl", base, i);
        node_start(i);
    }
    ck_assert_int_eq(tern_rpc_open(NULL, &cep), 0);
}

static void repl_setup_shm(void)
{
    over_shm = true;
    repl_setup();
}

static void repl_teardown(void)
{
    for (unsigned i = 0; i < NODES; i++)
        node_kill(i);
    tern_rpc_close(cep);
    cep = NULL;
    over_shm = false;
}

/* ---- a client of raw KV calls (to name the write concern) ---- */

static int kv_put(struct tern_session *s, const char *key, const char *val, uint16_t flags,
                  uint64_t timeout_ns, uint64_t *version)
{
    uint8_t req[4096];
    struct kv_key k = {.klen = (uint16_t)strlen(key), .flags = flags,
                       .vlen = (uint32_t)strlen(val)};
    struct kv_val out;
    size_t got = 0;
    int rc;

    memcpy(req, &k, sizeof(k));
    memcpy(req + sizeof(k), key, k.klen);
    memcpy(req + sizeof(k) + k.klen, val, k.vlen);
    rc = tern_call_sync(s, TERN_KV_SERVICE_ID, KV_M_PUT, req, sizeof(k) + k.klen + k.vlen, &out,
                        sizeof(out), &got, timeout_ns);
    if (rc == 0 && version)
        *version = out.version;
    return rc;
}

static int kv_get_flags(struct tern_session *s, const char *key, uint16_t flags, char *buf,
                        size_t cap, uint64_t timeout_ns)
{
    uint8_t req[512], rep[4096];
    struct kv_key k = {.klen = (uint16_t)strlen(key), .flags = flags};
    size_t got = 0;
    int rc;

    memcpy(req, &k, sizeof(k));
    memcpy(req + sizeof(k), key, k.klen);
    rc = tern_call_sync(s, TERN_KV_SERVICE_ID, KV_M_GET, req, sizeof(k) + k.klen, rep,
                        sizeof(rep), &got, timeout_ns);
    if (rc == 0) {
        size_t n = got - sizeof(struct kv_val);

        ck_assert_uint_ge(got, sizeof(struct kv_val));
        ck_assert_uint_lt(n, cap);
        memcpy(buf, rep + sizeof(struct kv_val), n);
        buf[n] = 0;
    }
    return rc;
}

static int kv_get(struct tern_session *s, const char *key, char *buf, size_t cap,
                  uint64_t timeout_ns)
{
    return kv_get_flags(s, key, 0, buf, cap, timeout_ns);
}

static struct tern_session *connect_to(unsigned i)
{
    struct tern_session *s;

    ck_assert_int_eq(tern_rpc_connect(cep, nodes[i].uri, 2000000000u, &s), 0);
    return s;
}

/* A write until the node is primary (it takes over first). */
static int put_retrying(struct tern_session *s, const char *key, const char *val,
                        uint64_t *version)
{
    int rc = TERN_ENOTPRIMARY;

    for (int t = 0; t < 400 && rc == TERN_ENOTPRIMARY; t++) {
        rc = kv_put(s, key, val, 0, 2000000000u, version);
        if (rc == TERN_ENOTPRIMARY)
            usleep(5000);
    }
    return rc;
}

/* What a stopped node's pool holds for key. */
static int pool_get(unsigned i, const char *key, char *buf, size_t cap, uint64_t *version)
{
    struct kvs_opts o = {.path = nodes[i].pool};
    struct kvs *s;
    const void *val;
    uint32_t len;
    int rc;

    ck_assert(!nodes[i].up);
    ck_assert_int_eq(kvs_open(&o, &s), 0);
    rc = kvs_get(s, key, strlen(key), &val, &len, version);
    if (rc == 0) {
        ck_assert_uint_lt(len, cap);
        memcpy(buf, val, len);
        buf[len] = 0;
    }
    kvs_close(s);
    return rc;
}

START_TEST(writes_wait_for_their_concern)
{
    struct tern_session *s;
    uint64_t ver = 0, first = 0;
    char key[32], val[64], got[64];

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "key%d", i);
        snprintf(val, sizeof(val), "value %d", i);
        ck_assert_int_eq(kv_put(s, key, val, 0, 2000000000u, &ver), 0);
        if (!first)
            first = ver;
    }
    ck_assert_uint_eq(repl_epoch_of(ver), 1);
    /* Majority: by the time the reply came, a backup held it (in its
     * ring, one-sided: it takes it into its store on its next pass). */
    ck_assert(wait_position(1, ver, 2000) || wait_position(2, ver, 2000));
    ck_assert_int_eq(kv_put(s, "all", "of them", KV_F_W_ALL, 2000000000u, &ver), 0);
    ck_assert(wait_position(1, ver, 2000));
    ck_assert(wait_position(2, ver, 2000));
    /* One backup down: majority still answers, `all` cannot. */
    node_kill(2);
    ck_assert_int_eq(kv_put(s, "after", "one down", 0, 2000000000u, &ver), 0);
    ck_assert_int_eq(kv_put(s, "all2", "never", KV_F_W_ALL, 300000000u, NULL),
                     TERN_ETIMEDOUT);
    ck_assert_int_eq(kv_put(s, "one", "primary only", KV_F_W_ONE, 2000000000u, NULL), 0);
    /* A backup refuses writes and reads: it is not the primary. */
    {
        struct tern_session *b = connect_to(1);

        ck_assert_int_eq(kv_put(b, "x", "y", 0, 2000000000u, NULL), TERN_ENOTPRIMARY);
        tern_rpc_disconnect(b);
    }
    tern_rpc_disconnect(s);
    ck_assert(wait_position(1, ver, 5000));
    node_kill(1);
    ck_assert_int_eq(pool_get(1, "key57", got, sizeof(got), &ver), 0);
    ck_assert_str_eq(got, "value 57");
    ck_assert_int_eq(pool_get(1, "after", got, sizeof(got), NULL), 0);
    ck_assert_str_eq(got, "one down");
}
END_TEST

/* A backup away for a while catches up from the primary's log when it
 * comes back, from the position its pool recovered. */
START_TEST(returning_backup_catches_up)
{
    struct tern_session *s;
    char key[32], val[64], got[64];
    uint64_t ver = 0, v2;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "early", "1", KV_F_W_ALL, 2000000000u, NULL), 0);
    node_kill(1);
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        snprintf(val, sizeof(val), "v%d", i);
        ck_assert_int_eq(kv_put(s, key, val, 0, 2000000000u, &ver), 0);
    }
    node_start(1);
    set_view(1, REPL_BACKUP, 1, 0);
    ck_assert_msg(wait_position(1, ver, 10000), "backup at %llx, primary at %llx",
                  (unsigned long long)status_of(1).position, (unsigned long long)ver);
    tern_rpc_disconnect(s);
    node_kill(1);
    ck_assert_int_eq(pool_get(1, "k299", got, sizeof(got), &v2), 0);
    ck_assert_str_eq(got, "v299");
    ck_assert_uint_eq(v2, ver);     /* the primary's version, not one of its own */
}
END_TEST

/* The primary dies with writes acknowledged on it and one backup only;
 * the other backup, behind, is elected: it takes them from the one that
 * has them before it serves. */
START_TEST(new_primary_takes_the_newest_log)
{
    struct tern_session *s;
    char key[32], val[64], got[64];
    uint64_t ver = 0, v2 = 0;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "base", "all", KV_F_W_ALL, 2000000000u, NULL), 0);
    node_kill(2);                   /* n2 falls behind */
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "acked%d", i);
        snprintf(val, sizeof(val), "on a majority %d", i);
        ck_assert_int_eq(kv_put(s, key, val, 0, 2000000000u, &ver), 0);
    }
    tern_rpc_disconnect(s);
    node_kill(0);                   /* the primary dies */
    node_start(2);
    elect(2, 2);                    /* the laggard wins the office */
    ck_assert_msg(wait_state(2, "primary", 10000), "n2 is %s", status_of(2).state);
    ck_assert_uint_ge(status_of(2).position, ver);
    s = connect_to(2);
    /* Before any write of its epoch, a SCAN is answered: it waits on the
     * store's version, which is now the epoch's base, a version no record
     * has (a read once waited for it for ever). */
    {
        struct kv_scan q = {.cursor = 0, .max = 8};
        static uint8_t rep[1 << 16];
        size_t len = 0;

        ck_assert_int_eq(tern_call_sync(s, TERN_KV_SERVICE_ID, KV_M_SCAN, &q, sizeof(q), rep,
                                        sizeof(rep), &len, 2000000000u), 0);
    }
    ck_assert_int_eq(put_retrying(s, "new", "epoch 2", &v2), 0);
    ck_assert_uint_eq(repl_epoch_of(v2), 2);
    tern_rpc_disconnect(s);
    ck_assert(wait_position(1, v2, 5000));
    node_kill(2);
    for (int i = 0; i < 200; i += 37) {
        snprintf(key, sizeof(key), "acked%d", i);
        snprintf(val, sizeof(val), "on a majority %d", i);
        ck_assert_int_eq(pool_get(2, key, got, sizeof(got), NULL), 0);
        ck_assert_str_eq(got, val);
    }
    ck_assert_int_eq(pool_get(2, "acked199", got, sizeof(got), NULL), 0);
}
END_TEST

/* Two replicas move to epoch 2 while the old primary, cut off, still
 * thinks it leads: its next write is refused by the backups it ships to,
 * it steps down, and the client is told (never "stored"). */
START_TEST(deposed_primary_is_fenced)
{
    struct tern_session *s;
    uint64_t ver;
    int rc;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "before", "1", KV_F_W_ALL, 2000000000u, NULL), 0);
    /* n1 takes over at epoch 2 with n2; n0 is cut off from n1, and not
     * told. */
    set_view_cut(1, REPL_PRIMARY, 2, 1, 1u << 0);
    set_view(2, REPL_BACKUP, 2, 1);
    ck_assert(wait_state(1, "primary", 10000));
    rc = kv_put(s, "late", "from the old primary", 0, 2000000000u, &ver);
    ck_assert_msg(rc == TERN_ENOTPRIMARY, "the deposed primary answered %s",
                  tern_err_name(rc));
    ck_assert(wait_state(0, "backup", 5000));
    ck_assert_uint_ge(status_of(1).refused_stale + status_of(2).refused_stale, 1);
    tern_rpc_disconnect(s);
    s = connect_to(1);
    ck_assert_int_eq(put_retrying(s, "new", "2", &ver), 0);
    ck_assert_uint_eq(repl_epoch_of(ver), 2);
    tern_rpc_disconnect(s);
}
END_TEST

/* n0 primary at epoch 1 with "k" = "old" on every replica, then its lease
 * in doubt; a session to it. */
static struct tern_session *primary_in_doubt(void)
{
    struct tern_session *s;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "k", "old", KV_F_W_ALL, 2000000000u, NULL), 0);
    ck_assert(set_doubt(0, true));
    return s;
}

/* etcd away: the primary keeps serving, but only what a backup confirms
 * at its epoch. With no backup to confirm, even a w=1 write or a read
 * waits; sure of its lease again, it answers them alone. */
START_TEST(primary_in_doubt_serves_what_a_majority_confirms)
{
    struct tern_session *s;
    uint64_t ver = 0;
    char got[64];
    int rc;

    s = primary_in_doubt();
    ck_assert_int_eq(kv_put(s, "w1", "one", KV_F_W_ONE, 2000000000u, &ver), 0);
    ck_assert(status_of(1).position >= ver || status_of(2).position >= ver);
    ck_assert_int_eq(kv_get(s, "k", got, sizeof(got), 2000000000u), 0);
    ck_assert_str_eq(got, "old");
    ck_assert_int_eq(kv_get(s, "none", got, sizeof(got), 2000000000u), TERN_ENOENT);
    node_kill(1);
    node_kill(2);
    ck_assert_int_eq(kv_put(s, "lone", "x", KV_F_W_ONE, 300000000u, NULL), TERN_ETIMEDOUT);
    ck_assert_int_eq(kv_get(s, "k", got, sizeof(got), 300000000u), TERN_ETIMEDOUT);
    ck_assert_int_eq(kv_get(s, "none", got, sizeof(got), 300000000u), TERN_ETIMEDOUT);
    ck_assert(set_doubt(0, false));
    rc = kv_put(s, "lone2", "y", KV_F_W_ONE, 2000000000u, NULL);
    ck_assert_msg(rc == 0, "w=1 with the lease sure: %s", tern_err_name(rc));
    ck_assert_int_eq(kv_get(s, "k", got, sizeof(got), 2000000000u), 0);
    ck_assert_str_eq(got, "old");
    tern_rpc_disconnect(s);
}
END_TEST

/* The primary's lease in doubt while the others elect a successor: once
 * the successor wrote, the old primary never shows the old value; its
 * read waits for a confirmation the fenced backups refuse, and it steps
 * down. (With its lease sure it would have answered at once: the lease is
 * what makes that safe.) */
START_TEST(primary_in_doubt_reads_nothing_stale)
{
    struct tern_session *s, *s1;
    char got[64];
    int rc;

    s = primary_in_doubt();
    set_view_cut(1, REPL_PRIMARY, 2, 1, 1u << 0);
    set_view(2, REPL_BACKUP, 2, 1);
    ck_assert(wait_state(1, "primary", 10000));
    s1 = connect_to(1);
    ck_assert_int_eq(put_retrying(s1, "k", "new", NULL), 0);
    rc = kv_get(s, "k", got, sizeof(got), 2000000000u);
    ck_assert_msg(rc == TERN_ENOTPRIMARY, "the old primary answered %s%s%s", tern_err_name(rc),
                  rc == 0 ? ": " : "", rc == 0 ? got : "");
    ck_assert(wait_state(0, "backup", 5000));
    ck_assert_int_eq(kv_get(s1, "k", got, sizeof(got), 2000000000u), 0);
    ck_assert_str_eq(got, "new");
    tern_rpc_disconnect(s1);
    tern_rpc_disconnect(s);
}
END_TEST

/* tern_kv_open_replicas: the client finds the primary, and follows a new
 * one after the old dies; what it was told is stored is there. */
START_TEST(client_follows_the_primary)
{
    const char *uris[NODES];
    struct tern_kv *kv;
    char key[32], val[64], got[64];
    size_t len;
    uint64_t ver = 0;

    elect(1, 1);
    ck_assert(wait_state(1, "primary", 5000));
    for (unsigned i = 0; i < NODES; i++)
        uris[i] = nodes[i].uri;
    ck_assert_int_eq(tern_kv_open_replicas(cep, uris, NODES, 2000000000u, &kv), 0);
    ck_assert_int_eq(tern_kv_set_write_concern(kv, TERN_KV_W_MAJORITY), 0);
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof(key), "c%d", i);
        snprintf(val, sizeof(val), "first %d", i);
        ck_assert_int_eq(tern_kv_put(kv, key, strlen(key), val, strlen(val), &ver), 0);
    }
    ck_assert_uint_eq(repl_epoch_of(ver), 1);
    node_kill(1);
    elect(2, 2);
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof(key), "c%d", i);
        ck_assert_int_eq(tern_kv_get(kv, key, strlen(key), got, sizeof(got) - 1, &len, NULL), 0);
        got[len] = 0;
        snprintf(val, sizeof(val), "first %d", i);
        ck_assert_str_eq(got, val);
    }
    ck_assert_int_eq(tern_kv_put(kv, "c0", 2, "second", 6, &ver), 0);
    ck_assert_uint_eq(repl_epoch_of(ver), 2);
    /* The old primary back: a backup now; the client stays with n2. */
    node_start(1);
    elect(2, 2);
    ck_assert_int_eq(tern_kv_put(kv, "c1", 2, "third", 5, &ver), 0);
    ck_assert_uint_eq(repl_epoch_of(ver), 2);
    ck_assert(wait_position(1, ver, 5000));
    tern_kv_close(kv);
}
END_TEST

/* A backup away for longer than the primary's log reaches back gets a full
 * copy while the primary keeps taking writes, deletes included. */
START_TEST(far_behind_backup_gets_a_full_copy)
{
    struct tern_session *s;
    static char big[2048];
    char key[32], got[64];
    uint64_t ver = 0;

    memset(big, 'x', sizeof(big) - 1);
    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "gone", "soon deleted", KV_F_W_ALL, 2000000000u, NULL), 0);
    node_kill(2);
    /* 6 MiB of writes through a 4 MiB log. */
    for (int i = 0; i < 3000; i++) {
        snprintf(key, sizeof(key), "big%d", i % 1000);
        big[0] = (char)('a' + i / 1000);
        ck_assert_int_eq(kv_put(s, key, big, 0, 2000000000u, &ver), 0);
    }
    {
        uint8_t req[64];
        struct kv_key k = {.klen = 4};
        struct kv_val out;
        size_t got_len;

        memcpy(req, &k, sizeof(k));
        memcpy(req + sizeof(k), "gone", 4);
        ck_assert_int_eq(tern_call_sync(s, TERN_KV_SERVICE_ID, KV_M_DEL, req, sizeof(k) + 4, &out,
                                        sizeof(out), &got_len, 2000000000u), 0);
    }
    ck_assert_uint_gt(status_of(0).log_base, 0);
    node_start(2);
    set_view(2, REPL_BACKUP, 1, 0);
    /* Writes go on while it copies. */
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "during%d", i);
        ck_assert_int_eq(kv_put(s, key, "copying", 0, 2000000000u, &ver), 0);
    }
    ck_assert_msg(wait_position(2, ver, 20000), "n2 at %llx, primary at %llx",
                  (unsigned long long)status_of(2).position, (unsigned long long)ver);
    ck_assert(wait_copies_sent(0, 5000));
    ck_assert(!status_of(2).copying);
    tern_rpc_disconnect(s);
    node_kill(2);
    {
        static char gbig[4096];

        ck_assert_int_eq(pool_get(2, "big999", gbig, sizeof(gbig), NULL), 0);
        ck_assert_int_eq(gbig[0], 'c');     /* the last of its three writes */
        ck_assert_uint_eq(strlen(gbig), sizeof(big) - 1);
    }
    ck_assert_int_eq(pool_get(2, "during199", got, sizeof(got), NULL), 0);
    ck_assert_str_eq(got, "copying");
    ck_assert_int_eq(pool_get(2, "gone", got, sizeof(got), NULL), TERN_ENOENT);
}
END_TEST

/* n0, primary at epoch 1 with client session s, is cut off from both
 * backups (still primary by its own view), takes a w=1 write nobody else
 * gets, and dies; n1 is elected at epoch 2. A session to n1. */
static struct tern_session *depose_with_a_lonely_write(struct tern_session *s)
{
    /* The view set whole: a view taken before its cut was set would never
     * be taken again, and the write would reach the backups. */
    set_view_cut(0, REPL_PRIMARY, 1, 0, (1u << 1) | (1u << 2));
    usleep(100000);
    ck_assert_int_eq(kv_put(s, "lonely", "w=1 on n0 alone", KV_F_W_ONE, 2000000000u, NULL), 0);
    tern_rpc_disconnect(s);
    node_kill(0);
    elect(1, 2);
    ck_assert(wait_state(1, "primary", 10000));
    return connect_to(1);
}

/* A primary that acknowledged w=1 writes no backup got, then died, comes
 * back as a backup with a log that parted from the new primary's: it gets
 * a full copy, and those writes (never on a majority) are gone. */
START_TEST(parted_replica_is_copied_over)
{
    struct tern_session *s;
    char got[64];
    uint64_t ver;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "shared", "by all", KV_F_W_ALL, 2000000000u, NULL), 0);
    s = depose_with_a_lonely_write(s);
    ck_assert_int_eq(put_retrying(s, "after", "epoch 2", &ver), 0);
    node_start(0);
    set_view(0, REPL_BACKUP, 2, 1);
    ck_assert_msg(wait_position(0, ver, 20000), "n0 at %llx", (unsigned long long)status_of(0).position);
    ck_assert(wait_copies_sent(1, 5000));
    tern_rpc_disconnect(s);
    node_kill(0);
    ck_assert_int_eq(pool_get(0, "lonely", got, sizeof(got), NULL), TERN_ENOENT);
    ck_assert_int_eq(pool_get(0, "shared", got, sizeof(got), NULL), 0);
    ck_assert_int_eq(pool_get(0, "after", got, sizeof(got), NULL), 0);
}
END_TEST

/* Every key, k0..k{n-1}, written with round `round` as its value; the
 * last version written. */
static uint64_t write_round(struct tern_session *s, unsigned n, unsigned round)
{
    char key[32], val[32];
    uint64_t ver = 0;

    for (unsigned i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "k%u", i);
        snprintf(val, sizeof(val), "round %u of k%u", round, i);
        ck_assert_int_eq(put_retrying(s, key, val, &ver), 0);
    }
    return ver;
}

/* The partition of the rack test, replayed: the primary is cut off and
 * deposed with a record nobody else has, comes back, is copied over while
 * writes go on, streams, and is elected when its successor dies in turn.
 * Every acknowledged write must be what it serves then. */
START_TEST(copied_replica_serves_every_write)
{
    enum { KEYS = 400 };
    struct tern_session *s;
    char key[32], want[32], got[64];
    uint64_t ver;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    write_round(s, KEYS, 1);
    s = depose_with_a_lonely_write(s);
    write_round(s, KEYS, 2);
    node_start(0);
    set_view(0, REPL_BACKUP, 2, 1);
    /* Copied while writes go on. */
    for (unsigned r = 3; r < 6; r++)
        ver = write_round(s, KEYS, r);
    ck_assert_msg(wait_position(0, ver, 20000), "n0 at %llx",
                  (unsigned long long)status_of(0).position);
    ck_assert(wait_copies_sent(1, 5000));
    ver = write_round(s, KEYS, 6);
    ck_assert(wait_position(0, ver, 5000));
    tern_rpc_disconnect(s);
    node_kill(1);
    set_view(0, REPL_PRIMARY, 3, 0);
    set_view(2, REPL_BACKUP, 3, 0);
    ck_assert(wait_state(0, "primary", 10000));
    s = connect_to(0);
    for (unsigned i = 0; i < KEYS; i++) {
        snprintf(key, sizeof(key), "k%u", i);
        snprintf(want, sizeof(want), "round 6 of k%u", i);
        ck_assert_int_eq(kv_get(s, key, got, sizeof(got), 2000000000u), 0);
        ck_assert_str_eq(got, want);
    }
    ck_assert_int_eq(kv_get(s, "lonely", got, sizeof(got), 2000000000u), TERN_ENOENT);
    tern_rpc_disconnect(s);
}
END_TEST

/* Frames a primary put into a backup's ring count there even if the
 * backup dies before it takes them into its store: it takes them when it
 * opens again. A frame of another grant is not taken. (The test plays the
 * primary: it asks for the grant, then writes the ring's file itself.) */
START_TEST(ring_frames_outlive_the_backup)
{
    struct repl_ask a = {.epoch = 1};
    struct repl_ring_grant g;
    struct tern_session *s;
    static uint8_t frame[8192];
    char path[256], got[64];
    uint64_t v = repl_epoch_base(1) + 1, span, at;
    size_t len = 0;
    int fd;

    node_kill(0);
    set_view(1, REPL_BACKUP, 1, 0);
    ck_assert(wait_state(1, "backup", 5000));
    s = connect_to(1);
    strcpy(a.shard, "kv0");
    ck_assert_int_eq(tern_call_sync(s, TERN_REPL_SERVICE_ID, REPL_M_RING, &a, sizeof(a), &g,
                                    sizeof(g), &len, 2000000000u), 0);
    ck_assert_uint_eq(len, sizeof(g));
    ck_assert_uint_eq(g.position, 0);
    tern_rpc_disconnect(s);
    node_kill(1);
    /* Two frames: one of the grant (two records), one of another. */
    snprintf(path, sizeof(path), "%s.ring", nodes[1].state);
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    at = g.head;
    for (unsigned f = 0; f < 2; f++) {
        struct repl_batch b = {.epoch = 1, .prev = g.position + (f ? v + 1 : 0), .n = 2};
        size_t off = sizeof(struct repl_frame) + sizeof(b);

        strcpy(b.shard, "kv0");
        for (unsigned i = 0; i < 2; i++) {
            char key[16];
            int kl = snprintf(key, sizeof(key), "ring%u", 2 * f + i);

            repl_rec_write(frame + off, REPL_SET, v + 2 * f + i, key, (uint16_t)kl, "landed", 6);
            off += repl_rec_size((size_t)kl, 6);
        }
        b.bytes = (uint32_t)(off - sizeof(struct repl_frame) - sizeof(b));
        memcpy(frame + sizeof(struct repl_frame), &b, sizeof(b));
        repl_frame_seal(frame, f ? g.gen + 1 : g.gen, at, REPL_FRAME_BATCH,
                        (uint32_t)(off - sizeof(struct repl_frame)));
        span = repl_frame_span((uint32_t)(off - sizeof(struct repl_frame)));
        ck_assert_int_eq(pwrite(fd, frame, span, (off_t)(REPL_RING_HDR + at % g.size)),
                         (ssize_t)span);
        at += span;
    }
    close(fd);
    node_start(1);
    ck_assert(wait_position(1, v + 1, 5000));
    node_kill(1);
    ck_assert_uint_eq(status_of(1).position, v + 1);
    ck_assert_int_eq(pool_get(1, "ring0", got, sizeof(got), NULL), 0);
    ck_assert_str_eq(got, "landed");
    ck_assert_int_eq(pool_get(1, "ring1", got, sizeof(got), NULL), 0);
    ck_assert_int_eq(pool_get(1, "ring2", got, sizeof(got), NULL), TERN_ENOENT);
}
END_TEST

/* Over shm the primary stores into its backups' rings directly and
 * flushes them itself: the status says so, and the backups take every
 * record. */
START_TEST(shm_ships_one_sided)
{
    struct tern_session *s;
    struct repl_status st;
    char key[32], val[64], got[64];
    uint64_t ver = 0;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "os%d", i);
        snprintf(val, sizeof(val), "one-sided %d", i);
        ck_assert_int_eq(kv_put(s, key, val, i % 3 ? 0 : KV_F_W_ALL, 2000000000u, &ver), 0);
    }
    tern_rpc_disconnect(s);
    st = status_of(0);
    ck_assert_uint_eq(st.n, 2);
    for (unsigned i = 0; i < st.n; i++)
        ck_assert_msg(st.replicas[i].path && !strcmp(st.replicas[i].path, "one-sided"),
                      "%s ships by %s", st.replicas[i].name, st.replicas[i].path);
    ck_assert(wait_position(1, ver, 5000));
    ck_assert(wait_position(2, ver, 5000));
    node_kill(2);
    ck_assert_int_eq(pool_get(2, "os299", got, sizeof(got), NULL), 0);
    ck_assert_str_eq(got, "one-sided 299");
}
END_TEST

/* Backups that take their rings' frames only when called, as a ternd
 * asleep in epoll does: once a ring is full, the primary must wake its
 * backup by a call, or every write waiting for it waits forever. 5 MB of
 * writes through 2 MiB rings, each held until both backups have it. */
START_TEST(full_ring_wakes_a_sleeping_backup)
{
    struct tern_session *s;
    struct repl_status st;
    char key[32], val[3001], got[3100];
    uint64_t ver = 0;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "first", "ring", KV_F_W_ALL, 2000000000u, &ver), 0);
    __atomic_store_n(&nodes[1].sleepy, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&nodes[2].sleepy, 1, __ATOMIC_RELEASE);
    memset(val, 'v', sizeof(val) - 1);
    val[sizeof(val) - 1] = 0;
    for (int i = 0; i < 1700; i++) {
        snprintf(key, sizeof(key), "full%d", i);
        val[0] = (char)('a' + i % 26);
        ck_assert_msg(kv_put(s, key, val, KV_F_W_ALL, 2000000000u, &ver) == 0,
                      "write %d, held for both sleeping backups, never went", i);
    }
    tern_rpc_disconnect(s);
    st = status_of(0);
    for (unsigned i = 0; i < st.n; i++)
        ck_assert_msg(st.replicas[i].path && !strcmp(st.replicas[i].path, "one-sided"),
                      "%s ships by %s", st.replicas[i].name, st.replicas[i].path);
    /* The last frames wait in its ring until its next pass. */
    __atomic_store_n(&nodes[2].sleepy, 0, __ATOMIC_RELEASE);
    ck_assert(wait_position(2, ver, 5000));
    node_kill(2);
    ck_assert_int_eq(pool_get(2, "full1699", got, sizeof(got), NULL), 0);
    ck_assert_int_eq(got[0], 'a' + 1699 % 26);
    ck_assert_uint_eq(strlen(got), sizeof(val) - 1);
}
END_TEST

/* A heartbeat (an APPEND of no records) sent before frames the backup has
 * taken since is behind, not a gap: said to be a gap, it would cost the
 * primary its ring at every full ring. One from an older epoch, or past
 * the backup, is a gap still. */
static uint32_t heartbeat(struct tern_session *s, uint64_t epoch, uint64_t prev, uint64_t *pos)
{
    struct repl_batch b = {.epoch = epoch, .prev = prev};
    struct repl_pos out;
    size_t len = 0;

    strcpy(b.shard, "kv0");
    ck_assert_int_eq(tern_call_sync(s, TERN_REPL_SERVICE_ID, REPL_M_APPEND, &b, sizeof(b), &out,
                                    sizeof(out), &len, 2000000000u), 0);
    ck_assert_uint_eq(len, sizeof(out));
    *pos = out.position;
    return out.flags;
}

START_TEST(heartbeat_behind_the_ring_is_no_gap)
{
    struct tern_session *s;
    uint64_t first = 0, ver = 0, pos = 0;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    ck_assert_int_eq(kv_put(s, "hb0", "x", KV_F_W_ALL, 2000000000u, &first), 0);
    for (int i = 1; i < 20; i++)
        ck_assert_int_eq(kv_put(s, "hb", "y", KV_F_W_ALL, 2000000000u, &ver), 0);
    tern_rpc_disconnect(s);
    ck_assert(wait_position(1, ver, 5000));
    s = connect_to(1);
    ck_assert_uint_eq(heartbeat(s, 1, first, &pos) & REPL_GAP, 0);
    ck_assert_uint_eq(pos, ver);
    ck_assert_uint_eq(heartbeat(s, 1, ver, &pos) & REPL_GAP, 0);
    ck_assert_uint_eq(heartbeat(s, 1, ver + 5, &pos) & REPL_GAP, REPL_GAP);
    ck_assert_uint_eq(heartbeat(s, 1, repl_epoch_base(1) - 1, &pos) & REPL_GAP, REPL_GAP);
    ck_assert_uint_eq(pos, ver);
    tern_rpc_disconnect(s);
}
END_TEST

/* A client told of one backup learns the others from it (the shard's map,
 * as the view has it) and reaches the primary. */
START_TEST(client_learns_the_members)
{
    const char *uris[1] = {nodes[0].uri};
    struct tern_kv *kv;
    uint64_t ver = 0;
    char got[16];
    size_t len;

    elect(1, 1);
    ck_assert(wait_state(1, "primary", 5000));
    ck_assert_int_eq(tern_kv_open_replicas(cep, uris, 1, 2000000000u, &kv), 0);
    ck_assert_int_eq(tern_kv_put(kv, "learned", 7, "yes", 3, &ver), 0);
    ck_assert_uint_eq(repl_epoch_of(ver), 1);
    ck_assert_int_eq(tern_kv_get(kv, "learned", 7, got, sizeof(got), &len, NULL), 0);
    ck_assert_uint_eq(len, 3);
    /* And follows a failover to the third, never named either. */
    node_kill(1);
    elect(2, 2);
    ck_assert_int_eq(tern_kv_put(kv, "again", 5, "yes", 3, &ver), 0);
    ck_assert_uint_eq(repl_epoch_of(ver), 2);
    tern_kv_close(kv);
}
END_TEST

/* A GET that takes any replica is answered by a backup whose store is
 * whole, also with the primary gone; one without it, only by the primary.
 * A client reading from any replica spreads its GETs over them. */
START_TEST(reads_from_backups_when_asked)
{
    const char *uris[NODES];
    struct tern_session *b;
    struct tern_kv *kv;
    char key[32], val[32], got[64];
    uint64_t ver = 0;
    size_t len;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    for (unsigned i = 0; i < NODES; i++)
        uris[i] = nodes[i].uri;
    ck_assert_int_eq(tern_kv_open_replicas(cep, uris, NODES, 2000000000u, &kv), 0);
    ck_assert_int_eq(tern_kv_set_read_from(kv, (enum tern_kv_read_from)7), TERN_EINVAL);
    ck_assert_int_eq(tern_kv_set_write_concern(kv, TERN_KV_W_ALL), 0);
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "r%d", i);
        snprintf(val, sizeof(val), "v%d", i);
        ck_assert_int_eq(tern_kv_put(kv, key, strlen(key), val, strlen(val), &ver), 0);
    }
    ck_assert(wait_position(1, ver, 5000));
    b = connect_to(1);
    ck_assert_int_eq(kv_get(b, "r3", got, sizeof(got), 2000000000u), TERN_ENOTPRIMARY);
    ck_assert_int_eq(kv_get_flags(b, "r3", KV_F_READ_ANY, got, sizeof(got), 2000000000u), 0);
    ck_assert_str_eq(got, "v3");
    ck_assert_int_eq(kv_get_flags(b, "r3", KV_F_W_ONE, got, sizeof(got), 2000000000u),
                     TERN_EPROTO);
    /* The client's GETs go round the replicas; every one answers. */
    ck_assert_int_eq(tern_kv_set_read_from(kv, TERN_KV_READ_ANY), 0);
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "r%d", i % 20);
        snprintf(val, sizeof(val), "v%d", i % 20);
        ck_assert_int_eq(tern_kv_get(kv, key, strlen(key), got, sizeof(got) - 1, &len, NULL), 0);
        got[len] = 0;
        ck_assert_str_eq(got, val);
    }
    /* The primary gone and nobody elected: the backups still answer. */
    node_kill(0);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(tern_kv_get(kv, "r7", 2, got, sizeof(got) - 1, &len, NULL), 0);
        ck_assert_uint_eq(len, 2);
    }
    ck_assert_int_eq(kv_get_flags(b, "r9", KV_F_READ_ANY, got, sizeof(got), 2000000000u), 0);
    ck_assert_str_eq(got, "v9");
    tern_rpc_disconnect(b);
    tern_kv_close(kv);
}
END_TEST

/* A learner takes the stream but is no majority; once it holds every
 * acknowledged write the primary counts it in and finds it due to be a
 * voter, and as one it is a majority with the primary. */
START_TEST(a_learner_counts_once_promoted)
{
    struct tern_session *s;
    struct repl_status st;
    uint64_t ver = 0;
    char key[32];

    /* n2 joins as a learner, down at first: nothing to count in. */
    node_kill(2);
    set_votes(REPL_VOTER, REPL_VOTER, REPL_LEARNER);
    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof(key), "l%d", i);
        ck_assert_int_eq(kv_put(s, key, "v", 0, 2000000000u, &ver), 0);
    }
    ck_assert(!wait_step(0, REPL_STEP_PROMOTE, NULL, 300));
    /* Up, it catches up; holding every acknowledged write, it is counted
     * in and due to be a voter. */
    node_start(2);
    set_view(2, REPL_BACKUP, 1, 0);
    set_votes(REPL_VOTER, REPL_VOTER, REPL_LEARNER);
    ck_assert(wait_position(2, ver, 5000));
    ck_assert(wait_step(0, REPL_STEP_PROMOTE, "n2", 5000));
    st = status_of(0);
    ck_assert_str_eq(st.replicas[1].name, "n2");
    ck_assert_str_eq(st.replicas[1].vote, "joining");
    /* Until the map makes it a voter a write needs a majority of the
     * voters as they were (n0, n1) as well: with n1 down, none, though
     * n0 and n2 hold it. */
    node_kill(1);
    ck_assert_int_eq(kv_put(s, "lone", "v", 0, 400000000u, &ver), TERN_ETIMEDOUT);
    ck_assert(wait_position(2, ver, 5000));
    /* A voter: n0 and n2 are a majority of three. */
    set_votes(REPL_VOTER, REPL_VOTER, REPL_VOTER);
    ck_assert(wait_step(0, REPL_STEP_NONE, NULL, 2000));
    ck_assert_int_eq(kv_put(s, "pair", "v", 0, 2000000000u, &ver), 0);
    ck_assert_str_eq(status_of(0).replicas[1].vote, "voter");
    tern_rpc_disconnect(s);
}
END_TEST

/* A backup leaving still counts, and no longer suffices: a write needs a
 * majority with it and one without it. Once a majority without it holds
 * every acknowledged write, the primary finds it due to be dropped. */
START_TEST(a_leaving_backup_is_dropped_when_safe)
{
    struct tern_session *s;
    uint64_t ver = 0;

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    node_kill(1);
    /* With n1 down, n0 and n2 are a majority of three... */
    ck_assert_int_eq(kv_put(s, "before", "v", 0, 2000000000u, &ver), 0);
    ck_assert(!wait_step(0, REPL_STEP_DROP, NULL, 200));
    /* ...but n2 leaving, a majority of (n0, n1) is needed too. */
    set_votes(REPL_VOTER, REPL_VOTER, REPL_LEAVING);
    ck_assert(wait_step(0, REPL_STEP_NONE, NULL, 2000));
    ck_assert_int_eq(kv_put(s, "joint", "v", 0, 400000000u, &ver), TERN_ETIMEDOUT);
    ck_assert(!wait_step(0, REPL_STEP_DROP, NULL, 300));
    node_start(1);
    set_view(1, REPL_BACKUP, 1, 0);
    ck_assert(wait_position(1, ver, 5000));
    ck_assert(wait_step(0, REPL_STEP_DROP, "n2", 5000));
    /* Dropped: two voters, both needed. */
    set_view(2, REPL_NONE, 1, 0);
    set_votes(REPL_VOTER, REPL_VOTER, NOT_IN);
    ck_assert(wait_step(0, REPL_STEP_NONE, NULL, 2000));
    ck_assert_int_eq(kv_put(s, "two", "v", 0, 2000000000u, &ver), 0);
    ck_assert_uint_eq(status_of(0).n, 1);
    tern_rpc_disconnect(s);
}
END_TEST

/* A leaving primary takes no more writes and resigns once a voter that
 * stays holds all it wrote; the next primary takes over (the leaving node
 * is heard as a voter) and drops it. */
START_TEST(a_leaving_primary_hands_over)
{
    struct tern_session *s;
    uint64_t ver = 0;
    char key[32], got[64];

    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "h%d", i);
        ck_assert_int_eq(kv_put(s, key, "before", 0, 2000000000u, &ver), 0);
    }
    set_votes(REPL_LEAVING, REPL_VOTER, REPL_VOTER);
    ck_assert(wait_step(0, REPL_STEP_RESIGN, NULL, 5000));
    ck_assert(status_of(0).handing_over);
    ck_assert_int_eq(kv_put(s, "late", "v", 0, 2000000000u, NULL), TERN_ENOTPRIMARY);
    tern_rpc_disconnect(s);
    /* The office goes to n1 at epoch 2; n0 still in the map, leaving. */
    elect(1, 2);
    ck_assert(wait_state(1, "primary", 5000));
    ck_assert(wait_step(1, REPL_STEP_DROP, "n0", 5000));
    s = connect_to(1);
    ck_assert_int_eq(kv_get(s, "h99", got, sizeof(got), 2000000000u), 0);
    ck_assert_str_eq(got, "before");
    ck_assert_int_eq(put_retrying(s, "after", "v", &ver), 0);
    ck_assert_uint_eq(repl_epoch_of(ver), 2);
    tern_rpc_disconnect(s);
}
END_TEST

/* Two voters, the primary leaving, and it dies before it resigns: the
 * other hears no majority of the two, but every write acknowledged is on
 * it (both were needed), so it takes over as the one voter that stays,
 * has every write, and drops the dead one; writes go on once the map has
 * dropped it. */
START_TEST(a_leaving_primary_that_dies_is_replaced)
{
    struct tern_session *s;
    uint64_t ver = 0;
    char key[32], got[64];

    node_kill(2);
    set_votes(REPL_VOTER, REPL_VOTER, NOT_IN);
    elect(0, 1);
    ck_assert(wait_state(0, "primary", 5000));
    s = connect_to(0);
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "d%d", i);
        ck_assert_int_eq(kv_put(s, key, "before", 0, 2000000000u, &ver), 0);
    }
    set_votes(REPL_LEAVING, REPL_VOTER, NOT_IN);
    ck_assert(wait_step(0, REPL_STEP_RESIGN, NULL, 5000));
    tern_rpc_disconnect(s);
    node_kill(0);
    elect(1, 2);
    ck_assert(wait_state(1, "primary", 5000));
    ck_assert(wait_step(1, REPL_STEP_DROP, "n0", 5000));
    set_votes(NOT_IN, REPL_VOTER, NOT_IN);
    s = connect_to(1);
    ck_assert_int_eq(kv_get(s, "d99", got, sizeof(got), 2000000000u), 0);
    ck_assert_str_eq(got, "before");
    ck_assert_int_eq(put_retrying(s, "after", "v", &ver), 0);
    ck_assert_uint_eq(repl_epoch_of(ver), 2);
    tern_rpc_disconnect(s);
}
END_TEST

Suite *suite_repl(void)
{
    Suite *s = suite_create("repl");
    TCase *wire = tcase_create("wire");
    TCase *group = tcase_create("group");
    TCase *shm = tcase_create("shm");

    tcase_add_test(wire, batch_walk_refuses_any_fault);
    tcase_add_test(wire, log_keeps_the_newest_and_says_what_it_lost);
    tcase_add_test(wire, state_file_takes_only_its_own_form);
    tcase_add_test(wire, ring_frames_count_only_whole);
    suite_add_tcase(s, wire);
    tcase_add_checked_fixture(group, repl_setup, repl_teardown);
    tcase_set_timeout(group, 60);
    tcase_add_test(group, writes_wait_for_their_concern);
    tcase_add_test(group, returning_backup_catches_up);
    tcase_add_test(group, new_primary_takes_the_newest_log);
    tcase_add_test(group, deposed_primary_is_fenced);
    tcase_add_test(group, primary_in_doubt_serves_what_a_majority_confirms);
    tcase_add_test(group, primary_in_doubt_reads_nothing_stale);
    tcase_add_test(group, client_follows_the_primary);
    tcase_add_test(group, far_behind_backup_gets_a_full_copy);
    tcase_add_test(group, parted_replica_is_copied_over);
    tcase_add_test(group, copied_replica_serves_every_write);
    tcase_add_test(group, ring_frames_outlive_the_backup);
    tcase_add_test(group, heartbeat_behind_the_ring_is_no_gap);
    tcase_add_test(group, client_learns_the_members);
    tcase_add_test(group, reads_from_backups_when_asked);
    tcase_add_test(group, a_learner_counts_once_promoted);
    tcase_add_test(group, a_leaving_backup_is_dropped_when_safe);
    tcase_add_test(group, a_leaving_primary_hands_over);
    tcase_add_test(group, a_leaving_primary_that_dies_is_replaced);
    suite_add_tcase(s, group);
    /* The same over shm, where records go by direct stores. */
    tcase_add_checked_fixture(shm, repl_setup_shm, repl_teardown);
    tcase_set_timeout(shm, 60);
    tcase_add_test(shm, shm_ships_one_sided);
    tcase_add_test(shm, full_ring_wakes_a_sleeping_backup);
    tcase_add_test(shm, heartbeat_behind_the_ring_is_no_gap);
    tcase_add_test(shm, writes_wait_for_their_concern);
    tcase_add_test(shm, returning_backup_catches_up);
    tcase_add_test(shm, new_primary_takes_the_newest_log);
    tcase_add_test(shm, deposed_primary_is_fenced);
    tcase_add_test(shm, far_behind_backup_gets_a_full_copy);
    tcase_add_test(shm, copied_replica_serves_every_write);
    tcase_add_test(shm, a_learner_counts_once_promoted);
    tcase_add_test(shm, a_leaving_primary_hands_over);
    suite_add_tcase(s, shm);
    return s;
}
