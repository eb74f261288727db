/* The pool: mapping, segments, appends, rewrites, leases, commits, recovery
 * and cleaning.
 *
 * Durability order for one commit: the records written since the last one
 * (appended, rewritten in place, or stamped for a lessee) are flushed (on
 * PM: cache-line flushes of each segment's written range, then one fence;
 * on a file: msync of each range), and only then are the commit words of
 * the segments that grew stored and persisted (each one 8-byte store of
 * the commit point and its check: pm_layout.h). A crash before that store
 * leaves the records past the commit point, where nobody reads them.
 *
 * A rewrite (pm_overwrite) changes bytes below a commit point, so it
 * cannot hide behind one: it first persists a mark in the old record
 * (PM_F_REWRITTEN and the slot's size), which breaks the old record's
 * checksum, then writes the new one. A crash anywhere in between leaves a
 * record that is the old one, the new one, or a torn one with the mark and
 * a sane slot, which recovery steps over.
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
#include "pm_flush.h"
#include "pm_layout.h"

#define NO_SEG UINT32_MAX

struct seg_state {
    uint64_t seq;                    /* 0 = free */
    uint32_t appended;               /* record bytes written (committed or not) */
    uint32_t committed;              /* record bytes durable (acknowledged) */
    uint32_t hdr_commit;             /* what the header's commit word says: committed,
                                      * or one commit behind it on a PM_SEG_TAIL
                                      * segment (pm_commit) */
    uint32_t live;                   /* record bytes still live */
    uint32_t dirty_lo, dirty_hi;     /* bytes of the segment written since the last
                                      * drain; dirty_hi 0 = none */
    uint32_t first;                  /* where records start (past a lessee's reach) */
    bool leased;                     /* a lessee writes here; only it appends */
    bool tail;                       /* PM_SEG_TAIL: records past the commit word count */
    bool queued;                     /* listed in the pool's queue */
    bool damaged;                    /* its lessee left a record that fails its checks:
                                      * never cleaned (recovery cuts it) */
};

struct pm_pool {
    int lock_fd;
    int share_fd;                    /* the file again, without the lock (pm_fd) */
    uint8_t *base;
    size_t len;
    bool is_pmem;
    bool recovered;
    bool cleaning;                   /* the cleaner may take the reserve segment */
    bool strict;                     /* pm_opts.strict_commit */
    uint32_t seg_size, n_segs;
    struct seg_state *segs;
    uint32_t *free_segs;             /* stack of free segment indexes */
    uint32_t n_free;
    uint32_t head;                   /* segment appended to, or NO_SEG */
    uint64_t seq;                    /* last segment sequence number handed out */
    uint64_t version;                /* last version handed out */
    /* Segments written since the last commit: the head, leased segments,
     * segments rewritten in place. Kept per segment rather than as one
     * pool-wide range, because the head, a lease and a rewrite may lie far
     * apart and flushing every line in between would cost more than the
     * records. Sized n_segs at open: a segment is listed at most once. */
    uint32_t *queue;
    uint32_t n_queued;
    bool io_failed;                  /* an msync failed: no commit may follow */
    struct pm_board *board;          /* large flushes shared with helpers */
    uint8_t uuid[16];
};

