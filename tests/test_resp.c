/* The RESP2 gateway (services/kv/resp.c) on a store in a temporary pool.
 *
 * The gateway and its clients share the test process: a client writes with
 * MSG_DONTWAIT and, while it waits for a reply, polls the gateway itself
 * (pump()). Where the gateway has to die under a client (durability after
 * SIGKILL) it runs in a forked child instead. Replies are compared byte for
 * byte with what Redis 7 sends.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "helpers.h"
#include "kv_store.h"
#include "resp.h"
#include "resp_parse.h"
#include "suites.h"

#include "resp_harness.h"

static int syncs_seen;      /* calls of the sync hook */
static int early_replies;   /* syncs that found a reply already sent */
static int watched_fd = -1; /* the client the sync hook checks */

/* ---- commands ---- */

START_TEST(ping_and_echo)
{
    struct conn *c = conn_open();
    const char bin[] = "a\r\nb\0c";

    CMD(c, "PING");
    expect(c, "+PONG\r\n");
    CMD(c, "ping", "hello");
    expect(c, "$5\r\nhello\r\n");
    conn_cmdv(c, 2, (const char *[]){"EcHo", bin}, (size_t[]){4, sizeof(bin) - 1});
    expect_n(c, "$6\r\na\r\nb\0c\r\n", 12);
    CMD(c, "ECHO", "");
    expect(c, "$0\r\n\r\n");
    conn_close(c);
}
END_TEST

START_TEST(set_get_binary_safe)
{
    struct conn *c = conn_open();
    const char key[] = "k\0\r\n1", val[] = "v\r\n\0\r\nx";

    conn_cmdv(c, 3, (const char *[]){"SET", key, val},
              (size_t[]){3, sizeof(key) - 1, sizeof(val) - 1});
    expect(c, "+OK\r\n");
    conn_cmdv(c, 2, (const char *[]){"GET", key}, (size_t[]){3, sizeof(key) - 1});
    expect_n(c, "$7\r\nv\r\n\0\r\nx\r\n", 13);
    CMD(c, "set", "empty", "");
    expect(c, "+OK\r\n");
    CMD(c, "get", "empty");
    expect(c, "$0\r\n\r\n");
    CMD(c, "SET", "k", "one");
    expect(c, "+OK\r\n");
    CMD(c, "SET", "k", "two");
    expect(c, "+OK\r\n");
    CMD(c, "GET", "k");
    expect(c, "$3\r\ntwo\r\n");
    conn_close(c);
}
END_TEST

START_TEST(get_missing_is_null)
{
    struct conn *c = conn_open();

    CMD(c, "GET", "nope");
    expect(c, "$-1\r\n");
    CMD(c, "GET", "");
    expect(c, "$-1\r\n");
    CMD(c, "SET", "", "v");
    expect(c, "-ERR empty keys are not supported\r\n");
    conn_close(c);
}
END_TEST

/* 100 SETs in one write: 100 "+OK"s, and the batch is committed with a
 * sync or two, not one per command. */
