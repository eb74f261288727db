/* Query filters (doc_match.h): a tree compiled once, matched without
 * allocating.
 *
 * The tree is AND/OR/NOR/NOT over leaves; a leaf is one operator on one
 * path ($ne, $nin and $exists: false are NOT over $eq, $in and $exists;
 * $all is an AND). Every value a leaf holds points into the matcher's own
 * copy of the filter, so paths and operands are NUL-terminated BSON
 * strings and values that live as long as the matcher.
 *
 * A path is followed as MongoDB's classic matcher does: a field a document
 * lacks, or a scalar where the path goes on, is "missing" (which $eq: null
 * matches); an array in the middle is crossed by its document elements
 * (and by position for a numeric component), its other elements ignored;
 * an array at the end is offered whole and element by element, except to
 * $size and $elemMatch, which want the array. */
#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "doc_match.h"

enum kind { K_AND, K_OR, K_NOR, K_NOT, K_LEAF };

enum op {
    OP_EQ,
    OP_GT,
    OP_GTE,
    OP_LT,
    OP_LTE,
    OP_IN,
    OP_REGEX,
    OP_EXISTS,
    OP_TYPE,
    OP_SIZE,
    OP_ELEM_OBJ,               /* $elemMatch: {field: ...}: kid matches the element */
    OP_ELEM_VAL,               /* $elemMatch: {$op: ...}: kid holds on the element */
};

struct re {
    pcre2_code *code;
    const char *pattern, *flags;    /* for equality with a regex value */
};

struct node {
    uint8_t kind, op;
    bool expand;                /* offer an array at the end element by element */
    const char *path;           /* NULL: the value itself ($elemMatch's value form) */
    bson_value_t val;           /* EQ..LTE */
    struct re re;               /* REGEX */
    bson_value_t *in;           /* IN: the values that are not regexes, sorted */
    unsigned nin, nres;
    bool in_null;
    struct re *res;             /* IN: the regexes */
    uint32_t types;             /* TYPE: bits of type_bit() */
    int64_t size;               /* SIZE */
    struct node **kids;         /* AND/OR/NOR/NOT; ELEM_*: one */
    unsigned nkids, cap;
};

struct doc_matcher {
    bson_t *filter;             /* the copy every node points into */
    struct node *root;          /* an AND */
};

/* ---- regexes ---- */

/* One match data per thread, made on its first match: a yes or no needs
 * one pair of offsets whatever the pattern, and JIT or not. */
static pthread_key_t md_key;
static pthread_once_t md_once = PTHREAD_ONCE_INIT;

static void md_free(void *p)
{
    pcre2_match_data_free(p);
}

static void md_init(void)
{
    pthread_key_create(&md_key, md_free);
}

static pcre2_match_data *match_data(void)
{
    pcre2_match_data *md;

    pthread_once(&md_once, md_init);
    md = pthread_getspecific(md_key);
    if (!md) {
        md = pcre2_match_data_create(1, NULL);
        if (md && pthread_setspecific(md_key, md) != 0) {
            pcre2_match_data_free(md);
            md = NULL;
        }
    }
    return md;
}

static bool re_match(const struct re *re, const bson_value_t *v)
{
    const char *s;
    size_t n;
    pcre2_match_data *md;

    switch (v->value_type) {
    case BSON_TYPE_UTF8:
        s = v->value.v_utf8.str, n = v->value.v_utf8.len;
        break;
    case BSON_TYPE_SYMBOL:
        s = v->value.v_symbol.symbol, n = v->value.v_symbol.len;
        break;
    case BSON_TYPE_REGEX:
        return strcmp(v->value.v_regex.regex, re->pattern) == 0 &&
               strcmp(v->value.v_regex.options, re->flags) == 0;
    default:
        return false;
    }
    md = match_data();
    return md && pcre2_match(re->code, (PCRE2_SPTR)s, n, 0, 0, md, NULL) >= 0;
}

static int re_compile(struct re *re, const char *pattern, size_t plen, const char *flags,
                      struct doc_err *e)
{
    uint32_t opt = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
    int err;
    PCRE2_SIZE off;

    if (strlen(pattern) != plen)
        return doc_errf(e, DOC_BadValue, "Regular expression cannot contain an embedded null byte");
    for (const char *f = flags; *f; f++) {
        switch (*f) {
        case 'i':
            opt |= PCRE2_CASELESS;
            break;
        case 'm':
            opt |= PCRE2_MULTILINE;
            break;
        case 's':
            opt |= PCRE2_DOTALL;
            break;
        case 'x':
            opt |= PCRE2_EXTENDED;
            break;
        case 'u':               /* Unicode: always on */
            break;
        default:
            return doc_errf(e, DOC_BadValue, "invalid flag in regex options: %c", *f);
        }
    }
    re->code = pcre2_compile((PCRE2_SPTR)pattern, plen, opt, &err, &off, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];

        pcre2_get_error_message(err, msg, sizeof(msg));
        return doc_errf(e, DOC_BadValue, "Regular expression is invalid: %s", (char *)msg);
    }
    /* Without JIT (no memory for it, or a CPU it lacks) matching still works. */
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    re->pattern = pattern;
    re->flags = flags;
    return 0;
}

/* ---- the tree ---- */

static void node_free(struct node *n)
{
    if (!n)
        return;
    for (unsigned i = 0; i < n->nkids; i++)
        node_free(n->kids[i]);
    free(n->kids);
    pcre2_code_free(n->re.code);
    for (unsigned i = 0; i < n->nres; i++)
        pcre2_code_free(n->res[i].code);
    free(n->res);
    free(n->in);
    free(n);
}

static struct node *node_new(uint8_t kind, uint8_t op, const char *path)
{
    struct node *n = calloc(1, sizeof(*n));

    if (n) {
        n->kind = kind;
        n->op = op;
        n->path = path;
        n->expand = true;
    }
    return n;
}

static int oom(struct doc_err *e)
{
    return doc_errf(e, DOC_InternalError, "out of memory compiling a filter");
}

/* Adopt `kid` (freed on failure). */
static int add_kid(struct node *n, struct node *kid, struct doc_err *e)
{
    if (!kid)
        return oom(e);
    if (n->nkids == n->cap) {
        unsigned cap = n->cap ? 2 * n->cap : 4;
        struct node **k = realloc(n->kids, cap * sizeof(*k));

        if (!k) {
            node_free(kid);
            return oom(e);
        }
        n->kids = k;
        n->cap = cap;
    }
    n->kids[n->nkids++] = kid;
    return 0;
}

/* ---- compiling ---- */

static bool is_number(const bson_value_t *v)
{
    return v->value_type == BSON_TYPE_DOUBLE || v->value_type == BSON_TYPE_INT32 ||
           v->value_type == BSON_TYPE_INT64 || v->value_type == BSON_TYPE_DECIMAL128;
}

/* The first field's name of an embedded document: "" for an empty one. */
static const char *first_key(const bson_value_t *v)
{
    bson_iter_t it;

    if (bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len) &&
        bson_iter_next(&it))
        return bson_iter_key(&it);
    return "";
}

