/* Order-statistic skiplist of a sorted set; see zskip.h. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "zskip.h"

struct kvz_level {
    struct kvz_node *forward;
    uint64_t span;                   /* nodes stepped over by forward, itself included */
};

struct kvz_node {
    struct kvm_member *m;            /* NULL in the head */
    struct kvz_node *backward;       /* NULL in the first node: the head is no member */
    int height;                      /* kept so an update can relink the node as it is */
    struct kvz_level level[];
};

/* Fixed seed: levels repeat from run to run, which keeps tests and
 * benchmarks reproducible; nothing here needs unpredictability. */
static _Thread_local uint64_t rng = 0x9e3779b97f4a7c15ull;

/* 1 + the number of leading successes at p = 1/4: two bits per draw, and
 * one 64-bit draw holds the 31 tries the cap allows. */
static int random_level(void)
{
    uint64_t r;
    int lvl = 1;

    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    r = rng;
    while (lvl < KVZ_MAX_LEVEL && (r & 3) == 0) {
        lvl++;
        r >>= 2;
    }
    return lvl;
}

static struct kvz_node *node_new(int height, struct kvm_member *m)
{
    struct kvz_node *x = malloc(sizeof(*x) + (size_t)height * sizeof(x->level[0]));

    if (!x)
        return NULL;
    x->m = m;
    x->backward = NULL;
    x->height = height;
    for (int i = 0; i < height; i++) {
        x->level[i].forward = NULL;
        x->level[i].span = 0;
    }
    return x;
}

/* <0, 0, >0 as (sa, a) sorts before, with, after (sb, b). */
static int cmp(double sa, const struct kvm_member *a, double sb, const struct kvm_member *b)
{
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c;

    if (sa != sb)
        return sa < sb ? -1 : 1;
    c = memcmp(a->bytes, b->bytes, n);
    if (c)
        return c;
    return a->len < b->len ? -1 : a->len > b->len;
}

/* Whether node x sorts strictly before (score, m). */
static bool before(const struct kvz_node *x, double score, const struct kvm_member *m)
{
    return cmp(x->m->score, x->m, score, m) < 0;
}

/* The last node before (score, m) on every level in use, and in rank[i]
 * the number of nodes up to and including update[i] (the head counts 0). */
static void descend(const struct kvz_list *z, double score, const struct kvm_member *m,
                    struct kvz_node **update, uint64_t *rank)
{
    struct kvz_node *x = z->head;

    for (int i = z->level - 1; i >= 0; i--) {
        rank[i] = i == z->level - 1 ? 0 : rank[i + 1];
        while (x->level[i].forward && before(x->level[i].forward, score, m)) {
            rank[i] += x->level[i].span;
            x = x->level[i].forward;
        }
        update[i] = x;
    }
}

/* Link x (its member at its final score) after update[] from descend(). */
static void link_node(struct kvz_list *z, struct kvz_node *x, struct kvz_node **update,
                      uint64_t *rank)
{
    int lvl = x->height;

    if (lvl > z->level) {
        /* New levels start at the head and span the whole list, so the
         * span arithmetic below holds for them as for the others. */
        for (int i = z->level; i < lvl; i++) {
            rank[i] = 0;
            update[i] = z->head;
            update[i]->level[i].span = z->len;
        }
        z->level = lvl;
    }
    for (int i = 0; i < lvl; i++) {
        x->level[i].forward = update[i]->level[i].forward;
        update[i]->level[i].forward = x;
        x->level[i].span = update[i]->level[i].span - (rank[0] - rank[i]);
        update[i]->level[i].span = (rank[0] - rank[i]) + 1;
    }
    for (int i = lvl; i < z->level; i++)
        update[i]->level[i].span++;
    x->backward = update[0] == z->head ? NULL : update[0];
    if (x->level[0].forward)
        x->level[0].forward->backward = x;
    else
        z->tail = x;
    z->len++;
}

static void unlink_node(struct kvz_list *z, struct kvz_node *x, struct kvz_node **update)
{
    for (int i = 0; i < z->level; i++) {
        if (update[i]->level[i].forward == x) {
            update[i]->level[i].span += x->level[i].span - 1;
            update[i]->level[i].forward = x->level[i].forward;
        } else {
            update[i]->level[i].span--;
        }
    }
    if (x->level[0].forward)
        x->level[0].forward->backward = x->backward;
    else
        z->tail = x->backward;
    while (z->level > 1 && !z->head->level[z->level - 1].forward)
        z->level--;
    z->len--;
}

int kvz_init(struct kvz_list *z)
{
    memset(z, 0, sizeof(*z));
    z->head = node_new(KVZ_MAX_LEVEL, NULL);
    if (!z->head)
        return TERN_ENOMEM;
    z->level = 1;
    return 0;
}

