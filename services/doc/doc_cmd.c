/* MongoDB's commands over a document store: see doc_cmd.h.
 *
 * Each command parses its own fields with one pass of bson_iter over the
 * command; fields it does not know (driver options, session and cluster
 * metadata) are ignored rather than refused, since every driver version
 * adds some. An argument of the wrong type is refused as MongoDB's IDL
 * parser refuses it (TypeMismatch, "BSON field 'find.limit' is the wrong
 * type ..."), so a client's error handling sees what it expects.
 *
 * Cursors come in two forms. A find whose order the store's scan gives
 * (no sort, or a sort an index provides) keeps its scan open and reads
 * lazily from one batch to the next: a scan is a position in an index and
 * survives writes between getMores. Anything else (a sort the scan cannot
 * give, an aggregation, the listings) is computed whole into a buffer of
 * BSON documents back to back, and batches are cut from that. Either way a
 * batch stops at the requested count or before max_batch_bytes, and a
 * document that did not fit waits in the cursor for the next batch.
 *
 * Cursors are on two lists in order of last use: their client's (for its
 * limit and for getMore/killCursors, which only ever look at the caller's
 * own cursors) and the server's (for the total limit and the idle
 * timeout). Times come only from doc_server_tick, so no command reads a
 * clock for its cursors.
 *
 * Multi-document writes (update multi, delete many) collect the _ids of
 * what the filter matched in one scan, then write each by _id: a document
 * an update moves ahead in the scan's index is then never updated twice,
 * and no ref is used after a write has invalidated it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "doc_agg.h"
#include "doc_bson.h"
#include "doc_cmd.h"
#include "doc_match.h"
#include "doc_query.h"
#include "doc_repl.h"
#include "doc_store.h"
#include "doc_update.h"
#include "log.h"
#include "repl.h"

#define CMD_DEPTH_MAX 200           /* MongoDB's BSONDepth::kDefaultMaxAllowableDepth */
#define WRITE_BATCH_MAX 100000      /* maxWriteBatchSize the server says */
#define SESSION_TIMEOUT_MS (30 * 60 * 1000ll)   /* logicalSessionTimeoutMinutes: 30 */
#define MESSAGE_MAX 48000000        /* maxMessageSizeBytes */
#define BLOCKING_MEM_MAX (100u << 20) /* a blocking sort or buffered result, as
                                       * MongoDB's per-stage limit */
#define NS_MAX 320                  /* "db.coll": 63 + 1 + 200, or a "$cmd." one */
#define PEER_MAX 128
/* MongoDB's IDL parser's code for a required field that is absent; it
 * has no name in error_codes.yml, so its codeName is "Location40414". */
#define IDL_MISSING 40414

struct doc_cursor {
    int64_t id;
    struct doc_client *cl;
    struct doc_cursor *cprev, *cnext;   /* the client's, least recently used first */
    struct doc_cursor *sprev, *snext;   /* the server's, likewise */
    uint64_t used_ms;
    char ns[NS_MAX];
    struct doc_matcher *m;
    struct doc_sort *sort;
    struct doc_proj *proj;
    struct doc_scan *scan;              /* lazy: read from here... */
    struct doc_buf buf;                 /* ...or from here, from pos */
    size_t pos;
    bool buffered;
    int64_t skip, limit;                /* limit < 0: none */
    bson_t pending;                     /* the document that did not fit */
    bool has_pending;
    bool done;
    bool heap;                          /* a find's lives on the stack until it
                                         * has to outlive the command */
};

struct doc_client {
    struct doc_server *srv;
    struct doc_client *prev, *next;
    struct doc_cursor *head, *tail;
    unsigned ncursors;
    int32_t conn_id;
    char peer[PEER_MAX];
    struct doc_await aw;                /* of its last hello */
    bool awaitable;                     /* the command being run is an awaitable hello */
};

struct doc_server {
    struct doc_store *store;
    struct doc_server_opts o;
    char version[32];
    int32_t version_arr[4];
    struct doc_client *clients;
    unsigned nclients;
    uint64_t clients_total;
    struct doc_cursor *head, *tail;
    unsigned ncursors;
    uint64_t now_ms;
    bool ticked;
    uint64_t rng;
    int32_t next_conn;
    struct timespec started;
    struct doc_server_stats st;
    /* doc_server_replicate: the group, and hello's replica-set fields */
    struct repl *repl;
    doc_hello_fn hello;
    void *hello_arg;
    /* hello's topologyVersion: what it said of the member and its set
     * last (topo_last, the roles), and its counter */
    bson_oid_t process_id;
    int64_t topo_counter;
    bool topo_primary, topo_secondary;
    bson_t *topo, *topo_last;           /* bson_new's: aligned as bson_t wants */
};

/* One command being run. */
struct ctx {
    struct doc_server *srv;
    struct doc_client *cl;
    const bson_t *cmd;
    const char *name;
    char db[64];
    const struct doc_seq *seqs;
    unsigned nseq;
    bson_t *reply;
    struct doc_err e;
};

/* ---- small things ---- */

static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int wrong_type(struct ctx *x, const bson_iter_t *it, const char *expected)
{
    return doc_errf(&x->e, DOC_TypeMismatch,
                    "BSON field '%s.%s' is the wrong type '%s', expected type '%s'", x->name,
                    bson_iter_key(it), doc_type_name(bson_iter_type(it)), expected);
}

/* A document argument (null counts as absent: *out stays empty). */
static int arg_doc(struct ctx *x, const bson_iter_t *it, bson_t *out)
{
    const uint8_t *data;
    uint32_t len;

    if (BSON_ITER_HOLDS_NULL(it))
        return 0;
    if (!BSON_ITER_HOLDS_DOCUMENT(it))
        return wrong_type(x, it, "object");
    bson_iter_document(it, &len, &data);
    if (!bson_init_static(out, data, len))
        return doc_errf(&x->e, DOC_InvalidBSON, "invalid BSON in field '%s'", bson_iter_key(it));
    return 0;
}

static int arg_array(struct ctx *x, const bson_iter_t *it, bson_t *out)
{
    const uint8_t *data;
    uint32_t len;

    if (!BSON_ITER_HOLDS_ARRAY(it))
        return wrong_type(x, it, "array");
    bson_iter_array(it, &len, &data);
    if (!bson_init_static(out, data, len))
        return doc_errf(&x->e, DOC_InvalidBSON, "invalid BSON in field '%s'", bson_iter_key(it));
    return 0;
}

/* MongoDB's safeInt64: any number with an integral value. */
static int arg_int64(struct ctx *x, const bson_iter_t *it, int64_t *out)
{
    double d;

    switch (bson_iter_type(it)) {
    case BSON_TYPE_INT32:
        *out = bson_iter_int32(it);
        return 0;
    case BSON_TYPE_INT64:
        *out = bson_iter_int64(it);
        return 0;
    case BSON_TYPE_DOUBLE:
        d = bson_iter_double(it);
        if (!isfinite(d) || d != floor(d) || d < -9.2e18 || d > 9.2e18)
            return doc_errf(&x->e, DOC_BadValue, "BSON field '%s.%s' must be an integer, got %g",
                            x->name, bson_iter_key(it), d);
        *out = (int64_t)d;
        return 0;
    case BSON_TYPE_DECIMAL128:
        return doc_errf(&x->e, DOC_BadValue, "BSON field '%s.%s': decimal is not supported here",
                        x->name, bson_iter_key(it));
    default:
        return wrong_type(x, it, "long");
    }
}

/* MongoDB's safeBool: a bool or a number. */
static int arg_bool(struct ctx *x, const bson_iter_t *it, bool *out)
{
    switch (bson_iter_type(it)) {
    case BSON_TYPE_BOOL:
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DOUBLE:
        *out = bson_iter_as_bool(it);
        return 0;
    case BSON_TYPE_NULL:
        *out = false;
        return 0;
    default:
        return wrong_type(x, it, "bool");
    }
}

/* A string argument without embedded NULs. */
static int arg_str(struct ctx *x, const bson_iter_t *it, const char **out)
{
    uint32_t len;
    const char *s;

    if (!BSON_ITER_HOLDS_UTF8(it))
        return wrong_type(x, it, "string");
    s = bson_iter_utf8(it, &len);
    if (strlen(s) != len)
        return doc_errf(&x->e, DOC_BadValue, "BSON field '%s.%s' contains a NUL byte", x->name,
                        bson_iter_key(it));
    *out = s;
    return 0;
}

/* tern compares strings by their bytes: MongoDB's "simple" collation. A
 * command asking for another one is refused rather than answered by
 * other rules than it asked for. */
static int arg_collation(struct ctx *x, const bson_iter_t *it)
{
    bson_t c;
    bson_iter_t li;

    if (!BSON_ITER_HOLDS_DOCUMENT(it))
        return wrong_type(x, it, "object");
    if (arg_doc(x, it, &c) < 0)
        return -1;
    if (bson_iter_init_find(&li, &c, "locale") && BSON_ITER_HOLDS_UTF8(&li) &&
        !strcmp(bson_iter_utf8(&li, NULL), "simple") && bson_count_keys(&c) == 1)
        return 0;
    return doc_errf(&x->e, DOC_NotImplemented, "only the simple collation is supported");
}

/* The collection named by the command's first field. */
static int arg_coll(struct ctx *x, const char **out)
{
    bson_iter_t it;
    uint32_t len;
    const char *s;

    if (!bson_iter_init(&it, x->cmd) || !bson_iter_next(&it))
        return doc_errf(&x->e, DOC_InvalidNamespace, "no collection name");
    if (!BSON_ITER_HOLDS_UTF8(&it))
        return doc_errf(&x->e, DOC_InvalidNamespace, "collection name has invalid type %s",
                        doc_type_name(bson_iter_type(&it)));
    s = bson_iter_utf8(&it, &len);
    if (len == 0 || strlen(s) != len || len > 200)
        return doc_errf(&x->e, DOC_InvalidNamespace, "Invalid namespace specified '%s.%s'", x->db,
                        s);
    *out = s;
    return 0;
}

static void ns_of(char *ns, const char *db, const char *coll)
{
    snprintf(ns, NS_MAX, "%s.%s", db, coll);
}

/* The collection if it exists: 0 with *c (NULL when it does not), <0 on
 * another error (an invalid name). */
static int coll_find(struct ctx *x, const char *name, struct doc_coll **c)
{
    struct doc_err e = {0};

    *c = doc_coll_get(x->srv->store, x->db, name, false, &e);
    if (*c)
        return 0;
    if (e.code == DOC_NamespaceNotFound || e.code == 0)
        return 0;
    x->e = e;
    return -1;
}

static void append_ok(bson_t *reply)
{
    bson_append_double(reply, "ok", 2, 1.0);
}

static void append_error(bson_t *reply, const struct doc_err *e)
{
    int code = e->code ? e->code : DOC_InternalError;

    bson_append_double(reply, "ok", 2, 0.0);
    bson_append_utf8(reply, "errmsg", 6, e->msg[0] ? e->msg : "unknown error", -1);
    bson_append_int32(reply, "code", 4, code);
    bson_append_utf8(reply, "codeName", 8, doc_code_name(code), -1);
}

static const char *idx_key(uint32_t i, char *buf, size_t size)
{
    const char *k;

    bson_uint32_to_string(i, &k, buf, size);
    return k;
}

/* ---- checking what came in ---- */

/* Nesting deeper than CMD_DEPTH_MAX is refused before anything recursive
 * (bson_validate, the matcher) sees the document; the scope of a
 * code-with-scope value is a document that bson_validate descends into
 * as well, so it counts as a level. */
static bool depth_ok(const bson_t *b, unsigned depth)
{
    bson_iter_t it;

    if (depth > CMD_DEPTH_MAX || !bson_iter_init(&it, b))
        return false;
    while (bson_iter_next(&it)) {
        if (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)) {
            const uint8_t *data;
            uint32_t len;
            bson_t child;

            if (BSON_ITER_HOLDS_DOCUMENT(&it))
                bson_iter_document(&it, &len, &data);
            else
                bson_iter_array(&it, &len, &data);
            if (!bson_init_static(&child, data, len) || !depth_ok(&child, depth + 1))
                return false;
        } else if (BSON_ITER_HOLDS_CODEWSCOPE(&it)) {
            const uint8_t *scope;
            uint32_t len, slen;
            bson_t child;

            bson_iter_codewscope(&it, &len, &slen, &scope);
            if (!bson_init_static(&child, scope, slen) || !depth_ok(&child, depth + 1))
                return false;
        }
    }
    return it.err_off == 0;
}

/* The walk is the whole check: bson_init_static checks each level's
 * length and closing NUL, and bson_iter_next every element's bounds (a
 * string's NUL included) and that the elements end exactly at that NUL.
 * bson_validate on top of it (even BSON_VALIDATE_NONE) cost two thirds of
 * a small insert's time in this layer. */
static int check_doc(const bson_t *b, struct doc_err *e)
{
    if (!depth_ok(b, 0))
        return doc_errf(e, DOC_InvalidBSON, "BSON document nested too deep or corrupt");
    return 0;
}

static int check_seq(const struct doc_seq *s, struct doc_err *e)
{
    size_t at = 0;

    while (at < s->len) {
        uint32_t len;
        bson_t doc;

        if (s->len - at < 5)
            return doc_errf(e, DOC_InvalidBSON, "document sequence '%.*s': truncated document",
                            (int)s->id_len, s->id);
        memcpy(&len, s->docs + at, 4);
        len = BSON_UINT32_FROM_LE(len);
        if (len < 5 || len > s->len - at || !bson_init_static(&doc, s->docs + at, len))
            return doc_errf(e, DOC_InvalidBSON, "document sequence '%.*s': bad document length",
                            (int)s->id_len, s->id);
        if (check_doc(&doc, e) < 0)
            return -1;
        at += len;
    }
    return 0;
}

/* The documents of a write command: the kind-1 sequence `id`, or the
 * array of that name in the command, whichever is there. */
struct docs {
    const uint8_t *p;
    size_t left;
    bson_iter_t it;
    bool seq, inline_;
    uint32_t n;
};

static int docs_open(struct ctx *x, const char *id, struct docs *d)
{
    bson_iter_t it;
    unsigned i;

    memset(d, 0, sizeof(*d));
    for (i = 0; i < x->nseq; i++)
        if (x->seqs[i].id_len == strlen(id) && memcmp(x->seqs[i].id, id, x->seqs[i].id_len) == 0) {
            d->seq = true;
            d->p = x->seqs[i].docs;
            d->left = x->seqs[i].len;
        }
    if (bson_iter_init_find(&it, x->cmd, id)) {
        bson_t arr;

        if (d->seq)
            return doc_errf(&x->e, DOC_BadValue,
                            "'%s' is given both as a document sequence and in the command", id);
        if (arg_array(x, &it, &arr) < 0)
            return -1;
        if (!bson_iter_recurse(&it, &d->it))
            return doc_errf(&x->e, DOC_InvalidBSON, "invalid BSON in '%s'", id);
        d->inline_ = true;
    }
    if (!d->seq && !d->inline_)
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field '%s.%s' is missing but a required field", x->name, id);
    return 0;
}

/* 1 and the next document, 0 at the end, <0 for an element that is not a
 * document. */
static int docs_next(struct ctx *x, struct docs *d, bson_t *doc)
{
    if (d->seq) {
        uint32_t len;

        if (d->left == 0)
            return 0;
        memcpy(&len, d->p, 4);
        len = BSON_UINT32_FROM_LE(len);
        /* check_seq has vouched for every length */
        bson_init_static(doc, d->p, len);
        d->p += len;
        d->left -= len;
        d->n++;
        return 1;
    }
    if (!d->inline_ || !bson_iter_next(&d->it))
        return 0;
    if (!BSON_ITER_HOLDS_DOCUMENT(&d->it))
        return doc_errf(&x->e, DOC_TypeMismatch,
                        "BSON field '%s.%s' is the wrong type '%s', expected type 'object'",
                        x->name, bson_iter_key(&d->it), doc_type_name(bson_iter_type(&d->it)));
    {
        const uint8_t *data;
        uint32_t len;

        bson_iter_document(&d->it, &len, &data);
        if (!bson_init_static(doc, data, len))
            return doc_errf(&x->e, DOC_InvalidBSON, "invalid document in the command");
    }
    d->n++;
    return 1;
}

static int docs_count(struct ctx *x, const char *id, uint32_t *n)
{
    struct docs d;
    bson_t doc;
    int rc;

    if (docs_open(x, id, &d) < 0)
        return -1;
    *n = 0;
    while ((rc = docs_next(x, &d, &doc)) > 0)
        (*n)++;
    if (rc < 0)
        return -1;
    if (*n == 0 || *n > WRITE_BATCH_MAX)
        return doc_errf(&x->e, DOC_InvalidLength,
                        "Write batch sizes must be between 1 and %d. Got %u operations.",
                        WRITE_BATCH_MAX, *n);
    return 0;
}

/* ---- cursors ---- */

static uint64_t rng_next(struct doc_server *srv)
{
    /* xorshift64*: ids need only be unguessable enough not to collide */
    uint64_t v = srv->rng;

    v ^= v >> 12;
    v ^= v << 25;
    v ^= v >> 27;
    srv->rng = v;
    return v * 0x2545F4914F6CDD1DULL;
}

