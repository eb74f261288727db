/* Projection and sort keys (doc_query.h), with MongoDB's semantics from the
 * manual's "Project Fields to Return from Query", $slice / $elemMatch
 * (projection) and cursor.sort pages.
 *
 * A projection compiles to a tree of path components; applying it walks the
 * document once, copying what the tree keeps, and recurses into
 * sub-documents and arrays of them where the tree goes deeper. The same
 * engine serves $project (doc_agg.c), whose expressions are doc_expr's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "doc_expr.h"
#include "doc_match.h"
#include "doc_query.h"

/* ---- projection ---- */

enum pn_kind {
    PN_INCL,
    PN_EXCL,
    PN_SUB,                     /* a component with components below it */
    PN_EXPR,                    /* a computed field */
    PN_SLICE,
    PN_ELEM,                    /* $elemMatch: top level only */
};

struct pnode {
    char *name;
    enum pn_kind kind;
    bool has_expr;              /* PN_SUB: a computed field below */
    struct pnode **kids;
    unsigned nkids, capk;
    struct doc_expr *ex;
    int64_t skip, limit;        /* PN_SLICE: skip < 0 counts from the end */
    bool slice_pair;            /* [skip, limit] rather than a count */
    struct doc_matcher *m;      /* PN_ELEM: {name: {$elemMatch: spec}} */
};

struct doc_proj {
    bool inclusion;
    bool id_excluded;           /* _id: 0 (inclusion keeps _id otherwise) */
    bool has_elem;
    struct pnode root;
};

static void pnode_free(struct pnode *n)
{
    for (unsigned i = 0; i < n->nkids; i++) {
        pnode_free(n->kids[i]);
        free(n->kids[i]);
    }
    free(n->kids);
    free(n->name);
    doc_expr_free(n->ex);
    if (n->m)
        doc_match_free(n->m);
}

void doc_proj_free(struct doc_proj *p)
{
    if (!p)
        return;
    pnode_free(&p->root);
    free(p);
}

static struct pnode *pnode_kid(const struct pnode *n, const char *name, size_t len)
{
    for (unsigned i = 0; i < n->nkids; i++)
        if (strncmp(n->kids[i]->name, name, len) == 0 && n->kids[i]->name[len] == '\0')
            return n->kids[i];
    return NULL;
}

static struct pnode *pnode_add(struct pnode *n, const char *name, size_t len, enum pn_kind k)
{
    struct pnode *c;

    if (n->nkids == n->capk) {
        unsigned cap = n->capk ? 2 * n->capk : 4;
        struct pnode **kids = realloc(n->kids, cap * sizeof(*kids));

        if (!kids)
            return NULL;
        n->kids = kids;
        n->capk = cap;
    }
    c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->name = strndup(name, len);
    if (!c->name) {
        free(c);
        return NULL;
    }
    c->kind = k;
    n->kids[n->nkids++] = c;
    return c;
}

struct pcomp {
    struct doc_proj *p;
    bool agg;
    int mode;                   /* 1 inclusion, -1 exclusion, 0 not yet */
    int id;                     /* _id: 1 or 0 given, else 0 */
};

static bool proj_value_is_number(const bson_iter_t *it, bool *truth)
{
    switch (bson_iter_type(it)) {
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
    case BSON_TYPE_DOUBLE:
    case BSON_TYPE_DECIMAL128:
    case BSON_TYPE_BOOL:
        *truth = bson_iter_as_bool(it);
        return true;
    default:
        return false;
    }
}

static bool iter_int64(const bson_iter_t *it, int64_t *v)
{
    switch (bson_iter_type(it)) {
    case BSON_TYPE_INT32:
        *v = bson_iter_int32(it);
        return true;
    case BSON_TYPE_INT64:
        *v = bson_iter_int64(it);
        return true;
    case BSON_TYPE_DOUBLE: {
        double d = bson_iter_double(it);

        if (!(d >= -9.2e18 && d <= 9.2e18))
            return false;
        *v = (int64_t)d;
        return true;
    }
    default:
        return false;
    }
}

