/* Message rings in a byte-addressable window, shared by the window fabrics
 * (ring/chan.h). Internal to transport/.
 *
 * Two nodes each own a window: memory the *peer* writes and the owner reads.
 * The peer writes it through a PCIe BAR, or through a shared mapping.
 * Remote reads across PCIe are slow, so the protocol only ever writes
 * remotely and reads locally:
 *
 *   sender                                   receiver (owns the window)
 *   payload -> peer window ring  ---------->  polls the header at its read
 *   fence, one 8-byte header store           position (local read)
 *   reads its credit (local) <-------------- releases views, writes its
 *                                            consumed index into the
 *                                            sender's window (remote write)
 *
 * A window is split into channels: one per connection, each with its own
 * ring, so a connection that stops reading blocks only itself. Records are
 * [8-byte header][payload], padded to whole cache lines; a record never
 * wraps (a PAD record fills the end of the ring), so every message is one
 * contiguous view.
 *
 * Flow control is by credit: the sender may be at most ring_bytes - 64
 * ahead of the consumed index the receiver last wrote back (the last line
 * is the next record's header slot, see below). The receiver writes it
 * back lazily (every quarter ring), or at once when the sender raises the
 * congestion flag in the receiver's window because it ran out of credit.
 */
#ifndef TERN_RING_H
#define TERN_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RING_HDR 8

/* Record types (8 bits in the header). */
enum ring_type {
    RING_PAD = 0,   /* skip to the start of the ring */
    RING_MSG = 1,   /* a whole message */
    RING_FRAG = 2,  /* a piece of a message too large for one record */
    RING_CTL = 3,   /* fabric control (connect, close, one-sided, ...) */
};

/* Per-channel control words in the owner's window, written by the peer. */
struct ring_ctl {
    volatile uint64_t consumed;   /* peer as receiver: bytes of our tx it released */
    volatile uint64_t credit_req; /* peer as sender: nonzero asks for `consumed` now */
    uint64_t pad[6];              /* one cache line: no false sharing */
};

/* The shape of a window; both sides must agree on it. */
struct ring_geometry {
    uint32_t n_chan;     /* channels in the window */
    uint32_t ring_bytes; /* ring size per channel, a power of two >= 4 KiB */
};

/* Bytes one window needs for `g`, or 0 if `g` is invalid. */
size_t ring_window_size(const struct ring_geometry *g);

/* Where channel `chan`'s control words and ring live in a window. */
struct ring_ctl *ring_ctl_of(uint8_t *window, const struct ring_geometry *g, uint32_t chan);
uint8_t *ring_data_of(uint8_t *window, const struct ring_geometry *g, uint32_t chan);

/* One direction of one channel, as the sender sees it. */
struct ring_tx {
    uint8_t *ring;              /* in the peer's window: write only */
    struct ring_ctl *peer_ctl;  /* in the peer's window: write only */
    struct ring_ctl *my_ctl;    /* in our window: the peer writes `consumed` here */
    uint32_t size;
    uint64_t head;              /* bytes published */
    uint32_t seq;               /* records published */
    uint8_t *resv;              /* open reservation (payload start) or NULL */
    uint32_t resv_len;
    bool congested;             /* credit_req raised */
    bool wc;                    /* the peer's window is write-combining (a BAR) */
    uint64_t asked_at;          /* `consumed` when it was raised */
    uint64_t limit;             /* consumed + size - RING_SLACK when last
                                 * read: head may grow to here without
                                 * reading it again */
    uint64_t zeroed;            /* the line heads of [head, zeroed) are zero:
                                 * any of them may be a next header slot */
};

/* The other direction, as the receiver sees it. */
struct ring_rx {
    uint8_t *ring;              /* in our window: read only */
    struct ring_ctl *peer_ctl;  /* in the peer's window: we write `consumed` */
    struct ring_ctl *my_ctl;    /* in our window: the peer raises credit_req */
    uint32_t size;
    uint64_t parsed;            /* bytes parsed (views handed out) */
    uint64_t released;          /* bytes released */
    uint64_t reported;          /* last `consumed` written to the peer */
    uint32_t seq;               /* next record expected */
    uint32_t views;             /* views handed out, not yet released */
    bool answered;              /* a credit request was answered: the owner
                                 * should ring the sender's doorbell */
};

