/* The native document client (doc.h): each call builds the MongoDB command
 * a driver would send into an op slot of its own (the command's buffer is
 * kept between uses), sends it with a doc_req header (doc_wire.h), and
 * reads the answer from the reply document.
 *
 * Cursors: each holds its current batch, a BSON array, and walks it with
 * an iterator. The batch lies either in a slot of the client's registered
 * buffer, where the server put it (RMongo's path: read in place), or in
 * the cursor's own memory, copied once out of the reply (the reply is
 * only valid during its continuation). Which one is asked per request:
 * by the path set, and by what the session's fabric can do now
 * (tern_session_caps), never by its name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc.h"
#include "doc_err.h"
#include "doc_wire.h"
#include "error.h"
#include "log.h"

#define DOC_OPS 64
#define DEFAULT_TIMEOUT (5ull * 1000000000ull)
/* TERN_DOC_PATH_AUTO's smallest batch to push (doc.h). Measured with
 * tests/doc-path-bench (one client, rounds of each way in turn, adaptive
 * polling) at cb36ed5 and 4efa26f on a 2-core VM shared with other builds
 * (load 4-7, so single figures swing 2x): batches/s pushed over inline.
 * The paths alone, three runs: shm (stores into our mapped buffer)
 * 0.96-1.03 at 16 KiB, 1.04-2.24 at 64 KiB, 1.36-8.8 at 256 KiB, 1.56-3.4
 * at 1 MiB; rdma (softverbs) 0.80-1.03, 1.10-2.27, 1.28-1.74, 1.27-1.54;
 * tcp and ntb 0.39-0.99 from 64 KiB. Through the service (a find whose
 * first batch has that size, read to its end), two runs: shm 1.06-1.15,
 * 1.01-1.12, 1.01-1.16, 1.23-1.92; rdma 0.94-1.00, 1.05-1.09, 1.14-1.18,
 * 0.81-1.28; tcp 0.49-0.78. Pushing pays from 64 KiB where the server's
 * CPU does not serve the put (TERN_TP_CAP_RMA_OFFLOAD); elsewhere AUTO
 * stays inline. */
#define AUTO_PUSH_MIN (64u << 10)

struct tern_doc;

struct doc_op {
    struct tern_doc *doc;
    struct doc_op *next_free;
    bson_t cmd;                      /* built here; its buffer is kept */
    struct doc_req hdr;
    tern_doc_cb cb;
    void *arg;
    struct tern_doc_cursor *cur;     /* a cursor's find/aggregate/getMore */
    struct tern_session *to;         /* where it was sent */
    bool pinned;                     /* getMore, killCursors: its cursor's server only */
    unsigned tries;                  /* sent on to another replica so often */
    /* A sync call's op, refused by every replica (an election): sent
     * again every AGAIN_NS until `until` (doc_hold); next_free links the
     * held ones. */
    uint64_t until, again_at;
    int refused;                     /* the last refusal, its status at the end */
};

/* tern_doc_open's URIs: one server and its alternatives, or the replicas
 * of a replicated document store. */
#define DOC_REPLICAS_MAX 7
#define REDIAL_NS 200000000ull
#define MEMBERS_NS 1000000000ull
#define AGAIN_NS 10000000ull

struct tern_doc {
    struct tern_rpc_ep *ep;
    struct tern_session *s;          /* the one calls go to: the primary, as far as known */
    /* Every URI given, a session to each that answered (NULL: none now);
     * a call refused because its replica is not primary, or lost with
     * it, is sent on to the next (doc_follow). */
    unsigned n_rep, cur_rep;
    char uris[DOC_REPLICAS_MAX][256];
    struct tern_session *rs[DOC_REPLICAS_MAX];
    uint64_t redial_at[DOC_REPLICAS_MAX];
    uint64_t connect_ns;
    bool closing;
    /* the set's members, asked of the server (hello's ternMembers, from
     * the shard's map) after a refusal, at most every MEMBERS_NS: ones not
     * given at open are dialled too */
    uint64_t members_at;
    bool members_asked, members_due;
    uint64_t timeout;
    uint64_t sync_until;             /* a sync call's deadline while it runs, else 0 */
    struct doc_op *held;             /* its ops waiting out an election */
    enum tern_doc_path path;
    struct doc_op ops[DOC_OPS];
    struct doc_op *free_ops;
    struct tern_doc_error err;
    struct tern_doc_stats st;
    /* Buffers the server puts batches into, one slot per cursor. */
    struct tern_rpc_mr *buf_mr;
    uint32_t slot_free;              /* bit i: slot i is free */
    struct tern_tp_rkey rkey;
    uint32_t rkey_epoch;
    struct tern_session *rkey_s;     /* the session rkey is for */
    bool rkey_ok;
    struct tern_doc_cursor *cursors; /* open ones, to orphan at close */
    size_t insert_budget;            /* bytes of documents per insert command */
};

struct tern_doc_cursor {
    struct tern_doc *doc;            /* NULL once the client closed */
    struct tern_doc_cursor *prev, *next;
    char db[64];
    char coll[256];
    int64_t id;                      /* the server's; 0 once exhausted */
    int32_t batch_size;              /* for getMore; 0: the server's choice */
    int slot;                        /* -1: batches come inline */
    uint8_t *own;                    /* inline batches, copied here */
    size_t own_cap;
    bson_t arr;                      /* the current batch */
    bson_iter_t it;
    bool in_batch;
    bson_t view;
    int status;                      /* of the last request */
    struct tern_session *s;          /* the server that holds it */
};

_Static_assert(TERN_DOC_BUF_SLOTS <= 32, "slot_free is a 32-bit mask");

/* ---- errors ---- */

/* MongoDB's code to the closest tern code (doc.h). */
static int map_code(int32_t code)
{
    switch (code) {
    case 11000: case 11001: case 12582:        /* DuplicateKey and its old names */
        return TERN_EEXIST;
    case 2: case 9: case 14: case 15: case 16: case 22: case 28: case 40: case 52: case 53:
    case 54: case 66: case 67: case 72: case 73: case 85: case 86:
        return TERN_EINVAL;
    case 26: case 27: case 43:                  /* namespace, index, cursor not found */
        return TERN_ENOENT;
    case 10334: case 17419:                     /* BSONObjectTooLarge */
        return TERN_E2BIG;
    case 14031:                                 /* OutOfDiskSpace */
        return TERN_ENOSPC;
    case 91: case 189: case 10107: case 11602: case 13435:
        return TERN_ENOTPRIMARY;                /* not (or no longer) the primary */
    default:
        return TERN_EDOC;
    }
}

static void copy_str(char *dst, size_t cap, const bson_t *d, const char *key)
{
    bson_iter_t it;
    const char *s = "";

    if (bson_iter_init_find(&it, d, key) && BSON_ITER_HOLDS_UTF8(&it))
        s = bson_iter_utf8(&it, NULL);
    snprintf(dst, cap, "%s", s);
}

static int64_t get_int(const bson_t *d, const char *key)
{
    bson_iter_t it;

    if (!bson_iter_init_find(&it, d, key))
        return 0;
    return BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
}

