/* NTB link rules on the emulated device ("emu:NAME"): both sides open
 * channels, channels are reused, a silent peer is found dead by its
 * heartbeat and the link comes back when the peer returns, a side without a
 * listener refuses, a device partition has exactly two sides and each
 * partition is a link of its own. The conformance
 * suite runs the fabric contract over the same links. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "suites.h"

static void dev_name(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "emu:%s-%d", what, (int)getpid());
}

/* Wait for an event of `type` on `ep` while `other` (if any) makes progress. */
static struct tern_tp_event want(struct tern_tp_ep *ep, struct tern_tp_ep *other,
                                 enum tern_tp_event_type type, int ms)
{
    struct tern_tp_event ev;
    bool got = other ? tp_next2(ep, other, &ev, ms) : tp_next(ep, &ev, ms);

    ck_assert_msg(got, "no event (wanted type %d) within %d ms", type, ms);
    ck_assert_msg(ev.type == type, "event %d, wanted %d (status %s)", ev.type, type,
                  tern_err_name(ev.status));
    return ev;
}

/* Each side listens and connects: the side with the lower nonce opens odd
 * channels, the other even ones, and both streams work. */
START_TEST(both_sides_open_channels)
{
    struct tern_tp_ep *a = tp_open("ntb", 0), *b = tp_open("ntb", 0);
    struct tern_tp_conn *ca, *cb;
    struct tern_tp_event ev;
    char dev[64];

    dev_name(dev, sizeof(dev), "both");
    ck_assert_int_eq(tern_tp_listen(a, dev, NULL, 0), 0);
    ck_assert_int_eq(tern_tp_listen(b, dev, NULL, 0), 0);
    ck_assert_int_eq(tern_tp_connect(a, dev, &ca), 0);
    ck_assert_int_eq(tern_tp_connect(b, dev, &cb), 0);
    /* Each accepted end greets; each connecting side hears the other. */
    for (int setup = 0, heard = 0; setup < 4 || heard < 2;) {
        bool on_a = tp_next(a, &ev, 0);

        if (!on_a && !tp_next(b, &ev, 10))
            continue;
        ck_assert_int_eq(ev.status, 0);
        if (ev.type == TERN_TP_EV_RECV) {
            ck_assert_ptr_eq(ev.conn, on_a ? ca : cb);
            ck_assert_str_eq(ev.data, on_a ? "from-b" : "from-a");
            tern_tp_msg_release(ev.conn, ev.data);
            heard++;
            continue;
        }
        ck_assert_msg(ev.type == TERN_TP_EV_ACCEPTED || ev.type == TERN_TP_EV_CONNECTED,
                      "event %d", ev.type);
        if (ev.type == TERN_TP_EV_ACCEPTED)
            ck_assert_int_eq(tern_tp_msg_send(ev.conn, on_a ? "from-a" : "from-b", 7), 0);
        setup++;
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* More connections over time than a side has channels (255): closed
 * channels come back once both sides are done with them. */
START_TEST(channels_are_reused)
{
    struct tern_tp_ep *a = tp_open("ntb", 0), *b = tp_open("ntb", 0);
    struct tern_tp_event ev;
    char dev[64];

    dev_name(dev, sizeof(dev), "reuse");
    ck_assert_int_eq(tern_tp_listen(b, dev, NULL, 0), 0);
    for (unsigned i = 0; i < 700; i++) {
        struct tern_tp_conn *c, *s;
        unsigned v;

        ck_assert_int_eq(tern_tp_connect(a, dev, &c), 0);
        ev = want(a, b, TERN_TP_EV_CONNECTED, 5000);
        ck_assert_msg(ev.status == 0, "connection %u: %s", i, tern_err_name(ev.status));
        ev = want(b, a, TERN_TP_EV_ACCEPTED, 5000);
        s = ev.conn;
        ck_assert_int_eq(tern_tp_msg_send(c, &i, sizeof(i)), 0);
        ev = want(b, a, TERN_TP_EV_RECV, 5000);
        memcpy(&v, ev.data, sizeof(v));
        ck_assert_uint_eq(v, i);    /* nothing stale from a channel's last user */
        tern_tp_msg_release(ev.conn, ev.data);
        /* Close from alternating sides. */
        tern_tp_disconnect(i % 2 ? c : s);
        ev = want(i % 2 ? b : a, i % 2 ? a : b, TERN_TP_EV_CLOSED, 5000);
        tern_tp_disconnect(ev.conn);
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* A peer that stops beating is dead: its connections close. When it comes
 * back (a new process on the same side), the link comes up again. */
static void child_side(const char *dev)
{
    struct tern_tp_ep *ep = NULL;
    struct tern_tp_config cfg = {.fabric = "ntb"};
    struct tern_tp_conn *c;
    struct tern_tp_event ev = {0};

    if (tern_tp_open(&cfg, &ep) < 0 || tern_tp_connect(ep, dev, &c) < 0)
        _exit(2);
    for (;;) {     /* keep the link alive until killed */
        if (tern_tp_poll(ep, &ev, 1) == 1 && ev.type == TERN_TP_EV_CONNECTED && ev.status == 0)
            tern_tp_msg_send(c, "hi", 3);
        if (ev.type == TERN_TP_EV_RECV)
            tern_tp_msg_release(ev.conn, ev.data);
        ev.type = 0;
    }
}

/* Fork a child_side() and see its connection arrive and say "hi". */
static pid_t child_connected(struct tern_tp_ep *b, const char *dev)
{
    struct tern_tp_event ev;
    pid_t pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        child_side(dev);
    want(b, NULL, TERN_TP_EV_ACCEPTED, 5000);
    ev = want(b, NULL, TERN_TP_EV_RECV, 5000);
    ck_assert_str_eq(ev.data, "hi");
    tern_tp_msg_release(ev.conn, ev.data);
    return pid;
}

START_TEST(dead_peer_found_by_heartbeat)
{
    struct tern_tp_ep *b;
    struct tern_tp_event ev;
    char dev[64];
    double t0;

    setenv("TERN_NTB_DEAD_MS", "600", 1);
    b = tp_open("ntb", 0);
    dev_name(dev, sizeof(dev), "dead");
    ck_assert_int_eq(tern_tp_listen(b, dev, NULL, 0), 0);
    for (int round = 0; round < 2; round++) {
        pid_t pid = child_connected(b, dev);

        /* SIGSTOP: a peer that is still there but silent (its side stays
         * claimed, the link stays up) is declared dead by its heartbeat. */
        kill(pid, SIGSTOP);
        t0 = now_ms();
        ev = want(b, NULL, TERN_TP_EV_CLOSED, 5000);
        ck_assert_msg(now_ms() - t0 >= 500, "closed after %.0f ms, before the deadline",
                      now_ms() - t0);
        tern_tp_disconnect(ev.conn);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    tern_tp_close(b);
}
END_TEST

/* A peer whose process dies takes its side of the device with it: the link
 * is down at the next beat, long before the heartbeat deadline (a minute
 * here), and comes back up for the next process on that side. */
START_TEST(killed_peer_is_link_down)
{
    struct tern_tp_ep *b;
    struct tern_tp_event ev;
    char dev[64];

    setenv("TERN_NTB_DEAD_MS", "60000", 1);
    b = tp_open("ntb", 0);
    dev_name(dev, sizeof(dev), "down");
    ck_assert_int_eq(tern_tp_listen(b, dev, NULL, 0), 0);
    for (int round = 0; round < 2; round++) {
        pid_t pid = child_connected(b, dev);

        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        /* Without the link status this waits for the minute-long deadline. */
        ev = want(b, NULL, TERN_TP_EV_CLOSED, 10000);
        tern_tp_disconnect(ev.conn);
    }
    tern_tp_close(b);
}
END_TEST

/* A side that does not listen refuses the peer's channels. */
START_TEST(no_listener_refuses)
{
    struct tern_tp_ep *a = tp_open("ntb", 0), *b = tp_open("ntb", 0);
    struct tern_tp_conn *c, *keep;
    struct tern_tp_event ev;
    char dev[64];

    dev_name(dev, sizeof(dev), "refuse");
    /* b attaches by connecting (so it does not listen). */
    ck_assert_int_eq(tern_tp_listen(a, dev, NULL, 0), 0);
    ck_assert_int_eq(tern_tp_connect(b, dev, &keep), 0);
    want(b, a, TERN_TP_EV_CONNECTED, 5000);
    want(a, b, TERN_TP_EV_ACCEPTED, 5000);
    ck_assert_int_eq(tern_tp_connect(a, dev, &c), 0);
    ev = want(a, b, TERN_TP_EV_CONNECTED, 5000);
    ck_assert_ptr_eq(ev.conn, c);
    ev = want(a, b, TERN_TP_EV_CLOSED, 5000);
    ck_assert_ptr_eq(ev.conn, c);
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

/* Exactly two sides per device; a third endpoint is told so. */
START_TEST(third_endpoint_refused)
{
    struct tern_tp_ep *a = tp_open("ntb", 0), *b = tp_open("ntb", 0), *c = tp_open("ntb", 0);
    char dev[64];

    dev_name(dev, sizeof(dev), "three");
    ck_assert_int_eq(tern_tp_listen(a, dev, NULL, 0), 0);
    ck_assert_int_eq(tern_tp_listen(b, dev, NULL, 0), 0);
    ck_assert_int_eq(tern_tp_listen(c, dev, NULL, 0), TERN_EADDRINUSE);
    ck_assert_int_eq(tern_tp_listen(c, "emu:", NULL, 0), TERN_EBADADDR);
    ck_assert_int_eq(tern_tp_listen(c, "emu:../x", NULL, 0), TERN_EBADADDR);
    ck_assert_int_eq(tern_tp_listen(c, "pci-somewhere", NULL, 0), TERN_EBADADDR);
    /* Partitions are 0-7, written in decimal after one slash. */
    {
        const char *bad[] = {"/8", "/", "/x", "/1x", "/-1", "/ 1", "/1/2"};

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            char addr[96];

            snprintf(addr, sizeof(addr), "%s%s", dev, bad[i]);
            ck_assert_msg(tern_tp_listen(c, addr, NULL, 0) == TERN_EBADADDR, "%s accepted",
                          addr);
        }
    }
    tern_tp_close(a);
    tern_tp_close(b);
    tern_tp_close(c);
}
END_TEST

/* Each partition of a device is a link of its own, for one endpoint (one
 * core) a side: pairs on partitions 0 and 5 carry their own connections, a
 * third endpoint is refused on a taken partition and not on a free one,
 * and one pair going away leaves the other running. */
static void expect_msg(struct tern_tp_ep *ep, struct tern_tp_ep *other, const char *text)
{
    struct tern_tp_event ev = want(ep, other, TERN_TP_EV_RECV, 5000);

    ck_assert_str_eq(ev.data, text);
    tern_tp_msg_release(ev.conn, ev.data);
}

START_TEST(partitions_are_independent)
{
    struct tern_tp_ep *a0 = tp_open("ntb", 0), *b0 = tp_open("ntb", 0);
    struct tern_tp_ep *a5 = tp_open("ntb", 0), *b5 = tp_open("ntb", 0), *x = tp_open("ntb", 0);
    struct tern_tp_conn *c0, *c5;
    struct tern_tp_event ev;
    char dev[64], p0[80], p5[80], p6[80];

    dev_name(dev, sizeof(dev), "parts");
    snprintf(p0, sizeof(p0), "%s/0", dev);
    snprintf(p5, sizeof(p5), "%s/5", dev);
    snprintf(p6, sizeof(p6), "%s/6", dev);
    ck_assert_int_eq(tern_tp_listen(b0, dev, NULL, 0), 0);   /* no suffix: partition 0 */
    ck_assert_int_eq(tern_tp_listen(b5, p5, NULL, 0), 0);
    ck_assert_int_eq(tern_tp_connect(a0, p0, &c0), 0);
    ck_assert_int_eq(tern_tp_connect(a5, p5, &c5), 0);
    ck_assert_int_eq(want(a0, b0, TERN_TP_EV_CONNECTED, 5000).status, 0);
    ck_assert_int_eq(want(b0, a0, TERN_TP_EV_ACCEPTED, 5000).status, 0);
    ck_assert_int_eq(want(a5, b5, TERN_TP_EV_CONNECTED, 5000).status, 0);
    ck_assert_int_eq(want(b5, a5, TERN_TP_EV_ACCEPTED, 5000).status, 0);
    ck_assert_int_eq(tern_tp_msg_send(c0, "zero", 5), 0);
    ck_assert_int_eq(tern_tp_msg_send(c5, "five", 5), 0);
    expect_msg(b5, a5, "five");
    expect_msg(b0, a0, "zero");

    ck_assert_int_eq(tern_tp_listen(x, p5, NULL, 0), TERN_EADDRINUSE);
    ck_assert_int_eq(tern_tp_listen(x, p6, NULL, 0), 0);
    tern_tp_close(x);

    /* Partition 5's listener leaves: its peer's connection closes, and
     * partition 0 goes on. */
    tern_tp_close(b5);
    ev = want(a5, NULL, TERN_TP_EV_CLOSED, 5000);
    ck_assert_ptr_eq(ev.conn, c5);
    ck_assert_int_eq(tern_tp_msg_send(c0, "again", 6), 0);
    expect_msg(b0, a0, "again");
    tern_tp_close(a5);
    tern_tp_close(a0);
    tern_tp_close(b0);
}
END_TEST

/* A device file that is not a tern NTB device (wrong size, or another
 * header) is refused with TERN_EPROTO, and left as it was. */
START_TEST(foreign_device_file_refused)
{
    struct tern_tp_ep *a = tp_open("ntb", 0), *b = tp_open("ntb", 0);
    char dev[64], path[96];
    struct stat st;
    int fd;

    dev_name(dev, sizeof(dev), "foreign");
    snprintf(path, sizeof(path), "/dev/shm/tern-ntb.%s", dev + 4);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "not a device", 12), 12);
    ck_assert_int_eq(tern_tp_listen(a, dev, NULL, 0), TERN_EPROTO);
    ck_assert_int_eq(stat(path, &st), 0);     /* still there, untouched */
    ck_assert_int_eq(st.st_size, 12);
    close(fd);
    unlink(path);

    /* The right size, but someone scribbled on the header. */
    ck_assert_int_eq(tern_tp_listen(a, dev, NULL, 0), 0);
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, "XXXX", 4, 0), 4);
    close(fd);
    ck_assert_int_eq(tern_tp_listen(b, dev, NULL, 0), TERN_EPROTO);
    ck_assert_int_eq(stat(path, &st), 0);
    tern_tp_close(a);
    tern_tp_close(b);
    unlink(path);
}
END_TEST

/* An empty message posted before the link is up waits in the stage and
 * leaves as a fragment; it has a reservation, and arrives as an empty
 * message with a view, as one sent later does (neither the stage nor the
 * reassembly buffer was ever allocated for it: NULL for both, and
 * arithmetic on NULL on the way). */
START_TEST(empty_message_before_link_up)
{
    struct tern_tp_ep *a = tp_open("ntb", 0), *b = tp_open("ntb", 0);
    struct tern_tp_conn *ca;
    struct tern_tp_event ev;
    char dev[64];
    void *buf;
    bool got = false;
    double t0;

    dev_name(dev, sizeof(dev), "empty");
    ck_assert_int_eq(tern_tp_listen(b, dev, NULL, 0), 0);
    ck_assert_int_eq(tern_tp_connect(a, dev, &ca), 0);
    ck_assert_int_eq(tern_tp_msg_alloc(ca, 0, &buf), 0);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(tern_tp_msg_post(ca, buf, 0), 0);
    for (t0 = now_ms(); !got;) {
        ck_assert_msg(now_ms() - t0 < 10000, "the empty message never came");
        if (!tp_next2(b, a, &ev, 10) || ev.type != TERN_TP_EV_RECV)
            continue;
        ck_assert_uint_eq(ev.len, 0);
        ck_assert_ptr_nonnull(ev.data);
        tern_tp_msg_release(ev.conn, ev.data);
        got = true;
    }
    tern_tp_close(a);
    tern_tp_close(b);
}
END_TEST

Suite *suite_ntb_link(void)
{
    Suite *s = suite_create("ntb_link");
    TCase *tc = tcase_create("emulated");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, both_sides_open_channels);
    tcase_add_test(tc, channels_are_reused);
    tcase_add_test(tc, dead_peer_found_by_heartbeat);
    tcase_add_test(tc, killed_peer_is_link_down);
    tcase_add_test(tc, no_listener_refuses);
    tcase_add_test(tc, third_endpoint_refused);
    tcase_add_test(tc, partitions_are_independent);
    tcase_add_test(tc, foreign_device_file_refused);
    tcase_add_test(tc, empty_message_before_link_up);
    suite_add_tcase(s, tc);
    return s;
}
