/* The backup's ring (repl_ring.h): the file, the grants, and taking
 * frames into the store. */
#include <errno.h>
#include <fcntl.h>
#include <libpmem.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"
#include "repl_internal.h"

#define RING_MAGIC 0x31676e69726e7274ull    /* "trnring1" */

/* The header page as stored. Everything but `head` is written at a grant
 * and summed; `head` moves alone, in its own line. */
struct ring_hdr {
    uint64_t magic;
    uint32_t size;
    uint32_t reserved;
    uint64_t gen;
    uint64_t epoch;                 /* the grant's (0: none) */
    uint64_t sum;                   /* XXH3-64 of the fields above */
};

struct repl_ring {
    int fd;
    uint8_t *base;                  /* header page, then data */
    size_t map_len;
    uint32_t size;
    bool pmem;
    uint64_t gen, epoch;            /* the grant's; the truth is here, not in the file */
    uint64_t head;
    struct tern_rpc_mr *hdr_mr, *data_mr;
    struct tern_log_limit said;
};

/* The header with sum 0, then the batch seeded with that. */
static uint64_t frame_sum(const struct repl_frame *f, const volatile uint8_t *batch)
{
    struct repl_frame h = *f;

    h.sum = 0;
    return XXH3_64bits_withSeed((const void *)batch, h.len, XXH3_64bits(&h, sizeof(h)));
}

void repl_frame_seal(void *dst, uint64_t gen, uint64_t at, uint32_t kind, uint32_t len)
{
    struct repl_frame f = {.gen = gen, .at = at, .len = len, .kind = kind};
    struct repl_frame *out = dst;

    f.sum = frame_sum(&f, (const uint8_t *)dst + sizeof(f));
    out->gen = f.gen;
    out->len = f.len;
    out->kind = f.kind;
    out->sum = f.sum;
    __atomic_store_n(&out->at, f.at, __ATOMIC_RELEASE);
}

int repl_frame_next(const volatile uint8_t *data, uint32_t size, uint64_t gen, uint64_t head,
                    const uint8_t **batch, uint32_t *len, uint64_t *next)
{
    uint64_t off = head % size, room = size - off;
    const volatile struct repl_frame *src = (const volatile struct repl_frame *)(data + off);
    struct repl_frame f;

    if ((head & (REPL_FRAME_ALIGN - 1)) || room < sizeof(f))
        return 0;
    f.at = __atomic_load_n(&src->at, __ATOMIC_ACQUIRE);
    if (f.at != head)
        return 0;
    f.gen = src->gen;
    f.len = src->len;
    f.kind = src->kind;
    f.sum = src->sum;
    if (f.gen != gen)
        return 0;
    if (f.kind == REPL_FRAME_WRAP) {
        if (f.len)
            return 0;
        *len = 0;
        *next = head + room;
    } else if (f.kind == REPL_FRAME_BATCH) {
        if (f.len < sizeof(struct repl_batch) || f.len > room - sizeof(f))
            return 0;
        *len = f.len;
        *next = head + repl_frame_span(f.len);
    } else {
        return 0;
    }
    if (frame_sum(&f, data + off + sizeof(f)) != f.sum)
        return 0;
    *batch = (const uint8_t *)data + off + sizeof(f);
    return 1;
}

/* ---- the file ---- */

static struct ring_hdr *hdr_of(struct repl_ring *g)
{
    return (struct ring_hdr *)g->base;
}

static volatile uint64_t *head_word(struct repl_ring *g)
{
    return (volatile uint64_t *)(g->base + REPL_RING_HEAD_OFF);
}

static void persist(struct repl_ring *g, const void *at, size_t n)
{
    if (g->pmem)
        pmem_persist(at, n);
    else if (pmem_msync(at, n) < 0 && tern_log_allow(&g->said))
        tern_log(TERN_LOG_ERROR, "repl", "ring: msync: %s", strerror(errno));
}