/* Fill `e` from an error document ({code, codeName, errmsg}); its code. */
static int error_of(struct tern_doc_error *e, const bson_t *d, int32_t index)
{
    e->code = (int32_t)get_int(d, "code");
    if (!e->code)
        e->code = 8;                            /* UnknownError */
    copy_str(e->code_name, sizeof(e->code_name), d, "codeName");
    /* writeErrors carry no codeName: MongoDB's table names the code. */
    if (!e->code_name[0])
        snprintf(e->code_name, sizeof(e->code_name), "%s", doc_code_name(e->code));
    copy_str(e->errmsg, sizeof(e->errmsg), d, "errmsg");
    e->index = index;
    return map_code(e->code);
}

/* The status a reply means: ok:0, or the first of its writeErrors. */
static int reply_status(struct tern_doc *doc, const bson_t *r)
{
    bson_iter_t it, we;
    uint32_t len;
    const uint8_t *data;
    bson_t w;

    if (!bson_iter_init_find(&it, r, "ok") || !BSON_ITER_HOLDS_NUMBER(&it))
        return TERN_EPROTO;
    if (bson_iter_as_double(&it) != 1.0)
        return error_of(&doc->err, r, -1);
    if (bson_iter_init_find(&it, r, "writeErrors") && BSON_ITER_HOLDS_ARRAY(&it) &&
        bson_iter_recurse(&it, &we) && bson_iter_next(&we) && BSON_ITER_HOLDS_DOCUMENT(&we)) {
        bson_iter_document(&we, &len, &data);
        if (bson_init_static(&w, data, len))
            return error_of(&doc->err, &w, (int32_t)get_int(&w, "index"));
    }
    return 0;
}

const struct tern_doc_error *tern_doc_last_error(const struct tern_doc *doc)
{
    return &doc->err;
}

/* ---- ops ---- */

static void doc_mend(struct tern_doc *doc);

static void doc_learn(struct tern_doc *doc);

static struct doc_op *op_get(struct tern_doc *doc)
{
    struct doc_op *op;

    if (doc->n_rep > 1)
        doc_mend(doc);
    doc_learn(doc);
    op = doc->free_ops;
    if (!op)
        return NULL;
    doc->free_ops = op->next_free;
    bson_reinit(&op->cmd);
    op->hdr = (struct doc_req){0};
    op->cb = NULL;
    op->arg = NULL;
    op->cur = NULL;
    op->to = NULL;
    op->pinned = false;
    op->tries = 0;
    return op;
}

static void op_put(struct doc_op *op)
{
    op->next_free = op->doc->free_ops;
    op->doc->free_ops = op;
}

static void cursor_took(struct tern_doc_cursor *cur, const struct doc_rep *rep, const bson_t *r,
                        int status);

static void op_done(void *arg, int status, const void *reply, size_t len);

static bool live(const struct tern_doc *doc, unsigned i)
{
    return doc->rs[i] && tern_session_status(doc->rs[i]) == 0;
}

static int op_call(struct tern_doc *doc, struct doc_op *op)
{
    struct iovec iov[2] = {
        {.iov_base = &op->hdr, .iov_len = sizeof(op->hdr)},
        {.iov_base = (void *)bson_get_data(&op->cmd), .iov_len = op->cmd.len},
    };

    return tern_callv(op->to, TERN_DOC_SERVICE_ID, DOC_M_CMD, iov, 2, doc->timeout, op_done,
                      op, NULL);
}

/* Why a call did not run where it was sent, or 0 if it did: refused by a
 * replica that is not the primary (an error status, or a reply whose code
 * says so), lost with its session, or never sent (no live one). */
static int refusal(int status, const bson_t *r)
{
    if (status == 0 && r)
        return map_code((int32_t)get_int(r, "code")) == TERN_ENOTPRIMARY ? TERN_ENOTPRIMARY : 0;
    if (status == TERN_ENOTPRIMARY || status == TERN_ECONNRESET || status == TERN_ENOTCONN)
        return status;
    return 0;
}

/* A call refused because its replica is not the primary (or lost with
 * it): send it on to the next live replica, which becomes the one calls go
 * to; at most twice round them (an election takes longer: a sync call
 * waits it out, doc_hold; an async one ends with TERN_ENOTPRIMARY). Not a
 * cursor's getMore or killCursors: the cursor lives on its server. A call
 * lost with its replica may have been done there (writes are at least
 * once). Runs in the continuation: it never dials (doc_mend does, outside
 * the poll). */
static bool doc_follow(struct doc_op *op, int status, const bson_t *r)
{
    struct tern_doc *doc = op->doc;
    unsigned from = doc->cur_rep;
    bool refused = refusal(status, r) != 0;

    if (refused)
        doc->members_due = true;    /* the set may have moved on: ask it */
    if (!refused || op->pinned || doc->closing || doc->n_rep < 2 ||
        op->tries >= 2 * doc->n_rep)
        return false;
    for (unsigned k = 0; k < doc->n_rep; k++)
        if (doc->rs[k] == op->to)
            from = k;
    for (unsigned k = 1; k <= doc->n_rep; k++) {
        unsigned i = (from + k) % doc->n_rep;

        if (!live(doc, i) || doc->rs[i] == op->to)
            continue;
        if (doc->s == op->to || !doc->s || tern_session_status(doc->s) != 0) {
            doc->s = doc->rs[i];
            doc->cur_rep = i;
        }
        op->tries++;
        op->to = doc->s;
        op->hdr = (struct doc_req){0};  /* batches inline: the buffers' key is the old session's */
        return op_call(doc, op) == 0;
    }
    return false;
}

/* A sync call that every replica refused (an election under way), or that
 * found none live to go to, surely did not run: it waits AGAIN_NS and goes
 * again (doc_send_held), until the call's deadline, as tern_kv's sync
 * forms do. A call lost with its session may have run, and a document
 * write is not idempotent: that one ends (doc_follow has sent it on
 * already). True if held. */
static bool doc_hold(struct doc_op *op, int status, const bson_t *r)
{
    struct tern_doc *doc = op->doc;
    int why = refusal(status, r);
    uint64_t now;

    if ((why != TERN_ENOTPRIMARY && why != TERN_ENOTCONN) || !op->until || op->pinned ||
        doc->closing || doc->n_rep < 2)
        return false;
    now = tern_now_ns();
    if (now >= op->until)
        return false;
    op->refused = why;
    op->again_at = now + AGAIN_NS;
    op->next_free = doc->held;
    doc->held = op;
    return true;
}

static void op_end(struct doc_op *op, int status, const struct doc_rep *rep, const bson_t *r);

/* Held ops whose time came go again, to the replica taken for the primary
 * now; past their deadline they end with their last refusal. */
