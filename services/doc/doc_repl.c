/* The document store's side of replication (doc_repl.h): the tap, applying
 * shipped records, the wipe and the snapshot of a full copy, and the
 * repl_store_ops over them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc_repl.h"
#include "doc_store_internal.h"
#include "error.h"
#include "log.h"
#include "repl.h"

static uint64_t rd_be64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

void doc_store_set_tap(struct doc_store *s, doc_tap_fn fn, void *arg)
{
    s->tap = fn;
    s->tap_arg = arg;
}

uint64_t doc_store_version(const struct doc_store *s)
{
    return pm_version(s->pool);
}

void doc_store_raise_version(struct doc_store *s, uint64_t v)
{
    pm_raise_version(s->pool, v);
}

/* The tern code for a store error met while applying. */
static int tern_code(const struct doc_err *e)
{
    switch (e->code) {
    case DOC_OutOfDiskSpace:
        return TERN_ENOSPC;
    case DOC_ExceededMemoryLimit:
        return TERN_ENOMEM;
    case DOC_BSONObjectTooLarge:
        return TERN_E2BIG;
    case DOC_InternalError:
        return TERN_EIO;
    default:
        return TERN_EPROTO;
    }
}

static uint64_t version_at(const struct doc_store *s, pm_loc loc)
{
    return pm_rec_at(s->pool, loc)->version;
}

/* A record that changes nothing here (a deletion of what this replica
 * does not hold) is still written, dead at once: its version is the
 * replica's position, which must survive a restart. */
static int carry(struct doc_store *s, struct doc_err *e)
{
    pm_loc loc;
    int rc = doc_rec_append(s, PM_TOMBSTONE, &s->ka, NULL, 0, &loc, e);

    if (rc < 0)
        return rc;
    return doc_tomb_put(s, &s->ka, loc, doc_tomb_take(s, &s->ka));
}

static int apply_doc(struct doc_store *s, bool tomb, const void *val, size_t len,
                     struct doc_err *e)
{
    const uint8_t *k = s->ka.p;
    struct doc_coll *c = doc_coll_by_id(s, rd_be64(k + 1));
    uint64_t slot;
    bool found = c && doc_bt_find(&c->ix[0]->bt, k + 9, s->ka.len - 9, &slot);
    bson_iter_t it;
    bson_t doc;

    if (found && version_at(s, c->slots[slot].loc) >= s->forced)
        return 0;
    if (tomb)
        return found ? doc_delete(c, slot + 1, e) : carry(s, e);
    if (len > UINT32_MAX || !bson_init_static(&doc, val, len) ||
        !bson_validate(&doc, BSON_VALIDATE_NONE, NULL))
        return doc_errf(e, DOC_InvalidBSON, "a document record is not BSON");
    if (!c)
        return carry(s, e);     /* its collection was dropped since */
    /* The key must be the one this document's _id gives. */
    if (!bson_iter_init_find(&it, &doc, "_id"))
        return doc_errf(e, DOC_InvalidIdField, "a document record without _id");
    doc_rec_key_doc(&s->k2, c->id, bson_iter_value(&it));
    if (s->k2.len != s->ka.len || memcmp(s->k2.p, k, s->ka.len) != 0)
        return doc_errf(e, DOC_BadValue, "a document record whose _id is not its key's");
    return found ? doc_replace_doc(c, slot + 1, &doc, false, e)
                 : doc_insert_doc(c, &doc, false, e);
}

/* The indexes a catalog record lists, in its order (as recovery would
 * make them): those `c` has (NULL: a new collection) are taken over, the
 * others made and built, so that a list that cannot be is refused before
 * anything is written. took[i]: ix[i + 1] of c is in the list. */
struct ix_plan {
    struct doc_index *now[DOC_INDEXES_MAX];
    bool made[DOC_INDEXES_MAX];
    bool took[DOC_INDEXES_MAX];
    unsigned n;
};

static void plan_free(struct ix_plan *pl)
{
    for (unsigned j = 0; j < pl->n; j++)
        if (pl->made[j])
            doc_index_free(pl->now[j]);
}

