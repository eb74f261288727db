/* The rdma-core provider: libibverbs and librdmacm, for a real NIC or
 * soft-RoCE. Wrappers exist only where rdma-core's names are macros. */
#include "rdma_api.h"

static int query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
    return ibv_query_port(ctx, port, attr);
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    return ibv_reg_mr(pd, addr, len, access);
}

const struct tern_rdma_api rdma_api_verbs = {
    .name = "verbs",
    .emulated = false,
    .get_devices = rdma_get_devices,
    .free_devices = rdma_free_devices,
    .query_device = ibv_query_device,
    .query_port = query_port,
    .query_gid = ibv_query_gid,
    .alloc_pd = ibv_alloc_pd,
    .dealloc_pd = ibv_dealloc_pd,
    .reg_mr = reg_mr,
    .dereg_mr = ibv_dereg_mr,
    .create_comp_channel = ibv_create_comp_channel,
    .destroy_comp_channel = ibv_destroy_comp_channel,
    .create_cq = ibv_create_cq,
    .destroy_cq = ibv_destroy_cq,
    .get_cq_event = ibv_get_cq_event,
    .ack_cq_events = ibv_ack_cq_events,
    .create_srq = ibv_create_srq,
    .destroy_srq = ibv_destroy_srq,
    .modify_qp = ibv_modify_qp,
    .create_event_channel = rdma_create_event_channel,
    .destroy_event_channel = rdma_destroy_event_channel,
    .create_id = rdma_create_id,
    .destroy_id = rdma_destroy_id,
    .bind_addr = rdma_bind_addr,
    .listen = rdma_listen,
    .resolve_addr = rdma_resolve_addr,
    .resolve_route = rdma_resolve_route,
    .create_qp = rdma_create_qp,
    .destroy_qp = rdma_destroy_qp,
    .connect = rdma_connect,
    .accept = rdma_accept,
    .reject = rdma_reject,
    .disconnect = rdma_disconnect,
    .get_cm_event = rdma_get_cm_event,
    .ack_cm_event = rdma_ack_cm_event,
};