static void doc_send_held(struct tern_doc *doc)
{
    uint64_t now = tern_now_ns();
    struct doc_op **pp = &doc->held;

    while (*pp) {
        struct doc_op *op = *pp;

        if (now < op->again_at && now < op->until) {
            pp = &op->next_free;
            continue;
        }
        *pp = op->next_free;
        if (now >= op->until) {
            op_end(op, op->refused, NULL, NULL);
            continue;
        }
        doc_mend(doc);
        op->tries = 0;
        op->to = doc->s;
        op->hdr = (struct doc_req){0};  /* batches inline: a key was the old session's */
        if (!op->to || op_call(doc, op) < 0) {
            if (!doc_hold(op, TERN_ENOTCONN, NULL))
                op_end(op, TERN_ENOTCONN, NULL, NULL);
        }
        pp = &doc->held;            /* the list changed under us */
    }
}

/* The op's end: its slot is free again, its cursor and its callback are
 * told (r: the reply, when status is 0). */
static void op_end(struct doc_op *op, int status, const struct doc_rep *rep, const bson_t *r)
{
    struct tern_doc *doc = op->doc;
    tern_doc_cb cb = op->cb;
    void *cb_arg = op->arg;
    struct tern_doc_cursor *cur = op->cur;
    bool pushed = op->hdr.flags & DOC_REQ_PUSH;

    if (cur && status == 0 && !op->pinned)
        cur->s = op->to;    /* a new cursor lives where it was opened */
    op_put(op);
    if (status < 0) {
        doc->err = (struct tern_doc_error){.index = -1};
        /* A put that timed out may still land: its slot is never used
         * again (rpc.h). */
        if (pushed && status == TERN_ETIMEDOUT && cur && cur->slot >= 0) {
            cur->slot = -1;
            doc->st.slots_lost++;
        }
        if (cur)
            cursor_took(cur, NULL, NULL, status);
        if (cb)
            cb(cb_arg, status, NULL);
        return;
    }
    doc->st.commands++;
    doc->err = (struct tern_doc_error){.index = -1};
    status = reply_status(doc, r);
    if (cur)
        cursor_took(cur, rep, r, status);
    if (cb)
        cb(cb_arg, status, r);
}

static void op_done(void *arg, int status, const void *reply, size_t len)
{
    struct doc_op *op = arg;
    struct doc_rep rep = {0};
    bson_t r;

    if (status == 0 && (len < sizeof(rep) + 5 ||
                        !bson_init_static(&r, (const uint8_t *)reply + sizeof(rep),
                                          len - sizeof(rep))))
        status = TERN_EPROTO;
    if (status == 0)
        memcpy(&rep, reply, sizeof(rep));
    if (doc_follow(op, status, status == 0 ? &r : NULL))
        return;         /* sent on to another replica */
    if (doc_hold(op, status, status == 0 ? &r : NULL))
        return;         /* to go again once an election is over */
    op_end(op, status, &rep, status == 0 ? &r : NULL);
}

static int op_send(struct tern_doc *doc, struct doc_op *op)
{
    int rc;

    op->until = doc->sync_until;
    if (!op->to)
        op->to = doc->s;
    if (!op->to && doc_hold(op, TERN_ENOTCONN, NULL))
        return 0;               /* no replica live: a sync call waits for one */
    rc = op->to ? op_call(doc, op) : TERN_ENOTCONN;
    if (rc < 0)
        op_put(op);
    return rc;
}

/* Start a command: `begin` names it ({name: coll}), the caller appends the
 * rest to op->cmd, then op_finish adds $db and sends it. */
static struct doc_op *op_begin(struct tern_doc *doc, const char *name, const char *coll)
{
    struct doc_op *op = op_get(doc);

    if (op && !BSON_APPEND_UTF8(&op->cmd, name, coll)) {
        op_put(op);
        return NULL;
    }
    return op;
}

static int op_finish(struct tern_doc *doc, struct doc_op *op, const char *db, bool ok,
                     tern_doc_cb cb, void *arg)
{
    bson_iter_t it;

    if (ok && !bson_iter_init_find(&it, &op->cmd, "$db"))
        ok = BSON_APPEND_UTF8(&op->cmd, "$db", db);
    if (!ok) {
        op_put(op);
        return TERN_E2BIG;      /* libbson refuses documents over 2 GiB */
    }
    op->cb = cb;
    op->arg = arg;
    return op_send(doc, op);
}

static bool db_ok(const char *db)
{
    return db && *db && strlen(db) < 64;
}

static bool names_ok(const char *db, const char *coll)
{
    return db_ok(db) && coll && *coll && strlen(coll) < 256;
}

/* ---- sync forms: start the async call and poll until it ends ---- */

struct waiter {
    bool done;
    int status;
    bson_t *copy;                    /* the whole reply, for tern_doc_command */
    bson_t *first;                   /* find_id: the first document of the batch */
    bool found;
    int64_t n, modified;
    bool upserted;
};

static void wait_cb(void *arg, int status, const bson_t *reply)
{
    struct waiter *w = arg;
    bson_iter_t it, b;

    w->done = true;
    w->status = status;
    if (!reply)
        return;
    if (w->copy) {
        bson_destroy(w->copy);
        bson_copy_to(reply, w->copy);
    }
    w->n = get_int(reply, "n");
    w->modified = get_int(reply, "nModified");
    w->upserted = bson_iter_init_find(&it, reply, "upserted");
    if (w->first && status == 0 && bson_iter_init_find(&it, reply, "cursor") &&
        BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &b) &&
        bson_iter_find(&b, "firstBatch") && BSON_ITER_HOLDS_ARRAY(&b) &&
        bson_iter_recurse(&b, &it) && bson_iter_next(&it) && BSON_ITER_HOLDS_DOCUMENT(&it)) {
        const uint8_t *data;
        uint32_t len;
        bson_t d;

        bson_iter_document(&it, &len, &data);
        if (bson_init_static(&d, data, len)) {
            bson_copy_to(&d, w->first);
            w->found = true;
        }
    }
}

/* Before a call: sessions lost to replicas are dialled again, never
 * waiting (their handshakes go on in the poll); calls go to a live one. */
static void doc_mend(struct tern_doc *doc)
{
    uint64_t now = tern_now_ns();

    for (unsigned i = 0; i < doc->n_rep; i++) {
        if (live(doc, i) || now < doc->redial_at[i] ||
            (doc->rs[i] && tern_session_status(doc->rs[i]) == TERN_EINPROGRESS))
            continue;
        if (doc->rs[i]) {
            /* Its cursors are gone with it. */
            for (struct tern_doc_cursor *c = doc->cursors; c; c = c->next)
                if (c->s == doc->rs[i])
                    c->s = NULL;
            if (doc->s == doc->rs[i])
                doc->s = NULL;
            if (doc->rkey_s == doc->rs[i])
                doc->rkey_s = NULL;
            tern_rpc_disconnect(doc->rs[i]);
            doc->rs[i] = NULL;
        }
        if (tern_rpc_connect_start(doc->ep, doc->uris[i], doc->connect_ns, &doc->rs[i]) < 0)
            doc->rs[i] = NULL;
        doc->redial_at[i] = now + REDIAL_NS;
    }
    if (!doc->s || tern_session_status(doc->s) != 0)
        for (unsigned k = 1; k <= doc->n_rep; k++) {
            unsigned i = (doc->cur_rep + k) % doc->n_rep;

            if (live(doc, i)) {
                doc->s = doc->rs[i];
                doc->cur_rep = i;
                break;
            }
        }
}

