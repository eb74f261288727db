/* RPC internals shared by endpoint.c, client.c and server.c. */
#ifndef TERN_RPC_INTERNAL_H
#define TERN_RPC_INTERNAL_H

#include <stdbool.h>

#include "rpc.h"
#include "wire.h"

#define RPC_MAX_SERVICES 64
#define RPC_MAX_FABRICS 4
#define RPC_EVENT_BATCH 32
#define RPC_UNSTAMPED 64        /* calls sent before their deadline is set */

struct rpc_service {
    const struct tern_service *svc;
    tern_handler_fn *by_method;     /* dense table indexed by method id */
    uint32_t n_slots;
};

enum call_state { CALL_FREE, CALL_QUEUED, CALL_SENT };

struct rpc_call {
    uint64_t id;                    /* generation << 32 | slot */
    enum call_state state;
    struct tern_session *s;
    struct rpc_call *prev, *next;   /* session's queued or sent list */
    struct iovec iov[TERN_CALL_IOV_MAX];   /* the request, gathered at send */
    uint8_t niov;
    size_t len;                     /* sum of the iov lengths */
    uint16_t svc, method;
    bool resent;                    /* re-sent after a failover */
    uint64_t timeout;               /* ns, 0 = none */
    uint64_t deadline;              /* CLOCK_MONOTONIC ns; 0 with a timeout:
                                     * not stamped yet (see rpc_stamp_calls) */
    tern_cont_fn cont;
    void *arg;
};

struct call_list {
    struct rpc_call *head, *tail;
    unsigned n;
};

/* A reply that found the send path full: kept until WRITABLE. */
struct spill {
    struct spill *next;
    size_t len;                     /* header + payload */
    uint8_t data[];
};

/* A request held back (its view kept) while replies are spilled. */
struct deferred {
    const void *view;
    size_t len;
    uint64_t arrived;
};

#define REPLAY_IDS 4096          /* ids of calls run, kept per token */
#define REPLAY_KEEP_MAX 65536    /* larger replies are remembered by id only */

struct rpc_replay_ent {
    uint64_t req_id;
    uint16_t svc, method;
    int status;
    bool used;
    size_t len, cap;
    uint8_t *buf;
};

struct rpc_replay {
    struct rpc_replay *next;
    uint64_t token;
    unsigned refs, n, next_slot, next_id;
    bool failed_over;               /* a re-sent call came: look up every call */
    bool has_secret;                /* its session authenticated: paths must prove */
    uint8_t secret[RPC_AUTH_MAC];   /* ... this (auth.c) */
    uint64_t ids[REPLAY_IDS];
    struct rpc_replay_ent ent[];
};

/* A one-sided operation. Its transport token is gen << 32 | slot: a slot
 * is freed only once the fabric is done with it (an operation completed
 * early waits as an orphan), so a token whose slot has moved on can only
 * come from a connection already let go, and is dropped. */
enum rma_state {
    RMA_FREE,
    RMA_LIVE,       /* the caller waits for its completion */
    RMA_ORPHAN,     /* completed early (session gone, region deregistered)
                     * but still at the fabric, which may yet touch its
                     * region: the slot and the region stay until the
                     * fabric completes it or its connection is gone */
};

struct rpc_rma {
    uint32_t gen;
    uint8_t state;                  /* enum rma_state */
    struct tern_session *s;         /* LIVE: who started it */
    struct tern_tp_conn *conn;      /* where it is in flight */
    struct tern_rpc_mr *mr;         /* its local region (holds a reference) */
    uint64_t t0;                    /* started (ns), for rma_timeout_ns */
    struct rpc_rma *prev, *next;    /* LIVE: the session's operations, oldest first */
    tern_rma_fn cb;
    void *arg;
};

