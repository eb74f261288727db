/* Suite pm: the pool's record slots, rewrites in place (pm_overwrite)
 * and leased segments, each with its crash states and what recovery and
 * pm_check make of them.
 *
 * Crash states come from two places: forged with pwrite on a closed pool,
 * or made by the pool itself in a child that dies at a chosen msync. The
 * latter interposes pmem_msync (the pool's own objects are linked into this
 * binary, so their calls bind to the definition below); on real PM, or
 * with PMEM_IS_PMEM_FORCE=1, flushes bypass it and those tests skip.
 *
 * The "flush" test case covers cooperative flushing: large commits whose
 * flush is cut into pieces that helper threads take (pm_help). */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libpmem.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "pm/pm.h"
#include "pm/pm_layout.h"
#include "suites.h"

#define SEG (64u * 1024)
#define POOL (8ull * SEG + 4096)
#define FILL_LEN (SEG - 64 - 24 - 8)     /* key "fill": a record that fills a segment */

static char path[128];

/* ---- crash injection ---- */

static int crash_after_syncs;        /* > 0: _exit(0) after that many more msyncs */

/* What was made durable while logging is on, in the order it became
 * durable: msyncs (on a file), and cache-line flushes and fences (with
 * PMEM_IS_PMEM_FORCE=1), each with the thread that made it. Helper threads
 * log too, hence the atomic slot count (it may pass the end). */
#define SYNC_LOG_MAX 256
enum { LOG_MSYNC, LOG_FLUSH, LOG_FENCE };
static struct {
    bool on;
    unsigned n;
    const uint8_t *at[SYNC_LOG_MAX];
    size_t len[SYNC_LOG_MAX];
    uint8_t kind[SYNC_LOG_MAX];
    uint8_t who[SYNC_LOG_MAX];           /* 0 = the owner, else a helper */
} sync_log;

/* Which thread this is: 0 for the owner (every thread but the helpers of
 * the flush tests), 1.. for helpers. A helper's pieces can be slowed down,
 * so that the owner really has to wait for them, or made to fail; the
 * owner's can be slowed down, so that helpers, even on a busy machine, get
 * some. */
static __thread unsigned helper_no;
static unsigned helper_sync_delay_us, owner_piece_delay_us;
static unsigned helper_pieces_started;
static int helper_sync_fail;         /* this many helper msyncs fail with EIO */

static void sync_log_start(void)
{
    __atomic_store_n(&sync_log.n, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&sync_log.on, true, __ATOMIC_RELAXED);
}

static void sync_log_stop(void)
{
    __atomic_store_n(&sync_log.on, false, __ATOMIC_RELAXED);
}

static unsigned sync_log_len(void)
{
    unsigned n = __atomic_load_n(&sync_log.n, __ATOMIC_RELAXED);

    return n < SYNC_LOG_MAX ? n : SYNC_LOG_MAX;
}

static void sync_log_add(int kind, const void *addr, size_t len)
{
    unsigned i;

    if (!__atomic_load_n(&sync_log.on, __ATOMIC_RELAXED))
        return;
    i = __atomic_fetch_add(&sync_log.n, 1, __ATOMIC_RELAXED);
    if (i < SYNC_LOG_MAX) {
        sync_log.at[i] = addr;
        sync_log.len[i] = len;
        sync_log.kind[i] = (uint8_t)kind;
        sync_log.who[i] = (uint8_t)helper_no;
    }
}

/* Pieces are at least a page; commit points and headers are not. */
static void piece_delay(size_t len)
{
    if (helper_no)
        __atomic_fetch_add(&helper_pieces_started, 1, __ATOMIC_RELAXED);
    if (helper_no && __atomic_load_n(&helper_sync_delay_us, __ATOMIC_RELAXED))
        usleep(__atomic_load_n(&helper_sync_delay_us, __ATOMIC_RELAXED));
    else if (!helper_no && owner_piece_delay_us && len >= 4096)
        usleep(owner_piece_delay_us);
}

static void *real_fn(void **slot, const char *name)
{
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);

    if (!fn) {
        fn = dlsym(RTLD_NEXT, name);
        __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

int pmem_msync(const void *addr, size_t len)
{
    static void *real;
    int (*fn)(const void *, size_t) = (int (*)(const void *, size_t))real_fn(&real, "pmem_msync");
    int rc;

    piece_delay(len);
    if (helper_no && __atomic_load_n(&helper_sync_fail, __ATOMIC_RELAXED) > 0 &&
        __atomic_sub_fetch(&helper_sync_fail, 1, __ATOMIC_RELAXED) >= 0) {
        errno = EIO;
        return -1;
    }
    rc = fn(addr, len);
    sync_log_add(LOG_MSYNC, addr, len);
    if (crash_after_syncs > 0 && --crash_after_syncs == 0)
        _exit(0);
    return rc;
}

void pmem_flush(const void *addr, size_t len)
{
    static void *real;
    void (*fn)(const void *, size_t) = (void (*)(const void *, size_t))real_fn(&real, "pmem_flush");

    piece_delay(len);
    fn(addr, len);
    sync_log_add(LOG_FLUSH, addr, len);
}

void pmem_drain(void)
{
    static void *real;
    void (*fn)(void) = (void (*)(void))real_fn(&real, "pmem_drain");

    fn();
    sync_log_add(LOG_FENCE, NULL, 0);
}

/* ---- fixtures and helpers ---- */

static void setup(void)
{
    test_pool_file(path, sizeof(path), "pm");
}

static void teardown(void)
{
    test_pool_file_remove(path);
}

/* A committed record as recovery handed it over. */
struct rec_copy {
    pm_loc loc;
    uint64_t version;
    uint8_t type, flags;
    uint32_t slot;
    char key[64];
    char val[256];
    uint32_t val_len;
};

struct seen {
    struct rec_copy r[64];
    unsigned n;
};

static int collect(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct seen *s = arg;
    struct rec_copy *c = &s->r[s->n++];

    ck_assert_uint_lt(s->n, 64);
    *c = (struct rec_copy){.loc = loc, .version = r->version, .type = r->type,
                           .flags = r->flags, .slot = r->slot, .val_len = r->val_len};
    ck_assert_uint_lt(r->key_len, sizeof(c->key));
    memcpy(c->key, pm_rec_key(r), r->key_len);
    memcpy(c->val, pm_rec_val(r), r->val_len < sizeof(c->val) ? r->val_len : 0);
    return 0;
}

static const struct rec_copy *seen_ver(const struct seen *s, uint64_t version)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->r[i].version == version)
            return &s->r[i];
    return NULL;
}

static const struct rec_copy *seen_loc(const struct seen *s, pm_loc loc)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->r[i].loc == loc)
            return &s->r[i];
    return NULL;
}

/* Open the pool at `path` (creating it with `size` bytes if size is not
 * 0) and recover it into `s` (may be NULL); returns recovery's code. */
static int open_rc(uint64_t size, struct seen *s, struct pm_pool **out)
{
    struct pm_opts o = {.size = size, .seg_size = SEG, .create = size != 0};
    int rc = pm_open(path, &o, out);

    ck_assert_msg(rc == 0, "open: %s", tern_strerror(rc));
    if (s)
        s->n = 0;
    rc = pm_recover(*out, s ? collect : NULL, s);
    if (rc < 0) {
        pm_close(*out);
        *out = NULL;
    }
    return rc;
}

static struct pm_pool *open_pool(uint64_t size, struct seen *s)
{
    struct pm_pool *p;
    int rc = open_rc(size, s, &p);

    ck_assert_msg(rc == 0, "recover: %s", tern_strerror(rc));
    return p;
}

/* Append key = a value of `len` bytes of `fill`; returns its place. */
static pm_loc put(struct pm_pool *p, const char *k, char fill, uint32_t len,
                       uint64_t *version)
{
    static char val[SEG];
    uint64_t v = pm_next_version(p);
    pm_loc loc;
    int rc;

    memset(val, fill, len);
    rc = pm_append(p, PM_VALUE, v, k, (uint16_t)strlen(k), val, len, &loc);
    ck_assert_msg(rc == 0, "append %s: %s", k, tern_strerror(rc));
    if (version)
        *version = v;
    return loc;
}

static void commit(struct pm_pool *p)
{
    int rc = pm_commit(p);

    ck_assert_msg(rc == 0, "commit: %s", tern_strerror(rc));
}

static off_t file_off(pm_loc loc)
{
    return (off_t)(pm_seg_offset((uint32_t)(loc >> 32), SEG) + (uint32_t)loc);
}

static void file_read(off_t at, void *buf, size_t n)
{
    int fd = open(path, O_RDONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, buf, n, at), (ssize_t)n);
    close(fd);
}

static void file_write(off_t at, const void *buf, size_t n)
{
    int fd = open(path, O_RDWR);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, buf, n, at), (ssize_t)n);
    close(fd);
}

/* Bytes a lessee's records start into a leased segment: a page. */
static uint32_t lease_first(void)
{
    return (uint32_t)sysconf(_SC_PAGESIZE);
}

/* A segment's commit point, from its commit word (the low half). */
static uint64_t seg_used(uint32_t seg)
{
    uint64_t w;

    file_read((off_t)(pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, commit)), &w,
              sizeof(w));
    return (uint32_t)w;
}

/* pm_check's verdict and report. */
struct check_out {
    int rc;
    uint64_t bad;
    struct pm_info info;
    char text[4096];
};

static void check_pool(struct check_out *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    ck_assert_ptr_nonnull(f);
    c->bad = 0;
    c->rc = pm_check(path, true, f, &c->info, &c->bad);
    fclose(f);
    snprintf(c->text, sizeof(c->text), "%s", buf);
    free(buf);
}

/* Does the check report a line starting with `tag` for file offset `at`? */
static bool reported(const struct check_out *c, const char *tag, off_t at)
{
    char want[96];

    snprintf(want, sizeof(want), "%s offset %lld:", tag, (long long)at);
    return strstr(c->text, want) != NULL;
}

/* Run `fn` in a child that dies (exit 0) at its `syncs`-th msync from the
 * call on; returns the child's exit status (fn's own return if it never
 * got that far). */
static int crash_child(int (*fn)(void *), void *arg, int syncs)
{
    pid_t pid = fork();
    int st;

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        crash_after_syncs = syncs;
        _exit(fn(arg));
    }
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static bool pool_is_pmem(void)
{
    struct pm_info info;
    struct pm_pool *p = open_pool(POOL, NULL);

    pm_get_info(p, &info);
    pm_close(p);
    return info.is_pmem;
}

/* ---- lessees ---- */

static uint8_t *seg_ptr(struct pm_pool *p, uint32_t seg, uint32_t off)
{
    return (uint8_t *)pm_base(p) + pm_seg_file_off(p, seg) + off;
}

/* Write a record into a leased segment as its lessee would: a whole
 * record with a version of its own (junk), flags and slot 0, summed; the
 * pool swaps its version in. */
static uint32_t lessee_write(struct pm_pool *p, uint32_t seg, uint32_t off, uint8_t type,
                             const char *key, uint16_t klen, const char *val, uint32_t vlen)
{
    uint8_t *dst = seg_ptr(p, seg, off);
    struct pm_rec h;

    memset(&h, 0, sizeof(h));
    h.version = 0xa5a5a5a5a5a5a5a5ull;
    h.key_len = klen;
    h.val_len = vlen;
    h.type = type;
    memcpy(dst, &h, sizeof(h));
    if (key)
        memcpy(dst + sizeof(h), key, klen);
    if (val)
        memcpy(dst + sizeof(h) + klen, val, vlen);
    /* Only whole records can be summed; malformed ones are refused before. */
    if (klen && (type == PM_VALUE || type == PM_TOMBSTONE) &&
        off + sizeof(h) + (uint64_t)klen + vlen <= pm_seg_room(p) + PM_SEG_HDR) {
        h.sum = pm_rec_sum_of((const struct pm_rec *)dst);
        memcpy(dst, &h.sum, sizeof(h.sum));
    }
    return pm_rec_size(klen, vlen);
}

