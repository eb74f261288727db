/* Shards in etcd: the map of each shard (its replicas, its epoch and its
 * primary) and the election of its primary.
 *
 *   PREFIX/shards/ID/map       {"id":..,"epoch":N,"primary":"NAME"|"","replicas":[..]}
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

struct cl_shard_map {
    char id[CL_NAME_MAX];
    uint64_t epoch;                 /* 0: no primary was ever elected */
    char primary[CL_NAME_MAX];      /* as of that epoch ("" before the first) */
    unsigned n_replicas;
    char replicas[CL_REPLICAS_MAX][CL_NAME_MAX];
};

enum cl_role { CL_ROLE_NONE = 0, CL_ROLE_PRIMARY, CL_ROLE_BACKUP };

/* The map as JSON into buf (NUL-terminated); its length, or TERN_E2BIG. */
int cl_shard_map_json(const struct cl_shard_map *m, char *buf, size_t len);

/* A map from etcd (any bytes): 0 or TERN_EPROTO for anything that is not
 * a map with sound names (as a node's), 1..CL_REPLICAS_MAX distinct
 * replicas, a primary that is one of them or "". */
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

/* One step of the election for replica `me` holding `lease`: take the
 * office if it is free and `candidate` (then raise the epoch), or learn who
 * holds it (a replica that is not a candidate keeps an office it holds).
 * *role: PRIMARY (this node, at out->epoch), BACKUP (out->primary holds
 * it), NONE (not a replica of the shard, or the holder has not yet written
 * its epoch: ask again). */
int cl_shard_campaign(struct cl_etcd *e, const char *prefix, const char *id, const char *me,
                      int64_t lease, bool candidate, struct cl_shard_map *out,
                      enum cl_role *role);

#endif
