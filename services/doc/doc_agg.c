/* The aggregation pipeline (doc_agg.h) and its expressions (doc_expr.h),
 * with MongoDB's semantics from the manual's pages of each stage, group
 * accumulator and expression operator.
 *
 * A run pushes each document from the source through the stages; a
 * blocking stage ($group, $sort, $count) collects and emits when the
 * stages before it are done. A stage that needs no more input ($limit
 * reached) says so and the source stops early. Every stage's buffers live
 * in the run and are reused from one document to the next. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doc_agg.h"
#include "doc_expr.h"

/* ---- scratch arena ---- */

struct doc_arena_blk {
    struct doc_arena_blk *next;
    size_t cap, used;
    max_align_t data[];
};

void *doc_arena_alloc(struct doc_arena *a, size_t n)
{
    struct doc_arena_blk *b = a->head;
    size_t need = (n + 15) & ~(size_t)15;

    if (!b || b->cap - b->used < need) {
        size_t cap = need > 4096 ? need : 4096;

        if (cap < a->total)
            cap = a->total;
        b = malloc(sizeof(*b) + cap);
        if (!b)
            return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
        a->total += cap;
    }
    b->used += need;
    return (uint8_t *)b->data + b->used - need;
}

void doc_arena_reset(struct doc_arena *a)
{
    size_t total = a->total;

    if (!a->head)
        return;
    if (a->head->next) {
        /* Several blocks: one of their size from now on. */
        doc_arena_free(a);
        a->head = malloc(sizeof(*a->head) + total);
        if (!a->head)
            return;
        a->head->next = NULL;
        a->head->cap = total;
        a->total = total;
    }
    a->head->used = 0;
}

void doc_arena_free(struct doc_arena *a)
{
    while (a->head) {
        struct doc_arena_blk *n = a->head->next;

        free(a->head);
        a->head = n;
    }
    a->total = 0;
}

/* ---- expressions ---- */

enum ex_kind { EX_CONST, EX_PATH, EX_OBJ, EX_ARR, EX_OP };

enum ex_op { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_CONCAT, OP_LOWER, OP_UPPER, OP_COND, OP_IFNULL, OP_SIZE };

static const struct {
    const char *name;
    enum ex_op op;
    int min, max;               /* arguments; max -1: any number */
} ops[] = {
    {"$add", OP_ADD, 0, -1},       {"$subtract", OP_SUB, 2, 2}, {"$multiply", OP_MUL, 0, -1},
    {"$divide", OP_DIV, 2, 2},     {"$concat", OP_CONCAT, 0, -1}, {"$toLower", OP_LOWER, 1, 1},
    {"$toUpper", OP_UPPER, 1, 1},  {"$cond", OP_COND, 3, 3},    {"$ifNull", OP_IFNULL, 2, -1},
    {"$size", OP_SIZE, 1, 1},
};

struct doc_expr {
    enum ex_kind kind;
    enum ex_op op;
    const char *opname;
    bson_t *cst;                /* EX_CONST: {"v": value}, which `v` points into */
    bson_value_t v;
    char *path;                 /* EX_PATH: "a.b"; "" for $$ROOT */
    char **names;               /* EX_OBJ */
    struct doc_expr **args;
    unsigned n;
};

void doc_expr_free(struct doc_expr *x)
{
    if (!x)
        return;
    for (unsigned i = 0; i < x->n; i++) {
        doc_expr_free(x->args[i]);
        if (x->names)
            free(x->names[i]);
    }
    free(x->args);
    free(x->names);
    free(x->path);
    if (x->cst)
        bson_destroy(x->cst);
    free(x);
}

static int ex_new(enum ex_kind k, struct doc_expr **out, struct doc_err *e)
{
    *out = calloc(1, sizeof(**out));
    if (!*out)
        return doc_errf(e, DOC_InternalError, "out of memory");
    (*out)->kind = k;
    return 0;
}

static int ex_const(const bson_value_t *v, struct doc_expr **out, struct doc_err *e)
{
    bson_iter_t it;

    if (ex_new(EX_CONST, out, e) < 0)
        return -1;
    (*out)->cst = bson_new();
    if (!(*out)->cst || !bson_append_value((*out)->cst, "v", 1, v) ||
        !bson_iter_init_find(&it, (*out)->cst, "v")) {
        doc_expr_free(*out);
        *out = NULL;
        return doc_errf(e, DOC_InternalError, "out of memory");
    }
    (*out)->v = *bson_iter_value(&it);
    return 0;
}

static int field_path_check(const char *p, const char *what, struct doc_err *e)
{
    const char *s = p;

    for (;;) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);

        if (len == 0)
            return doc_errf(e, DOC_BadValue, "FieldPath field names may not be empty strings (%s)",
                            what);
        if (s[0] == '$')
            return doc_errf(e, DOC_BadValue, "FieldPath field names may not start with '$' (%s)",
                            what);
        if (!dot)
            return 0;
        s = dot + 1;
    }
}

static int ex_path(const char *s, struct doc_expr **out, struct doc_err *e)
{
    const char *p = s + 1;

    if (*p == '\0')
        return doc_errf(e, DOC_BadValue, "'$' by itself is not a valid FieldPath");
    if (*p == '$') {
        const char *var = p + 1;
        size_t len = strcspn(var, ".");

        if (!((len == 4 && strncmp(var, "ROOT", 4) == 0) ||
              (len == 7 && strncmp(var, "CURRENT", 7) == 0)))
            return doc_errf(e, DOC_BadValue, "Use of undefined variable: %.*s", (int)len, var);
        p = var[len] ? var + len + 1 : "";
        if (var[len] && field_path_check(p, s, e) < 0)
            return -1;
    } else if (field_path_check(p, s, e) < 0) {
        return -1;
    }
    if (ex_new(EX_PATH, out, e) < 0)
        return -1;
    (*out)->path = strdup(p);
    if (!(*out)->path) {
        doc_expr_free(*out);
        *out = NULL;
        return doc_errf(e, DOC_InternalError, "out of memory");
    }
    return 0;
}

static int ex_grow(struct doc_expr *x, struct doc_err *e)
{
    struct doc_expr **args = realloc(x->args, (x->n + 1) * sizeof(*args));

    if (!args)
        return doc_errf(e, DOC_InternalError, "out of memory");
    x->args = args;
    x->args[x->n] = NULL;
    if (x->kind == EX_OBJ) {
        char **names = realloc(x->names, (x->n + 1) * sizeof(*names));

        if (!names)
            return doc_errf(e, DOC_InternalError, "out of memory");
        x->names = names;
        x->names[x->n] = NULL;
    }
    return 0;
}

/* The arguments of an operator: an array of expressions, or one. */
static int ex_args(struct doc_expr *x, const bson_iter_t *arg, struct doc_err *e)
{
    bson_iter_t a;

    if (BSON_ITER_HOLDS_ARRAY(arg) && bson_iter_recurse(arg, &a)) {
        while (bson_iter_next(&a)) {
            if (ex_grow(x, e) < 0 || doc_expr_compile(bson_iter_value(&a), &x->args[x->n++], e) < 0)
                return -1;
        }
        return 0;
    }
    if (ex_grow(x, e) < 0)
        return -1;
    return doc_expr_compile(bson_iter_value((bson_iter_t *)arg), &x->args[x->n++], e);
}

static int ex_cond_obj(struct doc_expr *x, const bson_iter_t *arg, struct doc_err *e)
{
    static const char *const names[3] = {"if", "then", "else"};
    bson_iter_t a;

    x->args = calloc(3, sizeof(*x->args));
    if (!x->args)
        return doc_errf(e, DOC_InternalError, "out of memory");
    x->n = 3;
    bson_iter_recurse(arg, &a);
    while (bson_iter_next(&a)) {
        int i;

        for (i = 0; i < 3 && strcmp(bson_iter_key(&a), names[i]) != 0; i++)
            ;
        if (i == 3)
            return doc_errf(e, DOC_BadValue, "Unrecognized parameter to $cond: %s",
                            bson_iter_key(&a));
        if (x->args[i])
            doc_expr_free(x->args[i]);
        if (doc_expr_compile(bson_iter_value(&a), &x->args[i], e) < 0)
            return -1;
    }
    for (int i = 0; i < 3; i++)
        if (!x->args[i])
            return doc_errf(e, DOC_BadValue, "Missing '%s' parameter to $cond", names[i]);
    return 0;
}

