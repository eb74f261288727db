/* The document store: records on the pool, the catalog, recovery, cleaning
 * and the writes (doc_store.h says what lies where). Indexes, the planner
 * and scans are in doc_index.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "doc_store_internal.h"
#include "error.h"
#include "log.h"

#define LOG_WHO "doc"

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t rd_be64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

void doc_rec_key_doc(struct doc_buf *b, uint64_t coll_id, const bson_value_t *id)
{
    uint8_t h[9] = {DOC_REC_DOC};

    be64(h + 1, coll_id);
    doc_buf_reset(b);
    doc_buf_add(b, h, sizeof(h));
    doc_key_add(b, id, false);
}

void doc_rec_key_catalog(struct doc_buf *b, const char *ns)
{
    uint8_t c = DOC_REC_CATALOG;

    doc_buf_reset(b);
    doc_buf_add(b, &c, 1);
    doc_buf_add(b, ns, strlen(ns));
}

bool doc_slot_view(const struct doc_coll *c, const struct doc_slot *sl, bson_t *view)
{
    const struct pm_rec *r;

    if (!sl->loc)
        return false;
    r = pm_rec_at(c->s->pool, sl->loc);
    return bson_init_static(view, pm_rec_val(r), r->val_len);
}

/* ---- names ---- */

int doc_check_names(const char *db, const char *coll, struct doc_err *e)
{
    size_t dl = db ? strlen(db) : 0, cl = coll ? strlen(coll) : 0;

    if (dl == 0 || dl > 63 || strpbrk(db, "/\\. \"$"))
        return doc_errf(e, DOC_InvalidNamespace, "Invalid database name: '%s'", db ? db : "");
    if (coll && (cl == 0 || cl > 200 || strchr(coll, '$') || strncmp(coll, "system.", 7) == 0))
        return doc_errf(e, DOC_InvalidNamespace, "Invalid collection name: '%s'", coll);
    return 0;
}

/* ---- appends, with room made by cleaning ---- */

int doc_rec_append(struct doc_store *s, enum pm_rec_type type, const struct doc_buf *key,
                  const void *val, uint32_t len, pm_loc *loc, struct doc_err *e)
{
    uint64_t version;
    int rc;

    if (key->oom)
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    if (key->len > PM_KEY_MAX)
        return doc_errf(e, DOC_BadValue, "key too large to index (%zu bytes, at most %u)",
                        key->len, PM_KEY_MAX);
    for (int tries = 0;; tries++) {
        if (pm_free_segs(s->pool) < s->reserve && type == PM_VALUE)
            pm_clean(s->pool, &s->cleaner, 2, 90);
        version = s->forced ? s->forced : pm_next_version(s->pool);
        rc = pm_append(s->pool, type, version, key->p, (uint16_t)key->len, val, len, loc);
        if (rc != TERN_ENOSPC || tries == 2)
            break;
        if (pm_clean(s->pool, &s->cleaner, 4, 100) <= 0)
            break;
    }
    if (rc == TERN_ENOSPC)
        return doc_errf(e, DOC_OutOfDiskSpace, "the pool is full");
    if (rc == TERN_E2BIG)
        return doc_errf(e, DOC_BSONObjectTooLarge, "object to insert too large: %u bytes", len);
    if (rc < 0)
        return doc_errf(e, DOC_InternalError, "pool append: %s", tern_strerror(rc));
    s->dirty = true;
    /* The replication tap sees what this store decided to write, not what
     * a primary shipped to it (doc_store_apply). */
    if (s->tap && !s->forced)
        s->tap(s->tap_arg, type == PM_TOMBSTONE, key->p, (uint16_t)key->len, val, len, version);
    return 0;
}

/* A key's new record supersedes a tombstone: the tombstone is an older
 * record now, and its own older ones count too. */
uint32_t doc_tomb_take(struct doc_store *s, const struct doc_buf *key)
{
    uint64_t v;
    struct doc_tomb *t;
    uint32_t n;

    if (!doc_bt_remove(&s->tombs, key->p, key->len, &v))
        return 0;
    t = (struct doc_tomb *)(uintptr_t)v;
    n = t->n_old + 1;
    pm_dead(s->pool, t->loc);
    free(t);
    return n;
}

/* A deleted key: its tombstone stays while older records of it remain. */
int doc_tomb_put(struct doc_store *s, const struct doc_buf *key, pm_loc loc, uint32_t n_old)
{
    struct doc_tomb *t;

    if (n_old == 0) {
        pm_dead(s->pool, loc);
        return 0;
    }
    t = malloc(sizeof(*t));
    if (!t) {
        /* Unknown to the cleaner, the tombstone counts as live forever: a
         * leak of pool space, never a resurrection. */
        return 0;
    }
    *t = (struct doc_tomb){.loc = loc, .n_old = n_old};
    if (doc_bt_insert(&s->tombs, key->p, key->len, (uint64_t)(uintptr_t)t, NULL) != 1)
        free(t);
    return 0;
}

/* ---- collections ---- */

struct doc_coll *doc_coll_by_ns(struct doc_store *s, const char *ns)
{
    uint64_t v;

    return doc_bt_find(&s->by_ns, ns, strlen(ns), &v) ? (struct doc_coll *)(uintptr_t)v : NULL;
}