static pm_loc lessee_put(struct pm_pool *p, uint32_t seg, const char *key,
                              const char *val, uint64_t *version)
{
    uint32_t off = pm_lease_next(p, seg);
    uint64_t v = pm_next_version(p);
    pm_loc loc;
    int rc;

    lessee_write(p, seg, off, val ? PM_VALUE : PM_TOMBSTONE, key,
                 (uint16_t)strlen(key), val, val ? (uint32_t)strlen(val) : 0);
    rc = pm_lease_append(p, seg, off, v, &loc);
    ck_assert_msg(rc == 0, "lease append %s: %s", key, tern_strerror(rc));
    ck_assert_uint_eq(loc, (uint64_t)seg << 32 | off);
    if (version)
        *version = v;
    return loc;
}

/* ---- slots ---- */

/* Rewrite the committed record at `loc` in the file (a closed pool) as
 * key = `len` bytes of `fill` with the given slot and flags, checksum
 * right. */
static void forge_rec(pm_loc loc, const char *key, char fill, uint32_t len, uint32_t slot,
                      uint8_t flags, uint64_t version)
{
    uint8_t buf[512];
    struct pm_rec *r = (void *)buf;
    uint16_t klen = (uint16_t)strlen(key);

    ck_assert_uint_le(sizeof(*r) + klen + len, sizeof(buf));
    *r = (struct pm_rec){.val_len = len, .version = version, .key_len = klen,
                              .type = PM_VALUE, .flags = flags, .slot = slot};
    memcpy(buf + sizeof(*r), key, klen);
    memset(buf + sizeof(*r) + klen, fill, len);
    r->sum = pm_rec_sum(r);
    file_write(file_off(loc), buf, sizeof(*r) + klen + len);
}

/* A record whose slot is larger than the record itself: recovery finds the
 * next record at the end of the slot, not at the end of the record. */
START_TEST(slot_walk)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t va, vb;
    pm_loc a = put(p, "a", 'a', 200, &va), b = put(p, "b", 'b', 3, &vb);
    uint32_t slot = pm_rec_size(1, 200);
    struct check_out c;
    struct seen s;

    ck_assert_uint_eq(pm_slot_size(p, a), slot);      /* slot 0: its own size */
    commit(p);
    pm_close(p);
    forge_rec(a, "a", 'x', 10, slot, 0, va);

    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(s.r[0].loc, a);
    ck_assert_uint_eq(s.r[0].val_len, 10);
    ck_assert_uint_eq(s.r[0].slot, slot);
    ck_assert_uint_eq(s.r[1].loc, b);
    ck_assert_uint_eq(s.r[1].version, vb);
    ck_assert_uint_eq(pm_slot_size(p, a), slot);
    ck_assert_uint_eq(pm_slot_size(p, b), pm_rec_size(1, 3));
    pm_close(p);
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 2);

    /* Slots that would send the walk astray are corruption, reported at
     * the record that has them. */
    const uint32_t bad[] = {
        slot + 4,                         /* unaligned */
        pm_rec_size(1, 10) - 8,      /* smaller than the record */
        SEG,                              /* past the commit point */
    };
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        forge_rec(a, "a", 'x', 10, bad[i], 0, va);
        ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
        check_pool(&c);
        ck_assert_int_eq(c.rc, TERN_ECORRUPT);
        ck_assert_msg(c.bad == (uint64_t)file_off(a), "slot %u: bad offset %llu, not %lld",
                      bad[i], (unsigned long long)c.bad, (long long)file_off(a));
    }
}
END_TEST

/* ---- rewrites in place ---- */

START_TEST(overwrite_in_place)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v1, v2, v3, v4;
    pm_loc a = put(p, "k", '1', 100, &v1), b = put(p, "k", '2', 5, &v2);
    uint32_t slot = pm_rec_size(1, 100);
    const struct pm_rec *r;
    struct pm_info i0, i1, i2;
    struct check_out c;
    struct seen s;

    commit(p);
    pm_get_info(p, &i0);
    pm_dead(p, a);                     /* the caller's part: v2 superseded it */
    pm_get_info(p, &i1);
    ck_assert_uint_eq(i1.bytes_live, i0.bytes_live - slot);
    v3 = pm_next_version(p);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, v3, "k", 1, "three", 5), 0);
    r = pm_rec_at(p, a);
    ck_assert_uint_eq(r->version, v3);
    ck_assert_uint_eq(r->flags, PM_F_REWRITTEN);
    ck_assert_uint_eq(r->slot, slot);
    ck_assert_uint_eq(r->val_len, 5);
    ck_assert(memcmp(pm_rec_val(r), "three", 5) == 0);
    ck_assert_uint_eq(pm_slot_size(p, a), slot);
    pm_get_info(p, &i2);
    ck_assert_uint_eq(i2.bytes_live, i0.bytes_live);    /* the slot is live again */
    ck_assert_uint_eq(i2.bytes_committed, i0.bytes_committed);
    commit(p);
    pm_close(p);

    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_ptr_null(seen_ver(&s, v1));
    ck_assert_uint_eq(seen_ver(&s, v3)->loc, a);
    ck_assert(memcmp(seen_ver(&s, v3)->val, "three", 5) == 0);
    ck_assert_uint_eq(seen_ver(&s, v2)->loc, b);       /* the walk went on past the slot */
    /* Again, now as a tombstone: the slot is marked already. A dead
     * rewritten record frees its whole slot, not just its own bytes. */
    pm_get_info(p, &i0);
    pm_dead(p, a);
    pm_get_info(p, &i1);
    ck_assert_uint_eq(i1.bytes_live, i0.bytes_live - slot);
    v4 = pm_next_version(p);
    ck_assert_int_eq(pm_overwrite(p, a, PM_TOMBSTONE, v4, "k", 1, NULL, 0), 0);
    commit(p);
    pm_close(p);

    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(seen_ver(&s, v4)->loc, a);
    ck_assert_uint_eq(seen_ver(&s, v4)->type, PM_TOMBSTONE);
    ck_assert_ptr_null(seen_ver(&s, v3));
    ck_assert_uint_eq(pm_slot_size(p, a), slot);
    pm_close(p);
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 2);
    ck_assert_ptr_null(strstr(c.text, "rewrite "));
}
END_TEST

/* What a refused rewrite must leave alone. */
struct slot_snap {
    uint8_t bytes[256];
    struct pm_info info;
};

static void snap(struct pm_pool *p, pm_loc loc, struct slot_snap *s)
{
    memcpy(s->bytes, pm_rec_at(p, loc), sizeof(s->bytes));
    pm_get_info(p, &s->info);
}

static void same_as(struct pm_pool *p, pm_loc loc, const struct slot_snap *s)
{
    struct slot_snap now;

    snap(p, loc, &now);
    ck_assert(memcmp(now.bytes, s->bytes, sizeof(s->bytes)) == 0);
    ck_assert_uint_eq(now.info.bytes_live, s->info.bytes_live);
    ck_assert_uint_eq(now.info.max_version, s->info.max_version);
}

START_TEST(overwrite_refused)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    static char big[SEG];
    pm_loc a = put(p, "k", '1', 100, NULL), other, pending, leased;
    uint32_t room = pm_rec_size(1, 100) - (uint32_t)sizeof(struct pm_rec) - 1;
    struct slot_snap before;
    uint32_t seg;

    put(p, "k", '2', 5, NULL);
    other = put(p, "j", '3', 5, NULL);
    commit(p);
    pending = put(p, "k", '4', 5, NULL);      /* above the commit point */
    pm_dead(p, a);
    snap(p, a, &before);
    memset(big, 'b', sizeof(big));
    /* One byte too many for the slot; the most that fits is taken. */
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "k", 1, big, room + 1),
                     TERN_E2BIG);
    same_as(p, a, &before);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "k", 1, big, SEG),
                     TERN_E2BIG);
    same_as(p, a, &before);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "j", 1, "v", 1), TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "kk", 2, "v", 1), TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a, 3, 1000, "k", 1, "v", 1), TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a, PM_TOMBSTONE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);
    same_as(p, a, &before);
    ck_assert_int_eq(pm_overwrite(p, pending, PM_VALUE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);
    ck_assert_int_eq(pm_overwrite(p, a + 8, PM_VALUE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);        /* inside the record, not a record */
    ck_assert_int_eq(pm_overwrite(p, (uint64_t)(pm_seg_count(p) - 1) << 32 | 64,
                                       PM_VALUE, 1000, "k", 1, "v", 1),
                     TERN_EINVAL);        /* a free segment */
    ck_assert_int_eq(pm_overwrite(p, (uint64_t)pm_seg_count(p) << 32 | 64,
                                       PM_VALUE, 1000, "k", 1, "v", 1), TERN_EINVAL);
    /* Not in a segment a lessee may still write. */
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    leased = lessee_put(p, seg, "L", NULL, NULL);
    commit(p);
    ck_assert_int_eq(pm_overwrite(p, leased, PM_TOMBSTONE, 1000, "L", 1, NULL, 0),
                     TERN_EINVAL);
    /* The largest value that fits does. */
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1000, "k", 1, big, room), 0);
    ck_assert_int_eq(pm_overwrite(p, other, PM_VALUE, 1001, "j", 1, "v", 1), 0);
    ck_assert_uint_eq(pm_next_version(p), 1002);  /* the counter stays ahead */
    pm_close(p);

    /* Before recovery nothing may be rewritten. */
    struct pm_opts o = {.seg_size = SEG};
    ck_assert_int_eq(pm_open(path, &o, &p), 0);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, 1002, "k", 1, "v", 1), TERN_EINVAL);
    pm_close(p);
}
END_TEST

/* The pool the crash tests start from: k = v1 (100 bytes) at a, another
 * key, and (if `newer`) k = v2 at b, all committed. */
struct rewrite_case {
    pm_loc a, b;
    uint64_t v1, v2, v3;
    uint32_t slot;
};

static void rewrite_setup(struct rewrite_case *rc, bool newer)
{
    struct pm_pool *p = open_pool(POOL, NULL);

    rc->a = put(p, "k", '1', 100, &rc->v1);
    put(p, "other", 'o', 40, NULL);
    rc->b = newer ? put(p, "k", '2', 5, &rc->v2) : 0;
    rc->v3 = pm_next_version(p);
    rc->slot = pm_rec_size(1, 100);
    commit(p);
    pm_close(p);
}

/* The child's part: reopen, the caller's pm_dead, then the rewrite,
 * and die without a commit (or earlier, at the injected msync). */
static int do_rewrite(void *arg)
{
    struct rewrite_case *rc = arg;
    struct pm_pool *p;
    struct pm_opts o = {0};

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    pm_dead(p, rc->a);
    if (pm_overwrite(p, rc->a, PM_VALUE, rc->v3, "k", 1, "three", 5) < 0)
        return 11;
    return 12;                          /* got through without the msync */
}

/* Recovery after an interrupted rewrite of a: the slot is stepped over,
 * k's newest committed version (v2, at b) stands, the pool opens, the
 * slot counts as dead, and the check reports it without calling the pool
 * corrupt. */
static void expect_skipped(const struct rewrite_case *rc)
{
    struct pm_pool *p;
    struct pm_info info;
    struct check_out c;
    struct seen s;

    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    ck_assert_msg(reported(&c, "rewrite  ", file_off(rc->a)), "not reported:\n%s", c.text);
    ck_assert_uint_eq(c.info.records, 2);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_ptr_null(seen_loc(&s, rc->a));
    ck_assert_ptr_null(seen_ver(&s, rc->v1));
    ck_assert_ptr_null(seen_ver(&s, rc->v3));
    ck_assert_uint_eq(seen_ver(&s, rc->v2)->loc, rc->b);
    pm_get_info(p, &info);
    ck_assert_uint_eq(info.bytes_live, info.bytes_committed - rc->slot);
    pm_close(p);
}

/* Crash after step (a): the mark is durable, no byte of the new record is. */
START_TEST(crash_after_mark)
{
    struct rewrite_case rc;
    struct pm_rec r;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    unlink(path);
    rewrite_setup(&rc, true);
    /* The first msync of the rewrite is the mark's (nothing else is
     * dirty after recovery). */
    ck_assert_int_eq(crash_child(do_rewrite, &rc, 1), 0);
    file_read(file_off(rc.a), &r, sizeof(r));
    ck_assert_uint_eq(r.flags, PM_F_REWRITTEN);
    ck_assert_uint_eq(r.slot, rc.slot);
    ck_assert_uint_eq(r.version, rc.v1);    /* the rest is the old record's */
    ck_assert_uint_eq(r.val_len, 100);
    expect_skipped(&rc);
}
END_TEST

