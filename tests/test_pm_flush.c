/* pm: what a commit makes durable, and cooperative flushing (case flush):
 * large commits whose flush is cut into pieces that helper threads take
 * (pm_help), alone, contended, at the split threshold, with a late or a
 * failing helper, and killed after helped commits.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pm_fixture.h"

/* ---- what a commit makes durable ---- */

/* The first logged msync that covers [at, at+n), or -1. */
static int synced_at(const void *at, size_t n)
{
    const uint8_t *a = at;

    for (unsigned i = 0; i < sync_log_len(); i++)
        if (sync_log.at[i] <= a && a + n <= sync_log.at[i] + sync_log.len[i])
            return (int)i;
    return -1;
}

static const void *used_word(struct pm_pool *p, uint32_t seg)
{
    return seg_ptr(p, seg, offsetof(struct pm_seg_hdr, commit));
}

/* A commit makes a rewrite durable although no commit point moves; with
 * records in the head and in a lease, all of them are durable before
 * either commit point is stored. */
START_TEST(commit_syncs_what_was_written)
{
    struct pm_pool *p;
    pm_loc a, r1, o1;
    uint32_t seg;
    int rec1, rec2, used1, used2;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    p = open_pool(0, NULL);
    a = put(p, "k", '1', 100, NULL);
    put(p, "k", '2', 5, NULL);
    commit(p);
    pm_dead(p, a);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, pm_next_version(p), "k", 1,
                                       "three", 5), 0);
    sync_log.on = true;
    commit(p);
    ck_assert_msg(synced_at(pm_rec_at(p, a), pm_rec_size(1, 5)) >= 0,
                  "the rewrite was not made durable by the commit");

    ck_assert_int_eq(pm_lease(p, &seg), 0);
    r1 = lessee_put(p, seg, "c1", "one", NULL);
    o1 = put(p, "own", 'o', 10, NULL);
    sync_log.n = 0;
    commit(p);
    sync_log.on = false;
    rec1 = synced_at(pm_rec_at(p, r1), pm_rec_size(2, 3));
    rec2 = synced_at(pm_rec_at(p, o1), pm_rec_size(3, 10));
    used1 = synced_at(used_word(p, seg), 8);
    used2 = synced_at(used_word(p, (uint32_t)(o1 >> 32)), 8);
    ck_assert_int_ge(rec1, 0);
    ck_assert_int_ge(rec2, 0);
    ck_assert_int_gt(used1, rec1);
    ck_assert_int_gt(used1, rec2);
    ck_assert_int_gt(used2, rec1);
    ck_assert_int_gt(used2, rec2);
    pm_close(p);
}
END_TEST

/* ---- cooperative flushing ---- */

#define BSEG (1u << 20)
#define BPOOL (24ull * BSEG + 4096)
#define SPLIT (64u * 1024)               /* split_flush of these tests: 32 KiB pieces */
#define BIG_RECS 12

/* The flush tests run twice: _i = 0 on a file (msync), _i = 1 with
 * PMEM_IS_PMEM_FORCE=1 (cache-line flushes and fences). The variable is
 * read once, at the first open of the process; every test is a fresh
 * process in fork mode. */
enum { MODE_MSYNC = 0, MODE_PMEM = 1 };

static struct pm_pool *open_big(uint32_t seg, uint32_t split, int mode)
{
    /* Exact commit words: these tests follow the records-then-words order
     * of each commit (the one-flush commit of PM_SEG_TAIL segments has
     * tests of its own in test_pm_tail.c). */
    struct pm_opts o = {.size = 24ull * seg + 4096, .seg_size = seg, .create = true,
                             .split_flush = split, .strict_commit = true};
    struct pm_info info;
    struct pm_pool *p;
    int rc;

    if (mode == MODE_PMEM)
        setenv("PMEM_IS_PMEM_FORCE", "1", 1);
    rc = pm_open(path, &o, &p);
    ck_assert_msg(rc == 0, "open: %s", tern_strerror(rc));
    ck_assert_int_eq(pm_recover(p, NULL, NULL), 0);
    pm_get_info(p, &info);
    if (mode == MODE_PMEM)
        ck_assert_msg(info.is_pmem, "PMEM_IS_PMEM_FORCE=1 had no effect (not in fork mode?)");
    return p;
}

static bool msyncs(struct pm_pool *p)
{
    struct pm_info info;

    pm_get_info(p, &info);
    return !info.is_pmem;
}