struct doc_coll *doc_coll_by_id(struct doc_store *s, uint64_t id)
{
    uint8_t k[8];
    uint64_t v;

    be64(k, id);
    return doc_bt_find(&s->by_id, k, 8, &v) ? (struct doc_coll *)(uintptr_t)v : NULL;
}

struct doc_coll *doc_coll_new(struct doc_store *s, const char *db, const char *name,
                                 uint64_t id, struct doc_err *e)
{
    struct doc_coll *c = calloc(1, sizeof(*c));
    bson_t idkey = BSON_INITIALIZER;
    uint8_t k[8];

    if (!c) {
        doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
        return NULL;
    }
    c->s = s;
    c->id = id;
    snprintf(c->db, sizeof(c->db), "%s", db);
    snprintf(c->name, sizeof(c->name), "%s", name);
    snprintf(c->ns, sizeof(c->ns), "%s.%s", db, name);
    BSON_APPEND_INT32(&idkey, "_id", 1);
    c->ix[0] = doc_index_new(&idkey, "_id_", true, e);
    bson_destroy(&idkey);
    if (!c->ix[0]) {
        free(c);
        return NULL;
    }
    c->ix[0]->is_id = true;
    c->nix = 1;
    be64(k, id);
    if (doc_bt_insert(&s->by_ns, c->ns, strlen(c->ns), (uint64_t)(uintptr_t)c, NULL) != 1 ||
        doc_bt_insert(&s->by_id, k, 8, (uint64_t)(uintptr_t)c, NULL) != 1) {
        doc_bt_remove(&s->by_ns, c->ns, strlen(c->ns), NULL);
        doc_index_free(c->ix[0]);
        free(c);
        doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
        return NULL;
    }
    return c;
}

static void coll_free(struct doc_coll *c)
{
    for (unsigned i = 0; i < c->nix; i++)
        doc_index_free(c->ix[i]);
    free(c->slots);
    free(c->free_slots);
    free(c);
}

int doc_catalog_write(struct doc_coll *c, struct doc_err *e)
{
    struct doc_store *s = c->s;
    bson_t v = BSON_INITIALIZER, arr;
    pm_loc loc;
    int rc;

    BSON_APPEND_INT64(&v, "id", (int64_t)c->id);
    BSON_APPEND_UTF8(&v, "db", c->db);
    BSON_APPEND_UTF8(&v, "coll", c->name);
    BSON_APPEND_ARRAY_BEGIN(&v, "indexes", &arr);
    doc_index_append_specs(c, &arr);
    bson_append_array_end(&v, &arr);
    doc_rec_key_catalog(&s->k1, c->ns);
    rc = doc_rec_append(s, PM_VALUE, &s->k1, bson_get_data(&v), v.len, &loc, e);
    bson_destroy(&v);
    if (rc < 0)
        return rc;
    if (c->cat_loc) {
        pm_dead(s->pool, c->cat_loc);
        c->cat_n_old++;
    } else {
        c->cat_n_old = doc_tomb_take(s, &s->k1);
    }
    c->cat_loc = loc;
    return 0;
}

struct doc_coll *doc_coll_get(struct doc_store *s, const char *db, const char *coll,
                              bool create, struct doc_err *e)
{
    char ns[DOC_NS_MAX];
    struct doc_coll *c;

    if (doc_check_names(db, coll, e) < 0)
        return NULL;
    snprintf(ns, sizeof(ns), "%s.%s", db, coll);
    c = doc_coll_by_ns(s, ns);
    if (c || !create) {
        if (!c)
            doc_errf(e, DOC_NamespaceNotFound, "ns does not exist: %s", ns);
        return c;
    }
    c = doc_coll_new(s, db, coll, s->next_id, e);
    if (!c)
        return NULL;
    s->next_id++;
    if (doc_catalog_write(c, e) < 0) {
        uint8_t k[8];

        be64(k, c->id);
        doc_bt_remove(&s->by_ns, c->ns, strlen(c->ns), NULL);
        doc_bt_remove(&s->by_id, k, 8, NULL);
        coll_free(c);
        return NULL;
    }
    return c;
}

int doc_coll_create(struct doc_store *s, const char *db, const char *coll, struct doc_err *e)
{
    char ns[DOC_NS_MAX];

    if (doc_check_names(db, coll, e) < 0)
        return -1;
    snprintf(ns, sizeof(ns), "%s.%s", db, coll);
    if (doc_coll_by_ns(s, ns))
        return doc_errf(e, DOC_NamespaceExists, "Collection %s already exists.", ns);
    return doc_coll_get(s, db, coll, true, e) ? 0 : -1;
}

/* Drop a collection: one tombstone for its catalog entry; its documents'
 * records are dead (their collection id is never reused while one
 * remains: ids only grow, and recovery starts past every id it saw). */
int doc_coll_remove(struct doc_coll *c, struct doc_err *e)
{
    struct doc_store *s = c->s;
    pm_loc loc;
    int rc;

    doc_rec_key_catalog(&s->k1, c->ns);
    rc = doc_rec_append(s, PM_TOMBSTONE, &s->k1, NULL, 0, &loc, e);
    if (rc < 0)
        return rc;
    pm_dead(s->pool, c->cat_loc);
    doc_tomb_put(s, &s->k1, loc, c->cat_n_old + 1);
    doc_coll_forget(c);
    return 1;
}

