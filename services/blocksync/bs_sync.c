/* Catch-up sync (bs_sync.h): peers, the header chain, ranges in a window,
 * their receive areas, checking and committing in order. */
#include "bs_sync.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "log.h"

#define HCAP (1u << 16)              /* headers held ahead of the store */
#define NSLOTS 256                   /* ranges in the window */
#define NCALLS 1024
#define CALL_BYTES_MAX (1u << 20)    /* inline bytes asked for in one call */
#define CALLS_PER_RANGE 4
#define FORK_LOOKBACK 4096
#define STALL_MAX_NS (64ull * 1000000000)
#define STALL_MIN_NS 100000000ull

enum pstate { P_NEW, P_HELLO, P_READY, P_DROP, P_GONE };

/* A peer's receive area: a byte ring its ranges are given space in, in the
 * order they are given it; space comes back when the oldest is freed. */
struct area {
    struct tern_rpc_mr *mr;          /* one_sided: registered, else NULL */
    uint8_t *mem;
    uint64_t size, head, tail, used;
    int fifo[NSLOTS];                /* slots, in the order given space */
    unsigned f_head, f_n;
};

struct peer {
    const char *uri;
    struct tern_session *s;
    enum pstate st;
    struct bs_hello hello;
    unsigned inflight;               /* ranges being fetched */
    uint64_t t_hello, rtt_ns;
    double rate;                     /* bytes per ns, smoothed */
    uint64_t range_ns;               /* smoothed time to fetch a range */
    uint64_t range_bytes;
    size_t call_bytes;               /* inline bytes one reply may carry */
    struct area area;
    struct tern_tp_rkey rkey;
    uint32_t epoch;
    bool put_ok;
    struct bs_sync_peer_stats *ps;
};

/* A range's life: WANT (no peer yet, or given back), FLIGHT (asked of a
 * peer), RECEIVED (all its bytes in), CHECKING (a checker has it), then
 * VALID (committed in order, then FREE) or BAD (its peer is dropped, it
 * is asked again). RECEIVED -> CHECKING is taken by compare-and-swap, by
 * a worker or by the loop; the checker alone moves it on. */
enum rstate { R_FREE, R_WANT, R_FLIGHT, R_RECEIVED, R_CHECKING, R_VALID, R_BAD };

struct range {
    uint64_t from, to, span_len;
    int peer;                        /* whose area holds it, -1 none */
    uint8_t *buf;                    /* in that area */
    uint64_t area_off;
    uint32_t gen;                    /* bumped on every reassignment */
    uint64_t t_sent, next_off, got;
    uint64_t t_progress;             /* when its peer last gave it bytes */
    unsigned calls;
    _Atomic int state;               /* enum rstate */
    const char *why;                 /* BAD: written before the state */
    bool freed;                      /* its area space may be reused */
};

struct sync;

/* What checking a range needs, one per thread that checks. */
struct checker {
    struct sync *sy;
    struct bs_hasher *hs;
    const uint8_t **blocks;
    uint32_t *lens;
    size_t cap;
};

enum call_kind { C_HELLO, C_HEADERS, C_RANGE };

struct call {
    struct sync *sy;
    enum call_kind kind;
    int peer, slot, next_free;
    uint32_t gen;
    uint64_t off;
    uint32_t want;
    union {
        struct bs_hello hello;
        struct bs_headers_req hq;
        struct bs_range_req rq;
    } u;
};

struct sync {
    struct tern_rpc_ep *ep;
    struct bs_store *st;
    struct bs_sync_opts o;
    struct bs_sync_stats *stats;
    struct bs_hello self;
    struct peer peers[BS_SYNC_MAX_PEERS];
    unsigned n_peers;
    uint64_t target;
    bool target_set;
    /* The header chain ahead of the store: heights [store top, hdr_top). */
    uint8_t (*hdr)[BS_HDR_SIZE];
    uint8_t (*hid)[BS_ID_LEN];
    uint32_t *hlen;
    uint64_t hdr_top;
    int hdr_peer;                    /* whose headers, -1 none yet */
    bool hdr_flight, fork_search;
    /* Ranges, in height order: slots[(r_head + i) % NSLOTS], i < r_n. */
    struct range slots[NSLOTS];
    unsigned r_head, r_n;
    uint64_t next_height, window_used, pending_bytes;
    bool window_full;                /* no new range fits the window now */
    struct checker ck;               /* the loop's own */
    /* Workers: threads that check received ranges (the loop checks too
     * when it has nothing else to do). */
    pthread_t threads[16];
    struct checker wck[16];
    unsigned n_workers;
    sem_t work;                      /* posted once per received range */
    _Atomic bool quit;
    _Atomic int wfatal;              /* a worker could not check at all */
    _Atomic uint64_t check_ns;       /* summed over the threads that check */
    _Atomic bool sleeping;           /* the loop waits: a worker that checked wakes it */
    int evfd;                        /* ... through this (workers only, else -1) */
    uint64_t commit_ns;
    struct call calls[NCALLS];
    int call_free;
    uint64_t range_ns_all;           /* smoothed time of a range, any peer */
    unsigned stall_doublings;        /* after stall drops; decays as ranges come */
    unsigned since_stall;
    uint64_t t0, t_progress;
    uint64_t loops;
    int fatal;
};

static const char *const state_names[] = {
    [BS_SYNC_IRREVERSIBLE] = "irreversible catch-up",
    [BS_SYNC_HEAD] = "head catch-up",
    [BS_SYNC_IN_SYNC] = "in sync",
};

const char *bs_sync_state_name(enum bs_sync_state s)
{
    return s >= BS_SYNC_IRREVERSIBLE && s <= BS_SYNC_IN_SYNC ? state_names[s] : "?";
}

unsigned bs_sync_auto_workers(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    return n <= 1 ? 0 : n - 1 > 4 ? 4 : (unsigned)(n - 1);
}

static uint64_t dflt(uint64_t v, uint64_t d)
{
    return v ? v : d;
}

static struct range *slot_at(struct sync *sy, unsigned i)
{
    return &sy->slots[(sy->r_head + i) % NSLOTS];
}

static unsigned hix(uint64_t h)
{
    return (unsigned)(h & (HCAP - 1));
}

/* ---- calls ---- */

static struct call *call_get(struct sync *sy, enum call_kind kind, int peer)
{
    struct call *c;

