/* What the KV client's files share: kv_client.c (routing, RPC calls, the
 * sync forms) and kv_client_os.c (the one-sided paths). */
#ifndef TERN_KV_CLIENT_INTERNAL_H
#define TERN_KV_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kv.h"
#include "kv_window.h"
#include "kv_wire.h"

#define KV_OPS 4096                  /* async calls in flight per client */

/* A server's one-sided state, learned through KV_M_OS_INFO and KV_M_LEASE. */
struct kv_os_srv {
    enum { OS_UNKNOWN, OS_ASKING, OS_READY, OS_OFF } state;
    uint32_t epoch;                  /* tern_session_epoch when learned */
    bool offload;   /* one-sided operations cost the server no CPU */
    struct kv_os_info info;
    bool leasing, leased;            /* a LEASE call in flight; a lease held */
    bool populated;                  /* the lease's pages are mapped in (shm) */
    struct kv_lease lease;
    uint32_t next;                   /* where the next record goes in the lease */
    struct kv_lease_req lreq;        /* the LEASE request while in flight */
    struct tern_tp_rkey stage_rkey;  /* our staging slots, for this server's pushes */
};

struct kv_server {
    struct tern_kv *kv;
    struct tern_session *s;
    uint32_t lo, hi;
    struct kv_os_srv os;
};

struct kv_op {
    struct tern_kv *kv;
    tern_kv_cb cb;
    void *arg;
    struct kv_key hdr;
    uint32_t next_free;              /* + 1; 0 ends the free list */
    /* one-sided ops */
    struct kv_server *srv;
    const void *key, *val;
    uint16_t klen;
    uint32_t vlen;
    uint64_t hash;
    int stage;                       /* staging slot, or -1 */
    unsigned tries;
    struct kvw_bucket bk;            /* the key's bucket as read */
    struct kv_lput lput;             /* the LPUT request while in flight */
    struct kv_pget pget;             /* the PGET request while in flight */
};

struct kv_os_client;

struct tern_kv {
    struct tern_rpc_ep *ep;
    struct kv_server *srv;           /* sorted by range */
    unsigned n;
    uint64_t timeout;
    enum tern_kv_path path;
    struct kv_os_client *os;         /* NULL until the one-sided path is chosen */
    struct kv_op ops[KV_OPS];
    uint32_t free_head;
};

/* kv_client.c */
struct kv_server *kv_route(struct tern_kv *kv, const void *key, size_t klen);
struct kv_op *kv_op_get(struct tern_kv *kv);
void kv_op_put(struct tern_kv *kv, struct kv_op *op);
/* Send op (filled by the caller: kv, cb, arg) as an RPC. Frees op on failure. */
int kv_op_call(struct kv_op *op, uint16_t method, const void *key, size_t klen,
               const void *val, size_t len);

/* kv_client_os.c */
int kv_os_get(struct tern_kv *kv, const void *key, size_t klen, tern_kv_cb cb, void *arg);
int kv_os_put(struct tern_kv *kv, const void *key, size_t klen, const void *val, size_t len,
              tern_kv_cb cb, void *arg);
void kv_os_free(struct tern_kv *kv);

#endif
