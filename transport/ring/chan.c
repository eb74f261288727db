/* Connections of the ring fabrics (chan.h): messages, fragments of large
 * ones and served one-sided operations over a channel of a link, driven by
 * the ring protocol of ring.h. The data path only writes the peer's window
 * and reads its own, exactly as through a PCIe BAR, so a provider over
 * plain shared memory runs the same protocol as one over a PCIe window.
 *
 * No system call is made on the data path while both sides poll. Messages
 * up to a ring record go straight into the peer's window (zero copy: the
 * caller writes into peer memory). Larger ones are staged and sent as FRAG
 * records, a few per connection per poll, and reassembled by the receiver.
 * One-sided put/get travel as CTL records served by the peer's poll, with
 * the same checks as every fabric (a provider may do them directly first:
 * shm/direct.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "chan.h"

#define RING_RX_BATCH 16            /* records per connection per poll */
#define RING_FRAG_BATCH 4           /* fragments per connection per poll */
#define RING_EPOLL_EVERY 32         /* look at sockets once per this many polls */
#define RING_EPOLL_NS 20000         /* ... and at most once per this many ns */
#define RING_CTL_EVERY 4            /* control channels: a power of two dividing it */
#define RING_MAX_VIOLATIONS 16
#define LOG_WHO "ring"

/* CTL record payload, followed by data for PUT and GET_RESP. */
enum ring_ctl_op { CTL_PUT = 1, CTL_GET = 2, CTL_ACK = 3, CTL_GET_RESP = 4 };

struct ring_ctl_rec {
    uint8_t op;
    uint8_t pad[3];
    int32_t status;
    uint32_t key;
    uint32_t len;
    uint64_t off;
};

/* FRAG record prefix. */
struct ring_frag {
    uint32_t total;
    uint32_t offset;
};

/* ---- connection lifetime ---- */

void ring_conn_ready(struct ring_conn *c)
{
    tp_ready_push(&c->base);
}

static struct ring_conn *conn_new(struct ring_ep *ep)
{
    struct ring_conn *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    tp_conn_add(&ep->base, &c->base);
    return c;
}

/* Put `c` on channel `chan` of `l` (the link counts it already). */
void ring_conn_bind(struct ring_conn *c, struct ring_link *l, uint32_t chan)
{
    c->link = l;
    c->chan = chan;
    l->chan[chan] = c;
    ring_tx_init(&c->tx, l->mine + RING_LINK_OFF, l->peers + RING_LINK_OFF, &l->g, chan);
    ring_rx_init(&c->rx, l->mine + RING_LINK_OFF, l->peers + RING_LINK_OFF, &l->g, chan);
    c->tx.wc = l->ctl_tx.wc;    /* a BAR is write-combining */
    snprintf(c->peer, sizeof(c->peer), "%s://%s#%u", l->ep->base.fabric->name, l->name, chan);
    c->state = ST_OPEN;
}

struct ring_conn *ring_conn_attach(struct ring_link *l, uint32_t chan, bool accepted)
{
    struct ring_conn *c;

    if (l->ep->base.nconns >= l->ep->base.cfg.max_conns || !(c = conn_new(l->ep)))
        return NULL;
    l->nconns++;
    ring_conn_bind(c, l, chan);
    if (accepted) {
        c->ev.accepted = true;
        ring_conn_ready(c);
    }
    return c;
}

void ring_conn_fail(struct ring_conn *c, int status, const char *why)
{
    if (c->state == ST_DEAD)
        return;
    if (status < 0)
        tern_log(TERN_LOG_WARN, LOG_WHO, "connection %s closed: %s (%s)", c->peer, why,
                 tern_strerror(status));
    tp_conn_dead(&c->ev, status, false);
    c->state = ST_DEAD;
    ring_conn_ready(c);
}

/* The peer closed the channel or the whole link: hand out what it
 * published, then report CLOSED. */
void ring_conn_peer_gone(struct ring_conn *c)
{
    if (c->state == ST_OPEN)
        c->state = ST_DRAINING;
    ring_conn_ready(c);
}

void ring_tp_disconnect(struct tern_tp_conn *conn)
{
    struct ring_conn *c = RCONN(conn);

    if (c->link) {
        /* A shared channel is reused once both sides said CLOSE, so a
         * connection that died on its own says it too. */
        if (c->state == ST_OPEN || c->state == ST_DRAINING ||
            (c->link->ep->ops->shared_channels && c->chan))
            ring_link_send_close(c->link, c->chan);
        ring_link_drop_conn(c->link, c);
    }
    tp_conn_del(&c->base);
    free(c->stage);
    free(c->reasm);
    free(c);
}

