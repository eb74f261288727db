/* pm: cleaning segments (pm_clean). The slot of an interrupted rewrite is
 * nobody's record, the walk follows slots, and a clean cut short leaves
 * recovery the copy first.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "pm_fixture.h"

/* ---- cleaning ---- */

/* The slot of an interrupted rewrite is nobody's record: cleaning its
 * segment neither asks the owner about it nor reports it dropped. */
START_TEST(clean_steps_over_torn_rewrite)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct rewrite_case rc;
    struct pm_pool *p;
    struct pm_info info;
    uint8_t word[8];
    struct pm_rec h;
    struct seen s;

    rewrite_setup(&rc, true);
    file_read(file_off(rc.a), &h, sizeof(h));
    h.flags = PM_F_REWRITTEN;
    h.slot = rc.slot;
    memcpy(word, (uint8_t *)&h + 16, 8);
    file_write(file_off(rc.a) + 16, word, 8);      /* the state after step (a) */
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    /* Move the head on, so that a's segment is sealed and may be cleaned. */
    put(p, "fill", 'f', FILL_LEN, NULL);
    commit(p);
    l.live[l.n_live++] = rc.b;
    ck_assert_int_ge(pm_clean(p, &c, 1, 100), 1);
    ck_assert_uint_eq(l.n_moved, 1);
    ck_assert(!logged(l.asked, l.n_asked, rc.a));
    ck_assert(!logged(l.dropped, l.n_dropped, rc.a));
    ck_assert(logged(l.dropped, l.n_dropped, rc.b));     /* the walk went past it */
    pm_get_info(p, &info);
    pm_close(p);
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, rc.v2)->loc, l.live[0]);
    pm_close(p);
}
END_TEST

/* Cleaning walks a segment by slots too: after a rewrite that left slack
 * in its slot, the owner is asked about exactly the segment's records, and
 * the copy of the rewritten one is an ordinary record (slot 0, no flag). */
START_TEST(clean_walks_slots)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct rewrite_case rc;
    struct pm_pool *p;
    pm_loc other;
    struct seen s;

    rewrite_setup(&rc, true);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 3);
    other = s.r[1].loc;
    pm_dead(p, rc.a);
    ck_assert_int_eq(pm_overwrite(p, rc.a, PM_VALUE, rc.v3, "k", 1, "3", 1), 0);
    put(p, "fill", 'f', FILL_LEN, NULL);
    commit(p);
    l.live[l.n_live++] = rc.a;
    ck_assert_int_ge(pm_clean(p, &c, 1, 100), 1);
    ck_assert_uint_eq(l.n_asked, 3);
    ck_assert_uint_eq(l.asked[0], rc.a);
    ck_assert_uint_eq(l.asked[1], other);
    ck_assert_uint_eq(l.asked[2], rc.b);
    ck_assert_uint_eq(l.n_dropped, 3);
    ck_assert_uint_eq(l.n_moved, 1);
    ck_assert_uint_eq(pm_rec_at(p, l.live[0])->slot, 0);
    ck_assert_uint_eq(pm_rec_at(p, l.live[0])->flags, 0);
    ck_assert_uint_eq(pm_slot_size(p, l.live[0]), pm_rec_size(1, 1));
    pm_close(p);
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, rc.v3)->loc, l.live[0]);
    pm_close(p);
}
END_TEST

/* ---- a clean cut short: recovery hands the copy first ---- */

struct dup_case {
    uint32_t lseg;                   /* the victim: a segment that was leased */
    pm_loc orig;                /* its one record, live */
    uint64_t ver;
};

/* The child: reopen and clean the once-leased segment, whose record the
 * owner still needs: it is copied into the head, which was opened before
 * the lease (a lower sequence number than the victim's). */
static int do_clean_leased(void *arg)
{
    struct dup_case *d = arg;
    struct clean_log l = {.live = {d->orig}, .n_live = 1};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_opts o = {0};
    struct pm_pool *p;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    if (pm_clean(p, &c, 1, 100) != 1 || l.n_moved != 1)
        return 11;
    return 12;
}

/* A crash between a clean's commit and its victim's free leaves two
 * records of one version. Recovery hands the copy first, even where the
 * victim has the higher sequence number (a segment leased after the head
 * was opened) or the higher index, so that an owner that keeps the first
 * finds the victim all dead and the next clean frees it without copying a
 * byte: a pool the crash left without a free segment is not stuck. */
START_TEST(interrupted_clean_copy_first)
{
    struct dup_case d;
    struct pm_pool *p;
    uint8_t *orig;
    size_t len;
    unsigned dups = 0;
    int syncs, st = 0;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    p = open_pool(POOL, NULL);
    put(p, "own", 'o', 100, NULL);
    ck_assert_int_eq(pm_lease(p, &d.lseg), 0);
    d.orig = lessee_put(p, d.lseg, "c1", "one", &d.ver);
    commit(p);
    pm_lease_end(p, d.lseg);
    pm_close(p);
    orig = file_snapshot(&len);
    for (syncs = 1; syncs < 20 && st != 12; syncs++) {
        struct clean_log l = {0};
        struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                    .dropped = cl_dropped, .arg = &l};
        const struct rec_copy *first = NULL;
        pm_loc kept;
        unsigned n = 0;
        struct seen s;

        file_write(0, orig, len);
        st = crash_child(do_clean_leased, &d, syncs);
        ck_assert_msg(st == 0 || st == 12, "msync %d: child failed with %d", syncs, st);
        p = open_pool(0, &s);
        for (unsigned i = 0; i < s.n; i++)
            if (s.r[i].version == d.ver && n++ == 0)
                first = &s.r[i];
        ck_assert_msg(first, "crash at msync %d: the record is gone", syncs);
        if (n == 1) {
            pm_close(p);
            continue;
        }
        ck_assert_uint_eq(n, 2);
        dups++;
        ck_assert_msg(first->loc >> 32 != d.lseg,
                      "crash at msync %d: the victim's original came before the copy", syncs);
        /* The owner keeps the first: the victim goes without a copy. */
        kept = first->loc;
        l.live[l.n_live++] = kept;
        ck_assert_int_eq(pm_clean(p, &c, 1, 100), 1);
        ck_assert_uint_eq(l.n_moved, 0);
        ck_assert(logged(l.dropped, l.n_dropped, d.orig));
        pm_close(p);
        p = open_pool(0, &s);
        ck_assert_uint_eq(s.n, 2);
        ck_assert_uint_eq(seen_ver(&s, d.ver)->loc, kept);
        pm_close(p);
    }
    ck_assert_msg(st == 12, "the child never got through");
    ck_assert_uint_ge(dups, 1);
    free(orig);
}
END_TEST

void pm_add_clean(const struct pm_cases *c)
{
    tcase_add_test(c->pool, clean_steps_over_torn_rewrite);
    tcase_add_test(c->pool, clean_walks_slots);
    tcase_add_test(c->pool, interrupted_clean_copy_first);
}
