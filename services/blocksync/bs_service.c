/* The block-sync service's handlers (bs_service.h). */
#include "bs_service.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "bs_feed.h"
#include "error.h"
#include "log.h"

struct peer_ent {
    struct tern_session *s;
    uint64_t node;
};

struct bs_service {
    struct tern_service def;
    struct bs_store *st;
    struct bs_service_opts o;
    struct tern_rpc_mr *mr;          /* the store's mapping, for puts */
    struct peer_ent *peers;          /* sessions that said hello */
    size_t n_peers, cap_peers;
    struct bs_service_stats stats;
    struct bs_hasher *hs;            /* checks producers' blocks */
    struct bs_feed *feed;
    bool syncing;
};

static const char *const fault_names[] = {
    [BS_FAULT_NONE] = "none", [BS_FAULT_STALL] = "stall", [BS_FAULT_MERKLE] = "merkle",
    [BS_FAULT_TRUNCATE] = "truncate", [BS_FAULT_ORDER] = "order", [BS_FAULT_PARENT] = "parent",
};

int bs_fault_parse(const char *s, enum bs_fault *out)
{
    for (unsigned i = 0; i < sizeof(fault_names) / sizeof(fault_names[0]); i++)
        if (!strcmp(s, fault_names[i])) {
            *out = (enum bs_fault)i;
            return 0;
        }
    return TERN_EINVAL;
}

void bs_service_hello(const struct bs_service *svc, struct bs_hello *out)
{
    bs_hello_of(svc->st, svc->o.node, out);
}

uint64_t bs_service_node(const struct bs_service *svc)
{
    return svc->o.node;
}

void bs_hello_of(const struct bs_store *st, uint64_t node, struct bs_hello *out)
{
    struct bs_store_info info;

    *out = (struct bs_hello){.version = BS_WIRE_VERSION, .node = node};
    bs_store_info(st, &info);
    out->chain = info.chain;
    out->head = info.committed;
    out->lib = info.irreversible;
    if (out->head) {
        bs_store_id(st, out->head - 1, out->head_id);
        bs_store_id(st, 0, out->genesis);
    }
    if (out->lib)
        bs_store_id(st, out->lib - 1, out->lib_id);
}

unsigned bs_hello_judge(const struct bs_store *st, const struct bs_hello *self,
                        const struct bs_hello *peer, bool (*connected)(uint64_t, void *),
                        void *arg)
{
    static const uint8_t zero[BS_ID_LEN];
    uint8_t id[BS_ID_LEN];

    if (peer->version != BS_WIRE_VERSION)
        return BS_R_VERSION;
    if (peer->chain != self->chain)
        return BS_R_CHAIN;
    if (peer->node == self->node)
        return BS_R_SELF;
    if (peer->lib > peer->head || (!peer->head && (memcmp(peer->head_id, zero, BS_ID_LEN) ||
                                                  memcmp(peer->genesis, zero, BS_ID_LEN))))
        return BS_R_INVALID;
    if (peer->head && self->head && memcmp(peer->genesis, self->genesis, BS_ID_LEN))
        return BS_R_UNLINKABLE;
    /* An irreversible block of one side that the other holds otherwise. */
    if (peer->lib && peer->lib <= self->head && bs_store_id(st, peer->lib - 1, id) == 0 &&
        memcmp(id, peer->lib_id, BS_ID_LEN))
        return BS_R_FORKED;
    if (self->lib && self->lib == peer->head && memcmp(self->lib_id, peer->head_id, BS_ID_LEN))
        return BS_R_FORKED;
    if (connected && connected(peer->node, arg))
        return BS_R_DUPLICATE;
    return BS_OK;
}

/* ---- peers that said hello ---- */

static struct peer_ent *peer_of(struct bs_service *svc, const struct tern_session *s)
{
    for (size_t i = 0; i < svc->n_peers; i++)
        if (svc->peers[i].s == s)
            return &svc->peers[i];
    return NULL;
}

static bool node_connected(uint64_t node, void *arg)
{
    struct bs_service *svc = arg;

    for (size_t i = 0; i < svc->n_peers; i++)
        if (svc->peers[i].node == node)
            return true;
    return false;
}

static void session_closed(struct tern_session *s, void *ctx)
{
    struct bs_service *svc = ctx;
    struct peer_ent *p = peer_of(svc, s);

    if (p)
        *p = svc->peers[--svc->n_peers];
    bs_feed_session_closed(svc->feed, s);
}

