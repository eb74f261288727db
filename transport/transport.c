/* The fabric-independent core: validates arguments, fills config defaults and
 * dispatches to the fabric's ops, answering TERN_ENOTSUP for missing ones. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "tern_config.h"
#include "cfg.h"
#include "transport_internal.h"

/* tern 0.1's struct tern_tp_config (see cfg.h). */
#define TERN_TP_CONFIG_V0_1 sizeof(struct tern_tp_config)

static const struct tern_tp_fabric *const fabrics[] = {
    &tp_fabric_tcp,
    &tp_fabric_shm,
    &tp_fabric_ntb,
#if TERN_HAVE_RDMA
    &tp_fabric_rdma,
#endif
};

#define N_FABRICS (sizeof(fabrics) / sizeof(fabrics[0]))

static const char *fabric_names[N_FABRICS + 1];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void names_init(void)
{
    for (size_t i = 0; i < N_FABRICS; i++)
        fabric_names[i] = fabrics[i]->name;
}

const char *const *tern_tp_fabric_names(void)
{
    pthread_once(&names_once, names_init);
    return fabric_names;
}

const struct tern_tp_fabric *tp_fabric_find(const char *name)
{
    for (size_t i = 0; i < N_FABRICS; i++)
        if (name && strcmp(fabrics[i]->name, name) == 0)
            return fabrics[i];
    return NULL;
}

const struct tern_tp_fabric *tp_fabric_of(const char *uri)
{
    const char *sep = uri ? strstr(uri, "://") : NULL;

    for (size_t i = 0; sep && i < N_FABRICS; i++)
        if (strlen(fabrics[i]->name) == (size_t)(sep - uri) &&
            strncmp(fabrics[i]->name, uri, (size_t)(sep - uri)) == 0)
            return fabrics[i];
    return NULL;
}

int tern_tp_uri_fabric(const char *uri)
{
    const char *sep = uri ? strstr(uri, "://") : NULL;
    const struct tern_tp_fabric *f = tp_fabric_of(uri);

    if (!sep || sep == uri || !sep[3])
        return TERN_EBADADDR;
    for (size_t i = 0; f && i < N_FABRICS; i++)
        if (fabrics[i] == f)
            return (int)i;
    return TERN_ENOFABRIC;
}

int tern_tp_fabric_id(const struct tern_tp_ep *ep)
{
    for (size_t i = 0; i < N_FABRICS; i++)
        if (fabrics[i] == ep->fabric)
            return (int)i;
    return TERN_ENOFABRIC;     /* a test's own table (tp_open_fabric) */
}

bool tern_tp_selectable(const struct tern_tp_ep *ep)
{
    return ep->fabric->reachable != NULL;
}

int tern_tp_probe(const char *fabric, const char *args, char *desc, size_t desc_len)
{
    const struct tern_tp_fabric *f = tp_fabric_find(fabric);
    char tmp[8];

    if (!fabric)
        return TERN_EINVAL;
    if (!desc || !desc_len) {
        desc = tmp;
        desc_len = sizeof(tmp);
    }
    if (!f) {
        snprintf(desc, desc_len, "not built in");
        return TERN_ENOFABRIC;
    }
    if (!f->probe) {
        snprintf(desc, desc_len, "always available");
        return 0;
    }
    return f->probe(args, desc, desc_len);
}

uint32_t tern_tp_fabric_caps(const char *fabric)
{
    const struct tern_tp_fabric *f = tp_fabric_find(fabric);

    return f ? f->caps : 0;
}

int tern_tp_local_uri(const char *fabric, const char *tag, char *uri, size_t len)
{
    const struct tern_tp_fabric *f = tp_fabric_find(fabric);
    int n;

    if (!f || !f->local_addr)
        return TERN_ENOFABRIC;
    if (!uri)
        return TERN_EINVAL;
    n = snprintf(uri, len, "%s://", f->name);
    if (n < 0 || (size_t)n >= len)
        return TERN_EINVAL;
    return f->local_addr(tag, uri + n, len - (size_t)n);
}

const char *tern_tp_uri_label(const char *uri, char *buf, size_t len)
{
    const struct tern_tp_fabric *f = tp_fabric_of(uri);

    if (!f)
        snprintf(buf, len, "?");
    else if (f->emulated && f->emulated(uri + strlen(f->name) + 3))
        snprintf(buf, len, "%s-emu", f->name);
    else
        snprintf(buf, len, "%s", f->name);
    return buf;
}

