/* The ring protocol on plain memory: two windows, one per side, as the shm
 * and NTB fabrics will map them. Single-process tests drive both sides by
 * turns; the cross-process test runs them concurrently over shared memory. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "ring/ring.h"
#include "suites.h"

struct link {
    struct ring_geometry g;
    uint8_t *win_a, *win_b;      /* a reads win_a (b writes it), and back */
    struct ring_tx tx;           /* a -> b */
    struct ring_rx rx;           /* b receives */
};

static void link_open(struct link *l, uint32_t n_chan, uint32_t ring_bytes, uint32_t chan)
{
    size_t sz;

    l->g = (struct ring_geometry){.n_chan = n_chan, .ring_bytes = ring_bytes};
    sz = ring_window_size(&l->g);
    ck_assert_uint_gt(sz, 0);
    l->win_a = calloc(1, sz);
    l->win_b = calloc(1, sz);
    ck_assert(l->win_a && l->win_b);
    ring_tx_init(&l->tx, l->win_a, l->win_b, &l->g, chan);
    ring_rx_init(&l->rx, l->win_b, l->win_a, &l->g, chan);
}

static void link_close(struct link *l)
{
    free(l->win_a);
    free(l->win_b);
}

static void fill(uint8_t *p, uint32_t len, uint32_t seed)
{
    for (uint32_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seed * 131u + i);
}

static int check(const uint8_t *p, uint32_t len, uint32_t seed)
{
    for (uint32_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(seed * 131u + i))
            return 0;
    return 1;
}

static bool send_msg(struct ring_tx *tx, uint32_t len, uint32_t seed)
{
    uint8_t *p = ring_tx_reserve(tx, len);

    if (!p)
        return false;
    ck_assert_uint_eq((uintptr_t)p % 8, 0);
    fill(p, len, seed);
    ring_tx_publish(tx, len, RING_MSG);
    return true;
}

static void expect_msg(struct ring_rx *rx, uint32_t len, uint32_t seed)
{
    const void *v;
    uint32_t l;
    enum ring_type t;

    ck_assert_int_eq(ring_rx_peek(rx, &v, &l, &t), 1);
    ck_assert_int_eq(t, RING_MSG);
    ck_assert_uint_eq(l, len);
    ck_assert_uint_eq((uintptr_t)v % 8, 0);
    ck_assert_msg(check(v, l, seed), "payload %u corrupted", seed);
    ring_rx_release(rx);
}

START_TEST(geometry)
{
    struct ring_geometry g = {.n_chan = 4, .ring_bytes = 4096};

    ck_assert_uint_eq(ring_window_size(&g), 4 * (64 + 4096));
    g.ring_bytes = 4095;
    ck_assert_uint_eq(ring_window_size(&g), 0);
    g.ring_bytes = 2048;
    ck_assert_uint_eq(ring_window_size(&g), 0);
    g = (struct ring_geometry){.n_chan = 0, .ring_bytes = 4096};
    ck_assert_uint_eq(ring_window_size(&g), 0);
}
END_TEST

START_TEST(one_message)
{
    struct link l;
    const void *v;
    uint32_t len;
    enum ring_type t;

    link_open(&l, 2, 4096, 1);
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 0);
    ck_assert(send_msg(&l.tx, 100, 7));
    expect_msg(&l.rx, 100, 7);
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 0);
    /* Channel 0 saw nothing: channels are separate rings. */
    ck_assert_uint_eq(*(uint64_t *)ring_data_of(l.win_b, &l.g, 0), 0);
    link_close(&l);
}
END_TEST

