/* The key-value engine: pool + DRAM index. See kv_store.h.
 *
 * Every write appends a record (a value or a tombstone) with a new version
 * and repoints the key's index entry; the record it replaces becomes dead and
 * counts as one of the key's older records still in the pool (n_old). When
 * free segments run low, the pool's cleaner copies the live records of the
 * emptiest segment forward and frees it; the callbacks below tell it what is
 * live and keep the index and the n_old counts in step.
 *
 * An expiring value (PM_EXPIRING) carries its deadline before the value.
 * Past it, the key reads as absent at once, everywhere (lazy expiry: no
 * write on a read); kvs_expire() later writes its tombstone, in deadline
 * order off a heap (active expiry). Since the deadline is wall-clock time
 * in the record, a key never comes back after a restart and its time to
 * live counts down across one.
 */
#include <endian.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "error.h"
#include "kv_deadline.h"
#include "kv_index.h"
#include "kv_store.h"
#include "kv_window.h"
#include "log.h"

struct kvs {
    struct pm_pool *pool;
    struct kv_index ix;
    uint64_t keys;
    bool dirty;
    uint32_t gen;                    /* successful syncs so far, never 0 (kv_ent.gen) */
    bool append_only;                /* no in-place updates (the baseline) */
    uint32_t clean_low;              /* clean when fewer free segments than this */
    struct kvs_stats st;
    struct pm_cleaner cleaner;
    struct kv_window win;            /* the index mirrored for one-sided GETs */
    /* Records being sent straight from the pool (server push): never
     * rewritten in place until the send is done. A handful at most are in
     * flight, so a short array beats a hash. */
    struct {
        pm_loc loc;
        uint32_t n;                  /* 0: free */
    } pins[TERN_KV_PINS];
    unsigned n_pins;                 /* entries in use */
    void (*on_short)(void *arg);     /* kvs_on_short() */
    void *on_short_arg;
    struct kvs_opts opts;            /* as opened (path copied): kvs_wipe */
    kvs_tap_fn tap;                  /* kvs_set_tap() */
    void *tap_arg;
    uint64_t forced;                 /* kvs_apply: the version to write, 0 = a new one */
    bool removing;                   /* kvs_del deletes keys past their deadline too */
    struct kv_deadlines due;         /* expiring keys, soonest first */
    uint64_t expiring;               /* live keys whose newest record is PM_EXPIRING */
    uint8_t *xbuf;                   /* a deadline and a value, put together */
    size_t xcap;
};

static uint64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t (*kvs_now_ms)(void) = wall_ms;

static inline uint64_t get_le64(const void *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return le64toh(v);
}

/* The deadline of an expiring record (from its value's first bytes). */
static inline uint64_t rec_deadline(const struct pm_rec *r)
{
    return get_le64(pm_rec_val(r));
}

/* The version a write takes: the next of the pool's counter, or the one a
 * replica was told to write (kvs_apply). */
static uint64_t next_version(struct kvs *s)
{
    return s->forced ? s->forced : pm_next_version(s->pool);
}

static void tap(struct kvs *s, enum pm_rec_type type, const void *key, uint16_t klen,
                const void *val, uint32_t len, uint64_t ver)
{
    if (s->tap && !s->forced)
        s->tap(s->tap_arg, type, key, klen, val, len, ver);
}

static inline pm_loc ent_loc(const struct kv_ent *e)
{
    return e->loc & ~KV_TOMB;
}

static inline bool ent_is_tomb(const struct kv_ent *e)
{
    return (e->loc & KV_TOMB) != 0;
}

/* Is the entry's newest record an expiring value (due or not)? */
static bool ent_expiring(const struct kvs *s, const struct kv_ent *e)
{
    return !ent_is_tomb(e) && pm_rec_at(s->pool, ent_loc(e))->type == PM_EXPIRING;
}

/* Note the deadline of the key's newest record, if it has one. */
static void note_deadline(struct kvs *s, const struct kv_ent *e)
{
    if (ent_expiring(s, e))
        kv_deadline_push(&s->due, rec_deadline(pm_rec_at(s->pool, ent_loc(e))),
                         (uint32_t)(e - s->ix.ents));
}

/* The heap again from the index: every expiring key once. */
static void deadlines_rebuild(struct kvs *s)
{
    kv_deadline_clear(&s->due);
    s->expiring = 0;
    for (uint32_t i = 0; i < s->ix.top; i++)
        if (s->ix.ents[i].loc != KV_FREE && ent_expiring(s, &s->ix.ents[i])) {
            s->expiring++;
            note_deadline(s, &s->ix.ents[i]);
        }
}

/* Mirror an entry's newest record into the index window (a tombstone
 * leaves it: deleted keys are answered by the server). */
static void mirror(struct kvs *s, struct kv_ent *e)
{
    struct pm_rec r;

    if (!s->win.hdr)
        return;
    /* Expiring values too: a client's clock is not the server's. */
    if (ent_is_tomb(e) || pm_rec_read(s->pool, ent_loc(e), &r) < 0 || r.type != PM_VALUE) {
        kv_window_clear(&s->win, &e->wslot);
        return;
    }
    kv_window_set(&s->win, &e->wslot, e->hash, ent_loc(e), r.version,
                  pm_rec_size(r.key_len, r.val_len));
}

