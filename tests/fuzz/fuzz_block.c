/* libFuzzer target: blocks of the block-sync service as they come from a
 * peer (services/blocksync/bs_block.c). The input is the block's bytes:
 * parse it, and if it parses, walk its transactions, hash its Merkle root
 * and check it as the first block of a chain. Nothing may read past the
 * input, and a block that parses must walk exactly as its header says. */
#include "bs_block.h"
#include "fuzz.h"

static struct bs_hasher *hs;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    hs = bs_hasher_new();
    FZ_CHECK(hs, "no hasher");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bs_block b;
    const char *why = NULL;
    uint8_t id[BS_ID_LEN];
    const uint8_t *tx;
    uint32_t len, n = 0;
    size_t at = 0, bytes = 0;
    int rc;

    if (bs_block_parse(data, size, &b, &why) < 0) {
        FZ_CHECK(why, "refused without a reason");
        return 0;
    }
    while (bs_tx_next(&b, &at, &tx, &len)) {
        FZ_CHECK(tx >= b.body && tx + len <= b.body + b.h.body_len, "transaction out of the body");
        bytes += 4 + (size_t)len;
        n++;
    }
    FZ_CHECK(n == b.h.n_tx && bytes == b.h.body_len, "walk disagrees with the header");
    rc = bs_block_check(hs, &b, b.h.chain, NULL, 0, id);
    FZ_CHECK(rc >= 0, "hashing failed: %d", rc);
    return 0;
}
