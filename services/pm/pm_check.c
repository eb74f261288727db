/* `tern pool info|check`: a read-only look at a pool file, without the lock
 * or libpmem, so it also works on a copy or while the owner is down. */
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "pm_layout.h"

static void report(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(FILE *out, const char *fmt, ...)
{
    va_list ap;

    if (!out)
        return;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
}

static int corrupt(FILE *out, uint64_t *bad_off, uint64_t off, const char *what)
{
    report(out, "corrupt   offset %llu: %s\n", (unsigned long long)off, what);
    if (bad_off)
        *bad_off = off;
    return TERN_ECORRUPT;
}

/* What recovery repairs by itself, found by a deep check. */
struct repairs {
    unsigned rewrites;               /* interrupted rewrites it steps over */
    unsigned cuts;                   /* leased segments it cuts short */
    unsigned tails;                  /* segments with records past their commit word */
};

/* Check one segment's header (recovery refuses the pool on what fails
 * here) and, if `deep`, walk its committed records. Recovery's rules,
 * read-only: an interrupted rewrite is stepped over, a bad record in a
 * leased segment ends that segment; both are reported, neither is
 * corruption. */
static int check_seg(const uint8_t *base, const struct pm_file_hdr *h, uint32_t s, bool deep,
                     FILE *out, struct pm_info *info, uint64_t *bad_off,
                     struct repairs *fix)
{
    uint64_t seg_off = pm_seg_offset(s, h->seg_size);
    const struct pm_seg_hdr *sh = (const void *)(base + seg_off);
    const uint8_t *seg = base + seg_off;
    struct pm_seg_view v;
    const char *why;
    char what[200];
    uint32_t at;

    if (pm_seg_hdr_check(sh, s, h->seg_size, h->layout, &v, &at, &why) < 0) {
        snprintf(what, sizeof(what), "segment %u + %u: %s", s, at, why);
        return corrupt(out, bad_off, seg_off + at, what);
    }
    if (!v.in_use)
        return 0;
    /* Records past a lagging commit word count, as recovery takes them. */
    if (v.tail) {
        uint32_t end = pm_seg_tail(seg, h->seg_size, v.used);

        if (end != v.used) {
            report(out, "tail      segment %u: %u bytes of records past its commit word "
                   "(the last commit before the stop); recovery takes them\n", s,
                   end - v.used);
            fix->tails++;
        }
        v.used = end;
    }
    info->segs_used++;
    info->bytes_committed += v.used - (v.first - PM_SEG_HDR);
    if (!deep)
        return 0;
    for (uint64_t off = v.first; off < PM_SEG_HDR + v.used;) {
        const struct pm_rec *r = (const void *)(seg + off);
        uint32_t size;

        if (pm_rec_check(seg, off, v.used, &size, &why) < 0) {
            size = pm_rec_torn_rewrite(seg, off, v.used);
            if (size) {
                report(out, "rewrite   offset %llu: segment %u + %llu: interrupted rewrite "
                       "(%s); recovery skips its %u bytes\n",
                       (unsigned long long)(seg_off + off), s, (unsigned long long)off, why,
                       size);
                fix->rewrites++;
                off += size;
                continue;
            }
            if (v.leased) {
                report(out, "lessee    offset %llu: segment %u + %llu: %s; the segment is "
                       "leased, recovery cuts it here (%llu bytes dropped)\n",
                       (unsigned long long)(seg_off + off), s, (unsigned long long)off, why,
                       (unsigned long long)(PM_SEG_HDR + v.used - off));
                fix->cuts++;
                return 0;
            }
            snprintf(what, sizeof(what), "segment %u + %llu: %s", s,
                     (unsigned long long)off, why);
            return corrupt(out, bad_off, seg_off + off, what);
        }
        info->records++;
        if (r->version > info->max_version)
            info->max_version = r->version;
        off += size;
    }
    return 0;
}

int pm_check(const char *path, bool deep, FILE *out, struct pm_info *info,
                  uint64_t *bad_off)
{
    struct pm_info local;
    const struct pm_file_hdr *h;
    struct repairs fix = {0};
    const char *why = NULL;
    struct stat st;
    uint8_t *base;
    char uuid[40];
    int fd, rc = 0;

    if (!info)
        info = &local;
    memset(info, 0, sizeof(*info));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        report(out, "error     %s: %s\n", path, strerror(errno));
        return errno == ENOENT ? TERN_ENOENT : errno == EACCES ? TERN_EACCES : TERN_EIO;
    }
    if (fstat(fd, &st) < 0 || st.st_size < (off_t)sizeof(struct pm_file_hdr)) {
        close(fd);
        return corrupt(out, bad_off, 0, "file too short to be a pool");
    }
    base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        report(out, "error     mmap %s: %s\n", path, strerror(errno));
        return TERN_EIO;
    }
    h = (const void *)base;
    report(out, "pool      %s\n", path);
    rc = pm_hdr_check(h, (uint64_t)st.st_size, &why);
    if (rc < 0) {
        if (rc == TERN_ECORRUPT)
            corrupt(out, bad_off, 0, why);
        else
            report(out, "error     %s: %s (layout %u)\n", path, why, h->layout);
        goto out;
    }
    for (int i = 0; i < 16; i++)
        snprintf(uuid + 2 * i, 3, "%02x", h->uuid[i]);
    memcpy(info->uuid, h->uuid, sizeof(info->uuid));
    info->version = h->layout;
    info->size = h->size;
    info->seg_size = h->seg_size;
    info->n_segs = h->n_segs;
    report(out, "uuid      %s\nlayout    %u\nsize      %llu bytes: %u segments of %u bytes\n",
           uuid, h->layout, (unsigned long long)h->size, h->n_segs, h->seg_size);
    for (uint32_t s = 0; s < h->n_segs && rc == 0; s++)
        rc = check_seg(base, h, s, deep, out, info, bad_off, &fix);
    report(out, "in use    %u segments, %llu record bytes committed\n", info->segs_used,
           (unsigned long long)info->bytes_committed);
    if (deep && rc == 0)
        report(out, "records   %llu, newest version %llu\n", (unsigned long long)info->records,
               (unsigned long long)info->max_version);
    if (rc == 0 && (fix.rewrites || fix.cuts))
        report(out, "status    ok: every committed record passed its checksum, except %u "
               "interrupted rewrites and %u leased segments cut short, which recovery "
               "repairs (see above)\n", fix.rewrites, fix.cuts);
    else if (rc == 0 && deep && fix.tails)
        report(out, "status    ok: every committed record passed its checksum (%u segments "
               "hold records past their commit word: a stop without a close)\n", fix.tails);
    else if (rc == 0)
        report(out, "status    %s\n", deep ? "ok: every committed record passed its checksum"
                                            : "header ok (run check for the records)");
out:
    munmap(base, (size_t)st.st_size);
    return rc;
}
