/* tern RPC: services, sessions and calls over the transport layer.
 *
 * An RPC endpoint (tern_rpc_ep) belongs to one thread: it runs handlers and
 * continuations to completion inside tern_rpc_poll(), without locks. Run one
 * endpoint per thread and give each its own listen address or sessions.
 *
 * Servers register services: a 16-bit service id with a table of methods,
 * each a 16-bit id and a handler. A handler reads the request in place in the
 * receive buffer and writes its reply straight into the send buffer
 * (tern_reply_alloc), so neither side copies in tern.
 *
 * Clients open sessions ("tcp://host:port") and issue calls; each call has a
 * continuation that runs exactly once: with the reply, with the remote
 * handler's error code, or with a local error (deadline, cancellation,
 * connection loss).
 */
#ifndef TERN_RPC_H
#define TERN_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "error.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tern_rpc_ep;
struct tern_session;
struct tern_req;

/* ---- services (server side) ---- */

/* A handler. `data`/`len` is the request, valid until the handler returns.
 * Return 0 to send the reply built with tern_reply_alloc() (empty if none),
 * or a negative tern code that the caller's continuation receives as status. */
typedef int (*tern_handler_fn)(struct tern_req *req, const void *data, size_t len,
                               void *svc_ctx);

struct tern_method {
    uint16_t id;
    const char *name;
    tern_handler_fn handler;
    uint32_t flags;         /* reserved, 0 */
};

struct tern_service {
    const char *name;
    uint16_t id;
    const struct tern_method *methods;
    size_t n_methods;
    void *ctx;              /* passed to every handler */
    /* Optional: a client's session is gone (state kept for it can go). */
    void (*session_closed)(struct tern_session *s, void *ctx);
};

/* Reserve `len` bytes of reply in the send buffer; NULL if len is over the
 * smaller of this endpoint's and the client's maximum message size (the
 * handler then usually returns TERN_EMSGSIZE). Call at most once per request. */
void *tern_reply_alloc(struct tern_req *req, size_t len);

/* The largest reply tern_reply_alloc() may give this request. */
size_t tern_reply_max(const struct tern_req *req);

/* Shrink the reply reserved by tern_reply_alloc() to `len` bytes. */
void tern_reply_set_len(struct tern_req *req, size_t len);

/* Hold this request's reply until the endpoint's hold hooks have run:
 * once per poll, after every request the poll read was handled (a
 * service's group commit: the writes of the whole batch made durable with
 * one flush, then every reply of the batch sent). Once a reply is held,
 * every later reply of the same poll is held too, of any session, since it
 * may show what the held requests wrote. Without hooks it does nothing. If
 * a hook fails, each held reply becomes TERN_EIO. Call from the handler. */
void tern_req_hold(struct tern_req *req);

/* Add a hold hook (tern_req_hold) to the endpoint: fn(arg) runs on the
 * endpoint's thread inside tern_rpc_poll() whenever replies are held, and
 * returns 0 or a negative code. Up to 8 per endpoint (TERN_ENOSPC). fn and
 * arg must stay valid until removed or the endpoint is closed. */
int tern_rpc_add_hold_hook(struct tern_rpc_ep *ep, int (*fn)(void *arg), void *arg);
void tern_rpc_remove_hold_hook(struct tern_rpc_ep *ep, int (*fn)(void *arg), void *arg);

/* ---- gates: replies that wait for something after the poll ----
 *
 * A hold (above) ends with its poll. A gate holds replies for as long as a
 * service needs, say until enough backups acknowledged a write
 * (services/repl): the handler gives its reply a ticket, a number that never
 * goes down from one gated reply to the next (a log position), and the
 * service later passes the gate up to some ticket, which sends every reply
 * held with that ticket or a lower one, in the order they were gated. The
 * reply's header and payload are copied into the gate's buffer, which grows
 * and is then reused: no allocation per reply once warm. A gate belongs to
 * its endpoint's thread. A session that goes drops its gated replies. */
struct tern_rpc_gate;

/* A gate on `ep`; TERN_ENOMEM. */
int tern_rpc_gate_open(struct tern_rpc_ep *ep, struct tern_rpc_gate **out);

/* Fail every reply still held with TERN_ESHUTDOWN, then free the gate.
 * Close gates before their endpoint. NULL is ignored. */
