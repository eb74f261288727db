/* `tern ping ADDRESS` and `tern status [--json] ADDRESS`: a running
 * ternd's node service (tools/common/node_proto.h) over tern RPC.
 * ADDRESS is HOST:PORT (reached by auto://, so the best fabric both ends
 * have) or any tern URI. */
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "key.h"
#include "node_proto.h"
#include "opt.h"
#include "rpc.h"
#include "terncli.h"

#define CALL_TIMEOUT_NS 2000000000ull

/* The cluster key of --key-file, else of $TERN_KEY_FILE, else none. */
static const char *key_path;

int tern_cli_endpoint(const char *key_file, struct tern_rpc_ep **ep)
{
    struct tern_rpc_config cfg = {.size = sizeof(cfg)};
    const char *path = key_file ? key_file : getenv("TERN_KEY_FILE");
    uint8_t key[KEY_MAX];
    size_t key_len = 0;
    char why[160];
    int rc;

    if (path && *path) {
        if (key_load(path, key, &key_len, why, sizeof(why)) < 0) {
            fprintf(stderr, "tern: key file %s: %s\n", path, why);
            return TERN_EINVAL;
        }
        cfg.key = key;
        cfg.key_len = key_len;
    }
    rc = tern_rpc_open(&cfg, ep);
    memset(key, 0, sizeof(key));
    if (rc < 0)
        fprintf(stderr, "tern: %s\n", tern_strerror(rc));
    return rc;
}

void tern_cli_uri(const char *addr, char *uri, size_t cap)
{
    if (strstr(addr, "://"))
        snprintf(uri, cap, "%s", addr);
    else
        snprintf(uri, cap, "auto://%s", addr);
}

static int open_session(const char *addr, struct tern_rpc_ep **ep, struct tern_session **s)
{
    char uri[256];
    int rc;

    tern_cli_uri(addr, uri, sizeof(uri));
    if ((rc = tern_cli_endpoint(key_path, ep)) < 0)
        return rc;
    if ((rc = tern_rpc_connect(*ep, uri, CALL_TIMEOUT_NS, s)) < 0) {
        tern_rpc_close(*ep);
        *ep = NULL;
        fprintf(stderr, "tern: %s: %s\n", uri, tern_strerror(rc));
    }
    return rc;
}

static int ping_cmd(int argc, char **argv)
{
    uint64_t count = 4, seq;
    const char *addr = NULL;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    double min = INFINITY, max = 0, sum = 0;
    unsigned got = 0;

    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--key-file") == 0 && i + 1 < argc) {
            key_path = argv[++i];
        } else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            if (!opt_num("tern ping", "-c", argv[++i], 1, 1000000, 0, &count))
                return OPT_USAGE;
        } else if (!addr && argv[i][0] != '-') {
            addr = argv[i];
        } else {
            return opt_usage_error("tern", "ping: [-c COUNT] [--key-file F] ADDRESS (HOST:PORT or a URI)");
        }
    }
    if (!addr)
        return opt_usage_error("tern", "ping: [-c COUNT] [--key-file F] ADDRESS (HOST:PORT or a URI)");
    if (open_session(addr, &ep, &s) < 0)
        return 2;
    printf("PING %s over %s\n", addr, tern_session_fabric(s));
    for (seq = 1; seq <= count; seq++) {
        uint64_t back = 0, t0 = tern_now_ns();
        size_t len = 0;
        int rc = tern_call_sync(s, NODE_SERVICE_ID, NODE_M_PING, &seq, sizeof(seq), &back,
                                sizeof(back), &len, CALL_TIMEOUT_NS);
        double us = (double)(tern_now_ns() - t0) / 1e3;

        if (rc == 0 && (len != sizeof(back) || back != seq))
            rc = TERN_EPROTO;
        if (rc < 0) {
            printf("seq=%llu %s\n", (unsigned long long)seq, tern_strerror(rc));
        } else {
            printf("seq=%llu fabric=%s time=%.1f us\n", (unsigned long long)seq,
                   tern_session_fabric(s), us);
            got++;
            sum += us;
            min = us < min ? us : min;
            max = us > max ? us : max;
        }
        if (seq < count)
            nanosleep(&(struct timespec){.tv_nsec = 200000000}, NULL);
    }
    printf("%llu sent, %u answered", (unsigned long long)count, got);
    if (got)
        printf(", rtt min/avg/max %.1f/%.1f/%.1f us", min, sum / got, max);
    printf("\n");
    tern_rpc_close(ep);
    return got == count ? 0 : 1;
}

