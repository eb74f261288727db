/* Suite pm: the pool's record slots, rewrites in place (pm_overwrite)
 * and leased segments, each with its crash states and what recovery and
 * pm_check make of them.
 *
 * Crash states come from two places: forged with pwrite on a closed pool,
 * or made by the pool itself in a child that dies at a chosen msync
 * (pm_fixture.h: this binary's pmem_msync); on real PM, or with
 * PMEM_IS_PMEM_FORCE=1, flushes bypass it and those tests skip.
 *
 * The suite is assembled here from files that share pm_fixture.h:
 *
 *   test_pm.c           (this file) record slots, rewrites in place and
 *                       their crash states, the descriptor handed out for
 *                       registration
 *   test_pm_clean.c     cleaning
 *   test_pm_lease.c     leased segments
 *   test_pm_flush.c     what a commit makes durable; cooperative flushing
 *                       (case flush)
 *   test_pm_headers.c   segment headers and pool layouts
 */
#include <check.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pm_fixture.h"
#include "suites.h"

static void setup(void)
{
    test_pool_file(path, sizeof(path), "pm");
}

static void teardown(void)
{
    test_pool_file_remove(path);
}

/* ---- slots ---- */

/* Rewrite the committed record at `loc` in the file (a closed pool) as
 * key = `len` bytes of `fill` with the given slot and flags, checksum
 * right. */
static void forge_rec(pm_loc loc, const char *key, char fill, uint32_t len, uint32_t slot,
                      uint8_t flags, uint64_t version)
{
    uint8_t buf[512];
    struct pm_rec *r = (void *)buf;
    uint16_t klen = (uint16_t)strlen(key);

    ck_assert_uint_le(sizeof(*r) + klen + len, sizeof(buf));
    *r = (struct pm_rec){.val_len = len, .version = version, .key_len = klen,
                              .type = PM_VALUE, .flags = flags, .slot = slot};
    memcpy(buf + sizeof(*r), key, klen);
    memset(buf + sizeof(*r) + klen, fill, len);
    r->sum = pm_rec_sum(r);
    file_write(file_off(loc), buf, sizeof(*r) + klen + len);
}

/* A record whose slot is larger than the record itself: recovery finds the
 * next record at the end of the slot, not at the end of the record. */
START_TEST(slot_walk)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t va, vb;
    pm_loc a = put(p, "a", 'a', 200, &va), b = put(p, "b", 'b', 3, &vb);
    uint32_t slot = pm_rec_size(1, 200);
    struct check_out c;
    struct seen s;

    ck_assert_uint_eq(pm_slot_size(p, a), slot);      /* slot 0: its own size */
    commit(p);
    pm_close(p);
    forge_rec(a, "a", 'x', 10, slot, 0, va);

    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(s.r[0].loc, a);
    ck_assert_uint_eq(s.r[0].val_len, 10);
    ck_assert_uint_eq(s.r[0].slot, slot);
    ck_assert_uint_eq(s.r[1].loc, b);
    ck_assert_uint_eq(s.r[1].version, vb);
    ck_assert_uint_eq(pm_slot_size(p, a), slot);
    ck_assert_uint_eq(pm_slot_size(p, b), pm_rec_size(1, 3));
    pm_close(p);
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 2);

    /* Slots that would send the walk astray are corruption, reported at
     * the record that has them. */
    const uint32_t bad[] = {
        slot + 4,                         /* unaligned */
        pm_rec_size(1, 10) - 8,      /* smaller than the record */
        SEG,                              /* past the commit point */
    };
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        forge_rec(a, "a", 'x', 10, bad[i], 0, va);
        ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
        check_pool(&c);
        ck_assert_int_eq(c.rc, TERN_ECORRUPT);
        ck_assert_msg(c.bad == (uint64_t)file_off(a), "slot %u: bad offset %llu, not %lld",
                      bad[i], (unsigned long long)c.bad, (long long)file_off(a));
    }
}
END_TEST

/* ---- rewrites in place ---- */

