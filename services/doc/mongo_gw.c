/* The MongoDB wire gateway: see mongo_gw.h.
 *
 * One level-triggered epoll set holds the listener and every client, as in
 * the RESP gateway (services/kv/resp.c), whose structure this follows. A
 * poll reads each ready client once and runs every complete message in its
 * input buffer, appending the replies to its output buffer. Only when all
 * ready clients are done is the server synced, once for the whole batch
 * and only if a command wrote, and only then are the replies sent.
 *
 * If that sync fails, each client has recorded where in its output the
 * replies of its writing commands of the batch lie ("write marks"); those
 * spans are swapped for doc_cmd_sync_failed's reply before anything is
 * sent. Replies to reads stay as they were.
 *
 * A message is parsed in place: the command and its document sequences
 * are views of the client's input buffer, which does not move while they
 * run. Every reply is built in one bson_t the gateway keeps (its buffer is
 * reused, so a steady load allocates nothing) and copied once, framed,
 * into the client's output.
 *
 * An awaitable hello that waits (mongo_gw.h) leaves nothing in the output:
 * its reply is built when it goes, each poll finding whether the topology
 * counter moved or its time is up (release_awaits). Its connection is
 * watched for EPOLLRDHUP only, so that a client gone is seen while its
 * pipelined input, if any, stays unread.
 */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "mongo_gw.h"
#include "mongo_wire.h"
#include "repl.h"
#include "rpc.h"

#define LOG_WHO "mongo"

#define DEFAULT_MAX_CLIENTS 1024u
#define DEFAULT_MAX_OUTPUT (64u << 20)
#define MAX_EVENTS 256
/* Group commit's wait for other writers (coalesce). */
#define COALESCE_MIN_NS 20000u          /* syncs cheaper than this: no wait */
#define COALESCE_MAX_NS 1000000u
#define COALESCE_RECENT_NS 5000000u     /* a writer counts this long after it wrote */
#define ACCEPT_BURST 64

#define IN_INITIAL (16u * 1024)
#define OUT_INITIAL (16u * 1024)
#define MIN_READ 4096u
/* An empty buffer larger than this (grown for one big message or reply)
 * goes back to its initial size so that idle clients stay small. */
#define BUF_KEEP_MAX (1u << 20)
#define TICK_NS 1000000000ull
/* While a hello waits: how often the topology is looked at, and the
 * longest a poll sleeps (the topology changes without waking it). */
#define TOPO_CHECK_NS 1000000ull
#define AWAIT_POLL_MS 100

static const struct mongo_gw_runner doc_cmd_runner = {
    .client_new = doc_client_new,
    .client_free = doc_client_free,
    .run = doc_cmd_run,
    .sync = doc_server_sync,
    .sync_failed = doc_cmd_sync_failed,
    .tick = doc_server_tick,
    .wait = doc_server_wait,
    .waited = doc_server_waited,
    .await = doc_client_await,
    .topology = doc_server_topology,
};

struct buf {
    uint8_t *p;
    size_t off;                 /* bytes [off, len) are pending */
    size_t len;
    size_t cap;
};

/* The reply of a writing command of this batch, relative to out.off (which
 * stays valid when the buffer is compacted), and whom it answers. */
struct write_mark {
    size_t start, end;
    int32_t response_to;
    bool legacy;
};

struct client {
    int fd;
    uint32_t events;            /* epoll interest as registered */
    bool closing;               /* close once the output is sent */
    bool dead;                  /* close at the end of the poll, output dropped */
    bool touched;               /* on the poll's list */
    bool marks_lost;            /* a write mark could not be recorded */
    bool stalled;               /* input left unrun for the output to drain */
    size_t need;                /* the message being read is this long */
    struct buf in, out;
    struct doc_client *dc;
    struct write_mark *marks;
    size_t n_marks, marks_cap;
    struct client *prev, *next;         /* every client */
    struct client *next_touched;
    uint64_t last_write_ns;             /* when a command of this client last wrote */
    /* the last reply in the output waits for the replicas (mongo_gw.h) */
    bool held, held_write, held_legacy;
    size_t held_len;
    int32_t held_to;
    struct repl_wait wait;
    /* an awaitable hello waits for the topology to pass await_counter */
    bool awaiting, await_exhaust, await_legacy;
    int32_t await_to;           /* its request, or streaming, the last reply */
    int64_t await_counter;
    uint64_t await_ms, await_until_ns;
    /* the hello less topologyVersion and maxAwaitTimeMS; made at the
     * client's first wait (a bson_t held in a struct wants 128-byte
     * alignment, which calloc does not give: bson_new's does) */
    bson_t *await_cmd;
};

