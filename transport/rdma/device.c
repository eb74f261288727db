/* Which NIC an rdma endpoint uses: the provider (rdma-core or softverbs)
 * and, on rdma-core, the first device with an active port and a GID. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "rdma_api.h"

static bool gid_set(const union ibv_gid *g)
{
    static const union ibv_gid zero;

    return memcmp(g, &zero, sizeof(zero)) != 0;
}

/* The first context of `api` with an active port that has a GID, optionally
 * only the device called `want`. */
static int find_port(const struct tern_rdma_api *api, const char *want, struct tern_rdma_dev *dev)
{
    int n = 0, rc = TERN_ENODEV;
    struct ibv_context **list = api->get_devices(&n);
    char why[96] = "no RDMA device";

    for (int i = 0; list && i < n && rc < 0; i++) {
        struct ibv_device_attr da;
        const char *name = list[i]->device->name;

        if (want && *want && strcmp(want, name) != 0)
            continue;
        if (api->query_device(list[i], &da) != 0)
            continue;
        snprintf(why, sizeof(why), "%s: no active port with a GID", name);
        for (uint8_t port = 1; port <= da.phys_port_cnt; port++) {
            struct ibv_port_attr pa;
            union ibv_gid gid;

            if (api->query_port(list[i], port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE ||
                api->query_gid(list[i], port, 0, &gid) != 0 || !gid_set(&gid))
                continue;
            dev->api = api;
            dev->ctx = list[i];
            dev->port = port;
            snprintf(dev->desc, sizeof(dev->desc), "%s port %u (%s%s)", name, port,
                     pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                     api->emulated ? ", emulated by softverbs: reaches this host only" : "");
            rc = 0;
            break;
        }
    }
    if (list)
        api->free_devices(list);
    if (rc < 0)
        snprintf(dev->desc, sizeof(dev->desc), "%s%s", why,
                 want && *want ? " (TERN_RDMA_DEVICE)" : "");
    return rc;
}

static bool hw_present(void)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);

    if (l)
        ibv_free_device_list(l);
    return n > 0;
}

bool rdma_hw_usable(char *desc, size_t len)
{
    static int known = -1;
    static struct tern_rdma_dev hw;

    if (known < 0)
        known = hw_present() && find_port(&rdma_api_verbs, getenv("TERN_RDMA_DEVICE"),
                                          &hw) == 0;
    if (desc && len)
        snprintf(desc, len, "%s", known ? hw.desc : "no usable RDMA device");
    return known;
}

int rdma_dev_pick(struct tern_rdma_dev *dev)
{
    const char *prov = getenv("TERN_RDMA_PROVIDER");

    memset(dev, 0, sizeof(*dev));
    if (prov && strcmp(prov, "softverbs") == 0)
        return find_port(&rdma_api_soft, NULL, dev);
    if (prov && *prov && strcmp(prov, "verbs") != 0 && strcmp(prov, "auto") != 0) {
        snprintf(dev->desc, sizeof(dev->desc),
                 "TERN_RDMA_PROVIDER=%s: want verbs, softverbs or auto", prov);
        return TERN_EINVAL;
    }
    /* auto: a host with RDMA hardware uses it (and says why if it cannot);
     * one without any falls back to the emulation. */
    if ((prov && strcmp(prov, "verbs") == 0) || hw_present())
        return find_port(&rdma_api_verbs, getenv("TERN_RDMA_DEVICE"), dev);
    return find_port(&rdma_api_soft, NULL, dev);
}
