/* Suite kv: the pool (services/pm) and the key-value engine on it, in one
 * process: round trips, recovery after reopen, the commit point, cleaning,
 * full pools, oversized input, corrupted files and a random model check. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "kv/kv_store.h"
#include "pm/pm.h"
#include "pm/pm_layout.h"
#include "suites.h"

#define SEG (64u * 1024)

static char path[128];

static void setup(void)
{
    test_pool_file(path, sizeof(path), "kv");
}

static void teardown(void)
{
    test_pool_file_remove(path);
}

static struct kvs *open_store_opts(uint64_t size, bool append_only)
{
    struct kvs_opts o = {.path = path, .pool_size = size, .seg_size = SEG,
                                   .append_only = append_only};
    struct kvs *s = NULL;
    int rc = kvs_open(&o, &s);

    ck_assert_msg(rc == 0, "open: %s", tern_strerror(rc));
    return s;
}

static struct kvs *open_store(uint64_t size)
{
    return open_store_opts(size, false);
}

static void put_str(struct kvs *s, const char *k, const char *v)
{
    int rc = kvs_put(s, k, strlen(k), v, strlen(v), TERN_KV_SYNC, NULL);

    ck_assert_msg(rc == 0, "put %s: %s", k, tern_strerror(rc));
}

/* 1 if k = v, 0 if absent; fails the test on a different value. */
static int has(struct kvs *s, const char *k, const char *v)
{
    const void *val;
    uint32_t len;
    int rc = kvs_get(s, k, strlen(k), &val, &len, NULL);

    if (rc == TERN_ENOENT)
        return 0;
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(len == strlen(v) && memcmp(val, v, len) == 0, "%s: wrong value %.*s", k,
                  (int)len, (const char *)val);
    return 1;
}

START_TEST(put_get_del)
{
    struct kvs *s = open_store(1 << 20);
    uint64_t v1, v2, v3;
    const void *val;
    uint32_t len;

    ck_assert_int_eq(kvs_put(s, "a", 1, "one", 3, 0, &v1), 0);
    ck_assert_int_eq(kvs_put(s, "a", 1, "uno", 3, 0, &v2), 0);
    ck_assert_uint_gt(v2, v1);
    ck_assert_int_eq(has(s, "a", "uno"), 1);
    ck_assert_int_eq(kvs_put(s, "empty", 5, NULL, 0, 0, NULL), 0);
    ck_assert_int_eq(kvs_get(s, "empty", 5, &val, &len, NULL), 0);
    ck_assert_uint_eq(len, 0);
    ck_assert_uint_eq(kvs_count(s), 2);
    ck_assert_int_eq(kvs_del(s, "a", 1, 0, &v3), 0);
    ck_assert_uint_gt(v3, v2);
    ck_assert_int_eq(has(s, "a", ""), 0);
    ck_assert_int_eq(kvs_del(s, "a", 1, 0, NULL), TERN_ENOENT);
    ck_assert_int_eq(kvs_del(s, "nope", 4, 0, NULL), TERN_ENOENT);
    ck_assert_uint_eq(kvs_count(s), 1);
    /* Back after a delete. */
    put_str(s, "a", "again");
    ck_assert_int_eq(has(s, "a", "again"), 1);
    ck_assert_uint_eq(kvs_count(s), 2);
    kvs_close(s);
}
END_TEST

START_TEST(bad_sizes)
{
    struct kvs *s = open_store(1 << 20);
    static char big[SEG];
    size_t max = kvs_val_max(s, 3);

    ck_assert_int_eq(kvs_put(s, "", 0, "v", 1, 0, NULL), TERN_EINVAL);
    ck_assert_int_eq(kvs_put(s, big, KV_KEY_MAX + 1, "v", 1, 0, NULL),
                     TERN_E2BIG);
    ck_assert_uint_lt(max, SEG);
    put_str(s, "key", "old");
    ck_assert_int_eq(kvs_put(s, "key", 3, big, max + 1, 0, NULL), TERN_E2BIG);
    ck_assert_int_eq(has(s, "key", "old"), 1);      /* nothing lost */
    ck_assert_int_eq(kvs_put(s, "key", 3, big, max, TERN_KV_SYNC, NULL), 0);
    ck_assert_int_eq(kvs_get(s, big, KV_KEY_MAX + 1, &(const void *){0},
                                       &(uint32_t){0}, NULL), TERN_E2BIG);
    kvs_close(s);
}
END_TEST

START_TEST(survives_reopen)
{
    struct kvs *s = open_store(4 << 20);
    char k[32], v[32];

    for (int i = 0; i < 1000; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        snprintf(v, sizeof(v), "v%d", i);
        put_str(s, k, v);
    }
    for (int i = 0; i < 1000; i += 3) {          /* overwrite a third */
        snprintf(k, sizeof(k), "key%d", i);
        snprintf(v, sizeof(v), "w%d", i);
        put_str(s, k, v);
    }
    for (int i = 1; i < 1000; i += 5) {          /* delete a fifth */
        snprintf(k, sizeof(k), "key%d", i);
        ck_assert_int_eq(kvs_del(s, k, strlen(k), TERN_KV_SYNC, NULL), 0);
    }
    uint64_t count = kvs_count(s);
    kvs_close(s);

    s = open_store(0);
    ck_assert_uint_eq(kvs_count(s), count);
    for (int i = 0; i < 1000; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        snprintf(v, sizeof(v), "%c%d", i % 3 == 0 ? 'w' : 'v', i);
        ck_assert_int_eq(has(s, k, v), i % 5 != 1);
    }
    kvs_close(s);
}
END_TEST

/* Writes appended but never committed (the process died before the commit
 * point moved): on PM they are not there after recovery; through a file,
 * where the commit word lags (PM_SEG_TAIL), whole records past it may show,
 * but only as a prefix of what was appended, in order. The committed ones
 * are there either way. */
START_TEST(uncommitted_write_is_not_recovered)
{
    struct kvs *s = open_store(1 << 20);
    struct pm_info info;
    pid_t pid;
    int st;

    put_str(s, "kept", "yes");
    kvs_close(s);
    pid = fork();
    if (pid == 0) {
        struct kvs_opts o = {.path = path};

        if (kvs_open(&o, &s) != 0)
            _exit(1);
        if (kvs_put(s, "lost", 4, "no", 2, 0, NULL) != 0)   /* no sync */
            _exit(2);
        if (kvs_put(s, "kept", 4, "overwritten", 11, 0, NULL) != 0)
            _exit(3);
        _exit(0);       /* dies with the records past the commit point */
    }
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_int_eq(WEXITSTATUS(st), 0);
    s = open_store(0);
    pm_get_info(kvs_pool(s), &info);
    if (info.is_pmem) {
        ck_assert_int_eq(has(s, "lost", ""), 0);
        ck_assert_int_eq(has(s, "kept", "yes"), 1);
    } else {
        const void *val;
        uint32_t len;

        ck_assert_int_eq(kvs_get(s, "kept", 4, &val, &len, NULL), 0);
        if (len == 11) {    /* the second uncommitted write shows: the first does too */
            ck_assert_int_eq(memcmp(val, "overwritten", 11), 0);
            ck_assert_int_eq(has(s, "lost", "no"), 1);
        } else {
            ck_assert_int_eq(has(s, "kept", "yes"), 1);
        }
    }
    kvs_close(s);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, NULL), 0);
}
END_TEST

