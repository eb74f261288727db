/* Set-up verbs: the device, protection domains, memory regions, CQs and
 * their channels, SRQs and QPs with their state machine. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sv.h"

static struct ibv_device sv_device = {
    .node_type = IBV_NODE_CA,
    .transport_type = IBV_TRANSPORT_IB,
    .name = "softverbs0",
    .dev_name = "softverbs0",
};

struct ibv_device **sv_get_device_list(int *num_devices)
{
    struct ibv_device **list = calloc(2, sizeof(*list));

    if (!list)
        return NULL;
    list[0] = &sv_device;
    if (num_devices)
        *num_devices = 1;
    return list;
}

void sv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *sv_get_device_name(struct ibv_device *device)
{
    return device ? device->name : NULL;
}

struct ibv_context *sv_open_device(struct ibv_device *device)
{
    struct sv_context *ctx;

    if (device != &sv_device) {
        errno = ENODEV;
        return NULL;
    }
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return NULL;
    ctx->seg = sv_seg_create();
    if (!ctx->seg) {
        free(ctx);
        return NULL;
    }
    sv_seg_gid(ctx->seg, &ctx->gid);
    ctx->ibv.device = device;
    ctx->ibv.cmd_fd = -1;
    ctx->ibv.async_fd = -1;
    ctx->ibv.num_comp_vectors = 1;
    pthread_mutex_init(&ctx->ibv.mutex, NULL);
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->ibv.ops.poll_cq = sv_poll_cq;
    ctx->ibv.ops.req_notify_cq = sv_req_notify_cq;
    ctx->ibv.ops.post_send = sv_post_send;
    ctx->ibv.ops.post_recv = sv_post_recv;
    ctx->ibv.ops.post_srq_recv = sv_post_srq_recv;
    ctx->ibv.ops.alloc_mw = sv_alloc_mw;
    ctx->ibv.ops.dealloc_mw = sv_dealloc_mw;
    return &ctx->ibv;
}

int sv_close_device(struct ibv_context *context)
{
    struct sv_context *ctx = sv_ctx(context);

    if (ctx->qps)
        return EBUSY;
    while (ctx->peers) {
        struct sv_peer *p = ctx->peers;

        ctx->peers = p->next;
        sv_map_drop(p);
        free(p->maps);
        sv_seg_detach(p->seg);
        free(p);
    }
    sv_seg_destroy(ctx->seg);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    return 0;
}

int sv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
    memset(attr, 0, sizeof(*attr));
    snprintf(attr->fw_ver, sizeof(attr->fw_ver), "softverbs 1");
    attr->max_mr_size = UINT64_MAX;
    attr->max_qp = SV_MAX_QP;
    attr->max_qp_wr = SV_MAX_WR;
    attr->max_sge = SV_MAX_SGE;
    attr->max_cq = SV_MAX_CQ;
    attr->max_cqe = SV_MAX_CQE;
    attr->max_mr = SV_MAX_MR;
    attr->max_mw = SV_MAX_MR;
    attr->device_cap_flags = IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    attr->max_pd = 1 << 16;
    attr->max_srq = SV_MAX_SRQ;
    attr->max_srq_wr = SV_MAX_WR;
    attr->max_srq_sge = SV_MAX_SGE;
    attr->max_qp_rd_atom = 16;
    attr->max_qp_init_rd_atom = 16;
    attr->phys_port_cnt = 1;
    return 0;
}

int sv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr)
{
    if (port_num != 1)
        return EINVAL;
    memset(attr, 0, sizeof(*attr));
    attr->state = IBV_PORT_ACTIVE;
    attr->max_mtu = IBV_MTU_4096;
    attr->active_mtu = IBV_MTU_4096;
    attr->gid_tbl_len = 1;
    attr->max_msg_sz = SV_MAX_MSG;
    attr->link_layer = IBV_LINK_LAYER_ETHERNET;   /* RoCE-like: GIDs, no LIDs */
    attr->active_width = 1;
    attr->active_speed = 1;
    attr->phys_state = 5;                         /* LinkUp */
    return 0;
}