struct tern_rpc_mr {
    struct tern_rpc_ep *ep;
    struct tern_rpc_mr *prev, *next;    /* the endpoint's regions */
    uint8_t *addr;
    size_t len;
    uint32_t access;
    int fd;                         /* our own descriptor of the file behind it, or -1 */
    uint64_t fd_off;
    bool owned;                     /* tern_rpc_mr_alloc: mapping and fd are ours */
    bool dead;                      /* deregistered: freed once refs is 0 */
    size_t map_len;                 /* owned: the mapping's length */
    unsigned refs;                  /* operations (live or orphaned) using it */
    struct tern_tp_mr *tp[RPC_MAX_FABRICS];  /* on ep->tp[i], registered on first need */
};

enum session_role { ROLE_CLIENT, ROLE_SERVER };
/* A server session waits in SESS_AUTH between its HELLO_ACK and the
 * client's proof; nothing but RPC_AUTH is taken there. */
enum session_state { SESS_CONNECTING, SESS_AUTH, SESS_OPEN, SESS_DEAD };

/* A handshake with the cluster key in progress (auth.c). */
struct rpc_auth_state {
    uint8_t nonce_c[RPC_AUTH_NONCE], nonce_s[RPC_AUTH_NONCE];
    uint8_t key[64];                /* the MAC key of this handshake: the */
    size_t key_len;                 /* cluster key, or the session's secret */
    bool first;                     /* the session's first path (keyed by the key) */
};

struct tern_session {
    struct tern_rpc_ep *ep;
    struct tern_tp_conn *conn;
    enum session_role role;
    enum session_state state;
    int status;                     /* why it died */
    bool zombie;                    /* closed during a poll, freed after it */
    bool closing;                   /* tern_rpc_disconnect is running */
    uint64_t created;               /* server: when accepted (HELLO timeout) */
    uint64_t connect_by;            /* client, tern_rpc_connect_start: the
                                     * handshake's deadline (0: none) */
    struct rpc_auto_start *auto_start;  /* ... of an auto:// URI: its paths,
                                         * set up once it opens */
    struct tern_session *prev, *next;
    size_t peer_max_msg;            /* largest payload the peer accepts */
    char *peer_ads;                 /* client: fabrics the server listens on */
    uint64_t token;                 /* nonzero: the session may move fabric */
    struct tern_tp_conn *standby;   /* client: the TCP path kept to fail over to */
    struct rpc_replay *replay;      /* server: replies kept for re-sent calls */
    bool drop_after_reply;          /* server: test hook, see rpc_test_drop */
    /* client */
    unsigned credits;
    struct call_list queued, sent;
    bool blocked;                   /* transport said EAGAIN */
    /* server */
    int send_dead;                  /* the send path failed for good (not full) */
    struct spill *spill_head, **spill_tail;
    struct deferred *deferred;
    unsigned n_deferred, cap_deferred;
    /* authentication (auth.c) */
    struct rpc_auth_state *auth;    /* during the handshake */
    uint8_t secret[RPC_AUTH_MAC];   /* client: the session's, for further paths */
    bool has_secret;
    /* auto:// paths (paths.c): client sessions that may move fabric */
    struct rpc_paths *paths;        /* NULL: not an auto:// session */
    struct tern_session *parent;    /* a path being dialed for that session */
    /* counters (tern_session_info) */
    uint64_t n_calls, n_errors, bytes_out, bytes_in;
    unsigned failovers, moves;
    /* one-sided operations (rma.c) */
    uint32_t epoch;                 /* bumped when it moves to another conn */
    struct rpc_rma *rma_head, *rma_tail;    /* operations in flight */
};

struct tern_req {
    struct tern_session *s;
    const struct rpc_hdr *hdr;
    uint64_t arrived;               /* 0: now (not held in a queue) */
    uint8_t *reply;                 /* payload start in the send buffer */
    size_t reply_len;
    struct spill *spilled;          /* reply went to the heap instead */
    bool reply_taken;
    bool hold;                      /* tern_req_hold: reply after the hold hook */
    struct tern_rpc_gate *gate;     /* tern_req_gate: reply when it passes ticket */
    uint64_t ticket;
};

