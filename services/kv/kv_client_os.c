/* The client's half of the one-sided paths (see kv.h, TERN_KV_PATH_ONESIDED,
 * and kv_service_os.c for the server's half).
 *
 * GET reads the key's block of the server's index window, finds a whole
 * bucket with the key's tag, then reads the record it points at and checks
 * key, version and checksum; a torn read is read again. Two ways to read:
 * - where the fabric maps the server's memory (shm: tern_session_rkey_ptr),
 *   both reads are loads; the GET completes inside tern_kv_get_async, its
 *   value copied into a scratch buffer, and costs the server nothing;
 * - elsewhere, two one-sided gets into a registered staging slot, the
 *   second skipped on a hit in the client cache (validated by version).
 * A key not in the window (absent, deleted, its block full) is asked by RPC.
 *
 * GET by server push (KV_M_PGET) names a staging slot instead: the server
 * puts the record there straight from its pool and replies with its size;
 * the record is checked as a window read's is. One round trip, no remote
 * read: the GET for links where writes are cheap and reads are not.
 *
 * PUT writes a record (header with an intent id in the version field, key,
 * value) at the next free offset of the segment the server leased to this
 * client, through the mapping or by one-sided put from a staging slot, and
 * sends KV_M_LPUT with the offset and the intent id. The put and the call
 * go on the same session, which delivers them in order: no wait in between.
 * The server checks the intent id, so a stale record left at that offset by
 * an earlier life of the segment is never taken for this one. Without a
 * lease (first use, segment full, lease taken back) the PUT goes by RPC
 * while a new lease is asked for in the background. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "error.h"
#include "kv_client_internal.h"
#include "kv_store.h"
#include "log.h"

#define STAGE_SLOTS 32u                      /* one-sided ops with a staging slot */
#define STAGE_SLOT (64u * 1024 + 256)        /* a block and a record up to ~64 KiB */
#define MAX_TRIES 16u                        /* torn reads before asking by RPC */
#define MAX_DEPTH 4u                         /* nested inline GETs with their own scratch */
/* TERN_KV_PATH_AUTO sends smaller values inline in an RPC: below this, the
 * record's trip through the pool's cache lines costs more than the server's
 * copy it saves (Chequer puts its threshold between 512 B and 2 KiB). */
#define AUTO_PUT_MIN 1024u

struct kv_stage {
    struct kv_os_client *c;
    uint32_t idx;
};

struct kv_cache_ent {
    uint64_t hash, version;
    uint32_t vlen;
    uint16_t klen;
    uint32_t next;                           /* hash chain, index + 1 */
    uint32_t prev_lru, next_lru;             /* index + 1 */
    uint8_t *data;                           /* key, then value */
};

struct kv_cache {
    unsigned n;                              /* 0: off */
    size_t max_val, key_max;
    struct kv_cache_ent *ents;
    uint32_t *heads, mask;
    uint32_t lru_head, lru_tail;             /* most / least recently used */
    uint32_t used;
    uint8_t *arena;
};

struct kv_os_client {
    struct tern_kv *kv;
    struct tern_rpc_mr *stage_mr;
    uint32_t stage_free;                     /* bit i: slot i is free */
    struct kv_stage stages[STAGE_SLOTS];
    uint8_t *scratch[MAX_DEPTH];
    size_t scratch_len[MAX_DEPTH];
    unsigned depth;
    uint64_t intent;                         /* next intent id (top bit set) */
    struct kv_cache cache;
    struct tern_kv_os_stats st;
};

/* ---- the cache: key -> (version, value), least recently used goes ---- */

static void cache_free(struct kv_cache *c)
{
    free(c->ents);
    free(c->heads);
    free(c->arena);
    memset(c, 0, sizeof(*c));
}

static struct kv_cache_ent *cache_find(struct kv_cache *c, uint64_t h, const void *key,
                                       uint16_t klen)
{
    if (!c->n)
        return NULL;
    for (uint32_t i = c->heads[h & c->mask]; i; i = c->ents[i - 1].next) {
        struct kv_cache_ent *e = &c->ents[i - 1];

        if (e->hash == h && e->klen == klen && memcmp(e->data, key, klen) == 0)
            return e;
    }
    return NULL;
}

