/* The rdma fabric's data path: records into the peer's ring by
 * WRITE_WITH_IMM, credit back in immediates, one-sided put/get as RDMA
 * WRITE/READ, and the completions of all of them. Nothing here allocates
 * or makes a system call (rdma-core's post and poll are user-space
 * doorbells and memory reads on a NIC). */
#include <endian.h>
#include <string.h>

#include "log.h"
#include "rdma_internal.h"

void trdma_mark_dirty(struct rdma_conn *c)
{
    struct rdma_ep *ep = REP(c->base.ep);

    if (c->dirty)
        return;
    c->dirty = true;
    c->dirty_next = ep->dirty;
    ep->dirty = c;
}

/* ---- sending messages ---- */

int trdma_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf)
{
    struct rdma_conn *c = RCONN(conn);
    uint64_t size = rec_size(len), pos = c->tx_head, off, skip, room = c->tx_size;

    if (c->state == RC_CLOSING || c->state == RC_DEAD)
        return TERN_ENOTCONN;
    if (c->resv)
        return TERN_EINVAL;
    if (c->peer_ring_addr && len > c->peer_max_msg)
        return TERN_EMSGSIZE;
    /* Before the peer's ring is known, stage no more than the smallest
     * ring a peer may have (or one record): the re-laying then always
     * fits. */
    if (!c->peer_ring_addr && pos)
        room = RDMA_STAGE_MAX;
    /* A record never wraps: one that does not fit before the end of the
     * ring starts the next lap, and the receiver, which knows its length
     * from the completion, skips the same tail. */
    off = pos & (c->tx_size - 1);
    skip = c->tx_size - off < size ? c->tx_size - off : 0;
    if (pos + skip + size - c->tx_credit > room) {
        c->want_writable = true;
        return TERN_EAGAIN;
    }
    if (skip)   /* tells the flush to step over the tail; never sent */
        *(struct rdma_rec *)(void *)(c->tx + off) =
            (struct rdma_rec){.len = (uint32_t)skip, .kind = REC_PAD};
    c->resv_start = pos + skip;
    c->resv_skip = skip;
    c->resv = c->tx + (c->resv_start & (c->tx_size - 1)) + RDMA_HDR;
    c->resv_len = len;
    *buf = c->resv;
    return 0;
}

int trdma_msg_post(struct tern_tp_conn *conn, void *buf, size_t len)
{
    struct rdma_conn *c = RCONN(conn);
    uint8_t *rec;

    if (!c->resv || buf != c->resv)
        return TERN_EINVAL;
    if (len > c->resv_len)
        return TERN_EMSGSIZE;
    rec = c->resv - RDMA_HDR;
    /* Posted shorter, it may fit the tail it skipped: the receiver, which
     * only knows the posted length, looks for it there. */
    if (c->resv_skip && rec_size(len) <= c->resv_skip) {
        uint8_t *at = c->tx + ((c->resv_start - c->resv_skip) & (c->tx_size - 1));

        memmove(at + RDMA_HDR, c->resv, len);
        rec = at;
        c->resv_start -= c->resv_skip;
    }
    *(struct rdma_rec *)(void *)rec = (struct rdma_rec){.len = (uint32_t)len, .kind = REC_MSG};
    c->tx_head = c->resv_start + rec_size(len);
    c->resv = NULL;
    if (c->state == RC_CLOSING || c->state == RC_DEAD)
        return TERN_ENOTCONN;
    if (c->relayout_log2)
        trdma_conn_relayout(c);
    trdma_mark_dirty(c);
    return 0;
}

void trdma_msg_abort(struct tern_tp_conn *conn, void *buf)
{
    struct rdma_conn *c = RCONN(conn);

    if (c->resv && buf == c->resv) {
        c->resv = NULL;
        if (c->relayout_log2)
            trdma_conn_relayout(c);
    }
}

/* ---- receiving ---- */

