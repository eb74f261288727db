/* rdma_cm twins: connection management for softverbs QPs.
 *
 * librdmacm resolves IP addresses to a device and runs the IB CM handshake
 * (REQ, REP, RTU; REJ; DREQ) through the kernel. softverbs has no kernel
 * part, so the handshake runs over a TCP connection between the IP address
 * and port the passive id listens on and the one the active id resolves.
 * The messages carry what IB CM messages carry (the GID and QP number of
 * each end, the private data, the retry counts), and each side moves its
 * own QP INIT -> RTR -> RTS with them, as librdmacm does for a QP created
 * with rdma_create_qp.
 *
 * The TCP connection stays open while the connection lives: a DREQ, or
 * the end of the stream when the peer destroys its id or dies, is
 * RDMA_CM_EVENT_DISCONNECTED, with the QP moved to the error state first
 * (what the kernel does on a DREQ or a DREQ timeout).
 *
 * No threads: everything happens inside sv_rdma_get_cm_event. The event
 * channel's fd is an epoll set holding the sockets of the channel's ids
 * and an eventfd that is readable while events are queued, so the fd
 * polls readable exactly when sv_rdma_get_cm_event has something to do,
 * as librdmacm's channel fd polls readable when the kernel has an event.
 * A channel and its ids are used from one thread at a time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sv.h"

#define CM_MAGIC 0x7376636du        /* "svcm" */
#define CM_VERSION 1
#define CM_PDATA 196                /* private data room: a REP's, the largest */
#define CM_REQ_PDATA 56             /* rdma_connect: IB REQ's 92 bytes less the CMA header */
#define CM_REJ_PDATA 148            /* IB REJ */
#define CM_REJ_INVALID_SID 8        /* IB_CM_REJ_INVALID_SERVICE_ID: no one listens */
#define CM_REJ_CONSUMER 28          /* IB_CM_REJ_CONSUMER_DEFINED: rdma_reject */
#define CM_DEFAULT_RETRY 7          /* librdmacm's retry counts without conn_param */

enum msg_type { MSG_REQ = 1, MSG_REP, MSG_RTU, MSG_REJ, MSG_DREQ };

/* Every message has this one size, so a receiver always knows how much to
 * wait for. Multi-byte fields in network byte order. */
struct cm_msg {
    uint32_t magic;
    uint16_t version;
    uint8_t type;                   /* enum msg_type */
    uint8_t pdata_len;
    uint8_t gid[16];                /* REQ, REP: the sender's port GID */
    uint32_t qpn;                   /* REQ, REP: the sender's QP */
    uint8_t responder_resources;
    uint8_t initiator_depth;
    uint8_t retry_count;            /* REQ */
    uint8_t rnr_retry_count;        /* REQ, REP: for the receiver's QP */
    uint8_t pdata[CM_PDATA];
} __attribute__((packed));

enum sock_kind { SK_LISTEN, SK_PENDING, SK_CONN };

/* A socket in a channel's epoll set, with what is half read or not yet
 * written (the sockets are non-blocking). */
struct cm_sock {
    enum sock_kind kind;
    int fd;                         /* -1: none */
    uint32_t watching;              /* events the epoll set waits for; 0: not in it */
    bool fin;                       /* shut the write side once out[] is sent */
    bool shut;                      /* ... and it was */
    size_t in_len, out_len;
    uint8_t in[sizeof(struct cm_msg)];
    uint8_t out[4 * sizeof(struct cm_msg)];
};

enum id_state {
    ID_IDLE,
    ID_BOUND,
    ID_LISTEN,
    ID_ADDR_RESOLVED,
    ID_ROUTE_RESOLVED,
    ID_CONNECTING,                  /* TCP connect under way; the REQ waits in out[] */
    ID_REQ_SENT,                    /* waiting for a REP or a REJ */
    ID_REQ_RCVD,                    /* passive: CONNECT_REQUEST queued, accept or reject next */
    ID_REQ_LOST,                    /* passive: the connector left before accept or reject */
    ID_REP_SENT,                    /* waiting for the RTU */
    ID_ESTABLISHED,
    ID_DISCONNECTED,                /* DISCONNECTED was queued: nothing more comes */
    ID_CLOSED,                      /* refused, rejected or failed: nothing more comes */
};

struct cm_id {
    struct rdma_cm_id id;           /* first: the caller's handle */
    enum id_state state;
    struct cm_sock sk;
    struct cm_msg peer;             /* the REQ (passive) or REP (active) received */
    uint8_t responder_resources;    /* from our conn_param, for our QP */
    uint8_t initiator_depth;
    uint8_t retry_count;            /* active: from rdma_connect */
};

/* An accepted TCP connection whose REQ has not come yet: no id exists for
 * it until then. */
struct cm_pending {
    struct cm_sock sk;              /* first: epoll's data.ptr */
    struct cm_pending *next;
    struct cm_id *listener;
};

