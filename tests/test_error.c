/* The error table: every code has a distinct value, a name and a message. */
#include <regex.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "suites.h"

static const int codes[] = {
#define TERN_ERR_VALUE(name, value, msg) value,
    TERN_ERRNO_MAP(TERN_ERR_VALUE)
#undef TERN_ERR_VALUE
};

#define N_CODES (sizeof(codes) / sizeof(codes[0]))

START_TEST(codes_are_negative_and_distinct)
{
    for (size_t i = 0; i < N_CODES; i++) {
        ck_assert_int_lt(codes[i], 0);
        for (size_t j = i + 1; j < N_CODES; j++)
            ck_assert_int_ne(codes[i], codes[j]);
    }
}
END_TEST

START_TEST(every_code_has_text_and_name)
{
    for (size_t i = 0; i < N_CODES; i++) {
        const char *msg = tern_strerror(codes[i]), *name = tern_err_name(codes[i]);

        ck_assert_ptr_nonnull(msg);
        ck_assert_uint_gt(strlen(msg), 3);
        ck_assert_str_ne(msg, "unknown error");
        ck_assert_str_ne(name, "TERN_UNKNOWN");
        ck_assert(strncmp(name, "TERN_E", 6) == 0);
    }
}
END_TEST

START_TEST(errno_compatible)
{
    ck_assert_int_eq(TERN_EINVAL, -EINVAL);
    ck_assert_int_eq(TERN_ETIMEDOUT, -ETIMEDOUT);
    ck_assert_str_eq(tern_err_name(TERN_ETIMEDOUT), "TERN_ETIMEDOUT");
    /* Plain errnos outside the table still read as their strerror. */
    ck_assert_str_eq(tern_strerror(-EPIPE), strerror(EPIPE));
    ck_assert_str_eq(tern_strerror(0), "success");
    ck_assert_str_eq(tern_strerror(-999999), "unknown error");
    ck_assert_str_eq(tern_err_name(12345), "TERN_UNKNOWN");
    /* The document service's refusal is a code of tern's own, past the
     * pool's and the KV store's. */
    ck_assert_int_eq(TERN_EDOC, -(TERN_EBASE + 11));
    ck_assert_str_eq(tern_err_name(TERN_EDOC), "TERN_EDOC");
    ck_assert_str_eq(tern_strerror(TERN_EDOC),
                     "the document service refused the command (see tern_doc_last_error)");
}
END_TEST

/* ---- logging: one format, levels by name, an application's handler ---- */

static char got_msg[512], got_who[32];
static int got_level = -1, got_n;

static void catch_line(enum tern_log_level level, const char *who, const char *msg, void *arg)
{
    ck_assert_ptr_eq(arg, got_msg);
    got_level = (int)level;
    got_n++;
    snprintf(got_who, sizeof(got_who), "%s", who);
    snprintf(got_msg, sizeof(got_msg), "%s", msg);
}

START_TEST(log_lines_have_one_format)
{
    char line[256];
    regex_t re;

    /* ISO 8601 UTC to the microsecond, the level, the pid, the component. */
    ck_assert_int_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                                  "\\.[0-9]{6}Z warn  \\[[0-9]+\\] sync: a peer went$",
                             REG_EXTENDED | REG_NOSUB), 0);
    tern_log_format(line, sizeof(line), TERN_LOG_WARN, "sync", "a peer went");
    ck_assert_msg(regexec(&re, line, 0, NULL, 0) == 0, "line: %s", line);
    regfree(&re);
    tern_log_format(line, 24, TERN_LOG_ERROR, "x", "truncated, never overrun");
    ck_assert_uint_eq(strlen(line), 23);
}
END_TEST

START_TEST(log_levels_by_name)
{
    ck_assert_int_eq(tern_log_level_parse("debug"), TERN_LOG_DEBUG);
    ck_assert_int_eq(tern_log_level_parse("WARN"), TERN_LOG_WARN);
    ck_assert_int_eq(tern_log_level_parse("loud"), -1);
    ck_assert_int_eq(tern_log_level_parse(NULL), -1);
    ck_assert_str_eq(tern_log_level_name(TERN_LOG_INFO), "info");
}
END_TEST

START_TEST(log_handler_takes_the_lines)
{
    tern_log_set_level(TERN_LOG_INFO);
    tern_log_set_handler(catch_line, got_msg);
    tern_log(TERN_LOG_INFO, "ternd", "reloaded %d rules", 3);
    tern_log(TERN_LOG_DEBUG, "ternd", "below the level: not delivered");
    tern_log_set_handler(NULL, NULL);
    ck_assert_int_eq(got_n, 1);
    ck_assert_int_eq(got_level, TERN_LOG_INFO);
    ck_assert_str_eq(got_who, "ternd");
    ck_assert_str_eq(got_msg, "reloaded 3 rules");
}
END_TEST

Suite *suite_error(void)
{
    Suite *s = suite_create("error");
    TCase *tc = tcase_create("table");

    tcase_add_test(tc, codes_are_negative_and_distinct);
    tcase_add_test(tc, every_code_has_text_and_name);
    tcase_add_test(tc, errno_compatible);
    suite_add_tcase(s, tc);
    tc = tcase_create("log");
    tcase_add_test(tc, log_lines_have_one_format);
    tcase_add_test(tc, log_levels_by_name);
    tcase_add_test(tc, log_handler_takes_the_lines);
    suite_add_tcase(s, tc);
    return s;
}
