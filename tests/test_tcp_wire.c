/* The TCP fabric against a hostile peer.
 *
 * A raw POSIX socket speaks tcp_wire.h by hand to an endpoint that the test
 * polls itself. Every malformed frame must cost the sender its own connection
 * (CLOSED with TERN_EPROTO) and nothing else: a well-behaved connection,
 * opened with tern_tp_connect from a second endpoint, keeps working after
 * each case. One-sided requests with bad keys or sizes are answered with an
 * error status and leave the connection open, as the transport contract says,
 * up to a limit: a peer that keeps guessing keys loses its connection.
 *
 * The last tests run the attacked endpoint as an adaptive server (sleeping in
 * tern_tp_wait when idle) and measure its CPU: a peer must not be able to
 * keep it spinning.
 *
 * Everything runs in one thread, so a raw read never blocks: the helpers poll
 * the endpoints while they wait for bytes on the raw socket.
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "suites.h"
#include "tcp/tcp_wire.h"
#include "transport.h"

#define SRV_MAX_MSG 4096    /* small, so that "too long" is cheap to send */
#define WAIT_MS 5000

/* ---- event logs: every event of an endpoint, in arrival order ---- */

struct logged {
    struct tern_tp_event ev;
    uint8_t data[64];       /* RECV: the first bytes of the message */
    bool used;              /* handed out by wait_for() already */
};

#define LOG_CAP 8192

struct evlog {
    struct tern_tp_ep *ep;
    struct logged *ev;
    int n;
};

/* The endpoint under attack, and the endpoint of the well-behaved client. */
static struct evlog srv, cli;
static char srv_addr[64];
static int srv_port;
static struct tern_tp_conn *good_cli, *good_srv;   /* the two ends of the good connection */

/* Poll one endpoint once and log what it reports. RECV views are copied
 * (their first bytes) and released at once, so nothing pins the buffers. */
static void pump_one(struct evlog *l)
{
    struct tern_tp_event ev[32];
    int n;

    if (!l->ep)
        return;
    n = tern_tp_poll(l->ep, ev, 32);
    ck_assert_msg(n >= 0, "tern_tp_poll: %s", tern_strerror(n));
    for (int i = 0; i < n; i++) {
        struct logged *e;

        ck_assert_msg(l->n < LOG_CAP, "event log full");
        e = &l->ev[l->n++];
        *e = (struct logged){.ev = ev[i]};
        if (ev[i].type == TERN_TP_EV_RECV) {
            memcpy(e->data, ev[i].data, ev[i].len < sizeof(e->data) ? ev[i].len : sizeof(e->data));
            tern_tp_msg_release(ev[i].conn, ev[i].data);
            e->ev.data = NULL;  /* the view is gone */
        }
    }
}

static void pump(void)
{
    pump_one(&srv);
    pump_one(&cli);
}

/* The first unused event of `type` on `conn` (any connection if NULL),
 * polling both endpoints for up to `ms`. NULL on timeout. */
static struct logged *wait_for(struct evlog *l, enum tern_tp_event_type type,
                               struct tern_tp_conn *conn, int ms)
{
    double end = now_ms() + ms;

    do {
        for (int i = 0; i < l->n; i++) {
            struct logged *e = &l->ev[i];

            if (!e->used && e->ev.type == type && (!conn || e->ev.conn == conn)) {
                e->used = true;
                return e;
            }
        }
        pump();
    } while (now_ms() < end);
    return NULL;
}

/* Mark every event of a freed connection as used: a later connection may get
 * the same address, and must not inherit its events. */
static void forget(struct evlog *l, struct tern_tp_conn *conn)
{
    for (int i = 0; i < l->n; i++)
        if (l->ev[i].ev.conn == conn)
            l->ev[i].used = true;
}

/* True if `conn` was reported CLOSED at any time (used or not). */
static bool was_closed(const struct evlog *l, const struct tern_tp_conn *conn)
{
    for (int i = 0; i < l->n; i++)
        if (l->ev[i].ev.type == TERN_TP_EV_CLOSED && l->ev[i].ev.conn == conn)
            return true;
    return false;
}

/* ---- fixture: the attacked endpoint plus one good connection ---- */

static struct tern_tp_ep *open_ep(size_t max_msg, enum tern_tp_poll_mode mode)
{
    struct tern_tp_config cfg = {.fabric = "tcp", .max_msg = max_msg, .mode = mode};
    struct tern_tp_ep *ep = NULL;
    int rc = tern_tp_open(&cfg, &ep);

    ck_assert_msg(rc == 0, "tern_tp_open: %s", tern_strerror(rc));
    return ep;
}

static void setup_mode(enum tern_tp_poll_mode mode)
{
    struct logged *e;
    int rc;

    srv = (struct evlog){.ep = open_ep(SRV_MAX_MSG, mode),
                         .ev = calloc(LOG_CAP, sizeof(struct logged))};
    cli = (struct evlog){.ep = open_ep(SRV_MAX_MSG, TERN_TP_POLL_BUSY),
                         .ev = calloc(LOG_CAP, sizeof(struct logged))};
    ck_assert(srv.ev && cli.ev);
    rc = tern_tp_listen(srv.ep, "127.0.0.1:0", srv_addr, sizeof(srv_addr));
    ck_assert_msg(rc == 0, "listen: %s", tern_strerror(rc));
    srv_port = atoi(strrchr(srv_addr, ':') + 1);
    ck_assert_int_gt(srv_port, 0);

    rc = tern_tp_connect(cli.ep, srv_addr, &good_cli);
    ck_assert_msg(rc == 0, "connect: %s", tern_strerror(rc));
    e = wait_for(&cli, TERN_TP_EV_CONNECTED, good_cli, WAIT_MS);
    ck_assert_msg(e, "good client never connected");
    ck_assert_int_eq(e->ev.status, 0);
    e = wait_for(&srv, TERN_TP_EV_ACCEPTED, NULL, WAIT_MS);
    ck_assert_msg(e, "server never accepted the good client");
    good_srv = e->ev.conn;
}

static void setup(void)
{
    setup_mode(TERN_TP_POLL_BUSY);
}

/* The attacked endpoint as an adaptive server runs it: it sleeps in
 * tern_tp_wait() when idle (see sleep_serve below). */