    if (sy->call_free < 0)
        return NULL;
    c = &sy->calls[sy->call_free];
    sy->call_free = c->next_free;
    *c = (struct call){.sy = sy, .kind = kind, .peer = peer, .slot = -1};
    return c;
}

static void call_put(struct sync *sy, struct call *c)
{
    c->next_free = sy->call_free;
    sy->call_free = (int)(c - sy->calls);
}

/* ---- receive areas ---- */

static int area_init(struct sync *sy, struct peer *p)
{
    struct area *a = &p->area;

    a->size = sy->o.window + sy->o.range_max + BS_BLOCK_MAX;
    if (sy->o.one_sided) {
        int rc = tern_rpc_mr_alloc(sy->ep, a->size,
                                   TERN_TP_ACCESS_LOCAL | TERN_TP_ACCESS_REMOTE_WRITE, &a->mr);
        if (rc == 0) {
            a->mem = tern_rpc_mr_addr(a->mr);
            madvise(a->mem, a->size - BS_BLOCK_MAX, MADV_POPULATE_WRITE);   /* as below */
            return 0;
        }
        tern_log(TERN_LOG_WARN, "sync", "%s: no receive area to register (%s): inline",
                 p->uri, tern_strerror(rc));
    }
    /* The part ranges use all the time populated at once (a fault per
     * page as ranges first land costs more than the copy into it); the
     * room kept for an outsize block only if one comes. */
    a->mem = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a->mem == MAP_FAILED) {
        a->mem = NULL;
        return TERN_ENOMEM;
    }
    madvise(a->mem, a->size - BS_BLOCK_MAX, MADV_POPULATE_WRITE);
    return 0;
}

static void area_free(struct area *a)
{
    if (a->mr)
        tern_rpc_mr_dereg(a->mr);
    else if (a->mem)
        munmap(a->mem, a->size);
    memset(a, 0, sizeof(*a));
}

/* Space for `n` bytes at the ring's tail (never split: skip to the start
 * when the end is too short). false when there is none now. */
static bool area_take(struct area *a, uint64_t n, uint64_t *off)
{
    uint64_t at = a->tail;

    if (a->f_n == NSLOTS)
        return false;
    if (a->f_n == 0)
        a->head = a->tail = at = 0;
    if (a->tail >= a->head && a->f_n) {
        if (a->size - a->tail < n) {
            if (a->head < n)
                return false;
            at = 0;
        }
    } else if (a->f_n && a->head - a->tail < n) {
        return false;
    } else if (!a->f_n && a->size < n) {
        return false;
    }
    *off = at;
    a->tail = at + n;
    return true;
}

static void area_push(struct area *a, int slot)
{
    a->fifo[(a->f_head + a->f_n++) % NSLOTS] = slot;
}

/* Give back the space of the oldest ranges that are freed. */
static void area_reclaim(struct sync *sy, struct area *a)
{
    while (a->f_n) {
        struct range *r = &sy->slots[a->fifo[a->f_head]];

        if (!r->freed)
            break;
        a->f_head = (a->f_head + 1) % NSLOTS;
        a->f_n--;
        a->head = a->f_n ? sy->slots[a->fifo[a->f_head]].area_off : a->tail;
    }
}

static void range_release_area(struct sync *sy, struct range *r)
{
    if (r->peer < 0)
        return;
    r->freed = true;
    area_reclaim(sy, &sy->peers[r->peer].area);
    r->peer = -1;
    r->buf = NULL;
}

/* Give a range back to be asked of another peer. */
static void range_reset(struct sync *sy, struct range *r)
{
    atomic_store_explicit(&r->state, R_WANT, memory_order_relaxed);
    r->gen++;
    sy->stats->refetched++;
    range_release_area(sy, r);
}

/* ---- peers ---- */

static void peer_drop(struct sync *sy, int i, const char *why)
{
    struct peer *p = &sy->peers[i];

    if (p->st == P_DROP || p->st == P_GONE)
        return;
    tern_log(TERN_LOG_WARN, "sync", "dropping peer %s: %s", p->uri, why);
    p->st = P_DROP;
    p->ps->dropped = why;
    p->inflight = 0;
    for (unsigned k = 0; k < sy->r_n; k++) {
        struct range *r = slot_at(sy, k);

        /* Ranges received whole stay: they are checked as any other, and
         * a valid one is as good from a peer dropped since. */
        if (r->peer == i && (r->state == R_FLIGHT || r->state == R_BAD))
            range_reset(sy, r);
    }
    if (sy->hdr_peer == i) {
        sy->hdr_peer = -1;
        sy->hdr_flight = false;
        sy->fork_search = false;
    }
}

static uint64_t best_head(struct sync *sy, uint64_t *lib)
{
    uint64_t head = 0;

    *lib = 0;
    for (unsigned i = 0; i < sy->n_peers; i++)
        if (sy->peers[i].st == P_READY) {
            if (sy->peers[i].hello.head > head)
                head = sy->peers[i].hello.head;
            if (sy->peers[i].hello.lib > *lib)
                *lib = sy->peers[i].hello.lib;
        }
    return head;
}

static bool node_known(uint64_t node, void *arg)
{
    struct sync *sy = arg;
    unsigned n = 0;

    for (unsigned i = 0; i < sy->n_peers; i++)
        if (sy->peers[i].st == P_READY && sy->peers[i].hello.node == node)
            n++;
    return n > 0;
}

static void hello_done(void *arg, int status, const void *reply, size_t len)
{
    struct call *c = arg;
    struct sync *sy = c->sy;
    struct peer *p = &sy->peers[c->peer];
    struct bs_hello_rep rep;
    const char *why;
    unsigned refusal;

    call_put(sy, c);
    if (p->st != P_HELLO)
        return;
    if (status < 0) {
        peer_drop(sy, c->peer, tern_strerror(status));
        return;
    }
    if (bs_hello_rep_decode(reply, len, &rep, &why) < 0) {
        peer_drop(sy, c->peer, why);
        return;
    }
    p->hello = rep.hello;
    p->ps->head = rep.hello.head;
    p->ps->lib = rep.hello.lib;
    p->rtt_ns = tern_now_ns() - p->t_hello;
    if (rep.refusal != BS_OK) {
        p->ps->refusal = rep.refusal;
        peer_drop(sy, c->peer, bs_refusal_name(rep.refusal));
        return;
    }
    /* The peer said yes; now this side judges it (refreshing its own
     * hello: the store may have moved since the request). */
    bs_hello_of(sy->st, sy->self.node, &sy->self);
    refusal = bs_hello_judge(sy->st, &sy->self, &rep.hello, node_known, sy);
    if (refusal != BS_OK) {
        p->ps->refusal = refusal;
        peer_drop(sy, c->peer, bs_refusal_name(refusal));
        return;
    }
    p->st = P_READY;
}

