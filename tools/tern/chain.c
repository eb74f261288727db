/* tern chain: make, extend, show and check a block-sync chain, in its file
 * (ternd stopped) or on a running ternd (--uri).
 *
 *   tern chain gen PATH [--shape eos|btc] (--blocks N | --bytes SIZE)
 *                  [--chain ID] [--seed N] [--reversible N] [--size SIZE]
 *   tern chain append (PATH | --uri URI) --blocks N [--seed N] [--reversible N]
 *   tern chain info (PATH | --uri URI)
 *   tern chain verify (PATH | --uri URI)
 *
 * gen writes a synthetic chain with real ids and Merkle roots (bs_gen.h):
 * EOS-like (about 25 transactions of about 170 B a block) or Bitcoin-like
 * (2,000 to 3,500 transactions, 1.0 to 1.7 MB a block). append extends a
 * chain with blocks of its shape; on a running ternd they go through the
 * producer call, each checked and durable before the next. verify reads
 * every block back and checks the whole chain (record sums, ids, parents,
 * Merkle roots); over --uri it fetches the chain as a peer would.
 * Exit status: 0 sound, 1 a chain that fails its checks (the report names
 * the height), 2 usage or another error. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "opt.h"
#include "tern_config.h"
#include "terncli.h"

#if TERN_HAVE_BLOCKSYNC

#include "bs_gen.h"
#include "bs_store.h"
#include "bs_wire.h"
#include "rpc.h"

#define TIMEOUT_NS 30000000000ull
#define DEFAULT_CHAIN 0x7465726eull      /* "tern" */

struct copts {
    const char *path, *uri;
    enum bs_shape shape;
    uint64_t blocks, bytes, chain, seed, reversible, size;
    bool have_reversible;
};

