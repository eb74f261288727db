/* The ntb fabric: the ring engine's connections (ring/chan.h) over one
 * window pair per NTB device, as PCIe NTB gives it. This file is its window
 * provider and its descriptor. The rules differ from shm's socket links:
 *
 * - The windows exist before either side does: there is no socket to hand
 *   them over, to carry a HELLO or to hang up. Each side says hello in the
 *   first cache line of the *peer's* window (remote write) and reads the
 *   peer's in its own (local read).
 * - A side that restarts must not be confused by what is left in the
 *   windows, and must not have its fresh rings scribbled on by a peer still
 *   running the old session. So every incarnation has a random nonce and
 *   the handshake is: see the peer's nonce and stop old writes (`seen`);
 *   once the peer has seen ours, zero our rings and say so (`ready`); send
 *   only when the peer is ready for our nonce. PCIe keeps one side's posted
 *   writes in order, so a `seen` lands after the last old write.
 * - Liveness is a heartbeat: each side bumps a counter in the peer's window
 *   every NTB_BEAT_MS; a peer silent for TERN_NTB_DEAD_MS (default 2000) is
 *   dead, its connections close, and the link starts a new incarnation.
 *   With each beat the device's link status is read too: a link the
 *   device reports down (DPDK's PMD: the peer's driver said it goes down;
 *   on the emulated device, the peer's process died and gave up its side)
 *   is dead at once. A crashed host or a pulled cable says nothing: the
 *   heartbeat finds those.
 * - Both sides open channels: the side with the lower nonce takes the odd
 *   ones. A channel is reused once both sides sent CLOSE, and each, with
 *   its connection gone, zeroed its ring and sent FREE.
 *
 * - Each window is split into NTB_PARTS partitions, and each partition is
 *   a link of its own (handshake, heartbeat, channels, doorbell): one per
 *   core, so endpoints on different cores share a device and never a ring
 *   or a cache line. "DEV/P" names partition P; "DEV" is partition 0.
 *
 * Devices: "emu:NAME" is an emulated device (a shared-memory file holding
 * both windows, each side of each partition claimed by an OFD lock,
 * doorbells on datagram sockets), which is how CI runs NTB links; "hw" is
 * the DPDK ntb rawdev (dpdk.c), with EAL arguments from $TERN_NTB_EAL. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "../ring/chan.h"
#include "tern_config.h"
#if TERN_HAVE_DPDK
#include "dpdk.h"
#endif

/* Geometry of a link, heartbeat period and partitions of each window (one
 * link each). Many channels of modest rings: a window is a scarce BAR, and
 * both sides open channels. */
#define NTB_CHANNELS 512
#define NTB_RING_BYTES (64u * 1024)
#define NTB_BEAT_MS 100
#define NTB_PARTS 8
#define NTB_MAGIC 0x746e6268u       /* "tnbh" */
#define NTB_VERSION 2                /* 2: windows in partitions */
#define HANDSHAKE_MS 2000           /* a connect waits this long for a peer */
#define EMU_HDR 4096                /* emulated device: header page, then windows */
#define EMU_LOCK_SETUP 2            /* lock byte: the first set-up of the file */
#define EMU_LOCK_SIDES 16           /* lock bytes 16 + 2 * part + side: claims */
#define EMU_PULLED_OFF 64           /* header word: nonzero while the cable is pulled */
#define LOG_WHO "ntb"
#define NL(l) ((struct ntb_link *)(l))

/* Per channel, on both sides. */
enum { CH_USED = 1, CH_CLOSE_SENT = 2, CH_CLOSE_GOT = 4, CH_FREED = 8, CH_FREE_GOT = 16 };

struct emu_hdr {
    uint32_t magic, version, n_chan, ring_bytes, n_parts;
};

struct ntb_link {
    struct ring_link r;
    bool hw;
    char dev[RING_NAME_MAX];         /* "emu:NAME" or "hw" */
    unsigned part;                  /* the partition of each window */
    int dev_fd;                     /* emu: the device file */
    int side;                       /* emu: which side of the partition is ours */
    uint8_t *mine_map, *peers_map;  /* emu: our and the peer's partition */
    size_t part_size;               /* bytes of one partition (page multiple) */
    off_t mine_off;                 /* emu: file offset of our partition */
    struct ntb_hw_shared *hwdev;      /* hw: the device, shared by partitions */
    struct sockaddr_un bell;        /* emu: the peer's doorbell socket */
    bool bell_bound;                /* emu: ours is bound (unlinked at release) */
    socklen_t bell_len;
    uint64_t nonce, peer_nonce;
    bool seen_sent, ready_sent, listening, odd;
    bool ours;                      /* emu: the file checked out as a device */
    uint64_t beat, peer_beat, peer_beat_ms, last_beat_ms, pending_since_ms;
    uint32_t next;                  /* next of our channels to try */
    unsigned npending;
    uint8_t *ch;                    /* CH_* per channel */
    struct ring_conn *pending;       /* connections waiting for the link */
};

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t dead_ms(void)
{
    static uint64_t v;

    if (!v) {
        const char *e = getenv("TERN_NTB_DEAD_MS");
        long n = e ? strtol(e, NULL, 10) : 0;

        v = n >= 3 * NTB_BEAT_MS ? (uint64_t)n : 2000;
    }
    return v;
}

