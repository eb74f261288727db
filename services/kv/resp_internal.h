/* The RESP gateway's insides, shared by its files: resp.c (clients,
 * batches, the command table and the server commands), resp_out.c (replies)
 * and resp_keys.c (expiry and the key commands). Nothing here is for users
 * of the gateway (resp.h).
 *
 * Every command runs on the gateway's thread, with its arguments pointing
 * into the client's input buffer; it builds its reply with resp_out_*(),
 * which never fail loudly: out of memory drops the client (c->dead), and a
 * capped reply that outgrows max_output sets c->over for run_command() to
 * take back. */
#ifndef TERN_RESP_INTERNAL_H
#define TERN_RESP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>
#include <string.h>
#include <time.h>

#include "resp_parse.h"

struct kvs;
struct kvc;
struct kvc_coll;

#define OUT_INITIAL (16u * 1024)

/* SLOWLOG: what an entry keeps of a command, as Redis does, and how many
 * entries may be asked for (slowlog-max-len). */
#define RESP_SLOW_ARGS 32
#define RESP_SLOW_ARG_BYTES 128
#define RESP_SLOW_MAX 1024
#define RESP_OPS_SAMPLES 16            /* instantaneous_ops_per_sec: 1.6 s of beats */
#define RESP_PASSWORD_MAX 256

struct resp_slow {
    uint64_t id, us;
    int64_t at;                        /* Unix seconds */
    uint32_t argc;                     /* the command's arguments */
    uint32_t n;                        /* kept */
    uint16_t len[RESP_SLOW_ARGS];      /* bytes kept of each */
    uint32_t full[RESP_SLOW_ARGS];     /* bytes each had */
    char arg[RESP_SLOW_ARGS][RESP_SLOW_ARG_BYTES];
    char addr[64], name[64];
};

struct buf {
    char *p;
    size_t off;                 /* bytes [off, len) are pending */
    size_t len;
    size_t cap;
};

/* A successful write reply of this batch, relative to out.off (which stays
 * valid when the buffer is compacted). */
struct write_mark {
    size_t start, end;
};

struct client {
    int fd;
    uint32_t events;            /* epoll interest as registered */
    bool closing;               /* close once the output is sent */
    bool dead;                  /* close at the end of the poll, output dropped */
    bool touched;               /* on the poll's list */
    bool marks_lost;            /* a write mark could not be recorded */
    bool stalled;               /* input left unrun for the output to drain */
    bool capped;                /* the running command's reply is held to max_output */
    bool over;                  /* it did not fit: take it back */
    bool rerun;                 /* run the next command again once the output is empty */
    bool authed;                /* AUTH passed (or no password is set) */
    uint64_t id;
    char name[64];              /* CLIENT SETNAME */
    char addr[64];              /* the peer, "ip:port" (CLIENT LIST) */
    time_t since, last;         /* connected; its last command */
    const char *cmd;            /* its last command's name */
    uint64_t window;            /* the coalescing window it was last counted in */
    struct buf in, out;
    struct resp_parser parser;
    struct write_mark *marks;
    size_t n_marks, marks_cap;
    struct client *prev, *next;         /* every client */
    struct client *next_touched;
    struct resp_gw *gw;
};

struct resp_gw {
    struct kvs *store;
    struct kvc *coll;                   /* lists, hashes, sets, sorted sets; NULL: none */
    void **tmp;                         /* pointers gathered for one reply (resp_tmp) */
    size_t tmp_cap;
    unsigned max_clients;
    size_t max_request;
    size_t max_output;                  /* unsent output a client may have */
    size_t out_peak;                    /* largest output buffer so far (INFO) */
    int epfd, lfd;
    uint16_t port;
    unsigned n_clients;
    struct client *clients;
    struct client *touched;             /* clients with work this poll */
    unsigned batch_cmds;
    unsigned coalesce_us;
    bool coalesce;                      /* the last window was busy */
    uint64_t window, window_end_ns;     /* the current 1 ms window */
    unsigned window_clients;            /* distinct clients served in it */
    uint64_t coalesced_waits;           /* coalescing sleeps taken */
    uint64_t next_id, total_conns, total_cmds;
    time_t started;
    int watch_fd;                       /* resp_gw_watch_fd(), -1 if none */
    bool watch_ready;
    char *scratch;                      /* values copied out of the pool, replies
                                         * gathered before their length is known */
    size_t scratch_cap;
    uint64_t next_expire_ns;            /* the next expiry cycle (resp_expire_cycle) */
    uint64_t expired;                   /* keys it removed */
    char host[64];                      /* the listen address (CONFIG GET bind) */
    char password[RESP_PASSWORD_MAX];   /* "" = none (CONFIG SET requirepass) */
    uint64_t auth_failures;
    /* INFO stats, and where CONFIG RESETSTAT left the store's counters */
    uint64_t net_in, net_out, rejected, mem_peak;
    uint64_t base_expired, base_hits, base_misses;
    uint64_t ops_ns[RESP_OPS_SAMPLES], ops_cmds[RESP_OPS_SAMPLES];
    unsigned ops_n;
    /* SLOWLOG: a ring of slow_max entries, allocated at the first one */
    long long slow_us;                  /* slowlog-log-slower-than; -1 off */
    unsigned slow_max, slow_n, slow_head;
    uint64_t slow_next_id;
    struct resp_slow *slow;
};

