/* The part of a connection's state that every software fabric keeps alike:
 * the events it owes its user, and its one-sided operations in flight (whose
 * answers come back in order). Internal to transport/. */
#ifndef TERN_CONN_EVENTS_H
#define TERN_CONN_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define TP_PEND_MAX 256     /* one-sided operations in flight per connection */

struct tp_onesided {
    bool is_put;
    uint8_t *dst;           /* get: where the data lands */
    uint32_t len;
    uint64_t token;
    int status;             /* a completed operation's outcome */
};

struct tp_conn_events {
    bool accepted, connected, writable, closed;   /* events owed */
    bool dead;
    int close_status;
    struct tp_onesided pend[TP_PEND_MAX];
    unsigned pend_head, pend_tail;                /* free-running */
    unsigned done;          /* the first `done` operations in flight have
                             * completed (direct access); report them first */
};

/* Record a one-sided operation; TERN_EAGAIN if TP_PEND_MAX are in flight. */
int tp_pend_push(struct tp_conn_events *e, bool is_put, uint8_t *dst, size_t len,
                 uint64_t token);

/* True if TP_PEND_MAX operations are in flight. */
bool tp_pend_full(const struct tp_conn_events *e);

/* Record an operation that completed at once (the fabric did it without
 * the peer), to be reported by tp_emit_done. Only when every operation in
 * flight has completed too (TERN_EAGAIN otherwise): operations take effect
 * and complete in order. */
int tp_pend_done(struct tp_conn_events *e, bool is_put, size_t len, uint64_t token, int status);

/* Report completed operations (tp_pend_done) from the front. */
int tp_emit_done(struct tp_conn_events *e, struct tern_tp_conn *c, struct tern_tp_event *ev,
                 int max);

/* The oldest operation in flight, or NULL; tp_pend_pop drops it. */
struct tp_onesided *tp_pend_front(struct tp_conn_events *e);
void tp_pend_pop(struct tp_conn_events *e);

/* The connection is gone: CLOSED with `status` is owed (CONNECTED first if
 * it never came up), operations in flight will fail. */
void tp_conn_dead(struct tp_conn_events *e, int status, bool was_connecting);

/* Write owed ACCEPTED / CONNECTED / WRITABLE events and completed
 * operations; returns how many. */
int tp_emit_owed(struct tp_conn_events *e, struct tern_tp_conn *c, struct tern_tp_event *ev,
                 int max);

/* On a dead connection: fail the operations in flight (TERN_ECONNRESET),
 * then CLOSED. Returns events written. */
int tp_emit_dead(struct tp_conn_events *e, struct tern_tp_conn *c, struct tern_tp_event *ev,
                 int max);

/* True while any event is owed. Inline: idle polls ask it of every
 * connection. */
static inline bool tp_events_owed(const struct tp_conn_events *e)
{
    return e->accepted || e->connected || e->writable || e->done ||
           (e->dead && (e->closed || e->pend_head != e->pend_tail));
}

#endif
