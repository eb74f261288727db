/* A query filter from a client (services/doc/doc_match.c, and the BSON
 * order of doc_bson.c under it). Input: a u16 (little-endian) length, that
 * many bytes as the filter's BSON, the rest as a document's BSON.
 *
 * A filter that does not compile must say why (a code and a message). One
 * that compiles is matched against the document (when the document is
 * valid BSON), twice, with the same answer; its bounds on each top-level
 * path (and "a", "a.b") must be sorted and disjoint, and when the
 * document matches, one of its keys on that path (a value the path
 * reaches, an element of an array at its end, or null where the path
 * finds a field missing, as an index holds them) must lie inside them;
 * inside the intersected (scalar) bounds too when no array is on the way.
 * The document's own values also check the key strings: memcmp of two
 * keys has doc_val_cmp's sign. */
#include "doc_match.h"
#include "fuzz.h"

/* ---- the keys an index holds of a document on a path ---- */

struct keys {
    struct doc_buf k;
    const struct doc_bounds *b;
    bool inside;
    bool arrays;                /* the path crossed or ended at an array */
};

static int key_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);

    if (c)
        return c < 0 ? -1 : 1;
    return (an > bn) - (an < bn);
}

static void offer(struct keys *ks, const bson_value_t *v)
{
    bson_value_t null = {.value_type = BSON_TYPE_NULL};

    doc_buf_reset(&ks->k);
    doc_key_add(&ks->k, v ? v : &null, false);
    FZ_CHECK(!ks->k.oom, "key of %zu bytes: out of memory", ks->k.len);
    for (unsigned i = 0; i < ks->b->n; i++) {
        const struct doc_interval *iv = &ks->b->iv[i];
        int lo = iv->lo.len ? key_cmp(ks->k.p, ks->k.len, iv->lo.p, iv->lo.len) : 1;
        int hi = iv->hi.len ? key_cmp(ks->k.p, ks->k.len, iv->hi.p, iv->hi.len) : -1;

        if ((lo > 0 || (lo == 0 && iv->lo_incl)) && (hi < 0 || (hi == 0 && iv->hi_incl)))
            ks->inside = true;
    }
}

static void at_end(struct keys *ks, const bson_value_t *v)
{
    bson_iter_t it;

    offer(ks, v);
    if (v->value_type == BSON_TYPE_ARRAY)
        ks->arrays = true;
    if (v->value_type != BSON_TYPE_ARRAY ||
        !bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len))
        return;
    while (bson_iter_next(&it))
        offer(ks, bson_iter_value(&it));
}

static void keys_val(struct keys *ks, const bson_value_t *v, const char *path);

static void keys_doc(struct keys *ks, const uint8_t *data, uint32_t len, const char *path)
{
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    bson_iter_t it;

    if (!bson_iter_init_from_data(&it, data, len) || !bson_iter_find_w_len(&it, path, (int)n))
        offer(ks, NULL);
    else if (!dot)
        at_end(ks, bson_iter_value(&it));
    else
        keys_val(ks, bson_iter_value(&it), dot + 1);
}

static void keys_val(struct keys *ks, const bson_value_t *v, const char *path)
{
    const char *dot = strchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : strlen(path);
    bool positional = n > 0 && n < 10 && (n == 1 || path[0] != '0');
    uint32_t idx = 0, i = 0;
    bson_iter_t it;

    if (v->value_type == BSON_TYPE_DOCUMENT) {
        keys_doc(ks, v->value.v_doc.data, v->value.v_doc.data_len, path);
        return;
    }
    if (v->value_type != BSON_TYPE_ARRAY) {
        offer(ks, NULL);
        return;
    }
    ks->arrays = true;
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
                keys_val(ks, e, dot + 1);
            else
                at_end(ks, e);
        }
        if (e->value_type == BSON_TYPE_DOCUMENT)
            keys_doc(ks, e->value.v_doc.data, e->value.v_doc.data_len, path);
    }
}

/* ---- checks ---- */

/* Sorted, disjoint, points when it says so. */
static void check_shape(const struct doc_bounds *b, const char *path)
{
    for (unsigned i = 0; i < b->n; i++) {
        const struct doc_interval *iv = &b->iv[i];

        FZ_CHECK(!iv->lo.oom && !iv->hi.oom, "bounds on %s: a short end", path);
        if (iv->lo.len && iv->hi.len) {
            int c = key_cmp(iv->lo.p, iv->lo.len, iv->hi.p, iv->hi.len);

            FZ_CHECK(c < 0 || (c == 0 && iv->lo_incl && iv->hi_incl),
                     "bounds on %s: interval %u is empty", path, i);
        }
        if (i > 0) {
            const struct doc_interval *prev = &b->iv[i - 1];
            int c;

            FZ_CHECK(prev->hi.len && iv->lo.len, "bounds on %s: %u overlaps %u", path, i - 1, i);
            c = key_cmp(prev->hi.p, prev->hi.len, iv->lo.p, iv->lo.len);
            FZ_CHECK(c < 0 || (c == 0 && !prev->hi_incl && !iv->lo_incl),
                     "bounds on %s: %u and %u out of order or overlapping", path, i - 1, i);
        }
        if (b->point)
            FZ_CHECK(iv->lo_incl && iv->hi_incl &&
                         key_cmp(iv->lo.p, iv->lo.len, iv->hi.p, iv->hi.len) == 0,
                     "bounds on %s: %u is no point", path, i);
    }
}

