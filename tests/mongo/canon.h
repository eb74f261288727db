/* The canonical transcript of tests/mongo (canon.c). */
#ifndef TERN_TESTS_MONGO_CANON_H
#define TERN_TESTS_MONGO_CANON_H

#include <bson/bson.h>

/* A document with its keys sorted, as json.dumps(sort_keys=True). */
void canon_put_doc(const bson_t *doc);

/* Print one step's line, its fields and "step", and flush. Frees `fields`. */
void canon_emit(const char *step, bson_t *fields);

#endif
