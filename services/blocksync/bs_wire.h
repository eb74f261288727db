/* The block-sync service's messages (inside tern RPC payloads).
 * Little-endian, fixed sizes; every length is checked against the payload
 * before use, by the decoders below (which the fuzz target drives).
 *
 * BS_M_HELLO: bs_hello -> bs_hello_rep. Each side says who it is (chain,
 *   node, genesis) and what it has (head and irreversible heights, as
 *   counts of blocks, with the ids of their last blocks). A refusal carries
 *   its reason (enum bs_refusal) and the server's hello all the same.
 * BS_M_HEADERS: bs_headers_req -> bs_headers_rep and n headers of
 *   BS_HDR_SIZE bytes from height `from` on (fewer than asked at the top
 *   or when the reply is full; none past the top).
 * BS_M_RANGE: bs_range_req -> bs_range_rep. The log span of heights
 *   [from, to) (bs_store.h: records of a 32-byte header and the block,
 *   padded to 64) is `span_len` bytes; the reply carries the `n` bytes of it
 *   from `off` on: inline after the reply header, or, with BS_RANGE_PUT,
 *   put by the server at `roff` of `dst` before it replies. A receiver
 *   knows what span_len must be from the headers, so a span of another
 *   length is a lie found before a byte is read.
 * BS_M_APPEND: bs_append_req and one block -> bs_append_rep. A producer
 *   adds the next block (checked against the tip: chain, height, parent,
 *   Merkle root), durable before the reply; `lib`, if more than the
 *   store's, moves the irreversible height up to it (at most the new
 *   head). A block that fails its check is refused with the verdict
 *   (bs_block.h), not an error: the producer learns what was wrong. Only
 *   where the service allows producers (TERN_EACCES), never while it
 *   catches up (TERN_EBUSY).
 * BS_M_INFO: nothing -> bs_info.
 *
 * The block feed is a cursor into the log per subscriber, never a queue:
 * the server keeps each subscriber's position, filter and lag, and reads
 * every block it sends from the log, so a subscriber that falls behind
 * costs no memory and misses nothing; it only reads older blocks.
 * BS_M_SUBSCRIBE: bs_sub_req -> bs_sub_rep: from a height (with the id of
 *   the block before it, or zeros: a resume whose id does not match is
 *   refused "forked"), from the next block to be committed, or from the
 *   latest; whole blocks or headers only.
 * BS_M_FEED: bs_feed_req -> bs_feed_rep and n blocks from `next` on, each
 *   a 4-byte length and the block (or n headers of BS_HDR_SIZE bytes). The
 *   request acknowledges every block below `next` (with the id of block
 *   next-1, checked as a resume's) and grants `credits` blocks and
 *   `max_bytes` bytes; none at the head (the reply says the head, so the
 *   subscriber knows to wait).
 * BS_M_FEED_STATS: nothing -> bs_feed_stats_rep and n bs_sub_stat: every
 *   subscriber's position and lag. */
#ifndef TERN_BS_WIRE_H
#define TERN_BS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "bs_block.h"
#include "transport.h"

#define BS_SERVICE_ID 0x6273         /* "bs" */
#define BS_WIRE_VERSION 1u

enum bs_method {
    BS_M_HELLO = 1,
    BS_M_HEADERS = 2,
    BS_M_RANGE = 3,
    BS_M_APPEND = 4,
    BS_M_INFO = 5,
    BS_M_SUBSCRIBE = 6,
    BS_M_FEED = 7,
    BS_M_FEED_STATS = 8,
};

enum bs_from {
    BS_FROM_HEIGHT = 0,
    BS_FROM_NEXT = 1,                /* the next block to be committed */
    BS_FROM_LATEST = 2,              /* the last block committed */
};

enum bs_sub_flags {
    BS_SUB_HEADERS = 1u << 0,        /* headers only */
};

