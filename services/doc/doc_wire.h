/* The native document service's messages (inside tern RPC payloads), and
 * what ternd needs to serve a store it shares with the MongoDB gateway.
 * Little-endian, fixed sizes, no pointers; every length is checked against
 * the payload before use.
 *
 * DOC_M_CMD: doc_req, then one BSON command document (with $db) ->
 *   doc_rep, then the reply document. When the request names a buffer
 *   (DOC_REQ_PUSH) and the reply carries a cursor batch (cursor.firstBatch
 *   or cursor.nextBatch) of at least `min` and at most `cap` bytes, the
 *   server puts that batch array, as a BSON document, at `off` of `dst`
 *   before replying, says so (DOC_REP_PUSHED, n documents, size bytes) and
 *   leaves the array empty in the reply. Otherwise the batch stays in the
 *   reply. */
#ifndef TERN_DOC_WIRE_H
#define TERN_DOC_WIRE_H

#include <stdint.h>

#include "transport.h"

struct doc_server;
struct tern_doc_service;

enum doc_method {
    DOC_M_CMD = 1,
    DOC_M_STATS = 2,     /* empty -> doc_wire_stats */
};

enum doc_req_flags {
    DOC_REQ_PUSH = 1u << 0,
};

struct doc_req {
    uint32_t flags;
    uint32_t cap;        /* bytes at dst + off the server may write */
    uint64_t off;
    uint32_t min;        /* push only batches of at least this many bytes */
    uint32_t reserved;   /* 0 */
    struct tern_tp_rkey dst;
};

enum doc_rep_flags {
    DOC_REP_PUSHED = 1u << 0,
};

struct doc_rep {
    uint32_t flags;
    uint32_t n;          /* documents in the pushed batch */
    uint64_t size;       /* bytes pushed: one BSON array document */
};

struct doc_wire_stats {
    uint64_t commands;
    uint64_t batches_pushed, batches_inline;
    uint64_t sessions;   /* sessions with a client state now */
    uint64_t cursors_open;
};

_Static_assert(sizeof(struct doc_req) == 48, "doc_req");
_Static_assert(sizeof(struct doc_rep) == 16, "doc_rep");
_Static_assert(sizeof(struct doc_wire_stats) == 40, "doc_wire_stats");

/* Serve `srv` (opened and closed by the caller, which may serve it by
 * other ways too: ternd's MongoDB gateway on the same thread) over RPC.
 * tern_doc_service_close() then leaves the server and its store alone. */
int doc_service_new(struct doc_server *srv, size_t max_msg, struct tern_doc_service **out);

#endif
