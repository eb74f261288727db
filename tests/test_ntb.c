/* The NTB glue without NTB hardware: probing must answer "no NTB device"
 * cleanly (EAL with --no-huge --no-pci, as on any machine), and the probe
 * entry point must know every fabric. With a device, docs/NTB.md says how to
 * run the conformance suite on the link. */
#include <string.h>

#include "suites.h"
#include "tern_config.h"
#include "transport.h"

#define EAL_NO_HW "--no-huge --no-pci -m 64 --no-shconf -l 0 --log-level=error"

START_TEST(probe_without_device)
{
    char desc[128] = "";
    int rc = tern_tp_probe("ntb", EAL_NO_HW, desc, sizeof(desc));

#if TERN_HAVE_DPDK
    ck_assert_msg(rc == TERN_ENODEV, "probe: %s (%s)", tern_err_name(rc), desc);
    ck_assert_str_eq(desc, "no NTB device");
    /* The EAL is up now; a second probe reuses it and says the same. */
    ck_assert_int_eq(tern_tp_probe("ntb", EAL_NO_HW, desc, sizeof(desc)), TERN_ENODEV);
#else
    /* The fabric is there (emulated devices work); the hardware is not. */
    ck_assert_int_eq(rc, TERN_ENODEV);
#endif
}
END_TEST

START_TEST(probe_other_fabrics)
{
    char desc[128];

    ck_assert_int_eq(tern_tp_probe("tcp", NULL, desc, sizeof(desc)), 0);
    ck_assert_int_eq(tern_tp_probe("shm", NULL, desc, sizeof(desc)), 0);
    ck_assert_int_eq(tern_tp_probe("warp", NULL, desc, sizeof(desc)), TERN_ENOFABRIC);
    ck_assert_int_eq(tern_tp_probe(NULL, NULL, desc, sizeof(desc)), TERN_EINVAL);
    ck_assert_int_eq(tern_tp_probe("tcp", NULL, NULL, 0), 0);
}
END_TEST

#if TERN_HAVE_DPDK
START_TEST(bad_eal_arguments)
{
    char desc[128];

    /* The EAL refuses this combination; the error comes back, no exit. */
    ck_assert_int_eq(tern_tp_probe("ntb", "--no-huge --in-memory --no-pci", desc, sizeof(desc)),
                     TERN_EIO);
}
END_TEST
#endif

Suite *suite_ntb(void)
{
    Suite *s = suite_create("ntb");
    TCase *tc = tcase_create("probe");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, probe_without_device);
    tcase_add_test(tc, probe_other_fabrics);
#if TERN_HAVE_DPDK
    tcase_add_test(tc, bad_eal_arguments);
#endif
    suite_add_tcase(s, tc);
    return s;
}
