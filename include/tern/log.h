/* Minimal leveled logging to stderr. The level comes from TERN_LOG
 * (error, warn, info, debug; default warn). Logging is for connection
 * events and errors, never for the per-message data path. */
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

#ifdef __cplusplus
}
#endif

#endif