/* Threads that call pm_help() in a loop, counting the pieces they ran. */
struct helpers {
    struct pm_pool *p;
    pthread_t th[2];
    unsigned n;
    unsigned ids;
    unsigned running;                    /* helpers that called pm_help() */
    bool stop;
    unsigned long ran;
};

static void *help_loop(void *arg)
{
    struct helpers *h = arg;
    unsigned idle = 0;
    bool counted = false;

    helper_no = __atomic_add_fetch(&h->ids, 1, __ATOMIC_RELAXED);
    while (!__atomic_load_n(&h->stop, __ATOMIC_RELAXED)) {
        if (pm_help(h->p) == 1) {
            __atomic_fetch_add(&h->ran, 1, __ATOMIC_RELAXED);
            idle = 0;
        } else if (++idle % 256 == 0) {
            sched_yield();               /* on two cores, leave the owner room */
        }
        /* After its first call: from then on the pool splits. */
        if (!counted) {
            counted = true;
            __atomic_fetch_add(&h->running, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void helpers_start(struct helpers *h, struct pm_pool *p, unsigned n)
{
    *h = (struct helpers){.p = p};
    for (; h->n < n; h->n++)
        ck_assert_int_eq(pthread_create(&h->th[h->n], NULL, help_loop, h), 0);
    /* The pool splits flushes only once a helper has called, and a few
     * commits take a millisecond: they could all be over before a helper
     * was first scheduled. */
    while (__atomic_load_n(&h->running, __ATOMIC_RELAXED) < n)
        sched_yield();
}

static unsigned long helpers_stop(struct helpers *h)
{
    __atomic_store_n(&h->stop, true, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < h->n; i++)
        pthread_join(h->th[i], NULL);
    return h->ran;
}

/* A thread that calls pm_help() once and is gone: from now on the
 * pool splits large flushes, and nobody helps with them. */
static void *help_once_main(void *arg)
{
    helper_no = 9;
    return (void *)(intptr_t)pm_help(arg);
}

static void help_once(struct pm_pool *p)
{
    pthread_t th;
    void *ran;

    ck_assert_int_eq(pthread_create(&th, NULL, help_once_main, p), 0);
    ck_assert_int_eq(pthread_join(th, &ran), 0);
    ck_assert_ptr_null(ran);                 /* nothing was posted */
}

/* Record i of a test: key "bigNN", a length from 200 KiB to about 900 KiB
 * (not a multiple of a page), and bytes that differ from page to page. */
static uint32_t big_len(unsigned i)
{
    return 200u * 1024 + i * 63u * 1024 + i * 24 + 8;
}

static void big_val(char *buf, unsigned i, uint32_t len)
{
    for (uint32_t j = 0; j < len; j++)
        buf[j] = (char)('a' + (i * 7 + j / 4096 + (j & 3)) % 26);
}

static pm_loc big_put(struct pm_pool *p, unsigned i, uint32_t len)
{
    static char val[4u << 20];
    char key[16];
    pm_loc loc;
    int rc;

    ck_assert_uint_le(len, sizeof(val));
    big_val(val, i, len);
    snprintf(key, sizeof(key), "big%02u", i);
    rc = pm_append(p, PM_VALUE, pm_next_version(p), key, (uint16_t)strlen(key),
                        val, len, &loc);
    ck_assert_msg(rc == 0, "append %s: %s", key, tern_strerror(rc));
    return loc;
}

/* Records recovery found, checked byte by byte against big_val. */
struct big_seen {
    unsigned n;
    uint32_t len[64];                    /* by record number; 0 = not seen */
    unsigned bad;                        /* records whose bytes are wrong */
};

static int big_visit(void *arg, pm_loc loc, const struct pm_rec *r)
{
    static char want[4u << 20];
    struct big_seen *s = arg;
    char key[16] = {0};
    unsigned i;

    (void)loc;
    memcpy(key, pm_rec_key(r), r->key_len < 15 ? r->key_len : 15);
    if (sscanf(key, "big%u", &i) != 1 || i >= 64 || r->val_len > sizeof(want))
        return 0;
    big_val(want, i, r->val_len);
    if (memcmp(pm_rec_val(r), want, r->val_len) != 0)
        s->bad++;
    s->len[i] = r->val_len;
    s->n++;
    return 0;
}

static void big_reopen(struct big_seen *s)
{
    struct pm_pool *p;
    int rc = pm_open(path, NULL, &p);

    ck_assert_msg(rc == 0, "reopen: %s", tern_strerror(rc));
    *s = (struct big_seen){0};
    rc = pm_recover(p, big_visit, s);
    ck_assert_msg(rc == 0, "recover: %s", tern_strerror(rc));
    pm_close(p);
    ck_assert_uint_eq(s->bad, 0);
}

/* Did log entry i (a flush) have a fence of the same thread after it,
 * before entry `limit`? A fence orders only its own thread's flushes. */
static bool fenced_before(unsigned i, unsigned limit)
{
    for (unsigned j = i + 1; j < limit && j < sync_log_len(); j++)
        if (sync_log.kind[j] == LOG_FENCE && sync_log.who[j] == sync_log.who[i])
            return true;
    return false;
}

/* Were all bytes of [at, at+n) durable by log entry `limit`: msynced, or
 * flushed and then fenced by the same thread? */
static bool synced_before(const void *at, size_t n, unsigned limit)
{
    const uint8_t *pos = at, *end = pos + n;

    while (pos < end) {
        const uint8_t *next = NULL;

        for (unsigned i = 0; i < limit && i < sync_log_len() && !next; i++)
            if (sync_log.kind[i] != LOG_FENCE && sync_log.at[i] <= pos &&
                pos < sync_log.at[i] + sync_log.len[i] &&
                (sync_log.kind[i] == LOG_MSYNC || fenced_before(i, limit)))
                next = sync_log.at[i] + sync_log.len[i];
        if (!next)
            return false;
        pos = next;
    }
    return true;
}

/* Log entries (msyncs or flushes) that lie within [at, at+n), and the
 * longest. */
static unsigned pieces_in(const void *at, size_t n, size_t *longest)
{
    const uint8_t *a = at;
    unsigned k = 0;

    *longest = 0;
    for (unsigned i = 0; i < sync_log_len(); i++)
        if (sync_log.at[i] >= a && sync_log.at[i] + sync_log.len[i] <= a + n) {
            k++;
            if (sync_log.len[i] > *longest)
                *longest = sync_log.len[i];
        }
    return k;
}

/* Append and commit record `i`, and check that every byte of it was made
 * durable before its segment's commit point (on a file msynced; on PM
 * flushed, and fenced by the thread that flushed), in pieces of at most
 * `piece` bytes, more than one if `split` (on PM, a commit that follows one
 * whose helper was late is not split: see late_helper_not_waited_for). */
static void big_commit_len(struct pm_pool *p, unsigned i, uint32_t len, size_t piece,
                           bool split)
{
    uint32_t size = pm_rec_size(5, len);
    pm_loc loc = big_put(p, i, len);
    const void *rec = pm_rec_at(p, loc);
    size_t longest;
    int used;

    sync_log_start();
    commit(p);
    sync_log_stop();
    used = synced_at(used_word(p, (uint32_t)(loc >> 32)), 8);
    ck_assert_int_ge(used, 0);
    ck_assert_msg(synced_before(rec, size, (unsigned)used),
                  "record %u (%u bytes) not all durable before its commit point", i, size);
    if (split)
        ck_assert_uint_gt(pieces_in(rec, size, &longest), 1);
    else
        pieces_in(rec, size, &longest);
    ck_assert_uint_le(longest, split ? piece : size);
}

static void big_commit(struct pm_pool *p, unsigned i, bool split)
{
    big_commit_len(p, i, big_len(i), SPLIT / 2, split);
}

/* (a) With helpers, large records commit in pieces, partly flushed by the
 * helpers; each is durable before its commit point and whole after a
 * reopen. The helpers' pieces are slowed down, so that the owner really
 * has to wait for them, and so are the owner's, so that the helpers get
 * some even when the machine is busy. */
START_TEST(split_flush_with_helpers)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, _i);
    struct helpers h;
    struct big_seen s;
    unsigned long ran;

    helper_sync_delay_us = 300;
    owner_piece_delay_us = 300;
    helpers_start(&h, p, 2);
    for (unsigned i = 0; i < BIG_RECS; i++)
        big_commit(p, i, _i == MODE_MSYNC);
    ran = helpers_stop(&h);
    ck_assert_msg(ran > 0, "the helpers ran no piece in %u commits", BIG_RECS);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, BIG_RECS);
    for (unsigned i = 0; i < BIG_RECS; i++)
        ck_assert_uint_eq(s.len[i], big_len(i));
}
END_TEST

/* Many commits of many small pieces (4 KiB), nothing slowed down: the
 * owner and two helpers race for every piece, and each must be run exactly
 * once (a piece run twice would count as done twice and a piece lost
 * would leave bytes unflushed). */
START_TEST(split_flush_contended)
{
    struct pm_pool *p = open_big(BSEG, 8192, _i);
    struct helpers h;
    struct big_seen s;
    unsigned n = 0;

    helpers_start(&h, p, 2);
    for (; pm_free_segs(p) > 3; n++)
        big_commit_len(p, n % 64, 100u * 1024 + (n % 7) * 1000, 4096, _i == MODE_MSYNC);
    helpers_stop(&h);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, n);
}
END_TEST