/* A tombstone with no older record left behind it protects nothing. */
static void retire_if_bare(struct kvs *s, struct kv_ent *e)
{
    if (ent_is_tomb(e) && e->n_old == 0) {
        pm_dead(s->pool, ent_loc(e));
        kv_index_remove(&s->ix, e);
    }
}

/* ---- recovery ---- */

static int recover_rec(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct kvs *s = arg;
    const void *key = pm_rec_key(r);
    uint64_t h = kv_hash(key, r->key_len);
    uint64_t flag = r->type == PM_TOMBSTONE ? KV_TOMB : 0;   /* PM_EXPIRING: a value */
    struct kv_ent *e = kv_index_find(&s->ix, s->pool, h, key, r->key_len);

    if (!e) {
        e = kv_index_add(&s->ix, h);
        if (!e)
            return TERN_ENOMEM;
        e->loc = loc | flag;
        s->keys += !flag;
        return 0;
    }
    /* Two records of one key: the newer version wins. Of two of one
     * version (an interrupted clean's copy and its original), the first
     * wins: the pool hands the copy first (pm_recover), so the
     * victim holds nothing live and the next clean frees it outright. Had
     * the original won, that clean would copy it all again into a pool
     * the crash had left without room, and fail, again and again. */
    e->n_old++;
    if (r->version <= pm_rec_at(s->pool, ent_loc(e))->version) {
        pm_dead(s->pool, loc);
        if (!e->old_loc && r->version < pm_rec_at(s->pool, ent_loc(e))->version)
            e->old_loc = loc;
        return 0;
    }
    pm_dead(s->pool, ent_loc(e));
    s->keys += (uint64_t)ent_is_tomb(e) - (uint64_t)!!flag;
    e->old_loc = ent_loc(e);
    e->loc = loc | flag;
    return 0;
}

/* ---- the cleaner's view ---- */

static struct kv_ent *ent_of(struct kvs *s, const struct pm_rec *r)
{
    const void *key = pm_rec_key(r);

    return kv_index_find(&s->ix, s->pool, kv_hash(key, r->key_len), key, r->key_len);
}

static bool clean_is_live(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct kv_ent *e = ent_of(arg, r);

    return e && ent_loc(e) == loc;
}

/* The copy becomes the key's record; the original, still in the victim
 * until it is freed, counts as an older one (dropped below, once the victim
 * is gone). */
static void clean_moved(void *arg, pm_loc from, pm_loc to, const struct pm_rec *r)
{
    struct kv_ent *e = ent_of(arg, r);

    if (e) {
        e->loc = to | (e->loc & KV_TOMB);
        e->n_old++;
        mirror(arg, e);
    }
}

/* Called for every record of a victim after the victim was freed. */
static void clean_dropped(void *arg, pm_loc loc, const struct pm_rec *r)
{
    struct kvs *s = arg;
    struct kv_ent *e = ent_of(s, r);

    /* The segment is free now: never rewrite in place there. */
    if (e && e->old_loc == loc)
        e->old_loc = 0;
    if (e && e->n_old && r->version >= e->base_ver) {
        e->n_old--;
        retire_if_bare(s, e);
    }
}

/* ---- open and close ---- */

int kvs_open(const struct kvs_opts *o, struct kvs **out)
{
    struct pm_opts po = {.create = true};
    struct kvs *s;
    struct pm_info info;
    int rc;

    if (!o || !o->path || !out)
        return TERN_EINVAL;
    po.size = o->pool_size;
    po.seg_size = o->seg_size;
    po.split_flush = o->split_flush;
    s = calloc(1, sizeof(*s));
    if (!s)
        return TERN_ENOMEM;
    s->cleaner = (struct pm_cleaner){.is_live = clean_is_live, .moved = clean_moved,
                                          .dropped = clean_dropped, .arg = s};
    s->append_only = o->append_only;
    s->gen = 1;                      /* recovered entries have 0: durable */
    s->opts = *o;
    s->opts.path = strdup(o->path);
    if (!s->opts.path) {
        free(s);
        return TERN_ENOMEM;
    }
    rc = pm_open(o->path, &po, &s->pool);
    if (rc < 0)
        goto fail;
    pm_get_info(s->pool, &info);
    rc = kv_index_init(&s->ix, 1024);
    if (rc < 0)
        goto fail;
    rc = pm_recover(s->pool, recover_rec, s);
    if (rc < 0)
        goto fail;
    for (uint32_t i = 0; i < s->ix.top; i++)
        if (s->ix.ents[i].loc != KV_FREE)
            retire_if_bare(s, &s->ix.ents[i]);
    deadlines_rebuild(s);
    /* Keep a sixteenth of the pool (at least two segments) free, so that a
     * burst of writes rarely has to wait for a clean. */
    s->clean_low = info.n_segs / 16 > 2 ? info.n_segs / 16 : 2;
    *out = s;
    return 0;
fail:
    kv_index_free(&s->ix);
    kv_deadline_free(&s->due);
    pm_close(s->pool);
    free((void *)s->opts.path);
    free(s);
    return rc;
}

