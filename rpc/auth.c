/* Authentication of both ends with the cluster key (wire.h explains the
 * messages). Each side shows it holds the key without sending it: the
 * server's proof answers the client's nonce, the client's the server's,
 * each an HMAC-SHA-256 (OpenSSL) of
 *
 *     "tern-auth-1" | role | token | client nonce | server nonce
 *
 * A session's first handshake also derives its secret, the same HMAC with
 * role "session"; further paths of the session (the token again: a
 * standby, a better fabric) prove themselves with that secret in place of
 * the key, so a token seen on the wire is no longer a bearer secret.
 * Nothing here is on a data path: it runs once per connection. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/random.h>

#include "log.h"
#include "rpc_internal.h"

int rpc_auth_mac(const uint8_t *key, size_t key_len, const char *role, uint64_t token,
                 const uint8_t nc[RPC_AUTH_NONCE], const uint8_t ns[RPC_AUTH_NONCE],
                 uint8_t out[RPC_AUTH_MAC])
{
    static const char tag[] = "tern-auth-1";
    uint8_t msg[sizeof(tag) + 16 + 8 + 2 * RPC_AUTH_NONCE];
    size_t n = 0, rl = strlen(role);
    unsigned int len = RPC_AUTH_MAC;

    if (rl > 16)
        return TERN_EINVAL;
    memcpy(msg, tag, sizeof(tag));
    n += sizeof(tag);
    memcpy(msg + n, role, rl);
    n += rl;
    memcpy(msg + n, &token, sizeof(token));
    n += sizeof(token);
    memcpy(msg + n, nc, RPC_AUTH_NONCE);
    n += RPC_AUTH_NONCE;
    memcpy(msg + n, ns, RPC_AUTH_NONCE);
    n += RPC_AUTH_NONCE;
    if (!HMAC(EVP_sha256(), key, (int)key_len, msg, n, out, &len) || len != RPC_AUTH_MAC)
        return TERN_EIO;
    return 0;
}

bool rpc_auth_equal(const uint8_t a[RPC_AUTH_MAC], const uint8_t b[RPC_AUTH_MAC])
{
    return CRYPTO_memcmp(a, b, RPC_AUTH_MAC) == 0;
}

int rpc_auth_nonce(uint8_t out[RPC_AUTH_NONCE])
{
    size_t got = 0;

    while (got < RPC_AUTH_NONCE) {
        ssize_t n = getrandom(out + got, RPC_AUTH_NONCE - got, 0);

        if (n <= 0)
            return TERN_EIO;
        got += (size_t)n;
    }
    return 0;
}

void rpc_auth_refused(struct tern_session *s, const char *why)
{
    static struct tern_log_limit limit;

    /* A peer can try as often as it likes: a line a second at most. */
    if (tern_log_allow(&limit)) {
        if (limit.held)
            tern_log(TERN_LOG_WARN, "rpc", "refused %s: %s (%u more refusals since the last "
                     "line)", tern_tp_conn_peer(s->conn), why, limit.held);
        else
            tern_log(TERN_LOG_WARN, "rpc", "refused %s: %s", tern_tp_conn_peer(s->conn), why);
        limit.held = 0;
    }
}