/* A parsed command: arguments are offsets from `base`. */
struct cmd {
    const char *base;
    const struct resp_arg *argv;
    size_t argc;
};

static inline const char *arg(const struct cmd *m, size_t i)
{
    return m->base + m->argv[i].off;
}

static inline size_t arglen(const struct cmd *m, size_t i)
{
    return m->argv[i].len;
}

static inline bool arg_is(const struct cmd *m, size_t i, const char *word)
{
    size_t n = strlen(word);

    return arglen(m, i) == n && strncasecmp(arg(m, i), word, n) == 0;
}

typedef void (*cmd_fn)(struct resp_gw *gw, struct client *c, const struct cmd *m);

/* ---- numbers (resp_out.c) ---- */

/* Decimal text of v at dst (at most 20 bytes, no NUL); its length. */
size_t resp_u64_text(char *dst, unsigned long long v);
size_t resp_ll_text(char *dst, long long v);

/* A decimal int64 exactly as Redis accepts it: no blanks, no '+', no
 * leading zeros, no "-0". */
bool resp_ll_parse(const char *s, size_t n, long long *out);

/* ---- replies (resp_out.c) ---- */

/* Room for n more bytes of output, or NULL (see above). */
char *resp_out_reserve(struct client *c, size_t n);
void resp_out_add(struct client *c, const void *s, size_t n);
#define OUT_LIT(c, s) resp_out_add((c), (s), sizeof(s) - 1)
/* ":v\r\n", "*v\r\n" or "$v\r\n". */
void resp_out_num(struct client *c, char type, long long v);
void resp_out_bulk(struct client *c, const void *data, size_t len);
void resp_out_str(struct client *c, const char *s);
void resp_out_null(struct client *c);
/* "-<text>\r\n"; line breaks in the text become blanks. */
__attribute__((format(printf, 2, 3)))
void resp_out_err(struct client *c, const char *fmt, ...);
/* The error for a store's failure code. */
void resp_out_store_err(struct client *c, int rc);
/* An array of simple strings (HELP texts). */
void resp_out_lines(struct client *c, const char *const *lines, size_t n);
/* Unsent output bytes. */
size_t resp_out_pending(const struct client *c);

/* ---- the store ---- */

/* A key the store can hold; otherwise the client gets an error. */
bool resp_key_ok(struct client *c, size_t klen);

/* kvs_get, for a key the store cannot hold too (TERN_ENOENT);
 * RESP_EWRONGTYPE for a collection's key. */
int resp_lookup(struct resp_gw *gw, const char *key, size_t klen, const void **val,
                uint32_t *len);

/* A key that holds a collection where a string is wanted, or the
 * reverse (resp_lookup, resp_out_store_err). */
#define RESP_EWRONGTYPE (-(1 << 24))

/* ---- collections (resp_coll.c) ---- */

enum kvc_type;

/* The collection at key (due ones are deleted here), or NULL. */
struct kvc_coll *resp_coll_find(struct resp_gw *gw, const char *key, size_t klen);

/* Delete the collection at key, if any (a SET overwrites it). 0 or a
 * store error. */
int resp_coll_drop(struct resp_gw *gw, const char *key, size_t klen);

/* For a command on collections of `type`: the one at key, or NULL if it
 * is absent. *failed after an error reply (a string or another type is
 * there: WRONGTYPE; no engine). */
struct kvc_coll *resp_coll_get(struct resp_gw *gw, struct client *c, const char *key,
                               size_t klen, enum kvc_type type, bool *failed);

/* The same, but an absent one is made (empty: the first element writes
 * it); NULL after an error reply. */
struct kvc_coll *resp_coll_make(struct resp_gw *gw, struct client *c, const char *key,
                                size_t klen, enum kvc_type type);

/* LLEN, SCARD, ZCARD and HLEN: the length of the collection of `type` at
 * argument 1, 0 if it is absent. */
void resp_coll_out_len(struct resp_gw *gw, struct client *c, const struct cmd *m,
                       enum kvc_type type);

/* SREM, ZREM and HDEL's work: remove the members (fields) named by
 * arguments 2.. from `k` (NULL: absent, nothing to remove) and answer how
 * many were there, or the store's error. */
void resp_coll_del_members(struct resp_gw *gw, struct client *c, const struct cmd *m,
                           struct kvc_coll *k);

/* Settle keys that are both a string and a collection (a crash between
 * the two stores' syncs, a native put of a collection's key): the string
 * wins. At gateway creation. 0 or a store error. */
int resp_coll_reconcile(struct resp_gw *gw);

/* TYPE's word for it. */
const char *resp_coll_type_name(enum kvc_type t);