static int parse_slice(struct pnode *n, const bson_iter_t *arg, const char *path, struct doc_err *e)
{
    bson_iter_t a;

    if (iter_int64(arg, &n->limit))
        return 0;
    if (BSON_ITER_HOLDS_ARRAY(arg) && bson_iter_recurse(arg, &a)) {
        int64_t v[2];
        int i = 0;

        while (bson_iter_next(&a)) {
            if (i == 2 || !iter_int64(&a, &v[i]))
                goto bad;
            i++;
        }
        if (i != 2)
            goto bad;
        if (v[1] <= 0)
            return doc_errf(e, DOC_BadValue, "$slice limit must be positive (field %s)", path);
        n->slice_pair = true;
        n->skip = v[0];
        n->limit = v[1];
        return 0;
    }
bad:
    return doc_errf(e, DOC_BadValue,
                    "$slice only supports numbers and [skip, limit] arrays (field %s)", path);
}

static int set_mode(struct pcomp *c, int want, const char *path, struct doc_err *e)
{
    if (c->mode == 0)
        c->mode = want;
    else if (c->mode != want)
        return want < 0 ? doc_errf(e, DOC_Location31254,
                                   "Cannot do exclusion on field %s in inclusion projection", path)
                        : doc_errf(e, DOC_Location31253,
                                   "Cannot do inclusion on field %s in exclusion projection", path);
    return 0;
}

static int comp_obj(struct pcomp *c, struct pnode *at, const char *prefix, bson_iter_t *it,
                    struct doc_err *e);

/* One field of the spec: `key` (dotted) under `at`, whose path is `prefix`. */
static int comp_field(struct pcomp *c, struct pnode *at, const char *prefix, bson_iter_t *it,
                      struct doc_err *e)
{
    const char *key = bson_iter_key(it);
    char path[1024];
    struct pnode *n = at;
    const char *s = key;
    bool truth;
    enum pn_kind kind;
    bson_iter_t sub;
    int rc;

    if (snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", key) >=
        (int)sizeof(path))
        return doc_errf(e, DOC_BadValue, "projection path too long: %.64s...", path);
    /* Validate and walk to the parent of the last component. */
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        struct pnode *k;

