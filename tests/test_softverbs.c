/* softverbs, the emulated RDMA NIC, against the RC semantics tern relies
 * on. Every test runs two processes (this one and a forked peer), each
 * with its own device context, connected QP to QP by GID and QP number as
 * on RoCE; the peer is told what to do over a socketpair. The data path is
 * rdma-core's own inline ibv_post_send / ibv_poll_cq, which dispatch to
 * softverbs through the context's ops. */
#include <arpa/inet.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <softverbs.h>

#include "suites.h"

#define BUF 65536

struct node {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_srq *srq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *buf;
};

/* What each side tells the other. */
struct card {
    union ibv_gid gid;
    uint32_t qpn;
    uint32_t rkey;
    uint64_t addr;
};

static void node_open(struct node *n, bool srq, int access)
{
    struct ibv_device **list = sv_get_device_list(NULL);

    memset(n, 0, sizeof(*n));
    ck_assert_ptr_nonnull(list);
    n->ctx = sv_open_device(list[0]);
    sv_free_device_list(list);
    ck_assert_ptr_nonnull(n->ctx);
    n->pd = sv_alloc_pd(n->ctx);
    n->cq = sv_create_cq(n->ctx, 256, NULL, NULL, 0);
    ck_assert(n->pd && n->cq);
    if (srq) {
        struct ibv_srq_init_attr sa = {.attr = {.max_wr = 64, .max_sge = 1}};

        n->srq = sv_create_srq(n->pd, &sa);
        ck_assert_ptr_nonnull(n->srq);
    }
    n->buf = calloc(1, BUF);
    n->mr = sv_reg_mr(n->pd, n->buf, BUF, access);
    ck_assert_ptr_nonnull(n->mr);
}

/* Tear a node down; its segment (/dev/shm/softverbs.PID) goes with it. */
static void node_close(struct node *n)
{
    if (n->qp)
        ck_assert_int_eq(sv_destroy_qp(n->qp), 0);
    if (n->srq)
        ck_assert_int_eq(sv_destroy_srq(n->srq), 0);
    ck_assert_int_eq(sv_dereg_mr(n->mr), 0);
    ck_assert_int_eq(sv_destroy_cq(n->cq), 0);
    ck_assert_int_eq(sv_dealloc_pd(n->pd), 0);
    ck_assert_int_eq(sv_close_device(n->ctx), 0);
    free(n->buf);
}

static struct ibv_qp *qp_new(struct node *n)
{
    struct ibv_qp_init_attr a = {
        .send_cq = n->cq, .recv_cq = n->cq, .srq = n->srq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2, .max_recv_sge = 2,
                .max_inline_data = 64},
    };
    struct ibv_qp *qp = sv_create_qp(n->pd, &a);
    struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                               .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
                                                  IBV_ACCESS_REMOTE_READ};

    ck_assert_ptr_nonnull(qp);
    ck_assert_int_eq(sv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                                 IBV_QP_ACCESS_FLAGS), 0);
    return qp;
}

static void qp_connect(struct ibv_qp *qp, const struct card *peer, uint8_t rnr_retry)
{
    struct ibv_qp_attr rtr = {
        .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = peer->qpn,
        .max_dest_rd_atomic = 1, .min_rnr_timer = 1,   /* 0.01 ms */
        .ah_attr = {.is_global = 1, .port_num = 1, .grh = {.dgid = peer->gid, .hop_limit = 1}},
    };
    struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
                              .rnr_retry = rnr_retry, .max_rd_atomic = 1};

    ck_assert_int_eq(sv_modify_qp(qp, &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                                IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                                IBV_QP_MAX_DEST_RD_ATOMIC |
                                                IBV_QP_MIN_RNR_TIMER), 0);
    ck_assert_int_eq(sv_modify_qp(qp, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                                IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                                IBV_QP_MAX_QP_RD_ATOMIC), 0);
}

static struct card card_of(struct node *n, struct ibv_qp *qp)
{
    struct card c = {.qpn = qp->qp_num, .rkey = n->mr->rkey, .addr = (uintptr_t)n->buf};

    ck_assert_int_eq(sv_query_gid(n->ctx, 1, 0, &c.gid), 0);
    return c;
}

static void xfer(int fd, void *p, size_t len, bool out)
{
    ssize_t r = out ? write(fd, p, len) : read(fd, p, len);

    ck_assert_int_eq(r, (ssize_t)len);
}