static void setup_adaptive(void)
{
    setup_mode(TERN_TP_POLL_ADAPTIVE);
}

static void teardown(void)
{
    tern_tp_close(cli.ep);
    tern_tp_close(srv.ep);
    free(cli.ev);
    free(srv.ev);
    cli = srv = (struct evlog){0};
}

/* A message each way on the good connection: the endpoint still works and
 * the good connection was never closed. */
static void good_roundtrip(const char *tag)
{
    char msg[64];
    struct logged *e;
    int len = snprintf(msg, sizeof(msg), "good-%s", tag), rc;

    rc = tern_tp_msg_send(good_cli, msg, (size_t)len);
    ck_assert_msg(rc == 0, "good client send: %s", tern_strerror(rc));
    e = wait_for(&srv, TERN_TP_EV_RECV, good_srv, WAIT_MS);
    ck_assert_msg(e, "%s: the good connection no longer delivers to the server", tag);
    ck_assert_int_eq(e->ev.len, (size_t)len);
    ck_assert_mem_eq(e->data, msg, (size_t)len);

    msg[0] = 'G';
    rc = tern_tp_msg_send(good_srv, msg, (size_t)len);
    ck_assert_msg(rc == 0, "server send: %s", tern_strerror(rc));
    e = wait_for(&cli, TERN_TP_EV_RECV, good_cli, WAIT_MS);
    ck_assert_msg(e, "%s: the good connection no longer delivers to the client", tag);
    ck_assert_int_eq(e->ev.len, (size_t)len);
    ck_assert_mem_eq(e->data, msg, (size_t)len);

    ck_assert_msg(!was_closed(&srv, good_srv) && !was_closed(&cli, good_cli),
                  "%s: the good connection was closed", tag);
}

/* ---- raw sockets ---- */

/* Connect a plain socket to the endpoint; *conn is the server's side of it.
 * rcvbuf, if not 0, caps the socket's receive buffer (set before connecting,
 * so that the kernel does not grow it). */
static int raw_connect_rcvbuf(struct tern_tp_conn **conn, int rcvbuf)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)srv_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 5};
    struct logged *e;
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    ck_assert_int_ge(fd, 0);
    if (rcvbuf)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));   /* never hang a test */
    e = wait_for(&srv, TERN_TP_EV_ACCEPTED, NULL, WAIT_MS);
    ck_assert_msg(e, "server never accepted the raw socket");
    *conn = e->ev.conn;
    return fd;
}

static int raw_connect(struct tern_tp_conn **conn)
{
    return raw_connect_rcvbuf(conn, 0);
}

/* Write all of buf, polling the endpoints whenever the socket is full (the
 * endpoint only drains it when polled). False if the endpoint hung up first,
 * which garbage senders must expect. */
static bool raw_send_try(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    double end = now_ms() + WAIT_MS;

    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            ck_assert_msg(now_ms() < end, "raw send stuck");
            pump();
        } else if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            return false;
        } else {
            ck_abort_msg("raw send: %s", strerror(errno));
        }
    }
    return true;
}

static void raw_send(int fd, const void *buf, size_t len)
{
    ck_assert_msg(raw_send_try(fd, buf, len), "raw send: the endpoint hung up");
}

/* Read exactly len bytes, polling the endpoints while nothing is there. */
static void raw_recv(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    double end = now_ms() + WAIT_MS;

    while (len) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);

        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        ck_assert_msg(n != 0, "raw socket: the endpoint hung up");
        ck_assert_msg(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR,
                      "raw recv: %s", strerror(errno));
        ck_assert_msg(now_ms() < end, "raw socket: no answer from the endpoint");
        pump();
    }
}

/* Build [tcp_hdr][body][zero padding to TCP_ALIGN] with any header fields
 * the case wants; returns the bytes to send. */
static size_t frame(uint8_t *out, uint16_t magic, uint8_t version, uint8_t type,
                    uint32_t len_field, const void *body, size_t body_len)
{
    struct tcp_hdr h = {.magic = magic, .version = version, .type = type, .len = len_field};
    size_t total = TCP_FRAME_LEN(body_len);

    memcpy(out, &h, sizeof(h));
    if (body_len)
        memcpy(out + sizeof(h), body, body_len);
    memset(out + sizeof(h) + body_len, 0, total - sizeof(h) - body_len);
    return total;
}

/* A well-formed frame: the length field says the truth. */
static size_t good_frame(uint8_t *out, uint8_t type, const void *body, size_t body_len)
{
    return frame(out, TCP_MAGIC, TCP_VERSION, type, (uint32_t)body_len, body, body_len);
}

static size_t onesided_frame(uint8_t *out, uint8_t type, uint32_t key, uint32_t len,
                             uint64_t off, const void *data, size_t data_len)
{
    uint8_t body[sizeof(struct tcp_onesided) + 256];
    struct tcp_onesided os = {.key = key, .len = len, .off = off};

    ck_assert_uint_le(data_len, 256);
    memcpy(body, &os, sizeof(os));
    if (data_len)
        memcpy(body + sizeof(os), data, data_len);
    return good_frame(out, type, body, sizeof(os) + data_len);
}

/* Read one answer frame (ACK or GET_RESP) from the raw socket; returns its
 * status and copies any data after the ack into data (data_cap bytes max). */
static int raw_read_answer(int fd, uint8_t want_type, void *data, size_t data_cap,
                           size_t *data_len)
{
    struct tcp_hdr h;
    struct tcp_ack ack;
    size_t extra;

    raw_recv(fd, &h, sizeof(h));
    ck_assert_uint_eq(h.magic, TCP_MAGIC);
    ck_assert_uint_eq(h.version, TCP_VERSION);
    ck_assert_uint_eq(h.type, want_type);
    ck_assert_uint_ge(h.len, sizeof(ack));
    raw_recv(fd, &ack, sizeof(ack));
    extra = h.len - sizeof(ack);
    ck_assert_uint_le(extra, data_cap);
    if (extra)
        raw_recv(fd, data, extra);
    if (data_len)
        *data_len = extra;
    /* Frames are padded to TCP_ALIGN; the padding must be zero. */
    for (size_t pad = TCP_FRAME_LEN(h.len) - sizeof(h) - h.len; pad; pad--) {
        uint8_t z;

        raw_recv(fd, &z, 1);
        ck_assert_uint_eq(z, 0);
    }
    return ack.status;
}

