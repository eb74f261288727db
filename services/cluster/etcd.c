/* etcd's v3 JSON gateway over HTTP (libcurl): one POST per call, the
 * endpoints tried in turn, the answer bounded in time and in size.
 * etcd_json.c builds the bodies and reads the answers. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "error.h"
#include "etcd.h"

#define EP_MAX 8
#define URL_MAX 256

struct cl_etcd {
    CURL *curl;
    char *ep[EP_MAX];
    unsigned n_ep, first;       /* the one that answered last goes first */
    unsigned timeout_ms;
    char *buf;                  /* the answer being read */
    size_t len, cap;
    bool too_big;
    char err[URL_MAX + 320];     /* a URL and a reason */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

int cl_etcd_open(const char *endpoints, unsigned timeout_ms, struct cl_etcd **out)
{
    struct cl_etcd *e;
    const char *p = endpoints;

    if (!endpoints || !*endpoints || !out)
        return TERN_EINVAL;
    pthread_once(&curl_once, curl_init);
    e = calloc(1, sizeof(*e));
    if (!e)
        return TERN_ENOMEM;
    e->timeout_ms = timeout_ms ? timeout_ms : 2000;
    while (*p) {
        size_t n = strcspn(p, ",");

        /* http:// only: the gateway this speaks to, on a private network
         * (etcd's own TLS would need its certificates configured here). */
        if (e->n_ep == EP_MAX || n < 8 || n >= URL_MAX || strncmp(p, "http://", 7) != 0 ||
            memchr(p, ' ', n) || !(e->ep[e->n_ep] = strndup(p, n))) {
            cl_etcd_close(e);
            return TERN_EINVAL;
        }
        /* No trailing slash: paths are appended. */
        if (e->ep[e->n_ep][n - 1] == '/')
            e->ep[e->n_ep][n - 1] = 0;
        e->n_ep++;
        p += n;
        if (*p == ',')
            p++;
    }
    e->curl = e->n_ep ? curl_easy_init() : NULL;
    if (!e->curl) {
        cl_etcd_close(e);
        return e->n_ep ? TERN_ENOMEM : TERN_EINVAL;
    }
    *out = e;
    return 0;
}

void cl_etcd_close(struct cl_etcd *e)
{
    if (!e)
        return;
    if (e->curl)
        curl_easy_cleanup(e->curl);
    for (unsigned i = 0; i < e->n_ep; i++)
        free(e->ep[i]);
    free(e->buf);
    free(e);
}

const char *cl_etcd_error(const struct cl_etcd *e)
{
    return e->err;
}

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    struct cl_etcd *e = arg;
    size_t add = size * n;

    if (e->len + add > CL_ANSWER_MAX) {
        e->too_big = true;
        return 0;       /* libcurl stops the transfer */
    }
    if (e->len + add + 1 > e->cap) {
        size_t cap = e->cap ? e->cap : 4096;
        char *b;

        while (cap < e->len + add + 1)
            cap *= 2;
        b = realloc(e->buf, cap);
        if (!b)
            return 0;
        e->buf = b;
        e->cap = cap;
    }
    memcpy(e->buf + e->len, p, add);
    e->len += add;
    e->buf[e->len] = 0;
    return add;
}

/* POST `body` to `path` on the first endpoint that answers. 0 with the
 * answer in e->buf/e->len (HTTP 200), TERN_EIO with etcd's message in
 * e->err (an error answer), or why none answered. */
static int post(struct cl_etcd *e, const char *path, char *body)
{
    struct curl_slist *hdr = NULL;
    int rc = TERN_ECONNREFUSED;

    e->err[0] = 0;
    if (!body)
        return TERN_ENOMEM;
    hdr = curl_slist_append(hdr, "Content-Type: application/json");
    for (unsigned k = 0; k < e->n_ep; k++) {
        unsigned i = (e->first + k) % e->n_ep;
        char url[URL_MAX + 64];
        long status = 0;
        CURLcode cc;

        snprintf(url, sizeof(url), "%s%s", e->ep[i], path);
        e->len = 0;
        e->too_big = false;
        curl_easy_reset(e->curl);
        curl_easy_setopt(e->curl, CURLOPT_URL, url);
        curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http");
        curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, e);
        curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
        curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
        curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
        cc = curl_easy_perform(e->curl);
        if (cc == CURLE_OK)
            curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
        if (cc == CURLE_OK && status == 200) {
            e->first = i;
            rc = 0;
            break;
        }
        if (cc == CURLE_OK) {
            /* etcd answered: an error of the request, not of this
             * endpoint (another would say the same). */
            e->first = i;
            if (cl_answer_error(e->buf ? e->buf : "", e->len, e->err, sizeof(e->err)) != 0)
                snprintf(e->err, sizeof(e->err), "%s: HTTP %ld", url, status);
            rc = TERN_EIO;
            break;
        }
        if (e->too_big) {
            snprintf(e->err, sizeof(e->err), "%s: an answer over %u bytes", url,
                     CL_ANSWER_MAX);
            rc = TERN_EPROTO;
            break;
        }
        /* This endpoint is down or slow: the next one. The call fails
         * with ETIMEDOUT if any of them timed out, else ECONNREFUSED. */
        snprintf(e->err, sizeof(e->err), "%s: %s", url, curl_easy_strerror(cc));
        if (cc == CURLE_OPERATION_TIMEDOUT)
            rc = TERN_ETIMEDOUT;
    }
    curl_slist_free_all(hdr);
    free(body);
    return rc;
}