struct cm_event {
    struct rdma_cm_event ev;        /* first: the caller's handle */
    struct cm_event *next;
    uint8_t pdata[CM_PDATA];        /* ev.param.conn.private_data points here */
};

struct cm_channel {
    struct rdma_event_channel ch;   /* first; ch.fd: the epoll set */
    int efd;                        /* eventfd, readable while head != NULL */
    bool efd_set;
    struct cm_event *head, *tail;
    struct cm_pending *pending;
};

static struct cm_id *to_id(struct rdma_cm_id *id)
{
    return (struct cm_id *)(void *)id;
}

static struct cm_channel *to_channel(struct rdma_event_channel *ch)
{
    return (struct cm_channel *)(void *)ch;
}

static struct cm_id *sock_id(struct cm_sock *s)
{
    return (struct cm_id *)(void *)((char *)s - offsetof(struct cm_id, sk));
}

static int fail(int err)
{
    errno = err;
    return -1;
}

/* ---- the device ---- */

/* librdmacm opens every device once and keeps the contexts for the life of
 * the process; so does this, with softverbs's one device. A process forked
 * after opening it must not use (or close: that would remove the parent's
 * segment) the parent's context: it opens its own. */
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_context *dev_ctx;
static struct ibv_context *dev_inherited;   /* the parent's: reachable, not a leak */
static pid_t dev_pid;
static bool dev_atexit;

/* A context that is never closed would leave its segment in /dev/shm after
 * the process exits (until another process's device open sweeps it). The
 * segment is only unlinked here: other threads may still be using it while
 * the process exits. The name is node.c's. */
static void dev_unlink(void)
{
    char name[64];

    if (!dev_ctx || dev_pid != getpid())
        return;
    snprintf(name, sizeof(name), "/softverbs.%d", (int)dev_pid);
    shm_unlink(name);
}

static struct ibv_context *cm_device(void)
{
    struct ibv_context *ctx = NULL;

    pthread_mutex_lock(&dev_lock);
    if (dev_ctx && dev_pid == getpid()) {
        ctx = dev_ctx;
    } else {
        struct ibv_device **list = sv_get_device_list(NULL);

        if (list) {
            ctx = sv_open_device(list[0]);
            sv_free_device_list(list);
        }
        if (ctx) {
            if (dev_ctx)
                dev_inherited = dev_ctx;
            dev_ctx = ctx;
            dev_pid = getpid();
            if (!dev_atexit)
                dev_atexit = atexit(dev_unlink) == 0;
        }
    }
    pthread_mutex_unlock(&dev_lock);
    return ctx;
}

int sv_rdma_release_devices(void)
{
    int rc = 0;

    pthread_mutex_lock(&dev_lock);
    if (dev_ctx && dev_pid == getpid()) {
        rc = sv_close_device(dev_ctx);     /* EBUSY while QPs remain */
        if (rc == 0)
            dev_ctx = NULL;
    }
    pthread_mutex_unlock(&dev_lock);
    return rc ? -1 : 0;
}

struct ibv_context **sv_rdma_get_devices(int *num_devices)
{
    struct ibv_context **list;
    struct ibv_context *ctx = cm_device();

    if (!ctx)
        return NULL;
    list = calloc(2, sizeof(*list));
    if (!list)
        return NULL;
    list[0] = ctx;
    if (num_devices)
        *num_devices = 1;
    return list;
}

void sv_rdma_free_devices(struct ibv_context **list)
{
    free(list);
}

/* ---- the event queue ---- */

/* Keep the eventfd readable exactly while events are queued. */
static void queue_signal(struct cm_channel *c)
{
    uint64_t v = 1;

    if (c->head && !c->efd_set)
        c->efd_set = write(c->efd, &v, sizeof(v)) == sizeof(v);
    else if (!c->head && c->efd_set)
        c->efd_set = read(c->efd, &v, sizeof(v)) != sizeof(v);
}

/* A new event for `id`, queued at once. NULL when out of memory: the event
 * is lost, as nothing can report it. */
static struct cm_event *event_queue(struct cm_id *id, enum rdma_cm_event_type type, int status)
{
    struct cm_channel *c = to_channel(id->id.channel);
    struct cm_event *e = calloc(1, sizeof(*e));

    if (!e)
        return NULL;
    e->ev.id = &id->id;
    e->ev.event = type;
    e->ev.status = status;
    if (c->tail)
        c->tail->next = e;
    else
        c->head = e;
    c->tail = e;
    queue_signal(c);
    return e;
}

/* The connection parameters a message brought, private data copied. */
static void event_conn(struct cm_event *e, const struct cm_msg *m)
{
    struct rdma_conn_param *p = &e->ev.param.conn;

    memcpy(e->pdata, m->pdata, m->pdata_len);
    p->private_data = m->pdata_len ? e->pdata : NULL;
    p->private_data_len = m->pdata_len;
    p->responder_resources = m->responder_resources;
    p->initiator_depth = m->initiator_depth;
    p->retry_count = m->retry_count;
    p->rnr_retry_count = m->rnr_retry_count;
    p->qp_num = ntohl(m->qpn);
}

