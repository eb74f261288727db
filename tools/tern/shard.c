/* `tern shard define|list|add|remove`: shard maps in etcd
 * (services/cluster). The operator's side of what ternds campaign for: a
 * shard's replicas are set here, its primary and epoch by the election,
 * and the last step of a member's change by the primary (shard.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "opt.h"
#include "shard.h"
#include "terncli.h"

#define USAGE                                                                                \
    "shard define --etcd URLS [--prefix P] ID NODE... | shard list --etcd URLS [--prefix P] | " \
    "shard add|remove --etcd URLS [--prefix P] [--wait SECS] ID NODE"

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
        fprintf(l->f, " %s%s", m.replicas[i], m.vote[i] == CL_LEARNER ? " (learner)"
                                              : m.vote[i] == CL_LEAVING ? " (leaving)" : "");
    fprintf(l->f, "\n");
    l->n++;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Where `name` stands in the map: -1 gone, else its enum cl_vote. */
static int standing(const struct cl_shard_map *m, const char *name)
{
    for (unsigned i = 0; i < m->n_replicas; i++)
        if (strcmp(m->replicas[i], name) == 0)
            return m->vote[i];
    return -1;
}

/* Follow the map until `name` is a voter (add) or gone (remove), saying
 * each step; 0, or 1 at the deadline. */
static int wait_change(struct cl_etcd *e, const char *prefix, const char *id, const char *name,
                       bool add, double secs)
{
    static const char *const said[] = {"a voter", "a learner: copying, then counted in",
                                       "leaving: handed over, then dropped"};
    double deadline = now_s() + secs, t0 = now_s();
    int last = -2, rc;

    for (;;) {
        struct cl_shard_map m;
        int at;

        rc = cl_shard_get(e, prefix, id, &m, NULL);
        if (rc < 0) {
            fprintf(stderr, "tern: shard %s: %s: %s\n", id, tern_strerror(rc), cl_etcd_error(e));
            return 2;
        }
        at = standing(&m, name);
        if (at != last) {
            printf("%6.1f s  %s is %s  (epoch %llu, primary %s)\n", now_s() - t0, name,
                   at < 0 ? "no replica" : said[at], (unsigned long long)m.epoch,
                   m.primary[0] ? m.primary : "-");
            fflush(stdout);
            last = at;
        }
        if ((add && at == CL_VOTER) || (!add && at < 0))
            return 0;
        if (now_s() >= deadline) {
            fprintf(stderr, "tern: shard %s: %s is still %s after %.0f s (tern status on the "
                    "primary shows why)\n", id, name, at < 0 ? "no replica" : said[at], secs);
            return 1;
        }
        nanosleep(&(struct timespec){0, 200000000}, NULL);
    }
}

static int change(struct cl_etcd *e, const char *prefix, const char *cmd, const char *id,
                  const char *name, double wait)
{
    bool add = strcmp(cmd, "add") == 0;
    struct cl_shard_map m;
    int rc = cl_shard_change(e, prefix, id, add ? CL_OP_ADD : CL_OP_REMOVE, name, 0, NULL, &m);

    if (rc < 0) {
        const char *why = rc == TERN_EBUSY ? " (another member is being added or removed: "
                                             "wait for it, see tern shard list)"
                          : rc == TERN_EEXIST ? " (it is a replica already)"
                          : rc == TERN_ENOENT ? " (no such shard, or the node is no replica)"
                          : rc == TERN_EINVAL ? " (the only voter cannot leave; names are "
                                                "letters, digits, '.', '_', '-')"
                          : rc == TERN_E2BIG ? " (a shard has at most 7 replicas)" : "";

        fprintf(stderr, "tern: shard %s %s %s: %s%s%s%s\n", cmd, id, name, tern_strerror(rc), why,
                cl_etcd_error(e)[0] ? ": " : "", cl_etcd_error(e));
        return 2;
    }
    if (add)
        printf("shard %s: %s %s\n", id, name, standing(&m, name) == CL_VOTER
               ? "stays a voter (its removal is called off)"
               : "added as a learner: the primary copies the shard to it, then makes it a voter");
    else
        printf("shard %s: %s %s\n", id, name, standing(&m, name) < 0
               ? "removed (it was a learner)"
               : "is leaving: once a majority without it holds every acknowledged write, the "
                 "primary drops it (a leaving primary first hands its office over)");
    return wait > 0 ? wait_change(e, prefix, id, name, add, wait) : 0;
}

int tern_shard_cmd(int argc, char **argv)
{
    const char *etcd = NULL, *prefix = "/tern", *cmd = argc ? argv[0] : "";
    const char *pos[1 + CL_REPLICAS_MAX];
    bool changing = !strcmp(cmd, "add") || !strcmp(cmd, "remove");
    unsigned npos = 0;
    double wait = 0;
    struct cl_etcd *e;
    int rc;

    if (strcmp(cmd, "define") != 0 && strcmp(cmd, "list") != 0 && !changing)
        return opt_usage_error("tern", USAGE);
    for (int i = 1; i < argc; i++) {
        char *end;

        if (strcmp(argv[i], "--etcd") == 0 && i + 1 < argc)
            etcd = argv[++i];
        else if (strcmp(argv[i], "--prefix") == 0 && i + 1 < argc)
            prefix = argv[++i];
        else if (changing && strcmp(argv[i], "--wait") == 0 && i + 1 < argc) {
            wait = strtod(argv[++i], &end);
            if (*end || !(wait > 0 && wait <= 86400))
                return opt_usage_error("tern", "--wait %s: seconds, more than 0", argv[i]);
        }
        else if (argv[i][0] != '-' && npos < sizeof(pos) / sizeof(pos[0]))
            pos[npos++] = argv[i];
        else
            return opt_usage_error("tern", USAGE);
    }
    if (!etcd || prefix[0] != '/' || (strcmp(cmd, "list") == 0) != (npos == 0) ||
        (strcmp(cmd, "define") == 0 && npos < 2) || (changing && npos != 2))
        return opt_usage_error("tern", USAGE);
    if ((rc = cl_etcd_open(etcd, 0, &e)) < 0)
        return opt_usage_error("tern", "shard: --etcd %s: %s", etcd, tern_strerror(rc));
    if (changing) {
        rc = change(e, prefix, cmd, pos[0], pos[1], wait);
        cl_etcd_close(e);
        return rc;
    }
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
