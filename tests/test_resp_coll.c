/* The RESP gateway's lists, hashes, sets and sorted sets: Redis 7.0's
 * replies, replayed from a recording (resp_coll.txt, made against
 * redis-server by tools/resp-diff.py), and what a recording cannot show:
 * keys that are both a string and a collection, SCAN across the two
 * stores, the output cap, a failed sync. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "resp_harness.h"
#include "resp_parse.h"
#include "suites.h"

/* Undo tools/resp-diff.py's esc(): \r \n \\ \s \xNN. */
static size_t unesc(const char *s, size_t n, char *out)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            out[o++] = s[i];
            continue;
        }
        switch (s[++i]) {
        case 'r':
            out[o++] = '\r';
            break;
        case 'n':
            out[o++] = '\n';
            break;
        case 's':
            out[o++] = ' ';
            break;
        case 'x': {
            unsigned v = 0;

            ck_assert_int_eq(sscanf(s + i + 1, "%2x", &v), 1);
            out[o++] = (char)v;
            i += 2;
            break;
        }
        default:
            out[o++] = s[i];
        }
    }
    return o;
}

START_TEST(recorded_replies)
{
    FILE *f = fopen(TERN_TESTS_DIR "/resp_coll.txt", "r");
    struct conn *c = conn_open();
    char line[8192], words[64][512], want[8192];
    const char *argv[64];
    size_t lens[64], wlen = 0;
    int argc = 0, n = 0, lineno = 0;

    ck_assert_msg(f != NULL, "%s/resp_coll.txt", TERN_TESTS_DIR);
    CMD(c, "FLUSHALL");
    expect(c, "+OK\r\n");
    while (fgets(line, sizeof(line), f)) {
        size_t len = strcspn(line, "\n");

        lineno++;
        line[len] = 0;
        if (line[0] == '>') {
            argc = 0;
            for (char *w = strtok(line + 2, " "); w; w = strtok(NULL, " ")) {
                ck_assert_int_lt(argc, 64);
                lens[argc] = unesc(w, strlen(w), words[argc]);
                argv[argc] = words[argc];
                argc++;
            }
        } else if (line[0] == '<') {
            bool loose = line[1] == '~';
            char *got;
            size_t glen;

            wlen = unesc(line + (loose ? 3 : 2), len - (loose ? 3 : 2), want);
            conn_cmdv(c, argc, argv, lens);
            got = next_reply(c, &glen);
            if (loose)
                ck_assert_msg(got[0] == want[0], "line %d: got %s", lineno, show(got, glen));
            else
                ck_assert_msg(glen == wlen && memcmp(got, want, wlen) == 0,
                              "line %d (%.*s): got %s", lineno, (int)lens[0], argv[0],
                              show(got, glen));
            free(got);
            n++;
        }
    }
    fclose(f);
    ck_assert_int_gt(n, 200);
    conn_close(c);
}
END_TEST

/* A key both a string and a collection (a native put of a list's key, or
 * a crash between the two stores' syncs): the string wins, at once for
 * the collection commands and for good when the gateway starts. */
START_TEST(string_wins_over_collection)
{
    struct conn *c = conn_open();

    CMD(c, "RPUSH", "both", "a", "b");
    expect(c, ":2\r\n");
    CMD(c, "SADD", "later", "x");
    expect(c, ":1\r\n");
    ck_assert_int_eq(kvs_put(store, "both", 4, "str", 3, 0, NULL), 0);
    CMD(c, "GET", "both");
    expect(c, "$3\r\nstr\r\n");
    CMD(c, "TYPE", "both");
    expect(c, "+string\r\n");
    CMD(c, "LLEN", "both");
    expect(c, "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
    CMD(c, "DEL", "both");
    expect(c, ":1\r\n");
    CMD(c, "EXISTS", "both");
    expect(c, ":0\r\n");        /* the list went when the string was seen */
    conn_close(c);

    /* At start: a collection whose key a string took meanwhile. */
    ck_assert_int_eq(kvs_put(store, "later", 5, "s", 1, 0, NULL), 0);
    gw_close();
    gw_open(NULL);
    ck_assert_ptr_null(kvc_find(coll, "later", 5));
    c = conn_open();
    CMD(c, "TYPE", "later");
    expect(c, "+string\r\n");
    CMD(c, "DBSIZE");
    expect(c, ":1\r\n");
    conn_close(c);
}
END_TEST

/* SCAN walks the strings, then the collections: every key present for the
 * whole scan comes back, of either kind, while collections come and go
 * between the calls; TYPE picks one kind. */
START_TEST(scan_covers_both_stores)
{
    struct conn *c = conn_open(), *w = conn_open();
    char key[32], cursor[32] = "0", *r;
    bool seen[400] = {false};
    int calls = 0, churn = 0;

    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        if (i % 2)
            CMD(w, "SET", key, "v");
        else
            CMD(w, i % 4 ? "SADD" : "RPUSH", key, "m");
        r = next_reply(w, NULL);
        free(r);
    }
    do {
        char *p, *end;

        CMD(c, "SCAN", cursor, "COUNT", "7");
        r = next_reply(c, NULL);
        /* *2 $n cursor *k $n key ... */
        p = strchr(r + 4, '\n') + 1;
        end = strchr(p, '\r');
        snprintf(cursor, sizeof(cursor), "%.*s", (int)(end - p), p);
        p = strchr(strchr(end + 2, '\n') + 1, '$');
        while (p) {
            int i;

            p = strchr(p, '\n') + 1;
            if (sscanf(p, "k%d\r", &i) == 1 && i >= 0 && i < 400)
                seen[i] = true;
            p = strchr(p, '$');
        }
        free(r);
        /* Churn: collections made and deleted between the calls. */
        for (int j = 0; j < 20; j++) {
            snprintf(key, sizeof(key), "churn%d", churn + j);
            CMD(w, "ZADD", key, "1", "m");
            free(next_reply(w, NULL));
        }
        for (int j = 0; j < 20; j++) {
            if (j % 10 == 0)
                continue;       /* two of each 20 stay: the map grows */
            snprintf(key, sizeof(key), "churn%d", churn + j);
            CMD(w, "DEL", key);
            free(next_reply(w, NULL));
        }
        churn += 20;
        calls++;
    } while (strcmp(cursor, "0") != 0 && calls < 10000);
    for (int i = 0; i < 400; i++)
        ck_assert_msg(seen[i], "SCAN missed k%d (%s) after %d calls", i,
                      i % 2 ? "a string" : "a collection", calls);
    ck_assert_int_gt(churn, 400);      /* the map grew and shrank many times */

    CMD(c, "SCAN", "0", "TYPE", "zset", "COUNT", "100000");
    r = next_reply(c, NULL);
    ck_assert_ptr_null(strstr(r, "k"));
    free(r);
    /* A collection cursor: continues with collections only. */
    CMD(c, "SCAN", "4611686018427387904", "TYPE", "list", "COUNT", "100000");
    r = next_reply(c, NULL);
    ck_assert_ptr_nonnull(strstr(r, "$2\r\nk0\r\n"));
    ck_assert_ptr_null(strstr(r, "$2\r\nk1\r\n"));
    free(r);
    conn_close(c);
    conn_close(w);
}
END_TEST

