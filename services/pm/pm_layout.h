/* The pool file's layout, shared by the pool (pm.c) and its checker
 * (pm_check.c). Little-endian, fixed sizes; see pm.h for the design. */
#ifndef TERN_PM_LAYOUT_H
#define TERN_PM_LAYOUT_H

#include <stdint.h>

#include "pm.h"

#define PM_MAGIC "TERNPOOL"
#define PM_LAYOUT 4                  /* 4: leased segments start a page in (`first`);
                                      * 3: record sums split body/version (2: XXH3 of
                                      * the whole record, 1: CRC32) */
#define PM_LAYOUT_OLDEST 3           /* oldest layout opened; upgraded in place, as a
                                      * layout-3 file is a layout-4 file without leases
                                      * that start late */
#define PM_HDR_SIZE 4096u            /* the file header's block */
#define PM_SEG_MAGIC 0x47455354u     /* "TSEG" */
#define PM_SEG_HDR 64u               /* records start this far into a segment */
#define PM_SEG_MIN (64u * 1024)
#define PM_STR_(x) #x
#define PM_STR(x) PM_STR_(x)          /* PM_LAYOUT as text, for messages */

struct pm_file_hdr {
    char magic[8];                   /* PM_MAGIC */
    uint32_t layout;                 /* PM_LAYOUT */
    uint32_t hdr_size;               /* PM_HDR_SIZE */
    uint8_t uuid[16];
    uint64_t size;                   /* file bytes */
    uint32_t seg_size;
    uint32_t n_segs;
    uint64_t created;                /* CLOCK_REALTIME seconds */
    uint32_t reserved[3];
    uint32_t sum;                    /* pm_sum() of the bytes before it */
};

/* The first cache line of a segment. `seq` and `used` are each changed by
 * one persisted 8-byte store: seq 0 means free, `used` is the commit point.
 * The other fields are written before seq makes the segment count. */
struct pm_seg_hdr {
    uint64_t seq;                    /* 0 = free, else the order it was opened in */
    uint64_t used;                   /* committed record bytes after this header */
    uint32_t magic;                  /* PM_SEG_MAGIC once opened */
    uint32_t index;                  /* its own index, to catch misplaced data */
    uint32_t flags;                  /* PM_SEG_*; 0 in pools written before leases */
    uint32_t first;                  /* where records start; 0 = PM_SEG_HDR */
    uint8_t reserved[32];
};

/* Opened for a lessee (tern_pm_lease): its records were written by a
 * client, so recovery cuts the segment at the first bad one instead of
 * refusing the pool. The mark outlives the lease: a lessee may have
 * scribbled over its committed records at any time before it ended.
 * A leased segment's records start a page in (`first`), so that a lessee,
 * whose mapping covers whole pages from there on, can never reach the
 * header; the bytes in between hold nothing. */
#define PM_SEG_LEASED 1u
#define PM_SEG_FLAGS_KNOWN PM_SEG_LEASED

_Static_assert(sizeof(struct pm_file_hdr) == 72, "pool header layout");
_Static_assert(sizeof(struct pm_seg_hdr) == PM_SEG_HDR, "segment header is one cache line");
_Static_assert(sizeof(struct tern_pm_rec) == 24, "record header layout");
_Static_assert(PM_SEG_HDR == TERN_PM_SEG_HDR, "pm.h tells lessees where records start");

static inline uint64_t pm_seg_offset(uint32_t seg, uint32_t seg_size)
{
    return PM_HDR_SIZE + (uint64_t)seg * seg_size;
}

/* Where a segment's records start, or 0 if the header's `first` is out of
 * line (not 8-aligned, before the header's end, past the commit point). */
static inline uint32_t pm_seg_first(const struct pm_seg_hdr *sh)
{
    uint32_t f = sh->first ? sh->first : PM_SEG_HDR;

    return f >= PM_SEG_HDR && !(f & 7) && f <= PM_SEG_HDR + sh->used ? f : 0;
}

/* Is the file header sound? 0, or TERN_ECORRUPT/TERN_EVERSION with a reason. */
int pm_hdr_check(const struct pm_file_hdr *h, uint64_t file_size, const char **why);

/* The bytes a record occupies: its slot, or (slot 0, as every record of a
 * pool before tern_pm_overwrite had) its own size. */
static inline uint32_t pm_rec_span(const struct tern_pm_rec *r)
{
    return r->slot ? r->slot : tern_pm_rec_size(r->key_len, r->val_len);
}

/* Checks a record at `off` in a segment whose commit point is `used`:
 * bounds, type, slot and checksum. 0 (with its span in *size) or
 * TERN_ECORRUPT with a reason. */
int pm_rec_check(const uint8_t *seg, uint64_t off, uint64_t used, uint32_t *size,
                 const char **why);

/* For a record that failed pm_rec_check: if it is an interrupted rewrite
 * (TERN_PM_F_REWRITTEN with a slot that lies within the commit point), the
 * bytes to skip to the next record; else 0 (real corruption). */
uint32_t pm_rec_torn_rewrite(const uint8_t *seg, uint64_t off, uint64_t used);

#endif
