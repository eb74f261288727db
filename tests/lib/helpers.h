/* The test harness every suite includes: the fabric matrix (fabrics.h),
 * processes and folders (procs.h), and here the conformance suite's rows
 * and event queues over tern_tp_poll. */
#ifndef TERN_TEST_HELPERS_H
#define TERN_TEST_HELPERS_H

#include <stdbool.h>
#include <sys/types.h>

#include "fabrics.h"
#include "procs.h"
#include "rpc.h"
#include "transport.h"

/* One row per fabric the conformance suite runs on. */
struct fabric_case {
    const char *fabric;
    const char *listen;     /* address to listen on (any free port/name) */
    const char *refused;    /* an address nobody listens on */
    const char *bad;        /* an address the fabric cannot parse */
    bool point_to_point;    /* a listener joins exactly one peer (an NTB
                             * device's two ends) */
};

extern const struct fabric_case fabric_cases[];
extern const int n_fabric_cases;

/* Open an endpoint with small buffers unless max_msg says otherwise. */
struct tern_tp_ep *tp_open(const char *fabric, size_t max_msg);

/* Next event of `ep`, polling up to `ms` milliseconds; false on timeout. */
bool tp_next(struct tern_tp_ep *ep, struct tern_tp_event *out, int ms);

/* Next event of `ep` while also making progress on `other` (its events are
 * queued for its own tp_next). */
bool tp_next2(struct tern_tp_ep *ep, struct tern_tp_ep *other, struct tern_tp_event *out,
              int ms);

/* A connected pair: `client` on `a`, `server` on `b`. */
struct tp_pair {
    struct tern_tp_ep *a, *b;
    struct tern_tp_conn *client, *server;
    char bound[128];        /* where b listens */
};

/* Listen on b, connect from a, wait for CONNECTED and ACCEPTED. */
void tp_pair_open(struct tp_pair *p, const struct fabric_case *fc, size_t max_msg);
void tp_pair_close(struct tp_pair *p);

/* Milliseconds since an arbitrary start. */
double now_ms(void);

#endif