void kvs_close(struct kvs *s)
{
    if (!s)
        return;
    kvs_sync(s);
    kv_index_free(&s->ix);
    kv_deadline_free(&s->due);
    free(s->xbuf);
    pm_close(s->pool);
    free((void *)s->opts.path);
    free(s);
}

int kvs_wipe(struct kvs *s)
{
    struct pm_opts po = {.create = true, .size = s->opts.pool_size,
                         .seg_size = s->opts.seg_size, .split_flush = s->opts.split_flush};
    struct pm_pool *fresh;
    struct kv_index ix;
    int rc;

    if (s->win.hdr || s->n_pins)
        return TERN_EBUSY;
    rc = kv_index_init(&ix, 1024);
    if (rc < 0)
        return rc;
    /* The file goes first (its lock with it), then a new one is made; a
     * crash in between leaves no pool, which opens empty. */
    pm_close(s->pool);
    s->pool = NULL;
    if (unlink(s->opts.path) < 0 || pm_sync_dir_of(s->opts.path) < 0)
        tern_log(TERN_LOG_WARN, "kv", "%s: removing the pool to wipe it failed", s->opts.path);
    rc = pm_open(s->opts.path, &po, &fresh);
    if (rc < 0) {
        kv_index_free(&ix);
        return rc;      /* the store is unusable now: its owner stops */
    }
    kv_index_free(&s->ix);
    s->ix = ix;
    s->pool = fresh;
    s->keys = 0;
    s->expiring = 0;
    kv_deadline_clear(&s->due);
    s->dirty = false;
    s->gen = 1;
    memset(&s->st, 0, sizeof(s->st));
    /* Nothing to recover in a new pool, but the pool takes writes only
     * once it has been through recovery (its free segments are counted). */
    return pm_recover(s->pool, recover_rec, s);
}

/* ---- reads ---- */

/* The key's newest record, its header as checked (pm_rec_read): records in
 * leased segments were written by a client, which may rewrite them. */
static int newest(struct kvs *s, const void *key, size_t klen, pm_loc *loc,
                  struct pm_rec *hdr)
{
    struct kv_ent *e;

    s->st.gets++;
    if (!klen || klen > KV_KEY_MAX)
        return klen ? TERN_E2BIG : TERN_EINVAL;
    e = kv_index_find(&s->ix, s->pool, kv_hash(key, klen), key, (uint16_t)klen);
    if (!e || ent_is_tomb(e))
        return TERN_ENOENT;
    *loc = ent_loc(e);
    if (pm_rec_read(s->pool, *loc, hdr) < 0 || hdr->key_len != klen)
        return TERN_ECORRUPT;
    if (hdr->type == PM_EXPIRING && rec_deadline(pm_rec_at(s->pool, *loc)) <= kvs_now_ms())
        return TERN_ENOENT;
    s->st.hits++;
    return 0;
}

int kvs_get(struct kvs *s, const void *key, size_t klen,
                      const void **val, uint32_t *len, uint64_t *version)
{
    struct pm_rec hdr;
    pm_loc loc;
    int rc = newest(s, key, klen, &loc, &hdr);

    if (rc < 0)
        return rc;
    *val = (const uint8_t *)pm_rec_at(s->pool, loc) + sizeof(hdr) + hdr.key_len;
    *len = hdr.val_len;
    if (hdr.type == PM_EXPIRING) {
        *val = (const uint8_t *)*val + PM_EXPIRY_BYTES;
        *len -= PM_EXPIRY_BYTES;
    }
    if (version)
        *version = hdr.version;
    return 0;
}

int kvs_expiry(struct kvs *s, const void *key, size_t klen, uint64_t *at_ms)
{
    struct pm_rec hdr;
    pm_loc loc;
    int rc = newest(s, key, klen, &loc, &hdr);

    if (rc < 0)
        return rc;
    *at_ms = hdr.type == PM_EXPIRING ? rec_deadline(pm_rec_at(s->pool, loc)) : 0;
    return 0;
}

int kvs_locate(struct kvs *s, const void *key, size_t klen,
                         pm_loc *loc, uint32_t *size, uint64_t *version)
{
    struct pm_rec hdr;
    int rc = newest(s, key, klen, loc, &hdr);

    if (rc < 0)
        return rc;
    *size = pm_rec_size(hdr.key_len, hdr.val_len);
    *version = hdr.version;
    return 0;
}

static int pin_find(const struct kvs *s, pm_loc loc)
{
    for (unsigned i = 0; i < TERN_KV_PINS; i++)
        if (s->pins[i].n && s->pins[i].loc == loc)
            return (int)i;
    return -1;
}

static bool pinned(const struct kvs *s, pm_loc loc)
{
    return s->n_pins && pin_find(s, loc) >= 0;
}