static int counting_sync(struct kvs *s)
{
    char b;

    syncs_seen++;
    if (watched_fd >= 0 && recv(watched_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0)
        early_replies++;
    return kvs_sync(s);
}

START_TEST(pipelined_sets)
{
    struct conn *c = conn_open();
    char batch[8192], ok[600], val[16];
    size_t n = 0;

    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(batch + n, sizeof(batch) - n,
                              "*3\r\n$3\r\nSET\r\n$6\r\nkey%03d\r\n$6\r\nval%03d\r\n", i, i);
    ok[0] = '\0';
    for (int i = 0; i < 100; i++)
        strcat(ok, "+OK\r\n");
    resp_sync_fn = counting_sync;
    watched_fd = c->fd;
    conn_send(c, batch, n);
    expect(c, ok);
    ck_assert_int_eq(cmds_run, 100);
    ck_assert_int_ge(syncs_seen, 1);
    ck_assert_int_le(syncs_seen, 2);
    ck_assert_uint_eq(kvs_count(store), 100);
    for (int i = 0; i < 100; i += 33) {
        char key[16], want[32];

        snprintf(key, sizeof(key), "key%03d", i);
        snprintf(val, sizeof(val), "val%03d", i);
        snprintf(want, sizeof(want), "$6\r\n%s\r\n", val);
        CMD(c, "GET", key);
        expect(c, want);
    }
    conn_close(c);
}
END_TEST

/* Every write reply leaves only after the sync that makes it durable. */
START_TEST(reply_after_sync)
{
    struct conn *c = conn_open();

    resp_sync_fn = counting_sync;
    watched_fd = c->fd;
    for (int i = 0; i < 20; i++) {
        CMD(c, "SET", "k", "v");
        expect(c, "+OK\r\n");
        CMD(c, "INCR", "n");
        expect_prefix(c, ":");
        CMD(c, "DEL", "k");
        expect(c, ":1\r\n");
    }
    ck_assert_int_ge(syncs_seen, 20);
    ck_assert_int_eq(early_replies, 0);
    conn_close(c);
}
END_TEST

static int failing_sync(struct kvs *s)
{
    syncs_seen++;
    return TERN_EIO;
}

/* A failed commit turns the batch's write replies into errors; reads and
 * failed writes keep their own replies. */
START_TEST(sync_failure_fails_writes)
{
    struct conn *c = conn_open();
    const char *e = "-ERR write not persisted: sync failed: input/output error\r\n";
    char want[512];

    CMD(c, "SET", "a", "old");
    expect(c, "+OK\r\n");
    resp_sync_fn = failing_sync;
    conn_sends(c, "SET a 1\r\nGET a\r\nPING\r\nINCR n\r\nSET b\r\nMSET x 1 y 2\r\n"
                  "INCR a\r\nDEL nope\r\nECHO hi\r\n");
    snprintf(want, sizeof(want),
             "%s$1\r\n1\r\n+PONG\r\n%s-ERR wrong number of arguments for 'set' command\r\n"
             "%s%s%s$2\r\nhi\r\n", e, e, e, e, e);
    expect(c, want);
    ck_assert_int_ge(syncs_seen, 1);
    resp_sync_fn = kvs_sync;
    CMD(c, "SET", "c", "2");
    expect(c, "+OK\r\n");
    conn_close(c);
}
END_TEST

START_TEST(del_and_exists_count)
{
    struct conn *c = conn_open();

    CMD(c, "MSET", "a", "1", "b", "2");
    expect(c, "+OK\r\n");
    CMD(c, "EXISTS", "a", "b", "c", "a");
    expect(c, ":3\r\n");
    CMD(c, "DEL", "a", "c");
    expect(c, ":1\r\n");
    CMD(c, "EXISTS", "a");
    expect(c, ":0\r\n");
    CMD(c, "del", "a", "b", "b");
    expect(c, ":1\r\n");
    CMD(c, "DBSIZE");
    expect(c, ":0\r\n");
    conn_close(c);
}
END_TEST

START_TEST(mget_and_mset)
{
    struct conn *c = conn_open();

    CMD(c, "MSET", "x", "1", "y", "22");
    expect(c, "+OK\r\n");
    CMD(c, "MGET", "x", "nope", "y", "");
    expect(c, "*4\r\n$1\r\n1\r\n$-1\r\n$2\r\n22\r\n$-1\r\n");
    CMD(c, "MSET", "x", "1", "y");
    expect(c, "-ERR wrong number of arguments for 'mset' command\r\n");
    CMD(c, "MSET", "x");
    expect(c, "-ERR wrong number of arguments for 'mset' command\r\n");
    CMD(c, "MSET", "z", "1", "", "2");
    expect(c, "-ERR empty keys are not supported\r\n");
    CMD(c, "EXISTS", "z");
    expect(c, ":0\r\n");
    conn_close(c);
}
END_TEST

START_TEST(incr_semantics)
{
    struct conn *c = conn_open();

    CMD(c, "INCR", "n");
    expect(c, ":1\r\n");
    CMD(c, "INCR", "n");
    expect(c, ":2\r\n");
    CMD(c, "GET", "n");
    expect(c, "$1\r\n2\r\n");
    CMD(c, "SET", "m", "-5");
    expect(c, "+OK\r\n");
    CMD(c, "INCR", "m");
    expect(c, ":-4\r\n");
    CMD(c, "INCRBY", "m", "10");
    expect(c, ":6\r\n");
    CMD(c, "DECR", "m");
    expect(c, ":5\r\n");
    CMD(c, "DECRBY", "m", "7");
    expect(c, ":-2\r\n");
    for (int i = 0; i < 5; i++) {
        static const char *bad[] = {"abc", " 1", "01", "1.5", "-0"};

        CMD(c, "SET", "s", bad[i]);
        expect(c, "+OK\r\n");
        CMD(c, "INCR", "s");
        expect(c, "-ERR value is not an integer or out of range\r\n");
        CMD(c, "GET", "s");
        expect_prefix(c, "$");
        expect_prefix(c, bad[i]);
    }
    CMD(c, "SET", "big", "9223372036854775807");
    expect(c, "+OK\r\n");
    CMD(c, "INCR", "big");
    expect(c, "-ERR increment or decrement would overflow\r\n");
    CMD(c, "GET", "big");
    expect(c, "$19\r\n9223372036854775807\r\n");
    CMD(c, "SET", "small", "-9223372036854775808");
    expect(c, "+OK\r\n");
    CMD(c, "DECR", "small");
    expect(c, "-ERR increment or decrement would overflow\r\n");
    CMD(c, "INCR", "small");
    expect(c, ":-9223372036854775807\r\n");
    CMD(c, "SET", "huge", "9223372036854775808");
    expect(c, "+OK\r\n");
    CMD(c, "INCR", "huge");
    expect(c, "-ERR value is not an integer or out of range\r\n");
    CMD(c, "INCRBY", "n", "x");
    expect(c, "-ERR value is not an integer or out of range\r\n");
    conn_close(c);
}
END_TEST

START_TEST(dbsize_and_flushdb)
{
    struct conn *c = conn_open();

    CMD(c, "MSET", "a", "1", "b", "2", "c", "3");
    expect(c, "+OK\r\n");
    CMD(c, "DBSIZE");
    expect(c, ":3\r\n");
    CMD(c, "FLUSHDB");
    expect(c, "+OK\r\n");
    CMD(c, "DBSIZE");
    expect(c, ":0\r\n");
    CMD(c, "GET", "a");
    expect(c, "$-1\r\n");
    CMD(c, "SET", "a", "again");
    expect(c, "+OK\r\n");
    CMD(c, "FLUSHALL", "ASYNC");
    expect(c, "+OK\r\n");
    CMD(c, "DBSIZE");
    expect(c, ":0\r\n");
    CMD(c, "FLUSHDB", "LATER");
    expect(c, "-ERR syntax error\r\n");
    conn_close(c);
}
END_TEST

START_TEST(set_options)
{
    struct conn *c = conn_open();

    CMD(c, "SET", "k", "v", "NX");
    expect(c, "+OK\r\n");
    CMD(c, "SET", "k", "w", "nx");
    expect(c, "$-1\r\n");
    CMD(c, "GET", "k");
    expect(c, "$1\r\nv\r\n");
    CMD(c, "SET", "k", "w", "XX");
    expect(c, "+OK\r\n");
    CMD(c, "SET", "other", "x", "XX");
    expect(c, "$-1\r\n");
    CMD(c, "EXISTS", "other");
    expect(c, ":0\r\n");
    CMD(c, "SET", "k", "z", "EX", "10", "PX", "10");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "SET", "k", "z", "EX");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "SET", "k", "z", "PERSIST");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "SET", "k", "z", "EX", "ten");
    expect(c, "-ERR value is not an integer or out of range\r\n");
    CMD(c, "SET", "k", "z", "EX", "0");
    expect(c, "-ERR invalid expire time in 'set' command\r\n");
    CMD(c, "SET", "k", "z", "PX", "9223372036854775807");
    expect(c, "-ERR invalid expire time in 'set' command\r\n");
    CMD(c, "SET", "k", "z", "BOGUS");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "SET", "k", "z", "NX", "XX");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "GET", "k");
    expect(c, "$1\r\nw\r\n");
    conn_close(c);
}
END_TEST

START_TEST(inline_commands)
{
    struct conn *c = conn_open();

    conn_sends(c, "PING\r\n");
    expect(c, "+PONG\r\n");
    conn_sends(c, "SET a b\r\n");
    expect(c, "+OK\r\n");
    conn_sends(c, "get a\n");
    expect(c, "$1\r\nb\r\n");
    conn_sends(c, "\r\n\r\n  EXISTS \t a   a \r\n");
    expect(c, ":2\r\n");
    /* Like Redis: a multibulk of no (or a negative number of) elements is
     * an empty command with no reply. */
    conn_sends(c, "*0\r\n*-5\r\n*-1\r\nPING\r\n");
    expect(c, "+PONG\r\n");
    conn_close(c);
}
END_TEST