START_TEST(record_size_limits)
{
    struct link l;
    uint32_t max;

    link_open(&l, 1, 4096, 0);
    max = ring_max_record(4096);
    ck_assert_ptr_null(ring_tx_reserve(&l.tx, max + 1));
    ck_assert(send_msg(&l.tx, max, 1));
    ck_assert(send_msg(&l.tx, 0, 2));
    expect_msg(&l.rx, max, 1);
    expect_msg(&l.rx, 0, 2);
    /* One reservation at a time. */
    ck_assert_ptr_nonnull(ring_tx_reserve(&l.tx, 8));
    ck_assert_ptr_null(ring_tx_reserve(&l.tx, 8));
    ring_tx_abort(&l.tx);
    ck_assert(send_msg(&l.tx, 8, 3));
    expect_msg(&l.rx, 8, 3);
    link_close(&l);
}
END_TEST

/* Thousands of records of every size through a small ring: every lap wraps
 * with a PAD somewhere, and released lines must come back with clear heads. */
START_TEST(wrap_around)
{
    struct link l;
    uint32_t sent = 0, got = 0, max;

    link_open(&l, 1, 4096, 0);
    max = ring_max_record(4096);
    srand(5);
    while (got < 20000) {
        uint32_t len = (uint32_t)rand() % (max + 1);

        if (sent < 20000 && send_msg(&l.tx, len, sent)) {
            sent++;
            continue;
        }
        /* Ring full (or all sent): drain one, reproducing the length. */
        {
            const void *v;
            uint32_t n;
            enum ring_type t;

            ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &n, &t), 1);
            ck_assert_msg(check(v, n, got), "record %u corrupted", got);
            ring_rx_release(&l.rx);
            ring_rx_credit(&l.rx);
            got++;
        }
    }
    ck_assert_uint_eq(l.tx.head, l.rx.released);
    link_close(&l);
}
END_TEST

/* The receiver writes nothing into its ring, so last lap's payload is still
 * there when it polls a position inside it. Here that payload holds, at
 * every line, exactly the header the receiver will expect there next lap:
 * it must still see nothing until the sender really publishes (the sender
 * zeroes the header slot after each record it publishes). */
START_TEST(stale_payload_is_never_a_header)
{
    struct link l;
    const void *v;
    uint32_t len, seq0;
    enum ring_type t;

    link_open(&l, 1, 4096, 0);
    /* Lap 1: three 1 KiB records (seqs 1-3) over [0, 3072). Lap 2: one-line
     * records from 3072 to the end (16 of them, no PAD), then from 0, where
     * the record at line k has seq 1 + 3 + 16 + k. */
    seq0 = 1 + 3 + 16;
    for (uint32_t r = 0; r < 3; r++) {
        uint8_t *p = ring_tx_reserve(&l.tx, 1024 - RING_HDR);

        ck_assert_ptr_nonnull(p);
        for (uint32_t k = 0; k < 16; k++) {
            uint32_t line = r * 16 + k;
            uint64_t forged = ring_hdr_make(56, RING_MSG, seq0 + line);

            if (k)      /* line 0 of each record is its own header */
                memcpy(p - RING_HDR + 64 * k, &forged, sizeof(forged));
        }
        ring_tx_publish(&l.tx, 1024 - RING_HDR, RING_MSG);
    }
    for (uint32_t r = 0; r < 3; r++) {
        ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 1);
        ring_rx_release(&l.rx);
    }
    ring_rx_report(&l.rx);
    /* Lap 2, one record at a time; before each, the receiver looks. */
    for (uint32_t i = 0; i < 16 + 48; i++) {
        ck_assert_msg(ring_rx_peek(&l.rx, &v, &len, &t) == 0,
                      "record %u: stale bytes read as a header", i);
        ck_assert(send_msg(&l.tx, 56, i));
        expect_msg(&l.rx, 56, i);
        ring_rx_report(&l.rx);
    }
    link_close(&l);
}
END_TEST

/* A record larger than the zeroed stretch the sender keeps ahead ends on a
 * line it has not zeroed yet: the sender clears that slot before it
 * publishes. Last lap's payload holds, on that line, the very header the
 * receiver expects there. (Single-threaded, the refill after the header
 * store would hide a missing clear; the clear itself is checked first.) */