/* "host:port" of a URI. */
static const char *addr_of(const char *uri)
{
    const char *sep = strstr(uri, "://");

    return sep ? sep + 3 : uri;
}

/* hello's answer: members not known yet join the list (doc_mend dials
 * them). A server alone says none. */
static void on_members(void *arg, int status, const bson_t *reply)
{
    struct tern_doc *doc = arg;
    bson_iter_t it, m;

    doc->members_asked = false;
    if (status < 0 || !reply || doc->closing || !bson_iter_init_find(&it, reply, "ternMembers") ||
        !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &m))
        return;
    while (bson_iter_next(&m) && doc->n_rep < DOC_REPLICAS_MAX) {
        const char *a;
        uint32_t len;
        bool known = false;
        int w;

        if (!BSON_ITER_HOLDS_UTF8(&m))
            continue;
        a = bson_iter_utf8(&m, &len);
        if (!len || memchr(a, '/', len) || strlen(a) != len)
            continue;
        for (unsigned i = 0; i < doc->n_rep; i++)
            known |= strcmp(addr_of(doc->uris[i]), a) == 0;
        if (known)
            continue;
        /* The scheme of the first URI given. */
        w = snprintf(doc->uris[doc->n_rep], sizeof(doc->uris[0]), "%.*s%s",
                     (int)(addr_of(doc->uris[0]) - doc->uris[0]), doc->uris[0], a);
        if (w <= 0 || (size_t)w >= sizeof(doc->uris[0]))
            continue;
        doc->rs[doc->n_rep] = NULL;
        doc->redial_at[doc->n_rep] = 0;
        tern_log(TERN_LOG_INFO, "doc", "replica %s: learned from the set",
                 doc->uris[doc->n_rep]);
        doc->n_rep++;
    }
}

/* After a refusal (at most every MEMBERS_NS), ask the server in use who
 * the set's members are. */
static void doc_learn(struct tern_doc *doc)
{
    uint64_t now = tern_now_ns();
    struct doc_op *op;

    if (!doc->members_due || doc->members_asked || now < doc->members_at || !doc->s ||
        doc->closing || tern_session_status(doc->s) != 0)
        return;
    doc->members_due = false;
    doc->members_at = now + MEMBERS_NS;
    doc->members_asked = true;      /* before op_get, which calls here */
    op = op_get(doc);
    if (!op || !BSON_APPEND_INT32(&op->cmd, "hello", 1)) {
        if (op)
            op_put(op);
        doc->members_asked = false;
        return;
    }
    op->pinned = true;              /* a member's word: not sent on */
    if (op_finish(doc, op, "admin", true, on_members, doc) < 0)
        doc->members_asked = false;
}

/* The sync forms: SYNC(doc, &w, start) gives the ops that `start` (an
 * async form, or op_finish) sends the call's deadline, then polls until
 * the call is done, sending held ops (an election) on as their time
 * comes. */
static void sync_begin(struct tern_doc *doc)
{
    doc->sync_until = doc->timeout ? tern_now_ns() + doc->timeout : UINT64_MAX;
}

static int wait_for(struct tern_doc *doc, struct waiter *w, int rc)
{
    while (rc == 0 && !w->done) {
        rc = tern_rpc_poll(doc->ep);
        rc = rc < 0 ? rc : 0;
        if (doc->held)
            doc_send_held(doc);
    }
    doc->sync_until = 0;
    /* Ops a callback started meanwhile, held: nothing drives them now. */
    while (doc->held) {
        struct doc_op *op = doc->held;

        doc->held = op->next_free;
        op_end(op, op->refused, NULL, NULL);
    }
    return rc < 0 ? rc : w->status;
}

#define SYNC(doc, w, start) (sync_begin(doc), wait_for((doc), (w), (start)))

/* ---- the generic command ---- */

int tern_doc_command_async(struct tern_doc *doc, const char *db, const bson_t *cmd,
                           tern_doc_cb cb, void *arg)
{
    struct doc_op *op;

    if (!doc || !db_ok(db) || !cmd || bson_empty(cmd))
        return TERN_EINVAL;
    op = op_get(doc);
    if (!op)
        return TERN_ENOBUFS;
    return op_finish(doc, op, db, bson_concat(&op->cmd, cmd), cb, arg);
}

int tern_doc_command(struct tern_doc *doc, const char *db, const bson_t *cmd, bson_t *reply)
{
    struct waiter w = {.copy = reply};

    if (reply)
        bson_init(reply);
    return SYNC(doc, &w, tern_doc_command_async(doc, db, cmd, wait_cb, &w));
}

/* ---- writes ---- */

static bool append_docs(bson_t *cmd, const char *field, const bson_t *const *docs, size_t n)
{
    bson_t arr;
    bool ok = bson_append_array_begin(cmd, field, -1, &arr);

    for (size_t i = 0; ok && i < n; i++) {
        char buf[16];
        const char *key;

        bson_uint32_to_string((uint32_t)i, &key, buf, sizeof(buf));
        ok = docs[i] && bson_append_document(&arr, key, -1, docs[i]);
    }
    return ok && bson_append_array_end(cmd, &arr);
}

int tern_doc_insert_many_async(struct tern_doc *doc, const char *db, const char *coll,
                               const bson_t *const *docs, size_t n, bool ordered,
                               tern_doc_cb cb, void *arg)
{
    struct doc_op *op;
    bool ok;

    if (!doc || !names_ok(db, coll) || !docs || !n || n > UINT32_MAX)
        return TERN_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!docs[i])
            return TERN_EINVAL;
    op = op_begin(doc, "insert", coll);
    if (!op)
        return TERN_ENOBUFS;
    ok = append_docs(&op->cmd, "documents", docs, n) && BSON_APPEND_BOOL(&op->cmd, "ordered", ordered);
    return op_finish(doc, op, db, ok, cb, arg);
}

int tern_doc_insert_one_async(struct tern_doc *doc, const char *db, const char *coll,
                              const bson_t *document, tern_doc_cb cb, void *arg)
{
    return tern_doc_insert_many_async(doc, db, coll, &document, 1, true, cb, arg);
}

/* As MongoDB's drivers split an insert_many by the server's message size
 * and maxWriteBatchSize: commands of whole documents, each within
 * doc->insert_budget bytes (halved when one turns out too large for either
 * end's max_msg) and WRITE_BATCH_MAX documents. Ordered stops at the first
 * command with an error; unordered goes on and reports the first error,
 * its index counted in the caller's array. */
#define WRITE_BATCH_MAX 100000
#define ELEM_OVERHEAD 16    /* type, index key and NUL of an array element */

