/* The error table: every code has a distinct value, a name and a message. */
#include <string.h>

#include "error.h"
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

Suite *suite_error(void)
{
    Suite *s = suite_create("error");
    TCase *tc = tcase_create("table");

    tcase_add_test(tc, codes_are_negative_and_distinct);
    tcase_add_test(tc, every_code_has_text_and_name);
    tcase_add_test(tc, errno_compatible);
    suite_add_tcase(s, tc);
    return s;
}
