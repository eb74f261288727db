/* pm: leased segments. A lessee's records survive a reopen, garbage is
 * refused, an ended lease drops what was not committed, leases start past
 * the segment's header and keep the pool's reserves, the cleaner skips an
 * active lease, a scribbled lease is cut at recovery, and a segment leased
 * once is an ordinary one afterwards.
 */
#include <check.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pm_fixture.h"

/* ---- leased segments ---- */

START_TEST(lease_records_survive_reopen)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v[4], vo1, vo2;
    pm_loc loc[4], o1 = put(p, "own1", 'o', 10, &vo1), o2;
    struct check_out c;
    struct stat st;
    struct seen s;
    uint32_t seg;

    commit(p);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    ck_assert_uint_ne(seg, (uint32_t)(o1 >> 32));
    ck_assert_uint_eq(pm_seg_file_off(p, seg), pm_seg_offset(seg, SEG));
    ck_assert_uint_eq(pm_seg_file_off(p, seg) % 4096, 0);
    ck_assert_uint_eq(pm_seg_room(p), SEG - 64);
    ck_assert_uint_eq(pm_lease_next(p, seg), (uint32_t)sysconf(_SC_PAGESIZE));
    ck_assert_int_eq(fstat(pm_fd(p), &st), 0);
    ck_assert_uint_eq((uint64_t)st.st_size, pm_map_len(p));
    ck_assert_uint_eq(pm_map_len(p), POOL);

    loc[0] = lessee_put(p, seg, "c1", "client one", &v[0]);
    loc[1] = lessee_put(p, seg, "c2", "", &v[1]);
    o2 = put(p, "own2", 'p', 10, &vo2);      /* the head, between lessee records */
    ck_assert_uint_ne((uint32_t)(o2 >> 32), seg);
    loc[2] = lessee_put(p, seg, "c1", NULL, &v[2]);      /* a tombstone */
    ck_assert_uint_eq(pm_lease_next(p, seg),
                      lease_first() + pm_rec_size(2, 10) + pm_rec_size(2, 0) * 2);
    /* Stamped: version, flags 0, slot 0, checksum of the pool's bytes. */
    const struct pm_rec *r = pm_rec_at(p, loc[0]);
    ck_assert_uint_eq(r->version, v[0]);
    ck_assert_uint_eq(r->flags, 0);
    ck_assert_uint_eq(r->slot, 0);
    ck_assert_uint_eq(r->sum, pm_rec_sum(r));
    commit(p);                         /* one commit: the head and the lease */
    ck_assert_uint_eq(seg_used(seg), pm_lease_next(p, seg) - 64);
    loc[3] = lessee_put(p, seg, "c3", "uncommitted", &v[3]);
    pm_close(p);                  /* a crash with the lease active */

    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 5);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 5);
    for (int i = 0; i < 3; i++) {
        const struct rec_copy *rc = seen_ver(&s, v[i]);

        ck_assert_ptr_nonnull(rc);
        ck_assert_uint_eq(rc->loc, loc[i]);
        ck_assert_uint_eq(rc->flags, 0);
        ck_assert_uint_eq(rc->slot, 0);
    }
    ck_assert_str_eq(seen_ver(&s, v[0])->val, "client one");
    ck_assert_uint_eq(seen_ver(&s, v[2])->type, PM_TOMBSTONE);
    ck_assert_ptr_null(seen_ver(&s, v[3]));
    ck_assert_uint_eq(seen_ver(&s, vo1)->loc, o1);
    ck_assert_uint_eq(seen_ver(&s, vo2)->loc, o2);
    /* No lease survives: the segment takes nothing, and appends continue
     * in the pool's own head although the leased segment is newer. */
    ck_assert_uint_eq(pm_lease_next(p, seg), 0);
    ck_assert_int_eq(pm_lease_append(p, seg, 64 + (uint32_t)seg_used(seg),
                                          pm_next_version(p), &loc[3]), TERN_EINVAL);
    ck_assert_uint_eq((uint32_t)(put(p, "own3", 'q', 10, NULL) >> 32), (uint32_t)(o2 >> 32));
    ck_assert_uint_gt(pm_next_version(p), v[2]);
    pm_close(p);
}
END_TEST

/* A lessee's malformed record is refused, and nothing of the pool's state
 * or the segment's bytes changes. */
