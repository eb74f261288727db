/* The data path. A posted send is carried out by the posting process, as
 * its "NIC": it checks keys and ranges against the peer's memory region
 * table, copies straight between the two address spaces (memcpy into the
 * peer's region mapped here, map.c, or process_vm_writev/readv where it
 * cannot be mapped), takes the peer's receive request for a SEND and
 * completes on the peer's CQ. The peer's CPU takes no part. Sends of one
 * QP are carried out in order; one waiting for the peer to post a receive
 * (RNR) holds back those behind it, and is retried when the process next
 * posts or polls. */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "sv.h"

/* execute(): done (with a status), or wait and retry: the receiver posted
 * no receive (RNR), or the peer's QP is not there or not connected to us
 * yet (a NIC's transport retries: no acknowledgement came). */
enum { DONE, WAIT_RNR, WAIT_ACK };

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The IB encoding of the RNR NAK timer (min_rnr_timer), in microseconds. */
static uint64_t rnr_delay_us(uint32_t code)
{
    static const uint32_t us[32] = {
        655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
        2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
        163840, 245760, 327680, 491520,
    };

    return us[code & 31];
}

static struct sv_seg *own_seg(struct sv_qp *q)
{
    return sv_ctx(q->ibv.context)->seg;
}

/* Find the region or window behind remote key `key` in `seg` that covers
 * [addr, addr+len) with `need` access, for an access that arrives at QP
 * `qpn` (protection domain `pd`): a window answers only to the QP it is
 * bound to. Caller holds mr_lock. */
static const struct sv_mr_ent *mr_find(struct sv_seg *seg, uint32_t key, uint64_t addr,
                                       uint64_t len, uint32_t need, uint32_t pd, uint32_t qpn)
{
    const struct sv_mr_ent *e = &seg->mr[SV_KEY_IDX(key)];

    if (!key || e->key != key || e->pd != pd || (e->access & need) != need)
        return NULL;
    if (e->mw && (e->qpn != qpn || !need))
        return NULL;
    if (addr < e->addr || len > e->len || addr - e->addr > e->len - len)
        return NULL;
    return e;
}

/* mr_find on this process's own table for a local key, without mr_lock.
 * The key is the entry's sequence word: registration stores it after the
 * other fields, deregistration clears it before them (verbs.c), so an
 * entry whose key reads the same before and after the other fields was
 * whole while they were read. A region deregistered while a work request
 * uses it is the caller's error, as on a NIC. A window's key is no local
 * key. */
static bool mr_find_own(struct sv_seg *seg, uint32_t key, uint64_t addr, uint64_t len,
                        uint32_t need, uint32_t pd)
{
    const struct sv_mr_ent *e = &seg->mr[SV_KEY_IDX(key)];
    struct sv_mr_ent copy;

    if (!key || __atomic_load_n(&e->key, __ATOMIC_ACQUIRE) != key)
        return false;
    copy.access = __atomic_load_n(&e->access, __ATOMIC_RELAXED);
    copy.addr = __atomic_load_n(&e->addr, __ATOMIC_RELAXED);
    copy.len = __atomic_load_n(&e->len, __ATOMIC_RELAXED);
    copy.pd = __atomic_load_n(&e->pd, __ATOMIC_RELAXED);
    copy.mw = __atomic_load_n(&e->mw, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&e->key, __ATOMIC_RELAXED) != key)
        return false;
    if (copy.mw || copy.pd != pd || (copy.access & need) != need)
        return false;
    return addr >= copy.addr && len <= copy.len && addr - copy.addr <= copy.len - len;
}

/* Bind a type 2 window to QP `q`, as a NIC carries out IBV_WR_BIND_MW in
 * its turn on the send queue: the window must be of the QP's protection
 * domain and unbound, the new key must keep the window's index (only the
 * low 8 bits change), the range must lie in a region registered with
 * IBV_ACCESS_MW_BIND, and remote write needs the region's local write. */
