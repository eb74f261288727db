/* The RESP2 gateway: see resp.h.
 *
 * One level-triggered epoll set holds the listener and every client. A poll
 * reads each ready client once and runs every complete command in its input
 * buffer, appending the replies to its output buffer. Only when all ready
 * clients are done is the store committed, once for the whole batch, and
 * only then are the replies written: a client never sees "+OK" for a write
 * that a crash could still lose.
 *
 * If that commit fails, the batch's writes must not be acknowledged. Each
 * client records where in its output every successful write reply of the
 * batch lies (a "write mark"); on failure those spans are swapped for an
 * error before anything is sent. Replies to reads stay as they were. This
 * keeps the common path to one store call per command with the reply built
 * on the spot, and confines the rework to the failure.
 *
 * A client that does not read its replies is not served further once
 * max_output (64 MiB) of them wait: its commands stay unread, or read but
 * not run, until the output drains, so one slow reader cannot make the
 * gateway's memory grow without bound. One command cannot either: a reply
 * that grows with the data (GET, MGET, ECHO, PING) is checked against the
 * cap as it is built. If it would take the client's output past the cap,
 * what was built is taken back; the command runs again once the output
 * has drained, and if it still does not fit on its own, the client gets
 * an error instead.
 *
 * Arguments are never copied: they point into the client's input buffer,
 * and keys and values go from there to the store; GET copies a value from
 * the pool straight into the output buffer.
 */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "kv/coll/coll.h"
#include "kv_store.h"
#include "log.h"
#include "resp.h"
#include "resp_internal.h"
#include "resp_parse.h"
#include "rpc.h"
#include "tern_config.h"

#define LOG_WHO "resp"

#define DEFAULT_MAX_CLIENTS 1024u
#define DEFAULT_MAX_REQUEST (64u << 20)
#define MAX_EVENTS 256
#define ACCEPT_BURST 64

#define IN_INITIAL (16u * 1024)
#define MIN_READ 4096u
/* An empty buffer larger than this (grown for one big command or reply)
 * goes back to its initial size so that idle clients stay small. */
#define BUF_KEEP_MAX (1u << 20)
/* Unsent output a client may have (resp_config.max_output). */
#define DEFAULT_MAX_OUTPUT (64u << 20)

int (*resp_sync_fn)(struct kvs *s) = kvs_sync;

/* ---- commands ---- */

static void cmd_ping(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    if (m->argc == 2)
        resp_out_bulk(c, arg(m, 1), arglen(m, 1));
    else
        OUT_LIT(c, "+PONG\r\n");
}

static void cmd_echo(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    resp_out_bulk(c, arg(m, 1), arglen(m, 1));
}

static void cmd_get(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const void *val;
    uint32_t len;
    int rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);

    if (rc == 0)
        resp_out_bulk(c, val, len);      /* now: val is valid only until the next write */
    else if (rc == TERN_ENOENT)
        resp_out_null(c);
    else
        resp_out_store_err(c, rc);
}

static bool set_flag(const struct cmd *m, size_t i)
{
    return arg_is(m, i, "NX") || arg_is(m, i, "XX") || arg_is(m, i, "GET");
}

/* SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL]. With
 * GET the old value is the reply, whether or not NX/XX let the SET
 * happen. */
static void cmd_set(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    bool nx = false, xx = false, get = false, keep, exists;
    const void *old;
    uint32_t old_len;
    uint64_t at, old_at = 0;
    size_t start = resp_out_pending(c);
    bool persist = false;
    int rc;

    for (size_t i = 3; i < m->argc; i++) {
        nx |= arg_is(m, i, "NX");
        xx |= arg_is(m, i, "XX");
        get |= arg_is(m, i, "GET");
        persist |= arg_is(m, i, "PERSIST");     /* GETEX's word, not SET's */
    }
    if (resp_set_deadline(c, m, 3, set_flag, &at, &keep) < 0)
        return;
    if ((nx && xx) || persist) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    if (!resp_key_ok(c, arglen(m, 1)))
        return;
    rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &old, &old_len);
    if (rc < 0 && rc != TERN_ENOENT && (rc != RESP_EWRONGTYPE || get)) {
        resp_out_store_err(c, rc);
        return;
    }
    exists = rc == 0 || rc == RESP_EWRONGTYPE;
    if (get) {
        if (exists)
            resp_out_bulk(c, old, old_len);    /* now: the write may move it */
        else
            resp_out_null(c);
        if (c->dead)
            return;
    }
    if ((nx || xx) && exists == nx) {
        if (!get)
            resp_out_null(c);
        return;
    }
    if (rc == RESP_EWRONGTYPE) {        /* SET overwrites a collection */
        struct kvc_coll *k = resp_coll_find(gw, arg(m, 1), arglen(m, 1));

        old_at = k ? k->deadline : 0;
        rc = resp_coll_drop(gw, arg(m, 1), arglen(m, 1));
        if (rc < 0) {
            resp_out_store_err(c, rc);
            return;
        }
    } else if (keep && exists) {
        kvs_expiry(gw->store, arg(m, 1), arglen(m, 1), &old_at);
    }
    rc = kvs_put_until(gw->store, arg(m, 1), arglen(m, 1), arg(m, 2), arglen(m, 2),
                       keep ? old_at : at, 0, NULL);
    if (rc < 0) {
        c->out.len = c->out.off + start;       /* no old value: nothing was set */
        resp_out_store_err(c, rc);
    } else if (!get) {
        OUT_LIT(c, "+OK\r\n");
    }
}

static void cmd_del(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long n = 0;

    for (size_t i = 1; i < m->argc; i++) {
        uint64_t version;
        int rc;

        if (arglen(m, i) == 0 || arglen(m, i) > KV_KEY_MAX)
            continue;
        rc = kvs_del(gw->store, arg(m, i), arglen(m, i), 0, &version);
        if (rc == TERN_ENOENT && gw->coll) {
            struct kvc_coll *k = resp_coll_find(gw, arg(m, i), arglen(m, i));

            rc = k ? kvc_delete(gw->coll, k) : TERN_ENOENT;
        }
        if (rc == 0) {
            n++;
        } else if (rc != TERN_ENOENT) {
            resp_out_store_err(c, rc);
            return;
        }
    }
    resp_out_num(c, ':', n);
}

static void cmd_exists(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long n = 0;

    for (size_t i = 1; i < m->argc; i++) {
        const void *val;
        uint32_t len;
        int rc = resp_lookup(gw, arg(m, i), arglen(m, i), &val, &len);

        if (rc == 0 || rc == RESP_EWRONGTYPE) {
            n++;
        } else if (rc != TERN_ENOENT) {
            resp_out_store_err(c, rc);
            return;
        }
    }
    resp_out_num(c, ':', n);
}

/* Any failure to read a key shows as a missing one: an array has no room
 * for a per-key error that clients would understand. */
static void cmd_mget(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    resp_out_num(c, '*', (long long)(m->argc - 1));
    for (size_t i = 1; i < m->argc && !c->over; i++) {
        const void *val;
        uint32_t len;

        if (resp_lookup(gw, arg(m, i), arglen(m, i), &val, &len) == 0)
            resp_out_bulk(c, val, len);
        else
            resp_out_null(c);
    }
}

/* Redis's MSET is all or nothing. Every size is checked before the first
 * write, so the only failure left midway is a full pool, which leaves the
 * pairs before it written. */
static void cmd_mset(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    if (m->argc % 2 == 0) {
        OUT_LIT(c, "-ERR wrong number of arguments for 'mset' command\r\n");
        return;
    }
    for (size_t i = 1; i < m->argc; i += 2) {
        if (!resp_key_ok(c, arglen(m, i)))
            return;
        if (arglen(m, i + 1) > kvs_val_max(gw->store, arglen(m, i))) {
            resp_out_store_err(c, TERN_E2BIG);
            return;
        }
    }
    for (size_t i = 1; i < m->argc; i += 2) {
        int rc = resp_coll_drop(gw, arg(m, i), arglen(m, i));

        if (rc == 0)
            rc = kvs_put(gw->store, arg(m, i), arglen(m, i), arg(m, i + 1), arglen(m, i + 1), 0,
                         NULL);

        if (rc < 0) {
            resp_out_store_err(c, rc);
            return;
        }
    }
    OUT_LIT(c, "+OK\r\n");
}