static void hex(const uint8_t *id, char out[2 * BS_ID_LEN + 1])
{
    for (unsigned i = 0; i < BS_ID_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", id[i]);
}

static void gen_progress(void *arg, uint64_t blocks, uint64_t bytes)
{
    (void)arg;
    fprintf(stderr, "tern chain: %" PRIu64 " blocks, %" PRIu64 " MiB\n", blocks, bytes >> 20);
}

/* ---- a chain file ---- */

static int file_gen(const struct copts *o)
{
    /* The file: room for the log asked for, a tenth more, and an index
     * of one entry per 2 KiB of it (or per block asked for, twice). */
    uint64_t avg = o->shape == BS_SHAPE_EOS ? 4600 : 1400000;
    uint64_t want = o->bytes ? o->bytes : o->blocks * avg;
    uint64_t size = o->size ? o->size : want + want / 10 + (64u << 20);
    struct bs_store_opts so = {.size = size, .chain = o->chain, .create = true};
    struct bs_store_info info;
    struct bs_hasher *hs = bs_hasher_new();
    struct bs_store *st;
    struct bs_gen g;
    int rc;

    if (o->blocks && o->blocks * 2 > size / 2048)
        so.max_blocks = o->blocks * 2;
    if (!hs) {
        fprintf(stderr, "tern: no SHA-256 (libcrypto)\n");
        return 2;
    }
    rc = bs_store_open(o->path, &so, &st);
    if (rc < 0) {
        fprintf(stderr, "tern: %s: %s\n", o->path, tern_strerror(rc));
        bs_hasher_free(hs);
        return 2;
    }
    if (bs_store_top(st)) {
        fprintf(stderr, "tern: %s holds a chain already (use append)\n", o->path);
        bs_store_close(st);
        bs_hasher_free(hs);
        return 2;
    }
    bs_gen_init(&g, o->shape, o->chain, o->seed);
    rc = bs_gen_fill(&g, hs, st, o->blocks, o->bytes, o->have_reversible ? o->reversible : 100,
                     0, gen_progress, NULL);
    bs_store_info(st, &info);
    if (rc == 0)
        printf("chain %" PRIx64 " (%s-like): %" PRIu64 " blocks, %" PRIu64
               " log bytes, irreversible %" PRIu64 "\n",
               info.chain, bs_shape_name(o->shape), info.committed, info.data_used,
               info.irreversible);
    else
        fprintf(stderr, "tern: %s: %s\n", o->path, tern_strerror(rc));
    bs_store_close(st);
    bs_hasher_free(hs);
    return rc ? 2 : 0;
}

static int open_file(const char *path, bool ro, struct bs_store **st)
{
    struct bs_store_opts so = {.read_only = ro};
    int rc = bs_store_open(path, &so, st);

    if (rc == TERN_EBUSY)
        fprintf(stderr, "tern: %s is in use (a running ternd? ask it with --uri)\n", path);
    else if (rc == TERN_ECORRUPT)
        fprintf(stderr, "tern: %s: not a sound chain file (see the line above)\n", path);
    else if (rc < 0)
        fprintf(stderr, "tern: %s: %s\n", path, tern_strerror(rc));
    return rc == TERN_ECORRUPT ? 1 : rc < 0 ? 2 : 0;
}

static int file_append(const struct copts *o)
{
    struct bs_hasher *hs = bs_hasher_new();
    struct bs_store *st;
    struct bs_gen g;
    uint64_t from;
    int rc = open_file(o->path, false, &st);

    if (rc)
        return rc;
    from = bs_store_top(st);
    bs_gen_init(&g, o->shape, bs_store_chain(st), o->seed);
    /* Committed every 256 KiB, as a producer would commit blocks as they
     * come, not in the big batches of gen. */
    rc = hs ? bs_gen_fill(&g, hs, st, from + o->blocks, 0,
                          o->have_reversible ? o->reversible : 100, 256u << 10, NULL, NULL)
            : TERN_ENOMEM;
    if (rc == 0)
        printf("appended %" PRIu64 " blocks: %" PRIu64 " in all\n", bs_store_committed(st) - from,
               bs_store_committed(st));
    else
        fprintf(stderr, "tern: %s: %s\n", o->path, tern_strerror(rc));
    bs_store_close(st);
    bs_hasher_free(hs);
    return rc ? 2 : 0;
}

static void print_info(uint64_t chain, uint64_t node, uint64_t committed, uint64_t lib,
                       const uint8_t *head, uint64_t used, uint64_t cap, uint64_t idx_cap)
{
    char h[2 * BS_ID_LEN + 1];

    hex(head, h);
    printf("chain         %" PRIx64 "\n", chain);
    if (node)
        printf("node          %" PRIx64 "\n", node);
    printf("blocks        %" PRIu64 " (heights 0..%" PRId64 ")\n", committed,
           (int64_t)committed - 1);
    printf("irreversible  %" PRIu64 "\n", lib);
    printf("head          %s\n", committed ? h : "-");
    printf("log           %" PRIu64 " of %" PRIu64 " bytes (%.1f%%), %.0f bytes a block\n", used,
           cap, cap ? 100.0 * (double)used / (double)cap : 0.0,
           committed ? (double)used / (double)committed : 0.0);
    printf("index         %" PRIu64 " of %" PRIu64 " entries\n", committed, idx_cap);
}

static int file_info(const struct copts *o)
{
    struct bs_store_info info;
    struct bs_store *st;
    uint8_t head[BS_ID_LEN] = {0};
    int rc = open_file(o->path, true, &st);

    if (rc)
        return rc;
    bs_store_info(st, &info);
    if (info.committed)
        bs_store_id(st, info.committed - 1, head);
    print_info(info.chain, 0, info.committed, info.irreversible, head, info.data_used,
               info.data_cap, info.idx_cap);
    bs_store_close(st);
    return 0;
}

static int file_verify(const struct copts *o)
{
    struct bs_hasher *hs = bs_hasher_new();
    struct bs_store_info info;
    struct bs_store *st;
    uint64_t bad = 0, t0 = tern_now_ns();
    const char *why = NULL;
    double s;
    int rc = open_file(o->path, true, &st);

    if (rc)
        return rc;
    rc = hs ? bs_store_verify(st, hs, &bad, &why) : TERN_ENOMEM;
    s = (double)(tern_now_ns() - t0) / 1e9;
    bs_store_info(st, &info);
    bs_store_close(st);
    bs_hasher_free(hs);
    if (rc == TERN_ECORRUPT) {
        printf("corrupt at height %" PRIu64 ": %s\n", bad, why);
        return 1;
    }
    if (rc < 0) {
        fprintf(stderr, "tern: %s: %s\n", o->path, tern_strerror(rc));
        return 2;
    }
    printf("sound: %" PRIu64 " blocks, %" PRIu64 " bytes checked in %.2f s (%.0f MB/s)\n",
           info.committed, info.data_used, s, (double)info.data_used / s / 1e6);
    return 0;
}

/* ---- a running ternd ---- */

static int connect_to(const char *uri, struct tern_rpc_ep **ep, struct tern_session **s)
{
    struct tern_rpc_config cfg = {.size = sizeof(cfg), .max_msg = 4u << 20};
    int rc = tern_rpc_open(&cfg, ep);

    if (rc == 0 && (rc = tern_rpc_connect(*ep, uri, 5000000000ull, s)) < 0)
        tern_rpc_close(*ep);
    if (rc < 0)
        fprintf(stderr, "tern: %s: %s\n", uri, tern_strerror(rc));
    return rc;
}

static int remote_info(struct tern_session *s, struct bs_info *info)
{
    size_t got = 0;
    const char *why;
    int rc = tern_call_sync(s, BS_SERVICE_ID, BS_M_INFO, NULL, 0, info, sizeof(*info), &got,
                            TIMEOUT_NS);

    if (rc == 0 && bs_info_decode(info, got, info, &why) < 0) {
        fprintf(stderr, "tern: info: %s\n", why);
        return TERN_EPROTO;
    }
    if (rc < 0)
        fprintf(stderr, "tern: info: %s\n", rc == TERN_ENOSERVICE
                ? "that ternd hosts no chain (start it with --chain)" : tern_strerror(rc));
    return rc;
}

static int uri_info(const struct copts *o)
{
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct bs_info in;
    int rc;

    if (connect_to(o->uri, &ep, &s) < 0)
        return 2;
    rc = remote_info(s, &in);
    if (rc == 0) {
        print_info(in.chain, in.node, in.committed, in.irreversible, in.head_id, in.data_used,
                   in.data_cap, in.idx_cap);
        printf("state         %s%s\n", in.flags & BS_INFO_SYNCING ? "catching up" : "serving",
               in.flags & BS_INFO_APPEND ? ", takes producers' blocks" : "");
        printf("subscribers   %u\n", in.subscribers);
    }
    tern_rpc_close(ep);
    return rc ? 2 : 0;
}

static int uri_append(const struct copts *o)
{
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct bs_hasher *hs = bs_hasher_new();
    size_t cap;
    uint8_t *msg = NULL;
    struct bs_info in;
    struct bs_gen g;
    uint64_t done = 0;
    int rc;

    if (!hs || connect_to(o->uri, &ep, &s) < 0) {
        bs_hasher_free(hs);
        return 2;
    }
    if ((rc = remote_info(s, &in)) < 0)
        goto out;
    bs_gen_init(&g, o->shape, in.chain, o->seed);
    if (in.committed)
        bs_gen_resume(&g, in.committed, in.head_id);
    cap = sizeof(struct bs_append_req) + bs_gen_block_max(o->shape);
    msg = malloc(cap);
    rc = msg ? 0 : TERN_ENOMEM;
    for (; rc == 0 && done < o->blocks; done++) {
        uint64_t rev = o->have_reversible ? o->reversible : 100;
        struct bs_append_req q = {.lib = g.height + 1 > rev ? g.height + 1 - rev : 0};
        struct bs_append_rep rep;
        uint8_t id[BS_ID_LEN];
        size_t len, got = 0;
        const char *why;

        memcpy(msg, &q, sizeof(q));
        if ((rc = bs_gen_next(&g, hs, msg + sizeof(q), cap - sizeof(q), &len, id)) < 0)
            break;
        rc = tern_call_sync(s, BS_SERVICE_ID, BS_M_APPEND, msg, sizeof(q) + len, &rep,
                            sizeof(rep), &got, TIMEOUT_NS);
        if (rc == 0 && bs_append_rep_decode(&rep, got, &rep, &why) < 0)
            rc = TERN_EPROTO;
        if (rc == 0 && rep.verdict != BS_VALID) {
            fprintf(stderr, "tern: block %" PRIu64 " refused: %s\n", g.height - 1,
                    rep.verdict == BS_APPEND_MALFORMED ? "malformed"
                                                       : bs_verdict_name(rep.verdict));
            rc = TERN_EPROTO;
        }
    }
    if (rc == TERN_EACCES)
        fprintf(stderr, "tern: that ternd takes no producers' blocks (--chain-producers)\n");
    else if (rc == TERN_EBUSY)
        fprintf(stderr, "tern: that ternd is catching up from its peers; try later\n");
    else if (rc < 0 && rc != TERN_EPROTO)
        fprintf(stderr, "tern: append: %s\n", tern_strerror(rc));
    printf("appended %" PRIu64 " blocks\n", rc == 0 ? done : done ? done - 1 : 0);
out:
    free(msg);
    bs_hasher_free(hs);
    tern_rpc_close(ep);
    return rc ? 2 : 0;
}

/* Fetch the chain as a peer would, a batch of headers then their bodies
 * in ranges, and check it block by block. */
static int uri_verify(const struct copts *o)
{
    struct tern_rpc_ep *ep;
    struct tern_session *s;
    struct bs_hasher *hs = bs_hasher_new();
    size_t rep_cap = 4u << 20, got;
    uint8_t *rep = malloc(rep_cap), *span = NULL, prev[BS_ID_LEN];
    const uint8_t **blocks = NULL;
    uint32_t *lens = NULL;
    struct bs_info in;
    uint64_t h = 0, bytes = 0, t0 = tern_now_ns();
    const char *why = NULL;
    int rc, status = 2;

    if (!hs || !rep || connect_to(o->uri, &ep, &s) < 0) {
        bs_hasher_free(hs);
        free(rep);
        return 2;
    }
    if ((rc = remote_info(s, &in)) < 0)
        goto out;
    span = malloc(BS_BLOCK_MAX + (4u << 20));
    blocks = malloc(sizeof(*blocks) * 40000);
    lens = malloc(sizeof(*lens) * 40000);
    if (!span || !blocks || !lens)
        goto out;
    while (h < in.committed) {
        struct bs_headers_req hq = {.from = h, .max = 8192};
        struct bs_headers_rep hr;
        const uint8_t *hdrs;
        uint64_t to = h, span_len = 0, off = 0;

        rc = tern_call_sync(s, BS_SERVICE_ID, BS_M_HEADERS, &hq, sizeof(hq), rep, rep_cap, &got,
                            TIMEOUT_NS);
        if (rc < 0 || bs_headers_rep_decode(rep, got, &hr, &hdrs, &why) < 0 || hr.n == 0) {
            fprintf(stderr, "tern: headers from %" PRIu64 ": %s\n", h,
                    rc < 0 ? tern_strerror(rc) : why ? why : "none");
            goto out;
        }
        /* Up to 4 MiB of log (at least one block) per range. */
        while (to < h + hr.n && to - h < 40000) {
            struct bs_header hd;
            uint64_t rs;

            if (bs_header_decode(hdrs + (to - h) * BS_HDR_SIZE, BS_HDR_SIZE, &hd, &why) < 0) {
                printf("corrupt at height %" PRIu64 ": %s\n", to, why);
                status = 1;
                goto out;
            }
            rs = bs_rec_size(BS_HDR_SIZE + (uint64_t)hd.body_len);
            if (to > h && span_len + rs > (4u << 20))
                break;
            span_len += rs;
            to++;
        }
        while (off < span_len) {
            struct bs_range_req rq = {.from = h, .to = to, .off = off,
                                      .max = (uint32_t)(span_len - off)};
            struct bs_range_rep rr;
            const uint8_t *bytes_in;

            rc = tern_call_sync(s, BS_SERVICE_ID, BS_M_RANGE, &rq, sizeof(rq), rep, rep_cap, &got,
                                TIMEOUT_NS);
            if (rc < 0 || bs_range_rep_decode(rep, got, &rr, &bytes_in, &why) < 0 || !bytes_in ||
                rr.span_len != span_len || rr.off != off || !rr.n) {
                fprintf(stderr, "tern: range %" PRIu64 "..%" PRIu64 ": %s\n", h, to,
                        rc < 0 ? tern_strerror(rc) : why ? why : "a span of another size");
                goto out;
            }
            memcpy(span + off, bytes_in, rr.n);
            off += rr.n;
        }
        uint64_t bad;
        if (bs_span_walk(span, span_len, h, to, blocks, lens, &bad, &why) < 0) {
            printf("corrupt at height %" PRIu64 ": %s\n", bad, why);
            status = 1;
            goto out;
        }
        for (uint64_t i = 0; i < to - h; i++) {
            struct bs_block b;
            uint8_t id[BS_ID_LEN];

            if (bs_block_parse(blocks[i], lens[i], &b, &why) < 0) {
                printf("corrupt at height %" PRIu64 ": %s\n", h + i, why);
                status = 1;
                goto out;
            }
            rc = bs_block_check(hs, &b, in.chain, h + i ? prev : NULL, h + i - 1, id);
            if (rc != BS_VALID) {
                printf("corrupt at height %" PRIu64 ": %s\n", h + i,
                       rc < 0 ? tern_strerror(rc) : bs_verdict_name(rc));
                status = 1;
                goto out;
            }
            memcpy(prev, id, BS_ID_LEN);
        }
        bytes += span_len;
        h = to;
    }
    if (in.committed && memcmp(prev, in.head_id, BS_ID_LEN)) {
        printf("corrupt: the last block is not the head the node names\n");
        status = 1;
        goto out;
    }
    {
        double sec = (double)(tern_now_ns() - t0) / 1e9;
        printf("sound: %" PRIu64 " blocks, %" PRIu64 " bytes fetched and checked in %.2f s "
               "(%.0f MB/s)\n", h, bytes, sec, (double)bytes / sec / 1e6);
    }
    status = 0;
out:
    free(span);
    free(blocks);
    free(lens);
    free(rep);
    bs_hasher_free(hs);
    tern_rpc_close(ep);
    return status;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tern chain gen PATH [--shape eos|btc] (--blocks N | --bytes SIZE)\n"
            "                      [--chain ID] [--seed N] [--reversible N] [--size SIZE]\n"
            "       tern chain append (PATH | --uri URI) --blocks N [--seed N] [--reversible N]\n"
            "       tern chain info (PATH | --uri URI)\n"
            "       tern chain verify (PATH | --uri URI)\n"
            "  --shape       eos: ~25 transactions of ~170 B a block; btc: 2,000-3,500\n"
            "                transactions, 1.0-1.7 MB a block (default eos)\n"
            "  --reversible  blocks left above the irreversible height (default 100)\n"
            "Exit status: 0 sound, 1 a chain that fails its checks, 2 usage or another error.\n");
}

