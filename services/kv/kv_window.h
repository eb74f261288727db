/* The index window: the server's key index mirrored into memory that clients
 * read one-sidedly (Chequer's design), so a GET needs no server CPU.
 *
 * The window is an array of blocks of KVW_BUCKETS fixed-size buckets. A key
 * lives in the block its hash picks, in any bucket of it (linear probing
 * inside the block), so one read of a block is one read of the key's whole
 * probe window. A key that finds its block full is simply not mirrored: a
 * client that does not find a key in its block asks the server by RPC, which
 * answers for certain. Deleted keys are not mirrored either.
 *
 * The server is the only writer (one thread). A bucket changes under a
 * sequence word, odd while it is written, and carries a checksum over its
 * final contents: a client that read a torn bucket sees an odd sequence or a
 * checksum mismatch and reads again. The record the bucket points at is then
 * validated by its own checksum, key and version: a record moved, rewritten
 * or freed since the bucket was read shows as a mismatch, never as data.
 *
 * Little-endian, fixed sizes: this is a wire format between processes.
 */
#ifndef TERN_KV_WINDOW_H
#define TERN_KV_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "pm/pm_record.h"

#define KVW_BUCKETS 8u                   /* buckets per block: 256 bytes, one read */
#define KVW_MAGIC 0x5749564bu            /* "KVIW" */

struct kvw_bucket {
    uint32_t seq;                        /* odd while the server writes it */
    uint32_t tag;                        /* kvw_tag() of the key's hash; 0 = empty */
    uint64_t loc;                        /* pm_loc of the key's newest record */
    uint64_t version;                    /* that record's version */
    uint32_t size;                       /* that record's bytes (header, key, value) */
    uint32_t sum;                        /* kvw_bucket_sum() of the above */
};

struct kvw_block {
    struct kvw_bucket b[KVW_BUCKETS];
};

/* The window's first block-sized header. */
struct kvw_hdr {
    uint32_t magic;                      /* KVW_MAGIC */
    uint32_t n_blocks;                   /* a power of two */
    uint8_t pool_uuid[16];
    uint8_t reserved[232];
};

_Static_assert(sizeof(struct kvw_bucket) == 32, "bucket layout");
_Static_assert(sizeof(struct kvw_block) == 256, "block layout");
_Static_assert(sizeof(struct kvw_hdr) == sizeof(struct kvw_block), "header is one block");

/* Which block a hash lives in, and its tag there (never 0). */
static inline uint32_t kvw_block_of(uint64_t hash, uint32_t n_blocks)
{
    return (uint32_t)hash & (n_blocks - 1);
}

static inline uint32_t kvw_tag(uint64_t hash)
{
    return (uint32_t)(hash >> 20) | 1u;
}

/* Byte offset of block `i` in the window. */
static inline uint64_t kvw_block_off(uint32_t i)
{
    return sizeof(struct kvw_hdr) + (uint64_t)i * sizeof(struct kvw_block);
}

/* Checksum of a bucket's contents (everything but `sum`). */
uint32_t kvw_bucket_sum(const struct kvw_bucket *b);

/* Reader: is this copy of a bucket whole (even sequence, checksum right)? */
static inline bool kvw_bucket_whole(const struct kvw_bucket *b)
{
    return !(b->seq & 1u) && b->sum == kvw_bucket_sum(b);
}

/* Reader: does the copy of a record (`size` bytes at `rec`) hold `key` at
 * `version`, whole? Checks bounds, key, version and the record checksum. */
bool kvw_record_valid(const void *rec, uint32_t size, const void *key, uint16_t klen,
                      uint64_t version);

/* ---- the server's side ---- */

struct kv_window {
    struct kvw_hdr *hdr;                 /* the registered memory */
    struct kvw_bucket *bk;               /* every block's buckets, back to back */
    uint32_t n_blocks;
    uint64_t mirrored, unplaced;         /* keys in the window / left out (full block) */
};

/* Bytes of window for n_blocks blocks. */
static inline uint64_t kvw_bytes(uint32_t n_blocks)
{
    return sizeof(struct kvw_hdr) + (uint64_t)n_blocks * sizeof(struct kvw_block);
}

/* Lay out a window over `mem` (kvw_bytes(n_blocks), zeroed). */
void kv_window_init(struct kv_window *w, void *mem, uint32_t n_blocks, const uint8_t uuid[16]);

/* Point key `hash`'s bucket at a record; *slot is the bucket the key holds
 * (0 = none yet, else index + 1), updated. A key whose block is full stays
 * out (*slot 0). */
void kv_window_set(struct kv_window *w, uint32_t *slot, uint64_t hash, pm_loc loc,
                   uint64_t version, uint32_t size);

/* Take the key out of the window (deleted, or no longer indexed). */
void kv_window_clear(struct kv_window *w, uint32_t *slot);

#endif