int tern_doc_insert_many(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *const *docs, size_t n, bool ordered, uint64_t *inserted)
{
    struct tern_doc_error first = {.index = -1};
    uint64_t total = 0;
    int first_rc = 0;
    size_t i = 0;

    if (!doc || !docs)
        return TERN_EINVAL;
    while (i < n) {
        struct waiter w = {0};
        size_t j = i, bytes = 0;
        int rc;

        if (!docs[i])
            return TERN_EINVAL;
        while (j < n && docs[j] && j - i < WRITE_BATCH_MAX &&
               (j == i || bytes + docs[j]->len + ELEM_OVERHEAD <= doc->insert_budget)) {
            bytes += docs[j]->len + ELEM_OVERHEAD;
            j++;
        }
        rc = SYNC(doc, &w, tern_doc_insert_many_async(doc, db, coll, docs + i, j - i, ordered,
                                                      wait_cb, &w));
        if (rc == TERN_EMSGSIZE && j - i > 1 && doc->insert_budget > 4096) {
            doc->insert_budget /= 2;
            continue;
        }
        if (w.done && w.n > 0)
            total += (uint64_t)w.n;
        if (rc < 0 && !first_rc) {
            first_rc = rc;
            first = doc->err;
            if (first.index >= 0)
                first.index += (int32_t)i;
        }
        if (rc < 0 && (ordered || !w.done))
            break;
        i = j;
    }
    doc->err = first;
    if (inserted)
        *inserted = total;
    return first_rc;
}

int tern_doc_insert_one(struct tern_doc *doc, const char *db, const char *coll,
                        const bson_t *document)
{
    return tern_doc_insert_many(doc, db, coll, &document, 1, true, NULL);
}

int tern_doc_update_async(struct tern_doc *doc, const char *db, const char *coll,
                          const bson_t *filter, const bson_t *update, bool upsert, bool multi,
                          tern_doc_cb cb, void *arg)
{
    struct doc_op *op;
    bson_t arr, u;
    bool ok;

    if (!doc || !names_ok(db, coll) || !filter || !update)
        return TERN_EINVAL;
    op = op_begin(doc, "update", coll);
    if (!op)
        return TERN_ENOBUFS;
    ok = bson_append_array_begin(&op->cmd, "updates", -1, &arr) &&
         bson_append_document_begin(&arr, "0", 1, &u) && BSON_APPEND_DOCUMENT(&u, "q", filter) &&
         BSON_APPEND_DOCUMENT(&u, "u", update) && BSON_APPEND_BOOL(&u, "upsert", upsert) &&
         BSON_APPEND_BOOL(&u, "multi", multi) && bson_append_document_end(&arr, &u) &&
         bson_append_array_end(&op->cmd, &arr);
    return op_finish(doc, op, db, ok, cb, arg);
}

static int update_sync(struct tern_doc *doc, const char *db, const char *coll,
                       const bson_t *filter, const bson_t *update, bool upsert, bool multi,
                       struct tern_doc_update_result *res)
{
    struct waiter w = {0};
    int rc = SYNC(doc, &w, tern_doc_update_async(doc, db, coll, filter, update, upsert,
                                                 multi, wait_cb, &w));

    if (res) {
        *res = (struct tern_doc_update_result){0};
        if (w.done) {
            /* MongoDB counts an upserted document in n, not as matched. */
            res->upserted = w.upserted;
            res->matched = (uint64_t)(w.n - (w.upserted ? 1 : 0));
            res->modified = (uint64_t)w.modified;
        }
    }
    return rc;
}

int tern_doc_update_one(struct tern_doc *doc, const char *db, const char *coll,
                        const bson_t *filter, const bson_t *update, bool upsert,
                        struct tern_doc_update_result *res)
{
    return update_sync(doc, db, coll, filter, update, upsert, false, res);
}

int tern_doc_update_many(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *filter, const bson_t *update, bool upsert,
                         struct tern_doc_update_result *res)
{
    return update_sync(doc, db, coll, filter, update, upsert, true, res);
}

int tern_doc_delete_async(struct tern_doc *doc, const char *db, const char *coll,
                          const bson_t *filter, bool multi, tern_doc_cb cb, void *arg)
{
    struct doc_op *op;
    bson_t arr, d;
    bool ok;

    if (!doc || !names_ok(db, coll) || !filter)
        return TERN_EINVAL;
    op = op_begin(doc, "delete", coll);
    if (!op)
        return TERN_ENOBUFS;
    ok = bson_append_array_begin(&op->cmd, "deletes", -1, &arr) &&
         bson_append_document_begin(&arr, "0", 1, &d) && BSON_APPEND_DOCUMENT(&d, "q", filter) &&
         BSON_APPEND_INT32(&d, "limit", multi ? 0 : 1) && bson_append_document_end(&arr, &d) &&
         bson_append_array_end(&op->cmd, &arr);
    return op_finish(doc, op, db, ok, cb, arg);
}

static int delete_sync(struct tern_doc *doc, const char *db, const char *coll,
                       const bson_t *filter, bool multi, uint64_t *deleted)
{
    struct waiter w = {0};
    int rc = SYNC(doc, &w, tern_doc_delete_async(doc, db, coll, filter, multi, wait_cb, &w));

    if (deleted)
        *deleted = w.done && w.n > 0 ? (uint64_t)w.n : 0;
    return rc;
}

int tern_doc_delete_one(struct tern_doc *doc, const char *db, const char *coll,
                        const bson_t *filter, uint64_t *deleted)
{
    return delete_sync(doc, db, coll, filter, false, deleted);
}

int tern_doc_delete_many(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *filter, uint64_t *deleted)
{
    return delete_sync(doc, db, coll, filter, true, deleted);
}

/* ---- reads ---- */

int tern_doc_count_async(struct tern_doc *doc, const char *db, const char *coll,
                         const bson_t *filter, tern_doc_cb cb, void *arg)
{
    struct doc_op *op;
    bson_t empty = BSON_INITIALIZER;

    if (!doc || !names_ok(db, coll))
        return TERN_EINVAL;
    op = op_begin(doc, "count", coll);
    if (!op)
        return TERN_ENOBUFS;
    return op_finish(doc, op, db, BSON_APPEND_DOCUMENT(&op->cmd, "query", filter ? filter : &empty),
                     cb, arg);
}

int tern_doc_count(struct tern_doc *doc, const char *db, const char *coll,
                   const bson_t *filter, uint64_t *n)
{
    struct waiter w = {0};
    int rc = SYNC(doc, &w, tern_doc_count_async(doc, db, coll, filter, wait_cb, &w));

    if (n)
        *n = rc == 0 && w.n > 0 ? (uint64_t)w.n : 0;
    return rc;
}

int tern_doc_find_id_async(struct tern_doc *doc, const char *db, const char *coll,
                           const bson_value_t *id, tern_doc_cb cb, void *arg)
{
    struct doc_op *op;
    bson_t f;
    bool ok;

    if (!doc || !names_ok(db, coll) || !id)
        return TERN_EINVAL;
    op = op_begin(doc, "find", coll);
    if (!op)
        return TERN_ENOBUFS;
    ok = bson_append_document_begin(&op->cmd, "filter", 6, &f) &&
         bson_append_value(&f, "_id", 3, id) && bson_append_document_end(&op->cmd, &f) &&
         BSON_APPEND_INT64(&op->cmd, "limit", 1) && BSON_APPEND_BOOL(&op->cmd, "singleBatch", true);
    return op_finish(doc, op, db, ok, cb, arg);
}