void trdma_msg_release(struct tern_tp_conn *conn, const void *view)
{
    struct rdma_conn *c = RCONN(conn);
    const uint8_t *v = view;
    uint64_t o, cur, start;
    const struct rdma_rec *rec;

    if (!c->rx_views || v < c->rx + RDMA_HDR || v >= c->rx + c->rx_size)
        return;
    /* Views go back in order: this one is the oldest, at rx_consumed or,
     * if its record skipped the tail, at the start of the next lap. */
    o = (uint64_t)(v - RDMA_HDR - c->rx);
    cur = c->rx_consumed & (c->rx_size - 1);
    start = c->rx_consumed - cur + o + (o < cur ? c->rx_size : 0);
    rec = (const struct rdma_rec *)(const void *)(c->rx + o);
    c->rx_consumed = start + rec_size(rec->len);
    c->rx_views--;
    if (c->peer_low || c->rx_consumed - c->rx_credit_sent >= c->rx_size / 4) {
        c->credit_owed = true;
        trdma_mark_dirty(c);
    }
}

/* The peer's receive progress, from an immediate: the low 31 bits of its
 * rx_consumed, never more than a ring behind ours. */
static void credit_in(struct rdma_conn *c, uint32_t imm)
{
    uint64_t credit = c->tx_credit + ((imm - (uint32_t)c->tx_credit) & IMM_CREDIT_MASK);

    if (credit > c->tx_head || credit == c->tx_credit)
        return;     /* nothing new (or nonsense: ignore it) */
    c->tx_credit = credit;
    if (c->want_writable) {
        c->want_writable = false;
        c->ev.writable = true;
        tp_ready_push(&c->base);
    }
}

/* A record landed: its length is in the completion, its place follows
 * from the ring rule. 0 and the view, or a protocol error. */
static int record_in(struct rdma_conn *c, uint32_t byte_len, struct tern_tp_event *ev)
{
    uint64_t size = rec_size(byte_len >= RDMA_HDR ? byte_len - RDMA_HDR : 0);
    uint64_t pos = c->rx_seen, off = pos & (c->rx_size - 1);
    const struct rdma_rec *rec;

    /* No record longer than the largest message we said we take. */
    if (byte_len < RDMA_HDR || byte_len - RDMA_HDR > c->base.ep->cfg.max_msg ||
        size > c->rx_size / 2)
        return TERN_EPROTO;
    if (c->rx_size - off < size) {
        pos += c->rx_size - off;
        off = 0;
    }
    if (pos + size - c->rx_consumed > c->rx_size)
        return TERN_EPROTO;     /* beyond the credit we gave */
    rec = (const struct rdma_rec *)(const void *)(c->rx + off);
    if (rec->kind != REC_MSG || rec->len != byte_len - RDMA_HDR)
        return TERN_EPROTO;
    c->rx_seen = pos + size;
    c->rx_views++;
    *ev = (struct tern_tp_event){.type = TERN_TP_EV_RECV, .conn = &c->base,
                                 .data = c->rx + off + RDMA_HDR, .len = rec->len};
    return 0;
}

/* ---- one-sided ---- */

static int onesided(struct tern_tp_conn *conn, bool is_put, struct tern_tp_mr *lmr, void *local,
                    size_t len, const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    struct rdma_conn *c = RCONN(conn);
    uint32_t need = is_put ? TERN_TP_ACCESS_REMOTE_WRITE : TERN_TP_ACCESS_REMOTE_READ;
    unsigned idx = c->ev.pend_tail;
    int status = 0;

    if (c->state == RC_CLOSING || c->state == RC_DEAD)
        return TERN_ENOTCONN;
    if (c->state != RC_OPEN || c->relayout_log2 || tp_pend_full(&c->ev)) {
        if (c->state != RC_OPEN || c->relayout_log2)
            c->want_writable = true;    /* WRITABLE once it is up */
        return TERN_EAGAIN;
    }
    if (!lmr->fab)
        return TERN_EINVAL;
    /* What the key itself states is checked here, so that such a mistake
     * costs one refused operation; a wrong or stale key reaches the NIC,
     * which refuses it and breaks the queue pair. */
    if (!(rkey->access & need) || roff > rkey->len || len > rkey->len - roff ||
        rkey->addr + roff < rkey->addr)
        status = TERN_EREMACCESS;
    tp_pend_push(&c->ev, is_put, NULL, len, token);
    c->os[idx % TP_PEND_MAX] = (struct rdma_os){
        .is_put = is_put, .local_status = status, .after = c->tx_head,
        .laddr = (uintptr_t)local, .lkey = ((struct ibv_mr *)lmr->fab)->lkey,
        .len = (uint32_t)len, .raddr = rkey->addr + roff, .rkey = rkey->key};
    trdma_mark_dirty(c);
    return 0;
}

