/* The cluster key file (key.h). */
#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "key.h"

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int key_load(const char *path, uint8_t *key, size_t *len, char *why, size_t why_len)
{
    uint8_t raw[2 * KEY_MAX + 2];
    struct stat st;
    ssize_t n;
    size_t k;
    bool hex = true;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0) {
        snprintf(why, why_len, "%s", strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "not a regular file");
        close(fd);
        return -1;
    }
    if (st.st_mode & 077) {
        snprintf(why, why_len, "readable or writable by others (mode %03o): chmod 600 it",
                 (unsigned)(st.st_mode & 0777));
        close(fd);
        return -1;
    }
    n = read(fd, raw, sizeof(raw));
    close(fd);
    if (n < 0) {
        snprintf(why, why_len, "%s", strerror(errno));
        return -1;
    }
    k = (size_t)n;
    if (k && raw[k - 1] == '\n')
        k--;
    if (k && raw[k - 1] == '\r')
        k--;
    for (size_t i = 0; i < k; i++)
        hex &= hexval(raw[i]) >= 0;
    if (hex && k >= 32 && k % 2 == 0 && k / 2 <= KEY_MAX) {
        for (size_t i = 0; i < k / 2; i++)
            key[i] = (uint8_t)(hexval(raw[2 * i]) << 4 | hexval(raw[2 * i + 1]));
        *len = k / 2;
    } else if (k >= 16 && k <= KEY_MAX) {
        memcpy(key, raw, k);
        *len = k;
    } else {
        snprintf(why, why_len, "not a key: 64 hex digits (openssl rand -hex 32) or 16..64 "
                 "bytes");
        memset(raw, 0, sizeof(raw));
        return -1;
    }
    memset(raw, 0, sizeof(raw));
    return 0;
}
