/* Indexes of the document store: their entries, uniqueness, and scans
 * over them chosen by a small planner.
 *
 * An entry's key is the key string (doc_bson.h) of the document's values
 * at the index's fields, in order, each complemented for a descending
 * field; a secondary index appends the document's slot (8 bytes,
 * big-endian) so that equal values make distinct entries. Key strings are
 * self-delimiting, so the entries of one value are exactly those that
 * start with its key string: that is how a unique index finds a clash and
 * how a scan tells where an interval ends. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "doc_store_internal.h"
#include "error.h"

/* ---- an index's definition ---- */

void doc_index_free(struct doc_index *ix)
{
    if (!ix)
        return;
    for (unsigned i = 0; i < ix->nfields; i++)
        free(ix->paths[i]);
    if (ix->key)
        bson_destroy(ix->key);
    doc_bt_free(&ix->bt);
    free(ix);
}

static void default_name(const bson_t *key, char *out, size_t cap)
{
    bson_iter_t it;
    size_t n = 0;

    out[0] = 0;
    if (!bson_iter_init(&it, key))
        return;
    while (bson_iter_next(&it) && n < cap) {
        int dir = (int)bson_iter_as_int64(&it);

        n += (size_t)snprintf(out + n, cap - n, "%s%s_%d", n ? "_" : "", bson_iter_key(&it), dir);
    }
}

struct doc_index *doc_index_new(const bson_t *key, const char *name, bool unique,
                                struct doc_err *e)
{
    struct doc_index *ix = calloc(1, sizeof(*ix));
    bson_iter_t it;

    if (!ix) {
        doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
        return NULL;
    }
    doc_bt_init(&ix->bt);
    ix->unique = unique;
    if (!bson_iter_init(&it, key))
        goto bad;
    while (bson_iter_next(&it)) {
        const char *path = bson_iter_key(&it);
        double d;

        if (!BSON_ITER_HOLDS_NUMBER(&it)) {
            doc_errf(e, DOC_CannotCreateIndex, "Values in the index key pattern can only be numbers: %s",
                     path);
            goto fail;
        }
        d = bson_iter_as_double(&it);
        if (d != 1 && d != -1) {
            doc_errf(e, DOC_CannotCreateIndex,
                     "Values in the index key pattern must be 1 or -1 (field %s)", path);
            goto fail;
        }
        if (!*path || path[0] == '$' || strstr(path, "..") || path[strlen(path) - 1] == '.') {
            doc_errf(e, DOC_CannotCreateIndex, "Index key contains an illegal field name: '%s'",
                     path);
            goto fail;
        }
        if (ix->nfields == DOC_INDEX_FIELDS_MAX) {
            doc_errf(e, DOC_CannotCreateIndex, "Index key pattern has more than %d fields",
                     DOC_INDEX_FIELDS_MAX);
            goto fail;
        }
        ix->paths[ix->nfields] = strdup(path);
        if (!ix->paths[ix->nfields])
            goto oom;
        ix->desc[ix->nfields++] = d < 0;
    }
    if (!ix->nfields)
        goto bad;
    ix->key = bson_copy(key);
    if (name && *name)
        snprintf(ix->name, sizeof(ix->name), "%s", name);
    else
        default_name(key, ix->name, sizeof(ix->name));
    return ix;
bad:
    doc_errf(e, DOC_CannotCreateIndex, "Index keys cannot be an empty field");
    goto fail;
oom:
    doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
fail:
    doc_index_free(ix);
    return NULL;
}

void doc_index_append_specs(const struct doc_coll *c, bson_t *arr)
{
    char k[16];

    for (unsigned i = 0; i < c->nix; i++) {
        bson_t d;

        snprintf(k, sizeof(k), "%u", i);
        bson_append_document_begin(arr, k, -1, &d);
        BSON_APPEND_INT32(&d, "v", 2);
        BSON_APPEND_DOCUMENT(&d, "key", c->ix[i]->key);
        BSON_APPEND_UTF8(&d, "name", c->ix[i]->name);
        if (c->ix[i]->unique && !c->ix[i]->is_id)
            BSON_APPEND_BOOL(&d, "unique", true);
        bson_append_document_end(arr, &d);
    }
}