struct mongo_gw {
    struct doc_server *srv;
    struct mongo_gw_runner run;
    unsigned max_clients;
    size_t max_request;
    size_t max_output;
    int epfd, lfd;
    uint16_t port;
    unsigned n_clients;
    unsigned n_held;                    /* clients with a reply waiting */
    unsigned n_await;                   /* clients with a hello waiting */
    int64_t topo;                       /* the topology counter last seen */
    int64_t topo_scanned;               /* ...when the waiting hellos were last
                                         * gone through */
    uint64_t next_topo_ns;              /* when to look at it again */
    uint64_t await_next_ns;             /* when a waiting hello is due next */
    struct client *clients;
    struct client *touched;             /* clients with work this poll */
    unsigned batch_msgs;
    bool batch_wrote;                   /* a command of this poll wrote */
    uint64_t now_ns;                    /* this poll's time */
    uint64_t sync_ns;                   /* how long the last group commit took */
    bson_t reply;                       /* every command's reply, reused */
    bson_t err;                         /* error replies, reused */
    bson_t cmd;                         /* an OP_QUERY command given its $db */
    uint32_t next_request_id;
    uint64_t next_tick_ns;
    int watch_fd;                       /* mongo_gw_watch_fd(), -1 if none */
    bool watch_ready;
    struct mongo_gw_stats st;
};

/* ---- output ---- */

static size_t out_pending(const struct client *c)
{
    return c->out.len - c->out.off;
}

/* Room for n more bytes of output; NULL (and the client is dropped) if
 * memory runs out. */
static uint8_t *out_reserve(struct mongo_gw *gw, struct client *c, size_t n)
{
    struct buf *b = &c->out;
    size_t cap;
    uint8_t *p;

    if (b->cap - b->len >= n)
        return b->p + b->len;
    if (b->off > 0) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->cap - b->len >= n)
            return b->p + b->len;
    }
    cap = b->cap ? b->cap : OUT_INITIAL;
    while (cap - b->len < n)
        cap *= 2;
    p = realloc(b->p, cap);
    if (!p) {
        c->dead = true;
        return NULL;
    }
    b->p = p;
    b->cap = cap;
    return b->p + b->len;
}

static void out_add(struct mongo_gw *gw, struct client *c, const void *s, size_t n)
{
    uint8_t *p = out_reserve(gw, c, n);

    if (p) {
        memcpy(p, s, n);
        c->out.len += n;
    }
}

static void error_doc(struct mongo_gw *gw, const struct doc_err *e)
{
    bson_reinit(&gw->err);
    mongo_error_doc(e, &gw->err);
}

/* `doc` framed as the reply to `h`, an OP_MSG with flagBits `flags` unless
 * legacy; the reply's requestID (0 if there was no memory for it). */
static int32_t out_reply_flags(struct mongo_gw *gw, struct client *c, const struct mongo_hdr *h,
                               bool legacy, const bson_t *doc, uint32_t flags)
{
    int32_t id;
    size_t n = mongo_reply(h, legacy, 0, doc, NULL, 0);
    uint8_t *p;

    if (n > MONGO_MAX_MESSAGE) {
        /* No driver would take it: the command layer holds its batches
         * far below this, so it is a bug there, not the client's. */
        struct doc_err e;

        doc_errf(&e, DOC_InternalError,
                 "reply of %zu bytes exceeds maxMessageSizeBytes (%d)", n, MONGO_MAX_MESSAGE);
        error_doc(gw, &e);
        doc = &gw->err;
        n = mongo_reply(h, legacy, 0, doc, NULL, 0);
    }
    p = out_reserve(gw, c, n);
    if (!p)
        return 0;
    id = (int32_t)(++gw->next_request_id & INT32_MAX);
    mongo_reply(h, legacy, id, doc, p, n);
    if (flags && !legacy) {
        /* flagBits follow the header (mongo_reply writes 0 there) */
        p[MONGO_HDR_LEN] = (uint8_t)flags;
        p[MONGO_HDR_LEN + 1] = (uint8_t)(flags >> 8);
        p[MONGO_HDR_LEN + 2] = (uint8_t)(flags >> 16);
        p[MONGO_HDR_LEN + 3] = (uint8_t)(flags >> 24);
    }
    c->out.len += n;
    return id;
}

static void out_reply(struct mongo_gw *gw, struct client *c, const struct mongo_hdr *h,
                      bool legacy, const bson_t *doc)
{
    out_reply_flags(gw, c, h, legacy, doc, 0);
}

static void out_error(struct mongo_gw *gw, struct client *c, const struct mongo_hdr *h,
                      bool legacy, const struct doc_err *e)
{
    gw->st.errors++;
    error_doc(gw, e);
    out_reply(gw, c, h, legacy, &gw->err);
}