/* Bind a channel: `mine` is our window, `peers` the peer's mapped window. */
void ring_tx_init(struct ring_tx *tx, uint8_t *mine, uint8_t *peers,
                  const struct ring_geometry *g, uint32_t chan);
void ring_rx_init(struct ring_rx *rx, uint8_t *mine, uint8_t *peers,
                  const struct ring_geometry *g, uint32_t chan);

/* Largest payload one record may carry in a ring of `size` bytes. */
static inline uint32_t ring_max_record(uint32_t size)
{
    return size / 4 - RING_HDR;
}

/* ring_tx_reserve's slow half: wrapping (a PAD record), running out of
 * credit, or bad arguments. */
void *ring_tx_reserve_slow(struct ring_tx *tx, uint32_t len);

/* Drop the open reservation. */
void ring_tx_abort(struct ring_tx *tx);

/* Bytes the sender may still publish before it runs out of credit. */
uint32_t ring_tx_room(const struct ring_tx *tx);

/* The next record, if one has arrived: 1 with its payload view, length and
 * type; 0 if none yet; TERN_EPROTO if the ring holds something no correct
 * sender writes (the channel is then unusable). Views must be released in
 * order with ring_rx_release(). */
int ring_rx_peek_slow(struct ring_rx *rx, const void **view, uint32_t *len,
                      enum ring_type *type);

/* Header word: | seq (24) | type (8) | len (32) |. The receiver only ever
 * polls the position right after the last record, so when the sender
 * publishes a record, the header slot that follows it must hold zero: a
 * polled position holds zero or a header written this lap, never a stale
 * header or stale payload bytes that could pass for one. The sender keeps
 * the line heads of some free ring ahead of it zeroed, refilled in batches
 * just *after* a header store: a zero store just before it would hold the
 * header back for as long as that line takes to come over from the
 * receiver. Only a record that jumps past the zeroed part zeroes its next
 * slot first. The receiver writes nothing into its ring, so ring lines
 * travel one way only, from the sender's cache to the receiver's (a
 * receiver that zeroed what it released would pull every line back, and
 * the sender would pull it again to reuse it). The sequence number, which
 * skips 0, is a second check. */
#define RING_SEQ_MASK 0xffffffu

/* Credit the sender never uses: the header slot after its newest record,
 * which it zeroes, must not be a byte the receiver still holds. */
#define RING_SLACK 64

/* Zeroed ring the sender keeps ahead of its head: up to RING_ZERO_HIGH
 * bytes (within its credit); when a large record ate it, refilled once less
 * than RING_ZERO_LOW bytes are left. */
#define RING_ZERO_LOW 1024
#define RING_ZERO_HIGH 4096

static inline uint32_t ring_seq_next(uint32_t seq)
{
    seq = (seq + 1) & RING_SEQ_MASK;
    return seq ? seq : 1;
}

static inline bool ring_hdr_fresh(uint64_t h, uint32_t seq)
{
    return (uint32_t)(h >> 40) == (seq & RING_SEQ_MASK);
}

/* Ring bytes a record with `len` payload bytes takes: records start on
 * cache lines, so a sender filling the next record never writes a line the
 * receiver is still reading. */
static inline uint32_t ring_rec_bytes(uint32_t len)
{
    return (RING_HDR + len + 63) & ~63u;
}

static inline int ring_rx_peek(struct ring_rx *rx, const void **view, uint32_t *len,
                               enum ring_type *type)
{
    uint32_t pos = (uint32_t)(rx->parsed & (rx->size - 1));
    uint64_t h;

    if (rx->parsed - rx->released >= rx->size)
        return 0;
    h = __atomic_load_n((const uint64_t *)(const void *)(rx->ring + pos), __ATOMIC_ACQUIRE);
    if (!h)
        return 0;
    /* The common case inline: the next record, a message or control record
     * that fits. Anything else (PAD, a bad header) takes the slow path. */
    uint32_t l = (uint32_t)h, t = (uint32_t)(h >> 32) & 0xff;

