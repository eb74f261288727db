/* The RESP2 request parser (services/kv/resp_parse.c) on a client's byte
 * stream. The stream is parsed twice: whole, and as it would arrive in
 * reads of fuzzer-chosen sizes, resuming after each RESP_MORE with the
 * parsed bytes dropped from the front (as the gateway compacts its input
 * buffer). The parser is resumable, so both must find the same commands,
 * with every argument inside its command, and end in the same state. */
#include "fuzz.h"
#include "resp_parse.h"

#define MAX_CMDS 256

struct outcome {
    unsigned n_cmds;
    uint64_t digest;            /* of every command's arguments, in order */
    int last;                   /* the status that ended the parse */
    char error[64];
};

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;

    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void take_cmd(struct resp_parser *p, const char *cmd, size_t avail, struct outcome *o)
{
    FZ_CHECK(p->pos > 0 && p->pos <= avail, "command of %zu bytes in %zu", p->pos, avail);
    o->digest = mix(o->digest, &p->argc, sizeof(p->argc));
    for (size_t i = 0; i < p->argc; i++) {
        FZ_CHECK(p->argv[i].off <= p->pos && p->argv[i].len <= p->pos - p->argv[i].off,
                 "argument %zu at %zu+%zu outside a %zu-byte command", i, p->argv[i].off,
                 p->argv[i].len, p->pos);
        o->digest = mix(o->digest, &p->argv[i].len, sizeof(p->argv[i].len));
        o->digest = mix(o->digest, cmd + p->argv[i].off, p->argv[i].len);
    }
    o->n_cmds++;
}

static void end(struct resp_parser *p, enum resp_status rc, struct outcome *o)
{
    o->last = rc;
    if (rc == RESP_ERROR)
        snprintf(o->error, sizeof(o->error), "%s", p->error);
}

/* Everything at once. */
static void whole(const char *s, size_t n, size_t max_request, struct outcome *o)
{
    struct resp_parser p;
    size_t off = 0;

    resp_parser_init(&p, max_request);
    for (;;) {
        enum resp_status rc = resp_parse(&p, s + off, n - off);

        if (rc != RESP_CMD || o->n_cmds == MAX_CMDS) {
            end(&p, rc, o);
            break;
        }
        take_cmd(&p, s + off, n - off, o);
        off += p.pos;
        resp_parser_reset(&p);
    }
    resp_parser_free(&p);
}

/* In reads of the sizes `steps` gives, into a buffer that holds only what
 * arrived and is not parsed yet. */
static void pieces(const char *s, size_t n, size_t max_request, struct fz *steps,
                   struct outcome *o)
{
    struct resp_parser p;
    char *buf = malloc(n ? n : 1);
    size_t used = 0, len = 0, sent = 0;

    FZ_CHECK(buf, "no memory");
    resp_parser_init(&p, max_request);
    for (;;) {
        enum resp_status rc = resp_parse(&p, buf + used, len - used);

        if (rc == RESP_CMD && o->n_cmds < MAX_CMDS) {
            take_cmd(&p, buf + used, len - used, o);
            used += p.pos;
            resp_parser_reset(&p);
            continue;
        }
        if (rc == RESP_MORE && sent < n) {
            /* Once the sizes run out, the rest arrives at once. */
            size_t step = steps->n ? 1 + (size_t)fz_u8(steps) % 64 : n - sent;

            FZ_CHECK(p.need > len - used, "RESP_MORE asks for %zu with %zu there", p.need,
                     len - used);
            /* Compact, then read. */
            memmove(buf, buf + used, len - used);
            len -= used;
            used = 0;
            if (step > n - sent)
                step = n - sent;
            memcpy(buf + len, s + sent, step);
            len += step;
            sent += step;
            continue;
        }
        end(&p, rc, o);
        break;
    }
    resp_parser_free(&p);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    /* Small limits reach the size checks; 0 picks the gateway's default. */
    static const size_t limits[] = {64u << 20, 16, 64, 100, 1024, 4096, 65536, 1u << 20};
    size_t max_request = limits[fz_u8(&f) % 8];
    uint8_t n_steps = fz_u8(&f);
    const uint8_t *steps_p, *stream;
    size_t steps_n = fz_take(&f, n_steps, &steps_p);
    size_t n = fz_take(&f, f.n, &stream);
    struct fz steps = {steps_p, steps_n};
    struct outcome a = {0}, b = {0};

    whole((const char *)stream, n, max_request, &a);
    pieces((const char *)stream, n, max_request, &steps, &b);
    FZ_CHECK(a.n_cmds == b.n_cmds && a.digest == b.digest,
             "whole: %u commands, in pieces: %u (or other arguments)", a.n_cmds, b.n_cmds);
    FZ_CHECK(a.last == b.last && strcmp(a.error, b.error) == 0,
             "whole ends with %d (%s), in pieces with %d (%s)", a.last, a.error, b.last,
             b.error);
    return 0;
}
