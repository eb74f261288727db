/* MongoDB's commands over a document store: what the wire gateway and the
 * native RPC service both run, so that either way in gives the same
 * answers.
 *
 * A command is a BSON document whose first field names it ({find: "c",
 * filter: {...}, $db: "test"}), plus the document sequences OP_MSG may
 * carry beside it (kind-1 sections "documents", "updates", "deletes");
 * a sequence and an inline array of the same name are one and the same.
 * The reply is the document MongoDB would send: {ok: 1, ...}, write
 * errors inside an ok:1 reply ({n, writeErrors: [{index, code, errmsg,
 * keyPattern, keyValue}]}), and a failed command as {ok: 0, errmsg, code,
 * codeName}. A command never fails any other way: every error is a reply.
 *
 * Commands: hello/isMaster/ismaster, ping, buildInfo, getParameter,
 * serverStatus, hostInfo, whatsmyuri, getLog, getCmdLineOpts, connectionStatus,
 * insert, find, getMore, killCursors, update, delete, findAndModify,
 * count, distinct, aggregate, createIndexes, listIndexes, dropIndexes,
 * listCollections, listDatabases, create, drop, dropDatabase, collStats,
 * dbStats, endSessions, explain (of find, count, distinct, aggregate,
 * update, delete). Any other: CommandNotFound (59) with "no such command:
 * 'foo'". Global fields (lsid, $readPreference, $clusterTime, txnNumber,
 * writeConcern, readConcern, comment, maxTimeMS, apiVersion) are accepted
 * and ignored.
 *
 * Clients: each connection or RPC session is a doc_client, which owns its
 * cursors; a client holds at most max_cursors open cursors (the oldest
 * idle one is closed for a new one past that) and the server at most
 * max_cursors_total; a cursor idle for cursor_idle_ms is closed. getMore
 * and killCursors on another client's cursor: CursorNotFound, as MongoDB
 * without auth scopes cursors to sessions.
 *
 * Threads: one thread owns a server, its store, and all its clients. */
#ifndef TERN_DOC_CMD_H
#define TERN_DOC_CMD_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "doc_store.h"

