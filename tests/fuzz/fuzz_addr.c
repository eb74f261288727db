/* Address text from outside (a peer's advertisement, a command line, a
 * config file): "host:port" and "[v6]:port" as the IP fabrics split and
 * resolve it (transport/addr.c), and "fabric://address" URIs as the core
 * reads them (transport.c: tern_tp_uri_fabric, tern_tp_uri_label and the
 * fabrics' `emulated` hooks). getaddrinfo is held to numeric hosts here:
 * a name would send the fuzzer's bytes to the resolver, and DNS is not the
 * code under test. */
#include <dlfcn.h>
#include <netdb.h>

#include "addr.h"
#include "fuzz.h"
#include "transport.h"

int getaddrinfo(const char *restrict host, const char *restrict serv,
                const struct addrinfo *restrict hints, struct addrinfo **restrict res)
{
    static int (*real)(const char *, const char *, const struct addrinfo *,
                       struct addrinfo **);
    struct addrinfo h = hints ? *hints : (struct addrinfo){0};

    if (!real)
        real = (int (*)(const char *, const char *, const struct addrinfo *,
                        struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");
    FZ_CHECK(real, "no getaddrinfo to call");
    h.ai_flags |= AI_NUMERICHOST;
    return real(host, serv, &h, res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1), text[128], label[32];
    struct addrinfo *ai;

    FZ_CHECK(s, "no memory");
    memcpy(s, data, size);
    s[size] = 0;
    for (int passive = 0; passive < 2; passive++) {
        int rc = tp_addr_resolve(s, passive, &ai);

        if (rc < 0) {
            FZ_CHECK(rc == TERN_EBADADDR, "resolve: %d", rc);
            continue;
        }
        for (struct addrinfo *a = ai; a; a = a->ai_next) {
            tp_addr_text(a->ai_addr, text, sizeof(text));
            FZ_CHECK(strlen(text) < sizeof(text) && strchr(text, ':'), "text \"%s\"", text);
        }
        freeaddrinfo(ai);
    }
    {
        int id = tern_tp_uri_fabric(s);
        const char *const *names = tern_tp_fabric_names();

        if (id >= 0) {
            FZ_CHECK(strncmp(s, names[id], strlen(names[id])) == 0 &&
                     strncmp(s + strlen(names[id]), "://", 3) == 0,
                     "\"%s\" taken for fabric %s", s, names[id]);
        } else {
            FZ_CHECK(id == TERN_EBADADDR || id == TERN_ENOFABRIC, "uri_fabric: %d", id);
        }
        tern_tp_uri_label(s, label, sizeof(label));
        FZ_CHECK(strlen(label) < sizeof(label), "label");
    }
    free(s);
    return 0;
}