void tern_rpc_gate_close(struct tern_rpc_gate *g);

/* Hold this request's reply (or its error) until the gate passes `ticket`.
 * A ticket lower than one gated before is raised to it (replies leave in
 * order). If the gate cannot hold it (no memory) the reply fails with
 * TERN_ENOMEM instead of going out early. Call from the handler. */
void tern_req_gate(struct tern_req *req, struct tern_rpc_gate *g, uint64_t ticket);

/* Send every held reply whose ticket is <= upto. */
void tern_rpc_gate_pass(struct tern_rpc_gate *g, uint64_t upto);

/* Replace the status of every held reply with `code` (negative) and send
 * them all: what a service does when it can no longer keep its promise
 * (it lost its office). */
void tern_rpc_gate_fail(struct tern_rpc_gate *g, int code);

/* Replies held now, and the lowest ticket among them (0 if none). */
unsigned tern_rpc_gate_waiting(const struct tern_rpc_gate *g, uint64_t *lowest);

/* Absolute CLOCK_MONOTONIC deadline of the request in ns, 0 if none. The
 * client's remaining budget travels with the request. */
uint64_t tern_req_deadline(const struct tern_req *req);

/* Ids of the request being served. */
uint16_t tern_req_service(const struct tern_req *req);
uint16_t tern_req_method(const struct tern_req *req);

/* ---- endpoints ---- */

/* `size`: sizeof(struct tern_rpc_config), or 0 for the fields below as of
 * tern 0.1 (see tern_tp_config). */
struct tern_rpc_config {
    uint32_t size;
    enum tern_tp_poll_mode mode; /* busy (default) or adaptive */
    uint64_t spin_ns;            /* adaptive: spin this long before sleeping; 0 = 50 us */
    size_t max_msg;              /* largest request or reply payload; 0 = 1 MiB */
    unsigned credits;            /* calls in flight per session; 0 = 32 */
    unsigned max_calls;          /* call slots per endpoint; 0 = 4096 */
    unsigned max_sessions;       /* 0 = 4096 */
    uint64_t hello_timeout_ns;   /* server: close clients silent this long; 0 = 5 s */
    uint64_t rma_timeout_ns;     /* one-sided operations not done this long complete
                                  * with TERN_ETIMEDOUT (the peer may still write
                                  * into a get's buffer later); 0 = 10 s */
    const char *fabrics;         /* auto:// policy, e.g. "shm,tcp": fabric names, or paths
                                  * named outright ("ntb://emu:CABLE/1"), best first;
                                  * NULL: $TERN_FABRICS or any */
    /* tern 0.2 */
    const void *key;             /* the cluster key, 16..64 bytes (copied): both ends of
                                  * every session prove they hold it (HMAC-SHA-256) before
                                  * any call or one-sided access; a peer without it gets
                                  * TERN_EAUTH. NULL: none */
    size_t key_len;
    int local_only;              /* server without a key: refuse clients that are not
                                  * processes of this host (tern_tp_conn_local) */
};

/* Create an endpoint. cfg may be NULL for defaults. */
int tern_rpc_open(const struct tern_rpc_config *cfg, struct tern_rpc_ep **out);

/* Fail every call, close every session, free the endpoint. */
void tern_rpc_close(struct tern_rpc_ep *ep);

/* Register a service; the struct and its method table must outlive the
 * endpoint. TERN_EEXIST if the id is taken, TERN_EINVAL for duplicate
 * method ids or a NULL handler. */
int tern_rpc_register(struct tern_rpc_ep *ep, const struct tern_service *svc);

/* Accept sessions at `uri` ("tcp://host:port"; port 0 picks one). The bound
 * URI is written to `bound` if not NULL. */
int tern_rpc_listen(struct tern_rpc_ep *ep, const char *uri, char *bound, size_t bound_len);

/* Make progress: run handlers, continuations, deadlines. Returns the number
 * of transport events handled (0 when idle), or a negative tern code if a
 * fabric failed as a whole in this poll (an RDMA completion queue that
 * overran): its sessions have failed with that code, or moved to their
 * standby path, and the fabric is not used again (a connect or listen on
 * it returns the code). Never blocks. */