int sv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    if (port_num != 1 || index != 0)
        return EINVAL;
    sv_seg_gid(sv_ctx(context)->seg, gid);
    return 0;
}

struct sv_peer *sv_peer_get(struct sv_context *ctx, const union ibv_gid *gid)
{
    struct sv_peer *p;

    pthread_mutex_lock(&ctx->lock);
    for (p = ctx->peers; p; p = p->next)
        if (memcmp(&p->gid, gid, sizeof(*gid)) == 0)
            goto out;
    p = calloc(1, sizeof(*p));
    if (!p)
        goto out;
    p->seg = sv_seg_attach(gid);
    if (!p->seg) {
        free(p);
        p = NULL;
        goto out;
    }
    p->gid = *gid;
    p->next = ctx->peers;
    ctx->peers = p;
out:
    pthread_mutex_unlock(&ctx->lock);
    return p;
}

/* ---- protection domains and memory regions ---- */

struct ibv_pd *sv_alloc_pd(struct ibv_context *context)
{
    static uint32_t next_id;
    struct sv_pd *pd = calloc(1, sizeof(*pd));

    if (!pd)
        return NULL;
    pd->ibv.context = context;
    pd->ibv.handle = pd->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    return &pd->ibv;
}

int sv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

static uint32_t pd_id(struct ibv_pd *pd)
{
    return ((struct sv_pd *)(void *)pd)->id;
}

/* Take a free slot of the key table for a region or a window, with its
 * fields set and the key stored last (what a lock-free reader checks,
 * post.c). Caller holds mr_lock. The slot index, or -1 if the table is
 * full. */
static int ent_take(struct sv_seg *seg, const struct sv_mr_ent *tmpl, const char *path)
{
    static uint32_t gen;

    for (uint32_t i = 0; i < SV_MAX_MR; i++) {
        struct sv_mr_ent *e = &seg->mr[i];

        if (e->key)
            continue;
        if (++gen >= (1u << (32 - SV_MR_BITS)))
            gen = 1;
        __atomic_store_n(&e->access, tmpl->access, __ATOMIC_RELAXED);
        __atomic_store_n(&e->addr, tmpl->addr, __ATOMIC_RELAXED);
        __atomic_store_n(&e->len, tmpl->len, __ATOMIC_RELAXED);
        __atomic_store_n(&e->pd, tmpl->pd, __ATOMIC_RELAXED);
        __atomic_store_n(&e->mw, tmpl->mw, __ATOMIC_RELAXED);
        __atomic_store_n(&e->qpn, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&e->mr_key, 0, __ATOMIC_RELAXED);
        /* Peers read these under mr_lock only (map.c). */
        e->bk = tmpl->bk;
        e->bk_fd = tmpl->bk_fd;
        e->bk_dev = tmpl->bk_dev;
        e->bk_ino = tmpl->bk_ino;
        e->bk_off = tmpl->bk_off;
        snprintf(seg->bk_path[i], SV_BK_PATH, "%s", path ? path : "");
        __atomic_store_n(&e->key, i << (32 - SV_MR_BITS) | gen, __ATOMIC_RELEASE);
        return (int)i;
    }
    return -1;
}

/* Free slot `idx`. The key first: a lock-free reader then sees it change.
 * Caller holds mr_lock, which peers hold across an access: once it is
 * released, no peer reads or writes through the slot any more. */
static void ent_clear(struct sv_seg *seg, uint32_t idx)
{
    struct sv_mr_ent *e = &seg->mr[idx];

    __atomic_store_n(&e->key, 0, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&e->access, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->addr, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->len, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->pd, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->mw, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->qpn, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->mr_key, 0, __ATOMIC_RELAXED);
    e->bk = SV_BK_NONE;
    /* Peers drop their maps of it at their next access (map.c). */
    __atomic_store_n(&seg->mr_gen, seg->mr_gen + 1, __ATOMIC_RELEASE);
}