/* The endpoint closed `conn` for a protocol error, and only it: CLOSED with
 * TERN_EPROTO, the raw socket sees the hang-up, and the good connection
 * still carries messages both ways. */
static void expect_eproto_close(struct tern_tp_conn *conn, int fd, const char *what)
{
    struct logged *e = wait_for(&srv, TERN_TP_EV_CLOSED, conn, WAIT_MS);
    uint8_t b;
    ssize_t n;

    ck_assert_msg(e, "%s: connection not closed", what);
    ck_assert_msg(e->ev.status == TERN_EPROTO, "%s: closed with %s, want TERN_EPROTO", what,
                  tern_err_name(e->ev.status));
    tern_tp_disconnect(conn);
    forget(&srv, conn);
    if (fd >= 0) {
        /* The endpoint let go of its socket: EOF (or a reset) on ours. */
        n = recv(fd, &b, 1, 0);
        ck_assert_msg(n == 0 || (n < 0 && errno == ECONNRESET),
                      "%s: raw socket still open after CLOSED (recv %zd, %s)", what, n,
                      n < 0 ? strerror(errno) : "data");
        close(fd);
    }
    good_roundtrip(what);
}

/* Send one bad frame on a fresh raw connection and check the outcome. */
static void bad_frame_case(const void *bytes, size_t len, const char *what)
{
    struct tern_tp_conn *conn;
    int fd = raw_connect(&conn);

    raw_send(fd, bytes, len);
    expect_eproto_close(conn, fd, what);
}

/* ---- malformed frames ---- */

START_TEST(bad_magic)
{
    uint8_t f[64];
    size_t n = frame(f, TCP_MAGIC ^ 0x0101, TCP_VERSION, TCP_MSG, 4, "abcd", 4);

    good_roundtrip("before");
    bad_frame_case(f, n, "bad magic");
}
END_TEST

START_TEST(bad_version)
{
    uint8_t f[64];
    size_t n = frame(f, TCP_MAGIC, TCP_VERSION + 1, TCP_MSG, 4, "abcd", 4);

    bad_frame_case(f, n, "bad version");
}
END_TEST

START_TEST(unknown_type)
{
    /* 0 and every value above the last known type. */
    static const uint8_t types[] = {0, TCP_GET_RESP + 1, 0x7f, 0xff};

    for (size_t i = 0; i < sizeof(types); i++) {
        uint8_t f[64];
        char what[32];
        size_t n = frame(f, TCP_MAGIC, TCP_VERSION, types[i], 4, "abcd", 4);

        snprintf(what, sizeof(what), "frame type %u", types[i]);
        bad_frame_case(f, n, what);
    }
}
END_TEST

START_TEST(msg_longer_than_max)
{
    /* The header alone must be enough to refuse: the endpoint cannot wait
     * for 4 GiB, nor for max_msg + 1 bytes. */
    static const uint32_t lens[] = {0xFFFFFFFFu, SRV_MAX_MSG + 1};

    for (size_t i = 0; i < 2; i++) {
        uint8_t f[64];
        char what[48];
        size_t n = frame(f, TCP_MAGIC, TCP_VERSION, TCP_MSG, lens[i], "abcd", 4);

        snprintf(what, sizeof(what), "MSG length %u", lens[i]);
        bad_frame_case(f, n, what);
    }
}
END_TEST

START_TEST(msg_exactly_max_is_fine)
{
    /* The boundary of the case above: max_msg itself is a legal message. */
    static uint8_t f[TCP_FRAME_LEN(SRV_MAX_MSG)];
    static uint8_t body[SRV_MAX_MSG];
    struct tern_tp_conn *conn;
    struct logged *e;
    int fd = raw_connect(&conn);

    for (size_t i = 0; i < sizeof(body); i++)
        body[i] = (uint8_t)(i * 13);
    raw_send(fd, f, good_frame(f, TCP_MSG, body, sizeof(body)));
    e = wait_for(&srv, TERN_TP_EV_RECV, conn, WAIT_MS);
    ck_assert_msg(e, "a max_msg message from a raw socket was not delivered");
    ck_assert_uint_eq(e->ev.len, SRV_MAX_MSG);
    ck_assert_mem_eq(e->data, body, sizeof(e->data));
    ck_assert(!was_closed(&srv, conn));
    close(fd);
}
END_TEST

START_TEST(truncated_frame_then_close)
{
    uint8_t f[128], body[100];
    struct tern_tp_conn *conn;
    int fd = raw_connect(&conn);

    memset(body, 'x', sizeof(body));
    good_frame(f, TCP_MSG, body, sizeof(body));
    raw_send(fd, f, sizeof(struct tcp_hdr) + 50);   /* half the body, then gone */
    close(fd);
    expect_eproto_close(conn, -1, "peer closed mid-frame");
}
END_TEST

START_TEST(missing_padding_then_close)
{
    /* The body is all there but the frame's padding is not: the frame is
     * still incomplete when the peer leaves. */
    uint8_t f[64];
    struct tern_tp_conn *conn;
    int fd = raw_connect(&conn);
    size_t n = good_frame(f, TCP_MSG, "abcd", 4);

    ck_assert_uint_gt(n, sizeof(struct tcp_hdr) + 4);
    raw_send(fd, f, sizeof(struct tcp_hdr) + 4);
    close(fd);
    ck_assert_msg(!wait_for(&srv, TERN_TP_EV_RECV, conn, 100),
                  "a frame without its padding was delivered");
    expect_eproto_close(conn, -1, "peer closed before the padding");
}
END_TEST

START_TEST(truncated_header_then_close)
{
    uint8_t f[64];
    struct tern_tp_conn *conn;
    int fd = raw_connect(&conn);

    good_frame(f, TCP_MSG, "abcd", 4);
    raw_send(fd, f, 5);             /* not even a whole header */
    close(fd);
    expect_eproto_close(conn, -1, "peer closed mid-header");
}
END_TEST