static void mark_write(struct client *c, size_t start, const struct mongo_msg *m)
{
    if (c->n_marks == c->marks_cap) {
        size_t cap = c->marks_cap ? c->marks_cap * 2 : 16;
        struct write_mark *w = realloc(c->marks, cap * sizeof(*w));

        if (!w) {
            c->marks_lost = true;
            return;
        }
        c->marks = w;
        c->marks_cap = cap;
    }
    c->marks[c->n_marks] = (struct write_mark){.start = start, .end = out_pending(c),
                                               .response_to = m->h.request_id,
                                               .legacy = m->legacy};
    c->n_marks++;
}

/* ---- messages ---- */

/* An awaitable hello of `c`'s waits from now on: for the topology counter
 * to pass a->counter, or a->max_ms. False if there was no memory for it
 * (then it is answered at once). */
static bool await_begin(struct mongo_gw *gw, struct client *c, const bson_t *body,
                        const struct mongo_msg *m, const struct doc_await *a, bool exhaust)
{
    if (!c->await_cmd && !(c->await_cmd = bson_new()))
        return false;
    bson_reinit(c->await_cmd);
    bson_copy_to_excluding_noinit(body, c->await_cmd, "topologyVersion", "maxAwaitTimeMS",
                                  NULL);
    c->awaiting = true;
    c->await_exhaust = exhaust;
    c->await_legacy = m->legacy;
    c->await_to = m->h.request_id;
    c->await_counter = a->counter;
    c->await_ms = a->max_ms;
    c->await_until_ns = gw->now_ns + a->max_ms * 1000000u;
    if (!gw->n_await || c->await_until_ns < gw->await_next_ns)
        gw->await_next_ns = c->await_until_ns;
    /* the freshest look at the counter there is */
    if (a->counter > gw->topo)
        gw->topo = a->counter;
    gw->n_await++;
    gw->st.awaited++;
    return true;
}

static void run_message(struct mongo_gw *gw, struct client *c, const uint8_t *msg, size_t len)
{
    struct doc_err e = {0};
    struct mongo_msg m;
    const bson_t *body;
    size_t start;
    int rc;

    gw->batch_msgs++;
    if (mongo_parse(msg, len, &m, &e) < 0) {
        static struct tern_log_limit limit;

        if (tern_log_allow(&limit)) {
            tern_log(TERN_LOG_DEBUG, LOG_WHO, "refused a message: %s (%u more)", e.msg,
                     limit.held);
            limit.held = 0;
        }
        /* The client asked for no reply: it gets none, even an error. */
        if (m.flags & MONGO_MSG_MORE_TO_COME)
            gw->st.errors++;
        else
            out_error(gw, c, &m.h, m.legacy, &e);
        return;
    }
    body = &m.body;
    if (m.legacy && !bson_has_field(body, "$db")) {
        /* An OP_QUERY names its database in the collection ("test.$cmd"),
         * where OP_MSG has $db: give the command layer the same. Only
         * handshakes come this way, so the copy is rare. */
        bson_reinit(&gw->cmd);
        bson_concat(&gw->cmd, body);
        bson_append_utf8(&gw->cmd, "$db", 3, m.db, (int)m.db_len);
        body = &gw->cmd;
    }
    bson_reinit(&gw->reply);
    rc = gw->run.run(c->dc, body, m.seqs, m.nseq, &gw->reply);
    if (rc & DOC_CMD_WROTE) {
        gw->batch_wrote = true;
        c->last_write_ns = gw->now_ns;
    }
    if (m.flags & MONGO_MSG_MORE_TO_COME)
        return;
    if ((rc & DOC_CMD_AWAIT) && gw->run.await && gw->run.topology && !c->dead) {
        bool exhaust = !m.legacy && (m.flags & MONGO_MSG_EXHAUST);
        struct doc_await a;

        gw->run.await(c->dc, &a);
        if (a.current) {
            /* The client knows this topology: the reply waits for news. */
            if (await_begin(gw, c, body, &m, &a, exhaust))
                return;
        } else if (exhaust && (c->await_cmd || (c->await_cmd = bson_new()))) {
            /* Answered now, and streamed from here on. */
            int32_t id = out_reply_flags(gw, c, &m.h, false, &gw->reply,
                                         MONGO_MSG_MORE_TO_COME);

            if (!c->dead && await_begin(gw, c, body, &m, &a, true))
                c->await_to = id;
            return;
        }
    }
    start = out_pending(c);
    out_reply(gw, c, &m.h, m.legacy, &gw->reply);
    if ((rc & DOC_CMD_WROTE) && !c->dead)
        mark_write(c, start, &m);
    if (!c->dead && gw->run.wait && gw->run.wait(gw->srv, rc, &c->wait)) {
        c->held = true;
        c->held_write = (rc & DOC_CMD_WROTE) != 0;
        c->held_legacy = m.legacy;
        c->held_to = m.h.request_id;
        c->held_len = out_pending(c) - start;
        gw->n_held++;
    }
}

