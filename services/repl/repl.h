/* Replication groups: a shard's store kept on a primary and its backups.
 *
 * The service whose store is replicated (services/kv) reports every write
 * it makes to the group (repl_written), holds each write's reply until the
 * write concern is met (repl_hold), and lets the group write shipped
 * records into the store (struct repl_store_ops). The cluster
 * (services/cluster, through ternd) tells the group who is primary at
 * which epoch and who the replicas are (repl_set_view); the group does the
 * rest over tern RPC on the endpoint it was opened on:
 *
 * - a primary ships its log to every backup (APPEND batches, repl_wire.h),
 *   and a write is acknowledged once `w` replicas, itself included, hold
 *   it durably: w=1 (the primary alone), majority, or all;
 * - a backup applies batches that follow its position, durably, and
 *   answers its new position; it refuses any epoch older than the newest it
 *   has seen (kept in a small state file: fencing survives a restart);
 * - a node that becomes primary first fences the others with its epoch
 *   and learns their positions (POSITION); with a majority heard from, it
 *   takes the records it lacks from the most advanced one (FETCH), and
 *   only then accepts writes. Any write acknowledged with w=majority is on
 *   a majority, so on one of those it heard from: none is lost.
 *
 * A replica whose log parted from the primary's (it held records no
 * majority acknowledged), or that fell behind what the primary's DRAM log
 * reaches back to, or a new one, gets a full copy of the shard from the
 * primary (COPY, repl_wire.h) while the shard keeps serving, then the
 * records written meanwhile.
 *
 * Threads: everything runs on the endpoint's thread; repl_tick() is called
 * from that thread's loop, outside tern_rpc_poll, often (each pass).
 */
#ifndef TERN_REPL_H
#define TERN_REPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "repl_wire.h"
#include "rpc.h"

#define REPL_PEERS_MAX 7
#define REPL_URI_MAX 256

/* What the group needs of the replicated store. */
struct repl_store_ops {
    /* Write a shipped record under its version (kvs_apply): idempotent. */
    int (*apply)(void *ctx, uint8_t type, const void *key, uint16_t key_len,
                 const void *val, uint32_t val_len, uint64_t version);
    /* Make what was applied durable. */
    int (*sync)(void *ctx);
    /* The highest version the store holds (durable after a restart). */
    uint64_t (*position)(void *ctx);
    /* New versions from now on above v (a new epoch's base). */
    void (*raise)(void *ctx, uint64_t v);
    /* Empty the store (a full copy comes). */
    int (*wipe)(void *ctx);
    /* A full copy's next piece: live records from `cursor` on (0 at the
     * start), written to dst in wire form (repl_rec_write) up to cap
     * bytes; their bytes, with *n and *next (0: the scan is done) set.
     * Never a record cut short; TERN_E2BIG if one cannot fit at all. */
    long (*snapshot)(void *ctx, uint64_t cursor, void *dst, size_t cap, uint32_t *n,
                     uint64_t *next);
};

enum repl_role { REPL_NONE = 0, REPL_PRIMARY, REPL_BACKUP };

/* Write concerns: how many replicas must hold a write before its reply. */
enum repl_w { REPL_W_MAJORITY = 0, REPL_W_ONE = 1, REPL_W_ALL = 2 };

/* What a replica counts for, as the shard's map says (cl_vote, shard.h):
 * a voter; a learner being added (shipped to, counted in no majority,
 * never primary); a voter leaving (counted until it is dropped, never
 * primary again). While a member changes, a write needs a majority of
 * the voters with the change and one without it, so that whichever map a
 * successor read, the majority it hears from holds every acknowledged
 * write. */
enum repl_vote { REPL_VOTER = 0, REPL_LEARNER, REPL_LEAVING };

struct repl_peer {
    char name[64];
    char uri[REPL_URI_MAX];         /* "auto://host:port"; "" if unknown */
    uint8_t vote;                   /* enum repl_vote */
};

