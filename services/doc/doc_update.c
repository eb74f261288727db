/* Updates (doc_update.h): an update document compiled into a list of
 * modifications sorted by path, applied in one pass over the document.
 *
 * Sorting the paths component by component puts every path right after
 * its prefixes, so the conflicts MongoDB refuses (one path twice, a path
 * and its prefix) are neighbours, and the paths under one field form one
 * run: the apply walks the document once, level by level, handing each
 * field the run of modifications under its name and copying the others
 * untouched into the output, which is built once (libbson's nested
 * append_*_begin/end write sub-documents in place). New fields come after
 * the old ones of their level, in the order the manual gives since 5.0
 * (numeric names in numeric order, then the others lexicographically). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc_bson.h"
#include "doc_update.h"

/* MongoDB's deepest nesting of a document the update may build, and its
 * limit on the nulls an update may add to reach an array position. */
#define UPD_DEPTH_MAX 100
#define UPD_PAD_MAX 1500000u

enum op {
    OP_SET,
    OP_SETONINSERT,
    OP_UNSET,
    OP_INC,
    OP_MUL,
    OP_MIN,
    OP_MAX,
    OP_CURRENTDATE,
    OP_RENAME_SRC,
    OP_RENAME_DST,
    OP_PUSH,
    OP_ADDTOSET,
    OP_PULL,
    OP_PULLALL,
    OP_POP,
};

static const struct {
    const char *name;
    enum op op;
} op_names[] = {
    {"$set", OP_SET},
    {"$setOnInsert", OP_SETONINSERT},
    {"$unset", OP_UNSET},
    {"$inc", OP_INC},
    {"$mul", OP_MUL},
    {"$min", OP_MIN},
    {"$max", OP_MAX},
    {"$currentDate", OP_CURRENTDATE},
    {"$rename", OP_RENAME_SRC},
    {"$push", OP_PUSH},
    {"$addToSet", OP_ADDTOSET},
    {"$pull", OP_PULL},
    {"$pullAll", OP_PULLALL},
    {"$pop", OP_POP},
};

enum pull_kind {
    PULL_EQ,                    /* elements equal to arg */
    PULL_COND,                  /* elements v with {v: v} matching the matcher */
    PULL_QUERY,                 /* document elements matching the matcher */
};

struct mod {
    enum op op;
    const char *opname;
    char *path;                 /* dotted, as given */
    char *split;                /* path with NULs for the dots */
    const char **comp;
    uint32_t *clen;             /* each component's length... */
    uint8_t *cnum;              /* ...and whether it is all digits */
    unsigned ncomp;
    bson_value_t arg;           /* $set, $inc, ..., $pull's value */
    bson_t *vals;               /* $push/$addToSet/$pullAll: the values, as an array */
    unsigned rename;            /* $rename: the pair's number */
    /* $push's modifiers */
    bool has_pos, has_slice;
    int64_t pos, slice;
    int sort;                   /* 0 none, else the direction of a whole-element sort */
    bson_t *sort_spec;          /* or {field: dir, ...} */
    /* $pull */
    enum pull_kind pull;
    struct doc_matcher *m;
    /* $pop: 1 last, -1 first; $currentDate: timestamp rather than date */
    int pop;
    bool ts;
};

struct doc_update {
    bool replacement;
    bson_t *repl;               /* a pointer: bson_t wants more alignment than malloc gives */
    struct mod *mods;
    unsigned n, nrename;
    bool touches_id;
};

/* ---- names and paths ---- */

