/* See resp_harness.h. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "resp_harness.h"
#include "resp_parse.h"


char dir[64];
char pool_path[128];
char coll_path[128];
struct kvs *store;
struct kvc *coll;
struct resp_gw *gw;
long cmds_run;       /* commands the gateway reported running */

/* ---- store and gateway ---- */

void store_open(void)
{
    struct kvs_opts o = {.path = pool_path, .pool_size = POOL_SIZE,
                                   .seg_size = SEG_SIZE};
    int rc = kvs_open(&o, &store);

    ck_assert_msg(rc == 0, "store open: %s", tern_strerror(rc));
}

/* A fresh pool of other sizes, and the gateway on it. */
void store_recreate(uint64_t pool_size, uint32_t seg_size)
{
    struct kvs_opts o = {.path = pool_path, .pool_size = pool_size,
                                   .seg_size = seg_size};
    int rc;

    if (gw)
        resp_gw_destroy(gw);
    gw = NULL;
    kvs_close(store);
    unlink(pool_path);
    rc = kvs_open(&o, &store);
    ck_assert_msg(rc == 0, "store open: %s", tern_strerror(rc));
    rc = resp_gw_create(store, NULL, &gw);
    ck_assert_msg(rc == 0, "gateway: %s", tern_strerror(rc));
}

/* The collection engine on its own pool beside the store's. */
void coll_open(void)
{
    struct kvc_opts o = {.path = coll_path, .pool_size = POOL_SIZE, .seg_size = SEG_SIZE};
    int rc = kvc_open(&o, &coll);

    ck_assert_msg(rc == 0, "collections open: %s", tern_strerror(rc));
}

/* Every gateway gets the collection engine unless the test gave one. */
void gw_open(const struct resp_config *cfg)
{
    struct resp_config c = cfg ? *cfg : (struct resp_config){0};
    int rc;

    if (!c.collections)
        c.collections = coll;
    rc = resp_gw_create(store, &c, &gw);

    ck_assert_msg(rc == 0, "gateway: %s", tern_strerror(rc));
    ck_assert_uint_ne(resp_gw_port(gw), 0);
}

void gw_close(void)
{
    resp_gw_destroy(gw);
    gw = NULL;
}

void setup(void)
{
    test_pool_dir(dir, sizeof(dir), "resp");
    snprintf(pool_path, sizeof(pool_path), "%s/pool", dir);
    snprintf(coll_path, sizeof(coll_path), "%s/coll.pool", dir);
    store_open();
    coll_open();
    gw_open(NULL);
    cmds_run = 0;
    resp_sync_fn = kvs_sync;
}

void teardown(void)
{
    if (gw)
        gw_close();
    if (store)
        kvs_close(store);
    store = NULL;
    kvc_close(coll);
    coll = NULL;
    unlink(pool_path);
    unlink(coll_path);
    rmdir(dir);
}

/* Serve for up to 10 ms; with no gateway here (it runs in a child), just
 * wait a little. */
void pump(void)
{
    int rc;

    if (!gw) {
        usleep(1000);
        return;
    }
    rc = resp_gw_poll(gw, 10);
    ck_assert_msg(rc >= 0, "poll: %s", tern_strerror(rc));
    cmds_run += rc;
}

/* ---- a client ---- */


