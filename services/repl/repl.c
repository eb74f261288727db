/* Replication groups (repl.h): the primary's shipping and takeover; the
 * backup's side is in repl_backup.c, the state file in repl_state.c.
 *
 * A primary keeps, per other replica, a session, where that replica is
 * (`position`, acknowledged) and how far it was shipped (`sent`, in flight
 * included). Each tick ships the records after `sent` from the DRAM log in
 * batches, at most REPL_INFLIGHT at once. Replies held for a write concern
 * wait behind one gate per concern, ticketed with the write's version; the
 * gates pass as positions come in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "repl_internal.h"

static const char *const st_names[] = {
    [R_DOWN] = "down", [R_ASKED] = "asked", [R_STREAM] = "streaming",
    [R_NEED_COPY] = "needs copy",
};

/* ---- sessions and calls ---- */

/* A call slot of a replica, or NULL if all are busy. */
struct repl_call *repl_call_slot(struct replica *p)
{
    for (unsigned i = 0; i < REPL_INFLIGHT; i++)
        if (!p->calls[i].busy) {
            if (!p->calls[i].buf) {
                p->calls[i].buf = malloc(REPL_BATCH_MAX);
                if (!p->calls[i].buf)
                    return NULL;
            }
            return &p->calls[i];
        }
    return NULL;
}

unsigned repl_busy_calls(const struct replica *p)
{
    unsigned n = 0;

    for (unsigned i = 0; i < REPL_INFLIGHT; i++)
        n += p->calls[i].busy;
    return n;
}

/* Forget a replica's session: its calls end (their continuations see the
 * generation moved on and do nothing). */
static void drop_session(struct replica *p, uint64_t retry_in_ns)
{
    struct tern_session *s = p->s;

    p->gen++;
    repl_ring_forget(p);
    p->copy_phase = 0;
    p->s = NULL;
    p->state = R_DOWN;
    p->answered = false;
    p->retry_at = tern_now_ns() + retry_in_ns;
    if (s)
        tern_rpc_disconnect(s);
    for (unsigned i = 0; i < REPL_INFLIGHT; i++)
        p->calls[i].busy = false;
}

static void fill_ask(const struct repl *r, struct repl_ask *a, uint64_t from, uint32_t max)
{
    memset(a, 0, sizeof(*a));
    memcpy(a->shard, r->shard, sizeof(a->shard));
    a->epoch = r->epoch;
    a->from = from;
    a->max = max;
}

/* ---- commit points and gates ---- */

/* Sort a few values, highest first (at most REPL_PEERS_MAX + 1 of them,
 * on every pass of a primary: no qsort). */
