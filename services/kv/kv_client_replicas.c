/* The KV client of a replicated shard (tern_kv_open_replicas): one
 * session per replica, calls to the one taken for the primary, and on to
 * the next when it says it is not (TERN_ENOTPRIMARY) or is gone.
 *
 * Which replica is primary is learned by asking: a backup refuses at once,
 * so finding the primary costs at most one refused call per replica, and
 * after a failover the first call that meets the new primary settles it
 * for the rest. A call is sent on at most twice round the replicas; past
 * that (an election under way) it ends with the last refusal, which the
 * sync forms wait out. A replica a call timed out on is passed over for a
 * call's timeout while another answers: a primary stopped or cut off keeps
 * its sessions open, and would otherwise take every call until it came
 * back (a slow primary that was only late costs its clients refusals from
 * the others for that long).
 *
 * The replicas named at open need not stay the shard's: every second the
 * client asks a replica for the others (KV_M_MEMBERS, from the shard's
 * map) and dials those it does not know yet, so it follows a primary on a
 * node added since (tern shard add).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv_client_internal.h"
#include "log.h"

#define RETRY_NS 200000000ull           /* a lost replica is dialled again after */
#define MEMBERS_NS 1000000000ull        /* the shard's members asked again after */

static bool live(const struct kv_replicas *r, unsigned i)
{
    return r->s[i] && tern_session_status(r->s[i]) == 0;
}

/* Take the next live replica after `from` for the primary, passing over
 * suspects if another will do; false if none. */
static bool move_on(struct tern_kv *kv, unsigned from)
{
    struct kv_replicas *r = kv->rep;
    uint64_t now = tern_now_ns();

    for (int pass = 0; pass < 2; pass++)
        for (unsigned k = 1; k <= r->n; k++) {
            unsigned i = (from + k) % r->n;

            if (live(r, i) && (pass == 1 || now >= r->suspect_until[i])) {
                r->cur = i;
                kv->srv[0].s = r->s[i];
                return true;
            }
        }
    return false;
}

bool kv_replica_retry(struct kv_op *op, int status)
{
    struct tern_kv *kv = op->kv;
    struct kv_replicas *r = kv->rep;
    unsigned at = r->cur;
    struct iovec iov[3];

    if (status != TERN_ENOTPRIMARY && status != TERN_ECONNRESET && status != TERN_ENOTCONN &&
        status != TERN_ECANCELED && status != TERN_ETIMEDOUT)
        return false;
    if (op->tries >= 2 * r->n || r->closing)
        return false;
    op->tries++;
    if (op->hdr.flags & KV_F_READ_ANY) {
        /* A GET any replica could answer: this one could not (it is being
         * copied, or gone). The primary can; its own refusal then moves
         * the client on as for any call. */
        op->hdr.flags &= (uint16_t)~KV_F_READ_ANY;
        if (status != TERN_ETIMEDOUT && op->to != kv->srv[0].s && kv->srv[0].s &&
            live(r, at)) {
            op->to = kv->srv[0].s;
            goto send;
        }
    }
    if (status == TERN_ETIMEDOUT)
        for (unsigned i = 0; i < r->n; i++)
            if (r->s[i] && r->s[i] == op->to) {
                r->suspect_until[i] = tern_now_ns() + kv->timeout;
                if (i == at)
                    kv->srv[0].s = NULL;        /* move on from it */
            }
    /* Someone else may have moved on already (an earlier call's refusal):
     * take the replica in use now unless it is the one that refused. */
    if (kv->srv[0].s == NULL || status == TERN_ENOTPRIMARY || !live(r, at)) {
        if (!move_on(kv, at))
            return false;
    }
    op->to = kv->srv[0].s;
send:
    iov[0] = (struct iovec){.iov_base = &op->hdr, .iov_len = sizeof(op->hdr)};
    iov[1] = (struct iovec){.iov_base = (void *)op->key, .iov_len = op->klen};
    iov[2] = (struct iovec){.iov_base = (void *)op->val, .iov_len = op->vlen};
    return tern_callv(op->to, TERN_KV_SERVICE_ID, op->method, iov, op->vlen ? 3 : 2,
                      kv->timeout, kv_op_done, op, NULL) == 0;
}

/* "host:port" of a URI ("tcp://host:port" or a bare address). */
static const char *addr_of(const char *uri)
{
    const char *sep = strstr(uri, "://");

    return sep ? sep + 3 : uri;
}

/* A replica's word on the shard's members: dial those not known. */
static void on_members(void *arg, int status, const void *reply, size_t len)
{
    struct tern_kv *kv = arg;
    struct kv_replicas *r = kv->rep;
    const char *p = reply, *end = p + len;

    if (!r || r->closing)
        return;
    r->members_asked = false;
    if (status < 0)
        return;
    while (p < end) {
        const char *z = memchr(p, 0, (size_t)(end - p));
        size_t n = z ? (size_t)(z - p) : 0;
        char uri[256];
        bool known = false;
        int w;

        if (!z)
            return;                     /* not NUL-terminated: not a member list */
        for (unsigned i = 0; i < r->n && n; i++)
            known |= strcmp(addr_of(r->uris[i]), p) == 0;
        /* The scheme of the replicas the application named. */
        w = snprintf(uri, sizeof(uri), "%.*s%s", (int)(addr_of(r->uris[0]) - r->uris[0]),
                     r->uris[0], p);
        if (!known && n && !memchr(p, '/', n) && w > 0 && (size_t)w < sizeof(uri) &&
            r->n < KV_REPLICAS_MAX) {
            snprintf(r->uris[r->n], sizeof(r->uris[0]), "%s", uri);
            r->s[r->n] = NULL;
            r->retry_at[r->n] = 0;
            r->suspect_until[r->n] = 0;
            r->n++;
            tern_log(TERN_LOG_INFO, "kv", "replica %s: learned from the shard's map", uri);
        }
        p = z + 1;
    }
}