static void lru_unlink(struct kv_cache *c, struct kv_cache_ent *e)
{
    uint32_t i = (uint32_t)(e - c->ents) + 1;

    if (e->prev_lru)
        c->ents[e->prev_lru - 1].next_lru = e->next_lru;
    else if (c->lru_head == i)
        c->lru_head = e->next_lru;
    if (e->next_lru)
        c->ents[e->next_lru - 1].prev_lru = e->prev_lru;
    else if (c->lru_tail == i)
        c->lru_tail = e->prev_lru;
    e->prev_lru = e->next_lru = 0;
}

static void lru_front(struct kv_cache *c, struct kv_cache_ent *e)
{
    uint32_t i = (uint32_t)(e - c->ents) + 1;

    lru_unlink(c, e);
    e->next_lru = c->lru_head;
    if (c->lru_head)
        c->ents[c->lru_head - 1].prev_lru = i;
    c->lru_head = i;
    if (!c->lru_tail)
        c->lru_tail = i;
}

static void chain_unlink(struct kv_cache *c, struct kv_cache_ent *e)
{
    uint32_t i = (uint32_t)(e - c->ents) + 1, *link = &c->heads[e->hash & c->mask];

    while (*link && *link != i)
        link = &c->ents[*link - 1].next;
    if (*link)
        *link = e->next;
}

static void cache_put(struct kv_cache *c, uint64_t h, const void *key, uint16_t klen,
                      const void *val, uint32_t vlen, uint64_t version)
{
    struct kv_cache_ent *e;

    if (!c->n || vlen > c->max_val || klen > c->key_max)
        return;
    e = cache_find(c, h, key, klen);
    if (!e) {
        if (c->used < c->n) {
            e = &c->ents[c->used++];
        } else {
            e = &c->ents[c->lru_tail - 1];  /* the least recently used goes */
            chain_unlink(c, e);
            lru_unlink(c, e);
        }
        e->hash = h;
        e->klen = klen;
        e->next = c->heads[h & c->mask];
        c->heads[h & c->mask] = (uint32_t)(e - c->ents) + 1;
        memcpy(e->data, key, klen);
    }
    e->version = version;
    e->vlen = vlen;
    memcpy(e->data + klen, val, vlen);
    lru_front(c, e);
}

int tern_kv_set_cache(struct tern_kv *kv, unsigned entries, size_t max_val)
{
    struct kv_cache *c;
    uint32_t heads = 1;

    if (!kv || !kv->os || (entries && !max_val) || entries > (1u << 24))
        return kv && !kv->os ? TERN_ENOTSUP : TERN_EINVAL;
    c = &kv->os->cache;
    cache_free(c);
    if (!entries)
        return 0;
    while (heads < entries)
        heads <<= 1;
    c->key_max = 256;
    c->ents = calloc(entries, sizeof(*c->ents));
    c->heads = calloc(heads, sizeof(*c->heads));
    c->arena = malloc((size_t)entries * (c->key_max + max_val));
    if (!c->ents || !c->heads || !c->arena) {
        cache_free(c);
        return TERN_ENOMEM;
    }
    for (unsigned i = 0; i < entries; i++)
        c->ents[i].data = c->arena + (size_t)i * (c->key_max + max_val);
    c->n = entries;
    c->max_val = max_val;
    c->mask = heads - 1;
    return 0;
}

/* ---- servers' one-sided state ---- */

static void os_info_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_server *srv = arg;

    if (status == 0 && len == sizeof(srv->os.info)) {
        memcpy(&srv->os.info, reply, len);
        if (srv->os.info.n_blocks && !(srv->os.info.n_blocks & (srv->os.info.n_blocks - 1)) &&
            srv->os.info.seg_size &&
            tern_rpc_mr_rkey(srv->kv->os->stage_mr, srv->s, &srv->os.stage_rkey) == 0) {
            srv->os.offload = (tern_session_caps(srv->s) & TERN_TP_CAP_RMA_OFFLOAD) != 0;
            srv->os.state = OS_READY;
            return;
        }
    }
    /* A server without the one-sided paths (or one that failed to say) is
     * used by RPC; asked again after a failover. */
    srv->os.state = OS_OFF;
}