static bool is_op_doc(const bson_value_t *v)
{
    return v->value_type == BSON_TYPE_DOCUMENT && first_key(v)[0] == '$';
}

/* $type's bits: codes 1..19, and MinKey, MaxKey. */
static uint32_t type_bit(bson_type_t t)
{
    if (t == BSON_TYPE_MINKEY)
        return 1u << 30;
    if (t == BSON_TYPE_MAXKEY)
        return 1u << 31;
    if ((int)t >= 1 && (int)t <= 19)
        return 1u << t;
    return 0;
}

static const struct {
    const char *name;
    uint32_t bits;
} type_aliases[] = {
    {"double", 1u << BSON_TYPE_DOUBLE},
    {"string", 1u << BSON_TYPE_UTF8},
    {"object", 1u << BSON_TYPE_DOCUMENT},
    {"array", 1u << BSON_TYPE_ARRAY},
    {"binData", 1u << BSON_TYPE_BINARY},
    {"undefined", 1u << BSON_TYPE_UNDEFINED},
    {"objectId", 1u << BSON_TYPE_OID},
    {"bool", 1u << BSON_TYPE_BOOL},
    {"date", 1u << BSON_TYPE_DATE_TIME},
    {"null", 1u << BSON_TYPE_NULL},
    {"regex", 1u << BSON_TYPE_REGEX},
    {"dbPointer", 1u << BSON_TYPE_DBPOINTER},
    {"javascript", 1u << BSON_TYPE_CODE},
    {"symbol", 1u << BSON_TYPE_SYMBOL},
    {"javascriptWithScope", 1u << BSON_TYPE_CODEWSCOPE},
    {"int", 1u << BSON_TYPE_INT32},
    {"timestamp", 1u << BSON_TYPE_TIMESTAMP},
    {"long", 1u << BSON_TYPE_INT64},
    {"decimal", 1u << BSON_TYPE_DECIMAL128},
    {"minKey", 1u << 30},
    {"maxKey", 1u << 31},
    {"number", 1u << BSON_TYPE_DOUBLE | 1u << BSON_TYPE_INT32 | 1u << BSON_TYPE_INT64 |
                   1u << BSON_TYPE_DECIMAL128},
};

/* A number that is a whole int64: *x. */
static bool whole_number(const bson_value_t *v, int64_t *x)
{
    double d;

    switch (v->value_type) {
    case BSON_TYPE_INT32:
        *x = v->value.v_int32;
        return true;
    case BSON_TYPE_INT64:
        *x = v->value.v_int64;
        return true;
    case BSON_TYPE_DOUBLE:
        d = v->value.v_double;
        break;
    case BSON_TYPE_DECIMAL128: {
        char s[BSON_DECIMAL128_STRING];

        bson_decimal128_to_string(&v->value.v_decimal128, s);
        d = strtod(s, NULL);
        break;
    }
    default:
        return false;
    }
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != (double)(int64_t)d)
        return false;
    *x = (int64_t)d;
    return true;
}

static int type_one(const bson_value_t *v, uint32_t *bits, struct doc_err *e)
{
    int64_t x = 0;

    if (v->value_type == BSON_TYPE_UTF8) {
        for (size_t i = 0; i < sizeof(type_aliases) / sizeof(type_aliases[0]); i++)
            if (strcmp(type_aliases[i].name, v->value.v_utf8.str) == 0) {
                *bits |= type_aliases[i].bits;
                return 0;
            }
        return doc_errf(e, DOC_BadValue, "Unknown type name alias: %s", v->value.v_utf8.str);
    }
    if (!is_number(v))
        return doc_errf(e, DOC_TypeMismatch, "type must be represented as a number or a string");
    if (!whole_number(v, &x) || !(x == -1 || x == 127 || (x >= 1 && x <= 19))) {
        if (v->value_type == BSON_TYPE_INT32 || v->value_type == BSON_TYPE_INT64)
            return doc_errf(e, DOC_BadValue, "Invalid numerical type code: %lld",
                            (long long)(v->value_type == BSON_TYPE_INT32 ? v->value.v_int32
                                                                         : v->value.v_int64));
        return doc_errf(e, DOC_BadValue, "Invalid numerical type code: %g",
                        v->value_type == BSON_TYPE_DOUBLE ? v->value.v_double : (double)x);
    }
    *bits |= x == -1 ? 1u << 30 : x == 127 ? 1u << 31 : 1u << x;
    return 0;
}

static int cmp_sort(const void *a, const void *b)
{
    return doc_val_cmp(a, b);
}

static int parse_filter(const uint8_t *data, uint32_t len, int depth, struct node *and,
                        struct doc_err *e);
static int parse_ops(const char *path, const bson_value_t *ops, int depth, struct node *and,
                     struct doc_err *e);

static int too_deep(int depth, struct doc_err *e)
{
    if (depth <= DOC_MATCH_DEPTH_MAX)
        return 0;
    return doc_errf(e, DOC_BadValue, "exceeded maximum query tree depth of %d",
                    DOC_MATCH_DEPTH_MAX);
}

static int leaf_value(const char *path, uint8_t op, const bson_value_t *v, struct node *and,
                      struct doc_err *e)
{
    struct node *n = node_new(K_LEAF, op, path);

    if (n)
        n->val = *v;
    return add_kid(and, n, e);
}

static int leaf_regex(const char *path, const char *pattern, size_t plen, const char *flags,
                      struct node *and, struct doc_err *e)
{
    struct node *n = node_new(K_LEAF, OP_REGEX, path);

    if (!n)
        return oom(e);
    if (re_compile(&n->re, pattern, plen, flags, e) < 0) {
        node_free(n);
        return -1;
    }
    return add_kid(and, n, e);
}

/* `kid` under a NOT, into `and`. */
static int add_not(struct node *and, struct node *kid, struct doc_err *e)
{
    struct node *n = node_new(K_NOT, 0, NULL);

    if (!n) {
        node_free(kid);
        return oom(e);
    }
    if (add_kid(n, kid, e) < 0) {
        free(n);
        return -1;
    }
    return add_kid(and, n, e);
}

/* $in / $nin: values sorted for a binary search, regexes apart. */
static int parse_in(const char *path, const char *opname, const bson_value_t *arr,
                    struct node **out, struct doc_err *e)
{
    bson_iter_t it;
    struct node *n;
    unsigned cap = 0;

