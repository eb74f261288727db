/* rpcbench plumbing shared by its benchmarks: CPU pinning, a child
 * process that reports the address it listens on, and where the services'
 * benchmarks put their pools. */
#ifndef RPCBENCH_SPAWN_H
#define RPCBENCH_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Pin the calling process to `cpu` (-1: leave it); warns on failure. */
void bench_pin(int cpu);

/* Fork a child that runs child(arg, fd) and exits with its result; the
 * child writes its address (or "-" on failure) to fd and closes it. The
 * address is read into `addr`. Returns the child's pid, or -1 if fork or
 * pipe failed; `addr` is empty or "-..." if the child did not start. */
pid_t bench_spawn(int (*child)(void *arg, int fd), void *arg, char *addr, size_t len);

/* Where a benchmark's pool goes by default: /dev/shm if it is there and
 * writable, else $TMPDIR, else /tmp. */
const char *bench_default_pool_dir(void);

/* Is `dir` on tmpfs (where PMEM_IS_PMEM_FORCE=1 stands in for PM)? */
bool bench_on_tmpfs(const char *dir);

#endif