const char *ring_tp_conn_peer(const struct tern_tp_conn *conn)
{
    return RCONN(conn)->peer;
}

int ring_tp_listen(struct tern_tp_ep *base, const char *addr, char *bound, size_t bound_len)
{
    return REP(base)->ops->listen(REP(base), addr, bound, bound_len);
}

int ring_tp_connect(struct tern_tp_ep *base, const char *addr, struct tern_tp_conn **out)
{
    struct ring_ep *ep = REP(base);
    struct ring_conn *c;
    int rc;

    if (base->nconns >= base->cfg.max_conns)
        return TERN_ENOBUFS;
    c = conn_new(ep);
    if (!c)
        return TERN_ENOMEM;
    snprintf(c->peer, sizeof(c->peer), "%s://%s", base->fabric->name, addr);
    c->state = ST_CONNECTING;
    rc = ep->ops->connect(ep, addr, c);
    if (rc < 0) {
        if (c->link)
            ring_link_drop_conn(c->link, c);
        tp_conn_del(&c->base);
        free(c);
        return rc;
    }
    ring_links_doorbells(ep);    /* a peer asleep learns of the OPEN now */
    *out = &c->base;
    return 0;
}

/* The receiver answered a sender's credit request: that sender may be
 * asleep, so this poll's flush rings its doorbell. */
static void note_answer(struct ring_conn *c)
{
    if (c->rx.answered && c->link) {
        c->rx.answered = false;
        ring_link_published(c->link);
    }
}

/* ---- send path ---- */

int ring_tp_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf)
{
    struct ring_conn *c = RCONN(conn);
    uint8_t *p;

    if (c->state != ST_OPEN && c->state != ST_CONNECTING)
        return TERN_ENOTCONN;
    if (c->tx.resv || c->stage_resv)
        return TERN_EINVAL;
    /* A large message still leaving keeps later ones behind it, in order. */
    if (c->frag_pending) {
        c->want_writable = true;
        return TERN_EAGAIN;
    }
    /* While a link comes up, one message waits in the stage (and goes
     * as fragments once the channel is there); more get TERN_EAGAIN. */
    if (c->state == ST_OPEN && len <= ring_max_record(c->tx.size)) {
        p = ring_tx_reserve(&c->tx, (uint32_t)len);
        if (!p) {
            c->want_writable = true;
            return TERN_EAGAIN;
        }
        *buf = p;
        return 0;
    }
    /* At least a byte: an empty message gets a reservation too. */
    if (c->stage_cap < len || !c->stage) {
        size_t cap = len ? len : 1;
        uint8_t *s = realloc(c->stage, cap);

        if (!s)
            return TERN_ENOMEM;
        c->stage = s;
        c->stage_cap = cap;
    }
    c->stage_resv = true;
    c->frag_total = len;
    *buf = c->stage;
    return 0;
}

/* Push fragments of the staged message while credit lasts (at most
 * RING_FRAG_BATCH per call, so one elephant cannot hog the poll). */
static void push_frags(struct ring_conn *c)
{
    uint32_t chunk = ring_max_record(c->tx.size) - (uint32_t)sizeof(struct ring_frag);

    for (int i = 0; i < RING_FRAG_BATCH && c->frag_pending; i++) {
        size_t left = c->frag_total - c->frag_off;
        uint32_t n = left < chunk ? (uint32_t)left : chunk;
        struct ring_frag f = {.total = (uint32_t)c->frag_total, .offset = (uint32_t)c->frag_off};
        uint8_t *p = ring_tx_reserve(&c->tx, n + (uint32_t)sizeof(f));

        if (!p)
            return;
        memcpy(p, &f, sizeof(f));
        memcpy(p + sizeof(f), c->stage + c->frag_off, n);
        ring_tx_publish(&c->tx, n + (uint32_t)sizeof(f), RING_FRAG);
        ring_link_published(c->link);
        c->frag_off += n;
        if (c->frag_off == c->frag_total)
            c->frag_pending = false;
    }
}

