/* tern key-value service: a persistent store served over tern RPC, and the
 * client library that spreads keys over several servers.
 *
 * Server: tern_kv_service_open() opens a pool (recovering its index) and
 * gives a struct tern_service to register on an endpoint. GET replies are
 * copied from the pool straight into the send buffer; a PUT value goes from
 * the receive buffer into the pool once, and the reply that says "stored"
 * leaves only after the record is durable.
 *
 * Client: tern_kv_open() connects to every server, learns the 32-bit hash
 * range each owns, and routes each key by the top 32 bits of its XXH3 hash.
 * Every call has a sync form and an async form whose callback runs inside
 * tern_rpc_poll() of the client's endpoint.
 */
#ifndef TERN_KV_H
#define TERN_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_KV_SERVICE_ID 0x6b76    /* "kv" */

/* ---- server ---- */

struct tern_kv_service_opts {
    const char *pool_path;           /* created if absent */
    uint64_t pool_size;              /* create: 0 = 256 MiB */
    uint32_t seg_size;               /* create: 0 = 1 MiB */
    uint32_t range_lo;               /* owns keys with hash>>32 in [lo, hi] */
    uint32_t range_hi;               /* 0, 0 = the whole space */
    bool append_only;                /* never update in place (BOOM-KV's hybrid
                                      * update is on by default) */
    uint32_t split_flush;            /* flush ranges this long in pieces that
                                      * tern_kv_service_help may take; 0 = 256 KiB
                                      * on PM, never on a file */
};

struct tern_kv_service;

/* Open the pool and build the service: TERN_EBUSY (another process has the
 * pool), TERN_ECORRUPT (the log says what and where; the file is left as
 * it was), TERN_EVERSION, TERN_EINVAL, TERN_ENOMEM, or an errno of the
 * file. */
int tern_kv_service_open(const struct tern_kv_service_opts *o, struct tern_kv_service **out);

/* The service to tern_rpc_register(); valid until destroy. */
const struct tern_service *tern_kv_service_def(struct tern_kv_service *svc);

/* From a thread other than the service's: run one piece of a large flush
 * the service posted; 1 if it ran one, 0 if none was
 * posted. Stop calling it before tern_kv_service_close(). */
int tern_kv_service_help(struct tern_kv_service *svc);

/* Housekeeping on the service's thread: removes keys whose deadline has
 * passed (see tern_kv_put_until), at most `max` of them (0 = 1000), soonest
 * first, and makes the removals durable. A replicated shard's backups leave
 * it to their primary, whose removals reach them as deletes: on a backup it
 * does nothing. Call it about every 100 ms; readers never see a key past
 * its deadline whether or not it has run. Returns the keys removed (max:
 * more are due, call again soon), or a negative tern code. */
int tern_kv_service_tick(struct tern_kv_service *svc, unsigned max);

/* One-sided paths (see tern_kv_set_path). */
struct tern_kv_onesided_opts {
    uint32_t window_blocks;          /* index window blocks of 8 buckets, a power of
                                      * two; 0 = one per 4 KiB of pool */
    unsigned max_leases;             /* segments leased at once; 0 = 256 */
    uint64_t lease_idle_ns;          /* a lease unused this long is taken back when
                                      * another client needs one, or the pool needs
                                      * room; 0 = 30 s */
    unsigned lease_pool_pct;         /* percent of the pool's segments leases may hold
                                      * at once, taken back ones included (at least
                                      * one segment); further LEASEs get TERN_ENOSPC.
                                      * 0 = 25 */
    unsigned session_leases;         /* leases in a row one session may hand back (or
                                      * lose to a refused record) less than half
                                      * written; past that its LEASEs get TERN_EBUSY
                                      * while it stays connected. 0 = 4 */
};

/* Serve the one-sided paths to clients of `ep` (the endpoint the service is
 * registered on): mirror the index into a window clients read, register the
 * pool read-only for them, and lease segments they write into. o may be
 * NULL. Until this is called those requests get TERN_ENOTSUP and clients
 * stay on RPC. The registrations belong to `ep` and go with it (destroy
 * the endpoint before the service, as always). */
int tern_kv_service_enable_onesided(struct tern_kv_service *svc, struct tern_rpc_ep *ep,
                                    const struct tern_kv_onesided_opts *o);

/* Close the store. Unregister first (destroy the endpoint). */
void tern_kv_service_close(struct tern_kv_service *svc);

/* ---- client ---- */

struct tern_kv;

/* Connect to `n` servers (tern_rpc_connect URIs) and learn their ranges,
 * which must cover the hash space without overlap (TERN_EINVAL otherwise). */
