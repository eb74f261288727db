/* The KV service's request decoding (services/kv/kv_service.c and
 * kv_service_onesided.c, kv_wire.h), called through an RPC session of this
 * process over tcp, on a small pool in /dev/shm with the one-sided paths
 * on; the server owns half the hash space.
 *
 * The input is a run of requests. Each names a method (the eleven the service
 * has, or none) and carries either bytes from the input or a request built
 * by the harness from fields of the input: keys from a small alphabet so
 * that they meet again, PUT values, MGET key lists, SCAN cursors, LPUT
 * offsets and intents, PGET buffers. A request may also be a record the
 * client writes into its leased segment by one-sided put (a header from
 * the input, its sum made right or not), followed by the LPUT that hands
 * it to the server, as a lessee does: the server checks what a client wrote
 * into its pool. Or the lessee writes any bytes anywhere in its lease, over
 * records the server took as well: it may, until the lease ends. Between runs the store is emptied and the session's lease
 * ended, so that a run depends on its input alone. */
#include <unistd.h>

#include "fuzz.h"
#include "kv.h"
#include "kv/kv_service_internal.h"
#include "kv/kv_store.h"
#include "kv/kv_wire.h"
#include "log.h"
#include "rpc_internal.h"

#define POOL_SIZE (4u << 20)
#define SEG_SIZE (64u * 1024)
#define MAX_MSG (16u * 1024)
#define POLLS_MAX 200000
#define OPS_MAX 64

static const char *pool_path;
static struct tern_kv_service *svc;
static struct tern_rpc_ep *srv, *cli;
static struct tern_session *sess;
static struct tern_rpc_mr *buf_mr;     /* the client's: PUT sources, PGET targets */
static char uri[128];
static uint8_t req[MAX_MSG + 64];
static volatile uint8_t sink;

struct reply {
    bool done;
    int status;
    size_t len;
    uint8_t data[256];
};

static struct kv_lease lease;          /* the last lease granted in this run */
static bool leased;

static void connect_session(void)
{
    int rc = rpc_connect_start(cli, uri, 0, NULL, &sess);

    FZ_CHECK(rc == 0 && sess, "connect: %d", rc);
    for (int i = 0; i < POLLS_MAX && sess->state == SESS_CONNECTING; i++) {
        tern_rpc_poll(srv);
        tern_rpc_poll(cli);
    }
    FZ_CHECK(sess->state == SESS_OPEN, "the session did not open");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG, .credits = 8, .max_calls = 64};
    struct tern_kv_service_opts so = {.pool_size = POOL_SIZE, .seg_size = SEG_SIZE,
                                      .range_lo = 0, .range_hi = UINT32_MAX / 2};
    /* Leases never refused for being wasted: the runs waste them all. */
    struct tern_kv_onesided_opts oo = {.session_leases = 1u << 30, .lease_pool_pct = 50};
    int rc;

    tern_log_set_level(TERN_LOG_ERROR);
    pool_path = fz_tmp_pool("kv");
    so.pool_path = pool_path;
    rc = tern_kv_service_open(&so, &svc);
    FZ_CHECK(rc == 0, "service: %d", rc);
    FZ_CHECK(tern_rpc_open(&cfg, &srv) == 0 && tern_rpc_open(&cfg, &cli) == 0, "endpoints");
    FZ_CHECK(tern_rpc_register(srv, tern_kv_service_def(svc)) == 0, "register");
    rc = tern_rpc_listen(srv, "tcp://127.0.0.1:0", uri, sizeof(uri));
    FZ_CHECK(rc == 0, "listen: %d", rc);
    rc = tern_kv_service_enable_onesided(svc, srv, &oo);
    FZ_CHECK(rc == 0, "one-sided: %d", rc);
    rc = tern_rpc_mr_alloc(cli, 65536,
                           TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE, &buf_mr);
    FZ_CHECK(rc == 0, "client region: %d", rc);
    connect_session();
    return 0;
}

static void on_reply(void *arg, int status, const void *data, size_t len)
{
    struct reply *r = arg;

    FZ_CHECK(!r->done, "a continuation ran twice");
    FZ_CHECK(status <= 0 && (status == 0 || !len), "status %d with %zu bytes", status, len);
    r->done = true;
    r->status = status;
    r->len = len;
    for (size_t i = 0; i < len; i++)
        sink ^= ((const uint8_t *)data)[i];
    if (len)
        memcpy(r->data, data, len < sizeof(r->data) ? len : sizeof(r->data));
}

static void wait_for(bool *done)
{
    for (int i = 0; i < POLLS_MAX && !*done; i++) {
        tern_rpc_poll(srv);
        tern_rpc_poll(cli);
    }
    FZ_CHECK(*done, "no answer");
}