static uint64_t hdr_sum(const struct ring_hdr *h)
{
    return XXH3_64bits(h, offsetof(struct ring_hdr, sum));
}

static void write_hdr(struct repl_ring *g)
{
    struct ring_hdr *h = hdr_of(g);

    *h = (struct ring_hdr){.magic = RING_MAGIC, .size = g->size, .gen = g->gen,
                           .epoch = g->epoch};
    h->sum = hdr_sum(h);
    persist(g, h, sizeof(*h));
}

static void publish_head(struct repl_ring *g)
{
    __atomic_store_n(head_word(g), g->head, __ATOMIC_RELEASE);
    persist(g, (const void *)head_word(g), sizeof(uint64_t));
}

static void unregister(struct repl_ring *g)
{
    if (g->hdr_mr)
        tern_rpc_mr_dereg(g->hdr_mr);
    if (g->data_mr)
        tern_rpc_mr_dereg(g->data_mr);
    g->hdr_mr = g->data_mr = NULL;
}

int repl_ring_open(struct repl *r, const char *path, uint32_t size)
{
    struct repl_ring *g = calloc(1, sizeof(*g));
    struct stat st;
    struct ring_hdr h;
    int is_pmem = 0;

    if (!g)
        return TERN_ENOMEM;
    size = size ? size : REPL_RING_DEFAULT;
    if (size < REPL_RING_MIN)
        size = REPL_RING_MIN;
    size &= ~(REPL_RING_HDR - 1);
    g->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (g->fd < 0 || fstat(g->fd, &st) < 0)
        goto io;
    /* A ring of another size (the option changed) is taken as it is: its
     * frames may be owed to the store. */
    if (st.st_size >= (off_t)(REPL_RING_HDR + REPL_RING_MIN) &&
        !((st.st_size - REPL_RING_HDR) & (REPL_RING_HDR - 1)) &&
        st.st_size - REPL_RING_HDR <= (off_t)UINT32_MAX)
        size = (uint32_t)(st.st_size - REPL_RING_HDR);
    else if (ftruncate(g->fd, 0) < 0 || posix_fallocate(g->fd, 0, REPL_RING_HDR + size) != 0)
        goto io;
    g->size = size;
    g->map_len = REPL_RING_HDR + (size_t)size;
    g->base = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
    if (g->base == MAP_FAILED) {
        g->base = NULL;
        goto io;
    }
    is_pmem = pmem_is_pmem(g->base, g->map_len);
    g->pmem = is_pmem != 0;
    r->ring = g;
    memcpy(&h, g->base, sizeof(h));
    if (h.magic == RING_MAGIC && h.sum == hdr_sum(&h) && h.size == size) {
        g->gen = h.gen;
        g->epoch = h.epoch;
        g->head = __atomic_load_n(head_word(g), __ATOMIC_ACQUIRE);
        if (g->head & (REPL_FRAME_ALIGN - 1))
            g->head = 0;
    } else {
        if (h.magic)
            tern_log(TERN_LOG_ERROR, "repl", "%s: the ring's header in %s is damaged: "
                     "frames it held are not taken", r->shard, path);
        if (getrandom(&g->gen, sizeof(g->gen), 0) != sizeof(g->gen))
            g->gen = tern_now_ns();
        write_hdr(g);
        publish_head(g);
    }
    return repl_ring_drain(r);
io:
    tern_log(TERN_LOG_ERROR, "repl", "%s: ring %s: %s", r->shard, path, strerror(errno));
    if (g->fd >= 0)
        close(g->fd);
    free(g);
    return TERN_EIO;
}

void repl_ring_close(struct repl *r)
{
    struct repl_ring *g = r->ring;

    if (!g)
        return;
    unregister(g);
    munmap(g->base, g->map_len);
    close(g->fd);
    free(g);
    r->ring = NULL;
}

/* ---- taking frames ---- */

/* A frame whose batch no honest primary writes: said, and the grant
 * ended (the primary falls back to APPEND, which says what is wrong). */
