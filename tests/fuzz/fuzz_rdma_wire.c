/* The rdma fabric's wire (transport/rdma/, rdma_internal.h) as a server
 * endpoint meets it from a peer that posts what it likes: a raw client on
 * softverbs's rdma_cm and verbs, in this process, against an rdma endpoint
 * of this process.
 *
 * The input is a flags byte (bit 0: the connect request's private data is
 * the input's next 24 bytes instead of a sound hello), then operations the
 * raw client posts on its queue pair, one at a time: a WRITE_WITH_IMM of
 * any length and immediate anywhere in the server's ring (or a record laid
 * out as a sound sender would, at its place), a SEND_WITH_IMM carrying any
 * immediate (credit, or nonsense), a SEND with bytes (the server's
 * receives have none), an RDMA WRITE or READ at any offset and length of
 * the window the server bound for this connection, or with another key.
 * The server must survive all of it: a connection that broke the rules
 * closes, a view it hands out lies inside the ring and is no longer than
 * the largest message, and a tern client connected since the start keeps
 * being served. */
#include <endian.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdbool.h>
#include <time.h>

#include <softverbs.h>

#include "fuzz.h"
#include "log.h"
#include "rdma/rdma_internal.h"
#include "transport.h"

#define MAX_MSG 4096
#define RAW_BUF 65536
#define OPS_MAX 48
#define WAIT_NS 2000000000ull

static struct tern_tp_ep *srv, *cli;
static struct tern_tp_conn *cli_conn, *cli_peer;  /* the client's, and its server end */
static struct tern_tp_mr *region;
static char bound[128];
static unsigned seq;
static unsigned raw_views;              /* views the raw peer's records gave */

/* The raw client of one input. */
static struct raw {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    struct tern_tp_conn *peer;      /* its server end, once accepted */
    bool peer_closed;
    uint32_t ring_key;              /* the server ring's window */
    uint64_t ring_addr, ring_size;
    uint64_t tx;                    /* where a sound sender would write next */
    struct tern_tp_rkey win;        /* the region's window for this connection */
    uint8_t buf[RAW_BUF] __attribute__((aligned(64)));
} r;

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Serve the server endpoint once: views checked and released, the raw
 * peer's connection noted, the key of the region handed to each new
 * connection in its first message. */
static void serve(void)
{
    struct tern_tp_event ev[16];
    int n = tern_tp_poll(srv, ev, 16);

    FZ_CHECK(n >= 0, "server poll: %d", n);
    for (int i = 0; i < n; i++) {
        struct tern_tp_rkey rk;

        switch (ev[i].type) {
        case TERN_TP_EV_ACCEPTED:
            if (!cli_peer) {
                cli_peer = ev[i].conn;
                break;
            }
            r.peer = ev[i].conn;
            if (tern_tp_conn_mr_rkey(ev[i].conn, region, &rk) == 0)
                (void)tern_tp_msg_send(ev[i].conn, &rk, sizeof(rk));
            break;
        case TERN_TP_EV_RECV: {
            const struct rdma_conn *c = RCONN(ev[i].conn);
            const uint8_t *v = ev[i].data;

            FZ_CHECK(ev[i].len <= MAX_MSG, "a view of %zu bytes", ev[i].len);
            FZ_CHECK(v >= c->rx && v + ev[i].len <= c->rx + c->rx_size,
                     "a view outside the ring");
            raw_views += ev[i].conn == r.peer;
            tern_tp_msg_release(ev[i].conn, ev[i].data);
            break;
        }
        case TERN_TP_EV_CLOSED:
            FZ_CHECK(ev[i].conn != cli_peer, "the good client's connection closed: %d",
                     ev[i].status);
            if (ev[i].conn == r.peer)
                r.peer_closed = true;
            tern_tp_disconnect(ev[i].conn);
            if (ev[i].conn == r.peer)
                r.peer = NULL;
            break;
        default:
            break;
        }
    }
    tern_tp_flush(srv);
}

