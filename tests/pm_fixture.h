/* The pm suite's shared fixtures: crash injection and a log of what was
 * made durable (this binary's pmem_msync, pmem_flush and pmem_drain wrap
 * libpmem's: the pool's own objects are linked into it, so their calls
 * bind here), the pool file of a test (`path`, made and removed by the
 * cases' checked fixture), records written, forged and read back, lessees,
 * pm_check's report, rewrite and cleaning set-ups several files share; and
 * the suite's cases, which several files fill (test_pm.c assembles the
 * suite).
 */
#ifndef TERN_TEST_PM_FIXTURE_H
#define TERN_TEST_PM_FIXTURE_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"
#include "helpers.h"
#include "pm/pm.h"
#include "pm/pm_layout.h"

#define SEG (64u * 1024)
#define POOL (8ull * SEG + 4096)
#define FILL_LEN (SEG - 64 - 24 - 8)     /* key "fill": a record that fills a segment */

/* The pool file of the test. */
extern char path[128];

/* ---- crash injection and the log of what was made durable ---- */

/* What was made durable while logging is on, in the order it became
 * durable: msyncs (on a file), and cache-line flushes and fences (with
 * PMEM_IS_PMEM_FORCE=1), each with the thread that made it. Helper threads
 * log too, hence the atomic slot count (it may pass the end). */
#define SYNC_LOG_MAX 256
enum { LOG_MSYNC, LOG_FLUSH, LOG_FENCE };
struct sync_log {
    bool on;
    unsigned n;
    const uint8_t *at[SYNC_LOG_MAX];
    size_t len[SYNC_LOG_MAX];
    uint8_t kind[SYNC_LOG_MAX];
    uint8_t who[SYNC_LOG_MAX];           /* 0 = the owner, else a helper */
};
extern struct sync_log sync_log;

void sync_log_start(void);
void sync_log_stop(void);
unsigned sync_log_len(void);             /* entries logged (at most SYNC_LOG_MAX) */

/* Which thread this is: 0 for the owner (every thread but the helpers of
 * the flush tests), 1.. for helpers. A helper's pieces can be slowed down,
 * so that the owner really has to wait for them, or made to fail; the
 * owner's can be slowed down, so that helpers, even on a busy machine, get
 * some. */
extern __thread unsigned helper_no;
extern unsigned helper_sync_delay_us, owner_piece_delay_us;
extern unsigned helper_pieces_started;
extern int helper_sync_fail;             /* this many helper msyncs fail with EIO */

/* Run `fn` in a child that dies (exit 0) at its `syncs`-th msync from the
 * call on; returns the child's exit status (fn's own return if it never
 * got that far). */
int crash_child(int (*fn)(void *), void *arg, int syncs);

/* Is the test's pool on PM (where flushes bypass pmem_msync)? */
bool pool_is_pmem(void);

/* ---- records ---- */

/* A committed record as recovery handed it over. */
struct rec_copy {
    pm_loc loc;
    uint64_t version;
    uint8_t type, flags;
    uint32_t slot;
    char key[64];
    char val[256];
    uint32_t val_len;
};

struct seen {
    struct rec_copy r[64];
    unsigned n;
};

const struct rec_copy *seen_ver(const struct seen *s, uint64_t version);
const struct rec_copy *seen_loc(const struct seen *s, pm_loc loc);

/* Open the pool at `path` (creating it with `size` bytes if size is not
 * 0) and recover it into `s` (may be NULL); returns recovery's code. */
int open_rc(uint64_t size, struct seen *s, struct pm_pool **out);

/* The same; recovery must succeed. */
struct pm_pool *open_pool(uint64_t size, struct seen *s);

/* Append key = a value of `len` bytes of `fill`; returns its place. */
pm_loc put(struct pm_pool *p, const char *k, char fill, uint32_t len, uint64_t *version);

/* pm_commit must succeed. */
void commit(struct pm_pool *p);

/* The file offset of a record's place, and raw reads and writes of the
 * (closed) pool's file. */
off_t file_off(pm_loc loc);
void file_read(off_t at, void *buf, size_t n);
void file_write(off_t at, const void *buf, size_t n);

/* The whole file, malloc'ed; its length to *len. */
uint8_t *file_snapshot(size_t *len);

/* Bytes a lessee's records start into a leased segment: a page. */
uint32_t lease_first(void);

/* A segment's commit point, from its commit word (the low half). */
uint64_t seg_used(uint32_t seg);

/* pm_check's verdict and report. */
struct check_out {
    int rc;
    uint64_t bad;
    struct pm_info info;
    char text[4096];
};

void check_pool(struct check_out *c);

/* Does the check report a line starting with `tag` for file offset `at`? */
bool reported(const struct check_out *c, const char *tag, off_t at);

/* ---- lessees ---- */

uint8_t *seg_ptr(struct pm_pool *p, uint32_t seg, uint32_t off);

/* Write a record into a leased segment as its lessee would: a whole
 * record with a version of its own (junk), flags and slot 0, summed; the
 * pool swaps its version in. Returns its size. */
uint32_t lessee_write(struct pm_pool *p, uint32_t seg, uint32_t off, uint8_t type,
                      const char *key, uint16_t klen, const char *val, uint32_t vlen);

/* Write key = val (NULL: a tombstone) at the lease's next offset and
 * append it; returns its place. */
pm_loc lessee_put(struct pm_pool *p, uint32_t seg, const char *key, const char *val,
                  uint64_t *version);

/* ---- rewrites in place ---- */

/* The pool the crash tests start from: k = v1 (100 bytes) at a, another
 * key, and (if `newer`) k = v2 at b, all committed. */
struct rewrite_case {
    pm_loc a, b;
    uint64_t v1, v2, v3;
    uint32_t slot;
};

void rewrite_setup(struct rewrite_case *rc, bool newer);

/* ---- cleaning ---- */

/* What a pm_cleaner was asked and told (cl_* are its callbacks). */
struct clean_log {
    pm_loc live[16];            /* records the owner still needs */
    unsigned n_live;
    pm_loc asked[64], dropped[64];
    unsigned n_asked, n_dropped, n_moved;
};

bool cl_is_live(void *arg, pm_loc loc, const struct pm_rec *r);
void cl_moved(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r);
void cl_dropped(void *arg, pm_loc loc, const struct pm_rec *r);

/* Is `loc` one of locs[0..n-1]? */
bool logged(const pm_loc *locs, unsigned n, pm_loc loc);

/* ---- the suite's cases, filled by the files of the suite ---- */

struct pm_cases {
    TCase *pool;        /* "pool": slots, rewrites, cleaning, commits, leases, headers */
    TCase *flush;       /* "flush": cooperative flushing */
};

void pm_add_records(const struct pm_cases *c);     /* test_pm.c */
void pm_add_clean(const struct pm_cases *c);       /* test_pm_clean.c */
void pm_add_lease(const struct pm_cases *c);       /* test_pm_lease.c */
void pm_add_flush(const struct pm_cases *c);       /* test_pm_flush.c */
void pm_add_headers(const struct pm_cases *c);     /* test_pm_headers.c */
void pm_add_tail(const struct pm_cases *c);        /* test_pm_tail.c */

#endif
