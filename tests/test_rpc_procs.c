/* RPC across processes: the server runs in a forked child (spawn_rpc_server)
 * and the test process is the client, so tern_call_sync() works as it would
 * in an application. These tests cover what one process cannot: timeouts
 * against a busy server, a server killed mid-call, many client processes at
 * once, hostile clients, and a server that sleeps when idle.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "rpc.h"
#include "rpc_util.h"
#include "tern_config.h"
#include "rpc_internal.h"
#include "suites.h"
#include "tcp/tcp_wire.h"
#include "wire.h"

#define SVC 11
#define SEC 1000000000ull
#define MS 1000000ull
#define SLOW_US 300000

enum { M_ECHO = 1, M_SLOW = 2, M_COUNT = 3, M_COUNT_DROP = 4 };

/* How often the server ran each request (by the sequence number in it). */
static uint32_t runs_of[1 << 16];

/* ---- the server's side (runs in the child) ---- */

static int p_echo(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, len);

    if (!out)
        return TERN_ENOMEM;
    if (len)
        memcpy(out, data, len);
    return 0;
}

/* Busy for 300 ms: the whole server is, since handlers run to completion. */
static int p_slow(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out;

    usleep(SLOW_US);
    out = tern_reply_alloc(req, 4);
    if (!out)
        return TERN_ENOMEM;
    memcpy(out, "slow", 4);
    return 0;
}

/* Counts the runs of request `seq` and answers with that count: a call run
 * twice answers 2. */
static int p_count(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    uint32_t seq, *out;

    if (len != sizeof(seq))
        return TERN_EINVAL;
    memcpy(&seq, data, sizeof(seq));
    out = tern_reply_alloc(req, sizeof(*out));
    if (!out)
        return TERN_ENOMEM;
    *out = ++runs_of[seq & 0xffff];
    return 0;
}

/* The same, then its connection dies with the reply unsent (test hook). */
static int p_count_drop(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    rpc_test_drop(req);
    return p_count(req, data, len, ctx);
}

static const struct tern_method methods[] = {
    {.id = M_ECHO, .name = "echo", .handler = p_echo},
    {.id = M_SLOW, .name = "slow", .handler = p_slow},
    {.id = M_COUNT, .name = "count", .handler = p_count},
    {.id = M_COUNT_DROP, .name = "count_drop", .handler = p_count_drop},
};

static const struct tern_service service = {
    .name = "procs", .id = SVC, .methods = methods,
    .n_methods = sizeof(methods) / sizeof(methods[0]),
};

static void setup_service(struct tern_rpc_ep *ep)
{
    if (tern_rpc_register(ep, &service) < 0)
        _exit(6);
}

/* ---- the client's side ---- */

/* The server of the current test (the harness kills it on any exit, so a
 * failed assertion does not leave it running). */
static pid_t server_pid;
static char uri[128];

/* The service, plus a shm listener that HELLO_ACK advertises (auto://). */
static void setup_service_and_shm(struct tern_rpc_ep *ep)
{
    setup_service(ep);
    if (tern_rpc_listen(ep, "shm://auto", NULL, 0) < 0)
        _exit(6);
}

/* The service, plus a listener on an emulated NTB device (auto://). */
static char ntb_dev[64];

static void setup_service_and_ntb(struct tern_rpc_ep *ep)
{
    setup_service(ep);
    if (tern_rpc_listen(ep, ntb_dev, NULL, 0) < 0)
        _exit(6);
}

static void start_server_at(const struct tern_rpc_config *cfg, const char *listen_uri)
{
    server_pid = spawn_rpc_server_at(setup_service, cfg, listen_uri, uri, sizeof(uri));
    ck_assert_int_gt(server_pid, 0);
}

static void start_server(const struct tern_rpc_config *cfg)
{
    start_server_at(cfg, "tcp://127.0.0.1:0");
}

/* A server on TCP that also listens where `setup` says, and the auto://
 * URI to it. */
static void start_auto_server_with(void (*setup)(struct tern_rpc_ep *), char *auto_uri,
                                   size_t len)
{
    server_pid = spawn_rpc_server_at(setup, NULL, "tcp://127.0.0.1:0", uri, sizeof(uri));
    ck_assert_int_gt(server_pid, 0);
    snprintf(auto_uri, len, "auto://%s", uri + strlen("tcp://"));
}

/* ... that also listens on shm. */
static void start_auto_server(char *auto_uri, size_t len)
{
    start_auto_server_with(setup_service_and_shm, auto_uri, len);
}

/* SIGTERM: the server must stop and exit cleanly. */
static void finish_server(void)
{
    pid_t pid = server_pid;

    server_pid = 0;
    ck_assert_msg(stop_server(pid) == 0, "server did not exit cleanly");
}

/* A client endpoint and a session of it to the server. */
static struct tern_rpc_ep *client_open(const struct tern_rpc_config *cfg,
                                       struct tern_session **s)
{
    struct tern_rpc_ep *ep = test_rpc_ep(cfg);

    *s = test_rpc_connect(ep, uri);
    return ep;
}

/* One echo round trip of `len` bytes; false on any mismatch. Usable in
 * forked clients, so it reports instead of asserting. */