static void cursor_unlink(struct doc_cursor *cur)
{
    struct doc_client *cl = cur->cl;
    struct doc_server *srv = cl->srv;

    if (cur->cprev)
        cur->cprev->cnext = cur->cnext;
    else
        cl->head = cur->cnext;
    if (cur->cnext)
        cur->cnext->cprev = cur->cprev;
    else
        cl->tail = cur->cprev;
    if (cur->sprev)
        cur->sprev->snext = cur->snext;
    else
        srv->head = cur->snext;
    if (cur->snext)
        cur->snext->sprev = cur->sprev;
    else
        srv->tail = cur->sprev;
    cur->cprev = cur->cnext = cur->sprev = cur->snext = NULL;
}

static void cursor_link(struct doc_cursor *cur)
{
    struct doc_client *cl = cur->cl;
    struct doc_server *srv = cl->srv;

    cur->cprev = cl->tail;
    if (cl->tail)
        cl->tail->cnext = cur;
    else
        cl->head = cur;
    cl->tail = cur;
    cur->sprev = srv->tail;
    if (srv->tail)
        srv->tail->snext = cur;
    else
        srv->head = cur;
    srv->tail = cur;
    cur->used_ms = srv->now_ms;
}

static void cursor_destroy(struct doc_cursor *cur)
{
    if (cur->scan)
        doc_scan_close(cur->scan);
    doc_match_free(cur->m);
    doc_sort_free(cur->sort);
    doc_proj_free(cur->proj);
    doc_buf_free(&cur->buf);
    if (cur->has_pending)
        bson_destroy(&cur->pending);
    if (cur->heap)
        free(cur);
}

/* Close a registered cursor. */
static void cursor_close(struct doc_cursor *cur)
{
    struct doc_client *cl = cur->cl;

    cursor_unlink(cur);
    cl->ncursors--;
    cl->srv->ncursors--;
    cursor_destroy(cur);
}

static void cursor_register(struct doc_client *cl, struct doc_cursor *cur)
{
    struct doc_server *srv = cl->srv;
    struct doc_cursor *o;

    /* past a limit, the least recently used cursor makes room */
    if (cl->ncursors >= srv->o.max_cursors && cl->head)
        cursor_close(cl->head);
    if (srv->ncursors >= srv->o.max_cursors_total && srv->head)
        cursor_close(srv->head);
    do {
        cur->id = (int64_t)(rng_next(srv) & INT64_MAX);
        for (o = cl->head; o && cur->id; o = o->cnext)
            if (o->id == cur->id)
                cur->id = 0;
    } while (cur->id == 0);
    cur->cl = cl;
    cursor_link(cur);
    cl->ncursors++;
    srv->ncursors++;
}

static void cursor_init(struct doc_cursor *cur, const char *ns)
{
    memset(cur, 0, sizeof(*cur));
    snprintf(cur->ns, sizeof(cur->ns), "%s", ns);
    cur->limit = -1;
}

static struct doc_cursor *cursor_new(const char *ns)
{
    struct doc_cursor *cur = malloc(sizeof(*cur));

    if (!cur)
        return NULL;
    cursor_init(cur, ns);
    cur->heap = true;
    return cur;
}

/* A cursor on the stack moved to the heap, to be registered. */
static struct doc_cursor *cursor_to_heap(struct doc_cursor *cur)
{
    struct doc_cursor *h;

    if (cur->heap)
        return cur;
    h = malloc(sizeof(*h));
    if (!h)
        return NULL;
    *h = *cur;
    h->heap = true;
    /* a bson_t that outgrew its inline buffer points into itself */
    if (cur->has_pending) {
        bson_copy_to(&cur->pending, &h->pending);
        bson_destroy(&cur->pending);
    }
    return h;
}

/* The next raw document of a cursor: 1, or 0 at its end. */
static int cursor_next_raw(struct doc_cursor *cur, bson_t *view)
{
    if (cur->buffered) {
        uint32_t len;

        if (cur->pos >= cur->buf.len)
            return 0;
        memcpy(&len, cur->buf.p + cur->pos, 4);
        len = BSON_UINT32_FROM_LE(len);
        bson_init_static(view, cur->buf.p + cur->pos, len);
        cur->pos += len;
        return 1;
    }
    if (!cur->scan)
        return 0;
    {
        doc_ref ref;

        return doc_scan_next(cur->scan, view, &ref) > 0;
    }
}

/* Append up to max_n documents (0: no count limit) to `arr`, stopping
 * before the batch would pass max_batch_bytes (one document always goes).
 * The number appended, or <0 (a projection failed). */
static int fetch_batch(struct doc_server *srv, struct doc_cursor *cur, int64_t max_n, bson_t *arr,
                       struct doc_err *e)
{
    size_t bytes = 0;
    uint32_t n = 0;
    char kb[16];

    while (!cur->done && (max_n == 0 || n < max_n)) {
        bson_t view, projd;
        const bson_t *d;
        bool from_pending = false, projected = false;

        if (cur->limit == 0)
            break;
        if (cur->has_pending) {
            d = &cur->pending;
            from_pending = true;
        } else {
            if (cursor_next_raw(cur, &view) == 0) {
                cur->done = true;
                break;
            }
            if (cur->skip > 0) {
                cur->skip--;
                continue;
            }
            d = &view;
            if (cur->proj) {
                bson_init(&projd);
                if (doc_proj_apply(cur->proj, &view, &projd, e) < 0) {
                    bson_destroy(&projd);
                    return -1;
                }
                d = &projd;
                projected = true;
            }
        }
        if (n > 0 && bytes + d->len > srv->o.max_batch_bytes) {
            if (!from_pending) {
                bson_copy_to(d, &cur->pending);
                cur->has_pending = true;
            }
            if (projected)
                bson_destroy(&projd);
            break;
        }
        bson_append_document(arr, idx_key(n, kb, sizeof(kb)), -1, d);
        bytes += d->len;
        n++;
        if (from_pending) {
            bson_destroy(&cur->pending);
            cur->has_pending = false;
        }
        if (projected)
            bson_destroy(&projd);
        if (cur->limit > 0)
            cur->limit--;
    }
    if (cur->limit == 0 && !cur->has_pending)
        cur->done = true;
    if (cur->buffered && cur->pos >= cur->buf.len && !cur->has_pending)
        cur->done = true;
    return (int)n;
}

/* Append {cursor: {<batch>: [...], id, ns}} with up to max_n documents
 * (first batch: max_n < 0 means none at all, for batchSize 0). The cursor
 * is registered if it has more to give and `single` is false, freed
 * otherwise; either way the caller no longer owns it. */
static int reply_cursor(struct ctx *x, struct doc_cursor *cur, const char *batch, int64_t max_n,
                        bool single, bool registered)
{
    bson_t cd, arr;
    int n = 0;

    bson_append_document_begin(x->reply, "cursor", 6, &cd);
    bson_append_array_begin(&cd, batch, -1, &arr);
    if (max_n >= 0)
        n = fetch_batch(x->srv, cur, max_n, &arr, &x->e);
    bson_append_array_end(&cd, &arr);
    if (n < 0) {
        bson_append_document_end(x->reply, &cd);
        if (registered)
            cursor_close(cur);
        else
            cursor_destroy(cur);
        return -1;
    }
    if (cur->done || single) {
        bson_append_int64(&cd, "id", 2, 0);
        bson_append_utf8(&cd, "ns", 2, cur->ns, -1);
        if (registered)
            cursor_close(cur);
        else
            cursor_destroy(cur);
    } else {
        if (!registered) {
            struct doc_cursor *h = cursor_to_heap(cur);

            if (!h) {
                bson_append_document_end(x->reply, &cd);
                cursor_destroy(cur);
                return doc_errf(&x->e, DOC_ExceededMemoryLimit, "out of memory");
            }
            cur = h;
            cursor_register(x->cl, cur);
        } else {
            cursor_unlink(cur);
            cursor_link(cur);
        }
        bson_append_int64(&cd, "id", 2, cur->id);
        bson_append_utf8(&cd, "ns", 2, cur->ns, -1);
    }
    bson_append_document_end(x->reply, &cd);
    return 0;
}

/* A cursor's batchSize from {cursor: {batchSize: n}}: *n stays as given
 * when there is none. */
static int cursor_opt(struct ctx *x, const bson_iter_t *it, int64_t *n)
{
    bson_t c;
    bson_iter_t ci;

    if (!BSON_ITER_HOLDS_DOCUMENT(it))
        return wrong_type(x, it, "object");
    if (arg_doc(x, it, &c) < 0)
        return -1;
    if (bson_iter_init_find(&ci, &c, "batchSize")) {
        if (arg_int64(x, &ci, n) < 0)
            return -1;
        if (*n < 0)
            return doc_errf(&x->e, DOC_BadValue, "BatchSize value must be non-negative, but received: %lld",
                            (long long)*n);
    }
    return 0;
}

static void buf_add_doc(struct doc_buf *b, const bson_t *d)
{
    doc_buf_add(b, bson_get_data(d), d->len);
}

/* ---- scans: the ordered sources of finds and writes ---- */

struct sort_ent {
    size_t koff, doff;
    uint32_t klen, dlen;
};

static int sort_ent_cmp(const void *a, const void *b, void *arg)
{
    const struct sort_ent *x = a, *y = b;
    const uint8_t *keys = arg;
    uint32_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(keys + x->koff, keys + y->koff, n);

    if (c)
        return c;
    if (x->klen != y->klen)
        return x->klen < y->klen ? -1 : 1;
    /* documents came in scan order: keep it among equals */
    return x->doff < y->doff ? -1 : x->doff > y->doff;
}

static int too_much(struct doc_err *e)
{
    return doc_errf(e, DOC_QueryExceededMemoryLimitNoDiskUseAllowed,
                    "Sort exceeded memory limit of %u bytes, but did not opt in to external sorting.",
                    BLOCKING_MEM_MAX);
}

/* Fill a find's cursor from the collection: a lazy scan when its order is
 * the one asked for, else every match sorted into the cursor's buffer. */
static int cursor_fill(struct doc_cursor *cur, struct doc_coll *c, struct doc_plan *plan,
                       struct doc_err *e)
{
    int natural = cur->sort ? doc_sort_natural(cur->sort) : 0;
    const struct doc_sort *scan_sort = natural ? NULL : cur->sort;
    struct doc_buf keys = {0}, data = {0};
    struct sort_ent *ents = NULL;
    size_t nents = 0, cap = 0, i;
    struct doc_plan pl;
    bson_t view;
    doc_ref ref;

    if (!plan)
        plan = &pl;
    if (doc_scan_open(c, cur->m, scan_sort, &cur->scan, plan, e) < 0) {
        cur->scan = NULL;
        return -1;
    }
    if (natural > 0 || (!natural && (!cur->sort || plan->sorted)))
        return 0;
    while (doc_scan_next(cur->scan, &view, &ref) > 0) {
        if (nents == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            struct sort_ent *ne = realloc(ents, ncap * sizeof(*ne));

            if (!ne)
                goto oom;
            ents = ne;
            cap = ncap;
        }
        ents[nents].koff = keys.len;
        ents[nents].doff = data.len;
        if (natural < 0)
            doc_buf_add(&keys, &(uint64_t){htobe64(UINT64_MAX - nents)}, 8);
        else
            doc_sort_key(cur->sort, &view, &keys);
        buf_add_doc(&data, &view);
        ents[nents].klen = (uint32_t)(keys.len - ents[nents].koff);
        ents[nents].dlen = view.len;
        nents++;
        if (keys.oom || data.oom)
            goto oom;
        if (data.len + keys.len > BLOCKING_MEM_MAX) {
            too_much(e);
            goto fail;
        }
    }
    doc_scan_close(cur->scan);
    cur->scan = NULL;
    if (nents)      /* qsort of a NULL array, even empty, is undefined */
        qsort_r(ents, nents, sizeof(*ents), sort_ent_cmp, keys.p);
    for (i = 0; i < nents; i++)
        doc_buf_add(&cur->buf, data.p + ents[i].doff, ents[i].dlen);
    if (cur->buf.oom)
        goto oom;
    cur->buffered = true;
    free(ents);
    doc_buf_free(&keys);
    doc_buf_free(&data);
    return 0;
oom:
    doc_errf(e, DOC_ExceededMemoryLimit, "out of memory sorting the results");
fail:
    free(ents);
    doc_buf_free(&keys);
    doc_buf_free(&data);
    return -1;
}

/* The first document in `sort` order (or scan order) that `m` matches: 1
 * with *ref, 0 if none. */
static int find_first(struct doc_coll *c, const struct doc_matcher *m, const struct doc_sort *sort,
                      doc_ref *out, struct doc_err *e)
{
    struct doc_buf best = {0}, key = {0};
    struct doc_scan *sc;
    struct doc_plan plan;
    bson_t view;
    doc_ref ref;
    int found = 0;

    if (sort && doc_sort_natural(sort))
        sort = NULL;
    if (doc_scan_open(c, m, sort, &sc, &plan, e) < 0)
        return -1;
    while (doc_scan_next(sc, &view, &ref) > 0) {
        if (!sort || plan.sorted) {
            *out = ref;
            found = 1;
            break;
        }
        doc_buf_reset(&key);
        doc_sort_key(sort, &view, &key);
        if (!found || memcmp(key.p, best.p, key.len < best.len ? key.len : best.len) < 0 ||
            (memcmp(key.p, best.p, key.len < best.len ? key.len : best.len) == 0 &&
             key.len < best.len)) {
            doc_buf_reset(&best);
            doc_buf_add(&best, key.p, key.len);
            *out = ref;
            found = 1;
        }
    }
    doc_scan_close(sc);
    doc_buf_free(&best);
    doc_buf_free(&key);
    return found;
}

/* The _ids of every document `m` matches, into `ids` (an array). */
static int collect_ids(struct doc_coll *c, const struct doc_matcher *m, bson_t *ids,
                       uint32_t *n, struct doc_err *e)
{
    struct doc_scan *sc;
    struct doc_plan plan;
    bson_t view;
    doc_ref ref;
    char kb[16];

    *n = 0;
    if (doc_scan_open(c, m, NULL, &sc, &plan, e) < 0)
        return -1;
    while (doc_scan_next(sc, &view, &ref) > 0) {
        bson_iter_t it;

        if (!bson_iter_init_find(&it, &view, "_id"))
            continue;
        bson_append_iter(ids, idx_key(*n, kb, sizeof(kb)), -1, &it);
        (*n)++;
    }
    doc_scan_close(sc);
    return 0;
}

/* ---- write errors ---- */

/* keyPattern and keyValue of a duplicate key error: the index is named in
 * the store's errmsg ("... index: NAME dup key: ..."), its key pattern in
 * the collection's index list, the values in the document. */
static void dup_key_info(struct doc_coll *c, const bson_t *doc, const struct doc_err *e,
                         bson_t *out)
{
    const char *p = strstr(e->msg, " index: "), *q;
    char name[128];
    bson_t arr, kv;
    bson_iter_t it, ix;
    bool found = false;

    if (!p || !c)
        return;
    p += 8;
    q = strstr(p, " dup key");
    if (!q || (size_t)(q - p) >= sizeof(name))
        return;
    memcpy(name, p, q - p);
    name[q - p] = 0;
    bson_init(&arr);
    doc_index_list(c, &arr);
    if (bson_iter_init(&it, &arr))
        while (!found && bson_iter_next(&it)) {
            bson_t spec, key;
            bson_iter_t f;

            if (!BSON_ITER_HOLDS_DOCUMENT(&it))
                continue;
            {
                const uint8_t *d;
                uint32_t l;

                bson_iter_document(&it, &l, &d);
                if (!bson_init_static(&spec, d, l))
                    continue;
            }
            if (!bson_iter_init_find(&f, &spec, "name") || !BSON_ITER_HOLDS_UTF8(&f) ||
                strcmp(bson_iter_utf8(&f, NULL), name) != 0)
                continue;
            if (!bson_iter_init_find(&f, &spec, "key") || !BSON_ITER_HOLDS_DOCUMENT(&f))
                continue;
            {
                const uint8_t *d;
                uint32_t l;

                bson_iter_document(&f, &l, &d);
                if (!bson_init_static(&key, d, l))
                    continue;
            }
            found = true;
            bson_append_document(out, "keyPattern", -1, &key);
            bson_append_document_begin(out, "keyValue", -1, &kv);
            if (bson_iter_init(&ix, &key))
                while (bson_iter_next(&ix)) {
                    bson_value_t v;

                    if (doc_get(doc, bson_iter_key(&ix), &v))
                        bson_append_value(&kv, bson_iter_key(&ix), -1, &v);
                    else
                        bson_append_null(&kv, bson_iter_key(&ix), -1);
                }
            bson_append_document_end(out, &kv);
        }
    bson_destroy(&arr);
}

static void write_error(bson_t *werrs, uint32_t *nerr, uint32_t index, const struct doc_err *e,
                        struct doc_coll *c, const bson_t *doc)
{
    bson_t we;
    char kb[16];
    int code = e->code ? e->code : DOC_InternalError;

