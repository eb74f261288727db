/* The KV client library: routes keys by hash range to one session per
 * server, and gathers each request from a small header, the caller's key and
 * value (tern_callv), so a PUT value is copied once, into the send buffer.
 * Per-call state lives in a fixed slab: nothing is allocated per call. */
#include <endian.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "kv.h"
#include "kv_client_internal.h"
#include "kv_hash.h"
#include "kv_wire.h"
#include "log.h"

#define DEFAULT_TIMEOUT 5000000000ull

/* ---- routing and call slots ---- */

struct kv_server *kv_route(struct tern_kv *kv, const void *key, size_t klen)
{
    uint32_t top = (uint32_t)(kv_hash(key, klen) >> 32);
    unsigned lo = 0, hi = kv->n - 1;

    while (lo < hi) {
        unsigned mid = (lo + hi + 1) / 2;

        if (kv->srv[mid].lo <= top)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &kv->srv[lo];
}

struct kv_op *kv_op_get(struct tern_kv *kv)
{
    struct kv_op *op;

    if (!kv->free_head)
        return NULL;
    op = &kv->ops[kv->free_head - 1];
    kv->free_head = op->next_free;
    return op;
}

void kv_op_put(struct tern_kv *kv, struct kv_op *op)
{
    op->next_free = kv->free_head;
    kv->free_head = (uint32_t)(op - kv->ops) + 1;
}

/* Reply of GET/PUT/DEL: a version, then (GET) the value. The slot goes back
 * before the callback runs, so the callback may start the next call. */
void kv_op_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_op *op = arg;
    tern_kv_cb cb = op->cb;
    void *cb_arg = op->arg;
    uint64_t version = 0;

    if (status < 0 && op->kv->rep && kv_replica_retry(op, status))
        return;
    kv_op_put(op->kv, op);
    if (status == 0) {
        if (len < sizeof(struct kv_val)) {
            status = TERN_EPROTO;
        } else {
            memcpy(&version, reply, sizeof(version));
            reply = (const uint8_t *)reply + sizeof(struct kv_val);
            len -= sizeof(struct kv_val);
        }
    }
    if (cb)
        cb(cb_arg, status, status == 0 ? reply : NULL, status == 0 ? len : 0, version);
}

int kv_op_call(struct kv_op *op, uint16_t method, const void *key, size_t klen,
               const void *val, size_t len)
{
    struct tern_kv *kv = op->kv;
    bool dl = method == KV_M_PUT && op->has_deadline;
    struct iovec iov[4];
    int n = 0, rc;

    op->hdr = (struct kv_key){.klen = (uint16_t)klen,
                              .vlen = (uint32_t)len + (dl ? sizeof(op->deadline_le) : 0)};
    if (method == KV_M_PUT || method == KV_M_DEL || method == KV_M_EXPIRE)
        op->hdr.flags = kv->w_flags | (dl ? KV_F_DEADLINE : 0);
    op->to = kv_route(kv, key, klen)->s;
    if ((method == KV_M_GET || method == KV_M_EXPIRY) && kv->rep && kv->read_any) {
        struct tern_session *s = kv_replica_reader(kv);

        if (s) {
            op->hdr.flags = KV_F_READ_ANY;
            op->to = s;
        }
    }
    /* Kept to send it again to another replica (tern_kv_open_replicas). */
    op->method = method;
    op->key = key;
    op->val = val;
    op->klen = (uint16_t)klen;
    op->vlen = (uint32_t)len;
    iov[n++] = (struct iovec){.iov_base = &op->hdr, .iov_len = sizeof(op->hdr)};
    iov[n++] = (struct iovec){.iov_base = (void *)key, .iov_len = klen};
    if (dl)
        iov[n++] = (struct iovec){.iov_base = &op->deadline_le, .iov_len = sizeof(op->deadline_le)};
    if (len)
        iov[n++] = (struct iovec){.iov_base = (void *)val, .iov_len = len};
    rc = tern_callv(op->to, TERN_KV_SERVICE_ID, method, iov, (unsigned)n, kv->timeout,
                    kv_op_done, op, NULL);
    if (rc < 0)
        kv_op_put(kv, op);
    return rc;
}

