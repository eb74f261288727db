/* Direct one-sided access on shm: once a peer has mapped a region from
 * tern_tp_mr_alloc or tern_tp_mr_reg_fd, its put and get complete without
 * the owner polling at all, and tern_tp_rkey_ptr hands out pointers into
 * it; a read-only region cannot be written, a deregistered one and an
 * out-of-bounds access are refused, regions registered with tern_tp_mr_reg
 * stay served, and so do plain files towards a peer of another user. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "suites.h"

#define REGION 65536

static const struct fabric_case *shm_case(void)
{
    int i = test_fabric_row("shm");   /* the conformance rows follow the matrix */

    if (i >= 0 && i < n_fabric_cases)
        return &fabric_cases[i];
    ck_abort_msg("no shm fabric case");
    return NULL;
}

/* One operation's completion on `p.a`, with `p.b` polled too or not. */
static struct tern_tp_event done(struct tp_pair *p, bool owner_polls, int ms)
{
    struct tern_tp_event ev;
    bool got = owner_polls ? tp_next2(p->a, p->b, &ev, ms) : tp_next(p->a, &ev, ms);

    ck_assert_msg(got, "no completion within %d ms (the owner %s)", ms,
                  owner_polls ? "polled" : "did not poll");
    ck_assert_msg(ev.type == TERN_TP_EV_PUT_DONE || ev.type == TERN_TP_EV_GET_DONE, "event %d",
                  ev.type);
    return ev;
}

/* Use `rkey` until a get completes with the owner not polling: the first
 * operation is served (and asks for the mapping), the answer comes over
 * the link socket. */
static void map_it(struct tp_pair *p, struct tern_tp_mr *lmr, const struct tern_tp_rkey *rkey)
{
    struct tern_tp_event ev;

    ck_assert_int_eq(tern_tp_get(p->client, lmr, 0, 8, rkey, 0, 1), 0);
    ck_assert_int_eq(done(p, true, 5000).status, 0);
    for (int i = 0; i < 200; i++) {
        tp_next(p->b, &ev, 1);      /* the owner answers the map request */
        ck_assert_int_eq(tern_tp_get(p->client, lmr, 0, 8, rkey, 0, 2), 0);
        if (tp_next(p->a, &ev, 20)) {
            ck_assert_int_eq(ev.status, 0);
            return;
        }
        ck_assert_int_eq(done(p, true, 5000).status, 0);
    }
    ck_abort_msg("the region was never mapped");
}

START_TEST(put_and_get_without_the_owner)
{
    struct tp_pair p;
    struct tern_tp_mr *remote, *local;
    struct tern_tp_rkey rkey;
    uint8_t *r, *l;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, REGION, TERN_TP_ACCESS_REMOTE_READ |
                                                      TERN_TP_ACCESS_REMOTE_WRITE, &remote), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
    rkey = tern_tp_mr_rkey(remote);
    r = tern_tp_mr_addr(remote);
    l = tern_tp_mr_addr(local);
    map_it(&p, local, &rkey);

    /* From here on the owner (b) is not polled once. */
    for (unsigned i = 0; i < 100; i++) {
        memset(l + i * 64, (int)i + 1, 64);
        ck_assert_int_eq(tern_tp_put(p.client, local, i * 64, 64, &rkey, 1000 + i * 64, 100 + i),
                         0);
        struct tern_tp_event ev = done(&p, false, 1000);

        ck_assert_int_eq(ev.type, TERN_TP_EV_PUT_DONE);
        ck_assert_int_eq(ev.status, 0);
        ck_assert_uint_eq(ev.token, 100 + i);
        ck_assert_uint_eq(r[1000 + i * 64], i + 1);
        ck_assert_uint_eq(r[1000 + i * 64 + 63], i + 1);
    }
    /* Several in flight complete in order. */
    for (unsigned i = 0; i < 8; i++)
        ck_assert_int_eq(tern_tp_put(p.client, local, 0, 4096, &rkey, i * 4096, 500 + i), 0);
    for (unsigned i = 0; i < 8; i++)
        ck_assert_uint_eq(done(&p, false, 1000).token, 500 + i);

    memset(r + REGION - 4096, 0xab, 4096);
    ck_assert_int_eq(tern_tp_get(p.client, local, 8192, 4096, &rkey, REGION - 4096, 7), 0);
    ck_assert_int_eq(done(&p, false, 1000).status, 0);
    for (unsigned i = 0; i < 4096; i++)
        ck_assert_uint_eq(l[8192 + i], 0xab);

    tern_tp_mr_dereg(local);
    tern_tp_mr_dereg(remote);
    tp_pair_close(&p);
}
END_TEST

