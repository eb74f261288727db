/* Leveled logging, one format for the library and the daemon.
 *
 * A line is "2026-11-26T03:04:05.123456Z warn  [1234] sync: the message":
 * an ISO 8601 UTC time to the microsecond, the level, the process id and
 * the component that speaks. Lines go to stderr, one write each, unless the
 * application installs its own handler (tern_log_set_handler).
 *
 * The level comes from TERN_LOG (error, warn, info, debug; default warn);
 * a value that is none of those is reported once, on the first line logged
 * or the first tern_log_enabled(), and warn is used. Logging is for
 * connection events and errors, never for the per-message data path.
 *
 * Threads: tern_log may be called from any thread. Set the level and the
 * handler before other threads log (they are plain words, read without
 * locks).
 */
#ifndef TERN_LOG_H
#define TERN_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum tern_log_level {
    TERN_LOG_ERROR = 0,
    TERN_LOG_WARN = 1,
    TERN_LOG_INFO = 2,
    TERN_LOG_DEBUG = 3,
};

/* Write one line if `level` is enabled; `who` names the component. */
void tern_log(enum tern_log_level level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* True if messages at `level` are printed. */
int tern_log_enabled(enum tern_log_level level);

/* For messages a peer can trigger at will (refused connections): true at
 * most once a second per `state`, which counts what was held back. A
 * state shared by threads is approximate (a lost count), never unsafe. */
struct tern_log_limit {
    long long last_s;
    unsigned held;
};
int tern_log_allow(struct tern_log_limit *state);

/* Override the level from TERN_LOG (e.g. tests silence expected errors). */
void tern_log_set_level(enum tern_log_level level);

/* The level a name ("error", "warn", "info", "debug", any case) stands
 * for, or -1. */
int tern_log_level_parse(const char *name);

/* The level's name ("error", ...). */
const char *tern_log_level_name(enum tern_log_level level);

/* An application's log sink: called for each enabled line, on the thread
 * that logs, with the component and the message (no time, no newline;
 * valid during the call only). It must not call tern_log itself. */
typedef void (*tern_log_fn)(enum tern_log_level level, const char *who, const char *msg,
                            void *arg);

/* Send lines to fn(arg) instead of stderr; fn NULL: back to stderr. */
void tern_log_set_handler(tern_log_fn fn, void *arg);

/* Format one line as written to stderr, without its newline, into buf
 * (truncated to len). For handlers that want the standard format. */
void tern_log_format(char *buf, unsigned len, enum tern_log_level level, const char *who,
                     const char *msg);

#ifdef __cplusplus
}
#endif

#endif