START_TEST(get_req_wrong_body_size)
{
    uint8_t body[sizeof(struct tcp_onesided) + 8] = {0};
    /* Shorter and longer than a tcp_onesided. */
    static const size_t sizes[] = {0, sizeof(struct tcp_onesided) - 1,
                                   sizeof(struct tcp_onesided) + 1,
                                   sizeof(struct tcp_onesided) + 8};

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint8_t f[64];
        char what[48];
        size_t n = good_frame(f, TCP_GET_REQ, body, sizes[i]);

        snprintf(what, sizeof(what), "GET_REQ with a %zu-byte body", sizes[i]);
        bad_frame_case(f, n, what);
    }
}
END_TEST

START_TEST(put_shorter_than_header)
{
    uint8_t body[sizeof(struct tcp_onesided)] = {0}, f[64];
    size_t n = good_frame(f, TCP_PUT, body, sizeof(body) - 1);

    bad_frame_case(f, n, "PUT body shorter than tcp_onesided");
}
END_TEST

START_TEST(unsolicited_ack)
{
    struct tcp_ack ack = {.status = 0};
    uint8_t f[64];
    size_t n = good_frame(f, TCP_ACK, &ack, sizeof(ack));

    bad_frame_case(f, n, "ACK with nothing pending");
}
END_TEST

START_TEST(unsolicited_get_resp)
{
    uint8_t body[sizeof(struct tcp_ack) + 8] = {0}, f[64];
    size_t n = good_frame(f, TCP_GET_RESP, body, sizeof(body));

    bad_frame_case(f, n, "GET_RESP with nothing pending");
}
END_TEST

START_TEST(bad_frame_after_good_ones)
{
    /* The endpoint must not lose the messages that came before the bad
     * frame in the same read, and must not deliver anything after it. */
    uint8_t buf[256];
    size_t n = 0;
    struct tern_tp_conn *conn;
    struct logged *e;
    int fd = raw_connect(&conn);

    n += good_frame(buf + n, TCP_MSG, "one", 3);
    n += good_frame(buf + n, TCP_MSG, "two", 3);
    n += frame(buf + n, TCP_MAGIC, TCP_VERSION, 0x42, 4, "bad!", 4);
    n += good_frame(buf + n, TCP_MSG, "never", 5);
    raw_send(fd, buf, n);

    e = wait_for(&srv, TERN_TP_EV_RECV, conn, WAIT_MS);
    ck_assert_msg(e, "first message lost");
    ck_assert_mem_eq(e->data, "one", 3);
    e = wait_for(&srv, TERN_TP_EV_RECV, conn, WAIT_MS);
    ck_assert_msg(e, "second message lost");
    ck_assert_mem_eq(e->data, "two", 3);
    e = wait_for(&srv, TERN_TP_EV_CLOSED, conn, WAIT_MS);
    ck_assert_msg(e && e->ev.status == TERN_EPROTO, "bad frame did not close with EPROTO");
    ck_assert_msg(!wait_for(&srv, TERN_TP_EV_RECV, conn, 0),
                  "a message after the bad frame was delivered");
    tern_tp_disconnect(conn);
    forget(&srv, conn);
    close(fd);
    good_roundtrip("after");
}
END_TEST

/* ---- one-sided requests from a raw peer ---- */

/* A region on the server endpoint for raw PUT/GET. */
static uint8_t region[2 * SRV_MAX_MSG];

static struct tern_tp_rkey reg_region(uint32_t access, struct tern_tp_mr **mr)
{
    int rc = tern_tp_mr_reg(srv.ep, region, sizeof(region), access, mr);

    ck_assert_msg(rc == 0, "mr_reg: %s", tern_strerror(rc));
    return tern_tp_mr_rkey(*mr);
}

START_TEST(put_wrong_key_gets_error_ack)
{
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_WRITE, &mr);
    /* Same slot, other nonce; a zero key; a key of an unused slot. */
    const uint32_t bad_keys[] = {rk.key ^ 0x55550000u, 0, rk.key ^ 1u};
    struct tern_tp_conn *conn;
    uint8_t f[128];
    struct logged *e;
    int fd = raw_connect(&conn);

    memset(region, 0, sizeof(region));
    for (size_t i = 0; i < 3; i++) {
        int st;

        raw_send(fd, f, onesided_frame(f, TCP_PUT, bad_keys[i], 8, 0, "XXXXXXXX", 8));
        st = raw_read_answer(fd, TCP_ACK, NULL, 0, NULL);
        ck_assert_msg(st == TERN_EREMACCESS, "key %#x: ACK status %s, want EREMACCESS",
                      bad_keys[i], tern_err_name(st));
    }
    for (size_t i = 0; i < 8; i++)
        ck_assert_msg(region[i] == 0, "a PUT with a bad key wrote the region");

    /* The connection stays open: a message still goes through. */
    raw_send(fd, f, good_frame(f, TCP_MSG, "still here", 10));
    e = wait_for(&srv, TERN_TP_EV_RECV, conn, WAIT_MS);
    ck_assert_msg(e, "raw connection unusable after an access error");
    ck_assert_mem_eq(e->data, "still here", 10);
    ck_assert(!was_closed(&srv, conn));
    close(fd);
    good_roundtrip("after bad key");
}
END_TEST

START_TEST(put_valid_key_writes_region)
{
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_WRITE, &mr);
    struct tern_tp_conn *conn;
    uint8_t f[128];
    int fd = raw_connect(&conn), st;

    memset(region, 0, sizeof(region));
    raw_send(fd, f, onesided_frame(f, TCP_PUT, rk.key, 5, 100, "hello", 5));
    st = raw_read_answer(fd, TCP_ACK, NULL, 0, NULL);
    ck_assert_msg(st == 0, "PUT with a valid key: %s", tern_err_name(st));
    ck_assert_mem_eq(region + 100, "hello", 5);
    ck_assert_uint_eq(region[99], 0);
    ck_assert_uint_eq(region[105], 0);

    /* The last byte of the region is in bounds; one past it is not. */
    raw_send(fd, f, onesided_frame(f, TCP_PUT, rk.key, 1, sizeof(region) - 1, "Z", 1));
    ck_assert_int_eq(raw_read_answer(fd, TCP_ACK, NULL, 0, NULL), 0);
    ck_assert_uint_eq(region[sizeof(region) - 1], 'Z');
    raw_send(fd, f, onesided_frame(f, TCP_PUT, rk.key, 2, sizeof(region) - 1, "QQ", 2));
    ck_assert_int_eq(raw_read_answer(fd, TCP_ACK, NULL, 0, NULL), TERN_EREMACCESS);
    ck_assert_uint_eq(region[sizeof(region) - 1], 'Z');
    /* An offset so large that off + len wraps around. */
    raw_send(fd, f, onesided_frame(f, TCP_PUT, rk.key, 4, UINT64_MAX - 1, "WRAP", 4));
    ck_assert_int_eq(raw_read_answer(fd, TCP_ACK, NULL, 0, NULL), TERN_EREMACCESS);
    ck_assert(!was_closed(&srv, conn));
    close(fd);
}
END_TEST