static enum ibv_wc_status bind_mw(struct sv_qp *q, const struct ibv_send_wr *wr)
{
    struct sv_seg *seg = own_seg(q);
    const struct ibv_mw_bind_info *b = &wr->bind_mw.bind_info;
    uint32_t pd = ((struct sv_pd *)(void *)q->ibv.pd)->id;
    const uint32_t rights = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    struct sv_mw *mw = (struct sv_mw *)(void *)wr->bind_mw.mw;
    uint32_t rkey = wr->bind_mw.rkey, access = (uint32_t)b->mw_access_flags;
    enum ibv_wc_status st = IBV_WC_MW_BIND_ERR;
    struct sv_mr_ent *w, *m;

    if (!mw || !b->mr || mw->ibv.type != IBV_MW_TYPE_2 || mw->idx >= SV_MAX_MR ||
        SV_KEY_IDX(rkey) != mw->idx || (access & ~rights) || !b->length)
        return st;
    sv_lock(&seg->mr_lock);
    w = &seg->mr[mw->idx];
    m = &seg->mr[SV_KEY_IDX(b->mr->lkey)];
    if (w->key && w->mw && !w->qpn && w->pd == pd && m->key == b->mr->lkey && !m->mw &&
        m->pd == pd && (m->access & IBV_ACCESS_MW_BIND) &&
        (!(access & IBV_ACCESS_REMOTE_WRITE) || (m->access & IBV_ACCESS_LOCAL_WRITE)) &&
        b->addr >= m->addr && b->length <= m->len && b->addr - m->addr <= m->len - b->length) {
        /* Peers read the entry under mr_lock: the order of the stores
         * does not matter to them. */
        w->addr = b->addr;
        w->len = b->length;
        w->access = access;
        w->qpn = q->ibv.qp_num;
        w->mr_key = b->mr->lkey;
        w->key = rkey;
        mw->ibv.rkey = rkey;
        st = IBV_WC_SUCCESS;
    }
    sv_unlock(&seg->mr_lock);
    return st;
}

static void complete(struct sv_qp *q, const struct sv_swr *s, enum ibv_wc_status status)
{
    static const enum ibv_wc_opcode op[] = {
        [IBV_WR_RDMA_WRITE] = IBV_WC_RDMA_WRITE,
        [IBV_WR_RDMA_WRITE_WITH_IMM] = IBV_WC_RDMA_WRITE,
        [IBV_WR_SEND] = IBV_WC_SEND,
        [IBV_WR_SEND_WITH_IMM] = IBV_WC_SEND,
        [IBV_WR_RDMA_READ] = IBV_WC_RDMA_READ,
        [IBV_WR_BIND_MW] = IBV_WC_BIND_MW,
    };
    struct ibv_wc wc = {.wr_id = s->wr.wr_id, .status = status, .qp_num = q->ibv.qp_num};

    if (!s->signaled && status == IBV_WC_SUCCESS)
        return;
    wc.opcode = op[s->wr.opcode];
    if (s->wr.opcode == IBV_WR_RDMA_READ && status == IBV_WC_SUCCESS)
        for (int i = 0; i < s->wr.num_sge; i++)
            wc.byte_len += s->sge[i].length;
    sv_cq_push(own_seg(q), q->send_cq, &wc);
}

/* The receive queue of the peer's QP `e`. */
static struct sv_rq *peer_rq(struct sv_seg *seg, struct sv_qp_ent *e)
{
    if (e->srq < 0)
        return &e->rq;
    if (e->srq >= SV_MAX_SRQ || !seg->srq[e->srq].in_use)
        return NULL;
    return &seg->srq[e->srq].rq;
}

/* Gather the local side of a send into iovecs, checking lkeys. */
static bool local_iov(struct sv_qp *q, struct sv_swr *s, struct iovec *iov, int *n,
                      size_t *total, uint32_t need)
{
    struct sv_seg *seg = own_seg(q);
    uint32_t pd = ((struct sv_pd *)(void *)q->ibv.pd)->id;
    bool ok = true;

    *total = 0;
    *n = 0;
    if (s->wr.send_flags & IBV_SEND_INLINE) {
        for (int i = 0; i < s->wr.num_sge; i++)
            *total += s->sge[i].length;
        iov[0] = (struct iovec){s->inline_data, *total};
        *n = *total ? 1 : 0;
        return true;
    }
    /* Our own table, read without mr_lock: peers hold that lock across
     * their copies into our memory, and taking it here would make every
     * post wait for them. Only this process changes the table. */
    for (int i = 0; i < s->wr.num_sge && ok; i++) {
        if (!s->sge[i].length)
            continue;
        ok = mr_find_own(seg, s->sge[i].lkey, s->sge[i].addr, s->sge[i].length, need, pd);
        iov[(*n)++] = (struct iovec){(void *)(uintptr_t)s->sge[i].addr, s->sge[i].length};
        *total += s->sge[i].length;
    }
    return ok;
}

