/* tern document service, the server: a document store on persistent
 * memory served over tern RPC to tern_doc clients (doc.h).
 *
 * Each client session gets its own MongoDB client state (its cursors),
 * freed when the session closes. A command that wrote is durable before its
 * reply leaves: the service makes every write since the last reply durable
 * with one flush (group commit), then answers.
 *
 * Threads: the service belongs to the thread that polls the endpoint it is
 * registered on. Built only with libpmem, libbson and PCRE2. */
#ifndef TERN_DOC_SERVICE_H
#define TERN_DOC_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tern_doc_service_opts {
    const char *pool_path;           /* created if absent */
    uint64_t pool_size;              /* create: 0 = 1 GiB (a sparse file) */
    uint32_t seg_size;               /* create: 0 = 32 MiB */
    size_t max_batch_bytes;          /* a cursor batch: 0 = what fits in a reply
                                      * of max_msg (below) */
    size_t max_msg;                  /* the endpoint's max_msg; 0 = 1 MiB */
};

struct tern_doc_service;

/* Open (or create) the pool, recover the store and build the service:
 * TERN_EBUSY (another process has the pool), TERN_ECORRUPT, TERN_EINVAL,
 * TERN_ENOMEM, TERN_EDOC for another error of the store (logged). */
int tern_doc_service_open(const struct tern_doc_service_opts *o, struct tern_doc_service **out);

/* The service to tern_rpc_register(); valid until close. */
const struct tern_service *tern_doc_service_def(struct tern_doc_service *svc);

/* Group commit on `ep`, the endpoint the service is registered on: the
 * replies of writing commands wait for the end of the poll that read
 * them, when one flush makes every write of the poll durable, for all
 * clients at once (tern_req_hold). Without it each writing command is
 * made durable on its own before its reply. As with the one-sided path,
 * destroy the endpoint before the service. */
int tern_doc_service_group_commit(struct tern_doc_service *svc, struct tern_rpc_ep *ep);

/* Let the service write result batches into clients' buffers (RMongo's
 * path, tern_doc_set_path) on `ep`, the endpoint it is registered on: it
 * registers `slots` staging buffers of max_msg bytes each (0 = 8) from
 * which batches are put on fabrics that do not map the client's buffer
 * here (all but shm); a batch finding none free goes inline. Until this
 * is called every batch goes inline. The registration belongs to `ep`
 * (destroy the endpoint before the service). */
int tern_doc_service_enable_onesided(struct tern_doc_service *svc, struct tern_rpc_ep *ep,
                                     unsigned slots);

struct tern_doc_service_stats {
    uint64_t commands;
    uint64_t batches_pushed, batches_inline;
    uint64_t sessions, cursors_open;
};
void tern_doc_service_get_stats(const struct tern_doc_service *svc,
                                struct tern_doc_service_stats *st);

/* Close the store. Unregister first (destroy the endpoint). */
void tern_doc_service_close(struct tern_doc_service *svc);

#ifdef __cplusplus
}
#endif

#endif
