/* Blocks of the block-sync service: their bytes, their ids and their
 * checks. No I/O and no state but a hasher's scratch: the store, the sync
 * protocol and the feed build on this.
 *
 * A block is a 112-byte header followed by its body, all little-endian:
 *
 *   0   magic "TBLK"      4   version (BS_VERSION)   8   height
 *   16  time (ns)         24  parent id (32 bytes)   56  Merkle root (32)
 *   88  n_tx              92  body bytes             96  chain id (8)
 *   104 reserved (8, zero)
 *
 *   body: n_tx transactions, each a 4-byte length and that many bytes,
 *   back to back, exactly `body bytes` in all.
 *
 * A block's id is the SHA-256 of its header's 112 bytes, so the header
 * binds the body through the Merkle root. The root is RFC 6962's: a leaf
 * is SHA-256(0x00 || tx), an inner node SHA-256(0x01 || left || right), a
 * level's odd last node goes up unpaired, and no transactions give
 * SHA-256 of nothing. The prefixes keep a leaf from passing for a node,
 * and no node is paired with itself (Bitcoin's duplicate-last rule lets
 * two bodies share a root).
 *
 * SHA-256 is OpenSSL's libcrypto, through one reused digest context per
 * hasher (about 80-170 ns a node, where the one-shot call costs about
 * 400). XXH3 stays the pool's record checksum. */
#ifndef TERN_BS_BLOCK_H
#define TERN_BS_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BS_HDR_SIZE 112u
#define BS_ID_LEN 32u
#define BS_VERSION 1u
#define BS_TX_MAX (4u << 20)         /* one transaction */
#define BS_BLOCK_MAX (32u << 20)     /* header and body */

struct bs_header {
    uint32_t version;
    uint64_t height;
    uint64_t time_ns;
    uint8_t parent[BS_ID_LEN];
    uint8_t merkle[BS_ID_LEN];
    uint32_t n_tx;
    uint32_t body_len;
    uint64_t chain;
};

/* A parsed block: its header, decoded, and its body where it lies (the
 * caller's bytes, not copied). */
struct bs_block {
    struct bs_header h;
    const uint8_t *hdr;              /* the header's BS_HDR_SIZE bytes */
    const uint8_t *body;
    size_t len;                      /* BS_HDR_SIZE + body_len */
};

/* Walk a parsed block's transactions: *at starts at 0; each call gives the
 * next one in tx/len and returns false after the last. */
bool bs_tx_next(const struct bs_block *b, size_t *at, const uint8_t **tx, uint32_t *len);

/* Header bytes to fields and back. decode checks what the header alone
 * can say (magic, version, reserved bytes, sizes against the limits):
 * 0, or TERN_EPROTO with a reason in *why. */
int bs_header_decode(const uint8_t *p, size_t n, struct bs_header *h, const char **why);
void bs_header_encode(const struct bs_header *h, uint8_t out[BS_HDR_SIZE]);

/* Parse the `n` bytes at `p` as one whole block: the header, then a body
 * of exactly body_len bytes holding exactly n_tx transactions. 0, or
 * TERN_EPROTO with *why (a lying length, a truncated or overlong body).
 * Hashes nothing: see bs_block_check. */
int bs_block_parse(const uint8_t *p, size_t n, struct bs_block *b, const char **why);

/* SHA-256 with one digest context reused for every hash, and scratch for
 * a block's Merkle leaves (grown as blocks need, kept). One per thread.
 * bs_hasher_new returns NULL without memory or without SHA-256. */
struct bs_hasher;
struct bs_hasher *bs_hasher_new(void);
void bs_hasher_free(struct bs_hasher *hs);

/* The id of a header (its encoded bytes). 0 or TERN_EIO (libcrypto
 * failed). */
int bs_header_id(struct bs_hasher *hs, const uint8_t hdr[BS_HDR_SIZE], uint8_t id[BS_ID_LEN]);

/* The Merkle root of a parsed block's transactions. 0, TERN_ENOMEM or
 * TERN_EIO. */
int bs_merkle_root(struct bs_hasher *hs, const struct bs_block *b, uint8_t root[BS_ID_LEN]);

/* What a block's check found, as a reason a peer is told. */
enum bs_verdict {
    BS_VALID = 0,
    BS_BAD_CHAIN,                    /* another chain id */
    BS_BAD_HEIGHT,                   /* not the parent's height + 1 */
    BS_BAD_PARENT,                   /* its parent id is not the parent's id */
    BS_BAD_MERKLE,                   /* its body does not give its Merkle root */
};

/* A short name for a verdict ("bad merkle root", ...). */
const char *bs_verdict_name(enum bs_verdict v);

/* Check a parsed block against the block it must follow (its id and
 * height; parent_id NULL: a genesis block, height 0, all-zero parent) and
 * the chain's id, and give its own id in `id`. Returns a verdict (>= 0)
 * or a negative TERN_* code when hashing itself failed. */
int bs_block_check(struct bs_hasher *hs, const struct bs_block *b, uint64_t chain,
                   const uint8_t *parent_id, uint64_t parent_height, uint8_t id[BS_ID_LEN]);

/* Build a block from a header (version, height, time, parent and chain
 * set; n_tx, body_len and the Merkle root are filled in here) and n
 * transactions, into out/cap. *len gets its size; its id goes to `id` if
 * not NULL. 0, TERN_E2BIG (does not fit `cap` or the limits), TERN_EINVAL,
 * TERN_ENOMEM or TERN_EIO. */
int bs_block_build(struct bs_hasher *hs, struct bs_header *h, const uint8_t *const *txs,
                   const uint32_t *tx_lens, uint32_t n, uint8_t *out, size_t cap, size_t *len,
                   uint8_t id[BS_ID_LEN]);

#endif