static void incr_by(struct resp_gw *gw, struct client *c, const struct cmd *m,
                    long long delta)
{
    const void *val;
    uint32_t len;
    long long cur = 0;
    uint64_t at = 0;
    char text[24];
    int rc;

    if (!resp_key_ok(c, arglen(m, 1)))
        return;
    rc = resp_lookup(gw, arg(m, 1), arglen(m, 1), &val, &len);
    if (rc == 0 && !resp_ll_parse(val, len, &cur)) {
        OUT_LIT(c, "-ERR value is not an integer or out of range\r\n");
        return;
    }
    if (rc < 0 && rc != TERN_ENOENT) {
        resp_out_store_err(c, rc);
        return;
    }
    if ((delta > 0 && cur > LLONG_MAX - delta) || (delta < 0 && cur < LLONG_MIN - delta)) {
        OUT_LIT(c, "-ERR increment or decrement would overflow\r\n");
        return;
    }
    cur += delta;
    if (rc == 0)                /* the deadline stays, as in Redis */
        kvs_expiry(gw->store, arg(m, 1), arglen(m, 1), &at);
    rc = kvs_put_until(gw->store, arg(m, 1), arglen(m, 1), text, resp_ll_text(text, cur), at,
                       0, NULL);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        resp_out_num(c, ':', cur);
}

static void cmd_incr(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    incr_by(gw, c, m, 1);
}

static void cmd_decr(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    incr_by(gw, c, m, -1);
}

static void cmd_incrby(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long delta;

    if (!resp_ll_parse(arg(m, 2), arglen(m, 2), &delta)) {
        OUT_LIT(c, "-ERR value is not an integer or out of range\r\n");
        return;
    }
    incr_by(gw, c, m, delta);
}

static void cmd_decrby(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long delta;

    if (!resp_ll_parse(arg(m, 2), arglen(m, 2), &delta)) {
        OUT_LIT(c, "-ERR value is not an integer or out of range\r\n");
        return;
    }
    if (delta == LLONG_MIN) {
        OUT_LIT(c, "-ERR decrement would overflow\r\n");
        return;
    }
    incr_by(gw, c, m, -delta);
}

static void cmd_dbsize(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    resp_out_num(c, ':', (long long)(kvs_count(gw->store) + (gw->coll ? kvc_count(gw->coll) : 0)));
}

/* FLUSHDB and FLUSHALL [ASYNC|SYNC]: one database, cleared at once. */
static void cmd_flush(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    int rc;

    if (m->argc == 2 && !arg_is(m, 1, "ASYNC") && !arg_is(m, 1, "SYNC")) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    rc = kvs_clear(gw->store, 0);
    if (rc == 0 && gw->coll)
        rc = kvc_clear(gw->coll);
    if (rc < 0)
        resp_out_store_err(c, rc);
    else
        OUT_LIT(c, "+OK\r\n");
}

static void cmd_select(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    long long db;

    if (!resp_ll_parse(arg(m, 1), arglen(m, 1), &db))
        OUT_LIT(c, "-ERR value is not an integer or out of range\r\n");
    else if (db != 0)
        OUT_LIT(c, "-ERR DB index is out of range\r\n");
    else
        OUT_LIT(c, "+OK\r\n");
}

static void cmd_quit(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    OUT_LIT(c, "+OK\r\n");
    c->closing = true;
}

static void touch(struct resp_gw *gw, struct client *c);

/* One line of CLIENT LIST / CLIENT INFO, with Redis's field names where
 * they mean the same (tern keeps no per-client memory figures beyond its
 * buffers, and has one database). */
static void client_line(FILE *f, const struct client *k, time_t now)
{
    fprintf(f, "id=%llu addr=%s fd=%d name=%s age=%lld idle=%lld flags=N db=0 sub=0 psub=0 "
             "multi=-1 qbuf=%zu qbuf-free=%zu obl=0 oll=0 omem=%zu events=r%s cmd=%s\n",
             (unsigned long long)k->id, k->addr, k->fd, k->name, (long long)(now - k->since),
             (long long)(now - k->last), k->in.len - k->in.off, k->in.cap - k->in.len,
             k->out.len - k->out.off, k->out.len > k->out.off ? "w" : "",
             k->cmd ? k->cmd : "NULL");
}

/* Names Redis accepts: printable, without blanks. */
static bool name_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '!' || s[i] > '~')
            return false;
    return true;
}

static void client_list(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    time_t now = time(NULL);
    size_t first_id = 0, len = 0;
    char *text = NULL;
    FILE *f;

    if (m->argc == 4 && arg_is(m, 2, "TYPE")) {
        if (!arg_is(m, 3, "normal") && !arg_is(m, 3, "master") && !arg_is(m, 3, "replica") &&
            !arg_is(m, 3, "pubsub")) {
            resp_out_err(c, "ERR Unknown client type '%.*s'",
                    (int)(arglen(m, 3) < 64 ? arglen(m, 3) : 64), arg(m, 3));
            return;
        }
        if (!arg_is(m, 3, "normal")) {
            OUT_LIT(c, "$0\r\n\r\n");    /* tern has clients of no other type */
            return;
        }
    } else if (m->argc > 3 && arg_is(m, 2, "ID")) {
        first_id = 3;
        for (size_t a = 3; a < m->argc; a++) {
            long long id;

            if (!resp_ll_parse(arg(m, a), arglen(m, a), &id) || id <= 0) {
                OUT_LIT(c, "-ERR Invalid client ID\r\n");
                return;
            }
        }
    } else if (m->argc > 2) {
        OUT_LIT(c, "-ERR syntax error\r\n");
        return;
    }
    if (!(f = open_memstream(&text, &len))) {
        resp_out_store_err(c, TERN_ENOMEM);
        return;
    }
    for (const struct client *k = gw->clients; k; k = k->next) {
        bool want = !first_id;

        for (size_t a = first_id; first_id && a < m->argc && !want; a++) {
            long long id = 0;

            resp_ll_parse(arg(m, a), arglen(m, a), &id);
            want = (uint64_t)id == k->id;
        }
        if (want)
            client_line(f, k, now);
    }
    if (fclose(f) == 0)
        resp_out_bulk(c, text, len);
    else
        resp_out_store_err(c, TERN_ENOMEM);
    free(text);
}

/* CLIENT KILL ID n | ADDR ip:port | SKIPME yes|no ...; or the old form
 * CLIENT KILL ip:port (+OK). The killed close once this poll is over. */
static void client_kill(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const char *addr = NULL;
    size_t addr_len = 0;
    long long id = 0, n = 0;
    bool old = m->argc == 3, skipme = true;

    if (old) {
        addr = arg(m, 2);
        addr_len = arglen(m, 2);
    } else {
        if (m->argc % 2 == 1) {
            OUT_LIT(c, "-ERR syntax error\r\n");
            return;
        }
        for (size_t a = 2; a + 1 < m->argc; a += 2) {
            if (arg_is(m, a, "ID")) {
                if (!resp_ll_parse(arg(m, a + 1), arglen(m, a + 1), &id) || id <= 0) {
                    OUT_LIT(c, "-ERR client-id should be greater than 0\r\n");
                    return;
                }
            } else if (arg_is(m, a, "ADDR")) {
                addr = arg(m, a + 1);
                addr_len = arglen(m, a + 1);
            } else if (arg_is(m, a, "SKIPME")) {
                if (arg_is(m, a + 1, "yes")) {
                    skipme = true;
                } else if (arg_is(m, a + 1, "no")) {
                    skipme = false;
                } else {
                    OUT_LIT(c, "-ERR syntax error\r\n");
                    return;
                }
            } else if (arg_is(m, a, "TYPE") || arg_is(m, a, "USER") || arg_is(m, a, "LADDR") ||
                       arg_is(m, a, "MAXAGE")) {
                resp_out_err(c, "ERR CLIENT KILL %.*s is not supported by tern",
                        (int)arglen(m, a), arg(m, a));
                return;
            } else {
                OUT_LIT(c, "-ERR syntax error\r\n");
                return;
            }
        }
    }
    for (struct client *k = gw->clients; k; k = k->next) {
        if (id && k->id != (uint64_t)id)
            continue;
        if (addr && (strlen(k->addr) != addr_len || memcmp(k->addr, addr, addr_len)))
            continue;
        if (k == c && skipme && !old)
            continue;
        k->closing = true;      /* after what it was owed is sent */
        touch(gw, k);           /* flushed, and so closed, at the end of this poll */
        n++;
    }
    if (old && !n)
        OUT_LIT(c, "-ERR No such client\r\n");
    else if (old)
        OUT_LIT(c, "+OK\r\n");
    else
        resp_out_num(c, ':', n);
}

