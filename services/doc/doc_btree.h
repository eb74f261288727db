/* An ordered map in DRAM from byte strings (key strings, doc_bson.h) to
 * 64-bit values: every index of the document store is one.
 *
 * A B+tree: leaves hold up to DOC_BT_FANOUT entries in key order and are
 * chained left to right; inner nodes hold separators. Keys are copied into
 * the tree. Removal never merges nodes (an emptied leaf stays in the chain
 * until the tree is freed): the tree's size follows its peak, which suits
 * indexes rebuilt at every open.
 *
 * Positions: a doc_bt_pos is a leaf and a slot; any insert or removal
 * invalidates every position (doc_bt_gen changes), so a reader that keeps
 * a place across writes keeps the last key it saw and seeks again.
 *
 * One thread: the store's owner. */
#ifndef TERN_DOC_BTREE_H
#define TERN_DOC_BTREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DOC_BT_FANOUT 64

struct doc_bt_node;

struct doc_bt {
    struct doc_bt_node *root;
    uint64_t count;
    uint64_t gen;                /* changes at every insert and removal */
    size_t bytes;                /* memory held (nodes and keys) */
};

struct doc_bt_pos {
    struct doc_bt_node *leaf;
    unsigned i;
};

void doc_bt_init(struct doc_bt *t);
void doc_bt_free(struct doc_bt *t);

/* Insert key -> val. 1 if inserted, 0 if the key was there (its value is
 * left alone; *old gets it if not NULL), TERN_ENOMEM. */
int doc_bt_insert(struct doc_bt *t, const void *key, size_t len, uint64_t val, uint64_t *old);

/* Remove the key: true and *val if it was there. */
bool doc_bt_remove(struct doc_bt *t, const void *key, size_t len, uint64_t *val);

/* The value of key: true and *val if it is there. */
bool doc_bt_find(const struct doc_bt *t, const void *key, size_t len, uint64_t *val);

/* Replace the value of an existing key (no structural change: positions
 * stay valid). false if the key is not there. */
bool doc_bt_set(struct doc_bt *t, const void *key, size_t len, uint64_t val);

/* The first entry with key >= `key` (or > if `after`); len 0 = the first.
 * false at the end. */
bool doc_bt_seek(const struct doc_bt *t, const void *key, size_t len, bool after,
                 struct doc_bt_pos *p);

/* The last entry with key <= `key` (or < if `before`); len 0 with
 * before=false = the last. false if none. */
bool doc_bt_seek_rev(const struct doc_bt *t, const void *key, size_t len, bool before,
                     struct doc_bt_pos *p);

/* Step forward / backward; false at the end. */
bool doc_bt_next(struct doc_bt_pos *p);
bool doc_bt_prev(const struct doc_bt *t, struct doc_bt_pos *p);

/* The entry at a valid position. */
const uint8_t *doc_bt_key(const struct doc_bt_pos *p, size_t *len);
uint64_t doc_bt_val(const struct doc_bt_pos *p);

#endif