START_TEST(put_len_field_disagrees_with_body)
{
    /* tcp_onesided.len says 8 but only 4 data bytes follow. */
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_WRITE, &mr);
    struct tern_tp_conn *conn;
    uint8_t f[128];
    int fd = raw_connect(&conn), st;

    memset(region, 0, sizeof(region));
    raw_send(fd, f, onesided_frame(f, TCP_PUT, rk.key, 8, 0, "abcd", 4));
    st = raw_read_answer(fd, TCP_ACK, NULL, 0, NULL);
    ck_assert_msg(st == TERN_EREMACCESS, "inconsistent PUT answered %s", tern_err_name(st));
    ck_assert_uint_eq(region[0], 0);
    close(fd);
}
END_TEST

START_TEST(put_into_read_only_region)
{
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_READ, &mr);
    struct tern_tp_conn *conn;
    uint8_t f[128];
    int fd = raw_connect(&conn);

    memset(region, 0, sizeof(region));
    raw_send(fd, f, onesided_frame(f, TCP_PUT, rk.key, 4, 0, "nope", 4));
    ck_assert_int_eq(raw_read_answer(fd, TCP_ACK, NULL, 0, NULL), TERN_EREMACCESS);
    ck_assert_uint_eq(region[0], 0);
    close(fd);
}
END_TEST

START_TEST(get_req_valid_and_too_long)
{
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_READ, &mr);
    struct tern_tp_conn *conn;
    uint8_t f[128], got[64];
    size_t got_len;
    int fd = raw_connect(&conn), st;

    for (size_t i = 0; i < sizeof(region); i++)
        region[i] = (uint8_t)(i * 7 + 3);

    /* A good read first, so that the error below is not a blanket refusal. */
    raw_send(fd, f, onesided_frame(f, TCP_GET_REQ, rk.key, 32, 200, NULL, 0));
    st = raw_read_answer(fd, TCP_GET_RESP, got, sizeof(got), &got_len);
    ck_assert_msg(st == 0, "valid GET: %s", tern_err_name(st));
    ck_assert_uint_eq(got_len, 32);
    ck_assert_mem_eq(got, region + 200, 32);

    /* In bounds of the region (2 x max_msg) and with a valid key, but more
     * than one message: an error answer with no data, not a huge frame. */
    raw_send(fd, f, onesided_frame(f, TCP_GET_REQ, rk.key, SRV_MAX_MSG + 1, 0, NULL, 0));
    st = raw_read_answer(fd, TCP_GET_RESP, got, sizeof(got), &got_len);
    ck_assert_msg(st == TERN_EREMACCESS, "GET over max_msg answered %s", tern_err_name(st));
    ck_assert_uint_eq(got_len, 0);
    raw_send(fd, f, onesided_frame(f, TCP_GET_REQ, rk.key, 0xFFFFFFFFu, 0, NULL, 0));
    st = raw_read_answer(fd, TCP_GET_RESP, got, sizeof(got), &got_len);
    ck_assert_int_eq(st, TERN_EREMACCESS);
    ck_assert_uint_eq(got_len, 0);

    /* A bad key on GET, then the connection still serves a good GET. */
    raw_send(fd, f, onesided_frame(f, TCP_GET_REQ, rk.key ^ 0x12340000u, 8, 0, NULL, 0));
    ck_assert_int_eq(raw_read_answer(fd, TCP_GET_RESP, got, sizeof(got), &got_len),
                     TERN_EREMACCESS);
    raw_send(fd, f, onesided_frame(f, TCP_GET_REQ, rk.key, 8, 0, NULL, 0));
    ck_assert_int_eq(raw_read_answer(fd, TCP_GET_RESP, got, sizeof(got), &got_len), 0);
    ck_assert_uint_eq(got_len, 8);
    ck_assert_mem_eq(got, region, 8);
    ck_assert(!was_closed(&srv, conn));
    close(fd);
    good_roundtrip("after GET errors");
}
END_TEST

START_TEST(get_after_dereg)
{
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_READ, &mr);
    struct tern_tp_conn *conn;
    uint8_t f[128], got[16];
    size_t got_len;
    int fd = raw_connect(&conn);

    ck_assert_int_eq(tern_tp_mr_dereg(mr), 0);
    raw_send(fd, f, onesided_frame(f, TCP_GET_REQ, rk.key, 8, 0, NULL, 0));
    ck_assert_int_eq(raw_read_answer(fd, TCP_GET_RESP, got, sizeof(got), &got_len),
                     TERN_EREMACCESS);
    ck_assert_uint_eq(got_len, 0);
    close(fd);
}
END_TEST

/* The TCP fabric answers this many refused one-sided accesses on a
 * connection (callers probe bounds); the next one closes it, as a NIC breaks
 * the queue pair on a bad access. A peer cannot search the key space. */
#define ALLOWED_REFUSALS 16

/* A one-sided access the endpoint refuses, i-th of a series: PUT and GET by
 * turns, mostly wrong keys, sometimes the right key past the region's end.
 * If `answered`, read its EREMACCESS answer. */
static void refused_access(int fd, const struct tern_tp_rkey *rk, unsigned i, bool answered)
{
    bool put = i % 2;
    bool wrong_key = i % 3 != 0;
    uint32_t key = wrong_key ? rk->key ^ ((i + 1) << 12) : rk->key;
    uint64_t off = wrong_key ? 0 : sizeof(region);
    uint8_t f[128];
    int st;

    raw_send(fd, f, onesided_frame(f, put ? TCP_PUT : TCP_GET_REQ, key, 8, off,
                                   put ? "XXXXXXXX" : NULL, put ? 8 : 0));
    if (!answered)
        return;
    st = raw_read_answer(fd, put ? TCP_ACK : TCP_GET_RESP, NULL, 0, NULL);
    ck_assert_msg(st == TERN_EREMACCESS, "refused access %u answered %s", i, tern_err_name(st));
}

