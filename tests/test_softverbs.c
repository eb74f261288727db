/* softverbs, the emulated RDMA NIC, against the RC semantics tern relies
 * on. Every test runs two processes (this one and a forked peer), each
 * with its own device context, connected QP to QP by GID and QP number as
 * on RoCE; the peer is told what to do over a socketpair. The data path is
 * rdma-core's own inline ibv_post_send / ibv_poll_cq, which dispatch to
 * softverbs through the context's ops. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <softverbs.h>

#include "suites.h"

#define BUF 65536

/* What a node's buffer is, which decides how a peer reaches it (map.c):
 * anonymous pages (by system call), memory from sv_buf_alloc, or a file
 * with a path (both mapped by the peer, the copy a memcpy). The tests of
 * the "rc" case run once with each; a forked peer inherits the choice. */
enum { MEM_ANON, MEM_BUF, MEM_FILE, MEM_KINDS };
static int mem_kind;
/* First in a loop test: the kind is the loop's index. */
#define MEM_KIND_OF_LOOP __attribute__((unused)) const int mem_kind_of_loop = (mem_kind = _i)

static uint8_t *mem_alloc(size_t len)
{
    uint8_t *p = NULL;

    if (mem_kind == MEM_BUF) {
        p = sv_buf_alloc(len);
    } else if (mem_kind == MEM_FILE) {
        char path[64];
        int fd;

        /* Named by the process, so that one killed can be cleaned after. */
        snprintf(path, sizeof(path), "/dev/shm/tern-svtest-%d-XXXXXX", (int)getpid());
        fd = mkstemp(path);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ck_assert(p != MAP_FAILED);
        close(fd);
        return p;   /* the path stays while peers may map it: mem_free */
    } else {
        p = calloc(1, len);
    }
    ck_assert_ptr_nonnull(p);
    return p;
}

/* The path of the file mapped at `p` (one replaced since reads as its
 * path, not "... (deleted)"), or "". */
static void mem_path(const uint8_t *p, char *path, size_t size)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];

    path[0] = '\0';
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long long a;
        char *at = strchr(line, '/');

        if (sscanf(line, "%llx-", &a) == 1 && a == (uintptr_t)p && at) {
            char *gone = strstr(at, " (deleted)");

            at[strcspn(at, "\n")] = '\0';
            if (gone)
                *gone = '\0';
            snprintf(path, size, "%s", at);
        }
    }
    if (f)
        fclose(f);
}

static void mem_free(uint8_t *p, size_t len)
{
    if (mem_kind == MEM_BUF) {
        sv_buf_free(p, len);
    } else if (mem_kind == MEM_FILE) {
        char path[64];

        mem_path(p, path, sizeof(path));
        munmap(p, len);
        if (path[0])
            unlink(path);
    } else {
        free(p);
    }
}

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
    n->buf = mem_alloc(BUF);
    memset(n->buf, 0, BUF);
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
    mem_free(n->buf, BUF);
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
            } else if (cmd == 'x') {
                /* Put another file where the buffer's was: what a peer
                 * opens by that path is no longer the registered one. */
                char path[64];
                int nfd;

                mem_path(n.buf, path, sizeof(path));
                ck_assert(path[0] && unlink(path) == 0);
                nfd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
                ck_assert_int_ge(nfd, 0);
                ck_assert_int_eq(ftruncate(nfd, BUF), 0);
                close(nfd);
                xfer(sv[1], &cmd, 1, true);
            } else if (cmd == 'r') {
                /* Register anew: a new key. */
                ck_assert_int_eq(sv_dereg_mr(n.mr), 0);
                n.mr = sv_reg_mr(n.pd, n.buf, BUF, IBV_ACCESS_LOCAL_WRITE |
                                                       IBV_ACCESS_REMOTE_WRITE |
                                                       IBV_ACCESS_REMOTE_READ);
                ck_assert_ptr_nonnull(n.mr);
                xfer(sv[1], &n.mr->rkey, sizeof(n.mr->rkey), true);
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
    MEM_KIND_OF_LOOP;
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

/* How many mappings of sv_buf_alloc memory this process has. */
static int buf_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, "/memfd:softverbs") != NULL;
    fclose(f);
    return n;
}

/* A peer's region is mapped at the first access, the map is dropped when
 * the peer deregisters it (the next access sees a new generation) and
 * when the peer dies; what lands through the map is in the peer's memory. */
START_TEST(peer_regions_are_mapped_and_dropped)
{
    struct node n;
    struct card peer;
    int fd, before;
    pid_t pid;
    char cmd = 'c', ok = 0;
    uint32_t rkey;

    mem_kind = MEM_BUF;
    pid = peer_start(&fd, &peer, false, 0, 0, 7);
    local_start(&n, fd, &peer, 7);
    before = buf_maps();
    for (size_t i = 0; i < 4096; i++)
        n.buf[i] = (uint8_t)(i * 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 4096, &peer, 0, peer.rkey, 1), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
    ck_assert_int_eq(buf_maps(), before + 1);
    xfer(fd, &cmd, 1, true);
    xfer(fd, &ok, 1, false);
    ck_assert_int_eq(ok, 1);

    cmd = 'r';
    xfer(fd, &cmd, 1, true);
    xfer(fd, &rkey, sizeof(rkey), false);
    ck_assert_uint_ne(rkey, peer.rkey);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_READ, &n, 8192, 4096, &peer, 0, rkey, 2), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
    ck_assert_int_eq(memcmp(n.buf, n.buf + 8192, 4096), 0);
    ck_assert_int_eq(buf_maps(), before + 1);     /* the old map went */

    peer_stop(fd, pid);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 64, &peer, 0, rkey, 3), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_RETRY_EXC_ERR);
    ck_assert_int_eq(buf_maps(), before);
    node_close(&n);
}
END_TEST

/* Remove the files a killed process of the tests left (mem_alloc). */
static void mem_sweep(pid_t pid)
{
    DIR *d = opendir("/dev/shm");
    char prefix[64], path[320];
    struct dirent *e;

    ck_assert_ptr_nonnull(d);
    snprintf(prefix, sizeof(prefix), "tern-svtest-%d-", (int)pid);
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
            unlink(path);
        }
    closedir(d);
}

/* How many mappings of the tests' own files this process has. */
static int file_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, "/tern-svtest-") != NULL;
    fclose(f);
    return n;
}

/* A file that is no longer the one the peer registered (replaced at its
 * path) is not mapped: the copy goes by system call into the peer's
 * memory, where the data lands all the same. */