int ring_tp_msg_post(struct tern_tp_conn *conn, void *buf, size_t len)
{
    struct ring_conn *c = RCONN(conn);

    if (c->stage_resv && buf == c->stage) {
        c->stage_resv = false;
        if (len > c->frag_total)
            return TERN_EMSGSIZE;
        if (c->state != ST_OPEN && c->state != ST_CONNECTING)
            return TERN_ENOTCONN;
        if (c->state == ST_OPEN && len <= ring_max_record(c->tx.size)) {
            /* Shrunk to fit one record after all. */
            void *p = ring_tx_reserve(&c->tx, (uint32_t)len);

            if (p) {
                memcpy(p, c->stage, len);
                ring_tx_publish(&c->tx, (uint32_t)len, RING_MSG);
                ring_link_published(c->link);
                return 0;
            }
        }
        c->frag_total = len;
        c->frag_off = 0;
        c->frag_pending = true;
        if (c->state == ST_OPEN)
            push_frags(c);
        return 0;
    }
    if (!c->tx.resv || buf != c->tx.resv)
        return TERN_EINVAL;
    if (len > c->tx.resv_len)
        return TERN_EMSGSIZE;
    ring_tx_publish(&c->tx, (uint32_t)len, RING_MSG);
    ring_link_published(c->link);
    return 0;
}

void ring_tp_msg_abort(struct tern_tp_conn *conn, void *buf)
{
    struct ring_conn *c = RCONN(conn);

    if (c->stage_resv && buf == c->stage)
        c->stage_resv = false;
    else if (c->tx.resv == buf)
        ring_tx_abort(&c->tx);
}

void ring_tp_msg_release(struct tern_tp_conn *conn, const void *view)
{
    struct ring_conn *c = RCONN(conn);

    if (c->reasm_held && view == c->reasm) {
        c->reasm_held = false;
        ring_conn_ready(c);      /* a stalled FRAG may go on now */
        return;
    }
    if (c->rx.views) {
        ring_rx_release(&c->rx);
        note_answer(c);
    }
}

/* ---- one-sided (requester) ---- */

static int ctl_send(struct ring_conn *c, const struct ring_ctl_rec *ctl, const void *data,
                    uint32_t len)
{
    uint8_t *p;

    if (c->tx.resv || c->stage_resv || c->frag_pending)
        return TERN_EAGAIN;
    p = ring_tx_reserve(&c->tx, (uint32_t)sizeof(*ctl) + len);
    if (!p)
        return TERN_EAGAIN;
    memcpy(p, ctl, sizeof(*ctl));
    if (len)
        memcpy(p + sizeof(*ctl), data, len);
    ring_tx_publish(&c->tx, (uint32_t)sizeof(*ctl) + len, RING_CTL);
    ring_link_published(c->link);
    return 0;
}

/* The largest one-sided operation: one CTL record with its payload. */
size_t ring_conn_onesided_max(const struct ring_conn *c)
{
    return ring_max_record(c->tx.size) - sizeof(struct ring_ctl_rec);
}

static int onesided(struct ring_conn *c, uint8_t op, const void *src, uint8_t *dst, size_t len,
                    const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    struct ring_ctl_rec ctl = {.op = op, .key = rkey->key, .len = (uint32_t)len, .off = roff};
    int rc;

    if (c->state != ST_OPEN)
        return TERN_ENOTCONN;
    if (len > ring_conn_onesided_max(c))
        return TERN_EMSGSIZE;
    if (tp_pend_full(&c->ev))
        return TERN_EAGAIN;
    rc = ctl_send(c, &ctl, src, op == CTL_PUT ? (uint32_t)len : 0);
    if (rc == TERN_EAGAIN)
        c->want_writable = true;
    if (rc < 0)
        return rc;
    return tp_pend_push(&c->ev, op == CTL_PUT, dst, len, token);
}

size_t ring_tp_rma_max(const struct tern_tp_conn *conn)
{
    return ring_conn_onesided_max(RCONN(conn));
}

int ring_tp_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, const void *src, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    return onesided(RCONN(conn), CTL_PUT, src, NULL, len, rkey, roff, token);
}

int ring_tp_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, void *dst, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    return onesided(RCONN(conn), CTL_GET, NULL, dst, len, rkey, roff, token);
}

/* ---- receive path ---- */

/* Serve or complete a CTL record. Returns 1 handled (ev may be filled:
 * *got = 1), 0 to retry later (no room to answer), <0 protocol error. */