int doc_index_list(const struct doc_coll *c, bson_t *arr)
{
    doc_index_append_specs(c, arr);
    return 0;
}

/* ---- a document's entries ---- */

/* The values of `path` in doc as an index holds them, which is what
 * doc_match_bounds assumes (and tests/fuzz/fuzz_doc_filter.c's reference
 * walker spells out): a field name looks into a sub-document, and into
 * each element of an array that is a document; a numeric component also
 * picks that element; the value at the end counts whole and, if an array,
 * each element too; a field missing from a document the path reached, or
 * a scalar where a document was needed, counts as null. */
struct vals {
    bson_value_t v[DOC_IX_KEYS_MAX];
    unsigned n;
    bool arrays;                 /* an array was met: several keys may come */
    bool overflow;
};

static void add_val(struct vals *vs, const bson_value_t *v)
{
    static const bson_value_t null = {.value_type = BSON_TYPE_NULL};

    if (vs->n == DOC_IX_KEYS_MAX) {
        vs->overflow = true;
        return;
    }
    vs->v[vs->n++] = v ? *v : null;
}

static void at_end(struct vals *vs, const bson_value_t *v)
{
    bson_iter_t it;

    add_val(vs, v);
    if (v->value_type != BSON_TYPE_ARRAY ||
        !bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len))
        return;
    vs->arrays = true;
    while (bson_iter_next(&it))
        add_val(vs, bson_iter_value(&it));
}

static void collect_val(const bson_value_t *v, const char *path, struct vals *vs, int depth);

static void collect_doc(const uint8_t *data, uint32_t len, const char *path, struct vals *vs,
                        int depth)
{
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    bson_iter_t it;

    if (depth > DOC_INDEX_DEPTH_MAX)
        return;
    if (!bson_iter_init_from_data(&it, data, len) || !bson_iter_find_w_len(&it, path, (int)n))
        add_val(vs, NULL);
    else if (!dot)
        at_end(vs, bson_iter_value(&it));
    else
        collect_val(bson_iter_value(&it), dot + 1, vs, depth + 1);
}

static void collect_val(const bson_value_t *v, const char *path, struct vals *vs, int depth)
{
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    bool positional = n > 0 && n < 10 && (n == 1 || path[0] != '0');
    uint32_t idx = 0, i = 0;
    bson_iter_t it;

    if (v->value_type == BSON_TYPE_DOCUMENT) {
        collect_doc(v->value.v_doc.data, v->value.v_doc.data_len, path, vs, depth);
        return;
    }
    if (v->value_type != BSON_TYPE_ARRAY) {
        add_val(vs, NULL);
        return;
    }
    vs->arrays = true;
    for (size_t j = 0; positional && j < n; j++) {
        if (path[j] < '0' || path[j] > '9')
            positional = false;
        else
            idx = idx * 10 + (uint32_t)(path[j] - '0');
    }
    if (!bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len))
        return;
    for (; bson_iter_next(&it); i++) {
        const bson_value_t *e = bson_iter_value(&it);

        if (positional && i == idx) {
            if (dot)
                collect_val(e, dot + 1, vs, depth + 1);
            else
                at_end(vs, e);
        }
        if (e->value_type == BSON_TYPE_DOCUMENT)
            collect_doc(e->value.v_doc.data, e->value.v_doc.data_len, path, vs, depth + 1);
    }
}

static void collect(const uint8_t *data, uint32_t len, const char *path, struct vals *vs,
                    int depth)
{
    collect_doc(data, len, path, vs, depth);
}

