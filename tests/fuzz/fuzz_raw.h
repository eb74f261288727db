/* A peer on a plain socket for the targets that speak to a tcp endpoint
 * of this process: TCP-fabric frames written into a buffer, and a socket
 * that is read without blocking and reset, not closed, at the end (a
 * reset leaves no TIME_WAIT behind each of the fuzzer's millions of runs). */
#ifndef TERN_FUZZ_RAW_H
#define TERN_FUZZ_RAW_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "tcp/tcp_wire.h"

struct raw_out {
    uint8_t *p;
    size_t n, cap;
};

static inline void raw_emit(struct raw_out *o, const void *b, size_t n)
{
    if (n > o->cap - o->n)
        n = o->cap - o->n;
    if (!n)
        return;
    memcpy(o->p + o->n, b, n);
    o->n += n;
}

/* Up to `n` bytes of the input, then zeros. */
static inline void raw_emit_input(struct raw_out *o, struct fz *f, size_t n)
{
    static const uint8_t zeros[256];
    const uint8_t *b;
    size_t got = fz_take(f, n, &b);

    raw_emit(o, b, got);
    for (n -= got; n;) {
        size_t k = n < sizeof(zeros) ? n : sizeof(zeros);

        raw_emit(o, zeros, k);
        n -= k;
    }
}

/* One TCP_MSG frame holding `a` then `b`. */
static inline void raw_msg(struct raw_out *o, const void *a, size_t an, const void *b,
                           size_t bn)
{
    static const uint8_t zeros[TCP_ALIGN];
    struct tcp_hdr h = {.magic = htole16(TCP_MAGIC), .version = TCP_VERSION, .type = TCP_MSG,
                        .len = htole32((uint32_t)(an + bn))};

    raw_emit(o, &h, sizeof(h));
    raw_emit(o, a, an);
    raw_emit(o, b, bn);
    raw_emit(o, zeros, TCP_FRAME_LEN(an + bn) - sizeof(h) - an - bn);
}

/* A connected non-blocking socket. libFuzzer's timer interrupts blocking
 * calls (EINTR), so the connect does not block. */
static inline int raw_connect(const struct sockaddr_in *to)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = 0;
    socklen_t len = sizeof(err);
    struct pollfd p = {.fd = fd, .events = POLLOUT};

    FZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    if (connect(fd, (const struct sockaddr *)to, sizeof(*to)) == 0)
        return fd;
    FZ_CHECK(errno == EINPROGRESS || errno == EINTR, "connect: %s", strerror(errno));
    while (poll(&p, 1, 10000) < 0)
        FZ_CHECK(errno == EINTR, "poll: %s", strerror(errno));
    FZ_CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && !err, "connect: %s",
             strerror(err));
    return fd;
}

/* accept(2) through libFuzzer's timer signals. */
static inline int raw_accept(int lfd)
{
    int fd;

    while ((fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0)
        FZ_CHECK(errno == EINTR, "accept: %s", strerror(errno));
    return fd;
}

/* Send what is left of `o` from *sent on, without blocking; true if some
 * went. */
static inline bool raw_push(int fd, const struct raw_out *o, size_t *sent)
{
    ssize_t n;

    if (*sent == o->n)
        return false;
    n = send(fd, o->p + *sent, o->n - *sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0)
        return false;
    *sent += (size_t)n;
    return true;
}

/* Read and drop what arrived; false once the other side closed. */
static inline bool raw_drain(int fd)
{
    static uint8_t buf[65536];

    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

        if (n > 0)
            continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
}

static inline void raw_reset(int fd)
{
    struct linger rst = {.l_onoff = 1, .l_linger = 0};

    setsockopt(fd, SOL_SOCKET, SO_LINGER, &rst, sizeof(rst));
    close(fd);
}

/* "tcp://127.0.0.1:PORT" or "127.0.0.1:PORT" to a loopback address. */
static inline struct sockaddr_in raw_addr_of(const char *bound)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *colon = strrchr(bound, ':');

    FZ_CHECK(colon, "no port in %s", bound);
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sa;
}

#endif