        if (len == 0)
            return doc_errf(e, DOC_BadValue,
                            "FieldPath field names may not be empty strings (projection %s)", path);
        if (s[0] == '$') {
            if (len == 1)
                return doc_errf(e, DOC_BadValue,
                                "positional projection ($) is not supported (field %s)", path);
            return doc_errf(e, DOC_BadValue,
                            "FieldPath field names may not start with '$' (projection %s)", path);
        }
        if (!dot)
            break;
        k = pnode_kid(n, s, len);
        if (!k)
            k = pnode_add(n, s, len, PN_SUB);
        if (!k)
            return doc_errf(e, DOC_InternalError, "out of memory");
        if (k->kind != PN_SUB)
            return doc_errf(e, DOC_Location31250, "Path collision at %s", path);
        n = k;
        s = dot + 1;
    }

    if (proj_value_is_number(it, &truth)) {
        kind = truth ? PN_INCL : PN_EXCL;
    } else if (BSON_ITER_HOLDS_DOCUMENT(it) && bson_iter_recurse(it, &sub)) {
        bson_iter_t first = sub;
        const char *op;

        if (!bson_iter_next(&first))
            return doc_errf(e, DOC_BadValue,
                            "An empty sub-projection is not a valid value. Found empty object at "
                            "path %s", path);
        op = bson_iter_key(&first);
        if (op[0] != '$') {
            /* {a: {b: 1}} is {"a.b": 1}. */
            struct pnode *k = pnode_kid(n, s, strlen(s));

            if (!k)
                k = pnode_add(n, s, strlen(s), PN_SUB);
            if (!k)
                return doc_errf(e, DOC_InternalError, "out of memory");
            if (k->kind != PN_SUB)
                return doc_errf(e, DOC_Location31250, "Path collision at %s", path);
            return comp_obj(c, k, path, &sub, e);
        }
        if (!c->agg && (strcmp(op, "$slice") == 0 || strcmp(op, "$elemMatch") == 0)) {
            bson_iter_t extra = first;

            if (bson_iter_next(&extra))
                return doc_errf(e, DOC_BadValue, "%s projection of %s has more than one field",
                                op, path);
            kind = op[1] == 's' ? PN_SLICE : PN_ELEM;
        } else if (strcmp(op, "$meta") == 0) {
            return doc_errf(e, DOC_BadValue, "$meta projection is not supported (field %s)", path);
        } else {
            kind = PN_EXPR;
        }
    } else {
        kind = PN_EXPR;         /* "$path", a literal, an array of expressions */
    }

    if (pnode_kid(n, s, strlen(s)))
        return doc_errf(e, DOC_Location31250, "Path collision at %s", path);
    if (at == &c->p->root && n == at && strcmp(s, "_id") == 0 &&
        (kind == PN_INCL || kind == PN_EXCL)) {
        c->id = kind == PN_INCL ? 1 : -1;
        c->p->id_excluded = kind == PN_EXCL;
    } else if (kind == PN_INCL || kind == PN_EXPR || kind == PN_ELEM) {
        if ((rc = set_mode(c, 1, path, e)) < 0)
            return rc;
    } else if (kind == PN_EXCL) {
        if ((rc = set_mode(c, -1, path, e)) < 0)
            return rc;
    }
    if (kind == PN_ELEM && strchr(path, '.'))
        return doc_errf(e, DOC_BadValue, "Cannot use $elemMatch projection on a nested field (%s)",
                        path);

    n = pnode_add(n, s, strlen(s), kind);
    if (!n)
        return doc_errf(e, DOC_InternalError, "out of memory");
    if (kind == PN_EXPR) {
        const bson_value_t *v = bson_iter_value(it);

        return doc_expr_compile(v, &n->ex, e);
    }
    if (kind == PN_SLICE) {
        bson_iter_t arg = sub;

        bson_iter_next(&arg);
        return parse_slice(n, &arg, path, e);
    }
    if (kind == PN_ELEM) {
        bson_iter_t arg = sub;
        bson_t filter, em;

        bson_iter_next(&arg);
        if (!BSON_ITER_HOLDS_DOCUMENT(&arg))
            return doc_errf(e, DOC_BadValue, "elemMatch: Invalid argument, object required (%s)",
                            path);
        bson_init(&filter);
        bson_append_document_begin(&filter, path, -1, &em);
        bson_append_iter(&em, "$elemMatch", -1, &arg);
        bson_append_document_end(&filter, &em);
        rc = doc_match_compile(&filter, &n->m, e);
        bson_destroy(&filter);
        c->p->has_elem = true;
        return rc;
    }
    return 0;
}

static int comp_obj(struct pcomp *c, struct pnode *at, const char *prefix, bson_iter_t *it,
                    struct doc_err *e)
{
    while (bson_iter_next(it)) {
        int rc = comp_field(c, at, prefix, it, e);

        if (rc < 0)
            return rc;
    }
    return 0;
}

static bool mark_expr(struct pnode *n)
{
    bool any = n->kind == PN_EXPR;

    for (unsigned i = 0; i < n->nkids; i++)
        any |= mark_expr(n->kids[i]);
    if (n->kind == PN_SUB)
        n->has_expr = any;
    return any;
}

int doc_proj_compile_x(const bson_t *spec, bool agg, struct doc_proj **out, struct doc_err *e)
{
    struct pcomp c = {.agg = agg};
    bson_iter_t it;
    int rc;

    *out = NULL;
    if (!spec || bson_empty(spec)) {
        if (agg)
            return doc_errf(e, DOC_BadValue, "$project requires at least one output field");
        return 0;
    }
    if (!bson_iter_init(&it, spec))
        return doc_errf(e, DOC_InvalidBSON, "projection is not valid BSON");
    c.p = calloc(1, sizeof(*c.p));
    if (!c.p)
        return doc_errf(e, DOC_InternalError, "out of memory");
    c.p->root.kind = PN_SUB;
    rc = comp_obj(&c, &c.p->root, "", &it, e);
    if (rc < 0) {
        doc_proj_free(c.p);
        return rc;
    }
    /* Only _id (and $slice, which keeps the rest) said nothing of the mode. */
    c.p->inclusion = c.mode ? c.mode > 0 : c.id > 0;
    mark_expr(&c.p->root);
    *out = c.p;
    return 0;
}