static struct ring_link_ctl *line_in(struct ring_link *l)
{
    return (struct ring_link_ctl *)(void *)l->mine;
}

static struct ring_link_ctl *line_out(struct ring_link *l)
{
    return (struct ring_link_ctl *)(void *)l->peers;
}

static void put64(volatile uint64_t *at, uint64_t v)
{
    __atomic_store_n(at, v, __ATOMIC_RELEASE);
}

static uint64_t get64(volatile uint64_t *at)
{
    return __atomic_load_n(at, __ATOMIC_ACQUIRE);
}

/* Our hello in the peer's window; the nonce goes last. Rewritten with every
 * beat, so a peer that zeroed its window learns it again. */
static void say_hello(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);
    struct ring_link_ctl *out = line_out(l);

    out->magic = NTB_MAGIC;
    out->version = NTB_VERSION;
    out->n_chan = l->g.n_chan;
    out->ring_bytes = l->g.ring_bytes;
    put64(&out->seen, nl->seen_sent ? nl->peer_nonce : 0);
    put64(&out->ready, nl->ready_sent ? nl->peer_nonce : 0);
    put64(&out->beat, nl->beat);
    put64(&out->nonce, nl->nonce);
}

/* Zero every ring and control word of our window (not its first line,
 * which holds the peer's hello). */
static void zero_rings(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);
    size_t off = RING_LINK_OFF, len = ring_window_size(&l->g);

    /* On the emulated device, punching a hole zeroes without touching every
     * page; what it cannot do falls back to stores. */
    if (!nl->hw) {
        size_t at = (size_t)nl->mine_off + off;
        size_t first = (at + 4095) & ~(size_t)4095, last = (at + len) & ~(size_t)4095;

        if (last > first &&
            fallocate(nl->dev_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)first,
                      (off_t)(last - first)) == 0) {
            memset(l->mine + off, 0, first - at);
            memset(l->mine + off + (last - at), 0, at + len - last);
            return;
        }
    }
    memset(l->mine + off, 0, len);
}

/* A new incarnation: new nonce, nothing seen, no channel in use. */
static void link_reset(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);

    do {
        if (getrandom(&nl->nonce, sizeof(nl->nonce), 0) != sizeof(nl->nonce))
            nl->nonce = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
    } while (!nl->nonce || nl->nonce == nl->peer_nonce);
    nl->seen_sent = nl->ready_sent = false;
    memset(nl->ch, 0, l->g.n_chan);
    l->state = LINK_ACCEPTING;
    say_hello(l);
}

static void go_down(struct ring_link *l, const char *why, bool expected)
{
    tern_log(expected ? TERN_LOG_INFO : TERN_LOG_WARN, LOG_WHO, "link %s down: %s", l->name, why);
    ring_link_dead(l);
}

/* One of our channels that is free, or 0. */
static uint32_t chan_alloc(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);
    uint32_t first = nl->odd ? 1 : 2, span = (l->g.n_chan - first + 1) / 2;

    for (uint32_t i = 0; i < span; i++) {
        uint32_t c = nl->next;

        nl->next = c + 2 < l->g.n_chan ? c + 2 : first;
        if (!nl->ch[c] && !l->chan[c]) {
            nl->ch[c] = CH_USED;
            return c;
        }
    }
    return 0;
}

/* Give a waiting connection its channel and tell the peer. */
static void start_conn(struct ring_link *l, struct ring_conn *c)
{
    uint32_t chan = chan_alloc(l);

    c->ev.connected = true;
    if (!chan) {
        ring_conn_fail(c, TERN_ENOBUFS, "no free channel on the NTB link");
        return;
    }
    ring_conn_bind(c, l, chan);
    if (ring_link_send(l, OP_OPEN, chan) < 0)
        ring_conn_fail(c, TERN_EAGAIN, "NTB control channel full");
    ring_conn_ready(c);
}