    bson_append_document_begin(werrs, idx_key(*nerr, kb, sizeof(kb)), -1, &we);
    bson_append_int32(&we, "index", 5, (int32_t)index);
    bson_append_int32(&we, "code", 4, code);
    if (code == DOC_DuplicateKey && doc)
        dup_key_info(c, doc, e, &we);
    bson_append_utf8(&we, "errmsg", 6, e->msg, -1);
    bson_append_document_end(werrs, &we);
    (*nerr)++;
}

/* `in` with an _id first: as is if it already starts with one, else
 * rebuilt into `out` (the existing _id moved first, or a new ObjectId).
 * Returns the document to write. */
static const bson_t *with_id(const bson_t *in, bson_t *out, bool *built)
{
    bson_iter_t it;
    bool has;

    *built = false;
    if (bson_iter_init(&it, in) && bson_iter_next(&it) && strcmp(bson_iter_key(&it), "_id") == 0)
        return in;
    has = bson_iter_init_find(&it, in, "_id");
    bson_init(out);
    *built = true;
    if (has) {
        bson_append_iter(out, "_id", 3, &it);
    } else {
        bson_oid_t oid;

        doc_new_oid(&oid);
        bson_append_oid(out, "_id", 3, &oid);
    }
    if (bson_iter_init(&it, in))
        while (bson_iter_next(&it))
            if (strcmp(bson_iter_key(&it), "_id") != 0)
                bson_append_iter(out, NULL, 0, &it);
    return out;
}

/* ---- insert ---- */

static int cmd_insert(struct ctx *x)
{
    const char *cname;
    bool ordered = true;
    struct doc_coll *c;
    struct docs d;
    bson_iter_t it;
    bson_t doc, werrs;
    uint32_t total, nerr = 0, n = 0, i = 0;
    int rc;

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (bson_iter_init_find(&it, x->cmd, "ordered") && arg_bool(x, &it, &ordered) < 0)
        return -1;
    if (docs_count(x, "documents", &total) < 0)
        return -1;
    c = doc_coll_get(x->srv->store, x->db, cname, true, &x->e);
    if (!c)
        return -1;
    docs_open(x, "documents", &d);
    bson_init(&werrs);
    while ((rc = docs_next(x, &d, &doc)) > 0) {
        bson_t built;
        bool b;
        const bson_t *w = with_id(&doc, &built, &b);
        struct doc_err e = {0};

        if (doc_insert(c, w, &e) < 0) {
            write_error(&werrs, &nerr, i, &e, c, w);
            if (b)
                bson_destroy(&built);
            if (ordered)
                break;
        } else {
            n++;
            if (b)
                bson_destroy(&built);
        }
        i++;
    }
    x->srv->st.inserts += n;
    bson_append_int32(x->reply, "n", 1, (int32_t)n);
    if (nerr)
        bson_append_array(x->reply, "writeErrors", -1, &werrs);
    bson_destroy(&werrs);
    return 0;
}

/* ---- find, getMore, killCursors ---- */

/* Compile a find's filter, sort and projection into the cursor. */
static int cursor_compile(struct ctx *x, struct doc_cursor *cur, const bson_t *filter,
                          const bson_t *sort, const bson_t *proj)
{
    if (doc_match_compile(filter, &cur->m, &x->e) < 0) {
        cur->m = NULL;
        return -1;
    }
    if (sort && !bson_empty(sort) && doc_sort_compile(sort, &cur->sort, &x->e) < 0) {
        cur->sort = NULL;
        return -1;
    }
    if (proj && !bson_empty(proj) && doc_proj_compile(proj, &cur->proj, &x->e) < 0) {
        cur->proj = NULL;
        return -1;
    }
    return 0;
}

static int cmd_find(struct ctx *x)
{
    bson_t filter = BSON_INITIALIZER, sort = BSON_INITIALIZER, proj = BSON_INITIALIZER;
    int64_t skip = 0, limit = 0, batch = -1;
    bool single = false;
    const char *cname;
    char ns[NS_MAX];
    struct doc_cursor stack_cur, *cur;
    struct doc_coll *c;
    bson_iter_t it;

    if (arg_coll(x, &cname) < 0)
        return -1;
    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int rc = 0;

        if (!strcmp(k, "filter"))
            rc = arg_doc(x, &it, &filter);
        else if (!strcmp(k, "sort"))
            rc = arg_doc(x, &it, &sort);
        else if (!strcmp(k, "projection"))
            rc = arg_doc(x, &it, &proj);
        else if (!strcmp(k, "skip"))
            rc = arg_int64(x, &it, &skip);
        else if (!strcmp(k, "limit"))
            rc = arg_int64(x, &it, &limit);
        else if (!strcmp(k, "batchSize"))
            rc = arg_int64(x, &it, &batch);
        else if (!strcmp(k, "singleBatch"))
            rc = arg_bool(x, &it, &single);
        else if (!strcmp(k, "collation"))
            rc = arg_collation(x, &it);
        if (rc < 0)
            return -1;
    }
    if (skip < 0)
        return doc_errf(&x->e, DOC_BadValue, "Skip value must be non-negative, but received: %lld",
                        (long long)skip);
    if (bson_iter_init_find(&it, x->cmd, "batchSize") && batch < 0)
        return doc_errf(&x->e, DOC_BadValue,
                        "BatchSize value must be non-negative, but received: %lld",
                        (long long)batch);
    /* a negative limit is the legacy "return this many in one batch" */
    if (limit < 0) {
        limit = limit == INT64_MIN ? INT64_MAX : -limit;
        single = true;
    }
    if (batch < 0)
        batch = x->srv->o.default_batch;
    if (limit > 0 && batch > limit)
        batch = limit;
    x->srv->st.queries++;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    ns_of(ns, x->db, cname);
    /* on the stack: most finds end in their first batch */
    cur = &stack_cur;
    cursor_init(cur, ns);
    if (cursor_compile(x, cur, &filter, &sort, &proj) < 0) {
        cursor_destroy(cur);
        return -1;
    }
    cur->skip = skip;
    cur->limit = limit > 0 ? limit : -1;
    if (!c)
        cur->done = true;
    else if (cursor_fill(cur, c, NULL, &x->e) < 0) {
        cursor_destroy(cur);
        return -1;
    }
    return reply_cursor(x, cur, "firstBatch", batch == 0 ? -1 : batch, single, false);
}

static struct doc_cursor *cursor_lookup(struct doc_client *cl, int64_t id)
{
    struct doc_cursor *cur;

    for (cur = cl->head; cur; cur = cur->cnext)
        if (cur->id == id)
            return cur;
    return NULL;
}

static int cmd_getmore(struct ctx *x)
{
    int64_t id, batch = 0;
    const char *coll = NULL;
    char ns[NS_MAX];
    struct doc_cursor *cur;
    bson_iter_t it;

    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    if (!BSON_ITER_HOLDS_INT64(&it))
        return wrong_type(x, &it, "long");
    id = bson_iter_int64(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);

        if (!strcmp(k, "collection")) {
            if (arg_str(x, &it, &coll) < 0)
                return -1;
        } else if (!strcmp(k, "batchSize")) {
            if (arg_int64(x, &it, &batch) < 0)
                return -1;
            if (batch < 0)
                return doc_errf(&x->e, DOC_BadValue,
                                "BatchSize value must be non-negative, but received: %lld",
                                (long long)batch);
        }
    }
    if (!coll)
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field 'getMore.collection' is missing but a required field");
    x->srv->st.getmores++;
    cur = cursor_lookup(x->cl, id);
    if (!cur)
        return doc_errf(&x->e, DOC_CursorNotFound, "cursor id %lld not found", (long long)id);
    ns_of(ns, x->db, coll);
    if (strcmp(ns, cur->ns) != 0)
        return doc_errf(&x->e, DOC_Unauthorized,
                        "Requested getMore on namespace '%s', but cursor belongs to a different namespace %s",
                        ns, cur->ns);
    return reply_cursor(x, cur, "nextBatch", batch, false, true);
}

static int cmd_killcursors(struct ctx *x)
{
    bson_t ids, killed, notfound, empty;
    bson_iter_t it, ai;
    const char *cname;
    uint32_t nk = 0, nn = 0;
    char kb[16];

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (!bson_iter_init_find(&it, x->cmd, "cursors"))
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field 'killCursors.cursors' is missing but a required field");
    if (arg_array(x, &it, &ids) < 0)
        return -1;
    bson_iter_init(&ai, &ids);
    while (bson_iter_next(&ai))
        if (!BSON_ITER_HOLDS_INT64(&ai))
            return doc_errf(&x->e, DOC_TypeMismatch,
                            "BSON field 'killCursors.cursors.%s' is the wrong type '%s', expected type 'long'",
                            bson_iter_key(&ai), doc_type_name(bson_iter_type(&ai)));
    bson_init(&killed);
    bson_init(&notfound);
    bson_iter_init(&ai, &ids);
    while (bson_iter_next(&ai)) {
        int64_t id = bson_iter_int64(&ai);
        struct doc_cursor *cur = cursor_lookup(x->cl, id);

        if (cur) {
            bson_append_int64(&killed, idx_key(nk++, kb, sizeof(kb)), -1, id);
            cursor_close(cur);
        } else {
            bson_append_int64(&notfound, idx_key(nn++, kb, sizeof(kb)), -1, id);
        }
    }
    bson_append_array(x->reply, "cursorsKilled", -1, &killed);
    bson_append_array(x->reply, "cursorsNotFound", -1, &notfound);
    bson_destroy(&killed);
    bson_destroy(&notfound);
    bson_init(&empty);
    bson_append_array(x->reply, "cursorsAlive", -1, &empty);
    bson_append_array(x->reply, "cursorsUnknown", -1, &empty);
    bson_destroy(&empty);
    return 0;
}

/* ---- update, delete ---- */

/* After an update, `out` must keep old's _id: a replacement without one
 * gets it back first; a changed one is ImmutableField. Returns the
 * document to write (out, or `fixed` built from it). */
static const bson_t *keep_id(const bson_t *old, const bson_t *out, bson_t *fixed, bool *built,
                             struct doc_err *e)
{
    bson_iter_t oi, ni;

    *built = false;
    if (!bson_iter_init_find(&oi, old, "_id"))
        return out;
    if (bson_iter_init_find(&ni, out, "_id")) {
        bson_value_t a, b;

        a = *bson_iter_value(&oi);
        b = *bson_iter_value(&ni);
        if (!doc_val_eq(&a, &b)) {
            doc_errf(e, DOC_ImmutableField,
                     "After applying the update, the (immutable) field '_id' was found to have been altered");
            return NULL;
        }
        return out;
    }
    bson_init(fixed);
    *built = true;
    bson_append_iter(fixed, "_id", 3, &oi);
    if (bson_iter_init(&ni, out))
        while (bson_iter_next(&ni))
            bson_append_iter(fixed, NULL, 0, &ni);
    return fixed;
}

/* Apply `u` to the document at `ref` and write it back: 1 if it changed,
 * 0 if not. `before` and `after` (if not NULL, initialised) get the old
 * and the new document. */
static int update_at(struct doc_coll *c, doc_ref ref, const struct doc_update *u, int64_t now,
                     bson_t *before, bson_t *after, struct doc_err *e, bson_t *failed)
{
    bson_t view, out, fixed;
    const bson_t *w;
    bool built;
    int rc;

    if (!doc_read(c, ref, &view))
        return doc_errf(e, DOC_InternalError, "a matched document went away");
    if (before)
        bson_concat(before, &view);
    bson_init(&out);
    rc = doc_update_apply(u, &view, false, now, &out, e);
    if (rc < 0) {
        bson_destroy(&out);
        return -1;
    }
    w = keep_id(&view, &out, &fixed, &built, e);
    if (!w) {
        bson_destroy(&out);
        return -1;
    }
    if (rc > 0 && doc_replace(c, ref, w, e) < 0) {
        if (failed)
            bson_copy_to(w, failed);
        rc = -1;
    }
    if (rc >= 0 && after)
        bson_concat(after, w);
    if (built)
        bson_destroy(&fixed);
    bson_destroy(&out);
    return rc;
}

/* Insert the document an upsert makes: its _id into *id_out (a copy). */
static int upsert_insert(struct doc_coll *c, const struct doc_update *u, const struct doc_matcher *m,
                         int64_t now, bson_value_t *id_out, bson_t *after, struct doc_err *e,
                         bson_t *failed)
{
    bson_t out, built;
    const bson_t *w;
    bool b;
    bson_iter_t it;
    int rc = 0;

    bson_init(&out);
    if (doc_update_upsert_doc(u, m, now, &out, e) < 0) {
        bson_destroy(&out);
        return -1;
    }
    w = with_id(&out, &built, &b);
    if (doc_insert(c, w, e) < 0) {
        if (failed)
            bson_copy_to(w, failed);
        rc = -1;
    } else {
        if (bson_iter_init_find(&it, w, "_id"))
            bson_value_copy(bson_iter_value(&it), id_out);
        if (after)
            bson_concat(after, w);
    }
    if (b)
        bson_destroy(&built);
    bson_destroy(&out);
    return rc;
}

struct upd_stmt {
    bson_t q, u;
    bool multi, upsert;
};

static int parse_update_stmt(struct ctx *x, const bson_t *st, struct upd_stmt *s, struct doc_err *e)
{
    bson_iter_t it;
    bool has_q = false, has_u = false;

    memset(s, 0, sizeof(*s));
    bson_init(&s->q);
    bson_init(&s->u);
    if (!bson_iter_init(&it, st))
        return doc_errf(e, DOC_InvalidBSON, "invalid update statement");
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int rc = 0;

        if (!strcmp(k, "q")) {
            has_q = true;
            if (!BSON_ITER_HOLDS_DOCUMENT(&it))
                rc = wrong_type(x, &it, "object");
            else
                rc = arg_doc(x, &it, &s->q);
        } else if (!strcmp(k, "u")) {
            has_u = true;
            if (BSON_ITER_HOLDS_ARRAY(&it))
                return doc_errf(e, DOC_NotImplemented,
                                "pipeline-style updates are not supported");
            if (!BSON_ITER_HOLDS_DOCUMENT(&it))
                rc = wrong_type(x, &it, "object");
            else
                rc = arg_doc(x, &it, &s->u);
        } else if (!strcmp(k, "multi")) {
            rc = arg_bool(x, &it, &s->multi);
        } else if (!strcmp(k, "upsert")) {
            rc = arg_bool(x, &it, &s->upsert);
        } else if (!strcmp(k, "arrayFilters")) {
            return doc_errf(e, DOC_NotImplemented, "arrayFilters are not supported");
        } else if (!strcmp(k, "collation")) {
            rc = arg_collation(x, &it);
        }
        if (rc < 0) {
            *e = x->e;
            return -1;
        }
    }
    if (!has_q || !has_u)
        return doc_errf(e, IDL_MISSING,
                        "BSON field 'update.updates.%s' is missing but a required field",
                        has_q ? "u" : "q");
    return 0;
}

static int update_stmt(struct ctx *x, const char *cname, struct doc_coll **cp, const bson_t *st,
                       uint32_t index, int64_t *n, int64_t *nmod, bson_t *ups, uint32_t *nups,
                       struct doc_err *e, bson_t *failed)
{
    struct doc_matcher *m = NULL;
    struct doc_update *u = NULL;
    struct upd_stmt s;
    int64_t now = wall_ms(), matched = 0;
    int rc = -1;

    if (parse_update_stmt(x, st, &s, e) < 0)
        return -1;
    if (doc_match_compile(&s.q, &m, e) < 0)
        return -1;
    if (doc_update_compile(&s.u, &u, e) < 0)
        goto out;
    if (s.multi && doc_update_is_replacement(u)) {
        doc_errf(e, DOC_FailedToParse, "multi update is not supported for replacement-style update");
        goto out;
    }
    if (*cp && s.multi) {
        bson_t ids;
        bson_iter_t it;
        uint32_t nids;

        bson_init(&ids);
        if (collect_ids(*cp, m, &ids, &nids, e) < 0) {
            bson_destroy(&ids);
            goto out;
        }
        if (bson_iter_init(&it, &ids))
            while (bson_iter_next(&it)) {
                doc_ref ref = doc_find_id(*cp, bson_iter_value(&it));
                int r;

                if (!ref)
                    continue;
                r = update_at(*cp, ref, u, now, NULL, NULL, e, failed);
                if (r < 0) {
                    bson_destroy(&ids);
                    goto out;
                }
                matched++;
                (*n)++;
                *nmod += r;
            }
        bson_destroy(&ids);
    } else if (*cp) {
        doc_ref ref;
        int r = find_first(*cp, m, NULL, &ref, e);

        if (r < 0)
            goto out;
        if (r > 0) {
            r = update_at(*cp, ref, u, now, NULL, NULL, e, failed);
            if (r < 0)
                goto out;
            matched++;
            (*n)++;
            *nmod += r;
        }
    }
    if (!matched && s.upsert) {
        bson_value_t id;
        bson_t ue;
        char kb[16];

        if (!*cp) {
            *cp = doc_coll_get(x->srv->store, x->db, cname, true, e);
            if (!*cp)
                goto out;
        }
        if (upsert_insert(*cp, u, m, now, &id, NULL, e, failed) < 0)
            goto out;
        bson_append_document_begin(ups, idx_key((*nups)++, kb, sizeof(kb)), -1, &ue);
        bson_append_int32(&ue, "index", 5, (int32_t)index);
        bson_append_value(&ue, "_id", 3, &id);
        bson_append_document_end(ups, &ue);
        bson_value_destroy(&id);
        (*n)++;
    }
    rc = 0;
out:
    doc_update_free(u);
    doc_match_free(m);
    return rc;
}