/* ---- handlers ---- */

static int on_hello(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct bs_service *svc = ctx;
    struct tern_session *s = tern_req_session(req);
    struct peer_ent *p = peer_of(svc, s);
    struct bs_hello_rep *rep;
    struct bs_hello peer;
    const char *why;

    if (bs_hello_decode(data, len, &peer, &why) < 0)
        return TERN_EPROTO;
    svc->stats.hellos++;
    rep = tern_reply_alloc(req, sizeof(*rep));
    if (!rep)
        return TERN_EMSGSIZE;
    memset(rep, 0, sizeof(*rep));
    bs_service_hello(svc, &rep->hello);
    if (p)                           /* a second hello on one session */
        p->node = 0;
    rep->refusal = bs_hello_judge(svc->st, &rep->hello, &peer, node_connected, svc);
    if (rep->refusal != BS_OK) {
        svc->stats.refused++;
        return 0;
    }
    if (!p) {
        if (svc->n_peers == svc->cap_peers) {
            size_t cap = svc->cap_peers ? svc->cap_peers * 2 : 16;
            struct peer_ent *np = realloc(svc->peers, cap * sizeof(*np));
            if (!np)
                return TERN_ENOMEM;
            svc->peers = np;
            svc->cap_peers = cap;
        }
        p = &svc->peers[svc->n_peers++];
        p->s = s;
    }
    p->node = peer.node;
    return 0;
}

static int on_headers(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct bs_service *svc = ctx;
    struct bs_headers_req q;
    struct bs_headers_rep *rep;
    uint64_t top = bs_store_committed(svc->st);
    size_t room = tern_reply_max(req);
    uint32_t n = 0;
    const char *why;
    uint8_t *out;

    if (bs_headers_req_decode(data, len, &q, &why) < 0)
        return TERN_EPROTO;
    svc->stats.headers++;
    if (room < sizeof(*rep))
        return TERN_EMSGSIZE;
    if (q.from < top) {
        uint64_t can = (room - sizeof(*rep)) / BS_HDR_SIZE;
        uint64_t want = top - q.from < q.max ? top - q.from : q.max;
        n = (uint32_t)(want < can ? want : can);
    }
    rep = tern_reply_alloc(req, sizeof(*rep) + (size_t)n * BS_HDR_SIZE);
    *rep = (struct bs_headers_rep){.from = q.from, .n = n};
    out = (uint8_t *)(rep + 1);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *b;
        size_t bl;
        int rc = bs_store_block(svc->st, q.from + i, &b, &bl);

        if (rc < 0)
            return rc;
        memcpy(out + (size_t)i * BS_HDR_SIZE, b, BS_HDR_SIZE);
        if (svc->o.fault == BS_FAULT_PARENT && q.from + i > 0)
            out[(size_t)i * BS_HDR_SIZE + 24] ^= 1;   /* the parent id */
    }
    return 0;
}

static void put_done(void *arg, int status)
{
    (void)arg;
    (void)status;                    /* the peer checks what arrives */
}

/* Put [at, at+n) of the log at dst+roff: stored straight in where the
 * fabric maps the peer's area, else put from the registered mapping in
 * pieces the fabric carries, as many as its queue takes now (a handler
 * cannot wait for room). The bytes put (the reply says how many; the
 * peer asks for the rest), or an error when none were (then they go
 * inline). */
static int64_t put_span(struct bs_service *svc, struct tern_session *s, const uint8_t *at,
                        uint32_t n, const struct bs_range_req *q)
{
    size_t max = tern_session_rma_max(s);
    size_t loff = (size_t)(at - (const uint8_t *)bs_store_base(svc->st));
    uint32_t done = 0;
    void *p;

    if ((tern_session_caps(s) & TERN_TP_CAP_RKEY_PTR) &&
        tern_session_rkey_ptr(s, &q->dst, q->roff, n, TERN_TP_ACCESS_REMOTE_WRITE, &p) == 0) {
        memcpy(p, at, n);
        return n;
    }
    if (!max)
        return TERN_ENOTSUP;
    while (done < n) {
        uint32_t k = n - done < max ? n - done : (uint32_t)max;
        int rc = tern_session_put(s, svc->mr, loff + done, k, &q->dst, q->roff + done, put_done,
                                  NULL);
        if (rc < 0)
            return done ? (int64_t)done : rc;
        done += k;
    }
    return done;
}

