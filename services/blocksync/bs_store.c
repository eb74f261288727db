/* The chain store (bs_store.h): the file's layout, its checks at open, the
 * commit protocol and the id map. */
#include "bs_store.h"

#include <errno.h>
#include <fcntl.h>
#include <libpmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "bs_layout.h"
#include "error.h"
#include "log.h"
#include "pm/pm.h"

#define BS_LOCK_WAIT_MS 200

/* id -> height, open addressing on the id's first 8 bytes. Entries are
 * never deleted: one whose height is cut off or whose index entry has
 * another id is skipped (a fork leaves a few; the table is rebuilt when
 * they pile up). */
struct id_slot {
    uint64_t key;                    /* 0: empty (a key of 0 is stored as 1) */
    uint64_t height;
};

struct bs_store {
    uint8_t *base;
    size_t map_len;
    int fd;
    bool is_pmem;
    bool read_only;
    bool failed;                     /* a flush failed, or read-only: no writes */
    struct bs_file_hdr *h;
    struct bs_entry *idx;
    uint8_t *data;
    uint64_t chain, idx_cap, data_cap;
    uint64_t committed, top;         /* blocks committed / appended */
    uint64_t tail;                   /* log bytes used by the top blocks */
    uint64_t populated;              /* log bytes prefaulted ahead of appends */
    uint64_t committed_tail;
    struct id_slot *map;
    uint64_t map_mask, map_used;
    char path[256];
};

static uint64_t id_key(const uint8_t id[BS_ID_LEN])
{
    uint64_t k;

    memcpy(&k, id, sizeof(k));
    return k ? k : 1;
}

/* ---- durability ---- */

static int persist(struct bs_store *st, const void *addr, size_t n)
{
    if (st->is_pmem) {
        pmem_persist(addr, n);
        return 0;
    }
    return pmem_msync(addr, n) < 0 ? TERN_EIO : 0;
}

static int persist_word(struct bs_store *st, uint64_t *word, uint64_t v)
{
    int rc;

    __atomic_store_n(word, v, __ATOMIC_RELEASE);
    rc = persist(st, word, sizeof(*word));
    if (rc < 0)
        st->failed = true;
    return rc;
}

/* ---- the id map ---- */

static int map_put(struct bs_store *st, const uint8_t id[BS_ID_LEN], uint64_t height);

static int map_grow(struct bs_store *st)
{
    uint64_t cap = st->map ? (st->map_mask + 1) * 2 : 1024;
    struct id_slot *old = st->map;

    /* Grown from the index rather than from the old table: stale slots
     * (cut-off heights) are left behind. */
    while (cap < 2 * st->top + 16)
        cap *= 2;
    st->map = calloc(cap, sizeof(*st->map));
    if (!st->map) {
        st->map = old;
        return TERN_ENOMEM;
    }
    st->map_mask = cap - 1;
    st->map_used = 0;
    free(old);
    for (uint64_t h = 0; h < st->top; h++)
        map_put(st, st->idx[h].id, h);
    return 0;
}

static int map_put(struct bs_store *st, const uint8_t id[BS_ID_LEN], uint64_t height)
{
    uint64_t key = id_key(id);

    if (!st->map || 2 * (st->map_used + 1) > st->map_mask + 1) {
        int rc = map_grow(st);
        if (rc < 0)
            return rc;
        if (height < st->top)    /* map_grow put it in already */
            return 0;
    }
    for (uint64_t i = XXH3_64bits(&key, sizeof(key)) & st->map_mask;; i = (i + 1) & st->map_mask) {
        if (!st->map[i].key) {
            st->map[i] = (struct id_slot){.key = key, .height = height};
            st->map_used++;
            return 0;
        }
        if (st->map[i].key == key && st->map[i].height == height)
            return 0;
    }
}

int64_t bs_store_find(const struct bs_store *st, const uint8_t id[BS_ID_LEN])
{
    uint64_t key = id_key(id);

    if (!st->map)
        return TERN_ENOENT;
    for (uint64_t i = XXH3_64bits(&key, sizeof(key)) & st->map_mask; st->map[i].key;
         i = (i + 1) & st->map_mask) {
        uint64_t h = st->map[i].height;

        if (st->map[i].key == key && h < st->top && !memcmp(st->idx[h].id, id, BS_ID_LEN))
            return (int64_t)h;
    }
    return TERN_ENOENT;
}

