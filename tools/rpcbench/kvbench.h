/* rpcbench kv: YCSB-style benchmark of the key-value service
 * (services/kv), and what rpcbench.c shares with it.
 *
 * (Named kvbench.h, not kv.h: tools/rpcbench is on the test suite's include
 * path, where a second "kv.h" could shadow services/kv/kv.h.)
 */
#ifndef RPCBENCH_KVBENCH_H
#define RPCBENCH_KVBENCH_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hist.h"
#include "rpc.h"

/* ---- kv.c ---- */

/* `rpcbench kv ...`: argv[1] is "kv". Returns the exit code. */
int kv_main(int argc, char **argv);

/* rpcbench failover (failover.c): YCSB-A on a replicated shard whose
 * primary a script kills, checking that no acknowledged write is lost. */
int failover_main(int argc, char **argv);

/* ---- shared by rpcbench.c ---- */

/* One row of output: the table columns or JSON keys of every benchmark. */
struct result {
    const char *workload, *fabric;
    size_t size;
    unsigned window;
    uint64_t iters;
    double secs;
    struct hist *hist;
    long rss[2], srv_rss[2];
    const char *json_extra;      /* appended inside the JSON object (",\"k\":v...") */
    const char *row_extra;       /* appended to the table row */
};

/* Print `r` as a JSON line or a table row. */
void bench_print(bool json, const struct result *r);

/* The table's header line; `extra` (may be NULL) is appended. */
void bench_print_header(const char *extra);

/* The bench service (echo, stats, sink) of rpcbench's servers. */
extern const struct tern_service bench_service;

/* This process's resident set in KiB; the server's, through the bench
 * service on session `s` (-1 if the call fails). */
long rss_kb(void);
long server_rss(struct tern_session *s);

/* A busy-polling server's CPU time on work: the time of its polls that
 * handled events (idle polls do not count), summed by bench_serve_busy()
 * and read by server_busy_ns() through the bench service (0 on failure). */
extern uint64_t bench_busy_ns;
void bench_serve_busy(struct tern_rpc_ep *ep, volatile sig_atomic_t *stop);
uint64_t server_busy_ns(struct tern_session *s);

/* Time `iters` echo calls of `size` bytes, `window` in flight, on session
 * `s` (served by the bench service), print the row and store its median in
 * *p50 (if not NULL). Returns 0 or the error that stopped it. */
int bench_echo(struct tern_rpc_ep *ep, struct tern_session *s, const char *fabric,
               size_t size, unsigned window, uint64_t iters, bool json, uint64_t *p50);

/* --cpu C,S of `prog` ("rpcbench", "rpcbench kv"): false after saying
 * what is wrong. */
bool bench_parse_cpu(const char *prog, const char *arg, int *client, int *server);

#endif