/* The peer's end of our connection, if it is there and connected to us. */
static struct sv_qp_ent *peer_qp(struct sv_qp *q, uint64_t now)
{
    struct sv_seg *own = own_seg(q), *ps = q->peer ? q->peer->seg : NULL;
    uint32_t dest = own->qp[q->idx].dest_qpn;
    const union ibv_gid *me = &sv_ctx(q->ibv.context)->gid;
    struct sv_qp_ent *e;
    uint32_t st;

    if (!ps || !sv_peer_alive(q->peer, now))
        return NULL;
    e = &ps->qp[dest & (SV_MAX_QP - 1)];
    st = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&e->qpn, __ATOMIC_ACQUIRE) != dest || e->dest_qpn != q->ibv.qp_num ||
        memcmp(&e->dgid, me, sizeof(*me)) != 0 ||
        (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD))
        return NULL;
    return e;
}

/* Copy the bytes of one list of iovecs into another, as far as both go. */
static size_t iov_copy(const struct iovec *d, int nd, const struct iovec *src, int ns)
{
    size_t done = 0, doff = 0, soff = 0;
    int i = 0, j = 0;

    while (i < nd && j < ns) {
        size_t n = d[i].iov_len - doff < src[j].iov_len - soff ? d[i].iov_len - doff
                                                                : src[j].iov_len - soff;

        memcpy((uint8_t *)d[i].iov_base + doff, (const uint8_t *)src[j].iov_base + soff, n);
        done += n;
        doff += n;
        soff += n;
        if (doff == d[i].iov_len)
            i++, doff = 0;
        if (soff == src[j].iov_len)
            j++, soff = 0;
    }
    return done;
}

/* Move bytes between our iovecs `l` and the peer's `r`, each of which lies
 * in the peer's region or window `re[k]` (checked): by memcpy when every
 * one is mapped (map.c), else by one system call. What process_vm_*
 * returns: the bytes moved, or -1 with errno (ESRCH: the peer is gone).
 * Caller holds the peer's mr_lock. */
#define SV_MAX_RIOV 32    /* SV_BATCH writes, or a receive's SGEs */

static ssize_t move(struct sv_peer *p, bool write, const struct iovec *l, int nl,
                    const struct iovec *r, const struct sv_mr_ent *const *re, int nr)
{
    struct iovec m[SV_MAX_RIOV];

    for (int k = 0; k < nr; k++) {
        void *at = sv_map_addr(p, re[k], (uint64_t)(uintptr_t)r[k].iov_base, r[k].iov_len);

        if (!at)
            goto by_call;
        m[k] = (struct iovec){at, r[k].iov_len};
    }
    return (ssize_t)(write ? iov_copy(m, nr, l, nl) : iov_copy(l, nl, m, nr));
by_call:
    return write ? process_vm_writev(p->seg->pid, l, (unsigned long)nl, r, (unsigned long)nr, 0)
                 : process_vm_readv(p->seg->pid, l, (unsigned long)nl, r, (unsigned long)nr, 0);
}

/* move() for one work request; false if the peer's memory was not there
 * (it died, or unmapped a registered range). */
static bool copy_remote(struct sv_peer *p, bool write, struct iovec *l, int nl, struct iovec *r,
                        const struct sv_mr_ent *const *re, int nr, size_t total, bool *gone)
{
    ssize_t done;

    *gone = false;
    if (!total)
        return true;
    done = move(p, write, l, nl, r, re, nr);
    if (done < 0 && errno == ESRCH)
        *gone = true;
    return done == (ssize_t)total;
}