static bool all_digits_n(const char *s, size_t n)
{
    if (!n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

static bool all_digits(const char *s)
{
    return all_digits_n(s, strlen(s));
}

/* Numeric names first, in numeric order, then the others by bytes: a total
 * order, which MongoDB's numeric-or-lexicographic comparison is not. */
static int name_cmp(const char *a, size_t la, bool na, const char *b, size_t lb, bool nb)
{
    int c;

    if (na != nb)
        return na ? -1 : 1;
    if (na && la != lb)
        return la < lb ? -1 : 1;
    c = memcmp(a, b, la < lb ? la : lb);
    if (c)
        return c;
    return la < lb ? -1 : la > lb;
}

static int comp_cmp(const struct mod *m, unsigned d, const char *key, size_t klen, bool knum)
{
    return name_cmp(m->comp[d], m->clen[d], m->cnum[d], key, klen, knum);
}

static int mod_cmp(const void *pa, const void *pb)
{
    const struct mod *a = pa, *b = pb;
    unsigned n = a->ncomp < b->ncomp ? a->ncomp : b->ncomp;

    for (unsigned i = 0; i < n; i++) {
        int c = comp_cmp(a, i, b->comp[i], b->clen[i], b->cnum[i]);

        if (c)
            return c;
    }
    return a->ncomp < b->ncomp ? -1 : a->ncomp > b->ncomp;
}

/* An array position as MongoDB reads one in a path: digits, no leading
 * zero. */
static bool array_index(const char *s, uint32_t *out)
{
    uint64_t v = 0;

    if (!all_digits(s) || (s[0] == '0' && s[1]) || strlen(s) > 10)
        return false;
    for (; *s; s++)
        v = v * 10 + (uint64_t)(*s - '0');
    if (v > UINT32_MAX - 1)
        return false;
    *out = (uint32_t)v;
    return true;
}

static int split_path(struct mod *m, const char *path, struct doc_err *e)
{
    size_t len = strlen(path);
    unsigned n = 1;

    if (!len)
        return doc_errf(e, DOC_BadValue, "An empty update path is not valid.");
    for (size_t i = 0; i < len; i++)
        n += path[i] == '.';
    if (n > UPD_DEPTH_MAX)
        return doc_errf(e, DOC_BadValue, "The update path '%.200s' nests deeper than %d levels",
                        path, UPD_DEPTH_MAX);
    m->path = strdup(path);
    m->split = strdup(path);
    m->comp = malloc(n * sizeof(*m->comp));
    m->clen = malloc(n * sizeof(*m->clen));
    m->cnum = malloc(n);
    if (!m->path || !m->split || !m->comp || !m->clen || !m->cnum)
        return doc_errf(e, DOC_InternalError, "out of memory");
    m->ncomp = n;
    n = 0;
    m->comp[n++] = m->split;
    for (size_t i = 0; i < len; i++)
        if (m->split[i] == '.') {
            m->split[i] = '\0';
            m->comp[n++] = m->split + i + 1;
        }
    for (unsigned i = 0; i < m->ncomp; i++) {
        const char *c = m->comp[i];

        m->clen[i] = (uint32_t)strlen(c);
        m->cnum[i] = all_digits_n(c, m->clen[i]);

        if (!*c)
            return doc_errf(e, DOC_BadValue,
                            "The update path '%.200s' contains an empty field name, which is not allowed.",
                            path);
        /* The positional forms need the query's match, which an update
         * alone does not have. */
        if (strcmp(c, "$") == 0)
            return doc_errf(e, DOC_BadValue,
                            "The positional operator did not find the match needed from the query.");
        if (c[0] == '$' && c[1] == '[')
            return doc_errf(e, DOC_NotImplemented,
                            "The array update operator '%.100s' in '%.200s' is not supported", c, path);
        if (c[0] == '$')
            return doc_errf(e, DOC_DollarPrefixedFieldName,
                            "The dollar ($) prefixed field '%.100s' in '%.200s' is not valid for storage.",
                            c, path);
    }
    return 0;
}

/* ---- values ---- */

static bool is_number(bson_type_t t)
{
    return t == BSON_TYPE_INT32 || t == BSON_TYPE_INT64 || t == BSON_TYPE_DOUBLE ||
           t == BSON_TYPE_DECIMAL128;
}

/* An integer value of a number (an integral double too). */
static bool as_int64(const bson_value_t *v, int64_t *out)
{
    switch (v->value_type) {
    case BSON_TYPE_INT32:
        *out = v->value.v_int32;
        return true;
    case BSON_TYPE_INT64:
        *out = v->value.v_int64;
        return true;
    case BSON_TYPE_DOUBLE:
        if (v->value.v_double != v->value.v_double || v->value.v_double < -9.2e18 ||
            v->value.v_double > 9.2e18 || (double)(int64_t)v->value.v_double != v->value.v_double)
            return false;
        *out = (int64_t)v->value.v_double;
        return true;
    default:
        return false;
    }
}

/* How deep a value nests: 0 for a scalar, 1 + its deepest member for a
 * document or array; stops counting past `limit`. */
static int value_depth(const bson_value_t *v, int limit)
{
    bson_iter_t it;
    int deepest = 0;

    if (v->value_type != BSON_TYPE_DOCUMENT && v->value_type != BSON_TYPE_ARRAY)
        return 0;
    if (limit <= 0)
        return 1;
    if (!bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len))
        return 1;
    while (bson_iter_next(&it)) {
        int d = value_depth(bson_iter_value(&it), limit - 1);

        if (d > deepest)
            deepest = d;
        if (deepest >= limit)
            break;
    }
    return 1 + deepest;
}

/* The same type and the same bytes: what MongoDB takes as "no change". */
static bool identical(const bson_value_t *a, const bson_value_t *b)
{
    if (a->value_type != b->value_type)
        return false;
    switch (a->value_type) {
    case BSON_TYPE_DOUBLE:
        return memcmp(&a->value.v_double, &b->value.v_double, sizeof(double)) == 0;
    case BSON_TYPE_DOCUMENT:
    case BSON_TYPE_ARRAY:
        return a->value.v_doc.data_len == b->value.v_doc.data_len &&
               memcmp(a->value.v_doc.data, b->value.v_doc.data, a->value.v_doc.data_len) == 0;
    case BSON_TYPE_UTF8:
        return a->value.v_utf8.len == b->value.v_utf8.len &&
               memcmp(a->value.v_utf8.str, b->value.v_utf8.str, a->value.v_utf8.len) == 0;
    case BSON_TYPE_DECIMAL128:
        return memcmp(&a->value.v_decimal128, &b->value.v_decimal128, sizeof(bson_decimal128_t)) == 0;
    default:
        return doc_val_eq(a, b);
    }
}

/* A value as relaxed extended JSON, for error messages: "{key: value}"
 * as MongoDB prints an element (key NULL: the value alone). */
static void value_json(const char *key, const bson_value_t *v, char *buf, size_t cap)
{
    bson_t tmp = BSON_INITIALIZER;
    char *s;
    size_t n;

    bson_append_value(&tmp, "0", 1, v);
    s = bson_as_relaxed_extended_json(&tmp, NULL);
    /* '{ "0" : value }' */
    n = s ? strlen(s) : 0;
    if (n >= 10)
        s[n - 2] = '\0';
    if (key)
        snprintf(buf, cap, "{%s: %s}", key, n >= 10 ? s + 8 : "?");
    else
        snprintf(buf, cap, "%s", n >= 10 ? s + 8 : "?");
    bson_free(s);
    bson_destroy(&tmp);
}

static void id_json(const bson_t *doc, char *buf, size_t cap)
{
    bson_iter_t it;

    if (doc && bson_iter_init_find(&it, doc, "_id"))
        value_json("_id", bson_iter_value(&it), buf, cap);
    else
        snprintf(buf, cap, "{}");
}

/* ---- compile ---- */

static void mod_free(struct mod *m)
{
    free(m->path);
    free(m->split);
    free(m->comp);
    free(m->clen);
    free(m->cnum);
    bson_value_destroy(&m->arg);
    if (m->vals)
        bson_destroy(m->vals);
    if (m->sort_spec)
        bson_destroy(m->sort_spec);
    if (m->m)
        doc_match_free(m->m);
}

void doc_update_free(struct doc_update *u)
{
    if (!u)
        return;
    for (unsigned i = 0; i < u->n; i++)
        mod_free(&u->mods[i]);
    free(u->mods);
    if (u->repl)
        bson_destroy(u->repl);
    free(u);
}

bool doc_update_is_replacement(const struct doc_update *u)
{
    return u->replacement;
}

/* The values of $each (an array) or the one value, as an owned array. */
static int values_of(struct mod *m, const bson_iter_t *it, bool each, struct doc_err *e)
{
    const bson_value_t *v = bson_iter_value((bson_iter_t *)it);

    if (each) {
        if (v->value_type != BSON_TYPE_ARRAY)
            return doc_errf(e, DOC_BadValue,
                            "The argument to $each in %s must be an array but it was of type: %s",
                            m->opname, doc_type_name(v->value_type));
        m->vals = bson_new_from_data(v->value.v_doc.data, v->value.v_doc.data_len);
    } else {
        m->vals = bson_new();
        if (m->vals)
            bson_append_value(m->vals, "0", 1, v);
    }
    if (!m->vals)
        return doc_errf(e, DOC_BadValue, "%s: malformed $each", m->opname);
    return 0;
}

static bool is_each_doc(const bson_value_t *v)
{
    bson_iter_t it;

    return v->value_type == BSON_TYPE_DOCUMENT &&
           bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len) &&
           bson_iter_find(&it, "$each");
}

static int compile_push(struct mod *m, const bson_iter_t *arg, struct doc_err *e)
{
    const bson_value_t *v = bson_iter_value((bson_iter_t *)arg);
    bson_iter_t it;

    if (!is_each_doc(v))
        return values_of(m, arg, false, e);
    bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len);
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        const bson_value_t *x = bson_iter_value(&it);
        int64_t n;

        if (strcmp(k, "$each") == 0) {
            if (values_of(m, &it, true, e) < 0)
                return -1;
        } else if (strcmp(k, "$slice") == 0) {
            if (!as_int64(x, &n))
                return doc_errf(e, DOC_BadValue,
                                "The value for $slice must be an integral value but was given type: %s",
                                doc_type_name(x->value_type));
            m->has_slice = true;
            m->slice = n;
        } else if (strcmp(k, "$position") == 0) {
            if (!as_int64(x, &n))
                return doc_errf(e, DOC_BadValue,
                                "The value for $position must be an integer value, not of type: %s",
                                doc_type_name(x->value_type));
            m->has_pos = true;
            m->pos = n;
        } else if (strcmp(k, "$sort") == 0) {
            if (is_number(x->value_type)) {
                if (!as_int64(x, &n) || (n != 1 && n != -1))
                    return doc_errf(e, DOC_BadValue,
                                    "The $sort element value must be either 1 or -1");
                m->sort = (int)n;
            } else if (x->value_type == BSON_TYPE_DOCUMENT) {
                bson_iter_t s;
                unsigned nf = 0;

                m->sort_spec = bson_new_from_data(x->value.v_doc.data, x->value.v_doc.data_len);
                if (!m->sort_spec || !bson_iter_init(&s, m->sort_spec))
                    return doc_errf(e, DOC_BadValue, "The $sort is invalid");
                while (bson_iter_next(&s)) {
                    const char *f = bson_iter_key(&s);

                    nf++;
                    if (!as_int64(bson_iter_value(&s), &n) || (n != 1 && n != -1))
                        return doc_errf(e, DOC_BadValue,
                                        "The $sort element value must be either 1 or -1");
                    if (!*f || f[0] == '$' || f[0] == '.' || f[strlen(f) - 1] == '.' ||
                        strstr(f, ".."))
                        return doc_errf(e, DOC_BadValue, "The $sort field is a dotted field "
                                        "but has an empty part: %.200s", f);
                }
                if (!nf)
                    return doc_errf(e, DOC_BadValue,
                                    "The $sort pattern is empty when it should be a set of fields.");
            } else {
                return doc_errf(e, DOC_BadValue, "The $sort is invalid: use 1/-1 to sort the whole "
                                "element, or {field:1/-1} to sort embedded fields");
            }
        } else {
            return doc_errf(e, DOC_BadValue, "Unrecognized clause in $push: %.100s", k);
        }
    }
    return 0;
}

