/* The block feed (bs_feed.h): subscribers as positions in the log. */
#include "bs_feed.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

struct sub {
    struct tern_session *s;
    uint64_t id;
    uint64_t next;
    uint64_t seen_ns;
    uint32_t flags;
};

struct bs_feed {
    struct bs_store *st;
    struct sub *subs;                /* BS_FEED_MAX, the first n in use */
    unsigned n;
    uint64_t next_id;
};

struct bs_feed *bs_feed_new(struct bs_store *st)
{
    struct bs_feed *f = calloc(1, sizeof(*f));

    if (!f)
        return NULL;
    f->subs = calloc(BS_FEED_MAX, sizeof(*f->subs));
    if (!f->subs) {
        free(f);
        return NULL;
    }
    f->st = st;
    f->next_id = 1;
    return f;
}

void bs_feed_free(struct bs_feed *f)
{
    if (!f)
        return;
    free(f->subs);
    free(f);
}

unsigned bs_feed_count(const struct bs_feed *f)
{
    return f ? f->n : 0;
}

void bs_feed_session_closed(struct bs_feed *f, struct tern_session *s)
{
    for (unsigned i = 0; i < f->n;)
        if (f->subs[i].s == s)
            f->subs[i] = f->subs[--f->n];
        else
            i++;
}

static struct sub *find(struct bs_feed *f, struct tern_session *s, uint64_t id)
{
    for (unsigned i = 0; i < f->n; i++)
        if (f->subs[i].id == id && f->subs[i].s == s)
            return &f->subs[i];
    return NULL;
}

/* Does block h-1 have id `parent` (zeros: no check)? */
static bool follows(struct bs_feed *f, uint64_t h, const uint8_t parent[BS_ID_LEN])
{
    static const uint8_t zero[BS_ID_LEN];
    uint8_t id[BS_ID_LEN];

    if (!memcmp(parent, zero, BS_ID_LEN))
        return true;
    return h > 0 && bs_store_id(f->st, h - 1, id) == 0 && !memcmp(id, parent, BS_ID_LEN);
}

int bs_feed_on_subscribe(struct bs_feed *f, struct tern_req *req, const void *data, size_t len)
{
    struct tern_session *s = tern_req_session(req);
    uint64_t head = bs_store_committed(f->st);
    struct bs_sub_req q;
    struct bs_sub_rep *rep;
    const char *why;
    unsigned mine = 0;
    struct sub *sb;

    if (bs_sub_req_decode(data, len, &q, &why) < 0)
        return TERN_EPROTO;
    for (unsigned i = 0; i < f->n; i++)
        mine += f->subs[i].s == s;
    if (f->n == BS_FEED_MAX || mine >= BS_FEED_PER_SESSION)
        return TERN_ENOSPC;
    rep = tern_reply_alloc(req, sizeof(*rep));
    if (!rep)
        return TERN_EMSGSIZE;
    *rep = (struct bs_sub_rep){.head = head};
    switch (q.from) {
    case BS_FROM_HEIGHT:
        /* A height up to the head must follow the parent it names; one
         * past it waits for the head to come, and is checked then. */
        if (q.height <= head && !follows(f, q.height, q.parent)) {
            rep->refusal = BS_R_FORKED;
            return 0;
        }
        rep->next = q.height;
        break;
    case BS_FROM_NEXT:
        rep->next = head;
        break;
    default:
        rep->next = head ? head - 1 : 0;
        break;
    }
    sb = &f->subs[f->n++];
    *sb = (struct sub){.s = s, .id = f->next_id++, .next = rep->next, .flags = q.flags,
                       .seen_ns = tern_now_ns()};
    rep->sub = sb->id;
    return 0;
}