    if (arr->value_type != BSON_TYPE_ARRAY)
        return doc_errf(e, DOC_BadValue, "%s needs an array", opname);
    n = node_new(K_LEAF, OP_IN, path);
    if (!n)
        return oom(e);
    if (!bson_iter_init_from_data(&it, arr->value.v_doc.data, arr->value.v_doc.data_len))
        goto bad;
    while (bson_iter_next(&it))
        cap++;
    n->in = calloc(cap ? cap : 1, sizeof(*n->in));
    n->res = calloc(cap ? cap : 1, sizeof(*n->res));
    if (!n->in || !n->res) {
        node_free(n);
        return oom(e);
    }
    bson_iter_init_from_data(&it, arr->value.v_doc.data, arr->value.v_doc.data_len);
    while (bson_iter_next(&it)) {
        const bson_value_t *v = bson_iter_value(&it);

        if (is_op_doc(v)) {
            node_free(n);
            return doc_errf(e, DOC_BadValue, "cannot nest $ under %s", opname);
        }
        if (v->value_type == BSON_TYPE_REGEX) {
            struct re *re = &n->res[n->nres];

            if (re_compile(re, v->value.v_regex.regex, strlen(v->value.v_regex.regex),
                           v->value.v_regex.options, e) < 0) {
                node_free(n);
                return -1;
            }
            n->nres++;
            continue;
        }
        if (v->value_type == BSON_TYPE_NULL || v->value_type == BSON_TYPE_UNDEFINED)
            n->in_null = true;
        n->in[n->nin++] = *v;
    }
    qsort(n->in, n->nin, sizeof(*n->in), cmp_sort);
    *out = n;
    return 0;
bad:
    node_free(n);
    return doc_errf(e, DOC_BadValue, "%s needs an array", opname);
}

/* $elemMatch's operand: operators on the element ({$gt: 1}), or a filter
 * on it as a document ({a: 1}, {$or: [...]}). */
static int parse_elem(const char *path, const bson_value_t *v, int depth, struct node *and,
                      struct doc_err *e)
{
    const char *k;
    struct node *n, *kid;
    bool value_form;

    if (v->value_type != BSON_TYPE_DOCUMENT)
        return doc_errf(e, DOC_BadValue, "$elemMatch needs an Object");
    if (too_deep(depth + 1, e))
        return -1;
    k = first_key(v);
    value_form = k[0] == '$' && strcmp(k, "$and") != 0 && strcmp(k, "$or") != 0 &&
                 strcmp(k, "$nor") != 0 && strcmp(k, "$comment") != 0 &&
                 strcmp(k, "$expr") != 0 && strcmp(k, "$where") != 0;
    n = node_new(K_LEAF, value_form ? OP_ELEM_VAL : OP_ELEM_OBJ, path);
    if (!n)
        return oom(e);
    n->expand = false;
    kid = node_new(K_AND, 0, NULL);
    if (add_kid(n, kid, e) < 0) {
        free(n);
        return -1;
    }
    if ((value_form ? parse_ops(NULL, v, depth + 1, kid, e)
                    : parse_filter(v->value.v_doc.data, v->value.v_doc.data_len, depth + 1,
                                   kid, e)) < 0) {
        node_free(n);
        return -1;
    }
    return add_kid(and, n, e);
}

static int parse_all(const char *path, const bson_value_t *arr, int depth, struct node *and,
                     struct doc_err *e)
{
    bson_iter_t it;
    int elem = 0, plain = 0;

