/* The pool: mapping, segments, appends, commits, recovery and cleaning.
 *
 * Durability order for one commit: the appended records are flushed (on PM:
 * cache-line flushes of their range, then one fence; on a file: msync of
 * the range), and only then is each touched segment's `used` word
 * stored and persisted. A crash before that store leaves the records past
 * the commit point, where nobody reads them.
 */
#include <fcntl.h>
#include <libpmem.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "error.h"
#include "log.h"
#include "pm_layout.h"

#define NO_SEG UINT32_MAX

struct seg_state {
    uint64_t seq;                    /* 0 = free */
    uint32_t appended;               /* record bytes written (committed or not) */
    uint32_t committed;              /* record bytes below the commit point */
    uint32_t live;                   /* record bytes still live */
};

struct tern_pm_pool {
    int lock_fd;
    uint8_t *base;
    size_t len;
    bool is_pmem;
    bool recovered;
    bool cleaning;                   /* the cleaner may take the reserve segment */
    uint32_t seg_size, n_segs;
    struct seg_state *segs;
    uint32_t *free_segs;             /* stack of free segment indexes */
    uint32_t n_free;
    uint32_t head;                   /* segment appended to, or NO_SEG */
    uint64_t seq;                    /* last segment sequence number handed out */
    uint64_t version;                /* last version handed out */
    uint64_t dirty_lo, dirty_hi;     /* written since the last drain */
    bool io_failed;                  /* an msync failed: no commit may follow */
    uint8_t uuid[16];
};

uint32_t pm_sum(const void *p, size_t n)
{
    return (uint32_t)XXH3_64bits(p, n);
}

uint32_t pm_rec_sum(const struct tern_pm_rec *r)
{
    const uint8_t *p = (const uint8_t *)r + sizeof(r->sum);

    return pm_sum(p, sizeof(*r) - sizeof(r->sum) + r->key_len + r->val_len);
}

int pm_hdr_check(const struct pm_file_hdr *h, uint64_t file_size, const char **why)
{
    if (memcmp(h->magic, PM_MAGIC, sizeof(h->magic)) != 0) {
        *why = "not a tern pool (bad magic)";
        return TERN_ECORRUPT;
    }
    if (h->layout != PM_LAYOUT) {
        *why = "pool layout version not supported by this build, which reads layout " PM_STR(PM_LAYOUT);
        return TERN_EVERSION;
    }
    if (h->sum != pm_sum(h, offsetof(struct pm_file_hdr, sum))) {
        *why = "header checksum mismatch";
        return TERN_ECORRUPT;
    }
    if (h->hdr_size != PM_HDR_SIZE || h->seg_size < PM_SEG_MIN ||
        (h->seg_size & (h->seg_size - 1)) || h->n_segs == 0 ||
        h->size != PM_HDR_SIZE + (uint64_t)h->n_segs * h->seg_size) {
        *why = "header sizes inconsistent";
        return TERN_ECORRUPT;
    }
    if (h->size > file_size) {
        *why = "file shorter than the pool its header describes (truncated?)";
        return TERN_ECORRUPT;
    }
    return 0;
}

int pm_rec_check(const uint8_t *seg, uint64_t off, uint64_t used, uint32_t *size,
                 const char **why)
{
    const struct tern_pm_rec *r = (const void *)(seg + off);
    uint64_t end = PM_SEG_HDR + used;

    if (off + sizeof(*r) > end) {
        *why = "record header crosses the commit point";
        return TERN_ECORRUPT;
    }
    if (r->key_len == 0 || r->key_len > TERN_PM_KEY_MAX ||
        (r->type != TERN_PM_VALUE && r->type != TERN_PM_TOMBSTONE) ||
        (r->type == TERN_PM_TOMBSTONE && r->val_len)) {
        *why = "record header malformed";
        return TERN_ECORRUPT;
    }
    *size = tern_pm_rec_size(r->key_len, r->val_len);
    if ((uint64_t)r->val_len > end || off + *size > end) {
        *why = "record runs past the commit point";
        return TERN_ECORRUPT;
    }
    if (pm_rec_sum(r) != r->sum) {
        *why = "record checksum mismatch";
        return TERN_ECORRUPT;
    }
    return 0;
}