/* What the owner did not grant is refused, with the owner's poll as the
 * judge: writes to a read-only region, accesses past the end, and any
 * access after deregistration. */
START_TEST(refusals_are_served)
{
    struct tp_pair p;
    struct tern_tp_mr *ro, *rw, *local;
    struct tern_tp_rkey rok, rwk;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, REGION, TERN_TP_ACCESS_REMOTE_READ, &ro), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.b, REGION, TERN_TP_ACCESS_REMOTE_READ |
                                                      TERN_TP_ACCESS_REMOTE_WRITE, &rw), 0);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
    rok = tern_tp_mr_rkey(ro);
    rwk = tern_tp_mr_rkey(rw);
    map_it(&p, local, &rok);
    map_it(&p, local, &rwk);
    memset(tern_tp_mr_addr(ro), 0x5a, 64);

    /* Read-only: reads are direct, a write is refused and changes nothing. */
    ck_assert_int_eq(tern_tp_get(p.client, local, 0, 64, &rok, 0, 1), 0);
    ck_assert_int_eq(done(&p, false, 1000).status, 0);
    memset(tern_tp_mr_addr(local), 0x11, 64);
    ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rok, 0, 2), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);
    ck_assert_uint_eq(((uint8_t *)tern_tp_mr_addr(ro))[0], 0x5a);

    /* Past the end of a mapped region. */
    ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rwk, REGION - 32, 3), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);

    /* Deregistered: the next access learns it and is refused. */
    ck_assert_int_eq(tern_tp_mr_dereg(rw), 0);
    ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rwk, 0, 4), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);
    ck_assert_int_eq(tern_tp_get(p.client, local, 0, 64, &rwk, 0, 5), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);

    tern_tp_mr_dereg(local);
    tern_tp_mr_dereg(ro);
    tp_pair_close(&p);
}
END_TEST

/* Memory the application registered itself is not shareable: every
 * operation on it is served by the owner's poll, and works. */
START_TEST(registered_memory_stays_served)
{
    struct tp_pair p;
    static uint8_t mem[4096], buf[4096];
    struct tern_tp_mr *remote, *local;
    struct tern_tp_rkey rkey;
    struct tern_tp_event ev;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_reg(p.b, mem, sizeof(mem), TERN_TP_ACCESS_REMOTE_READ |
                                                              TERN_TP_ACCESS_REMOTE_WRITE, &remote),
                     0);
    ck_assert_int_eq(tern_tp_mr_reg(p.a, buf, sizeof(buf), 0, &local), 0);
    rkey = tern_tp_mr_rkey(remote);
    for (int i = 0; i < 5; i++) {
        buf[0] = (uint8_t)(i + 1);
        ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &rkey, 0, (uint64_t)i), 0);
        /* The owner does not poll: nothing completes. */
        ck_assert(!tp_next(p.a, &ev, 30));
        ck_assert_int_eq(done(&p, true, 5000).status, 0);
        ck_assert_uint_eq(mem[0], i + 1);
    }
    tp_pair_close(&p);
}
END_TEST

/* A served put's data lands before its completion can be seen: a direct
 * put right after it, to the same bytes, must win. The owner runs in a
 * thread of its own, so its copy and the requester's next store race for
 * real (this lost the second put in about a third of the rounds when the
 * owner acknowledged before copying). */
enum { RACE_REGIONS = 48, RACE_BIG = 200 * 1024 };

struct race {
    struct tern_tp_ep *ep;
    struct tern_tp_mr *regs[RACE_REGIONS];
    struct tern_tp_rkey keys[RACE_REGIONS];
    char bound[128];
    int ready, stop;
};

static void *race_owner(void *arg)
{
    struct race *r = arg;
    struct tern_tp_config cfg = {.fabric = "shm", .max_msg = 1 << 20};
    struct tern_tp_event ev[32];

    ck_assert_int_eq(tern_tp_open(&cfg, &r->ep), 0);
    ck_assert_int_eq(tern_tp_listen(r->ep, "auto", r->bound, sizeof(r->bound)), 0);
    for (int i = 0; i < RACE_REGIONS; i++) {
        ck_assert_int_eq(tern_tp_mr_alloc(r->ep, 256 * 1024, TERN_TP_ACCESS_REMOTE_READ |
                                                                 TERN_TP_ACCESS_REMOTE_WRITE,
                                          &r->regs[i]), 0);
        r->keys[i] = tern_tp_mr_rkey(r->regs[i]);
    }
    __atomic_store_n(&r->ready, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE))
        tern_tp_poll(r->ep, ev, 32);
    return NULL;
}

