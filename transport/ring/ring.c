/* The ring protocol of ring.h: records in a channel ring, published by one
 * 8-byte header store, credit returned by remote writes. */

#include "error.h"
#include "ring.h"

/* The header word and the sequence numbers are in ring.h (the receive fast
 * path is inline). */
static inline uint32_t seq_prev(uint32_t seq)
{
    seq = (seq - 1) & RING_SEQ_MASK;
    return seq ? seq : RING_SEQ_MASK;
}

size_t ring_window_size(const struct ring_geometry *g)
{
    if (!g->n_chan || g->ring_bytes < 4096 || (g->ring_bytes & (g->ring_bytes - 1)))
        return 0;
    return (size_t)g->n_chan * (sizeof(struct ring_ctl) + g->ring_bytes);
}

/* Layout: all control words first (one cache line per channel), then the
 * rings, so that polling the controls touches few pages. */
struct ring_ctl *ring_ctl_of(uint8_t *window, const struct ring_geometry *g, uint32_t chan)
{
    return (struct ring_ctl *)(window + (size_t)chan * sizeof(struct ring_ctl));
}

uint8_t *ring_data_of(uint8_t *window, const struct ring_geometry *g, uint32_t chan)
{
    return window + (size_t)g->n_chan * sizeof(struct ring_ctl) + (size_t)chan * g->ring_bytes;
}

void ring_tx_init(struct ring_tx *tx, uint8_t *mine, uint8_t *peers,
                  const struct ring_geometry *g, uint32_t chan)
{
    *tx = (struct ring_tx){
        .ring = ring_data_of(peers, g, chan), .peer_ctl = ring_ctl_of(peers, g, chan),
        .my_ctl = ring_ctl_of(mine, g, chan), .size = g->ring_bytes, .seq = 1,
        .limit = g->ring_bytes - RING_SLACK, .zeroed = g->ring_bytes,
    };
}

void ring_rx_init(struct ring_rx *rx, uint8_t *mine, uint8_t *peers,
                  const struct ring_geometry *g, uint32_t chan)
{
    *rx = (struct ring_rx){
        .ring = ring_data_of(mine, g, chan), .peer_ctl = ring_ctl_of(peers, g, chan),
        .my_ctl = ring_ctl_of(mine, g, chan), .size = g->ring_bytes, .seq = 1,
    };
}

uint32_t ring_tx_room(const struct ring_tx *tx)
{
    uint64_t consumed = __atomic_load_n(&tx->my_ctl->consumed, __ATOMIC_ACQUIRE);

    uint32_t used = (uint32_t)(tx->head - consumed) + RING_SLACK;

    return used >= tx->size ? 0 : tx->size - used;
}

static void store_hdr(uint8_t *at, uint64_t h)
{
    __atomic_store_n((uint64_t *)(void *)at, h, __ATOMIC_RELAXED);
}

void *ring_tx_reserve_slow(struct ring_tx *tx, uint32_t len)
{
    uint32_t pos = (uint32_t)(tx->head & (tx->size - 1));
    uint32_t need = ring_rec_bytes(len), tail_room = tx->size - pos;
    uint32_t total = need + (tail_room < need ? tail_room : 0);
    uint64_t consumed;

    if (tx->resv || len > ring_max_record(tx->size))
        return NULL;
    consumed = __atomic_load_n(&tx->my_ctl->consumed, __ATOMIC_ACQUIRE);
    if (consumed > tx->head)
        consumed = tx->head;    /* a broken peer: never credit beyond it */
    tx->limit = consumed + tx->size - RING_SLACK;
    if (tx->head + total > tx->limit) {
        /* Out of credit: ask the receiver to report now rather than lazily.
         * One request per answer; each is a remote write. */
        if (!tx->congested || consumed != tx->asked_at) {
            __atomic_store_n(&tx->peer_ctl->credit_req, tx->head | 1, __ATOMIC_RELAXED);
            tx->congested = true;
            tx->asked_at = consumed;
        }
        return NULL;
    }
    tx->congested = false;
    if (tail_room < need) {
        /* The record would wrap: fill the end with a PAD record. */
        ring_tx_clear_slot(tx, tx->head + tail_room);
        ring_publish_fence(tx, 0);
        store_hdr(tx->ring + pos, ring_hdr_make(tail_room - RING_HDR, RING_PAD, tx->seq));
        tx->seq = ring_seq_next(tx->seq);
        tx->head += tail_room;
        pos = 0;
    }
    tx->resv = tx->ring + pos + RING_HDR;
    tx->resv_len = len;
    return tx->resv;
}

