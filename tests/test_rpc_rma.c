/* rpc: one-sided access through sessions (case rma, rpc_rma_fixture.h).
 * Put and get between client and server regions on every fabric,
 * keys that are bad or out of range, direct pointers (shm), regions
 * deregistered with operations in flight, keys per fabric, completions
 * that chain operations, and bad arguments.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rpc_rma_fixture.h"
#include "rpc_internal.h"

/* Put and get between a client's regions and a server's, and a handler
 * that pushes into the client before it replies. */
START_TEST(rma_put_get)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct tern_rpc_mr *cmr, *plain, *filed;
    struct tern_tp_rkey srk;
    uint8_t *c, *heap, *fmap, want[2000];
    size_t big;
    int fd;

    if (!rma_proc_open(_i))
        return;
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 40000, rw, &cmr), 0);
    c = tern_rpc_mr_addr(cmr);
    ck_assert_uint_eq(tern_rpc_mr_len(cmr), 40000);
    ck_assert_msg(((uintptr_t)c & (page - 1)) == 0, "tern_rpc_mr_alloc memory not page-aligned");
    for (size_t i = 0; i < 40000; i++)
        ck_assert_msg(c[i] == 0, "tern_rpc_mr_alloc memory not zeroed at %zu", i);
    srk = srv_key(sess, 0);
    ck_assert_uint_eq(srk.len, SRV_MR_LEN);

    rma_fill(c, 40000, 1);
    rma_expect(sess, true, cmr, 0, 1000, &srk, 100, 0);
    srv_expect(sess, 0, 100, 1000, c, "put");
    /* As large as the session carries in one operation (ntb: one ring
     * record), and longer ones refused before they leave. */
    big = tern_session_rma_max(sess) < 30000 ? tern_session_rma_max(sess) : 30000;
    rma_expect(sess, true, cmr, 5000, big, &srk, SRV_MR_LEN - big, 0);
    srv_expect(sess, 0, SRV_MR_LEN - big, (uint32_t)big, c + 5000, "large put");
    if (big < 30000)
        ck_assert_int_eq(tern_session_put(sess, cmr, 0, big + 1, &srk, 0, NULL, NULL),
                         TERN_EMSGSIZE);

    srv_fill(sess, 0, 20000, 2000, 2);
    rma_fill(want, 2000, 2);
    rma_expect(sess, false, cmr, 38000, 2000, &srk, 20000, 0);
    ck_assert_msg(memcmp(c + 38000, want, 2000) == 0, "get: client memory differs");

    /* Memory the caller keeps: plain heap, and a file mapping whose
     * descriptor the caller closes before the region is first used. */
    heap = calloc(1, 4096);
    ck_assert_ptr_nonnull(heap);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, heap, 4096, -1, 0, rw, &plain), 0);
    rma_fill(heap, 4096, 3);
    rma_expect(sess, true, plain, 0, 4096, &srk, 4096, 0);
    srv_expect(sess, 0, 4096, 4096, heap, "put from the heap");
    fd = memfd_create("rma-test", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 2 * (off_t)page), 0);
    fmap = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)page);
    ck_assert(fmap != MAP_FAILED);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, fmap, page, fd, page, rw, &filed), 0);
    close(fd);
    srv_fill(sess, 0, 9000, (uint32_t)page, 4);
    rma_expect(sess, false, filed, 0, page, &srk, 9000, 0);
    rma_fill(heap, page, 4);
    ck_assert_msg(memcmp(fmap, heap, page) == 0, "get into a file mapping: memory differs");
    tern_rpc_mr_dereg(filed);
    munmap(fmap, page);
    tern_rpc_mr_dereg(plain);
    free(heap);

    /* The server pushes into the client's memory from a handler. */
    expect_push(sess, cmr, 7000, 3000, 0x5c);
    expect_push(sess, cmr, 0, 1, 0xa7);
    ck_assert_int_eq(tern_session_status(sess), 0);
    tern_rpc_mr_dereg(cmr);
    rma_proc_close();
}
END_TEST

