/* The DRAM ring of recent records (repl_log.h).
 *
 * Records never wrap: one that does not fit before the end of the buffer
 * goes to its start, and the bytes left at the end are skipped. The
 * entries in front of the writer are the oldest, so making room is taking
 * entries off the head until the space the record needs is clear.
 */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "repl_log.h"
#include "repl_wire.h"

int repl_log_init(struct repl_log *l, size_t bytes)
{
    memset(l, 0, sizeof(*l));
    if (bytes < 64 * 1024)
        bytes = 64 * 1024;
    l->cap = bytes;
    /* The smallest record is 32 bytes: one entry for each at most. */
    l->ecap = (uint32_t)(bytes / 32);
    l->buf = malloc(bytes);
    l->idx = malloc((size_t)l->ecap * sizeof(*l->idx));
    if (!l->buf || !l->idx) {
        repl_log_free(l);
        return TERN_ENOMEM;
    }
    return 0;
}

void repl_log_free(struct repl_log *l)
{
    free(l->buf);
    free(l->idx);
    l->buf = NULL;
    l->idx = NULL;
}

void repl_log_reset(struct repl_log *l, uint64_t base)
{
    l->head = l->n = 0;
    l->wpos = 0;
    l->base = l->last = base;
}

static struct repl_log_ent *ent(const struct repl_log *l, uint32_t i)
{
    return &l->idx[(l->head + i) % l->ecap];
}

static void drop_oldest(struct repl_log *l)
{
    l->base = l->idx[l->head].version;
    l->head = (l->head + 1) % l->ecap;
    l->n--;
}

int repl_log_add(struct repl_log *l, uint8_t type, uint64_t version, const void *key,
                 uint16_t key_len, const void *val, uint32_t val_len)
{
    size_t size = repl_rec_size(key_len, val_len);
    size_t at = l->wpos;

    if (size > l->cap)
        return TERN_E2BIG;
    if (version <= l->last)
        return TERN_EINVAL;
    if (at + size > l->cap) {
        /* Wrap: what lies between the writer and the end is the oldest. */
        while (l->n && ent(l, 0)->off >= at)
            drop_oldest(l);
        at = 0;
    }
    while (l->n && (l->n == l->ecap ||
                    (ent(l, 0)->off >= at && ent(l, 0)->off < at + size)))
        drop_oldest(l);
    repl_rec_write(l->buf + at, type, version, key, key_len, val, val_len);
    *ent(l, l->n) = (struct repl_log_ent){.version = version, .off = (uint32_t)at,
                                          .size = (uint32_t)size};
    l->n++;
    l->wpos = at + size;
    l->last = version;
    return 0;
}

/* Index of the first record after `from`, or -1 if the log lacks it. */
static long first_after(const struct repl_log *l, uint64_t from)
{
    uint32_t lo = 0, hi = l->n;

    if (from == l->base)
        return 0;
    if (!l->n || from < ent(l, 0)->version || from > l->last)
        return -1;
    /* A replica streaming is one or two records behind: no search. */
    for (uint32_t k = 1; k <= 2 && k <= l->n; k++)
        if (ent(l, l->n - k)->version == from)
            return (long)(l->n - k + 1);
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;

        if (ent(l, mid)->version < from)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < l->n && ent(l, lo)->version == from ? (long)lo + 1 : -1;
}

int repl_log_has(const struct repl_log *l, uint64_t from)
{
    return first_after(l, from) >= 0;
}

long repl_log_read(const struct repl_log *l, uint64_t from, void *dst, size_t cap,
                   uint32_t *n, uint64_t *last)
{
    long i = first_after(l, from);
    size_t done = 0;

    *n = 0;
    *last = from;
    if (i < 0)
        return TERN_ERANGE;
    for (; (uint32_t)i < l->n; i++) {
        const struct repl_log_ent *e = ent(l, (uint32_t)i);

        if (done + e->size > cap)
            break;
        memcpy((uint8_t *)dst + done, l->buf + e->off, e->size);
        done += e->size;
        (*n)++;
        *last = e->version;
    }
    return (long)done;
}
