/* Configuration structs that can grow. Each public one starts with
 * `uint32_t size`: the caller sets sizeof(the struct) as its header had it,
 * or leaves 0, which means the layout of tern 0.1 (every field up to the
 * first marked "since" later). The library copies that many bytes over a
 * zeroed struct of its own, so fields the caller's header did not have read
 * as 0: their defaults. A caller built against a newer header passes a
 * larger size, whose fields this build does not know and ignores. */
#ifndef TERN_CFG_H
#define TERN_CFG_H

#include <stdint.h>
#include <string.h>

/* Copy `src` (NULL: all defaults) into `dst` of `dst_size` bytes, of which
 * the first `v0_1` made up the tern 0.1 layout. */
static inline void tp_cfg_copy(void *dst, size_t dst_size, const void *src, size_t v0_1)
{
    size_t n = 0;

    memset(dst, 0, dst_size);
    if (src) {
        uint32_t size;

        memcpy(&size, src, sizeof(size));
        n = size ? size : v0_1;
        if (n > dst_size)
            n = dst_size;
        memcpy(dst, src, n);
    }
    if (n >= sizeof(uint32_t))
        memcpy(dst, &(uint32_t){(uint32_t)dst_size}, sizeof(uint32_t));
}

#endif