void kvz_free(struct kvz_list *z)
{
    struct kvz_node *x = z->head ? z->head->level[0].forward : NULL;

    while (x) {
        struct kvz_node *next = x->level[0].forward;

        free(x);
        x = next;
    }
    free(z->head);
    memset(z, 0, sizeof(*z));
}

int kvz_insert(struct kvz_list *z, struct kvm_member *m)
{
    struct kvz_node *update[KVZ_MAX_LEVEL];
    uint64_t rank[KVZ_MAX_LEVEL];
    struct kvz_node *x = node_new(random_level(), m);

    if (!x)
        return TERN_ENOMEM;
    descend(z, m->score, m, update, rank);
    link_node(z, x, update, rank);
    m->node = x;
    return 0;
}

void kvz_delete(struct kvz_list *z, struct kvm_member *m)
{
    struct kvz_node *update[KVZ_MAX_LEVEL];
    uint64_t rank[KVZ_MAX_LEVEL];
    struct kvz_node *x = m->node;

    descend(z, m->score, m, update, rank);
    assert(update[0]->level[0].forward == x);
    unlink_node(z, x, update);
    free(x);
    m->node = NULL;
}

int kvz_update(struct kvz_list *z, struct kvm_member *m, double score)
{
    struct kvz_node *update[KVZ_MAX_LEVEL];
    uint64_t rank[KVZ_MAX_LEVEL];
    struct kvz_node *x = m->node;
    struct kvz_node *next = x->level[0].forward;

    /* ZINCRBY usually nudges a score without passing a neighbour: then
     * only the score changes, with no descent. */
    if ((!x->backward || before(x->backward, score, m)) &&
        (!next || cmp(score, m, next->m->score, next->m) < 0)) {
        m->score = score;
        return 0;
    }
    /* Reuse the node: its height is as random at the new place as at the
     * old, and with no allocation the move cannot fail half way. */
    descend(z, m->score, m, update, rank);
    assert(update[0]->level[0].forward == x);
    unlink_node(z, x, update);
    m->score = score;
    descend(z, score, m, update, rank);
    link_node(z, x, update, rank);
    return 0;
}

uint64_t kvz_rank(const struct kvz_list *z, const struct kvm_member *m)
{
    const struct kvz_node *x = z->head;
    uint64_t rank = 0;

    /* Step over every node up to and including m's: its rank is their
     * count less one. */
    for (int i = z->level - 1; i >= 0; i--) {
        while (x->level[i].forward &&
               cmp(x->level[i].forward->m->score, x->level[i].forward->m, m->score, m) <= 0) {
            rank += x->level[i].span;
            x = x->level[i].forward;
        }
        if (x == m->node)
            break;
    }
    assert(x == m->node);
    return rank - 1;
}

struct kvm_member *kvz_at(const struct kvz_list *z, uint64_t rank)
{
    const struct kvz_node *x = z->head;
    uint64_t want = rank + 1, seen = 0;

    if (rank >= z->len)
        return NULL;
    for (int i = z->level - 1; i >= 0; i--) {
        while (x->level[i].forward && seen + x->level[i].span <= want) {
            seen += x->level[i].span;
            x = x->level[i].forward;
        }
        if (seen == want)
            return x->m;
    }
    return NULL;
}

struct kvm_member *kvz_next(const struct kvm_member *m)
{
    const struct kvz_node *n = m->node->level[0].forward;

    return n ? n->m : NULL;
}

struct kvm_member *kvz_prev(const struct kvm_member *m)
{
    const struct kvz_node *b = m->node->backward;

    return b ? b->m : NULL;
}

struct kvm_member *kvz_first(const struct kvz_list *z)
{
    const struct kvz_node *n = z->head->level[0].forward;

    return n ? n->m : NULL;
}

struct kvm_member *kvz_last(const struct kvz_list *z)
{
    return z->tail ? z->tail->m : NULL;
}

struct kvm_member *kvz_first_from(const struct kvz_list *z, double min, bool excl)
{
    const struct kvz_node *x = z->head;

    /* Stop before the first node in range: scores only rise along a level. */
    for (int i = z->level - 1; i >= 0; i--) {
        const struct kvz_node *f;

        while ((f = x->level[i].forward) && (excl ? f->m->score <= min : f->m->score < min))
            x = f;
    }
    x = x->level[0].forward;
    return x ? x->m : NULL;
}

struct kvm_member *kvz_last_to(const struct kvz_list *z, double max, bool excl)
{
    const struct kvz_node *x = z->head;

    for (int i = z->level - 1; i >= 0; i--) {
        const struct kvz_node *f;

        while ((f = x->level[i].forward) && (excl ? f->m->score < max : f->m->score <= max))
            x = f;
    }
    return x == z->head ? NULL : x->m;
}
