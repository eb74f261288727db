/* Cooperative flushing (BOOM-KV's cooperative write-back).
 *
 * A commit that follows a large append spends most of its time flushing:
 * cache-line flushes of hundreds of KiB on PM, an msync of as many pages on
 * a file. The owner of the pool cuts such a range into pieces and posts
 * them on the pool's board; idle threads (pm_help) take pieces while
 * the owner works through the rest itself. The owner never waits for a
 * helper that is not there: it takes every piece nobody took, and waits
 * only for pieces a helper has already taken and is running.
 *
 * When it splits (measured on a 2-core VM, see the report of issue 6):
 * - Only once some thread has called pm_help() on the pool. Taking a
 *   piece is a locked instruction, which waits for the thread's earlier
 *   clflushopt/clwb to finish, so a split flush that nobody helps with is
 *   5-7% slower than one pmem_flush of the whole range.
 * - By default only on PM. On a file each msync is a journal commit and a
 *   device cache flush (ext4: up to ~8 ms whatever the size), so N pieces
 *   cost up to N of them: a 256 KiB commit went from 7.8 ms to 11.8 ms
 *   with a helper and 23.5 ms without. An explicit split_flush splits on
 *   files too (tmpfs, tests).
 * With a helper on an idle core, a 900 KiB commit on PM (DRAM here) took
 * 45 us instead of 80.
 *
 * The board, without locks:
 * - `word` = gen << 16 | posted << 8 | next. Pieces [0, posted) of
 *   generation `gen` are posted; [0, next) are taken. Anyone takes piece
 *   `next` by a CAS that moves next on by one. Only the owner changes
 *   `posted` and `gen`.
 * - `done` counts pieces of the generation that helpers ran to the end;
 *   the owner, which counts its own apart, waits for done + its own ==
 *   posted, then sets done back to 0.
 *
 * Posting. The owner writes piece[posted] and then raises `posted` with a
 * release RMW, so a thread that loads the word (acquire) and sees the piece
 * posted also sees its descriptor. The first piece of a generation is
 * posted by a plain release store of (gen + 1, 1, 0): nobody else writes
 * the word then, because every piece of the old generation was taken
 * (next == posted, and helpers CAS only while next < posted). `done` went
 * back to 0 when every piece of the old generation was done, so no late
 * increment can land on the new count, and that store comes before the
 * release that posts the new generation, so no early one lands before it.
 *
 * Taking. A helper loads the word, copies piece[next] and then CASes the
 * word from what it loaded to next + 1. The copy may be stale: the helper
 * may have slept between the load and the CAS while the generation ended
 * and the owner rewrote the descriptors for the next one. The CAS then
 * fails, because gen differs, and the copy is thrown away. If the CAS
 * succeeds the copy is good: the owner rewrites piece[i] only in a later
 * generation, that is, after it saw piece i taken (next > i) and done, and
 * "taken" is this very CAS, which (release) comes after the copy, so the
 * owner's rewrite comes after the copy too. Descriptors are read and
 * written with relaxed atomics: a stale copy races with the rewrite by
 * design. ABA: the CAS could succeed on a stale copy only if the word came
 * back to the same value, that is, after 2^48 generations (each a drain of
 * a large range) while the helper slept between two instructions.
 *
 * Finishing. A helper that flushed cache lines fences (pmem_drain) before
 * it counts the piece done: a fence orders only the flushes of the CPU
 * that issues it, so the owner's own fence would not cover them. Its
 * increment of `done` is a release, the owner's load of it an acquire, so
 * when the owner sees done + its own == posted every piece is durable and
 * it may store the commit point. On x86 the helper's flushes are also ordered
 * after the owner's writes of the records: the helper took the piece with
 * a locked CAS, which clflushopt/clwb do not pass, and the owner published
 * it after writing the records. A piece whose msync failed sets `failed`
 * (before its done, so the owner sees it): the owner reports TERN_EIO and
 * the pool takes no more commits.
 *
 * Late helpers. A helper preempted while it holds a piece would keep the
 * owner waiting for a time slice. On PM the owner stops waiting after
 * LATE_NS and flushes the helpers' pieces again itself (wait_helpers), and
 * the generation stays open until the helper is done: nothing new is
 * posted meanwhile, so the descriptors and `done` stay as they are, and
 * the late helper's flush of bytes that may have changed since is
 * harmless. So a drain may return while a helper still runs a piece, never
 * with a piece left to take.
 *
 * Helpers stop calling before the pool closes (pm_help says who sees
 * to it): a helper outside pm_board_help holds nothing of the pool.
 */