int kvs_pin(struct kvs *s, pm_loc loc)
{
    int i = pin_find(s, loc);

    if (i < 0) {
        if (s->n_pins == TERN_KV_PINS)
            return TERN_ENOBUFS;
        for (i = 0; s->pins[i].n; i++)
            ;
        s->pins[i].loc = loc;
        s->n_pins++;
    }
    s->pins[i].n++;
    return 0;
}

void kvs_unpin(struct kvs *s, pm_loc loc)
{
    int i = pin_find(s, loc);

    if (i >= 0 && --s->pins[i].n == 0)
        s->n_pins--;
}

/* ---- writes ---- */

/* Free segments run low: segments held out of the cleaner's reach that
 * their holder can spare (idle leases) come back first, so that cleaning
 * can take them. */
static void short_of_room(struct kvs *s)
{
    if (s->on_short)
        s->on_short(s->on_short_arg);
}

/* Append a record, cleaning first when free segments run low and again,
 * harder, if the pool is full. On failure nothing has changed. */
static int append(struct kvs *s, enum pm_rec_type type, const void *key,
                  uint16_t klen, const void *val, uint32_t len, pm_loc *loc,
                  uint64_t *version)
{
    int rc;

    if (pm_free_segs(s->pool) < s->clean_low) {
        short_of_room(s);
        rc = pm_clean(s->pool, &s->cleaner, 1, 75);
        if (rc > 0)
            s->st.segs_cleaned += (unsigned)rc;
    }
    *version = next_version(s);
    rc = pm_append(s->pool, type, *version, key, klen, val, len, loc);
    if (rc != TERN_ENOSPC)
        return rc;
    /* Full: take back every segment at least a tenth dead, emptiest first.
     * Segments nearly all live are left alone: copying one forward would
     * use up about as much room as it frees, over and over. */
    short_of_room(s);
    rc = pm_clean(s->pool, &s->cleaner, pm_seg_count(s->pool), 90);
    if (rc > 0)
        s->st.segs_cleaned += (unsigned)rc;
    return pm_append(s->pool, type, *version, key, klen, val, len, loc);
}

static int finish_write(struct kvs *s, unsigned flags)
{
    s->dirty = true;
    return (flags & TERN_KV_SYNC) ? kvs_sync(s) : 0;
}

/* Make a new value record the key's newest (the index has room: see
 * kv_index_reserve). */
static struct kv_ent *point_at(struct kvs *s, uint64_t h, const void *key, uint16_t klen,
                               pm_loc loc, uint64_t ver)
{
    struct kv_ent *e = kv_index_find(&s->ix, s->pool, h, key, klen);

    if (!e) {
        e = kv_index_add(&s->ix, h);    /* cannot fail after the reserve */
        e->loc = loc;
        e->base_ver = ver;
        s->keys++;
    } else {
        s->expiring -= ent_expiring(s, e);
        pm_dead(s->pool, ent_loc(e));
        e->n_old++;
        s->keys += ent_is_tomb(e);
        e->old_loc = ent_loc(e);
        e->loc = loc;
    }
    e->gen = s->gen;
    mirror(s, e);
    return e;
}

/* The key's newest record was written since the last sync, so nobody was
 * told of it (writes are acknowledged after a sync): a batch that sets one
 * key again and again (the RESP gateway's group commit) rewrites that
 * record rather than appending one per SET. The pool allows it only where a
 * crash mid-rewrite loses nothing acknowledged (pm_rewrite_pending):
 * past the commit point, or over a slot rewritten in place before. */
static int put_again(struct kvs *s, struct kv_ent *e, enum pm_rec_type type, const void *key,
                     uint16_t klen, const void *val, uint32_t len, uint64_t *ver)
{
    bool was;

    if (ent_is_tomb(e) || pinned(s, ent_loc(e)) ||
        pm_slot_size(s->pool, ent_loc(e)) < pm_rec_size(klen, len))
        return 0;
    was = ent_expiring(s, e);
    *ver = next_version(s);
    if (pm_rewrite_pending(s->pool, ent_loc(e), type, *ver, key, klen, val, len) < 0)
        return 0;
    s->expiring -= was;
    s->st.in_place++;
    mirror(s, e);
    return 1;
}

/* BOOM-KV's hybrid update: write the new value over the key's older record
 * instead of appending, when (1) that record is not the newest durable
 * version: the record that superseded it was synced (its entry's gen is an
 * older one), so a crash mid-rewrite (which recovery skips) leaves the key
 * at that version, whatever else of the batch is still pending; (2) the
 * new record fits its slot; (3) nobody reads it in flight: the server
 * copies values out synchronously or pins the records it pushes until the
 * push is done, and one-sided readers check version and checksum and read
 * again. A key whose newest record is not synced yet is set again over that
 * record instead (put_again). Returns 1 if it did, 0 to append instead. */