static const char *const client_help[] = {
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GETNAME", "    Return the name of the current connection.",
    "ID", "    Return the ID of the current connection.",
    "INFO", "    Return information about the current client connection.",
    "KILL <ip:port> | KILL ID <id> | KILL ADDR <ip:port> [SKIPME yes|no]",
    "    Kill connections.",
    "LIST [TYPE normal] [ID <id> ...]", "    Return information about client connections.",
    "SETNAME <name>", "    Assign the name <name> to the current connection.",
    "SETINFO LIB-NAME|LIB-VER <value>", "    Accepted and ignored.",
    "HELP", "    Print this help.",
};

static void cmd_client(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    if (arg_is(m, 1, "ID") && m->argc == 2) {
        resp_out_num(c, ':', (long long)c->id);
    } else if (arg_is(m, 1, "GETNAME") && m->argc == 2) {
        if (c->name[0])
            resp_out_bulk(c, c->name, strlen(c->name));
        else
            resp_out_null(c);
    } else if (arg_is(m, 1, "SETNAME") && m->argc == 3) {
        if (!name_ok(arg(m, 2), arglen(m, 2)))
            OUT_LIT(c, "-ERR Client names cannot contain spaces, newlines or special "
                       "characters.\r\n");
        else if (arglen(m, 2) >= sizeof(c->name))
            resp_out_err(c, "ERR Client names are limited to %zu bytes in tern", sizeof(c->name) - 1);
        else {
            memcpy(c->name, arg(m, 2), arglen(m, 2));
            c->name[arglen(m, 2)] = '\0';
            OUT_LIT(c, "+OK\r\n");
        }
    } else if (arg_is(m, 1, "LIST")) {
        client_list(gw, c, m);
    } else if (arg_is(m, 1, "INFO") && m->argc == 2) {
        char line[512];
        FILE *f = fmemopen(line, sizeof(line), "w");
        long n;

        if (!f) {
            resp_out_store_err(c, TERN_ENOMEM);
            return;
        }
        client_line(f, c, time(NULL));
        n = ftell(f);
        fclose(f);
        resp_out_bulk(c, line, n > 0 ? (size_t)n : 0);
    } else if (arg_is(m, 1, "KILL") && m->argc >= 3) {
        client_kill(gw, c, m);
    } else if (arg_is(m, 1, "SETINFO") && m->argc == 4 &&
               (arg_is(m, 2, "LIB-NAME") || arg_is(m, 2, "LIB-VER"))) {
        OUT_LIT(c, "+OK\r\n");     /* clients send it on connect; nothing uses it */
    } else if (arg_is(m, 1, "HELP") && m->argc == 2) {
        resp_out_lines(c, client_help, sizeof(client_help) / sizeof(client_help[0]));
    } else {
        resp_out_err(c, "ERR unknown subcommand or wrong number of arguments for '%.*s'. Try "
                "CLIENT HELP.", (int)(arglen(m, 1) < 64 ? arglen(m, 1) : 64), arg(m, 1));
    }
}

static void cmd_command(struct resp_gw *gw, struct client *c, const struct cmd *m);
static void cmd_hello(struct resp_gw *gw, struct client *c, const struct cmd *m);
static void reply_unknown(struct client *c, const struct cmd *m);

enum {
    CMD_WRITE = 1,
    CMD_BIG = 2,                /* the reply grows with the data: held to max_output */
    CMD_NOAUTH = 4,             /* runs before AUTH when a password is set */
};

struct command {
    const char *name;           /* lower case, as Redis quotes it in errors */
    size_t len;
    size_t min_args, max_args;  /* including the name; max 0 = no limit */
    unsigned flags;
    cmd_fn run;
    /* What COMMAND reports: the keys' positions (first, last: -1 = the
     * last argument, step), Redis's group and a summary (COMMAND DOCS). */
    int first_key, last_key, key_step;
    const char *group, *summary;
};

#define CMD(name, min, max, flags, fn, first, last, step, group, summary)                  \
    {name, sizeof(name) - 1, min, max, flags, fn, first, last, step, group, summary}

