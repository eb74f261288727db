/* tern document service, the native client: MongoDB's data model and
 * commands over tern RPC, on every fabric.
 *
 * BSON is libbson's: this header includes <bson/bson.h> (pkg-config
 * libbson-1.0, which `pkg-config tern` pulls in when the document client is
 * built), and every document in and out is a bson_t. Arguments are only
 * read, and the library keeps no pointer to them once a call returns (an
 * async call: once it returned 0 or an error; the request is copied into
 * the send buffer or a slot of the client's own).
 *
 * What travels is the MongoDB command document a driver would send
 * ({insert: "c", documents: [...], $db: "d"}), run on the server by the
 * same code that serves the MongoDB wire gateway, so both ways in give the
 * same answers. tern_doc_command() sends any command the helpers below do
 * not cover.
 *
 * Errors: every call returns 0 (or a count where said) or a negative code
 * of error.h. A command the server refused maps to the closest code:
 *   TERN_EEXIST   a duplicate key (MongoDB's 11000, also inside writeErrors);
 *   TERN_EINVAL   a bad filter, update, pipeline or option (BadValue,
 *                 FailedToParse, TypeMismatch, InvalidBSON, ...);
 *   TERN_ENOENT   a missing namespace, index or cursor;
 *   TERN_E2BIG    a document over 16 MiB; TERN_ENOSPC the pool is full;
 *   TERN_ENOTPRIMARY  a replica that is not (or no longer) the primary
 *                 (NotWritablePrimary, NotPrimaryNoSecondaryOk,
 *                 PrimarySteppedDown, ShutdownInProgress, ...);
 *   TERN_EDOC     any other MongoDB error;
 * and tern_doc_last_error() gives MongoDB's code, codeName and errmsg of
 * the last call that failed that way. Failures of the transport (a
 * deadline, a lost session) are their own codes, with code 0 there.
 *
 * Threads: a client belongs to the thread that polls its endpoint. Sync
 * calls poll the endpoint until they complete (never call them from a
 * callback); async callbacks run inside tern_rpc_poll(). */
#ifndef TERN_DOC_H
#define TERN_DOC_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_DOC_SERVICE_ID 0x6463   /* "dc" */

struct tern_doc;
struct tern_doc_cursor;

/* ---- clients ---- */

/* Connect to `n` servers (tern_rpc_connect URIs, up to 7): one server and
 * its alternatives, or the replicas of a replicated document store
 * (ternd's [cluster] doc_shard). Calls go to the first that answers; a
 * call that one refuses because it is not the primary (MongoDB's
 * NotWritablePrimary and kin, TERN_ENOTPRIMARY), or that is lost with its
 * session, is sent on to the next live one, which calls go to from then
 * on, at most twice round them. During an election every replica
 * refuses: an async call then ends with TERN_ENOTPRIMARY, while a sync
 * call waits it out, sent again every 10 ms until its deadline
 * (tern_doc_set_timeout; with none, until a primary answers), as tern_kv's
 * sync calls do; so does a sync call that finds no replica live. A write
 * lost with its session may have been done (at least once), and is not
 * sent again after that round. A cursor stays on the server that opened
 * it. Lost sessions are dialled again before later calls, without
 * waiting. At open, and after a refusal, the client also asks the server
 * it uses for the set's members (hello's ternMembers, from the shard's
 * map) and dials those it was not given: told of one member, it finds the
 * others, and it follows a primary onto a node added since. Returns the
 * first one's error if none answers; TERN_EINVAL past 7. The endpoint
 * must outlive the client. */
int tern_doc_open(struct tern_rpc_ep *ep, const char *const *uris, unsigned n,
                  uint64_t timeout_ns, struct tern_doc **out);

/* Close the session (the server frees this client's cursors) and the
 * client's cursors; async calls in flight complete with TERN_ECANCELED.
 * Cursors must not be used afterwards, only closed. NULL is ignored. */
void tern_doc_close(struct tern_doc *doc);

/* Per-call deadline for later calls (0 = none; the default is 5 s). */
void tern_doc_set_timeout(struct tern_doc *doc, uint64_t timeout_ns);

/* MongoDB's error of the last call that failed with one (see above). The
 * strings are NUL-terminated; valid until the next call on `doc`. */
struct tern_doc_error {
    int32_t code;                    /* MongoDB's code (11000); 0 = none */
    char code_name[64];              /* "DuplicateKey" */
    char errmsg[512];
    int32_t index;                   /* the failed write's index in a batch; -1 */
};
const struct tern_doc_error *tern_doc_last_error(const struct tern_doc *doc);