/* A good 8-byte GET at `off` still works on fd. */
static void good_get(int fd, const struct tern_tp_rkey *rk, uint64_t off, const char *what)
{
    uint8_t f[128], got[16];
    size_t got_len;
    int st;

    raw_send(fd, f, onesided_frame(f, TCP_GET_REQ, rk->key, 8, off, NULL, 0));
    st = raw_read_answer(fd, TCP_GET_RESP, got, sizeof(got), &got_len);
    ck_assert_msg(st == 0, "%s: valid GET answered %s", what, tern_err_name(st));
    ck_assert_uint_eq(got_len, 8);
    ck_assert_mem_eq(got, region + off, 8);
}

START_TEST(refused_accesses_close_connection)
{
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE,
                                        &mr);
    struct tern_tp_conn *c1, *c2;
    struct logged *e;
    int fd1, fd2;
    uint8_t b;
    ssize_t n;

    for (size_t i = 0; i < sizeof(region); i++)
        region[i] = (uint8_t)(i * 7 + 3);
    fd1 = raw_connect(&c1);
    fd2 = raw_connect(&c2);
    /* Refusals count per connection: a few on the second one first. */
    for (unsigned i = 0; i < 10; i++)
        refused_access(fd2, &rk, i, true);

    /* Up to the limit, each refusal is answered and the connection stays. */
    for (unsigned i = 0; i < ALLOWED_REFUSALS; i++)
        refused_access(fd1, &rk, i, true);
    good_get(fd1, &rk, 16, "after 16 refusals");
    ck_assert(!was_closed(&srv, c1));

    /* One more is a key search: the connection goes, with EREMACCESS, and
     * the access is not answered. */
    refused_access(fd1, &rk, ALLOWED_REFUSALS, false);
    e = wait_for(&srv, TERN_TP_EV_CLOSED, c1, WAIT_MS);
    ck_assert_msg(e, "%d refused one-sided accesses, and the connection is still open",
                  ALLOWED_REFUSALS + 1);
    ck_assert_msg(e->ev.status == TERN_EREMACCESS, "closed with %s, want TERN_EREMACCESS",
                  tern_err_name(e->ev.status));
    tern_tp_disconnect(c1);
    forget(&srv, c1);
    n = recv(fd1, &b, 1, 0);
    ck_assert_msg(n == 0 || (n < 0 && errno == ECONNRESET),
                  "raw socket still open, or answered, after CLOSED (recv %zd)", n);
    close(fd1);

    for (size_t i = 0; i < 8; i++)
        ck_assert_msg(region[i] == (uint8_t)(i * 7 + 3), "a refused PUT wrote the region");

    /* The other connection is unaffected and has its own allowance. */
    for (unsigned i = 10; i < ALLOWED_REFUSALS; i++)
        refused_access(fd2, &rk, i, true);
    good_get(fd2, &rk, 800, "second connection");
    ck_assert(!was_closed(&srv, c2));
    close(fd2);
    good_roundtrip("after a key search");
}
END_TEST

/* ---- garbage ---- */

/* xorshift64*: a fixed seed makes every run send the same bytes. */
static void rng_fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(test_rng() >> 56);
}

START_TEST(random_garbage)
{
    enum { ROUNDS = 48, MAXLEN = 16384 };
    static uint8_t buf[MAXLEN + 64];
    struct tern_tp_mr *mr;
    int eproto = 0;

    /* A writable region, so that random PUTs have something to aim at. */
    reg_region(TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE, &mr);
    test_rng_seed(0x7465726e2d777972ull);
    for (int round = 0; round < ROUNDS; round++) {
        struct tern_tp_conn *conn;
        struct logged *e;
        int fd = raw_connect(&conn);
        size_t len = 1 + test_rng() % MAXLEN;
        bool pure = round % 2 == 0;

        rng_fill(buf, len);
        if (!pure) {
            /* A valid magic and version with a random type and length: the
             * garbage reaches the type, length and one-sided checks. */
            struct tcp_hdr h = {.magic = TCP_MAGIC, .version = TCP_VERSION,
                                .type = (uint8_t)(test_rng() % 8),
                                .len = (uint32_t)(test_rng() % 4 == 0 ? test_rng()
                                                                      : test_rng() % 64)};

            len = len < sizeof(h) ? sizeof(h) : len;
            memcpy(buf, &h, sizeof(h));
        }
        raw_send_try(fd, buf, len);     /* the endpoint may hang up midway */
        close(fd);

        e = wait_for(&srv, TERN_TP_EV_CLOSED, conn, WAIT_MS);
        ck_assert_msg(e, "round %d: connection of a garbage sender never closed", round);
        ck_assert_msg(e->ev.status <= 0, "round %d: positive close status %d", round,
                      e->ev.status);
        if (pure && ((struct tcp_hdr *)buf)->magic != TCP_MAGIC)
            ck_assert_msg(e->ev.status == TERN_EPROTO, "round %d: random bytes closed with %s",
                          round, tern_err_name(e->ev.status));
        eproto += e->ev.status == TERN_EPROTO;
        tern_tp_disconnect(conn);
        forget(&srv, conn);
    }
    /* Most rounds are malformed; a run where none is refused checks nothing. */
    ck_assert_int_ge(eproto, ROUNDS / 2);
    good_roundtrip("after garbage");
}
END_TEST

START_TEST(garbage_while_good_traffic)
{
    /* Interleave: bad bytes on several raw connections at once, good
     * messages in between, all on one endpoint. */
    enum { N = 8 };
    struct tern_tp_conn *conn[N];
    int fd[N];
    uint8_t junk[512];

    test_rng_seed(42);
    for (int i = 0; i < N; i++)
        fd[i] = raw_connect(&conn[i]);
    for (int i = 0; i < N; i++) {
        char tag[16];

        rng_fill(junk, sizeof(junk));
        junk[0] = (uint8_t)~(TCP_MAGIC & 0xff);     /* never a valid header */
        raw_send(fd[i], junk, sizeof(junk));
        snprintf(tag, sizeof(tag), "mid-%d", i);
        good_roundtrip(tag);
    }
    for (int i = 0; i < N; i++)
        expect_eproto_close(conn[i], fd[i], "concurrent garbage");
}
END_TEST

