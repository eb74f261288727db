/* pm: segment headers and pool layouts. Every word recovery trusts is
 * checked (damage refused, crash states of header writes), and pools of
 * older layouts are upgraded (layout 3 and 4, with crash states) unless
 * they are corrupt.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pm_fixture.h"

/* ---- segment headers: every word recovery trusts is checked ---- */

static void expect_file(const uint8_t *want, size_t len, const char *what)
{
    size_t now_len;
    uint8_t *now = file_snapshot(&now_len);

    ck_assert_msg(now_len == len && memcmp(now, want, len) == 0, "%s: the file changed", what);
    free(now);
}

/* Every segment header of the closed pool passes this layout's checks. */
static void expect_headers_sound(void)
{
    struct pm_file_hdr fh;

    file_read(0, &fh, sizeof(fh));
    ck_assert_uint_eq(fh.layout, PM_LAYOUT);
    for (uint32_t s = 0; s < fh.n_segs; s++) {
        struct pm_seg_hdr h;
        struct pm_seg_view v;
        const char *why = "";
        uint32_t at;

        file_read((off_t)pm_seg_offset(s, SEG), &h, sizeof(h));
        ck_assert_msg(pm_seg_hdr_check(&h, s, SEG, PM_LAYOUT, &v, &at, &why) == 0,
                      "segment %u + %u: %s", s, at, why);
    }
}

/* The words of a segment header that recovery reads. */
static const struct {
    const char *name;
    uint32_t at, size;
} seg_words[] = {
    {"seq", offsetof(struct pm_seg_hdr, seq), 8},
    {"commit", offsetof(struct pm_seg_hdr, commit), 8},
    {"magic", offsetof(struct pm_seg_hdr, magic), 4},
    {"index", offsetof(struct pm_seg_hdr, index), 4},
    {"flags", offsetof(struct pm_seg_hdr, flags), 4},
    {"first", offsetof(struct pm_seg_hdr, first), 4},
    {"opened", offsetof(struct pm_seg_hdr, opened), 8},
    {"sum", offsetof(struct pm_seg_hdr, sum), 4},
};

/* Each word that recovery trusts, of an ordinary segment full of records
 * and of a leased one, zeroed or with one bit flipped (in the commit point
 * and in its check): the checker and recovery both refuse the pool, name
 * the segment and the offset, and leave the file as it was. Zeroed `commit`
 * and `seq` are the cases that used to pass: a segment's records gone
 * without a word, or a full segment taken for a free one. */
START_TEST(seg_header_damage_refused)
{
    static const uint64_t flips[] = {0, 1ull << 3, 1ull << 40};
    struct pm_pool *p = open_pool(POOL, NULL);
    struct check_out c;
    uint32_t segs[2];
    struct seen s;
    char key[16];
    unsigned tried = 0;

    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "key%02d", i);
        segs[0] = (uint32_t)(put(p, key, 'v', 1000, NULL) >> 32);
    }
    ck_assert_int_eq(pm_lease(p, &segs[1]), 0);
    lessee_put(p, segs[1], "c1", "one", NULL);
    lessee_put(p, segs[1], "c2", "two", NULL);
    commit(p);
    pm_close(p);
    expect_headers_sound();

    for (unsigned si = 0; si < 2; si++) {
        uint64_t seg_off = pm_seg_offset(segs[si], SEG);
        struct pm_seg_hdr good;

        file_read((off_t)seg_off, &good, sizeof(good));
        for (unsigned w = 0; w < sizeof(seg_words) / sizeof(seg_words[0]); w++)
            for (unsigned f = 0; f < sizeof(flips) / sizeof(flips[0]); f++) {
                struct pm_seg_hdr bad = good;
                uint8_t *word = (uint8_t *)&bad + seg_words[w].at;
                uint64_t v = 0;
                char what[96], line[64];
                uint8_t *before;
                size_t len;

                memcpy(&v, word, seg_words[w].size);
                v = flips[f] ? v ^ flips[f] : 0;
                memcpy(word, &v, seg_words[w].size);
                if (memcmp(&bad, &good, sizeof(bad)) == 0)
                    continue;        /* a word that is 0 already, a bit beyond it */
                tried++;
                snprintf(what, sizeof(what), "segment %u, %s %s", segs[si], seg_words[w].name,
                         flips[f] ? "with a bit flipped" : "zeroed");
                file_write((off_t)seg_off, &bad, sizeof(bad));
                before = file_snapshot(&len);
                check_pool(&c);
                ck_assert_msg(c.rc == TERN_ECORRUPT, "%s: check says %s\n%s", what,
                              tern_strerror(c.rc), c.text);
                ck_assert_msg(c.bad >= seg_off && c.bad < seg_off + sizeof(bad),
                              "%s: bad offset %llu", what, (unsigned long long)c.bad);
                snprintf(line, sizeof(line), "segment %u + %llu: segment header", segs[si],
                         (unsigned long long)(c.bad - seg_off));
                ck_assert_msg(reported(&c, "corrupt  ", (off_t)c.bad) && strstr(c.text, line),
                              "%s: not reported as such:\n%s", what, c.text);
                ck_assert_msg(open_rc(0, NULL, &p) == TERN_ECORRUPT, "%s: the pool opened",
                              what);
                expect_file(before, len, what);
                free(before);
                file_write((off_t)seg_off, &good, sizeof(good));
            }
    }
    ck_assert_uint_ge(tried, 35);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 42);
    pm_close(p);
}
END_TEST