static const struct command commands[] = {
    CMD("get", 2, 2, CMD_BIG, cmd_get, 1, 1, 1, "string", "Returns the string value of a key."),
    CMD("set", 3, 0, CMD_WRITE, cmd_set, 1, 1, 1, "string",
        "Sets the string value of a key (NX, XX, GET)."),
    CMD("ping", 1, 2, CMD_BIG, cmd_ping, 0, 0, 0, "connection", "Returns the server's liveliness response."),
    CMD("incr", 2, 2, CMD_WRITE, cmd_incr, 1, 1, 1, "string",
        "Increments the integer value of a key by one."),
    CMD("mget", 2, 0, CMD_BIG, cmd_mget, 1, -1, 1, "string",
        "Atomically returns the string values of one or more keys."),
    CMD("mset", 3, 0, CMD_WRITE, cmd_mset, 1, -1, 2, "string",
        "Atomically creates or modifies the string values of one or more keys."),
    CMD("del", 2, 0, CMD_WRITE, cmd_del, 1, -1, 1, "generic", "Deletes one or more keys."),
    CMD("exists", 2, 0, 0, cmd_exists, 1, -1, 1, "generic", "Determines whether one or more keys exist."),
    CMD("echo", 2, 2, CMD_BIG, cmd_echo, 0, 0, 0, "connection", "Returns the given string."),
    CMD("decr", 2, 2, CMD_WRITE, cmd_decr, 1, 1, 1, "string",
        "Decrements the integer value of a key by one."),
    CMD("incrby", 3, 3, CMD_WRITE, cmd_incrby, 1, 1, 1, "string",
        "Increments the integer value of a key by a number."),
    CMD("decrby", 3, 3, CMD_WRITE, cmd_decrby, 1, 1, 1, "string",
        "Decrements a number from the integer value of a key."),
    CMD("dbsize", 1, 1, 0, cmd_dbsize, 0, 0, 0, "server", "Returns the number of keys in the database."),
    CMD("flushdb", 1, 2, CMD_WRITE, cmd_flush, 0, 0, 0, "server", "Removes all keys from the database."),
    CMD("flushall", 1, 2, CMD_WRITE, cmd_flush, 0, 0, 0, "server",
        "Removes all keys from the database (tern has one)."),
    CMD("info", 1, 0, 0, resp_cmd_info, 0, 0, 0, "server",
        "Returns information and statistics about the server."),
    CMD("command", 1, 0, 0, cmd_command, 0, 0, 0, "server",
        "Returns detailed information about the commands served."),
    CMD("config", 2, 0, 0, resp_cmd_config, 0, 0, 0, "server", "Reads the settings that exist."),
    CMD("select", 2, 2, 0, cmd_select, 0, 0, 0, "connection", "Selects database 0, the only one."),
    CMD("client", 2, 0, 0, cmd_client, 0, 0, 0, "connection", "Manages client connections."),
    CMD("hello", 1, 0, CMD_NOAUTH, cmd_hello, 0, 0, 0, "connection",
        "Handshakes with the server (RESP2 only)."),
    CMD("quit", 1, 0, CMD_NOAUTH, cmd_quit, 0, 0, 0, "connection", "Closes the connection."),
    CMD("auth", 2, 3, CMD_NOAUTH, resp_cmd_auth, 0, 0, 0, "connection",
        "Authenticates the connection."),
    CMD("slowlog", 2, 3, 0, resp_cmd_slowlog, 0, 0, 0, "server",
        "Reads or resets the log of slow commands."),
    CMD("monitor", 1, 1, 0, resp_cmd_monitor, 0, 0, 0, "server",
        "Refused: tern does not copy every command to a client."),
    CMD("expire", 3, 0, CMD_WRITE, resp_cmd_expire, 1, 1, 1, "generic",
        "Sets the expiration time of a key in seconds."),
    CMD("pexpire", 3, 0, CMD_WRITE, resp_cmd_expire, 1, 1, 1, "generic",
        "Sets the expiration time of a key in milliseconds."),
    CMD("expireat", 3, 0, CMD_WRITE, resp_cmd_expire, 1, 1, 1, "generic",
        "Sets the expiration time of a key to a Unix timestamp."),
    CMD("pexpireat", 3, 0, CMD_WRITE, resp_cmd_expire, 1, 1, 1, "generic",
        "Sets the expiration time of a key to a Unix milliseconds timestamp."),
    CMD("ttl", 2, 2, 0, resp_cmd_ttl, 1, 1, 1, "generic",
        "Returns the expiration time in seconds of a key."),
    CMD("pttl", 2, 2, 0, resp_cmd_ttl, 1, 1, 1, "generic",
        "Returns the expiration time in milliseconds of a key."),
    CMD("persist", 2, 2, CMD_WRITE, resp_cmd_persist, 1, 1, 1, "generic",
        "Removes the expiration time of a key."),
    CMD("setex", 4, 4, CMD_WRITE, resp_cmd_setex, 1, 1, 1, "string",
        "Sets the string value and expiration time of a key."),
    CMD("psetex", 4, 4, CMD_WRITE, resp_cmd_setex, 1, 1, 1, "string",
        "Sets both string value and expiration time in milliseconds of a key."),
    CMD("getex", 2, 4, CMD_WRITE | CMD_BIG, resp_cmd_getex, 1, 1, 1, "string",
        "Returns the string value of a key after setting its expiration time."),
    CMD("getdel", 2, 2, CMD_WRITE | CMD_BIG, resp_cmd_getdel, 1, 1, 1, "string",
        "Returns the string value of a key after deleting the key."),
    CMD("type", 2, 2, 0, resp_cmd_type, 1, 1, 1, "generic", "Determines the type of value stored at a key."),
    CMD("unlink", 2, 0, CMD_WRITE, cmd_del, 1, -1, 1, "generic",
        "Deletes one or more keys (at once: there is nothing to free later)."),
    CMD("scan", 2, 8, CMD_BIG, resp_cmd_scan, 0, 0, 0, "generic",
        "Iterates over the key names in the database."),
    CMD("keys", 2, 2, CMD_BIG, resp_cmd_keys, 0, 0, 0, "generic",
        "Returns all key names that match a pattern."),
    CMD("randomkey", 1, 1, 0, resp_cmd_randomkey, 0, 0, 0, "generic",
        "Returns a random key name from the database."),
    CMD("rename", 3, 3, CMD_WRITE, resp_cmd_rename, 1, 2, 1, "generic", "Renames a key and overwrites the destination."),
    CMD("renamenx", 3, 3, CMD_WRITE, resp_cmd_rename, 1, 2, 1, "generic",
        "Renames a key only when the target key name doesn't exist."),
    CMD("append", 3, 3, CMD_WRITE, resp_cmd_append, 1, 1, 1, "string",
        "Appends a string to the value of a key. Creates the key if it doesn't exist."),
    CMD("strlen", 2, 2, 0, resp_cmd_strlen, 1, 1, 1, "string", "Returns the length of a string value."),
    CMD("getrange", 4, 4, CMD_BIG, resp_cmd_getrange, 1, 1, 1, "string",
        "Returns a substring of the string stored at a key."),
    CMD("setrange", 4, 4, CMD_WRITE, resp_cmd_setrange, 1, 1, 1, "string",
        "Overwrites a part of a string value with another by an offset."),
    CMD("msetnx", 3, 0, CMD_WRITE, resp_cmd_msetnx, 1, -1, 2, "string",
        "Modifies the string values of one or more keys only when all keys don't exist."),    CMD("lpush", 3, 0, CMD_WRITE, resp_cmd_lpush, 1, 1, 1, "list",
        "Prepends one or more elements to a list. Creates the key if it doesn't exist."),
    CMD("rpush", 3, 0, CMD_WRITE, resp_cmd_lpush, 1, 1, 1, "list",
        "Appends one or more elements to a list. Creates the key if it doesn't exist."),
    CMD("lpushx", 3, 0, CMD_WRITE, resp_cmd_lpushx, 1, 1, 1, "list",
        "Prepends one or more elements to a list only when the list exists."),
    CMD("rpushx", 3, 0, CMD_WRITE, resp_cmd_lpushx, 1, 1, 1, "list",
        "Appends one or more elements to a list only when the list exists."),
    CMD("lpop", 2, 3, CMD_WRITE | CMD_BIG, resp_cmd_lpop, 1, 1, 1, "list",
        "Returns the first elements in a list after removing it. Deletes the list if the last element was popped."),
    CMD("rpop", 2, 3, CMD_WRITE | CMD_BIG, resp_cmd_lpop, 1, 1, 1, "list",
        "Returns and removes the last elements of a list. Deletes the list if the last element was popped."),
    CMD("llen", 2, 2, 0, resp_cmd_llen, 1, 1, 1, "list",
        "Returns the length of a list."),
    CMD("lrange", 4, 4, CMD_BIG, resp_cmd_lrange, 1, 1, 1, "list",
        "Returns a range of elements from a list."),
    CMD("lindex", 3, 3, CMD_BIG, resp_cmd_lindex, 1, 1, 1, "list",
        "Returns an element from a list by its index."),
    CMD("lset", 4, 4, CMD_WRITE, resp_cmd_lset, 1, 1, 1, "list",
        "Sets the value of an element in a list by its index."),
    CMD("ltrim", 4, 4, CMD_WRITE, resp_cmd_ltrim, 1, 1, 1, "list",
        "Removes elements from both ends a list. Deletes the list if all elements were trimmed."),
    CMD("lrem", 4, 4, CMD_WRITE, resp_cmd_lrem, 1, 1, 1, "list",
        "Removes elements from a list. Deletes the list if the last element was removed."),
    CMD("linsert", 5, 5, CMD_WRITE, resp_cmd_linsert, 1, 1, 1, "list",
        "Inserts an element before or after another element in a list."),
    CMD("lmove", 5, 5, CMD_WRITE | CMD_BIG, resp_cmd_lmove, 1, 2, 1, "list",
        "Returns an element after popping it from one list and pushing it to another. Deletes the list if the last element was moved."),
    CMD("rpoplpush", 3, 3, CMD_WRITE | CMD_BIG, resp_cmd_rpoplpush, 1, 2, 1, "list",
        "Returns the last element of a list after removing and pushing it to another list. Deletes the list if the last element was popped."),
    CMD("hset", 4, 0, CMD_WRITE, resp_cmd_hset, 1, 1, 1, "hash",
        "Creates or modifies the value of a field in a hash."),
    CMD("hmset", 4, 0, CMD_WRITE, resp_cmd_hset, 1, 1, 1, "hash",
        "Sets the values of multiple fields."),
    CMD("hsetnx", 4, 4, CMD_WRITE, resp_cmd_hsetnx, 1, 1, 1, "hash",
        "Sets the value of a field in a hash only when the field doesn't exist."),
    CMD("hget", 3, 3, CMD_BIG, resp_cmd_hget, 1, 1, 1, "hash",
        "Returns the value of a field in a hash."),
    CMD("hmget", 3, 0, CMD_BIG, resp_cmd_hmget, 1, 1, 1, "hash",
        "Returns the values of all fields in a hash."),
    CMD("hdel", 3, 0, CMD_WRITE, resp_cmd_hdel, 1, 1, 1, "hash",
        "Deletes one or more fields and their values from a hash. Deletes the hash if no fields remain."),
    CMD("hlen", 2, 2, 0, resp_cmd_hlen, 1, 1, 1, "hash",
        "Returns the number of fields in a hash."),
    CMD("hexists", 3, 3, 0, resp_cmd_hexists, 1, 1, 1, "hash",
        "Determines whether a field exists in a hash."),
    CMD("hgetall", 2, 2, CMD_BIG, resp_cmd_hgetall, 1, 1, 1, "hash",
        "Returns all fields and values in a hash."),
    CMD("hkeys", 2, 2, CMD_BIG, resp_cmd_hgetall, 1, 1, 1, "hash",
        "Returns all fields in a hash."),
    CMD("hvals", 2, 2, CMD_BIG, resp_cmd_hgetall, 1, 1, 1, "hash",
        "Returns all values in a hash."),
    CMD("hincrby", 4, 4, CMD_WRITE, resp_cmd_hincrby, 1, 1, 1, "hash",
        "Increments the integer value of a field in a hash by a number. Uses 0 as initial value if the field doesn't exist."),
    CMD("hincrbyfloat", 4, 4, CMD_WRITE, resp_cmd_hincrbyfloat, 1, 1, 1, "hash",
        "Increments the floating point value of a field by a number. Uses 0 as initial value if the field doesn't exist."),
    CMD("hstrlen", 3, 3, 0, resp_cmd_hstrlen, 1, 1, 1, "hash",
        "Returns the length of the value of a field."),
    CMD("hscan", 3, 7, CMD_BIG, resp_cmd_hscan, 1, 1, 1, "hash",
        "Iterates over fields and values of a hash."),
    CMD("sadd", 3, 0, CMD_WRITE, resp_cmd_sadd, 1, 1, 1, "set",
        "Adds one or more members to a set. Creates the key if it doesn't exist."),
    CMD("srem", 3, 0, CMD_WRITE, resp_cmd_srem, 1, 1, 1, "set",
        "Removes one or more members from a set. Deletes the set if the last member was removed."),
    CMD("sismember", 3, 3, 0, resp_cmd_sismember, 1, 1, 1, "set",
        "Determines whether a member belongs to a set."),
    CMD("smismember", 3, 0, 0, resp_cmd_smismember, 1, 1, 1, "set",
        "Determines whether multiple members belong to a set."),
    CMD("scard", 2, 2, 0, resp_cmd_scard, 1, 1, 1, "set",
        "Returns the number of members in a set."),
    CMD("smembers", 2, 2, CMD_BIG, resp_cmd_smembers, 1, 1, 1, "set",
        "Returns all members of a set."),
    CMD("spop", 2, 3, CMD_WRITE | CMD_BIG, resp_cmd_spop, 1, 1, 1, "set",
        "Returns one or more random members from a set after removing them. Deletes the set if the last member was popped."),
    CMD("srandmember", 2, 3, CMD_BIG, resp_cmd_srandmember, 1, 1, 1, "set",
        "Get one or multiple random members from a set"),
    CMD("sscan", 3, 7, CMD_BIG, resp_cmd_sscan, 1, 1, 1, "set",
        "Iterates over members of a set."),
    CMD("smove", 4, 4, CMD_WRITE, resp_cmd_smove, 1, 2, 1, "set",
        "Moves a member from one set to another."),
    CMD("sinter", 2, 0, CMD_BIG, resp_cmd_sinter, 1, -1, 1, "set",
        "Returns the intersect of multiple sets."),
    CMD("sunion", 2, 0, CMD_BIG, resp_cmd_sinter, 1, -1, 1, "set",
        "Returns the union of multiple sets."),
    CMD("sdiff", 2, 0, CMD_BIG, resp_cmd_sinter, 1, -1, 1, "set",
        "Returns the difference of multiple sets."),
    CMD("sinterstore", 3, 0, CMD_WRITE, resp_cmd_sinterstore, 1, -1, 1, "set",
        "Stores the intersect of multiple sets in a key."),
    CMD("sunionstore", 3, 0, CMD_WRITE, resp_cmd_sinterstore, 1, -1, 1, "set",
        "Stores the union of multiple sets in a key."),
    CMD("sdiffstore", 3, 0, CMD_WRITE, resp_cmd_sinterstore, 1, -1, 1, "set",
        "Stores the difference of multiple sets in a key."),
    CMD("zadd", 4, 0, CMD_WRITE, resp_cmd_zadd, 1, 1, 1, "sorted-set",
        "Adds one or more members to a sorted set, or updates their scores. Creates the key if it doesn't exist."),
    CMD("zincrby", 4, 4, CMD_WRITE, resp_cmd_zincrby, 1, 1, 1, "sorted-set",
        "Increments the score of a member in a sorted set."),
    CMD("zscore", 3, 3, 0, resp_cmd_zscore, 1, 1, 1, "sorted-set",
        "Returns the score of a member in a sorted set."),
    CMD("zmscore", 3, 0, 0, resp_cmd_zmscore, 1, 1, 1, "sorted-set",
        "Returns the score of one or more members in a sorted set."),
    CMD("zcard", 2, 2, 0, resp_cmd_zcard, 1, 1, 1, "sorted-set",
        "Returns the number of members in a sorted set."),
    CMD("zrem", 3, 0, CMD_WRITE, resp_cmd_zrem, 1, 1, 1, "sorted-set",
        "Removes one or more members from a sorted set. Deletes the sorted set if all members were removed."),
    CMD("zrank", 3, 3, 0, resp_cmd_zrank, 1, 1, 1, "sorted-set",
        "Returns the index of a member in a sorted set ordered by ascending scores."),
    CMD("zrevrank", 3, 3, 0, resp_cmd_zrank, 1, 1, 1, "sorted-set",
        "Returns the index of a member in a sorted set ordered by descending scores."),
    CMD("zcount", 4, 4, 0, resp_cmd_zcount, 1, 1, 1, "sorted-set",
        "Returns the count of members in a sorted set that have scores within a range."),
    CMD("zrange", 4, 0, CMD_BIG, resp_cmd_zrange, 1, 1, 1, "sorted-set",
        "Returns members in a sorted set within a range of indexes."),
    CMD("zrevrange", 4, 5, CMD_BIG, resp_cmd_zrange, 1, 1, 1, "sorted-set",
        "Returns members in a sorted set within a range of indexes in reverse order."),
    CMD("zrangebyscore", 4, 0, CMD_BIG, resp_cmd_zrange, 1, 1, 1, "sorted-set",
        "Returns members in a sorted set within a range of scores."),
    CMD("zrevrangebyscore", 4, 0, CMD_BIG, resp_cmd_zrange, 1, 1, 1, "sorted-set",
        "Returns members in a sorted set within a range of scores in reverse order."),
    CMD("zpopmin", 2, 3, CMD_WRITE | CMD_BIG, resp_cmd_zpopmin, 1, 1, 1, "sorted-set",
        "Returns the lowest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped."),
    CMD("zpopmax", 2, 3, CMD_WRITE | CMD_BIG, resp_cmd_zpopmin, 1, 1, 1, "sorted-set",
        "Returns the highest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped."),
    CMD("zscan", 3, 7, CMD_BIG, resp_cmd_zscan, 1, 1, 1, "sorted-set",
        "Iterates over members and scores of a sorted set."),
    CMD("zremrangebyrank", 4, 4, CMD_WRITE, resp_cmd_zremrangebyrank, 1, 1, 1, "sorted-set",
        "Removes members in a sorted set within a range of indexes. Deletes the sorted set if all members were removed."),
    CMD("zremrangebyscore", 4, 4, CMD_WRITE, resp_cmd_zremrangebyscore, 1, 1, 1, "sorted-set",
        "Removes members in a sorted set within a range of scores. Deletes the sorted set if all members were removed."),
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

/* Redis's arity: the argument count with the name, negative for "at
 * least". */
static long long arity_of(const struct command *k)
{
    return k->max_args == k->min_args ? (long long)k->min_args : -(long long)k->min_args;
}

/* One entry of COMMAND / COMMAND INFO, as Redis 7 lays it out: name,
 * arity, flags, first key, last key, step, ACL categories, tips, key
 * specifications (none given), subcommands (none). */
static void command_entry(struct client *c, const struct command *k)
{
    bool admin = !strcmp(k->group, "server") || !strcmp(k->group, "connection");

    resp_out_num(c, '*', 10);
    resp_out_str(c, k->name);
    resp_out_num(c, ':', arity_of(k));
    if (k->flags & CMD_WRITE) {
        OUT_LIT(c, "*2\r\n+write\r\n+denyoom\r\n");
    } else if (admin) {
        OUT_LIT(c, "*2\r\n+loading\r\n+stale\r\n");
    } else {
        OUT_LIT(c, "*2\r\n+readonly\r\n+fast\r\n");
    }
    resp_out_num(c, ':', k->first_key);
    resp_out_num(c, ':', k->last_key);
    resp_out_num(c, ':', k->key_step);
    resp_out_num(c, '*', 1);
    if (k->flags & CMD_WRITE)
        OUT_LIT(c, "+@write\r\n");
    else if (admin)
        OUT_LIT(c, "+@admin\r\n");
    else
        OUT_LIT(c, "+@read\r\n");
    OUT_LIT(c, "*0\r\n*0\r\n*0\r\n");
}

static const struct command *command_named(const char *s, size_t n)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (n == commands[i].len && strncasecmp(s, commands[i].name, n) == 0)
            return &commands[i];
    return NULL;
}

