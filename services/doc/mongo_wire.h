/* The MongoDB wire protocol, as bytes: frames in, frames out. No I/O, no
 * allocation; a parsed message points into the caller's buffer.
 *
 * Every message starts with a 16-byte header: int32 messageLength (the
 * whole message, header included), int32 requestID, int32 responseTo,
 * int32 opCode, all little-endian. tern answers two opcodes:
 *   - OP_QUERY (2004), the legacy handshake drivers send first on each
 *     connection: int32 flags, cstring "admin.$cmd", int32 skip, int32
 *     numberToReturn, a command document (isMaster/hello), an optional
 *     field selector; answered with OP_REPLY (1): int32 responseFlags,
 *     int64 cursorID 0, int32 startingFrom 0, int32 numberReturned 1, the
 *     reply document. OP_QUERY on anything but a "$cmd" collection is
 *     refused (as MongoDB 6 does).
 *   - OP_MSG (2013): uint32 flagBits (bit 0 checksumPresent, bit 1
 *     moreToCome, bit 16 exhaustAllowed; any other bit of 0-15 is an
 *     error, 16-31 are ignored), sections, then a CRC-32C if bit 0. A
 *     section is kind 0 (one BSON document: the command) or kind 1 (int32
 *     size including itself, cstring identifier, BSON documents filling
 *     the rest). Exactly one kind 0; identifiers unique. A moreToCome
 *     request gets no reply. Replies carry flags 0 (but the gateway's
 *     streamed hello answers, which carry moreToCome: mongo_gw.h) and one
 *     kind-0 section, never a checksum.
 * Anything else (another opcode, OP_COMPRESSED included since tern
 * advertises no compressor) gets an error reply where it can be
 * addressed, and the connection goes on.
 *
 * Checked before a command runs: every length against what holds it (a
 * section past the message, a document past its section, a kind-1 size
 * below 4 + 1), one body, unique identifiers, the flag bits, the CRC-32C
 * when bit 0 says there is one (verified, then left out of the sections),
 * and each document: first a walk of tern's own without recursion, which
 * refuses nesting past MONGO_MAX_DEPTH (Overflow, as MongoDB's
 * maxBSONDepth; code-with-scope scopes count), keys, strings and code that
 * are not UTF-8, and embedded documents that do not end in their NUL
 * (libbson 1.23's bson_validate recurses once per level, and lets the last
 * two through), then bson_validate. A document over
 * MONGO_MAX_BSON_INTERNAL is BSONObjectTooLarge; the command layer holds
 * stored documents to MONGO_MAX_BSON.
 *
 * A stream whose header cannot be believed (a length below 16 or past the
 * limit) cannot be framed any further: mongo_frame says so, and the
 * connection gets one error reply addressed to that header's requestID
 * (mongo_error_doc in an OP_MSG, or an OP_REPLY if the header says
 * OP_QUERY), sent before the connection is closed. MongoDB itself just
 * closes; a driver that waits for its reply learns why this way.
 */
#ifndef TERN_MONGO_WIRE_H
#define TERN_MONGO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "doc_cmd.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MONGO_OP_REPLY 1
#define MONGO_OP_QUERY 2004
#define MONGO_OP_COMPRESSED 2012
#define MONGO_OP_MSG 2013

#define MONGO_HDR_LEN 16
#define MONGO_MAX_MESSAGE 48000000      /* maxMessageSizeBytes the server says */
#define MONGO_MAX_SECTIONS 8            /* kind-1 sections per message */
#define MONGO_MAX_BSON (16u << 20)      /* maxBsonObjectSize the server says */
/* A command may wrap a largest document: MongoDB's BSONObjMaxInternalSize. */
#define MONGO_MAX_BSON_INTERNAL (MONGO_MAX_BSON + (16u << 10))
#define MONGO_MAX_DEPTH 200             /* MongoDB's maxBSONDepth */

#define MONGO_MSG_CHECKSUM 0x1u
#define MONGO_MSG_MORE_TO_COME 0x2u
#define MONGO_MSG_EXHAUST 0x10000u

struct mongo_hdr {
    int32_t len, request_id, response_to, op;
};

/* How many bytes of `buf` the next message takes: 0 if it is not complete
 * yet (read more: once 16 bytes are there *h is filled, and h->len says
 * how many the message needs), the length if it is complete, <0 with *e
 * and *h filled if the header is impossible (a length below 16 or above
 * max, which is at most MONGO_MAX_MESSAGE): see the top of the file. It
 * keeps no state, so a caller may call again after every read. */
long mongo_frame(const uint8_t *buf, size_t len, size_t max, struct mongo_hdr *h,
                 struct doc_err *e);

struct mongo_msg {
    struct mongo_hdr h;
    uint32_t flags;               /* OP_MSG flagBits */
    bson_t body;                  /* the command (a static view into the buffer) */
    struct doc_seq seqs[MONGO_MAX_SECTIONS];
    unsigned nseq;
    bool legacy;                  /* came as OP_QUERY: reply with OP_REPLY */
    const char *db;               /* OP_QUERY: "<db>" of "<db>.$cmd" (the body has */
    size_t db_len;                /* no $db); NULL for OP_MSG */
};

/* Parse one complete message (as framed by mongo_frame). 0 and *m, or
 * <0 with *e saying why: DOC_ProtocolError (sections and lengths that do
 * not add up, a checksum that does not match, an opcode tern does not
 * serve, OP_QUERY on a collection other than $cmd), DOC_IllegalOpMsgFlag,
 * DOC_InvalidBSON, DOC_Overflow (nested past MONGO_MAX_DEPTH),
 * DOC_BSONObjectTooLarge. m->h, m->flags and m->legacy are filled either
 * way (flags as far as they could be read), so that the error can be
 * addressed to the request, or left unsent for a moreToCome one. */
int mongo_parse(const uint8_t *msg, size_t len, struct mongo_msg *m, struct doc_err *e);

/* Append {ok: 0, errmsg, code, codeName} for `e` to `doc` (empty). */
void mongo_error_doc(const struct doc_err *e, bson_t *doc);

/* CRC-32C (Castagnoli) of n bytes, continuing from `crc` (0 to start):
 * OP_MSG's checksum. */
uint32_t mongo_crc32c(uint32_t crc, const void *p, size_t n);

/* The bytes of a reply to request `h` carrying `doc`: an OP_MSG, or an
 * OP_REPLY if `legacy`. Writes at most `cap` bytes of `out`; returns the
 * reply's length (which may be more than cap: call again with room). */
size_t mongo_reply(const struct mongo_hdr *h, bool legacy, int32_t request_id, const bson_t *doc,
                   uint8_t *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