static int echo_once(struct tern_session *s, uint8_t *req, uint8_t *rep, size_t len,
                     unsigned seed)
{
    size_t got = 0;
    int rc;

    for (size_t j = 0; j < len; j++)
        req[j] = (uint8_t)(seed * 131 + j * 7);
    rc = tern_call_sync(s, SVC, M_ECHO, req, len, rep, len, &got, 0);
    if (rc < 0)
        return rc;
    if (got != len || (len && memcmp(req, rep, len) != 0))
        return TERN_EPROTO;
    return 0;
}

static void assert_echo(struct tern_session *s, size_t len)
{
    uint8_t *req = malloc(len + 1), *rep = malloc(len + 1);
    int rc;

    ck_assert(req && rep);
    rc = echo_once(s, req, rep, len, (unsigned)len);
    ck_assert_msg(rc == 0, "echo of %zu bytes: %s", len, tern_err_name(rc));
    free(req);
    free(rep);
}

/* What a continuation saw, and when. */
struct rec {
    int runs;
    int status;
    double at_ms;
};

static void rec_cont(void *arg, int status, const void *reply, size_t len)
{
    struct rec *r = arg;

    r->runs++;
    r->status = status;
    r->at_ms = now_ms();
}

/* A plain socket to the server's port (uri is "tcp://127.0.0.1:PORT"). */
static int raw_connect(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 5};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_port = htons((uint16_t)atoi(strrchr(uri, ':') + 1));
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* True if the server hung up on fd (EOF or reset) within the receive
 * timeout, skipping anything it sent first. */
static bool server_hung_up(int fd)
{
    uint8_t b[4096];

    for (;;) {
        ssize_t n = recv(fd, b, sizeof(b), 0);

        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return true;
        if (n < 0)
            return false;   /* timed out: still open */
    }
}

/* xorshift64*: fixed seeds, the same garbage every run. */
/* ---- tests ---- */

START_TEST(sync_echo)
{
    static const size_t sizes[] = {0, 1, 24, 1000, 65536, 1u << 20};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    uint8_t small[8];
    size_t got = 99;
    int rc;

    start_server_at(NULL, test_fabric_listen(_i));
    ep = client_open(NULL, &s);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        assert_echo(s, sizes[i]);
    /* A reply larger than the caller's buffer is reported, not truncated
     * silently. */
    rc = tern_call_sync(s, SVC, M_ECHO, "0123456789", 10, small, sizeof(small), &got, 0);
    ck_assert_msg(rc == TERN_EMSGSIZE, "reply over reply_cap: %s", tern_err_name(rc));
    ck_assert_uint_eq(got, 0);
    /* Errors travel too. */
    rc = tern_call_sync(s, SVC, 99, NULL, 0, NULL, 0, NULL, 0);
    ck_assert_int_eq(rc, TERN_ENOMETHOD);
    rc = tern_call_sync(s, SVC + 1, M_ECHO, NULL, 0, NULL, 0, NULL, 0);
    ck_assert_int_eq(rc, TERN_ENOSERVICE);
    assert_echo(s, 3);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

START_TEST(deadline_on_slow_server)
{
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    struct rec r = {0};
    double t0, el;
    int rc;

    start_server(NULL);
    ep = client_open(NULL, &s);

    t0 = now_ms();
    rc = tern_call(s, SVC, M_SLOW, NULL, 0, 50 * MS, rec_cont, &r, NULL);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(test_rpc_poll_until(ep, &r.runs, 1, 5000), "the timed call never completed");
    el = r.at_ms - t0;
    ck_assert_msg(r.status == TERN_ETIMEDOUT, "got %s", tern_err_name(r.status));
    /* Generous bounds: not a speed test, but 300 ms would mean the call
     * waited for the reply instead of its deadline. */
    ck_assert_msg(el >= 45 && el <= 250, "timed out after %.1f ms, want 50", el);

    /* The same through the synchronous wrapper. */
    t0 = now_ms();
    rc = tern_call_sync(s, SVC, M_SLOW, NULL, 0, NULL, 0, NULL, 50 * MS);
    el = now_ms() - t0;
    ck_assert_msg(rc == TERN_ETIMEDOUT, "sync: got %s", tern_err_name(rc));
    ck_assert_msg(el >= 45 && el <= 250, "sync timed out after %.1f ms", el);

    /* The late replies are dropped, the continuation does not run again,
     * and the session serves the next call. */
    assert_echo(s, 100);
    test_rpc_poll_for(ep, 50);
    ck_assert_int_eq(r.runs, 1);
    ck_assert_int_eq(tern_session_status(s), 0);
    ck_assert_uint_eq(tern_rpc_calls_in_flight(ep), 0);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

START_TEST(slow_call_within_deadline)
{
    /* The other side of the bound: a deadline longer than the work is met. */
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    char rep[8];
    size_t got = 0;
    int rc;

    start_server(NULL);
    ep = client_open(NULL, &s);
    rc = tern_call_sync(s, SVC, M_SLOW, NULL, 0, rep, sizeof(rep), &got, 5 * SEC);
    ck_assert_msg(rc == 0, "slow call with a 5 s deadline: %s", tern_err_name(rc));
    ck_assert_uint_eq(got, 4);
    ck_assert_mem_eq(rep, "slow", 4);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

START_TEST(server_killed_mid_call)
{
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    struct rec r = {0}, late = {0};
    double t_kill, el;
    int rc, wstatus;
    pid_t pid;

    start_server_at(NULL, test_fabric_listen(_i));
    ep = client_open(NULL, &s);
    assert_echo(s, 8);

    rc = tern_call(s, SVC, M_SLOW, NULL, 0, 10 * SEC, rec_cont, &r, NULL);
    ck_assert_int_eq(rc, 0);
    test_rpc_poll_for(ep, 50);   /* the server is inside the slow handler now */
    ck_assert_int_eq(r.runs, 0);

    pid = server_pid;
    t_kill = now_ms();
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, &wstatus, 0), pid);
    server_pid = 0;
    ck_assert(WIFSIGNALED(wstatus));

    ck_assert_msg(test_rpc_poll_until(ep, &r.runs, 1, 9000), "the call outlived its server");
    el = r.at_ms - t_kill;
    ck_assert_msg(r.status < 0 && r.status != TERN_ETIMEDOUT,
                  "call to a dead server ended with %s", tern_err_name(r.status));
    ck_assert_msg(el < 2000, "the loss was noticed after %.0f ms", el);
    ck_assert_msg(tern_session_status(s) < 0, "session still reported usable");

    rc = tern_call(s, SVC, M_ECHO, "x", 1, 0, rec_cont, &late, NULL);
    ck_assert_msg(rc < 0, "tern_call on a dead session returned %d", rc);
    test_rpc_poll_for(ep, 20);
    ck_assert_int_eq(late.runs, 0);
    ck_assert_int_eq(r.runs, 1);
    tern_rpc_close(ep);
}
END_TEST

START_TEST(server_killed_calls_queued)
{
    /* Calls waiting for credits fail too when the server dies. */
    enum { N = 40 };
    struct tern_rpc_config ccfg = {.credits = 4};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    struct rec r[N];
    int done = 0;

    start_server(NULL);
    ep = client_open(&ccfg, &s);
    memset(r, 0, sizeof(r));
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(tern_call(s, SVC, M_SLOW, NULL, 0, 0, rec_cont, &r[i], NULL), 0);
    test_rpc_poll_for(ep, 50);
    test_child_kill(&server_pid);
    for (double end = now_ms() + 5000; now_ms() < end && done < N;) {
        tern_rpc_poll(ep);
        done = 0;
        for (int i = 0; i < N; i++)
            done += r[i].runs;
    }
    ck_assert_int_eq(done, N);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(r[i].runs == 1, "call %d ran %d times", i, r[i].runs);
        ck_assert_msg(r[i].status < 0, "call %d: %s", i, tern_err_name(r[i].status));
    }
    ck_assert_uint_eq(tern_rpc_calls_in_flight(ep), 0);
    tern_rpc_close(ep);
}
END_TEST