void tern_tp_sweep(void)
{
    for (size_t i = 0; i < N_FABRICS; i++)
        if (fabrics[i]->sweep)
            fabrics[i]->sweep();
}

/* Let go of a region's file, and of its memory if it is ours. Peers keep
 * their own mapping of the file until they learn the key is gone: a store
 * of theirs that raced with this lands in pages this process no longer
 * maps (tern_tp_mr_alloc), or in the caller's own (tern_tp_mr_reg_fd: the
 * caller was told so). */
static void mr_release(struct tern_tp_mr *mr)
{
    if (mr->owns_map)
        munmap(mr->addr, mr->map_len);
    if (mr->fd >= 0)
        close(mr->fd);
    mr->fd = -1;
    mr->owns_map = false;
}

bool tp_caps_match_ops(const struct tern_tp_fabric *f)
{
    const struct tern_tp_ops *o = f->ops;
    const struct {
        uint32_t cap;
        bool has;
    } rows[] = {
        {TERN_TP_CAP_MSG, o->msg_alloc && o->msg_post && o->msg_release && o->msg_abort},
        {TERN_TP_CAP_PUT, o->put != NULL},
        {TERN_TP_CAP_GET, o->get != NULL},
        {TERN_TP_CAP_WAIT_FD, o->wait_fd && o->arm && o->wait},
        {TERN_TP_CAP_LISTEN, o->listen != NULL},
        {TERN_TP_CAP_CONNECT, o->connect != NULL},
        {TERN_TP_CAP_RKEY_PTR, o->rkey_ptr != NULL},
    };

    if (!o->poll)
        return false;   /* every fabric must report events */
    if ((f->caps & TERN_TP_CAP_RMA_OFFLOAD) && !(o->put && o->get))
        return false;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (!!(f->caps & rows[i].cap) != rows[i].has)
            return false;
    return true;
}

int tern_tp_open(const struct tern_tp_config *cfg, struct tern_tp_ep **out)
{
    const struct tern_tp_fabric *f;

    if (!cfg || !out)
        return TERN_EINVAL;
    *out = NULL;
    f = tp_fabric_find(cfg->fabric);
    if (!f)
        return TERN_ENOFABRIC;
    return tp_open_fabric(f, cfg, out);
}

int tp_open_fabric(const struct tern_tp_fabric *f, const struct tern_tp_config *cfg,
                        struct tern_tp_ep **out)
{
    struct tern_tp_ep *ep;
    int rc;

    if (!f || !cfg || !out || f->ep_size < sizeof(struct tern_tp_ep))
        return TERN_EINVAL;
    *out = NULL;
    if (!tp_caps_match_ops(f))
        return TERN_EINVAL;
    ep = calloc(1, f->ep_size);
    if (!ep)
        return TERN_ENOMEM;
    ep->fabric = f;
    tp_cfg_copy(&ep->cfg, sizeof(ep->cfg), cfg, TERN_TP_CONFIG_V0_1);
    if (!ep->cfg.max_msg)
        ep->cfg.max_msg = 1u << 20;
    if (!ep->cfg.conn_buf)
        ep->cfg.conn_buf = 4 * ep->cfg.max_msg;
    if (ep->cfg.conn_buf < ep->cfg.max_msg + 64) {
        free(ep);
        return TERN_EINVAL;
    }
    if (!ep->cfg.max_conns)
        ep->cfg.max_conns = 4096;
    if (getrandom(&ep->mr_nonce, sizeof(ep->mr_nonce), 0) != sizeof(ep->mr_nonce))
        ep->mr_nonce = (uint32_t)(uintptr_t)ep;
    rc = f->ops->ep_open ? f->ops->ep_open(ep) : 0;
    if (rc < 0) {
        free(ep);
        return rc;
    }
    *out = ep;
    return 0;
}

void tern_tp_close(struct tern_tp_ep *ep)
{
    if (!ep)
        return;
    if (ep->fabric->ops->ep_close)
        ep->fabric->ops->ep_close(ep);
    /* Memory from tern_tp_mr_alloc still registered goes with the endpoint;
     * a caller's mapping (tern_tp_mr_reg_fd) stays, its file is let go. */
    for (unsigned i = 0; i < TERN_MR_MAX; i++)
        if (ep->mrs[i].in_use)
            mr_release(&ep->mrs[i]);
    free(ep);
}

uint32_t tern_tp_caps(const struct tern_tp_ep *ep)
{
    return ep->fabric->caps;
}

const char *tern_tp_fabric(const struct tern_tp_ep *ep)
{
    return ep->fabric->name;
}

