/* A backup replica's handling of replication messages (services/repl:
 * repl_wire.c, repl_backup.c) and its state file (repl_state.c), called
 * through an RPC session of this process over tcp, with a KV store on a
 * small pool in /dev/shm behind it.
 *
 * The input's first byte feeds the state file parser the rest of the
 * input when it is 0xff. Otherwise the input is a run of messages: raw
 * bytes to any of the service's methods, or messages built from fields of
 * the input: APPEND batches of records with sound sums (keys from a small
 * alphabet, values, deletes), following the replica's position or not, at
 * epochs around the one it has seen; POSITION and FETCH at any epoch and
 * from any version; a full COPY's BEGIN, CHUNKs and END; a ring's GRANT,
 * then frames written into the ring's file as a primary's stores would
 * land (batches built or raw, of the grant or not, in place or not, WRAPs)
 * and taken by a RING_SYNC. What must hold whatever comes: every call is answered;
 * the replica's position only moves forward (but for a full copy, which
 * starts it over) and is what the store holds outside a copy;
 * an epoch older than one it took is refused; and a FETCH answer is a
 * batch its own walker takes. Between runs the group is closed and its
 * state file removed, the store wiped. */
#include <fcntl.h>
#include <unistd.h>

#include "fuzz.h"
#include "kv.h"
#include "kv/kv_service_internal.h"
#include "kv/kv_store.h"
#include "log.h"
#include "repl/repl_internal.h"
#include "rpc_internal.h"

#define POOL_SIZE (4u << 20)
#define SEG_SIZE (64u * 1024)
#define MAX_MSG (64u * 1024)
#define POLLS_MAX 200000
#define OPS_MAX 48

static struct tern_kv_service *svc;
static struct tern_rpc_ep *srv, *cli;
static struct tern_session *sess;
static struct repl_host *host;
static struct repl *grp;
static char uri[128], state_path[96], ring_path[112];
static uint8_t frame[MAX_MSG + 2 * REPL_FRAME_ALIGN];
static uint8_t req[MAX_MSG];
static volatile uint8_t sink;

struct reply {
    bool done;
    int status;
    size_t len;
    uint8_t data[MAX_MSG];
};
static struct reply rep;

static void on_reply(void *arg, int status, const void *data, size_t len)
{
    struct reply *r = arg;

    FZ_CHECK(!r->done, "a continuation ran twice");
    FZ_CHECK(status <= 0 && (status == 0 || !len), "status %d with %zu bytes", status, len);
    FZ_CHECK(len <= sizeof(r->data), "a reply of %zu bytes", len);
    r->done = true;
    r->status = status;
    r->len = len;
    if (len)
        memcpy(r->data, data, len);
}

static int call(uint16_t method, const void *p, size_t len)
{
    int rc;

    rep.done = false;
    rc = tern_call(sess, TERN_REPL_SERVICE_ID, method, p, len, 0, on_reply, &rep, NULL);
    if (rc < 0)
        return rc;
    for (int i = 0; i < POLLS_MAX && !rep.done; i++) {
        tern_rpc_poll(srv);
        tern_rpc_poll(cli);
    }
    FZ_CHECK(rep.done, "no answer");
    return rep.status;
}

static void open_group(void)
{
    struct repl_config c = {.shard = "s1", .me = "b", .state_path = state_path,
                            .log_bytes = 64 * 1024, .ops = &kv_repl_ops, .ctx = svc,
                            .ring_bytes = REPL_RING_MIN};
    int rc = repl_open(host, &c, &grp);

    FZ_CHECK(rc == 0, "repl_open: %d", rc);
    kv_service_replicate(svc, grp);
    repl_set_view(grp, REPL_BACKUP, 1, "p", NULL, 0);
}

