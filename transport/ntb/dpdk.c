/* DPDK ntb rawdev glue. Kept thin: DPDK does the device work (BAR set-up,
 * address translation of our memzone for the peer, the link handshake over
 * doorbells and scratchpads); tern only asks for it and maps the peer's
 * window for its own rings. Nothing here is on the data path. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_memzone.h>
#include <rte_pmd_ntb.h>
#include <rte_log.h>
#include <rte_rawdev.h>

#include "error.h"
#include "log.h"
#include "dpdk.h"

#define LOG_WHO "ntb"
#define MAX_EAL_ARGS 32

static bool eal_ready;

/* rte_eal_init wants argv; it may be called once per process. */
static int eal_init(const char *eal_args)
{
    static char buf[1024];
    char *argv[MAX_EAL_ARGS + 1];
    int argc = 0;

    if (eal_ready)
        return 0;
    snprintf(buf, sizeof(buf), "tern %s", eal_args ? eal_args : "");
    for (char *tok = strtok(buf, " "); tok && argc < MAX_EAL_ARGS; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    if (rte_eal_init(argc, argv) < 0) {
        tern_log(TERN_LOG_ERROR, LOG_WHO, "DPDK EAL init failed: %s", rte_strerror(rte_errno));
        return TERN_EIO;
    }
    eal_ready = true;
    return 0;
}

int ntb_hw_probe(const char *eal_args, struct ntb_hw_dev *link)
{
    int rc = eal_init(eal_args);

    if (rc < 0)
        return rc;
    memset(link, 0, sizeof(*link));
    /* Device ids may have holes; asking about a hole makes the rawdev
     * library log an error, so stop once every device has been seen. */
    for (uint16_t id = 0, seen = 0; id < RTE_RAWDEV_MAX_DEVS && seen < rte_rawdev_count();
         id++) {
        struct ntb_dev_info ntb = {0};
        struct rte_rawdev_info info = {.dev_private = &ntb};

        if (rte_rawdev_info_get(id, &info, sizeof(ntb)) < 0)
            continue;
        seen++;
        if (!info.driver_name ||
            !strstr(info.driver_name, "ntb"))
            continue;
        link->dev_id = id;
        snprintf(link->pci_name, sizeof(link->pci_name), "%s",
                 info.device ? rte_dev_name(info.device) : "?");
        link->mw_size = ntb.mw_cnt && ntb.mw_size ? ntb.mw_size[0] : 0;
        if (!link->mw_size) {
            tern_log(TERN_LOG_ERROR, LOG_WHO, "%s reports no memory window", link->pci_name);
            return TERN_ENODEV;
        }
        return 0;
    }
    tern_log(TERN_LOG_INFO, LOG_WHO, "no NTB device (%u rawdevs)", rte_rawdev_count());
    return TERN_ENODEV;
}

/* The peer's window is memory window 0 of the peer, which our BAR 2/3
 * translates to; sysfs offers it write-combining, as NTB needs for speed. */
static uint8_t *map_peer_window(const char *pci_name, size_t size)
{
    char path[128];
    void *p;
    int fd;

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource2_wc", pci_name);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        tern_log(TERN_LOG_ERROR, LOG_WHO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

int ntb_hw_open(struct ntb_hw_dev *link, int timeout_ms)
{
    struct ntb_dev_info ntb = {0};
    struct rte_rawdev_info info = {.dev_private = &ntb};
    const struct rte_memzone *mz;
    struct ntb_dev_config conf;
    uint64_t up = 0;
    char name[64];
    int waited = 0;

    if (rte_rawdev_info_get(link->dev_id, &info, sizeof(ntb)) < 0)
        return TERN_ENODEV;
    snprintf(name, sizeof(name), "tern-ntb-%u", link->dev_id);
    mz = rte_memzone_reserve_aligned(name, link->mw_size, info.socket_id,
                                     RTE_MEMZONE_IOVA_CONTIG,
                                     ntb.mw_size_align ? link->mw_size : 4096);
    if (!mz) {
        tern_log(TERN_LOG_ERROR, LOG_WHO, "no %llu-byte memzone for the window (hugepages?)",
                 (unsigned long long)link->mw_size);
        return TERN_ENOMEM;
    }
    /* One PMD queue of the smallest size: its header sits at the start of
     * the window; tern's rings live after it. */
    conf = (struct ntb_dev_config){.num_queues = 1, .queue_size = NTB_MIN_DESC_SIZE,
                                   .mz_num = 1, .mz_list = &mz};
    info.dev_private = &conf;
    if (rte_rawdev_configure(link->dev_id, &info, sizeof(conf)) < 0 ||
        rte_rawdev_start(link->dev_id) < 0) {
        tern_log(TERN_LOG_ERROR, LOG_WHO, "%s: configure/start failed", link->pci_name);
        return TERN_EIO;
    }
    while (rte_rawdev_get_attr(link->dev_id, NTB_LINK_STATUS_NAME, &up) == 0 && !up &&
           waited < timeout_ms) {
        usleep(10000);
        waited += 10;
    }
    if (!up) {
        tern_log(TERN_LOG_WARN, LOG_WHO, "%s: link down after %d ms", link->pci_name, waited);
        rte_rawdev_stop(link->dev_id);
        return TERN_ETIMEDOUT;
    }
    link->size = link->mw_size - ((ntb.ntb_hdr_size + 4095) & ~(size_t)4095);
    link->local = (uint8_t *)mz->addr + (link->mw_size - link->size);
    link->remote = map_peer_window(link->pci_name, link->mw_size);
    if (!link->remote) {
        rte_rawdev_stop(link->dev_id);
        return TERN_EIO;
    }
    link->remote += link->mw_size - link->size;
    link->up = true;
    tern_log(TERN_LOG_INFO, LOG_WHO, "%s: link up, %zu-byte windows", link->pci_name, link->size);
    return 0;
}

bool ntb_hw_link_up(struct ntb_hw_dev *link)
{
    uint64_t up = 1;

    if (rte_rawdev_get_attr(link->dev_id, NTB_LINK_STATUS_NAME, &up) < 0)
        return true;
    return up != 0;
}

void ntb_hw_close(struct ntb_hw_dev *link)
{
    if (!link->up)
        return;
    munmap(link->remote - (link->mw_size - link->size), link->mw_size);
    rte_rawdev_stop(link->dev_id);
    link->up = false;
}

int ntb_hw_describe(const char *eal_args, char *desc, size_t len)
{
    struct ntb_hw_dev link;
    int rc = ntb_hw_probe(eal_args, &link);

    if (rc == 0)
        snprintf(desc, len, "NTB rawdev %u at %s, memory window 0: %llu bytes", link.dev_id,
                 link.pci_name, (unsigned long long)link.mw_size);
    else
        snprintf(desc, len, "%s", rc == TERN_ENODEV ? "no NTB device" : tern_strerror(rc));
    return rc;
}
