/* ternd's replicated KV store ([cluster] kv_shard): the store is one shard
 * of a replication group (services/repl) whose view comes from the
 * membership thread (services/cluster): who is primary at which epoch, and
 * where the replicas listen.
 *
 * Threads: everything here runs on ternd's serving thread; the status it
 * publishes (ternd_replica_status) is a copy any thread may read.
 */
#ifndef TERND_REPLICA_H
#define TERND_REPLICA_H

#include "kv.h"
#include "node.h"
#include "opts.h"
#include "repl.h"

struct ternd_replica;

/* Replicate `svc` as shard o->kv_shard on `ep`, with the state file in
 * o->data_dir. The view comes from n's membership. TERN_ENOTSUP without
 * the cluster code; the errors of repl_open. */
int ternd_replica_open(const struct ternd_opts *o, struct ternd_node *n,
                       struct tern_rpc_ep *ep, struct tern_kv_service *svc,
                       struct ternd_replica **out);

/* Each pass of the serving loop: the view (every 20 ms), then repl_tick. */
void ternd_replica_tick(struct ternd_replica *r);

/* The last status published (every 100 ms), for STATUS and the metrics:
 * false if there is none. Any thread. */
bool ternd_replica_status(struct ternd_replica *r, struct repl_status *out);

/* Stop replicating (held replies fail, sessions to the replicas close):
 * before the endpoint closes. Then, after it closed, free. */
void ternd_replica_close(struct ternd_replica *r);
void ternd_replica_free(struct ternd_replica *r);

#endif
