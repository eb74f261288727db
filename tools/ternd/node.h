/* ternd's view of itself and of its peers (node.c).
 *
 * - The node service (tools/common/node_proto.h) on the serving endpoint:
 *   PING, and STATUS as JSON for `tern status`.
 * - A peers thread with an endpoint of its own keeps an auto:// session
 *   to every [peer NAME] of the configuration, with the fabric policy the
 *   topology gives it ([policy]: subnet rules, then same or other rack),
 *   pings each every 200 ms (liveness; a dead path is found and left
 *   within a ping), reconnects the lost ones (backoff 0.5 s to 5 s), and
 *   publishes what it sees under a mutex: the serving thread and the
 *   metrics thread read that, never the sessions.
 * - With metrics_port, Prometheus text on http://127.0.0.1:PORT/metrics
 *   (libmicrohttpd, its own thread): the same counters as STATUS.
 *
 * Threads: ternd_node_* are called from ternd's serving thread only.
 */
#ifndef TERND_NODE_H
#define TERND_NODE_H

#include "opts.h"
#include "rpc.h"

struct ternd_node;

/* Start the peers thread and, with o->metrics_port >= 0, the metrics
 * server; register the node service on `ep`. `services` names what ternd
 * hosts ("kv,doc,blocksync"). o must outlive the node. Errors are logged. */
int ternd_node_start(const struct ternd_opts *o, const char *services, struct tern_rpc_ep *ep,
                     struct ternd_node **out);

/* The port the metrics server listens on, or -1. */
int ternd_node_metrics_port(const struct ternd_node *n);

/* A reloaded [policy]: peers whose fabric policy changed reconnect. */
void ternd_node_set_policy(struct ternd_node *n, const struct ternd_policy *p);

/* The addresses ternd listens on, for STATUS (copied). */
void ternd_node_add_listen(struct ternd_node *n, const char *uri);

/* Stop the threads, close the peer sessions. NULL is a no-op. */
/* [cluster]: register in etcd (o->etcd) with what the node hosts and
 * its listen addresses (add them first); a thread keeps the registration
 * alive. 0 also without o->etcd; TERN_ENOTSUP if ternd was built without
 * libcurl. */
int ternd_node_join(struct ternd_node *n);

void ternd_node_stop(struct ternd_node *n);

/* The membership (NULL without [cluster] etcd or the cluster code). */
struct cl_member;
struct cl_member *ternd_node_member(struct ternd_node *n);

/* The replicated KV and document stores, for STATUS and the metrics
 * (replica.h). */
struct ternd_replica;
void ternd_node_set_replica(struct ternd_node *n, struct ternd_replica *r);
void ternd_node_set_doc_replica(struct ternd_node *n, struct ternd_replica *r);

/* Where the MongoDB gateway listens ("HOST:PORT"): in the registration
 * (ternd_node_join reads it), for the replica set's hosts. */
void ternd_node_set_mongo(struct ternd_node *n, const char *addr);

#endif