START_TEST(overwrite_in_place)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v1, v2, v3, v4;
    pm_loc a = put(p, "k", '1', 100, &v1), b = put(p, "k", '2', 5, &v2);
    uint32_t slot = pm_rec_size(1, 100);
    const struct pm_rec *r;
    struct pm_info i0, i1, i2;
    struct check_out c;
    struct seen s;

    commit(p);
    pm_get_info(p, &i0);
    pm_dead(p, a);                     /* the caller's part: v2 superseded it */
    pm_get_info(p, &i1);
    ck_assert_uint_eq(i1.bytes_live, i0.bytes_live - slot);
    v3 = pm_next_version(p);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, v3, "k", 1, "three", 5), 0);
    r = pm_rec_at(p, a);
    ck_assert_uint_eq(r->version, v3);
    ck_assert_uint_eq(r->flags, PM_F_REWRITTEN);
    ck_assert_uint_eq(r->slot, slot);
    ck_assert_uint_eq(r->val_len, 5);
    ck_assert(memcmp(pm_rec_val(r), "three", 5) == 0);
    ck_assert_uint_eq(pm_slot_size(p, a), slot);
    pm_get_info(p, &i2);
    ck_assert_uint_eq(i2.bytes_live, i0.bytes_live);    /* the slot is live again */
    ck_assert_uint_eq(i2.bytes_committed, i0.bytes_committed);
    commit(p);
    pm_close(p);

    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_ptr_null(seen_ver(&s, v1));
    ck_assert_uint_eq(seen_ver(&s, v3)->loc, a);
    ck_assert(memcmp(seen_ver(&s, v3)->val, "three", 5) == 0);
    ck_assert_uint_eq(seen_ver(&s, v2)->loc, b);       /* the walk went on past the slot */
    /* Again, now as a tombstone: the slot is marked already. A dead
     * rewritten record frees its whole slot, not just its own bytes. */
    pm_get_info(p, &i0);
    pm_dead(p, a);
    pm_get_info(p, &i1);
    ck_assert_uint_eq(i1.bytes_live, i0.bytes_live - slot);
    v4 = pm_next_version(p);
    ck_assert_int_eq(pm_overwrite(p, a, PM_TOMBSTONE, v4, "k", 1, NULL, 0), 0);
    commit(p);
    pm_close(p);

    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(seen_ver(&s, v4)->loc, a);
    ck_assert_uint_eq(seen_ver(&s, v4)->type, PM_TOMBSTONE);
    ck_assert_ptr_null(seen_ver(&s, v3));
    ck_assert_uint_eq(pm_slot_size(p, a), slot);
    pm_close(p);
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 2);
    ck_assert_ptr_null(strstr(c.text, "rewrite "));
}
END_TEST

/* What a refused rewrite must leave alone. */
struct slot_snap {
    uint8_t bytes[256];
    struct pm_info info;
};

static void snap(struct pm_pool *p, pm_loc loc, struct slot_snap *s)
{
    memcpy(s->bytes, pm_rec_at(p, loc), sizeof(s->bytes));
    pm_get_info(p, &s->info);
}

static void same_as(struct pm_pool *p, pm_loc loc, const struct slot_snap *s)
{
    struct slot_snap now;

    snap(p, loc, &now);
    ck_assert(memcmp(now.bytes, s->bytes, sizeof(s->bytes)) == 0);
    ck_assert_uint_eq(now.info.bytes_live, s->info.bytes_live);
    ck_assert_uint_eq(now.info.max_version, s->info.max_version);
}

