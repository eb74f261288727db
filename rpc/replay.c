/* Replies remembered for failover. A client session that may move to
 * another fabric (auto://) carries a token; all server sessions with that
 * token share one replay state:
 *
 *  - the last `credits` replies, whole (up to REPLAY_KEEP_MAX bytes each):
 *    connections are reliable and in order, so the replies a dead
 *    connection swallowed belong to calls still in flight, at most
 *    `credits` of them;
 *  - the ids of the last REPLAY_IDS calls run, without replies: a call
 *    re-sent after its slot in the first list was reused (its caller gave
 *    up on it early, which returns its credit) or with a reply too large to
 *    keep is not run again; it gets TERN_ECONNRESET, "ran, reply lost".
 *
 * Only re-sent calls are looked up, until the first one arrives: from then
 * on every call of the token is, so that an original still queued on the
 * dead path does not run after its re-sent copy. Entry buffers grow to the
 * largest reply kept and are reused: the steady state allocates nothing. */
#include <stdlib.h>
#include <string.h>

#include "rpc_internal.h"

struct rpc_replay *rpc_replay_get(struct tern_rpc_ep *ep, uint64_t token)
{
    struct rpc_replay *rp;

    for (rp = ep->replays; rp; rp = rp->next)
        if (rp->token == token) {
            rp->refs++;
            return rp;
        }
    rp = calloc(1, sizeof(*rp) + ep->cfg.credits * sizeof(rp->ent[0]));
    if (!rp)
        return NULL;
    rp->token = token;
    rp->n = ep->cfg.credits;
    rp->refs = 1;
    rp->next = ep->replays;
    ep->replays = rp;
    return rp;
}

void rpc_replay_put(struct tern_rpc_ep *ep, struct rpc_replay *rp)
{
    struct rpc_replay **pp = &ep->replays;

    if (!rp || --rp->refs)
        return;
    while (*pp && *pp != rp)
        pp = &(*pp)->next;
    if (*pp)
        *pp = rp->next;
    for (unsigned i = 0; i < rp->n; i++)
        free(rp->ent[i].buf);
    free(rp);
}

int rpc_replay_find(const struct rpc_replay *rp, const struct rpc_hdr *h,
                    const struct rpc_replay_ent **ent)
{
    *ent = NULL;
    for (unsigned i = 0; i < rp->n; i++) {
        const struct rpc_replay_ent *e = &rp->ent[i];

        if (e->used && e->req_id == h->req_id && e->svc == h->svc && e->method == h->method) {
            *ent = e;
            return 1;
        }
    }
    for (unsigned i = 0; i < REPLAY_IDS; i++)
        if (rp->ids[i] == h->req_id && h->req_id)
            return 1;   /* ran, reply not kept */
    return 0;
}

void rpc_replay_add(struct rpc_replay *rp, const struct rpc_hdr *h, int status,
                    const void *data, size_t len)
{
    struct rpc_replay_ent *e = &rp->ent[rp->next_slot++ % rp->n];

    rp->ids[rp->next_id++ % REPLAY_IDS] = h->req_id;
    e->used = false;
    if (len > REPLAY_KEEP_MAX)
        return;         /* remembered by id only */
    if (len > e->cap) {
        uint8_t *b = realloc(e->buf, len);

        if (!b)
            return;
        e->buf = b;
        e->cap = len;
    }
    if (len)
        memcpy(e->buf, data, len);
    e->req_id = h->req_id;
    e->svc = h->svc;
    e->method = h->method;
    e->status = status;
    e->len = len;
    e->used = true;
}