void doc_coll_forget(struct doc_coll *c)
{
    struct doc_store *s = c->s;
    uint8_t k[8];
    uint64_t v;

    for (uint64_t i = 0; i < c->nslots; i++)
        if (c->slots[i].loc)
            pm_dead(s->pool, c->slots[i].loc);
    /* Tombstones of its documents protect nothing any more. */
    {
        struct doc_bt_pos p;
        uint8_t lo[9] = {DOC_REC_DOC};

        be64(lo + 1, c->id);
        while (doc_bt_seek(&s->tombs, lo, 9, false, &p)) {
            size_t len;
            const uint8_t *key = doc_bt_key(&p, &len);
            struct doc_tomb *t;

            if (len < 9 || memcmp(key, lo, 9) != 0)
                break;
            t = (struct doc_tomb *)(uintptr_t)doc_bt_val(&p);
            pm_dead(s->pool, t->loc);
            doc_buf_reset(&s->k2);
            doc_buf_add(&s->k2, key, len);
            doc_bt_remove(&s->tombs, s->k2.p, s->k2.len, &v);
            free(t);
        }
    }
    be64(k, c->id);
    doc_bt_remove(&s->by_ns, c->ns, strlen(c->ns), NULL);
    doc_bt_remove(&s->by_id, k, 8, NULL);
    c->dropped = true;
    c->wgen++;
    if (c->scans) {
        struct doc_coll **z = realloc(s->zombies, (s->nzombies + 1) * sizeof(*z));

        if (z) {
            s->zombies = z;
            s->zombies[s->nzombies++] = c;
        }
        /* Without room to remember it, the collection leaks: its scans
         * still hold it. */
    } else {
        coll_free(c);
    }
}

void doc_coll_release(struct doc_coll *c)
{
    struct doc_store *s = c->s;

    if (!c->dropped || c->scans)
        return;
    for (unsigned i = 0; i < s->nzombies; i++)
        if (s->zombies[i] == c) {
            s->zombies[i] = s->zombies[--s->nzombies];
            break;
        }
    coll_free(c);
}

int doc_coll_drop(struct doc_store *s, const char *db, const char *coll, struct doc_err *e)
{
    struct doc_coll *c;
    struct doc_err ignore;

    if (doc_check_names(db, coll, e) < 0)
        return -1;
    c = doc_coll_get(s, db, coll, false, &ignore);
    return c ? doc_coll_remove(c, e) : 0;
}

int doc_db_drop(struct doc_store *s, const char *db, struct doc_err *e)
{
    char prefix[80];
    size_t pl;
    int dropped = 0;

    if (doc_check_names(db, NULL, e) < 0)
        return -1;
    pl = (size_t)snprintf(prefix, sizeof(prefix), "%s.", db);
    for (;;) {
        struct doc_bt_pos p;
        size_t len;
        const uint8_t *k;

        if (!doc_bt_seek(&s->by_ns, prefix, pl, false, &p))
            break;
        k = doc_bt_key(&p, &len);
        if (len < pl || memcmp(k, prefix, pl) != 0)
            break;
        if (doc_coll_remove((struct doc_coll *)(uintptr_t)doc_bt_val(&p), e) < 0)
            return -1;
        dropped = 1;
    }
    return dropped;
}

int doc_db_each(struct doc_store *s, int (*fn)(void *arg, const char *db, uint64_t bytes),
                void *arg)
{
    struct doc_bt_pos p;
    char cur[64] = "";
    uint64_t bytes = 0;
    bool any = false;
    int rc;

    for (bool m = doc_bt_seek(&s->by_ns, NULL, 0, false, &p); m; m = doc_bt_next(&p)) {
        struct doc_coll *c = (struct doc_coll *)(uintptr_t)doc_bt_val(&p);

        if (any && strcmp(cur, c->db) != 0) {
            if ((rc = fn(arg, cur, bytes)) != 0)
                return rc;
            bytes = 0;
        }
        snprintf(cur, sizeof(cur), "%s", c->db);
        bytes += c->bytes;
        any = true;
    }
    return any ? fn(arg, cur, bytes) : 0;
}

int doc_coll_each(struct doc_store *s, const char *db,
                  int (*fn)(void *arg, struct doc_coll *c), void *arg)
{
    char prefix[80];
    size_t pl = (size_t)snprintf(prefix, sizeof(prefix), "%s.", db);
    struct doc_bt_pos p;
    int rc;

    for (bool m = doc_bt_seek(&s->by_ns, prefix, pl, false, &p); m; m = doc_bt_next(&p)) {
        size_t len;
        const uint8_t *k = doc_bt_key(&p, &len);

        if (len < pl || memcmp(k, prefix, pl) != 0)
            break;
        if ((rc = fn(arg, (struct doc_coll *)(uintptr_t)doc_bt_val(&p))) != 0)
            return rc;
    }
    return 0;
}

const char *doc_coll_name(const struct doc_coll *c) { return c->name; }
const char *doc_coll_db(const struct doc_coll *c) { return c->db; }
uint64_t doc_coll_count(const struct doc_coll *c) { return c->count; }
uint64_t doc_coll_bytes(const struct doc_coll *c) { return c->bytes; }

/* ---- slots ---- */

