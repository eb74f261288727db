#include <stdio.h>

#include "doc_err.h"

int doc_errf(struct doc_err *e, int code, const char *fmt, ...)
{
    va_list ap;

    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -1;
}

const char *doc_code_name(int code)
{
    static __thread char other[24];

    switch (code) {
#define DOC_CODE_NAME(name, num) \
    case num:                    \
        return #name;
        DOC_ERRORS(DOC_CODE_NAME)
#undef DOC_CODE_NAME
    default:
        snprintf(other, sizeof(other), "Location%d", code);
        return other;
    }
}
