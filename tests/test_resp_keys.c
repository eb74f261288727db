/* The RESP gateway's expiry and key commands (services/kv/resp_keys.c),
 * byte for byte against what Redis 7 answers. Deadlines are judged by a
 * clock the test moves (kvs_now_ms), so nothing here waits for time to
 * pass except the background removal, which runs on the gateway's own
 * 100 ms beat. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "resp_harness.h"
#include "suites.h"

static uint64_t fake_now = 1700000000000ull;

static uint64_t fake_clock(void)
{
    return fake_now;
}

static void keys_setup(void)
{
    kvs_now_ms = fake_clock;
    setup();
}

static void keys_teardown(void)
{
    teardown();
}

/* Check's fork mode runs each test in its own child, so the clock starts
 * where the fixture sets it. */
static void advance(uint64_t ms)
{
    fake_now += ms;
}

/* EX/PX/EXAT/PXAT on SET, TTL and PTTL counting down, and the key gone at
 * its deadline to every reader. */
START_TEST(set_with_deadlines)
{
    struct conn *c = conn_open();
    char at[32];

    CMD(c, "SET", "k", "v", "EX", "10");
    expect(c, "+OK\r\n");
    CMD(c, "TTL", "k");
    expect(c, ":10\r\n");
    CMD(c, "PTTL", "k");
    expect(c, ":10000\r\n");
    advance(4400);
    CMD(c, "TTL", "k");
    expect(c, ":6\r\n");            /* 5.6 s rounds to 6, as in Redis */
    CMD(c, "GET", "k");
    expect(c, "$1\r\nv\r\n");
    advance(5600);
    CMD(c, "GET", "k");
    expect(c, "$-1\r\n");
    CMD(c, "EXISTS", "k");
    expect(c, ":0\r\n");
    CMD(c, "TTL", "k");
    expect(c, ":-2\r\n");
    CMD(c, "DEL", "k");
    expect(c, ":0\r\n");
    CMD(c, "SET", "k", "v", "NX");  /* an expired key is no obstacle to NX */
    expect(c, "+OK\r\n");
    CMD(c, "TTL", "k");
    expect(c, ":-1\r\n");
    CMD(c, "SET", "p", "v", "PX", "1500");
    expect(c, "+OK\r\n");
    CMD(c, "PTTL", "p");
    expect(c, ":1500\r\n");
    snprintf(at, sizeof(at), "%llu", (unsigned long long)(fake_now / 1000 + 100));
    CMD(c, "SET", "a", "v", "EXAT", at);
    expect(c, "+OK\r\n");
    CMD(c, "TTL", "a");
    expect(c, ":100\r\n");
    snprintf(at, sizeof(at), "%llu", (unsigned long long)(fake_now + 250));
    CMD(c, "SET", "a", "w", "PXAT", at);
    expect(c, "+OK\r\n");
    CMD(c, "PTTL", "a");
    expect(c, ":250\r\n");
    CMD(c, "SET", "a", "x", "KEEPTTL");
    expect(c, "+OK\r\n");
    CMD(c, "PTTL", "a");
    expect(c, ":250\r\n");
    CMD(c, "SET", "a", "y");        /* a plain SET drops the deadline */
    expect(c, "+OK\r\n");
    CMD(c, "TTL", "a");
    expect(c, ":-1\r\n");
    CMD(c, "SET", "a", "z", "GET", "EX", "5");
    expect(c, "$1\r\ny\r\n");
    CMD(c, "SET", "a", "q", "NX", "GET");
    expect(c, "$1\r\nz\r\n");       /* not set, old value back */
    CMD(c, "GET", "a");
    expect(c, "$1\r\nz\r\n");
    CMD(c, "SET", "nope", "q", "GET");
    expect(c, "$-1\r\n");
    CMD(c, "SETEX", "s", "3", "v");
    expect(c, "+OK\r\n");
    CMD(c, "TTL", "s");
    expect(c, ":3\r\n");
    CMD(c, "PSETEX", "s", "700", "v");
    expect(c, "+OK\r\n");
    CMD(c, "PTTL", "s");
    expect(c, ":700\r\n");
    CMD(c, "SETEX", "s", "0", "v");
    expect(c, "-ERR invalid expire time in 'setex' command\r\n");
    CMD(c, "PSETEX", "s", "-5", "v");
    expect(c, "-ERR invalid expire time in 'psetex' command\r\n");
    CMD(c, "SETEX", "s", "x", "v");
    expect(c, "-ERR value is not an integer or out of range\r\n");
    conn_close(c);
}
END_TEST