static void event_queue_conn(struct cm_id *id, enum rdma_cm_event_type type, int status,
                             const struct cm_msg *m)
{
    struct cm_event *e = event_queue(id, type, status);

    if (e)
        event_conn(e, m);
}

/* ---- sockets ---- */

/* Make the channel's epoll set wait for `events` on `s` (0: not at all:
 * a socket at its end would otherwise poll readable for ever). */
static int sock_watch(struct cm_channel *c, struct cm_sock *s, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = s};
    int rc = 0;

    if (s->fd < 0 || events == s->watching)
        return 0;
    if (!events)
        rc = epoll_ctl(c->ch.fd, EPOLL_CTL_DEL, s->fd, NULL);
    else
        rc = epoll_ctl(c->ch.fd, s->watching ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s->fd, &ev);
    if (rc == 0)
        s->watching = events;
    return rc;
}

static void sock_close(struct cm_channel *c, struct cm_sock *s)
{
    if (s->fd < 0)
        return;
    sock_watch(c, s, 0);
    close(s->fd);
    s->fd = -1;
    s->in_len = s->out_len = 0;
}

/* Send what out[] holds, as far as the socket takes it; then shut the
 * write side if asked. A broken connection drops out[]: its reading side
 * reports the end. */
static void sock_flush(struct cm_sock *s)
{
    while (s->out_len) {
        ssize_t n = send(s->fd, s->out, s->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0) {
            s->out_len = 0;
            break;
        }
        memmove(s->out, s->out + n, s->out_len - (size_t)n);
        s->out_len -= (size_t)n;
    }
    if (s->fin && !s->shut) {
        shutdown(s->fd, SHUT_WR);
        s->shut = true;
    }
}

/* Queue a message (flushed unless the connection is still being made). */
static void sock_put(struct cm_sock *s, const struct cm_msg *m, bool flush)
{
    /* At most a REQ or REP, an RTU and a DREQ are ever in flight. */
    if (s->fd < 0 || s->out_len + sizeof(*m) > sizeof(s->out))
        return;
    memcpy(s->out + s->out_len, m, sizeof(*m));
    s->out_len += sizeof(*m);
    if (flush)
        sock_flush(s);
}

static void sock_fin(struct cm_sock *s)
{
    s->fin = true;
    if (s->fd >= 0)
        sock_flush(s);
}

static bool msg_valid(const struct cm_msg *m)
{
    return ntohl(m->magic) == CM_MAGIC && ntohs(m->version) == CM_VERSION &&
           m->type >= MSG_REQ && m->type <= MSG_DREQ && m->pdata_len <= CM_PDATA;
}

/* Read towards the next message: 1 with it in *m, 0 while it is not all
 * there, -1 at the end of the stream (ECONNRESET), on an error, or on a
 * message that is not ours (EPROTO). */
static int sock_read(struct cm_sock *s, struct cm_msg *m)
{
    while (s->in_len < sizeof(*m)) {
        ssize_t n = recv(s->fd, s->in + s->in_len, sizeof(*m) - s->in_len, MSG_DONTWAIT);

        if (n == 0)
            return fail(ECONNRESET);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        s->in_len += (size_t)n;
    }
    memcpy(m, s->in, sizeof(*m));
    s->in_len = 0;
    return msg_valid(m) ? 1 : fail(EPROTO);
}

/* ---- messages, QPs, ids ---- */

static void msg_init(struct cm_msg *m, enum msg_type type, const struct cm_id *id,
                     const void *pdata, uint8_t len)
{
    memset(m, 0, sizeof(*m));
    m->magic = htonl(CM_MAGIC);
    m->version = htons(CM_VERSION);
    m->type = (uint8_t)type;
    m->pdata_len = len;
    if (len)
        memcpy(m->pdata, pdata, len);
    if ((type == MSG_REQ || type == MSG_REP) && id->id.qp) {
        union ibv_gid gid;

        sv_query_gid(id->id.verbs, 1, 0, &gid);
        memcpy(m->gid, gid.raw, sizeof(m->gid));
        m->qpn = htonl(id->id.qp->qp_num);
    }
}

/* What the epoll set should wait for on an id's socket, by its state. */
static void id_watch(struct cm_id *id)
{
    struct cm_channel *c = to_channel(id->id.channel);
    uint32_t ev = 0;

    switch (id->state) {
    case ID_LISTEN:
    case ID_REQ_SENT:
    case ID_REQ_RCVD:
    case ID_REP_SENT:
    case ID_ESTABLISHED:
        ev = EPOLLIN;
        break;
    case ID_CONNECTING:
        ev = EPOLLOUT;      /* the connect completes */
        break;
    default:
        break;
    }
    if (id->sk.out_len)
        ev |= EPOLLOUT;
    sock_watch(c, &id->sk, ev);
}

static void id_close(struct cm_id *id, enum id_state state)
{
    sock_close(to_channel(id->id.channel), &id->sk);
    id->state = state;
}

