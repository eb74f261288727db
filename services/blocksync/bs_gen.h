/* Synthetic chains for tests, demos and benchmarks: real blocks (real ids,
 * parent links and Merkle roots, so checking them costs what it would),
 * random transactions from a seeded generator, so that one seed always
 * gives the same chain.
 *
 * Two shapes, after the chains the design is measured against
 * (docs/BLOCKSYNC.md):
 *   EOS-like: 15 to 35 transactions a block, 120 to 220 bytes each
 *             (about 25 of about 170 B: about 4.4 KB a block);
 *   Bitcoin-like: 2,000 to 3,500 transactions, 160 to 800 bytes each
 *             (1.0 to 1.7 MB a block).
 * Block times advance by 0.5 s (EOS-like) or 600 s (Bitcoin-like). */
#ifndef TERN_BS_GEN_H
#define TERN_BS_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "bs_block.h"

enum bs_shape { BS_SHAPE_EOS, BS_SHAPE_BTC };

/* "eos" / "btc" (also "bitcoin") to a shape: 0 or TERN_EINVAL. */
int bs_shape_parse(const char *s, enum bs_shape *out);
const char *bs_shape_name(enum bs_shape s);

/* The most bytes one block of the shape takes. */
size_t bs_gen_block_max(enum bs_shape s);

struct bs_gen {
    enum bs_shape shape;
    uint64_t chain;
    uint64_t rng;
    uint64_t height;                 /* of the next block */
    uint8_t parent[BS_ID_LEN];       /* id of the last block made */
};

/* A generator for `chain` from `seed`, making block 0 (genesis) first. */
void bs_gen_init(struct bs_gen *g, enum bs_shape shape, uint64_t chain, uint64_t seed);

/* Go on from a block already made (say the top of a store): the next
 * block has height `height` and parent `parent`. */
void bs_gen_resume(struct bs_gen *g, uint64_t height, const uint8_t parent[BS_ID_LEN]);

/* Make the next block into out/cap (bs_gen_block_max bytes are always
 * enough): *len its size, id its id. 0, TERN_E2BIG, or a hashing error. */
int bs_gen_next(struct bs_gen *g, struct bs_hasher *hs, uint8_t *out, size_t cap, size_t *len,
                uint8_t id[BS_ID_LEN]);

struct bs_store;

/* Extend a store with generated blocks, from its top on (a generator made
 * with bs_gen_init, resumed here from the store's top) until it holds
 * `blocks` blocks or its log `bytes` bytes, whichever comes first (0: no
 * limit of that kind), committing every `commit_bytes` (0: 64 MiB) and at
 * the end, then setting the irreversible height `reversible` blocks below
 * the top. progress(arg, blocks, bytes), if set, runs after each commit.
 * 0, or the store's or the hasher's error. */
int bs_gen_fill(struct bs_gen *g, struct bs_hasher *hs, struct bs_store *st, uint64_t blocks,
                uint64_t bytes, uint64_t reversible, uint64_t commit_bytes,
                void (*progress)(void *arg, uint64_t blocks, uint64_t bytes), void *arg);

#endif
