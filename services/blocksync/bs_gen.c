/* Synthetic chains (bs_gen.h). */
#include "bs_gen.h"

#include <stdlib.h>
#include <string.h>

#include "bs_store.h"
#include "error.h"

struct shape_def {
    const char *name;
    uint32_t tx_min, tx_max;         /* transactions a block */
    uint32_t len_min, len_max;       /* bytes a transaction */
    uint64_t interval_ns;
};

static const struct shape_def shapes[] = {
    [BS_SHAPE_EOS] = {.name = "eos", .tx_min = 15, .tx_max = 35, .len_min = 120, .len_max = 220,
                      .interval_ns = 500000000ull},
    [BS_SHAPE_BTC] = {.name = "btc", .tx_min = 2000, .tx_max = 3500, .len_min = 160,
                      .len_max = 800, .interval_ns = 600000000000ull},
};

int bs_shape_parse(const char *s, enum bs_shape *out)
{
    if (!strcmp(s, "eos"))
        *out = BS_SHAPE_EOS;
    else if (!strcmp(s, "btc") || !strcmp(s, "bitcoin"))
        *out = BS_SHAPE_BTC;
    else
        return TERN_EINVAL;
    return 0;
}

const char *bs_shape_name(enum bs_shape s)
{
    return shapes[s].name;
}

size_t bs_gen_block_max(enum bs_shape s)
{
    return BS_HDR_SIZE + (size_t)shapes[s].tx_max * (4 + shapes[s].len_max);
}

/* splitmix64: fast, and good enough for bytes nobody reads. */
static uint64_t next64(struct bs_gen *g)
{
    uint64_t z = (g->rng += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t between(struct bs_gen *g, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(next64(g) % (hi - lo + 1));
}

void bs_gen_init(struct bs_gen *g, enum bs_shape shape, uint64_t chain, uint64_t seed)
{
    *g = (struct bs_gen){.shape = shape, .chain = chain, .rng = seed};
}

void bs_gen_resume(struct bs_gen *g, uint64_t height, const uint8_t parent[BS_ID_LEN])
{
    g->height = height;
    memcpy(g->parent, parent, BS_ID_LEN);
    g->rng ^= height * 0x2545f4914f6cdd1dull;
}

int bs_gen_next(struct bs_gen *g, struct bs_hasher *hs, uint8_t *out, size_t cap, size_t *len,
                uint8_t id[BS_ID_LEN])
{
    const struct shape_def *d = &shapes[g->shape];
    struct bs_header h = {.version = BS_VERSION, .height = g->height, .chain = g->chain,
                          .time_ns = 1500000000000000000ull + g->height * d->interval_ns};
    uint32_t n = between(g, d->tx_min, d->tx_max);
    size_t at = BS_HDR_SIZE;
    struct bs_block b;
    const char *why;
    int rc;

    if (cap < bs_gen_block_max(g->shape))
        return TERN_E2BIG;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t tl = between(g, d->len_min, d->len_max);

        memcpy(out + at, &tl, 4);
        at += 4;
        for (uint32_t j = 0; j < tl; j += 8) {
            uint64_t r = next64(g);
            memcpy(out + at + j, &r, tl - j < 8 ? tl - j : 8);
        }
        at += tl;
    }
    memcpy(h.parent, g->parent, BS_ID_LEN);
    h.n_tx = n;
    h.body_len = (uint32_t)(at - BS_HDR_SIZE);
    bs_header_encode(&h, out);
    if (bs_block_parse(out, at, &b, &why) < 0)
        return TERN_EIO;             /* cannot happen: made just above */
    if ((rc = bs_merkle_root(hs, &b, h.merkle)) < 0)
        return rc;
    bs_header_encode(&h, out);
    if ((rc = bs_header_id(hs, out, id)) < 0)
        return rc;
    memcpy(g->parent, id, BS_ID_LEN);
    g->height++;
    *len = at;
    return 0;
}

int bs_gen_fill(struct bs_gen *g, struct bs_hasher *hs, struct bs_store *st, uint64_t blocks,
                uint64_t bytes, uint64_t reversible, uint64_t commit_bytes,
                void (*progress)(void *arg, uint64_t blocks, uint64_t bytes), void *arg)
{
    size_t cap = bs_gen_block_max(g->shape);
    uint8_t *blk = malloc(cap), id[BS_ID_LEN];
    struct bs_store_info info;
    uint64_t since = 0, top;
    int rc = blk ? 0 : TERN_ENOMEM;

    top = bs_store_top(st);
    if (top && rc == 0) {
        bs_store_id(st, top - 1, id);
        bs_gen_resume(g, top, id);
    }
    while (rc == 0) {
        size_t len;

        bs_store_info(st, &info);
        if ((blocks && bs_store_top(st) >= blocks) ||
            (bytes && info.data_used + since >= bytes))
            break;
        if ((rc = bs_gen_next(g, hs, blk, cap, &len, id)) < 0 ||
            (rc = bs_store_append(st, blk, len, id)) < 0)
            break;
        since += bs_rec_size(len);
        if (since >= (commit_bytes ? commit_bytes : 64u << 20)) {
            if ((rc = bs_store_commit(st)) < 0)
                break;
            since = 0;
            if (progress) {
                bs_store_info(st, &info);
                progress(arg, info.committed, info.data_used);
            }
        }
    }
    if (rc == TERN_ENOSPC && bs_store_top(st) > top)
        rc = 0;                      /* the file is full: that is where it ends */
    if (rc == 0)
        rc = bs_store_commit(st);
    top = bs_store_committed(st);
    if (rc == 0)
        rc = bs_store_set_irreversible(st, top > reversible ? top - reversible : 0);
    free(blk);
    return rc;
}