static int slot_alloc(struct doc_coll *c, uint64_t *idx)
{
    if (c->nfree) {
        *idx = c->free_slots[--c->nfree];
        return 0;
    }
    if (c->nslots == c->cap) {
        uint64_t cap = c->cap ? c->cap * 2 : 64;
        struct doc_slot *n = realloc(c->slots, cap * sizeof(*n));

        if (!n)
            return TERN_ENOMEM;
        c->slots = n;
        c->cap = cap;
    }
    *idx = c->nslots++;
    c->slots[*idx] = (struct doc_slot){0};
    return 0;
}

static void slot_free(struct doc_coll *c, uint64_t idx)
{
    c->slots[idx] = (struct doc_slot){0};
    if (c->nfree == c->free_cap) {
        uint64_t cap = c->free_cap ? c->free_cap * 2 : 64;
        uint64_t *n = realloc(c->free_slots, cap * sizeof(*n));

        if (!n)
            return;     /* the slot is simply not reused */
        c->free_slots = n;
        c->free_cap = cap;
    }
    c->free_slots[c->nfree++] = idx;
}

/* ---- writes ---- */

static int check_id(const bson_t *doc, bson_value_t *id, struct doc_err *e)
{
    bson_iter_t it;

    if (!bson_iter_init_find(&it, doc, "_id"))
        return doc_errf(e, DOC_InvalidIdField, "document has no _id");
    switch (bson_iter_type(&it)) {
    case BSON_TYPE_ARRAY:
    case BSON_TYPE_REGEX:
    case BSON_TYPE_UNDEFINED:
        return doc_errf(e, DOC_InvalidIdField, "can't use a%s as _id",
                        bson_iter_type(&it) == BSON_TYPE_ARRAY ? "n array"
                        : bson_iter_type(&it) == BSON_TYPE_REGEX ? " regex" : "n undefined");
    default:
        break;
    }
    *id = *bson_iter_value(&it);
    return 0;
}

/* MongoDB stores documents nested at most 100 deep; so does tern, and
 * every walk over stored documents (keys, comparisons, projections) may
 * recurse without bounds of its own. The walk here stops one level past
 * the limit. */
static bool depth_ok(const uint8_t *data, uint32_t len, int depth)
{
    bson_iter_t it;

    if (depth > DOC_INDEX_DEPTH_MAX || !bson_iter_init_from_data(&it, data, len))
        return depth <= DOC_INDEX_DEPTH_MAX;
    while (bson_iter_next(&it)) {
        const bson_value_t *v = bson_iter_value(&it);

        if ((v->value_type == BSON_TYPE_DOCUMENT || v->value_type == BSON_TYPE_ARRAY) &&
            !depth_ok(v->value.v_doc.data, v->value.v_doc.data_len, depth + 1))
            return false;
        if (v->value_type == BSON_TYPE_CODEWSCOPE &&
            !depth_ok(v->value.v_codewscope.scope_data, v->value.v_codewscope.scope_len,
                      depth + 1))
            return false;
    }
    return true;
}

static int check_doc(const struct doc_store *s, const bson_t *doc, struct doc_err *e)
{
    if (doc->len > s->max_doc)
        return doc_errf(e, DOC_BSONObjectTooLarge,
                        "object to insert too large. size in bytes: %u, max size: %zu", doc->len,
                        s->max_doc);
    if (!depth_ok(bson_get_data(doc), doc->len, 1))
        return doc_errf(e, DOC_Overflow, "Document exceeds maximum nesting depth of %d",
                        DOC_INDEX_DEPTH_MAX);
    return 0;
}

int doc_insert(struct doc_coll *c, const bson_t *doc, struct doc_err *e)
{
    return doc_insert_doc(c, doc, true, e);
}

int doc_insert_doc(struct doc_coll *c, const bson_t *doc, bool unique, struct doc_err *e)
{
    struct doc_store *s = c->s;
    bson_value_t id;
    uint64_t idx;
    pm_loc loc;
    int rc;

    if (check_doc(s, doc, e) < 0 || check_id(doc, &id, e) < 0 ||
        doc_index_check(c, doc, UINT64_MAX, unique, e) < 0)
        return -1;
    if (slot_alloc(c, &idx) < 0)
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    doc_rec_key_doc(&s->k1, c->id, &id);
    rc = doc_rec_append(s, PM_VALUE, &s->k1, bson_get_data(doc), doc->len, &loc, e);
    if (rc < 0) {
        slot_free(c, idx);
        return rc;
    }
    c->slots[idx] = (struct doc_slot){.loc = loc, .len = doc->len,
                                      .n_old = doc_tomb_take(s, &s->k1)};
    c->count++;
    c->bytes += doc->len;
    c->wgen++;
    if (doc_index_add_doc(c, doc, idx, e) < 0) {
        /* Out of memory with the record written: the document is stored
         * and comes back at the next open; say so. */
        return -1;
    }
    return 0;
}

int doc_replace(struct doc_coll *c, doc_ref ref, const bson_t *doc, struct doc_err *e)
{
    return doc_replace_doc(c, ref, doc, true, e);
}

int doc_replace_doc(struct doc_coll *c, doc_ref ref, const bson_t *doc, bool unique,
                    struct doc_err *e)
{
    struct doc_store *s = c->s;
    struct doc_slot *sl;
    bson_value_t id, old_id;
    bson_t old;
    pm_loc loc;
    int rc;

