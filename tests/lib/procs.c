#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "procs.h"
#include "transport.h"

#define MAX_TRACKED 64
#define MAX_DIRS 8
#define DIR_LEN 96

static pid_t tracked[MAX_TRACKED];
static char dirs[MAX_DIRS][DIR_LEN];
static bool at_exit_set;
static int janitor_fd = -1;     /* write end; the janitor waits for EOF */
static pid_t janitor_of = 0;    /* the process that started it */

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;

    if (d) {
        while ((de = readdir(d))) {
            char p[DIR_LEN + 300];

            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static void cleanup_at_exit(void)
{
    if (getpid() != janitor_of)
        return;     /* a child that inherited the registry: not its to clean */
    for (int i = 0; i < MAX_TRACKED; i++)
        test_child_kill(&tracked[i]);
    for (int i = 0; i < MAX_DIRS; i++)
        if (dirs[i][0]) {
            remove_dir(dirs[i]);
            dirs[i][0] = 0;
        }
}

/* The janitor: in its own process group, so Check's kill of the test's
 * group spares it. It reads folder names from the pipe; every child of the
 * test process inherits the write end, so EOF means the test process and
 * all its children are gone. Then it removes the folders and sweeps what
 * dead processes left on every fabric. */
static void janitor_start(void)
{
    int fds[2];
    pid_t pid;

    if (janitor_fd >= 0 && janitor_of == getpid())
        return;
    if (janitor_fd >= 0)
        close(janitor_fd);     /* a child's copy of its parent's janitor */
    ck_assert_int_eq(pipe(fds), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char names[MAX_DIRS][DIR_LEN];
        int n = 0;

        setpgid(0, 0);
        close(fds[1]);
        for (;;) {
            char buf[DIR_LEN];
            ssize_t r = read(fds[0], buf, sizeof(buf));

            if (r == 0 || (r < 0 && errno != EINTR))
                break;
            if (r == (ssize_t)sizeof(buf) && n < MAX_DIRS) {
                memcpy(names[n], buf, DIR_LEN);
                names[n++][DIR_LEN - 1] = 0;
            }
        }
        for (int i = 0; i < n; i++)
            remove_dir(names[i]);
        tern_tp_sweep();
        _exit(0);
    }
    close(fds[0]);
    janitor_fd = fds[1];
    janitor_of = getpid();
}

static void prepare(void)
{
    if (janitor_of && janitor_of != getpid()) {
        /* A child of a test process (a server): what its parent tracks is
         * its parent's. */
        memset(tracked, 0, sizeof(tracked));
        memset(dirs, 0, sizeof(dirs));
    }
    if (!at_exit_set) {
        atexit(cleanup_at_exit);
        at_exit_set = true;
    }
    janitor_start();
}

static void untrack(pid_t pid)
{
    for (int i = 0; i < MAX_TRACKED; i++)
        if (tracked[i] == pid)
            tracked[i] = 0;
}

void test_child_track(pid_t pid)
{
    prepare();
    for (int i = 0; i < MAX_TRACKED; i++)
        if (!tracked[i]) {
            tracked[i] = pid;
            return;
        }
    ck_abort_msg("more than %d children in one test", MAX_TRACKED);
}

void test_child_kill(pid_t *pid)
{
    if (*pid <= 0)
        return;
    kill(*pid, SIGKILL);
    /* Only a reaped child is gone with everything it held (a pool's
     * lock): a signal must not cut the wait short. */
    while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
        ;
    untrack(*pid);
    *pid = 0;
}

pid_t test_fork(int (*fn)(void *arg), void *arg)
{
    pid_t pid;

    prepare();
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(fn(arg));
    test_child_track(pid);
    return pid;
}

static int exit_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int test_child_wait(pid_t *pid)
{
    pid_t p = *pid;
    int status;

    ck_assert_int_gt(p, 0);
    *pid = 0;
    untrack(p);
    if (waitpid(p, &status, 0) != p)
        return -1;
    return exit_code(status);
}

bool test_child_exited(pid_t *pid, int *code)
{
    int status;

    if (*pid <= 0 || waitpid(*pid, &status, WNOHANG) != *pid)
        return false;
    untrack(*pid);
    *pid = 0;
    *code = exit_code(status);
    return true;
}

void *test_shared_alloc(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    ck_assert_ptr_ne(p, MAP_FAILED);
    return p;
}

char *test_pool_dir(char *buf, size_t len, const char *name)
{
    struct stat st;
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";

    snprintf(buf, len, "%s/tern-%s-XXXXXX", base, name);
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp %s: %s", buf, strerror(errno));
    return buf;
}

char *test_tmpdir(char *buf, size_t len, const char *name)
{
    char rec[DIR_LEN] = {0};

    ck_assert_uint_le(len, DIR_LEN);
    prepare();
    test_pool_dir(buf, len, name);
    for (int i = 0; i < MAX_DIRS; i++)
        if (!dirs[i][0]) {
            snprintf(dirs[i], DIR_LEN, "%s", buf);
            snprintf(rec, sizeof(rec), "%s", buf);
            ck_assert_int_eq(write(janitor_fd, rec, sizeof(rec)), (ssize_t)sizeof(rec));
            return buf;
        }
    ck_abort_msg("more than %d folders in one test", MAX_DIRS);
    return buf;
}

void test_tmpdir_remove(const char *dir)
{
    for (int i = 0; i < MAX_DIRS; i++)
        if (dirs[i][0] && strcmp(dirs[i], dir) == 0)
            dirs[i][0] = 0;
    remove_dir(dir);
}

char *test_pool_file(char *buf, size_t len, const char *name)
{
    char dir[DIR_LEN];

    test_pool_dir(dir, sizeof(dir), name);
    ck_assert_int_lt(snprintf(buf, len, "%s/%s.pool", dir, name), (int)len);
    return buf;
}

void test_pool_file_remove(const char *path)
{
    char p[DIR_LEN + 64];
    char *slash;

    unlink(path);
    snprintf(p, sizeof(p), "%s.creating", path);
    unlink(p);
    snprintf(p, sizeof(p), "%s", path);
    slash = strrchr(p, '/');
    ck_assert_ptr_nonnull(slash);
    *slash = 0;
    rmdir(p);
}

unsigned test_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    unsigned n = 0;

    ck_assert_ptr_nonnull(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static struct tern_rpc_ep *child_ep;

static void child_stop(int sig)
{
    (void)sig;
    if (child_ep)
        tern_rpc_stop(child_ep);
}

pid_t spawn_rpc_server(void (*setup)(struct tern_rpc_ep *ep),
                       const struct tern_rpc_config *cfg, char *uri, size_t uri_len)
{
    return spawn_rpc_server_at(setup, cfg, "tcp://127.0.0.1:0", uri, uri_len);
}

pid_t spawn_rpc_server_at(void (*setup)(struct tern_rpc_ep *ep),
                          const struct tern_rpc_config *cfg, const char *listen_uri,
                          char *uri, size_t uri_len)
{
    int fds[2];
    pid_t pid;
    ssize_t got = 0, n;

    prepare();
    ck_assert_int_eq(pipe(fds), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char bound[128];

        close(fds[0]);
        if (tern_rpc_open(cfg, &child_ep) < 0)
            _exit(3);
        if (setup)
            setup(child_ep);
        if (tern_rpc_listen(child_ep, listen_uri, bound, sizeof(bound)) < 0)
            _exit(4);
        signal(SIGTERM, child_stop);
        if (write(fds[1], bound, strlen(bound) + 1) < 0)
            _exit(5);
        close(fds[1]);
        tern_rpc_run(child_ep, 60000000000ll);
        tern_rpc_close(child_ep);
        _exit(0);
    }
    close(fds[1]);
    test_child_track(pid);
    while (got < (ssize_t)uri_len - 1 &&
           (n = read(fds[0], uri + got, uri_len - 1 - (size_t)got)) > 0)
        got += n;
    close(fds[0]);
    uri[got > 0 ? got : 0] = 0;
    ck_assert_msg(got > 1, "server process did not start");
    return pid;
}

int stop_server(pid_t pid)
{
    int status;

    kill(pid, SIGTERM);
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    untrack(pid);
    return exit_code(status);
}
