/* The state file: the newest epoch this replica accepted, which must
 * survive a restart (a replica that forgot it would take an old primary's
 * records again). Three lines of text, replaced whole (written to a
 * temporary file, synced, renamed over, the directory synced):
 *
 *   tern-repl 1
 *   shard NAME
 *   epoch N
 *   copying 0|1
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pm/pm.h"
#include "repl_internal.h"

#define STATE_MAX 256

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

int repl_state_parse(const char *buf, size_t len, const char *shard, uint64_t *seen,
                     bool *copying)
{
    static const char head[] = "tern-repl 1\nshard ";
    const char *p = buf, *end = buf + len, *name;
    size_t name_len;
    uint64_t epoch = 0;

    if (len > STATE_MAX || len < sizeof(head) - 1 || memcmp(p, head, sizeof(head) - 1))
        return TERN_ECORRUPT;
    p += sizeof(head) - 1;
    for (name = p; p < end && name_char(*p); p++)
        ;
    name_len = (size_t)(p - name);
    if (!name_len || name_len >= REPL_SHARD_MAX || end - p < 8 || memcmp(p, "\nepoch ", 7))
        return TERN_ECORRUPT;
    p += 7;
    /* Digits, no sign, no leading zero, then the last newline. */
    if (p >= end || *p < '0' || *p > '9' || (*p == '0' && p + 1 < end && p[1] != '\n'))
        return TERN_ECORRUPT;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        epoch = epoch * 10 + (uint64_t)(*p - '0');
        if (epoch > REPL_EPOCH_MAX)
            return TERN_ECORRUPT;
    }
    if (end - p != 11 || memcmp(p, "\ncopying ", 9) || (p[9] != '0' && p[9] != '1') ||
        p[10] != '\n')
        return TERN_ECORRUPT;
    if (strlen(shard) != name_len || memcmp(name, shard, name_len))
        return TERN_EINVAL;
    *seen = epoch;
    *copying = p[9] == '1';
    return 0;
}

int repl_state_load(const char *path, const char *shard, uint64_t *seen, bool *copying)
{
    char buf[STATE_MAX + 1];
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc;

    *seen = 0;
    *copying = false;
    if (fd < 0)
        return errno == ENOENT ? 0 : TERN_EIO;
    n = read(fd, buf, sizeof(buf));
    close(fd);
    if (n < 0)
        return TERN_EIO;
    rc = repl_state_parse(buf, (size_t)n, shard, seen, copying);
    if (rc == TERN_ECORRUPT)
        tern_log(TERN_LOG_ERROR, "repl", "%s: not a replication state file (remove it only if "
                 "this replica's pool is wiped too)", path);
    else if (rc == TERN_EINVAL)
        tern_log(TERN_LOG_ERROR, "repl", "%s: the state of another shard, not %s", path, shard);
    return rc;
}

int repl_see_epoch(struct repl *r, uint64_t epoch)
{
    /* The ring's frames were put under the older epoch: taken now, and
     * none after (repl_ring.h, fencing). */
    repl_ring_retire(r);
    return repl_state_save(r, epoch, r->copying);
}

int repl_state_save(struct repl *r, uint64_t epoch, bool copying)
{
    char tmp[4096], text[STATE_MAX];
    int len = snprintf(text, sizeof(text), "tern-repl 1\nshard %s\nepoch %llu\ncopying %d\n",
                       r->shard, (unsigned long long)epoch, copying ? 1 : 0);
    int fd, rc = 0;

    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", r->state_path) >= sizeof(tmp))
        return TERN_EINVAL;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        rc = TERN_EIO;
    else if (write(fd, text, (size_t)len) != len || fsync(fd) < 0)
        rc = TERN_EIO;
    if (fd >= 0)
        close(fd);
    if (rc == 0 && rename(tmp, r->state_path) < 0)
        rc = TERN_EIO;
    if (rc == 0)
        rc = pm_sync_dir_of(r->state_path);
    if (rc < 0) {
        tern_log(TERN_LOG_ERROR, "repl", "%s: cannot record epoch %llu: %s", r->state_path,
                 (unsigned long long)epoch, strerror(errno));
        unlink(tmp);
        return rc;
    }
    r->seen = epoch;
    r->copying = copying;
    return 0;
}
