/* MongoDB's commands (services/doc/doc_cmd.c) on a store in a temporary
 * pool: command documents in, replies checked field by field, with the
 * types pymongo 3.11 reads (pymongo/helpers.py, pymongo/ismaster.py,
 * pymongo/command_cursor.py) and the shapes of the MongoDB manual's
 * command pages (reference/command/<name>). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc_cmd.h"
#include "doc_repl.h"
#include "doc_store.h"
#include "error.h"
#include "procs.h"
#include "repl.h"
#include "rpc.h"
#include "suites.h"

static char dir[64];
static char pool_path[128];
static struct doc_store *store;
static struct doc_server *srv;
static struct doc_client *cl, *other;
static bson_t rep;              /* the last reply */

static void open_all(size_t max_doc, const struct doc_server_opts *so)
{
    struct doc_store_opts o = {.pool_size = 256u << 20, .create = true, .max_doc = max_doc};
    struct doc_err e = {0};

    ck_assert_msg(doc_store_open(pool_path, &o, &store, &e) == 0, "store: %s", e.msg);
    ck_assert_int_eq(doc_server_open(store, so, &srv), 0);
    cl = doc_client_new(srv, "127.0.0.1:5000");
    other = doc_client_new(srv, "127.0.0.1:5001");
    ck_assert_ptr_nonnull(cl);
    ck_assert_ptr_nonnull(other);
}

static void close_all(void)
{
    if (srv) {
        doc_client_free(cl);
        doc_client_free(other);
        doc_server_close(srv);
    }
    if (store)
        doc_store_close(store);
    srv = NULL;
    store = NULL;
    unlink(pool_path);
}

static void setup(void)
{
    test_tmpdir(dir, sizeof(dir), "doc_cmd");
    snprintf(pool_path, sizeof(pool_path), "%s/pool", dir);
    bson_init(&rep);
    open_all(0, NULL);
}

static void teardown(void)
{
    close_all();
    bson_destroy(&rep);
    test_tmpdir_remove(dir);
}

/* Reopen with other options. */
static void reopen(size_t max_doc, const struct doc_server_opts *so)
{
    close_all();
    open_all(max_doc, so);
}

static void json(bson_t *d, const char *js)
{
    bson_error_t err;

    ck_assert_msg(bson_init_from_json(d, js, -1, &err), "%s: %s", js, err.message);
}

static int run_on_seq(struct doc_client *c, const bson_t *cmd, const struct doc_seq *seqs,
                      unsigned n)
{
    bson_reinit(&rep);
    return doc_cmd_run(c, cmd, seqs, n, &rep);
}

/* Run a command given as extended JSON, as client c. */
static int run_as(struct doc_client *c, const char *js)
{
    bson_t cmd;
    int rc;

    json(&cmd, js);
    rc = run_on_seq(c, &cmd, NULL, 0);
    bson_destroy(&cmd);
    return rc;
}

static int run(const char *js)
{
    return run_as(cl, js);
}

static bool find_path(const bson_t *d, const char *path, bson_iter_t *it)
{
    bson_iter_t top;

    return bson_iter_init(&top, d) && bson_iter_find_descendant(&top, path, it);
}

static bson_type_t type_of(const char *path)
{
    bson_iter_t it;

    return find_path(&rep, path, &it) ? bson_iter_type(&it) : BSON_TYPE_EOD;
}

static bool has(const char *path)
{
    return type_of(path) != BSON_TYPE_EOD;
}

static int64_t num(const char *path)
{
    bson_iter_t it;

    ck_assert_msg(find_path(&rep, path, &it), "no %s in %s", path,
                  bson_as_relaxed_extended_json(&rep, NULL));
    return bson_iter_as_int64(&it);
}

static const char *str(const char *path)
{
    bson_iter_t it;

    ck_assert_msg(find_path(&rep, path, &it) && BSON_ITER_HOLDS_UTF8(&it), "no string %s in %s",
                  path, bson_as_relaxed_extended_json(&rep, NULL));
    return bson_iter_utf8(&it, NULL);
}

static void assert_ok(void)
{
    bson_iter_t it;

    ck_assert_msg(find_path(&rep, "ok", &it) && BSON_ITER_HOLDS_DOUBLE(&it) &&
                      bson_iter_double(&it) == 1.0,
                  "not ok: %s", bson_as_relaxed_extended_json(&rep, NULL));
}

/* A failed command: {ok: 0.0, errmsg, code: int32, codeName}. */
static void assert_err(int code)
{
    bson_iter_t it;

    ck_assert_msg(find_path(&rep, "ok", &it) && BSON_ITER_HOLDS_DOUBLE(&it) &&
                      bson_iter_double(&it) == 0.0,
                  "not an error: %s", bson_as_relaxed_extended_json(&rep, NULL));
    ck_assert_int_eq(type_of("code"), BSON_TYPE_INT32);
    ck_assert_msg(num("code") == code, "code %lld, not %d: %s", (long long)num("code"), code,
                  bson_as_relaxed_extended_json(&rep, NULL));
    ck_assert_int_eq(type_of("errmsg"), BSON_TYPE_UTF8);
    ck_assert_int_eq(type_of("codeName"), BSON_TYPE_UTF8);
    ck_assert_str_eq(str("codeName"), doc_code_name(code));
}

/* The array at `path` of the reply, as a document. */
static uint32_t array_len(const char *path)
{
    bson_iter_t it, sub;
    uint32_t n = 0;

    ck_assert_msg(find_path(&rep, path, &it) && BSON_ITER_HOLDS_ARRAY(&it), "no array %s in %s",
                  path, bson_as_relaxed_extended_json(&rep, NULL));
    bson_iter_recurse(&it, &sub);
    while (bson_iter_next(&sub))
        n++;
    return n;
}

static int64_t cursor_id(void)
{
    ck_assert_int_eq(type_of("cursor.id"), BSON_TYPE_INT64);
    return num("cursor.id");
}

static void insert_json(const char *coll, const char *docs)
{
    char cmd[4096];

    snprintf(cmd, sizeof(cmd), "{\"insert\": \"%s\", \"documents\": %s, \"$db\": \"test\"}", coll,
             docs);
    ck_assert_int_eq(run(cmd), DOC_CMD_WROTE);
    assert_ok();
    ck_assert_int_eq(type_of("writeErrors"), BSON_TYPE_EOD);
}

/* Insert n documents {_id: i, a: i % 10, s: <pad>} through a kind-1
 * sequence, as pymongo sends insert_many. */
static void insert_many(const char *coll, int n, int pad)
{
    struct doc_buf b = {0};
    struct doc_seq seq;
    char cmdjs[256], *padding = malloc(pad + 1);
    bson_t cmd;
    int i;

    memset(padding, 'x', pad);
    padding[pad] = 0;
    for (i = 0; i < n; i++) {
        bson_t d = BSON_INITIALIZER;

        bson_append_int32(&d, "_id", 3, i);
        bson_append_int32(&d, "a", 1, i % 10);
        bson_append_utf8(&d, "s", 1, padding, -1);
        doc_buf_add(&b, bson_get_data(&d), d.len);
        bson_destroy(&d);
    }
    seq = (struct doc_seq){.id = "documents", .id_len = 9, .docs = b.p, .len = b.len};
    snprintf(cmdjs, sizeof(cmdjs), "{\"insert\": \"%s\", \"ordered\": true, \"$db\": \"test\"}",
             coll);
    json(&cmd, cmdjs);
    ck_assert_int_eq(run_on_seq(cl, &cmd, &seq, 1), DOC_CMD_WROTE);
    assert_ok();
    ck_assert_int_eq(num("n"), n);
    bson_destroy(&cmd);
    doc_buf_free(&b);
    free(padding);
}

/* ---- the handshake and the server's own commands ---- */