int doc_index_keys(const struct doc_index *ix, const bson_t *doc, struct doc_buf *out,
                   uint32_t *lens, unsigned *n, bool *arrays, struct doc_err *e)
{
    static __thread struct vals vs;
    unsigned multi = UINT32_MAX;
    bson_value_t fixed[DOC_INDEX_FIELDS_MAX];
    bson_value_t null = {.value_type = BSON_TYPE_NULL};

    doc_buf_reset(out);
    *n = 0;
    if (arrays)
        *arrays = false;
    /* Every field but (at most) one has one value; that one may have many. */
    for (unsigned f = 0; f < ix->nfields; f++) {
        vs.n = 0;
        vs.arrays = vs.overflow = false;
        collect(bson_get_data(doc), doc->len, ix->paths[f], &vs, 0);
        if (vs.overflow)
            return doc_errf(e, DOC_BadValue, "too many index keys for %s (over %d)",
                            ix->paths[f], DOC_IX_KEYS_MAX);
        if (vs.n == 0)
            fixed[f] = null;
        else
            fixed[f] = vs.v[0];
        if (vs.arrays) {
            if (arrays)
                *arrays = true;
            if (multi != UINT32_MAX)
                return doc_errf(e, DOC_BadValue, "cannot index parallel arrays [%s] [%s]",
                                ix->paths[f], ix->paths[multi]);
            multi = f;
        }
    }
    if (multi == UINT32_MAX) {
        for (unsigned f = 0; f < ix->nfields; f++)
            doc_key_add(out, &fixed[f], ix->desc[f]);
        lens[0] = (uint32_t)out->len;
        *n = 1;
        return out->oom ? doc_errf(e, DOC_ExceededMemoryLimit, "out of memory") : 0;
    }
    /* Gather the multikey field's values again (vs was reused). */
    vs.n = 0;
    vs.arrays = vs.overflow = false;
    collect(bson_get_data(doc), doc->len, ix->paths[multi], &vs, 0);
    for (unsigned i = 0; i < vs.n; i++) {
        size_t start = out->len;
        bool dup = false;

        for (unsigned f = 0; f < ix->nfields; f++)
            doc_key_add(out, f == multi ? &vs.v[i] : &fixed[f], ix->desc[f]);
        /* Deduplicate: [1, 1] is one entry. */
        for (unsigned j = 0, off = 0; j < *n && !dup; off += lens[j], j++)
            dup = lens[j] == out->len - start && memcmp(out->p + off, out->p + start, lens[j]) == 0;
        if (dup) {
            out->len = start;
            continue;
        }
        lens[(*n)++] = (uint32_t)(out->len - start);
    }
    if (*n == 0) {
        /* Only a path through an empty array of documents: null. */
        for (unsigned f = 0; f < ix->nfields; f++)
            doc_key_add(out, &null, ix->desc[f]);
        lens[0] = (uint32_t)out->len;
        *n = 1;
    }
    return out->oom ? doc_errf(e, DOC_ExceededMemoryLimit, "out of memory") : 0;
}

/* ---- uniqueness ---- */

static void be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* The slot of another document holding entry prefix `k`, or UINT64_MAX. */
static uint64_t clash(const struct doc_index *ix, const uint8_t *k, size_t len, uint64_t self)
{
    struct doc_bt_pos p;

    if (ix->is_id) {
        uint64_t v;

        return doc_bt_find(&ix->bt, k, len, &v) && v != self ? v : UINT64_MAX;
    }
    for (bool m = doc_bt_seek(&ix->bt, k, len, false, &p); m; m = doc_bt_next(&p)) {
        size_t el;
        const uint8_t *ek = doc_bt_key(&p, &el);

        if (el != len + 8 || memcmp(ek, k, len) != 0)
            return UINT64_MAX;
        if (doc_bt_val(&p) != self)
            return doc_bt_val(&p);
    }
    return UINT64_MAX;
}

static void dup_error(struct doc_coll *c, const struct doc_index *ix, const bson_t *doc,
                      struct doc_err *e)
{
    bson_t kv = BSON_INITIALIZER;
    bson_value_t v;
    char *js;