    if (arr->value_type != BSON_TYPE_ARRAY)
        return doc_errf(e, DOC_BadValue, "$all needs an array");
    bson_iter_init_from_data(&it, arr->value.v_doc.data, arr->value.v_doc.data_len);
    while (bson_iter_next(&it)) {
        const bson_value_t *v = bson_iter_value(&it);

        if (is_op_doc(v)) {
            if (strcmp(first_key(v), "$elemMatch") != 0)
                return doc_errf(e, DOC_BadValue, "no $ expressions in $all");
            elem++;
        } else {
            plain++;
        }
    }
    if (elem && plain)
        return doc_errf(e, DOC_BadValue, "$all/$elemMatch has to be consistent");
    if (!elem && !plain) {
        /* $all: [] matches nothing: an $in of no values. */
        struct node *n = node_new(K_LEAF, OP_IN, path);

        return add_kid(and, n, e);
    }
    bson_iter_init_from_data(&it, arr->value.v_doc.data, arr->value.v_doc.data_len);
    while (bson_iter_next(&it)) {
        const bson_value_t *v = bson_iter_value(&it);
        int rc;

        if (elem) {
            bson_iter_t in;

            bson_value_t em;

            /* {$elemMatch: {...}} and nothing else beside it */
            bson_iter_init_from_data(&in, v->value.v_doc.data, v->value.v_doc.data_len);
            bson_iter_next(&in);
            em = *bson_iter_value(&in);
            if (bson_iter_next(&in))
                return doc_errf(e, DOC_BadValue, "$all/$elemMatch has to be consistent");
            rc = parse_elem(path, &em, depth, and, e);
        } else if (v->value_type == BSON_TYPE_REGEX) {
            rc = leaf_regex(path, v->value.v_regex.regex, strlen(v->value.v_regex.regex),
                            v->value.v_regex.options, and, e);
        } else {
            rc = leaf_value(path, OP_EQ, v, and, e);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static bool truthy(const bson_value_t *v)
{
    switch (v->value_type) {
    case BSON_TYPE_BOOL:
        return v->value.v_bool;
    case BSON_TYPE_INT32:
        return v->value.v_int32 != 0;
    case BSON_TYPE_INT64:
        return v->value.v_int64 != 0;
    case BSON_TYPE_DOUBLE:
        return v->value.v_double != 0;
    case BSON_TYPE_NULL:
    case BSON_TYPE_UNDEFINED:
        return false;
    default:
        return true;
    }
}

/* {path: {$op: v, ...}}: the leaves, into `and`. */
static int parse_ops(const char *path, const bson_value_t *ops, int depth, struct node *and,
                     struct doc_err *e)
{
    bson_iter_t it;
    bson_value_t rv;            /* bson_iter_value's is the iterator's, reused by the next field */
    const bson_value_t *regex = NULL;
    const char *options = NULL;
    int rc = 0;

    bson_iter_init_from_data(&it, ops->value.v_doc.data, ops->value.v_doc.data_len);
    while (rc == 0 && bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        const bson_value_t *v = bson_iter_value(&it);

        if (strcmp(k, "$eq") == 0) {
            rc = leaf_value(path, OP_EQ, v, and, e);
        } else if (strcmp(k, "$ne") == 0) {
            struct node *n;

            if (v->value_type == BSON_TYPE_REGEX)
                return doc_errf(e, DOC_BadValue, "Can't have regex as arg to $ne.");
            n = node_new(K_LEAF, OP_EQ, path);

            if (n)
                n->val = *v;
            rc = n ? add_not(and, n, e) : oom(e);
        } else if (strcmp(k, "$gt") == 0) {
            rc = leaf_value(path, OP_GT, v, and, e);
        } else if (strcmp(k, "$gte") == 0) {
            rc = leaf_value(path, OP_GTE, v, and, e);
        } else if (strcmp(k, "$lt") == 0) {
            rc = leaf_value(path, OP_LT, v, and, e);
        } else if (strcmp(k, "$lte") == 0) {
            rc = leaf_value(path, OP_LTE, v, and, e);
        } else if (strcmp(k, "$in") == 0 || strcmp(k, "$nin") == 0) {
            struct node *n = NULL;

            rc = parse_in(path, k, v, &n, e);
            if (rc == 0)
                rc = k[1] == 'i' ? add_kid(and, n, e) : add_not(and, n, e);
        } else if (strcmp(k, "$exists") == 0) {
            struct node *n = node_new(K_LEAF, OP_EXISTS, path);

            rc = truthy(v) ? add_kid(and, n, e) : n ? add_not(and, n, e) : oom(e);
        } else if (strcmp(k, "$type") == 0) {
            struct node *n;
            uint32_t bits = 0;

            if (v->value_type == BSON_TYPE_ARRAY) {
                bson_iter_t t;

                bson_iter_init_from_data(&t, v->value.v_doc.data, v->value.v_doc.data_len);
                while (rc == 0 && bson_iter_next(&t))
                    rc = type_one(bson_iter_value(&t), &bits, e);
            } else {
                rc = type_one(v, &bits, e);
            }
            if (rc == 0) {
                n = node_new(K_LEAF, OP_TYPE, path);
                if (n)
                    n->types = bits;
                rc = add_kid(and, n, e);
            }
        } else if (strcmp(k, "$regex") == 0) {
            if (v->value_type != BSON_TYPE_UTF8 && v->value_type != BSON_TYPE_REGEX)
                return doc_errf(e, DOC_BadValue, "$regex has to be a string");
            rv = *v;
            regex = &rv;
        } else if (strcmp(k, "$options") == 0) {
            if (v->value_type != BSON_TYPE_UTF8)
                return doc_errf(e, DOC_BadValue, "$options has to be a string");
            options = v->value.v_utf8.str;
        } else if (strcmp(k, "$size") == 0) {
            int64_t x;
            struct node *n;

            if (!is_number(v))
                return doc_errf(e, DOC_BadValue, "$size needs a number");
            if (!whole_number(v, &x))
                return doc_errf(e, DOC_BadValue, "$size must be a whole number");
            if (x < 0)
                return doc_errf(e, DOC_BadValue, "$size may not be negative");
            n = node_new(K_LEAF, OP_SIZE, path);
            if (n) {
                n->size = x;
                n->expand = false;
            }
            rc = add_kid(and, n, e);
        } else if (strcmp(k, "$all") == 0) {
            rc = parse_all(path, v, depth, and, e);
        } else if (strcmp(k, "$elemMatch") == 0) {
            rc = parse_elem(path, v, depth, and, e);
        } else if (strcmp(k, "$not") == 0) {
            struct node *n;

            if (too_deep(depth + 1, e))
                return -1;
            if (v->value_type != BSON_TYPE_REGEX && v->value_type != BSON_TYPE_DOCUMENT)
                return doc_errf(e, DOC_BadValue, "$not needs a regex or a document");
            if (v->value_type == BSON_TYPE_DOCUMENT && !first_key(v)[0])
                return doc_errf(e, DOC_BadValue, "$not cannot be empty");
            n = node_new(K_AND, 0, NULL);
            if (!n)
                return oom(e);
            rc = v->value_type == BSON_TYPE_REGEX
                     ? leaf_regex(path, v->value.v_regex.regex, strlen(v->value.v_regex.regex),
                                  v->value.v_regex.options, n, e)
                     : parse_ops(path, v, depth + 1, n, e);
            if (rc < 0) {
                node_free(n);
                return rc;
            }
            rc = add_not(and, n, e);
        } else {
            return doc_errf(e, DOC_BadValue, "unknown operator: %s", k);
        }
    }
    if (rc < 0)
        return rc;
    if (options && !regex)
        return doc_errf(e, DOC_BadValue, "$options needs a $regex");
    if (regex) {
        if (regex->value_type == BSON_TYPE_REGEX) {
            if (options && options[0] && regex->value.v_regex.options[0])
                return doc_errf(e, DOC_BadValue, "options set in both $regex and $options");
            return leaf_regex(path, regex->value.v_regex.regex,
                              strlen(regex->value.v_regex.regex),
                              options && options[0] ? options : regex->value.v_regex.options,
                              and, e);
        }
        return leaf_regex(path, regex->value.v_utf8.str, regex->value.v_utf8.len,
                          options ? options : "", and, e);
    }
    return 0;
}

static int parse_logical(const char *k, const bson_value_t *v, int depth, struct node *and,
                         struct doc_err *e)
{
    uint8_t kind = k[1] == 'a' ? K_AND : k[1] == 'o' ? K_OR : K_NOR;
    struct node *n;
    bson_iter_t it;
    bool any = false;

    if (too_deep(depth + 1, e))
        return -1;
    if (v->value_type != BSON_TYPE_ARRAY)
        return doc_errf(e, DOC_BadValue, "$and/$or/$nor must be a nonempty array");
    n = node_new(kind, 0, NULL);
    if (!n)
        return oom(e);
    bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len);
    while (bson_iter_next(&it)) {
        struct node *kid;
        uint32_t len;
        const uint8_t *data;

        any = true;
        if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
            node_free(n);
            return doc_errf(e, DOC_BadValue, "$or/$and/$nor entries need to be full objects");
        }
        bson_iter_document(&it, &len, &data);
        kid = node_new(K_AND, 0, NULL);
        if (add_kid(n, kid, e) < 0 || parse_filter(data, len, depth + 1, kid, e) < 0) {
            node_free(n);
            return -1;
        }
    }
    if (!any) {
        node_free(n);
        return doc_errf(e, DOC_BadValue, "$and/$or/$nor must be a nonempty array");
    }
    return add_kid(and, n, e);
}

static int parse_filter(const uint8_t *data, uint32_t len, int depth, struct node *and,
                        struct doc_err *e)
{
    bson_iter_t it;

    if (too_deep(depth, e))
        return -1;
    if (!bson_iter_init_from_data(&it, data, len))
        return doc_errf(e, DOC_InvalidBSON, "filter is not valid BSON");
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        const bson_value_t *v = bson_iter_value(&it);
        int rc;

