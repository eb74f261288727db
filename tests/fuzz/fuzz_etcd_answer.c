/* etcd's answers as services/cluster reads them (etcd_json.c): a lying
 * or broken etcd, or something else on its port, writes any bytes. The
 * first input byte picks the reader (range, transaction, lease, delete,
 * header, error, a shard's map, a node's address), the rest is the body. A reader may only refuse
 * (TERN_EPROTO); what it hands out must be what it says: every key 1 to
 * CL_KEY_MAX bytes, every value readable to its length, revisions not
 * negative, the error message NUL-terminated in its buffer. */
#include "error.h"
#include "etcd.h"
#include "fuzz.h"
#include "member.h"
#include "shard.h"

static volatile uint8_t sink;

static int touch(void *arg, const struct cl_kv *kv)
{
    unsigned *n = arg;

    FZ_CHECK(kv->key && kv->key_len >= 1 && kv->key_len <= CL_KEY_MAX, "key of %zu bytes",
             kv->key_len);
    FZ_CHECK(kv->value || !kv->value_len, "a value with no bytes");
    for (size_t i = 0; i < kv->key_len; i++)
        sink ^= (uint8_t)kv->key[i];
    for (size_t i = 0; i < kv->value_len; i++)
        sink ^= kv->value[i];
    (*n)++;
    /* Stop the walk now and then: the code must come back as it is. */
    return *n == 3 ? 7 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    uint8_t pick = fz_u8(&f);
    const char *body = (const char *)f.p;
    size_t len = f.n;
    int64_t rev = -1, a = 0, b = 0;
    unsigned n = 0;
    bool ok = false;
    char msg[64];
    int rc;

    switch (pick % 8) {
    case 0:
        rc = cl_answer_range(body, len, touch, &n, &rev);
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO || rc == TERN_ENOMEM || rc == 7, "range: %d", rc);
        FZ_CHECK(rc != 0 || rev >= 0, "a negative revision");
        break;
    case 1:
        rc = cl_answer_txn(body, len, &ok, touch, &n);
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO || rc == TERN_ENOMEM || rc == 7, "txn: %d", rc);
        break;
    case 2:
        rc = cl_answer_lease(body, len, &a, &b);
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO, "lease: %d", rc);
        FZ_CHECK(rc != 0 || b >= 0, "a negative ttl");
        break;
    case 3:
        rc = cl_answer_delete(body, len, &a);
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO, "delete: %d", rc);
        FZ_CHECK(rc != 0 || a >= 0, "a negative count");
        break;
    case 4:
        rc = cl_answer_header(body, len, &rev);
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO, "header: %d", rc);
        break;
    case 6: {
        struct cl_shard_map m;
        char back[1024];
        bool in = false;

        rc = cl_shard_map_parse((const uint8_t *)body, len, &m);
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO, "map: %d", rc);
        if (rc)
            break;
        /* A map taken is sound, and reads back the same. */
        FZ_CHECK(m.n_replicas >= 1 && m.n_replicas <= CL_REPLICAS_MAX, "%u replicas",
                 m.n_replicas);
        for (unsigned i = 0; i < m.n_replicas; i++)
            in |= strcmp(m.replicas[i], m.primary) == 0;
        FZ_CHECK(m.primary[0] ? in : m.epoch == 0, "a primary that is not a replica");
        {
            struct cl_shard_map again;
            int jn = cl_shard_map_json(&m, back, sizeof(back));

            FZ_CHECK(jn > 0, "the map does not print: %d", jn);
            FZ_CHECK(cl_shard_map_parse((const uint8_t *)back, (size_t)jn, &again) == 0 &&
                         memcmp(&again, &m, sizeof(m)) == 0, "the map does not read back");
        }
        /* Every change of its members, on each of its names and one more,
         * leaves a sound map (it prints and reads back). */
        for (unsigned i = 0; i <= m.n_replicas; i++)
            for (int op = CL_OP_ADD; op <= CL_OP_DROP; op++) {
                struct cl_shard_map c = m, again;
                const char *name = i < m.n_replicas ? m.replicas[i] : "fuzz-new";
                int jn;

                rc = cl_shard_map_change(&c, (enum cl_shard_op)op, name, m.epoch, m.primary);
                FZ_CHECK(rc == 0 || rc == 1 || rc == TERN_EEXIST || rc == TERN_ENOENT ||
                             rc == TERN_EINVAL || rc == TERN_EBUSY || rc == TERN_E2BIG ||
                             rc == TERN_ESTALE, "change %d: %d", op, rc);
                if (rc != 0)
                    continue;
                jn = cl_shard_map_json(&c, back, sizeof(back));
                FZ_CHECK(jn > 0 && cl_shard_map_parse((const uint8_t *)back, (size_t)jn,
                                                      &again) == 0,
                         "change %d of %s leaves a map that does not read: %.*s", op, name,
                         jn > 0 ? jn : 0, back);
            }
        break;
    }
    case 7: {
        char addr[CL_ADDR_MAX];

        rc = cl_node_tcp_addr((const uint8_t *)body, len, addr, sizeof(addr));
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO || rc == TERN_ENOENT || rc == TERN_E2BIG ||
                     rc == TERN_ENOMEM, "node address: %d", rc);
        FZ_CHECK(rc != 0 || (memchr(addr, 0, sizeof(addr)) && addr[0]), "an address unsound");
        rc = cl_node_mongo_addr((const uint8_t *)body, len, addr, sizeof(addr));
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO || rc == TERN_ENOENT || rc == TERN_E2BIG ||
                     rc == TERN_ENOMEM, "node mongo address: %d", rc);
        FZ_CHECK(rc != 0 || (memchr(addr, 0, sizeof(addr)) && addr[0]), "a mongo address unsound");
        break;
    }
    default:
        rc = cl_answer_error(body, len, msg, sizeof(msg));
        FZ_CHECK(rc == 0 || rc == TERN_EPROTO, "error: %d", rc);
        FZ_CHECK(memchr(msg, 0, sizeof(msg)) != NULL, "an unterminated message");
        break;
    }
    return 0;
}