static const char *const command_help[] = {
    "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "(no subcommand)", "    Return details about all commands served.",
    "COUNT", "    Return the number of commands served.",
    "INFO [<command-name> ...]", "    Return details about the named (or all) commands.",
    "DOCS [<command-name> ...]", "    Return the summary and group of the named (or all) commands.",
    "LIST", "    Return the names of the commands served.",
    "HELP", "    Print this help.",
};

/* What is served, and only that: COMMAND, COUNT, INFO, DOCS, LIST. */
static void cmd_command(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    if (m->argc == 1 || arg_is(m, 1, "INFO")) {
        size_t n = m->argc <= 2 ? N_COMMANDS : m->argc - 2;

        resp_out_num(c, '*', (long long)n);
        for (size_t i = 0; i < n; i++) {
            const struct command *k =
                m->argc <= 2 ? &commands[i] : command_named(arg(m, i + 2), arglen(m, i + 2));

            if (k)
                command_entry(c, k);
            else
                OUT_LIT(c, "*-1\r\n");
        }
    } else if (arg_is(m, 1, "COUNT") && m->argc == 2) {
        resp_out_num(c, ':', (long long)N_COMMANDS);
    } else if (arg_is(m, 1, "LIST") && m->argc == 2) {
        resp_out_num(c, '*', (long long)N_COMMANDS);
        for (size_t i = 0; i < N_COMMANDS; i++)
            resp_out_str(c, commands[i].name);
    } else if (arg_is(m, 1, "DOCS")) {
        long long n = 0;
        const struct command *k;

        /* RESP2 has no map: name, then its fields as a flat list. */
        for (size_t i = 0; i < (m->argc <= 2 ? N_COMMANDS : m->argc - 2); i++)
            n += m->argc <= 2 || command_named(arg(m, i + 2), arglen(m, i + 2));
        resp_out_num(c, '*', 2 * n);
        for (size_t i = 0; i < (m->argc <= 2 ? N_COMMANDS : m->argc - 2); i++) {
            k = m->argc <= 2 ? &commands[i] : command_named(arg(m, i + 2), arglen(m, i + 2));
            if (!k)
                continue;
            resp_out_str(c, k->name);
            OUT_LIT(c, "*4\r\n");
            resp_out_str(c, "summary");
            resp_out_str(c, k->summary);
            resp_out_str(c, "group");
            resp_out_str(c, k->group);
        }
    } else if (arg_is(m, 1, "HELP") && m->argc == 2) {
        resp_out_lines(c, command_help, sizeof(command_help) / sizeof(command_help[0]));
    } else {
        resp_out_err(c, "ERR unknown subcommand or wrong number of arguments for '%.*s'. Try "
                "COMMAND HELP.", (int)(arglen(m, 1) < 64 ? arglen(m, 1) : 64), arg(m, 1));
    }
}