int tern_rpc_poll(struct tern_rpc_ep *ep);

/* Poll until tern_rpc_stop() or `timeout_ns` elapses (-1: no limit). In
 * adaptive mode it sleeps on the transport's fd when idle. */
int tern_rpc_run(struct tern_rpc_ep *ep, int64_t timeout_ns);

/* For an application that sleeps in its own loop (say with other sockets):
 * an fd that polls readable when the endpoint may have work (-1 before the
 * first listen or connect). Call tern_rpc_arm() before sleeping on it. The
 * fd changes when a listen or connect brings in a second fabric: fetch it
 * after the last one. */
int tern_rpc_wait_fd(const struct tern_rpc_ep *ep);

/* Get ready to sleep on tern_rpc_wait_fd(): 0 if that is safe, TERN_EAGAIN
 * if work is already pending (poll again instead), as tern_tp_arm() says
 * it, or another negative tern code. */
int tern_rpc_arm(struct tern_rpc_ep *ep);

/* Make tern_rpc_run() return; safe from a handler or a signal handler. */
void tern_rpc_stop(struct tern_rpc_ep *ep);

/* ---- sessions and calls (client side) ---- */

/* Open a session to `uri` and wait up to timeout_ns for the handshake.
 * "auto://host:port" first connects over TCP, learns the fabrics the server
 * listens on, and moves to the best one both ends can use (shm on the same
 * host), staying on TCP if none is better or the move fails.
 * TERN_ECONNREFUSED, TERN_ETIMEDOUT, TERN_EVERSION, TERN_EBADADDR, ... */
int tern_rpc_connect(struct tern_rpc_ep *ep, const char *uri, uint64_t timeout_ns,
                     struct tern_session **out);

/* tern_rpc_connect without waiting: the session is returned at once with
 * its handshake under way in tern_rpc_poll (a peer that is stopped, or
 * whose packets are dropped, costs the caller nothing while it waits).
 * tern_session_status() says TERN_EINPROGRESS until the handshake is
 * done, then 0, or the error that ended it (TERN_ETIMEDOUT after
 * timeout_ns; 0 = 5 s). Calls made meanwhile wait in the session and go
 * when it opens. An auto:// session starts on TCP and moves to the best
 * fabric both ends can use once it is open (as a failed-over session moves
 * back). The caller owns the session (tern_rpc_disconnect). Errors known
 * at once: TERN_EBADADDR, TERN_ENOFABRIC, TERN_ENOMEM, the fabric's
 * connect errors. Thread: the endpoint's. */
int tern_rpc_connect_start(struct tern_rpc_ep *ep, const char *uri, uint64_t timeout_ns,
                           struct tern_session **out);

/* tern_rpc_connect for an auto:// URI with its own fabric policy
 * ("ntb,rdma,tcp": the fabrics this session may use, best first) in place
 * of the endpoint's. An auto:// session keeps a TCP standby while it runs
 * on another fabric, fails over to it without losing a call, moves back to
 * a better fabric when that one answers again (tried 200 ms after a
 * failure, backing off to 5 s), and dials a new standby after a failover.
 * TERN_EINVAL if uri is not auto://. */
int tern_rpc_connect_with(struct tern_rpc_ep *ep, const char *uri, const char *fabrics,
                          uint64_t timeout_ns, struct tern_session **out);

/* What a client session has done, for an operator's view. `size` is set by
 * the caller to sizeof(struct tern_session_info); fields past it are not
 * written. Strings stay valid until the session moves or closes. */
struct tern_session_info {
    uint32_t size;
    const char *fabric;             /* "shm", "tcp", ... */
    const char *peer;               /* the peer's address on that fabric */
    uint64_t calls;                 /* completed calls, errors included */
    uint64_t errors;                /* completed with a negative status */
    uint64_t bytes_out, bytes_in;   /* requests and replies, headers included */
    uint32_t failovers;             /* moves to the standby after a failure */
    uint32_t moves;                 /* moves to a better path */
    uint32_t credits;               /* calls the server lets it have in flight */
    uint32_t in_flight, queued;     /* calls sent and waiting now */
    uint32_t epoch;                 /* tern_session_epoch */
    bool standby;                   /* a path to fail over to is ready */
};