/* A call about one key. `at`: PUT, EXPIRE: the deadline (PUT: 0 = none),
 * in host order. */
static int key_call(struct tern_kv *kv, uint16_t method, const void *key, size_t klen,
                    const void *val, size_t len, uint64_t at, tern_kv_cb cb, void *arg)
{
    struct kv_op *op;

    if (!kv || !key || !klen || (len && !val))
        return TERN_EINVAL;
    if (klen > KV_KEY_MAX || len > UINT32_MAX)
        return TERN_E2BIG;
    if (kv->rep)
        kv_replicas_mend(kv);
    if (kv->path != TERN_KV_PATH_RPC && method == KV_M_GET)
        return kv_path_get(kv, key, klen, cb, arg);
    /* One-sided puts write plain values: a deadline goes by RPC. */
    if (kv->path != TERN_KV_PATH_RPC && method == KV_M_PUT && !at)
        return kv_path_put(kv, key, klen, val, len, cb, arg);
    op = kv_op_get(kv);
    if (!op)
        return TERN_ENOBUFS;
    *op = (struct kv_op){.kv = kv, .cb = cb, .arg = arg, .stage = -1,
                         .has_deadline = method == KV_M_PUT && at, .deadline_le = htole64(at)};
    if (method == KV_M_EXPIRE)
        return kv_op_call(op, method, key, klen, &op->deadline_le, sizeof(op->deadline_le));
    return kv_op_call(op, method, key, klen, val, len);
}

int tern_kv_get_async(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb,
                      void *arg)
{
    return key_call(kv, KV_M_GET, key, klen, NULL, 0, 0, cb, arg);
}

int tern_kv_put_async(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                      size_t len, tern_kv_cb cb, void *arg)
{
    return key_call(kv, KV_M_PUT, key, klen, val, len, 0, cb, arg);
}

int tern_kv_put_until_async(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                            size_t len, uint64_t at_ms, tern_kv_cb cb, void *arg)
{
    if (len > UINT32_MAX - sizeof(uint64_t))
        return TERN_E2BIG;
    return key_call(kv, KV_M_PUT, key, klen, val, len, at_ms, cb, arg);
}

int tern_kv_del_async(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb,
                      void *arg)
{
    return key_call(kv, KV_M_DEL, key, klen, NULL, 0, 0, cb, arg);
}

/* ---- sync forms: start the async call and poll until it ends ---- */

struct waiter {
    bool done;
    int status;
    void *buf;
    size_t cap, len;
    uint64_t version;
};

static void wait_cb(void *arg, int status, const void *val, size_t len, uint64_t version)
{
    struct waiter *w = arg;

    w->done = true;
    w->status = status;
    w->len = len;
    w->version = version;
    if (status == 0 && w->buf) {
        if (len > w->cap)
            w->status = TERN_EMSGSIZE;
        else if (len)
            memcpy(w->buf, val, len);
    }
}

static int wait_for(struct tern_kv *kv, struct waiter *w, int rc)
{
    while (rc == 0 && !w->done) {
        rc = tern_rpc_poll(kv->ep);
        rc = rc < 0 ? rc : 0;
    }
    return rc < 0 ? rc : w->status;
}

/* A replicated shard mid-election answers TERN_ENOTPRIMARY everywhere for
 * a moment: the sync forms try again until their deadline. */
static bool again(struct tern_kv *kv, int rc, uint64_t start)
{
    if (!kv->rep || (rc != TERN_ENOTPRIMARY && rc != TERN_ENOTCONN &&
                     rc != TERN_ECONNRESET && rc != TERN_ECONNREFUSED))
        return false;
    if (kv->timeout && tern_now_ns() - start > kv->timeout)
        return false;
    usleep(10000);
    return true;
}