START_TEST(info_config_and_friends)
{
    struct conn *c = conn_open();
    struct kvs_stats st;
    char *r, line[64];

    CMD(c, "SET", "k", "v");
    expect(c, "+OK\r\n");
    CMD(c, "INFO");
    r = next_reply(c, NULL);
    ck_assert_msg(r[0] == '$', "%s", r);
    ck_assert_ptr_nonnull(strstr(r, "# Server\r\nredis_version:"));
    ck_assert_ptr_nonnull(strstr(r, "\r\ntern_version:"));
    ck_assert_ptr_nonnull(strstr(r, "# Persistence\r\n"));
    kvs_get_stats(store, &st);
    snprintf(line, sizeof(line), "\r\ntern_pool_bytes:%llu\r\n", (unsigned long long)st.pool.size);
    ck_assert_msg(st.pool.size > POOL_SIZE / 2 && strstr(r, line), "%s", r);
    ck_assert_ptr_nonnull(strstr(r, "# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n"));
    free(r);
    CMD(c, "INFO", "keyspace");
    r = next_reply(c, NULL);
    ck_assert_ptr_nonnull(strstr(r, "db0:keys=1,"));
    ck_assert_ptr_null(strstr(r, "# Server"));
    free(r);
    CMD(c, "CONFIG", "GET", "save");
    expect(c, "*2\r\n$4\r\nsave\r\n$0\r\n\r\n");
    CMD(c, "config", "get", "appendonly");
    expect(c, "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
    CMD(c, "CONFIG", "GET", "no-such-thing");
    expect(c, "*0\r\n");
    CMD(c, "CONFIG", "GET");
    expect(c, "-ERR wrong number of arguments for 'config|get' command\r\n");
    CMD(c, "COMMAND", "COUNT");
    expect_prefix(c, ":112");
    CMD(c, "SELECT", "0");
    expect(c, "+OK\r\n");
    CMD(c, "SELECT", "1");
    expect(c, "-ERR DB index is out of range\r\n");
    CMD(c, "CLIENT", "SETNAME", "me");
    expect(c, "+OK\r\n");
    conn_close(c);
}
END_TEST

/* COMMAND lists what is served, and only that: as many entries as COMMAND
 * COUNT says, each in Redis 7's layout; INFO of an unknown name is nil;
 * DOCS names a summary and a group; unknown subcommands are errors. */
START_TEST(command_tells_what_is_served)
{
    struct conn *c = conn_open();
    char *r, count[32];
    long long n;

    CMD(c, "COMMAND", "COUNT");
    r = next_reply(c, NULL);
    ck_assert_int_eq(sscanf(r, ":%lld", &n), 1);
    ck_assert_int_gt(n, 10);
    free(r);
    snprintf(count, sizeof(count), "*%lld\r\n", n);
    CMD(c, "COMMAND");
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, count, strlen(count)) == 0, "%.80s", r);
    ck_assert_ptr_nonnull(strstr(r, "*10\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n"));
    ck_assert_ptr_nonnull(strstr(r, "*10\r\n$4\r\nmset\r\n:-3\r\n*2\r\n+write\r\n+denyoom\r\n"
                                    ":1\r\n:-1\r\n:2\r\n"));
    ck_assert_ptr_nonnull(strstr(r, "*10\r\n$5\r\nlpush\r\n:-3\r\n*2\r\n+write\r\n"));
    ck_assert_ptr_null(strstr(r, "xadd"));
    free(r);
    CMD(c, "COMMAND", "LIST");
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, count, strlen(count)) == 0, "%.80s", r);
    ck_assert_ptr_nonnull(strstr(r, "$6\r\nincrby\r\n"));
    free(r);
    CMD(c, "COMMAND", "INFO", "get", "xadd");
    r = next_reply(c, NULL);
    ck_assert_msg(!strncmp(r, "*2\r\n*10\r\n$3\r\nget\r\n", 17) &&
                      !strcmp(r + strlen(r) - 5, "*-1\r\n"), "%s", r);
    free(r);
    CMD(c, "COMMAND", "INFO", "xadd");
    expect(c, "*1\r\n*-1\r\n");
    CMD(c, "COMMAND", "DOCS", "get");
    expect(c, "*2\r\n$3\r\nget\r\n*4\r\n$7\r\nsummary\r\n$34\r\nReturns the string value of a key."
              "\r\n$5\r\ngroup\r\n$6\r\nstring\r\n");
    CMD(c, "COMMAND", "GETKEYSANDFLAGS", "get", "a");
    expect_prefix(c, "-ERR unknown subcommand or wrong number of arguments for 'GETKEYSANDFLAGS'");
    CMD(c, "COMMAND", "HELP");
    r = next_reply(c, NULL);
    ck_assert_msg(!strncmp(r, "*13\r\n+COMMAND <subcommand>", 26), "%s", r);
    free(r);
    conn_close(c);
}
END_TEST

/* CLIENT: names, ids, LIST and INFO with Redis's fields, KILL by id and
 * address, and errors for what it does not know. HELLO 2 is answered;
 * HELLO 3 gets what a Redis before 6 gives any HELLO. */
START_TEST(client_and_hello)
{
    struct conn *a = conn_open(), *b = conn_open();
    char *r, want[96], addr[64];
    long long ida, idb;

    CMD(a, "CLIENT", "ID");
    r = next_reply(a, NULL);
    ck_assert_int_eq(sscanf(r, ":%lld", &ida), 1);
    free(r);
    CMD(b, "CLIENT", "ID");
    r = next_reply(b, NULL);
    ck_assert_int_eq(sscanf(r, ":%lld", &idb), 1);
    free(r);
    ck_assert_int_ne(ida, idb);
    CMD(a, "CLIENT", "GETNAME");
    expect(a, "$-1\r\n");
    CMD(a, "CLIENT", "SETNAME", "has space");
    expect_prefix(a, "-ERR Client names cannot contain spaces");
    CMD(a, "CLIENT", "SETNAME", "alpha");
    expect(a, "+OK\r\n");
    CMD(a, "CLIENT", "GETNAME");
    expect(a, "$5\r\nalpha\r\n");
    CMD(a, "CLIENT", "LIST");
    r = next_reply(a, NULL);
    snprintf(want, sizeof(want), "id=%lld addr=127.0.0.1:", ida);
    ck_assert_msg(strstr(r, want) && strstr(r, " name=alpha ") && strstr(r, " cmd=client"), "%s", r);
    snprintf(want, sizeof(want), "id=%lld addr=", idb);
    ck_assert_msg(strstr(r, want), "%s", r);
    free(r);
    CMD(a, "CLIENT", "INFO");
    r = next_reply(a, NULL);
    snprintf(want, sizeof(want), "id=%lld ", ida);
    ck_assert_msg(strstr(r, want) && !strstr(strstr(r, want), "\nid="), "%s", r);
    ck_assert_int_eq(sscanf(strstr(r, "addr=") + 5, "%63s", addr), 1);
    free(r);
    snprintf(want, sizeof(want), "%lld", idb);
    CMD(a, "CLIENT", "LIST", "ID", want);
    r = next_reply(a, NULL);
    ck_assert_msg(!strstr(r, "name=alpha") && strstr(r, "id="), "%s", r);
    free(r);
    CMD(a, "CLIENT", "FROB");
    expect_prefix(a, "-ERR unknown subcommand or wrong number of arguments for 'FROB'");
    CMD(a, "CLIENT", "KILL", "ID", "999999");
    expect(a, ":0\r\n");
    CMD(a, "CLIENT", "KILL", "ADDR", addr);      /* itself: SKIPME yes by default */
    expect(a, ":0\r\n");
    CMD(a, "CLIENT", "KILL", "ID", want);
    expect(a, ":1\r\n");
    ck_assert(conn_closed(b));
    CMD(a, "CLIENT", "KILL", "127.0.0.1:1");
    expect(a, "-ERR No such client\r\n");
    CMD(a, "HELLO");
    r = next_reply(a, NULL);
    ck_assert_msg(!strncmp(r, "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n", 26) &&
                      strstr(r, "$5\r\nproto\r\n:2\r\n"), "%s", r);
    free(r);
    CMD(a, "HELLO", "2", "SETNAME", "beta");
    r = next_reply(a, NULL);
    ck_assert_msg(!strncmp(r, "*14\r\n", 5), "%s", r);
    free(r);
    CMD(a, "CLIENT", "GETNAME");
    expect(a, "$4\r\nbeta\r\n");
    CMD(a, "HELLO", "3");
    expect(a, "-ERR unknown command 'HELLO', with args beginning with: '3' \r\n");
    CMD(a, "HELLO", "4");
    expect(a, "-NOPROTO unsupported protocol version\r\n");
    conn_close(a);
    conn_close(b);
}
END_TEST