START_TEST(large_record_clears_its_next_slot)
{
    enum { RB = 64 * 1024, BIG = 16 * 1024 };
    struct link l;
    const void *v;
    uint32_t len;
    enum ring_type t;
    uint64_t forged = ring_hdr_make(56, RING_MSG, 6);

    link_open(&l, 1, RB, 0);
    /* Lap 1: three 16 KiB records (seqs 1-3) over [0, 48 KiB); the first
     * holds the forged header at ring offset 8 KiB. */
    for (uint32_t r = 0; r < 3; r++) {
        uint8_t *p = ring_tx_reserve(&l.tx, BIG - RING_HDR);

        ck_assert_ptr_nonnull(p);
        memset(p, 0x5a, BIG - RING_HDR);
        if (r == 0)
            memcpy(p - RING_HDR + 8192, &forged, sizeof(forged));
        ring_tx_publish(&l.tx, BIG - RING_HDR, RING_MSG);
    }
    for (uint32_t r = 0; r < 3; r++) {
        ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 1);
        ring_rx_release(&l.rx);
    }
    ring_rx_report(&l.rx);
    /* The clear: a slot past the zeroed stretch is zeroed, one inside it
     * is left alone (it is zero already). */
    {
        uint8_t *ring = ring_data_of(l.win_b, &l.g, 0);
        uint64_t zeroed = l.tx.zeroed, word;

        ck_assert_uint_lt(zeroed, l.tx.head + 3 * BIG + 8192);
        ring_tx_clear_slot(&l.tx, 3 * BIG + BIG + 8192);
        memcpy(&word, ring + 8192, sizeof(word));
        ck_assert_uint_eq(word, 0);
        ck_assert_uint_eq(l.tx.zeroed, 3 * BIG + BIG + 8192 + 64);
        memcpy(ring + 8192, &forged, sizeof(forged));
        l.tx.zeroed = zeroed;
    }
    /* Lap 2: a 16 KiB record to the end of the ring (seq 4), then an 8 KiB
     * one at 0 (seq 5), whose next slot is offset 8 KiB (seq 6 expected). */
    ck_assert(send_msg(&l.tx, BIG - RING_HDR, 4));
    expect_msg(&l.rx, BIG - RING_HDR, 4);
    ck_assert(send_msg(&l.tx, 8192 - RING_HDR, 5));
    expect_msg(&l.rx, 8192 - RING_HDR, 5);
    ck_assert_msg(ring_rx_peek(&l.rx, &v, &len, &t) == 0, "stale bytes read as a header");
    ck_assert(send_msg(&l.tx, 56, 6));
    expect_msg(&l.rx, 56, 6);
    link_close(&l);
}
END_TEST

/* A reservation written to and then aborted, or posted shorter than
 * reserved, leaves payload on lines the sender had zeroed: the next records
 * must still end on clean slots. The payload holds the headers the receiver
 * will expect there. */
START_TEST(dirty_reservations_are_not_zeroed_ring)
{
    struct link l;
    const void *v;
    uint32_t len;
    enum ring_type t;

    link_open(&l, 1, 4096, 0);
    for (int round = 0; round < 2; round++) {
        uint32_t seq = l.tx.seq;
        uint8_t *p = ring_tx_reserve(&l.tx, 1000);

        ck_assert_ptr_nonnull(p);
        /* At line k of the reservation, the header of the k-th record to
         * come (each one line long, the first at the reservation's start). */
        for (uint32_t k = 1; k < 16; k++) {
            uint64_t forged = ring_hdr_make(56, RING_MSG, seq + k);

            memcpy(p - RING_HDR + 64 * k, &forged, sizeof(forged));
        }
        if (round == 0)
            ring_tx_abort(&l.tx);
        else
            ring_tx_publish(&l.tx, 40, RING_MSG);   /* one line of 1000 */
        if (round == 1) {
            ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 1);
            ring_rx_release(&l.rx);
        }
        for (uint32_t k = 0; k < 8; k++) {
            /* The receiver looks before each record is sent. */
            ck_assert_msg(ring_rx_peek(&l.rx, &v, &len, &t) == 0,
                          "round %d record %u: stale bytes read as a header", round, k);
            ck_assert(send_msg(&l.tx, 56, k));
            expect_msg(&l.rx, 56, k);
        }
        ring_rx_report(&l.rx);
    }
    link_close(&l);
}
END_TEST

