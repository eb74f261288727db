/* tern doc: what a document store holds, from its pool file (ternd
 * stopped) or from a running ternd (--uri): databases, collections, their
 * document counts and sizes, and indexes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "opt.h"
#include "tern_config.h"
#include "terncli.h"

#if TERN_HAVE_DOC

#include "doc.h"
#include "doc_store.h"
#include "rpc.h"

/* ---- a pool file ---- */

static void print_indexes(const bson_t *arr)
{
    bson_iter_t it, f;

    printf("    indexes");
    if (!bson_iter_init(&it, arr))
        return;
    while (bson_iter_next(&it)) {
        const uint8_t *d;
        uint32_t l;
        bson_t spec;
        char *key = NULL;

        if (!BSON_ITER_HOLDS_DOCUMENT(&it))
            continue;
        bson_iter_document(&it, &l, &d);
        if (!bson_init_static(&spec, d, l))
            continue;
        if (bson_iter_init_find(&f, &spec, "key") && BSON_ITER_HOLDS_DOCUMENT(&f)) {
            bson_t k;

            bson_iter_document(&f, &l, &d);
            if (bson_init_static(&k, d, l))
                key = bson_as_relaxed_extended_json(&k, NULL);
        }
        printf(" %s", bson_iter_init_find(&f, &spec, "name") ? bson_iter_utf8(&f, NULL) : "?");
        printf(" %s%s", key ? key : "{}",
               bson_iter_init_find(&f, &spec, "unique") && bson_iter_as_bool(&f) ? " unique" : "");
        bson_free(key);
        printf(";");
    }
    printf("\n");
}

static int print_coll(void *arg, struct doc_coll *c)
{
    bson_t arr = BSON_INITIALIZER;

    (void)arg;
    printf("  %s: %llu documents, %llu bytes\n", doc_coll_name(c),
           (unsigned long long)doc_coll_count(c), (unsigned long long)doc_coll_bytes(c));
    doc_index_list(c, &arr);
    print_indexes(&arr);
    bson_destroy(&arr);
    return 0;
}

static int print_db(void *arg, const char *db, uint64_t bytes)
{
    printf("database %s (%llu bytes)\n", db, (unsigned long long)bytes);
    return doc_coll_each(arg, db, print_coll, NULL);
}

static int from_pool(const char *path)
{
    struct doc_store_opts o = {.create = false};
    struct doc_store_info info;
    struct doc_store *s;
    struct doc_err e = {0};

    if (doc_store_open(path, &o, &s, &e) < 0) {
        fprintf(stderr, "tern: %s%s\n", e.msg,
                e.code == DOC_IllegalOperation ? " (ternd is running: ask it with --uri)" : "");
        return 2;
    }
    doc_store_info(s, &info);
    printf("pool %s: %llu databases, %llu collections, %llu documents, %llu indexes; "
           "%llu of %llu bytes in use; indexes rebuilt in %llu ms\n", path,
           (unsigned long long)info.databases, (unsigned long long)info.collections,
           (unsigned long long)info.documents, (unsigned long long)info.indexes,
           (unsigned long long)info.pool_used, (unsigned long long)info.pool_size,
           (unsigned long long)info.recover_ms);
    doc_db_each(s, print_db, s);
    doc_store_close(s);
    return 0;
}

/* ---- a running ternd ---- */

static bool first_batch(const bson_t *reply, bson_iter_t *batch)
{
    bson_iter_t it;

    return bson_iter_init(&it, reply) && bson_iter_find_descendant(&it, "cursor.firstBatch", batch) &&
           BSON_ITER_HOLDS_ARRAY(batch) && bson_iter_recurse(batch, batch);
}

static int from_server(const char *uri)
{
    struct tern_rpc_ep *ep;
    struct tern_doc *doc;
    bson_t cmd = BSON_INITIALIZER, reply;
    bson_iter_t it, f;
    int rc;

    if ((rc = tern_rpc_open(NULL, &ep)) < 0 ||
        (rc = tern_doc_open(ep, &uri, 1, 5000000000ull, &doc)) < 0) {
        fprintf(stderr, "tern: %s: %s\n", uri, tern_strerror(rc));
        return 2;
    }
    BSON_APPEND_INT32(&cmd, "listDatabases", 1);
    rc = tern_doc_command(doc, "admin", &cmd, &reply);
    if (rc < 0) {
        fprintf(stderr, "tern: listDatabases: %s\n", tern_doc_last_error(doc)->errmsg);
        goto out;
    }
    if (bson_iter_init_find(&it, &reply, "databases") && bson_iter_recurse(&it, &it))
        while (bson_iter_next(&it)) {
            bson_iter_t d, c;
            char db[128];

            if (!bson_iter_recurse(&it, &d) || !bson_iter_find(&d, "name"))
                continue;
            snprintf(db, sizeof(db), "%s", bson_iter_utf8(&d, NULL));
            printf("database %s\n", db);
            bson_t lc = BSON_INITIALIZER, lr;

            BSON_APPEND_INT32(&lc, "listCollections", 1);
            if (tern_doc_command(doc, db, &lc, &lr) == 0 && first_batch(&lr, &c))
                while (bson_iter_next(&c)) {
                    bson_iter_t n;
                    char coll[256];
                    bson_t q = BSON_INITIALIZER, r;

                    if (!bson_iter_recurse(&c, &n) || !bson_iter_find(&n, "name"))
                        continue;
                    snprintf(coll, sizeof(coll), "%s", bson_iter_utf8(&n, NULL));
                    BSON_APPEND_UTF8(&q, "collStats", coll);
                    if (tern_doc_command(doc, db, &q, &r) == 0) {
                        int64_t cnt = bson_iter_init_find(&f, &r, "count") ? bson_iter_as_int64(&f) : -1;
                        int64_t sz = bson_iter_init_find(&f, &r, "size") ? bson_iter_as_int64(&f) : -1;

                        printf("  %s: %lld documents, %lld bytes\n", coll, (long long)cnt,
                               (long long)sz);
                    }
                    bson_destroy(&r);
                    bson_reinit(&q);
                    BSON_APPEND_UTF8(&q, "listIndexes", coll);
                    if (tern_doc_command(doc, db, &q, &r) == 0 && bson_iter_init(&f, &r) &&
                        bson_iter_find_descendant(&f, "cursor.firstBatch", &f)) {
                        const uint8_t *d2;
                        uint32_t l2;
                        bson_t arr;

                        bson_iter_array(&f, &l2, &d2);
                        if (bson_init_static(&arr, d2, l2))
                            print_indexes(&arr);
                    }
                    bson_destroy(&r);
                    bson_destroy(&q);
                }
            bson_destroy(&lr);
            bson_destroy(&lc);
        }
out:
    bson_destroy(&reply);
    bson_destroy(&cmd);
    tern_doc_close(doc);
    tern_rpc_close(ep);
    return rc < 0 ? 2 : 0;
}

int tern_doc_cmd(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[0], "--uri") == 0)
        return from_server(argv[1]);
    if (argc == 1 && argv[0][0] != '-')
        return from_pool(argv[0]);
    return opt_usage_error("tern", "doc: a pool PATH, or --uri URI of a running ternd");
}

#else

int tern_doc_cmd(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "tern doc: built without the document service (libbson, PCRE2)\n");
    return 2;
}

#endif
