/* One-sided shipping: a primary writes its log's batches straight into a
 * backup's persistent ring, and the backup's CPU takes no part in making
 * them durable (Rowan's design).
 *
 * The ring is a file beside the replica's state file, mapped by the
 * backup and registered for one-sided access in two regions: a header
 * page that peers may only read (the backup's `head`, how far it has
 * consumed) and the data area, which the primary it was granted to may
 * write. Offsets into the data area count from the ring's creation and
 * grow across laps (an offset's place is `at % size`); every frame starts
 * 64-byte aligned:
 *
 *   struct repl_frame  gen, at, len, kind, sum
 *   struct repl_batch  exactly as in an APPEND (repl_wire.h)
 *   records            ...
 *
 * A WRAP frame (no batch) says the rest of the lap is unused. A frame
 * counts only with the grant's `gen` and `at` equal to where the backup
 * expects the next one, and its sum right (a torn or half-landed frame is
 * "not yet"); its batch is then checked as an APPEND's is.
 *
 * GRANT (REPL_M_RING, repl_wire.h): the primary asks a backup for a ring
 * at its epoch. The backup first takes what its ring holds (the frames of
 * the grant before), then starts a new grant: a new random `gen`, new keys
 * (the old primary's stop working), the header persisted. Frames of an
 * older grant are ignored from then on.
 *
 * When a frame is durable, and so counts for the write concern:
 * - shm (the fabric maps the backup's ring into the primary): the primary
 *   stores the frame and flushes it through its own mapping of the same
 *   file pages (cache-line flushes if the ring is on PM, msync if it is a
 *   file): durable there at once;
 * - other fabrics with one-sided put, ring on PM: the put, then a one-sided
 *   read of the header (a read after a write flushes it to the backup's
 *   persistence domain, as Rowan and FlatStore do);
 * - other fabrics, ring on a file: the put, then a small call (RING_SYNC)
 *   on which the backup takes the ring's frames into its store durably and
 *   answers its position.
 * The backup takes frames into its store (apply, sync) on its own time:
 * each pass of its loop, before it handles any replication request, and
 * when it opens (frames acknowledged before a crash are applied then).
 *
 * Fencing. A one-sided write is checked by nobody at the backup, so it is
 * used only while the primary's lease is surely alive (repl_set_lease):
 * then no successor can be elected, and no backup can have seen a newer
 * epoch. A primary in doubt ships by APPEND, which each backup checks
 * against the newest epoch it has seen. A backup that sees a newer epoch,
 * or takes a full copy, or becomes primary, ends the grant after taking
 * its frames.
 *
 * Threads: the endpoint's thread, as the rest of the group.
 */
#ifndef TERN_REPL_RING_H
#define TERN_REPL_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"

#define REPL_RING_DEFAULT (8u << 20)    /* data bytes */
#define REPL_RING_MIN (2u << 20)        /* a batch and a half, and a wrap */
#define REPL_RING_HDR 4096u             /* the header page */
#define REPL_RING_HEAD_OFF 64u          /* `head`, alone in its line */
#define REPL_FRAME_ALIGN 64u

enum repl_frame_kind { REPL_FRAME_BATCH = 1, REPL_FRAME_WRAP = 2 };

struct repl_frame {
    uint64_t gen;                   /* the grant's */
    uint64_t at;                    /* this frame's offset, laps counted */
    uint32_t len;                   /* batch bytes that follow (0: WRAP) */
    uint32_t kind;                  /* enum repl_frame_kind */
    uint64_t sum;                   /* XXH3-64 of this header (sum 0) and the batch */
};

/* The GRANT answer. */
enum repl_ring_flags {
    REPL_RING_PMEM = 1u << 0,       /* the ring is on PM: a flushed write is durable */
};

struct repl_ring_grant {
    uint64_t epoch;                 /* the newest the backup has seen */
    uint64_t position;              /* its position, every earlier frame taken */
    struct tern_tp_rkey hdr;        /* the header page: read */
    struct tern_tp_rkey data;       /* the data area: write */
    uint64_t gen;
    uint64_t head;                  /* where the first frame goes */
    uint32_t size;                  /* data bytes, a multiple of 64 */
    uint32_t flags;                 /* enum repl_ring_flags */
};