int doc_proj_compile(const bson_t *spec, struct doc_proj **out, struct doc_err *e)
{
    return doc_proj_compile_x(spec, false, out, e);
}

struct papply {
    const struct doc_proj *p;
    const bson_t *root;
    struct doc_arena *a;
    struct doc_err *e;
};

static void append_slice(bson_t *out, const char *key, int klen, const bson_iter_t *it,
                         const struct pnode *n)
{
    bson_iter_t a;
    int64_t cnt = 0, from, to, i = 0, k = 0;
    bson_t arr;

    if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a)) {
        bson_append_iter(out, key, klen, it);
        return;
    }
    while (bson_iter_next(&a))
        cnt++;
    if (n->slice_pair) {
        from = n->skip >= 0 ? (n->skip < cnt ? n->skip : cnt) : (cnt + n->skip > 0 ? cnt + n->skip : 0);
        to = n->limit < cnt - from ? from + n->limit : cnt;
    } else if (n->limit >= 0) {
        from = 0;
        to = n->limit < cnt ? n->limit : cnt;
    } else {
        from = cnt + n->limit > 0 ? cnt + n->limit : 0;
        to = cnt;
    }
    bson_iter_recurse(it, &a);
    bson_append_array_begin(out, key, klen, &arr);
    while (bson_iter_next(&a)) {
        if (i >= from && i < to) {
            char buf[16];
            const char *ks;
            size_t kl = bson_uint32_to_string((uint32_t)k++, &ks, buf, sizeof(buf));

            bson_append_iter(&arr, ks, (int)kl, &a);
        }
        i++;
    }
    bson_append_array_end(out, &arr);
}

static int incl_doc(struct papply *ap, const struct pnode *n, const bson_t *in, bson_t *out,
                    bool top);

static bool iter_sub(const bson_iter_t *it, bson_t *sub)
{
    uint32_t len;
    const uint8_t *data;

    if (BSON_ITER_HOLDS_DOCUMENT(it))
        bson_iter_document(it, &len, &data);
    else
        bson_iter_array(it, &len, &data);
    return bson_init_static(sub, data, len);
}

/* Inclusion inside an array: documents are projected, arrays recursed into,
 * other values dropped (MongoDB's rule for {"a.b": 1} over a: [1, {b: 2}]). */
/* Arrays nested deeper than this inside one path component are left alone
 * (dropped by an inclusion, kept whole by an exclusion): a hostile
 * document of millions of nested arrays must not exhaust the stack. */
#define PROJ_ARRAY_DEPTH_MAX 100

