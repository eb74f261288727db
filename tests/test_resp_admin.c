/* The RESP gateway's server commands (services/kv/resp_admin.c): INFO's
 * sections with the fields redis-cli --stat and exporters read, CONFIG
 * GET/SET/HELP/RESETSTAT, SLOWLOG, AUTH and the refusal of MONITOR. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "resp_harness.h"
#include "suites.h"

/* Every field redis-cli --stat reads (and a few exporters lean on) is in
 * INFO, a number where Redis has one. */
START_TEST(info_has_what_tools_read)
{
    static const char *const fields[][2] = {
        {"memory", "used_memory"}, {"memory", "used_memory_rss"}, {"memory", "used_memory_peak"},
        {"memory", "maxmemory"}, {"clients", "connected_clients"},
        {"clients", "blocked_clients"}, {"stats", "total_commands_processed"},
        {"stats", "total_connections_received"}, {"stats", "instantaneous_ops_per_sec"},
        {"stats", "total_net_input_bytes"}, {"stats", "total_net_output_bytes"},
        {"stats", "rejected_connections"}, {"stats", "expired_keys"},
        {"stats", "evicted_keys"}, {"stats", "keyspace_hits"},
        {"replication", "connected_slaves"}, {"persistence", "loading"},
        {"server", "uptime_in_seconds"}, {"server", "process_id"},
    };
    struct conn *c = conn_open();
    char *r;

    CMD(c, "SET", "k", "v");
    expect(c, "+OK\r\n");
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        (void)info_number(c, fields[i][0], fields[i][1]);
    ck_assert_uint_gt(info_number(c, "memory", "used_memory"), 0);
    ck_assert_uint_gt(info_number(c, "stats", "total_net_input_bytes"), 0);
    CMD(c, "INFO", "replication");
    r = next_reply(c, NULL);
    ck_assert_msg(strstr(r, "role:master\r\n"), "%s", r);
    free(r);
    CMD(c, "INFO", "cpu");
    r = next_reply(c, NULL);
    ck_assert_msg(strstr(r, "# CPU\r\nused_cpu_sys:") && strstr(r, "used_cpu_user:"), "%s", r);
    free(r);
    CMD(c, "INFO");
    r = next_reply(c, NULL);
    for (const char *const *s = (const char *const[]){"# Server", "# Clients", "# Memory",
                                                       "# Persistence", "# Stats",
                                                       "# Replication", "# CPU", "# Keyspace",
                                                       NULL};
         *s; s++)
        ck_assert_msg(strstr(r, *s), "INFO lacks %s", *s);
    free(r);
    /* RESETSTAT starts the counters again. */
    ck_assert_uint_gt(info_number(c, "stats", "total_commands_processed"), 5);
    CMD(c, "CONFIG", "RESETSTAT");
    expect(c, "+OK\r\n");
    ck_assert_uint_le(info_number(c, "stats", "total_commands_processed"), 2);
    ck_assert_uint_eq(info_number(c, "stats", "keyspace_hits"), 0);
    conn_close(c);
}
END_TEST

START_TEST(config_get_set_help)
{
    struct conn *c = conn_open();
    char *r;

    CMD(c, "CONFIG", "GET", "MAXCLIENTS");
    expect(c, "*2\r\n$10\r\nmaxclients\r\n$4\r\n1024\r\n");
    CMD(c, "CONFIG", "SET", "maxclients", "7", "slowlog-max-len", "3");
    expect(c, "+OK\r\n");
    CMD(c, "CONFIG", "GET", "maxclients");
    expect(c, "*2\r\n$10\r\nmaxclients\r\n$1\r\n7\r\n");
    CMD(c, "CONFIG", "GET", "slowlog-*");
    expect(c, "*4\r\n$23\r\nslowlog-log-slower-than\r\n$5\r\n10000\r\n"
              "$15\r\nslowlog-max-len\r\n$1\r\n3\r\n");
    /* All pairs are checked before any is applied. */
    CMD(c, "CONFIG", "SET", "maxclients", "9", "port", "1");
    expect(c, "-ERR CONFIG SET failed (possibly related to argument 'port') - can't set "
              "immutable config\r\n");
    CMD(c, "CONFIG", "GET", "maxclients");
    expect(c, "*2\r\n$10\r\nmaxclients\r\n$1\r\n7\r\n");
    CMD(c, "CONFIG", "SET", "maxclients", "lots");
    expect(c, "-ERR CONFIG SET failed (possibly related to argument 'maxclients') - argument "
              "couldn't be parsed into an integer\r\n");
    CMD(c, "CONFIG", "SET", "maxclients", "0");
    expect(c, "-ERR CONFIG SET failed (possibly related to argument 'maxclients') - argument "
              "must be between the limits shown by CONFIG HELP\r\n");
    CMD(c, "CONFIG", "SET", "tern-output-limit", "65536", "tern-coalesce-us", "20");
    expect(c, "+OK\r\n");
    CMD(c, "CONFIG", "GET", "tern-*");
    expect(c, "*4\r\n$17\r\ntern-output-limit\r\n$5\r\n65536\r\n"
              "$16\r\ntern-coalesce-us\r\n$2\r\n20\r\n");
    ck_assert_uint_eq(info_number(c, "clients", "tern_output_limit"), 65536);
    CMD(c, "CONFIG", "SET", "tern-coalesce-us", "1000001");
    expect(c, "-ERR CONFIG SET failed (possibly related to argument 'tern-coalesce-us') - "
              "argument must be between the limits shown by CONFIG HELP\r\n");
    CMD(c, "CONFIG", "SET", "no-such", "1");
    expect(c, "-ERR Unknown option or number of arguments for CONFIG SET - 'no-such'\r\n");
    CMD(c, "CONFIG", "SET", "maxclients");
    expect(c, "-ERR wrong number of arguments for 'config|set' command\r\n");
    CMD(c, "CONFIG", "HELP");
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, "*", 1) == 0 && strstr(r, "RESETSTAT"), "%s", r);
    free(r);
    CMD(c, "CONFIG", "REWRITE");
    expect(c, "-ERR unknown subcommand or wrong number of arguments for 'REWRITE'. Try CONFIG "
              "HELP.\r\n");
    CMD(c, "MONITOR");
    expect_prefix(c, "-ERR MONITOR is not served by tern's gateway");
    conn_close(c);
}
END_TEST

