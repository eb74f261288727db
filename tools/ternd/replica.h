/* ternd's replicated stores ([cluster] kv_shard, doc_shard): each store is
 * one shard of a replication group (services/repl) whose view comes from
 * the membership thread (services/cluster): who is primary at which epoch,
 * and where the replicas listen. The groups share the endpoint's
 * replication service.
 *
 * Threads: everything here runs on ternd's serving thread; the status it
 * publishes (ternd_replica_status) is a copy any thread may read.
 */
#ifndef TERND_REPLICA_H
#define TERND_REPLICA_H

#include "node.h"
#include "opts.h"
#include "repl.h"

struct ternd_replica;
struct cl_shard_role;

/* What is replicated, and how the service learns of its group. */
struct ternd_replica_def {
    const char *shard;              /* one of [cluster] shard */
    const char *state_file;         /* in data_dir: "kv.repl" */
    const struct repl_store_ops *ops;
    void *ctx;                      /* the ops' */
    /* Tell the service its group (NULL: it stands alone again). */
    void (*attach)(void *arg, struct repl *r);
    void *attach_arg;
};

/* Replicate def's store on `ep`. The view comes from n's membership.
 * TERN_ENOTSUP without the cluster code; the errors of repl_open. */
int ternd_replica_open(const struct ternd_opts *o, struct ternd_node *n,
                       struct tern_rpc_ep *ep, const struct ternd_replica_def *def,
                       struct ternd_replica **out);

/* Each pass of the serving loop, `now` its tern_now_ns(): the view (every
 * 20 ms), then repl_tick; its answer (true: replies may be free to go,
 * poll again at once). */
bool ternd_replica_tick(struct ternd_replica *r, uint64_t now);

/* The last status published (every 100 ms), for STATUS and the metrics:
 * false if there is none. Any thread. */
bool ternd_replica_status(struct ternd_replica *r, struct repl_status *out);

/* The shard's name. */
const char *ternd_replica_shard(const struct ternd_replica *r);

/* The membership's word on the shard (cl_member_role): false without one. */
bool ternd_replica_role(struct ternd_replica *r, struct cl_shard_role *out);

/* Stop replicating (held replies fail, sessions to the replicas close):
 * before the endpoint closes. Then, after it closed, free. */
void ternd_replica_close(struct ternd_replica *r);
void ternd_replica_free(struct ternd_replica *r);

#endif
