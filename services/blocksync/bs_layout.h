/* The chain file's layout (bs_store.h describes it), for the store and
 * for the tools and tests that read or forge files. Little-endian. */
#ifndef TERN_BS_LAYOUT_H
#define TERN_BS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "bs_block.h"
#include "bs_store.h"

#define BS_MAGIC "TERNCHN1"
#define BS_LAYOUT 1u
#define BS_HDR_BYTES 4096u
#define BS_REC_MAGIC 0x31524254u     /* "TBR1" */

struct bs_file_hdr {
    char magic[8];
    uint32_t layout;
    uint32_t hdr_size;
    uint64_t chain;
    uint64_t size;
    uint64_t idx_off, idx_cap;
    uint64_t data_off, data_cap;
    uint8_t uuid[16];
    uint64_t created;
    uint64_t sum;                    /* XXH3 of everything above */
    uint8_t pad0[256 - 96];
    uint64_t committed;              /* the commit point (offset 256) */
    uint8_t pad1[56];
    uint64_t irreversible;           /* offset 320 */
    uint8_t pad2[56];
};
_Static_assert(sizeof(struct bs_file_hdr) == 384, "file header");

struct bs_entry {
    uint64_t off;                    /* record offset in the log */
    uint32_t len;                    /* block bytes */
    uint32_t pad;
    uint8_t id[BS_ID_LEN];
    uint64_t height;
    uint64_t sum;                    /* XXH3 of the 56 bytes above */
};
_Static_assert(sizeof(struct bs_entry) == 64, "index entry");

struct bs_rec_hdr {
    uint32_t magic;
    uint32_t len;
    uint64_t height;
    uint64_t sum;                    /* XXH3 of the block's bytes */
    uint64_t zero;
};
_Static_assert(sizeof(struct bs_rec_hdr) == BS_REC_HDR, "record header");

static inline uint64_t bs_entry_sum(const struct bs_entry *e)
{
    return XXH3_64bits(e, offsetof(struct bs_entry, sum));
}

static inline uint64_t bs_hdr_sum(const struct bs_file_hdr *h)
{
    return XXH3_64bits(h, offsetof(struct bs_file_hdr, sum));
}

#endif
