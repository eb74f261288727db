/* How a KV client's GET or PUT goes to a server: the one place that
 * chooses (get_way, put_way), by the path the application set
 * (tern_kv_set_path) and by what the session's fabric can do
 * (tern_session_caps), never by the fabric's name. The paths themselves:
 *   kv_client.c          RPC: GET, PUT, DEL, MGET, SCAN by call and reply;
 *   kv_client_window.c   GET by reading the server's index window and the
 *                        record it points at (loads on a mapping, else two
 *                        one-sided gets), with a client cache;
 *   kv_client_push.c     GET by server push into a staging slot;
 *   kv_client_lease.c    PUT by writing the record into a segment the server
 *                        leased to this client, then a small LPUT call.
 * Here too: what they share (servers' one-sided state, staging slots, the
 * fallback to RPC). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "error.h"
#include "kv_client_internal.h"
#include "kv_hash.h"
#include "log.h"

/* ---- servers' one-sided state ---- */

static void os_info_done(void *arg, int status, const void *reply, size_t len)
{
    struct kv_server *srv = arg;

    if (status == 0 && len == sizeof(srv->os.info)) {
        memcpy(&srv->os.info, reply, len);
        if (srv->os.info.n_blocks && !(srv->os.info.n_blocks & (srv->os.info.n_blocks - 1)) &&
            srv->os.info.seg_size &&
            tern_rpc_mr_rkey(srv->kv->os->stage_mr, srv->s, &srv->os.stage_rkey) == 0) {
            srv->os.offload = (tern_session_caps(srv->s) & TERN_TP_CAP_RMA_OFFLOAD) != 0;
            srv->os.state = OS_READY;
            return;
        }
    }
    /* A server without the one-sided paths (or one that failed to say) is
     * used by RPC; asked again after a failover. */
    srv->os.state = OS_OFF;
}

/* Is the server's one-sided state current? If the session moved to another
 * fabric its keys are stale: ask again (in the background) and use RPC. */
static bool srv_known(struct tern_kv *kv, struct kv_server *srv)
{
    uint32_t epoch = tern_session_epoch(srv->s);

    if (srv->os.epoch != epoch && srv->os.state != OS_ASKING) {
        srv->os = (struct kv_onesided_srv){.state = OS_UNKNOWN, .epoch = epoch};
    }
    if (srv->os.state == OS_UNKNOWN) {
        srv->os.state = OS_ASKING;
        if (tern_call(srv->s, TERN_KV_SERVICE_ID, KV_M_ONESIDED_INFO, NULL, 0, kv->timeout,
                      os_info_done, srv, NULL) < 0)
            srv->os.state = OS_UNKNOWN;
    }
    return srv->os.state == OS_READY;
}

enum way { BY_RPC, BY_WINDOW, BY_PUSH, BY_LEASE };

/* How a GET goes to this server. TERN_KV_PATH_AUTO reads the window where
 * reads cost the server nothing (shm: loads; rdma: the NIC) and stays RPC
 * elsewhere. On ntb a window read is a served round trip each (two per
 * GET), and a push is a ring record the client's CPU copies out, plus a
 * checksum: measured, both lose to an RPC reply (docs/KV.md). On tcp every
 * one-sided operation is a served message. */
static enum way get_way(struct tern_kv *kv, struct kv_server *srv)
{
    if (!srv_known(kv, srv))
        return BY_RPC;
    switch (kv->path) {
    case TERN_KV_PATH_ONESIDED:
        return BY_WINDOW;
    case TERN_KV_PATH_PUSH:
        return BY_PUSH;
    case TERN_KV_PATH_AUTO:
        return srv->os.offload ? BY_WINDOW : BY_RPC;
    default:
        return BY_RPC;
    }
}

/* How a PUT of `len` bytes goes. TERN_KV_PATH_AUTO leases where the write
 * costs the server nothing (shm, rdma), for values of AUTO_PUT_MIN and
 * more. */
static enum way put_way(struct tern_kv *kv, struct kv_server *srv, size_t len)
{
    if (len > UINT32_MAX - 4096 || !srv_known(kv, srv))
        return BY_RPC;
    if (kv->path == TERN_KV_PATH_ONESIDED || kv->path == TERN_KV_PATH_PUSH)
        return BY_LEASE;
    if (kv->path == TERN_KV_PATH_AUTO && len >= AUTO_PUT_MIN &&
        srv->os.offload)
        return BY_LEASE;
    return BY_RPC;
}

/* ---- staging slots (fabrics without a mapping) ---- */

int kv_stage_get(struct kv_onesided *c)
{
    int i;

    if (!c->stage_free)
        return -1;
    i = __builtin_ctz(c->stage_free);
    c->stage_free &= ~(1u << i);
    return i;
}

void kv_stage_put(struct kv_onesided *c, int i)
{
    if (i >= 0)
        c->stage_free |= 1u << i;
}

uint8_t *kv_stage_mem(struct kv_onesided *c, int i)
{
    return (uint8_t *)tern_rpc_mr_addr(c->stage_mr) + (size_t)i * STAGE_SLOT;
}

/* A one-sided operation that timed out may still land in its staging slot
 * (rpc.h): the slot is never used again. */
void kv_stage_retire(struct kv_op *op, int status)
{
    if (status == TERN_ETIMEDOUT && op->stage >= 0) {
        op->stage = -1;
        op->kv->os->st.stage_lost++;
    }
}