START_TEST(second_opener_is_refused)
{
    struct kvs *s = open_store(1 << 20), *s2 = NULL;
    struct kvs_opts o = {.path = path};

    ck_assert_int_eq(kvs_open(&o, &s2), TERN_EBUSY);
    kvs_close(s);
    ck_assert_int_eq(kvs_open(&o, &s2), 0);
    kvs_close(s2);
}
END_TEST

/* BOOM-KV's hybrid update: once a key has a superseded record, later PUTs
 * that fit rewrite it in place, so repeated updates stop growing the log;
 * the newest values survive reopen, and a value that does not fit appends. */
START_TEST(updates_in_place_reuse_space)
{
    struct kvs *s = open_store(1 << 20);
    struct kvs_stats st;
    uint64_t used_after_two;
    char k[32], v[64];

    for (int round = 0; round <= 50; round++) {
        for (int i = 0; i < 10; i++) {
            snprintf(k, sizeof(k), "key%d", i);
            snprintf(v, sizeof(v), "value %02d of key %d", round, i);
            put_str(s, k, v);
        }
        if (round == 1) {
            kvs_get_stats(s, &st);
            used_after_two = st.pool.bytes_committed;
        }
    }
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.in_place, 10 * 49);
    ck_assert_uint_eq(st.pool.bytes_committed, used_after_two);
    /* Too long for either slot: appended, and the key still reads right. */
    put_str(s, "key3", "a value far too long for the slots of the earlier ones of key3");
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.in_place, 10 * 49);
    ck_assert_uint_gt(st.pool.bytes_committed, used_after_two);
    kvs_close(s);
    s = open_store(0);
    ck_assert_uint_eq(kvs_count(s), 10);
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        snprintf(v, sizeof(v), "value 50 of key %d", i);
        if (i == 3)
            snprintf(v, sizeof(v), "a value far too long for the slots of the earlier ones of key3");
        ck_assert_msg(has(s, k, v), "%s is gone after reopen", k);
    }
    kvs_close(s);
}
END_TEST

/* A key with an older record to rewrite: v1 then v2, synced. Returns the
 * location of v1 (kvs_locate before the second PUT), which the
 * next PUT of the key would rewrite in place. */
static pm_loc older_record(struct kvs *s, const char *k)
{
    pm_loc loc = 0, now = 0;
    uint32_t size = 0;
    uint64_t ver = 0, v1 = 0;

    ck_assert_int_eq(kvs_put(s, k, strlen(k), "value v1", 8, TERN_KV_SYNC, &v1), 0);
    ck_assert_int_eq(kvs_locate(s, k, strlen(k), &loc, &size, &ver), 0);
    ck_assert_uint_eq(ver, v1);
    ck_assert_uint_eq(size, pm_rec_size((uint32_t)strlen(k), 8));
    ck_assert_int_eq(kvs_put(s, k, strlen(k), "value v2", 8, TERN_KV_SYNC, NULL), 0);
    ck_assert_int_eq(kvs_locate(s, k, strlen(k), &now, &size, &ver), 0);
    ck_assert_uint_ne(now, loc);    /* appended: v1 is the older record now */
    return loc;
}

static uint64_t in_place(const struct kvs *s)
{
    struct kvs_stats st;

    kvs_get_stats(s, &st);
    return st.in_place;
}

/* The value bytes of the record at loc (it must be a value of key k). */
static void rec_is(struct kvs *s, pm_loc loc, const char *k, const char *v)
{
    const struct pm_rec *r = pm_rec_at(kvs_pool(s), loc);

    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->key_len, strlen(k));
    ck_assert(memcmp(pm_rec_key(r), k, strlen(k)) == 0);
    ck_assert_msg(r->val_len == strlen(v) && memcmp(pm_rec_val(r), v, r->val_len) == 0,
                  "record of %s holds %.*s, want %s", k, (int)r->val_len,
                  (const char *)pm_rec_val(r), v);
}

/* A record the server is pushing from the pool (KV_M_PGET) is pinned: no
 * PUT rewrites it in place (BOOM-KV's third condition) until it is
 * unpinned. Pins nest, and the table holds TERN_KV_PINS of them. */
START_TEST(pinned_record_is_not_rewritten)
{
    struct kvs *s = open_store(1 << 20);
    pm_loc a, b, c, d, loc;
    uint64_t before, ver;
    uint32_t size;

    /* Pinned: the PUT appends, and the pinned bytes stay as they were. */
    a = older_record(s, "pinned");
    ck_assert_int_eq(kvs_pin(s, a), 0);
    before = in_place(s);
    put_str(s, "pinned", "value v3");
    ck_assert_uint_eq(in_place(s), before);
    rec_is(s, a, "pinned", "value v1");
    ck_assert_int_eq(has(s, "pinned", "value v3"), 1);
    ck_assert_int_eq(kvs_locate(s, "pinned", 6, &loc, &size, &ver), 0);
    ck_assert_uint_ne(loc, a);
    kvs_unpin(s, a);

    /* Pinned twice, unpinned once: still pinned. */
    b = older_record(s, "nested");
    ck_assert_int_eq(kvs_pin(s, b), 0);
    ck_assert_int_eq(kvs_pin(s, b), 0);
    kvs_unpin(s, b);
    before = in_place(s);
    put_str(s, "nested", "value v3");
    ck_assert_uint_eq(in_place(s), before);
    rec_is(s, b, "nested", "value v1");
    kvs_unpin(s, b);

    /* Pinned, then unpinned: the next PUT rewrites it in place. */
    c = older_record(s, "released");
    ck_assert_int_eq(kvs_pin(s, c), 0);
    kvs_unpin(s, c);
    before = in_place(s);
    put_str(s, "released", "value v3");
    ck_assert_uint_eq(in_place(s), before + 1);
    rec_is(s, c, "released", "value v3");
    ck_assert_int_eq(kvs_locate(s, "released", 8, &loc, &size, &ver), 0);
    ck_assert_uint_eq(loc, c);

    /* A full table: TERN_ENOBUFS for a new location, but a pinned one
     * still nests; one unpinned makes room. Other keys' records are not
     * held back by it. */
    for (unsigned i = 0; i < TERN_KV_PINS; i++)
        ck_assert_int_eq(kvs_pin(s, (pm_loc)(1000 + i) << 32 | 64), 0);
    ck_assert_int_eq(kvs_pin(s, (pm_loc)2000 << 32 | 64), TERN_ENOBUFS);
    ck_assert_int_eq(kvs_pin(s, (pm_loc)1005 << 32 | 64), 0);
    d = older_record(s, "crowded");
    ck_assert_int_eq(kvs_pin(s, d), TERN_ENOBUFS);
    before = in_place(s);
    put_str(s, "crowded", "value v3");      /* d was not pinned: in place */
    ck_assert_uint_eq(in_place(s), before + 1);
    rec_is(s, d, "crowded", "value v3");
    kvs_unpin(s, (pm_loc)1003 << 32 | 64);
    ck_assert_int_eq(kvs_pin(s, (pm_loc)2000 << 32 | 64), 0);
    ck_assert_int_eq(kvs_pin(s, (pm_loc)2001 << 32 | 64), TERN_ENOBUFS);
    /* 1005 was pinned twice: one unpin leaves it in the table. */
    kvs_unpin(s, (pm_loc)1005 << 32 | 64);
    ck_assert_int_eq(kvs_pin(s, (pm_loc)2001 << 32 | 64), TERN_ENOBUFS);
    kvs_unpin(s, (pm_loc)1005 << 32 | 64);
    ck_assert_int_eq(kvs_pin(s, (pm_loc)2001 << 32 | 64), 0);
    /* Unpinning what is not pinned changes nothing. */
    kvs_unpin(s, (pm_loc)3000 << 32 | 64);
    ck_assert_int_eq(kvs_pin(s, (pm_loc)2002 << 32 | 64), TERN_ENOBUFS);
    for (unsigned i = 0; i < TERN_KV_PINS; i++)
        kvs_unpin(s, (pm_loc)(1000 + i) << 32 | 64);
    kvs_unpin(s, (pm_loc)2000 << 32 | 64);
    kvs_unpin(s, (pm_loc)2001 << 32 | 64);

    /* Emptied: the table takes a new pin again, and it holds... */
    d = older_record(s, "after");
    ck_assert_int_eq(kvs_pin(s, d), 0);
    before = in_place(s);
    put_str(s, "after", "value v3");
    ck_assert_uint_eq(in_place(s), before);
    rec_is(s, d, "after", "value v1");
    kvs_unpin(s, d);
    /* ...and v2's record, the older one now, is rewritten in place. */
    put_str(s, "after", "value v4");
    ck_assert_uint_eq(in_place(s), before + 1);
    ck_assert_int_eq(has(s, "after", "value v4"), 1);
    ck_assert_int_eq(has(s, "pinned", "value v3"), 1);
    ck_assert_int_eq(has(s, "nested", "value v3"), 1);
    kvs_close(s);
}
END_TEST

