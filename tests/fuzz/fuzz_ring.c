/* The ring records a peer writes into a window of ours (transport/ring:
 * ring.h's headers and sequence numbers, PAD records, the link's control
 * records on channel 0, messages, fragments of large ones, one-sided
 * requests and answers, credit words), as the shm and ntb fabrics read
 * them. The windows here are plain memory of a window provider the harness
 * defines; the harness plays the peer.
 *
 * The input is a run of steps: the peer publishes a record (a link control
 * record, a message, a fragment, a one-sided request or answer, or any
 * type; its length and bytes the input's, a one-sided request may name our
 * real region), stores any 8 bytes anywhere in our window, or lets our
 * endpoint poll, hold and release views, send messages (large ones go as
 * fragments) and start one-sided operations. The endpoint must survive all
 * of it and hand out no view outside our window. */
#include "fuzz.h"
#include "log.h"
#include "ring/chan.h"

#define N_CHAN 4
#define RING_BYTES 4096
#define MAX_MSG 8192
#define MAX_CONNS 4
#define REGION 4096

/* What chan.c puts in CTL and FRAG records (its own layout, repeated). */
struct fz_ctl {
    uint8_t op;
    uint8_t pad[3];
    int32_t status;
    uint32_t key;
    uint32_t len;
    uint64_t off;
};
struct fz_frag {
    uint32_t total;
    uint32_t offset;
};

static uint8_t region[REGION], local_buf[REGION];
static uint8_t *win_mine;
static size_t win_size;
static volatile uint8_t sink;

static int fz_listen(struct ring_ep *ep, const char *addr, char *bound, size_t bound_len)
{
    return TERN_ENOTSUP;
}

static int fz_connect(struct ring_ep *ep, const char *addr, struct ring_conn *c)
{
    return TERN_EBADADDR;
}

static void fz_doorbell(struct ring_link *l)
{
}

/* The windows are the run's: the peer goes on writing them after our
 * endpoint let a link go, as a real peer may. */
static void fz_release(struct ring_link *l)
{
    l->mine = l->peers = NULL;
}

static const struct ring_link_ops fz_link_ops = {
    .geometry = {.n_chan = N_CHAN, .ring_bytes = RING_BYTES},
    .listen = fz_listen,
    .connect = fz_connect,
    .doorbell = fz_doorbell,
    .link_release = fz_release,
};

static int fz_ep_open(struct tern_tp_ep *base)
{
    return ring_ep_open(base, &fz_link_ops);
}

static const struct tern_tp_ops fz_ops = {
    .ep_open = fz_ep_open,
    .ep_close = ring_tp_ep_close,
    RING_TP_OPS,
    .put = ring_tp_put,
    .get = ring_tp_get,
};

static const struct tern_tp_fabric fz_fabric = {
    .name = "fuzzring",
    .caps = TERN_TP_CAP_MSG | TERN_TP_CAP_PUT | TERN_TP_CAP_GET | TERN_TP_CAP_WAIT_FD |
            TERN_TP_CAP_LISTEN | TERN_TP_CAP_CONNECT,
    .ep_size = sizeof(struct ring_ep),
    .ops = &fz_ops,
};

struct conn_slot {
    struct tern_tp_conn *c;
    const void *views[8];
    unsigned n_views;
};

struct run {
    struct tern_tp_ep *ep;
    struct ring_link *link;
    struct ring_tx ptx[N_CHAN];    /* the peer's senders, into our window */
    struct ring_rx prx[N_CHAN];    /* the peer's receivers, from its own window */
    struct conn_slot conns[MAX_CONNS];
    uint32_t key;
    struct tern_tp_mr *mr, *lmr;
    uint8_t *mine, *peers;
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct ring_geometry g = fz_link_ops.geometry;

    tern_log_set_level(TERN_LOG_ERROR);
    FZ_CHECK(tp_caps_match_ops(&fz_fabric), "the harness's fabric table");
    win_size = RING_LINK_OFF + ring_window_size(&g);
    return 0;
}

