/* Encoding and checking of replication records (repl_wire.h). Nothing here
 * trusts a length before it was compared with the bytes that hold it. */
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

int repl_batch_walk(const void *data, size_t len, struct repl_batch *hdr,
                    repl_rec_fn fn, void *arg)
{
    const uint8_t *p = data;
    struct repl_batch b;
    uint64_t last;
    size_t off;

    if (len < sizeof(b))
        return TERN_EPROTO;
    memcpy(&b, p, sizeof(b));
    if (repl_shard_ok(b.shard) < 0 || b.bytes != len - sizeof(b) || (b.bytes & 7) ||
        b.n > b.bytes / sizeof(struct repl_rec))
        return TERN_EPROTO;
    if (hdr)
        *hdr = b;
    last = b.prev;
    off = sizeof(b);
    for (uint32_t i = 0; i < b.n; i++) {
        struct repl_rec r;
        size_t size, pad;
        const uint8_t *body;

        if (len - off < sizeof(r))
            return TERN_EPROTO;
        memcpy(&r, p + off, sizeof(r));
        if ((r.type != REPL_SET && r.type != REPL_DEL) || r.flags || r.reserved ||
            !r.key_len || r.key_len > REPL_KEY_MAX || (r.type == REPL_DEL && r.val_len) ||
            r.version <= last)
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