int pm_hdr_check(const struct pm_file_hdr *h, uint64_t file_size, const char **why)
{
    if (memcmp(h->magic, PM_MAGIC, sizeof(h->magic)) != 0) {
        *why = "not a tern pool (bad magic)";
        return TERN_ECORRUPT;
    }
    if (h->layout < PM_LAYOUT_OLDEST || h->layout > PM_LAYOUT) {
        *why = "pool layout version not supported by this build, which reads layouts "
               PM_STR(PM_LAYOUT_OLDEST) " to " PM_STR(PM_LAYOUT);
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
    const struct pm_rec *r = (const void *)(seg + off);
    uint64_t end = PM_SEG_HDR + used;
    uint32_t need;

    if (off + sizeof(*r) > end) {
        *why = "record header crosses the commit point";
        return TERN_ECORRUPT;
    }
    if (r->key_len == 0 || r->key_len > PM_KEY_MAX ||
        !pm_rec_type_ok(r->type, r->val_len) || (r->flags & ~PM_F_REWRITTEN)) {
        *why = "record header malformed";
        return TERN_ECORRUPT;
    }
    need = pm_rec_size(r->key_len, r->val_len);
    if ((uint64_t)r->val_len > end || off + need > end) {
        *why = "record runs past the commit point";
        return TERN_ECORRUPT;
    }
    /* The slot is how the walk finds the next record: one that is too
     * small, unaligned or past the commit point would send it astray. */
    if (r->slot && (r->slot < need || (r->slot & 7) || off + r->slot > end)) {
        *why = "record slot smaller than the record, unaligned or past the commit point";
        return TERN_ECORRUPT;
    }
    if (pm_rec_sum(r) != r->sum) {
        *why = "record checksum mismatch";
        return TERN_ECORRUPT;
    }
    *size = r->slot ? r->slot : need;
    return 0;
}

uint32_t pm_rec_torn_rewrite(const uint8_t *seg, uint64_t off, uint64_t used)
{
    const struct pm_rec *r = (const void *)(seg + off);
    uint64_t end = PM_SEG_HDR + used;
    uint32_t slot;

    if (off + sizeof(*r) > end || !(r->flags & PM_F_REWRITTEN))
        return 0;
    /* A rewrite never changes the slot (pm_overwrite persists it
     * before anything else), so the slot is trusted even though the rest
     * of the record is not. */
    slot = r->slot;
    if (slot < sizeof(*r) || (slot & 7) || off + slot > end)
        return 0;
    return slot;
}

uint32_t pm_seg_tail(const uint8_t *seg, uint32_t seg_size, uint32_t used)
{
    uint64_t lim = seg_size - PM_SEG_HDR, off = PM_SEG_HDR + (uint64_t)used;
    const char *why;
    uint32_t size;

    while (off + sizeof(struct pm_rec) <= seg_size) {
        if (pm_rec_check(seg, off, lim, &size, &why) < 0) {
            size = pm_rec_torn_rewrite(seg, off, lim);
            if (!size)
                break;
        }
        off += size;
    }
    return (uint32_t)(off - PM_SEG_HDR);
}

uint64_t pm_seg_commit_word(uint32_t used, uint64_t opened, uint32_t index)
{
    uint64_t in = (uint64_t)index << 32 | used;
    uint32_t check = (uint32_t)(XXH3_64bits_withSeed(&in, sizeof(in), opened) >> 32);

    /* Never 0: a zeroed commit word must fail its check. */
    return (uint64_t)(check ? check : 1) << 32 | used;
}

uint32_t pm_seg_hdr_sum(const struct pm_seg_hdr *sh)
{
    return pm_sum(&sh->magic,
                  offsetof(struct pm_seg_hdr, sum) - offsetof(struct pm_seg_hdr, magic));
}

#define SEG_AT(field) ((uint32_t)offsetof(struct pm_seg_hdr, field))

static int seg_bad(uint32_t *where, const char **why, uint32_t at, const char *what)
{
    *where = at;
    *why = what;
    return TERN_ECORRUPT;
}

/* A layout-5 header of a segment in use (seq not 0). */
static int seg_hdr_check5(const struct pm_seg_hdr *sh, uint32_t s, uint32_t seg_size,
                          struct pm_seg_view *v, uint32_t *where, const char **why)
{
    uint32_t used = (uint32_t)sh->commit;

    if (sh->magic != PM_SEG_MAGIC)
        return seg_bad(where, why, SEG_AT(magic), "segment header: bad magic");
    if (sh->index != s)
        return seg_bad(where, why, SEG_AT(index),
                       "segment header: another segment's index (misplaced data?)");
    if (sh->sum != pm_seg_hdr_sum(sh))
        return seg_bad(where, why, SEG_AT(sum),
                       "segment header checksum mismatch (magic, index, flags, first or "
                       "opened damaged)");
    if (sh->seq != sh->opened)
        return seg_bad(where, why, SEG_AT(seq),
                       "segment header: sequence number differs from the one the segment "
                       "was opened with");
    if (sh->flags & ~PM_SEG_FLAGS_KNOWN)
        return seg_bad(where, why, SEG_AT(flags), "segment header: unknown flags");
    if ((sh->flags & PM_SEG_LEASED) && (sh->flags & PM_SEG_TAIL))
        return seg_bad(where, why, SEG_AT(flags), "segment header: leased and tail flags both");
    if (sh->commit != pm_seg_commit_word(used, sh->opened, s))
        return seg_bad(where, why, SEG_AT(commit),
                       "segment header: commit word fails its check");
    if (used > seg_size - PM_SEG_HDR || (used & 7))
        return seg_bad(where, why, SEG_AT(commit),
                       "segment header: commit point out of range");
    if (!pm_seg_first(sh->first, used))
        return seg_bad(where, why, SEG_AT(first),
                       "segment header: records start out of range");
    *v = (struct pm_seg_view){.in_use = true, .leased = (sh->flags & PM_SEG_LEASED) != 0,
                              .tail = (sh->flags & PM_SEG_TAIL) != 0,
                              .seq = sh->seq, .used = used,
                              .first = pm_seg_first(sh->first, used)};
    return 0;
}

/* A header of layout 3 or 4 (no checks but bounds): `used` plain; layout
 * 3 never wrote `first`. */
static int seg_hdr_check_old(const struct pm_seg_hdr *sh, uint32_t s, uint32_t seg_size,
                             uint32_t layout, struct pm_seg_view *v, uint32_t *where,
                             const char **why)
{
    uint32_t first = layout < 4 ? 0 : sh->first;

    if (sh->magic != PM_SEG_MAGIC)
        return seg_bad(where, why, SEG_AT(magic), "segment header: bad magic");
    if (sh->index != s)
        return seg_bad(where, why, SEG_AT(index),
                       "segment header: another segment's index (misplaced data?)");
    if (sh->flags & ~PM_SEG_FLAGS_KNOWN)
        return seg_bad(where, why, SEG_AT(flags), "segment header: unknown flags");
    if (sh->commit > seg_size - PM_SEG_HDR || (sh->commit & 7))
        return seg_bad(where, why, SEG_AT(commit),
                       "segment header: commit point out of range");
    if (!pm_seg_first(first, sh->commit))
        return seg_bad(where, why, SEG_AT(first),
                       "segment header: records start out of range");
    *v = (struct pm_seg_view){.in_use = true, .leased = (sh->flags & PM_SEG_LEASED) != 0,
                              .seq = sh->seq, .used = (uint32_t)sh->commit,
                              .first = pm_seg_first(first, sh->commit)};
    return 0;
}

int pm_seg_hdr_check(const struct pm_seg_hdr *sh, uint32_t s, uint32_t seg_size,
                     uint32_t layout, struct pm_seg_view *v, uint32_t *where, const char **why)
{
    struct pm_seg_hdr h3;

    *v = (struct pm_seg_view){0};
    /* Layout 3 never wrote `first`, and upgrade_hdr clears whatever is
     * there before it reads the header by later rules: judge it so. */
    if (layout < 4 && sh->first) {
        h3 = *sh;
        h3.first = 0;
        sh = &h3;
    }
    /* Free, unless the rest of the header is sound and still counts
     * committed records: then the seq word was lost, not cleared (a free
     * moves the commit point back before it clears seq). Whatever the
     * file's layout: a layout 3 or 4 header never has a sound sum and
     * commit word, so one that has them is a layout-5 header (upgrade_hdr
     * leaves free segments as they are, and the pool reads them by the
     * rules of layout 5 once it has upgraded the file). */
    if (sh->seq == 0) {
        if (sh->magic == PM_SEG_MAGIC && sh->index == s && sh->sum == pm_seg_hdr_sum(sh) &&
            sh->commit == pm_seg_commit_word((uint32_t)sh->commit, sh->opened, s) &&
            (uint32_t)sh->commit > (sh->first > PM_SEG_HDR ? sh->first - PM_SEG_HDR : 0))
            return seg_bad(where, why, SEG_AT(seq),
                           "segment header: marked free (sequence number 0) but its commit "
                           "word counts committed records (sequence number lost?)");
        return 0;
    }
    if (layout < PM_LAYOUT_SEG_SUM) {
        /* Upgraded already (upgrade_hdr converts one segment at a time). */
        if (seg_hdr_check5(sh, s, seg_size, v, where, why) == 0)
            return 0;
        return seg_hdr_check_old(sh, s, seg_size, layout, v, where, why);
    }
    return seg_hdr_check5(sh, s, seg_size, v, where, why);
}

static inline uint8_t *seg_base(const struct pm_pool *p, uint32_t seg)
{
    return p->base + pm_seg_offset(seg, p->seg_size);
}

static inline struct pm_seg_hdr *seg_hdr(const struct pm_pool *p, uint32_t seg)
{
    return (struct pm_seg_hdr *)seg_base(p, seg);
}

static void queue_seg(struct pm_pool *p, uint32_t s)
{
    if (!p->segs[s].queued) {
        p->segs[s].queued = true;
        p->queue[p->n_queued++] = s;
    }
}

/* Note [addr, addr+n) (inside one segment) as written. Flushing waits for
 * the next drain: records are appended back to back, so a record's last
 * cache line is usually the next one's first, and flushing at append time
 * would flush it twice (and on CPUs whose clwb evicts, read it back from
 * memory in between). */
static void mark_written(struct pm_pool *p, const void *addr, size_t n)
{
    uint64_t at = (uint64_t)((const uint8_t *)addr - p->base) - PM_HDR_SIZE;
    uint32_t s = (uint32_t)(at / p->seg_size);
    uint32_t lo = (uint32_t)(at % p->seg_size), hi = lo + (uint32_t)n;
    struct seg_state *ss = &p->segs[s];

    if (ss->dirty_hi == 0 || lo < ss->dirty_lo)
        ss->dirty_lo = lo;
    if (hi > ss->dirty_hi)
        ss->dirty_hi = hi;
    queue_seg(p, s);
}

/* Make everything written so far durable: on PM, flush each segment's
 * written range and fence once; on a file, msync each range. A range of
 * the split threshold or more is cut into pieces that helper threads may
 * take (pm_help); the owner runs whatever they leave and waits for the
 * rest (pm_flush.c). */
static int drain(struct pm_pool *p)
{
    int rc = 0;

    if (p->io_failed)
        return TERN_EIO;
    for (uint32_t i = 0; i < p->n_queued; i++) {
        struct seg_state *ss = &p->segs[p->queue[i]];
        uint8_t *at = seg_base(p, p->queue[i]) + ss->dirty_lo;
        size_t n = ss->dirty_hi - ss->dirty_lo;

        if (!ss->dirty_hi)
            continue;
        rc = pm_flush(p->board, at, n);
        if (rc < 0)
            break;
        ss->dirty_lo = ss->dirty_hi = 0;
    }
    /* Even after a failure: pieces already posted must be finished before
     * the board (or the mapping) can be used again. */
    if (pm_flush_wait(p->board) < 0 || rc < 0) {
        /* pm_flush logged the msync's error. No commit point may move
         * from now on: see run() in pm_flush.c. */
        p->io_failed = true;
        return TERN_EIO;
    }
    return 0;
}

int pm_help(struct pm_pool *p)
{
    return pm_board_help(p->board);
}

/* One 8-byte store, persisted: the only way segment state changes. */
static int persist_word(struct pm_pool *p, uint64_t *word, uint64_t v)
{
    int rc = drain(p);               /* what came before goes first */

    if (rc < 0)
        return rc;
    __atomic_store_n(word, v, __ATOMIC_RELEASE);
    mark_written(p, word, sizeof(*word));
    return drain(p);
}

/* The same, for a word whose store must be durable before what follows it
 * but need not wait for what was written before it: only its line is
 * flushed, so writes pending for a later commit stay pending. */
static int persist_alone(struct pm_pool *p, uint64_t *word, uint64_t v)
{
    int rc;

    if (p->io_failed)
        return TERN_EIO;
    __atomic_store_n(word, v, __ATOMIC_RELEASE);
    rc = pm_flush(p->board, word, sizeof(*word));
    if (pm_flush_wait(p->board) < 0 || rc < 0) {
        p->io_failed = true;
        return TERN_EIO;
    }
    return 0;
}

/* Clear bytes [from, end) of segment s, durably: a hole punched in the
 * file (the file system zeroes the partial pages at its edges and frees
 * the blocks between), made durable by fdatasync; where a hole cannot be
 * punched, stores and a flush. Used before a PM_SEG_TAIL segment takes
 * records, where an earlier life's records, or a crash's cut-short
 * commit, past the commit word would otherwise count at recovery. */
static int zero_tail(struct pm_pool *p, uint32_t s, uint64_t from)
{
    uint64_t at = pm_seg_offset(s, p->seg_size) + from;
    size_t n = p->seg_size - from;

    if (from >= p->seg_size)
        return 0;
    if (fallocate(p->lock_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)at,
                  (off_t)n) == 0)
        return fdatasync(p->lock_fd) < 0 ? TERN_EIO : 0;
    memset(p->base + at, 0, n);
    if (p->is_pmem) {
        pmem_persist(p->base + at, n);
        return 0;
    }
    return pmem_msync(p->base + at, n) < 0 ? TERN_EIO : 0;
}