static void sort_desc(uint64_t *v, unsigned n)
{
    for (unsigned i = 1; i < n; i++) {
        uint64_t x = v[i];
        unsigned j = i;

        for (; j > 0 && v[j - 1] < x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
}

/* Who votes. The map's voters are the old configuration; while a member
 * changes, the new one is what it will be once the map is changed: the
 * leaving voter out, the learner being promoted in. */
enum { CFG_OLD, CFG_NEW };

static bool changing(const struct repl *r)
{
    if (r->promoting[0] || r->vote == REPL_LEAVING)
        return true;
    for (unsigned i = 0; i < r->n_peers; i++)
        if (r->peers[i].vote == REPL_LEAVING)
            return true;
    return false;
}

/* Whether replica p (NULL: this node) votes in configuration cfg. */
static bool votes(const struct repl *r, const struct replica *p, int cfg)
{
    uint8_t v = p ? p->vote : r->vote;

    if (v == REPL_VOTER)
        return true;
    if (v == REPL_LEAVING)
        return cfg == CFG_OLD;
    return cfg == CFG_NEW && p && r->promoting[0] && !strcmp(p->name, r->promoting);
}

/* The highest version (times: the latest acknowledgment time, this node's
 * being now) that a majority of configuration cfg holds. */
static uint64_t held_by_majority_of(const struct repl *r, int cfg, bool times)
{
    uint64_t v[REPL_PEERS_MAX + 1];
    unsigned n = 0;

    if (votes(r, NULL, cfg))
        v[n++] = times ? tern_now_ns() : r->position;
    for (unsigned i = 0; i < r->n_peers; i++) {
        const struct replica *p = &r->peers[i];

        if (votes(r, p, cfg))
            v[n++] = times ? p->confirmed_at : p->answered ? p->position : 0;
    }
    if (!n)
        return 0;
    sort_desc(v, n);
    return v[n / 2];
}

/* A majority of the voters, and while a member changes a majority of the
 * voters to come as well (repl_vote). */
static uint64_t held_by_majority(const struct repl *r, bool times)
{
    uint64_t v = held_by_majority_of(r, CFG_OLD, times);

    if (changing(r)) {
        uint64_t w = held_by_majority_of(r, CFG_NEW, times);

        if (w < v)
            v = w;
    }
    return v;
}

/* The highest version every voter (of either configuration) holds. */
static uint64_t held_by_all(const struct repl *r)
{
    uint64_t v = r->position;

    for (unsigned i = 0; i < r->n_peers; i++) {
        const struct replica *p = &r->peers[i];
        uint64_t at = p->answered ? p->position : 0;

        if ((votes(r, p, CFG_OLD) || votes(r, p, CFG_NEW)) && at < v)
            v = at;
    }
    return v;
}

/* The latest time as of which a majority (this node, now, included)
 * acknowledged this primary's epoch and held every record it had logged. */
static uint64_t confirmed_by_majority(const struct repl *r)
{
    return held_by_majority(r, true);
}

void repl_advance(struct repl *r)
{
    uint64_t held;

    if (r->st != S_PRIMARY)
        return;
    r->advanced = r->position;
    /* Once on a majority, always committed: a replica gone since does not
     * take it back. */
    held = held_by_majority(r, false);
    if (held > r->committed)
        r->committed = held;
    tern_rpc_gate_pass(r->gate[REPL_W_ONE], r->position);
    tern_rpc_gate_pass(r->gate[REPL_W_MAJORITY], r->committed);
    tern_rpc_gate_pass(r->gate[REPL_W_ALL], held_by_all(r));
    if (tern_rpc_gate_waiting(r->gate[REPL_GATE_CONFIRM], NULL))
        tern_rpc_gate_pass(r->gate[REPL_GATE_CONFIRM], confirmed_by_majority(r));
    if (r->ext_confirm && confirmed_by_majority(r) >= r->ext_confirm)
        r->ext_confirm = 0;
}

void repl_fail_held(struct repl *r, int code)
{
    r->fail_gen++;
    r->fail_code = code;
    r->ext_confirm = 0;
    for (unsigned i = 0; i < REPL_GATES; i++)
        tern_rpc_gate_fail(r->gate[i], code);
}

/* ---- the primary's shipping ---- */

static void on_append(void *arg, int status, const void *reply, size_t len)
{
    struct repl_call *c = arg;
    struct replica *p = c->peer;
    struct repl *r = p->r;
    struct repl_pos pos;

    if (c->gen != p->gen)
        return;                 /* from a session dropped since */
    c->busy = false;
    if (status == TERN_ESTALE) {
        tern_log(TERN_LOG_WARN, "repl", "%s: %s refused epoch %llu: a newer primary exists",
                 r->shard, p->name, (unsigned long long)r->epoch);
        repl_step_down(r, TERN_ENOTPRIMARY);
        return;
    }
    if (status < 0 || len != sizeof(pos)) {
        tern_log(TERN_LOG_WARN, "repl", "%s: append to %s: %s", r->shard, p->name,
                 status < 0 ? tern_strerror(status) : "malformed answer");
        drop_session(p, 100000000u);
        return;
    }
    memcpy(&pos, reply, sizeof(pos));
    if (pos.flags & REPL_GAP) {
        /* It is elsewhere than we thought: ship from where it is, once the
         * batches in flight (which it refuses too) are back. */
        p->gen++;
        repl_ring_forget(p);
        for (unsigned i = 0; i < REPL_INFLIGHT; i++)
            p->calls[i].busy = false;
        p->position = pos.position;
        p->sent = pos.position;
        if (!repl_log_has(&r->log, pos.position)) {
            p->state = R_NEED_COPY;
            tern_log(TERN_LOG_WARN, "repl", "%s: %s is at %llx, which the log does not "
                     "hold: it needs a full copy", r->shard, p->name,
                     (unsigned long long)pos.position);
        }
        return;
    }
    if (pos.position > p->position)
        p->position = pos.position;
    if (c->sent_at > p->confirmed_at)
        p->confirmed_at = c->sent_at;
    repl_advance(r);
}

/* Reads wait for a confirmation the replica has not given yet, or its
 * ring is full and it may be asleep: send it an empty APPEND (a heartbeat,
 * which also makes it take its ring's frames) once nothing else is in
 * flight to it. */
static bool beat_due(const struct repl *r, const struct replica *p)
{
    uint64_t oldest;

    if (repl_busy_calls(p))
        return false;
    return p->ring.nudge ||
           (tern_rpc_gate_waiting(r->gate[REPL_GATE_CONFIRM], &oldest) &&
            p->confirmed_at < oldest) ||
           (r->ext_confirm && p->confirmed_at < r->ext_confirm);
}

/* Ship what the replica lacks: through its ring where it can
 * (repl_ring_ship), else up to REPL_INFLIGHT batches at once by APPEND.
 * Heartbeats go by APPEND either way. */
static void ship(struct repl *r, struct replica *p)
{
    bool ring = repl_ring_ship(r, p);

    while (p->state == R_STREAM && ((!ring && p->sent < r->log.last) || beat_due(r, p))) {
        struct repl_call *c = repl_call_slot(p);
        struct repl_batch b = {.epoch = r->epoch, .prev = p->sent, .commit = r->committed};
        uint64_t last;
        long n;
        int rc;

        if (!c)
            return;
        if (ring) {
            n = 0;                  /* the ring carries the records */
            last = p->sent;
        } else {
            n = repl_log_read(&r->log, p->sent, c->buf + sizeof(b),
                              repl_batch_max(p->s) - sizeof(b), &b.n, &last);
        }
        if (n < 0) {
            p->state = R_NEED_COPY;
            tern_log(TERN_LOG_WARN, "repl", "%s: %s is at %llx, past what the log holds "
                     "(from %llx): it needs a full copy", r->shard, p->name,
                     (unsigned long long)p->sent, (unsigned long long)r->log.base);
            return;
        }
        if (!ring && !b.n && p->sent < r->log.last) {
            /* The next record is larger than a batch: the store wrote what
             * its group cannot ship. Said, not hidden: the replica stays
             * here until a full copy or a new view. */
            if (tern_log_allow(&p->said))
                tern_log(TERN_LOG_ERROR, "repl", "%s: the record after %llx is larger than "
                         "a batch (%u bytes): it cannot be shipped to %s", r->shard,
                         (unsigned long long)p->sent, (unsigned)repl_batch_max(p->s), p->name);
            return;
        }
        memcpy(b.shard, r->shard, sizeof(b.shard));
        b.bytes = (uint32_t)n;
        memcpy(c->buf, &b, sizeof(b));
        c->peer = p;
        c->gen = p->gen;
        c->sent_at = last >= r->log.last ? tern_now_ns() : 0;
        rc = tern_call(p->s, TERN_REPL_SERVICE_ID, REPL_M_APPEND, c->buf, sizeof(b) + (size_t)n,
                       r->timeout_ns, on_append, c, NULL);
        if (rc < 0) {
            if (tern_log_allow(&p->said))
                tern_log(TERN_LOG_WARN, "repl", "%s: shipping %zu bytes to %s: %s", r->shard,
                         sizeof(b) + (size_t)n, p->name, tern_strerror(rc));
            drop_session(p, 100000000u);
            return;
        }
        c->busy = true;
        p->sent = last;
        p->ring.nudge = false;
        r->st_shipped++;
        if (!b.n)
            return;             /* the heartbeat */
    }
}

/* ---- POSITION: fencing, and where each replica is ---- */

static void on_position(void *arg, int status, const void *reply, size_t len)
{
    struct repl_call *c = arg;
    struct replica *p = c->peer;
    struct repl *r = p->r;
    struct repl_pos pos;

    if (c->gen != p->gen)
        return;
    c->busy = false;
    if (status == TERN_ESTALE) {
        repl_step_down(r, TERN_ENOTPRIMARY);
        return;
    }
    if (status < 0 || len != sizeof(pos)) {
        if (tern_log_allow(&p->said))
            tern_log(TERN_LOG_WARN, "repl", "%s: %s did not say its position: %s", r->shard,
                     p->name, status < 0 ? tern_strerror(status) : "malformed answer");
        drop_session(p, 200000000u);
        return;
    }
    memcpy(&pos, reply, sizeof(pos));
    p->position = pos.position;
    p->sent = pos.position;
    p->answered = true;
    if (r->st == S_TAKEOVER) {
        p->state = R_ASKED;     /* streaming starts once the takeover is done */
        return;
    }
    p->state = repl_log_has(&r->log, pos.position) && pos.position <= r->log.last
                   ? R_STREAM : R_NEED_COPY;
    if (p->state == R_NEED_COPY)
        tern_log(TERN_LOG_WARN, "repl", "%s: %s is at %llx, which the log (%llx..%llx) does "
                 "not hold: it needs a full copy", r->shard, p->name,
                 (unsigned long long)pos.position, (unsigned long long)r->log.base,
                 (unsigned long long)r->log.last);
    repl_advance(r);
}

static void ask_position(struct repl *r, struct replica *p)
{
    struct repl_call *c = repl_call_slot(p);
    struct repl_ask *a;

    if (!c)
        return;
    a = (struct repl_ask *)c->buf;
    fill_ask(r, a, 0, 0);
    c->peer = p;
    c->gen = p->gen;
    if (tern_call(p->s, TERN_REPL_SERVICE_ID, REPL_M_POSITION, a, sizeof(*a), r->timeout_ns,
                  on_position, c, NULL) < 0) {
        drop_session(p, 200000000u);
        return;
    }
    c->busy = true;
    p->state = R_ASKED;
}

static void cannot_reach(struct repl *r, struct replica *p, int rc)
{
    if (tern_log_allow(&p->said))
        tern_log(TERN_LOG_WARN, "repl", "%s: cannot reach %s at %s: %s", r->shard, p->name,
                 p->uri, tern_strerror(rc));
}

/* Start opening a session to a replica that has none, at most once per
 * retry interval. Never waits: the handshake goes on in the endpoint's
 * poll, so a replica that is stopped or cut off (its packets dropped)
 * does not hold up the shipping to the others. */
static void reach(struct repl *r, struct replica *p)
{
    int rc;

    if (p->s || !p->uri[0] || tern_now_ns() < p->retry_at)
        return;
    rc = tern_rpc_connect_start(r->h->ep, p->uri, r->timeout_ns, &p->s);
    if (rc < 0) {
        p->s = NULL;
        p->retry_at = tern_now_ns() + 500000000u;
        cannot_reach(r, p, rc);
        return;
    }
    p->gen++;
    repl_ring_forget(p);
    p->state = R_DOWN;
    p->answered = false;
    p->connecting = true;
}

/* ---- takeover ---- */

static void on_fetch(void *arg, int status, const void *reply, size_t len)
{
    struct repl_call *c = arg;
    struct replica *p = c->peer;
    struct repl *r = p->r;
    struct repl_pos pos;
    int rc;

    if (c->gen != p->gen)
        return;
    c->busy = false;
    r->fetching = false;
    if (status == TERN_ERANGE) {
        /* Its ring starts after our position (it restarted, say): another
         * replica far enough along may do. */
        tern_log(TERN_LOG_WARN, "repl", "%s: %s no longer holds the records after %llx",
                 r->shard, p->name, (unsigned long long)r->position);
        p->no_fetch = true;
        return;
    }
    if (status < 0) {
        drop_session(p, 200000000u);
        return;
    }
    rc = repl_apply_batch(r, reply, len, &pos);
    if (rc < 0 || (pos.flags & REPL_GAP)) {
        tern_log(TERN_LOG_ERROR, "repl", "%s: records fetched from %s: %s", r->shard, p->name,
                 rc < 0 ? tern_strerror(rc) : "do not follow this node's position");
        drop_session(p, 200000000u);
    }
}

static void fetch_from(struct repl *r, struct replica *p)
{
    struct repl_call *c = repl_call_slot(p);
    struct repl_ask *a;

    if (!c)
        return;
    a = (struct repl_ask *)c->buf;
    fill_ask(r, a, r->position, (uint32_t)repl_batch_max(p->s));
    c->peer = p;
    c->gen = p->gen;
    if (tern_call(p->s, TERN_REPL_SERVICE_ID, REPL_M_FETCH, a, sizeof(*a), r->timeout_ns,
                  on_fetch, c, NULL) < 0) {
        drop_session(p, 200000000u);
        return;
    }
    c->busy = true;
    r->fetching = true;
}

/* How far the new primary must get before it serves. Of the voters it
 * heard from (H, itself included) at least |H| + m - n hold any write
 * acknowledged on a majority (m of the n voters; while a member changes,
 * writes are on a majority of these and of the voters to come, repl_vote), so the (|H| + m - n)-th highest
 * position among them covers every such write; anything past it was held
 * by too few to have been acknowledged. (With three replicas all heard
 * from, that is the second highest: the old primary back from a crash may
 * be ahead with records nobody else has, and need not be waited for.) */
static uint64_t takeover_target(const struct repl *r, unsigned voters, unsigned heard)
{
    uint64_t pos[REPL_PEERS_MAX + 1];
    unsigned n = 0;

    pos[n++] = r->position;
    for (unsigned i = 0; i < r->n_peers; i++)
        if (r->peers[i].answered && votes(r, &r->peers[i], CFG_OLD))
            pos[n++] = r->peers[i].position;
    sort_desc(pos, n);
    return pos[heard + voters / 2 + 1 - voters - 1];
}

/* A voter is leaving and no majority of the voters answers (two voters,
 * the leaving one a primary that died before it resigned): a majority of
 * the voters that stay will do. Every acknowledged write is on one: while
 * the member changes, writes count majorities of both configurations;
 * before, a majority of the old, which meets every majority of those that
 * stay (all of the old but one). The same meeting fences: any primary
 * before ours needs a voter that answered us at our epoch. The target is
 * the highest position heard, since a majority of the old may have put a
 * write on only one of them. True with *target set. */
static bool heard_those_that_stay(const struct repl *r, unsigned *heard, unsigned *voters,
                                  uint64_t *target)
{
    bool leaving = false;

    *heard = *voters = 1;
    *target = r->position;
    if (r->promoting[0] || !votes(r, NULL, CFG_NEW))
        return false;
    for (unsigned i = 0; i < r->n_peers; i++) {
        const struct replica *p = &r->peers[i];

        leaving |= p->vote == REPL_LEAVING;
        if (!votes(r, p, CFG_NEW))
            continue;
        (*voters)++;
        if (p->answered) {
            (*heard)++;
            if (p->position > *target)
                *target = p->position;
        }
    }
    return leaving && *heard >= *voters / 2 + 1;
}

/* A majority (this node included) answered POSITION at our epoch, so no
 * older primary can have a write acknowledged any more; take what we lack
 * of the acknowledged writes, then serve. */
static void take_over(struct repl *r)
{
    unsigned heard = 1, voters = 1;
    uint64_t target;

    for (unsigned i = 0; i < r->n_peers; i++)
        if (votes(r, &r->peers[i], CFG_OLD)) {
            voters++;
            heard += r->peers[i].answered;
        }
    if (r->fetching)
        return;
    if (heard >= voters / 2 + 1)
        target = takeover_target(r, voters, heard);
    else if (!heard_those_that_stay(r, &heard, &voters, &target))
        return;
    if (r->position < target) {
        struct replica *from = NULL;

        for (unsigned i = 0; i < r->n_peers; i++) {
            struct replica *p = &r->peers[i];

            if (p->answered && !p->no_fetch && p->s && p->position >= target &&
                (!from || p->position < from->position))
                from = p;
        }
        if (!from) {
            /* Not yet: a replica that answers later may lower the target
             * (more heard, a lower rank) or hold the records. */
            if (!r->need_copy)
                tern_log(TERN_LOG_ERROR, "repl", "%s: no replica at %llx or past it can hand "
                         "this node the records after %llx: it cannot serve until one "
                         "does", r->shard, (unsigned long long)target,
                         (unsigned long long)r->position);
            r->need_copy = true;
            return;
        }
        r->need_copy = false;
        if (!repl_busy_calls(from))
            fetch_from(r, from);
        return;
    }
    /* Ours holds every write a majority acknowledged. */
    r->need_copy = false;
    r->ops->raise(r->ctx, repl_epoch_base(r->epoch));
    r->st = S_PRIMARY;
    tern_log(TERN_LOG_INFO, "repl", "%s: primary at epoch %llu from %llx (%u of %u voters "
             "heard)", r->shard, (unsigned long long)r->epoch,
             (unsigned long long)r->position, heard, voters);
    for (unsigned i = 0; i < r->n_peers; i++) {
        struct replica *p = &r->peers[i];

        if (p->answered)
            p->state = repl_log_has(&r->log, p->position) && p->position <= r->log.last
                           ? R_STREAM : R_NEED_COPY;
    }
    repl_advance(r);
}

/* ---- members changing (repl_vote) ---- */

static struct replica *peer_named(struct repl *r, const char *name)
{
    for (unsigned i = 0; i < r->n_peers; i++)
        if (!strcmp(r->peers[i].name, name))
            return &r->peers[i];
    return NULL;
}

/* A learner that streams and holds every acknowledged write is counted in
 * from now on (writes need it in a majority too), before the map makes it
 * a voter: a successor that reads the map as changed hears from a
 * majority that includes it or one that holds what it holds. One change
 * at a time. */
static void count_in_learner(struct repl *r)
{
    if (r->st != S_PRIMARY || changing(r))
        return;
    for (unsigned i = 0; i < r->n_peers; i++) {
        struct replica *p = &r->peers[i];

        if (p->vote == REPL_LEARNER && p->state == R_STREAM && p->answered &&
            p->position >= r->committed) {
            snprintf(r->promoting, sizeof(r->promoting), "%s", p->name);
            tern_log(TERN_LOG_INFO, "repl", "%s: %s holds every acknowledged write (%llx): "
                     "counted in, to be made a voter", r->shard, p->name,
                     (unsigned long long)p->position);
            return;
        }
    }
}

/* This primary is leaving: a voter that stays, streaming, holds all it
 * wrote. */
static const struct replica *successor(const struct repl *r)
{
    for (unsigned i = 0; i < r->n_peers; i++) {
        const struct replica *p = &r->peers[i];

        if (votes(r, p, CFG_NEW) && p->state == R_STREAM && p->answered &&
            p->position >= r->position)
            return p;
    }
    return NULL;
}

enum repl_step repl_members_step(const struct repl *r, char name[64])
{
    name[0] = 0;
    if (r->st != S_PRIMARY)
        return REPL_STEP_NONE;
    if (r->vote == REPL_LEAVING)
        return successor(r) ? REPL_STEP_RESIGN : REPL_STEP_NONE;
    for (unsigned i = 0; i < r->n_peers; i++) {
        const struct replica *p = &r->peers[i];

        if (p->vote == REPL_LEARNER && r->promoting[0] && !strcmp(p->name, r->promoting)) {
            snprintf(name, 64, "%s", p->name);
            return REPL_STEP_PROMOTE;
        }
        /* Every acknowledged write is on a majority without it: writes
         * since it was marked need one anyway, older ones may not be. */
        if (p->vote == REPL_LEAVING && held_by_majority_of(r, CFG_NEW, false) >= r->committed) {
            snprintf(name, 64, "%s", p->name);
            return REPL_STEP_DROP;
        }
    }
    return REPL_STEP_NONE;
}

/* One pass: what the group owes, on the endpoint's thread. */
static void tick(struct repl *r)
{
    if (r->st != S_PRIMARY && r->st != S_TAKEOVER) {
        repl_ring_drain(r);     /* frames a primary put here */
        return;
    }
    for (unsigned i = 0; i < r->n_peers; i++) {
        struct replica *p = &r->peers[i];

        int st;

        reach(r, p);
        if (!p->s || (st = tern_session_status(p->s)) == TERN_EINPROGRESS)
            continue;
        if (st < 0) {
            if (p->connecting)
                cannot_reach(r, p, st);
            drop_session(p, p->connecting ? 500000000u : 200000000u);
            continue;
        }
        p->connecting = false;
        if (p->state == R_DOWN && !p->answered && !repl_busy_calls(p))
            ask_position(r, p);
        if (r->st == S_PRIMARY && p->state == R_NEED_COPY)
            repl_copy_step(r, p);
        else if (r->st == S_PRIMARY)
            ship(r, p);
    }
    if (r->st == S_TAKEOVER) {
        take_over(r);
        return;
    }
    count_in_learner(r);
    if (r->position != r->advanced || r->ext_confirm ||
        tern_rpc_gate_waiting(r->gate[REPL_GATE_CONFIRM], NULL))
        repl_advance(r);    /* its own writes (a shard of one commits on its own),
                             * and confirmations, which time moves */
}

bool repl_tick(struct repl *r)
{
    uint64_t before = r->st_shipped + r->committed;

    r->written_in_pass = 0;
    tick(r);
    return r->st_shipped + r->committed != before;
}

/* ---- views ---- */

void repl_step_down(struct repl *r, int code)
{
    if (r->st == S_PRIMARY || r->st == S_TAKEOVER)
        tern_log(TERN_LOG_WARN, "repl", "%s: no longer primary (epoch %llu)", r->shard,
                 (unsigned long long)r->epoch);
    repl_fail_held(r, code);
    for (unsigned i = 0; i < r->n_peers; i++)
        drop_session(&r->peers[i], 0);
    r->st = S_BACKUP;
    r->fetching = false;
}

void repl_set_view(struct repl *r, enum repl_role role, uint64_t epoch, const char *primary,
                   const struct repl_peer *replicas, unsigned n)
{
    bool same = role == r->role && epoch == r->epoch, moved = false;
    unsigned k = 0;

    snprintf(r->primary, sizeof(r->primary), "%s", primary ? primary : "");
    /* The replicas' addresses may come later than the view: keep them
     * current without disturbing the sessions of those unchanged. */
    for (unsigned i = 0; i < n && k < REPL_PEERS_MAX; i++) {
        struct replica *p;

        if (!strcmp(replicas[i].name, r->me)) {
            moved |= r->vote != replicas[i].vote;
            r->vote = replicas[i].vote;
            continue;
        }
        p = &r->peers[k++];
        if (strcmp(p->name, replicas[i].name) || strcmp(p->uri, replicas[i].uri)) {
            drop_session(p, 0);
            snprintf(p->name, sizeof(p->name), "%s", replicas[i].name);
            snprintf(p->uri, sizeof(p->uri), "%s", replicas[i].uri);
            p->position = p->sent = 0;
            p->r = r;
            moved = true;
        }
        moved |= p->vote != replicas[i].vote;
        p->vote = replicas[i].vote;
    }
    for (unsigned i = k; i < r->n_peers; i++) {
        drop_session(&r->peers[i], 0);
        r->peers[i].name[0] = 0;
        moved = true;
    }
    r->n_peers = k;
    if (moved && r->promoting[0]) {
        struct replica *p = peer_named(r, r->promoting);

        if (!p || p->vote != REPL_LEARNER)
            r->promoting[0] = 0;        /* a voter now, or gone */
    }
    if (moved && same)
        repl_advance(r);    /* the majorities changed */
    if (same)
        return;
    if (r->st == S_PRIMARY || r->st == S_TAKEOVER)
        repl_step_down(r, TERN_ENOTPRIMARY);
    r->role = role;
    r->epoch = epoch;
    r->need_copy = false;
    r->promoting[0] = 0;    /* a new term counts in afresh */
    if (role == REPL_PRIMARY) {
        if (epoch < r->seen || epoch > REPL_EPOCH_MAX) {
            tern_log(TERN_LOG_ERROR, "repl", "%s: elected at epoch %llu, but epoch %llu was "
                     "seen here: not serving", r->shard, (unsigned long long)epoch,
                     (unsigned long long)r->seen);
            r->st = S_NONE;
            return;
        }
        if (epoch > r->seen && repl_see_epoch(r, epoch) < 0) {
            r->st = S_NONE;
            return;
        }
        repl_ring_retire(r);    /* what the old primary put here counts first */
        r->st = S_TAKEOVER;
        for (unsigned i = 0; i < r->n_peers; i++) {
            drop_session(&r->peers[i], 0);
            r->peers[i].no_fetch = false;
            r->peers[i].confirmed_at = 0;   /* acknowledgments of older epochs */
        }
        tern_log(TERN_LOG_INFO, "repl", "%s: taking over at epoch %llu from %llx", r->shard,
                 (unsigned long long)epoch, (unsigned long long)r->position);
    } else {
        r->st = role == REPL_BACKUP ? S_BACKUP : S_NONE;
    }
}

/* ---- what the service calls ---- */

bool repl_candidate(struct repl *r, uint64_t quiet_ns)
{
    uint64_t now = tern_now_ns();

    if (r->vote != REPL_VOTER)
        return false;       /* learners and leaving voters never stand */
    if (r->st == S_PRIMARY || r->st == S_TAKEOVER)
        return true;
    if (r->synced && !r->copying)
        return true;
    if (r->role != REPL_NONE && r->primary[0]) {
        r->no_primary_since = 0;
        return false;
    }
    if (!r->no_primary_since)
        r->no_primary_since = now;
    return now - r->no_primary_since >= quiet_ns;
}

int repl_writable(const struct repl *r)
{
    /* A leaving primary takes no more writes: its successor is to hold all
     * it wrote before it resigns. */
    return r->st == S_PRIMARY && r->vote != REPL_LEAVING ? 0 : TERN_ENOTPRIMARY;
}

void repl_written(struct repl *r, uint8_t type, const void *key, uint16_t key_len,
                  const void *val, uint32_t val_len, uint64_t version)
{
    int rc = repl_log_add(&r->log, type, version, key, key_len, val, val_len);

    if (rc < 0) {
        /* Cannot be shipped: every backup will need a full copy. */
        tern_log(TERN_LOG_ERROR, "repl", "%s: record %llx left out of the log: %s", r->shard,
                 (unsigned long long)version, tern_strerror(rc));
        repl_log_reset(&r->log, version);
    }
    if (version > r->position)
        r->position = version;      /* the service syncs before it replies */
    r->written_in_pass++;
}

void repl_set_lease(struct repl *r, bool alive)
{
    if (r->lease_doubt == !alive)
        return;
    r->lease_doubt = !alive;
    if (r->st == S_PRIMARY || r->st == S_TAKEOVER)
        tern_log(TERN_LOG_WARN, "repl", alive ? "%s: the lease holds again (epoch %llu)"
                 : "%s: the lease is in doubt (etcd does not answer): serving what a "
                   "majority confirms at epoch %llu", r->shard, (unsigned long long)r->epoch);
}

void repl_hold(struct repl *r, struct tern_req *req, enum repl_w w)
{
    uint64_t target = r->log.last;

    if (w > REPL_W_ALL)
        w = REPL_W_MAJORITY;
    if (w == REPL_W_ONE && r->lease_doubt)
        w = REPL_W_MAJORITY;    /* a successor might never see it */
    /* Not primary: the service refused the write (it asks repl_writable
     * first, in the same handler), and a refusal goes at once. */
    if (w == REPL_W_ONE || r->st != S_PRIMARY)
        return;             /* the service synced before it replies */
    /* The first write since the last pass ships now into the rings that
     * need no call: a lone write then needs no gate (mapped), or its put
     * and read leave with this poll's flush (rdma). More in the same poll
     * mean writes come faster than one at a time; the pass ships them
     * together, one frame, one flush and one apply at the backup for
     * many. */
    if (r->written_in_pass == 1)
        repl_ring_ship_now(r);
    /* Shipped into mapped rings just now, or a write that made no record (a delete of nothing, a drop of what
     * was not there) may already be where its concern wants it: gates are
     * passed only when positions move, so it would wait for the next
     * write. */
    if ((w == REPL_W_MAJORITY && r->committed >= target) ||
        (w == REPL_W_ALL && held_by_all(r) >= target))
        return;
    tern_req_gate(req, r->gate[w], target);
}

void repl_hold_read(struct repl *r, struct tern_req *req, uint64_t version)
{
    if (r->st != S_PRIMARY)
        return;
    /* A store's version may be a new epoch's base, which no record has
     * yet: what a read can show is at most the last record. */
    if (version > r->position)
        version = r->position;
    if (r->lease_doubt)
        tern_req_gate(req, r->gate[REPL_GATE_CONFIRM], tern_now_ns());
    else if (version > r->committed)
        tern_req_gate(req, r->gate[REPL_W_MAJORITY], version);
}

/* ---- waits outside RPC ---- */

bool repl_wait_write(struct repl *r, enum repl_w w, struct repl_wait *out)
{
    if (w > REPL_W_ALL)
        w = REPL_W_MAJORITY;
    if (w == REPL_W_ONE && r->lease_doubt)
        w = REPL_W_MAJORITY;
    if (w == REPL_W_ONE)
        return false;
    *out = (struct repl_wait){.kind = (uint8_t)w, .target = r->log.last, .gen = r->fail_gen};
    return true;
}

bool repl_wait_read(struct repl *r, uint64_t version, struct repl_wait *out)
{
    if (r->st != S_PRIMARY)
        return false;
    if (version > r->position)
        version = r->position;      /* as in repl_hold_read */
    if (r->lease_doubt) {
        *out = (struct repl_wait){.kind = REPL_GATE_CONFIRM, .target = tern_now_ns(),
                                  .gen = r->fail_gen};
        if (out->target > r->ext_confirm)
            r->ext_confirm = out->target;
        return true;
    }
    if (version <= r->committed)
        return false;
    *out = (struct repl_wait){.kind = REPL_W_MAJORITY, .target = version, .gen = r->fail_gen};
    return true;
}

int repl_wait_check(struct repl *r, const struct repl_wait *w)
{
    uint64_t reached;

    if (w->gen != r->fail_gen)
        return r->fail_code < 0 ? r->fail_code : TERN_ENOTPRIMARY;
    if (r->st != S_PRIMARY)
        return 0;
    switch (w->kind) {
    case REPL_W_ONE:
        reached = r->position;
        break;
    case REPL_W_MAJORITY:
        reached = r->committed;
        break;
    case REPL_W_ALL:
        reached = held_by_all(r);
        break;
    default:
        reached = confirmed_by_majority(r);
        break;
    }
    return reached >= w->target ? 1 : 0;
}

bool repl_consistent(const struct repl *r)
{
    return r->st == S_BACKUP && !r->copying && !r->need_copy;
}

size_t repl_member_addrs(const struct repl *r, char *buf, size_t cap)
{
    size_t at = 0;

    for (unsigned i = 0; i < r->n_peers; i++) {
        const char *u = r->peers[i].uri, *sep = strstr(u, "://");
        size_t n;

        if (sep)
            u = sep + 3;
        n = strlen(u);
        if (!n || n + 1 > cap - at)
            continue;
        memcpy(buf + at, u, n + 1);
        at += n + 1;
    }
    return at;
}

static const char *vote_name(const struct repl *r, const struct replica *p)
{
    switch (p ? p->vote : r->vote) {
    case REPL_LEARNER:
        return p && votes(r, p, CFG_NEW) ? "joining" : "learner";
    case REPL_LEAVING:
        return "leaving";
    default:
        return "voter";
    }
}

void repl_status(const struct repl *r, struct repl_status *out)
{
    static const char *const names[] = {[S_NONE] = "none", [S_BACKUP] = "backup",
                                        [S_TAKEOVER] = "taking over", [S_PRIMARY] = "primary"};

    memset(out, 0, sizeof(*out));
    out->role = r->role;
    out->state = r->need_copy ? "needs copy" : r->copying ? "copying" : names[r->st];
    out->epoch = r->epoch;
    out->epoch_seen = r->seen;
    out->position = r->position;
    out->committed = r->committed;
    out->log_base = r->log.base;
    out->shipped_batches = r->st_shipped;
    out->applied_records = r->st_applied;
    out->refused_stale = r->st_stale;
    out->copies_sent = r->st_copies_sent;
    out->copies_taken = r->st_copies_taken;
    out->copying = r->copying;
    for (unsigned i = 0; i < REPL_GATES; i++)
        out->held += tern_rpc_gate_waiting(r->gate[i], NULL);
    out->lease_doubt = r->lease_doubt;
    out->vote = vote_name(r, NULL);
    out->handing_over = r->st == S_PRIMARY && r->vote == REPL_LEAVING;
    for (unsigned i = 0; i < r->n_peers && out->n < REPL_PEERS_MAX; i++) {
        const struct replica *p = &r->peers[i];
        struct repl_replica_status *s = &out->replicas[out->n++];

        snprintf(s->name, sizeof(s->name), "%s", p->name);
        s->state = r->st == S_PRIMARY || r->st == S_TAKEOVER ? st_names[p->state] : "-";
        s->position = p->position;
        s->lag = r->log.last > p->position && repl_epoch_of(r->log.last) ==
                 repl_epoch_of(p->position) ? r->log.last - p->position : 0;
        s->vote = vote_name(r, p);
        s->path = p->state != R_STREAM ? "-" : repl_ring_path(p) ? repl_ring_path(p) : "call";
    }
}