/* Is the server's one-sided state current? If the session moved to another
 * fabric its keys are stale: ask again (in the background) and use RPC. */
static bool srv_known(struct tern_kv *kv, struct kv_server *srv)
{
    uint32_t epoch = tern_session_epoch(srv->s);

    if (srv->os.epoch != epoch && srv->os.state != OS_ASKING) {
        srv->os = (struct kv_os_srv){.state = OS_UNKNOWN, .epoch = epoch};
    }
    if (srv->os.state == OS_UNKNOWN) {
        srv->os.state = OS_ASKING;
        if (tern_call(srv->s, TERN_KV_SERVICE_ID, KV_M_OS_INFO, NULL, 0, kv->timeout,
                      os_info_done, srv, NULL) < 0)
            srv->os.state = OS_UNKNOWN;
    }
    return srv->os.state == OS_READY;
}

enum way { BY_RPC, BY_WINDOW, BY_PUSH, BY_LEASE };

/* How a GET goes to this server. TERN_KV_PATH_AUTO reads the window where
 * reads cost the server nothing (shm: loads; rdma: the NIC) and stays RPC
 * elsewhere. On ntb a window read is a served round trip each (two per
 * GET), and a push is a ring record the client's CPU copies out, plus a
 * checksum: measured, both lose to an RPC reply (docs/KV.md). On tcp every
 * one-sided operation is a served message. */
static enum way get_way(struct tern_kv *kv, struct kv_server *srv)
{
    if (!srv_known(kv, srv))
        return BY_RPC;
    switch (kv->path) {
    case TERN_KV_PATH_ONESIDED:
        return BY_WINDOW;
    case TERN_KV_PATH_PUSH:
        return BY_PUSH;
    case TERN_KV_PATH_AUTO:
        return srv->os.offload ? BY_WINDOW : BY_RPC;
    default:
        return BY_RPC;
    }
}

/* How a PUT of `len` bytes goes. TERN_KV_PATH_AUTO leases where the write
 * costs the server nothing (shm, rdma), for values of AUTO_PUT_MIN and
 * more. */
static enum way put_way(struct tern_kv *kv, struct kv_server *srv, size_t len)
{
    if (len > UINT32_MAX - 4096 || !srv_known(kv, srv))
        return BY_RPC;
    if (kv->path == TERN_KV_PATH_ONESIDED || kv->path == TERN_KV_PATH_PUSH)
        return BY_LEASE;
    if (kv->path == TERN_KV_PATH_AUTO && len >= AUTO_PUT_MIN &&
        srv->os.offload)
        return BY_LEASE;
    return BY_RPC;
}

static void lease_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_server *srv = arg;
    struct kv_lease l;

    srv->os.leasing = false;
    if (status < 0 || len != sizeof(l))
        return;
    memcpy(&l, reply, sizeof(l));
    if (l.next >= l.end || l.end > srv->os.info.seg_size || l.base > l.next)
        return;
    srv->os.lease = l;
    srv->os.next = l.next;
    srv->os.leased = true;
    srv->os.populated = false;
    srv->kv->os->st.leases++;
}

/* Ask for a (new) lease in the background; the old one, if any, is handed
 * back by the server when it grants the new one. */
static void lease_ask(struct tern_kv *kv, struct kv_server *srv)
{
    if (srv->os.leasing)
        return;
    srv->os.leased = false;
    srv->os.lreq = (struct kv_lease_req){0};
    if (tern_call(srv->s, TERN_KV_SERVICE_ID, KV_M_LEASE, &srv->os.lreq, sizeof(srv->os.lreq),
                  kv->timeout, lease_done, srv, NULL) == 0)
        srv->os.leasing = true;
}

/* ---- staging slots (fabrics without a mapping) ---- */

static int stage_get(struct kv_os_client *c)
{
    int i;

    if (!c->stage_free)
        return -1;
    i = __builtin_ctz(c->stage_free);
    c->stage_free &= ~(1u << i);
    return i;
}

static void stage_put(struct kv_os_client *c, int i)
{
    if (i >= 0)
        c->stage_free |= 1u << i;
}

static uint8_t *stage_mem(struct kv_os_client *c, int i)
{
    return (uint8_t *)tern_rpc_mr_addr(c->stage_mr) + (size_t)i * STAGE_SLOT;
}