START_TEST(a_replaced_backing_file_is_not_mapped)
{
    struct node n;
    struct card peer;
    int fd, before;
    pid_t pid;
    char cmd = 'x', ok = 0;

    mem_kind = MEM_FILE;
    pid = peer_start(&fd, &peer, false, 0, 0, 7);
    local_start(&n, fd, &peer, 7);
    xfer(fd, &cmd, 1, true);
    xfer(fd, &cmd, 1, false);
    before = file_maps();
    for (size_t i = 0; i < 4096; i++)
        n.buf[i] = (uint8_t)(i * 7);
    ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 4096, &peer, 0, peer.rkey, 1), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
    ck_assert_int_eq(file_maps(), before);
    cmd = 'c';
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
    MEM_KIND_OF_LOOP;
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
    MEM_KIND_OF_LOOP;
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
    MEM_KIND_OF_LOOP;
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
    MEM_KIND_OF_LOOP;
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
    MEM_KIND_OF_LOOP;
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
    MEM_KIND_OF_LOOP;
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
    MEM_KIND_OF_LOOP;
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
    /* As a NIC learns of it from a timeout, softverbs looks at most every
     * SV_ALIVE_NS (1 ms): a write into mapped memory of the dead peer
     * may land before (nobody reads it; its pages go with the map). Then
     * the QP fails, and stays failed. */
    for (uint64_t id = 2;; id++) {
        ck_assert_int_eq(post(n.qp, IBV_WR_RDMA_WRITE, &n, 0, 64, &peer, 0, peer.rkey, id), 0);
        wc = wait_wc(n.cq);
        ck_assert_uint_eq(wc.wr_id, id);
        if (wc.status != IBV_WC_SUCCESS)
            break;
        ck_assert_int_ne(mem_kind, MEM_ANON);   /* that copy is a system call */
        ck_assert_uint_lt(id, 2 + 1000);
        usleep(100);
    }
    ck_assert_int_eq(wc.status, IBV_WC_RETRY_EXC_ERR);
    node_close(&n);
    /* The killed peer could not remove its segment; the next device open
     * on this host would sweep it, this test does it now. */
    {
        char name[64];

        snprintf(name, sizeof(name), "/softverbs.%d", (int)pid);
        ck_assert_int_eq(shm_unlink(name), 0);
    }
    mem_sweep(pid);
}
END_TEST

/* An armed CQ rings its completion channel when a peer completes on it. */
START_TEST(completion_channel_wakes)
{
    MEM_KIND_OF_LOOP;
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
    MEM_KIND_OF_LOOP;
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

/* ---- rdma_cm ----
 *
 * The CM twins, as the fabric uses them: ids on an event channel, address
 * and route resolution, rdma_create_qp, connect / accept / reject /
 * disconnect. Cross-process tests fork a passive side (cm_passive_start)
 * that listens on 127.0.0.1 and reports over a socketpair; the others run
 * both ends in this process on one channel. Channels are non-blocking
 * unless a test says otherwise, so that a missing event fails within
 * CM_WAIT_MS instead of hanging. */

#define CM_WAIT_MS 5000
#define CM_RECV_OFF 32768       /* where each side's one receive lands */

/* One end: its channel and the verbs objects its QPs use. */
struct cm_side {
    struct rdma_event_channel *ch;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    uint8_t *buf;
};

/* An event, copied out and acknowledged. */
struct cm_got {
    enum rdma_cm_event_type type;
    int status;
    struct rdma_cm_id *id, *listen_id;
    struct rdma_conn_param conn;    /* private_data: NULL, see pdata */
    uint8_t pdata[256];
};

/* What the two ends tell each other in private data. */
struct cm_card {
    char tag[8];
    uint64_t addr;
    uint32_t rkey;
};

static uint64_t ms_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void cm_side_open(struct cm_side *s, bool nonblocking)
{
    struct ibv_context **devs;
    int n = 0;

    memset(s, 0, sizeof(*s));
    s->ch = sv_rdma_create_event_channel();
    ck_assert_ptr_nonnull(s->ch);
    if (nonblocking)
        ck_assert_int_eq(fcntl(s->ch->fd, F_SETFL, fcntl(s->ch->fd, F_GETFL) | O_NONBLOCK), 0);
    devs = sv_rdma_get_devices(&n);
    ck_assert_ptr_nonnull(devs);
    ck_assert_int_eq(n, 1);
    ck_assert_ptr_nonnull(devs[0]);
    ck_assert_ptr_null(devs[1]);
    s->ctx = devs[0];
    sv_rdma_free_devices(devs);
    s->pd = sv_alloc_pd(s->ctx);
    s->cq = sv_create_cq(s->ctx, 64, NULL, NULL, 0);
    s->buf = calloc(1, BUF);
    ck_assert(s->pd && s->cq && s->buf);
    s->mr = sv_reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                              IBV_ACCESS_REMOTE_READ);
    ck_assert_ptr_nonnull(s->mr);
}

/* The ids and their QPs are gone by now. */
static void cm_side_close(struct cm_side *s)
{
    ck_assert_int_eq(sv_dereg_mr(s->mr), 0);
    ck_assert_int_eq(sv_destroy_cq(s->cq), 0);
    ck_assert_int_eq(sv_dealloc_pd(s->pd), 0);
    sv_rdma_destroy_event_channel(s->ch);
    free(s->buf);
}

static void cm_qp(struct cm_side *s, struct rdma_cm_id *id)
{
    struct ibv_qp_init_attr a = {
        .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
    };

    ck_assert_int_eq(sv_rdma_create_qp(id, s->pd, &a), 0);
    ck_assert_ptr_nonnull(id->qp);
    ck_assert_int_eq(id->qp->state, IBV_QPS_INIT);
    ck_assert_ptr_eq(id->pd, s->pd);
    ck_assert_ptr_eq(id->send_cq, s->cq);
}

static void cm_post(struct rdma_cm_id *id, struct cm_side *s, enum ibv_wr_opcode op, size_t off,
                    uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad;

    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ck_assert_int_eq(ibv_post_send(id->qp, &wr, &bad), 0);
}

static void cm_post_recv(struct rdma_cm_id *id, struct cm_side *s, uint64_t wr_id)
{
    struct ibv_sge sge = {.addr = (uintptr_t)s->buf + CM_RECV_OFF, .length = 4096,
                          .lkey = s->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad;

    ck_assert_int_eq(ibv_post_recv(id->qp, &wr, &bad), 0);
}

/* The next event of `ch`, within CM_WAIT_MS (non-blocking channels). */
static struct cm_got cm_next(struct rdma_event_channel *ch)
{
    uint64_t end = ms_now() + CM_WAIT_MS;
    struct rdma_cm_event *ev;
    struct cm_got g;
    int flags = fcntl(ch->fd, F_GETFL);

    ck_assert_int_ge(flags, 0);
    while (sv_rdma_get_cm_event(ch, &ev) != 0) {
        struct pollfd p = {.fd = ch->fd, .events = POLLIN};

        ck_assert_msg(flags & O_NONBLOCK, "blocking get_cm_event failed: %s", strerror(errno));
        ck_assert_int_eq(errno, EAGAIN);
        ck_assert_msg(ms_now() < end, "no rdma_cm event");
        poll(&p, 1, 10);
    }
    memset(&g, 0, sizeof(g));
    g.type = ev->event;
    g.status = ev->status;
    g.id = ev->id;
    g.listen_id = ev->listen_id;
    g.conn = ev->param.conn;
    g.conn.private_data = NULL;
    if (ev->param.conn.private_data_len) {
        ck_assert_ptr_nonnull(ev->param.conn.private_data);
        memcpy(g.pdata, ev->param.conn.private_data, ev->param.conn.private_data_len);
    }
    ck_assert_int_eq(sv_rdma_ack_cm_event(ev), 0);
    return g;
}

static struct cm_got cm_expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
                               struct rdma_cm_id *id)
{
    struct cm_got g = cm_next(ch);

    ck_assert_msg(g.type == type, "event %d (status %d), expected %d", g.type, g.status, type);
    if (id)
        ck_assert_ptr_eq(g.id, id);
    return g;
}