/* Crash in step (b): the new header went in, the end of the value did not
 * (as when its last cache line never left the CPU). */
START_TEST(crash_in_rewrite)
{
    struct rewrite_case rc;
    struct pm_rec r;
    struct seen s;
    struct pm_pool *p;

    rewrite_setup(&rc, true);
    ck_assert_int_eq(crash_child(do_rewrite, &rc, 0), 12);
    /* Whole but uncommitted: a write never acknowledged may still show. */
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, rc.v3)->loc, rc.a);
    ck_assert_uint_eq(seen_ver(&s, rc.v3)->flags, PM_F_REWRITTEN);
    pm_close(p);
    /* Torn: the old value's bytes where the new value's end should be. */
    file_read(file_off(rc.a), &r, sizeof(r));
    ck_assert_uint_eq(r.version, rc.v3);
    file_write(file_off(rc.a) + (off_t)sizeof(r) + 1 + 3, "11", 2);
    expect_skipped(&rc);
}
END_TEST

/* The child's part: the key's newer version is appended but not yet
 * committed when the old one is rewritten. */
static int do_rewrite_behind(void *arg)
{
    struct rewrite_case *rc = arg;
    struct pm_pool *p;
    struct pm_opts o = {0};
    pm_loc b;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    if (pm_append(p, PM_VALUE, rc->v3, "k", 1, "newer", 5, &b) < 0)
        return 11;
    pm_dead(p, rc->a);
    if (pm_overwrite(p, rc->a, PM_VALUE, rc->v3 + 1, "k", 1, "three", 5) < 0)
        return 12;
    return 13;
}

/* A crash at any point of a rewrite whose justification (the newer
 * version) was not yet committed: the key still has a value, the old
 * acknowledged one or a newer one, never none. */
START_TEST(rewrite_commits_newer_version_first)
{
    struct rewrite_case rc;
    int syncs, st;

    if (pool_is_pmem())
        return;
    for (syncs = 1; syncs < 10; syncs++) {
        struct pm_pool *p;
        struct seen s;
        unsigned have = 0;

        unlink(path);
        rewrite_setup(&rc, false);      /* a holds k's only committed version */
        st = crash_child(do_rewrite_behind, &rc, syncs);
        p = open_pool(0, &s);
        for (unsigned i = 0; i < s.n; i++)
            if (s.r[i].key[0] == 'k' && s.r[i].key[1] == '\0')
                have++;
        ck_assert_msg(have >= 1, "crash at msync %d: key k is gone", syncs);
        pm_close(p);
        if (st == 13)
            break;                      /* the rewrite got through: every point tried */
        ck_assert_int_eq(st, 0);
    }
    ck_assert_int_eq(st, 13);
}
END_TEST

/* The child's part for pm_overwrite_behind: another key's record is
 * appended (a batch not yet committed) before k's older record is
 * rewritten; the child dies without a commit. */
static int do_rewrite_in_batch(void *arg)
{
    struct rewrite_case *rc = arg;
    struct pm_pool *p;
    struct pm_opts o = {0};
    pm_loc j;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    if (pm_append(p, PM_VALUE, rc->v3 + 1, "j", 1, "pending", 7, &j) < 0)
        return 11;
    pm_dead(p, rc->a);
    if (pm_overwrite_behind(p, rc->a, PM_VALUE, rc->v3, "k", 1, "three", 5) < 0)
        return 12;
    return 13;
}

/* pm_overwrite_behind (k's newer version v2 is committed): the batch
 * appended before it stays uncommitted (one commit per batch), and the
 * mark is durable before the new bytes (a crash right after its msync is
 * an interrupted rewrite that recovery skips). */
START_TEST(overwrite_behind_leaves_batch_pending)
{
    struct rewrite_case rc;
    struct pm_pool *p;
    struct pm_rec r;
    struct seen s;

    rewrite_setup(&rc, true);
    ck_assert_int_eq(crash_child(do_rewrite_in_batch, &rc, 0), 13);
    p = open_pool(0, &s);
    ck_assert_ptr_null(seen_ver(&s, rc.v3 + 1));    /* "j" was never committed */
    ck_assert_uint_eq(seen_ver(&s, rc.v2)->loc, rc.b);
    pm_close(p);
    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    unlink(path);
    rewrite_setup(&rc, true);
    /* The first msync is the mark's, on its own: "j" is not flushed. */
    ck_assert_int_eq(crash_child(do_rewrite_in_batch, &rc, 1), 0);
    file_read(file_off(rc.a), &r, sizeof(r));
    ck_assert_uint_eq(r.flags, PM_F_REWRITTEN);
    ck_assert_uint_eq(r.version, rc.v1);
    expect_skipped(&rc);
}
END_TEST

/* pm_rewrite_pending: only over a record above its segment's commit
 * point or a slot marked by an earlier rewrite; the slot keeps its size and
 * the walk goes on past it; a torn rewrite of a marked slot is skipped at
 * recovery, and the key falls back to its older version. */
START_TEST(rewrite_pending_rules)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v1, v2, v3, v4, v5, v6;
    pm_loc a = put(p, "k", '1', 100, &v1), pend, leased;
    uint32_t slot = pm_rec_size(1, 100), seg;
    const struct pm_rec *r;
    struct slot_snap before;
    struct check_out c;
    struct seen s;

    commit(p);
    snap(p, a, &before);
    ck_assert_int_eq(pm_rewrite_pending(p, a, PM_VALUE, 900, "k", 1, "x", 1),
                     TERN_EINVAL);         /* committed, never rewritten */
    same_as(p, a, &before);
    pend = put(p, "k", '2', 100, &v2);
    put(p, "j", 'j', 7, NULL);
    snap(p, pend, &before);
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 901, "x", 1, "x", 1),
                     TERN_EINVAL);         /* another key's */
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 902, "k", 1, NULL, 0),
                     0);                   /* (an empty value fits) */
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 903, "k", 1,
                                             "0123456789", slot), TERN_E2BIG);
    v3 = pm_next_version(p);
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, v3, "k", 1, "three", 5),
                     0);
    r = pm_rec_at(p, pend);
    ck_assert_uint_eq(r->version, v3);
    ck_assert_uint_eq(r->slot, slot);
    ck_assert_uint_eq(r->flags, 0);
    commit(p);
    /* Committed now, and never marked. */
    ck_assert_int_eq(pm_rewrite_pending(p, pend, PM_VALUE, 904, "k", 1, "x", 1),
                     TERN_EINVAL);
    pm_dead(p, a);
    v4 = pm_next_version(p);
    ck_assert_int_eq(pm_overwrite_behind(p, a, PM_VALUE, v4, "k", 1, "four", 4), 0);
    v5 = pm_next_version(p);
    ck_assert_int_eq(pm_rewrite_pending(p, a, PM_VALUE, v5, "k", 1, "five", 4), 0);
    /* Not in a leased segment. */
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    leased = lessee_put(p, seg, "k", "leased", NULL);
    ck_assert_int_eq(pm_rewrite_pending(p, leased, PM_VALUE, 905, "k", 1, "x", 1),
                     TERN_EINVAL);
    pm_lease_end(p, seg);
    commit(p);
    pm_close(p);

    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, v5)->loc, a);
    ck_assert(memcmp(seen_ver(&s, v5)->val, "five", 4) == 0);
    ck_assert_uint_eq(seen_ver(&s, v3)->loc, pend);
    ck_assert(memcmp(seen_ver(&s, v3)->val, "three", 5) == 0);
    ck_assert_ptr_null(seen_ver(&s, v1));
    ck_assert_ptr_null(seen_ver(&s, v2));
    ck_assert_ptr_null(seen_ver(&s, v4));
    ck_assert_uint_eq(s.n, 3);              /* a, pend, and "j" past pend's slot */
    /* Again over the marked slot, torn this time (the pool closes without a
     * commit; the value's end never made it). */
    v6 = pm_next_version(p);
    ck_assert_int_eq(pm_rewrite_pending(p, a, PM_VALUE, v6, "k", 1, "sixsix", 6), 0);
    pm_close(p);
    file_write(file_off(a) + (off_t)sizeof(struct pm_rec) + 1 + 4, "!!", 2);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    p = open_pool(0, &s);
    ck_assert_ptr_null(seen_loc(&s, a));
    ck_assert_uint_eq(seen_ver(&s, v3)->loc, pend);
    pm_close(p);
}
END_TEST

/* A bad record without the flag is corruption, as before rewrites; so is
 * one with the flag whose slot cannot be trusted to find the next record. */
START_TEST(corruption_still_refused)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v1;
    pm_loc a = put(p, "k", '1', 100, &v1);
    uint32_t slot = pm_rec_size(1, 100);
    struct check_out c;
    uint8_t word[8];

    put(p, "k", '2', 5, NULL);
    commit(p);
    pm_close(p);
    file_write(file_off(a) + 24 + 1 + 50, "X", 1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, (uint64_t)file_off(a));
    ck_assert_ptr_null(strstr(c.text, "rewrite "));
    /* A flag this layout does not know, checksum and all. */
    forge_rec(a, "k", '1', 100, 0, 0x02, v1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, (uint64_t)file_off(a));

    /* The flag with a slot past the commit point, unaligned, or too small
     * to hold a record header. */
    const uint32_t bad[] = {SEG, slot + 4, 16, 0};
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct pm_rec h = {.key_len = 1, .type = PM_VALUE,
                                .flags = PM_F_REWRITTEN, .slot = bad[i]};

        memcpy(word, (uint8_t *)&h + 16, 8);
        file_write(file_off(a) + 16, word, 8);
        ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
        check_pool(&c);
        ck_assert_msg(c.rc == TERN_ECORRUPT, "slot %u: %s", bad[i], c.text);
        ck_assert_uint_eq(c.bad, (uint64_t)file_off(a));
    }
}
END_TEST

/* ---- cleaning ---- */

struct clean_log {
    pm_loc live[16];            /* records the owner still needs */
    unsigned n_live;
    pm_loc asked[64], dropped[64];
    unsigned n_asked, n_dropped, n_moved;
};

static bool cl_is_live(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct clean_log *l = arg;

    (void)r;
    l->asked[l->n_asked++] = loc;
    for (unsigned i = 0; i < l->n_live; i++)
        if (l->live[i] == loc)
            return true;
    return false;
}

static void cl_moved(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r)
{
    struct clean_log *l = arg;

    (void)r;
    for (unsigned i = 0; i < l->n_live; i++)
        if (l->live[i] == from)
            l->live[i] = to;
    l->n_moved++;
}

static void cl_dropped(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct clean_log *l = arg;

    (void)r;
    l->dropped[l->n_dropped++] = loc;
}

static bool logged(const pm_loc *locs, unsigned n, pm_loc loc)
{
    for (unsigned i = 0; i < n; i++)
        if (locs[i] == loc)
            return true;
    return false;
}

/* The slot of an interrupted rewrite is nobody's record: cleaning its
 * segment neither asks the owner about it nor reports it dropped. */
START_TEST(clean_steps_over_torn_rewrite)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct rewrite_case rc;
    struct pm_pool *p;
    struct pm_info info;
    uint8_t word[8];
    struct pm_rec h;
    struct seen s;

    rewrite_setup(&rc, true);
    file_read(file_off(rc.a), &h, sizeof(h));
    h.flags = PM_F_REWRITTEN;
    h.slot = rc.slot;
    memcpy(word, (uint8_t *)&h + 16, 8);
    file_write(file_off(rc.a) + 16, word, 8);      /* the state after step (a) */
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    /* Move the head on, so that a's segment is sealed and may be cleaned. */
    put(p, "fill", 'f', FILL_LEN, NULL);
    commit(p);
    l.live[l.n_live++] = rc.b;
    ck_assert_int_ge(pm_clean(p, &c, 1, 100), 1);
    ck_assert_uint_eq(l.n_moved, 1);
    ck_assert(!logged(l.asked, l.n_asked, rc.a));
    ck_assert(!logged(l.dropped, l.n_dropped, rc.a));
    ck_assert(logged(l.dropped, l.n_dropped, rc.b));     /* the walk went past it */
    pm_get_info(p, &info);
    pm_close(p);
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, rc.v2)->loc, l.live[0]);
    pm_close(p);
}
END_TEST