/* Carry out one send. DONE with *status set, or WAIT (receiver not ready). */
static int execute(struct sv_qp *q, struct sv_swr *s, uint64_t now, enum ibv_wc_status *status)
{
    struct sv_seg *ps;
    struct sv_qp_ent *e = s->wr.opcode == IBV_WR_BIND_MW ? NULL : peer_qp(q, now);
    struct iovec liov[SV_MAX_SGE], riov[SV_MAX_SGE];
    const struct sv_mr_ent *rent[SV_MAX_SGE];
    enum ibv_wr_opcode op = s->wr.opcode;
    bool is_read = op == IBV_WR_RDMA_READ, gone;
    bool one_sided = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM || is_read;
    bool consumes = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
                    op == IBV_WR_RDMA_WRITE_WITH_IMM;
    struct sv_wqe wqe = {0};    /* set when the WR consumes a receive */
    struct sv_rq *rq = NULL;
    size_t total;
    int nl, nr = 0;

    if (op == IBV_WR_BIND_MW) {     /* local: no peer takes part */
        *status = bind_mw(q, &s->wr);
        return DONE;
    }
    if (!local_iov(q, s, liov, &nl, &total, is_read ? IBV_ACCESS_LOCAL_WRITE : 0)) {
        *status = IBV_WC_LOC_PROT_ERR;
        return DONE;
    }
    if (!e) {
        /* No answer: a NIC retries retry_cnt times, each after the local
         * ACK timeout. A peer process that is gone will never answer. */
        *status = IBV_WC_RETRY_EXC_ERR;
        return q->peer && sv_peer_alive(q->peer, now) ? WAIT_ACK : DONE;
    }
    ps = q->peer->seg;
    if (total > SV_MAX_MSG) {
        *status = IBV_WC_LOC_LEN_ERR;
        return DONE;
    }
    sv_lock(&ps->mr_lock);      /* a deregistration waits for us */
    if (one_sided) {
        uint32_t need = is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;

        rent[0] = mr_find(ps, s->wr.wr.rdma.rkey, s->wr.wr.rdma.remote_addr, total, need, e->pd,
                          e->qpn);
        if (!rent[0]) {
            sv_unlock(&ps->mr_lock);
            *status = IBV_WC_REM_ACCESS_ERR;
            return DONE;
        }
        riov[0] = (struct iovec){(void *)(uintptr_t)s->wr.wr.rdma.remote_addr, total};
        nr = total ? 1 : 0;
    }
    if (consumes) {
        rq = peer_rq(ps, e);
        if (!rq) {
            sv_unlock(&ps->mr_lock);
            *status = IBV_WC_REM_OP_ERR;
            return DONE;
        }
        sv_lock(&rq->lock);
        if (rq->head == rq->tail) {
            sv_unlock(&rq->lock);
            sv_unlock(&ps->mr_lock);
            return WAIT_RNR;
        }
        wqe = rq->wqe[rq->head % SV_MAX_WR];
        rq->head++;
        sv_unlock(&rq->lock);
    }
    if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) {
        size_t room = 0;
        bool ok = true;

        for (uint32_t i = 0; i < wqe.num_sge && ok; i++) {
            rent[nr] = mr_find(ps, wqe.sge[i].lkey, wqe.sge[i].addr, wqe.sge[i].length,
                               IBV_ACCESS_LOCAL_WRITE, e->pd, e->qpn);
            ok = rent[nr] != NULL;
            riov[nr++] = (struct iovec){(void *)(uintptr_t)wqe.sge[i].addr, wqe.sge[i].length};
            room += wqe.sge[i].length;
        }
        if (!ok || room < total) {
            struct ibv_wc rwc = {.wr_id = wqe.wr_id, .qp_num = e->qpn,
                                 .status = ok ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR,
                                 .opcode = IBV_WC_RECV};

            sv_unlock(&ps->mr_lock);
            sv_cq_push(ps, e->recv_cq, &rwc);
            __atomic_store_n(&e->state, (uint32_t)IBV_QPS_ERR, __ATOMIC_RELEASE);
            *status = ok ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR;
            return DONE;
        }
    }
    if (!copy_remote(q->peer, !is_read, liov, nl, riov, rent, nr, total, &gone)) {
        sv_unlock(&ps->mr_lock);
        *status = gone ? IBV_WC_RETRY_EXC_ERR : IBV_WC_REM_ACCESS_ERR;
        return DONE;
    }
    sv_unlock(&ps->mr_lock);
    if (consumes) {
        struct ibv_wc rwc = {.wr_id = wqe.wr_id, .status = IBV_WC_SUCCESS, .qp_num = e->qpn,
                             .src_qp = q->ibv.qp_num};

        if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            rwc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            rwc.wc_flags = IBV_WC_WITH_IMM;
            rwc.imm_data = s->wr.imm_data;
            rwc.byte_len = (uint32_t)total;
        } else {
            rwc.opcode = IBV_WC_RECV;
            rwc.byte_len = (uint32_t)total;
            if (op == IBV_WR_SEND_WITH_IMM) {
                rwc.wc_flags = IBV_WC_WITH_IMM;
                rwc.imm_data = s->wr.imm_data;
            }
        }
        sv_cq_push(ps, e->recv_cq, &rwc);
    }
    *status = IBV_WC_SUCCESS;
    return DONE;
}