/* A sender out of credit raises the congestion flag; the receiver answers
 * at once instead of waiting for a quarter ring of releases. */
START_TEST(full_ring_and_credit_request)
{
    struct link l;
    uint32_t n = 0;

    link_open(&l, 1, 4096, 0);
    while (send_msg(&l.tx, 56, n))
        n++;
    ck_assert_uint_eq(n, 4096 / 64 - 1);     /* one line of slack */
    ck_assert(l.tx.congested);
    ck_assert_uint_ne(ring_ctl_of(l.win_b, &l.g, 0)->credit_req, 0);
    /* Releasing one record (far less than a quarter ring) answers it. */
    expect_msg(&l.rx, 56, 0);
    ck_assert_uint_eq(ring_ctl_of(l.win_b, &l.g, 0)->credit_req, 0);
    ck_assert_uint_eq(ring_tx_room(&l.tx), 64);
    link_close(&l);

    /* Without a request, credit comes back lazily: after a quarter ring. */
    link_open(&l, 1, 4096, 0);
    for (uint32_t i = 0; i < 16; i++)
        ck_assert(send_msg(&l.tx, 56, i));
    for (uint32_t i = 0; i < 15; i++)
        expect_msg(&l.rx, 56, i);
    ck_assert_uint_eq(ring_tx_room(&l.tx), 4096 - RING_SLACK - 16 * 64);
    expect_msg(&l.rx, 56, 15);
    ck_assert_uint_eq(ring_tx_room(&l.tx), 4096 - RING_SLACK);
    link_close(&l);
}
END_TEST

/* ring_rx_credit answers a request raised while nothing new was released. */
START_TEST(credit_without_release)
{
    struct link l;
    const void *v[64];
    uint32_t len;
    enum ring_type t;
    uint32_t n = 0;

    link_open(&l, 1, 4096, 0);
    while (send_msg(&l.tx, 56, n))
        n++;
    for (uint32_t i = 0; i < n; i++)
        ck_assert_int_eq(ring_rx_peek(&l.rx, &v[i], &len, &t), 1);
    /* The first release answers the sender's request; two more go
     * unreported (below a quarter ring, nobody asking). */
    for (uint32_t i = 0; i < 3; i++)
        ring_rx_release(&l.rx);
    ck_assert_uint_eq(ring_tx_room(&l.tx), 64);
    ck_assert(send_msg(&l.tx, 56, n++));
    /* The sender runs dry again and asks; the receiver releases nothing
     * new, but its poll loop answers with the two unreported records. */
    ck_assert_ptr_null(ring_tx_reserve(&l.tx, 56));
    ring_rx_credit(&l.rx);
    ck_assert_uint_eq(ring_tx_room(&l.tx), 128);
    ck_assert(send_msg(&l.tx, 56, n));
    link_close(&l);
}
END_TEST

/* Views stay intact while held, even while the sender keeps writing. */
START_TEST(held_views)
{
    struct link l;
    const void *v[8];
    uint32_t len[8];
    enum ring_type t;

    link_open(&l, 1, 4096, 0);
    for (uint32_t i = 0; i < 8; i++)
        ck_assert(send_msg(&l.tx, 200, i));
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_int_eq(ring_rx_peek(&l.rx, &v[i], &len[i], &t), 1);
    /* The sender cannot overwrite held records: no credit for them. */
    while (send_msg(&l.tx, 200, 99))
        ;
    for (uint32_t i = 0; i < 8; i++) {
        ck_assert_msg(check(v[i], len[i], i), "view %u overwritten", i);
        ring_rx_release(&l.rx);
    }
    link_close(&l);
}
END_TEST