/* The state and ring files of the last run, whichever way the fuzzer ends. */
static void remove_files(void)
{
    unlink(state_path);
    unlink(ring_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG, .credits = 8, .max_calls = 64};
    struct tern_kv_service_opts so = {.pool_size = POOL_SIZE, .seg_size = SEG_SIZE};
    int rc;

    (void)argc;
    (void)argv;
    tern_log_set_level(TERN_LOG_ERROR);
    so.pool_path = fz_tmp_pool("repl");
    snprintf(state_path, sizeof(state_path), "/dev/shm/tern-fuzz-repl-state.%d", (int)getpid());
    unlink(state_path);
    snprintf(ring_path, sizeof(ring_path), "%s.ring", state_path);
    unlink(ring_path);
    atexit(remove_files);
    rc = tern_kv_service_open(&so, &svc);
    FZ_CHECK(rc == 0, "service: %d", rc);
    FZ_CHECK(tern_rpc_open(&cfg, &srv) == 0 && tern_rpc_open(&cfg, &cli) == 0, "endpoints");
    FZ_CHECK(tern_rpc_register(srv, tern_kv_service_def(svc)) == 0, "register");
    FZ_CHECK(repl_host_open(srv, &host) == 0, "repl host");
    rc = tern_rpc_listen(srv, "tcp://127.0.0.1:0", uri, sizeof(uri));
    FZ_CHECK(rc == 0, "listen: %d", rc);
    rc = rpc_connect_start(cli, uri, 0, NULL, &sess);
    FZ_CHECK(rc == 0 && sess, "connect: %d", rc);
    for (int i = 0; i < POLLS_MAX && sess->state == SESS_CONNECTING; i++) {
        tern_rpc_poll(srv);
        tern_rpc_poll(cli);
    }
    FZ_CHECK(sess->state == SESS_OPEN, "the session did not open");
    open_group();
    return 0;
}

/* A batch of sound records from the input, after `prev`. */
static size_t build_append(struct fz *f, uint64_t epoch, uint64_t prev)
{
    struct repl_batch b = {.epoch = epoch, .prev = prev};
    size_t off = sizeof(b);
    unsigned n = fz_u8(f) % 8;
    uint64_t v = prev;

    strcpy(b.shard, fz_u8(f) % 16 ? "s1" : "s2");
    for (unsigned i = 0; i < n; i++) {
        uint8_t kb = fz_u8(f), t = fz_u8(f) % 8;
        /* Mostly values; some deletes; some expiring values, whose first
         * 8 bytes (a deadline, past or not) come from the input too and
         * may be fewer than 8 (the backup must refuse those). */
        uint8_t type = t < 5 ? REPL_SET : t < 7 ? REPL_DEL : REPL_SET_EXPIRING;
        char key[4] = {'a' + (kb & 3), 'a' + ((kb >> 2) & 3), 0, 0};
        const uint8_t *val;
        size_t vlen = type != REPL_DEL ? fz_take(f, fz_u8(f) % 200, &val) : 0;

        v += 1 + fz_u8(f) % 3;
        if (off + repl_rec_size(2, vlen) > sizeof(req))
            break;
        repl_rec_write(req + off, type, v, key, 2, vlen ? val : NULL, (uint32_t)vlen);
        off += repl_rec_size(2, vlen);
        b.n++;
    }
    b.bytes = (uint32_t)(off - sizeof(b));
    memcpy(req, &b, sizeof(b));
    return off;
}

/* A COPY message: BEGIN, a CHUNK of sound records in any order, or END. */
static size_t build_copy(struct fz *f, uint64_t epoch)
{
    struct repl_copy c = {.epoch = epoch, .phase = 1 + fz_u8(f) % 3, .snap = fz_u8(f)};
    size_t off = sizeof(c);

    strcpy(c.shard, "s1");
    if (c.phase == REPL_COPY_CHUNK) {
        unsigned n = fz_u8(f) % 6;

        for (unsigned i = 0; i < n; i++) {
            char key[3] = {'a' + (fz_u8(f) & 3), 'a', 0};
            const uint8_t *val;
            size_t vlen = fz_take(f, fz_u8(f) % 64, &val);

            repl_rec_write(req + off, REPL_SET, 1 + fz_u8(f), key, 2, vlen ? val : NULL,
                           (uint32_t)vlen);
            off += repl_rec_size(2, vlen);
            c.n++;
        }
    }
    c.bytes = (uint32_t)(off - sizeof(c));
    memcpy(req, &c, sizeof(c));
    return off;
}