static int ex_doc(const bson_value_t *v, struct doc_expr **out, struct doc_err *e)
{
    bson_t d;
    bson_iter_t it;
    const char *first;
    struct doc_expr *x;
    unsigned nf = 0;

    if (!bson_init_static(&d, v->value.v_doc.data, v->value.v_doc.data_len) ||
        !bson_iter_init(&it, &d))
        return doc_errf(e, DOC_InvalidBSON, "expression is not valid BSON");
    if (!bson_iter_next(&it))
        return ex_const(v, out, e);
    first = bson_iter_key(&it);
    nf = bson_count_keys(&d);
    if (first[0] == '$') {
        if (nf != 1)
            return doc_errf(e, DOC_BadValue,
                            "an expression specification must contain exactly one field, the name "
                            "of the expression. Found %u fields", nf);
        if (strcmp(first, "$literal") == 0)
            return ex_const(bson_iter_value(&it), out, e);
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
            if (strcmp(first, ops[i].name) != 0)
                continue;
            if (ex_new(EX_OP, &x, e) < 0)
                return -1;
            *out = x;
            x->op = ops[i].op;
            x->opname = ops[i].name;
            if (x->op == OP_COND && BSON_ITER_HOLDS_DOCUMENT(&it))
                return ex_cond_obj(x, &it, e);
            if (ex_args(x, &it, e) < 0)
                return -1;
            if ((int)x->n < ops[i].min || (ops[i].max >= 0 && (int)x->n > ops[i].max)) {
                if (ops[i].min == ops[i].max)
                    return doc_errf(e, DOC_BadValue,
                                    "Expression %s takes exactly %d arguments. %u were passed in.",
                                    first, ops[i].min, x->n);
                return doc_errf(e, DOC_BadValue,
                                "Expression %s needs at least %d arguments. %u were passed in.",
                                first, ops[i].min, x->n);
            }
            return 0;
        }
        return doc_errf(e, DOC_BadValue, "Unrecognized expression '%s'", first);
    }
    /* An object of expressions: {a: "$x", b: {$add: [...]}}. */
    if (ex_new(EX_OBJ, &x, e) < 0)
        return -1;
    *out = x;
    do {
        const char *k = bson_iter_key(&it);

        if (k[0] == '$')
            return doc_errf(e, DOC_BadValue,
                            "FieldPath field names may not start with '$' (field %s)", k);
        if (strchr(k, '.'))
            return doc_errf(e, DOC_BadValue, "FieldPath field names may not contain '.' (field %s)",
                            k);
        if (ex_grow(x, e) < 0)
            return -1;
        x->names[x->n] = strdup(k);
        if (!x->names[x->n])
            return doc_errf(e, DOC_InternalError, "out of memory");
        if (doc_expr_compile(bson_iter_value(&it), &x->args[x->n++], e) < 0)
            return -1;
    } while (bson_iter_next(&it));
    return 0;
}

static int doc_expr_compile_1(const bson_value_t *v, struct doc_expr **out, struct doc_err *e)
{
    if (v->value_type == BSON_TYPE_UTF8 && v->value.v_utf8.len > 0 && v->value.v_utf8.str[0] == '$')
        return ex_path(v->value.v_utf8.str, out, e);
    if (v->value_type == BSON_TYPE_DOCUMENT)
        return ex_doc(v, out, e);
    if (v->value_type == BSON_TYPE_ARRAY) {
        bson_t d;
        bson_iter_t it;
        struct doc_expr *x;

        if (!bson_init_static(&d, v->value.v_doc.data, v->value.v_doc.data_len) ||
            !bson_iter_init(&it, &d))
            return doc_errf(e, DOC_InvalidBSON, "expression is not valid BSON");
        if (ex_new(EX_ARR, &x, e) < 0)
            return -1;
        *out = x;
        while (bson_iter_next(&it))
            if (ex_grow(x, e) < 0 || doc_expr_compile(bson_iter_value(&it), &x->args[x->n++], e) < 0)
                return -1;
        return 0;
    }
    return ex_const(v, out, e);
}

/* Nesting of expressions a compile goes through: a hostile spec nested
 * deeper must not exhaust the stack (compile and evaluation recurse). */
#define EXPR_DEPTH_MAX 100

int doc_expr_compile(const bson_value_t *v, struct doc_expr **out, struct doc_err *e)
{
    static __thread unsigned depth;
    int rc;

    *out = NULL;
    if (depth >= EXPR_DEPTH_MAX)
        return doc_errf(e, DOC_BadValue, "expression nested deeper than %d levels",
                        EXPR_DEPTH_MAX);
    depth++;
    rc = doc_expr_compile_1(v, out, e);
    depth--;
    if (rc < 0) {
        doc_expr_free(*out);
        *out = NULL;
    }
    return rc;
}

bool doc_value_true(const bson_value_t *v)
{
    switch (v->value_type) {
    case BSON_TYPE_EOD:
    case BSON_TYPE_NULL:
    case BSON_TYPE_UNDEFINED:
        return false;
    case BSON_TYPE_BOOL:
        return v->value.v_bool;
    case BSON_TYPE_INT32:
        return v->value.v_int32 != 0;
    case BSON_TYPE_INT64:
        return v->value.v_int64 != 0;
    case BSON_TYPE_DOUBLE:
        return v->value.v_double != 0;
    default:
        return true;
    }
}

static bool is_nullish(const bson_value_t *v)
{
    return v->value_type == BSON_TYPE_EOD || v->value_type == BSON_TYPE_NULL ||
           v->value_type == BSON_TYPE_UNDEFINED;
}

static bool is_num(const bson_value_t *v)
{
    return v->value_type == BSON_TYPE_INT32 || v->value_type == BSON_TYPE_INT64 ||
           v->value_type == BSON_TYPE_DOUBLE || v->value_type == BSON_TYPE_DECIMAL128;
}

/* Decimal128 goes by its double approximation, as doc_bson.h orders it. */
static double num_d(const bson_value_t *v)
{
    char s[BSON_DECIMAL128_STRING];

    switch (v->value_type) {
    case BSON_TYPE_INT32:
        return v->value.v_int32;
    case BSON_TYPE_INT64:
        return (double)v->value.v_int64;
    case BSON_TYPE_DOUBLE:
        return v->value.v_double;
    case BSON_TYPE_DECIMAL128:
        bson_decimal128_to_string(&v->value.v_decimal128, s);
        return strtod(s, NULL);
    default:
        return 0;
    }
}

/* Nearest integer, halves away from zero (llround without libm). */
static int64_t round_i64(double d)
{
    return d >= 0 ? (int64_t)(d + 0.5) : -(int64_t)(-d + 0.5);
}

/* A numeric result: int32 while everything was int32 and it fits, int64
 * while everything was an integer and it fits, else double (MongoDB's
 * widening for $add, $multiply and $sum). */
struct num {
    int t;                      /* 0 int32, 1 int64, 2 double */
    int64_t i;
    double d;
    double c;                   /* what a sum of doubles lost to rounding */
};

static void num_start(struct num *n, int64_t i)
{
    n->t = 0;
    n->i = i;
    n->d = (double)i;
    n->c = 0;
}

/* Compensated (Neumaier) summation: MongoDB sums doubles in double-double
 * precision, so ten 0.1s make 1.0, not 0.9999999999999999. */
static void num_add_d(struct num *n, double x)
{
    double t = n->d + x;

    if (fabs(n->d) >= fabs(x))
        n->c += (n->d - t) + x;
    else
        n->c += (x - t) + n->d;
    n->d = t;
}

static double num_double(const struct num *n)
{
    return n->d + n->c;
}

static void num_op(struct num *n, const bson_value_t *v, bool mul)
{
    double d = num_d(v);
    int t = v->value_type == BSON_TYPE_INT32 ? 0 : v->value_type == BSON_TYPE_INT64 ? 1 : 2;

    if (mul) {
        n->d = num_double(n) * d;
        n->c = 0;
    } else {
        num_add_d(n, d);
    }
    if (t > n->t)
        n->t = t;
    if (n->t < 2) {
        int64_t x = v->value_type == BSON_TYPE_INT32 ? v->value.v_int32 : v->value.v_int64;

        if (mul ? __builtin_mul_overflow(n->i, x, &n->i) : __builtin_add_overflow(n->i, x, &n->i))
            n->t = 2;
    }
}

static void num_value(const struct num *n, bson_value_t *out)
{
    if (n->t == 0 && n->i >= INT32_MIN && n->i <= INT32_MAX) {
        out->value_type = BSON_TYPE_INT32;
        out->value.v_int32 = (int32_t)n->i;
    } else if (n->t <= 1) {
        out->value_type = BSON_TYPE_INT64;
        out->value.v_int64 = n->i;
    } else {
        out->value_type = BSON_TYPE_DOUBLE;
        out->value.v_double = num_double(n);
    }
}