/* Cleaning walks a segment by slots too: after a rewrite that left slack
 * in its slot, the owner is asked about exactly the segment's records, and
 * the copy of the rewritten one is an ordinary record (slot 0, no flag). */
START_TEST(clean_walks_slots)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct rewrite_case rc;
    struct pm_pool *p;
    pm_loc other;
    struct seen s;

    rewrite_setup(&rc, true);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 3);
    other = s.r[1].loc;
    pm_dead(p, rc.a);
    ck_assert_int_eq(pm_overwrite(p, rc.a, PM_VALUE, rc.v3, "k", 1, "3", 1), 0);
    put(p, "fill", 'f', FILL_LEN, NULL);
    commit(p);
    l.live[l.n_live++] = rc.a;
    ck_assert_int_ge(pm_clean(p, &c, 1, 100), 1);
    ck_assert_uint_eq(l.n_asked, 3);
    ck_assert_uint_eq(l.asked[0], rc.a);
    ck_assert_uint_eq(l.asked[1], other);
    ck_assert_uint_eq(l.asked[2], rc.b);
    ck_assert_uint_eq(l.n_dropped, 3);
    ck_assert_uint_eq(l.n_moved, 1);
    ck_assert_uint_eq(pm_rec_at(p, l.live[0])->slot, 0);
    ck_assert_uint_eq(pm_rec_at(p, l.live[0])->flags, 0);
    ck_assert_uint_eq(pm_slot_size(p, l.live[0]), pm_rec_size(1, 1));
    pm_close(p);
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, rc.v3)->loc, l.live[0]);
    pm_close(p);
}
END_TEST

/* ---- what a commit makes durable ---- */

/* The first logged msync that covers [at, at+n), or -1. */
static int synced_at(const void *at, size_t n)
{
    const uint8_t *a = at;

    for (unsigned i = 0; i < sync_log_len(); i++)
        if (sync_log.at[i] <= a && a + n <= sync_log.at[i] + sync_log.len[i])
            return (int)i;
    return -1;
}

static const void *used_word(struct pm_pool *p, uint32_t seg)
{
    return seg_ptr(p, seg, offsetof(struct pm_seg_hdr, commit));
}

/* A commit makes a rewrite durable although no commit point moves; with
 * records in the head and in a lease, all of them are durable before
 * either commit point is stored. */
START_TEST(commit_syncs_what_was_written)
{
    struct pm_pool *p;
    pm_loc a, r1, o1;
    uint32_t seg;
    int rec1, rec2, used1, used2;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    p = open_pool(0, NULL);
    a = put(p, "k", '1', 100, NULL);
    put(p, "k", '2', 5, NULL);
    commit(p);
    pm_dead(p, a);
    ck_assert_int_eq(pm_overwrite(p, a, PM_VALUE, pm_next_version(p), "k", 1,
                                       "three", 5), 0);
    sync_log.on = true;
    commit(p);
    ck_assert_msg(synced_at(pm_rec_at(p, a), pm_rec_size(1, 5)) >= 0,
                  "the rewrite was not made durable by the commit");

    ck_assert_int_eq(pm_lease(p, &seg), 0);
    r1 = lessee_put(p, seg, "c1", "one", NULL);
    o1 = put(p, "own", 'o', 10, NULL);
    sync_log.n = 0;
    commit(p);
    sync_log.on = false;
    rec1 = synced_at(pm_rec_at(p, r1), pm_rec_size(2, 3));
    rec2 = synced_at(pm_rec_at(p, o1), pm_rec_size(3, 10));
    used1 = synced_at(used_word(p, seg), 8);
    used2 = synced_at(used_word(p, (uint32_t)(o1 >> 32)), 8);
    ck_assert_int_ge(rec1, 0);
    ck_assert_int_ge(rec2, 0);
    ck_assert_int_gt(used1, rec1);
    ck_assert_int_gt(used1, rec2);
    ck_assert_int_gt(used2, rec1);
    ck_assert_int_gt(used2, rec2);
    pm_close(p);
}
END_TEST

/* ---- leased segments ---- */

START_TEST(lease_records_survive_reopen)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    uint64_t v[4], vo1, vo2;
    pm_loc loc[4], o1 = put(p, "own1", 'o', 10, &vo1), o2;
    struct check_out c;
    struct stat st;
    struct seen s;
    uint32_t seg;

    commit(p);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    ck_assert_uint_ne(seg, (uint32_t)(o1 >> 32));
    ck_assert_uint_eq(pm_seg_file_off(p, seg), pm_seg_offset(seg, SEG));
    ck_assert_uint_eq(pm_seg_file_off(p, seg) % 4096, 0);
    ck_assert_uint_eq(pm_seg_room(p), SEG - 64);
    ck_assert_uint_eq(pm_lease_next(p, seg), (uint32_t)sysconf(_SC_PAGESIZE));
    ck_assert_int_eq(fstat(pm_fd(p), &st), 0);
    ck_assert_uint_eq((uint64_t)st.st_size, pm_map_len(p));
    ck_assert_uint_eq(pm_map_len(p), POOL);

    loc[0] = lessee_put(p, seg, "c1", "client one", &v[0]);
    loc[1] = lessee_put(p, seg, "c2", "", &v[1]);
    o2 = put(p, "own2", 'p', 10, &vo2);      /* the head, between lessee records */
    ck_assert_uint_ne((uint32_t)(o2 >> 32), seg);
    loc[2] = lessee_put(p, seg, "c1", NULL, &v[2]);      /* a tombstone */
    ck_assert_uint_eq(pm_lease_next(p, seg),
                      lease_first() + pm_rec_size(2, 10) + pm_rec_size(2, 0) * 2);
    /* Stamped: version, flags 0, slot 0, checksum of the pool's bytes. */
    const struct pm_rec *r = pm_rec_at(p, loc[0]);
    ck_assert_uint_eq(r->version, v[0]);
    ck_assert_uint_eq(r->flags, 0);
    ck_assert_uint_eq(r->slot, 0);
    ck_assert_uint_eq(r->sum, pm_rec_sum(r));
    commit(p);                         /* one commit: the head and the lease */
    ck_assert_uint_eq(seg_used(seg), pm_lease_next(p, seg) - 64);
    loc[3] = lessee_put(p, seg, "c3", "uncommitted", &v[3]);
    pm_close(p);                  /* a crash with the lease active */

    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 5);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 5);
    for (int i = 0; i < 3; i++) {
        const struct rec_copy *rc = seen_ver(&s, v[i]);

        ck_assert_ptr_nonnull(rc);
        ck_assert_uint_eq(rc->loc, loc[i]);
        ck_assert_uint_eq(rc->flags, 0);
        ck_assert_uint_eq(rc->slot, 0);
    }
    ck_assert_str_eq(seen_ver(&s, v[0])->val, "client one");
    ck_assert_uint_eq(seen_ver(&s, v[2])->type, PM_TOMBSTONE);
    ck_assert_ptr_null(seen_ver(&s, v[3]));
    ck_assert_uint_eq(seen_ver(&s, vo1)->loc, o1);
    ck_assert_uint_eq(seen_ver(&s, vo2)->loc, o2);
    /* No lease survives: the segment takes nothing, and appends continue
     * in the pool's own head although the leased segment is newer. */
    ck_assert_uint_eq(pm_lease_next(p, seg), 0);
    ck_assert_int_eq(pm_lease_append(p, seg, 64 + (uint32_t)seg_used(seg),
                                          pm_next_version(p), &loc[3]), TERN_EINVAL);
    ck_assert_uint_eq((uint32_t)(put(p, "own3", 'q', 10, NULL) >> 32), (uint32_t)(o2 >> 32));
    ck_assert_uint_gt(pm_next_version(p), v[2]);
    pm_close(p);
}
END_TEST

/* A lessee's malformed record is refused, and nothing of the pool's state
 * or the segment's bytes changes. */
START_TEST(lessee_garbage_refused)
{
    static uint8_t before[SEG];
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc own = put(p, "own", 'o', 10, NULL), loc = 0;
    struct pm_info i0, i1;
    uint32_t seg, off;
    static char key[PM_KEY_MAX + 1];
    static const struct {
        uint8_t type;
        uint16_t klen;
        uint32_t vlen;
        const char *what;
    } bad[] = {
        {0, 1, 1, "type 0"},
        {3, 1, 1, "type 3"},
        {PM_TOMBSTONE, 1, 4, "tombstone with a value"},
        {PM_VALUE, 0, 4, "empty key"},
        {PM_VALUE, PM_KEY_MAX + 1, 4, "key too long"},
        {PM_VALUE, 1, 0, "one byte past the segment"},    /* length set below */
        {PM_VALUE, 1, 0xfffffff0u, "length that wraps"},
    };

    memset(key, 'k', sizeof(key));
    commit(p);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    lessee_put(p, seg, "first", "1", NULL);
    off = pm_lease_next(p, seg);
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint32_t vlen = bad[i].vlen ? bad[i].vlen : SEG - off - 24;

        lessee_write(p, seg, off, bad[i].type, key, bad[i].klen, NULL, 0);
        ((struct pm_rec *)seg_ptr(p, seg, off))->val_len = vlen;
        memcpy(before, seg_ptr(p, seg, 0), SEG);
        pm_get_info(p, &i0);
        ck_assert_msg(pm_lease_append(p, seg, off, 99, &loc) == TERN_EPROTO, "%s accepted",
                      bad[i].what);
        ck_assert_msg(memcmp(before, seg_ptr(p, seg, 0), SEG) == 0, "%s: bytes changed",
                      bad[i].what);
        pm_get_info(p, &i1);
        ck_assert_uint_eq(i1.bytes_live, i0.bytes_live);
        ck_assert_uint_eq(i1.bytes_committed, i0.bytes_committed);
        ck_assert_uint_eq(i1.max_version, i0.max_version);
        ck_assert_uint_eq(pm_lease_next(p, seg), off);
    }
    /* Right record, wrong place or wrong segment. */
    lessee_write(p, seg, off, PM_VALUE, "ok", 2, "fine", 4);
    memcpy(before, seg_ptr(p, seg, 0), SEG);
    ck_assert_int_eq(pm_lease_append(p, seg, off + 8, 99, &loc), TERN_EINVAL);
    ck_assert_int_eq(pm_lease_append(p, seg, 64, 99, &loc), TERN_EINVAL);
    ck_assert_int_eq(pm_lease_append(p, (uint32_t)(own >> 32), off, 99, &loc), TERN_EINVAL);
    ck_assert_int_eq(pm_lease_append(p, pm_seg_count(p), off, 99, &loc), TERN_EINVAL);
    ck_assert(memcmp(before, seg_ptr(p, seg, 0), SEG) == 0);
    ck_assert_uint_eq(pm_lease_next(p, seg), off);
    /* The same record at the right place goes in; then one that fills the
     * segment to its last byte, after which not even a header fits. */
    ck_assert_int_eq(pm_lease_append(p, seg, off, 99, &loc), 0);
    off = pm_lease_next(p, seg);
    lessee_write(p, seg, off, PM_VALUE, "z", 1, NULL, SEG - off - 24 - 1);
    ck_assert_int_eq(pm_lease_append(p, seg, off, 100, &loc), 0);
    ck_assert_uint_eq(pm_lease_next(p, seg), SEG);
    ck_assert_uint_eq(pm_next_version(p), 101);     /* the counter stays ahead */
    ck_assert_int_eq(pm_lease_append(p, seg, SEG, 102, &loc), TERN_EPROTO);
    commit(p);
    pm_close(p);
    struct check_out c;
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_uint_eq(c.info.records, 4);
}
END_TEST