int tern_kv_open(struct tern_rpc_ep *ep, const char *const *uris, unsigned n,
                 uint64_t timeout_ns, struct tern_kv **out);

/* Connect to the `n` replicas of one replicated shard (ternd's [cluster]
 * kv_shard; up to 7 URIs, those that do not answer now are dialled again
 * later). Calls go to the primary, found by asking: a replica that is not
 * the primary refuses (TERN_ENOTPRIMARY) and the call goes on to the next;
 * a replica that is lost, likewise. The sync forms wait out an election
 * (up to the timeout); an async call that found no primary ends with
 * TERN_ENOTPRIMARY, to be tried again. A PUT or DEL re-sent after its
 * replica was lost may have been done there too: writes are "at least
 * once". TERN_ECONNREFUSED if no replica answers. Not with the one-sided
 * paths (a replicated store refuses them). */
int tern_kv_open_replicas(struct tern_rpc_ep *ep, const char *const *uris, unsigned n,
                          uint64_t timeout_ns, struct tern_kv **out);

/* How many replicas of a replicated shard hold a PUT or DELETE before its
 * callback says so: the primary alone, a majority (the default), or all
 * of them. No effect on a store that is not replicated. */
enum tern_kv_write_concern {
    TERN_KV_W_MAJORITY = 0,
    TERN_KV_W_ONE = 1,
    TERN_KV_W_ALL = 2,
};
int tern_kv_set_write_concern(struct tern_kv *kv, enum tern_kv_write_concern w);

/* Where a replicated shard's GETs go: to the primary (the default: a GET
 * shows only writes a majority holds, and the newest of those), or to any
 * replica in turn (READ_ANY: backups share the reads, and a backup answers
 * what it holds, which may be a little behind the primary, or a write that
 * no majority holds yet and a failover takes back). A backup that cannot
 * answer (it is being copied) sends the GET on to the primary. MGET, SCAN
 * and the one-sided paths always read at the primary. No effect on a store
 * that is not replicated. TERN_EINVAL for another value. */
enum tern_kv_read_from {
    TERN_KV_READ_PRIMARY = 0,
    TERN_KV_READ_ANY = 1,
};
int tern_kv_set_read_from(struct tern_kv *kv, enum tern_kv_read_from from);

/* Close every session; async calls in flight complete with TERN_ECANCELED. */
void tern_kv_close(struct tern_kv *kv);

/* Per-call deadline for later calls (0 = none; the default is 5 s). */
void tern_kv_set_timeout(struct tern_kv *kv, uint64_t timeout_ns);

/* Result of an async call. `val` (GET) is valid during the callback only. */
typedef void (*tern_kv_cb)(void *arg, int status, const void *val, size_t len,
                           uint64_t version);

/* Async forms. Key and value must stay valid until the callback runs (they
 * may be re-sent after a fabric failover). TERN_ENOBUFS when too many calls
 * are in flight: poll, then retry. */
int tern_kv_get_async(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb,
                      void *arg);
int tern_kv_put_async(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                      size_t len, tern_kv_cb cb, void *arg);
int tern_kv_del_async(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb,
                      void *arg);

/* GET into buf/cap (TERN_EMSGSIZE if it does not fit, with *len set to the
 * size needed). TERN_ENOENT if absent. version may be NULL. */
int tern_kv_get(struct tern_kv *kv, const void *key, size_t klen, void *buf, size_t cap,
                size_t *len, uint64_t *version);

/* PUT; returns once the value is durable on its server. */
int tern_kv_put(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                size_t len, uint64_t *version);

/* DELETE; TERN_ENOENT if absent. */
int tern_kv_del(struct tern_kv *kv, const void *key, size_t klen);

/* Keys that expire. A deadline is a wall-clock time in Unix milliseconds
 * (CLOCK_REALTIME), kept with the key on the server: from it on the key
 * is absent to every reader, across restarts and on every replica, and
 * the server removes it in the background (tern_kv_service_tick). The
 * server's clock decides; a client whose clock differs by d sees deadlines
 * d off. Any plain put drops the key's deadline (as Redis's SET).
 *
 * tern_kv_put_until: tern_kv_put with a deadline (0: none). It goes by RPC
 * whatever tern_kv_set_path says (one-sided puts write plain values).
 * tern_kv_expiry: 0 with *at_ms (0: the key has none), or TERN_ENOENT.
 * tern_kv_expire: give a present key a new deadline, or with 0 take its
 * deadline away; one already past deletes the key. TERN_ENOENT if absent.
 * Thread rules and write concern as for tern_kv_put. */