/* (b) With no helper left, the owner runs every piece itself. */
START_TEST(split_flush_alone)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, _i);
    struct big_seen s;

    help_once(p);
    for (unsigned i = 0; i < BIG_RECS; i++)
        big_commit(p, i, true);
    ck_assert_int_eq(pm_help(p), 0);    /* nothing is left posted */
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, BIG_RECS);
}
END_TEST

/* Append a record of `len` bytes and commit it; the number of pieces it
 * was made durable in, and the longest. */
static unsigned pieces_of(struct pm_pool *p, unsigned i, uint32_t len, size_t *longest)
{
    pm_loc loc = big_put(p, i, len);
    unsigned k;

    sync_log_start();
    commit(p);
    sync_log_stop();
    k = pieces_in(pm_rec_at(p, loc), pm_rec_size(5, len), longest);
    ck_assert_uint_ge(k, 1);
    return k;
}

/* When a flush is split: not before some thread called pm_help(),
 * never with UINT32_MAX, by default at 256 KiB on PM but never on a file,
 * into pieces of 64 KiB at most that end on page boundaries; a range longer
 * than the board holds (64 pieces) is cut into longer pieces. */
START_TEST(split_flush_threshold)
{
    struct pm_pool *p;
    const uint8_t *rec;
    pm_loc loc;
    size_t longest;
    uint32_t size;

    p = open_big(BSEG, SPLIT, _i);
    ck_assert_uint_eq(pieces_of(p, 0, 900u * 1024, &longest), 1);
    help_once(p);
    ck_assert_uint_gt(pieces_of(p, 1, 900u * 1024, &longest), 1);
    pm_close(p);
    unlink(path);

    p = open_big(BSEG, UINT32_MAX, _i);
    help_once(p);
    ck_assert_uint_eq(pieces_of(p, 0, 900u * 1024, &longest), 1);
    pm_close(p);
    unlink(path);

    p = open_big(BSEG, 0, _i);
    help_once(p);
    ck_assert_uint_eq(pieces_of(p, 1, 250u * 1024, &longest), 1);
    loc = big_put(p, 2, 300u * 1024);
    sync_log_start();
    commit(p);
    sync_log_stop();
    rec = (const uint8_t *)pm_rec_at(p, loc);
    size = pm_rec_size(5, 300u * 1024);
    if (!msyncs(p)) {
        ck_assert_uint_ge(pieces_in(rec, size, &longest), 5);
        ck_assert_uint_le(longest, 64u * 1024);
        for (unsigned i = 0; i < sync_log_len(); i++)
            if (sync_log.at[i] > rec && sync_log.at[i] < rec + size)
                ck_assert_uint_eq((uintptr_t)sync_log.at[i] % 4096, 0);
    } else {
        ck_assert_uint_eq(pieces_in(rec, size, &longest), 1);
    }
    pm_close(p);
    unlink(path);

    p = open_big(4u << 20, SPLIT, _i);
    help_once(p);
    size = (4u << 20) - 4096;
    loc = big_put(p, 3, size);
    sync_log_start();
    commit(p);
    sync_log_stop();
    rec = (const uint8_t *)pm_rec_at(p, loc);
    size = pm_rec_size(5, size);
    ck_assert(synced_before(rec, size, (unsigned)synced_at(used_word(p, (uint32_t)(loc >> 32)), 8)));
    ck_assert_uint_le(pieces_in(rec, size, &longest), 64);
    ck_assert_uint_gt(longest, SPLIT / 2);
    pm_close(p);
}
END_TEST