START_TEST(expire_and_its_options)
{
    struct conn *c = conn_open();
    char at[32];

    CMD(c, "EXPIRE", "none", "10");
    expect(c, ":0\r\n");
    CMD(c, "SET", "k", "v");
    expect(c, "+OK\r\n");
    CMD(c, "EXPIRE", "k", "10", "XX");
    expect(c, ":0\r\n");
    CMD(c, "EXPIRE", "k", "10", "GT");  /* no deadline counts as infinite */
    expect(c, ":0\r\n");
    CMD(c, "EXPIRE", "k", "10", "NX");
    expect(c, ":1\r\n");
    CMD(c, "EXPIRE", "k", "20", "NX");
    expect(c, ":0\r\n");
    CMD(c, "EXPIRE", "k", "5", "GT");
    expect(c, ":0\r\n");
    CMD(c, "EXPIRE", "k", "20", "GT");
    expect(c, ":1\r\n");
    CMD(c, "EXPIRE", "k", "30", "LT");
    expect(c, ":0\r\n");
    CMD(c, "PEXPIRE", "k", "1500", "LT");
    expect(c, ":1\r\n");
    CMD(c, "PTTL", "k");
    expect(c, ":1500\r\n");
    CMD(c, "GET", "k");
    expect(c, "$1\r\nv\r\n");         /* the value is untouched */
    CMD(c, "EXPIRE", "k", "1", "NX", "XX");
    expect(c, "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n");
    CMD(c, "EXPIRE", "k", "1", "GT", "LT");
    expect(c, "-ERR GT and LT options at the same time are not compatible\r\n");
    CMD(c, "EXPIRE", "k", "1", "SOON");
    expect(c, "-ERR Unsupported option SOON\r\n");
    CMD(c, "EXPIRE", "k", "1.5");
    expect(c, "-ERR value is not an integer or out of range\r\n");
    CMD(c, "EXPIRE", "k", "9223372036854775807");
    expect(c, "-ERR invalid expire time in 'expire' command\r\n");
    CMD(c, "PERSIST", "k");
    expect(c, ":1\r\n");
    CMD(c, "PERSIST", "k");
    expect(c, ":0\r\n");
    CMD(c, "TTL", "k");
    expect(c, ":-1\r\n");
    snprintf(at, sizeof(at), "%llu", (unsigned long long)(fake_now / 1000 + 60));
    CMD(c, "EXPIREAT", "k", at);
    expect(c, ":1\r\n");
    CMD(c, "TTL", "k");
    expect(c, ":60\r\n");
    snprintf(at, sizeof(at), "%llu", (unsigned long long)(fake_now + 42));
    CMD(c, "PEXPIREAT", "k", at);
    expect(c, ":1\r\n");
    CMD(c, "PTTL", "k");
    expect(c, ":42\r\n");
    /* A deadline in the past deletes the key at once. */
    CMD(c, "EXPIRE", "k", "-1");
    expect(c, ":1\r\n");
    CMD(c, "EXISTS", "k");
    expect(c, ":0\r\n");
    CMD(c, "DBSIZE");
    expect(c, ":0\r\n");
    conn_close(c);
}
END_TEST

/* Commands that rewrite a value keep its deadline; GETEX sets or drops
 * it; GETDEL takes the key. */
START_TEST(rewrites_keep_the_deadline)
{
    struct conn *c = conn_open();

    CMD(c, "SET", "n", "41", "EX", "100");
    expect(c, "+OK\r\n");
    CMD(c, "INCR", "n");
    expect(c, ":42\r\n");
    CMD(c, "TTL", "n");
    expect(c, ":100\r\n");
    CMD(c, "APPEND", "n", "0");
    expect(c, ":3\r\n");
    CMD(c, "TTL", "n");
    expect(c, ":100\r\n");
    CMD(c, "SETRANGE", "n", "0", "1");
    expect(c, ":3\r\n");
    CMD(c, "GET", "n");
    expect(c, "$3\r\n120\r\n");
    CMD(c, "TTL", "n");
    expect(c, ":100\r\n");
    CMD(c, "RENAME", "n", "m");
    expect(c, "+OK\r\n");
    CMD(c, "TTL", "m");
    expect(c, ":100\r\n");
    CMD(c, "EXISTS", "n");
    expect(c, ":0\r\n");
    CMD(c, "GETEX", "m", "EX", "7");
    expect(c, "$3\r\n120\r\n");
    CMD(c, "TTL", "m");
    expect(c, ":7\r\n");
    CMD(c, "GETEX", "m");
    expect(c, "$3\r\n120\r\n");
    CMD(c, "TTL", "m");
    expect(c, ":7\r\n");
    CMD(c, "GETEX", "m", "PERSIST");
    expect(c, "$3\r\n120\r\n");
    CMD(c, "TTL", "m");
    expect(c, ":-1\r\n");
    CMD(c, "GETEX", "m", "KEEPTTL");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "GETEX", "none", "EX", "5");
    expect(c, "$-1\r\n");
    CMD(c, "GETDEL", "m");
    expect(c, "$3\r\n120\r\n");
    CMD(c, "GETDEL", "m");
    expect(c, "$-1\r\n");
    conn_close(c);
}
END_TEST