static int plan_indexes(struct doc_coll *c, const struct doc_cat *cat, struct ix_plan *pl,
                        struct doc_err *e)
{
    memset(pl, 0, sizeof(*pl));
    for (unsigned j = 0; j < cat->nix; j++) {
        const struct doc_cat_index *x = &cat->ix[j];
        struct doc_index *ix = NULL;

        for (unsigned i = 1; c && i < c->nix && !ix; i++)
            if (!pl->took[i - 1] && strcmp(c->ix[i]->name, x->name) == 0 &&
                c->ix[i]->unique == x->unique && bson_equal(c->ix[i]->key, &x->key)) {
                ix = c->ix[i];
                pl->took[i - 1] = true;
            }
        if (!ix) {
            ix = doc_index_new(&x->key, x->name, x->unique, e);
            if (!ix || (c && doc_index_build(c, ix, false, e) < 0)) {
                doc_index_free(ix);
                plan_free(pl);
                return -1;
            }
            pl->made[pl->n] = true;
        }
        pl->now[pl->n++] = ix;
    }
    return 0;
}

/* The plan becomes c's indexes (c: the one it was made for, or a new
 * collection for a plan made for none). */
static void plan_apply(struct doc_coll *c, const struct ix_plan *pl)
{
    for (unsigned i = 1; i < c->nix; i++)
        if (!pl->took[i - 1])
            doc_index_free(c->ix[i]);
    memcpy(c->ix + 1, pl->now, pl->n * sizeof(pl->now[0]));
    c->nix = 1 + pl->n;
}

static int apply_catalog(struct doc_store *s, bool tomb, const void *val, size_t len,
                         struct doc_err *e)
{
    char ns[DOC_NS_MAX], want[DOC_NS_MAX + 8];
    size_t nl = s->ka.len - 1;
    struct doc_coll *c, *old = NULL;
    struct doc_cat cat;
    struct ix_plan pl;
    pm_loc loc;
    uint32_t n_old;

    if (nl >= sizeof(ns) || memchr(s->ka.p + 1, 0, nl))
        return doc_errf(e, DOC_InvalidNamespace, "a catalog record with a bad name");
    memcpy(ns, s->ka.p + 1, nl);
    ns[nl] = 0;
    c = doc_coll_by_ns(s, ns);
    if (c && version_at(s, c->cat_loc) >= s->forced)
        return 0;
    if (tomb)
        return c ? doc_coll_remove(c, e) : carry(s, e);
    if (len > UINT32_MAX || doc_catalog_parse(val, (uint32_t)len, &cat, e) < 0)
        return -1;
    snprintf(want, sizeof(want), "%s.%s", cat.db, cat.name);
    if (strcmp(want, ns) != 0)
        return doc_errf(e, DOC_InvalidNamespace, "catalog record %s names %s", ns, want);
    if (c && c->id != (uint64_t)cat.id) {
        old = c;        /* dropped and made again on the primary */
        c = NULL;
    }
    {
        struct doc_coll *other = doc_coll_by_id(s, (uint64_t)cat.id);

        if (other && other != c && other != old)
            return doc_errf(e, DOC_BadValue, "collection id %lld given to %s and %s",
                            (long long)cat.id, other->ns, ns);
    }
    if (plan_indexes(c, &cat, &pl, e) < 0)
        return -1;
    if (doc_rec_append(s, PM_VALUE, &s->ka, val, (uint32_t)len, &loc, e) < 0) {
        plan_free(&pl);
        return -1;
    }
    if (c) {
        pm_dead(s->pool, c->cat_loc);
        c->cat_n_old++;
        c->cat_loc = loc;
        plan_apply(c, &pl);
        c->wgen++;
        return 0;
    }
    if (old) {
        pm_dead(s->pool, old->cat_loc);
        n_old = old->cat_n_old + 1;
        doc_coll_forget(old);
    } else {
        n_old = doc_tomb_take(s, &s->ka);
    }
    c = doc_coll_new(s, cat.db, cat.name, (uint64_t)cat.id, e);
    if (!c) {
        plan_free(&pl);
        return -1;      /* the record is written: a restart brings it */
    }
    c->cat_loc = loc;
    c->cat_n_old = n_old;
    if ((uint64_t)cat.id >= s->next_id)
        s->next_id = (uint64_t)cat.id + 1;
    plan_apply(c, &pl);
    c->wgen++;
    return 0;
}

/* A session's retryable-write record, kept as the primary wrote it. */
static int apply_session(struct doc_store *s, bool tomb, const void *val, size_t len,
                         struct doc_err *e)
{
    uint8_t lsid[16];
    uint64_t v;
    int64_t txn, at;
    bson_t reply;