void kv_replicas_mend(struct tern_kv *kv)
{
    struct kv_replicas *r = kv->rep;
    uint64_t now = tern_now_ns();

    for (unsigned i = 0; i < r->n; i++) {
        if (live(r, i) || now < r->retry_at[i] ||
            (r->s[i] && tern_session_status(r->s[i]) == TERN_EINPROGRESS))
            continue;
        if (r->s[i]) {
            if (kv->srv[0].s == r->s[i])
                kv->srv[0].s = NULL;
            tern_rpc_disconnect(r->s[i]);
            r->s[i] = NULL;
        }
        /* Never waits: a replica that is stopped or cut off must not hold
         * up the calls to the others; it counts once its handshake is done. */
        if (tern_rpc_connect_start(kv->ep, r->uris[i], r->connect_ns, &r->s[i]) < 0)
            r->s[i] = NULL;
        r->retry_at[i] = tern_now_ns() + RETRY_NS;
    }
    if (!kv->srv[0].s || !live(r, r->cur))
        move_on(kv, r->cur + r->n - 1);
    if (!r->members_asked && now >= r->members_at && live(r, r->cur)) {
        r->members_at = now + MEMBERS_NS;
        if (tern_call(r->s[r->cur], TERN_KV_SERVICE_ID, KV_M_MEMBERS, NULL, 0, kv->timeout,
                      on_members, kv, NULL) == 0)
            r->members_asked = true;
    }
}

struct tern_session *kv_replica_reader(struct tern_kv *kv)
{
    struct kv_replicas *r = kv->rep;
    uint64_t now = tern_now_ns();

    for (unsigned k = 1; k <= r->n; k++) {
        unsigned i = (r->reader + k) % r->n;

        if (live(r, i) && now >= r->suspect_until[i]) {
            r->reader = i;
            return r->s[i];
        }
    }
    return NULL;
}

void kv_replicas_free(struct tern_kv *kv)
{
    kv->rep->closing = true;
    for (unsigned i = 0; i < kv->rep->n; i++)
        if (kv->rep->s[i])
            tern_rpc_disconnect(kv->rep->s[i]);
    free(kv->rep);
    kv->rep = NULL;
}

int tern_kv_open_replicas(struct tern_rpc_ep *ep, const char *const *uris, unsigned n,
                          uint64_t timeout_ns, struct tern_kv **out)
{
    struct tern_kv *kv;
    struct kv_replicas *r;
    unsigned up = 0;

    if (!ep || !uris || !n || n > KV_REPLICAS_MAX || !out)
        return TERN_EINVAL;
    for (unsigned i = 0; i < n; i++)
        if (!uris[i] || strlen(uris[i]) >= sizeof(r->uris[0]))
            return TERN_EINVAL;
    kv = calloc(1, sizeof(*kv));
    r = calloc(1, sizeof(*r));
    if (kv)
        kv->srv = calloc(1, sizeof(*kv->srv));
    if (!kv || !r || !kv->srv) {
        if (kv)
            free(kv->srv);
        free(kv);
        free(r);
        return TERN_ENOMEM;
    }
    kv->ep = ep;
    kv->timeout = 5000000000ull;
    kv->rep = r;
    kv->n = 1;
    kv->srv[0] = (struct kv_server){.kv = kv, .lo = 0, .hi = UINT32_MAX};
    for (uint32_t i = KV_OPS; i > 0; i--)
        kv_op_put(kv, &kv->ops[i - 1]);
    r->n = n;
    r->connect_ns = timeout_ns ? timeout_ns : 2000000000ull;
    for (unsigned i = 0; i < n; i++) {
        snprintf(r->uris[i], sizeof(r->uris[i]), "%s", uris[i]);
        if (tern_rpc_connect(ep, uris[i], r->connect_ns, &r->s[i]) < 0) {
            tern_log(TERN_LOG_WARN, "kv", "replica %s: not reachable now", uris[i]);
            r->s[i] = NULL;
            r->retry_at[i] = tern_now_ns() + RETRY_NS;
        } else {
            up++;
        }
    }
    if (!up) {
        tern_log(TERN_LOG_ERROR, "kv", "no replica of the shard answers");
        tern_kv_close(kv);
        return TERN_ECONNREFUSED;
    }
    move_on(kv, n - 1);
    *out = kv;
    return 0;
}

int tern_kv_set_read_from(struct tern_kv *kv, enum tern_kv_read_from from)
{
    if (!kv || (from != TERN_KV_READ_PRIMARY && from != TERN_KV_READ_ANY))
        return TERN_EINVAL;
    kv->read_any = from == TERN_KV_READ_ANY;
    return 0;
}

int tern_kv_set_write_concern(struct tern_kv *kv, enum tern_kv_write_concern w)
{
    if (!kv)
        return TERN_EINVAL;
    switch (w) {
    case TERN_KV_W_MAJORITY: kv->w_flags = 0; return 0;
    case TERN_KV_W_ONE: kv->w_flags = KV_F_W_ONE; return 0;
    case TERN_KV_W_ALL: kv->w_flags = KV_F_W_ALL; return 0;
    }
    return TERN_EINVAL;
}