#ifdef __cplusplus
extern "C" {
#endif

struct doc_server;
struct doc_client;

struct doc_server_opts {
    unsigned max_cursors;        /* per client; 0 = 1024 */
    unsigned max_cursors_total;  /* 0 = 65536 */
    uint64_t cursor_idle_ms;     /* 0 = 10 minutes, as MongoDB */
    size_t max_batch_bytes;      /* a reply's batch; 0 = 16 MiB, as MongoDB */
    unsigned default_batch;      /* first batch of a find without batchSize; 0 = 101 */
    int32_t max_wire_version;    /* 0 = 17; min is always 0 */
    const char *version;         /* buildInfo's version; NULL = "6.0.0" */
};

/* The store must outlive the server. Closing it frees the clients still
 * open (so free a client before closing, or not at all). */
int doc_server_open(struct doc_store *store, const struct doc_server_opts *o,
                    struct doc_server **out);
void doc_server_close(struct doc_server *srv);

struct doc_store *doc_server_store(struct doc_server *srv);

/* A client of the server (a connection, an RPC session). `peer` is how
 * replies name it (whatsmyuri, connectionStatus); copied. NULL on out of
 * memory. Freeing kills its cursors. */
struct doc_client *doc_client_new(struct doc_server *srv, const char *peer);
void doc_client_free(struct doc_client *c);

/* A kind-1 section: `id` ("documents"), and `len` bytes of BSON documents
 * back to back at `docs` (checked here: a bad one is an InvalidBSON
 * reply). */
struct doc_seq {
    const char *id;
    size_t id_len;
    const uint8_t *docs;
    size_t len;
};

enum doc_cmd_flags {
    DOC_CMD_WROTE = 1,          /* the command wrote: send its reply only after
                                 * doc_server_sync() */
    DOC_CMD_READ = 2,           /* it read a replicated primary's store */
    DOC_CMD_W_ONE = 4,          /* a write's concern: w 0 or 1 */
    DOC_CMD_W_SHIFT = 8,        /* a write's w when a number over 1 (bits 8..15);
                                 * 0 there: majority */
    DOC_CMD_AWAIT = 1 << 16,    /* an awaitable hello: its reply may wait for
                                 * the topology to change (doc_client_await) */
};

/* A write's w as a number (0: majority). */
static inline unsigned doc_cmd_w(int flags)
{
    return ((unsigned)flags >> DOC_CMD_W_SHIFT) & 0xffu;
}

/* Run one command and build its reply into `reply` (an initialised,
 * empty bson_t of the caller's). Returns enum doc_cmd_flags. */
int doc_cmd_run(struct doc_client *c, const bson_t *cmd, const struct doc_seq *seqs,
                unsigned nseq, bson_t *reply);

/* Make the writes of every command run since the last call durable (one
 * group commit for all clients). <0 if that failed: the replies of those
 * commands must then be errors, not the ones built (the caller replaces
 * them with doc_cmd_sync_failed). */
int doc_server_sync(struct doc_server *srv, struct doc_err *e);
void doc_cmd_sync_failed(const struct doc_err *e, bson_t *reply);

/* ---- replication ----
 *
 * A server whose store is one replica of a shard (doc_repl.h) is told its
 * group. Then only the primary writes (others answer NotWritablePrimary)
 * and serves reads, but for reads whose $readPreference allows a
 * secondary, which a backup holding the whole shard serves; hello says
 * the member's role and, through `hello`, the set (setName, hosts,
 * primary, me, setVersion, electionId). A reply must wait before it goes
 * out: a write's until its concern (writeConcern.w, majority by default)
 * is met, a primary's read's until what it read is on a majority. The
 * caller does that wait: doc_server_hold gates an RPC request's reply;
 * doc_server_wait gives a ticket that doc_server_waited checks. */
struct repl;
struct repl_wait;
struct tern_req;

/* Appends the set's fields to a hello reply; `primary`: this member is. */
typedef void (*doc_hello_fn)(void *arg, bson_t *reply, bool primary);

/* r NULL: alone again. The group must outlive the server or be unset. */
void doc_server_replicate(struct doc_server *srv, struct repl *r, doc_hello_fn hello, void *arg);

bool doc_server_replicated(const struct doc_server *srv);

/* For the reply of a command that returned `flags`: gate it (RPC). */
void doc_server_hold(struct doc_server *srv, struct tern_req *req, int flags);

/* Must it wait? true with *w to check: 1 it may go, 0 not yet, -1 never
 * (*e says why: the reply becomes that error, PrimarySteppedDown when this
 * node lost its office, which drivers retry elsewhere). */
bool doc_server_wait(struct doc_server *srv, int flags, struct repl_wait *w);
int doc_server_waited(struct doc_server *srv, const struct repl_wait *w, struct doc_err *e);

/* ---- the topology and awaitable hello ----
 *
 * Every hello reply carries topologyVersion {processId, counter}: an
 * ObjectId made when the server opens, and a counter that goes up each
 * time what hello says of this member and its set changes (its role, the
 * primary, the hosts, setVersion, electionId). A driver that streams its
 * monitoring (MongoDB 4.4's awaitable hello: the server-monitoring spec)
 * sends hello with the topologyVersion it has and maxAwaitTimeMS; MongoDB
 * answers it when the counter moves past that, or after maxAwaitTimeMS.
 * The command layer answers every command at once, so the caller does
 * the waiting: doc_cmd_run returns DOC_CMD_AWAIT for such a hello (its
 * reply already built from the state now), and doc_client_await says
 * whether the client's version is the current one (then the reply may
 * wait) and for how long. A caller that does not wait just sends the
 * reply: the driver asks again. */

/* maxAwaitTimeMS is held to this: the reply goes by then at the latest. */
#define DOC_AWAIT_MAX_MS 60000u

struct doc_await {
    int64_t counter;        /* the topologyVersion counter the client's last
                             * hello reply reported */
    uint64_t max_ms;        /* its maxAwaitTimeMS, at most DOC_AWAIT_MAX_MS */
    bool current;           /* it came with the version that reply reports:
                             * it may wait for the counter to pass `counter` */
};

/* Of the client's last hello (an awaitable one for max_ms and current). */
void doc_client_await(const struct doc_client *c, struct doc_await *a);

/* The topology counter now: what hello would say is looked at, and the
 * counter goes up if that differs from what it said last. Cheap enough
 * for a gateway to call every millisecond or so while a hello waits. */
int64_t doc_server_topology(struct doc_server *srv);

/* Close cursors idle past cursor_idle_ms; call now and then. */
void doc_server_tick(struct doc_server *srv, uint64_t now_ms);

struct doc_server_stats {
    uint64_t commands, inserts, queries, updates, deletes, getmores;
    uint64_t cursors_open, cursors_timed_out;
    uint64_t retried;            /* retryable writes answered from their record */
};
void doc_server_stats(const struct doc_server *srv, struct doc_server_stats *st);

#ifdef __cplusplus
}
#endif

#endif