static int put_in_place(struct kvs *s, uint64_t h, enum pm_rec_type type, const void *key,
                        uint16_t klen, const void *val, uint32_t len, uint64_t *ver)
{
    struct kv_ent *e;
    pm_loc prev;
    bool was;
    int rc;

    if (s->append_only)
        return 0;
    e = kv_index_find(&s->ix, s->pool, h, key, klen);
    if (!e)
        return 0;
    if (e->gen == s->gen)
        return put_again(s, e, type, key, klen, val, len, ver);
    if (!e->old_loc || pinned(s, e->old_loc) ||
        pm_slot_size(s->pool, e->old_loc) < pm_rec_size(klen, len))
        return 0;
    was = ent_expiring(s, e);
    *ver = next_version(s);
    /* Nothing pending is committed first: the newer version is durable. */
    rc = pm_overwrite_behind(s->pool, e->old_loc, type, *ver, key, klen, val, len);
    if (rc < 0)
        return 0;
    s->expiring -= was;
    /* The rewritten slot is the newest now and the record it replaced goes
     * to the older ones: n_old does not change. */
    prev = ent_loc(e);
    pm_dead(s->pool, prev);
    s->keys += ent_is_tomb(e);
    e->loc = e->old_loc;
    e->old_loc = prev;
    e->gen = s->gen;
    s->st.in_place++;
    mirror(s, e);
    return 1;
}

/* Write a value record (PM_VALUE, or PM_EXPIRING with its deadline
 * first in val) and make it the key's newest. */
static int put_rec(struct kvs *s, enum pm_rec_type type, const void *key, size_t klen,
                   const void *val, size_t len, unsigned flags, uint64_t *version)
{
    uint64_t h, ver;
    pm_loc loc;
    int rc;

    if (!klen || (!val && len))
        return TERN_EINVAL;
    if (klen > KV_KEY_MAX || len > kvs_val_max(s, klen))
        return TERN_E2BIG;
    h = kv_hash(key, klen);
    /* Room for a new index entry is made first, so that running out of
     * memory leaves nothing half-done in the pool. */
    rc = kv_index_reserve(&s->ix);
    if (rc < 0)
        return rc;
    if (!put_in_place(s, h, type, key, (uint16_t)klen, val, (uint32_t)len, &ver)) {
        rc = append(s, type, key, (uint16_t)klen, val, (uint32_t)len, &loc, &ver);
        if (rc < 0)
            return rc;
        /* Looked up after the append: cleaning may have moved records. */
        point_at(s, h, key, (uint16_t)klen, loc, ver);
    }
    if (type == PM_EXPIRING) {
        s->expiring++;
        kv_deadline_push(&s->due, get_le64(val),
                         (uint32_t)(kv_index_find(&s->ix, s->pool, h, key, (uint16_t)klen) -
                                    s->ix.ents));
    }
    tap(s, type, key, (uint16_t)klen, val, (uint32_t)len, ver);
    s->st.puts++;
    if (version)
        *version = ver;
    return finish_write(s, flags);
}

int kvs_put(struct kvs *s, const void *key, size_t klen,
                      const void *val, size_t len, unsigned flags, uint64_t *version)
{
    return put_rec(s, PM_VALUE, key, klen, val, len, flags, version);
}

/* The scratch buffer, with room for a deadline and `len` bytes of value. */
static uint8_t *xbuf(struct kvs *s, size_t len)
{
    if (s->xcap < PM_EXPIRY_BYTES + len) {
        uint8_t *b = realloc(s->xbuf, PM_EXPIRY_BYTES + len);

        if (!b)
            return NULL;
        s->xbuf = b;
        s->xcap = PM_EXPIRY_BYTES + len;
    }
    return s->xbuf;
}

int kvs_put_until(struct kvs *s, const void *key, size_t klen, const void *val, size_t len,
                  uint64_t at_ms, unsigned flags, uint64_t *version)
{
    uint64_t le = htole64(at_ms);
    uint8_t *b;

    if (!at_ms)
        return kvs_put(s, key, klen, val, len, flags, version);
    if (!klen || (!val && len))
        return TERN_EINVAL;
    if (klen > KV_KEY_MAX || kvs_val_max(s, klen) < PM_EXPIRY_BYTES ||
        len > kvs_val_max(s, klen) - PM_EXPIRY_BYTES)
        return TERN_E2BIG;
    b = xbuf(s, len);
    if (!b)
        return TERN_ENOMEM;
    memcpy(b, &le, sizeof(le));
    if (len)
        memcpy(b + PM_EXPIRY_BYTES, val, len);
    return put_rec(s, PM_EXPIRING, key, klen, b, PM_EXPIRY_BYTES + len, flags, version);
}

