/* The rdma fabric's endpoint: one device context, protection domain,
 * completion queue (with its channel for the blocking mode) and shared
 * receive queue for all its connections, the CM event channel, memory
 * registration, poll and the blocking mode. rdma_internal.h describes the
 * message path. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "log.h"
#include "rdma_api.h"
#include "rdma_internal.h"
#include "softverbs.h"

static void set_nonblock(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Endpoints open on each provider: the last one out gives the device
 * contexts back. The lock orders that against another thread's open. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned open_eps[2];

static void ep_release(struct rdma_ep *ep)
{
    const struct tern_rdma_api *api = ep->api;

    while (ep->base.conns)
        trdma_conn_free(RCONN(ep->base.conns));
    trdma_listeners_close(ep);
    for (unsigned i = 0; i < TERN_MR_MAX; i++)
        if (ep->base.mrs[i].in_use && ep->base.mrs[i].fab) {
            api->dereg_mr(ep->base.mrs[i].fab);
            ep->base.mrs[i].fab = NULL;
        }
    if (ep->srq)
        api->destroy_srq(ep->srq);
    if (ep->cq)
        api->destroy_cq(ep->cq);
    if (ep->cc)
        api->destroy_comp_channel(ep->cc);
    if (ep->pd)
        api->dealloc_pd(ep->pd);
    if (ep->cm)
        api->destroy_event_channel(ep->cm);
    if (ep->epfd >= 0)
        close(ep->epfd);
    free(ep->qp_tab);
    pthread_mutex_lock(&open_lock);
    if (--open_eps[api->emulated] == 0 && api->release_devices)
        api->release_devices();
    pthread_mutex_unlock(&open_lock);
}

static int rdma_ep_open(struct tern_tp_ep *base)
{
    struct rdma_ep *ep = REP(base);
    struct ibv_device_attr da;
    struct epoll_event e = {.events = EPOLLIN};
    uint32_t buckets = 64;
    int rc;

    ep->epfd = -1;
    pthread_mutex_lock(&open_lock);
    rc = rdma_dev_pick(&ep->dev);
    if (rc == 0)
        open_eps[ep->dev.api->emulated]++;
    pthread_mutex_unlock(&open_lock);
    if (rc < 0) {
        tern_log(TERN_LOG_INFO, "rdma", "no device: %s", ep->dev.desc);
        return rc;
    }
    ep->api = ep->dev.api;
    /* Records carry the credit in 31 bits: rings stop at 1 GiB. */
    rc = base->cfg.conn_buf > ((size_t)1 << RDMA_RING_MAX_LOG2) ||
                 2 * rec_size(base->cfg.max_msg) > ((uint64_t)1 << RDMA_RING_MAX_LOG2)
             ? TERN_EINVAL
             : ep->api->query_device(ep->dev.ctx, &da) != 0 ? TERN_ENODEV : 0;
    if (rc < 0) {
        ep_release(ep);
        return rc;
    }
    ep->cq_depth = da.max_cqe < RDMA_CQ_MAX ? (uint32_t)da.max_cqe : RDMA_CQ_MAX;
    ep->srq_depth = (uint32_t)da.max_srq_wr < RDMA_SRQ_MAX ? (uint32_t)da.max_srq_wr
                                                           : RDMA_SRQ_MAX;
    ep->rd_atomic = (uint8_t)(da.max_qp_rd_atom < 16 ? da.max_qp_rd_atom : 16);
    /* Type 2 windows keep one peer out of another's memory; without them
     * a key is good on every connection of the endpoint (docs/RDMA.md).
     * TERN_RDMA_MW=0 turns them off (to measure, or to test the peer that
     * has none). */
    ep->mw = (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) && da.max_mw > 0 &&
             !(getenv("TERN_RDMA_MW") && strcmp(getenv("TERN_RDMA_MW"), "0") == 0);
    if (!ep->mw)
        tern_log(TERN_LOG_INFO, "rdma", "%s: no type 2 memory windows: a region's key is good "
                 "on every connection of the endpoint", ep->dev.desc);
    /* A smaller SRQ saves NIC memory at the price of receiver-not-ready
     * retries under bursts (and lets the tests run it dry). */
    if (getenv("TERN_RDMA_SRQ_DEPTH")) {
        unsigned long d = strtoul(getenv("TERN_RDMA_SRQ_DEPTH"), NULL, 10);

        if (d >= RDMA_SRQ_REPOST && d < ep->srq_depth)
            ep->srq_depth = (uint32_t)d;
    }
    while (buckets < base->cfg.max_conns)
        buckets <<= 1;
    ep->qp_tab = calloc(buckets, sizeof(*ep->qp_tab));
    ep->qp_mask = buckets - 1;
    ep->pd = ep->api->alloc_pd(ep->dev.ctx);
    ep->cc = ep->pd ? ep->api->create_comp_channel(ep->dev.ctx) : NULL;
    ep->cq = ep->cc ? ep->api->create_cq(ep->dev.ctx, (int)ep->cq_depth, ep, ep->cc, 0) : NULL;
    ep->srq = ep->cq ? ep->api->create_srq(ep->pd, &(struct ibv_srq_init_attr){
                           .attr = {.max_wr = ep->srq_depth, .max_sge = 1}})
                     : NULL;
    ep->cm = ep->srq ? ep->api->create_event_channel() : NULL;
    ep->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (!ep->qp_tab || !ep->cm || ep->epfd < 0 || ep->srq_depth < RDMA_SRQ_REPOST) {
        tern_log(TERN_LOG_WARN, "rdma", "%s: cannot set up the endpoint: %s", ep->dev.desc,
                 strerror(errno));
        ep_release(ep);
        return TERN_ENOMEM;
    }
    set_nonblock(ep->cc->fd);
    set_nonblock(ep->cm->fd);
    epoll_ctl(ep->epfd, EPOLL_CTL_ADD, ep->cc->fd, &e);
    epoll_ctl(ep->epfd, EPOLL_CTL_ADD, ep->cm->fd, &e);
    /* Completion entries: the SRQ's receives, then whatever work requests
     * are outstanding (each may complete in error), with a margin. */
    ep->cq_free = (long)ep->cq_depth - (long)ep->srq_depth - 64;
    ep->srq_missing = ep->srq_depth;
    trdma_srq_refill(ep, true);
    if (ep->srq_missing || ep->cq_free < 256) {
        ep_release(ep);
        return TERN_ENOMEM;
    }
    tern_log(TERN_LOG_DEBUG, "rdma", "endpoint on %s", ep->dev.desc);
    return 0;
}

