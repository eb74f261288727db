/* The document store's insides, shared by doc_store.c (records, catalog,
 * recovery, cleaning, writes) and doc_index.c (index keys, indexes,
 * planner and scans). */
#ifndef TERN_DOC_STORE_INTERNAL_H
#define TERN_DOC_STORE_INTERNAL_H

#include "doc_bson.h"
#include "doc_btree.h"
#include "doc_repl.h"
#include "doc_store.h"
#include "pm/pm.h"

#define DOC_NS_MAX 300           /* "db.coll" */

struct doc_index {
    char name[128];
    bson_t *key;                 /* the key pattern, our copy */
    unsigned nfields;
    char *paths[DOC_INDEX_FIELDS_MAX];
    bool desc[DOC_INDEX_FIELDS_MAX];
    bool unique;
    bool is_id;                  /* the _id index: entry key = _id key string */
    bool multikey;               /* some document gave several entries */
    struct doc_bt bt;            /* entry key -> slot; secondary entries end with
                                  * the slot (8 bytes, big-endian) */
};

/* A document's place: where its record is, and how many older records of
 * its key the pool still holds (a tombstone of the key must stay while
 * any does). */
struct doc_slot {
    pm_loc loc;                  /* 0: free */
    uint32_t len;                /* BSON bytes */
    uint32_t n_old;
};

struct doc_coll {
    struct doc_store *s;
    char db[64];
    char name[204];
    char ns[DOC_NS_MAX];
    uint64_t id;
    pm_loc cat_loc;              /* its catalog record */
    uint32_t cat_n_old;
    struct doc_slot *slots;      /* ref = index + 1 */
    uint64_t nslots, cap;
    uint64_t *free_slots;
    uint64_t nfree, free_cap;
    struct doc_index *ix[DOC_INDEXES_MAX];   /* ix[0]: _id_ */
    unsigned nix;
    uint64_t count, bytes;
    bool dropped;                /* kept while scans hold it */
    unsigned scans;
    uint64_t wgen;               /* changes at every write to the collection */
};

/* A deleted key whose older records the pool still holds. */
struct doc_tomb {
    pm_loc loc;
    uint32_t n_old;
};

struct doc_store {
    struct pm_pool *pool;
    struct pm_cleaner cleaner;
    struct doc_bt by_ns;         /* "db.coll" -> struct doc_coll * */
    struct doc_bt by_id;         /* collection id (8 bytes BE) -> struct doc_coll * */
    struct doc_bt tombs;         /* record key -> struct doc_tomb * */
    struct doc_coll **zombies;   /* dropped, still held by scans */
    unsigned nzombies;
    uint64_t next_id;
    size_t max_doc;
    bool dirty;
    uint32_t reserve;            /* free segments kept by cleaning */
    struct doc_buf k1, k2;       /* scratch key buffers */
    struct doc_buf ka;           /* doc_store_apply's record key */
    uint64_t recover_ms;
    char *path;                  /* the pool's file, and how it was made: */
    struct pm_opts popts;        /* a replica's wipe makes it anew */
    doc_tap_fn tap;              /* doc_store_set_tap() */
    void *tap_arg;
    uint64_t forced;             /* doc_store_apply: the version to write */
    struct doc_bt sessions;      /* session id (16 bytes) -> struct doc_sess * */
    unsigned n_sessions;
    uint8_t expire_at[16];       /* doc_txn_expire's walk */
};

/* A session's retryable-write record (doc_txn.c). */
struct doc_sess {
    pm_loc loc;
    uint32_t n_old;
    int64_t at;                  /* its last write, wall clock ms */
};
#define DOC_SESSIONS_MAX 100000

/* Record keys. */
#define DOC_REC_CATALOG 'C'
#define DOC_REC_DOC 'D'
#define DOC_REC_SESSION 'S'         /* + a session id (16 bytes): doc_txn.c */
void doc_rec_key_doc(struct doc_buf *b, uint64_t coll_id, const bson_value_t *id);

void doc_rec_key_catalog(struct doc_buf *b, const char *ns);

/* Append a record under the next version (the forced one while applying
 * a shipped record), cleaning for room; DOC_OutOfDiskSpace when full. The
 * tap sees it. */
int doc_rec_append(struct doc_store *s, enum pm_rec_type type, const struct doc_buf *key,
                   const void *val, uint32_t len, pm_loc *loc, struct doc_err *e);

/* A key's tombstone: taken when a new record of the key supersedes it
 * (the count of its older records, itself included), put when the key is
 * deleted (dead at once if no older record remains). */
uint32_t doc_tomb_take(struct doc_store *s, const struct doc_buf *key);
int doc_tomb_put(struct doc_store *s, const struct doc_buf *key, pm_loc loc, uint32_t n_old);