START_TEST(lessee_garbage_refused)
{
    static uint8_t before[SEG];
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc own = put(p, "own", 'o', 10, NULL), loc = 0;
    struct pm_info i0, i1;
    uint32_t seg, off;
    static char key[PM_KEY_MAX + 1];
    static const struct {
        uint8_t type;
        uint16_t klen;
        uint32_t vlen;
        const char *what;
    } bad[] = {
        {0, 1, 1, "type 0"},
        {3, 1, 1, "type 3"},
        {PM_TOMBSTONE, 1, 4, "tombstone with a value"},
        {PM_VALUE, 0, 4, "empty key"},
        {PM_VALUE, PM_KEY_MAX + 1, 4, "key too long"},
        {PM_VALUE, 1, 0, "one byte past the segment"},    /* length set below */
        {PM_VALUE, 1, 0xfffffff0u, "length that wraps"},
    };

    memset(key, 'k', sizeof(key));
    commit(p);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    lessee_put(p, seg, "first", "1", NULL);
    off = pm_lease_next(p, seg);
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint32_t vlen = bad[i].vlen ? bad[i].vlen : SEG - off - 24;

        lessee_write(p, seg, off, bad[i].type, key, bad[i].klen, NULL, 0);
        ((struct pm_rec *)seg_ptr(p, seg, off))->val_len = vlen;
        memcpy(before, seg_ptr(p, seg, 0), SEG);
        pm_get_info(p, &i0);
        ck_assert_msg(pm_lease_append(p, seg, off, 99, &loc) == TERN_EPROTO, "%s accepted",
                      bad[i].what);
        ck_assert_msg(memcmp(before, seg_ptr(p, seg, 0), SEG) == 0, "%s: bytes changed",
                      bad[i].what);
        pm_get_info(p, &i1);
        ck_assert_uint_eq(i1.bytes_live, i0.bytes_live);
        ck_assert_uint_eq(i1.bytes_committed, i0.bytes_committed);
        ck_assert_uint_eq(i1.max_version, i0.max_version);
        ck_assert_uint_eq(pm_lease_next(p, seg), off);
    }
    /* Right record, wrong place or wrong segment. */
    lessee_write(p, seg, off, PM_VALUE, "ok", 2, "fine", 4);
    memcpy(before, seg_ptr(p, seg, 0), SEG);
    ck_assert_int_eq(pm_lease_append(p, seg, off + 8, 99, &loc), TERN_EINVAL);
    ck_assert_int_eq(pm_lease_append(p, seg, 64, 99, &loc), TERN_EINVAL);
    ck_assert_int_eq(pm_lease_append(p, (uint32_t)(own >> 32), off, 99, &loc), TERN_EINVAL);
    ck_assert_int_eq(pm_lease_append(p, pm_seg_count(p), off, 99, &loc), TERN_EINVAL);
    ck_assert(memcmp(before, seg_ptr(p, seg, 0), SEG) == 0);
    ck_assert_uint_eq(pm_lease_next(p, seg), off);
    /* The same record at the right place goes in; then one that fills the
     * segment to its last byte, after which not even a header fits. */
    ck_assert_int_eq(pm_lease_append(p, seg, off, 99, &loc), 0);
    off = pm_lease_next(p, seg);
    lessee_write(p, seg, off, PM_VALUE, "z", 1, NULL, SEG - off - 24 - 1);
    ck_assert_int_eq(pm_lease_append(p, seg, off, 100, &loc), 0);
    ck_assert_uint_eq(pm_lease_next(p, seg), SEG);
    ck_assert_uint_eq(pm_next_version(p), 101);     /* the counter stays ahead */
    ck_assert_int_eq(pm_lease_append(p, seg, SEG, 102, &loc), TERN_EPROTO);
    commit(p);
    pm_close(p);
    struct check_out c;
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 4);
}
END_TEST

START_TEST(lease_end_drops_uncommitted)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc kept, lost;
    uint64_t vk, vl;
    struct pm_info i0, i1;
    struct seen s;
    uint32_t seg;

    ck_assert_int_eq(pm_lease(p, &seg), 0);
    kept = lessee_put(p, seg, "kept", "yes", &vk);
    commit(p);
    pm_get_info(p, &i0);
    lost = lessee_put(p, seg, "lost", "no", &vl);
    pm_lease_end(p, seg);
    pm_get_info(p, &i1);
    ck_assert_uint_eq(i1.bytes_live, i0.bytes_live);
    ck_assert_uint_eq(pm_lease_next(p, seg), 0);
    ck_assert_int_eq(pm_lease_append(p, seg, (uint32_t)lost, 77, &lost), TERN_EINVAL);
    commit(p);
    ck_assert_uint_eq(seg_used(seg), lease_first() - 64 + pm_rec_size(4, 3));
    pm_close(p);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_uint_eq(seen_ver(&s, vk)->loc, kept);
    ck_assert_ptr_null(seen_ver(&s, vl));
    pm_close(p);
}
END_TEST