static int compile_addtoset(struct mod *m, const bson_iter_t *arg, struct doc_err *e)
{
    const bson_value_t *v = bson_iter_value((bson_iter_t *)arg);
    bson_iter_t it;

    if (!is_each_doc(v))
        return values_of(m, arg, false, e);
    bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len);
    while (bson_iter_next(&it)) {
        if (strcmp(bson_iter_key(&it), "$each") != 0)
            return doc_errf(e, DOC_BadValue, "Found unexpected fields after $each in $addToSet: %.100s",
                            bson_iter_key(&it));
        if (values_of(m, &it, true, e) < 0)
            return -1;
    }
    return 0;
}

/* A $pull condition: a document whose first field is a query operator on
 * the element itself ({$gte: 6}), or a query on document elements
 * ({score: 8}, {$or: [...]}); anything else is a value to remove. */
static int compile_pull(struct mod *m, const bson_iter_t *arg, struct doc_err *e)
{
    static const char *const logical[] = {"$and", "$or", "$nor", "$expr", "$where", "$text",
                                          "$comment"};
    const bson_value_t *v = bson_iter_value((bson_iter_t *)arg);
    bson_iter_t it;
    bson_t filter, wrapped = BSON_INITIALIZER;
    const char *first;
    int rc;

    bson_value_copy(v, &m->arg);
    m->pull = PULL_EQ;
    if (v->value_type != BSON_TYPE_DOCUMENT)
        return 0;
    if (!bson_init_static(&filter, v->value.v_doc.data, v->value.v_doc.data_len) ||
        !bson_iter_init(&it, &filter))
        return doc_errf(e, DOC_BadValue, "$pull: malformed condition");
    m->pull = PULL_QUERY;
    if (bson_iter_next(&it)) {
        first = bson_iter_key(&it);
        if (first[0] == '$') {
            m->pull = PULL_COND;
            for (size_t i = 0; i < sizeof(logical) / sizeof(logical[0]); i++)
                if (strcmp(first, logical[i]) == 0)
                    m->pull = PULL_QUERY;
        }
    }
    if (m->pull == PULL_COND) {
        bson_append_document(&wrapped, "v", 1, &filter);
        rc = doc_match_compile(&wrapped, &m->m, e);
    } else {
        rc = doc_match_compile(&filter, &m->m, e);
    }
    bson_destroy(&wrapped);
    return rc < 0 ? -1 : 0;
}

static int too_deep(const struct mod *m, struct doc_err *e)
{
    return doc_errf(e, DOC_BadValue, "%s on '%.200s' would nest the document deeper than %d levels",
                    m->opname, m->path, UPD_DEPTH_MAX);
}

static int compile_one(struct doc_update *u, struct mod *m, enum op op, const char *opname,
                       bson_iter_t *it, struct doc_err *e)
{
    const bson_value_t *v = bson_iter_value(it);
    bson_value_t arr;
    char js[256];
    int64_t n;

    m->op = op;
    m->opname = opname;
    if (split_path(m, bson_iter_key(it), e) < 0)
        return -1;
    /* The values stored as given; the array operators check theirs below. */
    if ((op == OP_SET || op == OP_SETONINSERT || op == OP_MIN || op == OP_MAX) &&
        value_depth(v, UPD_DEPTH_MAX) + (int)m->ncomp > UPD_DEPTH_MAX)
        return too_deep(m, e);
    switch (op) {
    case OP_INC:
    case OP_MUL:
        if (!is_number(v->value_type)) {
            value_json(m->path, v, js, sizeof(js));
            return doc_errf(e, DOC_TypeMismatch, "Cannot %s with non-numeric argument: %s",
                            op == OP_INC ? "increment" : "multiply", js);
        }
        bson_value_copy(v, &m->arg);
        return 0;
    case OP_SET:
    case OP_SETONINSERT:
    case OP_MIN:
    case OP_MAX:
        bson_value_copy(v, &m->arg);
        return 0;
    case OP_UNSET:
        return 0;
    case OP_CURRENTDATE:
        if (v->value_type == BSON_TYPE_BOOL)
            return 0;
        if (v->value_type == BSON_TYPE_DOCUMENT) {
            bson_iter_t t;

            if (bson_iter_init_from_data(&t, v->value.v_doc.data, v->value.v_doc.data_len) &&
                bson_iter_next(&t) && strcmp(bson_iter_key(&t), "$type") == 0 &&
                BSON_ITER_HOLDS_UTF8(&t)) {
                const char *s = bson_iter_utf8(&t, NULL);
                bool ok = !bson_iter_next(&t);

                if (ok && strcmp(s, "date") == 0)
                    return 0;
                if (ok && strcmp(s, "timestamp") == 0) {
                    m->ts = true;
                    return 0;
                }
            }
            return doc_errf(e, DOC_BadValue, "The '$type' string field is required to be 'date' or "
                            "'timestamp': {$currentDate: {field : {$type: 'date'}}}");
        }
        value_json(m->path, v, js, sizeof(js));
        return doc_errf(e, DOC_BadValue, "%s is not valid type for $currentDate. Please use a boolean "
                        "('true') or a $type expression ({$type: 'timestamp/date'}).", js);
    case OP_POP:
        if (!is_number(v->value_type)) {
            value_json(m->path, v, js, sizeof(js));
            return doc_errf(e, DOC_FailedToParse, "Expected a number in: %s", js);
        }
        if (!as_int64(v, &n) || (n != 1 && n != -1)) {
            value_json(NULL, v, js, sizeof(js));
            return doc_errf(e, DOC_FailedToParse, "$pop expects 1 or -1, found: %s", js);
        }
        m->pop = (int)n;
        return 0;
    case OP_PUSH:
    case OP_ADDTOSET:
        if ((op == OP_PUSH ? compile_push(m, it, e) : compile_addtoset(m, it, e)) < 0)
            return -1;
        /* The values land in an array at the path: as deep as that array
         * (not as the {$each: [...]} that brought them). */
        arr.value_type = BSON_TYPE_ARRAY;
        arr.value.v_doc.data = (uint8_t *)bson_get_data(m->vals);
        arr.value.v_doc.data_len = m->vals->len;
        if (value_depth(&arr, UPD_DEPTH_MAX) + (int)m->ncomp > UPD_DEPTH_MAX)
            return too_deep(m, e);
        return 0;
    case OP_PULL:
        return compile_pull(m, it, e);
    case OP_PULLALL:
        if (v->value_type != BSON_TYPE_ARRAY) {
            value_json(m->path, v, js, sizeof(js));
            return doc_errf(e, DOC_BadValue, "$pullAll requires an array argument but was given a %s",
                            doc_type_name(v->value_type));
        }
        return values_of(m, it, true, e);
    case OP_RENAME_SRC:
    case OP_RENAME_DST:
        break;
    }
    return 0;
}

/* $rename {from: "to"}: a pair of modifications, the source's removal and
 * the target's setting, each on its own path. */
