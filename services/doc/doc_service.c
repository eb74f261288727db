/* The native document service: each request is a MongoDB command document
 * that runs through doc_cmd_run, as the wire gateway's do, on the
 * doc_client of the session it came on (made at the session's first
 * request, freed when it closes, which ends its cursors). A command that
 * wrote is made durable (doc_server_sync: one flush for every write since
 * the last) before its reply is built.
 *
 * RMongo's result path: a request may name a buffer of the client's; a
 * cursor batch that fits goes there by one-sided put from a staging slot
 * of ours, posted before the reply so that it reaches the client first
 * (rpc.h), and the reply carries the rest of the command's answer with
 * the batch left empty. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc.h"
#include "doc_cmd.h"
#include "doc_service.h"
#include "doc_wire.h"
#include "error.h"
#include "log.h"
#include "mongo_wire.h"

#define TICK_NS 1000000000ull   /* how often idle cursors are looked for */

struct sess_ent {
    struct tern_session *s;      /* NULL: free */
    struct doc_client *c;
    uint32_t put_max;            /* the largest put its fabric took; 0: untried */
    uint32_t epoch;              /* of the session, when put_max was learnt */
};

struct stage_slot {
    unsigned pending;            /* puts from it in flight */
};

struct tern_doc_service {
    struct doc_store *store;     /* ours to close; NULL for doc_service_new's */
    struct doc_server *srv;
    bool own_srv;
    struct tern_service def;
    size_t max_msg;
    /* Replies are built here and copied once into the send buffer; both
     * keep their memory between requests. */
    bson_t reply, slim;
    /* Sessions' clients: open addressing on the session pointer. */
    struct sess_ent *tab;
    size_t cap, n;
    uint64_t peers;              /* clients made, to name them */
    /* One-sided batches: staging slots, registered on the endpoint. */
    struct tern_rpc_mr *stage_mr;
    struct stage_slot *slots;
    unsigned n_slots;
    size_t slot_size;
    uint64_t last_tick;
    bool group_commit;           /* replies of writes wait for the poll's flush */
    struct tern_doc_service_stats st;
};

/* ---- sessions' clients ---- */

static size_t sess_hash(const struct tern_session *s, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)s * 0x9e3779b97f4a7c15ull;

    return (size_t)(h >> 32) & (cap - 1);
}

static struct sess_ent *sess_find(struct tern_doc_service *svc, const struct tern_session *s)
{
    if (!svc->cap)
        return NULL;
    for (size_t i = sess_hash(s, svc->cap);; i = (i + 1) & (svc->cap - 1)) {
        if (svc->tab[i].s == s)
            return &svc->tab[i];
        if (!svc->tab[i].s)
            return NULL;
    }
}

static void sess_place(struct sess_ent *tab, size_t cap, struct sess_ent e)
{
    size_t i = sess_hash(e.s, cap);

    while (tab[i].s)
        i = (i + 1) & (cap - 1);
    tab[i] = e;
}

static int sess_grow(struct tern_doc_service *svc)
{
    size_t cap = svc->cap ? svc->cap * 2 : 64;
    struct sess_ent *tab = calloc(cap, sizeof(*tab));

    if (!tab)
        return TERN_ENOMEM;
    for (size_t i = 0; i < svc->cap; i++)
        if (svc->tab[i].s)
            sess_place(tab, cap, svc->tab[i]);
    free(svc->tab);
    svc->tab = tab;
    svc->cap = cap;
    return 0;
}

/* The entry of session `s`, its client made at its first request. */
static struct sess_ent *client_of(struct tern_doc_service *svc, struct tern_session *s)
{
    struct sess_ent *e = sess_find(svc, s);
    char peer[64];
    struct doc_client *c;

    if (e)
        return e;
    if ((svc->n + 1) * 2 > svc->cap && sess_grow(svc) < 0)
        return NULL;
    snprintf(peer, sizeof(peer), "tern-%s:%llu", tern_session_fabric(s),
             (unsigned long long)++svc->peers);
    c = doc_client_new(svc->srv, peer);
    if (!c)
        return NULL;
    sess_place(svc->tab, svc->cap, (struct sess_ent){.s = s, .c = c});
    svc->n++;
    return sess_find(svc, s);
}

/* Remove the session's entry, closing the gap so probes still find the
 * entries placed past it. */