/* ---- peers that try to keep an adaptive server awake ---- */

/* CPU seconds this process has used. */
static double cpu_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Serve for `ms` as an idle adaptive server does: sleep in tern_tp_wait()
 * in 10 ms slices (as tern_rpc_run does), then poll with `poll_fn`. Returns
 * the CPU seconds used; *woke counts the waits that said there was work. */
static double sleep_serve(int ms, void (*poll_fn)(void), int *woke)
{
    double c0 = cpu_seconds(), end = now_ms() + ms;

    *woke = 0;
    while (now_ms() < end) {
        *woke += tern_tp_wait(srv.ep, 10000000ll);
        poll_fn();
    }
    return cpu_seconds() - c0;
}

#define FLOOD_GET 8                                     /* bytes each GET asks for */
#define FLOOD_FRAMES (sizeof(region) / FLOOD_GET)       /* one GET per 8-byte slot */
#define FLOOD_REQ TCP_FRAME_LEN(sizeof(struct tcp_onesided))
#define FLOOD_RESP TCP_FRAME_LEN(sizeof(struct tcp_ack) + FLOOD_GET)

/* The k-th answer of the flood must be a good GET_RESP for the k-th GET. */
static void flood_check(uint64_t k, const uint8_t *f)
{
    struct tcp_hdr h;
    struct tcp_ack ack;
    size_t off = (size_t)(k % FLOOD_FRAMES) * FLOOD_GET;

    memcpy(&h, f, sizeof(h));
    memcpy(&ack, f + sizeof(h), sizeof(ack));
    ck_assert_msg(h.magic == TCP_MAGIC && h.type == TCP_GET_RESP &&
                  h.len == sizeof(ack) + FLOOD_GET,
                  "answer %llu: type %u, length %u", (unsigned long long)k, h.type, h.len);
    ck_assert_msg(ack.status == 0, "answer %llu: %s", (unsigned long long)k,
                  tern_err_name(ack.status));
    if (memcmp(f + sizeof(h) + sizeof(ack), region + off, FLOOD_GET) != 0)
        ck_abort_msg("answer %llu: wrong data", (unsigned long long)k);
}

START_TEST(get_flood_without_reading)
{
    /* A peer sends valid GET_REQs as fast as it can and reads nothing. The
     * answers fill the send path; the endpoint must then stop reading that
     * peer (TCP backpressure reaches it) and go to sleep, rather than retry
     * the answer it cannot send on every poll. When the peer finally reads,
     * every answer arrives, in order. */
    static uint8_t reqs[FLOOD_FRAMES * FLOOD_REQ];
    static uint8_t in[64 * 1024];
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rk = reg_region(TERN_TP_ACCESS_REMOTE_READ, &mr);
    struct tern_tp_conn *conn;
    uint64_t sent = 0, want, got = 0;
    size_t have = 0, tail;
    double stalled = 0, end, cpu;
    int fd, woke;

    for (size_t i = 0; i < sizeof(region); i++)
        region[i] = (uint8_t)(i * 13 + 5);
    for (size_t k = 0; k < FLOOD_FRAMES; k++)
        onesided_frame(reqs + k * FLOOD_REQ, TCP_GET_REQ, rk.key, FLOOD_GET, k * FLOOD_GET,
                       NULL, 0);
    /* A small receive buffer, so that the answers back up quickly. */
    fd = raw_connect_rcvbuf(&conn, 4096);

    /* Flood until the endpoint has stopped taking requests for 300 ms while
     * being polled all along. */
    end = now_ms() + 30000;
    for (;;) {
        size_t at = (size_t)(sent % sizeof(reqs));
        ssize_t n = send(fd, reqs + at, sizeof(reqs) - at, MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n > 0) {
            sent += (uint64_t)n;
            stalled = 0;
            continue;
        }
        ck_assert_msg(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
                      "flood send: %s", n < 0 ? strerror(errno) : "0");
        if (!stalled)
            stalled = now_ms();
        else if (now_ms() - stalled > 300)
            break;
        ck_assert_msg(now_ms() < end, "no backpressure: the endpoint took %llu bytes of "
                      "GETs whose answers nobody reads", (unsigned long long)sent);
        pump();
    }

    /* The peer just sits there now. An idle adaptive server sleeps. */
    cpu = sleep_serve(1000, pump, &woke);
    ck_assert_msg(cpu < 0.3, "the endpoint used %.2f CPU s in 1 s, sleeping between polls, "
                  "with a GET flood parked on it (%d wakeups)", cpu, woke);
    ck_assert(!was_closed(&srv, conn));

    /* The peer reads: every answer comes, in order. The last request may
     * have gone out in part; the rest of it is sent along the way. */
    tail = sent % FLOOD_REQ ? FLOOD_REQ - (size_t)(sent % FLOOD_REQ) : 0;
    want = (sent + tail) / FLOOD_REQ;
    end = now_ms() + 60000;
    while (got < want) {
        size_t off = 0;
        ssize_t n;

        if (tail) {
            n = send(fd, reqs + sent % sizeof(reqs), tail, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0) {
                sent += (uint64_t)n;
                tail -= (size_t)n;
            }
        }
        n = recv(fd, in + have, sizeof(in) - have, MSG_DONTWAIT);
        if (n <= 0) {
            ck_assert_msg(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
                          "the endpoint hung up after %llu of %llu answers",
                          (unsigned long long)got, (unsigned long long)want);
            ck_assert_msg(now_ms() < end, "%llu of %llu answers arrived",
                          (unsigned long long)got, (unsigned long long)want);
            pump();
            continue;
        }
        have += (size_t)n;
        for (; have - off >= FLOOD_RESP && got < want; off += FLOOD_RESP)
            flood_check(got++, in + off);
        memmove(in, in + off, have - off);
        have -= off;
    }
    /* Nothing more, and the connection is still there. */
    for (double quiet = now_ms() + 50; now_ms() < quiet;)
        pump();
    ck_assert_msg(have == 0 && recv(fd, in, sizeof(in), MSG_DONTWAIT) < 0 && errno == EAGAIN,
                  "more than %llu answers to %llu GETs", (unsigned long long)want,
                  (unsigned long long)want);
    ck_assert(!was_closed(&srv, conn));
    close(fd);
    good_roundtrip("after a GET flood");
}
END_TEST

