#include <math.h>
#include <stddef.h>
#include <strings.h>

#include "ycsb.h"

/* ---- random numbers ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ycsb_rng_seed(struct ycsb_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t ycsb_rng_next(struct ycsb_rng *r)
{
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double ycsb_rng_double(struct ycsb_rng *r)
{
    return (double)(ycsb_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t ycsb_rng_below(struct ycsb_rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)ycsb_rng_next(r) * n) >> 64);
}

/* ---- hashing ---- */

uint64_t ycsb_fnv64(uint64_t v)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (int i = 0; i < 8; i++) {
        h ^= v & 0xff;
        v >>= 8;
        h *= 1099511628211ull;
    }
    /* Java's Math.abs on a long (Long.MIN_VALUE stays itself; as unsigned it
     * is 2^63, still a fine hash). */
    return (int64_t)h < 0 ? 0 - h : h;
}

/* ---- zipfian (Gray et al.) ---- */

double ycsb_zeta(uint64_t from, uint64_t n, double theta, double sum)
{
    for (uint64_t i = from; i < n; i++)
        sum += 1.0 / pow((double)(i + 1), theta);
    return sum;
}

static void zipf_set_eta(struct ycsb_zipf *z, uint64_t n)
{
    z->eta = (1.0 - pow(2.0 / (double)n, 1.0 - z->theta)) / (1.0 - z->zeta2 / z->zetan);
}

void ycsb_zipf_init(struct ycsb_zipf *z, uint64_t min, uint64_t max, double theta,
                    double zetan)
{
    z->base = min;
    z->items = max - min + 1;
    z->theta = theta;
    z->alpha = 1.0 / (1.0 - theta);
    z->zeta2 = ycsb_zeta(0, 2, theta, 0);
    z->zetan = zetan > 0 ? zetan : ycsb_zeta(0, z->items, theta, 0);
    z->count_for_zeta = z->items;
    zipf_set_eta(z, z->items);
}

uint64_t ycsb_zipf_next_n(struct ycsb_zipf *z, struct ycsb_rng *r, uint64_t n)
{
    double u, uz;
    uint64_t v;

    /* YCSB grows zeta with the item count (never shrinks it). It computes
     * eta from the original count there, a slip: the formula wants n. */
    if (n > z->count_for_zeta) {
        z->zetan = ycsb_zeta(z->count_for_zeta, n, z->theta, z->zetan);
        z->count_for_zeta = n;
        zipf_set_eta(z, n);
    }
    u = ycsb_rng_double(r);
    uz = u * z->zetan;
    if (uz < 1.0 || n < 2)
        return z->base;
    if (uz < 1.0 + pow(0.5, z->theta))
        return z->base + 1;
    v = (uint64_t)((double)n * pow(z->eta * u - z->eta + 1.0, z->alpha));
    return z->base + (v < n ? v : n - 1);
}

uint64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *r)
{
    return ycsb_zipf_next_n(z, r, z->items);
}

/* ---- scrambled zipfian ---- */

/* YCSB's ScrambledZipfianGenerator: 10^10 items and their zeta for 0.99. */
#define SCRAMBLED_ITEMS 10000000000ull
#define SCRAMBLED_ZETAN 26.46902820178302

void ycsb_scrambled_init(struct ycsb_scrambled *s, uint64_t min, uint64_t max)
{
    s->min = min;
    s->items = max - min + 1;
    ycsb_zipf_init(&s->z, 0, SCRAMBLED_ITEMS, YCSB_ZIPF_THETA, SCRAMBLED_ZETAN);
}

uint64_t ycsb_scrambled_next(struct ycsb_scrambled *s, struct ycsb_rng *r)
{
    return s->min + ycsb_fnv64(ycsb_zipf_next(&s->z, r)) % s->items;
}

/* ---- skewed latest ---- */

void ycsb_latest_init(struct ycsb_latest *l, uint64_t last)
{
    ycsb_zipf_init(&l->z, 0, last ? last - 1 : 0, YCSB_ZIPF_THETA, 0);
}

uint64_t ycsb_latest_next(struct ycsb_latest *l, struct ycsb_rng *r, uint64_t last)
{
    if (last == 0)
        return 0;
    return last - ycsb_zipf_next_n(&l->z, r, last);
}

/* ---- workloads ---- */

static const struct ycsb_workload workloads[] = {
    {.name = "A", .read = 0.5, .update = 0.5},
    {.name = "B", .read = 0.95, .update = 0.05},
    {.name = "C", .read = 1.0},
    {.name = "D", .read = 0.95, .insert = 0.05, .latest = true},
    {.name = "F", .read = 0.5, .rmw = 0.5},
    {.name = "get", .read = 1.0},
    {.name = "put", .update = 1.0},
};

const struct ycsb_workload *ycsb_workload_find(const char *name)
{
    for (unsigned i = 0; i < sizeof(workloads) / sizeof(workloads[0]); i++)
        if (strcasecmp(name, workloads[i].name) == 0)
            return &workloads[i];
    return NULL;
}

enum ycsb_op ycsb_next_op(const struct ycsb_workload *w, struct ycsb_rng *r)
{
    double u;

    if (w->read >= 1.0)
        return YCSB_READ;
    if (w->update >= 1.0)
        return YCSB_UPDATE;
    u = ycsb_rng_double(r);
    if (u < w->read)
        return YCSB_READ;
    u -= w->read;
    if (u < w->update)
        return YCSB_UPDATE;
    u -= w->update;
    if (u < w->insert)
        return YCSB_INSERT;
    return w->rmw > 0 ? YCSB_RMW : YCSB_READ;
}