/* No event comes within `ms`. */
static void cm_idle(struct rdma_event_channel *ch, int ms)
{
    int flags = fcntl(ch->fd, F_GETFL);
    uint64_t end = ms_now() + (uint64_t)ms;
    struct rdma_cm_event *ev;

    ck_assert_int_eq(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK), 0);
    do {
        struct pollfd p = {.fd = ch->fd, .events = POLLIN};
        int rc = sv_rdma_get_cm_event(ch, &ev);

        ck_assert_msg(rc == -1, "unexpected event %d", rc == 0 ? (int)ev->event : -1);
        ck_assert_int_eq(errno, EAGAIN);
        poll(&p, 1, 10);
    } while (ms_now() < end);
    ck_assert_int_eq(fcntl(ch->fd, F_SETFL, flags), 0);
}

static struct sockaddr_in cm_addr4(in_port_t port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = port,
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

    return sin;
}

/* An id resolved to `dst`, with a QP and one receive posted. */
static struct rdma_cm_id *cm_prepare(struct cm_side *s, const struct sockaddr *dst)
{
    struct rdma_cm_id *id;
    struct cm_got g;

    ck_assert_int_eq(sv_rdma_create_id(s->ch, &id, s, RDMA_PS_TCP), 0);
    ck_assert_ptr_eq(id->channel, s->ch);
    ck_assert_ptr_eq(id->context, s);
    ck_assert_int_eq(sv_rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, 2000), 0);
    g = cm_expect(s->ch, RDMA_CM_EVENT_ADDR_RESOLVED, id);
    ck_assert_int_eq(g.status, 0);
    ck_assert_ptr_eq(id->verbs, s->ctx);
    ck_assert_int_eq(id->port_num, 1);
    ck_assert_int_eq(sv_rdma_resolve_route(id, 2000), 0);
    g = cm_expect(s->ch, RDMA_CM_EVENT_ROUTE_RESOLVED, id);
    ck_assert_int_eq(g.status, 0);
    cm_qp(s, id);
    cm_post_recv(id, s, 200);
    return id;
}

static struct rdma_cm_id *cm_connect_to(struct cm_side *s, const struct sockaddr *dst,
                                        const void *pdata, uint8_t len)
{
    struct rdma_cm_id *id = cm_prepare(s, dst);
    struct rdma_conn_param p = {.private_data = pdata, .private_data_len = len,
                                .responder_resources = 1, .initiator_depth = 1,
                                .retry_count = 7, .rnr_retry_count = 7};

    ck_assert_int_eq(sv_rdma_connect(id, &p), 0);
    return id;
}

/* A listener on `addr` (port 0: any); its port, in network order. */
static struct rdma_cm_id *cm_listener(struct cm_side *s, struct sockaddr *addr, in_port_t *port)
{
    struct rdma_cm_id *l;

    ck_assert_int_eq(sv_rdma_create_id(s->ch, &l, s, RDMA_PS_TCP), 0);
    ck_assert_int_eq(sv_rdma_bind_addr(l, addr), 0);
    ck_assert_ptr_eq(l->verbs, s->ctx);
    *port = addr->sa_family == AF_INET6 ? l->route.addr.src_sin6.sin6_port
                                        : l->route.addr.src_sin.sin_port;
    ck_assert_uint_ne(*port, 0);
    ck_assert_int_eq(sv_rdma_listen(l, 8), 0);
    return l;
}

static void cm_destroy(struct rdma_cm_id *id)
{
    sv_rdma_destroy_qp(id);
    ck_assert_ptr_null(id->qp);
    ck_assert_int_eq(sv_rdma_destroy_id(id), 0);
}

/* The two completions a QP in error gives: its receive, flushed, then a
 * send posted now, flushed too. */
static void cm_check_flushed(struct rdma_cm_id *id, struct cm_side *s)
{
    struct ibv_wc wc;

    ck_assert_int_eq(id->qp->state, IBV_QPS_ERR);
    wc = wait_wc(s->cq);
    ck_assert_int_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_uint_eq(wc.wr_id, 200);
    cm_post(id, s, IBV_WR_SEND, 0, 8, 0, 0, 7);
    wc = wait_wc(s->cq);
    ck_assert_int_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_uint_eq(wc.wr_id, 7);
}

/* The passive side, forked: listen on 127.0.0.1, send the port over the
 * socketpair, take one connection request and act by `mode`:
 *   'r'  reject it with private data "not now";
 *   'a'  accept (blocking channel); take an RDMA WRITE and a SEND "ping",
 *        answer with a SEND "pong", then disconnect;
 *   'w'  accept, report 'E' once established, wait to be disconnected,
 *        check the QP is flushed, report 'D';
 *   'k'  accept, report 'E' once established, wait to be killed;
 *   'A'  report 'R' on the request, accept when told to, report 'A' at
 *        once, wait to be killed.
 * It exits 0 when all went as expected. */
static void cm_passive(char mode, int fd)
{
    struct sockaddr_in sin = cm_addr4(0);
    struct cm_side s;
    struct rdma_cm_id *l, *id;
    struct cm_card mine = {.tag = "REP"}, theirs;
    struct rdma_conn_param p = {.private_data = &mine, .private_data_len = sizeof(mine),
                                .responder_resources = 1, .initiator_depth = 1,
                                .rnr_retry_count = 7};
    struct ibv_wc wc;
    struct cm_got g;
    in_port_t port;

    cm_side_open(&s, mode != 'a');
    l = cm_listener(&s, (struct sockaddr *)&sin, &port);
    xfer(fd, &port, sizeof(port), true);
    g = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
    ck_assert_ptr_eq(g.listen_id, l);
    ck_assert_ptr_ne(g.id, l);
    id = g.id;
    ck_assert_ptr_eq(id->context, &s);
    ck_assert_ptr_eq(id->verbs, s.ctx);
    ck_assert_ptr_eq(id->channel, s.ch);
    ck_assert_uint_eq(ntohl(id->route.addr.dst_sin.sin_addr.s_addr), INADDR_LOOPBACK);
    ck_assert_uint_eq(id->route.addr.src_sin.sin_port, port);
    ck_assert_uint_eq(g.conn.private_data_len, sizeof(theirs));
    memcpy(&theirs, g.pdata, sizeof(theirs));
    ck_assert_str_eq(theirs.tag, "REQ");
    ck_assert_uint_eq(g.conn.initiator_depth, 1);
    ck_assert_uint_eq(g.conn.responder_resources, 1);
    ck_assert_uint_eq(g.conn.rnr_retry_count, 7);
    if (mode == 'r') {
        ck_assert_int_eq(sv_rdma_reject(id, "not now", 7), 0);
        ck_assert_int_eq(sv_rdma_destroy_id(id), 0);
        ck_assert_int_eq(sv_rdma_destroy_id(l), 0);
        cm_side_close(&s);
        return;
    }
    if (mode == 'A') {
        char go;

        xfer(fd, "R", 1, true);
        xfer(fd, &go, 1, false);
    }
    cm_qp(&s, id);
    cm_post_recv(id, &s, 200);
    mine.addr = (uintptr_t)s.buf;
    mine.rkey = s.mr->rkey;
    ck_assert_int_eq(sv_rdma_accept(id, &p), 0);
    ck_assert_int_eq(id->qp->state, IBV_QPS_RTS);
    if (mode == 'A') {
        xfer(fd, "A", 1, true);
        for (;;)
            pause();
    }
    g = cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, id);
    ck_assert_int_eq(g.status, 0);
    ck_assert_uint_eq(g.conn.private_data_len, 0);
    if (mode == 'a') {
        wc = wait_wc(s.cq);
        ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
        ck_assert_int_eq(wc.opcode, IBV_WC_RECV);
        ck_assert_uint_eq(wc.byte_len, 5);
        ck_assert_str_eq((char *)s.buf + CM_RECV_OFF, "ping");
        for (size_t i = 0; i < 4096; i++)       /* the WRITE came before the SEND */
            ck_assert_uint_eq(s.buf[8192 + i], (uint8_t)(i * 7));
        strcpy((char *)s.buf, "pong");
        cm_post(id, &s, IBV_WR_SEND, 0, 5, 0, 0, 1);
        wc = wait_wc(s.cq);
        ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
        ck_assert_int_eq(sv_rdma_disconnect(id), 0);
        cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, id);
        ck_assert_int_eq(id->qp->state, IBV_QPS_ERR);
        cm_idle(s.ch, 100);
    } else {
        xfer(fd, "E", 1, true);
        if (mode == 'k')
            for (;;)
                pause();
        g = cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, id);
        ck_assert_int_eq(g.status, 0);
        cm_idle(s.ch, 200);                     /* exactly once */
        cm_check_flushed(id, &s);
        ck_assert_int_eq(sv_rdma_disconnect(id), 0);    /* over already: no event */
        cm_idle(s.ch, 100);
        xfer(fd, "D", 1, true);
    }
    cm_destroy(id);
    ck_assert_int_eq(sv_rdma_destroy_id(l), 0);
    cm_side_close(&s);
}

