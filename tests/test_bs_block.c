/* bs_block: blocks of the block-sync service (services/blocksync). The
 * expected ids and Merkle roots were computed apart from this code, with
 * Python's hashlib over the layout bs_block.h describes. */
#include "tern_config.h"

#if TERN_HAVE_BLOCKSYNC

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bs_block.h"
#include "error.h"
#include "suites.h"

static struct bs_hasher *hs;

static void setup(void)
{
    hs = bs_hasher_new();
    ck_assert_ptr_nonnull(hs);
}

static void teardown(void)
{
    bs_hasher_free(hs);
}

/* Transaction i: 3i bytes, byte j = 7i + j. */
static uint8_t txbuf[8][32];
static const uint8_t *txp[8];
static uint32_t txl[8];

static void make_txs(void)
{
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 3 * i; j++)
            txbuf[i][j] = (uint8_t)(i * 7 + j);
        txp[i] = txbuf[i];
        txl[i] = (uint32_t)(3 * i);
    }
}

static void hex(const uint8_t *b, char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static size_t build(uint32_t n, uint64_t height, const uint8_t *parent, uint8_t *out,
                    size_t cap, uint8_t id[32])
{
    struct bs_header h = {.height = height, .time_ns = 123456789,
                          .chain = 0x1122334455667788ull};
    size_t len;

    if (parent)
        memcpy(h.parent, parent, 32);
    make_txs();
    ck_assert_int_eq(bs_block_build(hs, &h, txp, txl, n, out, cap, &len, id), 0);
    return len;
}

START_TEST(merkle_roots_known)
{
    static const char *want[] = {
        [0] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        [1] = "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        [2] = "9759b88de347bbeccc0e5e2a38f3ce9b95a9c3fc84c98b3b8791f0fbbdfd38f7",
        [3] = "ed2958d3afe7935a851eb08a867b76466344b0963a4ddf30befdfb802ae28e03",
        [5] = "c2de447a94114b390b35c48ff484a0203c63be7da74c7f0bbc806f399ef4d007",
    };
    static const uint32_t ns[] = {0, 1, 2, 3, 5};
    uint8_t buf[1024], id[32], root[32];
    struct bs_block b;
    const char *why;
    char got[65];

    for (unsigned k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        size_t len = build(ns[k], 0, NULL, buf, sizeof(buf), id);

        ck_assert_int_eq(bs_block_parse(buf, len, &b, &why), 0);
        ck_assert_int_eq(bs_merkle_root(hs, &b, root), 0);
        hex(root, got);
        ck_assert_msg(strcmp(got, want[ns[k]]) == 0, "%u transactions: root %s", ns[k], got);
        hex(b.h.merkle, got);
        ck_assert_str_eq(got, want[ns[k]]);
    }
}
END_TEST

START_TEST(id_and_layout_known)
{
    uint8_t parent[32], buf[1024], id[32];
    struct bs_header h;
    const char *why;
    char got[65];
    size_t len;

    for (int i = 0; i < 32; i++)
        parent[i] = (uint8_t)i;
    len = build(3, 7, parent, buf, sizeof(buf), id);
    ck_assert_uint_eq(len, BS_HDR_SIZE + 21);
    hex(id, got);
    ck_assert_str_eq(got, "78f9aa2fcf681746bccfe61e2d359313099033fb8dd9c038a990f261ef0bcef6");
    ck_assert_int_eq(bs_header_decode(buf, len, &h, &why), 0);
    ck_assert_uint_eq(h.height, 7);
    ck_assert_uint_eq(h.time_ns, 123456789);
    ck_assert_uint_eq(h.n_tx, 3);
    ck_assert_uint_eq(h.body_len, 21);
    ck_assert_uint_eq(h.chain, 0x1122334455667788ull);
    ck_assert_mem_eq(h.parent, parent, 32);
}
END_TEST

/* Every length is checked before it is believed. */
START_TEST(parse_refuses_lies)
{
    uint8_t buf[1024], bad[1024], id[32];
    struct bs_block b;
    const char *why = NULL;
    size_t len = build(5, 0, NULL, buf, sizeof(buf), id);
    uint32_t v;

    ck_assert_int_eq(bs_block_parse(buf, len, &b, &why), 0);
    /* Truncated anywhere, or with a byte too many. */
    for (size_t n = 0; n < len; n++)
        ck_assert_msg(bs_block_parse(buf, n, &b, &why) == TERN_EPROTO, "%zu bytes taken", n);
    memcpy(bad, buf, len);
    bad[len] = 0;
    ck_assert_int_eq(bs_block_parse(bad, len + 1, &b, &why), TERN_EPROTO);
    ck_assert_str_eq(why, "bytes past the block's body");
    /* A transaction's length that runs past the body. */
    memcpy(bad, buf, len);
    v = 1000;
    memcpy(bad + BS_HDR_SIZE, &v, 4);
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    ck_assert_str_eq(why, "transaction runs past the block's body");
    /* n_tx one off either way. */
    memcpy(bad, buf, len);
    bad[88] = 4;
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    ck_assert_str_eq(why, "more transactions than the header says");
    bad[88] = 6;
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    ck_assert_str_eq(why, "fewer transactions than the header says");
    /* More transactions than bytes could hold, a huge body, magic,
     * version, reserved bytes. */
    memcpy(bad, buf, len);
    v = 0xffffffffu;
    memcpy(bad + 88, &v, 4);
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    memcpy(bad, buf, len);
    memcpy(bad + 92, &v, 4);
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    ck_assert_str_eq(why, "block body over the size limit");
    memcpy(bad, buf, len);
    bad[0] = 'X';
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    memcpy(bad, buf, len);
    bad[4] = 2;
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    memcpy(bad, buf, len);
    bad[110] = 1;
    ck_assert_int_eq(bs_block_parse(bad, len, &b, &why), TERN_EPROTO);
    ck_assert_str_eq(why, "block header: reserved bytes not zero");
}
END_TEST

/* A chain of three: each checks against its parent; a wrong parent, a
 * wrong height, another chain and a changed transaction are each named. */
START_TEST(check_links_and_roots)
{
    uint8_t g[512], b1[512], b2[512], bad[512], id0[32], id1[32], id2[32], got[32];
    size_t lg = build(2, 0, NULL, g, sizeof(g), id0);
    size_t l1 = build(3, 1, id0, b1, sizeof(b1), id1);
    size_t l2 = build(5, 2, id1, b2, sizeof(b2), id2);
    const uint64_t chain = 0x1122334455667788ull;
    struct bs_block b;
    const char *why;

    ck_assert_int_eq(bs_block_parse(g, lg, &b, &why), 0);
    ck_assert_int_eq(bs_block_check(hs, &b, chain, NULL, 0, got), BS_VALID);
    ck_assert_mem_eq(got, id0, 32);
    ck_assert_int_eq(bs_block_parse(b1, l1, &b, &why), 0);
    ck_assert_int_eq(bs_block_check(hs, &b, chain, id0, 0, got), BS_VALID);
    ck_assert_mem_eq(got, id1, 32);
    ck_assert_int_eq(bs_block_check(hs, &b, chain ^ 1, id0, 0, got), BS_BAD_CHAIN);
    ck_assert_int_eq(bs_block_check(hs, &b, chain, id0, 1, got), BS_BAD_HEIGHT);
    ck_assert_int_eq(bs_block_check(hs, &b, chain, NULL, 0, got), BS_BAD_HEIGHT);
    ck_assert_int_eq(bs_block_parse(b2, l2, &b, &why), 0);
    ck_assert_int_eq(bs_block_check(hs, &b, chain, id0, 1, got), BS_BAD_PARENT);
    ck_assert_int_eq(bs_block_check(hs, &b, chain, id1, 1, got), BS_VALID);
    /* One byte of the last transaction changed: the root no longer holds. */
    memcpy(bad, b2, l2);
    bad[l2 - 1] ^= 1;
    ck_assert_int_eq(bs_block_parse(bad, l2, &b, &why), 0);
    ck_assert_int_eq(bs_block_check(hs, &b, chain, id1, 1, got), BS_BAD_MERKLE);
    ck_assert_str_eq(bs_verdict_name(BS_BAD_MERKLE), "bad merkle root");
}
END_TEST

START_TEST(build_refuses)
{
    struct bs_header h = {0};
    uint8_t out[200];
    size_t len;

    make_txs();
    ck_assert_int_eq(bs_block_build(hs, &h, txp, txl, 8, out, 100, &len, NULL), TERN_E2BIG);
    ck_assert_int_eq(bs_block_build(hs, &h, NULL, txl, 2, out, sizeof(out), &len, NULL),
                     TERN_EINVAL);
    ck_assert_int_eq(bs_block_build(hs, &h, NULL, NULL, 0, out, sizeof(out), &len, NULL), 0);
    ck_assert_uint_eq(len, BS_HDR_SIZE);
}
END_TEST

Suite *suite_bs_block(void)
{
    Suite *s = suite_create("bs_block");
    TCase *tc = tcase_create("bs_block");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, merkle_roots_known);
    tcase_add_test(tc, id_and_layout_known);
    tcase_add_test(tc, parse_refuses_lies);
    tcase_add_test(tc, check_links_and_roots);
    tcase_add_test(tc, build_refuses);
    suite_add_tcase(s, tc);
    return s;
}

#endif