/* A leased segment's records start a page in, so that a lessee mapped from
 * there on never reaches the segment's header; the header says where they
 * start, recovery and the checker walk from there, and a header whose
 * `first` is out of line is corruption, not a place to read records from. */
START_TEST(lease_starts_past_header)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    struct pm_seg_hdr h;
    struct check_out c;
    pm_loc r1, o;
    uint64_t v1, vo;
    struct seen s;
    uint32_t seg, bad;

    o = put(p, "own", 'o', 10, &vo);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    ck_assert_uint_eq(pm_lease_next(p, seg), lease_first());
    r1 = lessee_put(p, seg, "c1", "one", &v1);
    ck_assert_uint_eq((uint32_t)r1, lease_first());
    commit(p);
    pm_close(p);
    file_read((off_t)pm_seg_offset(seg, SEG), &h, sizeof(h));
    ck_assert_uint_eq(h.first, lease_first());
    ck_assert_uint_eq((uint32_t)h.commit, lease_first() - 64 + pm_rec_size(2, 3));
    ck_assert_uint_eq(h.flags, PM_SEG_LEASED);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    ck_assert_uint_eq(c.info.records, 2);
    ck_assert_uint_eq(c.info.bytes_committed, pm_rec_size(3, 10) + pm_rec_size(2, 3));
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    ck_assert_uint_eq(seen_ver(&s, vo)->loc, o);
    pm_close(p);

    /* Out of line: unaligned, inside the header, past the commit point. */
    const uint32_t bads[] = {lease_first() + 4, 8, (uint32_t)h.commit + 64 + 8};
    for (unsigned i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
        bad = bads[i];
        file_write((off_t)pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, first), &bad,
                   sizeof(bad));
        check_pool(&c);
        ck_assert_msg(c.rc == TERN_ECORRUPT, "first = %u: check says %s", bad,
                      tern_strerror(c.rc));
        ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    }
}
END_TEST

START_TEST(clean_skips_active_lease)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc a, own;
    uint32_t seg, next, free0;
    int freed;

    own = put(p, "own", 'o', 10, NULL);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    a = lessee_put(p, seg, "dead", "soon", NULL);
    commit(p);
    pm_dead(p, a);
    put(p, "fill", 'f', FILL_LEN, NULL);     /* seal own's segment too */
    commit(p);
    next = pm_lease_next(p, seg);
    free0 = pm_free_segs(p);
    freed = pm_clean(p, &c, pm_seg_count(p), 100);
    ck_assert_int_ge(freed, 1);          /* own's segment, at least */
    ck_assert(logged(l.dropped, l.n_dropped, own));
    ck_assert(!logged(l.asked, l.n_asked, a));
    ck_assert(!logged(l.dropped, l.n_dropped, a));
    ck_assert_uint_eq(pm_lease_next(p, seg), next);
    lessee_put(p, seg, "still", "leased", NULL);
    ck_assert_uint_eq(pm_free_segs(p), free0 + (uint32_t)freed);
    commit(p);
    pm_lease_end(p, seg);
    l.n_asked = l.n_dropped = 0;
    ck_assert_int_ge(pm_clean(p, &c, pm_seg_count(p), 100), 1);
    ck_assert(logged(l.dropped, l.n_dropped, a));
    pm_close(p);
}
END_TEST

/* A lease takes a free segment only while the reserves for tombstones and
 * the cleaner stay, as an append of a value would. */
START_TEST(lease_keeps_reserves)
{
    struct pm_pool *p = open_pool(4ull * SEG + 4096, NULL);
    uint32_t a, b, c;
    pm_loc t;

    ck_assert_uint_eq(pm_free_segs(p), 4);
    ck_assert_int_eq(pm_lease(p, &a), 0);
    ck_assert_int_eq(pm_lease(p, &b), 0);
    ck_assert_uint_ne(a, b);
    ck_assert_int_eq(pm_lease(p, &c), TERN_ENOSPC);
    ck_assert_uint_eq(pm_free_segs(p), 2);
    /* Appends never go to a leased segment: a value finds no head, a
     * tombstone takes the first reserve. */
    ck_assert_int_eq(pm_append(p, PM_VALUE, 1, "k", 1, "v", 1, &t), TERN_ENOSPC);
    ck_assert_int_eq(pm_append(p, PM_TOMBSTONE, 2, "k", 1, NULL, 0, &t), 0);
    ck_assert_uint_ne((uint32_t)(t >> 32), a);
    ck_assert_uint_ne((uint32_t)(t >> 32), b);
    pm_close(p);
}
END_TEST