/* ---- open, create, close ---- */

int pm_sync_dir_of(const char *path)
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

static int create_file(const char *path, const struct pm_opts *o)
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
    return pm_sync_dir_of(path);
}

/* Persist [addr, addr+n) outside any commit (open time only). */
static int persist_now(struct pm_pool *p, void *addr, size_t n)
{
    if (p->is_pmem) {
        pmem_persist(addr, n);
        return 0;
    }
    return pmem_msync(addr, n) < 0 ? TERN_EIO : 0;
}

/* Bring an older layout's file up to this one, so that a crash at any
 * point leaves a file this build opens, and upgrades, again:
 * 1. every segment header is checked by the rules of the file's layout;
 *    one that fails refuses the pool before anything is written;
 * 2. layout 3 never wrote the segment headers' `first` (it should read 0,
 *    "records start after the header"): it is cleared, persisted;
 * 3. layouts 3 and 4 had no header checks: each segment in use gets
 *    `opened` and the header sum, in bytes those layouts left zero and
 *    never read, persisted; then its commit word in the checked form, by
 *    one persisted 8-byte store. One whose header already passes layout
 *    5's checks was done by an upgrade a crash cut short. Free segments
 *    are left alone: zero where the sum goes, their headers read as free;
 * 4. only then does the file header say this build's layout (layout 5
 *    to 6 changes no segment: PM_SEG_TAIL is only set on segments opened
 *    from then on).
 * A file whose upgrade a crash cut short has segments of both forms under
 * a layout-3 or -4 header: older builds refuse it (as corrupt), this one
 * reads both forms and finishes the upgrade. */
static int upgrade_hdr(struct pm_pool *p, const char *path)
{
    struct pm_file_hdr *h = (struct pm_file_hdr *)p->base;
    uint32_t from = h->layout;
    int rc;

    for (uint32_t s = 0; s < h->n_segs; s++) {
        struct pm_seg_view v;
        const char *why;
        uint32_t at;

        rc = pm_seg_hdr_check(seg_hdr(p, s), s, h->seg_size, from, &v, &at, &why);
        if (rc < 0) {
            tern_log(TERN_LOG_ERROR, "pm", "%s: offset %llu (segment %u + %u): %s (layout %u, "
                     "not upgraded)", path,
                     (unsigned long long)(pm_seg_offset(s, h->seg_size) + at), s, at, why, from);
            return rc;
        }
    }
    for (uint32_t s = 0; s < h->n_segs && from < 4; s++) {
        struct pm_seg_hdr *sh = seg_hdr(p, s);

        if (sh->first) {
            sh->first = 0;
            rc = persist_now(p, &sh->first, sizeof(sh->first));
            if (rc < 0)
                return rc;
        }
    }
    for (uint32_t s = 0; s < h->n_segs; s++) {
        struct pm_seg_hdr *sh = seg_hdr(p, s);
        struct pm_seg_view v;
        const char *why;
        uint32_t at;

        if (!sh->seq ||
            pm_seg_hdr_check(sh, s, h->seg_size, PM_LAYOUT, &v, &at, &why) == 0)
            continue;
        sh->opened = sh->seq;
        sh->sum = pm_seg_hdr_sum(sh);
        rc = persist_now(p, &sh->opened, offsetof(struct pm_seg_hdr, reserved) -
                                              offsetof(struct pm_seg_hdr, opened));
        if (rc < 0)
            return rc;
        __atomic_store_n(&sh->commit, pm_seg_commit_word((uint32_t)sh->commit, sh->seq, s),
                         __ATOMIC_RELEASE);
        rc = persist_now(p, &sh->commit, sizeof(sh->commit));
        if (rc < 0)
            return rc;
    }
    tern_log(TERN_LOG_INFO, "pm", "%s: layout %u upgraded to %u", path, from, PM_LAYOUT);
    h->layout = PM_LAYOUT;
    h->sum = pm_sum(h, offsetof(struct pm_file_hdr, sum));
    return persist_now(p, h, sizeof(*h));
}

/* The descriptor pm_fd hands out, for registering the pool with a
 * fabric: the file opened again, a separate open file description. A
 * flock belongs to the open file description, and every duplicate of
 * lock_fd (a shm peer receives one over SCM_RIGHTS when it maps a lease;
 * its mapping alone keeps the description alive) would share the lock:
 * the peer could drop it with flock(LOCK_UN) while we run, and would keep
 * it after we die, so that a restarted server found the pool busy for as
 * long as that client lived. */
static int open_share_fd(struct pm_pool *p, const char *path, const struct stat *locked)
{
    struct stat st;

    p->share_fd = open(path, O_RDWR | O_CLOEXEC);
    if (p->share_fd < 0)
        return errno == EACCES ? TERN_EACCES : TERN_EIO;
    if (fstat(p->share_fd, &st) < 0 || st.st_dev != locked->st_dev ||
        st.st_ino != locked->st_ino) {
        tern_log(TERN_LOG_ERROR, "pm", "%s was replaced while it was being opened", path);
        return TERN_EIO;
    }
    return 0;
}

#define PM_LOCK_WAIT_MS 200

