/* tern transport: one fabric-independent API over every fabric built in
 * (tern_tp_fabric_names(); docs/ARCHITECTURE.md lists them).
 *
 * A transport endpoint (tern_tp_ep) belongs to one thread and one fabric. It
 * owns listeners, connections and registered memory, and reports everything
 * that happens through tern_tp_poll(). Nothing here takes a lock: use one
 * endpoint per thread.
 *
 * Contract, identical on every fabric:
 *  - a connection is reliable and in order;
 *  - posted messages and one-sided operations leave at the latest at the
 *    next tern_tp_flush() or tern_tp_poll(), so a batch of posts costs one
 *    doorbell (one send() on TCP) per connection;
 *  - messages: reserve send space with tern_tp_msg_alloc(), write the payload
 *    in place, publish it with tern_tp_msg_post(). A received message is a
 *    view into the receive buffer, valid until tern_tp_msg_release();
 *    views of one connection are released in the order they arrived;
 *    reservations and views are 8-byte aligned;
 *  - one-sided access: tern_tp_put()/tern_tp_get() at (remote key, offset,
 *    length) on memory the peer registered. The key, the bounds and the
 *    permission are checked on every fabric; a violation completes the
 *    operation with TERN_EREMACCESS and the connection stays usable, up to
 *    a small limit after which the fabric hangs up (as a NIC breaks the
 *    queue pair). On rdma the NIC checks the key: the length and rights a
 *    tern_tp_rkey states are checked before posting, but a wrong or stale
 *    key breaks the queue pair at once and the connection closes with
 *    TERN_EREMACCESS;
 *  - an operation a fabric does not implement returns TERN_ENOTSUP, and the
 *    capability bits say in advance which ones exist.
 */
#ifndef TERN_TRANSPORT_H
#define TERN_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tern_tp_ep;
struct tern_tp_conn;
struct tern_tp_mr;

/* Capability bits of a fabric; each one matches a non-NULL op. */
enum tern_tp_cap {
    TERN_TP_CAP_MSG = 1u << 0,     /* msg_alloc / msg_post / msg_release */
    TERN_TP_CAP_PUT = 1u << 1,     /* one-sided write */
    TERN_TP_CAP_GET = 1u << 2,     /* one-sided read */
    TERN_TP_CAP_WAIT_FD = 1u << 3, /* a file descriptor to block on */
    TERN_TP_CAP_LISTEN = 1u << 4,  /* accepts connections */
    TERN_TP_CAP_CONNECT = 1u << 5, /* opens connections */
    TERN_TP_CAP_RKEY_PTR = 1u << 6, /* tern_tp_rkey_ptr (shm) */
    /* put/get complete without the peer's CPU (a NIC, or stores into the
     * peer's mapped memory); without it the peer's poll serves them. Not
     * an op of its own: it needs PUT and GET. */
    TERN_TP_CAP_RMA_OFFLOAD = 1u << 7,
    /* A wrong or stale remote key closes the connection with
     * TERN_EREMACCESS (a NIC breaks its queue pair) instead of failing the
     * one operation. Not an op either. */
    TERN_TP_CAP_STRICT_RKEY = 1u << 8,
    /* A listener is reached by one peer endpoint only: an address names a
     * link between two ends (a device's), not a place many connect to.
     * Not an op either. */
    TERN_TP_CAP_POINT_TO_POINT = 1u << 9,
};

enum tern_tp_poll_mode {
    TERN_TP_POLL_BUSY = 0,     /* callers spin on tern_tp_poll() */
    TERN_TP_POLL_ADAPTIVE = 1, /* spin while busy, sleep in tern_tp_wait() */
};

/* Endpoint configuration. `size`: sizeof(struct tern_tp_config), or 0 for
 * the fields below as of tern 0.1; fields added later are read only when
 * the caller's size covers them (the struct may grow without breaking
 * callers built against an older header). */
struct tern_tp_config {
    uint32_t size;
    const char *fabric;          /* one of tern_tp_fabric_names() */
    enum tern_tp_poll_mode mode;
    size_t max_msg;              /* largest message; 0 = 1 MiB */
    size_t conn_buf;             /* per-connection buffer cap; 0 = 4 x max_msg */
    unsigned max_conns;          /* 0 = 4096 */
};