        if (k[0] == '$') {
            if (strcmp(k, "$and") == 0 || strcmp(k, "$or") == 0 || strcmp(k, "$nor") == 0)
                rc = parse_logical(k, v, depth, and, e);
            else if (strcmp(k, "$comment") == 0)
                rc = 0;
            else
                rc = doc_errf(e, DOC_BadValue,
                              "unknown top level operator: %s. If you have a field name that "
                              "starts with a '$' symbol, consider using $getField or $setField.",
                              k);
        } else if (is_op_doc(v)) {
            rc = parse_ops(k, v, depth, and, e);
        } else if (v->value_type == BSON_TYPE_REGEX) {
            rc = leaf_regex(k, v->value.v_regex.regex, strlen(v->value.v_regex.regex),
                            v->value.v_regex.options, and, e);
        } else {
            rc = leaf_value(k, OP_EQ, v, and, e);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

int doc_match_compile(const bson_t *filter, struct doc_matcher **out, struct doc_err *e)
{
    struct doc_matcher *m;

    if (!bson_validate(filter, BSON_VALIDATE_NONE, NULL))
        return doc_errf(e, DOC_InvalidBSON, "filter is not valid BSON");
    m = calloc(1, sizeof(*m));
    if (!m)
        return oom(e);
    m->filter = bson_copy(filter);
    m->root = node_new(K_AND, 0, NULL);
    if (!m->filter || !m->root) {
        doc_match_free(m);
        return oom(e);
    }
    if (parse_filter(bson_get_data(m->filter), m->filter->len, 0, m->root, e) < 0) {
        doc_match_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void doc_match_free(struct doc_matcher *m)
{
    if (!m)
        return;
    node_free(m->root);
    if (m->filter)
        bson_destroy(m->filter);
    free(m);
}

/* ---- matching ---- */

static bool eval_doc(const struct node *n, const uint8_t *data, uint32_t len);
static bool eval_val(const struct node *n, const bson_value_t *v);

/* MongoDB's comparison of a value with an operand: only within a type
 * bracket, NaN equal to NaN and below nothing, null and missing equal. */
static bool cmp_pred(uint8_t op, const bson_value_t *v, const bson_value_t *rhs)
{
    int rv = doc_type_rank(v->value_type), rr = doc_type_rank(rhs->value_type);
    int c;

    if (rv != rr) {
        if (rhs->value_type == BSON_TYPE_MAXKEY)
            return op == OP_LT || op == OP_LTE;
        if (rhs->value_type == BSON_TYPE_MINKEY)
            return op == OP_GT || op == OP_GTE;
        return false;
    }
    if (rr == doc_type_rank(BSON_TYPE_DOUBLE)) {
        bool nv = (v->value_type == BSON_TYPE_DOUBLE && v->value.v_double != v->value.v_double);
        bool nr = (rhs->value_type == BSON_TYPE_DOUBLE &&
                   rhs->value.v_double != rhs->value.v_double);

        if (v->value_type == BSON_TYPE_DECIMAL128 || rhs->value_type == BSON_TYPE_DECIMAL128) {
            /* doc_val_cmp puts decimal NaN with the double ones */
            bson_value_t nan = {.value_type = BSON_TYPE_DOUBLE};

            nan.value.v_double = __builtin_nan("");
            nv = nv || doc_val_cmp(v, &nan) == 0;
            nr = nr || doc_val_cmp(rhs, &nan) == 0;
        }
        if (nv || nr)
            return nv && nr && op != OP_LT && op != OP_GT;
    }
    c = doc_val_cmp(v, rhs);
    switch (op) {
    case OP_EQ:
        return c == 0;
    case OP_GT:
        return c > 0;
    case OP_GTE:
        return c >= 0;
    case OP_LT:
        return c < 0;
    default:
        return c <= 0;
    }
}

static bool in_pred(const struct node *n, const bson_value_t *v)
{
    unsigned lo = 0, hi = n->nin;

    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        int c = doc_val_cmp(&n->in[mid], v);

        if (c == 0)
            return true;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (unsigned i = 0; i < n->nres; i++)
        if (re_match(&n->res[i], v))
            return true;
    return false;
}

/* The leaf on one value the path reached; NULL is missing. */
static bool pred(const struct node *n, const bson_value_t *v)
{
    if (!v) {
        switch (n->op) {
        case OP_EQ:
        case OP_GTE:
        case OP_LTE:
            return doc_type_rank(n->val.value_type) == doc_type_rank(BSON_TYPE_NULL);
        case OP_IN:
            return n->in_null;
        default:
            return false;
        }
    }
    switch (n->op) {
    case OP_EQ:
    case OP_GT:
    case OP_GTE:
    case OP_LT:
    case OP_LTE:
        return cmp_pred(n->op, v, &n->val);
    case OP_IN:
        return in_pred(n, v);
    case OP_REGEX:
        return re_match(&n->re, v);
    case OP_EXISTS:
        return true;
    case OP_TYPE:
        return (n->types & type_bit(v->value_type)) != 0;
    case OP_SIZE:
        if (v->value_type == BSON_TYPE_ARRAY) {
            bson_iter_t it;
            int64_t count = 0;

            bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len);
            while (count <= n->size && bson_iter_next(&it))
                count++;
            return count == n->size;
        }
        return false;
    case OP_ELEM_OBJ:
    case OP_ELEM_VAL:
        if (v->value_type == BSON_TYPE_ARRAY) {
            bson_iter_t it;

            bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len);
            while (bson_iter_next(&it)) {
                const bson_value_t *el = bson_iter_value(&it);

                if (n->op == OP_ELEM_VAL) {
                    if (eval_val(n->kids[0], el))
                        return true;
                } else if ((el->value_type == BSON_TYPE_DOCUMENT ||
                            el->value_type == BSON_TYPE_ARRAY) &&
                           eval_doc(n->kids[0], el->value.v_doc.data, el->value.v_doc.data_len)) {
                    return true;
                }
            }
        }
        return false;
    }
    return false;
}

/* The value at the end of the path: itself, then its elements. */
static bool at_end(const struct node *n, const bson_value_t *v)
{
    bson_iter_t it;

    if (pred(n, v))
        return true;
    if (v->value_type != BSON_TYPE_ARRAY || !n->expand)
        return false;
    bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len);
    while (bson_iter_next(&it))
        if (pred(n, bson_iter_value(&it)))
            return true;
    return false;
}

static bool walk_val(const struct node *n, const bson_value_t *v, const char *path);

/* bson_iter_find_w_len, without its strncmp per field (a fifth of a
 * simple match's time): names of another length are skipped unread. */
static bool find_field(bson_iter_t *it, const char *name, size_t n)
{
    while (bson_iter_next(it))
        if (bson_iter_key_len(it) == n && memcmp(bson_iter_key(it), name, n) == 0)
            return true;
    return false;
}

static bool walk_doc(const struct node *n, const uint8_t *data, uint32_t len, const char *path)
{
    const char *dot = strchr(path, '.');
    size_t k = dot ? (size_t)(dot - path) : strlen(path);
    bson_iter_t it;

    if (!bson_iter_init_from_data(&it, data, len) || !find_field(&it, path, k))
        return pred(n, NULL);
    if (!dot)
        return at_end(n, bson_iter_value(&it));
    return walk_val(n, bson_iter_value(&it), dot + 1);
}

static bool comp_index(const char *c, size_t n, uint32_t *idx)
{
    uint32_t x = 0;

    if (n == 0 || n > 9 || (n > 1 && c[0] == '0'))
        return false;
    for (size_t i = 0; i < n; i++) {
        if (c[i] < '0' || c[i] > '9')
            return false;
        x = x * 10 + (uint32_t)(c[i] - '0');
    }
    *idx = x;
    return true;
}

static bool walk_val(const struct node *n, const bson_value_t *v, const char *path)
{
    const char *dot;
    bson_iter_t it;
    uint32_t idx = 0, i = 0;
    bool positional;

    if (v->value_type == BSON_TYPE_DOCUMENT)
        return walk_doc(n, v->value.v_doc.data, v->value.v_doc.data_len, path);
    if (v->value_type != BSON_TYPE_ARRAY)
        return pred(n, NULL);
    dot = strchr(path, '.');
    positional = comp_index(path, dot ? (size_t)(dot - path) : strlen(path), &idx);
    bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len);
    for (; bson_iter_next(&it); i++) {
        const bson_value_t *el = bson_iter_value(&it);

        if (positional && i == idx &&
            (dot ? walk_val(n, el, dot + 1) : at_end(n, el)))
            return true;
        if (el->value_type == BSON_TYPE_DOCUMENT &&
            walk_doc(n, el->value.v_doc.data, el->value.v_doc.data_len, path))
            return true;
    }
    return false;
}

static bool eval_doc(const struct node *n, const uint8_t *data, uint32_t len)
{
    switch (n->kind) {
    case K_AND:
        for (unsigned i = 0; i < n->nkids; i++)
            if (!eval_doc(n->kids[i], data, len))
                return false;
        return true;
    case K_OR:
        for (unsigned i = 0; i < n->nkids; i++)
            if (eval_doc(n->kids[i], data, len))
                return true;
        return false;
    case K_NOR:
        for (unsigned i = 0; i < n->nkids; i++)
            if (eval_doc(n->kids[i], data, len))
                return false;
        return true;
    case K_NOT:
        return !eval_doc(n->kids[0], data, len);
    default:
        return walk_doc(n, data, len, n->path);
    }
}

/* $elemMatch's value form: the operators on the element itself, no
 * expansion of an element that is an array. */
static bool eval_val(const struct node *n, const bson_value_t *v)
{
    switch (n->kind) {
    case K_AND:
        for (unsigned i = 0; i < n->nkids; i++)
            if (!eval_val(n->kids[i], v))
                return false;
        return true;
    case K_NOT:
        return !eval_val(n->kids[0], v);
    default:
        return pred(n, v);
    }
}

bool doc_match(const struct doc_matcher *m, const bson_t *doc)
{
    return eval_doc(m->root, bson_get_data(doc), doc->len);
}

/* ---- bounds ----
 *
 * A set of intervals on key strings, kept sorted and disjoint. An empty
 * lower end is the start of everything, an empty upper end its end. */

struct ivs {
    struct doc_interval *iv;
    unsigned n, cap;
    bool oom;
};

static void ivs_free(struct ivs *s)
{
    for (unsigned i = 0; i < s->n; i++) {
        doc_buf_free(&s->iv[i].lo);
        doc_buf_free(&s->iv[i].hi);
    }
    free(s->iv);
    memset(s, 0, sizeof(*s));
}

static struct doc_interval *ivs_push(struct ivs *s)
{
    struct doc_interval *iv;