    if (ref == 0 || ref > c->nslots || !c->slots[ref - 1].loc)
        return doc_errf(e, DOC_InternalError, "no document at ref %" PRIu64, ref);
    sl = &c->slots[ref - 1];
    if (check_doc(s, doc, e) < 0)
        return -1;
    doc_slot_view(c, sl, &old);
    if (check_id(doc, &id, e) < 0 || check_id(&old, &old_id, e) < 0)
        return -1;
    if (!doc_val_eq(&id, &old_id) || id.value_type != old_id.value_type)
        return doc_errf(e, DOC_ImmutableField,
                        "After applying the update, the (immutable) field '_id' was found to have been altered");
    if (doc_index_check(c, doc, ref - 1, unique, e) < 0)
        return -1;
    doc_rec_key_doc(&s->k1, c->id, &id);
    rc = doc_rec_append(s, PM_VALUE, &s->k1, bson_get_data(doc), doc->len, &loc, e);
    if (rc < 0)
        return rc;
    sl = &c->slots[ref - 1];          /* a clean may have moved the old record */
    doc_slot_view(c, sl, &old);
    doc_index_remove_doc(c, &old, ref - 1);
    pm_dead(s->pool, sl->loc);
    c->bytes -= sl->len;
    sl->loc = loc;
    sl->len = doc->len;
    sl->n_old++;
    c->bytes += doc->len;
    c->wgen++;
    return doc_index_add_doc(c, doc, ref - 1, e);
}

int doc_delete(struct doc_coll *c, doc_ref ref, struct doc_err *e)
{
    struct doc_store *s = c->s;
    struct doc_slot *sl;
    bson_value_t id;
    bson_t old;
    pm_loc loc;
    int rc;

    if (ref == 0 || ref > c->nslots || !c->slots[ref - 1].loc)
        return doc_errf(e, DOC_InternalError, "no document at ref %" PRIu64, ref);
    doc_slot_view(c, &c->slots[ref - 1], &old);
    if (check_id(&old, &id, e) < 0)
        return -1;
    doc_rec_key_doc(&s->k1, c->id, &id);
    rc = doc_rec_append(s, PM_TOMBSTONE, &s->k1, NULL, 0, &loc, e);
    if (rc < 0)
        return rc;
    sl = &c->slots[ref - 1];
    doc_slot_view(c, sl, &old);
    doc_index_remove_doc(c, &old, ref - 1);
    pm_dead(s->pool, sl->loc);
    doc_tomb_put(s, &s->k1, loc, sl->n_old + 1);
    c->count--;
    c->bytes -= sl->len;
    c->wgen++;
    slot_free(c, ref - 1);
    return 0;
}

bool doc_read(struct doc_coll *c, doc_ref ref, bson_t *view)
{
    if (ref == 0 || ref > c->nslots)
        return false;
    return doc_slot_view(c, &c->slots[ref - 1], view);
}

doc_ref doc_find_id(struct doc_coll *c, const bson_value_t *id)
{
    uint64_t v;

    doc_buf_reset(&c->s->k2);
    doc_key_add(&c->s->k2, id, false);
    return doc_bt_find(&c->ix[0]->bt, c->s->k2.p, c->s->k2.len, &v) ? v + 1 : 0;
}

int doc_store_sync(struct doc_store *s, struct doc_err *e)
{
    int rc;

    if (!s->dirty)
        return 0;
    rc = pm_commit(s->pool);
    if (rc < 0)
        return doc_errf(e, DOC_InternalError, "pool commit: %s", tern_strerror(rc));
    s->dirty = false;
    return 0;
}

size_t doc_store_max_doc(const struct doc_store *s)
{
    return s->max_doc;
}

/* ---- the cleaner's view ---- */

/* Who holds the record's key now: a document's slot, a collection's
 * catalog entry, or a tombstone. */
struct owner {
    pm_loc *loc;
    uint32_t *n_old;
    struct doc_tomb *tomb;
    const uint8_t *key;
    size_t klen;
};

static bool owner_of(struct doc_store *s, const struct pm_rec *r, struct owner *o)
{
    const uint8_t *k = pm_rec_key(r);
    uint64_t v;

    *o = (struct owner){.key = k, .klen = r->key_len};
    if (doc_bt_find(&s->tombs, k, r->key_len, &v)) {
        o->tomb = (struct doc_tomb *)(uintptr_t)v;
        o->loc = &o->tomb->loc;
        o->n_old = &o->tomb->n_old;
        return true;
    }
    if (r->key_len > 1 && k[0] == DOC_REC_CATALOG) {
        char ns[DOC_NS_MAX];
        struct doc_coll *c;

        if ((size_t)r->key_len >= sizeof(ns))
            return false;
        memcpy(ns, k + 1, r->key_len - 1u);
        ns[r->key_len - 1] = 0;
        c = doc_coll_by_ns(s, ns);
        if (!c)
            return false;
        o->loc = &c->cat_loc;
        o->n_old = &c->cat_n_old;
        return true;
    }
    if (r->key_len == 17 && k[0] == DOC_REC_SESSION) {
        struct doc_sess *x;

        if (!doc_bt_find(&s->sessions, k + 1, 16, &v))
            return false;
        x = (struct doc_sess *)(uintptr_t)v;
        o->loc = &x->loc;
        o->n_old = &x->n_old;
        return true;
    }
    if (r->key_len > 9 && k[0] == DOC_REC_DOC) {
        struct doc_coll *c = doc_coll_by_id(s, rd_be64(k + 1));

        if (!c || !doc_bt_find(&c->ix[0]->bt, k + 9, r->key_len - 9u, &v))
            return false;
        o->loc = &c->slots[v].loc;
        o->n_old = &c->slots[v].n_old;
        return true;
    }
    return false;
}