static int answered(struct cl_etcd *e, int rc)
{
    if (rc == TERN_EPROTO && !e->err[0])
        snprintf(e->err, sizeof(e->err), "an answer that is not etcd's");
    return rc;
}

static bool key_ok(const char *key)
{
    return key && *key && strlen(key) <= CL_KEY_MAX;
}

int cl_etcd_put(struct cl_etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                int64_t *rev)
{
    int rc;

    if (!key || !*key)
        return TERN_EINVAL;
    if (!key_ok(key) || len > CL_VALUE_MAX)
        return TERN_E2BIG;
    rc = post(e, "/v3/kv/put", cl_json_put(key, val, len, lease));
    if (rc == 0)
        rc = answered(e, cl_answer_header(e->buf, e->len, rev));
    return rc;
}

int cl_etcd_get(struct cl_etcd *e, const char *key, bool prefix, cl_kv_fn fn, void *arg,
                int64_t *rev)
{
    int rc;

    if (!key_ok(key))
        return key && *key ? TERN_E2BIG : TERN_EINVAL;
    rc = post(e, "/v3/kv/range", cl_json_range(key, prefix));
    if (rc == 0)
        rc = answered(e, cl_answer_range(e->buf, e->len, fn, arg, rev));
    return rc;
}

int cl_etcd_delete(struct cl_etcd *e, const char *key, bool prefix, int64_t *deleted)
{
    int rc;

    if (!key_ok(key))
        return key && *key ? TERN_E2BIG : TERN_EINVAL;
    rc = post(e, "/v3/kv/deleterange", cl_json_delete(key, prefix));
    if (rc == 0)
        rc = answered(e, cl_answer_delete(e->buf, e->len, deleted));
    return rc;
}

int cl_etcd_lease_grant(struct cl_etcd *e, int64_t ttl_s, int64_t *id)
{
    int64_t ttl = 0;
    int rc;

    if (ttl_s <= 0 || !id)
        return TERN_EINVAL;
    rc = post(e, "/v3/lease/grant", cl_json_lease_ttl(ttl_s));
    if (rc == 0)
        rc = answered(e, cl_answer_lease(e->buf, e->len, id, &ttl));
    if (rc == 0 && (*id == 0 || ttl <= 0))
        rc = answered(e, TERN_EPROTO);
    return rc;
}

int cl_etcd_lease_keepalive(struct cl_etcd *e, int64_t id, int64_t *ttl_s)
{
    int64_t got = 0, ttl = 0;
    int rc = post(e, "/v3/lease/keepalive", cl_json_lease_id(id));

    if (rc == 0)
        rc = answered(e, cl_answer_lease(e->buf, e->len, &got, &ttl));
    /* An expired lease comes back with no time left. */
    if (rc == 0 && ttl == 0) {
        snprintf(e->err, sizeof(e->err), "lease %llx has expired", (unsigned long long)id);
        rc = TERN_ENOLEASE;
    }
    if (rc == TERN_EIO && strstr(e->err, "lease not found"))
        rc = TERN_ENOLEASE;
    if (rc == 0 && ttl_s)
        *ttl_s = ttl;
    return rc;
}

int cl_etcd_lease_revoke(struct cl_etcd *e, int64_t id)
{
    int rc = post(e, "/v3/lease/revoke", cl_json_lease_id(id));

    if (rc == 0)
        rc = answered(e, cl_answer_header(e->buf, e->len, NULL));
    if (rc == TERN_EIO && strstr(e->err, "lease not found"))
        rc = TERN_ENOLEASE;
    return rc;
}

static int txn(struct cl_etcd *e, const char *key, bool create, int64_t mod_rev, const void *val,
               size_t len, int64_t lease, bool *done, cl_kv_fn fn, void *arg)
{
    int rc;

    if (!key_ok(key) || len > CL_VALUE_MAX || !done)
        return key && *key && done ? TERN_E2BIG : TERN_EINVAL;
    rc = post(e, "/v3/kv/txn", cl_json_txn_put(key, create, mod_rev, val, len, lease));
    if (rc == 0)
        rc = answered(e, cl_answer_txn(e->buf, e->len, done, fn, arg));
    return rc;
}

int cl_etcd_create(struct cl_etcd *e, const char *key, const void *val, size_t len,
                   int64_t lease, bool *created, cl_kv_fn fn, void *arg)
{
    if (created)
        *created = false;
    return txn(e, key, true, 0, val, len, lease, created, fn, arg);
}

int cl_etcd_cas(struct cl_etcd *e, const char *key, int64_t mod_rev, const void *val,
                size_t len, int64_t lease, bool *swapped)
{
    if (swapped)
        *swapped = false;
    return txn(e, key, mod_rev == 0, mod_rev, val, len, lease, swapped, NULL, NULL);
}
