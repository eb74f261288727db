/* Cooperative flushing: the pool's owner cuts a large dirty range into
 * pieces and posts them on a job board; other threads (pm_help) take
 * pieces from it while the owner works through the rest itself. Internal
 * to the pool (pm.c); see pm_flush.c for the protocol and why it is safe. */
#ifndef TERN_PM_FLUSH_H
#define TERN_PM_FLUSH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pm_board;

/* A board for one pool, allocated once at open. `is_pmem`: pieces are
 * cache-line flushes (else msync). `split`: ranges of this many bytes or
 * more are cut into pieces (0 = 256 KiB, UINT32_MAX = never). NULL when
 * out of memory. */
struct pm_board *pm_board_new(bool is_pmem, uint32_t split);

/* Free a board nobody uses any more (no piece posted, no helper inside
 * pm_board_help). */
void pm_board_free(struct pm_board *b);

/* Owner: start making [at, at+n) durable. A large range is posted in
 * pieces (helpers may start on them at once); a small one is flushed or
 * msynced here. Nothing is durable before pm_flush_wait(). TERN_EIO if an
 * msync failed here. */
int pm_flush(struct pm_board *b, void *at, size_t n);

/* Owner: run the pieces nobody took, wait for those helpers took (on PM,
 * for a while: then it flushes their pieces itself), then fence. Always
 * leaves no piece to take, so it must follow pm_flush() even after a
 * failure. TERN_EIO if any msync failed, now or ever before on this
 * board. */
int pm_flush_wait(struct pm_board *b);

/* Any thread: run one posted piece. 1 if it ran one, 0 if none was
 * posted. */
int pm_board_help(struct pm_board *b);

#endif