START_TEST(served_put_lands_before_its_ack)
{
    static struct race r;
    struct tern_tp_config cfg = {.fabric = "shm", .max_msg = 1 << 20};
    struct tern_tp_ep *a;
    struct tern_tp_conn *c;
    struct tern_tp_mr *lmr;
    struct tern_tp_event ev;
    pthread_t t;
    uint8_t *l;

    memset(&r, 0, sizeof(r));
    ck_assert_int_eq(pthread_create(&t, NULL, race_owner, &r), 0);
    while (!__atomic_load_n(&r.ready, __ATOMIC_ACQUIRE))
        usleep(100);
    ck_assert_int_eq(tern_tp_open(&cfg, &a), 0);
    ck_assert_int_eq(tern_tp_connect(a, r.bound, &c), 0);
    ck_assert(tp_next(a, &ev, 5000) && ev.type == TERN_TP_EV_CONNECTED && ev.status == 0);
    ck_assert_int_eq(tern_tp_mr_alloc(a, RACE_BIG + 4096, 0, &lmr), 0);
    l = tern_tp_mr_addr(lmr);
    for (int i = 0; i < RACE_REGIONS; i++) {
        uint8_t *remote = tern_tp_mr_addr(r.regs[i]);

        /* A large served put (the region's first use asks for its map)... */
        memset(l, 0x11, RACE_BIG);
        ck_assert_int_eq(tern_tp_put(c, lmr, 0, RACE_BIG, &r.keys[i], 0, 1), 0);
        ck_assert(tp_next(a, &ev, 5000) && ev.type == TERN_TP_EV_PUT_DONE && ev.status == 0);
        for (int k = 0; k < 64; k++)    /* read the map answer if it came */
            ck_assert(!tp_next(a, &ev, 0));
        /* ... then a small one over its last bytes, direct if mapped. */
        memset(l + RACE_BIG, 0x22, 8);
        ck_assert_int_eq(tern_tp_put(c, lmr, RACE_BIG, 8, &r.keys[i], RACE_BIG - 8, 2), 0);
        ck_assert(tp_next(a, &ev, 5000) && ev.type == TERN_TP_EV_PUT_DONE && ev.status == 0);
        usleep(2000);
        ck_assert_msg(remote[RACE_BIG - 8] == 0x22, "region %d: the later put was overwritten", i);
    }
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    tern_tp_close(a);
    tern_tp_close(r.ep);
}
END_TEST

/* ---- regions of files (tern_tp_mr_reg_fd) and tern_tp_rkey_ptr ---- */

enum { PG = 4096 };

/* A region of `len` bytes at page `at` of a file of `pages` pages on `ep`:
 * a plain file in `dir` (unlinked at once), or a memfd if dir is NULL
 * (`sealable`: created to allow sealing). It is registered through a
 * descriptor closed right after, so the endpoint's own copy is the one
 * that works. */
struct file_mr {
    int fd;
    uint8_t *mem;
    size_t len;
    uint64_t off;
    struct tern_tp_mr *mr;
    struct tern_tp_rkey rkey;
};

static void file_mr_open(struct file_mr *f, struct tern_tp_ep *ep, const char *dir,
                         bool sealable, unsigned pages, unsigned at, size_t len, uint32_t access)
{
    int tmp;

    if (dir) {
        char path[128];

        snprintf(path, sizeof(path), "%s/tern-fdmr-XXXXXX", dir);
        f->fd = mkostemp(path, O_CLOEXEC);
        unlink(path);
    } else {
        f->fd = memfd_create("tern-test", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
    }
    ck_assert_int_ge(f->fd, 0);
    ck_assert_int_eq(ftruncate(f->fd, (off_t)pages * PG), 0);
    f->off = (uint64_t)at * PG;
    f->len = len;
    f->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, (off_t)f->off);
    ck_assert(f->mem != MAP_FAILED);
    tmp = dup(f->fd);
    ck_assert_int_eq(tern_tp_mr_reg_fd(ep, f->mem, len, tmp, f->off, access, &f->mr), 0);
    close(tmp);
    f->rkey = tern_tp_mr_rkey(f->mr);
}

static void file_mr_close(struct file_mr *f)
{
    if (f->mr)
        tern_tp_mr_dereg(f->mr);
    munmap(f->mem, f->len);
    close(f->fd);
}

static uint8_t file_byte(int fd, uint64_t off)
{
    uint8_t b;

    ck_assert_int_eq(pread(fd, &b, 1, (off_t)off), 1);
    return b;
}

/* tern_tp_rkey_ptr until it says something else than TERN_EAGAIN, both
 * endpoints polled in between (neither has events to report). */