/* A ring full of held views (all but the slack line): the position ahead
 * holds nothing new, and the sender has no credit until one is released. */
START_TEST(full_ring_of_held_views)
{
    struct link l;
    const void *v;
    uint32_t len, n = 0, m = 0;
    enum ring_type t;

    link_open(&l, 1, 4096, 0);
    /* Three 1 KiB records, then one-line records up to the slack line. */
    while (send_msg(&l.tx, 1024 - 8, n))
        n++;
    ck_assert_uint_eq(n, 3);
    while (send_msg(&l.tx, 56, n + m))
        m++;
    ck_assert_uint_eq(3 * 1024 + m * 64, 4096 - RING_SLACK);
    for (uint32_t i = 0; i < n + m; i++)
        ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 1);
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 0);
    ring_rx_release(&l.rx);
    ring_rx_credit(&l.rx);
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 0);
    ck_assert(send_msg(&l.tx, 56, 99));
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), 1);
    ck_assert(check(v, len, 99));
    link_close(&l);
}
END_TEST

START_TEST(many_channels)
{
    enum { NC = 2000, NM = 3 };
    struct ring_geometry g = {.n_chan = NC, .ring_bytes = 4096};
    size_t sz = ring_window_size(&g);
    uint8_t *wa = calloc(1, sz), *wb = calloc(1, sz);
    static struct ring_tx tx[NC];
    static struct ring_rx rx[NC];

    ck_assert(wa && wb);
    for (uint32_t c = 0; c < NC; c++) {
        ring_tx_init(&tx[c], wa, wb, &g, c);
        ring_rx_init(&rx[c], wb, wa, &g, c);
    }
    for (uint32_t m = 0; m < NM; m++)
        for (uint32_t c = 0; c < NC; c++)
            ck_assert(send_msg(&tx[c], 16 + c % 100, c * NM + m));
    for (uint32_t c = NC; c-- > 0;)
        for (uint32_t m = 0; m < NM; m++)
            expect_msg(&rx[c], 16 + c % 100, c * NM + m);
    free(wa);
    free(wb);
}
END_TEST

START_TEST(corrupt_header_detected)
{
    struct link l;
    const void *v;
    uint32_t len;
    enum ring_type t;

    link_open(&l, 1, 4096, 0);
    /* A header claiming more than the ring holds. */
    *(uint64_t *)ring_data_of(l.win_b, &l.g, 0) = (1ull << 40) | (1ull << 32) | 100000;
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), TERN_EPROTO);
    /* A header with the wrong sequence number. */
    *(uint64_t *)ring_data_of(l.win_b, &l.g, 0) = (5ull << 40) | (1ull << 32) | 8;
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &len, &t), TERN_EPROTO);
    link_close(&l);
}
END_TEST

/* Producer and consumer in two processes over shared memory: the payload
 * must be visible before the header that publishes it. */
/* A sender may rewrite a header after the receiver checked it. Releasing
 * that record must still free only what was parsed, and never write past
 * the end of the ring (into the next channel), also when the parsed span
 * wraps (a record at the end, a PAD, a record at the start). */
