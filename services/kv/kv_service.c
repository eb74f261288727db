/* The KV service's handlers. Each checks its request against the payload
 * length before reading it (TERN_EPROTO otherwise), refuses keys outside the
 * server's hash range (TERN_EWRONGNODE), and answers from the store:
 * values are copied from the pool straight into the reply buffer, PUT values
 * from the receive buffer straight into the pool, and a PUT or DELETE is
 * durable before its reply is built. */
#include <endian.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv.h"
#include "kv_service_internal.h"
#include "kv_store.h"
#include "kv_wire.h"
#include "repl.h"


/* Parse a kv_key request; `with_val` for PUT; `write` (PUT, DEL) may carry
 * a write concern in its flags. */
/* `flags`: the kv_key flags the method takes. */
static int parse_key(const void *data, size_t len, bool with_val, unsigned flags,
                     const uint8_t **key, uint16_t *klen, const uint8_t **val, uint32_t *vlen)
{
    struct kv_key k;

    *key = NULL;    /* callers read them only on success; say so to the compiler */
    *klen = 0;
    if (len < sizeof(k))
        return TERN_EPROTO;
    memcpy(&k, data, sizeof(k));
    if ((k.flags & ~flags) ||
        (!with_val && k.vlen) ||
        len != sizeof(k) + (size_t)k.klen + k.vlen)
        return TERN_EPROTO;
    if (!k.klen)
        return TERN_EINVAL;
    *key = (const uint8_t *)data + sizeof(k);
    *klen = k.klen;
    if (val) {
        *val = *key + k.klen;
        *vlen = k.vlen;
    }
    return 0;
}

bool kv_owns(const struct tern_kv_service *svc, const void *key, size_t klen)
{
    uint32_t top = (uint32_t)(kv_hash(key, klen) >> 32);

    return top >= svc->lo && top <= svc->hi;
}

/* ---- replication ---- */

static void kv_tap(void *arg, enum pm_rec_type type, const void *key, uint16_t klen,
                   const void *val, uint32_t len, uint64_t version)
{
    struct tern_kv_service *svc = arg;

    repl_written(svc->repl, type == PM_TOMBSTONE ? REPL_DEL
                            : type == PM_EXPIRING ? REPL_SET_EXPIRING : REPL_SET,
                 key, klen, val, len, version);
}

void kv_service_replicate(struct tern_kv_service *svc, struct repl *r)
{
    svc->repl = r;
    kvs_set_tap(svc->store, r ? kv_tap : NULL, svc);
}

static int op_apply(void *ctx, uint8_t type, const void *key, uint16_t klen, const void *val,
                    uint32_t vlen, uint64_t version)
{
    struct tern_kv_service *svc = ctx;

    enum pm_rec_type t = type == REPL_DEL ? PM_TOMBSTONE
                         : type == REPL_SET_EXPIRING ? PM_EXPIRING : PM_VALUE;

    return kvs_apply(svc->store, t, key, klen, val, vlen, version, 0);
}

static int op_sync(void *ctx)
{
    return kvs_sync(((struct tern_kv_service *)ctx)->store);
}

static uint64_t op_position(void *ctx)
{
    return kvs_version(((struct tern_kv_service *)ctx)->store);
}

static void op_raise(void *ctx, uint64_t v)
{
    kvs_raise_version(((struct tern_kv_service *)ctx)->store, v);
}

static int op_wipe(void *ctx)
{
    return kvs_wipe(((struct tern_kv_service *)ctx)->store);
}

/* A snapshot's piece: whole buckets of the scan, as records. A bucket that
 * does not fit whole is left for the next piece (the scan is resumed at
 * it): the records before it are the piece. */
struct snap_ctx {
    uint8_t *dst;
    size_t cap, used;
    uint32_t n;
    bool full;
};

static int snap_one(void *arg, enum pm_rec_type type, const void *key, size_t klen,
                    const void *val, uint32_t len, uint64_t version)
{
    struct snap_ctx *c = arg;
    size_t size = repl_rec_size(klen, len);

    if (c->full || size > c->cap - c->used) {
        c->full = true;
        return 1;
    }
    repl_rec_write(c->dst + c->used, type == PM_EXPIRING ? REPL_SET_EXPIRING : REPL_SET,
                   version, key, (uint16_t)klen, val, len);
    c->used += size;
    c->n++;
    return 0;
}