/* ---- GET ---- */

void kv_op_finish(struct kv_op *op, int status, const void *val, size_t len,
                      uint64_t version)
{
    struct tern_kv *kv = op->kv;
    tern_kv_cb cb = op->cb;
    void *arg = op->arg;
    int stage = op->stage;

    /* The op's slot goes back first, so the callback may start the next
     * call; the staging slot only after it, as `val` may lie in it. */
    kv_op_put(kv, op);
    if (cb)
        cb(arg, status, val, len, version);
    kv_stage_put(kv->os, stage);
}

/* Hand the op over to the RPC path. */
int kv_op_by_rpc(struct kv_op *op, uint16_t method)
{
    kv_stage_put(op->kv->os, op->stage);
    op->stage = -1;
    if (method == KV_M_GET)
        op->kv->os->st.gets_rpc++;
    return kv_op_call(op, method, op->key, op->klen, op->val, op->vlen);
}

/* From a completion: hand the op over to the RPC path or, if the call
 * cannot be sent (kv_op_call has freed the op then), end it with `status`. */
void kv_op_by_rpc_or_end(struct kv_op *op, uint16_t method, int status)
{
    tern_kv_cb cb = op->cb;
    void *arg = op->arg;

    if (kv_op_by_rpc(op, method) < 0 && cb)
        cb(arg, status, NULL, 0, 0);
}

int kv_path_get(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb, void *arg)
{
    struct kv_op *op = kv_op_get(kv);

    if (!op)
        return TERN_ENOBUFS;
    *op = (struct kv_op){.kv = kv, .cb = cb, .arg = arg, .key = key, .klen = (uint16_t)klen,
                         .stage = -1, .hash = kv_hash(key, klen)};
    op->srv = kv_route(kv, key, klen);
    switch (get_way(kv, op->srv)) {
    case BY_WINDOW:
        return kv_window_get(op);
    case BY_PUSH:
        return kv_push_get(op);
    default:
        return kv_op_by_rpc(op, KV_M_GET);
    }
}

int kv_path_put(struct tern_kv *kv, const void *key, size_t klen, const void *val, size_t len,
              tern_kv_cb cb, void *arg)
{
    struct kv_op *op = kv_op_get(kv);

    if (!op)
        return TERN_ENOBUFS;
    *op = (struct kv_op){.kv = kv, .cb = cb, .arg = arg, .key = key, .klen = (uint16_t)klen,
                         .val = val, .vlen = (uint32_t)len, .stage = -1};
    op->srv = kv_route(kv, key, klen);
    if (put_way(kv, op->srv, len) != BY_LEASE)
        return kv_op_by_rpc(op, KV_M_PUT);
    return kv_lease_put(op);
}

/* ---- the client's one-sided state ---- */

int tern_kv_set_path(struct tern_kv *kv, enum tern_kv_path path)
{
    struct kv_onesided *c;
    int rc;

    if (!kv || (path != TERN_KV_PATH_RPC && path != TERN_KV_PATH_ONESIDED &&
                path != TERN_KV_PATH_AUTO && path != TERN_KV_PATH_PUSH))
        return TERN_EINVAL;
    kv->path = path;
    if (path == TERN_KV_PATH_RPC || kv->os)
        return 0;
    c = calloc(1, sizeof(*c));
    if (!c)
        return TERN_ENOMEM;
    c->kv = kv;
    /* Servers push GETs' records into the slots: remote write. */
    rc = tern_rpc_mr_alloc(kv->ep, (size_t)STAGE_SLOTS * STAGE_SLOT,
                           TERN_TP_ACCESS_LOCAL | TERN_TP_ACCESS_REMOTE_WRITE, &c->stage_mr);
    if (rc < 0) {
        free(c);
        kv->path = TERN_KV_PATH_RPC;
        return rc;
    }
    c->stage_free = STAGE_SLOTS == 32 ? UINT32_MAX : (1u << STAGE_SLOTS) - 1;
    for (uint32_t i = 0; i < STAGE_SLOTS; i++)
        c->stages[i] = (struct kv_stage){.c = c, .idx = i};
    if (getrandom(&c->intent, sizeof(c->intent), 0) != sizeof(c->intent))
        c->intent = (uint64_t)(uintptr_t)c;
    c->intent |= 1ull << 63;    /* never a version the server hands out */
    kv->os = c;
    /* Learn every server's keys now, so the first calls can use them. */
    for (unsigned i = 0; i < kv->n; i++) {
        kv->srv[i].kv = kv;
        srv_known(kv, &kv->srv[i]);
    }
    while (tern_rpc_calls_in_flight(kv->ep)) {
        rc = tern_rpc_poll(kv->ep);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void tern_kv_get_onesided_stats(const struct tern_kv *kv, struct tern_kv_onesided_stats *st)
{
    if (kv && kv->os)
        *st = kv->os->st;
    else
        *st = (struct tern_kv_onesided_stats){0};
}

void kv_onesided_free(struct tern_kv *kv)
{
    struct kv_onesided *c = kv->os;

    if (!c)
        return;
    kv_cache_free(&c->cache);
    for (unsigned i = 0; i < MAX_DEPTH; i++)
        free(c->scratch[i]);
    tern_rpc_mr_dereg(c->stage_mr);
    free(c);
    kv->os = NULL;
}
