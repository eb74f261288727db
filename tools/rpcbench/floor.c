#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "floor.h"
#include "hist.h"
#include "rpc.h"
#include "spawn.h"

/* Single-core memcpy bandwidth in MB/s for 64 KiB blocks cycling through
 * 8 MiB (beyond L2, as ring traffic is): the ceiling of any one-core copy. */
static double memcpy_mbs(void)
{
    enum { BLOCK = 65536, SPAN = 8 << 20, ROUNDS = 20000 };
    uint8_t *src = mmap(NULL, SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *dst = mmap(NULL, SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t t0;
    double secs;

    if (src == MAP_FAILED || dst == MAP_FAILED)
        return 0;
    memset(src, 1, SPAN);
    memset(dst, 2, SPAN);
    t0 = tern_now_ns();
    for (unsigned i = 0; i < ROUNDS; i++) {
        size_t off = (size_t)(i % (SPAN / BLOCK)) * BLOCK;

        memcpy(dst + off, src + off, BLOCK);
        __asm__ __volatile__("" : : "r"(dst) : "memory");
    }
    secs = (double)(tern_now_ns() - t0) / 1e9;
    munmap(src, SPAN);
    munmap(dst, SPAN);
    return (double)BLOCK * ROUNDS / secs / 1e6;
}

int run_floor(uint64_t iters, int cpu_a, int cpu_b, bool json)
{
    double mbs;
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
        bench_pin(cpu_b);
        for (uint64_t i = 0; i < iters + warm; i++) {
            uint64_t want = 2 * i + 1;

            while (__atomic_load_n(line, __ATOMIC_ACQUIRE) != want)
                ;
            __atomic_store_n(line, want + 1, __ATOMIC_RELEASE);
        }
        _exit(0);
    }
    bench_pin(cpu_a);
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
    mbs = memcpy_mbs();
    if (json)
        printf("{\"workload\":\"floor\",\"iters\":%llu,\"p50_ns\":%llu,\"p99_ns\":%llu,"
               "\"memcpy_mb_per_s\":%.0f}\n",
               (unsigned long long)iters, (unsigned long long)hist_quantile(&h, 0.5),
               (unsigned long long)hist_quantile(&h, 0.99), mbs);
    else
        printf("cache-line ping-pong between two processes: p50 %.3f us, p99 %.3f us "
               "(%llu round trips)\nsingle-core memcpy, 64 KiB blocks over 8 MiB: %.0f MB/s\n",
               hist_quantile(&h, 0.5) / 1e3, hist_quantile(&h, 0.99) / 1e3,
               (unsigned long long)iters, mbs);
    return 0;
}