int trdma_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, const void *src, size_t len,
             const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    return onesided(conn, true, lmr, (void *)src, len, rkey, roff, token);
}

int trdma_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, void *dst, size_t len,
             const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    return onesided(conn, false, lmr, dst, len, rkey, roff, token);
}

/* Operations complete in order: mark done the ones at the front that
 * were refused here and are no longer behind one on the wire. */
static void onesided_settle(struct rdma_conn *c)
{
    bool any = false;

    for (;;) {
        unsigned i = c->ev.pend_head + c->ev.done;
        struct rdma_os *o = &c->os[i % TP_PEND_MAX];

        if (i == c->os_posted || !o->local_status)
            break;
        c->ev.pend[i % TP_PEND_MAX].status = o->local_status;
        c->ev.done++;
        any = true;
    }
    if (any)
        tp_ready_push(&c->base);
}

static int wc_status_code(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_SUCCESS:
        return 0;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
        return TERN_EREMACCESS;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return TERN_ETIMEDOUT;
    default:
        return TERN_ECONNRESET;
    }
}

/* ---- posting ---- */

static uint32_t imm_out(struct rdma_conn *c, bool low)
{
    c->rx_credit_sent = c->rx_consumed;
    c->credit_owed = false;
    return htobe32(((uint32_t)c->rx_consumed & IMM_CREDIT_MASK) | (low ? IMM_LOW : 0));
}

/* Build the next work request of `c` into wr/sge: a record, a one-sided
 * operation (in the order they were issued), or credit. False if none. */