static int ptr_wait(struct tp_pair *p, const struct tern_tp_rkey *rk, uint64_t roff, size_t len,
                    uint32_t need, void **ptr)
{
    double end = now_ms() + 5000;
    struct tern_tp_event ev[4];
    int rc;

    while ((rc = tern_tp_rkey_ptr(p->client, rk, roff, len, need, ptr)) == TERN_EAGAIN) {
        ck_assert_msg(now_ms() < end, "rkey_ptr: still TERN_EAGAIN after 5 s");
        ck_assert_int_eq(tern_tp_poll(p->a, ev, 4), 0);
        ck_assert_int_eq(tern_tp_poll(p->b, ev, 4), 0);
    }
    return rc;
}

static const char *const plain_dirs[] = {"/tmp", "/dev/shm"};  /* ext4 or so; tmpfs */

static bool dir_exists(const char *d)
{
    struct stat st;

    return stat(d, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A plain file's region (on a disk file system and on tmpfs, which cannot
 * be sealed) is mapped by a peer of the same user, at the region's offset
 * in the file: puts and gets complete with the owner not polling. */
START_TEST(file_region_without_the_owner)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;

    for (size_t d = 0; d < sizeof(plain_dirs) / sizeof(plain_dirs[0]); d++) {
        struct tp_pair p;
        struct tern_tp_mr *local;
        struct file_mr f;
        uint8_t *l;

        if (!dir_exists(plain_dirs[d]))
            continue;
        tp_pair_open(&p, shm_case(), REGION);
        ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
        l = tern_tp_mr_addr(local);
        file_mr_open(&f, p.b, plain_dirs[d], false, 8, 3, 4 * PG, rw);
        map_it(&p, local, &f.rkey);
        /* From here on the owner (b) is not polled once. */
        for (unsigned i = 0; i < 50; i++) {
            uint64_t roff = i * 300;

            memset(l, (int)i + 1, 200);
            ck_assert_int_eq(tern_tp_put(p.client, local, 0, 200, &f.rkey, roff, i), 0);
            ck_assert_int_eq(done(&p, false, 1000).status, 0);
            ck_assert_uint_eq(file_byte(f.fd, f.off + roff), i + 1);
            ck_assert_uint_eq(file_byte(f.fd, f.off + roff + 199), i + 1);
            ck_assert_uint_eq(f.mem[roff + 100], i + 1);
        }
        for (uint64_t off = 0; off < f.off; off += 512)
            ck_assert_uint_eq(file_byte(f.fd, off), 0);
        /* A get reads what the owner wrote into the file. */
        ck_assert_int_eq(pwrite(f.fd, "file-bytes", 10, (off_t)(f.off + 4 * PG - 10)), 10);
        ck_assert_int_eq(tern_tp_get(p.client, local, 1000, 10, &f.rkey, 4 * PG - 10, 99), 0);
        ck_assert_int_eq(done(&p, false, 1000).status, 0);
        ck_assert(memcmp(l + 1000, "file-bytes", 10) == 0);
        file_mr_close(&f);
        tp_pair_close(&p);
    }
}
END_TEST

/* rkey_ptr: TERN_EAGAIN on first use, then a pointer at the region's
 * offset; stores through it are in the owner's file, loads see the
 * owner's writes. Out-of-range asks are refused; served operations in
 * flight hold it back. */
START_TEST(rkey_ptr_stores_and_loads)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    static uint8_t served[4096];
    struct tp_pair p;
    struct tern_tp_mr *local, *smr;
    struct tern_tp_rkey sk;
    struct tern_tp_event ev;
    struct file_mr f;
    uint8_t *ptr, *at;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
    file_mr_open(&f, p.b, "/tmp", false, 6, 2, 3 * PG + 100, rw);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, rw, (void **)&ptr), TERN_EAGAIN);
    ck_assert_ptr_null(ptr);
    ck_assert_int_eq(ptr_wait(&p, &f.rkey, 0, f.len, rw, (void **)&ptr), 0);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 200, 100, rw, (void **)&at), 0);
    ck_assert_ptr_eq(at, ptr + 200);

    /* Stores land in the owner's file at the region's offset, loads see
     * the owner's writes; the owner never polls for either. */
    memset(at, 0x5c, 100);
    ck_assert_uint_eq(f.mem[200], 0x5c);
    ck_assert_uint_eq(file_byte(f.fd, f.off + 299), 0x5c);
    ck_assert_uint_eq(file_byte(f.fd, f.off + 300), 0);
    f.mem[f.len - 1] = 0x77;
    ck_assert_int_eq(pwrite(f.fd, "abc", 3, (off_t)f.off + 4000), 3);
    ck_assert_uint_eq(ptr[f.len - 1], 0x77);
    ck_assert(memcmp(ptr + 4000, "abc", 3) == 0);

    /* The range is the region's, not its mapping's. */
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, f.len - 8, 8, rw, (void **)&at), 0);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, f.len - 8, 16, rw, (void **)&at),
                     TERN_EREMACCESS);
    ck_assert_ptr_null(at);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, f.len, 1, rw, (void **)&at),
                     TERN_EREMACCESS);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, UINT64_MAX - 2, 8, rw, (void **)&at),
                     TERN_EREMACCESS);

    /* A served get in flight on the connection: a store now could
     * overtake it. */
    ck_assert_int_eq(tern_tp_mr_reg(p.b, served, sizeof(served), rw, &smr), 0);
    sk = tern_tp_mr_rkey(smr);
    ck_assert_int_eq(tern_tp_get(p.client, local, 0, 64, &sk, 0, 1), 0);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, rw, (void **)&at), TERN_EAGAIN);
    ck_assert_int_eq(done(&p, true, 5000).status, 0);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, rw, (void **)&at), 0);

    /* A store, then a message: the owner that reads the message sees it. */
    ptr[8] = 0x99;
    ck_assert_int_eq(tern_tp_msg_send(p.client, "x", 1), 0);
    ck_assert(tp_next2(p.b, p.a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_RECV);
    ck_assert_uint_eq(f.mem[8], 0x99);
    tern_tp_msg_release(ev.conn, ev.data);
    file_mr_close(&f);
    tp_pair_close(&p);
}
END_TEST

