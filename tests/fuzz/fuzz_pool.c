/* A pool file from outside (a copy, a disk that lied, a lessee that wrote
 * what it liked into its segment): checked with pm_check and opened with
 * kvs_open (pm_open, pm_recover, the index rebuilt). Neither may crash,
 * only refuse, and a pool that opens must serve.
 *
 * The input edits a sound pool made at start-up (values, tombstones, a
 * record rewritten in place, a leased segment): a flags byte, then patches
 * of (where, length, bytes). `where` picks the file header or a segment
 * and an offset in it, or any offset of the file. By the flags, the
 * header, segment and record checksums are then made to match again, so
 * that the edits reach the checks behind the checksums; the file may also
 * be cut short or grown. */
#include <fcntl.h>
#include <unistd.h>

#include "fuzz.h"
#include "kv/kv_store.h"
#include "pm/pm.h"
#include "pm/pm_layout.h"

#define SEG_SIZE (64u * 1024)
#define N_SEGS 6u
#define POOL_SIZE (PM_HDR_SIZE + N_SEGS * SEG_SIZE)

enum {
    FIX_HDR = 1u << 0,      /* the file header's sum */
    FIX_SEGS = 1u << 1,     /* segment header sums and commit words */
    FIX_RECS = 1u << 2,     /* record sums */
    RESIZE = 1u << 3,       /* cut or grow the file by an amount that follows */
};

static char path[64];
static uint8_t base[POOL_SIZE], *img;

static void put(struct kvs *s, const char *k, const char *v)
{
    int rc = kvs_put(s, k, strlen(k), v, strlen(v), TERN_KV_SYNC, NULL);

    FZ_CHECK(rc == 0, "seed put %s: %d", k, rc);
}

/* A record into a leased segment, as a lessee writes it. */
static void lease_put(struct kvs *s, const char *k, const char *v)
{
    struct pm_pool *p = kvs_pool(s);
    uint32_t seg, off;
    uint64_t intent = 1ull << 63 | 7;
    struct pm_rec r = {.val_len = (uint32_t)strlen(v), .version = intent,
                       .key_len = (uint16_t)strlen(k), .type = PM_VALUE};
    uint8_t *at;
    bool ended = false;
    int rc = kvs_lease(s, &seg);

    FZ_CHECK(rc == 0, "seed lease: %d", rc);
    off = pm_lease_next(p, seg);
    at = (uint8_t *)pm_base(p) + pm_seg_file_off(p, seg) + off;
    memcpy(at, &r, sizeof(r));
    memcpy(at + sizeof(r), k, r.key_len);
    memcpy(at + sizeof(r) + r.key_len, v, r.val_len);
    ((struct pm_rec *)at)->sum = pm_rec_sum_of((struct pm_rec *)at);
    rc = kvs_lease_put(s, seg, off, intent, 0, UINT32_MAX, TERN_KV_SYNC, NULL, &ended);
    FZ_CHECK(rc == 0 && !ended, "seed lease put: %d", rc);
}

static void remove_file(void)
{
    unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct kvs_opts o = {.pool_size = POOL_SIZE, .seg_size = SEG_SIZE};
    struct kvs *s;
    char k[16], v[64];
    int fd, rc;

    snprintf(path, sizeof(path), "/dev/shm/tern-fuzz-pool.%d", (int)getpid());
    o.path = path;
    unlink(path);
    atexit(remove_file);
    rc = kvs_open(&o, &s);
    FZ_CHECK(rc == 0, "seed pool: %d", rc);
    for (int i = 0; i < 40; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        snprintf(v, sizeof(v), "value %d %.*s", i, i, "..................................");
        put(s, k, v);
    }
    for (int i = 0; i < 40; i += 3) {
        snprintf(k, sizeof(k), "key%d", i);
        FZ_CHECK(kvs_del(s, k, strlen(k), TERN_KV_SYNC, NULL) == 0, "seed del");
    }
    put(s, "key1", "value 1 rewritten");        /* same size: in place */
    lease_put(s, "leased", "written by a lessee");
    kvs_close(s);
    fd = open(path, O_RDONLY);
    FZ_CHECK(fd >= 0 && read(fd, base, sizeof(base)) == (ssize_t)sizeof(base), "seed read");
    close(fd);
    img = malloc(POOL_SIZE + 65536);
    FZ_CHECK(img, "no memory");
    return 0;
}

static void fix_records(uint8_t *seg, uint32_t first, uint32_t used)
{
    for (uint64_t off = first; off + sizeof(struct pm_rec) <= PM_SEG_HDR + (uint64_t)used;) {
        struct pm_rec *r = (struct pm_rec *)(seg + off);
        uint64_t need = (sizeof(*r) + (uint64_t)r->key_len + r->val_len + 7) & ~7ull;
        uint64_t span = r->slot ? r->slot : need;

        if (span < sizeof(*r) || (span & 7) || need > span ||
            off + span > PM_SEG_HDR + (uint64_t)used)
            return;
        r->sum = pm_rec_sum_of(r);
        off += span;
    }
}