static void lying(struct repl *r, const char *why)
{
    struct repl_ring *g = r->ring;

    if (tern_log_allow(&g->said))
        tern_log(TERN_LOG_ERROR, "repl", "%s: a ring frame at %llu %s: grant ended",
                 r->shard, (unsigned long long)g->head, why);
    r->st_ring_refused++;
    g->epoch = 0;
}

int repl_ring_drain(struct repl *r)
{
    struct repl_ring *g = r->ring;
    uint8_t *data;
    bool moved = false, applied = false;
    int rc = 0;

    if (!g || !g->epoch)
        return 0;
    data = g->base + REPL_RING_HDR;
    for (;;) {
        const uint8_t *batch;
        uint32_t len;
        uint64_t next;
        struct repl_batch b;
        struct repl_apply_ctx t = {.r = r};

        if (repl_frame_next(data, g->size, g->gen, g->head, &batch, &len, &next) != 1)
            break;
        if (len) {
            if (repl_batch_walk(batch, len, &b, NULL, NULL) < 0) {
                lying(r, "holds a malformed batch");
                break;
            }
            if (strcmp(b.shard, r->shard) || b.epoch != g->epoch) {
                lying(r, "names another shard or epoch");
                break;
            }
            /* An APPEND still on its way fills the gap: wait for it. */
            if (b.prev > r->position)
                break;
            rc = repl_batch_walk(batch, len, NULL, repl_take_rec, &t);
            if (t.rc < 0 || rc < 0) {
                rc = t.rc < 0 ? t.rc : rc;
                break;
            }
            applied = applied || b.n;
            if (b.epoch == r->seen && r->position >= b.commit && !r->copying)
                r->synced = true;
        }
        g->head = next;
        moved = true;
    }
    if (applied) {
        int src = r->ops->sync(r->ctx);

        if (src < 0) {
            /* Nothing taken counts: the frames stay for the next pass. */
            r->position = r->ops->position(r->ctx);
            return src;
        }
    }
    if (moved) {
        publish_head(g);
        if (r->copying && r->copy_ended && r->position >= r->copy_high)
            repl_state_save(r, r->seen, false);
    }
    return rc;
}

void repl_ring_retire(struct repl *r)
{
    struct repl_ring *g = r->ring;

    if (!g)
        return;
    repl_ring_drain(r);
    unregister(g);
    if (!g->epoch)
        return;
    g->epoch = 0;
    g->gen++;
    write_hdr(g);
}

int repl_ring_grant(struct repl *r, const struct tern_session *s, uint64_t epoch,
                    struct repl_ring_grant *out)
{
    struct repl_ring *g = r->ring;
    int rc;

    if (!g)
        return TERN_ENOTSUP;
    repl_ring_retire(r);
    if (getrandom(&g->gen, sizeof(g->gen), 0) != sizeof(g->gen))
        g->gen = g->gen * 6364136223846793005ull + tern_now_ns();
    g->epoch = epoch;
    write_hdr(g);
    rc = tern_rpc_mr_reg(r->h->ep, g->base, REPL_RING_HDR, g->fd, 0,
                         TERN_TP_ACCESS_REMOTE_READ, &g->hdr_mr);
    if (rc == 0)
        rc = tern_rpc_mr_reg(r->h->ep, g->base + REPL_RING_HDR, g->size, g->fd, REPL_RING_HDR,
                             TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE,
                             &g->data_mr);
    memset(out, 0, sizeof(*out));
    if (rc == 0)
        rc = tern_rpc_mr_rkey(g->hdr_mr, s, &out->hdr);
    if (rc == 0)
        rc = tern_rpc_mr_rkey(g->data_mr, s, &out->data);
    if (rc < 0) {
        unregister(g);
        g->epoch = 0;
        return rc;
    }
    out->epoch = r->seen;
    out->position = r->position;
    out->gen = g->gen;
    out->head = g->head;
    out->size = g->size;
    out->flags = g->pmem ? REPL_RING_PMEM : 0;
    return 0;
}