START_TEST(unknown_command_and_arity)
{
    struct conn *c = conn_open();

    CMD(c, "FOO", "a", "b");
    expect(c, "-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n");
    /* A name with a line break in it must not break the error line. */
    CMD(c, "X\r\nY");
    expect(c, "-ERR unknown command 'X  Y', with args beginning with: \r\n");
    CMD(c, "GET");
    expect(c, "-ERR wrong number of arguments for 'get' command\r\n");
    CMD(c, "get", "a", "b");
    expect(c, "-ERR wrong number of arguments for 'get' command\r\n");
    CMD(c, "SET", "a");
    expect(c, "-ERR wrong number of arguments for 'set' command\r\n");
    CMD(c, "ECHO");
    expect(c, "-ERR wrong number of arguments for 'echo' command\r\n");
    CMD(c, "PING", "a", "b");
    expect(c, "-ERR wrong number of arguments for 'ping' command\r\n");
    CMD(c, "PING");
    expect(c, "+PONG\r\n");
    conn_close(c);
}
END_TEST

START_TEST(quit_closes_after_reply)
{
    struct conn *c = conn_open();

    conn_sends(c, "PING\r\nQUIT\r\nPING\r\n");
    expect(c, "+PONG\r\n+OK\r\n");
    ck_assert(conn_closed(c));
    ck_assert_uint_eq(c->len, 0);
    conn_close(c);
}
END_TEST

/* ---- protocol errors ---- */

