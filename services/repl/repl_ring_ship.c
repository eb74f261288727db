/* The primary's side of one-sided shipping (repl_ring.h): a grant per
 * replica, frames written into its ring, and when they count as durable. */
#include <libpmem.h>
#include <string.h>

#include "log.h"
#include "repl_internal.h"

#define STAGE_HEAD (REPL_BATCH_MAX + 2 * REPL_FRAME_ALIGN)   /* the head read back */
#define STAGE_WRAP (STAGE_HEAD + REPL_FRAME_ALIGN)              /* a WRAP frame */
#define STAGE_BYTES (STAGE_HEAD + 4096)

/* Make [at, at+n) of the replica's ring, mapped here, durable there. */
static void flush_direct(const struct repl_ring_peer *q, const void *at, size_t n)
{
    if (q->g.flags & REPL_RING_PMEM)
        pmem_persist(at, n);
    else
        pmem_msync(at, n);
}

const char *repl_ring_path(const struct replica *p)
{
    const struct repl_ring_peer *q = &p->ring;

    if (q->st != RG_ON)
        return NULL;
    return q->by_sync ? "one-sided, synced by call" : "one-sided";
}

void repl_ring_forget(struct replica *p)
{
    struct repl_ring_peer *q = &p->ring;

    q->st = RG_NONE;
    q->nudge = false;
    q->flushing = false;
    q->data = NULL;
    q->headp = NULL;
}

/* Back to APPEND (or to asking for a grant again). */
static void fall_back(struct replica *p, enum repl_ring_state st)
{
    bool was_on = p->ring.st == RG_ON;

    repl_ring_forget(p);
    p->ring.st = st;
    p->ring.sess_epoch = p->s ? tern_session_epoch(p->s) : 0;
    /* Frames out and not confirmed go again, by whatever comes next (the
     * replica answers a gap with where it is). */
    if (was_on)
        p->sent = p->position;
}

static void on_grant(void *arg, int status, const void *reply, size_t len)
{
    struct repl_call *c = arg;
    struct replica *p = c->peer;
    struct repl *r = p->r;
    struct repl_ring_peer *q = &p->ring;
    struct repl_ring_grant g;

    if (c->gen != p->gen)
        return;
    c->busy = false;
    if (status == TERN_ESTALE) {
        repl_step_down(r, TERN_ENOTPRIMARY);
        return;
    }
    if (status < 0 || len != sizeof(g)) {
        /* No ring there (an older node, a ring it could not open): APPEND,
         * for as long as this session lasts. */
        if (tern_log_allow(&p->said))
            tern_log(TERN_LOG_INFO, "repl", "%s: %s gives no ring (%s): shipping by call",
                     r->shard, p->name, status < 0 ? tern_strerror(status) : "bad answer");
        fall_back(p, RG_OFF);
        return;
    }
    memcpy(&g, reply, sizeof(g));
    if (g.size < REPL_RING_MIN || (g.size & (REPL_FRAME_ALIGN - 1)) ||
        (g.head & (REPL_FRAME_ALIGN - 1)) || g.data.len < g.size ||
        g.hdr.len < REPL_RING_HEAD_OFF + sizeof(uint64_t)) {
        tern_log(TERN_LOG_WARN, "repl", "%s: %s granted a ring that cannot be: shipping by "
                 "call", r->shard, p->name);
        fall_back(p, RG_OFF);
        return;
    }
    /* Where the ring is not mapped here and a put and a read cannot make
     * a frame durable without the backup's CPU (a ring on a file; a fabric
     * whose one-sided operations the peer's poll serves), that CPU is on
     * the path anyway: a call does the same work in one message, so AUTO
     * takes that. */
    uint32_t caps = tern_session_caps(p->s);
    uint32_t offload = TERN_TP_CAP_GET | TERN_TP_CAP_RMA_OFFLOAD;

    if (r->ship == REPL_SHIP_AUTO && !(caps & TERN_TP_CAP_RKEY_PTR) &&
        !((g.flags & REPL_RING_PMEM) && (caps & offload) == offload)) {
        fall_back(p, RG_OFF);
        return;
    }
    q->by_sync = !(caps & TERN_TP_CAP_RKEY_PTR) &&
                 !((g.flags & REPL_RING_PMEM) && (caps & TERN_TP_CAP_GET));
    q->g = g;
    q->tail = q->head = g.head;
    q->sess_epoch = tern_session_epoch(p->s);
    q->st = RG_ON;
    /* Every frame before the grant is in its store now. */
    p->position = g.position;
    p->sent = g.position;
    if (!repl_log_has(&r->log, g.position) || g.position > r->log.last) {
        p->state = R_NEED_COPY;
        repl_ring_forget(p);
    }
    repl_advance(r);
}