struct ibv_mr *sv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    struct sv_seg *seg = sv_ctx(pd->context)->seg;
    const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;
    struct sv_mr_ent tmpl;
    char path[SV_BK_PATH];
    struct sv_mr *mr;
    int idx;

    /* Remote write or atomic access needs local write, as on a NIC. */
    if ((access & ~known) ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = EINVAL;
        return NULL;
    }
    if (!addr && length) {
        errno = EINVAL;
        return NULL;
    }
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return NULL;
    tmpl = (struct sv_mr_ent){.access = (uint32_t)access, .addr = (uint64_t)(uintptr_t)addr,
                              .len = (uint64_t)length, .pd = pd_id(pd)};
    sv_backing_probe(&tmpl, path);     /* can peers map it? */
    sv_lock(&seg->mr_lock);
    idx = ent_take(seg, &tmpl, path);
    if (idx < 0) {
        sv_unlock(&seg->mr_lock);
        free(mr);
        errno = ENOMEM;
        return NULL;
    }
    mr->idx = (uint32_t)idx;
    mr->ibv = (struct ibv_mr){.context = pd->context, .pd = pd, .addr = addr, .length = length,
                              .handle = (uint32_t)idx, .lkey = seg->mr[idx].key,
                              .rkey = seg->mr[idx].key};
    sv_unlock(&seg->mr_lock);
    return &mr->ibv;
}

int sv_dereg_mr(struct ibv_mr *ibmr)
{
    struct sv_mr *mr = (struct sv_mr *)(void *)ibmr;
    struct sv_seg *seg = sv_ctx(ibmr->context)->seg;

    sv_lock(&seg->mr_lock);
    /* A region with windows bound to it stays, as on a NIC: the windows'
     * owner invalidates or frees them first. */
    for (uint32_t i = 0; i < SV_MAX_MR; i++)
        if (seg->mr[i].key && seg->mr[i].mw && seg->mr[i].mr_key == ibmr->lkey) {
            sv_unlock(&seg->mr_lock);
            return EBUSY;
        }
    ent_clear(seg, mr->idx);
    sv_unlock(&seg->mr_lock);
    free(mr);
    return 0;
}

/* ---- memory windows (type 2 only: bound by a work request, post.c) ---- */

struct ibv_mw *sv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
    struct sv_seg *seg = sv_ctx(pd->context)->seg;
    struct sv_mw *mw;
    int idx;

    if (type != IBV_MW_TYPE_2) {
        errno = EOPNOTSUPP;     /* the device says so: no IBV_DEVICE_MEM_WINDOW */
        return NULL;
    }
    mw = calloc(1, sizeof(*mw));
    if (!mw)
        return NULL;
    sv_lock(&seg->mr_lock);
    idx = ent_take(seg, &(struct sv_mr_ent){.pd = pd_id(pd), .mw = 1}, NULL);
    if (idx < 0) {
        sv_unlock(&seg->mr_lock);
        free(mw);
        errno = ENOMEM;
        return NULL;
    }
    mw->idx = (uint32_t)idx;
    mw->ibv = (struct ibv_mw){.context = pd->context, .pd = pd, .rkey = seg->mr[idx].key,
                              .handle = (uint32_t)idx, .type = type};
    sv_unlock(&seg->mr_lock);
    return &mw->ibv;
}

int sv_dealloc_mw(struct ibv_mw *ibmw)
{
    struct sv_mw *mw = (struct sv_mw *)(void *)ibmw;
    struct sv_seg *seg = sv_ctx(ibmw->context)->seg;

    sv_lock(&seg->mr_lock);
    ent_clear(seg, mw->idx);
    sv_unlock(&seg->mr_lock);
    free(mw);
    return 0;
}

