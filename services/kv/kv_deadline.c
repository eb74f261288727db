/* A binary min-heap of deadlines; see kv_deadline.h. */
#include <stdlib.h>

#include "kv_deadline.h"

void kv_deadline_push(struct kv_deadlines *d, uint64_t at_ms, uint32_t ent)
{
    uint32_t i;

    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 64;
        struct kv_deadline *h = cap > d->cap ? realloc(d->h, (size_t)cap * sizeof(*h)) : NULL;

        if (!h) {
            d->lost = true;
            return;
        }
        d->h = h;
        d->cap = cap;
    }
    /* Sift up: parents later than the new item move down a level. */
    for (i = d->n++; i && d->h[(i - 1) / 2].at_ms > at_ms; i = (i - 1) / 2)
        d->h[i] = d->h[(i - 1) / 2];
    d->h[i] = (struct kv_deadline){.at_ms = at_ms, .ent = ent};
}

void kv_deadline_pop(struct kv_deadlines *d)
{
    struct kv_deadline last = d->h[--d->n];
    uint32_t i = 0;

    /* Sift the last item down from the root. */
    for (;;) {
        uint32_t c = 2 * i + 1;

        if (c >= d->n)
            break;
        if (c + 1 < d->n && d->h[c + 1].at_ms < d->h[c].at_ms)
            c++;
        if (d->h[c].at_ms >= last.at_ms)
            break;
        d->h[i] = d->h[c];
        i = c;
    }
    if (d->n)
        d->h[i] = last;
}

void kv_deadline_clear(struct kv_deadlines *d)
{
    d->n = 0;
    d->lost = false;
}

void kv_deadline_free(struct kv_deadlines *d)
{
    free(d->h);
    *d = (struct kv_deadlines){0};
}