#include <errno.h>
#include <libpmem.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "log.h"
#include "pm_flush.h"

#define PIECES_MAX 64u               /* pieces on the board at once (< 256) */
#define PIECE_LEN (64u * 1024)       /* bytes of a piece, unless the board runs short */
#define SPLIT_DEFAULT (256u * 1024)   /* on PM; never on a file */
#define PAGE 4096u                   /* cut points: msync works on whole pages */
#define LATE_NS 50000                /* a helper this late was preempted: a 64 KiB
                                      * piece takes ~5 us on PM */

struct piece {
    uintptr_t at;
    size_t len;
};

struct pm_board {
    /* Helpers poll `word`; each shared word has a cache line of its own so
     * that polling does not slow the owner's other writes. */
    _Alignas(64) uint64_t word;
    bool is_pmem;                    /* set before anyone shares the board */
    bool helped;                     /* someone called pm_board_help: split */
    _Alignas(64) uint32_t done;
    uint32_t failed;                 /* an msync of a piece failed (sticky) */
    _Alignas(64) struct piece piece[PIECES_MAX];
    /* The owner's alone. */
    _Alignas(64) bool flushed;       /* the owner flushed lines since its last fence */
    bool late;                       /* a helper still runs a piece of the last
                                      * generation, which the owner ran too */
    uint32_t posted;                 /* pieces of the current generation, 0 = none */
    uint32_t mine;                   /* of which the owner ran */
    uint64_t mine_mask;              /* which (bit i: piece i) */
    uint32_t split;
    uint32_t piece_len;
};

static inline uint32_t w_posted(uint64_t w)
{
    return (uint32_t)(w >> 8) & 0xff;
}

static inline uint32_t w_next(uint64_t w)
{
    return (uint32_t)w & 0xff;
}

static inline void cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
#endif
}

struct pm_board *pm_board_new(bool is_pmem, uint32_t split)
{
    struct pm_board *b = aligned_alloc(_Alignof(struct pm_board), sizeof(*b));

    if (!b)
        return NULL;
    memset(b, 0, sizeof(*b));
    b->is_pmem = is_pmem;
    b->split = split ? split : is_pmem ? SPLIT_DEFAULT : UINT32_MAX;
    /* Half the threshold if that is less than PIECE_LEN: a range at the
     * threshold is always worth at least two pieces. */
    b->piece_len = b->split / 2 < PIECE_LEN ? b->split / 2 & ~(PAGE - 1) : PIECE_LEN;
    if (b->piece_len < PAGE)
        b->piece_len = PAGE;
    return b;
}

void pm_board_free(struct pm_board *b)
{
    free(b);
}

/* Make [at, at+len) durable, or on PM just flush it (a helper fences after
 * it; the owner once, in pm_flush_wait). */
static int run(struct pm_board *b, uintptr_t at, size_t len, bool helper)
{
    if (b->is_pmem) {
        pmem_flush((void *)at, len);
        if (helper)
            pmem_drain();
        else
            b->flushed = true;
        return 0;
    }
    if (pmem_msync((void *)at, len) == 0)
        return 0;
    /* Once writeback has failed, Linux may mark the pages clean and report
     * the error only once, so a retry can "succeed" without writing
     * anything: the pool must take no commit after this until it is
     * reopened and recovered from what really is in the file. */
    tern_log(TERN_LOG_ERROR, "pm", "msync: %s; the pool takes no more commits",
             strerror(errno));
    __atomic_store_n(&b->failed, 1, __ATOMIC_RELAXED);
    return TERN_EIO;
}

/* Take the next posted piece, if there is one: its index, with the piece
 * copied to *out; -1 if none. */