/* A NIC takes a chain of work requests with one doorbell and moves them
 * without the CPU; the emulation's cost is a system call per copy where
 * the peer's memory is not mapped. So a run of RDMA writes at the head of
 * the send queue goes as one copy: each
 * is checked (local and remote keys) and, for a write with immediate,
 * given its receive, under one hold of the peer's mr_lock; then one
 * process_vm_writev moves them all, and their completions follow in order.
 * A write that does not qualify ends the run; execute() takes it alone.
 * Returns how many were carried out (0: none, the caller uses execute()). */
#define SV_BATCH 32
_Static_assert(SV_BATCH <= SV_MAX_RIOV && SV_MAX_SGE <= SV_MAX_RIOV, "move()'s iovecs");

static bool batchable(const struct sv_swr *s)
{
    return (s->wr.opcode == IBV_WR_RDMA_WRITE || s->wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) &&
           !s->retry_at_ns && !s->first_try_ns;
}

static unsigned execute_batch(struct sv_qp *q, uint64_t now)
{
    struct iovec liov[SV_BATCH * SV_MAX_SGE], riov[SV_BATCH];
    const struct sv_mr_ent *rent[SV_BATCH];
    struct sv_wqe wqe[SV_BATCH];
    size_t len[SV_BATCH], total = 0, sum = 0;
    struct sv_qp_ent *e;
    struct sv_seg *ps;
    struct sv_rq *rq = NULL;
    unsigned n = 0, imm = 0, ok = 0, used = 0;
    ssize_t done = 0;
    bool gone = false;
    int nl = 0;

    if (q->sq_tail - q->sq_head < 2 || !batchable(&q->sq[q->sq_head % q->max_send_wr]))
        return 0;
    e = peer_qp(q, now);
    if (!e)
        return 0;
    ps = q->peer->seg;
    sv_lock(&ps->mr_lock);      /* a deregistration waits for us */
    while (n < SV_BATCH && q->sq_head + n != q->sq_tail) {
        struct sv_swr *s = &q->sq[(q->sq_head + n) % q->max_send_wr];
        int k;

        if (!batchable(s) || !local_iov(q, s, liov + nl, &k, &len[n], 0) ||
            len[n] > SV_MAX_MSG ||
            !(rent[n] = mr_find(ps, s->wr.wr.rdma.rkey, s->wr.wr.rdma.remote_addr, len[n],
                                IBV_ACCESS_REMOTE_WRITE, e->pd, e->qpn)))
            break;
        if (s->wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
            if (!rq) {
                rq = peer_rq(ps, e);
                if (!rq)
                    break;
                sv_lock(&rq->lock);
            }
            if (rq->tail - rq->head == imm)
                break;              /* receiver not ready: execute() waits */
            wqe[imm] = rq->wqe[(rq->head + imm) % SV_MAX_WR];
            imm++;
        }
        riov[n] = (struct iovec){(void *)(uintptr_t)s->wr.wr.rdma.remote_addr, len[n]};
        nl += k;
        total += len[n];
        n++;
    }
    if (rq) {
        if (n >= 2)
            rq->head += imm;        /* the receives are this run's now */
        sv_unlock(&rq->lock);
    }
    if (n < 2) {
        sv_unlock(&ps->mr_lock);
        return 0;
    }
    if (total)
        done = move(q->peer, true, liov, nl, riov, rent, (int)n);
    if (done < 0 && errno == ESRCH)
        gone = true;
    sv_unlock(&ps->mr_lock);
    /* A short copy stops at a whole remote iovec: the writes before it
     * landed, each with its receive's completion, in order. */
    while (ok < n && done >= 0 && sum + len[ok] <= (size_t)done)
        sum += len[ok++];
    for (unsigned i = 0; i < ok; i++) {
        struct sv_swr *s = &q->sq[q->sq_head % q->max_send_wr];

        if (s->wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
            struct ibv_wc rwc = {.wr_id = wqe[used++].wr_id, .status = IBV_WC_SUCCESS,
                                 .qp_num = e->qpn, .src_qp = q->ibv.qp_num,
                                 .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                                 .wc_flags = IBV_WC_WITH_IMM, .imm_data = s->wr.imm_data,
                                 .byte_len = (uint32_t)len[i]};

            sv_cq_push(ps, e->recv_cq, &rwc);
        }
        complete(q, s, IBV_WC_SUCCESS);
        q->sq_head++;
    }
    if (ok < n) {
        /* The write at `ok` failed, as execute() would report it. As on a
         * NIC after a remote access error both QPs go to the error state:
         * the receives the run took and did not use are flushed on the
         * peer, and our queue behind it is flushed by sv_qp_error. */
        struct sv_swr *s = &q->sq[q->sq_head % q->max_send_wr];

        s->signaled = true;
        complete(q, s, gone ? IBV_WC_RETRY_EXC_ERR : IBV_WC_REM_ACCESS_ERR);
        q->sq_head++;
        for (; used < imm; used++) {
            struct ibv_wc rwc = {.wr_id = wqe[used].wr_id, .status = IBV_WC_WR_FLUSH_ERR,
                                 .qp_num = e->qpn, .opcode = IBV_WC_RECV};

            sv_cq_push(ps, e->recv_cq, &rwc);
        }
        __atomic_store_n(&e->state, (uint32_t)IBV_QPS_ERR, __ATOMIC_RELEASE);
        sv_qp_error(q);
    }
    return n;
}