    if (!ring_hdr_fresh(h, rx->seq) || t == RING_PAD || t > RING_CTL ||
        l > rx->size - pos - RING_HDR)
        return ring_rx_peek_slow(rx, view, len, type);
    /* The header line is here; ask for the next lines of the record now,
     * so their transfers overlap the dispatch instead of following it. */
    for (uint32_t o = 64; o < RING_HDR + l && o <= 192; o += 64)
        __builtin_prefetch(rx->ring + pos + o);
    rx->seq = ring_seq_next(rx->seq);
    *view = rx->ring + pos + RING_HDR;
    *len = l;
    *type = (enum ring_type)t;
    rx->parsed += ring_rec_bytes(l);
    rx->views++;
    return 1;
}

/* Put back the record the last ring_rx_peek() returned (length `len`), to
 * be peeked again later: for a record that cannot be handled yet. */
void ring_rx_unpeek(struct ring_rx *rx, uint32_t len);

/* ring_rx_release's slow half: PAD records to step over, or credit to
 * report. */
void ring_rx_release_slow(struct ring_rx *rx);

/* Write the consumed index back to the sender now (ring_rx_credit's slow
 * half). */
void ring_rx_report(struct ring_rx *rx);

/* True if the sender asked for credit and there is some to give. */
static inline bool ring_rx_credit_due(const struct ring_rx *rx)
{
    return rx->released != rx->reported &&
           __atomic_load_n(&rx->my_ctl->credit_req, __ATOMIC_RELAXED);
}

/* Answer a pending credit request even if nothing was released lately
 * (called from the poll loop so a congested sender never waits forever). */
static inline void ring_rx_credit(struct ring_rx *rx)
{
    if (ring_rx_credit_due(rx))
        ring_rx_report(rx);
}

/* True if a poll would find nothing to do on this ring: no record at the
 * read position (or every byte held) and no credit owed. The idle poll
 * loop runs this test on every channel, so it is a few loads, inline. */
static inline bool ring_rx_quiet(const struct ring_rx *rx)
{
    uint32_t pos = (uint32_t)(rx->parsed & (rx->size - 1));

    if (rx->parsed - rx->released < rx->size &&
        __atomic_load_n((const uint64_t *)(const void *)(rx->ring + pos), __ATOMIC_RELAXED))
        return false;
    return !rx->answered && !ring_rx_credit_due(rx);
}

/* The fast paths of the data path, inline: a message round trip runs
 * reserve, publish, peek and release once on each side, and a function call
 * apiece costs as much as the work they do in the common case. */

/* Order the payload stores before the header store. On ordinary
 * (write-back) memory x86 keeps stores in order and a compiler barrier is
 * enough, except that memcpy may use non-temporal stores for large copies;
 * write-combining mappings (a BAR) reorder stores too. Those get an sfence.
 * Elsewhere a release fence does it all. */