/* ---- the generic command ---- */

/* Run `cmd` (its first field names it) on database `db` ($db is added).
 * `reply` is initialised here and always holds what the server answered,
 * also when the call fails with a MongoDB error (an empty document when
 * nothing came back); the caller bson_destroy()s it. 0 if the reply says
 * ok: 1 without writeErrors, else a code as above. */
int tern_doc_command(struct tern_doc *doc, const char *db, const bson_t *cmd, bson_t *reply);

/* Result of an async call: `reply` is the server's reply document (valid
 * during the callback only), or NULL when none came (transport errors).
 * `status` is what the sync form would return. */
typedef void (*tern_doc_cb)(void *arg, int status, const bson_t *reply);

/* Async forms: 0 once the request is on its way (cb then runs exactly
 * once, inside tern_rpc_poll()), or an error and cb never runs.
 * TERN_ENOBUFS when too many calls are in flight: poll, then retry. */
int tern_doc_command_async(struct tern_doc *doc, const char *db, const bson_t *cmd,
                           tern_doc_cb cb, void *arg);

/* ---- writes ---- */

/* Insert one document; the server adds an ObjectId _id if it has none.
 * TERN_EEXIST if a unique index has its key. Returns once the document is
 * durable. */
int tern_doc_insert_one(struct tern_doc *doc, const char *db, const char *coll,
                        const bson_t *document);
int tern_doc_insert_one_async(struct tern_doc *doc, const char *db, const char *coll,
                              const bson_t *document, tern_doc_cb cb, void *arg);

/* Insert n documents. `ordered`: stop at the first error (MongoDB's
 * default); else insert every one that can be. *inserted (may be NULL) is
 * the number stored, also on error; the error is the first write's
 * (tern_doc_last_error's index says which, in `docs`). As MongoDB's
 * drivers do, the documents go in as many commands as messages need (each
 * within both ends' max_msg and 100,000 documents); ordered stops at the
 * first command with an error. The async form sends one command, which
 * must fit one message (TERN_EMSGSIZE otherwise). */
int tern_doc_insert_many(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *const *docs, size_t n, bool ordered, uint64_t *inserted);
int tern_doc_insert_many_async(struct tern_doc *doc, const char *db, const char *coll,
                               const bson_t *const *docs, size_t n, bool ordered,
                               tern_doc_cb cb, void *arg);

/* Result of an update. */
struct tern_doc_update_result {
    uint64_t matched, modified;
    bool upserted;                   /* a document was inserted */
};

/* Update the first document matching `filter` (update_one) or all of them
 * (update_many) with `update`: operators ({$set: ...}) or, for update_one,
 * a replacement document. `upsert`: insert one if none matches. `res` may
 * be NULL. */
int tern_doc_update_one(struct tern_doc *doc, const char *db, const char *coll,
                        const bson_t *filter, const bson_t *update, bool upsert,
                        struct tern_doc_update_result *res);
int tern_doc_update_many(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *filter, const bson_t *update, bool upsert,
                         struct tern_doc_update_result *res);
/* The async form of both: `multi` chooses many. The callback reads n,
 * nModified and upserted from the reply as MongoDB names them. */
int tern_doc_update_async(struct tern_doc *doc, const char *db, const char *coll,
                          const bson_t *filter, const bson_t *update, bool upsert, bool multi,
                          tern_doc_cb cb, void *arg);

/* Delete the first document matching `filter`, or all of them. *deleted
 * may be NULL. */
int tern_doc_delete_one(struct tern_doc *doc, const char *db, const char *coll,
                        const bson_t *filter, uint64_t *deleted);
int tern_doc_delete_many(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *filter, uint64_t *deleted);
int tern_doc_delete_async(struct tern_doc *doc, const char *db, const char *coll,
                          const bson_t *filter, bool multi, tern_doc_cb cb, void *arg);

/* ---- reads ---- */

/* Documents matching `filter` (NULL: all), counted by the server. */
int tern_doc_count(struct tern_doc *doc, const char *db, const char *coll,
                   const bson_t *filter, uint64_t *n);
int tern_doc_count_async(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *filter, tern_doc_cb cb, void *arg);

/* The document whose _id is `id`, copied into `out` (initialised here,
 * bson_destroy() it on success only). TERN_ENOENT if there is none. */
int tern_doc_find_id(struct tern_doc *doc, const char *db, const char *coll,
                     const bson_value_t *id, bson_t *out);