/* Frames into the granted ring's file at *at, as a primary's stores land:
 * the batch in req (len bytes), sealed for the grant or for another, at
 * the place expected or elsewhere, a WRAP first if the lap is short. */
static void land_frame(struct fz *f, const struct repl_ring_grant *g, uint64_t *at, size_t len)
{
    int fd = open(ring_path, O_RDWR);
    uint64_t span = repl_frame_span((uint32_t)len), room = g->size - *at % g->size;
    uint64_t gen = fz_u8(f) % 8 ? g->gen : g->gen + 1 + fz_u8(f);
    uint64_t place = fz_u8(f) % 8 ? *at : *at + REPL_FRAME_ALIGN * (fz_u8(f) % 4);

    FZ_CHECK(fd >= 0, "the ring's file");
    if (span > room) {
        repl_frame_seal(frame, gen, place, REPL_FRAME_WRAP, 0);
        FZ_CHECK(pwrite(fd, frame, sizeof(struct repl_frame),
                        (off_t)(REPL_RING_HDR + place % g->size)) > 0, "pwrite");
        *at += room;
        place = *at;
    }
    if (span <= g->size) {
        memcpy(frame + sizeof(struct repl_frame), req, len);
        repl_frame_seal(frame, gen, place, REPL_FRAME_BATCH, (uint32_t)len);
        if (fz_u8(f) % 16 == 0)
            frame[fz_u16(f) % (sizeof(struct repl_frame) + len)] ^= 1;     /* torn */
        if (place % g->size + span <= g->size)
            FZ_CHECK(pwrite(fd, frame, span, (off_t)(REPL_RING_HDR + place % g->size)) > 0,
                     "pwrite");
        *at += span;
    }
    close(fd);
}