/* doc_match_bounds always; doc_match_bounds_scalar when the document has
 * no array on the path (as in an index that is not multikey). */
static void check_bounds(const struct doc_matcher *m, const char *path, const bson_t *doc,
                         bool matched)
{
    struct doc_bounds b, sb;
    int rc = doc_match_bounds(m, path, &b);
    int src = doc_match_bounds_scalar(m, path, &sb);

    FZ_CHECK(rc >= 0 && src >= 0, "bounds on %s: out of memory", path);
    FZ_CHECK(rc == src, "bounds on %s: %d, scalar bounds %d", path, rc, src);
    if (rc == 0)
        return;
    check_shape(&b, path);
    check_shape(&sb, path);
    if (matched) {
        struct keys ks = {.b = &b};

        keys_doc(&ks, bson_get_data(doc), doc->len, path);
        FZ_CHECK(ks.inside, "bounds on %s: a matching document has no key inside them", path);
        if (!ks.arrays) {
            ks.b = &sb;
            ks.inside = false;
            keys_doc(&ks, bson_get_data(doc), doc->len, path);
            FZ_CHECK(ks.inside, "scalar bounds on %s: a matching document has no key inside",
                     path);
        }
        doc_buf_free(&ks.k);
    }
    doc_bounds_free(&b);
    doc_bounds_free(&sb);
}

static int count_eq(void *arg, const char *path, const bson_value_t *v)
{
    bson_value_t same;
    const struct doc_matcher *m = arg;

    FZ_CHECK(path && v, "an equality without path or value");
    /* the first equality on a path is what eq_value gives */
    FZ_CHECK(doc_match_eq_value(m, path, &same), "each_eq's %s unknown to eq_value", path);
    return 0;
}

/* Every pair of the document's top-level values: keys and doc_val_cmp agree. */
static void check_order(const bson_t *doc)
{
    bson_iter_t a, b;
    struct doc_buf ka = {0}, kb = {0};
    int n = 0;

    bson_iter_init(&a, doc);
    while (bson_iter_next(&a) && n++ < 16) {
        int m = 0;

        doc_buf_reset(&ka);
        doc_key_add(&ka, bson_iter_value(&a), false);
        bson_iter_init(&b, doc);
        while (bson_iter_next(&b) && m++ < 16) {
            int want = doc_val_cmp(bson_iter_value(&a), bson_iter_value(&b));
            int got;

            doc_buf_reset(&kb);
            doc_key_add(&kb, bson_iter_value(&b), false);
            got = key_cmp(ka.p, ka.len, kb.p, kb.len);
            want = (want > 0) - (want < 0);
            FZ_CHECK(got == want, "fields %d and %d: keys say %d, doc_val_cmp %d", n, m, got,
                     want);
        }
    }
    doc_buf_free(&ka);
    doc_buf_free(&kb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    const uint8_t *fp, *dp;
    size_t fn = fz_take(&f, fz_u16(&f), &fp);
    size_t dn = fz_take(&f, f.n, &dp);
    bson_t filter, doc;
    struct doc_matcher *m = NULL;
    struct doc_err e = {0};
    bool have_doc, matched = false;
    bson_iter_t it;
    int paths = 0;

    have_doc = bson_init_static(&doc, dp, dn) && bson_validate(&doc, BSON_VALIDATE_NONE, NULL);
    if (have_doc)
        check_order(&doc);
    if (!bson_init_static(&filter, fp, fn))
        return 0;
    if (doc_match_compile(&filter, &m, &e) < 0) {
        FZ_CHECK(e.code != 0 && e.msg[0], "a filter refused without a reason");
        return 0;
    }
    FZ_CHECK(m, "compiled to nothing");
    if (have_doc) {
        matched = doc_match(m, &doc);
        FZ_CHECK(doc_match(m, &doc) == matched, "two matches, two answers");
    }
    bson_iter_init(&it, &filter);
    while (bson_iter_next(&it) && paths < 8) {
        if (bson_iter_key(&it)[0] == '$')
            continue;
        check_bounds(m, bson_iter_key(&it), &doc, have_doc && matched);
        paths++;
    }
    check_bounds(m, "a", &doc, have_doc && matched);
    check_bounds(m, "a.b", &doc, have_doc && matched);
    doc_match_each_eq(m, count_eq, m);
    doc_match_free(m);
    return 0;
}