/* A lessee that scribbled over its own committed records loses them from
 * there to the end of its segment, and no one else loses anything: the pool
 * opens, and the cut is made durable. */
START_TEST(scribbled_lease_is_cut)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc r1, r2, o1, o2;
    uint64_t v1, v2, v3, vo1, vo2;
    struct check_out c;
    struct seen s;
    uint32_t seg;

    o1 = put(p, "own1", 'o', 10, &vo1);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    r1 = lessee_put(p, seg, "c1", "one", &v1);
    r2 = lessee_put(p, seg, "c2", "two", &v2);
    lessee_put(p, seg, "c3", "three", &v3);
    o2 = put(p, "own2", 'p', 10, &vo2);
    commit(p);
    pm_close(p);
    file_write(file_off(r2) + 24 + 2, "X", 1);       /* "two" -> "Xwo" */

    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    ck_assert_msg(reported(&c, "lessee   ", file_off(r2)), "not reported:\n%s", c.text);
    ck_assert_uint_eq(c.info.records, 3);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    ck_assert_ptr_null(seen_ver(&s, v2));
    ck_assert_ptr_null(seen_ver(&s, v3));
    ck_assert_uint_eq(seen_ver(&s, vo1)->loc, o1);
    ck_assert_uint_eq(seen_ver(&s, vo2)->loc, o2);
    ck_assert_uint_eq(seg_used(seg), lease_first() - 64 + pm_rec_size(2, 3));
    pm_close(p);
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_ptr_null(strstr(c.text, "lessee "));
    ck_assert_uint_eq(c.info.records, 3);

    /* The mark outlives the lease: scribbles found after it ended are cut
     * the same way. An ordinary segment is still corruption. */
    p = open_pool(0, NULL);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    r1 = lessee_put(p, seg, "d1", "one", &v1);
    r2 = lessee_put(p, seg, "d2", "two", &v2);
    commit(p);
    pm_lease_end(p, seg);
    pm_close(p);
    file_write(file_off(r2) + 24 + 2, "X", 1);
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    ck_assert_ptr_null(seen_ver(&s, v2));
    pm_close(p);
    file_write(file_off(o2) + 24 + 4, "X", 1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, (uint64_t)file_off(o2));
}
END_TEST

/* A segment once leased and then cleaned comes back as an ordinary head:
 * its old mark must not make recovery lenient with the pool's own records. */
START_TEST(reused_lease_segment_is_ordinary)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_pool *p = open_pool(6ull * SEG + 4096, NULL);
    pm_loc a, loc = UINT64_MAX;
    uint32_t seg;

    ck_assert_int_eq(pm_lease(p, &seg), 0);
    a = lessee_put(p, seg, "c", "v", NULL);
    commit(p);
    pm_lease_end(p, seg);
    pm_dead(p, a);
    ck_assert_int_ge(pm_clean(p, &c, 1, 100), 1);
    /* Free segments are a stack: the next head is the one just freed. */
    for (int i = 0; i < 4 && (uint32_t)(loc >> 32) != seg; i++) {
        loc = put(p, "fill", 'f', FILL_LEN, NULL);
        commit(p);
    }
    ck_assert_uint_eq((uint32_t)(loc >> 32), seg);
    pm_close(p);
    file_write(file_off(loc) + 24 + 6, "X", 1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
}
END_TEST

void pm_add_lease(const struct pm_cases *c)
{
    tcase_add_test(c->pool, lease_records_survive_reopen);
    tcase_add_test(c->pool, lessee_garbage_refused);
    tcase_add_test(c->pool, lease_end_drops_uncommitted);
    tcase_add_test(c->pool, lease_starts_past_header);
    tcase_add_test(c->pool, clean_skips_active_lease);
    tcase_add_test(c->pool, lease_keeps_reserves);
    tcase_add_test(c->pool, scribbled_lease_is_cut);
    tcase_add_test(c->pool, reused_lease_segment_is_ordinary);
}