/* A key the server never gave, or a range outside the region: refused
 * with TERN_EREMACCESS, and the session goes on. (On rdma a wrong key
 * breaks the queue pair, so there only the range is tried: what the key
 * states itself is checked before posting.) */
START_TEST(rma_bad_rkey)
{
    struct tern_rpc_mr *cmr;
    struct tern_tp_rkey srk, bad;

    if (!rma_proc_open(_i))
        return;
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 8192, TERN_TP_ACCESS_REMOTE_WRITE, &cmr), 0);
    srk = srv_key(sess, 0);
    if (!(test_fabric_caps(_i) & TERN_TP_CAP_STRICT_RKEY)) {
        bad = srk;
        bad.key ^= 0x5a5a0000;  /* same slot, another nonce */
        rma_expect(sess, true, cmr, 0, 100, &bad, 0, TERN_EREMACCESS);
        rma_expect(sess, false, cmr, 0, 100, &bad, 0, TERN_EREMACCESS);
    }
    rma_expect(sess, true, cmr, 0, 100, &srk, SRV_MR_LEN - 50, TERN_EREMACCESS);
    rma_expect(sess, false, cmr, 0, 100, &srk, SRV_MR_LEN + 4096, TERN_EREMACCESS);
    ck_assert_int_eq(tern_session_status(sess), 0);
    rma_fill(tern_rpc_mr_addr(cmr), 100, 5);
    rma_expect(sess, true, cmr, 0, 100, &srk, 0, 0);
    srv_expect(sess, 0, 0, 100, tern_rpc_mr_addr(cmr), "put after refused ones");
    rma_proc_close();
}
END_TEST

/* Direct pointers exist on shm only; elsewhere TERN_ENOTSUP. */
START_TEST(rma_rkey_ptr)
{
    const uint32_t rd = TERN_TP_ACCESS_REMOTE_READ, wr = TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_tp_rkey srk;
    uint8_t want[64];
    void *p = NULL;
    int rc;

    if (!rma_proc_open(_i))
        return;
    srk = srv_key(sess, 0);
    srv_fill(sess, 0, 0, 64, 8);
    rc = tern_session_rkey_ptr(sess, &srk, 0, 64, rd, &p);
    for (double end = now_ms() + WAIT_MS; rc == TERN_EAGAIN && now_ms() < end;) {
        poll_eps();
        rc = tern_session_rkey_ptr(sess, &srk, 0, 64, rd, &p);
    }
    if (!(test_fabric_caps(_i) & TERN_TP_CAP_RKEY_PTR)) {
        ck_assert_msg(rc == TERN_ENOTSUP, "rkey_ptr on %s: %s", test_fabric_name(_i),
                      status_name(rc));
    } else if (rc == TERN_ENOTSUP &&
               !(tern_tp_caps(tern_tp_conn_ep(sess->conn)) & TERN_TP_CAP_RKEY_PTR)) {
        printf("SKIP: shm rkey_ptr: the transport has no direct pointers\n");
    } else {
        ck_assert_msg(rc == 0, "rkey_ptr on shm: %s", status_name(rc));
        rma_fill(want, 64, 8);
        ck_assert_msg(memcmp(p, want, 64) == 0, "rkey_ptr: not the server's bytes");
        rc = tern_session_rkey_ptr(sess, &srk, 128, 64, rd | wr, &p);
        ck_assert_msg(rc == 0, "writable rkey_ptr on shm: %s", status_name(rc));
        memset(p, 0x77, 64);
        memset(want, 0x77, 64);
        srv_expect(sess, 0, 128, 64, want, "store through rkey_ptr");
        rc = tern_session_rkey_ptr(sess, &srk, SRV_MR_LEN - 8, 64, rd, &p);
        ck_assert_msg(rc == TERN_EREMACCESS, "rkey_ptr out of range: %s", status_name(rc));
    }
    ck_assert_int_eq(tern_session_rkey_ptr(sess, NULL, 0, 64, rd, &p), TERN_EINVAL);
    ck_assert_int_eq(tern_session_status(sess), 0);
    rma_proc_close();
}
END_TEST