static bool next_wr(struct rdma_conn *c, struct ibv_send_wr *wr,
                    struct ibv_sge *sge, uint32_t seq)
{
    for (;;) {
        struct rdma_os *os = c->os_posted != c->ev.pend_tail
                                 ? &c->os[c->os_posted % TP_PEND_MAX] : NULL;

        memset(wr, 0, sizeof(*wr));
        wr->sg_list = sge;
        /* Window binds first: a key given out goes in a message posted
         * after it was asked for, and must find its window bound. */
        if (c->wins_unposted) {
            struct rdma_win *w = c->wins;

            while (w->posted)
                w = w->next;
            w->posted = true;
            c->wins_unposted--;
            wr->opcode = IBV_WR_BIND_MW;
            wr->bind_mw.mw = w->mw;
            wr->bind_mw.rkey = w->rkey;
            wr->bind_mw.bind_info = (struct ibv_mw_bind_info){
                .mr = w->over, .addr = w->addr, .length = w->len,
                .mw_access_flags = w->access};
            wr->wr_id = WR_BIND;
            return true;
        }
        /* Then our ring's key, the first thing the peer receives. */
        if (c->key_owed) {
            c->key_owed = false;
            wr->opcode = IBV_WR_SEND_WITH_IMM;
            wr->send_flags = c->max_inline ? IBV_SEND_INLINE : 0;
            wr->imm_data = htobe32(c->ring_win->rkey);
            wr->wr_id = WR_KEY;
            return true;
        }
        if (c->tx_sent != c->tx_head && c->peer_keyed && (!os || c->tx_sent < os->after)) {
            uint64_t off = c->tx_sent & (c->tx_size - 1);
            const struct rdma_rec *rec = (const struct rdma_rec *)(const void *)(c->tx + off);
            uint64_t free_after;

            if (rec->kind == REC_PAD) {
                c->tx_sent += rec->len;
                continue;
            }
            c->tx_sent += rec_size(rec->len);
            /* Short of room for two more records: ask for credit. */
            free_after = c->tx_size - (c->tx_head - c->tx_credit);
            *sge = (struct ibv_sge){.addr = (uintptr_t)rec, .length = RDMA_HDR + rec->len,
                                    .lkey = c->tx_mr->lkey};
            wr->num_sge = 1;
            wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr->wr.rdma.remote_addr = c->peer_ring_addr + off;
            wr->wr.rdma.rkey = c->peer_rkey;
            wr->imm_data = imm_out(c, free_after < 2 * rec_size(c->peer_max_msg));
            if (sge->length <= c->max_inline)
                wr->send_flags = IBV_SEND_INLINE;
            wr->wr_id = WR_MSG;
            return true;
        }
        if (os) {
            c->os_posted++;
            if (os->local_status) {
                onesided_settle(c);
                continue;
            }
            *sge = (struct ibv_sge){.addr = os->laddr, .length = os->len, .lkey = os->lkey};
            wr->num_sge = 1;
            wr->opcode = os->is_put ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
            wr->wr.rdma.remote_addr = os->raddr;
            wr->wr.rdma.rkey = os->rkey;
            wr->send_flags = IBV_SEND_SIGNALED;
            if (os->is_put && os->len <= c->max_inline)
                wr->send_flags |= IBV_SEND_INLINE;
            wr->wr_id = WR_ONESIDED;
            os->seq = seq;
            return true;
        }
        if (c->credit_owed) {
            wr->opcode = IBV_WR_SEND_WITH_IMM;
            wr->num_sge = 0;
            wr->send_flags = c->max_inline ? IBV_SEND_INLINE : 0;
            wr->imm_data = imm_out(c, false);
            wr->wr_id = WR_CREDIT;
            return true;
        }
        return false;
    }
}

/* Post what `c` has staged, in one doorbell per batch, within its send
 * queue and the endpoint's completion budget. True if work is left. */
static bool conn_post(struct rdma_ep *ep, struct rdma_conn *c)
{
    struct ibv_send_wr wr[RDMA_FLUSH_BATCH], *bad = NULL;
    struct ibv_sge sge[RDMA_FLUSH_BATCH];
    uint32_t room = RDMA_SQ_DEPTH - (c->sq_posted - c->sq_done);
    int n = 0, rc;
    bool left;

    if (c->state != RC_OPEN || c->relayout_log2)
        return false;
    while (n < RDMA_FLUSH_BATCH && (uint32_t)n < room && ep->cq_free - n > 0 &&
           next_wr(c, &wr[n], &sge[n], c->sq_posted + (uint32_t)n))
        n++;
    /* Records wait for the peer's ring key (its arrival marks us dirty). */
    left = (c->tx_sent != c->tx_head && c->peer_keyed) || c->os_posted != c->ev.pend_tail ||
           c->credit_owed || c->wins_unposted || c->key_owed;
    if (!n)
        return left;
    /* Of a batch's one-sided operations only the last needs a completion:
     * completions come in order, so its stands for those before it
     * (send_done); an error always completes. A put followed by its read
     * then costs the CQ one entry. */
    for (int i = n - 1, later = 0; i >= 0; i--) {
        if (wr[i].wr_id != WR_ONESIDED)
            continue;
        if (later)
            wr[i].send_flags &= ~(unsigned)IBV_SEND_SIGNALED;
        later = 1;
    }
    for (int i = 0; i < n; i++) {
        uint32_t seq = c->sq_posted + (uint32_t)i;

        /* Selective signalling: one completion per RDMA_SIGNAL_EVERY work
         * requests frees the send queue; also the last of a batch that
         * stops short (its completion is what lets the rest go), and all
         * of them when completion entries run low. */
        if (seq - c->sq_last_signal >= RDMA_SIGNAL_EVERY || (i == n - 1 && left) ||
            ep->cq_free - n < (long)ep->cq_depth / 4)
            wr[i].send_flags |= IBV_SEND_SIGNALED;
        if (wr[i].send_flags & IBV_SEND_SIGNALED)
            c->sq_last_signal = seq;
        wr[i].wr_id = WR_ID(wr[i].wr_id, seq);
        wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
    }
    rc = ibv_post_send(c->qp, wr, &bad);
    if (rc) {
        int posted = bad ? (int)(bad - wr) : 0;

        c->sq_posted += (uint32_t)posted;
        ep->cq_free -= posted;
        trdma_conn_fail(c, TERN_EIO);
        return false;
    }
    c->sq_posted += (uint32_t)n;
    ep->cq_free -= n;
    return left;
}

