/* Shards in etcd: the map of each shard (its replicas, its epoch and its
 * primary) and the election of its primary.
 *
 *   PREFIX/shards/ID/map       {"id":..,"epoch":N,"primary":"NAME"|"","replicas":[..],
 *                               "learners":[..],"leaving":"NAME"}   (the last two optional)
 *   PREFIX/shards/ID/primary   the office: "NAME", under the holder's lease
 *
 * A replica campaigns by creating the office under its node's lease (the
 * membership lease, so that a node's death ends its term); the winner then
 * raises the epoch in the map by compare-and-swap. Epochs only grow: every
 * replication message carries one, and a replica refuses an older epoch
 * than it has seen, which fences a deposed primary. A primary also knows
 * when its lease is surely alive by its own clock (cl_member_role's
 * lease_alive); when it is not sure (etcd does not answer), it acts only
 * on what a majority of its replicas confirms at its epoch, which no
 * successor can have fenced yet. */
#ifndef TERN_CLUSTER_SHARD_H
#define TERN_CLUSTER_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"

#define CL_NAME_MAX 64
#define CL_REPLICAS_MAX 7

/* What a replica counts for. Members change one at a time, in two steps
 * each, so that any majority a primary acknowledged a write on meets any
 * majority a successor hears from, whichever map each of them read:
 *
 * - `tern shard add` makes a node a LEARNER: the primary ships to it (a
 *   full copy first) but it counts in no majority and never stands. Once
 *   it holds every acknowledged write, the primary counts it in (writes
 *   then need a majority with it and without it) and makes it a VOTER
 *   (cl_shard_change PROMOTE).
 * - `tern shard remove` marks a voter LEAVING (a learner simply goes):
 *   writes then need a majority with it and without it, it never stands,
 *   and a primary that is leaving hands its office to a backup that holds
 *   all it wrote (cl_shard_resign). The primary drops it from the map
 *   (DROP) once a majority without it holds every acknowledged write.
 *
 * At most one change is under way: one learner, or one voter leaving. */
enum cl_vote { CL_VOTER = 0, CL_LEARNER, CL_LEAVING };

struct cl_shard_map {
    char id[CL_NAME_MAX];
    uint64_t epoch;                 /* 0: no primary was ever elected */
    char primary[CL_NAME_MAX];      /* as of that epoch ("" before the first): a voter */
    unsigned n_replicas;            /* voters (leaving ones included), then learners */
    char replicas[CL_REPLICAS_MAX][CL_NAME_MAX];
    uint8_t vote[CL_REPLICAS_MAX];  /* enum cl_vote of each */
};

enum cl_role { CL_ROLE_NONE = 0, CL_ROLE_PRIMARY, CL_ROLE_BACKUP };

/* The map as JSON into buf (NUL-terminated); its length, or TERN_E2BIG. */
int cl_shard_map_json(const struct cl_shard_map *m, char *buf, size_t len);

/* A map from etcd (any bytes): 0 or TERN_EPROTO for anything that is not
 * a map with sound names (as a node's), 1..CL_REPLICAS_MAX distinct
 * replicas (learners included) of which at least one votes, a primary
 * that is a voter or "", at most one change under way (one learner, or
 * one leaving voter, never the only one). */
int cl_shard_map_parse(const uint8_t *json, size_t len, struct cl_shard_map *out);

/* A node's registration (PREFIX/nodes/NAME, what ternd puts there: a JSON
 * object whose "listen" is an array of URIs): its first tcp:// URI, as
 * "HOST:PORT" in out (NUL-terminated). TERN_ENOENT if it lists none,
 * TERN_EPROTO for anything that is not such an object, TERN_E2BIG. */
int cl_node_tcp_addr(const uint8_t *json, size_t len, char *out, size_t cap);

/* The same registration's MongoDB gateway ("mongo": "HOST:PORT"), in out.
 * TERN_ENOENT if it has none, TERN_EPROTO, TERN_E2BIG as above. */
int cl_node_mongo_addr(const uint8_t *json, size_t len, char *out, size_t cap);

/* Define a shard (epoch 0, no primary) if it is not there: an operator's
 * or a tool's step. TERN_EEXIST if it is. */
int cl_shard_define(struct cl_etcd *e, const char *prefix, const struct cl_shard_map *m);

/* The shard's map and its mod revision. TERN_ENOENT if undefined. */
int cl_shard_get(struct cl_etcd *e, const char *prefix, const char *id, struct cl_shard_map *out,
                 int64_t *mod_rev);

/* A change of the shard's members, by compare-and-swap on its map (out,
 * if not NULL, is the map as changed).
 *
 *   ADD      `name` becomes a learner; a leaving voter stays a voter (the
 *            removal is called off). TERN_EEXIST if it is a replica.
 *   REMOVE   a learner goes at once; a voter is marked leaving.
 *            TERN_ENOENT if it is no replica; TERN_EINVAL for the only voter.
 *   PROMOTE  the primary's step: the learner `name` becomes a voter.
 *   DROP     the primary's step: the leaving voter `name` goes.
 *
 * ADD and REMOVE are an operator's: TERN_EBUSY while another change is
 * under way (REMOVE of the learner being added excepted), TERN_E2BIG past
 * CL_REPLICAS_MAX. PROMOTE and DROP are made only while the map is at
 * `epoch` with `primary` its primary, and `name` still in that step (and
 * not the primary: a leaving primary resigns first): TERN_ESTALE otherwise. TERN_ENOENT for an undefined shard. */
enum cl_shard_op { CL_OP_ADD, CL_OP_REMOVE, CL_OP_PROMOTE, CL_OP_DROP };
int cl_shard_change(struct cl_etcd *e, const char *prefix, const char *id, enum cl_shard_op op,
                    const char *name, uint64_t epoch, const char *primary,
                    struct cl_shard_map *out);

/* The same change on a map in memory (no etcd): 0 (changed), 1 (nothing
 * to change: the voter is leaving already), or the errors above. A map
 * that was sound stays sound. */
int cl_shard_map_change(struct cl_shard_map *m, enum cl_shard_op op, const char *name,
                        uint64_t epoch, const char *primary);

/* A leaving primary gives up its office (held under `lease`), so that a
 * voter that holds all it wrote is elected. 0 also if it no longer holds
 * it. */
int cl_shard_resign(struct cl_etcd *e, const char *prefix, const char *id, int64_t lease);

/* One step of the election for replica `me` holding `lease`: take the
 * office if it is free and `candidate` (then raise the epoch), or learn who
 * holds it (a replica that is not a candidate keeps an office it holds).
 * *role: PRIMARY (this node, at out->epoch), BACKUP (out->primary holds
 * it), NONE (not a replica of the shard, or the holder has not yet written
 * its epoch: ask again). A learner or a leaving voter never takes the
 * office (it is no candidate); a learner is a BACKUP of the primary. */
int cl_shard_campaign(struct cl_etcd *e, const char *prefix, const char *id, const char *me,
                      int64_t lease, bool candidate, struct cl_shard_map *out,
                      enum cl_role *role);

#endif
