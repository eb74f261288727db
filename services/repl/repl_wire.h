/* The replication protocol's messages (inside tern RPC payloads, service
 * TERN_REPL_SERVICE_ID). Little-endian, fixed sizes, no pointers.
 *
 * A shard's log is a sequence of records, each a write of the service's
 * store (a key set to a value, or deleted) under a version. Versions are
 * log positions: the epoch of the primary that wrote the record in bits
 * 40..62 and a count below it, so that comparing two versions compares
 * (epoch, count) and a version names one record of one primary's log. A
 * replica's position is the version of the last record it made durable.
 *
 * APPEND   primary -> backup: records, in version order, following `prev`
 *          (the version of the record before the first; Raft's log
 *          matching). The backup takes them only if its position is
 *          `prev`, makes them durable, and answers its position. A batch
 *          that does not follow answers REPL_GAP with the position, and the
 *          primary ships from there (or, if its log no longer reaches back
 *          that far, the backup needs a full copy: REPL_NEED_COPY).
 * POSITION new primary -> replica, when it takes office: "I am epoch E,
 *          where are you?" The replica refuses every older epoch from then
 *          on (fencing), and answers its position.
 * FETCH    new primary -> the most advanced replica: the records after
 *          `from`, up to `max` bytes (as an APPEND batch, so that one
 *          decoder checks both).
 * COPY     primary -> a replica that needs a full copy: BEGIN (the
 *          replica wipes its store), CHUNKs of the primary's live records
 *          in any order (a scan of its store, taken while writes go on:
 *          each record carries its own version and the newer one of a key
 *          wins), END with `snap`, the primary's position when the copy
 *          began. The replica is then at `snap` and the primary streams the
 *          records after it; until it has caught up past every version the
 *          copy brought, a restart wipes it again (its state file says so).
 * RING     primary -> backup: grant me your ring (repl_ring.h) at my
 *          epoch; the answer is a struct repl_ring_grant.
 * RING_SYNC primary -> backup, after frames put into its ring where a put
 *          alone does not make them durable: take your ring's frames into
 *          your store; the answer is its position (repl_pos).
 *
 * Every request carries the sender's epoch; one older than the replica has
 * seen fails with TERN_ESTALE and changes nothing.
 */
#ifndef TERN_REPL_WIRE_H
#define TERN_REPL_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define TERN_REPL_SERVICE_ID 0x7270     /* "rp" */
#define REPL_SHARD_MAX 64               /* a shard's name, NUL included */
#define REPL_EPOCH_SHIFT 40
#define REPL_EPOCH_MAX ((1u << 23) - 1)
#define REPL_KEY_MAX 1024u

enum repl_method {
    REPL_M_APPEND = 1,      /* repl_batch, records  -> repl_pos */
    REPL_M_POSITION = 2,    /* repl_ask             -> repl_pos */
    REPL_M_FETCH = 3,       /* repl_ask             -> repl_batch, records */
    REPL_M_COPY = 4,        /* repl_copy, records   -> repl_pos */
    REPL_M_RING = 5,        /* repl_ask             -> repl_ring_grant */
    REPL_M_RING_SYNC = 6,   /* repl_ask (from: the tail) -> repl_pos */
};

enum repl_copy_phase { REPL_COPY_BEGIN = 1, REPL_COPY_CHUNK = 2, REPL_COPY_END = 3 };

struct repl_copy {
    char shard[REPL_SHARD_MAX];
    uint64_t epoch;
    uint64_t snap;                  /* the primary's position at BEGIN */
    uint32_t phase;                 /* enum repl_copy_phase */
    uint32_t n;                     /* records that follow (CHUNK only) */
    uint32_t bytes;
    uint32_t reserved;              /* 0 */
};

static inline uint64_t repl_epoch_of(uint64_t version)
{
    return version >> REPL_EPOCH_SHIFT;
}

/* The first version an epoch's primary may give. */
static inline uint64_t repl_epoch_base(uint64_t epoch)
{
    return epoch << REPL_EPOCH_SHIFT;
}

struct repl_batch {
    char shard[REPL_SHARD_MAX];     /* NUL-terminated, NUL-padded */
    uint64_t epoch;
    uint64_t prev;                  /* version before the first record */
    uint64_t commit;                /* the primary's commit point (for lag) */
    uint32_t n;                     /* records that follow */
    uint32_t bytes;                 /* their bytes, padding included */
};

/* A record: this header, the key, the value, zeros up to a multiple of 8. */
struct repl_rec {
    uint64_t version;
    uint32_t sum;                   /* XXH3 (low 32 bits) of everything after it */
    uint32_t val_len;
    uint16_t key_len;
    uint8_t type;                   /* enum repl_rec_type */
    uint8_t flags;                  /* 0 */
    uint32_t reserved;              /* 0 */
};

enum repl_rec_type {
    REPL_SET = 1,
    REPL_DEL = 2,
    REPL_SET_EXPIRING = 3,          /* a value whose first 8 bytes are its deadline
                                     * (a KV store's PM_EXPIRING record) */
};

struct repl_ask {
    char shard[REPL_SHARD_MAX];
    uint64_t epoch;
    uint64_t from;                  /* FETCH: records after this version */
    uint32_t max;                   /* FETCH: at most this many bytes */
    uint32_t flags;                 /* 0 */
};

enum repl_pos_flags {
    REPL_GAP = 1u << 0,             /* APPEND: did not follow my position */
    REPL_NEED_COPY = 1u << 1,       /* my log parted from yours, or is empty
                                     * while a copy runs: copy the shard to me */
    REPL_MORE = 1u << 2,            /* FETCH: more records after these */
};

struct repl_pos {
    uint64_t epoch;                 /* the newest epoch the replica has seen */
    uint64_t position;              /* the last version it holds durably */
    uint32_t flags;
    uint32_t reserved;
};

/* Bytes a record takes on the wire. */
static inline size_t repl_rec_size(size_t key_len, size_t val_len)
{
    return (sizeof(struct repl_rec) + key_len + val_len + 7u) & ~(size_t)7u;
}

/* Write a record at dst (repl_rec_size bytes): header, key, value, padding,
 * then its sum. */
void repl_rec_write(void *dst, uint8_t type, uint64_t version, const void *key,
                    uint16_t key_len, const void *val, uint32_t val_len);

/* Walk a batch from the wire: checks the header (shard name terminated,
 * `bytes` equal to what follows, `n` records exactly filling them, each
 * with a known type, a key of 1..REPL_KEY_MAX bytes, no value on a delete,
 * zero padding, its sum right, versions strictly increasing and above
 * `prev`), copying the header to *hdr (if not NULL) and calling fn for
 * each record (a nonzero return stops the walk and
 * is returned). 0, TERN_EPROTO for anything malformed (nothing after the
 * fault is visited; records before it may have been, so check with a NULL
 * fn first when a partial walk would do harm), or fn's code. */
typedef int (*repl_rec_fn)(void *arg, const struct repl_rec *r, const void *key,
                           const void *val);
int repl_batch_walk(const void *data, size_t len, struct repl_batch *hdr,
                    repl_rec_fn fn, void *arg);

/* Walk a COPY message as repl_batch_walk does a batch, but for the order
 * of versions (a scan's order) and the phase: BEGIN and END carry no
 * records. */
int repl_copy_walk(const void *data, size_t len, struct repl_copy *hdr, repl_rec_fn fn,
                   void *arg);

/* A request's shard name: checked to be terminated within the field. */
int repl_shard_ok(const char shard[REPL_SHARD_MAX]);

#endif