/* Bytes a frame with a batch of `len` bytes takes in the ring. */
static inline uint64_t repl_frame_span(uint32_t len)
{
    return ((uint64_t)sizeof(struct repl_frame) + len + REPL_FRAME_ALIGN - 1) &
           ~(uint64_t)(REPL_FRAME_ALIGN - 1);
}

/* Lay a frame at `dst`: the batch must already be at dst + sizeof(frame);
 * the header goes in last, `at` last of all (a reader that sees `at` sees
 * the rest: x86 stores are seen in order). */
void repl_frame_seal(void *dst, uint64_t gen, uint64_t at, uint32_t kind, uint32_t len);

/* The frame a ring of `size` data bytes at `data` holds at offset `head`
 * for grant `gen`: 1 with *batch, *len (0 for WRAP) and *next set; 0 when
 * none is there yet (another grant's bytes, an older lap's, a torn or
 * half-landed frame). Reads nothing outside [data, data + size). */
int repl_frame_next(const volatile uint8_t *data, uint32_t size, uint64_t gen, uint64_t head,
                    const uint8_t **batch, uint32_t *len, uint64_t *next);

/* ---- the backup's side (struct repl's ring) ---- */

struct repl;
struct repl_ring;

/* Open (or create, `size` data bytes) the ring file at `path` and take the
 * frames of its last grant into the group's store. TERN_EIO, TERN_ENOMEM. */
int repl_ring_open(struct repl *r, const char *path, uint32_t size);
void repl_ring_close(struct repl *r);

/* Take every whole frame of the current grant that follows the store's
 * position into the store, durably, and publish the new head. Cheap when
 * there is none (two loads). 0, or the store's error. */
int repl_ring_drain(struct repl *r);

/* Drain, then end the grant: its keys stop working, its frames count no
 * more. */
void repl_ring_retire(struct repl *r);

/* The GRANT handler's work, once the epoch is admitted. */
int repl_ring_grant(struct repl *r, const struct tern_session *s, uint64_t epoch,
                    struct repl_ring_grant *out);

/* ---- the primary's side (per replica) ---- */

struct replica;

enum repl_ring_state { RG_NONE = 0, RG_ASKED, RG_ON, RG_OFF };

struct repl_ring_peer {
    enum repl_ring_state st;
    uint32_t sess_epoch;            /* tern_session_epoch when granted */
    struct repl_ring_grant g;
    uint64_t tail;                  /* where the next frame goes */
    uint64_t head;                  /* the backup's head, as last read */
    uint8_t *data;                  /* the data area mapped here (shm), or NULL */
    const volatile uint64_t *headp; /* the header's head mapped here, or NULL */
    struct tern_rpc_mr *stage;      /* frames for put, and the head read back */
    bool flushing;                  /* a put and its flush are out */
    bool nudge;                     /* full: an empty APPEND wakes the replica */
    bool by_sync;                   /* frames made durable by RING_SYNC calls */
    uint64_t flush_last;            /* durable there once the flush is back */
    uint32_t gen;                   /* the replica's, for late completions */
    uint64_t frames, direct, puts;  /* counters */
};

/* Ship what the replica lacks through its ring, if the fabric and the
 * lease allow: true if the ring is in charge of the replica's records now
 * (shipped, or waiting for a grant, for room, or for a flush), false if
 * they go by APPEND. */
bool repl_ring_ship(struct repl *r, struct replica *p);

/* The same, now, for every replica whose frames become durable without a
 * call: stores into a ring mapped here (shm), or a put and a read into a
 * ring on PM (rdma). A handler that wrote records ships them itself, so
 * that its reply finds them durable at once (mapped) or the put and the
 * read leave with the poll's flush, one doorbell, instead of waiting for
 * the next pass. Never makes a call (what needs one waits for the pass). */
void repl_ring_ship_now(struct repl *r);

/* Forget the replica's ring (its session ended, it needs a copy, ...). */
void repl_ring_forget(struct replica *p);

/* For status: "one-sided", "one-sided+sync", or NULL (APPEND). */
const char *repl_ring_path(const struct replica *p);

#endif
