/* Direct one-sided access on shm links: put and get as plain stores and
 * loads into the peer's memory, with no help from the peer's CPU, and
 * tern_tp_rkey_ptr, which hands the caller a pointer into that memory.
 *
 * Memory from tern_tp_mr_alloc is a memfd sealed at its size; memory from
 * tern_tp_mr_reg_fd is a range of the caller's file. The first time this
 * side uses a key of the peer's, that operation goes the served way (a CTL
 * record the peer's poll answers; rkey_ptr says TERN_EAGAIN) and this side
 * also asks the peer, over the link socket, for the region's file. The peer
 * answers with it, its offset, and its table of published regions; this
 * side maps both. From then on an operation on that key is a memcpy, after
 * one load that checks the key is still published (and a completion
 * reported in order with the operations before it).
 *
 * Which files are handed out, and to whom:
 * - shared memory sealed against shrinking (every tern_tp_mr_alloc memfd, a
 *   caller's memfd that lets itself be sealed) goes to any peer: it can
 *   never shrink under the peer's mapping and make it fault;
 * - any other regular file (a pool file; tmpfs files cannot be sealed) only
 *   to a peer of our own user, as told by the link socket (SO_PEERCRED).
 *   Such a peer could open the file anyway, so this grants nothing new; and
 *   the peer, which could be made to fault by a truncation, accepts plain
 *   files only from a peer of its own user, which could kill it anyway.
 *   Other peers' operations on it stay served;
 * - a region without remote read is never handed out (x86 has no
 *   write-only mapping): its operations stay served.
 *
 * What the kernel enforces and what the key check does:
 * - a region without remote write can only be mapped read-only by a peer:
 *   shared memory is sealed against writable mappings
 *   (F_SEAL_FUTURE_WRITE), a plain file is handed out through a read-only
 *   descriptor;
 * - the owner deregistering unpublishes the key. Memory of
 *   tern_tp_mr_alloc is unmapped: a store that raced with that lands in
 *   pages only the peer still maps, never in memory the owner uses
 *   afterwards. A caller's file stays the caller's, and so do such stores.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "log.h"
#include "shm_internal.h"

#define LOG_WHO "shm"
#define MRTAB_BYTES (TERN_MR_MAX * sizeof(struct shm_mrpub))
#define MAP_REFUSALS_MAX 64     /* refused map requests before a link is ignored */

enum {
    RMAP_NONE,
    RMAP_ASKED,     /* a map request is out */
    RMAP_MAPPED,
    RMAP_NO,        /* the key is good, but the region is not for us to map */
    RMAP_REFUSED,   /* a bad key, or one withdrawn since */
};

/* What this side knows of one of the peer's regions. */
struct shm_rmap {
    uint32_t key, access;
    uint8_t state;
    uint32_t waits;     /* uses while the answer is awaited */
    uint8_t *base;
    size_t len, map_len;
};

#define MAP_ASK_AGAIN 4096  /* uses without an answer before asking again */

/* A map request ('M') or answer ('A') on the link socket. An answer's
 * status: 0 (the region's file comes with it), TERN_EREMACCESS (no such
 * key) or TERN_ENOTSUP (a good key, not for this peer to map). */
struct map_msg {
    uint8_t type;
    uint8_t pad[3];
    uint32_t key;
    int32_t status;
    uint32_t access;
    uint64_t len, map_len;
    uint64_t fd_off;    /* where the region starts in the file */
};

_Static_assert(sizeof(struct map_msg) == 40, "map_msg is 40 bytes on the socket");

