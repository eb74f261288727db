#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opt.h"
#include "tern_config.h"

static const char units[] = "kmgt";

/* The number `s` spells, with its suffix. False if it is not one or does
 * not fit in 64 bits (then *too_big says which). A leading '-' is read as
 * a number below any range, so "-5" is reported as out of range. */
static bool parse(const char *s, unsigned flags, uint64_t *out, bool *negative, bool *too_big)
{
    const char *p = s, *u;
    unsigned long long v;
    char *end;
    int base = 10;

    *negative = *too_big = false;
    if (*p == '-') {
        *negative = true;
        p++;
    }
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
    }
    /* strtoull would also take blanks and a second sign. */
    if (!(base == 16 ? isxdigit((unsigned char)*p) : isdigit((unsigned char)*p)))
        return false;
    errno = 0;
    v = strtoull(p, &end, base);
    if (errno == ERANGE)
        *too_big = true;
    if ((flags & OPT_SIZE) && *end && (u = strchr(units, end[0] | 0x20)) != NULL) {
        unsigned shift = 10 * (unsigned)(u - units + 1);

        if (v > (UINT64_MAX >> shift))
            *too_big = true;
        v <<= shift;
        end++;
    }
    if (*end)
        return false;
    *out = v;
    return !*too_big;
}

void opt_format(char *buf, size_t len, uint64_t v, unsigned flags)
{
    unsigned i = 0;

    if (flags & OPT_SIZE)
        while (v && i < sizeof(units) - 1 && (v & 1023) == 0) {
            v >>= 10;
            i++;
        }
    if (i)
        snprintf(buf, len, "%llu%c", (unsigned long long)v, units[i - 1]);
    else
        snprintf(buf, len, "%llu", (unsigned long long)v);
}

bool opt_num(const char *prog, const char *flag, const char *arg, uint64_t lo, uint64_t hi,
             unsigned flags, uint64_t *out)
{
    char los[32], his[32];
    bool negative, too_big;
    uint64_t v = 0;

    if (!parse(arg, flags, &v, &negative, &too_big) && !too_big) {
        fprintf(stderr, "%s: %s: %s is not a %s\n", prog, flag, arg,
                flags & OPT_SIZE ? "size (a number, k, m, g or t after it)" : "number");
        return false;
    }
    if (negative && v == 0)
        negative = false;              /* "-0" */
    if (too_big || negative || v < lo || v > hi) {
        opt_format(los, sizeof(los), lo, flags);
        opt_format(his, sizeof(his), hi, flags);
        fprintf(stderr, "%s: %s: %s is out of range (%s..%s)\n", prog, flag, arg, los, his);
        return false;
    }
    *out = v;
    return true;
}

unsigned opt_list(const char *prog, const char *flag, const char *arg, uint64_t lo, uint64_t hi,
                  unsigned flags, uint64_t *out, unsigned max)
{
    char one[64];
    unsigned n = 0;

    for (const char *p = arg;; p++) {
        size_t len = strcspn(p, ",");

        if (n == max) {
            fprintf(stderr, "%s: %s: %s has more than %u values\n", prog, flag, arg, max);
            return 0;
        }
        if (len >= sizeof(one)) {
            fprintf(stderr, "%s: %s: %.*s is not a number\n", prog, flag, (int)len, p);
            return 0;
        }
        memcpy(one, p, len);
        one[len] = 0;
        if (!opt_num(prog, flag, one, lo, hi, flags, &out[n]))
            return 0;
        n++;
        p += len;
        if (!*p)
            return n;
    }
}

int opt_choice(const char *prog, const char *flag, const char *arg, const char *const *names,
               const char *const *more)
{
    const char *const *lists[2] = {names, more};
    int i = 0;

    for (int l = 0; l < 2; l++)
        for (const char *const *n = lists[l]; n && *n; n++, i++)
            if (strcmp(arg, *n) == 0)
                return i;
    fprintf(stderr, "%s: %s: %s is not one of ", prog, flag, arg);
    i = 0;
    for (int l = 0; l < 2; l++)
        for (const char *const *n = lists[l]; n && *n; n++)
            fprintf(stderr, "%s%s", i++ ? ", " : "", *n);
    fputc('\n', stderr);
    return -1;
}

int opt_usage_error(const char *prog, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* One write: a message split across writes can interleave with
     * another process's on a shared stderr. */
    fprintf(stderr, "%s: %s\nTry '%s --help' for the options.\n", prog, msg, prog);
    return OPT_USAGE;
}

int opt_version(const char *name)
{
    printf("%s tern %s\n", name, TERN_VERSION);
    return 0;
}
