/* The recent part of a shard's log, in DRAM, on every replica: what a
 * primary ships to its backups from, and what the most advanced replica
 * hands a new primary (FETCH). Records are kept in their wire form
 * (repl_wire.h) in one byte ring, so shipping is a copy out of it; the
 * oldest go when the ring is full. A replica whose position lies before
 * what the ring reaches back to needs a full copy of the shard.
 * One thread owns a log. */
#ifndef TERN_REPL_LOG_H
#define TERN_REPL_LOG_H

#include <stddef.h>
#include <stdint.h>

struct repl_log_ent {
    uint64_t version;
    uint32_t off, size;
};

struct repl_log {
    uint8_t *buf;
    size_t cap;
    size_t wpos;                    /* where the next record goes */
    struct repl_log_ent *idx;       /* a ring of entries, oldest at head */
    uint32_t ecap, head, n;
    uint64_t base;                  /* version before the oldest record kept */
    uint64_t last;                  /* version of the newest (base if none) */
};

/* A log of `bytes` (at least 64 KiB). TERN_ENOMEM. */
int repl_log_init(struct repl_log *l, size_t bytes);
void repl_log_free(struct repl_log *l);

/* Forget every record: the log now starts after `base`. */
void repl_log_reset(struct repl_log *l, uint64_t base);

/* Add a record whose version is above the last one's (TERN_EINVAL
 * otherwise; TERN_E2BIG if it could never fit). */
int repl_log_add(struct repl_log *l, uint8_t type, uint64_t version, const void *key,
                 uint16_t key_len, const void *val, uint32_t val_len);

/* Copy the records after version `from` to dst, whole records only, up to
 * cap bytes: their bytes (0 if none follow), with *n and *last (the
 * version of the last one copied) set. TERN_ERANGE if the log does not
 * hold `from`: neither its base nor the version of a record in it. */
long repl_log_read(const struct repl_log *l, uint64_t from, void *dst, size_t cap,
                   uint32_t *n, uint64_t *last);

/* Does the log hold `from` (as repl_log_read means it)? */
int repl_log_has(const struct repl_log *l, uint64_t from);

#endif