/* Overwrites far beyond the pool's size succeed because cleaning takes back
 * the dead versions; the newest values and the deletions survive reopen. */
START_TEST(cleaning_reclaims_space)
{
    /* Append-only: updates in place would leave nothing to clean. */
    struct kvs *s = open_store_opts(8 * SEG + 4096, true);
    struct kvs_stats st;
    char k[32], v[128];

    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 100; i++) {
            snprintf(k, sizeof(k), "key%d", i);
            snprintf(v, sizeof(v), "value %d of round %d padded to be a bit longer", i, round);
            put_str(s, k, v);
        }
        /* Deleted keys must stay deleted through cleaning and recovery. */
        snprintf(k, sizeof(k), "gone%d", round);
        put_str(s, k, "temporary");
        ck_assert_int_eq(kvs_del(s, k, strlen(k), TERN_KV_SYNC, NULL), 0);
    }
    kvs_get_stats(s, &st);
    ck_assert_uint_gt(st.segs_cleaned, 10);
    kvs_close(s);
    s = open_store(0);
    ck_assert_uint_eq(kvs_count(s), 100);
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        snprintf(v, sizeof(v), "value %d of round %d padded to be a bit longer", i, 199);
        ck_assert_int_eq(has(s, k, v), 1);
    }
    for (int round = 0; round < 200; round++) {
        snprintf(k, sizeof(k), "gone%d", round);
        ck_assert_int_eq(has(s, k, ""), 0);
    }
    kvs_close(s);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, NULL), 0);
}
END_TEST

/* A full pool says TERN_ENOSPC, loses nothing acknowledged, and takes
 * writes again once keys are deleted. */