static inline uint8_t *seg_base(const struct tern_pm_pool *p, uint32_t seg)
{
    return p->base + pm_seg_offset(seg, p->seg_size);
}

static inline struct pm_seg_hdr *seg_hdr(const struct tern_pm_pool *p, uint32_t seg)
{
    return (struct pm_seg_hdr *)seg_base(p, seg);
}

/* Note [addr, addr+n) as written. Flushing waits for the next drain: records
 * are appended back to back, so a record's last cache line is usually the
 * next one's first, and flushing at append time would flush it twice (and
 * on CPUs whose clwb evicts, read it back from memory in between). */
static void mark_written(struct tern_pm_pool *p, const void *addr, size_t n)
{
    uint64_t lo = (uint64_t)((const uint8_t *)addr - p->base), hi = lo + n;

    if (p->dirty_hi == 0 || lo < p->dirty_lo)
        p->dirty_lo = lo;
    if (hi > p->dirty_hi)
        p->dirty_hi = hi;
}

/* Make everything written so far durable: on PM, flush the written range
 * and fence; on a file, msync it. */
static int drain(struct tern_pm_pool *p)
{
    if (p->io_failed)
        return TERN_EIO;
    if (!p->dirty_hi)
        return 0;
    if (p->is_pmem) {
        pmem_flush(p->base + p->dirty_lo, p->dirty_hi - p->dirty_lo);
        pmem_drain();
    } else if (pmem_msync(p->base + p->dirty_lo, p->dirty_hi - p->dirty_lo) < 0) {
        /* Once writeback has failed, Linux may mark the pages clean and
         * report the error only once, so a retry can "succeed" without
         * writing anything: no commit point may move after this until the
         * pool is reopened and recovered from what really is in the file. */
        tern_log(TERN_LOG_ERROR, "pm", "msync: %s; the pool takes no more commits",
                 strerror(errno));
        p->io_failed = true;
        return TERN_EIO;
    }
    p->dirty_lo = p->dirty_hi = 0;
    return 0;
}

/* One 8-byte store, persisted: the only way segment state changes. */
static int persist_word(struct tern_pm_pool *p, uint64_t *word, uint64_t v)
{
    int rc = drain(p);               /* what came before goes first */

    if (rc < 0)
        return rc;
    __atomic_store_n(word, v, __ATOMIC_RELEASE);
    mark_written(p, word, sizeof(*word));
    return drain(p);
}

/* ---- open, create, close ---- */

/* Make a rename in the pool's directory durable. */
static int sync_dir_of(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    int fd, rc;

    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path) >= (int)sizeof(dir))
        return TERN_EINVAL;
    if (!dir[0])
        snprintf(dir, sizeof(dir), "/");
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return TERN_EIO;
    rc = fsync(fd);
    close(fd);
    return rc < 0 ? TERN_EIO : 0;
}