static size_t build_ask(struct fz *f, uint64_t epoch, uint64_t from)
{
    struct repl_ask a = {.epoch = epoch, .from = from, .max = fz_u16(f)};

    strcpy(a.shard, "s1");
    memcpy(req, &a, sizeof(a));
    return sizeof(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint64_t seen = 0;

    if (size && data[0] == 0xff) {
        char name[] = "s1";
        bool copying;
        int rc = repl_state_parse((const char *)data + 1, size - 1, name, &seen, &copying);

        FZ_CHECK(rc == 0 || rc == TERN_ECORRUPT || rc == TERN_EINVAL, "state parse: %d", rc);
        FZ_CHECK(rc < 0 || seen <= REPL_EPOCH_MAX, "epoch %llu", (unsigned long long)seen);
        return 0;
    }
    /* After a full copy ends the position is where the copy began, which
     * may be above the newest record it brought (the store's version). */
    bool copied = false;
    struct repl_ring_grant grant = {0};
    bool granted = false;
    uint64_t ring_at = 0;

    for (int op = 0; op < OPS_MAX && f.n; op++) {
        struct repl_status before, after;
        uint8_t kind = fz_u8(&f);
        uint64_t epoch;
        uint16_t method = REPL_M_APPEND;
        size_t len;
        int rc;

        repl_status(grp, &before);
        /* Epochs around the one seen: older, the same, newer, any. */
        switch (fz_u8(&f) % 4) {
        case 0: epoch = before.epoch_seen ? before.epoch_seen - 1 : 0; break;
        case 1: epoch = before.epoch_seen; break;
        case 2: epoch = before.epoch_seen + 1; break;
        default: epoch = fz_u64(&f); break;
        }
        switch (kind % 9) {
        case 0:         /* raw bytes to any method */
            method = (uint16_t)(fz_u8(&f) % 7);
            len = fz_take(&f, fz_u16(&f) % sizeof(req), (const uint8_t **)&data);
            memcpy(req, data, len);
            break;
        case 1:
        case 2:         /* an APPEND that follows */
            len = build_append(&f, epoch, before.position);
            break;
        case 3:         /* an APPEND from anywhere */
            len = build_append(&f, epoch, fz_u64(&f) % (before.position + 4));
            break;
        case 4:
            method = REPL_M_POSITION;
            len = build_ask(&f, epoch, 0);
            break;
        case 5:
            method = REPL_M_FETCH;
            len = build_ask(&f, epoch, fz_u8(&f) % 2 ? before.position : fz_u64(&f));
            break;
        case 6:
            method = REPL_M_COPY;
            len = build_copy(&f, epoch);
            break;
        case 7:
            method = REPL_M_RING;
            len = build_ask(&f, epoch, 0);
            break;
        default:        /* frames into the ring, then RING_SYNC takes them */
            if (granted) {
                if (fz_u8(&f) % 4) {
                    len = build_append(&f, grant.epoch, fz_u8(&f) % 8 ? before.position
                                                                        : fz_u64(&f));
                } else {
                    len = fz_take(&f, fz_u16(&f) % 2048, (const uint8_t **)&data);
                    memcpy(req, data, len);
                }
                land_frame(&f, &grant, &ring_at, len);
            }
            method = REPL_M_RING_SYNC;
            len = build_ask(&f, epoch, ring_at);
            break;
        }
        bool built = kind % 9 != 0 && !(kind & 0x80);

        if (!built && kind % 9 != 0 && len)
            req[fz_u16(&f) % len] ^= (uint8_t)(1u << (fz_u8(&f) % 8));
        rc = call(method, req, len);
        repl_status(grp, &after);
        FZ_CHECK(after.position >= before.position || method == REPL_M_COPY,
                 "position went back");
        FZ_CHECK(after.epoch_seen >= before.epoch_seen, "epoch seen went back");
        if (rc == 0 && method == REPL_M_COPY && req[offsetof(struct repl_copy, phase)] == 3)
            copied = true;
        FZ_CHECK(after.copying || copied ||
                     after.position == kvs_version(kv_service_store(svc)) ||
                     after.position == before.position,
                 "position %llx, the store %llx", (unsigned long long)after.position,
                 (unsigned long long)kvs_version(kv_service_store(svc)));
        if (rc == 0 && built)
            FZ_CHECK(epoch >= before.epoch_seen, "epoch %llu taken after %llu",
                     (unsigned long long)epoch, (unsigned long long)before.epoch_seen);
        if (rc == 0 && method == REPL_M_RING && built) {
            FZ_CHECK(rep.len == sizeof(grant), "a grant of %zu bytes", rep.len);
            memcpy(&grant, rep.data, sizeof(grant));
            FZ_CHECK(grant.size >= REPL_RING_MIN && !(grant.head % REPL_FRAME_ALIGN) &&
                         grant.position == after.position,
                     "a grant that cannot be");
            granted = true;
            ring_at = grant.head;
        }
        if (rc == 0 && method == REPL_M_FETCH)
            FZ_CHECK(repl_batch_walk(rep.data, rep.len, NULL, NULL, NULL) == 0,
                     "a FETCH answer its own walker refuses");
        for (size_t i = 0; i < rep.len; i++)
            sink ^= rep.data[i];
    }
    /* Still serving. */
    FZ_CHECK(call(REPL_M_POSITION, req, build_ask(&f, REPL_EPOCH_MAX, 0)) == 0,
             "no POSITION after the run");
    kv_service_replicate(svc, NULL);
    repl_close(grp);
    unlink(state_path);
    unlink(ring_path);
    FZ_CHECK(kvs_wipe(kv_service_store(svc)) == 0, "wipe");
    open_group();
    return 0;
}
