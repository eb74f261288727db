/* What a fabric implements: the ops table and the common part of its objects.
 * Only transport/ includes this file. */
#ifndef TERN_TRANSPORT_INTERNAL_H
#define TERN_TRANSPORT_INTERNAL_H

#include <stdbool.h>

#include "transport.h"

/* A fabric fills the ops it supports with designated initializers; the core
 * answers TERN_ENOTSUP for every NULL entry, and tern_tp_fabric_check()
 * verifies that the advertised capability bits match the ops. */
struct tern_tp_ops {
    int (*ep_open)(struct tern_tp_ep *ep);
    void (*ep_close)(struct tern_tp_ep *ep);
    int (*listen)(struct tern_tp_ep *ep, const char *addr, char *bound, size_t bound_len);
    int (*connect)(struct tern_tp_ep *ep, const char *addr, struct tern_tp_conn **out);
    void (*disconnect)(struct tern_tp_conn *conn);
    const char *(*conn_peer)(const struct tern_tp_conn *conn);
    /* Is the peer a process of this host and network namespace (shm;
     * tcp over loopback or an address of its own)? NULL: no, it is
     * another host (an NTB cable, a NIC, emulated or not). */
    bool (*conn_local)(const struct tern_tp_conn *conn);
    int (*msg_alloc)(struct tern_tp_conn *conn, size_t len, void **buf);
    int (*msg_post)(struct tern_tp_conn *conn, void *buf, size_t len);
    void (*msg_abort)(struct tern_tp_conn *conn, void *buf);
    void (*msg_release)(struct tern_tp_conn *conn, const void *view);
    /* One-sided access from or into `lmr`'s bytes at src/dst (the core has
     * checked that the local range lies inside lmr). */
    int (*put)(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, const void *src, size_t len,
               const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);
    int (*get)(struct tern_tp_conn *conn, struct tern_tp_mr *lmr, void *dst, size_t len,
               const struct tern_tp_rkey *rkey, uint64_t roff, uint64_t token);
    /* The longest single put or get the connection carries, when the fabric
     * limits it below max_msg (a ring fabric: one ring record). NULL: no
     * limit of its own. */
    size_t (*rma_max)(const struct tern_tp_conn *conn);
    /* A region was registered (up) or is being deregistered (!up). Fabrics
     * that let peers map memory publish or withdraw it here; a NIC fabric
     * registers it with the device. A failure (up only) undoes the
     * registration and is returned to the caller. */
    int (*mr_publish)(struct tern_tp_ep *ep, struct tern_tp_mr *mr, bool up);
    /* The key the peer of `conn` presents for `mr` (the core has checked
     * that the region is the endpoint's and that one-sided access is open
     * on the connection). NULL: the region's own key, the same for every
     * connection. A NIC fabric with memory windows binds one to the
     * connection here. */
    int (*conn_rkey)(struct tern_tp_conn *conn, struct tern_tp_mr *mr, struct tern_tp_rkey *out);
    /* A local pointer into the peer's region (the core has checked the
     * arguments); see tern_tp_rkey_ptr. */
    int (*rkey_ptr)(struct tern_tp_conn *conn, const struct tern_tp_rkey *rkey, uint64_t roff,
                    size_t len, uint32_t need, void **ptr);
    int (*poll)(struct tern_tp_ep *ep, struct tern_tp_event *ev, int max);
    int (*flush)(struct tern_tp_ep *ep);   /* NULL: posts go out at once */
    int (*wait_fd)(struct tern_tp_ep *ep);
    int (*arm)(struct tern_tp_ep *ep);
    int (*wait)(struct tern_tp_ep *ep, int timeout_ms);
};

/* A fabric's descriptor: its ops and what it knows about itself. Only the
 * fabric's own folder fills one, and no code outside it asks for a fabric
 * by name to learn any of this. Hooks may be NULL where noted. */
struct tern_tp_fabric {
    const char *name;
    uint32_t caps;
    size_t ep_size;   /* bytes to allocate for the fabric's endpoint */
    const struct tern_tp_ops *ops;