    for (unsigned f = 0; f < ix->nfields; f++) {
        if (doc_get(doc, ix->paths[f], &v))
            bson_append_value(&kv, ix->paths[f], -1, &v);
        else
            bson_append_null(&kv, ix->paths[f], -1);
    }
    /* MongoDB's form: { k: 2, s: "a" }, names bare, values as JSON. */
    {
        char out[400];
        size_t n = (size_t)snprintf(out, sizeof(out), "{ ");
        bson_iter_t it;

        bson_iter_init(&it, &kv);
        while (bson_iter_next(&it) && n < sizeof(out)) {
            bson_t one = BSON_INITIALIZER;
            size_t jl;

            bson_append_value(&one, "v", 1, bson_iter_value(&it));
            js = bson_as_relaxed_extended_json(&one, &jl);
            /* js is { "v" : VALUE } */
            if (js && jl > 10)
                n += (size_t)snprintf(out + n, sizeof(out) - n, "%s%s: %.*s", n > 2 ? ", " : "",
                                      bson_iter_key(&it), (int)(jl - 10), js + 8);
            bson_free(js);
            bson_destroy(&one);
        }
        if (n < sizeof(out))
            snprintf(out + n, sizeof(out) - n, " }");
        doc_errf(e, DOC_DuplicateKey, "E11000 duplicate key error collection: %s index: %s dup key: %s",
                 c->ns, ix->name, out);
    }
    bson_destroy(&kv);
}

int doc_index_check(struct doc_coll *c, const bson_t *doc, uint64_t self, bool unique,
                    struct doc_err *e)
{
    static __thread struct doc_buf keys;
    static __thread uint32_t lens[DOC_IX_KEYS_MAX];
    unsigned n;

    for (unsigned i = 0; i < c->nix; i++) {
        struct doc_index *ix = c->ix[i];
        size_t off = 0;

        if (doc_index_keys(ix, doc, &keys, lens, &n, NULL, e) < 0)
            return -1;
        if (!ix->unique || !unique)
            continue;
        for (unsigned j = 0; j < n; off += lens[j], j++)
            if (clash(ix, keys.p + off, lens[j], self) != UINT64_MAX) {
                dup_error(c, ix, doc, e);
                return -1;
            }
    }
    return 0;
}

static int index_add(struct doc_index *ix, const bson_t *doc, uint64_t slot, struct doc_err *e)
{
    static __thread struct doc_buf keys, one;
    static __thread uint32_t lens[DOC_IX_KEYS_MAX];
    uint8_t sb[8];
    size_t off = 0;
    unsigned n;

    bool arrays;

    if (doc_index_keys(ix, doc, &keys, lens, &n, &arrays, e) < 0)
        return -1;
    /* Once any document brought an array, bounds on one field may not be
     * intersected, nor the index's order taken for a sort's. */
    if (arrays)
        ix->multikey = true;
    be64(sb, slot);
    for (unsigned j = 0; j < n; off += lens[j], j++) {
        int rc;

        if (ix->is_id) {
            rc = doc_bt_insert(&ix->bt, keys.p + off, lens[j], slot, NULL);
        } else {
            doc_buf_reset(&one);
            doc_buf_add(&one, keys.p + off, lens[j]);
            doc_buf_add(&one, sb, 8);
            rc = one.oom ? TERN_ENOMEM : doc_bt_insert(&ix->bt, one.p, one.len, slot, NULL);
        }
        if (rc < 0)
            return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory adding to index %s",
                            ix->name);
    }
    return 0;
}

int doc_index_add_doc(struct doc_coll *c, const bson_t *doc, uint64_t slot, struct doc_err *e)
{
    for (unsigned i = 0; i < c->nix; i++)
        if (index_add(c->ix[i], doc, slot, e) < 0)
            return -1;
    return 0;
}