int doc_check_names(const char *db, const char *coll, struct doc_err *e);
struct doc_coll *doc_coll_by_ns(struct doc_store *s, const char *ns);
struct doc_coll *doc_coll_by_id(struct doc_store *s, uint64_t id);

/* A collection in DRAM only (its catalog record is the caller's). */
struct doc_coll *doc_coll_new(struct doc_store *s, const char *db, const char *name,
                              uint64_t id, struct doc_err *e);

/* Drop a collection: a tombstone for its catalog record, then forget it.
 * 1, or -1 with *e. */
int doc_coll_remove(struct doc_coll *c, struct doc_err *e);

/* Forget a collection whose catalog record is gone or superseded: its
 * documents' records are dead, it leaves the maps, and scans still on it
 * end. */
void doc_coll_forget(struct doc_coll *c);

/* doc_insert and doc_replace, with the unique indexes checked or not (a
 * replica applies what its primary checked). */
int doc_insert_doc(struct doc_coll *c, const bson_t *doc, bool unique, struct doc_err *e);
int doc_replace_doc(struct doc_coll *c, doc_ref ref, const bson_t *doc, bool unique,
                    struct doc_err *e);

/* A catalog record's value: {id, db, coll, indexes: [{key, name, unique}]}
 * as views into it (_id_ left out). DOC_InvalidBSON if malformed. */
struct doc_cat_index {
    bson_t key;
    const char *name;
    bool unique;
};
struct doc_cat {
    int64_t id;
    const char *db, *name;
    unsigned nix;
    struct doc_cat_index ix[DOC_INDEXES_MAX - 1];
};
int doc_catalog_parse(const void *val, uint32_t len, struct doc_cat *out, struct doc_err *e);

/* ---- doc_txn.c: retryable writes' records (doc_store.h) ---- */

int doc_txn_drop(struct doc_store *s, const uint8_t lsid[16], struct doc_err *e);

/* A record's value as written (a replica's apply): no parsing here. */
int doc_txn_write(struct doc_store *s, const uint8_t lsid[16], const void *val, uint32_t len,
                  int64_t at, struct doc_err *e);

/* A record's value: false if it is not {t: int64, at, r: document}. */
bool doc_txn_parse(const void *val, uint32_t len, int64_t *txn, int64_t *at, bson_t *reply);


/* The BSON of a slot's document (a view into the pool). */
bool doc_slot_view(const struct doc_coll *c, const struct doc_slot *sl, bson_t *view);

/* ---- doc_index.c ---- */

/* A new index from its key pattern (checked: 1..32 fields of 1 or -1). */
struct doc_index *doc_index_new(const bson_t *key, const char *name, bool unique,
                                struct doc_err *e);
void doc_index_free(struct doc_index *ix);

/* The entries a document gives an index (key strings without the slot
 * suffix), deduplicated, back to back in `out` with their lengths in
 * lens[]; *arrays (may be NULL) says an array was met (the index is
 * multikey from then on). DOC_BadValue for parallel arrays in a compound
 * key. */
#define DOC_IX_KEYS_MAX 4096
#define DOC_INDEX_DEPTH_MAX 100      /* as MongoDB's documents nest at most */
int doc_index_keys(const struct doc_index *ix, const bson_t *doc, struct doc_buf *out,
                   uint32_t *lens, unsigned *n, bool *arrays, struct doc_err *e);

/* Can `doc` be stored as slot `self` (UINT64_MAX: a new document)? Its
 * entries must be computable (DOC_BadValue for parallel arrays in a
 * compound key), and with `unique` no unique index may hold one of them
 * for another document (DOC_DuplicateKey with MongoDB's errmsg). */
int doc_index_check(struct doc_coll *c, const bson_t *doc, uint64_t self, bool unique,
                    struct doc_err *e);

/* Add or remove a document's entries in every index. Add can fail only
 * for memory (the caller checked uniqueness). */
int doc_index_add_doc(struct doc_coll *c, const bson_t *doc, uint64_t slot, struct doc_err *e);
void doc_index_remove_doc(struct doc_coll *c, const bson_t *doc, uint64_t slot);

/* Build one index over the collection's documents; `check`: refuse a
 * unique index's clash (DOC_DuplicateKey), else let it be. */
int doc_index_build(struct doc_coll *c, struct doc_index *ix, bool check, struct doc_err *e);

/* The catalog entry's indexes array. */
void doc_index_append_specs(const struct doc_coll *c, bson_t *arr);

/* Release a dropped collection whose last scan closed. */
void doc_coll_release(struct doc_coll *c);

/* Persist the collection's catalog entry (indexes changed). */
int doc_catalog_write(struct doc_coll *c, struct doc_err *e);

#endif