START_TEST(rewritten_header_stays_in_the_ring)
{
    struct link l;
    uint8_t *next_ring;
    const void *v1, *v2;
    uint32_t n1, n2, max;
    enum ring_type t;

    link_open(&l, 2, 4096, 0);
    next_ring = ring_data_of(l.win_b, &l.g, 1);
    memset(next_ring, 0xee, 4096);
    max = ring_max_record(4096);
    /* Move both ends near the end of the ring. */
    for (unsigned i = 0; i < 4; i++) {
        const void *v;
        uint32_t n;

        ck_assert(send_msg(&l.tx, max - 64, i));
        ck_assert_int_eq(ring_rx_peek(&l.rx, &v, &n, &t), 1);
        ring_rx_release(&l.rx);
        ring_rx_credit(&l.rx);
    }
    /* A record in the last lines, then one that wraps (PAD, start). */
    ck_assert(send_msg(&l.tx, 56, 7));
    ck_assert(send_msg(&l.tx, 200, 8));
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v1, &n1, &t), 1);
    ck_assert_int_eq(ring_rx_peek(&l.rx, &v2, &n2, &t), 1);
    ck_assert((const uint8_t *)v2 < (const uint8_t *)v1);  /* the second view is at the start */
    /* The sender scribbles a huge length over the first header. */
    *(volatile uint64_t *)((uint8_t *)v1 - RING_HDR) |= 0xfffff000u;
    ring_rx_release(&l.rx);
    ring_rx_release(&l.rx);
    for (unsigned i = 0; i < 4096; i++)
        ck_assert_msg(next_ring[i] == 0xee, "byte %u of the next channel's ring written", i);
    link_close(&l);
}
END_TEST

START_TEST(cross_process_ordering)
{
    enum { N = 300000 };
    struct ring_geometry g = {.n_chan = 1, .ring_bytes = 16384};
    size_t sz = ring_window_size(&g);
    uint8_t *wa = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint8_t *wb = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct ring_rx rx;
    pid_t pid;
    int status;

    ck_assert(wa != MAP_FAILED && wb != MAP_FAILED);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct ring_tx tx;

        ring_tx_init(&tx, wa, wb, &g, 0);
        for (uint32_t i = 0; i < N; i++) {
            uint32_t len = 8 + (i % 61) * 8;
            uint32_t *p;

            while (!(p = ring_tx_reserve(&tx, len)))
                ;
            for (uint32_t w = 0; w < len / 4; w++)
                p[w] = i;
            ring_tx_publish(&tx, len, RING_MSG);
        }
        _exit(0);
    }
    ring_rx_init(&rx, wb, wa, &g, 0);
    /* Plain comparisons in the loop: each passing ck_assert costs Check a
     * write() to its parent, which would dominate the test. */
    for (uint32_t i = 0; i < N; i++) {
        const uint32_t *p;
        uint32_t len, bad = 0;
        enum ring_type t;
        int rc;

        while ((rc = ring_rx_peek(&rx, (const void **)&p, &len, &t)) == 0)
            ring_rx_credit(&rx);
        if (rc != 1 || len != 8 + (i % 61) * 8)
            ck_abort_msg("message %u: rc %d len %u", i, rc, len);
        for (uint32_t w = 0; w < len / 4; w++)
            bad |= p[w] ^ i;
        if (bad)
            ck_abort_msg("message %u seen before its payload", i);
        ring_rx_release(&rx);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    munmap(wa, sz);
    munmap(wb, sz);
}
END_TEST

Suite *suite_ring(void)
{
    Suite *s = suite_create("ring");
    TCase *tc = tcase_create("protocol");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, geometry);
    tcase_add_test(tc, one_message);
    tcase_add_test(tc, record_size_limits);
    tcase_add_test(tc, wrap_around);
    tcase_add_test(tc, stale_payload_is_never_a_header);
    tcase_add_test(tc, large_record_clears_its_next_slot);
    tcase_add_test(tc, dirty_reservations_are_not_zeroed_ring);
    tcase_add_test(tc, full_ring_and_credit_request);
    tcase_add_test(tc, credit_without_release);
    tcase_add_test(tc, held_views);
    tcase_add_test(tc, full_ring_of_held_views);
    tcase_add_test(tc, many_channels);
    tcase_add_test(tc, corrupt_header_detected);
    tcase_add_test(tc, rewritten_header_stays_in_the_ring);
    tcase_add_test(tc, cross_process_ordering);
    suite_add_tcase(s, tc);
    return s;
}
