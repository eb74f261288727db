/* The fabric advertisement a server sends in its HELLO_ACK, as the client
 * picks a fabric from it (tern_tp_select, transport/select.c, and each
 * fabric's `reachable` hook on the address it names). Input: a policy
 * length byte, the policy, then the advertisement. "@=" in it stands for
 * "@" and this host's node id, so that the same-host fabrics (shm, the
 * emulated NTB device) are judged reachable and their hooks parse the
 * address. */
#include "fuzz.h"
#include "transport.h"

static char node[128];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (tern_tp_node_id(node, sizeof(node)) < 0)
        snprintf(node, sizeof(node), "none");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    size_t uri_len = 1 + fz_u8(&f);
    const uint8_t *pol, *ads;
    size_t pol_n = fz_take(&f, fz_u8(&f), &pol), ads_n = fz_take(&f, f.n, &ads);
    size_t nl = strlen(node), cap = ads_n * (nl + 1) + 1, o = 0;
    char policy[257], *expanded = malloc(cap), *uri = malloc(uri_len);
    int rc;

    FZ_CHECK(expanded && uri, "no memory");
    memcpy(policy, pol, pol_n);
    policy[pol_n] = 0;
    for (size_t i = 0; i < ads_n; i++) {
        if (ads[i] == '@' && i + 1 < ads_n && ads[i + 1] == '=') {
            expanded[o++] = '@';
            memcpy(expanded + o, node, nl);
            o += nl;
            i++;
            continue;
        }
        expanded[o++] = (char)ads[i];
    }
    expanded[o] = 0;
    /* Both with the fuzzer's policy and with none. */
    for (int pass = 0; pass < 2; pass++) {
        rc = tern_tp_select(expanded, pass ? NULL : policy, uri, uri_len);
        if (rc == 0) {
            size_t n = strnlen(uri, uri_len);

            FZ_CHECK(n < uri_len, "uri not terminated within its buffer");
            FZ_CHECK(strstr(uri, "://") && strstr(expanded, uri),
                     "picked \"%s\", which the advertisement does not hold", uri);
            FZ_CHECK(tern_tp_uri_fabric(uri) >= 0, "picked \"%s\", not a built-in fabric", uri);
        } else {
            FZ_CHECK(rc == TERN_ENOENT || rc == TERN_EINVAL, "select: %d", rc);
        }
    }
    free(expanded);
    free(uri);
    return 0;
}