int kvs_set_expiry(struct kvs *s, const void *key, size_t klen, uint64_t at_ms,
                   unsigned flags, uint64_t *version)
{
    const void *val;
    uint32_t len;
    uint64_t old;
    uint8_t *b;
    int rc = kvs_expiry(s, key, klen, &old);

    if (rc < 0)
        return rc;
    if (!at_ms && !old)
        return 0;       /* no deadline to remove */
    /* A deadline already past removes the key, as Redis's EXPIRE does. */
    if (at_ms && at_ms <= kvs_now_ms())
        return kvs_del(s, key, klen, flags, version);
    rc = kvs_get(s, key, klen, &val, &len, NULL);
    if (rc < 0)
        return rc;
    /* The value is copied out first: the write may move its record. */
    b = xbuf(s, len);
    if (!b)
        return TERN_ENOMEM;
    memcpy(b + PM_EXPIRY_BYTES, val, len);
    if (!at_ms)
        return put_rec(s, PM_VALUE, key, klen, b + PM_EXPIRY_BYTES, len, flags, version);
    at_ms = htole64(at_ms);
    memcpy(b, &at_ms, sizeof(at_ms));
    return put_rec(s, PM_EXPIRING, key, klen, b, PM_EXPIRY_BYTES + len, flags, version);
}

int kvs_del(struct kvs *s, const void *key, size_t klen, unsigned flags,
                      uint64_t *version)
{
    uint64_t h, ver;
    pm_loc loc;
    struct kv_ent *e;
    int rc;

    if (!klen)
        return TERN_EINVAL;
    if (klen > KV_KEY_MAX)
        return TERN_E2BIG;
    h = kv_hash(key, klen);
    e = kv_index_find(&s->ix, s->pool, h, key, (uint16_t)klen);
    if (!e || ent_is_tomb(e))
        return TERN_ENOENT;
    /* Past its deadline the key is absent already; kvs_expire removes it. */
    if (ent_expiring(s, e) && rec_deadline(pm_rec_at(s->pool, ent_loc(e))) <= kvs_now_ms() &&
        !s->removing)
        return TERN_ENOENT;
    rc = append(s, PM_TOMBSTONE, key, (uint16_t)klen, NULL, 0, &loc, &ver);
    if (rc < 0)
        return rc;
    e = kv_index_find(&s->ix, s->pool, h, key, (uint16_t)klen);
    s->expiring -= ent_expiring(s, e);
    pm_dead(s->pool, ent_loc(e));
    e->n_old++;
    e->old_loc = ent_loc(e);
    e->loc = loc | KV_TOMB;
    e->gen = s->gen;
    mirror(s, e);
    tap(s, PM_TOMBSTONE, key, (uint16_t)klen, NULL, 0, ver);
    s->keys--;
    s->st.dels++;
    if (version)
        *version = ver;
    return finish_write(s, flags);
}

int kvs_sync(struct kvs *s)
{
    int rc;

    if (!s->dirty)
        return 0;
    rc = pm_commit(s->pool);
    if (rc < 0)
        return rc;
    s->dirty = false;
    s->st.syncs++;
    /* Every entry written so far is durable now. Once in 2^32 syncs the
     * generation comes round: the entries are told so. */
    if (++s->gen == 0) {
        for (uint32_t i = 0; i < s->ix.top; i++)
            s->ix.ents[i].gen = 0;
        s->gen = 1;
    }
    return 0;
}

bool kvs_dirty(const struct kvs *s)
{
    return s->dirty;
}

int kvs_clear(struct kvs *s, unsigned flags)
{
    /* By entry slot, not by bucket: deletes may retire tombstones, which
     * unlinks entries, but never add any. */
    for (uint32_t i = 0; i < s->ix.top; i++) {
        struct kv_ent *e = &s->ix.ents[i];
        struct pm_rec r;
        uint8_t key[KV_KEY_MAX];
        int rc;

        if (e->loc == KV_FREE || ent_is_tomb(e))
            continue;
        /* A record its lessee rewrote no longer names the key it was
         * indexed under: nothing to find it by, and nothing to lose. */
        if (pm_rec_read(s->pool, ent_loc(e), &r) < 0)
            continue;
        /* Copied: the delete may move the record. */
        memcpy(key, pm_rec_key(pm_rec_at(s->pool, ent_loc(e))), r.key_len);
        s->removing = true;     /* keys past their deadline too */
        rc = kvs_del(s, key, r.key_len, 0, NULL);
        s->removing = false;
        if (rc == TERN_ENOENT || rc == TERN_ECORRUPT)
            continue;
        if (rc < 0)
            return rc;
    }
    return finish_write(s, flags);
}

/* ---- scans and figures ---- */

struct scan_ctx {
    struct kvs *s;
    tern_kv_scan_fn fn;              /* values as kvs_get gives them ... */
    kvs_rec_fn rec;                  /* ... or records as they are */
    void *arg;
    uint64_t now;
};

static int scan_visit(void *arg, struct kv_ent *e)
{
    struct scan_ctx *c = arg;
    const uint8_t *at, *val;
    struct pm_rec r;
    uint32_t len;

    if (ent_is_tomb(e) || pm_rec_read(c->s->pool, ent_loc(e), &r) < 0)
        return 0;
    at = (const uint8_t *)pm_rec_at(c->s->pool, ent_loc(e)) + sizeof(r);
    val = at + r.key_len;
    len = r.val_len;
    if (c->rec)
        return c->rec(c->arg, (enum pm_rec_type)r.type, at, r.key_len, val, len, r.version);
    if (r.type == PM_EXPIRING) {
        if (get_le64(val) <= c->now)
            return 0;
        val += PM_EXPIRY_BYTES;
        len -= PM_EXPIRY_BYTES;
    }
    return c->fn(c->arg, at, r.key_len, val, len, r.version);
}

