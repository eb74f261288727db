#include <string.h>

#include "error.h"

const char *tern_strerror(int err)
{
    switch (err) {
#define TERN_ERR_MSG(name, value, msg) case value: return msg;
        TERN_ERRNO_MAP(TERN_ERR_MSG)
#undef TERN_ERR_MSG
    }
    if (err == 0)
        return "success";
    /* Plain errnos that the table does not name still read well. */
    if (err < 0 && err > -TERN_EBASE)
        return strerror(-err);
    if (err > 0 && err < TERN_EBASE)
        return strerror(err);
    return "unknown error";
}

const char *tern_err_name(int err)
{
    switch (err) {
#define TERN_ERR_NAME(name, value, msg) case value: return "TERN_" #name;
        TERN_ERRNO_MAP(TERN_ERR_NAME)
#undef TERN_ERR_NAME
    }
    return "TERN_UNKNOWN";
}