static void session_closed(struct tern_session *s, void *ctx)
{
    struct tern_doc_service *svc = ctx;
    struct sess_ent *e = sess_find(svc, s);
    size_t i, j;

    if (!e)
        return;
    doc_client_free(e->c);
    svc->n--;
    i = (size_t)(e - svc->tab);
    svc->tab[i] = (struct sess_ent){0};
    for (j = (i + 1) & (svc->cap - 1); svc->tab[j].s; j = (j + 1) & (svc->cap - 1)) {
        struct sess_ent moved = svc->tab[j];

        svc->tab[j] = (struct sess_ent){0};
        sess_place(svc->tab, svc->cap, moved);
    }
}

/* ---- one-sided batches ---- */

static void push_done(void *arg, int status)
{
    struct stage_slot *slot = arg;

    /* A failed put leaves the client's buffer as it was: the client reads
     * it only as far as the reply says, and a reply never follows a put
     * that did not land (the session dies with it). */
    (void)status;
    slot->pending--;
}

static int slot_get(struct tern_doc_service *svc)
{
    for (unsigned i = 0; i < svc->n_slots; i++)
        if (!svc->slots[i].pending)
            return (int)i;
    return -1;
}

/* The reply's cursor batch: its array's bytes and the field's name. */
static bool find_batch(const bson_t *reply, const uint8_t **data, uint32_t *len,
                       const char **key)
{
    bson_iter_t it, child;

    if (!bson_iter_init_find(&it, reply, "cursor") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
        !bson_iter_recurse(&it, &child))
        return false;
    while (bson_iter_next(&child)) {
        const char *k = bson_iter_key(&child);

        if ((!strcmp(k, "firstBatch") || !strcmp(k, "nextBatch")) &&
            BSON_ITER_HOLDS_ARRAY(&child)) {
            bson_iter_array(&child, len, data);
            *key = k;
            return true;
        }
    }
    return false;
}

/* `reply` with its cursor batch left empty, into svc->slim. */
static bool slim_reply(struct tern_doc_service *svc, const bson_t *reply, const char *batch)
{
    bson_iter_t it, ci;
    bson_t cur, arr;
    bool ok = true;

    bson_reinit(&svc->slim);
    if (!bson_iter_init(&it, reply))
        return false;
    while (ok && bson_iter_next(&it)) {
        if (strcmp(bson_iter_key(&it), "cursor") != 0) {
            ok = bson_append_iter(&svc->slim, NULL, 0, &it);
            continue;
        }
        ok = bson_append_document_begin(&svc->slim, "cursor", 6, &cur) &&
             bson_iter_recurse(&it, &ci);
        while (ok && bson_iter_next(&ci)) {
            if (!strcmp(bson_iter_key(&ci), batch))
                ok = bson_append_array_begin(&cur, batch, -1, &arr) &&
                     bson_append_array_end(&cur, &arr);
            else
                ok = bson_append_iter(&cur, NULL, 0, &ci);
        }
        ok = ok && bson_append_document_end(&svc->slim, &cur);
    }
    return ok;
}

/* Put `len` bytes of slot i at `dst` + `off`, in pieces as large as the
 * session's fabric takes (on shm and ntb a one-sided operation is one ring
 * record), learnt by halving from the whole. */
static int put_pieces(struct tern_doc_service *svc, struct sess_ent *e, int i, uint32_t len,
                      const struct doc_req *q)
{
    uint32_t epoch = tern_session_epoch(e->s), off = 0;
    size_t base = (size_t)i * svc->slot_size;

    if (e->epoch != epoch || !e->put_max) {
        e->epoch = epoch;
        e->put_max = (uint32_t)svc->slot_size;
    }
    while (off < len) {
        uint32_t n = len - off < e->put_max ? len - off : e->put_max;
        int rc = tern_session_put(e->s, svc->stage_mr, base + off, n, &q->dst, q->off + off,
                                  push_done, &svc->slots[i]);

        if (rc == TERN_EMSGSIZE && n > 4096) {
            e->put_max = n / 2;
            continue;
        }
        if (rc < 0)
            return rc;
        svc->slots[i].pending++;
        off += n;
    }
    return 0;
}

/* Where the client's buffer can be mapped here (shm), the batch is one
 * memcpy into it: no staging copy, no completion, and no limit of a ring
 * record on its size. Visible to the client before the reply, which is
 * posted after (a post is a release). While the mapping is being set up
 * (the first ask starts it) the batch goes inline, never by served puts:
 * those would be in flight at the next request and keep the mapping from
 * being used (rkey_ptr waits for them), batch after batch. */
