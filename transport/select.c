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
    bool known = node && tern_tp_node_id(me, sizeof(me)) == 0;
    bool same_node = known && strcmp(me, node) == 0;
    /* The same kernel: the boot ids (before the '.') agree. */
    size_t boot = known ? strcspn(me, ".") : 0;
    bool same_host = known && boot && strncmp(me, node, boot) == 0 && node[boot] == '.';

    return f->reachable && f->reachable(addr, len, same_node, same_host);
}

int tern_tp_select_list(const char *ads, const char *policy, char *uris, size_t stride,
                        unsigned max)
{
    struct {
        const char *p;
        size_t len;
        long long key;
    } found[16];
    unsigned n = 0;

    if (!ads || !uris || !stride)
        return TERN_EINVAL;
    for (const char *p = ads; *p;) {
        size_t len = strcspn(p, ";");
        const char *sep = memchr(p, ':', len), *at = memchr(p, '@', len);
        char node[128] = "";

        /* An entry needs an address: "shm://@node" names nothing to
         * connect to (tern_tp_uri_fabric refuses the URI it would make). */
        if (sep && at && at > sep + 3 && (size_t)(at - p) < len && sep[1] == '/' &&
            sep[2] == '/' && n < sizeof(found) / sizeof(found[0])) {
            size_t fl = (size_t)(sep - p), nl = len - (size_t)(at + 1 - p);
            const struct tern_tp_fabric *f = tp_fabric_of(p);

            if (nl < sizeof(node)) {
                memcpy(node, at + 1, nl);
                node[nl] = 0;
            }
            if (f && (size_t)(at - p) < stride &&
                reachable(f, sep + 3, (size_t)(at - sep - 3), node)) {
                int pos = policy && *policy ? policy_pos(policy, p, fl) : 0;

                /* The policy decides first (its order), the scores next. */
                if (pos >= 0) {
                    found[n].p = p;
                    found[n].len = (size_t)(at - p);
                    found[n++].key = (long long)pos * (1ll << 40) + rank_of(f);
                }
            }
        }
        p += len;
        if (*p == ';')
            p++;
    }
    /* Best first; equal keys keep the server's order. */
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && found[j].key < found[j - 1].key; j--) {
            __typeof__(found[0]) t = found[j];

            found[j] = found[j - 1];
            found[j - 1] = t;
        }
    if (n > max)
        n = max;
    for (unsigned i = 0; i < n; i++) {
        memcpy(uris + i * stride, found[i].p, found[i].len);
        uris[i * stride + found[i].len] = 0;
    }
    return (int)n;
}

int tern_tp_select(const char *ads, const char *policy, char *uri, size_t len)
{
    char best[256];
    int n;

    if (!ads || !uri || !len)
        return TERN_EINVAL;
    n = tern_tp_select_list(ads, policy, best, sizeof(best), 1);
    if (n < 0)
        return n;
    if (n == 0)
        return TERN_ENOENT;
    if (strlen(best) >= len)
        return TERN_EINVAL;
    memcpy(uri, best, strlen(best) + 1);
    return 0;
}
