/* What an RPC client decodes from a server (rpc/client.c: HELLO_ACK with
 * the advertisement of the server's other fabrics, replies matched to
 * calls by id): a server on a plain socket answers a client endpoint of
 * this process with RPC messages built from the input, in sound TCP frames.
 *
 * The input is a flags byte (calls to make once the session is open, a
 * failover token), a count of records to send before those calls go out,
 * then records: a HELLO_ACK (magic, credits, max_msg, the advertisement,
 * its length), a reply (status, body, and an id that may be a live call's),
 * a message whose whole header is the input's, or one shorter than a
 * header. The advertisement goes through tern_tp_select as auto:// would.
 * Then the server resets the connection. Every call's continuation must
 * run exactly once, with a payload only on success, and the session must
 * end dead with nothing left in flight. */
#include "fuzz.h"
#include "fuzz_raw.h"
#include "log.h"
#include "rpc_internal.h"

#define MAX_MSG 4096
#define MAX_CALLS 16
#define POLLS_MAX 200000
#define IDLE_MAX 64
#define STREAM_MAX (128u * 1024)

static struct tern_rpc_ep *ep, *plain_ep, *keyed_ep;
static int lfd;
static char uri[64];
static uint8_t stream[STREAM_MAX];
static volatile uint8_t sink;

struct call {
    uint64_t id;
    int runs, status;
};
static struct call calls[MAX_CALLS];
static unsigned n_calls;

static void cont(void *arg, int status, const void *reply, size_t len)
{
    struct call *c = arg;

    c->runs++;
    c->status = status;
    FZ_CHECK(c->runs == 1, "a continuation ran twice");
    FZ_CHECK(status <= 0, "status %d", status);
    FZ_CHECK(status == 0 || (!reply && !len), "an error with a payload");
    FZ_CHECK(len <= MAX_MSG, "a %zu-byte reply", len);
    for (size_t i = 0; i < len; i++)
        sink ^= ((const uint8_t *)reply)[i];
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG, .credits = 8, .max_calls = MAX_CALLS};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);

    tern_log_set_level(TERN_LOG_ERROR);
    FZ_CHECK(tern_rpc_open(&cfg, &plain_ep) == 0, "client endpoint");
    /* A client with a cluster key: it trusts only a server's HELLO_ACK
     * that proves the key (none of the input's can). */
    cfg.size = sizeof(cfg);
    cfg.key = "a cluster key of 32 bytes, fuzz.";
    cfg.key_len = 32;
    FZ_CHECK(tern_rpc_open(&cfg, &keyed_ep) == 0, "keyed client endpoint");
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FZ_CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
             listen(lfd, 16) == 0 && getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0,
             "listener: %s", strerror(errno));
    snprintf(uri, sizeof(uri), "tcp://127.0.0.1:%u", ntohs(sa.sin_port));
    return 0;
}