/* Every command is logged with the threshold at 0; the log keeps the
 * newest slowlog-max-len, newest first, with Redis's cuts of long
 * arguments and long commands. */
START_TEST(slowlog_records_and_cuts)
{
    struct conn *c = conn_open();
    static char big[300];
    const char *argv[40];
    size_t lens[40];
    char *r;

    CMD(c, "SLOWLOG", "LEN");
    expect(c, ":0\r\n");
    CMD(c, "CONFIG", "SET", "slowlog-log-slower-than", "0", "slowlog-max-len", "4");
    expect(c, "+OK\r\n");
    memset(big, 'x', sizeof(big));
    argv[0] = "SET";
    argv[1] = "big";
    argv[2] = big;
    lens[0] = 3;
    lens[1] = 3;
    lens[2] = sizeof(big);
    conn_cmdv(c, 3, argv, lens);
    expect(c, "+OK\r\n");
    argv[0] = "DEL";
    lens[0] = 3;
    for (int i = 1; i < 40; i++) {
        argv[i] = "k";
        lens[i] = 1;
    }
    conn_cmdv(c, 40, argv, lens);
    expect(c, ":0\r\n");
    CMD(c, "SLOWLOG", "LEN");
    expect(c, ":3\r\n");              /* CONFIG, SET, DEL: a command is logged once done */
    CMD(c, "SLOWLOG", "GET", "2");
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, "*2\r\n*6\r\n", 8) == 0, "%s", show(r, strlen(r)));
    /* LEN, then DEL: 31 of its 40 arguments and the cut. */
    ck_assert_msg(strstr(r, "*32\r\n$3\r\nDEL\r\n"), "%s", show(r, strlen(r)));
    ck_assert_msg(strstr(r, "$22\r\n... (9 more arguments)\r\n"), "%s", show(r, strlen(r)));
    free(r);
    CMD(c, "SLOWLOG", "GET", "-1");
    r = next_reply(c, NULL);
    ck_assert_msg(strncmp(r, "*4\r\n", 4) == 0, "%s", show(r, strlen(r)));
    ck_assert_msg(strstr(r, "... (172 more bytes)"), "%s", show(r, strlen(r)));
    free(r);
    CMD(c, "SLOWLOG", "GET", "-2");
    expect(c, "-ERR count should be greater than or equal to -1\r\n");
    CMD(c, "SLOWLOG", "RESET");
    expect(c, "+OK\r\n");
    CMD(c, "CONFIG", "SET", "slowlog-log-slower-than", "-1");
    expect(c, "+OK\r\n");
    CMD(c, "SLOWLOG", "LEN");
    expect(c, ":1\r\n");              /* the RESET itself, not the CONFIG SET that turned it off */
    CMD(c, "SLOWLOG", "NOPE");
    expect_prefix(c, "-ERR unknown subcommand");
    conn_close(c);
}
END_TEST

/* With a password, a client may only AUTH (or HELLO ... AUTH, or QUIT)
 * until it gives the right one; a wrong one is WRONGPASS. */
START_TEST(auth_with_a_password)
{
    struct conn *c = conn_open(), *d;

    CMD(c, "AUTH", "x");
    expect_prefix(c, "-ERR AUTH <password> called without any password configured");
    CMD(c, "CONFIG", "SET", "requirepass", "s3cret");
    expect(c, "+OK\r\n");
    CMD(c, "PING");                   /* the one who set it is in */
    expect(c, "+PONG\r\n");
    d = conn_open();
    CMD(d, "GET", "k");
    expect(d, "-NOAUTH Authentication required.\r\n");
    CMD(d, "AUTH", "s3cre");
    expect(d, "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    CMD(d, "AUTH", "s3cret!");
    expect(d, "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    CMD(d, "AUTH", "admin", "s3cret");
    expect(d, "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    CMD(d, "SET", "k", "v");
    expect(d, "-NOAUTH Authentication required.\r\n");
    ck_assert_uint_eq(info_number(c, "stats", "tern_auth_failures"), 3);
    CMD(d, "AUTH", "default", "s3cret");
    expect(d, "+OK\r\n");
    CMD(d, "SET", "k", "v");
    expect(d, "+OK\r\n");
    conn_close(d);
    d = conn_open();
    CMD(d, "HELLO", "2", "AUTH", "default", "bad");
    expect(d, "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    CMD(d, "HELLO", "2", "AUTH", "default", "s3cret", "SETNAME", "me");
    free(next_reply(d, NULL));
    CMD(d, "GET", "k");
    expect(d, "$1\r\nv\r\n");
    conn_close(d);
    conn_close(c);
}
END_TEST

Suite *suite_resp_admin(void)
{
    Suite *s = suite_create("resp_admin");
    TCase *tc = tcase_create("admin");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, info_has_what_tools_read);
    tcase_add_test(tc, config_get_set_help);
    tcase_add_test(tc, slowlog_records_and_cuts);
    tcase_add_test(tc, auth_with_a_password);
    suite_add_tcase(s, tc);
    return s;
}
