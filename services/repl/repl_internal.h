/* What the files of services/repl share. */
#ifndef TERN_REPL_INTERNAL_H
#define TERN_REPL_INTERNAL_H

#include "log.h"
#include "repl.h"
#include "repl_log.h"
#include "repl_ring.h"

#define REPL_INFLIGHT 2                 /* batches in flight per replica */
#define REPL_BATCH_MAX (1088u * 1024)   /* a batch's bytes, header included: a
                                         * 1 MiB value and its headers fit */

/* Held replies wait behind gates: one per write concern (enum repl_w,
 * ticket: the write's version), and one for reads that need a majority to
 * confirm this primary after they came (ticket: the time they came). */
#define REPL_GATE_CONFIRM 3
#define REPL_GATES 4

struct replica;

/* A call to a replica, with the buffer its request lies in (tern_call
 * wants it until the continuation). `gen` is the replica's when it was
 * made: a continuation of an older generation does nothing. */
struct repl_call {
    struct replica *peer;
    uint32_t gen;
    bool busy;
    uint64_t sent_at;                   /* an APPEND that took the replica to the
                                         * log's end: when it was sent; else 0 */
    uint8_t *buf;                       /* REPL_BATCH_MAX bytes, made once */
};

enum replica_state { R_DOWN = 0, R_ASKED, R_STREAM, R_NEED_COPY };

/* Another replica of the shard, as the primary sees it. */
struct replica {
    struct repl *r;
    char name[64];
    char uri[REPL_URI_MAX];
    uint8_t vote;                       /* enum repl_vote */
    struct tern_session *s;
    enum replica_state state;
    bool answered;                      /* its position is known this epoch */
    bool no_fetch;                      /* takeover: its ring lacks our position */
    bool connecting;                    /* its session's handshake is under way */
    uint64_t position;                  /* durable there, as it said */
    uint64_t sent;                      /* shipped up to (in flight included) */
    uint64_t confirmed_at;              /* it acknowledged this epoch, and every
                                         * record logged, as of this time */
    uint32_t gen;
    uint64_t retry_at;
    struct tern_log_limit said;
    struct repl_call calls[REPL_INFLIGHT];
    /* a full copy to it (R_NEED_COPY): the phase sent next, where the
     * scan is, and the primary's position when it began */
    uint32_t copy_phase;
    uint64_t copy_cursor, copy_snap;
    struct repl_ring_peer ring;         /* one-sided shipping to it */
};

enum repl_state { S_NONE = 0, S_BACKUP, S_TAKEOVER, S_PRIMARY };

struct repl {
    struct repl_host *h;
    struct repl *next;                  /* the host's groups */
    char shard[REPL_SHARD_MAX];
    char me[64];
    char primary[64];
    char *state_path;
    const struct repl_store_ops *ops;
    void *ctx;
    uint64_t timeout_ns;
    struct repl_log log;
    enum repl_role role;                /* the cluster's word */
    enum repl_state st;                 /* where this node is in it */
    uint64_t epoch;                     /* the view's */
    uint64_t seen;                      /* newest epoch accepted (state file) */
    uint64_t position;                  /* last durable version here */
    uint64_t committed;                 /* primary: held by a majority */
    uint64_t advanced;                  /* position at the last repl_advance */
    bool fetching, need_copy;
    /* a full copy coming in: since BEGIN (at copy_epoch), and until the
     * position passes copy_high, the highest version it brought */
    bool copying, copy_ended;
    /* candidacy (repl_candidate): caught up with a primary's stream since
     * this process started; when the view last had a primary */
    bool synced;
    uint64_t no_primary_since;
    uint64_t copy_epoch, copy_high;
    struct replica peers[REPL_PEERS_MAX];
    unsigned n_peers;
    /* members changing (repl_vote): this node's vote, the learner a
     * primary counts in before the map makes it a voter ("" if none) */
    uint8_t vote;
    char promoting[64];
    unsigned written_in_pass;           /* records written since the last repl_tick */
    bool lease_doubt;                   /* repl_set_lease(false) */
    struct tern_rpc_gate *gate[REPL_GATES];     /* by enum repl_w, and REPL_GATE_CONFIRM */
    /* waits outside RPC (repl_wait_*): failures so far, the last one's
     * code, and the newest confirmation asked for (0: none owed) */
    uint64_t fail_gen;
    int fail_code;
    uint64_t ext_confirm;
    struct repl_ring *ring;             /* this replica's ring (repl_ring.c), or NULL */
    uint8_t ship;                       /* enum repl_ship (repl_config) */
    uint64_t st_shipped, st_applied, st_stale, st_copies_sent, st_copies_taken;
    uint64_t st_ring_refused;
};

struct repl_host {
    struct tern_rpc_ep *ep;
    struct repl *groups;
    struct tern_service svc;
};

/* The largest batch (header included) a replica's session carries. */
static inline size_t repl_batch_max(const struct tern_session *s)
{
    size_t m = tern_session_msg_max(s);

    return m && m < REPL_BATCH_MAX ? m : REPL_BATCH_MAX;
}

/* repl.c */
struct repl_call *repl_call_slot(struct replica *p);
unsigned repl_busy_calls(const struct replica *p);
void repl_advance(struct repl *r);
void repl_fail_held(struct repl *r, int code);
void repl_step_down(struct repl *r, int code);

/* repl_backup.c: apply a batch that must follow this replica's position
 * (APPEND, or a FETCH answer): 0 with *pos set (REPL_GAP in its flags if it
 * did not follow), or an error (TERN_EPROTO, the store's). */
int repl_apply_batch(struct repl *r, const void *data, size_t len, struct repl_pos *pos);

/* A walker (repl_rec_fn) that writes a shipped record into the store and
 * the DRAM log and moves the position, unless the replica holds it
 * already; a store error stops the walk with ctx->rc set. */
struct repl_apply_ctx {
    struct repl *r;
    int rc;
};
int repl_take_rec(void *arg, const struct repl_rec *h, const void *key, const void *val);

/* repl_state.c: the state file: the newest epoch seen, and whether a full
 * copy is coming in. Read it (absent: epoch 0, no copy); write it, durably,
 * before anything is answered that depends on it. */
int repl_state_load(const char *path, const char *shard, uint64_t *seen, bool *copying);
int repl_state_save(struct repl *r, uint64_t seen, bool copying);
int repl_see_epoch(struct repl *r, uint64_t epoch);

/* Parse a state file's bytes (the fuzz target's entry too). */
int repl_state_parse(const char *buf, size_t len, const char *shard, uint64_t *seen,
                     bool *copying);

/* repl_copy.c: the primary's side of a full copy, one step per tick. */
void repl_copy_step(struct repl *r, struct replica *p);

#endif