static void setup(struct run *r)
{
    struct tern_tp_config cfg = {.fabric = "fuzzring", .max_msg = MAX_MSG, .max_conns = MAX_CONNS};
    struct ring_geometry g = fz_link_ops.geometry;
    uint8_t *mine = calloc(1, win_size), *peers = calloc(1, win_size);
    int rc;

    FZ_CHECK(mine && peers, "no memory");
    rc = tp_open_fabric(&fz_fabric, &cfg, &r->ep);
    FZ_CHECK(rc == 0, "open: %d", rc);
    r->link = ring_link_new(REP(r->ep), -1);
    FZ_CHECK(r->link, "link");
    r->link->g = g;
    r->link->state = LINK_OPEN;
    r->link->mine = mine;
    r->link->peers = peers;
    r->link->win_size = win_size;
    snprintf(r->link->name, sizeof(r->link->name), "fuzz");
    FZ_CHECK(ring_link_bind(r->link, mine, peers) == 0, "bind");
    win_mine = r->mine = mine;
    r->peers = peers;
    /* The peer writes our window and reads its own. */
    for (uint32_t c = 0; c < N_CHAN; c++) {
        ring_tx_init(&r->ptx[c], peers + RING_LINK_OFF, mine + RING_LINK_OFF, &g, c);
        ring_rx_init(&r->prx[c], peers + RING_LINK_OFF, mine + RING_LINK_OFF, &g, c);
    }
    rc = tern_tp_mr_reg(r->ep, region, REGION,
                        TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE, &r->mr);
    FZ_CHECK(rc == 0, "region: %d", rc);
    rc = tern_tp_mr_reg(r->ep, local_buf, REGION, TERN_TP_ACCESS_LOCAL, &r->lmr);
    FZ_CHECK(rc == 0, "local region: %d", rc);
    r->key = tern_tp_mr_rkey(r->mr).key;
}

/* The peer reads what our endpoint sent it, so that credit flows back. */
static void peer_reads(struct run *r)
{
    for (uint32_t c = 0; c < N_CHAN; c++) {
        const void *v;
        uint32_t len;
        enum ring_type t;

        for (int i = 0; i < 64 && ring_rx_peek(&r->prx[c], &v, &len, &t) == 1; i++)
            ring_rx_release(&r->prx[c]);
        ring_rx_credit(&r->prx[c]);
    }
}

static void peer_publish(struct run *r, struct fz *f, uint8_t op)
{
    uint32_t chan = fz_u8(f) % N_CHAN;
    struct ring_tx *tx = &r->ptx[chan];
    uint8_t kind = fz_u8(f);
    uint8_t head[sizeof(struct fz_ctl)];
    size_t head_len = 0;
    uint32_t body, type;
    uint8_t *p;
    const uint8_t *b;
    size_t got;

    switch (kind % 5) {
    case 0: {                       /* a link control record */
        uint32_t m[2] = {fz_u8(f) % 5, op & 0x80 ? fz_u32(f) : fz_u8(f) % (N_CHAN + 1)};

        memcpy(head, m, sizeof(m));
        head_len = sizeof(m);
        type = RING_CTL;
        break;
    }
    case 1:                         /* a message */
        type = RING_MSG;
        break;
    case 2: {                       /* a fragment */
        struct fz_frag fr = {.total = op & 0x80 ? fz_u32(f) : fz_u16(f) % (MAX_MSG + 64),
                             .offset = op & 0x40 ? fz_u32(f) : fz_u16(f) % MAX_MSG};

        memcpy(head, &fr, sizeof(fr));
        head_len = sizeof(fr);
        type = RING_FRAG;
        break;
    }
    case 3: {                       /* a one-sided request or answer */
        struct fz_ctl q = {.op = fz_u8(f) % 6, .status = op & 0x80 ? (int32_t)fz_u32(f) : 0,
                           .key = op & 0x40 ? fz_u32(f) : r->key,
                           .len = op & 0x20 ? fz_u32(f) : fz_u16(f) % (REGION + 64),
                           .off = op & 0x10 ? fz_u64(f) : fz_u16(f) % (REGION + 64)};

        memcpy(head, &q, sizeof(q));
        head_len = sizeof(q);
        type = RING_CTL;
        break;
    }
    default:                        /* any type */
        type = fz_u8(f);
        break;
    }
    body = fz_u16(f) % (ring_max_record(RING_BYTES) + 8);
    if (head_len > body)
        body = (uint32_t)head_len;
    p = ring_tx_reserve(tx, body);
    if (!p)
        return;                     /* no credit: the peer waits, as a real one */
    memcpy(p, head, head_len);
    got = fz_take(f, body - head_len, &b);
    memcpy(p + head_len, b, got);
    memset(p + head_len + got, 0, body - head_len - got);
    ring_tx_publish(tx, body, (enum ring_type)type);
}

