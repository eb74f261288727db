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

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tern needs a little-endian host");
_Static_assert(sizeof(struct rpc_hdr) == 24, "rpc_hdr is 24 bytes on the wire");
_Static_assert(sizeof(struct rpc_hello) == 24, "rpc_hello is 24 bytes on the wire");

#endif
