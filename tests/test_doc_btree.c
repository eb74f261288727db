/* doc_store: the DRAM B+tree under every index (case doc_btree), checked
 * against a sorted array through random inserts and removals. */
#include "tern_config.h"

#if TERN_HAVE_DOC

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "doc_btree.h"

#define N_KEYS 6000

struct mkey {
    uint8_t k[12];
    size_t len;
    bool in;
    uint64_t val;
};

static struct mkey keys[N_KEYS];

static int mcmp(const void *a, const void *b)
{
    const struct mkey *x = a, *y = b;
    int c = memcmp(x->k, y->k, x->len < y->len ? x->len : y->len);

    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Keys of 1..12 bytes from a small alphabet: many share prefixes, some
 * are prefixes of others. */
static void make_keys(unsigned seed)
{
    srand(seed);
    for (unsigned i = 0; i < N_KEYS; i++) {
        keys[i].len = 1 + (size_t)rand() % 12;
        for (size_t j = 0; j < keys[i].len; j++)
            keys[i].k[j] = (uint8_t)(rand() % 4);
        keys[i].in = false;
        keys[i].val = i;
    }
    qsort(keys, N_KEYS, sizeof(keys[0]), mcmp);
    /* Drop duplicates: each model key once. */
    for (unsigned i = 1, kept = 0; i < N_KEYS; i++) {
        if (mcmp(&keys[i], &keys[kept]) == 0)
            keys[i].len = 0;
        else
            kept = i;
    }
}

static void check_order(const struct doc_bt *t)
{
    struct doc_bt_pos p;
    unsigned i = 0;
    uint64_t n = 0;
    bool more = doc_bt_seek(t, NULL, 0, false, &p);

    for (; more; more = doc_bt_next(&p), n++) {
        size_t len;
        const uint8_t *k = doc_bt_key(&p, &len);

        while (i < N_KEYS && (!keys[i].len || !keys[i].in))
            i++;
        ck_assert_uint_lt(i, N_KEYS);
        ck_assert_uint_eq(len, keys[i].len);
        ck_assert(memcmp(k, keys[i].k, len) == 0);
        ck_assert_uint_eq(doc_bt_val(&p), keys[i].val);
        i++;
    }
    ck_assert_uint_eq(n, t->count);
}

START_TEST(btree_matches_a_sorted_array)
{
    struct doc_bt t;
    uint64_t in = 0;

    make_keys(17 + (unsigned)_i);
    doc_bt_init(&t);
    for (unsigned round = 0; round < 6; round++) {
        for (unsigned j = 0; j < N_KEYS; j++) {
            unsigned i = (unsigned)rand() % N_KEYS;
            uint64_t v = 0;

            if (!keys[i].len)
                continue;
            if (round % 2 == 0 || rand() % 3) {
                int rc = doc_bt_insert(&t, keys[i].k, keys[i].len, keys[i].val, &v);

                ck_assert_int_eq(rc, keys[i].in ? 0 : 1);
                if (!keys[i].in)
                    in++;
                else
                    ck_assert_uint_eq(v, keys[i].val);
                keys[i].in = true;
            } else {
                bool was = doc_bt_remove(&t, keys[i].k, keys[i].len, &v);

                ck_assert(was == keys[i].in);
                if (was) {
                    ck_assert_uint_eq(v, keys[i].val);
                    in--;
                }
                keys[i].in = false;
            }
        }
        ck_assert_uint_eq(t.count, in);
        check_order(&t);
        /* Every model key: found iff in; seeks land on the next one in. */
        for (unsigned i = 0; i < N_KEYS; i++) {
            struct doc_bt_pos p;
            unsigned nx = i + 1, pv = i;
            uint64_t v;
            size_t len;

            if (!keys[i].len)
                continue;
            ck_assert(doc_bt_find(&t, keys[i].k, keys[i].len, &v) == keys[i].in);
            while (nx < N_KEYS && (!keys[nx].len || !keys[nx].in))
                nx++;
            if (doc_bt_seek(&t, keys[i].k, keys[i].len, true, &p)) {
                ck_assert_uint_lt(nx, N_KEYS);
                ck_assert(memcmp(doc_bt_key(&p, &len), keys[nx].k, keys[nx].len) == 0);
                ck_assert_uint_eq(len, keys[nx].len);
            } else {
                ck_assert_uint_eq(nx, N_KEYS);
            }
            while (pv > 0 && (!keys[pv - 1].len || !keys[pv - 1].in))
                pv--;
            if (doc_bt_seek_rev(&t, keys[i].k, keys[i].len, true, &p)) {
                ck_assert_uint_gt(pv, 0);
                ck_assert_uint_eq(doc_bt_val(&p), keys[pv - 1].val);
            } else {
                ck_assert_uint_eq(pv, 0);
            }
            if (keys[i].in) {
                ck_assert(doc_bt_seek_rev(&t, keys[i].k, keys[i].len, false, &p));
                ck_assert_uint_eq(doc_bt_val(&p), keys[i].val);
                ck_assert(doc_bt_seek(&t, keys[i].k, keys[i].len, false, &p));
                ck_assert_uint_eq(doc_bt_val(&p), keys[i].val);
            }
        }
    }
    /* Backward from the end visits count entries. */
    {
        struct doc_bt_pos p;
        uint64_t n = 0;

        for (bool m = doc_bt_seek_rev(&t, NULL, 0, false, &p); m; m = doc_bt_prev(&t, &p))
            n++;
        ck_assert_uint_eq(n, t.count);
    }
    doc_bt_free(&t);
}
END_TEST

void doc_btree_tcase(Suite *s);
void doc_btree_tcase(Suite *s)
{
    TCase *tc = tcase_create("doc_btree");

    tcase_add_loop_test(tc, btree_matches_a_sorted_array, 0, 3);
    suite_add_tcase(s, tc);
}

#endif
