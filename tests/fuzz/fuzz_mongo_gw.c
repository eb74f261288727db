/* A client's bytes through the MongoDB gateway (services/doc/mongo_gw.c):
 * framing, error replies, a stream that cannot be framed, moreToCome,
 * replies held to the output cap, group commit and its failure. Input: a
 * flags byte (bit 0: the sync fails; bit 1: a small output cap; bit 2: the
 * real command layer instead), then the client's bytes, written into one
 * end of a socketpair the gateway serves as a client; then that end is
 * shut for writing. The gateway must answer what came and hang up. Without
 * bit 2, commands run through a runner of the harness's own that echoes
 * them (a command named "write" writes), so that the gateway is fuzzed
 * apart from the command layer; with it, through doc_cmd on a store in
 * /dev/shm whose databases are dropped after each input. The echoing
 * runner makes a "hello" with maxAwaitTimeMS (mod 64) awaitable, current
 * if it has a field "current", and its topology counter moves now and
 * then, so that waiting hellos and exhaust streams are fuzzed too. Every
 * reply must be a well-formed OP_MSG (flags 0, or moreToCome in a stream,
 * one kind-0 section) or OP_REPLY, no more replies but streamed ones may
 * come than messages went, and a stream must end with a reply without
 * moreToCome before the hang-up. */
#include <bson/bson.h>
#include <sys/socket.h>
#include <unistd.h>

#include "doc/doc_cmd.h"
#include "doc/doc_store.h"
#include "doc/mongo_gw.h"
#include "doc/mongo_wire.h"
#include "fuzz.h"
#include "log.h"

#define POLLS_MAX 100000

static struct mongo_gw *gws[3];
static const char *pool_path;
static struct doc_store *store;
static struct doc_server *srv;
static int srv_token;
static bool fail_sync;
static unsigned live;

static int64_t topo_looks;

static struct doc_client *client_new(struct doc_server *s, const char *peer)
{
    live++;
    return (struct doc_client *)calloc(1, sizeof(struct doc_await));
}

static void client_free(struct doc_client *c)
{
    live--;
    free(c);
}

static int run(struct doc_client *c, const bson_t *cmd, const struct doc_seq *seqs,
               unsigned nseq, bson_t *reply)
{
    bson_iter_t it;

    BSON_APPEND_DOUBLE(reply, "ok", 1.0);
    BSON_APPEND_DOCUMENT(reply, "echo", cmd);
    BSON_APPEND_INT32(reply, "nseq", (int32_t)nseq);
    if (bson_iter_init(&it, cmd) && bson_iter_next(&it) && !strcmp(bson_iter_key(&it), "hello")) {
        struct doc_await *a = (struct doc_await *)c;

        *a = (struct doc_await){.counter = topo_looks / 8};
        if (!bson_iter_init_find(&it, cmd, "maxAwaitTimeMS"))
            return 0;
        a->max_ms = (uint64_t)bson_iter_as_int64(&it) % 64;
        a->current = bson_has_field(cmd, "current");
        return DOC_CMD_AWAIT;
    }
    return bson_iter_init(&it, cmd) && bson_iter_next(&it) &&
                   strcmp(bson_iter_key(&it), "write") == 0
               ? DOC_CMD_WROTE
               : 0;
}

static void await_of(const struct doc_client *c, struct doc_await *a)
{
    *a = *(const struct doc_await *)c;
}

/* The counter moves every 8th look. */
static int64_t topology(struct doc_server *s)
{
    return ++topo_looks / 8;
}

static int sync_fn(struct doc_server *s, struct doc_err *e)
{
    return fail_sync ? doc_errf(e, DOC_OutOfDiskSpace, "full") : 0;
}

static void sync_failed(const struct doc_err *e, bson_t *reply)
{
    mongo_error_doc(e, reply);
}

static void tick(struct doc_server *s, uint64_t now_ms)
{
}

static const struct mongo_gw_runner runner = {client_new, client_free, run,    sync_fn,
                                              sync_failed, tick,        NULL,   NULL,
                                              await_of,    topology};

static char dbs[64][128];
static unsigned n_dbs;

static int add_db(void *arg, const char *db, uint64_t bytes)
{
    if (n_dbs == 64)
        return 1;
    snprintf(dbs[n_dbs++], sizeof(dbs[0]), "%s", db);
    return 0;
}