static pid_t cm_passive_start(char mode, int *fd, in_port_t *port)
{
    int sv[2];
    pid_t pid;

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    fflush(NULL);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        alarm(30);      /* never outlive a hung test */
        cm_passive(mode, sv[1]);
        /* exit, not _exit: the device's segment is removed at exit. */
        exit(0);
    }
    close(sv[1]);
    *fd = sv[0];
    xfer(*fd, port, sizeof(*port), false);
    return pid;
}

static void cm_passive_wait(int fd, pid_t pid)
{
    int st;

    close(fd);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "passive side failed (status %#x)", st);
}

/* A process killed by a test leaves its segment; remove it as the next
 * device open would. */
static void cm_reap_killed(pid_t pid)
{
    char name[64];

    waitpid(pid, NULL, 0);
    snprintf(name, sizeof(name), "/softverbs.%d", (int)pid);
    shm_unlink(name);
}

/* Private data both ways, and QPs connected for real: an RDMA WRITE and
 * SENDs both ways go through once both sides are ESTABLISHED. The passive
 * side runs a blocking channel; its disconnect reaches this side. */
START_TEST(cm_connect_accept_and_data)
{
    int fd;
    in_port_t port;
    pid_t pid = cm_passive_start('a', &fd, &port);
    struct sockaddr_in dst = cm_addr4(port);
    struct cm_card mine = {.tag = "REQ"}, theirs;
    struct cm_side s;
    struct rdma_cm_id *id;
    struct ibv_wc wc;
    struct cm_got g;

    cm_side_open(&s, true);
    mine.addr = (uintptr_t)s.buf;
    mine.rkey = s.mr->rkey;
    id = cm_connect_to(&s, (struct sockaddr *)&dst, &mine, sizeof(mine));
    g = cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, id);
    ck_assert_int_eq(g.status, 0);
    ck_assert_uint_eq(g.conn.private_data_len, sizeof(theirs));
    memcpy(&theirs, g.pdata, sizeof(theirs));
    ck_assert_str_eq(theirs.tag, "REP");
    ck_assert_int_eq(id->qp->state, IBV_QPS_RTS);
    ck_assert_uint_eq(ntohl(id->route.addr.src_sin.sin_addr.s_addr), INADDR_LOOPBACK);
    ck_assert_uint_ne(id->route.addr.src_sin.sin_port, 0);

    for (size_t i = 0; i < 4096; i++)
        s.buf[i] = (uint8_t)(i * 7);
    cm_post(id, &s, IBV_WR_RDMA_WRITE, 0, 4096, theirs.addr + 8192, theirs.rkey, 1);
    wc = wait_wc(s.cq);
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    strcpy((char *)s.buf + 4096, "ping");
    cm_post(id, &s, IBV_WR_SEND, 4096, 5, 0, 0, 2);
    wc = wait_wc(s.cq);
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    ck_assert_uint_eq(wc.wr_id, 2);
    wc = wait_wc(s.cq);
    ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
    ck_assert_int_eq(wc.opcode, IBV_WC_RECV);
    ck_assert_uint_eq(wc.wr_id, 200);
    ck_assert_str_eq((char *)s.buf + CM_RECV_OFF, "pong");

    g = cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, id);
    ck_assert_int_eq(g.status, 0);
    ck_assert_int_eq(id->qp->state, IBV_QPS_ERR);
    cm_idle(s.ch, 100);
    cm_destroy(id);
    cm_side_close(&s);
    cm_passive_wait(fd, pid);
}
END_TEST

/* No one listens: rejected as IB CM rejects an unknown service ID. */
START_TEST(cm_refused)
{
    struct sockaddr_in dst = cm_addr4(0);
    socklen_t sl = sizeof(dst);
    int t = socket(AF_INET, SOCK_STREAM, 0);
    struct rdma_cm_id *id;
    struct cm_side s;
    struct cm_got g;

    /* A port that was free a moment ago, and nothing listens on. */
    ck_assert_int_eq(bind(t, (struct sockaddr *)&dst, sizeof(dst)), 0);
    ck_assert_int_eq(getsockname(t, (struct sockaddr *)&dst, &sl), 0);
    close(t);
    cm_side_open(&s, true);
    id = cm_connect_to(&s, (struct sockaddr *)&dst, NULL, 0);
    g = cm_expect(s.ch, RDMA_CM_EVENT_REJECTED, id);
    ck_assert_int_eq(g.status, 8);
    ck_assert_uint_eq(g.conn.private_data_len, 0);
    cm_idle(s.ch, 50);
    ck_assert_int_eq(sv_rdma_disconnect(id), 0);    /* nothing to end: no event */
    cm_idle(s.ch, 50);
    cm_destroy(id);
    cm_side_close(&s);
}
END_TEST

/* rdma_reject's private data reaches the connector, status consumer
 * defined (28). */
START_TEST(cm_reject_with_private_data)
{
    int fd;
    in_port_t port;
    pid_t pid = cm_passive_start('r', &fd, &port);
    struct sockaddr_in dst = cm_addr4(port);
    struct cm_card mine = {.tag = "REQ"};
    struct rdma_cm_id *id;
    struct cm_side s;
    struct cm_got g;

    cm_side_open(&s, true);
    id = cm_connect_to(&s, (struct sockaddr *)&dst, &mine, sizeof(mine));
    g = cm_expect(s.ch, RDMA_CM_EVENT_REJECTED, id);
    ck_assert_int_eq(g.status, 28);
    ck_assert_uint_eq(g.conn.private_data_len, 7);
    ck_assert_int_eq(memcmp(g.pdata, "not now", 7), 0);
    ck_assert_int_eq(id->qp->state, IBV_QPS_INIT);
    cm_idle(s.ch, 100);
    cm_destroy(id);
    cm_side_close(&s);
    cm_passive_wait(fd, pid);
}
END_TEST

/* rdma_disconnect: DISCONNECTED once on each side, both QPs in error (what
 * was posted flushes, and so does what is posted after). */