/* One completion, within a few seconds. */
static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
    struct ibv_wc wc;

    for (long i = 0; i < 50000000; i++) {
        int n = ibv_poll_cq(cq, 1, &wc);

        ck_assert_int_ge(n, 0);
        if (n == 1)
            return wc;
        if (i > 1000)
            usleep(10);
    }
    ck_abort_msg("no completion");
    return wc;
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, struct node *n, size_t off,
                uint32_t len, const struct card *peer, uint64_t roff, uint32_t rkey,
                uint64_t wr_id)
{
    struct ibv_sge sge = {.addr = (uintptr_t)n->buf + off, .length = len, .lkey = n->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xabcd)};
    struct ibv_send_wr *bad;

    wr.wr.rdma.remote_addr = peer->addr + roff;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(qp, &wr, &bad);
}

static void post_recvs(struct node *n, struct ibv_qp *qp, int count, uint32_t len)
{
    for (int i = 0; i < count; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)n->buf + (size_t)i * 4096, .length = len,
                              .lkey = n->mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1};
        struct ibv_recv_wr *bad;

        ck_assert_int_eq(qp ? ibv_post_recv(qp, &wr, &bad) : ibv_post_srq_recv(n->srq, &wr, &bad),
                         0);
    }
}

/* The forked peer: open a node, swap cards, connect, post `recvs` receives
 * of `rlen` bytes, then answer commands until told to stop: 'c' (check
 * that BUF bytes from offset 0 hold the pattern i*7), 'w' (wait for one
 * completion and report it), 'q' (quit). */
static pid_t peer_start(int *fd, struct card *peer_card, bool srq, int recvs, uint32_t rlen,
                        uint8_t rnr_retry)
{
    int sv[2];
    pid_t pid;

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct node n;
        struct card mine, theirs;
        char cmd;

        close(sv[0]);
        node_open(&n, srq, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ);
        n.qp = qp_new(&n);
        mine = card_of(&n, n.qp);
        xfer(sv[1], &mine, sizeof(mine), true);
        xfer(sv[1], &theirs, sizeof(theirs), false);
        qp_connect(n.qp, &theirs, rnr_retry);
        post_recvs(&n, srq ? NULL : n.qp, recvs, rlen);
        for (;;) {
            if (read(sv[1], &cmd, 1) != 1 || cmd == 'q') {
                node_close(&n);
                _exit(0);
            }
            if (cmd == 'c') {
                char ok = 1;

                for (size_t i = 0; i < 4096; i++)
                    if (n.buf[i] != (uint8_t)(i * 7))
                        ok = 0;
                xfer(sv[1], &ok, 1, true);
            } else if (cmd == 'w') {
                struct ibv_wc wc = wait_wc(n.cq);

                xfer(sv[1], &wc, sizeof(wc), true);
                xfer(sv[1], n.buf + (wc.wr_id >= 100 ? (wc.wr_id - 100) * 4096 : 0), 64, true);
            } else if (cmd == 'p') {
                post_recvs(&n, srq ? NULL : n.qp, 1, rlen);
            }
        }
    }
    close(sv[1]);
    *fd = sv[0];
    xfer(*fd, peer_card, sizeof(*peer_card), false);
    return pid;
}

/* Have the peer wait for its next completion: it, and the first 64 bytes
 * of the receive buffer it names. */
static struct ibv_wc peer_wait(int fd, uint8_t data[64])
{
    struct ibv_wc wc;
    char cmd = 'w';

    xfer(fd, &cmd, 1, true);
    xfer(fd, &wc, sizeof(wc), false);
    xfer(fd, data, 64, false);
    return wc;
}

static void peer_stop(int fd, pid_t pid)
{
    char q = 'q';

    (void)!write(fd, &q, 1);
    close(fd);
    waitpid(pid, NULL, 0);
}

static void local_start(struct node *n, int fd, const struct card *peer, uint8_t rnr_retry)
{
    struct card mine;

    node_open(n, false, IBV_ACCESS_LOCAL_WRITE);
    n->qp = qp_new(n);
    mine = card_of(n, n->qp);
    xfer(fd, &mine, sizeof(mine), true);
    qp_connect(n->qp, peer, rnr_retry);
}

/* A new QP on the same node, connected to a new peer. */
static void local_restart(struct node *n, int fd, const struct card *peer, uint8_t rnr_retry)
{
    struct card mine;

    ck_assert_int_eq(sv_destroy_qp(n->qp), 0);
    n->qp = qp_new(n);
    mine = card_of(n, n->qp);
    xfer(fd, &mine, sizeof(mine), true);
    qp_connect(n->qp, peer, rnr_retry);
}