static int incl_arr(struct papply *ap, const struct pnode *n, const bson_iter_t *it, bson_t *out,
                    unsigned depth)
{
    bson_iter_t a;
    uint32_t k = 0;

    if (!bson_iter_recurse(it, &a))
        return 0;
    while (bson_iter_next(&a)) {
        char buf[16];
        const char *ks;
        size_t kl;
        bson_t in, child;
        int rc;

        if (!BSON_ITER_HOLDS_DOCUMENT(&a) &&
            (!BSON_ITER_HOLDS_ARRAY(&a) || depth >= PROJ_ARRAY_DEPTH_MAX))
            continue;
        kl = bson_uint32_to_string(k++, &ks, buf, sizeof(buf));
        if (BSON_ITER_HOLDS_DOCUMENT(&a)) {
            if (!iter_sub(&a, &in))
                continue;
            bson_append_document_begin(out, ks, (int)kl, &child);
            rc = incl_doc(ap, n, &in, &child, false);
            bson_append_document_end(out, &child);
        } else {
            bson_append_array_begin(out, ks, (int)kl, &child);
            rc = incl_arr(ap, n, &a, &child, depth + 1);
            bson_append_array_end(out, &child);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The computed fields of `n` alone: its field was missing or not a
 * document, so it becomes a document of them. */
static int expr_only(struct papply *ap, const struct pnode *n, bson_t *out)
{
    for (unsigned i = 0; i < n->nkids; i++) {
        const struct pnode *c = n->kids[i];

        if (c->kind == PN_EXPR) {
            bson_value_t v;

            if (doc_expr_eval(c->ex, ap->root, ap->a, &v, ap->e) < 0)
                return -1;
            if (v.value_type != BSON_TYPE_EOD)
                bson_append_value(out, c->name, -1, &v);
        } else if (c->kind == PN_SUB && c->has_expr) {
            bson_t child;
            int rc;

            bson_append_document_begin(out, c->name, -1, &child);
            rc = expr_only(ap, c, &child);
            bson_append_document_end(out, &child);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

static int elem_match(struct papply *ap, const struct pnode *n, const bson_t *in, bson_t *out)
{
    bson_iter_t it, a;

    if (!bson_iter_init_find(&it, in, n->name) || !BSON_ITER_HOLDS_ARRAY(&it) ||
        !bson_iter_recurse(&it, &a))
        return 0;
    while (bson_iter_next(&a)) {
        bson_t one, arr;
        bool hit;

        /* The element alone in its array: the filter's $elemMatch then
         * holds exactly when it holds for this element. */
        bson_init(&one);
        bson_append_array_begin(&one, n->name, -1, &arr);
        bson_append_iter(&arr, "0", 1, &a);
        bson_append_array_end(&one, &arr);
        hit = doc_match(n->m, &one);
        if (hit) {
            bson_iter_t f;

            bson_iter_init_find(&f, &one, n->name);
            bson_append_iter(out, n->name, -1, &f);
        }
        bson_destroy(&one);
        if (hit)
            break;
    }
    (void)ap;
    return 0;
}

static int incl_doc(struct papply *ap, const struct pnode *n, const bson_t *in, bson_t *out,
                    bool top)
{
    bson_iter_t it;
    int rc;

    if (!bson_iter_init(&it, in))
        return doc_errf(ap->e, DOC_InvalidBSON, "document is not valid BSON");
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        int klen = (int)bson_iter_key_len(&it);
        const struct pnode *c = pnode_kid(n, key, (size_t)klen);
        bson_t sub, child;

        if (!c) {
            if (top && !ap->p->id_excluded && strcmp(key, "_id") == 0)
                bson_append_iter(out, key, klen, &it);
            continue;
        }
        switch (c->kind) {
        case PN_INCL:
            bson_append_iter(out, key, klen, &it);
            break;
        case PN_SLICE:
            append_slice(out, key, klen, &it, c);
            break;
        case PN_SUB:
            if (BSON_ITER_HOLDS_DOCUMENT(&it) && iter_sub(&it, &sub)) {
                bson_append_document_begin(out, key, klen, &child);
                rc = incl_doc(ap, c, &sub, &child, false);
                bson_append_document_end(out, &child);
                if (rc < 0)
                    return rc;
            } else if (BSON_ITER_HOLDS_ARRAY(&it)) {
                bson_append_array_begin(out, key, klen, &child);
                rc = incl_arr(ap, c, &it, &child, 0);
                bson_append_array_end(out, &child);
                if (rc < 0)
                    return rc;
            }
            break;
        default:                /* excluded _id; computed and $elemMatch below */
            break;
        }
    }
    /* Computed fields come after the included ones, in the spec's order;
     * a sub-document with computed fields inside was written above if the
     * document had one there. */
    if (n->has_expr || top) {
        for (unsigned i = 0; i < n->nkids; i++) {
            const struct pnode *c = n->kids[i];

            if (c->kind == PN_EXPR) {
                bson_value_t v;

                if (doc_expr_eval(c->ex, ap->root, ap->a, &v, ap->e) < 0)
                    return -1;
                if (v.value_type != BSON_TYPE_EOD)
                    bson_append_value(out, c->name, -1, &v);
            } else if (c->kind == PN_SUB && c->has_expr) {
                bson_t child;

                if (bson_iter_init_find(&it, in, c->name) &&
                    (BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)))
                    continue;
                bson_append_document_begin(out, c->name, -1, &child);
                rc = expr_only(ap, c, &child);
                bson_append_document_end(out, &child);
                if (rc < 0)
                    return rc;
            }
        }
    }
    /* MongoDB 4.4+: the $elemMatch field comes after the others. */
    if (top && ap->p->has_elem)
        for (unsigned i = 0; i < n->nkids; i++)
            if (n->kids[i]->kind == PN_ELEM && (rc = elem_match(ap, n->kids[i], in, out)) < 0)
                return rc;
    return 0;
}

static void excl_doc(const struct pnode *n, const bson_t *in, bson_t *out);

static void excl_arr(const struct pnode *n, const bson_iter_t *it, bson_t *out, unsigned depth)
{
    bson_iter_t a;
    uint32_t k = 0;

    if (!bson_iter_recurse(it, &a))
        return;
    while (bson_iter_next(&a)) {
        char buf[16];
        const char *ks;
        size_t kl = bson_uint32_to_string(k++, &ks, buf, sizeof(buf));
        bson_t in, child;

        if (BSON_ITER_HOLDS_DOCUMENT(&a) && iter_sub(&a, &in)) {
            bson_append_document_begin(out, ks, (int)kl, &child);
            excl_doc(n, &in, &child);
            bson_append_document_end(out, &child);
        } else if (BSON_ITER_HOLDS_ARRAY(&a) && depth < PROJ_ARRAY_DEPTH_MAX) {
            bson_append_array_begin(out, ks, (int)kl, &child);
            excl_arr(n, &a, &child, depth + 1);
            bson_append_array_end(out, &child);
        } else {
            bson_append_iter(out, ks, (int)kl, &a);
        }
    }
}

static void excl_doc(const struct pnode *n, const bson_t *in, bson_t *out)
{
    bson_iter_t it;

    if (!bson_iter_init(&it, in))
        return;
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        int klen = (int)bson_iter_key_len(&it);
        const struct pnode *c = pnode_kid(n, key, (size_t)klen);
        bson_t sub, child;

        if (!c || c->kind == PN_INCL) {
            bson_append_iter(out, key, klen, &it);
        } else if (c->kind == PN_SLICE) {
            append_slice(out, key, klen, &it, c);
        } else if (c->kind == PN_SUB && BSON_ITER_HOLDS_DOCUMENT(&it) && iter_sub(&it, &sub)) {
            bson_append_document_begin(out, key, klen, &child);
            excl_doc(c, &sub, &child);
            bson_append_document_end(out, &child);
        } else if (c->kind == PN_SUB && BSON_ITER_HOLDS_ARRAY(&it)) {
            bson_append_array_begin(out, key, klen, &child);
            excl_arr(c, &it, &child, 0);
            bson_append_array_end(out, &child);
        } else if (c->kind == PN_SUB) {
            bson_append_iter(out, key, klen, &it);
        }
    }
}

int doc_proj_apply_x(const struct doc_proj *p, const bson_t *doc, bson_t *out,
                     struct doc_arena *a, struct doc_err *e)
{
    struct papply ap = {.p = p, .root = doc, .a = a, .e = e};

    if (!p) {
        bson_concat(out, doc);
        return 0;
    }
    if (!p->inclusion) {
        excl_doc(&p->root, doc, out);
        return 0;
    }
    return incl_doc(&ap, &p->root, doc, out, true);
}

int doc_proj_apply(const struct doc_proj *p, const bson_t *doc, bson_t *out, struct doc_err *e)
{
    struct doc_arena a = {0};
    int rc = doc_proj_apply_x(p, doc, out, &a, e);

    doc_arena_free(&a);
    return rc;
}

/* ---- sort ---- */

struct skey {
    char *path;
    int dir;
};

struct doc_sort {
    unsigned n;
    int natural;
    struct skey k[DOC_SORT_KEYS_MAX];
};

void doc_sort_free(struct doc_sort *s)
{
    if (!s)
        return;
    for (unsigned i = 0; i < s->n; i++)
        free(s->k[i].path);
    free(s);
}

static bool sort_dir(const bson_iter_t *it, int *dir)
{
    double d;

    switch (bson_iter_type(it)) {
    case BSON_TYPE_INT32:
        d = bson_iter_int32(it);
        break;
    case BSON_TYPE_INT64:
        d = (double)bson_iter_int64(it);
        break;
    case BSON_TYPE_DOUBLE:
        d = bson_iter_double(it);
        break;
    default:
        return false;
    }
    if (d != 1 && d != -1)
        return false;
    *dir = d > 0 ? 1 : -1;
    return true;
}

static bool sort_path_ok(const char *p)
{
    const char *s = p;

    for (;;) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);

        if (len == 0 || s[0] == '$')
            return false;
        if (!dot)
            return true;
        s = dot + 1;
    }
}

int doc_sort_compile(const bson_t *spec, struct doc_sort **out, struct doc_err *e)
{
    struct doc_sort *s;
    bson_iter_t it;

    *out = NULL;
    if (!spec || bson_empty(spec))
        return 0;
    if (!bson_iter_init(&it, spec))
        return doc_errf(e, DOC_InvalidBSON, "sort is not valid BSON");
    s = calloc(1, sizeof(*s));
    if (!s)
        return doc_errf(e, DOC_InternalError, "out of memory");
    while (bson_iter_next(&it)) {
        const char *key = bson_iter_key(&it);
        int dir;

        if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
            doc_errf(e, DOC_BadValue, "$meta sort by %s is not supported", key);
            goto fail;
        }
        if (!sort_dir(&it, &dir)) {
            doc_errf(e, DOC_BadValue,
                     "$sort key ordering must be 1 (for ascending) or -1 (for descending)");
            goto fail;
        }
        if (strcmp(key, "$natural") == 0) {
            if (s->n || bson_count_keys(spec) != 1) {
                doc_errf(e, DOC_BadValue, "$natural sort cannot be combined with other fields");
                goto fail;
            }
            s->natural = dir;
            continue;
        }
        if (!sort_path_ok(key)) {
            doc_errf(e, DOC_BadValue, "bad sort field name '%s'", key);
            goto fail;
        }
        if (s->n == DOC_SORT_KEYS_MAX) {
            doc_errf(e, DOC_BadValue, "cannot sort with keys that exceed %d fields",
                     DOC_SORT_KEYS_MAX);
            goto fail;
        }
        s->k[s->n].path = strdup(key);
        if (!s->k[s->n].path) {
            doc_errf(e, DOC_InternalError, "out of memory");
            goto fail;
        }
        s->k[s->n++].dir = dir;
    }
    *out = s;
    return 0;
fail:
    doc_sort_free(s);
    return -1;
}