static bool clean_is_live(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct owner o;

    return owner_of(arg, r, &o) && *o.loc == loc;
}

static void clean_moved(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r)
{
    struct owner o;

    (void)from;
    if (owner_of(arg, r, &o)) {
        *o.loc = to;
        (*o.n_old)++;       /* the original, until its segment is dropped */
    }
}

static void clean_dropped(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct doc_store *s = arg;
    struct owner o;

    if (!owner_of(s, r, &o) || *o.loc == loc || *o.n_old == 0)
        return;
    (*o.n_old)--;
    if (o.tomb && o.tomb->n_old == 0) {
        struct doc_tomb *t = o.tomb;

        doc_buf_reset(&s->k2);
        doc_buf_add(&s->k2, o.key, o.klen);
        doc_bt_remove(&s->tombs, s->k2.p, s->k2.len, NULL);
        pm_dead(s->pool, t->loc);
        free(t);
    }
}

/* ---- recovery ---- */

/* Every key's newest record, while the pool is walked. */
struct rec_ent {
    pm_loc loc;
    uint64_t version;
    uint32_t n_old;
    uint8_t type;
};

struct recover {
    struct doc_store *s;
    struct doc_bt keys;          /* record key -> struct rec_ent * */
    uint64_t max_id;
};

static int recover_rec(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct recover *rv = arg;
    const uint8_t *k = pm_rec_key(r);
    struct rec_ent *ent;
    uint64_t v;
    int rc;

    if (r->key_len > 9 && k[0] == DOC_REC_DOC && rd_be64(k + 1) > rv->max_id)
        rv->max_id = rd_be64(k + 1);
    if (doc_bt_find(&rv->keys, k, r->key_len, &v)) {
        ent = (struct rec_ent *)(uintptr_t)v;
        ent->n_old++;
        /* The newer version wins; of two of one version (a clean's copy
         * and its original) the first, which the pool hands first. */
        if (r->version <= ent->version) {
            pm_dead(rv->s->pool, loc);
            return 0;
        }
        pm_dead(rv->s->pool, ent->loc);
        ent->loc = loc;
        ent->version = r->version;
        ent->type = r->type;
        return 0;
    }
    ent = malloc(sizeof(*ent));
    if (!ent)
        return TERN_ENOMEM;
    *ent = (struct rec_ent){.loc = loc, .version = r->version, .type = r->type};
    rc = doc_bt_insert(&rv->keys, k, r->key_len, (uint64_t)(uintptr_t)ent, NULL);
    if (rc != 1) {
        free(ent);
        return rc < 0 ? rc : TERN_EPROTO;
    }
    return 0;
}

int doc_catalog_parse(const void *val, uint32_t len, struct doc_cat *out, struct doc_err *e)
{
    bson_t v;
    bson_iter_t it, ai, si;

    memset(out, 0, sizeof(*out));
    out->id = -1;
    if (!bson_init_static(&v, val, len) || !bson_validate(&v, 0, NULL))
        return doc_errf(e, DOC_InvalidBSON, "catalog record is not BSON");
    if (bson_iter_init_find(&it, &v, "id") && BSON_ITER_HOLDS_INT64(&it))
        out->id = bson_iter_int64(&it);
    if (bson_iter_init_find(&it, &v, "db") && BSON_ITER_HOLDS_UTF8(&it))
        out->db = bson_iter_utf8(&it, NULL);
    if (bson_iter_init_find(&it, &v, "coll") && BSON_ITER_HOLDS_UTF8(&it))
        out->name = bson_iter_utf8(&it, NULL);
    if (out->id <= 0 || !out->db || !out->name || doc_check_names(out->db, out->name, e) < 0)
        return doc_errf(e, DOC_InvalidBSON, "catalog record is malformed");
    if (!bson_iter_init_find(&it, &v, "indexes") || !BSON_ITER_HOLDS_ARRAY(&it) ||
        !bson_iter_recurse(&it, &ai))
        return 0;
    while (bson_iter_next(&ai)) {
        struct doc_cat_index *x = &out->ix[out->nix];
        const uint8_t *d;
        uint32_t dl;
        bson_t spec;

        if (!BSON_ITER_HOLDS_DOCUMENT(&ai))
            continue;
        bson_iter_document(&ai, &dl, &d);
        if (!bson_init_static(&spec, d, dl))
            continue;
        x->name = NULL;
        x->unique = false;
        if (bson_iter_init_find(&si, &spec, "name") && BSON_ITER_HOLDS_UTF8(&si))
            x->name = bson_iter_utf8(&si, NULL);
        if (bson_iter_init_find(&si, &spec, "unique"))
            x->unique = bson_iter_as_bool(&si);
        if (!x->name || !bson_iter_init_find(&si, &spec, "key") ||
            !BSON_ITER_HOLDS_DOCUMENT(&si) || strcmp(x->name, "_id_") == 0)
            continue;
        bson_iter_document(&si, &dl, &d);
        if (!bson_init_static(&x->key, d, dl))
            continue;
        if (out->nix == DOC_INDEXES_MAX - 1)
            break;      /* _id_ is the first */
        out->nix++;
    }
    return 0;
}

