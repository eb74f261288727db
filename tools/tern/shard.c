/* `tern shard define|list`: shard maps in etcd (services/cluster). The
 * operator's side of what ternds campaign for: a shard's replicas are set
 * here, its primary and epoch by the election. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "opt.h"
#include "shard.h"
#include "terncli.h"

#define USAGE "shard define --etcd URLS [--prefix P] ID NODE... | shard list --etcd URLS [--prefix P]"

struct listing {
    FILE *f;
    size_t plen;
    unsigned n, bad;
};

/* Each PREFIX/shards/ID/map, printed; offices are skipped. */
static int print_map(void *arg, const struct cl_kv *kv)
{
    struct listing *l = arg;
    struct cl_shard_map m;

    if (kv->key_len < 4 || memcmp(kv->key + kv->key_len - 4, "/map", 4) != 0)
        return 0;
    if (cl_shard_map_parse(kv->value, kv->value_len, &m) < 0) {
        fprintf(stderr, "tern: %.*s: not a shard map\n", (int)kv->key_len, kv->key);
        l->bad++;
        return 0;
    }
    fprintf(l->f, "%-16s epoch %-6llu primary %-12s replicas", m.id,
            (unsigned long long)m.epoch, m.primary[0] ? m.primary : "-");
    for (unsigned i = 0; i < m.n_replicas; i++)
        fprintf(l->f, " %s", m.replicas[i]);
    fprintf(l->f, "\n");
    l->n++;
    return 0;
}

int tern_shard_cmd(int argc, char **argv)
{
    const char *etcd = NULL, *prefix = "/tern", *cmd = argc ? argv[0] : "";
    const char *pos[1 + CL_REPLICAS_MAX];
    unsigned npos = 0;
    struct cl_etcd *e;
    int rc;

    if (strcmp(cmd, "define") != 0 && strcmp(cmd, "list") != 0)
        return opt_usage_error("tern", USAGE);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--etcd") == 0 && i + 1 < argc)
            etcd = argv[++i];
        else if (strcmp(argv[i], "--prefix") == 0 && i + 1 < argc)
            prefix = argv[++i];
        else if (argv[i][0] != '-' && npos < sizeof(pos) / sizeof(pos[0]))
            pos[npos++] = argv[i];
        else
            return opt_usage_error("tern", USAGE);
    }
    if (!etcd || prefix[0] != '/' || (strcmp(cmd, "list") == 0) != (npos == 0) ||
        (strcmp(cmd, "define") == 0 && npos < 2))
        return opt_usage_error("tern", USAGE);
    if ((rc = cl_etcd_open(etcd, 0, &e)) < 0)
        return opt_usage_error("tern", "shard: --etcd %s: %s", etcd, tern_strerror(rc));
    if (strcmp(cmd, "define") == 0) {
        struct cl_shard_map m = {.n_replicas = npos - 1};

        snprintf(m.id, sizeof(m.id), "%s", pos[0]);
        for (unsigned i = 1; i < npos; i++)
            snprintf(m.replicas[i - 1], sizeof(m.replicas[0]), "%s", pos[i]);
        rc = cl_shard_define(e, prefix, &m);
        if (rc == 0)
            printf("shard %s defined: %u replicas\n", m.id, m.n_replicas);
        else
            fprintf(stderr, "tern: shard define %s: %s%s%s\n", pos[0], tern_strerror(rc),
                    rc == TERN_EINVAL ? " (names are letters, digits, '.', '_', '-'; "
                                        "replicas distinct)" : "",
                    cl_etcd_error(e)[0] ? cl_etcd_error(e) : "");
    } else {
        struct listing l = {.f = stdout};
        char key[CL_KEY_MAX + 1];

        snprintf(key, sizeof(key), "%s/shards/", prefix);
        rc = cl_etcd_get(e, key, true, print_map, &l, NULL);
        if (rc < 0)
            fprintf(stderr, "tern: shard list: %s: %s\n", tern_strerror(rc), cl_etcd_error(e));
        else if (!l.n)
            printf("no shards under %s\n", prefix);
        if (rc == 0 && l.bad)
            rc = 1;
    }
    cl_etcd_close(e);
    return rc == 0 ? 0 : rc == 1 ? 1 : 2;
}
