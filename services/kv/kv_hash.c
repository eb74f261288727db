#include <xxhash.h>

#include "kv_hash.h"

uint64_t kv_hash(const void *key, size_t klen)
{
    return XXH3_64bits(key, klen);
}