/* The good client: one message, and the server takes it. */
static void client_round(void)
{
    struct tern_tp_event ev;
    uint64_t t0 = now_ns();
    unsigned want = ++seq, got = 0;

    FZ_CHECK(tern_tp_msg_send(cli_conn, &want, sizeof(want)) == 0, "client send");
    tern_tp_flush(cli);
    while (!got) {
        struct tern_tp_event sev[16];
        int n;

        FZ_CHECK(now_ns() - t0 < WAIT_NS, "the server stopped serving the good client");
        while (tern_tp_poll(cli, &ev, 1) == 1)
            FZ_CHECK(ev.type != TERN_TP_EV_CLOSED, "the good client was closed");
        n = tern_tp_poll(srv, sev, 16);
        FZ_CHECK(n >= 0, "server poll");
        for (int i = 0; i < n; i++) {
            if (sev[i].type == TERN_TP_EV_RECV && sev[i].conn == cli_peer) {
                FZ_CHECK(sev[i].len == sizeof(want) && memcmp(sev[i].data, &want, 4) == 0,
                         "the good client's message changed");
                got = 1;
            }
            if (sev[i].type == TERN_TP_EV_RECV)
                tern_tp_msg_release(sev[i].conn, sev[i].data);
            if (sev[i].type == TERN_TP_EV_CLOSED) {
                FZ_CHECK(sev[i].conn != cli_peer, "the good client's connection closed");
                tern_tp_disconnect(sev[i].conn);
            }
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct tern_tp_config cfg = {.fabric = "rdma", .max_msg = MAX_MSG, .conn_buf = 4 * MAX_MSG};
    struct tern_tp_event ev;
    uint64_t t0;
    int rc;

    (void)argc;
    (void)argv;
    setenv("TERN_RDMA_PROVIDER", "softverbs", 1);
    tern_log_set_level(TERN_LOG_ERROR);
    rc = tern_tp_open(&cfg, &srv);
    FZ_CHECK(rc == 0, "open: %d", rc);
    rc = tern_tp_listen(srv, "127.0.0.1:0", bound, sizeof(bound));
    FZ_CHECK(rc == 0, "listen: %d", rc);
    rc = tern_tp_mr_alloc(srv, 8192, TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE,
                          &region);
    FZ_CHECK(rc == 0, "region: %d", rc);
    rc = tern_tp_open(&cfg, &cli);
    FZ_CHECK(rc == 0, "open the client: %d", rc);
    FZ_CHECK(tern_tp_connect(cli, bound, &cli_conn) == 0, "connect");
    for (t0 = now_ns(); !cli_peer || tern_tp_poll(cli, &ev, 1) != 1;) {
        FZ_CHECK(now_ns() - t0 < 5 * WAIT_NS, "the good client never got in");
        serve();
    }
    FZ_CHECK(ev.type == TERN_TP_EV_CONNECTED && ev.status == 0, "client: event %d", ev.type);
    return 0;
}

/* ---- the raw client ---- */

static void raw_free(void)
{
    if (r.id) {
        if (r.id->qp)
            sv_rdma_destroy_qp(r.id);
        sv_rdma_destroy_id(r.id);
    }
    if (r.mr)
        sv_dereg_mr(r.mr);
    if (r.cq)
        sv_destroy_cq(r.cq);
    if (r.pd)
        sv_dealloc_pd(r.pd);
    if (r.ch)
        sv_rdma_destroy_event_channel(r.ch);
    r.id = NULL;
    r.mr = NULL;
    r.cq = NULL;
    r.pd = NULL;
    r.ch = NULL;
}

/* Connect with `h` as private data; a sound one gets our ring's key once
 * the ring is registered. True once ESTABLISHED. */
static bool raw_connect(struct rdma_hello *h, bool sound)
{
    struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_recv_wr = 64,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    struct rdma_conn_param param = {.private_data = h, .private_data_len = sizeof(*h),
                                    .retry_count = 7, .rnr_retry_count = 7,
                                    .responder_resources = 1, .initiator_depth = 1};
    enum rdma_cm_event_type want = RDMA_CM_EVENT_ADDR_RESOLVED;
    struct addrinfo *ai;
    uint64_t t0 = now_ns();

    FZ_CHECK(getaddrinfo("127.0.0.1", strrchr(bound, ':') + 1, NULL, &ai) == 0, "addr");
    r.ch = sv_rdma_create_event_channel();
    FZ_CHECK(r.ch && fcntl(r.ch->fd, F_SETFL, O_NONBLOCK) == 0, "channel");
    FZ_CHECK(sv_rdma_create_id(r.ch, &r.id, NULL, RDMA_PS_TCP) == 0, "id");
    FZ_CHECK(sv_rdma_resolve_addr(r.id, NULL, ai->ai_addr, 1000) == 0, "resolve");
    freeaddrinfo(ai);
    for (;;) {
        struct rdma_cm_event *e;
        enum rdma_cm_event_type got;

        FZ_CHECK(now_ns() - t0 < WAIT_NS, "no answer to a connect request (event %d)", want);
        serve();
        if (sv_rdma_get_cm_event(r.ch, &e) != 0)
            continue;
        got = e->event;
        sv_rdma_ack_cm_event(e);
        if (got == RDMA_CM_EVENT_REJECTED)
            return false;
        if (got == RDMA_CM_EVENT_ESTABLISHED)
            return true;
        FZ_CHECK(got == want, "cm event %d, wanted %d", got, want);
        if (want == RDMA_CM_EVENT_ADDR_RESOLVED) {
            FZ_CHECK(sv_rdma_resolve_route(r.id, 1000) == 0, "route");
            want = RDMA_CM_EVENT_ROUTE_RESOLVED;
            continue;
        }
        r.pd = sv_alloc_pd(r.id->verbs);
        r.cq = sv_create_cq(r.id->verbs, 256, NULL, NULL, 0);
        r.mr = sv_reg_mr(r.pd, r.buf, sizeof(r.buf),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        FZ_CHECK(r.pd && r.cq && r.mr, "raw resources");
        qa.send_cq = qa.recv_cq = r.cq;
        FZ_CHECK(sv_rdma_create_qp(r.id, r.pd, &qa) == 0, "qp");
        for (int i = 0; i < 64; i++) {
            struct ibv_recv_wr rw = {.wr_id = (uint64_t)i}, *bad;

            FZ_CHECK(ibv_post_recv(r.id->qp, &rw, &bad) == 0, "recv");
        }
        if (sound)
            h->ring_rkey = htole32(r.mr->rkey);
        FZ_CHECK(sv_rdma_connect(r.id, &param) == 0, "connect");
        want = RDMA_CM_EVENT_ESTABLISHED;
    }
}

/* The next receive completion on the raw QP (the server's ring key, the
 * record with the region's key), serving the server meanwhile. */
static bool raw_recv(struct ibv_wc *wc)
{
    for (uint64_t t0 = now_ns(); now_ns() - t0 < WAIT_NS;) {
        serve();
        if (ibv_poll_cq(r.cq, 1, wc) == 1) {
            if (wc->status != IBV_WC_SUCCESS)
                return false;
            if (wc->opcode & IBV_WC_RECV)
                return true;
        }
    }
    return false;
}

/* Post one work request and wait for its completion; false if it failed
 * (the QP is then in error and nothing more goes). */
static bool raw_post(struct ibv_send_wr *wr)
{
    struct ibv_send_wr *bad;
    struct ibv_wc wc;

    wr->send_flags |= IBV_SEND_SIGNALED;
    if (ibv_post_send(r.id->qp, wr, &bad) != 0)
        return false;
    for (uint64_t t0 = now_ns(); now_ns() - t0 < WAIT_NS;) {
        serve();
        /* The server hung up: what is in flight would only wait out the
         * NIC's retries. */
        if (r.peer_closed)
            return false;
        if (ibv_poll_cq(r.cq, 1, &wc) != 1)
            continue;
        if (wc.opcode & IBV_WC_RECV) {
            if (wc.status != IBV_WC_SUCCESS)
                return false;
            continue;       /* the server wrote to us (credit): fine */
        }
        return wc.status == IBV_WC_SUCCESS;
    }
    /* A send the server never lets land (receiver not ready for ever):
     * the QP is stuck, which is the server's right. */
    return false;
}

static bool run_op(struct fz *f)
{
    uint8_t op = fz_u8(f) % 7;
    struct ibv_sge sge = {.addr = (uintptr_t)r.buf + 32768, .lkey = r.mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1};
    const uint8_t *bytes;
    size_t n;

    switch (op) {
    case 0: /* WRITE_WITH_IMM, any place, length and immediate */
    case 1: /* a record as a sound sender lays it, any payload */
    {
        uint32_t len = fz_u16(f) % (MAX_MSG + 200), imm = fz_u32(f);
        uint64_t off = op == 0 ? fz_u16(f) % r.ring_size : r.tx % r.ring_size;

        n = fz_take(f, len, &bytes);
        memset(r.buf + 32768, 0, len + 8);
        if (op == 1) {
            struct rdma_rec h = {.len = len, .kind = REC_MSG};

            if (r.ring_size - off < rec_size(len)) {    /* the lap's tail is skipped */
                r.tx += r.ring_size - off;
                off = 0;
            }
            memcpy(r.buf + 32768, &h, sizeof(h));
            memcpy(r.buf + 32768 + 8, bytes, n);
            len += RDMA_HDR;
            r.tx += rec_size(len - RDMA_HDR);
            imm = imm & IMM_LOW;    /* we consumed nothing: credit 0 */
        } else {
            memcpy(r.buf + 32768, bytes, n);
        }
        sge.length = len;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htobe32(imm);
        wr.wr.rdma.remote_addr = r.ring_addr + off;
        wr.wr.rdma.rkey = r.ring_key;
        return raw_post(&wr);
    }
    case 2: /* zero-length SEND_WITH_IMM: credit, or nonsense */
        wr.num_sge = 0;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.imm_data = fz_u32(f);
        return raw_post(&wr);
    case 3: /* a SEND with bytes into a receive that has none */
        sge.length = 1 + fz_u8(f) % 64;
        wr.opcode = IBV_WR_SEND;
        return raw_post(&wr);
    case 4: /* WRITE into the region's window, any range */
    case 5: /* READ from it */
    {
        uint32_t xor = fz_u8(f) & 1 ? fz_u32(f) : 0;

        sge.length = fz_u16(f) % 10000;
        wr.opcode = op == 4 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wr.wr.rdma.remote_addr = r.win.addr + fz_u16(f);
        wr.wr.rdma.rkey = r.win.key ^ xor;
        return raw_post(&wr);
    }
    default: /* the ring with the region's key, or the region with the ring's */
        sge.length = 64;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.wr.rdma.remote_addr = fz_u8(f) & 1 ? r.ring_addr : r.win.addr;
        wr.wr.rdma.rkey = wr.wr.rdma.remote_addr == r.ring_addr ? r.win.key : r.ring_key;
        return raw_post(&wr);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t flags = fz_u8(&f);
    struct rdma_hello h = {.magic = htole32(RDMA_HELLO_MAGIC),
                           .version = htole16(RDMA_HELLO_VERSION), .ring_log2 = 16,
                           .ring_addr = htole64((uintptr_t)r.buf), .max_msg = htole32(MAX_MSG)};
    struct ibv_wc wc;
    bool up;

    memset(&r, 0, offsetof(struct raw, buf));
    raw_views = 0;
    if (flags & 1) {
        const uint8_t *b;
        size_t n = fz_take(&f, sizeof(h), &b);

        memset(&h, 0, sizeof(h));
        memcpy(&h, b, n);
    }
    up = raw_connect(&h, !(flags & 1));
    if (up) {
        /* The server's hello says how its ring's key comes. */
        const struct rdma_conn *c;
        struct tern_tp_rkey rk;

        for (uint64_t t0 = now_ns(); !r.peer;) {
            FZ_CHECK(now_ns() - t0 < WAIT_NS, "established, never accepted");
            serve();
        }
        c = RCONN(r.peer);
        r.ring_addr = (uintptr_t)c->rx;
        r.ring_size = c->rx_size;
        r.ring_key = c->rx_mr->rkey;
        if (c->ring_win) {
            uint32_t want = c->ring_win->rkey;  /* c may go while we wait */

            up = raw_recv(&wc) && (wc.wc_flags & IBV_WC_WITH_IMM) && wc.opcode == IBV_WC_RECV;
            FZ_CHECK(!up || be32toh(wc.imm_data) == want,
                     "the ring key in band is not the ring's window");
            r.ring_key = up ? be32toh(wc.imm_data) : 0;
        }
        /* The region's key, in the server's first record (a sound hello
         * only: the input's may give a ring we cannot read). */
        if (up && !(flags & 1)) {
            FZ_CHECK(raw_recv(&wc) && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
                     wc.byte_len == RDMA_HDR + sizeof(rk), "no region key from the server");
            memcpy(&r.win, r.buf + RDMA_HDR, sizeof(r.win));
        }
        for (int i = 0; up && i < OPS_MAX && f.n; i++)
            up = run_op(&f);
    }
    if (getenv("FUZZ_RDMA_VERBOSE"))
        fprintf(stderr, "rdma_wire: hello %s, up %d, views %u, ops left %zu bytes\n",
                flags & 1 ? "from the input" : "sound", up, raw_views, f.n);
    raw_free();
    /* The server sees the raw peer go, and still serves the good client. */
    for (uint64_t t0 = now_ns(); r.peer && !r.peer_closed;) {
        FZ_CHECK(now_ns() - t0 < WAIT_NS, "the raw peer's connection never closed");
        serve();
    }
    client_round();
    return 0;
}
