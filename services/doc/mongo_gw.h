/* A MongoDB wire-protocol gateway onto a document server (doc_cmd.h), so
 * that pymongo, libmongoc, mongosh and other drivers work unchanged.
 *
 * It works as the RESP gateway (services/kv/resp.h) does. It runs on the
 * thread that owns the server. Each poll reads every ready client, runs
 * every complete message it finds through the command layer, makes the
 * batch's writes durable with one doc_server_sync(), and only then sends
 * the replies: an acknowledged write is persistent. If that sync fails,
 * the replies of the batch's writing commands become errors
 * (doc_cmd_sync_failed) before anything is sent.
 *
 * Each connection is a doc_client (its cursors), freed when it closes.
 * A message that parses badly gets an error reply and the connection goes
 * on; a stream that cannot be framed any more (a header's length below 16
 * or past max_request) gets one error reply and is closed (mongo_wire.h).
 * moreToCome requests get no reply, whatever happens to them.
 *
 * A client's unsent replies are held to max_output: its messages wait
 * unread while more than that is queued, so a client that never reads
 * cannot make the gateway's memory grow; everyone else is served on.
 *
 * On a replicated server a reply may have to wait for the replicas (a
 * write's concern, a primary's read: doc_cmd.h). Then it stays in the
 * client's output, unsent, and the client's next messages wait unrun
 * until each poll finds it may go, or must become an error instead
 * (PrimarySteppedDown). A driver sends one command at a time on a
 * connection, so this costs it nothing, and a client has at most one
 * reply waiting.
 *
 * An awaitable hello (doc_cmd.h: topologyVersion and maxAwaitTimeMS) whose
 * client knows the topology as it is now is answered when the topology
 * counter moves, or after maxAwaitTimeMS (at most DOC_AWAIT_MAX_MS). The
 * gateway looks at the counter about once a millisecond of polling while
 * any hello waits, and its poll then sleeps at most 100 ms. The client's
 * connection is not read meanwhile (one waiting hello per connection, and
 * nothing else of it run), but its closing is noticed. If the request
 * allowed exhaust (OP_MSG exhaustAllowed), the answer has moreToCome set
 * and the gateway streams: it waits again on the version just sent, with
 * the same maxAwaitTimeMS, and sends each next answer addressed to its
 * previous one (responseTo, as MongoDB does), until the client closes.
 * The reply is built when it goes, from the hello as it came less its
 * awaiting fields (a copy kept per connection, its buffer reused).
 */
#ifndef TERN_MONGO_GW_H
#define TERN_MONGO_GW_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "doc_cmd.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mongo_gw;

/* What the gateway runs commands with: the doc_cmd functions, unless a
 * test puts a runner of its own in their place. */
struct mongo_gw_runner {
    struct doc_client *(*client_new)(struct doc_server *srv, const char *peer);
    void (*client_free)(struct doc_client *c);
    int (*run)(struct doc_client *c, const bson_t *cmd, const struct doc_seq *seqs,
               unsigned nseq, bson_t *reply);
    int (*sync)(struct doc_server *srv, struct doc_err *e);
    void (*sync_failed)(const struct doc_err *e, bson_t *reply);
    void (*tick)(struct doc_server *srv, uint64_t now_ms);
    /* A replicated server's replies that must wait (doc_server_wait,
     * doc_server_waited); NULL: none ever does. */
    bool (*wait)(struct doc_server *srv, int flags, struct repl_wait *w);
    int (*waited)(struct doc_server *srv, const struct repl_wait *w, struct doc_err *e);
    /* Awaitable hello (doc_client_await, doc_server_topology); NULL: every
     * hello is answered at once. */
    void (*await)(const struct doc_client *c, struct doc_await *a);
    int64_t (*topology)(struct doc_server *srv);
};

struct mongo_gw_config {
    const char *host;            /* listen address; NULL = 127.0.0.1 */
    uint16_t port;               /* 0 picks one (see mongo_gw_port) */
    unsigned max_clients;        /* 0 = 1024; further clients are refused */
    size_t max_request;          /* largest message; 0 (and at most) =
                                    MONGO_MAX_MESSAGE */
    size_t max_output;           /* unsent reply bytes past which a client's
                                    messages wait; 0 = 64 MiB */
    const struct mongo_gw_runner *runner;   /* NULL = the doc_cmd functions */
};

/* Listen and serve `srv` (which must outlive the gateway). */
int mongo_gw_create(struct doc_server *srv, const struct mongo_gw_config *cfg,
                    struct mongo_gw **out);

/* The TCP port the gateway listens on. */
uint16_t mongo_gw_port(const struct mongo_gw *gw);

/* An fd (epoll) that is readable when some client needs service. */
int mongo_gw_fd(const struct mongo_gw *gw);

/* Serve every ready client, waiting up to timeout_ms (0: do not wait) for
 * one. Returns the number of messages run, or a negative tern code. Calls
 * doc_server_tick() about once a second. */
int mongo_gw_poll(struct mongo_gw *gw, int timeout_ms);

/* Have the gateway's poll also wake when `fd` polls readable (the RPC
 * endpoint's tern_rpc_wait_fd), so that one thread sleeps in
 * mongo_gw_poll() for both: one system call per wake-up. The gateway
 * never reads fd. One fd at most; TERN_EINVAL for a second. */
int mongo_gw_watch_fd(struct mongo_gw *gw, int fd);

/* True if the watched fd was readable at the last mongo_gw_poll(). */
bool mongo_gw_watch_ready(const struct mongo_gw *gw);

/* Serve an already connected, non-blocking stream socket as a client, as
 * if the gateway had accepted it (for the fuzz target and tests).
 * TERN_ENOBUFS at max_clients, TERN_ENOMEM. */
int mongo_gw_adopt(struct mongo_gw *gw, int fd);

struct mongo_gw_stats {
    uint64_t connections, messages, errors;  /* errors: messages refused by the wire
                                                layer, and framing failures */
    uint64_t syncs, sync_failures;
    uint64_t awaited;            /* awaitable hellos that waited */
    unsigned clients, awaiting;  /* awaiting: hellos waiting now */
};
void mongo_gw_stats(const struct mongo_gw *gw, struct mongo_gw_stats *st);

/* Close every client and the listener. */
void mongo_gw_destroy(struct mongo_gw *gw);

#ifdef __cplusplus
}
#endif

#endif