static void ask_grant(struct repl *r, struct replica *p)
{
    struct repl_call *c = repl_call_slot(p);
    struct repl_ask *a;

    if (!c)
        return;
    a = (struct repl_ask *)c->buf;
    memset(a, 0, sizeof(*a));
    memcpy(a->shard, r->shard, sizeof(a->shard));
    a->epoch = r->epoch;
    c->peer = p;
    c->gen = p->gen;
    c->sent_at = 0;
    if (tern_call(p->s, TERN_REPL_SERVICE_ID, REPL_M_RING, a, sizeof(*a), r->timeout_ns,
                  on_grant, c, NULL) < 0) {
        fall_back(p, RG_OFF);
        return;
    }
    c->busy = true;
    p->ring.st = RG_ASKED;
}

/* A flush came back: what it followed is durable at the replica. */
static void flushed(struct replica *p, uint64_t head)
{
    struct repl *r = p->r;
    struct repl_ring_peer *q = &p->ring;

    q->flushing = false;
    q->head = head;
    /* Sent while the lease was sure; counted only while it still is (in
     * doubt, the replica's word by APPEND is what counts). */
    if (!r->lease_doubt && q->flush_last > p->position)
        p->position = q->flush_last;
    repl_advance(r);
}

static void on_get_flush(void *arg, int status)
{
    struct replica *p = arg;
    struct repl_ring_peer *q = &p->ring;
    uint64_t head;

    if (q->gen != p->gen || !q->flushing)
        return;
    if (status < 0) {
        tern_log(TERN_LOG_WARN, "repl", "%s: ring of %s: %s", p->r->shard, p->name,
                 tern_strerror(status));
        fall_back(p, RG_NONE);
        return;
    }
    memcpy(&head, (uint8_t *)tern_rpc_mr_addr(q->stage) + STAGE_HEAD, sizeof(head));
    flushed(p, head);
}

static void on_put(void *arg, int status)
{
    struct replica *p = arg;
    struct repl_ring_peer *q = &p->ring;

    /* The flush that follows reports success; a failed put fails it. */
    if (status < 0 && q->gen == p->gen && q->flushing) {
        tern_log(TERN_LOG_WARN, "repl", "%s: put to the ring of %s: %s", p->r->shard, p->name,
                 tern_strerror(status));
        fall_back(p, RG_NONE);
    }
}

static void on_sync(void *arg, int status, const void *reply, size_t len)
{
    struct repl_call *c = arg;
    struct replica *p = c->peer;
    struct repl *r = p->r;
    struct repl_ring_peer *q = &p->ring;
    struct repl_pos pos;

    if (c->gen != p->gen)
        return;
    c->busy = false;
    if (status == TERN_ESTALE) {
        repl_step_down(r, TERN_ENOTPRIMARY);
        return;
    }
    if (status < 0 || len != sizeof(pos) || !q->flushing) {
        fall_back(p, RG_NONE);
        return;
    }
    memcpy(&pos, reply, sizeof(pos));
    /* It took every frame up to the tail: its head is there. */
    q->flush_last = pos.position;
    flushed(p, q->tail);
}

/* The frame's room: `span` bytes at the tail, within one lap and behind
 * the backup's head. */
static bool fits(struct repl_ring_peer *q, uint64_t span)
{
    if (q->headp)
        q->head = __atomic_load_n(q->headp, __ATOMIC_ACQUIRE);
    return q->tail + span - q->head <= q->g.size;
}

/* Records after p->sent into a batch at dst (room bytes there at most):
 * the batch's bytes, 0 if the next record does not fit, <0 if the log no
 * longer holds p->sent. */
static long fill(struct repl *r, struct replica *p, uint8_t *dst, uint64_t room, uint64_t *last)
{
    struct repl_batch b = {.epoch = r->epoch, .prev = p->sent, .commit = r->committed};
    long n;

    if (room > REPL_BATCH_MAX)
        room = REPL_BATCH_MAX;
    if (room < sizeof(struct repl_frame) + sizeof(b) + REPL_FRAME_ALIGN)
        return 0;
    room -= sizeof(struct repl_frame) + sizeof(b);
    n = repl_log_read(&r->log, p->sent, dst + sizeof(struct repl_frame) + sizeof(b), room,
                      &b.n, last);
    if (n <= 0 || !b.n)
        return n < 0 ? n : 0;
    memcpy(b.shard, r->shard, sizeof(b.shard));
    b.bytes = (uint32_t)n;
    memcpy(dst + sizeof(struct repl_frame), &b, sizeof(b));
    return (long)sizeof(b) + n;
}

/* Where the frame at the tail goes in this process: the ring mapped here
 * (shm), or NULL (put it from the stage). */
