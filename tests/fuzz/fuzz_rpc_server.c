/* What an RPC server decodes from a client (rpc/endpoint.c on_recv,
 * rpc/server.c: HELLO, requests, the replay cache of re-sent calls): a raw
 * socket sends RPC messages built from the input, each in a sound TCP
 * frame, to a server endpoint of this process.
 *
 * Records of the input: a HELLO (its magic, credits, max_msg, token and
 * length may be the input's), a request (service, method, flags, budget,
 * id and body from the input; methods that echo, reply large, fail,
 * return a positive code or reserve twice), a message whose whole header
 * is the input's, or one shorter than a header. A last request to a
 * method only the harness calls marks the end; if the session died before
 * it, the server hangs up instead. Then the peer resets the connection,
 * and the server must have dropped the session. Every 64 runs a sound
 * client checks that the server still serves. */
#include "fuzz.h"
#include "fuzz_raw.h"
#include "log.h"
#include "rpc_internal.h"

#define SVC 7
#define MAX_MSG 4096
#define POLLS_MAX 200000
#define IDLE_MAX 256
#define STREAM_MAX (128u * 1024)

enum { M_ECHO = 1, M_BIG, M_FAIL, M_POSITIVE, M_TWICE, M_SHRINK, M_END = 9 };

static struct tern_rpc_ep *srv, *plain_srv, *keyed_srv;
static struct sockaddr_in srv_addr, plain_addr, keyed_addr;
static uint8_t stream[STREAM_MAX];
static bool ended;
static unsigned runs;

static int h_echo(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, len);

    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, data, len);
    return 0;
}

/* The size the first 2 bytes ask for; the request's budget read on the way. */
static int h_big(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint16_t want = 0;
    uint8_t *out;

    memcpy(&want, data, len < 2 ? len : 2);
    out = tern_reply_alloc(req, want);
    if (!out)
        return TERN_EMSGSIZE;
    memset(out, 0x5a, want);
    (void)tern_req_deadline(req);
    return 0;
}

static int h_fail(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    tern_reply_alloc(req, len);        /* a reply begun, then an error */
    return TERN_ENOENT;
}

static int h_positive(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    return 1;
}

static int h_twice(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *a = tern_reply_alloc(req, 8);

    FZ_CHECK(!tern_reply_alloc(req, 8), "a second reply reserved");
    return a ? 0 : TERN_EMSGSIZE;
}

static int h_shrink(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint8_t *out = tern_reply_alloc(req, tern_reply_max(req));

    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, data, len < 64 ? len : 64);
    tern_reply_set_len(req, len < 64 ? len : 64);
    return 0;
}

static int h_end(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    ended = true;
    return 0;
}

static const struct tern_method methods[] = {
    {.id = M_ECHO, .name = "echo", .handler = h_echo},
    {.id = M_BIG, .name = "big", .handler = h_big},
    {.id = M_FAIL, .name = "fail", .handler = h_fail},
    {.id = M_POSITIVE, .name = "positive", .handler = h_positive},
    {.id = M_TWICE, .name = "twice", .handler = h_twice},
    {.id = M_SHRINK, .name = "shrink", .handler = h_shrink},
    {.id = M_END, .name = "end", .handler = h_end},
};
static const struct tern_service svc = {.name = "fuzz", .id = SVC, .methods = methods,
                                        .n_methods = sizeof(methods) / sizeof(methods[0])};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG, .credits = 8, .max_calls = 64};
    char bound[128];
    int rc;

    tern_log_set_level(TERN_LOG_ERROR);
    FZ_CHECK(tern_rpc_open(&cfg, &plain_srv) == 0 && tern_rpc_register(plain_srv, &svc) == 0,
             "server");
    rc = tern_rpc_listen(plain_srv, "tcp://127.0.0.1:0", bound, sizeof(bound));
    FZ_CHECK(rc == 0, "listen: %d", rc);
    plain_addr = raw_addr_of(bound);
    /* A server with a cluster key: HELLO with a nonce, AUTH before any
     * request (the input's proofs are wrong, as a stranger's would be). */
    cfg.size = sizeof(cfg);
    cfg.key = "a cluster key of 32 bytes, fuzz.";
    cfg.key_len = 32;
    FZ_CHECK(tern_rpc_open(&cfg, &keyed_srv) == 0 && tern_rpc_register(keyed_srv, &svc) == 0,
             "keyed server");
    rc = tern_rpc_listen(keyed_srv, "tcp://127.0.0.1:0", bound, sizeof(bound));
    FZ_CHECK(rc == 0, "listen: %d", rc);
    keyed_addr = raw_addr_of(bound);
    srv = plain_srv;
    srv_addr = plain_addr;
    return 0;
}

