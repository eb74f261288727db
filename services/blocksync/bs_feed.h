/* The block feed (bs_wire.h: BS_M_SUBSCRIBE, BS_M_FEED, BS_M_FEED_STATS):
 * the server's registry of subscribers and its handlers, and a client's
 * subscription.
 *
 * Server: a subscriber is a position in the log, a filter, and when it
 * last asked; every block it is sent is read from the store then. At most
 * BS_FEED_MAX subscribers in all and BS_FEED_PER_SESSION per session
 * (TERN_ENOSPC beyond): a client cannot take more than its share. Its
 * subscriptions end with its session.
 *
 * Client: bs_feed_subscribe, then bs_feed_poll as often as it likes; each
 * poll acknowledges what the last one gave and asks for up to `credits`
 * more. Every block or header given is checked to follow the one before
 * (height and parent id, the header hashed), so that a node cannot skip a
 * block unseen; a node whose chain parted from the one the subscriber
 * followed says "forked" (TERN_EFORKED). After a reconnect,
 * bs_feed_resume starts again where it stopped, checked the same way.
 *
 * Threads: the server side runs on its endpoint's thread; a subscription
 * belongs to the thread of its session. */
#ifndef TERN_BS_FEED_H
#define TERN_BS_FEED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bs_store.h"
#include "bs_wire.h"
#include "rpc.h"

#define BS_FEED_MAX 4096
#define BS_FEED_PER_SESSION 64

/* ---- server ---- */

struct bs_feed;

struct bs_feed *bs_feed_new(struct bs_store *st);
void bs_feed_free(struct bs_feed *f);
unsigned bs_feed_count(const struct bs_feed *f);

/* A session is gone: its subscriptions end. */
void bs_feed_session_closed(struct bs_feed *f, struct tern_session *s);

int bs_feed_on_subscribe(struct bs_feed *f, struct tern_req *req, const void *data, size_t len);
int bs_feed_on_feed(struct bs_feed *f, struct tern_req *req, const void *data, size_t len);
int bs_feed_on_stats(struct bs_feed *f, struct tern_req *req, const void *data, size_t len);

/* ---- client ---- */

struct bs_feed_sub {
    struct tern_session *s;
    uint64_t id;
    uint64_t next;                   /* the next height to be given */
    uint64_t head;                   /* the node's, as of the last reply */
    uint8_t last[BS_ID_LEN];         /* id of block next-1 */
    bool have_last;
    uint32_t flags;                  /* BS_SUB_HEADERS */
    uint32_t credits, max_bytes;
    uint64_t timeout_ns;
    struct bs_hasher *hs;
    uint8_t *buf;                    /* the reply */
    size_t cap;
};

/* Subscribe on `s`: from = BS_FROM_HEIGHT with `height` (and the id of
 * block height-1 if known, else NULL), BS_FROM_NEXT or BS_FROM_LATEST.
 * credits: blocks per poll (0 = 64); the reply buffer is max_msg bytes
 * (0 = 1 MiB). 0, TERN_EFORKED, TERN_ENOSPC, or the call's error; on an
 * error `sub` holds nothing (no bs_feed_sub_free needed). */
int bs_feed_subscribe(struct bs_feed_sub *sub, struct tern_session *s, enum bs_from from,
                      uint64_t height, const uint8_t *parent, uint32_t flags, uint32_t credits,
                      size_t max_msg);

/* Again on a new session, from where `sub` stopped. */
int bs_feed_resume(struct bs_feed_sub *sub, struct tern_session *s);

/* One poll: fn(arg, height, block or header, len) for each block given,
 * in order. Returns how many (0: none yet), TERN_EFORKED, TERN_EPROTO (the
 * node's reply did not hold together, or skipped a block), fn's negative
 * return, or the call's error. */
int bs_feed_poll(struct bs_feed_sub *sub,
                 int (*fn)(void *arg, uint64_t height, const uint8_t *p, size_t len), void *arg);

void bs_feed_sub_free(struct bs_feed_sub *sub);

#endif
