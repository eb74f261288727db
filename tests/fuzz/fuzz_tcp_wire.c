/* The TCP fabric's framing (transport/tcp/tcp.c, tcp_wire.h) as a server
 * endpoint reads it from a peer that writes what it likes: a raw socket
 * sends frames built from the input to a tcp endpoint in this process.
 *
 * The input is a flags byte (one-sided operations the endpoint starts on
 * the connection first, so that ACK and GET_RESP frames have something to
 * complete; how many message views it holds before it releases them),
 * then frame records: MSG, PUT, GET_REQ, ACK and GET_RESP with a sound
 * header and the input's body (a PUT or GET_REQ may name the endpoint's
 * real region), a frame with any header, or raw bytes. A MSG that only the
 * harness sends ends the stream: once it arrives, every frame before it
 * was parsed. The endpoint must survive all of it, report the connection
 * closed once the peer resets it, and hand out no view outside its frame. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_raw.h"
#include "log.h"
#include "tcp/tcp_wire.h"
#include "transport.h"

#define MAX_MSG 4096
#define REGION 8192
#define STREAM_MAX (256u * 1024)
#define POLLS_MAX 200000
#define IDLE_MAX 256

static struct tern_tp_ep *ep;
static struct tern_tp_mr *mr, *local;
static struct sockaddr_in srv;
static uint32_t key;
static uint8_t stream[STREAM_MAX + 64];
static const uint8_t sentinel[16] = "tern-fuzz-end...";
static volatile uint8_t sink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct tern_tp_config cfg = {.fabric = "tcp", .max_msg = MAX_MSG, .conn_buf = 4 * MAX_MSG};
    char bound[64];
    const char *colon;
    int rc;

    tern_log_set_level(TERN_LOG_ERROR);
    rc = tern_tp_open(&cfg, &ep);
    FZ_CHECK(rc == 0, "open: %d", rc);
    rc = tern_tp_listen(ep, "127.0.0.1:0", bound, sizeof(bound));
    FZ_CHECK(rc == 0, "listen: %d", rc);
    rc = tern_tp_mr_alloc(ep, REGION,
                          TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE, &mr);
    FZ_CHECK(rc == 0, "region: %d", rc);
    rc = tern_tp_mr_alloc(ep, REGION, TERN_TP_ACCESS_LOCAL, &local);
    FZ_CHECK(rc == 0, "local region: %d", rc);
    key = tern_tp_mr_rkey(mr).key;
    colon = strrchr(bound, ':');
    srv = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    srv.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return 0;
}

struct out {
    uint8_t *p;
    size_t n;
};

static void emit(struct out *o, const void *b, size_t n)
{
    if (n > STREAM_MAX - o->n)
        n = STREAM_MAX - o->n;
    memcpy(o->p + o->n, b, n);
    o->n += n;
}

/* Body bytes from the input, zeros once it runs out. */
static void emit_input(struct out *o, struct fz *f, size_t n)
{
    const uint8_t *b;
    size_t got = fz_take(f, n, &b);
    static const uint8_t zeros[1024];

    emit(o, b, got);
    for (n -= got; n; n -= n < sizeof(zeros) ? n : sizeof(zeros))
        emit(o, zeros, n < sizeof(zeros) ? n : sizeof(zeros));
}

static void emit_hdr(struct out *o, uint8_t type, uint32_t len)
{
    struct tcp_hdr h = {.magic = htole16(TCP_MAGIC), .version = TCP_VERSION, .type = type,
                        .len = htole32(len)};

    emit(o, &h, sizeof(h));
}

static void emit_pad(struct out *o, size_t body)
{
    static const uint8_t zeros[TCP_ALIGN];

    emit(o, zeros, TCP_FRAME_LEN(body) - sizeof(struct tcp_hdr) - body);
}

static void build(struct fz *f, struct out *o)
{
    while (f->n && o->n < STREAM_MAX - 64) {
        uint8_t op = fz_u8(f);

        switch (op & 7) {
        case 0: {           /* raw bytes */
            emit_input(o, f, fz_u8(f) % 64);
            break;
        }
        case 1: {           /* MSG */
            uint32_t n = fz_u16(f) % (MAX_MSG + 16);

            emit_hdr(o, TCP_MSG, n);
            emit_input(o, f, n);
            emit_pad(o, n);
            break;
        }
        case 2:             /* PUT */
        case 3: {           /* GET_REQ */
            bool put = (op & 7) == 2;
            uint32_t dlen = put ? fz_u16(f) % 600 : 0;
            struct tcp_onesided q = {.key = op & 0x80 ? key : fz_u32(f),
                                     .len = op & 0x40 ? fz_u32(f)
                                                      : put ? dlen : fz_u16(f) % (REGION + 64),
                                     .off = op & 0x20 ? fz_u64(f) : fz_u16(f) % (REGION + 64)};
            uint32_t body = sizeof(q) + dlen;

            if (!put && (op & 0x10))
                body = fz_u8(f);        /* a GET_REQ of the wrong size */
            emit_hdr(o, put ? TCP_PUT : TCP_GET_REQ, body);
            emit(o, &q, body < sizeof(q) ? body : sizeof(q));
            if (body > sizeof(q))
                emit_input(o, f, body - sizeof(q));
            emit_pad(o, body);
            break;
        }
        case 4:             /* ACK */
        case 5: {           /* GET_RESP */
            bool ack = (op & 7) == 4;
            struct tcp_ack a = {.status = (int32_t)(op & 0x80 ? 0 : fz_u32(f))};
            uint32_t body = sizeof(a) + (ack ? 0 : fz_u16(f) % 600);

            if (op & 0x40)
                body = fz_u8(f);
            emit_hdr(o, ack ? TCP_ACK : TCP_GET_RESP, body);
            emit(o, &a, body < sizeof(a) ? body : sizeof(a));
            if (body > sizeof(a))
                emit_input(o, f, body - sizeof(a));
            emit_pad(o, body);
            break;
        }
        default: {          /* any header, a body of the input's length */
            struct tcp_hdr h = {.magic = fz_u16(f), .version = fz_u8(f), .type = fz_u8(f),
                                .len = fz_u32(f)};

            emit(o, &h, sizeof(h));
            emit_input(o, f, fz_u8(f));
            break;
        }
        }
    }
    emit_hdr(o, TCP_MSG, sizeof(sentinel));
    emit(o, sentinel, sizeof(sentinel));
}

