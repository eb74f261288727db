/* The shared segment of one process: what its peers' "NIC" reads and writes
 * on its behalf (memory region table, receive queues, CQs). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <unistd.h>

#include "sv.h"

#define SV_VERSION 3     /* 2: memory windows, keys index-first; 3: backing files */

static void seg_name(char *buf, size_t len, pid_t pid)
{
    snprintf(buf, len, "/softverbs.%d", (int)pid);
}

int sv_mutex_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    int rc;

    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return rc;
}

/* A peer that died holding a lock left its queue as it was between two
 * stores of an update; the queues tolerate that (indexes are written last),
 * so the lock is simply made usable again. */
void sv_lock(pthread_mutex_t *m)
{
    int rc;

    /* These locks are held for a few stores, by processes that busy-poll:
     * spin a while before sleeping in the kernel, as a NIC's queue never
     * puts its poller to sleep. */
    for (unsigned i = 0; i < SV_LOCK_SPINS; i++) {
        rc = pthread_mutex_trylock(m);
        if (rc != EBUSY)
            goto got;
        sv_relax();
    }
    rc = pthread_mutex_lock(m);
got:
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(m);
}

void sv_unlock(pthread_mutex_t *m)
{
    pthread_mutex_unlock(m);
}

void sv_sweep_dead(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;

    if (!d)
        return;
    while ((e = readdir(d))) {
        char *end;
        long pid;

        if (strncmp(e->d_name, "softverbs.", 10) != 0)
            continue;
        pid = strtol(e->d_name + 10, &end, 10);
        if ((*end && *end != '.') || pid <= 0)
            continue;
        if (kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
            char name[300];

            if (*end) {              /* a completion channel's socket */
                snprintf(name, sizeof(name), "/dev/shm/%s", e->d_name);
                unlink(name);
                continue;
            }
            seg_name(name, sizeof(name), (pid_t)pid);
            shm_unlink(name);
        }
    }
    closedir(d);
}

struct sv_seg *sv_seg_create(void)
{
    char name[64];
    struct sv_seg *seg;
    int fd, err;

    sv_sweep_dead();
    seg_name(name, sizeof(name), getpid());
    shm_unlink(name);       /* an earlier holder of our PID */
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, sizeof(struct sv_seg)) < 0) {
        err = errno;
        close(fd);
        shm_unlink(name);
        errno = err;
        return NULL;
    }
    seg = mmap(NULL, sizeof(*seg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (seg == MAP_FAILED) {
        shm_unlink(name);
        return NULL;
    }
    seg->pid = getpid();
    if (getrandom(&seg->incarnation, sizeof(seg->incarnation), 0) != sizeof(seg->incarnation))
        seg->incarnation = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    seg->incarnation |= 1;
    sv_mutex_init(&seg->mr_lock);
    for (unsigned i = 0; i < SV_MAX_CQ; i++)
        seg->cq[i].channel = -1;
    seg->version = SV_VERSION;
    __atomic_store_n(&seg->magic, SV_MAGIC, __ATOMIC_RELEASE);
    /* Peers copy into our memory with process_vm_writev, which needs the
     * right to ptrace us; with Yama's ptrace_scope=1 only our parent has
     * it unless we say otherwise. A NIC needs no such right; the emulation
     * does. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    return seg;
}

void sv_seg_destroy(struct sv_seg *seg)
{
    char name[64];

    seg_name(name, sizeof(name), seg->pid);
    __atomic_store_n(&seg->magic, 0, __ATOMIC_RELEASE);
    shm_unlink(name);
    munmap(seg, sizeof(*seg));
}

void sv_seg_gid(const struct sv_seg *seg, union ibv_gid *gid)
{
    uint32_t pid = (uint32_t)seg->pid;

    memset(gid, 0, sizeof(*gid));
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
    memcpy(gid->raw + 4, &pid, 4);
    memcpy(gid->raw + 8, &seg->incarnation, 8);
}

struct sv_seg *sv_seg_attach(const union ibv_gid *gid)
{
    uint32_t pid;
    uint64_t inc;
    char name[64];
    struct sv_seg *seg;
    int fd;

    memcpy(&pid, gid->raw + 4, 4);
    memcpy(&inc, gid->raw + 8, 8);
    if (gid->raw[0] != 0xfe || gid->raw[1] != 0x80 || !pid) {
        errno = EINVAL;
        return NULL;
    }
    seg_name(name, sizeof(name), (pid_t)pid);
    fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    seg = mmap(NULL, sizeof(*seg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (seg == MAP_FAILED)
        return NULL;
    /* Another process of that PID, or one still setting up: not our peer. */
    if (__atomic_load_n(&seg->magic, __ATOMIC_ACQUIRE) != SV_MAGIC ||
        seg->version != SV_VERSION || seg->incarnation != inc) {
        munmap(seg, sizeof(*seg));
        errno = ENOENT;
        return NULL;
    }
    return seg;
}

void sv_seg_detach(struct sv_seg *seg)
{
    munmap(seg, sizeof(*seg));
}

bool sv_seg_alive(const struct sv_seg *seg)
{
    if (__atomic_load_n(&seg->magic, __ATOMIC_ACQUIRE) != SV_MAGIC)
        return false;
    return kill(seg->pid, 0) == 0 || errno != ESRCH;
}

/* The peer died: unmap its regions (their memory goes with the last map),
 * once, under its mr_lock, which a dead holder leaves to be recovered. */
static void peer_died(struct sv_peer *p)
{
    bool was = false;

    if (!__atomic_compare_exchange_n(&p->dead, &was, true, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;
    sv_lock(&p->seg->mr_lock);
    sv_map_drop(p);
    sv_unlock(&p->seg->mr_lock);
}

bool sv_peer_alive(struct sv_peer *p, uint64_t now_ns)
{
    if (__atomic_load_n(&p->dead, __ATOMIC_RELAXED))
        return false;
    if (__atomic_load_n(&p->seg->magic, __ATOMIC_ACQUIRE) != SV_MAGIC) {
        peer_died(p);
        return false;
    }
    if (now_ns - __atomic_load_n(&p->seen_ns, __ATOMIC_RELAXED) < SV_ALIVE_NS)
        return true;
    if (!sv_seg_alive(p->seg)) {
        peer_died(p);
        return false;
    }
    __atomic_store_n(&p->seen_ns, now_ns, __ATOMIC_RELAXED);
    return true;
}