static void qp_error(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

    if (qp)
        sv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* INIT -> RTR -> RTS towards the QP the peer's REQ or REP names, as
 * librdmacm moves a QP it created. 0 or an errno (the peer's segment is
 * gone: EINVAL). */
static int qp_connect(struct cm_id *id, uint8_t retry_cnt, uint8_t rnr_retry)
{
    struct ibv_qp_attr rtr = {
        .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096,
        .dest_qp_num = ntohl(id->peer.qpn),
        .max_dest_rd_atomic = id->responder_resources,
        .min_rnr_timer = 1,
        .ah_attr = {.is_global = 1, .port_num = 1, .grh = {.hop_limit = 1}},
    };
    struct ibv_qp_attr rts = {
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = retry_cnt,
        .rnr_retry = rnr_retry, .max_rd_atomic = id->initiator_depth,
    };
    int rc;

    if (!id->id.qp)
        return EINVAL;
    memcpy(rtr.ah_attr.grh.dgid.raw, id->peer.gid, sizeof(id->peer.gid));
    rc = sv_modify_qp(id->id.qp, &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return rc;
    memcpy(id->id.route.addr.addr.ibaddr.dgid.raw, id->peer.gid, sizeof(id->peer.gid));
    return sv_modify_qp(id->id.qp, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                             IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                             IBV_QP_MAX_QP_RD_ATOMIC);
}

static struct cm_id *id_new(struct rdma_event_channel *channel, void *context,
                            enum rdma_port_space ps)
{
    struct cm_id *id = calloc(1, sizeof(*id));

    if (!id)
        return NULL;
    id->id.channel = channel;
    id->id.context = context;
    id->id.ps = ps;
    id->id.qp_type = IBV_QPT_RC;
    id->sk.kind = SK_CONN;
    id->sk.fd = -1;
    id->state = ID_IDLE;
    return id;
}

/* The id now has the device: as after address resolution in librdmacm. */
static int id_attach_device(struct cm_id *id)
{
    union ibv_gid gid;

    if (!id->id.verbs) {
        id->id.verbs = cm_device();
        if (!id->id.verbs)
            return -1;
    }
    id->id.port_num = 1;
    sv_query_gid(id->id.verbs, 1, 0, &gid);
    id->id.route.addr.addr.ibaddr.sgid = gid;
    return 0;
}

static socklen_t addr_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static bool addr_ip(const struct sockaddr *sa)
{
    return sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6);
}

static void id_fill_src(struct cm_id *id)
{
    socklen_t sl = sizeof(id->id.route.addr.src_storage);

    getsockname(id->sk.fd, &id->id.route.addr.src_addr, &sl);
}

/* ---- what arrives on the sockets ---- */

/* The TCP connection was refused or could not be made. */
static void connect_failed(struct cm_id *id, int err)
{
    id_close(id, ID_CLOSED);
    if (err == ECONNREFUSED)
        event_queue(id, RDMA_CM_EVENT_REJECTED, CM_REJ_INVALID_SID);
    else
        event_queue(id, RDMA_CM_EVENT_UNREACHABLE, -err);
}

/* The peer went away (end of stream, error, DREQ) or broke the protocol. */
static void conn_lost(struct cm_id *id, int err)
{
    switch (id->state) {
    case ID_REQ_SENT:
        id_close(id, ID_CLOSED);
        event_queue(id, RDMA_CM_EVENT_CONNECT_ERROR, -err);
        break;
    case ID_REQ_RCVD:
        /* The application holds the CONNECT_REQUEST; its accept will
         * report the failure. */
        id_close(id, ID_REQ_LOST);
        break;
    case ID_REP_SENT:
        qp_error(id->id.qp);
        id_close(id, ID_CLOSED);
        event_queue(id, RDMA_CM_EVENT_CONNECT_ERROR, -err);
        break;
    case ID_ESTABLISHED:
        /* As the kernel does: the QP errs (pending work flushes) before
         * DISCONNECTED is reported. */
        qp_error(id->id.qp);
        id_close(id, ID_DISCONNECTED);
        event_queue(id, RDMA_CM_EVENT_DISCONNECTED, 0);
        break;
    default:
        id_close(id, id->state);
        break;
    }
}

/* Active side: the REP came. */
static void on_rep(struct cm_id *id, const struct cm_msg *m)
{
    struct cm_msg rtu;
    int rc;

    id->peer = *m;
    rc = qp_connect(id, id->retry_count, m->rnr_retry_count);
    if (rc) {
        /* The peer's QP cannot be reached (its process is gone): the
         * passive side sees the connection end before the RTU. */
        qp_error(id->id.qp);
        id_close(id, ID_CLOSED);
        event_queue(id, RDMA_CM_EVENT_CONNECT_ERROR, -rc);
        return;
    }
    msg_init(&rtu, MSG_RTU, id, NULL, 0);
    sock_put(&id->sk, &rtu, true);
    id->state = ID_ESTABLISHED;
    event_queue_conn(id, RDMA_CM_EVENT_ESTABLISHED, 0, m);
}

static void on_msg(struct cm_id *id, const struct cm_msg *m)
{
    if (id->state == ID_REQ_SENT && m->type == MSG_REP) {
        on_rep(id, m);
    } else if (id->state == ID_REQ_SENT && m->type == MSG_REJ) {
        id_close(id, ID_CLOSED);
        event_queue_conn(id, RDMA_CM_EVENT_REJECTED, CM_REJ_CONSUMER, m);
    } else if (id->state == ID_REP_SENT && m->type == MSG_RTU) {
        id->state = ID_ESTABLISHED;
        event_queue(id, RDMA_CM_EVENT_ESTABLISHED, 0);
    } else if (id->state == ID_ESTABLISHED && m->type == MSG_DREQ) {
        conn_lost(id, ECONNRESET);
    } else {
        conn_lost(id, m->type == MSG_DREQ ? ECONNRESET : EPROTO);
    }
}

static bool id_reads(const struct cm_id *id)
{
    return id->sk.fd >= 0 && (id->state == ID_REQ_SENT || id->state == ID_REQ_RCVD ||
                              id->state == ID_REP_SENT || id->state == ID_ESTABLISHED);
}

static void on_conn(struct cm_id *id, uint32_t events)
{
    if (id->state == ID_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof(err);

        if (getsockopt(id->sk.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err) {
            connect_failed(id, err);
            return;
        }
        id_fill_src(id);
        id->state = ID_REQ_SENT;
        sock_flush(&id->sk);        /* the REQ */
        id_watch(id);
        return;
    }
    if (events & EPOLLOUT)
        sock_flush(&id->sk);
    while ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) && id_reads(id)) {
        struct cm_msg m;
        int r = sock_read(&id->sk, &m);

        if (r == 0)
            break;
        if (r < 0)
            conn_lost(id, errno);
        else
            on_msg(id, &m);
    }
    id_watch(id);
}