int kvs_scan(struct kvs *s, uint64_t cursor, unsigned max,
                       tern_kv_scan_fn fn, void *arg, uint64_t *next)
{
    struct scan_ctx c = {.s = s, .fn = fn, .arg = arg, .now = kvs_now_ms()};

    if (!fn || !next)
        return TERN_EINVAL;
    *next = kv_index_scan(&s->ix, cursor, max ? max : 1, scan_visit, &c);
    return 0;
}

int kvs_scan_records(struct kvs *s, uint64_t cursor, unsigned max, kvs_rec_fn fn, void *arg,
                     uint64_t *next)
{
    struct scan_ctx c = {.s = s, .rec = fn, .arg = arg};

    if (!fn || !next)
        return TERN_EINVAL;
    *next = kv_index_scan(&s->ix, cursor, max ? max : 1, scan_visit, &c);
    return 0;
}

uint64_t kvs_count(const struct kvs *s)
{
    return s->keys;
}

size_t kvs_val_max(const struct kvs *s, size_t klen)
{
    return klen > KV_KEY_MAX ? 0 : pm_val_max(s->pool, (uint32_t)klen);
}

void kvs_get_stats(const struct kvs *s, struct kvs_stats *st)
{
    *st = s->st;
    st->keys = s->keys;
    pm_get_info(s->pool, &st->pool);
}

/* ---- one-sided access: the index window and leased segments ---- */

struct pm_pool *kvs_pool(const struct kvs *s)
{
    return s->pool;
}

void kvs_attach_window(struct kvs *s, void *mem, uint32_t n_blocks)
{
    struct pm_info info;

    if (!mem) {
        s->win = (struct kv_window){0};
        return;
    }
    pm_get_info(s->pool, &info);
    kv_window_init(&s->win, mem, n_blocks, info.uuid);
    for (uint32_t i = 0; i < s->ix.top; i++)
        if (s->ix.ents[i].loc != KV_FREE) {
            s->ix.ents[i].wslot = 0;
            mirror(s, &s->ix.ents[i]);
        }
}

void kvs_window_counts(const struct kvs *s, uint64_t *mirrored,
                                 uint64_t *unplaced)
{
    *mirrored = s->win.mirrored;
    *unplaced = s->win.unplaced;
}

int kvs_lease(struct kvs *s, uint32_t *seg)
{
    int rc;

    /* A lease takes a whole segment out of the cleaner's reach until it
     * ends, so it never takes one of the last clean_low: those keep the
     * writes that come through the store (RPC, RESP) and the cleaner going
     * whatever clients lease. Clean first, as an append would. */
    if (pm_free_segs(s->pool) <= s->clean_low) {
        short_of_room(s);
        rc = pm_clean(s->pool, &s->cleaner, 1, 75);
        if (rc > 0)
            s->st.segs_cleaned += (unsigned)rc;
    }
    if (pm_free_segs(s->pool) <= s->clean_low) {
        rc = pm_clean(s->pool, &s->cleaner, pm_seg_count(s->pool), 90);
        if (rc > 0)
            s->st.segs_cleaned += (unsigned)rc;
    }
    if (pm_free_segs(s->pool) <= s->clean_low)
        return TERN_ENOSPC;
    return pm_lease(s->pool, seg);
}

void kvs_on_short(struct kvs *s, void (*fn)(void *arg), void *arg)
{
    s->on_short = fn;
    s->on_short_arg = arg;
}

void kvs_lease_end(struct kvs *s, uint32_t seg)
{
    pm_lease_end(s->pool, seg);
}