/* Memory access rights granted to peers on a registered region. */
enum tern_tp_access {
    TERN_TP_ACCESS_LOCAL = 0,
    TERN_TP_ACCESS_REMOTE_READ = 1u << 0,
    TERN_TP_ACCESS_REMOTE_WRITE = 1u << 1,
};

/* What a peer needs to reach a registered region. Plain data: send it to the
 * peer in a message. `addr` is the region's base in the owner's address space
 * (RDMA needs it); offsets in put/get are relative to the region start. */
struct tern_tp_rkey {
    uint64_t addr;
    uint64_t len;
    uint32_t key;
    uint32_t access;
};

enum tern_tp_event_type {
    TERN_TP_EV_RECV = 1,   /* data/len: a message view; release it */
    TERN_TP_EV_PUT_DONE,   /* token, status */
    TERN_TP_EV_GET_DONE,   /* token, status; the local buffer is filled */
    TERN_TP_EV_CONNECTED,  /* an outgoing connection is up (status 0) or failed */
    TERN_TP_EV_ACCEPTED,   /* a new incoming connection */
    TERN_TP_EV_CLOSED,     /* the connection is gone; status says why */
    TERN_TP_EV_WRITABLE,   /* send space is back after TERN_EAGAIN */
};

struct tern_tp_event {
    enum tern_tp_event_type type;
    int status;                 /* 0 or a negative tern code */
    struct tern_tp_conn *conn;
    const void *data;           /* RECV only */
    size_t len;                 /* RECV only */
    uint64_t token;             /* PUT_DONE / GET_DONE: the caller's token */
};

/* Names of the fabrics built into this library, NULL-terminated. */
const char *const *tern_tp_fabric_names(void);

/* Look for a fabric's hardware. 0 if it is usable (a one-line description
 * in `desc`), TERN_ENODEV if absent, TERN_ENOFABRIC if not built in. `args`
 * is fabric-specific (its doc in docs/ says; NULL asks for real hardware);
 * a fabric with no hardware of its own is always usable. */
int tern_tp_probe(const char *fabric, const char *args, char *desc, size_t desc_len);

/* Which built-in fabric "fabric://..." names: its index in
 * tern_tp_fabric_names(). TERN_EBADADDR if `uri` has no "fabric://",
 * TERN_ENOFABRIC if that fabric is not built in. */
int tern_tp_uri_fabric(const char *uri);

/* The index in tern_tp_fabric_names() of the fabric `ep` runs on. */
int tern_tp_fabric_id(const struct tern_tp_ep *ep);

/* Whether peers can pick `ep`'s fabric from an advertisement of its
 * listeners (tern_tp_select); false for tcp, the bootstrap itself. */
bool tern_tp_selectable(const struct tern_tp_ep *ep);

/* Capability bits of a built-in fabric by name (0 if not built in). */
uint32_t tern_tp_fabric_caps(const char *fabric);

/* Write to `uri` an address on `fabric` ("fabric://...") that a server on
 * this host can listen on and processes of this host can reach, unique per
 * `tag` (a pid, a test name): a loopback port, a named shared-memory
 * listener, an emulated device where the fabric has one. With tag NULL
 * the fabric names the listener itself when it binds (any free port, an
 * "auto" name): the bound address says which. TERN_ENOFABRIC if the fabric
 * is not built in, TERN_EINVAL if it does not fit. */
int tern_tp_local_uri(const char *fabric, const char *tag, char *uri, size_t len);

/* How results should name the fabric of bound address `uri`: the fabric's
 * name, or "NAME-emu" when it runs on an emulated device (a device file
 * standing in for a PCIe link, a user-space NIC). Returns `buf`; "?" for an
 * unknown fabric. */
const char *tern_tp_uri_label(const char *uri, char *buf, size_t len);

/* Remove what processes of this host that died left behind on every
 * fabric (emulated devices nobody holds, a user-space NIC's segments). Safe
 * while other processes run: only what no live process uses goes. */
void tern_tp_sweep(void);

/* Pull the cable of an emulated NTB device ("ntb://emu:NAME", every
 * partition) or plug it back, as a test or a demo pulls a real one: both
 * ends see the link down within a heartbeat (100 ms) and their
 * connections fail (auto:// sessions move to their standby); plugged, the
 * link comes up again. TERN_ENOENT if no process has the device open,
 * TERN_EBADADDR if uri names no emulated device. */