/* Keys and collections past their deadline that nobody touches are
 * removed by the gateway's poll within about 100 ms: DBSIZE falls, INFO
 * counts them. */
START_TEST(background_removal)
{
    struct conn *c = conn_open();
    char key[16];
    uint64_t keys = 1;
    double end;

    CMD(c, "SET", "stays", "v", "EX", "1000");
    expect(c, "+OK\r\n");
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof(key), "t%d", i);
        CMD(c, "SET", key, "v", "PX", "100");
        expect(c, "+OK\r\n");
    }
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "l%d", i);
        CMD(c, "RPUSH", key, "a", "b");
        expect(c, ":2\r\n");
        CMD(c, "PEXPIRE", key, "100");
        expect(c, ":1\r\n");
    }
    CMD(c, "DBSIZE");
    expect(c, ":56\r\n");
    ck_assert_uint_eq(kvs_expiring(store), 51);
    advance(101);
    end = now_ms() + WAIT_MS;
    while (now_ms() < end && ((keys = kvs_count(store)) != 1 || kvc_count(coll)))
        pump();
    ck_assert_uint_eq(keys, 1);
    ck_assert_uint_eq(kvc_count(coll), 0);
    ck_assert_uint_eq(kvs_expiring(store), 1);
    /* Collections count too, as in Redis. */
    ck_assert_uint_eq(info_number(c, "stats", "expired_keys"), 55);
    CMD(c, "INFO", "keyspace");
    char *r = next_reply(c, NULL);

    ck_assert_msg(strstr(r, "db0:keys=1,expires=1,"), "%s", r);
    free(r);
    conn_close(c);
}
END_TEST

/* Deadlines are in the records: a reopened store has them, and a key
 * that expired while it was closed is absent, then removed. */
START_TEST(deadlines_survive_reopen)
{
    struct conn *c = conn_open();

    CMD(c, "SET", "short", "v", "EX", "2");
    expect(c, "+OK\r\n");
    CMD(c, "SET", "long", "v", "EX", "100");
    expect(c, "+OK\r\n");
    conn_close(c);
    gw_close();
    kvs_close(store);
    store = NULL;
    advance(1000);
    store_open();
    gw_open(NULL);
    c = conn_open();
    CMD(c, "TTL", "short");
    expect(c, ":1\r\n");
    CMD(c, "TTL", "long");
    expect(c, ":99\r\n");
    ck_assert_uint_eq(kvs_expiring(store), 2);
    conn_close(c);
    gw_close();
    kvs_close(store);
    store = NULL;
    advance(1500);
    store_open();
    gw_open(NULL);
    c = conn_open();
    CMD(c, "GET", "short");
    expect(c, "$-1\r\n");
    /* The gateway's first poll after the open removed it for good. */
    CMD(c, "DBSIZE");
    expect(c, ":1\r\n");
    ck_assert_uint_eq(kvs_expiring(store), 1);
    ck_assert_uint_eq(kvs_expire(store, fake_now, 100), 0);
    conn_close(c);
}
END_TEST