int kvs_lease_put(struct kvs *s, uint32_t seg, uint32_t off,
                            uint64_t intent, uint32_t range_lo, uint32_t range_hi,
                            unsigned flags, uint64_t *version, bool *ended)
{
    const struct pm_rec *r;
    struct pm_rec hdr;
    pm_loc loc;
    uint64_t ver, h;
    uint32_t top;
    int rc;

    if (off != pm_lease_next(s->pool, seg))
        return TERN_EINVAL;
    /* Is the record at off the one the client meant (its put may have
     * failed, leaving an older record there)? The pool's checks follow. */
    r = (const struct pm_rec *)((const uint8_t *)pm_base(s->pool) +
                                     pm_seg_file_off(s->pool, seg) + off);
    if (off + sizeof(*r) > PM_SEG_HDR + pm_seg_room(s->pool) ||
        __atomic_load_n(&r->version, __ATOMIC_ACQUIRE) != intent)
        return TERN_EPROTO;
    rc = kv_index_reserve(&s->ix);
    if (rc < 0)
        return rc;
    ver = next_version(s);
    rc = pm_lease_append(s->pool, seg, off, ver, &loc);
    if (rc < 0)
        return rc;
    /* The lessee can still write the header: read it once, and judge the
     * record by that copy, its lengths checked against the segment again.
     * One the store will not take is dropped with the lease (it is not
     * committed yet): the lessee asks for a new one. */
    r = pm_rec_at(s->pool, loc);
    memcpy(&hdr, r, sizeof(hdr));
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (hdr.type != PM_VALUE || !hdr.key_len || hdr.key_len > PM_KEY_MAX ||
        off + sizeof(hdr) + hdr.key_len > PM_SEG_HDR + pm_seg_room(s->pool)) {
        pm_lease_end(s->pool, seg);
        *ended = true;
        return TERN_EPROTO;
    }
    h = kv_hash(pm_rec_key(r), hdr.key_len);
    top = (uint32_t)(h >> 32);
    if (top < range_lo || top > range_hi) {
        pm_lease_end(s->pool, seg);
        *ended = true;
        return TERN_EWRONGNODE;
    }
    point_at(s, h, pm_rec_key(r), hdr.key_len, loc, ver);
    /* From the pool's copy, once: the lessee can still write its segment. */
    r = pm_rec_at(s->pool, loc);
    tap(s, PM_VALUE, pm_rec_key(r), hdr.key_len, pm_rec_val(r), hdr.val_len, ver);
    s->st.puts++;
    if (version)
        *version = ver;
    return finish_write(s, flags);
}

/* ---- replication ---- */

void kvs_set_tap(struct kvs *s, kvs_tap_fn fn, void *arg)
{
    s->tap = fn;
    s->tap_arg = arg;
}

uint64_t kvs_version(const struct kvs *s)
{
    return pm_version(s->pool);
}

void kvs_raise_version(struct kvs *s, uint64_t v)
{
    pm_raise_version(s->pool, v);
}

int kvs_apply(struct kvs *s, enum pm_rec_type type, const void *key, size_t klen,
              const void *val, size_t len, uint64_t version, unsigned flags)
{
    struct kv_ent *e;
    pm_loc loc;
    uint64_t ver;
    int rc;

    if (!version || !klen || klen > KV_KEY_MAX || !pm_rec_type_ok(type, (uint32_t)len) ||
        len > UINT32_MAX)
        return TERN_EINVAL;
    e = kv_index_find(&s->ix, s->pool, kv_hash(key, klen), key, (uint16_t)klen);
    /* Again, or older than what the key has: done already. */
    if (e && pm_rec_at(s->pool, ent_loc(e))->version >= version)
        return 0;
    s->forced = version;
    s->removing = true;
    if (type != PM_TOMBSTONE) {
        rc = put_rec(s, type, key, klen, val, len, flags, NULL);
    } else if (e && !ent_is_tomb(e)) {
        rc = kvs_del(s, key, klen, flags, NULL);
    } else {
        /* Nothing to delete here, but the version is the replica's
         * position: a record that is dead at once carries it. */
        rc = append(s, PM_TOMBSTONE, key, (uint16_t)klen, NULL, 0, &loc, &ver);
        if (rc == 0) {
            pm_dead(s->pool, loc);
            rc = finish_write(s, flags);
        }
    }
    s->forced = 0;
    s->removing = false;
    return rc;
}

/* ---- active expiry ---- */

unsigned kvs_expire(struct kvs *s, uint64_t now_ms, unsigned max)
{
    unsigned n = 0;

    /* Stale items (keys set again, deleted, given new deadlines) outnumber
     * the keys: start again from the index. Amortised, a rebuild costs
     * less than one entry's look per write that made an item. */
    if (s->due.lost || s->due.n > 2 * (uint64_t)s->ix.n + 1024)
        deadlines_rebuild(s);
    s->removing = true;
    for (const struct kv_deadline *d; n < max && (d = kv_deadline_top(&s->due)) &&
                                     d->at_ms <= now_ms;) {
        uint32_t i = d->ent;
        struct kv_ent *e = i < s->ix.top ? &s->ix.ents[i] : NULL;
        uint8_t key[KV_KEY_MAX];
        struct pm_rec r;

        kv_deadline_pop(&s->due);
        /* Is the item still the truth: the entry's newest record an
         * expiring one that is due? */
        if (!e || e->loc == KV_FREE || !ent_expiring(s, e) ||
            pm_rec_read(s->pool, ent_loc(e), &r) < 0 ||
            rec_deadline(pm_rec_at(s->pool, ent_loc(e))) > now_ms)
            continue;
        /* Copied: the delete may move the record. */
        memcpy(key, pm_rec_key(pm_rec_at(s->pool, ent_loc(e))), r.key_len);
        if (kvs_del(s, key, r.key_len, 0, NULL) < 0) {
            /* No room for a tombstone now: try again at the next round. */
            kv_deadline_push(&s->due, now_ms, i);
            break;
        }
        s->st.expired++;
        n++;
    }
    s->removing = false;
    return n;
}

uint64_t kvs_expiring(const struct kvs *s)
{
    return s->expiring;
}