static void pending_free(struct cm_channel *c, struct cm_pending *p, bool close_sock)
{
    for (struct cm_pending **pp = &c->pending; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    if (close_sock)
        sock_close(c, &p->sk);
    free(p);
}

/* Passive side: a REQ on an accepted connection makes the child id. */
static void on_pending(struct cm_channel *c, struct cm_pending *p)
{
    struct cm_id *l = p->listener, *id;
    struct epoll_event ev = {.events = EPOLLIN};
    struct cm_event *e;
    struct cm_msg m;
    socklen_t sl;
    int r = sock_read(&p->sk, &m);

    if (r == 0)
        return;
    /* Not a connection request of ours: no event, just hang up. */
    if (r < 0 || m.type != MSG_REQ || m.pdata_len > CM_REQ_PDATA) {
        pending_free(c, p, true);
        return;
    }
    id = id_new(l->id.channel, l->id.context, l->id.ps);
    if (!id || id_attach_device(id) < 0) {
        free(id);
        pending_free(c, p, true);
        return;
    }
    id->sk = p->sk;
    id->sk.kind = SK_CONN;
    ev.data.ptr = &id->sk;
    if (epoll_ctl(c->ch.fd, EPOLL_CTL_MOD, id->sk.fd, &ev) < 0) {
        free(id);
        pending_free(c, p, true);
        return;
    }
    pending_free(c, p, false);
    id->sk.watching = EPOLLIN;
    sl = sizeof(id->id.route.addr.src_storage);
    getsockname(id->sk.fd, &id->id.route.addr.src_addr, &sl);
    sl = sizeof(id->id.route.addr.dst_storage);
    getpeername(id->sk.fd, &id->id.route.addr.dst_addr, &sl);
    memcpy(id->id.route.addr.addr.ibaddr.dgid.raw, m.gid, sizeof(m.gid));
    id->peer = m;
    id->state = ID_REQ_RCVD;
    e = event_queue(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
    if (e) {
        e->ev.listen_id = &l->id;
        event_conn(e, &m);
    }
}

/* Passive side: take the TCP connections the listener has. */
static void on_listen(struct cm_channel *c, struct cm_id *l)
{
    /* Bounded: a listener that keeps failing (EMFILE) must not hold the
     * caller here. */
    for (int i = 0; i < 64; i++) {
        int fd = accept4(l->sk.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct cm_pending *p;

        if (fd < 0 && errno == EINTR)
            continue;
        if (fd < 0)
            return;
        p = calloc(1, sizeof(*p));
        if (!p) {
            close(fd);
            continue;
        }
        p->sk.kind = SK_PENDING;
        p->sk.fd = fd;
        p->listener = l;
        if (sock_watch(c, &p->sk, EPOLLIN) < 0) {
            close(fd);
            free(p);
            continue;
        }
        p->next = c->pending;
        c->pending = p;
    }
}

static void on_socket(struct cm_channel *c, const struct epoll_event *ev)
{
    struct cm_sock *s = ev->data.ptr;

    if (!s)
        return;     /* the eventfd: the queue is not empty */
    switch (s->kind) {
    case SK_LISTEN:
        on_listen(c, sock_id(s));
        break;
    case SK_PENDING:
        on_pending(c, (struct cm_pending *)(void *)s);
        break;
    case SK_CONN:
        on_conn(sock_id(s), ev->events);
        break;
    }
}

/* ---- event channels ---- */

struct rdma_event_channel *sv_rdma_create_event_channel(void)
{
    struct cm_channel *c = calloc(1, sizeof(*c));
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    int err;

    if (!c)
        return NULL;
    c->ch.fd = epoll_create1(EPOLL_CLOEXEC);
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->ch.fd >= 0 && c->efd >= 0 && epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, c->efd, &ev) == 0)
        return &c->ch;
    err = errno;
    if (c->ch.fd >= 0)
        close(c->ch.fd);
    if (c->efd >= 0)
        close(c->efd);
    free(c);
    errno = err;
    return NULL;
}

void sv_rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
    struct cm_channel *c = to_channel(channel);

    if (!c)
        return;
    while (c->head) {
        struct cm_event *e = c->head;

        c->head = e->next;
        /* An unreported connection request's id: no one else knows it. */
        if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
            sock_close(c, &to_id(e->ev.id)->sk);
            free(e->ev.id);
        }
        free(e);
    }
    while (c->pending)
        pending_free(c, c->pending, true);
    close(c->efd);
    close(c->ch.fd);
    free(c);
}