/* Deregistration: a server region's key stops working at once; a client
 * region with gets in flight completes them now with an error, and keeps
 * its memory until the fabric is done with them (their data still lands). */
START_TEST(rma_dereg)
{
    struct tern_rpc_mr *cmr, *cmr2;
    struct tern_tp_rkey srk0, srk1;
    struct rreq q = {.region = 1};
    struct rma_rec g[3] = {{0}};

    if (!rma_proc_open(_i))
        return;
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 8192, TERN_TP_ACCESS_REMOTE_WRITE, &cmr), 0);
    srk0 = srv_key(sess, 0);
    srk1 = srv_key(sess, 1);
    rma_expect(sess, true, cmr, 0, 100, &srk1, 0, 0);
    call_expect(sess, R_DEREG, &q, sizeof(q), 0, NULL, 0);
    if (!(test_fabric_caps(_i) & TERN_TP_CAP_STRICT_RKEY)) {   /* on rdma the NIC refuses it by breaking the queue pair */
        rma_expect(sess, true, cmr, 0, 100, &srk1, 0, TERN_EREMACCESS);
        rma_expect(sess, false, cmr, 0, 100, &srk1, 0, TERN_EREMACCESS);
    }
    rma_expect(sess, true, cmr, 0, 100, &srk0, 0, 0);

    /* Gets in flight into a region deregistered under them. */
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 3 * 4096, TERN_TP_ACCESS_LOCAL, &cmr2), 0);
    srv_fill(sess, 0, 0, 3 * 4096, 9);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(rma_start_retry(sess, false, cmr2, (size_t)i * 4096, 4096, &srk0,
                                         (uint64_t)i * 4096, &g[i]), 0);
    tern_rpc_mr_dereg(cmr2);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(g[i].runs == 1, "get %d: %d completions at dereg", i, g[i].runs);
        ck_assert_msg(g[i].status == TERN_ECANCELED, "get %d: %s", i,
                      status_name(g[i].status));
    }
    poll_for(100);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(g[i].runs == 1, "get %d completed again", i);
    ck_assert_uint_eq(cli->n_rma_free, cli->cfg.max_calls);
    ck_assert_int_eq(tern_session_status(sess), 0);
    rma_expect(sess, false, cmr, 0, 4096, &srk0, 0, 0);
    expect_push(sess, cmr, 0, 64, 0x99);
    rma_proc_close();
}
END_TEST

/* Keys are per fabric, and a region is registered on a fabric only when a
 * session there first needs it. */
