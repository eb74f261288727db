/* A collection's members in a chained hash table; see mset.h. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv/kv_hash.h"
#include "mset.h"

#define KVM_MIN_BUCKETS 4u
#define KVM_RANDOM_TRIES 100

void kvm_init(struct kvm_set *s)
{
    s->buckets = NULL;
    s->mask = 0;
    s->n = 0;
}

void kvm_free(struct kvm_set *s)
{
    if (s->buckets) {
        for (uint64_t i = 0; i <= s->mask; i++) {
            for (struct kvm_member *m = s->buckets[i], *next; m; m = next) {
                next = m->next;
                free(m);
            }
        }
        free(s->buckets);
    }
    kvm_init(s);
}

static struct kvm_member *lookup(const struct kvm_set *s, const void *b, uint32_t len,
                                 uint64_t h)
{
    if (!s->buckets)
        return NULL;
    for (struct kvm_member *m = s->buckets[h & s->mask]; m; m = m->next) {
        /* len 0 may come with b == NULL, which memcmp must not see */
        if (m->hash == h && m->len == len && (!len || !memcmp(m->bytes, b, len)))
            return m;
    }
    return NULL;
}

struct kvm_member *kvm_find(const struct kvm_set *s, const void *b, uint32_t len)
{
    if (!s->n)
        return NULL;
    return lookup(s, b, len, kv_hash(b, len));
}

/* Rehash into nb buckets (a power of two). False if the table could not be
 * allocated: the old one stays and still holds every member. */
static bool resize(struct kvm_set *s, uint64_t nb)
{
    struct kvm_member **t;

    if (nb > SIZE_MAX / sizeof(*t))
        return false;
    t = calloc((size_t)nb, sizeof(*t));
    if (!t)
        return false;
    if (s->buckets) {
        for (uint64_t i = 0; i <= s->mask; i++) {
            for (struct kvm_member *m = s->buckets[i], *next; m; m = next) {
                next = m->next;
                m->next = t[m->hash & (nb - 1)];
                t[m->hash & (nb - 1)] = m;
            }
        }
        free(s->buckets);
    }
    s->buckets = t;
    s->mask = nb - 1;
    return true;
}

int kvm_add(struct kvm_set *s, const void *b, uint32_t len, struct kvm_member **out)
{
    uint64_t h = kv_hash(b, len);
    struct kvm_member *m = lookup(s, b, len, h);

    if (m) {
        *out = m;
        return 0;
    }
#if SIZE_MAX <= UINT32_MAX
    if (len > SIZE_MAX - sizeof(*m))
        return TERN_ENOMEM;
#endif
    /* The member first: with no table yet, failing to allocate one must
     * leave nothing behind either. */
    m = malloc(sizeof(*m) + len);
    if (!m)
        return TERN_ENOMEM;
    if (!s->buckets) {
        if (!resize(s, KVM_MIN_BUCKETS)) {
            free(m);
            return TERN_ENOMEM;
        }
    } else if (s->n >= s->mask + 1) {
        /* Failing to grow only makes chains longer; the next add retries. */
        (void)resize(s, (s->mask + 1) * 2);
    }
    m->hash = h;
    m->score = 0;
    m->node = NULL;
    m->len = len;
    if (len)
        memcpy(m->bytes, b, len);
    m->next = s->buckets[h & s->mask];
    s->buckets[h & s->mask] = m;
    s->n++;
    *out = m;
    return 1;
}

void kvm_remove(struct kvm_set *s, struct kvm_member *m)
{
    struct kvm_member **link = &s->buckets[m->hash & s->mask];
    uint64_t nb = s->mask + 1;

    while (*link != m)
        link = &(*link)->next;
    *link = m->next;
    free(m);
    s->n--;
    /* Keep the load at 1/8 or more so that kvm_random and kvm_scan do not
     * wade through empty buckets. A failed shrink keeps the larger table. */
    while (nb > KVM_MIN_BUCKETS && s->n < nb / 8)
        nb /= 2;
    if (nb != s->mask + 1)
        (void)resize(s, nb);
}

struct kvm_member *kvm_random(const struct kvm_set *s, uint64_t (*rnd)(void))
{
    struct kvm_member *head = NULL;
    uint64_t len = 0, pick;

    if (!s->n)
        return NULL;
    for (int i = 0; i < KVM_RANDOM_TRIES && !head; i++)
        head = s->buckets[rnd() & s->mask];
    /* The load factor makes this unlikely, but a poor rnd (or bad luck)
     * must not cost an unbounded number of draws. */
    for (uint64_t i = rnd() & s->mask; !head; i = (i + 1) & s->mask)
        head = s->buckets[i];
    for (struct kvm_member *m = head; m; m = m->next)
        len++;
    pick = rnd() % len;
    while (pick--)
        head = head->next;
    return head;
}

static uint64_t rev64(uint64_t v)
{
    v = ((v >> 1) & 0x5555555555555555ull) | ((v & 0x5555555555555555ull) << 1);
    v = ((v >> 2) & 0x3333333333333333ull) | ((v & 0x3333333333333333ull) << 2);
    v = ((v >> 4) & 0x0f0f0f0f0f0f0f0full) | ((v & 0x0f0f0f0f0f0f0f0full) << 4);
    return __builtin_bswap64(v);
}

uint64_t kvm_scan(const struct kvm_set *s, uint64_t cursor, unsigned count, kvm_visit_fn fn,
                  void *arg)
{
    uint64_t mask = s->mask;
    uint64_t seen = 0;

    if (!s->n)
        return 0;
    /* Increment the cursor's bits from the top down: when the table
     * doubles, the buckets a visited one splits into are behind the cursor,
     * and when it halves, the bucket a pending one merges into is not. */
    do {
        for (struct kvm_member *m = s->buckets[cursor & mask]; m; m = m->next) {
            seen++;
            fn(arg, m);
        }
        cursor |= ~mask;
        cursor = rev64(rev64(cursor) + 1);
    } while (cursor && seen < count);
    return cursor;
}

void kvm_each(const struct kvm_set *s, kvm_visit_fn fn, void *arg)
{
    if (!s->buckets)
        return;
    for (uint64_t i = 0; i <= s->mask; i++) {
        for (struct kvm_member *m = s->buckets[i]; m; m = m->next)
            fn(arg, m);
    }
}