static long op_snapshot(void *ctx, uint64_t cursor, void *dst, size_t cap, uint32_t *n,
                        uint64_t *next)
{
    struct tern_kv_service *svc = ctx;
    struct snap_ctx c = {.dst = dst, .cap = cap};

    *n = 0;
    *next = cursor;
    do {
        size_t used = c.used;
        uint32_t count = c.n;
        uint64_t after;
        int rc = kvs_scan_records(svc->store, *next, 1, snap_one, &c, &after);

        if (rc < 0)
            return rc;
        if (c.full) {
            /* This bucket again next time, whole. */
            c.used = used;
            c.n = count;
            if (!c.used)
                return TERN_E2BIG;
            break;
        }
        *next = after;
    } while (*next && c.used < c.cap / 2);
    *n = c.n;
    return (long)c.used;
}

const struct repl_store_ops kv_repl_ops = {
    .apply = op_apply,
    .sync = op_sync,
    .position = op_position,
    .raise = op_raise,
    .wipe = op_wipe,
    .snapshot = op_snapshot,
};

/* A write's reply waits for the concern its request names. */
void kv_hold_write(struct tern_kv_service *svc, struct tern_req *req, const void *data)
{
    struct kv_key k;

    if (!svc->repl)
        return;
    memcpy(&k, data, sizeof(k));
    repl_hold(svc->repl, req, (k.flags & KV_F_W_ONE) ? REPL_W_ONE
                              : (k.flags & KV_F_W_ALL) ? REPL_W_ALL : REPL_W_MAJORITY);
}

/* A read on a replicated shard: only the primary answers (it alone knows
 * what is committed), and a value not yet on a majority waits until it is;
 * unless the client takes what any replica holds (`any`, KV_F_READ_ANY)
 * and this one is a backup whose store is whole. */
int kv_read_check(struct tern_kv_service *svc, bool any)
{
    if (!svc->repl)
        return 0;
    if (any && repl_consistent(svc->repl))
        return 0;
    return repl_writable(svc->repl);
}

int kv_reply_version(struct tern_req *req, uint64_t version)
{
    struct kv_val *v = tern_reply_alloc(req, sizeof(*v));

    if (!v)
        return TERN_EMSGSIZE;
    v->version = version;
    return 0;
}

static int h_get(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct kv_key k;
    const uint8_t *key;
    const void *val;
    uint16_t klen;
    uint32_t vlen;
    uint64_t version;
    uint8_t *out;
    int rc = parse_key(data, len, false, KV_F_READ_ANY, &key, &klen, NULL, NULL);

    if (rc < 0)
        return rc;
    if (!kv_owns(svc, key, klen))
        return TERN_EWRONGNODE;
    memcpy(&k, data, sizeof(k));
    if ((rc = kv_read_check(svc, k.flags & KV_F_READ_ANY)) < 0)
        return rc;
    rc = kvs_get(svc->store, key, klen, &val, &vlen, &version);
    /* "Not found" too must not be told before it is certain. */
    if (svc->repl)
        repl_hold_read(svc->repl, req, rc == 0 ? version : 0);
    if (rc < 0)
        return rc;
    out = tern_reply_alloc(req, sizeof(struct kv_val) + vlen);
    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, &version, sizeof(version));
    memcpy(out + sizeof(struct kv_val), val, vlen);
    return 0;
}

static int h_put(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    const uint8_t *key, *val;
    uint16_t klen;
    uint32_t vlen;
    uint64_t version, at = 0;
    struct kv_key k;
    int rc = parse_key(data, len, true, KV_F_W_ONE | KV_F_W_ALL | KV_F_DEADLINE, &key, &klen,
                       &val, &vlen);

    if (rc < 0)
        return rc;
    memcpy(&k, data, sizeof(k));
    if (k.flags & KV_F_DEADLINE) {
        if (vlen < sizeof(at))
            return TERN_EPROTO;
        memcpy(&at, val, sizeof(at));
        at = le64toh(at);
        val += sizeof(at);
        vlen -= sizeof(at);
    }
    if (!kv_owns(svc, key, klen))
        return TERN_EWRONGNODE;
    if (svc->repl && (rc = repl_writable(svc->repl)) < 0)
        return rc;
    rc = kvs_put_until(svc->store, key, klen, val, vlen, at, TERN_KV_SYNC, &version);
    if (rc == 0)
        kv_hold_write(svc, req, data);
    return rc < 0 ? rc : kv_reply_version(req, version);
}

