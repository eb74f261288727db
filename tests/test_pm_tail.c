/* pm suite, case "pool": commits through a file (PM_SEG_TAIL segments,
 * pm_layout.h). One msync per commit, with the segment's commit word a
 * commit or more behind; recovery takes the acknowledged records past the
 * word, cuts a commit the crash tore, and no record of a crash's cut-short
 * commit or of a segment's earlier life ever joins the records written
 * after it. On PM (PMEM_IS_PMEM_FORCE=1) every commit orders records then
 * words, and these cases say SKIP. */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pm_fixture.h"

static bool skip_on_pmem(void)
{
    if (!pool_is_pmem())
        return false;
    printf("SKIP: the pool is on PM (PMEM_IS_PMEM_FORCE): commit words never lag there\n");
    return true;
}

/* Ten records, each committed (acknowledged), then the process dies
 * without closing the pool. */
static void write_acked(void)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    char k[8];

    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        put(p, k, (char)('a' + i), 200, NULL);
        commit(p);
    }
    _exit(0);
}

/* A commit is one msync: the records' pages, and the commit word only
 * when it has fallen far enough behind. */
START_TEST(tail_commit_is_one_msync)
{
    struct pm_pool *p;
    unsigned msyncs = 0;

    if (skip_on_pmem())
        return;
    p = open_pool(POOL, NULL);
    put(p, "a", 'a', 100, NULL);
    sync_log_start();
    commit(p);
    sync_log_stop();
    for (unsigned i = 0; i < sync_log_len(); i++)
        msyncs += sync_log.kind[i] == LOG_MSYNC;
    ck_assert_uint_eq(msyncs, 1);
    pm_close(p);
}
END_TEST

/* Acknowledged records past a lagging commit word are all recovered, and
 * the checker agrees. */
START_TEST(tail_acked_records_survive)
{
    struct check_out c;
    struct pm_pool *p;
    struct seen s;
    pid_t pid;
    int st;

    if (skip_on_pmem())
        return;
    unlink(path);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        write_acked();
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* The word lags: the last records lie past it. */
    ck_assert_uint_lt(seg_used(0), 10 * 200);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    ck_assert_msg(strstr(c.text, "tail      segment 0:") != NULL, "no tail reported:\n%s",
                  c.text);
    ck_assert_uint_eq(c.info.records, 10);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 10);
    for (int i = 0; i < 10; i++) {
        char k[8];

        snprintf(k, sizeof(k), "k%d", i);
        ck_assert_msg(s.r[i].key[0] == 'k' && strcmp(s.r[i].key, k) == 0, "record %d: %s", i,
                      s.r[i].key);
    }
    pm_close(p);
    /* Closed in order: the word is exact, nothing lies past it. */
    check_pool(&c);
    ck_assert_msg(c.rc == 0 && !strstr(c.text, "tail      "), "%s", c.text);
}
END_TEST

/* The torn commit: a, committed; then b and c appended, and the crash tore
 * b. Recovery keeps a and drops b and c. Then d, exactly b's size, goes
 * where b was, and the process dies again: c must not come back after d
 * (recovery cleared what lay past the cut before appends went on). */
struct torn {
    pm_loc a, b, c, d;
    uint64_t va, vb, vc, vd;
};

static int write_torn(void *arg)
{
    struct torn *t = arg;
    struct pm_pool *p = open_pool(POOL, NULL);

    t->a = put(p, "a", 'a', 300, &t->va);
    commit(p);
    t->b = put(p, "b", 'b', 300, &t->vb);
    t->c = put(p, "c", 'c', 300, &t->vc);
    return 20;                          /* dies without a commit */
}

static int write_after_cut(void *arg)
{
    struct torn *t = arg;
    struct pm_pool *p;

    if (open_rc(0, NULL, &p) < 0)
        return 10;
    t->d = put(p, "d", 'd', 300, &t->vd);
    commit(p);
    return 21;
}