    if (s->n == s->cap) {
        unsigned cap = s->cap ? 2 * s->cap : 4;

        iv = realloc(s->iv, cap * sizeof(*iv));
        if (!iv) {
            s->oom = true;
            return NULL;
        }
        s->iv = iv;
        s->cap = cap;
    }
    iv = &s->iv[s->n++];
    memset(iv, 0, sizeof(*iv));
    return iv;
}

static void ivs_check(struct ivs *s, struct doc_interval *iv)
{
    if (iv->lo.oom || iv->hi.oom)
        s->oom = true;
}

static void iv_point(struct ivs *s, const bson_value_t *v)
{
    struct doc_interval *iv = ivs_push(s);

    if (!iv)
        return;
    doc_key_add(&iv->lo, v, false);
    doc_key_add(&iv->hi, v, false);
    iv->lo_incl = iv->hi_incl = true;
    ivs_check(s, iv);
}

static void iv_null(struct ivs *s)
{
    bson_value_t null = {.value_type = BSON_TYPE_NULL};

    iv_point(s, &null);
}

/* Every value of type t's bracket. */
static void iv_bracket(struct ivs *s, bson_type_t t)
{
    struct doc_interval *iv = ivs_push(s);
    uint8_t b = doc_key_rank_byte(t), b1 = (uint8_t)(b + 1);

    if (!iv)
        return;
    doc_buf_add(&iv->lo, &b, 1);
    doc_buf_add(&iv->hi, &b1, 1);
    iv->lo_incl = true;
    ivs_check(s, iv);
}

/* memcmp order of two ends; an empty one is -inf as a lower end, +inf as
 * an upper one (`upper`). */
static int end_cmp(const struct doc_buf *a, const struct doc_buf *b, bool upper)
{
    int c;

    if (!a->len || !b->len) {
        if (!a->len && !b->len)
            return 0;
        return (!a->len) == upper ? 1 : -1;
    }
    c = memcmp(a->p, b->p, a->len < b->len ? a->len : b->len);
    if (c)
        return c < 0 ? -1 : 1;
    return (a->len > b->len) - (a->len < b->len);
}

static int lo_cmp(const struct doc_interval *a, const struct doc_interval *b)
{
    int c = end_cmp(&a->lo, &b->lo, false);

    return c ? c : (int)b->lo_incl - (int)a->lo_incl;
}

static int hi_cmp(const struct doc_interval *a, const struct doc_interval *b)
{
    int c = end_cmp(&a->hi, &b->hi, true);

    return c ? c : (int)a->hi_incl - (int)b->hi_incl;
}

static int iv_sort(const void *a, const void *b)
{
    return lo_cmp(a, b);
}

/* The interval holds nothing: lo above hi, or equal and not both in. */
static bool iv_empty(const struct doc_interval *iv)
{
    int c;

    if (!iv->lo.len || !iv->hi.len)
        return false;
    c = end_cmp(&iv->lo, &iv->hi, false);
    return c > 0 || (c == 0 && !(iv->lo_incl && iv->hi_incl));
}

static void buf_move(struct doc_buf *to, struct doc_buf *from)
{
    doc_buf_free(to);
    *to = *from;
    memset(from, 0, sizeof(*from));
}

/* Sort, drop the empty ones, merge those that overlap or touch. */
static void ivs_normalize(struct ivs *s)
{
    unsigned out = 0;

    if (!s->n)
        return;             /* and iv may be NULL, which qsort may not get */
    qsort(s->iv, s->n, sizeof(*s->iv), iv_sort);
    for (unsigned i = 0; i < s->n; i++) {
        struct doc_interval *iv = &s->iv[i], *cur = out ? &s->iv[out - 1] : NULL;
        int c;

        if (iv_empty(iv)) {
            doc_buf_free(&iv->lo);
            doc_buf_free(&iv->hi);
            continue;
        }
        if (cur) {
            c = !cur->hi.len ? -1 : !iv->lo.len ? -1 : end_cmp(&iv->lo, &cur->hi, false);
            if (c < 0 || (c == 0 && (iv->lo_incl || cur->hi_incl))) {
                if (hi_cmp(iv, cur) > 0) {
                    buf_move(&cur->hi, &iv->hi);
                    cur->hi_incl = iv->hi_incl;
                }
                doc_buf_free(&iv->lo);
                doc_buf_free(&iv->hi);
                continue;
            }
        }
        if (&s->iv[out] != iv)
            s->iv[out] = *iv;
        out++;
    }
    s->n = out;
}

static void buf_copy(struct ivs *s, struct doc_buf *to, const struct doc_buf *from)
{
    doc_buf_add(to, from->p, from->len);
    if (to->oom)
        s->oom = true;
}

/* a ∩ b (both normalized) into out. */
static void ivs_intersect(const struct ivs *a, const struct ivs *b, struct ivs *out)
{
    unsigned i = 0, j = 0;

    while (i < a->n && j < b->n) {
        const struct doc_interval *x = &a->iv[i], *y = &b->iv[j];
        const struct doc_interval *lo = lo_cmp(x, y) >= 0 ? x : y;
        const struct doc_interval *hi = hi_cmp(x, y) <= 0 ? x : y;
        struct doc_interval t = {.lo_incl = lo->lo_incl, .hi_incl = hi->hi_incl};

        t.lo = lo->lo;
        t.hi = hi->hi;
        if (!iv_empty(&t)) {
            struct doc_interval *iv = ivs_push(out);

            if (!iv)
                return;
            buf_copy(out, &iv->lo, &lo->lo);
            buf_copy(out, &iv->hi, &hi->hi);
            iv->lo_incl = lo->lo_incl;
            iv->hi_incl = hi->hi_incl;
        }
        if (hi == x)
            i++;
        else
            j++;
    }
}

static bool is_nan(const bson_value_t *v)
{
    bson_value_t nan = {.value_type = BSON_TYPE_DOUBLE};

    nan.value.v_double = __builtin_nan("");
    return doc_type_rank(v->value_type) == doc_type_rank(BSON_TYPE_DOUBLE) &&
           doc_val_cmp(v, &nan) == 0;
}

/* An equality with v: v itself, and for an array its first element (or
 * undefined for an empty one), which is what a multikey index holds of
 * a document whose field is exactly that array. */
static void eq_points(struct ivs *s, const bson_value_t *v)
{
    iv_point(s, v);
    if (v->value_type == BSON_TYPE_ARRAY) {
        bson_iter_t it;

        if (bson_iter_init_from_data(&it, v->value.v_doc.data, v->value.v_doc.data_len) &&
            bson_iter_next(&it))
            iv_point(s, bson_iter_value(&it));
        else
            iv_null(s);
    } else if (v->value_type == BSON_TYPE_NULL || v->value_type == BSON_TYPE_UNDEFINED) {
        iv_null(s);
    }
}

/* The literal prefix of a regex anchored with ^ ("^abc.*" -> "abc"), 0 if
 * none is sure: a flag that changes what a character or ^ means, an
 * alternation, or an escape ends it; a quantifier takes back the
 * character before it. */
static size_t regex_prefix(const struct re *re, const char **start)
{
    const char *p = re->pattern;
    size_t n = 0, last = 0;

    if (p[0] != '^' || strpbrk(re->flags, "imx") || strchr(p, '|'))
        return 0;
    p++;
    *start = p;
    for (;; n++) {
        unsigned char c = (unsigned char)p[n];

        if (!c || strchr(".[]()\\^$", c))
            break;
        if (strchr("*+?{", c)) {
            n = last;
            break;
        }
        if ((c & 0xc0) != 0x80)
            last = n;       /* where the last character began */
    }
    return n;
}

static void iv_regex(struct ivs *s, const struct re *re)
{
    const char *p;
    size_t n = regex_prefix(re, &p);
    bson_value_t rv = {.value_type = BSON_TYPE_REGEX};
    struct doc_interval *iv;
    uint8_t b = doc_key_rank_byte(BSON_TYPE_UTF8);

    rv.value.v_regex.regex = (char *)re->pattern;
    rv.value.v_regex.options = (char *)re->flags;
    iv_point(s, &rv);
    if (!n) {
        iv_bracket(s, BSON_TYPE_UTF8);
        return;
    }
    /* The strings that start with p[0..n): their keys start with the rank
     * byte and those bytes (no NUL to escape in a C string), and sort
     * below the same bytes with the last one raised (never 0xff in UTF-8). */
    iv = ivs_push(s);
    if (!iv)
        return;
    doc_buf_add(&iv->lo, &b, 1);
    doc_buf_add(&iv->lo, p, n);
    doc_buf_add(&iv->hi, iv->lo.p, iv->lo.len);
    if (!iv->hi.oom)
        iv->hi.p[iv->hi.len - 1]++;
    iv->lo_incl = true;
    ivs_check(s, iv);
}

/* The intervals one leaf implies for its path: 1 (and *exact), 0 if it
 * says nothing an index can use. */
static int leaf_bounds(const struct node *n, struct ivs *s, bool *exact)
{
    const bson_value_t *v = &n->val;
    bson_type_t t = v->value_type;
    struct doc_interval *iv;
    uint8_t b;

    *exact = false;
    switch (n->op) {
    case OP_EQ:
        eq_points(s, v);
        *exact = t != BSON_TYPE_ARRAY && t != BSON_TYPE_NULL && t != BSON_TYPE_UNDEFINED;
        return 1;
    case OP_GT:
    case OP_GTE:
    case OP_LT:
    case OP_LTE: {
        bool up = n->op == OP_GT || n->op == OP_GTE, incl = n->op == OP_GTE || n->op == OP_LTE;

        if (t == BSON_TYPE_ARRAY || (t == BSON_TYPE_MINKEY && up) ||
            (t == BSON_TYPE_MAXKEY && !up))
            return 0;
        if (t == BSON_TYPE_MINKEY || t == BSON_TYPE_MAXKEY || is_nan(v) ||
            doc_type_rank(t) == doc_type_rank(BSON_TYPE_NULL)) {
            if (incl)
                eq_points(s, v);
            return 1;
        }
        iv = ivs_push(s);
        if (!iv)
            return 1;
        b = doc_key_rank_byte(t);
        if (up) {
            uint8_t b1 = (uint8_t)(b + 1);

            doc_key_add(&iv->lo, v, false);
            doc_buf_add(&iv->hi, &b1, 1);
            iv->lo_incl = incl;
        } else {
            if (doc_type_rank(t) == doc_type_rank(BSON_TYPE_DOUBLE)) {
                /* from just above NaN, which no comparison matches */
                bson_value_t nan = {.value_type = BSON_TYPE_DOUBLE};

                nan.value.v_double = __builtin_nan("");
                doc_key_add(&iv->lo, &nan, false);
            } else {
                doc_buf_add(&iv->lo, &b, 1);
                iv->lo_incl = true;
            }
            doc_key_add(&iv->hi, v, false);
            iv->hi_incl = incl;
        }
        ivs_check(s, iv);
        *exact = true;
        return 1;
    }
    case OP_IN:
        for (unsigned i = 0; i < n->nin; i++)
            eq_points(s, &n->in[i]);
        for (unsigned i = 0; i < n->nres; i++)
            iv_regex(s, &n->res[i]);
        *exact = !n->nres && !n->in_null;
        for (unsigned i = 0; i < n->nin; i++)
            if (n->in[i].value_type == BSON_TYPE_ARRAY)
                *exact = false;
        return 1;
    case OP_REGEX:
        iv_regex(s, &n->re);
        return 1;
    case OP_TYPE:
        if (n->types & (1u << BSON_TYPE_ARRAY))
            return 0;
        for (int i = 1; i < 32; i++) {
            bson_type_t ty = i == 30 ? BSON_TYPE_MINKEY : i == 31 ? BSON_TYPE_MAXKEY
                                                                  : (bson_type_t)i;

            if (n->types & (1u << i))
                iv_bracket(s, ty);
        }
        return 1;
    case OP_ELEM_VAL: {
        /* One element satisfies every operator: the intersection. */
        const struct node *and = n->kids[0];
        bool any = false, ex;

        for (unsigned i = 0; i < and->nkids; i++) {
            struct ivs one = {0}, both = {0};

            /* a nested $elemMatch is about the element's elements */
            if (and->kids[i]->kind != K_LEAF || and->kids[i]->op == OP_ELEM_VAL ||
                leaf_bounds(and->kids[i], &one, &ex) != 1) {
                ivs_free(&one);
                continue;
            }
            ivs_normalize(&one);
            if (!any) {
                ivs_free(s);
                *s = one;
                any = true;
                continue;
            }
            ivs_intersect(s, &one, &both);
            both.oom |= one.oom || s->oom;
            ivs_free(&one);
            ivs_free(s);
            *s = both;
        }
        return any;
    }
    default:
        return 0;
    }
}

/* A leaf on `path` anywhere below n. */
static bool mentions(const struct node *n, const char *path)
{
    if (n->kind == K_LEAF)
        return n->path && strcmp(n->path, path) == 0;
    for (unsigned i = 0; i < n->nkids; i++)
        if (mentions(n->kids[i], path))
            return true;
    return false;
}

struct pick {
    const char *path;
    struct ivs best;
    bool have, best_points, best_exact;
    unsigned on_path;           /* predicates on the path */
    unsigned used;              /* of them, in `best` */
    bool intersect;             /* no arrays: one value meets them all */
    bool oom;
};

static bool all_points(const struct ivs *s)
{
    for (unsigned i = 0; i < s->n; i++) {
        const struct doc_interval *iv = &s->iv[i];

        if (!iv->lo_incl || !iv->hi_incl || iv->lo.len != iv->hi.len ||
            memcmp(iv->lo.p, iv->hi.p, iv->lo.len) != 0)
            return false;
    }
    return true;
}

/* The top-level conjunction: each leaf's intervals on its own. A document
 * with an array may satisfy two of them by two different elements, so
 * they are never intersected; the narrowest one is kept (points first,
 * then the fewest intervals). */
static void pick_bounds(const struct node *n, struct pick *p)
{
    if (n->kind == K_AND) {
        for (unsigned i = 0; i < n->nkids; i++)
            pick_bounds(n->kids[i], p);
        return;
    }
    if (n->kind != K_LEAF) {
        if (mentions(n, p->path))
            p->on_path++;
        return;
    }
    if (strcmp(n->path, p->path) != 0)
        return;
    p->on_path++;

    struct ivs s = {0};
    bool exact, points;

    if (leaf_bounds(n, &s, &exact) != 1) {
        ivs_free(&s);
        return;
    }
    ivs_normalize(&s);
    if (s.oom)
        p->oom = true;
    if (p->intersect && p->have) {
        struct ivs both = {0};

        ivs_intersect(&p->best, &s, &both);
        if (both.oom)
            p->oom = true;
        ivs_free(&p->best);
        ivs_free(&s);
        p->best = both;
        p->best_points = all_points(&both);
        p->best_exact = p->best_exact && exact;
        p->used++;
        return;
    }
    points = all_points(&s);
    if (!p->have || (points && !p->best_points) ||
        (points == p->best_points && s.n < p->best.n)) {
        ivs_free(&p->best);
        p->best = s;
        p->have = true;
        p->best_points = points;
        p->best_exact = exact;
        p->used = 1;
    } else {
        ivs_free(&s);
    }
}

static int bounds(const struct doc_matcher *m, const char *path, bool intersect,
                  struct doc_bounds *b)
{
    struct pick p = {.path = path, .intersect = intersect};