int tern_kv_get(struct tern_kv *kv, const void *key, size_t klen, void *buf, size_t cap,
                size_t *len, uint64_t *version)
{
    struct waiter w = {.buf = buf, .cap = cap};
    uint64_t start = tern_now_ns();
    int rc = wait_for(kv, &w, tern_kv_get_async(kv, key, klen, wait_cb, &w));

    while (again(kv, rc, start)) {
        w = (struct waiter){.buf = buf, .cap = cap};
        rc = wait_for(kv, &w, tern_kv_get_async(kv, key, klen, wait_cb, &w));
    }
    if (len && (rc == 0 || rc == TERN_EMSGSIZE))
        *len = w.len;
    if (version && rc == 0)
        *version = w.version;
    return rc;
}

int tern_kv_put(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                size_t len, uint64_t *version)
{
    struct waiter w = {0};
    uint64_t start = tern_now_ns();
    int rc = wait_for(kv, &w, tern_kv_put_async(kv, key, klen, val, len, wait_cb, &w));

    while (again(kv, rc, start)) {
        w = (struct waiter){0};
        rc = wait_for(kv, &w, tern_kv_put_async(kv, key, klen, val, len, wait_cb, &w));
    }
    if (version && rc == 0)
        *version = w.version;
    return rc;
}

int tern_kv_put_until(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                      size_t len, uint64_t at_ms, uint64_t *version)
{
    struct waiter w = {0};
    uint64_t start = tern_now_ns();
    int rc = wait_for(kv, &w, tern_kv_put_until_async(kv, key, klen, val, len, at_ms, wait_cb,
                                                      &w));

    while (again(kv, rc, start)) {
        w = (struct waiter){0};
        rc = wait_for(kv, &w, tern_kv_put_until_async(kv, key, klen, val, len, at_ms, wait_cb,
                                                      &w));
    }
    if (version && rc == 0)
        *version = w.version;
    return rc;
}

int tern_kv_expiry(struct tern_kv *kv, const void *key, size_t klen, uint64_t *at_ms)
{
    uint64_t le = 0;
    struct waiter w = {.buf = &le, .cap = sizeof(le)};
    uint64_t start = tern_now_ns();
    int rc = wait_for(kv, &w, key_call(kv, KV_M_EXPIRY, key, klen, NULL, 0, 0, wait_cb, &w));

    while (again(kv, rc, start)) {
        w = (struct waiter){.buf = &le, .cap = sizeof(le)};
        rc = wait_for(kv, &w, key_call(kv, KV_M_EXPIRY, key, klen, NULL, 0, 0, wait_cb, &w));
    }
    if (rc == 0 && w.len != sizeof(le))
        rc = TERN_EPROTO;
    if (rc == 0 && at_ms)
        *at_ms = le64toh(le);
    return rc;
}

int tern_kv_expire(struct tern_kv *kv, const void *key, size_t klen, uint64_t at_ms)
{
    struct waiter w = {0};
    uint64_t start = tern_now_ns();
    int rc = wait_for(kv, &w, key_call(kv, KV_M_EXPIRE, key, klen, NULL, 0, at_ms, wait_cb, &w));

    while (again(kv, rc, start)) {
        w = (struct waiter){0};
        rc = wait_for(kv, &w, key_call(kv, KV_M_EXPIRE, key, klen, NULL, 0, at_ms, wait_cb, &w));
    }
    return rc;
}

int tern_kv_del(struct tern_kv *kv, const void *key, size_t klen)
{
    struct waiter w = {0};
    uint64_t start = tern_now_ns();
    int rc = wait_for(kv, &w, tern_kv_del_async(kv, key, klen, wait_cb, &w));

    while (again(kv, rc, start)) {
        w = (struct waiter){0};
        rc = wait_for(kv, &w, tern_kv_del_async(kv, key, klen, wait_cb, &w));
    }
    return rc;
}

/* ---- multi-get ---- */

/* One server's share of an MGET: the request built in `buf`, the caller's
 * index of each key in it, and how many have been answered. */