/* Fill *out (out->size set by the caller). Client sessions only count
 * calls; TERN_EINVAL. Thread: the endpoint's. */
int tern_session_info(const struct tern_session *s, struct tern_session_info *out);

/* Close a session; calls still in flight complete with TERN_ECANCELED. */
void tern_rpc_disconnect(struct tern_session *s);

/* 0 while the session is open, TERN_EINPROGRESS while its handshake is
 * under way (tern_rpc_connect_start), else the error that ended it. */
int tern_session_status(const struct tern_session *s);

/* The fabric a session runs on ("tcp", "shm", ...). */
const char *tern_session_fabric(const struct tern_session *s);

/* What the fabric the session runs on now can do: TERN_TP_CAP_* bits of
 * transport.h. Services choose their paths by these, never by the fabric's
 * name: TERN_TP_CAP_RMA_OFFLOAD says one-sided operations complete without
 * the server's CPU, TERN_TP_CAP_PUT/GET that they exist at all. The answer
 * changes when an auto:// session moves (tern_session_epoch). */
uint32_t tern_session_caps(const struct tern_session *s);

/* The longest single tern_session_put or tern_session_get the session
 * carries now (the smaller of its fabric's tern_tp_rma_max and the peer's
 * max_msg); 0 without one-sided operations. Like the caps, it changes when
 * an auto:// session moves. */
size_t tern_session_rma_max(const struct tern_session *s);

/* Calls the server lets this session have in flight at once. */
unsigned tern_session_credits(const struct tern_session *s);

/* Continuation: status 0 with the reply (valid during the call only), or a
 * negative tern code with reply NULL. */
typedef void (*tern_cont_fn)(void *arg, int status, const void *reply, size_t len);

/* Start a call. `req` must stay valid until the continuation runs (calls
 * beyond the session's credits wait in a queue). timeout_ns 0 = no deadline;
 * otherwise the call fails with TERN_ETIMEDOUT once timeout_ns have passed
 * (counted from when it is sent, to within 64 polls of the endpoint;
 * checked about every 100 us).
 * len may not exceed the smaller of both ends' max_msg (TERN_EMSGSIZE).
 * *call_id (if not NULL) names the call for tern_call_cancel(). Returns 0,
 * or TERN_ENOBUFS (no call slot), TERN_ENOTCONN, TERN_EMSGSIZE, TERN_EINVAL. */
int tern_call(struct tern_session *s, uint16_t svc, uint16_t method, const void *req,
              size_t len, uint64_t timeout_ns, tern_cont_fn cont, void *arg,
              uint64_t *call_id);

/* The largest request (and reply) payload the session carries: the
 * smaller of both ends' max_msg once the handshake is done, this end's
 * before. 0 for NULL. */
size_t tern_session_msg_max(const struct tern_session *s);

/* tern_call with the request gathered from up to TERN_CALL_IOV_MAX pieces
 * (say a small header, a key and a value), copied straight into the send
 * buffer. Every piece must stay valid until the continuation runs. */
#define TERN_CALL_IOV_MAX 4
int tern_callv(struct tern_session *s, uint16_t svc, uint16_t method, const struct iovec *iov,
               unsigned iovcnt, uint64_t timeout_ns, tern_cont_fn cont, void *arg,
               uint64_t *call_id);

/* Cancel a call: its continuation runs now with TERN_ECANCELED and a late
 * reply is dropped. TERN_ENOENT if it already completed. */
int tern_call_cancel(struct tern_session *s, uint64_t call_id);

/* Call and wait. The reply is copied into reply/reply_cap (TERN_EMSGSIZE if
 * it does not fit) and its length stored in *reply_len. Returns the call's
 * status. Do not call from a handler or continuation. */
int tern_call_sync(struct tern_session *s, uint16_t svc, uint16_t method, const void *req,
                   size_t len, void *reply, size_t reply_cap, size_t *reply_len,
                   uint64_t timeout_ns);

/* ---- one-sided access through sessions ---- */

struct tern_rpc_mr;

/* Register memory for one-sided access by the peers of this endpoint, on
 * each of its fabrics (registered on a fabric the first time a session on
 * it needs the region). fd < 0: plain memory. fd >= 0: `addr` is a
 * MAP_SHARED mapping of that file at page-aligned `fd_off`, which peers on
 * the same host (shm) map themselves (see tern_tp_mr_reg_fd). The caller
 * keeps the memory; unmap it after tern_rpc_mr_dereg. */