/* The child: reopen, clean the sealed segment (the owner still needs
 * `live`, the rest is dead), then take a lease (another segment opened);
 * dies at the injected msync. */
struct clean_crash {
    pm_loc live, dead;
};

static int do_clean_and_lease(void *arg)
{
    struct clean_crash *cc = arg;
    struct clean_log l = {.live = {cc->live}, .n_live = 1};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_opts o = {0};
    struct pm_pool *p;
    uint32_t seg;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    pm_dead(p, cc->dead);
    if (pm_clean(p, &c, 1, 100) != 1)
        return 11;
    if (pm_lease(p, &seg) < 0 || pm_commit(p) < 0)
        return 12;
    return 13;
}

/* Freeing a segment (two persisted stores: the commit point back to
 * nothing, then seq 0) and opening one (the summed header, then seq) never
 * leave, at any crash point, a header that fails its checks: the check
 * passes and the pool opens with the live record, at every msync of a
 * clean and of a lease's opening. */
START_TEST(seg_header_crash_states)
{
    struct clean_crash cc;
    struct pm_pool *p;
    struct check_out c;
    uint64_t vlive, vfill;
    uint8_t *orig;
    size_t len;
    int syncs, st = 0;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    p = open_pool(POOL, NULL);
    cc.live = put(p, "live", 'l', 100, &vlive);
    cc.dead = put(p, "dead", 'd', 100, NULL);
    put(p, "fill", 'f', FILL_LEN, &vfill);     /* seals the first segment */
    commit(p);
    pm_close(p);
    orig = file_snapshot(&len);
    for (syncs = 1; syncs < 40; syncs++) {
        struct seen s;

        file_write(0, orig, len);
        st = crash_child(do_clean_and_lease, &cc, syncs);
        ck_assert_msg(st == 0 || st == 13, "msync %d: child failed with %d", syncs, st);
        check_pool(&c);
        ck_assert_msg(c.rc == 0, "crash at msync %d: check: %s\n%s", syncs,
                      tern_strerror(c.rc), c.text);
        p = open_pool(0, &s);
        ck_assert_msg(seen_ver(&s, vlive) && seen_ver(&s, vfill),
                      "crash at msync %d: a record is gone", syncs);
        pm_close(p);
        if (st == 13)
            break;
    }
    ck_assert_msg(st == 13, "the child never got through");
    ck_assert_int_gt(syncs, 6);
    free(orig);
}
END_TEST

/* Rewrite the closed pool's file as layout `layout` (3 or 4) wrote it: plain
 * commit points, zeros where `opened` and the header sum go. */
static void make_old_layout(uint32_t layout)
{
    struct pm_file_hdr fh;

    file_read(0, &fh, sizeof(fh));
    for (uint32_t s = 0; s < fh.n_segs; s++) {
        struct pm_seg_hdr h;

        file_read((off_t)pm_seg_offset(s, SEG), &h, sizeof(h));
        h.commit = (uint32_t)h.commit;
        h.opened = 0;
        h.sum = 0;
        file_write((off_t)pm_seg_offset(s, SEG), &h, sizeof(h));
    }
    fh.layout = layout;
    fh.sum = pm_sum(&fh, offsetof(struct pm_file_hdr, sum));
    file_write(0, &fh, sizeof(fh));
}

/* A layout-3 pool (before leases started a page in, and before segment
 * headers were checked) opens: its header is upgraded to this layout,
 * stray bytes in the segment headers' `first` word are cleared first, the
 * headers get their checks, and every record is still there. */