static int create_file(const char *path, const struct tern_pm_opts *o)
{
    uint64_t size = o && o->size ? o->size : 256ull << 20;
    uint32_t seg = o && o->seg_size ? o->seg_size : 1u << 20;
    struct pm_file_hdr h = {.layout = PM_LAYOUT, .hdr_size = PM_HDR_SIZE, .seg_size = seg};
    char tmp[4096];
    size_t len;
    int is_pmem;
    void *base;

    /* Four segments at least: one to write to, and the reserves (open_head). */
    if (seg < PM_SEG_MIN || (seg & (seg - 1)) || size < PM_HDR_SIZE + 4ull * seg)
        return TERN_EINVAL;
    h.n_segs = (uint32_t)((size - PM_HDR_SIZE) / seg);
    h.size = PM_HDR_SIZE + (uint64_t)h.n_segs * seg;
    memcpy(h.magic, PM_MAGIC, sizeof(h.magic));
    if (getrandom(h.uuid, sizeof(h.uuid), 0) != sizeof(h.uuid))
        return TERN_EIO;
    h.created = (uint64_t)time(NULL);
    h.sum = pm_sum(&h, offsetof(struct pm_file_hdr, sum));

    /* Built under a temporary name and renamed into place: a crash while
     * creating never leaves a half-written pool at `path`. Segment headers
     * start zeroed (free) because the file starts as a hole. */
    if (snprintf(tmp, sizeof(tmp), "%s.creating", path) >= (int)sizeof(tmp))
        return TERN_EINVAL;
    unlink(tmp);
    base = pmem_map_file(tmp, h.size, PMEM_FILE_CREATE | PMEM_FILE_EXCL, 0600, &len, &is_pmem);
    if (!base) {
        tern_log(TERN_LOG_ERROR, "pm", "create %s: %s", tmp, strerror(errno));
        return errno == ENOSPC ? TERN_ENOSPC : errno == EACCES ? TERN_EACCES : TERN_EIO;
    }
    memcpy(base, &h, sizeof(h));
    if (is_pmem)
        pmem_persist(base, sizeof(h));
    else
        pmem_msync(base, sizeof(h));
    pmem_unmap(base, len);
    if (rename(tmp, path) < 0) {
        unlink(tmp);
        return TERN_EIO;
    }
    return sync_dir_of(path);
}

