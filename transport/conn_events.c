#include "conn_events.h"
#include "transport_internal.h"

int tp_pend_push(struct tp_conn_events *e, bool is_put, uint8_t *dst, size_t len,
                 uint64_t token)
{
    if (tp_pend_full(e))
        return TERN_EAGAIN;
    e->pend[e->pend_tail++ % TP_PEND_MAX] = (struct tp_onesided){
        .is_put = is_put, .dst = dst, .len = (uint32_t)len, .token = token};
    return 0;
}

int tp_pend_done(struct tp_conn_events *e, bool is_put, size_t len, uint64_t token, int status)
{
    int rc;

    if (e->pend_tail - e->pend_head != e->done)
        return TERN_EAGAIN;     /* one still waits for its answer */
    rc = tp_pend_push(e, is_put, NULL, len, token);
    if (rc == 0) {
        e->pend[(e->pend_tail - 1) % TP_PEND_MAX].status = status;
        e->done++;
    }
    return rc;
}

int tp_emit_done(struct tp_conn_events *e, struct tern_tp_conn *c, struct tern_tp_event *ev,
                 int max)
{
    int n = 0;

    while (n < max && e->done) {
        struct tp_onesided *p = tp_pend_front(e);

        ev[n++] = (struct tern_tp_event){
            .type = p->is_put ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE,
            .status = p->status, .conn = c, .token = p->token};
        tp_pend_pop(e);
        e->done--;
    }
    return n;
}

bool tp_pend_full(const struct tp_conn_events *e)
{
    return e->pend_tail - e->pend_head >= TP_PEND_MAX;
}

struct tp_onesided *tp_pend_front(struct tp_conn_events *e)
{
    return e->pend_head == e->pend_tail ? NULL : &e->pend[e->pend_head % TP_PEND_MAX];
}

void tp_pend_pop(struct tp_conn_events *e)
{
    e->pend_head++;
}

void tp_conn_dead(struct tp_conn_events *e, int status, bool was_connecting)
{
    if (was_connecting)
        e->connected = true;
    e->dead = true;
    e->close_status = status;
    e->closed = true;
    e->writable = false;
}

int tp_emit_owed(struct tp_conn_events *e, struct tern_tp_conn *c, struct tern_tp_event *ev,
                 int max)
{
    int n = 0;

    if (n < max && e->accepted) {
        e->accepted = false;
        ev[n++] = (struct tern_tp_event){.type = TERN_TP_EV_ACCEPTED, .conn = c};
    }
    if (n < max && e->connected) {
        e->connected = false;
        ev[n++] = (struct tern_tp_event){.type = TERN_TP_EV_CONNECTED, .conn = c,
                                         .status = e->dead ? e->close_status : 0};
    }
    if (n < max && e->writable) {
        e->writable = false;
        ev[n++] = (struct tern_tp_event){.type = TERN_TP_EV_WRITABLE, .conn = c};
    }
    if (!e->dead)
        n += tp_emit_done(e, c, ev + n, max - n);
    return n;
}

int tp_emit_dead(struct tp_conn_events *e, struct tern_tp_conn *c, struct tern_tp_event *ev,
                 int max)
{
    struct tp_onesided *p;
    int n = 0;

    /* Completed operations are reported as they went; those still in
     * flight never complete now: fail them. */
    n = tp_emit_done(e, c, ev, max);
    while (n < max && (p = tp_pend_front(e))) {
        ev[n++] = (struct tern_tp_event){
            .type = p->is_put ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE,
            .status = TERN_ECONNRESET, .conn = c, .token = p->token};
        tp_pend_pop(e);
    }
    if (n < max && e->closed && !tp_pend_front(e)) {
        e->closed = false;
        ev[n++] = (struct tern_tp_event){.type = TERN_TP_EV_CLOSED, .conn = c,
                                         .status = e->close_status};
    }
    return n;
}

void tp_conn_add(struct tern_tp_ep *ep, struct tern_tp_conn *c)
{
    c->ep = ep;
    c->rma_shut = ep->rma_gated;
    c->prev = NULL;
    c->next = ep->conns;
    if (ep->conns)
        ep->conns->prev = c;
    ep->conns = c;
    ep->nconns++;
}

void tp_conn_del(struct tern_tp_conn *c)
{
    struct tern_tp_ep *ep = c->ep;

    tp_ready_remove(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        ep->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    ep->nconns--;
}

void tp_ready_push(struct tern_tp_conn *c)
{
    if (c->on_ready)
        return;
    c->on_ready = true;
    c->ready_next = c->ep->ready;
    c->ep->ready = c;
}

void tp_ready_remove(struct tern_tp_conn *c)
{
    struct tern_tp_conn **pp = &c->ep->ready;

    if (!c->on_ready)
        return;
    while (*pp && *pp != c)
        pp = &(*pp)->ready_next;
    if (*pp)
        *pp = c->ready_next;
    c->on_ready = false;
}

struct tern_tp_conn *tp_ready_take(struct tern_tp_ep *ep)
{
    struct tern_tp_conn *list = ep->ready;

    ep->ready = NULL;
    return list;
}