static int compile_rename(struct doc_update *u, struct mod *src, struct mod *dst, bson_iter_t *it,
                          struct doc_err *e)
{
    const char *from = bson_iter_key(it), *to;
    char js[256];
    size_t lf, lt;

    if (!BSON_ITER_HOLDS_UTF8(it)) {
        value_json(from, bson_iter_value(it), js, sizeof(js));
        return doc_errf(e, DOC_BadValue, "The 'to' field for $rename must be a string: %s", js);
    }
    to = bson_iter_utf8(it, NULL);
    src->op = OP_RENAME_SRC;
    dst->op = OP_RENAME_DST;
    src->opname = dst->opname = "$rename";
    src->rename = dst->rename = u->nrename++;
    if (split_path(src, from, e) < 0)
        return -1;
    if (split_path(dst, to, e) < 0)
        return -1;
    lf = strlen(from);
    lt = strlen(to);
    if (strcmp(from, to) == 0) {
        value_json(from, bson_iter_value(it), js, sizeof(js));
        return doc_errf(e, DOC_BadValue, "The source and target field for $rename must differ: %s", js);
    }
    if ((lf < lt && strncmp(from, to, lf) == 0 && to[lf] == '.') ||
        (lt < lf && strncmp(from, to, lt) == 0 && from[lt] == '.')) {
        value_json(from, bson_iter_value(it), js, sizeof(js));
        return doc_errf(e, DOC_BadValue,
                        "The source and target field for $rename must not be on the same path: %s", js);
    }
    return 0;
}

static int compile_replacement(struct doc_update *u, const bson_t *doc, struct doc_err *e)
{
    bson_iter_t it;
    bson_value_t whole;

    u->replacement = true;
    if (!bson_iter_init(&it, doc))
        return doc_errf(e, DOC_InvalidBSON, "the replacement document is not valid BSON");
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);

        if (k[0] == '$')
            return doc_errf(e, DOC_DollarPrefixedFieldName,
                            "The dollar ($) prefixed field '%.100s' in '%.100s' is not valid for storage.",
                            k, k);
    }
    whole.value_type = BSON_TYPE_DOCUMENT;
    whole.value.v_doc.data = (uint8_t *)bson_get_data(doc);
    whole.value.v_doc.data_len = doc->len;
    if (value_depth(&whole, UPD_DEPTH_MAX + 1) > UPD_DEPTH_MAX)
        return doc_errf(e, DOC_BadValue, "the replacement document nests deeper than %d levels",
                        UPD_DEPTH_MAX);
    u->repl = bson_copy(doc);
    if (!u->repl)
        return doc_errf(e, DOC_InternalError, "out of memory");
    return 0;
}

/* After sorting, a path equal to its neighbour or a prefix of it is one
 * MongoDB refuses. */
static int check_conflicts(const struct doc_update *u, struct doc_err *e)
{
    for (unsigned i = 1; i < u->n; i++) {
        const struct mod *a = &u->mods[i - 1], *b = &u->mods[i];
        unsigned k;

        if (a->ncomp > b->ncomp)
            continue;
        for (k = 0; k < a->ncomp; k++)
            if (strcmp(a->comp[k], b->comp[k]) != 0)
                break;
        if (k == a->ncomp)
            return doc_errf(e, DOC_ConflictingUpdateOperators,
                            "Updating the path '%.200s' would create a conflict at '%.200s'", b->path,
                            a->path);
    }
    return 0;
}

int doc_update_compile(const bson_t *doc, struct doc_update **out, struct doc_err *e)
{
    struct doc_update *u = calloc(1, sizeof(*u));
    bson_iter_t it, sub;
    unsigned cap = 0;

    *out = NULL;
    if (!u)
        return doc_errf(e, DOC_InternalError, "out of memory");
    if (!bson_iter_init(&it, doc)) {
        doc_update_free(u);
        return doc_errf(e, DOC_InvalidBSON, "the update document is not valid BSON");
    }
    if (!bson_iter_next(&it) || bson_iter_key(&it)[0] != '$') {
        if (compile_replacement(u, doc, e) < 0)
            goto fail;
        *out = u;
        return 0;
    }
    /* Operators: count the modifications first, so that one array holds
     * them all. */
    do {
        if (bson_iter_key(&it)[0] != '$') {
            doc_errf(e, DOC_FailedToParse, "Unknown modifier: %.100s. Expected a valid update "
                     "modifier or pipeline-style update specified as an array", bson_iter_key(&it));
            goto fail;
        }
        if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &sub))
            while (bson_iter_next(&sub))
                cap += strcmp(bson_iter_key(&it), "$rename") == 0 ? 2 : 1;
    } while (bson_iter_next(&it));
    u->mods = calloc(cap ? cap : 1, sizeof(*u->mods));
    if (!u->mods) {
        doc_update_free(u);
        return doc_errf(e, DOC_InternalError, "out of memory");
    }
    bson_iter_init(&it, doc);
    while (bson_iter_next(&it)) {
        const char *name = bson_iter_key(&it);
        const char *opname = NULL;
        enum op op = OP_SET;
        unsigned nfields = 0;

        for (size_t i = 0; i < sizeof(op_names) / sizeof(op_names[0]); i++)
            if (strcmp(name, op_names[i].name) == 0) {
                op = op_names[i].op;
                opname = op_names[i].name;
            }
        if (!opname) {
            doc_errf(e, DOC_BadValue,
                     "Unknown modifier: %.100s. Expected a valid update modifier or pipeline-style "
                     "update specified as an array", name);
            goto fail;
        }
        if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
            doc_errf(e, DOC_FailedToParse,
                     "Modifiers operate on fields but we found type %s instead. For example: "
                     "{$mod: {<field>: ...}} not {%s: ...}",
                     doc_type_name(bson_iter_type(&it)), opname);
            goto fail;
        }
        bson_iter_recurse(&it, &sub);
        while (bson_iter_next(&sub)) {
            nfields++;
            if (op == OP_RENAME_SRC) {
                if (compile_rename(u, &u->mods[u->n], &u->mods[u->n + 1], &sub, e) < 0) {
                    u->n += 2;
                    goto fail;
                }
                u->n += 2;
                continue;
            }
            if (compile_one(u, &u->mods[u->n++], op, opname, &sub, e) < 0)
                goto fail;
        }
        if (!nfields) {
            doc_errf(e, DOC_BadValue, "'%s' is empty. You must specify a field like so: "
                     "{%s: {<field>: ...}}", opname, opname);
            goto fail;
        }
    }
    qsort(u->mods, u->n, sizeof(*u->mods), mod_cmp);
    if (check_conflicts(u, e) < 0)
        goto fail;
    for (unsigned i = 0; i < u->n; i++)
        if (strcmp(u->mods[i].comp[0], "_id") == 0)
            u->touches_id = true;
    *out = u;
    return 0;
fail:
    doc_update_free(u);
    return -1;
}

/* ---- apply ---- */

struct actx {
    const struct doc_update *u;
    const bson_t *doc;
    bool inserting;
    int64_t now_ms;
    struct doc_err *e;
    /* Per modification: the run it starts at the level being merged has
     * been done. A run's first modification also starts the runs of the
     * levels below it, so a level marks a run only once the levels below
     * are done with it, and each level starts on clean marks. */
    uint8_t *used;
    bson_value_t *renamed;      /* per $rename: the source's value... */
    bool *rename_on;            /* ...if the source was there */
    bson_value_t *vals;         /* scratch for array operators */
    size_t nvals, capvals;
    bool oom;
};