#define RPC_HOLD_HOOKS 8

/* A reply held until the end of the poll (tern_req_hold): its header and
 * where its payload lies in the endpoint's held buffer. */
struct rpc_held {
    struct tern_session *s;         /* NULL: the session went meanwhile */
    struct rpc_hdr h;
    size_t off, len;
};

struct tern_rpc_ep {
    struct tern_rpc_config cfg;
    uint8_t key[64];                /* the cluster key (cfg.key, copied) */
    size_t key_len;                 /* 0: none */
    struct tern_tp_ep *tp[RPC_MAX_FABRICS];
    unsigned tp_idle[RPC_MAX_FABRICS];  /* polls since the fabric had events */
    int tp_failed[RPC_MAX_FABRICS];     /* the fabric's endpoint-wide failure:
                                         * no longer polled nor used */
    int wait_epfd;                  /* every fabric's wait fd, for sleeping */
    unsigned n_tp;
    struct rpc_service services[RPC_MAX_SERVICES];
    unsigned n_services;
    uint8_t svc_slot[65536];        /* service id -> index + 1, 0 = none */
    char ads[1024];                 /* "fabric://addr@node;" per selectable listener */
    struct rpc_replay *replays;     /* per client token (server side) */
    struct tern_session *sessions;
    struct tern_session *zombies;
    unsigned n_sessions;
    unsigned polling;               /* nesting depth of tern_rpc_poll */
    struct rpc_call *calls;         /* cfg.max_calls slots */
    uint32_t *free_slots;
    unsigned n_free;
    unsigned n_deadlines;           /* live calls with a timeout */
    uint64_t unstamped[RPC_UNSTAMPED]; /* ids of calls whose deadline is due */
    unsigned n_unstamped;
    uint64_t next_deadline_scan;
    uint64_t next_housekeeping;
    unsigned polls;
    struct tern_tp_conn **doomed;   /* disconnected after the poll */
    unsigned n_doomed, cap_doomed;
    int stop;                       /* set by tern_rpc_stop, any thread */
    /* one-sided operations (rma.c): slots allocated with the first region */
    struct rpc_rma *rma;            /* cfg.max_calls slots */
    uint32_t *rma_free;
    unsigned n_rma_free;
    uint64_t next_rma_scan;         /* ns; one-sided deadlines are checked per ms */
    struct tern_rpc_mr *mrs;        /* regions registered and not deregistered */
    struct tern_tp_event ev[RPC_EVENT_BATCH];
    /* Replies held for the hold hooks (server.c), reused from poll to poll. */
    struct {
        int (*fn)(void *arg);
        void *arg;
    } hooks[RPC_HOLD_HOOKS];
    unsigned n_hooks;
    struct rpc_held *held;
    unsigned n_held, cap_held;
    struct tern_rpc_gate *gates;    /* gate.c */
    uint8_t *held_buf;
    size_t held_len, held_cap;
};

/* endpoint.c */
int rpc_tp_for(struct tern_rpc_ep *ep, const char *uri, const char **addr,
               struct tern_tp_ep **tp);
struct tern_session *rpc_session_new(struct tern_rpc_ep *ep, struct tern_tp_conn *conn,
                                     enum session_role role);
void rpc_session_free(struct tern_session *s);
const struct rpc_service *rpc_service_find(const struct tern_rpc_ep *ep, uint16_t id);
void rpc_bad_frame(struct tern_session *s, const char *why);
void rpc_doom(struct tern_rpc_ep *ep, struct tern_tp_conn *conn);

/* server.c: send the replies held this poll (after running the hook). */
void rpc_release_held(struct tern_rpc_ep *ep);
/* A session is going: its held replies go with it. */
void rpc_forget_held(struct tern_session *s);
/* Send a reply whose payload is not in the send buffer yet. */
void rpc_emit(struct tern_session *s, struct rpc_hdr *h, const void *body, size_t len);

