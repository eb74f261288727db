/* RPC plumbing of the tests: client endpoints and sessions that must open,
 * and polling an endpoint for a while or until a counter moves. */
#ifndef TERN_TEST_RPC_UTIL_H
#define TERN_TEST_RPC_UTIL_H

#include <stdbool.h>

#include "rpc.h"

/* A client endpoint (cfg may be NULL); opening it must work. */
struct tern_rpc_ep *test_rpc_ep(const struct tern_rpc_config *cfg);

/* A session to `uri` (5 s to connect); it must connect. */
struct tern_session *test_rpc_connect(struct tern_rpc_ep *ep, const char *uri);

/* A session to `uri` runs on fabric row `row` of the matrix: the fabric
 * under test is the one the sessions use. */
void test_rpc_assert_fabric(struct tern_rpc_ep *ep, const char *uri, int row);

/* Poll `ep` for `ms` milliseconds. */
void test_rpc_poll_for(struct tern_rpc_ep *ep, double ms);

/* Poll `ep` until *counter reaches `want`; false after `ms` milliseconds. */
bool test_rpc_poll_until(struct tern_rpc_ep *ep, const int *counter, int want, int ms);

#endif