/* Whether a modification writes a field where there is none. */
static bool creates(const struct actx *c, const struct mod *m)
{
    switch (m->op) {
    case OP_SETONINSERT:
        return c->inserting;
    case OP_RENAME_DST:
        return c->rename_on[m->rename];
    case OP_UNSET:
    case OP_RENAME_SRC:
    case OP_PULL:
    case OP_PULLALL:
    case OP_POP:
        return false;
    default:
        return true;
    }
}

static bool any_creates(const struct actx *c, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        if (creates(c, &c->u->mods[i]))
            return true;
    return false;
}

static int vals_push(struct actx *c, const bson_value_t *v)
{
    if (c->nvals == c->capvals) {
        size_t cap = c->capvals ? c->capvals * 2 : 16;
        bson_value_t *p = realloc(c->vals, cap * sizeof(*p));

        if (!p)
            return doc_errf(c->e, DOC_InternalError, "out of memory");
        c->vals = p;
        c->capvals = cap;
    }
    c->vals[c->nvals++] = *v;
    return 0;
}

static void append_array(bson_t *out, const char *key, int klen, const bson_value_t *v, size_t n)
{
    bson_t arr;
    char ibuf[16];
    const char *ik;

    bson_append_array_begin(out, key, klen, &arr);
    for (size_t i = 0; i < n; i++) {
        size_t il = bson_uint32_to_string((uint32_t)i, &ik, ibuf, sizeof(ibuf));

        bson_append_value(&arr, ik, (int)il, &v[i]);
    }
    bson_append_array_end(out, &arr);
}

static void append_int(bson_t *out, const char *key, int klen, int64_t r, bool wide)
{
    if (!wide && r >= INT32_MIN && r <= INT32_MAX)
        bson_append_int32(out, key, klen, (int32_t)r);
    else
        bson_append_int64(out, key, klen, r);
}

static double as_double(const bson_value_t *v)
{
    switch (v->value_type) {
    case BSON_TYPE_INT32: return v->value.v_int32;
    case BSON_TYPE_INT64: return (double)v->value.v_int64;
    default: return v->value.v_double;
    }
}

/* $inc and $mul: a double anywhere makes a double; otherwise int32 until
 * the result needs more, int64 once either side is one, and an int64 that
 * overflows is an error, as MongoDB's SafeNum. */
static int arith(struct actx *c, const struct mod *m, const bson_value_t *cur, bson_t *out,
                 const char *key, int klen)
{
    const bson_value_t *a = &m->arg;
    char id[200];

    if (!is_number(cur->value_type)) {
        id_json(c->doc, id, sizeof(id));
        return doc_errf(c->e, DOC_TypeMismatch, "Cannot apply %s to a value of non-numeric type. "
                        "%.200s has the field '%.100s' of non-numeric type %s", m->opname, id, key,
                        doc_type_name(cur->value_type));
    }
    if (cur->value_type == BSON_TYPE_DECIMAL128 || a->value_type == BSON_TYPE_DECIMAL128)
        return doc_errf(c->e, DOC_NotImplemented, "%s on a decimal value is not supported", m->opname);
    if (cur->value_type == BSON_TYPE_DOUBLE || a->value_type == BSON_TYPE_DOUBLE) {
        double x = as_double(cur), y = as_double(a);

        bson_append_double(out, key, klen, m->op == OP_INC ? x + y : x * y);
        return 0;
    }
    {
        int64_t x = cur->value_type == BSON_TYPE_INT32 ? cur->value.v_int32 : cur->value.v_int64;
        int64_t y = a->value_type == BSON_TYPE_INT32 ? a->value.v_int32 : a->value.v_int64;
        bool wide = cur->value_type == BSON_TYPE_INT64 || a->value_type == BSON_TYPE_INT64;
        int64_t r;
        bool ovf = m->op == OP_INC ? __builtin_add_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r);

        if (ovf) {
            id_json(c->doc, id, sizeof(id));
            return doc_errf(c->e, DOC_BadValue, "Failed to apply %s operations to current value "
                            "((%s)%lld) for document %.200s", m->opname,
                            cur->value_type == BSON_TYPE_INT32 ? "NumberInt" : "NumberLong",
                            (long long)x, id);
        }
        append_int(out, key, klen, r, wide);
    }
    return 0;
}

static const bson_value_t null_value = {.value_type = BSON_TYPE_NULL};

/* $push's $sort: the whole element, or the fields of document elements
 * (a missing field, or an element that is not a document, as null). */
static int sort_cmp_vals(const struct mod *m, const bson_value_t *a, const bson_value_t *b)
{
    bson_iter_t s;
    int64_t dir;

    if (m->sort)
        return m->sort * doc_val_cmp(a, b);
    bson_iter_init(&s, m->sort_spec);
    while (bson_iter_next(&s)) {
        const char *f = bson_iter_key(&s);
        bson_value_t va = null_value, vb = null_value;
        bson_t da, db;
        int r;

        as_int64(bson_iter_value(&s), &dir);
        if (a->value_type == BSON_TYPE_DOCUMENT &&
            bson_init_static(&da, a->value.v_doc.data, a->value.v_doc.data_len))
            doc_get(&da, f, &va);
        if (b->value_type == BSON_TYPE_DOCUMENT &&
            bson_init_static(&db, b->value.v_doc.data, b->value.v_doc.data_len))
            doc_get(&db, f, &vb);
        r = doc_val_cmp(&va, &vb);
        if (r)
            return (int)dir * r;
    }
    return 0;
}

/* A stable merge sort of the scratch values (MongoDB keeps equal elements
 * in their order), through a second half of the scratch array. */
static void sort_vals(const struct mod *m, bson_value_t *v, bson_value_t *tmp, size_t n)
{
    size_t h = n / 2, i = 0, j = h, k = 0;

    if (n < 2)
        return;
    sort_vals(m, v, tmp, h);
    sort_vals(m, v + h, tmp, n - h);
    while (i < h && j < n)
        tmp[k++] = sort_cmp_vals(m, &v[j], &v[i]) < 0 ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(*v));
}

static int array_type_error(struct actx *c, const struct mod *m, const bson_value_t *cur)
{
    char id[200];

    id_json(c->doc, id, sizeof(id));
    switch (m->op) {
    case OP_PUSH:
        return doc_errf(c->e, DOC_BadValue, "The field '%.200s' must be an array but is of type %s in "
                        "document %.200s", m->path, doc_type_name(cur->value_type), id);
    case OP_ADDTOSET:
        return doc_errf(c->e, DOC_BadValue, "Cannot apply $addToSet to non-array field. Field named "
                        "'%.200s' has non-array type %s", m->path, doc_type_name(cur->value_type));
    case OP_POP:
        return doc_errf(c->e, DOC_TypeMismatch, "Path '%.200s' contains an element of non-array type "
                        "'%s'", m->path, doc_type_name(cur->value_type));
    default:
        return doc_errf(c->e, DOC_BadValue, "Cannot apply %s to a non-array value", m->opname);
    }
}

static bool pulled(const struct mod *m, const bson_value_t *v)
{
    bson_t d, w = BSON_INITIALIZER;
    bool r;

    switch (m->pull) {
    case PULL_EQ:
        return doc_val_eq(&m->arg, v);
    case PULL_QUERY:
        return v->value_type == BSON_TYPE_DOCUMENT &&
               bson_init_static(&d, v->value.v_doc.data, v->value.v_doc.data_len) &&
               doc_match(m->m, &d);
    case PULL_COND:
        /* The element as the value of the field the condition was
         * compiled on; a small document on the stack (libbson's inline
         * buffer) unless the element is big. */
        bson_append_value(&w, "v", 1, v);
        r = doc_match(m->m, &w);
        bson_destroy(&w);
        return r;
    }
    return false;
}

/* |v| of a negative v, INT64_MIN included. */
static uint64_t neg_u64(int64_t v)
{
    return 0 - (uint64_t)v;
}

