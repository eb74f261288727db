/* A document store replica applying shipped records (services/doc/
 * doc_repl.c: doc_store_apply), on a small pool in /dev/shm.
 *
 * The input's first byte says whether the primary is honest. The rest is
 * a run of records built from fields of the input: catalog records for a
 * few namespaces with index lists (unique or not, on fields a, b, c), and
 * documents with small values or arrays under a, b, c, written or
 * deleted. An honest primary gives each collection an id of its own, for
 * ever, and writes documents only into collections that exist; a lying
 * one also sends raw bytes (any key, any value), any collection id, and
 * documents whose key is not their _id's. Versions rise, as a primary's
 * do, and records already sent may come again, in order, as a batch sent
 * twice does (doc_repl.h: the order a replica relies on).
 *
 * What must hold whatever comes: an accepted record leaves the store's
 * version at least its own; a refused one changes nothing the store
 * shows; and, from an honest primary, the store as applied is the store
 * as recovery rebuilds it from the pool (dumped, closed, opened, dumped
 * again). Between runs the pool is removed. */
#include <bson/bson.h>
#include <ctype.h>

#include "doc/doc_repl.h"
#include "doc/doc_store.h"
#include "doc/doc_store_internal.h"
#include "error.h"
#include "fuzz.h"
#include "log.h"

#define RECS_MAX 64

static char path[96];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    snprintf(path, sizeof(path), "/dev/shm/fuzz-doc-apply-%d.pool", (int)getpid());
    tern_log_set_level(TERN_LOG_ERROR + 1);
    return 0;
}

static struct doc_store *open_store(void)
{
    struct doc_store_opts o = {.pool_size = 4u << 20, .seg_size = 256u << 10, .create = true};
    struct doc_store *s;
    struct doc_err e = {0};

    FZ_CHECK(doc_store_open(path, &o, &s, &e) == 0, "open: %s", e.msg);
    return s;
}

/* ---- what the store shows ---- */

struct dump {
    char *p;
    size_t len;
};

static void put(struct dump *d, const char *s)
{
    size_t n = strlen(s);
    char *p = realloc(d->p, d->len + n + 2);

    FZ_CHECK(p != NULL, "out of memory");
    d->p = p;
    memcpy(d->p + d->len, s, n);
    d->len += n;
    d->p[d->len++] = '\n';
    d->p[d->len] = 0;
}

static int dump_coll(void *arg, struct doc_coll *c)
{
    struct dump *d = arg;
    bson_t ixs = BSON_INITIALIZER, v;
    struct doc_scan *sc;
    struct doc_plan plan;
    struct doc_err e = {0};
    doc_ref ref;
    char *js;

    put(d, doc_coll_name(c));
    doc_index_list(c, &ixs);
    js = bson_as_relaxed_extended_json(&ixs, NULL);
    put(d, js);
    bson_free(js);
    bson_destroy(&ixs);
    if (doc_scan_open(c, NULL, NULL, &sc, &plan, &e) < 0)
        return 0;
    while (doc_scan_next(sc, &v, &ref) == 1) {
        js = bson_as_relaxed_extended_json(&v, NULL);
        put(d, js ? js : "?");
        bson_free(js);
    }
    doc_scan_close(sc);
    return 0;
}

struct dump_db {
    struct doc_store *s;
    struct dump *d;
};

static int dump_db(void *arg, const char *db, uint64_t bytes)
{
    struct dump_db *x = arg;

    (void)bytes;
    put(x->d, db);
    return doc_coll_each(x->s, db, dump_coll, x->d);
}

static char *dump(struct doc_store *s)
{
    struct dump d = {0};
    struct dump_db x = {.s = s, .d = &d};

    put(&d, "");
    doc_db_each(s, dump_db, &x);
    return d.p;
}

/* ---- records from the input ---- */

static const char *const fields[] = {"a", "b", "c"};

