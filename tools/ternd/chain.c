/* ternd's block-sync service: a chain file (chain.pool) under --data-dir,
 * served to peers, caught up from --chain-peer at start, fed to
 * subscribers. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "ternd_chain.h"

#if TERN_HAVE_BLOCKSYNC

#include "bs_service.h"
#include "bs_store.h"
#include "bs_sync.h"

struct ternd_chain {
    const struct ternd_chain_opts *o;
    struct bs_store *st;
    struct bs_service *svc;
    char path[4096];
    bool created;
};

int ternd_chain_open(const struct ternd_chain_opts *o, const char *data_dir,
                     struct ternd_chain **out)
{
    struct ternd_chain *c = calloc(1, sizeof(*c));
    struct bs_store_opts so = {.size = o->size, .chain = o->chain, .create = true};
    struct bs_service_opts vo = {.fault = o->fault, .allow_append = o->producers};
    struct stat sb;
    int rc;

    if (!c)
        return TERN_ENOMEM;
    c->o = o;
    snprintf(c->path, sizeof(c->path), "%s/chain.pool", data_dir);
    c->created = stat(c->path, &sb) < 0 && errno == ENOENT;
    rc = bs_store_open(c->path, &so, &c->st);
    if (rc < 0) {
        tern_log(TERN_LOG_ERROR, "ternd", "chain %s: %s", c->path, tern_strerror(rc));
        if (rc == TERN_ECORRUPT)
            tern_log(TERN_LOG_ERROR, "ternd", "run `tern chain verify %s` for the height; the file was "
                    "left as it is", c->path);
        if (rc == TERN_EINVAL)
            tern_log(TERN_LOG_ERROR, "ternd", "--chain-id does not match the chain in that file");
        free(c);
        return rc;
    }
    /* Its log is read by peers from the first request on. */
    bs_store_prefault(c->st);
    rc = bs_service_new(c->st, &vo, &c->svc);
    if (rc < 0) {
        ternd_chain_close(c, true);
        return rc;
    }
    *out = c;
    return 0;
}

int ternd_chain_register(struct ternd_chain *c, struct tern_rpc_ep *ep)
{
    int rc = tern_rpc_register(ep, bs_service_def(c->svc));

    /* Without a put source, ranges go inline: slower, not wrong. */
    if (rc == 0 && bs_service_enable_put(c->svc, ep) < 0)
        tern_log(TERN_LOG_WARN, "ternd", "chain: no one-sided source: ranges go inline");
    return rc;
}

int ternd_chain_ready(const struct ternd_chain *c, char *buf, size_t len)
{
    struct bs_store_info info;

    bs_store_info(c->st, &info);
    return snprintf(buf, len, " chain=%.300s blocks=%" PRIu64, c->path, info.committed);
}

static void progress(void *arg, const struct bs_sync_progress *p)
{
    (void)arg;
    tern_log(TERN_LOG_INFO, "ternd", "chain: catching up: %" PRIu64 "/%" PRIu64 " blocks, %.2f GB, "
            "%.1f s, %u peers", p->committed, p->target, (double)p->bytes / 1e9, p->seconds,
            p->peers);
}

int ternd_chain_catch_up(struct ternd_chain *c, struct tern_rpc_ep *ep,
                         const volatile int *stop)
{
    struct bs_sync_opts so = {.peers = c->o->peers, .n_peers = c->o->n_peers, .svc = c->svc,
                              .workers = c->o->workers == UINT32_MAX ? bs_sync_auto_workers()
                                                                     : c->o->workers,
                              .one_sided = true, .stop = stop,
                              .progress = progress, .progress_ns = 5000000000ull};
    struct bs_sync_stats s;
    int rc;

    if (!c->o->n_peers)
        return 0;
    rc = bs_sync_run(ep, c->st, &so, &s);
    for (unsigned i = 0; i < s.n_peers; i++)
        if (s.peer[i].dropped)
            tern_log(TERN_LOG_WARN, "ternd", "chain: peer %s: %s", s.peer[i].uri, s.peer[i].dropped);
    printf("ternd chain %s blocks=%" PRIu64 " irreversible=%" PRIu64 " fetched=%" PRIu64
           " bytes=%" PRIu64 " seconds=%.2f%s%s\n",
           rc == 0 ? "in-sync" : "behind", s.committed, bs_store_irreversible(c->st), s.blocks,
           s.bytes, s.seconds, rc ? " error=" : "", rc ? tern_strerror(rc) : "");
    fflush(stdout);
    return rc;
}

void ternd_chain_close(struct ternd_chain *c, bool failed_start)
{
    if (!c)
        return;
    bs_service_free(c->svc);
    bs_store_close(c->st);
    /* A chain file this start made holds nothing yet. */
    if (failed_start && c->created)
        unlink(c->path);
    free(c);
}

#else

int ternd_chain_open(const struct ternd_chain_opts *o, const char *data_dir,
                     struct ternd_chain **out)
{
    (void)o;
    (void)data_dir;
    (void)out;
    return TERN_ENOTSUP;
}

int ternd_chain_register(struct ternd_chain *c, struct tern_rpc_ep *ep)
{
    (void)c;
    (void)ep;
    return TERN_ENOTSUP;
}

int ternd_chain_ready(const struct ternd_chain *c, char *buf, size_t len)
{
    (void)c;
    (void)buf;
    (void)len;
    return 0;
}

int ternd_chain_catch_up(struct ternd_chain *c, struct tern_rpc_ep *ep,
                         const volatile int *stop)
{
    (void)c;
    (void)ep;
    (void)stop;
    return 0;
}

void ternd_chain_close(struct ternd_chain *c, bool failed_start)
{
    (void)c;
    (void)failed_start;
}

#endif