/* The array operators on the current value `cur` (NULL: the field is not
 * there, and only $push and $addToSet make one). */
static int array_op(struct actx *c, const struct mod *m, const bson_value_t *cur, bson_t *out,
                    const char *key, int klen)
{
    bson_iter_t it, vi;
    size_t n0, ins, total;

    if (cur && cur->value_type != BSON_TYPE_ARRAY)
        return array_type_error(c, m, cur);
    c->nvals = 0;
    if (cur) {
        if (!bson_iter_init_from_data(&it, cur->value.v_doc.data, cur->value.v_doc.data_len))
            return doc_errf(c->e, DOC_InvalidBSON, "malformed array at '%.200s'", m->path);
        while (bson_iter_next(&it))
            if (vals_push(c, bson_iter_value(&it)) < 0)
                return -1;
    }
    n0 = c->nvals;
    switch (m->op) {
    case OP_PUSH:
        ins = n0;
        if (m->has_pos) {
            if (m->pos >= 0)
                ins = (uint64_t)m->pos < n0 ? (size_t)m->pos : n0;
            else
                ins = neg_u64(m->pos) >= n0 ? 0 : n0 - (size_t)neg_u64(m->pos);
        }
        bson_iter_init(&vi, m->vals);
        while (bson_iter_next(&vi))
            if (vals_push(c, bson_iter_value(&vi)) < 0)
                return -1;
        total = c->nvals;
        if (ins < n0) {
            /* Rotate the new values in front of the old ones after `ins`:
             * three reversals, in place. */
            bson_value_t t;

            for (size_t a = ins, b = n0 - 1; a < b; a++, b--)
                t = c->vals[a], c->vals[a] = c->vals[b], c->vals[b] = t;
            for (size_t a = n0, b = total - 1; a < b; a++, b--)
                t = c->vals[a], c->vals[a] = c->vals[b], c->vals[b] = t;
            for (size_t a = ins, b = total - 1; a < b; a++, b--)
                t = c->vals[a], c->vals[a] = c->vals[b], c->vals[b] = t;
        }
        if (m->sort || m->sort_spec) {
            size_t need = total * 2;

            while (c->capvals < need)
                if (vals_push(c, &null_value) < 0)
                    return -1;
            sort_vals(m, c->vals, c->vals + total, total);
        }
        if (m->has_slice) {
            if (m->slice >= 0) {
                if ((uint64_t)m->slice < total)
                    total = (size_t)m->slice;
            } else if (neg_u64(m->slice) < total) {
                size_t drop = total - (size_t)neg_u64(m->slice);

                memmove(c->vals, c->vals + drop, (total - drop) * sizeof(*c->vals));
                total -= drop;
            }
        }
        append_array(out, key, klen, c->vals, total);
        return 0;
    case OP_ADDTOSET:
        bson_iter_init(&vi, m->vals);
        while (bson_iter_next(&vi)) {
            const bson_value_t *v = bson_iter_value(&vi);
            bool dup = false;

            for (size_t i = 0; i < c->nvals && !dup; i++)
                dup = doc_val_eq(&c->vals[i], v);
            if (!dup && vals_push(c, v) < 0)
                return -1;
        }
        append_array(out, key, klen, c->vals, c->nvals);
        return 0;
    case OP_PULL:
    case OP_PULLALL:
        total = 0;
        for (size_t i = 0; i < n0; i++) {
            bool drop = false;

            if (m->op == OP_PULL) {
                drop = pulled(m, &c->vals[i]);
            } else {
                bson_iter_init(&vi, m->vals);
                while (!drop && bson_iter_next(&vi))
                    drop = doc_val_eq(bson_iter_value(&vi), &c->vals[i]);
            }
            if (!drop)
                c->vals[total++] = c->vals[i];
        }
        append_array(out, key, klen, c->vals, total);
        return 0;
    case OP_POP:
        if (!n0)
            append_array(out, key, klen, c->vals, 0);
        else if (m->pop > 0)
            append_array(out, key, klen, c->vals, n0 - 1);
        else
            append_array(out, key, klen, c->vals + 1, n0 - 1);
        return 0;
    default:
        return doc_errf(c->e, DOC_InternalError, "not an array operator");
    }
}

/* One modification on the field `key` whose current value is `cur` (NULL
 * when absent): writes the field as it becomes, or nothing. */
static int apply_leaf(struct actx *c, const struct mod *m, const bson_value_t *cur, bson_t *out,
                      const char *key, int klen, bool in_array)
{
    switch (m->op) {
    case OP_SETONINSERT:
        if (!c->inserting)
            break;
        /* fall through */
    case OP_SET:
        bson_append_value(out, key, klen, &m->arg);
        return 0;
    case OP_RENAME_DST:
        if (!c->rename_on[m->rename])
            break;
        bson_append_value(out, key, klen, &c->renamed[m->rename]);
        return 0;
    case OP_RENAME_SRC:
        if (!c->rename_on[m->rename])
            break;
        /* fall through */
    case OP_UNSET:
        /* An array keeps its length: MongoDB leaves a null in its place. */
        if (cur && in_array)
            bson_append_null(out, key, klen);
        return 0;
    case OP_INC:
        if (!cur) {
            bson_append_value(out, key, klen, &m->arg);
            return 0;
        }
        return arith(c, m, cur, out, key, klen);
    case OP_MUL:
        if (!cur) {
            if (m->arg.value_type == BSON_TYPE_DECIMAL128)
                return doc_errf(c->e, DOC_NotImplemented, "$mul by a decimal value is not supported");
            if (m->arg.value_type == BSON_TYPE_DOUBLE)
                bson_append_double(out, key, klen, 0.0);
            else if (m->arg.value_type == BSON_TYPE_INT64)
                bson_append_int64(out, key, klen, 0);
            else
                bson_append_int32(out, key, klen, 0);
            return 0;
        }
        return arith(c, m, cur, out, key, klen);
    case OP_MIN:
    case OP_MAX:
        if (cur) {
            int r = doc_val_cmp(&m->arg, cur);

            if (m->op == OP_MIN ? r >= 0 : r <= 0)
                break;
        }
        bson_append_value(out, key, klen, &m->arg);
        return 0;
    case OP_CURRENTDATE:
        /* The timestamp's increment is not MongoDB's oplog counter: the
         * milliseconds keep two updates in one second apart. */
        if (m->ts)
            bson_append_timestamp(out, key, klen, (uint32_t)(c->now_ms / 1000),
                                  (uint32_t)(c->now_ms % 1000) + 1);
        else
            bson_append_date_time(out, key, klen, c->now_ms);
        return 0;
    case OP_PUSH:
    case OP_ADDTOSET:
        return array_op(c, m, cur, out, key, klen);
    case OP_PULL:
    case OP_PULLALL:
    case OP_POP:
        if (!cur)
            return 0;
        return array_op(c, m, cur, out, key, klen);
    }
    if (cur)
        bson_append_value(out, key, klen, cur);
    return 0;
}

static int merge_doc(struct actx *c, bson_iter_t *it, size_t lo, size_t hi, unsigned d, bson_t *out);
static int merge_array(struct actx *c, bson_iter_t *it, const bson_value_t *whole, const char *name,
                       size_t lo, size_t hi, unsigned d, bson_t *out);

/* The end of the run of modifications starting at lo that share
 * component d. */
static size_t group_end(const struct actx *c, size_t lo, size_t hi, unsigned d)
{
    const struct mod *m = &c->u->mods[lo];
    size_t i = lo + 1;

    while (i < hi && c->u->mods[i].clen[d] == m->clen[d] &&
           memcmp(c->u->mods[i].comp[d], m->comp[d], m->clen[d]) == 0)
        i++;
    return i;
}

