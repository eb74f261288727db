/* libFuzzer target: a node's STATUS reply as `tern status` reads it
 * (tools/tern/node.c over json-c), from a ternd that may lie. Anything
 * that is not one JSON object is refused; an object prints, as a table or
 * as itself, whatever its fields hold (wrong types, missing keys, huge
 * arrays). */
#include "fuzz.h"
#include "terncli.h"

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    devnull = fopen("/dev/null", "w");
    return devnull ? 0 : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int a = tern_status_print(devnull, (const char *)data, size, false);
    int b = tern_status_print(devnull, (const char *)data, size, true);

    if (a != b)                      /* one verdict, whichever way it prints */
        abort();
    return 0;
}