/* On PM, a helper that holds a piece for long (preempted; here it sleeps
 * 200 ms) is not waited for: the owner flushes that piece again itself and
 * commits, and posts nothing until the helper is done, so the next commit
 * is flushed in one piece; once the helper is back, commits split again. */
START_TEST(late_helper_not_waited_for)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, MODE_PMEM);
    struct helpers h;
    struct big_seen s;
    size_t longest;

    helper_sync_delay_us = 200000;
    owner_piece_delay_us = 300;
    helpers_start(&h, p, 1);
    big_commit(p, 0, true);
    ck_assert_uint_ge(__atomic_load_n(&helper_pieces_started, __ATOMIC_RELAXED), 1);
    ck_assert_msg(__atomic_load_n(&h.ran, __ATOMIC_RELAXED) == 0,
                  "the commit waited for a helper that slept");
    ck_assert_uint_eq(pieces_of(p, 1, big_len(1), &longest), 1);
    while (__atomic_load_n(&h.ran, __ATOMIC_RELAXED) == 0)
        usleep(1000);
    __atomic_store_n(&helper_sync_delay_us, 0, __ATOMIC_RELAXED);
    big_commit(p, 2, true);
    helpers_stop(&h);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, 3);
}
END_TEST

/* (d) A piece's msync that fails in a helper stops the pool's commits, as
 * the owner's own would: the commit that posted it fails, and so does every
 * later one; the record it carried never reaches recovery. */