START_TEST(layout3_pool_is_upgraded)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    struct pm_file_hdr fh;
    struct pm_seg_hdr h;
    struct check_out c;
    uint64_t v1, v2;
    pm_loc r1;
    struct seen s;
    uint32_t junk = 0x5a5a5a5a;

    r1 = put(p, "one", '1', 100, &v1);
    put(p, "two", '2', 100, &v2);
    commit(p);
    pm_close(p);
    make_old_layout(3);
    /* A free segment's header, and one in use, with junk where layout 3 had
     * reserved bytes. */
    file_write((off_t)pm_seg_offset(7, SEG) + offsetof(struct pm_seg_hdr, first),
               &junk, sizeof(junk));
    file_write((off_t)pm_seg_offset((uint32_t)(r1 >> 32), SEG) +
                   offsetof(struct pm_seg_hdr, first), &junk, sizeof(junk));
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "a layout-3 pool fails its check: %s\n%s", tern_strerror(c.rc),
                  c.text);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    pm_close(p);
    file_read(0, &fh, sizeof(fh));
    ck_assert_uint_eq(fh.layout, PM_LAYOUT);
    ck_assert_uint_eq(fh.sum, pm_sum(&fh, offsetof(struct pm_file_hdr, sum)));
    file_read((off_t)pm_seg_offset(7, SEG), &h, sizeof(h));
    ck_assert_uint_eq(h.first, 0);
    expect_headers_sound();
}
END_TEST

/* Cleaning never takes a segment a lessee may still be writing, however
 * dead its records; once the lease ends it may. */

static int do_open(void *arg)
{
    struct pm_opts o = {0};
    struct pm_pool *p;

    (void)arg;
    if (pm_open(path, &o, &p) < 0)
        return 10;
    pm_close(p);
    return 11;
}

/* A layout-4 pool (records in the head, in a leased segment, a segment
 * freed) is upgraded on open, and a crash at any msync of the upgrade
 * leaves a file that passes the check (segments of both forms) and that
 * the next open upgrades, every record still there. */
START_TEST(layout4_upgrade_crash_states)
{
    struct clean_log l = {0};
    struct pm_cleaner cl = {.is_live = cl_is_live, .moved = cl_moved,
                                 .dropped = cl_dropped, .arg = &l};
    bool pmem = pool_is_pmem();
    struct pm_pool *p = open_pool(POOL, NULL);
    struct check_out c;
    uint64_t v[4];
    uint32_t seg;
    uint8_t *orig;
    size_t len;
    int syncs, st = 0;

    pm_dead(p, put(p, "gone", 'g', FILL_LEN, NULL));
    put(p, "own", 'o', 100, &v[0]);
    ck_assert_int_eq(pm_clean(p, &cl, 1, 100), 1);     /* "gone"'s segment */
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    lessee_put(p, seg, "c1", "one", &v[1]);
    lessee_put(p, seg, "c2", "two", &v[2]);
    put(p, "own2", 'p', 200, &v[3]);
    commit(p);
    pm_close(p);
    make_old_layout(4);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "the layout-4 pool fails its check: %s\n%s", tern_strerror(c.rc),
                  c.text);
    ck_assert_uint_eq(c.info.version, 4);
    orig = file_snapshot(&len);
    for (syncs = 1; syncs < 40; syncs++) {
        struct seen s;

        file_write(0, orig, len);
        if (!pmem) {
            st = crash_child(do_open, NULL, syncs);
            ck_assert_msg(st == 0 || st == 11, "msync %d: child failed with %d", syncs, st);
            check_pool(&c);
            ck_assert_msg(c.rc == 0, "crash at msync %d: check: %s\n%s", syncs,
                          tern_strerror(c.rc), c.text);
        } else {
            st = 11;                    /* flushes bypass pmem_msync: no crash points */
        }
        p = open_pool(0, &s);
        ck_assert_uint_eq(s.n, 4);
        for (int i = 0; i < 4; i++)
            ck_assert_msg(seen_ver(&s, v[i]), "crash at msync %d: record %d is gone", syncs, i);
        pm_close(p);
        expect_headers_sound();
        if (st == 11)
            break;
    }
    ck_assert_msg(st == 11, "the child never got through");
    free(orig);
}
END_TEST

/* An old pool whose segment header fails its layout's checks is refused
 * before the upgrade writes anything. */
START_TEST(corrupt_old_layout_not_upgraded)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    struct pm_opts o = {0};
    struct check_out c;
    uint64_t big = 2ull * SEG;
    uint32_t seg;
    uint8_t *before;
    size_t len;

    put(p, "a", 'a', 100, NULL);
    seg = (uint32_t)(put(p, "b", 'b', 100, NULL) >> 32);
    commit(p);
    pm_close(p);
    make_old_layout(4);
    file_write((off_t)(pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, commit)), &big,
               sizeof(big));
    before = file_snapshot(&len);
    ck_assert_int_eq(pm_open(path, &o, &p), TERN_ECORRUPT);
    expect_file(before, len, "refused upgrade");
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, commit));
    free(before);
}
END_TEST

void pm_add_headers(const struct pm_cases *c)
{
    tcase_add_test(c->pool, seg_header_damage_refused);
    tcase_add_test(c->pool, seg_header_crash_states);
    tcase_add_test(c->pool, layout3_pool_is_upgraded);
    tcase_add_test(c->pool, layout4_upgrade_crash_states);
    tcase_add_test(c->pool, corrupt_old_layout_not_upgraded);
}
