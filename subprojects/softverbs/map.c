/* Peers' regions mapped into the initiator, so that a one-sided access is a
 * memcpy, as a NIC's DMA costs the initiator's CPU no system call.
 *
 * A region can be mapped by a peer when its memory is a shared mapping of
 * a file: a file with a path (a pool, a replication ring), or memory from
 * sv_buf_alloc (a memfd this process keeps open, reached through
 * /proc/PID/fd). Registration records how to open it and its identity
 * (device, inode, offset); the first access of a peer opens and maps it,
 * checking that identity, and later accesses use the mapping. Any other
 * memory (anonymous, private) is copied by process_vm_writev/readv as
 * before, and SOFTVERBS_MAP=0 copies everything that way.
 *
 * Lifetimes. Every access holds the owner's mr_lock, and so does this
 * file's bookkeeping of the owner's maps. A deregistration bumps the
 * owner's mr_gen; a peer's next access then unmaps what no longer has a
 * live key. A peer found dead is unmapped whole (sv_map_drop). Memory
 * from sv_buf_alloc is punched out of its memfd when freed, so a stale
 * map holds no pages.
 *
 * Trust. A peer names its backing file itself, so only a peer of our own
 * user is mapped: one of another user could name a file it may not write
 * and have our writes land there (we open it with our rights). Between
 * processes of one user, the peer could write that file itself anyway.
 *
 * What a NIC does and this cannot: pinned pages outlive a truncated file.
 * A file-backed region must keep its size while it is registered; a peer
 * touching pages past a shrunk end would take SIGBUS. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sv.h"

#define SV_MAX_MAPS 64      /* per peer: beyond it the oldest is unmapped */

struct sv_map {
    uint32_t key;           /* the region's key when mapped */
    bool ok;                /* false: not mappable, copy by system call */
    uint8_t *base;          /* the mapping */
    size_t len;
    uint8_t *at;            /* where the region's first byte is */
};

bool sv_map_enabled(void)
{
    static int on = -1;

    if (on < 0) {
        const char *v = getenv("SOFTVERBS_MAP");

        on = !(v && strcmp(v, "0") == 0);
    }
    return on;
}

/* ---- the owner's side: memory peers can map ---- */

struct sv_buf {
    struct sv_buf *next;
    uint8_t *addr;
    size_t len;
    int fd;
};

static pthread_mutex_t bufs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sv_buf *bufs;

void *sv_buf_alloc(size_t len)
{
    struct sv_buf *b = calloc(1, sizeof(*b));
    void *p = MAP_FAILED;
    int fd = -1, err;

    if (!b)
        return NULL;
    /* Sealed at its size: a peer that maps it cannot be made to fault by
     * a shrink. The pages come on first touch, as anonymous ones do. */
    fd = memfd_create("softverbs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)len) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        goto fail;
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        goto fail;
    *b = (struct sv_buf){.addr = p, .len = len, .fd = fd};
    pthread_mutex_lock(&bufs_lock);
    b->next = bufs;
    bufs = b;
    pthread_mutex_unlock(&bufs_lock);
    return p;
fail:
    err = errno;
    if (fd >= 0)
        close(fd);
    free(b);
    errno = err;
    return NULL;
}

void sv_buf_free(void *p, size_t len)
{
    struct sv_buf **at, *b = NULL;

    if (!p)
        return;
    pthread_mutex_lock(&bufs_lock);
    for (at = &bufs; *at; at = &(*at)->next)
        if ((*at)->addr == p) {
            b = *at;
            *at = b->next;
            break;
        }
    pthread_mutex_unlock(&bufs_lock);
    if (!b) {
        munmap(p, len);
        return;
    }
    /* Peers may still map it until their next access: give the pages
     * back now. */
    fallocate(b->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)b->len);
    munmap(b->addr, b->len);
    close(b->fd);
    free(b);
}

/* [addr, addr+len) within a buffer of sv_buf_alloc: its fd, else -1. */
static int buf_fd(uint64_t addr, uint64_t len, uint64_t *off)
{
    int fd = -1;

    pthread_mutex_lock(&bufs_lock);
    for (struct sv_buf *b = bufs; b; b = b->next) {
        uint64_t a = (uint64_t)(uintptr_t)b->addr;

        if (addr >= a && len <= b->len && addr - a <= b->len - len) {
            fd = b->fd;
            *off = addr - a;
            break;
        }
    }
    pthread_mutex_unlock(&bufs_lock);
    return fd;
}

/* The shared file mapping of /proc/self/maps that holds all of
 * [addr, addr+len): its path and the file offset of addr. */
static bool maps_find(uint64_t addr, uint64_t len, char path[SV_BK_PATH], uint64_t *off,
                      uint64_t *ino)
{
    FILE *f = fopen("/proc/self/maps", "re");
    char *line = NULL;
    size_t cap = 0;
    bool found = false;

    if (!f)
        return false;
    while (!found && getline(&line, &cap, f) > 0) {
        unsigned long long start, end, foff, inode;
        char perms[5];
        int at = 0;
        size_t n;

        if (sscanf(line, "%llx-%llx %4s %llx %*x:%*x %llu %n", &start, &end, perms, &foff,
                   &inode, &at) < 5 || !at)
            continue;
        if (addr < start || addr >= end)
            continue;
        /* One line must hold it all; a shared mapping ('s') of a file with
         * a path that still names it. */
        if (len > end - addr || perms[3] != 's' || !inode || line[at] != '/')
            break;
        n = strcspn(line + at, "\n");
        if (n >= SV_BK_PATH || (n > 10 && !memcmp(line + at + n - 10, " (deleted)", 10)))
            break;
        memcpy(path, line + at, n);
        path[n] = '\0';
        *off = foff + (addr - start);
        *ino = inode;
        found = true;
    }
    free(line);
    fclose(f);
    return found;
}