START_TEST(cm_disconnect_reaches_peer)
{
    int fd;
    in_port_t port;
    pid_t pid = cm_passive_start('w', &fd, &port);
    struct sockaddr_in dst = cm_addr4(port);
    struct cm_card mine = {.tag = "REQ"};
    struct rdma_cm_id *id;
    struct cm_side s;
    struct cm_got g;
    char c;

    cm_side_open(&s, true);
    id = cm_connect_to(&s, (struct sockaddr *)&dst, &mine, sizeof(mine));
    cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, id);
    xfer(fd, &c, 1, false);
    ck_assert_int_eq(c, 'E');
    ck_assert_int_eq(sv_rdma_disconnect(id), 0);
    g = cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, id);
    ck_assert_int_eq(g.status, 0);
    cm_check_flushed(id, &s);
    ck_assert_int_eq(sv_rdma_disconnect(id), 0);    /* twice: no second event */
    xfer(fd, &c, 1, false);
    ck_assert_int_eq(c, 'D');
    cm_idle(s.ch, 200);
    cm_destroy(id);
    cm_side_close(&s);
    cm_passive_wait(fd, pid);
}
END_TEST

/* A peer killed outright: its socket closes with it, which is
 * DISCONNECTED here, with the QP in error. */
START_TEST(cm_peer_death_is_disconnected)
{
    int fd;
    in_port_t port;
    pid_t pid = cm_passive_start('k', &fd, &port);
    struct sockaddr_in dst = cm_addr4(port);
    struct cm_card mine = {.tag = "REQ"};
    struct rdma_cm_id *id;
    struct cm_side s;
    char c;

    cm_side_open(&s, true);
    id = cm_connect_to(&s, (struct sockaddr *)&dst, &mine, sizeof(mine));
    cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, id);
    xfer(fd, &c, 1, false);
    ck_assert_int_eq(c, 'E');
    cm_idle(s.ch, 50);
    kill(pid, SIGKILL);
    cm_reap_killed(pid);
    close(fd);
    cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, id);
    cm_idle(s.ch, 100);
    cm_check_flushed(id, &s);
    cm_destroy(id);
    cm_side_close(&s);
}
END_TEST

/* The REP names a QP that is gone with its process (and its segment):
 * the connector cannot move its QP to RTR, which is CONNECT_ERROR. */
START_TEST(cm_unreachable_peer_qp_is_connect_error)
{
    int fd;
    in_port_t port;
    pid_t pid = cm_passive_start('A', &fd, &port);
    struct sockaddr_in dst = cm_addr4(port);
    struct cm_card mine = {.tag = "REQ"};
    struct rdma_cm_id *id;
    struct cm_side s;
    struct cm_got g;
    char c;

    cm_side_open(&s, true);
    id = cm_connect_to(&s, (struct sockaddr *)&dst, &mine, sizeof(mine));
    /* Run the channel until the REQ has reached the peer, and not after:
     * the REP must wait until the peer is gone. */
    for (uint64_t end = ms_now() + CM_WAIT_MS;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        struct rdma_cm_event *ev;

        ck_assert_int_eq(sv_rdma_get_cm_event(s.ch, &ev), -1);
        ck_assert_int_eq(errno, EAGAIN);
        if (poll(&pf, 1, 10) == 1)
            break;
        ck_assert_msg(ms_now() < end, "no request reached the peer");
    }
    xfer(fd, &c, 1, false);
    ck_assert_int_eq(c, 'R');
    xfer(fd, "g", 1, true);
    xfer(fd, &c, 1, false);
    ck_assert_int_eq(c, 'A');   /* the REP is on its way */
    kill(pid, SIGKILL);
    cm_reap_killed(pid);
    close(fd);
    g = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_ERROR, id);
    ck_assert_int_lt(g.status, 0);
    cm_idle(s.ch, 100);
    cm_destroy(id);
    cm_side_close(&s);
}
END_TEST

/* Destroying an id without disconnecting ends the connection for the
 * peer: DISCONNECTED once established; before the accept, the accept
 * then fails with CONNECT_ERROR; and a listener destroyed with a
 * connection it never took leaves the connector a CONNECT_ERROR. */
START_TEST(cm_destroy_id_ends_connection)
{
    struct sockaddr_in sin = cm_addr4(0), dst;
    struct rdma_cm_id *l, *a, *p;
    struct cm_side s;
    struct cm_got g;
    in_port_t port;

    cm_side_open(&s, true);
    l = cm_listener(&s, (struct sockaddr *)&sin, &port);
    dst = cm_addr4(port);
    a = cm_connect_to(&s, (struct sockaddr *)&dst, "hi", 2);
    g = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
    ck_assert_ptr_eq(g.listen_id, l);
    ck_assert_uint_eq(g.conn.private_data_len, 2);
    ck_assert_int_eq(memcmp(g.pdata, "hi", 2), 0);
    p = g.id;
    cm_qp(&s, p);
    ck_assert_int_eq(sv_rdma_accept(p, NULL), 0);
    cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, a);
    cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, p);
    cm_destroy(a);
    cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, p);
    ck_assert_int_eq(p->qp->state, IBV_QPS_ERR);
    cm_idle(s.ch, 50);
    cm_destroy(p);

    /* The connector leaves while the request waits for an answer. */
    a = cm_connect_to(&s, (struct sockaddr *)&dst, NULL, 0);
    p = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL).id;
    cm_destroy(a);
    cm_idle(s.ch, 50);          /* nothing to report until the answer */
    cm_qp(&s, p);
    ck_assert_int_eq(sv_rdma_accept(p, NULL), 0);
    g = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_ERROR, p);
    ck_assert_int_eq(g.status, -ECONNRESET);
    cm_idle(s.ch, 50);
    cm_destroy(p);

    /* A listener destroyed with a connection it never took (its channel
     * never ran): the connector, its REQ sent, sees the connection end
     * before a REP. */
    {
        struct rdma_event_channel *lch = sv_rdma_create_event_channel();
        struct rdma_cm_id *l2;

        ck_assert_ptr_nonnull(lch);
        ck_assert_int_eq(sv_rdma_create_id(lch, &l2, NULL, RDMA_PS_TCP), 0);
        sin = cm_addr4(0);
        ck_assert_int_eq(sv_rdma_bind_addr(l2, (struct sockaddr *)&sin), 0);
        ck_assert_int_eq(sv_rdma_listen(l2, 8), 0);
        dst = cm_addr4(l2->route.addr.src_sin.sin_port);
        a = cm_connect_to(&s, (struct sockaddr *)&dst, NULL, 0);
        for (int i = 0; i < 5; i++) {     /* the connect completes, the REQ goes */
            struct rdma_cm_event *ev;

            ck_assert_int_eq(sv_rdma_get_cm_event(s.ch, &ev), -1);
            ck_assert_int_eq(errno, EAGAIN);
            usleep(10000);
        }
        ck_assert_int_eq(sv_rdma_destroy_id(l2), 0);
        g = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_ERROR, a);
        ck_assert_int_eq(g.status, -ECONNRESET);
        sv_rdma_destroy_event_channel(lch);
    }
    cm_idle(s.ch, 50);
    cm_destroy(a);
    ck_assert_int_eq(sv_rdma_destroy_id(l), 0);
    cm_side_close(&s);
}
END_TEST