static void set_null(bson_value_t *out)
{
    memset(out, 0, sizeof(*out));
    out->value_type = BSON_TYPE_NULL;
}

/* A document or array built in `b`, copied into the arena. */
static int bson_into(struct doc_arena *a, bson_t *b, bson_type_t t, bson_value_t *out,
                     struct doc_err *e)
{
    uint8_t *p = doc_arena_alloc(a, b->len);

    if (!p) {
        bson_destroy(b);
        return doc_errf(e, DOC_InternalError, "out of memory");
    }
    memcpy(p, bson_get_data(b), b->len);
    out->value_type = t;
    out->value.v_doc.data = p;
    out->value.v_doc.data_len = b->len;
    bson_destroy(b);
    return 0;
}

static int str_into(struct doc_arena *a, const char *s, size_t len, bson_value_t *out,
                    struct doc_err *e)
{
    char *p = doc_arena_alloc(a, len + 1);

    if (!p)
        return doc_errf(e, DOC_InternalError, "out of memory");
    memcpy(p, s, len);
    p[len] = '\0';
    out->value_type = BSON_TYPE_UTF8;
    out->value.v_utf8.str = p;
    out->value.v_utf8.len = (uint32_t)len;
    return 0;
}

static int eval_path(const bson_iter_t *it, const char *rest, struct doc_arena *a,
                     bson_value_t *out, unsigned depth, struct doc_err *e);

/* "$a.b" on a document: the value at a, then b inside it. */
static int eval_path_doc(const uint8_t *data, uint32_t len, const char *path, struct doc_arena *a,
                         bson_value_t *out, unsigned depth, struct doc_err *e)
{
    bson_t d;
    bson_iter_t it;
    const char *dot = strchr(path, '.');
    size_t clen = dot ? (size_t)(dot - path) : strlen(path);

    out->value_type = BSON_TYPE_EOD;
    if (!bson_init_static(&d, data, len) || !bson_iter_init_find_w_len(&it, &d, path, (int)clen))
        return 0;
    return eval_path(&it, dot ? dot + 1 : NULL, a, out, depth, e);
}

/* Through an array a field path reaches into every element that is a
 * document and gives the array of what it found there (the manual's
 * "Field Paths"; nested arrays are skipped, as MongoDB's
 * ExpressionFieldPath does). */
static int eval_path(const bson_iter_t *it, const char *rest, struct doc_arena *a,
                     bson_value_t *out, unsigned depth, struct doc_err *e)
{
    bson_iter_t in;
    bson_t arr;
    uint32_t k = 0;

    if (!rest) {
        *out = *bson_iter_value((bson_iter_t *)it);
        return 0;
    }
    if (depth > 200)
        return doc_errf(e, DOC_BadValue, "field path nested too deep");
    if (BSON_ITER_HOLDS_DOCUMENT(it)) {
        uint32_t len;
        const uint8_t *data;

        bson_iter_document(it, &len, &data);
        return eval_path_doc(data, len, rest, a, out, depth + 1, e);
    }
    out->value_type = BSON_TYPE_EOD;
    if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &in))
        return 0;
    bson_init(&arr);
    while (bson_iter_next(&in)) {
        bson_value_t v = {.value_type = BSON_TYPE_EOD};
        char buf[16];
        const char *ks;
        size_t kl;

        /* Documents only: arrays in the array are not looked into. */
        if (BSON_ITER_HOLDS_DOCUMENT(&in) && eval_path(&in, rest, a, &v, depth + 1, e) < 0) {
            bson_destroy(&arr);
            return -1;
        }
        if (v.value_type == BSON_TYPE_EOD)
            continue;
        kl = bson_uint32_to_string(k++, &ks, buf, sizeof(buf));
        bson_append_value(&arr, ks, (int)kl, &v);
    }
    return bson_into(a, &arr, BSON_TYPE_ARRAY, out, e);
}

static int eval_op(const struct doc_expr *x, const bson_t *root, struct doc_arena *a,
                   bson_value_t *out, struct doc_err *e);

int doc_expr_eval(const struct doc_expr *x, const bson_t *root, struct doc_arena *a,
                  bson_value_t *out, struct doc_err *e)
{
    bson_t b;

    switch (x->kind) {
    case EX_CONST:
        *out = x->v;
        return 0;
    case EX_PATH:
        if (x->path[0] == '\0') {
            out->value_type = BSON_TYPE_DOCUMENT;
            out->value.v_doc.data = (uint8_t *)bson_get_data(root);
            out->value.v_doc.data_len = root->len;
            return 0;
        }
        return eval_path_doc(bson_get_data(root), root->len, x->path, a, out, 0, e);
    case EX_OBJ:
    case EX_ARR:
        bson_init(&b);
        for (unsigned i = 0; i < x->n; i++) {
            bson_value_t v;
            char buf[16];
            const char *ks;

            if (doc_expr_eval(x->args[i], root, a, &v, e) < 0) {
                bson_destroy(&b);
                return -1;
            }
            if (x->kind == EX_OBJ) {
                /* A missing value leaves its field out of the object. */
                if (v.value_type != BSON_TYPE_EOD)
                    bson_append_value(&b, x->names[i], -1, &v);
                continue;
            }
            if (v.value_type == BSON_TYPE_EOD)
                set_null(&v);
            bson_uint32_to_string(i, &ks, buf, sizeof(buf));
            bson_append_value(&b, ks, -1, &v);
        }
        return bson_into(a, &b, x->kind == EX_OBJ ? BSON_TYPE_DOCUMENT : BSON_TYPE_ARRAY, out, e);
    case EX_OP:
        return eval_op(x, root, a, out, e);
    }
    return doc_errf(e, DOC_InternalError, "bad expression");
}

static int arith(const struct doc_expr *x, const bson_t *root, struct doc_arena *a,
                 bson_value_t *out, struct doc_err *e)
{
    bool mul = x->op == OP_MUL, date = false;
    struct num n;

    num_start(&n, mul ? 1 : 0);
    for (unsigned i = 0; i < x->n; i++) {
        bson_value_t v;

        if (doc_expr_eval(x->args[i], root, a, &v, e) < 0)
            return -1;
        if (is_nullish(&v)) {
            set_null(out);
            return 0;
        }
        if (v.value_type == BSON_TYPE_DATE_TIME && !mul) {
            if (date)
                return doc_errf(e, DOC_BadValue, "only one date allowed in an $add expression");
            date = true;
            v.value_type = BSON_TYPE_INT64;
            v.value.v_int64 = v.value.v_datetime;
        } else if (!is_num(&v)) {
            return doc_errf(e, DOC_TypeMismatch, "%s only supports numeric%s types, not %s",
                            x->opname, mul ? "" : " or date", doc_type_name(v.value_type));
        }
        num_op(&n, &v, mul);
    }
    if (date) {
        out->value_type = BSON_TYPE_DATE_TIME;
        out->value.v_datetime = n.t < 2 ? n.i : round_i64(num_double(&n));
        return 0;
    }
    num_value(&n, out);
    return 0;
}

static int eval2(const struct doc_expr *x, const bson_t *root, struct doc_arena *a,
                 bson_value_t *l, bson_value_t *r, struct doc_err *e)
{
    if (doc_expr_eval(x->args[0], root, a, l, e) < 0 || doc_expr_eval(x->args[1], root, a, r, e) < 0)
        return -1;
    return 0;
}

static int subtract(const struct doc_expr *x, const bson_t *root, struct doc_arena *a,
                    bson_value_t *out, struct doc_err *e)
{
    bson_value_t l, r;
    struct num n;

    if (eval2(x, root, a, &l, &r, e) < 0)
        return -1;
    if (is_nullish(&l) || is_nullish(&r)) {
        set_null(out);
        return 0;
    }
    if (l.value_type == BSON_TYPE_DATE_TIME && r.value_type == BSON_TYPE_DATE_TIME) {
        out->value_type = BSON_TYPE_INT64;
        out->value.v_int64 = l.value.v_datetime - r.value.v_datetime;
        return 0;
    }
    if (l.value_type == BSON_TYPE_DATE_TIME && is_num(&r)) {
        out->value_type = BSON_TYPE_DATE_TIME;
        out->value.v_datetime = l.value.v_datetime - round_i64(num_d(&r));
        return 0;
    }
    if (!is_num(&l) || !is_num(&r))
        return doc_errf(e, DOC_TypeMismatch, "can't $subtract %s from %s",
                        doc_type_name(r.value_type), doc_type_name(l.value_type));
    num_start(&n, 0);
    num_op(&n, &l, false);
    if (r.value_type == BSON_TYPE_INT32 || r.value_type == BSON_TYPE_INT64) {
        int64_t y = r.value_type == BSON_TYPE_INT32 ? r.value.v_int32 : r.value.v_int64;

        if (r.value_type == BSON_TYPE_INT64 && n.t < 1)
            n.t = 1;
        if (n.t < 2 && __builtin_sub_overflow(n.i, y, &n.i))
            n.t = 2;
    } else {
        n.t = 2;
    }
    num_add_d(&n, -num_d(&r));
    num_value(&n, out);
    return 0;
}