START_TEST(hello_shape)
{
    static const char *absent[] = {"setName", "compression", "hosts", "msg"};
    unsigned i;

    run("{\"isMaster\": 1, \"client\": {\"driver\": {\"name\": \"PyMongo\"}}, \"compression\": []}");
    assert_ok();
    ck_assert_int_eq(type_of("ismaster"), BSON_TYPE_BOOL);
    ck_assert(num("ismaster"));
    ck_assert(!has("helloOk"));
    ck_assert(!has("isWritablePrimary"));
    ck_assert_int_eq(type_of("maxBsonObjectSize"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("maxBsonObjectSize"), (int64_t)doc_store_max_doc(store));
    ck_assert_int_eq(type_of("maxMessageSizeBytes"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("maxMessageSizeBytes"), 48000000);
    ck_assert_int_eq(num("maxWriteBatchSize"), 100000);
    ck_assert_int_eq(type_of("localTime"), BSON_TYPE_DATE_TIME);
    ck_assert_int_eq(type_of("logicalSessionTimeoutMinutes"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("logicalSessionTimeoutMinutes"), 30);
    ck_assert_int_eq(type_of("connectionId"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("minWireVersion"), 0);
    ck_assert_int_eq(type_of("maxWireVersion"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("maxWireVersion"), 17);
    ck_assert_int_eq(type_of("readOnly"), BSON_TYPE_BOOL);
    ck_assert(!num("readOnly"));
    for (i = 0; i < sizeof(absent) / sizeof(absent[0]); i++)
        ck_assert_msg(!has(absent[i]), "%s in the hello reply", absent[i]);
    /* topologyVersion, as MongoDB 4.4 and later (a server alone too) */
    ck_assert_int_eq(type_of("topologyVersion.processId"), BSON_TYPE_OID);
    ck_assert_int_eq(type_of("topologyVersion.counter"), BSON_TYPE_INT64);
    ck_assert_int_eq(num("topologyVersion.counter"), 0);

    /* mongosh: hello over OP_MSG after helloOk */
    run("{\"hello\": 1, \"helloOk\": true, \"$db\": \"admin\"}");
    assert_ok();
    ck_assert(num("helloOk"));
    ck_assert_int_eq(type_of("isWritablePrimary"), BSON_TYPE_BOOL);
    ck_assert(num("isWritablePrimary"));
    run("{\"ismaster\": 1}");
    assert_ok();
    /* two clients, two connection ids */
    {
        int64_t a;

        run_as(cl, "{\"hello\": 1}");
        a = num("connectionId");
        run_as(other, "{\"hello\": 1}");
        ck_assert_int_ne(a, num("connectionId"));
    }
}
END_TEST

/* ---- awaitable hello ---- */

static char pid_hex[25];
static int64_t counter_now;

/* The topologyVersion of a plain hello now. */
static void topology_of(struct doc_client *c)
{
    bson_iter_t it;

    ck_assert_int_eq(run_as(c, "{\"hello\": 1}"), 0);
    assert_ok();
    ck_assert(find_path(&rep, "topologyVersion.processId", &it) && BSON_ITER_HOLDS_OID(&it));
    bson_oid_to_string(bson_iter_oid(&it), pid_hex);
    ck_assert_int_eq(type_of("topologyVersion.counter"), BSON_TYPE_INT64);
    counter_now = num("topologyVersion.counter");
}

/* A hello with topologyVersion {processId: pid, counter} and maxAwaitTimeMS `ms` (JSON). */
static int await_as(struct doc_client *c, const char *pid, int64_t counter, const char *ms)
{
    char js[512];

    snprintf(js, sizeof(js),
             "{\"hello\": 1, \"topologyVersion\": {\"processId\": {\"$oid\": \"%s\"}, "
             "\"counter\": {\"$numberLong\": \"%lld\"}}, \"maxAwaitTimeMS\": %s}",
             pid, (long long)counter, ms);
    return run_as(c, js);
}

/* The fields of an awaitable hello, refused as MongoDB refuses them
 * (jstests/core/awaitable_hello.js's cases), and what doc_client_await
 * says of a good one. */
START_TEST(awaitable_hello_args)
{
    static const struct {
        const char *js;
        int code;
    } bad[] = {
        {"{\"hello\": 1, \"topologyVersion\": \"s\", \"maxAwaitTimeMS\": 0}", 10065},
        {"{\"hello\": 1, \"topologyVersion\": {\"processId\": \"pid1\", \"counter\": "
         "{\"$numberLong\": \"0\"}}, \"maxAwaitTimeMS\": 0}", DOC_TypeMismatch},
        {"{\"hello\": 1, \"topologyVersion\": {\"processId\": {\"$oid\": "
         "\"0123456789abcdef01234567\"}, \"counter\": 0}, \"maxAwaitTimeMS\": 0}",
         DOC_TypeMismatch},
        {"{\"hello\": 1, \"topologyVersion\": {\"processId\": {\"$oid\": "
         "\"0123456789abcdef01234567\"}}, \"maxAwaitTimeMS\": 0}", 40414},
        {"{\"hello\": 1, \"topologyVersion\": {\"counter\": {\"$numberLong\": \"0\"}}, "
         "\"maxAwaitTimeMS\": 0}", 40414},
        {"{\"hello\": 1, \"topologyVersion\": {\"processId\": {\"$oid\": "
         "\"0123456789abcdef01234567\"}, \"counter\": {\"$numberLong\": \"0\"}, \"x\": 1}, "
         "\"maxAwaitTimeMS\": 0}", 40415},
        {"{\"hello\": 1, \"topologyVersion\": {\"counter\": {\"$numberLong\": \"0\"}, "
         "\"counter\": {\"$numberLong\": \"0\"}}, \"maxAwaitTimeMS\": 0}", 40413},
        {"{\"hello\": 1, \"topologyVersion\": {\"processId\": {\"$oid\": "
         "\"0123456789abcdef01234567\"}, \"counter\": {\"$numberLong\": \"-1\"}}, "
         "\"maxAwaitTimeMS\": 0}", 51758},
        {"{\"hello\": 1, \"topologyVersion\": {\"processId\": {\"$oid\": "
         "\"0123456789abcdef01234567\"}, \"counter\": {\"$numberLong\": \"0\"}}}", 31368},
        {"{\"isMaster\": 1, \"maxAwaitTimeMS\": 0}", 31368},
    };
    struct doc_await a;
    char other_pid[25];
    bson_oid_t o;

    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(run(bad[i].js), 0);
        assert_err(bad[i].code);
    }
    topology_of(cl);
    ck_assert_int_eq(counter_now, 0);
    /* maxAwaitTimeMS: an integer, not below 0 */
    ck_assert_int_eq(await_as(cl, pid_hex, 0, "\"x\""), 0);
    assert_err(DOC_TypeMismatch);
    ck_assert_int_eq(await_as(cl, pid_hex, 0, "1.5"), 0);
    assert_err(DOC_BadValue);
    ck_assert_int_eq(await_as(cl, pid_hex, 0, "-1"), 0);
    assert_err(31373);
    /* This process's counter, but one it has not given out yet. */
    ck_assert_int_eq(await_as(cl, pid_hex, 1, "0"), 0);
    assert_err(31382);

    /* The current version: it may wait, as long as the client says, up
     * to the cap; the reply says the same version. */
    ck_assert_int_eq(await_as(cl, pid_hex, 0, "2500"), DOC_CMD_AWAIT);
    assert_ok();
    ck_assert(has("isWritablePrimary"));
    ck_assert_int_eq(num("topologyVersion.counter"), 0);
    doc_client_await(cl, &a);
    ck_assert(a.current);
    ck_assert_int_eq(a.counter, 0);
    ck_assert_uint_eq(a.max_ms, 2500);
    ck_assert_int_eq(await_as(cl, pid_hex, 0, "{\"$numberLong\": \"9000000000000\"}"),
                     DOC_CMD_AWAIT);
    doc_client_await(cl, &a);
    ck_assert_uint_eq(a.max_ms, DOC_AWAIT_MAX_MS);
    /* Another process's: not current, whatever its counter. */
    bson_oid_init(&o, NULL);
    bson_oid_to_string(&o, other_pid);
    ck_assert_int_eq(await_as(cl, other_pid, 0, "10000"), DOC_CMD_AWAIT);
    doc_client_await(cl, &a);
    ck_assert(!a.current);
    ck_assert_int_eq(await_as(other, other_pid, 42, "10000"), DOC_CMD_AWAIT);
    assert_ok();
    doc_client_await(other, &a);
    ck_assert(!a.current);
    /* A plain hello after: nothing to wait for. */
    ck_assert_int_eq(run("{\"ismaster\": 1}"), 0);
}
END_TEST

/* What a replica-set member's hello says of the set, as the test sets it. */
static char set_primary[64] = "a:1";

static void test_hello(void *arg, bson_t *reply, bool primary)
{
    bson_append_utf8(reply, "setName", -1, "d0", -1);
    bson_append_utf8(reply, "primary", -1, set_primary, -1);
}

/* The counter goes up when what hello says of the member or its set
 * changes, and only then; a hello that knew the old version is no longer
 * current, and a stale one (an older counter) never is. */
START_TEST(topology_counter_follows_the_set)
{
    struct tern_rpc_ep *ep;
    struct repl_host *host;
    struct repl *r;
    struct repl_config rc = {.shard = "d0", .me = "n0", .log_bytes = 1u << 20,
                             .ops = &doc_repl_ops, .ctx = store};
    struct repl_peer peers[2] = {{.name = "n0"}, {.name = "n1"}};
    char state[128];
    struct doc_await a;
    int64_t c0, c1;

    snprintf(state, sizeof(state), "%s/d0.repl", dir);
    rc.state_path = state;
    ck_assert_int_eq(tern_rpc_open(NULL, &ep), 0);
    ck_assert_int_eq(repl_host_open(ep, &host), 0);
    ck_assert_int_eq(repl_open(host, &rc, &r), 0);
    repl_set_view(r, REPL_BACKUP, 1, "n1", peers, 2);
    doc_server_replicate(srv, r, test_hello, NULL);
    topology_of(cl);
    c0 = counter_now;
    ck_assert(!num("isWritablePrimary"));
    ck_assert_str_eq(str("primary"), "a:1");
    /* Nothing changed: the same version, however often it is asked. */
    topology_of(other);
    ck_assert_int_eq(counter_now, c0);
    ck_assert_int_eq(doc_server_topology(srv), c0);
    ck_assert_int_eq(await_as(cl, pid_hex, c0, "10000"), DOC_CMD_AWAIT);
    doc_client_await(cl, &a);
    ck_assert(a.current);
    /* Another primary: news. */
    snprintf(set_primary, sizeof(set_primary), "b:2");
    c1 = doc_server_topology(srv);
    ck_assert_int_eq(c1, c0 + 1);
    ck_assert_int_eq(doc_server_topology(srv), c1);
    ck_assert_int_eq(await_as(cl, pid_hex, c0, "10000"), DOC_CMD_AWAIT);
    assert_ok();
    ck_assert_str_eq(str("primary"), "b:2");
    ck_assert_int_eq(num("topologyVersion.counter"), c1);
    doc_client_await(cl, &a);
    ck_assert(!a.current);
    ck_assert_int_eq(a.counter, c1);
    /* This node takes office: its role is news too. */
    repl_set_view(r, REPL_PRIMARY, 2, "n0", peers, 1);
    for (int i = 0; i < 2000 && repl_writable(r) != 0; i++) {
        tern_rpc_poll(ep);
        repl_set_view(r, REPL_PRIMARY, 2, "n0", peers, 1);
        repl_tick(r);
        usleep(1000);
    }
    ck_assert_int_eq(repl_writable(r), 0);
    topology_of(cl);
    ck_assert(num("isWritablePrimary"));
    ck_assert_int_gt(counter_now, c1);
    doc_server_replicate(srv, NULL, NULL, NULL);
    repl_close(r);
    repl_host_close(host);
    tern_rpc_close(ep);
    snprintf(set_primary, sizeof(set_primary), "a:1");
}
END_TEST

START_TEST(server_commands)
{
    run("{\"ping\": 1, \"$db\": \"admin\"}");
    assert_ok();
    ck_assert_int_eq(bson_count_keys(&rep), 1);

    run("{\"buildInfo\": 1, \"$db\": \"admin\"}");
    assert_ok();
    ck_assert_str_eq(str("version"), "6.0.0");
    ck_assert_int_eq(array_len("versionArray"), 4);
    ck_assert_int_eq(type_of("versionArray.0"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("versionArray.0"), 6);
    ck_assert_int_eq(num("versionArray.1"), 0);

    run("{\"getParameter\": 1, \"featureCompatibilityVersion\": 1, \"$db\": \"admin\"}");
    assert_ok();
    ck_assert_str_eq(str("featureCompatibilityVersion.version"), "6.0");
    run("{\"getParameter\": 1, \"nosuchthing\": 1, \"$db\": \"admin\"}");
    assert_err(DOC_InvalidOptions);

    run("{\"serverStatus\": 1, \"$db\": \"admin\"}");
    assert_ok();
    ck_assert_str_eq(str("version"), "6.0.0");
    ck_assert(has("opcounters.insert"));
    ck_assert(has("connections.current"));
    ck_assert_int_eq(num("connections.current"), 2);

    run("{\"whatsmyuri\": 1}");
    assert_ok();
    ck_assert_str_eq(str("you"), "127.0.0.1:5000");
    run("{\"hostInfo\": 1}");
    assert_ok();
    ck_assert(has("system.numCores"));
    run("{\"getLog\": \"startupWarnings\"}");
    assert_ok();
    ck_assert_int_eq(array_len("log"), 0);
    run("{\"getCmdLineOpts\": 1}");
    assert_ok();
    run("{\"connectionStatus\": 1}");
    assert_ok();
    ck_assert_int_eq(array_len("authInfo.authenticatedUsers"), 0);
    ck_assert_int_eq(run("{\"endSessions\": [{\"id\": {\"$binary\": {\"base64\": \"AAAAAAAAAAAAAAAAAAAAAA==\", \"subType\": \"04\"}}}], \"$db\": \"admin\"}"), 0);
    assert_ok();

    /* a version of the operator's */
    {
        struct doc_server_opts so = {.version = "5.0.14", .max_wire_version = 13};

        reopen(0, &so);
        run("{\"buildInfo\": 1}");
        ck_assert_str_eq(str("version"), "5.0.14");
        ck_assert_int_eq(num("versionArray.0"), 5);
        ck_assert_int_eq(num("versionArray.2"), 14);
        run("{\"isMaster\": 1}");
        ck_assert_int_eq(num("maxWireVersion"), 13);
    }
}
END_TEST

START_TEST(unknown_and_malformed)
{
    struct doc_seq seq;
    uint8_t junk[16] = {0x20, 0, 0, 0, 3, 'a', 0};
    bson_t cmd, deep;
    int i;

    run("{\"atlasVersion\": 1, \"$db\": \"admin\"}");
    assert_err(DOC_CommandNotFound);
    ck_assert_str_eq(str("errmsg"), "no such command: 'atlasVersion'");
    ck_assert_str_eq(str("codeName"), "CommandNotFound");

    /* command names are case sensitive, as MongoDB's */
    run("{\"FIND\": \"c\", \"$db\": \"test\"}");
    assert_err(DOC_CommandNotFound);

    /* no $db for a command that needs one */
    run("{\"find\": \"c\"}");
    assert_err(40571);
    run("{\"find\": \"c\", \"$db\": 5}");
    assert_err(DOC_TypeMismatch);
    run("{\"find\": \"c\", \"$db\": \"\"}");
    assert_err(DOC_InvalidNamespace);
    run("{\"find\": 5, \"$db\": \"test\"}");
    assert_err(DOC_InvalidNamespace);

    /* an empty command */
    bson_init(&cmd);
    run_on_seq(cl, &cmd, NULL, 0);
    assert_err(DOC_FailedToParse);

    /* nesting past MongoDB's 200 levels */
    bson_init(&deep);
    {
        bson_t *lv[301];

        lv[0] = &deep;
        bson_append_utf8(&deep, "find", 4, "c", 1);
        bson_append_utf8(&deep, "$db", 3, "test", 4);
        for (i = 1; i <= 300; i++) {
            lv[i] = malloc(sizeof(bson_t));
            bson_append_document_begin(lv[i - 1], "filter", -1, lv[i]);
        }
        for (i = 300; i >= 1; i--) {
            bson_append_document_end(lv[i - 1], lv[i]);
            free(lv[i]);
        }
    }
    run_on_seq(cl, &deep, NULL, 0);
    assert_err(DOC_InvalidBSON);
    bson_destroy(&deep);

    /* nesting through code-with-scope documents, which bson_validate
     * walks recursively too: 100,000 levels, written out directly (level
     * k is 18 bytes around level k - 1: {c: Code("x", <level k - 1>)}) */
    {
        const uint32_t levels = 100000;
        size_t size = 5 + 18 * (size_t)levels, at = 0;
        uint8_t *buf = malloc(size);
        bson_t inner;
        uint32_t k, v;

        for (k = levels; k > 0; k--) {
            v = 5 + 18 * k;
            memcpy(buf + at, &v, 4);
            memcpy(buf + at + 4, "\x0f" "c", 3);       /* type, key "c" and its NUL */
            v = 10 + 5 + 18 * (k - 1);
            memcpy(buf + at + 7, &v, 4);
            v = 2;
            memcpy(buf + at + 11, &v, 4);
            memcpy(buf + at + 15, "x", 2);
            at += 17;
        }
        v = 5;
        memcpy(buf + at, &v, 4);
        buf[at + 4] = 0;
        at += 5;
        for (k = 0; k < levels; k++)
            buf[at++] = 0;
        ck_assert_uint_eq(at, size);
        ck_assert(bson_init_static(&inner, buf, size));
        bson_init(&deep);
        bson_append_utf8(&deep, "find", 4, "c", 1);
        bson_append_document(&deep, "filter", -1, &inner);
        bson_append_utf8(&deep, "$db", 3, "test", 4);
        run_on_seq(cl, &deep, NULL, 0);
        assert_err(DOC_InvalidBSON);
        bson_destroy(&deep);
        free(buf);
    }

    /* corruption inside an embedded document: a string's length, its
     * NUL, an element type of 0 or of no type, each refused */
    {
        static const int patch[][2] = {{-4, 100}, {3, 'X'}, {-7, 0}, {-7, 0x7e}, {-4, 0}};
        bson_t good, bad;
        const uint8_t *gp;
        uint8_t *buf;
        size_t at;
        unsigned p;

        json(&good, "{\"find\": \"c\", \"filter\": {\"a\": \"xyz\"}, \"$db\": \"test\"}");
        gp = bson_get_data(&good);
        for (at = 0; memcmp(gp + at, "xyz", 4) != 0; at++)
            ;
        buf = malloc(good.len);
        for (p = 0; p < sizeof(patch) / sizeof(patch[0]); p++) {
            memcpy(buf, gp, good.len);
            if (patch[p][0] == -4) {
                uint32_t l = (uint32_t)patch[p][1];

                memcpy(buf + at - 4, &l, 4);
            } else {
                buf[(long)at + patch[p][0]] = (uint8_t)patch[p][1];
            }
            ck_assert(bson_init_static(&bad, buf, good.len));
            run_on_seq(cl, &bad, NULL, 0);
            assert_err(DOC_InvalidBSON);
        }
        free(buf);
        run_on_seq(cl, &good, NULL, 0);
        assert_ok();
        bson_destroy(&good);
    }

    /* a sequence whose document lies about its length */
    json(&cmd, "{\"insert\": \"c\", \"$db\": \"test\"}");
    seq = (struct doc_seq){.id = "documents", .id_len = 9, .docs = junk, .len = sizeof(junk)};
    run_on_seq(cl, &cmd, &seq, 1);
    assert_err(DOC_InvalidBSON);
    seq.len = 3;
    run_on_seq(cl, &cmd, &seq, 1);
    assert_err(DOC_InvalidBSON);
    bson_destroy(&cmd);
    run("{\"count\": \"c\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 0);
}
END_TEST

START_TEST(bad_argument_types)
{
    insert_json("c", "[{\"_id\": 1}]");
    run("{\"find\": \"c\", \"filter\": \"x\", \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    ck_assert_str_eq(str("errmsg"),
                     "BSON field 'find.filter' is the wrong type 'string', expected type 'object'");
    run("{\"find\": \"c\", \"limit\": \"1\", \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"find\": \"c\", \"skip\": -1, \"$db\": \"test\"}");
    assert_err(DOC_BadValue);
    run("{\"find\": \"c\", \"batchSize\": -1, \"$db\": \"test\"}");
    assert_err(DOC_BadValue);
    run("{\"find\": \"c\", \"limit\": 1.5, \"$db\": \"test\"}");
    assert_err(DOC_BadValue);
    run("{\"find\": \"c\", \"sort\": [1], \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"find\": \"c\", \"singleBatch\": \"yes\", \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"find\": \"c\", \"filter\": {\"a\": {\"$foo\": 1}}, \"$db\": \"test\"}");
    assert_err(DOC_BadValue);
    run("{\"insert\": \"c\", \"documents\": {\"a\": 1}, \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"insert\": \"c\", \"documents\": [1], \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"insert\": \"c\", \"documents\": [], \"$db\": \"test\"}");
    assert_err(DOC_InvalidLength);
    /* a required field that is absent: MongoDB's IDL parser's 40414 */
    run("{\"insert\": \"c\", \"$db\": \"test\"}");
    assert_err(40414);
    ck_assert_str_eq(str("codeName"), "Location40414");
    ck_assert_str_eq(str("errmsg"), "BSON field 'insert.documents' is missing but a required field");
    run("{\"insert\": \"c\", \"ordered\": \"no\", \"documents\": [{}], \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"getMore\": 5, \"collection\": \"c\", \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"getMore\": {\"$numberLong\": \"5\"}, \"$db\": \"test\"}");
    assert_err(40414);
    run("{\"killCursors\": \"c\", \"cursors\": [1], \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"count\": \"c\", \"query\": 1, \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"distinct\": \"c\", \"key\": 1, \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"distinct\": \"c\", \"$db\": \"test\"}");
    assert_err(40414);
    run("{\"aggregate\": \"c\", \"pipeline\": {}, \"cursor\": {}, \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"aggregate\": \"c\", \"pipeline\": [], \"$db\": \"test\"}");
    assert_err(DOC_FailedToParse);
    run("{\"aggregate\": \"c\", \"pipeline\": [{\"$nope\": 1}], \"cursor\": {}, \"$db\": \"test\"}");
    assert_err(DOC_BadValue);
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"a\": \"text\"}, \"name\": \"t\"}], \"$db\": \"test\"}");
    assert_err(DOC_CannotCreateIndex);
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"name\": \"t\"}], \"$db\": \"test\"}");
    assert_err(DOC_FailedToParse);
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": 1, \"name\": \"t\"}], \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    /* only the simple collation: another would change what matches */
    run("{\"find\": \"c\", \"collation\": {\"locale\": \"simple\"}, \"$db\": \"test\"}");
    assert_ok();
    run("{\"find\": \"c\", \"collation\": {\"locale\": \"fr\", \"strength\": 1}, \"$db\": \"test\"}");
    assert_err(DOC_NotImplemented);
    run("{\"count\": \"c\", \"collation\": {\"locale\": \"en\"}, \"$db\": \"test\"}");
    assert_err(DOC_NotImplemented);
    run("{\"distinct\": \"c\", \"key\": \"a\", \"collation\": \"en\", \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"aggregate\": \"c\", \"pipeline\": [], \"cursor\": {}, \"collation\": {\"locale\": \"en\"}, \"$db\": \"test\"}");
    assert_err(DOC_NotImplemented);
    run("{\"findAndModify\": \"c\", \"remove\": true, \"collation\": {\"locale\": \"en\"}, \"$db\": \"test\"}");
    assert_err(DOC_NotImplemented);
    run("{\"update\": \"c\", \"updates\": [{\"q\": {}, \"u\": {\"$set\": {\"z\": 1}}, \"collation\": {\"locale\": \"en\"}}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_NotImplemented);
    run("{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0, \"collation\": {\"locale\": \"en\"}}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_NotImplemented);
    run("{\"explain\": \"find\", \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"explain\": {\"find\": \"c\"}, \"verbosity\": \"loud\", \"$db\": \"test\"}");
    assert_err(DOC_BadValue);
    /* nothing was lost */
    run("{\"count\": \"c\", \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
}
END_TEST

/* ---- insert ---- */

START_TEST(insert_ids)
{
    bson_iter_t it;
    const uint8_t *d;
    uint32_t l;
    bson_t doc;

    /* inline (Node's insertOne) and without _id: an ObjectId, first */
    insert_json("c", "[{\"x\": 1, \"y\": 2}]");
    ck_assert_int_eq(type_of("n"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("n"), 1);
    run("{\"find\": \"c\", \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1);
    ck_assert(find_path(&rep, "cursor.firstBatch.0", &it));
    bson_iter_document(&it, &l, &d);
    ck_assert(bson_init_static(&doc, d, l));
    ck_assert(bson_iter_init(&it, &doc) && bson_iter_next(&it));
    ck_assert_str_eq(bson_iter_key(&it), "_id");
    ck_assert_int_eq(bson_iter_type(&it), BSON_TYPE_OID);
    ck_assert_int_eq(bson_count_keys(&doc), 3);

    /* an _id that is not first is moved first */
    insert_json("c", "[{\"x\": 1, \"_id\": \"k\"}]");
    run("{\"find\": \"c\", \"filter\": {\"_id\": \"k\"}, \"$db\": \"test\"}");
    ck_assert(find_path(&rep, "cursor.firstBatch.0", &it));
    bson_iter_document(&it, &l, &d);
    ck_assert(bson_init_static(&doc, d, l));
    ck_assert(bson_iter_init(&it, &doc) && bson_iter_next(&it));
    ck_assert_str_eq(bson_iter_key(&it), "_id");

    /* an array _id is refused, in writeErrors */
    run("{\"insert\": \"c\", \"documents\": [{\"_id\": [1]}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 0);
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_InvalidIdField);
}
END_TEST

START_TEST(insert_ordered_unordered)
{
    const char *m;

    run("{\"insert\": \"c\", \"ordered\": true, \"documents\": [{\"_id\": 1}, {\"_id\": 1}, {\"_id\": 2}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 1);
    ck_assert_int_eq(array_len("writeErrors"), 1);
    ck_assert_int_eq(type_of("writeErrors.0.index"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("writeErrors.0.index"), 1);
    ck_assert_int_eq(type_of("writeErrors.0.code"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("writeErrors.0.code"), 11000);
    m = str("writeErrors.0.errmsg");
    ck_assert_msg(strcmp(m, "E11000 duplicate key error collection: test.c index: _id_ dup key: { _id: 1 }") == 0,
                  "%s", m);
    ck_assert_int_eq(type_of("writeErrors.0.keyPattern"), BSON_TYPE_DOCUMENT);
    ck_assert_int_eq(num("writeErrors.0.keyPattern._id"), 1);
    ck_assert_int_eq(num("writeErrors.0.keyValue._id"), 1);
    run("{\"count\": \"c\", \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);

    /* unordered goes on past each error */
    run("{\"insert\": \"d\", \"ordered\": false, \"documents\": [{\"_id\": 1}, {\"_id\": 1}, {\"_id\": 2}, {\"_id\": 2}, {\"_id\": 3}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 3);
    ck_assert_int_eq(array_len("writeErrors"), 2);
    ck_assert_int_eq(num("writeErrors.0.index"), 1);
    ck_assert_int_eq(num("writeErrors.1.index"), 3);
    ck_assert_int_eq(num("writeErrors.1.keyValue._id"), 2);
}
END_TEST

START_TEST(insert_too_large)
{
    char big[6000];
    char cmd[7000];

    reopen(4096, NULL);
    run("{\"isMaster\": 1}");
    ck_assert_int_eq(num("maxBsonObjectSize"), 4096);
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    snprintf(cmd, sizeof(cmd),
             "{\"insert\": \"c\", \"ordered\": false, \"documents\": [{\"_id\": 1, \"s\": \"%s\"}, {\"_id\": 2}], \"$db\": \"test\"}",
             big);
    run(cmd);
    assert_ok();
    ck_assert_int_eq(num("n"), 1);
    ck_assert_int_eq(num("writeErrors.0.index"), 0);
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_BSONObjectTooLarge);
    /* an update that would grow a document past the limit */
    snprintf(cmd, sizeof(cmd),
             "{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 2}, \"u\": {\"$set\": {\"s\": \"%s\"}}}], \"$db\": \"test\"}",
             big);
    run(cmd);
    assert_ok();
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_BSONObjectTooLarge);
    run("{\"find\": \"c\", \"filter\": {\"_id\": 2}, \"$db\": \"test\"}");
    ck_assert(!has("cursor.firstBatch.0.s"));
}
END_TEST

/* ---- find and cursors ---- */

START_TEST(find_shapes)
{
    insert_json("c", "[{\"_id\": 1, \"a\": 3, \"b\": \"x\"}, {\"_id\": 2, \"a\": 1, \"b\": \"y\"}, {\"_id\": 3, \"a\": 2, \"b\": \"z\"}, {\"_id\": 4, \"a\": 5}]");
    run("{\"find\": \"c\", \"filter\": {\"a\": {\"$gte\": 2}}, \"sort\": {\"a\": -1}, \"projection\": {\"b\": 0}, \"$db\": \"test\", \"lsid\": {\"id\": 1}, \"$readPreference\": {\"mode\": \"primaryPreferred\"}}");
    assert_ok();
    ck_assert_int_eq(cursor_id(), 0);
    ck_assert_str_eq(str("cursor.ns"), "test.c");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 3);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 4);
    ck_assert_int_eq(num("cursor.firstBatch.1._id"), 1);
    ck_assert_int_eq(num("cursor.firstBatch.2._id"), 3);
    ck_assert(!has("cursor.firstBatch.1.b"));

    run("{\"find\": \"c\", \"sort\": {\"a\": 1}, \"skip\": 1, \"limit\": 2, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 2);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 3);
    ck_assert_int_eq(num("cursor.firstBatch.1._id"), 1);
    ck_assert_int_eq(cursor_id(), 0);

    /* {$natural: -1}: the scan's order, backwards */
    run("{\"find\": \"c\", \"sort\": {\"$natural\": -1}, \"batchSize\": 2, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("cursor.firstBatch"), 2);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 4);
    ck_assert_int_eq(num("cursor.firstBatch.1._id"), 3);
    run("{\"find\": \"c\", \"sort\": {\"$natural\": 1}, \"limit\": 1, \"$db\": \"test\"}");
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 1);

    /* find_one: limit 1, singleBatch */
    run("{\"find\": \"c\", \"filter\": {\"b\": \"y\"}, \"limit\": 1, \"singleBatch\": true, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 2);
    ck_assert_int_eq(cursor_id(), 0);

    /* a negative limit: that many, one batch, no cursor */
    run("{\"find\": \"c\", \"sort\": {\"_id\": 1}, \"limit\": -2, \"batchSize\": 1, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1);
    ck_assert_int_eq(cursor_id(), 0);
    run("{\"find\": \"c\", \"sort\": {\"_id\": 1}, \"limit\": -2, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 2);
    ck_assert_int_eq(cursor_id(), 0);

    /* a collection that is not there: an empty batch */
    run("{\"find\": \"nothere\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("cursor.firstBatch"), 0);
    ck_assert_int_eq(cursor_id(), 0);
    ck_assert_str_eq(str("cursor.ns"), "test.nothere");

    /* batchSize 0: an empty first batch, then the rest */
    run("{\"find\": \"c\", \"batchSize\": 0, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 0);
    ck_assert_int_ne(cursor_id(), 0);
    {
        char cmd[256];

        snprintf(cmd, sizeof(cmd),
                 "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"c\", \"$db\": \"test\"}",
                 (long long)cursor_id());
        run(cmd);
        assert_ok();
        ck_assert_int_eq(array_len("cursor.nextBatch"), 4);
    }
}
END_TEST

/* Iterate a cursor to its end as a driver does: the documents seen. */
static int drain(struct doc_client *c, const char *coll, int64_t id, int batch, int *batches)
{
    char cmd[256];
    int n = 0;

    while (id != 0) {
        snprintf(cmd, sizeof(cmd),
                 batch ? "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"%s\", \"batchSize\": %d, \"$db\": \"test\"}"
                       : "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"%s\", \"$db\": \"test\"}",
                 (long long)id, coll, batch);
        run_as(c, cmd);
        assert_ok();
        ck_assert_str_eq(str("cursor.ns"), "test.big");
        ck_assert_int_eq(type_of("cursor.nextBatch"), BSON_TYPE_ARRAY);
        n += (int)array_len("cursor.nextBatch");
        ck_assert_int_le(++*batches, 20000);
        id = cursor_id();
    }
    return n;
}

START_TEST(cursor_10000)
{
    int64_t id;
    int n, batches = 0;

    insert_many("big", 10000, 20);
    run("{\"find\": \"big\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("cursor.firstBatch"), 101);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 0);
    id = cursor_id();
    ck_assert_int_gt(id, 0);
    n = 101 + drain(cl, "big", id, 0, &batches);
    ck_assert_int_eq(n, 10000);

    /* the same through a sort no index gives, in batches of 1000 */
    run("{\"find\": \"big\", \"sort\": {\"a\": -1, \"_id\": 1}, \"batchSize\": 1000, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1000);
    ck_assert_int_eq(num("cursor.firstBatch.0.a"), 9);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 9);
    ck_assert_int_eq(num("cursor.firstBatch.1._id"), 19);
    batches = 0;
    n = 1000 + drain(cl, "big", cursor_id(), 1000, &batches);
    ck_assert_int_eq(n, 10000);
    ck_assert_int_le(batches, 10);

    /* with a filter and a limit across batches */
    run("{\"find\": \"big\", \"filter\": {\"a\": 3}, \"limit\": 250, \"batchSize\": 100, \"$db\": \"test\"}");
    batches = 0;
    n = (int)array_len("cursor.firstBatch") + drain(cl, "big", cursor_id(), 100, &batches);
    ck_assert_int_eq(n, 250);

    /* aggregate's cursor too */
    run("{\"aggregate\": \"big\", \"pipeline\": [{\"$match\": {\"a\": {\"$lt\": 5}}}], \"cursor\": {\"batchSize\": 7}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 7);
    batches = 0;
    n = 7 + drain(cl, "big", cursor_id(), 0, &batches);
    ck_assert_int_eq(n, 5000);
}
END_TEST

START_TEST(batches_cut_by_bytes)
{
    struct doc_server_opts so = {.max_batch_bytes = 2000};
    int64_t id;
    int n, batches = 0;
    bson_iter_t it;

    reopen(0, &so);
    insert_many("big", 300, 100);     /* about 130 bytes each */
    run("{\"find\": \"big\", \"batchSize\": 1000, \"$db\": \"test\"}");
    n = (int)array_len("cursor.firstBatch");
    ck_assert_int_gt(n, 0);
    ck_assert(find_path(&rep, "cursor.firstBatch", &it));
    ck_assert_int_le(bson_iter_value(&it)->value.v_doc.data_len, 2000 + 200);
    ck_assert_int_lt(n, 20);
    id = cursor_id();
    n += drain(cl, "big", id, 1000, &batches);
    ck_assert_int_eq(n, 300);
    ck_assert_int_ge(batches, 300 / 16);
}
END_TEST

START_TEST(cursors_of_clients)
{
    char cmd[256];
    int64_t id;

    insert_many("big", 500, 0);
    run("{\"find\": \"big\", \"batchSize\": 10, \"$db\": \"test\"}");
    id = cursor_id();
    ck_assert_int_ne(id, 0);

    /* another client cannot see it */
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"$db\": \"test\"}",
             (long long)id);
    run_as(other, cmd);
    assert_err(DOC_CursorNotFound);
    ck_assert_int_eq(type_of("code"), BSON_TYPE_INT32);
    snprintf(cmd, sizeof(cmd),
             "{\"killCursors\": \"big\", \"cursors\": [{\"$numberLong\": \"%lld\"}], \"$db\": \"test\"}",
             (long long)id);
    run_as(other, cmd);
    assert_ok();
    ck_assert_int_eq(array_len("cursorsKilled"), 0);
    ck_assert_int_eq(array_len("cursorsNotFound"), 1);

    /* a getMore on another namespace */
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"other\", \"$db\": \"test\"}",
             (long long)id);
    run(cmd);
    assert_err(DOC_Unauthorized);

    /* its owner goes on, then kills it */
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"batchSize\": 5, \"$db\": \"test\"}",
             (long long)id);
    run(cmd);
    assert_ok();
    ck_assert_int_eq(array_len("cursor.nextBatch"), 5);
    ck_assert_int_eq(num("cursor.nextBatch.0._id"), 10);
    ck_assert_int_eq(cursor_id(), id);
    snprintf(cmd, sizeof(cmd),
             "{\"killCursors\": \"big\", \"cursors\": [{\"$numberLong\": \"%lld\"}, {\"$numberLong\": \"12345\"}], \"$db\": \"test\"}",
             (long long)id);
    run(cmd);
    assert_ok();
    ck_assert_int_eq(array_len("cursorsKilled"), 1);
    ck_assert_int_eq(type_of("cursorsKilled.0"), BSON_TYPE_INT64);
    ck_assert_int_eq(num("cursorsKilled.0"), id);
    ck_assert_int_eq(array_len("cursorsNotFound"), 1);
    ck_assert_int_eq(array_len("cursorsAlive"), 0);
    ck_assert_int_eq(array_len("cursorsUnknown"), 0);
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"$db\": \"test\"}",
             (long long)id);
    run(cmd);
    assert_err(DOC_CursorNotFound);

    /* freeing a client closes its cursors */
    run_as(other, "{\"find\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}");
    {
        struct doc_server_stats st;

        doc_server_stats(srv, &st);
        ck_assert_uint_eq(st.cursors_open, 1);
        doc_client_free(other);
        doc_server_stats(srv, &st);
        ck_assert_uint_eq(st.cursors_open, 0);
        other = doc_client_new(srv, "x");
    }
}
END_TEST

START_TEST(cursor_limits_and_idle)
{
    struct doc_server_opts so = {.max_cursors = 2, .max_cursors_total = 3, .cursor_idle_ms = 1000};
    struct doc_server_stats st;
    int64_t ids[3];
    char cmd[256];
    int i;

    reopen(0, &so);
    insert_many("big", 50, 0);
    for (i = 0; i < 3; i++) {
        run("{\"find\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}");
        ids[i] = cursor_id();
    }
    /* the client's oldest made room */
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}",
             (long long)ids[0]);
    run(cmd);
    assert_err(DOC_CursorNotFound);
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}",
             (long long)ids[1]);
    run(cmd);
    assert_ok();
    /* the server's total: another client's new cursors push out the oldest */
    run_as(other, "{\"find\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}");
    run_as(other, "{\"find\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}");
    doc_server_stats(srv, &st);
    ck_assert_uint_eq(st.cursors_open, 3);

    /* idle timeout, measured from the ticks */
    reopen(0, &so);
    insert_many("big", 50, 0);
    doc_server_tick(srv, 5000);
    run("{\"find\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}");
    ids[0] = cursor_id();
    run("{\"find\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}");
    ids[1] = cursor_id();
    doc_server_tick(srv, 5800);
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}",
             (long long)ids[1]);
    run(cmd);                           /* used at 5800 */
    assert_ok();
    doc_server_tick(srv, 6001);         /* ids[0] idle 1001 ms */
    doc_server_stats(srv, &st);
    ck_assert_uint_eq(st.cursors_open, 1);
    ck_assert_uint_eq(st.cursors_timed_out, 1);
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"batchSize\": 1, \"$db\": \"test\"}",
             (long long)ids[0]);
    run(cmd);
    assert_err(DOC_CursorNotFound);
    doc_server_tick(srv, 6800);
    doc_server_stats(srv, &st);
    ck_assert_uint_eq(st.cursors_open, 1);
    doc_server_tick(srv, 6801);
    doc_server_stats(srv, &st);
    ck_assert_uint_eq(st.cursors_open, 0);
}
END_TEST

/* ---- update, delete, findAndModify ---- */

START_TEST(update_shapes)
{
    insert_json("c", "[{\"_id\": 1, \"a\": 1}, {\"_id\": 2, \"a\": 1}, {\"_id\": 3, \"a\": 2}]");
    /* update_many */
    ck_assert_int_eq(run("{\"update\": \"c\", \"ordered\": true, \"updates\": [{\"q\": {\"a\": 1}, \"u\": {\"$set\": {\"b\": 5}}, \"multi\": true, \"upsert\": false}], \"$db\": \"test\"}"),
                     DOC_CMD_WROTE);
    assert_ok();
    ck_assert_int_eq(type_of("n"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("n"), 2);
    ck_assert_int_eq(type_of("nModified"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("nModified"), 2);
    ck_assert(!has("upserted"));
    /* matched but unchanged */
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$set\": {\"b\": 5}}}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
    ck_assert_int_eq(num("nModified"), 0);
    /* update_one touches one */
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"a\": 1}, \"u\": {\"$inc\": {\"b\": 1}}}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
    ck_assert_int_eq(num("nModified"), 1);
    run("{\"count\": \"c\", \"query\": {\"b\": 6}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
    /* replace_one keeps the _id */
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 3}, \"u\": {\"z\": 1}}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("nModified"), 1);
    run("{\"find\": \"c\", \"filter\": {\"z\": 1}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 3);
    ck_assert(!has("cursor.firstBatch.0.a"));
    /* changing _id */
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 3}, \"u\": {\"_id\": 4, \"z\": 1}}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_ImmutableField);
    /* upserts: the query's equalities and the update; Node omits false flags */
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 10}, \"u\": {\"$set\": {\"v\": 1}}, \"upsert\": true}, {\"q\": {\"k\": \"x\"}, \"u\": {\"$set\": {\"v\": 2}}, \"upsert\": true}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 2);
    ck_assert_int_eq(num("nModified"), 0);
    ck_assert_int_eq(array_len("upserted"), 2);
    ck_assert_int_eq(type_of("upserted.0.index"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("upserted.0.index"), 0);
    ck_assert_int_eq(num("upserted.0._id"), 10);
    ck_assert_int_eq(num("upserted.1.index"), 1);
    ck_assert_int_eq(type_of("upserted.1._id"), BSON_TYPE_OID);
    run("{\"find\": \"c\", \"filter\": {\"k\": \"x\"}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("cursor.firstBatch.0.v"), 2);
    /* a replacement upsert */
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 11}, \"u\": {\"r\": 1}, \"upsert\": true}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("upserted.0._id"), 11);
    /* an upsert into a collection that is not there yet */
    run("{\"update\": \"fresh\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$set\": {\"a\": 1}}, \"upsert\": true}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
    run("{\"count\": \"fresh\", \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
}
END_TEST

START_TEST(update_errors)
{
    insert_json("c", "[{\"_id\": 1, \"a\": \"s\"}, {\"_id\": 2, \"a\": 1}]");
    /* ordered: the first error stops the batch */
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$inc\": {\"a\": 1}}}, {\"q\": {\"_id\": 2}, \"u\": {\"$inc\": {\"a\": 1}}}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 0);
    ck_assert_int_eq(array_len("writeErrors"), 1);
    ck_assert_int_eq(num("writeErrors.0.index"), 0);
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_TypeMismatch);
    /* unordered goes on */
    run("{\"update\": \"c\", \"ordered\": false, \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$inc\": {\"a\": 1}}}, {\"q\": {\"_id\": 2}, \"u\": {\"$inc\": {\"a\": 1}}}, {\"q\": {}, \"u\": {\"$bogus\": {\"a\": 1}}}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
    ck_assert_int_eq(num("nModified"), 1);
    ck_assert_int_eq(array_len("writeErrors"), 2);
    ck_assert_int_eq(num("writeErrors.1.index"), 2);
    ck_assert_int_eq(num("writeErrors.1.code"), DOC_BadValue);
    /* statements without q or u, of wrong types, a multi replacement */
    run("{\"update\": \"c\", \"ordered\": false, \"updates\": [{\"u\": {\"$set\": {\"a\": 1}}}, {\"q\": 1, \"u\": {}}, {\"q\": {}, \"u\": {\"x\": 1}, \"multi\": true}, {\"q\": {}, \"u\": [{\"$set\": {\"a\": 1}}]}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("writeErrors"), 4);
    ck_assert_int_eq(num("writeErrors.0.code"), 40414);
    ck_assert_int_eq(num("writeErrors.1.code"), DOC_TypeMismatch);
    ck_assert_int_eq(num("writeErrors.2.code"), DOC_FailedToParse);
    ck_assert_int_eq(num("writeErrors.3.code"), DOC_NotImplemented);
    run("{\"update\": \"c\", \"updates\": [1], \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    /* a unique index refuses an update: 11000 with its key */
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"a\": 1}, \"name\": \"a_1\", \"unique\": true}], \"$db\": \"test\"}");
    assert_ok();
    run("{\"update\": \"c\", \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$set\": {\"a\": 2}}}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("writeErrors.0.code"), 11000);
    ck_assert_int_eq(num("writeErrors.0.keyPattern.a"), 1);
    ck_assert_int_eq(num("writeErrors.0.keyValue.a"), 2);
}
END_TEST

/* A multi update over an index whose key it moves ahead of the scan
 * updates each document once (FerretDB #4553's failure mode). */
START_TEST(update_multi_one_pass)
{
    insert_many("big", 1000, 0);
    run("{\"createIndexes\": \"big\", \"indexes\": [{\"key\": {\"a\": 1}, \"name\": \"a_1\"}], \"$db\": \"test\"}");
    assert_ok();
    run("{\"update\": \"big\", \"updates\": [{\"q\": {\"a\": {\"$gte\": 0}}, \"u\": {\"$inc\": {\"a\": 100}}, \"multi\": true}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 1000);
    ck_assert_int_eq(num("nModified"), 1000);
    run("{\"count\": \"big\", \"query\": {\"a\": {\"$gte\": 100, \"$lt\": 110}}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1000);
    run("{\"delete\": \"big\", \"deletes\": [{\"q\": {\"a\": {\"$gte\": 105}}, \"limit\": 0}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 500);

    /* a multikey index reaches a document once per element: still one
     * update each */
    insert_json("m", "[{\"_id\": 1, \"t\": [1, 2, 3]}, {\"_id\": 2, \"t\": [2]}]");
    run("{\"createIndexes\": \"m\", \"indexes\": [{\"key\": {\"t\": 1}, \"name\": \"t_1\"}], \"$db\": \"test\"}");
    assert_ok();
    run("{\"update\": \"m\", \"updates\": [{\"q\": {\"t\": {\"$in\": [1, 2, 3]}}, \"u\": {\"$inc\": {\"n\": 1}}, \"multi\": true}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 2);
    ck_assert_int_eq(num("nModified"), 2);
    run("{\"find\": \"m\", \"filter\": {\"t\": {\"$gte\": 1}}, \"sort\": {\"_id\": 1}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 2);
    ck_assert_int_eq(num("cursor.firstBatch.0.n"), 1);
    run("{\"delete\": \"m\", \"deletes\": [{\"q\": {\"t\": {\"$in\": [1, 2, 3]}}, \"limit\": 0}], \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 2);
}
END_TEST

START_TEST(delete_shapes)
{
    struct doc_seq seq;
    struct doc_buf b = {0};
    bson_t cmd, d;

    insert_json("c", "[{\"_id\": 1, \"a\": 1}, {\"_id\": 2, \"a\": 1}, {\"_id\": 3, \"a\": 2}, {\"_id\": 4, \"a\": 2}]");
    ck_assert_int_eq(run("{\"delete\": \"c\", \"deletes\": [{\"q\": {\"a\": 1}, \"limit\": 1}], \"$db\": \"test\"}"),
                     DOC_CMD_WROTE);
    assert_ok();
    ck_assert_int_eq(type_of("n"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("n"), 1);
    /* pymongo's kind-1 "deletes" */
    json(&d, "{\"q\": {\"a\": 2}, \"limit\": 0}");
    doc_buf_add(&b, bson_get_data(&d), d.len);
    seq = (struct doc_seq){.id = "deletes", .id_len = 7, .docs = b.p, .len = b.len};
    json(&cmd, "{\"delete\": \"c\", \"ordered\": true, \"$db\": \"test\"}");
    run_on_seq(cl, &cmd, &seq, 1);
    assert_ok();
    ck_assert_int_eq(num("n"), 2);
    /* both ways at once is refused */
    bson_destroy(&cmd);
    json(&cmd, "{\"delete\": \"c\", \"deletes\": [{\"q\": {}, \"limit\": 0}], \"$db\": \"test\"}");
    run_on_seq(cl, &cmd, &seq, 1);
    assert_err(DOC_BadValue);
    run("{\"count\": \"c\", \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
    bson_destroy(&cmd);
    bson_destroy(&d);
    doc_buf_free(&b);
    /* limit 2, no limit, in writeErrors */
    run("{\"delete\": \"c\", \"ordered\": false, \"deletes\": [{\"q\": {}, \"limit\": 2}, {\"q\": {}}, {\"q\": {}, \"limit\": 0}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 1);
    ck_assert_int_eq(array_len("writeErrors"), 2);
    ck_assert_int_eq(num("writeErrors.0.code"), DOC_BadValue);
    ck_assert_int_eq(num("writeErrors.1.code"), 40414);
    /* a collection that is not there */
    run("{\"delete\": \"none\", \"deletes\": [{\"q\": {}, \"limit\": 0}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 0);
}
END_TEST

START_TEST(find_and_modify_shapes)
{
    insert_json("c", "[{\"_id\": 1, \"a\": 5, \"b\": 1}, {\"_id\": 2, \"a\": 3, \"b\": 1}]");
    /* find_one_and_update, the old document, lowest a first */
    run("{\"findAndModify\": \"c\", \"query\": {\"b\": 1}, \"sort\": {\"a\": 1}, \"update\": {\"$inc\": {\"a\": 10}}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(type_of("lastErrorObject"), BSON_TYPE_DOCUMENT);
    ck_assert_int_eq(num("lastErrorObject.n"), 1);
    ck_assert_int_eq(type_of("lastErrorObject.updatedExisting"), BSON_TYPE_BOOL);
    ck_assert(num("lastErrorObject.updatedExisting"));
    ck_assert_int_eq(num("value._id"), 2);
    ck_assert_int_eq(num("value.a"), 3);
    /* new: true, fields */
    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 1}, \"update\": {\"$set\": {\"c\": 1}}, \"new\": true, \"fields\": {\"c\": 1}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("value.c"), 1);
    ck_assert(!has("value.a"));
    /* nothing matched */
    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 9}, \"update\": {\"$set\": {\"c\": 1}}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("lastErrorObject.n"), 0);
    ck_assert(!num("lastErrorObject.updatedExisting"));
    ck_assert_int_eq(type_of("value"), BSON_TYPE_NULL);
    /* upsert */
    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 9}, \"update\": {\"$set\": {\"c\": 2}}, \"upsert\": true, \"new\": true, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("lastErrorObject.n"), 1);
    ck_assert(!num("lastErrorObject.updatedExisting"));
    ck_assert_int_eq(num("lastErrorObject.upserted"), 9);
    ck_assert_int_eq(num("value.c"), 2);
    /* remove, highest a first */
    run("{\"findandmodify\": \"c\", \"query\": {}, \"sort\": {\"a\": -1}, \"remove\": true, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("value._id"), 2);
    ck_assert_int_eq(num("value.a"), 13);
    run("{\"count\": \"c\", \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 2);
    /* the argument errors of the manual's page */
    run("{\"findAndModify\": \"c\", \"query\": {}, \"$db\": \"test\"}");
    assert_err(DOC_FailedToParse);
    run("{\"findAndModify\": \"c\", \"remove\": true, \"update\": {}, \"$db\": \"test\"}");
    assert_err(DOC_FailedToParse);
    run("{\"findAndModify\": \"c\", \"remove\": true, \"new\": true, \"$db\": \"test\"}");
    assert_err(DOC_FailedToParse);
    run("{\"findAndModify\": \"c\", \"query\": 1, \"remove\": true, \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    /* a duplicate key is a command error, 11000 (pymongo's DuplicateKeyError) */
    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 1}, \"update\": {\"_id\": 1, \"x\": 1}, \"$db\": \"test\"}");
    assert_ok();
    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 77}, \"update\": {\"$set\": {\"_id\": 1}}, \"upsert\": true, \"$db\": \"test\"}");
    ck_assert(num("ok") == 0);
}
END_TEST

/* ---- count, distinct, aggregate ---- */

START_TEST(count_distinct)
{
    insert_json("c", "[{\"_id\": 1, \"a\": [1, 2], \"b\": {\"c\": \"x\"}}, {\"_id\": 2, \"a\": 2, \"b\": {\"c\": \"y\"}}, {\"_id\": 3, \"a\": [3, [4]], \"b\": [{\"c\": \"x\"}, {\"c\": \"z\"}]}, {\"_id\": 4, \"a\": 1.0}, {\"_id\": 5}]");
    run("{\"count\": \"c\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 5);
    run("{\"count\": \"c\", \"query\": {\"a\": 2}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 2);
    run("{\"count\": \"c\", \"query\": {}, \"skip\": 1, \"limit\": 3, \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 3);
    run("{\"count\": \"c\", \"skip\": 4, \"limit\": 3, \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 1);
    run("{\"count\": \"c\", \"skip\": 10, \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 0);
    run("{\"count\": \"none\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 0);

    /* arrays unwound one level, 1 and 1.0 one value, in BSON order */
    run("{\"distinct\": \"c\", \"key\": \"a\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("values"), 4);
    ck_assert_int_eq(num("values.0"), 1);
    ck_assert_int_eq(num("values.1"), 2);
    ck_assert_int_eq(num("values.2"), 3);
    ck_assert_int_eq(type_of("values.3"), BSON_TYPE_ARRAY);
    run("{\"distinct\": \"c\", \"key\": \"b.c\", \"query\": {\"_id\": {\"$gte\": 2}}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("values"), 3);
    ck_assert_str_eq(str("values.0"), "x");
    ck_assert_str_eq(str("values.2"), "z");
    run("{\"distinct\": \"none\", \"key\": \"a\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("values"), 0);
}
END_TEST

START_TEST(aggregate_shapes)
{
    insert_many("big", 100, 0);
    /* pymongo's count_documents */
    run("{\"aggregate\": \"big\", \"pipeline\": [{\"$match\": {\"a\": {\"$lt\": 3}}}, {\"$skip\": 5}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}], \"cursor\": {}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 1);
    ck_assert_int_eq(num("cursor.firstBatch.0.n"), 25);
    ck_assert_int_eq(cursor_id(), 0);
    ck_assert_str_eq(str("cursor.ns"), "test.big");
    /* nothing matched: an empty batch, which pymongo reads as 0 */
    run("{\"aggregate\": \"big\", \"pipeline\": [{\"$match\": {\"a\": 99}}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}], \"cursor\": {}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 0);
    /* a $group by key, sorted */
    run("{\"aggregate\": \"big\", \"pipeline\": [{\"$group\": {\"_id\": \"$a\", \"n\": {\"$sum\": 1}}}, {\"$sort\": {\"_id\": -1}}], \"cursor\": {}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 10);
    ck_assert_int_eq(num("cursor.firstBatch.0._id"), 9);
    ck_assert_int_eq(num("cursor.firstBatch.0.n"), 10);
    /* a leading $sort an index gives */
    run("{\"createIndexes\": \"big\", \"indexes\": [{\"key\": {\"a\": 1}, \"name\": \"a_1\"}], \"$db\": \"test\"}");
    run("{\"aggregate\": \"big\", \"pipeline\": [{\"$match\": {\"a\": {\"$gte\": 8}}}, {\"$sort\": {\"a\": -1}}, {\"$limit\": 3}], \"cursor\": {}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 3);
    ck_assert_int_eq(num("cursor.firstBatch.0.a"), 9);
    ck_assert_int_eq(num("cursor.firstBatch.2.a"), 9);
    /* mongosh's probe of a collection that is not there */
    run("{\"aggregate\": \"atlascli\", \"pipeline\": [{\"$match\": {\"managedClusterType\": \"atlasCliLocalDevCluster\"}}, {\"$group\": {\"_id\": 1, \"n\": {\"$sum\": 1}}}], \"cursor\": {}, \"$db\": \"admin\"}");
    assert_ok();
    ck_assert_int_eq(array_len("cursor.firstBatch"), 0);
    /* explain */
    run("{\"aggregate\": \"big\", \"pipeline\": [{\"$match\": {\"a\": 3}}], \"explain\": true, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_str_eq(str("queryPlanner.winningPlan.stage"), "IXSCAN");
    ck_assert_str_eq(str("queryPlanner.winningPlan.indexName"), "a_1");
}
END_TEST

/* ---- indexes and namespaces ---- */

START_TEST(index_commands)
{
    insert_json("c", "[{\"_id\": 1, \"k\": 1}, {\"_id\": 2, \"k\": 2}]");
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", \"unique\": true}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(type_of("numIndexesBefore"), BSON_TYPE_INT32);
    ck_assert_int_eq(num("numIndexesBefore"), 1);
    ck_assert_int_eq(num("numIndexesAfter"), 2);
    ck_assert_int_eq(type_of("createdCollectionAutomatically"), BSON_TYPE_BOOL);
    ck_assert(!num("createdCollectionAutomatically"));
    /* again: nothing new */
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", \"unique\": true}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("numIndexesAfter"), 2);
    ck_assert(has("note"));
    /* same name, other key */
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"j\": 1}, \"name\": \"k_1\"}], \"$db\": \"test\"}");
    ck_assert(num("ok") == 0);
    /* the unique index at work */
    run("{\"insert\": \"c\", \"documents\": [{\"_id\": 3, \"k\": 2}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("writeErrors.0.code"), 11000);
    ck_assert_msg(strstr(str("writeErrors.0.errmsg"), "index: k_1 dup key: { k: 2 }"), "%s",
                  str("writeErrors.0.errmsg"));
    ck_assert_int_eq(num("writeErrors.0.keyPattern.k"), 1);
    ck_assert_int_eq(num("writeErrors.0.keyValue.k"), 2);
    /* a unique index over duplicates is refused */
    /* (each with a k of its own: a unique index holds one missing k, as null) */
    insert_json("c", "[{\"_id\": 4, \"k\": 4, \"j\": 1}, {\"_id\": 5, \"k\": 5, \"j\": 1}]");
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"j\": 1}, \"name\": \"j_1\", \"unique\": true}], \"$db\": \"test\"}");
    assert_err(DOC_DuplicateKey);
    /* a new collection */
    run("{\"createIndexes\": \"n\", \"indexes\": [{\"key\": {\"a\": 1, \"b\": -1}, \"name\": \"a_1_b_-1\"}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert(num("createdCollectionAutomatically"));

    run("{\"listIndexes\": \"c\", \"cursor\": {}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("cursor.firstBatch"), 2);
    ck_assert_str_eq(str("cursor.firstBatch.0.name"), "_id_");
    ck_assert_int_eq(num("cursor.firstBatch.0.v"), 2);
    ck_assert_str_eq(str("cursor.firstBatch.1.name"), "k_1");
    ck_assert(num("cursor.firstBatch.1.unique"));
    ck_assert_str_eq(str("cursor.ns"), "test.c");
    run("{\"listIndexes\": \"none\", \"cursor\": {}, \"$db\": \"test\"}");
    assert_err(DOC_NamespaceNotFound);

    run("{\"dropIndexes\": \"n\", \"index\": {\"a\": 1, \"b\": -1}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("nIndexesWas"), 2);
    run("{\"dropIndexes\": \"c\", \"index\": \"nope\", \"$db\": \"test\"}");
    assert_err(DOC_IndexNotFound);
    run("{\"dropIndexes\": \"c\", \"index\": \"_id_\", \"$db\": \"test\"}");
    ck_assert(num("ok") == 0);
    run("{\"dropIndexes\": \"c\", \"index\": \"*\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("nIndexesWas"), 2);
    run("{\"listIndexes\": \"c\", \"cursor\": {}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1);
    run("{\"dropIndexes\": \"none\", \"index\": \"*\", \"$db\": \"test\"}");
    assert_err(DOC_NamespaceNotFound);
}
END_TEST

START_TEST(namespace_commands)
{
    insert_json("c1", "[{\"_id\": 1}]");
    ck_assert_int_eq(run("{\"create\": \"c2\", \"$db\": \"test\"}"), DOC_CMD_WROTE);
    assert_ok();
    run("{\"create\": \"c2\", \"$db\": \"test\"}");
    assert_err(DOC_NamespaceExists);
    run("{\"create\": \"c3\", \"capped\": true, \"size\": 100, \"$db\": \"test\"}");
    assert_err(DOC_NotImplemented);
    run("{\"insert\": \"x\", \"documents\": [{}], \"$db\": \"other\"}");

    /* pymongo's list_collection_names */
    run("{\"listCollections\": 1, \"cursor\": {}, \"nameOnly\": true, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_str_eq(str("cursor.ns"), "test.$cmd.listCollections");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 2);
    ck_assert_str_eq(str("cursor.firstBatch.0.name"), "c1");
    ck_assert_str_eq(str("cursor.firstBatch.0.type"), "collection");
    ck_assert(!has("cursor.firstBatch.0.options"));
    run("{\"listCollections\": 1, \"filter\": {\"name\": \"c2\"}, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1);
    ck_assert_str_eq(str("cursor.firstBatch.0.name"), "c2");
    ck_assert_int_eq(type_of("cursor.firstBatch.0.options"), BSON_TYPE_DOCUMENT);
    ck_assert_str_eq(str("cursor.firstBatch.0.idIndex.name"), "_id_");
    run("{\"listCollections\": 1, \"filter\": {\"name\": {\"$regex\": \"^(?!system\\\\.)\"}}, \"nameOnly\": true, \"$db\": \"test\"}");
    ck_assert_int_eq(array_len("cursor.firstBatch"), 2);

    run("{\"listDatabases\": 1, \"$db\": \"admin\"}");
    assert_ok();
    ck_assert_int_eq(array_len("databases"), 2);
    ck_assert_str_eq(str("databases.0.name"), "other");
    ck_assert_str_eq(str("databases.1.name"), "test");
    ck_assert_int_eq(type_of("databases.1.sizeOnDisk"), BSON_TYPE_INT64);
    ck_assert_int_eq(type_of("databases.1.empty"), BSON_TYPE_BOOL);
    ck_assert_int_eq(type_of("totalSize"), BSON_TYPE_INT64);
    run("{\"listDatabases\": 1, \"nameOnly\": true, \"$db\": \"admin\"}");
    ck_assert(!has("databases.0.sizeOnDisk"));
    run("{\"listDatabases\": 1, \"filter\": {\"name\": \"test\"}, \"$db\": \"admin\"}");
    ck_assert_int_eq(array_len("databases"), 1);

    run("{\"collStats\": \"c1\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_str_eq(str("ns"), "test.c1");
    ck_assert_int_eq(num("count"), 1);
    ck_assert_int_gt(num("size"), 0);
    ck_assert_int_eq(num("nindexes"), 1);
    run("{\"collStats\": \"none\", \"$db\": \"test\"}");
    assert_err(DOC_NamespaceNotFound);
    /* mongosh's db.c1.stats(): $collStats, then the rest of the pipeline */
    run("{\"aggregate\": \"c1\", \"pipeline\": [{\"$collStats\": {\"storageStats\": {}, \"count\": {}}}], \"cursor\": {}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("cursor.firstBatch"), 1);
    ck_assert_str_eq(str("cursor.firstBatch.0.ns"), "test.c1");
    ck_assert_int_eq(num("cursor.firstBatch.0.storageStats.count"), 1);
    ck_assert_int_eq(num("cursor.firstBatch.0.storageStats.nindexes"), 1);
    ck_assert_int_eq(num("cursor.firstBatch.0.count.count"), 1);
    run("{\"aggregate\": \"c1\", \"pipeline\": [{\"$collStats\": {\"storageStats\": {}}}, {\"$project\": {\"n\": \"$storageStats.count\"}}], \"cursor\": {}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("cursor.firstBatch.0.n"), 1);
    ck_assert(!has("cursor.firstBatch.0.ns"));
    run("{\"aggregate\": \"none\", \"pipeline\": [{\"$collStats\": {\"storageStats\": {}}}], \"cursor\": {}, \"$db\": \"test\"}");
    assert_err(DOC_NamespaceNotFound);
    run("{\"aggregate\": 1, \"pipeline\": [{\"$collStats\": {}}], \"cursor\": {}, \"$db\": \"test\"}");
    assert_err(DOC_BadValue);
    run("{\"dbStats\": 1, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("collections"), 2);
    ck_assert_int_eq(num("objects"), 1);
    ck_assert_int_eq(num("indexes"), 2);

    /* drop: pymongo tolerates code 26 */
    ck_assert_int_eq(run("{\"drop\": \"c1\", \"$db\": \"test\"}"), DOC_CMD_WROTE);
    assert_ok();
    ck_assert_int_eq(num("nIndexesWas"), 1);
    ck_assert_str_eq(str("ns"), "test.c1");
    run("{\"drop\": \"c1\", \"$db\": \"test\"}");
    assert_err(DOC_NamespaceNotFound);
    ck_assert_str_eq(str("errmsg"), "ns not found");
    run("{\"dropDatabase\": 1, \"$db\": \"other\"}");
    assert_ok();
    run("{\"listDatabases\": 1, \"nameOnly\": true, \"$db\": \"admin\"}");
    ck_assert_int_eq(array_len("databases"), 1);
    run("{\"find\": \"system.users\", \"$db\": \"test\"}");
    assert_err(DOC_InvalidNamespace);
}
END_TEST

START_TEST(explain_shapes)
{
    insert_many("big", 200, 0);
    run("{\"createIndexes\": \"big\", \"indexes\": [{\"key\": {\"a\": 1}, \"name\": \"a_1\"}], \"$db\": \"test\"}");
    run("{\"explain\": {\"find\": \"big\", \"filter\": {\"a\": 4}}, \"verbosity\": \"queryPlanner\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_str_eq(str("queryPlanner.namespace"), "test.big");
    ck_assert_str_eq(str("queryPlanner.winningPlan.stage"), "IXSCAN");
    ck_assert_str_eq(str("queryPlanner.winningPlan.indexName"), "a_1");
    ck_assert(!has("executionStats"));
    run("{\"explain\": {\"find\": \"big\", \"filter\": {\"s\": \"\"}}, \"verbosity\": \"executionStats\", \"$db\": \"test\"}");
    assert_ok();
    ck_assert_str_eq(str("queryPlanner.winningPlan.stage"), "COLLSCAN");
    ck_assert(!has("queryPlanner.winningPlan.indexName"));
    ck_assert_int_eq(num("executionStats.nReturned"), 200);
    ck_assert_int_eq(num("executionStats.totalDocsExamined"), 200);
    run("{\"explain\": {\"find\": \"big\", \"filter\": {\"a\": 4}}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("executionStats.nReturned"), 20);
    ck_assert_int_le(num("executionStats.totalDocsExamined"), 20);
    run("{\"explain\": {\"count\": \"big\", \"query\": {\"a\": 4}}, \"$db\": \"test\"}");
    ck_assert_str_eq(str("queryPlanner.winningPlan.indexName"), "a_1");
    run("{\"explain\": {\"delete\": \"big\", \"deletes\": [{\"q\": {\"a\": 4}, \"limit\": 0}]}, \"$db\": \"test\"}");
    ck_assert_str_eq(str("queryPlanner.winningPlan.indexName"), "a_1");
    run("{\"explain\": {\"update\": \"big\", \"updates\": [{\"q\": {\"_id\": 4}, \"u\": {}}]}, \"$db\": \"test\"}");
    ck_assert_str_eq(str("queryPlanner.winningPlan.stage"), "IXSCAN");
    run("{\"count\": \"big\", \"query\": {\"a\": 4}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("n"), 20);     /* explain wrote nothing */
    run("{\"explain\": {\"find\": \"none\"}, \"$db\": \"test\"}");
    ck_assert_str_eq(str("queryPlanner.winningPlan.stage"), "EOF");
    run("{\"explain\": {\"frobnicate\": \"big\"}, \"$db\": \"test\"}");
    assert_err(DOC_CommandNotFound);
}
END_TEST

START_TEST(sync_and_flags)
{
    struct doc_err e = {0};

    ck_assert_int_eq(run("{\"find\": \"c\", \"$db\": \"test\"}"), 0);
    ck_assert_int_eq(run("{\"insert\": \"c\", \"documents\": [{}], \"$db\": \"test\"}"), DOC_CMD_WROTE);
    ck_assert_int_eq(doc_server_sync(srv, &e), 0);
    e = (struct doc_err){.code = DOC_OutOfDiskSpace};
    snprintf(e.msg, sizeof(e.msg), "flush failed");
    doc_cmd_sync_failed(&e, &rep);
    assert_err(DOC_OutOfDiskSpace);
    ck_assert_str_eq(str("errmsg"), "flush failed");
}
END_TEST

/* Every command with each of its arguments replaced by values of every
 * kind: each gets a reply, ok or a complete error, and the server goes on. */
START_TEST(argument_matrix)
{
    static const struct {
        const char *name, *args[8];
    } cmds[] = {
        {"find", {"filter", "sort", "projection", "skip", "limit", "batchSize", "singleBatch", "hint"}},
        {"getMore", {"getMore", "collection", "batchSize"}},
        {"insert", {"documents", "ordered"}},
        {"update", {"updates", "ordered"}},
        {"delete", {"deletes", "ordered"}},
        {"findAndModify", {"query", "sort", "update", "remove", "new", "fields", "upsert"}},
        {"count", {"query", "skip", "limit"}},
        {"distinct", {"key", "query"}},
        {"aggregate", {"pipeline", "cursor", "explain"}},
        {"createIndexes", {"indexes"}},
        {"listIndexes", {"cursor"}},
        {"dropIndexes", {"index"}},
        {"listCollections", {"filter", "nameOnly", "cursor"}},
        {"listDatabases", {"filter", "nameOnly"}},
        {"create", {"capped", "viewOn"}},
        {"drop", {"writeConcern"}},
        {"collStats", {"scale"}},
        {"dbStats", {"scale"}},
        {"killCursors", {"cursors"}},
        {"explain", {"explain", "verbosity"}},
        {"hello", {"helloOk", "topologyVersion", "maxAwaitTimeMS"}},
        {"getParameter", {"getParameter", "featureCompatibilityVersion"}},
        {"getLog", {"getLog"}},
        {"dropDatabase", {"dropDatabase"}},
    };
    static const char *vals[] = {
        "1", "-1", "0", "{\"$numberLong\": \"-9223372036854775808\"}", "1.5", "{\"$numberDouble\": \"NaN\"}",
        "\"s\"", "\"\"", "\"*\"", "{}", "{\"$bad\": 1}", "{\"a\": {\"$gt\": 1}}", "[]", "[1]", "[{}]",
        "[{\"q\": 1, \"u\": 1, \"limit\": \"x\"}]", "[{\"key\": {}, \"name\": 1}]", "[{\"$group\": 1}]",
        "null", "true", "{\"$oid\": \"0123456789abcdef01234567\"}", "{\"$regex\": \"a(\", \"$options\": \"\"}",
        "{\"$minKey\": 1}", "{\"$date\": 0}", "{\"$binary\": {\"base64\": \"AA==\", \"subType\": \"00\"}}",
        "{\"find\": \"c\", \"filter\": {\"$where\": 1}}",
    };
    unsigned i, j, k;

    insert_json("c", "[{\"_id\": 1, \"a\": 2}]");
    for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        for (j = 0; j < 8 && cmds[i].args[j]; j++)
            for (k = 0; k < sizeof(vals) / sizeof(vals[0]); k++) {
                char js[1024];
                bson_iter_t it;

                if (!strcmp(cmds[i].args[j], cmds[i].name))
                    snprintf(js, sizeof(js), "{\"%s\": %s, \"$db\": \"test\"}", cmds[i].name,
                             vals[k]);
                else
                    snprintf(js, sizeof(js), "{\"%s\": \"c\", \"%s\": %s, \"$db\": \"test\"}",
                             cmds[i].name, cmds[i].args[j], vals[k]);
                run(js);
                ck_assert_msg(find_path(&rep, "ok", &it) && BSON_ITER_HOLDS_DOUBLE(&it), "%s: %s",
                              js, bson_as_relaxed_extended_json(&rep, NULL));
                if (bson_iter_double(&it) == 0) {
                    ck_assert_msg(type_of("errmsg") == BSON_TYPE_UTF8, "%s", js);
                    ck_assert_msg(type_of("code") == BSON_TYPE_INT32, "%s", js);
                    ck_assert_msg(type_of("codeName") == BSON_TYPE_UTF8, "%s", js);
                }
                /* the first field of the command with that value too */
                snprintf(js, sizeof(js), "{\"%s\": %s, \"%s\": %s, \"$db\": \"test\"}",
                         cmds[i].name, vals[k], cmds[i].args[j], vals[(k + 7) % (sizeof(vals) / sizeof(vals[0]))]);
                run(js);
                ck_assert_msg(find_path(&rep, "ok", &it) && BSON_ITER_HOLDS_DOUBLE(&it), "%s", js);
            }
    run("{\"ping\": 1}");
    assert_ok();
    run("{\"listDatabases\": 1, \"nameOnly\": true, \"$db\": \"admin\"}");
    assert_ok();
}
END_TEST

/* A cursor whose collection goes away under it ends; it does not read
 * what replaced it. */
START_TEST(cursor_after_drop)
{
    char cmd[256];
    int64_t id, id2;

    insert_many("big", 300, 0);
    run("{\"find\": \"big\", \"batchSize\": 10, \"$db\": \"test\"}");
    id = cursor_id();
    run("{\"find\": \"big\", \"sort\": {\"a\": 1}, \"batchSize\": 10, \"$db\": \"test\"}");
    id2 = cursor_id();
    run("{\"drop\": \"big\", \"$db\": \"test\"}");
    assert_ok();
    insert_many("big", 5, 0);
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"$db\": \"test\"}",
             (long long)id);
    run(cmd);
    assert_ok();
    ck_assert_int_eq(array_len("cursor.nextBatch"), 0);
    ck_assert_int_eq(cursor_id(), 0);
    /* a sorted one had its results already */
    snprintf(cmd, sizeof(cmd),
             "{\"getMore\": {\"$numberLong\": \"%lld\"}, \"collection\": \"big\", \"$db\": \"test\"}",
             (long long)id2);
    run(cmd);
    assert_ok();
    ck_assert_int_eq(array_len("cursor.nextBatch"), 290);
    run("{\"dropDatabase\": 1, \"$db\": \"test\"}");
    assert_ok();
}
END_TEST

/* Error paths that hold documents too large for libbson's inline buffer
 * (so a double free or a leak shows under ASan): an unordered update's
 * duplicate key, findAndModify's failed update, a count whose skip and
 * limit add past INT64_MAX (UBSan). */
START_TEST(error_paths_with_documents)
{
    char pad[200], cmd[1024];

    memset(pad, 'p', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = 0;
    snprintf(cmd, sizeof(cmd),
             "[{\"_id\": 1, \"k\": 1, \"s\": \"%s\"}, {\"_id\": 2, \"k\": 2, \"s\": \"%s\"}, {\"_id\": 3, \"n\": \"x\", \"s\": \"%s\"}]",
             pad, pad, pad);
    insert_json("c", cmd);
    run("{\"createIndexes\": \"c\", \"indexes\": [{\"key\": {\"k\": 1}, \"name\": \"k_1\", \"unique\": true}], \"$db\": \"test\"}");
    assert_ok();
    run("{\"update\": \"c\", \"ordered\": false, \"updates\": [{\"q\": {\"_id\": 1}, \"u\": {\"$set\": {\"k\": 2}}}, {\"q\": {\"_id\": 2}, \"u\": {\"$set\": {\"k\": 1}}}, {\"q\": {\"_id\": 3}, \"u\": {\"$set\": {\"k\": 3}}}], \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(array_len("writeErrors"), 2);
    ck_assert_int_eq(num("writeErrors.1.index"), 1);
    ck_assert_int_eq(num("writeErrors.1.keyValue.k"), 1);
    ck_assert_int_eq(num("nModified"), 1);

    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 3}, \"update\": {\"$inc\": {\"n\": 1}}, \"$db\": \"test\"}");
    assert_err(DOC_TypeMismatch);
    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 3}, \"update\": {\"$set\": {\"k\": 1}}, \"$db\": \"test\"}");
    assert_err(DOC_DuplicateKey);
    run("{\"findAndModify\": \"c\", \"query\": {\"_id\": 3}, \"update\": {\"$set\": {\"m\": 1}}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert(!has("value.m"));
    ck_assert_int_eq(num("value._id"), 3);

    run("{\"count\": \"c\", \"query\": {\"s\": {\"$exists\": true}}, \"skip\": 1, \"limit\": {\"$numberLong\": \"9223372036854775807\"}, \"$db\": \"test\"}");
    assert_ok();
    ck_assert_int_eq(num("n"), 2);
}
END_TEST

/* Retryable writes: a write sent again with its session's lsid and
 * txnNumber gets its first reply and runs once; an older txnNumber is
 * refused. (The record on a replica and after a restart: doc_repl.) */
#define LSID "\"lsid\": {\"id\": {\"$binary\": {\"base64\": \"q83vEjRWeJCrze8SNFZ4kA==\", " \
             "\"subType\": \"04\"}}}"

START_TEST(retryable_writes_run_once)
{
    const char *ins = "{\"insert\": \"r\", \"documents\": [{\"_id\": 1}], " LSID ", "
                      "\"txnNumber\": {\"$numberLong\": \"5\"}, \"$db\": \"test\"}";
    const char *upd = "{\"update\": \"r\", \"updates\": [{\"q\": {\"_id\": 1}, "
                      "\"u\": {\"$inc\": {\"n\": 1}}}], " LSID ", "
                      "\"txnNumber\": {\"$numberLong\": \"6\"}, \"$db\": \"test\"}";

    run(ins);
    assert_ok();
    ck_assert_int_eq(num("n"), 1);
    /* Again: the first answer, not a duplicate key. */
    run(ins);
    assert_ok();
    ck_assert_int_eq(num("n"), 1);
    ck_assert(!has("writeErrors"));
    run(upd);
    assert_ok();
    run(upd);
    assert_ok();
    ck_assert_int_eq(num("nModified"), 1);
    run("{\"find\": \"r\", \"filter\": {\"_id\": 1}, \"$db\": \"test\"}");
    ck_assert_int_eq(num("cursor.firstBatch.0.n"), 1);
    /* An older one of the session: refused. */
    run(ins);
    assert_err(DOC_TransactionTooOld);
    /* Without a session, or in a transaction: it runs as it comes. */
    run("{\"insert\": \"r\", \"documents\": [{\"_id\": 1}], \"txnNumber\": "
        "{\"$numberLong\": \"6\"}, \"$db\": \"test\"}");
    ck_assert(has("writeErrors"));
}
END_TEST

Suite *suite_doc_cmd(void)
{
    Suite *s = suite_create("doc_cmd");
    TCase *tc = tcase_create("commands");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, hello_shape);
    tcase_add_test(tc, awaitable_hello_args);
    tcase_add_test(tc, topology_counter_follows_the_set);
    tcase_add_test(tc, server_commands);
    tcase_add_test(tc, unknown_and_malformed);
    tcase_add_test(tc, bad_argument_types);
    tcase_add_test(tc, insert_ids);
    tcase_add_test(tc, insert_ordered_unordered);
    tcase_add_test(tc, insert_too_large);
    tcase_add_test(tc, find_shapes);
    tcase_add_test(tc, cursor_10000);
    tcase_add_test(tc, batches_cut_by_bytes);
    tcase_add_test(tc, cursors_of_clients);
    tcase_add_test(tc, cursor_after_drop);
    tcase_add_test(tc, cursor_limits_and_idle);
    tcase_add_test(tc, update_shapes);
    tcase_add_test(tc, update_errors);
    tcase_add_test(tc, error_paths_with_documents);
    tcase_add_test(tc, update_multi_one_pass);
    tcase_add_test(tc, delete_shapes);
    tcase_add_test(tc, find_and_modify_shapes);
    tcase_add_test(tc, count_distinct);
    tcase_add_test(tc, aggregate_shapes);
    tcase_add_test(tc, index_commands);
    tcase_add_test(tc, namespace_commands);
    tcase_add_test(tc, explain_shapes);
    tcase_add_test(tc, sync_and_flags);
    tcase_add_test(tc, argument_matrix);
    tcase_add_test(tc, retryable_writes_run_once);
    suite_add_tcase(s, tc);
    return s;
}
