/* etcd's v3 JSON gateway, both ways, with no I/O: request bodies built
 * with json-c, answers read back into plain C. An answer is anything the
 * far end sent: it is parsed with a bounded depth, every field is checked
 * for its type (int64s arrive as strings, keys and values as base64, zero
 * values are left out), and one that is not what etcd sends is TERN_EPROTO. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>
#include <openssl/evp.h>

#include "error.h"
#include "etcd.h"

#define JSON_DEPTH 16   /* etcd's answers nest five deep */

/* ---- base64 ---- */

static char *b64(const void *p, size_t len)
{
    char *out;

    if (len > CL_VALUE_MAX)
        return NULL;
    out = malloc(4 * ((len + 2) / 3) + 1);
    if (out)
        EVP_EncodeBlock((unsigned char *)out, p, (int)len);
    return out;
}

/* Decode `s` into a new buffer (*out, *len; NUL-terminated as well). */
static int unb64(const char *s, size_t slen, uint8_t **out, size_t *len)
{
    size_t pad = 0;
    int n;

    *out = NULL;
    *len = 0;
    if (slen % 4)
        return TERN_EPROTO;
    if (slen && s[slen - 1] == '=')
        pad++;
    if (slen > 1 && s[slen - 2] == '=')
        pad++;
    *out = malloc(slen / 4 * 3 + 1);
    if (!*out)
        return TERN_ENOMEM;
    n = slen ? EVP_DecodeBlock(*out, (const unsigned char *)s, (int)slen) : 0;
    if (n < 0 || (size_t)n < pad || memchr(s, '=', slen - pad)) {
        free(*out);
        *out = NULL;
        return TERN_EPROTO;
    }
    *len = (size_t)n - pad;
    (*out)[*len] = 0;
    return 0;
}

/* ---- requests ---- */

static int add_b64(json_object *o, const char *name, const void *p, size_t len)
{
    char *s = b64(p, len);

    if (!s)
        return TERN_ENOMEM;
    json_object_object_add(o, name, json_object_new_string(s));
    free(s);
    return 0;
}

static void add_i64(json_object *o, const char *name, int64_t v)
{
    char buf[24];

    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    json_object_object_add(o, name, json_object_new_string(buf));
}

static char *finish(json_object *o, int rc)
{
    char *s = NULL;

    if (rc == 0)
        s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return s;
}

/* The key with its last byte raised, after dropping trailing 0xff: the
 * first key past every key with this prefix ("\0", every key, if none). */
static int add_range_end(json_object *o, const char *key)
{
    size_t n = strlen(key);
    char end[CL_KEY_MAX + 1];

    memcpy(end, key, n);
    while (n && (uint8_t)end[n - 1] == 0xff)
        n--;
    if (!n)
        return add_b64(o, "range_end", "", 1);
    end[n - 1] = (char)((uint8_t)end[n - 1] + 1);
    return add_b64(o, "range_end", end, n);
}

static json_object *put_obj(const char *key, const void *val, size_t len, int64_t lease, int *rc)
{
    json_object *o = json_object_new_object();

    *rc = o ? add_b64(o, "key", key, strlen(key)) : TERN_ENOMEM;
    if (*rc == 0)
        *rc = add_b64(o, "value", val, len);
    if (*rc == 0 && lease)
        add_i64(o, "lease", lease);
    return o;
}

char *cl_json_put(const char *key, const void *val, size_t len, int64_t lease)
{
    int rc;
    json_object *o = put_obj(key, val, len, lease, &rc);

    return o ? finish(o, rc) : NULL;
}

char *cl_json_range(const char *key, bool prefix)
{
    json_object *o = json_object_new_object();
    int rc;

    if (!o)
        return NULL;
    rc = add_b64(o, "key", key, strlen(key));
    if (rc == 0 && prefix)
        rc = add_range_end(o, key);
    return finish(o, rc);
}

char *cl_json_delete(const char *key, bool prefix)
{
    return cl_json_range(key, prefix);     /* the same fields */
}

char *cl_json_lease_ttl(int64_t ttl_s)
{
    json_object *o = json_object_new_object();

    if (!o)
        return NULL;
    add_i64(o, "TTL", ttl_s);
    return finish(o, 0);
}

char *cl_json_lease_id(int64_t id)
{
    json_object *o = json_object_new_object();

    if (!o)
        return NULL;
    add_i64(o, "ID", id);
    return finish(o, 0);
}