START_TEST(full_pool)
{
    struct kvs *s = open_store(4 * SEG + 4096);
    char k[32], v[512];
    int n = 0, rc;

    memset(v, 'x', sizeof(v));
    for (;;) {
        snprintf(k, sizeof(k), "key%d", n);
        rc = kvs_put(s, k, strlen(k), v, sizeof(v), TERN_KV_SYNC, NULL);
        if (rc < 0)
            break;
        n++;
    }
    ck_assert_int_eq(rc, TERN_ENOSPC);
    ck_assert_int_gt(n, 100);
    ck_assert_uint_eq(kvs_count(s), (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const void *val;
        uint32_t len;

        snprintf(k, sizeof(k), "key%d", i);
        ck_assert_int_eq(kvs_get(s, k, strlen(k), &val, &len, NULL), 0);
        ck_assert_uint_eq(len, sizeof(v));
    }
    for (int i = 0; i < n; i += 2) {
        snprintf(k, sizeof(k), "key%d", i);
        ck_assert_int_eq(kvs_del(s, k, strlen(k), TERN_KV_SYNC, NULL), 0);
    }
    for (int i = 0; i < n / 4; i++) {
        snprintf(k, sizeof(k), "new%d", i);
        rc = kvs_put(s, k, strlen(k), v, sizeof(v), TERN_KV_SYNC, NULL);
        ck_assert_msg(rc == 0, "put after deletes: %s", tern_strerror(rc));
    }
    kvs_close(s);
}
END_TEST

static int count_visit(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                       uint64_t version)
{
    unsigned *seen = arg;
    int i;

    ck_assert_int_eq(sscanf(key, "key%d", &i), 1);
    ck_assert(i >= 0 && i < 5000);
    seen[i]++;
    return 0;
}

/* A scan sees every key present throughout, even while the table grows. */
START_TEST(scan_survives_growth)
{
    struct kvs *s = open_store(8 << 20);
    static unsigned seen[5000];
    uint64_t cur = 0, next;
    char k[32];
    int calls = 0;

    for (int i = 0; i < 1000; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        put_str(s, k, "v");
    }
    do {
        ck_assert_int_eq(kvs_scan(s, cur, 50, count_visit, seen, &next), 0);
        cur = next;
        /* Grow the index between calls: 4000 more keys over the scan. */
        for (int i = 0; i < 200 && calls < 20; i++) {
            snprintf(k, sizeof(k), "key%d", 1000 + calls * 200 + i);
            put_str(s, k, "v");
        }
        calls++;
    } while (cur);
    for (int i = 0; i < 1000; i++)
        ck_assert_msg(seen[i] >= 1, "key%d missed by the scan", i);
    kvs_close(s);
}
END_TEST

/* Flip one byte of a committed record: the pool is refused with the
 * record's offset, and the file is left exactly as it was. */
START_TEST(corrupt_record_is_refused)
{
    struct kvs *s = open_store(1 << 20);
    uint64_t bad = 0, bad2 = 0;
    struct stat st;
    char *before, *after;
    int fd;

    put_str(s, "alpha", "first value");
    put_str(s, "beta", "second value");
    kvs_close(s);
    /* The second record of segment 0: header 4096 + segment header 64 +
     * the first record (24 + 5 + 11 = 40 bytes). */
    const off_t rec2 = 4096 + 64 + 40;
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, "X", 1, rec2 + 24 + 2), 1);    /* a byte of "beta" */
    fstat(fd, &st);
    before = malloc((size_t)st.st_size);
    ck_assert_int_eq(pread(fd, before, (size_t)st.st_size, 0), st.st_size);
    close(fd);

    struct kvs_opts o = {.path = path};
    ck_assert_int_eq(kvs_open(&o, &s), TERN_ECORRUPT);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, &bad), TERN_ECORRUPT);
    ck_assert_int_eq((off_t)bad, rec2);
    ck_assert_int_eq(pm_check(path, false, NULL, NULL, &bad2), 0);  /* info: header only */

    fd = open(path, O_RDONLY);
    after = malloc((size_t)st.st_size);
    ck_assert_int_eq(pread(fd, after, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    ck_assert(memcmp(before, after, (size_t)st.st_size) == 0);
    free(before);
    free(after);
}
END_TEST

START_TEST(bad_headers_are_refused)
{
    struct kvs *s = open_store(1 << 20);
    struct kvs_opts o = {.path = path};
    int fd;

    kvs_close(s);
    fd = open(path, O_RDWR);
    /* The header's checksum catches a changed size field. */
    ck_assert_int_eq(pwrite(fd, "\x01", 1, 40), 1);
    ck_assert_int_eq(kvs_open(&o, &s), TERN_ECORRUPT);
    ck_assert_int_eq(pwrite(fd, "NOTAPOOL", 8, 0), 8);
    ck_assert_int_eq(kvs_open(&o, &s), TERN_ECORRUPT);
    ck_assert_int_eq(pm_check(path, false, NULL, NULL, NULL), TERN_ECORRUPT);
    /* A sound header of another layout version (say layout 1, whose
     * checksums were CRC32) is refused as such, not as corruption. */
    struct pm_file_hdr h;
    ck_assert_int_eq(pwrite(fd, PM_MAGIC, 8, 0), 8);
    ck_assert_int_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    h.layout = 1;
    h.sum = pm_sum(&h, offsetof(struct pm_file_hdr, sum));
    ck_assert_int_eq(pwrite(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    ck_assert_int_eq(kvs_open(&o, &s), TERN_EVERSION);
    ck_assert_int_eq(pm_check(path, false, NULL, NULL, NULL), TERN_EVERSION);
    ck_assert_int_eq(ftruncate(fd, 100), 0);
    ck_assert_int_eq(kvs_open(&o, &s), TERN_ECORRUPT);
    close(fd);
    /* A missing pool is created only when asked. */
    unlink(path);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, NULL), TERN_ENOENT);
}
END_TEST

/* A segment header whose commit point runs past the segment. */
START_TEST(bad_commit_point_is_refused)
{
    struct kvs *s = open_store(1 << 20);
    struct kvs_opts o = {.path = path};
    uint64_t used = SEG * 2, bad = 0;
    int fd;

    put_str(s, "k", "v");
    kvs_close(s);
    fd = open(path, O_RDWR);
    /* Segments are handed out from the top: find the one in use. */
    for (uint32_t seg = 0; seg < 15; seg++) {
        uint64_t seq;
        off_t at = 4096 + (off_t)seg * SEG;

        ck_assert_int_eq(pread(fd, &seq, 8, at), 8);
        if (seq)
            ck_assert_int_eq(pwrite(fd, &used, 8, at + 8), 8);
    }
    close(fd);
    ck_assert_int_eq(kvs_open(&o, &s), TERN_ECORRUPT);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, &bad), TERN_ECORRUPT);
    ck_assert_uint_gt(bad, 4096);
}
END_TEST

/* Random puts, overwrites and deletes on a small pool (so that cleaning
 * runs all the time), checked against a plain array after every reopen. */
#define MODEL_KEYS 300
START_TEST(random_model)
{
    static char model[MODEL_KEYS][40];
    static bool present[MODEL_KEYS];
    struct kvs *s = open_store(16 * SEG + 4096);
    unsigned seed = getenv("TERN_MODEL_SEED") ? (unsigned)atoi(getenv("TERN_MODEL_SEED")) : 12345;
    char k[32];

    for (int step = 0; step < 40000; step++) {
        int i = (int)(rand_r(&seed) % MODEL_KEYS), op = (int)(rand_r(&seed) % 10);

        snprintf(k, sizeof(k), "k%d", i);
        if (op < 7) {
            int len = snprintf(model[i], sizeof(model[i]), "%d-%d-%0*d", i, step,
                               (int)(rand_r(&seed) % 20), 0);

            ck_assert_int_eq(kvs_put(s, k, strlen(k), model[i], (size_t)len,
                                               step % 7 ? 0 : TERN_KV_SYNC, NULL), 0);
            present[i] = true;
        } else {
            int rc = kvs_del(s, k, strlen(k), 0, NULL);

            ck_assert_int_eq(rc, present[i] ? 0 : TERN_ENOENT);
            present[i] = false;
        }
        if (step % 5000 == 4999) {
            kvs_close(s);     /* syncs */
            s = open_store(0);
            uint64_t n = 0;
            for (int j = 0; j < MODEL_KEYS; j++) {
                snprintf(k, sizeof(k), "k%d", j);
                ck_assert_int_eq(has(s, k, model[j]), present[j]);
                n += present[j];
            }
            ck_assert_uint_eq(kvs_count(s), n);
        }
    }
    kvs_close(s);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, NULL), 0);
}
END_TEST

START_TEST(clear_deletes_everything)
{
    struct kvs *s = open_store(2 << 20);
    char k[32];

    for (int i = 0; i < 500; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        put_str(s, k, "v");
    }
    ck_assert_int_eq(kvs_clear(s, TERN_KV_SYNC), 0);
    ck_assert_uint_eq(kvs_count(s), 0);
    kvs_close(s);
    s = open_store(0);
    ck_assert_uint_eq(kvs_count(s), 0);
    ck_assert_int_eq(has(s, "key7", ""), 0);
    kvs_close(s);
}
END_TEST

/* ---- cleaning and tombstones, with segments laid out record by record ---- */

/* Record bytes one segment holds. */
#define CAP (SEG - PM_SEG_HDR)

/* Put a value sized so that its record takes exactly `rec` bytes, which
 * lets a test say which segment each record lands in and how much of it is
 * live. The value is the key's last character, repeated. */
static void put_rec(struct kvs *s, const char *k, uint32_t rec)
{
    static char val[SEG];
    size_t klen = strlen(k), len = rec - sizeof(struct pm_rec) - klen;
    int rc;

    ck_assert_uint_eq(pm_rec_size((uint32_t)klen, (uint32_t)len), rec);
    memset(val, k[klen - 1], len);
    rc = kvs_put(s, k, klen, val, len, TERN_KV_SYNC, NULL);
    ck_assert_msg(rc == 0, "put %s: %s", k, tern_strerror(rc));
}

/* 1 if k holds what put_rec(s, k, rec) wrote, 0 if absent. */
static int has_rec(struct kvs *s, const char *k, uint32_t rec)
{
    size_t klen = strlen(k), len = rec - sizeof(struct pm_rec) - klen;
    const void *val;
    uint32_t got;
    int rc = kvs_get(s, k, klen, &val, &got, NULL);

    if (rc == TERN_ENOENT)
        return 0;
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(got == len, "%s: %u bytes, not %zu", k, got, len);
    for (uint32_t i = 0; i < got; i++)
        ck_assert_msg(((const char *)val)[i] == k[klen - 1], "%s: byte %u wrong", k, i);
    return 1;
}