/* A hostile peer is not held to the protocol: any word of our window. */
static void peer_scribble(struct fz *f)
{
    size_t at = (fz_u32(f) % win_size) & ~(size_t)7;
    uint64_t v = fz_u64(f);

    memcpy(win_mine + at, &v, sizeof(v));
}

static struct conn_slot *slot_of(struct run *r, struct tern_tp_conn *c)
{
    for (unsigned i = 0; i < MAX_CONNS; i++)
        if (r->conns[i].c == c)
            return &r->conns[i];
    return NULL;
}

static void release_views(struct conn_slot *s)
{
    for (unsigned i = 0; i < s->n_views; i++)
        tern_tp_msg_release(s->c, s->views[i]);
    s->n_views = 0;
}

static void poll_ep(struct run *r, unsigned hold)
{
    struct tern_tp_event ev[8];
    int n = tern_tp_poll(r->ep, ev, 8);

    FZ_CHECK(n >= 0, "poll: %d", n);
    for (int i = 0; i < n; i++) {
        struct conn_slot *s = ev[i].conn ? slot_of(r, ev[i].conn) : NULL;

        switch (ev[i].type) {
        case TERN_TP_EV_ACCEPTED:
            FZ_CHECK(!s, "accepted twice");
            s = slot_of(r, NULL);
            FZ_CHECK(s, "more connections than max_conns");
            s->c = ev[i].conn;
            break;
        case TERN_TP_EV_RECV:
            FZ_CHECK(s, "a message on an unknown connection");
            FZ_CHECK(ev[i].len <= MAX_MSG, "a %zu-byte message", ev[i].len);
            for (size_t j = 0; j < ev[i].len; j++)
                sink ^= ((const uint8_t *)ev[i].data)[j];
            if (s->n_views == 8)
                release_views(s);
            s->views[s->n_views++] = ev[i].data;
            if (s->n_views > hold)
                release_views(s);
            break;
        case TERN_TP_EV_CLOSED:
            FZ_CHECK(s, "CLOSED for an unknown connection");
            release_views(s);
            tern_tp_disconnect(s->c);
            *s = (struct conn_slot){0};
            break;
        default:
            break;
        }
    }
    peer_reads(r);
}

static void app_acts(struct run *r, struct fz *f, uint8_t op)
{
    struct conn_slot *s = &r->conns[fz_u8(f) % MAX_CONNS];
    struct tern_tp_rkey rk = {.key = fz_u32(f), .len = REGION};
    size_t len = fz_u16(f) % (MAX_MSG + 1);
    void *buf;

    if (!s->c)
        return;
    switch (op % 4) {
    case 0:
        if (tern_tp_msg_alloc(s->c, len, &buf) == 0) {
            memset(buf, 0x77, len);
            tern_tp_msg_post(s->c, buf, len);
        }
        break;
    case 1:
        tern_tp_put(s->c, r->lmr, 0, len % REGION, &rk, fz_u16(f) % REGION, 1);
        break;
    case 2:
        tern_tp_get(s->c, r->lmr, 0, len % REGION, &rk, fz_u16(f) % REGION, 2);
        break;
    default:
        release_views(s);
        break;
    }
    tern_tp_flush(r->ep);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    struct run r = {0};
    unsigned hold = fz_u8(&f) % 4;

    setup(&r);
    for (unsigned steps = 0; f.n && steps < 512; steps++) {
        uint8_t op = fz_u8(&f);

        switch (op & 3) {
        case 0:
            peer_publish(&r, &f, op);
            break;
        case 1:
            peer_scribble(&f);
            break;
        case 2:
            for (unsigned i = 0; i <= (op >> 2) % 8; i++)
                poll_ep(&r, hold);
            break;
        default:
            app_acts(&r, &f, op >> 2);
            break;
        }
    }
    /* Let it take in whatever is left, then tear down. */
    for (unsigned i = 0; i < 16; i++)
        poll_ep(&r, 0);
    for (unsigned i = 0; i < MAX_CONNS; i++)
        if (r.conns[i].c)
            release_views(&r.conns[i]);
    tern_tp_close(r.ep);
    free(r.mine);
    free(r.peers);
    return 0;
}