static int cmd_update(struct ctx *x)
{
    const char *cname;
    bool ordered = true;
    struct doc_coll *c;
    struct docs d;
    bson_iter_t it;
    bson_t st, werrs, ups;
    uint32_t total, nerr = 0, nups = 0, i = 0;
    int64_t n = 0, nmod = 0;

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (bson_iter_init_find(&it, x->cmd, "ordered") && arg_bool(x, &it, &ordered) < 0)
        return -1;
    if (docs_count(x, "updates", &total) < 0)
        return -1;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    docs_open(x, "updates", &d);
    bson_init(&werrs);
    bson_init(&ups);
    while (docs_next(x, &d, &st) > 0) {
        struct doc_err e = {0};
        bson_t failed = BSON_INITIALIZER;

        x->srv->st.updates++;
        if (update_stmt(x, cname, &c, &st, i, &n, &nmod, &ups, &nups, &e, &failed) < 0) {
            write_error(&werrs, &nerr, i, &e, c, bson_empty(&failed) ? NULL : &failed);
            if (ordered) {
                bson_destroy(&failed);
                break;
            }
        }
        bson_destroy(&failed);
        i++;
    }
    bson_append_int32(x->reply, "n", 1, (int32_t)n);
    if (nups)
        bson_append_array(x->reply, "upserted", -1, &ups);
    bson_append_int32(x->reply, "nModified", 9, (int32_t)nmod);
    if (nerr)
        bson_append_array(x->reply, "writeErrors", -1, &werrs);
    bson_destroy(&werrs);
    bson_destroy(&ups);
    return 0;
}

static int delete_stmt(struct ctx *x, struct doc_coll *c, const bson_t *st, int64_t *n,
                       struct doc_err *e)
{
    struct doc_matcher *m = NULL;
    bson_t q = BSON_INITIALIZER;
    bool has_q = false, has_limit = false;
    int64_t limit = 0;
    bson_iter_t it;
    int rc = -1;

    if (!bson_iter_init(&it, st))
        return doc_errf(e, DOC_InvalidBSON, "invalid delete statement");
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "q")) {
            has_q = true;
            r = BSON_ITER_HOLDS_DOCUMENT(&it) ? arg_doc(x, &it, &q) : wrong_type(x, &it, "object");
        } else if (!strcmp(k, "limit")) {
            has_limit = true;
            r = arg_int64(x, &it, &limit);
        } else if (!strcmp(k, "collation")) {
            r = arg_collation(x, &it);
        }
        if (r < 0) {
            *e = x->e;
            return -1;
        }
    }
    if (!has_q || !has_limit)
        return doc_errf(e, IDL_MISSING,
                        "BSON field 'delete.deletes.%s' is missing but a required field",
                        has_q ? "limit" : "q");
    if (limit != 0 && limit != 1)
        return doc_errf(e, DOC_BadValue, "The limit field in delete objects must be 0 or 1. Got %lld",
                        (long long)limit);
    if (doc_match_compile(&q, &m, e) < 0)
        return -1;
    if (!c) {
        rc = 0;
    } else if (limit == 1) {
        doc_ref ref;
        int r = find_first(c, m, NULL, &ref, e);

        if (r < 0 || (r > 0 && doc_delete(c, ref, e) < 0))
            goto out;
        *n += r;
        rc = 0;
    } else {
        bson_t ids = BSON_INITIALIZER;
        bson_iter_t ii;
        uint32_t nids;

        if (collect_ids(c, m, &ids, &nids, e) < 0) {
            bson_destroy(&ids);
            goto out;
        }
        rc = 0;
        if (bson_iter_init(&ii, &ids))
            while (bson_iter_next(&ii)) {
                doc_ref ref = doc_find_id(c, bson_iter_value(&ii));

                if (!ref)
                    continue;
                if (doc_delete(c, ref, e) < 0) {
                    rc = -1;
                    break;
                }
                (*n)++;
            }
        bson_destroy(&ids);
    }
out:
    doc_match_free(m);
    return rc;
}

static int cmd_delete(struct ctx *x)
{
    const char *cname;
    bool ordered = true;
    struct doc_coll *c;
    struct docs d;
    bson_iter_t it;
    bson_t st, werrs;
    uint32_t total, nerr = 0, i = 0;
    int64_t n = 0;

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (bson_iter_init_find(&it, x->cmd, "ordered") && arg_bool(x, &it, &ordered) < 0)
        return -1;
    if (docs_count(x, "deletes", &total) < 0)
        return -1;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    docs_open(x, "deletes", &d);
    bson_init(&werrs);
    while (docs_next(x, &d, &st) > 0) {
        struct doc_err e = {0};

        x->srv->st.deletes++;
        if (delete_stmt(x, c, &st, &n, &e) < 0) {
            write_error(&werrs, &nerr, i, &e, c, NULL);
            if (ordered)
                break;
        }
        i++;
    }
    bson_append_int32(x->reply, "n", 1, (int32_t)n);
    if (nerr)
        bson_append_array(x->reply, "writeErrors", -1, &werrs);
    bson_destroy(&werrs);
    return 0;
}

/* ---- findAndModify ---- */

static int cmd_find_and_modify(struct ctx *x)
{
    bson_t query = BSON_INITIALIZER, sortd = BSON_INITIALIZER, upd = BSON_INITIALIZER,
           fields = BSON_INITIALIZER;
    bool remove = false, want_new = false, upsert = false, has_update = false;
    struct doc_matcher *m = NULL;
    struct doc_sort *sort = NULL;
    struct doc_update *u = NULL;
    struct doc_proj *proj = NULL;
    bson_t before = BSON_INITIALIZER, after = BSON_INITIALIZER, leo, shown;
    bson_value_t upserted_id = {0};
    const bson_t *value = NULL;
    const char *cname;
    struct doc_coll *c;
    bson_iter_t it;
    int found = 0, rc = -1, changed = 0;
    bool upserted = false;
    doc_ref ref = 0;

    if (arg_coll(x, &cname) < 0)
        return -1;
    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "query"))
            r = arg_doc(x, &it, &query);
        else if (!strcmp(k, "sort"))
            r = arg_doc(x, &it, &sortd);
        else if (!strcmp(k, "fields"))
            r = arg_doc(x, &it, &fields);
        else if (!strcmp(k, "remove"))
            r = arg_bool(x, &it, &remove);
        else if (!strcmp(k, "new"))
            r = arg_bool(x, &it, &want_new);
        else if (!strcmp(k, "upsert"))
            r = arg_bool(x, &it, &upsert);
        else if (!strcmp(k, "update")) {
            if (BSON_ITER_HOLDS_ARRAY(&it))
                return doc_errf(&x->e, DOC_NotImplemented, "pipeline-style updates are not supported");
            has_update = true;
            r = BSON_ITER_HOLDS_DOCUMENT(&it) ? arg_doc(x, &it, &upd) : wrong_type(x, &it, "object");
        } else if (!strcmp(k, "arrayFilters"))
            return doc_errf(&x->e, DOC_NotImplemented, "arrayFilters are not supported");
        else if (!strcmp(k, "collation"))
            r = arg_collation(x, &it);
        if (r < 0)
            return -1;
    }
    if (remove && has_update)
        return doc_errf(&x->e, DOC_FailedToParse, "Cannot specify both an update and remove=true");
    if (!remove && !has_update)
        return doc_errf(&x->e, DOC_FailedToParse, "Either an update or remove=true must be specified");
    if (remove && want_new)
        return doc_errf(&x->e, DOC_FailedToParse,
                        "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document");
    if (remove && upsert)
        return doc_errf(&x->e, DOC_FailedToParse, "Cannot specify both upsert=true and remove=true");
    if (doc_match_compile(&query, &m, &x->e) < 0)
        return -1;
    if (!bson_empty(&sortd) && doc_sort_compile(&sortd, &sort, &x->e) < 0)
        goto out;
    if (!bson_empty(&fields) && doc_proj_compile(&fields, &proj, &x->e) < 0)
        goto out;
    if (has_update && doc_update_compile(&upd, &u, &x->e) < 0)
        goto out;
    if (coll_find(x, cname, &c) < 0)
        goto out;
    if (c) {
        found = find_first(c, m, sort, &ref, &x->e);
        if (found < 0)
            goto out;
    }
    if (found && remove) {
        bson_t view;

        if (!doc_read(c, ref, &view)) {
            doc_errf(&x->e, DOC_InternalError, "a matched document went away");
            goto out;
        }
        bson_concat(&before, &view);
        if (doc_delete(c, ref, &x->e) < 0)
            goto out;
        value = &before;
        x->srv->st.deletes++;
    } else if (found) {
        changed = update_at(c, ref, u, wall_ms(), &before, &after, &x->e, NULL);
        if (changed < 0)
            goto out;
        value = want_new ? &after : &before;
        x->srv->st.updates++;
    } else if (upsert) {
        if (!c && !(c = doc_coll_get(x->srv->store, x->db, cname, true, &x->e)))
            goto out;
        if (upsert_insert(c, u, m, wall_ms(), &upserted_id, &after, &x->e, NULL) < 0)
            goto out;
        upserted = true;
        value = want_new ? &after : NULL;
        x->srv->st.updates++;
    }
    bson_append_document_begin(x->reply, "lastErrorObject", -1, &leo);
    bson_append_int32(&leo, "n", 1, found || upserted ? 1 : 0);
    if (!remove)
        bson_append_bool(&leo, "updatedExisting", -1, found > 0);
    if (upserted)
        bson_append_value(&leo, "upserted", -1, &upserted_id);
    bson_append_document_end(x->reply, &leo);
    if (value && proj) {
        bson_init(&shown);
        if (doc_proj_apply(proj, value, &shown, &x->e) < 0) {
            bson_destroy(&shown);
            bson_reinit(x->reply);
            goto out;
        }
        bson_append_document(x->reply, "value", 5, &shown);
        bson_destroy(&shown);
    } else if (value) {
        bson_append_document(x->reply, "value", 5, value);
    } else {
        bson_append_null(x->reply, "value", 5);
    }
    rc = 0;
out:
    if (upserted)
        bson_value_destroy(&upserted_id);
    bson_destroy(&before);
    bson_destroy(&after);
    doc_match_free(m);
    doc_sort_free(sort);
    doc_proj_free(proj);
    doc_update_free(u);
    return rc;
}

/* ---- count, distinct ---- */

static int cmd_count(struct ctx *x)
{
    bson_t query = BSON_INITIALIZER;
    int64_t skip = 0, limit = 0, n = 0;
    struct doc_matcher *m;
    struct doc_scan *sc;
    struct doc_plan plan;
    const char *cname;
    struct doc_coll *c;
    bson_iter_t it;

    if (arg_coll(x, &cname) < 0)
        return -1;
    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "query"))
            r = arg_doc(x, &it, &query);
        else if (!strcmp(k, "skip"))
            r = arg_int64(x, &it, &skip);
        else if (!strcmp(k, "limit"))
            r = arg_int64(x, &it, &limit);
        else if (!strcmp(k, "collation"))
            r = arg_collation(x, &it);
        if (r < 0)
            return -1;
    }
    if (skip < 0)
        return doc_errf(&x->e, DOC_BadValue, "skip value is negative in count query");
    if (limit < 0)
        limit = limit == INT64_MIN ? INT64_MAX : -limit;
    if (limit > INT64_MAX - skip)
        limit = 0;
    x->srv->st.queries++;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    if (c && bson_empty(&query)) {
        n = (int64_t)doc_coll_count(c);
    } else if (c) {
        bson_t view;
        doc_ref ref;

        if (doc_match_compile(&query, &m, &x->e) < 0)
            return -1;
        if (doc_scan_open(c, m, NULL, &sc, &plan, &x->e) < 0) {
            doc_match_free(m);
            return -1;
        }
        while ((limit == 0 || n < skip + limit) && doc_scan_next(sc, &view, &ref) > 0)
            n++;
        doc_scan_close(sc);
        doc_match_free(m);
    }
    n = n > skip ? n - skip : 0;
    if (limit > 0 && n > limit)
        n = limit;
    /* MongoDB answers an int unless the count needs more */
    if (n <= INT32_MAX)
        bson_append_int32(x->reply, "n", 1, (int32_t)n);
    else
        bson_append_int64(x->reply, "n", 1, n);
    return 0;
}

struct distinct_ctx {
    struct doc_buf keys;        /* the values' key strings, back to back */
    struct doc_buf offs;        /* where each starts (uint64_t) */
    bson_t vals;                /* the values, as an array */
    uint32_t n;
};

static void distinct_add(struct distinct_ctx *d, const bson_value_t *v)
{
    uint64_t off = d->keys.len;
    char kb[16];

    doc_buf_add(&d->offs, &off, sizeof(off));
    doc_key_add(&d->keys, v, false);
    bson_append_value(&d->vals, idx_key(d->n, kb, sizeof(kb)), -1, v);
    d->n++;
}

static int distinct_visit(void *arg, const bson_value_t *v, bool in_array)
{
    struct distinct_ctx *d = arg;

    (void)in_array;
    if (v->value_type == BSON_TYPE_ARRAY) {
        /* distinct unwinds an array at the end of the path, one level */
        bson_t arr;
        bson_iter_t it;

        if (bson_init_static(&arr, v->value.v_doc.data, v->value.v_doc.data_len) &&
            bson_iter_init(&it, &arr))
            while (bson_iter_next(&it))
                distinct_add(d, bson_iter_value(&it));
        return 0;
    }
    distinct_add(d, v);
    return 0;
}

static uint64_t off_at(const struct distinct_ctx *d, uint32_t i)
{
    uint64_t off;

    if (i >= d->n)
        return d->keys.len;
    memcpy(&off, d->offs.p + (size_t)i * sizeof(off), sizeof(off));
    return off;
}

struct key_ref {
    uint64_t off, len;
    uint32_t i;
};

static int key_ref_cmp(const void *a, const void *b, void *arg)
{
    const struct key_ref *x = a, *y = b;
    const uint8_t *k = arg;
    uint64_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(k + x->off, k + y->off, n);

    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static int cmd_distinct(struct ctx *x)
{
    bson_t query = BSON_INITIALIZER, arr;
    struct distinct_ctx d = {0};
    struct doc_matcher *m = NULL;
    struct key_ref *refs = NULL;
    bson_value_t *vals = NULL;
    const char *cname, *key = NULL;
    struct doc_coll *c;
    bson_iter_t it;
    uint32_t i, out = 0;
    size_t bytes = 0;
    char kb[16];
    int rc = -1;

    if (arg_coll(x, &cname) < 0)
        return -1;
    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "key"))
            r = arg_str(x, &it, &key);
        else if (!strcmp(k, "query"))
            r = arg_doc(x, &it, &query);
        else if (!strcmp(k, "collation"))
            r = arg_collation(x, &it);
        if (r < 0)
            return -1;
    }
    if (!key)
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field 'distinct.key' is missing but a required field");
    x->srv->st.queries++;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    bson_init(&d.vals);
    if (c) {
        struct doc_scan *sc;
        struct doc_plan plan;
        bson_t view;
        doc_ref ref;

        if (doc_match_compile(&query, &m, &x->e) < 0)
            goto out;
        if (doc_scan_open(c, m, NULL, &sc, &plan, &x->e) < 0)
            goto out;
        while (doc_scan_next(sc, &view, &ref) > 0) {
            doc_walk(&view, key, 0, distinct_visit, &d);
            if (d.keys.len + d.vals.len > BLOCKING_MEM_MAX) {
                doc_scan_close(sc);
                too_much(&x->e);
                goto out;
            }
        }
        doc_scan_close(sc);
    }
    if (d.keys.oom || d.offs.oom)
        goto oom;
    refs = calloc(d.n ? d.n : 1, sizeof(*refs));
    vals = calloc(d.n ? d.n : 1, sizeof(*vals));
    if (!refs || !vals)
        goto oom;
    i = 0;
    if (bson_iter_init(&it, &d.vals))
        while (bson_iter_next(&it) && i < d.n) {
            refs[i].off = off_at(&d, i);
            refs[i].len = off_at(&d, i + 1) - refs[i].off;
            refs[i].i = i;
            vals[i] = *bson_iter_value(&it);
            i++;
        }
    if (d.n)
        qsort_r(refs, d.n, sizeof(*refs), key_ref_cmp, d.keys.p);
    bson_append_array_begin(x->reply, "values", 6, &arr);
    for (i = 0; i < d.n; i++) {
        if (i > 0 && refs[i].len == refs[i - 1].len &&
            memcmp(d.keys.p + refs[i].off, d.keys.p + refs[i - 1].off, refs[i].len) == 0)
            continue;
        bson_append_value(&arr, idx_key(out++, kb, sizeof(kb)), -1, &vals[refs[i].i]);
        bytes = arr.len;
    }
    bson_append_array_end(x->reply, &arr);
    if (bytes > doc_store_max_doc(x->srv->store)) {
        bson_reinit(x->reply);
        doc_errf(&x->e, 17217, "distinct too big, 16mb cap");
        goto out;
    }
    rc = 0;
    goto out;
