/* The RPC header that starts every transport message of a session.
 * Little-endian on the wire with fixed sizes; tern is built for little-endian
 * hosts only (x86-64, arm64), so the fields are used as they are. */
#ifndef TERN_RPC_WIRE_H
#define TERN_RPC_WIRE_H

#include <stdint.h>

#define RPC_VERSION 1
#define RPC_MAGIC 0x7465726eu   /* "tern" */

enum rpc_type {
    RPC_HELLO = 1,      /* client -> server, body: rpc_hello */
    RPC_HELLO_ACK = 2,  /* server -> client, body: rpc_hello */
    RPC_REQ = 3,        /* body: request payload */
    RPC_RESP = 4,       /* body: reply payload; status != 0 means no body */
    RPC_AUTH = 5,       /* client -> server, body: rpc_auth_proof */
    RPC_REFUSE = 6,     /* server -> client, hdr.status: why; body: the reason as text.
                         * The server closes the connection after it. */
};

/* REQ flags. */
#define RPC_F_RESENT 0x1    /* re-sent after a fabric failover: may have run */

struct rpc_hdr {
    uint8_t type;
    uint8_t version;
    uint16_t svc;
    uint16_t method;
    uint16_t flags;     /* RPC_F_* */
    int32_t status;     /* RESP: 0 or a negative tern code */
    uint32_t budget_us; /* REQ: time left before the caller gives up; 0 = none */
    uint64_t req_id;
};

struct rpc_hello {
    uint32_t magic;
    uint32_t credits;   /* asked for (HELLO) / granted (HELLO_ACK) */
    uint64_t max_msg;   /* largest payload the sender accepts */
    uint64_t token;     /* HELLO: nonzero if the client may re-send calls on
                         * another connection after a fabric failure */
};

/* Authentication with the cluster key (rpc/auth.c). A client that holds a
 * key appends rpc_auth_hello to its HELLO; a server that holds one answers
 * with RPC_ACK_AUTH in the HELLO_ACK's token field and rpc_auth_ack after
 * the rpc_hello (before the advertisements), and the client proves itself
 * with RPC_AUTH before anything else. Proofs are HMAC-SHA-256 over the
 * role, the token and both nonces, keyed with the cluster key, or for a
 * further path of a session (failover, a better fabric) with the secret
 * the session's first handshake derived: a token alone opens nothing. */
#define RPC_AUTH_NONCE 32
#define RPC_AUTH_MAC 32
#define RPC_ACK_AUTH 0x1u   /* HELLO_ACK token field: rpc_auth_ack follows */

struct rpc_auth_hello {
    uint8_t nonce[RPC_AUTH_NONCE];
};

struct rpc_auth_ack {
    uint8_t nonce[RPC_AUTH_NONCE];
    uint8_t proof[RPC_AUTH_MAC];
};

struct rpc_auth_proof {
    uint8_t proof[RPC_AUTH_MAC];
};

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tern needs a little-endian host");
_Static_assert(sizeof(struct rpc_hdr) == 24, "rpc_hdr is 24 bytes on the wire");
_Static_assert(sizeof(struct rpc_hello) == 24, "rpc_hello is 24 bytes on the wire");

#endif