/* ---- the header chain ---- */

/* The id of block h-1, which block h names as its parent. */
static void parent_id_of(struct sync *sy, uint64_t h, uint8_t id[BS_ID_LEN])
{
    if (h == 0)
        memset(id, 0, BS_ID_LEN);
    else if (h - 1 < bs_store_top(sy->st))
        bs_store_id(sy->st, h - 1, id);
    else
        memcpy(id, sy->hid[hix(h - 1)], BS_ID_LEN);
}

static void headers_done(void *arg, int status, const void *reply, size_t len);

static void ask_headers(struct sync *sy)
{
    uint64_t top = bs_store_top(sy->st), from, max, lib;
    struct peer *p;
    struct call *c;
    int rc;

    if (sy->hdr_flight || sy->fatal)
        return;
    if (sy->hdr_peer < 0 || sy->peers[sy->hdr_peer].st != P_READY) {
        uint64_t best = sy->hdr_top;

        sy->hdr_peer = -1;
        for (unsigned i = 0; i < sy->n_peers; i++)
            if (sy->peers[i].st == P_READY && sy->peers[i].hello.head > best) {
                best = sy->peers[i].hello.head;
                sy->hdr_peer = (int)i;
            }
        if (sy->hdr_peer < 0)
            return;
    }
    p = &sy->peers[sy->hdr_peer];
    from = sy->hdr_top;
    if (sy->fork_search) {
        lib = bs_store_irreversible(sy->st);
        from = top > FORK_LOOKBACK && top - FORK_LOOKBACK > lib ? top - FORK_LOOKBACK : lib;
        max = top - from;
    } else {
        if (from >= sy->target || from >= p->hello.head)
            return;
        if (from > sy->next_height && from - sy->next_height >= HCAP / 2)
            return;                  /* far enough ahead */
        max = HCAP - (from - top);
        if (max > sy->target - from)
            max = sy->target - from;
        if (max > p->hello.head - from)
            max = p->hello.head - from;
    }
    if (max > (p->call_bytes - sizeof(struct bs_headers_rep)) / BS_HDR_SIZE)
        max = (p->call_bytes - sizeof(struct bs_headers_rep)) / BS_HDR_SIZE;
    if (!max || !(c = call_get(sy, C_HEADERS, sy->hdr_peer)))
        return;
    c->u.hq = (struct bs_headers_req){.from = from, .max = (uint32_t)max};
    rc = tern_call(p->s, BS_SERVICE_ID, BS_M_HEADERS, &c->u.hq, sizeof(c->u.hq),
                   sy->o.call_timeout_ns, headers_done, c, NULL);
    if (rc < 0) {
        call_put(sy, c);
        if (rc != TERN_ENOBUFS)
            peer_drop(sy, sy->hdr_peer, tern_strerror(rc));
        return;
    }
    sy->hdr_flight = true;
}

/* The headers below the store's top, from a peer whose chain does not
 * follow it: where do the chains part? */
static void fork_found(struct sync *sy, int pi, const struct bs_headers_rep *rep,
                       const uint8_t *hdrs)
{
    struct peer *p = &sy->peers[pi];
    uint64_t top = bs_store_top(sy->st), common = 0;
    bool found = false;

    sy->fork_search = false;
    for (uint32_t i = rep->n; i-- > 0;) {
        uint8_t id[BS_ID_LEN], mine[BS_ID_LEN];

        if (bs_header_id(sy->ck.hs, hdrs + (size_t)i * BS_HDR_SIZE, id) < 0 ||
            bs_store_id(sy->st, rep->from + i, mine) < 0)
            break;
        if (!memcmp(id, mine, BS_ID_LEN)) {
            common = rep->from + i + 1;
            found = true;
            break;
        }
    }
    if (!found) {
        peer_drop(sy, pi, "forked below the irreversible height");
        return;
    }
    if (p->hello.head <= top) {
        peer_drop(sy, pi, "forked, on a chain no longer than ours");
        return;
    }
    if (sy->r_n || bs_store_truncate(sy->st, common) < 0) {
        peer_drop(sy, pi, "forked, and the store cannot be cut back");
        return;
    }
    tern_log(TERN_LOG_INFO, "sync", "%s: longer fork from height %llu: %llu blocks cut off",
             p->uri, (unsigned long long)common, (unsigned long long)(top - common));
    sy->stats->truncated += top - common;
    sy->hdr_top = sy->next_height = common;
}

static void headers_done(void *arg, int status, const void *reply, size_t len)
{
    struct call *c = arg;
    struct sync *sy = c->sy;
    int pi = c->peer;
    uint64_t asked = c->u.hq.from;
    uint32_t max = c->u.hq.max;
    struct bs_headers_rep rep;
    const uint8_t *hdrs;
    const char *why;

    call_put(sy, c);
    if (sy->hdr_peer != pi || sy->peers[pi].st != P_READY)
        return;
    sy->hdr_flight = false;
    if (status < 0) {
        peer_drop(sy, pi, tern_strerror(status));
        return;
    }
    if (bs_headers_rep_decode(reply, len, &rep, &hdrs, &why) < 0) {
        peer_drop(sy, pi, why);
        return;
    }
    if (rep.from != asked || rep.n > max) {
        peer_drop(sy, pi, "headers for other heights than asked");
        return;
    }
    if (sy->fork_search) {
        fork_found(sy, pi, &rep, hdrs);
        return;
    }
    if (rep.n == 0) {
        peer_drop(sy, pi, "a head it cannot serve");
        return;
    }
    if (rep.from != sy->hdr_top)
        return;                      /* the ring moved (a fork was cut) */
    for (uint32_t i = 0; i < rep.n; i++) {
        const uint8_t *hb = hdrs + (size_t)i * BS_HDR_SIZE;
        uint64_t h = rep.from + i;
        uint8_t parent[BS_ID_LEN];
        struct bs_header hd;

        if (bs_header_decode(hb, BS_HDR_SIZE, &hd, &why) < 0) {
            peer_drop(sy, pi, why);
            return;
        }
        if (hd.chain != sy->self.chain) {
            peer_drop(sy, pi, "header of another chain");
            return;
        }
        if (hd.height != h) {
            peer_drop(sy, pi, "headers out of order");
            return;
        }
        parent_id_of(sy, h, parent);
        if (memcmp(hd.parent, parent, BS_ID_LEN)) {
            if (i == 0 && h == bs_store_top(sy->st) && h > bs_store_irreversible(sy->st) &&
                sy->r_n == 0) {
                sy->fork_search = true;  /* ours and theirs part below */
                return;
            }
            peer_drop(sy, pi, "wrong parent");
            return;
        }
        memcpy(sy->hdr[hix(h)], hb, BS_HDR_SIZE);
        if (bs_header_id(sy->ck.hs, hb, sy->hid[hix(h)]) < 0) {
            sy->fatal = TERN_EIO;
            return;
        }
        sy->hlen[hix(h)] = BS_HDR_SIZE + hd.body_len;
        sy->hdr_top = h + 1;
    }
}