static inline void ring_publish_fence(const struct ring_tx *tx, uint32_t len)
{
#if defined(__x86_64__) || defined(__i386__)
    if (tx->wc || len >= 16384)
        __builtin_ia32_sfence();
    else
        __atomic_signal_fence(__ATOMIC_RELEASE);
#else
    (void)tx;
    (void)len;
    __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

static inline uint64_t ring_hdr_make(uint32_t len, enum ring_type type, uint32_t seq)
{
    return (uint64_t)len | (uint64_t)type << 32 | (uint64_t)(seq & RING_SEQ_MASK) << 40;
}

/* Reserve `len` bytes of payload in the peer's ring (len <= max record).
 * Returns a pointer into the peer's memory, or NULL without credit (the
 * congestion flag is raised so that credit comes back soon). */
static inline void *ring_tx_reserve(struct ring_tx *tx, uint32_t len)
{
    uint32_t pos = (uint32_t)(tx->head & (tx->size - 1));
    uint32_t need = ring_rec_bytes(len);

    /* Common case: no reservation open, the record fits before the end of
     * the ring and within the credit known from the last look. */
    if (tx->resv || need > tx->size - pos || tx->head + need > tx->limit ||
        len > ring_max_record(tx->size))
        return ring_tx_reserve_slow(tx, len);
    tx->congested = false;
    tx->resv = tx->ring + pos + RING_HDR;
    tx->resv_len = len;
    return tx->resv;
}

/* Make sure the header slot at absolute position `next` holds zero before
 * a record ending there is published. */
static inline void ring_tx_clear_slot(struct ring_tx *tx, uint64_t next)
{
    if (next + RING_HDR <= tx->zeroed)
        return;
    __atomic_store_n((uint64_t *)(void *)(tx->ring + (next & (tx->size - 1))), 0,
                     __ATOMIC_RELAXED);
    tx->zeroed = next + 64;
}

/* Zero line heads ahead of the head, up to RING_ZERO_HIGH and the credit. */
void ring_tx_zero_ahead(struct ring_tx *tx);

/* Publish the reservation with `len` <= reserved bytes as a record of
 * `type`: fence, then one 8-byte header store. */
static inline void ring_tx_publish(struct ring_tx *tx, uint32_t len, enum ring_type type)
{
    uint8_t *hdr = tx->resv - RING_HDR;
    uint32_t used;

    if (len > tx->resv_len)
        len = tx->resv_len;
    used = ring_rec_bytes(len);
    /* Posted shorter than reserved: the caller may have written the lines
     * it gives back, so they are no longer known to be zero. */
    if (used < ring_rec_bytes(tx->resv_len) && tx->zeroed > tx->head + used)
        tx->zeroed = tx->head + used;
    ring_tx_clear_slot(tx, tx->head + used);
    ring_publish_fence(tx, len);
    __atomic_store_n((uint64_t *)(void *)hdr, ring_hdr_make(len, type, tx->seq),
                     __ATOMIC_RELAXED);
    tx->seq = ring_seq_next(tx->seq);
    tx->head += used;
    tx->resv = NULL;
    /* Keep the ring ahead zeroed. The common case, inline: zero as many
     * lines at the far end as this record used at the near end. */
    if (tx->zeroed >= tx->head && tx->zeroed + used <= tx->limit + RING_SLACK &&
        tx->zeroed + used - tx->head <= RING_ZERO_HIGH) {
        for (uint32_t o = 0; o < used; o += 64)
            __atomic_store_n((uint64_t *)(void *)(tx->ring + ((tx->zeroed + o) & (tx->size - 1))),
                             0, __ATOMIC_RELAXED);
        tx->zeroed += used;
    } else if (tx->zeroed < tx->head + RING_ZERO_LOW)
        ring_tx_zero_ahead(tx);
}

/* Release the oldest view; writes the consumed index back to the sender
 * when a quarter ring has been freed or the sender asked for credit. */
static inline void ring_rx_release(struct ring_rx *rx)
{
    uint32_t pos = (uint32_t)(rx->released & (rx->size - 1));
    uint64_t h;

    if (!rx->views)
        return;
    /* Views go back in order: the oldest one starts at `released`, and a
     * view is never a PAD record. */
    h = __atomic_load_n((const uint64_t *)(const void *)(rx->ring + pos), __ATOMIC_RELAXED);
    /* The header was checked when peeked, but the sender can still write
     * it: never let it take the release beyond what was parsed, or past
     * the end of the ring (a record never wraps). */
    uint32_t bytes = ring_rec_bytes((uint32_t)h);

    if (bytes > rx->parsed - rx->released)
        bytes = (uint32_t)(rx->parsed - rx->released);
    if (bytes > rx->size - pos)
        bytes = rx->size - pos;
    rx->views--;
    rx->released += bytes;
    if (rx->released != rx->parsed || rx->released - rx->reported >= rx->size / 4 ||
        __atomic_load_n(&rx->my_ctl->credit_req, __ATOMIC_RELAXED))
        ring_rx_release_slow(rx);
}

#endif
