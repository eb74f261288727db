/* What the libFuzzer targets of tests/fuzz share: reading the fuzzer's
 * bytes as a stream of small fields, and a check that aborts (a crash the
 * fuzzer reports with its input) instead of Check's assertions. */
#ifndef TERN_FUZZ_H
#define TERN_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The input, consumed from the front. Past its end every field reads 0. */
struct fz {
    const uint8_t *p;
    size_t n;
};

static inline uint8_t fz_u8(struct fz *f)
{
    if (!f->n)
        return 0;
    f->n--;
    return *f->p++;
}

static inline uint64_t fz_le(struct fz *f, unsigned bytes)
{
    uint64_t v = 0;

    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)fz_u8(f) << (8 * i);
    return v;
}

static inline uint16_t fz_u16(struct fz *f)
{
    return (uint16_t)fz_le(f, 2);
}

static inline uint32_t fz_u32(struct fz *f)
{
    return (uint32_t)fz_le(f, 4);
}

static inline uint64_t fz_u64(struct fz *f)
{
    return fz_le(f, 8);
}

/* Up to `want` bytes: *out points at them; returns how many there were. */
static inline size_t fz_take(struct fz *f, size_t want, const uint8_t **out)
{
    size_t n = want < f->n ? want : f->n;

    *out = f->p;
    f->p += n;
    f->n -= n;
    return n;
}

/* Something the code under test must do whatever its input (end, answer,
 * keep serving) did not happen: abort, so that the fuzzer keeps the input
 * that did it. */
#define FZ_CHECK(cond, ...)                                                   \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "fuzz harness: %s:%d: ", __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            abort();                                                          \
        }                                                                     \
    } while (0)

/* A pool file in /dev/shm for this process's run, named after `what` and
 * the pid, removed at exit. One per target. */
static inline char *fz_pool_buf(void)
{
    static char path[64];

    return path;
}

static inline void fz_remove_pool(void)
{
    unlink(fz_pool_buf());
}

static inline const char *fz_tmp_pool(const char *what)
{
    snprintf(fz_pool_buf(), 64, "/dev/shm/tern-fuzz-%s.%d", what, (int)getpid());
    unlink(fz_pool_buf());
    atexit(fz_remove_pool);
    return fz_pool_buf();
}

#endif
