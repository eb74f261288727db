/* A node's membership: its key PREFIX/nodes/NAME in etcd, attached to a
 * lease that a thread of its own renews every third of the lease's time.
 * A node that dies or is cut off stops renewing, and etcd drops the key
 * when the lease runs out; one that is stopped revokes the lease, and the
 * key goes at once. While etcd is away the node keeps running (etcd is
 * never on a data path) and keeps renewing the lease it holds: etcd keeps
 * leases across its restarts (and extends them when it comes back), so the
 * key and the node's offices are usually still its own; only when etcd
 * says the lease is gone does the thread register the node again. Two live nodes of one name: the second is refused (the key is
 * taken with a create-if-absent transaction) and keeps trying, saying so.
 * The same thread runs the elections of the node's shards (shard.h). */
#ifndef TERN_CLUSTER_MEMBER_H
#define TERN_CLUSTER_MEMBER_H

#include <stdbool.h>
#include <stdint.h>

#include "etcd.h"
#include "shard.h"

#define CL_SHARDS_MAX 16

struct cl_member_config {
    const char *endpoints;      /* etcd's URLs (cl_etcd_open) */
    const char *prefix;         /* "/tern" */
    const char *name;           /* the node's name: letters, digits, . _ - */
    const char *value;          /* what the key holds (the node's JSON) */
    unsigned ttl_s;             /* the lease, >= 2 */
    /* Shards this node replicates (their maps defined in etcd): the
     * thread campaigns for each one's office under the node's lease. */
    const char *shards[CL_SHARDS_MAX];
    unsigned n_shards;
};

#define CL_ADDR_MAX 128

/* This node's part in a shard, as the thread last learned it, with the
 * shard's replicas and where each listens (its first tcp:// address,
 * "HOST:PORT", from its registration; "" while it is not registered). */
struct cl_shard_role {
    enum cl_role role;
    uint64_t epoch;
    char primary[CL_NAME_MAX];
    unsigned n_replicas;
    char replicas[CL_REPLICAS_MAX][CL_NAME_MAX];
    uint8_t vote[CL_REPLICAS_MAX];                /* enum cl_vote */
    char addrs[CL_REPLICAS_MAX][CL_ADDR_MAX];
    char mongo[CL_REPLICAS_MAX][CL_ADDR_MAX];   /* its MongoDB gateway, or "" */
    /* The lease was renewed less than three quarters of it ago, by this
     * node's clock: its term surely holds. False while etcd does not
     * answer: a PRIMARY then keeps its role (nobody can be elected without
     * etcd) but may act only on what a majority of its replicas confirms
     * at its epoch (repl_set_lease). */
    bool lease_alive;
};

struct cl_member_state {
    bool registered;            /* the key is ours and the lease alive, as last seen */
    int64_t lease;              /* its id (0: none) */
    uint64_t registrations;     /* times the key was put (1 + re-registrations) */
    char error[256];            /* why it is not registered ("" when it is) */
};

struct cl_member;

/* Copy the configuration and start the thread. TERN_EINVAL for a bad
 * configuration, TERN_ENOMEM. The first registration happens on the
 * thread: cl_member_state says when. */
int cl_member_start(const struct cl_member_config *cfg, struct cl_member **out);

/* A consistent copy of the state. Any thread. */
void cl_member_state(struct cl_member *m, struct cl_member_state *out);

/* This node's role in shard `id` as last learned, with lease_alive saying
 * whether its term surely holds now. The role stays while etcd does not
 * answer, and goes (NONE) once etcd says the lease ran out. TERN_ENOENT
 * for a shard not in the configuration. Any thread. */
int cl_member_role(struct cl_member *m, const char *id, struct cl_shard_role *out);

/* Whether this node stands for the office of shard `id` (by default it
 * does): a replica far behind the others stands back until it has caught
 * up, so that the election does not make it primary. TERN_ENOENT for a
 * shard not in the configuration. Any thread; the next campaign step
 * takes it. */
int cl_member_set_candidate(struct cl_member *m, const char *id, bool candidate);

/* A primary's step on its shard's members (shard.h), as its replication
 * group finds it due: PROMOTE the learner `name` (it holds every
 * acknowledged write), DROP the leaving voter `name` (a majority without
 * it holds them), or RESIGN (this primary is leaving and a voter holds all
 * it wrote; `name` unused). Taken at `epoch` only: the thread makes it at
 * its next step, woken now, and the next campaign brings the new map.
 * Repeating a step asked for or made is free. TERN_ENOENT for a shard not
 * in the configuration. Any thread. */
enum cl_step { CL_STEP_NONE = 0, CL_STEP_PROMOTE, CL_STEP_DROP, CL_STEP_RESIGN };
int cl_member_step(struct cl_member *m, const char *id, uint64_t epoch, enum cl_step step,
                   const char *name);

/* Stop the thread and revoke the lease (the key goes with it; if etcd is
 * away, it goes when the lease runs out). */
void cl_member_stop(struct cl_member *m);

/* The node keys under `prefix` (PREFIX/nodes/...), to fn. */
int cl_members(struct cl_etcd *e, const char *prefix, cl_kv_fn fn, void *arg);

#endif