static void stall(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0)
        ;
}

static int on_range(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct bs_service *svc = ctx;
    struct tern_session *s = tern_req_session(req);
    struct bs_range_req q;
    struct bs_range_rep *rep;
    const uint8_t *span;
    size_t span_len, room = tern_reply_max(req);
    const char *why;
    int64_t put = -1;
    uint32_t n;

    if (bs_range_req_decode(data, len, &q, &why) < 0)
        return TERN_EPROTO;
    svc->stats.ranges++;
    if (svc->o.fault == BS_FAULT_STALL)
        stall(svc->o.stall_ms ? svc->o.stall_ms : 60000);
    if (q.to > bs_store_committed(svc->st))
        return TERN_ENOENT;
    if (bs_store_span(svc->st, q.from, q.to, &span, &span_len) < 0)
        return TERN_ENOENT;
    if (q.off > span_len || room <= sizeof(*rep))
        return TERN_ERANGE;
    n = (uint32_t)(span_len - q.off < q.max ? span_len - q.off : q.max);
    if ((q.flags & BS_RANGE_PUT) && svc->mr && svc->o.fault == BS_FAULT_NONE)
        put = put_span(svc, s, span + q.off, n, &q);
    if (put > 0) {
        rep = tern_reply_alloc(req, sizeof(*rep));
        *rep = (struct bs_range_rep){.span_len = span_len, .off = q.off, .n = (uint32_t)put,
                                     .flags = BS_RANGE_PUT};
        svc->stats.bytes_put += (uint64_t)put;
        return 0;
    }
    if (n > room - sizeof(*rep))
        n = (uint32_t)(room - sizeof(*rep));
    rep = tern_reply_alloc(req, sizeof(*rep) + n);
    *rep = (struct bs_range_rep){.span_len = span_len, .off = q.off, .n = n};
    memcpy(rep + 1, span + q.off, n);
    svc->stats.bytes_inline += n;
    switch (svc->o.fault) {
    case BS_FAULT_MERKLE:            /* a byte of the first transaction */
        if (q.off == 0 && n > BS_REC_HDR + BS_HDR_SIZE + 8)
            ((uint8_t *)(rep + 1))[BS_REC_HDR + BS_HDR_SIZE + 8] ^= 1;
        break;
    case BS_FAULT_TRUNCATE:
        rep->span_len -= BS_REC_ALIGN;
        if (rep->n > rep->span_len - rep->off) {
            rep->n = (uint32_t)(rep->span_len - rep->off);
            tern_reply_set_len(req, sizeof(*rep) + rep->n);
        }
        break;
    case BS_FAULT_ORDER:             /* the record header's height */
        if (q.off == 0 && n >= BS_REC_HDR)
            ((uint8_t *)(rep + 1))[8] ^= 1;
        break;
    default:
        break;
    }
    return 0;
}

static int on_append(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct bs_service *svc = ctx;
    struct bs_append_req q;
    struct bs_append_rep *rep;
    const uint8_t *blk;
    size_t blen;
    const char *why;
    struct bs_block b;
    uint64_t top = bs_store_committed(svc->st);
    uint8_t parent[BS_ID_LEN];
    int rc;

    if (bs_append_req_decode(data, len, &q, &blk, &blen, &why) < 0)
        return TERN_EPROTO;
    if (!svc->o.allow_append)
        return TERN_EACCES;
    if (svc->syncing || bs_store_top(svc->st) != top)
        return TERN_EBUSY;
    rep = tern_reply_alloc(req, sizeof(*rep));
    if (!rep)
        return TERN_EMSGSIZE;
    memset(rep, 0, sizeof(*rep));
    if (bs_block_parse(blk, blen, &b, &why) < 0) {
        rep->verdict = BS_APPEND_MALFORMED;
        svc->stats.append_refused++;
        return 0;
    }
    if (top)
        bs_store_id(svc->st, top - 1, parent);
    rc = bs_block_check(svc->hs, &b, bs_store_chain(svc->st), top ? parent : NULL,
                        top - 1, rep->id);
    if (rc < 0)
        return rc;
    rep->verdict = (uint32_t)rc;
    if (rc != BS_VALID) {
        svc->stats.append_refused++;
        return 0;
    }
    if ((rc = bs_store_append(svc->st, blk, blen, rep->id)) < 0 ||
        (rc = bs_store_commit(svc->st)) < 0) {
        bs_store_truncate(svc->st, top);
        return rc;
    }
    if (q.lib > bs_store_irreversible(svc->st))
        bs_store_set_irreversible(svc->st, q.lib < top + 1 ? q.lib : top + 1);
    rep->height = top;
    svc->stats.appended++;
    return 0;
}

