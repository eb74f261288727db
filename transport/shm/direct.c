/* Direct one-sided access on shm links: put and get as plain stores and
 * loads into the peer's memory, with no help from the peer's CPU.
 *
 * Memory from tern_tp_mr_alloc is a memfd sealed at its size. The first
 * time this side uses a key of the peer's, that operation goes the served
 * way (a CTL record the peer's poll answers) and this side also asks the
 * peer, over the link socket, for the region's memfd. The peer answers
 * with it and with its table of published regions; this side maps both.
 * From then on an operation on that key is a memcpy, after one load that
 * checks the key is still published (and a completion reported in order
 * with the operations before it).
 *
 * What the kernel enforces and what the key check does:
 * - a region without remote write is sealed against writable mappings
 *   (F_SEAL_FUTURE_WRITE), so a peer can only ever map it read-only;
 * - a region without remote read is never handed out (x86 has no
 *   write-only mapping): its operations stay served;
 * - the owner deregistering unpublishes the key and unmaps its own view;
 *   a store that raced with that lands in pages only the peer still maps,
 *   never in memory the owner uses afterwards.
 *
 * Links of the ntb fabric keep the served path: their peer is another
 * host, reached through the window only. */
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

#include "../log.h"
#include "shm_internal.h"

#define LOG_WHO "shm"
#define MRTAB_BYTES (TERN_MR_MAX * sizeof(struct shm_mrpub))
#define MAP_REFUSALS_MAX 64     /* refused map requests before a link is ignored */

enum { RMAP_NONE, RMAP_ASKED, RMAP_MAPPED, RMAP_NO };

/* What this side knows of one of the peer's regions. */
struct shm_rmap {
    uint32_t key, access;
    uint8_t state;
    uint32_t waits;     /* uses while the answer is awaited */
    uint8_t *base;
    size_t len, map_len;
};

#define MAP_ASK_AGAIN 4096  /* uses without an answer before asking again */

/* A map request ('M') or answer ('A') on the link socket. */
struct map_msg {
    uint8_t type;
    uint8_t pad[3];
    uint32_t key;
    int32_t status;
    uint32_t access;
    uint64_t len, map_len;
};

_Static_assert(sizeof(struct map_msg) == 32, "map_msg is 32 bytes on the socket");

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

int shm_direct_publish(struct tern_tp_ep *base, struct tern_tp_mr *mr, bool up)
{
    struct shm_ep *ep = SEP(base);
    struct shm_mrpub *e;

    /* ntb endpoints have no direct access; memory from tern_tp_mr_reg has
     * no memfd a peer could map. */
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
    /* Read-only to peers: nobody may map it writable from now on (our own
     * mapping, made before, stays writable). */
    if (!(mr->access & TERN_TP_ACCESS_REMOTE_WRITE))
        fcntl(mr->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE);
    fcntl(mr->fd, F_ADD_SEALS, F_SEAL_SEAL);
    return 0;
}

/* May a peer map `mr`? It must be readable (no write-only mappings exist),
 * and, unless writable, sealed so that the peer's mapping is read-only. */