static int call(uint16_t method, const void *p, size_t len, struct reply *r)
{
    int rc;

    *r = (struct reply){0};
    rc = tern_call(sess, TERN_KV_SERVICE_ID, method, p, len, 0, on_reply, r, NULL);
    if (rc < 0)
        return rc;
    wait_for(&r->done);
    return r->status;
}

/* A key of 1 to 4 bytes from a 4-letter alphabet, or up to 64 input bytes. */
static size_t key_of(struct fz *f, uint8_t *out)
{
    uint8_t k = fz_u8(f);

    if (k & 0x80) {
        const uint8_t *b;
        size_t n = fz_take(f, k & 63, &b);

        memcpy(out, b, n);
        return n;
    }
    for (unsigned i = 0; i <= (k & 3u); i++)
        out[i] = (uint8_t)('a' + ((k >> (2 + i)) & 3));
    return (k & 3u) + 1;
}

static size_t put_key(uint8_t *p, uint16_t klen_field, const uint8_t *key, size_t klen,
                      uint32_t vlen)
{
    struct kv_key k = {.klen = klen_field, .vlen = vlen};

    memcpy(p, &k, sizeof(k));
    memcpy(p + sizeof(k), key, klen);
    return sizeof(k) + klen;
}

/* A request built from fields of the input; returns its length. */
static size_t build(struct fz *f, uint16_t method, uint8_t op)
{
    uint8_t key[64];
    size_t klen, len = 0;
    bool lie = op & 0x40;   /* a length field that does not match */

    switch (method) {
    case KV_M_GET:
    case KV_M_DEL:
        klen = key_of(f, key);
        return put_key(req, lie ? fz_u16(f) : (uint16_t)klen, key, klen, lie ? fz_u32(f) : 0);
    case KV_M_PUT: {
        uint32_t vlen = fz_u16(f) % 2048;
        const uint8_t *v;
        size_t got;

        klen = key_of(f, key);
        len = put_key(req, lie ? fz_u16(f) : (uint16_t)klen, key, klen,
                      lie ? fz_u32(f) : vlen);
        got = fz_take(f, vlen, &v);
        memcpy(req + len, v, got);
        memset(req + len + got, 'v', vlen - got);
        return len + vlen;
    }
    case KV_M_MGET: {
        struct kv_mget m = {.n = fz_u8(f) % 32};

        len = sizeof(m);
        for (unsigned i = 0; i < m.n && len < 4096; i++) {
            uint16_t kl;

            klen = key_of(f, key);
            kl = lie && (i & 1) ? fz_u16(f) : (uint16_t)klen;
            memcpy(req + len, &kl, sizeof(kl));
            memcpy(req + len + sizeof(kl), key, klen);
            len += sizeof(kl) + klen;
        }
        if (lie)
            m.n = fz_u16(f);
        memcpy(req, &m, sizeof(m));
        return len;
    }
    case KV_M_SCAN: {
        struct kv_scan q = {.cursor = op & 0x20 ? fz_u64(f) : fz_u8(f),
                            .max = lie ? fz_u32(f) : fz_u8(f) % 64};

        memcpy(req, &q, sizeof(q));
        return sizeof(q);
    }
    case KV_M_LEASE: {
        struct kv_lease_req q = {.flags = lie ? fz_u32(f) : 0};

        memcpy(req, &q, sizeof(q));
        return sizeof(q);
    }
    case KV_M_LPUT: {
        struct kv_lput q = {.seg = leased && !lie ? lease.seg : fz_u32(f),
                            .off = leased && !(op & 0x20) ? lease.next : fz_u32(f),
                            .intent = fz_u64(f) | (op & 0x10 ? 0 : 1ull << 63)};

        memcpy(req, &q, sizeof(q));
        return sizeof(q);
    }
    case KV_M_PGET: {
        struct kv_pget q = {.cap = op & 0x20 ? fz_u32(f) : fz_u16(f) % 4096,
                            .off = fz_u16(f) % 65536};

        if (!lie)
            tern_rpc_mr_rkey(buf_mr, sess, &q.dst);
        else
            q.dst = (struct tern_tp_rkey){.addr = fz_u64(f), .len = fz_u32(f),
                                          .key = fz_u32(f), .access = fz_u8(f)};
        klen = key_of(f, key);
        q.klen = op & 0x10 ? fz_u16(f) : (uint16_t)klen;
        memcpy(req, &q, sizeof(q));
        memcpy(req + sizeof(q), key, klen);
        return sizeof(q) + klen;
    }
    default:        /* INFO, ONESIDED_INFO: empty, unless lying */
        return lie ? fz_u8(f) % 16 : 0;
    }
}

