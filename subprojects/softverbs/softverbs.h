/* softverbs: a user-space stand-in for an RDMA NIC, for machines without one.
 *
 * It implements the part of libibverbs that tern uses, on rdma-core's own
 * types (<infiniband/verbs.h>), with reliable-connected semantics between
 * processes of one host:
 *
 * - the data path is rdma-core's: ibv_post_send, ibv_post_recv,
 *   ibv_post_srq_recv, ibv_poll_cq and ibv_req_notify_cq are rdma-core's
 *   inline functions, which call through the context's ops table that
 *   softverbs fills in;
 * - set-up is called through sv_* functions with the signatures of their
 *   ibv_* namesakes, so a caller picks real verbs or softverbs with one
 *   table of function pointers and runs the same code on both;
 * - one-sided WRITE and READ land in or come from the peer's registered
 *   memory without the peer's CPU, after an rkey and bounds check against
 *   the peer's memory region table: by memcpy where the region is a
 *   shared file mapping the initiator can map too (a file with a path, or
 *   memory from sv_buf_alloc), as a NIC's DMA costs the initiator no
 *   system call; otherwise by process_vm_writev/readv from the initiator
 *   (always with SOFTVERBS_MAP=0); SEND and WRITE_WITH_IMM consume a
 *   receive request of the peer's QP or SRQ and complete on the peer's CQ;
 * - errors are the ones a NIC reports: a bad rkey or range is
 *   IBV_WC_REM_ACCESS_ERR, a bad lkey IBV_WC_LOC_PROT_ERR, a receive too
 *   small IBV_WC_REM_INV_REQ_ERR (and IBV_WC_LOC_LEN_ERR at the receiver),
 *   no receive posted is retried as RNR and ends in
 *   IBV_WC_RNR_RETRY_EXC_ERR, a dead or unconnected peer is
 *   IBV_WC_RETRY_EXC_ERR; the QP then moves to IBV_QPS_ERR and what is
 *   posted after completes with IBV_WC_WR_FLUSH_ERR.
 *
 * A process's device state (memory regions, receive queues, CQs) lives in a
 * shared-memory segment /dev/shm/softverbs.PID that peers map; its GID names
 * the process (PID and a random incarnation), so QPs connect as on RoCE:
 * IBV_QP_AV with a global route to the peer's GID and its QP number.
 *
 * Test hook: with SOFTVERBS_CQ_ENTRIES=n in the environment, CQs created
 * from then on hold at most n entries whatever size they were asked for
 * (and report), so that a CQ overrun can be provoked: the completion that
 * finds the CQ full is lost and ibv_poll_cq fails once the CQ is empty.
 */
#ifndef SOFTVERBS_H
#define SOFTVERBS_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* Remove the segments of processes that died without closing their device
 * (a new device does this by itself; a harness that SIGKILLs the last user
 * calls it before it exits). */
void sv_sweep_dead(void);

struct ibv_device **sv_get_device_list(int *num_devices);
void sv_free_device_list(struct ibv_device **list);
const char *sv_get_device_name(struct ibv_device *device);
struct ibv_context *sv_open_device(struct ibv_device *device);
int sv_close_device(struct ibv_context *context);
int sv_query_device(struct ibv_context *context, struct ibv_device_attr *attr);
int sv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);
int sv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);

struct ibv_pd *sv_alloc_pd(struct ibv_context *context);
int sv_dealloc_pd(struct ibv_pd *pd);
/* Memory for a region that peers write into or read from: a sealed memfd
 * mapped shared, which peers map on their first access instead of copying
 * by system call (map.c). Pages come on first touch. NULL with errno.
 * sv_buf_free takes it back (any thread); the region over it must be
 * deregistered first. A file-backed region of the caller's own (mmap of a
 * file with a path) is mapped by peers the same way; it must keep its
 * size while registered. */
void *sv_buf_alloc(size_t len);
void sv_buf_free(void *p, size_t len);
struct ibv_mr *sv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
/* EBUSY while a memory window is bound to the region. */
int sv_dereg_mr(struct ibv_mr *mr);
/* Type 2 windows only (bound by an IBV_WR_BIND_MW work request, reached
 * only through the QP that bound them); also in the context's ops, for
 * rdma-core's ibv_alloc_mw and ibv_dealloc_mw. */
struct ibv_mw *sv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int sv_dealloc_mw(struct ibv_mw *mw);

struct ibv_comp_channel *sv_create_comp_channel(struct ibv_context *context);
int sv_destroy_comp_channel(struct ibv_comp_channel *channel);
struct ibv_cq *sv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                            struct ibv_comp_channel *channel, int comp_vector);
int sv_destroy_cq(struct ibv_cq *cq);
int sv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
void sv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);

struct ibv_srq *sv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
int sv_destroy_srq(struct ibv_srq *srq);
struct ibv_qp *sv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
int sv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int sv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                struct ibv_qp_init_attr *init_attr);
int sv_destroy_qp(struct ibv_qp *qp);

/* rdma_cm twins (cm.c). Connection set-up runs over TCP between the two
 * processes at the IP addresses and ports the ids bind to and resolve;
 * that socket stays open while the connection lives, so a peer that
 * closes, disconnects or dies is seen as RDMA_CM_EVENT_DISCONNECTED, with
 * the QP moved to the error state as librdmacm does. Same conventions as
 * librdmacm: 0, or -1 with errno. The contexts returned by
 * sv_rdma_get_devices stay open for the life of the process. */
struct ibv_context **sv_rdma_get_devices(int *num_devices);
void sv_rdma_free_devices(struct ibv_context **list);
struct rdma_event_channel *sv_rdma_create_event_channel(void);
void sv_rdma_destroy_event_channel(struct rdma_event_channel *channel);
int sv_rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
                      void *context, enum rdma_port_space ps);
int sv_rdma_destroy_id(struct rdma_cm_id *id);
int sv_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr);
int sv_rdma_listen(struct rdma_cm_id *id, int backlog);
int sv_rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
                         struct sockaddr *dst_addr, int timeout_ms);
int sv_rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms);
int sv_rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
                      struct ibv_qp_init_attr *qp_init_attr);
void sv_rdma_destroy_qp(struct rdma_cm_id *id);
int sv_rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
int sv_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
int sv_rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len);
int sv_rdma_disconnect(struct rdma_cm_id *id);
int sv_rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event);
int sv_rdma_ack_cm_event(struct rdma_cm_event *event);
/* Close the context sv_rdma_get_devices opened, removing this process's
 * segment, once nothing made on it is left (no librdmacm twin: librdmacm
 * keeps its contexts until exit). -1 (EBUSY) while QPs remain. A later
 * sv_rdma_get_devices opens a new one. */
int sv_rdma_release_devices(void);

#endif
