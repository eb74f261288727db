/* libFuzzer target: the block-sync messages as they come from a peer
 * (services/blocksync/bs_wire.c) and the log spans its ranges carry
 * (bs_span_walk). The first byte picks the decoder; the rest is the
 * message. Nothing may read past the input; what a decoder accepts must
 * hold together (counts against lengths, offsets inside spans), and a
 * span that walks must give one in-bounds block per height. */
#include "bs_store.h"
#include "bs_wire.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static void span(struct fz *f)
{
    static const uint8_t *blocks[4096];
    static uint32_t lens[4096];
    uint64_t from = fz_u64(f) >> 1, bad = 0;
    uint32_t n = fz_u16(f) % 4096;
    const char *why = NULL;
    const uint8_t *p = f->p;
    size_t len = f->n;

    if (n == 0)
        n = 1;
    if (from > UINT64_MAX - n)
        return;
    if (bs_span_walk(p, len, from, from + n, blocks, lens, &bad, &why) < 0) {
        FZ_CHECK(why && bad >= from && bad <= from + n, "refused without a reason or height");
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        struct bs_block b;

        FZ_CHECK(blocks[i] >= p && blocks[i] + lens[i] <= p + len, "block out of the span");
        FZ_CHECK(bs_block_parse(blocks[i], lens[i], &b, &why) == 0, "walked block does not parse");
        FZ_CHECK(b.h.height == from + i, "walked block of another height");
    }
}

/* The records a feed reply hands out must lie inside it, in order. */
struct walked {
    const uint8_t *base;
    size_t len;
    uint32_t n;
    uint64_t last;
};

static int walk_one(void *arg, uint64_t height, const uint8_t *rec, size_t len)
{
    struct walked *w = arg;

    FZ_CHECK(rec >= w->base && rec + len <= w->base + w->len, "record outside the reply");
    FZ_CHECK(w->n == 0 || height == w->last + 1, "records out of order");
    w->last = height;
    w->n++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t which = fz_u8(&f);
    const char *why = NULL;
    const uint8_t *rest;
    int rc = 0;

    switch (which % 14) {
    case 0: {
        struct bs_hello h;
        rc = bs_hello_decode(f.p, f.n, &h, &why);
        FZ_CHECK(rc < 0 || h.lib <= h.head, "irreversible past the head");
        break;
    }
    case 1: {
        struct bs_hello_rep h;
        rc = bs_hello_rep_decode(f.p, f.n, &h, &why);
        FZ_CHECK(rc < 0 || h.refusal < BS_R_MAX, "unknown refusal accepted");
        if (rc == 0)
            FZ_CHECK(bs_refusal_name(h.refusal) != NULL, "nameless refusal");
        break;
    }
    case 2: {
        struct bs_headers_req q;
        rc = bs_headers_req_decode(f.p, f.n, &q, &why);
        break;
    }
    case 3: {
        struct bs_headers_rep r;
        rc = bs_headers_rep_decode(f.p, f.n, &r, &rest, &why);
        if (rc == 0) {
            FZ_CHECK(rest + (size_t)r.n * BS_HDR_SIZE == f.p + f.n, "headers past the input");
            for (uint32_t i = 0; i < r.n; i++) {
                struct bs_header h;
                const char *w = NULL;
                if (bs_header_decode(rest + (size_t)i * BS_HDR_SIZE, BS_HDR_SIZE, &h, &w) < 0)
                    FZ_CHECK(w, "header refused without a reason");
            }
        }
        break;
    }
    case 4: {
        struct bs_range_req q;
        rc = bs_range_req_decode(f.p, f.n, &q, &why);
        FZ_CHECK(rc < 0 || q.from < q.to, "empty range accepted");
        FZ_CHECK(rc < 0 || !(q.flags & BS_RANGE_PUT) || q.roff + q.max <= q.dst.len,
                 "put outside its buffer accepted");
        break;
    }
    case 5: {
        struct bs_range_rep r;
        rc = bs_range_rep_decode(f.p, f.n, &r, &rest, &why);
        if (rc == 0) {
            FZ_CHECK(r.off + r.n <= r.span_len, "bytes past the span accepted");
            FZ_CHECK(!rest || rest + r.n == f.p + f.n, "inline bytes past the input");
        }
        break;
    }
    case 6: {
        struct bs_append_req q;
        size_t bl = 0;
        rc = bs_append_req_decode(f.p, f.n, &q, &rest, &bl, &why);
        FZ_CHECK(rc < 0 || rest + bl == f.p + f.n, "block past the input");
        break;
    }
    case 7: {
        struct bs_append_rep r;
        rc = bs_append_rep_decode(f.p, f.n, &r, &why);
        break;
    }
    case 8: {
        struct bs_info in;
        rc = bs_info_decode(f.p, f.n, &in, &why);
        FZ_CHECK(rc < 0 || in.irreversible <= in.committed, "irreversible past the head");
        break;
    }
    case 9: {
        struct bs_sub_req q;
        rc = bs_sub_req_decode(f.p, f.n, &q, &why);
        FZ_CHECK(rc < 0 || q.from <= BS_FROM_LATEST, "unknown start accepted");
        break;
    }
    case 10: {
        struct bs_sub_rep r;
        rc = bs_sub_rep_decode(f.p, f.n, &r, &why);
        break;
    }
    case 11: {
        struct bs_feed_req q;
        rc = bs_feed_req_decode(f.p, f.n, &q, &why);
        FZ_CHECK(rc < 0 || (q.credits && q.max_bytes), "no credit accepted");
        break;
    }
    case 12: {
        struct bs_feed_rep r;
        struct walked w = {.base = f.p, .len = f.n};
        rc = bs_feed_rep_decode(f.p, f.n, &r, walk_one, &w, &why);
        FZ_CHECK(rc < 0 || w.n == r.n, "walked %u of %u", w.n, r.n);
        break;
    }
    default:
        span(&f);
        return 0;
    }
    FZ_CHECK(rc == 0 || why, "refused without a reason");
    return 0;
}
