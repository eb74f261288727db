/* IP address text for the fabrics that reach peers by IP (tcp, rdma). */
#ifndef TERN_ADDR_H
#define TERN_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

struct addrinfo;

/* Write `sa` as "host:port" ("[v6]:port") into out. */
void tp_addr_text(const struct sockaddr *sa, char *out, size_t len);

/* Split "host:port" or "[v6]:port" and resolve it (an empty host with
 * `passive` means any address). TERN_EBADADDR if it does not parse. The
 * caller frees *res with freeaddrinfo. */
int tp_addr_resolve(const char *addr, bool passive, struct addrinfo **res);

#endif