static int to_string(const bson_value_t *v, char *tmp, size_t cap, const char **s, size_t *len)
{
    switch (v->value_type) {
    case BSON_TYPE_EOD:
    case BSON_TYPE_NULL:
    case BSON_TYPE_UNDEFINED:
        *s = "";
        *len = 0;
        return 0;
    case BSON_TYPE_UTF8:
        *s = v->value.v_utf8.str;
        *len = v->value.v_utf8.len;
        return 0;
    case BSON_TYPE_INT32:
    case BSON_TYPE_INT64:
        *len = (size_t)snprintf(tmp, cap, "%lld",
                                v->value_type == BSON_TYPE_INT32 ? (long long)v->value.v_int32
                                                                 : (long long)v->value.v_int64);
        *s = tmp;
        return 0;
    case BSON_TYPE_DOUBLE:
        /* The shortest of these that reads back as the same double. */
        *len = (size_t)snprintf(tmp, cap, "%.15g", v->value.v_double);
        if (strtod(tmp, NULL) != v->value.v_double)
            *len = (size_t)snprintf(tmp, cap, "%.17g", v->value.v_double);
        *s = tmp;
        return 0;
    default:
        return -1;
    }
}

static int eval_op(const struct doc_expr *x, const bson_t *root, struct doc_arena *a,
                   bson_value_t *out, struct doc_err *e)
{
    bson_value_t l, r;

    switch (x->op) {
    case OP_ADD:
    case OP_MUL:
        return arith(x, root, a, out, e);
    case OP_SUB:
        return subtract(x, root, a, out, e);
    case OP_DIV:
        if (eval2(x, root, a, &l, &r, e) < 0)
            return -1;
        if (is_nullish(&l) || is_nullish(&r)) {
            set_null(out);
            return 0;
        }
        if (!is_num(&l) || !is_num(&r))
            return doc_errf(e, DOC_TypeMismatch, "$divide only supports numeric types, not %s and %s",
                            doc_type_name(l.value_type), doc_type_name(r.value_type));
        if (num_d(&r) == 0)
            return doc_errf(e, DOC_BadValue, "can't $divide by zero");
        out->value_type = BSON_TYPE_DOUBLE;
        out->value.v_double = num_d(&l) / num_d(&r);
        return 0;
    case OP_CONCAT: {
        size_t total = 0;
        char *p;

        /* Two passes: the first checks and sizes, the second copies. */
        for (unsigned i = 0; i < x->n; i++) {
            if (doc_expr_eval(x->args[i], root, a, &l, e) < 0)
                return -1;
            if (is_nullish(&l)) {
                set_null(out);
                return 0;
            }
            if (l.value_type != BSON_TYPE_UTF8)
                return doc_errf(e, DOC_TypeMismatch, "$concat only supports strings, not %s",
                                doc_type_name(l.value_type));
            total += l.value.v_utf8.len;
        }
        p = doc_arena_alloc(a, total + 1);
        if (!p)
            return doc_errf(e, DOC_InternalError, "out of memory");
        total = 0;
        for (unsigned i = 0; i < x->n; i++) {
            if (doc_expr_eval(x->args[i], root, a, &l, e) < 0)
                return -1;
            memcpy(p + total, l.value.v_utf8.str, l.value.v_utf8.len);
            total += l.value.v_utf8.len;
        }
        p[total] = '\0';
        out->value_type = BSON_TYPE_UTF8;
        out->value.v_utf8.str = p;
        out->value.v_utf8.len = (uint32_t)total;
        return 0;
    }
    case OP_LOWER:
    case OP_UPPER: {
        char tmp[32];
        const char *s;
        size_t len;

        if (doc_expr_eval(x->args[0], root, a, &l, e) < 0)
            return -1;
        if (to_string(&l, tmp, sizeof(tmp), &s, &len) < 0)
            return doc_errf(e, DOC_TypeMismatch, "can't convert from BSON type %s to String",
                            doc_type_name(l.value_type));
        if (str_into(a, s, len, out, e) < 0)
            return -1;
        /* ASCII only, as MongoDB's manual says of both. */
        for (size_t i = 0; i < len; i++) {
            char c = out->value.v_utf8.str[i];

            if (x->op == OP_LOWER && c >= 'A' && c <= 'Z')
                out->value.v_utf8.str[i] = (char)(c + 32);
            else if (x->op == OP_UPPER && c >= 'a' && c <= 'z')
                out->value.v_utf8.str[i] = (char)(c - 32);
        }
        return 0;
    }
    case OP_COND:
        if (doc_expr_eval(x->args[0], root, a, &l, e) < 0)
            return -1;
        return doc_expr_eval(x->args[doc_value_true(&l) ? 1 : 2], root, a, out, e);
    case OP_IFNULL:
        for (unsigned i = 0; i < x->n; i++) {
            if (doc_expr_eval(x->args[i], root, a, out, e) < 0)
                return -1;
            if (!is_nullish(out))
                return 0;
        }
        return 0;
    case OP_SIZE:
        if (doc_expr_eval(x->args[0], root, a, &l, e) < 0)
            return -1;
        if (l.value_type != BSON_TYPE_ARRAY)
            return doc_errf(e, DOC_BadValue,
                            "The argument to $size must be an array. Type of argument is %s",
                            doc_type_name(l.value_type));
        {
            bson_t d;
            uint32_t n = 0;

            if (bson_init_static(&d, l.value.v_doc.data, l.value.v_doc.data_len))
                n = bson_count_keys(&d);
            out->value_type = BSON_TYPE_INT32;
            out->value.v_int32 = (int32_t)n;
        }
        return 0;
    }
    return doc_errf(e, DOC_InternalError, "bad operator");
}

/* ---- stages ---- */

enum st_kind { ST_MATCH, ST_GROUP, ST_SORT, ST_LIMIT, ST_SKIP, ST_PROJECT, ST_UNWIND, ST_COUNT };

enum acc_op { ACC_SUM, ACC_AVG, ACC_MIN, ACC_MAX, ACC_PUSH, ACC_FIRST, ACC_LAST, ACC_COUNT };

static const struct {
    const char *name;
    enum acc_op op;
} accs[] = {
    {"$sum", ACC_SUM},   {"$avg", ACC_AVG},     {"$min", ACC_MIN},   {"$max", ACC_MAX},
    {"$push", ACC_PUSH}, {"$first", ACC_FIRST}, {"$last", ACC_LAST}, {"$count", ACC_COUNT},
};

struct acc {
    char *name;
    enum acc_op op;
    struct doc_expr *ex;
};

struct stage {
    enum st_kind kind;
    struct doc_matcher *m;
    struct doc_sort *sort;
    int64_t topk;               /* $sort: a $limit (after a $skip) follows: keep
                                 * only that many, as MongoDB's top-k sort */
    struct doc_proj *proj;
    int64_t n;                  /* $limit, $skip */
    struct doc_expr *id;        /* $group */
    struct acc *acc;
    unsigned nacc;
    char *path;                 /* $unwind */
    char *index_field;
    bool preserve;
    char *field;                /* $count */
};

struct doc_pipeline {
    struct stage *st;
    unsigned n;
};

static void stage_free(struct stage *s)
{
    if (s->m)
        doc_match_free(s->m);
    doc_sort_free(s->sort);
    doc_proj_free(s->proj);
    doc_expr_free(s->id);
    for (unsigned i = 0; i < s->nacc; i++) {
        free(s->acc[i].name);
        doc_expr_free(s->acc[i].ex);
    }
    free(s->acc);
    free(s->path);
    free(s->index_field);
    free(s->field);
}

void doc_agg_free(struct doc_pipeline *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < p->n; i++)
        stage_free(&p->st[i]);
    free(p->st);
    free(p);
}

static bool whole_number(const bson_iter_t *it, int64_t *v)
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

        if (d != floor(d) || !(fabs(d) < 9.2e18))
            return false;
        *v = (int64_t)d;
        return true;
    }
    default:
        return false;
    }
}