static void link_up(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);

    ring_link_bind(l, l->mine, l->peers);    /* channel 0 starts afresh */
    l->ctl_tx.wc = nl->hw;
    nl->odd = nl->nonce < nl->peer_nonce;
    nl->next = nl->odd ? 1 : 2;
    l->state = LINK_OPEN;
    tern_log(TERN_LOG_INFO, LOG_WHO, "link %s up", l->name);
    while (nl->pending) {
        struct ring_conn *c = nl->pending;

        nl->pending = c->pending_next;
        nl->npending--;
        c->pending_next = NULL;
        start_conn(l, c);
    }
}

static void fail_pending(struct ring_link *l, int status, const char *why)
{
    struct ntb_link *nl = NL(l);

    while (nl->pending) {
        struct ring_conn *c = nl->pending;

        nl->pending = c->pending_next;
        nl->npending--;
        c->pending_next = NULL;
        c->ev.connected = true;
        ring_conn_fail(c, status, why);
    }
}

static bool device_link_up(struct ring_link *l);

static bool ntb_link_poll(struct ring_link *l, bool tick)
{
    struct ntb_link *nl = NL(l);
    struct ring_link_ctl *in = line_in(l);
    uint64_t now, pn, pb;

    /* The handshake and the heartbeat need no more than the socket ticks. */
    if (!tick)
        return true;
    now = now_ms();
    if (now - nl->last_beat_ms >= NTB_BEAT_MS) {
        nl->beat++;
        nl->last_beat_ms = now;
        say_hello(l);
    }
    pn = get64(&in->nonce);
    if (pn != nl->peer_nonce) {
        if (l->state == LINK_OPEN)
            go_down(l, pn ? "the peer restarted" : "the peer left", !pn);
        nl->peer_nonce = pn;
        nl->seen_sent = nl->ready_sent = false;
        nl->peer_beat_ms = now;
    }
    /* After the nonce: a peer that said goodbye is not a link failure. */
    if (nl->last_beat_ms == now && l->state == LINK_OPEN && !device_link_up(l))
        go_down(l, "the NTB link is down", false);
    pb = get64(&in->beat);
    if (pb != nl->peer_beat) {
        nl->peer_beat = pb;
        nl->peer_beat_ms = now;
    } else if (l->state == LINK_OPEN && now - nl->peer_beat_ms > dead_ms()) {
        char why[64];

        snprintf(why, sizeof(why), "no heartbeat for %llu ms",
                 (unsigned long long)(now - nl->peer_beat_ms));
        go_down(l, why, false);
    }
    if (l->state == LINK_DEAD) {
        /* The old session's connections are gone: start a new one. */
        if (l->nconns == nl->npending)
            link_reset(l);
        return true;
    }
    if (l->state != LINK_ACCEPTING)
        return true;
    if (nl->pending && now - nl->pending_since_ms > HANDSHAKE_MS) {
        fail_pending(l, TERN_ECONNREFUSED, "no peer on the NTB link");
        return true;
    }
    if (!pn)
        return true;
    if (!device_link_up(l))          /* a pulled cable: no handshake until it is back */
        return true;
    if (in->magic != NTB_MAGIC || in->version != NTB_VERSION || in->n_chan != l->g.n_chan ||
        in->ring_bytes != l->g.ring_bytes) {
        static struct tern_log_limit limit;

        if (tern_log_allow(&limit))
            tern_log(TERN_LOG_WARN, LOG_WHO, "link %s: the peer's geometry or version differs",
                     l->name);
        return true;
    }
    if (!nl->seen_sent) {
        nl->seen_sent = true;
        say_hello(l);
    }
    if (!nl->ready_sent && get64(&in->seen) == nl->nonce) {
        /* The peer writes nothing old any more: clean our rings for it. */
        zero_rings(l);
        nl->ready_sent = true;
        say_hello(l);
    }
    if (nl->ready_sent && get64(&in->ready) == nl->nonce)
        link_up(l);
    return true;
}

/* ---- channels ---- */

static void settle(struct ring_link *l, uint32_t chan)
{
    struct ntb_link *nl = NL(l);
    uint8_t f = nl->ch[chan];

    if (l->state != LINK_OPEN)
        return;
    if ((f & CH_CLOSE_SENT) && (f & CH_CLOSE_GOT) && !(f & CH_FREED) && !l->chan[chan]) {
        /* Neither side writes this channel any more: clean our half. */
        memset(ring_data_of(l->mine + RING_LINK_OFF, &l->g, chan), 0, l->g.ring_bytes);
        memset(ring_ctl_of(l->mine + RING_LINK_OFF, &l->g, chan), 0, sizeof(struct ring_ctl));
        if (ring_link_send(l, OP_FREE, chan) == 0)
            f |= CH_FREED;
    }
    if ((f & CH_FREED) && (f & CH_FREE_GOT))
        f = 0;
    nl->ch[chan] = f;
}