/* ---- completion channels and CQs ---- */

/* A completion channel's socket: a path in /dev/shm beside the node's
 * segment, not an abstract name, so that a peer in another network
 * namespace of this host (tools/rack's hosts) can ring it. Unlinked when
 * the channel goes; sv_sweep_dead takes those of dead processes. */
static socklen_t channel_addr(struct sockaddr_un *sa, const struct sv_seg *seg, uint32_t idx)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                       (size_t)snprintf(sa->sun_path, sizeof(sa->sun_path),
                                        "/dev/shm/softverbs.%d.%llx.ch%u", (int)seg->pid,
                                        (unsigned long long)seg->incarnation, idx));
}

static struct ibv_comp_channel *channel_new(struct ibv_context *context)
{
    struct sv_context *ctx = sv_ctx(context);
    struct sv_channel *ch;
    struct sockaddr_un sa;
    socklen_t sl;

    for (uint32_t i = 0; i < SV_MAX_CQ; i++) {
        if (ctx->channels[i])
            continue;
        ch = calloc(1, sizeof(*ch));
        if (!ch)
            return NULL;
        ch->idx = i;
        ch->ibv.context = context;
        ch->ibv.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sl = channel_addr(&sa, ctx->seg, i);
        unlink(sa.sun_path);         /* an earlier holder of our PID */
        if (ch->ibv.fd < 0 || bind(ch->ibv.fd, (struct sockaddr *)&sa, sl) < 0) {
            int err = errno;

            if (ch->ibv.fd >= 0)
                close(ch->ibv.fd);
            free(ch);
            errno = err;
            return NULL;
        }
        ctx->channels[i] = ch;
        return &ch->ibv;
    }
    errno = ENOMEM;
    return NULL;
}

struct ibv_comp_channel *sv_create_comp_channel(struct ibv_context *context)
{
    struct sv_context *ctx = sv_ctx(context);
    struct ibv_comp_channel *ch;

    pthread_mutex_lock(&ctx->lock);
    ch = channel_new(context);
    pthread_mutex_unlock(&ctx->lock);
    return ch;
}

static int channel_destroy(struct ibv_comp_channel *channel)
{
    struct sv_channel *ch = (struct sv_channel *)(void *)channel;
    struct sv_context *ctx = sv_ctx(channel->context);

    for (uint32_t i = 0; i < SV_MAX_CQ; i++)
        if (ctx->cqs[i] && ctx->seg->cq[i].channel == (int32_t)ch->idx)
            return EBUSY;
    {
        struct sockaddr_un sa;

        channel_addr(&sa, ctx->seg, ch->idx);
        unlink(sa.sun_path);
    }
    close(channel->fd);
    ctx->channels[ch->idx] = NULL;
    free(ch);
    return 0;
}

int sv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    struct sv_context *ctx = sv_ctx(channel->context);
    int rc;

    pthread_mutex_lock(&ctx->lock);
    rc = channel_destroy(channel);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

static struct ibv_cq *cq_new(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel)
{
    struct sv_context *ctx = sv_ctx(context);
    const char *limit = getenv("SOFTVERBS_CQ_ENTRIES");
    uint32_t entries = (uint32_t)cqe;
    struct sv_cq_h *h;