/* One client process: its own endpoint and session, `calls` echoes with
 * payloads that differ per client and per call. Exit code 0 = all good. */
static int client_main(int id, int calls)
{
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    uint8_t req[1024], rep[1024];

    if (tern_rpc_open(NULL, &ep) < 0)
        return 10;
    if (tern_rpc_connect(ep, uri, 5 * SEC, &s) < 0)
        return 11;
    for (int i = 0; i < calls; i++) {
        size_t len = 1 + (size_t)(i * 37 + id) % sizeof(req);
        int rc = echo_once(s, req, rep, len, (unsigned)(id * 100000 + i));

        if (rc < 0) {
            fprintf(stderr, "client %d call %d: %s\n", id, i, tern_err_name(rc));
            return 12;
        }
    }
    tern_rpc_close(ep);
    return 0;
}

#define CLIENT_CALLS 2000

static int client_proc(void *arg)
{
    return client_main((int)(intptr_t)arg, CLIENT_CALLS);
}

START_TEST(many_client_processes)
{
    enum { CLIENTS = 4 };
    pid_t kids[CLIENTS];

    start_server(NULL);
    for (int i = 0; i < CLIENTS; i++)
        kids[i] = test_fork(client_proc, (void *)(intptr_t)i);
    for (int i = 0; i < CLIENTS; i++) {
        int code = test_child_wait(&kids[i]);

        ck_assert_msg(code == 0, "client %d exited with %d (-1: killed)", i, code);
    }
    finish_server();
}
END_TEST