static int on_ctl(struct ring_conn *c, const uint8_t *p, uint32_t len, struct tern_tp_event *ev,
                  int *got)
{
    struct ring_ctl_rec ctl, ans = {0};
    uint8_t *where = NULL;
    struct tp_onesided *pd;

    if (len < sizeof(ctl))
        return TERN_EPROTO;
    /* It is released at once, so no view before it may still be held. */
    if (c->rx.views > 1)
        return 0;
    memcpy(&ctl, p, sizeof(ctl));
    if (ctl.op == CTL_PUT || ctl.op == CTL_GET) {
        int status;

        if (ctl.op == CTL_PUT && ctl.len != len - sizeof(ctl))
            return TERN_EPROTO;
        if (ctl.op == CTL_GET && len != sizeof(ctl))
            return TERN_EPROTO;
        status = ctl.len + sizeof(ctl) > ring_max_record(c->tx.size)
                     ? TERN_EREMACCESS
                     : tp_mr_check(&c->base, ctl.key, ctl.off, ctl.len,
                                        ctl.op == CTL_PUT ? TERN_TP_ACCESS_REMOTE_WRITE
                                                          : TERN_TP_ACCESS_REMOTE_READ,
                                        &where);
        if (status < 0 && c->violations + 1 > RING_MAX_VIOLATIONS) {
            ring_conn_fail(c, TERN_EREMACCESS, "too many refused one-sided accesses");
            return 1;
        }
        /* A peer that left needs no answer (and no credit will come back
         * for one): consume the request and move on. */
        if (c->state == ST_DRAINING)
            return 1;
        ans.op = ctl.op == CTL_PUT ? CTL_ACK : CTL_GET_RESP;
        ans.status = status;
        ans.len = ctl.op == CTL_GET && status == 0 ? ctl.len : 0;
        /* The data lands before the ACK can be seen: the requester may
         * follow it with direct stores to the same bytes. (If the ACK finds
         * no room, the record is read again later and copied again: the
         * same bytes.) */
        if (status == 0 && ctl.op == CTL_PUT)
            memcpy(where, p + sizeof(ctl), ctl.len);
        if (ctl_send(c, &ans, where, ans.len) < 0)
            return 0;
        if (status < 0)
            c->violations++;
        return 1;
    }
    if (ctl.op != CTL_ACK && ctl.op != CTL_GET_RESP)
        return TERN_EPROTO;
    if (c->ev.done)
        return 0;   /* direct completions ahead of it are reported first */
    pd = tp_pend_front(&c->ev);
    if (!pd || (ctl.op == CTL_ACK) != pd->is_put || ctl.status > 0 ||
        (ctl.status == 0 && ctl.op == CTL_GET_RESP &&
         (ctl.len != pd->len || len != sizeof(ctl) + pd->len)))
        return TERN_EPROTO;
    if (ctl.status == 0 && ctl.op == CTL_GET_RESP)
        memcpy(pd->dst, p + sizeof(ctl), pd->len);
    tp_pend_pop(&c->ev);
    *ev = (struct tern_tp_event){
        .type = ctl.op == CTL_ACK ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE,
        .status = ctl.status, .conn = &c->base, .token = pd->token,
    };
    *got = 1;
    return 1;
}

/* A FRAG record. Returns 1 consumed (ev filled when the message is whole),
 * 0 to retry later (a view is still held), <0 protocol error. */
static int on_frag(struct ring_conn *c, const uint8_t *p, uint32_t len, struct tern_tp_event *ev,
                   int *got)
{
    struct ring_frag f;
    size_t n;

    if (len < sizeof(f))
        return TERN_EPROTO;
    memcpy(&f, p, sizeof(f));
    n = len - sizeof(f);
    /* The reassembly buffer holds one message; ring records before this
     * one must be released first, as views go back in order. */
    if (c->reasm_held || c->rx.views > 1)
        return 0;
    if (f.offset == 0) {
        if (f.total > c->base.ep->cfg.max_msg || f.total < n)
            return TERN_EPROTO;
        /* At least a byte: an empty message (posted while its link came
         * up, it goes as a FRAG too) gets a view as every other one does. */
        if (c->reasm_cap < f.total || !c->reasm) {
            size_t cap = f.total ? f.total : 1;
            uint8_t *r = realloc(c->reasm, cap);

            if (!r)
                return TERN_ENOMEM;
            c->reasm = r;
            c->reasm_cap = cap;
        }
        c->reasm_total = f.total;
        c->reasm_got = 0;
    }
    if (f.offset != c->reasm_got || f.total != c->reasm_total || n > f.total - f.offset)
        return TERN_EPROTO;
    memcpy(c->reasm + f.offset, p + sizeof(f), n);
    c->reasm_got += n;
    if (c->reasm_got == c->reasm_total) {
        c->reasm_held = true;
        *ev = (struct tern_tp_event){.type = TERN_TP_EV_RECV, .conn = &c->base,
                                     .data = c->reasm, .len = c->reasm_total};
        *got = 1;
    }
    return 1;
}