static bool store_direct(struct sess_ent *e, const struct doc_req *q, const uint8_t *data,
                         uint32_t len)
{
    void *p;

    if (tern_session_rkey_ptr(e->s, &q->dst, q->off, len, TERN_TP_ACCESS_REMOTE_WRITE, &p) < 0)
        return false;
    memcpy(p, data, len);
    return true;
}

/* Put the reply's batch into the client's buffer if the request asked and
 * it fits: true with *rep filled and svc->slim the reply to send. Any
 * failure to put sends it inline instead (pieces put already land in the
 * client's buffer unread: the reply does not say they are there). */
static bool push_batch(struct tern_doc_service *svc, struct sess_ent *e, const struct doc_req *q,
                       struct doc_rep *rep)
{
    const uint8_t *data;
    const char *key;
    uint32_t len;
    bson_t arr;
    int i;

    if (!(q->flags & DOC_REQ_PUSH) || !svc->stage_mr ||
        !find_batch(&svc->reply, &data, &len, &key))
        return false;
    /* The key's own length too: a put past it is refused only where the
     * peer serves it (tcp), after this reply would have said "pushed". */
    if (len < q->min || len > q->cap || len > svc->slot_size || q->dst.len < q->off ||
        len > q->dst.len - q->off || !slim_reply(svc, &svc->reply, key))
        return false;
    if (tern_session_caps(e->s) & TERN_TP_CAP_RKEY_PTR) {
        if (!store_direct(e, q, data, len))
            return false;
    } else {
        i = slot_get(svc);
        if (i < 0)
            return false;
        memcpy((uint8_t *)tern_rpc_mr_addr(svc->stage_mr) + (size_t)i * svc->slot_size, data, len);
        if (put_pieces(svc, e, i, len, q) < 0)
            return false;   /* a bad key, a full queue: the batch goes inline */
    }
    rep->flags = DOC_REP_PUSHED;
    rep->size = len;
    rep->n = bson_init_static(&arr, data, len) ? bson_count_keys(&arr) : 0;
    return true;
}

/* ---- handlers ---- */

/* Nesting deeper than MongoDB's maxBSONDepth is refused before anything
 * recurses into it: libbson's bson_validate recurses once per level (and
 * per code-with-scope scope), and a request of max_msg bytes nests far
 * enough to overflow the stack. An explicit stack of iterators, as the
 * wire gateway's walk (mongo_wire.c), so both ways in refuse alike
 * (doc_cmd_run's own bound answers InvalidBSON, the gateway Overflow).
 * Each level goes through bson_init_static, which checks its length and
 * closing NUL. */
static int depth_ok(const bson_t *cmd, struct doc_err *e)
{
    struct level {
        bson_iter_t it;          /* a struct: bson_iter_t is aligned past its size */
    } stack[MONGO_MAX_DEPTH];
    const uint8_t *data;
    uint32_t len, code_len;
    bson_t sub;
    int top = 0;

    if (!bson_iter_init(&stack[0].it, cmd))
        return doc_errf(e, DOC_InvalidBSON, "invalid BSON: bad document length");
    for (;;) {
        bson_iter_t *it = &stack[top].it;

        if (!bson_iter_next(it)) {
            if (it->err_off)
                return doc_errf(e, DOC_InvalidBSON, "invalid BSON at offset %u", it->err_off);
            if (top == 0)
                return 0;
            top--;
            continue;
        }
        switch (bson_iter_type(it)) {
        case BSON_TYPE_DOCUMENT:
            bson_iter_document(it, &len, &data);
            break;
        case BSON_TYPE_ARRAY:
            bson_iter_array(it, &len, &data);
            break;
        case BSON_TYPE_CODEWSCOPE:
            bson_iter_codewscope(it, &code_len, &len, &data);
            break;
        default:
            continue;
        }
        if (top + 1 == MONGO_MAX_DEPTH)
            return doc_errf(e, DOC_Overflow, "BSONObj exceeded maximum nested object depth: %d",
                            MONGO_MAX_DEPTH);
        if (!data || !bson_init_static(&sub, data, len) || !bson_iter_init(&stack[top + 1].it, &sub))
            return doc_errf(e, DOC_InvalidBSON, "invalid BSON: bad embedded document");
        top++;
    }
}