/* WRITE lands in the peer's memory and READ brings it back while the peer
 * sits in read(2): no CPU of its takes part. */
START_TEST(write_and_read_need_no_peer_cpu)
{
    struct node n;
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, false, 0, 0, 7);
    struct ibv_wc wc;
    char cmd = 'c', ok = 0;

    local_start(&n, fd, &peer, 7);
    for (size_t i = 0; i < 4096; i++)
        n.buf[i] = (uint8_t)(i * 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 4096, &peer, 0, peer.rkey, 1), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    ck_assert_int_eq(wc.opcode, IBV_WC_RDMA_WRITE);
    ck_assert_uint_eq(wc.wr_id, 1);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_READ, &n, 8192, 4096, &peer, 0, peer.rkey, 2), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    ck_assert_int_eq(wc.opcode, IBV_WC_RDMA_READ);
    ck_assert_uint_eq(wc.byte_len, 4096);
    ck_assert_int_eq(memcmp(n.buf, n.buf + 8192, 4096), 0);
    xfer(fd, &cmd, 1, true);
    xfer(fd, &ok, 1, false);
    ck_assert_int_eq(ok, 1);
    peer_stop(fd, pid);
    node_close(&n);
}
END_TEST

/* SEND, SEND with immediate and WRITE with immediate consume the peer's
 * receives, in order, with the opcodes, lengths and immediates a NIC gives. */
START_TEST(sends_consume_receives_in_order)
{
    struct node n;
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, false, 3, 1024, 7);
    static const enum ibv_wr_opcode ops[] = {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
                                             IBV_WR_RDMA_WRITE_WITH_IMM};
    static const enum ibv_wc_opcode want[] = {IBV_WC_RECV, IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM};

    local_start(&n, fd, &peer, 7);
    for (int i = 0; i < 3; i++) {
        struct ibv_wc wc;
        uint8_t data[64];

        memset(n.buf, 'a' + i, 100);
        ck_assert_int_eq(post(n.qp, ops[i], &n, 0, 100, &peer, 8192, peer.rkey, 10 + (uint64_t)i), 0);
        wc = wait_wc(n.cq);
        ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
        ck_assert_uint_eq(wc.wr_id, 10 + (uint64_t)i);
        wc = peer_wait(fd, data);
        ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
        ck_assert_int_eq(wc.opcode, want[i]);
        ck_assert_uint_eq(wc.wr_id, 100 + (uint64_t)i);
        ck_assert_uint_eq(wc.byte_len, 100);
        ck_assert_uint_eq(wc.src_qp, n.qp->qp_num);
        ck_assert_int_eq(!!(wc.wc_flags & IBV_WC_WITH_IMM), i > 0);
        if (i > 0)
            ck_assert_uint_eq(ntohl(wc.imm_data), 0xabcd);
        if (i < 2)      /* a SEND lands in the receive buffer */
            ck_assert_int_eq(data[0], 'a' + i);
    }
    peer_stop(fd, pid);
    node_close(&n);
}
END_TEST

/* A bad rkey and an access past the region are remote access errors; the
 * QP then goes to error and what follows is flushed. */
START_TEST(bad_keys_and_ranges_fail_like_a_nic)
{
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, false, 0, 0, 7);
    struct node n;
    struct ibv_wc wc;
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;

    local_start(&n, fd, &peer, 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 64, &peer, 0, peer.rkey ^ 0x400, 1), 0);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 64, &peer, 0, peer.rkey, 2), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_REM_ACCESS_ERR);
    ck_assert_uint_eq(wc.wr_id, 1);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_uint_eq(wc.wr_id, 2);
    ck_assert_int_eq(sv_query_qp(n.qp, &qa, IBV_QP_STATE, &qi), 0);
    ck_assert_int_eq(qa.qp_state, IBV_QPS_ERR);
    peer_stop(fd, pid);

    /* A fresh pair: the right key, one byte past the end. */
    pid = peer_start(&fd, &peer, false, 0, 0, 7);
    local_restart(&n, fd, &peer, 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_READ, &n, 0, 64, &peer, BUF - 63, peer.rkey, 3), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_REM_ACCESS_ERR);
    peer_stop(fd, pid);
    node_close(&n);
}
END_TEST