    /* Selection order: typical same-rack small-message latency in ns, then
     * bandwidth in GB/s as the tie breaker. Only the order matters. */
    unsigned latency_ns, bandwidth_gbs;
    /* tern_tp_probe: is the hardware there? NULL: always usable. */
    int (*probe)(const char *args, char *desc, size_t desc_len);
    /* Can this node reach `addr` (what follows "fabric://", `len` bytes),
     * advertised by a node that is this node (`same_node`: this host and
     * network namespace), this host in another namespace (`same_host`:
     * the same kernel, as tools/rack's hosts are), or another?
     * NULL: never taken from an advertisement (tcp: the bootstrap itself). */
    bool (*reachable)(const char *addr, size_t len, bool same_node, bool same_host);
    /* An address to listen on for a server on this host that processes of
     * this host reach, unique per `tag`; tag NULL: one the fabric makes
     * unique when a listener binds it (tests, benchmarks). */
    int (*local_addr)(const char *tag, char *buf, size_t len);
    /* True if bound address `addr` is an emulated device (results say
     * "NAME-emu"). NULL: never. */
    bool (*emulated)(const char *addr);
    /* Remove what processes of this host that died left behind (device
     * files, segments). NULL: nothing outlives a process. */
    void (*sweep)(void);
};

/* Registered regions of one endpoint; shared by every fabric that checks
 * one-sided access in software (tcp, ring). */
#define TERN_MR_MAX 1024

struct tern_tp_mr {
    struct tern_tp_ep *ep;
    uint8_t *addr;
    size_t len;
    uint32_t access;
    uint32_t key;
    bool in_use;
    int fd;             /* the file behind it (tern_tp_mr_alloc: our sealed memfd;
                         * tern_tp_mr_reg_fd: our duplicate of the caller's), or -1 */
    uint64_t fd_off;    /* where the region starts in that file */
    size_t map_len;     /* len rounded up to pages: what a peer maps of the file */
    bool owns_map;      /* tern_tp_mr_alloc: the mapping is ours to unmap */
    void *fab;          /* the fabric's handle for it (rdma: the ibv_mr) */
};

/* Common head of every fabric's endpoint. */
struct tern_tp_ep {
    const struct tern_tp_fabric *fabric;
    struct tern_tp_config cfg;   /* with defaults filled in */
    struct tern_tp_conn *conns;  /* every connection (tp_conn_add) */
    struct tern_tp_conn *ready;  /* connections with work left (tp_ready_push) */
    unsigned nconns;
    struct tern_tp_mr mrs[TERN_MR_MAX];
    uint32_t mr_nonce;
    bool rma_gated;              /* new connections start with rma_shut */
};

/* Common head of every fabric's connection. */
struct tern_tp_conn {
    struct tern_tp_ep *ep;
    void *user;
    struct tern_tp_conn *prev, *next;   /* the endpoint's connections */
    struct tern_tp_conn *ready_next;    /* its ready list */
    bool on_ready;
    bool rma_shut;                      /* served one-sided access refused until
                                         * tern_tp_conn_open_rma (authentication) */
};

/* The endpoint's list of connections, and its ready list of connections
 * with work left over (more frames than a poll took, events owed) that the
 * next poll serves first. */
void tp_conn_add(struct tern_tp_ep *ep, struct tern_tp_conn *c);
void tp_conn_del(struct tern_tp_conn *c);      /* also leaves the ready list */
void tp_ready_push(struct tern_tp_conn *c);
void tp_ready_remove(struct tern_tp_conn *c);
/* Detach the whole ready list (clearing on_ready is the caller's, per
 * connection, as it serves them). */
struct tern_tp_conn *tp_ready_take(struct tern_tp_ep *ep);

/* Check a peer's one-sided access against this endpoint's regions; on
 * success *where points at the local bytes. TERN_EREMACCESS otherwise. */
int tp_mr_check(struct tern_tp_conn *conn, uint32_t key, uint64_t off, uint64_t len,
                     uint32_t need, uint8_t **where);

/* Open an endpoint on a given fabric table (tern_tp_open after the lookup);
 * tests use it to run the core against sparse ops tables. */
int tp_open_fabric(const struct tern_tp_fabric *f, const struct tern_tp_config *cfg,
                        struct tern_tp_ep **out);

/* True if f->caps names exactly the ops f->ops implements. */
bool tp_caps_match_ops(const struct tern_tp_fabric *f);

/* The built-in fabric called `name`, or NULL. */
const struct tern_tp_fabric *tp_fabric_find(const char *name);

/* The fabric of "fabric://..." in `uri` (the first `len` bytes name it),
 * or NULL. */
const struct tern_tp_fabric *tp_fabric_of(const char *uri);

/* Fabrics built into the library. */
extern const struct tern_tp_fabric tp_fabric_tcp;
extern const struct tern_tp_fabric tp_fabric_shm;
extern const struct tern_tp_fabric tp_fabric_ntb;
extern const struct tern_tp_fabric tp_fabric_rdma;

#endif
