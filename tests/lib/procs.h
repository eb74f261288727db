/* Processes and files of multi-process tests: servers forked from the test
 * process, children killed on any exit of it, temporary folders, and one
 * janitor that cleans up even when Check kills the test's process group
 * (a failed assertion ends the test with _exit(), so atexit() cannot). */
#ifndef TERN_TEST_PROCS_H
#define TERN_TEST_PROCS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "rpc.h"

/* Fork a process that serves an RPC endpoint (cfg may be NULL) with the
 * services `setup` registers, listening on `listen_uri`; its bound URI is
 * written to `uri`. The child is tracked (test_child_track). SIGTERM ends it
 * cleanly (exit 0). */
pid_t spawn_rpc_server_at(void (*setup)(struct tern_rpc_ep *ep),
                          const struct tern_rpc_config *cfg, const char *listen_uri,
                          char *uri, size_t uri_len);

/* The same on tcp://127.0.0.1:0. */
pid_t spawn_rpc_server(void (*setup)(struct tern_rpc_ep *ep),
                       const struct tern_rpc_config *cfg, char *uri, size_t uri_len);

/* SIGTERM a server and reap it; its exit status (-1 if killed). */
int stop_server(pid_t pid);

/* Kill `pid` with SIGKILL at any exit of the test process (and have the
 * janitor sweep what it leaves: emulated devices, softverbs segments). */
void test_child_track(pid_t pid);

/* SIGKILL *pid now, reap it and set it to 0 (nothing if it is 0). */
void test_child_kill(pid_t *pid);

/* Fork a tracked child that runs fn(arg) and _exit()s with its return: a
 * client process of a multi-process test. */
pid_t test_fork(int (*fn)(void *arg), void *arg);

/* Wait for the tracked child *pid to exit and set *pid to 0; its exit code
 * (-1 if a signal ended it). */
int test_child_wait(pid_t *pid);

/* The same without blocking: false while *pid runs, else true with its exit
 * code (-1 if a signal ended it) in *code and *pid set to 0. */
bool test_child_exited(pid_t *pid, int *code);

/* Memory the test process and the children it forks afterwards share
 * (MAP_SHARED, zeroed); munmap it when done. */
void *test_shared_alloc(size_t len);

/* A fresh folder named after `name` on tmpfs (/dev/shm) where there is one,
 * so a persist is a cheap msync, else in /tmp; written to buf (64 bytes at
 * least), returned. It and everything in it go at any exit of the test
 * process, and the janitor removes it if that process is killed. */
char *test_tmpdir(char *buf, size_t len, const char *name);

/* The same folder, not registered for removal (the caller removes it). */
char *test_pool_dir(char *buf, size_t len, const char *name);

/* Empty and remove a folder made by test_tmpdir now. */
void test_tmpdir_remove(const char *dir);

/* A path for the pool file "<name>.pool" in a fresh folder of its own
 * (test_pool_dir), written to buf (128 bytes at least), returned. */
char *test_pool_file(char *buf, size_t len, const char *name);

/* Remove that pool file, what an interrupted create left beside it, and
 * its folder. */
void test_pool_file_remove(const char *path);

/* Descriptors this process has open. */
unsigned test_open_fds(void);

#endif
