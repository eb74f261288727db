/* The pool file's layout, shared by the pool (pm.c) and its checker
 * (pm_check.c). Little-endian, fixed sizes; see pm.h for the design. */
#ifndef TERN_PM_LAYOUT_H
#define TERN_PM_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "pm.h"

#define PM_MAGIC "TERNPOOL"
#define PM_LAYOUT 6                  /* 6: PM_SEG_TAIL segments (one flush per commit on
                                      * a file); 5: segment headers checked (`opened`, `sum`, the
                                      * commit word's check); 4: leased segments start a
                                      * page in (`first`); 3: record sums split
                                      * body/version (2: XXH3 of the whole record, 1: CRC32) */
#define PM_LAYOUT_OLDEST 3           /* oldest layout opened; upgraded in place
                                      * (upgrade_hdr in pm.c) */
#define PM_LAYOUT_SEG_SUM 5          /* first layout whose segment headers are checked */
#define PM_HDR_SIZE 4096u            /* the file header's block */
#define PM_SEG_MAGIC 0x47455354u     /* "TSEG" */
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

/* The first cache line of a segment. Every word recovery trusts is
 * checked, and no crash between the stores that change it leaves a header
 * that fails its checks while it holds committed records:
 * - `magic`, `index`, `flags`, `first` and `opened` are written once, when
 *   the segment is opened, under `sum`, and persisted before `seq`;
 * - `seq` is the opening's commit, one persisted 8-byte store: 0 = free,
 *   else it must equal `opened`;
 * - `commit` is the commit point, moved by one persisted 8-byte store: the
 *   committed bytes after this header in its low 32 bits, and in its high
 *   32 a check of them, the segment's index and `opened`
 *   (pm_seg_commit_word). A torn or zeroed commit word fails its check;
 *   one left from an earlier life of the segment fails it too (another
 *   `opened`);
 * - freeing a segment first moves its commit point back to "nothing
 *   committed", persisted, and only then stores seq = 0. A header that
 *   says free while its checks hold and its commit word still counts
 *   records has lost its `seq`: corruption, not a free segment. Any other
 *   header with seq 0 is free (never opened, freed, or an opening that a
 *   crash cut short: nothing was ever committed under it).
 * Layouts 3 and 4 had `used` (plain) where `commit` is, and zeros in place
 * of `opened` and `sum`. */
struct pm_seg_hdr {
    uint64_t seq;                    /* 0 = free, else the order it was opened in */
    uint64_t commit;                 /* commit point and its check (layout < 5: `used`,
                                      * committed record bytes after this header) */
    uint32_t magic;                  /* PM_SEG_MAGIC once opened */
    uint32_t index;                  /* its own index, to catch misplaced data */
    uint32_t flags;                  /* PM_SEG_*; 0 in pools written before leases */
    uint32_t first;                  /* where records start; 0 = PM_SEG_HDR */
    uint64_t opened;                 /* seq as the segment was opened (layout 5) */
    uint32_t sum;                    /* pm_sum of magic..opened (layout 5) */
    uint8_t reserved[20];
};

/* Opened for a lessee (pm_lease): its records were written by a
 * client, so recovery cuts the segment at the first bad one instead of
 * refusing the pool. The mark outlives the lease: a lessee may have
 * scribbled over its committed records at any time before it ended.
 * A leased segment's records start a page in (`first`), so that a lessee,
 * whose mapping covers whole pages from there on, can never reach the
 * header; the bytes in between hold nothing. */
#define PM_SEG_LEASED 1u

/* Opened with every byte past the header zero (a pool written through a
 * file, layout 6): the records written in this life are all that can lie
 * past its commit point, so the commit word may lag one commit behind the
 * records, and recovery takes the records past it that pass their checks,
 * up to the first that does not (pm_seg_tail). On a file a commit is then
 * one flush (records and the lagging word together) instead of two (the
 * records, then the word over them). Never together with PM_SEG_LEASED. */
#define PM_SEG_TAIL 2u
#define PM_SEG_FLAGS_KNOWN (PM_SEG_LEASED | PM_SEG_TAIL)

_Static_assert(sizeof(struct pm_file_hdr) == 72, "pool header layout");
_Static_assert(sizeof(struct pm_seg_hdr) == PM_SEG_HDR, "segment header is one cache line");
_Static_assert(sizeof(struct pm_rec) == 24, "record header layout");

static inline uint64_t pm_seg_offset(uint32_t seg, uint32_t seg_size)
{
    return PM_HDR_SIZE + (uint64_t)seg * seg_size;
}

/* Where a segment's records start, or 0 if `first` is out of line (not
 * 8-aligned, before the header's end, past the commit point `used`). */
static inline uint32_t pm_seg_first(uint32_t first, uint64_t used)
{
    uint32_t f = first ? first : PM_SEG_HDR;

    return f >= PM_SEG_HDR && !(f & 7) && f <= PM_SEG_HDR + used ? f : 0;
}

/* A segment header as checked by pm_seg_hdr_check. */
struct pm_seg_view {
    bool in_use;                     /* false: free, the rest is 0 */
    bool leased;
    bool tail;                       /* PM_SEG_TAIL: records past `used` count */
    uint64_t seq;
    uint32_t used;                   /* committed record bytes after the header */
    uint32_t first;                  /* where records start */
};

/* Check segment `s`'s header by the rules of `layout`. 0 with the verdict
 * in *v, or TERN_ECORRUPT with the offset in the header of the word at
 * fault in *where and a reason in *why. For layouts before 5 (a file not
 * upgraded yet, or whose upgrade a crash cut short) a header is taken in
 * either form. */
int pm_seg_hdr_check(const struct pm_seg_hdr *sh, uint32_t s, uint32_t seg_size,
                     uint32_t layout, struct pm_seg_view *v, uint32_t *where, const char **why);

/* The commit word of a segment opened as `opened` at `index` with `used`
 * committed bytes. */
uint64_t pm_seg_commit_word(uint32_t used, uint64_t opened, uint32_t index);

/* The header sum: over magic, index, flags, first and opened. */
uint32_t pm_seg_hdr_sum(const struct pm_seg_hdr *sh);

/* Is the file header sound? 0, or TERN_ECORRUPT/TERN_EVERSION with a reason. */
int pm_hdr_check(const struct pm_file_hdr *h, uint64_t file_size, const char **why);

/* The bytes a record occupies: its slot, or (slot 0, as every record of a
 * pool before pm_overwrite had) its own size. */
static inline uint32_t pm_rec_span(const struct pm_rec *r)
{
    return r->slot ? r->slot : pm_rec_size(r->key_len, r->val_len);
}

/* Checks a record at `off` in a segment whose commit point is `used`:
 * bounds, type, slot and checksum. 0 (with its span in *size) or
 * TERN_ECORRUPT with a reason. */
int pm_rec_check(const uint8_t *seg, uint64_t off, uint64_t used, uint32_t *size,
                 const char **why);

/* Where the records of a PM_SEG_TAIL segment end: from its commit point
 * `used` on, every record that passes pm_rec_check (or is an interrupted
 * rewrite, pm_rec_torn_rewrite) up to the first that does not, or the
 * segment's end. Returns that end as bytes after the header (>= used). */
uint32_t pm_seg_tail(const uint8_t *seg, uint32_t seg_size, uint32_t used);

/* For a record that failed pm_rec_check: if it is an interrupted rewrite
 * (PM_F_REWRITTEN with a slot that lies within the commit point), the
 * bytes to skip to the next record; else 0 (real corruption). */
uint32_t pm_rec_torn_rewrite(const uint8_t *seg, uint64_t off, uint64_t used);

#endif