int tern_rpc_mr_reg(struct tern_rpc_ep *ep, void *addr, size_t len, int fd, uint64_t fd_off,
                    uint32_t access, struct tern_rpc_mr **out);

/* Allocate `len` zeroed, page-aligned bytes backed by a memfd and register
 * them as tern_rpc_mr_reg does; tern_rpc_mr_dereg frees them. */
int tern_rpc_mr_alloc(struct tern_rpc_ep *ep, size_t len, uint32_t access,
                      struct tern_rpc_mr **out);

/* The region's memory in this process, and its length. */
void *tern_rpc_mr_addr(const struct tern_rpc_mr *mr);
size_t tern_rpc_mr_len(const struct tern_rpc_mr *mr);

/* Deregister on every fabric (and free tern_rpc_mr_alloc memory). One-sided
 * operations in flight from it complete with an error. */
void tern_rpc_mr_dereg(struct tern_rpc_mr *mr);

/* The key with which the peer of session `s` reaches `mr` (registering it
 * on the session's fabric if needed; tern_tp_conn_mr_rkey on its current
 * connection). Keys belong to the connection (rdma binds a memory window
 * to it) or to the fabric: a session that moves to another connection
 * (tern_session_epoch changes) needs a new one. Send it in a reply or a
 * call on `s`. */
int tern_rpc_mr_rkey(struct tern_rpc_mr *mr, const struct tern_session *s,
                     struct tern_tp_rkey *out);

/* The session a request arrived on (valid while the handler runs; a server
 * may use it for one-sided access to the client's memory). */
struct tern_session *tern_req_session(const struct tern_req *req);

/* A counter that changes whenever the session moves to another connection
 * (failover): keys and pointers learned before it changed are stale. */
uint32_t tern_session_epoch(const struct tern_session *s);

/* Completion of a one-sided operation: 0 or a negative tern code. Runs
 * inside tern_rpc_poll(). */
typedef void (*tern_rma_fn)(void *arg, int status);

/* Write `len` bytes of local region `lmr` at `loff` into the peer's region
 * `rkey` at `roff` (get: read them). The completion runs once, also when the
 * session dies first. Messages (calls, replies) posted on the session after
 * the put reach the peer after its data: a put followed by a call needs no
 * wait for the put's completion. A handler that puts data to its caller
 * posts the put before tern_reply_alloc(): the reply takes its place in
 * the send queue when it is allocated, so a put posted after that reaches
 * the caller after the reply. An operation the fabric has not finished
 * after the endpoint's rma_timeout_ns completes with TERN_ETIMEDOUT; its
 * local memory may still be written (get) or read (put) until the fabric
 * lets go, so a caller must not trust or reuse it. TERN_ENOBUFS: too many
 * operations in flight (poll, retry); TERN_EAGAIN: the fabric's queue is
 * full (poll, retry); TERN_ENOTSUP, TERN_EINVAL, TERN_ENOTCONN. */
int tern_session_put(struct tern_session *s, struct tern_rpc_mr *lmr, size_t loff, size_t len,
                     const struct tern_tp_rkey *rkey, uint64_t roff, tern_rma_fn cb, void *arg);
int tern_session_get(struct tern_session *s, struct tern_rpc_mr *lmr, size_t loff, size_t len,
                     const struct tern_tp_rkey *rkey, uint64_t roff, tern_rma_fn cb, void *arg);

/* A direct pointer to the peer's memory, where the session's fabric maps it
 * (shm); see tern_tp_rkey_ptr for the codes and the rules. */
int tern_session_rkey_ptr(struct tern_session *s, const struct tern_tp_rkey *rkey,
                          uint64_t roff, size_t len, uint32_t need, void **ptr);

/* Calls started and not yet completed on this endpoint. */
unsigned tern_rpc_calls_in_flight(const struct tern_rpc_ep *ep);

/* CLOCK_MONOTONIC in ns (vDSO, no system call). */
uint64_t tern_now_ns(void);

#ifdef __cplusplus
}
#endif

#endif