/* ---- GET ---- */

static void op_finish(struct kv_op *op, int status, const void *val, size_t len,
                      uint64_t version)
{
    struct tern_kv *kv = op->kv;
    tern_kv_cb cb = op->cb;
    void *arg = op->arg;
    int stage = op->stage;

    /* The op's slot goes back first, so the callback may start the next
     * call; the staging slot only after it, as `val` may lie in it. */
    kv_op_put(kv, op);
    if (cb)
        cb(arg, status, val, len, version);
    stage_put(kv->os, stage);
}

/* Hand the op over to the RPC path. */
static int op_by_rpc(struct kv_op *op, uint16_t method)
{
    stage_put(op->kv->os, op->stage);
    op->stage = -1;
    if (method == KV_M_GET)
        op->kv->os->st.gets_rpc++;
    return kv_op_call(op, method, op->key, op->klen, op->val, op->vlen);
}

/* From a completion: hand the op over to the RPC path or, if the call
 * cannot be sent (kv_op_call has freed the op then), end it with `status`. */
static void op_by_rpc_or_end(struct kv_op *op, uint16_t method, int status)
{
    tern_kv_cb cb = op->cb;
    void *arg = op->arg;

    if (op_by_rpc(op, method) < 0 && cb)
        cb(arg, status, NULL, 0, 0);
}

/* The op's bucket in a copy of its block, if a whole one has its tag.
 * *torn is set when a bucket with the tag was caught mid-write. */
static bool find_bucket(struct kv_op *op, const struct kvw_block *blk, bool *torn)
{
    uint32_t tag = kvw_tag(op->hash);

    *torn = false;
    for (unsigned i = 0; i < KVW_BUCKETS; i++) {
        const struct kvw_bucket *b = &blk->b[i];

        if (b->tag != tag && !(b->seq & 1u))
            continue;
        if (!kvw_bucket_whole(b)) {
            *torn = true;
            continue;
        }
        if (b->tag == tag) {
            op->bk = *b;
            return true;
        }
    }
    return false;
}

static uint64_t rec_off(const struct kv_os_info *info, uint64_t loc)
{
    return info->seg0 + (loc >> 32) * info->seg_size + (uint32_t)loc;
}

/* A read that will not fit a staging slot or the pool goes by RPC. */
static bool rec_readable(const struct kv_os_info *info, const struct kvw_bucket *b)
{
    return b->size >= sizeof(struct tern_pm_rec) && (uint32_t)b->loc < info->seg_size &&
           b->size <= info->seg_size - (uint32_t)b->loc;
}

/* Make scratch buffer `depth` hold at least n bytes (grown once, kept). */
static bool scratch_fit(struct kv_os_client *c, unsigned depth, size_t n)
{
    uint8_t *p;

    if (c->scratch_len[depth] >= n)
        return true;
    p = realloc(c->scratch[depth], n);
    if (!p)
        return false;
    c->scratch[depth] = p;
    c->scratch_len[depth] = n;
    return true;
}

/* GET through the mapping: both reads are loads. Returns 1 when the op is
 * done, 0 to go by RPC. */
