/* kv_onesided: a lessee and the server's pool lock on shm (case
 * kv_pool_lock). A lessee maps its lease from the pool's file; it must
 * hold no lock of a server that died, and a hostile one that keeps the
 * file's descriptor cannot unlock a live server's pool.
 */
#include "tern_config.h"

#if TERN_HAVE_SERVICES

#include <check.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_onesided_fixture.h"
#include "pm/pm.h"

/* ---- a lessee and the server's pool lock (shm) ---- */

/* A lessee that keeps what it is sent. The shm fabric hands a peer the
 * file of a region it maps over the link socket (SCM_RIGHTS) and closes it
 * once mapped; a hostile client need not. This binary's recvmsg (the
 * fabric's objects are linked into it, so their calls bind here) keeps a
 * duplicate of every descriptor received while keep_sent_fds is set, which
 * only the hostile lessee child below sets. */
static bool keep_sent_fds;
static int sent_fds[16];
static unsigned n_sent_fds;
static unsigned pool_fds_seen;      /* descriptors of the pool file received */

static bool is_pool_file(int fd)
{
    struct stat pool, st;

    return stat(test_kv_pool(0), &pool) == 0 && fstat(fd, &st) == 0 &&
           st.st_dev == pool.st_dev && st.st_ino == pool.st_ino;
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    static void *real;
    ssize_t (*fn)(int, struct msghdr *, int);
    ssize_t n;

    if (!__atomic_load_n(&real, __ATOMIC_ACQUIRE))
        __atomic_store_n(&real, dlsym(RTLD_NEXT, "recvmsg"), __ATOMIC_RELEASE);
    fn = (ssize_t (*)(int, struct msghdr *, int))__atomic_load_n(&real, __ATOMIC_ACQUIRE);
    n = fn(fd, msg, flags);
    if (n < 0)
        return n;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int got;

            memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(got));
            pool_fds_seen += is_pool_file(got);
            if (keep_sent_fds && n_sent_fds < sizeof(sent_fds) / sizeof(sent_fds[0]))
                sent_fds[n_sent_fds++] = fcntl(got, F_DUPFD_CLOEXEC, 0);
        }
    }
    return n;
}

struct lock_shared {
    int state;                       /* 1: wrote through its lease, 2: failed */
    unsigned n;                      /* PUTs acknowledged */
    uint64_t ver[64];
    int pool_fds;                    /* descriptors of the pool file it kept (hostile) */
    int locked;                      /* flock(LOCK_EX) on one of them succeeded */
};

static struct lock_shared *lk;

static void lock_key(char *k, size_t cap, int *kl, unsigned i)
{
    *kl = snprintf(k, cap, "lock-%u", i);
}

/* A client child that PUTs until one went through its leased segment and
 * the server sent it the pool's file to map the lease from (the first
 * PUTs into a lease go served while the mapping comes; the later ones are
 * stores through it): its mapping holds that file. If `arg` is not NULL it is
 * hostile: it keeps the descriptors it was sent, and on every one of the
 * pool file tries to take the pool's lock and then drops it. Then it
 * lives on, holding the lease, until SIGKILL. */
static int lock_lessee(void *arg)
{
    bool hostile = arg != NULL;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    const char *u = test_kv_uri(0);
    struct stat pool, st;
    double t0 = now_ms();

    keep_sent_fds = hostile;
    if (tern_rpc_open(NULL, &ep) < 0 || tern_kv_open(ep, &u, 1, 5 * SEC, &kv) < 0 ||
        tern_kv_set_path(kv, TERN_KV_PATH_ONESIDED) < 0) {
        __atomic_store_n(&lk->state, 2, __ATOMIC_RELEASE);
        return 3;
    }
    for (unsigned i = 0; i < 64 && now_ms() - t0 < 10000; i++) {
        char k[16];
        int kl;

        lock_key(k, sizeof(k), &kl, i);
        if (tern_kv_put(kv, k, (size_t)kl, k, (size_t)kl, &lk->ver[i]) < 0)
            break;
        lk->n = i + 1;
        if (os_stats(kv).puts > 0 && pool_fds_seen > 0)
            break;
        for (int p = 0; p < 100; p++)
            tern_rpc_poll(ep);
    }
    if (hostile && stat(test_kv_pool(0), &pool) == 0)
        for (unsigned i = 0; i < n_sent_fds; i++) {
            if (sent_fds[i] < 0 || fstat(sent_fds[i], &st) < 0 || st.st_dev != pool.st_dev ||
                st.st_ino != pool.st_ino)
                continue;
            lk->pool_fds++;
            if (flock(sent_fds[i], LOCK_EX | LOCK_NB) == 0)
                lk->locked++;
            flock(sent_fds[i], LOCK_UN);
        }
    __atomic_store_n(&lk->state, os_stats(kv).puts > 0 && pool_fds_seen > 0 ? 1 : 2,
                     __ATOMIC_RELEASE);
    for (;;)
        pause();
}

