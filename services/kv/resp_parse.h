/* RESP2 request parsing for the gateway (resp.c): multibulk commands
 * (`*N\r\n$len\r\n...\r\n`) and inline ones (a line split on blanks).
 *
 * The parser never copies: an argument is an offset and a length from the
 * start of the command in the caller's buffer. It is resumable: when a
 * command is incomplete it keeps the arguments parsed so far, so a large
 * pipelined MSET that arrives in many reads is scanned once, not once per
 * read. Offsets are relative to the command start, so the caller may move
 * the unparsed bytes (compact its buffer) between calls.
 */
#ifndef TERN_RESP_PARSE_H
#define TERN_RESP_PARSE_H

#include <stddef.h>

struct kvs;

/* Longest inline command line, as in Redis. */
#define RESP_INLINE_MAX (64u * 1024)

struct resp_arg {
    size_t off;                 /* from the start of the command */
    size_t len;
};

enum resp_status {
    RESP_MORE = 0,              /* incomplete: call again with more bytes */
    RESP_CMD = 1,               /* a command: argc args, `pos` bytes long */
    RESP_ERROR = -1,            /* protocol error: `error` says what */
    RESP_NOMEM = -2,            /* the argument array could not grow */
};

struct resp_parser {
    size_t max_request;         /* largest command in bytes */
    size_t pos;                 /* bytes of the current command consumed */
    size_t need;                /* RESP_MORE: the command is at least this long */
    long long left;             /* multibulk elements to go; -1 before the header */
    size_t argc;
    size_t argv_cap;
    struct resp_arg *argv;
    const char *error;          /* RESP_ERROR: text after "Protocol error: " */
    char error_buf[48];
};

void resp_parser_init(struct resp_parser *p, size_t max_request);
void resp_parser_free(struct resp_parser *p);

/* Forget the current command (after RESP_CMD, or to start over). */
void resp_parser_reset(struct resp_parser *p);

/* Parse the command that starts at `buf`, of which `len` bytes have arrived.
 * The same bytes must be passed again (possibly moved) on the next call
 * after RESP_MORE. RESP_CMD with argc 0 is an empty command (`*0`, `*-1`,
 * a blank line) that gets no reply. */
enum resp_status resp_parse(struct resp_parser *p, const char *buf, size_t len);

/* Gateway internals, for tests only: the function the gateway commits each
 * batch with (kvs_sync unless a test replaces it to inject a
 * failure). */
extern int (*resp_sync_fn)(struct kvs *s);

/* Serve an already connected, non-blocking stream socket as a client,
 * as if the gateway had accepted it (its fuzz target feeds one end of a
 * socketpair). TERN_ENOBUFS at max_clients, TERN_ENOMEM. */
struct resp_gw;
int resp_gw_adopt(struct resp_gw *gw, int fd);

#endif