static int comp_group(struct stage *s, bson_iter_t *arg, struct doc_err *e)
{
    bson_iter_t it;
    bool have_id = false;

    if (!BSON_ITER_HOLDS_DOCUMENT(arg) || !bson_iter_recurse(arg, &it))
        return doc_errf(e, DOC_BadValue, "a group's fields must be specified in an object");
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        bson_iter_t a;
        struct acc *acc;
        const char *op;
        size_t i;

        if (strcmp(k, "_id") == 0) {
            if (have_id)
                return doc_errf(e, DOC_BadValue, "a group's _id may only be specified once");
            have_id = true;
            if (doc_expr_compile(bson_iter_value(&it), &s->id, e) < 0)
                return -1;
            continue;
        }
        if (strchr(k, '.'))
            return doc_errf(e, DOC_BadValue, "The field name '%s' cannot contain '.'", k);
        if (k[0] == '$')
            return doc_errf(e, DOC_BadValue, "The field name '%s' cannot be an operator name", k);
        if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &a) || !bson_iter_next(&a))
            return doc_errf(e, DOC_BadValue, "The field '%s' must be an accumulator object", k);
        op = bson_iter_key(&a);
        for (i = 0; i < sizeof(accs) / sizeof(accs[0]) && strcmp(op, accs[i].name) != 0; i++)
            ;
        if (i == sizeof(accs) / sizeof(accs[0]))
            return doc_errf(e, DOC_BadValue, "Unknown group operator '%s'", op);
        acc = realloc(s->acc, (s->nacc + 1) * sizeof(*acc));
        if (!acc)
            return doc_errf(e, DOC_InternalError, "out of memory");
        s->acc = acc;
        acc = &s->acc[s->nacc++];
        memset(acc, 0, sizeof(*acc));
        acc->op = accs[i].op;
        acc->name = strdup(k);
        if (!acc->name)
            return doc_errf(e, DOC_InternalError, "out of memory");
        if (acc->op == ACC_COUNT) {
            bson_iter_t c;

            if (!BSON_ITER_HOLDS_DOCUMENT(&a) || !bson_iter_recurse(&a, &c) || bson_iter_next(&c))
                return doc_errf(e, DOC_BadValue, "$count takes no arguments, i.e. $count:{}");
        } else if (BSON_ITER_HOLDS_ARRAY(&a)) {
            return doc_errf(e, DOC_BadValue, "The %s accumulator is a unary operator", op);
        } else if (doc_expr_compile(bson_iter_value(&a), &acc->ex, e) < 0) {
            return -1;
        }
        if (bson_iter_next(&a))
            return doc_errf(e, DOC_BadValue, "The field '%s' must specify one accumulator", k);
    }
    if (!have_id)
        return doc_errf(e, DOC_BadValue, "a group specification must include an _id");
    return 0;
}

static int comp_unwind(struct stage *s, bson_iter_t *arg, struct doc_err *e)
{
    const char *path = NULL;
    bson_iter_t it;

    if (BSON_ITER_HOLDS_UTF8(arg)) {
        path = bson_iter_utf8(arg, NULL);
    } else if (BSON_ITER_HOLDS_DOCUMENT(arg) && bson_iter_recurse(arg, &it)) {
        while (bson_iter_next(&it)) {
            const char *k = bson_iter_key(&it);

            if (strcmp(k, "path") == 0) {
                if (!BSON_ITER_HOLDS_UTF8(&it))
                    return doc_errf(e, DOC_BadValue,
                                    "expected a string as the path for $unwind stage, got %s",
                                    doc_type_name(bson_iter_type(&it)));
                path = bson_iter_utf8(&it, NULL);
            } else if (strcmp(k, "includeArrayIndex") == 0) {
                const char *f;

                if (!BSON_ITER_HOLDS_UTF8(&it))
                    return doc_errf(e, DOC_BadValue,
                                    "expected a non-empty string for the includeArrayIndex "
                                    "option to $unwind stage, got %s",
                                    doc_type_name(bson_iter_type(&it)));
                f = bson_iter_utf8(&it, NULL);
                if (f[0] == '\0' || f[0] == '$')
                    return doc_errf(e, DOC_BadValue,
                                    "includeArrayIndex option to $unwind stage should not be "
                                    "prefixed with a '$': %s", f);
                if (strchr(f, '.'))
                    return doc_errf(e, DOC_BadValue,
                                    "includeArrayIndex with a dotted path (%s) is not supported", f);
                free(s->index_field);
                s->index_field = strdup(f);
                if (!s->index_field)
                    return doc_errf(e, DOC_InternalError, "out of memory");
            } else if (strcmp(k, "preserveNullAndEmptyArrays") == 0) {
                if (!BSON_ITER_HOLDS_BOOL(&it))
                    return doc_errf(e, DOC_BadValue,
                                    "expected a boolean for the preserveNullAndEmptyArrays option "
                                    "to $unwind stage, got %s", doc_type_name(bson_iter_type(&it)));
                s->preserve = bson_iter_bool(&it);
            } else {
                return doc_errf(e, DOC_BadValue, "unrecognized option to $unwind stage: %s", k);
            }
        }
        if (!path)
            return doc_errf(e, DOC_BadValue, "no path specified to $unwind stage");
    } else {
        return doc_errf(e, DOC_BadValue,
                        "expected either a string or an object as specification for $unwind "
                        "stage, got %s", doc_type_name(bson_iter_type(arg)));
    }
    if (path[0] != '$')
        return doc_errf(e, DOC_BadValue,
                        "path option to $unwind stage should be prefixed with a '$': %s", path);
    if (field_path_check(path + 1, path, e) < 0)
        return -1;
    s->path = strdup(path + 1);
    if (!s->path)
        return doc_errf(e, DOC_InternalError, "out of memory");
    return 0;
}

static int comp_stage(struct stage *s, bson_iter_t *st, struct doc_err *e)
{
    bson_iter_t it;
    const char *name;
    bson_t sub;
    uint32_t len;
    const uint8_t *data;

    if (!BSON_ITER_HOLDS_DOCUMENT(st) || !bson_iter_recurse(st, &it) || !bson_iter_next(&it))
        return doc_errf(e, DOC_BadValue,
                        "A pipeline stage specification object must contain exactly one field.");
    name = bson_iter_key(&it);
    {
        bson_iter_t more = it;

        if (bson_iter_next(&more))
            return doc_errf(e, DOC_BadValue,
                            "A pipeline stage specification object must contain exactly one field.");
    }
    if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
        bson_iter_document(&it, &len, &data);
        bson_init_static(&sub, data, len);
    }
    if (strcmp(name, "$match") == 0) {
        s->kind = ST_MATCH;
        if (!BSON_ITER_HOLDS_DOCUMENT(&it))
            return doc_errf(e, DOC_BadValue, "the match filter must be an expression in an object");
        return doc_match_compile(&sub, &s->m, e);
    }
    if (strcmp(name, "$sort") == 0) {
        s->kind = ST_SORT;
        if (!BSON_ITER_HOLDS_DOCUMENT(&it))
            return doc_errf(e, DOC_BadValue, "the $sort key specification must be an object");
        if (doc_sort_compile(&sub, &s->sort, e) < 0)
            return -1;
        if (!s->sort)
            return doc_errf(e, DOC_BadValue, "$sort stage must have at least one sort key");
        if (doc_sort_natural(s->sort))
            return doc_errf(e, DOC_BadValue, "$natural is not a valid $sort key in a pipeline");
        return 0;
    }
    if (strcmp(name, "$limit") == 0 || strcmp(name, "$skip") == 0) {
        bool lim = name[1] == 'l';

        s->kind = lim ? ST_LIMIT : ST_SKIP;
        if (!whole_number(&it, &s->n))
            return doc_errf(e, DOC_BadValue, "invalid argument to %s stage: Expected an integer",
                            name);
        if (lim ? s->n <= 0 : s->n < 0)
            return doc_errf(e, DOC_BadValue,
                            lim ? "the limit must be positive"
                                : "invalid argument to $skip stage: Expected a non-negative number");
        return 0;
    }
    if (strcmp(name, "$project") == 0) {
        s->kind = ST_PROJECT;
        if (!BSON_ITER_HOLDS_DOCUMENT(&it))
            return doc_errf(e, DOC_BadValue, "$project specification must be an object");
        return doc_proj_compile_x(&sub, true, &s->proj, e);
    }
    if (strcmp(name, "$group") == 0) {
        s->kind = ST_GROUP;
        return comp_group(s, &it, e);
    }
    if (strcmp(name, "$unwind") == 0) {
        s->kind = ST_UNWIND;
        return comp_unwind(s, &it, e);
    }
    if (strcmp(name, "$count") == 0) {
        const char *f;

        s->kind = ST_COUNT;
        if (!BSON_ITER_HOLDS_UTF8(&it) || !*(f = bson_iter_utf8(&it, NULL)))
            return doc_errf(e, DOC_BadValue, "the count field must be a non-empty string");
        if (f[0] == '$')
            return doc_errf(e, DOC_BadValue, "the count field cannot be a $-prefixed path");
        if (strchr(f, '.'))
            return doc_errf(e, DOC_BadValue, "the count field cannot contain '.'");
        s->field = strdup(f);
        if (!s->field)
            return doc_errf(e, DOC_InternalError, "out of memory");
        return 0;
    }
    return doc_errf(e, DOC_BadValue, "Unrecognized pipeline stage name: '%s'", name);
}