int tern_chain_cmd(int argc, char **argv)
{
    static const char *const shapes[] = {"eos", "btc", NULL};
    struct copts o = {.shape = BS_SHAPE_EOS, .chain = DEFAULT_CHAIN, .seed = 1};
    const char *cmd = argc > 0 ? argv[0] : NULL;

    if (!cmd)
        return opt_usage_error("tern", "chain: gen, append, info or verify is needed");
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;

        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            if (o.path)
                return opt_usage_error("tern", "chain %s: one PATH only", cmd);
            o.path = a;
            continue;
        }
        if (!v)
            return opt_usage_error("tern", "chain %s: %s needs a value", cmd, a);
        i++;
        if (!strcmp(a, "--uri"))
            o.uri = v;
        else if (!strcmp(a, "--shape")) {
            int k = opt_choice("tern", a, v, shapes, NULL);
            if (k < 0)
                return OPT_USAGE;
            o.shape = k == 0 ? BS_SHAPE_EOS : BS_SHAPE_BTC;
        } else if (!strcmp(a, "--blocks"))
            ok = opt_num("tern", a, v, 1, 1ull << 40, 0, &o.blocks);
        else if (!strcmp(a, "--bytes"))
            ok = opt_num("tern", a, v, 4096, 1ull << 44, OPT_SIZE, &o.bytes);
        else if (!strcmp(a, "--chain"))
            ok = opt_num("tern", a, v, 1, UINT64_MAX, 0, &o.chain);
        else if (!strcmp(a, "--seed"))
            ok = opt_num("tern", a, v, 0, UINT64_MAX, 0, &o.seed);
        else if (!strcmp(a, "--reversible")) {
            ok = opt_num("tern", a, v, 0, 1ull << 40, 0, &o.reversible);
            o.have_reversible = true;
        } else if (!strcmp(a, "--size"))
            ok = opt_num("tern", a, v, 2u << 20, 1ull << 44, OPT_SIZE, &o.size);
        else
            return opt_usage_error("tern", "chain %s: unknown option '%s'", cmd, a);
        if (!ok)
            return OPT_USAGE;
    }
    if (!!o.path == !!o.uri)
        return opt_usage_error("tern", "chain %s: a PATH or --uri URI (one of them)", cmd);
    if (!strcmp(cmd, "gen")) {
        if (o.uri)
            return opt_usage_error("tern", "chain gen: writes a file (PATH), not a ternd");
        if (!o.blocks && !o.bytes)
            return opt_usage_error("tern", "chain gen: --blocks N or --bytes SIZE is needed");
        return file_gen(&o);
    }
    if (!strcmp(cmd, "append")) {
        if (!o.blocks)
            return opt_usage_error("tern", "chain append: --blocks N is needed");
        return o.uri ? uri_append(&o) : file_append(&o);
    }
    if (!strcmp(cmd, "info"))
        return o.uri ? uri_info(&o) : file_info(&o);
    if (!strcmp(cmd, "verify"))
        return o.uri ? uri_verify(&o) : file_verify(&o);
    return opt_usage_error("tern", "chain: unknown command '%s' (gen, append, info, verify)",
                           cmd);
}

#else

int tern_chain_cmd(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "tern: chain: built without the block-sync service (libcrypto, libpmem)\n");
    return 2;
}

#endif
