/* A record of the persistent-memory pool as it lies in a segment: what the
 * pool (pm.h), the KV service and the KV client (which writes records into
 * leased segments and checks those it reads one-sidedly) all share. It
 * needs xxHash for the checksum and nothing of libpmem, so a client-only
 * build has it. */
#ifndef TERN_PM_RECORD_H
#define TERN_PM_RECORD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PM_KEY_MAX 1024u        /* longest key a record may hold */
#define PM_SEG_HDR 64u          /* a segment's records start this far into it
                                      * (a leased one's: a page in) */

enum pm_rec_type {
    PM_VALUE = 1,               /* key = value */
    PM_TOMBSTONE = 2,           /* key deleted (value empty) */
    PM_EXPIRING = 3,            /* key = value until a time: the value's first
                                 * PM_EXPIRY_BYTES hold it (pm_rec_expiry) */
};

/* An expiring value's deadline: milliseconds since the Unix epoch, little-
 * endian, before the value itself. Wall-clock time, so that a key's time to
 * live keeps counting down across a restart. */
#define PM_EXPIRY_BYTES 8u

/* A record as it lies in the pool, 8-byte aligned, followed by the key, the
 * value and zero padding up to the next multiple of 8. */
struct pm_rec {
    uint32_t sum;                    /* checksum of the rest of the record */
    uint32_t val_len;
    uint64_t version;
    uint16_t key_len;
    uint8_t type;                    /* enum pm_rec_type */
    uint8_t flags;                   /* enum pm_rec_flags */
    uint32_t slot;                   /* bytes the record occupies (its next_offset);
                                      * 0 = pm_rec_size() of its lengths */
};

enum pm_rec_flags {
    /* Written over an older record in place (pm_overwrite). A torn
     * record with this flag is an interrupted rewrite, never an
     * acknowledged write: recovery skips it instead of refusing the pool. */
    PM_F_REWRITTEN = 1u << 0,
};

/* A record's place: segment index << 32 | byte offset in the segment. */
typedef uint64_t pm_loc;

static inline const void *pm_rec_key(const struct pm_rec *r)
{
    return (const uint8_t *)(r + 1);
}

static inline const void *pm_rec_val(const struct pm_rec *r)
{
    return (const uint8_t *)(r + 1) + r->key_len;
}

/* Is a record of this type with a value this long well-formed? */
static inline int pm_rec_type_ok(unsigned type, uint32_t val_len)
{
    return type == PM_VALUE || (type == PM_TOMBSTONE && val_len == 0) ||
           (type == PM_EXPIRING && val_len >= PM_EXPIRY_BYTES);
}

/* Bytes a record with these lengths takes in the pool. */
static inline uint32_t pm_rec_size(uint32_t key_len, uint32_t val_len)
{
    return (uint32_t)((sizeof(struct pm_rec) + key_len + val_len + 7u) & ~7u);
}

/* The pool's checksum: the low 32 bits of XXH3-64. It replaced zlib's CRC32,
 * which cost 100 ns on a 100-byte record (XXH3: 6 ns) and was nearly half of
 * the gateway's CPU on pipelined SETs. */
uint32_t pm_sum(const void *p, size_t n);

/* The part of a record's checksum that covers its version (seeded with its
 * value length); see pm_record.c. */
uint32_t pm_rec_meta_sum(uint64_t version, uint32_t val_len);

/* Checksum of a record: everything after the sum field, the version
 * hashed apart from the rest so that it can be swapped in O(1). */
uint32_t pm_rec_sum(const struct pm_rec *r);

/* The checksum a record should carry (for lessees, which write whole
 * records themselves). */
uint32_t pm_rec_sum_of(const struct pm_rec *r);

#ifdef __cplusplus
}
#endif

#endif