int tern_tp_emu_cable(const char *uri, bool plugged);

/* This node's identity for same-host fabrics: boot id and network
 * namespace ("<boot_id>.<netns inode>"). */
int tern_tp_node_id(char *out, size_t len);

/* Pick the best fabric from a peer's advertisements, `ads` being
 * "fabric://addr@node;..." as the peer listens. Keeps those reachable from
 * here (shm: same node id), orders them by `policy` (comma-separated fabric
 * names, e.g. "shm,tcp"; NULL or "" = any) and then by score (latency, then
 * bandwidth). Writes "fabric://addr" to `uri`; TERN_ENOENT if none fits. */
int tern_tp_select(const char *ads, const char *policy, char *uri, size_t len);

/* Every fabric tern_tp_select would consider, best first: up to `max`
 * URIs written at uris, uris + stride, ... (each NUL-terminated; an entry
 * longer than stride - 1 is left out). Returns how many, or TERN_EINVAL. */
int tern_tp_select_list(const char *ads, const char *policy, char *uris, size_t stride,
                        unsigned max);

/* Open an endpoint on cfg->fabric. Returns 0 or TERN_ENOFABRIC, TERN_EINVAL,
 * TERN_ENOMEM. */
int tern_tp_open(const struct tern_tp_config *cfg, struct tern_tp_ep **out);

/* Close every connection and listener, free the endpoint. */
void tern_tp_close(struct tern_tp_ep *ep);

/* The fabric's capability bits (enum tern_tp_cap). */
uint32_t tern_tp_caps(const struct tern_tp_ep *ep);

/* The fabric's name, e.g. "tcp". */
const char *tern_tp_fabric(const struct tern_tp_ep *ep);

/* Largest message this endpoint sends or accepts. */
size_t tern_tp_max_msg(const struct tern_tp_ep *ep);

/* Accept connections at `addr` (fabric syntax; tcp: "host:port", port 0 picks
 * one). The bound address is written to `bound` if it is not NULL. */
int tern_tp_listen(struct tern_tp_ep *ep, const char *addr, char *bound, size_t bound_len);

/* Start connecting to `addr`. The connection exists at once (messages may be
 * queued on it); TERN_TP_EV_CONNECTED reports the outcome. */
int tern_tp_connect(struct tern_tp_ep *ep, const char *addr, struct tern_tp_conn **out);

/* Close a connection and free it. Views still held on it become invalid.
 * Also frees a connection after its TERN_TP_EV_CLOSED event. */
void tern_tp_disconnect(struct tern_tp_conn *conn);

/* Attach / read an application pointer on a connection. */
void tern_tp_conn_set_user(struct tern_tp_conn *conn, void *user);
void *tern_tp_conn_user(const struct tern_tp_conn *conn);

/* The endpoint a connection belongs to. */
struct tern_tp_ep *tern_tp_conn_ep(const struct tern_tp_conn *conn);

/* One-sided access before authentication: after tern_tp_ep_gate_rma,
 * connections the endpoint makes or accepts refuse a peer's put or get
 * that this side serves (tcp, shm, ntb: TERN_EREMACCESS to the peer) and
 * give out no key (tern_tp_conn_mr_rkey: TERN_EAUTH) until
 * tern_tp_conn_open_rma; shm hands a region's file only to a peer with an
 * open connection. On rdma the NIC serves one-sided access without the
 * CPU: there no key reaches a region but one bound to the connection
 * (memory windows), and none is bound before the connection is open. The
 * RPC core does this for endpoints with a cluster key. Thread: the
 * endpoint's. */
void tern_tp_ep_gate_rma(struct tern_tp_ep *ep);
void tern_tp_conn_open_rma(struct tern_tp_conn *conn);
bool tern_tp_conn_rma_open(const struct tern_tp_conn *conn);

/* Whether the connection's peer is a process of this host and network
 * namespace (shm; tcp over loopback or one of this host's addresses).
 * False for another host, which an NTB cable or a NIC (emulated or not)
 * stands for. */
bool tern_tp_conn_local(const struct tern_tp_conn *conn);

/* Peer address as text ("host:port" on tcp). */
const char *tern_tp_conn_peer(const struct tern_tp_conn *conn);