    if (cqe < 1 || cqe > SV_MAX_CQE - 1) {
        errno = EINVAL;
        return NULL;
    }
    /* A test hook: the CQ holds fewer entries than it says, so that a
     * consumer that sizes its CQ right can still be shown an overrun. */
    if (limit && strtoul(limit, NULL, 10) >= 1 && strtoul(limit, NULL, 10) < entries)
        entries = (uint32_t)strtoul(limit, NULL, 10);
    for (uint32_t i = 0; i < SV_MAX_CQ; i++) {
        struct sv_cq *cq = &ctx->seg->cq[i];

        if (cq->in_use)
            continue;
        h = calloc(1, sizeof(*h));
        if (!h)
            return NULL;
        sv_mutex_init(&cq->lock);
        cq->head = cq->tail = 0;
        cq->depth = entries + 1;
        cq->armed = cq->overrun = 0;
        cq->channel = channel ? (int32_t)((struct sv_channel *)(void *)channel)->idx : -1;
        cq->gen++;
        cq->in_use = 1;
        h->idx = i;
        h->ibv.context = context;
        h->ibv.channel = channel;
        h->ibv.cq_context = cq_context;
        h->ibv.handle = i;
        h->ibv.cqe = cqe;
        pthread_mutex_init(&h->ibv.mutex, NULL);
        pthread_cond_init(&h->ibv.cond, NULL);
        ctx->cqs[i] = h;
        return &h->ibv;
    }
    errno = ENOMEM;
    return NULL;
}

struct ibv_cq *sv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                            struct ibv_comp_channel *channel, int comp_vector)
{
    struct sv_context *ctx = sv_ctx(context);
    struct ibv_cq *cq;

    pthread_mutex_lock(&ctx->lock);
    cq = cq_new(context, cqe, cq_context, channel);
    pthread_mutex_unlock(&ctx->lock);
    return cq;
}

static int cq_destroy(struct ibv_cq *ibcq)
{
    struct sv_cq_h *h = (struct sv_cq_h *)(void *)ibcq;
    struct sv_context *ctx = sv_ctx(ibcq->context);

    for (struct sv_qp *q = ctx->qps; q; q = q->next)
        if (q->send_cq == h->idx || ctx->seg->qp[q->idx].recv_cq == h->idx)
            return EBUSY;
    ctx->seg->cq[h->idx].in_use = 0;
    ctx->cqs[h->idx] = NULL;
    free(h);
    return 0;
}

int sv_destroy_cq(struct ibv_cq *ibcq)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);
    int rc;

    pthread_mutex_lock(&ctx->lock);
    rc = cq_destroy(ibcq);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int sv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
    struct sv_context *ctx = sv_ctx(channel->context);
    struct sv_channel *ch = (struct sv_channel *)(void *)channel;
    struct sv_cq_h *h = NULL;
    uint32_t idx;

    while (!h) {
        ssize_t n = recv(channel->fd, &idx, sizeof(idx), 0);

        if (n < 0)
            return -1;
        /* A CQ destroyed since it rang: nothing to report. */
        if (n == sizeof(idx) && idx < SV_MAX_CQ) {
            pthread_mutex_lock(&ctx->lock);
            h = ctx->cqs[idx];
            pthread_mutex_unlock(&ctx->lock);
        }
    }
    ch->events++;
    *cq = &h->ibv;
    *cq_context = (*cq)->cq_context;
    return 0;
}

void sv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    struct sv_channel *ch = (struct sv_channel *)(void *)cq->channel;

    if (ch)
        ch->events -= nevents < ch->events ? nevents : ch->events;
}