oom:
    doc_errf(&x->e, DOC_ExceededMemoryLimit, "out of memory");
out:
    free(refs);
    free(vals);
    doc_match_free(m);
    bson_destroy(&d.vals);
    doc_buf_free(&d.keys);
    doc_buf_free(&d.offs);
    return rc;
}

/* ---- explain ---- */

enum verbosity { V_PLANNER, V_EXEC };

static int parse_verbosity(struct ctx *x, enum verbosity *v)
{
    bson_iter_t it;
    const char *s;

    *v = V_EXEC;                /* MongoDB's default: allPlansExecution */
    if (!bson_iter_init_find(&it, x->cmd, "verbosity"))
        return 0;
    if (arg_str(x, &it, &s) < 0)
        return -1;
    if (!strcmp(s, "queryPlanner"))
        *v = V_PLANNER;
    else if (strcmp(s, "executionStats") && strcmp(s, "allPlansExecution"))
        return doc_errf(&x->e, DOC_BadValue, "verbosity string must be one of "
                        "{'queryPlanner', 'executionStats', 'allPlansExecution'}");
    return 0;
}

/* {queryPlanner: {namespace, parsedQuery, winningPlan: {stage, [indexName]},
 * rejectedPlans}, [executionStats]} for a scan of `m` in `sort` order. */
static int explain_scan(struct ctx *x, const char *ns, struct doc_coll *c, const bson_t *filter,
                        const struct doc_matcher *m, const struct doc_sort *sort, int64_t skip,
                        int64_t limit, enum verbosity v)
{
    struct doc_scan *sc = NULL;
    struct doc_plan plan = {0};
    struct doc_scan_stats ss = {0};
    bson_t qp, wp, es, empty = BSON_INITIALIZER;
    int64_t returned = 0, seen = 0;

    if (sort && doc_sort_natural(sort))
        sort = NULL;
    if (c && doc_scan_open(c, m, sort, &sc, &plan, &x->e) < 0)
        return -1;
    if (sc && v == V_EXEC) {
        bson_t view;
        doc_ref ref;

        while ((limit <= 0 || returned < limit) && doc_scan_next(sc, &view, &ref) > 0)
            if (seen++ >= skip)
                returned++;
        doc_scan_stats(sc, &ss);
    }
    if (sc)
        doc_scan_close(sc);
    bson_append_document_begin(x->reply, "queryPlanner", -1, &qp);
    bson_append_int32(&qp, "plannerVersion", -1, 1);
    bson_append_utf8(&qp, "namespace", -1, ns, -1);
    bson_append_bool(&qp, "indexFilterSet", -1, false);
    bson_append_document(&qp, "parsedQuery", -1, filter ? filter : &empty);
    bson_append_document_begin(&qp, "winningPlan", -1, &wp);
    if (!c) {
        bson_append_utf8(&wp, "stage", -1, "EOF", -1);
    } else if (plan.index[0]) {
        bson_append_utf8(&wp, "stage", -1, "IXSCAN", -1);
        bson_append_utf8(&wp, "indexName", -1, plan.index, -1);
        bson_append_utf8(&wp, "direction", -1, plan.reverse ? "backward" : "forward", -1);
    } else {
        bson_append_utf8(&wp, "stage", -1, "COLLSCAN", -1);
        bson_append_utf8(&wp, "direction", -1, plan.reverse ? "backward" : "forward", -1);
    }
    if (c && sort && !plan.sorted)
        bson_append_bool(&wp, "blockingSort", -1, true);
    bson_append_document_end(&qp, &wp);
    bson_append_array(&qp, "rejectedPlans", -1, &empty);
    bson_append_document_end(x->reply, &qp);
    if (v == V_EXEC) {
        bson_append_document_begin(x->reply, "executionStats", -1, &es);
        bson_append_bool(&es, "executionSuccess", -1, true);
        bson_append_int64(&es, "nReturned", -1, returned);
        bson_append_int64(&es, "executionTimeMillis", -1, 0);
        bson_append_int64(&es, "totalKeysExamined", -1, (int64_t)ss.keys_examined);
        bson_append_int64(&es, "totalDocsExamined", -1, (int64_t)ss.docs_examined);
        bson_append_document_end(x->reply, &es);
    }
    return 0;
}

static int cmd_explain(struct ctx *x)
{
    bson_t inner, filter = BSON_INITIALIZER, sortd = BSON_INITIALIZER;
    struct doc_matcher *m = NULL;
    struct doc_sort *sort = NULL;
    struct doc_pipeline *pipe = NULL;
    struct ctx ix = *x;
    enum verbosity v;
    int64_t skip = 0, limit = 0;
    const char *what, *cname;
    struct doc_coll *c;
    char ns[NS_MAX];
    bson_iter_t it;
    int rc = -1;

    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    if (!BSON_ITER_HOLDS_DOCUMENT(&it))
        return wrong_type(x, &it, "object");
    if (arg_doc(x, &it, &inner) < 0 || parse_verbosity(x, &v) < 0)
        return -1;
    if (!bson_iter_init(&it, &inner) || !bson_iter_next(&it))
        return doc_errf(&x->e, DOC_FailedToParse, "explain of an empty command");
    what = bson_iter_key(&it);
    ix.cmd = &inner;
    ix.name = what;
    if (arg_coll(&ix, &cname) < 0) {
        x->e = ix.e;
        return -1;
    }
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "filter") || !strcmp(k, "query"))
            r = arg_doc(&ix, &it, &filter);
        else if (!strcmp(k, "sort"))
            r = arg_doc(&ix, &it, &sortd);
        else if (!strcmp(k, "skip"))
            r = arg_int64(&ix, &it, &skip);
        else if (!strcmp(k, "limit"))
            r = arg_int64(&ix, &it, &limit);
        else if ((!strcmp(k, "updates") || !strcmp(k, "deletes")) && BSON_ITER_HOLDS_ARRAY(&it)) {
            bson_iter_t s, q;

            /* the first statement's filter: what a write's explain shows */
            if (bson_iter_recurse(&it, &s) && bson_iter_next(&s) && BSON_ITER_HOLDS_DOCUMENT(&s) &&
                bson_iter_recurse(&s, &q) && bson_iter_find(&q, "q"))
                r = arg_doc(&ix, &q, &filter);
        } else if (!strcmp(k, "pipeline")) {
            bson_t stages;

            r = arg_array(&ix, &it, &stages);
            if (r == 0)
                r = doc_agg_compile(&stages, &pipe, &ix.e);
        }
        if (r < 0) {
            x->e = ix.e;
            goto out;
        }
    }
    if (strcmp(what, "find") && strcmp(what, "count") && strcmp(what, "distinct") &&
        strcmp(what, "aggregate") && strcmp(what, "update") && strcmp(what, "delete") &&
        strcmp(what, "findAndModify") && strcmp(what, "findandmodify")) {
        doc_errf(&x->e, DOC_CommandNotFound, "Explain failed due to unknown command: %s", what);
        goto out;
    }
    if (limit < 0)
        limit = limit == INT64_MIN ? INT64_MAX : -limit;
    if (coll_find(x, cname, &c) < 0)
        goto out;
    ns_of(ns, x->db, cname);
    if (pipe) {
        const struct doc_matcher *lm = doc_agg_leading_match(pipe);

        if (!lm && doc_match_compile(&filter, &m, &x->e) < 0)
            goto out;
        rc = explain_scan(x, ns, c, NULL, lm ? lm : m, doc_agg_leading_sort(pipe), 0, 0, v);
        goto out;
    }
    if (doc_match_compile(&filter, &m, &x->e) < 0)
        goto out;
    if (!bson_empty(&sortd) && doc_sort_compile(&sortd, &sort, &x->e) < 0)
        goto out;
    rc = explain_scan(x, ns, c, &filter, m, sort, skip, limit, v);
    if (rc == 0)
        bson_append_document(x->reply, "command", -1, &inner);
out:
    doc_match_free(m);
    doc_sort_free(sort);
    doc_agg_free(pipe);
    if (rc < 0)
        bson_reinit(x->reply);
    return rc;
}

/* ---- aggregate ---- */

static void coll_stats(struct doc_coll *c, bson_t *out);

struct agg_src {
    struct doc_scan *sc;
};

static int agg_source(void *arg, bson_t *doc, struct doc_err *e)
{
    struct agg_src *s = arg;
    doc_ref ref;

    (void)e;
    if (!s->sc)
        return 0;
    return doc_scan_next(s->sc, doc, &ref) > 0;
}

static int agg_sink(void *arg, const bson_t *doc, struct doc_err *e)
{
    struct doc_cursor *cur = arg;

    buf_add_doc(&cur->buf, doc);
    if (cur->buf.oom)
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory holding the results");
    if (cur->buf.len > BLOCKING_MEM_MAX)
        return doc_errf(e, DOC_QueryExceededMemoryLimitNoDiskUseAllowed,
                        "aggregation results exceed %u bytes", BLOCKING_MEM_MAX);
    return 0;
}

/* A source of one document. */
struct one_src {
    const bson_t *doc;
    bool done;
};

static int one_source(void *arg, bson_t *doc, struct doc_err *e)
{
    struct one_src *s = arg;

    (void)e;
    if (s->done)
        return 0;
    s->done = true;
    return bson_init_static(doc, bson_get_data(s->doc), s->doc->len) ? 1 : 0;
}

/* Run a pipeline from `source` into a buffered cursor of `ns` and reply with
 * its first batch (`batch` < 0: the default size). The reply's code, or -1
 * with x->e set. */
static int agg_reply(struct ctx *x, const char *ns, const struct doc_pipeline *pipe,
                     const struct doc_agg_run_opts *ro, doc_source_fn source, void *src,
                     int64_t batch)
{
    struct doc_cursor *cur = cursor_new(ns);

    if (!cur)
        return doc_errf(&x->e, DOC_ExceededMemoryLimit, "out of memory");
    cur->buffered = true;
    if (doc_agg_run(pipe, ro, source, src, agg_sink, cur, &x->e) < 0) {
        cursor_destroy(cur);
        return -1;
    }
    if (batch < 0)
        batch = x->srv->o.default_batch;
    return reply_cursor(x, cur, "firstBatch", batch == 0 ? -1 : batch, false, false);
}


/* A pipeline that starts with $collStats (mongosh's db.c.stats() and
 * dataSize()): that stage makes one document, {ns, host, localTime,
 * [storageStats], [count]}, and the rest of the pipeline runs on it. */
static int agg_coll_stats(struct ctx *x, const char *cname, const bson_t *stages,
                          const bson_iter_t *spec_it, int64_t batch)
{
    struct doc_pipeline *pipe = NULL;
    struct doc_agg_run_opts ro = {0};
    struct one_src src = {0};
    bson_t spec, rest = BSON_INITIALIZER, out = BSON_INITIALIZER, sub;
    bson_iter_t it;
    struct doc_coll *c;
    char ns[NS_MAX], host[256], kb[16];
    uint32_t n = 0;
    int rc = -1;

    if (!cname)
        return doc_errf(&x->e, DOC_BadValue, "$collStats must be run against a collection");
    if (!BSON_ITER_HOLDS_DOCUMENT(spec_it))
        return doc_errf(&x->e, DOC_TypeMismatch, "$collStats takes an object");
    if (arg_doc(x, spec_it, &spec) < 0 || coll_find(x, cname, &c) < 0)
        return -1;
    ns_of(ns, x->db, cname);
    if (!c)
        return doc_errf(&x->e, DOC_NamespaceNotFound,
                        "Unable to retrieve storageStats in $collStats stage :: caused by :: Collection [%s] not found.",
                        ns);
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = 0;
    bson_append_utf8(&out, "ns", 2, ns, -1);
    bson_append_utf8(&out, "host", 4, host, -1);
    bson_append_date_time(&out, "localTime", -1, wall_ms());
    if (bson_iter_init_find(&it, &spec, "storageStats")) {
        bson_append_document_begin(&out, "storageStats", -1, &sub);
        coll_stats(c, &sub);
        bson_append_document_end(&out, &sub);
    }
    if (bson_iter_init_find(&it, &spec, "count")) {
        bson_append_document_begin(&out, "count", -1, &sub);
        bson_append_int64(&sub, "count", -1, (int64_t)doc_coll_count(c));
        bson_append_document_end(&out, &sub);
    }
    bson_iter_init(&it, stages);
    bson_iter_next(&it);
    while (bson_iter_next(&it))
        bson_append_iter(&rest, idx_key(n++, kb, sizeof(kb)), -1, &it);
    if (doc_agg_compile(&rest, &pipe, &x->e) < 0)
        goto out;
    src.doc = &out;
    rc = agg_reply(x, ns, pipe, &ro, one_source, &src, batch);
out:
    doc_agg_free(pipe);
    bson_destroy(&rest);
    bson_destroy(&out);
    return rc;
}

static int cmd_aggregate(struct ctx *x)
{
    struct doc_pipeline *pipe = NULL;
    struct doc_matcher *all = NULL;
    struct agg_src src = {0};
    struct doc_agg_run_opts ro = {0};
    const struct doc_matcher *lm;
    const struct doc_sort *ls;
    struct doc_plan plan = {0};
    bool has_cursor = false, explain = false, has_pipe = false;
    int64_t batch = -1;
    const char *cname = NULL;
    struct doc_coll *c = NULL;
    char ns[NS_MAX];
    bson_t stages;
    bson_iter_t it;
    int rc = -1;

    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    if (BSON_ITER_HOLDS_UTF8(&it)) {
        if (arg_coll(x, &cname) < 0)
            return -1;
    } else if (!(BSON_ITER_HOLDS_NUMBER(&it) && bson_iter_as_int64(&it) == 1)) {
        return doc_errf(&x->e, DOC_FailedToParse,
                        "Invalid {aggregate: ...} value: must be a collection name or 1");
    }
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "pipeline")) {
            has_pipe = true;
            r = arg_array(x, &it, &stages);
        } else if (!strcmp(k, "cursor")) {
            has_cursor = true;
            r = cursor_opt(x, &it, &batch);
        } else if (!strcmp(k, "explain")) {
            r = arg_bool(x, &it, &explain);
        } else if (!strcmp(k, "collation")) {
            r = arg_collation(x, &it);
        }
        if (r < 0)
            return -1;
    }
    if (!has_pipe)
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field 'aggregate.pipeline' is missing but a required field");
    if (!has_cursor && !explain)
        return doc_errf(&x->e, DOC_FailedToParse,
                        "The 'cursor' option is required, except for aggregate with the explain argument");
    {
        bson_iter_t si, f;

        if (bson_iter_init(&si, &stages) && bson_iter_next(&si) &&
            BSON_ITER_HOLDS_DOCUMENT(&si) && bson_iter_recurse(&si, &f) && bson_iter_next(&f) &&
            !strcmp(bson_iter_key(&f), "$collStats")) {
            if (explain)
                return doc_errf(&x->e, DOC_NotImplemented, "explain of $collStats");
            return agg_coll_stats(x, cname, &stages, &f, batch);
        }
    }
    if (doc_agg_compile(&stages, &pipe, &x->e) < 0)
        return -1;
    x->srv->st.queries++;
    if (cname && coll_find(x, cname, &c) < 0)
        goto out;
    if (cname)
        ns_of(ns, x->db, cname);
    else
        snprintf(ns, sizeof(ns), "%s.$cmd.aggregate", x->db);
    lm = doc_agg_leading_match(pipe);
    ls = doc_agg_leading_sort(pipe);
    if (ls && doc_sort_natural(ls))
        ls = NULL;
    if (!lm && doc_match_compile(&(bson_t)BSON_INITIALIZER, &all, &x->e) < 0)
        goto out;
    if (explain) {
        bson_t empty = BSON_INITIALIZER;

        rc = explain_scan(x, ns, c, &empty, lm ? lm : all, ls, 0, 0, V_PLANNER);
        if (rc < 0)
            bson_reinit(x->reply);
        goto out;
    }
    if (c && doc_scan_open(c, lm ? lm : all, ls, &src.sc, &plan, &x->e) < 0) {
        src.sc = NULL;
        goto out;
    }
    ro.skip_leading = lm ? 1 : 0;
    if (ls && plan.sorted)
        ro.skip_leading++;
    rc = agg_reply(x, ns, pipe, &ro, agg_source, &src, batch);
out:
    if (src.sc)
        doc_scan_close(src.sc);
    doc_match_free(all);
    doc_agg_free(pipe);
    return rc;
}

/* ---- indexes ---- */

static int32_t index_count(struct doc_coll *c)
{
    bson_t arr = BSON_INITIALIZER;
    int32_t n;

    doc_index_list(c, &arr);
    n = (int32_t)bson_count_keys(&arr);
    bson_destroy(&arr);
    return n;
}

