/* The replication service on an endpoint (repl_host) and what a replica
 * does with the messages it gets: APPEND, POSITION, FETCH (repl_wire.h).
 * Each checks the request whole before acting on any of it, refuses an
 * epoch older than the newest it has seen (TERN_ESTALE), and records a
 * newer one durably before it answers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repl_internal.h"

static struct repl *find(struct repl_host *h, const char *shard)
{
    for (struct repl *r = h->groups; r; r = r->next)
        if (!strcmp(r->shard, shard))
            return r;
    return NULL;
}

/* Admit a request at `epoch`: 0, or TERN_ESTALE. A newer epoch is made
 * durable first, and deposes this node if it thought itself primary. */
static int admit(struct repl *r, uint64_t epoch)
{
    int rc;

    if (epoch < r->seen || epoch > REPL_EPOCH_MAX) {
        r->st_stale++;
        return TERN_ESTALE;
    }
    if ((r->st == S_PRIMARY || r->st == S_TAKEOVER) && epoch >= r->epoch) {
        /* Two primaries of one epoch cannot be: etcd gave each epoch once. */
        if (epoch == r->epoch)
            return TERN_EPROTO;
        repl_step_down(r, TERN_ENOTPRIMARY);
    }
    if (epoch > r->seen) {
        rc = repl_see_epoch(r, epoch);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The group a request names, once its epoch is admitted: 0, TERN_ENOENT
 * (no such shard here), or admit's refusal. */
static int group_of(struct repl_host *h, const char *shard, uint64_t epoch, struct repl **out)
{
    *out = find(h, shard);
    if (!*out)
        return TERN_ENOENT;
    /* Frames a primary put into the ring came before this request: they
     * count first (its position, a gap, a fence all depend on them). */
    repl_ring_drain(*out);
    return admit(*out, epoch);
}

/* A record that follows (repl_internal.h). */
int repl_take_rec(void *arg, const struct repl_rec *h, const void *key, const void *val)
{
    struct repl_apply_ctx *a = arg;
    struct repl *r = a->r;
    int rc;

    /* Held already: a ring's frame taken again after a crash between the
     * store's sync and the head's move (an APPEND never holds one). */
    if (h->version <= r->position)
        return 0;
    rc = r->ops->apply(r->ctx, h->type, key, h->key_len, val, h->val_len, h->version);
    if (rc < 0) {
        a->rc = rc;
        return 1;
    }
    /* Kept for a primary-to-be that may need to hand it on. */
    if (repl_log_add(&r->log, h->type, h->version, key, h->key_len, val, h->val_len) < 0)
        repl_log_reset(&r->log, h->version);
    r->position = h->version;
    r->st_applied++;
    return 0;
}

/* A heartbeat (no records) sent before frames this replica has taken from
 * the primary's ring since: behind, but no gap. Versions of one epoch come
 * from its one primary, and are taken in order, so a position at the
 * heartbeat's epoch past its `prev` holds only that primary's records.
 * Said to be a gap, it would cost the primary its grant at every full
 * ring (it forgets the ring and asks again). */
static bool heartbeat_behind(const struct repl *r, const struct repl_batch *b)
{
    return !b->n && b->epoch == r->seen && b->prev < r->position &&
           repl_epoch_of(b->prev) == b->epoch && repl_epoch_of(r->position) == b->epoch;
}

int repl_apply_batch(struct repl *r, const void *data, size_t len, struct repl_pos *pos)
{
    struct repl_batch b;
    struct repl_apply_ctx a = {.r = r};
    int rc = repl_batch_walk(data, len, &b, NULL, NULL);

    memset(pos, 0, sizeof(*pos));
    if (rc < 0)
        return rc;
    if (b.prev != r->position && !heartbeat_behind(r, &b)) {
        pos->flags = REPL_GAP;
    } else if (b.n) {
        rc = repl_batch_walk(data, len, NULL, repl_take_rec, &a);
        /* What was applied is made durable even if a record failed: the
         * position says how far it got. */
        int src = r->ops->sync(r->ctx);

        if (a.rc < 0)
            rc = a.rc;
        else if (src < 0)
            rc = src;
        if (src < 0)
            r->position = r->ops->position(r->ctx);
    }
    /* A full copy is whole once the stream passed every version it brought. */
    if (r->copying && r->copy_ended && r->position >= r->copy_high && rc == 0)
        repl_state_save(r, r->seen, false);
    pos->epoch = r->seen;
    pos->position = r->position;
    return rc < 0 ? rc : 0;
}

static int reply_pos(struct tern_req *req, const struct repl *r, uint32_t flags)
{
    struct repl_pos *out = tern_reply_alloc(req, sizeof(*out));

    if (!out)
        return TERN_EMSGSIZE;
    *out = (struct repl_pos){.epoch = r->seen, .position = r->position, .flags = flags};
    return 0;
}

static int h_append(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct repl_host *h = ctx;
    struct repl_batch b;
    struct repl_pos pos;
    struct repl *r;
    int rc = repl_batch_walk(data, len, &b, NULL, NULL);

    if (rc == 0)
        rc = group_of(h, b.shard, b.epoch, &r);
    if (rc < 0)
        return rc;
    rc = repl_apply_batch(r, data, len, &pos);
    if (rc < 0)
        return rc;
    /* Caught up with the primary's stream: this replica may stand. */
    if (!(pos.flags & REPL_GAP) && b.epoch == r->seen && r->position >= b.commit &&
        !r->copying)
        r->synced = true;
    return reply_pos(req, r, pos.flags);
}

static int parse_ask(const void *data, size_t len, struct repl_ask *a)
{
    if (len != sizeof(*a))
        return TERN_EPROTO;
    memcpy(a, data, sizeof(*a));
    if (repl_shard_ok(a->shard) < 0 || a->flags)
        return TERN_EPROTO;
    return 0;
}

static int h_position(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct repl_host *h = ctx;
    struct repl_ask a;
    struct repl *r;
    int rc = parse_ask(data, len, &a);

    if (rc == 0)
        rc = group_of(h, a.shard, a.epoch, &r);
    if (rc < 0)
        return rc;
    /* A copy coming in is no position to build on: another primary
     * starts its own. */
    if (r->copying) {
        struct repl_pos *out = tern_reply_alloc(req, sizeof(*out));

        if (!out)
            return TERN_EMSGSIZE;
        *out = (struct repl_pos){.epoch = r->seen, .flags = REPL_NEED_COPY};
        return 0;
    }
    return reply_pos(req, r, r->need_copy ? REPL_NEED_COPY : 0);
}

/* A record of a full copy: written under its own version, whatever the
 * order (the newer one of a key wins). */
static int copy_one(void *arg, const struct repl_rec *h, const void *key, const void *val)
{
    struct repl_apply_ctx *a = arg;
    struct repl *r = a->r;
    int rc = r->ops->apply(r->ctx, h->type, key, h->key_len, val, h->val_len, h->version);

    if (rc < 0) {
        a->rc = rc;
        return 1;
    }
    if (h->version > r->copy_high)
        r->copy_high = h->version;
    r->st_applied++;
    return 0;
}

static int h_copy(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct repl_host *h = ctx;
    struct repl_apply_ctx a;
    struct repl_copy c;
    struct repl *r;
    int rc = repl_copy_walk(data, len, &c, NULL, NULL);

    if (rc == 0)
        rc = group_of(h, c.shard, c.epoch, &r);
    if (rc < 0)
        return rc;
    if (r->st == S_PRIMARY || r->st == S_TAKEOVER)
        return TERN_EPROTO;     /* a primary of the same epoch: cannot be */
    switch (c.phase) {
    case REPL_COPY_BEGIN:
        repl_ring_retire(r);    /* no frame may land on the copy */
        /* Said durably first: a crash from here on wipes it again. */
        rc = repl_state_save(r, r->seen, true);
        if (rc == 0)
            rc = r->ops->wipe(r->ctx);
        if (rc < 0)
            return rc;
        r->copy_epoch = c.epoch;
        r->synced = false;
        r->copy_high = 0;
        r->copy_ended = false;
        r->position = 0;
        repl_log_reset(&r->log, 0);
        r->st_copies_taken++;
        break;
    case REPL_COPY_CHUNK:
        if (!r->copying || r->copy_ended || r->copy_epoch != c.epoch)
            return TERN_EINVAL;
        a = (struct repl_apply_ctx){.r = r};
        rc = repl_copy_walk(data, len, NULL, copy_one, &a);
        if (a.rc < 0)
            rc = a.rc;
        if (rc == 0)
            rc = r->ops->sync(r->ctx);
        if (rc < 0)
            return rc;
        break;
    default:
        if (!r->copying || r->copy_ended || r->copy_epoch != c.epoch)
            return TERN_EINVAL;
        rc = r->ops->sync(r->ctx);
        if (rc < 0)
            return rc;
        r->copy_ended = true;
        r->position = c.snap;
        repl_log_reset(&r->log, c.snap);
        if (r->copy_high <= c.snap)
            repl_state_save(r, r->seen, false);
        tern_log(TERN_LOG_INFO, "repl", "%s: full copy taken, at %llx", r->shard,
                 (unsigned long long)c.snap);
        break;
    }
    return reply_pos(req, r, 0);
}

static int h_fetch(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct repl_host *h = ctx;
    struct repl_batch b = {0};
    struct repl_ask a;
    struct repl *r;
    size_t cap;
    uint8_t *out;
    uint64_t last;
    long n;
    int rc = parse_ask(data, len, &a);

    if (rc == 0)
        rc = group_of(h, a.shard, a.epoch, &r);
    if (rc < 0)
        return rc;
    if (!repl_log_has(&r->log, a.from))
        return TERN_ERANGE;
    cap = tern_reply_max(req);
    if (a.max && a.max < cap)
        cap = a.max;
    if (cap < sizeof(b) + 32)
        return TERN_EINVAL;
    out = tern_reply_alloc(req, cap);
    if (!out)
        return TERN_EMSGSIZE;
    n = repl_log_read(&r->log, a.from, out + sizeof(b), cap - sizeof(b), &b.n, &last);
    if (n < 0)
        return (int)n;
    memcpy(b.shard, r->shard, sizeof(b.shard));
    b.epoch = r->seen;
    b.prev = a.from;
    b.bytes = (uint32_t)n;
    memcpy(out, &b, sizeof(b));
    tern_reply_set_len(req, sizeof(b) + (size_t)n);
    return 0;
}

static int h_ring(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct repl_host *h = ctx;
    struct repl_ring_grant *out, g;
    struct repl_ask a;
    struct repl *r;
    int rc = parse_ask(data, len, &a);

    if (rc == 0 && a.from)
        rc = TERN_EPROTO;
    if (rc == 0)
        rc = group_of(h, a.shard, a.epoch, &r);
    if (rc < 0)
        return rc;
    if (r->st == S_PRIMARY || r->st == S_TAKEOVER)
        return TERN_EPROTO;     /* a primary of the same epoch: cannot be */
    if (r->copying && !r->copy_ended)
        return TERN_EAGAIN;     /* a copy is coming in: by call until it ends */
    rc = repl_ring_grant(r, tern_req_session(req), a.epoch, &g);
    if (rc < 0)
        return rc;
    out = tern_reply_alloc(req, sizeof(*out));
    if (!out)
        return TERN_EMSGSIZE;
    *out = g;
    return 0;
}

/* The frames were put before this call: group_of took them. */
static int h_ring_sync(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct repl_host *h = ctx;
    struct repl_ask a;
    struct repl *r;
    int rc = parse_ask(data, len, &a);

    if (rc == 0)
        rc = group_of(h, a.shard, a.epoch, &r);
    if (rc < 0)
        return rc;
    return reply_pos(req, r, 0);
}

static const struct tern_method methods[] = {
    {REPL_M_APPEND, "append", h_append, 0},
    {REPL_M_POSITION, "position", h_position, 0},
    {REPL_M_FETCH, "fetch", h_fetch, 0},
    {REPL_M_COPY, "copy", h_copy, 0},
    {REPL_M_RING, "ring", h_ring, 0},
    {REPL_M_RING_SYNC, "ring_sync", h_ring_sync, 0},
};

int repl_host_open(struct tern_rpc_ep *ep, struct repl_host **out)
{
    struct repl_host *h = calloc(1, sizeof(*h));
    int rc;

    if (!h)
        return TERN_ENOMEM;
    h->ep = ep;
    h->svc = (struct tern_service){.name = "repl", .id = TERN_REPL_SERVICE_ID,
                                   .methods = methods,
                                   .n_methods = sizeof(methods) / sizeof(methods[0]),
                                   .ctx = h};
    rc = tern_rpc_register(ep, &h->svc);
    if (rc < 0) {
        free(h);
        return rc;
    }
    *out = h;
    return 0;
}

void repl_host_close(struct repl_host *h)
{
    if (!h)
        return;
    while (h->groups)
        repl_close(h->groups);
    /* The service stays registered on the endpoint (there is no
     * unregister): close the host after the endpoint, or not at all. */
    free(h);
}

static int ring_path(const struct repl *r, char *out, size_t cap)
{
    return (size_t)snprintf(out, cap, "%s.ring", r->state_path) < cap ? 0 : TERN_EINVAL;
}

int repl_open(struct repl_host *h, const struct repl_config *c, struct repl **out)
{
    char path[4096];
    struct repl *r;
    int rc;

    if (!h || !c || !c->shard || !c->me || !c->state_path || !c->ops ||
        strlen(c->shard) >= REPL_SHARD_MAX || !c->shard[0] || strlen(c->me) >= 64)
        return TERN_EINVAL;
    if (find(h, c->shard))
        return TERN_EEXIST;
    r = calloc(1, sizeof(*r));
    if (!r)
        return TERN_ENOMEM;
    r->h = h;
    strncpy(r->shard, c->shard, sizeof(r->shard) - 1);
    strncpy(r->me, c->me, sizeof(r->me) - 1);
    r->ops = c->ops;
    r->ctx = c->ctx;
    r->timeout_ns = c->timeout_ns ? c->timeout_ns : 1000000000ull;
    r->state_path = strdup(c->state_path);
    rc = r->state_path ? repl_log_init(&r->log, c->log_bytes ? c->log_bytes : 32u << 20)
                       : TERN_ENOMEM;
    for (unsigned i = 0; rc == 0 && i < REPL_GATES; i++)
        rc = tern_rpc_gate_open(h->ep, &r->gate[i]);
    if (rc == 0)
        rc = repl_state_load(r->state_path, r->shard, &r->seen, &r->copying);
    /* A full copy cut short (a crash): what it left is no state at all. */
    if (rc == 0 && r->copying) {
        tern_log(TERN_LOG_WARN, "repl", "%s: a full copy was cut short here: wiping the store "
                 "to take a new one", r->shard);
        rc = c->ops->wipe(c->ctx);
        if (rc == 0)
            rc = repl_state_save(r, r->seen, false);
    }
    if (rc < 0) {
        for (unsigned i = 0; i < REPL_GATES; i++)
            tern_rpc_gate_close(r->gate[i]);
        repl_log_free(&r->log);
        free(r->state_path);
        free(r);
        return rc;
    }
    r->position = c->ops->position(c->ctx);
    repl_log_reset(&r->log, r->position);
    r->ship = c->ship <= REPL_SHIP_CALL ? c->ship : REPL_SHIP_AUTO;
    /* Frames acknowledged before a crash are taken now. Without a ring
     * this replica is shipped to by call. */
    if (ring_path(r, path, sizeof(path)) < 0 || repl_ring_open(r, path, c->ring_bytes) < 0)
        tern_log(TERN_LOG_WARN, "repl", "%s: no ring: backups' records come by call",
                 r->shard);
    r->next = h->groups;
    h->groups = r;
    *out = r;
    return 0;
}

void repl_close(struct repl *r)
{
    if (!r)
        return;
    for (struct repl **p = &r->h->groups; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    for (unsigned i = 0; i < REPL_PEERS_MAX; i++) {
        struct replica *p = &r->peers[i];

        p->gen++;
        if (p->s)
            tern_rpc_disconnect(p->s);
        for (unsigned k = 0; k < REPL_INFLIGHT; k++)
            free(p->calls[k].buf);
    }
    for (unsigned i = 0; i < REPL_GATES; i++)
        tern_rpc_gate_close(r->gate[i]);
    for (unsigned i = 0; i < REPL_PEERS_MAX; i++)
        if (r->peers[i].ring.stage)
            tern_rpc_mr_dereg(r->peers[i].ring.stage);
    repl_ring_close(r);
    repl_log_free(&r->log);
    free(r->state_path);
    free(r);
}
