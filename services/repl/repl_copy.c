/* The primary's side of a full copy (REPL_M_COPY, repl_wire.h): BEGIN,
 * then the store's live records chunk by chunk from its snapshot scan,
 * then END at the position the copy began from; the replica then streams
 * from there. One message in flight per replica: the copy goes at the
 * pace the replica makes records durable, and the shard keeps serving.
 * If the log no longer holds the copy's starting position when it ends
 * (the copy took longer than the log reaches back), it starts again. */
#include <stdlib.h>
#include <string.h>

#include "repl_internal.h"

static void on_copy(void *arg, int status, const void *reply, size_t len)
{
    struct repl_call *c = arg;
    struct replica *p = c->peer;
    struct repl *r = p->r;

    if (c->gen != p->gen)
        return;
    c->busy = false;
    if (status == TERN_ESTALE) {
        repl_step_down(r, TERN_ENOTPRIMARY);
        return;
    }
    if (status < 0 || len != sizeof(struct repl_pos)) {
        tern_log(TERN_LOG_WARN, "repl", "%s: full copy to %s (step %u): %s", r->shard, p->name,
                 p->copy_phase, status < 0 ? tern_strerror(status) : "malformed answer");
        p->copy_phase = 0;
        return;
    }
    switch (p->copy_phase) {
    case REPL_COPY_BEGIN:
        p->copy_phase = REPL_COPY_CHUNK;
        break;
    case REPL_COPY_CHUNK:
        if (!p->copy_cursor)
            p->copy_phase = REPL_COPY_END;
        break;
    default:
        p->copy_phase = 0;
        p->position = p->sent = p->copy_snap;
        p->answered = true;
        r->st_copies_sent++;
        if (repl_log_has(&r->log, p->copy_snap)) {
            p->state = R_STREAM;
            tern_log(TERN_LOG_INFO, "repl", "%s: full copy to %s done at %llx", r->shard,
                     p->name, (unsigned long long)p->copy_snap);
        } else {
            tern_log(TERN_LOG_WARN, "repl", "%s: full copy to %s outran the log (now from "
                     "%llx): once more", r->shard, p->name, (unsigned long long)r->log.base);
        }
        repl_advance(r);
        break;
    }
}

void repl_copy_step(struct repl *r, struct replica *p)
{
    struct repl_call *c;
    struct repl_copy h = {.epoch = r->epoch};
    long n = 0;
    int rc;

    for (unsigned i = 0; i < REPL_INFLIGHT; i++)
        if (p->calls[i].busy)
            return;
    c = &p->calls[0];
    if (!c->buf && !(c->buf = malloc(REPL_BATCH_MAX)))
        return;
    memcpy(h.shard, r->shard, sizeof(h.shard));
    if (!p->copy_phase) {
        /* Taken now: every write after this point is in the log. */
        p->copy_phase = REPL_COPY_BEGIN;
        p->copy_snap = r->log.last;
        p->copy_cursor = 0;
        tern_log(TERN_LOG_INFO, "repl", "%s: full copy to %s from %llx", r->shard, p->name,
                 (unsigned long long)p->copy_snap);
    }
    h.phase = p->copy_phase;
    h.snap = p->copy_snap;
    if (h.phase == REPL_COPY_CHUNK) {
        uint64_t next = 0;

        n = r->ops->snapshot(r->ctx, p->copy_cursor, c->buf + sizeof(h),
                             repl_batch_max(p->s) - sizeof(h), &h.n, &next);
        if (n < 0) {
            tern_log(TERN_LOG_ERROR, "repl", "%s: full copy to %s: the scan: %s", r->shard,
                     p->name, tern_strerror((int)n));
            p->copy_phase = 0;
            return;
        }
        p->copy_cursor = next;
    }
    h.bytes = (uint32_t)n;
    memcpy(c->buf, &h, sizeof(h));
    c->peer = p;
    c->gen = p->gen;
    rc = tern_call(p->s, TERN_REPL_SERVICE_ID, REPL_M_COPY, c->buf, sizeof(h) + (size_t)n,
                   r->timeout_ns * 4, on_copy, c, NULL);
    if (rc < 0) {
        if (tern_log_allow(&p->said))
            tern_log(TERN_LOG_WARN, "repl", "%s: full copy to %s (step %u, %zu bytes): %s",
                     r->shard, p->name, h.phase, sizeof(h) + (size_t)n, tern_strerror(rc));
        p->copy_phase = 0;
        return;
    }
    c->busy = true;
}