/* Up to RING_RX_BATCH records of one connection (fairness bound). */
static int rx_progress(struct ring_conn *c, struct tern_tp_event *ev, int max)
{
    int n = 0;

    for (int i = 0; i < RING_RX_BATCH && n < max && c->state != ST_DEAD; i++) {
        const void *view;
        uint32_t len;
        enum ring_type type;
        int rc = ring_rx_peek(&c->rx, &view, &len, &type), got = 0;

        if (rc == 0)
            break;
        if (rc < 0) {
            ring_conn_fail(c, rc, "corrupt ring");
            break;
        }
        if (type == RING_MSG) {
            ev[n++] = (struct tern_tp_event){.type = TERN_TP_EV_RECV, .conn = &c->base,
                                             .data = view, .len = len};
            continue;
        }
        rc = type == RING_FRAG ? on_frag(c, view, len, &ev[n], &got)
                               : on_ctl(c, view, len, &ev[n], &got);
        if (rc < 0) {
            ring_conn_fail(c, rc, "malformed record");
            break;
        }
        if (rc == 0) {
            ring_rx_unpeek(&c->rx, len);
            break;
        }
        ring_rx_release(&c->rx);    /* FRAG and CTL records are copied out */
        n += got;
    }
    ring_rx_credit(&c->rx);
    note_answer(c);
    return n;
}

/* Most polls of most connections find nothing: say so in a few loads,
 * inline, before paying for a call to conn_progress. */
static inline bool conn_quiet(const struct ring_conn *c)
{
    return c->state == ST_OPEN && !c->frag_pending && !c->want_writable &&
           !tp_events_owed(&c->ev) && ring_rx_quiet(&c->rx);
}

static int conn_progress(struct ring_conn *c, struct tern_tp_event *ev, int max)
{
    bool open = c->state == ST_OPEN || c->state == ST_DRAINING;
    int n;

    if (open) {
        if (c->frag_pending)
            push_frags(c);
        if (c->want_writable && !c->frag_pending && ring_tx_room(&c->tx) >= c->tx.size / 4) {
            c->want_writable = false;
            c->ev.writable = true;
        }
    }
    n = tp_events_owed(&c->ev) ? tp_emit_owed(&c->ev, &c->base, ev, max) : 0;
    if (open) {
        n += rx_progress(c, ev + n, max - n);
        /* The peer left: everything it published has been handed out. */
        if (c->state == ST_DRAINING && n < max && !c->rx.views && !c->reasm_held) {
            const void *v;
            uint32_t l;
            enum ring_type t;
            int rc = ring_rx_peek(&c->rx, &v, &l, &t);

            if (rc == 1)
                ring_rx_unpeek(&c->rx, l);
            else
                ring_conn_fail(c, rc, rc ? "corrupt ring" : "peer left");
        }
    }
    if (c->state == ST_DEAD)
        n += tp_emit_dead(&c->ev, &c->base, ev + n, max - n);
    return n;
}

static bool conn_owes(const struct ring_conn *c)
{
    return tp_events_owed(&c->ev) || c->state == ST_DRAINING;
}

/* ---- polling and sleeping ---- */

int ring_tp_flush(struct tern_tp_ep *base)
{
    ring_links_doorbells(REP(base));
    return 0;
}

/* Sockets only carry set-up, hang-ups and doorbells: look at them every
 * RING_EPOLL_EVERY polls, and then only if RING_EPOLL_NS have passed. A
 * system call costs as much as a dozen idle polls, and a message that
 * arrives during one waits for it: a busy loop makes one every 20 us, an
 * endpoint polled now and then every 32 polls. */
static bool sockets_due(struct ring_ep *ep)
{
    struct timespec ts;
    uint64_t now;

    if (ep->polls % RING_EPOLL_EVERY != 0)
        return false;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    if (now - ep->sockets_at < RING_EPOLL_NS)
        return false;
    ep->sockets_at = now;
    return true;
}

