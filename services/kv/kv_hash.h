/* The key hash that client and server share: the server's index and the
 * client's routing both use it, so it needs nothing of the pool. */
#ifndef TERN_KV_HASH_H
#define TERN_KV_HASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The 64-bit hash of a key (XXH3); a server owns the keys whose top 32 bits
 * fall in its range. */
uint64_t kv_hash(const void *key, size_t klen);

#ifdef __cplusplus
}
#endif

#endif