/* Leave the store as it was found: no state from one input to the next. */
static void drop_all(void)
{
    struct doc_err e = {0};

    do {
        n_dbs = 0;
        doc_db_each(store, add_db, NULL);
        for (unsigned i = 0; i < n_dbs; i++)
            FZ_CHECK(doc_db_drop(store, dbs[i], &e) >= 0, "drop %s: %s", dbs[i], e.msg);
    } while (n_dbs == 64);
    FZ_CHECK(doc_store_sync(store, &e) == 0, "sync: %s", e.msg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct doc_store_opts so = {.pool_size = 256u << 20, .create = true};
    struct doc_err e = {0};
    /* Small limits, so that short inputs reach them. */
    struct mongo_gw_config cfg = {.max_request = 4096, .max_output = 1u << 20,
                                  .runner = &runner};
    int rc;

    tern_log_set_level(TERN_LOG_ERROR);
    rc = mongo_gw_create((struct doc_server *)&srv_token, &cfg, &gws[0]);
    FZ_CHECK(rc == 0, "gateway: %d", rc);
    cfg.max_output = 256;
    rc = mongo_gw_create((struct doc_server *)&srv_token, &cfg, &gws[1]);
    FZ_CHECK(rc == 0, "gateway: %d", rc);

    pool_path = fz_tmp_pool("mongo");
    rc = doc_store_open(pool_path, &so, &store, &e);
    FZ_CHECK(rc == 0, "store: %s", e.msg);
    rc = doc_server_open(store, NULL, &srv);
    FZ_CHECK(rc == 0, "server: %d", rc);
    cfg.runner = NULL;
    cfg.max_request = 65536;
    cfg.max_output = 1u << 20;
    rc = mongo_gw_create(srv, &cfg, &gws[2]);
    FZ_CHECK(rc == 0, "gateway: %d", rc);
    return 0;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Check and drop the whole replies at the front of buf; *n counts those
 * without moreToCome, *more says whether the last one had it. */
static size_t take_replies(const uint8_t *buf, size_t len, unsigned *n, bool *more)
{
    size_t used = 0;

    while (len - used >= 4 && len - used >= rd32(buf + used)) {
        const uint8_t *r = buf + used;
        uint32_t rlen = rd32(r), op, off;
        bson_t doc;

        FZ_CHECK(rlen >= 21 && rlen <= MONGO_MAX_MESSAGE, "a reply of %u bytes", rlen);
        op = rd32(r + 12);
        FZ_CHECK(op == MONGO_OP_MSG || op == MONGO_OP_REPLY, "a reply with opcode %u", op);
        if (op == MONGO_OP_MSG) {
            uint32_t fl = rd32(r + 16);

            FZ_CHECK((fl == 0 || fl == MONGO_MSG_MORE_TO_COME) && r[20] == 0,
                     "OP_MSG reply: flags or kind");
            *more = fl == MONGO_MSG_MORE_TO_COME;
            off = 21;
        } else {
            *more = false;
            FZ_CHECK(rlen >= 36 + 5 && rd32(r + 32) == 1, "OP_REPLY: numberReturned");
            off = 36;
        }
        /* Strings may hold NULs: MongoDB stores them, and so echoes them. */
        FZ_CHECK(rd32(r + off) == rlen - off && bson_init_static(&doc, r + off, rlen - off) &&
                     bson_validate(&doc, BSON_VALIDATE_UTF8 | BSON_VALIDATE_UTF8_ALLOW_NULL,
                                   NULL),
                 "a reply's document is not the rest of it, or not valid (%u bytes)", rlen);
        *n += !*more;
        used += rlen;
    }
    return used;
}

/* Complete messages in the input: an upper bound on the replies. */
static unsigned count_msgs(const uint8_t *p, size_t n, uint8_t flags)
{
    unsigned k = 0;

    while (n >= 16) {
        uint32_t len = rd32(p);

        if (len < 16 || len > n) {
            /* An error reply to an impossible header: one more at most. */
            return k + (len < 16 || len > 4096 || (flags & 4) != 0);
        }
        k++;
        p += len;
        n -= len;
    }
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t flags = fz_u8(&f);
    struct mongo_gw *gw = flags & 4 ? gws[2] : gws[(flags >> 1) & 1];
    const uint8_t *in;
    size_t n = fz_take(&f, f.n, &in), sent = 0, have = 0;
    static uint8_t out[1u << 20];
    bool eof = false, shut = false, more = false;
    unsigned replies = 0;
    int sv[2], rc;

    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0,
             "socketpair");
    rc = mongo_gw_adopt(gw, sv[0]);
    FZ_CHECK(rc == 0, "adopt: %d", rc);
    fail_sync = flags & 1;
    for (int i = 0; i < POLLS_MAX && !eof; i++) {
        if (sent < n) {
            ssize_t w = send(sv[1], in + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);

            if (w > 0)
                sent += (size_t)w;
        }
        if (sent == n && !shut) {
            shutdown(sv[1], SHUT_WR);
            shut = true;
        }
        rc = mongo_gw_poll(gw, 0);
        FZ_CHECK(rc >= 0, "poll: %d", rc);
        for (;;) {
            ssize_t r = recv(sv[1], out + have, sizeof(out) - have, MSG_DONTWAIT);
            size_t used;

            if (r > 0) {
                have += (size_t)r;
                used = take_replies(out, have, &replies, &more);
                memmove(out, out + used, have - used);
                have -= used;
                FZ_CHECK(have < sizeof(out), "a reply larger than %zu", sizeof(out));
                continue;
            }
            eof = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
            break;
        }
    }
    FZ_CHECK(eof, "the gateway never hung up on a client that had finished");
    FZ_CHECK(have == 0, "%zu bytes of a partial reply at the end", have);
    FZ_CHECK(!more, "a stream of hello replies ended on moreToCome");
    FZ_CHECK(replies <= count_msgs(in, n, flags), "%u replies to %u messages", replies,
             count_msgs(in, n, flags));
    FZ_CHECK(live == 0, "%u doc_clients left after the hang-up", live);
    close(sv[1]);
    if (flags & 4)
        drop_all();
    return 0;
}
