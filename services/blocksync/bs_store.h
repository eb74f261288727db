/* The chain store: one chain's blocks in one file mapped with libpmem.
 *
 * Why not the KV pool (services/pm): a chain is written in one order only,
 * by height, is never cleaned, and is read by height and in ranges. The
 * pool's per-segment commit words and its recovery by scanning every
 * record buy nothing here; one word and a fixed index do it all.
 *
 *   0       file header (4 KiB): magic, layout, chain id, sizes, uuid,
 *           checksum; then, each in its own cache line, two words:
 *           `committed` (blocks 0..committed-1 are the chain) and
 *           `irreversible` (blocks below it never change)
 *   idx     idx_cap entries of 64 bytes, one per height: the record's
 *           offset and length, the block's id, its height and the
 *           entry's own checksum
 *   data    the log: records back to back, each a 32-byte record header
 *           (magic "TBR1", block length, height, XXH3 of the block) and
 *           the block's bytes (bs_block.h), padded to 64 bytes
 *
 * Commit: appended records and their index entries are made durable
 * first, then the `committed` word by one persisted 8-byte store. Recovery
 * reads the word and believes nothing past it: a crash mid-append leaves
 * bytes nobody reads, and no repair tool is ever needed. Every index entry
 * below the word is checked at open (its sum, its height, its offset
 * following the one before), and every record read is checked against its
 * entry and its XXH3; what fails is TERN_ECORRUPT with the height.
 *
 * A range of heights is one contiguous span of the log: honest stores of
 * the same chain hold it byte for byte alike (the record header is a
 * function of the block), so a peer serves a range as one span, and a
 * receiver knows each range's size from the headers alone.
 *
 * Blocks at or above `irreversible` may be cut off (bs_store_truncate) to
 * make way for a longer fork; those below never change.
 *
 * The store checks that each block it takes follows the last one (height
 * and parent id); ids and Merkle roots are the caller's to check
 * (bs_block_check), since the syncer checks them off its receive loop.
 *
 * Threads: one thread owns a store and makes every call. */
#ifndef TERN_BS_STORE_H
#define TERN_BS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bs_block.h"

#define BS_REC_HDR 32u
#define BS_REC_ALIGN 64u

/* The bytes a block of `len` bytes takes in the log (and in a span). */
static inline uint64_t bs_rec_size(uint64_t len)
{
    return (BS_REC_HDR + len + BS_REC_ALIGN - 1) & ~(uint64_t)(BS_REC_ALIGN - 1);
}

struct bs_store_opts {
    uint64_t size;          /* create: file bytes; 0 = 1 GiB (a sparse file) */
    uint64_t max_blocks;    /* create: index entries; 0 = one per 2 KiB of file */
    uint64_t chain;         /* create: the chain id; open: 0 = any, else must match */
    bool create;            /* create the file if it does not exist */
    bool read_only;         /* map it read-only under a shared lock: several
                             * readers (servers of one chain) at once, no
                             * writer; every write is TERN_EACCES */
};

struct bs_store_info {
    uint64_t chain;
    uint64_t committed;     /* blocks in the chain (heights 0..committed-1) */
    uint64_t irreversible;  /* blocks that never change */
    uint64_t pending;       /* appended, not yet committed */
    uint64_t idx_cap;       /* most blocks the file can hold */
    uint64_t data_used, data_cap;  /* log bytes, committed and in all */
    uint64_t size;
    bool is_pmem;
};

struct bs_store;

/* Open (or create) the chain file at `path`, locked against a second
 * opener (TERN_EBUSY; read-only openers share it among themselves). TERN_ECORRUPT with a log line saying what and where
 * for a file that is not a chain or fails its checks; TERN_EINVAL for
 * another chain id than o->chain. */
int bs_store_open(const char *path, const struct bs_store_opts *o, struct bs_store **out);

/* Close: what was appended and not committed is lost. */
void bs_store_close(struct bs_store *st);