START_TEST(rma_rkeys_per_fabric)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_rpc_config cfg = {.max_msg = MAX_MSG};
    struct tern_tp_rkey k_tcp, k_shm, c_tcp, c_shm;
    struct tern_rpc_mr *cmr, *cmr2;
    struct tern_session *s2;
    char shm_uri[128];
    uint8_t *sm;
    int rc;

    ck_assert_int_eq(tern_rpc_open(&cfg, &srv), 0);
    ck_assert_int_eq(rma_setup_ep(srv), 0);
    ck_assert_int_eq(tern_rpc_listen(srv, "tcp://127.0.0.1:0", uri, sizeof(uri)), 0);
    ck_assert_int_eq(tern_rpc_listen(srv, "shm://auto", shm_uri, sizeof(shm_uri)), 0);
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli), 0);
    ck_assert_int_eq(tern_rpc_open(&cfg, &cli2), 0);
    ck_assert_int_eq(connect_inproc(cli, uri, &sess), 0);
    rc = connect_inproc(cli2, shm_uri, &s2);
    ck_assert_msg(rc == 0, "connect %s: %s", shm_uri, tern_strerror(rc));
    ck_assert_str_eq(tern_session_fabric(s2), "shm");
    for (int i = 0; i < RPC_MAX_FABRICS; i++)
        ck_assert_msg(!srv_mrs[0]->tp[i], "region registered on fabric %d before any use", i);

    k_tcp = srv_key(sess, 0);
    for (unsigned i = 0; i < srv->n_tp; i++)
        ck_assert_msg(!srv_mrs[0]->tp[i] == (tern_tp_fabric_id(srv->tp[i]) !=
                                            tern_tp_fabric_id(tern_tp_conn_ep(sess->conn))),
                      "after a tcp key: %s registered: %d", tern_tp_fabric(srv->tp[i]),
                      srv_mrs[0]->tp[i] != NULL);
    k_shm = srv_key(s2, 0);
    for (unsigned i = 0; i < srv->n_tp; i++)
        ck_assert_msg(srv_mrs[0]->tp[i], "after both keys: %s not registered",
                      tern_tp_fabric(srv->tp[i]));
    ck_assert_msg(k_tcp.key != k_shm.key, "tcp and shm keys are the same (%#x)", k_tcp.key);
    ck_assert_uint_eq(k_tcp.len, k_shm.len);

    /* The client side too: nothing until its own key is asked. */
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, rw, &cmr), 0);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli2, 4096, rw, &cmr2), 0);
    ck_assert(!cmr->tp[0] && !cmr2->tp[0]);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, sess, &c_tcp), 0);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr2, s2, &c_shm), 0);
    ck_assert(cmr->tp[0] && cmr2->tp[0]);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, s2, &c_shm), TERN_EINVAL);   /* other endpoint */

    /* Each key works over its own fabric; the tcp key means nothing on shm. */
    sm = tern_rpc_mr_addr(srv_mrs[0]);
    rma_fill(tern_rpc_mr_addr(cmr), 4096, 6);
    rma_fill(tern_rpc_mr_addr(cmr2), 4096, 7);
    rma_expect(sess, true, cmr, 0, 4096, &k_tcp, 0, 0);
    ck_assert(memcmp(sm, tern_rpc_mr_addr(cmr), 4096) == 0);
    rma_expect(s2, true, cmr2, 0, 4096, &k_shm, 4096, 0);
    ck_assert(memcmp(sm + 4096, tern_rpc_mr_addr(cmr2), 4096) == 0);
    rma_expect(s2, true, cmr2, 0, 64, &k_tcp, 0, TERN_EREMACCESS);
    expect_push(s2, cmr2, 100, 200, 0x33);
    expect_push(sess, cmr, 100, 200, 0x34);
    rma_pair_close();
}
END_TEST

/* Completions that start the next operation, and at the end a call, from
 * inside the callback; one slot is enough, as the slot is free when the
 * callback runs. */
struct chain {
    struct tern_session *s;
    struct tern_rpc_mr *mr;
    struct tern_tp_rkey rk;
    int done, failed, first_error;
    int limit;
    struct rec call;
};

static void chain_cb(void *arg, int status)
{
    struct chain *c = arg;
    int rc;

    c->done++;
    if (status < 0 && !c->failed++)
        c->first_error = status;
    if (c->done == c->limit) {
        rc = tern_call(c->s, SVC, M_ECHO, "end", 3, 0, rec_cont, &c->call, NULL);
        if (rc < 0 && !c->failed++)
            c->first_error = rc;
        return;
    }
    rc = (c->done & 1 ? tern_session_get : tern_session_put)(
        c->s, c->mr, (size_t)c->done, 64, &c->rk, (uint64_t)c->done * 64, chain_cb, c);
    if (rc < 0 && !c->failed++)
        c->first_error = rc;
}

START_TEST(rma_callback_chains)
{
    struct tern_rpc_config ccfg = {.max_msg = MAX_MSG, .max_calls = 1};
    struct chain c = {.limit = 50};

    rma_pair_open(FAB_TCP, &ccfg);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, TERN_TP_ACCESS_LOCAL, &c.mr), 0);
    c.s = sess;
    c.rk = srv_key(sess, 0);
    rec_init(&c.call, 8);
    ck_assert_int_eq(tern_session_put(sess, c.mr, 0, 64, &c.rk, 0, chain_cb, &c), 0);
    for (double end = now_ms() + WAIT_MS; !c.call.runs && !c.failed && now_ms() < end;)
        poll_eps();
    ck_assert_msg(!c.failed, "%d operations failed, first: %s", c.failed,
                  status_name(c.first_error));
    ck_assert_int_eq(c.done, c.limit);
    ck_assert_int_eq(c.call.runs, 1);
    ck_assert_int_eq(c.call.status, 0);
    free(c.call.buf);
    rma_pair_close();
}
END_TEST