START_TEST(overwrite_refused)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    static char big[SEG];
    pm_loc a = put(p, "k", '1', 100, NULL), other, pending, leased;
    uint32_t room = pm_rec_size(1, 100) - (uint32_t)sizeof(struct pm_rec) - 1;
    struct slot_snap before;
    uint32_t seg;

    put(p, "k", '2', 5, NULL);
    other = put(p, "j", '3', 5, NULL);
    commit(p);
    pending = put(p, "k", '4', 5, NULL);      /* above the commit point */
    pm_dead(p, a);
    snap(p, a, &before);
    memset(big, 'b', sizeof(big));
    /* One byte too many for the slot; the most that fits is taken. */
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "k", 1, big, room + 1),
                     TERN_E2BIG);
    same_as(p, a, &before);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "k", 1, big, SEG),
                     TERN_E2BIG);
    same_as(p, a, &before);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "j", 1, "v", 1), TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "kk", 2, "v", 1), TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a, 3, 1000, "k", 1, "v", 1), TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a, PM_TOMBSTONE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);
    same_as(p, a, &before);
    ck_assert_int_eq(pm_overwrite(p, pending, PM_VALUE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a + 8, PM_VALUE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);        /* inside the record, not a record */
    ck_assert_int_eq(pm_overwrite(p, (uint64_t)(pm_seg_count(p) - 1) << 32 | 64,
                                       PM_VALUE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);        /* a free segment */
    ck_assert_int_eq(pm_overwrite(p, (uint64_t)pm_seg_count(p) << 32 | 64,
                                       PM_VALUE, 1000, "k", 1, "v", 1), TERN_EINVAL);
    /* Not in a segment a lessee may still write. */
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    leased = lessee_put(p, seg, "L", NULL, NULL);
    commit(p);
    ck_assert_int_eq(pm_overwrite(p, leased, PM_TOMBSTONE, 1000, "L", 1, NULL, 0),
                     TERN_EINVAL);
    /* The largest value that fits does. */
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "k", 1, big, room), 0);
    ck_assert_int_eq(pm_overwrite(p, other, PM_VALUE, 1001, "j", 1, "v", 1), 0);
    ck_assert_uint_eq(pm_next_version(p), 1002);  /* the counter stays ahead */
    pm_close(p);

    /* Before recovery nothing may be rewritten. */
    struct pm_opts o = {.seg_size = SEG};
    ck_assert_int_eq(pm_open(path, &o, &p), 0);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1002, "k", 1, "v", 1), TERN_EINVAL);
    pm_close(p);
}
END_TEST

/* The child's part: reopen, the caller's pm_dead, then the rewrite,
 * and die without a commit (or earlier, at the injected msync). */
static int do_rewrite(void *arg)
{
    struct rewrite_case *rc = arg;
    struct pm_pool *p;
    struct pm_opts o = {0};

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    pm_dead(p, rc->a);
    if (pm_overwrite(p, rc->a, PM_VALUE, rc->v3, "k", 1, "three", 5) < 0)
        return 11;
    return 12;                          /* got through without the msync */
}

/* Recovery after an interrupted rewrite of a: the slot is stepped over,
 * k's newest committed version (v2, at b) stands, the pool opens, the
 * slot counts as dead, and the check reports it without calling the pool
 * corrupt. */
static void expect_skipped_with(const struct rewrite_case *rc, unsigned pending)
{
    struct pm_pool *p;
    struct pm_info info;
    struct check_out c;
    struct seen s;

    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    ck_assert_msg(reported(&c, "rewrite  ", file_off(rc->a)), "not reported:\n%s", c.text);
    ck_assert_uint_eq(c.info.records, 2 + pending);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2 + pending);
    ck_assert_ptr_null(seen_loc(&s, rc->a));
    ck_assert_ptr_null(seen_ver(&s, rc->v1));
    ck_assert_ptr_null(seen_ver(&s, rc->v3));
    ck_assert_uint_eq(seen_ver(&s, rc->v2)->loc, rc->b);
    pm_get_info(p, &info);
    ck_assert_uint_eq(info.bytes_live, info.bytes_committed - rc->slot);
    pm_close(p);
}

static void expect_skipped(const struct rewrite_case *rc)
{
    expect_skipped_with(rc, 0);
}

/* Crash after step (a): the mark is durable, no byte of the new record is. */
START_TEST(crash_after_mark)
{
    struct rewrite_case rc;
    struct pm_rec r;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    unlink(path);
    rewrite_setup(&rc, true);
    /* The first msync of the rewrite is the mark's (nothing else is
     * dirty after recovery). */
    ck_assert_int_eq(crash_child(do_rewrite, &rc, 1), 0);
    file_read(file_off(rc.a), &r, sizeof(r));
    ck_assert_uint_eq(r.flags, PM_F_REWRITTEN);
    ck_assert_uint_eq(r.slot, rc.slot);
    ck_assert_uint_eq(r.version, rc.v1);    /* the rest is the old record's */
    ck_assert_uint_eq(r.val_len, 100);
    expect_skipped(&rc);
}
END_TEST

/* Crash in step (b): the new header went in, the end of the value did not
 * (as when its last cache line never left the CPU). */