static void record(struct fz *f, struct raw_out *o)
{
    uint8_t op = fz_u8(f);

    switch (op & 3) {
    case 0: {
        struct rpc_hdr h = {.type = RPC_HELLO_ACK,
                            .version = op & 0x80 ? fz_u8(f) : RPC_VERSION};
        struct rpc_hello ack = {.magic = op & 0x40 ? fz_u32(f) : RPC_MAGIC,
                                .credits = fz_u8(f),
                                .max_msg = op & 0x20 ? fz_u64(f) : fz_u16(f),
                                .token = fz_u8(f)};
        uint8_t body[sizeof(ack) + 256];
        const uint8_t *ads;
        size_t n = fz_take(f, fz_u8(f), &ads), len = sizeof(ack) + n;

        memcpy(body, &ack, sizeof(ack));
        memcpy(body + sizeof(ack), ads, n);
        if (op & 0x10)
            len = fz_u8(f) % (sizeof(ack) + n + 1);     /* cut anywhere */
        raw_msg(o, &h, sizeof(h), body, len);
        break;
    }
    case 1: {
        uint8_t pick = fz_u8(f);
        struct rpc_hdr h = {.type = RPC_RESP, .version = RPC_VERSION, .svc = fz_u16(f),
                            .method = fz_u16(f),
                            .status = op & 0x80 ? (int32_t)fz_u32(f)
                                                : -(int32_t)((op >> 2) & 3),
                            .req_id = op & 0x40 && n_calls ? calls[pick % n_calls].id
                                                           : fz_u64(f)};
        const uint8_t *b;
        size_t got = fz_take(f, fz_u16(f) % (MAX_MSG + 32), &b);

        raw_msg(o, &h, sizeof(h), b, got);
        break;
    }
    case 2: {
        struct rpc_hdr h = {0};
        const uint8_t *hb, *b;
        size_t hn = fz_take(f, sizeof(h), &hb), got;

        memcpy(&h, hb, hn);
        got = fz_take(f, fz_u8(f), &b);
        raw_msg(o, &h, sizeof(h), b, got);
        break;
    }
    default: {
        const uint8_t *b;
        size_t got = fz_take(f, fz_u8(f) % sizeof(struct rpc_hdr), &b);

        raw_msg(o, b, got, NULL, 0);
        break;
    }
    }
}

/* Send `o` from *sent on while the client polls, until it is all gone and
 * the client has been idle a while or its session ended. */
static void serve(int fd, struct raw_out *o, size_t *sent, struct tern_session *s)
{
    unsigned idle = 0;

    for (int i = 0; i < POLLS_MAX && idle < IDLE_MAX && s->state != SESS_DEAD; i++) {
        bool busy = raw_push(fd, o, sent);

        busy |= tern_rpc_poll(ep) > 0;
        busy |= !raw_drain(fd);
        idle = busy ? 0 : idle + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t flags = fz_u8(&f), before = fz_u8(&f);
    struct raw_out o = {stream, 0, sizeof(stream)};
    struct tern_session *s;
    size_t sent = 0;
    int fd, rc;

    n_calls = 0;
    ep = flags & 0x40 ? keyed_ep : plain_ep;
    rc = rpc_connect_start(ep, uri, flags & 0x80 ? 0x1234 : 0, NULL, &s);
    FZ_CHECK(rc == 0 && s, "connect: %d", rc);
    fd = raw_accept(lfd);
    for (unsigned i = 0; i < before && f.n; i++)
        record(&f, &o);
    serve(fd, &o, &sent, s);
    if (s->state == SESS_OPEN && s->peer_ads) {
        char pick[128];

        /* As auto:// would; its choice is not followed here. */
        tern_tp_select(s->peer_ads, NULL, pick, sizeof(pick));
    }
    for (unsigned i = 0; i < (flags & 15u) && i < MAX_CALLS; i++) {
        struct call *c = &calls[n_calls];

        *c = (struct call){0};
        if (tern_call(s, 7, (uint16_t)i, "req", 3, 0, cont, c, &c->id) == 0)
            n_calls++;
    }
    if ((flags & 0x10) && n_calls)
        tern_call_cancel(s, calls[0].id);
    while (f.n && o.n < o.cap - 512)
        record(&f, &o);
    serve(fd, &o, &sent, s);
    raw_reset(fd);
    for (int i = 0; i < POLLS_MAX && s->state != SESS_DEAD; i++)
        tern_rpc_poll(ep);
    FZ_CHECK(s->state == SESS_DEAD, "the session outlived its reset connection");
    tern_rpc_disconnect(s);
    tern_rpc_poll(ep);
    for (unsigned i = 0; i < n_calls; i++)
        FZ_CHECK(calls[i].runs == 1, "call %u: its continuation ran %d times", i,
                 calls[i].runs);
    FZ_CHECK(tern_rpc_calls_in_flight(ep) == 0 && ep->n_sessions == 0,
             "calls or sessions left behind");
    return 0;
}