static void del_str(struct kvs *s, const char *k)
{
    int rc = kvs_del(s, k, strlen(k), TERN_KV_SYNC, NULL);

    ck_assert_msg(rc == 0, "del %s: %s", k, tern_strerror(rc));
}

static uint64_t segs_cleaned(struct kvs *s)
{
    struct kvs_stats st;

    kvs_get_stats(s, &st);
    return st.segs_cleaned;
}

/* A key deleted, its tombstone retired, then written and deleted again: the
 * clean that drops the first tombstone must not count it against the second
 * life's records. Six segments, so once four hold values every new head
 * goes through a clean of all segments under 90% live, and the fillers
 * (whole or nearly whole segments) decide which that is:
 *   seg0 [k=v1, A]  seg1 [t1, B]  seg2 [A']  seg3 [C]
 *   D: seg0 cleaned, v1 dropped, t1 retires (stays in seg1)
 *   seg0 [D, k=v3, tC]   E: seg3 cleaned   seg3 [E, t2, tB]
 *   F: seg1 cleaned, t1 dropped: t2 must not retire (v3 is in seg0)
 *   seg1 [F, tE]  G: seg3 cleaned; t2 is copied, not dropped.
 * Had t1 counted as one of the new entry's older records, dropping it would
 * retire t2, the last clean would drop t2 instead of copying it, and v3
 * would come back at recovery. */
START_TEST(old_tombstone_does_not_retire_new_one)
{
    struct kvs *s = open_store(6 * SEG + 4096);
    struct kvs_stats st;

    put_str(s, "k", "v1");
    put_rec(s, "fill---A", CAP - 32);
    del_str(s, "k");
    put_rec(s, "fill---B", CAP - 32);
    put_rec(s, "fill---A", CAP - 32);       /* seg0 all dead */
    put_rec(s, "fill---C", CAP);
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.pool.segs_used, 4);
    ck_assert_uint_eq(st.segs_cleaned, 0);
    put_rec(s, "fill---D", CAP - 256);      /* room left for small records */
    ck_assert_uint_eq(segs_cleaned(s), 1);
    put_str(s, "k", "v3");
    del_str(s, "fill---C");
    put_rec(s, "fill---E", CAP - 256);
    ck_assert_uint_eq(segs_cleaned(s), 2);
    del_str(s, "k");
    del_str(s, "fill---B");                 /* seg1 (t1's) all dead */
    put_rec(s, "fill---F", CAP - 256);
    ck_assert_uint_eq(segs_cleaned(s), 3);
    del_str(s, "fill---E");                 /* seg3 (t2's) all dead but t2 */
    put_rec(s, "fill---G", CAP - 256);
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.segs_cleaned, 4);
    ck_assert_uint_eq(st.pool.segs_used, 4);
    ck_assert_int_eq(has(s, "k", ""), 0);
    kvs_close(s);

    s = open_store(0);
    ck_assert_msg(has(s, "k", "v3") == 0, "deleted key k is back after reopen");
    ck_assert_int_eq(has_rec(s, "fill---A", CAP - 32), 1);
    ck_assert_int_eq(has_rec(s, "fill---B", CAP - 32), 0);
    ck_assert_int_eq(has_rec(s, "fill---C", CAP), 0);
    ck_assert_int_eq(has_rec(s, "fill---D", CAP - 256), 1);
    ck_assert_int_eq(has_rec(s, "fill---E", CAP - 256), 0);
    ck_assert_int_eq(has_rec(s, "fill---F", CAP - 256), 1);
    ck_assert_int_eq(has_rec(s, "fill---G", CAP - 256), 1);
    ck_assert_uint_eq(kvs_count(s), 4);
    kvs_close(s);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, NULL), 0);
}
END_TEST

static uint64_t seg_word(int fd, uint32_t seg, size_t field)
{
    uint64_t w;

    ck_assert_int_eq(pread(fd, &w, sizeof(w), (off_t)(pm_seg_offset(seg, SEG) + field)),
                     (ssize_t)sizeof(w));
    return w;
}

/* Give a forged segment header what a real one opened as `seq` at
 * `index` has: `opened`, the header sum and a commit word checked for
 * them (the commit point kept). */
static void seal_seg_hdr(struct pm_seg_hdr *h, uint64_t seq, uint32_t index)
{
    uint32_t used = (uint32_t)h->commit;

    h->seq = h->opened = seq;
    h->index = index;
    h->sum = pm_seg_hdr_sum(h);
    h->commit = pm_seg_commit_word(used, seq, index);
}

/* Duplicate segment `copy` (one record, all live) at the free segment
 * `victim`, which keeps `copy`'s sequence number, and make `copy` the
 * newest segment, the one appends continue in:
 * - as is, this is the pool file as a crash in the middle of a clean leaves
 *   it: the victim's live records were copied into the head and committed,
 *   and the process died before the victim was freed (its higher index
 *   puts it first in a walk by index);
 * - with `newer_victim`, the victim's record gets a version above every
 *   other, so that it is the live one whatever recovery's order, and the
 *   head holds only a dead record: a full pool whose clean has no room.
 *   No crash leaves that state (a clean's copy is what recovery keeps). */
static void forge_dup_segment(uint32_t victim, uint32_t copy, uint32_t n_segs, bool newer_victim)
{
    static uint8_t seg[SEG];
    struct pm_seg_hdr *h = (struct pm_seg_hdr *)seg;
    struct pm_rec *r = (struct pm_rec *)(seg + PM_SEG_HDR);
    uint64_t seq = 0;
    int fd = open(path, O_RDWR);

    ck_assert_int_ge(fd, 0);
    ck_assert_uint_gt(victim, copy);
    ck_assert_uint_eq(seg_word(fd, victim, offsetof(struct pm_seg_hdr, seq)), 0);
    for (uint32_t i = 0; i < n_segs; i++) {
        uint64_t q = seg_word(fd, i, offsetof(struct pm_seg_hdr, seq));

        seq = q > seq ? q : seq;
    }
    ck_assert_int_eq(pread(fd, seg, SEG, (off_t)pm_seg_offset(copy, SEG)), (ssize_t)SEG);
    seal_seg_hdr(h, h->seq, victim);
    if (newer_victim) {
        ck_assert_uint_eq(pm_rec_span(r), (uint32_t)h->commit);    /* one record */
        r->version += 1u << 20;
        r->sum = pm_rec_sum_of(r);
    }
    ck_assert_int_eq(pwrite(fd, seg, SEG, (off_t)pm_seg_offset(victim, SEG)), (ssize_t)SEG);
    ck_assert_int_eq(pread(fd, seg, SEG, (off_t)pm_seg_offset(copy, SEG)), (ssize_t)SEG);
    seal_seg_hdr(h, seq + 1, copy);
    ck_assert_int_eq(pwrite(fd, h, sizeof(*h), (off_t)pm_seg_offset(copy, SEG)),
                     (ssize_t)sizeof(*h));
    close(fd);
}