static void value(struct fz *f, bson_t *d, const char *name)
{
    uint8_t k = fz_u8(f);

    if (k & 0x80) {
        bson_t arr;

        bson_append_array_begin(d, name, -1, &arr);
        for (unsigned i = 0; i < (k & 3u); i++) {
            char idx[4];

            snprintf(idx, sizeof(idx), "%u", i);
            bson_append_int32(&arr, idx, -1, fz_u8(f) & 7);
        }
        bson_append_array_end(d, &arr);
    } else {
        bson_append_int32(d, name, -1, k & 7);
    }
}

/* An honest primary's collection ids: each name's current one (0: none),
 * and ids never given twice. */
static uint64_t ids[4], next_id;

/* A catalog record: "C" + "t.cN", {id, db, coll, indexes}. Honest: the
 * name's id, or a new one if it has none (a tombstone then clears it);
 * else any small id. */
static void catalog(struct fz *f, bool honest, bool tomb, struct doc_buf *key, bson_t *val)
{
    unsigned n = fz_u8(f) & 3, ix = fz_u8(f);
    uint8_t idb = fz_u8(f);
    uint64_t id = 1 + (idb & 7);
    char coll[8], ns[16];
    bson_t arr;

    if (honest) {
        if (!ids[n])
            ids[n] = ++next_id;
        id = ids[n];
        if (tomb)
            ids[n] = 0;
    }
    snprintf(coll, sizeof(coll), "c%u", n);
    snprintf(ns, sizeof(ns), "Ct.%s", coll);
    doc_buf_add(key, ns, strlen(ns));
    BSON_APPEND_INT64(val, "id", (int64_t)id);
    BSON_APPEND_UTF8(val, "db", "t");
    BSON_APPEND_UTF8(val, "coll", coll);
    BSON_APPEND_ARRAY_BEGIN(val, "indexes", &arr);
    for (unsigned i = 0; i < 3; i++) {
        bson_t spec, k;
        char idx[4], name[8];

        if (!(ix & (1u << i)))
            continue;
        snprintf(idx, sizeof(idx), "%u", i);
        snprintf(name, sizeof(name), "%s_1", fields[i]);
        bson_append_document_begin(&arr, idx, -1, &spec);
        bson_append_document_begin(&spec, "key", -1, &k);
        bson_append_int32(&k, fields[i], -1, 1);
        bson_append_document_end(&spec, &k);
        bson_append_utf8(&spec, "name", -1, name, -1);
        if (ix & (8u << i))
            bson_append_bool(&spec, "unique", -1, true);
        bson_append_document_end(&arr, &spec);
    }
    bson_append_array_end(val, &arr);
}

/* A document record of a collection id, its key from its _id. Honest: of
 * a collection that exists; else of any small id, its key maybe not the
 * document's. */
static void document(struct fz *f, bool honest, struct doc_buf *key, bson_t *val)
{
    uint8_t cb = fz_u8(f), idb = fz_u8(f), which = fz_u8(f);
    uint64_t cid = 1 + (cb & 7u);

    /* Honest: the first collection that exists from the one chosen on. */
    for (unsigned i = 0; honest && i < 4; i++)
        if ((cid = ids[(cb + i) & 3]) != 0)
            break;
    bson_value_t id = {.value_type = BSON_TYPE_INT32, .value.v_int32 = idb & 15};

    BSON_APPEND_INT32(val, "_id", idb & 15);
    for (unsigned i = 0; i < 3; i++)
        if (which & (1u << i))
            value(f, val, fields[i]);
    if (!honest && (which & 0x80))
        id.value.v_int32 ^= 1;
    doc_rec_key_doc(key, cid, &id);
}

/* The records of this run, to send again. */
struct sent {
    bool tomb;
    uint8_t *key, *val;
    size_t kl, vl;
    uint64_t version;
};
static struct sent sent[RECS_MAX];
static unsigned nsent;