void bs_store_info(const struct bs_store *st, struct bs_store_info *info);

/* Blocks committed / appended in all (committed + pending): the next
 * block appended has height bs_store_top(). */
uint64_t bs_store_committed(const struct bs_store *st);
uint64_t bs_store_top(const struct bs_store *st);
uint64_t bs_store_irreversible(const struct bs_store *st);
uint64_t bs_store_chain(const struct bs_store *st);

/* The id of the block at `height` (committed or pending): 0 or
 * TERN_ENOENT. */
int bs_store_id(const struct bs_store *st, uint64_t height, uint8_t id[BS_ID_LEN]);

/* The height of the block with this id, committed or pending, or
 * TERN_ENOENT. */
int64_t bs_store_find(const struct bs_store *st, const uint8_t id[BS_ID_LEN]);

/* The block at `height`, in place in the mapping (valid until it is cut
 * off or the store closes), checked against its index entry and its XXH3:
 * 0, TERN_ENOENT, or TERN_ECORRUPT (logged). */
int bs_store_block(const struct bs_store *st, uint64_t height, const uint8_t **block,
                   size_t *len);

/* The log span of heights [from, to): *span in place, *len bytes (a
 * multiple of 64). Records are not checked here (a reader of a span
 * checks every block it takes). TERN_ENOENT past the top. */
int bs_store_span(const struct bs_store *st, uint64_t from, uint64_t to, const uint8_t **span,
                  size_t *len);

/* The log bytes heights [from, to) take: what bs_store_span gives. */
int bs_store_span_len(const struct bs_store *st, uint64_t from, uint64_t to, uint64_t *len);

/* Append a block (its bytes, parsed and checked by the caller, and its
 * id): copied into the log, not durable until bs_store_commit. Its height
 * must be bs_store_top() and its parent the block below (TERN_EINVAL);
 * TERN_ENOSPC when the log or the index is full; TERN_EPROTO if the bytes
 * do not parse. */
int bs_store_append(struct bs_store *st, const uint8_t *block, size_t len,
                    const uint8_t id[BS_ID_LEN]);

/* Make every appended block durable, then move the committed word over
 * them. TERN_EIO if a flush failed (the store takes no more writes). */
int bs_store_commit(struct bs_store *st);

/* Drop every block from height `count` up (committed or pending): the
 * committed word moves down first, persisted. TERN_ERANGE below the
 * irreversible height. */
int bs_store_truncate(struct bs_store *st, uint64_t count);

/* Blocks below `count` become irreversible (persisted); the word only
 * rises, and not past the committed blocks (TERN_EINVAL). */
int bs_store_set_irreversible(struct bs_store *st, uint64_t count);

/* Fault the whole committed log into this process's page tables now
 * (a server about to serve it): the first read of each page otherwise
 * traps while a peer waits. Best effort. */
void bs_store_prefault(struct bs_store *st);

/* The mapping (for registering it as the source of one-sided puts). */
const void *bs_store_base(const struct bs_store *st);
size_t bs_store_map_len(const struct bs_store *st);

/* Check a span (as bs_store_span gives) holding heights [from, to):
 * records framed right, one per height in order, each a block that
 * parses. Points blocks[i]/lens[i] at each (n = to - from). 0, or
 * TERN_EPROTO with *why and the height in *bad. Reads no checksum and
 * hashes nothing: bs_block_check does the hashing. */
int bs_span_walk(const uint8_t *span, size_t len, uint64_t from, uint64_t to,
                 const uint8_t **blocks, uint32_t *lens, uint64_t *bad, const char **why);

/* Re-read every committed block: record sums, then the chain (ids,
 * parents, Merkle roots) with `hs`. 0, TERN_ECORRUPT with *bad (the
 * first bad height) and *why, or a hashing error. */
int bs_store_verify(const struct bs_store *st, struct bs_hasher *hs, uint64_t *bad,
                    const char **why);

#endif