#define OLD_KEYS 15
#define OLD_KLEN 1000                   /* a tombstone or empty value: 1024 bytes */

static const char *old_key(int i)
{
    static char k[OLD_KLEN + 1];

    memset(k, 'k', OLD_KLEN);
    snprintf(k + OLD_KLEN - 2, 3, "%02d", i);
    return k;
}

/* Fill a pool of six segments, closed, as
 *   seg0 [15 dead empty values of deleted keys, L1 (4K), L2 (8K), dead Q]
 *   seg1 [W, 8K free]  seg2 [X]  seg3 [Y]  seg4 [15 tombstones, tQ]
 * with seg5 free. With `split`, W, X and Y are each two records: 16 KiB
 * (W1, X1, Y1), and the rest (W2, X2, Y2). No clean runs meanwhile. */
static void lay_out_six_segments(bool append_only, bool split)
{
    struct kvs *s = open_store_opts(6 * SEG + 4096, append_only);
    struct kvs_stats st;
    int fd;

    for (int i = 0; i < OLD_KEYS; i++)
        ck_assert_int_eq(kvs_put(s, old_key(i), OLD_KLEN, NULL, 0, TERN_KV_SYNC, NULL),
                         0);
    put_rec(s, "live---1", 4096);
    put_rec(s, "live---2", 8192);
    put_rec(s, "fill---Q", CAP - OLD_KEYS * 1024 - 4096 - 8192);
    if (split) {
        put_rec(s, "fill--W1", 16384);
        put_rec(s, "fill--W2", CAP - 8192 - 16384);
        put_rec(s, "fill--X1", 16384);
        put_rec(s, "fill--X2", CAP - 16384);
        put_rec(s, "fill--Y1", 16384);
        put_rec(s, "fill--Y2", CAP - 16384);
    } else {
        put_rec(s, "fill---W", CAP - 8192);
        put_rec(s, "fill---X", CAP);
        put_rec(s, "fill---Y", CAP);
    }
    /* The first tombstone opens seg4, the last segment but one; from here
     * on every write looks for a segment under 75% live, and seg0 stays
     * above that until Q goes. */
    for (int i = 0; i < OLD_KEYS; i++)
        ck_assert_int_eq(kvs_del(s, old_key(i), OLD_KLEN, TERN_KV_SYNC, NULL), 0);
    del_str(s, "fill---Q");
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.segs_cleaned, 0);
    ck_assert_uint_eq(st.pool.segs_used, 5);
    kvs_close(s);

    fd = open(path, O_RDONLY);
    ck_assert_uint_eq((uint32_t)seg_word(fd, 1, offsetof(struct pm_seg_hdr, commit)), CAP - 8192);
    close(fd);
}

/* A clean that fails halfway leaves every record of its victim counted.
 * A full pool whose head has no room for the emptiest segment's live
 * records is forged (forge_dup_segment): on reopen all six segments of
 * lay_out_six_segments are in use, seg5 holds W, and the head, seg1, has
 * 8 KiB free. seg0 is the emptiest (12 KiB live): its clean copies L1 and
 * fails on L2. seg4's tombstones are a little more than that; had the
 * failed clean counted the dead values as gone, the tombstones would
 * retire, seg4 would be cleaned next while seg0 stays, and the 15 keys
 * would come back. */
START_TEST(failed_clean_leaves_counts_right)
{
    struct kvs *s;
    struct kvs_stats st, st2;
    const void *val;
    uint32_t len;

    lay_out_six_segments(false, false);
    forge_dup_segment(5, 1, 6, true);

    s = open_store(0);
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.pool.segs_used, 6);
    put_str(s, "x1", "1");
    /* A clean ran and failed: it committed the copy of L1, freed nothing. */
    kvs_get_stats(s, &st2);
    ck_assert_uint_eq(st2.segs_cleaned, 0);
    ck_assert_uint_eq(st2.pool.segs_used, 6);
    ck_assert_uint_eq(st2.pool.bytes_committed, st.pool.bytes_committed + 4096 + 32);
    put_str(s, "x2", "2");
    kvs_close(s);

    s = open_store(0);
    for (int i = 0; i < OLD_KEYS; i++)
        ck_assert_msg(kvs_get(s, old_key(i), OLD_KLEN, &val, &len, NULL) == TERN_ENOENT,
                      "deleted key %d is back after reopen", i);
    ck_assert_int_eq(has(s, "fill---Q", ""), 0);
    ck_assert_int_eq(has_rec(s, "live---1", 4096), 1);
    ck_assert_int_eq(has_rec(s, "live---2", 8192), 1);
    ck_assert_int_eq(has_rec(s, "fill---W", CAP - 8192), 1);
    ck_assert_int_eq(has_rec(s, "fill---X", CAP), 1);
    ck_assert_int_eq(has_rec(s, "fill---Y", CAP), 1);
    ck_assert_int_eq(has(s, "x1", "1"), 1);
    ck_assert_int_eq(has(s, "x2", "2"), 1);
    ck_assert_uint_eq(kvs_count(s), 7);
    kvs_close(s);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, NULL), 0);
}
END_TEST

/* A crash in the middle of a clean, after its copies were committed and
 * before its victim was freed, leaves a pool with no free segment: the
 * copies took the last one. The next clean must free the victim (whose
 * records the copies made dead) instead of copying them again into a pool
 * without room: that clean used to fail, and every later one picked the
 * same victim and failed too, so that PUTs got TERN_ENOSPC until deletes
 * emptied it. Here the victim, seg5, is a copy of the head, seg1 (W1, W2);
 * once W2, X2 and Y2 are deleted every segment but the victim has from
 * 12 to 16 KiB live, more than the head has room for, and the pool as a
 * whole is three quarters dead. Append-only, so that every PUT takes room:
 * 3000 PUTs of 200 bytes over 8 keys write twice the pool's size. */
