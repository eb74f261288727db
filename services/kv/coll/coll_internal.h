/* The collection engine's insides, shared by coll.c (records, DRAM, the
 * calls) and coll_open.c (rebuilding it all at open). Nothing here is for
 * the engine's users (coll.h). */
#ifndef TERN_KV_COLL_INTERNAL_H
#define TERN_KV_COLL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/coll/coll.h"
#include "pm/pm_record.h"

struct kvs;

#define HEAD_BYTES 24u          /* struct kvc_head as stored */

struct kvc {
    struct kvs *s;
    struct kvm_set map;              /* key -> collection (member data) */
    struct kvc_coll **exp;           /* collections with a deadline */
    uint32_t n_exp, cap_exp, exp_next;
    uint64_t expired;               /* removed at their deadline, since open */
    struct kvc_coll *graves;         /* deleted, elements still to delete */
    uint8_t key[PM_KEY_MAX];         /* a record key being built */
    uint8_t *vbuf;                   /* a value copied out of the pool */
    size_t vcap;
};

/* Record keys, built in e->key: a head's, an element's, a list element's.
 * Their lengths. */
size_t coll_head_key(struct kvc *e, const void *key, size_t klen);
size_t coll_elem_key(struct kvc *e, uint64_t gen, const void *suffix, size_t slen);
size_t coll_seq_key(struct kvc *e, uint64_t gen, int64_t seq);

/* A list element's position from its key's suffix. */
int64_t coll_seq_of(const uint8_t *suffix);

/* A head's type byte is one of enum kvc_type. */
bool coll_type_ok(unsigned t);

/* A sorted-set element's score from its value (8 bytes, LE). */
double coll_get_score(const uint8_t *v);

/* A new collection in the map (DRAM only), or NULL without memory or if
 * the key is taken. */
struct kvc_coll *coll_new(struct kvc *e, const void *key, size_t klen, enum kvc_type t);

/* Take c out of the map and of the expiring (its members stay). */
void coll_unmap(struct kvc *e, struct kvc_coll *c);

/* Free c's members (and a sorted set's order). */
void coll_free_members(struct kvc_coll *c);

/* Track c among the expiring if it has a deadline, else untrack it. */
void coll_exp_track(struct kvc *e, struct kvc_coll *c);

/* Delete the record whose key is in e->key (absent: 0). */
int coll_del_elem(struct kvc *e, size_t klen);

/* Stir the seed of kvc_random's picks. */
void coll_seed(uint64_t seed);

#endif