static uint8_t *mapped(struct replica *p, uint64_t span)
{
    struct repl_ring_peer *q = &p->ring;
    void *ptr;
    int rc;

    rc = tern_session_rkey_ptr(p->s, &q->g.data, q->tail % q->g.size, span,
                               TERN_TP_ACCESS_REMOTE_WRITE, &ptr);
    if (rc == TERN_EREMACCESS) {
        fall_back(p, RG_NONE);     /* the grant ended there: ask again */
        return NULL;
    }
    if (rc < 0)
        return NULL;
    if (!q->headp && tern_session_rkey_ptr(p->s, &q->g.hdr, REPL_RING_HEAD_OFF,
                                           sizeof(uint64_t), TERN_TP_ACCESS_REMOTE_READ,
                                           &ptr) == 0) {
        q->headp = ptr;
        rc = tern_session_rkey_ptr(p->s, &q->g.data, q->tail % q->g.size, span,
                                   TERN_TP_ACCESS_REMOTE_WRITE, &ptr);
        if (rc < 0)
            return NULL;
    }
    q->data = ptr;
    return ptr;
}

/* A frame straight into the replica's memory, flushed from here. */
static void ship_direct(struct repl *r, struct replica *p, uint8_t *at, uint32_t len,
                        uint64_t last)
{
    struct repl_ring_peer *q = &p->ring;
    uint64_t span = repl_frame_span(len);

    repl_frame_seal(at, q->g.gen, q->tail, REPL_FRAME_BATCH, len);
    flush_direct(q, at, span);
    q->tail += span;
    q->frames++;
    q->direct++;
    p->sent = last;
    if (last > p->position)
        p->position = last;
    r->st_shipped++;
}

/* A frame by put from the stage, then its flush. */
static int ship_put(struct repl *r, struct replica *p, uint32_t len, uint64_t last,
                    bool wrap)
{
    struct repl_ring_peer *q = &p->ring;
    size_t from = wrap ? STAGE_WRAP : 0;
    uint8_t *stage = (uint8_t *)tern_rpc_mr_addr(q->stage) + from;
    uint64_t span = wrap ? sizeof(struct repl_frame) : repl_frame_span(len);
    uint32_t caps = tern_session_caps(p->s);
    int rc;

    /* A WRAP frame has its own place in the stage: the frame put after it
     * may be filled while it is still out. */
    repl_frame_seal(stage, q->g.gen, q->tail, wrap ? REPL_FRAME_WRAP : REPL_FRAME_BATCH,
                    wrap ? 0 : len);
    rc = tern_session_put(p->s, q->stage, from, span, &q->g.data, q->tail % q->g.size, on_put,
                          p);
    if (rc < 0)
        return rc;
    q->gen = p->gen;
    q->puts++;
    q->tail += wrap ? q->g.size - q->tail % q->g.size : span;
    if (wrap)
        return 0;
    q->frames++;
    q->flushing = true;
    q->flush_last = last;
    p->sent = last;
    r->st_shipped++;
    if ((q->g.flags & REPL_RING_PMEM) && (caps & TERN_TP_CAP_GET))
        return tern_session_get(p->s, q->stage, STAGE_HEAD, sizeof(uint64_t), &q->g.hdr,
                                REPL_RING_HEAD_OFF, on_get_flush, p);
    struct repl_call *c = repl_call_slot(p);
    struct repl_ask *a;

    if (!c)
        return TERN_ENOBUFS;
    a = (struct repl_ask *)c->buf;
    memset(a, 0, sizeof(*a));
    memcpy(a->shard, r->shard, sizeof(a->shard));
    a->epoch = r->epoch;
    a->from = q->tail;
    c->peer = p;
    c->gen = p->gen;
    c->sent_at = 0;
    rc = tern_call(p->s, TERN_REPL_SERVICE_ID, REPL_M_RING_SYNC, a, sizeof(*a), r->timeout_ns,
                   on_sync, c, NULL);
    if (rc == 0)
        c->busy = true;
    return rc;
}

/* The head, read back by get when the ring is not mapped here. */
static void on_head(void *arg, int status)
{
    struct replica *p = arg;
    struct repl_ring_peer *q = &p->ring;

    if (q->gen != p->gen || !q->flushing)
        return;
    q->flushing = false;
    if (status < 0) {
        fall_back(p, RG_NONE);
        return;
    }
    memcpy(&q->head, (uint8_t *)tern_rpc_mr_addr(q->stage) + STAGE_HEAD, sizeof(q->head));
}

