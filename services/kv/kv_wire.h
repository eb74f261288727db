/* The KV service's messages (inside tern RPC payloads). Little-endian, fixed
 * sizes, no pointers; every length is checked against the payload before
 * use. */
#ifndef TERN_KV_WIRE_H
#define TERN_KV_WIRE_H

#include <stdint.h>

#include "pm/pm_record.h"
#include "transport.h"

/* The longest key: a pool record's. */
#define KV_KEY_MAX PM_KEY_MAX

enum kv_method {
    KV_M_GET = 1,    /* kv_key, key            -> kv_val, value */
    KV_M_PUT = 2,    /* kv_key, key, value     -> kv_val (version; durable) */
    KV_M_DEL = 3,    /* kv_key, key            -> kv_val (version) */
    KV_M_MGET = 4,   /* kv_mget, n x (u16 klen, key) -> kv_mget_rep, n_done x kv_item */
    KV_M_SCAN = 5,   /* kv_scan                -> kv_scan_rep, n x kv_item with keys */
    KV_M_INFO = 6,   /* empty                  -> kv_info */
    /* One-sided paths (kv_client.c's onesided.c part; see kv.h) */
    KV_M_ONESIDED_INFO = 7,  /* empty                -> kv_onesided_info (keys for this fabric) */
    KV_M_LEASE = 8,    /* kv_lease_req         -> kv_lease */
    KV_M_LPUT = 9,     /* kv_lput              -> kv_val (version; durable) */
    KV_M_PGET = 10,    /* kv_pget, key         -> kv_pget_rep [, value] */
    /* A replicated shard's other replicas, as the shard's map names them:
     * "host:port" strings, each NUL-terminated (none for a store alone). */
    KV_M_MEMBERS = 11, /* empty                -> n x "host:port\0" */
    /* Deadlines (Unix ms, little-endian u64; 0 = none); see kv_key_flags'
     * KV_F_DEADLINE for a PUT with one. */
    KV_M_EXPIRY = 12,  /* kv_key, key          -> kv_val, u64 deadline */
    KV_M_EXPIRE = 13,  /* kv_key, key, u64 deadline (vlen 8) -> kv_val (version) */
};

/* Where a client reads the index window and the pool, on the fabric of the
 * session that asked. A record at loc (segment << 32 | offset) lies at
 * pool offset seg0 + segment * seg_size + offset. */
struct kv_onesided_info {
    struct tern_tp_rkey window;
    struct tern_tp_rkey pool;
    uint64_t seg0;
    uint32_t seg_size;
    uint32_t n_blocks;               /* window blocks (kv_window.h) */
    uint8_t uuid[16];
};

struct kv_lease_req {
    uint32_t flags;  /* 0 */
    uint32_t reserved;
};

/* A leased segment: write records from `next` on, below `end` (offsets in
 * the segment), through `rkey`, whose offset 0 is byte `base` of the
 * segment (the first byte a record may go to: the segment's header lies
 * before it, out of the lessee's reach). */
struct kv_lease {
    uint32_t seg;
    uint32_t next;
    uint32_t end;
    uint32_t base;
    struct tern_tp_rkey rkey;
};

/* "I wrote a record at `off` of my leased segment `seg`, with `intent` in
 * its version field." The server checks the intent id, so bytes an earlier
 * life of the segment left at that offset are never taken for this record
 * (say the client's one-sided put failed). Intent ids have the top bit set;
 * versions never do. */
struct kv_lput {
    uint32_t seg;
    uint32_t off;
    uint64_t intent;
};

/* "Write the key's record into my region `dst` at `off`, at most `cap`
 * bytes" (GET by server push). The server writes the whole record (as it
 * lies in the pool) by one-sided put, then replies with its size; a record
 * that does not fit, or that cannot be pushed right now, comes inline in
 * the reply instead (size 0, the value after the reply header). */
struct kv_pget {
    uint16_t klen;
    uint16_t flags;  /* 0 */
    uint32_t cap;
    uint64_t off;
    struct tern_tp_rkey dst;
};

struct kv_pget_rep {
    uint64_t version;
    uint32_t size;   /* record bytes pushed; 0: the value follows */
    uint32_t vlen;
};

struct kv_key {
    uint16_t klen;
    uint16_t flags;  /* PUT, DEL: enum kv_key_flags; else 0 */
    uint32_t vlen;   /* PUT: value bytes after the key; else 0 */
};

/* A write's concern on a replicated shard (services/repl): by default the
 * reply waits until a majority of replicas hold the write. A GET may ask
 * any replica whose store is whole (a backup not in a full copy), which
 * then answers what it holds: possibly a little behind the primary, and
 * possibly a write no majority holds yet. */
enum kv_key_flags {
    KV_F_W_ONE = 1u << 0,   /* the primary alone */
    KV_F_W_ALL = 1u << 1,   /* every replica */
    KV_F_READ_ANY = 1u << 2,    /* GET: a backup may answer */
    KV_F_DEADLINE = 1u << 3,    /* PUT: the value starts with its key's deadline
                                 * (u64, as KV_M_EXPIRE's; counted in vlen) */
};

struct kv_val {
    uint64_t version;
};

struct kv_mget {
    uint16_t n;
    uint16_t reserved[3];
};

struct kv_mget_rep {
    uint16_t n_done; /* results that fit; the client asks again for the rest */
    uint16_t reserved[3];
};

/* One result: this header, the key (scan only: klen > 0), the value, then
 * zero padding to a multiple of 8. */
struct kv_item {
    int32_t status;  /* 0 or a negative tern code (TERN_ENOENT) */
    uint32_t vlen;
    uint64_t version;
    uint16_t klen;
    uint16_t reserved[3];
};

struct kv_scan {
    uint64_t cursor;
    uint32_t max;
    uint32_t reserved;
};

struct kv_scan_rep {
    uint64_t next;   /* 0: done */
    uint32_t n;
    uint32_t reserved;
};

struct kv_info {
    uint32_t range_lo, range_hi;     /* hash >> 32 owned, inclusive */
    uint64_t keys;
    uint64_t pool_size, pool_live;
    uint8_t uuid[16];
    uint32_t key_max, val_max;       /* val_max for a key of 16 bytes */
    uint64_t pool_used;              /* record bytes in the pool's log, dead or alive */
    uint64_t in_place;               /* PUTs written over an older record */
};

/* In 64 bits: a hostile vlen near 4 GiB must not wrap to a small size. */
static inline uint64_t kv_item_size(uint32_t klen, uint32_t vlen)
{
    return ((uint64_t)sizeof(struct kv_item) + klen + vlen + 7u) & ~(uint64_t)7;
}

_Static_assert(sizeof(struct kv_key) == 8, "kv_key");
_Static_assert(sizeof(struct kv_item) == 24, "kv_item");
_Static_assert(sizeof(struct kv_info) == 72, "kv_info");
_Static_assert(sizeof(struct tern_tp_rkey) == 24, "rkey on the wire");
_Static_assert(sizeof(struct kv_onesided_info) == 80, "kv_onesided_info");
_Static_assert(sizeof(struct kv_lease) == 40, "kv_lease");
_Static_assert(sizeof(struct kv_lput) == 16, "kv_lput");
_Static_assert(sizeof(struct kv_pget) == 40, "kv_pget");
_Static_assert(sizeof(struct kv_pget_rep) == 16, "kv_pget_rep");

#endif