START_TEST(interrupted_clean_does_not_stick)
{
    struct kvs *s;
    struct kvs_stats st;
    char k[16], v[200];
    const void *val;
    uint32_t len;

    lay_out_six_segments(true, true);
    forge_dup_segment(5, 1, 6, false);

    s = open_store_opts(0, true);
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.pool.segs_used, 6);
    del_str(s, "fill--W2");
    /* The first clean took the victim, which held nothing live. */
    kvs_get_stats(s, &st);
    ck_assert_uint_eq(st.segs_cleaned, 1);
    ck_assert_uint_eq(st.pool.segs_used, 5);
    del_str(s, "fill--X2");
    del_str(s, "fill--Y2");
    for (int i = 0; i < 3000; i++) {
        int rc;

        snprintf(k, sizeof(k), "key-%d", i % 8);
        memset(v, 'a' + i % 26, sizeof(v));
        rc = kvs_put(s, k, strlen(k), v, sizeof(v), TERN_KV_SYNC, NULL);
        ck_assert_msg(rc == 0, "put %d after the interrupted clean: %s (%llu segments cleaned)",
                      i, tern_strerror(rc), (unsigned long long)segs_cleaned(s));
    }
    ck_assert_uint_gt(segs_cleaned(s), 10);
    kvs_close(s);

    s = open_store_opts(0, true);
    for (int i = 2992; i < 3000; i++) {
        snprintf(k, sizeof(k), "key-%d", i % 8);
        ck_assert_int_eq(kvs_get(s, k, strlen(k), &val, &len, NULL), 0);
        ck_assert_uint_eq(len, sizeof(v));
        ck_assert_int_eq(((const char *)val)[0], 'a' + i % 26);
    }
    for (int i = 0; i < OLD_KEYS; i++)
        ck_assert_int_eq(kvs_get(s, old_key(i), OLD_KLEN, &val, &len, NULL),
                         TERN_ENOENT);
    ck_assert_int_eq(has(s, "fill--W2", ""), 0);
    ck_assert_int_eq(has(s, "fill--X2", ""), 0);
    ck_assert_int_eq(has(s, "fill--Y2", ""), 0);
    ck_assert_int_eq(has_rec(s, "live---1", 4096), 1);
    ck_assert_int_eq(has_rec(s, "live---2", 8192), 1);
    ck_assert_int_eq(has_rec(s, "fill--W1", 16384), 1);
    ck_assert_int_eq(has_rec(s, "fill--X1", 16384), 1);
    ck_assert_int_eq(has_rec(s, "fill--Y1", 16384), 1);
    ck_assert_uint_eq(kvs_count(s), 5 + 8);
    kvs_close(s);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, NULL), 0);
}
END_TEST

/* ---- damaged segment headers ---- */

static uint8_t *read_whole(size_t *len)
{
    struct stat st;
    uint8_t *buf;
    int fd = open(path, O_RDONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fstat(fd, &st), 0);
    buf = malloc((size_t)st.st_size);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    *len = (size_t)st.st_size;
    return buf;
}

/* A segment full of keys whose commit word, or whose seq, is zeroed: the
 * store refuses to open (it used to serve without that segment's keys,
 * or take the segment for a free one), and so does the checker, deep or
 * not; the file is left as it was. */
START_TEST(damaged_segment_header_is_refused)
{
    static const size_t fields[] = {offsetof(struct pm_seg_hdr, commit),
                                    offsetof(struct pm_seg_hdr, seq)};
    struct kvs *s = open_store(8 * SEG + 4096);
    struct kvs_opts o = {.path = path};
    uint32_t full = UINT32_MAX, per_seg[8] = {0};
    char k[16], v[48];
    uint64_t zero = 0, bad = 0;
    int fd;

    memset(v, 'v', sizeof(v));
    for (int i = 0; i < 2000; i++) {
        uint64_t ver;
        pm_loc loc;
        uint32_t size;

        snprintf(k, sizeof(k), "key%05d", i);
        ck_assert_int_eq(kvs_put(s, k, strlen(k), v, sizeof(v), 0, NULL), 0);
        ck_assert_int_eq(kvs_locate(s, k, strlen(k), &loc, &size, &ver), 0);
        per_seg[loc >> 32]++;
    }
    ck_assert_int_eq(kvs_sync(s), 0);
    kvs_close(s);
    for (uint32_t i = 0; i < 8; i++)
        if (per_seg[i] > 500 && full == UINT32_MAX)
            full = i;
    ck_assert_uint_ne(full, UINT32_MAX);

    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    for (unsigned f = 0; f < 2; f++) {
        off_t at = (off_t)(pm_seg_offset(full, SEG) + fields[f]);
        uint64_t good = seg_word(fd, full, fields[f]);
        uint8_t *before, *after;
        size_t len, len2;

        ck_assert_int_eq(pwrite(fd, &zero, sizeof(zero), at), (ssize_t)sizeof(zero));
        before = read_whole(&len);
        ck_assert_msg(kvs_open(&o, &s) == TERN_ECORRUPT,
                      "a store with segment %u's %s zeroed opened", full,
                      f ? "seq" : "commit word");
        ck_assert_int_eq(pm_check(path, true, NULL, NULL, &bad), TERN_ECORRUPT);
        ck_assert_uint_eq(bad, (uint64_t)at);
        ck_assert_int_eq(pm_check(path, false, NULL, NULL, NULL), TERN_ECORRUPT);
        after = read_whole(&len2);
        ck_assert(len == len2 && memcmp(before, after, len) == 0);
        free(before);
        free(after);
        ck_assert_int_eq(pwrite(fd, &good, sizeof(good), at), (ssize_t)sizeof(good));
    }
    close(fd);
    s = open_store(0);
    ck_assert_uint_eq(kvs_count(s), 2000);
    kvs_close(s);
}
END_TEST

/* ---- records a lessee rewrites after the store took them ---- */

/* A record written into leased segment `seg` as a lessee writes it, and
 * taken by the store; returns where it lies. */
static struct pm_rec *lessee_put(struct kvs *s, uint32_t seg, const char *k, const char *v)
{
    struct pm_pool *p = kvs_pool(s);
    uint32_t off = pm_lease_next(p, seg);
    uint64_t intent = 1ull << 63 | 1;
    uint8_t *at = (uint8_t *)pm_base(p) + pm_seg_file_off(p, seg) + off;
    struct pm_rec r = {.val_len = (uint32_t)strlen(v), .version = intent,
                       .key_len = (uint16_t)strlen(k), .type = PM_VALUE};
    bool ended = false;

    memcpy(at, &r, sizeof(r));
    memcpy(at + sizeof(r), k, r.key_len);
    memcpy(at + sizeof(r) + r.key_len, v, r.val_len);
    ((struct pm_rec *)at)->sum = pm_rec_sum_of((struct pm_rec *)at);
    ck_assert_int_eq(kvs_lease_put(s, seg, off, intent, 0, UINT32_MAX, TERN_KV_SYNC, NULL,
                                   &ended), 0);
    ck_assert(!ended);
    return (struct pm_rec *)at;
}

static int sane_visit(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                       uint64_t version)
{
    ck_assert_uint_le(klen, KV_KEY_MAX);
    ck_assert_uint_le(len, SEG);
    (*(unsigned *)arg)++;
    return 0;
}

/* The lessee can still write its segment after the store took a record
 * from it: reads, scans and FLUSHALL go by the header as checked then,
 * never past the segment's bytes nor into a key buffer (a key length of
 * 2000 once overran kvs_clear's stack buffer; a value length past the
 * segment had GET hand out the pool's bytes beyond it). */
START_TEST(lessee_rewrites_taken_record)
{
    struct kvs *s = open_store(1 << 20);
    const void *val;
    uint32_t seg, len, size;
    uint64_t ver, next;
    unsigned seen = 0;
    pm_loc loc;
    struct pm_rec *a, *b;

    put_str(s, "plain", "kept");
    ck_assert_int_eq(kvs_lease(s, &seg), 0);
    a = lessee_put(s, seg, "la", "first");
    b = lessee_put(s, seg, "lb", "second");
    ck_assert_int_eq(has(s, "la", "first"), 1);
    a->val_len = SEG - 100;          /* past the segment's records */
    b->key_len = 2000;               /* past any key */
    ck_assert_int_eq(kvs_get(s, "la", 2, &val, &len, NULL), TERN_ENOENT);
    ck_assert_int_eq(kvs_locate(s, "la", 2, &loc, &size, &ver), TERN_ENOENT);
    ck_assert_int_eq(kvs_get(s, "lb", 2, &val, &len, NULL), TERN_ENOENT);
    ck_assert_int_eq(kvs_scan(s, 0, 1000, sane_visit, &seen, &next), 0);
    ck_assert_uint_eq(next, 0);
    ck_assert_uint_eq(seen, 1);      /* "plain" only */
    ck_assert_int_eq(kvs_clear(s, TERN_KV_SYNC), 0);
    ck_assert_int_eq(has(s, "plain", ""), 0);
    kvs_lease_end(s, seg);
    kvs_close(s);
}
END_TEST

