#include <stdlib.h>
#include <string.h>

#include "doc_btree.h"
#include "error.h"

struct doc_bt_node {
    bool leaf;
    unsigned n;                          /* entries (leaf) or separators (inner) */
    struct doc_bt_node *next, *prev;     /* leaves: the chain */
    uint8_t *keys[DOC_BT_FANOUT];
    uint32_t klen[DOC_BT_FANOUT];
    union {
        uint64_t vals[DOC_BT_FANOUT];
        struct doc_bt_node *kids[DOC_BT_FANOUT + 1];
    };
};

/* Nodes and the leaf's separator an insert may need, taken before the
 * tree changes, so that running out of memory leaves it as it was. */
struct bt_pre {
    struct doc_bt_node *nodes[24];
    unsigned n;
    uint8_t *sep;
    uint32_t seplen;
};

static struct doc_bt_node *take(struct bt_pre *pre, bool leaf)
{
    struct doc_bt_node *n = pre->nodes[--pre->n];

    n->leaf = leaf;
    return n;
}

static int kcmp(const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);

    return c ? c : (al > bl) - (al < bl);
}

static struct doc_bt_node *node_new(struct doc_bt *t, bool leaf)
{
    struct doc_bt_node *n = calloc(1, sizeof(*n));

    if (n) {
        n->leaf = leaf;
        t->bytes += sizeof(*n);
    }
    return n;
}

static uint8_t *kdup(struct doc_bt *t, const void *key, size_t len)
{
    uint8_t *k = malloc(len ? len : 1);

    if (k) {
        memcpy(k, key, len);
        t->bytes += len;
    }
    return k;
}

void doc_bt_init(struct doc_bt *t)
{
    memset(t, 0, sizeof(*t));
}

static void node_free(struct doc_bt_node *n)
{
    if (!n)
        return;
    for (unsigned i = 0; i < n->n; i++)
        free(n->keys[i]);
    if (!n->leaf)
        for (unsigned i = 0; i <= n->n; i++)
            node_free(n->kids[i]);
    free(n);
}

void doc_bt_free(struct doc_bt *t)
{
    node_free(t->root);
    doc_bt_init(t);
}