int doc_agg_compile(const bson_t *stages, struct doc_pipeline **out, struct doc_err *e)
{
    struct doc_pipeline *p;
    bson_iter_t it;
    uint32_t n;

    *out = NULL;
    if (!bson_iter_init(&it, stages))
        return doc_errf(e, DOC_InvalidBSON, "pipeline is not valid BSON");
    n = bson_count_keys(stages);
    p = calloc(1, sizeof(*p));
    if (!p || (n && !(p->st = calloc(n, sizeof(*p->st))))) {
        free(p);
        return doc_errf(e, DOC_InternalError, "out of memory");
    }
    while (bson_iter_next(&it)) {
        /* Each stage is freed with the pipeline, compiled or not. */
        p->n++;
        if (comp_stage(&p->st[p->n - 1], &it, e) < 0) {
            doc_agg_free(p);
            return -1;
        }
    }
    for (unsigned i = 0; i + 1 < p->n; i++) {
        struct stage *n1 = &p->st[i + 1], *n2 = i + 2 < p->n ? &p->st[i + 2] : NULL;

        if (p->st[i].kind != ST_SORT)
            continue;
        if (n1->kind == ST_LIMIT)
            p->st[i].topk = n1->n;
        else if (n1->kind == ST_SKIP && n2 && n2->kind == ST_LIMIT && n1->n <= INT64_MAX - n2->n)
            p->st[i].topk = n1->n + n2->n;
    }
    *out = p;
    return 0;
}

const struct doc_matcher *doc_agg_leading_match(const struct doc_pipeline *p)
{
    return p->n && p->st[0].kind == ST_MATCH ? p->st[0].m : NULL;
}

const struct doc_sort *doc_agg_leading_sort(const struct doc_pipeline *p)
{
    if (p->n && p->st[0].kind == ST_SORT)
        return p->st[0].sort;
    if (p->n > 1 && p->st[0].kind == ST_MATCH && p->st[1].kind == ST_SORT)
        return p->st[1].sort;
    return NULL;
}

/* ---- a run ---- */

struct sent {
    size_t koff, doff;
    uint32_t klen, dlen;
};

struct grp {
    size_t koff, idoff;
    uint32_t klen, idlen;
    uint64_t hash;
};

struct accst {
    struct num sum;
    int64_t n;
    bson_t *held;               /* {"v": value} ($min $max $first $last), the array ($push) */
};

struct srun {
    const struct stage *s;
    bool done;                  /* wants no more input */
    int64_t count;
    bson_t out;                 /* $project, $unwind, $group, $count: the document sent on */
    struct doc_arena arena;
    struct doc_buf docs, keys;  /* $sort: documents and their keys; $group: keys and _ids */
    struct doc_buf docs2, keys2; /* $sort with a top-k: where the kept ones move */
    struct sent *ent;           /* $sort */
    struct grp *g;              /* $group */
    struct accst *as;
    size_t n, cap;
    uint32_t *ht;               /* $group: index + 1 of the group in each slot */
    size_t htcap;
    struct doc_buf tmp;
    size_t held_bytes;
};

struct run {
    const struct doc_pipeline *p;
    struct srun *sr;
    size_t max_bytes;
    doc_sink_fn sink;
    void *sink_arg;
    struct doc_err *e;
};

static int push(struct run *r, unsigned i, const bson_t *doc);

static int mem_check(struct run *r, struct srun *sr, size_t bytes)
{
    if (bytes <= r->max_bytes)
        return 0;
    if (sr->s->kind == ST_SORT)
        return doc_errf(r->e, DOC_QueryExceededMemoryLimitNoDiskUseAllowed,
                        "Sort exceeded memory limit of %zu bytes, but did not opt in to external "
                        "sorting. Pass allowDiskUse:true to opt in.", r->max_bytes);
    return doc_errf(r->e, DOC_QueryExceededMemoryLimitNoDiskUseAllowed,
                    "Exceeded memory limit for $group, but didn't allow external sort. Pass "
                    "allowDiskUse:true to opt in.");
}

static int sent_cmp(const void *a, const void *b, void *arg);

/* A top-k sort: keep the first k of what came so far, moved to the spare
 * buffers (which then swap with the live ones: no allocation once warm).
 * Moving them in their order keeps equal keys in the order they came. */
static int sort_trim(struct run *r, struct srun *sr)
{
    size_t k = (size_t)sr->s->topk;
    struct doc_buf t;

    qsort_r(sr->ent, sr->n, sizeof(*sr->ent), sent_cmp, sr->keys.p);
    doc_buf_reset(&sr->docs2);
    doc_buf_reset(&sr->keys2);
    for (size_t i = 0; i < k; i++) {
        struct sent *en = &sr->ent[i];
        size_t koff = sr->keys2.len, doff = sr->docs2.len;

        doc_buf_add(&sr->keys2, sr->keys.p + en->koff, en->klen);
        doc_buf_add(&sr->docs2, sr->docs.p + en->doff, en->dlen);
        en->koff = koff;
        en->doff = doff;
    }
    if (sr->keys2.oom || sr->docs2.oom)
        return doc_errf(r->e, DOC_InternalError, "out of memory");
    t = sr->docs;
    sr->docs = sr->docs2;
    sr->docs2 = t;
    t = sr->keys;
    sr->keys = sr->keys2;
    sr->keys2 = t;
    sr->n = k;
    return 0;
}

static int sort_push(struct run *r, struct srun *sr, const bson_t *doc)
{
    struct sent *en;

    if (sr->n == sr->cap) {
        size_t cap = sr->cap ? 2 * sr->cap : 64;
        struct sent *ent = realloc(sr->ent, cap * sizeof(*ent));

        if (!ent)
            return doc_errf(r->e, DOC_InternalError, "out of memory");
        sr->ent = ent;
        sr->cap = cap;
    }
    en = &sr->ent[sr->n];
    en->koff = sr->keys.len;
    doc_sort_key(sr->s->sort, doc, &sr->keys);
    en->klen = (uint32_t)(sr->keys.len - en->koff);
    en->doff = sr->docs.len;
    en->dlen = doc->len;
    doc_buf_add(&sr->docs, bson_get_data(doc), doc->len);
    if (sr->keys.oom || sr->docs.oom)
        return doc_errf(r->e, DOC_InternalError, "out of memory");
    sr->n++;
    if (sr->s->topk && sr->s->topk < (int64_t)(SIZE_MAX / 4) &&
        sr->n >= 2 * (size_t)sr->s->topk + 64 && sort_trim(r, sr) < 0)
        return -1;
    return mem_check(r, sr, sr->docs.len + sr->keys.len + sr->n * sizeof(struct sent));
}

static int sent_cmp(const void *a, const void *b, void *arg)
{
    const struct sent *x = a, *y = b;
    const uint8_t *keys = arg;
    uint32_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(keys + x->koff, keys + y->koff, n);

    if (c)
        return c;
    if (x->klen != y->klen)
        return x->klen < y->klen ? -1 : 1;
    /* Stable: the order documents came in. */
    return x->doff < y->doff ? -1 : x->doff > y->doff;
}