/* gate.c: hold a built reply behind a gate (false: no memory); a session
 * is going; the endpoint is closing (its gates outlive it, empty). */
bool rpc_gate_hold(struct tern_rpc_gate *g, struct tern_session *s, const struct rpc_hdr *h,
                   const void *body, size_t len, uint64_t ticket);
void rpc_gate_forget(struct tern_session *s);
void rpc_gates_detach(struct tern_rpc_ep *ep);

/* client.c */
void rpc_client_recv(struct tern_session *s, const struct rpc_hdr *h, const void *body,
                     size_t len);
void rpc_client_writable(struct tern_session *s);
void rpc_client_fail(struct tern_session *s, int status);
void rpc_expire_calls(struct tern_rpc_ep *ep, uint64_t now);
int rpc_calls_init(struct tern_rpc_ep *ep);
void rpc_stamp_calls(struct tern_rpc_ep *ep, uint64_t now);

/* replay.c */
struct rpc_replay *rpc_replay_get(struct tern_rpc_ep *ep, uint64_t token);
void rpc_replay_put(struct tern_rpc_ep *ep, struct rpc_replay *rp);
/* 1 if the call `h` names already ran: *ent is its kept reply, or NULL if
 * only its id was kept. 0 if it did not run. */
int rpc_replay_find(const struct rpc_replay *rp, const struct rpc_hdr *h,
                    const struct rpc_replay_ent **ent);
void rpc_replay_add(struct rpc_replay *rp, const struct rpc_hdr *h, int status,
                    const void *data, size_t len);

/* auth.c */
int rpc_auth_mac(const uint8_t *key, size_t key_len, const char *role, uint64_t token,
                 const uint8_t nc[RPC_AUTH_NONCE], const uint8_t ns[RPC_AUTH_NONCE],
                 uint8_t out[RPC_AUTH_MAC]);
bool rpc_auth_equal(const uint8_t a[RPC_AUTH_MAC], const uint8_t b[RPC_AUTH_MAC]);
int rpc_auth_nonce(uint8_t out[RPC_AUTH_NONCE]);
/* Log a refused peer, at most a line a second. */
void rpc_auth_refused(struct tern_session *s, const char *why);
/* server.c: tell the client why (RPC_REFUSE) and drop its session. */
void rpc_server_refuse(struct tern_session *s, int status, const char *why);

/* Tests only: close the request's session right after its reply is
 * remembered, without sending it (a reply lost with its connection). */
void rpc_test_drop(struct tern_req *req);

/* paths.c: an auto:// session's ways to its server. It knows the
 * fabrics the server advertised, ordered by the session's policy (the
 * bootstrap TCP path last), keeps a TCP standby while it runs on another
 * fabric, moves to a better path when one comes back, and after a failover
 * dials a new standby, so that a second failure has somewhere to go too. */
#define RPC_PATHS_MAX 8
#define RPC_URI_MAX 160
/* An auto:// session opened by tern_rpc_connect_start: where it started,
 * and the fabric policy to move by once it is open. */
struct rpc_auto_start {
    char boot[RPC_URI_MAX];
    char policy[256];
};

struct rpc_paths {
    char policy[256];
    unsigned n;                     /* candidates; [n - 1] is the TCP bootstrap */
    struct {
        char uri[RPC_URI_MAX];
        uint64_t retry_at;          /* ns: not dialed before */
        uint32_t backoff_ms;
    } cand[RPC_PATHS_MAX];
    unsigned cur;                   /* the candidate s->conn is on */
    uint64_t since;                 /* when it moved there */
    struct tern_session *dial;      /* a path being dialed, or NULL */
    int dial_cand;                  /* its candidate; -1: a standby */
    uint64_t dial_start;
};