/* First slot whose key is >= key (lower bound) in a node. */
static unsigned lower(const struct doc_bt_node *n, const uint8_t *key, size_t len)
{
    unsigned lo = 0, hi = n->n;

    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;

        if (kcmp(n->keys[mid], n->klen[mid], key, len) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The child of an inner node that holds key: separators <= key. */
static unsigned child_of(const struct doc_bt_node *n, const uint8_t *key, size_t len)
{
    unsigned lo = 0, hi = n->n;

    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;

        if (kcmp(n->keys[mid], n->klen[mid], key, len) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct doc_bt_node *leaf_of(const struct doc_bt *t, const uint8_t *key, size_t len)
{
    struct doc_bt_node *n = t->root;

    while (n && !n->leaf)
        n = n->kids[child_of(n, key, len)];
    return n;
}

/* Insert into the subtree at n. On a split, *right and its separator
 * (*sep, *seplen, owned by the caller now) come back. */
static int ins(struct doc_bt *t, struct bt_pre *pre, struct doc_bt_node *n, const uint8_t *key,
               size_t len, uint64_t val, uint64_t *old, struct doc_bt_node **right, uint8_t **sep,
               uint32_t *seplen)
{
    unsigned i, half = DOC_BT_FANOUT / 2;
    struct doc_bt_node *r, *kr = NULL;
    uint8_t *ksep = NULL;
    uint32_t ksl = 0;
    int rc;

    *right = NULL;
    if (n->leaf) {
        i = lower(n, key, len);
        if (i < n->n && kcmp(n->keys[i], n->klen[i], key, len) == 0) {
            if (old)
                *old = n->vals[i];
            return 0;
        }
        uint8_t *k = kdup(t, key, len);

        if (!k)
            return TERN_ENOMEM;
        if (n->n == DOC_BT_FANOUT) {
            r = take(pre, true);
            /* Move the upper half to r, then insert on the proper side. */
            memcpy(r->keys, n->keys + half, (DOC_BT_FANOUT - half) * sizeof(n->keys[0]));
            memcpy(r->klen, n->klen + half, (DOC_BT_FANOUT - half) * sizeof(n->klen[0]));
            memcpy(r->vals, n->vals + half, (DOC_BT_FANOUT - half) * sizeof(n->vals[0]));
            r->n = DOC_BT_FANOUT - half;
            n->n = half;
            r->next = n->next;
            if (r->next)
                r->next->prev = r;
            r->prev = n;
            n->next = r;
            struct doc_bt_node *into = i <= half ? n : r;

            if (into == r)
                i -= half;
            memmove(into->keys + i + 1, into->keys + i, (into->n - i) * sizeof(into->keys[0]));
            memmove(into->klen + i + 1, into->klen + i, (into->n - i) * sizeof(into->klen[0]));
            memmove(into->vals + i + 1, into->vals + i, (into->n - i) * sizeof(into->vals[0]));
            into->keys[i] = k;
            into->klen[i] = (uint32_t)len;
            into->vals[i] = val;
            into->n++;
            /* r's first key was n's keys[half]: pre->sep is its copy. */
            *sep = pre->sep;
            pre->sep = NULL;
            *seplen = r->klen[0];
            *right = r;
            return 1;
        }
        memmove(n->keys + i + 1, n->keys + i, (n->n - i) * sizeof(n->keys[0]));
        memmove(n->klen + i + 1, n->klen + i, (n->n - i) * sizeof(n->klen[0]));
        memmove(n->vals + i + 1, n->vals + i, (n->n - i) * sizeof(n->vals[0]));
        n->keys[i] = k;
        n->klen[i] = (uint32_t)len;
        n->vals[i] = val;
        n->n++;
        return 1;
    }
    i = child_of(n, key, len);
    rc = ins(t, pre, n->kids[i], key, len, val, old, &kr, &ksep, &ksl);
    if (rc <= 0 || !kr)
        return rc;
    /* The child split: add (ksep, kr) after kids[i]. */
    if (n->n == DOC_BT_FANOUT) {
        /* Split this inner node first: keys[half] goes up. */
        r = take(pre, false);
        r->n = DOC_BT_FANOUT - half - 1;
        memcpy(r->keys, n->keys + half + 1, r->n * sizeof(n->keys[0]));
        memcpy(r->klen, n->klen + half + 1, r->n * sizeof(n->klen[0]));
        memcpy(r->kids, n->kids + half + 1, (r->n + 1) * sizeof(n->kids[0]));
        *sep = n->keys[half];
        *seplen = n->klen[half];
        n->n = half;
        *right = r;
        struct doc_bt_node *into = i <= half ? n : r;

        if (into == r)
            i -= half + 1;
        n = into;
    }
    memmove(n->keys + i + 1, n->keys + i, (n->n - i) * sizeof(n->keys[0]));
    memmove(n->klen + i + 1, n->klen + i, (n->n - i) * sizeof(n->klen[0]));
    memmove(n->kids + i + 2, n->kids + i + 1, (n->n - i) * sizeof(n->kids[0]));
    n->keys[i] = ksep;
    n->klen[i] = ksl;
    n->kids[i + 1] = kr;
    n->n++;
    return 1;
}

int doc_bt_insert(struct doc_bt *t, const void *key, size_t len, uint64_t val, uint64_t *old)
{
    struct doc_bt_node *right = NULL, *n;
    struct bt_pre pre = {.n = 0};
    uint8_t *sep = NULL;
    uint32_t seplen = 0;
    unsigned full = 0;
    int rc;

    if (!t->root) {
        t->root = node_new(t, true);
        if (!t->root)
            return TERN_ENOMEM;
    }
    /* Full nodes on the way down, from the leaf up, each split once (and a
     * new root if they reach it); the leaf's split needs its separator. */
    for (n = t->root; ; n = n->kids[child_of(n, key, len)]) {
        full = n->n == DOC_BT_FANOUT ? full + 1 : 0;
        if (n->leaf)
            break;
    }
    if (full) {
        if (doc_bt_find(t, key, len, old))
            return 0;
        pre.seplen = n->klen[DOC_BT_FANOUT / 2];
        pre.sep = kdup(t, n->keys[DOC_BT_FANOUT / 2], pre.seplen);
        for (unsigned i = 0; pre.sep && i < full + 1; i++) {
            pre.nodes[pre.n] = node_new(t, true);
            if (!pre.nodes[pre.n])
                break;
            pre.n++;
        }
        if (!pre.sep || pre.n < full + 1) {
            rc = TERN_ENOMEM;
            goto out;
        }
    }
    rc = ins(t, &pre, t->root, key, len, val, old, &right, &sep, &seplen);
    if (right) {
        n = take(&pre, false);
        n->n = 1;
        n->keys[0] = sep;
        n->klen[0] = seplen;
        n->kids[0] = t->root;
        n->kids[1] = right;
        t->root = n;
    }
    if (rc > 0) {
        t->count++;
        t->gen++;
    }
out:
    while (pre.n) {
        t->bytes -= sizeof(struct doc_bt_node);
        free(pre.nodes[--pre.n]);
    }
    if (pre.sep) {
        t->bytes -= pre.seplen;
        free(pre.sep);
    }
    return rc;
}

bool doc_bt_remove(struct doc_bt *t, const void *key, size_t len, uint64_t *val)
{
    struct doc_bt_node *n = leaf_of(t, key, len);
    unsigned i;

    if (!n)
        return false;
    i = lower(n, key, len);
    if (i >= n->n || kcmp(n->keys[i], n->klen[i], key, len) != 0)
        return false;
    if (val)
        *val = n->vals[i];
    t->bytes -= n->klen[i];
    free(n->keys[i]);
    memmove(n->keys + i, n->keys + i + 1, (n->n - i - 1) * sizeof(n->keys[0]));
    memmove(n->klen + i, n->klen + i + 1, (n->n - i - 1) * sizeof(n->klen[0]));
    memmove(n->vals + i, n->vals + i + 1, (n->n - i - 1) * sizeof(n->vals[0]));
    n->n--;
    t->count--;
    t->gen++;
    return true;
}

bool doc_bt_find(const struct doc_bt *t, const void *key, size_t len, uint64_t *val)
{
    struct doc_bt_node *n = leaf_of(t, key, len);
    unsigned i;

    if (!n)
        return false;
    i = lower(n, key, len);
    if (i >= n->n || kcmp(n->keys[i], n->klen[i], key, len) != 0)
        return false;
    if (val)
        *val = n->vals[i];
    return true;
}

bool doc_bt_set(struct doc_bt *t, const void *key, size_t len, uint64_t val)
{
    struct doc_bt_node *n = leaf_of(t, key, len);
    unsigned i;

    if (!n)
        return false;
    i = lower(n, key, len);
    if (i >= n->n || kcmp(n->keys[i], n->klen[i], key, len) != 0)
        return false;
    n->vals[i] = val;
    return true;
}

/* Move p to the first entry at or after it, over emptied leaves. */
static bool settle_fwd(struct doc_bt_pos *p)
{
    while (p->leaf && p->i >= p->leaf->n) {
        p->leaf = p->leaf->next;
        p->i = 0;
    }
    return p->leaf != NULL;
}

bool doc_bt_seek(const struct doc_bt *t, const void *key, size_t len, bool after,
                 struct doc_bt_pos *p)
{
    struct doc_bt_node *n = t->root;

    if (!n)
        return false;
    if (!len && !after) {
        while (!n->leaf)
            n = n->kids[0];
        *p = (struct doc_bt_pos){n, 0};
        return settle_fwd(p);
    }
    n = leaf_of(t, key, len);
    p->leaf = n;
    p->i = lower(n, key, len);
    if (after && p->i < n->n && kcmp(n->keys[p->i], n->klen[p->i], key, len) == 0)
        p->i++;
    if (!settle_fwd(p))
        return false;
    /* An equal key in a later leaf (the separator itself) when `after`. */
    if (after && kcmp(p->leaf->keys[p->i], p->leaf->klen[p->i], key, len) == 0)
        return doc_bt_next(p);
    return true;
}

bool doc_bt_seek_rev(const struct doc_bt *t, const void *key, size_t len, bool before,
                     struct doc_bt_pos *p)
{
    struct doc_bt_node *n = t->root;
    unsigned i;

    if (!n)
        return false;
    if (!len && !before) {
        while (!n->leaf)
            n = n->kids[n->n];
        p->leaf = n;
        p->i = n->n;
        return doc_bt_prev(t, p);
    }
    n = leaf_of(t, key, len);
    i = lower(n, key, len);            /* first >= key */
    if (!before && i < n->n && kcmp(n->keys[i], n->klen[i], key, len) == 0)
        i++;                           /* include the equal one */
    p->leaf = n;
    p->i = i;
    return doc_bt_prev(t, p);
}

bool doc_bt_next(struct doc_bt_pos *p)
{
    p->i++;
    return settle_fwd(p);
}

bool doc_bt_prev(const struct doc_bt *t, struct doc_bt_pos *p)
{
    (void)t;
    while (p->leaf && p->i == 0) {
        p->leaf = p->leaf->prev;
        p->i = p->leaf ? p->leaf->n : 0;
    }
    if (!p->leaf)
        return false;
    p->i--;
    return true;
}

const uint8_t *doc_bt_key(const struct doc_bt_pos *p, size_t *len)
{
    *len = p->leaf->klen[p->i];
    return p->leaf->keys[p->i];
}

uint64_t doc_bt_val(const struct doc_bt_pos *p)
{
    return p->leaf->vals[p->i];
}