/* ---- ranges ---- */

static void range_done(void *arg, int status, const void *reply, size_t len);

/* Ask for [off, off+want) of range k. false when no call could be made
 * now (retried later). */
static bool ask_part(struct sync *sy, int k, uint64_t off, uint64_t want)
{
    struct range *r = &sy->slots[k];
    struct peer *p = &sy->peers[r->peer];
    struct call *c = call_get(sy, C_RANGE, r->peer);
    int rc;

    if (!c)
        return false;
    c->slot = k;
    c->gen = r->gen;
    c->off = off;
    c->want = (uint32_t)want;
    c->u.rq = (struct bs_range_req){.from = r->from, .to = r->to, .off = off,
                                    .max = (uint32_t)want};
    if (p->put_ok) {
        c->u.rq.flags = BS_RANGE_PUT;
        c->u.rq.dst = p->rkey;
        c->u.rq.roff = r->area_off + off;
    }
    rc = tern_call(p->s, BS_SERVICE_ID, BS_M_RANGE, &c->u.rq, sizeof(c->u.rq),
                   sy->o.call_timeout_ns, range_done, c, NULL);
    if (rc < 0) {
        call_put(sy, c);
        if (rc != TERN_ENOBUFS)
            peer_drop(sy, r->peer, tern_strerror(rc));
        return false;
    }
    r->calls++;
    return true;
}

static void pump_range(struct sync *sy, int k)
{
    struct range *r = &sy->slots[k];

    while (r->state == R_FLIGHT && r->next_off < r->span_len && r->calls < CALLS_PER_RANGE) {
        struct peer *p = &sy->peers[r->peer];
        uint64_t want = r->span_len - r->next_off;
        uint64_t cap = p->put_ok ? (1u << 30) : p->call_bytes - sizeof(struct bs_range_rep);

        if (want > cap)
            want = cap;
        if (!ask_part(sy, k, r->next_off, want))
            return;
        r->next_off += want;
    }
}

static bool send_range(struct sync *sy, int k, int pi)
{
    struct range *r = &sy->slots[k];
    struct peer *p = &sy->peers[pi];
    uint64_t off;

    if (!area_take(&p->area, r->span_len, &off))
        return false;
    area_push(&p->area, k);
    r->peer = pi;
    r->area_off = off;
    r->buf = p->area.mem + off;
    r->freed = false;
    r->gen++;
    r->next_off = r->got = 0;
    r->calls = 0;
    r->t_sent = r->t_progress = tern_now_ns();
    r->state = R_FLIGHT;
    p->inflight++;
    pump_range(sy, k);
    return true;
}

static int pick_peer(struct sync *sy, uint64_t to)
{
    int best = -1;

    for (unsigned i = 0; i < sy->n_peers; i++) {
        struct peer *p = &sy->peers[i];

        if (p->st != P_READY || p->hello.head < to || p->inflight >= sy->o.depth)
            continue;
        if (best < 0 || p->inflight < sy->peers[best].inflight ||
            (p->inflight == sy->peers[best].inflight && p->rate > sy->peers[best].rate))
            best = (int)i;
    }
    return best;
}

static void range_received(struct sync *sy, struct range *r)
{
    struct peer *p = &sy->peers[r->peer];
    uint64_t dt = tern_now_ns() - r->t_sent + 1;
    double rate = (double)r->span_len / (double)dt;
    double bdp;

    atomic_store_explicit(&r->state, R_RECEIVED, memory_order_release);
    if (sy->n_workers)
        sem_post(&sy->work);
    tern_rpc_stop(sy->ep);           /* an idle loop's wait ends: work came */
    p->inflight--;
    p->range_ns = p->range_ns ? (p->range_ns * 3 + dt) / 4 : dt;
    p->rate = p->rate > 0 ? (p->rate * 3 + rate) / 4 : rate;
    /* Ranges of about the link's bandwidth x round trip per range in
     * flight, within the bounds. */
    bdp = p->rate * (double)p->rtt_ns * sy->o.depth;
    p->range_bytes = bdp < (double)sy->o.range_min ? sy->o.range_min
                   : bdp > (double)sy->o.range_max ? sy->o.range_max : (uint64_t)bdp;
    sy->range_ns_all = sy->range_ns_all ? (sy->range_ns_all * 7 + dt) / 8 : dt;
    /* The stall timeout, doubled by each stall drop, halves back every
     * 16 ranges that arrive. */
    if (sy->stall_doublings && ++sy->since_stall >= 16) {
        sy->stall_doublings--;
        sy->since_stall = 0;
    }
}