void doc_index_remove_doc(struct doc_coll *c, const bson_t *doc, uint64_t slot)
{
    static __thread struct doc_buf keys, one;
    static __thread uint32_t lens[DOC_IX_KEYS_MAX];
    struct doc_err e;
    uint8_t sb[8];
    unsigned n;

    be64(sb, slot);
    for (unsigned i = 0; i < c->nix; i++) {
        struct doc_index *ix = c->ix[i];
        size_t off = 0;

        if (doc_index_keys(ix, doc, &keys, lens, &n, NULL, &e) < 0)
            continue;       /* it could not have been added either */
        for (unsigned j = 0; j < n; off += lens[j], j++) {
            if (ix->is_id) {
                doc_bt_remove(&ix->bt, keys.p + off, lens[j], NULL);
                continue;
            }
            doc_buf_reset(&one);
            doc_buf_add(&one, keys.p + off, lens[j]);
            doc_buf_add(&one, sb, 8);
            doc_bt_remove(&ix->bt, one.p, one.len, NULL);
        }
    }
}

int doc_index_build(struct doc_coll *c, struct doc_index *ix, bool check, struct doc_err *e)
{
    for (uint64_t i = 0; i < c->nslots; i++) {
        bson_t d;

        if (!doc_slot_view(c, &c->slots[i], &d))
            continue;
        if (ix->unique && check) {
            static __thread struct doc_buf keys;
            static __thread uint32_t lens[DOC_IX_KEYS_MAX];
            unsigned n;
            size_t off = 0;

            if (doc_index_keys(ix, &d, &keys, lens, &n, NULL, e) < 0)
                return -1;
            for (unsigned j = 0; j < n; off += lens[j], j++)
                if (clash(ix, keys.p + off, lens[j], i) != UINT64_MAX) {
                    dup_error(c, ix, &d, e);
                    return -1;
                }
        }
        if (index_add(ix, &d, i, e) < 0)
            return -1;
    }
    return 0;
}

int doc_index_create(struct doc_coll *c, const struct doc_index_spec *spec, struct doc_err *e)
{
    struct doc_index *ix = doc_index_new(spec->key, spec->name, spec->unique, e);

    if (!ix)
        return -1;
    for (unsigned i = 0; i < c->nix; i++) {
        bool same_key = bson_equal(c->ix[i]->key, ix->key);
        bool same_name = strcmp(c->ix[i]->name, ix->name) == 0;

        if (same_key && same_name && c->ix[i]->unique == ix->unique) {
            doc_index_free(ix);
            return 0;
        }
        if (same_name) {
            doc_errf(e, DOC_IndexKeySpecsConflict,
                     "An existing index has the same name as the requested index: %s", ix->name);
            doc_index_free(ix);
            return -1;
        }
        if (same_key) {
            doc_errf(e, DOC_IndexOptionsConflict,
                     "Index already exists with a different name: %s", c->ix[i]->name);
            doc_index_free(ix);
            return -1;
        }
    }
    if (c->nix == DOC_INDEXES_MAX) {
        doc_index_free(ix);
        return doc_errf(e, DOC_CannotCreateIndex, "add index fails, too many indexes for %s (max %d)",
                        c->ns, DOC_INDEXES_MAX);
    }
    if (doc_index_build(c, ix, true, e) < 0) {
        doc_index_free(ix);
        return -1;
    }
    c->ix[c->nix++] = ix;
    if (doc_catalog_write(c, e) < 0) {
        c->nix--;
        doc_index_free(ix);
        return -1;
    }
    c->wgen++;
    return 1;
}