bool sv_cq_push(struct sv_seg *seg, uint32_t idx, const struct ibv_wc *wc)
{
    static int tx_fd = -1;
    struct sv_cq *cq = &seg->cq[idx];
    bool ring = false, ok = true;
    int32_t channel;

    sv_lock(&cq->lock);
    if (cq->tail - cq->head >= cq->depth - 1) {
        cq->overrun = 1;        /* as on a NIC: the CQ is in error */
        ok = false;
    } else {
        cq->wc[cq->tail % SV_MAX_CQE] = *wc;
        cq->tail++;
        if (cq->armed) {
            cq->armed = 0;
            ring = true;
        }
    }
    channel = cq->channel;
    sv_unlock(&cq->lock);
    if (ring && channel >= 0) {
        struct sockaddr_un sa;
        socklen_t sl = channel_addr(&sa, seg, (uint32_t)channel);

        int fd = __atomic_load_n(&tx_fd, __ATOMIC_ACQUIRE);

        /* Threads that ring at once each make one; one stays. */
        if (fd < 0) {
            int mine = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

            if (mine >= 0 && !__atomic_compare_exchange_n(&tx_fd, &fd, mine, false,
                                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                close(mine);
            else
                fd = mine;
        }
        sendto(fd, &idx, sizeof(idx), MSG_NOSIGNAL, (struct sockaddr *)&sa, sl);
    }
    return ok;
}

/* ---- shared receive queues ---- */

static void rq_init(struct sv_rq *rq, uint32_t depth)
{
    sv_mutex_init(&rq->lock);
    rq->head = rq->tail = 0;
    rq->depth = depth;
}

static struct ibv_srq *srq_new(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    struct sv_context *ctx = sv_ctx(pd->context);
    struct sv_srq *s;

    if (attr->attr.max_wr < 1 || attr->attr.max_wr > SV_MAX_WR ||
        attr->attr.max_sge > SV_MAX_SGE) {
        errno = EINVAL;
        return NULL;
    }
    for (uint32_t i = 0; i < SV_MAX_SRQ; i++) {
        struct sv_srq_ent *e = &ctx->seg->srq[i];

        if (e->in_use)
            continue;
        s = calloc(1, sizeof(*s));
        if (!s)
            return NULL;
        rq_init(&e->rq, attr->attr.max_wr);
        e->pd = pd_id(pd);
        e->in_use = 1;
        s->idx = i;
        s->ibv.context = pd->context;
        s->ibv.pd = pd;
        s->ibv.srq_context = attr->srq_context;
        s->ibv.handle = i;
        pthread_mutex_init(&s->ibv.mutex, NULL);
        pthread_cond_init(&s->ibv.cond, NULL);
        return &s->ibv;
    }
    errno = ENOMEM;
    return NULL;
}

struct ibv_srq *sv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    struct sv_context *ctx = sv_ctx(pd->context);
    struct ibv_srq *srq;

    pthread_mutex_lock(&ctx->lock);
    srq = srq_new(pd, attr);
    pthread_mutex_unlock(&ctx->lock);
    return srq;
}

static int srq_destroy(struct ibv_srq *ibsrq)
{
    struct sv_srq *s = (struct sv_srq *)(void *)ibsrq;
    struct sv_context *ctx = sv_ctx(ibsrq->context);

    for (struct sv_qp *q = ctx->qps; q; q = q->next)
        if (ctx->seg->qp[q->idx].srq == (int32_t)s->idx)
            return EBUSY;
    ctx->seg->srq[s->idx].in_use = 0;
    free(s);
    return 0;
}

int sv_destroy_srq(struct ibv_srq *ibsrq)
{
    struct sv_context *ctx = sv_ctx(ibsrq->context);
    int rc;

    pthread_mutex_lock(&ctx->lock);
    rc = srq_destroy(ibsrq);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

/* ---- queue pairs ---- */

static struct ibv_qp *qp_new(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct sv_context *ctx = sv_ctx(pd->context);
    static uint32_t gen;
    struct sv_qp *q;

    if (attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq ||
        attr->cap.max_send_wr < 1 || attr->cap.max_send_wr > SV_MAX_WR ||
        attr->cap.max_send_sge > SV_MAX_SGE || attr->cap.max_recv_sge > SV_MAX_SGE ||
        (!attr->srq && (attr->cap.max_recv_wr < 1 || attr->cap.max_recv_wr > SV_MAX_WR)) ||
        attr->cap.max_inline_data > SV_MAX_INLINE) {
        errno = EINVAL;
        return NULL;
    }
    for (uint32_t i = 0; i < SV_MAX_QP; i++) {
        struct sv_qp_ent *e = &ctx->seg->qp[i];

        if (e->qpn)
            continue;
        q = calloc(1, sizeof(*q));
        if (q)
            q->sq = calloc(attr->cap.max_send_wr, sizeof(*q->sq));
        if (!q || !q->sq) {
            free(q);
            errno = ENOMEM;
            return NULL;
        }
        if (++gen >= (1u << (24 - SV_QP_BITS)))
            gen = 1;
        memset(e, 0, offsetof(struct sv_qp_ent, rq));
        e->state = IBV_QPS_RESET;
        e->pd = pd_id(pd);
        e->recv_cq = ((struct sv_cq_h *)(void *)attr->recv_cq)->idx;
        e->srq = attr->srq ? (int32_t)((struct sv_srq *)(void *)attr->srq)->idx : -1;
        if (!attr->srq)
            rq_init(&e->rq, attr->cap.max_recv_wr);
        q->idx = i;
        q->sq_sig_all = attr->sq_sig_all;
        q->send_cq = ((struct sv_cq_h *)(void *)attr->send_cq)->idx;
        q->max_send_wr = attr->cap.max_send_wr;
        q->max_inline = attr->cap.max_inline_data;
        q->ibv = (struct ibv_qp){.context = pd->context, .qp_context = attr->qp_context,
                                 .pd = pd, .send_cq = attr->send_cq,
                                 .recv_cq = attr->recv_cq, .srq = attr->srq, .handle = i,
                                 .qp_num = gen << SV_QP_BITS | i, .state = IBV_QPS_RESET,
                                 .qp_type = IBV_QPT_RC};
        pthread_mutex_init(&q->ibv.mutex, NULL);
        pthread_cond_init(&q->ibv.cond, NULL);
        pthread_mutex_init(&q->lock, NULL);
        __atomic_store_n(&e->qpn, q->ibv.qp_num, __ATOMIC_RELEASE);
        q->next = ctx->qps;
        ctx->qps = q;
        return &q->ibv;
    }
    errno = ENOMEM;
    return NULL;
}

struct ibv_qp *sv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct sv_context *ctx = sv_ctx(pd->context);
    struct ibv_qp *qp;

    pthread_mutex_lock(&ctx->lock);
    qp = qp_new(pd, attr);
    pthread_mutex_unlock(&ctx->lock);
    return qp;
}

static void set_state(struct sv_qp *q, enum ibv_qp_state s)
{
    struct sv_seg *seg = sv_ctx(q->ibv.context)->seg;

    q->ibv.state = s;
    __atomic_store_n(&seg->qp[q->idx].state, (uint32_t)s, __ATOMIC_RELEASE);
}

static int modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
    struct sv_qp *q = (struct sv_qp *)(void *)ibqp;
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp_ent *e = &ctx->seg->qp[q->idx];
    enum ibv_qp_state cur = ibqp->state, to = (mask & IBV_QP_STATE) ? attr->qp_state : cur;

    if (mask & IBV_QP_CUR_STATE && attr->cur_qp_state != cur)
        return EINVAL;
    /* The transitions of the IB state machine an RC QP takes. */
    switch (to) {
    case IBV_QPS_RESET:
    case IBV_QPS_ERR:
        break;
    case IBV_QPS_INIT:
        if (cur != IBV_QPS_RESET && cur != IBV_QPS_INIT)
            return EINVAL;
        break;
    case IBV_QPS_RTR:
        if (cur != IBV_QPS_INIT)
            return EINVAL;
        if ((mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) != (IBV_QP_AV | IBV_QP_DEST_QPN) ||
            !attr->ah_attr.is_global)
            return EINVAL;
        break;
    case IBV_QPS_RTS:
        if (cur != IBV_QPS_RTR && cur != IBV_QPS_RTS)
            return EINVAL;
        break;
    default:
        return EINVAL;
    }
    if (to == IBV_QPS_RTR) {
        struct sv_peer *p = sv_peer_get(ctx, &attr->ah_attr.grh.dgid);

        if (!p)
            return EINVAL;      /* no such node: a NIC would fail to resolve it */
        q->peer = p;
        e->dgid = attr->ah_attr.grh.dgid;
        e->dest_qpn = attr->dest_qp_num;
        if (mask & IBV_QP_MIN_RNR_TIMER)
            e->min_rnr_timer = attr->min_rnr_timer;
    }
    if (mask & IBV_QP_RNR_RETRY)
        q->rnr_retry = attr->rnr_retry;
    if (mask & IBV_QP_RETRY_CNT)
        q->retry_cnt = attr->retry_cnt;
    if (mask & IBV_QP_TIMEOUT)
        q->timeout = attr->timeout < 31 ? attr->timeout : 31;
    if (to == IBV_QPS_RESET) {
        q->sq_head = q->sq_tail = 0;
        q->peer = NULL;
        if (e->srq < 0) {
            sv_lock(&e->rq.lock);
            e->rq.head = e->rq.tail;
            sv_unlock(&e->rq.lock);
        }
    }
    if (to == IBV_QPS_ERR && cur != IBV_QPS_ERR) {
        sv_qp_error(q);
        return 0;
    }
    set_state(q, to);
    return 0;
}

