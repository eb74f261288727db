/* rpcbench's histogram: quantiles within the promised 1.6% of the truth. */
#include <stdlib.h>

#include "hist.h"
#include "suites.h"

static struct hist h;

START_TEST(empty_reads_zero)
{
    hist_reset(&h);
    ck_assert_uint_eq(hist_quantile(&h, 0.5), 0);
}
END_TEST

START_TEST(small_values_exact)
{
    hist_reset(&h);
    for (uint64_t v = 1; v <= 50; v++)
        hist_add(&h, v);
    ck_assert_uint_eq(hist_quantile(&h, 0.0), 1);
    ck_assert_uint_eq(hist_quantile(&h, 0.5), 25);
    ck_assert_uint_eq(hist_quantile(&h, 1.0), 50);
}
END_TEST

START_TEST(quantiles_within_error_bound)
{
    static const double qs[] = {0.5, 0.9, 0.99, 0.999};

    hist_reset(&h);
    /* 1..100000 ns uniformly: quantile q is q * 100000. */
    for (uint64_t v = 1; v <= 100000; v++)
        hist_add(&h, v);
    ck_assert_uint_eq(h.count, 100000);
    for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
        double want = qs[i] * 100000, got = (double)hist_quantile(&h, qs[i]);

        ck_assert_msg(got > want * 0.984 && got < want * 1.016, "q%.3f: %f vs %f", qs[i], got,
                      want);
    }
    ck_assert_uint_eq(hist_quantile(&h, 1.0), 100000);
}
END_TEST

START_TEST(huge_values_clamp)
{
    hist_reset(&h);
    hist_add(&h, UINT64_MAX / 2);
    hist_add(&h, 10);
    ck_assert_uint_eq(hist_quantile(&h, 1.0), UINT64_MAX / 2);
    ck_assert_uint_eq(hist_quantile(&h, 0.0), 10);
}
END_TEST

Suite *suite_hist(void)
{
    Suite *s = suite_create("hist");
    TCase *tc = tcase_create("quantiles");

    tcase_add_test(tc, empty_reads_zero);
    tcase_add_test(tc, small_values_exact);
    tcase_add_test(tc, quantiles_within_error_bound);
    tcase_add_test(tc, huge_values_clamp);
    suite_add_tcase(s, tc);
    return s;
}