static void range_done(void *arg, int status, const void *reply, size_t len)
{
    struct call *c = arg;
    struct sync *sy = c->sy;
    struct range *r = &sy->slots[c->slot];
    struct peer *p = &sy->peers[c->peer];
    uint64_t off = c->off, want = c->want;
    uint32_t gen = c->gen;
    struct bs_range_rep rep;
    const uint8_t *bytes;
    const char *why;

    call_put(sy, c);
    if (gen != r->gen || r->state != R_FLIGHT || p->st != P_READY)
        return;
    r->calls--;
    if (status < 0) {
        peer_drop(sy, c->peer, tern_strerror(status));
        return;
    }
    if (bs_range_rep_decode(reply, len, &rep, &bytes, &why) < 0) {
        peer_drop(sy, c->peer, why);
        return;
    }
    if (rep.span_len != r->span_len) {
        peer_drop(sy, c->peer, "a range of another length (truncated or padded)");
        return;
    }
    if (rep.off != off || rep.n > want || rep.n == 0) {
        peer_drop(sy, c->peer, "a reply for another part of the range");
        return;
    }
    if (bytes)
        memcpy(r->buf + off, bytes, rep.n);
    else
        p->ps->bytes_put += rep.n;
    r->got += rep.n;
    r->t_progress = tern_now_ns();
    if (rep.n < want) {
        /* The peer's replies are shorter than asked: ask the rest, and
         * ask for no more than this from now on. */
        if (bytes && rep.n + sizeof(rep) < p->call_bytes)
            p->call_bytes = rep.n + sizeof(rep);
        if (!ask_part(sy, c->slot, off + rep.n, want - rep.n)) {
            if (p->st == P_READY)    /* no call slot: give the range back */
                peer_drop(sy, c->peer, "out of call slots");
            return;
        }
    }
    if (r->got == r->span_len)
        range_received(sy, r);
    else
        pump_range(sy, c->slot);
}

static int grow_scratch(struct checker *ck, size_t n)
{
    if (n <= ck->cap)
        return 0;
    const uint8_t **b = realloc(ck->blocks, n * sizeof(*b));
    if (b)
        ck->blocks = b;
    uint32_t *l = realloc(ck->lens, n * sizeof(*l));
    if (l)
        ck->lens = l;
    if (!b || !l)
        return TERN_ENOMEM;
    ck->cap = n;
    return 0;
}

static void checker_free(struct checker *ck)
{
    bs_hasher_free(ck->hs);
    free(ck->blocks);
    free(ck->lens);
}

static void set_bad(struct range *r, const char *why)
{
    r->why = why;
    atomic_store_explicit(&r->state, R_BAD, memory_order_release);
}

/* Check a range this thread took (CHECKING): framing, each block's header
 * against the header chain, each body against its header's root. Reads
 * the range, its buffer and the header ring at its heights, which nobody
 * changes while it is CHECKING. A failure to check at all (memory,
 * libcrypto) is the run's: *fatal. */
static void check_range_body(struct sync *sy, struct checker *ck, struct range *r, int *fatal);

static void check_range(struct sync *sy, struct checker *ck, struct range *r, int *fatal)
{
    uint64_t t0 = tern_now_ns();

    check_range_body(sy, ck, r, fatal);
    atomic_fetch_add_explicit(&sy->check_ns, tern_now_ns() - t0, memory_order_relaxed);
}

static void check_range_body(struct sync *sy, struct checker *ck, struct range *r, int *fatal)
{
    uint64_t n = r->to - r->from, bad;
    const char *why;
    int rc = grow_scratch(ck, n);

    if (rc < 0)
        goto fail;
    if (bs_span_walk(r->buf, r->span_len, r->from, r->to, ck->blocks, ck->lens, &bad, &why) < 0) {
        set_bad(r, why);
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint8_t root[BS_ID_LEN];
        struct bs_block b;

        if (memcmp(ck->blocks[i], sy->hdr[hix(r->from + i)], BS_HDR_SIZE)) {
            set_bad(r, "a block that is not its header's (bad hash)");
            return;
        }
        if (bs_block_parse(ck->blocks[i], ck->lens[i], &b, &why) < 0) {
            rc = TERN_EPROTO;        /* the walk parsed it */
            goto fail;
        }
        if ((rc = bs_merkle_root(ck->hs, &b, root)) < 0)
            goto fail;
        if (memcmp(root, b.h.merkle, BS_ID_LEN)) {
            set_bad(r, "bad merkle root");
            return;
        }
    }
    atomic_store_explicit(&r->state, R_VALID, memory_order_release);
    return;
fail:
    *fatal = rc;
    set_bad(r, "could not be checked");
}

static bool take(struct range *r)
{
    int want = R_RECEIVED;

    return atomic_compare_exchange_strong(&r->state, &want, R_CHECKING);
}

static void *worker(void *arg)
{
    struct checker *ck = arg;
    struct sync *sy = ck->sy;

    for (;;) {
        int fatal = 0;

        while (sem_wait(&sy->work) < 0)
            ;                        /* EINTR */
        if (atomic_load(&sy->quit))
            return NULL;
        for (unsigned k = 0; k < NSLOTS; k++) {
            struct range *r = &sy->slots[k];

            if (atomic_load_explicit(&r->state, memory_order_acquire) == R_RECEIVED && take(r)) {
                check_range(sy, ck, r, &fatal);
                if (atomic_load(&sy->sleeping)) {
                    uint64_t one = 1;
                    if (write(sy->evfd, &one, sizeof(one)) < 0) {
                        /* full: the loop is woken already */
                    }
                }
                break;
            }
        }
        if (fatal)
            atomic_store(&sy->wfatal, fatal);
    }
}

static int workers_start(struct sync *sy, unsigned n)
{
    if (n > sizeof(sy->threads) / sizeof(sy->threads[0]))
        n = sizeof(sy->threads) / sizeof(sy->threads[0]);
    if (sem_init(&sy->work, 0, 0) < 0)
        return TERN_ENOMEM;
    sy->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (sy->evfd < 0)
        return TERN_ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        struct checker *ck = &sy->wck[i];

        ck->sy = sy;
        ck->hs = bs_hasher_new();
        if (!ck->hs || pthread_create(&sy->threads[i], NULL, worker, ck) != 0) {
            bs_hasher_free(ck->hs);
            ck->hs = NULL;
            return i ? 0 : TERN_ENOMEM;   /* fewer workers: fine; none: the loop checks */
        }
        sy->n_workers = i + 1;
    }
    return 0;
}

static void workers_stop(struct sync *sy)
{
    atomic_store(&sy->quit, true);
    for (unsigned i = 0; i < sy->n_workers; i++)
        sem_post(&sy->work);
    for (unsigned i = 0; i < sy->n_workers; i++) {
        pthread_join(sy->threads[i], NULL);
        checker_free(&sy->wck[i]);
    }
    sy->n_workers = 0;
    sem_destroy(&sy->work);
    if (sy->evfd >= 0)
        close(sy->evfd);
    sy->evfd = -1;
}

