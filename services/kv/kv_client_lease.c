/* PUT into a leased segment: write a record (header with an intent id in
 * the version field, key, value) at the next free offset of the segment the
 * server leased to this client, through the mapping or by one-sided put
 * from a staging slot, and send KV_M_LPUT with the offset and the intent
 * id. The put and the call go on the same session, which delivers them in
 * order: no wait in between. The server checks the intent id, so a stale
 * record left at that offset by an earlier life of the segment is never
 * taken for this one. Without a lease (first use, segment full, lease taken
 * back) the PUT goes by RPC while a new lease is asked for in the
 * background. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "error.h"
#include "kv_client_internal.h"
#include "kv_hash.h"
#include "log.h"

static void lease_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_server *srv = arg;
    struct kv_lease l;

    srv->os.leasing = false;
    if (status < 0 || len != sizeof(l))
        return;
    memcpy(&l, reply, sizeof(l));
    if (l.next >= l.end || l.end > srv->os.info.seg_size || l.base > l.next)
        return;
    srv->os.lease = l;
    srv->os.next = l.next;
    srv->os.leased = true;
    srv->os.populated = false;
    srv->kv->os->st.leases++;
}

/* Ask for a (new) lease in the background; the old one, if any, is handed
 * back by the server when it grants the new one. */
void kv_lease_ask(struct tern_kv *kv, struct kv_server *srv)
{
    if (srv->os.leasing)
        return;
    srv->os.leased = false;
    srv->os.lreq = (struct kv_lease_req){0};
    if (tern_call(srv->s, TERN_KV_SERVICE_ID, KV_M_LEASE, &srv->os.lreq, sizeof(srv->os.lreq),
                  kv->timeout, lease_done, srv, NULL) == 0)
        srv->os.leasing = true;
}

static void lput_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_op *op = arg;
    struct kv_server *srv = op->srv;
    uint64_t version = 0;

    if (status == TERN_ENOLEASE || status == TERN_EINVAL || status == TERN_EPROTO) {
        /* The lease is gone or out of step (a refused record): lease again,
         * and store this value by RPC meanwhile. */
        if (srv->os.leased && srv->os.lease.seg == op->lput.seg)
            kv_lease_ask(op->kv, srv);
        kv_op_by_rpc_or_end(op, KV_M_PUT, status);
        return;
    }
    if (status == 0 && len != sizeof(struct kv_val))
        status = TERN_EPROTO;
    if (status == 0) {
        memcpy(&version, reply, sizeof(version));
        op->kv->os->st.puts++;      /* counted once stored: fallbacks are RPC's */
    }
    kv_op_finish(op, status, NULL, 0, version);
}

static void stage_put_done(void *arg, int status)
{
    struct kv_stage *st = arg;

    /* A failed put leaves the intent id unwritten: LPUT is refused. One
     * that timed out may still read the slot: it is never used again. */
    if (status == TERN_ETIMEDOUT)
        st->c->st.stage_lost++;
    else
        kv_stage_put(st->c, (int)st->idx);
}

/* Map a new lease's pages in at once (shm), one system call per lease
 * instead of a page fault per 4 KiB of records. */
static void lease_populate(struct kv_server *srv)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo, hi;
    void *p;

    srv->os.populated = true;
    if (tern_session_rkey_ptr(srv->s, &srv->os.lease.rkey, srv->os.next - srv->os.lease.base,
                              srv->os.lease.end - srv->os.next, TERN_TP_ACCESS_REMOTE_WRITE,
                              &p) < 0)
        return;
    lo = ((uintptr_t)p + page - 1) & ~(page - 1);
    hi = ((uintptr_t)p + (srv->os.lease.end - srv->os.next)) & ~(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);  /* a hint: errors are fine */
}

/* Lay a record out at `dst` for the server to take: a whole record with
 * the intent id in place of the version, summed here (the server swaps the
 * version in without reading the value). */
static void write_record(uint8_t *dst, const struct kv_op *op, uint64_t intent)
{
    struct pm_rec h = {.val_len = op->vlen, .version = intent, .key_len = op->klen,
                            .type = PM_VALUE};
    uint32_t size = pm_rec_size(op->klen, op->vlen);
    size_t used = sizeof(h) + op->klen + op->vlen;

    memcpy(dst, &h, sizeof(h));
    memcpy(dst + sizeof(h), op->key, op->klen);
    if (op->vlen)
        memcpy(dst + sizeof(h) + op->klen, op->val, op->vlen);
    memset(dst + used, 0, size - used);
    h.sum = pm_rec_sum_of((const struct pm_rec *)dst);
    memcpy(dst, &h.sum, sizeof(h.sum));
}

int kv_lease_put(struct kv_op *op)
{
    struct tern_kv *kv = op->kv;
    struct kv_onesided *c = kv->os;
    struct kv_server *srv = op->srv;
    uint32_t size;
    struct iovec iov;
    void *p;
    int rc;

    size = pm_rec_size(op->klen, op->vlen);
    if (!srv->os.leased || size > srv->os.lease.end - srv->os.next) {
        kv_lease_ask(kv, srv);
        return kv_op_by_rpc(op, KV_M_PUT);
    }
    op->lput = (struct kv_lput){.seg = srv->os.lease.seg, .off = srv->os.next,
                                .intent = c->intent++};
    rc = tern_session_rkey_ptr(srv->s, &srv->os.lease.rkey, srv->os.next - srv->os.lease.base,
                               size, TERN_TP_ACCESS_REMOTE_WRITE, &p);
    if (rc == 0) {
        if (!srv->os.populated)
            lease_populate(srv);
        write_record(p, op, op->lput.intent);
    } else if ((rc == TERN_ENOTSUP || rc == TERN_EAGAIN) && size <= STAGE_SLOT &&
               (op->stage = kv_stage_get(c)) >= 0) {
        /* No mapping (ntb, rdma), or not yet (shm maps a new lease's
         * segment in the background): a one-sided put from a staging slot,
         * which the fabric serves until the mapping is there. */
        write_record(kv_stage_mem(c, op->stage), op, op->lput.intent);
        rc = tern_session_put(srv->s, c->stage_mr, (size_t)op->stage * STAGE_SLOT, size,
                              &srv->os.lease.rkey, srv->os.next - srv->os.lease.base,
                              stage_put_done,
                              &c->stages[op->stage]);
        if (rc < 0)
            return kv_op_by_rpc(op, KV_M_PUT);
        op->stage = -1;     /* the put's completion gives the slot back */
    } else {
        if (rc == TERN_EREMACCESS)
            kv_lease_ask(kv, srv);     /* the lease was taken back */
        return kv_op_by_rpc(op, KV_M_PUT);
    }
    iov = (struct iovec){.iov_base = &op->lput, .iov_len = sizeof(op->lput)};
    rc = tern_callv(srv->s, TERN_KV_SERVICE_ID, KV_M_LPUT, &iov, 1, kv->timeout, lput_done, op,
                    NULL);
    if (rc < 0) {
        /* Not sent: the next record goes where this one was. */
        kv_op_put(kv, op);
        return rc;
    }
    srv->os.next += size;
    return 0;
}