struct repl_config {
    const char *shard;              /* its name, < REPL_SHARD_MAX bytes */
    const char *me;                 /* this node's name (as in the map) */
    const char *state_path;         /* the state file (epoch seen) */
    size_t log_bytes;               /* the DRAM log; 0 = 32 MiB */
    uint64_t timeout_ns;            /* a call to a replica; 0 = 1 s */
    const struct repl_store_ops *ops;
    void *ctx;
    /* One-sided shipping (repl_ring.h): this replica's ring of ring_bytes
     * (0 = 8 MiB) beside the state file, and how this node, as primary,
     * ships to its backups (enum repl_ship). */
    uint32_t ring_bytes;
    uint8_t ship;
};

/* How a primary ships: into a backup's ring where that makes the records
 * durable without the backup's CPU (its ring mapped here, or on PM and
 * read back), by call elsewhere (AUTO); into the ring wherever the fabric
 * can put, with a RING_SYNC call where the put alone is not durable
 * (ONESIDED); always by call (CALL). */
enum repl_ship { REPL_SHIP_AUTO = 0, REPL_SHIP_ONESIDED = 1, REPL_SHIP_CALL = 2 };

struct repl_host;
struct repl;

/* The replication service on `ep` (one per endpoint, shared by its
 * groups). TERN_EEXIST if `ep` has one. */
int repl_host_open(struct tern_rpc_ep *ep, struct repl_host **out);
void repl_host_close(struct repl_host *h);

/* A group for one shard. The store's position is read now. Errors:
 * TERN_EINVAL, TERN_EEXIST (the host has the shard), TERN_ENOMEM, the
 * state file's (TERN_ECORRUPT, TERN_EIO). */
int repl_open(struct repl_host *h, const struct repl_config *c, struct repl **out);

/* Fail the held replies (TERN_ESHUTDOWN), close sessions, free. */
void repl_close(struct repl *r);

/* The cluster's view: this node's role at `epoch`, the primary's name, and
 * the shard's replicas (this node among them, by name). A new epoch with
 * PRIMARY starts the takeover; losing PRIMARY fails the held replies with
 * TERN_ENOTPRIMARY. Cheap when nothing changed: call it every pass. */
void repl_set_view(struct repl *r, enum repl_role role, uint64_t epoch, const char *primary,
                   const struct repl_peer *replicas, unsigned n);

/* Whether the cluster's lease on this node's office is surely alive (by
 * default it is). A primary whose lease is in doubt (etcd does not answer:
 * it may be down, or this node cut off from it, and then a successor may
 * be elected) keeps serving, but only what a majority of replicas
 * confirms at its epoch: every write waits for a majority whatever its
 * concern, and every read for a round of acknowledgments sent after it
 * came (a successor must fence a majority before it serves, so a read
 * confirmed so cannot miss one of its writes). Call it with the view. */
void repl_set_lease(struct repl *r, bool alive);

/* 0 if this node takes writes now; TERN_ENOTPRIMARY otherwise (a backup,
 * or a primary still taking over). */
int repl_writable(const struct repl *r);

/* The store made a write (its tap): into the log, to be shipped. */
void repl_written(struct repl *r, uint8_t type, const void *key, uint16_t key_len,
                  const void *val, uint32_t val_len, uint64_t version);

/* Hold req's reply until the newest write is held by `w` replicas. */
void repl_hold(struct repl *r, struct tern_req *req, enum repl_w w);

/* Hold a read's reply until `version` is on a majority (a read must not
 * show a write that could still be lost); nothing if it is already. */
void repl_hold_read(struct repl *r, struct tern_req *req, uint64_t version);

/* Waits outside RPC, for a service that answers by other means (the
 * MongoDB gateway): what repl_hold and repl_hold_read do with a gate, as a
 * ticket the caller checks each pass. A wait that is not needed gives
 * false (send the reply now). */
struct repl_wait {
    uint8_t kind;
    uint64_t target;
    uint64_t gen;
};
bool repl_wait_write(struct repl *r, enum repl_w w, struct repl_wait *out);
bool repl_wait_read(struct repl *r, uint64_t version, struct repl_wait *out);