struct mget_part {
    struct mget_all *all;
    unsigned *idx;
    unsigned n, done;
    uint8_t *buf;
    size_t len;
    struct tern_session *s;
    bool busy;
};

struct mget_all {
    struct tern_kv *kv;
    const void *const *keys;
    const size_t *klens;
    tern_kv_mget_cb cb;
    void *arg;
    unsigned busy;
    int status;
};

static int mget_send(struct mget_part *p);

static void mget_done(void *arg, int status, const void *reply, size_t len)
{
    struct mget_part *p = arg;
    struct mget_all *a = p->all;
    const uint8_t *r = reply;
    struct kv_mget_rep rep;
    size_t off = sizeof(rep);

    p->busy = false;
    a->busy--;
    if (status == 0 && len < sizeof(rep))
        status = TERN_EPROTO;
    if (status == 0) {
        memcpy(&rep, r, sizeof(rep));
        if (!rep.n_done || rep.n_done > p->n - p->done)
            status = TERN_EPROTO;
    }
    for (unsigned i = 0; status == 0 && i < rep.n_done; i++) {
        struct kv_item it;

        if (off + sizeof(it) > len) {
            status = TERN_EPROTO;
            break;
        }
        memcpy(&it, r + off, sizeof(it));
        if (it.klen || off + kv_item_size(0, it.vlen) > len) {
            status = TERN_EPROTO;
            break;
        }
        a->cb(a->arg, p->idx[p->done], it.status, it.status == 0 ? r + off + sizeof(it) : NULL,
              it.status == 0 ? it.vlen : 0, it.version);
        p->done++;
        off += kv_item_size(0, it.vlen);
    }
    if (status < 0) {
        if (!a->status)
            a->status = status;
        return;
    }
    if (p->done < p->n) {
        status = mget_send(p);      /* the rest did not fit in one reply */
        if (status < 0 && !a->status)
            a->status = status;
    }
}

/* Build and send the request for keys done..n of a part. */
static int mget_send(struct mget_part *p)
{
    struct mget_all *a = p->all;
    struct kv_mget m = {.n = (uint16_t)(p->n - p->done)};
    size_t off = sizeof(m);
    int rc;

    memcpy(p->buf, &m, sizeof(m));
    for (unsigned i = p->done; i < p->n; i++) {
        uint16_t klen = (uint16_t)a->klens[p->idx[i]];

        memcpy(p->buf + off, &klen, sizeof(klen));
        memcpy(p->buf + off + sizeof(klen), a->keys[p->idx[i]], klen);
        off += sizeof(klen) + klen;
    }
    rc = tern_call(p->s, TERN_KV_SERVICE_ID, KV_M_MGET, p->buf, off, a->kv->timeout,
                   mget_done, p, NULL);
    if (rc == 0) {
        p->busy = true;
        a->busy++;
    }
    return rc;
}

