/* The cluster key file, as ternd (key_file), tern (--key-file) and
 * rpcbench read it: 64 hex digits (32 bytes, `openssl rand -hex 32`), or
 * 16..64 raw bytes; a trailing newline is not part of it. The file must be
 * readable by its owner only (mode 600 or stricter), as ssh asks of a
 * private key. */
#ifndef TERN_TOOLS_KEY_H
#define TERN_TOOLS_KEY_H

#include <stddef.h>
#include <stdint.h>

#define KEY_MAX 64

/* Read `path` into key (KEY_MAX bytes) and *len. 0, or -1 with the reason
 * in why (why_len bytes). */
int key_load(const char *path, uint8_t *key, size_t *len, char *why, size_t why_len);

#endif
