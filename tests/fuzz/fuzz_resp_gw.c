/* Whole commands through the RESP gateway (services/kv/resp.c): parsing,
 * dispatch, every command's argument checks, replies held to the output
 * cap, group commit and its failure, on a store in /dev/shm, with a
 * collection engine (kv/coll/coll.h) on a pool of its own beside it, so
 * that the list, hash, set and sorted-set commands run too. The input (a
 * flags byte, then the client's bytes) is written into one end of a
 * socketpair whose other end the gateway serves as a client; then that end
 * is shut for writing. The gateway must answer what came and hang up, and
 * every reply byte is read. Between runs both stores are emptied. */
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "kv/coll/coll.h"
#include "kv/kv_store.h"
#include "kv/resp.h"
#include "kv/resp_parse.h"
#include "log.h"

#define POLLS_MAX 100000

static const char *pool_path;
static struct kvs *store;
static struct kvc *coll;
static char coll_path[64];
static struct resp_gw *gw;

static void remove_coll_pool(void)
{
    unlink(coll_path);
}

static int failing_sync(struct kvs *s)
{
    kvs_sync(s);
    return TERN_EIO;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct kvs_opts o = {.pool_size = 4u << 20, .seg_size = 64u * 1024};
    struct kvc_opts co = {.path = coll_path, .pool_size = 4u << 20, .seg_size = 64u * 1024};
    /* Small limits, so that short inputs reach them. */
    struct resp_config cfg = {.max_request = 4096, .max_output = 8192};
    int rc;

    tern_log_set_level(TERN_LOG_ERROR);
    pool_path = fz_tmp_pool("resp");
    o.path = pool_path;
    rc = kvs_open(&o, &store);
    FZ_CHECK(rc == 0, "store: %d", rc);
    /* fz_tmp_pool names one pool; the collections' is named here. */
    snprintf(coll_path, sizeof(coll_path), "/dev/shm/tern-fuzz-resp-coll.%d", (int)getpid());
    unlink(coll_path);
    atexit(remove_coll_pool);
    rc = kvc_open(&co, &coll);
    FZ_CHECK(rc == 0, "collections: %d", rc);
    cfg.collections = coll;
    rc = resp_gw_create(store, &cfg, &gw);
    FZ_CHECK(rc == 0, "gateway: %d", rc);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t flags = fz_u8(&f);
    const uint8_t *in;
    size_t n = fz_take(&f, f.n, &in), sent = 0;
    static uint8_t out[65536];
    bool eof = false, shut = false;
    int sv[2], rc;

    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0,
             "socketpair");
    rc = resp_gw_adopt(gw, sv[0]);
    FZ_CHECK(rc == 0, "adopt: %d", rc);
    resp_sync_fn = flags & 1 ? failing_sync : kvs_sync;
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
        rc = resp_gw_poll(gw, 0);
        FZ_CHECK(rc >= 0, "poll: %d", rc);
        for (;;) {
            ssize_t r = recv(sv[1], out, sizeof(out), MSG_DONTWAIT);

            if (r > 0)
                continue;
            eof = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
            break;
        }
    }
    FZ_CHECK(eof, "the gateway never hung up on a client that had finished");
    close(sv[1]);
    resp_sync_fn = kvs_sync;
    FZ_CHECK(kvs_clear(store, TERN_KV_SYNC) == 0, "clear");
    FZ_CHECK(kvc_clear(coll) == 0 && kvc_sync(coll) == 0, "clear the collections");
    FZ_CHECK(kvc_count(coll) == 0, "collections left after a clear");
    return 0;
}