int doc_index_drop(struct doc_coll *c, const char *name, struct doc_err *e)
{
    bool all = strcmp(name, "*") == 0;
    unsigned kept = 1, dropped = 0;
    struct doc_index *gone[DOC_INDEXES_MAX];

    if (strcmp(name, "_id_") == 0)
        return doc_errf(e, DOC_InvalidOptions, "cannot drop _id index");
    for (unsigned i = 1; i < c->nix; i++) {
        if (all || strcmp(c->ix[i]->name, name) == 0)
            gone[dropped++] = c->ix[i];
        else
            c->ix[kept++] = c->ix[i];
    }
    if (!dropped && !all) {
        return doc_errf(e, DOC_IndexNotFound, "index not found with name [%s]", name);
    }
    c->nix = kept;
    if (dropped && doc_catalog_write(c, e) < 0) {
        /* Not persisted: put them back. */
        for (unsigned i = 0; i < dropped; i++)
            c->ix[c->nix++] = gone[i];
        return -1;
    }
    for (unsigned i = 0; i < dropped; i++)
        doc_index_free(gone[i]);
    c->wgen++;
    return (int)dropped;
}

/* ---- scans ---- */

struct doc_scan {
    struct doc_coll *c;
    const struct doc_matcher *m;
    struct doc_index *ix;
    bool reverse;
    struct doc_bounds b;         /* on the index's first field; n = 0: all */
    bool bounded;
    unsigned iv;                 /* interval being walked */
    bool started, done;
    struct doc_buf last;         /* the last entry key returned */
    struct doc_bt_pos pos;
    uint64_t gen;                /* ix->bt.gen when pos was taken */
    uint64_t *seen;              /* multikey: slots returned (open addressing) */
    uint64_t seen_cap, seen_n;
    struct doc_scan_stats st;
};

/* Compare an entry key with an interval end: the first len bytes. */
static int cmp_bound(const uint8_t *k, size_t kl, const struct doc_buf *b)
{
    int c = memcmp(k, b->p, kl < b->len ? kl : b->len);

    if (c)
        return c;
    return kl < b->len ? -1 : 0;   /* 0: k starts with the bound's value */
}

static bool seen_add(struct doc_scan *sc, uint64_t slot)
{
    uint64_t h, key = slot + 1;

    if (sc->seen_n * 2 >= sc->seen_cap) {
        uint64_t cap = sc->seen_cap ? sc->seen_cap * 2 : 256;
        uint64_t *n = calloc(cap, sizeof(*n));

        if (!n)
            return true;        /* cannot remember: return it (a duplicate at worst) */
        for (uint64_t i = 0; i < sc->seen_cap; i++)
            if (sc->seen[i]) {
                for (h = sc->seen[i] * 0x9E3779B97F4A7C15ull & (cap - 1); n[h]; h = (h + 1) & (cap - 1))
                    ;
                n[h] = sc->seen[i];
            }
        free(sc->seen);
        sc->seen = n;
        sc->seen_cap = cap;
    }
    for (h = key * 0x9E3779B97F4A7C15ull & (sc->seen_cap - 1); sc->seen[h];
         h = (h + 1) & (sc->seen_cap - 1))
        if (sc->seen[h] == key)
            return false;
    sc->seen[h] = key;
    sc->seen_n++;
    return true;
}

/* How well an index serves the filter and sort: higher is better. */
static int score(const struct doc_index *ix, const struct doc_bounds *b, bool bounded,
                 bool sorts)
{
    int s = 0;

    if (bounded && b->point)
        s += ix->unique ? 400 : 300;
    else if (bounded)
        s += 200;
    if (sorts)
        s += 100;
    if (bounded)
        s -= (int)(b->n > 50 ? 50 : b->n);
    return s;
}

/* Does the index give the sort's order (or its reverse, *rev)? */
static bool index_sorts(const struct doc_index *ix, const struct doc_sort *sort, bool *rev)
{
    unsigned n;
    int d0 = 0;

    if (!sort || ix->multikey)
        return false;
    n = doc_sort_nkeys(sort);
    if (n == 0 || n > ix->nfields)
        return false;
    for (unsigned i = 0; i < n; i++) {
        int dir;
        const char *p = doc_sort_path(sort, i, &dir);
        int rel = (dir < 0) == ix->desc[i] ? 1 : -1;

        if (strcmp(p, ix->paths[i]) != 0)
            return false;
        if (i == 0)
            d0 = rel;
        else if (rel != d0)
            return false;
    }
    *rev = d0 < 0;
    return true;
}