static int reply_with(struct tern_req *req, const bson_t *body, const struct doc_rep *rep)
{
    uint8_t *out = tern_reply_alloc(req, sizeof(*rep) + body->len);

    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, rep, sizeof(*rep));
    memcpy(out + sizeof(*rep), bson_get_data(body), body->len);
    return 0;
}

static int h_cmd(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_doc_service *svc = ctx;
    struct doc_rep rep = {0};
    struct doc_err de = {0};
    struct sess_ent *e;
    struct doc_req q;
    const bson_t *body;
    uint64_t now;
    bson_t cmd;
    bool wrote, gated;
    int flags;

    if (len < sizeof(q))
        return TERN_EPROTO;
    memcpy(&q, data, sizeof(q));
    if ((q.flags & ~(uint32_t)DOC_REQ_PUSH) || q.reserved)
        return TERN_EPROTO;
    if (!bson_init_static(&cmd, (const uint8_t *)data + sizeof(q), len - sizeof(q)))
        return TERN_EPROTO;
    bson_reinit(&svc->reply);
    /* doc_cmd_run validates the rest (InvalidBSON, as for the gateway). */
    if (depth_ok(&cmd, &de) < 0) {
        /* As the gateway answers it: a failed command (Overflow,
         * InvalidBSON), the session goes on. */
        doc_cmd_sync_failed(&de, &svc->reply);
        return reply_with(req, &svc->reply, &rep);
    }
    now = tern_now_ns();
    if (now - svc->last_tick >= TICK_NS) {
        svc->last_tick = now;
        doc_server_tick(svc->srv, now / 1000000u);
    }
    e = client_of(svc, tern_req_session(req));
    if (!e)
        return TERN_ENOMEM;
    svc->st.commands++;
    flags = doc_cmd_run(e->c, &cmd, NULL, 0, &svc->reply);
    wrote = (flags & DOC_CMD_WROTE) != 0;
    /* A replicated store's replies wait at the group's gates; a write's
     * is durable here first (a gated reply skips the poll's hold). */
    gated = doc_server_replicated(svc->srv) && (flags & (DOC_CMD_WROTE | DOC_CMD_READ));
    if (wrote && svc->group_commit && !gated) {
        tern_req_hold(req);     /* durable at the end of the poll (group_flush) */
    } else if (wrote) {
        struct doc_err se = {0};

        if (doc_server_sync(svc->srv, &se) < 0) {
            bson_reinit(&svc->reply);
            doc_cmd_sync_failed(&se, &svc->reply);
        }
    }
    if (gated)
        doc_server_hold(svc->srv, req, flags);
    body = &svc->reply;
    if (push_batch(svc, e, &q, &rep)) {
        body = &svc->slim;
        svc->st.batches_pushed++;
    } else if (q.flags & DOC_REQ_PUSH) {
        svc->st.batches_inline++;
    }
    return reply_with(req, body, &rep);
}

static int h_stats(struct tern_req *req, const void *data, size_t len, void *ctx)
{
    struct tern_doc_service *svc = ctx;
    struct tern_doc_service_stats st;
    struct doc_wire_stats *w;

    (void)data;
    if (len)
        return TERN_EPROTO;
    w = tern_reply_alloc(req, sizeof(*w));
    if (!w)
        return TERN_EMSGSIZE;
    tern_doc_service_get_stats(svc, &st);
    *w = (struct doc_wire_stats){.commands = st.commands, .batches_pushed = st.batches_pushed,
                                 .batches_inline = st.batches_inline, .sessions = st.sessions,
                                 .cursors_open = st.cursors_open};
    return 0;
}

static const struct tern_method doc_methods[] = {
    {.id = DOC_M_CMD, .name = "cmd", .handler = h_cmd},
    {.id = DOC_M_STATS, .name = "stats", .handler = h_stats},
};

/* ---- the service ---- */

int doc_service_new(struct doc_server *srv, size_t max_msg, struct tern_doc_service **out)
{
    struct tern_doc_service *svc;

    if (!srv || !out)
        return TERN_EINVAL;
    svc = calloc(1, sizeof(*svc));
    if (!svc)
        return TERN_ENOMEM;
    svc->srv = srv;
    svc->max_msg = max_msg ? max_msg : 1u << 20;
    bson_init(&svc->reply);
    bson_init(&svc->slim);
    svc->def = (struct tern_service){
        .name = "doc", .id = TERN_DOC_SERVICE_ID, .methods = doc_methods,
        .n_methods = sizeof(doc_methods) / sizeof(doc_methods[0]), .ctx = svc,
        .session_closed = session_closed,
    };
    *out = svc;
    return 0;
}