START_TEST(crash_in_rewrite)
{
    struct rewrite_case rc;
    struct pm_rec r;
    struct seen s;
    struct pm_pool *p;

    rewrite_setup(&rc, true);
    ck_assert_int_eq(crash_child(do_rewrite, &rc, 0), 12);
    /* Whole but uncommitted: a write never acknowledged may still show. */
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, rc.v3)->loc, rc.a);
    ck_assert_uint_eq(seen_ver(&s, rc.v3)->flags, PM_F_REWRITTEN);
    pm_close(p);
    /* Torn: the old value's bytes where the new value's end should be. */
    file_read(file_off(rc.a), &r, sizeof(r));
    ck_assert_uint_eq(r.version, rc.v3);
    file_write(file_off(rc.a) + (off_t)sizeof(r) + 1 + 3, "11", 2);
    expect_skipped(&rc);
}
END_TEST

/* The child's part: the key's newer version is appended but not yet
 * committed when the old one is rewritten. */
static int do_rewrite_behind(void *arg)
{
    struct rewrite_case *rc = arg;
    struct pm_pool *p;
    struct pm_opts o = {0};
    pm_loc b;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    if (pm_append(p, PM_VALUE, rc->v3, "k", 1, "newer", 5, &b) < 0)
        return 11;
    pm_dead(p, rc->a);
    if (pm_overwrite(p, rc->a, PM_VALUE, rc->v3 + 1, "k", 1, "three", 5) < 0)
        return 12;
    return 13;
}

/* A crash at any point of a rewrite whose justification (the newer
 * version) was not yet committed: the key still has a value, the old
 * acknowledged one or a newer one, never none. */
START_TEST(rewrite_commits_newer_version_first)
{
    struct rewrite_case rc;
    int syncs, st;

    if (pool_is_pmem())
        return;
    for (syncs = 1; syncs < 10; syncs++) {
        struct pm_pool *p;
        struct seen s;
        unsigned have = 0;

        unlink(path);
        rewrite_setup(&rc, false);      /* a holds k's only committed version */
        st = crash_child(do_rewrite_behind, &rc, syncs);
        p = open_pool(0, &s);
        for (unsigned i = 0; i < s.n; i++)
            if (s.r[i].key[0] == 'k' && s.r[i].key[1] == '\0')
                have++;
        ck_assert_msg(have >= 1, "crash at msync %d: key k is gone", syncs);
        pm_close(p);
        if (st == 13)
            break;                      /* the rewrite got through: every point tried */
        ck_assert_int_eq(st, 0);
    }
    ck_assert_int_eq(st, 13);
}
END_TEST

/* The child's part for pm_overwrite_behind: another key's record is
 * appended (a batch not yet committed) before k's older record is
 * rewritten; the child dies without a commit. */
static int do_rewrite_in_batch(void *arg)
{
    struct rewrite_case *rc = arg;
    struct pm_pool *p;
    struct pm_opts o = {0};
    pm_loc j;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    if (pm_append(p, PM_VALUE, rc->v3 + 1, "j", 1, "pending", 7, &j) < 0)
        return 11;
    pm_dead(p, rc->a);
    if (pm_overwrite_behind(p, rc->a, PM_VALUE, rc->v3, "k", 1, "three", 5) < 0)
        return 12;
    return 13;
}

/* pm_overwrite_behind (k's newer version v2 is committed): the batch
 * appended before it stays uncommitted (one commit per batch), and the
 * mark is durable before the new bytes (a crash right after its msync is
 * an interrupted rewrite that recovery skips). */
START_TEST(overwrite_behind_leaves_batch_pending)
{
    struct rewrite_case rc;
    struct pm_info info;
    struct pm_pool *p;
    struct pm_rec r;
    struct seen s;

    rewrite_setup(&rc, true);
    ck_assert_int_eq(crash_child(do_rewrite_in_batch, &rc, 0), 13);
    p = open_pool(0, &s);
    pm_get_info(p, &info);
    /* "j" was never committed. On PM it is gone; through a file its whole
     * record past the commit word may show (PM_SEG_TAIL), as any write
     * never acknowledged may: that the rewrite did not flush it is checked
     * below, by the msync log. */
    if (info.is_pmem)
        ck_assert_ptr_null(seen_ver(&s, rc.v3 + 1));
    ck_assert_uint_eq(seen_ver(&s, rc.v2)->loc, rc.b);
    pm_close(p);
    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    unlink(path);
    rewrite_setup(&rc, true);
    /* The first msync is the mark's, on its own: "j" is not flushed (it
     * still shows, whole in the file past the lagging commit word, unless
     * the pool keeps its commit words exact). */
    ck_assert_int_eq(crash_child(do_rewrite_in_batch, &rc, 1), 0);
    file_read(file_off(rc.a), &r, sizeof(r));
    ck_assert_uint_eq(r.flags, PM_F_REWRITTEN);
    ck_assert_uint_eq(r.version, rc.v1);
    expect_skipped_with(&rc, 1);
}
END_TEST