static const char *str(json_object *o, const char *key)
{
    json_object *v;

    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)
               ? json_object_get_string(v) : "-";
}

static double num(json_object *o, const char *key)
{
    json_object *v;

    return json_object_object_get_ex(o, key, &v) ? json_object_get_double(v) : 0;
}

static bool is_true(json_object *o, const char *key)
{
    json_object *v;

    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_boolean) &&
           json_object_get_boolean(v);
}

/* A replica's vote, worth showing only while its membership changes. */
static const char *vote_of(json_object *o)
{
    const char *v = str(o, "vote");

    return strcmp(v, "voter") == 0 || strcmp(v, "-") == 0 ? "" : v;
}

static void print_table(FILE *f, json_object *st)
{
    json_object *svcs, *peers, *cl, *sh;

    fprintf(f, "node %s  rack %s  up %.0f s  pid %.0f  tern %s\n", str(st, "node"),
           *str(st, "rack") ? str(st, "rack") : "-", num(st, "uptime_s"), num(st, "pid"),
           str(st, "version"));
    if (json_object_object_get_ex(st, "services", &svcs) &&
        json_object_is_type(svcs, json_type_array)) {
        fprintf(f, "services");
        for (size_t i = 0; i < json_object_array_length(svcs); i++)
            fprintf(f, " %s", json_object_get_string(json_object_array_get_idx(svcs, i)));
        fprintf(f, "\n");
    }
    if (json_object_object_get_ex(st, "cluster", &cl) && json_object_is_type(cl, json_type_object)) {
        json_object *reg;
        bool on = json_object_object_get_ex(cl, "registered", &reg) &&
                  json_object_is_type(reg, json_type_boolean) && json_object_get_boolean(reg);

        if (on)
            fprintf(f, "cluster %s/nodes/%s in etcd %s  lease %s  registrations %.0f\n",
                    str(cl, "prefix"), str(st, "node"), str(cl, "etcd"), str(cl, "lease"),
                    num(cl, "registrations"));
        else
            fprintf(f, "cluster %s in etcd %s  NOT REGISTERED: %s\n", str(cl, "prefix"),
                    str(cl, "etcd"), str(cl, "error"));
        if (json_object_object_get_ex(cl, "shards", &sh) && json_object_is_type(sh, json_type_array))
            for (size_t i = 0; i < json_object_array_length(sh); i++) {
                json_object *x = json_object_array_get_idx(sh, i);

                fprintf(f, "shard %-16s %-8s epoch %-6.0f primary %s\n", str(x, "id"),
                        str(x, "role"), num(x, "epoch"), str(x, "primary"));
            }
    }
    for (int k = 0; k < 2; k++) {
        json_object *reps;

        if (!json_object_object_get_ex(st, k ? "doc_replication" : "replication", &cl) ||
            !json_object_is_type(cl, json_type_object))
            continue;
        fprintf(f, "replicated %s shard %s  %s%s  epoch %.0f  position %s  committed %s  "
                   "held %.0f%s%s\n", k ? "doc" : "kv", str(cl, "shard"), str(cl, "state"),
                is_true(cl, "handing_over") ? " (handing over: no writes)" : "",
                num(cl, "epoch"), str(cl, "position"), str(cl, "committed"), num(cl, "held"),
                *vote_of(cl) ? "  " : "", vote_of(cl));
        if (json_object_object_get_ex(cl, "replicas", &reps) &&
            json_object_is_type(reps, json_type_array))
            for (size_t i = 0; i < json_object_array_length(reps); i++) {
                json_object *x = json_object_array_get_idx(reps, i);

                fprintf(f, "  replica %-12s %-11s position %-14s lag %-6.0f %s%s%s\n",
                        str(x, "node"), str(x, "state"), str(x, "position"), num(x, "lag"),
                        str(x, "shipping"), *vote_of(x) ? "  " : "", vote_of(x));
            }
    }
    if (!json_object_object_get_ex(st, "peers", &peers) ||
        !json_object_is_type(peers, json_type_array) || !json_object_array_length(peers)) {
        fprintf(f, "no peers configured\n");
        return;
    }
    fprintf(f, "%-12s %-8s %-10s %-8s %10s %9s %7s %12s %9s %7s %9s  %s\n", "PEER", "RACK",
           "STATE", "FABRIC", "CALLS", "CALLS/S", "ERRORS", "BYTES", "FAILOVERS", "CREDITS",
           "RTT(us)", "LAST ERROR");
    for (size_t i = 0; i < json_object_array_length(peers); i++) {
        json_object *p = json_object_array_get_idx(peers, i);

        fprintf(f, "%-12s %-8s %-10s %-8s %10.0f %9.1f %7.0f %12.0f %9.0f %7.0f %9.1f  %s\n",
               str(p, "node"), *str(p, "rack") ? str(p, "rack") : "-", str(p, "state"),
               str(p, "fabric"), num(p, "calls"), num(p, "calls_per_s"), num(p, "errors"),
               num(p, "bytes"), num(p, "failovers"), num(p, "credits"), num(p, "rtt_us"),
               str(p, "last_error"));
    }
}