int trdma_flush(struct tern_tp_ep *base)
{
    struct rdma_ep *ep = REP(base);
    struct rdma_conn *list = ep->dirty;

    if (ep->failed)
        return ep->failed;  /* no completion would account for a post */
    /* Posting never marks another connection; those with work left (no
     * room) stay on the list for the next flush. */
    ep->dirty = NULL;
    while (list) {
        struct rdma_conn *c = list;

        list = c->dirty_next;
        c->dirty = false;
        if (conn_post(ep, c))
            trdma_mark_dirty(c);
    }
    return 0;
}

void trdma_conn_drain(struct rdma_conn *c)
{
    struct ibv_send_wr wr = {.wr_id = WR_ID(WR_MARKER, c->sq_posted),
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = c->peer_ring_addr,
                                         .rkey = c->peer_rkey}};
    struct ibv_send_wr *bad;

    /* On a queue pair in the error state every work request completes,
     * flushed, in order: when this one does, all before it have. Its
     * completion entry was set aside when the connection was made. */
    if (c->marker_posted)
        return;
    if (!c->qp || ibv_post_send(c->qp, &wr, &bad) != 0) {
        c->state = RC_DEAD;
        tp_conn_dead(&c->ev, c->fail_status, c->active && !c->opened);
        tp_ready_push(&c->base);
        return;
    }
    c->marker_posted = true;
    c->sq_posted++;
}

/* ---- completions ---- */

void trdma_srq_refill(struct rdma_ep *ep, bool all)
{
    struct ibv_recv_wr wr[RDMA_SRQ_REPOST * 4], *bad;
    const uint32_t batch = RDMA_SRQ_REPOST * 4;

    while (ep->srq_missing && (all || ep->srq_missing >= RDMA_SRQ_REPOST)) {
        uint32_t n = ep->srq_missing < batch ? ep->srq_missing : batch;

        for (uint32_t i = 0; i < n; i++)
            wr[i] = (struct ibv_recv_wr){.next = i + 1 < n ? &wr[i + 1] : NULL};
        if (ibv_post_srq_recv(ep->srq, wr, &bad) != 0)
            return;     /* retried at the next poll */
        ep->srq_missing -= n;
    }
}

static void send_done(struct rdma_ep *ep, struct rdma_conn *c, const struct ibv_wc *wc)
{
    uint32_t seq = WR_SEQ(wc->wr_id);
    unsigned kind = WR_KIND(wc->wr_id);
    int status = wc_status_code(wc->status);

    ep->cq_free += (long)(seq + 1 - c->sq_done);
    c->sq_done = seq + 1;
    if (c->state == RC_DEAD)
        return;     /* reported already (the marker could not be posted) */
    if (kind == WR_ONESIDED) {
        bool any = false;

        /* It completes the unsignalled ones posted before it too. */
        for (;;) {
            unsigned i = c->ev.pend_head + c->ev.done;
            const struct rdma_os *o = &c->os[i % TP_PEND_MAX];

            if (i == c->os_posted || (int32_t)(seq - o->seq) < 0)
                break;
            c->ev.pend[i % TP_PEND_MAX].status = o->seq == seq ? status : 0;
            c->ev.done++;
            onesided_settle(c);
            any = true;
        }
        if (any)
            tp_ready_push(&c->base);
    }
    if (kind == WR_MARKER) {
        c->state = RC_DEAD;
        tp_conn_dead(&c->ev, c->fail_status, c->active && !c->opened);
        tp_ready_push(&c->base);
        return;
    }
    if (status && c->state == RC_OPEN)
        trdma_conn_fail(c, status);
}

