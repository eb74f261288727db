/* A Redis-protocol (RESP2) gateway onto a key-value store, so that
 * redis-cli, redis-benchmark and Redis client libraries work unchanged.
 *
 * The gateway runs on the thread that owns the store. Each poll reads every
 * ready client, runs all the complete commands it finds (pipelining), makes
 * the batch's writes durable with one kvs_sync(), and only then
 * writes the replies: a "+OK" to SET always means the value is persistent.
 *
 * A client's queued replies are held to max_output: its commands wait while
 * that much is queued, and a reply (GET, MGET, ECHO, PING) that would not
 * fit under it even alone gets an error instead of being built.
 *
 * Commands: Redis's string and key commands, with expiry, and its list,
 * hash, set and sorted-set commands when given a collection engine
 * (docs/KV.md lists them; COMMAND LIST says the same); any other gets
 * Redis's "unknown command" error. Keys and values are the same bytes the native KV API
 * sees, deadlines the same as tern_kv_put_until's. Each poll also removes
 * keys past their deadline (at most 1000 a poll, every 100 ms).
 */
#ifndef TERN_RESP_H
#define TERN_RESP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvs;
struct kvc;
struct resp_gw;

struct resp_config {
    const char *host;            /* listen address; NULL = 127.0.0.1 */
    uint16_t port;               /* 0 picks one (see resp_gw_port) */
    unsigned max_clients;        /* 0 = 1024; further clients are refused */
    size_t max_request;          /* largest command in bytes; 0 = 64 MiB */
    size_t max_output;           /* unsent reply bytes a client may have: its next
                                    commands wait while that much is queued, and a
                                    reply larger than this on its own (an MGET of
                                    many big values) gets an error instead;
                                    0 = 64 MiB */
    unsigned coalesce_us;        /* 0 = off, at most RESP_COALESCE_MAX_US;
                                    see resp_gw_poll() */
    struct kvc *collections;     /* lists, hashes, sets and sorted sets (kv/coll/coll.h),
                                    owned by the caller and outliving the gateway;
                                    NULL: their commands get an error */
    const char *password;        /* clients must AUTH with it first (NULL: none;
                                    copied; at most 255 bytes); CONFIG SET
                                    requirepass changes it */
};

/* Listen and serve `store` (which must outlive the gateway). */
int resp_gw_create(struct kvs *store, const struct resp_config *cfg,
                        struct resp_gw **out);

/* The TCP port the gateway listens on. */
uint16_t resp_gw_port(const struct resp_gw *gw);

/* An fd (epoll) that is readable when some client needs service; sleep on
 * it with the thread's other fds and call resp_gw_poll() when it is. */
int resp_gw_fd(const struct resp_gw *gw);

#define RESP_COALESCE_MIN 4
#define RESP_COALESCE_MAX_US 1000000u

/* Serve every ready client, waiting up to timeout_ms (0: do not wait) for
 * one. Returns the number of commands run, or a negative tern code.
 *
 * With coalesce_us set, while the gateway is busy (at least
 * RESP_COALESCE_MIN distinct clients served in the last millisecond) a
 * poll that finds nobody ready first sleeps that long (plus the thread's
 * timer slack), then waits up to timeout_ms, as a NIC moderates interrupts:
 * the next batch is larger, so the gateway and its clients pay for fewer
 * wake-ups per command. The watched fd and signals cut the sleep short. A
 * lone client never waits for it, even one that reconnects for every
 * command. */
int resp_gw_poll(struct resp_gw *gw, int timeout_ms);

/* Have the gateway's poll also wake when `fd` polls readable (say the RPC
 * endpoint's tern_rpc_wait_fd), so that one thread can sleep in
 * resp_gw_poll() for both: one system call per wake-up. The gateway
 * never reads fd. One fd at most; TERN_EINVAL for a second. */
int resp_gw_watch_fd(struct resp_gw *gw, int fd);

/* True if the watched fd was readable at the last resp_gw_poll(). */
bool resp_gw_watch_ready(const struct resp_gw *gw);

/* Close every client and the listener. */
void resp_gw_destroy(struct resp_gw *gw);

#ifdef __cplusplus
}
#endif

#endif