int pm_open(const char *path, const struct pm_opts *o, struct pm_pool **out)
{
    struct pm_pool *p;
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
    p->lock_fd = p->share_fd = -1;
    p->head = NO_SEG;
    /* An exclusive lock for the pool's lifetime: two writers would each
     * believe they own the free segments. */
    p->lock_fd = open(path, O_RDWR | O_CLOEXEC);
    if (p->lock_fd < 0) {
        rc = errno == EACCES ? TERN_EACCES : TERN_EIO;
        goto fail;
    }
    /* A pool whose owner was just killed may stay locked a few
     * milliseconds past the owner's reaping (seen after a SIGKILL with shm
     * clients attached: the last reference to the lock's file goes in the
     * kernel's deferred work): wait up to PM_LOCK_WAIT_MS for it before
     * calling it in use. */
    for (int waited = 0; flock(p->lock_fd, LOCK_EX | LOCK_NB) < 0; waited++) {
        if (errno == EWOULDBLOCK && waited < PM_LOCK_WAIT_MS) {
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
            continue;
        }
        tern_log(TERN_LOG_ERROR, "pm", "%s is in use by another process", path);
        rc = TERN_EBUSY;
        goto fail;
    }
    if (fstat(p->lock_fd, &st) < 0 || (uint64_t)st.st_size < PM_HDR_SIZE) {
        tern_log(TERN_LOG_ERROR, "pm", "%s: too short to be a pool", path);
        rc = TERN_ECORRUPT;
        goto fail;
    }
    rc = open_share_fd(p, path, &st);
    if (rc < 0)
        goto fail;
    p->base = pmem_map_file(path, 0, 0, 0, &p->len, &is_pmem);
    if (!p->base) {
        tern_log(TERN_LOG_ERROR, "pm", "map %s: %s", path, strerror(errno));
        rc = TERN_EIO;
        goto fail;
    }
    p->is_pmem = is_pmem != 0;
    p->strict = o && o->strict_commit;
    h = (const struct pm_file_hdr *)p->base;
    rc = pm_hdr_check(h, p->len, &why);
    if (rc < 0) {
        tern_log(TERN_LOG_ERROR, "pm", "%s: offset 0: %s", path, why);
        goto fail;
    }
    p->seg_size = h->seg_size;
    p->n_segs = h->n_segs;
    if (h->layout < PM_LAYOUT) {
        rc = upgrade_hdr(p, path);
        if (rc < 0)
            goto fail;
    }
    memcpy(p->uuid, h->uuid, sizeof(p->uuid));
    p->segs = calloc(p->n_segs, sizeof(*p->segs));
    p->free_segs = calloc(p->n_segs, sizeof(*p->free_segs));
    p->queue = calloc(p->n_segs, sizeof(*p->queue));
    p->board = pm_board_new(p->is_pmem, o ? o->split_flush : 0);
    if (!p->segs || !p->free_segs || !p->queue || !p->board) {
        rc = TERN_ENOMEM;
        goto fail;
    }
    *out = p;
    return 0;
fail:
    pm_close(p);
    return rc;
}

void pm_close(struct pm_pool *p)
{
    if (!p)
        return;
    /* Commit words that lag are brought up to what is durable, so that a
     * pool closed in order has nothing past them. What was appended and
     * not committed stays uncommitted. */
    for (uint32_t s = 0; p->recovered && !p->io_failed && s < p->n_segs; s++) {
        struct seg_state *ss = &p->segs[s];

        if (ss->seq && ss->tail && ss->hdr_commit != ss->committed &&
            persist_word(p, &seg_hdr(p, s)->commit,
                         pm_seg_commit_word(ss->committed, ss->seq, s)) < 0)
            break;
    }
    if (p->base)
        pmem_unmap(p->base, p->len);
    if (p->share_fd >= 0)
        close(p->share_fd);
    if (p->lock_fd >= 0)
        close(p->lock_fd);     /* drops the lock */
    free(p->segs);
    free(p->free_segs);
    free(p->queue);
    pm_board_free(p->board);
    free(p);
}

/* ---- recovery ---- */

/* A leased segment holding a record that fails its checks: the lessee wrote
 * over its own committed records. Its commit point comes down to the last
 * good record, so that the segment is sound from now on, and the other
 * segments (other clients' records) are recovered as usual. */
static int cut_leased(struct pm_pool *p, uint32_t s, uint64_t off, const char *why)
{
    struct seg_state *ss = &p->segs[s];
    uint32_t keep = (uint32_t)(off - PM_SEG_HDR);
    int rc;

    tern_log(TERN_LOG_WARN, "pm",
             "offset %llu (segment %u + %llu): %s; the segment was leased, its %u bytes "
             "from here on are dropped",
             (unsigned long long)(pm_seg_offset(s, p->seg_size) + off), s,
             (unsigned long long)off, why, ss->committed - keep);
    rc = persist_word(p, &seg_hdr(p, s)->commit, pm_seg_commit_word(keep, ss->seq, s));
    if (rc < 0)
        return rc;
    ss->live -= ss->committed - keep;
    ss->committed = ss->appended = ss->hdr_commit = keep;
    return 0;
}

/* Hand segment s's committed records to fn, stepping over interrupted
 * rewrites (their bytes count as dead). */
static int recover_seg(struct pm_pool *p, uint32_t s, bool leased, pm_visit_fn fn,
                       void *arg)
{
    struct seg_state *ss = &p->segs[s];
    uint64_t seg_off = pm_seg_offset(s, p->seg_size);
    const uint8_t *seg = seg_base(p, s);

    /* The last commit's records lie past a lagging commit word: they count
     * up to the first that fails (what the crash cut short, never
     * acknowledged). Below the word every record must pass, as ever. */
    if (ss->tail) {
        uint32_t end = pm_seg_tail(seg, p->seg_size, ss->committed);

        if (end != ss->committed)
            tern_log(TERN_LOG_INFO, "pm", "segment %u: %u bytes of records past its commit "
                     "word (the last commit before the stop)", s, end - ss->committed);
        ss->live += end - ss->committed;
        ss->committed = ss->appended = end;
    }

    for (uint64_t off = ss->first; off < PM_SEG_HDR + ss->committed;) {
        const struct pm_rec *r = (const void *)(seg + off);
        const char *why;
        uint32_t size;
        int rc = pm_rec_check(seg, off, ss->committed, &size, &why);

        if (rc == 0) {
            if (r->version > p->version)
                p->version = r->version;
            rc = fn ? fn(arg, (uint64_t)s << 32 | off, r) : 0;
            if (rc < 0)
                return rc;
            off += size;
            continue;
        }
        size = pm_rec_torn_rewrite(seg, off, ss->committed);
        if (size) {
            /* Never acknowledged, and the record it replaced was not the
             * key's newest: nothing is lost by skipping it. */
            tern_log(TERN_LOG_INFO, "pm",
                     "offset %llu (segment %u + %llu): interrupted rewrite (%s), %u bytes skipped",
                     (unsigned long long)(seg_off + off), s, (unsigned long long)off, why, size);
            ss->live -= size;
            off += size;
            continue;
        }
        if (leased)
            return cut_leased(p, s, off, why);
        tern_log(TERN_LOG_ERROR, "pm", "offset %llu (segment %u + %llu): %s",
                 (unsigned long long)(seg_off + off), s, (unsigned long long)off, why);
        return rc;
    }
    return 0;
}

/* The order recovery walks segments in: those the pool appended to, newest
 * first, then those that were leased. A cleaner's copy always lies in a
 * segment appended to after its original's (the head, or one opened as the
 * head during the clean) and never in a leased one, so the copy comes
 * first. */
struct walk_ent {
    uint64_t seq;
    uint32_t seg;
    bool leased;
};