bool repl_ring_ship(struct repl *r, struct replica *p)
{
    struct repl_ring_peer *q = &p->ring;

    if (r->ship == REPL_SHIP_CALL)
        return false;
    /* An auto:// session that moved has other caps and keys: judge anew. */
    if (q->st != RG_NONE && !q->flushing && q->sess_epoch != tern_session_epoch(p->s))
        fall_back(p, RG_NONE);
    if (q->st == RG_OFF)
        return false;
    if (p->state != R_STREAM) {
        /* A copy ends any grant there: ask again once it streams. */
        if (!q->flushing)
            q->st = RG_NONE;
        return false;
    }
    if (r->lease_doubt)
        return q->flushing;
    if (q->st == RG_ON && q->sess_epoch != tern_session_epoch(p->s))
        return true;                /* a flush is out: its completion comes first */
    if (q->st == RG_NONE) {
        uint32_t caps = tern_session_caps(p->s);

        if (!(caps & TERN_TP_CAP_PUT)) {
            fall_back(p, RG_OFF);
            return false;
        }
        if (repl_busy_calls(p))
            return true;            /* APPENDs out: the grant must follow them */
        ask_grant(r, p);
        return q->st == RG_ASKED;
    }
    if (q->st == RG_ASKED || q->flushing)
        return true;
    bool shipped = false;

    while (p->sent < r->log.last && q->st == RG_ON && !q->flushing) {
        uint64_t off = q->tail % q->g.size, lap = q->g.size - off, room;
        uint64_t last = 0;
        uint8_t *at;
        long n;

        room = lap;
        if (!fits(q, REPL_FRAME_ALIGN)) {
            if (!q->headp)
                goto read_head;
            /* Full: the replica takes frames on its next pass, which may
             * be a sleep away (stores wake nobody); a call wakes it. */
            q->nudge = true;
            return true;
        }
        if (q->head + q->g.size - q->tail < room)
            room = q->head + q->g.size - q->tail;
        at = mapped(p, room);
        if (q->st != RG_ON)
            return false;
        if (!at) {
            if (!q->stage && tern_rpc_mr_alloc(r->h->ep, STAGE_BYTES, TERN_TP_ACCESS_LOCAL,
                                               &q->stage) < 0) {
                fall_back(p, RG_OFF);
                return false;
            }
            if (tern_session_rma_max(p->s) && room > tern_session_rma_max(p->s))
                room = tern_session_rma_max(p->s) & ~(uint64_t)(REPL_FRAME_ALIGN - 1);
        }
        n = fill(r, p, at ? at : tern_rpc_mr_addr(q->stage), room, &last);
        if (n < 0)
            return false;           /* past the log: ship() finds the replica a copy */
        if (n == 0) {
            /* The next record is not here before the lap's end: wrap, if
             * the ring could ever hold it. */
            if (room == lap && lap == q->g.size) {
                fall_back(p, RG_OFF);   /* larger than the ring: by call */
                return false;
            }
            if (room < lap) {
                q->nudge = q->headp != NULL;
                goto read_head;         /* behind the head: wait for room */
            }
            if (at) {
                repl_frame_seal(at, q->g.gen, q->tail, REPL_FRAME_WRAP, 0);
                flush_direct(q, at, sizeof(struct repl_frame));
                q->tail += lap;
            } else if (ship_put(r, p, 0, 0, true) < 0) {
                fall_back(p, RG_NONE);
                return false;
            }
            continue;
        }
        if (at) {
            ship_direct(r, p, at, (uint32_t)n, last);
            shipped = true;
        } else if (ship_put(r, p, (uint32_t)n, last, false) < 0) {
            fall_back(p, RG_NONE);
            return false;
        }
    }
    if (shipped)
        repl_advance(r);
    return true;
read_head:
    if (q->headp || q->flushing)
        return true;
    if (!q->stage)
        return true;
    q->gen = p->gen;
    q->flushing = true;
    q->flush_last = p->position;
    if (tern_session_get(p->s, q->stage, STAGE_HEAD, sizeof(uint64_t), &q->g.hdr,
                         REPL_RING_HEAD_OFF, on_head, p) < 0) {
        q->flushing = false;
        fall_back(p, RG_NONE);
        return false;
    }
    return true;
}

void repl_ring_ship_now(struct repl *r)
{
    for (unsigned i = 0; i < r->n_peers; i++) {
        struct replica *p = &r->peers[i];
        struct repl_ring_peer *q = &p->ring;

        /* Streaming with nothing out, mapped or synced by a read:
         * repl_ring_ship then only stores and flushes, or puts and reads
         * (or reads the head of a full ring), or marks the ring full for
         * the pass. */
        if (p->s && p->state == R_STREAM && q->st == RG_ON && (q->headp || !q->by_sync) &&
            !q->flushing && q->sess_epoch == tern_session_epoch(p->s) && !r->lease_doubt)
            repl_ring_ship(r, p);
    }
}
