/* tern error codes.
 *
 * Every tern function that can fail returns a negative code from this table
 * (0 or a positive count on success). Where POSIX has a fitting errno the code
 * is simply its negation, so -EINVAL == TERN_EINVAL; codes that POSIX lacks
 * live above TERN_EBASE. One X-macro keeps the values and strings together.
 *
 * The table has two parts. The first is for every layer (arguments,
 * transports, RPC). The second is the services' (the persistent-memory pool
 * and the key-value store): a service handler returns them, and they reach
 * the caller's continuation as its status like any other code:
 *   ENOSPC      the pool has no free segment for the write (delete or clean);
 *   E2BIG       a key or value over what a record or message may hold;
 *   EBUSY       the pool file is open in another process (its lock);
 *   ECORRUPT    a pool file failed a magic, bounds or checksum test (the
 *               log says what and where; the file is left as it was);
 *   EWRONGNODE  the key hashes outside this server's range (re-route);
 *   ENOLEASE    a one-sided PUT named a lease that ended (lease again);
 *   ENOTPRIMARY a write (or read) reached a replica that is not the shard's
 *               primary now (or not yet: it is catching up); ask the map;
 *   ESTALE      a replication message from an epoch older than the one the
 *               replica has seen: its sender was deposed (fencing);
 *   EDOC        the document service refused a command with a MongoDB error
 *               that has no closer code here (tern_doc_last_error says which:
 *               code, codeName, errmsg). A duplicate key is TERN_EEXIST.
 */
#ifndef TERN_ERROR_H
#define TERN_ERROR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_EBASE 4000

/*      name             value                 message */
#define TERN_ERRNO_MAP(X)                                                      \
    X(EINVAL,          -EINVAL,          "invalid argument")                   \
    X(ENOMEM,          -ENOMEM,          "out of memory")                      \
    X(ENOTSUP,         -ENOTSUP,         "operation not supported by this fabric") \
    X(EAGAIN,          -EAGAIN,          "resource temporarily unavailable, retry after polling") \
    X(EINPROGRESS,     -EINPROGRESS,     "in progress: poll, then look again") \
    X(ENOBUFS,         -ENOBUFS,         "no buffer space or call slots left") \
    X(EMSGSIZE,        -EMSGSIZE,        "message larger than the configured maximum") \
    X(ETIMEDOUT,       -ETIMEDOUT,       "deadline expired")                   \
    X(ECANCELED,       -ECANCELED,       "call cancelled")                     \
    X(ECONNRESET,      -ECONNRESET,      "connection reset by peer")           \
    X(ECONNREFUSED,    -ECONNREFUSED,    "connection refused")                 \
    X(ENOTCONN,        -ENOTCONN,        "not connected")                      \
    X(EPROTO,          -EPROTO,          "protocol error: malformed frame")    \
    X(EADDRINUSE,      -EADDRINUSE,      "address already in use")             \
    X(ENOENT,          -ENOENT,          "no such entry")                      \
    X(EEXIST,          -EEXIST,          "already exists")                     \
    X(ERANGE,          -ERANGE,          "offset or length out of range")      \
    X(EACCES,          -EACCES,          "permission denied")                  \
    X(EIO,             -EIO,             "input/output error")                 \
    X(EREMACCESS,      -(TERN_EBASE + 1), "remote access error: bad key, out-of-range access or missing permission") \
    X(ENOSERVICE,      -(TERN_EBASE + 2), "unknown service id")                \
    X(ENOMETHOD,       -(TERN_EBASE + 3), "unknown method id")                 \
    X(EBADADDR,        -(TERN_EBASE + 4), "malformed address or URI")          \
    X(ENOFABRIC,       -(TERN_EBASE + 5), "no such fabric, or not built in")   \
    X(EHANDLER,        -(TERN_EBASE + 6), "remote handler failed")             \
    X(EVERSION,        -(TERN_EBASE + 7), "peer speaks an incompatible protocol version") \
    X(EAUTH,           -(TERN_EBASE + 13), "authentication failed: the peer does not hold the cluster key, or this node does not") \
    X(ENODEV,          -ENODEV,          "no such device: the fabric's hardware is absent") \
    /* services: the pool and the key-value store */                          \
    X(ENOSPC,          -ENOSPC,          "no space left in the pool")          \
    X(E2BIG,           -E2BIG,           "key or value larger than the store accepts") \
    X(EBUSY,           -EBUSY,           "in use by another process")          \
    X(ECORRUPT,        -(TERN_EBASE + 8), "pool file corrupt: failed a magic, bounds or checksum test") \
    X(EWRONGNODE,      -(TERN_EBASE + 9), "key outside this server's hash range") \
    X(ENOLEASE,        -(TERN_EBASE + 10), "no such lease (ended or never granted): lease again") \
    X(EDOC,            -(TERN_EBASE + 11), "the document service refused the command (see tern_doc_last_error)") \
    /* services: block sync */                                                 \
    X(EFORKED,         -(TERN_EBASE + 12), "the chain parted from the one expected (forked)") \
    /* services: replication */                                                \
    X(ENOTPRIMARY,     -(TERN_EBASE + 14), "this node is not the shard's primary now: ask the map again") \
    X(ESTALE,          -ESTALE,          "stale epoch: a newer primary was elected (fenced)") \
    X(ESHUTDOWN,       -ESHUTDOWN,       "shut down before the answer could be given")

enum tern_errno {
#define TERN_ERR_ENUM(name, value, msg) TERN_##name = (value),
    TERN_ERRNO_MAP(TERN_ERR_ENUM)
#undef TERN_ERR_ENUM
};

/* Human-readable text for a tern code (negative) or a plain errno (either
 * sign). Never returns NULL. */
const char *tern_strerror(int err);

/* Symbolic name of a tern code, e.g. "TERN_ETIMEDOUT"; "TERN_UNKNOWN" if none. */
const char *tern_err_name(int err);

#ifdef __cplusplus
}
#endif

#endif