static int sort_finish(struct run *r, unsigned i)
{
    struct srun *sr = &r->sr[i];

    if (sr->n)
        qsort_r(sr->ent, sr->n, sizeof(*sr->ent), sent_cmp, sr->keys.p);
    for (size_t k = 0; k < sr->n; k++) {
        bson_t d;
        int rc;

        if (!bson_init_static(&d, sr->docs.p + sr->ent[k].doff, sr->ent[k].dlen))
            return doc_errf(r->e, DOC_InternalError, "bad sorted document");
        rc = push(r, i + 1, &d);
        if (rc)
            return rc < 0 ? rc : 0;
    }
    return 0;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int ht_grow(struct srun *sr)
{
    size_t cap = sr->htcap ? 2 * sr->htcap : 64;
    uint32_t *ht = calloc(cap, sizeof(*ht));

    if (!ht)
        return -1;
    for (size_t g = 0; g < sr->n; g++) {
        size_t j = sr->g[g].hash & (cap - 1);

        while (ht[j])
            j = (j + 1) & (cap - 1);
        ht[j] = (uint32_t)g + 1;
    }
    free(sr->ht);
    sr->ht = ht;
    sr->htcap = cap;
    return 0;
}

static const bson_value_t null_v = {.value_type = BSON_TYPE_NULL};

/* Keep v in *held as {"v": v}; the change in bytes goes to the run's count. */
static int hold(struct srun *sr, bson_t **held, const bson_value_t *v)
{
    if (!*held) {
        *held = bson_new();
        if (!*held)
            return -1;
    }
    sr->held_bytes -= (*held)->len;
    bson_reinit(*held);
    bson_append_value(*held, "v", 1, v->value_type == BSON_TYPE_EOD ? &null_v : v);
    sr->held_bytes += (*held)->len;
    return 0;
}

static bool held_value(const bson_t *held, bson_value_t *v)
{
    bson_iter_t it;

    if (!held || !bson_iter_init_find(&it, held, "v"))
        return false;
    *v = *bson_iter_value(&it);
    return true;
}

static int group_find(struct run *r, struct srun *sr, const bson_value_t *id, size_t *out)
{
    const struct stage *s = sr->s;
    uint64_t h;
    size_t j;
    struct grp *g;

    doc_buf_reset(&sr->tmp);
    doc_key_add(&sr->tmp, id, false);
    if (sr->tmp.oom)
        return doc_errf(r->e, DOC_InternalError, "out of memory");
    h = hash_bytes(sr->tmp.p, sr->tmp.len);
    if (sr->htcap) {
        for (j = h & (sr->htcap - 1); sr->ht[j]; j = (j + 1) & (sr->htcap - 1)) {
            g = &sr->g[sr->ht[j] - 1];
            if (g->hash == h && g->klen == sr->tmp.len &&
                memcmp(sr->keys.p + g->koff, sr->tmp.p, g->klen) == 0) {
                *out = sr->ht[j] - 1;
                return 0;
            }
        }
    }
    /* A new group. */
    if (sr->n == sr->cap) {
        size_t cap = sr->cap ? 2 * sr->cap : 16;
        struct grp *ng = realloc(sr->g, cap * sizeof(*ng));
        struct accst *as;

        if (!ng)
            return doc_errf(r->e, DOC_InternalError, "out of memory");
        sr->g = ng;
        as = realloc(sr->as, cap * (s->nacc ? s->nacc : 1) * sizeof(*as));
        if (!as)
            return doc_errf(r->e, DOC_InternalError, "out of memory");
        sr->as = as;
        sr->cap = cap;
    }
    if (2 * (sr->n + 1) > sr->htcap && ht_grow(sr) < 0)
        return doc_errf(r->e, DOC_InternalError, "out of memory");
    g = &sr->g[sr->n];
    g->hash = h;
    g->koff = sr->keys.len;
    g->klen = (uint32_t)sr->tmp.len;
    doc_buf_add(&sr->keys, sr->tmp.p, sr->tmp.len);
    {
        /* The _id as a document {"_id": v}, kept for the output. */
        bson_t idd;

        bson_init(&idd);
        bson_append_value(&idd, "_id", 3, id);
        g->idoff = sr->docs.len;
        g->idlen = idd.len;
        doc_buf_add(&sr->docs, bson_get_data(&idd), idd.len);
        bson_destroy(&idd);
    }
    if (sr->keys.oom || sr->docs.oom)
        return doc_errf(r->e, DOC_InternalError, "out of memory");
    memset(&sr->as[sr->n * s->nacc], 0, s->nacc * sizeof(*sr->as));
    for (unsigned a = 0; a < s->nacc; a++)
        num_start(&sr->as[sr->n * s->nacc + a].sum, 0);
    for (j = h & (sr->htcap - 1); sr->ht[j]; j = (j + 1) & (sr->htcap - 1))
        ;
    sr->ht[j] = (uint32_t)sr->n + 1;
    *out = sr->n++;
    return 0;
}

static size_t group_bytes(const struct srun *sr)
{
    return sr->keys.len + sr->docs.len + sr->held_bytes + sr->htcap * sizeof(uint32_t) +
           sr->n * (sizeof(struct grp) + sr->s->nacc * sizeof(struct accst));
}

static int group_push(struct run *r, struct srun *sr, const bson_t *doc)
{
    const struct stage *s = sr->s;
    bson_value_t id;
    size_t g = 0;

    doc_arena_reset(&sr->arena);
    if (doc_expr_eval(s->id, doc, &sr->arena, &id, r->e) < 0)
        return -1;
    if (id.value_type == BSON_TYPE_EOD)
        id = null_v;
    if (group_find(r, sr, &id, &g) < 0)
        return -1;
    for (unsigned a = 0; a < s->nacc; a++) {
        const struct acc *ac = &s->acc[a];
        struct accst *st = &sr->as[g * s->nacc + a];
        bson_value_t v = {.value_type = BSON_TYPE_EOD}, cur;
        int c;

        if (ac->ex && doc_expr_eval(ac->ex, doc, &sr->arena, &v, r->e) < 0)
            return -1;
        switch (ac->op) {
        case ACC_SUM:
        case ACC_AVG:
            /* Non-numbers (strings, arrays, null, missing) are ignored. */
            if (is_num(&v)) {
                num_op(&st->sum, &v, false);
                st->n++;
            }
            break;
        case ACC_COUNT:
            st->n++;
            break;
        case ACC_MIN:
        case ACC_MAX:
            if (is_nullish(&v))
                break;
            if (held_value(st->held, &cur)) {
                c = doc_val_cmp(&v, &cur);
                if (ac->op == ACC_MIN ? c >= 0 : c <= 0)
                    break;
            }
            if (hold(sr, &st->held, &v) < 0)
                return doc_errf(r->e, DOC_InternalError, "out of memory");
            break;
        case ACC_FIRST:
            if (st->n++)
                break;
            /* fall through */
        case ACC_LAST:
            if (hold(sr, &st->held, &v) < 0)
                return doc_errf(r->e, DOC_InternalError, "out of memory");
            break;
        case ACC_PUSH: {
            char buf[16];
            const char *ks;
            size_t kl;

            if (v.value_type == BSON_TYPE_EOD)
                break;
            if (!st->held && !(st->held = bson_new()))
                return doc_errf(r->e, DOC_InternalError, "out of memory");
            sr->held_bytes -= st->held->len;
            kl = bson_uint32_to_string((uint32_t)st->n++, &ks, buf, sizeof(buf));
            bson_append_value(st->held, ks, (int)kl, &v);
            sr->held_bytes += st->held->len;
            break;
        }
        }
    }
    return mem_check(r, sr, group_bytes(sr));
}

static int group_finish(struct run *r, unsigned i)
{
    struct srun *sr = &r->sr[i];
    const struct stage *s = sr->s;

    for (size_t g = 0; g < sr->n; g++) {
        bson_t idd;
        int rc;

        bson_reinit(&sr->out);
        if (bson_init_static(&idd, sr->docs.p + sr->g[g].idoff, sr->g[g].idlen))
            bson_concat(&sr->out, &idd);
        for (unsigned a = 0; a < s->nacc; a++) {
            const struct acc *ac = &s->acc[a];
            struct accst *st = &sr->as[g * s->nacc + a];
            bson_value_t v;

            switch (ac->op) {
            case ACC_SUM:
                num_value(&st->sum, &v);
                break;
            case ACC_COUNT:
                num_start(&st->sum, st->n);
                num_value(&st->sum, &v);
                break;
            case ACC_AVG:
                if (st->n) {
                    v.value_type = BSON_TYPE_DOUBLE;
                    v.value.v_double = num_double(&st->sum) / (double)st->n;
                } else {
                    v = null_v;     /* $avg of nothing numeric */
                }
                break;
            case ACC_PUSH:
                if (st->held) {
                    bson_append_array(&sr->out, ac->name, -1, st->held);
                } else {
                    bson_t empty = BSON_INITIALIZER;

                    bson_append_array(&sr->out, ac->name, -1, &empty);
                }
                continue;
            default:
                if (!held_value(st->held, &v))
                    v = null_v;
                break;
            }
            bson_append_value(&sr->out, ac->name, -1, &v);
        }
        rc = push(r, i + 1, &sr->out);
        if (rc)
            return rc < 0 ? rc : 0;
    }
    return 0;
}

static bool iter_sub_doc(const bson_iter_t *it, bson_t *sub)
{
    uint32_t len;
    const uint8_t *data;

    bson_iter_document(it, &len, &data);
    return bson_init_static(sub, data, len);
}

/* Copy `in` with the value at `path` (sub-documents only) replaced by the
 * element at `el` (or left out if `drop`), and at the top level the index
 * field set. */
static void unwind_copy(const bson_t *in, const char *path, const bson_iter_t *el, bool drop,
                        const char *index_field, const bson_value_t *index, bson_t *out)
{
    const char *dot = strchr(path, '.');
    size_t clen = dot ? (size_t)(dot - path) : strlen(path);
    bool index_done = !index_field;
    bson_iter_t it;

    if (!bson_iter_init(&it, in))
        return;
    while (bson_iter_next(&it)) {
        const char *k = bson_iter_key(&it);
        int klen = (int)bson_iter_key_len(&it);

        if (index_field && strcmp(k, index_field) == 0) {
            if (!index_done)
                bson_append_value(out, k, klen, index);
            index_done = true;
            continue;
        }
        if ((size_t)klen == clen && memcmp(k, path, clen) == 0 && (el || drop)) {
            if (!dot) {
                if (el)
                    bson_append_iter(out, k, klen, el);
                continue;
            }
            if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
                bson_t sub, child;

                if (iter_sub_doc(&it, &sub)) {
                    bson_append_document_begin(out, k, klen, &child);
                    unwind_copy(&sub, dot + 1, el, drop, NULL, NULL, &child);
                    bson_append_document_end(out, &child);
                    continue;
                }
            }
        }
        bson_append_iter(out, k, klen, &it);
    }
    if (!index_done)
        bson_append_value(out, index_field, -1, index);
}