size_t tern_tp_max_msg(const struct tern_tp_ep *ep)
{
    return ep->cfg.max_msg;
}

#define OPS(ep) ((ep)->fabric->ops)

int tern_tp_listen(struct tern_tp_ep *ep, const char *addr, char *bound, size_t bound_len)
{
    if (!addr)
        return TERN_EINVAL;
    if (!OPS(ep)->listen)
        return TERN_ENOTSUP;
    return OPS(ep)->listen(ep, addr, bound, bound_len);
}

int tern_tp_connect(struct tern_tp_ep *ep, const char *addr, struct tern_tp_conn **out)
{
    if (!addr || !out)
        return TERN_EINVAL;
    if (!OPS(ep)->connect)
        return TERN_ENOTSUP;
    return OPS(ep)->connect(ep, addr, out);
}

void tern_tp_disconnect(struct tern_tp_conn *conn)
{
    if (conn && OPS(conn->ep)->disconnect)
        OPS(conn->ep)->disconnect(conn);
}

void tern_tp_conn_set_user(struct tern_tp_conn *conn, void *user)
{
    conn->user = user;
}

void *tern_tp_conn_user(const struct tern_tp_conn *conn)
{
    return conn->user;
}

struct tern_tp_ep *tern_tp_conn_ep(const struct tern_tp_conn *conn)
{
    return conn->ep;
}

const char *tern_tp_conn_peer(const struct tern_tp_conn *conn)
{
    return OPS(conn->ep)->conn_peer ? OPS(conn->ep)->conn_peer(conn) : "?";
}

void tern_tp_ep_gate_rma(struct tern_tp_ep *ep)
{
    ep->rma_gated = true;
}

void tern_tp_conn_open_rma(struct tern_tp_conn *conn)
{
    conn->rma_shut = false;
}

bool tern_tp_conn_rma_open(const struct tern_tp_conn *conn)
{
    return !conn->rma_shut;
}

bool tern_tp_conn_local(const struct tern_tp_conn *conn)
{
    return OPS(conn->ep)->conn_local && OPS(conn->ep)->conn_local(conn);
}

size_t tern_tp_rma_max(const struct tern_tp_conn *conn)
{
    size_t max = conn->ep->cfg.max_msg;

    if (!OPS(conn->ep)->put && !OPS(conn->ep)->get)
        return 0;
    if (OPS(conn->ep)->rma_max) {
        size_t own = OPS(conn->ep)->rma_max(conn);

        max = own < max ? own : max;
    }
    return max;
}

int tern_tp_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf)
{
    if (!buf)
        return TERN_EINVAL;
    if (!OPS(conn->ep)->msg_alloc)
        return TERN_ENOTSUP;
    if (len > conn->ep->cfg.max_msg)
        return TERN_EMSGSIZE;
    return OPS(conn->ep)->msg_alloc(conn, len, buf);
}

int tern_tp_msg_post(struct tern_tp_conn *conn, void *buf, size_t len)
{
    if (!OPS(conn->ep)->msg_post)
        return TERN_ENOTSUP;
    return OPS(conn->ep)->msg_post(conn, buf, len);
}

void tern_tp_msg_abort(struct tern_tp_conn *conn, void *buf)
{
    if (OPS(conn->ep)->msg_abort)
        OPS(conn->ep)->msg_abort(conn, buf);
}

int tern_tp_msg_send(struct tern_tp_conn *conn, const void *data, size_t len)
{
    void *buf;
    int rc = tern_tp_msg_alloc(conn, len, &buf);

    if (rc < 0)
        return rc;
    if (len)
        memcpy(buf, data, len);
    return tern_tp_msg_post(conn, buf, len);
}

void tern_tp_msg_release(struct tern_tp_conn *conn, const void *view)
{
    if (OPS(conn->ep)->msg_release)
        OPS(conn->ep)->msg_release(conn, view);
}

/* Take a free region slot for `tmpl` (addr, len, access and the file
 * fields); not yet published. */
static int mr_take(struct tern_tp_ep *ep, const struct tern_tp_mr *tmpl, struct tern_tp_mr **out)
{
    for (uint32_t i = 0; i < TERN_MR_MAX; i++) {
        struct tern_tp_mr *mr = &ep->mrs[i];

        if (mr->in_use)
            continue;
        /* The key carries the slot in its low bits and a fresh random nonce
         * above them, so a stale or guessed key rarely matches (and fabrics
         * hang up on peers that keep guessing). A NIC fabric replaces it
         * with the device's rkey when it publishes the region. */
        if (getrandom(&ep->mr_nonce, sizeof(ep->mr_nonce), 0) != sizeof(ep->mr_nonce))
            ep->mr_nonce = ep->mr_nonce * 1664525u + 1013904223u;
        *mr = *tmpl;
        mr->ep = ep;
        mr->in_use = true;
        mr->key = (ep->mr_nonce & ~(uint32_t)(TERN_MR_MAX - 1)) | i;
        *out = mr;
        return 0;
    }
    return TERN_ENOBUFS;
}

