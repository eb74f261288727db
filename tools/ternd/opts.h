/* ternd's settings: one table of keys that both the configuration file
 * (INI, read with inih) and the command line set, so a value is checked
 * the same way wherever it comes from and a flag overrides the file.
 *
 *   [node]    name, rack, data_dir, listen (repeatable), shm, spin_us, busy,
 *             log_level, log_file, metrics_port, key_file, protected
 *   [kv]      pool_size, seg_size, range, resp_port, resp_coalesce_us,
 *             resp_password_file, collections_pool_size, flush_helpers
 *   [doc]     enabled, pool_size, mongo_port, mongo_host
 *   [chain]   enabled, id, size, peer (repeatable), producers, workers, fault
 *   [policy]  same_rack, other_rack (fabric lists), subnet (repeatable:
 *             "CIDR FABRIC")
 *   [peer NAME]  address, rack, ntb: the nodes this one keeps sessions to
 *
 * A mistake is reported as "ternd: FILE:LINE: [section] key: what is
 * wrong" (or "ternd: --flag: what is wrong") and ends the start with
 * status 2. `ternd --config FILE --check` prints the resolved settings in
 * the file's own format. docs/TERND.md has every key.
 */
#ifndef TERND_OPTS_H
#define TERND_OPTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ternd_chain.h"

#define TERND_MAX_LISTEN 8
#define TERND_MAX_HELPERS 64
#define TERND_MAX_PEERS 64
#define TERND_MAX_SUBNETS 16
#define TERND_SPIN_MAX_US 1000000u   /* a second: past that --busy is meant */
#define TERND_NAME_MAX 64
#define TERND_LEASE_MIN 2            /* [cluster] lease_ttl, seconds */
#define TERND_LEASE_MAX 60
#define TERND_MAX_SHARDS 16          /* [cluster] shard (CL_SHARDS_MAX) */
#define TERND_MONGO_HOST_MAX 119     /* [doc] mongo_host: "[HOST]:PORT" fits the
                                      * 128 bytes of a registered address
                                      * (CL_ADDR_MAX) */

/* A fabric preference list ("ntb,rdma,tcp"): fabric names in order. */
#define TERND_FABRICS 4
struct ternd_fabric_list {
    unsigned n;
    char name[TERND_FABRICS][8];
};

/* [policy]: which fabric a session to a peer prefers; reloaded on SIGHUP. */
struct ternd_policy {
    struct ternd_fabric_list same_rack, other_rack;
    struct {
        uint32_t net, mask;          /* IPv4, host order */
        uint8_t bits;
        char fabric[8];
    } subnet[TERND_MAX_SUBNETS];
    unsigned n_subnets;
};

struct ternd_peer {
    char name[TERND_NAME_MAX];
    char rack[TERND_NAME_MAX];
    const char *address;             /* tern RPC URI (tcp://host:port) */
    char ntb[TERND_NAME_MAX];        /* the NTB device cabled to it ("emu:NAME",
                                      * "hw"), or "" */
};

/* The NTB partitions of a cable between this node and a peer: each side
 * listens on two, the node whose name sorts first on 0 and 2, the other on
 * 1 and 3; the first of each pair takes the other ternd's session, the
 * second one other client (rpcbench, tern). */
static inline unsigned ternd_ntb_part(const char *listener, const char *other, unsigned k)
{
    return (strcmp(listener, other) < 0 ? 0u : 1u) + 2u * k;
}

struct ternd_opts {
    /* [node] */
    char name[TERND_NAME_MAX];       /* default: the host name */
    char rack[TERND_NAME_MAX];       /* "" : none */
    const char *data_dir;
    const char *listen[TERND_MAX_LISTEN];
    unsigned n_listen;
    bool shm, busy;
    unsigned spin_us;
    int log_level;                   /* -1: TERN_LOG or warn */
    int metrics_port;                /* -1: no metrics server */
    const char *key_file;            /* the cluster key, or NULL */
    uint8_t key[64];                 /* ... read from it (key.h) */
    size_t key_len;
    bool protect;                    /* no key: serve processes of this host only */
    const char *log_file;            /* NULL: stderr */
    /* [kv] */
    uint64_t pool_size;              /* 0: the pool's default */
    uint32_t seg_size;
    uint32_t range_lo, range_hi;
    int resp_port;                   /* -1: no gateway */
    const char *resp_password_file;  /* NULL: the cluster key's hex, if any */
    char resp_password[256];         /* ... its first line */
    uint64_t coll_pool_size;         /* the gateway's lists, hashes, sets, sorted sets */
    unsigned coalesce_us;
    unsigned helpers;                /* flush helpers */
    /* [doc] */
    bool doc;
    uint64_t doc_pool_size;
    int mongo_port;                  /* -1: no gateway */
    const char *mongo_host;          /* its listen address; NULL: 127.0.0.1 */
    /* [chain] */
    struct ternd_chain_opts chain;
    /* [cluster]: membership through etcd (none: alone, the default) */
    const char *etcd;                /* "http://HOST:PORT[,...]", or NULL */
    char prefix[TERND_NAME_MAX];     /* every key under it (default /tern) */
    unsigned lease_ttl;              /* seconds */
    char shards[TERND_MAX_SHARDS][TERND_NAME_MAX];  /* shards it replicates */
    unsigned n_shards;
    char kv_shard[TERND_NAME_MAX];   /* the KV store is this shard ("" : alone) */
    char doc_shard[TERND_NAME_MAX];  /* the document store is this shard ("" : alone) */
    unsigned repl_log_mb;            /* the replication log in DRAM */
    uint8_t repl_ship;               /* enum repl_ship: auto, one-sided, call */
    /* [policy], [peer NAME] */
    struct ternd_policy policy;
    struct ternd_peer peers[TERND_MAX_PEERS];
    unsigned n_peers;
    /* where things came from */
    const char *config;              /* --config FILE, or NULL */
    bool check;                      /* --check: print and exit */
};

/* Defaults, then the file named by --config, then the flags. Returns 0,
 * -1 after --help or --version (printed; exit 0), or OPT_USAGE after an
 * error (printed). Strings in *o live until ternd_opts_free. */
int ternd_opts_parse(int argc, char **argv, struct ternd_opts *o);

/* Defaults, then a configuration file from `f` (named `name` in messages),
 * without flags: 0 or OPT_USAGE (said on stderr). For tests and the fuzz
 * target of the file's reader. */
int ternd_opts_load_stream(FILE *f, const char *name, struct ternd_opts *o);

/* Read [policy] of o->config again into *policy (SIGHUP). 0, or -1 after
 * logging what is wrong; *policy is then untouched. */
int ternd_opts_reload_policy(const struct ternd_opts *o, struct ternd_policy *policy);

/* The settings in the configuration file's format (--check). */
void ternd_opts_print(FILE *f, const struct ternd_opts *o);

/* "ntb,rdma,tcp" */
void ternd_fabric_list_text(const struct ternd_fabric_list *l, char *buf, size_t len);

void ternd_opts_free(struct ternd_opts *o);

#endif