int tern_doc_find_id(struct tern_doc *doc, const char *db, const char *coll,
                     const bson_value_t *id, bson_t *out)
{
    struct waiter w = {.first = out};
    int rc;

    if (!out)
        return TERN_EINVAL;
    rc = SYNC(doc, &w, tern_doc_find_id_async(doc, db, coll, id, wait_cb, &w));
    if (rc == 0 && !w.found)
        rc = TERN_ENOENT;
    if (rc < 0 && w.found)
        bson_destroy(out);
    return rc;
}

/* ---- cursors ---- */

/* The slot a new cursor's batches may be put into, registering the
 * buffers the first time; -1 for inline. */
static int slot_take(struct tern_doc *doc)
{
    int i;

    if (!doc->s || doc->path == TERN_DOC_PATH_RPC ||
        !(tern_session_caps(doc->s) & TERN_TP_CAP_PUT))
        return -1;
    if (doc->path == TERN_DOC_PATH_AUTO &&
        !(tern_session_caps(doc->s) & TERN_TP_CAP_RMA_OFFLOAD))
        return -1;
    if (!doc->buf_mr) {
        /* Readable too: shm hands out only regions it can map, and x86 has
         * no write-only mapping; the server then stores straight into it.
         * It holds nothing but the batches the server wrote. */
        if (tern_rpc_mr_alloc(doc->ep, (size_t)TERN_DOC_BUF_SLOTS * TERN_DOC_BUF_SLOT,
                              TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE,
                              &doc->buf_mr) < 0) {
            doc->buf_mr = NULL;
            return -1;
        }
        doc->slot_free = TERN_DOC_BUF_SLOTS == 32 ? UINT32_MAX
                                                  : (1u << TERN_DOC_BUF_SLOTS) - 1;
    }
    if (!doc->slot_free)
        return -1;
    i = __builtin_ctz(doc->slot_free);
    doc->slot_free &= ~(1u << i);
    return i;
}

/* Ask for a push into the cursor's slot, if the path still says so for
 * the fabric the session is on now (an auto:// session may have moved). */
static void cursor_hdr(struct tern_doc_cursor *cur, struct doc_req *hdr, struct tern_session *s)
{
    struct tern_doc *doc = cur->doc;
    uint32_t caps = tern_session_caps(s), epoch = tern_session_epoch(s);

    *hdr = (struct doc_req){0};
    if (cur->slot < 0 || !(caps & TERN_TP_CAP_PUT))
        return;
    if (doc->path == TERN_DOC_PATH_AUTO && !(caps & TERN_TP_CAP_RMA_OFFLOAD))
        return;
    if (!doc->rkey_ok || doc->rkey_epoch != epoch || doc->rkey_s != s) {
        doc->rkey_ok = tern_rpc_mr_rkey(doc->buf_mr, s, &doc->rkey) == 0;
        doc->rkey_epoch = epoch;
        doc->rkey_s = s;
    }
    if (!doc->rkey_ok)
        return;
    hdr->flags = DOC_REQ_PUSH;
    hdr->cap = TERN_DOC_BUF_SLOT;
    hdr->off = (uint64_t)cur->slot * TERN_DOC_BUF_SLOT;
    hdr->min = doc->path == TERN_DOC_PATH_AUTO ? AUTO_PUSH_MIN : 0;
    hdr->dst = doc->rkey;
}

/* A cursor's reply: its id, namespace and batch. */
static void cursor_took(struct tern_doc_cursor *cur, const struct doc_rep *rep, const bson_t *r,
                        int status)
{
    struct tern_doc *doc = cur->doc;
    const uint8_t *data = NULL;
    uint32_t len = 0;
    bson_iter_t it, c;
    bool have = false;

    cur->in_batch = false;
    cur->status = status;
    if (status < 0)
        return;
    if (!bson_iter_init_find(&it, r, "cursor") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
        !bson_iter_recurse(&it, &c)) {
        cur->status = TERN_EPROTO;
        return;
    }
    cur->id = 0;
    while (bson_iter_next(&c)) {
        const char *k = bson_iter_key(&c);

        if (!strcmp(k, "id") && BSON_ITER_HOLDS_NUMBER(&c)) {
            cur->id = bson_iter_as_int64(&c);
        } else if (!strcmp(k, "ns") && BSON_ITER_HOLDS_UTF8(&c)) {
            const char *dot = strchr(bson_iter_utf8(&c, NULL), '.');

            if (dot)
                snprintf(cur->coll, sizeof(cur->coll), "%s", dot + 1);
        } else if ((!strcmp(k, "firstBatch") || !strcmp(k, "nextBatch")) &&
                   BSON_ITER_HOLDS_ARRAY(&c)) {
            bson_iter_array(&c, &len, &data);
            have = true;
        }
    }
    if (rep->flags & DOC_REP_PUSHED) {
        /* The data came before the reply (one session keeps the order); the
         * reply says how much of the slot is this batch. */
        if (cur->slot < 0 || rep->size > TERN_DOC_BUF_SLOT ||
            !bson_init_static(&cur->arr, (const uint8_t *)tern_rpc_mr_addr(doc->buf_mr) +
                                             (size_t)cur->slot * TERN_DOC_BUF_SLOT,
                              (size_t)rep->size)) {
            cur->status = TERN_EPROTO;
            return;
        }
        doc->st.batches_pushed++;
        doc->st.bytes_pushed += rep->size;
    } else {
        if (!have) {
            cur->status = TERN_EPROTO;
            return;
        }
        if (len > cur->own_cap) {
            uint8_t *p = realloc(cur->own, len);

            if (!p) {
                cur->status = TERN_ENOMEM;
                return;
            }
            cur->own = p;
            cur->own_cap = len;
        }
        memcpy(cur->own, data, len);
        if (!bson_init_static(&cur->arr, cur->own, len)) {
            cur->status = TERN_EPROTO;
            return;
        }
        doc->st.batches_inline++;
        doc->st.bytes_inline += len;
    }
    cur->in_batch = bson_iter_init(&cur->it, &cur->arr);
    if (!cur->in_batch)
        cur->status = TERN_EPROTO;
}

static struct tern_doc_cursor *cursor_new(struct tern_doc *doc, const char *db, const char *coll)
{
    struct tern_doc_cursor *cur = calloc(1, sizeof(*cur));

    if (!cur)
        return NULL;
    cur->doc = doc;
    snprintf(cur->db, sizeof(cur->db), "%s", db);
    snprintf(cur->coll, sizeof(cur->coll), "%s", coll);
    cur->slot = slot_take(doc);
    cur->next = doc->cursors;
    if (doc->cursors)
        doc->cursors->prev = cur;
    doc->cursors = cur;
    return cur;
}

static void cursor_free(struct tern_doc_cursor *cur)
{
    struct tern_doc *doc = cur->doc;

    if (doc) {
        if (cur->slot >= 0)
            doc->slot_free |= 1u << cur->slot;
        if (cur->prev)
            cur->prev->next = cur->next;
        else
            doc->cursors = cur->next;
        if (cur->next)
            cur->next->prev = cur->prev;
    }
    free(cur->own);
    free(cur);
}