int tern_kv_mget(struct tern_kv *kv, unsigned n, const void *const *keys, const size_t *klens,
                 tern_kv_mget_cb cb, void *arg)
{
    struct mget_all a = {.kv = kv, .keys = keys, .klens = klens, .cb = cb, .arg = arg};
    struct mget_part *parts;
    unsigned *idx;
    size_t bytes = 0;
    uint8_t *scratch = NULL, *bufs;
    int rc = 0;

    if (!kv || (n && (!keys || !klens || !cb)))
        return TERN_EINVAL;
    if (!n)
        return 0;
    for (unsigned i = 0; i < n; i++) {
        if (!keys[i] || !klens[i])
            return TERN_EINVAL;
        if (klens[i] > KV_KEY_MAX)
            return TERN_E2BIG;
        bytes += sizeof(uint16_t) + klens[i];
    }
    /* A batch call, not a hot path: its scratch space is allocated here. */
    parts = calloc(kv->n, sizeof(*parts));
    idx = malloc(n * sizeof(*idx));
    bufs = scratch = malloc(bytes + kv->n * sizeof(struct kv_mget));
    if (!parts || !idx || !scratch) {
        rc = TERN_ENOMEM;
        goto out;
    }
    /* Count each server's keys, give it its slice of idx, then fill it. */
    for (unsigned i = 0; i < n; i++)
        parts[kv_route(kv, keys[i], klens[i]) - kv->srv].done++;
    for (unsigned sv = 0, at = 0; sv < kv->n; sv++) {
        unsigned count = parts[sv].done;

        parts[sv] = (struct mget_part){.all = &a, .idx = idx + at, .s = kv->srv[sv].s};
        at += count;
    }
    for (unsigned i = 0; i < n; i++) {
        struct mget_part *p = &parts[kv_route(kv, keys[i], klens[i]) - kv->srv];

        p->idx[p->n++] = i;
    }
    for (unsigned sv = 0; sv < kv->n; sv++) {
        struct mget_part *p = &parts[sv];

        if (!p->n)
            continue;
        p->buf = bufs;
        for (unsigned i = 0; i < p->n; i++)
            bufs += sizeof(uint16_t) + klens[p->idx[i]];
        bufs += sizeof(struct kv_mget);
        if (p->n > UINT16_MAX) {
            rc = TERN_E2BIG;
            break;
        }
        rc = mget_send(p);
        if (rc < 0)
            break;
    }
    while (a.busy) {
        int prc = tern_rpc_poll(kv->ep);

        if (prc < 0 && !rc)
            rc = prc;
    }
    if (!rc)
        rc = a.status;
out:
    free(scratch);
    free(idx);
    free(parts);
    return rc;
}

/* ---- scan and count ---- */

struct scan_wait {
    bool done;
    int status;
    tern_kv_scan_cb cb;
    void *arg;
    uint64_t next;
};

static void scan_done(void *arg, int status, const void *reply, size_t len)
{
    struct scan_wait *w = arg;
    const uint8_t *r = reply;
    struct kv_scan_rep rep;
    size_t off = sizeof(rep);

    w->done = true;
    w->status = status;
    if (status < 0)
        return;
    if (len < sizeof(rep)) {
        w->status = TERN_EPROTO;
        return;
    }
    memcpy(&rep, r, sizeof(rep));
    for (uint32_t i = 0; i < rep.n; i++) {
        struct kv_item it;

        if (off + sizeof(it) > len) {
            w->status = TERN_EPROTO;
            return;
        }
        memcpy(&it, r + off, sizeof(it));
        if (!it.klen || off + kv_item_size(it.klen, it.vlen) > len) {
            w->status = TERN_EPROTO;
            return;
        }
        w->cb(w->arg, r + off + sizeof(it), it.klen, r + off + sizeof(it) + it.klen, it.vlen,
              it.version);
        off += kv_item_size(it.klen, it.vlen);
    }
    w->next = rep.next;
}

int tern_kv_scan(struct tern_kv *kv, uint64_t *cursor, unsigned max, tern_kv_scan_cb cb,
                 void *arg)
{
    /* The cursor: server index in the top byte, that server's cursor (which
     * stays below 2^32) in the rest. */
    unsigned sv;
    struct kv_scan q;
    struct scan_wait w = {.cb = cb, .arg = arg};
    int rc;

    if (!kv || !cursor || !cb || !max)
        return TERN_EINVAL;
    sv = (unsigned)(*cursor >> 56);
    if (sv >= kv->n)
        return TERN_EINVAL;
    q = (struct kv_scan){.cursor = *cursor & ((1ull << 56) - 1), .max = max};
    rc = tern_call(kv->srv[sv].s, TERN_KV_SERVICE_ID, KV_M_SCAN, &q, sizeof(q), kv->timeout,
                   scan_done, &w, NULL);
    while (rc == 0 && !w.done) {
        rc = tern_rpc_poll(kv->ep);
        rc = rc < 0 ? rc : 0;
    }
    if (rc < 0 || w.status < 0)
        return rc < 0 ? rc : w.status;
    if (w.next >= (1ull << 56))
        return TERN_EPROTO;
    if (w.next)
        *cursor = (uint64_t)sv << 56 | w.next;
    else
        *cursor = sv + 1 < kv->n ? (uint64_t)(sv + 1) << 56 : 0;
    return 0;
}