int tern_pm_open(const char *path, const struct tern_pm_opts *o, struct tern_pm_pool **out)
{
    struct tern_pm_pool *p;
    const struct pm_file_hdr *h;
    const char *why = NULL;
    struct stat st;
    int is_pmem, rc;

    if (!path || !out)
        return TERN_EINVAL;
    if (stat(path, &st) < 0) {
        if (errno != ENOENT || !o || !o->create)
            return errno == ENOENT ? TERN_ENOENT : TERN_EIO;
        rc = create_file(path, o);
        if (rc < 0)
            return rc;
    }
    p = calloc(1, sizeof(*p));
    if (!p)
        return TERN_ENOMEM;
    p->lock_fd = -1;
    p->head = NO_SEG;
    /* An exclusive lock for the pool's lifetime: two writers would each
     * believe they own the free segments. */
    p->lock_fd = open(path, O_RDWR | O_CLOEXEC);
    if (p->lock_fd < 0) {
        rc = errno == EACCES ? TERN_EACCES : TERN_EIO;
        goto fail;
    }
    if (flock(p->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        tern_log(TERN_LOG_ERROR, "pm", "%s is in use by another process", path);
        rc = TERN_EBUSY;
        goto fail;
    }
    if (fstat(p->lock_fd, &st) < 0 || (uint64_t)st.st_size < PM_HDR_SIZE) {
        tern_log(TERN_LOG_ERROR, "pm", "%s: too short to be a pool", path);
        rc = TERN_ECORRUPT;
        goto fail;
    }
    p->base = pmem_map_file(path, 0, 0, 0, &p->len, &is_pmem);
    if (!p->base) {
        tern_log(TERN_LOG_ERROR, "pm", "map %s: %s", path, strerror(errno));
        rc = TERN_EIO;
        goto fail;
    }
    p->is_pmem = is_pmem != 0;
    h = (const struct pm_file_hdr *)p->base;
    rc = pm_hdr_check(h, p->len, &why);
    if (rc < 0) {
        tern_log(TERN_LOG_ERROR, "pm", "%s: offset 0: %s", path, why);
        goto fail;
    }
    p->seg_size = h->seg_size;
    p->n_segs = h->n_segs;
    memcpy(p->uuid, h->uuid, sizeof(p->uuid));
    p->segs = calloc(p->n_segs, sizeof(*p->segs));
    p->free_segs = calloc(p->n_segs, sizeof(*p->free_segs));
    if (!p->segs || !p->free_segs) {
        rc = TERN_ENOMEM;
        goto fail;
    }
    *out = p;
    return 0;
fail:
    tern_pm_close(p);
    return rc;
}

void tern_pm_close(struct tern_pm_pool *p)
{
    if (!p)
        return;
    if (p->base)
        pmem_unmap(p->base, p->len);
    if (p->lock_fd >= 0)
        close(p->lock_fd);     /* drops the lock */
    free(p->segs);
    free(p->free_segs);
    free(p);
}

/* ---- recovery ---- */

int tern_pm_recover(struct tern_pm_pool *p, tern_pm_visit_fn fn, void *arg)
{
    uint32_t newest = NO_SEG;

    if (p->recovered)
        return TERN_EINVAL;
    for (uint32_t s = p->n_segs; s-- > 0;) {
        const struct pm_seg_hdr *sh = seg_hdr(p, s);
        uint64_t seg_off = pm_seg_offset(s, p->seg_size);
        uint64_t used = sh->used;

        if (sh->seq == 0) {
            p->free_segs[p->n_free++] = s;
            continue;
        }
        if (sh->magic != PM_SEG_MAGIC || sh->index != s ||
            used > p->seg_size - PM_SEG_HDR || (used & 7)) {
            tern_log(TERN_LOG_ERROR, "pm", "offset %llu: segment %u header corrupt",
                     (unsigned long long)seg_off, s);
            return TERN_ECORRUPT;
        }
        p->segs[s] = (struct seg_state){.seq = sh->seq, .appended = (uint32_t)used,
                                        .committed = (uint32_t)used, .live = (uint32_t)used};
        if (sh->seq > p->seq) {
            p->seq = sh->seq;
            newest = s;
        }
        for (uint64_t off = PM_SEG_HDR; off < PM_SEG_HDR + used;) {
            const struct tern_pm_rec *r = (const void *)(seg_base(p, s) + off);
            const char *why;
            uint32_t size;
            int rc = pm_rec_check(seg_base(p, s), off, used, &size, &why);

            if (rc < 0) {
                tern_log(TERN_LOG_ERROR, "pm", "offset %llu (segment %u + %llu): %s",
                         (unsigned long long)(seg_off + off), s, (unsigned long long)off, why);
                return rc;
            }
            if (r->version > p->version)
                p->version = r->version;
            rc = fn ? fn(arg, (uint64_t)s << 32 | off, r) : 0;
            if (rc < 0)
                return rc;
            off += size;
        }
    }
    /* Appends continue in the newest segment; whatever lies past its commit
     * point (a torn append) is overwritten. */
    p->head = newest;
    p->recovered = true;
    return 0;
}

/* ---- appends and commits ---- */

const struct tern_pm_rec *tern_pm_rec_at(const struct tern_pm_pool *p, tern_pm_loc loc)
{
    return (const struct tern_pm_rec *)(seg_base(p, (uint32_t)(loc >> 32)) + (uint32_t)loc);
}

uint32_t tern_pm_val_max(const struct tern_pm_pool *p, uint32_t key_len)
{
    uint32_t room = p->seg_size - PM_SEG_HDR - (uint32_t)sizeof(struct tern_pm_rec);

    return key_len >= room ? 0 : (room - key_len) & ~7u;
}

uint64_t tern_pm_next_version(struct tern_pm_pool *p)
{
    return ++p->version;
}

uint32_t tern_pm_free_segs(const struct tern_pm_pool *p)
{
    return p->n_free;
}

uint32_t tern_pm_seg_count(const struct tern_pm_pool *p)
{
    return p->n_segs;
}

/* Move the commit point of `s` over everything appended to it. */
static int commit_seg(struct tern_pm_pool *p, uint32_t s)
{
    struct seg_state *ss = &p->segs[s];
    int rc;

    if (ss->committed == ss->appended)
        return 0;
    /* persist_word drains the records before it stores the point. */
    rc = persist_word(p, &seg_hdr(p, s)->used, ss->appended);
    if (rc < 0)
        return rc;
    ss->committed = ss->appended;
    return 0;
}

int tern_pm_commit(struct tern_pm_pool *p)
{
    return p->head == NO_SEG ? 0 : commit_seg(p, p->head);
}

/* Start appending to a fresh segment. Its header is valid (magic, index,
 * used = 0) before seq makes it count. Free segments are held back in two
 * tiers: the last one for the cleaner, which needs room to copy live
 * records into, and one more for tombstones, so that a pool full of values
 * still takes the deletes that let it be cleaned. */
static int open_head(struct tern_pm_pool *p, enum tern_pm_rec_type type)
{
    uint32_t keep = p->cleaning ? 0 : type == TERN_PM_TOMBSTONE ? 1 : 2;
    struct pm_seg_hdr *sh;
    uint32_t s;
    int rc;

    if (p->n_free <= keep)
        return TERN_ENOSPC;
    if (p->head != NO_SEG) {
        rc = commit_seg(p, p->head);
        if (rc < 0)
            return rc;
    }
    s = p->free_segs[--p->n_free];
    sh = seg_hdr(p, s);
    sh->used = 0;
    sh->magic = PM_SEG_MAGIC;
    sh->index = s;
    mark_written(p, sh, sizeof(*sh));
    rc = persist_word(p, &sh->seq, ++p->seq);
    if (rc < 0) {
        p->free_segs[p->n_free++] = s;
        return rc;
    }
    p->segs[s] = (struct seg_state){.seq = p->seq};
    p->head = s;
    return 0;
}

int tern_pm_append(struct tern_pm_pool *p, enum tern_pm_rec_type type, uint64_t version,
                   const void *key, uint16_t key_len, const void *val, uint32_t val_len,
                   tern_pm_loc *loc)
{
    uint32_t size = tern_pm_rec_size(key_len, val_len);
    struct tern_pm_rec *r;
    struct seg_state *ss;
    uint8_t *dst;
    int rc;

    if (!p->recovered || !key_len || (type != TERN_PM_VALUE && type != TERN_PM_TOMBSTONE))
        return TERN_EINVAL;
    if (key_len > TERN_PM_KEY_MAX || val_len > tern_pm_val_max(p, key_len))
        return TERN_E2BIG;
    if (p->head == NO_SEG ||
        p->segs[p->head].appended + size > p->seg_size - PM_SEG_HDR) {
        rc = open_head(p, type);
        if (rc < 0)
            return rc;
    }
    ss = &p->segs[p->head];
    dst = seg_base(p, p->head) + PM_SEG_HDR + ss->appended;
    r = (struct tern_pm_rec *)dst;
    *r = (struct tern_pm_rec){.val_len = val_len, .version = version, .key_len = key_len,
                              .type = (uint8_t)type};
    memcpy(dst + sizeof(*r), key, key_len);
    if (val_len)
        memcpy(dst + sizeof(*r) + key_len, val, val_len);
    memset(dst + sizeof(*r) + key_len + val_len, 0, size - sizeof(*r) - key_len - val_len);
    /* Summed from the pool's copy, not the caller's buffer: a value read
     * from a receive ring the peer can still write must not leave a record
     * whose checksum disagrees with what was stored. */
    r->sum = pm_rec_sum(r);
    mark_written(p, dst, size);
    *loc = (uint64_t)p->head << 32 | (PM_SEG_HDR + ss->appended);
    ss->appended += size;
    ss->live += size;
    if (version > p->version)
        p->version = version;
    return 0;
}

void tern_pm_dead(struct tern_pm_pool *p, tern_pm_loc loc)
{
    const struct tern_pm_rec *r = tern_pm_rec_at(p, loc);
    struct seg_state *ss = &p->segs[loc >> 32];
    uint32_t size = tern_pm_rec_size(r->key_len, r->val_len);

    ss->live = ss->live > size ? ss->live - size : 0;
}

/* ---- cleaning ---- */

/* The sealed segment with the fewest live bytes, if below the limit. */
static uint32_t pick_victim(const struct tern_pm_pool *p, unsigned max_live_pct)
{
    uint64_t cap = p->seg_size - PM_SEG_HDR;
    uint32_t best = NO_SEG;

    for (uint32_t s = 0; s < p->n_segs; s++) {
        const struct seg_state *ss = &p->segs[s];

        if (!ss->seq || s == p->head || (uint64_t)ss->live * 100 >= cap * max_live_pct)
            continue;
        if (best == NO_SEG || ss->live < p->segs[best].live)
            best = s;
    }
    return best;
}

static int clean_one(struct tern_pm_pool *p, const struct tern_pm_cleaner *c, uint32_t v)
{
    struct seg_state *vs = &p->segs[v];
    uint64_t end = PM_SEG_HDR + vs->committed;
    int rc = 0, commit_rc;

    for (uint64_t off = PM_SEG_HDR; off < end;) {
        const struct tern_pm_rec *r = (const void *)(seg_base(p, v) + off);
        tern_pm_loc from = (uint64_t)v << 32 | off, to;

        off += tern_pm_rec_size(r->key_len, r->val_len);
        if (!c->is_live(c->arg, from, r))
            continue;
        rc = tern_pm_append(p, (enum tern_pm_rec_type)r->type, r->version,
                            tern_pm_rec_key(r), r->key_len, tern_pm_rec_val(r), r->val_len, &to);
        if (rc < 0)
            break;
        c->moved(c->arg, from, to, r);
    }
    /* Copies are committed before the original goes: a crash in between
     * leaves two copies of a version, which recovery treats as one. */
    commit_rc = tern_pm_commit(p);
    if (rc < 0 || commit_rc < 0)
        return rc < 0 ? rc : commit_rc;
    rc = persist_word(p, &seg_hdr(p, v)->seq, 0);
    if (rc < 0)
        return rc;
    /* Only now, with the victim gone for good, are its records dropped: a
     * clean that fails above leaves every record where it was counted. The
     * bytes are still there to read until the segment is handed out. */
    if (c->dropped)
        for (uint64_t off = PM_SEG_HDR; off < end;) {
            const struct tern_pm_rec *r = (const void *)(seg_base(p, v) + off);

            c->dropped(c->arg, (uint64_t)v << 32 | off, r);
            off += tern_pm_rec_size(r->key_len, r->val_len);
        }
    *vs = (struct seg_state){0};
    p->free_segs[p->n_free++] = v;
    return 0;
}

int tern_pm_clean(struct tern_pm_pool *p, const struct tern_pm_cleaner *c,
                  unsigned max_segs, unsigned max_live_pct)
{
    int freed = 0;

    if (!p->recovered || !c || !c->is_live || !c->moved)
        return TERN_EINVAL;
    p->cleaning = true;
    while ((unsigned)freed < max_segs) {
        uint32_t v = pick_victim(p, max_live_pct);
        int rc;

        if (v == NO_SEG)
            break;
        rc = clean_one(p, c, v);
        if (rc < 0) {
            p->cleaning = false;
            return freed ? freed : rc;
        }
        freed++;
    }
    p->cleaning = false;
    return freed;
}

void tern_pm_get_info(const struct tern_pm_pool *p, struct tern_pm_info *info)
{
    *info = (struct tern_pm_info){
        .version = PM_LAYOUT, .size = p->len, .seg_size = p->seg_size, .n_segs = p->n_segs,
        .max_version = p->version, .is_pmem = p->is_pmem,
    };
    memcpy(info->uuid, p->uuid, sizeof(info->uuid));
    for (uint32_t s = 0; s < p->n_segs; s++) {
        if (!p->segs[s].seq)
            continue;
        info->segs_used++;
        info->bytes_committed += p->segs[s].committed;
        info->bytes_live += p->segs[s].live;
    }
}
