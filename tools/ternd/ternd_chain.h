/* ternd's block-sync service (chain.c): opened under --data-dir when
 * --chain is given, registered on the endpoint, caught up from its peers
 * once ternd serves. */
#ifndef TERND_CHAIN_H
#define TERND_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "rpc.h"
#include "tern_config.h"

#define TERND_CHAIN_PEERS 16

struct ternd_chain_opts {
    bool on;                         /* --chain */
    uint64_t chain;                  /* --chain-id: a new file's chain id */
    uint64_t size;                   /* --chain-size: a new file's bytes */
    const char *peers[TERND_CHAIN_PEERS];   /* --chain-peer */
    unsigned n_peers;
    bool producers;                  /* --chain-producers */
    unsigned workers;                /* --chain-workers; UINT32_MAX: bs_sync_auto_workers */
    int fault;                       /* --chain-fault (enum bs_fault), for tests */
};

struct ternd_chain;

/* Open (or create) DATA_DIR/chain.pool and the service over it; errors
 * are said on stderr. */
int ternd_chain_open(const struct ternd_chain_opts *o, const char *data_dir,
                     struct ternd_chain **out);

int ternd_chain_register(struct ternd_chain *c, struct tern_rpc_ep *ep);

/* " chain=PATH blocks=N" for the ready line; returns its length. */
int ternd_chain_ready(const struct ternd_chain *c, char *buf, size_t len);

/* Catch up from the peers (none: nothing to do), serving on `ep`
 * meanwhile; prints "ternd chain in-sync|behind ..." on stdout. */
int ternd_chain_catch_up(struct ternd_chain *c, struct tern_rpc_ep *ep,
                         const volatile int *stop);

/* Close; `failed_start` also removes a chain file this start created. */
void ternd_chain_close(struct ternd_chain *c, bool failed_start);

#endif