START_TEST(type_strlen_ranges)
{
    struct conn *c = conn_open();

    CMD(c, "SET", "s", "Hello World");
    expect(c, "+OK\r\n");
    CMD(c, "TYPE", "s");
    expect(c, "+string\r\n");
    CMD(c, "TYPE", "none");
    expect(c, "+none\r\n");
    CMD(c, "STRLEN", "s");
    expect(c, ":11\r\n");
    CMD(c, "STRLEN", "none");
    expect(c, ":0\r\n");
    CMD(c, "GETRANGE", "s", "0", "4");
    expect(c, "$5\r\nHello\r\n");
    CMD(c, "GETRANGE", "s", "-5", "-1");
    expect(c, "$5\r\nWorld\r\n");
    CMD(c, "GETRANGE", "s", "-3", "-5");
    expect(c, "$0\r\n\r\n");
    CMD(c, "GETRANGE", "s", "5", "100");
    expect(c, "$6\r\n World\r\n");
    CMD(c, "GETRANGE", "s", "20", "30");
    expect(c, "$0\r\n\r\n");
    CMD(c, "GETRANGE", "none", "0", "-1");
    expect(c, "$0\r\n\r\n");
    CMD(c, "GETRANGE", "s", "a", "1");
    expect(c, "-ERR value is not an integer or out of range\r\n");
    CMD(c, "SETRANGE", "s", "6", "Redis");
    expect(c, ":11\r\n");
    CMD(c, "GET", "s");
    expect(c, "$11\r\nHello Redis\r\n");
    CMD(c, "SETRANGE", "z", "3", "ab");
    expect(c, ":5\r\n");
    CMD(c, "GET", "z");
    expect_n(c, "$5\r\n\0\0\0ab\r\n", 11);
    CMD(c, "SETRANGE", "empty", "5", "");
    expect(c, ":0\r\n");
    CMD(c, "EXISTS", "empty");
    expect(c, ":0\r\n");
    CMD(c, "SETRANGE", "s", "-1", "x");
    expect(c, "-ERR offset is out of range\r\n");
    CMD(c, "SETRANGE", "s", "536870912", "x");
    expect(c, "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n");
    CMD(c, "SETRANGE", "s", "9000000", "x");    /* past what the pool holds */
    expect(c, "-ERR value too large for the store\r\n");
    CMD(c, "APPEND", "new", "ab");
    expect(c, ":2\r\n");
    CMD(c, "APPEND", "new", "cd");
    expect(c, ":4\r\n");
    CMD(c, "GET", "new");
    expect(c, "$4\r\nabcd\r\n");
    conn_close(c);
}
END_TEST

START_TEST(rename_msetnx_unlink)
{
    struct conn *c = conn_open();

    CMD(c, "RENAME", "none", "x");
    expect(c, "-ERR no such key\r\n");
    CMD(c, "RENAMENX", "none", "x");
    expect(c, "-ERR no such key\r\n");
    CMD(c, "MSETNX", "a", "1", "b", "2");
    expect(c, ":1\r\n");
    CMD(c, "MSETNX", "b", "3", "c", "4");
    expect(c, ":0\r\n");
    CMD(c, "EXISTS", "c");
    expect(c, ":0\r\n");
    CMD(c, "MSETNX", "b", "3", "c");
    expect(c, "-ERR wrong number of arguments for 'msetnx' command\r\n");
    CMD(c, "RENAMENX", "a", "b");
    expect(c, ":0\r\n");
    CMD(c, "RENAMENX", "a", "c");
    expect(c, ":1\r\n");
    CMD(c, "GET", "c");
    expect(c, "$1\r\n1\r\n");
    CMD(c, "RENAME", "c", "b");     /* overwrites */
    expect(c, "+OK\r\n");
    CMD(c, "GET", "b");
    expect(c, "$1\r\n1\r\n");
    CMD(c, "RENAME", "b", "b");
    expect(c, "+OK\r\n");
    CMD(c, "UNLINK", "b", "none", "a");
    expect(c, ":1\r\n");
    CMD(c, "DBSIZE");
    expect(c, ":0\r\n");
    CMD(c, "RANDOMKEY");
    expect(c, "$-1\r\n");
    CMD(c, "SET", "only", "v");
    expect(c, "+OK\r\n");
    CMD(c, "RANDOMKEY");
    expect(c, "$4\r\nonly\r\n");
    conn_close(c);
}
END_TEST

/* The keys of a SCAN reply, counted into seen[] by their number. */
static uint64_t scan_step(struct conn *c, const char *cursor, const char *const *opts,
                          unsigned char *seen, size_t n_seen, unsigned *n_keys)
{
    const char *argv[12] = {"SCAN", cursor};
    size_t lens[12];
    int argc = 2;
    char *r, *p;
    uint64_t next;
    long count;

    for (; opts && *opts; opts++)
        argv[argc++] = *opts;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    conn_cmdv(c, argc, argv, lens);
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, "*2\r\n$", 5) == 0, "%s", show(r, strlen(r)));
    p = strchr(r + 5, '\n') + 1;
    next = strtoull(p, &p, 10);
    p = strchr(p, '*') + 1;
    count = strtol(p, &p, 10);
    *n_keys += (unsigned)count;
    for (long i = 0; i < count; i++) {
        long len, k;

        p = strchr(p, '$') + 1;
        len = strtol(p, &p, 10);
        p += 2;
        if (sscanf(p, "key:%ld", &k) == 1 && k >= 0 && (size_t)k < n_seen)
            seen[k]++;
        p += len;
    }
    free(r);
    return next;
}

