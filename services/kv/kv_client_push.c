/* GET by server push (KV_M_PGET): the client names one of its staging
 * slots, the server puts the record there straight from its pool and
 * replies with its size; the record is checked as a window read's is. One
 * round trip, no remote read: the GET for links where writes are cheap and
 * reads are not. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "error.h"
#include "kv_client_internal.h"
#include "kv_hash.h"
#include "log.h"

static int pget_send(struct kv_op *op);

static void pget_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_op *op = arg;
    struct kv_onesided *c = op->kv->os;
    const struct pm_rec *r;
    struct kv_pget_rep rep;
    const uint8_t *rec;

    kv_stage_retire(op, status);      /* the server may still push into it */
    if (status == 0 && len < sizeof(rep))
        status = TERN_EPROTO;
    if (status < 0) {
        kv_op_finish(op, status, NULL, 0, 0);
        return;
    }
    memcpy(&rep, reply, sizeof(rep));
    if (!rep.size) {
        /* Sent inline: too big for a slot, or the server could not push. */
        if (len != sizeof(rep) + (uint64_t)rep.vlen) {
            kv_op_finish(op, TERN_EPROTO, NULL, 0, 0);
            return;
        }
        c->st.gets_rpc++;
        kv_op_finish(op, 0, (const uint8_t *)reply + sizeof(rep), rep.vlen, rep.version);
        return;
    }
    /* The reply came after the data (one session keeps the order), but a
     * server is not trusted with the bytes: key, version and sum decide. */
    rec = kv_stage_mem(c, op->stage);
    if (rep.size > STAGE_SLOT || !kvw_record_valid(rec, rep.size, op->key, op->klen, rep.version)) {
        c->st.torn++;
        if (++op->tries < MAX_TRIES && pget_send(op) == 0)
            return;
        kv_op_by_rpc_or_end(op, KV_M_GET, TERN_EIO);
        return;
    }
    r = (const void *)rec;
    c->st.gets_pushed++;
    kv_op_finish(op, 0, pm_rec_val(r), r->val_len, r->version);
}

/* Ask for the op's key to be pushed into its staging slot. */
static int pget_send(struct kv_op *op)
{
    struct kv_server *srv = op->srv;
    struct iovec iov[2];
    int rc;

    op->pget = (struct kv_pget){.klen = op->klen, .cap = STAGE_SLOT,
                                .off = (uint64_t)op->stage * STAGE_SLOT,
                                .dst = srv->os.stage_rkey};
    iov[0] = (struct iovec){.iov_base = &op->pget, .iov_len = sizeof(op->pget)};
    iov[1] = (struct iovec){.iov_base = (void *)op->key, .iov_len = op->klen};
    rc = tern_callv(srv->s, TERN_KV_SERVICE_ID, KV_M_PGET, iov, 2, op->kv->timeout, pget_done,
                    op, NULL);
    return rc;
}

int kv_push_get(struct kv_op *op)
{
    op->stage = kv_stage_get(op->kv->os);
    if (op->stage < 0 || pget_send(op) < 0)
        return kv_op_by_rpc(op, KV_M_GET);
    return 0;
}