/* The channel fd is what a caller polls: with O_NONBLOCK set,
 * get_cm_event says EAGAIN when idle, and the fd polls readable exactly
 * while there is something to do. Connections that do not speak the
 * protocol are hung up on without an event, and so are those a destroyed
 * listener had taken. */
START_TEST(cm_channel_fd_nonblocking)
{
    struct rdma_event_channel *ch = sv_rdma_create_event_channel();
    struct pollfd pf;
    struct rdma_cm_event *ev;
    struct rdma_cm_id *id, *l;
    struct sockaddr_in sin = cm_addr4(0), dst = cm_addr4(htons(9));
    char junk[512], c;

    ck_assert_ptr_nonnull(ch);
    pf = (struct pollfd){.fd = ch->fd, .events = POLLIN};
    ck_assert_int_eq(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
    ck_assert_int_eq(sv_rdma_get_cm_event(ch, &ev), -1);
    ck_assert_int_eq(errno, EAGAIN);
    ck_assert_int_eq(poll(&pf, 1, 0), 0);

    /* A queued event makes it readable; taking it makes it quiet again. */
    ck_assert_int_eq(sv_rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), 0);
    ck_assert_int_eq(sv_rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 100), 0);
    ck_assert_int_eq(poll(&pf, 1, 0), 1);
    ck_assert(pf.revents & POLLIN);
    ck_assert_int_eq(sv_rdma_get_cm_event(ch, &ev), 0);
    ck_assert_int_eq(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
    ck_assert_ptr_eq(ev->id, id);
    ck_assert_int_eq(poll(&pf, 1, 0), 0);
    ck_assert_int_eq(sv_rdma_ack_cm_event(ev), 0);
    ck_assert_int_eq(sv_rdma_get_cm_event(ch, &ev), -1);
    ck_assert_int_eq(errno, EAGAIN);

    /* Destroying an id drops its queued events. */
    ck_assert_int_eq(sv_rdma_resolve_route(id, 100), 0);
    ck_assert_int_eq(poll(&pf, 1, 0), 1);
    ck_assert_int_eq(sv_rdma_destroy_id(id), 0);
    ck_assert_int_eq(poll(&pf, 1, 0), 0);
    ck_assert_int_eq(sv_rdma_get_cm_event(ch, &ev), -1);
    ck_assert_int_eq(errno, EAGAIN);

    /* Socket activity wakes the fd; garbage and a truncated message are
     * hung up on, with no event. */
    ck_assert_int_eq(sv_rdma_create_id(ch, &l, NULL, RDMA_PS_TCP), 0);
    ck_assert_int_eq(sv_rdma_bind_addr(l, (struct sockaddr *)&sin), 0);
    ck_assert_int_eq(sv_rdma_listen(l, 8), 0);
    dst = cm_addr4(l->route.addr.src_sin.sin_port);
    memset(junk, 'x', sizeof(junk));
    for (int round = 0; round < 3; round++) {
        int t = socket(AF_INET, SOCK_STREAM, 0);
        struct pollfd tp = {.fd = t, .events = POLLIN};

        ck_assert_int_eq(connect(t, (struct sockaddr *)&dst, sizeof(dst)), 0);
        ck_assert_int_eq(poll(&pf, 1, CM_WAIT_MS), 1);
        ck_assert_int_eq(sv_rdma_get_cm_event(ch, &ev), -1);      /* accepted */
        ck_assert_int_eq(errno, EAGAIN);
        if (round == 2) {
            /* Silent: destroying the listener hangs up on it too. */
            ck_assert_int_eq(sv_rdma_destroy_id(l), 0);
            ck_assert_int_eq(poll(&tp, 1, CM_WAIT_MS), 1);
            ck_assert_int_le(read(t, &c, 1), 0);
            close(t);
            break;
        } else if (round == 0) {
            ck_assert_int_eq(write(t, junk, sizeof(junk)), (ssize_t)sizeof(junk));
        } else {
            ck_assert_int_eq(write(t, junk, 10), 10);
            shutdown(t, SHUT_WR);
        }
        for (uint64_t end = ms_now() + CM_WAIT_MS; poll(&tp, 1, 0) == 0;) {
            ck_assert_msg(ms_now() < end, "not hung up on");
            poll(&pf, 1, 10);
            ck_assert_int_eq(sv_rdma_get_cm_event(ch, &ev), -1);
            ck_assert_int_eq(errno, EAGAIN);
        }
        ck_assert_int_le(read(t, &c, 1), 0);                       /* hung up on */
        close(t);
        ck_assert_int_eq(poll(&pf, 1, 0), 0);
    }
    ck_assert_int_eq(poll(&pf, 1, 0), 0);
    sv_rdma_destroy_event_channel(ch);
}
END_TEST

/* librdmacm's private data limits: 56 bytes with a connect (IB REQ less
 * the CMA header), 196 with an accept (REP), 148 with a reject (REJ); the
 * largest allowed arrive whole. */
START_TEST(cm_private_data_limits)
{
    struct sockaddr_in sin = cm_addr4(0), dst;
    struct rdma_cm_id *l, *a, *p;
    struct rdma_conn_param cp = {.retry_count = 7, .rnr_retry_count = 7};
    uint8_t big[256];
    struct cm_side s;
    struct cm_got g;
    in_port_t port;

    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (uint8_t)(i * 13 + 1);
    cm_side_open(&s, true);
    l = cm_listener(&s, (struct sockaddr *)&sin, &port);
    dst = cm_addr4(port);
    a = cm_prepare(&s, (struct sockaddr *)&dst);
    cp.private_data = big;
    cp.private_data_len = 57;
    ck_assert_int_eq(sv_rdma_connect(a, &cp), -1);
    ck_assert_int_eq(errno, EINVAL);
    cp.private_data_len = 56;
    ck_assert_int_eq(sv_rdma_connect(a, &cp), 0);
    g = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
    ck_assert_uint_eq(g.conn.private_data_len, 56);
    ck_assert_int_eq(memcmp(g.pdata, big, 56), 0);
    p = g.id;
    ck_assert_int_eq(sv_rdma_reject(p, big, 149), -1);
    ck_assert_int_eq(errno, EINVAL);
    ck_assert_int_eq(sv_rdma_accept(p, &cp), -1);           /* no QP yet */
    ck_assert_int_eq(errno, EINVAL);
    cm_qp(&s, p);
    cp.private_data = big + 1;
    cp.private_data_len = 197;
    ck_assert_int_eq(sv_rdma_accept(p, &cp), -1);
    ck_assert_int_eq(errno, EINVAL);
    ck_assert_int_eq(p->qp->state, IBV_QPS_INIT);
    cp.private_data_len = 196;
    ck_assert_int_eq(sv_rdma_accept(p, &cp), 0);
    g = cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, a);
    ck_assert_uint_eq(g.conn.private_data_len, 196);
    ck_assert_int_eq(memcmp(g.pdata, big + 1, 196), 0);
    cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, p);
    ck_assert_int_eq(sv_rdma_disconnect(a), 0);
    cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, a);
    cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, p);
    cm_idle(s.ch, 50);
    cm_destroy(a);
    cm_destroy(p);
    ck_assert_int_eq(sv_rdma_destroy_id(l), 0);
    cm_side_close(&s);
}
END_TEST

/* The same over IPv6 (skipped where ::1 is not there), with both ends in
 * one process: a SEND goes through. */