/* A catalog record's collection, with its index specs (built later). */
static int recover_catalog(struct doc_store *s, const struct rec_ent *ent, struct doc_err *e)
{
    const struct pm_rec *r = pm_rec_at(s->pool, ent->loc);
    struct doc_cat cat;
    struct doc_coll *c;

    if (doc_catalog_parse(pm_rec_val(r), r->val_len, &cat, e) < 0) {
        char why[sizeof(e->msg)];

        snprintf(why, sizeof(why), "%s", e->msg);
        return doc_errf(e, DOC_InvalidBSON, "catalog record at %#" PRIx64 ": %s", ent->loc, why);
    }
    c = doc_coll_new(s, cat.db, cat.name, (uint64_t)cat.id, e);
    if (!c)
        return -1;
    c->cat_loc = ent->loc;
    c->cat_n_old = ent->n_old;
    if ((uint64_t)cat.id >= s->next_id)
        s->next_id = (uint64_t)cat.id + 1;
    for (unsigned i = 0; i < cat.nix; i++) {
        c->ix[c->nix] = doc_index_new(&cat.ix[i].key, cat.ix[i].name, cat.ix[i].unique, e);
        if (!c->ix[c->nix])
            return -1;
        c->nix++;
    }
    return 0;
}

static int recover_doc(struct doc_store *s, const uint8_t *k, size_t klen, struct rec_ent *ent,
                       struct doc_err *e)
{
    struct doc_coll *c = doc_coll_by_id(s, rd_be64(k + 1));
    struct doc_buf kb = {0};
    uint64_t idx;

    if (ent->type == PM_TOMBSTONE) {
        if (!c) {
            pm_dead(s->pool, ent->loc);
            return 0;
        }
        doc_buf_add(&kb, k, klen);
        doc_tomb_put(s, &kb, ent->loc, ent->n_old);
        doc_buf_free(&kb);
        return 0;
    }
    if (!c) {
        pm_dead(s->pool, ent->loc);     /* a dropped collection's */
        return 0;
    }
    if (slot_alloc(c, &idx) < 0)
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    c->slots[idx] = (struct doc_slot){.loc = ent->loc,
                                      .len = pm_rec_at(s->pool, ent->loc)->val_len,
                                      .n_old = ent->n_old};
    c->count++;
    c->bytes += c->slots[idx].len;
    if (doc_bt_insert(&c->ix[0]->bt, k + 9, klen - 9, idx, NULL) != 1)
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    return 0;
}

static int recover_session(struct doc_store *s, const uint8_t *k, struct rec_ent *ent,
                           struct doc_err *e)
{
    const struct pm_rec *r = pm_rec_at(s->pool, ent->loc);
    struct doc_buf kb = {0};
    struct doc_sess *x;
    int64_t txn, at;
    bson_t reply;

    if (ent->type == PM_TOMBSTONE ||
        !doc_txn_parse(pm_rec_val(r), r->val_len, &txn, &at, &reply)) {
        /* Gone, or not one we wrote: a retry of it runs again. */
        doc_buf_add(&kb, k, 17);
        doc_tomb_put(s, &kb, ent->loc, ent->n_old);
        doc_buf_free(&kb);
        return 0;
    }
    x = malloc(sizeof(*x));
    if (!x || doc_bt_insert(&s->sessions, k + 1, 16, (uint64_t)(uintptr_t)x, NULL) != 1) {
        free(x);
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    }
    *x = (struct doc_sess){.loc = ent->loc, .n_old = ent->n_old, .at = at};
    s->n_sessions++;
    return 0;
}

static int recover(struct doc_store *s, struct doc_err *e)
{
    struct recover rv = {.s = s};
    struct doc_bt_pos p;
    uint64_t t0 = now_ms();
    int rc;

    doc_bt_init(&rv.keys);
    rc = pm_recover(s->pool, recover_rec, &rv);
    if (rc < 0) {
        doc_errf(e, DOC_InternalError, "pool recovery: %s", tern_strerror(rc));
        goto out;
    }
    s->next_id = 1;
    /* Catalog records sort before documents ('C' < 'D'): collections
     * first, then their documents. */
    for (bool m = doc_bt_seek(&rv.keys, NULL, 0, false, &p); m && rc == 0; m = doc_bt_next(&p)) {
        size_t len;
        const uint8_t *k = doc_bt_key(&p, &len);
        struct rec_ent *ent = (struct rec_ent *)(uintptr_t)doc_bt_val(&p);

        if (k[0] == DOC_REC_CATALOG && ent->type == PM_VALUE) {
            rc = recover_catalog(s, ent, e);
        } else if (k[0] == DOC_REC_CATALOG) {
            struct doc_buf kb = {0};

            doc_buf_add(&kb, k, len);
            doc_tomb_put(s, &kb, ent->loc, ent->n_old);
            doc_buf_free(&kb);
        } else if (k[0] == DOC_REC_DOC && len > 9) {
            rc = recover_doc(s, k, len, ent, e);
        } else if (k[0] == DOC_REC_SESSION && len == 17) {
            rc = recover_session(s, k, ent, e);
        } else {
            pm_dead(s->pool, ent->loc);     /* not ours: left alone, dead */
        }
    }
    if (rv.max_id >= s->next_id)
        s->next_id = rv.max_id + 1;
    /* Secondary indexes, from the documents now in place. Unique ones are
     * not checked: a primary never stores a clash, but a replica that
     * stopped in the middle of a full copy may hold one for a while (a
     * document copied before its change and another after it), and the
     * records still to come resolve it. */
    for (bool m = doc_bt_seek(&s->by_ns, NULL, 0, false, &p); m && rc == 0; m = doc_bt_next(&p)) {
        struct doc_coll *c = (struct doc_coll *)(uintptr_t)doc_bt_val(&p);

        for (unsigned i = 1; i < c->nix && rc == 0; i++)
            rc = doc_index_build(c, c->ix[i], false, e);
    }
out:
    for (bool m = doc_bt_seek(&rv.keys, NULL, 0, false, &p); m; m = doc_bt_next(&p))
        free((void *)(uintptr_t)doc_bt_val(&p));
    doc_bt_free(&rv.keys);
    s->recover_ms = now_ms() - t0;
    return rc < 0 ? -1 : 0;
}