int tern_kv_put_until_async(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                            size_t len, uint64_t at_ms, tern_kv_cb cb, void *arg);
int tern_kv_put_until(struct tern_kv *kv, const void *key, size_t klen, const void *val,
                      size_t len, uint64_t at_ms, uint64_t *version);
int tern_kv_expiry(struct tern_kv *kv, const void *key, size_t klen, uint64_t *at_ms);
int tern_kv_expire(struct tern_kv *kv, const void *key, size_t klen, uint64_t at_ms);

/* Multi-get: one call per server, the keys of each packed together.
 * cb(arg_i) runs once per key with its own status; `i` is its index. */
typedef void (*tern_kv_mget_cb)(void *arg, unsigned i, int status, const void *val,
                                size_t len, uint64_t version);
int tern_kv_mget(struct tern_kv *kv, unsigned n, const void *const *keys, const size_t *klens,
                 tern_kv_mget_cb cb, void *arg);

/* Scan every server in hash order. Start with *cursor = 0; each call visits
 * about `max` keys of one server (whole hash buckets, so a few more at
 * times), calling cb for each, and updates *cursor; 0 afterwards means the
 * scan is complete. Every key present for the whole scan is seen at least
 * once. */
typedef void (*tern_kv_scan_cb)(void *arg, const void *key, size_t klen, const void *val,
                                size_t len, uint64_t version);
int tern_kv_scan(struct tern_kv *kv, uint64_t *cursor, unsigned max, tern_kv_scan_cb cb,
                 void *arg);

/* Keys stored across all servers. */
int tern_kv_count(struct tern_kv *kv, uint64_t *keys);

/* ---- one-sided paths ---- */

enum tern_kv_path {
    TERN_KV_PATH_RPC = 0,            /* every call is an RPC (the default) */
    /* GET reads the server's index window and the record itself, with no
     * server CPU (a direct load on shm, two RDMA READs on rdma, served reads
     * elsewhere), validated by checksums and versions; keys it cannot find
     * there (absent, deleted, not mirrored) are asked by RPC. PUT writes the
     * record into a segment the server leased to this client and sends one
     * small message saying where; the reply comes once it is durable. */
    TERN_KV_PATH_ONESIDED = 1,
    /* One-sided where that is the faster way: shm (plain loads and stores)
     * and rdma (the NIC reads and writes); RPC on tcp and ntb, where every
     * one-sided operation is served by the server's CPU anyway (and NTB
     * reads cross PCIe), so one RPC beats two served reads. PUTs of values
     * under 1 KiB go inline in an RPC, as Chequer's do: for them the
     * record's extra trip between caches costs more than the copy saved. */
    TERN_KV_PATH_AUTO = 2,
    /* GET by server push: the client names a buffer of its own and the
     * server writes the record into it by one-sided put straight from the
     * pool, then replies with its size (one round trip, no copy on the
     * server, no remote read). PUTs as TERN_KV_PATH_ONESIDED. */
    TERN_KV_PATH_PUSH = 3,
};

/* Choose how later GETs and PUTs travel (DELETE, MGET, SCAN stay RPC).
 * Servers that do not serve one-sided paths are used by RPC. The first
 * choice of a one-sided path asks every server for its keys and waits for
 * the answers (and for other calls in flight): not from a callback. */
int tern_kv_set_path(struct tern_kv *kv, enum tern_kv_path path);

/* Keep up to `entries` values of at most `max_val` bytes from one-sided
 * GETs; a hit costs one read of the index block, to check the version
 * (Chequer's client cache). 0 entries turns it off (the default).
 * TERN_ENOTSUP before tern_kv_set_path() chose a one-sided path. */
int tern_kv_set_cache(struct tern_kv *kv, unsigned entries, size_t max_val);

struct tern_kv_onesided_stats {
    uint64_t gets_direct;            /* GETs answered from the window and pool */
    uint64_t gets_rpc;               /* of the one-sided path, asked by RPC instead */
    uint64_t torn;                   /* reads retried (torn bucket or record) */
    uint64_t cache_hits;
    uint64_t puts;                   /* PUTs through a leased segment */
    uint64_t leases;                 /* segments leased */
    uint64_t gets_pushed;            /* GETs whose record the server pushed */
    uint64_t stage_lost;             /* staging slots retired: a push may still land */
};

/* Counters of the one-sided paths. */
void tern_kv_get_onesided_stats(const struct tern_kv *kv, struct tern_kv_onesided_stats *st);

#ifdef __cplusplus
}
#endif

#endif
