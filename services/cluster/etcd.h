/* A client of etcd's v3 API over its JSON gateway (etcd 3.4, Debian's
 * etcd-server): keys, leases and the one transaction an election needs.
 * Membership and primaries live in etcd; etcd is never on a data path, so
 * every call here blocks (libcurl, one HTTP POST per call) and belongs on
 * a control thread.
 *
 * The gateway speaks JSON: keys and values are base64, 64-bit integers
 * are strings, fields at their zero value are left out. etcd_json.c turns
 * requests into that and answers back into plain C with no I/O (a fuzz
 * target reads answers as a lying etcd would write them); etcd.c does the
 * HTTP: endpoints tried in turn, a bound on the time and on the size of
 * an answer.
 *
 * Errors are tern codes: TERN_ECONNREFUSED when no endpoint answers,
 * TERN_ETIMEDOUT past the time bound, TERN_EPROTO for an answer that is
 * not what etcd sends, TERN_EIO for an error etcd reported (its message:
 * cl_etcd_error), TERN_ENOLEASE for a lease etcd no longer has,
 * TERN_E2BIG for a key over CL_KEY_MAX or a value over CL_VALUE_MAX.
 *
 * Thread rules: a cl_etcd belongs to one thread at a time. */
#ifndef TERN_CLUSTER_ETCD_H
#define TERN_CLUSTER_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CL_KEY_MAX 1024
#define CL_VALUE_MAX (1024 * 1024)      /* etcd's own request limit is 1.5 MiB */
#define CL_ANSWER_MAX (16u << 20)       /* larger answers are refused, not kept */

/* One key as a range or a transaction returns it. The bytes are the
 * answer's: valid during the callback only. */
struct cl_kv {
    const char *key;
    size_t key_len;
    const uint8_t *value;
    size_t value_len;
    int64_t create_rev, mod_rev, version, lease;
};

/* Called once per key, in key order; a non-zero return stops the walk and
 * is returned by the call that walks. */
typedef int (*cl_kv_fn)(void *arg, const struct cl_kv *kv);

struct cl_etcd;

/* A client of the etcd cluster at `endpoints`: "http://host:port" URLs,
 * separated by commas, tried in order until one answers (the one that did
 * is tried first next time). `timeout_ms` bounds each call (0: 2000).
 * Nothing is sent yet. TERN_EINVAL for an empty or malformed list. */
int cl_etcd_open(const char *endpoints, unsigned timeout_ms, struct cl_etcd **out);
void cl_etcd_close(struct cl_etcd *e);

/* What etcd said about the last call that failed with TERN_EIO, or why
 * the last call failed otherwise ("" if none did). Owned by `e`. */
const char *cl_etcd_error(const struct cl_etcd *e);

/* Put `key` = `val` (len bytes), attached to `lease` (0: none). *rev, if
 * not NULL, is the store's revision after it. */
int cl_etcd_put(struct cl_etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                int64_t *rev);

/* The key `key`, or with `prefix` every key that starts with it, to `fn`.
 * *rev, if not NULL: the revision the answer is of. A key that does not
 * exist calls nothing and returns 0. */
int cl_etcd_get(struct cl_etcd *e, const char *key, bool prefix, cl_kv_fn fn, void *arg,
                int64_t *rev);

/* Delete `key` (or every key under the prefix); *deleted, if not NULL,
 * says how many went. */
int cl_etcd_delete(struct cl_etcd *e, const char *key, bool prefix, int64_t *deleted);

/* A lease of `ttl_s` seconds (etcd may grant more); its id. */
int cl_etcd_lease_grant(struct cl_etcd *e, int64_t ttl_s, int64_t *id);

/* Renew lease `id` once; *ttl_s (if not NULL) is what it has left.
 * TERN_ENOLEASE if it expired or was revoked: what was attached is gone. */
int cl_etcd_lease_keepalive(struct cl_etcd *e, int64_t id, int64_t *ttl_s);

/* End lease `id` now, and the keys attached to it. */
int cl_etcd_lease_revoke(struct cl_etcd *e, int64_t id);

/* Put `key` = `val` under `lease` only if `key` does not exist: the
 * election primitive (the key is the office, the lease its term).
 * *created says whether this call put it; if not, `fn` (if not NULL) is
 * given the key as it stands. */
int cl_etcd_create(struct cl_etcd *e, const char *key, const void *val, size_t len,
                   int64_t lease, bool *created, cl_kv_fn fn, void *arg);

/* Put `key` = `val` under `lease` only if the key's mod revision is still
 * `mod_rev` (0: the key does not exist): a change made from what was
 * read, lost to no concurrent writer. *swapped says whether it was. */
int cl_etcd_cas(struct cl_etcd *e, const char *key, int64_t mod_rev, const void *val,
                size_t len, int64_t lease, bool *swapped);

/* ---- etcd_json.c: requests and answers, no I/O ---- */

/* Request bodies, NUL-terminated, malloc'd (the caller frees). NULL if
 * out of memory. `range_end` for a prefix is computed here. */
char *cl_json_put(const char *key, const void *val, size_t len, int64_t lease);
char *cl_json_range(const char *key, bool prefix);
char *cl_json_delete(const char *key, bool prefix);
char *cl_json_lease_ttl(int64_t ttl_s);
char *cl_json_lease_id(int64_t id);
/* A transaction: if `key`'s mod revision is `mod_rev` (create: its create
 * revision is 0), put `val` under `lease`; else read the key. */
char *cl_json_txn_put(const char *key, bool create, int64_t mod_rev, const void *val, size_t len,
                      int64_t lease);

/* Answers. Each takes the body as it came (any bytes, `len` long, not
 * NUL-terminated) and returns 0 or TERN_EPROTO. */
int cl_answer_header(const char *body, size_t len, int64_t *rev);
int cl_answer_range(const char *body, size_t len, cl_kv_fn fn, void *arg, int64_t *rev);
int cl_answer_delete(const char *body, size_t len, int64_t *deleted);
/* Grant: id and ttl; keepalive ({"result": ...}): ttl 0 means gone. */
int cl_answer_lease(const char *body, size_t len, int64_t *id, int64_t *ttl);
int cl_answer_txn(const char *body, size_t len, bool *succeeded, cl_kv_fn fn, void *arg);
/* An error answer's message into `msg` (always NUL-terminated). 0 if the
 * body is an etcd error, TERN_EPROTO if it is not. */
int cl_answer_error(const char *body, size_t len, char *msg, size_t msg_len);

#endif