static bool ntb_link_accepts(struct ring_link *l, uint32_t chan)
{
    struct ntb_link *nl = NL(l);

    if ((chan & 1) == (nl->odd ? 1u : 0u) || nl->ch[chan]) {
        static struct tern_log_limit limit;

        if (tern_log_allow(&limit))
            tern_log(TERN_LOG_WARN, LOG_WHO, "link %s: the peer opened channel %u, %s; ignored",
                     l->name, chan, nl->ch[chan] ? "which is in use" : "which is ours");
        return false;
    }
    nl->ch[chan] = CH_USED;
    if (!nl->listening) {
        ring_link_send_close(l, chan);   /* nobody listens here: refused */
        return false;
    }
    return true;
}

static void ntb_link_on_close(struct ring_link *l, uint32_t chan, bool sent)
{
    NL(l)->ch[chan] |= sent ? CH_CLOSE_SENT : CH_CLOSE_GOT;
    settle(l, chan);
}

static void ntb_link_on_free(struct ring_link *l, uint32_t chan)
{
    NL(l)->ch[chan] |= CH_FREE_GOT;
    settle(l, chan);
}

static void ntb_link_conn_gone(struct ring_link *l, struct ring_conn *c)
{
    struct ring_conn **pp = &NL(l)->pending;

    while (*pp && *pp != c)
        pp = &(*pp)->pending_next;
    if (*pp) {
        *pp = c->pending_next;
        NL(l)->npending--;
    }
    if (c->chan)
        settle(l, c->chan);
}

static void ntb_link_doorbell(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);

    /* The hardware doorbell (an MSI-X interrupt through vfio) is not wired
     * yet: NTB endpoints on hardware poll, and their waits are bounded by
     * the heartbeat period. */
    if (!nl->hw && l->obj.fd >= 0)
        sendto(l->obj.fd, "d", 1, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&nl->bell,
               nl->bell_len);
}

/* ---- devices ---- */

static bool name_ok(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > 48)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_' || ch == '.'))
            return false;
    }
    return true;
}

/* The doorbell of one side of a partition: a datagram socket at a path in
 * /dev/shm beside the device, not an abstract name, so that processes in
 * other network namespaces of this host (tools/rack's hosts) ring it too.
 * The side's OFD lock says whose it is: its owner unlinks a stale one
 * before binding and its own when it leaves; ntb_sweep takes those of the
 * dead. */
static socklen_t bell_addr(struct sockaddr_un *sa, const char *name, unsigned part, int side)
{
    int n;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    n = snprintf(sa->sun_path, sizeof(sa->sun_path), "/dev/shm/tern-ntb.%s.%u.%d.bell", name,
                 part, side);
    if (n < 0 || (size_t)n >= sizeof(sa->sun_path))
        return 0;                    /* the name is too long for a socket path */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)n + 1);
}

static bool lock_byte(int fd, off_t at, bool wait)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};

    return fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0;
}

static void unlock_byte(int fd, off_t at)
{
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};

    fcntl(fd, F_OFD_SETLK, &fl);
}

/* Bytes of one partition for geometry `g`: its link line and rings, page
 * aligned so that each partition maps and zeroes on its own. */
static size_t part_bytes(const struct ring_geometry *g)
{
    return (RING_LINK_OFF + ring_window_size(g) + 4095) & ~(size_t)4095;
}

/* The emulated device: a file of two windows of NTB_PARTS partitions each;
 * each side of each partition is claimed by an OFD lock, which a process
 * that dies gives back. */
