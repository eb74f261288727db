#include <errno.h>
#include <linux/magic.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "spawn.h"

void bench_pin(int cpu)
{
    cpu_set_t set;

    if (cpu < 0)
        return;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) < 0)
        fprintf(stderr, "rpcbench: cannot pin to cpu %d: %s\n", cpu, strerror(errno));
}

pid_t bench_spawn(int (*child)(void *arg, int fd), void *arg, char *addr, size_t len)
{
    int fds[2];
    ssize_t got = 0, n;
    pid_t pid;

    addr[0] = 0;
    if (pipe(fds) < 0)
        return -1;
    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        _exit(child(arg, fds[1]));
    }
    close(fds[1]);
    while (got < (ssize_t)len - 1 && (n = read(fds[0], addr + got, len - 1 - (size_t)got)) > 0)
        got += n;
    close(fds[0]);
    addr[got > 0 ? got : 0] = 0;
    return pid;
}

const char *bench_default_pool_dir(void)
{
    struct stat st;
    const char *t = getenv("TMPDIR");

    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0)
        return "/dev/shm";
    return t && *t ? t : "/tmp";
}

bool bench_on_tmpfs(const char *dir)
{
    struct statfs sf;

    return statfs(dir, &sf) == 0 && sf.f_type == TMPFS_MAGIC;
}
