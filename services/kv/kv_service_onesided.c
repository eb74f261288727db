/* The server's half of the one-sided paths (BOOM-KV's one-round PUT and
 * Chequer's one-sided GET):
 * - the index window (kv_window.h) lives in registered memory that clients
 *   read; the whole pool is registered read-only so they can read records;
 * - a client leases a whole segment of the pool, registered read-write for
 *   it alone, writes records into it one-sidedly and tells the server where
 *   each one starts (KV_M_LPUT); the server checks it, versions it, makes it
 *   durable, indexes it and replies. One round trip per PUT; a new lease
 *   only when the segment is full.
 * - GET by server push: the client names a buffer of its own, the server
 *   puts the key's record into it straight from the pool and replies with
 *   its size (KV_M_PGET); the record stays pinned until the put is done.
 * A lease ends when its client asks for the next one, when its session
 * closes, when a record it sent is refused in a way that drops it, or when
 * it sat unused for lease_idle_ns and the pool needs the room. Its
 * registration goes with it, so on RDMA the NIC refuses late writes.
 * Leases are bounded so that no client, nor any number of them, can keep
 * the writes that go through the store from finding room: together they
 * hold at most lease_pool_pct of the pool's segments, and a session that
 * keeps asking for leases it does not fill is refused (TERN_EBUSY). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "kv_service_internal.h"
#include "kv_store.h"
#include "kv_window.h"
#include "kv_wire.h"
#include "log.h"

/* A session's lease, and how it used the ones before: kept while it holds
 * a lease or has wasted some. */
struct kv_lease_ent {
    struct tern_session *s;          /* NULL: free */
    bool held;                       /* a segment is leased to s */
    bool revoked;                    /* taken back: its LPUTs are refused */
    uint32_t seg;                    /* held: the segment */
    uint32_t base;                   /* held: where the lessee's records start */
    unsigned wasted;                 /* leases in a row handed back under half written */
    struct tern_rpc_mr *mr;          /* held: the lessee's registration (NULL once
                                      * withdrawn) */
    uint64_t used_ns;                /* last LEASE or LPUT */
    uint64_t withdrawn_ns;           /* revoked, registration withdrawn at; 0 = not */
};

/* A record on its way to a client by server push (KV_M_PGET). */
struct kv_push {
    struct tern_kv_service *svc;
    pm_loc loc;                 /* pinned until the put completes */
    bool busy;
};

struct kv_os {
    struct tern_rpc_ep *ep;
    /* Registrations belong to the endpoint, which goes first (kv.h): its
     * destruction deregisters them, so teardown here never touches them.
     * The window's memory is ours, so that the store never writes into
     * memory freed with the endpoint. */
    struct tern_rpc_mr *window_mr, *pool_mr;
    void *window;
    size_t window_len;
    int window_fd;
    uint32_t n_blocks, seg_size;
    uint64_t idle_ns;
    uint64_t grace_ns;               /* from withdrawing a key to ending its lease */
    uint8_t uuid[16];
    unsigned max_active;             /* leases granted and not taken back */
    unsigned max_held;               /* segments leases may hold, taken back or not */
    unsigned session_max;            /* wasted leases in a row a session may have */
    unsigned n_active, n_held;
    unsigned n_leases;               /* entries: one per session that leases (a
                                      * session has one lease at a time) */
    struct kv_lease_ent *leases;
    uint32_t *by_seg;                /* segment -> its lease entry + 1 (0: none),
                                      * so an LPUT finds its lease at once */
    struct kv_push pushes[TERN_KV_PINS];
    unsigned push_hint;              /* where to look for a free one first */
};

static void on_short(void *arg);

/* Window blocks for a pool: one 8-bucket block per 4 KiB of pool (a bucket
 * per 512 bytes), rounded down to a power of two. */
static uint32_t default_blocks(uint64_t pool_size)
{
    uint64_t want = pool_size / 4096;
    uint32_t n = 64;

    while ((uint64_t)n * 2 <= want && n < (1u << 26))
        n *= 2;
    return n;
}