static int take(struct pm_board *b, struct piece *out)
{
    uint64_t w = __atomic_load_n(&b->word, __ATOMIC_ACQUIRE);

    while (w_next(w) < w_posted(w)) {
        const struct piece *pc = &b->piece[w_next(w)];

        out->at = __atomic_load_n(&pc->at, __ATOMIC_RELAXED);
        out->len = __atomic_load_n(&pc->len, __ATOMIC_RELAXED);
        if (__atomic_compare_exchange_n(&b->word, &w, w + 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return (int)w_next(w);
    }
    return -1;
}

int pm_board_help(struct pm_board *b)
{
    struct piece pc;

    /* Written once: a store on every call would take the line from the
     * owner on every poll. */
    if (!__atomic_load_n(&b->helped, __ATOMIC_RELAXED))
        __atomic_store_n(&b->helped, true, __ATOMIC_RELAXED);
    if (take(b, &pc) < 0)
        return 0;
    run(b, pc.at, pc.len, true);
    __atomic_fetch_add(&b->done, 1, __ATOMIC_RELEASE);
    return 1;
}

static void post(struct pm_board *b, uintptr_t at, size_t len)
{
    struct piece *pc = &b->piece[b->posted];

    __atomic_store_n(&pc->at, at, __ATOMIC_RELAXED);
    __atomic_store_n(&pc->len, len, __ATOMIC_RELAXED);
    if (b->posted++ == 0) {
        uint64_t gen = (__atomic_load_n(&b->word, __ATOMIC_RELAXED) >> 16) + 1;

        __atomic_store_n(&b->word, gen << 16 | 1u << 8, __ATOMIC_RELEASE);
    } else {
        __atomic_fetch_add(&b->word, 1u << 8, __ATOMIC_RELEASE);
    }
}

static bool all_done(const struct pm_board *b)
{
    return __atomic_load_n(&b->done, __ATOMIC_ACQUIRE) + b->mine == b->posted;
}

/* Every piece of the generation is done: the board may take the next. */
static void close_gen(struct pm_board *b)
{
    __atomic_store_n(&b->done, 0, __ATOMIC_RELAXED);
    b->posted = b->mine = 0;
    b->mine_mask = 0;
    b->late = false;
}

int pm_flush(struct pm_board *b, void *addr, size_t n)
{
    uintptr_t at = (uintptr_t)addr, end = at + n;
    uint32_t room;
    size_t len = b->piece_len;

    if (b->late && all_done(b))
        close_gen(b);
    room = PIECES_MAX - b->posted;
    if (n < b->split || room == 0 || b->late || !__atomic_load_n(&b->helped, __ATOMIC_RELAXED))
        return run(b, at, n, false);
    /* Longer pieces rather than more than the board holds. */
    if (n / room >= len)
        len = (n / room + PAGE) & ~(size_t)(PAGE - 1);
    while (at < end) {
        /* Cut at page boundaries, so that no page is msynced twice. */
        uintptr_t cut = (at + len) & ~(uintptr_t)(PAGE - 1);

        if (cut >= end || b->posted == PIECES_MAX - 1)
            cut = end;
        post(b, at, cut - at);
        at = cut;
    }
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* On PM, a helper that holds a piece for long was preempted, and could
 * keep the owner waiting for a whole time slice (milliseconds): the owner
 * flushes the pieces it did not run itself, helpers' included, as a flush
 * may be repeated at will, and leaves the generation open ("late") until
 * the helpers are done; until then it posts nothing and flushes alone, so
 * the late helper's descriptors stay as they are. Not on a file: an msync
 * repeated after a failed one may "succeed" without writing (see run()),
 * so the owner must hear from the helper's own. */
static bool wait_helpers(struct pm_board *b)
{
    uint64_t since = 0;

    for (unsigned spins = 0; !all_done(b); spins++) {
        if (spins < 1024) {
            cpu_pause();
        } else if (!b->is_pmem) {
            sched_yield();
        } else if (!since) {
            since = now_ns();
        } else if (now_ns() - since > LATE_NS) {
            for (uint32_t i = 0; i < b->posted; i++)
                if (!(b->mine_mask & 1ull << i))
                    pmem_flush((void *)b->piece[i].at, b->piece[i].len);
            b->flushed = true;
            return false;
        }
    }
    return true;
}

int pm_flush_wait(struct pm_board *b)
{
    struct piece pc;
    int i;

    if (b->late && all_done(b))
        close_gen(b);
    if (!b->late && b->posted) {
        while ((i = take(b, &pc)) >= 0) {
            run(b, pc.at, pc.len, false);
            b->mine++;
            b->mine_mask |= 1ull << i;
        }
        if (wait_helpers(b))
            close_gen(b);
        else
            b->late = true;
    }
    if (b->flushed) {
        pmem_drain();
        b->flushed = false;
    }
    return __atomic_load_n(&b->failed, __ATOMIC_RELAXED) ? TERN_EIO : 0;
}