/* ---- open and close ---- */

int doc_store_open(const char *path, const struct doc_store_opts *o, struct doc_store **out,
                   struct doc_err *e)
{
    struct pm_opts po = {.create = true};
    struct doc_store *s;
    struct pm_info info;
    int rc;

    *out = NULL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    po.size = o && o->pool_size ? o->pool_size : 1ull << 30;
    po.seg_size = o && o->seg_size ? o->seg_size : 32u << 20;
    po.create = o ? o->create : true;
    doc_bt_init(&s->by_ns);
    doc_bt_init(&s->by_id);
    doc_bt_init(&s->tombs);
    doc_bt_init(&s->sessions);
    s->cleaner = (struct pm_cleaner){.is_live = clean_is_live, .moved = clean_moved,
                                     .dropped = clean_dropped, .arg = s};
    s->popts = po;
    s->path = strdup(path);
    rc = s->path ? pm_open(path, &po, &s->pool) : TERN_ENOMEM;
    if (rc < 0) {
        free(s->path);
        free(s);
        return doc_errf(e, rc == TERN_EBUSY ? DOC_IllegalOperation : DOC_InternalError,
                        "pool %s: %s", path, tern_strerror(rc));
    }
    pm_get_info(s->pool, &info);
    s->max_doc = o && o->max_doc ? o->max_doc : 16u << 20;
    if (s->max_doc > pm_val_max(s->pool, PM_KEY_MAX))
        s->max_doc = pm_val_max(s->pool, PM_KEY_MAX);
    s->reserve = info.n_segs / 16 > 2 ? info.n_segs / 16 : 2;
    if (recover(s, e) < 0) {
        doc_store_close(s);
        return -1;
    }
    *out = s;
    return 0;
}

void doc_store_close(struct doc_store *s)
{
    struct doc_bt_pos p;

    if (!s)
        return;
    for (bool m = doc_bt_seek(&s->by_ns, NULL, 0, false, &p); m; m = doc_bt_next(&p))
        coll_free((struct doc_coll *)(uintptr_t)doc_bt_val(&p));
    for (unsigned i = 0; i < s->nzombies; i++)
        coll_free(s->zombies[i]);
    free(s->zombies);
    for (bool m = doc_bt_seek(&s->tombs, NULL, 0, false, &p); m; m = doc_bt_next(&p))
        free((void *)(uintptr_t)doc_bt_val(&p));
    for (bool m = doc_bt_seek(&s->sessions, NULL, 0, false, &p); m; m = doc_bt_next(&p))
        free((void *)(uintptr_t)doc_bt_val(&p));
    doc_bt_free(&s->sessions);
    doc_bt_free(&s->by_ns);
    doc_bt_free(&s->by_id);
    doc_bt_free(&s->tombs);
    doc_buf_free(&s->k1);
    doc_buf_free(&s->k2);
    doc_buf_free(&s->ka);
    free(s->path);
    if (s->pool)
        pm_close(s->pool);
    free(s);
}

void doc_store_info(const struct doc_store *s, struct doc_store_info *info)
{
    struct pm_info pi;
    struct doc_bt_pos p;
    char db[64] = "";

    pm_get_info(s->pool, &pi);
    *info = (struct doc_store_info){.pool_size = pi.size,
                                    .pool_used = (uint64_t)pi.segs_used * pi.seg_size,
                                    .pool_live = pi.bytes_live,
                                    .recover_ms = s->recover_ms,
                                    .is_pmem = pi.is_pmem};
    for (bool m = doc_bt_seek(&s->by_ns, NULL, 0, false, &p); m; m = doc_bt_next(&p)) {
        const struct doc_coll *c = (const struct doc_coll *)(uintptr_t)doc_bt_val(&p);

        info->collections++;
        info->documents += c->count;
        info->indexes += c->nix;
        if (strcmp(db, c->db) != 0) {
            info->databases++;
            snprintf(db, sizeof(db), "%s", c->db);
        }
    }
}