/* The window: a memfd, so that peers on the same host can map it. */
static int window_alloc(struct kv_os *os)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    os->window_len = (kvw_bytes(os->n_blocks) + page - 1) & ~(page - 1);
    os->window_fd = memfd_create("tern-kv-window", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (os->window_fd < 0)
        return TERN_ENOMEM;
    if (ftruncate(os->window_fd, (off_t)os->window_len) < 0 ||
        fcntl(os->window_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
        return TERN_ENOMEM;
    os->window = mmap(NULL, os->window_len, PROT_READ | PROT_WRITE, MAP_SHARED,
                      os->window_fd, 0);
    if (os->window == MAP_FAILED) {
        os->window = NULL;
        return TERN_ENOMEM;
    }
    return 0;
}

static void window_free(struct kv_os *os)
{
    if (os->window)
        munmap(os->window, os->window_len);
    if (os->window_fd >= 0)
        close(os->window_fd);
}

int tern_kv_service_enable_onesided(struct tern_kv_service *svc, struct tern_rpc_ep *ep,
                                    const struct tern_kv_onesided_opts *o)
{
    struct pm_pool *pool;
    struct pm_info info;
    struct kv_os *os;
    unsigned pct;
    int rc;

    if (!svc || !ep || svc->os)
        return TERN_EINVAL;
    if (o && o->window_blocks && (o->window_blocks & (o->window_blocks - 1)))
        return TERN_EINVAL;
    if (o && o->lease_pool_pct > 100)
        return TERN_EINVAL;
    pool = kvs_pool(svc->store);
    os = calloc(1, sizeof(*os));
    if (!os)
        return TERN_ENOMEM;
    os->ep = ep;
    os->window_fd = -1;
    pm_get_info(pool, &info);
    os->seg_size = info.seg_size;
    memcpy(os->uuid, info.uuid, sizeof(os->uuid));
    os->n_blocks = o && o->window_blocks ? o->window_blocks
                                         : default_blocks(pm_map_len(pool));
    os->idle_ns = o && o->lease_idle_ns ? o->lease_idle_ns : 30000000000ull;
    /* Long enough that a lessee's store cannot still be on its way when its
     * segment is reused (see reclaim_idle), short enough that writers
     * waiting for the room do not wait long. */
    os->grace_ns = os->idle_ns < 1000000000ull ? os->idle_ns : 1000000000ull;
    os->max_active = o && o->max_leases ? o->max_leases : 256;
    /* A quarter by default: the rest stays for the writes that go through
     * the store and for the cleaner, whatever clients lease. */
    pct = o && o->lease_pool_pct ? o->lease_pool_pct : 25;
    os->max_held = (unsigned)((uint64_t)pm_seg_count(pool) * pct / 100);
    if (!os->max_held)
        os->max_held = 1;
    os->session_max = o && o->session_leases ? o->session_leases : 4;
    /* One entry per session that leases: the RPC default allows 4096
     * sessions (one past the table gets TERN_ENOBUFS). */
    os->n_leases = os->max_active + 4096;
    os->leases = calloc(os->n_leases, sizeof(*os->leases));
    os->by_seg = calloc(pm_seg_count(pool), sizeof(*os->by_seg));
    if (!os->leases || !os->by_seg) {
        rc = TERN_ENOMEM;
        goto fail;
    }
    rc = window_alloc(os);
    if (rc == 0)
        rc = tern_rpc_mr_reg(ep, os->window, os->window_len, os->window_fd, 0,
                             TERN_TP_ACCESS_REMOTE_READ, &os->window_mr);
    if (rc < 0)
        goto fail;
    rc = tern_rpc_mr_reg(ep, pm_base(pool), pm_map_len(pool), pm_fd(pool), 0,
                         TERN_TP_ACCESS_REMOTE_READ, &os->pool_mr);
    if (rc < 0)
        goto fail;
    kvs_attach_window(svc->store, os->window, os->n_blocks);
    kvs_on_short(svc->store, on_short, svc);
    svc->os = os;
    return 0;
fail:
    if (os->window_mr)
        tern_rpc_mr_dereg(os->window_mr);
    window_free(os);
    free(os->leases);
    free(os->by_seg);
    free(os);
    return rc;
}

/* End a held lease (unless the store already did) and withdraw its
 * registration, if that was not done already. The entry stays the
 * session's. */
static void lease_drop(struct kv_os *os, struct kv_lease_ent *l, struct kvs *store,
                       bool end)
{
    /* The registration goes first: ending the lease rewrites the segment's
     * header, which the lessee's mapping must no longer reach. */
    tern_rpc_mr_dereg(l->mr);
    if (end)
        kvs_lease_end(store, l->seg);
    if (!l->revoked)
        os->n_active--;
    os->n_held--;
    l->held = l->revoked = false;
    l->mr = NULL;
    l->withdrawn_ns = 0;
}

/* Forget a session that holds nothing and wasted nothing. */
static void ent_release(struct kv_lease_ent *l)
{
    if (!l->held && !l->wasted)
        *l = (struct kv_lease_ent){0};
}

static void take_back(struct kv_os *os, struct kv_lease_ent *l, uint64_t now)
{
    tern_log(TERN_LOG_INFO, "kv", "lease of segment %u unused for %llu ms: taken back",
             l->seg, (unsigned long long)((now - l->used_ns) / 1000000));
    l->revoked = true;
    os->n_active--;
}

void kv_onesided_destroy(struct tern_kv_service *svc)
{
    struct kv_os *os = svc->os;

    if (!os)
        return;
    /* The endpoint is gone (kv.h), and its sessions with it: their leases
     * were ended then. Any left end here; their registrations went with
     * the endpoint. */
    for (unsigned i = 0; i < os->n_leases; i++)
        if (os->leases[i].held)
            kvs_lease_end(svc->store, os->leases[i].seg);
    kvs_on_short(svc->store, NULL, NULL);
    kvs_attach_window(svc->store, NULL, 0);
    window_free(os);
    free(os->leases);
    free(os->by_seg);
    free(os);
    svc->os = NULL;
}

void kv_onesided_session_closed(struct tern_session *s, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct kv_os *os = svc->os;

    if (!os)
        return;
    for (unsigned i = 0; i < os->n_leases; i++)
        if (os->leases[i].s == s) {
            if (os->leases[i].held)
                lease_drop(os, &os->leases[i], svc->store, true);
            os->leases[i] = (struct kv_lease_ent){0};
        }
}

int kv_h_os_info(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct tern_session *s = tern_req_session(req);
    struct pm_pool *pool;
    struct kv_onesided_info *out;
    int rc;

    (void)data;
    if (!svc->os)
        return TERN_ENOTSUP;
    /* One-sided reads see what is not yet on a majority: the primary of a
     * replicated shard does not hand them out. */
    if (svc->repl)
        return TERN_ENOTSUP;
    if (len)
        return TERN_EPROTO;
    out = tern_reply_alloc(req, sizeof(*out));
    if (!out)
        return TERN_EMSGSIZE;
    memset(out, 0, sizeof(*out));
    rc = tern_rpc_mr_rkey(svc->os->window_mr, s, &out->window);
    if (rc == 0)
        rc = tern_rpc_mr_rkey(svc->os->pool_mr, s, &out->pool);
    if (rc < 0)
        return rc;
    pool = kvs_pool(svc->store);
    out->seg0 = pm_seg_file_off(pool, 0);
    out->seg_size = svc->os->seg_size;
    out->n_blocks = svc->os->n_blocks;
    memcpy(out->uuid, svc->os->uuid, sizeof(out->uuid));
    return 0;
}

static struct kv_lease_ent *lease_of_seg(struct kv_os *os, struct kvs *store,
                                         uint32_t seg)
{
    uint32_t i = seg < pm_seg_count(kvs_pool(store)) ? os->by_seg[seg] : 0;

    /* The entry may have been freed and given to another segment since. */
    return i && os->leases[i - 1].held && os->leases[i - 1].seg == seg ? &os->leases[i - 1]
                                                                        : NULL;
}

/* The session's entry, or a free one for it (NULL if none is left). */
static struct kv_lease_ent *session_ent(struct kv_os *os, struct tern_session *s)
{
    struct kv_lease_ent *free_ent = NULL;

    for (unsigned i = 0; i < os->n_leases; i++) {
        if (os->leases[i].s == s)
            return &os->leases[i];
        if (!os->leases[i].s && !free_ent)
            free_ent = &os->leases[i];
    }
    if (free_ent)
        free_ent->s = s;
    return free_ent;
}

/* A fabric whose NIC breaks the connection of a peer that writes to a
 * withdrawn key (TERN_TP_CAP_STRICT_RKEY) keeps the lease: elsewhere the
 * write is refused one by one (a key checked before each store, or by the
 * server's progress engine), and the client leases again. */
static bool may_withdraw(const struct tern_session *s)
{
    return !(tern_session_caps(s) & TERN_TP_CAP_STRICT_RKEY);
}

/* The pool is short of free segments, or leases hold their whole share of
 * it: every lease unused for idle_ns is taken back and its segment given
 * back to the pool. Its key is withdrawn first, and only grace_ns later
 * does the lease end, at its commit point (the records its client sent
 * stay; the rest of the segment is the cleaner's to take): a store its
 * client began just before the withdrawal has landed by then, where nobody
 * reads it, rather than in the segment's next life. On RDMA the key stays
 * until the client speaks or leaves (see may_withdraw): its lease is taken
 * back only, and counts against max_held until then. */
static void reclaim_idle(struct tern_kv_service *svc)
{
    struct kv_os *os = svc->os;
    uint64_t now;

    if (!os->n_held)
        return;
    now = tern_now_ns();
    for (unsigned i = 0; i < os->n_leases; i++) {
        struct kv_lease_ent *l = &os->leases[i];

        if (!l->held)
            continue;
        if (l->withdrawn_ns) {
            if (now - l->withdrawn_ns >= os->grace_ns) {
                tern_log(TERN_LOG_INFO, "kv", "lease of segment %u ended: back to the pool",
                         l->seg);
                lease_drop(os, l, svc->store, true);
                ent_release(l);
            }
            continue;
        }
        if (!l->revoked) {
            if (now - l->used_ns < os->idle_ns)
                continue;
            take_back(os, l, now);
        }
        if (may_withdraw(l->s)) {
            tern_rpc_mr_dereg(l->mr);
            l->mr = NULL;
            l->withdrawn_ns = now;
        }
    }
}

static void on_short(void *arg)
{
    reclaim_idle(arg);
}

/* With max_active leases out, the one idle longest (if past idle_ns) is
 * taken back to make room. Taking back keeps its segment leased and
 * registered: its client may be writing into it right now, and on RDMA a
 * write to a withdrawn key breaks the connection. Its LPUTs get
 * TERN_ENOLEASE; the lease ends, and the registration goes, when its client
 * asks for a new one (after every put it sent to the old one), leaves, or
 * the pool needs the room (reclaim_idle). */
static bool take_back_oldest(struct kv_os *os)
{
    struct kv_lease_ent *oldest = NULL;
    uint64_t now = tern_now_ns();

    for (unsigned i = 0; i < os->n_leases; i++) {
        struct kv_lease_ent *l = &os->leases[i];

        if (l->held && !l->revoked && now - l->used_ns >= os->idle_ns &&
            (!oldest || l->used_ns < oldest->used_ns))
            oldest = l;
    }
    if (!oldest)
        return false;
    take_back(os, oldest, now);
    return true;
}

/* Room for one more lease: TERN_ENOSPC while leases hold their share of the
 * pool (idle ones are taken back for later), TERN_ENOBUFS while max_active
 * are out and none is idle. */
static int lease_room(struct tern_kv_service *svc)
{
    struct kv_os *os = svc->os;

    if (os->n_held >= os->max_held) {
        reclaim_idle(svc);
        if (os->n_held >= os->max_held)
            return TERN_ENOSPC;
    }
    if (os->n_active >= os->max_active && !take_back_oldest(os))
        return TERN_ENOBUFS;
    return 0;
}

/* The session hands its lease back by asking for another. One it left
 * under half written counts against it, unless it was taken back (the
 * server's doing, not the session's); one it filled clears the count. */
static void hand_back(struct kv_os *os, struct kv_lease_ent *l, struct kvs *store)
{
    uint32_t used = pm_lease_next(kvs_pool(store), l->seg) - l->base;

    if (!l->revoked)
        l->wasted = (uint64_t)used * 2 < os->seg_size - l->base ? l->wasted + 1 : 0;
    lease_drop(os, l, store, true);
}

int kv_h_lease(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct tern_session *s = tern_req_session(req);
    struct pm_pool *pool = kvs_pool(svc->store);
    struct kv_os *os = svc->os;
    struct tern_rpc_mr *mr = NULL;
    struct kv_lease_ent *l;
    struct kv_lease_req q;
    struct kv_lease *out;
    uint64_t foff;
    uint32_t seg, base;
    int rc;

    if (!os)
        return TERN_ENOTSUP;
    if (svc->repl)
        return TERN_ENOTSUP;
    if (len != sizeof(q))
        return TERN_EPROTO;
    memcpy(&q, data, sizeof(q));
    if (q.flags || q.reserved)
        return TERN_EPROTO;
    l = session_ent(os, s);
    if (!l)
        return TERN_ENOBUFS;
    /* One lease per session: asking again hands the old one back. */
    if (l->held)
        hand_back(os, l, svc->store);
    /* A client that asks and asks without writing would keep the server
     * registering, mapping and cleaning segments for nothing. */
    if (l->wasted >= os->session_max)
        return TERN_EBUSY;
    rc = lease_room(svc);
    out = rc == 0 ? tern_reply_alloc(req, sizeof(*out)) : NULL;
    if (rc == 0 && !out)
        rc = TERN_EMSGSIZE;
    if (rc == 0)
        rc = kvs_lease(svc->store, &seg);
    if (rc < 0) {
        ent_release(l);
        return rc;
    }
    /* From the lessee's first byte on (a page boundary): the segment's
     * header, before it, stays out of the lessee's reach. */
    base = pm_lease_next(pool, seg);
    foff = pm_seg_file_off(pool, seg) + base;
    rc = tern_rpc_mr_reg(os->ep, (uint8_t *)pm_base(pool) + foff, os->seg_size - base,
                         pm_fd(pool), foff,
                         TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE, &mr);
    if (rc == 0 && (rc = tern_rpc_mr_rkey(mr, s, &out->rkey)) < 0)
        tern_rpc_mr_dereg(mr);
    if (rc < 0) {
        kvs_lease_end(svc->store, seg);
        ent_release(l);
        return rc;
    }
    /* The records will be read and flushed here: map the segment's pages
     * in now rather than fault on every 4 KiB of them (a hint). */
    madvise((uint8_t *)pm_base(pool) + foff, os->seg_size - base, MADV_POPULATE_WRITE);
    l->held = true;
    l->revoked = false;
    l->seg = seg;
    l->base = base;
    l->mr = mr;
    l->withdrawn_ns = 0;
    l->used_ns = tern_now_ns();
    os->n_held++;
    os->n_active++;
    os->by_seg[seg] = (uint32_t)(l - os->leases) + 1;
    *out = (struct kv_lease){.seg = seg, .next = base, .end = os->seg_size, .base = base,
                             .rkey = out->rkey};
    return 0;
}

int kv_h_lput(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct kv_lease_ent *l;
    struct kv_lput q;
    uint64_t version;
    bool ended = false;
    int rc;

    if (!svc->os)
        return TERN_ENOTSUP;
    if (len != sizeof(q))
        return TERN_EPROTO;
    memcpy(&q, data, sizeof(q));
    l = lease_of_seg(svc->os, svc->store, q.seg);
    if (!l || l->s != tern_req_session(req))
        return TERN_ENOLEASE;
    /* Taken back: the registration stays until the client asks for a new
     * lease (or leaves, or the pool needs the room), as puts it pipelined
     * may still be on their way. */
    if (l->revoked)
        return TERN_ENOLEASE;
    l->used_ns = tern_now_ns();
    if (!(q.intent >> 63))
        return TERN_EPROTO;
    rc = kvs_lease_put(svc->store, q.seg, q.off, q.intent, svc->lo, svc->hi,
                                 TERN_KV_SYNC, &version, &ended);
    if (ended) {
        /* Lost to a record the store refused: the session's loss. */
        l->wasted++;
        lease_drop(svc->os, l, svc->store, false);
    }
    return rc < 0 ? rc : kv_reply_version(req, version);
}

/* ---- GET by server push ---- */

static void push_done(void *arg, int status)
{
    struct kv_push *p = arg;

    /* A failed put leaves the client's buffer as it was; the client checks
     * the record's key, version and sum before it believes it. */
    (void)status;
    kvs_unpin(p->svc->store, p->loc);
    p->busy = false;
}

static struct kv_push *push_slot(struct kv_os *os)
{
    for (unsigned i = 0; i < TERN_KV_PINS; i++) {
        unsigned j = (os->push_hint + i) % TERN_KV_PINS;

        if (!os->pushes[j].busy) {
            os->push_hint = j + 1;
            return &os->pushes[j];
        }
    }
    return NULL;
}

/* Push the record at `loc` into the client's buffer straight from the
 * pool (no copy here) and reply with its size. The put is posted before
 * the reply is reserved, so that the reply follows the data (rpc.h). The
 * record stays pinned (never rewritten in place) until the put is done. */
static int pget_push(struct tern_req *req, struct tern_kv_service *svc, const struct kv_pget *q,
                     pm_loc loc, uint32_t size, uint64_t version, uint32_t vlen)
{
    struct pm_pool *pool = kvs_pool(svc->store);
    struct kv_os *os = svc->os;
    struct kv_pget_rep *rep;
    struct kv_push *p = push_slot(os);
    uint64_t off = pm_seg_file_off(pool, (uint32_t)(loc >> 32)) + (uint32_t)loc;

    if (!p || kvs_pin(svc->store, loc) < 0)
        return TERN_ENOBUFS;
    *p = (struct kv_push){.svc = svc, .loc = loc, .busy = true};
    if (tern_session_put(tern_req_session(req), os->pool_mr, off, size, &q->dst, q->off,
                         push_done, p) < 0) {
        kvs_unpin(svc->store, loc);
        p->busy = false;
        return TERN_EAGAIN;
    }
    rep = tern_reply_alloc(req, sizeof(*rep));
    if (!rep)
        return TERN_EMSGSIZE;
    *rep = (struct kv_pget_rep){.version = version, .size = size, .vlen = vlen};
    return 0;
}

int kv_h_pget(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_kv_service *svc = ctx;
    struct kv_pget_rep *rep;
    const uint8_t *key = (const uint8_t *)data + sizeof(struct kv_pget);
    struct kv_pget q;
    struct pm_rec hdr;
    const void *val;
    pm_loc loc;
    uint64_t version;
    uint32_t size, vlen;
    int rc;

    if (!svc->os)
        return TERN_ENOTSUP;
    if ((rc = kv_read_check(svc, false)) < 0)
        return rc;
    if (len < sizeof(q))
        return TERN_EPROTO;
    memcpy(&q, data, sizeof(q));
    if (q.flags || len != sizeof(q) + q.klen)
        return TERN_EPROTO;
    if (!q.klen)
        return TERN_EINVAL;
    if (!kv_owns(svc, key, q.klen))
        return TERN_EWRONGNODE;
    rc = kvs_locate(svc->store, key, q.klen, &loc, &size, &version);
    /* The header read once and checked: its lessee may be rewriting it. */
    if (rc == 0 && pm_rec_read(kvs_pool(svc->store), loc, &hdr) < 0)
        rc = TERN_ECORRUPT;
    if (rc < 0)
        return rc;
    vlen = hdr.val_len;
    val = (const uint8_t *)pm_rec_at(kvs_pool(svc->store), loc) + sizeof(hdr) + hdr.key_len;
    /* An expiring value goes inline, without its deadline: clients take
     * pushed records only as PM_VALUE ones. */
    if (hdr.type == PM_EXPIRING) {
        val = (const uint8_t *)val + PM_EXPIRY_BYTES;
        vlen -= PM_EXPIRY_BYTES;
    } else if (size <= q.cap) {
        rc = pget_push(req, svc, &q, loc, size, version, vlen);
        if (rc != TERN_ENOBUFS && rc != TERN_EAGAIN)
            return rc;
    }
    /* Too big for the client's buffer, or no room to push now (or the
     * client's key is bad): the value goes inline, as KV_M_GET sends it. */
    rep = tern_reply_alloc(req, sizeof(*rep) + vlen);
    if (!rep)
        return TERN_EMSGSIZE;
    *rep = (struct kv_pget_rep){.version = version, .vlen = vlen};
    memcpy(rep + 1, val, vlen);
    return 0;
}