static int emu_attach(struct ring_link *l, const char *name)
{
    struct ntb_link *nl = NL(l);
    size_t part = part_bytes(&l->g), win = NTB_PARTS * part, size = EMU_HDR + 2 * win;
    struct emu_hdr want = {NTB_MAGIC, NTB_VERSION, l->g.n_chan, l->g.ring_bytes, NTB_PARTS};
    struct emu_hdr *hdr = NULL;
    char path[80];
    struct stat st;
    struct sockaddr_un sa;
    socklen_t sl;
    int side = -1, rc = 0;

    snprintf(path, sizeof(path), "/tern-ntb.%s", name);
    nl->dev_fd = shm_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (nl->dev_fd < 0)
        return -errno;
    for (int s = 0; s < 2 && side < 0; s++)
        if (lock_byte(nl->dev_fd, EMU_LOCK_SIDES + 2 * (off_t)nl->part + s, false))
            side = s;
    if (side < 0)
        return TERN_EADDRINUSE;     /* both ends of this partition are taken */
    nl->side = side;
    lock_byte(nl->dev_fd, EMU_LOCK_SETUP, true);
    if (fstat(nl->dev_fd, &st) < 0)
        rc = -errno;
    else if (st.st_size == 0 && ftruncate(nl->dev_fd, (off_t)size) < 0)
        rc = -errno;
    else if (st.st_size != 0 && (size_t)st.st_size != size)
        rc = TERN_EPROTO;
    if (rc == 0) {
        void *p = mmap(NULL, EMU_HDR, PROT_READ | PROT_WRITE, MAP_SHARED, nl->dev_fd, 0);

        hdr = p == MAP_FAILED ? NULL : p;
        if (!hdr)
            rc = TERN_ENOMEM;
    }
    if (rc == 0) {
        if (!hdr->magic)
            *hdr = want;
        else if (memcmp(hdr, &want, sizeof(want)) != 0)
            rc = TERN_EPROTO;       /* another geometry or not ours */
    }
    if (hdr)
        munmap(hdr, EMU_HDR);
    unlock_byte(nl->dev_fd, EMU_LOCK_SETUP);
    nl->ours = rc == 0;
    if (rc == 0) {
        off_t theirs = (off_t)(EMU_HDR + (size_t)(1 - side) * win + nl->part * part);
        void *m, *t;

        nl->mine_off = (off_t)(EMU_HDR + (size_t)side * win + nl->part * part);
        m = mmap(NULL, part, PROT_READ | PROT_WRITE, MAP_SHARED, nl->dev_fd, nl->mine_off);
        t = mmap(NULL, part, PROT_READ | PROT_WRITE, MAP_SHARED, nl->dev_fd, theirs);
        nl->mine_map = m == MAP_FAILED ? NULL : m;
        nl->peers_map = t == MAP_FAILED ? NULL : t;
        nl->part_size = part;
        if (!nl->mine_map || !nl->peers_map)
            rc = TERN_ENOMEM;
    }
    if (rc < 0) {
        tern_log(TERN_LOG_WARN, LOG_WHO, "emulated device %s: %s", name, tern_strerror(rc));
        return rc;
    }
    l->mine = nl->mine_map;
    l->peers = nl->peers_map;
    l->win_size = part;
    /* Whatever an earlier owner of this side left is not ours. */
    memset(l->mine, 0, RING_LINK_OFF);
    zero_rings(l);
    l->obj.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sl = bell_addr(&sa, name, nl->part, side);
    if (!sl)
        return TERN_EBADADDR;
    unlink(sa.sun_path);             /* a dead owner's: the side is ours now */
    if (l->obj.fd < 0 || bind(l->obj.fd, (struct sockaddr *)&sa, sl) < 0)
        return -errno;
    nl->bell_bound = true;
    nl->bell_len = bell_addr(&nl->bell, name, nl->part, 1 - side);
    {
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &l->obj};

        if (epoll_ctl(l->ep->epfd, EPOLL_CTL_ADD, l->obj.fd, &e) < 0)
            return -errno;
    }
    return 0;
}

/* The emulated device's link status: the peer's side is claimed, that is
 * its process is alive (a dead process gives its OFD lock back). */
static bool emu_link_up(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = EMU_LOCK_SIDES + 2 * (off_t)nl->part + (1 - nl->side),
                       .l_len = 1};

    uint32_t pulled = 0;

    /* A cable pulled by tern_tp_emu_cable: down for both ends. */
    if (pread(nl->dev_fd, &pulled, sizeof(pulled), EMU_PULLED_OFF) == sizeof(pulled) && pulled)
        return false;
    /* A failed query says nothing: leave it to the heartbeat. */
    if (fcntl(nl->dev_fd, F_OFD_GETLK, &fl) < 0)
        return true;
    return fl.l_type != F_UNLCK;
}


#if TERN_HAVE_DPDK
/* One hardware device per process, shared by the partitions (endpoints of
 * different threads) that use it; attach and detach take a lock, the data
 * path none. */
struct ntb_hw_shared {
    struct ntb_hw_dev dev;
    unsigned refs;
    bool parts[NTB_PARTS];
};

static struct ntb_hw_shared *hw_dev;
static pthread_mutex_t hw_lock = PTHREAD_MUTEX_INITIALIZER;

static void hw_put(struct ntb_link *nl)
{
    pthread_mutex_lock(&hw_lock);
    nl->hwdev->parts[nl->part] = false;
    if (--nl->hwdev->refs == 0) {
        ntb_hw_close(&nl->hwdev->dev);
        free(nl->hwdev);
        hw_dev = NULL;
    }
    pthread_mutex_unlock(&hw_lock);
    nl->hwdev = NULL;
}