static void build(struct fz *f, struct raw_out *o)
{
    while (f->n && o->n < o->cap - 256) {
        uint8_t op = fz_u8(f);

        switch (op & 3) {
        case 0: {
            struct rpc_hdr h = {.type = RPC_HELLO,
                                .version = op & 0x80 ? fz_u8(f) : RPC_VERSION};
            struct rpc_hello hello = {
                .magic = op & 0x40 ? fz_u32(f) : RPC_MAGIC, .credits = fz_u8(f),
                .max_msg = op & 0x20 ? fz_u64(f) : fz_u16(f),
                .token = op & 0x10 ? 1 + fz_u8(f) % 4 : 0};
            size_t len = op & 0x08 ? fz_u8(f) % (sizeof(hello) + 8) : sizeof(hello);
            uint8_t body[sizeof(hello) + 8] = {0};

            memcpy(body, &hello, sizeof(hello));
            raw_msg(o, &h, sizeof(h), body, len);
            break;
        }
        case 1: {
            struct rpc_hdr h = {.type = RPC_REQ, .version = RPC_VERSION,
                                .svc = op & 0x80 ? fz_u16(f) : SVC,
                                .method = fz_u8(f) % 8,
                                .flags = op & 0x40 ? fz_u16(f) : 0,
                                .budget_us = op & 0x20 ? fz_u32(f) : 0,
                                .req_id = fz_u8(f)};
            size_t len = fz_u16(f) % (MAX_MSG + 32);
            const uint8_t *b;
            size_t got = fz_take(f, len, &b);

            raw_msg(o, &h, sizeof(h), b, got);
            break;
        }
        case 2: {
            struct rpc_hdr h;
            const uint8_t *hb, *b;
            size_t got;

            memset(&h, 0, sizeof(h));
            memcpy(&h, (fz_take(f, sizeof(h), &hb), hb), f->n ? sizeof(h) : 0);
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
    {
        struct rpc_hdr h = {.type = RPC_REQ, .version = RPC_VERSION, .svc = SVC,
                            .method = M_END};

        raw_msg(o, &h, sizeof(h), NULL, 0);
    }
}

/* Send the stream, serve until the end marker ran or the server hung up,
 * reset the connection; true if the end marker ran. */
static bool run(const struct raw_out *o, bool small_window)
{
    unsigned base = srv->n_sessions, idle = 0;
    size_t sent = 0;
    bool open = true;
    int fd = raw_connect(&srv_addr);

    ended = false;
    if (small_window) {
        /* Replies back up into the server's own buffers. */
        int small = 4096;

        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    }
    for (int i = 0; i < POLLS_MAX && !ended && open && idle < IDLE_MAX; i++) {
        bool busy = raw_push(fd, o, &sent);

        busy |= tern_rpc_poll(srv) > 0;
        if (!small_window || sent == o->n) {
            open = raw_drain(fd);
            busy |= !open;
        }
        idle = busy ? 0 : idle + 1;
    }
    raw_reset(fd);
    for (int i = 0; i < POLLS_MAX && srv->n_sessions > base; i++)
        tern_rpc_poll(srv);
    FZ_CHECK(srv->n_sessions == base, "the server kept the session of a reset connection");
    FZ_CHECK(!srv->replays, "a replay cache outlived its sessions");
    return ended;
}

/* A sound client that says HELLO and calls still gets served. */
static void still_serves(void)
{
    struct rpc_hdr h = {.type = RPC_HELLO, .version = RPC_VERSION};
    struct rpc_hello hello = {.magic = RPC_MAGIC, .credits = 4, .max_msg = MAX_MSG};
    struct raw_out o = {stream, 0, sizeof(stream)};
    struct fz none = {NULL, 0};

    raw_msg(&o, &h, sizeof(h), &hello, sizeof(hello));
    build(&none, &o);
    FZ_CHECK(run(&o, false), "the server no longer serves a sound client");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t flags = fz_u8(&f);
    struct raw_out o = {stream, 0, sizeof(stream)};

    srv = flags & 2 ? keyed_srv : plain_srv;
    srv_addr = flags & 2 ? keyed_addr : plain_addr;
    build(&f, &o);
    run(&o, flags & 1);
    if (!(flags & 2) && ++runs % 64 == 0)
        still_serves();
    return 0;
}