static void flush_rq(struct sv_qp *q)
{
    struct sv_seg *seg = own_seg(q);
    struct sv_qp_ent *e = &seg->qp[q->idx];

    if (e->srq >= 0)
        return;     /* an SRQ's requests belong to no single QP */
    sv_lock(&e->rq.lock);
    while (e->rq.head != e->rq.tail) {
        struct ibv_wc wc = {.wr_id = e->rq.wqe[e->rq.head % SV_MAX_WR].wr_id,
                            .status = IBV_WC_WR_FLUSH_ERR, .opcode = IBV_WC_RECV,
                            .qp_num = q->ibv.qp_num};

        e->rq.head++;
        sv_cq_push(seg, e->recv_cq, &wc);
    }
    sv_unlock(&e->rq.lock);
}

void sv_qp_error(struct sv_qp *q)
{
    struct sv_seg *seg = own_seg(q);

    q->ibv.state = IBV_QPS_ERR;
    __atomic_store_n(&seg->qp[q->idx].state, (uint32_t)IBV_QPS_ERR, __ATOMIC_RELEASE);
    while (q->sq_head != q->sq_tail) {
        struct sv_swr *s = &q->sq[q->sq_head % q->max_send_wr];

        s->signaled = true;     /* errors always complete */
        complete(q, s, IBV_WC_WR_FLUSH_ERR);
        q->sq_head++;
    }
    flush_rq(q);
}

/* A peer may have moved our QP to the error state (a receive too small). */
static void sync_state(struct sv_qp *q)
{
    uint32_t st = __atomic_load_n(&own_seg(q)->qp[q->idx].state, __ATOMIC_ACQUIRE);

    if (st == IBV_QPS_ERR && q->ibv.state != IBV_QPS_ERR)
        sv_qp_error(q);
}

/* The receiver's RNR timer: how long it asks a sender to wait. */
static uint32_t peer_rnr_timer(struct sv_qp *q)
{
    uint32_t dest = own_seg(q)->qp[q->idx].dest_qpn;

    return q->peer ? q->peer->seg->qp[dest & (SV_MAX_QP - 1)].min_rnr_timer : 0;
}