/* Send the op for `cur` and wait for its reply. */
static int cursor_call(struct tern_doc_cursor *cur, struct doc_op *op, const char *db, bool ok)
{
    struct waiter w = {0};
    int rc;

    op->cur = cur;
    if (op->pinned)
        op->to = cur->s;
    else
        op->to = cur->doc->s;
    if (!op->to) {
        op_put(op);
        return TERN_ENOTCONN;       /* its server's session is gone */
    }
    cursor_hdr(cur, &op->hdr, op->to);
    rc = SYNC(cur->doc, &w, op_finish(cur->doc, op, db, ok, wait_cb, &w));
    if (rc == 0 && cur->status < 0)
        rc = cur->status;
    return rc;
}

static int cursor_open(struct tern_doc *doc, const char *db, const char *coll, struct doc_op *op,
                       bool ok, struct tern_doc_cursor **out)
{
    struct tern_doc_cursor *cur = cursor_new(doc, db, coll);
    int rc;

    if (!cur) {
        op_put(op);
        return TERN_ENOMEM;
    }
    rc = cursor_call(cur, op, db, ok);
    if (rc < 0) {
        cursor_free(cur);
        return rc;
    }
    *out = cur;
    return 0;
}

/* find's options, copied as they are; batchSize is kept for getMore. */
static bool append_opts(bson_t *cmd, const bson_t *opts, int32_t *batch_size)
{
    bson_iter_t it;
    bool ok = true;

    if (!opts || !bson_iter_init(&it, opts))
        return true;
    while (ok && bson_iter_next(&it)) {
        if (!strcmp(bson_iter_key(&it), "batchSize") && BSON_ITER_HOLDS_NUMBER(&it))
            *batch_size = (int32_t)bson_iter_as_int64(&it);
        ok = bson_append_iter(cmd, NULL, 0, &it);
    }
    return ok;
}

int tern_doc_find(struct tern_doc *doc, const char *db, const char *coll, const bson_t *filter,
                  const bson_t *opts, struct tern_doc_cursor **out)
{
    struct doc_op *op;
    int32_t batch = 0;
    bool ok;
    int rc;

    if (!doc || !names_ok(db, coll) || !out)
        return TERN_EINVAL;
    op = op_begin(doc, "find", coll);
    if (!op)
        return TERN_ENOBUFS;
    ok = (!filter || BSON_APPEND_DOCUMENT(&op->cmd, "filter", filter)) &&
         append_opts(&op->cmd, opts, &batch);
    rc = cursor_open(doc, db, coll, op, ok, out);
    if (rc == 0)
        (*out)->batch_size = batch;
    return rc;
}

int tern_doc_aggregate(struct tern_doc *doc, const char *db, const char *coll,
                       const bson_t *pipeline, const bson_t *opts,
                       struct tern_doc_cursor **out)
{
    struct doc_op *op;
    bson_iter_t it, ci;
    int32_t batch = 0;
    bson_t c;
    bool ok;
    int rc;

    if (!doc || !names_ok(db, coll) || !pipeline || !out)
        return TERN_EINVAL;
    op = op_begin(doc, "aggregate", coll);
    if (!op)
        return TERN_ENOBUFS;
    ok = BSON_APPEND_ARRAY(&op->cmd, "pipeline", pipeline) && append_opts(&op->cmd, opts, &batch);
    if (ok && !(opts && bson_iter_init_find(&it, opts, "cursor")))
        ok = bson_append_document_begin(&op->cmd, "cursor", 6, &c) &&
             bson_append_document_end(&op->cmd, &c);
    /* aggregate's batchSize lies inside "cursor". */
    if (opts && bson_iter_init(&it, opts) && bson_iter_find_descendant(&it, "cursor.batchSize", &ci) &&
        BSON_ITER_HOLDS_NUMBER(&ci))
        batch = (int32_t)bson_iter_as_int64(&ci);
    rc = cursor_open(doc, db, coll, op, ok, out);
    if (rc == 0)
        (*out)->batch_size = batch;
    return rc;
}

int tern_doc_cursor_next(struct tern_doc_cursor *cur, const bson_t **view)
{
    if (!cur || !view)
        return TERN_EINVAL;
    if (!cur->doc)
        return TERN_ENOTCONN;
    for (;;) {
        struct doc_op *op;
        bool ok;
        int rc;

        if (cur->status < 0)
            return cur->status;
        while (cur->in_batch && bson_iter_next(&cur->it)) {
            const uint8_t *data;
            uint32_t len;

            if (!BSON_ITER_HOLDS_DOCUMENT(&cur->it))
                continue;
            bson_iter_document(&cur->it, &len, &data);
            if (!bson_init_static(&cur->view, data, len))
                continue;
            *view = &cur->view;
            return 1;
        }
        cur->in_batch = false;
        if (!cur->id)
            return 0;
        op = op_get(cur->doc);
        if (!op)
            return TERN_ENOBUFS;
        ok = BSON_APPEND_INT64(&op->cmd, "getMore", cur->id) &&
             BSON_APPEND_UTF8(&op->cmd, "collection", cur->coll) &&
             (!cur->batch_size || BSON_APPEND_INT32(&op->cmd, "batchSize", cur->batch_size));
        op->pinned = true;
        rc = cursor_call(cur, op, cur->db, ok);
        if (rc < 0) {
            cur->status = rc;
            return rc;
        }
    }
}

void tern_doc_cursor_close(struct tern_doc_cursor *cur)
{
    struct tern_doc *doc;
    struct doc_op *op;

    if (!cur)
        return;
    doc = cur->doc;
    /* The server's side goes without a wait: with no op free, or the
     * session gone, it ends with the session or when it sits idle. */
    if (doc && cur->id && cur->s && (op = op_begin(doc, "killCursors", cur->coll)) != NULL) {
        bson_t arr;
        bool ok = bson_append_array_begin(&op->cmd, "cursors", 7, &arr) &&
                  BSON_APPEND_INT64(&arr, "0", cur->id) &&
                  bson_append_array_end(&op->cmd, &arr);

        op->pinned = true;
        op->to = cur->s;
        op_finish(doc, op, cur->db, ok, NULL, NULL);
    }
    cursor_free(cur);
}

/* ---- indexes and collections ---- */

/* MongoDB's default index name: each field and its value joined by '_'. */
static bool index_name(const bson_t *keys, char *buf, size_t cap)
{
    bson_iter_t it;
    size_t off = 0;

    if (!bson_iter_init(&it, keys))
        return false;
    buf[0] = 0;
    while (bson_iter_next(&it)) {
        char val[64];
        int n;

        if (BSON_ITER_HOLDS_UTF8(&it))
            snprintf(val, sizeof(val), "%s", bson_iter_utf8(&it, NULL));
        else if (BSON_ITER_HOLDS_NUMBER(&it))
            snprintf(val, sizeof(val), "%lld", (long long)bson_iter_as_int64(&it));
        else
            return false;
        n = snprintf(buf + off, cap - off, "%s%s_%s", off ? "_" : "", bson_iter_key(&it), val);
        if (n < 0 || (size_t)n >= cap - off)
            return false;
        off += (size_t)n;
    }
    return off > 0;
}