struct bs_sub_req {
    uint32_t from;                   /* enum bs_from */
    uint32_t flags;                  /* enum bs_sub_flags */
    uint64_t height;                 /* BS_FROM_HEIGHT */
    uint8_t parent[BS_ID_LEN];       /* id of block height-1, or zeros: no check */
};

struct bs_sub_rep {
    uint32_t refusal;                /* BS_OK or BS_R_FORKED */
    uint32_t reserved;
    uint64_t sub;                    /* the subscription's id */
    uint64_t next;                   /* the first height it will be sent */
    uint64_t head;                   /* blocks committed */
};

struct bs_feed_req {
    uint64_t sub;
    uint64_t next;                   /* every block below is acknowledged */
    uint32_t credits;                /* blocks it may be sent now */
    uint32_t max_bytes;
    uint8_t parent[BS_ID_LEN];       /* id of block next-1 (zeros when next is 0) */
};

struct bs_feed_rep {
    uint64_t head;
    uint64_t next;                   /* height of the first block here */
    uint32_t n;
    uint32_t flags;                  /* BS_SUB_HEADERS: n headers */
    uint32_t refusal;                /* BS_OK or BS_R_FORKED (n is 0) */
    uint32_t reserved;
};

struct bs_sub_stat {
    uint64_t sub;
    uint64_t next;                   /* acknowledged below this */
    uint64_t lag;                    /* head - next */
    uint64_t idle_ns;                /* since its last request */
};

struct bs_feed_stats_rep {
    uint64_t head;
    uint32_t n;
    uint32_t reserved;
};

/* Why a handshake was refused, by either side. */
enum bs_refusal {
    BS_OK = 0,
    BS_R_CHAIN,          /* another chain id */
    BS_R_FORKED,         /* an irreversible block differs */
    BS_R_UNLINKABLE,     /* another genesis block */
    BS_R_INVALID,        /* the hello does not add up, or the node lied before */
    BS_R_SELF,           /* our own node id */
    BS_R_DUPLICATE,      /* that node is connected already */
    BS_R_VERSION,        /* another protocol version */
    BS_R_MAX
};

const char *bs_refusal_name(unsigned r);

struct bs_hello {
    uint32_t version;
    uint32_t flags;                  /* 0 */
    uint64_t chain;
    uint64_t node;                   /* random, per process */
    uint64_t head;                   /* blocks held */
    uint64_t lib;                    /* of which irreversible */
    uint8_t head_id[BS_ID_LEN];      /* id of block head-1 (zero if none) */
    uint8_t lib_id[BS_ID_LEN];       /* id of block lib-1 (zero if none) */
    uint8_t genesis[BS_ID_LEN];      /* id of block 0 (zero if none) */
};

struct bs_hello_rep {
    uint32_t refusal;                /* enum bs_refusal */
    uint32_t reserved;
    struct bs_hello hello;           /* the server's */
};

struct bs_headers_req {
    uint64_t from;
    uint32_t max;
    uint32_t reserved;
};

struct bs_headers_rep {
    uint64_t from;
    uint32_t n;
    uint32_t reserved;
    /* n * BS_HDR_SIZE bytes follow */
};

enum bs_range_flags {
    BS_RANGE_PUT = 1u << 0,          /* put the bytes at dst + roff */
};

struct bs_range_req {
    uint64_t from, to;               /* heights [from, to) */
    uint64_t off;                    /* first span byte wanted */
    uint32_t max;                    /* bytes wanted at most */
    uint32_t flags;
    uint64_t roff;
    struct tern_tp_rkey dst;
};

struct bs_range_rep {
    uint64_t span_len;               /* the whole span of [from, to) */
    uint64_t off;
    uint32_t n;                      /* bytes given from `off` on */
    uint32_t flags;                  /* BS_RANGE_PUT if they were put */
    /* inline: n bytes follow */
};

struct bs_append_req {
    uint64_t lib;                    /* irreversible blocks after it; 0 = as is */
    uint32_t flags;                  /* 0 */
    uint32_t reserved;
    /* the block follows */
};