START_TEST(tail_torn_commit_is_cut_and_cleared)
{
    struct torn t;
    struct pm_pool *p;
    struct seen s;
    uint8_t byte;
    pid_t pid;
    int st;

    if (skip_on_pmem())
        return;
    unlink(path);
    memset(&t, 0, sizeof(t));
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(write_torn(&t));
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_int_eq(WEXITSTATUS(st), 20);
    /* a, b and c lie back to back from the start of segment 0. */
    t.b = PM_SEG_HDR + pm_rec_size(1, 300);
    /* b torn: its last bytes never reached the file. */
    file_read(file_off(t.b) + 24 + 1 + 299, &byte, 1);
    ck_assert_uint_eq(byte, 'b');
    byte = 0;
    file_write(file_off(t.b) + 24 + 1 + 299, &byte, 1);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_str_eq(s.r[0].key, "a");
    pm_close(p);
    /* d over b's place, then another death. */
    ck_assert_int_eq(crash_child(write_after_cut, &t, 0), 21);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_str_eq(s.r[0].key, "a");
    ck_assert_str_eq(s.r[1].key, "d");
    ck_assert_uint_eq(s.r[1].loc, t.b);
    pm_close(p);
}
END_TEST

/* A segment used, cleaned and handed out again starts clear: its earlier
 * life's records, though whole, are never taken past the new commit
 * word. */
static bool none_live(void *arg, pm_loc loc, const struct pm_rec *r)
{
    (void)arg;
    (void)loc;
    (void)r;
    return false;
}

static void nothing_moved(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r)
{
    (void)arg;
    (void)from;
    (void)to;
    (void)r;
}

static int write_in_reused(void *arg)
{
    struct pm_pool *p;
    pm_loc loc;

    (void)arg;
    if (open_rc(0, NULL, &p) < 0)
        return 10;
    /* The head (segment 1) is full: "new" opens the free segment on top of
     * the stack, segment 0, and goes where "old0" was, exactly its size. */
    loc = put(p, "new", 'n', 300, NULL);
    if ((uint32_t)(loc >> 32) != 0 || (uint32_t)loc != PM_SEG_HDR)
        return 11;
    commit(p);
    return 22;
}

START_TEST(tail_reused_segment_starts_clear)
{
    struct pm_cleaner cl = {.is_live = none_live, .moved = nothing_moved};
    uint64_t old_ver[4];
    pm_loc old[4];
    struct pm_pool *p;
    struct seen s;

    if (skip_on_pmem())
        return;
    p = open_pool(POOL, NULL);
    for (int i = 0; i < 4; i++) {
        char k[8];

        snprintf(k, sizeof(k), "old%d", i);
        old[i] = put(p, k, 'o', 300 - 3, &old_ver[i]);  /* "oldN" is one byte longer */
        ck_assert_uint_eq((uint32_t)(old[i] >> 32), 0);
    }
    commit(p);
    put(p, "fill", 'f', FILL_LEN, NULL);     /* segment 1, full */
    commit(p);
    for (int i = 0; i < 4; i++)
        pm_dead(p, old[i]);
    ck_assert_int_eq(pm_clean(p, &cl, 1, 50), 1);
    pm_close(p);
    ck_assert_int_eq(crash_child(write_in_reused, NULL, 0), 22);
    p = open_pool(0, &s);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(seen_ver(&s, old_ver[i]) == NULL, "old%d came back from segment 0's "
                      "earlier life", i);
    ck_assert_uint_eq(s.n, 2);                 /* fill and new */
    pm_close(p);
}
END_TEST

void pm_add_tail(const struct pm_cases *c)
{
    tcase_add_test(c->pool, tail_commit_is_one_msync);
    tcase_add_test(c->pool, tail_acked_records_survive);
    tcase_add_test(c->pool, tail_torn_commit_is_cut_and_cleared);
    tcase_add_test(c->pool, tail_reused_segment_starts_clear);
}