/* Is the mapping that holds `p` read-only and shared, for good (mprotect
 * cannot make it writable: the descriptor or the seals forbid it)? */
static void assert_read_only_mapping(const void *p)
{
    uintptr_t a = (uintptr_t)p, lo, hi;
    char line[512], perms[8];
    FILE *maps = fopen("/proc/self/maps", "r");
    bool found = false;

    ck_assert_ptr_nonnull(maps);
    while (fgets(line, sizeof(line), maps))
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && a >= lo && a < hi) {
            found = true;
            ck_assert_msg(strcmp(perms, "r--s") == 0, "the peer maps it %s", perms);
        }
    fclose(maps);
    ck_assert(found);
    ck_assert_int_eq(mprotect((void *)(a & ~(uintptr_t)(PG - 1)), PG, PROT_READ | PROT_WRITE),
                     -1);
    ck_assert_int_eq(errno, EACCES);
}

/* A read-only region (a plain file, a memfd, a memfd its creator sealed
 * for good, which cannot be sealed against writable mappings): the peer
 * maps it read-only and cannot make its mapping writable; a pointer for
 * writing and a put are refused; reads work. */
START_TEST(read_only_file_region)
{
    for (int kind = 0; kind < 3; kind++) {
        struct tp_pair p;
        struct tern_tp_mr *local;
        struct file_mr f;
        uint8_t *ptr;

        tp_pair_open(&p, shm_case(), REGION);
        ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
        if (kind == 2) {
            /* Sealed at its size by its creator, and for good. */
            int fd = memfd_create("tern-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

            ck_assert_int_eq(ftruncate(fd, 4 * PG), 0);
            ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
            f = (struct file_mr){.fd = fd, .off = PG, .len = 2 * PG};
            f.mem = mmap(NULL, f.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, PG);
            ck_assert(f.mem != MAP_FAILED);
            ck_assert_int_eq(tern_tp_mr_reg_fd(p.b, f.mem, f.len, fd, f.off,
                                               TERN_TP_ACCESS_REMOTE_READ, &f.mr), 0);
            f.rkey = tern_tp_mr_rkey(f.mr);
        } else {
            file_mr_open(&f, p.b, kind ? NULL : "/tmp", true, 4, 1, 2 * PG,
                         TERN_TP_ACCESS_REMOTE_READ);
        }
        if (kind == 1)
            ck_assert(fcntl(f.fd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE);
        memset(f.mem, 0x3c, 2 * PG);
        ck_assert_int_eq(ptr_wait(&p, &f.rkey, 0, 2 * PG, TERN_TP_ACCESS_REMOTE_READ,
                                  (void **)&ptr), 0);
        ck_assert_uint_eq(ptr[2 * PG - 1], 0x3c);
        assert_read_only_mapping(ptr);
        ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, TERN_TP_ACCESS_REMOTE_WRITE,
                                          (void **)&ptr), TERN_EREMACCESS);
        memset(tern_tp_mr_addr(local), 0x11, 64);
        ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &f.rkey, 0, 1), 0);
        ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);
        ck_assert_uint_eq(file_byte(f.fd, f.off), 0x3c);
        /* Reads are direct. */
        ck_assert_int_eq(tern_tp_get(p.client, local, 0, 64, &f.rkey, 64, 2), 0);
        ck_assert_int_eq(done(&p, false, 1000).status, 0);
        ck_assert_uint_eq(((uint8_t *)tern_tp_mr_addr(local))[63], 0x3c);
        file_mr_close(&f);
        tp_pair_close(&p);
    }
}
END_TEST