static int hw_attach(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);
    const char *eal = getenv("TERN_NTB_EAL");
    size_t part;
    int rc = 0;

    pthread_mutex_lock(&hw_lock);
    if (!hw_dev) {
        hw_dev = calloc(1, sizeof(*hw_dev));
        rc = !hw_dev ? TERN_ENOMEM : ntb_hw_probe(eal ? eal : "", &hw_dev->dev);
        if (rc == 0)
            rc = ntb_hw_open(&hw_dev->dev, 5000);
        if (rc < 0) {
            free(hw_dev);
            hw_dev = NULL;
        }
    }
    if (rc == 0 && hw_dev->parts[nl->part])
        rc = TERN_EADDRINUSE;
    if (rc == 0) {
        hw_dev->parts[nl->part] = true;
        hw_dev->refs++;
        nl->hwdev = hw_dev;
    }
    pthread_mutex_unlock(&hw_lock);
    if (rc < 0)
        return rc;
    nl->hw = true;
    /* As many channels as a partition of the window holds, up to the
     * default. */
    part = (nl->hwdev->dev.size / NTB_PARTS) & ~(size_t)4095;
    while (l->g.n_chan > 2 && RING_LINK_OFF + ring_window_size(&l->g) > part)
        l->g.n_chan /= 2;
    if (RING_LINK_OFF + ring_window_size(&l->g) > part) {
        hw_put(nl);
        return TERN_ENOMEM;
    }
    l->mine = nl->hwdev->dev.local + nl->part * part;
    l->peers = nl->hwdev->dev.remote + nl->part * part;
    l->win_size = RING_LINK_OFF + ring_window_size(&l->g);
    memset(l->mine, 0, l->win_size);
    return 0;
}
#endif

static bool device_link_up(struct ring_link *l)
{
#if TERN_HAVE_DPDK
    if (NL(l)->hwdev)
        return ntb_hw_link_up(&NL(l)->hwdev->dev);
#endif
    return emu_link_up(l);
}

static void ntb_link_release(struct ring_link *l)
{
    struct ntb_link *nl = NL(l);

    if (l->peers && nl->nonce)
        put64(&line_out(l)->nonce, 0);      /* tell the peer we left */
#if TERN_HAVE_DPDK
    if (nl->hwdev)
        hw_put(nl);
#endif
    if (nl->mine_map)
        munmap(nl->mine_map, nl->part_size);
    if (nl->peers_map)
        munmap(nl->peers_map, nl->part_size);
    if (nl->bell_bound) {
        struct sockaddr_un sa;

        if (bell_addr(&sa, nl->dev + 4, nl->part, nl->side))
            unlink(sa.sun_path);
    }
    if (!nl->hw && nl->dev_fd >= 0) {
        /* The last side out of every partition removes the emulated device
         * (never a file that turned out not to be one). */
        bool last = nl->ours;

        for (off_t b = 0; last && b < 2 * NTB_PARTS; b++)
            last = lock_byte(nl->dev_fd, EMU_LOCK_SIDES + b, false);
        if (last) {
            char path[80];

            snprintf(path, sizeof(path), "/tern-ntb.%s", nl->dev + 4);
            shm_unlink(path);
        }
        close(nl->dev_fd);
    }
    free(nl->ch);
}

/* Split "DEV[/P]" into the device and the partition (0 if absent). */
static int parse_addr(const char *addr, char *dev, size_t dev_len, unsigned *part)
{
    const char *slash = strchr(addr, '/');
    size_t n = slash ? (size_t)(slash - addr) : strlen(addr);
    char *end;

    *part = 0;
    if (slash) {
        unsigned long p = strtoul(slash + 1, &end, 10);

        if (!slash[1] || *end || slash[1] < '0' || slash[1] > '9' || p >= NTB_PARTS)
            return TERN_EBADADDR;
        *part = (unsigned)p;
    }
    if (n >= dev_len)
        return TERN_EBADADDR;
    memcpy(dev, addr, n);
    dev[n] = '\0';
    if (strncmp(dev, "emu:", 4) == 0 ? !name_ok(dev + 4) : strcmp(dev, "hw") != 0)
        return TERN_EBADADDR;
    return 0;
}

/* The endpoint's link to partition `addr` ("DEV[/P]"), attaching it on
 * first use. */