/* ---- create and open ---- */

static int create_file(const char *path, const struct bs_store_opts *o)
{
    uint64_t size = o->size ? o->size : 1ull << 30;
    uint64_t cap = o->max_blocks ? o->max_blocks : size / 2048;
    struct bs_file_hdr h = {.layout = BS_LAYOUT, .hdr_size = BS_HDR_BYTES, .chain = o->chain};
    char tmp[4096];
    size_t len;
    int is_pmem;
    void *base;

    if (!o->chain || cap == 0)
        return TERN_EINVAL;
    h.idx_off = BS_HDR_BYTES;
    h.idx_cap = cap;
    h.data_off = (BS_HDR_BYTES + cap * sizeof(struct bs_entry) + 4095) & ~4095ull;
    if (size < h.data_off + (64u << 10))
        return TERN_EINVAL;
    h.data_cap = (size - h.data_off) & ~(uint64_t)(BS_REC_ALIGN - 1);
    h.size = h.data_off + h.data_cap;
    memcpy(h.magic, BS_MAGIC, sizeof(h.magic));
    if (getrandom(h.uuid, sizeof(h.uuid), 0) != sizeof(h.uuid))
        return TERN_EIO;
    h.created = (uint64_t)time(NULL);
    h.sum = bs_hdr_sum(&h);

    /* Made under another name and renamed: a crash while creating leaves
     * no half-made chain at `path`. The file starts as a hole. */
    if (snprintf(tmp, sizeof(tmp), "%s.creating", path) >= (int)sizeof(tmp))
        return TERN_EINVAL;
    unlink(tmp);
    base = pmem_map_file(tmp, h.size, PMEM_FILE_CREATE | PMEM_FILE_EXCL, 0600, &len, &is_pmem);
    if (!base) {
        tern_log(TERN_LOG_ERROR, "chain", "create %s: %s", tmp, strerror(errno));
        return errno == ENOSPC ? TERN_ENOSPC : errno == EACCES ? TERN_EACCES : TERN_EIO;
    }
    memcpy(base, &h, sizeof(h));
    if (is_pmem)
        pmem_persist(base, sizeof(h));
    else
        pmem_msync(base, sizeof(h));
    pmem_unmap(base, len);
    if (rename(tmp, path) < 0) {
        unlink(tmp);
        return TERN_EIO;
    }
    /* Blocks committed into the file must not outlive its name. */
    return pm_sync_dir_of(path);
}

static int corrupt(const struct bs_store *st, uint64_t off, const char *what, uint64_t height)
{
    if (height == UINT64_MAX)
        tern_log(TERN_LOG_ERROR, "chain", "%s: offset %llu: %s", st->path,
                 (unsigned long long)off, what);
    else
        tern_log(TERN_LOG_ERROR, "chain", "%s: offset %llu (height %llu): %s", st->path,
                 (unsigned long long)off, (unsigned long long)height, what);
    return TERN_ECORRUPT;
}

static int check_hdr(struct bs_store *st, uint64_t file_len)
{
    const struct bs_file_hdr *h = st->h;

    if (memcmp(h->magic, BS_MAGIC, sizeof(h->magic)))
        return corrupt(st, 0, "not a tern chain file", UINT64_MAX);
    if (h->sum != bs_hdr_sum(h))
        return corrupt(st, 0, "file header checksum mismatch", UINT64_MAX);
    if (h->layout != BS_LAYOUT)
        return corrupt(st, 0, "unknown layout", UINT64_MAX);
    if (h->hdr_size != BS_HDR_BYTES || h->size != file_len || h->idx_off != BS_HDR_BYTES ||
        !h->idx_cap || h->idx_cap > (h->size - BS_HDR_BYTES) / sizeof(struct bs_entry) ||
        h->data_off < h->idx_off + h->idx_cap * sizeof(struct bs_entry) ||
        h->data_off % 4096 || h->data_off > h->size || h->data_cap > h->size - h->data_off ||
        h->data_cap % BS_REC_ALIGN)
        return corrupt(st, 0, "file header sizes do not add up", UINT64_MAX);
    if (h->committed > h->idx_cap)
        return corrupt(st, offsetof(struct bs_file_hdr, committed),
                       "committed word past the index", UINT64_MAX);
    if (h->irreversible > h->committed)
        return corrupt(st, offsetof(struct bs_file_hdr, irreversible),
                       "irreversible word past the committed one", UINT64_MAX);
    return 0;
}