/* A caller's memfd is sealed as tern_tp_mr_alloc memory is (but left open
 * to seals of its own) and shared directly; one that cannot be sealed is a
 * plain file, for peers of the same user. Both at an offset whose bytes
 * the peer must find. */
START_TEST(memfd_regions)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;

    for (int sealable = 0; sealable < 2; sealable++) {
        struct tp_pair p;
        struct file_mr f;
        uint8_t *ptr;
        int seals;

        tp_pair_open(&p, shm_case(), REGION);
        file_mr_open(&f, p.b, NULL, sealable, 5, 2, 3 * PG, rw);
        seals = fcntl(f.fd, F_GET_SEALS);
        if (sealable) {
            ck_assert_int_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
            ck_assert_int_eq(seals & (F_SEAL_SEAL | F_SEAL_FUTURE_WRITE), 0);
        }
        ck_assert_int_eq(ptr_wait(&p, &f.rkey, 0, 3 * PG, rw, (void **)&ptr), 0);
        ptr[5] = 0xe1;
        ck_assert_uint_eq(file_byte(f.fd, 2 * PG + 5), 0xe1);
        f.mem[3 * PG - 1] = 0xe2;
        ck_assert_uint_eq(ptr[3 * PG - 1], 0xe2);
        file_mr_close(&f);
        tp_pair_close(&p);
    }
}
END_TEST

/* A region past the end of its file (the owner maps it but never touches
 * it) is not mapped by the peer, whose accesses could fault: the file's
 * size must cover the region's offset plus its mapping. */
START_TEST(short_file_is_not_mapped)
{
    for (int memfd = 0; memfd < 2; memfd++) {
        struct tp_pair p;
        struct file_mr f;
        uint8_t *ptr;

        tp_pair_open(&p, shm_case(), REGION);
        /* 3 pages of file, the region at page 2 for 2 pages. */
        file_mr_open(&f, p.b, memfd ? NULL : "/tmp", true, 3, 2, 2 * PG,
                     TERN_TP_ACCESS_REMOTE_READ);
        ck_assert_int_eq(ptr_wait(&p, &f.rkey, 0, 8, TERN_TP_ACCESS_REMOTE_READ, (void **)&ptr),
                         TERN_ENOTSUP);
        file_mr_close(&f);
        tp_pair_close(&p);
    }
}
END_TEST

/* Deregistration ends rkey_ptr at the next ask and refuses later puts; the
 * caller's mapping stays (a racing store lands in the caller's pages). */
START_TEST(dereg_ends_rkey_ptr)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tp_pair p;
    struct tern_tp_mr *local;
    struct file_mr f;
    uint8_t *ptr;

    tp_pair_open(&p, shm_case(), REGION);
    ck_assert_int_eq(tern_tp_mr_alloc(p.a, REGION, 0, &local), 0);
    file_mr_open(&f, p.b, "/tmp", false, 2, 0, 2 * PG, rw);
    ck_assert_int_eq(ptr_wait(&p, &f.rkey, 0, 2 * PG, rw, (void **)&ptr), 0);
    ck_assert_int_eq(tern_tp_mr_dereg(f.mr), 0);
    f.mr = NULL;
    f.mem[0] = 0x21;     /* still the caller's */
    ck_assert_uint_eq(file_byte(f.fd, 0), 0x21);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, rw, (void **)&ptr),
                     TERN_EREMACCESS);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, TERN_TP_ACCESS_REMOTE_READ,
                                      (void **)&ptr), TERN_EREMACCESS);
    ck_assert_int_eq(tern_tp_put(p.client, local, 0, 64, &f.rkey, 0, 1), 0);
    ck_assert_int_eq(done(&p, true, 5000).status, TERN_EREMACCESS);
    ck_assert_uint_eq(file_byte(f.fd, 0), 0x21);
    file_mr_close(&f);
    tp_pair_close(&p);
}
END_TEST

/* Refused rkey_ptr calls count like refused put and get: a caller that
 * keeps making them (bad ranges, bad keys) loses the connection, and the
 * peer sees it close. */