static bool mappable(const struct tern_tp_mr *mr)
{
    int seals;

    if (mr->fd < 0 || !(mr->access & TERN_TP_ACCESS_REMOTE_READ))
        return false;
    if (mr->access & TERN_TP_ACCESS_REMOTE_WRITE)
        return true;
    seals = fcntl(mr->fd, F_GET_SEALS);
    return seals >= 0 && (seals & F_SEAL_FUTURE_WRITE);
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
    return sendmsg(l->obj.fd, &h, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -1;
}

/* The peer asks for one of our regions. */
static void on_request(struct shm_link *l, const struct map_msg *req)
{
    struct tern_tp_ep *base = &l->ep->base;
    struct tern_tp_mr *mr = &base->mrs[req->key & (TERN_MR_MAX - 1)];
    struct map_msg ans = {.type = 'A', .key = req->key, .status = TERN_EREMACCESS};
    int fds[2];

    if (l->map_refusals >= MAP_REFUSALS_MAX)
        return;     /* a peer that keeps guessing keys gets no more answers */
    if (!l->ep->tab || !mr->in_use || mr->key != req->key || !mappable(mr)) {
        l->map_refusals++;
        send_msg(l, &ans, NULL, 0);
        return;
    }
    ans.status = 0;
    ans.access = mr->access;
    ans.len = mr->len;
    ans.map_len = mr->map_len;
    fds[0] = mr->fd;
    fds[1] = l->ep->tab_fd;
    if (send_msg(l, &ans, fds, 2) < 0)
        tern_log(TERN_LOG_DEBUG, LOG_WHO, "link %s: map answer not sent", l->name);
}

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

/* The peer answers a request of ours. */
static void on_answer(struct shm_link *l, const struct map_msg *ans, const int *fds, int nfds)
{
    struct shm_rmap *m = l->rmap ? &l->rmap[ans->key & (TERN_MR_MAX - 1)] : NULL;
    int prot;
    void *p;

    if (!m || m->state != RMAP_ASKED || m->key != ans->key)
        return;
    m->state = RMAP_NO;     /* unless everything below checks out */
    if (ans->status != 0 || nfds != 2 || ans->len > ans->map_len || !ans->len ||
        !sealed_at(fds[0], ans->map_len) || !sealed_at(fds[1], MRTAB_BYTES))
        return;
    if (!l->peer_tab) {
        p = mmap(NULL, MRTAB_BYTES, PROT_READ, MAP_SHARED, fds[1], 0);
        if (p == MAP_FAILED)
            return;
        l->peer_tab = p;
    }
    prot = PROT_READ | (ans->access & TERN_TP_ACCESS_REMOTE_WRITE ? PROT_WRITE : 0);
    p = mmap(NULL, ans->map_len, prot, MAP_SHARED, fds[0], 0);
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

/* The mapping of the peer's region `key`, or NULL if there is none (yet):
 * the first use asks for it. */
static struct shm_rmap *rmap_of(struct shm_link *l, uint32_t key)
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
        return NULL;
    }
    /* An answer lost (the peer's socket was full) is asked for again. */
    if (m->state == RMAP_ASKED && ++m->waits >= MAP_ASK_AGAIN)
        m->key = 0;
    if (m->state != RMAP_MAPPED)
        return NULL;
    /* Still published? If not, the served path reports TERN_EREMACCESS. */
    if (__atomic_load_n(&l->peer_tab[key & (TERN_MR_MAX - 1)].key, __ATOMIC_ACQUIRE) != key) {
        munmap(m->base, m->map_len);
        *m = (struct shm_rmap){0};
        return NULL;
    }
    return m;
}

int shm_direct(struct shm_conn *c, bool put, void *local, size_t len,
               const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token, size_t max_len)
{
    struct shm_link *l = c->link;
    uint32_t need = put ? TERN_TP_ACCESS_REMOTE_WRITE : TERN_TP_ACCESS_REMOTE_READ;
    struct shm_rmap *m;

    if (!l || l->ntb || c->state != ST_OPEN || l->state != LINK_OPEN || !rkey->key)
        return 0;
    m = rmap_of(l, rkey->key);
    /* A refused access takes the served path, which reports and counts it;
     * so does one too large for it, which it refuses the same way whether
     * the region is mapped or not. */
    if (!m || (m->access & need) != need || roff > m->len || len > m->len - roff ||
        len > max_len)
        return 0;
    /* Operations of a connection take effect in order: with served ones in
     * flight, a direct store could land before an earlier served one, and
     * a direct load miss it. The caller retries after a completion (once,
     * when a stream turns direct, or when it mixes served keys in). */
    if (c->ev.pend_tail - c->ev.pend_head != c->ev.done)
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
    shm_ready_push(c);
    return 1;
}