static int walk_order(const void *a, const void *b)
{
    const struct walk_ent *x = a, *y = b;

    if (x->leased != y->leased)
        return x->leased ? 1 : -1;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

int pm_recover(struct pm_pool *p, pm_visit_fn fn, void *arg)
{
    uint32_t newest = NO_SEG, n = 0;
    uint64_t newest_seq = 0;
    struct walk_ent *order;
    int rc = 0;

    if (p->recovered)
        return TERN_EINVAL;
    order = malloc(p->n_segs * sizeof(*order));
    if (!order)
        return TERN_ENOMEM;
    /* Every header is checked before any record is walked (or a leased
     * segment cut): a pool refused for a bad header is left as it was. */
    for (uint32_t s = p->n_segs; s-- > 0;) {
        uint64_t seg_off = pm_seg_offset(s, p->seg_size);
        struct pm_seg_view v;
        const char *why;
        uint32_t at;

        rc = pm_seg_hdr_check(seg_hdr(p, s), s, p->seg_size, PM_LAYOUT, &v, &at, &why);
        if (rc < 0) {
            tern_log(TERN_LOG_ERROR, "pm", "offset %llu (segment %u + %u): %s",
                     (unsigned long long)(seg_off + at), s, at, why);
            goto out;
        }
        if (!v.in_use) {
            p->free_segs[p->n_free++] = s;
            continue;
        }
        p->segs[s].seq = v.seq;
        p->segs[s].first = v.first;
        p->segs[s].tail = v.tail;
        p->segs[s].appended = p->segs[s].committed = p->segs[s].hdr_commit = v.used;
        p->segs[s].live = v.used - (v.first - PM_SEG_HDR);
        if (v.seq > p->seq)
            p->seq = v.seq;
        /* Appends continue in the newest segment the server wrote itself:
         * a once-leased one is sealed, whatever its sequence number. */
        if (!v.leased && v.seq > newest_seq) {
            newest_seq = v.seq;
            newest = s;
        }
        order[n++] = (struct walk_ent){.seq = v.seq, .seg = s, .leased = v.leased};
    }
    qsort(order, n, sizeof(*order), walk_order);
    for (uint32_t i = 0; i < n && rc == 0; i++)
        rc = recover_seg(p, order[i].seg, order[i].leased, fn, arg);
    if (rc < 0)
        goto out;
    /* Whatever lies past the head's commit point (a torn append) is
     * overwritten; on a PM_SEG_TAIL head it is cleared first, so that no
     * record of the crash's cut-short commit can join the records written
     * from now on. No lease survives a restart: its lessee is gone. */
    p->head = newest;
    if (newest != NO_SEG && p->segs[newest].tail) {
        rc = zero_tail(p, newest, PM_SEG_HDR + p->segs[newest].appended);
        if (rc < 0)
            goto out;
    }
    p->recovered = true;
out:
    free(order);
    return rc;
}

/* ---- appends and commits ---- */

const struct pm_rec *pm_rec_at(const struct pm_pool *p, pm_loc loc)
{
    return (const struct pm_rec *)(seg_base(p, (uint32_t)(loc >> 32)) + (uint32_t)loc);
}

int pm_rec_read(const struct pm_pool *p, pm_loc loc, struct pm_rec *hdr)
{
    uint32_t s = (uint32_t)(loc >> 32), off = (uint32_t)loc;
    uint64_t end;

    if (s >= p->n_segs)
        return TERN_ECORRUPT;
    end = PM_SEG_HDR + (uint64_t)p->segs[s].appended;
    if ((uint64_t)off + sizeof(*hdr) > end)
        return TERN_ECORRUPT;
    /* One copy, judged and used: a lessee may be rewriting the header. */
    memcpy(hdr, pm_rec_at(p, loc), sizeof(*hdr));
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (!hdr->key_len || hdr->key_len > PM_KEY_MAX ||
        !pm_rec_type_ok(hdr->type, hdr->val_len) || hdr->val_len > p->seg_size ||
        off + (uint64_t)pm_rec_size(hdr->key_len, hdr->val_len) > end)
        return TERN_ECORRUPT;
    return 0;
}

uint32_t pm_val_max(const struct pm_pool *p, uint32_t key_len)
{
    uint32_t room = p->seg_size - PM_SEG_HDR - (uint32_t)sizeof(struct pm_rec);

    return key_len >= room ? 0 : (room - key_len) & ~7u;
}

uint64_t pm_next_version(struct pm_pool *p)
{
    return ++p->version;
}

uint64_t pm_version(const struct pm_pool *p)
{
    return p->version;
}

void pm_raise_version(struct pm_pool *p, uint64_t v)
{
    if (v > p->version)
        p->version = v;
}

uint32_t pm_free_segs(const struct pm_pool *p)
{
    return p->n_free;
}

uint32_t pm_seg_count(const struct pm_pool *p)
{
    return p->n_segs;
}

uint32_t pm_slot_size(const struct pm_pool *p, pm_loc loc)
{
    return pm_rec_span(pm_rec_at(p, loc));
}

/* Move the commit point of `s` over everything appended to it. */
static int commit_seg(struct pm_pool *p, uint32_t s)
{
    struct seg_state *ss = &p->segs[s];
    int rc;

    if (ss->committed == ss->appended)
        return 0;
    /* persist_word drains the records before it stores the point. */
    rc = persist_word(p, &seg_hdr(p, s)->commit, pm_seg_commit_word(ss->appended, ss->seq, s));
    if (rc < 0)
        return rc;
    ss->committed = ss->hdr_commit = ss->appended;
    return 0;
}

/* pm_commit on PM_SEG_TAIL segments: one drain makes the records durable,
 * and recovery finds them past the commit word (pm_seg_tail). The word
 * moves up to what earlier commits made durable once it lags by
 * PM_TAIL_LAG or more, in the same drain: most commits then write only the
 * pages of their records. The lag bounds what recovery reads past the word,
 * where a record that fails its checks ends the segment instead of
 * refusing the pool (as it must for the last commit before a crash). */
#define PM_TAIL_LAG (64u * 1024)

static int commit_tail(struct pm_pool *p)
{
    int rc;

    for (uint32_t i = 0; i < p->n_queued; i++) {
        uint32_t s = p->queue[i];
        struct seg_state *ss = &p->segs[s];

        if (ss->committed - ss->hdr_commit < PM_TAIL_LAG)
            continue;
        __atomic_store_n(&seg_hdr(p, s)->commit, pm_seg_commit_word(ss->committed, ss->seq, s),
                         __ATOMIC_RELEASE);
        mark_written(p, &seg_hdr(p, s)->commit, sizeof(uint64_t));
    }
    rc = drain(p);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < p->n_queued; i++) {
        struct seg_state *ss = &p->segs[p->queue[i]];

        if (ss->committed - ss->hdr_commit >= PM_TAIL_LAG)
            ss->hdr_commit = ss->committed;
        ss->committed = ss->appended;
        ss->queued = false;
    }
    p->n_queued = 0;
    return 0;
}

/* Can this commit be one drain? Only if every segment with new records
 * lets its commit word lag (a leased segment, or one opened by an older
 * build or on PM, does not). On PM two fences cost little: the order
 * stays records, then words. */
static bool tail_commit_ok(const struct pm_pool *p)
{
    if (p->is_pmem)
        return false;
    for (uint32_t i = 0; i < p->n_queued; i++) {
        const struct seg_state *ss = &p->segs[p->queue[i]];

        if (ss->committed != ss->appended && !ss->tail)
            return false;
    }
    return true;
}