START_TEST(helper_msync_failure_stops_commits)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, MODE_MSYNC);
    struct helpers h;
    struct big_seen s;
    unsigned i;
    int rc = 0;

    if (!msyncs(p)) {
        pm_close(p);
        return;
    }
    big_put(p, 0, big_len(0));
    commit(p);
    owner_piece_delay_us = 300;
    helper_sync_fail = 1;
    helpers_start(&h, p, 1);
    /* Until a helper happens to take a piece (nearly always the first). */
    for (i = 1; i < 20 && __atomic_load_n(&helper_sync_fail, __ATOMIC_RELAXED) > 0; i++) {
        big_put(p, i, big_len(1));
        rc = pm_commit(p);
        if (__atomic_load_n(&helper_sync_fail, __ATOMIC_RELAXED) > 0)
            ck_assert_int_eq(rc, 0);
    }
    ck_assert_msg(helper_sync_fail <= 0, "no helper took a piece in %u commits", i - 1);
    ck_assert_int_eq(rc, TERN_EIO);
    rc = pm_append(p, PM_VALUE, pm_next_version(p), "after", 5, "x", 1,
                        &(pm_loc){0});
    ck_assert(rc == 0 || rc == TERN_EIO);
    ck_assert_int_eq(pm_commit(p), TERN_EIO);
    helpers_stop(&h);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, i - 1);           /* every record but the failed commit's */
    ck_assert_uint_eq(s.len[i - 1], 0);
}
END_TEST

/* (e) A process killed (SIGKILL) right after commits that helpers shared
 * in: every committed record is there, whole, on reopen; the one appended
 * after the last commit is not. On a file the page cache outlives the
 * process, so this checks the commit points and records the pool wrote,
 * not the flushes themselves (split_flush_with_helpers checks those). */
static void killed_after_helped_commits(int mode)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, mode);
    struct helpers h;

    helpers_start(&h, p, 2);
    for (unsigned i = 0; i < 6; i++) {
        big_put(p, i, big_len(i));
        if (pm_commit(p) < 0)
            _exit(3);
    }
    big_put(p, 6, big_len(6));
    kill(getpid(), SIGKILL);
    _exit(4);
}

START_TEST(helpers_then_kill)
{
    struct big_seen s;
    pid_t pid = fork();
    int st;

    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        killed_after_helped_commits(_i);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child status %#x", st);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, 6);
    for (unsigned i = 0; i < 6; i++)
        ck_assert_uint_eq(s.len[i], big_len(i));
    ck_assert_uint_eq(s.len[6], 0);
}
END_TEST

void pm_add_flush(const struct pm_cases *c)
{
    tcase_add_test(c->pool, commit_syncs_what_was_written);
    tcase_add_loop_test(c->flush, split_flush_with_helpers, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_loop_test(c->flush, split_flush_contended, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_loop_test(c->flush, split_flush_alone, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_loop_test(c->flush, split_flush_threshold, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_test(c->flush, late_helper_not_waited_for);
    tcase_add_test(c->flush, helper_msync_failure_stops_commits);
    tcase_add_loop_test(c->flush, helpers_then_kill, MODE_MSYNC, MODE_PMEM + 1);
}