static int simple(struct tern_doc *doc, struct doc_op *op, const char *db, bool ok)
{
    struct waiter w = {0};

    return SYNC(doc, &w, op_finish(doc, op, db, ok, wait_cb, &w));
}

int tern_doc_create_index(struct tern_doc *doc, const char *db, const char *coll,
                          const bson_t *keys, const char *name, bool unique)
{
    char def[1024];
    struct doc_op *op;
    bson_t arr, spec;
    bool ok;

    if (!doc || !names_ok(db, coll) || !keys || bson_empty(keys))
        return TERN_EINVAL;
    if (!name) {
        if (!index_name(keys, def, sizeof(def)))
            return TERN_EINVAL;
        name = def;
    }
    op = op_begin(doc, "createIndexes", coll);
    if (!op)
        return TERN_ENOBUFS;
    ok = bson_append_array_begin(&op->cmd, "indexes", 7, &arr) &&
         bson_append_document_begin(&arr, "0", 1, &spec) &&
         BSON_APPEND_DOCUMENT(&spec, "key", keys) && BSON_APPEND_UTF8(&spec, "name", name) &&
         (!unique || BSON_APPEND_BOOL(&spec, "unique", true)) &&
         bson_append_document_end(&arr, &spec) && bson_append_array_end(&op->cmd, &arr);
    return simple(doc, op, db, ok);
}

int tern_doc_drop_index(struct tern_doc *doc, const char *db, const char *coll,
                        const char *name)
{
    struct doc_op *op;

    if (!doc || !names_ok(db, coll) || !name)
        return TERN_EINVAL;
    op = op_begin(doc, "dropIndexes", coll);
    if (!op)
        return TERN_ENOBUFS;
    return simple(doc, op, db, BSON_APPEND_UTF8(&op->cmd, "index", name));
}

int tern_doc_drop(struct tern_doc *doc, const char *db, const char *coll)
{
    struct doc_op *op;

    if (!doc || !names_ok(db, coll))
        return TERN_EINVAL;
    op = op_begin(doc, "drop", coll);
    if (!op)
        return TERN_ENOBUFS;
    return simple(doc, op, db, true);
}

/* ---- the client ---- */

int tern_doc_set_path(struct tern_doc *doc, enum tern_doc_path path)
{
    if (!doc || (path != TERN_DOC_PATH_RPC && path != TERN_DOC_PATH_ONESIDED &&
                 path != TERN_DOC_PATH_AUTO))
        return TERN_EINVAL;
    doc->path = path;
    return 0;
}

void tern_doc_get_stats(const struct tern_doc *doc, struct tern_doc_stats *st)
{
    *st = doc->st;
}

void tern_doc_set_timeout(struct tern_doc *doc, uint64_t timeout_ns)
{
    doc->timeout = timeout_ns;
}

int tern_doc_open(struct tern_rpc_ep *ep, const char *const *uris, unsigned n,
                  uint64_t timeout_ns, struct tern_doc **out)
{
    struct tern_doc *doc;
    int rc = TERN_EINVAL, first = 0;

    if (!ep || !uris || !n || !out)
        return TERN_EINVAL;
    doc = calloc(1, sizeof(*doc));
    if (!doc)
        return TERN_ENOMEM;
    doc->ep = ep;
    doc->timeout = DEFAULT_TIMEOUT;
    doc->path = TERN_DOC_PATH_AUTO;
    doc->err.index = -1;
    /* tern's default max_msg, less room for the command around them */
    doc->insert_budget = (1u << 20) - 4096;
    for (unsigned i = DOC_OPS; i > 0; i--) {
        doc->ops[i - 1].doc = doc;
        bson_init(&doc->ops[i - 1].cmd);
        op_put(&doc->ops[i - 1]);
    }
    if (n > DOC_REPLICAS_MAX) {
        tern_doc_close(doc);
        return TERN_EINVAL;
    }
    doc->n_rep = n;
    doc->connect_ns = timeout_ns ? timeout_ns : 2000000000ull;
    for (unsigned i = 0; i < n; i++)
        if (!uris[i] || snprintf(doc->uris[i], sizeof(doc->uris[i]), "%s", uris[i]) >=
                            (int)sizeof(doc->uris[i])) {
            tern_doc_close(doc);
            return TERN_EINVAL;
        }
    /* Every one now (a call refused by one goes on to the next at once);
     * calls go to the first that answers. */
    for (unsigned i = 0; i < n; i++) {
        struct doc_wire_stats st;
        size_t len;
        int r1 = tern_rpc_connect(ep, uris[i], timeout_ns, &doc->rs[i]);

        /* Is the service there? */
        if (r1 == 0)
            r1 = tern_call_sync(doc->rs[i], TERN_DOC_SERVICE_ID, DOC_M_STATS, NULL, 0, &st,
                                sizeof(st), &len, timeout_ns);
        if (r1 == 0 && len != sizeof(st))
            r1 = TERN_EPROTO;
        if (r1 == 0) {
            if (!doc->s) {
                doc->s = doc->rs[i];
                doc->cur_rep = i;
            }
            rc = 0;
            continue;
        }
        tern_log(n > 1 ? TERN_LOG_WARN : TERN_LOG_ERROR, "doc", "%s: %s", uris[i],
                 tern_strerror(r1));
        if (doc->rs[i])
            tern_rpc_disconnect(doc->rs[i]);
        doc->rs[i] = NULL;
        doc->redial_at[i] = tern_now_ns() + REDIAL_NS;
        if (!first)
            first = r1;
        if (!doc->s)
            rc = r1;
    }
    if (rc < 0) {
        tern_doc_close(doc);
        return first;
    }
    /* The set's members, if it is one: those not given are dialled now
     * too, so that the first refusal finds them. */
    doc->members_due = true;
    doc_learn(doc);
    while (doc->members_asked && tern_rpc_poll(ep) >= 0)
        ;
    for (unsigned i = n; i < doc->n_rep; i++)
        if (tern_rpc_connect(ep, doc->uris[i], timeout_ns, &doc->rs[i]) < 0) {
            doc->rs[i] = NULL;
            doc->redial_at[i] = tern_now_ns() + REDIAL_NS;
        }
    *out = doc;
    return 0;
}

void tern_doc_close(struct tern_doc *doc)
{
    if (!doc)
        return;
    /* Calls in flight end here with TERN_ECANCELED, their cursors still
     * there to hear it; then the cursors are left to be closed. */
    doc->closing = true;
    for (unsigned i = 0; i < doc->n_rep; i++)
        if (doc->rs[i])
            tern_rpc_disconnect(doc->rs[i]);
    for (struct tern_doc_cursor *cur = doc->cursors, *next; cur; cur = next) {
        next = cur->next;
        cur->doc = NULL;
        cur->slot = -1;
        cur->in_batch = false;
        cur->prev = cur->next = NULL;
    }
    if (doc->buf_mr)
        tern_rpc_mr_dereg(doc->buf_mr);
    for (unsigned i = 0; i < DOC_OPS; i++)
        bson_destroy(&doc->ops[i].cmd);
    free(doc);
}