static int commit_now(struct sync *sy)
{
    uint64_t lib, head = best_head(sy, &lib), c;
    int rc = bs_store_commit(sy->st);

    (void)head;
    if (rc < 0)
        return rc;
    sy->pending_bytes = 0;
    c = bs_store_committed(sy->st);
    if (lib > c)
        lib = c;
    return bs_store_set_irreversible(sy->st, lib);
}

/* Append the checked ranges at the front, in order; commit in batches. */
static int commit_front_body(struct sync *sy);

static int commit_front(struct sync *sy)
{
    uint64_t t0;
    int rc;

    if (!sy->r_n ||
        atomic_load_explicit(&slot_at(sy, 0)->state, memory_order_acquire) != R_VALID)
        return 0;
    t0 = tern_now_ns();
    rc = commit_front_body(sy);
    sy->commit_ns += tern_now_ns() - t0;
    return rc;
}

static int commit_front_body(struct sync *sy)
{
    const char *why;
    uint64_t bad;
    int rc;

    while (sy->r_n &&
           atomic_load_explicit(&slot_at(sy, 0)->state, memory_order_acquire) == R_VALID) {
        struct range *r = slot_at(sy, 0);
        struct peer *p = &sy->peers[r->peer];
        uint64_t n = r->to - r->from;

        if ((rc = grow_scratch(&sy->ck, n)) < 0)
            return rc;
        if (bs_span_walk(r->buf, r->span_len, r->from, r->to, sy->ck.blocks, sy->ck.lens, &bad,
                         &why) < 0)
            return TERN_EPROTO;      /* checked before */
        for (uint64_t i = 0; i < n; i++) {
            rc = bs_store_append(sy->st, sy->ck.blocks[i], sy->ck.lens[i],
                                 sy->hid[hix(r->from + i)]);
            if (rc < 0) {
                tern_log(TERN_LOG_ERROR, "sync", "append of height %llu: %s",
                         (unsigned long long)(r->from + i), tern_strerror(rc));
                return rc;
            }
        }
        p->ps->ranges++;
        p->ps->bytes += r->span_len;
        sy->stats->ranges++;
        sy->stats->blocks += n;
        sy->stats->bytes += r->span_len;
        sy->pending_bytes += r->span_len;
        sy->window_used -= r->span_len;
        range_release_area(sy, r);
        atomic_store_explicit(&r->state, R_FREE, memory_order_relaxed);
        sy->r_head = (sy->r_head + 1) % NSLOTS;
        sy->r_n--;
        if (sy->pending_bytes >= sy->o.commit_bytes && (rc = commit_now(sy)) < 0)
            return rc;
    }
    if (sy->pending_bytes)
        return commit_now(sy);
    return 0;
}

static void assign(struct sync *sy)
{
    uint64_t limit_all = sy->hdr_top < sy->target ? sy->hdr_top : sy->target;

    sy->window_full = sy->r_n == NSLOTS || sy->window_used >= sy->o.window;
    for (unsigned k = 0; k < sy->r_n; k++) {
        struct range *r = slot_at(sy, k);
        int pi;

        if (r->state != R_WANT || (pi = pick_peer(sy, r->to)) < 0)
            continue;
        send_range(sy, (int)(r - sy->slots), pi);
    }
    while (sy->r_n < NSLOTS && sy->next_height < limit_all && sy->window_used < sy->o.window) {
        int pi = pick_peer(sy, sy->next_height + 1);
        uint64_t to = sy->next_height, span = 0, limit;
        struct peer *p;
        struct range *r;
        int k;

        if (pi < 0)
            return;
        p = &sy->peers[pi];
        limit = p->hello.head < limit_all ? p->hello.head : limit_all;
        while (to < limit) {
            uint64_t s = bs_rec_size(sy->hlen[hix(to)]);

            if (span && span + s > p->range_bytes)
                break;
            span += s;
            to++;
        }
        if (sy->window_used && sy->window_used + span > sy->o.window) {
            sy->window_full = true;
            return;
        }
        k = (int)((sy->r_head + sy->r_n) % NSLOTS);
        r = &sy->slots[k];
        r->from = sy->next_height;
        r->to = to;
        r->span_len = span;
        r->peer = -1;
        r->buf = NULL;
        r->gen++;
        r->calls = 0;
        r->why = NULL;
        atomic_store_explicit(&r->state, R_WANT, memory_order_relaxed);
        sy->r_n++;
        sy->window_used += span;
        sy->next_height = to;
        if (!send_range(sy, k, pi))
            return;
    }
}

/* Whether a ready peer other than @pi holds blocks up to @to. */
static bool other_peer_for(const struct sync *sy, int pi, uint64_t to)
{
    for (unsigned i = 0; i < sy->n_peers; i++)
        if ((int)i != pi && sy->peers[i].st == P_READY && sy->peers[i].hello.head >= to)
            return true;
    return false;
}

/* The peer holding the lowest range of a window that cannot move on past
 * its stall timeout is dropped (Bitcoin Core's staller rule). */
static void check_stall(struct sync *sy, uint64_t now)
{
    struct range *r;
    struct peer *p;
    uint64_t limit;
    bool blocked;

    if (!sy->r_n)
        return;
    r = slot_at(sy, 0);
    if (r->state != R_FLIGHT)
        return;
    p = &sy->peers[r->peer];
    /* Eight times what a range takes here (any peer's), at least 100 ms;
     * before any range came, the configured start (2 s). A peer that is
     * slow rather than stalled has its own time, four times over. */
    limit = sy->range_ns_all ? 8 * sy->range_ns_all : sy->o.stall_ns;
    if (limit < STALL_MIN_NS)
        limit = STALL_MIN_NS;
    if (limit < 4 * p->range_ns)
        limit = 4 * p->range_ns;
    limit <<= sy->stall_doublings;
    if (limit > STALL_MAX_NS)
        limit = STALL_MAX_NS;
    /* Silence, not slowness: a peer whose replies keep coming (a link
     * that carries a range in many small parts) is not stalled. */
    if (now - r->t_progress < limit)
        return;
    blocked = sy->window_full || sy->next_height >= (sy->hdr_top < sy->target ? sy->hdr_top : sy->target);
    if (!blocked)
        return;
    /* Dropping the one peer that could send the range again gains
     * nothing (Bitcoin Core, too, names a staller only when another peer
     * could take its blocks): wait longer for it instead. */
    if (!other_peer_for(sy, r->peer, r->to)) {
        r->t_progress = now;
        if (sy->stall_doublings < 10)
            sy->stall_doublings++;
        return;
    }
    tern_log(TERN_LOG_INFO, "sync", "range at %" PRIu64 " silent for %" PRIu64 " ms (limit %" PRIu64 " ms)",
             r->from, (now - r->t_progress) / 1000000, limit / 1000000);
    peer_drop(sy, r->peer, "stalled");
    if (sy->stall_doublings < 10)
        sy->stall_doublings++;
    sy->since_stall = 0;
}