/* Check a spec and fill *out (pointing into it). */
static int index_spec(struct ctx *x, const bson_t *spec, bson_t *key, struct doc_index_spec *out)
{
    bson_iter_t it, ki;
    bool has_key = false;

    memset(out, 0, sizeof(*out));
    if (!bson_iter_init(&it, spec))
        return doc_errf(&x->e, DOC_InvalidBSON, "invalid index specification");
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);

        if (!strcmp(k, "key")) {
            if (!BSON_ITER_HOLDS_DOCUMENT(&it))
                return doc_errf(&x->e, DOC_TypeMismatch,
                                "The field 'key' must be an object, but got %s",
                                doc_type_name(bson_iter_type(&it)));
            if (arg_doc(x, &it, key) < 0)
                return -1;
            has_key = true;
        } else if (!strcmp(k, "name")) {
            if (!BSON_ITER_HOLDS_UTF8(&it))
                return doc_errf(&x->e, DOC_TypeMismatch,
                                "The field 'name' must be a string, but got %s",
                                doc_type_name(bson_iter_type(&it)));
            if (arg_str(x, &it, &out->name) < 0)
                return -1;
            if (!out->name[0] || strlen(out->name) >= sizeof(((struct doc_plan *)0)->index))
                return doc_errf(&x->e, DOC_CannotCreateIndex, "invalid index name '%s'",
                                out->name);
        } else if (!strcmp(k, "unique")) {
            if (arg_bool(x, &it, &out->unique) < 0)
                return -1;
        } else if (!strcmp(k, "background") || !strcmp(k, "v") || !strcmp(k, "ns")) {
            /* no meaning here: builds are synchronous, one version */
        } else if (!strcmp(k, "sparse") || !strcmp(k, "hidden")) {
            bool b;

            if (arg_bool(x, &it, &b) < 0)
                return -1;
            if (b)
                return doc_errf(&x->e, DOC_NotImplemented, "index option '%s' is not supported", k);
        } else {
            return doc_errf(&x->e, DOC_NotImplemented, "index option '%s' is not supported", k);
        }
    }
    if (!has_key)
        return doc_errf(&x->e, DOC_FailedToParse,
                        "The 'key' field is a required property of an index specification");
    if (bson_empty(key))
        return doc_errf(&x->e, DOC_CannotCreateIndex, "Index keys cannot be empty.");
    if (bson_count_keys(key) > DOC_INDEX_FIELDS_MAX)
        return doc_errf(&x->e, DOC_CannotCreateIndex, "Index key pattern has more than %d fields",
                        DOC_INDEX_FIELDS_MAX);
    bson_iter_init(&ki, key);
    while (bson_iter_next(&ki)) {
        if (BSON_ITER_HOLDS_UTF8(&ki))
            return doc_errf(&x->e, DOC_CannotCreateIndex, "Index type '%s' is not supported",
                            bson_iter_utf8(&ki, NULL));
        if (!BSON_ITER_HOLDS_NUMBER(&ki) || bson_iter_as_double(&ki) == 0 ||
            !isfinite(bson_iter_as_double(&ki)))
            return doc_errf(&x->e, DOC_CannotCreateIndex,
                            "Values in the index key pattern can only be positive or negative numbers");
        if (!bson_iter_key(&ki)[0])
            return doc_errf(&x->e, DOC_CannotCreateIndex, "Index keys cannot be an empty field.");
    }
    out->key = key;
    return 0;
}

static int cmd_create_indexes(struct ctx *x)
{
    const char *cname;
    struct doc_coll *c;
    bson_t specs, spec, key;
    bson_iter_t it, si;
    int32_t before, after;
    bool existed;
    unsigned n = 0;

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (!bson_iter_init_find(&it, x->cmd, "indexes"))
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field 'createIndexes.indexes' is missing but a required field");
    if (arg_array(x, &it, &specs) < 0)
        return -1;
    bson_iter_init(&si, &specs);
    while (bson_iter_next(&si)) {
        struct doc_index_spec s;

        if (!BSON_ITER_HOLDS_DOCUMENT(&si))
            return doc_errf(&x->e, DOC_TypeMismatch,
                            "BSON field 'createIndexes.indexes.%s' is the wrong type '%s', expected type 'object'",
                            bson_iter_key(&si), doc_type_name(bson_iter_type(&si)));
        if (arg_doc(x, &si, &spec) < 0 || index_spec(x, &spec, &key, &s) < 0)
            return -1;
        n++;
    }
    if (n == 0)
        return doc_errf(&x->e, DOC_BadValue, "Must specify at least one index to create");
    if (coll_find(x, cname, &c) < 0)
        return -1;
    existed = c != NULL;
    if (!c && !(c = doc_coll_get(x->srv->store, x->db, cname, true, &x->e)))
        return -1;
    before = index_count(c);
    bson_iter_init(&si, &specs);
    while (bson_iter_next(&si)) {
        struct doc_index_spec s;

        arg_doc(x, &si, &spec);
        index_spec(x, &spec, &key, &s);
        if (doc_index_create(c, &s, &x->e) < 0)
            return -1;
    }
    after = index_count(c);
    bson_append_int32(x->reply, "numIndexesBefore", -1, before);
    bson_append_int32(x->reply, "numIndexesAfter", -1, after);
    bson_append_bool(x->reply, "createdCollectionAutomatically", -1, !existed);
    if (before == after)
        bson_append_utf8(x->reply, "note", -1, "all indexes already exist", -1);
    return 0;
}

/* A buffered cursor over the documents of an array. */
static struct doc_cursor *cursor_of_array(const char *ns, const bson_t *arr)
{
    struct doc_cursor *cur = cursor_new(ns);
    bson_iter_t it;

    if (!cur)
        return NULL;
    cur->buffered = true;
    if (bson_iter_init(&it, arr))
        while (bson_iter_next(&it))
            if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
                const uint8_t *d;
                uint32_t l;

                bson_iter_document(&it, &l, &d);
                doc_buf_add(&cur->buf, d, l);
            }
    if (cur->buf.oom) {
        cursor_destroy(cur);
        return NULL;
    }
    return cur;
}

static int reply_array_cursor(struct ctx *x, const char *ns, const bson_t *arr, int64_t batch)
{
    struct doc_cursor *cur = cursor_of_array(ns, arr);

    if (!cur)
        return doc_errf(&x->e, DOC_ExceededMemoryLimit, "out of memory");
    if (batch < 0)
        batch = x->srv->o.default_batch;
    return reply_cursor(x, cur, "firstBatch", batch == 0 ? -1 : batch, false, false);
}

static int cmd_list_indexes(struct ctx *x)
{
    const char *cname;
    struct doc_coll *c;
    int64_t batch = -1;
    char ns[NS_MAX];
    bson_iter_t it;
    bson_t arr = BSON_INITIALIZER;
    int rc;

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (bson_iter_init_find(&it, x->cmd, "cursor") && cursor_opt(x, &it, &batch) < 0)
        return -1;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    ns_of(ns, x->db, cname);
    if (!c)
        return doc_errf(&x->e, DOC_NamespaceNotFound, "ns does not exist: %s", ns);
    doc_index_list(c, &arr);
    rc = reply_array_cursor(x, ns, &arr, batch);
    bson_destroy(&arr);
    return rc;
}

/* The name of the index whose key pattern is `key`: 1 and name, or 0. */
static int index_by_key(struct doc_coll *c, const bson_t *key, char *name, size_t size)
{
    bson_t arr = BSON_INITIALIZER;
    bson_iter_t it;
    int found = 0;

    doc_index_list(c, &arr);
    if (bson_iter_init(&it, &arr))
        while (!found && bson_iter_next(&it)) {
            bson_iter_t s, k, nm;
            bson_t kd;
            const uint8_t *d;
            uint32_t l;

            if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &s))
                continue;
            k = s;
            nm = s;
            if (!bson_iter_find(&k, "key") || !BSON_ITER_HOLDS_DOCUMENT(&k) ||
                !bson_iter_find(&nm, "name") || !BSON_ITER_HOLDS_UTF8(&nm))
                continue;
            bson_iter_document(&k, &l, &d);
            if (bson_init_static(&kd, d, l) && doc_cmp(&kd, key) == 0) {
                snprintf(name, size, "%s", bson_iter_utf8(&nm, NULL));
                found = 1;
            }
        }
    bson_destroy(&arr);
    return found;
}

static int cmd_drop_indexes(struct ctx *x)
{
    const char *cname, *name;
    struct doc_coll *c;
    char ns[NS_MAX], kname[128];
    bson_iter_t it, ai;
    int32_t was;

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (!bson_iter_init_find(&it, x->cmd, "index"))
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field 'dropIndexes.index' is missing but a required field");
    if (coll_find(x, cname, &c) < 0)
        return -1;
    ns_of(ns, x->db, cname);
    if (!c)
        return doc_errf(&x->e, DOC_NamespaceNotFound, "ns not found %s", ns);
    was = index_count(c);
    if (BSON_ITER_HOLDS_UTF8(&it)) {
        if (arg_str(x, &it, &name) < 0 || doc_index_drop(c, name, &x->e) < 0)
            return -1;
    } else if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
        bson_t key;

        if (arg_doc(x, &it, &key) < 0)
            return -1;
        if (!index_by_key(c, &key, kname, sizeof(kname))) {
            char *js = bson_as_relaxed_extended_json(&key, NULL);

            doc_errf(&x->e, DOC_IndexNotFound, "can't find index with key: %s", js ? js : "?");
            bson_free(js);
            return -1;
        }
        if (doc_index_drop(c, kname, &x->e) < 0)
            return -1;
    } else if (BSON_ITER_HOLDS_ARRAY(&it)) {
        bson_iter_recurse(&it, &ai);
        while (bson_iter_next(&ai))
            if (!BSON_ITER_HOLDS_UTF8(&ai))
                return doc_errf(&x->e, DOC_TypeMismatch, "dropIndexes: index names must be strings");
        bson_iter_recurse(&it, &ai);
        while (bson_iter_next(&ai))
            if (arg_str(x, &ai, &name) < 0 || doc_index_drop(c, name, &x->e) < 0)
                return -1;
    } else {
        return wrong_type(x, &it, "string");
    }
    bson_append_int32(x->reply, "nIndexesWas", -1, was);
    return 0;
}

/* ---- namespaces ---- */

struct list_colls {
    struct ctx *x;
    struct doc_matcher *m;
    bool name_only;
    bson_t arr;
    uint32_t n;
};

static int list_colls_fn(void *arg, struct doc_coll *c)
{
    struct list_colls *l = arg;
    bson_t d = BSON_INITIALIZER, sub, idx, key;
    char kb[16];

    bson_append_utf8(&d, "name", 4, doc_coll_name(c), -1);
    bson_append_utf8(&d, "type", 4, "collection", -1);
    bson_append_document_begin(&d, "options", -1, &sub);
    bson_append_document_end(&d, &sub);
    bson_append_document_begin(&d, "info", -1, &sub);
    bson_append_bool(&sub, "readOnly", -1, false);
    bson_append_document_end(&d, &sub);
    bson_append_document_begin(&d, "idIndex", -1, &idx);
    bson_append_int32(&idx, "v", 1, 2);
    bson_append_document_begin(&idx, "key", 3, &key);
    bson_append_int32(&key, "_id", 3, 1);
    bson_append_document_end(&idx, &key);
    bson_append_utf8(&idx, "name", 4, "_id_", -1);
    bson_append_document_end(&d, &idx);
    if (doc_match(l->m, &d)) {
        if (l->name_only) {
            bson_t s;

            bson_append_document_begin(&l->arr, idx_key(l->n++, kb, sizeof(kb)), -1, &s);
            bson_append_utf8(&s, "name", 4, doc_coll_name(c), -1);
            bson_append_utf8(&s, "type", 4, "collection", -1);
            bson_append_document_end(&l->arr, &s);
        } else {
            bson_append_document(&l->arr, idx_key(l->n++, kb, sizeof(kb)), -1, &d);
        }
    }
    bson_destroy(&d);
    return 0;
}

static int cmd_list_collections(struct ctx *x)
{
    struct list_colls l = {.x = x};
    bson_t filter = BSON_INITIALIZER;
    int64_t batch = -1;
    char ns[NS_MAX];
    bson_iter_t it;
    int rc;

    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "filter"))
            r = arg_doc(x, &it, &filter);
        else if (!strcmp(k, "nameOnly"))
            r = arg_bool(x, &it, &l.name_only);
        else if (!strcmp(k, "cursor"))
            r = cursor_opt(x, &it, &batch);
        if (r < 0)
            return -1;
    }
    if (doc_match_compile(&filter, &l.m, &x->e) < 0)
        return -1;
    bson_init(&l.arr);
    doc_coll_each(x->srv->store, x->db, list_colls_fn, &l);
    snprintf(ns, sizeof(ns), "%s.$cmd.listCollections", x->db);
    rc = reply_array_cursor(x, ns, &l.arr, batch);
    bson_destroy(&l.arr);
    doc_match_free(l.m);
    return rc;
}

struct list_dbs {
    struct doc_matcher *m;
    bool name_only;
    bson_t arr;
    uint32_t n;
    uint64_t total;
};

static int list_dbs_fn(void *arg, const char *db, uint64_t bytes)
{
    struct list_dbs *l = arg;
    bson_t d = BSON_INITIALIZER;
    char kb[16];

    bson_append_utf8(&d, "name", 4, db, -1);
    if (!l->name_only) {
        bson_append_int64(&d, "sizeOnDisk", -1, (int64_t)bytes);
        bson_append_bool(&d, "empty", -1, bytes == 0);
    }
    if (doc_match(l->m, &d)) {
        bson_append_document(&l->arr, idx_key(l->n++, kb, sizeof(kb)), -1, &d);
        l->total += bytes;
    }
    bson_destroy(&d);
    return 0;
}

static int cmd_list_databases(struct ctx *x)
{
    struct list_dbs l = {0};
    bson_t filter = BSON_INITIALIZER;
    bson_iter_t it;

    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int r = 0;

        if (!strcmp(k, "filter"))
            r = arg_doc(x, &it, &filter);
        else if (!strcmp(k, "nameOnly"))
            r = arg_bool(x, &it, &l.name_only);
        if (r < 0)
            return -1;
    }
    if (doc_match_compile(&filter, &l.m, &x->e) < 0)
        return -1;
    bson_init(&l.arr);
    doc_db_each(x->srv->store, list_dbs_fn, &l);
    bson_append_array(x->reply, "databases", -1, &l.arr);
    if (!l.name_only) {
        bson_append_int64(x->reply, "totalSize", -1, (int64_t)l.total);
        bson_append_int64(x->reply, "totalSizeMb", -1, (int64_t)(l.total >> 20));
    }
    bson_destroy(&l.arr);
    doc_match_free(l.m);
    return 0;
}

static int cmd_create(struct ctx *x)
{
    const char *cname;
    bson_iter_t it;

    if (arg_coll(x, &cname) < 0)
        return -1;
    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);

        if (!strcmp(k, "capped") || !strcmp(k, "viewOn") || !strcmp(k, "timeseries") ||
            !strcmp(k, "clusteredIndex") || !strcmp(k, "validator")) {
            if (!strcmp(k, "capped") && !bson_iter_as_bool(&it))
                continue;
            return doc_errf(&x->e, DOC_NotImplemented, "create: option '%s' is not supported", k);
        }
    }
    return doc_coll_create(x->srv->store, x->db, cname, &x->e) < 0 ? -1 : 0;
}

static int cmd_drop(struct ctx *x)
{
    const char *cname;
    struct doc_coll *c;
    char ns[NS_MAX];
    int32_t was;

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    if (!c)
        return doc_errf(&x->e, DOC_NamespaceNotFound, "ns not found");
    was = index_count(c);
    if (doc_coll_drop(x->srv->store, x->db, cname, &x->e) < 0)
        return -1;
    ns_of(ns, x->db, cname);
    bson_append_int32(x->reply, "nIndexesWas", -1, was);
    bson_append_utf8(x->reply, "ns", 2, ns, -1);
    return 0;
}

static int cmd_drop_database(struct ctx *x)
{
    if (doc_db_drop(x->srv->store, x->db, &x->e) < 0)
        return -1;
    bson_append_utf8(x->reply, "dropped", -1, x->db, -1);
    return 0;
}

/* collStats' figures (and $collStats' storageStats). */
static void coll_stats(struct doc_coll *c, bson_t *out)
{
    uint64_t count = doc_coll_count(c), size = doc_coll_bytes(c);
    bson_t arr = BSON_INITIALIZER, sizes;
    bson_iter_t it;

    bson_append_int64(out, "size", -1, (int64_t)size);
    bson_append_int64(out, "count", -1, (int64_t)count);
    if (count)
        bson_append_int64(out, "avgObjSize", -1, (int64_t)(size / count));
    bson_append_int64(out, "storageSize", -1, (int64_t)size);
    bson_append_int64(out, "freeStorageSize", -1, 0);
    bson_append_bool(out, "capped", -1, false);
    doc_index_list(c, &arr);
    bson_append_int32(out, "nindexes", -1, (int32_t)bson_count_keys(&arr));
    bson_append_int64(out, "totalIndexSize", -1, 0);
    bson_append_int64(out, "totalSize", -1, (int64_t)size);
    bson_append_document_begin(out, "indexSizes", -1, &sizes);
    if (bson_iter_init(&it, &arr))
        while (bson_iter_next(&it)) {
            bson_iter_t n;

            if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &n) &&
                bson_iter_find(&n, "name") && BSON_ITER_HOLDS_UTF8(&n))
                bson_append_int64(&sizes, bson_iter_utf8(&n, NULL), -1, 0);
        }
    bson_append_document_end(out, &sizes);
    bson_append_int32(out, "scaleFactor", -1, 1);
    bson_destroy(&arr);
}

