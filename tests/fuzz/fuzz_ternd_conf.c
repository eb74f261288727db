/* libFuzzer target: ternd's configuration file (tools/ternd/opts.c over
 * inih), a file an operator writes by hand. It may only refuse, with a
 * message; a file it takes must hold settings within their bounds, and
 * print (--check) as a file that reads back the same. */
#include "fuzz.h"
#include "opts.h"

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    devnull = fopen("/dev/null", "w");
    return devnull ? 0 : 1;
}

static void check_sane(const struct ternd_opts *o)
{
    if (o->n_listen > TERND_MAX_LISTEN || o->n_peers > TERND_MAX_PEERS ||
        o->chain.n_peers > TERND_CHAIN_PEERS || o->policy.n_subnets > TERND_MAX_SUBNETS ||
        o->policy.same_rack.n > TERND_FABRICS || o->policy.other_rack.n > TERND_FABRICS)
        abort();
    if (!memchr(o->name, 0, sizeof(o->name)) || !memchr(o->rack, 0, sizeof(o->rack)))
        abort();
    for (unsigned i = 0; i < o->n_peers; i++)
        if (!o->peers[i].address || strncmp(o->peers[i].address, "tcp://", 6) != 0 ||
            !o->peers[i].name[0])
            abort();
    if (o->seg_size & (o->seg_size - 1))
        abort();
}

/* The print of what was read back is the print it was read from (but
 * for the first line, which names the file). */
static void same_print(const char *printed, const struct ternd_opts *back)
{
    char *again = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&again, &len);
    const char *a, *b;

    if (!out)
        return;
    ternd_opts_print(out, back);
    fclose(out);
    a = strchr(printed, '\n');
    b = strchr(again, '\n');
    if (!a || !b || strcmp(a, b) != 0) {
        fprintf(stdout, "first:\n%s\nread back:\n%s\n", printed, again);
        fflush(stdout);
        abort();
    }
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ternd_opts o, back;
    FILE *in, *save = stderr;
    char *printed = NULL;
    size_t plen = 0;
    FILE *out;

    if (size == 0)
        return 0;
    in = fmemopen((void *)data, size, "r");
    if (!in)
        return 0;
    stderr = devnull;                /* the refusals are expected */
    if (ternd_opts_load_stream(in, "fuzz.conf", &o) == 0) {
        check_sane(&o);
        out = open_memstream(&printed, &plen);
        if (out) {
            ternd_opts_print(out, &o);
            fclose(out);
            /* What --check prints must read back, to the same print. */
            in = (fclose(in), fmemopen(printed, plen, "r"));
            if (in && ternd_opts_load_stream(in, "printed.conf", &back) != 0) {
                stderr = save;
                fprintf(stderr, "printed settings refused:\n%s\n", printed);
                abort();
            }
            if (in)
                same_print(printed, &back);
        }
    }
    stderr = save;
    if (in)
        fclose(in);
    free(printed);
    ternd_opts_free(&o);
    return 0;
}