static void progress_qp(struct sv_qp *q, uint64_t now)
{
    sync_state(q);
    while (q->sq_head != q->sq_tail && q->ibv.state != IBV_QPS_ERR) {
        struct sv_swr *s = &q->sq[q->sq_head % q->max_send_wr];
        enum ibv_wc_status status;

        int rc;

        if (s->retry_at_ns && now < s->retry_at_ns)
            return;
        if (execute_batch(q, now))
            continue;
        rc = execute(q, s, now, &status);
        if (rc == WAIT_ACK) {
            /* timeout: 4.096 us << timeout per try (0: for ever), and
             * retry_cnt tries after the first. */
            uint64_t per_try = q->timeout ? 4096ull << q->timeout : 0;

            if (!s->first_try_ns)
                s->first_try_ns = now;
            if (per_try && now - s->first_try_ns > per_try * (q->retry_cnt + 1)) {
                s->signaled = true;
                complete(q, s, IBV_WC_RETRY_EXC_ERR);
                q->sq_head++;
                sv_qp_error(q);
                return;
            }
            s->retry_at_ns = now + 10000;
            return;
        }
        if (rc == WAIT_RNR) {
            /* rnr_retry 7 means for ever. */
            if (q->rnr_retry != 7 && s->rnr_tries++ >= q->rnr_retry) {
                s->signaled = true;
                complete(q, s, IBV_WC_RNR_RETRY_EXC_ERR);
                q->sq_head++;
                sv_qp_error(q);
                return;
            }
            s->retry_at_ns = now + rnr_delay_us(peer_rnr_timer(q)) * 1000u;
            return;
        }
        if (status != IBV_WC_SUCCESS)
            s->signaled = true;
        complete(q, s, status);
        q->sq_head++;
        if (status != IBV_WC_SUCCESS) {
            sv_qp_error(q);
            return;
        }
    }
}

void sv_progress(struct sv_context *ctx)
{
    uint64_t now = 0;

    pthread_mutex_lock(&ctx->lock);
    for (struct sv_qp *q = ctx->qps; q; q = q->next) {
        /* Nothing pending and no error from a peer to take in: nothing to
         * lock for (a poll is a memory read, as on a NIC). The reads race
         * with a post, whose thread carries out what it posts itself. */
        if (__atomic_load_n(&q->sq_head, __ATOMIC_RELAXED) ==
                __atomic_load_n(&q->sq_tail, __ATOMIC_RELAXED) &&
            (__atomic_load_n(&ctx->seg->qp[q->idx].state, __ATOMIC_RELAXED) != IBV_QPS_ERR ||
             __atomic_load_n(&q->ibv.state, __ATOMIC_RELAXED) == IBV_QPS_ERR))
            continue;
        /* Its owner is posting to it, and carries out its sends itself. */
        if (pthread_mutex_trylock(&q->lock) != 0)
            continue;
        if (q->sq_head == q->sq_tail && q->ibv.state != IBV_QPS_ERR) {
            sync_state(q);
        } else {
            if (!now)
                now = now_ns();
            progress_qp(q, now);
        }
        pthread_mutex_unlock(&q->lock);
    }
    pthread_mutex_unlock(&ctx->lock);
}