START_TEST(cm_ipv6_loopback)
{
    struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    struct sockaddr_in6 dst;
    struct rdma_cm_id *l, *a, *p;
    struct ibv_wc wc;
    struct cm_side s;
    struct cm_got g;
    in_port_t port;
    int t = socket(AF_INET6, SOCK_STREAM, 0);

    if (t < 0 || bind(t, (struct sockaddr *)&sin6, sizeof(sin6)) < 0) {
        if (t >= 0)
            close(t);
        return;     /* no IPv6 loopback here */
    }
    close(t);
    cm_side_open(&s, true);
    l = cm_listener(&s, (struct sockaddr *)&sin6, &port);
    dst = sin6;
    dst.sin6_port = port;
    a = cm_connect_to(&s, (struct sockaddr *)&dst, "v6", 2);
    g = cm_expect(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
    p = g.id;
    ck_assert_int_eq(p->route.addr.dst_addr.sa_family, AF_INET6);
    ck_assert_int_eq(p->route.addr.src_sin6.sin6_port, port);
    cm_qp(&s, p);
    cm_post_recv(p, &s, 300);
    ck_assert_int_eq(sv_rdma_accept(p, NULL), 0);
    cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, a);
    cm_expect(s.ch, RDMA_CM_EVENT_ESTABLISHED, p);
    ck_assert_int_eq(a->route.addr.src_addr.sa_family, AF_INET6);
    strcpy((char *)s.buf, "six");
    cm_post(a, &s, IBV_WR_SEND, 0, 4, 0, 0, 1);
    for (int i = 0; i < 2; i++) {      /* the send's completion and the receive's */
        wc = wait_wc(s.cq);
        ck_assert_int_eq(wc.status, IBV_WC_SUCCESS);
        if (wc.opcode == IBV_WC_RECV) {
            ck_assert_uint_eq(wc.wr_id, 300);
            ck_assert_uint_eq(wc.byte_len, 4);
        }
    }
    ck_assert_str_eq((char *)s.buf + CM_RECV_OFF, "six");
    ck_assert_int_eq(sv_rdma_disconnect(p), 0);
    cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, p);
    cm_expect(s.ch, RDMA_CM_EVENT_DISCONNECTED, a);
    cm_destroy(a);
    cm_destroy(p);
    ck_assert_int_eq(sv_rdma_destroy_id(l), 0);
    cm_side_close(&s);
}
END_TEST

/* ---- memory windows ---- */

/* Bind type 2 window `mw` on `qp` over [off, off+len) of `mr` with
 * `access`; the completion's status. */