START_TEST(lease_end_drops_uncommitted)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc kept, lost;
    uint64_t vk, vl;
    struct pm_info i0, i1;
    struct seen s;
    uint32_t seg;

    ck_assert_int_eq(pm_lease(p, &seg), 0);
    kept = lessee_put(p, seg, "kept", "yes", &vk);
    commit(p);
    pm_get_info(p, &i0);
    lost = lessee_put(p, seg, "lost", "no", &vl);
    pm_lease_end(p, seg);
    pm_get_info(p, &i1);
    ck_assert_uint_eq(i1.bytes_live, i0.bytes_live);
    ck_assert_uint_eq(pm_lease_next(p, seg), 0);
    ck_assert_int_eq(pm_lease_append(p, seg, (uint32_t)lost, 77, &lost), TERN_EINVAL);
    commit(p);
    ck_assert_uint_eq(seg_used(seg), lease_first() - 64 + pm_rec_size(4, 3));
    pm_close(p);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_uint_eq(seen_ver(&s, vk)->loc, kept);
    ck_assert_ptr_null(seen_ver(&s, vl));
    pm_close(p);
}
END_TEST

/* A leased segment's records start a page in, so that a lessee mapped from
 * there on never reaches the segment's header; the header says where they
 * start, recovery and the checker walk from there, and a header whose
 * `first` is out of line is corruption, not a place to read records from. */
START_TEST(lease_starts_past_header)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    struct pm_seg_hdr h;
    struct check_out c;
    pm_loc r1, o;
    uint64_t v1, vo;
    struct seen s;
    uint32_t seg, bad;

    o = put(p, "own", 'o', 10, &vo);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    ck_assert_uint_eq(pm_lease_next(p, seg), lease_first());
    r1 = lessee_put(p, seg, "c1", "one", &v1);
    ck_assert_uint_eq((uint32_t)r1, lease_first());
    commit(p);
    pm_close(p);
    file_read((off_t)pm_seg_offset(seg, SEG), &h, sizeof(h));
    ck_assert_uint_eq(h.first, lease_first());
    ck_assert_uint_eq((uint32_t)h.commit, lease_first() - 64 + pm_rec_size(2, 3));
    ck_assert_uint_eq(h.flags, PM_SEG_LEASED);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    ck_assert_uint_eq(c.info.records, 2);
    ck_assert_uint_eq(c.info.bytes_committed, pm_rec_size(3, 10) + pm_rec_size(2, 3));
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    ck_assert_uint_eq(seen_ver(&s, vo)->loc, o);
    pm_close(p);

    /* Out of line: unaligned, inside the header, past the commit point. */
    const uint32_t bads[] = {lease_first() + 4, 8, (uint32_t)h.commit + 64 + 8};
    for (unsigned i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
        bad = bads[i];
        file_write((off_t)pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, first), &bad,
                   sizeof(bad));
        check_pool(&c);
        ck_assert_msg(c.rc == TERN_ECORRUPT, "first = %u: check says %s", bad,
                      tern_strerror(c.rc));
        ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    }
}
END_TEST

static void make_old_layout(uint32_t layout);
static void expect_headers_sound(void);

/* A layout-3 pool (before leases started a page in, and before segment
 * headers were checked) opens: its header is upgraded to this layout,
 * stray bytes in the segment headers' `first` word are cleared first, the
 * headers get their checks, and every record is still there. */
START_TEST(layout3_pool_is_upgraded)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    struct pm_file_hdr fh;
    struct pm_seg_hdr h;
    struct check_out c;
    uint64_t v1, v2;
    pm_loc r1;
    struct seen s;
    uint32_t junk = 0x5a5a5a5a;

    r1 = put(p, "one", '1', 100, &v1);
    put(p, "two", '2', 100, &v2);
    commit(p);
    pm_close(p);
    make_old_layout(3);
    /* A free segment's header, and one in use, with junk where layout 3 had
     * reserved bytes. */
    file_write((off_t)pm_seg_offset(7, SEG) + offsetof(struct pm_seg_hdr, first),
               &junk, sizeof(junk));
    file_write((off_t)pm_seg_offset((uint32_t)(r1 >> 32), SEG) +
                   offsetof(struct pm_seg_hdr, first), &junk, sizeof(junk));
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "a layout-3 pool fails its check: %s\n%s", tern_strerror(c.rc),
                  c.text);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    pm_close(p);
    file_read(0, &fh, sizeof(fh));
    ck_assert_uint_eq(fh.layout, PM_LAYOUT);
    ck_assert_uint_eq(fh.sum, pm_sum(&fh, offsetof(struct pm_file_hdr, sum)));
    file_read((off_t)pm_seg_offset(7, SEG), &h, sizeof(h));
    ck_assert_uint_eq(h.first, 0);
    expect_headers_sound();
}
END_TEST

/* Cleaning never takes a segment a lessee may still be writing, however
 * dead its records; once the lease ends it may. */
START_TEST(clean_skips_active_lease)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc a, own;
    uint32_t seg, next, free0;
    int freed;

    own = put(p, "own", 'o', 10, NULL);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    a = lessee_put(p, seg, "dead", "soon", NULL);
    commit(p);
    pm_dead(p, a);
    put(p, "fill", 'f', FILL_LEN, NULL);     /* seal own's segment too */
    commit(p);
    next = pm_lease_next(p, seg);
    free0 = pm_free_segs(p);
    freed = pm_clean(p, &c, pm_seg_count(p), 100);
    ck_assert_int_ge(freed, 1);          /* own's segment, at least */
    ck_assert(logged(l.dropped, l.n_dropped, own));
    ck_assert(!logged(l.asked, l.n_asked, a));
    ck_assert(!logged(l.dropped, l.n_dropped, a));
    ck_assert_uint_eq(pm_lease_next(p, seg), next);
    lessee_put(p, seg, "still", "leased", NULL);
    ck_assert_uint_eq(pm_free_segs(p), free0 + (uint32_t)freed);
    commit(p);
    pm_lease_end(p, seg);
    l.n_asked = l.n_dropped = 0;
    ck_assert_int_ge(pm_clean(p, &c, pm_seg_count(p), 100), 1);
    ck_assert(logged(l.dropped, l.n_dropped, a));
    pm_close(p);
}
END_TEST

/* A lease takes a free segment only while the reserves for tombstones and
 * the cleaner stay, as an append of a value would. */
START_TEST(lease_keeps_reserves)
{
    struct pm_pool *p = open_pool(4ull * SEG + 4096, NULL);
    uint32_t a, b, c;
    pm_loc t;

    ck_assert_uint_eq(pm_free_segs(p), 4);
    ck_assert_int_eq(pm_lease(p, &a), 0);
    ck_assert_int_eq(pm_lease(p, &b), 0);
    ck_assert_uint_ne(a, b);
    ck_assert_int_eq(pm_lease(p, &c), TERN_ENOSPC);
    ck_assert_uint_eq(pm_free_segs(p), 2);
    /* Appends never go to a leased segment: a value finds no head, a
     * tombstone takes the first reserve. */
    ck_assert_int_eq(pm_append(p, PM_VALUE, 1, "k", 1, "v", 1, &t), TERN_ENOSPC);
    ck_assert_int_eq(pm_append(p, PM_TOMBSTONE, 2, "k", 1, NULL, 0, &t), 0);
    ck_assert_uint_ne((uint32_t)(t >> 32), a);
    ck_assert_uint_ne((uint32_t)(t >> 32), b);
    pm_close(p);
}
END_TEST

/* A lessee that scribbled over its own committed records loses them from
 * there to the end of its segment, and no one else loses anything: the pool
 * opens, and the cut is made durable. */
START_TEST(scribbled_lease_is_cut)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    pm_loc r1, r2, o1, o2;
    uint64_t v1, v2, v3, vo1, vo2;
    struct check_out c;
    struct seen s;
    uint32_t seg;

    o1 = put(p, "own1", 'o', 10, &vo1);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    r1 = lessee_put(p, seg, "c1", "one", &v1);
    r2 = lessee_put(p, seg, "c2", "two", &v2);
    lessee_put(p, seg, "c3", "three", &v3);
    o2 = put(p, "own2", 'p', 10, &vo2);
    commit(p);
    pm_close(p);
    file_write(file_off(r2) + 24 + 2, "X", 1);       /* "two" -> "Xwo" */

    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    ck_assert_msg(reported(&c, "lessee   ", file_off(r2)), "not reported:\n%s", c.text);
    ck_assert_uint_eq(c.info.records, 3);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    ck_assert_ptr_null(seen_ver(&s, v2));
    ck_assert_ptr_null(seen_ver(&s, v3));
    ck_assert_uint_eq(seen_ver(&s, vo1)->loc, o1);
    ck_assert_uint_eq(seen_ver(&s, vo2)->loc, o2);
    ck_assert_uint_eq(seg_used(seg), lease_first() - 64 + pm_rec_size(2, 3));
    pm_close(p);
    check_pool(&c);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_ptr_null(strstr(c.text, "lessee "));
    ck_assert_uint_eq(c.info.records, 3);

    /* The mark outlives the lease: scribbles found after it ended are cut
     * the same way. An ordinary segment is still corruption. */
    p = open_pool(0, NULL);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    r1 = lessee_put(p, seg, "d1", "one", &v1);
    r2 = lessee_put(p, seg, "d2", "two", &v2);
    commit(p);
    pm_lease_end(p, seg);
    pm_close(p);
    file_write(file_off(r2) + 24 + 2, "X", 1);
    p = open_pool(0, &s);
    ck_assert_uint_eq(seen_ver(&s, v1)->loc, r1);
    ck_assert_ptr_null(seen_ver(&s, v2));
    pm_close(p);
    file_write(file_off(o2) + 24 + 4, "X", 1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, (uint64_t)file_off(o2));
}
END_TEST

/* A segment once leased and then cleaned comes back as an ordinary head:
 * its old mark must not make recovery lenient with the pool's own records. */
START_TEST(reused_lease_segment_is_ordinary)
{
    struct clean_log l = {0};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_pool *p = open_pool(6ull * SEG + 4096, NULL);
    pm_loc a, loc = UINT64_MAX;
    uint32_t seg;

    ck_assert_int_eq(pm_lease(p, &seg), 0);
    a = lessee_put(p, seg, "c", "v", NULL);
    commit(p);
    pm_lease_end(p, seg);
    pm_dead(p, a);
    ck_assert_int_ge(pm_clean(p, &c, 1, 100), 1);
    /* Free segments are a stack: the next head is the one just freed. */
    for (int i = 0; i < 4 && (uint32_t)(loc >> 32) != seg; i++) {
        loc = put(p, "fill", 'f', FILL_LEN, NULL);
        commit(p);
    }
    ck_assert_uint_eq((uint32_t)(loc >> 32), seg);
    pm_close(p);
    file_write(file_off(loc) + 24 + 6, "X", 1);
    ck_assert_int_eq(open_rc(0, NULL, &p), TERN_ECORRUPT);
}
END_TEST

/* ---- cooperative flushing ---- */

#define BSEG (1u << 20)
#define BPOOL (24ull * BSEG + 4096)
#define SPLIT (64u * 1024)               /* split_flush of these tests: 32 KiB pieces */
#define BIG_RECS 12

/* The flush tests run twice: _i = 0 on a file (msync), _i = 1 with
 * PMEM_IS_PMEM_FORCE=1 (cache-line flushes and fences). The variable is
 * read once, at the first open of the process; every test is a fresh
 * process in fork mode. */
enum { MODE_MSYNC = 0, MODE_PMEM = 1 };

static struct pm_pool *open_big(uint32_t seg, uint32_t split, int mode)
{
    struct pm_opts o = {.size = 24ull * seg + 4096, .seg_size = seg, .create = true,
                             .split_flush = split};
    struct pm_info info;
    struct pm_pool *p;
    int rc;

    if (mode == MODE_PMEM)
        setenv("PMEM_IS_PMEM_FORCE", "1", 1);
    rc = pm_open(path, &o, &p);
    ck_assert_msg(rc == 0, "open: %s", tern_strerror(rc));
    ck_assert_int_eq(pm_recover(p, NULL, NULL), 0);
    pm_get_info(p, &info);
    if (mode == MODE_PMEM)
        ck_assert_msg(info.is_pmem, "PMEM_IS_PMEM_FORCE=1 had no effect (not in fork mode?)");
    return p;
}

static bool msyncs(struct pm_pool *p)
{
    struct pm_info info;

    pm_get_info(p, &info);
    return !info.is_pmem;
}