/* A local key that does not cover the buffer is a local protection error. */
START_TEST(bad_lkey_is_a_local_error)
{
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, false, 0, 0, 7);
    struct node n;
    struct ibv_sge sge;
    struct ibv_send_wr wr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad;
    struct ibv_wc wc;

    local_start(&n, fd, &peer, 7);
    sge = (struct ibv_sge){.addr = (uintptr_t)n.buf + BUF - 8, .length = 64, .lkey = n.mr->lkey};
    wr.wr.rdma.remote_addr = peer.addr;
    wr.wr.rdma.rkey = peer.rkey;
    ck_assert_int_eq(ibv_post_send(n.qp, &wr, &bad), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_LOC_PROT_ERR);
    peer_stop(fd, pid);
    node_close(&n);
}
END_TEST

/* No receive posted: with rnr_retry 1 the send fails with RNR retries
 * exceeded; with 7 (for ever) it waits and lands once the peer posts. */
START_TEST(receiver_not_ready)
{
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, false, 0, 1024, 7);
    struct node n;
    struct ibv_wc wc;
    char cmd = 'p';

    local_start(&n, fd, &peer, 1);
    ck_assert_int_eq(post(n.qp, IBV_WR_SEND, &n, 0, 64, &peer, 0, 0, 1), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
    peer_stop(fd, pid);

    pid = peer_start(&fd, &peer, false, 0, 1024, 7);
    local_restart(&n, fd, &peer, 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_SEND, &n, 0, 64, &peer, 0, 0, 2), 0);
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(ibv_poll_cq(n.cq, 1, &wc), 0);
    xfer(fd, &cmd, 1, true);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    ck_assert_uint_eq(wc.wr_id, 2);
    peer_stop(fd, pid);
    node_close(&n);
}
END_TEST

/* A receive too small for the message: the receiver sees a local length
 * error, the sender an invalid request. */
START_TEST(receive_too_small)
{
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, false, 1, 32, 7);
    struct node n;
    struct ibv_wc wc;
    uint8_t data[64];

    local_start(&n, fd, &peer, 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_SEND, &n, 0, 64, &peer, 0, 0, 1), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_REM_INV_REQ_ERR);
    wc = peer_wait(fd, data);
    ck_assert_int_eq(wc.status, IBV_WC_LOC_LEN_ERR);
    peer_stop(fd, pid);
    node_close(&n);
}
END_TEST

/* Receives posted to an SRQ serve sends of the QP that uses it. */
START_TEST(srq_serves_sends)
{
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, true, 2, 1024, 7);
    struct node n;
    struct ibv_wc wc;
    uint8_t data[64];

    local_start(&n, fd, &peer, 7);
    for (int i = 0; i < 2; i++) {
        memset(n.buf, 'x' + i, 64);
        ck_assert_int_eq(post(n.qp, IBV_WR_SEND, &n, 0, 64, &peer, 0, 0, 1), 0);
        ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
        wc = peer_wait(fd, data);
        ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
        ck_assert_uint_eq(wc.wr_id, 100 + (uint64_t)i);
        ck_assert_int_eq(data[0], 'x' + i);
    }
    peer_stop(fd, pid);
    node_close(&n);
}
END_TEST

/* A peer that died: sends fail with retries exceeded, and the QP errs. */
START_TEST(dead_peer_is_retry_exceeded)
{
    struct card peer;
    int fd;
    pid_t pid = peer_start(&fd, &peer, false, 4, 1024, 7);
    struct node n;
    struct ibv_wc wc;

    local_start(&n, fd, &peer, 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 64, &peer, 0, peer.rkey, 1), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(fd);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 64, &peer, 0, peer.rkey, 2), 0);
    wc = wait_wc(n.cq);
    ck_assert_int_eq(wc.status, IBV_WC_RETRY_EXC_ERR);
    ck_assert_uint_eq(wc.wr_id, 2);
    node_close(&n);
    /* The killed peer could not remove its segment; the next device open
     * on this host would sweep it, this test does it now. */
    {
        char name[64];

        snprintf(name, sizeof(name), "/softverbs.%d", (int)pid);
        ck_assert_int_eq(shm_unlink(name), 0);
    }
}
END_TEST