/* The paths a policy allows, best first, the TCP bootstrap left out:
 * for each item of `policy` in its order, a fabric name brings the
 * server's advertisements of that fabric reachable from here (by score),
 * a URI ("ntb://emu:CABLE/1") comes as it is. An empty policy: every
 * reachable advertisement. Returns how many (up to max). */
int rpc_paths_candidates(const char *ads, const char *policy, char (*out)[RPC_URI_MAX],
                         unsigned max);
/* After the session's first connection is open on candidate `uri`: set
 * its paths up from s->peer_ads and the policy. TERN_ENOMEM. */
int rpc_paths_init(struct tern_session *s, const char *boot_uri, const char *policy,
                   const char *uri);
/* Housekeeping: dial standbys and better paths, reap dials that failed. */
void rpc_paths_tick(struct tern_rpc_ep *ep, uint64_t now);
/* A dialed path `d` said HELLO_ACK: its parent takes its connection. */
void rpc_paths_dial_open(struct tern_session *d);
/* The session moved to its standby after its path failed. */
void rpc_paths_failed_over(struct tern_session *s);
/* The session goes: so does a dial in flight. */
void rpc_paths_free(struct tern_session *s);
/* client.c: move the calls sent on the old path back to the queue's front,
 * to be re-sent (RPC_F_RESENT) on the new one. */
void rpc_client_requeue_sent(struct tern_session *s);

/* client.c: the primary connection failed; true if the session moved to
 * its standby path. */
bool rpc_client_failover(struct tern_session *s, int status);

/* client.c: connect to `uri` and send HELLO, without waiting for the
 * answer, which a later tern_rpc_poll takes (tern_rpc_connect waits for
 * it; the fuzz target of the client's decoding answers it itself). *out is
 * the session, SESS_CONNECTING, even if the HELLO could not go (the error
 * is returned; tern_rpc_disconnect it), or NULL with nothing to undo. */
int rpc_connect_start(struct tern_rpc_ep *ep, const char *uri, uint64_t token,
                      const uint8_t *secret, struct tern_session **out);

/* endpoint.c: disconnect a connection now; one-sided operations still on
 * it are over (see rpc_rma_conn_gone). */
void rpc_disconnect(struct tern_rpc_ep *ep, struct tern_tp_conn *conn);

/* rma.c */
/* A PUT_DONE / GET_DONE event. */
void rpc_rma_done(struct tern_rpc_ep *ep, const struct tern_tp_event *e);
/* Complete the session's operations (only those on `conn` unless it is
 * NULL) with `status`, each once. */
void rpc_rma_fail(struct tern_session *s, struct tern_tp_conn *conn, int status);
/* `conn` was disconnected (the pointer is compared, never followed): the
 * fabric no longer touches memory for operations that were on it. */
void rpc_rma_conn_gone(struct tern_rpc_ep *ep, struct tern_tp_conn *conn);
/* Endpoint teardown, after every session and connection is gone and before
 * the transport endpoints close: deregister and free every region. */
void rpc_rma_destroy(struct tern_rpc_ep *ep);
/* Complete operations older than rma_timeout_ns with TERN_ETIMEDOUT. */
void rpc_rma_expire(struct tern_rpc_ep *ep, uint64_t now);
/* Are one-sided operations in flight (deadlines to watch)? */
static inline bool rpc_rma_busy(const struct tern_rpc_ep *ep)
{
    return ep->rma && ep->n_rma_free < ep->cfg.max_calls;
}

/* server.c */
/* Returns true if the view was kept (deferred) and must not be released. */
bool rpc_server_recv(struct tern_session *s, const void *view, size_t len);
void rpc_server_writable(struct tern_session *s);
void rpc_server_drop(struct tern_session *s);

/* Sleep on the endpoint's fabrics (their fd) for up to `ms` ms, unless
 * one has work already; adaptive mode's idle wait (tern_rpc_run,
 * tern_call_sync). */
void rpc_sleep(struct tern_rpc_ep *ep, int ms);

#endif