/* Run every complete message in the input buffer, while the client's
 * output is under max_output. */
static void run_input(struct mongo_gw *gw, struct client *c)
{
    struct buf *b = &c->in;

    while (!c->closing && !c->dead && !c->held && !c->awaiting && b->off < b->len &&
           out_pending(c) <= gw->max_output) {
        struct mongo_hdr h;
        struct doc_err e = {0};
        long n = mongo_frame(b->p + b->off, b->len - b->off, gw->max_request, &h, &e);

        if (n == 0) {
            c->need = b->len - b->off >= MONGO_HDR_LEN ? (size_t)h.len : MONGO_HDR_LEN;
            break;
        }
        if (n < 0) {
            /* Nothing after this header can be found: answer, then close. */
            out_error(gw, c, &h, h.op == MONGO_OP_QUERY, &e);
            c->closing = true;
            break;
        }
        run_message(gw, c, b->p + b->off, (size_t)n);
        b->off += (size_t)n;
        c->need = 0;
    }
    c->stalled = !c->closing && !c->dead && b->off < b->len && out_pending(c) > gw->max_output;
}

/* ---- clients ---- */

static void set_interest(struct mongo_gw *gw, struct client *c, uint32_t events)
{
    struct epoll_event e = {.events = events, .data.ptr = c};

    if (events == c->events)
        return;
    if (epoll_ctl(gw->epfd, EPOLL_CTL_MOD, c->fd, &e) < 0)
        c->dead = true;
    else
        c->events = events;
}

static void buf_shrink(struct buf *b, size_t initial)
{
    uint8_t *p;

    if (b->cap <= BUF_KEEP_MAX || b->off != b->len)
        return;
    p = realloc(b->p, initial);
    if (p) {
        b->p = p;
        b->cap = initial;
    }
    b->off = b->len = 0;
}

/* Closing a socket with unread input makes the kernel send a reset, and a
 * reset can make the peer drop the error reply it has not read yet. Read
 * what has already arrived (a bounded amount) so the reply gets through. */
static void drain_input(int fd)
{
    char sink[16384];

    for (int i = 0; i < 16; i++)
        if (read(fd, sink, sizeof(sink)) <= 0)
            return;
}

static void client_close(struct mongo_gw *gw, struct client *c)
{
    epoll_ctl(gw->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->closing && !c->dead)
        drain_input(c->fd);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        gw->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    gw->n_clients--;
    if (c->held)
        gw->n_held--;
    if (c->awaiting)
        gw->n_await--;
    if (c->await_cmd)
        bson_destroy(c->await_cmd);
    gw->run.client_free(c->dc);
    free(c->in.p);
    free(c->out.p);
    free(c->marks);
    free(c);
}

static struct client *client_new(struct mongo_gw *gw, int fd)
{
    struct client *c = calloc(1, sizeof(*c));
    struct epoll_event e = {.events = EPOLLIN};
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[64] = "", serv[16] = "", peer[96] = "unknown";
    int one = 1;

    if (!c)
        return NULL;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(peer, sizeof(peer), "%s:%s", host, serv);
    c->fd = fd;
    c->in.p = malloc(IN_INITIAL);
    c->dc = c->in.p ? gw->run.client_new(gw->srv, peer) : NULL;
    if (!c->dc) {
        free(c->in.p);
        free(c);
        return NULL;
    }
    c->in.cap = IN_INITIAL;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    e.data.ptr = c;
    if (epoll_ctl(gw->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
        gw->run.client_free(c->dc);
        free(c->in.p);
        free(c);
        return NULL;
    }
    c->events = EPOLLIN;
    c->next = gw->clients;
    if (gw->clients)
        gw->clients->prev = c;
    gw->clients = c;
    gw->n_clients++;
    gw->st.connections++;
    return c;
}

static void refuse(int fd, const char *why)
{
    static struct tern_log_limit limit;

    /* The wire has no way to speak before the client does: just close. */
    close(fd);
    if (tern_log_allow(&limit)) {
        tern_log(TERN_LOG_WARN, LOG_WHO, "refusing a client: %s (%u more refused)", why,
                 limit.held);
        limit.held = 0;
    }
}

static void accept_clients(struct mongo_gw *gw)
{
    for (int i = 0; i < ACCEPT_BURST; i++) {
        int fd = accept4(gw->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            static struct tern_log_limit limit;

            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK && tern_log_allow(&limit)) {
                tern_log(TERN_LOG_WARN, LOG_WHO, "accept: %s", strerror(errno));
                limit.held = 0;
            }
            return;
        }
        if (gw->n_clients >= gw->max_clients)
            refuse(fd, "too many clients");
        else if (!client_new(gw, fd))
            refuse(fd, "out of memory");
    }
}