START_TEST(garbage_client_does_not_stop_server)
{
    static uint8_t junk[65536];
    struct tern_session *s, *s2;
    struct tern_rpc_ep *ep, *ep2;
    int fd;

    start_server(NULL);
    ep = client_open(NULL, &s);
    fd = raw_connect();
    test_rng_seed(0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(test_rng() >> 56);
    junk[0] = (uint8_t)~(TCP_MAGIC & 0xff);    /* never a valid frame header */
    /* The server may hang up before it has read it all. */
    (void)!send(fd, junk, sizeof(junk), MSG_NOSIGNAL);

    for (int i = 0; i < 100; i++)
        assert_echo(s, (size_t)i * 10);
    ck_assert_msg(server_hung_up(fd), "the server kept a garbage connection open");
    close(fd);
    /* A client arriving afterwards is served too. */
    ep2 = client_open(NULL, &s2);
    assert_echo(s2, 77);
    assert_echo(s, 78);
    tern_rpc_close(ep2);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

START_TEST(rpc_garbage_in_valid_frames)
{
    /* Well-formed TCP frames whose contents are random RPC messages: the
     * garbage gets past the transport and reaches the RPC layer. */
    struct tern_session *s;
    struct tern_rpc_ep *ep;

    start_server(NULL);
    ep = client_open(NULL, &s);
    test_rng_seed(12345);
    for (int round = 0; round < 20; round++) {
        uint8_t buf[TCP_FRAME_LEN(256)] = {0};  /* zero padding included */
        int fd = raw_connect();
        size_t len = (size_t)(test_rng() % 200);
        struct tcp_hdr h = {.magic = TCP_MAGIC, .version = TCP_VERSION, .type = TCP_MSG,
                            .len = (uint32_t)len};

        memcpy(buf, &h, sizeof(h));
        for (size_t j = 0; j < len; j++)
            buf[sizeof(h) + j] = (uint8_t)(test_rng() >> 56);
        if (round % 2 && len >= sizeof(struct rpc_hdr)) {
            /* A plausible header with a random type: deeper into the parser. */
            buf[sizeof(h)] = (uint8_t)(1 + test_rng() % 5);
            buf[sizeof(h) + 1] = RPC_VERSION;
        }
        (void)!send(fd, buf, TCP_FRAME_LEN(len), MSG_NOSIGNAL);
        assert_echo(s, (size_t)round);
        ck_assert_msg(server_hung_up(fd), "round %d: garbage session left open", round);
        close(fd);
    }
    assert_echo(s, 4096);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

START_TEST(half_frame_does_not_block_others)
{
    /* A client that announces a 1 MiB message and sends a few bytes of it
     * must not hold up anyone else: the server waits for the rest without
     * blocking. */
    struct tcp_hdr h = {.magic = TCP_MAGIC, .version = TCP_VERSION, .type = TCP_MSG,
                        .len = 1u << 20};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    int fd;

    start_server(NULL);
    ep = client_open(NULL, &s);
    fd = raw_connect();
    ck_assert_int_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    ck_assert_int_eq(send(fd, "partial", 7, MSG_NOSIGNAL), 7);
    for (int i = 0; i < 50; i++)
        assert_echo(s, 64);
    close(fd);
    assert_echo(s, 65);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

/* ---- in process: a reply that found the send path full ---- */

#define BIG (64u * 1024)

static unsigned big_runs;

static int p_big(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    void *out = tern_reply_alloc(req, BIG);

    if (!out)
        return TERN_ENOMEM;
    memset(out, 'b', BIG);
    big_runs++;
    return 0;
}

/* One RPC message in a TCP frame on a plain socket. */
static void raw_rpc(int fd, const struct rpc_hdr *h, const void *body, size_t len)
{
    uint8_t buf[TCP_FRAME_LEN(sizeof(*h) + sizeof(struct rpc_hello))] = {0};
    struct tcp_hdr th = {.magic = TCP_MAGIC, .version = TCP_VERSION, .type = TCP_MSG,
                         .len = (uint32_t)(sizeof(*h) + len)};

    memcpy(buf, &th, sizeof(th));
    memcpy(buf + sizeof(th), h, sizeof(*h));
    if (len)
        memcpy(buf + sizeof(th) + sizeof(*h), body, len);
    ck_assert_int_eq(send(fd, buf, TCP_FRAME_LEN(sizeof(*h) + len), MSG_NOSIGNAL),
                     (ssize_t)TCP_FRAME_LEN(sizeof(*h) + len));
}

/* A client that reads nothing makes a reply spill; the reply goes once the
 * send path drains (WRITABLE). The session never held a request back, so
 * it has no array of them: the writable path must not touch it (it moved
 * the held requests down with memmove from NULL + 0, undefined behaviour
 * that UBSan reports; the RPC fuzz target found it). In this process, so
 * that the test sees the server's session. */
START_TEST(reply_spills_with_nothing_held)
{
    static const struct tern_method m[] = {{.id = 1, .name = "big", .handler = p_big}};
    const struct tern_service svc = {.name = "big", .id = 12, .methods = m, .n_methods = 1};
    struct tern_rpc_config cfg = {.max_msg = BIG};
    struct rpc_hello hello = {.magic = RPC_MAGIC, .credits = 4096, .max_msg = BIG};
    struct rpc_hdr h = {.type = RPC_HELLO, .version = RPC_VERSION};
    struct tern_session *s = NULL;
    struct tern_rpc_ep *ep;
    size_t want, got = 0;
    uint8_t buf[65536];
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    unsigned n;
    int fd, small = 4096;
    double end;

    big_runs = 0;
    ck_assert_int_eq(tern_rpc_open(&cfg, &ep), 0);
    ck_assert_int_eq(tern_rpc_register(ep, &svc), 0);
    ck_assert_int_eq(tern_rpc_listen(ep, "tcp://127.0.0.1:0", uri, sizeof(uri)), 0);
    /* A small window, set before connecting: the server's send path fills
     * after a few replies. */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sa.sin_port = htons((uint16_t)atoi(strrchr(uri, ':') + 1));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    raw_rpc(fd, &h, &hello, sizeof(hello));
    for (end = now_ms() + 5000; !(s = ep->sessions) || s->state != SESS_OPEN;) {
        ck_assert_msg(now_ms() < end, "no session");
        tern_rpc_poll(ep);
    }
    /* One call at a time, until a reply spills: none is held back then. */
    h = (struct rpc_hdr){.type = RPC_REQ, .version = RPC_VERSION, .svc = 12, .method = 1};
    for (n = 0; n < 4096 && !s->spill_head; n++) {
        h.req_id = n;
        raw_rpc(fd, &h, NULL, 0);
        for (end = now_ms() + 5000; big_runs == n;) {
            ck_assert_msg(now_ms() < end, "call %u not served", n);
            tern_rpc_poll(ep);
        }
    }
    ck_assert_msg(s->spill_head, "no reply spilled after %u calls", n);
    ck_assert_uint_eq(s->n_deferred, 0);
    /* Read it all: the HELLO_ACK (no fabric advertised), then every reply. */
    want = TCP_FRAME_LEN(sizeof(h) + sizeof(hello) + 1) +
           n * TCP_FRAME_LEN(sizeof(h) + BIG);
    for (end = now_ms() + 30000; got < want;) {
        ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

        ck_assert_msg(now_ms() < end, "%zu of %zu reply bytes", got, want);
        if (r > 0)
            got += (size_t)r;
        tern_rpc_poll(ep);
    }
    ck_assert_uint_eq(got, want);
    ck_assert_ptr_null(s->spill_head);
    close(fd);
    tern_rpc_close(ep);
}
END_TEST

/* CPU seconds (user + system) the process has used, from /proc. */
static double cpu_seconds(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut, st;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    ck_assert_msg(f, "cannot read %s", path);
    ck_assert(fgets(buf, sizeof(buf), f));
    fclose(f);
    p = strrchr(buf, ')');      /* the command name may contain spaces */
    ck_assert(p);
    /* After ")": state ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime. */
    ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
                            &st), 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

START_TEST(adaptive_server)
{
    struct tern_rpc_config cfg = {.mode = TERN_TP_POLL_ADAPTIVE};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    double cpu0, cpu1;

    start_server(&cfg);
    ep = client_open(NULL, &s);
    for (int i = 0; i < 200; i++)
        assert_echo(s, (size_t)i);

    for (int round = 0; round < 3; round++) {
        double t0;

        usleep(200000);     /* idle: the server goes to sleep */
        t0 = now_ms();
        assert_echo(s, 100 + (size_t)round);
        /* Waking up costs at most a wait slice (10 ms), not the idle time. */
        ck_assert_msg(now_ms() - t0 < 150, "first call after idling took %.0f ms",
                      now_ms() - t0);
    }

    /* Idle, an adaptive server should sleep rather than spin: less than half
     * a CPU over half a second (a busy server uses all of one). */
    cpu0 = cpu_seconds(server_pid);
    usleep(500000);
    cpu1 = cpu_seconds(server_pid);
    ck_assert_msg(cpu1 - cpu0 < 0.25, "idle adaptive server used %.2f CPU s in 0.5 s",
                  cpu1 - cpu0);

    /* A fresh client after idling is served as well. */
    {
        struct tern_session *s2;
        struct tern_rpc_ep *ep2 = client_open(NULL, &s2);

        assert_echo(s2, 5);
        tern_rpc_close(ep2);
    }
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

START_TEST(adaptive_server_drops_silent_clients)
{
    /* Sockets that connect and never say HELLO are dropped after
     * hello_timeout_ns, also by an adaptive server that is otherwise idle
     * and sleeps between polls. Three rounds, one after the other: a check
     * that only comes around every few seconds cannot meet all of them. */
    struct tern_rpc_config cfg = {.mode = TERN_TP_POLL_ADAPTIVE, .hello_timeout_ns = 500000000ull};
    struct tern_session *s;
    struct tern_rpc_ep *ep;

    start_server(&cfg);
    for (int round = 0; round < 3; round++) {
        double t0 = now_ms(), el;
        int fd = raw_connect();
        bool gone = server_hung_up(fd);

        el = now_ms() - t0;
        close(fd);
        ck_assert_msg(gone, "round %d: a silent client still connected after %.0f ms "
                      "(hello_timeout_ns 500)", round, el);
        /* Generous: the timeout plus a second and a half of slack. */
        ck_assert_msg(el >= 450 && el < 2000, "round %d: a silent client was dropped after "
                      "%.0f ms, with hello_timeout_ns 500", round, el);
    }
    /* Clients that do say HELLO are served as usual. */
    ep = client_open(NULL, &s);
    assert_echo(s, 9);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

/* auto:// starts on TCP and moves to shm when the server has it, unless the
 * policy says otherwise; calls work on whatever was chosen. */
/* Poll until the session's handshake is done: its status then. */
static int until_open(struct tern_rpc_ep *ep, struct tern_session *s, int ms)
{
    double end = now_ms() + ms;
    int st;

    while ((st = tern_session_status(s)) == TERN_EINPROGRESS && now_ms() < end)
        tern_rpc_poll(ep);
    return st;
}

/* tern_rpc_connect_start returns at once; the handshake finishes in the
 * polls, a call made before it waits for it, and an auto:// session then
 * moves to shm. A listener that never answers (a stopped server, as the
 * kernel still accepts for it) costs the caller nothing and ends in
 * TERN_ETIMEDOUT; a refused one ends in its error. */
START_TEST(connect_start_does_not_wait)
{
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    char auto_uri[160], mute[64];
    uint8_t rep[16];
    size_t got = 0;
    double t0;
    int lfd, rc;

    start_auto_server(auto_uri, sizeof(auto_uri));
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect_start(ep, auto_uri, 5 * SEC, &s), 0);
    ck_assert_int_eq(tern_session_status(s), TERN_EINPROGRESS);
    rc = tern_call_sync(s, SVC, M_ECHO, "early", 5, rep, sizeof(rep), &got, 5 * SEC);
    ck_assert_msg(rc == 0, "a call made during the handshake: %s", tern_err_name(rc));
    ck_assert_int_eq(got, 5);
    ck_assert_int_eq(memcmp(rep, "early", 5), 0);
    ck_assert_int_eq(until_open(ep, s, 5000), 0);
    for (double end = now_ms() + 5000; strcmp(tern_session_fabric(s), "shm") != 0;) {
        tern_rpc_poll(ep);
        ck_assert_msg(now_ms() < end, "still on %s", tern_session_fabric(s));
    }
    assert_echo(s, 1000);
    tern_rpc_disconnect(s);

    /* A listener nobody serves: the handshake never completes. */
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(lfd, 0);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(mute, sizeof(mute), "auto://127.0.0.1:%d", ntohs(sa.sin_port));
    t0 = now_ms();
    ck_assert_int_eq(tern_rpc_connect_start(ep, mute, SEC / 2, &s), 0);
    ck_assert_msg(now_ms() - t0 < 250, "connect_start waited %.0f ms", now_ms() - t0);
    ck_assert_int_eq(until_open(ep, s, 5000), TERN_ETIMEDOUT);
    tern_rpc_disconnect(s);
    close(lfd);

    /* Refused: the error, once the poll sees it. */
    ck_assert_int_eq(tern_rpc_connect_start(ep, "tcp://127.0.0.1:1", SEC, &s), 0);
    rc = until_open(ep, s, 5000);
    ck_assert_msg(rc == TERN_ECONNREFUSED, "refused: %s", tern_err_name(rc));
    tern_rpc_disconnect(s);
    ck_assert_int_eq(tern_rpc_connect_start(ep, "nope://x", SEC, &s), TERN_ENOFABRIC);
    ck_assert_ptr_null(s);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

START_TEST(auto_picks_shm_on_same_host)
{
    struct tern_rpc_config tcp_only = {.fabrics = "tcp"};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    char auto_uri[160];
    int rc;

    start_auto_server(auto_uri, sizeof(auto_uri));

    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    rc = tern_rpc_connect(ep, auto_uri, 5 * SEC, &s);
    ck_assert_msg(rc == 0, "auto connect: %s", tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(s), "shm");
    assert_echo(s, 100);
    assert_echo(s, 300000);
    tern_rpc_close(ep);

    /* The policy keeps it on TCP. */
    ck_assert_int_eq(tern_rpc_open(&tcp_only, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect(ep, auto_uri, 5 * SEC, &s), 0);
    ck_assert_str_eq(tern_session_fabric(s), "tcp");
    assert_echo(s, 100);
    tern_rpc_close(ep);
    finish_server();

    /* A server without shm: auto stays on TCP. */
    start_server(NULL);
    snprintf(auto_uri, sizeof(auto_uri), "auto://%s", uri + strlen("tcp://"));
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect(ep, auto_uri, 5 * SEC, &s), 0);
    ck_assert_str_eq(tern_session_fabric(s), "tcp");
    assert_echo(s, 100);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

#if TERN_HAVE_RDMA
static void setup_service_and_rdma(struct tern_rpc_ep *ep)
{
    setup_service(ep);
    ck_assert_int_eq(tern_rpc_listen(ep, test_fabric_listen(test_fabric_row("rdma")), NULL, 0), 0);
}

/* The server advertises rdma only because it has a NIC (here softverbs);
 * auto:// takes it when this side can use it too and the policy says so. */
START_TEST(auto_takes_rdma_by_policy)
{
    struct tern_rpc_config rdma_first = {.fabrics = "rdma,tcp"};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    char auto_uri[160];
    int rc;

    start_auto_server_with(setup_service_and_rdma, auto_uri, sizeof(auto_uri));
    ck_assert_int_eq(tern_rpc_open(&rdma_first, &ep), 0);
    rc = tern_rpc_connect(ep, auto_uri, 5 * SEC, &s);
    ck_assert_msg(rc == 0, "auto connect: %s", tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(s), "rdma");
    assert_echo(s, 100);
    assert_echo(s, 300000);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST
#endif

/* An emulated NTB device on this host is a way in too: auto:// takes it
 * when the policy puts ntb first. */
START_TEST(auto_takes_ntb_by_policy)
{
    struct tern_rpc_config ntb_first = {.fabrics = "ntb,tcp"};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    char auto_uri[160];
    int rc;

    snprintf(ntb_dev, sizeof(ntb_dev), "%s", test_fabric_listen(test_fabric_row("ntb")));
    start_auto_server_with(setup_service_and_ntb, auto_uri, sizeof(auto_uri));
    ck_assert_int_eq(tern_rpc_open(&ntb_first, &ep), 0);
    rc = tern_rpc_connect(ep, auto_uri, 5 * SEC, &s);
    ck_assert_msg(rc == 0, "auto connect: %s", tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(s), "ntb");
    assert_echo(s, 100);
    assert_echo(s, 300000);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

struct counted {
    unsigned done, bad;
    int status;
};

static void count_cont(void *arg, int status, const void *reply, size_t len)
{
    struct counted *c = arg;
    uint32_t runs = 0;

    if (status == 0 && len == sizeof(runs))
        memcpy(&runs, reply, sizeof(runs));
    c->done++;
    if (status < 0 || runs != 1) {
        c->bad++;
        c->status = status < 0 ? status : (int)runs;
    }
}

/* An auto:// session on shm whose link dies under load, with one reply lost
 * in the break: it moves to TCP, no call is lost, and none runs twice (the
 * lost reply comes from the server's replay cache). */
START_TEST(failover_loses_no_call_and_runs_none_twice)
{
    enum { N = 3000, WINDOW = 16, DROP_AT = 1000 };
    static uint32_t seqs[N + 1];
    struct counted c = {0};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    char auto_uri[160];
    unsigned issued = 0;
    double t0;
    int rc;

    start_auto_server(auto_uri, sizeof(auto_uri));
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect(ep, auto_uri, 5 * SEC, &s), 0);
    ck_assert_str_eq(tern_session_fabric(s), "shm");
    t0 = now_ms();
    while (c.done < N + 1) {
        ck_assert_msg(now_ms() - t0 < 20000, "stuck at %u of %u calls", c.done, N + 1);
        while (issued <= N && issued - c.done < WINDOW) {
            uint16_t m = issued == DROP_AT ? M_COUNT_DROP : M_COUNT;

            seqs[issued] = issued;
            rc = tern_call(s, SVC, m, &seqs[issued], sizeof(uint32_t), 10 * SEC, count_cont, &c,
                           NULL);
            ck_assert_msg(rc == 0, "call %u: %s", issued, tern_strerror(rc));
            issued++;
        }
        tern_rpc_poll(ep);
    }
    ck_assert_msg(c.bad == 0, "%u calls failed or ran twice (last: %d)", c.bad, c.status);
    ck_assert_int_eq(tern_session_status(s), 0);
    /* On TCP, or back on shm already (paths_move_back_...). */
    ck_assert(strcmp(tern_session_fabric(s), "tcp") == 0 ||
              strcmp(tern_session_fabric(s), "shm") == 0);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

/* The session's paths, for the next test: calls go in a window of 16 with
 * sequence numbers from *next; the one numbered `drop` makes its
 * connection die with the reply unsent. Runs until `n` more calls are done
 * and until(s) holds (or 10 s pass: a failure). */
static uint32_t path_seqs[20000];

static void run_calls(struct tern_rpc_ep *ep, struct tern_session *s, struct counted *c,
                      unsigned *next, unsigned n, unsigned drop,
                      bool (*until)(struct tern_session *s), const char *what)
{
    unsigned issued = *next, end = *next + n, done0 = c->done;
    double t0 = now_ms();

    while (c->done - done0 < n || (until && !until(s))) {
        ck_assert_msg(now_ms() - t0 < 10000, "%s: stuck at %u of %u calls", what,
                      c->done - done0, n);
        while (issued - *next - (c->done - done0) < 16 && issued < end + 5000 &&
               (issued < end || (until && !until(s)))) {
            uint16_t m = issued == drop ? M_COUNT_DROP : M_COUNT;
            int rc;

            ck_assert_uint_lt(issued, sizeof(path_seqs) / sizeof(path_seqs[0]));
            path_seqs[issued] = issued;
            rc = tern_call(s, SVC, m, &path_seqs[issued], sizeof(uint32_t), 10 * SEC,
                           count_cont, c, NULL);
            ck_assert_msg(rc == 0, "%s: call %u: %s", what, issued, tern_strerror(rc));
            issued++;
        }
        tern_rpc_poll(ep);
    }
    while (c->done - done0 < issued - *next) {     /* the rest of the window */
        ck_assert_msg(now_ms() - t0 < 10000, "%s: the window never drained", what);
        tern_rpc_poll(ep);
    }
    *next = issued;
    ck_assert_msg(c->bad == 0, "%s: %u calls failed or ran twice (last: %d)", what, c->bad,
                  c->status);
}

static struct tern_session_info path_info(struct tern_session *s)
{
    struct tern_session_info i = {.size = sizeof(i)};

    ck_assert_int_eq(tern_session_info(s, &i), 0);
    return i;
}

static bool on_shm_with_standby(struct tern_session *s)
{
    struct tern_session_info i = path_info(s);

    return strcmp(i.fabric, "shm") == 0 && i.standby;
}

static bool on_tcp_with_standby(struct tern_session *s)
{
    struct tern_session_info i = path_info(s);

    return strcmp(i.fabric, "tcp") == 0 && i.standby;
}

/* After a failover the session moves back to shm when shm answers again,
 * fails over again, and once the TCP standby is used a new one is dialed,
 * so that a failure of the TCP path itself loses nothing either. No call is
 * lost or run twice through any of it. */
START_TEST(paths_move_back_and_fail_over_twice)
{
    struct counted c = {0};
    struct tern_session_info i;
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    char auto_uri[160];
    unsigned next = 0;

    memset(runs_of, 0, sizeof(runs_of));
    start_auto_server(auto_uri, sizeof(auto_uri));
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect_with(ep, auto_uri, "shm,tcp", 5 * SEC, &s), 0);
    i = path_info(s);
    ck_assert_str_eq(i.fabric, "shm");
    ck_assert(i.standby);

    /* shm dies: over to TCP; then back to shm (TCP waiting again). */
    run_calls(ep, s, &c, &next, 500, 100, NULL, "failover");
    i = path_info(s);
    ck_assert_uint_eq(i.failovers, 1);
    run_calls(ep, s, &c, &next, 200, UINT32_MAX, on_shm_with_standby, "back to shm");
    i = path_info(s);
    ck_assert_uint_eq(i.moves, 1);

    /* shm dies again: TCP again, and a new standby is dialed before shm's
     * backoff (400 ms now) is over. */
    run_calls(ep, s, &c, &next, 100, next + 50, on_tcp_with_standby, "second failover");
    i = path_info(s);
    ck_assert_uint_eq(i.failovers, 2);
    /* The TCP path itself dies: the new standby takes the session. */
    run_calls(ep, s, &c, &next, 100, next + 50, NULL, "TCP dies");
    i = path_info(s);
    ck_assert_uint_eq(i.failovers, 3);
    ck_assert_int_eq(tern_session_status(s), 0);
    /* And in time it is back on shm. */
    run_calls(ep, s, &c, &next, 100, UINT32_MAX, on_shm_with_standby, "back to shm again");
    i = path_info(s);
    ck_assert_uint_eq(i.errors, 0);
    ck_assert_uint_eq(i.calls, c.done);
    ck_assert_uint_ge(i.bytes_out, (uint64_t)c.done * 28);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

static bool on_tcp(struct tern_session *s)
{
    return strcmp(path_info(s).fabric, "tcp") == 0;
}

static bool on_ntb_with_standby(struct tern_session *s)
{
    struct tern_session_info i = path_info(s);

    return strcmp(i.fabric, "ntb") == 0 && i.standby;
}

/* The cable of an emulated NTB link is pulled under load: the session
 * moves to TCP within a second or so (a heartbeat finds the link down),
 * no call is lost or run twice, and it is back on NTB once the cable is. */
START_TEST(pulled_ntb_cable_fails_over_and_comes_back)
{
    struct counted c = {0};
    struct tern_session *s;
    struct tern_rpc_ep *ep;
    char auto_uri[160];
    unsigned next = 0;
    double t0, moved_ms;

    memset(runs_of, 0, sizeof(runs_of));
    /* A name of our own: the cable is pulled by its name. */
    snprintf(ntb_dev, sizeof(ntb_dev), "ntb://emu:pull-%d", (int)getpid());
    start_auto_server_with(setup_service_and_ntb, auto_uri, sizeof(auto_uri));
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(tern_rpc_connect_with(ep, auto_uri, "ntb,tcp", 5 * SEC, &s), 0);
    ck_assert_str_eq(tern_session_fabric(s), "ntb");
    run_calls(ep, s, &c, &next, 300, UINT32_MAX, NULL, "on ntb");

    ck_assert_int_eq(tern_tp_emu_cable(ntb_dev, false), 0);
    t0 = now_ms();
    run_calls(ep, s, &c, &next, 100, UINT32_MAX, on_tcp, "cable pulled");
    moved_ms = now_ms() - t0;
    ck_assert_msg(moved_ms < 1500, "took %.0f ms to leave the pulled cable", moved_ms);
    ck_assert_uint_eq(path_info(s).failovers, 1);
    /* While it is out, the session stays on TCP (the dials fail). */
    run_calls(ep, s, &c, &next, 2000, UINT32_MAX, NULL, "cable out");
    ck_assert_str_eq(tern_session_fabric(s), "tcp");

    ck_assert_int_eq(tern_tp_emu_cable(ntb_dev, true), 0);
    run_calls(ep, s, &c, &next, 100, UINT32_MAX, on_ntb_with_standby, "cable back");
    ck_assert_uint_eq(path_info(s).moves, 1);
    ck_assert_uint_eq(path_info(s).errors, 0);
    ck_assert_int_eq(tern_tp_emu_cable("ntb://emu:no-such-cable", false), TERN_ENOENT);
    ck_assert_int_eq(tern_tp_emu_cable("tcp://x:1", false), TERN_EBADADDR);
    tern_rpc_close(ep);
    finish_server();
}
END_TEST

Suite *suite_rpc_procs(void)
{
    Suite *s = suite_create("rpc_procs");
    TCase *tc = tcase_create("procs");

    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, sync_echo, 0, test_fabric_count());
    tcase_add_test(tc, deadline_on_slow_server);
    tcase_add_test(tc, slow_call_within_deadline);
    tcase_add_loop_test(tc, server_killed_mid_call, 0, test_fabric_count());
    tcase_add_test(tc, auto_picks_shm_on_same_host);
    tcase_add_test(tc, connect_start_does_not_wait);
    tcase_add_test(tc, auto_takes_ntb_by_policy);
#if TERN_HAVE_RDMA
    tcase_add_test(tc, auto_takes_rdma_by_policy);
#endif
    tcase_add_test(tc, failover_loses_no_call_and_runs_none_twice);
    tcase_add_test(tc, paths_move_back_and_fail_over_twice);
    tcase_add_test(tc, pulled_ntb_cable_fails_over_and_comes_back);
    tcase_add_test(tc, server_killed_calls_queued);
    tcase_add_test(tc, many_client_processes);
    tcase_add_test(tc, garbage_client_does_not_stop_server);
    tcase_add_test(tc, rpc_garbage_in_valid_frames);
    tcase_add_test(tc, half_frame_does_not_block_others);
    tcase_add_test(tc, reply_spills_with_nothing_held);
    tcase_add_test(tc, adaptive_server);
    tcase_add_test(tc, adaptive_server_drops_silent_clients);
    suite_add_tcase(s, tc);
    return s;
}