static bool sane_live(void *arg, pm_loc loc, const struct pm_rec *r)
{
    ck_assert_msg(r->key_len == 2 && r->val_len == 5,
                  "the cleaner walked a record its lessee rewrote (%u, %u)", r->key_len,
                  r->val_len);
    return true;
}

static void moved_nowhere(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r)
{
}

/* A leased segment whose lessee rewrote a record the pool had taken is
 * never cleaned: the cleaner walks records by their headers and copies
 * them by their lengths. */
START_TEST(damaged_lease_is_not_cleaned)
{
    struct pm_opts o = {.size = 1 << 20, .seg_size = SEG, .create = true};
    struct pm_cleaner c = {.is_live = sane_live, .moved = moved_nowhere};
    struct pm_pool *p;
    uint32_t seg, off;
    uint8_t *at;
    struct pm_rec r = {.val_len = 5, .version = 7, .key_len = 2, .type = PM_VALUE};
    pm_loc loc;

    ck_assert_int_eq(pm_open(path, &o, &p), 0);
    ck_assert_int_eq(pm_recover(p, NULL, NULL), 0);
    ck_assert_int_eq(pm_lease(p, &seg), 0);
    off = pm_lease_next(p, seg);
    at = (uint8_t *)pm_base(p) + pm_seg_file_off(p, seg) + off;
    memcpy(at, &r, sizeof(r));
    memcpy(at + sizeof(r), "kyvalue", 7);
    ((struct pm_rec *)at)->sum = pm_rec_sum_of((struct pm_rec *)at);
    ck_assert_int_eq(pm_lease_append(p, seg, off, 8, &loc), 0);
    ck_assert_int_eq(pm_commit(p), 0);
    pm_dead(p, loc);                 /* all dead: the first segment to clean */
    ((struct pm_rec *)at)->val_len = 4000;
    pm_lease_end(p, seg);
    ck_assert_int_eq(pm_clean(p, &c, 16, 100), 0);
    pm_close(p);
}
END_TEST

/* A file of layout 3 whose free segment has a sound layout-5 header that
 * counts committed records (its seq lost, say in an upgrade cut short):
 * the checker and the pool judge it alike. The checker once took it for
 * free by the rules of layout 3, and the pool, which upgrades the file
 * first and then reads it by the rules of layout 5, refused it. */
START_TEST(lost_seq_in_old_layout_refused_by_both)
{
    struct kvs *s = open_store(1 << 20);
    struct pm_file_hdr h;
    struct pm_seg_hdr sh;
    uint64_t bad = 0;
    int fd;

    put_str(s, "k", "v");
    kvs_close(s);
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, &h, sizeof(h), 0), sizeof(h));
    ck_assert_int_eq(pread(fd, &sh, sizeof(sh), PM_HDR_SIZE), sizeof(sh));
    ck_assert_uint_ne(sh.seq, 0);
    h.layout = 3;
    h.sum = pm_sum(&h, offsetof(struct pm_file_hdr, sum));
    sh.seq = 0;
    ck_assert_int_eq(pwrite(fd, &h, sizeof(h), 0), sizeof(h));
    ck_assert_int_eq(pwrite(fd, &sh, sizeof(sh), PM_HDR_SIZE), sizeof(sh));
    close(fd);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, &bad), TERN_ECORRUPT);
    ck_assert_uint_eq(bad, PM_HDR_SIZE);
    ck_assert_int_eq(kvs_open(&(struct kvs_opts){.path = path}, &s), TERN_ECORRUPT);
}
END_TEST

/* The same with garbage in `first`, which layout 3 never wrote: the pool
 * clears it when it upgrades the file, which makes the header sound again,
 * so the checker judges the header with `first` cleared too. */
START_TEST(old_layout_first_judged_as_upgraded)
{
    struct kvs *s = open_store(1 << 20);
    struct pm_file_hdr h;
    struct pm_seg_hdr sh;
    uint64_t bad = 0;
    int fd;

    put_str(s, "k", "v");
    kvs_close(s);
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, &h, sizeof(h), 0), sizeof(h));
    ck_assert_int_eq(pread(fd, &sh, sizeof(sh), PM_HDR_SIZE), sizeof(sh));
    ck_assert_uint_eq(sh.first, 0);
    h.layout = 3;
    h.sum = pm_sum(&h, offsetof(struct pm_file_hdr, sum));
    sh.seq = 0;
    sh.first = 4096;
    ck_assert_int_eq(pwrite(fd, &h, sizeof(h), 0), sizeof(h));
    ck_assert_int_eq(pwrite(fd, &sh, sizeof(sh), PM_HDR_SIZE), sizeof(sh));
    close(fd);
    ck_assert_int_eq(pm_check(path, true, NULL, NULL, &bad), TERN_ECORRUPT);
    ck_assert_int_eq(kvs_open(&(struct kvs_opts){.path = path}, &s), TERN_ECORRUPT);
}
END_TEST

Suite *suite_kv(void)
{
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("store");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, put_get_del);
    tcase_add_test(tc, bad_sizes);
    tcase_add_test(tc, survives_reopen);
    tcase_add_test(tc, uncommitted_write_is_not_recovered);
    tcase_add_test(tc, second_opener_is_refused);
    tcase_add_test(tc, cleaning_reclaims_space);
    tcase_add_test(tc, updates_in_place_reuse_space);
    tcase_add_test(tc, pinned_record_is_not_rewritten);
    tcase_add_test(tc, full_pool);
    tcase_add_test(tc, scan_survives_growth);
    tcase_add_test(tc, corrupt_record_is_refused);
    tcase_add_test(tc, bad_headers_are_refused);
    tcase_add_test(tc, bad_commit_point_is_refused);
    tcase_add_test(tc, random_model);
    tcase_add_test(tc, clear_deletes_everything);
    tcase_add_test(tc, old_tombstone_does_not_retire_new_one);
    tcase_add_test(tc, failed_clean_leaves_counts_right);
    tcase_add_test(tc, damaged_segment_header_is_refused);
    tcase_add_test(tc, interrupted_clean_does_not_stick);
    tcase_add_test(tc, lessee_rewrites_taken_record);
    tcase_add_test(tc, damaged_lease_is_not_cleaned);
    tcase_add_test(tc, lost_seq_in_old_layout_refused_by_both);
    tcase_add_test(tc, old_layout_first_judged_as_upgraded);
    suite_add_tcase(s, tc);
    return s;
}