static void rdma_ep_close(struct tern_tp_ep *base)
{
    ep_release(REP(base));
}

static int rdma_mr_publish(struct tern_tp_ep *base, struct tern_tp_mr *mr, bool up)
{
    struct rdma_ep *ep = REP(base);
    int access = IBV_ACCESS_LOCAL_WRITE;
    struct ibv_mr *m;

    if (!up) {
        trdma_windows_drop(ep, mr);    /* a region with windows cannot go */
        if (mr->fab && ep->api->dereg_mr(mr->fab) != 0)
            tern_log(TERN_LOG_ERROR, "rdma", "%s: a region would not deregister: %s",
                     ep->dev.desc, strerror(errno));
        mr->fab = NULL;
        return 0;
    }
    if (!mr->len)
        return 0;   /* nothing to reach */
    /* With windows a region grants nothing remote itself: each peer gets
     * a window bound to its connection (trdma_conn_rkey). */
    if (ep->mw && (mr->access & (TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE))) {
        access |= IBV_ACCESS_MW_BIND;
    } else {
        if (mr->access & TERN_TP_ACCESS_REMOTE_READ)
            access |= IBV_ACCESS_REMOTE_READ;
        if (mr->access & TERN_TP_ACCESS_REMOTE_WRITE)
            access |= IBV_ACCESS_REMOTE_WRITE;
    }
    m = ep->api->reg_mr(ep->pd, mr->addr, mr->len, access);
    if (!m)
        return TERN_ENOMEM;
    mr->fab = m;
    mr->key = m->rkey;      /* the NIC checks it (with windows: grants nothing) */
    return 0;
}

/* Owed events of connections on the ready list. */
static int serve_ready(struct rdma_ep *ep, struct tern_tp_event *ev, int max)
{
    struct tern_tp_conn *list = tp_ready_take(&ep->base);
    int n = 0;

    while (list) {
        struct rdma_conn *c = RCONN(list);

        list = list->ready_next;
        c->base.on_ready = false;
        if (n < max)
            n += tp_emit_owed(&c->ev, &c->base, ev + n, max - n);
        if (n < max && c->ev.dead)
            n += tp_emit_dead(&c->ev, &c->base, ev + n, max - n);
        if (tp_events_owed(&c->ev))
            tp_ready_push(&c->base);
    }
    return n;
}

static int rdma_poll(struct tern_tp_ep *base, struct tern_tp_event *ev, int max)
{
    struct rdma_ep *ep = REP(base);
    int n;

    /* Failed: what is owed still goes out (nothing the user was told of
     * is lost), then the failure, on every poll. */
    if (ep->failed) {
        n = serve_ready(ep, ev, max);
        return n ? n : ep->failed;
    }
    /* The CM costs a system call: looked at every RDMA_CM_EVERY polls,
     * and every poll while a connection is being set up. */
    if (ep->cm_pending || ++ep->polls % RDMA_CM_EVERY == 0)
        trdma_cm_poll(ep);
    trdma_flush(base);
    n = serve_ready(ep, ev, max);
    /* Connections with events owed go first (a CONNECTED before its
     * first RECV); completions wait for the next poll. */
    if (n < max && !ep->base.ready) {
        n += trdma_wc_handle(ep, ev + n, max - n);
        if (n < max)
            n += serve_ready(ep, ev + n, max - n);
    }
    if (ep->failed)
        return n ? n : ep->failed;
    if (ep->srq_missing >= RDMA_SRQ_REPOST)
        trdma_srq_refill(ep, false);
    return n;
}