void sv_backing_probe(struct sv_mr_ent *e, char path[SV_BK_PATH])
{
    struct stat st;
    uint64_t off, ino;
    int fd;

    e->bk = SV_BK_NONE;
    e->bk_fd = -1;
    path[0] = '\0';
    if (!sv_map_enabled() || !e->len)
        return;
    fd = buf_fd(e->addr, e->len, &off);
    if (fd >= 0) {
        if (fstat(fd, &st) < 0)
            return;
        e->bk = SV_BK_FD;
        e->bk_fd = fd;
    } else {
        if (!maps_find(e->addr, e->len, path, &off, &ino) || stat(path, &st) < 0 ||
            (uint64_t)st.st_ino != ino || !S_ISREG(st.st_mode) ||
            (uint64_t)st.st_size < off + e->len) {
            path[0] = '\0';
            return;
        }
        e->bk = SV_BK_FILE;
    }
    e->bk_dev = (uint64_t)st.st_dev;
    e->bk_ino = (uint64_t)st.st_ino;
    e->bk_off = off;
}

/* ---- the initiator's side ---- */

static void map_unmap(struct sv_map *m)
{
    if (m->base)
        munmap(m->base, m->len);
    m->base = m->at = NULL;
}

void sv_map_drop(struct sv_peer *p)
{
    for (uint32_t i = 0; i < p->n_maps; i++)
        map_unmap(&p->maps[i]);
    p->n_maps = 0;
}

/* Unmap what the owner has deregistered since we last looked. */
static void map_sweep(struct sv_peer *p)
{
    const struct sv_seg *seg = p->seg;
    uint32_t n = 0;

    for (uint32_t i = 0; i < p->n_maps; i++) {
        struct sv_map *m = &p->maps[i];

        if (seg->mr[SV_KEY_IDX(m->key)].key == m->key)
            p->maps[n++] = *m;
        else
            map_unmap(m);
    }
    p->n_maps = n;
    p->maps_gen = seg->mr_gen;
}

/* Open and map region `e` (key `key`) of the peer; m->ok false if it
 * cannot be. */
static void map_open(struct sv_peer *p, const struct sv_mr_ent *e, uint32_t key, struct sv_map *m)
{
    const struct sv_seg *seg = p->seg;
    long page = sysconf(_SC_PAGESIZE);
    char name[SV_BK_PATH + 32];
    uint64_t start = e->bk_off & ~(uint64_t)(page - 1);
    struct stat st;
    void *base;
    int fd;

    *m = (struct sv_map){.key = key};
    snprintf(name, sizeof(name), "/proc/%d", (int)seg->pid);
    if (stat(name, &st) < 0 || st.st_uid != geteuid())
        return;
    if (e->bk == SV_BK_FILE) {
        memcpy(name, seg->bk_path[SV_KEY_IDX(key)], SV_BK_PATH);
        name[SV_BK_PATH - 1] = '\0';
    } else if (e->bk == SV_BK_FD) {
        snprintf(name, sizeof(name), "/proc/%d/fd/%d", (int)seg->pid, (int)e->bk_fd);
    } else {
        return;
    }
    fd = open(name, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return;
    /* The file must be the one registered, and hold the whole region. */
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_dev != e->bk_dev ||
        (uint64_t)st.st_ino != e->bk_ino || e->bk_off > (uint64_t)st.st_size ||
        e->len > (uint64_t)st.st_size - e->bk_off) {
        close(fd);
        return;
    }
    base = mmap(NULL, e->bk_off - start + e->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                (off_t)start);
    close(fd);
    if (base == MAP_FAILED)
        return;
    m->ok = true;
    m->base = base;
    m->len = e->bk_off - start + e->len;
    m->at = m->base + (e->bk_off - start);
}

void *sv_map_addr(struct sv_peer *p, const struct sv_mr_ent *e, uint64_t addr, uint64_t len)
{
    const struct sv_seg *seg = p->seg;
    uint32_t key = e->key;
    struct sv_map *m = NULL;

    if (!sv_map_enabled())
        return NULL;
    /* A window is reached through the region it is bound in. */
    if (e->mw) {
        key = e->mr_key;
        e = &seg->mr[SV_KEY_IDX(key)];
        if (e->key != key || e->mw || addr < e->addr || len > e->len ||
            addr - e->addr > e->len - len)
            return NULL;
    }
    if (e->bk == SV_BK_NONE)
        return NULL;
    if (__atomic_load_n(&seg->mr_gen, __ATOMIC_ACQUIRE) != p->maps_gen)
        map_sweep(p);
    for (uint32_t i = 0; i < p->n_maps && !m; i++)
        if (p->maps[i].key == key)
            m = &p->maps[i];
    if (!m) {
        if (!p->maps && !(p->maps = calloc(SV_MAX_MAPS, sizeof(*p->maps))))
            return NULL;
        if (p->n_maps == SV_MAX_MAPS) {
            map_unmap(&p->maps[0]);
            memmove(&p->maps[0], &p->maps[1], (SV_MAX_MAPS - 1) * sizeof(*p->maps));
            p->n_maps--;
        }
        m = &p->maps[p->n_maps++];
        map_open(p, e, key, m);
    }
    return m->ok ? m->at + (addr - e->addr) : NULL;
}
