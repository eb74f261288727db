/* rpcbench get|put: one-sided latency at the transport level. A child
 * process owns a region and hands its key over; this process times one
 * operation at a time (window 1) from the call to its completion. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hist.h"
#include "onesided.h"
#include "rpc.h"
#include "spawn.h"

static volatile sig_atomic_t owner_stop;

static void owner_on_term(int sig)
{
    (void)sig;
    owner_stop = 1;
}

/* The owner: a region per connection, its key sent as the first message;
 * then it only polls (the served path needs that; the direct one does not). */
static int owner(void *arg, int pipe_fd)
{
    const struct onesided_opts *o = arg;
    struct tern_tp_config cfg = {.fabric = o->fabric, .max_msg = o->size > 4096 ? o->size : 4096};
    size_t len = o->size < 4096 ? 4096 : o->size;
    uint32_t access = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_tp_ep *ep;
    struct tern_tp_event ev[16];
    char bound[128], uri[128], tag[32];

    bench_pin(o->cpu_server);
    snprintf(tag, sizeof(tag), "rpcbench-os-%d", (int)getpid());
    if (tern_tp_local_uri(o->fabric, tag, uri, sizeof(uri)) < 0 || tern_tp_open(&cfg, &ep) < 0 ||
        tern_tp_listen(ep, strstr(uri, "://") + 3, bound, sizeof(bound)) < 0) {
        (void)!write(pipe_fd, "-", 1);
        return 1;
    }
    (void)!write(pipe_fd, bound, strlen(bound));
    close(pipe_fd);
    /* SIGTERM ends it cleanly: the endpoint's resources (a softverbs
     * segment, an NTB device file) go with tern_tp_close. */
    signal(SIGTERM, owner_on_term);
    while (!owner_stop) {
        int n = tern_tp_poll(ep, ev, 16);

        for (int i = 0; i < n; i++) {
            struct tern_tp_mr *mr;
            struct tern_tp_rkey rk;
            int rc;

            if (ev[i].type == TERN_TP_EV_RECV)
                tern_tp_msg_release(ev[i].conn, ev[i].data);
            if (ev[i].type == TERN_TP_EV_CLOSED) {
                tern_tp_close(ep);  /* the fabric's resources go with it */
                return 0;
            }
            if (ev[i].type != TERN_TP_EV_ACCEPTED)
                continue;
            /* --served: memory of our own, reached through this poll. */
            rc = o->served ? tern_tp_mr_reg(ep, calloc(1, len), len, access, &mr)
                           : tern_tp_mr_alloc(ep, len, access, &mr);
            /* The key for this connection (rdma: a window bound to it),
             * sent on it, after the bind. */
            if (rc < 0 || tern_tp_conn_mr_rkey(ev[i].conn, mr, &rk) < 0)
                return 1;
            tern_tp_msg_send(ev[i].conn, &rk, sizeof(rk));
        }
        tern_tp_flush(ep);
    }
    tern_tp_close(ep);
    return 0;
}

/* Wait for an event of `type` (handing back views); false on an error. */
static bool await(struct tern_tp_ep *ep, enum tern_tp_event_type type, struct tern_tp_event *out)
{
    for (;;) {
        int n = tern_tp_poll(ep, out, 1);

        if (n < 0)
            return false;
        if (n == 0)
            continue;
        if (out->type == type)
            return out->status == 0;
        if (out->type == TERN_TP_EV_RECV)
            tern_tp_msg_release(out->conn, out->data);
        if (out->type == TERN_TP_EV_CLOSED || out->status < 0)
            return false;
    }
}

/* One operation, from the call to its completion. */
static bool one_op(struct tern_tp_ep *ep, struct tern_tp_conn *c, const struct onesided_opts *o,
                   struct tern_tp_mr *lmr, const struct tern_tp_rkey *rk)
{
    struct tern_tp_event ev;
    int rc;