int sv_rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
    struct cm_channel *c = to_channel(channel);
    int flags;
    bool nonblock;

    if (!c || !event)
        return fail(EINVAL);
    flags = fcntl(channel->fd, F_GETFL);
    nonblock = flags >= 0 && (flags & O_NONBLOCK);
    for (;;) {
        struct epoll_event ev;
        int n;

        if (c->head) {
            struct cm_event *e = c->head;

            c->head = e->next;
            if (!c->head)
                c->tail = NULL;
            queue_signal(c);
            e->next = NULL;
            *event = &e->ev;
            return 0;
        }
        /* One socket at a time: handling one may close or free others'
         * state (a listener's pending connections), which a batch of
         * epoll results would still point to. */
        n = epoll_wait(channel->fd, &ev, 1, nonblock ? 0 : -1);
        if (n < 0)
            return -1;      /* EINTR included, as librdmacm's read() */
        if (n == 0)
            return fail(EAGAIN);
        on_socket(c, &ev);
    }
}

int sv_rdma_ack_cm_event(struct rdma_cm_event *event)
{
    if (!event)
        return fail(EINVAL);
    free(event);    /* the cm_event it is the first member of */
    return 0;
}

/* ---- ids ---- */

int sv_rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
                      void *context, enum rdma_port_space ps)
{
    struct cm_id *i;

    /* librdmacm's synchronous ids (no channel) are not emulated. */
    if (!channel || !id)
        return fail(EINVAL);
    if (ps != RDMA_PS_TCP)
        return fail(ENOTSUP);
    i = id_new(channel, context, ps);
    if (!i)
        return fail(ENOMEM);
    *id = &i->id;
    return 0;
}

/* Drop the events of `id` not yet returned; a listener's unreported
 * connection requests go with it (their child ids too: the caller never
 * learnt of them). */
static void drop_events(struct cm_channel *c, struct rdma_cm_id *id)
{
    struct cm_event **pp = &c->head, *prev = NULL;

    while (*pp) {
        struct cm_event *e = *pp;

        if (e->ev.id != id && e->ev.listen_id != id) {
            prev = e;
            pp = &e->next;
            continue;
        }
        *pp = e->next;
        if (c->tail == e)
            c->tail = prev;
        if (e->ev.id != id) {
            struct cm_id *child = to_id(e->ev.id);

            sock_close(c, &child->sk);
            free(child);
        }
        free(e);
    }
    queue_signal(c);
}

int sv_rdma_destroy_id(struct rdma_cm_id *rid)
{
    struct cm_id *id = to_id(rid);
    struct cm_channel *c;

    if (!id)
        return fail(EINVAL);
    c = to_channel(rid->channel);
    drop_events(c, rid);
    if (id->state == ID_LISTEN) {
        struct cm_pending **pp = &c->pending;

        while (*pp) {
            if ((*pp)->listener == id)
                pending_free(c, *pp, true);
            else
                pp = &(*pp)->next;
        }
    }
    /* The peer sees the end of the stream: DISCONNECTED, or a connect
     * error while connecting. A QP still attached is the caller's to
     * destroy (sv_rdma_destroy_qp first), as with librdmacm. An event
     * already returned and not yet acknowledged still points to the id:
     * librdmacm would wait for the acknowledgement here; this does not,
     * so such an event must not be used after its id is destroyed. */
    sock_close(c, &id->sk);
    free(id);
    return 0;
}

