/* Replies remembered for failover. A client session that may move to
 * another fabric (auto://) carries a token; all server sessions with that
 * token share one replay cache holding the last `credits` replies. A request
 * re-sent after a move is answered from the cache instead of being run
 * twice. Connections are reliable and in order, so a reply lost with a dead
 * connection belongs to a call still in flight, and at most `credits` of
 * those exist: a cache that size is enough. Entry buffers grow to the
 * largest reply seen and are reused, so the steady state allocates nothing. */
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

const struct rpc_replay_ent *rpc_replay_find(const struct rpc_replay *rp, uint64_t req_id)
{
    for (unsigned i = 0; i < rp->n; i++)
        if (rp->ent[i].used && rp->ent[i].req_id == req_id)
            return &rp->ent[i];
    return NULL;
}

void rpc_replay_add(struct rpc_replay *rp, uint64_t req_id, int status, const void *data,
                    size_t len)
{
    struct rpc_replay_ent *e = &rp->ent[rp->next_slot++ % rp->n];

    if (len > e->cap) {
        uint8_t *b = realloc(e->buf, len);

        if (!b) {           /* cannot remember it: forget the slot instead */
            e->used = false;
            return;
        }
        e->buf = b;
        e->cap = len;
    }
    if (len)
        memcpy(e->buf, data, len);
    e->req_id = req_id;
    e->status = status;
    e->len = len;
    e->used = true;
}
