/* One-sided access through sessions: registered regions and put/get.
 *
 * A region (tern_rpc_mr) belongs to the RPC endpoint, which may run several
 * fabrics; it is registered on a fabric's transport endpoint only when a
 * session there first needs it (its key, or a put/get from it), since most
 * regions are only ever used on one fabric and a NIC registration pins
 * memory.
 *
 * Operations live in a slot table allocated with the endpoint's first
 * region, so starting one allocates nothing. An operation that has to
 * complete before the fabric is done with it (its session died, its region
 * was deregistered) becomes an orphan: its caller has its completion, but
 * the slot and the region stay until the fabric completes it or its
 * connection is disconnected, because until then the fabric may still
 * write into the region (a get's data) or read it (an rdma put).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rpc_internal.h"

#define RMA_SLOT(token) ((uint32_t)(token))
#define RMA_GEN(token) ((uint32_t)((token) >> 32))

/* ---- slots ---- */

static int rma_init(struct tern_rpc_ep *ep)
{
    unsigned n = ep->cfg.max_calls;

    if (ep->rma)
        return 0;
    ep->rma = calloc(n, sizeof(*ep->rma));
    ep->rma_free = calloc(n, sizeof(*ep->rma_free));
    if (!ep->rma || !ep->rma_free) {
        free(ep->rma);
        free(ep->rma_free);
        ep->rma = NULL;
        ep->rma_free = NULL;
        return TERN_ENOMEM;
    }
    for (unsigned i = 0; i < n; i++) {
        ep->rma[i].gen = 1;
        ep->rma_free[i] = n - 1 - i;
    }
    ep->n_rma_free = n;
    return 0;
}

static void mr_free(struct tern_rpc_mr *mr);

static void rma_unlink(struct tern_session *s, struct rpc_rma *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        s->rma_head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        s->rma_tail = op->prev;
    op->prev = op->next = NULL;
}

/* The fabric is done with `op`: free its slot (a new generation makes its
 * token stale) and drop its hold on the region. */
static void rma_release(struct tern_rpc_ep *ep, struct rpc_rma *op)
{
    struct tern_rpc_mr *mr = op->mr;

    op->state = RMA_FREE;
    op->gen++;
    op->s = NULL;
    op->conn = NULL;
    op->mr = NULL;
    op->cb = NULL;
    op->arg = NULL;
    ep->rma_free[ep->n_rma_free++] = (uint32_t)(op - ep->rma);
    if (--mr->refs == 0 && mr->dead)
        mr_free(mr);
}

/* Complete a live operation now with `status`; the fabric still has it, so
 * it stays as an orphan. */
static void rma_fail_op(struct tern_rpc_ep *ep, struct rpc_rma *op, int status)
{
    tern_rma_fn cb = op->cb;
    void *arg = op->arg;

    rma_unlink(op->s, op);
    op->state = RMA_ORPHAN;
    op->s = NULL;
    if (cb)
        cb(arg, status);
}

void rpc_rma_done(struct tern_rpc_ep *ep, const struct tern_tp_event *e)
{
    uint32_t slot = RMA_SLOT(e->token);
    struct rpc_rma *op;
    tern_rma_fn cb;
    void *arg;

    if (!ep->rma || slot >= ep->cfg.max_calls)
        return;
    op = &ep->rma[slot];
    /* An orphan keeps its slot until the fabric is done with it, so a
     * stale token means a completion from a connection already let go. */
    if (op->state == RMA_FREE || op->gen != RMA_GEN(e->token) || op->conn != e->conn)
        return;
    if (op->state == RMA_ORPHAN) {
        rma_release(ep, op);
        return;
    }
    cb = op->cb;
    arg = op->arg;
    rma_unlink(op->s, op);
    /* Slot first: the callback may start the next operation. */
    rma_release(ep, op);
    if (cb)
        cb(arg, e->status);
}

