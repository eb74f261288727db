/* Frames on a tern TCP connection. All fields little-endian.
 *
 *   [tcp_hdr 8 B][body len B][0-7 B zero padding]
 *
 * Every frame is padded to a multiple of 8 bytes, so every received view
 * (and every payload behind an 8-byte-multiple header) is 8-byte aligned.
 *
 *   MSG       body = the message
 *   PUT       body = tcp_onesided + data        -> answered by ACK
 *   GET_REQ   body = tcp_onesided               -> answered by GET_RESP
 *   ACK       body = tcp_ack
 *   GET_RESP  body = tcp_ack [+ data if status == 0]
 *
 * Answers come back in request order, so they carry no token. A frame with a
 * bad magic, version, type or length closes the connection (TERN_EPROTO).
 */
#ifndef TERN_TCP_WIRE_H
#define TERN_TCP_WIRE_H

#include <stdint.h>

#define TCP_MAGIC 0x7e72    /* "tr" */
#define TCP_VERSION 1
#define TCP_ALIGN 8

/* Bytes a frame with a `body`-byte body takes on the wire. */
#define TCP_FRAME_LEN(body) (((sizeof(struct tcp_hdr) + (body)) + TCP_ALIGN - 1) & ~(size_t)(TCP_ALIGN - 1))

enum tcp_frame_type {
    TCP_MSG = 1,
    TCP_PUT = 2,
    TCP_GET_REQ = 3,
    TCP_ACK = 4,
    TCP_GET_RESP = 5,
};

struct tcp_hdr {
    uint16_t magic;
    uint8_t version;
    uint8_t type;
    uint32_t len;       /* body bytes after this header */
};

struct tcp_onesided {
    uint32_t key;
    uint32_t len;
    uint64_t off;
};

struct tcp_ack {
    int32_t status;     /* 0 or a negative tern code */
    uint32_t pad;
};

_Static_assert(sizeof(struct tcp_hdr) == 8, "tcp_hdr is 8 bytes on the wire");
_Static_assert(sizeof(struct tcp_onesided) == 16, "tcp_onesided is 16 bytes");

#endif
