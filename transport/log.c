#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static int log_level = -1;

static int level_from_env(void)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    const char *s = getenv("TERN_LOG");

    if (s)
        for (int i = 0; i < 4; i++)
            if (strcasecmp(s, names[i]) == 0)
                return i;
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

void tern_log(enum tern_log_level level, const char *who, const char *fmt, ...)
{
    static const char tag[] = "EWID";
    char line[512];
    struct timespec ts;
    va_list ap;
    int n;

    if (!tern_log_enabled(level))
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    n = snprintf(line, sizeof(line), "tern %c %ld.%06ld [%d] %s: ", tag[level],
                 (long)ts.tv_sec, ts.tv_nsec / 1000, (int)getpid(), who);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line keeps lines whole when processes share stderr. */
    fprintf(stderr, "%s\n", line);
}