/* The run whose component d is `key`, by bisection (the run is sorted on
 * component d); hi if none. */
static size_t find_group(const struct actx *c, size_t lo, size_t hi, unsigned d, const char *key,
                         size_t klen)
{
    bool knum = all_digits_n(key, klen);
    size_t a = lo, b = hi;

    while (a < b) {
        size_t mid = a + (b - a) / 2;

        if (comp_cmp(&c->u->mods[mid], d, key, klen, knum) < 0)
            a = mid + 1;
        else
            b = mid;
    }
    if (a < hi && c->u->mods[a].clen[d] == klen && memcmp(c->u->mods[a].comp[d], key, klen) == 0)
        return a;
    return hi;
}

static int not_viable(struct actx *c, const struct mod *m, unsigned d, const char *key,
                      const bson_value_t *v)
{
    char js[256];

    value_json(key, v, js, sizeof(js));
    return doc_errf(c->e, DOC_PathNotViable, "Cannot create field '%.100s' in element %.200s",
                    m->comp[d], js);
}

/* The field `key` (value `cur`, or NULL) under the run [lo, hi) whose
 * component d names it. */
static int merge_field(struct actx *c, const bson_value_t *cur, size_t lo, size_t hi, unsigned d,
                       bson_t *out, const char *key, int klen, bool in_array)
{
    const struct mod *m = &c->u->mods[lo];
    bson_iter_t child;
    bson_t sub;
    int rc;

    if (m->ncomp == d + 1)
        return apply_leaf(c, m, cur, out, key, klen, in_array);
    if (!cur) {
        if (!any_creates(c, lo, hi))
            return 0;
        bson_append_document_begin(out, key, klen, &sub);
        rc = merge_doc(c, NULL, lo, hi, d + 1, &sub);
        bson_append_document_end(out, &sub);
        return rc;
    }
    if (cur->value_type == BSON_TYPE_DOCUMENT) {
        if (!bson_iter_init_from_data(&child, cur->value.v_doc.data, cur->value.v_doc.data_len))
            return doc_errf(c->e, DOC_InvalidBSON, "malformed document at '%.200s'", key);
        bson_append_document_begin(out, key, klen, &sub);
        rc = merge_doc(c, &child, lo, hi, d + 1, &sub);
        bson_append_document_end(out, &sub);
        return rc;
    }
    if (cur->value_type == BSON_TYPE_ARRAY) {
        if (!bson_iter_init_from_data(&child, cur->value.v_doc.data, cur->value.v_doc.data_len))
            return doc_errf(c->e, DOC_InvalidBSON, "malformed array at '%.200s'", key);
        bson_append_array_begin(out, key, klen, &sub);
        rc = merge_array(c, &child, cur, key, lo, hi, d + 1, &sub);
        bson_append_array_end(out, &sub);
        return rc;
    }
    for (size_t i = lo; i < hi; i++)
        if (creates(c, &c->u->mods[i]))
            return not_viable(c, &c->u->mods[i], d + 1, key, cur);
    bson_append_value(out, key, klen, cur);
    return 0;
}

/* One level that is a document (it == NULL: a new one): its fields in
 * order, each merged with its run, then the runs that found no field. */
static int merge_doc(struct actx *c, bson_iter_t *it, size_t lo, size_t hi, unsigned d, bson_t *out)
{
    if (it)
        while (bson_iter_next(it)) {
            const char *key = bson_iter_key(it);
            int klen = (int)bson_iter_key_len(it);
            size_t g = find_group(c, lo, hi, d, key, (size_t)klen);

            if (g == hi || c->used[g]) {
                bson_append_iter(out, key, klen, it);
                continue;
            }
            /* $rename unsets its target before it sets it: an old target
             * goes, the new one comes at the end. */
            if (c->u->mods[g].op == OP_RENAME_DST && c->u->mods[g].ncomp == d + 1 &&
                c->rename_on[c->u->mods[g].rename])
                continue;
            if (merge_field(c, bson_iter_value(it), g, group_end(c, g, hi, d), d, out, key, klen,
                            false) < 0)
                return -1;
            c->used[g] = 1;
        }
    for (size_t g = lo, ge; g < hi; g = ge) {
        ge = group_end(c, g, hi, d);
        if (c->used[g])
            continue;
        if (merge_field(c, NULL, g, ge, d, out, c->u->mods[g].comp[d], -1, false) < 0)
            return -1;
        c->used[g] = 1;
    }
    return 0;
}

/* One level that is an array: components are positions. A position past
 * the end is reached with nulls, as MongoDB pads; a name that is not a
 * position cannot be created in an array. */
static int merge_array(struct actx *c, bson_iter_t *it, const bson_value_t *whole, const char *name,
                       size_t lo, size_t hi, unsigned d, bson_t *out)
{
    char ibuf[16];
    const char *ik;
    uint32_t n = 0, idx;
    size_t il;

    for (size_t g = lo; g < hi; g++) {
        const struct mod *m = &c->u->mods[g];

        if (m->op == OP_RENAME_DST && c->rename_on[m->rename]) {
            char id[200];

            id_json(c->doc, id, sizeof(id));
            return doc_errf(c->e, DOC_BadValue, "The destination field cannot be an array element, "
                            "'%.200s' in doc with _id: %.200s has an array field called '%.100s'",
                            m->path, id, name);
        }
        if (!array_index(m->comp[d], &idx) && creates(c, m))
            return not_viable(c, m, d, name, whole);
    }
    while (bson_iter_next(it)) {
        size_t g;

        il = bson_uint32_to_string(n, &ik, ibuf, sizeof(ibuf));
        g = find_group(c, lo, hi, d, ik, il);
        if (g == hi || c->used[g]) {
            bson_append_value(out, ik, (int)il, bson_iter_value(it));
        } else {
            if (merge_field(c, bson_iter_value(it), g, group_end(c, g, hi, d), d, out, ik, (int)il,
                            true) < 0)
                return -1;
            c->used[g] = 1;
        }
        n++;
    }
    /* The positions past the end, in numeric order (the sort's). */
    for (size_t g = lo, ge; g < hi; g = ge) {
        ge = group_end(c, g, hi, d);
        if (c->used[g] || !array_index(c->u->mods[g].comp[d], &idx) || idx < n ||
            !any_creates(c, g, ge))
            continue;
        if (idx - n > UPD_PAD_MAX)
            return doc_errf(c->e, DOC_BadValue, "can't backfill more than %u elements", UPD_PAD_MAX);
        for (; n < idx; n++) {
            il = bson_uint32_to_string(n, &ik, ibuf, sizeof(ibuf));
            bson_append_null(out, ik, (int)il);
        }
        il = bson_uint32_to_string(n, &ik, ibuf, sizeof(ibuf));
        if (merge_field(c, NULL, g, ge, d, out, ik, (int)il, true) < 0)
            return -1;
        c->used[g] = 1;
        n++;
    }
    return 0;
}

/* $rename's source value, looked up before anything moves: through
 * sub-documents only (MongoDB refuses a source inside an array). */