/* pm_rewrite_pending: only over a record above its segment's commit
 * point or a slot marked by an earlier rewrite; the slot keeps its size and
 * the walk goes on past it; a torn rewrite of a marked slot is skipped at
 * recovery, and the key falls back to its older version. */
START_TEST(rewrite_pending_rules)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v1, v2, v3, v4, v5, v6;
    pm_loc a = put(p, "k", '1', 100, &v1), pend, leased;
    uint32_t slot = pm_rec_size(1, 100), seg;
    const struct pm_rec *r;
    struct slot_snap before;
    struct check_out c;
    struct seen s;

    commit(p);
    snap(p, a, &before);
    ck_assert_int_eq(pm_rewrite_pending(p, a, PM_VALUE, 900, "k", 1, "x", 1),
                     TERN_EINVAL);         /* committed, never rewritten */
    same_as(p, a, &before);
    pend = put(p, "k", '2', 100, &v2);
    put(p, "j", 'j', 7, NULL);
    snap(p, pend, &before);
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 901, "x", 1, "x", 1),
                     TERN_EINVAL);         /* another key's */
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 902, "k", 1, NULL, 0),
                     0);                   /* (an empty value fits) */
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 903, "k", 1,
                                             "0123456789", slot), TERN_E2BIG);
    v3 = pm_next_version(p);
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, v3, "k", 1, "three", 5),
                     0);
    r = pm_rec_at(p, pend);
    ck_assert_uint_eq(r->version, v3);
    ck_assert_uint_eq(r->slot, slot);
    ck_assert_uint_eq(r->flags, 0);
    commit(p);
    /* Committed now, and never marked. */
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 904, "k", 1, "x", 1),
                     TERN_EINVAL);
    pm_dead(p, a);
    v4 = pm_next_version(p);
    ck_assert_int_eq(pm_overwrite_behind(p, a, PM_VALUE, v4, "k", 1, "four", 4), 0);
    v5 = pm_next_version(p);
    ck_assert_int_eq(pm_rewrite_pending(p, a, PM_VALUE, v5, "k", 1, "five", 4), 0);
    /* Not in a leased segment. */
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    leased = lessee_put(p, seg, "k", "leased", NULL);
    ck_assert_int_eq(pm_rewrite_pending(p, leased, PM_VALUE, 905, "k", 1, "x", 1),
                     TERN_EINVAL);
    pm_lease_end(p, seg);
    commit(p);
    pm_close(p);

    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, v5)->loc, a);
    ck_assert(memcmp(seen_ver(&s, v5)->val, "five", 4) == 0);
    ck_assert_uint_eq(seen_ver(&s, v3)->loc, pend);
    ck_assert(memcmp(seen_ver(&s, v3)->val, "three", 5) == 0);
    ck_assert_ptr_null(seen_ver(&s, v1));
    ck_assert_ptr_null(seen_ver(&s, v2));
    ck_assert_ptr_null(seen_ver(&s, v4));
    ck_assert_uint_eq(s.n, 3);              /* a, pend, and "j" past pend's slot */
    /* Again over the marked slot, torn this time (the pool closes without a
     * commit; the value's end never made it). */
    v6 = pm_next_version(p);
    ck_assert_int_eq(pm_rewrite_pending(p, a, PM_VALUE, v6, "k", 1, "sixsix", 6), 0);
    pm_close(p);
    file_write(file_off(a) + (off_t)sizeof(struct pm_rec) + 1 + 4, "!!", 2);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    p = open_pool(0, &s);
    ck_assert_ptr_null(seen_loc(&s, a));
    ck_assert_uint_eq(seen_ver(&s, v3)->loc, pend);
    pm_close(p);
}
END_TEST

