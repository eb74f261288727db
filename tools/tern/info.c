/* `tern info`: what this host offers tern, as `ucx_info -d` and `-c` show
 * for UCX. Every fabric built in, whether its hardware is here (or why
 * not, in the words of the fabric's own probe), what stands in for it on a
 * host without it, its capabilities, and then the environment settings
 * the library reads, with the value in force.
 *
 * The probes look and touch nothing: no device is opened for writing, no
 * segment created. The NTB probe starts DPDK's EAL only with
 * `--ntb-eal ARGS` (or TERN_NTB_EAL), which is what a hardware link would
 * use; without them it says so instead of guessing at PCI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "opt.h"
#include "tern/transport.h"
#include "terncli.h"

/* The settings the library reads (docs/ENVIRONMENT.md, "Library"), with
 * what each falls back to. tests/cli_smoke.sh checks that every TERN_*
 * variable the library's sources read is here. */
static const struct setting {
    const char *name, *fallback, *what;
} settings[] = {
    {"TERN_LOG", "warn (ternd: info)", "log level: error, warn, info or debug"},
    {"TERN_FABRICS", "any, best score first", "auto:// policy: fabrics a client may move to"},
    {"TERN_KEY_FILE", "none", "cluster key for tern ping/status and rpcbench failover"},
    {"TERN_TCP_DEAD_MS", "2000", "ms unacknowledged before a TCP connection is dead"},
    {"TERN_NTB_EAL", "none", "DPDK EAL arguments for a hardware NTB link"},
    {"TERN_NTB_DEAD_MS", "2000", "ms of heartbeat silence before an NTB peer is dead"},
    {"TERN_RDMA_PROVIDER", "auto", "verbs (rdma-core), softverbs, or auto"},
    {"TERN_RDMA_DEVICE", "first active port", "the rdma-core device, e.g. mlx5_0"},
    {"TERN_RDMA_SRQ_DEPTH", "device limit, <= 1024", "receives in the shared receive queue"},
    {"TERN_RDMA_MW", "on where the device has them", "0: no type 2 memory windows"},
    {"TERN_RDMA_LOCAL_IP", "127.0.0.1", "the rdma fabric's local address"},
};

static const struct {
    uint32_t bit;
    const char *name;
} cap_names[] = {
    {TERN_TP_CAP_MSG, "msg"},           {TERN_TP_CAP_PUT, "put"},
    {TERN_TP_CAP_GET, "get"},           {TERN_TP_CAP_WAIT_FD, "wait_fd"},
    {TERN_TP_CAP_RKEY_PTR, "rkey_ptr"}, {TERN_TP_CAP_RMA_OFFLOAD, "rma_offload"},
    {TERN_TP_CAP_STRICT_RKEY, "strict_rkey"}, {TERN_TP_CAP_POINT_TO_POINT, "point_to_point"},
};

/* What stands in for a fabric's hardware on a host without it. */
static void emulation(const char *fabric, char *out, size_t cap)
{
    char desc[256];

    out[0] = 0;
    if (strcmp(fabric, "rdma") == 0 && tern_tp_probe("rdma", "soft", desc, sizeof(desc)) == 0)
        snprintf(out, cap, "%s", desc);
    else if (strcmp(fabric, "ntb") == 0)
        snprintf(out, cap, "ntb://emu:NAME (a shared-memory device file of this host)");
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

int tern_info_cmd(int argc, char **argv)
{
    const char *const *names = tern_tp_fabric_names();
    const char *eal = getenv("TERN_NTB_EAL");
    bool json = false;

    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--ntb-eal") == 0 && i + 1 < argc) {
            eal = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: tern info [--json] [--ntb-eal 'EAL ARGS']\n"
                   "  the fabrics built in, whether this host has each one's hardware\n"
                   "  (or why not), what emulates it, and the TERN_* settings in force\n");
            return 0;
        } else {
            return opt_usage_error("tern info", "unknown argument '%s'", argv[i]);
        }
    }
    if (json)
        printf("{\"fabrics\": [");
    else
        printf("%-6s %-8s %s\n", "fabric", "hardware", "what the probe found; capabilities");
    for (unsigned i = 0; names[i]; i++) {
        char desc[256] = "", emu[256], caps[160] = "";
        size_t used = 0;
        uint32_t c = tern_tp_fabric_caps(names[i]);
        int rc;

        /* Without EAL arguments the NTB probe would have to guess at the
         * PCI bus and hugepages: say what it needs instead. */
        if (strcmp(names[i], "ntb") == 0 && !eal) {
            rc = TERN_ENODEV;
            snprintf(desc, sizeof(desc), "not probed: give --ntb-eal 'EAL ARGS' or TERN_NTB_EAL "
                     "(e.g. -a 0000:af:00.0) to look for a device");
        } else {
            rc = tern_tp_probe(names[i], strcmp(names[i], "ntb") == 0 ? eal : NULL, desc,
                               sizeof(desc));
        }
        emulation(names[i], emu, sizeof(emu));
        for (unsigned k = 0; k < sizeof(cap_names) / sizeof(cap_names[0]); k++)
            if (c & cap_names[k].bit)
                used += (size_t)snprintf(caps + used, sizeof(caps) - used, "%s%s",
                                         used ? " " : "", cap_names[k].name);
        if (json) {
            printf("%s{\"name\": ", i ? ", " : "");
            json_str(stdout, names[i]);
            printf(", \"hardware\": %s, \"probe\": ", rc == 0 ? "true" : "false");
            json_str(stdout, desc);
            printf(", \"emulated_by\": ");
            json_str(stdout, emu);
            printf(", \"caps\": ");
            json_str(stdout, caps);
            printf("}");
        } else {
            printf("%-6s %-8s %s\n", names[i], rc == 0 ? "yes" : "no", desc);
            if (emu[0])
                printf("%-6s %-8s emulated by %s\n", "", "", emu);
            printf("%-6s %-8s caps: %s\n", "", "", caps);
        }
    }
    if (json)
        printf("], \"environment\": [");
    else
        printf("\n%-20s %-28s %s\n", "setting", "value", "meaning (default)");
    for (unsigned i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        const struct setting *s = &settings[i];
        const char *v = getenv(s->name);

        if (json) {
            printf("%s{\"name\": \"%s\", \"set\": %s, \"value\": ", i ? ", " : "", s->name,
                   v ? "true" : "false");
            json_str(stdout, v ? v : s->fallback);
            printf("}");
        } else {
            char shown[64];

            snprintf(shown, sizeof(shown), "%s", v ? v : "-");
            printf("%-20s %-28s %s (%s)\n", s->name, shown, s->what, s->fallback);
        }
    }
    if (json)
        printf("]}\n");
    return 0;
}
