/* Retryable writes' records (doc_store_internal.h: doc_txn_*): a session's
 * last write, so that a driver retrying it (on this node or on the next
 * primary, which has the record by replication) gets the first answer
 * again instead of running it twice.
 *
 * One record per session: key "S" + the session's 16-byte id, value
 * {t: txnNumber, at: last use (wall clock), r: the reply}. In DRAM a map
 * from id to where the record is, as for documents. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "doc_store_internal.h"
#include "error.h"

static void key_of(struct doc_buf *b, const uint8_t lsid[16])
{
    uint8_t c = DOC_REC_SESSION;

    doc_buf_reset(b);
    doc_buf_add(b, &c, 1);
    doc_buf_add(b, lsid, 16);
}

static struct doc_sess *find(struct doc_store *s, const uint8_t lsid[16])
{
    uint64_t v;

    return doc_bt_find(&s->sessions, lsid, 16, &v) ? (struct doc_sess *)(uintptr_t)v : NULL;
}

bool doc_txn_parse(const void *val, uint32_t len, int64_t *txn, int64_t *at, bson_t *reply)
{
    bson_t v;
    bson_iter_t it;
    const uint8_t *d;
    uint32_t dl;

    if (!bson_init_static(&v, val, len) || !bson_validate(&v, BSON_VALIDATE_NONE, NULL) ||
        !bson_iter_init_find(&it, &v, "t") || !BSON_ITER_HOLDS_INT64(&it))
        return false;
    *txn = bson_iter_int64(&it);
    *at = bson_iter_init_find(&it, &v, "at") && BSON_ITER_HOLDS_DATE_TIME(&it)
              ? bson_iter_date_time(&it) : 0;
    if (!bson_iter_init_find(&it, &v, "r") || !BSON_ITER_HOLDS_DOCUMENT(&it))
        return false;
    bson_iter_document(&it, &dl, &d);
    return bson_init_static(reply, d, dl);
}

bool doc_txn_full(const struct doc_store *s)
{
    return s->n_sessions >= DOC_SESSIONS_MAX;
}

int doc_txn_get(struct doc_store *s, const uint8_t lsid[16], int64_t *txn, bson_t *reply)
{
    struct doc_sess *x = find(s, lsid);
    const struct pm_rec *r;
    int64_t at;

    if (!x)
        return 0;
    r = pm_rec_at(s->pool, x->loc);
    return doc_txn_parse(pm_rec_val(r), r->val_len, txn, &at, reply) ? 1 : 0;
}

/* Write a session's record (val: its value, whole) and point the map at
 * it. */
int doc_txn_write(struct doc_store *s, const uint8_t lsid[16], const void *val, uint32_t len,
                  int64_t at, struct doc_err *e)
{
    struct doc_sess *x = find(s, lsid);
    pm_loc loc;

    if (!x && s->n_sessions >= DOC_SESSIONS_MAX)
        return doc_errf(e, DOC_TooManyLogicalSessions,
                        "cannot record a retryable write: %u sessions are recorded already",
                        s->n_sessions);
    key_of(&s->ka, lsid);
    if (doc_rec_append(s, PM_VALUE, &s->ka, val, len, &loc, e) < 0)
        return -1;
    if (x) {
        pm_dead(s->pool, x->loc);
        x->n_old++;
        x->loc = loc;
        x->at = at;
        return 0;
    }
    x = malloc(sizeof(*x));
    if (!x || doc_bt_insert(&s->sessions, lsid, 16, (uint64_t)(uintptr_t)x, NULL) != 1) {
        /* The record is written: a restart finds it. */
        free(x);
        return doc_errf(e, DOC_ExceededMemoryLimit, "out of memory");
    }
    *x = (struct doc_sess){.loc = loc, .n_old = doc_tomb_take(s, &s->ka), .at = at};
    s->n_sessions++;
    return 0;
}

static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int doc_txn_put(struct doc_store *s, const uint8_t lsid[16], int64_t txn, const bson_t *reply,
                struct doc_err *e)
{
    bson_t v = BSON_INITIALIZER;
    int64_t at = wall_ms();
    int rc;

    BSON_APPEND_INT64(&v, "t", txn);
    BSON_APPEND_DATE_TIME(&v, "at", at);
    BSON_APPEND_DOCUMENT(&v, "r", reply);
    rc = doc_txn_write(s, lsid, bson_get_data(&v), v.len, at, e);
    bson_destroy(&v);
    return rc;
}

int doc_txn_drop(struct doc_store *s, const uint8_t lsid[16], struct doc_err *e)
{
    struct doc_sess *x = find(s, lsid);
    pm_loc loc;

    key_of(&s->ka, lsid);
    if (doc_rec_append(s, PM_TOMBSTONE, &s->ka, NULL, 0, &loc, e) < 0)
        return -1;
    if (!x)
        return doc_tomb_put(s, &s->ka, loc, doc_tomb_take(s, &s->ka));
    pm_dead(s->pool, x->loc);
    doc_bt_remove(&s->sessions, lsid, 16, NULL);
    s->n_sessions--;
    doc_tomb_put(s, &s->ka, loc, x->n_old + 1);
    free(x);
    return 0;
}

unsigned doc_txn_expire(struct doc_store *s, int64_t older_than_ms, unsigned budget)
{
    unsigned dropped = 0;

    /* A walk over the map that goes on where the last one stopped. */
    while (budget--) {
        struct doc_bt_pos p;
        struct doc_sess *x;
        uint8_t id[16];
        size_t len;
        int i;

        if (!doc_bt_seek(&s->sessions, s->expire_at, 16, false, &p)) {
            memset(s->expire_at, 0, 16);
            break;
        }
        memcpy(id, doc_bt_key(&p, &len), 16);
        x = (struct doc_sess *)(uintptr_t)doc_bt_val(&p);
        memcpy(s->expire_at, id, 16);
        for (i = 15; i >= 0 && ++s->expire_at[i] == 0; i--)
            ;
        if (x->at < older_than_ms && doc_txn_drop(s, id, &(struct doc_err){0}) == 0)
            dropped++;
        if (i < 0)
            break;      /* past the last possible id: start over next time */
    }
    return dropped;
}