    memcpy(lsid, s->ka.p + 1, 16);
    if (doc_bt_find(&s->sessions, lsid, 16, &v) &&
        version_at(s, ((struct doc_sess *)(uintptr_t)v)->loc) >= s->forced)
        return 0;
    if (tomb)
        return doc_txn_drop(s, lsid, e);
    if (len > UINT32_MAX || !doc_txn_parse(val, (uint32_t)len, &txn, &at, &reply))
        return doc_errf(e, DOC_InvalidBSON, "a session record is malformed");
    return doc_txn_write(s, lsid, val, (uint32_t)len, at, e);
}

int doc_store_apply(struct doc_store *s, bool tomb, const void *key, size_t klen,
                    const void *val, size_t len, uint64_t version)
{
    const uint8_t *k = key;
    struct doc_err e = {0};
    int rc;

    if (!version || klen < 2 || klen > PM_KEY_MAX ||
        (k[0] != DOC_REC_CATALOG && (k[0] != DOC_REC_DOC || klen < 10) &&
         (k[0] != DOC_REC_SESSION || klen != 17)))
        return TERN_EPROTO;
    doc_buf_reset(&s->ka);
    doc_buf_add(&s->ka, key, klen);
    if (s->ka.oom)
        return TERN_ENOMEM;
    s->forced = version;
    rc = k[0] == DOC_REC_CATALOG ? apply_catalog(s, tomb, val, len, &e)
         : k[0] == DOC_REC_DOC       ? apply_doc(s, tomb, val, len, &e)
                                     : apply_session(s, tomb, val, len, &e);
    s->forced = 0;
    if (rc < 0) {
        tern_log(TERN_LOG_WARN, "doc", "record %llx not applied: %s",
                 (unsigned long long)version, e.msg);
        return tern_code(&e);
    }
    return 0;
}

/* ---- the wipe ---- */

static int recover_nothing(void *arg, pm_loc loc, const struct pm_rec *r)
{
    (void)arg;
    (void)loc;
    (void)r;
    return TERN_EPROTO;     /* a new pool has no record */
}

int doc_store_wipe(struct doc_store *s)
{
    struct doc_bt_pos p;
    struct pm_pool *fresh;
    int rc;

    while (doc_bt_seek(&s->by_ns, NULL, 0, false, &p))
        doc_coll_forget((struct doc_coll *)(uintptr_t)doc_bt_val(&p));
    for (bool m = doc_bt_seek(&s->tombs, NULL, 0, false, &p); m; m = doc_bt_next(&p))
        free((void *)(uintptr_t)doc_bt_val(&p));
    doc_bt_free(&s->tombs);
    doc_bt_init(&s->tombs);
    for (bool m = doc_bt_seek(&s->sessions, NULL, 0, false, &p); m; m = doc_bt_next(&p))
        free((void *)(uintptr_t)doc_bt_val(&p));
    doc_bt_free(&s->sessions);
    doc_bt_init(&s->sessions);
    s->n_sessions = 0;
    /* The file goes first (its lock with it), then a new one is made; a
     * crash in between leaves no pool, which opens empty. */
    pm_close(s->pool);
    s->pool = NULL;
    if (unlink(s->path) < 0 || pm_sync_dir_of(s->path) < 0)
        tern_log(TERN_LOG_WARN, "doc", "%s: removing the pool to wipe it failed", s->path);
    rc = pm_open(s->path, &s->popts, &fresh);
    if (rc < 0)
        return rc;
    s->pool = fresh;
    s->next_id = 1;
    s->dirty = false;
    /* The pool takes writes only once it has been through recovery. */
    return pm_recover(s->pool, recover_nothing, NULL);
}

/* ---- the snapshot ---- */

#define SNAP_SESSIONS (1ull << 63)

/* The sessions' records, from the first whose id's first 7 bytes are at
 * least those in `from` (a few may come twice: applying is idempotent). */