int bs_feed_on_feed(struct bs_feed *f, struct tern_req *req, const void *data, size_t len)
{
    struct tern_session *s = tern_req_session(req);
    uint64_t head = bs_store_committed(f->st);
    size_t room = tern_reply_max(req), used = sizeof(struct bs_feed_rep);
    struct bs_feed_req q;
    struct bs_feed_rep *rep;
    const char *why;
    struct sub *sb;
    uint8_t *out;
    uint64_t h;

    if (bs_feed_req_decode(data, len, &q, &why) < 0)
        return TERN_EPROTO;
    sb = find(f, s, q.sub);
    if (!sb)
        return TERN_ENOENT;
    if (room > (size_t)q.max_bytes + used)
        room = (size_t)q.max_bytes + used;
    rep = tern_reply_alloc(req, room);
    if (!rep)
        return TERN_EMSGSIZE;
    *rep = (struct bs_feed_rep){.head = head, .next = q.next, .flags = sb->flags};
    sb->seen_ns = tern_now_ns();
    /* The acknowledgement: everything below q.next. Its parent check
     * catches a chain cut back and replaced under the subscriber. */
    sb->next = q.next;
    if (q.next > head) {             /* it waits for the head to come */
        tern_reply_set_len(req, used);
        return 0;
    }
    if (q.next && !follows(f, q.next, q.parent)) {
        rep->refusal = BS_R_FORKED;
        tern_reply_set_len(req, used);
        return 0;
    }
    out = (uint8_t *)(rep + 1);
    for (h = q.next; h < head && rep->n < q.credits; h++) {
        const uint8_t *b;
        size_t bl, need;
        int rc = bs_store_block(f->st, h, &b, &bl);

        if (rc < 0)
            return rc;
        need = sb->flags & BS_SUB_HEADERS ? BS_HDR_SIZE : 4 + bl;
        if (used + need > room)
            break;
        if (sb->flags & BS_SUB_HEADERS) {
            memcpy(out, b, BS_HDR_SIZE);
        } else {
            uint32_t l = (uint32_t)bl;
            memcpy(out, &l, 4);
            memcpy(out + 4, b, bl);
        }
        out += need;
        used += need;
        rep->n++;
    }
    if (rep->n == 0 && q.next < head)
        return TERN_EMSGSIZE;        /* one block is more than it lets us send */
    tern_reply_set_len(req, used);
    return 0;
}

int bs_feed_on_stats(struct bs_feed *f, struct tern_req *req, const void *data, size_t len)
{
    uint64_t head = bs_store_committed(f->st), now = tern_now_ns();
    size_t room = tern_reply_max(req);
    struct bs_feed_stats_rep *rep;
    struct bs_sub_stat *ss;
    unsigned n = f->n;

    (void)data;
    if (len)
        return TERN_EPROTO;
    if (room < sizeof(*rep))
        return TERN_EMSGSIZE;
    if (n > (room - sizeof(*rep)) / sizeof(*ss))
        n = (unsigned)((room - sizeof(*rep)) / sizeof(*ss));
    rep = tern_reply_alloc(req, sizeof(*rep) + n * sizeof(*ss));
    *rep = (struct bs_feed_stats_rep){.head = head, .n = n};
    ss = (struct bs_sub_stat *)(rep + 1);
    for (unsigned i = 0; i < n; i++) {
        const struct sub *sb = &f->subs[i];
        ss[i] = (struct bs_sub_stat){.sub = sb->id, .next = sb->next,
                                     .lag = head > sb->next ? head - sb->next : 0,
                                     .idle_ns = now - sb->seen_ns};
    }
    return 0;
}

/* ---- client ---- */

#define SUB_TIMEOUT_NS 10000000000ull

static int sub_call(struct bs_feed_sub *sub, const struct bs_sub_req *q)
{
    struct bs_sub_rep rep;
    size_t got = 0;
    const char *why;
    int rc = tern_call_sync(sub->s, BS_SERVICE_ID, BS_M_SUBSCRIBE, q, sizeof(*q), &rep,
                            sizeof(rep), &got, sub->timeout_ns);

    if (rc < 0)
        return rc;
    if (bs_sub_rep_decode(&rep, got, &rep, &why) < 0)
        return TERN_EPROTO;
    if (rep.refusal == BS_R_FORKED)
        return TERN_EFORKED;
    if (q->from == BS_FROM_HEIGHT && rep.next != q->height)
        return TERN_EPROTO;
    sub->id = rep.sub;
    sub->head = rep.head;
    if (q->from != BS_FROM_HEIGHT || rep.next != sub->next) {
        sub->next = rep.next;
        sub->have_last = false;      /* the first block given is taken as it comes */
    }
    return 0;
}