static int info_of(struct tern_kv *kv, struct tern_session *s, struct kv_info *info)
{
    size_t len;
    int rc = tern_call_sync(s, TERN_KV_SERVICE_ID, KV_M_INFO, NULL, 0, info, sizeof(*info),
                            &len, kv->timeout);

    if (rc == 0 && len != sizeof(*info))
        rc = TERN_EPROTO;
    return rc;
}

int tern_kv_count(struct tern_kv *kv, uint64_t *keys)
{
    *keys = 0;
    for (unsigned i = 0; i < kv->n; i++) {
        struct kv_info info;
        int rc = info_of(kv, kv->srv[i].s, &info);

        if (rc < 0)
            return rc;
        *keys += info.keys;
    }
    return 0;
}

/* ---- open and close ---- */

static int by_lo(const void *a, const void *b)
{
    const struct kv_server *x = a, *y = b;

    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int tern_kv_open(struct tern_rpc_ep *ep, const char *const *uris, unsigned n,
                 uint64_t timeout_ns, struct tern_kv **out)
{
    struct tern_kv *kv;
    int rc = 0;

    if (!ep || !uris || !n || n > 255 || !out)
        return TERN_EINVAL;
    kv = calloc(1, sizeof(*kv));
    if (!kv)
        return TERN_ENOMEM;
    kv->ep = ep;
    kv->timeout = DEFAULT_TIMEOUT;
    kv->srv = calloc(n, sizeof(*kv->srv));
    if (!kv->srv) {
        free(kv);
        return TERN_ENOMEM;
    }
    for (uint32_t i = KV_OPS; i > 0; i--)
        kv_op_put(kv, &kv->ops[i - 1]);
    for (unsigned i = 0; i < n && rc == 0; i++) {
        struct kv_info info;

        rc = tern_rpc_connect(ep, uris[i], timeout_ns, &kv->srv[i].s);
        if (rc < 0) {
            tern_log(TERN_LOG_ERROR, "kv", "connect %s: %s", uris[i], tern_strerror(rc));
            break;
        }
        kv->n++;
        rc = info_of(kv, kv->srv[i].s, &info);
        if (rc < 0) {
            tern_log(TERN_LOG_ERROR, "kv", "%s: no KV service: %s", uris[i], tern_strerror(rc));
            break;
        }
        kv->srv[i].lo = info.range_lo;
        kv->srv[i].hi = info.range_hi;
    }
    if (rc == 0) {
        /* The ranges must tile the 32-bit space: sorted, each starting one
         * past the previous end, from 0 to the top. */
        qsort(kv->srv, n, sizeof(*kv->srv), by_lo);
        for (unsigned i = 0; i < n && rc == 0; i++) {
            uint64_t expect = i ? (uint64_t)kv->srv[i - 1].hi + 1 : 0;

            if (kv->srv[i].lo != expect || kv->srv[i].hi < kv->srv[i].lo)
                rc = TERN_EINVAL;
        }
        if (rc == 0 && kv->srv[n - 1].hi != UINT32_MAX)
            rc = TERN_EINVAL;
        if (rc < 0)
            tern_log(TERN_LOG_ERROR, "kv", "the servers' hash ranges do not cover the key space "
                     "exactly once");
    }
    if (rc < 0) {
        tern_kv_close(kv);
        return rc;
    }
    *out = kv;
    return 0;
}

void tern_kv_set_timeout(struct tern_kv *kv, uint64_t timeout_ns)
{
    kv->timeout = timeout_ns;
}

void tern_kv_close(struct tern_kv *kv)
{
    if (!kv)
        return;
    if (kv->rep)
        kv_replicas_free(kv);
    else
        for (unsigned i = 0; i < kv->n; i++)
            tern_rpc_disconnect(kv->srv[i].s);
    kv_onesided_free(kv);
    free(kv->srv);
    free(kv);
}
