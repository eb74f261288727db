/* Blocks: parsing, ids, Merkle roots and checks (bs_block.h). */
/* SHA256_Init/Update/Final: OpenSSL 3 calls them deprecated, but in 3.0
 * (Debian 12) EVP_DigestInit_ex2 frees and allocates its provider context
 * at every init, which costs a 64-byte node more than its hash (malloc,
 * free and a cleanse per call in a profile of the syncer). The low-level
 * context is reused with no allocation and runs the same SHA-NI code. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>

#include "bs_block.h"
#include "error.h"

static const uint8_t magic[4] = {'T', 'B', 'L', 'K'};

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static int bad(const char **why, const char *what)
{
    *why = what;
    return TERN_EPROTO;
}

int bs_header_decode(const uint8_t *p, size_t n, struct bs_header *h, const char **why)
{
    static const uint8_t zero[8];

    if (n < BS_HDR_SIZE)
        return bad(why, "block header truncated");
    if (memcmp(p, magic, sizeof(magic)) != 0)
        return bad(why, "not a block (bad magic)");
    h->version = get32(p + 4);
    if (h->version != BS_VERSION)
        return bad(why, "block version not supported");
    h->height = get64(p + 8);
    h->time_ns = get64(p + 16);
    memcpy(h->parent, p + 24, BS_ID_LEN);
    memcpy(h->merkle, p + 56, BS_ID_LEN);
    h->n_tx = get32(p + 88);
    h->body_len = get32(p + 92);
    h->chain = get64(p + 96);
    if (memcmp(p + 104, zero, sizeof(zero)) != 0)
        return bad(why, "block header: reserved bytes not zero");
    if (h->body_len > BS_BLOCK_MAX - BS_HDR_SIZE)
        return bad(why, "block body over the size limit");
    /* Each transaction takes its 4-byte length at least. */
    if (h->n_tx > h->body_len / 4)
        return bad(why, "block header: more transactions than its body can hold");
    return 0;
}

void bs_header_encode(const struct bs_header *h, uint8_t out[BS_HDR_SIZE])
{
    memcpy(out, magic, sizeof(magic));
    put32(out + 4, h->version);
    put64(out + 8, h->height);
    put64(out + 16, h->time_ns);
    memcpy(out + 24, h->parent, BS_ID_LEN);
    memcpy(out + 56, h->merkle, BS_ID_LEN);
    put32(out + 88, h->n_tx);
    put32(out + 92, h->body_len);
    put64(out + 96, h->chain);
    memset(out + 104, 0, 8);
}

bool bs_tx_next(const struct bs_block *b, size_t *at, const uint8_t **tx, uint32_t *len)
{
    if (*at + 4 > b->h.body_len)
        return false;
    *len = get32(b->body + *at);
    *tx = b->body + *at + 4;
    *at += 4 + (size_t)*len;
    return true;
}

int bs_block_parse(const uint8_t *p, size_t n, struct bs_block *b, const char **why)
{
    size_t at = 0;
    uint32_t count = 0;
    int rc = bs_header_decode(p, n, &b->h, why);

    if (rc < 0)
        return rc;
    if (n - BS_HDR_SIZE < b->h.body_len)
        return bad(why, "block body truncated");
    if (n - BS_HDR_SIZE > b->h.body_len)
        return bad(why, "bytes past the block's body");
    b->hdr = p;
    b->body = p + BS_HDR_SIZE;
    b->len = n;
    /* Every length checked before it is believed: none may run past the
     * body, and the last must end exactly at its end. */
    while (at < b->h.body_len) {
        uint32_t len;

        if (b->h.body_len - at < 4)
            return bad(why, "transaction length truncated");
        len = get32(b->body + at);
        if (len > BS_TX_MAX)
            return bad(why, "transaction over the size limit");
        if (len > b->h.body_len - at - 4)
            return bad(why, "transaction runs past the block's body");
        at += 4 + (size_t)len;
        if (++count > b->h.n_tx)
            return bad(why, "more transactions than the header says");
    }
    if (count != b->h.n_tx)
        return bad(why, "fewer transactions than the header says");
    return 0;
}

/* ---- hashing ---- */

struct bs_hasher {
    SHA256_CTX c;                    /* reused for every hash */
    uint8_t (*level)[BS_ID_LEN];     /* a Merkle level being built */
    uint32_t cap;                    /* entries `level` holds */
};

struct bs_hasher *bs_hasher_new(void)
{
    struct bs_hasher *hs = calloc(1, sizeof(*hs));

    if (!hs)
        return NULL;
    /* SHA-256 must be there at all (a FIPS-only provider set without it
     * would fail here, not at the first block). */
    EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!md) {
        free(hs);
        return NULL;
    }
    EVP_MD_free(md);
    return hs;
}

void bs_hasher_free(struct bs_hasher *hs)
{
    if (!hs)
        return;
    free(hs->level);
    free(hs);
}