int pm_commit(struct pm_pool *p)
{
    int rc;

    if (tail_commit_ok(p))
        return commit_tail(p);
    /* Every record first, then every commit point over them: two fences
     * however many segments were written. A segment queued only for a
     * rewrite moves no point but is drained all the same. */
    rc = drain(p);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < p->n_queued; i++) {
        uint32_t s = p->queue[i];
        struct pm_seg_hdr *sh = seg_hdr(p, s);

        if (p->segs[s].committed == p->segs[s].appended)
            continue;
        __atomic_store_n(&sh->commit, pm_seg_commit_word(p->segs[s].appended, p->segs[s].seq, s),
                         __ATOMIC_RELEASE);
        mark_written(p, &sh->commit, sizeof(sh->commit));
    }
    rc = drain(p);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < p->n_queued; i++) {
        struct seg_state *ss = &p->segs[p->queue[i]];

        /* A word stored above is exact; one that lags (a PM_SEG_TAIL
         * segment queued for a rewrite only) still lags. */
        if (ss->committed != ss->appended)
            ss->committed = ss->hdr_commit = ss->appended;
        ss->queued = false;
    }
    p->n_queued = 0;
    return 0;
}

/* Free segments are held back in two tiers: the last one for the cleaner,
 * which needs room to copy live records into, and one more for tombstones,
 * so that a pool full of values still takes the deletes that let it be
 * cleaned. */
static uint32_t keep_free(const struct pm_pool *p, enum pm_rec_type type)
{
    return p->cleaning ? 0 : type == PM_TOMBSTONE ? 1 : 2;
}

/* Take a free segment whose records start at `first`. Its header is whole
 * and summed (magic, index, flags, first, opened, and a commit word that
 * counts nothing) before seq makes it count; every field is written, since
 * a segment once leased and then cleaned still carries the old values.
 * The bytes before `first` count as committed, so that the commit point
 * still counts from the header's end. */
static int open_seg(struct pm_pool *p, uint32_t flags, uint32_t first, uint32_t *out)
{
    struct pm_seg_hdr *sh;
    uint64_t seq = p->seq + 1;
    uint32_t s;
    int rc;

    s = p->free_segs[--p->n_free];
    sh = seg_hdr(p, s);
    /* Through a file, a segment the pool appends to lets its commit word
     * lag (PM_SEG_TAIL): its bytes past the header must hold nothing from
     * an earlier life first. */
    if (!p->is_pmem && !p->strict && !(flags & PM_SEG_LEASED)) {
        flags |= PM_SEG_TAIL;
        if (sh->magic) {
            rc = zero_tail(p, s, PM_SEG_HDR);
            if (rc < 0) {
                p->free_segs[p->n_free++] = s;
                return rc;
            }
        }
    }
    sh->commit = pm_seg_commit_word(first - PM_SEG_HDR, seq, s);
    sh->magic = PM_SEG_MAGIC;
    sh->index = s;
    sh->flags = flags;
    sh->first = first == PM_SEG_HDR ? 0 : first;
    sh->opened = seq;
    sh->sum = pm_seg_hdr_sum(sh);
    mark_written(p, sh, sizeof(*sh));
    rc = persist_word(p, &sh->seq, seq);
    if (rc < 0) {
        p->free_segs[p->n_free++] = s;
        return rc;
    }
    p->seq = seq;
    p->segs[s] = (struct seg_state){.seq = p->seq, .first = first,
                                    .appended = first - PM_SEG_HDR,
                                    .committed = first - PM_SEG_HDR,
                                    .hdr_commit = first - PM_SEG_HDR,
                                    .leased = (flags & PM_SEG_LEASED) != 0,
                                    .tail = (flags & PM_SEG_TAIL) != 0,
                                    .queued = p->segs[s].queued};
    *out = s;
    return 0;
}

/* Start appending to a fresh segment. The old head is committed first: it
 * is no longer the head, so cleaning may pick it, and cleaning only copies
 * what lies below a commit point. */
static int open_head(struct pm_pool *p, enum pm_rec_type type)
{
    int rc;

    if (p->n_free <= keep_free(p, type))
        return TERN_ENOSPC;
    if (p->head != NO_SEG) {
        rc = commit_seg(p, p->head);
        if (rc < 0)
            return rc;
    }
    return open_seg(p, 0, PM_SEG_HDR, &p->head);
}