static void fix_sums(uint8_t *f, size_t len, unsigned flags)
{
    struct pm_file_hdr *h = (struct pm_file_hdr *)f;

    if (len < PM_HDR_SIZE)
        return;
    if (flags & FIX_HDR)
        h->sum = pm_sum(h, offsetof(struct pm_file_hdr, sum));
    for (uint32_t s = 0; s < N_SEGS && PM_HDR_SIZE + (uint64_t)(s + 1) * SEG_SIZE <= len; s++) {
        uint8_t *seg = f + PM_HDR_SIZE + (size_t)s * SEG_SIZE;
        struct pm_seg_hdr *sh = (struct pm_seg_hdr *)seg;
        uint32_t used = (uint32_t)sh->commit;

        if (!sh->seq)
            continue;
        if (flags & FIX_SEGS) {
            sh->sum = pm_seg_hdr_sum(sh);
            sh->commit = pm_seg_commit_word(used, sh->opened, s);
        }
        if ((flags & FIX_RECS) && used <= SEG_SIZE - PM_SEG_HDR)
            fix_records(seg, pm_seg_first(sh->first, used) ? pm_seg_first(sh->first, used)
                                                           : PM_SEG_HDR, used);
    }
}

/* Every byte a scan hands out is read, so that a record that reaches past
 * its segment is caught here rather than by a client. */
static int visit(void *arg, const void *key, size_t klen, const void *val, uint32_t vlen,
                 uint64_t version)
{
    uint8_t *acc = arg;

    for (size_t i = 0; i < klen; i++)
        *acc ^= ((const uint8_t *)key)[i];
    for (uint32_t i = 0; i < vlen; i++)
        *acc ^= ((const uint8_t *)val)[i];
    return 0;
}

/* A pool that opened: read it all, write to it. */
static void use(struct kvs *s)
{
    uint64_t cursor = 0;
    uint8_t acc = 0;
    const void *val;
    uint32_t vlen;

    for (int i = 0; i < 1024; i++) {
        FZ_CHECK(kvs_scan(s, cursor, 64, visit, &acc, &cursor) == 0, "scan");
        if (!cursor)
            break;
    }
    if (kvs_get(s, "key1", 4, &val, &vlen, NULL) == 0)
        visit(&acc, "", 0, val, vlen, 0);
    kvs_put(s, "after", 5, "recovery", 8, TERN_KV_SYNC, NULL);
    kvs_del(s, "key2", 4, TERN_KV_SYNC, NULL);
    kvs_put(s, "leased", 6, "again", 5, TERN_KV_SYNC, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    unsigned flags = fz_u8(&f);
    size_t len = POOL_SIZE;
    struct kvs_opts o = {.path = path};
    struct pm_info info;
    struct kvs *s;
    uint64_t bad = 0;
    int fd, checked, opened;

    memcpy(img, base, POOL_SIZE);
    if (flags & RESIZE) {
        int32_t d = (int16_t)fz_u16(&f);

        len = d < 0 && (size_t)-d > len ? 0 : len + d;
        if (len > POOL_SIZE)
            memset(img + POOL_SIZE, 0, len - POOL_SIZE);
    }
    while (f.n) {
        uint8_t where = fz_u8(&f);
        size_t at, n;
        const uint8_t *b;

        if (where == 0xff) {
            at = fz_u32(&f);
        } else if (where % (N_SEGS + 1) == 0) {
            at = fz_u16(&f) % PM_HDR_SIZE;
        } else {
            at = PM_HDR_SIZE + (size_t)(where % (N_SEGS + 1) - 1) * SEG_SIZE +
                 fz_u16(&f) % SEG_SIZE;
        }
        n = fz_take(&f, 1 + fz_u8(&f) % 32, &b);
        if (len)
            for (size_t i = 0; i < n; i++)
                img[(at + i) % len] = b[i];
    }
    fix_sums(img, len, flags);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FZ_CHECK(fd >= 0 && write(fd, img, len) == (ssize_t)len, "write the pool");
    close(fd);

    checked = pm_check(path, true, NULL, &info, &bad);
    opened = kvs_open(&o, &s);
    /* What the checker passes, recovery takes. */
    FZ_CHECK(checked < 0 || opened == 0, "pm_check passed a pool that kvs_open refuses (%d)",
             opened);
    if (opened == 0) {
        use(s);
        kvs_close(s);
    }
    return 0;
}