int sv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
    struct sv_qp *q = (struct sv_qp *)(void *)ibqp;
    int rc;

    pthread_mutex_lock(&q->lock);
    rc = modify_qp(ibqp, attr, mask);
    pthread_mutex_unlock(&q->lock);
    return rc;
}

int sv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
                struct ibv_qp_init_attr *init_attr)
{
    struct sv_qp *q = (struct sv_qp *)(void *)ibqp;

    pthread_mutex_lock(&q->lock);
    memset(attr, 0, sizeof(*attr));
    attr->qp_state = ibqp->state;
    attr->cur_qp_state = ibqp->state;
    attr->rnr_retry = (uint8_t)q->rnr_retry;
    attr->retry_cnt = (uint8_t)q->retry_cnt;
    attr->dest_qp_num = sv_ctx(ibqp->context)->seg->qp[q->idx].dest_qpn;
    if (init_attr) {
        memset(init_attr, 0, sizeof(*init_attr));
        init_attr->send_cq = ibqp->send_cq;
        init_attr->recv_cq = ibqp->recv_cq;
        init_attr->srq = ibqp->srq;
        init_attr->qp_type = IBV_QPT_RC;
        init_attr->cap.max_send_wr = q->max_send_wr;
        init_attr->cap.max_inline_data = q->max_inline;
        init_attr->sq_sig_all = q->sq_sig_all;
    }
    pthread_mutex_unlock(&q->lock);
    return 0;
}