int tern_doc_find_id_async(struct tern_doc *doc, const char *db, const char *coll,
                           const bson_value_t *id, tern_doc_cb cb, void *arg);

/* A cursor over the documents matching `filter` (NULL: all). `opts` (may
 * be NULL) holds find's options as MongoDB names them: projection, sort,
 * skip, limit, batchSize, hint. The first batch comes with this call. */
int tern_doc_find(struct tern_doc *doc, const char *db, const char *coll, const bson_t *filter,
                  const bson_t *opts, struct tern_doc_cursor **out);

/* A cursor over the results of an aggregation `pipeline` (a BSON array:
 * {"0": {$match: ...}, "1": {$group: ...}}). `opts` may hold batchSize
 * inside "cursor", or allowDiskUse. */
int tern_doc_aggregate(struct tern_doc *doc, const char *db, const char *coll,
                       const bson_t *pipeline, const bson_t *opts,
                       struct tern_doc_cursor **out);

/* The next document: 1 with *view pointing at it, 0 after the last, or an
 * error (the cursor then stays at its end). The view is read-only and
 * valid until the next call on this cursor or its close; copy it
 * (bson_copy) to keep it. When a batch runs out this asks the server for
 * the next (getMore), so it blocks as a sync call does. */
int tern_doc_cursor_next(struct tern_doc_cursor *cur, const bson_t **view);

/* Close a cursor, and the server's side of it if it is still open there
 * (a killCursors sent without waiting). NULL is ignored. Cursors are
 * closed by tern_doc_close too; closing one after that only frees it. */
void tern_doc_cursor_close(struct tern_doc_cursor *cur);

/* ---- indexes and collections ---- */

/* Build an index with key pattern `keys` ({a: 1, "b.c": -1}); name NULL
 * is MongoDB's default ("a_1_b.c_-1"). 0 also when the same index exists;
 * TERN_EEXIST if two documents have one key of a unique index. */
int tern_doc_create_index(struct tern_doc *doc, const char *db, const char *coll,
                          const bson_t *keys, const char *name, bool unique);

/* Drop an index by name ("*": all but _id_). TERN_ENOENT if absent. */
int tern_doc_drop_index(struct tern_doc *doc, const char *db, const char *coll,
                        const char *name);

/* Drop a collection with its documents and indexes. */
int tern_doc_drop(struct tern_doc *doc, const char *db, const char *coll);

/* ---- result paths ---- */

enum tern_doc_path {
    /* Every batch comes inline in the reply, copied out of it. */
    TERN_DOC_PATH_RPC = 0,
    /* RMongo's path: a cursor names a buffer this client registered, the
     * server writes each batch's documents into it by one-sided put (on
     * shm: stores into the buffer, mapped in the server) and replies with
     * only their count and size; the cursor reads them in place. Batches
     * come inline where the session's fabric has no one-sided put, while
     * shm is still mapping the buffer, when the fabric's queue is full, or
     * when every buffer is taken by other cursors. */
    TERN_DOC_PATH_ONESIDED = 1,
    /* One-sided for batches of at least 64 KiB on fabrics whose puts cost
     * the server's CPU nothing (TERN_TP_CAP_RMA_OFFLOAD: shm, rdma);
     * inline elsewhere and for smaller batches. The default. */
    TERN_DOC_PATH_AUTO = 2,
};

/* Choose how later cursors' batches travel (cursors open already keep
 * theirs). The first cursor that goes one-sided registers this client's
 * buffers: TERN_DOC_BUF_SLOTS of TERN_DOC_BUF_SLOT bytes (memory touched
 * only where used), one per cursor while it is open; a batch larger than a
 * slot comes inline. TERN_EINVAL for another value. */
#define TERN_DOC_BUF_SLOTS 8
#define TERN_DOC_BUF_SLOT (1u << 20)
int tern_doc_set_path(struct tern_doc *doc, enum tern_doc_path path);

struct tern_doc_stats {
    uint64_t commands;               /* replies received */
    uint64_t batches_inline;         /* cursor batches copied out of a reply */
    uint64_t batches_pushed;         /* cursor batches the server put into a buffer */
    uint64_t bytes_inline, bytes_pushed;
    uint64_t slots_lost;             /* buffers retired: a late put may still land */
};
void tern_doc_get_stats(const struct tern_doc *doc, struct tern_doc_stats *st);

#ifdef __cplusplus
}
#endif

#endif