static int cmd_coll_stats(struct ctx *x)
{
    const char *cname;
    struct doc_coll *c;
    char ns[NS_MAX];

    if (arg_coll(x, &cname) < 0)
        return -1;
    if (coll_find(x, cname, &c) < 0)
        return -1;
    ns_of(ns, x->db, cname);
    if (!c)
        return doc_errf(&x->e, DOC_NamespaceNotFound, "Collection [%s] not found.", ns);
    bson_append_utf8(x->reply, "ns", 2, ns, -1);
    coll_stats(c, x->reply);
    return 0;
}

struct db_stats {
    uint64_t colls, objects, bytes, indexes;
};

static int db_stats_fn(void *arg, struct doc_coll *c)
{
    struct db_stats *s = arg;

    s->colls++;
    s->objects += doc_coll_count(c);
    s->bytes += doc_coll_bytes(c);
    s->indexes += (uint64_t)index_count(c);
    return 0;
}

static int cmd_db_stats(struct ctx *x)
{
    struct db_stats s = {0};
    struct doc_store_info info;

    doc_coll_each(x->srv->store, x->db, db_stats_fn, &s);
    doc_store_info(x->srv->store, &info);
    bson_append_utf8(x->reply, "db", 2, x->db, -1);
    bson_append_int64(x->reply, "collections", -1, (int64_t)s.colls);
    bson_append_int64(x->reply, "views", -1, 0);
    bson_append_int64(x->reply, "objects", -1, (int64_t)s.objects);
    bson_append_double(x->reply, "avgObjSize", -1, s.objects ? (double)s.bytes / s.objects : 0);
    bson_append_int64(x->reply, "dataSize", -1, (int64_t)s.bytes);
    bson_append_int64(x->reply, "storageSize", -1, (int64_t)s.bytes);
    bson_append_int64(x->reply, "indexes", -1, (int64_t)s.indexes);
    bson_append_int64(x->reply, "indexSize", -1, 0);
    bson_append_int64(x->reply, "totalSize", -1, (int64_t)s.bytes);
    bson_append_int32(x->reply, "scaleFactor", -1, 1);
    bson_append_int64(x->reply, "fsUsedSize", -1, (int64_t)info.pool_used);
    bson_append_int64(x->reply, "fsTotalSize", -1, (int64_t)info.pool_size);
    return 0;
}

/* ---- the server as a whole ---- */

/* What hello says of this member and its set: the roles, and the set's
 * fields into srv->topo. The counter goes up when that is not what it was
 * the last time (doc_cmd.h). */
static void topology_now(struct doc_server *srv)
{
    bool primary = true, secondary = false;

    bson_reinit(srv->topo);
    if (srv->repl && srv->hello) {
        primary = repl_writable(srv->repl) == 0;
        secondary = !primary && repl_consistent(srv->repl);
        srv->hello(srv->hello_arg, srv->topo, primary);
    }
    if (primary == srv->topo_primary && secondary == srv->topo_secondary &&
        srv->topo->len == srv->topo_last->len &&
        !memcmp(bson_get_data(srv->topo), bson_get_data(srv->topo_last), srv->topo->len))
        return;
    srv->topo_primary = primary;
    srv->topo_secondary = secondary;
    bson_reinit(srv->topo_last);
    bson_concat(srv->topo_last, srv->topo);
    srv->topo_counter++;
}

int64_t doc_server_topology(struct doc_server *srv)
{
    topology_now(srv);
    return srv->topo_counter;
}

void doc_client_await(const struct doc_client *c, struct doc_await *a)
{
    *a = c->aw;
}

/* An awaitable hello's topologyVersion {processId, counter}, checked as
 * MongoDB's IDL parser checks it (its codes: 10065 not an object, 40413
 * a field twice, 40414 one missing, 40415 one unknown). */
static int topology_arg(struct ctx *x, const bson_iter_t *tv, bson_oid_t *pid, int64_t *counter)
{
    bson_iter_t f;
    bool has_pid = false, has_counter = false;

    if (!BSON_ITER_HOLDS_DOCUMENT(tv) || !bson_iter_recurse(tv, &f))
        return doc_errf(&x->e, 10065, "invalid parameter: expected an object (topologyVersion)");
    while (bson_iter_next(&f)) {
        const char *k = bson_iter_key(&f);
        bool is_pid = !strcmp(k, "processId");

        if (!is_pid && strcmp(k, "counter"))
            return doc_errf(&x->e, 40415, "BSON field 'TopologyVersion.%s' is an unknown field.",
                            k);
        if (is_pid ? has_pid : has_counter)
            return doc_errf(&x->e, 40413, "BSON field 'TopologyVersion.%s' is a duplicate field",
                            k);
        if (is_pid ? !BSON_ITER_HOLDS_OID(&f) : !BSON_ITER_HOLDS_INT64(&f))
            return doc_errf(&x->e, DOC_TypeMismatch,
                            "BSON field 'TopologyVersion.%s' is the wrong type '%s', expected "
                            "type '%s'", k, doc_type_name(bson_iter_type(&f)),
                            is_pid ? "objectId" : "long");
        if (is_pid) {
            bson_oid_copy(bson_iter_oid(&f), pid);
            has_pid = true;
        } else {
            *counter = bson_iter_int64(&f);
            has_counter = true;
        }
    }
    if (!has_pid || !has_counter)
        return doc_errf(&x->e, IDL_MISSING,
                        "BSON field 'TopologyVersion.%s' is missing but a required field",
                        has_pid ? "counter" : "processId");
    if (*counter < 0)
        return doc_errf(&x->e, 51758, "topologyVersion must have a non-negative counter");
    return 0;
}

/* The awaitable hello's fields: topologyVersion and maxAwaitTimeMS, both
 * or neither (MongoDB's codes), against the topology as topology_now
 * just saw it. Fills x->cl->aw. */
static int await_args(struct ctx *x)
{
    bson_iter_t tv, ma;
    bool has_tv = bson_iter_init_find(&tv, x->cmd, "topologyVersion");
    bool has_ma = bson_iter_init_find(&ma, x->cmd, "maxAwaitTimeMS");
    bson_oid_t pid;
    int64_t counter = 0, ms;

    x->cl->aw.current = false;
    x->cl->aw.max_ms = 0;
    if (!has_tv && !has_ma)
        return 0;
    if (!has_tv || !has_ma)
        return doc_errf(&x->e, 31368,
                        has_tv ? "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'"
                               : "A request with 'maxAwaitTimeMS' must include a "
                                 "'topologyVersion'");
    if (topology_arg(x, &tv, &pid, &counter) < 0 || arg_int64(x, &ma, &ms) < 0)
        return -1;
    if (ms < 0)
        return doc_errf(&x->e, 31373, "maxAwaitTimeMS must be a non-negative integer");
    if (bson_oid_equal(&pid, &x->srv->process_id)) {
        /* Only this process has given out its counters. */
        if (counter > x->srv->topo_counter)
            return doc_errf(&x->e, 31382,
                            "Received a topology version with the same process ID and a higher "
                            "counter. Client counter: %lld, server counter: %lld",
                            (long long)counter, (long long)x->srv->topo_counter);
        x->cl->aw.current = counter == x->srv->topo_counter;
    }
    x->cl->aw.max_ms = ms > DOC_AWAIT_MAX_MS ? DOC_AWAIT_MAX_MS : (uint64_t)ms;
    x->cl->awaitable = true;
    return 0;
}

static int cmd_hello(struct ctx *x)
{
    struct doc_server *srv = x->srv;
    bson_iter_t it;
    bson_t tv;
    bool hello_ok = false;

    if (bson_iter_init_find(&it, x->cmd, "helloOk") && arg_bool(x, &it, &hello_ok) < 0)
        return -1;
    /* One look at the topology: the reply says what its counter counts. */
    topology_now(srv);
    if (await_args(x) < 0)
        return -1;
    x->cl->aw.counter = srv->topo_counter;
    if (hello_ok)
        bson_append_bool(x->reply, "helloOk", -1, true);
    if (srv->repl && srv->hello) {
        /* A replica set's member: its role and the set, as drivers read them. */
        bson_append_bool(x->reply, !strcmp(x->name, "hello") ? "isWritablePrimary" : "ismaster",
                         -1, srv->topo_primary);
        bson_append_bool(x->reply, "secondary", -1, srv->topo_secondary);
        bson_concat(x->reply, srv->topo);
    } else {
        bson_append_bool(x->reply, "ismaster", -1, true);
        if (!strcmp(x->name, "hello"))
            bson_append_bool(x->reply, "isWritablePrimary", -1, true);
    }
    bson_append_document_begin(x->reply, "topologyVersion", -1, &tv);
    bson_append_oid(&tv, "processId", -1, &srv->process_id);
    bson_append_int64(&tv, "counter", -1, srv->topo_counter);
    bson_append_document_end(x->reply, &tv);
    bson_append_int32(x->reply, "maxBsonObjectSize", -1,
                      (int32_t)doc_store_max_doc(x->srv->store));
    bson_append_int32(x->reply, "maxMessageSizeBytes", -1, MESSAGE_MAX);
    bson_append_int32(x->reply, "maxWriteBatchSize", -1, WRITE_BATCH_MAX);
    bson_append_date_time(x->reply, "localTime", -1, wall_ms());
    bson_append_int32(x->reply, "logicalSessionTimeoutMinutes", -1, 30);
    bson_append_int32(x->reply, "connectionId", -1, x->cl->conn_id);
    bson_append_int32(x->reply, "minWireVersion", -1, 0);
    bson_append_int32(x->reply, "maxWireVersion", -1, x->srv->o.max_wire_version);
    bson_append_bool(x->reply, "readOnly", -1, false);
    return 0;
}

static int cmd_ping(struct ctx *x)
{
    (void)x;
    return 0;
}

static int cmd_build_info(struct ctx *x)
{
    bson_t arr, sub;
    int i;

    bson_append_utf8(x->reply, "version", -1, x->srv->version, -1);
    bson_append_utf8(x->reply, "gitVersion", -1, "tern", -1);
    bson_append_array_begin(x->reply, "versionArray", -1, &arr);
    for (i = 0; i < 4; i++) {
        char kb[16];

        bson_append_int32(&arr, idx_key(i, kb, sizeof(kb)), -1, x->srv->version_arr[i]);
    }
    bson_append_array_end(x->reply, &arr);
    bson_append_int32(x->reply, "bits", -1, 64);
    bson_append_bool(x->reply, "debug", -1, false);
    bson_append_int32(x->reply, "maxBsonObjectSize", -1,
                      (int32_t)doc_store_max_doc(x->srv->store));
    bson_append_array_begin(x->reply, "modules", -1, &sub);
    bson_append_array_end(x->reply, &sub);
    bson_append_utf8(x->reply, "javascriptEngine", -1, "none", -1);
    bson_append_utf8(x->reply, "sysInfo", -1, "deprecated", -1);
    bson_append_array_begin(x->reply, "storageEngines", -1, &sub);
    bson_append_utf8(&sub, "0", 1, "tern", -1);
    bson_append_array_end(x->reply, &sub);
    return 0;
}

static int cmd_get_parameter(struct ctx *x)
{
    bson_iter_t it;
    bool all = false, fcv = false;

    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    if (BSON_ITER_HOLDS_UTF8(&it) && !strcmp(bson_iter_utf8(&it, NULL), "*"))
        all = true;
    else if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
        bson_iter_t o;

        if (bson_iter_recurse(&it, &o) && bson_iter_find(&o, "allParameters") &&
            bson_iter_as_bool(&o))
            all = true;
    }
    while (bson_iter_next(&it))
        if (!strcmp(bson_iter_key(&it), "featureCompatibilityVersion"))
            fcv = true;
    if (!all && !fcv)
        return doc_errf(&x->e, DOC_InvalidOptions, "no option found to get");
    {
        bson_t v;

        bson_append_document_begin(x->reply, "featureCompatibilityVersion", -1, &v);
        bson_append_utf8(&v, "version", -1, "6.0", -1);
        bson_append_document_end(x->reply, &v);
    }
    return 0;
}

static int cmd_server_status(struct ctx *x)
{
    struct doc_server *srv = x->srv;
    struct timespec now;
    int64_t up_ms;
    bson_t sub, sub2, sub3;
    char host[256];

    clock_gettime(CLOCK_MONOTONIC, &now);
    up_ms = (int64_t)(now.tv_sec - srv->started.tv_sec) * 1000 +
            (now.tv_nsec - srv->started.tv_nsec) / 1000000;
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = 0;
    bson_append_utf8(x->reply, "host", -1, host, -1);
    bson_append_utf8(x->reply, "version", -1, srv->version, -1);
    bson_append_utf8(x->reply, "process", -1, "ternd", -1);
    bson_append_int64(x->reply, "pid", -1, (int64_t)getpid());
    bson_append_double(x->reply, "uptime", -1, (double)(up_ms / 1000));
    bson_append_int64(x->reply, "uptimeMillis", -1, up_ms);
    bson_append_date_time(x->reply, "localTime", -1, wall_ms());
    bson_append_document_begin(x->reply, "connections", -1, &sub);
    bson_append_int32(&sub, "current", -1, (int32_t)srv->nclients);
    bson_append_int32(&sub, "available", -1, 1000000);
    bson_append_int64(&sub, "totalCreated", -1, (int64_t)srv->clients_total);
    bson_append_document_end(x->reply, &sub);
    bson_append_document_begin(x->reply, "opcounters", -1, &sub);
    bson_append_int64(&sub, "insert", -1, (int64_t)srv->st.inserts);
    bson_append_int64(&sub, "query", -1, (int64_t)srv->st.queries);
    bson_append_int64(&sub, "update", -1, (int64_t)srv->st.updates);
    bson_append_int64(&sub, "delete", -1, (int64_t)srv->st.deletes);
    bson_append_int64(&sub, "getmore", -1, (int64_t)srv->st.getmores);
    bson_append_int64(&sub, "command", -1, (int64_t)srv->st.commands);
    bson_append_document_end(x->reply, &sub);
    bson_append_document_begin(x->reply, "metrics", -1, &sub);
    bson_append_document_begin(&sub, "cursor", -1, &sub2);
    bson_append_int64(&sub2, "timedOut", -1, (int64_t)srv->st.cursors_timed_out);
    bson_append_document_begin(&sub2, "open", -1, &sub3);
    bson_append_int64(&sub3, "total", -1, (int64_t)srv->ncursors);
    bson_append_document_end(&sub2, &sub3);
    bson_append_document_end(&sub, &sub2);
    bson_append_document_end(x->reply, &sub);
    return 0;
}

static int cmd_host_info(struct ctx *x)
{
    bson_t sys, os, extra;
    char host[256];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = 0;
    bson_append_document_begin(x->reply, "system", -1, &sys);
    bson_append_date_time(&sys, "currentTime", -1, wall_ms());
    bson_append_utf8(&sys, "hostname", -1, host, -1);
    bson_append_int32(&sys, "cpuAddrSize", -1, 64);
    bson_append_int64(&sys, "memSizeMB", -1, pages > 0 && psize > 0 ? (int64_t)pages * psize >> 20 : 0);
    bson_append_int32(&sys, "numCores", -1, cores > 0 ? (int32_t)cores : 1);
    bson_append_utf8(&sys, "cpuArch", -1, "x86_64", -1);
    bson_append_document_end(x->reply, &sys);
    bson_append_document_begin(x->reply, "os", -1, &os);
    bson_append_utf8(&os, "type", -1, "Linux", -1);
    bson_append_utf8(&os, "name", -1, "Linux", -1);
    bson_append_document_end(x->reply, &os);
    bson_append_document_begin(x->reply, "extra", -1, &extra);
    bson_append_document_end(x->reply, &extra);
    return 0;
}

static int cmd_whatsmyuri(struct ctx *x)
{
    bson_append_utf8(x->reply, "you", -1, x->cl->peer, -1);
    return 0;
}

static int cmd_get_log(struct ctx *x)
{
    bson_iter_t it;
    bson_t arr;

    bson_iter_init(&it, x->cmd);
    bson_iter_next(&it);
    if (!BSON_ITER_HOLDS_UTF8(&it))
        return wrong_type(x, &it, "string");
    if (!strcmp(bson_iter_utf8(&it, NULL), "*")) {
        bson_append_array_begin(x->reply, "names", -1, &arr);
        bson_append_utf8(&arr, "0", 1, "global", -1);
        bson_append_utf8(&arr, "1", 1, "startupWarnings", -1);
        bson_append_array_end(x->reply, &arr);
        return 0;
    }
    if (strcmp(bson_iter_utf8(&it, NULL), "global") &&
        strcmp(bson_iter_utf8(&it, NULL), "startupWarnings"))
        return doc_errf(&x->e, DOC_BadValue, "No log named '%s'", bson_iter_utf8(&it, NULL));
    bson_append_int32(x->reply, "totalLinesWritten", -1, 0);
    bson_append_array_begin(x->reply, "log", -1, &arr);
    bson_append_array_end(x->reply, &arr);
    return 0;
}

static int cmd_get_cmd_line_opts(struct ctx *x)
{
    bson_t sub;

    bson_append_array_begin(x->reply, "argv", -1, &sub);
    bson_append_utf8(&sub, "0", 1, "ternd", -1);
    bson_append_array_end(x->reply, &sub);
    bson_append_document_begin(x->reply, "parsed", -1, &sub);
    bson_append_document_end(x->reply, &sub);
    return 0;
}