static int id_socket(struct cm_id *id, int family)
{
    int one = 1;

    id->sk.fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (id->sk.fd < 0)
        return -1;
    setsockopt(id->sk.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    return 0;
}

int sv_rdma_bind_addr(struct rdma_cm_id *rid, struct sockaddr *addr)
{
    struct cm_id *id = to_id(rid);
    int err;

    if (!id || id->state != ID_IDLE || !addr_ip(addr))
        return fail(EINVAL);
    if (id_socket(id, addr->sa_family) < 0)
        return -1;
    if (bind(id->sk.fd, addr, addr_len(addr)) < 0 || id_attach_device(id) < 0) {
        err = errno;
        close(id->sk.fd);
        id->sk.fd = -1;
        return fail(err);
    }
    /* Port 0 becomes the port the kernel chose. */
    id_fill_src(id);
    id->state = ID_BOUND;
    return 0;
}

int sv_rdma_listen(struct rdma_cm_id *rid, int backlog)
{
    struct cm_id *id = to_id(rid);

    if (!id || id->state != ID_BOUND)
        return fail(EINVAL);
    if (listen(id->sk.fd, backlog > 0 ? backlog : SOMAXCONN) < 0)
        return -1;
    id->sk.kind = SK_LISTEN;
    if (sock_watch(to_channel(rid->channel), &id->sk, EPOLLIN) < 0)
        return -1;
    id->state = ID_LISTEN;
    return 0;
}

int sv_rdma_resolve_addr(struct rdma_cm_id *rid, struct sockaddr *src_addr,
                         struct sockaddr *dst_addr, int timeout_ms)
{
    struct cm_id *id = to_id(rid);

    if (!id || (id->state != ID_IDLE && id->state != ID_BOUND) || !addr_ip(dst_addr))
        return fail(EINVAL);
    if (src_addr && id->state == ID_IDLE) {
        if (src_addr->sa_family != dst_addr->sa_family)
            return fail(EINVAL);
        /* Bound now rather than at connect: an unusable source address
         * fails here, as librdmacm's does. */
        if (sv_rdma_bind_addr(rid, src_addr) < 0)
            return -1;
    }
    if (id->state == ID_BOUND && rid->route.addr.src_addr.sa_family != dst_addr->sa_family)
        return fail(EINVAL);
    if (id_attach_device(id) < 0)
        return -1;
    memset(&rid->route.addr.dst_storage, 0, sizeof(rid->route.addr.dst_storage));
    memcpy(&rid->route.addr.dst_addr, dst_addr, addr_len(dst_addr));
    if (id->state == ID_IDLE)
        rid->route.addr.src_addr.sa_family = dst_addr->sa_family;
    id->state = ID_ADDR_RESOLVED;
    if (!event_queue(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0))
        return fail(ENOMEM);
    return 0;
}

int sv_rdma_resolve_route(struct rdma_cm_id *rid, int timeout_ms)
{
    struct cm_id *id = to_id(rid);

    if (!id || id->state != ID_ADDR_RESOLVED)
        return fail(EINVAL);
    id->state = ID_ROUTE_RESOLVED;
    if (!event_queue(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0))
        return fail(ENOMEM);
    return 0;
}

int sv_rdma_create_qp(struct rdma_cm_id *rid, struct ibv_pd *pd,
                      struct ibv_qp_init_attr *attr)
{
    struct ibv_qp_attr init = {
        .qp_state = IBV_QPS_INIT, .port_num = 1,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_REMOTE_WRITE,
    };
    struct ibv_qp *qp;
    int rc;

    if (!rid || !pd || !attr || rid->qp || !rid->verbs || pd->context != rid->verbs ||
        attr->qp_type != IBV_QPT_RC)
        return fail(EINVAL);
    qp = sv_create_qp(pd, attr);
    if (!qp)
        return -1;
    rc = sv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                     IBV_QP_ACCESS_FLAGS);
    if (rc) {
        sv_destroy_qp(qp);
        return fail(rc);
    }
    /* attr->cap stays as given: softverbs creates exactly what is asked. */
    rid->qp = qp;
    rid->pd = pd;
    rid->send_cq = attr->send_cq;
    rid->recv_cq = attr->recv_cq;
    rid->srq = attr->srq;
    return 0;
}

void sv_rdma_destroy_qp(struct rdma_cm_id *rid)
{
    if (!rid || !rid->qp)
        return;
    sv_destroy_qp(rid->qp);
    rid->qp = NULL;
}