static enum ibv_wc_status mw_bind(struct node *n, struct ibv_qp *qp, struct ibv_mw *mw,
                                  struct ibv_mr *mr, size_t off, size_t len, int access,
                                  uint32_t rkey)
{
    struct ibv_send_wr wr = {.wr_id = 77, .opcode = IBV_WR_BIND_MW,
                             .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad;
    struct ibv_wc wc;

    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = (struct ibv_mw_bind_info){
        .mr = mr, .addr = (uintptr_t)mr->addr + off, .length = len, .mw_access_flags = access};
    ck_assert_int_eq(ibv_post_send(qp, &wr, &bad), 0);
    wc = wait_wc(n->cq);
    ck_assert_uint_eq(wc.wr_id, 77);
    if (wc.status == IBV_WC_SUCCESS)
        ck_assert_int_eq(wc.opcode, IBV_WC_BIND_MW);
    return wc.status;
}

/* A QP in RTS that no peer answers: binding is the QP's own work. */
static struct ibv_qp *lonely_qp(struct node *n)
{
    struct ibv_qp *qp = qp_new(n);
    struct card self = card_of(n, qp);

    qp_connect(qp, &self, 7);
    return qp;
}

/* The peer of window_answers_only_its_qp: memory registered for windows
 * only (no remote rights of its own), four QPs, window 1 bound on the
 * first, window 2 on the last. It answers 'd' by checking that its region
 * cannot go while windows are bound, then freeing window 2. */
#define WQPS 4
static void window_owner(int fd)
{
    struct node n;
    struct ibv_qp *qp[WQPS];
    struct card mine[WQPS], theirs[WQPS];
    struct ibv_mw *mw[2];
    uint32_t rkey[2];
    char cmd, ok;

    node_open(&n, false, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    for (int i = 0; i < WQPS; i++) {
        qp[i] = qp_new(&n);
        mine[i] = card_of(&n, qp[i]);
    }
    xfer(fd, mine, sizeof(mine), true);
    xfer(fd, theirs, sizeof(theirs), false);
    for (int i = 0; i < WQPS; i++)
        qp_connect(qp[i], &theirs[i], 7);
    for (int i = 0; i < 2; i++) {
        mw[i] = ibv_alloc_mw(n.pd, IBV_MW_TYPE_2);
        ck_assert_ptr_nonnull(mw[i]);
        rkey[i] = ibv_inc_rkey(mw[i]->rkey);
        ck_assert_int_eq(mw_bind(&n, qp[i ? WQPS - 1 : 0], mw[i], n.mr, 0, 4096,
                                 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, rkey[i]),
                         IBV_WC_SUCCESS);
    }
    xfer(fd, rkey, sizeof(rkey), true);
    xfer(fd, &cmd, 1, false);
    ok = n.buf[0] == 0x5a && sv_dereg_mr(n.mr) == EBUSY && ibv_dealloc_mw(mw[1]) == 0 &&
         sv_dereg_mr(n.mr) == EBUSY;    /* window 1 is still bound */
    xfer(fd, &ok, 1, true);
    xfer(fd, &cmd, 1, false);
    ck_assert_int_eq(ibv_dealloc_mw(mw[0]), 0);
    for (int i = 1; i < WQPS; i++)
        ck_assert_int_eq(sv_destroy_qp(qp[i]), 0);
    n.qp = qp[0];
    node_close(&n);
    _exit(0);
}

/* A window bound on one QP is reached through that QP only, within its
 * range; the region's own key reaches nothing (it has no remote rights),
 * and a freed window's key no longer works. */
START_TEST(window_answers_only_its_qp)
{
    MEM_KIND_OF_LOOP;
    int sv[2];
    pid_t pid;
    struct node n;
    struct ibv_qp *qp[WQPS];
    struct card peer[WQPS], mine[WQPS];
    uint32_t rkey[2];
    char cmd = 'd', ok = 0;

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        window_owner(sv[1]);
    }
    close(sv[1]);
    node_open(&n, false, IBV_ACCESS_LOCAL_WRITE);
    for (int i = 0; i < WQPS; i++) {
        qp[i] = qp_new(&n);
        mine[i] = card_of(&n, qp[i]);
    }
    xfer(sv[0], peer, sizeof(peer), false);
    xfer(sv[0], mine, sizeof(mine), true);
    for (int i = 0; i < WQPS; i++)
        qp_connect(qp[i], &peer[i], 7);
    xfer(sv[0], rkey, sizeof(rkey), false);

    memset(n.buf, 0x5a, 64);
    ck_assert_int_eq(post(qp[0], IBV_WR_RDMA_WRITE, &n, 0, 64, &peer[0], 0, rkey[0], 1), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
    ck_assert_int_eq(post(qp[0], IBV_WR_RDMA_READ, &n, 8192, 64, &peer[0], 0, rkey[0], 2), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
    ck_assert_int_eq(n.buf[8192], 0x5a);
    /* The same key through another connection of the same peers. */
    ck_assert_int_eq(post(qp[1], IBV_WR_RDMA_WRITE, &n, 0, 64, &peer[1], 0, rkey[0], 3), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_REM_ACCESS_ERR);
    /* The region's own key: it grants nothing remote. */
    ck_assert_int_eq(post(qp[2], IBV_WR_RDMA_READ, &n, 0, 64, &peer[2], 0, peer[2].rkey, 4), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_REM_ACCESS_ERR);
    /* Past the window, through its own QP. */
    ck_assert_int_eq(post(qp[0], IBV_WR_RDMA_WRITE, &n, 0, 64, &peer[0], 4096 - 32, rkey[0], 5),
                     0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_REM_ACCESS_ERR);
    /* Window 2 works through its QP until the owner frees it. */
    ck_assert_int_eq(post(qp[3], IBV_WR_RDMA_READ, &n, 0, 64, &peer[3], 0, rkey[1], 6), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_SUCCESS);
    xfer(sv[0], &cmd, 1, true);
    xfer(sv[0], &ok, 1, false);
    ck_assert_int_eq(ok, 1);
    ck_assert_int_eq(post(qp[3], IBV_WR_RDMA_READ, &n, 0, 64, &peer[3], 0, rkey[1], 7), 0);
    ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_REM_ACCESS_ERR);

    xfer(sv[0], &cmd, 1, true);
    close(sv[0]);
    waitpid(pid, NULL, 0);
    for (int i = 1; i < WQPS; i++)
        ck_assert_int_eq(sv_destroy_qp(qp[i]), 0);
    n.qp = qp[0];
    node_close(&n);
}
END_TEST

/* What a bind checks, each failure breaking its QP as on a NIC. */
START_TEST(window_bind_rules)
{
    MEM_KIND_OF_LOOP;
    struct node n;
    struct ibv_mr *plain;
    struct ibv_mw *mw;
    struct ibv_qp *qp;
    uint8_t *mem = calloc(1, 4096);
    const int rw = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_device_attr da;

    node_open(&n, false, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    ck_assert_int_eq(sv_query_device(n.ctx, &da), 0);
    ck_assert(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
    ck_assert_int_gt(da.max_mw, 0);
    errno = 0;
    ck_assert_ptr_null(ibv_alloc_mw(n.pd, IBV_MW_TYPE_1));
    ck_assert_int_eq(errno, EOPNOTSUPP);
    mw = ibv_alloc_mw(n.pd, IBV_MW_TYPE_2);
    ck_assert_ptr_nonnull(mw);
    plain = sv_reg_mr(n.pd, mem, 4096, IBV_ACCESS_LOCAL_WRITE);
    ck_assert_ptr_nonnull(plain);

    /* A region registered without IBV_ACCESS_MW_BIND. */
    qp = lonely_qp(&n);
    ck_assert_int_eq(mw_bind(&n, qp, mw, plain, 0, 4096, rw, ibv_inc_rkey(mw->rkey)),
                     IBV_WC_MW_BIND_ERR);
    ck_assert_int_eq(sv_destroy_qp(qp), 0);
    /* A key of another window's slot. */
    qp = lonely_qp(&n);
    ck_assert_int_eq(mw_bind(&n, qp, mw, n.mr, 0, 4096, rw, mw->rkey ^ 0x80000000u),
                     IBV_WC_MW_BIND_ERR);
    ck_assert_int_eq(sv_destroy_qp(qp), 0);
    /* A range past the region. */
    qp = lonely_qp(&n);
    ck_assert_int_eq(mw_bind(&n, qp, mw, n.mr, BUF - 64, 128, rw, ibv_inc_rkey(mw->rkey)),
                     IBV_WC_MW_BIND_ERR);
    ck_assert_int_eq(sv_destroy_qp(qp), 0);
    /* A good bind; then the region is busy, a second bind is refused, and
     * the window's key is no local key. */
    qp = lonely_qp(&n);
    ck_assert_int_eq(mw_bind(&n, qp, mw, n.mr, 0, 4096, rw, ibv_inc_rkey(mw->rkey)),
                     IBV_WC_SUCCESS);
    ck_assert_int_eq(sv_dereg_mr(n.mr), EBUSY);
    ck_assert_int_eq(mw_bind(&n, qp, mw, n.mr, 0, 4096, rw, ibv_inc_rkey(mw->rkey)),
                     IBV_WC_MW_BIND_ERR);
    ck_assert_int_eq(sv_destroy_qp(qp), 0);
    qp = lonely_qp(&n);
    {
        struct ibv_sge sge = {.addr = (uintptr_t)n.buf, .length = 64, .lkey = mw->rkey};
        struct ibv_send_wr wr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
        struct ibv_send_wr *bad;

        wr.wr.rdma.remote_addr = (uintptr_t)n.buf;
        wr.wr.rdma.rkey = mw->rkey;
        ck_assert_int_eq(ibv_post_send(qp, &wr, &bad), 0);
        ck_assert_int_eq(wait_wc(n.cq).status, IBV_WC_LOC_PROT_ERR);
    }
    ck_assert_int_eq(sv_destroy_qp(qp), 0);
    ck_assert_int_eq(ibv_dealloc_mw(mw), 0);
    ck_assert_int_eq(sv_dereg_mr(plain), 0);
    free(mem);
    node_close(&n);
}
END_TEST

Suite *suite_softverbs(void)
{
    Suite *s = suite_create("softverbs");
    TCase *tc = tcase_create("rc");

    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, write_and_read_need_no_peer_cpu, 0, MEM_KINDS);
    tcase_add_loop_test(tc, sends_consume_receives_in_order, 0, MEM_KINDS);
    tcase_add_loop_test(tc, bad_keys_and_ranges_fail_like_a_nic, 0, MEM_KINDS);
    tcase_add_loop_test(tc, bad_lkey_is_a_local_error, 0, MEM_KINDS);
    tcase_add_loop_test(tc, receiver_not_ready, 0, MEM_KINDS);
    tcase_add_loop_test(tc, receive_too_small, 0, MEM_KINDS);
    tcase_add_loop_test(tc, srq_serves_sends, 0, MEM_KINDS);
    tcase_add_loop_test(tc, dead_peer_is_retry_exceeded, 0, MEM_KINDS);
    tcase_add_loop_test(tc, completion_channel_wakes, 0, MEM_KINDS);
    tcase_add_loop_test(tc, post_before_rts_is_refused, 0, MEM_KINDS);
    tcase_add_loop_test(tc, window_answers_only_its_qp, 0, MEM_KINDS);
    tcase_add_loop_test(tc, window_bind_rules, 0, MEM_KINDS);
    tcase_add_test(tc, peer_regions_are_mapped_and_dropped);
    tcase_add_test(tc, a_replaced_backing_file_is_not_mapped);
    suite_add_tcase(s, tc);

    tc = tcase_create("cm");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, cm_connect_accept_and_data);
    tcase_add_test(tc, cm_refused);
    tcase_add_test(tc, cm_reject_with_private_data);
    tcase_add_test(tc, cm_disconnect_reaches_peer);
    tcase_add_test(tc, cm_peer_death_is_disconnected);
    tcase_add_test(tc, cm_unreachable_peer_qp_is_connect_error);
    tcase_add_test(tc, cm_destroy_id_ends_connection);
    tcase_add_test(tc, cm_channel_fd_nonblocking);
    tcase_add_test(tc, cm_private_data_limits);
    tcase_add_test(tc, cm_ipv6_loopback);
    suite_add_tcase(s, tc);
    return s;
}
