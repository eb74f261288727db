/* Document servers of a multi-process test, as kv_servers.h starts KV
 * ones: up to TEST_DOC_SERVERS forked processes, server i serving
 * tern_doc_service on pool file i of one folder of the test (made at the
 * first start, removed at any exit of the test process and by the
 * janitor). */
#ifndef TERN_TEST_DOC_SERVERS_H
#define TERN_TEST_DOC_SERVERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "doc_wire.h"
#include "rpc.h"

#define TEST_DOC_SERVERS 2

struct test_doc_srv {
    const char *listen;              /* NULL: tcp://127.0.0.1:0 */
    uint64_t pool_size;              /* 0: 256 MiB (sparse) */
    uint32_t seg_size;               /* 0: the service's (32 MiB) */
    size_t max_msg;                  /* the server's endpoint; 0: 1 MiB */
    bool onesided;                   /* serve RMongo's result path */
};

/* Start server i (its pool is created at its first start). */
void test_doc_start(int i, const struct test_doc_srv *o);

/* SIGTERM server i; it must exit cleanly (asserted). */
void test_doc_finish(int i);

/* SIGKILL server i, and wait for it. */
void test_doc_kill(int i);

/* Server i's bound URI. */
const char *test_doc_uri(int i);

/* Server i's counters, asked over a session of their own (which the
 * server counts among its sessions once it has sent a command: this
 * one never does). */
struct doc_wire_stats test_doc_stats(struct tern_rpc_ep *ep, int i);

/* Kill every server and remove the pools and their folder. */
void test_doc_cleanup(void);

#endif