/* Read whatever the endpoint sent; false once it closed. */
static bool drain(int fd)
{
    static uint8_t buf[65536];

    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

        if (n > 0)
            continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
}

struct state {
    struct tern_tp_conn *conn;
    bool closed, ended;
    const void *views[4];
    unsigned n_views, hold;
};

static void release_all(struct state *st)
{
    for (unsigned i = 0; i < st->n_views; i++)
        tern_tp_msg_release(st->conn, st->views[i]);
    st->n_views = 0;
}

/* One poll of the endpoint; true if it reported something. */
static bool step(struct state *st)
{
    struct tern_tp_event ev[8];
    int n = tern_tp_poll(ep, ev, 8);

    FZ_CHECK(n >= 0, "poll: %d", n);
    for (int i = 0; i < n; i++) {
        switch (ev[i].type) {
        case TERN_TP_EV_ACCEPTED:
            FZ_CHECK(!st->conn, "a second connection");
            st->conn = ev[i].conn;
            break;
        case TERN_TP_EV_RECV:
            FZ_CHECK(ev[i].conn == st->conn && ev[i].len <= MAX_MSG, "view of %zu bytes",
                     ev[i].len);
            if (ev[i].len == sizeof(sentinel) && memcmp(ev[i].data, sentinel, 16) == 0)
                st->ended = true;
            /* Every byte of a view is the peer's: read it all. */
            for (size_t j = 0; j < ev[i].len; j++)
                sink ^= ((const uint8_t *)ev[i].data)[j];
            st->views[st->n_views++] = ev[i].data;
            if (st->n_views > st->hold)
                release_all(st);
            break;
        case TERN_TP_EV_CLOSED:
            FZ_CHECK(ev[i].conn == st->conn, "CLOSED for another connection");
            st->closed = true;
            break;
        default:
            break;
        }
    }
    return n > 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t flags = fz_u8(&f);
    struct state st = {.hold = (flags >> 4) & 3};
    struct out o = {stream, 0};
    struct linger rst = {.l_onoff = 1, .l_linger = 0};
    size_t sent = 0;
    unsigned idle = 0;
    int fd = raw_connect(&srv);

    for (int i = 0; i < POLLS_MAX && !st.conn; i++)
        step(&st);
    FZ_CHECK(st.conn, "the endpoint never accepted");
    /* One-sided operations of its own for the peer's answers to complete. */
    for (unsigned i = 0; i < (flags & 3u); i++)
        tern_tp_put(st.conn, local, 0, 8u << i, &(struct tern_tp_rkey){.key = 1, .len = 64},
                    0, i);
    for (unsigned i = 0; i < ((flags >> 2) & 3u); i++)
        tern_tp_get(st.conn, local, 0, 8u << i, &(struct tern_tp_rkey){.key = 1, .len = 64},
                    0, 16 + i);
    tern_tp_flush(ep);
    build(&f, &o);
    for (int i = 0; i < POLLS_MAX && !st.ended && !st.closed && idle < IDLE_MAX; i++) {
        bool busy = false;

        if (sent < o.n) {
            ssize_t n = send(fd, o.p + sent, o.n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);

            if (n > 0) {
                sent += (size_t)n;
                busy = true;
            }
        }
        if (!drain(fd))
            busy = true;        /* it closed: the CLOSED event is next */
        busy |= step(&st);
        idle = busy ? 0 : idle + 1;
    }
    /* A reset: no TIME_WAIT left behind per run. */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &rst, sizeof(rst));
    close(fd);
    for (int i = 0; i < POLLS_MAX && !st.closed; i++) {
        release_all(&st);
        step(&st);
    }
    FZ_CHECK(st.closed, "the endpoint never reported the reset connection closed");
    release_all(&st);
    tern_tp_disconnect(st.conn);
    return 0;
}