static int get_mapped(struct kv_op *op)
{
    struct kv_os_client *c = op->kv->os;
    struct kv_server *srv = op->srv;
    struct kv_os_info *info = &srv->os.info;
    uint64_t boff = kvw_block_off(kvw_block_of(op->hash, info->n_blocks));
    unsigned depth = c->depth;

    if (depth >= MAX_DEPTH)
        return 0;
    for (; op->tries < MAX_TRIES; op->tries++) {
        struct kvw_block blk;
        struct kv_cache_ent *ce;
        void *p;
        bool torn;
        int status;

        if (tern_session_rkey_ptr(srv->s, &info->window, boff, sizeof(blk),
                                  TERN_TP_ACCESS_REMOTE_READ, &p) < 0)
            return 0;
        memcpy(&blk, p, sizeof(blk));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (!find_bucket(op, &blk, &torn)) {
            if (torn) {
                c->st.torn++;
                continue;
            }
            return 0;       /* not in the window: the server knows */
        }
        if (!scratch_fit(c, depth, op->bk.size))
            return 0;
        /* A hit is copied out too: a call the callback makes may reuse the
         * cache entry while the caller still reads `val`. */
        ce = cache_find(&c->cache, op->hash, op->key, op->klen);
        if (ce && ce->version == op->bk.version) {
            memcpy(c->scratch[depth], ce->data + ce->klen, ce->vlen);
            c->st.cache_hits++;
            c->st.gets_direct++;
            c->depth++;
            op_finish(op, 0, c->scratch[depth], ce->vlen, op->bk.version);
            c->depth--;
            return 1;
        }
        if (!rec_readable(info, &op->bk) ||
            tern_session_rkey_ptr(srv->s, &info->pool, rec_off(info, op->bk.loc), op->bk.size,
                                  TERN_TP_ACCESS_REMOTE_READ, &p) < 0)
            return 0;
        memcpy(c->scratch[depth], p, op->bk.size);
        if (!kvw_record_valid(c->scratch[depth], op->bk.size, op->key, op->klen,
                              op->bk.version)) {
            c->st.torn++;
            continue;       /* moved, rewritten or freed since: read again */
        }
        {
            const struct tern_pm_rec *r = (const void *)c->scratch[depth];

            cache_put(&c->cache, op->hash, op->key, op->klen, tern_pm_rec_val(r), r->val_len,
                      r->version);
            c->st.gets_direct++;
            c->depth++;
            status = 0;
            op_finish(op, status, tern_pm_rec_val(r), r->val_len, r->version);
            c->depth--;
        }
        return 1;
    }
    return 0;
}

static void get_read_block(struct kv_op *op);

/* A one-sided operation that timed out may still land in its staging slot
 * (rpc.h): the slot is never used again. */
static void stage_retire(struct kv_op *op, int status)
{
    if (status == TERN_ETIMEDOUT && op->stage >= 0) {
        op->stage = -1;
        op->kv->os->st.stage_lost++;
    }
}

static void on_record(void *arg, int status)
{
    struct kv_op *op = arg;
    struct kv_os_client *c = op->kv->os;
    const struct tern_pm_rec *r;
    uint8_t *rec;

    stage_retire(op, status);
    if (status < 0) {
        op_by_rpc_or_end(op, KV_M_GET, status);
        return;
    }
    rec = stage_mem(c, op->stage) + sizeof(struct kvw_block);
    if (!kvw_record_valid(rec, op->bk.size, op->key, op->klen, op->bk.version)) {
        c->st.torn++;
        op->tries++;
        get_read_block(op);
        return;
    }
    r = (const void *)rec;
    cache_put(&c->cache, op->hash, op->key, op->klen, tern_pm_rec_val(r), r->val_len,
              r->version);
    c->st.gets_direct++;
    op_finish(op, 0, tern_pm_rec_val(r), r->val_len, r->version);
}

static void on_block(void *arg, int status)
{
    struct kv_op *op = arg;
    struct kv_os_client *c = op->kv->os;
    struct kv_os_info *info = &op->srv->os.info;
    struct kv_cache_ent *ce;
    bool torn;
    int rc;

    stage_retire(op, status);
    if (status < 0 || !find_bucket(op, (const void *)stage_mem(c, op->stage), &torn)) {
        if (status == 0 && torn) {
            c->st.torn++;
            op->tries++;
            get_read_block(op);
            return;
        }
        op_by_rpc_or_end(op, KV_M_GET, TERN_EIO);
        return;
    }
    ce = cache_find(&c->cache, op->hash, op->key, op->klen);
    if (ce && ce->version == op->bk.version && ce->vlen <= STAGE_SLOT) {
        uint8_t *out = stage_mem(c, op->stage);     /* see get_mapped */

        memcpy(out, ce->data + ce->klen, ce->vlen);
        c->st.cache_hits++;
        c->st.gets_direct++;
        op_finish(op, 0, out, ce->vlen, op->bk.version);
        return;
    }
    if (!rec_readable(info, &op->bk) || op->bk.size > STAGE_SLOT - sizeof(struct kvw_block)) {
        op_by_rpc_or_end(op, KV_M_GET, TERN_EIO);
        return;
    }
    rc = tern_session_get(op->srv->s, c->stage_mr,
                          (size_t)op->stage * STAGE_SLOT + sizeof(struct kvw_block),
                          op->bk.size, &info->pool, rec_off(info, op->bk.loc), on_record, op);
    if (rc < 0)
        op_by_rpc_or_end(op, KV_M_GET, rc);
}