/* Let the fabric publish a region just taken; on failure free the slot. */
static int mr_publish(struct tern_tp_mr *mr)
{
    int rc = OPS(mr->ep)->mr_publish ? OPS(mr->ep)->mr_publish(mr->ep, mr, true) : 0;

    if (rc < 0)
        *mr = (struct tern_tp_mr){.fd = -1};
    return rc;
}

int tern_tp_mr_reg(struct tern_tp_ep *ep, void *addr, size_t len, uint32_t access,
                   struct tern_tp_mr **out)
{
    int rc;

    if (!out || (!addr && len) || (access & ~3u))
        return TERN_EINVAL;
    rc = mr_take(ep, &(struct tern_tp_mr){.addr = addr, .len = len, .access = access, .fd = -1},
                 out);
    if (rc == 0 && (rc = mr_publish(*out)) < 0)
        *out = NULL;
    return rc;
}

int tern_tp_mr_alloc(struct tern_tp_ep *ep, size_t len, uint32_t access,
                     struct tern_tp_mr **out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), map_len = (len + page - 1) & ~(page - 1);
    void *p = MAP_FAILED;
    int fd, rc;

    if (!out || !len || (access & ~3u) || len > ((size_t)1 << 40))
        return TERN_EINVAL;
    /* A memfd sealed at its size: a peer that maps it can never be made to
     * fault by a later truncation. */
    fd = memfd_create("tern-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return TERN_ENOMEM;
    if (ftruncate(fd, (off_t)map_len) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 ||
        (p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        close(fd);
        return TERN_ENOMEM;
    }
    rc = mr_take(ep,
                 &(struct tern_tp_mr){.addr = p, .len = len, .access = access, .fd = fd,
                                      .map_len = map_len, .owns_map = true},
                 out);
    if (rc == 0 && (rc = mr_publish(*out)) < 0)
        *out = NULL;
    if (rc < 0) {
        munmap(p, map_len);
        close(fd);
    }
    return rc;
}

int tern_tp_mr_reg_fd(struct tern_tp_ep *ep, void *addr, size_t len, int fd, uint64_t fd_off,
                      uint32_t access, struct tern_tp_mr **out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), map_len = (len + page - 1) & ~(page - 1);
    int rc, dup;

    /* addr maps a page-aligned file offset, so it is page aligned too. */
    if (!out || !addr || !len || fd < 0 || (access & ~3u) || fd_off % page ||
        (uintptr_t)addr % page || map_len < len || fd_off > (uint64_t)INT64_MAX - map_len)
        return TERN_EINVAL;
    /* Our own descriptor: the caller may close theirs, and fabrics that let
     * peers map the file hand this one out. */
    dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
        return errno == EBADF ? TERN_EINVAL : TERN_ENOMEM;     /* out of descriptors */
    rc = mr_take(ep,
                 &(struct tern_tp_mr){.addr = addr, .len = len, .access = access, .fd = dup,
                                      .fd_off = fd_off, .map_len = map_len},
                 out);
    if (rc == 0 && (rc = mr_publish(*out)) < 0)
        *out = NULL;
    if (rc < 0)
        close(dup);
    return rc;
}

int tern_tp_rkey_ptr(struct tern_tp_conn *conn, const struct tern_tp_rkey *rkey, uint64_t roff,
                     size_t len, uint32_t need, void **ptr)
{
    if (ptr)
        *ptr = NULL;
    if (!conn)
        return TERN_EINVAL;
    if (!OPS(conn->ep)->rkey_ptr)
        return TERN_ENOTSUP;
    if (!rkey || !ptr || !len || (need & ~3u))
        return TERN_EINVAL;
    return OPS(conn->ep)->rkey_ptr(conn, rkey, roff, len, need, ptr);
}

void *tern_tp_mr_addr(const struct tern_tp_mr *mr)
{
    return mr ? mr->addr : NULL;
}

