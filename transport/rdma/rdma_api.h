/* The verbs and rdma_cm calls the rdma fabric makes, as one table of
 * function pointers with two providers: rdma-core (libibverbs + librdmacm,
 * a real NIC or soft-RoCE) and softverbs (the user-space emulation in
 * subprojects/softverbs). The fabric code is the same for both; only the
 * set-up calls go through the table. The data-path verbs (ibv_post_send,
 * ibv_post_srq_recv, ibv_poll_cq, ibv_req_notify_cq) are rdma-core's inline
 * functions, which dispatch through the context's own ops on either
 * provider. */
#ifndef TERN_RDMA_API_H
#define TERN_RDMA_API_H

#include <stdbool.h>
#include <stddef.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

struct tern_rdma_api {
    const char *name;           /* "verbs" or "softverbs" */
    bool emulated;

    struct ibv_context **(*get_devices)(int *num);
    void (*free_devices)(struct ibv_context **list);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);

    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    /* Optional: memory for a ring that peers write into, from the
     * provider (softverbs: memory peers map instead of copying by system
     * call). NULL: anonymous pages. buf_free is called after dereg_mr. */
    void *(*buf_alloc)(size_t len);
    void (*buf_free)(void *p, size_t len);

    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *ch, int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
    struct ibv_srq *(*create_srq)(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
    int (*destroy_srq)(struct ibv_srq *srq);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);

    struct rdma_event_channel *(*create_event_channel)(void);
    void (*destroy_event_channel)(struct rdma_event_channel *ch);
    int (*create_id)(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *context,
                     enum rdma_port_space ps);
    int (*destroy_id)(struct rdma_cm_id *id);
    int (*bind_addr)(struct rdma_cm_id *id, struct sockaddr *addr);
    int (*listen)(struct rdma_cm_id *id, int backlog);
    int (*resolve_addr)(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
                        int timeout_ms);
    int (*resolve_route)(struct rdma_cm_id *id, int timeout_ms);
    int (*create_qp)(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    void (*destroy_qp)(struct rdma_cm_id *id);
    int (*connect)(struct rdma_cm_id *id, struct rdma_conn_param *param);
    int (*accept)(struct rdma_cm_id *id, struct rdma_conn_param *param);
    int (*reject)(struct rdma_cm_id *id, const void *data, uint8_t len);
    int (*disconnect)(struct rdma_cm_id *id);
    int (*get_cm_event)(struct rdma_event_channel *ch, struct rdma_cm_event **ev);
    int (*ack_cm_event)(struct rdma_cm_event *ev);
    /* Optional: give the provider's device contexts back once no endpoint
     * uses them (softverbs removes its /dev/shm segment). */
    int (*release_devices)(void);
};

extern const struct tern_rdma_api rdma_api_verbs;
extern const struct tern_rdma_api rdma_api_soft;

/* A device the fabric can use: its context (owned by the provider's
 * rdma_cm, never closed), the port and a description. */
struct tern_rdma_dev {
    const struct tern_rdma_api *api;
    struct ibv_context *ctx;
    uint8_t port;
    char desc[160];
};

/* Pick the provider and device for a new endpoint. TERN_RDMA_PROVIDER
 * chooses: "verbs" (rdma-core, a device with an active port and a GID is
 * required), "softverbs" (the emulation), or unset/"auto": rdma-core when
 * the host has any RDMA device, else softverbs. 0 or a negative tern code
 * with the reason in dev->desc. */
int rdma_dev_pick(struct tern_rdma_dev *dev);

/* Whether rdma-core sees a usable device here (an active port with a GID),
 * described in `desc`; the result of the first call is kept. */
bool rdma_hw_usable(char *desc, size_t len);

#endif