int doc_sort_natural(const struct doc_sort *s)
{
    return s ? s->natural : 0;
}

unsigned doc_sort_nkeys(const struct doc_sort *s)
{
    return s ? s->n : 0;
}

const char *doc_sort_path(const struct doc_sort *s, unsigned i, int *dir)
{
    if (!s || i >= s->n)
        return NULL;
    if (dir)
        *dir = s->k[i].dir;
    return s->k[i].path;
}

/* The value a document sorts by on one key: the smallest (ascending) or
 * largest (descending) of those its path reaches. This walks by itself
 * rather than with doc_walk because an array element without the field
 * counts as null here, as in MongoDB's sort keys ({a: [{b: 1}, {}]} sorts
 * ascending on a.b as null). */
struct sbest {
    int dir;
    bool have;
    bool empty_arr;             /* an empty array: below null (comparison order page) */
    bson_value_t best;
};

static const bson_value_t null_value = {.value_type = BSON_TYPE_NULL};

static void consider(struct sbest *b, const bson_value_t *v)
{
    int c;

    if (!b->have) {
        b->best = *v;
        b->have = true;
        return;
    }
    c = doc_val_cmp(v, &b->best);
    if (b->dir > 0 ? c < 0 : c > 0)
        b->best = *v;
}

static void consider_leaf(struct sbest *b, const bson_iter_t *it)
{
    bson_iter_t a;
    bool any = false;

    if (!BSON_ITER_HOLDS_ARRAY(it)) {
        consider(b, bson_iter_value((bson_iter_t *)it));
        return;
    }
    if (bson_iter_recurse(it, &a))
        while (bson_iter_next(&a)) {
            consider(b, bson_iter_value(&a));
            any = true;
        }
    if (!any)
        b->empty_arr = true;
}