static int h_del(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    const uint8_t *key;
    uint16_t klen;
    uint64_t version;
    int rc = parse_key(data, len, false, KV_F_W_ONE | KV_F_W_ALL, &key, &klen, NULL, NULL);

    if (rc < 0)
        return rc;
    if (!kv_owns(svc, key, klen))
        return TERN_EWRONGNODE;
    if (svc->repl && (rc = repl_writable(svc->repl)) < 0)
        return rc;
    rc = kvs_del(svc->store, key, klen, TERN_KV_SYNC, &version);
    if (rc == 0)
        kv_hold_write(svc, req, data);
    return rc < 0 ? rc : kv_reply_version(req, version);
}

/* A key's deadline, read as GET reads (a backup may answer when asked). */
static int h_expiry(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    const uint8_t *key;
    uint16_t klen;
    uint64_t at, version = 0;
    struct kv_key k;
    uint8_t *out;
    int rc = parse_key(data, len, false, KV_F_READ_ANY, &key, &klen, NULL, NULL);

    if (rc < 0)
        return rc;
    if (!kv_owns(svc, key, klen))
        return TERN_EWRONGNODE;
    memcpy(&k, data, sizeof(k));
    if ((rc = kv_read_check(svc, k.flags & KV_F_READ_ANY)) < 0)
        return rc;
    rc = kvs_expiry(svc->store, key, klen, &at);
    if (rc == 0 && svc->repl) {
        const void *v;
        uint32_t vlen;

        kvs_get(svc->store, key, klen, &v, &vlen, &version);
    }
    if (svc->repl)
        repl_hold_read(svc->repl, req, rc == 0 ? version : 0);
    if (rc < 0)
        return rc;
    out = tern_reply_alloc(req, sizeof(struct kv_val) + sizeof(at));
    if (!out)
        return TERN_EMSGSIZE;
    at = htole64(at);
    memcpy(out, &version, sizeof(version));
    memcpy(out + sizeof(struct kv_val), &at, sizeof(at));
    return 0;
}

/* Set or (0) take away a key's deadline; one already past deletes it. */
static int h_expire(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    const uint8_t *key, *val;
    uint16_t klen;
    uint32_t vlen;
    uint64_t at, version = 0;
    int rc = parse_key(data, len, true, KV_F_W_ONE | KV_F_W_ALL, &key, &klen, &val, &vlen);

    if (rc < 0)
        return rc;
    if (vlen != sizeof(at))
        return TERN_EPROTO;
    memcpy(&at, val, sizeof(at));
    at = le64toh(at);
    if (!kv_owns(svc, key, klen))
        return TERN_EWRONGNODE;
    if (svc->repl && (rc = repl_writable(svc->repl)) < 0)
        return rc;
    rc = kvs_set_expiry(svc->store, key, klen, at, TERN_KV_SYNC, &version);
    if (rc == 0 && version)
        kv_hold_write(svc, req, data);
    return rc < 0 ? rc : kv_reply_version(req, version);
}

/* The i-th key of an MGET request, walking from *off. */
static int next_key(const uint8_t *data, size_t len, size_t *off, const uint8_t **key,
                    uint16_t *klen)
{
    *key = NULL;
    *klen = 0;
    if (*off + sizeof(*klen) > len)
        return TERN_EPROTO;
    memcpy(klen, data + *off, sizeof(*klen));
    *off += sizeof(*klen);
    if (!*klen || *off + *klen > len)
        return TERN_EPROTO;
    *key = data + *off;
    *off += *klen;
    return 0;
}

/* One MGET result: a value, or TERN_ENOENT / TERN_EWRONGNODE / ... */
static int lookup(struct tern_kv_service *svc, const uint8_t *key, uint16_t klen,
                  const void **val, uint32_t *vlen, uint64_t *version)
{
    *vlen = 0;
    *version = 0;
    if (!kv_owns(svc, key, klen))
        return TERN_EWRONGNODE;
    return kvs_get(svc->store, key, klen, val, vlen, version);
}