/* HELLO [2 [AUTH user pass] [SETNAME name]]: the RESP2 handshake. RESP3
 * is not spoken: HELLO 3 gets what a Redis before 6 answers to HELLO,
 * which clients take as "use RESP2". */
static void cmd_hello(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    size_t i = 2;

    if (m->argc >= 2 && !arg_is(m, 1, "2")) {
        long long v;

        if (!resp_ll_parse(arg(m, 1), arglen(m, 1), &v))
            OUT_LIT(c, "-ERR Protocol version is not an integer or out of range\r\n");
        else if (v == 3)
            reply_unknown(c, m);
        else
            OUT_LIT(c, "-NOPROTO unsupported protocol version\r\n");
        return;
    }
    while (i < m->argc) {
        if (arg_is(m, i, "SETNAME") && i + 1 < m->argc) {
            if (!name_ok(arg(m, i + 1), arglen(m, i + 1)) || arglen(m, i + 1) >= sizeof(c->name)) {
                OUT_LIT(c, "-ERR Client names cannot contain spaces, newlines or special "
                           "characters.\r\n");
                return;
            }
            memcpy(c->name, arg(m, i + 1), arglen(m, i + 1));
            c->name[arglen(m, i + 1)] = '\0';
            i += 2;
        } else if (arg_is(m, i, "AUTH") && i + 2 < m->argc) {
            if (!resp_auth_check(gw, c, arg(m, i + 1), arglen(m, i + 1), arg(m, i + 2),
                                 arglen(m, i + 2)))
                return;
            i += 3;
        } else {
            resp_out_err(c, "ERR Syntax error in HELLO option '%.*s'",
                    (int)(arglen(m, i) < 64 ? arglen(m, i) : 64), arg(m, i));
            return;
        }
    }
    OUT_LIT(c, "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n"
               "$5\r\nproto\r\n:2\r\n$2\r\nid\r\n");
    resp_out_num(c, ':', (long long)c->id);
    OUT_LIT(c, "$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
               "$7\r\nmodules\r\n*0\r\n");
}

static const struct command *find_command(const struct cmd *m)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (arglen(m, 0) == commands[i].len &&
            strncasecmp(arg(m, 0), commands[i].name, commands[i].len) == 0)
            return &commands[i];
    return NULL;
}

/* Redis 7's wording, quoting at most about 128 bytes of arguments. */
static void reply_unknown(struct client *c, const struct cmd *m)
{
    char args[160];
    size_t used = 0;

    args[0] = '\0';
    for (size_t i = 1; i < m->argc && used < 128; i++) {
        int n = snprintf(args + used, sizeof(args) - used, "'%.*s' ",
                         (int)(arglen(m, i) < 128 - used ? arglen(m, i) : 128 - used),
                         arg(m, i));

        if (n < 0 || (size_t)n >= sizeof(args) - used)
            break;
        used += (size_t)n;
    }
    resp_out_err(c, "ERR unknown command '%.*s', with args beginning with: %s",
            (int)(arglen(m, 0) < 128 ? arglen(m, 0) : 128), arg(m, 0), args);
}

/* After a reply was taken back: a buffer grown for it goes back to what
 * the output left needs, so that the memory returns now rather than when
 * the client reads. */
static void out_trim(struct client *c)
{
    struct buf *b = &c->out;
    size_t cap = OUT_INITIAL;
    char *p;

    if (b->cap <= BUF_KEEP_MAX)
        return;
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
    while (cap < b->len)
        cap *= 2;
    if (cap >= b->cap || !(p = realloc(b->p, cap)))
        return;
    b->p = p;
    b->cap = cap;
}

static void mark_write(struct client *c, size_t start)
{
    if (resp_out_pending(c) == start || c->out.p[c->out.off + start] == '-')
        return;                 /* already an error: nothing to take back */
    if (c->n_marks == c->marks_cap) {
        size_t cap = c->marks_cap ? c->marks_cap * 2 : 64;
        struct write_mark *w = realloc(c->marks, cap * sizeof(*w));

        if (!w) {
            c->marks_lost = true;
            return;
        }
        c->marks = w;
        c->marks_cap = cap;
    }
    c->marks[c->n_marks].start = start;
    c->marks[c->n_marks].end = resp_out_pending(c);
    c->n_marks++;
}

static void run_command(struct resp_gw *gw, struct client *c, const struct cmd *m)
{
    const struct command *k = find_command(m);
    size_t start = resp_out_pending(c);

    if (!k) {
        reply_unknown(c, m);
        return;
    }
    /* With a password set, a client that has not given it may only give
     * it (AUTH, HELLO ... AUTH) or leave. */
    if (!c->authed && gw->password[0] && !(k->flags & CMD_NOAUTH)) {
        OUT_LIT(c, "-NOAUTH Authentication required.\r\n");
        return;
    }
    if (m->argc < k->min_args || (k->max_args && m->argc > k->max_args)) {
        resp_out_err(c, "ERR wrong number of arguments for '%s' command", k->name);
        return;
    }
    /* Only replies that only read are capped: a write must never run
     * twice, and its reply is a few bytes. */
    c->capped = (k->flags & CMD_BIG) != 0;
    c->cmd = k->name;
    c->last = time(NULL);
    /* Two clock reads a command (vDSO, no system call) for SLOWLOG. */
    uint64_t t0 = gw->slow_us >= 0 ? tern_now_ns() : 0;

    k->run(gw, c, m);
    if (gw->slow_us >= 0) {
        uint64_t us = (tern_now_ns() - t0) / 1000;

        if ((long long)us >= gw->slow_us)
            resp_slow_note(gw, c, m, us);
    }
    c->capped = false;
    if (c->over) {
        c->over = false;
        c->out.len = c->out.off + start;
        out_trim(c);
        if (start)
            c->rerun = true;    /* it may fit once what waits is sent */
        else
            resp_out_err(c, "ERR reply exceeds the gateway's output limit of %zu bytes",
                    gw->max_output);
        return;
    }
    if ((k->flags & CMD_WRITE) && !c->dead)
        mark_write(c, start);
}

/* ---- clients ---- */

static void set_interest(struct resp_gw *gw, struct client *c, uint32_t events)
{
    struct epoll_event e = {.events = events, .data.ptr = c};

    if (events == c->events)
        return;
    if (epoll_ctl(gw->epfd, EPOLL_CTL_MOD, c->fd, &e) < 0)
        c->dead = true;
    else
        c->events = events;
}

static void buf_shrink(struct buf *b, size_t initial)
{
    char *p;

    if (b->cap <= BUF_KEEP_MAX || b->off != b->len)
        return;
    p = realloc(b->p, initial);
    if (p) {
        b->p = p;
        b->cap = initial;
    }
    b->off = b->len = 0;
}

/* Closing a socket with unread input makes the kernel send a reset, and a
 * reset can make the peer drop the error reply it has not read yet. Read
 * what has already arrived (a bounded amount) so the reply gets through. */
static void drain_input(int fd)
{
    char sink[16384];

    for (int i = 0; i < 16; i++)
        if (read(fd, sink, sizeof(sink)) <= 0)
            return;
}

