/* Per-peer fabric choice. A node advertises the fabrics it listens on; the
 * other side keeps those it can reach from here, scores them (latency first,
 * then bandwidth, as UCX's wireup ranks transports), applies the local
 * policy, and picks the best. TCP, which the exchange itself runs on, is
 * always the fallback. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "transport_internal.h"

int tern_tp_node_id(char *out, size_t len)
{
    char boot[64] = "";
    struct stat st = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = 0;
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    /* Abstract Unix sockets (shm set-up) are per network namespace. */
    stat("/proc/self/ns/net", &st);
    if (!boot[0])
        return TERN_EIO;
    snprintf(out, len, "%s.%lu", boot, (unsigned long)st.st_ino);
    return 0;
}

/* A fabric's place in the order of preference: lower is better. */
static unsigned rank_of(const struct tern_tp_fabric *f)
{
    return f->latency_ns * 64u + (63u - (f->bandwidth_gbs < 63 ? f->bandwidth_gbs : 63));
}

/* Position of `fabric` in the comma-separated policy, or -1 if absent. */
static int policy_pos(const char *policy, const char *fabric, size_t fl)
{
    int pos = 0;

    for (const char *p = policy; *p; pos++) {
        size_t n = strcspn(p, ",");

        if (n == fl && strncmp(p, fabric, fl) == 0)
            return pos;
        p += n;
        if (*p == ',')
            p++;
    }
    return -1;
}

/* Whether this node can reach an advertised "fabric://addr@node". */
static bool reachable(const struct tern_tp_fabric *f, const char *addr, size_t len,
                      const char *node)
{
    char me[128];
    bool same_node = node && tern_tp_node_id(me, sizeof(me)) == 0 && strcmp(me, node) == 0;

    return f->reachable && f->reachable(addr, len, same_node);
}

int tern_tp_select(const char *ads, const char *policy, char *uri, size_t len)
{
    const char *best = NULL;
    size_t best_len = 0;
    long long best_key = -1;

    if (!ads || !uri || !len)
        return TERN_EINVAL;
    for (const char *p = ads; *p;) {
        size_t n = strcspn(p, ";");
        const char *sep = memchr(p, ':', n), *at = memchr(p, '@', n);
        char node[128] = "";
        long long key;

        /* An entry needs an address: "shm://@node" names nothing to
         * connect to (tern_tp_uri_fabric refuses the URI it would make). */
        if (sep && at && at > sep + 3 && (size_t)(at - p) < n && sep[1] == '/' &&
            sep[2] == '/') {
            size_t fl = (size_t)(sep - p), nl = n - (size_t)(at + 1 - p);
            const struct tern_tp_fabric *f = tp_fabric_of(p);

            if (nl < sizeof(node)) {
                memcpy(node, at + 1, nl);
                node[nl] = 0;
            }
            if (f && reachable(f, sep + 3, (size_t)(at - sep - 3), node)) {
                int pos = policy && *policy ? policy_pos(policy, p, fl) : 0;

                /* The policy decides first (its order), the scores next. */
                key = pos < 0 ? -1 : (long long)pos * (1ll << 40) + rank_of(f);
                if (key >= 0 && (best_key < 0 || key < best_key)) {
                    best = p;
                    best_len = (size_t)(at - p);
                    best_key = key;
                }
            }
        }
        p += n;
        if (*p == ';')
            p++;
    }
    if (!best)
        return TERN_ENOENT;
    if (best_len >= len)
        return TERN_EINVAL;
    memcpy(uri, best, best_len);
    uri[best_len] = 0;
    return 0;
}