/* Threads that call pm_help() in a loop, counting the pieces they ran. */
struct helpers {
    struct pm_pool *p;
    pthread_t th[2];
    unsigned n;
    unsigned ids;
    unsigned running;                    /* helpers that called pm_help() */
    bool stop;
    unsigned long ran;
};

static void *help_loop(void *arg)
{
    struct helpers *h = arg;
    unsigned idle = 0;
    bool counted = false;

    helper_no = __atomic_add_fetch(&h->ids, 1, __ATOMIC_RELAXED);
    while (!__atomic_load_n(&h->stop, __ATOMIC_RELAXED)) {
        if (pm_help(h->p) == 1) {
            __atomic_fetch_add(&h->ran, 1, __ATOMIC_RELAXED);
            idle = 0;
        } else if (++idle % 256 == 0) {
            sched_yield();               /* on two cores, leave the owner room */
        }
        /* After its first call: from then on the pool splits. */
        if (!counted) {
            counted = true;
            __atomic_fetch_add(&h->running, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void helpers_start(struct helpers *h, struct pm_pool *p, unsigned n)
{
    *h = (struct helpers){.p = p};
    for (; h->n < n; h->n++)
        ck_assert_int_eq(pthread_create(&h->th[h->n], NULL, help_loop, h), 0);
    /* The pool splits flushes only once a helper has called, and a few
     * commits take a millisecond: they could all be over before a helper
     * was first scheduled. */
    while (__atomic_load_n(&h->running, __ATOMIC_RELAXED) < n)
        sched_yield();
}

static unsigned long helpers_stop(struct helpers *h)
{
    __atomic_store_n(&h->stop, true, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < h->n; i++)
        pthread_join(h->th[i], NULL);
    return h->ran;
}

/* A thread that calls pm_help() once and is gone: from now on the
 * pool splits large flushes, and nobody helps with them. */
static void *help_once_main(void *arg)
{
    helper_no = 9;
    return (void *)(intptr_t)pm_help(arg);
}

static void help_once(struct pm_pool *p)
{
    pthread_t th;
    void *ran;

    ck_assert_int_eq(pthread_create(&th, NULL, help_once_main, p), 0);
    ck_assert_int_eq(pthread_join(th, &ran), 0);
    ck_assert_ptr_null(ran);                 /* nothing was posted */
}

/* Record i of a test: key "bigNN", a length from 200 KiB to about 900 KiB
 * (not a multiple of a page), and bytes that differ from page to page. */
static uint32_t big_len(unsigned i)
{
    return 200u * 1024 + i * 63u * 1024 + i * 24 + 8;
}

static void big_val(char *buf, unsigned i, uint32_t len)
{
    for (uint32_t j = 0; j < len; j++)
        buf[j] = (char)('a' + (i * 7 + j / 4096 + (j & 3)) % 26);
}

static pm_loc big_put(struct pm_pool *p, unsigned i, uint32_t len)
{
    static char val[4u << 20];
    char key[16];
    pm_loc loc;
    int rc;

    ck_assert_uint_le(len, sizeof(val));
    big_val(val, i, len);
    snprintf(key, sizeof(key), "big%02u", i);
    rc = pm_append(p, PM_VALUE, pm_next_version(p), key, (uint16_t)strlen(key),
                        val, len, &loc);
    ck_assert_msg(rc == 0, "append %s: %s", key, tern_strerror(rc));
    return loc;
}

/* Records recovery found, checked byte by byte against big_val. */
struct big_seen {
    unsigned n;
    uint32_t len[64];                    /* by record number; 0 = not seen */
    unsigned bad;                        /* records whose bytes are wrong */
};

static int big_visit(void *arg, pm_loc loc, const struct pm_rec *r)
{
    static char want[4u << 20];
    struct big_seen *s = arg;
    char key[16] = {0};
    unsigned i;

    (void)loc;
    memcpy(key, pm_rec_key(r), r->key_len < 15 ? r->key_len : 15);
    if (sscanf(key, "big%u", &i) != 1 || i >= 64 || r->val_len > sizeof(want))
        return 0;
    big_val(want, i, r->val_len);
    if (memcmp(pm_rec_val(r), want, r->val_len) != 0)
        s->bad++;
    s->len[i] = r->val_len;
    s->n++;
    return 0;
}

static void big_reopen(struct big_seen *s)
{
    struct pm_pool *p;
    int rc = pm_open(path, NULL, &p);

    ck_assert_msg(rc == 0, "reopen: %s", tern_strerror(rc));
    *s = (struct big_seen){0};
    rc = pm_recover(p, big_visit, s);
    ck_assert_msg(rc == 0, "recover: %s", tern_strerror(rc));
    pm_close(p);
    ck_assert_uint_eq(s->bad, 0);
}

/* Did log entry i (a flush) have a fence of the same thread after it,
 * before entry `limit`? A fence orders only its own thread's flushes. */
static bool fenced_before(unsigned i, unsigned limit)
{
    for (unsigned j = i + 1; j < limit && j < sync_log_len(); j++)
        if (sync_log.kind[j] == LOG_FENCE && sync_log.who[j] == sync_log.who[i])
            return true;
    return false;
}

/* Were all bytes of [at, at+n) durable by log entry `limit`: msynced, or
 * flushed and then fenced by the same thread? */
static bool synced_before(const void *at, size_t n, unsigned limit)
{
    const uint8_t *pos = at, *end = pos + n;

    while (pos < end) {
        const uint8_t *next = NULL;

        for (unsigned i = 0; i < limit && i < sync_log_len() && !next; i++)
            if (sync_log.kind[i] != LOG_FENCE && sync_log.at[i] <= pos &&
                pos < sync_log.at[i] + sync_log.len[i] &&
                (sync_log.kind[i] == LOG_MSYNC || fenced_before(i, limit)))
                next = sync_log.at[i] + sync_log.len[i];
        if (!next)
            return false;
        pos = next;
    }
    return true;
}

/* Log entries (msyncs or flushes) that lie within [at, at+n), and the
 * longest. */
static unsigned pieces_in(const void *at, size_t n, size_t *longest)
{
    const uint8_t *a = at;
    unsigned k = 0;

    *longest = 0;
    for (unsigned i = 0; i < sync_log_len(); i++)
        if (sync_log.at[i] >= a && sync_log.at[i] + sync_log.len[i] <= a + n) {
            k++;
            if (sync_log.len[i] > *longest)
                *longest = sync_log.len[i];
        }
    return k;
}

/* Append and commit record `i`, and check that every byte of it was made
 * durable before its segment's commit point (on a file msynced; on PM
 * flushed, and fenced by the thread that flushed), in pieces of at most
 * `piece` bytes, more than one if `split` (on PM, a commit that follows one
 * whose helper was late is not split: see late_helper_not_waited_for). */
static void big_commit_len(struct pm_pool *p, unsigned i, uint32_t len, size_t piece,
                           bool split)
{
    uint32_t size = pm_rec_size(5, len);
    pm_loc loc = big_put(p, i, len);
    const void *rec = pm_rec_at(p, loc);
    size_t longest;
    int used;

    sync_log_start();
    commit(p);
    sync_log_stop();
    used = synced_at(used_word(p, (uint32_t)(loc >> 32)), 8);
    ck_assert_int_ge(used, 0);
    ck_assert_msg(synced_before(rec, size, (unsigned)used),
                  "record %u (%u bytes) not all durable before its commit point", i, size);
    if (split)
        ck_assert_uint_gt(pieces_in(rec, size, &longest), 1);
    else
        pieces_in(rec, size, &longest);
    ck_assert_uint_le(longest, split ? piece : size);
}

static void big_commit(struct pm_pool *p, unsigned i, bool split)
{
    big_commit_len(p, i, big_len(i), SPLIT / 2, split);
}

/* (a) With helpers, large records commit in pieces, partly flushed by the
 * helpers; each is durable before its commit point and whole after a
 * reopen. The helpers' pieces are slowed down, so that the owner really
 * has to wait for them, and so are the owner's, so that the helpers get
 * some even when the machine is busy. */
START_TEST(split_flush_with_helpers)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, _i);
    struct helpers h;
    struct big_seen s;
    unsigned long ran;

    helper_sync_delay_us = 300;
    owner_piece_delay_us = 300;
    helpers_start(&h, p, 2);
    for (unsigned i = 0; i < BIG_RECS; i++)
        big_commit(p, i, _i == MODE_MSYNC);
    ran = helpers_stop(&h);
    ck_assert_msg(ran > 0, "the helpers ran no piece in %u commits", BIG_RECS);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, BIG_RECS);
    for (unsigned i = 0; i < BIG_RECS; i++)
        ck_assert_uint_eq(s.len[i], big_len(i));
}
END_TEST

/* Many commits of many small pieces (4 KiB), nothing slowed down: the
 * owner and two helpers race for every piece, and each must be run exactly
 * once (a piece run twice would count as done twice and a piece lost
 * would leave bytes unflushed). */
START_TEST(split_flush_contended)
{
    struct pm_pool *p = open_big(BSEG, 8192, _i);
    struct helpers h;
    struct big_seen s;
    unsigned n = 0;

    helpers_start(&h, p, 2);
    for (; pm_free_segs(p) > 3; n++)
        big_commit_len(p, n % 64, 100u * 1024 + (n % 7) * 1000, 4096, _i == MODE_MSYNC);
    helpers_stop(&h);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, n);
}
END_TEST

/* (b) With no helper left, the owner runs every piece itself. */
START_TEST(split_flush_alone)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, _i);
    struct big_seen s;

    help_once(p);
    for (unsigned i = 0; i < BIG_RECS; i++)
        big_commit(p, i, true);
    ck_assert_int_eq(pm_help(p), 0);    /* nothing is left posted */
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, BIG_RECS);
}
END_TEST

/* Append a record of `len` bytes and commit it; the number of pieces it
 * was made durable in, and the longest. */
static unsigned pieces_of(struct pm_pool *p, unsigned i, uint32_t len, size_t *longest)
{
    pm_loc loc = big_put(p, i, len);
    unsigned k;

    sync_log_start();
    commit(p);
    sync_log_stop();
    k = pieces_in(pm_rec_at(p, loc), pm_rec_size(5, len), longest);
    ck_assert_uint_ge(k, 1);
    return k;
}

/* When a flush is split: not before some thread called pm_help(),
 * never with UINT32_MAX, by default at 256 KiB on PM but never on a file,
 * into pieces of 64 KiB at most that end on page boundaries; a range longer
 * than the board holds (64 pieces) is cut into longer pieces. */
START_TEST(split_flush_threshold)
{
    struct pm_pool *p;
    const uint8_t *rec;
    pm_loc loc;
    size_t longest;
    uint32_t size;

    p = open_big(BSEG, SPLIT, _i);
    ck_assert_uint_eq(pieces_of(p, 0, 900u * 1024, &longest), 1);
    help_once(p);
    ck_assert_uint_gt(pieces_of(p, 1, 900u * 1024, &longest), 1);
    pm_close(p);
    unlink(path);

    p = open_big(BSEG, UINT32_MAX, _i);
    help_once(p);
    ck_assert_uint_eq(pieces_of(p, 0, 900u * 1024, &longest), 1);
    pm_close(p);
    unlink(path);

    p = open_big(BSEG, 0, _i);
    help_once(p);
    ck_assert_uint_eq(pieces_of(p, 1, 250u * 1024, &longest), 1);
    loc = big_put(p, 2, 300u * 1024);
    sync_log_start();
    commit(p);
    sync_log_stop();
    rec = (const uint8_t *)pm_rec_at(p, loc);
    size = pm_rec_size(5, 300u * 1024);
    if (!msyncs(p)) {
        ck_assert_uint_ge(pieces_in(rec, size, &longest), 5);
        ck_assert_uint_le(longest, 64u * 1024);
        for (unsigned i = 0; i < sync_log_len(); i++)
            if (sync_log.at[i] > rec && sync_log.at[i] < rec + size)
                ck_assert_uint_eq((uintptr_t)sync_log.at[i] % 4096, 0);
    } else {
        ck_assert_uint_eq(pieces_in(rec, size, &longest), 1);
    }
    pm_close(p);
    unlink(path);

    p = open_big(4u << 20, SPLIT, _i);
    help_once(p);
    size = (4u << 20) - 4096;
    loc = big_put(p, 3, size);
    sync_log_start();
    commit(p);
    sync_log_stop();
    rec = (const uint8_t *)pm_rec_at(p, loc);
    size = pm_rec_size(5, size);
    ck_assert(synced_before(rec, size, (unsigned)synced_at(used_word(p, (uint32_t)(loc >> 32)), 8)));
    ck_assert_uint_le(pieces_in(rec, size, &longest), 64);
    ck_assert_uint_gt(longest, SPLIT / 2);
    pm_close(p);
}
END_TEST

