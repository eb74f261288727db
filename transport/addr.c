/* "host:port" text to socket addresses and back, for the fabrics that
 * reach peers by IP (tcp, rdma). */
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "addr.h"
#include "error.h"

void tp_addr_text(const struct sockaddr *sa, char *out, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?";

    getnameinfo(sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                              : sizeof(struct sockaddr_in),
                host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, len, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

/* Split "host:port" or "[v6]:port" and resolve it. */
int tp_addr_resolve(const char *addr, bool passive, struct addrinfo **res)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    size_t hl;

    if (!colon || !colon[1])
        return TERN_EBADADDR;
    hl = (size_t)(colon - addr);
    if (hl >= sizeof(host))
        return TERN_EBADADDR;
    memcpy(host, addr, hl);
    host[hl] = 0;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    for (const char *p = colon + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return TERN_EBADADDR;
    if (getaddrinfo(hl ? host : NULL, colon + 1, &hints, res) != 0)
        return TERN_EBADADDR;
    return 0;
}