/* Every entry below the committed word: its sum, its height, its record
 * right after the one before and inside the log. The last record is read
 * whole (the one a crash is likeliest to have hurt, were the commit
 * protocol broken). */
static int check_index(struct bs_store *st)
{
    uint64_t next = 0;

    for (uint64_t h = 0; h < st->committed; h++) {
        const struct bs_entry *e = &st->idx[h];
        uint64_t at = st->h->idx_off + h * sizeof(*e);

        if (e->sum != bs_entry_sum(e))
            return corrupt(st, at, "index entry checksum mismatch", h);
        if (e->height != h)
            return corrupt(st, at, "index entry of another height", h);
        if (e->off != next || e->len < BS_HDR_SIZE || e->len > BS_BLOCK_MAX ||
            bs_rec_size(e->len) > st->data_cap - e->off)
            return corrupt(st, at, "index entry points outside its place in the log", h);
        next = e->off + bs_rec_size(e->len);
        map_put(st, e->id, h);
    }
    st->tail = st->committed_tail = next;
    if (st->committed) {
        const uint8_t *b;
        size_t n;
        int rc = bs_store_block(st, st->committed - 1, &b, &n);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int lock_file(struct bs_store *st)
{
    int how = st->read_only ? LOCK_SH : LOCK_EX;

    for (int waited = 0; flock(st->fd, how | LOCK_NB) < 0; waited++) {
        if (errno == EWOULDBLOCK && waited < BS_LOCK_WAIT_MS) {
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
            continue;
        }
        tern_log(TERN_LOG_ERROR, "chain", "%s is in use by another process", st->path);
        return TERN_EBUSY;
    }
    return 0;
}

int bs_store_open(const char *path, const struct bs_store_opts *o, struct bs_store **out)
{
    struct bs_store_opts none = {0};
    struct bs_store *st;
    struct stat sb;
    int is_pmem, rc;

    *out = NULL;
    if (!o)
        o = &none;
    if (access(path, F_OK) < 0) {
        if (errno != ENOENT || !o->create)
            return errno == ENOENT ? TERN_ENOENT : TERN_EIO;
        rc = create_file(path, o);
        if (rc < 0)
            return rc;
    }
    st = calloc(1, sizeof(*st));
    if (!st)
        return TERN_ENOMEM;
    snprintf(st->path, sizeof(st->path), "%s", path);
    st->read_only = o->read_only;
    st->failed = o->read_only;
    st->fd = open(path, (o->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (st->fd < 0) {
        rc = errno == EACCES ? TERN_EACCES : TERN_EIO;
        goto fail;
    }
    if ((rc = lock_file(st)) < 0)
        goto fail;
    if (fstat(st->fd, &sb) < 0 || (uint64_t)sb.st_size < BS_HDR_BYTES) {
        rc = corrupt(st, 0, "too short to be a chain file", UINT64_MAX);
        goto fail;
    }
    if (st->read_only) {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, st->fd, 0);
        st->base = m == MAP_FAILED ? NULL : m;
        st->map_len = (size_t)sb.st_size;
        is_pmem = 0;
    } else {
        st->base = pmem_map_file(path, 0, 0, 0, &st->map_len, &is_pmem);
    }
    if (!st->base) {
        tern_log(TERN_LOG_ERROR, "chain", "map %s: %s", path, strerror(errno));
        rc = TERN_EIO;
        goto fail;
    }
    st->is_pmem = is_pmem != 0;
    st->h = (struct bs_file_hdr *)st->base;
    if ((rc = check_hdr(st, st->map_len)) < 0)
        goto fail;
    if (o->chain && o->chain != st->h->chain) {
        tern_log(TERN_LOG_ERROR, "chain", "%s holds chain %llx, not %llx", path,
                 (unsigned long long)st->h->chain, (unsigned long long)o->chain);
        rc = TERN_EINVAL;
        goto fail;
    }
    st->chain = st->h->chain;
    st->idx = (struct bs_entry *)(st->base + st->h->idx_off);
    st->idx_cap = st->h->idx_cap;
    st->data = st->base + st->h->data_off;
    st->data_cap = st->h->data_cap;
    st->committed = st->top = st->h->committed;
    if ((rc = check_index(st)) < 0)
        goto fail;
    *out = st;
    return 0;
fail:
    bs_store_close(st);
    return rc;
}

void bs_store_close(struct bs_store *st)
{
    if (!st)
        return;
    if (st->base)
        munmap(st->base, st->map_len);
    if (st->fd >= 0)
        close(st->fd);
    free(st->map);
    free(st);
}

void bs_store_info(const struct bs_store *st, struct bs_store_info *info)
{
    *info = (struct bs_store_info){.chain = st->chain, .committed = st->committed,
                                   .irreversible = st->h->irreversible,
                                   .pending = st->top - st->committed, .idx_cap = st->idx_cap,
                                   .data_used = st->committed_tail, .data_cap = st->data_cap,
                                   .size = st->map_len, .is_pmem = st->is_pmem};
}

uint64_t bs_store_committed(const struct bs_store *st) { return st->committed; }
uint64_t bs_store_top(const struct bs_store *st) { return st->top; }
uint64_t bs_store_irreversible(const struct bs_store *st) { return st->h->irreversible; }
uint64_t bs_store_chain(const struct bs_store *st) { return st->chain; }

int bs_store_id(const struct bs_store *st, uint64_t height, uint8_t id[BS_ID_LEN])
{
    if (height >= st->top)
        return TERN_ENOENT;
    memcpy(id, st->idx[height].id, BS_ID_LEN);
    return 0;
}

void bs_store_prefault(struct bs_store *st)
{
    uint64_t n = (st->committed_tail + 4095) & ~4095ull;

    if (n)
        madvise(st->data, n, MADV_POPULATE_READ);
}

const void *bs_store_base(const struct bs_store *st) { return st->base; }
size_t bs_store_map_len(const struct bs_store *st) { return st->map_len; }

/* ---- reading ---- */

int bs_store_block(const struct bs_store *st, uint64_t height, const uint8_t **block,
                   size_t *len)
{
    const struct bs_entry *e;
    const struct bs_rec_hdr *r;

    if (height >= st->top)
        return TERN_ENOENT;
    e = &st->idx[height];
    r = (const struct bs_rec_hdr *)(st->data + e->off);
    if (r->magic != BS_REC_MAGIC || r->len != e->len || r->height != height)
        return corrupt(st, st->h->data_off + e->off, "record header does not match the index",
                       height);
    if (r->sum != XXH3_64bits(r + 1, r->len))
        return corrupt(st, st->h->data_off + e->off, "record checksum mismatch", height);
    *block = (const uint8_t *)(r + 1);
    *len = r->len;
    return 0;
}

int bs_store_span_len(const struct bs_store *st, uint64_t from, uint64_t to, uint64_t *len)
{
    if (from > to || to > st->top)
        return TERN_ENOENT;
    if (from == to) {
        *len = 0;
        return 0;
    }
    *len = st->idx[to - 1].off + bs_rec_size(st->idx[to - 1].len) - st->idx[from].off;
    return 0;
}

int bs_store_span(const struct bs_store *st, uint64_t from, uint64_t to, const uint8_t **span,
                  size_t *len)
{
    uint64_t n;
    int rc = bs_store_span_len(st, from, to, &n);

    if (rc < 0)
        return rc;
    *span = from < st->top ? st->data + st->idx[from].off : st->data + st->tail;
    *len = (size_t)n;
    return 0;
}

int bs_span_walk(const uint8_t *span, size_t len, uint64_t from, uint64_t to,
                 const uint8_t **blocks, uint32_t *lens, uint64_t *bad, const char **why)
{
    size_t at = 0;

    for (uint64_t h = from; h < to; h++) {
        struct bs_rec_hdr r;
        struct bs_block b;
        uint64_t size;

        *bad = h;
        if (len - at < BS_REC_HDR) {
            *why = "range cut short";
            return TERN_EPROTO;
        }
        memcpy(&r, span + at, sizeof(r));
        if (r.magic != BS_REC_MAGIC || r.zero) {
            *why = "not a block record";
            return TERN_EPROTO;
        }
        if (r.height != h) {
            *why = "blocks out of order";
            return TERN_EPROTO;
        }
        size = bs_rec_size(r.len);
        if (r.len > BS_BLOCK_MAX || size > len - at) {
            *why = "range cut short";
            return TERN_EPROTO;
        }
        if (bs_block_parse(span + at + BS_REC_HDR, r.len, &b, why) < 0)
            return TERN_EPROTO;
        if (b.h.height != h) {
            *why = "blocks out of order";
            return TERN_EPROTO;
        }
        blocks[h - from] = span + at + BS_REC_HDR;
        lens[h - from] = r.len;
        at += size;
    }
    if (at != len) {
        *bad = to;
        *why = "bytes past the range's last block";
        return TERN_EPROTO;
    }
    return 0;
}

/* ---- writing ---- */

#define PREFAULT_STEP (16u << 20)

/* A fresh log takes a page fault per page as it fills (a trap, a page
 * cleared and mapped, one at a time): asked for 16 MiB at a time ahead of
 * the appends, the kernel does the same work in one call. Where it cannot
 * (an old kernel), the faults happen as before. */
static void prefault(struct bs_store *st, uint64_t need)
{
    uint64_t from, n;

    if (need <= st->populated)
        return;
    from = st->populated > st->tail ? st->populated : st->tail & ~4095ull;
    n = (need - from + PREFAULT_STEP + 4095) & ~4095ull;
    if (from + n > st->data_cap)
        n = st->data_cap - from;
    if (madvise(st->data + from, n, MADV_POPULATE_WRITE) < 0)
        st->populated = UINT64_MAX;  /* not here: stop asking */
    else
        st->populated = from + n;
}

int bs_store_append(struct bs_store *st, const uint8_t *block, size_t len,
                    const uint8_t id[BS_ID_LEN])
{
    struct bs_rec_hdr r = {.magic = BS_REC_MAGIC, .len = (uint32_t)len};
    struct bs_block b;
    struct bs_entry *e;
    const char *why;
    uint8_t *at;
    uint64_t size;
    int rc;

    if (st->failed)
        return st->read_only ? TERN_EACCES : TERN_EIO;
    /* The header and the length only: whoever hands a block over parsed
     * and checked it (the syncer, a producer's handler), and the walk of
     * its transactions is theirs. */
    if (bs_header_decode(block, len, &b.h, &why) < 0 || len != BS_HDR_SIZE + b.h.body_len)
        return TERN_EPROTO;
    if (b.h.height != st->top || b.h.chain != st->chain)
        return TERN_EINVAL;
    if (st->top ? memcmp(b.h.parent, st->idx[st->top - 1].id, BS_ID_LEN)
                : memcmp(b.h.parent, (uint8_t[BS_ID_LEN]){0}, BS_ID_LEN))
        return TERN_EINVAL;
    size = bs_rec_size(len);
    if (st->top >= st->idx_cap || size > st->data_cap - st->tail)
        return TERN_ENOSPC;
    r.height = st->top;
    r.sum = XXH3_64bits(block, len);
    at = st->data + st->tail;
    prefault(st, st->tail + size);
    if (st->is_pmem) {
        pmem_memcpy_nodrain(at, &r, sizeof(r));
        pmem_memcpy_nodrain(at + sizeof(r), block, len);
        pmem_memset_nodrain(at + sizeof(r) + len, 0, size - sizeof(r) - len);
    } else {
        memcpy(at, &r, sizeof(r));
        memcpy(at + sizeof(r), block, len);
        memset(at + sizeof(r) + len, 0, size - sizeof(r) - len);
    }
    e = &st->idx[st->top];
    *e = (struct bs_entry){.off = st->tail, .len = (uint32_t)len, .height = st->top};
    memcpy(e->id, id, BS_ID_LEN);
    e->sum = bs_entry_sum(e);
    rc = map_put(st, id, st->top);
    if (rc < 0)
        return rc;
    st->tail += size;
    st->top++;
    return 0;
}

int bs_store_commit(struct bs_store *st)
{
    int rc;

    if (st->failed)
        return st->read_only ? TERN_EACCES : TERN_EIO;
    if (st->top == st->committed)
        return 0;
    if (st->is_pmem) {
        /* Records went in with non-temporal stores; the entries need
         * flushing; one drain covers both. */
        pmem_flush(&st->idx[st->committed], (st->top - st->committed) * sizeof(struct bs_entry));
        pmem_drain();
    } else {
        rc = persist(st, st->data + st->committed_tail, st->tail - st->committed_tail);
        if (rc == 0)
            rc = persist(st, &st->idx[st->committed],
                         (st->top - st->committed) * sizeof(struct bs_entry));
        if (rc < 0) {
            st->failed = true;
            return rc;
        }
    }
    rc = persist_word(st, &st->h->committed, st->top);
    if (rc < 0)
        return rc;
    st->committed = st->top;
    st->committed_tail = st->tail;
    return 0;
}

int bs_store_truncate(struct bs_store *st, uint64_t count)
{
    int rc;

    if (st->failed)
        return st->read_only ? TERN_EACCES : TERN_EIO;
    if (count < st->h->irreversible)
        return TERN_ERANGE;
    if (count >= st->top)
        return 0;
    if (count < st->committed) {
        rc = persist_word(st, &st->h->committed, count);
        if (rc < 0)
            return rc;
        st->committed = count;
    }
    st->top = count;
    st->tail = count ? st->idx[count - 1].off + bs_rec_size(st->idx[count - 1].len) : 0;
    if (st->populated != UINT64_MAX && st->populated > st->tail)
        st->populated = st->tail;
    st->committed_tail = st->tail;
    /* Cut-off heights stay in the map as stale slots; rebuild it once they
     * are as many as the live ones. */
    if (st->map_used > 2 * st->top + 1024)
        (void)map_grow(st);          /* without memory, the stale slots stay */
    return 0;
}

int bs_store_set_irreversible(struct bs_store *st, uint64_t count)
{
    if (st->failed)
        return st->read_only ? TERN_EACCES : TERN_EIO;
    if (count > st->committed)
        return TERN_EINVAL;
    if (count <= st->h->irreversible)
        return 0;
    return persist_word(st, &st->h->irreversible, count);
}

int bs_store_verify(const struct bs_store *st, struct bs_hasher *hs, uint64_t *bad,
                    const char **why)
{
    uint8_t id[BS_ID_LEN], prev[BS_ID_LEN];

    for (uint64_t h = 0; h < st->committed; h++) {
        const uint8_t *p;
        struct bs_block b;
        size_t n;
        int rc;

        *bad = h;
        rc = bs_store_block(st, h, &p, &n);
        if (rc < 0) {
            *why = "record unreadable (see the log)";
            return TERN_ECORRUPT;
        }
        if (bs_block_parse(p, n, &b, why) < 0)
            return TERN_ECORRUPT;
        rc = bs_block_check(hs, &b, st->chain, h ? prev : NULL, h - 1, id);
        if (rc < 0)
            return rc;
        if (rc != BS_VALID) {
            *why = bs_verdict_name(rc);
            return TERN_ECORRUPT;
        }
        if (memcmp(id, st->idx[h].id, BS_ID_LEN)) {
            *why = "id in the index is not the block's";
            return TERN_ECORRUPT;
        }
        memcpy(prev, id, BS_ID_LEN);
    }
    return 0;
}