/* An armed CQ rings its completion channel when a peer completes on it. */
START_TEST(completion_channel_wakes)
{
    struct node a, b;
    struct ibv_comp_channel *ch;
    struct ibv_cq *rcq, *got;
    struct ibv_wc wc;
    void *cq_ctx;
    int sv[2];
    pid_t pid;

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct card mine, theirs;

        node_open(&b, false, IBV_ACCESS_LOCAL_WRITE);
        b.qp = qp_new(&b);
        mine = card_of(&b, b.qp);
        xfer(sv[1], &mine, sizeof(mine), true);
        xfer(sv[1], &theirs, sizeof(theirs), false);
        qp_connect(b.qp, &theirs, 7);
        /* Wait until the other side is armed and asleep, then send. */
        xfer(sv[1], &mine, 1, false);
        post(b.qp, IBV_WR_SEND, &b, 0, 16, &theirs, 0, 0, 1);
        wait_wc(b.cq);
        xfer(sv[1], &mine, 1, false);
        node_close(&b);
        _exit(0);
    }
    node_open(&a, false, IBV_ACCESS_LOCAL_WRITE);
    ch = sv_create_comp_channel(a.ctx);
    ck_assert_ptr_nonnull(ch);
    rcq = sv_create_cq(a.ctx, 16, &a, ch, 0);
    ck_assert_ptr_nonnull(rcq);
    {
        struct ibv_qp_init_attr qa = {.send_cq = a.cq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                              .max_send_sge = 1, .max_recv_sge = 1}};
        struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1};
        struct card mine, theirs;

        a.qp = sv_create_qp(a.pd, &qa);
        ck_assert_ptr_nonnull(a.qp);
        ck_assert_int_eq(sv_modify_qp(a.qp, &init, IBV_QP_STATE), 0);
        xfer(sv[0], &theirs, sizeof(theirs), false);
        mine = card_of(&a, a.qp);
        xfer(sv[0], &mine, sizeof(mine), true);
        qp_connect(a.qp, &theirs, 7);
    }
    post_recvs(&a, a.qp, 1, 64);
    ck_assert_int_eq(ibv_req_notify_cq(rcq, 0), 0);
    ck_assert_int_eq(ibv_poll_cq(rcq, 1, &wc), 0);
    xfer(sv[0], &wc, 1, true);
    ck_assert_int_eq(sv_get_cq_event(ch, &got, &cq_ctx), 0);   /* blocks */
    ck_assert_ptr_eq(got, rcq);
    ck_assert_ptr_eq(cq_ctx, &a);
    sv_ack_cq_events(got, 1);
    ck_assert_int_eq(ibv_poll_cq(rcq, 1, &wc), 1);
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    ck_assert_int_eq(wc.opcode, IBV_WC_RECV);
    xfer(sv[0], &wc, 1, true);
    waitpid(pid, NULL, 0);
    ck_assert_int_eq(sv_destroy_qp(a.qp), 0);
    a.qp = NULL;
    ck_assert_int_eq(sv_destroy_cq(rcq), 0);
    ck_assert_int_eq(sv_destroy_comp_channel(ch), 0);
    node_close(&a);
}
END_TEST

/* Posting on a QP that is not ready to send is refused at once. */
START_TEST(post_before_rts_is_refused)
{
    struct node n;
    struct ibv_send_wr wr = {.opcode = IBV_WR_SEND}, *bad = NULL;

    node_open(&n, false, IBV_ACCESS_LOCAL_WRITE);
    n.qp = qp_new(&n);
    ck_assert_int_eq(ibv_post_send(n.qp, &wr, &bad), EINVAL);
    ck_assert_ptr_eq(bad, &wr);
    /* Remote write without local write is refused at registration. */
    ck_assert_ptr_null(sv_reg_mr(n.pd, n.buf, 64, IBV_ACCESS_REMOTE_WRITE));
    node_close(&n);
}
END_TEST

Suite *suite_softverbs(void)
{
    Suite *s = suite_create("softverbs");
    TCase *tc = tcase_create("rc");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, write_and_read_need_no_peer_cpu);
    tcase_add_test(tc, sends_consume_receives_in_order);
    tcase_add_test(tc, bad_keys_and_ranges_fail_like_a_nic);
    tcase_add_test(tc, bad_lkey_is_a_local_error);
    tcase_add_test(tc, receiver_not_ready);
    tcase_add_test(tc, receive_too_small);
    tcase_add_test(tc, srq_serves_sends);
    tcase_add_test(tc, dead_peer_is_retry_exceeded);
    tcase_add_test(tc, completion_channel_wakes);
    tcase_add_test(tc, post_before_rts_is_refused);
    suite_add_tcase(s, tc);
    return s;
}