/* Room for n pointers gathered for one reply (the gateway's, reused);
 * NULL after an error reply. */
void **resp_tmp(struct resp_gw *gw, struct client *c, size_t n);

/* Floats as Redis 7.0 reads ("inf", no NaN, no blanks) and writes them. */
bool resp_double_parse(const char *s, size_t n, double *out);
size_t resp_double_text(char *dst, double d);   /* at most 32 bytes */
void resp_out_double(struct client *c, double d);

/* argv[i] as an int64, or false after the error reply. */
bool resp_arg_ll(struct client *c, const struct cmd *m, size_t i, long long *out);

/* LRANGE's and ZRANGE's index rules: [start, stop] of a collection of len,
 * negatives from the end, clipped; false if empty. */
bool resp_range(long long start, long long stop, uint64_t len, uint64_t *from, uint64_t *to);

/* SCAN's cursor, and HSCAN's, SSCAN's and ZSCAN's MATCH and COUNT from
 * argv[from] on; false or -1 after the error reply. */
bool resp_cursor_parse(struct client *c, const char *s, size_t n, uint64_t *out);
int resp_scan_opts(struct client *c, const struct cmd *m, size_t from, const char **pat,
                   size_t *plen, long long *count);

/* ---- commands of resp_list.c, resp_hash.c, resp_set.c, resp_zset.c ---- */

#define RESP_COLL_COMMANDS(X)                                                                  \
    X(lpush) X(lpushx) X(lpop) X(llen) X(lrange) X(lindex) X(lset) X(ltrim) X(lrem)          \
    X(linsert) X(lmove) X(rpoplpush)                                                  \
    X(hset) X(hsetnx) X(hget) X(hmget) X(hdel) X(hlen) X(hexists) X(hgetall) X(hincrby)       \
    X(hincrbyfloat) X(hstrlen) X(hscan)                                         \
    X(sadd) X(srem) X(sismember) X(smismember) X(scard) X(smembers) X(spop) X(srandmember)    \
    X(sscan) X(smove) X(sinter) X(sinterstore)                                  \
    X(zadd) X(zincrby) X(zscore) X(zmscore) X(zcard) X(zrem) X(zrank) X(zcount) X(zrange)     \
    X(zpopmin) X(zscan) X(zremrangebyrank) X(zremrangebyscore)
#define RESP_DECLARE(name) \
    void resp_cmd_##name(struct resp_gw *gw, struct client *c, const struct cmd *m);
RESP_COLL_COMMANDS(RESP_DECLARE)
#undef RESP_DECLARE

/* ---- commands of resp_keys.c ---- */

void resp_cmd_expire(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_ttl(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_persist(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_setex(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_getex(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_getdel(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_type(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_scan(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_keys(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_randomkey(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_rename(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_append(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_strlen(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_getrange(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_setrange(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_msetnx(struct resp_gw *gw, struct client *c, const struct cmd *m);

/* The deadline SET's options ask for: 0 with *at_ms (0: none) and *keep
 * (KEEPTTL), or -1 after replying with the error. Options from argv[from]
 * on that are not about time are left to the caller: is_other(word) says
 * which those are. */
int resp_set_deadline(struct client *c, const struct cmd *m, size_t from,
                      bool (*is_other)(const struct cmd *m, size_t i), uint64_t *at_ms,
                      bool *keep);

/* Does key match the glob pattern (Redis's: '*', '?', '[a-z]', '[^x]',
 * '\\' quotes)? Binary-safe; O(pattern x key) at worst. */
bool resp_glob(const char *pat, size_t plen, const char *key, size_t klen);

/* The same, with ASCII case ignored (CONFIG GET). */
bool resp_glob_nocase(const char *pat, size_t plen, const char *key, size_t klen);

/* ---- server commands (resp_admin.c) ---- */

void resp_cmd_info(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_config(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_slowlog(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_auth(struct resp_gw *gw, struct client *c, const struct cmd *m);
void resp_cmd_monitor(struct resp_gw *gw, struct client *c, const struct cmd *m);

/* AUTH's check (also HELLO's AUTH option): true and c->authed if user
 * (NULL: "default") and pass match; otherwise false after the error
 * reply. */
bool resp_auth_check(struct resp_gw *gw, struct client *c, const char *user, size_t ulen,
                     const char *pass, size_t plen);

/* Note a command that took `us` microseconds (slowlog-log-slower-than). */
void resp_slow_note(struct resp_gw *gw, const struct client *c, const struct cmd *m,
                    uint64_t us);

/* Empty the slow log and let it hold `max` entries. */
void resp_slow_resize(struct resp_gw *gw, unsigned max);

/* One sample of the command count, every 100 ms (instantaneous_ops_per_sec). */
void resp_admin_sample(struct resp_gw *gw, uint64_t now_ns);

/* Remove keys past their deadline (every 100 ms of the gateway's clock;
 * resp_gw_poll calls it). */
void resp_expire_cycle(struct resp_gw *gw, uint64_t now_ns);

#endif