struct bs_append_rep {
    uint32_t verdict;                /* enum bs_verdict, or BS_APPEND_MALFORMED */
    uint32_t reserved;
    uint64_t height;                 /* the block's, when taken */
    uint8_t id[BS_ID_LEN];
};

#define BS_APPEND_MALFORMED 100u     /* the bytes are no block */

enum bs_info_flags {
    BS_INFO_SYNCING = 1u << 0,       /* catching up from peers now */
    BS_INFO_APPEND = 1u << 1,        /* takes blocks from producers */
};

struct bs_info {
    uint64_t chain, node;
    uint64_t committed, irreversible;
    uint8_t head_id[BS_ID_LEN];
    uint64_t data_used, data_cap, idx_cap;
    uint32_t flags;
    uint32_t subscribers;            /* of the block feed */
};

_Static_assert(sizeof(struct bs_hello) == 136, "bs_hello");
_Static_assert(sizeof(struct bs_append_req) == 16, "bs_append_req");
_Static_assert(sizeof(struct bs_append_rep) == 48, "bs_append_rep");
_Static_assert(sizeof(struct bs_info) == 96, "bs_info");
_Static_assert(sizeof(struct bs_sub_req) == 48, "bs_sub_req");
_Static_assert(sizeof(struct bs_sub_rep) == 32, "bs_sub_rep");
_Static_assert(sizeof(struct bs_feed_req) == 56, "bs_feed_req");
_Static_assert(sizeof(struct bs_feed_rep) == 32, "bs_feed_rep");
_Static_assert(sizeof(struct bs_sub_stat) == 32, "bs_sub_stat");
_Static_assert(sizeof(struct bs_hello_rep) == 144, "bs_hello_rep");
_Static_assert(sizeof(struct bs_headers_req) == 16, "bs_headers_req");
_Static_assert(sizeof(struct bs_headers_rep) == 16, "bs_headers_rep");
_Static_assert(sizeof(struct bs_range_rep) == 24, "bs_range_rep");

/* Decoders: copy the fixed part out of `len` bytes at `p` and check it.
 * 0, or TERN_EPROTO with a reason in *why. */
int bs_hello_decode(const void *p, size_t len, struct bs_hello *out, const char **why);
int bs_hello_rep_decode(const void *p, size_t len, struct bs_hello_rep *out, const char **why);
int bs_headers_req_decode(const void *p, size_t len, struct bs_headers_req *out,
                          const char **why);
/* *hdrs points at the n headers inside `p`. */
int bs_headers_rep_decode(const void *p, size_t len, struct bs_headers_rep *out,
                          const uint8_t **hdrs, const char **why);
int bs_range_req_decode(const void *p, size_t len, struct bs_range_req *out, const char **why);
/* block and block_len: the bytes after the request header. */
int bs_append_req_decode(const void *p, size_t len, struct bs_append_req *out,
                         const uint8_t **block, size_t *block_len, const char **why);
int bs_append_rep_decode(const void *p, size_t len, struct bs_append_rep *out,
                         const char **why);
int bs_info_decode(const void *p, size_t len, struct bs_info *out, const char **why);
int bs_sub_req_decode(const void *p, size_t len, struct bs_sub_req *out, const char **why);
int bs_sub_rep_decode(const void *p, size_t len, struct bs_sub_rep *out, const char **why);
int bs_feed_req_decode(const void *p, size_t len, struct bs_feed_req *out, const char **why);
/* The n records after the reply header, walked: fn(arg, height, bytes,
 * len) for each, in order (stops at a negative return, passed back).
 * TERN_EPROTO with *why for a reply whose records do not add up. */
int bs_feed_rep_decode(const void *p, size_t len, struct bs_feed_rep *out,
                       int (*fn)(void *arg, uint64_t height, const uint8_t *rec, size_t rec_len),
                       void *arg, const char **why);
/* *bytes points at the inline bytes inside `p` (NULL if put). */
int bs_range_rep_decode(const void *p, size_t len, struct bs_range_rep *out,
                        const uint8_t **bytes, const char **why);

#endif
