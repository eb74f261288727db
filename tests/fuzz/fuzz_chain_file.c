/* libFuzzer target: a chain file from outside (a copy, a disk that lied,
 * a crash in the middle of anything), opened with bs_store_open. It may
 * only refuse; a file that opens must read (every block checked against
 * its entry and sum or refused), verify, and take a new block or refuse
 * it.
 *
 * The input edits a sound file made at start-up (40 EOS-like blocks, 30
 * irreversible): a flags byte, then patches of (where, length, bytes);
 * `where` picks the file header, the index or the log and an offset in
 * it. By the flags the header, entry and record sums are then made to
 * match again, so that the edits reach the checks behind them, and the
 * file may be cut short or grown. */
#include <fcntl.h>
#include <unistd.h>

#include "bs_gen.h"
#include "bs_layout.h"
#include "bs_store.h"
#include "fuzz.h"

#define CHAIN 0xf22ull
#define NB 40
#define CAP 64
#define FILE_SIZE (8192 + (256u << 10))

enum {
    FIX_HDR = 1u << 0,
    FIX_ENTRIES = 1u << 1,
    FIX_RECS = 1u << 2,
    RESIZE = 1u << 3,
};

static const char *path;
static uint8_t *base, *img, *blk, next_id[BS_ID_LEN];
static size_t base_len, next_len;
static struct bs_hasher *hs;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct bs_store_opts o = {.size = FILE_SIZE, .max_blocks = CAP, .chain = CHAIN,
                              .create = true};
    size_t cap = bs_gen_block_max(BS_SHAPE_EOS);
    struct bs_store *st;
    struct bs_gen g;
    uint8_t id[BS_ID_LEN];
    int fd;

    (void)argc;
    (void)argv;
    path = fz_tmp_pool("chain");
    hs = bs_hasher_new();
    blk = malloc(cap);
    FZ_CHECK(hs && blk, "no memory");
    FZ_CHECK(bs_store_open(path, &o, &st) == 0, "seed store");
    bs_gen_init(&g, BS_SHAPE_EOS, CHAIN, 1);
    for (int i = 0; i < NB; i++) {
        size_t len;
        FZ_CHECK(bs_gen_next(&g, hs, blk, cap, &len, id) == 0, "seed block");
        FZ_CHECK(bs_store_append(st, blk, len, id) == 0, "seed append");
        if (i == 20)
            FZ_CHECK(bs_store_commit(st) == 0, "seed commit");
    }
    FZ_CHECK(bs_store_commit(st) == 0, "seed commit");
    FZ_CHECK(bs_store_set_irreversible(st, 30) == 0, "seed irreversible");
    /* Three more appended, never committed: bytes past the word. */
    for (int i = 0; i < 3; i++) {
        size_t len;
        FZ_CHECK(bs_gen_next(&g, hs, blk, cap, &len, id) == 0, "seed block");
        FZ_CHECK(bs_store_append(st, blk, len, id) == 0, "seed append");
    }
    bs_store_close(st);
    /* The block that follows the 40: what an opened file is offered. */
    bs_gen_init(&g, BS_SHAPE_EOS, CHAIN, 1);
    for (int i = 0; i <= NB; i++)
        FZ_CHECK(bs_gen_next(&g, hs, blk, cap, &next_len, next_id) == 0, "next block");
    base_len = FILE_SIZE;
    base = malloc(base_len);
    img = malloc(base_len + 65536);
    fd = open(path, O_RDONLY);
    FZ_CHECK(base && img && fd >= 0 && read(fd, base, base_len) == (ssize_t)base_len,
             "seed read");
    close(fd);
    return 0;
}

static void fix_sums(uint8_t *f, size_t len, unsigned flags)
{
    struct bs_file_hdr *h = (struct bs_file_hdr *)f;

    if (len < BS_HDR_BYTES)
        return;
    if (flags & FIX_HDR)
        h->sum = bs_hdr_sum(h);
    for (uint64_t i = 0; i < CAP && BS_HDR_BYTES + (i + 1) * 64 <= len; i++) {
        struct bs_entry *e = (struct bs_entry *)(f + BS_HDR_BYTES + i * 64);
        uint64_t data_off = 8192;
        struct bs_rec_hdr r;

        if (flags & FIX_ENTRIES)
            e->sum = bs_entry_sum(e);
        /* Edits may leave a record anywhere: copied out, not cast. */
        if ((flags & FIX_RECS) && e->off < len && data_off + e->off + BS_REC_HDR <= len) {
            uint8_t *at = f + data_off + e->off;
            memcpy(&r, at, sizeof(r));
            if (r.len <= len - (data_off + e->off + BS_REC_HDR)) {
                r.sum = XXH3_64bits(at + BS_REC_HDR, r.len);
                memcpy(at, &r, sizeof(r));
            }
        }
    }
}

static void use(struct bs_store *st)
{
    uint64_t bad;
    const char *why;
    uint8_t acc = 0;

    for (uint64_t h = 0; h < bs_store_committed(st); h++) {
        const uint8_t *b;
        size_t n;
        if (bs_store_block(st, h, &b, &n) == 0)
            for (size_t i = 0; i < n; i += 61)
                acc ^= b[i];
    }
    (void)acc;
    if (bs_store_verify(st, hs, &bad, &why) < 0)
        FZ_CHECK(why && bad < bs_store_committed(st), "verify refused without a reason");
    bs_store_truncate(st, bs_store_irreversible(st));
    if (bs_store_append(st, blk, next_len, next_id) == 0)
        bs_store_commit(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    unsigned flags = fz_u8(&f);
    size_t len = base_len;
    struct bs_store *st;
    int fd;

    memcpy(img, base, base_len);
    if (flags & RESIZE) {
        int32_t d = (int16_t)fz_u16(&f);

        len = d < 0 && (size_t)-d > len ? 0 : len + d;
        if (len > base_len)
            memset(img + base_len, 0, len - base_len);
    }
    while (f.n) {
        uint8_t where = fz_u8(&f);
        size_t at, n;
        const uint8_t *b;

        switch (where % 4) {
        case 0: at = fz_u16(&f) % 512; break;                 /* file header */
        case 1: at = BS_HDR_BYTES + fz_u16(&f) % (CAP * 64); break;  /* index */
        case 2: at = 8192 + fz_u32(&f) % (256u << 10); break;        /* log */
        default: at = fz_u32(&f) % (len + 1); break;
        }
        n = fz_take(&f, fz_u8(&f) % 64, &b);
        if (at < len)
            memcpy(img + at, b, at + n <= len ? n : len - at);
    }
    fix_sums(img, len, flags);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FZ_CHECK(fd >= 0 && write(fd, img, len) == (ssize_t)len, "write image");
    close(fd);
    if (bs_store_open(path, NULL, &st) == 0) {
        use(st);
        bs_store_close(st);
    }
    return 0;
}