/* ---- the run ---- */

static void fill_stats(struct sync *sy)
{
    struct bs_sync_stats *s = sy->stats;
    uint64_t lib;

    best_head(sy, &lib);
    s->committed = bs_store_committed(sy->st);
    s->target = sy->target;
    s->seconds = (double)(tern_now_ns() - sy->t0) / 1e9;
    s->check_seconds = (double)atomic_load(&sy->check_ns) / 1e9;
    s->commit_seconds = (double)sy->commit_ns / 1e9;
    s->state = s->committed < lib ? BS_SYNC_IRREVERSIBLE
             : s->committed < sy->target || !sy->target_set ? BS_SYNC_HEAD : BS_SYNC_IN_SYNC;
    for (unsigned i = 0; i < sy->n_peers; i++)
        if (sy->peers[i].s && sy->peers[i].st != P_GONE)
            s->peer[i].fabric = tern_session_fabric(sy->peers[i].s);
}

static void progress(struct sync *sy, uint64_t now)
{
    struct bs_sync_progress pr;
    unsigned used = 0;

    if (!sy->o.progress || now - sy->t_progress < sy->o.progress_ns)
        return;
    sy->t_progress = now;
    for (unsigned i = 0; i < sy->n_peers; i++)
        used += sy->peers[i].st == P_READY;
    pr = (struct bs_sync_progress){.committed = bs_store_committed(sy->st),
                                   .target = sy->target, .bytes = sy->stats->bytes,
                                   .seconds = (double)(now - sy->t0) / 1e9, .peers = used};
    sy->o.progress(sy->o.progress_arg, &pr);
}

static int start_peer(struct sync *sy, int i)
{
    struct peer *p = &sy->peers[i];
    struct call *c;
    int rc;

    rc = tern_rpc_connect(sy->ep, p->uri, sy->o.connect_timeout_ns, &p->s);
    if (rc < 0) {
        p->s = NULL;
        peer_drop(sy, i, tern_strerror(rc));
        return 0;
    }
    if ((rc = area_init(sy, p)) < 0)
        return rc;
    p->call_bytes = CALL_BYTES_MAX;
    p->range_bytes = sy->o.range_min;
    if (p->area.mr && (tern_session_caps(p->s) & TERN_TP_CAP_PUT) &&
        tern_rpc_mr_rkey(p->area.mr, p->s, &p->rkey) == 0) {
        p->put_ok = true;
        p->epoch = tern_session_epoch(p->s);
    }
    c = call_get(sy, C_HELLO, i);
    bs_hello_of(sy->st, sy->self.node, &c->u.hello);
    p->st = P_HELLO;
    p->t_hello = tern_now_ns();
    rc = tern_call(p->s, BS_SERVICE_ID, BS_M_HELLO, &c->u.hello, sizeof(c->u.hello),
                   sy->o.call_timeout_ns, hello_done, c, NULL);
    if (rc < 0) {
        call_put(sy, c);
        peer_drop(sy, i, tern_strerror(rc));
    }
    return 0;
}

static void reap_peers(struct sync *sy)
{
    for (unsigned i = 0; i < sy->n_peers; i++) {
        struct peer *p = &sy->peers[i];

        if (p->st != P_DROP)
            continue;
        p->st = P_GONE;
        if (p->s)
            tern_rpc_disconnect(p->s);
        p->s = NULL;
    }
    /* A gone peer's area goes once no range lies in it (ranges it sent
     * whole are still checked and committed from there). */
    for (unsigned i = 0; i < sy->n_peers; i++) {
        struct peer *p = &sy->peers[i];

        if (p->st == P_GONE && p->area.mem && p->area.f_n == 0)
            area_free(&p->area);
    }
}

static void refresh_keys(struct sync *sy)
{
    for (unsigned i = 0; i < sy->n_peers; i++) {
        struct peer *p = &sy->peers[i];

        if (p->st == P_READY && p->put_ok && tern_session_epoch(p->s) != p->epoch) {
            p->epoch = tern_session_epoch(p->s);
            p->put_ok = tern_rpc_mr_rkey(p->area.mr, p->s, &p->rkey) == 0 &&
                        (tern_session_caps(p->s) & TERN_TP_CAP_PUT);
        }
    }
}

/* Wait for the endpoint's fd (a message came) or a worker's word (a range
 * was checked), at most a millisecond; not at all if a worker finished
 * while the loop made up its mind. */
static void idle_wait(struct sync *sy)
{
    struct pollfd pf[2] = {{.fd = tern_rpc_wait_fd(sy->ep), .events = POLLIN},
                           {.fd = sy->evfd, .events = POLLIN}};
    bool done = false;

    atomic_store(&sy->sleeping, true);
    for (unsigned k = 0; k < sy->r_n && !done; k++) {
        int st = atomic_load(&slot_at(sy, k)->state);
        done = st == R_VALID || st == R_BAD;
    }
    if (!done && pf[0].fd >= 0 && tern_rpc_arm(sy->ep) == 0)
        poll(pf, sy->evfd >= 0 ? 2 : 1, 1);
    atomic_store(&sy->sleeping, false);
    if (sy->evfd >= 0) {
        uint64_t v;
        if (read(sy->evfd, &v, sizeof(v)) < 0) {
            /* nothing written: fine */
        }
    }
}

