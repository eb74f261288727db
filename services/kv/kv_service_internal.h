/* What the KV service's files share: the service object, and the one-sided
 * part (kv_service_onesided.c) the RPC handlers in kv_service.c hand over to. */
#ifndef TERN_KV_SERVICE_INTERNAL_H
#define TERN_KV_SERVICE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv.h"

struct kv_os;

/* The store behind the service (for a gateway on the same thread: ternd's
 * RESP gateway, rpcbench's space counters). */
struct kvs *kv_service_store(struct tern_kv_service *svc);

struct repl;

struct tern_kv_service {
    struct kvs *store;
    uint32_t lo, hi;
    struct tern_service def;
    struct kv_os *os;                /* one-sided paths; NULL until enabled */
    struct repl *repl;               /* replicated shard; NULL: alone */
};

/* Replicate the store as a shard of group `r` (services/repl): writes are
 * shipped and their replies wait for their write concern; a node that is
 * not the shard's primary answers TERN_ENOTPRIMARY. Call before serving. */
void kv_service_replicate(struct tern_kv_service *svc, struct repl *r);

/* Hold a PUT's or DELETE's reply (its request at data) for its write
 * concern; nothing on a shard that is not replicated. */
void kv_hold_write(struct tern_kv_service *svc, struct tern_req *req, const void *data);

/* 0 if this node may answer reads of the store; TERN_ENOTPRIMARY on a
 * replica that is not the primary. */
int kv_read_check(struct tern_kv_service *svc, bool any);

/* The store's side of a replication group (repl_store_ops), ctx = the
 * service. */
extern const struct repl_store_ops kv_repl_ops;

/* Does this server own the key's hash? */
bool kv_owns(const struct tern_kv_service *svc, const void *key, size_t klen);

/* Reply with a kv_val holding `version`. */
int kv_reply_version(struct tern_req *req, uint64_t version);

/* kv_service_onesided.c: handlers of KV_M_ONESIDED_INFO, KV_M_LEASE, KV_M_LPUT, KV_M_PGET (all
 * TERN_ENOTSUP until tern_kv_service_enable_onesided), the sessions' end,
 * and teardown. */
int kv_h_os_info(struct tern_req *req, const void *data, size_t len, void *ctx);
int kv_h_lease(struct tern_req *req, const void *data, size_t len, void *ctx);
int kv_h_lput(struct tern_req *req, const void *data, size_t len, void *ctx);
int kv_h_pget(struct tern_req *req, const void *data, size_t len, void *ctx);
void kv_onesided_session_closed(struct tern_session *s, void *ctx);
void kv_onesided_destroy(struct tern_kv_service *svc);

#endif