    while ((rc = o->put ? tern_tp_put(c, lmr, 0, o->size, rk, 0, 0)
                        : tern_tp_get(c, lmr, 0, o->size, rk, 0, 0)) == TERN_EAGAIN)
        if (tern_tp_poll(ep, &ev, 1) == 1 && ev.type != TERN_TP_EV_PUT_DONE &&
            ev.type != TERN_TP_EV_GET_DONE)
            return false;   /* nothing else comes on this connection */
    if (rc < 0)
        return false;
    tern_tp_flush(ep);
    return await(ep, o->put ? TERN_TP_EV_PUT_DONE : TERN_TP_EV_GET_DONE, &ev);
}

int run_onesided(const struct onesided_opts *o)
{
    static struct hist h;
    struct tern_tp_config cfg = {.fabric = o->fabric, .max_msg = o->size > 4096 ? o->size : 4096};
    struct tern_tp_ep *ep = NULL;
    struct tern_tp_conn *c;
    struct tern_tp_mr *lmr;
    struct tern_tp_rkey rk;
    struct tern_tp_event ev;
    char bound[128] = {0};
    int status, rc = 1;
    uint64_t warm = o->iters / 10 + 1000, t0, secs_ns;
    pid_t pid;

    pid = bench_spawn(owner, (void *)o, bound, sizeof(bound));
    if (pid < 0)
        return 1;
    bench_pin(o->cpu_client);
    if (strlen(bound) <= 1 || bound[0] == '-' || tern_tp_open(&cfg, &ep) < 0 ||
        tern_tp_connect(ep, bound, &c) < 0 || !await(ep, TERN_TP_EV_CONNECTED, &ev) ||
        !await(ep, TERN_TP_EV_RECV, &ev) || ev.len != sizeof(rk)) {
        fprintf(stderr, "rpcbench: no %s owner to talk to\n", o->fabric);
        goto out;
    }
    memcpy(&rk, ev.data, sizeof(rk));
    tern_tp_msg_release(c, ev.data);
    if (tern_tp_mr_alloc(ep, o->size, 0, &lmr) < 0)
        goto out;
    /* The warm-up also gives the shm fabric time to map the region. */
    for (uint64_t i = 0; i < warm; i++)
        if (!one_op(ep, c, o, lmr, &rk))
            goto failed;
    hist_reset(&h);
    t0 = tern_now_ns();
    for (uint64_t i = 0; i < o->iters; i++) {
        uint64_t t = tern_now_ns();

        if (!one_op(ep, c, o, lmr, &rk))
            goto failed;
        hist_add(&h, tern_now_ns() - t);
    }
    secs_ns = tern_now_ns() - t0;
    if (o->json)
        printf("{\"workload\":\"%s\",\"fabric\":\"%s\",\"path\":\"%s\",\"size\":%zu,"
               "\"iters\":%llu,\"p50_ns\":%llu,\"p99_ns\":%llu,\"ops_per_s\":%.0f}\n",
               o->put ? "put" : "get", o->fabric, o->served ? "served" : "direct", o->size,
               (unsigned long long)o->iters, (unsigned long long)hist_quantile(&h, 0.5),
               (unsigned long long)hist_quantile(&h, 0.99), (double)o->iters * 1e9 / (double)secs_ns);
    else
        printf("%s over %s, %s, %zu B, window 1: p50 %.3f us, p99 %.3f us, %.0f ops/s\n",
               o->put ? "put" : "get", o->fabric,
               o->served ? "registered region (served by the owner's poll)"
                         : "allocated region (direct where the fabric can)",
               o->size, hist_quantile(&h, 0.5) / 1e3, hist_quantile(&h, 0.99) / 1e3,
               (double)o->iters * 1e9 / (double)secs_ns);
    rc = 0;
    goto out;
failed:
    fprintf(stderr, "rpcbench: a %s over %s failed (refused, or the owner went)\n",
            o->put ? "put" : "get", o->fabric);
out:
    /* The owner goes first: the last side out of an emulated NTB device
     * removes its file. */
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    tern_tp_close(ep);
    return rc;
}