int bs_feed_subscribe(struct bs_feed_sub *sub, struct tern_session *s, enum bs_from from,
                      uint64_t height, const uint8_t *parent, uint32_t flags, uint32_t credits,
                      size_t max_msg)
{
    struct bs_sub_req q = {.from = from, .flags = flags, .height = height};
    int rc;

    memset(sub, 0, sizeof(*sub));
    sub->s = s;
    sub->flags = flags;
    sub->credits = credits ? credits : 64;
    sub->cap = max_msg ? max_msg : 1u << 20;
    sub->max_bytes = (uint32_t)(sub->cap - sizeof(struct bs_feed_rep));
    sub->timeout_ns = SUB_TIMEOUT_NS;
    sub->buf = malloc(sub->cap);
    sub->hs = bs_hasher_new();
    if (!sub->buf || !sub->hs) {
        bs_feed_sub_free(sub);
        return TERN_ENOMEM;
    }
    sub->next = height;
    if (parent && height) {
        memcpy(q.parent, parent, BS_ID_LEN);
        memcpy(sub->last, parent, BS_ID_LEN);
        sub->have_last = true;
    }
    rc = sub_call(sub, &q);
    if (rc < 0)
        bs_feed_sub_free(sub);       /* a failed subscribe holds nothing */
    return rc;
}

int bs_feed_resume(struct bs_feed_sub *sub, struct tern_session *s)
{
    struct bs_sub_req q = {.from = BS_FROM_HEIGHT, .flags = sub->flags, .height = sub->next};

    if (sub->have_last)
        memcpy(q.parent, sub->last, BS_ID_LEN);
    sub->s = s;
    return sub_call(sub, &q);
}

struct walk {
    struct bs_feed_sub *sub;
    int (*fn)(void *arg, uint64_t height, const uint8_t *p, size_t len);
    void *arg;
    int n;
};

/* Each block must follow the one before: its height, its parent. */
static int take_one(void *arg, uint64_t height, const uint8_t *p, size_t len)
{
    struct walk *w = arg;
    struct bs_feed_sub *sub = w->sub;
    struct bs_header h;
    const char *why;
    uint8_t id[BS_ID_LEN];
    int rc;

    if (height != sub->next || bs_header_decode(p, len, &h, &why) < 0 || h.height != height ||
        (!(sub->flags & BS_SUB_HEADERS) && len != BS_HDR_SIZE + (size_t)h.body_len))
        return TERN_EPROTO;
    if (sub->have_last && memcmp(h.parent, sub->last, BS_ID_LEN))
        return TERN_EPROTO;
    if ((rc = bs_header_id(sub->hs, p, id)) < 0)
        return rc;
    if ((rc = w->fn(w->arg, height, p, len)) < 0)
        return rc;
    memcpy(sub->last, id, BS_ID_LEN);
    sub->have_last = true;
    sub->next = height + 1;
    w->n++;
    return 0;
}

int bs_feed_poll(struct bs_feed_sub *sub,
                 int (*fn)(void *arg, uint64_t height, const uint8_t *p, size_t len), void *arg)
{
    struct bs_feed_req q = {.sub = sub->id, .next = sub->next, .credits = sub->credits,
                            .max_bytes = sub->max_bytes};
    struct bs_feed_rep rep;
    struct walk w = {.sub = sub, .fn = fn, .arg = arg};
    size_t got = 0;
    const char *why;
    int rc;

    if (sub->have_last)
        memcpy(q.parent, sub->last, BS_ID_LEN);
    rc = tern_call_sync(sub->s, BS_SERVICE_ID, BS_M_FEED, &q, sizeof(q), sub->buf, sub->cap,
                        &got, sub->timeout_ns);
    if (rc < 0)
        return rc;
    rc = bs_feed_rep_decode(sub->buf, got, &rep, take_one, &w, &why);
    if (rc < 0)
        return rc;
    if (rep.refusal == BS_R_FORKED)
        return TERN_EFORKED;
    if (rep.n && rep.next != q.next)
        return TERN_EPROTO;
    sub->head = rep.head;
    return w.n;
}

void bs_feed_sub_free(struct bs_feed_sub *sub)
{
    free(sub->buf);
    bs_hasher_free(sub->hs);
    sub->buf = NULL;
    sub->hs = NULL;
}