static int run(struct sync *sy)
{
    bool hellos_pending = true;
    int rc;

    for (unsigned i = 0; i < sy->n_peers; i++)
        if ((rc = start_peer(sy, (int)i)) < 0)
            return rc;
    for (;;) {
        uint64_t now, lib;
        unsigned ready = 0;
        int polled;
        unsigned backlog;
        bool busy;

        rc = polled = tern_rpc_poll(sy->ep);
        if (rc < 0 && rc != TERN_EAGAIN)
            tern_log(TERN_LOG_WARN, "sync", "poll: %s", tern_strerror(rc));
        if (sy->fatal)
            return sy->fatal;
        if (sy->o.stop && *sy->o.stop)
            return TERN_ECANCELED;
        reap_peers(sy);
        hellos_pending = false;
        for (unsigned i = 0; i < sy->n_peers; i++) {
            hellos_pending |= sy->peers[i].st == P_HELLO;
            ready += sy->peers[i].st == P_READY;
        }
        if (hellos_pending)
            continue;
        sy->target = best_head(sy, &lib);
        if (sy->o.target && sy->target > sy->o.target)
            sy->target = sy->o.target;
        sy->target_set = true;
        refresh_keys(sy);

        /* Check what arrived (the lowest first: the loop itself when it
         * has no workers, or nothing else to do), drop liars, commit. */
        busy = polled > 0;
        backlog = 0;
        for (unsigned k = 0; k < sy->r_n; k++) {
            struct range *r = slot_at(sy, k);
            int st = atomic_load_explicit(&r->state, memory_order_acquire);

            /* With workers, the loop checks only what they leave waiting
             * (more ranges than workers), the lowest first. */
            if (st == R_RECEIVED && sy->n_workers && ++backlog <= sy->n_workers)
                continue;
            if (st == R_RECEIVED && take(r)) {
                int fatal = 0;
                check_range(sy, &sy->ck, r, &fatal);
                if (fatal)
                    return fatal;
                st = atomic_load_explicit(&r->state, memory_order_acquire);
                busy = true;
            }
            if (st == R_BAD) {
                peer_drop(sy, r->peer, r->why);
                if (atomic_load(&r->state) == R_BAD)    /* its peer was gone already */
                    range_reset(sy, r);
            }
        }
        if ((rc = atomic_load(&sy->wfatal)) < 0)
            return rc;
        if (sy->r_n && atomic_load(&slot_at(sy, 0)->state) == R_VALID)
            busy = true;
        if ((rc = commit_front(sy)) < 0)
            return rc;
        if (!ready)
            return TERN_ENOTCONN;
        if (bs_store_committed(sy->st) >= sy->target)
            return sy->o.target && sy->target < sy->o.target ? TERN_ENOTCONN : 0;
        ask_headers(sy);
        assign(sy);
        if ((++sy->loops & 63) == 0 || polled == 0) {
            now = tern_now_ns();
            check_stall(sy, now);
            progress(sy, now);
        }
        /* Nothing came and nothing was done: wait on the endpoint (in its
         * poll mode: an adaptive one sleeps) rather than spin beside the
         * workers and the peers on this host. A range received ends the
         * wait; one a worker checked waits for the next turn, at most
         * half a millisecond. */
        if (!busy)
            idle_wait(sy);
    }
}

int bs_sync_run(struct tern_rpc_ep *ep, struct bs_store *st, const struct bs_sync_opts *o,
                struct bs_sync_stats *out)
{
    struct bs_sync_stats local;
    struct sync *sy;
    int rc;

    if (!ep || !st || !o || o->n_peers > BS_SYNC_MAX_PEERS)
        return TERN_EINVAL;
    if (!out)
        out = &local;
    memset(out, 0, sizeof(*out));
    sy = calloc(1, sizeof(*sy));
    if (!sy)
        return TERN_ENOMEM;
    sy->ep = ep;
    sy->st = st;
    sy->stats = out;
    sy->o = *o;
    sy->o.depth = (unsigned)dflt(o->depth, 4);
    sy->o.window = dflt(o->window, 64ull << 20);
    sy->o.range_min = dflt(o->range_min, 4ull << 20);
    sy->o.range_max = dflt(o->range_max, 8ull << 20);
    if (sy->o.range_max < sy->o.range_min)
        sy->o.range_max = sy->o.range_min;
    sy->o.commit_bytes = dflt(o->commit_bytes, 16ull << 20);
    sy->o.stall_ns = dflt(o->stall_ns, 2000000000ull);
    sy->o.call_timeout_ns = dflt(o->call_timeout_ns, 60000000000ull);
    sy->o.connect_timeout_ns = dflt(o->connect_timeout_ns, 5000000000ull);
    sy->o.progress_ns = dflt(o->progress_ns, 1000000000ull);
    sy->n_peers = o->n_peers;
    sy->hdr_peer = -1;
    sy->t0 = sy->t_progress = tern_now_ns();
    bs_hello_of(st, o->svc ? bs_service_node(o->svc) : 0, &sy->self);
    while (!sy->self.node)
        sy->self.node = tern_now_ns() * 0x9e3779b97f4a7c15ull;
    sy->hdr = malloc((size_t)HCAP * BS_HDR_SIZE);
    sy->hid = malloc((size_t)HCAP * BS_ID_LEN);
    sy->hlen = malloc((size_t)HCAP * sizeof(*sy->hlen));
    sy->evfd = -1;
    sy->ck.sy = sy;
    sy->ck.hs = bs_hasher_new();
    rc = sy->hdr && sy->hid && sy->hlen && sy->ck.hs ? 0 : TERN_ENOMEM;
    if (rc == 0 && o->workers)
        rc = workers_start(sy, o->workers);
    for (int i = 0; i < NCALLS; i++)
        sy->calls[i].next_free = i + 1 < NCALLS ? i + 1 : -1;
    sy->call_free = 0;
    sy->hdr_top = sy->next_height = bs_store_top(st);
    out->start = bs_store_committed(st);
    out->n_peers = o->n_peers;
    for (unsigned i = 0; i < o->n_peers; i++) {
        sy->peers[i].uri = o->peers[i];
        sy->peers[i].ps = &out->peer[i];
        snprintf(out->peer[i].uri, sizeof(out->peer[i].uri), "%s", o->peers[i]);
    }
    if (o->svc)
        bs_service_set_syncing(o->svc, true);
    if (rc == 0)
        rc = run(sy);
    if (o->svc)
        bs_service_set_syncing(o->svc, false);
    if (sy->n_workers)
        workers_stop(sy);            /* before any buffer they may read goes */
    fill_stats(sy);
    if (rc == 0 && sy->pending_bytes)
        rc = commit_now(sy);
    for (unsigned i = 0; i < sy->n_peers; i++) {
        if (sy->peers[i].s)
            tern_rpc_disconnect(sy->peers[i].s);
        area_free(&sy->peers[i].area);
    }
    out->committed = bs_store_committed(st);
    checker_free(&sy->ck);
    free(sy->hdr);
    free(sy->hid);
    free(sy->hlen);
    free(sy);
    return rc;
}