/* SHA-256 of the optional one-byte prefix and up to two pieces. */
static int sha256(struct bs_hasher *hs, int prefix, const void *a, size_t alen, const void *b,
                  size_t blen, uint8_t out[BS_ID_LEN])
{
    uint8_t pre = (uint8_t)prefix;

    if (SHA256_Init(&hs->c) != 1 || (prefix >= 0 && SHA256_Update(&hs->c, &pre, 1) != 1) ||
        (alen && SHA256_Update(&hs->c, a, alen) != 1) ||
        (blen && SHA256_Update(&hs->c, b, blen) != 1) || SHA256_Final(out, &hs->c) != 1)
        return TERN_EIO;
    return 0;
}

int bs_header_id(struct bs_hasher *hs, const uint8_t hdr[BS_HDR_SIZE], uint8_t id[BS_ID_LEN])
{
    return sha256(hs, -1, hdr, BS_HDR_SIZE, NULL, 0, id);
}

/* The leaves of n transactions (RFC 6962 prefixes, bs_block.h), reduced in
 * place level by level. */
static int merkle(struct bs_hasher *hs, const uint8_t *const *txs, const uint32_t *lens,
                  const struct bs_block *b, uint32_t n, uint8_t root[BS_ID_LEN])
{
    size_t at = 0;
    int rc;

    if (n == 0)
        return sha256(hs, -1, NULL, 0, NULL, 0, root);
    if (n > hs->cap) {
        void *grown = realloc(hs->level, (size_t)n * BS_ID_LEN);

        if (!grown)
            return TERN_ENOMEM;
        hs->level = grown;
        hs->cap = n;
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *tx;
        uint32_t len;

        if (b) {
            bs_tx_next(b, &at, &tx, &len);
        } else {
            tx = txs[i];
            len = lens[i];
        }
        rc = sha256(hs, 0x00, tx, len, NULL, 0, hs->level[i]);
        if (rc < 0)
            return rc;
    }
    for (uint32_t width = n; width > 1; width = (width + 1) / 2) {
        for (uint32_t i = 0; i + 1 < width; i += 2) {
            rc = sha256(hs, 0x01, hs->level[i], BS_ID_LEN, hs->level[i + 1], BS_ID_LEN,
                        hs->level[i / 2]);
            if (rc < 0)
                return rc;
        }
        if (width & 1)
            memmove(hs->level[width / 2], hs->level[width - 1], BS_ID_LEN);
    }
    memcpy(root, hs->level[0], BS_ID_LEN);
    return 0;
}

int bs_merkle_root(struct bs_hasher *hs, const struct bs_block *b, uint8_t root[BS_ID_LEN])
{
    return merkle(hs, NULL, NULL, b, b->h.n_tx, root);
}

const char *bs_verdict_name(enum bs_verdict v)
{
    switch (v) {
    case BS_VALID: return "valid";
    case BS_BAD_CHAIN: return "another chain";
    case BS_BAD_HEIGHT: return "wrong height";
    case BS_BAD_PARENT: return "wrong parent";
    case BS_BAD_MERKLE: return "bad merkle root";
    }
    return "?";
}

int bs_block_check(struct bs_hasher *hs, const struct bs_block *b, uint64_t chain,
                   const uint8_t *parent_id, uint64_t parent_height, uint8_t id[BS_ID_LEN])
{
    static const uint8_t none[BS_ID_LEN];
    uint8_t root[BS_ID_LEN];
    int rc;

    if (b->h.chain != chain)
        return BS_BAD_CHAIN;
    if (parent_id ? b->h.height != parent_height + 1 : b->h.height != 0)
        return BS_BAD_HEIGHT;
    if (memcmp(b->h.parent, parent_id ? parent_id : none, BS_ID_LEN) != 0)
        return BS_BAD_PARENT;
    rc = bs_merkle_root(hs, b, root);
    if (rc < 0)
        return rc;
    if (memcmp(root, b->h.merkle, BS_ID_LEN) != 0)
        return BS_BAD_MERKLE;
    rc = bs_header_id(hs, b->hdr, id);
    return rc < 0 ? rc : BS_VALID;
}

int bs_block_build(struct bs_hasher *hs, struct bs_header *h, const uint8_t *const *txs,
                   const uint32_t *tx_lens, uint32_t n, uint8_t *out, size_t cap, size_t *len,
                   uint8_t id[BS_ID_LEN])
{
    uint64_t body = 0;
    uint8_t *at;
    int rc;

    if (!h || (n && (!txs || !tx_lens)) || !out || !len)
        return TERN_EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        if (tx_lens[i] > BS_TX_MAX)
            return TERN_E2BIG;
        body += 4 + (uint64_t)tx_lens[i];
    }
    if (body > BS_BLOCK_MAX - BS_HDR_SIZE || BS_HDR_SIZE + body > cap)
        return TERN_E2BIG;
    h->version = BS_VERSION;
    h->n_tx = n;
    h->body_len = (uint32_t)body;
    rc = merkle(hs, txs, tx_lens, NULL, n, h->merkle);
    if (rc < 0)
        return rc;
    bs_header_encode(h, out);
    at = out + BS_HDR_SIZE;
    for (uint32_t i = 0; i < n; i++) {
        put32(at, tx_lens[i]);
        if (tx_lens[i])
            memcpy(at + 4, txs[i], tx_lens[i]);
        at += 4 + tx_lens[i];
    }
    *len = BS_HDR_SIZE + (size_t)body;
    return id ? bs_header_id(hs, out, id) : 0;
}