static int cmd_connection_status(struct ctx *x)
{
    bson_t ai, sub;

    bson_append_document_begin(x->reply, "authInfo", -1, &ai);
    bson_append_array_begin(&ai, "authenticatedUsers", -1, &sub);
    bson_append_array_end(&ai, &sub);
    bson_append_array_begin(&ai, "authenticatedUserRoles", -1, &sub);
    bson_append_array_end(&ai, &sub);
    bson_append_document_end(x->reply, &ai);
    return 0;
}

static int cmd_end_sessions(struct ctx *x)
{
    (void)x;
    return 0;
}

/* ---- dispatch ---- */

enum cmd_flags {
    C_WRITE = 1,                /* may write: the reply waits for the sync */
    C_NODB = 2,                 /* needs no $db */
    C_READ = 4,                 /* reads the store: on a replica, its primary's
                                 * (or a secondary's if the client allows) */
    C_CURSOR = 8,               /* goes on with a cursor: wherever it was opened */
    C_RETRY = 16,               /* a retryable write (lsid, txnNumber) */
};

static const struct cmd {
    const char *name;
    int (*fn)(struct ctx *x);
    unsigned flags;
} cmds[] = {
    {"find", cmd_find, C_READ},
    {"getMore", cmd_getmore, C_READ | C_CURSOR},
    {"insert", cmd_insert, C_WRITE | C_RETRY},
    {"update", cmd_update, C_WRITE | C_RETRY},
    {"delete", cmd_delete, C_WRITE | C_RETRY},
    {"hello", cmd_hello, C_NODB},
    {"isMaster", cmd_hello, C_NODB},
    {"ismaster", cmd_hello, C_NODB},
    {"ping", cmd_ping, C_NODB},
    {"killCursors", cmd_killcursors, 0},
    {"findAndModify", cmd_find_and_modify, C_WRITE | C_RETRY},
    {"findandmodify", cmd_find_and_modify, C_WRITE | C_RETRY},
    {"count", cmd_count, C_READ},
    {"distinct", cmd_distinct, C_READ},
    {"aggregate", cmd_aggregate, C_READ},
    {"createIndexes", cmd_create_indexes, C_WRITE},
    {"listIndexes", cmd_list_indexes, C_READ},
    {"dropIndexes", cmd_drop_indexes, C_WRITE},
    {"deleteIndexes", cmd_drop_indexes, C_WRITE},
    {"listCollections", cmd_list_collections, C_READ},
    {"listDatabases", cmd_list_databases, C_READ},
    {"create", cmd_create, C_WRITE},
    {"drop", cmd_drop, C_WRITE},
    {"dropDatabase", cmd_drop_database, C_WRITE},
    {"collStats", cmd_coll_stats, C_READ},
    {"dbStats", cmd_db_stats, C_READ},
    {"endSessions", cmd_end_sessions, C_NODB},
    {"buildInfo", cmd_build_info, C_NODB},
    {"buildinfo", cmd_build_info, C_NODB},
    {"getParameter", cmd_get_parameter, C_NODB},
    {"serverStatus", cmd_server_status, C_NODB},
    {"hostInfo", cmd_host_info, C_NODB},
    {"whatsmyuri", cmd_whatsmyuri, C_NODB},
    {"getLog", cmd_get_log, C_NODB},
    {"getCmdLineOpts", cmd_get_cmd_line_opts, C_NODB},
    {"connectionStatus", cmd_connection_status, C_NODB},
    {"explain", cmd_explain, C_READ},
};

/* ---- replication ---- */

/* The client takes data a secondary may have a little behind:
 * $readPreference's mode is not primary (drivers send it so). */
static bool secondary_ok(const struct ctx *x)
{
    bson_iter_t it, m;

    if (!bson_iter_init_find(&it, x->cmd, "$readPreference") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
        !bson_iter_recurse(&it, &m) || !bson_iter_find(&m, "mode") || !BSON_ITER_HOLDS_UTF8(&m))
        return false;
    return strcmp(bson_iter_utf8(&m, NULL), "primary") != 0;
}

/* On a replicated server, only the primary writes, and reads go to it
 * unless the client allows a secondary (which must hold the whole shard:
 * not in a full copy). MongoDB's codes, which drivers act on: they look
 * for the primary again and retry. */
static int replica_refuses(struct ctx *x, unsigned flags)
{
    if (repl_writable(x->srv->repl) == 0)
        return 0;
    if (flags & C_WRITE)
        return doc_errf(&x->e, DOC_NotWritablePrimary, "not primary");
    if ((flags & C_CURSOR) || ((flags & C_READ) && secondary_ok(x) &&
                               repl_consistent(x->srv->repl)))
        return 0;
    if (flags & C_READ)
        return doc_errf(&x->e, DOC_NotPrimaryNoSecondaryOk, "not primary and secondaryOk=false");
    return 0;
}

/* writeConcern.w as DOC_CMD_W flags: absent or "majority" is the
 * default (majority, as MongoDB's since 5.0). */
static int write_concern(const bson_t *cmd)
{
    bson_iter_t it, w;
    int64_t n;

    if (!bson_iter_init_find(&it, cmd, "writeConcern") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
        !bson_iter_recurse(&it, &w) || !bson_iter_find(&w, "w") ||
        !(BSON_ITER_HOLDS_NUMBER(&w)))
        return 0;
    n = bson_iter_as_int64(&w);
    if (n <= 1)
        return DOC_CMD_W_ONE;
    return (int)(n > 255 ? 255 : n) << DOC_CMD_W_SHIFT;
}

void doc_server_replicate(struct doc_server *srv, struct repl *r, doc_hello_fn hello, void *arg)
{
    srv->repl = r;
    srv->hello = hello;
    srv->hello_arg = arg;
}

bool doc_server_replicated(const struct doc_server *srv)
{
    return srv->repl != NULL;
}

static enum repl_w concern_of(const struct doc_server *srv, int flags)
{
    unsigned n = doc_cmd_w(flags), replicas;
    struct repl_status st;

    if (flags & DOC_CMD_W_ONE)
        return REPL_W_ONE;
    if (!n)
        return REPL_W_MAJORITY;
    repl_status(srv->repl, &st);
    replicas = st.n ? st.n : 1;
    return n > replicas / 2 + 1 ? REPL_W_ALL : REPL_W_MAJORITY;
}

bool doc_server_wait(struct doc_server *srv, int flags, struct repl_wait *w)
{
    if (!srv->repl)
        return false;
    if (flags & DOC_CMD_WROTE)
        return repl_wait_write(srv->repl, concern_of(srv, flags), w);
    if (flags & DOC_CMD_READ)
        return repl_wait_read(srv->repl, doc_store_version(srv->store), w);
    return false;
}

int doc_server_waited(struct doc_server *srv, const struct repl_wait *w, struct doc_err *e)
{
    int rc = srv->repl ? repl_wait_check(srv->repl, w) : 1;

    if (rc >= 0)
        return rc;
    if (rc == TERN_ESHUTDOWN)
        return doc_errf(e, DOC_ShutdownInProgress, "the server is shutting down");
    return doc_errf(e, DOC_PrimarySteppedDown,
                    "this node stopped being primary before enough replicas held the "
                    "reply's data (%s)", tern_strerror(rc));
}

void doc_server_hold(struct doc_server *srv, struct tern_req *req, int flags)
{
    if (!srv->repl)
        return;
    if (flags & DOC_CMD_WROTE)
        repl_hold(srv->repl, req, concern_of(srv, flags));
    else if (flags & DOC_CMD_READ)
        repl_hold_read(srv->repl, req, doc_store_version(srv->store));
}

/* A retryable write's session: lsid.id (a 16-byte UUID) and txnNumber,
 * outside a transaction (autocommit absent: tern has none). */
static bool session_of(const struct ctx *x, uint8_t lsid[16], int64_t *txn)
{
    bson_iter_t it, l;
    const uint8_t *b;
    uint32_t bl;
    bson_subtype_t st;

    if (!bson_iter_init_find(&it, x->cmd, "txnNumber") || !BSON_ITER_HOLDS_INT64(&it))
        return false;
    *txn = bson_iter_int64(&it);
    if (bson_iter_init_find(&it, x->cmd, "autocommit") ||
        !bson_iter_init_find(&it, x->cmd, "lsid") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
        !bson_iter_recurse(&it, &l) || !bson_iter_find(&l, "id") || !BSON_ITER_HOLDS_BINARY(&l))
        return false;
    bson_iter_binary(&l, &st, &bl, &b);
    if (bl != 16)
        return false;
    memcpy(lsid, b, 16);
    return true;
}

/* A write a driver may send again (after a network error or a primary's
 * fall, perhaps to the next primary): the session's record says whether
 * it ran already, and if so its first reply is the answer. */
static int run_retryable(struct ctx *x, const struct cmd *cmd)
{
    struct doc_store *store = x->srv->store;
    uint8_t lsid[16];
    int64_t txn, had;
    bson_t prev;
    struct doc_err e = {0};
    int rc;

    if (!session_of(x, lsid, &txn))
        return cmd->fn(x);
    if (doc_txn_get(store, lsid, &had, &prev) == 1) {
        if (had == txn) {
            bson_concat(x->reply, &prev);
            x->srv->st.retried++;
            return 0;
        }
        if (had > txn)
            return doc_errf(&x->e, DOC_TransactionTooOld,
                            "Retryable write with txnNumber %lld is prohibited on session "
                            "because a newer retryable write with txnNumber %lld has already "
                            "started on this session.", (long long)txn, (long long)had);
    } else if (doc_txn_full(store)) {
        return doc_errf(&x->e, DOC_TooManyLogicalSessions,
                        "cannot record a retryable write: too many sessions");
    }
    rc = cmd->fn(x);
    if (rc == 0 && doc_txn_put(store, lsid, txn, x->reply, &e) < 0)
        tern_log(TERN_LOG_WARN, "doc", "a retryable write ran but could not be recorded "
                 "(a retry of it would run again): %s", e.msg);
    return rc;
}

static int run(struct ctx *x, const struct cmd **which)
{
    const struct cmd *cmd = NULL;
    bson_iter_t it;
    unsigned i;

    *which = NULL;
    if (check_doc(x->cmd, &x->e) < 0)
        return -1;
    for (i = 0; i < x->nseq; i++)
        if (check_seq(&x->seqs[i], &x->e) < 0)
            return -1;
    if (!bson_iter_init(&it, x->cmd) || !bson_iter_next(&it))
        return doc_errf(&x->e, DOC_FailedToParse, "empty command");
    x->name = bson_iter_key(&it);
    for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(cmds[i].name, x->name))
            cmd = &cmds[i];
    if (!cmd)
        return doc_errf(&x->e, DOC_CommandNotFound, "no such command: '%.200s'", x->name);
    *which = cmd;
    if (bson_iter_init_find(&it, x->cmd, "$db")) {
        const char *db;

        if (arg_str(x, &it, &db) < 0)
            return -1;
        if (!db[0] || strlen(db) >= sizeof(x->db))
            return doc_errf(&x->e, DOC_InvalidNamespace, "Invalid database name: '%.100s'", db);
        snprintf(x->db, sizeof(x->db), "%s", db);
    } else if (!(cmd->flags & C_NODB)) {
        return doc_errf(&x->e, 40571, "OP_MSG requests require a $db argument");
    } else {
        snprintf(x->db, sizeof(x->db), "admin");
    }
    if (x->srv->repl && replica_refuses(x, cmd->flags) < 0)
        return -1;
    if (cmd->flags & C_RETRY)
        return run_retryable(x, cmd);
    return cmd->fn(x);
}

int doc_cmd_run(struct doc_client *c, const bson_t *cmd, const struct doc_seq *seqs,
                unsigned nseq, bson_t *reply)
{
    struct ctx x = {.srv = c->srv, .cl = c, .cmd = cmd, .seqs = seqs, .nseq = nseq,
                    .reply = reply, .name = ""};
    const struct cmd *which;

    c->srv->st.commands++;
    c->awaitable = false;
    if (run(&x, &which) < 0) {
        bson_reinit(reply);
        append_error(reply, &x.e);
        c->awaitable = false;
    } else {
        append_ok(reply);
    }
    c->srv->st.cursors_open = c->srv->ncursors;
    if (!which)
        return 0;
    if (c->awaitable)
        return DOC_CMD_AWAIT;
    if (which->flags & C_WRITE)
        return DOC_CMD_WROTE | write_concern(cmd);
    /* A read on the primary: what it saw must be on a majority before the
     * client sees it (a secondary's reads are behind by nature). */
    if ((which->flags & C_READ) && c->srv->repl && repl_writable(c->srv->repl) == 0)
        return DOC_CMD_READ;
    return 0;
}

int doc_server_sync(struct doc_server *srv, struct doc_err *e)
{
    return doc_store_sync(srv->store, e);
}

void doc_cmd_sync_failed(const struct doc_err *e, bson_t *reply)
{
    bson_reinit(reply);
    append_error(reply, e);
}

void doc_server_tick(struct doc_server *srv, uint64_t now_ms)
{
    struct doc_cursor *cur;

    srv->now_ms = now_ms;
    /* Retryable writes' records unused for longer than a session lives
     * (logicalSessionTimeoutMinutes): written away by whoever writes. */
    if (!srv->repl || repl_writable(srv->repl) == 0)
        doc_txn_expire(srv->store, wall_ms() - SESSION_TIMEOUT_MS, 256);
    if (!srv->ticked) {
        /* cursors made before the first tick start their idle time now */
        srv->ticked = true;
        for (cur = srv->head; cur; cur = cur->snext)
            cur->used_ms = now_ms;
        return;
    }
    /* the server's list is in order of last use, so the idle ones lead */
    while ((cur = srv->head) && now_ms - cur->used_ms > srv->o.cursor_idle_ms &&
           now_ms >= cur->used_ms) {
        cursor_close(cur);
        srv->st.cursors_timed_out++;
    }
    srv->st.cursors_open = srv->ncursors;
}

void doc_server_stats(const struct doc_server *srv, struct doc_server_stats *st)
{
    *st = srv->st;
    st->cursors_open = srv->ncursors;
}

static void parse_version(struct doc_server *srv)
{
    const char *p = srv->version;
    int i;

    for (i = 0; i < 4; i++) {
        char *end;
        long v = strtol(p, &end, 10);

        srv->version_arr[i] = end == p ? 0 : (int32_t)v;
        p = *end == '.' ? end + 1 : end;
    }
}

int doc_server_open(struct doc_store *store, const struct doc_server_opts *o,
                    struct doc_server **out)
{
    struct doc_server *srv = calloc(1, sizeof(*srv));

    if (!srv)
        return -1;
    srv->store = store;
    if (o)
        srv->o = *o;
    if (!srv->o.max_cursors)
        srv->o.max_cursors = 1024;
    if (!srv->o.max_cursors_total)
        srv->o.max_cursors_total = 65536;
    if (!srv->o.cursor_idle_ms)
        srv->o.cursor_idle_ms = 10 * 60 * 1000;
    if (!srv->o.max_batch_bytes)
        srv->o.max_batch_bytes = 16u << 20;
    if (!srv->o.default_batch)
        srv->o.default_batch = 101;
    if (!srv->o.max_wire_version)
        srv->o.max_wire_version = 17;
    snprintf(srv->version, sizeof(srv->version), "%s", o && o->version ? o->version : "6.0.0");
    srv->o.version = srv->version;
    parse_version(srv);
    if (getrandom(&srv->rng, sizeof(srv->rng), 0) != sizeof(srv->rng))
        srv->rng = (uint64_t)wall_ms() ^ ((uint64_t)getpid() << 32);
    if (!srv->rng)
        srv->rng = 0x9E3779B97F4A7C15ULL;
    clock_gettime(CLOCK_MONOTONIC, &srv->started);
    srv->next_conn = 1;
    bson_oid_init(&srv->process_id, NULL);
    srv->topo = bson_new();
    srv->topo_last = bson_new();
    if (!srv->topo || !srv->topo_last) {
        doc_server_close(srv);
        return -1;
    }
    srv->topo_primary = true;   /* what a server alone says */
    *out = srv;
    return 0;
}

void doc_server_close(struct doc_server *srv)
{
    if (!srv)
        return;
    while (srv->clients)
        doc_client_free(srv->clients);
    if (srv->topo)
        bson_destroy(srv->topo);
    if (srv->topo_last)
        bson_destroy(srv->topo_last);
    free(srv);
}

struct doc_store *doc_server_store(struct doc_server *srv)
{
    return srv->store;
}

struct doc_client *doc_client_new(struct doc_server *srv, const char *peer)
{
    struct doc_client *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->srv = srv;
    c->conn_id = srv->next_conn++;
    if (srv->next_conn <= 0)
        srv->next_conn = 1;
    snprintf(c->peer, sizeof(c->peer), "%s", peer ? peer : "");
    c->next = srv->clients;
    if (srv->clients)
        srv->clients->prev = c;
    srv->clients = c;
    srv->nclients++;
    srv->clients_total++;
    return c;
}

void doc_client_free(struct doc_client *c)
{
    struct doc_server *srv;

    if (!c)
        return;
    srv = c->srv;
    while (c->head)
        cursor_close(c->head);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->nclients--;
    free(c);
}