static int h_mget(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    size_t max = tern_reply_max(req), total = sizeof(struct kv_mget_rep), off;
    struct kv_mget m;
    uint16_t n_done = 0;
    uint8_t *out;

    if (kv_read_check(svc, false) < 0)
        return TERN_ENOTPRIMARY;
    if (len < sizeof(m))
        return TERN_EPROTO;
    memcpy(&m, data, sizeof(m));
    /* First pass: check the whole request and size the reply, so that it is
     * reserved once and exactly. Results that do not fit are left for the
     * client to ask again. */
    off = sizeof(m);
    for (uint16_t i = 0; i < m.n; i++) {
        const uint8_t *key;
        const void *val;
        uint16_t klen;
        uint32_t vlen;
        uint64_t ver;

        if (next_key(data, len, &off, &key, &klen) < 0)
            return TERN_EPROTO;
        lookup(svc, key, klen, &val, &vlen, &ver);
        if (n_done == i && total + kv_item_size(0, vlen) <= max) {
            total += kv_item_size(0, vlen);
            n_done++;
        }
    }
    if (off != len)
        return TERN_EPROTO;
    if (m.n && !n_done)
        return TERN_EMSGSIZE;   /* the first value alone is too big */
    out = tern_reply_alloc(req, total);
    if (!out)
        return TERN_EMSGSIZE;
    memset(out, 0, total);
    memcpy(out, &n_done, sizeof(n_done));
    off = sizeof(m);
    total = sizeof(struct kv_mget_rep);
    for (uint16_t i = 0; i < n_done; i++) {
        struct kv_item it = {0};
        const uint8_t *key = NULL;
        const void *val = NULL;
        uint16_t klen = 0;

        next_key(data, len, &off, &key, &klen);
        it.status = lookup(svc, key, klen, &val, &it.vlen, &it.version);
        memcpy(out + total, &it, sizeof(it));
        if (it.vlen)
            memcpy(out + total + sizeof(it), val, it.vlen);
        total += kv_item_size(0, it.vlen);
    }
    /* Any value shown may be the newest write: it waits for that one. */
    if (svc->repl)
        repl_hold_read(svc->repl, req, kvs_version(svc->store));
    return 0;
}

struct scan_fill {
    uint8_t *out;
    size_t off, cap;
    uint32_t n;
    bool full;
};

static int scan_size(void *arg, const void *key, size_t klen, const void *val, uint32_t vlen,
                     uint64_t version)
{
    struct scan_fill *f = arg;
    size_t need = kv_item_size((uint32_t)klen, vlen);

    if (f->off + need > f->cap) {
        f->full = true;
        return 1;
    }
    if (f->out) {
        struct kv_item it = {.vlen = vlen, .version = version, .klen = (uint16_t)klen};

        memcpy(f->out + f->off, &it, sizeof(it));
        memcpy(f->out + f->off + sizeof(it), key, klen);
        memcpy(f->out + f->off + sizeof(it) + klen, val, vlen);
    }
    f->off += need;
    f->n++;
    return 0;
}

/* Take whole buckets from `cursor` while they fit in f->cap and fewer than
 * `max` keys were taken; returns the cursor after the last bucket taken. A
 * bucket is never split between replies, so the cursor always moves on. */
static uint64_t fill_buckets(struct kvs *store, uint64_t cursor, uint32_t max,
                             struct scan_fill *f, bool *done)
{
    *done = false;
    while (f->n < max) {
        struct scan_fill t = *f;
        uint64_t next;

        kvs_scan(store, cursor, 1, scan_size, &t, &next);
        if (t.full)
            break;
        *f = t;
        cursor = next;
        if (!cursor) {
            *done = true;
            break;
        }
    }
    return cursor;
}

static int h_scan(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct scan_fill f = {.off = sizeof(struct kv_scan_rep), .cap = tern_reply_max(req)};
    struct kv_scan_rep rep = {0};
    struct kv_scan q;
    bool done;

    if (kv_read_check(svc, false) < 0)
        return TERN_ENOTPRIMARY;
    if (len != sizeof(q))
        return TERN_EPROTO;
    memcpy(&q, data, sizeof(q));
    if (!q.max)
        return TERN_EINVAL;
    /* A dry run sizes the reply; the second pass fills it. */
    rep.next = fill_buckets(svc->store, q.cursor, q.max, &f, &done);
    if (!done && f.n == 0)
        return TERN_EMSGSIZE;   /* one bucket alone is larger than a reply */
    if (done)
        rep.next = 0;
    rep.n = f.n;
    f = (struct scan_fill){.off = sizeof(rep), .cap = f.off};
    f.out = tern_reply_alloc(req, f.cap);
    if (!f.out)
        return TERN_EMSGSIZE;
    memcpy(f.out, &rep, sizeof(rep));
    fill_buckets(svc->store, q.cursor, q.max, &f, &done);
    if (svc->repl)
        repl_hold_read(svc->repl, req, kvs_version(svc->store));
    return 0;
}