int tern_doc_service_open(const struct tern_doc_service_opts *o, struct tern_doc_service **out)
{
    struct doc_store_opts so = {0};
    struct doc_server_opts sv = {0};
    struct doc_store *store;
    struct doc_server *srv;
    struct doc_err e = {0};
    size_t max_msg;
    int rc;

    if (!o || !o->pool_path || !out)
        return TERN_EINVAL;
    max_msg = o->max_msg ? o->max_msg : 1u << 20;
    so.pool_size = o->pool_size;
    so.seg_size = o->seg_size;
    so.create = true;
    if (doc_store_open(o->pool_path, &so, &store, &e) < 0) {
        tern_log(TERN_LOG_ERROR, "doc", "%s: %s (%s)", o->pool_path, e.msg, doc_code_name(e.code));
        return TERN_EDOC;
    }
    /* A batch and the rest of its reply (cursor id, namespace, each
     * element's index key) must fit in one message. */
    sv.max_batch_bytes = o->max_batch_bytes ? o->max_batch_bytes : max_msg - max_msg / 8;
    if (sv.max_batch_bytes > max_msg - max_msg / 8) {
        doc_store_close(store);
        return TERN_EINVAL;
    }
    rc = doc_server_open(store, &sv, &srv);
    if (rc < 0) {
        doc_store_close(store);
        return rc;
    }
    rc = doc_service_new(srv, max_msg, out);
    if (rc < 0) {
        doc_server_close(srv);
        doc_store_close(store);
        return rc;
    }
    (*out)->store = store;
    (*out)->own_srv = true;
    return 0;
}

const struct tern_service *tern_doc_service_def(struct tern_doc_service *svc)
{
    return &svc->def;
}

int tern_doc_service_enable_onesided(struct tern_doc_service *svc, struct tern_rpc_ep *ep,
                                     unsigned slots)
{
    int rc;

    if (!svc || !ep || svc->stage_mr)
        return TERN_EINVAL;
    svc->n_slots = slots ? slots : 8;
    svc->slot_size = svc->max_msg;
    svc->slots = calloc(svc->n_slots, sizeof(*svc->slots));
    if (!svc->slots)
        return TERN_ENOMEM;
    rc = tern_rpc_mr_alloc(ep, svc->n_slots * svc->slot_size, TERN_TP_ACCESS_LOCAL,
                           &svc->stage_mr);
    if (rc < 0) {
        free(svc->slots);
        svc->slots = NULL;
        svc->stage_mr = NULL;
    }
    return rc;
}

void tern_doc_service_get_stats(const struct tern_doc_service *svc,
                                struct tern_doc_service_stats *st)
{
    struct doc_server_stats ss;

    *st = svc->st;
    doc_server_stats(svc->srv, &ss);
    st->sessions = svc->n;
    st->cursors_open = ss.cursors_open;
}

/* The endpoint's hold hook: every write of the poll made durable at once. */
static int group_flush(void *arg)
{
    struct tern_doc_service *svc = arg;
    struct doc_err e = {0};

    if (doc_server_sync(svc->srv, &e) < 0) {
        tern_log(TERN_LOG_ERROR, "doc", "group commit: %s", e.msg);
        return TERN_EIO;
    }
    return 0;
}

int tern_doc_service_group_commit(struct tern_doc_service *svc, struct tern_rpc_ep *ep)
{
    int rc;

    if (!svc || !ep)
        return TERN_EINVAL;
    if (svc->group_commit)
        return 0;
    rc = tern_rpc_add_hold_hook(ep, group_flush, svc);
    if (rc == 0)
        svc->group_commit = true;
    return rc;
}

void tern_doc_service_close(struct tern_doc_service *svc)
{
    if (!svc)
        return;
    for (size_t i = 0; i < svc->cap; i++)
        if (svc->tab[i].s)
            doc_client_free(svc->tab[i].c);
    free(svc->tab);
    /* The staging registration went with the endpoint (doc_service.h). */
    free(svc->slots);
    bson_destroy(&svc->reply);
    bson_destroy(&svc->slim);
    if (svc->own_srv) {
        doc_server_close(svc->srv);
        doc_store_close(svc->store);
    }
    free(svc);
}