void rpc_rma_expire(struct tern_rpc_ep *ep, uint64_t now)
{
    enum { BATCH = 64 };
    uint64_t limit = ep->cfg.rma_timeout_ns, tok[BATCH];
    unsigned n;

    /* A session's operations are listed oldest first, so only the heads
     * need a look. Callbacks may start, fail or close anything: tokens are
     * collected first, and each is failed only if its slot still holds it. */
    do {
        n = 0;
        for (struct tern_session *s = ep->sessions; s && n < BATCH; s = s->next)
            for (struct rpc_rma *op = s->rma_head; op && n < BATCH && now > op->t0 + limit;
                 op = op->next)
                tok[n++] = (uint64_t)op->gen << 32 | (uint32_t)(op - ep->rma);
        for (unsigned i = 0; i < n; i++) {
            struct rpc_rma *op = &ep->rma[(uint32_t)tok[i]];

            if (op->state == RMA_LIVE && op->gen == tok[i] >> 32)
                rma_fail_op(ep, op, TERN_ETIMEDOUT);
        }
    } while (n == BATCH);
}

void rpc_rma_fail(struct tern_session *s, struct tern_tp_conn *conn, int status)
{
    struct tern_rpc_ep *ep = s->ep;

    /* Each callback may start or fail other operations of the session, or
     * close it: look again from the head after every one. New operations
     * join at the tail, so with a `conn` to match the scan stays short. */
    for (;;) {
        struct rpc_rma *op = s->rma_head;

        while (op && conn && op->conn != conn)
            op = op->next;
        if (!op)
            return;
        rma_fail_op(ep, op, status);
    }
}

void rpc_rma_conn_gone(struct tern_rpc_ep *ep, struct tern_tp_conn *conn)
{
    if (!ep->rma || ep->n_rma_free == ep->cfg.max_calls)
        return;
    for (unsigned i = 0; i < ep->cfg.max_calls; i++) {
        struct rpc_rma *op = &ep->rma[i];

        if (op->state == RMA_FREE || op->conn != conn)
            continue;
        /* Live operations leave with their session or path (rpc_rma_fail)
         * before the connection goes; should one remain, its caller still
         * hears of it once. */
        if (op->state == RMA_LIVE)
            rma_fail_op(ep, op, TERN_ECONNRESET);
        if (op->state == RMA_ORPHAN)
            rma_release(ep, op);
    }
}

/* Operations and keys need a session past its handshake that is neither
 * dead nor on its way out. */
static bool usable(const struct tern_session *s)
{
    return !s->zombie && !s->closing && s->state == SESS_OPEN && s->conn;
}

/* ---- regions ---- */

static void mr_free(struct tern_rpc_mr *mr)
{
    for (unsigned i = 0; i < RPC_MAX_FABRICS; i++)
        if (mr->tp[i])
            tern_tp_mr_dereg(mr->tp[i]);
    if (mr->owned)
        munmap(mr->addr, mr->map_len);
    if (mr->fd >= 0)
        close(mr->fd);
    free(mr);
}

static int mr_new(struct tern_rpc_ep *ep, void *addr, size_t len, int fd, uint64_t fd_off,
                  uint32_t access, struct tern_rpc_mr **out)
{
    struct tern_rpc_mr *mr;
    int rc = rma_init(ep);

    if (rc < 0)
        return rc;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return TERN_ENOMEM;
    mr->ep = ep;
    mr->addr = addr;
    mr->len = len;
    mr->access = access;
    mr->fd = fd;
    mr->fd_off = fd_off;
    mr->next = ep->mrs;
    if (ep->mrs)
        ep->mrs->prev = mr;
    ep->mrs = mr;
    *out = mr;
    return 0;
}

/* `mr` on transport endpoint `tp`, registered there on first use. */
static int mr_on(struct tern_rpc_mr *mr, struct tern_tp_ep *tp, struct tern_tp_mr **out)
{
    struct tern_rpc_ep *ep = mr->ep;

    for (unsigned i = 0; i < ep->n_tp; i++) {
        int rc;

        if (ep->tp[i] != tp)
            continue;
        if (!mr->tp[i]) {
            rc = mr->fd >= 0 ? tern_tp_mr_reg_fd(tp, mr->addr, mr->len, mr->fd, mr->fd_off,
                                                 mr->access, &mr->tp[i])
                             : tern_tp_mr_reg(tp, mr->addr, mr->len, mr->access, &mr->tp[i]);
            if (rc < 0) {
                mr->tp[i] = NULL;
                return rc;
            }
        }
        *out = mr->tp[i];
        return 0;
    }
    return TERN_EINVAL;     /* not a fabric of this endpoint */
}