char *cl_json_txn_put(const char *key, bool create, int64_t mod_rev, const void *val, size_t len,
                      int64_t lease)
{
    json_object *o = json_object_new_object(), *cmp = json_object_new_object();
    json_object *ok = json_object_new_object(), *no = json_object_new_object();
    json_object *rd = json_object_new_object();
    json_object *put;
    int rc = o && cmp && ok && no && rd ? 0 : TERN_ENOMEM;

    if (rc == 0)
        rc = add_b64(cmp, "key", key, strlen(key));
    if (rc == 0) {
        json_object_object_add(cmp, "target", json_object_new_string(create ? "CREATE" : "MOD"));
        json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
        add_i64(cmp, create ? "create_revision" : "mod_revision", create ? 0 : mod_rev);
        rc = add_b64(rd, "key", key, strlen(key));
    }
    put = rc == 0 ? put_obj(key, val, len, lease, &rc) : NULL;
    if (!o) {
        json_object_put(cmp);
        json_object_put(ok);
        json_object_put(no);
        json_object_put(rd);
        json_object_put(put);
        return NULL;
    }
    json_object_object_add(o, "compare", json_object_new_array());
    json_object_array_add(json_object_object_get(o, "compare"), cmp);
    json_object_object_add(ok, "request_put", put);
    json_object_object_add(o, "success", json_object_new_array());
    json_object_array_add(json_object_object_get(o, "success"), ok);
    json_object_object_add(no, "request_range", rd);
    json_object_object_add(o, "failure", json_object_new_array());
    json_object_array_add(json_object_object_get(o, "failure"), no);
    return finish(o, rc);
}

/* ---- answers ---- */

static json_object *parse(const char *body, size_t len)
{
    struct json_tokener *t = json_tokener_new_ex(JSON_DEPTH);
    json_object *o;

    if (!t)
        return NULL;
    if (len > CL_ANSWER_MAX || len > (size_t)INT32_MAX) {
        json_tokener_free(t);
        return NULL;
    }
    o = json_tokener_parse_ex(t, body, (int)len);
    /* One whole object, nothing after it but white space. */
    if (o && json_tokener_get_error(t) == json_tokener_success) {
        for (size_t i = json_tokener_get_parse_end(t); i < len; i++)
            if (body[i] != ' ' && body[i] != '\n' && body[i] != '\r' && body[i] != '\t') {
                json_object_put(o);
                o = NULL;
                break;
            }
    } else {
        json_object_put(o);
        o = NULL;
    }
    json_tokener_free(t);
    if (o && !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        o = NULL;
    }
    return o;
}

/* An int64 field: absent is 0; a decimal string or a JSON integer. */
static int get_i64(json_object *o, const char *name, int64_t *out)
{
    json_object *v;
    const char *s;
    char *end;
    long long x;

    *out = 0;
    if (!json_object_object_get_ex(o, name, &v) || json_object_is_type(v, json_type_null))
        return 0;
    if (json_object_is_type(v, json_type_int)) {
        errno = 0;
        *out = json_object_get_int64(v);
        return errno ? TERN_EPROTO : 0;
    }
    if (!json_object_is_type(v, json_type_string))
        return TERN_EPROTO;
    s = json_object_get_string(v);
    if (!*s || (*s != '-' && (*s < '0' || *s > '9')))
        return TERN_EPROTO;
    errno = 0;
    x = strtoll(s, &end, 10);
    if (errno || *end || (size_t)(end - s) != (size_t)json_object_get_string_len(v))
        return TERN_EPROTO;
    *out = x;
    return 0;
}

/* An object field (absent: *out NULL, 0). */
static int get_obj(json_object *o, const char *name, json_type type, json_object **out)
{
    *out = NULL;
    if (!json_object_object_get_ex(o, name, out) || json_object_is_type(*out, json_type_null)) {
        *out = NULL;
        return 0;
    }
    return json_object_is_type(*out, type) ? 0 : TERN_EPROTO;
}

static int header_rev(json_object *o, int64_t *rev)
{
    json_object *h;
    int64_t r;
    int rc = get_obj(o, "header", json_type_object, &h);

    if (rc == 0 && !h)
        rc = TERN_EPROTO;   /* every answer has one */
    if (rc == 0)
        rc = get_i64(h, "revision", &r);
    if (rc == 0 && r < 0)
        rc = TERN_EPROTO;
    if (rc == 0 && rev)
        *rev = r;
    return rc;
}

/* One element of "kvs", to fn. */
static int kv_one(json_object *e, cl_kv_fn fn, void *arg)
{
    struct cl_kv kv = {0};
    json_object *k, *v;
    uint8_t *key = NULL, *val = NULL;
    size_t klen = 0, vlen = 0;
    int rc;

    if (!json_object_is_type(e, json_type_object))
        return TERN_EPROTO;
    rc = get_obj(e, "key", json_type_string, &k);
    if (rc == 0 && !k)
        rc = TERN_EPROTO;
    if (rc == 0)
        rc = get_obj(e, "value", json_type_string, &v);
    if (rc == 0)
        rc = unb64(json_object_get_string(k), (size_t)json_object_get_string_len(k), &key, &klen);
    if (rc == 0 && (klen == 0 || klen > CL_KEY_MAX))
        rc = TERN_EPROTO;
    if (rc == 0 && v)
        rc = unb64(json_object_get_string(v), (size_t)json_object_get_string_len(v), &val,
                   &vlen);
    if (rc == 0)
        rc = get_i64(e, "create_revision", &kv.create_rev);
    if (rc == 0)
        rc = get_i64(e, "mod_revision", &kv.mod_rev);
    if (rc == 0)
        rc = get_i64(e, "version", &kv.version);
    if (rc == 0)
        rc = get_i64(e, "lease", &kv.lease);
    if (rc == 0 && fn) {
        kv.key = (const char *)key;
        kv.key_len = klen;
        kv.value = val ? val : (const uint8_t *)"";
        kv.value_len = vlen;
        rc = fn(arg, &kv);
    }
    free(key);
    free(val);
    return rc;
}