int tern_status_print(FILE *f, const char *reply, size_t len, bool as_json)
{
    json_tokener *tok = json_tokener_new();
    json_object *st;
    int rc = 0;

    if (!tok || len > INT32_MAX)
        return -1;
    /* Checked before it is printed, even as it is: a peer may lie. */
    st = json_tokener_parse_ex(tok, reply, (int)len);
    if (!st || json_tokener_get_error(tok) != json_tokener_success ||
        !json_object_is_type(st, json_type_object) || memchr(reply, 0, len))
        rc = -1;
    else if (as_json)
        fprintf(f, "%.*s\n", (int)len, reply);
    else
        print_table(f, st);
    json_object_put(st);
    json_tokener_free(tok);
    return rc;
}

static int status_cmd(int argc, char **argv)
{
    const char *addr = NULL;
    bool json = false;
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    size_t cap = 1u << 20, len = 0;
    char *reply;
    int rc;

    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--key-file") == 0 && i + 1 < argc)
            key_path = argv[++i];
        else if (!addr && argv[i][0] != '-')
            addr = argv[i];
        else
            return opt_usage_error("tern", "status: [--json] [--key-file F] ADDRESS (HOST:PORT or a URI)");
    }
    if (!addr)
        return opt_usage_error("tern", "status: [--json] [--key-file F] ADDRESS (HOST:PORT or a URI)");
    if (open_session(addr, &ep, &s) < 0)
        return 2;
    reply = malloc(cap);
    rc = reply ? tern_call_sync(s, NODE_SERVICE_ID, NODE_M_STATUS, NULL, 0, reply, cap, &len,
                                CALL_TIMEOUT_NS)
               : TERN_ENOMEM;
    tern_rpc_close(ep);
    if (rc < 0) {
        fprintf(stderr, "tern: %s: status: %s\n", addr, tern_strerror(rc));
        free(reply);
        return 2;
    }
    if (tern_status_print(stdout, reply, len, json) < 0) {
        fprintf(stderr, "tern: %s: status: not a JSON object\n", addr);
        free(reply);
        return 2;
    }
    free(reply);
    return 0;
}

/* `tern ntb pull|plug ntb://emu:NAME`: an emulated cable out or back in. */
int tern_ntb_cmd(int argc, char **argv)
{
    int rc;

    if (argc != 2 || (strcmp(argv[0], "pull") != 0 && strcmp(argv[0], "plug") != 0))
        return opt_usage_error("tern", "ntb pull|plug ntb://emu:NAME");
    rc = tern_tp_emu_cable(argv[1], strcmp(argv[0], "plug") == 0);
    if (rc < 0) {
        fprintf(stderr, "tern: ntb %s %s: %s%s\n", argv[0], argv[1], tern_strerror(rc),
                rc == TERN_ENOENT ? " (no process has that device open)" : "");
        return 2;
    }
    return 0;
}

int tern_node_cmd(const char *cmd, int argc, char **argv)
{
    if (strcmp(cmd, "ping") == 0)
        return ping_cmd(argc, argv);
    return status_cmd(argc, argv);
}
