/* Catch-up sync: a node that is behind fetches the chain from several
 * peers at once and commits it, checked, to its store.
 *
 * States (BoR's): irreversible catch-up while the store is below the best
 * peer's irreversible height, head catch-up from there to the best head,
 * then in sync.
 *
 * 1. Handshake (BS_M_HELLO) with every peer: chain, node, genesis, head
 *    and irreversible heights. Either side may refuse with a reason
 *    (bs_wire.h); a refused peer is not used.
 * 2. Headers first, from the peer with the best head: each checked for
 *    height, chain and parent link and hashed to its id, so that the
 *    bodies' sizes and ids are known before any body is asked for. Where
 *    the first header does not follow the store's top, the headers below
 *    are compared to find where the chains part: blocks above the
 *    irreversible height are cut off if that peer's chain is longer
 *    (a peer whose chain parts below the irreversible height is dropped,
 *    "forked").
 * 3. Bodies as ranges of heights, striped over the peers: a few in flight
 *    per peer (depth), all inside a window of bytes ahead of the committed
 *    log (Bitcoin Core's block download window, Antelope's sync ranges). A
 *    range's size follows its peer's bandwidth x round trip. Its bytes
 *    come inline in replies (several calls where a range is longer than a
 *    message), or, with one_sided, are put by the peer into a registered
 *    receive area.
 * 4. Each range is checked off the receive loop where there are threads
 *    for it (workers): framing, each block's header against the header
 *    chain (so its id), its Merkle root against the header's. Ranges commit
 *    in height order, in batches of commit_bytes.
 * 5. A peer that lies (a span of another size, blocks out of order, a body
 *    whose root or header is not the chain's, a header chain that does not
 *    link) is dropped with the reason, and its ranges go to others. The peer
 *    holding the lowest range of a full window, silent (no bytes of it)
 *    for its stall timeout, is dropped as "stalled": the timeout is eight
 *    times what a range takes from any peer (at least 100 ms; stall_ns
 *    until a range has come), or four times the peer's own range time if
 *    longer; it doubles after each stall drop (to 64 s) and halves back
 *    every 16 ranges. The last peer that holds the range is not dropped
 *    (no one else could send it); its timeout doubles instead.
 * 6. Killed at any point, a node starts again from its committed height:
 *    nothing past it was ever believed.
 *
 * Threads: bs_sync_run runs on the endpoint's thread, polling it (so the
 * node's own service keeps serving peers meanwhile); workers only check
 * ranges. */
#ifndef TERN_BS_SYNC_H
#define TERN_BS_SYNC_H

#include <stdbool.h>
#include <stdint.h>

#include "bs_service.h"
#include "bs_store.h"
#include "rpc.h"

#define BS_SYNC_MAX_PEERS 16

struct bs_sync_progress {
    uint64_t committed, target;
    uint64_t bytes;                  /* log bytes committed by this run */
    double seconds;
    unsigned peers;                  /* peers in use */
};

struct bs_sync_opts {
    const char *const *peers;        /* URIs ("auto://host:port", "tcp://...") */
    unsigned n_peers;                /* at most BS_SYNC_MAX_PEERS */
    struct bs_service *svc;          /* this node's service (its node id), or NULL */
    unsigned depth;                  /* ranges in flight per peer; 0 = 4 */
    uint64_t window;                 /* bytes ahead of the committed log; 0 = 64 MiB */
    uint64_t range_min, range_max;   /* a range's bytes; 0 = 4 MiB, 8 MiB */
    uint64_t commit_bytes;           /* commit after this many; 0 = 16 MiB */
    unsigned workers;                /* checking threads; 0 = check on the loop
                                      * (bs_sync_auto_workers: one per core
                                      * beside the loop's, at most 4) */
    uint64_t stall_ns;               /* stall timeout before any range came; 0 = 2 s */
    uint64_t call_timeout_ns;        /* any one call; 0 = 60 s */
    uint64_t connect_timeout_ns;     /* 0 = 5 s */
    uint64_t target;                 /* stop at this many blocks; 0 = the best head */
    bool one_sided;                  /* ask peers to put ranges (where the fabric can) */
    const volatile int *stop;        /* set (a signal handler): the run ends, TERN_ECANCELED */
    void (*progress)(void *arg, const struct bs_sync_progress *p);
    void *progress_arg;
    uint64_t progress_ns;            /* between progress calls; 0 = 1 s */
};

enum bs_sync_state {
    BS_SYNC_IRREVERSIBLE = 1,
    BS_SYNC_HEAD,
    BS_SYNC_IN_SYNC,
};

const char *bs_sync_state_name(enum bs_sync_state s);

/* Checking threads for a node alone on this machine: one per online core
 * but the loop's, at most 4 (0 on one core). */
unsigned bs_sync_auto_workers(void);

struct bs_sync_peer_stats {
    char uri[128];
    const char *fabric;
    uint64_t head, lib;              /* as its hello said */
    uint64_t ranges, bytes;          /* delivered and checked */
    uint64_t bytes_put;              /* of which put one-sidedly */
    unsigned refusal;                /* enum bs_refusal: who refused whom is in `dropped` */
    const char *dropped;             /* NULL while in use, else why it was dropped */
};

struct bs_sync_stats {
    enum bs_sync_state state;
    uint64_t start, committed, target;  /* heights (block counts) */
    uint64_t blocks, bytes;          /* committed by this run: blocks, log bytes */
    uint64_t ranges, refetched;      /* ranges committed; ranges asked again */
    uint64_t truncated;              /* blocks cut off for a longer fork */
    double seconds;
    /* Where the time went: checking ranges (all threads), appending and
     * committing them (the loop). The rest of `seconds` is the loop's
     * receiving, asking and waiting. */
    double check_seconds, commit_seconds;
    unsigned n_peers;
    struct bs_sync_peer_stats peer[BS_SYNC_MAX_PEERS];
};

/* Sync `st` from the peers until it holds the target (or every peer is
 * gone or refused). 0 when the target was reached; TERN_ENOTCONN when no
 * usable peer is left short of it (what was committed stays);
 * TERN_ECANCELED when *o->stop was set (likewise); TERN_EIO
 * when the store failed; TERN_EINVAL, TERN_ENOMEM. `out` (may be NULL)
 * says what happened either way. */
int bs_sync_run(struct tern_rpc_ep *ep, struct bs_store *st, const struct bs_sync_opts *o,
                struct bs_sync_stats *out);

#endif
