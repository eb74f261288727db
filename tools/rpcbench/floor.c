#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "floor.h"
#include "hist.h"
#include "rpc.h"

static void pin_to(int cpu)
{
    cpu_set_t set;

    if (cpu < 0)
        return;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

int run_floor(uint64_t iters, int cpu_a, int cpu_b, bool json)
{
    static struct hist h;
    uint64_t warm = iters / 10, *line;
    pid_t pid;
    int status;

    line = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (line == MAP_FAILED)
        return 1;
    pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        /* Answer every odd value with the next even one. */
        pin_to(cpu_b);
        for (uint64_t i = 0; i < iters + warm; i++) {
            uint64_t want = 2 * i + 1;

            while (__atomic_load_n(line, __ATOMIC_ACQUIRE) != want)
                ;
            __atomic_store_n(line, want + 1, __ATOMIC_RELEASE);
        }
        _exit(0);
    }
    pin_to(cpu_a);
    hist_reset(&h);
    for (uint64_t i = 0; i < iters + warm; i++) {
        uint64_t t0 = tern_now_ns();

        __atomic_store_n(line, 2 * i + 1, __ATOMIC_RELEASE);
        while (__atomic_load_n(line, __ATOMIC_ACQUIRE) != 2 * i + 2)
            ;
        if (i >= warm)
            hist_add(&h, tern_now_ns() - t0);
    }
    waitpid(pid, &status, 0);
    munmap(line, 4096);
    if (json)
        printf("{\"workload\":\"floor\",\"iters\":%llu,\"p50_ns\":%llu,\"p99_ns\":%llu}\n",
               (unsigned long long)iters, (unsigned long long)hist_quantile(&h, 0.5),
               (unsigned long long)hist_quantile(&h, 0.99));
    else
        printf("cache-line ping-pong between two processes: p50 %.3f us, p99 %.3f us "
               "(%llu round trips)\n",
               hist_quantile(&h, 0.5) / 1e3, hist_quantile(&h, 0.99) / 1e3,
               (unsigned long long)iters);
    return 0;
}