int pm_append(struct pm_pool *p, enum pm_rec_type type, uint64_t version,
                   const void *key, uint16_t key_len, const void *val, uint32_t val_len,
                   pm_loc *loc)
{
    uint32_t size = pm_rec_size(key_len, val_len);
    struct pm_rec *r;
    struct seg_state *ss;
    uint8_t *dst;
    int rc;

    if (!p->recovered || !key_len || !pm_rec_type_ok(type, val_len))
        return TERN_EINVAL;
    if (key_len > PM_KEY_MAX || val_len > pm_val_max(p, key_len))
        return TERN_E2BIG;
    if (p->head == NO_SEG ||
        p->segs[p->head].appended + size > p->seg_size - PM_SEG_HDR) {
        rc = open_head(p, type);
        if (rc < 0)
            return rc;
    }
    ss = &p->segs[p->head];
    dst = seg_base(p, p->head) + PM_SEG_HDR + ss->appended;
    r = (struct pm_rec *)dst;
    *r = (struct pm_rec){.val_len = val_len, .version = version, .key_len = key_len,
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

void pm_dead(struct pm_pool *p, pm_loc loc)
{
    struct seg_state *ss = &p->segs[loc >> 32];
    uint32_t size = pm_slot_size(p, loc);

    ss->live = ss->live > size ? ss->live - size : 0;
}

/* ---- rewrites in place ---- */

/* The word of a record that holds key_len, type, flags and slot: the one
 * 8-byte store that marks a record as being rewritten. */
_Static_assert(offsetof(struct pm_rec, key_len) == 16 &&
               offsetof(struct pm_rec, slot) + sizeof(uint32_t) == 24,
               "key_len, type, flags and slot share the record's third word");

static inline uint64_t *rec_word(struct pm_rec *r)
{
    return (uint64_t *)((uint8_t *)r + offsetof(struct pm_rec, key_len));
}

/* Where a rewrite may go: a whole record below the commit point of a
 * segment in use and not leased. A lessee may write into its segment at
 * any time; an acknowledged rewrite it tore would pass at recovery for an
 * interrupted one and vanish without a word. */
static int rewrite_target(const struct pm_pool *p, pm_loc loc, struct pm_rec **out)
{
    uint32_t s = (uint32_t)(loc >> 32), off = (uint32_t)loc;
    const struct seg_state *ss;
    struct pm_rec *r;
    uint64_t end;

    if (s >= p->n_segs)
        return TERN_EINVAL;
    ss = &p->segs[s];
    end = PM_SEG_HDR + (uint64_t)ss->committed;
    if (!ss->seq || ss->leased || off < ss->first || (off & 7) || off + sizeof(*r) > end)
        return TERN_EINVAL;
    r = (struct pm_rec *)(seg_base(p, s) + off);
    if (off + (uint64_t)pm_rec_span(r) > end)
        return TERN_EINVAL;
    *out = r;
    return 0;
}

/* Step (a): the old record's third word with the flag set and the slot
 * spelt out, stored in one piece and persisted before any new byte goes in.
 * The old checksum no longer matches, on purpose: from here until the new
 * record is whole and durable, recovery steps over the slot, and as the old
 * record was not the key's newest version nothing is lost. */
static int mark_rewriting(struct pm_pool *p, struct pm_rec *r, uint32_t slot,
                          bool alone)
{
    struct pm_rec h = *r;
    uint64_t v;

    h.flags |= PM_F_REWRITTEN;
    h.slot = slot;
    memcpy(&v, rec_word(&h), sizeof(v));
    /* Already marked (rewritten before): that mark was persisted then. */
    if (*rec_word(r) == v)
        return 0;
    return alone ? persist_alone(p, rec_word(r), v) : persist_word(p, rec_word(r), v);
}

/* Step (b): the new record over the slot at r (the key is already there),
 * durable at the next commit. The value may come from the pool itself, even
 * from this very slot. */
static void rewrite_slot(struct pm_pool *p, struct pm_rec *r, uint32_t slot,
                         uint8_t flags, enum pm_rec_type type, uint64_t version,
                         uint16_t key_len, const void *val, uint32_t val_len)
{
    uint32_t size = pm_rec_size(key_len, val_len);
    uint8_t *dst = (uint8_t *)r;

    if (val_len)
        memmove(dst + sizeof(*r) + key_len, val, val_len);
    memset(dst + sizeof(*r) + key_len + val_len, 0, size - sizeof(*r) - key_len - val_len);
    r->val_len = val_len;
    r->version = version;
    r->type = (uint8_t)type;
    r->flags = flags;
    r->slot = slot;
    r->sum = pm_rec_sum(r);
    mark_written(p, dst, size);
    if (version > p->version)
        p->version = version;
}

/* A rewrite's arguments, and the slot at loc is the same key's and can
 * hold the new record: 0 with *slot set, or the error to return. */
static int rewrite_fits(struct pm_rec *r, enum pm_rec_type type, const void *key,
                        uint16_t key_len, const void *val, uint32_t val_len, uint32_t *slot)
{
    if (!key_len || !pm_rec_type_ok(type, val_len) || (!val && val_len))
        return TERN_EINVAL;
    if (key_len > PM_KEY_MAX)
        return TERN_E2BIG;
    /* Another key's slot would leave two keys' records where the caller's
     * index expects one. */
    if (r->key_len != key_len || memcmp(pm_rec_key(r), key, key_len) != 0)
        return TERN_EINVAL;
    *slot = pm_rec_span(r);
    if (val_len > *slot || pm_rec_size(key_len, val_len) > *slot)
        return TERN_E2BIG;
    return 0;
}

static int overwrite(struct pm_pool *p, pm_loc loc, enum pm_rec_type type,
                     uint64_t version, const void *key, uint16_t key_len, const void *val,
                     uint32_t val_len, bool behind)
{
    struct seg_state *ss;
    struct pm_rec *r;
    uint32_t slot;
    int rc;

    if (!p->recovered)
        return TERN_EINVAL;
    rc = rewrite_target(p, loc, &r);
    if (rc == 0)
        rc = rewrite_fits(r, type, key, key_len, val, val_len, &slot);
    if (rc < 0)
        return rc;
    ss = &p->segs[loc >> 32];
    /* The key's newer version, which makes the old record expendable, may
     * still be above a commit point; committed first, a crash cannot leave
     * the key with neither. Free when nothing is pending, and not needed
     * when the caller knows that version is durable (behind). */
    rc = behind ? 0 : pm_commit(p);
    if (rc == 0)
        rc = mark_rewriting(p, r, slot, behind);
    if (rc < 0)
        return rc;
    rewrite_slot(p, r, slot, PM_F_REWRITTEN, type, version, key_len, val, val_len);
    /* The caller counted the old record dead; the slot holds a live one
     * again. */
    ss->live = ss->live + slot < ss->appended ? ss->live + slot : ss->appended;
    return 0;
}

int pm_overwrite(struct pm_pool *p, pm_loc loc, enum pm_rec_type type,
                      uint64_t version, const void *key, uint16_t key_len, const void *val,
                      uint32_t val_len)
{
    return overwrite(p, loc, type, version, key, key_len, val, val_len, false);
}

int pm_overwrite_behind(struct pm_pool *p, pm_loc loc,
                             enum pm_rec_type type, uint64_t version, const void *key,
                             uint16_t key_len, const void *val, uint32_t val_len)
{
    return overwrite(p, loc, type, version, key, key_len, val, val_len, true);
}

int pm_rewrite_pending(struct pm_pool *p, pm_loc loc,
                            enum pm_rec_type type, uint64_t version, const void *key,
                            uint16_t key_len, const void *val, uint32_t val_len)
{
    uint32_t s = (uint32_t)(loc >> 32), off = (uint32_t)loc, slot;
    const struct seg_state *ss;
    struct pm_rec *r;
    int rc;

    if (!p->recovered || s >= p->n_segs)
        return TERN_EINVAL;
    ss = &p->segs[s];
    if (!ss->seq || ss->leased || off < ss->first || (off & 7) ||
        off + sizeof(*r) > PM_SEG_HDR + (uint64_t)ss->appended)
        return TERN_EINVAL;
    r = (struct pm_rec *)(seg_base(p, s) + off);
    if (off + (uint64_t)pm_rec_span(r) > PM_SEG_HDR + (uint64_t)ss->appended)
        return TERN_EINVAL;
    /* Past the commit point recovery never reads it; below, only a slot
     * rewritten before may go again: its mark is persisted, so a torn
     * record there is an interrupted rewrite that recovery skips. */
    if (off < PM_SEG_HDR + ss->committed && !(r->flags & PM_F_REWRITTEN))
        return TERN_EINVAL;
    rc = rewrite_fits(r, type, key, key_len, val, val_len, &slot);
    if (rc < 0)
        return rc;
    /* The slot stays as long as it was, and live as it was. */
    rewrite_slot(p, r, slot, r->flags, type, version, key_len, val, val_len);
    return 0;
}

/* ---- leased segments ---- */

int pm_lease(struct pm_pool *p, uint32_t *seg)
{
    uint32_t page = (uint32_t)sysconf(_SC_PAGESIZE);

    if (!p->recovered || !seg)
        return TERN_EINVAL;
    /* The lessee's first page must leave it room for records. */
    if (page < PM_SEG_HDR || page > p->seg_size / 2)
        return TERN_ENOTSUP;
    if (p->n_free <= keep_free(p, PM_VALUE))
        return TERN_ENOSPC;
    return open_seg(p, PM_SEG_LEASED, page, seg);
}

uint64_t pm_seg_file_off(const struct pm_pool *p, uint32_t seg)
{
    return pm_seg_offset(seg, p->seg_size);
}

uint32_t pm_seg_room(const struct pm_pool *p)
{
    return p->seg_size - PM_SEG_HDR;
}

uint32_t pm_lease_next(const struct pm_pool *p, uint32_t seg)
{
    if (seg >= p->n_segs || !p->segs[seg].leased)
        return 0;
    return PM_SEG_HDR + p->segs[seg].appended;
}

/* Is a lessee's record header (the pool's own copy of it) one the pool
 * can take at `off`? */
static bool lessee_hdr_ok(const struct pm_pool *p, const struct pm_rec *h,
                          uint32_t off)
{
    if (h->type != PM_VALUE && h->type != PM_TOMBSTONE)
        return false;
    if (h->flags || h->slot)     /* the pool's to set: they are in the sum */
        return false;
    if ((h->type == PM_TOMBSTONE && h->val_len) || !h->key_len ||
        h->key_len > PM_KEY_MAX)
        return false;
    /* val_len first: a huge one would wrap the record's size. */
    return h->val_len <= p->seg_size &&
           pm_rec_size(h->key_len, h->val_len) <= p->seg_size - off;
}

int pm_lease_append(struct pm_pool *p, uint32_t seg, uint32_t off, uint64_t version,
                         pm_loc *loc)
{
    struct pm_rec h, *r;
    struct seg_state *ss;
    uint32_t size;
    uint8_t *dst;

    if (!p->recovered || seg >= p->n_segs || !p->segs[seg].leased)
        return TERN_EINVAL;
    ss = &p->segs[seg];
    if (off != PM_SEG_HDR + ss->appended)
        return TERN_EINVAL;
    if (p->seg_size - off < sizeof(h))
        return TERN_EPROTO;
    dst = seg_base(p, seg) + off;
    r = (struct pm_rec *)dst;
    /* One copy, and from here on only the copy: the lessee can still write
     * the header, and a length that changed between its check and its use
     * would send the checksum past the segment. The fence keeps the
     * compiler from reading the pool again in place of the copy. */
    memcpy(&h, dst, sizeof(h));
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (!lessee_hdr_ok(p, &h, off))
        return TERN_EPROTO;
    size = pm_rec_size(h.key_len, h.val_len);
    /* The lessee summed its record with its own version field; swapping in
     * the real version changes the sum by the version part alone. The body
     * is not read here: the lessee vouches for it, and a lessee that lied
     * loses only its own records (recovery cuts a leased segment at the
     * first bad record). */
    *r = (struct pm_rec){.sum = h.sum ^ pm_rec_meta_sum(h.version, h.val_len) ^
                                     pm_rec_meta_sum(version, h.val_len),
                              .val_len = h.val_len, .version = version, .key_len = h.key_len,
                              .type = h.type};
    memset(dst + sizeof(h) + h.key_len + h.val_len, 0, size - sizeof(h) - h.key_len - h.val_len);
    mark_written(p, dst, size);
    *loc = (uint64_t)seg << 32 | off;
    ss->appended += size;
    ss->live += size;
    if (version > p->version)
        p->version = version;
    return 0;
}

/* The lessee could write its records until now, those the pool took
 * included: check them as recovery would. A segment where one fails is
 * never cleaned, as the cleaner walks records by their headers and copies
 * them by their lengths; its records stay where the owner's index has
 * them (readers check what they read, pm_rec_read), and recovery cuts the
 * segment at that record. */
static void lease_check(struct pm_pool *p, uint32_t seg)
{
    struct seg_state *ss = &p->segs[seg];
    const uint8_t *base = seg_base(p, seg);
    const char *why;

    for (uint64_t off = ss->first, size; off < PM_SEG_HDR + (uint64_t)ss->committed;
         off += size) {
        uint32_t sz;

        if (pm_rec_check(base, off, ss->committed, &sz, &why) < 0) {
            tern_log(TERN_LOG_WARN, "pm", "segment %u + %llu: %s, written by its lessee; "
                     "the segment is not cleaned until recovery cuts it there",
                     seg, (unsigned long long)off, why);
            ss->damaged = true;
            return;
        }
        size = sz;
    }
}

void pm_lease_end(struct pm_pool *p, uint32_t seg)
{
    struct seg_state *ss;
    uint32_t dropped;

    if (seg >= p->n_segs || !p->segs[seg].leased)
        return;
    ss = &p->segs[seg];
    dropped = ss->appended - ss->committed;
    ss->live = ss->live > dropped ? ss->live - dropped : 0;
    ss->appended = ss->committed;
    ss->leased = false;
    lease_check(p, seg);
}

void *pm_base(const struct pm_pool *p)
{
    return p->base;
}

size_t pm_map_len(const struct pm_pool *p)
{
    return p->len;
}

int pm_fd(const struct pm_pool *p)
{
    return p->share_fd;
}

/* ---- cleaning ---- */

/* The sealed segment with the fewest live bytes, if below the limit. A
 * leased segment is not sealed: its lessee may be writing the next record. */
static uint32_t pick_victim(const struct pm_pool *p, unsigned max_live_pct)
{
    uint64_t cap = p->seg_size - PM_SEG_HDR;
    uint32_t best = NO_SEG;

    for (uint32_t s = 0; s < p->n_segs; s++) {
        const struct seg_state *ss = &p->segs[s];

        if (!ss->seq || s == p->head || ss->leased || ss->damaged ||
            (uint64_t)ss->live * 100 >= cap * max_live_pct)
            continue;
        if (best == NO_SEG || ss->live < p->segs[best].live)
            best = s;
    }
    return best;
}

/* A slot that recovery stepped over (an interrupted rewrite): nobody holds
 * it and its bytes are no record, so the owner never hears of it. In a
 * running pool every other record with the flag is whole, so only those
 * are summed. */
static bool is_hole(const struct pm_pool *p, uint32_t s, uint64_t off)
{
    const uint8_t *seg = seg_base(p, s);
    const struct pm_rec *r = (const void *)(seg + off);
    const char *why;
    uint32_t size;

    return (r->flags & PM_F_REWRITTEN) &&
           pm_rec_check(seg, off, p->segs[s].committed, &size, &why) < 0;
}

static int clean_one(struct pm_pool *p, const struct pm_cleaner *c, uint32_t v)
{
    struct seg_state *vs = &p->segs[v];
    uint64_t end = PM_SEG_HDR + vs->committed;
    int rc = 0, commit_rc;

    for (uint64_t off = vs->first; off < end;) {
        const struct pm_rec *r = (const void *)(seg_base(p, v) + off);
        pm_loc from = (uint64_t)v << 32 | off, to;
        bool hole = is_hole(p, v, off);

        off += pm_rec_span(r);
        if (hole || !c->is_live(c->arg, from, r))
            continue;
        rc = pm_append(p, (enum pm_rec_type)r->type, r->version,
                            pm_rec_key(r), r->key_len, pm_rec_val(r), r->val_len, &to);
        if (rc < 0)
            break;
        c->moved(c->arg, from, to, r);
    }
    /* Copies are committed before the original goes: a crash in between
     * leaves two copies of a version, which recovery treats as one. */
    commit_rc = pm_commit(p);
    if (rc < 0 || commit_rc < 0)
        return rc < 0 ? rc : commit_rc;
    /* Freed in two persisted stores: the commit point back to nothing
     * committed, then seq = 0. A crash in between leaves an empty segment
     * in use; a header that says free while its commit word still counts
     * records is then always corruption (a lost seq), never a free. */
    rc = persist_word(p, &seg_hdr(p, v)->commit,
                      pm_seg_commit_word(vs->first - PM_SEG_HDR, vs->seq, v));
    if (rc < 0)
        return rc;
    rc = persist_word(p, &seg_hdr(p, v)->seq, 0);
    if (rc < 0)
        return rc;
    /* Only now, with the victim gone for good, are its records dropped: a
     * clean that fails above leaves every record where it was counted. The
     * bytes are still there to read until the segment is handed out. */
    if (c->dropped)
        for (uint64_t off = vs->first; off < end;) {
            const struct pm_rec *r = (const void *)(seg_base(p, v) + off);

            if (!is_hole(p, v, off))
                c->dropped(c->arg, (uint64_t)v << 32 | off, r);
            off += pm_rec_span(r);
        }
    *vs = (struct seg_state){.queued = vs->queued};
    p->free_segs[p->n_free++] = v;
    return 0;
}

int pm_clean(struct pm_pool *p, const struct pm_cleaner *c,
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

void pm_get_info(const struct pm_pool *p, struct pm_info *info)
{
    *info = (struct pm_info){
        .version = PM_LAYOUT, .size = p->len, .seg_size = p->seg_size, .n_segs = p->n_segs,
        .max_version = p->version, .is_pmem = p->is_pmem,
    };
    memcpy(info->uuid, p->uuid, sizeof(info->uuid));
    for (uint32_t s = 0; s < p->n_segs; s++) {
        if (!p->segs[s].seq)
            continue;
        info->segs_used++;
        info->bytes_committed += p->segs[s].committed - (p->segs[s].first - PM_SEG_HDR);
        info->bytes_live += p->segs[s].live;
    }
}
