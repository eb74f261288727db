/* kv_onesided: the index window's own functions (kv_window.h), without
 * any process: buckets set, updated, cleared and found whole, a full
 * block, and records that are whole only with the right version, key,
 * bytes and size.
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "kv_onesided_fixture.h"
#include "kv_window.h"
#include "pm/pm.h"

/* ---- the window's functions, without processes ---- */

/* A hash in block `block` (of n) whose tag is built from `t`. */
static uint64_t hash_in(uint32_t block, uint32_t t)
{
    return (uint64_t)(t * 2 + 2) << 20 | block;
}

/* Look the hash up in the window as a reader does: copy its block, find a
 * whole bucket with its tag. */
static bool window_find(const struct kv_window *w, uint64_t h, struct kvw_bucket *out)
{
    struct kvw_block blk;

    memcpy(&blk, (const uint8_t *)w->hdr + kvw_block_off(kvw_block_of(h, w->n_blocks)),
           sizeof(blk));
    for (unsigned i = 0; i < KVW_BUCKETS; i++)
        if (kvw_bucket_whole(&blk.b[i]) && blk.b[i].tag == kvw_tag(h)) {
            *out = blk.b[i];
            return true;
        }
    return false;
}

START_TEST(window_unit)
{
    enum { NB = 4 };
    static const uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    struct kv_window w, off = {0};
    struct kvw_bucket b, t;
    uint32_t slot = 0, slots[KVW_BUCKETS + 1] = {0}, s0;
    uint64_t h = hash_in(2, 1);
    void *mem = calloc(1, kvw_bytes(NB));

    ck_assert_ptr_nonnull(mem);
    ck_assert_uint_eq(kvw_bytes(NB), sizeof(struct kvw_hdr) + NB * 256);
    kv_window_init(&w, mem, NB, uuid);
    ck_assert_uint_eq(w.hdr->magic, KVW_MAGIC);
    ck_assert_uint_eq(w.hdr->n_blocks, NB);
    ck_assert(memcmp(w.hdr->pool_uuid, uuid, 16) == 0);
    ck_assert(!window_find(&w, h, &b));

    /* A set bucket is found whole, with what was set, in its block. */
    kv_window_set(&w, &slot, h, 3ull << 32 | 128, 77, 64);
    ck_assert_uint_ne(slot, 0);
    ck_assert_uint_eq((slot - 1) / KVW_BUCKETS, 2);
    ck_assert_uint_eq(w.mirrored, 1);
    ck_assert(window_find(&w, h, &b));
    ck_assert_uint_eq(b.tag, kvw_tag(h));
    ck_assert_uint_ne(b.tag, 0);
    ck_assert_uint_eq(b.loc, 3ull << 32 | 128);
    ck_assert_uint_eq(b.version, 77);
    ck_assert_uint_eq(b.size, 64);
    ck_assert_uint_eq(b.seq & 1, 0);
    ck_assert_uint_ne(b.seq, 0);
    /* Updated in its bucket, under a new even sequence. */
    s0 = slot;
    kv_window_set(&w, &slot, h, 4ull << 32 | 256, 78, 72);
    ck_assert_uint_eq(slot, s0);
    ck_assert_uint_eq(w.mirrored, 1);
    ck_assert(window_find(&w, h, &t));
    ck_assert_uint_eq(t.version, 78);
    ck_assert_uint_eq(t.loc, 4ull << 32 | 256);
    ck_assert_uint_eq(t.size, 72);
    ck_assert_uint_eq(t.seq, b.seq + 2);
    b = t;

    /* Odd sequence (with a checksum that fits it) or any flipped bit: not
     * whole. */
    t = b;
    t.seq++;
    t.sum = kvw_bucket_sum(&t);
    ck_assert(!kvw_bucket_whole(&t));
    for (size_t i = 0; i < sizeof(b) * 8; i++) {
        t = b;
        ((uint8_t *)&t)[i / 8] ^= (uint8_t)(1u << (i % 8));
        CHECK(!kvw_bucket_whole(&t), "bit %zu flipped: still whole", i);
    }
    ck_assert(kvw_bucket_whole(&b));

    /* A full block: 8 keys placed in 8 buckets, the 9th left out. */
    for (unsigned i = 0; i <= KVW_BUCKETS; i++)
        kv_window_set(&w, &slots[i], hash_in(1, 10 + i), (uint64_t)i << 32 | 64, 100 + i, 40);
    for (unsigned i = 0; i < KVW_BUCKETS; i++) {
        ck_assert_uint_eq((slots[i] - 1) / KVW_BUCKETS, 1);
        for (unsigned j = 0; j < i; j++)
            ck_assert_uint_ne(slots[i], slots[j]);
        ck_assert(window_find(&w, hash_in(1, 10 + i), &t));
        ck_assert_uint_eq(t.version, 100 + i);
    }
    ck_assert_uint_eq(slots[KVW_BUCKETS], 0);
    ck_assert_uint_eq(w.unplaced, 1);
    ck_assert_uint_eq(w.mirrored, 1 + KVW_BUCKETS);
    ck_assert(!window_find(&w, hash_in(1, 10 + KVW_BUCKETS), &t));
    /* The other blocks are untouched by it. */
    ck_assert(window_find(&w, h, &t));
    ck_assert_uint_eq(t.version, 78);

    /* Cleared: gone, its bucket whole and empty, and free for another key. */
    s0 = slots[3];
    kv_window_clear(&w, &slots[3]);
    ck_assert_uint_eq(slots[3], 0);
    ck_assert_uint_eq(w.mirrored, KVW_BUCKETS);
    ck_assert(!window_find(&w, hash_in(1, 13), &t));
    t = w.bk[s0 - 1];
    ck_assert(kvw_bucket_whole(&t));
    ck_assert_uint_eq(t.tag, 0);
    kv_window_clear(&w, &slots[3]);     /* not in the window: nothing */
    ck_assert_uint_eq(w.mirrored, KVW_BUCKETS);
    kv_window_set(&w, &slots[KVW_BUCKETS], hash_in(1, 10 + KVW_BUCKETS), 9ull << 32 | 64, 200,
                  40);
    ck_assert_uint_eq(slots[KVW_BUCKETS], s0);
    ck_assert(window_find(&w, hash_in(1, 10 + KVW_BUCKETS), &t));
    ck_assert_uint_eq(t.version, 200);
    /* A detached window takes nothing. */
    slot = 0;
    kv_window_set(&off, &slot, h, 1, 1, 40);
    ck_assert_uint_eq(slot, 0);
    free(mem);

    /* Records: whole only with the right version, key, bytes and size. */
    {
        static uint8_t rec[512];
        struct pm_rec *r = (void *)rec;
        uint8_t val[100];
        uint32_t size = pm_rec_size(7, sizeof(val));

        test_pattern(val, sizeof(val), 5);
        put_record(rec, "rec-key", 7, val, sizeof(val), 55, PM_VALUE);
        ck_assert(kvw_record_valid(rec, size, "rec-key", 7, 55));
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 56));
        ck_assert(!kvw_record_valid(rec, size, "rec-kex", 7, 55));
        ck_assert(!kvw_record_valid(rec, size, "rec-ke", 6, 55));
        ck_assert(!kvw_record_valid(rec, size + 8, "rec-key", 7, 55));
        ck_assert(!kvw_record_valid(rec, size - 8, "rec-key", 7, 55));
        ck_assert(!kvw_record_valid(rec, 8, "rec-key", 7, 55));
        rec[sizeof(*r) + 7 + 50] ^= 0x10;
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 55));
        rec[sizeof(*r) + 7 + 50] ^= 0x10;
        ck_assert(kvw_record_valid(rec, size, "rec-key", 7, 55));
        r->version = 56;        /* rewritten in place, sum and all */
        r->sum = pm_rec_sum_of(r);
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 55));
        ck_assert(kvw_record_valid(rec, size, "rec-key", 7, 56));
        r->type = PM_TOMBSTONE;
        r->sum = pm_rec_sum_of(r);
        ck_assert(!kvw_record_valid(rec, size, "rec-key", 7, 56));
    }
}
END_TEST

void kv_os_add_window(const struct kv_os_cases *c)
{
    tcase_add_test(c->os, window_unit);
}

#endif /* TERN_HAVE_SERVICES */
