/* Per-peer fabric choice. A node advertises the fabrics it listens on; the
 * other side keeps those it can reach from here, scores them (latency first,
 * then bandwidth, as UCX's wireup ranks transports), applies the local
 * policy, and picks the best. TCP, which the exchange itself runs on, is
 * always the fallback. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tern_config.h"
#include "transport_internal.h"
#if TERN_HAVE_RDMA
#include "rdma/rdma_api.h"
#endif

/* Lower is better: typical same-rack small-message latency in ns, and the
 * bandwidth in GB/s as the tie breaker. Only the order matters. */
static const struct {
    const char *fabric;
    unsigned latency_ns;
    unsigned bandwidth_gbs;
} scores[] = {
    {"shm", 300, 20},
    {"ntb", 800, 12},
    {"rdma", 2000, 12},
    {"tcp", 10000, 2},
};

#define N_SCORES (sizeof(scores) / sizeof(scores[0]))

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

static int rank_of(const char *fabric, size_t fl)
{
    for (size_t i = 0; i < N_SCORES; i++)
        if (strlen(scores[i].fabric) == fl && strncmp(scores[i].fabric, fabric, fl) == 0)
            return (int)i;
    return -1;
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
static bool reachable(const char *fabric, size_t fl, const char *node)
{
    char me[128];
    bool same_node = node && tern_tp_node_id(me, sizeof(me)) == 0 && strcmp(me, node) == 0;

    if (fl == 3 && strncmp(fabric, "shm", 3) == 0)
        return same_node;
    /* An emulated NTB device is a file of this host. A hardware link joins
     * two hosts that only their cabling knows of: it is taken when a
     * policy names it, not guessed. */
    if (fl == 3 && strncmp(fabric, "ntb", 3) == 0)
        return same_node && strncmp(fabric + fl, "://emu:", 7) == 0;
    /* RDMA only when both ends can: the peer advertises it only if it has
     * a device, and this node needs one too. An emulated NIC ("soft:")
     * reaches processes of this host only. */
    if (fl == 4 && strncmp(fabric, "rdma", 4) == 0) {
#if TERN_HAVE_RDMA
        if (strncmp(fabric + fl, "://soft:", 8) == 0)
            return same_node;
        return tern_rdma_hw_usable(NULL, 0);
#else
        return false;
#endif
    }
    return false;
}

int tern_tp_select(const char *ads, const char *policy, char *uri, size_t len)
{
    const char *best = NULL;
    size_t best_len = 0;
    int best_key = -1;

    if (!ads || !uri || !len)
        return TERN_EINVAL;
    for (const char *p = ads; *p;) {
        size_t n = strcspn(p, ";");
        const char *sep = memchr(p, ':', n), *at = memchr(p, '@', n);
        char node[128] = "";
        int key;

        if (sep && at && at > sep && (size_t)(at - p) < n) {
            size_t fl = (size_t)(sep - p), nl = n - (size_t)(at + 1 - p);
            int rank = rank_of(p, fl);

            if (nl < sizeof(node)) {
                memcpy(node, at + 1, nl);
                node[nl] = 0;
            }
            if (rank >= 0 && reachable(p, fl, node)) {
                int pos = policy && *policy ? policy_pos(policy, p, fl) : 0;

                /* The policy decides first (its order), the scores next. */
                key = pos < 0 ? -1 : pos * (int)N_SCORES + rank;
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
