/* The fabric matrix: every multi-process suite runs its loop tests over
 * each fabric built into the library, in tern_tp_fabric_names() order
 * (tcp, shm, ntb on an emulated device, rdma on a NIC or softverbs). A
 * suite asks what a fabric can do by its capabilities, never its name. */
#ifndef TERN_TEST_FABRICS_H
#define TERN_TEST_FABRICS_H

#include <stdbool.h>
#include <stdint.h>

/* Rows in the matrix. */
int test_fabric_count(void);

/* The fabric of row i ("tcp", "shm", ...), for messages. */
const char *test_fabric_name(int i);

/* A URI a server of this host listens on for row i; the fabric names the
 * listener itself (any free port, an auto name), so every call may be used
 * by another server at once (rdma: $TERN_RDMA_LOCAL_IP names a NIC's
 * address, else softverbs serves loopback). */
const char *test_fabric_listen(int i);

/* Row i's capability bits (TERN_TP_CAP_*). */
uint32_t test_fabric_caps(int i);

/* The row of `fabric`, or -1 if it is not built in. */
int test_fabric_row(const char *fabric);

/* The address rdma tests listen on: $TERN_RDMA_LOCAL_IP, else 127.0.0.1. */
const char *test_rdma_ip(void);

#endif