/* Views of one connection that the test keeps, pinning its receive buffer. */
static struct tern_tp_conn *held_conn;
static const void *held[256];
static int n_held, held_seen;
static bool holding, held_closed;
static int held_status;

/* Poll the attacked endpoint once. While `holding`, every view of held_conn
 * is kept; other views are released at once. */
static void poll_holding(void)
{
    struct tern_tp_event ev[32];
    int n = tern_tp_poll(srv.ep, ev, 32);

    ck_assert_msg(n >= 0, "tern_tp_poll: %s", tern_strerror(n));
    for (int i = 0; i < n; i++) {
        if (ev[i].conn == held_conn && ev[i].type == TERN_TP_EV_CLOSED) {
            held_closed = true;
            held_status = ev[i].status;
        } else if (ev[i].type == TERN_TP_EV_RECV) {
            if (ev[i].conn == held_conn)
                held_seen++;
            if (ev[i].conn == held_conn && holding) {
                ck_assert_int_lt(n_held, 256);
                held[n_held++] = ev[i].data;
            } else {
                tern_tp_msg_release(ev[i].conn, ev[i].data);
            }
        }
    }
}

START_TEST(reset_while_paused)
{
    /* The application holds every view of a connection, so its receive
     * buffer stays pinned and the endpoint stops reading it. Then the peer
     * resets the connection. The endpoint cannot act on that until the
     * views come back, and epoll reports the error on every wait: the
     * endpoint must not let it wake sleepers over and over. Once the views
     * are released, CLOSED is reported. */
    enum { N = 64, LEN = 1000 };   /* 64 KB: twice the receive buffer */
    static uint8_t stream[N * TCP_FRAME_LEN(LEN)];
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    uint8_t body[LEN];
    size_t len = 0, off = 0;
    double cpu, end;
    int fd, woke;

    fd = raw_connect(&held_conn);
    n_held = held_seen = 0;
    holding = true;
    held_closed = false;
    for (int i = 0; i < N; i++) {
        memset(body, 'a' + i % 26, sizeof(body));
        len += good_frame(stream + len, TCP_MSG, body, sizeof(body));
    }
    end = now_ms() + WAIT_MS;
    while (off < len) {
        ssize_t n = send(fd, stream + off, len - off, MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        ck_assert_msg(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "send: %s",
                      n < 0 ? strerror(errno) : "0");
        ck_assert_msg(now_ms() < end, "raw send stuck");
        poll_holding();
    }
    for (end = now_ms() + 200; now_ms() < end;)
        poll_holding();
    ck_assert_msg(n_held > 0 && n_held < N,
                  "%d of %d messages delivered while every view is held", n_held, N);

    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);          /* RST */
    usleep(50000);
    cpu = sleep_serve(1000, poll_holding, &woke);
    ck_assert_msg(cpu < 0.3 && woke < 20, "a reset on a paused connection: %d wakeups and "
                  "%.2f CPU s in 1 s of sleeping between polls", woke, cpu);

    /* Views back, in order: the endpoint reads again and finds the reset. */
    holding = false;
    for (int i = 0; i < n_held; i++)
        tern_tp_msg_release(held_conn, held[i]);
    n_held = 0;
    for (end = now_ms() + WAIT_MS; !held_closed && now_ms() < end;)
        poll_holding();
    ck_assert_msg(held_closed, "no CLOSED for a reset connection after its views came back "
                  "(%d messages seen)", held_seen);
    ck_assert_msg(held_status < 0, "a reset reported as CLOSED with %s",
                  tern_err_name(held_status));
    tern_tp_disconnect(held_conn);
    good_roundtrip("after a reset while paused");
}
END_TEST

Suite *suite_tcp_wire(void)
{
    Suite *s = suite_create("tcp_wire");
    TCase *tc = tcase_create("malformed");
    TCase *os = tcase_create("onesided");
    TCase *gb = tcase_create("garbage");
    TCase *sl = tcase_create("sleep");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, bad_magic);
    tcase_add_test(tc, bad_version);
    tcase_add_test(tc, unknown_type);
    tcase_add_test(tc, msg_longer_than_max);
    tcase_add_test(tc, msg_exactly_max_is_fine);
    tcase_add_test(tc, truncated_frame_then_close);
    tcase_add_test(tc, truncated_header_then_close);
    tcase_add_test(tc, missing_padding_then_close);
    tcase_add_test(tc, get_req_wrong_body_size);
    tcase_add_test(tc, put_shorter_than_header);
    tcase_add_test(tc, unsolicited_ack);
    tcase_add_test(tc, unsolicited_get_resp);
    tcase_add_test(tc, bad_frame_after_good_ones);
    suite_add_tcase(s, tc);

    tcase_add_checked_fixture(os, setup, teardown);
    tcase_set_timeout(os, 30);
    tcase_add_test(os, put_wrong_key_gets_error_ack);
    tcase_add_test(os, put_valid_key_writes_region);
    tcase_add_test(os, put_len_field_disagrees_with_body);
    tcase_add_test(os, put_into_read_only_region);
    tcase_add_test(os, get_req_valid_and_too_long);
    tcase_add_test(os, get_after_dereg);
    tcase_add_test(os, refused_accesses_close_connection);
    suite_add_tcase(s, os);

    tcase_add_checked_fixture(gb, setup, teardown);
    tcase_set_timeout(gb, 60);
    tcase_add_test(gb, random_garbage);
    tcase_add_test(gb, garbage_while_good_traffic);
    suite_add_tcase(s, gb);

    /* The attacked endpoint in adaptive mode; the tests measure its CPU. */
    tcase_add_checked_fixture(sl, setup_adaptive, teardown);
    tcase_set_timeout(sl, 120);
    tcase_add_test(sl, get_flood_without_reading);
    tcase_add_test(sl, reset_while_paused);
    suite_add_tcase(s, sl);
    return s;
}