static int rename_sources(struct actx *c)
{
    const struct doc_update *u = c->u;

    for (unsigned i = 0; i < u->n; i++) {
        const struct mod *m = &u->mods[i];
        bson_iter_t it;
        const bson_value_t *v = NULL;
        bool found = true;

        if (m->op != OP_RENAME_SRC)
            continue;
        if (!bson_iter_init(&it, c->doc))
            return doc_errf(c->e, DOC_InvalidBSON, "malformed document");
        for (unsigned k = 0; k < m->ncomp && found; k++) {
            if (k) {
                if (v->value_type == BSON_TYPE_ARRAY) {
                    char id[200];

                    id_json(c->doc, id, sizeof(id));
                    return doc_errf(c->e, DOC_BadValue, "The source field cannot be an array element, "
                                    "'%.200s' in doc with _id: %.200s has an array field called "
                                    "'%.100s'", m->path, id, m->comp[k - 1]);
                }
                if (v->value_type != BSON_TYPE_DOCUMENT ||
                    !bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len)) {
                    found = false;
                    break;
                }
            }
            found = bson_iter_find(&it, m->comp[k]);
            if (found)
                v = bson_iter_value(&it);
        }
        c->rename_on[m->rename] = found;
        if (found)
            c->renamed[m->rename] = *v;
    }
    return 0;
}

static int apply_replacement(const struct doc_update *u, const bson_t *doc, bson_t *out,
                             struct doc_err *e)
{
    bson_iter_t old, it;
    bool has_old = doc && bson_iter_init_find(&old, doc, "_id");

    if (has_old) {
        if (bson_iter_init_find(&it, u->repl, "_id") &&
            !identical(bson_iter_value(&it), bson_iter_value(&old))) {
            char js[256];

            value_json("_id", bson_iter_value(&it), js, sizeof(js));
            return doc_errf(e, DOC_ImmutableField, "After applying the update, the (immutable) field "
                            "'_id' was found to have been altered to %.200s", js);
        }
        bson_append_iter(out, "_id", 3, &old);
    } else if (bson_iter_init_find(&it, u->repl, "_id")) {
        bson_append_iter(out, "_id", 3, &it);
    }
    bson_iter_init(&it, u->repl);
    while (bson_iter_next(&it))
        if (strcmp(bson_iter_key(&it), "_id") != 0)
            bson_append_iter(out, bson_iter_key(&it), (int)bson_iter_key_len(&it), &it);
    return 0;
}

static int same_bytes(const bson_t *a, const bson_t *b)
{
    return a->len == b->len && memcmp(bson_get_data(a), bson_get_data(b), a->len) == 0;
}

int doc_update_apply(const struct doc_update *u, const bson_t *doc, bool inserting,
                     int64_t now_ms, bson_t *out, struct doc_err *e)
{
    /* Small updates keep their per-application state on the stack. */
    uint8_t used_stack[64];
    bson_value_t renamed_stack[8];
    bool on_stack[8];
    struct actx c = {.u = u, .doc = doc, .inserting = inserting, .now_ms = now_ms, .e = e};
    bson_iter_t it, old, now;
    int rc = -1;

    if (u->replacement) {
        if (apply_replacement(u, doc, out, e) < 0)
            return -1;
        return !same_bytes(doc, out);
    }
    c.used = u->n <= sizeof(used_stack) ? used_stack : malloc(u->n);
    c.renamed = u->nrename <= 8 ? renamed_stack : malloc(u->nrename * sizeof(*c.renamed));
    c.rename_on = u->nrename <= 8 ? on_stack : malloc(u->nrename * sizeof(*c.rename_on));
    if (!c.used || !c.renamed || !c.rename_on) {
        doc_errf(e, DOC_InternalError, "out of memory");
        goto done;
    }
    memset(c.used, 0, u->n);
    if (rename_sources(&c) < 0)
        goto done;
    if (!bson_iter_init(&it, doc)) {
        doc_errf(e, DOC_InvalidBSON, "malformed document");
        goto done;
    }
    if (merge_doc(&c, &it, 0, u->n, 0, out) < 0)
        goto done;
    if (u->touches_id && bson_iter_init_find(&old, doc, "_id") &&
        (!bson_iter_init_find(&now, out, "_id") ||
         !identical(bson_iter_value(&old), bson_iter_value(&now)))) {
        doc_errf(e, DOC_ImmutableField,
                 "Performing an update on the path '_id' would modify the immutable field '_id'");
        goto done;
    }
    rc = !same_bytes(doc, out);
done:
    if (c.used != used_stack)
        free(c.used);
    if (c.renamed != renamed_stack)
        free(c.renamed);
    if (c.rename_on != on_stack)
        free(c.rename_on);
    free(c.vals);
    return rc;
}

/* ---- upsert ---- */

struct seed {
    bson_t set;                 /* {path: value, ...}: the query's equalities */
    unsigned n;
};

static int seed_eq(void *arg, const char *path, const bson_value_t *v)
{
    struct seed *s = arg;

    bson_append_value(&s->set, path, -1, v);
    s->n++;
    return 0;
}

/* `_id` first, as MongoDB stores an inserted document. */
static void id_first(bson_t *out)
{
    bson_iter_t it;
    bson_t tmp;

    if (!bson_iter_init(&it, out) || !bson_iter_next(&it) || strcmp(bson_iter_key(&it), "_id") == 0 ||
        !bson_iter_init_find(&it, out, "_id"))
        return;
    bson_init(&tmp);
    bson_append_iter(&tmp, "_id", 3, &it);
    bson_iter_init(&it, out);
    while (bson_iter_next(&it))
        if (strcmp(bson_iter_key(&it), "_id") != 0)
            bson_append_iter(&tmp, bson_iter_key(&it), (int)bson_iter_key_len(&it), &it);
    bson_reinit(out);
    bson_concat(out, &tmp);
    bson_destroy(&tmp);
}

int doc_update_upsert_doc(const struct doc_update *u, const struct doc_matcher *query,
                          int64_t now_ms, bson_t *out, struct doc_err *e)
{
    struct seed s = {.n = 0};
    bson_t upd = BSON_INITIALIZER, base = BSON_INITIALIZER;
    struct doc_update *su = NULL;
    bson_value_t id;
    int rc = -1;

    if (u->replacement) {
        /* The replacement replaces a document holding the query's _id, so
         * that an _id of its own must be the same, as in mongod. */
        if (query && doc_match_eq_value(query, "_id", &id))
            bson_append_value(&base, "_id", 3, &id);
        rc = apply_replacement(u, &base, out, e) < 0 ? -1 : 0;
        bson_destroy(&base);
        return rc;
    }
    /* The equalities become a $set on an empty document: the same path
     * rules build their sub-documents, and two equalities on one path (or
     * on a path and its prefix) are refused as MongoDB refuses them. */
    bson_init(&s.set);
    if (query && doc_match_each_eq(query, seed_eq, &s) < 0) {
        doc_errf(e, DOC_InternalError, "cannot read the query's equalities");
        goto done;
    }
    if (s.n) {
        bson_t seeded = BSON_INITIALIZER;

        bson_append_document(&upd, "$set", 4, &s.set);
        if (doc_update_compile(&upd, &su, e) < 0) {
            if (e->code == DOC_ConflictingUpdateOperators) {
                char why[sizeof(e->msg)];

                memcpy(why, e->msg, sizeof(why));
                doc_errf(e, DOC_NotSingleValueField,
                         "cannot infer query fields to set, the query's equalities overlap: %.400s",
                         why);
            }
            bson_destroy(&seeded);
            goto done;
        }
        if (doc_update_apply(su, &base, true, now_ms, &seeded, e) < 0) {
            bson_destroy(&seeded);
            goto done;
        }
        /* bson_t may not be copied by assignment (it can point into
         * itself): steal the seeded one into base. */
        bson_destroy(&base);
        bson_steal(&base, &seeded);
    }
    if (doc_update_apply(u, &base, true, now_ms, out, e) < 0)
        goto done;
    id_first(out);
    rc = 0;
done:
    doc_update_free(su);
    bson_destroy(&s.set);
    bson_destroy(&upd);
    bson_destroy(&base);
    return rc;
}