static void sw_doc(struct sbest *b, const bson_t *d, const char *path, unsigned depth);

static void sw_value(struct sbest *b, const bson_iter_t *it, const char *rest, unsigned depth);

static void sw_arr(struct sbest *b, const bson_iter_t *it, const char *path, unsigned depth)
{
    const char *dot = strchr(path, '.');
    size_t len = dot ? (size_t)(dot - path) : strlen(path);
    bson_iter_t a;
    bool numeric = len > 0 && len < 10, docs = false;

    for (size_t i = 0; i < len && numeric; i++)
        numeric = path[i] >= '0' && path[i] <= '9';
    if (!bson_iter_recurse(it, &a))
        return;
    while (bson_iter_next(&a)) {
        if (numeric && strlen(bson_iter_key(&a)) == len &&
            memcmp(bson_iter_key(&a), path, len) == 0) {
            sw_value(b, &a, dot ? dot + 1 : NULL, depth + 1);
            docs = true;
        } else if (BSON_ITER_HOLDS_DOCUMENT(&a)) {
            bson_t sub;

            if (iter_sub(&a, &sub))
                sw_doc(b, &sub, path, depth + 1);
            docs = true;
        }
    }
    if (!docs)
        consider(b, &null_value);
}

static void sw_value(struct sbest *b, const bson_iter_t *it, const char *rest, unsigned depth)
{
    bson_t sub;

    if (depth > 200) {
        consider(b, &null_value);
    } else if (!rest) {
        consider_leaf(b, it);
    } else if (BSON_ITER_HOLDS_DOCUMENT(it) && iter_sub(it, &sub)) {
        sw_doc(b, &sub, rest, depth);
    } else if (BSON_ITER_HOLDS_ARRAY(it)) {
        sw_arr(b, it, rest, depth);
    } else {
        consider(b, &null_value);
    }
}

static void sw_doc(struct sbest *b, const bson_t *d, const char *path, unsigned depth)
{
    const char *dot = strchr(path, '.');
    size_t len = dot ? (size_t)(dot - path) : strlen(path);
    bson_iter_t it;

    if (!bson_iter_init_find_w_len(&it, d, path, (int)len)) {
        consider(b, &null_value);
        return;
    }
    sw_value(b, &it, dot ? dot + 1 : NULL, depth);
}

void doc_sort_key(const struct doc_sort *s, const bson_t *doc, struct doc_buf *key)
{
    if (!s)
        return;
    for (unsigned i = 0; i < s->n; i++) {
        struct sbest b = {.dir = s->k[i].dir};

        sw_doc(&b, doc, s->k[i].path, 0);
        if (b.empty_arr && (b.dir > 0 || !b.have)) {
            size_t at = key->len;

            doc_key_add_min(key);
            if (b.dir < 0 && !key->oom)
                for (size_t j = at; j < key->len; j++)
                    key->p[j] = (uint8_t)~key->p[j];
        } else {
            doc_key_add(key, b.have ? &b.best : &null_value, b.dir < 0);
        }
    }
}