int sv_rdma_connect(struct rdma_cm_id *rid, struct rdma_conn_param *param)
{
    struct cm_id *id = to_id(rid);
    const struct sockaddr *dst;
    bool own_socket;
    struct cm_msg req;

    if (!id || id->state != ID_ROUTE_RESOLVED || !rid->qp)
        return fail(EINVAL);
    if (param && (param->private_data_len > CM_REQ_PDATA ||
                  (param->private_data_len && !param->private_data)))
        return fail(EINVAL);
    dst = &rid->route.addr.dst_addr;
    own_socket = id->sk.fd < 0;
    if (own_socket && id_socket(id, dst->sa_family) < 0)
        return -1;
    id->responder_resources = param ? param->responder_resources : 0;
    id->initiator_depth = param ? param->initiator_depth : 0;
    id->retry_count = param ? param->retry_count : CM_DEFAULT_RETRY;
    msg_init(&req, MSG_REQ, id, param ? param->private_data : NULL,
             param ? param->private_data_len : 0);
    req.responder_resources = id->responder_resources;
    req.initiator_depth = id->initiator_depth;
    req.retry_count = id->retry_count;
    req.rnr_retry_count = param ? param->rnr_retry_count : CM_DEFAULT_RETRY;
    sock_put(&id->sk, &req, false);
    if (connect(id->sk.fd, dst, addr_len(dst)) == 0) {
        id_fill_src(id);
        id->state = ID_REQ_SENT;
        sock_flush(&id->sk);
    } else if (errno == EINPROGRESS || errno == EINTR) {
        id->state = ID_CONNECTING;
    } else if (errno == ECONNREFUSED || errno == ENETUNREACH || errno == EHOSTUNREACH ||
               errno == ETIMEDOUT) {
        /* Reported as an event, as librdmacm's would be. */
        connect_failed(id, errno);
        return 0;
    } else {
        int err = errno;

        id->sk.out_len = 0;
        if (own_socket) {
            close(id->sk.fd);
            id->sk.fd = -1;
        }
        return fail(err);
    }
    id_watch(id);
    return 0;
}

int sv_rdma_accept(struct rdma_cm_id *rid, struct rdma_conn_param *param)
{
    struct cm_id *id = to_id(rid);
    struct cm_msg rep;
    int rc;

    if (!id || (id->state != ID_REQ_RCVD && id->state != ID_REQ_LOST) || !rid->qp)
        return fail(EINVAL);
    if (param && (param->private_data_len > CM_PDATA ||
                  (param->private_data_len && !param->private_data)))
        return fail(EINVAL);
    if (id->state == ID_REQ_LOST) {
        /* The connector went away meanwhile: on IB the REP would go
         * unanswered and the connection fail. */
        id->state = ID_CLOSED;
        event_queue(id, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET);
        return 0;
    }
    id->responder_resources = param ? param->responder_resources : 0;
    id->initiator_depth = param ? param->initiator_depth : 0;
    /* The REQ's counts are for this side's QP (rdma_connect(3): "from the
     * remote peer"), as the IB CM applies them; the REP's are for the
     * connector's. */
    rc = qp_connect(id, id->peer.retry_count, id->peer.rnr_retry_count);
    if (rc) {
        qp_error(rid->qp);
        return fail(rc);
    }
    msg_init(&rep, MSG_REP, id, param ? param->private_data : NULL,
             param ? param->private_data_len : 0);
    rep.responder_resources = id->responder_resources;
    rep.initiator_depth = id->initiator_depth;
    rep.rnr_retry_count = param ? param->rnr_retry_count : CM_DEFAULT_RETRY;
    sock_put(&id->sk, &rep, true);
    id->state = ID_REP_SENT;
    id_watch(id);
    return 0;
}

int sv_rdma_reject(struct rdma_cm_id *rid, const void *private_data, uint8_t private_data_len)
{
    struct cm_id *id = to_id(rid);
    struct cm_msg rej;

    if (!id || (id->state != ID_REQ_RCVD && id->state != ID_REQ_LOST) ||
        private_data_len > CM_REJ_PDATA || (private_data_len && !private_data))
        return fail(EINVAL);
    msg_init(&rej, MSG_REJ, id, private_data, private_data_len);
    sock_put(&id->sk, &rej, true);
    sock_fin(&id->sk);
    id->state = ID_CLOSED;
    id_watch(id);       /* until the REJ is out */
    return 0;
}

int sv_rdma_disconnect(struct rdma_cm_id *rid)
{
    struct cm_id *id = to_id(rid);
    struct cm_msg dreq;

    if (!id)
        return fail(EINVAL);
    switch (id->state) {
    case ID_DISCONNECTED:
    case ID_CLOSED:
        /* Over already (either side ended it): as librdmacm, no error and
         * no second DISCONNECTED. */
        return 0;
    case ID_CONNECTING:
    case ID_REQ_SENT:
    case ID_REP_SENT:
    case ID_ESTABLISHED:
        break;
    default:
        return fail(EINVAL);
    }
    qp_error(rid->qp);
    if (id->state == ID_CONNECTING) {
        id_close(id, ID_DISCONNECTED);
    } else {
        msg_init(&dreq, MSG_DREQ, id, NULL, 0);
        sock_put(&id->sk, &dreq, true);
        sock_fin(&id->sk);
        id->state = ID_DISCONNECTED;
        id_watch(id);
    }
    /* librdmacm reports the end of the connection on this side too. */
    if (!event_queue(id, RDMA_CM_EVENT_DISCONNECTED, 0))
        return fail(ENOMEM);
    return 0;
}