static int on_info(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct bs_service *svc = ctx;
    struct bs_store_info si;
    struct bs_info *out;

    (void)data;
    if (len)
        return TERN_EPROTO;
    out = tern_reply_alloc(req, sizeof(*out));
    if (!out)
        return TERN_EMSGSIZE;
    bs_store_info(svc->st, &si);
    *out = (struct bs_info){.chain = si.chain, .node = svc->o.node, .committed = si.committed,
                            .irreversible = si.irreversible, .data_used = si.data_used,
                            .data_cap = si.data_cap, .idx_cap = si.idx_cap,
                            .flags = (svc->syncing ? BS_INFO_SYNCING : 0) |
                                     (svc->o.allow_append ? BS_INFO_APPEND : 0),
                            .subscribers = bs_feed_count(svc->feed)};
    if (si.committed)
        bs_store_id(svc->st, si.committed - 1, out->head_id);
    return 0;
}

void bs_service_set_syncing(struct bs_service *svc, bool on)
{
    svc->syncing = on;
}

static int on_subscribe(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    return bs_feed_on_subscribe(((struct bs_service *)ctx)->feed, req, data, len);
}

static int on_feed(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    return bs_feed_on_feed(((struct bs_service *)ctx)->feed, req, data, len);
}

static int on_feed_stats(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    return bs_feed_on_stats(((struct bs_service *)ctx)->feed, req, data, len);
}

static const struct tern_method bs_methods[] = {
    {.id = BS_M_HELLO, .name = "hello", .handler = on_hello},
    {.id = BS_M_HEADERS, .name = "headers", .handler = on_headers},
    {.id = BS_M_RANGE, .name = "range", .handler = on_range},
    {.id = BS_M_APPEND, .name = "append", .handler = on_append},
    {.id = BS_M_INFO, .name = "info", .handler = on_info},
    {.id = BS_M_SUBSCRIBE, .name = "subscribe", .handler = on_subscribe},
    {.id = BS_M_FEED, .name = "feed", .handler = on_feed},
    {.id = BS_M_FEED_STATS, .name = "feed_stats", .handler = on_feed_stats},
};

int bs_service_new(struct bs_store *st, const struct bs_service_opts *o,
                   struct bs_service **out)
{
    struct bs_service *svc = calloc(1, sizeof(*svc));

    if (!svc)
        return TERN_ENOMEM;
    svc->st = st;
    if (o)
        svc->o = *o;
    svc->hs = bs_hasher_new();
    svc->feed = bs_feed_new(st);
    if (!svc->hs || !svc->feed) {
        bs_hasher_free(svc->hs);
        bs_feed_free(svc->feed);
        free(svc);
        return TERN_ENOMEM;
    }
    while (!svc->o.node)
        if (getrandom(&svc->o.node, sizeof(svc->o.node), 0) != sizeof(svc->o.node))
            svc->o.node = (uint64_t)tern_now_ns();
    svc->def = (struct tern_service){.name = "blocksync", .id = BS_SERVICE_ID,
                                     .methods = bs_methods,
                                     .n_methods = sizeof(bs_methods) / sizeof(bs_methods[0]),
                                     .ctx = svc, .session_closed = session_closed};
    *out = svc;
    return 0;
}

const struct tern_service *bs_service_def(struct bs_service *svc)
{
    return &svc->def;
}

int bs_service_enable_put(struct bs_service *svc, struct tern_rpc_ep *ep)
{
    return tern_rpc_mr_reg(ep, (void *)bs_store_base(svc->st), bs_store_map_len(svc->st), -1, 0,
                           TERN_TP_ACCESS_LOCAL, &svc->mr);
}

void bs_service_get_stats(const struct bs_service *svc, struct bs_service_stats *st)
{
    *st = svc->stats;
}

void bs_service_free(struct bs_service *svc)
{
    if (!svc)
        return;
    free(svc->peers);
    bs_hasher_free(svc->hs);
    bs_feed_free(svc->feed);
    free(svc);
}