static void client_close(struct resp_gw *gw, struct client *c)
{
    /* A client that reconnects in a loop is still one client. */
    if (c->window == gw->window && gw->window_clients)
        gw->window_clients--;
    epoll_ctl(gw->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->closing && !c->dead)
        drain_input(c->fd);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        gw->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    gw->n_clients--;
    resp_parser_free(&c->parser);
    free(c->in.p);
    free(c->out.p);
    free(c->marks);
    free(c);
}

/* "ip:port" of the socket's peer ("[v6]:port" as Redis writes neither:
 * it writes "v6:port"), or "?" */
static void peer_name(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t n = sizeof(ss);
    char host[NI_MAXHOST], port[NI_MAXSERV];

    if (getpeername(fd, (struct sockaddr *)&ss, &n) < 0 ||
        getnameinfo((struct sockaddr *)&ss, n, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        snprintf(out, cap, "?");
    else
        snprintf(out, cap, "%s:%s", host, port);
}

static struct client *client_new(struct resp_gw *gw, int fd)
{
    struct client *c = calloc(1, sizeof(*c));
    struct epoll_event e = {.events = EPOLLIN};
    int one = 1;

    if (!c)
        return NULL;
    c->fd = fd;
    c->in.p = malloc(IN_INITIAL);
    if (!c->in.p) {
        free(c);
        return NULL;
    }
    c->in.cap = IN_INITIAL;
    resp_parser_init(&c->parser, gw->max_request);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    e.data.ptr = c;
    if (epoll_ctl(gw->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
        free(c->in.p);
        free(c);
        return NULL;
    }
    c->events = EPOLLIN;
    c->id = ++gw->next_id;
    c->since = c->last = time(NULL);
    peer_name(fd, c->addr, sizeof(c->addr));
    c->gw = gw;
    c->next = gw->clients;
    if (gw->clients)
        gw->clients->prev = c;
    gw->clients = c;
    gw->n_clients++;
    gw->total_conns++;
    return c;
}

static void refuse(int fd, const char *reply, const char *why)
{
    static struct tern_log_limit limit;

    /* Best effort: the socket is new, so a short error fits its buffer. */
    if (reply)
        (void)send(fd, reply, strlen(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(fd);
    if (tern_log_allow(&limit)) {
        tern_log(TERN_LOG_WARN, LOG_WHO, "refusing a client: %s (%u more refused)", why,
                 limit.held);
        limit.held = 0;
    }
}

static void accept_clients(struct resp_gw *gw)
{
    for (int i = 0; i < ACCEPT_BURST; i++) {
        int fd = accept4(gw->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            static struct tern_log_limit limit;

            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK && tern_log_allow(&limit)) {
                tern_log(TERN_LOG_WARN, LOG_WHO, "accept: %s", strerror(errno));
                limit.held = 0;
            }
            return;
        }
        if (gw->n_clients >= gw->max_clients) {
            gw->rejected++;
            refuse(fd, "-ERR max number of clients reached\r\n", "too many clients");
        } else if (!client_new(gw, fd)) {
            refuse(fd, NULL, "out of memory");
        }
    }
}

/* Make room to read: drop consumed input, and grow to hold the command the
 * parser is in the middle of (it knows how long a bulk will be). */
static bool in_make_room(struct resp_gw *gw, struct client *c)
{
    struct buf *b = &c->in;
    size_t limit = gw->max_request + 64, want, cap;
    char *p;

    if (b->off > 0) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    want = b->len + MIN_READ;
    if (c->parser.need > want)
        want = c->parser.need;
    if (want > limit)
        want = limit;
    if (want <= b->cap)
        return b->len < b->cap;
    cap = b->cap;
    while (cap < want)
        cap *= 2;
    if (cap > limit)
        cap = limit;
    p = realloc(b->p, cap);
    if (!p) {
        c->dead = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return b->len < b->cap;
}

/* May the client's next command run? Not while max_output waits, nor, for
 * a command taken back for want of room, before the output is all sent. */
static bool may_run(const struct resp_gw *gw, const struct client *c)
{
    return c->rerun ? resp_out_pending(c) == 0 : resp_out_pending(c) <= gw->max_output;
}

/* Run every complete command in the input buffer. */
static void run_input(struct resp_gw *gw, struct client *c)
{
    struct buf *b = &c->in;

    if (may_run(gw, c))
        c->rerun = false;
    while (!c->closing && !c->dead && b->off < b->len && may_run(gw, c)) {
        const char *start = b->p + b->off;
        enum resp_status rc = resp_parse(&c->parser, start, b->len - b->off);

        if (rc == RESP_MORE)
            break;
        if (rc == RESP_NOMEM) {
            c->dead = true;
            break;
        }
        if (rc == RESP_ERROR) {
            resp_out_err(c, "ERR Protocol error: %s", c->parser.error);
            c->closing = true;
            break;
        }
        if (c->parser.argc) {
            struct cmd m = {start, c->parser.argv, c->parser.argc};

            run_command(gw, c, &m);
            if (c->rerun) {
                /* Left in the buffer, parsed again when it runs. */
                resp_parser_reset(&c->parser);
                break;
            }
            gw->batch_cmds++;
        }
        b->off += c->parser.pos;
        resp_parser_reset(&c->parser);
    }
    c->stalled = !c->closing && !c->dead && b->off < b->len && !may_run(gw, c);
    if (b->off == b->len) {
        b->off = b->len = 0;
        buf_shrink(b, IN_INITIAL);
    }
}

/* One read per poll, so that one busy client cannot starve the others. */
static void client_read(struct resp_gw *gw, struct client *c)
{
    ssize_t n;

    if (!in_make_room(gw, c)) {
        if (!c->dead) {
            /* The parser bounds every command by max_request, so a full
             * buffer means a bug rather than a client: still, fail safe. */
            OUT_LIT(c, "-ERR Protocol error: request too large\r\n");
            c->closing = true;
        }
        return;
    }
    n = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
    if (n > 0) {
        c->in.len += (size_t)n;
        gw->net_in += (size_t)n;
        run_input(gw, c);
    } else if (n == 0) {
        /* The peer has finished sending (maybe only half-closed, as
         * `nc -q` does): answer what came, then close. */
        c->closing = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        c->dead = true;
    }
}

static void touch(struct resp_gw *gw, struct client *c)
{
    if (c->touched)
        return;
    c->touched = true;
    c->next_touched = gw->touched;
    gw->touched = c;
}

/* See the top of the file: swap the client's write replies of this batch
 * for `err`. */
static void fail_writes(struct client *c, const char *err, size_t err_len)
{
    size_t first, total, at;
    char *tail;

    if (c->dead || (!c->n_marks && !c->marks_lost))
        return;
    if (c->marks_lost) {
        c->dead = true;     /* cannot tell which replies to take back */
        return;
    }
    first = c->marks[0].start;
    total = resp_out_pending(c);
    tail = malloc(total - first);
    if (!tail) {
        c->dead = true;
        return;
    }
    memcpy(tail, c->out.p + c->out.off + first, total - first);
    c->out.len = c->out.off + first;
    at = first;
    for (size_t i = 0; i < c->n_marks; i++) {
        resp_out_add(c, tail + (at - first), c->marks[i].start - at);
        resp_out_add(c, err, err_len);
        at = c->marks[i].end;
    }
    resp_out_add(c, tail + (at - first), total - at);
    free(tail);
}

/* Group commit: one sync for every write of the poll, before any reply. */
static void commit_batch(struct resp_gw *gw)
{
    static struct tern_log_limit limit;
    char err[160];
    int rc, n;

    /* The collections' first: a SET over a list deletes the list there
     * and writes here, and a crash between the two syncs must not leave
     * the list alone. Both there is resolved (the string wins). */
    rc = gw->coll && kvc_dirty(gw->coll) ? resp_sync_fn(kvc_store(gw->coll)) : 0;
    if (rc >= 0 && kvs_dirty(gw->store))
        rc = resp_sync_fn(gw->store);
    if (rc >= 0)
        return;
    if (tern_log_allow(&limit)) {
        tern_log(TERN_LOG_ERROR, LOG_WHO, "sync failed: %s (%u more)", tern_strerror(rc),
                 limit.held);
        limit.held = 0;
    }
    n = snprintf(err, sizeof(err), "-ERR write not persisted: sync failed: %s\r\n",
                 tern_strerror(rc));
    if (n < 0 || (size_t)n >= sizeof(err))
        n = snprintf(err, sizeof(err), "-ERR write not persisted: sync failed\r\n");
    for (struct client *c = gw->touched; c; c = c->next_touched)
        fail_writes(c, err, (size_t)n);
}

/* One write per client per poll; what does not go waits for EPOLLOUT. */
static void client_flush(struct resp_gw *gw, struct client *c)
{
    struct buf *b = &c->out;
    size_t backlog;

    c->n_marks = 0;
    c->marks_lost = false;
    if (c->dead) {
        client_close(gw, c);
        return;
    }
    if (b->len > b->off) {
        ssize_t n = send(c->fd, b->p + b->off, b->len - b->off, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            client_close(gw, c);
            return;
        }
        if (n > 0) {
            b->off += (size_t)n;
            gw->net_out += (size_t)n;
        }
        if (b->off == b->len) {
            b->off = b->len = 0;
            buf_shrink(b, OUT_INITIAL);
        }
    }
    backlog = b->len - b->off;
    if (c->closing && !backlog) {
        client_close(gw, c);
        return;
    }
    /* A stalled client waits for EPOLLOUT even with nothing to send: the
     * event is what brings it back to run the rest of its input. */
    set_interest(gw, c,
                 (c->closing || c->stalled || backlog > gw->max_output ? 0 : EPOLLIN) |
                 (backlog || c->stalled ? EPOLLOUT : 0));
    if (c->dead)
        client_close(gw, c);
}

/* Load is judged per 1 ms window by the distinct clients served in it:
 * counting clients, not polls or commands, keeps a lone client (however
 * fast it sends) from ever waiting for a batch to fill. */
static void coalesce_window(struct resp_gw *gw)
{
    uint64_t now = tern_now_ns();

    if (now < gw->window_end_ns)
        return;
    gw->coalesce = gw->window_clients >= RESP_COALESCE_MIN;
    gw->window++;
    gw->window_clients = 0;
    gw->window_end_ns = now + 1000000;
}

int resp_gw_poll(struct resp_gw *gw, int timeout_ms)
{
    struct epoll_event ev[MAX_EVENTS];
    int n;

    /* Expired keys still to remove: do not sleep on them. */
    if (gw->next_expire_ns == 0 && gw->expired)
        timeout_ms = 0;
    if (gw->coalesce_us)
        coalesce_window(gw);
    if (gw->coalesce && timeout_ms) {
        n = epoll_wait(gw->epfd, ev, MAX_EVENTS, 0);
        if (n == 0) {
            /* The sleep ends early for the watched fd (RPC work is not
             * batched with RESP commands) and for a signal, which returns
             * as an interrupted epoll_wait would. */
            struct timespec ts = {.tv_sec = gw->coalesce_us / 1000000u,
                                  .tv_nsec = (long)(gw->coalesce_us % 1000000u) * 1000};
            struct pollfd w = {.fd = gw->watch_fd, .events = POLLIN};

            gw->coalesced_waits++;
            if (ppoll(&w, gw->watch_fd >= 0 ? 1 : 0, &ts, NULL) < 0 && errno == EINTR)
                return 0;
            n = epoll_wait(gw->epfd, ev, MAX_EVENTS, timeout_ms);
        }
    } else {
        n = epoll_wait(gw->epfd, ev, MAX_EVENTS, timeout_ms);
    }
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    gw->batch_cmds = 0;
    gw->touched = NULL;
    gw->watch_ready = false;
    for (int i = 0; i < n; i++) {
        struct client *c = ev[i].data.ptr;

        if (ev[i].data.ptr == &gw->watch_fd) {
            gw->watch_ready = true;
            continue;
        }
        if (ev[i].data.ptr == gw) {
            accept_clients(gw);
            continue;
        }
        touch(gw, c);
        if (c->window != gw->window) {
            c->window = gw->window;
            gw->window_clients++;
        }
        if (c->stalled) {
            if (may_run(gw, c))
                run_input(gw, c);
        } else if ((ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && (c->events & EPOLLIN)) {
            client_read(gw, c);
        }
    }
    resp_expire_cycle(gw, tern_now_ns());
    commit_batch(gw);
    while (gw->touched) {
        struct client *c = gw->touched;

        gw->touched = c->next_touched;
        c->touched = false;
        client_flush(gw, c);
    }
    gw->total_cmds += gw->batch_cmds;
    return gw->batch_cmds > INT_MAX ? INT_MAX : (int)gw->batch_cmds;
}

/* ---- the gateway ---- */

static int listen_on(struct resp_gw *gw, const char *host, uint16_t port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char service[8];
    int fd, one = 1, rc;

    snprintf(service, sizeof(service), "%u", port);
    if (getaddrinfo(host, service, &hints, &ai) != 0)
        return TERN_EBADADDR;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        freeaddrinfo(ai);
        return rc;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 511) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = errno == EADDRINUSE ? TERN_EADDRINUSE : -errno;
        freeaddrinfo(ai);
        close(fd);
        return rc;
    }
    freeaddrinfo(ai);
    gw->lfd = fd;
    gw->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

int resp_gw_create(struct kvs *store, const struct resp_config *cfg,
                        struct resp_gw **out)
{
    struct resp_gw *gw;
    struct epoll_event e = {.events = EPOLLIN};
    int rc;

    if (!store || !out)
        return TERN_EINVAL;
    gw = calloc(1, sizeof(*gw));
    if (!gw)
        return TERN_ENOMEM;
    gw->store = store;
    gw->coll = cfg ? cfg->collections : NULL;
    gw->max_clients = cfg && cfg->max_clients ? cfg->max_clients : DEFAULT_MAX_CLIENTS;
    gw->max_request = cfg && cfg->max_request ? cfg->max_request : DEFAULT_MAX_REQUEST;
    gw->max_output = cfg && cfg->max_output ? cfg->max_output : DEFAULT_MAX_OUTPUT;
    gw->coalesce_us = cfg ? cfg->coalesce_us : 0;
    if (gw->coalesce_us > RESP_COALESCE_MAX_US)
        gw->coalesce_us = RESP_COALESCE_MAX_US;
    gw->started = time(NULL);
    snprintf(gw->host, sizeof(gw->host), "%s", cfg && cfg->host ? cfg->host : "127.0.0.1");
    gw->slow_us = 10000;            /* Redis's defaults */
    gw->slow_max = 128;
    if (cfg && cfg->password) {
        if (strlen(cfg->password) >= sizeof(gw->password)) {
            free(gw);
            return TERN_EINVAL;
        }
        snprintf(gw->password, sizeof(gw->password), "%s", cfg->password);
    }
    gw->lfd = -1;
    gw->watch_fd = -1;
    gw->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (gw->epfd < 0) {
        rc = -errno;
        free(gw);
        return rc;
    }
    rc = listen_on(gw, cfg && cfg->host ? cfg->host : "127.0.0.1", cfg ? cfg->port : 0);
    e.data.ptr = gw;
    if (rc == 0 && epoll_ctl(gw->epfd, EPOLL_CTL_ADD, gw->lfd, &e) < 0)
        rc = -errno;
    if (rc < 0) {
        /* The caller gets the code and says it: a warning too would print
         * the one error twice. */
        tern_log(TERN_LOG_DEBUG, LOG_WHO, "cannot listen on %s:%u: %s",
                 cfg && cfg->host ? cfg->host : "127.0.0.1", cfg ? cfg->port : 0,
                 tern_strerror(rc));
        if (gw->lfd >= 0)
            close(gw->lfd);
        close(gw->epfd);
        free(gw);
        return rc;
    }
    rc = resp_coll_reconcile(gw);
    if (rc < 0) {
        resp_gw_destroy(gw);
        return rc;
    }
    tern_log(TERN_LOG_INFO, LOG_WHO, "listening on port %u", gw->port);
    *out = gw;
    return 0;
}

int resp_gw_adopt(struct resp_gw *gw, int fd)
{
    if (gw->n_clients >= gw->max_clients)
        return TERN_ENOBUFS;
    return client_new(gw, fd) ? 0 : TERN_ENOMEM;
}

uint16_t resp_gw_port(const struct resp_gw *gw)
{
    return gw->port;
}

int resp_gw_fd(const struct resp_gw *gw)
{
    return gw->epfd;
}

int resp_gw_watch_fd(struct resp_gw *gw, int fd)
{
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &gw->watch_fd};

    if (gw->watch_fd >= 0 || fd < 0)
        return TERN_EINVAL;
    if (epoll_ctl(gw->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
        return -errno;
    gw->watch_fd = fd;
    return 0;
}

bool resp_gw_watch_ready(const struct resp_gw *gw)
{
    return gw->watch_ready;
}

void resp_gw_destroy(struct resp_gw *gw)
{
    if (!gw)
        return;
    while (gw->clients)
        client_close(gw, gw->clients);
    close(gw->lfd);
    close(gw->epfd);
    free(gw->slow);
    free(gw->scratch);
    free(gw->tmp);
    free(gw);
}
