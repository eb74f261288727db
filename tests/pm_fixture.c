/* The pm suite's shared fixtures (pm_fixture.h). */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libpmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pm_fixture.h"

char path[128];

/* ---- crash injection ---- */

static int crash_after_syncs;        /* > 0: _exit(0) after that many more msyncs */

struct sync_log sync_log;

__thread unsigned helper_no;
unsigned helper_sync_delay_us, owner_piece_delay_us;
unsigned helper_pieces_started;
int helper_sync_fail;

void sync_log_start(void)
{
    __atomic_store_n(&sync_log.n, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&sync_log.on, true, __ATOMIC_RELAXED);
}

void sync_log_stop(void)
{
    __atomic_store_n(&sync_log.on, false, __ATOMIC_RELAXED);
}

unsigned sync_log_len(void)
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

const struct rec_copy *seen_ver(const struct seen *s, uint64_t version)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->r[i].version == version)
            return &s->r[i];
    return NULL;
}

const struct rec_copy *seen_loc(const struct seen *s, pm_loc loc)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->r[i].loc == loc)
            return &s->r[i];
    return NULL;
}

/* Open the pool at `path` (creating it with `size` bytes if size is not
 * 0) and recover it into `s` (may be NULL); returns recovery's code. */
int open_rc(uint64_t size, struct seen *s, struct pm_pool **out)
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

struct pm_pool *open_pool(uint64_t size, struct seen *s)
{
    struct pm_pool *p;
    int rc = open_rc(size, s, &p);

    ck_assert_msg(rc == 0, "recover: %s", tern_strerror(rc));
    return p;
}

/* Append key = a value of `len` bytes of `fill`; returns its place. */
pm_loc put(struct pm_pool *p, const char *k, char fill, uint32_t len,
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

void commit(struct pm_pool *p)
{
    int rc = pm_commit(p);

    ck_assert_msg(rc == 0, "commit: %s", tern_strerror(rc));
}

off_t file_off(pm_loc loc)
{
    return (off_t)(pm_seg_offset((uint32_t)(loc >> 32), SEG) + (uint32_t)loc);
}

void file_read(off_t at, void *buf, size_t n)
{
    int fd = open(path, O_RDONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, buf, n, at), (ssize_t)n);
    close(fd);
}

void file_write(off_t at, const void *buf, size_t n)
{
    int fd = open(path, O_RDWR);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, buf, n, at), (ssize_t)n);
    close(fd);
}

/* Bytes a lessee's records start into a leased segment: a page. */
uint32_t lease_first(void)
{
    return (uint32_t)sysconf(_SC_PAGESIZE);
}

/* A segment's commit point, from its commit word (the low half). */
uint64_t seg_used(uint32_t seg)
{
    uint64_t w;

    file_read((off_t)(pm_seg_offset(seg, SEG) + offsetof(struct pm_seg_hdr, commit)), &w,
              sizeof(w));
    return (uint32_t)w;
}

void check_pool(struct check_out *c)
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
bool reported(const struct check_out *c, const char *tag, off_t at)
{
    char want[96];

    snprintf(want, sizeof(want), "%s offset %lld:", tag, (long long)at);
    return strstr(c->text, want) != NULL;
}

/* Run `fn` in a child that dies (exit 0) at its `syncs`-th msync from the
 * call on; returns the child's exit status (fn's own return if it never
 * got that far). */
int crash_child(int (*fn)(void *), void *arg, int syncs)
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

bool pool_is_pmem(void)
{
    struct pm_info info;
    struct pm_pool *p = open_pool(POOL, NULL);

    pm_get_info(p, &info);
    pm_close(p);
    return info.is_pmem;
}

uint8_t *file_snapshot(size_t *len)
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

/* ---- lessees ---- */

uint8_t *seg_ptr(struct pm_pool *p, uint32_t seg, uint32_t off)
{
    return (uint8_t *)pm_base(p) + pm_seg_file_off(p, seg) + off;
}

/* Write a record into a leased segment as its lessee would: a whole
 * record with a version of its own (junk), flags and slot 0, summed; the
 * pool swaps its version in. */
uint32_t lessee_write(struct pm_pool *p, uint32_t seg, uint32_t off, uint8_t type,
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

pm_loc lessee_put(struct pm_pool *p, uint32_t seg, const char *key,
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

/* ---- rewrites in place ---- */

void rewrite_setup(struct rewrite_case *rc, bool newer)
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

/* ---- cleaning ---- */

bool cl_is_live(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct clean_log *l = arg;

    (void)r;
    l->asked[l->n_asked++] = loc;
    for (unsigned i = 0; i < l->n_live; i++)
        if (l->live[i] == loc)
            return true;
    return false;
}

void cl_moved(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r)
{
    struct clean_log *l = arg;

    (void)r;
    for (unsigned i = 0; i < l->n_live; i++)
        if (l->live[i] == from)
            l->live[i] = to;
    l->n_moved++;
}

void cl_dropped(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct clean_log *l = arg;

    (void)r;
    l->dropped[l->n_dropped++] = loc;
}

bool logged(const pm_loc *locs, unsigned n, pm_loc loc)
{
    for (unsigned i = 0; i < n; i++)
        if (locs[i] == loc)
            return true;
    return false;
}