int doc_scan_open(struct doc_coll *c, const struct doc_matcher *m, const struct doc_sort *sort,
                  struct doc_scan **out, struct doc_plan *plan, struct doc_err *e)
{
    struct doc_scan *sc = calloc(1, sizeof(*sc));
    int best = -1;

    if (!sc)
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    sc->c = c;
    sc->m = m;
    sc->ix = c->ix[0];
    if (sort && doc_sort_natural(sort) < 0)
        sc->reverse = true;
    for (unsigned i = 0; i < c->nix; i++) {
        struct doc_index *ix = c->ix[i];
        struct doc_bounds b = {0};
        bool rev = false, sorts = index_sorts(ix, sort, &rev);
        /* Predicates on one field narrow each other only where a document
         * has one value there (MongoDB's rule for multikey indexes). */
        int bounded = !m ? 0 : ix->multikey ? doc_match_bounds(m, ix->paths[0], &b)
                                            : doc_match_bounds_scalar(m, ix->paths[0], &b);
        int s;

        if (bounded < 0) {
            doc_scan_close(sc);
            return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory planning");
        }
        /* A descending first field: the intervals are on ascending key
         * strings; such an index serves a sort, not bounds. */
        if (bounded && ix->desc[0]) {
            doc_bounds_free(&b);
            bounded = 0;
        }
        s = (bounded || sorts) ? score(ix, &b, bounded, sorts) : -1;
        if (s > best) {
            if (sc->bounded)
                doc_bounds_free(&sc->b);
            best = s;
            sc->ix = ix;
            sc->b = b;
            sc->bounded = bounded;
            sc->reverse = sorts ? rev : sc->reverse;
            if (plan)
                plan->sorted = sorts;
        } else if (bounded) {
            doc_bounds_free(&b);
        }
    }
    if (best < 0 && plan)
        plan->sorted = sort ? doc_sort_natural(sort) != 0 : false;
    if (sc->bounded && sc->b.n == 0) {
        /* Nothing can match (an empty $in, contradictory ranges). */
        sc->done = true;
    }
    if (plan) {
        snprintf(plan->index, sizeof(plan->index), "%s", best >= 0 ? sc->ix->name : "");
        plan->reverse = sc->reverse;
        plan->intervals = sc->bounded ? sc->b.n : 0;
    }
    c->scans++;
    *out = sc;
    return 0;
}

struct doc_coll *doc_scan_coll(const struct doc_scan *sc)
{
    return sc->c->dropped ? NULL : sc->c;
}

void doc_scan_stats(const struct doc_scan *sc, struct doc_scan_stats *st)
{
    *st = sc->st;
}

void doc_scan_close(struct doc_scan *sc)
{
    if (!sc)
        return;
    if (sc->bounded)
        doc_bounds_free(&sc->b);
    doc_buf_free(&sc->last);
    free(sc->seen);
    sc->c->scans--;
    doc_coll_release(sc->c);
    free(sc);
}