/* 1: the reply may go; 0: not yet; <0: never (the code the gates failed
 * with: TERN_ENOTPRIMARY when this node lost its office). */
int repl_wait_check(struct repl *r, const struct repl_wait *w);

/* A backup whose store is whole (not in a full copy, not waiting for
 * one): it may answer reads that accept data a little behind. */
bool repl_consistent(const struct repl *r);

/* Should this replica stand for primary now (cl_member_set_candidate)?
 * Yes while it is primary, and once it has caught up with a primary's
 * stream (applied a batch at the current epoch reaching the commit point
 * that batch named); a replica just started, or taking a full copy, stands
 * back, so that the election prefers one that holds the newest log. Yes
 * also once the view has had no primary for `quiet_ns`: replicas that all
 * restarted must still elect one (the takeover then fetches what the
 * winner lacks). */
bool repl_candidate(struct repl *r, uint64_t quiet_ns);

/* The step on the shard's members this primary finds due (the cluster
 * makes it in etcd: cl_member_step), with the replica's name in name:
 * - PROMOTE: the learner holds every acknowledged write; from now on
 *   writes need it in a majority too, and the map may make it a voter;
 * - DROP: a majority without the leaving voter holds every acknowledged
 *   write: the map may drop it;
 * - RESIGN: this primary is leaving, takes no more writes, and a voter
 *   that stays holds all it wrote: it may give up its office.
 * NONE otherwise. The view brings the map as changed. */
enum repl_step { REPL_STEP_NONE = 0, REPL_STEP_PROMOTE, REPL_STEP_DROP, REPL_STEP_RESIGN };
enum repl_step repl_members_step(const struct repl *r, char name[64]);

/* The other replicas' addresses as the view names them ("host:port",
 * the scheme left off), each NUL-terminated, one after the other, into
 * buf: the bytes written (an address that does not fit is left out). For
 * clients that learn the shard's members from any replica. */
size_t repl_member_addrs(const struct repl *r, char *buf, size_t cap);

/* Connect to replicas, ship, take over; on a backup, take the frames its
 * ring holds. Outside tern_rpc_poll. True if it shipped or committed
 * anything: replies may be free to go (records shipped one-sided make no
 * event a loop could sleep on, so a loop that would block should poll
 * again at once). Frames taken on a backup do not count: they free no
 * reply, and a backup fed one-sided may sleep until a call wakes it (the
 * primary calls when the ring is full) or its loop's timeout. */
bool repl_tick(struct repl *r);

struct repl_replica_status {
    char name[64];
    const char *state;              /* "self", "streaming", "connecting", "needs copy", ... */
    uint64_t position;              /* as last acknowledged */
    uint64_t lag;                   /* records behind the primary's last (primary) */
    const char *path;               /* "one-sided", "one-sided, synced by call", "call" */
    const char *vote;               /* "voter", "learner", "joining" (a learner counted
                                     * in), "leaving" */
};

struct repl_status {
    enum repl_role role;
    const char *state;              /* "primary", "taking over", "backup", "none" */
    uint64_t epoch;                 /* the view's */
    uint64_t epoch_seen;            /* the newest this replica accepted */
    uint64_t position;              /* this replica's last durable version */
    uint64_t committed;             /* primary: on a majority */
    uint64_t log_base;              /* the DRAM log reaches back to here */
    uint64_t shipped_batches, applied_records, refused_stale;
    uint64_t copies_sent, copies_taken;     /* full copies made from / to here */
    bool copying;                   /* a full copy is coming in */
    unsigned held;                  /* replies waiting */
    bool lease_doubt;               /* repl_set_lease(false) */
    const char *vote;               /* this replica's, as for the others */
    bool handing_over;              /* leaving primary: no more writes */
    unsigned n;
    struct repl_replica_status replicas[REPL_PEERS_MAX];
};

void repl_status(const struct repl *r, struct repl_status *out);

#endif