/* The longest single tern_tp_put or tern_tp_get this connection takes: the
 * endpoint's max_msg, or less where the fabric carries one-sided operations
 * in its own records (shm and ntb: a quarter of the ring). Longer ones fail
 * with TERN_EMSGSIZE; callers split them or send the data another way.
 * 0 on a fabric without one-sided operations. Any thread that owns conn. */
size_t tern_tp_rma_max(const struct tern_tp_conn *conn);

/* Reserve `len` bytes of send space; *buf points at it. One reservation per
 * connection at a time: post or abort it before the next. TERN_EAGAIN when
 * the send path is full (wait for TERN_TP_EV_WRITABLE), TERN_EMSGSIZE if
 * len > max_msg, TERN_ENOTCONN on a closed connection. */
int tern_tp_msg_alloc(struct tern_tp_conn *conn, size_t len, void **buf);

/* Publish the reservation `buf` with its first `len` bytes (len may be less
 * than reserved). */
int tern_tp_msg_post(struct tern_tp_conn *conn, void *buf, size_t len);

/* Drop a reservation without sending it. */
void tern_tp_msg_abort(struct tern_tp_conn *conn, void *buf);

/* Convenience: alloc + copy + post. */
int tern_tp_msg_send(struct tern_tp_conn *conn, const void *data, size_t len);

/* Give a received view back to the transport. */
void tern_tp_msg_release(struct tern_tp_conn *conn, const void *view);

/* Register [addr, addr+len) for one-sided access with `access` rights. */
int tern_tp_mr_reg(struct tern_tp_ep *ep, void *addr, size_t len, uint32_t access,
                   struct tern_tp_mr **out);

/* Allocate `len` bytes (zeroed, page aligned) and register them with
 * `access`. On the shm fabric peers map such memory, so their put and get
 * become plain stores and loads with no help from this side's CPU (memory
 * registered with tern_tp_mr_reg is reached through this side's poll).
 * tern_tp_mr_dereg frees it. */
int tern_tp_mr_alloc(struct tern_tp_ep *ep, size_t len, uint32_t access,
                     struct tern_tp_mr **out);

/* Register memory that is a MAP_SHARED mapping of file `fd` at page-aligned
 * offset `fd_off` (a pool file, a memfd): `addr` maps file offset `fd_off`.
 * The endpoint keeps its own duplicate of fd; the caller keeps the mapping
 * and unmaps it after tern_tp_mr_dereg. On the shm fabric, peers of the same
 * user map the file range themselves, so their put and get (and
 * tern_tp_rkey_ptr) need no help from this side; a read-only region is
 * handed out through a read-only descriptor. A memfd that allows sealing is
 * shared with peers of any user, as tern_tp_mr_alloc memory is: it gets
 * sealed against shrinking and growing, and for a region without remote
 * write against new writable mappings (F_SEAL_FUTURE_WRITE; map what you
 * need writable before). Unlike tern_tp_mr_alloc memory, the pages stay the
 * caller's after deregistration: a peer store racing with it can still land
 * in them. Elsewhere it behaves as tern_tp_mr_reg. TERN_EINVAL for a bad fd,
 * an unaligned offset or address, or bad access bits. */
int tern_tp_mr_reg_fd(struct tern_tp_ep *ep, void *addr, size_t len, int fd, uint64_t fd_off,
                      uint32_t access, struct tern_tp_mr **out);

/* Where a region's memory starts in this process. */
void *tern_tp_mr_addr(const struct tern_tp_mr *mr);

/* Deregister; later peer access with its key fails with TERN_EREMACCESS.
 * Memory from tern_tp_mr_alloc is freed; an access that raced with this
 * call never lands in memory the process uses afterwards. */
int tern_tp_mr_dereg(struct tern_tp_mr *mr);

/* The region as a remote key: its address, length and rights, and the
 * key every connection of the endpoint presents where keys are per
 * endpoint (tcp, shm, ntb, and rdma on a device without memory windows).
 * Peers reach the region with what tern_tp_conn_mr_rkey gives: on rdma
 * with memory windows this one's key reaches nothing. */
struct tern_tp_rkey tern_tp_mr_rkey(const struct tern_tp_mr *mr);