START_TEST(protocol_errors_close_only_that_client)
{
    static const struct {
        const char *send, *reply;
    } cases[] = {
        {"*2\r\n$abc\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
        {"*2\r\n$-3\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
        {"*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
        {"*1\rX", "-ERR Protocol error: invalid multibulk length\r\n"},
        {"*99999999999999999999\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
        {"*1\r\nfoo\r\n", "-ERR Protocol error: expected '$', got 'f'\r\n"},
        {"*1\r\n$4\r\nPINGXY", "-ERR Protocol error: expected CRLF after bulk data\r\n"},
        /* commands before the bad one are answered first */
        {"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n\r\n",
         "+PONG\r\n+PONG\r\n-ERR Protocol error: expected '$', got byte 0x0d\r\n"},
    };
    struct conn *good = conn_open();

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct conn *bad = conn_open();

        conn_sends(bad, cases[i].send);
        expect(bad, cases[i].reply);
        ck_assert_msg(conn_closed(bad), "case %zu left open", i);
        ck_assert_uint_eq(bad->len, 0);
        conn_close(bad);
        CMD(good, "SET", "k", "v");
        expect(good, "+OK\r\n");
    }
    CMD(good, "GET", "k");
    expect(good, "$1\r\nv\r\n");
    conn_close(good);
}
END_TEST

START_TEST(oversized_requests)
{
    struct resp_config cfg = {.max_request = 64 * 1024};
    struct conn *good, *bad;
    char *big;

    gw_close();
    gw_open(&cfg);
    good = conn_open();
    CMD(good, "PING");
    expect(good, "+PONG\r\n");

    /* a bulk longer than max_request: refused from its header on */
    bad = conn_open();
    conn_sends(bad, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n");
    expect(bad, "-ERR Protocol error: invalid bulk length\r\n");
    ck_assert(conn_closed(bad));
    conn_close(bad);

    /* small arguments that add up to more */
    bad = conn_open();
    conn_sends(bad, "*3000\r\n");
    for (int i = 0; i < 3000; i++)
        conn_sends(bad, "$20\r\n01234567890123456789\r\n");
    expect(bad, "-ERR Protocol error: request too large\r\n");
    ck_assert(conn_closed(bad));
    conn_close(bad);

    /* more elements than could fit */
    bad = conn_open();
    conn_sends(bad, "*20000\r\n");
    expect(bad, "-ERR Protocol error: invalid multibulk length\r\n");
    ck_assert(conn_closed(bad));
    conn_close(bad);

    /* an inline line with no end */
    bad = conn_open();
    big = malloc(70000);
    ck_assert_ptr_nonnull(big);
    memset(big, 'a', 70000);
    conn_send(bad, big, 70000);
    expect(bad, "-ERR Protocol error: too big inline request\r\n");
    ck_assert(conn_closed(bad));
    conn_close(bad);
    free(big);

    /* the biggest command that fits still works */
    big = malloc(60000);
    ck_assert_ptr_nonnull(big);
    memset(big, 'v', 60000);
    conn_cmdv(good, 3, (const char *[]){"SET", "k", big}, (size_t[]){3, 1, 60000});
    expect(good, "+OK\r\n");
    CMD(good, "STRLEN?", "k");
    expect_prefix(good, "-ERR unknown command");
    CMD(good, "GET", "k");
    expect(good, "$60000\r\n");
    expect_n(good, big, 60000);
    expect(good, "\r\n");
    free(big);
    conn_close(good);
}
END_TEST

/* ---- sizes and buffers ---- */

START_TEST(value_over_val_max_keeps_old)
{
    struct conn *c = conn_open();
    size_t max = kvs_val_max(store, 1);
    char *v = malloc(max + 1);

    ck_assert_ptr_nonnull(v);
    memset(v, 'x', max + 1);
    CMD(c, "SET", "k", "old");
    expect(c, "+OK\r\n");
    conn_cmdv(c, 3, (const char *[]){"SET", "k", v}, (size_t[]){3, 1, max + 1});
    expect(c, "-ERR value too large for the store\r\n");
    conn_cmdv(c, 5, (const char *[]){"MSET", "a", "1", "k", v}, (size_t[]){4, 1, 1, 1, max + 1});
    expect(c, "-ERR value too large for the store\r\n");
    CMD(c, "GET", "k");
    expect(c, "$3\r\nold\r\n");
    CMD(c, "EXISTS", "a");
    expect(c, ":0\r\n");
    /* exactly val_max fits */
    conn_cmdv(c, 3, (const char *[]){"SET", "k", v}, (size_t[]){3, 1, max});
    expect(c, "+OK\r\n");
    CMD(c, "GET", "k");
    expect_prefix(c, "$");
    conn_wait(c, max + 2);
    ck_assert_uint_ge(c->len, max + 2);
    ck_assert_int_eq(memcmp(c->buf, v, max), 0);
    free(v);
    conn_close(c);
}
END_TEST

/* 300 GETs of 40 KiB values: about 12 MiB of replies, more than the socket
 * holds, so the gateway must keep the rest and finish on EPOLLOUT. */
START_TEST(slow_reader_gets_everything)
{
    struct conn *c = conn_open();
    size_t vlen = 40000;
    char *v = malloc(vlen), *want = malloc(vlen + 16);
    size_t hdr;

    ck_assert_ptr_nonnull(v);
    ck_assert_ptr_nonnull(want);
    for (size_t i = 0; i < vlen; i++)
        v[i] = (char)('a' + i % 26);
    conn_cmdv(c, 3, (const char *[]){"SET", "big", v}, (size_t[]){3, 3, vlen});
    expect(c, "+OK\r\n");
    for (int i = 0; i < 300; i++)
        conn_sends(c, "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n");
    for (int i = 0; i < 100; i++)
        pump();         /* without reading */
    hdr = (size_t)sprintf(want, "$%zu\r\n", vlen);
    memcpy(want + hdr, v, vlen);
    memcpy(want + hdr + vlen, "\r\n", 2);
    for (int i = 0; i < 300; i++)
        expect_n(c, want, hdr + vlen + 2);
    CMD(c, "PING");
    expect(c, "+PONG\r\n");
    free(v);
    free(want);
    conn_close(c);
}
END_TEST

/* 4000 GETs of 50 KB values sent at once to a client that does not read:
 * the gateway must stop running them once 64 MiB of replies wait (rather
 * than build 200 MB), and run the rest as the client catches up. */
START_TEST(backlog_stalls_then_resumes)
{
    static const char get[] = "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n";
    struct conn *c = conn_open();
    size_t vlen = 50000, hdr;
    char *v = malloc(vlen), *want = malloc(vlen + 16), *batch = malloc(4000 * 26);
    size_t n = 0;

    ck_assert_ptr_nonnull(v);
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(batch);
    for (size_t i = 0; i < vlen; i++)
        v[i] = (char)('A' + i % 26);
    conn_cmdv(c, 3, (const char *[]){"SET", "big", v}, (size_t[]){3, 3, vlen});
    expect(c, "+OK\r\n");
    for (int i = 0; i < 4000; i++) {
        memcpy(batch + n, get, sizeof(get) - 1);
        n += sizeof(get) - 1;
    }
    cmds_run = 0;
    conn_send(c, batch, n);
    for (int i = 0; i < 50; i++)
        pump();
    ck_assert_int_gt(cmds_run, 1000);
    ck_assert_int_lt(cmds_run, 2000);
    hdr = (size_t)sprintf(want, "$%zu\r\n", vlen);
    memcpy(want + hdr, v, vlen);
    memcpy(want + hdr + vlen, "\r\n", 2);
    for (int i = 0; i < 4000; i++)
        expect_n(c, want, hdr + vlen + 2);
    ck_assert_int_eq(cmds_run, 4000);
    CMD(c, "PING");
    expect(c, "+PONG\r\n");
    free(v);
    free(want);
    free(batch);
    conn_close(c);
}
END_TEST

/* MGET of one 1 MiB value 1000 times, replies never read: a 1 GB reply.
 * The gateway must not build it (its output buffer stays within the 64 MiB
 * cap, as INFO's figures say), must answer with an error instead, and keep
 * serving its other clients meanwhile. */
START_TEST(mget_reply_held_to_output_cap)
{
    enum { VLEN = 1u << 20, N = 1000 };
    struct conn *a, *b;
    char *v = malloc(VLEN), *cmd = malloc(N * 16 + 32), *r;
    size_t n;

    ck_assert_ptr_nonnull(v);
    ck_assert_ptr_nonnull(cmd);
    store_recreate(16u << 20 | 4096, 2u << 20);
    a = conn_open();
    b = conn_open();
    memset(v, 'v', VLEN);
    conn_cmdv(b, 3, (const char *[]){"SET", "big", v}, (size_t[]){3, 3, VLEN});
    expect(b, "+OK\r\n");
    n = (size_t)sprintf(cmd, "*%d\r\n$4\r\nMGET\r\n", N + 1);
    for (int i = 0; i < N; i++)
        n += (size_t)sprintf(cmd + n, "$3\r\nbig\r\n");
    cmds_run = 0;
    conn_send(a, cmd, n);
    for (int i = 0; i < 50 && cmds_run == 0; i++)
        pump();
    ck_assert_int_eq(cmds_run, 1);
    /* Another client is served, and sees the buffers within the cap. */
    CMD(b, "GET", "missing");
    expect(b, "$-1\r\n");
    ck_assert_uint_eq(info_number(b, "clients", "tern_output_limit"), 64u << 20);
    ck_assert_uint_le(info_number(b, "clients", "tern_output_buffer_peak"), 64u << 20);
    ck_assert_uint_le(info_number(b, "clients", "tern_output_pending"), 4096);
    r = next_reply(a, NULL);
    ck_assert_msg(strncmp(r, "-ERR reply exceeds the gateway's output limit", 45) == 0,
                  "MGET's reply: %s", show(r, strlen(r)));
    free(r);
    /* The client goes on. */
    CMD(a, "PING");
    expect(a, "+PONG\r\n");
    free(v);
    free(cmd);
    conn_close(a);
    conn_close(b);
}
END_TEST

/* An MGET that fits the cap on its own but not behind 40 MiB of unread GET
 * replies waits for them to be sent, then runs whole: the client reads
 * every reply in order. */
START_TEST(big_reply_waits_for_output_to_drain)
{
    enum { VLEN = 1u << 20, GETS = 40, KEYS = 30 };
    static const char get[] = "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n";
    struct conn *c;
    char *v = malloc(VLEN), *cmd = malloc(GETS * 32 + KEYS * 16 + 32), *r;
    size_t n = 0, len, one = VLEN + 12;

    ck_assert_ptr_nonnull(v);
    ck_assert_ptr_nonnull(cmd);
    store_recreate(16u << 20 | 4096, 2u << 20);
    c = conn_open();
    for (size_t i = 0; i < VLEN; i++)
        v[i] = (char)('a' + i % 26);
    conn_cmdv(c, 3, (const char *[]){"SET", "big", v}, (size_t[]){3, 3, VLEN});
    expect(c, "+OK\r\n");
    for (int i = 0; i < GETS; i++) {
        memcpy(cmd + n, get, sizeof(get) - 1);
        n += sizeof(get) - 1;
    }
    n += (size_t)sprintf(cmd + n, "*%d\r\n$4\r\nMGET\r\n", KEYS + 1);
    for (int i = 0; i < KEYS; i++)
        n += (size_t)sprintf(cmd + n, "$3\r\nbig\r\n");
    cmds_run = 0;
    conn_send(c, cmd, n);
    for (int i = 0; i < 50; i++)
        pump();         /* without reading */
    ck_assert_int_eq(cmds_run, GETS);
    for (int i = 0; i < GETS; i++) {
        r = next_reply(c, &len);
        ck_assert_uint_eq(len, one);
        ck_assert_int_eq(memcmp(r + 10, v, VLEN), 0);
        free(r);
    }
    r = next_reply(c, &len);
    ck_assert_uint_eq(len, 5 + KEYS * one);
    ck_assert_int_eq(memcmp(r, "*30\r\n$1048576\r\n", 15), 0);
    ck_assert_int_eq(memcmp(r + 5 + (KEYS - 1) * one + 10, v, VLEN), 0);
    free(r);
    ck_assert_int_eq(cmds_run, GETS + 1);
    CMD(c, "PING");
    expect(c, "+PONG\r\n");
    free(v);
    free(cmd);
    conn_close(c);
}
END_TEST

/* ---- partial input and peers that go away ---- */

START_TEST(split_commands_parse)
{
    struct conn *c = conn_open();
    const char *m = "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nva\r\nl\r\n";
    const char *p = "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\nGET key\r\n*1\r\n$4\r\nPING\r\n";

    for (const char *s = m; *s; s++) {
        conn_send(c, s, 1);
        pump();
    }
    expect(c, "+OK\r\n");
    /* a pipeline split at every point into two writes */
    for (size_t cut = 1; cut < strlen(p); cut++) {
        conn_send(c, p, cut);
        pump();
        conn_send(c, p + cut, strlen(p) - cut);
        expect(c, "$5\r\nva\r\nl\r\n$5\r\nva\r\nl\r\n+PONG\r\n");
    }
    conn_close(c);
}
END_TEST

START_TEST(disconnect_mid_command)
{
    struct conn *a = conn_open(), *b = conn_open(), *d;
    char *r;

    CMD(b, "PING");
    expect(b, "+PONG\r\n");
    conn_sends(a, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nabc");
    for (int i = 0; i < 5; i++)
        pump();
    conn_close(a);
    /* and one that resets with unread replies pending */
    d = conn_open();
    conn_sends(d, "PING\r\nPING\r\n");
    for (int i = 0; i < 5; i++)
        pump();
    {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};

        setsockopt(d->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    conn_close(d);
    for (int i = 0; i < 5; i++)
        pump();
    CMD(b, "EXISTS", "k");
    expect(b, ":0\r\n");
    CMD(b, "SET", "j", "1");
    expect(b, "+OK\r\n");
    CMD(b, "INFO", "clients");
    r = next_reply(b, NULL);
    ck_assert_msg(strstr(r, "connected_clients:1\r\n"), "%s", r);
    free(r);
    conn_close(b);
}
END_TEST

START_TEST(max_clients_refused)
{
    struct resp_config cfg = {.max_clients = 2};
    struct conn *a, *b, *c;

    gw_close();
    gw_open(&cfg);
    a = conn_open();
    b = conn_open();
    CMD(a, "PING");
    expect(a, "+PONG\r\n");
    CMD(b, "PING");
    expect(b, "+PONG\r\n");
    c = conn_open();
    expect(c, "-ERR max number of clients reached\r\n");
    ck_assert(conn_closed(c));
    conn_close(c);
    CMD(a, "PING");
    expect(a, "+PONG\r\n");
    conn_close(a);
    for (int i = 0; i < 3; i++)
        pump();
    c = conn_open();
    CMD(c, "PING");
    expect(c, "+PONG\r\n");
    conn_close(b);
    conn_close(c);
}
END_TEST

/* ---- durability ---- */

START_TEST(acked_set_survives_reopen)
{
    struct conn *c = conn_open();
    const void *val;
    uint32_t len;
    uint64_t version;

    CMD(c, "SET", "persist", "me");
    expect(c, "+OK\r\n");
    CMD(c, "INCR", "n");
    expect(c, ":1\r\n");
    conn_close(c);
    gw_close();
    kvs_close(store);
    store = NULL;
    store_open();
    ck_assert_int_eq(kvs_get(store, "persist", 7, &val, &len, &version), 0);
    ck_assert_uint_eq(len, 2);
    ck_assert_int_eq(memcmp(val, "me", 2), 0);
    gw_open(NULL);
    c = conn_open();
    CMD(c, "GET", "n");
    expect(c, "$1\r\n1\r\n");
    conn_close(c);
}
END_TEST

/* The gateway in a child that is SIGKILLed as soon as the replies are in:
 * whatever was acknowledged must be in the pool. */
START_TEST(acked_sets_survive_kill)
{
    int pfd[2];
    uint16_t port;
    pid_t pid;
    struct conn *c;
    char batch[8192], ok[600];
    size_t n = 0;
    int status;

    gw_close();
    kvs_close(store);
    store = NULL;
    ck_assert_int_eq(pipe(pfd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        store_open();
        gw_open(NULL);
        port = resp_gw_port(gw);
        if (write(pfd[1], &port, sizeof(port)) != sizeof(port))
            _exit(1);
        for (;;)
            resp_gw_poll(gw, 100);
    }
    close(pfd[1]);
    ck_assert_int_eq(read(pfd[0], &port, sizeof(port)), (ssize_t)sizeof(port));
    close(pfd[0]);
    c = conn_open_port(port);
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(batch + n, sizeof(batch) - n, "SET key%d val%d\r\n", i, i);
    ok[0] = '\0';
    for (int i = 0; i < 100; i++)
        strcat(ok, "+OK\r\n");
    conn_send(c, batch, n);
    expect(c, ok);
    kill(pid, SIGKILL);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    conn_close(c);
    store_open();
    ck_assert_uint_eq(kvs_count(store), 100);
    for (int i = 0; i < 100; i++) {
        char key[16], val[16];
        const void *v;
        uint32_t len;
        uint64_t version;

        snprintf(key, sizeof(key), "key%d", i);
        snprintf(val, sizeof(val), "val%d", i);
        ck_assert_int_eq(kvs_get(store, key, strlen(key), &v, &len, &version), 0);
        ck_assert_uint_eq(len, strlen(val));
        ck_assert_int_eq(memcmp(v, val, len), 0);
    }
}
END_TEST

/* N SETs of key `key` with values "%064u" of first..first+n-1, pipelined in
 * one stream; the buffer is the caller's to free. */
static char *set_stream(const char *key, unsigned first, unsigned n, size_t *len)
{
    size_t klen = strlen(key), cap = (size_t)n * (96 + klen) + 1, at = 0;
    char *b = malloc(cap);

    ck_assert_ptr_nonnull(b);
    for (unsigned i = first; i < first + n; i++)
        at += (size_t)snprintf(b + at, cap - at, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$64\r\n%064u\r\n",
                               klen, key, i);
    *len = at;
    return b;
}

/* Until n "+OK" replies are in, consumed. */
static void expect_oks(struct conn *c, unsigned n)
{
    while (n) {
        unsigned k = n < 1000 ? n : 1000;
        char want[5000];

        for (unsigned i = 0; i < k; i++)
            memcpy(want + 5 * i, "+OK\r\n", 5);
        expect_n(c, want, 5 * k);
        n -= k;
    }
}

/* The value of `key` in the store, as the index of set_stream it came from. */
static unsigned stored_index(const char *key)
{
    const void *v;
    uint32_t len;
    uint64_t version;
    char text[65];

    ck_assert_int_eq(kvs_get(store, key, strlen(key), &v, &len, &version), 0);
    ck_assert_uint_eq(len, 64);
    memcpy(text, v, 64);
    text[64] = '\0';
    return (unsigned)strtoul(text, NULL, 10);
}

/* 20 000 SETs of one key through the gateway, pipelined (the gateway runs
 * them in batches with one commit each), then 200 one at a time. As for
 * RPC PUTs (the hybrid update), a SET rewrites one of the key's records in
 * place rather than appending: the log stays within one segment, nothing
 * is cleaned, and the pool reopens with the last value. */
START_TEST(set_one_key_updates_in_place)
{
    enum { PIPELINED = 20000, SINGLE = 200 };
    struct conn *c = conn_open();
    struct kvs_stats st;
    char val[80];
    size_t n;
    char *batch = set_stream("hot", 0, PIPELINED, &n);

    conn_send(c, batch, n);
    expect_oks(c, PIPELINED);
    for (unsigned i = PIPELINED; i < PIPELINED + SINGLE; i++) {
        snprintf(val, sizeof(val), "%064u", i);
        CMD(c, "SET", "hot", val);
        expect(c, "+OK\r\n");
    }
    kvs_get_stats(store, &st);
    ck_assert_msg(st.pool.bytes_committed <= SEG_SIZE,
                  "%llu bytes of log for one key after %u SETs",
                  (unsigned long long)st.pool.bytes_committed, PIPELINED + SINGLE);
    ck_assert_uint_eq(st.segs_cleaned, 0);
    ck_assert_uint_ge(st.in_place, (PIPELINED + SINGLE) * 9 / 10);
    ck_assert_uint_eq(stored_index("hot"), PIPELINED + SINGLE - 1);
    conn_close(c);
    gw_close();
    kvs_close(store);
    store = NULL;
    store_open();
    ck_assert_uint_eq(stored_index("hot"), PIPELINED + SINGLE - 1);
    kvs_get_stats(store, &st);
    ck_assert_uint_le(st.pool.bytes_committed, SEG_SIZE);
    free(batch);
}
END_TEST

/* The same with the gateway in a child SIGKILLed twice: once right after
 * 5000 SETs were acknowledged (the last one must be there), and once while
 * 5000 more are in flight, so that a kill may fall in the middle of a
 * record rewritten in place (the value must then be the last acknowledged
 * one or one of those in flight). The pool must open each time, pass a
 * deep check, and hold the key's log within one segment. */
START_TEST(set_one_key_survives_kill)
{
    enum { N = 5000 };
    struct kvs_stats st;
    uint64_t bad_off = 0;

    gw_close();
    kvs_close(store);
    store = NULL;
    for (int round = 0; round < 2; round++) {
        int pfd[2], status;
        uint16_t port;
        struct conn *c;
        size_t n;
        char *batch;
        pid_t pid;
        unsigned got;

        ck_assert_int_eq(pipe(pfd), 0);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            store_open();
            gw_open(NULL);
            port = resp_gw_port(gw);
            if (write(pfd[1], &port, sizeof(port)) != sizeof(port))
                _exit(1);
            for (;;)
                resp_gw_poll(gw, 100);
        }
        close(pfd[1]);
        ck_assert_int_eq(read(pfd[0], &port, sizeof(port)), (ssize_t)sizeof(port));
        close(pfd[0]);
        c = conn_open_port(port);
        batch = set_stream("hot", round * 2 * N, N, &n);
        conn_send(c, batch, n);
        expect_oks(c, N);
        free(batch);
        if (round == 1) {
            batch = set_stream("hot", round * 2 * N + N, N, &n);
            conn_send(c, batch, n);
            free(batch);
        }
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        conn_close(c);
        ck_assert_msg(pm_check(pool_path, true, NULL, NULL, &bad_off) == 0,
                      "round %d: pool check failed at %llu", round,
                      (unsigned long long)bad_off);
        store_open();
        got = stored_index("hot");
        if (round == 0)
            ck_assert_uint_eq(got, N - 1);
        else
            ck_assert_msg(got >= 2 * N + N - 1 && got < 4 * N, "round 1: value %u", got);
        kvs_get_stats(store, &st);
        ck_assert_msg(st.pool.bytes_committed <= SEG_SIZE, "round %d: %llu bytes of log",
                      round, (unsigned long long)st.pool.bytes_committed);
        kvs_close(store);
        store = NULL;
    }
}
END_TEST

/* ---- real Redis tools ---- */

/* Run a tool with its stdout in `out` while this process serves it. */
static int run_tool(char *const argv[], char *out, size_t cap)
{
    int pfd[2], status = -1;
    size_t len = 0;
    double end = now_ms() + 20000;
    pid_t pid;

    ck_assert_int_eq(pipe(pfd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    for (;;) {
        ssize_t n = read(pfd[0], out + len, cap - 1 - len);
        pid_t w;

        if (n > 0)
            len += (size_t)n;
        w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            while ((n = read(pfd[0], out + len, cap - 1 - len)) > 0)
                len += (size_t)n;
            break;
        }
        ck_assert_msg(now_ms() < end, "%s did not finish", argv[0]);
        pump();
    }
    close(pfd[0]);
    out[len] = '\0';
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Coalescing waits only while several clients are active: a lone client
 * sending as fast as it can, or reconnecting for every command, never makes
 * the gateway sleep; eight clients in one millisecond do, and all of them
 * still get every reply right. */
START_TEST(coalescing_only_under_load)
{
    struct resp_config cfg = {.coalesce_us = 200};
    struct conn *c[8];

    gw_close();
    gw_open(&cfg);
    c[0] = conn_open();
    /* Bursts of commands from one client, each followed by a poll that
     * finds nothing ready: the poll where a busy gateway would sleep. */
    for (int i = 0; i < 60; i++) {
        for (int j = 0; j < 5; j++) {
            conn_sends(c[0], "*1\r\n$4\r\nPING\r\n");     /* one segment */
            expect(c[0], "+PONG\r\n");
        }
        ck_assert_int_eq(resp_gw_poll(gw, 1), 0);
    }
    ck_assert_uint_eq(info_number(c[0], "stats", "tern_coalesced_waits"), 0);
    /* The same from one client that reconnects for every command. */
    for (int i = 0; i < 60; i++) {
        for (int j = 0; j < 5; j++) {
            struct conn *r = conn_open();

            conn_sends(r, "*1\r\n$4\r\nPING\r\n");
            expect(r, "+PONG\r\n");
            conn_close(r);
            pump();     /* the gateway sees the close */
        }
        ck_assert_int_eq(resp_gw_poll(gw, 1), 0);
    }
    ck_assert_uint_eq(info_number(c[0], "stats", "tern_coalesced_waits"), 0);

    for (int i = 1; i < 8; i++)
        c[i] = conn_open();
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 8; i++)
            CMD(c[i], "INCR", "n");
        for (int i = 0; i < 8; i++)
            expect_prefix(c[i], ":");
        usleep(1500);
    }
    pump();     /* the last window saw eight clients and nobody is ready */
    ck_assert_uint_gt(info_number(c[0], "stats", "tern_coalesced_waits"), 0);
    CMD(c[3], "GET", "n");
    expect(c[3], "$2\r\n40\r\n");
    for (int i = 0; i < 8; i++)
        conn_close(c[i]);
}
END_TEST

START_TEST(redis_cli_set_get)
{
    char port[8], out[256];

    if (access("/usr/bin/redis-cli", X_OK) != 0) {
        printf("SKIP: redis-cli not installed\n");
        return;
    }
    snprintf(port, sizeof(port), "%u", resp_gw_port(gw));
    ck_assert_int_eq(run_tool((char *[]){"/usr/bin/redis-cli", "-p", port, "SET", "k", "v", NULL},
                              out, sizeof(out)), 0);
    ck_assert_str_eq(out, "OK\n");
    ck_assert_int_eq(run_tool((char *[]){"/usr/bin/redis-cli", "-p", port, "GET", "k", NULL},
                              out, sizeof(out)), 0);
    ck_assert_str_eq(out, "v\n");
    ck_assert_int_eq(run_tool((char *[]){"/usr/bin/redis-cli", "-p", port, "DBSIZE", NULL},
                              out, sizeof(out)), 0);
    ck_assert_str_eq(out, "1\n");
}
END_TEST

START_TEST(redis_benchmark_runs)
{
    char port[8], out[4096];

    if (access("/usr/bin/redis-benchmark", X_OK) != 0) {
        printf("SKIP: redis-benchmark not installed\n");
        return;
    }
    snprintf(port, sizeof(port), "%u", resp_gw_port(gw));
    ck_assert_int_eq(run_tool((char *[]){"/usr/bin/redis-benchmark", "-p", port, "-t",
                                         "ping,set,get,incr,mset", "-n", "2000", "-c", "4",
                                         "-P", "8", "-q", NULL},
                              out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "SET:") && strstr(out, "GET:") && strstr(out, "MSET"), "%s", out);
    ck_assert_uint_ge(kvs_count(store), 1);
}
END_TEST

Suite *suite_resp(void)
{
    Suite *s = suite_create("resp");
    TCase *cmds = tcase_create("commands");
    TCase *proto = tcase_create("protocol");
    TCase *dur = tcase_create("durability");
    TCase *tools = tcase_create("tools");

    tcase_add_checked_fixture(cmds, setup, teardown);
    tcase_set_timeout(cmds, 30);
    tcase_add_test(cmds, ping_and_echo);
    tcase_add_test(cmds, set_get_binary_safe);
    tcase_add_test(cmds, get_missing_is_null);
    tcase_add_test(cmds, pipelined_sets);
    tcase_add_test(cmds, del_and_exists_count);
    tcase_add_test(cmds, mget_and_mset);
    tcase_add_test(cmds, incr_semantics);
    tcase_add_test(cmds, dbsize_and_flushdb);
    tcase_add_test(cmds, set_options);
    tcase_add_test(cmds, info_config_and_friends);
    tcase_add_test(cmds, command_tells_what_is_served);
    tcase_add_test(cmds, client_and_hello);
    tcase_add_test(cmds, unknown_command_and_arity);
    tcase_add_test(cmds, quit_closes_after_reply);
    tcase_add_test(cmds, value_over_val_max_keeps_old);
    suite_add_tcase(s, cmds);

    tcase_add_checked_fixture(proto, setup, teardown);
    tcase_set_timeout(proto, 60);
    tcase_add_test(proto, inline_commands);
    tcase_add_test(proto, protocol_errors_close_only_that_client);
    tcase_add_test(proto, oversized_requests);
    tcase_add_test(proto, slow_reader_gets_everything);
    tcase_add_test(proto, backlog_stalls_then_resumes);
    tcase_add_test(proto, mget_reply_held_to_output_cap);
    tcase_add_test(proto, big_reply_waits_for_output_to_drain);
    tcase_add_test(proto, split_commands_parse);
    tcase_add_test(proto, disconnect_mid_command);
    tcase_add_test(proto, max_clients_refused);
    tcase_add_test(proto, coalescing_only_under_load);
    suite_add_tcase(s, proto);

    tcase_add_checked_fixture(dur, setup, teardown);
    tcase_set_timeout(dur, 30);
    tcase_add_test(dur, reply_after_sync);
    tcase_add_test(dur, sync_failure_fails_writes);
    tcase_add_test(dur, acked_set_survives_reopen);
    tcase_add_test(dur, acked_sets_survive_kill);
    tcase_add_test(dur, set_one_key_updates_in_place);
    tcase_add_test(dur, set_one_key_survives_kill);
    suite_add_tcase(s, dur);

    tcase_add_checked_fixture(tools, setup, teardown);
    tcase_set_timeout(tools, 60);
    tcase_add_test(tools, redis_cli_set_get);
    tcase_add_test(tools, redis_benchmark_runs);
    suite_add_tcase(s, tools);
    return s;
}
