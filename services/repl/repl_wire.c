/* Encoding and checking of replication records (repl_wire.h). Nothing here
 * trusts a length before it was compared with the bytes that hold it. */
#include <stdbool.h>
#include <string.h>
#include <xxhash.h>

#include "error.h"
#include "repl_wire.h"

static uint32_t rec_sum(const uint8_t *rec, size_t size)
{
    /* Everything after the sum, seeded with the version: a record moved
     * to another position fails. */
    uint64_t v;

    memcpy(&v, rec, sizeof(v));
    return (uint32_t)XXH3_64bits_withSeed(rec + 12, size - 12, v);
}

void repl_rec_write(void *dst, uint8_t type, uint64_t version, const void *key,
                    uint16_t key_len, const void *val, uint32_t val_len)
{
    struct repl_rec h = {.version = version, .val_len = val_len, .key_len = key_len,
                         .type = type};
    size_t size = repl_rec_size(key_len, val_len);
    uint8_t *p = dst;

    memcpy(p, &h, sizeof(h));
    memcpy(p + sizeof(h), key, key_len);
    if (val_len)
        memcpy(p + sizeof(h) + key_len, val, val_len);
    memset(p + sizeof(h) + key_len + val_len, 0, size - sizeof(h) - key_len - val_len);
    h.sum = rec_sum(p, size);
    memcpy(p + offsetof(struct repl_rec, sum), &h.sum, sizeof(h.sum));
}

int repl_shard_ok(const char shard[REPL_SHARD_MAX])
{
    size_t n = strnlen(shard, REPL_SHARD_MAX);

    if (n == 0 || n == REPL_SHARD_MAX)
        return TERN_EPROTO;
    for (size_t i = n; i < REPL_SHARD_MAX; i++)
        if (shard[i])
            return TERN_EPROTO;
    return 0;
}

/* The records of a message from `off` on: n of them exactly filling it,
 * each sound; with `ordered`, versions rising above `prev`. */
static int walk_records(const uint8_t *p, size_t len, size_t off, uint32_t n, uint64_t prev,
                        bool ordered, repl_rec_fn fn, void *arg)
{
    uint64_t last = prev;

    for (uint32_t i = 0; i < n; i++) {
        struct repl_rec r;
        size_t size, pad;
        const uint8_t *body;

        if (len - off < sizeof(r))
            return TERN_EPROTO;
        memcpy(&r, p + off, sizeof(r));
        if ((r.type != REPL_SET && r.type != REPL_DEL && r.type != REPL_SET_EXPIRING) ||
            r.flags || r.reserved || !r.key_len || r.key_len > REPL_KEY_MAX ||
            (r.type == REPL_DEL && r.val_len) || (r.type == REPL_SET_EXPIRING && r.val_len < 8) ||
            !r.version || (ordered && r.version <= last))
            return TERN_EPROTO;
        if (r.key_len > len - off - sizeof(r) ||
            r.val_len > len - off - sizeof(r) - r.key_len)
            return TERN_EPROTO;
        size = repl_rec_size(r.key_len, r.val_len);
        if (size > len - off)
            return TERN_EPROTO;
        body = p + off + sizeof(r);
        pad = size - sizeof(r) - r.key_len - r.val_len;
        for (size_t k = 0; k < pad; k++)
            if (body[r.key_len + r.val_len + k])
                return TERN_EPROTO;
        if (rec_sum(p + off, size) != r.sum)
            return TERN_EPROTO;
        if (fn) {
            int rc = fn(arg, &r, body, body + r.key_len);

            if (rc)
                return rc;
        }
        last = r.version;
        off += size;
    }
    return off == len ? 0 : TERN_EPROTO;
}

int repl_batch_walk(const void *data, size_t len, struct repl_batch *hdr,
                    repl_rec_fn fn, void *arg)
{
    struct repl_batch b;

    if (len < sizeof(b))
        return TERN_EPROTO;
    memcpy(&b, data, sizeof(b));
    if (repl_shard_ok(b.shard) < 0 || b.bytes != len - sizeof(b) || (b.bytes & 7) ||
        b.n > b.bytes / sizeof(struct repl_rec))
        return TERN_EPROTO;
    if (hdr)
        *hdr = b;
    return walk_records(data, len, sizeof(b), b.n, b.prev, true, fn, arg);
}

int repl_copy_walk(const void *data, size_t len, struct repl_copy *hdr, repl_rec_fn fn,
                   void *arg)
{
    struct repl_copy c;

    if (len < sizeof(c))
        return TERN_EPROTO;
    memcpy(&c, data, sizeof(c));
    if (repl_shard_ok(c.shard) < 0 || c.bytes != len - sizeof(c) || (c.bytes & 7) ||
        c.reserved || c.phase < REPL_COPY_BEGIN || c.phase > REPL_COPY_END ||
        (c.phase != REPL_COPY_CHUNK && c.n) || c.n > c.bytes / sizeof(struct repl_rec))
        return TERN_EPROTO;
    if (hdr)
        *hdr = c;
    return walk_records(data, len, sizeof(c), c.n, 0, false, fn, arg);
}