/* The key with which the peer of `conn`, and only it, reaches `mr`. On
 * rdma a device with type 2 memory windows binds one to the connection's
 * queue pair (once per region and connection; later calls give the same
 * key), so a key learned or guessed by another connection is refused by
 * the NIC, and so is this one after the connection or the region is gone;
 * elsewhere the region's own key (tern_tp_mr_rkey), which the fabric
 * checks in software for every connection. Send it to the peer in a
 * message on `conn` posted after this call: the window's bind is a work
 * request on the connection and goes out before that message; a key
 * passed another way may arrive before the bind is done. TERN_EAUTH while
 * one-sided access is shut on the connection (tern_tp_ep_gate_rma, not
 * yet authenticated), TERN_ENOTCONN on a closed connection, TERN_ENOMEM
 * when the device has no window left, TERN_EINVAL for a region of another
 * endpoint. Thread: the endpoint's. */
int tern_tp_conn_mr_rkey(struct tern_tp_conn *conn, struct tern_tp_mr *mr,
                         struct tern_tp_rkey *out);

/* Write `len` bytes from local region `lmr` at `loff` to the peer's region
 * `rkey` at `roff`. Completion: TERN_TP_EV_PUT_DONE with `token`.
 * TERN_EAGAIN: too many operations in flight (retry after a completion) or
 * no send space (retry after TERN_TP_EV_WRITABLE). A peer that keeps making
 * refused accesses is disconnected, as a NIC would break the queue pair. */
int tern_tp_put(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, size_t loff, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);

/* Read `len` bytes from the peer's region into local `lmr` at `loff`.
 * Completion: TERN_TP_EV_GET_DONE with `token`. */
int tern_tp_get(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, size_t loff, size_t len,
                const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);

/* A pointer through which this process loads from (and, with
 * TERN_TP_ACCESS_REMOTE_WRITE in `need`, stores into) the peer's region
 * `rkey` at [roff, roff+len) directly, as UCX's uct_rkey_ptr: no call and no
 * completion per access. `need` holds the rights the caller will use
 * (REMOTE_READ, REMOTE_WRITE). TERN_ENOTSUP on fabrics without such
 * mappings (no TERN_TP_CAP_RKEY_PTR) or for regions the peer
 * does not let this side map (registered without a file, or a plain file of
 * another user); TERN_EAGAIN while the mapping is being set up (poll, and
 * let the peer poll, then ask again) or while this connection's earlier put
 * or get are in flight (a direct store could overtake them);
 * TERN_EREMACCESS if the key, range or rights are wrong (a refused access,
 * counted as for put and get: a caller that keeps making them is
 * disconnected); TERN_ENOTCONN on a closed connection; TERN_EINVAL for
 * len 0 or bad bits in `need`. The pointer stays valid while the peer keeps
 * the region registered and the connection is open; asking again before
 * each use re-checks that for the cost of a load. Ordinary stores through it
 * are visible to the peer before any message this side posts afterwards
 * (a post is a release); after non-temporal (streaming) stores, fence
 * (sfence) before posting. */
int tern_tp_rkey_ptr(struct tern_tp_conn *conn, const struct tern_tp_rkey *rkey, uint64_t roff,
                     size_t len, uint32_t need, void **ptr);

/* Make progress and return up to `max` events (0 if none), or a negative
 * code on an endpoint-wide failure. Never blocks. */
int tern_tp_poll(struct tern_tp_ep *ep, struct tern_tp_event *ev, int max);

/* Send everything posted so far. Fabrics that send at post time make this a
 * no-op returning 0. */
int tern_tp_flush(struct tern_tp_ep *ep);

/* A file descriptor that becomes readable when new work arrives. Work the
 * endpoint already holds (events beyond the last poll's `max`) does not make
 * it readable: call tern_tp_arm() before sleeping on it. */
int tern_tp_wait_fd(struct tern_tp_ep *ep);

/* 0 if nothing is owed and sleeping on tern_tp_wait_fd() is safe;
 * TERN_EAGAIN if tern_tp_poll() has events to hand out first. */
int tern_tp_arm(struct tern_tp_ep *ep);

/* Block up to timeout_ns (-1: forever; the wait's resolution is a
 * millisecond, rounded up) until the endpoint may have work. Returns 1 if
 * it may, 0 on timeout. */
int tern_tp_wait(struct tern_tp_ep *ep, int64_t timeout_ns);

#ifdef __cplusplus
}
#endif

#endif