/* On PM, a helper that holds a piece for long (preempted; here it sleeps
 * 200 ms) is not waited for: the owner flushes that piece again itself and
 * commits, and posts nothing until the helper is done, so the next commit
 * is flushed in one piece; once the helper is back, commits split again. */
START_TEST(late_helper_not_waited_for)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, MODE_PMEM);
    struct helpers h;
    struct big_seen s;
    size_t longest;

    helper_sync_delay_us = 200000;
    owner_piece_delay_us = 300;
    helpers_start(&h, p, 1);
    big_commit(p, 0, true);
    ck_assert_uint_ge(__atomic_load_n(&helper_pieces_started, __ATOMIC_RELAXED), 1);
    ck_assert_msg(__atomic_load_n(&h.ran, __ATOMIC_RELAXED) == 0,
                  "the commit waited for a helper that slept");
    ck_assert_uint_eq(pieces_of(p, 1, big_len(1), &longest), 1);
    while (__atomic_load_n(&h.ran, __ATOMIC_RELAXED) == 0)
        usleep(1000);
    __atomic_store_n(&helper_sync_delay_us, 0, __ATOMIC_RELAXED);
    big_commit(p, 2, true);
    helpers_stop(&h);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, 3);
}
END_TEST

/* (d) A piece's msync that fails in a helper stops the pool's commits, as
 * the owner's own would: the commit that posted it fails, and so does every
 * later one; the record it carried never reaches recovery. */
START_TEST(helper_msync_failure_stops_commits)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, MODE_MSYNC);
    struct helpers h;
    struct big_seen s;
    unsigned i;
    int rc = 0;

    if (!msyncs(p)) {
        pm_close(p);
        return;
    }
    big_put(p, 0, big_len(0));
    commit(p);
    owner_piece_delay_us = 300;
    helper_sync_fail = 1;
    helpers_start(&h, p, 1);
    /* Until a helper happens to take a piece (nearly always the first). */
    for (i = 1; i < 20 && __atomic_load_n(&helper_sync_fail, __ATOMIC_RELAXED) > 0; i++) {
        big_put(p, i, big_len(1));
        rc = pm_commit(p);
        if (__atomic_load_n(&helper_sync_fail, __ATOMIC_RELAXED) > 0)
            ck_assert_int_eq(rc, 0);
    }
    ck_assert_msg(helper_sync_fail <= 0, "no helper took a piece in %u commits", i - 1);
    ck_assert_int_eq(rc, TERN_EIO);
    rc = pm_append(p, PM_VALUE, pm_next_version(p), "after", 5, "x", 1,
                        &(pm_loc){0});
    ck_assert(rc == 0 || rc == TERN_EIO);
    ck_assert_int_eq(pm_commit(p), TERN_EIO);
    helpers_stop(&h);
    pm_close(p);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, i - 1);           /* every record but the failed commit's */
    ck_assert_uint_eq(s.len[i - 1], 0);
}
END_TEST

/* (e) A process killed (SIGKILL) right after commits that helpers shared
 * in: every committed record is there, whole, on reopen; the one appended
 * after the last commit is not. On a file the page cache outlives the
 * process, so this checks the commit points and records the pool wrote,
 * not the flushes themselves (split_flush_with_helpers checks those). */
static void killed_after_helped_commits(int mode)
{
    struct pm_pool *p = open_big(BSEG, SPLIT, mode);
    struct helpers h;

    helpers_start(&h, p, 2);
    for (unsigned i = 0; i < 6; i++) {
        big_put(p, i, big_len(i));
        if (pm_commit(p) < 0)
            _exit(3);
    }
    big_put(p, 6, big_len(6));
    kill(getpid(), SIGKILL);
    _exit(4);
}

START_TEST(helpers_then_kill)
{
    struct big_seen s;
    pid_t pid = fork();
    int st;

    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        killed_after_helped_commits(_i);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child status %#x", st);
    big_reopen(&s);
    ck_assert_uint_eq(s.n, 6);
    for (unsigned i = 0; i < 6; i++)
        ck_assert_uint_eq(s.len[i], big_len(i));
    ck_assert_uint_eq(s.len[6], 0);
}
END_TEST

/* ---- segment headers: every word recovery trusts is checked ---- */

static uint8_t *file_snapshot(size_t *len)
{
    struct stat st;
    uint8_t *buf;

    ck_assert_int_eq(stat(path, &st), 0);
    buf = malloc((size_t)st.st_size);
    ck_assert_ptr_nonnull(buf);
    file_read(0, buf, (size_t)st.st_size);
    *len = (size_t)st.st_size;
    return buf;
}

static void expect_file(const uint8_t *want, size_t len, const char *what)
{
    size_t now_len;
    uint8_t *now = file_snapshot(&now_len);

    ck_assert_msg(now_len == len && memcmp(now, want, len) == 0, "%s: the file changed", what);
    free(now);
}

/* Every segment header of the closed pool passes this layout's checks. */
static void expect_headers_sound(void)
{
    struct pm_file_hdr fh;

    file_read(0, &fh, sizeof(fh));
    ck_assert_uint_eq(fh.layout, PM_LAYOUT);
    for (uint32_t s = 0; s < fh.n_segs; s++) {
        struct pm_seg_hdr h;
        struct pm_seg_view v;
        const char *why = "";
        uint32_t at;

        file_read((off_t)pm_seg_offset(s, SEG), &h, sizeof(h));
        ck_assert_msg(pm_seg_hdr_check(&h, s, SEG, PM_LAYOUT, &v, &at, &why) == 0,
                      "segment %u + %u: %s", s, at, why);
    }
}

/* The words of a segment header that recovery reads. */
static const struct {
    const char *name;
    uint32_t at, size;
} seg_words[] = {
    {"seq", offsetof(struct pm_seg_hdr, seq), 8},
    {"commit", offsetof(struct pm_seg_hdr, commit), 8},
    {"magic", offsetof(struct pm_seg_hdr, magic), 4},
    {"index", offsetof(struct pm_seg_hdr, index), 4},
    {"flags", offsetof(struct pm_seg_hdr, flags), 4},
    {"first", offsetof(struct pm_seg_hdr, first), 4},
    {"opened", offsetof(struct pm_seg_hdr, opened), 8},
    {"sum", offsetof(struct pm_seg_hdr, sum), 4},
};

/* Each word that recovery trusts, of an ordinary segment full of records
 * and of a leased one, zeroed or with one bit flipped (in the commit point
 * and in its check): the checker and recovery both refuse the pool, name
 * the segment and the offset, and leave the file as it was. Zeroed `commit`
 * and `seq` are the cases that used to pass: a segment's records gone
 * without a word, or a full segment taken for a free one. */
START_TEST(seg_header_damage_refused)
{
    static const uint64_t flips[] = {0, 1ull << 3, 1ull << 40};
    struct pm_pool *p = open_pool(POOL, NULL);
    struct check_out c;
    uint32_t segs[2];
    struct seen s;
    char key[16];
    unsigned tried = 0;

    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "key%02d", i);
        segs[0] = (uint32_t)(put(p, key, 'v', 1000, NULL) >> 32);
    }
    ck_assert_int_eq(pm_lease(p, &segs[1]), 0);
    lessee_put(p, segs[1], "c1", "one", NULL);
    lessee_put(p, segs[1], "c2", "two", NULL);
    commit(p);
    pm_close(p);
    expect_headers_sound();

    for (unsigned si = 0; si < 2; si++) {
        uint64_t seg_off = pm_seg_offset(segs[si], SEG);
        struct pm_seg_hdr good;

        file_read((off_t)seg_off, &good, sizeof(good));
        for (unsigned w = 0; w < sizeof(seg_words) / sizeof(seg_words[0]); w++)
            for (unsigned f = 0; f < sizeof(flips) / sizeof(flips[0]); f++) {
                struct pm_seg_hdr bad = good;
                uint8_t *word = (uint8_t *)&bad + seg_words[w].at;
                uint64_t v = 0;
                char what[96], line[64];
                uint8_t *before;
                size_t len;

                memcpy(&v, word, seg_words[w].size);
                v = flips[f] ? v ^ flips[f] : 0;
                memcpy(word, &v, seg_words[w].size);
                if (memcmp(&bad, &good, sizeof(bad)) == 0)
                    continue;        /* a word that is 0 already, a bit beyond it */
                tried++;
                snprintf(what, sizeof(what), "segment %u, %s %s", segs[si], seg_words[w].name,
                         flips[f] ? "with a bit flipped" : "zeroed");
                file_write((off_t)seg_off, &bad, sizeof(bad));
                before = file_snapshot(&len);
                check_pool(&c);
                ck_assert_msg(c.rc == TERN_ECORRUPT, "%s: check says %s\n%s", what,
                              tern_strerror(c.rc), c.text);
                ck_assert_msg(c.bad >= seg_off && c.bad < seg_off + sizeof(bad),
                              "%s: bad offset %llu", what, (unsigned long long)c.bad);
                snprintf(line, sizeof(line), "segment %u + %llu: segment header", segs[si],
                         (unsigned long long)(c.bad - seg_off));
                ck_assert_msg(reported(&c, "corrupt  ", (off_t)c.bad) && strstr(c.text, line),
                              "%s: not reported as such:\n%s", what, c.text);
                ck_assert_msg(open_rc(0, NULL, &p) == TERN_ECORRUPT, "%s: the pool opened",
                              what);
                expect_file(before, len, what);
                free(before);
                file_write((off_t)seg_off, &good, sizeof(good));
            }
    }
    ck_assert_uint_ge(tried, 35);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "check: %s\n%s", tern_strerror(c.rc), c.text);
    p = open_pool(0, &s);
    ck_assert_uint_eq(s.n, 42);
    pm_close(p);
}
END_TEST

/* The child: reopen, clean the sealed segment (the owner still needs
 * `live`, the rest is dead), then take a lease (another segment opened);
 * dies at the injected msync. */
struct clean_crash {
    pm_loc live, dead;
};

static int do_clean_and_lease(void *arg)
{
    struct clean_crash *cc = arg;
    struct clean_log l = {.live = {cc->live}, .n_live = 1};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_opts o = {0};
    struct pm_pool *p;
    uint32_t seg;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    pm_dead(p, cc->dead);
    if (pm_clean(p, &c, 1, 100) != 1)
        return 11;
    if (pm_lease(p, &seg) < 0 || pm_commit(p) < 0)
        return 12;
    return 13;
}

/* Freeing a segment (two persisted stores: the commit point back to
 * nothing, then seq 0) and opening one (the summed header, then seq) never
 * leave, at any crash point, a header that fails its checks: the check
 * passes and the pool opens with the live record, at every msync of a
 * clean and of a lease's opening. */
START_TEST(seg_header_crash_states)
{
    struct clean_crash cc;
    struct pm_pool *p;
    struct check_out c;
    uint64_t vlive, vfill;
    uint8_t *orig;
    size_t len;
    int syncs, st = 0;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    p = open_pool(POOL, NULL);
    cc.live = put(p, "live", 'l', 100, &vlive);
    cc.dead = put(p, "dead", 'd', 100, NULL);
    put(p, "fill", 'f', FILL_LEN, &vfill);     /* seals the first segment */
    commit(p);
    pm_close(p);
    orig = file_snapshot(&len);
    for (syncs = 1; syncs < 40; syncs++) {
        struct seen s;

        file_write(0, orig, len);
        st = crash_child(do_clean_and_lease, &cc, syncs);
        ck_assert_msg(st == 0 || st == 13, "msync %d: child failed with %d", syncs, st);
        check_pool(&c);
        ck_assert_msg(c.rc == 0, "crash at msync %d: check: %s\n%s", syncs,
                      tern_strerror(c.rc), c.text);
        p = open_pool(0, &s);
        ck_assert_msg(seen_ver(&s, vlive) && seen_ver(&s, vfill),
                      "crash at msync %d: a record is gone", syncs);
        pm_close(p);
        if (st == 13)
            break;
    }
    ck_assert_msg(st == 13, "the child never got through");
    ck_assert_int_gt(syncs, 6);
    free(orig);
}
END_TEST