/* Make room to read: drop consumed input, and grow to hold the message
 * being read (its header says how long it is). */
static bool in_make_room(struct mongo_gw *gw, struct client *c)
{
    struct buf *b = &c->in;
    size_t limit = gw->max_request + MIN_READ, want, cap;
    uint8_t *p;

    if (b->off > 0) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    want = b->len + MIN_READ;
    if (c->need > want)
        want = c->need;
    if (want > limit)
        want = limit;
    if (want <= b->cap)
        return b->len < b->cap;
    cap = b->cap;
    while (cap < want)
        cap *= 2;
    if (cap > limit)
        cap = limit;
    p = realloc(b->p, cap);
    if (!p) {
        c->dead = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return b->len < b->cap;
}

/* One read per poll, so that one busy client cannot starve the others. */
static void client_read(struct mongo_gw *gw, struct client *c)
{
    ssize_t n;

    if (!in_make_room(gw, c)) {
        /* mongo_frame bounds every message by max_request, so a full
         * buffer cannot happen; if it does, fail this client only. */
        c->dead = true;
        return;
    }
    n = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
    if (n > 0) {
        c->in.len += (size_t)n;
        run_input(gw, c);
        if (c->in.off == c->in.len) {
            c->in.off = c->in.len = 0;
            buf_shrink(&c->in, IN_INITIAL);
        }
    } else if (n == 0) {
        /* The peer has finished sending: answer what came, then close. */
        c->closing = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        c->dead = true;
    }
}

static void touch(struct mongo_gw *gw, struct client *c)
{
    if (c->touched)
        return;
    c->touched = true;
    c->next_touched = gw->touched;
    gw->touched = c;
}

/* See the top of the file: swap the client's write replies of this batch
 * for the sync failure. */
static void fail_writes(struct mongo_gw *gw, struct client *c, const struct doc_err *e)
{
    size_t first, total, at;
    uint8_t *tail;

    if (c->dead || (!c->n_marks && !c->marks_lost))
        return;
    if (c->held && c->held_write) {
        /* It is the batch's last write: the failure replaces it below. */
        c->held = false;
        c->held_len = 0;
        gw->n_held--;
    }
    if (c->marks_lost) {
        c->dead = true;     /* cannot tell which replies to take back */
        return;
    }
    first = c->marks[0].start;
    total = out_pending(c);
    tail = malloc(total - first);
    if (!tail) {
        c->dead = true;
        return;
    }
    memcpy(tail, c->out.p + c->out.off + first, total - first);
    c->out.len = c->out.off + first;
    at = first;
    for (size_t i = 0; i < c->n_marks; i++) {
        struct mongo_hdr h = {.request_id = c->marks[i].response_to};

        out_add(gw, c, tail + (at - first), c->marks[i].start - at);
        bson_reinit(&gw->err);
        gw->run.sync_failed(e, &gw->err);
        out_reply(gw, c, &h, c->marks[i].legacy, &gw->err);
        at = c->marks[i].end;
    }
    out_add(gw, c, tail + (at - first), total - at);
    free(tail);
}

/* Group commit: one sync for every write of the poll, before any reply. */
static void commit_batch(struct mongo_gw *gw)
{
    static struct tern_log_limit limit;
    struct doc_err e = {0};

    if (!gw->batch_wrote)
        return;
    gw->batch_wrote = false;
    gw->st.syncs++;
    if (gw->run.sync(gw->srv, &e) >= 0)
        return;
    gw->st.sync_failures++;
    if (!e.code)
        doc_errf(&e, DOC_InternalError, "sync failed");
    if (tern_log_allow(&limit)) {
        tern_log(TERN_LOG_ERROR, LOG_WHO, "sync failed: %s (%u more)", e.msg, limit.held);
        limit.held = 0;
    }
    for (struct client *c = gw->touched; c; c = c->next_touched)
        fail_writes(gw, c, &e);
}

/* One write per client per poll; what does not go waits for EPOLLOUT. */
static void client_flush(struct mongo_gw *gw, struct client *c)
{
    struct buf *b = &c->out;
    size_t backlog;

    c->n_marks = 0;
    c->marks_lost = false;
    if (c->dead) {
        client_close(gw, c);
        return;
    }
    if (b->len - c->held_len > b->off) {
        ssize_t n = send(c->fd, b->p + b->off, b->len - c->held_len - b->off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            client_close(gw, c);
            return;
        }
        if (n > 0)
            b->off += (size_t)n;
        if (b->off == b->len) {
            b->off = b->len = 0;
            buf_shrink(b, OUT_INITIAL);
        }
    }
    backlog = b->len - b->off - c->held_len;
    if (c->closing && !backlog && !c->held && !c->awaiting) {
        client_close(gw, c);
        return;
    }
    /* A stalled client waits for EPOLLOUT even with nothing to send: the
     * event is what brings it back to run the rest of its input. A held
     * one is not read (its input would fill up behind the held reply):
     * release_held runs the rest when the reply may go. One whose hello
     * waits is not read either, but its peer's closing is watched for. */
    set_interest(gw, c,
                 (c->closing || c->stalled || c->held || backlog > gw->max_output ? 0
                  : c->awaiting                                                   ? EPOLLRDHUP
                                                                                  : EPOLLIN) |
                 (backlog || c->stalled ? EPOLLOUT : 0));
    if (c->dead)
        client_close(gw, c);
}

/* Writers that wrote lately and are not in this batch: a group commit
 * that waits a moment for them takes their writes along (PostgreSQL's
 * commit_delay with commit_siblings). */
static unsigned siblings(const struct mongo_gw *gw)
{
    unsigned n = 0;

    for (const struct client *c = gw->clients; c && n < 2; c = c->next)
        if (!c->touched && c->last_write_ns && gw->now_ns - c->last_write_ns < COALESCE_RECENT_NS)
            n++;
    return n;
}

static void serve_events(struct mongo_gw *gw, const struct epoll_event *ev, int n);

/* Replies waiting for the replicas: those that may go now are let go (and
 * their clients' next messages run); those that never may become the
 * error the server gives. */
static void release_held(struct mongo_gw *gw)
{
    for (struct client *c = gw->clients; c && gw->n_held; c = c->next) {
        struct doc_err e = {0};
        int rc;

        if (!c->held || c->dead)
            continue;
        rc = gw->run.waited(gw->srv, &c->wait, &e);
        if (rc == 0)
            continue;
        if (rc < 0) {
            struct mongo_hdr h = {.request_id = c->held_to};

            c->out.len -= c->held_len;
            out_error(gw, c, &h, c->held_legacy, &e);
        }
        c->held = false;
        c->held_len = 0;
        gw->n_held--;
        touch(gw, c);
        run_input(gw, c);
    }
}

/* Answer c's waiting hello with the topology as it is now. Streaming, it
 * waits again, on what this answer says; else the client's next messages
 * run. */
static void await_answer(struct mongo_gw *gw, struct client *c)
{
    struct mongo_hdr h = {.request_id = c->await_to};
    struct doc_await a;

    touch(gw, c);
    bson_reinit(&gw->reply);
    gw->run.run(c->dc, c->await_cmd, NULL, 0, &gw->reply);
    gw->run.await(c->dc, &a);
    if (c->await_exhaust && !c->closing) {
        int32_t id = out_reply_flags(gw, c, &h, false, &gw->reply, MONGO_MSG_MORE_TO_COME);

        c->await_to = id;
        c->await_counter = a.counter;
        c->await_until_ns = gw->now_ns + c->await_ms * 1000000u;
        if (c->await_until_ns < gw->await_next_ns)
            gw->await_next_ns = c->await_until_ns;
        if (a.counter > gw->topo)
            gw->topo = a.counter;
        return;
    }
    out_reply(gw, c, &h, c->await_legacy, &gw->reply);
    c->awaiting = false;
    gw->n_await--;
    run_input(gw, c);
}

/* Waiting hellos whose topology moved on or whose time is up. The
 * clients are gone through only when the counter moved or one is due. A
 * stream whose last answer is still unsent gets no next one until it is
 * (a client that does not read makes it wait, not the output grow). */
static void release_awaits(struct mongo_gw *gw)
{
    unsigned seen = 0, n = gw->n_await;
    uint64_t next = UINT64_MAX;

    if (gw->now_ns >= gw->next_topo_ns) {
        int64_t t = gw->run.topology(gw->srv);

        /* A client's counter may be newer than the last look: only
         * a counter past it is news to the client. */
        if (t > gw->topo)
            gw->topo = t;
        gw->next_topo_ns = gw->now_ns + TOPO_CHECK_NS;
    }
    if (gw->topo == gw->topo_scanned && gw->now_ns < gw->await_next_ns)
        return;
    gw->topo_scanned = gw->topo;
    for (struct client *c = gw->clients; c && seen < n; c = c->next) {
        if (!c->awaiting)
            continue;
        seen++;
        if (c->dead)
            continue;
        if (c->await_counter >= gw->topo && gw->now_ns < c->await_until_ns) {
            if (c->await_until_ns < next)
                next = c->await_until_ns;
            continue;
        }
        if (c->await_exhaust && out_pending(c)) {
            /* Due, but its last answer is still going out: look again
             * once the poll has sent what it can. */
            if (gw->now_ns + TOPO_CHECK_NS < next)
                next = gw->now_ns + TOPO_CHECK_NS;
            continue;
        }
        await_answer(gw, c);
        if (c->awaiting && c->await_until_ns < next)
            next = c->await_until_ns;
    }
    gw->await_next_ns = next;
}

/* Before a group commit that costs more than a wake-up, wait up to half
 * its last duration for the other recent writers' next commands, so that
 * one flush carries more of them. A lone writer never waits. */
static void coalesce(struct mongo_gw *gw)
{
    struct epoll_event ev[MAX_EVENTS];
    uint64_t wait_ns = gw->sync_ns / 2;
    struct timespec ts;
    int n;

    if (!gw->batch_wrote || gw->sync_ns < COALESCE_MIN_NS || !siblings(gw))
        return;
    if (wait_ns > COALESCE_MAX_NS)
        wait_ns = COALESCE_MAX_NS;
    ts = (struct timespec){.tv_sec = 0, .tv_nsec = (long)wait_ns};
    n = epoll_pwait2(gw->epfd, ev, MAX_EVENTS, &ts, NULL);
    if (n > 0)
        serve_events(gw, ev, n);
}

/* A held reply that may go now (its wait is over, or failed). */
static bool held_ready(struct mongo_gw *gw)
{
    for (struct client *c = gw->clients; c; c = c->next) {
        struct doc_err e = {0};

        if (c->held && !c->dead && gw->run.waited(gw->srv, &c->wait, &e) != 0)
            return true;
    }
    return false;
}

int mongo_gw_poll(struct mongo_gw *gw, int timeout_ms)
{
    struct epoll_event ev[MAX_EVENTS];
    uint64_t now;
    int n;

    if (gw->n_await && (timeout_ms < 0 || timeout_ms > AWAIT_POLL_MS))
        timeout_ms = AWAIT_POLL_MS;
    /* A held reply freed since the last poll (by a replica's confirmation,
     * which the RPC poll took in) raises no event here: waiting first
     * would keep it for the whole timeout unless some other client woke
     * the wait. On a shard with a replica away, where one confirmation
     * frees each write, that cost writes 100 ms now and then (ternd's
     * loop blocks here for up to 100 ms). */
    if (timeout_ms != 0 && gw->n_held && held_ready(gw))
        timeout_ms = 0;
    n = epoll_wait(gw->epfd, ev, MAX_EVENTS, timeout_ms);

    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    gw->batch_msgs = 0;
    gw->batch_wrote = false;
    gw->touched = NULL;
    gw->watch_ready = false;
    gw->now_ns = tern_now_ns();
    serve_events(gw, ev, n);
    if (gw->n_held)
        release_held(gw);
    if (gw->n_await)
        release_awaits(gw);
    coalesce(gw);
    if (gw->batch_wrote) {
        now = tern_now_ns();
        commit_batch(gw);
        gw->sync_ns = tern_now_ns() - now;
    }
    while (gw->touched) {
        struct client *c = gw->touched;

        gw->touched = c->next_touched;
        c->touched = false;
        client_flush(gw, c);
    }
    gw->st.messages += gw->batch_msgs;
    /* vDSO clock: no system call. */
    now = tern_now_ns();
    if (now >= gw->next_tick_ns) {
        gw->next_tick_ns = now + TICK_NS;
        gw->run.tick(gw->srv, now / 1000000);
    }
    return gw->batch_msgs > INT_MAX ? INT_MAX : (int)gw->batch_msgs;
}

static void serve_events(struct mongo_gw *gw, const struct epoll_event *ev, int n)
{
    for (int i = 0; i < n; i++) {
        struct client *c = ev[i].data.ptr;

        if (ev[i].data.ptr == &gw->watch_fd) {
            gw->watch_ready = true;
            continue;
        }
        if (ev[i].data.ptr == gw) {
            accept_clients(gw);
            continue;
        }
        touch(gw, c);
        if (c->awaiting && (ev[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
            /* Gone, or done sending: the hello is answered now if the
             * client can still read it, and the connection closed. */
            c->closing = true;
            if (ev[i].events & (EPOLLHUP | EPOLLERR))
                c->dead = true;
            else
                await_answer(gw, c);
            continue;
        }
        if (c->stalled) {
            if (out_pending(c) <= gw->max_output)
                run_input(gw, c);
        } else if ((ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && (c->events & EPOLLIN)) {
            client_read(gw, c);
        }
    }
}

/* ---- the gateway ---- */

static int listen_on(struct mongo_gw *gw, const char *host, uint16_t port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char service[8];
    int fd, one = 1, rc;

    snprintf(service, sizeof(service), "%u", port);
    if (getaddrinfo(host, service, &hints, &ai) != 0)
        return TERN_EBADADDR;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        freeaddrinfo(ai);
        return rc;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 511) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = errno == EADDRINUSE ? TERN_EADDRINUSE : -errno;
        freeaddrinfo(ai);
        close(fd);
        return rc;
    }
    freeaddrinfo(ai);
    gw->lfd = fd;
    gw->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

int mongo_gw_create(struct doc_server *srv, const struct mongo_gw_config *cfg,
                    struct mongo_gw **out)
{
    struct mongo_gw *gw;
    struct epoll_event e = {.events = EPOLLIN};
    int rc;

    if (!srv || !out)
        return TERN_EINVAL;
    gw = calloc(1, sizeof(*gw));
    if (!gw)
        return TERN_ENOMEM;
    gw->srv = srv;
    gw->run = cfg && cfg->runner ? *cfg->runner : doc_cmd_runner;
    gw->max_clients = cfg && cfg->max_clients ? cfg->max_clients : DEFAULT_MAX_CLIENTS;
    gw->max_request = cfg && cfg->max_request && cfg->max_request < MONGO_MAX_MESSAGE
                          ? cfg->max_request : MONGO_MAX_MESSAGE;
    if (gw->max_request < MONGO_HDR_LEN)
        gw->max_request = MONGO_HDR_LEN;
    gw->max_output = cfg && cfg->max_output ? cfg->max_output : DEFAULT_MAX_OUTPUT;
    gw->lfd = -1;
    gw->watch_fd = -1;
    bson_init(&gw->reply);
    bson_init(&gw->err);
    bson_init(&gw->cmd);
    gw->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (gw->epfd < 0) {
        rc = -errno;
        free(gw);
        return rc;
    }
    rc = listen_on(gw, cfg && cfg->host ? cfg->host : "127.0.0.1", cfg ? cfg->port : 0);
    e.data.ptr = gw;
    if (rc == 0 && epoll_ctl(gw->epfd, EPOLL_CTL_ADD, gw->lfd, &e) < 0)
        rc = -errno;
    if (rc < 0) {
        /* The caller gets the code and says it: a warning too would print
         * the one error twice. */
        tern_log(TERN_LOG_DEBUG, LOG_WHO, "cannot listen on %s:%u: %s",
                 cfg && cfg->host ? cfg->host : "127.0.0.1", cfg ? cfg->port : 0,
                 tern_strerror(rc));
        if (gw->lfd >= 0)
            close(gw->lfd);
        close(gw->epfd);
        free(gw);
        return rc;
    }
    tern_log(TERN_LOG_INFO, LOG_WHO, "listening on port %u", gw->port);
    *out = gw;
    return 0;
}

int mongo_gw_adopt(struct mongo_gw *gw, int fd)
{
    if (gw->n_clients >= gw->max_clients)
        return TERN_ENOBUFS;
    return client_new(gw, fd) ? 0 : TERN_ENOMEM;
}

uint16_t mongo_gw_port(const struct mongo_gw *gw)
{
    return gw->port;
}

int mongo_gw_fd(const struct mongo_gw *gw)
{
    return gw->epfd;
}

int mongo_gw_watch_fd(struct mongo_gw *gw, int fd)
{
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &gw->watch_fd};

    if (gw->watch_fd >= 0 || fd < 0)
        return TERN_EINVAL;
    if (epoll_ctl(gw->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
        return -errno;
    gw->watch_fd = fd;
    return 0;
}

bool mongo_gw_watch_ready(const struct mongo_gw *gw)
{
    return gw->watch_ready;
}

void mongo_gw_stats(const struct mongo_gw *gw, struct mongo_gw_stats *st)
{
    *st = gw->st;
    st->clients = gw->n_clients;
    st->awaiting = gw->n_await;
}

void mongo_gw_destroy(struct mongo_gw *gw)
{
    if (!gw)
        return;
    while (gw->clients)
        client_close(gw, gw->clients);
    bson_destroy(&gw->reply);
    bson_destroy(&gw->err);
    bson_destroy(&gw->cmd);
    close(gw->lfd);
    close(gw->epfd);
    free(gw);
}