int sv_destroy_qp(struct ibv_qp *ibqp)
{
    struct sv_qp *q = (struct sv_qp *)(void *)ibqp;
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp_ent *e = &ctx->seg->qp[q->idx];

    /* Peers sending to it from now on find no QP: their sends fail. Off
     * the list, no other thread's sv_progress reaches it any more. */
    struct sv_peer *idle = q->peer;

    pthread_mutex_lock(&ctx->lock);
    __atomic_store_n(&e->state, (uint32_t)IBV_QPS_RESET, __ATOMIC_RELEASE);
    __atomic_store_n(&e->qpn, 0, __ATOMIC_RELEASE);
    for (struct sv_qp **pp = &ctx->qps; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    for (struct sv_qp *o = ctx->qps; o && idle; o = o->next)
        if (o->peer == idle)
            idle = NULL;
    pthread_mutex_unlock(&ctx->lock);
    /* No QP of ours reaches that peer any more: its maps would only hold
     * its memory (a peer that died or went away keeps no pages alive). A
     * later connection maps again. */
    if (idle) {
        sv_lock(&idle->seg->mr_lock);
        sv_map_drop(idle);
        sv_unlock(&idle->seg->mr_lock);
    }
    pthread_mutex_destroy(&q->lock);
    free(q->sq);
    free(q);
    return 0;
}