static int link_for(struct ring_ep *ep, const char *addr, struct ring_link **out)
{
    char dev[RING_NAME_MAX];
    unsigned part;
    struct ring_link *l;
    int rc = parse_addr(addr, dev, sizeof(dev), &part);

    if (rc < 0)
        return rc;
    for (l = ep->links; l; l = l->next)
        if (strcmp(NL(l)->dev, dev) == 0 && NL(l)->part == part) {
            *out = l;
            return 0;
        }
#if !TERN_HAVE_DPDK
    if (strcmp(dev, "hw") == 0) {
        tern_log(TERN_LOG_WARN, LOG_WHO, "NTB hardware needs DPDK, and this build has none");
        return TERN_ENODEV;
    }
#endif
    l = ring_link_new(ep, -1);
    if (!l)
        return TERN_ENOMEM;
    NL(l)->dev_fd = -1;
    l->g = ep->g;
    snprintf(l->name, sizeof(l->name), "%s", addr);
    snprintf(NL(l)->dev, sizeof(NL(l)->dev), "%s", dev);
    NL(l)->part = part;
#if TERN_HAVE_DPDK
    rc = strcmp(dev, "hw") == 0 ? hw_attach(l) : emu_attach(l, dev + 4);
#else
    rc = emu_attach(l, dev + 4);
#endif
    if (rc == 0 && (!(NL(l)->ch = calloc(l->g.n_chan, 1)) ||
                    ring_link_bind(l, l->mine, l->peers) < 0))
        rc = TERN_ENOMEM;
    if (rc < 0) {
        ring_link_free(l);
        return rc;
    }
    NL(l)->last_beat_ms = now_ms();
    link_reset(l);
    *out = l;
    return 0;
}

static int ntb_link_listen(struct ring_ep *ep, const char *addr, char *bound, size_t bound_len)
{
    char name[RING_NAME_MAX + 1];
    struct ring_link *l;
    int rc;

    if (strcmp(addr, "emu:auto") == 0)
        snprintf(name, sizeof(name), "emu:auto-%d-%u", (int)getpid(), ++ep->auto_names);
    else
        snprintf(name, sizeof(name), "%s", addr);
    rc = link_for(ep, name, &l);
    if (rc < 0)
        return rc;
    NL(l)->listening = true;
    if (bound && bound_len)
        snprintf(bound, bound_len, "%s", name);
    return 0;
}

static int ntb_link_connect(struct ring_ep *ep, const char *addr, struct ring_conn *c)
{
    struct ring_link *l;
    int rc = link_for(ep, addr, &l);

    if (rc < 0)
        return rc;
    l->nconns++;
    c->link = l;
    if (l->state == LINK_OPEN) {
        start_conn(l, c);
        return 0;
    }
    if (!NL(l)->pending)
        NL(l)->pending_since_ms = now_ms();
    c->pending_next = NL(l)->pending;
    NL(l)->pending = c;
    NL(l)->npending++;
    return 0;
}

/* The doorbell socket of an emulated device: its datagrams only wake the
 * endpoint; drain them. */