/* Put pos at the start of interval iv (or past the last entry returned). */
static bool position(struct doc_scan *sc)
{
    const struct doc_bt *bt = &sc->ix->bt;
    const struct doc_interval *iv = sc->bounded ? &sc->b.iv[sc->iv] : NULL;

    if (sc->started) {
        /* Resume after the last entry (the tree may have changed). */
        return sc->reverse ? doc_bt_seek_rev(bt, sc->last.p, sc->last.len, true, &sc->pos)
                           : doc_bt_seek(bt, sc->last.p, sc->last.len, true, &sc->pos);
    }
    if (!sc->reverse) {
        if (!iv || !iv->lo.len)
            return doc_bt_seek(bt, NULL, 0, false, &sc->pos);
        return doc_bt_seek(bt, iv->lo.p, iv->lo.len, false, &sc->pos);
    }
    if (!iv || !iv->hi.len)
        return doc_bt_seek_rev(bt, NULL, 0, false, &sc->pos);
    /* The last entry whose key starts with hi or is below it: seek to the
     * first entry past every one starting with hi, then step back. */
    if (!doc_bt_seek(bt, iv->hi.p, iv->hi.len, false, &sc->pos))
        return doc_bt_seek_rev(bt, NULL, 0, false, &sc->pos);
    for (;;) {
        size_t kl;
        const uint8_t *k = doc_bt_key(&sc->pos, &kl);

        if (cmp_bound(k, kl, &iv->hi) != 0)
            break;
        if (!doc_bt_next(&sc->pos))
            return doc_bt_seek_rev(bt, NULL, 0, false, &sc->pos);
    }
    return doc_bt_prev(bt, &sc->pos);
}

/* Is the entry inside interval iv? -1 before it, 0 in, 1 past it (in the
 * scan's direction). */
static int where(const struct doc_scan *sc, const uint8_t *k, size_t kl)
{
    const struct doc_interval *iv = &sc->b.iv[sc->iv];
    int lo = iv->lo.len ? cmp_bound(k, kl, &iv->lo) : 1;
    int hi = iv->hi.len ? cmp_bound(k, kl, &iv->hi) : -1;
    bool below = lo < 0 || (lo == 0 && !iv->lo_incl);
    bool above = hi > 0 || (hi == 0 && !iv->hi_incl);

    if (!sc->reverse)
        return below ? -1 : above ? 1 : 0;
    return above ? -1 : below ? 1 : 0;
}

int doc_scan_next(struct doc_scan *sc, bson_t *view, doc_ref *ref)
{
    struct doc_coll *c = sc->c;
    bool have;

    if (sc->done || c->dropped)
        return 0;
    if (!sc->started || sc->gen != sc->ix->bt.gen)
        have = position(sc);
    else
        have = sc->reverse ? doc_bt_prev(&sc->ix->bt, &sc->pos) : doc_bt_next(&sc->pos);
    for (;;) {
        size_t kl;
        const uint8_t *k;
        uint64_t slot;

        if (!have) {
            sc->done = true;
            return 0;
        }
        k = doc_bt_key(&sc->pos, &kl);
        sc->st.keys_examined++;
        if (sc->bounded) {
            int w = where(sc, k, kl);

            if (w < 0) {
                have = sc->reverse ? doc_bt_prev(&sc->ix->bt, &sc->pos) : doc_bt_next(&sc->pos);
                continue;
            }
            if (w > 0) {
                /* Past this interval: on to the next one. */
                if (++sc->iv >= sc->b.n) {
                    sc->done = true;
                    return 0;
                }
                if (!sc->reverse) {
                    const struct doc_interval *iv = &sc->b.iv[sc->iv];

                    have = iv->lo.len ? doc_bt_seek(&sc->ix->bt, iv->lo.p, iv->lo.len, false, &sc->pos)
                                      : have;
                } else {
                    /* Walk back into it: where() skips what lies above. */
                }
                continue;
            }
        }
        doc_buf_reset(&sc->last);
        doc_buf_add(&sc->last, k, kl);
        sc->started = true;
        sc->gen = sc->ix->bt.gen;
        slot = doc_bt_val(&sc->pos);
        if (slot < c->nslots && c->slots[slot].loc && (!sc->ix->multikey || seen_add(sc, slot))) {
            /* A static bson_t points into itself: made in place, never
             * copied. */
            doc_slot_view(c, &c->slots[slot], view);
            sc->st.docs_examined++;
            if (!sc->m || doc_match(sc->m, view)) {
                *ref = slot + 1;
                return 1;
            }
        }
        have = sc->reverse ? doc_bt_prev(&sc->ix->bt, &sc->pos) : doc_bt_next(&sc->pos);
    }
}