int ring_tp_poll(struct tern_tp_ep *base, struct tern_tp_event *ev, int max)
{
    struct ring_ep *ep = REP(base);
    struct tern_tp_conn *todo;
    int n = 0;

    if (ep->armed)
        ring_links_set_sleeping(ep, false);
    /* Each link's channel 0 (opens, closes) is read every RING_CTL_EVERY
     * polls: set-up is not worth a cost on every poll of the data path. */
    if ((++ep->polls & (RING_CTL_EVERY - 1)) == 0)
        ring_links_poll(ep, sockets_due(ep));
    /* Owed events first. */
    todo = tp_ready_take(base);
    while (todo) {
        struct ring_conn *c = RCONN(todo);

        todo = todo->ready_next;
        c->base.on_ready = false;
        if (n < max)
            n += conn_progress(c, ev + n, max - n);
        if (conn_owes(c))
            ring_conn_ready(c);
    }
    /* Then every open connection, a bounded batch each. */
    for (struct tern_tp_conn *b = base->conns; b && n < max; b = b->next)
        if (RCONN(b)->state == ST_OPEN && !b->on_ready && !conn_quiet(RCONN(b)))
            n += conn_progress(RCONN(b), ev + n, max - n);
    ring_links_doorbells(ep);
    return n;
}

/* A record this side can act on now. While the application holds views,
 * what waits behind them is not: it releases first, then polls. */
static bool conn_has_input(struct ring_conn *c)
{
    const void *v;
    uint32_t l;
    enum ring_type t;
    int rc;

    if (c->rx.views || c->reasm_held)
        return false;
    rc = ring_rx_peek(&c->rx, &v, &l, &t);

    if (rc == 1)
        ring_rx_unpeek(&c->rx, l);
    return rc != 0;
}

int ring_tp_arm(struct tern_tp_ep *base)
{
    struct ring_ep *ep = REP(base);

    if (base->ready)
        return TERN_EAGAIN;
    /* Tell every peer we sleep, then look once more: a message published
     * before the peer saw the flag is found here, one after it rings. */
    ring_links_set_sleeping(ep, true);
    /* A sender waiting for credit may sleep: the receiver rings the
     * doorbell when it answers the credit request (ring_rx.answered). */
    for (struct tern_tp_conn *b = base->conns; b; b = b->next)
        if (RCONN(b)->state == ST_OPEN && conn_has_input(RCONN(b)))
            return TERN_EAGAIN;
    for (struct ring_link *l = ep->links; l; l = l->next) {
        const void *v;
        uint32_t len;
        enum ring_type t;
        int rc;

        if (l->state != LINK_OPEN)
            continue;
        rc = ring_rx_peek(&l->ctl_rx, &v, &len, &t);
        if (rc == 1)
            ring_rx_unpeek(&l->ctl_rx, len);
        if (rc != 0)
            return TERN_EAGAIN;
    }
    return 0;
}

int ring_tp_wait(struct tern_tp_ep *base, int timeout_ms)
{
    struct ring_ep *ep = REP(base);
    struct epoll_event e;
    int rc;

    if (ring_tp_arm(base) < 0) {
        ring_links_set_sleeping(ep, false);
        return 1;
    }
    /* Links that live on heartbeats wake to beat in time. */
    if (ep->ops->beat_ms && (timeout_ms < 0 || timeout_ms > ep->ops->beat_ms))
        timeout_ms = ep->ops->beat_ms;
    rc = epoll_wait(ep->epfd, &e, 1, timeout_ms);
    ring_links_set_sleeping(ep, false);
    /* A socket spoke (or a beat may be due): the next poll looks. */
    if (rc > 0 || ep->ops->beat_ms) {
        ep->polls = RING_EPOLL_EVERY - 1;
        ep->sockets_at = 0;
    }
    return rc > 0;
}

int ring_tp_wait_fd(struct tern_tp_ep *base)
{
    return REP(base)->epfd;
}

/* ---- endpoint ---- */

int ring_ep_open(struct tern_tp_ep *base, const struct ring_link_ops *ops)
{
    struct ring_ep *ep = REP(base);

    ep->ops = ops;
    ep->g = ops->geometry;
    ep->epfd = epoll_create1(EPOLL_CLOEXEC);
    return ep->epfd < 0 ? -errno : 0;
}

void ring_tp_ep_close(struct tern_tp_ep *base)
{
    struct ring_ep *ep = REP(base);

    while (base->conns)
        ring_tp_disconnect(base->conns);
    ring_links_close_all(ep);
    close(ep->epfd);
}
