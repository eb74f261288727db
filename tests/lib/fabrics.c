#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabrics.h"
#include "transport.h"

#define MAX_ROWS 8

static char listen_uri[MAX_ROWS][96];
static int rows = -1;

const char *test_rdma_ip(void)
{
    const char *ip = getenv("TERN_RDMA_LOCAL_IP");

    return ip && *ip ? ip : "127.0.0.1";
}

static void init(void)
{
    const char *const *names = tern_tp_fabric_names();

    if (rows >= 0)
        return;
    for (rows = 0; names[rows] && rows < MAX_ROWS; rows++) {
        if (tern_tp_local_uri(names[rows], NULL, listen_uri[rows], sizeof(listen_uri[rows])) < 0)
            abort();    /* every fabric has a local address (test_select checks) */
    }
}

int test_fabric_count(void)
{
    init();
    return rows;
}

const char *test_fabric_name(int i)
{
    init();
    return i >= 0 && i < rows ? tern_tp_fabric_names()[i] : "?";
}

const char *test_fabric_listen(int i)
{
    init();
    return i >= 0 && i < rows ? listen_uri[i] : "";
}

uint32_t test_fabric_caps(int i)
{
    return tern_tp_fabric_caps(test_fabric_name(i));
}

int test_fabric_row(const char *fabric)
{
    char uri[64];

    snprintf(uri, sizeof(uri), "%s://x", fabric);
    return tern_tp_uri_fabric(uri) >= 0 ? tern_tp_uri_fabric(uri) : -1;
}
