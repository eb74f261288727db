/* tern: the command-line tool for pools.
 *
 *   tern pool info PATH     the header and the segments in use (fast)
 *   tern pool check PATH    also every committed record's bounds and checksum
 *
 * Exit status: 0 sound, 1 corrupt (the report names the offset), 2 usage or
 * another error. Read-only: safe on a copy, or while ternd is down. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "pm/pm.h"

static int usage(void)
{
    fprintf(stderr, "usage: tern pool info|check PATH\n");
    return 2;
}

int main(int argc, char **argv)
{
    bool deep;
    uint64_t bad = 0;
    int rc;

    if (argc != 4 || strcmp(argv[1], "pool") != 0)
        return usage();
    if (strcmp(argv[2], "info") == 0)
        deep = false;
    else if (strcmp(argv[2], "check") == 0)
        deep = true;
    else
        return usage();
    rc = tern_pm_check(argv[3], deep, stdout, NULL, &bad);
    if (rc == TERN_ECORRUPT) {
        fprintf(stderr, "tern: %s is corrupt at offset %llu\n", argv[3], (unsigned long long)bad);
        return 1;
    }
    if (rc < 0) {
        fprintf(stderr, "tern: %s: %s\n", argv[3], tern_strerror(rc));
        return 2;
    }
    return 0;
}