void ring_tx_zero_ahead(struct ring_tx *tx)
{
    /* Only lines the receiver released (below consumed + size) are free. */
    uint64_t end = tx->head + RING_ZERO_HIGH, cap = tx->limit + RING_SLACK;
    uint64_t at = tx->zeroed > tx->head ? tx->zeroed : tx->head;

    if (end > cap)
        end = cap;
    for (; at < end; at += 64)
        store_hdr(tx->ring + (at & (tx->size - 1)), 0);
    if (end > tx->zeroed)
        tx->zeroed = end;
}

void ring_tx_abort(struct ring_tx *tx)
{
    /* The caller may have written the reserved lines: past the header word
     * (never handed out) nothing is known to be zero any more. */
    if (tx->resv && tx->zeroed > tx->head + 64)
        tx->zeroed = tx->head + 64;
    tx->resv = NULL;
}

static uint64_t load_hdr(const uint8_t *at)
{
    return __atomic_load_n((const uint64_t *)(const void *)at, __ATOMIC_ACQUIRE);
}


/* Write our consumed index into the sender's window. Clear its request
 * first: a request raised after it sees this answer must survive. */
void ring_rx_report(struct ring_rx *rx)
{
    if (__atomic_load_n(&rx->my_ctl->credit_req, __ATOMIC_RELAXED))
        rx->answered = true;    /* the sender may sleep on it: ring */
    __atomic_store_n(&rx->my_ctl->credit_req, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&rx->peer_ctl->consumed, rx->released, __ATOMIC_RELEASE);
    rx->reported = rx->released;
}

int ring_rx_peek_slow(struct ring_rx *rx, const void **view, uint32_t *len,
                      enum ring_type *type)
{
    for (;;) {
        uint32_t pos = (uint32_t)(rx->parsed & (rx->size - 1));
        uint64_t h;

        /* Everything in the ring is parsed and held: the position ahead is
         * the oldest held record, and the sender has no credit to write. */
        if (rx->parsed - rx->released >= rx->size)
            return 0;
        h = load_hdr(rx->ring + pos);
        uint32_t l = (uint32_t)h;
        enum ring_type t = (enum ring_type)((h >> 32) & 0xff);

        if (!h)
            return 0;
        /* Anything else that is not the next record, or a record that would
         * run past the end of the ring, means the sender is broken. */
        if (!ring_hdr_fresh(h, rx->seq) || l > rx->size - pos - RING_HDR || t > RING_CTL ||
            (t == RING_PAD && l != rx->size - pos - RING_HDR))
            return TERN_EPROTO;
        rx->seq = ring_seq_next(rx->seq);
        if (t == RING_PAD) {
            rx->parsed += rx->size - pos;
            if (!rx->views)     /* nothing held before it: free it now */
                rx->released = rx->parsed;
            continue;
        }
        *view = rx->ring + pos + RING_HDR;
        *len = l;
        *type = t;
        rx->parsed += ring_rec_bytes(l);
        rx->views++;
        return 1;
    }
}

void ring_rx_unpeek(struct ring_rx *rx, uint32_t len)
{
    rx->parsed -= ring_rec_bytes(len);
    rx->seq = seq_prev(rx->seq);
    rx->views--;
}

/* Step over the record at `released`; returns its type. */
static enum ring_type free_record(struct ring_rx *rx)
{
    uint32_t pos = (uint32_t)(rx->released & (rx->size - 1));
    uint64_t h = load_hdr(rx->ring + pos);
    enum ring_type t = (enum ring_type)((h >> 32) & 0xff);
    uint32_t bytes = t == RING_PAD ? rx->size - pos : ring_rec_bytes((uint32_t)h);

    if (bytes > rx->parsed - rx->released)  /* a header rewritten since */
        bytes = (uint32_t)(rx->parsed - rx->released);
    if (bytes > rx->size - pos)
        bytes = rx->size - pos;
    rx->released += bytes;
    return t;
}

static bool pad_at(const struct ring_rx *rx, uint64_t at)
{
    uint64_t h = load_hdr(rx->ring + (at & (rx->size - 1)));

    return ((h >> 32) & 0xff) == RING_PAD;
}

void ring_rx_release_slow(struct ring_rx *rx)
{
    /* The fast half freed the oldest view; free the PAD records parsed
     * behind it while it was held. */
    while (rx->released < rx->parsed && pad_at(rx, rx->released))
        free_record(rx);
    if (rx->released - rx->reported >= rx->size / 4 ||
        __atomic_load_n(&rx->my_ctl->credit_req, __ATOMIC_RELAXED))
        ring_rx_report(rx);
}