static int h_info(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct kvs_stats st;
    struct kv_info *info;

    if (len)
        return TERN_EPROTO;
    info = tern_reply_alloc(req, sizeof(*info));
    if (!info)
        return TERN_EMSGSIZE;
    kvs_get_stats(svc->store, &st);
    *info = (struct kv_info){
        .range_lo = svc->lo, .range_hi = svc->hi, .keys = st.keys,
        .pool_size = st.pool.size, .pool_live = st.pool.bytes_live,
        .key_max = KV_KEY_MAX,
        .val_max = (uint32_t)kvs_val_max(svc->store, 16),
        .pool_used = st.pool.bytes_committed, .in_place = st.in_place,
    };
    memcpy(info->uuid, st.pool.uuid, sizeof(info->uuid));
    return 0;
}

/* Clients of a replicated shard learn its members from any replica. */
static int h_members(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    char buf[REPL_PEERS_MAX * REPL_URI_MAX];
    size_t n = 0;
    void *out;

    (void)data;
    if (len)
        return TERN_EPROTO;
    if (svc->repl)
        n = repl_member_addrs(svc->repl, buf, sizeof(buf));
    if (!n)
        return 0;
    out = tern_reply_alloc(req, n);
    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, buf, n);
    return 0;
}

static const struct tern_method kv_methods[] = {
    {.id = KV_M_GET, .name = "get", .handler = h_get},
    {.id = KV_M_PUT, .name = "put", .handler = h_put},
    {.id = KV_M_DEL, .name = "del", .handler = h_del},
    {.id = KV_M_MGET, .name = "mget", .handler = h_mget},
    {.id = KV_M_SCAN, .name = "scan", .handler = h_scan},
    {.id = KV_M_INFO, .name = "info", .handler = h_info},
    {.id = KV_M_ONESIDED_INFO, .name = "os_info", .handler = kv_h_os_info},
    {.id = KV_M_LEASE, .name = "lease", .handler = kv_h_lease},
    {.id = KV_M_LPUT, .name = "lput", .handler = kv_h_lput},
    {.id = KV_M_PGET, .name = "pget", .handler = kv_h_pget},
    {.id = KV_M_MEMBERS, .name = "members", .handler = h_members},
    {.id = KV_M_EXPIRY, .name = "expiry", .handler = h_expiry},
    {.id = KV_M_EXPIRE, .name = "expire", .handler = h_expire},
};

int tern_kv_service_open(const struct tern_kv_service_opts *o, struct tern_kv_service **out)
{
    struct kvs_opts so = {0};
    struct tern_kv_service *svc;
    int rc;

    if (!o || !out || (o->range_lo > o->range_hi))
        return TERN_EINVAL;
    svc = calloc(1, sizeof(*svc));
    if (!svc)
        return TERN_ENOMEM;
    so.path = o->pool_path;
    so.pool_size = o->pool_size;
    so.seg_size = o->seg_size;
    so.append_only = o->append_only;
    so.split_flush = o->split_flush;
    rc = kvs_open(&so, &svc->store);
    if (rc < 0) {
        free(svc);
        return rc;
    }
    svc->lo = o->range_lo;
    svc->hi = (o->range_lo == 0 && o->range_hi == 0) ? UINT32_MAX : o->range_hi;
    svc->def = (struct tern_service){
        .name = "kv", .id = TERN_KV_SERVICE_ID, .methods = kv_methods,
        .n_methods = sizeof(kv_methods) / sizeof(kv_methods[0]), .ctx = svc,
        .session_closed = kv_onesided_session_closed,
    };
    *out = svc;
    return 0;
}

const struct tern_service *tern_kv_service_def(struct tern_kv_service *svc)
{
    return &svc->def;
}

struct kvs *kv_service_store(struct tern_kv_service *svc)
{
    return svc->store;
}

int tern_kv_service_tick(struct tern_kv_service *svc, unsigned max)
{
    unsigned n;
    int rc;

    if (svc->repl && repl_writable(svc->repl) < 0)
        return 0;
    n = kvs_expire(svc->store, kvs_now_ms(), max ? max : 1000);
    if (n && (rc = kvs_sync(svc->store)) < 0)
        return rc;
    return n > INT_MAX ? INT_MAX : (int)n;
}

int tern_kv_service_help(struct tern_kv_service *svc)
{
    return pm_help(kvs_pool(svc->store));
}

void tern_kv_service_close(struct tern_kv_service *svc)
{
    if (!svc)
        return;
    kv_onesided_destroy(svc);
    kvs_close(svc->store);
    free(svc);
}