    memset(b, 0, sizeof(*b));
    pick_bounds(m->root, &p);
    if (p.oom || p.best.oom) {
        ivs_free(&p.best);
        return -1;
    }
    if (!p.have)
        return 0;
    b->iv = p.best.iv;
    b->n = p.best.n;
    b->point = p.best_points;
    b->exact = p.best_exact && p.on_path == p.used;
    return 1;
}

int doc_match_bounds(const struct doc_matcher *m, const char *path, struct doc_bounds *b)
{
    return bounds(m, path, false, b);
}

int doc_match_bounds_scalar(const struct doc_matcher *m, const char *path, struct doc_bounds *b)
{
    return bounds(m, path, true, b);
}

void doc_bounds_free(struct doc_bounds *b)
{
    struct ivs s = {.iv = b->iv, .n = b->n};

    ivs_free(&s);
    memset(b, 0, sizeof(*b));
}

/* ---- equalities, for upserts ---- */

static bool plain_eq(const struct node *n)
{
    bson_type_t t = n->val.value_type;

    return n->kind == K_LEAF && n->op == OP_EQ && t != BSON_TYPE_REGEX &&
           t != BSON_TYPE_ARRAY && !is_op_doc(&n->val);
}

static int each_eq(const struct node *n, int (*fn)(void *, const char *, const bson_value_t *),
                   void *arg)
{
    int rc;

    if (n->kind == K_AND) {
        for (unsigned i = 0; i < n->nkids; i++)
            if ((rc = each_eq(n->kids[i], fn, arg)))
                return rc;
        return 0;
    }
    return plain_eq(n) ? fn(arg, n->path, &n->val) : 0;
}

struct find_eq {
    const char *path;
    bson_value_t *v;
};

static int find_eq(void *arg, const char *path, const bson_value_t *v)
{
    struct find_eq *f = arg;

    if (strcmp(path, f->path) != 0)
        return 0;
    *f->v = *v;
    return 1;
}

bool doc_match_eq_value(const struct doc_matcher *m, const char *path, bson_value_t *v)
{
    struct find_eq f = {path, v};

    return each_eq(m->root, find_eq, &f) == 1;
}

int doc_match_each_eq(const struct doc_matcher *m,
                      int (*fn)(void *arg, const char *path, const bson_value_t *v), void *arg)
{
    return each_eq(m->root, fn, arg);
}