static void get_read_block(struct kv_op *op)
{
    struct kv_os_client *c = op->kv->os;
    struct kv_os_info *info = &op->srv->os.info;
    int rc = TERN_EAGAIN;

    if (op->tries < MAX_TRIES)
        rc = tern_session_get(op->srv->s, c->stage_mr, (size_t)op->stage * STAGE_SLOT,
                              sizeof(struct kvw_block), &info->window,
                              kvw_block_off(kvw_block_of(op->hash, info->n_blocks)), on_block,
                              op);
    if (rc < 0)
        op_by_rpc_or_end(op, KV_M_GET, rc);
}

/* ---- GET by server push ---- */

static int pget_send(struct kv_op *op);

static void pget_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_op *op = arg;
    struct kv_os_client *c = op->kv->os;
    const struct tern_pm_rec *r;
    struct kv_pget_rep rep;
    const uint8_t *rec;

    stage_retire(op, status);      /* the server may still push into it */
    if (status == 0 && len < sizeof(rep))
        status = TERN_EPROTO;
    if (status < 0) {
        op_finish(op, status, NULL, 0, 0);
        return;
    }
    memcpy(&rep, reply, sizeof(rep));
    if (!rep.size) {
        /* Sent inline: too big for a slot, or the server could not push. */
        if (len != sizeof(rep) + (uint64_t)rep.vlen) {
            op_finish(op, TERN_EPROTO, NULL, 0, 0);
            return;
        }
        c->st.gets_rpc++;
        op_finish(op, 0, (const uint8_t *)reply + sizeof(rep), rep.vlen, rep.version);
        return;
    }
    /* The reply came after the data (one session keeps the order), but a
     * server is not trusted with the bytes: key, version and sum decide. */
    rec = stage_mem(c, op->stage);
    if (rep.size > STAGE_SLOT || !kvw_record_valid(rec, rep.size, op->key, op->klen, rep.version)) {
        c->st.torn++;
        if (++op->tries < MAX_TRIES && pget_send(op) == 0)
            return;
        op_by_rpc_or_end(op, KV_M_GET, TERN_EIO);
        return;
    }
    r = (const void *)rec;
    c->st.gets_pushed++;
    op_finish(op, 0, tern_pm_rec_val(r), r->val_len, r->version);
}

/* Ask for the op's key to be pushed into its staging slot. */
static int pget_send(struct kv_op *op)
{
    struct kv_server *srv = op->srv;
    struct iovec iov[2];
    int rc;

    op->pget = (struct kv_pget){.klen = op->klen, .cap = STAGE_SLOT,
                                .off = (uint64_t)op->stage * STAGE_SLOT,
                                .dst = srv->os.stage_rkey};
    iov[0] = (struct iovec){.iov_base = &op->pget, .iov_len = sizeof(op->pget)};
    iov[1] = (struct iovec){.iov_base = (void *)op->key, .iov_len = op->klen};
    rc = tern_callv(srv->s, TERN_KV_SERVICE_ID, KV_M_PGET, iov, 2, op->kv->timeout, pget_done,
                    op, NULL);
    return rc;
}

int kv_os_get(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb, void *arg)
{
    struct kv_op *op = kv_op_get(kv);

    if (!op)
        return TERN_ENOBUFS;
    *op = (struct kv_op){.kv = kv, .cb = cb, .arg = arg, .key = key, .klen = (uint16_t)klen,
                         .stage = -1, .hash = tern_kv_hash(key, klen)};
    op->srv = kv_route(kv, key, klen);
    switch (get_way(kv, op->srv)) {
    case BY_WINDOW:
        break;
    case BY_PUSH:
        op->stage = stage_get(kv->os);
        if (op->stage < 0 || pget_send(op) < 0)
            return op_by_rpc(op, KV_M_GET);
        return 0;
    default:
        return op_by_rpc(op, KV_M_GET);
    }
    if (get_mapped(op))
        return 0;
    op->tries = 0;
    op->stage = stage_get(kv->os);
    if (op->stage < 0)
        return op_by_rpc(op, KV_M_GET);
    get_read_block(op);
    return 0;
}