int tern_tp_mr_dereg(struct tern_tp_mr *mr)
{
    if (!mr || !mr->in_use)
        return TERN_EINVAL;
    if (OPS(mr->ep)->mr_publish)
        OPS(mr->ep)->mr_publish(mr->ep, mr, false);
    mr_release(mr);
    mr->in_use = false;
    mr->key = 0;
    mr->fab = NULL;
    return 0;
}

struct tern_tp_rkey tern_tp_mr_rkey(const struct tern_tp_mr *mr)
{
    return (struct tern_tp_rkey){
        .addr = (uint64_t)(uintptr_t)mr->addr, .len = mr->len,
        .key = mr->key, .access = mr->access,
    };
}

int tern_tp_conn_mr_rkey(struct tern_tp_conn *conn, struct tern_tp_mr *mr,
                         struct tern_tp_rkey *out)
{
    if (!conn || !mr || !out || !mr->in_use || mr->ep != conn->ep)
        return TERN_EINVAL;
    if (conn->rma_shut)
        return TERN_EAUTH;
    if (!OPS(conn->ep)->conn_rkey) {
        *out = tern_tp_mr_rkey(mr);
        return 0;
    }
    return OPS(conn->ep)->conn_rkey(conn, mr, out);
}

int tp_mr_check(struct tern_tp_conn *conn, uint32_t key, uint64_t off, uint64_t len,
                     uint32_t need, uint8_t **where)
{
    struct tern_tp_mr *mr = &conn->ep->mrs[key & (TERN_MR_MAX - 1)];

    if (conn->rma_shut)              /* not authenticated (yet): no window */
        return TERN_EREMACCESS;
    if (!mr->in_use || mr->key != key || (mr->access & need) != need)
        return TERN_EREMACCESS;
    if (off > mr->len || len > mr->len - off)
        return TERN_EREMACCESS;
    *where = mr->addr + off;
    return 0;
}

/* Check what the core can check for a one-sided operation: the op exists,
 * the remote key is there, and the local range lies in a region of this
 * endpoint. *p points at the local bytes. */
static int onesided_args(struct tern_tp_conn *conn, bool has_op, struct tern_tp_mr *lmr,
                         size_t loff, size_t len, const struct tern_tp_rkey *rkey, uint8_t **p)
{
    if (!has_op)
        return TERN_ENOTSUP;
    if (!rkey || !lmr || !lmr->in_use || lmr->ep != conn->ep)
        return TERN_EINVAL;
    if (loff > lmr->len || len > lmr->len - loff)
        return TERN_ERANGE;
    if (len == 0 || len > conn->ep->cfg.max_msg)
        return len ? TERN_EMSGSIZE : TERN_EINVAL;
    *p = lmr->addr + loff;
    return 0;
}

int tern_tp_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, size_t loff, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    uint8_t *src;
    int rc = onesided_args(conn, OPS(conn->ep)->put, lmr, loff, len, rkey, &src);

    return rc < 0 ? rc : OPS(conn->ep)->put(conn, lmr, src, len, rkey, roff, token);
}

int tern_tp_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, size_t loff, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token)
{
    uint8_t *dst;
    int rc = onesided_args(conn, OPS(conn->ep)->get, lmr, loff, len, rkey, &dst);

    return rc < 0 ? rc : OPS(conn->ep)->get(conn, lmr, dst, len, rkey, roff, token);
}

int tern_tp_poll(struct tern_tp_ep *ep, struct tern_tp_event *ev, int max)
{
    if (!ev || max <= 0)
        return TERN_EINVAL;
    if (!OPS(ep)->poll)
        return TERN_ENOTSUP;
    return OPS(ep)->poll(ep, ev, max);
}

int tern_tp_flush(struct tern_tp_ep *ep)
{
    return OPS(ep)->flush ? OPS(ep)->flush(ep) : 0;
}

int tern_tp_wait_fd(struct tern_tp_ep *ep)
{
    return OPS(ep)->wait_fd ? OPS(ep)->wait_fd(ep) : TERN_ENOTSUP;
}

int tern_tp_arm(struct tern_tp_ep *ep)
{
    return OPS(ep)->arm ? OPS(ep)->arm(ep) : TERN_ENOTSUP;
}

int tern_tp_wait(struct tern_tp_ep *ep, int64_t timeout_ns)
{
    int ms = timeout_ns < 0                          ? -1
             : timeout_ns >= (int64_t)INT32_MAX * 1000000 ? INT32_MAX
                                                      : (int)((timeout_ns + 999999) / 1000000);

    return OPS(ep)->wait ? OPS(ep)->wait(ep, ms) : TERN_ENOTSUP;
}