static int kvs_walk(json_object *o, cl_kv_fn fn, void *arg)
{
    json_object *kvs;
    int rc = get_obj(o, "kvs", json_type_array, &kvs);

    for (size_t i = 0; rc == 0 && kvs && i < json_object_array_length(kvs); i++)
        rc = kv_one(json_object_array_get_idx(kvs, i), fn, arg);
    return rc;
}

int cl_answer_header(const char *body, size_t len, int64_t *rev)
{
    json_object *o = parse(body, len);
    int rc = o ? header_rev(o, rev) : TERN_EPROTO;

    json_object_put(o);
    return rc;
}

int cl_answer_range(const char *body, size_t len, cl_kv_fn fn, void *arg, int64_t *rev)
{
    json_object *o = parse(body, len);
    int rc = o ? header_rev(o, rev) : TERN_EPROTO;

    if (rc == 0)
        rc = kvs_walk(o, fn, arg);
    json_object_put(o);
    return rc;
}

int cl_answer_delete(const char *body, size_t len, int64_t *deleted)
{
    json_object *o = parse(body, len);
    int64_t n = 0;
    int rc = o ? header_rev(o, NULL) : TERN_EPROTO;

    if (rc == 0)
        rc = get_i64(o, "deleted", &n);
    if (rc == 0 && n < 0)
        rc = TERN_EPROTO;
    if (rc == 0 && deleted)
        *deleted = n;
    json_object_put(o);
    return rc;
}

int cl_answer_lease(const char *body, size_t len, int64_t *id, int64_t *ttl)
{
    json_object *o = parse(body, len), *res;
    int rc = o ? 0 : TERN_EPROTO;

    /* A keepalive is a stream: each answer comes as {"result": ...}. */
    if (rc == 0)
        rc = get_obj(o, "result", json_type_object, &res);
    if (rc == 0 && !res)
        res = o;
    if (rc == 0)
        rc = header_rev(res, NULL);
    if (rc == 0)
        rc = get_i64(res, "ID", id);
    if (rc == 0)
        rc = get_i64(res, "TTL", ttl);
    if (rc == 0 && *ttl < 0)
        rc = TERN_EPROTO;
    json_object_put(o);
    return rc;
}

int cl_answer_txn(const char *body, size_t len, bool *succeeded, cl_kv_fn fn, void *arg)
{
    json_object *o = parse(body, len), *ok, *resp;
    int rc = o ? header_rev(o, NULL) : TERN_EPROTO;

    if (rc == 0)
        rc = get_obj(o, "succeeded", json_type_boolean, &ok);
    if (rc == 0)
        *succeeded = ok && json_object_get_boolean(ok);
    if (rc == 0)
        rc = get_obj(o, "responses", json_type_array, &resp);
    for (size_t i = 0; rc == 0 && resp && i < json_object_array_length(resp); i++) {
        json_object *r = json_object_array_get_idx(resp, i), *range;

        if (!json_object_is_type(r, json_type_object)) {
            rc = TERN_EPROTO;
            break;
        }
        rc = get_obj(r, "response_range", json_type_object, &range);
        if (rc == 0 && range)
            rc = kvs_walk(range, fn, arg);
    }
    json_object_put(o);
    return rc;
}

int cl_answer_error(const char *body, size_t len, char *msg, size_t msg_len)
{
    json_object *o = parse(body, len), *err, *m = NULL;
    int rc = o ? 0 : TERN_EPROTO;

    if (msg_len)
        msg[0] = 0;
    /* A call: {"error": "...", "message": "...", "code": n}; a stream:
     * {"error": {"grpc_code": n, "message": "..."}}. */
    if (rc == 0 && !json_object_object_get_ex(o, "error", &err))
        rc = TERN_EPROTO;
    if (rc == 0 && json_object_is_type(err, json_type_object))
        rc = get_obj(err, "message", json_type_string, &m);
    else if (rc == 0 && json_object_is_type(err, json_type_string))
        rc = get_obj(o, "message", json_type_string, &m);
    else if (rc == 0)
        rc = TERN_EPROTO;
    if (rc == 0 && !m)
        m = json_object_is_type(err, json_type_string) ? err : NULL;
    if (rc == 0 && !m)
        rc = TERN_EPROTO;
    if (rc == 0 && msg_len)
        snprintf(msg, msg_len, "%s", json_object_get_string(m));
    json_object_put(o);
    return rc;
}