START_TEST(rkey_ptr_refusals_hang_up)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_tp_rkey bad;
    struct tern_tp_event ev;
    struct tp_pair p;
    struct file_mr f;
    void *ptr;
    int refused = 0;

    tp_pair_open(&p, shm_case(), REGION);
    file_mr_open(&f, p.b, NULL, true, 1, 0, PG, rw);
    ck_assert_int_eq(ptr_wait(&p, &f.rkey, 0, PG, rw, &ptr), 0);
    bad = f.rkey;
    bad.key ^= 0x100001;    /* another slot: it does not evict the good key's mapping */
    ck_assert_int_eq(ptr_wait(&p, &bad, 0, 8, rw, &ptr), TERN_EREMACCESS);
    refused++;
    while (refused < 16) {
        ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, PG, 8, rw, &ptr), TERN_EREMACCESS);
        refused++;
        /* Still usable up to the limit. */
        ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, rw, &ptr), 0);
    }
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &bad, 0, 8, rw, &ptr), TERN_EREMACCESS);
    ck_assert_int_eq(tern_tp_rkey_ptr(p.client, &f.rkey, 0, 8, rw, &ptr), TERN_ENOTCONN);
    ck_assert(tp_next(p.a, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
    ck_assert_int_eq(ev.status, TERN_EREMACCESS);
    ck_assert(tp_next(p.b, &ev, 5000));
    ck_assert_int_eq(ev.type, TERN_TP_EV_CLOSED);
    ck_assert_ptr_eq(ev.conn, p.server);
    file_mr_close(&f);
    tp_pair_close(&p);
}
END_TEST

/* ---- a peer of another user ---- */

/* What the peer of another user is shown: rkeys of a plain-file region and
 * of a tern_tp_mr_alloc region, and the bytes it will read. */
struct uid_keys {
    struct tern_tp_rkey file, mem;
};

#define CHILD_CHECK(cond, code) \
    do { \
        if (!(cond)) { \
            fprintf(stderr, "uid child: %s failed (line %d)\n", #cond, __LINE__); \
            _exit(code); \
        } \
    } while (0)

/* The child's next event, polling up to 5 s. */
static bool child_next(struct tern_tp_ep *ep, struct tern_tp_event *ev)
{
    double end = now_ms() + 5000;

    while (now_ms() < end)
        if (tern_tp_poll(ep, ev, 1) == 1)
            return true;
    return false;
}

static int child_ptr(struct tern_tp_ep *ep, struct tern_tp_conn *c,
                     const struct tern_tp_rkey *rk, void **ptr)
{
    double end = now_ms() + 5000;
    struct tern_tp_event ev;
    int rc;

    while ((rc = tern_tp_rkey_ptr(c, rk, 0, 64, TERN_TP_ACCESS_REMOTE_READ |
                                                    TERN_TP_ACCESS_REMOTE_WRITE, ptr)) ==
               TERN_EAGAIN &&
           now_ms() < end)
        CHILD_CHECK(tern_tp_poll(ep, &ev, 1) == 0, 20);
    return rc;
}

/* The peer of another user: connects as uid 65534, then asks for pointers
 * and uses put and get on the plain-file region. Exits 0 if all is as it
 * should be. */
static void uid_child(const char *bound)
{
    struct tern_tp_config cfg = {.fabric = "shm", .max_msg = 65536};
    struct tern_tp_event ev;
    struct tern_tp_conn *c;
    struct tern_tp_ep *ep;
    struct tern_tp_mr *local;
    struct uid_keys keys;
    uint8_t *l;
    void *ptr;

    CHILD_CHECK(tern_tp_open(&cfg, &ep) == 0, 10);
    CHILD_CHECK(setgid(65534) == 0 && setuid(65534) == 0 && geteuid() == 65534, 11);
    CHILD_CHECK(tern_tp_connect(ep, bound, &c) == 0, 12);
    CHILD_CHECK(child_next(ep, &ev) && ev.type == TERN_TP_EV_CONNECTED && ev.status == 0, 13);
    CHILD_CHECK(child_next(ep, &ev) && ev.type == TERN_TP_EV_RECV && ev.len == sizeof(keys), 14);
    memcpy(&keys, ev.data, sizeof(keys));
    tern_tp_msg_release(c, ev.data);
    CHILD_CHECK(tern_tp_mr_alloc(ep, 4096, 0, &local) == 0, 15);
    l = tern_tp_mr_addr(local);
    /* The plain file: not for us to map. Sealed memory: ours to map. */
    CHILD_CHECK(child_ptr(ep, c, &keys.file, &ptr) == TERN_ENOTSUP, 16);
    CHILD_CHECK(child_ptr(ep, c, &keys.mem, &ptr) == 0, 17);
    memcpy(ptr, "mapped", 6);
    /* Served put and get on the file still work. */
    memcpy(l, "served", 6);
    CHILD_CHECK(tern_tp_put(c, local, 0, 6, &keys.file, 100, 1) == 0, 18);
    CHILD_CHECK(child_next(ep, &ev) && ev.type == TERN_TP_EV_PUT_DONE && ev.status == 0, 19);
    CHILD_CHECK(tern_tp_get(c, local, 1000, 5, &keys.file, 0, 2) == 0, 21);
    CHILD_CHECK(child_next(ep, &ev) && ev.type == TERN_TP_EV_GET_DONE && ev.status == 0, 22);
    CHILD_CHECK(memcmp(l + 1000, "owner", 5) == 0, 23);
    /* Still not mapped after all that. */
    CHILD_CHECK(child_ptr(ep, c, &keys.file, &ptr) == TERN_ENOTSUP, 24);
    CHILD_CHECK(tern_tp_msg_send(c, "done", 4) == 0, 25);
    tern_tp_flush(ep);
    CHILD_CHECK(child_next(ep, &ev) && ev.type == TERN_TP_EV_CLOSED, 26);
    _exit(0);
}

/* A plain file is mapped only by peers of the owner's user: another user's
 * gets TERN_ENOTSUP from rkey_ptr (while still mapping sealed memory), and
 * served put and get. Needs root to become another user; elsewhere it says
 * it skips and checks the same-user side only. */
START_TEST(other_uid_gets_no_file_mapping)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_tp_mr *mem;
    struct tern_tp_event ev;
    struct tern_tp_ep *b;
    struct uid_keys keys;
    struct file_mr f;
    char bound[128];
    bool done_msg = false;
    double end;
    pid_t pid;
    int status;

    if (geteuid() != 0) {
        struct tp_pair p;
        uint8_t *ptr;

        fprintf(stderr, "other_uid_gets_no_file_mapping: SKIP (not root: cannot become another "
                        "user); checking the same-user side only\n");
        tp_pair_open(&p, shm_case(), REGION);
        file_mr_open(&f, p.b, "/tmp", false, 1, 0, PG, rw);
        ck_assert_int_eq(ptr_wait(&p, &f.rkey, 0, PG, rw, (void **)&ptr), 0);
        file_mr_close(&f);
        tp_pair_close(&p);
        return;
    }
    b = tp_open("shm", 65536);
    ck_assert_int_eq(tern_tp_listen(b, "auto", bound, sizeof(bound)), 0);
    file_mr_open(&f, b, "/tmp", false, 2, 1, PG, rw);
    ck_assert_int_eq(fchmod(f.fd, 0600), 0);    /* the other user cannot open it */
    memcpy(f.mem, "owner", 5);
    ck_assert_int_eq(tern_tp_mr_alloc(b, PG, rw, &mem), 0);
    keys = (struct uid_keys){.file = f.rkey, .mem = tern_tp_mr_rkey(mem)};
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        uid_child(bound);
    /* Serve the child until it says it is done. */
    end = now_ms() + 20000;
    while (!done_msg) {
        ck_assert_msg(now_ms() < end, "the child never finished");
        if (waitpid(pid, &status, WNOHANG) == pid)
            ck_abort_msg("the child exited early with status %d", WEXITSTATUS(status));
        if (tern_tp_poll(b, &ev, 1) != 1)
            continue;
        if (ev.type == TERN_TP_EV_ACCEPTED)
            ck_assert_int_eq(tern_tp_msg_send(ev.conn, &keys, sizeof(keys)), 0);
        if (ev.type == TERN_TP_EV_RECV) {
            done_msg = ev.len == 4 && memcmp(ev.data, "done", 4) == 0;
            tern_tp_msg_release(ev.conn, ev.data);
            if (done_msg)
                tern_tp_disconnect(ev.conn);
        }
    }
    tern_tp_flush(b);
    for (end = now_ms() + 5000; waitpid(pid, &status, WNOHANG) != pid;) {
        ck_assert_msg(now_ms() < end, "the child did not exit");
        tern_tp_poll(b, &ev, 1);
    }
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed: status %d",
                  WEXITSTATUS(status));
    ck_assert(memcmp(f.mem + 100, "served", 6) == 0);
    ck_assert(memcmp(tern_tp_mr_addr(mem), "mapped", 6) == 0);
    file_mr_close(&f);
    tern_tp_close(b);
}
END_TEST

Suite *suite_shm_direct(void)
{
    Suite *s = suite_create("shm_direct");
    TCase *tc = tcase_create("direct");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, put_and_get_without_the_owner);
    tcase_add_test(tc, refusals_are_served);
    tcase_add_test(tc, registered_memory_stays_served);
    tcase_add_test(tc, served_put_lands_before_its_ack);
    tcase_add_test(tc, file_region_without_the_owner);
    tcase_add_test(tc, rkey_ptr_stores_and_loads);
    tcase_add_test(tc, read_only_file_region);
    tcase_add_test(tc, memfd_regions);
    tcase_add_test(tc, short_file_is_not_mapped);
    tcase_add_test(tc, dereg_ends_rkey_ptr);
    tcase_add_test(tc, rkey_ptr_refusals_hang_up);
    tcase_add_test(tc, other_uid_gets_no_file_mapping);
    suite_add_tcase(s, tc);
    return s;
}