static int post_send(struct sv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    sync_state(q);
    for (; wr; wr = wr->next) {
        struct sv_swr *s;
        size_t total = 0;

        if (q->ibv.state != IBV_QPS_RTS && q->ibv.state != IBV_QPS_ERR) {
            *bad = wr;
            return EINVAL;
        }
        if (wr->num_sge < 0 || wr->num_sge > SV_MAX_SGE ||
            (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
             wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
             wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_BIND_MW) ||
            (wr->opcode == IBV_WR_BIND_MW && (wr->num_sge || (wr->send_flags & IBV_SEND_INLINE)))) {
            *bad = wr;
            return EINVAL;
        }
        for (int i = 0; i < wr->num_sge; i++)
            total += wr->sg_list[i].length;
        if ((wr->send_flags & IBV_SEND_INLINE) &&
            (total > q->max_inline || wr->opcode == IBV_WR_RDMA_READ)) {
            *bad = wr;
            return EINVAL;
        }
        if (q->sq_tail - q->sq_head >= q->max_send_wr) {
            *bad = wr;
            return ENOMEM;
        }
        s = &q->sq[q->sq_tail % q->max_send_wr];
        memset(s, 0, offsetof(struct sv_swr, inline_data));
        s->wr = *wr;
        s->wr.next = NULL;
        s->wr.sg_list = s->sge;
        if (wr->num_sge)    /* a zero-length WR may have no list at all */
            memcpy(s->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*s->sge));
        s->signaled = q->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
        if (wr->send_flags & IBV_SEND_INLINE) {
            size_t off = 0;

            for (int i = 0; i < wr->num_sge; i++) {
                memcpy(s->inline_data + off, (void *)(uintptr_t)wr->sg_list[i].addr,
                       wr->sg_list[i].length);
                off += wr->sg_list[i].length;
            }
        }
        q->sq_tail++;
        if (q->ibv.state == IBV_QPS_ERR)
            sv_qp_error(q);     /* flushed at once */
    }
    progress_qp(q, now_ns());
    return 0;
}

int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct sv_qp *q = (struct sv_qp *)(void *)ibqp;
    int rc;

    pthread_mutex_lock(&q->lock);
    rc = post_send(q, wr, bad);
    pthread_mutex_unlock(&q->lock);
    return rc;
}

static int post_rq(struct sv_rq *rq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    int rc = 0;

    sv_lock(&rq->lock);
    for (; wr; wr = wr->next) {
        struct sv_wqe *w;

        if (wr->num_sge < 0 || wr->num_sge > SV_MAX_SGE) {
            rc = EINVAL;
            break;
        }
        if (rq->tail - rq->head >= rq->depth) {
            rc = ENOMEM;
            break;
        }
        w = &rq->wqe[rq->tail % SV_MAX_WR];
        w->wr_id = wr->wr_id;
        w->num_sge = (uint32_t)wr->num_sge;
        if (wr->num_sge)
            memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*w->sge));
        rq->tail++;
    }
    sv_unlock(&rq->lock);
    if (rc)
        *bad = wr;
    return rc;
}

int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct sv_qp *q = (struct sv_qp *)(void *)ibqp;
    struct sv_qp_ent *e = &own_seg(q)->qp[q->idx];
    int rc = EINVAL;

    pthread_mutex_lock(&q->lock);
    sync_state(q);
    if (e->srq >= 0 || q->ibv.state == IBV_QPS_RESET) {
        *bad = wr;
    } else {
        rc = post_rq(&e->rq, wr, bad);
        if (q->ibv.state == IBV_QPS_ERR)
            flush_rq(q);
    }
    pthread_mutex_unlock(&q->lock);
    return rc;
}

int sv_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct sv_srq *s = (struct sv_srq *)(void *)ibsrq;

    return post_rq(&sv_ctx(ibsrq->context)->seg->srq[s->idx].rq, wr, bad);
}

int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct sv_cq_h *h = (struct sv_cq_h *)(void *)ibcq;
    struct sv_context *ctx = sv_ctx(ibcq->context);
    struct sv_cq *cq = &ctx->seg->cq[h->idx];
    int got = 0;

    sv_progress(ctx);
    /* An empty CQ is a memory read, as on a NIC: peers that push into it
     * take its lock, and a poller that took it too would fight them for it
     * on every empty poll. What a push stores is read under the lock. */
    if (__atomic_load_n(&cq->tail, __ATOMIC_ACQUIRE) == cq->head &&
        !__atomic_load_n(&cq->overrun, __ATOMIC_RELAXED))
        return 0;
    sv_lock(&cq->lock);
    while (got < n && cq->head != cq->tail) {
        wc[got++] = cq->wc[cq->head % SV_MAX_CQE];
        cq->head++;
    }
    if (!got && cq->overrun)
        got = -1;
    sv_unlock(&cq->lock);
    return got;
}

int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
    struct sv_cq_h *h = (struct sv_cq_h *)(void *)ibcq;
    struct sv_cq *cq = &sv_ctx(ibcq->context)->seg->cq[h->idx];

    sv_lock(&cq->lock);
    cq->armed = 1;
    sv_unlock(&cq->lock);
    return 0;
}