static void apply(struct doc_store *s, bool tomb, const void *kp, size_t kl, const void *vp,
                  size_t vl, uint64_t version, bool check_refusal)
{
    char *was = check_refusal ? dump(s) : NULL;
    int rc = doc_store_apply(s, tomb, kp, kl, vp, vl, version);

    if (getenv("FUZZ_TRACE")) {
        fprintf(stderr, "apply v%llu %s key ", (unsigned long long)version, tomb ? "del" : "set");
        for (size_t i = 0; i < kl; i++)
            fprintf(stderr, isprint(((const uint8_t *)kp)[i]) ? "%c" : "\\x%02x",
                    ((const uint8_t *)kp)[i]);
        fprintf(stderr, " (%zu bytes): %d\n", vl, rc);
    }
    FZ_CHECK(rc == 0 || rc == TERN_EPROTO || rc == TERN_ENOSPC || rc == TERN_E2BIG ||
             rc == TERN_ENOMEM, "apply: %d", rc);
    if (rc == 0)
        FZ_CHECK(doc_store_version(s) >= version, "version %llu after applying %llu",
                 (unsigned long long)doc_store_version(s), (unsigned long long)version);
    if (was && rc == TERN_EPROTO) {
        char *is = dump(s);

        FZ_CHECK(strcmp(was, is) == 0, "a refused record changed the store:\n%s\n%s", was, is);
        free(is);
    }
    free(was);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    struct doc_store *s;
    struct doc_buf key = {0};
    uint64_t version = 0;
    char *before, *after;

    bool honest = fz_u8(&f) & 1;

    unlink(path);
    s = open_store();
    nsent = 0;
    memset(ids, 0, sizeof(ids));
    next_id = 0;
    for (unsigned n = 0; n < RECS_MAX && f.n; n++) {
        uint8_t kind = fz_u8(&f), step = fz_u8(&f);
        bson_t val = BSON_INITIALIZER;
        const uint8_t *kp = NULL, *vp = NULL;
        size_t kl = 0, vl = 0;
        struct sent *x;

        /* The records a primary ships have versions that rise; a batch
         * may come again (from any of the records sent, in order). */
        if ((kind & 3) == 3) {
            for (unsigned i = nsent ? step % nsent : 0; i < nsent; i++)
                apply(s, sent[i].tomb, sent[i].key, sent[i].kl, sent[i].val, sent[i].vl,
                      sent[i].version, false);
            continue;
        }
        version += 1 + (step & 3);
        doc_buf_reset(&key);
        if ((kind & 3) == 0 && !honest) {
            kl = fz_take(&f, fz_u8(&f), &kp);
            vl = fz_take(&f, fz_u8(&f), &vp);
        } else {
            /* An honest primary writes documents into collections only. */
            if ((kind & 3) == 1 || (honest && !ids[0] && !ids[1] && !ids[2] && !ids[3]))
                catalog(&f, honest, (kind & 0x10) != 0, &key, &val);
            else
                document(&f, honest, &key, &val);
            kp = key.p;
            kl = key.len;
            vp = bson_get_data(&val);
            vl = val.len;
        }
        x = &sent[nsent++];
        *x = (struct sent){.tomb = (kind & 0x10) != 0, .kl = kl, .vl = vl, .version = version,
                           .key = malloc(kl + 1), .val = malloc(vl + 1)};
        FZ_CHECK(x->key && x->val, "out of memory");
        if (kl)
            memcpy(x->key, kp, kl);
        if (vl)
            memcpy(x->val, vp, vl);
        bson_destroy(&val);
        apply(s, x->tomb, x->key, x->kl, x->val, x->vl, x->version, (kind & 0x20) != 0);
    }
    FZ_CHECK(doc_store_sync(s, &(struct doc_err){0}) == 0, "sync");
    before = dump(s);
    doc_store_close(s);
    s = open_store();
    after = dump(s);
    /* What a lying primary sent (a collection id given to one name, then
     * to another) may come out otherwise from the pool; an honest one's
     * must not. */
    FZ_CHECK(!honest || strcmp(before, after) == 0, "recovery differs:\n%s\n---\n%s", before,
             after);
    free(before);
    free(after);
    doc_store_close(s);
    doc_buf_free(&key);
    for (unsigned i = 0; i < nsent; i++) {
        free(sent[i].key);
        free(sent[i].val);
    }
    unlink(path);
    return 0;
}