struct put_wait {
    bool done;
    int status;
};

static void put_done(void *arg, int status)
{
    struct put_wait *w = arg;

    w->done = true;
    w->status = status;
}

/* A record into the leased segment by one-sided put, then its LPUT. */
static void lessee_write(struct fz *f, uint8_t op)
{
    uint8_t *buf = tern_rpc_mr_addr(buf_mr);
    uint8_t key[64];
    size_t klen = key_of(f, key);
    uint32_t vlen = fz_u16(f) % 1024;
    uint64_t intent = 1ull << 63 | fz_u32(f);
    struct pm_rec r = {.val_len = op & 0x40 ? fz_u32(f) : vlen, .version = intent,
                       .key_len = op & 0x20 ? fz_u16(f) : (uint16_t)klen,
                       .type = op & 0x10 ? fz_u8(f) : PM_VALUE,
                       .flags = op & 0x08 ? fz_u8(f) : 0,
                       .slot = op & 0x04 ? fz_u32(f) : 0};
    size_t total = sizeof(r) + klen + vlen;
    struct tern_tp_rkey rk = lease.rkey;
    struct put_wait w = {0};
    struct reply rep;
    struct kv_lput q = {.seg = lease.seg, .off = lease.next, .intent = intent};
    const uint8_t *v;
    size_t got;

    if (!leased || total > 65536 || lease.next - lease.base + total > lease.end - lease.base)
        return;
    memcpy(buf, &r, sizeof(r));
    memcpy(buf + sizeof(r), key, klen);
    got = fz_take(f, vlen, &v);
    memcpy(buf + sizeof(r) + klen, v, got);
    memset(buf + sizeof(r) + klen + got, 0, vlen - got);
    if (!(op & 0x02) && r.key_len == klen && r.val_len == vlen)
        ((struct pm_rec *)buf)->sum = pm_rec_sum_of((struct pm_rec *)buf);
    if (tern_session_put(sess, buf_mr, 0, total, &rk, lease.next - lease.base, put_done,
                         &w) < 0)
        return;
    wait_for(&w.done);
    if (call(KV_M_LPUT, &q, sizeof(q), &rep) == 0)
        lease.next += (uint32_t)((total + 7) & ~(size_t)7);
}

/* What a lessee may do at any time: write anything anywhere in its lease,
 * records the server already took included. */
static void scribble(struct fz *f)
{
    uint8_t *buf = tern_rpc_mr_addr(buf_mr);
    uint32_t room, at;
    const uint8_t *b;
    size_t n;
    struct put_wait w = {0};

    if (!leased || lease.end <= lease.base)
        return;
    room = lease.end - lease.base;
    at = fz_u16(f) % room;
    n = fz_take(f, 1 + fz_u8(f) % 32, &b);
    if (!n)
        return;
    if (n > room - at)
        n = room - at;
    memcpy(buf, b, n);
    if (tern_session_put(sess, buf_mr, 0, n, &lease.rkey, at, put_done, &w) == 0)
        wait_for(&w.done);
}

static void end_run(void)
{
    struct kvs *store = kv_service_store(svc);

    /* The server's side of the session gives its lease back, as if it
     * had closed. */
    for (struct tern_session *s = srv->sessions; s; s = s->next)
        kv_onesided_session_closed(s, svc);
    int rc = kvs_clear(store, TERN_KV_SYNC);

    FZ_CHECK(rc == 0, "clear: %d (%s)", rc, tern_strerror(rc));
    leased = false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    struct reply r;

    if (!sess || sess->state != SESS_OPEN) {
        if (sess)
            tern_rpc_disconnect(sess);
        connect_session();
    }
    for (unsigned n = 0; f.n && n < OPS_MAX && sess->state == SESS_OPEN; n++) {
        uint8_t op = fz_u8(&f), m = fz_u8(&f) % 12;
        size_t len;

        if (m == 11) {
            if (op & 1)
                scribble(&f);
            else
                lessee_write(&f, op);
            continue;
        }
        if (op & 0x80) {
            const uint8_t *b;

            len = fz_take(&f, fz_u16(&f) % (MAX_MSG + 16), &b);
            memcpy(req, b, len);
        } else {
            len = build(&f, m, op);
        }
        if (call(m, req, len, &r) == 0 && m == KV_M_LEASE && r.len == sizeof(lease)) {
            memcpy(&lease, r.data, sizeof(lease));
            leased = true;
        }
    }
    end_run();
    return 0;
}
