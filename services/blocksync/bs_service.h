/* The block-sync service, the serving side: a chain store served to
 * peers over tern RPC (bs_wire.h): handshakes, headers and ranges of the
 * log, inline or put into the peer's receive area.
 *
 * A node both serves and syncs (bs_sync.h) on one endpoint: its handlers
 * read the store that its syncer writes, on the endpoint's thread.
 *
 * Faults are for tests and benchmarks of the syncer: a server may be told
 * to stall or to lie in one way, and then does so on every request it
 * serves (ternd --chain-fault). */
#ifndef TERN_BS_SERVICE_H
#define TERN_BS_SERVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "bs_store.h"
#include "bs_wire.h"
#include "rpc.h"

enum bs_fault {
    BS_FAULT_NONE = 0,
    BS_FAULT_STALL,      /* range requests hang the server for stall_ms */
    BS_FAULT_MERKLE,     /* one body byte flipped in every range */
    BS_FAULT_TRUNCATE,   /* spans said to be 64 bytes shorter */
    BS_FAULT_ORDER,      /* the first record of a range says the next height */
    BS_FAULT_PARENT,     /* headers carry a wrong parent id */
};

/* "stall", "merkle", ... to a fault: 0 or TERN_EINVAL. */
int bs_fault_parse(const char *s, enum bs_fault *out);

struct bs_service_opts {
    uint64_t node;                   /* this node's id; 0 = random */
    bool allow_append;               /* take blocks from producers (BS_M_APPEND) */
    enum bs_fault fault;
    uint32_t stall_ms;               /* BS_FAULT_STALL: 0 = 60 s */
};

struct bs_service;

/* A service over `st` (the caller's; it must outlive the service).
 * TERN_ENOMEM. */
int bs_service_new(struct bs_store *st, const struct bs_service_opts *o,
                   struct bs_service **out);

/* The service to tern_rpc_register(). */
const struct tern_service *bs_service_def(struct bs_service *svc);

/* Register the store's mapping on `ep` as the source of one-sided puts:
 * a range a peer asks to have put is then put from the log itself (or
 * stored straight into the peer's area where the fabric maps it), with no
 * copy here. Until then, or if this fails, ranges go inline. Destroy the
 * endpoint before the service. */
int bs_service_enable_put(struct bs_service *svc, struct tern_rpc_ep *ep);

/* This node's hello (what the syncer sends too). */
void bs_service_hello(const struct bs_service *svc, struct bs_hello *out);

/* The hello of node `node` holding store `st`. */
void bs_hello_of(const struct bs_store *st, uint64_t node, struct bs_hello *out);

/* This node's id. */
uint64_t bs_service_node(const struct bs_service *svc);

/* The refusal a node with hello `peer` gets from one with hello `self`
 * and store `st`, from either side: BS_OK or an enum bs_refusal.
 * `connected(node, arg)` says whether that node is connected already
 * (NULL: never). */
unsigned bs_hello_judge(const struct bs_store *st, const struct bs_hello *self,
                        const struct bs_hello *peer, bool (*connected)(uint64_t, void *),
                        void *arg);

/* While a syncer writes the store (bs_sync_run sets it), producers are
 * refused (TERN_EBUSY). */
void bs_service_set_syncing(struct bs_service *svc, bool on);

struct bs_service_stats {
    uint64_t hellos, refused, headers, ranges, bytes_inline, bytes_put;
    uint64_t appended, append_refused;
};
void bs_service_get_stats(const struct bs_service *svc, struct bs_service_stats *st);

void bs_service_free(struct bs_service *svc);

#endif