/* The value $unwind's path names: through sub-documents only, as MongoDB
 * does not look into arrays on the way. */
static bool unwind_find(const bson_t *doc, const char *path, bson_iter_t *out)
{
    bson_t cur = *doc;

    for (;;) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);

        if (!bson_iter_init_find_w_len(out, &cur, path, (int)len))
            return false;
        if (!dot)
            return true;
        if (!BSON_ITER_HOLDS_DOCUMENT(out) || !iter_sub_doc(out, &cur))
            return false;
        path = dot + 1;
    }
}

static int unwind_push(struct run *r, unsigned i, const bson_t *doc)
{
    struct srun *sr = &r->sr[i];
    const struct stage *s = sr->s;
    bson_iter_t it, a;
    bson_value_t index = null_v;
    bool found = unwind_find(doc, s->path, &it);
    int64_t k = 0;

    if (found && BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &a)) {
        while (bson_iter_next(&a)) {
            int rc;

            index.value_type = BSON_TYPE_INT64;
            index.value.v_int64 = k++;
            bson_reinit(&sr->out);
            unwind_copy(doc, s->path, &a, false, s->index_field, &index, &sr->out);
            if ((rc = push(r, i + 1, &sr->out)) != 0)
                return rc;
        }
        if (k)
            return 0;
        /* An empty array, kept: the document goes on without the field
         * (the manual's preserveNullAndEmptyArrays example). */
        if (!s->preserve)
            return 0;
        bson_reinit(&sr->out);
        unwind_copy(doc, s->path, NULL, true, s->index_field, &null_v, &sr->out);
        return push(r, i + 1, &sr->out);
    } else if (found && !is_nullish(bson_iter_value(&it))) {
        /* A value that is not an array is an array of one. */
        goto as_is;
    }
    if (!s->preserve)
        return 0;
as_is:
    if (!s->index_field)
        return push(r, i + 1, doc);
    bson_reinit(&sr->out);
    unwind_copy(doc, s->path, NULL, false, s->index_field, &null_v, &sr->out);
    return push(r, i + 1, &sr->out);
}

/* Send `doc` into stage i (the sink after the last): 0 to go on, 1 when
 * nothing more is wanted, <0 on error. */
static int push(struct run *r, unsigned i, const bson_t *doc)
{
    struct srun *sr;
    int rc = 0;

    if (i == r->p->n)
        return r->sink(r->sink_arg, doc, r->e) < 0 ? -1 : 0;
    sr = &r->sr[i];
    if (sr->done)
        return 1;
    switch (sr->s->kind) {
    case ST_MATCH:
        rc = doc_match(sr->s->m, doc) ? push(r, i + 1, doc) : 0;
        break;
    case ST_PROJECT:
        doc_arena_reset(&sr->arena);
        bson_reinit(&sr->out);
        rc = doc_proj_apply_x(sr->s->proj, doc, &sr->out, &sr->arena, r->e);
        if (rc == 0)
            rc = push(r, i + 1, &sr->out);
        break;
    case ST_UNWIND:
        rc = unwind_push(r, i, doc);
        break;
    case ST_SKIP:
        if (sr->count < sr->s->n)
            sr->count++;
        else
            rc = push(r, i + 1, doc);
        break;
    case ST_LIMIT:
        rc = push(r, i + 1, doc);
        if (rc >= 0 && ++sr->count >= sr->s->n)
            rc = 1;
        break;
    case ST_COUNT:
        sr->count++;
        break;
    case ST_SORT:
        rc = sort_push(r, sr, doc);
        break;
    case ST_GROUP:
        rc = group_push(r, sr, doc);
        break;
    }
    if (rc == 1)
        sr->done = true;
    return rc;
}

/* Stage i has had all its input: a blocking stage sends what it holds. */
static int finish(struct run *r, unsigned i)
{
    struct srun *sr = &r->sr[i];

    switch (sr->s->kind) {
    case ST_SORT:
        return sort_finish(r, i);
    case ST_GROUP:
        return group_finish(r, i);
    case ST_COUNT:
        /* No input, no document (it is a $group on null). */
        if (!sr->count)
            return 0;
        bson_reinit(&sr->out);
        if (sr->count <= INT32_MAX)
            bson_append_int32(&sr->out, sr->s->field, -1, (int32_t)sr->count);
        else
            bson_append_int64(&sr->out, sr->s->field, -1, sr->count);
        return push(r, i + 1, &sr->out) < 0 ? -1 : 0;
    default:
        return 0;
    }
}

static void srun_free(struct srun *sr)
{
    bson_destroy(&sr->out);
    doc_arena_free(&sr->arena);
    doc_buf_free(&sr->docs);
    doc_buf_free(&sr->keys);
    doc_buf_free(&sr->docs2);
    doc_buf_free(&sr->keys2);
    doc_buf_free(&sr->tmp);
    free(sr->ent);
    free(sr->g);
    if (sr->as && sr->s->kind == ST_GROUP)
        for (size_t k = 0; k < sr->n * sr->s->nacc; k++)
            if (sr->as[k].held)
                bson_destroy(sr->as[k].held);
    free(sr->as);
    free(sr->ht);
}

int doc_agg_run(const struct doc_pipeline *p, const struct doc_agg_run_opts *o,
                doc_source_fn src, void *src_arg, doc_sink_fn sink, void *sink_arg,
                struct doc_err *e)
{
    struct run r = {.p = p, .sink = sink, .sink_arg = sink_arg, .e = e};
    unsigned first = o ? o->skip_leading : 0;
    int rc = 0;

    r.max_bytes = o && o->max_bytes ? o->max_bytes : (size_t)100 << 20;
    if (first > p->n || first > 2)
        return doc_errf(e, DOC_BadValue, "cannot skip %u leading stages of %u", first, p->n);
    if (p->n) {
        r.sr = calloc(p->n, sizeof(*r.sr));
        if (!r.sr)
            return doc_errf(e, DOC_InternalError, "out of memory");
    }
    for (unsigned i = 0; i < p->n; i++) {
        r.sr[i].s = &p->st[i];
        bson_init(&r.sr[i].out);
    }
    for (;;) {
        bson_t doc;

        rc = src(src_arg, &doc, e);
        if (rc <= 0)
            break;
        rc = push(&r, first, &doc);
        if (rc < 0)
            break;
        if (rc == 1) {
            rc = 0;
            break;
        }
    }
    for (unsigned i = first; rc >= 0 && i < p->n; i++)
        rc = finish(&r, i);
    for (unsigned i = 0; i < p->n; i++)
        srun_free(&r.sr[i]);
    free(r.sr);
    return rc < 0 ? -1 : 0;
}
