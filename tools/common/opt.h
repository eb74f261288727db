/* Command-line checks shared by tern's tools (rpcbench, ternd, tern): each
 * refuses a bad value with one line on stderr that names the flag and what
 * it accepts, e.g. "ternd: --seg-size: 0 is out of range (64k..1g)", and
 * usage errors end the tool with status 2. */
#ifndef TERN_TOOLS_OPT_H
#define TERN_TOOLS_OPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The exit status of a usage error. */
#define OPT_USAGE 2

/* A size: k, m, g and t suffixes (powers of 1024) are accepted, and the
 * range is shown with them. Without it a number is plain decimal (or 0x
 * hex). */
#define OPT_SIZE 1u

/* Parse `arg`, the value of `flag` (e.g. "--iters"), as a number in
 * [lo, hi]. On failure prints "PROG: FLAG: ARG is out of range (LO..HI)" or
 * "... is not a number" and returns false; *out is then untouched. */
bool opt_num(const char *prog, const char *flag, const char *arg, uint64_t lo, uint64_t hi,
             unsigned flags, uint64_t *out);

/* A comma-separated list of at most `max` numbers, each checked as by
 * opt_num. Returns how many were stored in out[], or 0 after an error. */
unsigned opt_list(const char *prog, const char *flag, const char *arg, uint64_t lo, uint64_t hi,
                  unsigned flags, uint64_t *out, unsigned max);

/* `arg` must be one of `names` or of `more` (each NULL-terminated; `more`
 * may be NULL). Returns its index in the two lists taken end to end, or -1
 * after printing "PROG: FLAG: ARG is not one of a, b, c". */
int opt_choice(const char *prog, const char *flag, const char *arg, const char *const *names,
               const char *const *more);

/* `v` as opt_num shows it: "64k" with OPT_SIZE when it is a whole number of
 * the unit, decimal otherwise. */
void opt_format(char *buf, size_t len, uint64_t v, unsigned flags);

/* "PROG: MESSAGE" and a pointer to PROG --help on stderr; returns OPT_USAGE. */
int opt_usage_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --version: "NAME tern VERSION" on stdout; returns 0. */
int opt_version(const char *name);

#endif