/* One receive completion; writes at most one event. */
static int recv_done(struct rdma_conn *c, const struct ibv_wc *wc, struct tern_tp_event *ev)
{
    int rc;

    if (wc->status != IBV_WC_SUCCESS || !(wc->wc_flags & IBV_WC_WITH_IMM)) {
        if (c->state == RC_OPEN)
            trdma_conn_fail(c, TERN_EPROTO);
        return 0;
    }
    if (!c->peer_keyed) {
        /* The peer's first word: the key of the window over its ring. */
        if (wc->opcode != IBV_WC_RECV) {
            trdma_conn_fail(c, TERN_EPROTO);
            return 0;
        }
        c->peer_rkey = be32toh(wc->imm_data);
        c->peer_keyed = true;
        trdma_mark_dirty(c);
        trdma_conn_usable(c);
        return 0;
    }
    credit_in(c, be32toh(wc->imm_data));
    if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM)
        return 0;   /* credit alone */
    c->peer_low = (be32toh(wc->imm_data) & IMM_LOW) != 0;
    rc = record_in(c, wc->byte_len, ev);
    if (rc < 0) {
        trdma_conn_fail(c, rc);
        return 0;
    }
    return 1;
}

void trdma_cq_overrun(struct rdma_ep *ep)
{
    /* A completion was lost, and with it maybe the only sign that some
     * work request or record is done: nothing on this endpoint can be
     * trusted to finish any more. */
    if (!ep->failed)
        tern_log(TERN_LOG_ERROR, "rdma", "%s: the completion queue overran; endpoint failed",
                 ep->dev.desc);
    ep->failed = TERN_EIO;
}

int trdma_wc_handle(struct rdma_ep *ep, struct tern_tp_event *ev, int max)
{
    int n = 0;

    while (n < max && !ep->failed) {
        const struct ibv_wc *wc;
        struct rdma_conn *c;

        if (ep->wc_head == ep->wc_n) {
            int k = ibv_poll_cq(ep->cq, RDMA_WC_BATCH, ep->wc);

            if (k < 0) {
                /* The events written so far hold views and completions
                 * already taken from the CQ: they go out with this poll,
                 * the failure with the next. */
                trdma_cq_overrun(ep);
                break;
            }
            if (k < RDMA_WC_BATCH) {
                /* Seen empty: no entry of a destroyed QP is left in it. */
                ep->cq_free += ep->cq_deferred;
                ep->cq_deferred = 0;
            }
            ep->wc_head = 0;
            ep->wc_n = k;
            if (!k)
                break;
        }
        wc = &ep->wc[ep->wc_head];
        c = trdma_conn_by_qpn(ep, wc->qp_num);
        if (WR_KIND(wc->wr_id) != 0) {      /* a send queue completion */
            ep->wc_head++;
            if (c)
                send_done(ep, c, wc);
            continue;
        }
        /* Data from the connector: it is up, even if its RTU is still to
         * come. (Its ACCEPTED or CONNECTED went out before this: poll
         * serves owed events before completions.) */
        if (c && c->state == RC_ACCEPTING)
            trdma_conn_established(c);
        ep->wc_head++;
        ep->srq_missing++;
        if (c && (c->state == RC_OPEN || c->state == RC_CLOSING)) {
            n += recv_done(c, wc, ev + n);
            /* The peer's key made it CONNECTED: that goes out before
             * the records behind the key (the next poll). */
            if (c->ev.connected)
                break;
        }
    }
    return n;
}