/* ---- PUT ---- */

static void lput_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_op *op = arg;
    struct kv_server *srv = op->srv;
    uint64_t version = 0;

    if (status == TERN_ENOLEASE || status == TERN_EINVAL || status == TERN_EPROTO) {
        /* The lease is gone or out of step (a refused record): lease again,
         * and store this value by RPC meanwhile. */
        if (srv->os.leased && srv->os.lease.seg == op->lput.seg)
            lease_ask(op->kv, srv);
        op_by_rpc_or_end(op, KV_M_PUT, status);
        return;
    }
    if (status == 0 && len != sizeof(struct kv_val))
        status = TERN_EPROTO;
    if (status == 0) {
        memcpy(&version, reply, sizeof(version));
        op->kv->os->st.puts++;      /* counted once stored: fallbacks are RPC's */
    }
    op_finish(op, status, NULL, 0, version);
}

static void stage_put_done(void *arg, int status)
{
    struct kv_stage *st = arg;

    /* A failed put leaves the intent id unwritten: LPUT is refused. One
     * that timed out may still read the slot: it is never used again. */
    if (status == TERN_ETIMEDOUT)
        st->c->st.stage_lost++;
    else
        stage_put(st->c, (int)st->idx);
}

/* Map a new lease's pages in at once (shm), one system call per lease
 * instead of a page fault per 4 KiB of records. */
static void lease_populate(struct kv_server *srv)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo, hi;
    void *p;

    srv->os.populated = true;
    if (tern_session_rkey_ptr(srv->s, &srv->os.lease.rkey, srv->os.next - srv->os.lease.base,
                              srv->os.lease.end - srv->os.next, TERN_TP_ACCESS_REMOTE_WRITE,
                              &p) < 0)
        return;
    lo = ((uintptr_t)p + page - 1) & ~(page - 1);
    hi = ((uintptr_t)p + (srv->os.lease.end - srv->os.next)) & ~(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);  /* a hint: errors are fine */
}

/* Lay a record out at `dst` for the server to take: a whole record with
 * the intent id in place of the version, summed here (the server swaps the
 * version in without reading the value). */
static void write_record(uint8_t *dst, const struct kv_op *op, uint64_t intent)
{
    struct tern_pm_rec h = {.val_len = op->vlen, .version = intent, .key_len = op->klen,
                            .type = TERN_PM_VALUE};
    uint32_t size = tern_pm_rec_size(op->klen, op->vlen);
    size_t used = sizeof(h) + op->klen + op->vlen;

    memcpy(dst, &h, sizeof(h));
    memcpy(dst + sizeof(h), op->key, op->klen);
    if (op->vlen)
        memcpy(dst + sizeof(h) + op->klen, op->val, op->vlen);
    memset(dst + used, 0, size - used);
    h.sum = tern_pm_rec_sum_of((const struct tern_pm_rec *)dst);
    memcpy(dst, &h.sum, sizeof(h.sum));
}