static int rdma_wait_fd(struct tern_tp_ep *base)
{
    return REP(base)->epfd;
}

static int rdma_arm(struct tern_tp_ep *base)
{
    struct rdma_ep *ep = REP(base);
    struct ibv_cq *cq;
    void *ctx;
    int k;

    if (ep->failed)
        return TERN_EAGAIN;     /* the next poll reports it */
    trdma_cm_poll(ep);
    trdma_flush(base);      /* may itself make events owed */
    if (ep->base.ready || ep->wc_head < ep->wc_n)
        return TERN_EAGAIN;
    trdma_srq_refill(ep, true);
    /* Take the channel's events, ask for the next completion, then look
     * once more: one that came in between would ring nobody. */
    while (ep->api->get_cq_event(ep->cc, &cq, &ctx) == 0)
        ep->api->ack_cq_events(cq, 1);
    ibv_req_notify_cq(ep->cq, 0);
    k = ibv_poll_cq(ep->cq, RDMA_WC_BATCH, ep->wc);
    if (k > 0) {
        ep->wc_head = 0;
        ep->wc_n = k;
        return TERN_EAGAIN;
    }
    if (k < 0) {
        trdma_cq_overrun(ep);
        return TERN_EAGAIN;
    }
    return 0;
}

static int rdma_wait(struct tern_tp_ep *base, int timeout_ms)
{
    struct epoll_event e;

    if (rdma_arm(base) == TERN_EAGAIN)
        return 1;
    return epoll_wait(REP(base)->epfd, &e, 1, timeout_ms) > 0;
}

static const struct tern_tp_ops rdma_ops = {
    .ep_open = rdma_ep_open,
    .ep_close = rdma_ep_close,
    .listen = trdma_listen,
    .connect = trdma_connect,
    .disconnect = trdma_disconnect,
    .conn_peer = trdma_conn_peer,
    .msg_alloc = trdma_msg_alloc,
    .msg_post = trdma_msg_post,
    .msg_abort = trdma_msg_abort,
    .msg_release = trdma_msg_release,
    .put = trdma_put,
    .get = trdma_get,
    .mr_publish = rdma_mr_publish,
    .conn_rkey = trdma_conn_rkey,
    .poll = rdma_poll,
    .flush = trdma_flush,
    .wait_fd = rdma_wait_fd,
    .arm = rdma_arm,
    .wait = rdma_wait,
};

/* "soft": the emulation, which reaches this host only. */
static int rdma_probe(const char *args, char *desc, size_t len)
{
    if (args && strcmp(args, "soft") == 0) {
        snprintf(desc, len, "softverbs0 (emulated NIC: reaches this host only)");
        return 0;
    }
    return rdma_hw_usable(desc, len) ? 0 : TERN_ENODEV;
}

static bool rdma_emulated(const char *addr)
{
    return strncmp(addr, "soft:", 5) == 0;
}

/* Only when both ends can: the peer advertises rdma only if it has a
 * device, and this node needs one too. An emulated NIC reaches processes
 * of this host only, in any network namespace (its memory is /dev/shm and
 * its doorbells are sockets there; its connections go over IP). */
static bool rdma_reachable(const char *addr, size_t len, bool same_node, bool same_host)
{
    (void)same_node;
    if (len >= 5 && strncmp(addr, "soft:", 5) == 0)
        return same_host;
    return rdma_hw_usable(NULL, 0);
}

/* An address of this host's NIC: $TERN_RDMA_LOCAL_IP (one of its netdev's
 * addresses, say soft-RoCE's), else loopback, which softverbs serves. */
static int rdma_local_addr(const char *tag, char *buf, size_t len)
{
    const char *ip = getenv("TERN_RDMA_LOCAL_IP");

    return snprintf(buf, len, "%s:0", ip && *ip ? ip : "127.0.0.1") < (int)len ? 0 : TERN_EINVAL;
}

const struct tern_tp_fabric tp_fabric_rdma = {
    .name = "rdma",
    .caps = TERN_TP_CAP_MSG | TERN_TP_CAP_PUT | TERN_TP_CAP_GET | TERN_TP_CAP_WAIT_FD |
            TERN_TP_CAP_LISTEN | TERN_TP_CAP_CONNECT | TERN_TP_CAP_RMA_OFFLOAD |
            TERN_TP_CAP_STRICT_RKEY,
    .ep_size = sizeof(struct rdma_ep),
    .ops = &rdma_ops,
    .latency_ns = 2000,
    .bandwidth_gbs = 12,
    .probe = rdma_probe,
    .reachable = rdma_reachable,
    .local_addr = rdma_local_addr,
    .emulated = rdma_emulated,
    .sweep = sv_sweep_dead,
};