static void wait_lessee(void)
{
    double t0 = now_ms();

    while (!__atomic_load_n(&lk->state, __ATOMIC_ACQUIRE)) {
        CHECK(now_ms() - t0 < 15000, "the lessee child never got going");
        usleep(1000);
    }
    CHECK(lk->state == 1, "the lessee child's PUTs did not go through a mapped lease");
}

/* Every PUT the lessee had acknowledged is there. */
static void expect_lessee_puts(struct tern_kv *kv)
{
    for (unsigned i = 0; i < lk->n; i++) {
        char k[16];
        int kl;

        lock_key(k, sizeof(k), &kl, i);
        kv_expect_get(kv, k, (size_t)kl, k, (size_t)kl, lk->ver[i]);
    }
}

/* The server dies (kill -9) while a client maps its lease: a server
 * started again on the pool must be able to lock it. The lease used to be
 * registered with the descriptor that holds the pool's flock, so the
 * client's mapping shared the lock's open file description and kept the
 * pool locked (TERN_EBUSY) for as long as the client lived. */
START_TEST(lessee_keeps_no_lock_of_dead_server)
{
    int shm = test_fabric_row("shm");
    pid_t lessee;
    struct pm_opts po = {0};
    struct pm_pool *p;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    int rc;

    lk = test_shared_alloc(sizeof(*lk));
    start_os_server(0, shm, NULL);
    lessee = test_fork(lock_lessee, NULL);
    wait_lessee();
    test_kv_kill(0);
    rc = pm_open(test_kv_pool(0), &po, &p);
    CHECK(rc == 0, "the dead server's pool, while its lessee lives: %s", tern_err_name(rc));
    pm_close(p);
    /* A whole server, with the lessee still there. */
    start_os_server(0, shm, NULL);
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_RPC);
    expect_lessee_puts(kv);
    kv_must_put(kv, "after", 5, "restart", 7, NULL);
    test_child_kill(&lessee);
    munmap(lk, sizeof(*lk));
    test_kv_end(ep, kv, 1);
}
END_TEST

/* A hostile lessee keeps the descriptor of the pool the server sent it and
 * tries to take the pool's lock and to drop it: it holds no lock there to
 * drop, and a third opener still finds the pool in use by the server,
 * which serves on. */
START_TEST(lessee_cannot_unlock_live_server)
{
    int shm = test_fabric_row("shm");
    pid_t lessee;
    struct pm_opts po = {0};
    struct pm_pool *p = NULL;
    struct tern_rpc_ep *ep;
    struct tern_kv *kv;
    int rc;

    lk = test_shared_alloc(sizeof(*lk));
    start_os_server(0, shm, NULL);
    lessee = test_fork(lock_lessee, (void *)1);
    wait_lessee();
    CHECK(lk->pool_fds > 0, "the lessee was sent no descriptor of the pool");
    CHECK(lk->locked == 0, "the lessee's descriptor of the pool holds the server's lock");
    rc = pm_open(test_kv_pool(0), &po, &p);
    if (rc == 0)
        pm_close(p);
    CHECK(rc == TERN_EBUSY, "a third opener of a live server's pool: %s, not TERN_EBUSY",
          rc ? tern_err_name(rc) : "opened it");
    ep = test_rpc_ep(NULL);
    kv = kv_open_path(ep, 1, TERN_KV_PATH_ONESIDED);
    expect_lessee_puts(kv);
    kv_must_put(kv, "after", 5, "unlock", 6, NULL);
    test_child_kill(&lessee);
    munmap(lk, sizeof(*lk));
    test_kv_end(ep, kv, 1);
}
END_TEST

void kv_os_add_pool_lock(const struct kv_os_cases *c)
{
    tcase_add_test(c->pool_lock, lessee_keeps_no_lock_of_dead_server);
    tcase_add_test(c->pool_lock, lessee_cannot_unlock_live_server);
}

#endif /* TERN_HAVE_SERVICES */