/* A reply over the client's output cap is refused whole, and a pop that
 * cannot be told takes nothing. */
START_TEST(output_cap_takes_nothing)
{
    struct resp_config cfg = {.max_output = 4096};
    struct conn *c;
    char v[200];

    gw_close();
    gw_open(&cfg);
    c = conn_open();
    memset(v, 'v', sizeof(v));
    v[sizeof(v) - 1] = 0;
    for (int i = 0; i < 100; i++) {
        CMD(c, "RPUSH", "big", v);
        free(next_reply(c, NULL));
        CMD(c, "SADD", "bigset", v + (i % 150), "x");
        free(next_reply(c, NULL));
    }
    CMD(c, "LRANGE", "big", "0", "-1");
    expect_prefix(c, "-ERR");
    CMD(c, "LPOP", "big", "100");
    expect_prefix(c, "-ERR");
    CMD(c, "LLEN", "big");
    expect(c, ":100\r\n");
    CMD(c, "SPOP", "bigset", "100");
    expect_prefix(c, "-ERR");
    CMD(c, "SCARD", "bigset");
    expect(c, ":101\r\n");
    CMD(c, "LINDEX", "big", "-1");
    expect_prefix(c, "$199\r\n");
    conn_close(c);
}
END_TEST

static int failing_sync(struct kvs *s)
{
    (void)s;
    return TERN_EIO;
}

/* A batch whose sync fails answers every write of it with an error, the
 * collections' as the strings'. */
START_TEST(failed_sync_is_reported)
{
    struct conn *c = conn_open();

    resp_sync_fn = failing_sync;
    CMD(c, "LPUSH", "l", "a");
    expect_prefix(c, "-ERR write not persisted");
    CMD(c, "ZADD", "z", "1", "m");
    expect_prefix(c, "-ERR write not persisted");
    resp_sync_fn = kvs_sync;
    CMD(c, "ZSCORE", "z", "m");
    expect(c, "$1\r\n1\r\n");
    conn_close(c);
}
END_TEST

/* Without an engine the collection commands say so; strings work. */
START_TEST(no_engine)
{
    struct resp_config cfg = {0};
    struct kvc *keep = coll;
    struct conn *c;

    gw_close();
    coll = NULL;
    gw_open(&cfg);
    coll = keep;
    c = conn_open();
    CMD(c, "LPUSH", "l", "a");
    expect(c, "-ERR this gateway has no pool for lists, hashes, sets and sorted sets\r\n");
    CMD(c, "SET", "l", "a");
    expect(c, "+OK\r\n");
    CMD(c, "TYPE", "l");
    expect(c, "+string\r\n");
    conn_close(c);
}
END_TEST

Suite *suite_resp_coll(void)
{
    Suite *s = suite_create("resp_coll");
    TCase *tc = tcase_create("collections");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, recorded_replies);
    tcase_add_test(tc, string_wins_over_collection);
    tcase_add_test(tc, scan_covers_both_stores);
    tcase_add_test(tc, output_cap_takes_nothing);
    tcase_add_test(tc, failed_sync_is_reported);
    tcase_add_test(tc, no_engine);
    suite_add_tcase(s, tc);
    return s;
}