int kv_os_put(struct tern_kv *kv, const void *key, size_t klen, const void *val, size_t len,
              tern_kv_cb cb, void *arg)
{
    struct kv_os_client *c = kv->os;
    struct kv_op *op = kv_op_get(kv);
    struct kv_server *srv;
    uint32_t size;
    struct iovec iov;
    void *p;
    int rc;

    if (!op)
        return TERN_ENOBUFS;
    *op = (struct kv_op){.kv = kv, .cb = cb, .arg = arg, .key = key, .klen = (uint16_t)klen,
                         .val = val, .vlen = (uint32_t)len, .stage = -1};
    srv = op->srv = kv_route(kv, key, klen);
    if (put_way(kv, srv, len) != BY_LEASE)
        return op_by_rpc(op, KV_M_PUT);
    size = tern_pm_rec_size(op->klen, op->vlen);
    if (!srv->os.leased || size > srv->os.lease.end - srv->os.next) {
        lease_ask(kv, srv);
        return op_by_rpc(op, KV_M_PUT);
    }
    op->lput = (struct kv_lput){.seg = srv->os.lease.seg, .off = srv->os.next,
                                .intent = c->intent++};
    rc = tern_session_rkey_ptr(srv->s, &srv->os.lease.rkey, srv->os.next - srv->os.lease.base,
                               size, TERN_TP_ACCESS_REMOTE_WRITE, &p);
    if (rc == 0) {
        if (!srv->os.populated)
            lease_populate(srv);
        write_record(p, op, op->lput.intent);
    } else if (rc == TERN_ENOTSUP && size <= STAGE_SLOT && (op->stage = stage_get(c)) >= 0) {
        write_record(stage_mem(c, op->stage), op, op->lput.intent);
        rc = tern_session_put(srv->s, c->stage_mr, (size_t)op->stage * STAGE_SLOT, size,
                              &srv->os.lease.rkey, srv->os.next - srv->os.lease.base,
                              stage_put_done,
                              &c->stages[op->stage]);
        if (rc < 0)
            return op_by_rpc(op, KV_M_PUT);
        op->stage = -1;     /* the put's completion gives the slot back */
    } else {
        if (rc == TERN_EREMACCESS)
            lease_ask(kv, srv);     /* the lease was taken back */
        return op_by_rpc(op, KV_M_PUT);
    }
    iov = (struct iovec){.iov_base = &op->lput, .iov_len = sizeof(op->lput)};
    rc = tern_callv(srv->s, TERN_KV_SERVICE_ID, KV_M_LPUT, &iov, 1, kv->timeout, lput_done, op,
                    NULL);
    if (rc < 0) {
        /* Not sent: the next record goes where this one was. */
        kv_op_put(kv, op);
        return rc;
    }
    srv->os.next += size;
    return 0;
}

/* ---- choosing the path ---- */

int tern_kv_set_path(struct tern_kv *kv, enum tern_kv_path path)
{
    struct kv_os_client *c;
    int rc;

    if (!kv || (path != TERN_KV_PATH_RPC && path != TERN_KV_PATH_ONESIDED &&
                path != TERN_KV_PATH_AUTO && path != TERN_KV_PATH_PUSH))
        return TERN_EINVAL;
    kv->path = path;
    if (path == TERN_KV_PATH_RPC || kv->os)
        return 0;
    c = calloc(1, sizeof(*c));
    if (!c)
        return TERN_ENOMEM;
    c->kv = kv;
    /* Servers push GETs' records into the slots: remote write. */
    rc = tern_rpc_mr_alloc(kv->ep, (size_t)STAGE_SLOTS * STAGE_SLOT,
                           TERN_TP_ACCESS_LOCAL | TERN_TP_ACCESS_REMOTE_WRITE, &c->stage_mr);
    if (rc < 0) {
        free(c);
        kv->path = TERN_KV_PATH_RPC;
        return rc;
    }
    c->stage_free = STAGE_SLOTS == 32 ? UINT32_MAX : (1u << STAGE_SLOTS) - 1;
    for (uint32_t i = 0; i < STAGE_SLOTS; i++)
        c->stages[i] = (struct kv_stage){.c = c, .idx = i};
    if (getrandom(&c->intent, sizeof(c->intent), 0) != sizeof(c->intent))
        c->intent = (uint64_t)(uintptr_t)c;
    c->intent |= 1ull << 63;    /* never a version the server hands out */
    kv->os = c;
    /* Learn every server's keys now, so the first calls can use them. */
    for (unsigned i = 0; i < kv->n; i++) {
        kv->srv[i].kv = kv;
        srv_known(kv, &kv->srv[i]);
    }
    while (tern_rpc_calls_in_flight(kv->ep)) {
        rc = tern_rpc_poll(kv->ep);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void tern_kv_get_os_stats(const struct tern_kv *kv, struct tern_kv_os_stats *st)
{
    if (kv && kv->os)
        *st = kv->os->st;
    else
        *st = (struct tern_kv_os_stats){0};
}

void kv_os_free(struct tern_kv *kv)
{
    struct kv_os_client *c = kv->os;

    if (!c)
        return;
    cache_free(&c->cache);
    for (unsigned i = 0; i < MAX_DEPTH; i++)
        free(c->scratch[i]);
    tern_rpc_mr_dereg(c->stage_mr);
    free(c);
    kv->os = NULL;
}
