/* tern_log: one line per call, in one format (log.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static int log_level = -1;
static tern_log_fn log_fn;
static void *log_arg;

int tern_log_level_parse(const char *name)
{
    for (int i = 0; name && i < 4; i++)
        if (strcasecmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

const char *tern_log_level_name(enum tern_log_level level)
{
    return (unsigned)level < 4 ? level_names[level] : "?";
}

/* The level from TERN_LOG; a value that names no level is said, once. */
static int level_from_env(void)
{
    const char *s = getenv("TERN_LOG");
    int l;

    if (!s || !*s)
        return TERN_LOG_WARN;
    l = tern_log_level_parse(s);
    if (l >= 0)
        return l;
    log_level = TERN_LOG_WARN;   /* before the line, which asks for the level */
    tern_log(TERN_LOG_WARN, "log", "TERN_LOG=%.40s is not a level (error, warn, info, debug): "
             "using warn", s);
    return TERN_LOG_WARN;
}

int tern_log_enabled(enum tern_log_level level)
{
    if (log_level < 0)
        log_level = level_from_env();
    return (int)level <= log_level;
}

void tern_log_set_level(enum tern_log_level level)
{
    log_level = (int)level;
}

void tern_log_set_handler(tern_log_fn fn, void *arg)
{
    log_arg = arg;
    log_fn = fn;
}

int tern_log_allow(struct tern_log_limit *st)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    if (ts.tv_sec == st->last_s) {
        st->held++;
        return 0;
    }
    st->last_s = ts.tv_sec;
    return 1;
}

void tern_log_format(char *buf, unsigned len, enum tern_log_level level, const char *who,
                     const char *msg)
{
    struct timespec ts;
    struct tm tm;
    char when[32];

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%06ldZ %-5s [%d] %s: %s", when, ts.tv_nsec / 1000,
             tern_log_level_name(level), (int)getpid(), who, msg);
}

void tern_log(enum tern_log_level level, const char *who, const char *fmt, ...)
{
    char msg[448], line[560];
    va_list ap;

    if (!tern_log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (log_fn) {
        log_fn(level, who, msg, log_arg);
        return;
    }
    tern_log_format(line, sizeof(line), level, who, msg);
    /* One write per line keeps lines whole when processes share stderr. */
    fprintf(stderr, "%s\n", line);
}