static bool access_ok(uint32_t access)
{
    return !(access & ~(uint32_t)(TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE));
}

int tern_rpc_mr_reg(struct tern_rpc_ep *ep, void *addr, size_t len, int fd, uint64_t fd_off,
                    uint32_t access, struct tern_rpc_mr **out)
{
    long page = sysconf(_SC_PAGESIZE);
    int own = -1, rc;

    if (!out)
        return TERN_EINVAL;
    *out = NULL;
    if (!ep || !addr || !len || !access_ok(access))
        return TERN_EINVAL;
    if (fd >= 0) {
        if (fd_off % (uint64_t)page)
            return TERN_EINVAL;
        /* Registration on a fabric may come long after this call, when
         * the caller may have closed its descriptor: keep our own. */
        own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0)
            return TERN_EINVAL;
    }
    rc = mr_new(ep, addr, len, own, fd >= 0 ? fd_off : 0, access, out);
    if (rc < 0 && own >= 0)
        close(own);
    return rc;
}

int tern_rpc_mr_alloc(struct tern_rpc_ep *ep, size_t len, uint32_t access,
                      struct tern_rpc_mr **out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), map_len;
    void *p = MAP_FAILED;
    int fd, rc;

    if (!out)
        return TERN_EINVAL;
    *out = NULL;
    if (!ep || !len || len > ((size_t)1 << 40) || !access_ok(access))
        return TERN_EINVAL;
    map_len = (len + page - 1) & ~(page - 1);
    /* A memfd sealed at its size: a peer on this host may map it, and no
     * truncation can ever make that peer fault. */
    fd = memfd_create("tern-rpc-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return TERN_ENOMEM;
    if (ftruncate(fd, (off_t)map_len) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 ||
        (p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        close(fd);
        return TERN_ENOMEM;
    }
    rc = mr_new(ep, p, len, fd, 0, access, out);
    if (rc < 0) {
        munmap(p, map_len);
        close(fd);
        return rc;
    }
    (*out)->owned = true;
    (*out)->map_len = map_len;
    return 0;
}

void *tern_rpc_mr_addr(const struct tern_rpc_mr *mr)
{
    return mr ? mr->addr : NULL;
}

size_t tern_rpc_mr_len(const struct tern_rpc_mr *mr)
{
    return mr ? mr->len : 0;
}

void tern_rpc_mr_dereg(struct tern_rpc_mr *mr)
{
    struct tern_rpc_ep *ep;

    if (!mr || mr->dead)
        return;
    ep = mr->ep;
    mr->dead = true;
    if (mr->prev)
        mr->prev->next = mr->next;
    else
        ep->mrs = mr->next;
    if (mr->next)
        mr->next->prev = mr->prev;
    mr->prev = mr->next = NULL;
    /* Our own hold keeps it while the callbacks run (they may complete
     * the orphans, say by closing a session). */
    mr->refs++;
    for (unsigned i = 0; i < ep->cfg.max_calls && mr->refs > 1; i++)
        if (ep->rma[i].state == RMA_LIVE && ep->rma[i].mr == mr)
            rma_fail_op(ep, &ep->rma[i], TERN_ECANCELED);
    /* Registrations and memory go when the fabric is done with the
     * orphans, at once if there are none. */
    if (--mr->refs == 0)
        mr_free(mr);
}

int tern_rpc_mr_rkey(struct tern_rpc_mr *mr, const struct tern_session *s,
                     struct tern_tp_rkey *out)
{
    struct tern_tp_mr *tmr;
    int rc;

    if (!mr || !s || !out || mr->dead || mr->ep != s->ep)
        return TERN_EINVAL;
    if (!usable(s))
        return TERN_ENOTCONN;
    rc = mr_on(mr, tern_tp_conn_ep(s->conn), &tmr);
    if (rc < 0)
        return rc;
    return tern_tp_conn_mr_rkey(s->conn, tmr, out);
}

void rpc_rma_destroy(struct tern_rpc_ep *ep)
{
    /* Every connection is gone, so no fabric holds an operation: orphans
     * go (freeing regions deregistered meanwhile), then the rest. */
    if (ep->rma)
        for (unsigned i = 0; i < ep->cfg.max_calls; i++) {
            struct rpc_rma *op = &ep->rma[i];
            tern_rma_fn cb = op->state == RMA_LIVE ? op->cb : NULL;
            void *arg = op->arg;

            /* A live one cannot be left (its session went first and failed
             * it); should one be, its session is gone: do not touch it. */
            if (op->state != RMA_FREE)
                rma_release(ep, op);
            if (cb)
                cb(arg, TERN_ECANCELED);
        }
    while (ep->mrs)
        tern_rpc_mr_dereg(ep->mrs);
    free(ep->rma);
    free(ep->rma_free);
    ep->rma = NULL;
    ep->rma_free = NULL;
}

/* ---- operations ---- */

static int rma_start(struct tern_session *s, bool put, struct tern_rpc_mr *lmr, size_t loff,
                     size_t len, const struct tern_tp_rkey *rkey, uint64_t roff,
                     tern_rma_fn cb, void *arg)
{
    struct tern_rpc_ep *ep;
    struct tern_tp_mr *tmr;
    struct rpc_rma *op;
    uint64_t token;
    uint32_t slot;
    int rc;

    if (!s || !lmr || !rkey || lmr->ep != s->ep || lmr->dead)
        return TERN_EINVAL;
    ep = s->ep;
    if (!usable(s))
        return TERN_ENOTCONN;
    if (!ep->n_rma_free)
        return TERN_ENOBUFS;
    rc = mr_on(lmr, tern_tp_conn_ep(s->conn), &tmr);
    if (rc < 0)
        return rc;
    slot = ep->rma_free[ep->n_rma_free - 1];
    op = &ep->rma[slot];
    token = (uint64_t)op->gen << 32 | slot;
    rc = put ? tern_tp_put(s->conn, tmr, loff, len, rkey, roff, token)
             : tern_tp_get(s->conn, tmr, loff, len, rkey, roff, token);
    if (rc < 0)
        return rc;      /* the slot was never taken */
    /* The fabric reports completions only from a poll, so filling the
     * slot after posting is safe. */
    ep->n_rma_free--;
    *op = (struct rpc_rma){.gen = op->gen, .state = RMA_LIVE, .s = s, .conn = s->conn,
                           .mr = lmr, .t0 = tern_now_ns(), .prev = s->rma_tail, .cb = cb,
                           .arg = arg};
    if (s->rma_tail)
        s->rma_tail->next = op;
    else
        s->rma_head = op;
    s->rma_tail = op;
    lmr->refs++;
    /* Inside a poll its end flushes; outside, the caller expects it gone. */
    if (!ep->polling)
        tern_tp_flush(tern_tp_conn_ep(s->conn));
    return 0;
}

int tern_session_put(struct tern_session *s, struct tern_rpc_mr *lmr, size_t loff, size_t len,
                     const struct tern_tp_rkey *rkey, uint64_t roff, tern_rma_fn cb, void *arg)
{
    return rma_start(s, true, lmr, loff, len, rkey, roff, cb, arg);
}

int tern_session_get(struct tern_session *s, struct tern_rpc_mr *lmr, size_t loff, size_t len,
                     const struct tern_tp_rkey *rkey, uint64_t roff, tern_rma_fn cb, void *arg)
{
    return rma_start(s, false, lmr, loff, len, rkey, roff, cb, arg);
}

size_t tern_session_rma_max(const struct tern_session *s)
{
    size_t max;

    if (!s || !s->conn || !(tern_session_caps(s) & (TERN_TP_CAP_PUT | TERN_TP_CAP_GET)))
        return 0;
    max = tern_tp_rma_max(s->conn);
    /* The peer serves or checks the operation against its own limit too. */
    return s->peer_max_msg && s->peer_max_msg < max ? s->peer_max_msg : max;
}

int tern_session_rkey_ptr(struct tern_session *s, const struct tern_tp_rkey *rkey,
                          uint64_t roff, size_t len, uint32_t need, void **ptr)
{
    if (!s || !rkey || !ptr)
        return TERN_EINVAL;
    if (!usable(s))
        return TERN_ENOTCONN;
    return tern_tp_rkey_ptr(s->conn, rkey, roff, len, need, ptr);
}

struct tern_session *tern_req_session(const struct tern_req *req)
{
    return req ? req->s : NULL;
}

uint32_t tern_session_epoch(const struct tern_session *s)
{
    return s ? s->epoch : 0;
}