struct conn *conn_open_port(uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct conn *c = calloc(1, sizeof(*c));

    ck_assert_ptr_nonnull(c);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(c->fd, 0);
    /* The listener's backlog completes the handshake before any accept. */
    ck_assert_int_eq(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    c->cap = 4096;
    c->buf = malloc(c->cap);
    ck_assert_ptr_nonnull(c->buf);
    return c;
}

struct conn *conn_open(void)
{
    return conn_open_port(resp_gw_port(gw));
}

void conn_close(struct conn *c)
{
    close(c->fd);
    free(c->buf);
    free(c);
}

/* Take in whatever has arrived, without waiting. */
void conn_drain(struct conn *c)
{
    for (;;) {
        ssize_t n;

        if (c->cap - c->len < 4096) {
            c->cap *= 2;
            c->buf = realloc(c->buf, c->cap);
            ck_assert_ptr_nonnull(c->buf);
        }
        n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
        if (n > 0) {
            c->len += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            c->eof = true;
        return;
    }
}

void conn_send(struct conn *c, const void *data, size_t len)
{
    const char *p = data;
    double end = now_ms() + WAIT_MS;

    while (len) {
        ssize_t n = send(c->fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            c->eof = true;      /* closed on us: the tests look at the reply */
            return;
        }
        ck_assert_msg(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
                      "send: %s", strerror(errno));
        ck_assert_msg(now_ms() < end, "send timed out");
        pump();
        conn_drain(c);
    }
}

void conn_sends(struct conn *c, const char *s)
{
    conn_send(c, s, strlen(s));
}

/* A command as a multibulk from `argc` strings with their lengths. */
void conn_cmdv(struct conn *c, int argc, const char *const *argv, const size_t *lens)
{
    /* One send for the whole command: in pieces, Nagle's algorithm holds
     * the rest back until the gateway's delayed ACK, 40 ms a command. */
    size_t cap = 32, n;
    char *buf;

    for (int i = 0; i < argc; i++)
        cap += lens[i] + 32;
    buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    n = (size_t)snprintf(buf, cap, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "$%zu\r\n", lens[i]);
        memcpy(buf + n, argv[i], lens[i]);
        memcpy(buf + n + lens[i], "\r\n", 2);
        n += lens[i] + 2;
    }
    conn_send(c, buf, n);
    free(buf);
}

/* The same from NUL-terminated strings, up to a NULL. */
void conn_cmd(struct conn *c, ...)
{
    const char *argv[16];
    size_t lens[16];
    int argc = 0;
    va_list ap;

    va_start(ap, c);
    for (const char *s; (s = va_arg(ap, const char *)) && argc < 16; argc++) {
        argv[argc] = s;
        lens[argc] = strlen(s);
    }
    va_end(ap);
    conn_cmdv(c, argc, argv, lens);
}


/* Until `want` bytes are in, or the peer closes, or time runs out. */
void conn_wait(struct conn *c, size_t want)
{
    double end = now_ms() + WAIT_MS;

    conn_drain(c);
    while (c->len < want && !c->eof && now_ms() < end) {
        pump();
        conn_drain(c);
    }
}

void conn_consume(struct conn *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

/* Printable text of up to 200 bytes, for failure messages. */
const char *show(const char *p, size_t n)
{
    static char out[2][1024];
    static int which;
    char *o = out[which ^= 1];
    size_t k = 0;

    for (size_t i = 0; i < n && i < 200 && k < sizeof(out[0]) - 8; i++) {
        unsigned char ch = (unsigned char)p[i];

        if (ch == '\r')
            k += (size_t)sprintf(o + k, "\\r");
        else if (ch == '\n')
            k += (size_t)sprintf(o + k, "\\n");
        else if (ch < 0x20 || ch >= 0x7f)
            k += (size_t)sprintf(o + k, "\\x%02x", ch);
        else
            o[k++] = (char)ch;
    }
    o[k] = '\0';
    return o;
}

/* The next bytes from the gateway must be exactly `want` (len bytes). */
void expect_n(struct conn *c, const char *want, size_t len)
{
    conn_wait(c, len);
    ck_assert_msg(c->len >= len && memcmp(c->buf, want, len) == 0,
                  "got \"%s\", want \"%s\"", show(c->buf, c->len), show(want, len));
    conn_consume(c, len);
}

void expect(struct conn *c, const char *want)
{
    expect_n(c, want, strlen(want));
}

/* The next reply must begin with `prefix` (up to its CRLF). */
void expect_prefix(struct conn *c, const char *prefix)
{
    double end = now_ms() + WAIT_MS;
    char *nl;

    conn_drain(c);
    while (!(nl = memchr(c->buf, '\n', c->len)) && !c->eof && now_ms() < end) {
        pump();
        conn_drain(c);
    }
    ck_assert_msg(nl && c->len >= strlen(prefix) && memcmp(c->buf, prefix, strlen(prefix)) == 0,
                  "got \"%s\", want a line starting \"%s\"", show(c->buf, c->len), prefix);
    conn_consume(c, (size_t)(nl - c->buf) + 1);
}

/* Bytes of the complete reply at b, 0 if it is not all there. */
size_t reply_size(const char *b, size_t n)
{
    const char *nl = n ? memchr(b, '\n', n) : NULL;
    size_t line, at;
    long long k;

    if (!nl)
        return 0;
    line = (size_t)(nl - b) + 1;
    switch (b[0]) {
    case '+':
    case '-':
    case ':':
        return line;
    case '$':
        k = atoll(b + 1);
        if (k < 0)
            return line;
        return n >= line + (size_t)k + 2 ? line + (size_t)k + 2 : 0;
    case '*':
        k = atoll(b + 1);
        at = line;
        for (long long i = 0; i < k; i++) {
            size_t s = reply_size(b + at, n - at);

            if (!s)
                return 0;
            at += s;
        }
        return at;
    default:
        ck_abort_msg("not a RESP reply: \"%s\"", show(b, n));
        return 0;
    }
}

/* The next whole reply, NUL-terminated (free it). */
char *next_reply(struct conn *c, size_t *len)
{
    double end = now_ms() + WAIT_MS;
    size_t n;
    char *r;

    conn_drain(c);
    while (!(n = reply_size(c->buf, c->len)) && !c->eof && now_ms() < end) {
        pump();
        conn_drain(c);
    }
    ck_assert_msg(n > 0, "no complete reply: \"%s\"", show(c->buf, c->len));
    r = malloc(n + 1);
    ck_assert_ptr_nonnull(r);
    memcpy(r, c->buf, n);
    r[n] = '\0';
    conn_consume(c, n);
    if (len)
        *len = n;
    return r;
}

/* True once the gateway has closed the connection (anything it sent before
 * stays in the buffer). */
bool conn_closed(struct conn *c)
{
    double end = now_ms() + WAIT_MS;

    conn_drain(c);
    while (!c->eof && now_ms() < end) {
        pump();
        conn_drain(c);
    }
    return c->eof;
}

/* A number from INFO's text, e.g. "tern_coalesced_waits". */
unsigned long long info_number(struct conn *c, const char *section, const char *field)
{
    char *r, *at;
    unsigned long long v;

    CMD(c, "INFO", section);
    r = next_reply(c, NULL);
    at = strstr(r, field);
    ck_assert_msg(at && at[strlen(field)] == ':', "INFO %s has no %s: %s", section, field,
                  show(r, strlen(r)));
    v = strtoull(at + strlen(field) + 1, NULL, 10);
    free(r);
    return v;
}