static void ntb_link_on_fd(struct ring_link *l, uint32_t events)
{
    char buf[64];

    while (recv(l->obj.fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
        ;
}

static const struct ring_link_ops ntb_link_ops = {
    .link_size = sizeof(struct ntb_link),
    .geometry = {.n_chan = NTB_CHANNELS, .ring_bytes = NTB_RING_BYTES},
    .shared_channels = true,
    .keeps_links = true,
    .beat_ms = NTB_BEAT_MS,
    .listen = ntb_link_listen,
    .connect = ntb_link_connect,
    .on_fd = ntb_link_on_fd,
    .link_poll = ntb_link_poll,
    .accepts = ntb_link_accepts,
    .on_close = ntb_link_on_close,
    .on_free = ntb_link_on_free,
    .conn_gone = ntb_link_conn_gone,
    .doorbell = ntb_link_doorbell,
    .link_release = ntb_link_release,
};

/* ---- endpoint and descriptor ---- */

static int ntb_ep_open(struct tern_tp_ep *base)
{
    return ring_ep_open(base, &ntb_link_ops);
}

/* One-sided operations are served by the peer's poll: its host is reached
 * through the window only. */
static const struct tern_tp_ops ntb_ops = {
    RING_TP_OPS,
    .ep_open = ntb_ep_open,
    .ep_close = ring_tp_ep_close,
    .put = ring_tp_put,
    .get = ring_tp_get,
};

static int ntb_probe(const char *args, char *desc, size_t len)
{
#if TERN_HAVE_DPDK
    return ntb_hw_describe(args, desc, len);
#else
    snprintf(desc, len, "no NTB hardware support: built without DPDK");
    return TERN_ENODEV;
#endif
}

static bool is_emu(const char *addr, size_t len)
{
    return len >= 4 && strncmp(addr, "emu:", 4) == 0;
}

/* An emulated device is a file of this host. A hardware link joins two
 * hosts that only their cabling knows of: it is taken when a policy names
 * it, never guessed from an advertisement. */
static bool ntb_reachable(const char *addr, size_t len, bool same_node, bool same_host)
{
    (void)same_host;
    return same_node && is_emu(addr, len);
}

static int ntb_local_addr(const char *tag, char *buf, size_t len)
{
    if (!tag)
        return snprintf(buf, len, "emu:auto") < (int)len ? 0 : TERN_EINVAL;
    if (snprintf(buf, len, "emu:%s", tag) >= (int)len || !name_ok(tag))
        return TERN_EINVAL;
    return 0;
}

static bool ntb_emulated(const char *addr)
{
    return is_emu(addr, strlen(addr));
}

/* A doorbell "tern-ntb.NAME.P.SIDE.bell" whose side nobody holds (or
 * whose device is gone): its owner died. */
static void sweep_bell(const char *file)
{
    char name[200], path[300];
    const char *end = file + strlen(file) - 5, *p = end;
    unsigned part, side, dots = 0;
    int fd;

    while (p > file + 9 && dots < 2)
        if (*--p == '.')
            dots++;
    if (dots < 2 || sscanf(p, ".%u.%u.bell", &part, &side) != 2 || part >= NTB_PARTS ||
        side > 1 || (size_t)(p - file - 9) >= sizeof(name))
        return;
    snprintf(name, sizeof(name), "%.*s", (int)(p - file - 9), file + 9);
    snprintf(path, sizeof(path), "/tern-ntb.%s", name);
    fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0 || lock_byte(fd, EMU_LOCK_SIDES + 2 * (off_t)part + side, false)) {
        snprintf(path, sizeof(path), "/dev/shm/%s", file);
        unlink(path);
    }
    if (fd >= 0)
        close(fd);                   /* closing gives back a lock just taken */
}

/* Emulated devices whose every side is unclaimed: their processes died
 * without the last one out removing the file (SIGKILL). A live process
 * holds the OFD lock of its side, so its device stays. */
static void ntb_sweep(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *de;

    if (!d)
        return;
    while ((de = readdir(d))) {
        char path[300];
        bool free_all = true;
        int fd;

        if (strncmp(de->d_name, "tern-ntb.", 9) != 0)
            continue;
        if (strlen(de->d_name) > 5 && strcmp(de->d_name + strlen(de->d_name) - 5, ".bell") == 0) {
            sweep_bell(de->d_name);
            continue;
        }
        snprintf(path, sizeof(path), "/%s", de->d_name);
        fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0)
            continue;
        for (off_t b = 0; free_all && b < 2 * NTB_PARTS; b++)
            free_all = lock_byte(fd, EMU_LOCK_SIDES + b, false);
        if (free_all)
            shm_unlink(path);
        close(fd);
    }
    closedir(d);
}

const struct tern_tp_fabric tp_fabric_ntb = {
    .name = "ntb",
    .caps = TERN_TP_CAP_MSG | TERN_TP_CAP_PUT | TERN_TP_CAP_GET | TERN_TP_CAP_WAIT_FD |
            TERN_TP_CAP_LISTEN | TERN_TP_CAP_CONNECT | TERN_TP_CAP_POINT_TO_POINT,
    .ep_size = sizeof(struct ring_ep),
    .ops = &ntb_ops,
    .latency_ns = 800,
    .bandwidth_gbs = 12,
    .probe = ntb_probe,
    .reachable = ntb_reachable,
    .local_addr = ntb_local_addr,
    .emulated = ntb_emulated,
    .sweep = ntb_sweep,
};

int tern_tp_emu_cable(const char *uri, bool plugged)
{
    const char *name = uri && strncmp(uri, "ntb://", 6) == 0 ? uri + 6 : uri;
    uint32_t v = plugged ? 0 : 1;
    char path[96];
    int fd;

    if (!name || strncmp(name, "emu:", 4) != 0 || strchr(name, '/') ||
        !is_emu(name, strlen(name)) || strlen(name) > 64)
        return TERN_EBADADDR;
    snprintf(path, sizeof(path), "/tern-ntb.%s", name + 4);
    fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return errno == ENOENT ? TERN_ENOENT : -errno;
    if (pwrite(fd, &v, sizeof(v), EMU_PULLED_OFF) != sizeof(v)) {
        int rc = -errno;

        close(fd);
        return rc ? rc : TERN_EIO;
    }
    close(fd);
    return 0;
}