/* SCAN with MATCH, COUNT and TYPE; KEYS with Redis's glob. */
START_TEST(scan_and_keys)
{
    struct conn *c = conn_open();
    unsigned char seen[300] = {0};
    unsigned n = 0, calls = 0;
    char cursor[24] = "0", key[16];
    uint64_t next;
    char *r;

    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "key:%d", i);
        CMD(c, "SET", key, "v");
        expect(c, "+OK\r\n");
    }
    CMD(c, "SET", "other", "v");
    expect(c, "+OK\r\n");
    do {
        next = scan_step(c, cursor, (const char *const[]){"COUNT", "7", NULL}, seen, 300, &n);
        snprintf(cursor, sizeof(cursor), "%llu", (unsigned long long)next);
        calls++;
    } while (next);
    ck_assert_uint_gt(calls, 10);
    for (int i = 0; i < 300; i++)
        ck_assert_msg(seen[i] == 1, "key:%d seen %d times", i, seen[i]);
    ck_assert_uint_eq(n, 301);
    memset(seen, 0, sizeof(seen));
    n = 0;
    strcpy(cursor, "0");
    do {
        next = scan_step(c, cursor, (const char *const[]){"MATCH", "key:1?", "COUNT", "1000", NULL},
                         seen, 300, &n);
        snprintf(cursor, sizeof(cursor), "%llu", (unsigned long long)next);
    } while (next);
    ck_assert_uint_eq(n, 10);
    for (int i = 10; i < 20; i++)
        ck_assert_int_eq(seen[i], 1);
    n = 0;
    next = scan_step(c, "0", (const char *const[]){"TYPE", "list", "COUNT", "1000", NULL}, seen,
                     300, &n);
    ck_assert_uint_eq(n, 0);
    CMD(c, "SCAN", "abc");
    expect(c, "-ERR invalid cursor\r\n");
    CMD(c, "SCAN", "0", "COUNT", "0");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "SCAN", "0", "MATCH");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "SCAN", "0", "SORT", "x");
    expect(c, "-ERR syntax error\r\n");
    CMD(c, "KEYS", "key:2[0-3]?");
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, "*40\r\n", 5) == 0, "%.40s", r);
    free(r);
    CMD(c, "KEYS", "[^k]*");
    expect(c, "*1\r\n$5\r\nother\r\n");
    CMD(c, "KEYS", "oth\\er");
    expect(c, "*1\r\n$5\r\nother\r\n");
    CMD(c, "KEYS", "*x*");
    expect(c, "*0\r\n");
    CMD(c, "KEYS", "*");
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, "*301\r\n", 6) == 0, "%.40s", r);
    free(r);
    conn_close(c);
}
END_TEST

/* Many stars against a long key that does not match: Redis's naive glob
 * took exponential time here (CVE-2022-36021); this one must not. */
START_TEST(glob_has_no_exponential_case)
{
    struct conn *c = conn_open();
    char key[200], pat[64];
    double t0;

    memset(key, 'a', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    CMD(c, "SET", key, "v");
    expect(c, "+OK\r\n");
    strcpy(pat, "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b");
    t0 = now_ms();
    CMD(c, "KEYS", pat);
    expect(c, "*0\r\n");
    ck_assert_msg(now_ms() - t0 < 2000, "KEYS took %.0f ms", now_ms() - t0);
    conn_close(c);
}
END_TEST

Suite *suite_resp_keys(void)
{
    Suite *s = suite_create("resp_keys");
    TCase *tc = tcase_create("keys");

    tcase_add_checked_fixture(tc, keys_setup, keys_teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, set_with_deadlines);
    tcase_add_test(tc, expire_and_its_options);
    tcase_add_test(tc, rewrites_keep_the_deadline);
    tcase_add_test(tc, background_removal);
    tcase_add_test(tc, deadlines_survive_reopen);
    tcase_add_test(tc, type_strlen_ranges);
    tcase_add_test(tc, rename_msetnx_unlink);
    tcase_add_test(tc, scan_and_keys);
    tcase_add_test(tc, glob_has_no_exponential_case);
    suite_add_tcase(s, tc);
    return s;
}
