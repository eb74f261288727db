/* GET by reading the server's index window (kv_window.h): the key's block,
 * a whole bucket with the key's tag, then the record it points at, whose
 * key, version and checksum are checked; a torn read is read again. Two
 * ways to read:
 * - where the fabric maps the server's memory (tern_session_rkey_ptr),
 *   both reads are loads; the GET completes inside tern_kv_get_async, its
 *   value copied into a scratch buffer, and costs the server nothing;
 * - elsewhere, two one-sided gets into a registered staging slot, the
 *   second skipped on a hit in the client cache (validated by version).
 * A key not in the window (absent, deleted, its block full) is asked by
 * RPC. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "error.h"
#include "kv_client_internal.h"
#include "kv_hash.h"
#include "log.h"

/* ---- the cache: key -> (version, value), least recently used goes ---- */

void kv_cache_free(struct kv_cache *c)
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
    kv_cache_free(c);
    if (!entries)
        return 0;
    while (heads < entries)
        heads <<= 1;
    c->key_max = 256;
    c->ents = calloc(entries, sizeof(*c->ents));
    c->heads = calloc(heads, sizeof(*c->heads));
    c->arena = malloc((size_t)entries * (c->key_max + max_val));
    if (!c->ents || !c->heads || !c->arena) {
        kv_cache_free(c);
        return TERN_ENOMEM;
    }
    for (unsigned i = 0; i < entries; i++)
        c->ents[i].data = c->arena + (size_t)i * (c->key_max + max_val);
    c->n = entries;
    c->max_val = max_val;
    c->mask = heads - 1;
    return 0;
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

static uint64_t rec_off(const struct kv_onesided_info *info, uint64_t loc)
{
    return info->seg0 + (loc >> 32) * info->seg_size + (uint32_t)loc;
}

/* A read that will not fit a staging slot or the pool goes by RPC. */
static bool rec_readable(const struct kv_onesided_info *info, const struct kvw_bucket *b)
{
    return b->size >= sizeof(struct pm_rec) && (uint32_t)b->loc < info->seg_size &&
           b->size <= info->seg_size - (uint32_t)b->loc;
}

/* Make scratch buffer `depth` hold at least n bytes (grown once, kept). */
static bool scratch_fit(struct kv_onesided *c, unsigned depth, size_t n)
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
    struct kv_onesided *c = op->kv->os;
    struct kv_server *srv = op->srv;
    struct kv_onesided_info *info = &srv->os.info;
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
            kv_op_finish(op, 0, c->scratch[depth], ce->vlen, op->bk.version);
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
            const struct pm_rec *r = (const void *)c->scratch[depth];

            cache_put(&c->cache, op->hash, op->key, op->klen, pm_rec_val(r), r->val_len,
                      r->version);
            c->st.gets_direct++;
            c->depth++;
            status = 0;
            kv_op_finish(op, status, pm_rec_val(r), r->val_len, r->version);
            c->depth--;
        }
        return 1;
    }
    return 0;
}

static void get_read_block(struct kv_op *op);

static void on_record(void *arg, int status)
{
    struct kv_op *op = arg;
    struct kv_onesided *c = op->kv->os;
    const struct pm_rec *r;
    uint8_t *rec;

    kv_stage_retire(op, status);
    if (status < 0) {
        kv_op_by_rpc_or_end(op, KV_M_GET, status);
        return;
    }
    rec = kv_stage_mem(c, op->stage) + sizeof(struct kvw_block);
    if (!kvw_record_valid(rec, op->bk.size, op->key, op->klen, op->bk.version)) {
        c->st.torn++;
        op->tries++;
        get_read_block(op);
        return;
    }
    r = (const void *)rec;
    cache_put(&c->cache, op->hash, op->key, op->klen, pm_rec_val(r), r->val_len,
              r->version);
    c->st.gets_direct++;
    kv_op_finish(op, 0, pm_rec_val(r), r->val_len, r->version);
}

static void on_block(void *arg, int status)
{
    struct kv_op *op = arg;
    struct kv_onesided *c = op->kv->os;
    struct kv_onesided_info *info = &op->srv->os.info;
    struct kv_cache_ent *ce;
    bool torn;
    int rc;

    kv_stage_retire(op, status);
    if (status < 0 || !find_bucket(op, (const void *)kv_stage_mem(c, op->stage), &torn)) {
        if (status == 0 && torn) {
            c->st.torn++;
            op->tries++;
            get_read_block(op);
            return;
        }
        kv_op_by_rpc_or_end(op, KV_M_GET, TERN_EIO);
        return;
    }
    ce = cache_find(&c->cache, op->hash, op->key, op->klen);
    if (ce && ce->version == op->bk.version && ce->vlen <= STAGE_SLOT) {
        uint8_t *out = kv_stage_mem(c, op->stage);     /* see get_mapped */

        memcpy(out, ce->data + ce->klen, ce->vlen);
        c->st.cache_hits++;
        c->st.gets_direct++;
        kv_op_finish(op, 0, out, ce->vlen, op->bk.version);
        return;
    }
    /* A record longer than one operation of the session (an ntb ring
     * record) is not split: it comes by RPC without a doomed post. */
    if (!rec_readable(info, &op->bk) || op->bk.size > STAGE_SLOT - sizeof(struct kvw_block) ||
        op->bk.size > tern_session_rma_max(op->srv->s)) {
        kv_op_by_rpc_or_end(op, KV_M_GET, TERN_EIO);
        return;
    }
    rc = tern_session_get(op->srv->s, c->stage_mr,
                          (size_t)op->stage * STAGE_SLOT + sizeof(struct kvw_block),
                          op->bk.size, &info->pool, rec_off(info, op->bk.loc), on_record, op);
    if (rc < 0)
        kv_op_by_rpc_or_end(op, KV_M_GET, rc);
}

static void get_read_block(struct kv_op *op)
{
    struct kv_onesided *c = op->kv->os;
    struct kv_onesided_info *info = &op->srv->os.info;
    int rc = TERN_EAGAIN;

    if (op->tries < MAX_TRIES)
        rc = tern_session_get(op->srv->s, c->stage_mr, (size_t)op->stage * STAGE_SLOT,
                              sizeof(struct kvw_block), &info->window,
                              kvw_block_off(kvw_block_of(op->hash, info->n_blocks)), on_block,
                              op);
    if (rc < 0)
        kv_op_by_rpc_or_end(op, KV_M_GET, rc);
}


int kv_window_get(struct kv_op *op)
{
    if (get_mapped(op))
        return 0;
    op->tries = 0;
    op->stage = kv_stage_get(op->kv->os);
    if (op->stage < 0)
        return kv_op_by_rpc(op, KV_M_GET);
    get_read_block(op);
    return 0;
}