/* Rewrite the closed pool's file as layout `layout` (3 or 4) wrote it: plain
 * commit points, zeros where `opened` and the header sum go. */
static void make_old_layout(uint32_t layout)
{
    struct pm_file_hdr fh;

    file_read(0, &fh, sizeof(fh));
    for (uint32_t s = 0; s < fh.n_segs; s++) {
        struct pm_seg_hdr h;

        file_read((off_t)pm_seg_offset(s, SEG), &h, sizeof(h));
        h.commit = (uint32_t)h.commit;
        h.opened = 0;
        h.sum = 0;
        file_write((off_t)pm_seg_offset(s, SEG), &h, sizeof(h));
    }
    fh.layout = layout;
    fh.sum = pm_sum(&fh, offsetof(struct pm_file_hdr, sum));
    file_write(0, &fh, sizeof(fh));
}

static int do_open(void *arg)
{
    struct pm_opts o = {0};
    struct pm_pool *p;

    (void)arg;
    if (pm_open(path, &o, &p) < 0)
        return 10;
    pm_close(p);
    return 11;
}

/* A layout-4 pool (records in the head, in a leased segment, a segment
 * freed) is upgraded on open, and a crash at any msync of the upgrade
 * leaves a file that passes the check (segments of both forms) and that
 * the next open upgrades, every record still there. */
START_TEST(layout4_upgrade_crash_states)
{
    struct clean_log l = {0};
    struct pm_cleaner cl = {.is_live = cl_is_live, .moved = cl_moved,
                                 .dropped = cl_dropped, .arg = &l};
    bool pmem = pool_is_pmem();
    struct pm_pool *p = open_pool(POOL, NULL);
    struct check_out c;
    uint64_t v[4];
    uint32_t seg;
    uint8_t *orig;
    size_t len;
    int syncs, st = 0;

    pm_dead(p, put(p, "gone", 'g', FILL_LEN, NULL));
    put(p, "own", 'o', 100, &v[0]);
    ck_assert_int_eq(pm_clean(p, &cl, 1, 100), 1);     /* "gone"'s segment */
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    lessee_put(p, seg, "c1", "one", &v[1]);
    lessee_put(p, seg, "c2", "two", &v[2]);
    put(p, "own2", 'p', 200, &v[3]);
    commit(p);
    pm_close(p);
    make_old_layout(4);
    check_pool(&c);
    ck_assert_msg(c.rc == 0, "the layout-4 pool fails its check: %s\n%s", tern_strerror(c.rc),
                  c.text);
    ck_assert_uint_eq(c.info.version, 4);
    orig = file_snapshot(&len);
    for (syncs = 1; syncs < 40; syncs++) {
        struct seen s;

        file_write(0, orig, len);
        if (!pmem) {
            st = crash_child(do_open, NULL, syncs);
            ck_assert_msg(st == 0 || st == 11, "msync %d: child failed with %d", syncs, st);
            check_pool(&c);
            ck_assert_msg(c.rc == 0, "crash at msync %d: check: %s\n%s", syncs,
                          tern_strerror(c.rc), c.text);
        } else {
            st = 11;                    /* flushes bypass pmem_msync: no crash points */
        }
        p = open_pool(0, &s);
        ck_assert_uint_eq(s.n, 4);
        for (int i = 0; i < 4; i++)
            ck_assert_msg(seen_ver(&s, v[i]), "crash at msync %d: record %d is gone", syncs, i);
        pm_close(p);
        expect_headers_sound();
        if (st == 11)
            break;
    }
    ck_assert_msg(st == 11, "the child never got through");
    free(orig);
}
END_TEST

/* An old pool whose segment header fails its layout's checks is refused
 * before the upgrade writes anything. */
START_TEST(corrupt_old_layout_not_upgraded)
{
    struct pm_pool *p = open_pool(POOL, NULL);
    struct pm_opts o = {0};
    struct check_out c;
    uint64_t big = 2ull * SEG;
    uint32_t seg;
    uint8_t *before;
    size_t len;

    put(p, "a", 'a', 100, NULL);
    seg = (uint32_t)(put(p, "b", 'b', 100, NULL) >> 32);
    commit(p);
    pm_close(p);
    make_old_layout(4);
    file_write((off_t)(pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, commit)), &big,
               sizeof(big));
    before = file_snapshot(&len);
    ck_assert_int_eq(pm_open(path, &o, &p), TERN_ECORRUPT);
    expect_file(before, len, "refused upgrade");
    check_pool(&c);
    ck_assert_int_eq(c.rc, TERN_ECORRUPT);
    ck_assert_uint_eq(c.bad, pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, commit));
    free(before);
}
END_TEST

/* ---- a clean cut short: recovery hands the copy first ---- */

struct dup_case {
    uint32_t lseg;                   /* the victim: a segment that was leased */
    pm_loc orig;                /* its one record, live */
    uint64_t ver;
};

/* The child: reopen and clean the once-leased segment, whose record the
 * owner still needs: it is copied into the head, which was opened before
 * the lease (a lower sequence number than the victim's). */
static int do_clean_leased(void *arg)
{
    struct dup_case *d = arg;
    struct clean_log l = {.live = {d->orig}, .n_live = 1};
    struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                .dropped = cl_dropped, .arg = &l};
    struct pm_opts o = {0};
    struct pm_pool *p;

    if (pm_open(path, &o, &p) < 0 || pm_recover(p, NULL, NULL) < 0)
        return 10;
    if (pm_clean(p, &c, 1, 100) != 1 || l.n_moved != 1)
        return 11;
    return 12;
}

/* A crash between a clean's commit and its victim's free leaves two
 * records of one version. Recovery hands the copy first, even where the
 * victim has the higher sequence number (a segment leased after the head
 * was opened) or the higher index, so that an owner that keeps the first
 * finds the victim all dead and the next clean frees it without copying a
 * byte: a pool the crash left without a free segment is not stuck. */
START_TEST(interrupted_clean_copy_first)
{
    struct dup_case d;
    struct pm_pool *p;
    uint8_t *orig;
    size_t len;
    unsigned dups = 0;
    int syncs, st = 0;

    if (pool_is_pmem())
        return;                         /* flushes bypass pmem_msync */
    p = open_pool(POOL, NULL);
    put(p, "own", 'o', 100, NULL);
    ck_assert_int_eq(pm_lease(p, &d.lseg), 0);
    d.orig = lessee_put(p, d.lseg, "c1", "one", &d.ver);
    commit(p);
    pm_lease_end(p, d.lseg);
    pm_close(p);
    orig = file_snapshot(&len);
    for (syncs = 1; syncs < 20 && st != 12; syncs++) {
        struct clean_log l = {0};
        struct pm_cleaner c = {.is_live = cl_is_live, .moved = cl_moved,
                                    .dropped = cl_dropped, .arg = &l};
        const struct rec_copy *first = NULL;
        pm_loc kept;
        unsigned n = 0;
        struct seen s;

        file_write(0, orig, len);
        st = crash_child(do_clean_leased, &d, syncs);
        ck_assert_msg(st == 0 || st == 12, "msync %d: child failed with %d", syncs, st);
        p = open_pool(0, &s);
        for (unsigned i = 0; i < s.n; i++)
            if (s.r[i].version == d.ver && n++ == 0)
                first = &s.r[i];
        ck_assert_msg(first, "crash at msync %d: the record is gone", syncs);
        if (n == 1) {
            pm_close(p);
            continue;
        }
        ck_assert_uint_eq(n, 2);
        dups++;
        ck_assert_msg(first->loc >> 32 != d.lseg,
                      "crash at msync %d: the victim's original came before the copy", syncs);
        /* The owner keeps the first: the victim goes without a copy. */
        kept = first->loc;
        l.live[l.n_live++] = kept;
        ck_assert_int_eq(pm_clean(p, &c, 1, 100), 1);
        ck_assert_uint_eq(l.n_moved, 0);
        ck_assert(logged(l.dropped, l.n_dropped, d.orig));
        pm_close(p);
        p = open_pool(0, &s);
        ck_assert_uint_eq(s.n, 2);
        ck_assert_uint_eq(seen_ver(&s, d.ver)->loc, kept);
        pm_close(p);
    }
    ck_assert_msg(st == 12, "the child never got through");
    ck_assert_uint_ge(dups, 1);
    free(orig);
}
END_TEST

/* ---- the descriptor handed out for registration ---- */

/* pm_fd is the pool's file without its lock: a holder of a duplicate
 * (as a shm peer gets one) can neither take the lock through it nor drop
 * the owner's, and the pool stays locked until the owner closes it. */
START_TEST(shared_fd_carries_no_lock)
{
    struct pm_pool *p = open_pool(POOL, NULL), *q = NULL;
    struct pm_opts o = {0};
    struct stat a, b;
    int fd = fcntl(pm_fd(p), F_DUPFD_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fstat(fd, &a), 0);
    ck_assert_int_eq(stat(path, &b), 0);
    ck_assert(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
    ck_assert_int_eq(flock(fd, LOCK_EX | LOCK_NB), -1);
    ck_assert_int_eq(errno, EWOULDBLOCK);
    ck_assert_int_eq(flock(fd, LOCK_UN), 0);
    ck_assert_int_eq(pm_open(path, &o, &q), TERN_EBUSY);
    pm_close(p);
    /* The duplicate outlives the owner, and keeps nothing locked. */
    ck_assert_int_eq(pm_open(path, &o, &q), 0);
    pm_close(q);
    close(fd);
}
END_TEST

Suite *suite_pm(void)
{
    Suite *s = suite_create("pm");
    TCase *tc = tcase_create("pool");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, slot_walk);
    tcase_add_test(tc, overwrite_in_place);
    tcase_add_test(tc, overwrite_refused);
    tcase_add_test(tc, crash_after_mark);
    tcase_add_test(tc, crash_in_rewrite);
    tcase_add_test(tc, rewrite_commits_newer_version_first);
    tcase_add_test(tc, overwrite_behind_leaves_batch_pending);
    tcase_add_test(tc, rewrite_pending_rules);
    tcase_add_test(tc, corruption_still_refused);
    tcase_add_test(tc, clean_steps_over_torn_rewrite);
    tcase_add_test(tc, clean_walks_slots);
    tcase_add_test(tc, commit_syncs_what_was_written);
    tcase_add_test(tc, lease_records_survive_reopen);
    tcase_add_test(tc, lessee_garbage_refused);
    tcase_add_test(tc, lease_end_drops_uncommitted);
    tcase_add_test(tc, lease_starts_past_header);
    tcase_add_test(tc, layout3_pool_is_upgraded);
    tcase_add_test(tc, clean_skips_active_lease);
    tcase_add_test(tc, lease_keeps_reserves);
    tcase_add_test(tc, scribbled_lease_is_cut);
    tcase_add_test(tc, reused_lease_segment_is_ordinary);
    tcase_add_test(tc, seg_header_damage_refused);
    tcase_add_test(tc, seg_header_crash_states);
    tcase_add_test(tc, layout4_upgrade_crash_states);
    tcase_add_test(tc, corrupt_old_layout_not_upgraded);
    tcase_add_test(tc, interrupted_clean_copy_first);
    tcase_add_test(tc, shared_fd_carries_no_lock);
    suite_add_tcase(s, tc);

    tc = tcase_create("flush");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, split_flush_with_helpers, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_loop_test(tc, split_flush_alone, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_loop_test(tc, split_flush_contended, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_loop_test(tc, split_flush_threshold, MODE_MSYNC, MODE_PMEM + 1);
    tcase_add_test(tc, helper_msync_failure_stops_commits);
    tcase_add_test(tc, late_helper_not_waited_for);
    tcase_add_loop_test(tc, helpers_then_kill, MODE_MSYNC, MODE_PMEM + 1);
    suite_add_tcase(s, tc);
    return s;
}
