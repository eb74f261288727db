/* Glue to DPDK's ntb rawdev PMD (Intel Skylake NTB): probe the device,
 * expose a local memory window to the peer, map the peer's window, wait for
 * the link. The data path on top is the shared ring protocol (ring/ring.h),
 * the same one the shm fabric runs. Internal to transport/. */
#ifndef TERN_NTB_DPDK_H
#define TERN_NTB_DPDK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ntb_hw_dev {
    uint16_t dev_id;
    char pci_name[64];      /* e.g. 0000:af:00.0 */
    uint8_t *local;         /* our window: the peer writes it, we read it */
    uint8_t *remote;        /* the peer's window through our BAR (write-combining) */
    size_t size;            /* usable bytes of each window */
    uint64_t mw_size;       /* memory window 0 as the device reports it */
    bool up;
};

/* Initialise DPDK's EAL with `eal_args` (space-separated, e.g. "-l 0
 * --in-memory") and find an NTB rawdev. 0 with `link` filled in (not yet
 * configured), TERN_ENODEV if there is none, TERN_EIO if the EAL fails. */
int ntb_hw_probe(const char *eal_args, struct ntb_hw_dev *link);

/* Expose a local window of memory window 0's size, start the device, map
 * the peer's window and wait up to timeout_ms for the link to come up. */
int ntb_hw_open(struct ntb_hw_dev *link, int timeout_ms);

/* The link status as DPDK's PMD knows it (its cached state, kept from the
 * peer driver's doorbells: up, or told by the peer that it goes down); a
 * failed query counts as up, leaving the verdict to the heartbeat. */
bool ntb_hw_link_up(struct ntb_hw_dev *link);

/* Stop the device and unmap what ntb_hw_open mapped. */
void ntb_hw_close(struct ntb_hw_dev *link);

/* Probe and describe in one line (tern_tp_probe's "ntb" entry). */
int ntb_hw_describe(const char *eal_args, char *desc, size_t len);

#endif
