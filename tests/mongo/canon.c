/* The canonical transcript of tests/mongo (README.md there), the same form
 * as crud.py's canon and crud.js's: keys sorted, an ObjectId as the string
 * "ObjectId", numbers without their BSON type. Shared by the libmongoc
 * client (crud.c) and the native one (native.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h"

static void put_string(const char *s, uint32_t len)
{
    putchar('"');
    for (uint32_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        switch (c) {
        case '"': fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        case '\b': fputs("\\b", stdout); break;
        case '\f': fputs("\\f", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        default:
            if (c < 0x20)
                printf("\\u%04x", c);
            else
                putchar(c);
        }
    }
    putchar('"');
}

/* A double as Python's repr and JavaScript's String() print it for the
 * values the script makes: an integral one as an integer (the Node driver
 * cannot tell a double from an int32), any other the shortest digits that
 * read back the same. */
static void put_double(double v)
{
    char buf[40];

    if (v == (double)(int64_t)v && v > -9007199254740992.0 && v < 9007199254740992.0) {
        printf("%lld", (long long)v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof(buf), "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, stdout);
}

static void put_value(const bson_iter_t *it);

static int cmp_keys(const void *a, const void *b)
{
    return strcmp(bson_iter_key((const bson_iter_t *)a), bson_iter_key((const bson_iter_t *)b));
}

/* A document with its keys sorted, as json.dumps(sort_keys=True). */
void canon_put_doc(const bson_t *doc)
{
    bson_iter_t it, *keys;
    size_t n = 0, i = 0;

    if (bson_iter_init(&it, doc))
        while (bson_iter_next(&it))
            n++;
    keys = calloc(n ? n : 1, sizeof(*keys));
    if (!keys)
        abort();
    if (bson_iter_init(&it, doc))
        while (bson_iter_next(&it))
            keys[i++] = it;
    qsort(keys, n, sizeof(*keys), cmp_keys);
    putchar('{');
    for (i = 0; i < n; i++) {
        const char *k = bson_iter_key(&keys[i]);

        if (i)
            putchar(',');
        put_string(k, (uint32_t)strlen(k));
        putchar(':');
        put_value(&keys[i]);
    }
    putchar('}');
    free(keys);
}

static void put_array(const bson_t *arr)
{
    bson_iter_t it;
    bool first = true;

    putchar('[');
    if (bson_iter_init(&it, arr))
        while (bson_iter_next(&it)) {
            if (!first)
                putchar(',');
            first = false;
            put_value(&it);
        }
    putchar(']');
}

static void put_value(const bson_iter_t *it)
{
    const uint8_t *data;
    const char *s;
    uint32_t len;
    bson_t sub;

    switch (bson_iter_type(it)) {
    case BSON_TYPE_DOCUMENT:
    case BSON_TYPE_ARRAY:
        if (BSON_ITER_HOLDS_DOCUMENT(it))
            bson_iter_document(it, &len, &data);
        else
            bson_iter_array(it, &len, &data);
        if (!bson_init_static(&sub, data, len)) {
            fputs("\"<bad bson>\"", stdout);
            return;
        }
        if (BSON_ITER_HOLDS_DOCUMENT(it))
            canon_put_doc(&sub);
        else
            put_array(&sub);
        return;
    case BSON_TYPE_UTF8:
        s = bson_iter_utf8(it, &len);
        put_string(s, len);
        return;
    case BSON_TYPE_OID: fputs("\"ObjectId\"", stdout); return;
    case BSON_TYPE_BOOL: fputs(bson_iter_bool(it) ? "true" : "false", stdout); return;
    case BSON_TYPE_NULL: fputs("null", stdout); return;
    case BSON_TYPE_INT32: printf("%d", bson_iter_int32(it)); return;
    case BSON_TYPE_INT64: printf("%lld", (long long)bson_iter_int64(it)); return;
    case BSON_TYPE_DOUBLE: put_double(bson_iter_double(it)); return;
    default:
        /* Any other type prints as a marker no other client matches. */
        printf("\"<bson type 0x%02x>\"", (unsigned)bson_iter_type(it));
        return;
    }
}

void canon_emit(const char *step, bson_t *fields)
{
    BSON_APPEND_UTF8(fields, "step", step);
    canon_put_doc(fields);
    putchar('\n');
    fflush(stdout);
    bson_destroy(fields);
}