START_TEST(rma_argument_errors)
{
    const uint32_t rw = TERN_TP_ACCESS_REMOTE_READ | TERN_TP_ACCESS_REMOTE_WRITE;
    struct tern_rpc_mr *cmr, *mr = (struct tern_rpc_mr *)&mr;
    struct tern_tp_rkey srk, k;
    struct rma_rec r = {0};
    uint8_t buf[64];
    int fd;

    rma_pair_open(FAB_TCP, NULL);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, NULL, 64, -1, 0, rw, &mr), TERN_EINVAL);
    ck_assert_ptr_null(mr);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 0, -1, 0, rw, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, -1, 0, 8, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, -1, 0, rw, NULL), TERN_EINVAL);
    fd = memfd_create("rma-args", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, fd, 100, rw, &mr), TERN_EINVAL);
    close(fd);
    ck_assert_int_eq(tern_rpc_mr_reg(cli, buf, 64, fd, 0, rw, &mr), TERN_EINVAL);  /* closed */
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 0, rw, &mr), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 64, 1u << 7, &mr), TERN_EINVAL);

    ck_assert_int_eq(tern_rpc_mr_alloc(cli, 4096, rw, &cmr), 0);
    srk = srv_key(sess, 0);
    ck_assert_int_eq(tern_session_put(sess, cmr, 0, 64, NULL, 0, rma_cb, &r), TERN_EINVAL);
    ck_assert_int_eq(tern_session_put(sess, NULL, 0, 64, &srk, 0, rma_cb, &r), TERN_EINVAL);
    ck_assert_int_eq(tern_session_get(NULL, cmr, 0, 64, &srk, 0, rma_cb, &r), TERN_EINVAL);
    ck_assert_int_eq(tern_session_put(sess, cmr, 4000, 200, &srk, 0, rma_cb, &r), TERN_ERANGE);
    ck_assert_int_eq(tern_session_get(sess, cmr, 0, 0, &srk, 0, rma_cb, &r), TERN_EINVAL);
    /* A region of another endpoint. */
    ck_assert_int_eq(tern_session_put(sess, srv_mrs[0], 0, 64, &srk, 0, rma_cb, &r),
                     TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_rkey(srv_mrs[0], sess, &k), TERN_EINVAL);
    ck_assert_int_eq(tern_rpc_mr_rkey(cmr, NULL, &k), TERN_EINVAL);
    ck_assert_int_eq(r.runs, 0);
    /* None of those took a slot. */
    ck_assert_uint_eq(cli->n_rma_free, cli->cfg.max_calls);
    ck_assert_ptr_null(tern_rpc_mr_addr(NULL));
    ck_assert_uint_eq(tern_rpc_mr_len(NULL), 0);
    tern_rpc_mr_dereg(NULL);
    ck_assert_uint_eq(tern_session_epoch(sess), 0);
    rma_expect(sess, true, cmr, 0, 64, &srk, 0, 0);
    /* Regions left registered go with the endpoint (ASan sees leaks). */
    rma_pair_close();
}
END_TEST

void rpc_add_rma(const struct rpc_cases *c)
{
    tcase_add_loop_test(c->rma, rma_put_get, 0, test_fabric_count());
    tcase_add_loop_test(c->rma, rma_bad_rkey, 0, test_fabric_count());
    tcase_add_loop_test(c->rma, rma_rkey_ptr, 0, test_fabric_count());
    tcase_add_loop_test(c->rma, rma_dereg, 0, test_fabric_count());
    tcase_add_test(c->rma, rma_rkeys_per_fabric);
    tcase_add_test(c->rma, rma_callback_chains);
    tcase_add_test(c->rma, rma_argument_errors);
}