int shm_direct_ep_open(struct shm_ep *ep)
{
    void *p;

    ep->tab_fd = memfd_create("tern-mrtab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ep->tab_fd < 0)
        return -errno;
    if (ftruncate(ep->tab_fd, MRTAB_BYTES) < 0 ||
        fcntl(ep->tab_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
        return -errno;
    p = mmap(NULL, MRTAB_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, ep->tab_fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    ep->tab = p;
    /* Peers get the table sealed against writable mappings. */
    if (fcntl(ep->tab_fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0)
        return -errno;
    return 0;
}

void shm_direct_ep_close(struct shm_ep *ep)
{
    if (ep->tab) {
        /* Peers that still map the table stop using our keys now. */
        for (unsigned i = 0; i < TERN_MR_MAX; i++)
            __atomic_store_n(&ep->tab[i].key, 0, __ATOMIC_RELEASE);
        munmap(ep->tab, MRTAB_BYTES);
    }
    if (ep->tab_fd >= 0)
        close(ep->tab_fd);
    ep->tab = NULL;
    ep->tab_fd = -1;
}

/* Seal shared memory so that peers of any user may map it: it never
 * shrinks under their mapping, and a region without remote write is never
 * mapped writable again (our own mapping, made before, stays writable).
 * A file that cannot be sealed is left alone: only peers of our user map
 * it (handout). Only our own memfds get F_SEAL_SEAL: a caller's file stays
 * free for seals of its own. */
static void seal_for_peers(const struct tern_tp_mr *mr)
{
    int seals = fcntl(mr->fd, F_GET_SEALS);

    if (seals < 0)
        return;     /* not shared memory */
    if ((~seals & (F_SEAL_SHRINK | F_SEAL_GROW)) &&
        fcntl(mr->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
        return;
    if (!(mr->access & TERN_TP_ACCESS_REMOTE_WRITE))
        fcntl(mr->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE);
    if (mr->owns_map)
        fcntl(mr->fd, F_ADD_SEALS, F_SEAL_SEAL);
}

int shm_direct_publish(struct tern_tp_ep *base, struct tern_tp_mr *mr, bool up)
{
    struct shm_ep *ep = SHEP(base);
    struct shm_mrpub *e;

    /* Without a table there is no direct access; memory from tern_tp_mr_reg
     * has no file a peer could map. */
    if (!ep->tab || mr->fd < 0)
        return 0;
    e = &ep->tab[mr->key & (TERN_MR_MAX - 1)];
    if (!up) {
        __atomic_store_n(&e->key, 0, __ATOMIC_RELEASE);
        return 0;
    }
    e->access = mr->access;
    e->len = mr->len;
    __atomic_store_n(&e->key, mr->key, __ATOMIC_RELEASE);
    seal_for_peers(mr);
    return 0;
}

/* Is the process at the other end of the link socket of our user? (Its
 * credentials as of its connect or listen.) */
static bool peer_same_uid(const struct shm_link *l)
{
    struct ucred cr;
    socklen_t n = sizeof(cr);

    return l->r.obj.fd >= 0 && getsockopt(l->r.obj.fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) == 0 &&
           n == sizeof(cr) && cr.uid == geteuid();
}

/* The descriptor through which the peer of `l` may map `mr`, or -1 if it
 * may not (its operations on it stay served). *opened: the descriptor was
 * opened for this answer, to be closed after it. */
static int handout(const struct shm_link *l, const struct tern_tp_mr *mr, bool *opened)
{
    bool writable = mr->access & TERN_TP_ACCESS_REMOTE_WRITE;
    char path[40];
    struct stat st;
    int seals, fd;

    *opened = false;
    if (mr->fd < 0 || !(mr->access & TERN_TP_ACCESS_REMOTE_READ))
        return -1;
    /* Sealed shared memory, its seals matching the rights: for anyone. */
    seals = fcntl(mr->fd, F_GET_SEALS);
    if (seals >= 0 && (seals & F_SEAL_SHRINK) &&
        !(seals & (F_SEAL_FUTURE_WRITE | F_SEAL_WRITE)) == writable)
        return mr->fd;
    /* Any other regular file: for a peer of our user only, and without
     * remote write through a descriptor that cannot write, so that its
     * mapping can be read-only only. */
    if (fstat(mr->fd, &st) < 0 || !S_ISREG(st.st_mode) || !peer_same_uid(l))
        return -1;
    if (writable)
        return mr->fd;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", mr->fd);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    *opened = fd >= 0;
    return fd;
}

void shm_direct_link_free(struct shm_link *l)
{
    if (l->rmap)
        for (unsigned i = 0; i < TERN_MR_MAX; i++)
            if (l->rmap[i].state == RMAP_MAPPED)
                munmap(l->rmap[i].base, l->rmap[i].map_len);
    free(l->rmap);
    l->rmap = NULL;
    if (l->peer_tab)
        munmap((void *)l->peer_tab, MRTAB_BYTES);
    l->peer_tab = NULL;
}

static int send_msg(struct shm_link *l, const struct map_msg *m, const int *fds, int nfds)
{
    char cbuf[CMSG_SPACE(2 * sizeof(int))] = {0};
    struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof(*m)};
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1};

    if (nfds) {
        struct cmsghdr *cm;

        h.msg_control = cbuf;
        h.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        cm = CMSG_FIRSTHDR(&h);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    }
    return sendmsg(l->r.obj.fd, &h, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -1;
}

/* The peer asks for one of our regions. */
/* A file goes only to a peer with a connection whose one-sided access is
 * open (tern_tp_conn_open_rma: authenticated, where the endpoint gates). */
static bool trusted(const struct shm_link *l)
{
    if (!l->r.ep->base.rma_gated)
        return true;
    for (uint32_t i = 1; l->r.chan && i < l->r.g.n_chan; i++)
        if (l->r.chan[i] && !l->r.chan[i]->base.rma_shut)
            return true;
    return false;
}

static void on_request(struct shm_link *l, const struct map_msg *req)
{
    struct tern_tp_ep *base = &l->r.ep->base;
    struct tern_tp_mr *mr = &base->mrs[req->key & (TERN_MR_MAX - 1)];
    struct map_msg ans = {.type = 'A', .key = req->key, .status = TERN_EREMACCESS};
    bool opened;
    int fds[2];

    if (l->map_refusals >= MAP_REFUSALS_MAX)
        return;     /* a peer that keeps guessing keys gets no more answers */
    if (!trusted(l) || !mr->in_use || mr->key != req->key) {
        l->map_refusals++;
        send_msg(l, &ans, NULL, 0);
        return;
    }
    fds[0] = SHEP(l->r.ep)->tab ? handout(l, mr, &opened) : -1;
    if (fds[0] < 0) {
        ans.status = TERN_ENOTSUP;
        send_msg(l, &ans, NULL, 0);
        return;
    }
    ans.status = 0;
    ans.access = mr->access;
    ans.len = mr->len;
    ans.map_len = mr->map_len;
    ans.fd_off = mr->fd_off;
    fds[1] = SHEP(l->r.ep)->tab_fd;
    if (send_msg(l, &ans, fds, 2) < 0)
        tern_log(TERN_LOG_DEBUG, LOG_WHO, "link %s: map answer not sent", l->r.name);
    if (opened)
        close(fds[0]);
}

/* Our table, as a peer hands it over: sealed shared memory. */
static bool sealed_at(int fd, size_t len)
{
    struct stat st;
    struct statfs fs;
    int seals = fcntl(fd, F_GET_SEALS);

    /* Only ordinary shared memory (not hugetlbfs, whose pages can run out
     * under a mapping) that can never shrink under our mapping: either
     * would fault on access. */
    return seals >= 0 && (seals & F_SEAL_SHRINK) && fstatfs(fd, &fs) == 0 &&
           fs.f_type == TMPFS_MAGIC && fstat(fd, &st) == 0 && (size_t)st.st_size >= len;
}

/* May we map the peer's region file up to `end` without ever faulting on
 * access? Shared memory sealed against shrinking, yes. Another regular file
 * could be truncated under us: only a peer of our user (which could kill us
 * anyway) may hand one over. Hugetlbfs pages can run out under a mapping. */
static bool region_file_ok(const struct shm_link *l, int fd, uint64_t end)
{
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat st;
    struct statfs fs;

    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < end ||
        fstatfs(fd, &fs) < 0 || fs.f_type == HUGETLBFS_MAGIC)
        return false;
    if (seals >= 0 && (seals & F_SEAL_SHRINK))
        return fs.f_type == TMPFS_MAGIC;
    return peer_same_uid(l);
}

/* Is the answer's region well formed: a length within its mapping, a
 * page-aligned offset, no overflow? */
static bool answer_sane(const struct map_msg *ans, int nfds)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

    return ans->status == 0 && nfds == 2 && ans->len && ans->len <= ans->map_len &&
           ans->map_len <= ((uint64_t)1 << 46) && ans->fd_off % page == 0 &&
           ans->fd_off <= ((uint64_t)1 << 62);
}

/* The peer answers a request of ours. */
static void on_answer(struct shm_link *l, const struct map_msg *ans, const int *fds, int nfds)
{
    struct shm_rmap *m = l->rmap ? &l->rmap[ans->key & (TERN_MR_MAX - 1)] : NULL;
    int prot;
    void *p;

    if (!m || m->state != RMAP_ASKED || m->key != ans->key)
        return;
    if (ans->status == TERN_EREMACCESS) {
        m->state = RMAP_REFUSED;
        return;
    }
    m->state = RMAP_NO;     /* unless everything below checks out */
    if (!answer_sane(ans, nfds) || !region_file_ok(l, fds[0], ans->fd_off + ans->map_len) ||
        !sealed_at(fds[1], MRTAB_BYTES))
        return;
    if (!l->peer_tab) {
        p = mmap(NULL, MRTAB_BYTES, PROT_READ, MAP_SHARED, fds[1], 0);
        if (p == MAP_FAILED)
            return;
        l->peer_tab = p;
    }
    prot = PROT_READ | (ans->access & TERN_TP_ACCESS_REMOTE_WRITE ? PROT_WRITE : 0);
    p = mmap(NULL, ans->map_len, prot, MAP_SHARED, fds[0], (off_t)ans->fd_off);
    if (p == MAP_FAILED)
        return;
    *m = (struct shm_rmap){.key = ans->key, .access = ans->access, .state = RMAP_MAPPED,
                           .base = p, .len = ans->len, .map_len = ans->map_len};
}

bool shm_direct_on_socket(struct shm_link *l, const void *buf, size_t n, const int *fds,
                          int nfds)
{
    struct map_msg m;

    if (n != sizeof(m))
        return false;
    memcpy(&m, buf, sizeof(m));
    if (m.type == 'M' && !nfds)
        on_request(l, &m);
    else if (m.type == 'A')
        on_answer(l, &m, fds, nfds);
    else
        return false;
    return true;
}

/* What this side knows of the peer's region `key` (NULL without memory):
 * the first use asks for its mapping, every use of a mapped one checks
 * that the peer still publishes the key. */
static struct shm_rmap *rmap_get(struct shm_link *l, uint32_t key)
{
    struct shm_rmap *m;

    if (!l->rmap && !(l->rmap = calloc(TERN_MR_MAX, sizeof(*l->rmap))))
        return NULL;
    m = &l->rmap[key & (TERN_MR_MAX - 1)];
    if (m->key != key) {
        struct map_msg req = {.type = 'M', .key = key};

        if (m->state == RMAP_MAPPED)
            munmap(m->base, m->map_len);
        *m = (struct shm_rmap){.key = key, .state = RMAP_ASKED};
        if (send_msg(l, &req, NULL, 0) < 0)
            m->key = 0;     /* ask again next time */
        return m;
    }
    /* An answer lost (the peer's socket was full) is asked for again. */
    if (m->state == RMAP_ASKED && ++m->waits >= MAP_ASK_AGAIN)
        m->key = 0;
    /* Withdrawn: keys are never reused, so it is refused for good (the
     * served path reports it). */
    if (m->state == RMAP_MAPPED &&
        __atomic_load_n(&l->peer_tab[key & (TERN_MR_MAX - 1)].key, __ATOMIC_ACQUIRE) != key) {
        munmap(m->base, m->map_len);
        *m = (struct shm_rmap){.key = key, .state = RMAP_REFUSED};
    }
    return m;
}

/* Operations of a connection take effect in order: with served ones in
 * flight, a direct store could land before an earlier served one, and a
 * direct load miss it. (Completed direct ones not yet reported count in
 * `done`.) */
static bool served_in_flight(const struct ring_conn *c)
{
    return c->ev.pend_tail - c->ev.pend_head != c->ev.done;
}

int shm_direct(struct ring_conn *c, bool put, void *local, size_t len,
               const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token, size_t max_len)
{
    struct shm_link *l = SHLINK(c->link);
    uint32_t need = put ? TERN_TP_ACCESS_REMOTE_WRITE : TERN_TP_ACCESS_REMOTE_READ;
    struct shm_rmap *m;

    if (!l || c->state != ST_OPEN || l->r.state != LINK_OPEN || !rkey->key)
        return 0;
    m = rmap_get(l, rkey->key);
    /* A refused access takes the served path, which reports and counts it;
     * so does one too large for it, which it refuses the same way whether
     * the region is mapped or not. */
    if (!m || m->state != RMAP_MAPPED || (m->access & need) != need || roff > m->len ||
        len > m->len - roff || len > max_len)
        return 0;
    /* The caller retries after a completion (once, when a stream turns
     * direct, or when it mixes served keys in). */
    if (served_in_flight(c))
        return TERN_EAGAIN;
    if (tp_pend_done(&c->ev, put, len, token, 0) < 0)
        return TERN_EAGAIN;
    if (put)
        memcpy(m->base + roff, local, len);
    else
        memcpy(local, m->base + roff, len);
    /* Stores into the peer's region are visible before anything this side
     * publishes after the completion (a message saying "it is there"). */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    ring_conn_ready(c);
    return 1;
}

int shm_direct_ptr(struct ring_conn *c, const struct tern_tp_rkey *rkey, uint64_t roff,
                   size_t len, uint32_t need, void **ptr)
{
    struct shm_link *l = SHLINK(c->link);
    struct shm_rmap *m;

    if (c->state != ST_OPEN)
        return TERN_ENOTCONN;
    if (!l || l->r.state != LINK_OPEN)
        return TERN_ENOTSUP;
    if (!rkey->key)
        return TERN_EREMACCESS;
    m = rmap_get(l, rkey->key);
    if (!m)
        return TERN_ENOMEM;
    switch (m->state) {
    case RMAP_MAPPED:
        break;
    case RMAP_NO:
        return TERN_ENOTSUP;
    case RMAP_REFUSED:
        return TERN_EREMACCESS;
    default:
        return TERN_EAGAIN;     /* the answer is on its way */
    }
    if ((m->access & need) != need || roff > m->len || len > m->len - roff)
        return TERN_EREMACCESS;
    /* The caller's stores through the pointer could overtake them. */
    if (served_in_flight(c))
        return TERN_EAGAIN;
    *ptr = m->base + roff;
    return 0;
}
