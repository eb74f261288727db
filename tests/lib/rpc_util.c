#include <check.h>
#include <string.h>

#include "fabrics.h"
#include "helpers.h"
#include "rpc_util.h"

#define SEC 1000000000ull

struct tern_rpc_ep *test_rpc_ep(const struct tern_rpc_config *cfg)
{
    struct tern_rpc_ep *ep;
    int rc = tern_rpc_open(cfg, &ep);

    ck_assert_msg(rc == 0, "client ep: %s", tern_strerror(rc));
    return ep;
}

struct tern_session *test_rpc_connect(struct tern_rpc_ep *ep, const char *uri)
{
    struct tern_session *s;
    int rc = tern_rpc_connect(ep, uri, 5 * SEC, &s);

    ck_assert_msg(rc == 0, "connect %s: %s", uri, tern_err_name(rc));
    return s;
}

void test_rpc_assert_fabric(struct tern_rpc_ep *ep, const char *uri, int row)
{
    struct tern_session *s = test_rpc_connect(ep, uri);

    ck_assert_msg(strcmp(tern_session_fabric(s), test_fabric_name(row)) == 0,
                  "listening on %s, session on %s", test_fabric_listen(row),
                  tern_session_fabric(s));
    tern_rpc_disconnect(s);
}

void test_rpc_poll_for(struct tern_rpc_ep *ep, double ms)
{
    double end = now_ms() + ms;

    while (now_ms() < end)
        tern_rpc_poll(ep);
}

bool test_rpc_poll_until(struct tern_rpc_ep *ep, const int *counter, int want, int ms)
{
    double end = now_ms() + ms;

    while (*counter < want) {
        if (now_ms() > end)
            return false;
        tern_rpc_poll(ep);
    }
    return true;
}