static int snapshot_sessions(struct doc_store *s, uint64_t from, doc_snap_fn fn, void *arg,
                             uint64_t *next)
{
    uint8_t k[16] = {0};
    struct doc_bt_pos p;

    for (int i = 0; i < 7; i++)
        k[i] = (uint8_t)(from >> (48 - 8 * i));
    for (bool m = doc_bt_seek(&s->sessions, k, 16, false, &p); m; m = doc_bt_next(&p)) {
        const struct doc_sess *x = (const struct doc_sess *)(uintptr_t)doc_bt_val(&p);
        const struct pm_rec *r = pm_rec_at(s->pool, x->loc);
        size_t len;
        const uint8_t *id = doc_bt_key(&p, &len);

        if (fn(arg, pm_rec_key(r), r->key_len, pm_rec_val(r), r->val_len, r->version)) {
            *next = SNAP_SESSIONS;
            for (int i = 0; i < 7; i++)
                *next |= (uint64_t)id[i] << (48 - 8 * i);
            return 0;
        }
    }
    return 0;
}

/* cursor: the collection id in the high 32 bits, then 0 for its catalog
 * record or slot + 1 for a document; past the collections, SNAP_SESSIONS
 * with the first 7 bytes of a session id. */
int doc_store_snapshot(struct doc_store *s, uint64_t cursor, doc_snap_fn fn, void *arg,
                       uint64_t *next)
{
    uint8_t k[8];
    struct doc_bt_pos p;

    *next = 0;
    if (cursor & SNAP_SESSIONS)
        return snapshot_sessions(s, cursor & ~SNAP_SESSIONS, fn, arg, next);
    for (int i = 7; i >= 0; i--)
        k[i] = (uint8_t)(cursor >> 32 >> (8 * (7 - i)));
    for (bool m = doc_bt_seek(&s->by_id, k, 8, false, &p); m; m = doc_bt_next(&p)) {
        struct doc_coll *c = (struct doc_coll *)(uintptr_t)doc_bt_val(&p);
        uint64_t pos = c->id == cursor >> 32 ? (uint32_t)cursor : 0;

        if (c->id > INT32_MAX || c->nslots >= UINT32_MAX)
            return TERN_ERANGE;
        for (; pos <= c->nslots; pos++) {
            pm_loc loc = pos ? c->slots[pos - 1].loc : c->cat_loc;
            const struct pm_rec *r;

            if (!loc)
                continue;
            r = pm_rec_at(s->pool, loc);
            if (fn(arg, pm_rec_key(r), r->key_len, pm_rec_val(r), r->val_len, r->version)) {
                *next = c->id << 32 | pos;
                return 0;
            }
        }
    }
    return snapshot_sessions(s, 0, fn, arg, next);
}

/* ---- the group's ops ---- */

static int op_apply(void *ctx, uint8_t type, const void *key, uint16_t klen, const void *val,
                    uint32_t vlen, uint64_t version)
{
    if (type != REPL_SET && type != REPL_DEL)
        return TERN_EPROTO;
    return doc_store_apply(ctx, type == REPL_DEL, key, klen, val, vlen, version);
}

static int op_sync(void *ctx)
{
    struct doc_err e;

    return doc_store_sync(ctx, &e) < 0 ? TERN_EIO : 0;
}

static uint64_t op_position(void *ctx)
{
    return doc_store_version(ctx);
}

static void op_raise(void *ctx, uint64_t v)
{
    doc_store_raise_version(ctx, v);
}

static int op_wipe(void *ctx)
{
    return doc_store_wipe(ctx);
}

struct snap_ctx {
    uint8_t *dst;
    size_t cap, used;
    uint32_t n;
};

static int snap_one(void *arg, const void *key, size_t klen, const void *val, uint32_t len,
                    uint64_t version)
{
    struct snap_ctx *c = arg;
    size_t size = repl_rec_size(klen, len);

    if (size > c->cap - c->used)
        return 1;
    repl_rec_write(c->dst + c->used, REPL_SET, version, key, (uint16_t)klen, val, len);
    c->used += size;
    c->n++;
    return 0;
}

static long op_snapshot(void *ctx, uint64_t cursor, void *dst, size_t cap, uint32_t *n,
                        uint64_t *next)
{
    struct snap_ctx c = {.dst = dst, .cap = cap};
    int rc = doc_store_snapshot(ctx, cursor, snap_one, &c, next);

    *n = c.n;
    if (rc < 0)
        return rc;
    if (!c.used && *next)
        return TERN_E2BIG;
    return (long)c.used;
}

const struct repl_store_ops doc_repl_ops = {
    .apply = op_apply,
    .sync = op_sync,
    .position = op_position,
    .raise = op_raise,
    .wipe = op_wipe,
    .snapshot = op_snapshot,
};
