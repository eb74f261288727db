/* tern: the command-line tool for pools and chains.
 *
 *   tern pool info PATH     the header and the segments in use (fast)
 *   tern pool check PATH    also every committed record's bounds and checksum
 *   tern doc PATH           a document pool's databases, collections, indexes
 *   tern doc --uri URI      the same, asked of a running ternd
 *   tern chain gen|append|info|verify ...   a block-sync chain (chain.c)
 *   tern kv get|put|del|scan|stat ADDRESS ...   a running KV store (kv.c)
 *   tern info               this host's fabrics and the settings in force (info.c)
 *   tern --help | --version
 *
 * The report goes to stdout. Exit status: 0 sound, 1 corrupt (the report
 * names the offset), 2 usage or another error (said once, on stderr).
 * Read-only: safe on a copy, or while ternd is down. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "opt.h"
#include "pm/pm.h"
#include "tern_config.h"
#include "terncli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tern pool info PATH    the pool's header and the segments in use\n"
            "       tern pool check PATH   also every committed record's bounds and checksum\n"
            "       tern doc PATH          a document pool's databases, collections, counts,\n"
            "                              indexes (the pool is opened: ternd must be down)\n"
            "       tern doc --uri URI     the same, asked of a running ternd\n"
            "       tern chain gen|append|info|verify ...  a block-sync chain (tern chain --help)\n"
            "       tern ping [-c COUNT] [--key-file F] ADDRESS\n"
            "                              a running ternd's round trip (ADDRESS: HOST:PORT by\n"
            "                              auto://, or a URI); exit 1 if a ping went unanswered\n"
            "       tern status [--json] [--key-file F] ADDRESS\n"
            "                              a running ternd: node, uptime, services, and per\n"
            "                              peer the fabric, calls, errors, failovers, credits\n"
            "       tern kv get|put|del|scan|stat ADDRESS ...\n"
            "                              a running ternd's KV store over the native RPC\n"
            "                              (tern kv --help)\n"
            "       tern info [--json] [--ntb-eal 'EAL ARGS']\n"
            "                              the fabrics built in, whether this host has each\n"
            "                              one's hardware (or why not), what emulates it, and\n"
            "                              the TERN_* settings in force (as ucx_info -d, -c)\n"
            "       tern ntb pull|plug ntb://emu:NAME   pull an emulated NTB cable or plug it\n"
            "                              back in (both ends see the link go down or up)\n"
            "       tern shard define --etcd URLS [--prefix P] ID NODE...\n"
            "                              a shard's map in etcd: the nodes that replicate it\n"
            "       tern shard list --etcd URLS [--prefix P]\n"
            "                              every shard: epoch, primary, replicas\n"
            "       tern shard add|remove --etcd URLS [--prefix P] [--wait SECS] ID NODE\n"
            "                              add a replica (copied in while the shard serves)\n"
            "                              or drain and remove one (a primary hands over)\n"
            "       tern --help | --version\n"
            "The cluster key (ping, status): --key-file F, else $TERN_KEY_FILE.\n"
            "Pools and chains are read-only. Exit status: 0 sound, 1 corrupt (the report\n"
            "names the offset), 2 usage or another error.\n");
}

static bool is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* The report, once the check could be made, on stdout; else only the
 * reason, on stderr. pm_check writes that reason into its report as
 * an "error" line, so the report is held until its verdict is known. */
static int pool_cmd(const char *path, bool deep)
{
    static const char tag[] = "error     ";
    char *rep = NULL, *why;
    size_t len = 0;
    uint64_t bad = 0;
    FILE *mem = open_memstream(&rep, &len);
    int rc;

    if (!mem) {
        fprintf(stderr, "tern: %s\n", tern_strerror(TERN_ENOMEM));
        return 2;
    }
    rc = pm_check(path, deep, mem, NULL, &bad);
    fclose(mem);
    if (rc == 0 || rc == TERN_ECORRUPT) {
        fwrite(rep, 1, len, stdout);
        free(rep);
        return rc ? 1 : 0;
    }
    why = rep ? strstr(rep, tag) : NULL;
    if (why) {
        why += sizeof(tag) - 1;
        why[strcspn(why, "\n")] = 0;
        fprintf(stderr, "tern: %s\n", why);    /* it names the file */
    } else {
        fprintf(stderr, "tern: %s: %s\n", path, tern_strerror(rc));
    }
    free(rep);
    return 2;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    bool deep, dashes = false;

    if (argc > 1 && strcmp(argv[1], "chain") == 0)
        return tern_chain_cmd(argc - 2, argv + 2);
    if (argc > 1 && strcmp(argv[1], "kv") == 0)
        return tern_kv_cmd(argc - 2, argv + 2);
    if (argc > 1 && strcmp(argv[1], "info") == 0)
        return tern_info_cmd(argc - 2, argv + 2);
    if (argc > 1 && strcmp(argv[1], "ntb") == 0 &&
        !(argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)))
        return tern_ntb_cmd(argc - 2, argv + 2);
#if TERN_HAVE_CLUSTER
    if (argc > 1 && strcmp(argv[1], "shard") == 0 &&
        !(argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)))
        return tern_shard_cmd(argc - 2, argv + 2);
#endif
    if (argc > 1 && (strcmp(argv[1], "ping") == 0 || strcmp(argv[1], "status") == 0) &&
        !(argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)))
        return tern_node_cmd(argv[1], argc - 2, argv + 2);
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0)
            return opt_version("tern");
        if (strcmp(argv[i], "--") == 0)
            break;
    }
    if (argc < 2)
        return opt_usage_error("tern", "a command is needed (tern pool info|check PATH)");
    if (strcmp(argv[1], "doc") == 0)
        return tern_doc_cmd(argc - 2, argv + 2);
    if (strcmp(argv[1], "pool") != 0)
        return opt_usage_error("tern", "unknown command '%s'", argv[1]);
    if (argc < 3)
        return opt_usage_error("tern", "pool: info or check is needed");
    if (strcmp(argv[2], "info") == 0)
        deep = false;
    else if (strcmp(argv[2], "check") == 0)
        deep = true;
    else
        return opt_usage_error("tern", "pool: unknown command '%s' (info or check)", argv[2]);
    /* One PATH; "--" lets it start with a dash. */
    for (int i = 3; i < argc; i++) {
        if (!dashes && strcmp(argv[i], "--") == 0)
            dashes = true;
        else if (!dashes && argv[i][0] == '-' && argv[i][1])
            return opt_usage_error("tern", "unknown option '%s'", argv[i]);
        else if (path)
            return opt_usage_error("tern", "pool %s: one PATH only", argv[2]);
        else
            path = argv[i];
    }
    if (!path)
        return opt_usage_error("tern", "pool %s: PATH is needed", argv[2]);
    return pool_cmd(path, deep);
}
