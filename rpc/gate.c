/* Gates: replies held past their poll until a service passes their ticket
 * (see tern_rpc_gate_open in rpc.h).
 *
 * Held replies form a queue in ticket order: `ents` is an array used as a
 * FIFO (head..n) and `buf` holds their headers' payloads back to back.
 * Passing pops from the head; when the queue empties both are reset to
 * their start, and when the dead space at the front passes half the array
 * the live part is moved down, so neither grows without bound under a
 * steady load whose queue never quite drains.
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rpc_internal.h"

struct gate_ent {
    struct tern_session *s;         /* NULL: the session went meanwhile */
    struct rpc_hdr h;
    uint64_t ticket;
    size_t off, len;
};

struct tern_rpc_gate {
    struct tern_rpc_ep *ep;
    struct tern_rpc_gate *next;     /* the endpoint's gates */
    struct gate_ent *ents;
    unsigned head, n, cap;
    uint8_t *buf;
    size_t buf_head, buf_len, buf_cap;
    uint64_t last;                  /* highest ticket gated */
};

int tern_rpc_gate_open(struct tern_rpc_ep *ep, struct tern_rpc_gate **out)
{
    struct tern_rpc_gate *g;

    if (!ep || !out)
        return TERN_EINVAL;
    g = calloc(1, sizeof(*g));
    if (!g)
        return TERN_ENOMEM;
    g->ep = ep;
    g->next = ep->gates;
    ep->gates = g;
    *out = g;
    return 0;
}

static void unlink_gate(struct tern_rpc_gate *g)
{
    if (!g->ep)
        return;
    for (struct tern_rpc_gate **p = &g->ep->gates; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            return;
        }
}

void tern_rpc_gate_close(struct tern_rpc_gate *g)
{
    if (!g)
        return;
    tern_rpc_gate_fail(g, TERN_ESHUTDOWN);
    unlink_gate(g);
    free(g->ents);
    free(g->buf);
    free(g);
}

/* Room for one more entry and `len` payload bytes: compact first, grow if
 * that is not enough. */
static bool make_room(struct tern_rpc_gate *g, size_t len)
{
    if (g->head && (g->head == g->n || g->head >= g->cap / 2)) {
        memmove(g->ents, g->ents + g->head, (g->n - g->head) * sizeof(*g->ents));
        g->n -= g->head;
        g->head = 0;
        memmove(g->buf, g->buf + g->buf_head, g->buf_len - g->buf_head);
        for (unsigned i = 0; i < g->n; i++)
            g->ents[i].off -= g->buf_head;
        g->buf_len -= g->buf_head;
        g->buf_head = 0;
    }
    if (g->n == g->cap) {
        unsigned cap = g->cap ? 2 * g->cap : 64;
        struct gate_ent *n = realloc(g->ents, cap * sizeof(*n));

        if (!n)
            return false;
        g->ents = n;
        g->cap = cap;
    }
    if (g->buf_len + len > g->buf_cap) {
        size_t cap = g->buf_cap ? g->buf_cap : 16 * 1024;
        uint8_t *n;

        while (cap < g->buf_len + len)
            cap *= 2;
        n = realloc(g->buf, cap);
        if (!n)
            return false;
        g->buf = n;
        g->buf_cap = cap;
    }
    return true;
}

void tern_req_gate(struct tern_req *req, struct tern_rpc_gate *g, uint64_t ticket)
{
    req->gate = g;
    req->ticket = ticket;
}

bool rpc_gate_hold(struct tern_rpc_gate *g, struct tern_session *s, const struct rpc_hdr *h,
                   const void *body, size_t len, uint64_t ticket)
{
    if (!make_room(g, len))
        return false;
    if (ticket < g->last)
        ticket = g->last;
    g->last = ticket;
    if (len)
        memcpy(g->buf + g->buf_len, body, len);
    g->ents[g->n++] = (struct gate_ent){.s = s, .h = *h, .ticket = ticket,
                                        .off = g->buf_len, .len = len};
    g->buf_len += len;
    return true;
}

void tern_rpc_gate_pass(struct tern_rpc_gate *g, uint64_t upto)
{
    while (g->head < g->n && g->ents[g->head].ticket <= upto) {
        struct gate_ent *e = &g->ents[g->head++];

        if (e->s)
            rpc_emit(e->s, &e->h, g->buf + e->off, e->len);
        g->buf_head = e->off + e->len;
    }
    if (g->head == g->n) {
        g->head = g->n = 0;
        g->buf_head = g->buf_len = 0;
    }
}

void tern_rpc_gate_fail(struct tern_rpc_gate *g, int code)
{
    if (!g)
        return;
    for (unsigned i = g->head; i < g->n; i++)
        g->ents[i].h.status = code;
    tern_rpc_gate_pass(g, UINT64_MAX);
}

unsigned tern_rpc_gate_waiting(const struct tern_rpc_gate *g, uint64_t *lowest)
{
    if (lowest)
        *lowest = g->head < g->n ? g->ents[g->head].ticket : 0;
    return g->n - g->head;
}

void rpc_gate_forget(struct tern_session *s)
{
    for (struct tern_rpc_gate *g = s->ep->gates; g; g = g->next)
        for (unsigned i = g->head; i < g->n; i++)
            if (g->ents[i].s == s)
                g->ents[i].s = NULL;
}

void rpc_gates_detach(struct tern_rpc_ep *ep)
{
    for (struct tern_rpc_gate *g = ep->gates, *next; g; g = next) {
        next = g->next;
        for (unsigned i = g->head; i < g->n; i++)
            g->ents[i].s = NULL;
        g->ep = NULL;
        g->next = NULL;
    }
    ep->gates = NULL;
}