/* A bad record without the flag is corruption, as before rewrites; so is
 * one with the flag whose slot cannot be trusted to find the next record. */
START_TEST(corruption_still_refused)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v1;
    pm_loc a = put(p, "k", '1', 100, &v1);
    uint32_t slot = pm_rec_size(1, 100);
    struct check_out c;
    uint8_t word[8];

    put(p, "k", '2', 5, NULL);
    commit(p);
    pm_close(p);
    file_write(file_off(a) + 24 + 1 + 50, "X", 1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, (uint64_t)file_off(a));
    ck_assert_ptr_null(strstr(c.text, "rewrite "));
    /* A flag this layout does not know, checksum and all. */
    forge_rec(a, "k", '1', 100, 0, 0x02, v1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, (uint64_t)file_off(a));

    /* The flag with a slot past the commit point, unaligned, or too small
     * to hold a record header. */
    const uint32_t bad[] = {SEG, slot + 4, 16, 0};
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct pm_rec h = {.key_len = 1, .type = PM_VALUE,
                                .flags = PM_F_REWRITTEN, .slot = bad[i]};

        memcpy(word, (uint8_t *)&h + 16, 8);
        file_write(file_off(a) + 16, word, 8);
        ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
        check_pool(&c);
        ck_assert_msg(c.rc == TERN_ECORRUPT, "slot %u: %s", bad[i], c.text);
        ck_assert_uint_eq(c.bad, (uint64_t)file_off(a));
    }
}
END_TEST

/* ---- the descriptor handed out for registration ---- */

/* pm_fd is the pool's file without its lock: a holder of a duplicate
 * (as a shm peer gets one) can neither take the lock through it nor drop
 * the owner's, and the pool stays locked until the owner closes it. */
START_TEST(shared_fd_carries_no_lock)
{
    struct pm_pool *p = open_pool(POOL, NULL), *q = NULL;
    struct pm_opts o = {0};
    struct stat a, b;
    int fd = fcntl(pm_fd(p), F_DUPFD_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fstat(fd, &a), 0);
    ck_assert_int_eq(stat(path, &b), 0);
    ck_assert(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
    ck_assert_int_eq(flock(fd, LOCK_EX | LOCK_NB), -1);
    ck_assert_int_eq(errno, EWOULDBLOCK);
    ck_assert_int_eq(flock(fd, LOCK_UN), 0);
    ck_assert_int_eq(pm_open(path, &o, &q), TERN_EBUSY);
    pm_close(p);
    /* The duplicate outlives the owner, and keeps nothing locked. */
    ck_assert_int_eq(pm_open(path, &o, &q), 0);
    pm_close(q);
    close(fd);
}
END_TEST

void pm_add_records(const struct pm_cases *c)
{
    tcase_add_test(c->pool, slot_walk);
    tcase_add_test(c->pool, overwrite_in_place);
    tcase_add_test(c->pool, overwrite_refused);
    tcase_add_test(c->pool, crash_after_mark);
    tcase_add_test(c->pool, crash_in_rewrite);
    tcase_add_test(c->pool, rewrite_commits_newer_version_first);
    tcase_add_test(c->pool, overwrite_behind_leaves_batch_pending);
    tcase_add_test(c->pool, rewrite_pending_rules);
    tcase_add_test(c->pool, corruption_still_refused);
    tcase_add_test(c->pool, shared_fd_carries_no_lock);
}

Suite *suite_pm(void)
{
    Suite *s = suite_create("pm");
    struct pm_cases c = {.pool = tcase_create("pool"), .flush = tcase_create("flush")};

    tcase_add_checked_fixture(c.pool, setup, teardown);
    tcase_set_timeout(c.pool, 60);
    tcase_add_checked_fixture(c.flush, setup, teardown);
    tcase_set_timeout(c.flush, 120);
    pm_add_records(&c);
    pm_add_clean(&c);
    pm_add_lease(&c);
    pm_add_flush(&c);
    pm_add_headers(&c);
    pm_add_tail(&c);
    suite_add_tcase(s, c.pool);
    suite_add_tcase(s, c.flush);
    return s;
}
