/* Errors of the document service, as MongoDB reports them: a numeric code,
 * its name (codeName) and a message (errmsg). One table (DOC_ERRORS) gives
 * the codes tern uses; the wire gateway and the native API both report
 * these, so a client sees the same error by either way in.
 *
 * Functions that can fail take a `struct doc_err *` (never NULL) and
 * return a negative value after filling it; they leave it alone on
 * success. */
#ifndef TERN_DOC_ERR_H
#define TERN_DOC_ERR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, code): MongoDB's error_codes.yml, the subset tern reports. */
#define DOC_ERRORS(X)                         \
    X(InternalError, 1)                       \
    X(BadValue, 2)                            \
    X(NoSuchKey, 4)                           \
    X(FailedToParse, 9)                       \
    X(Unauthorized, 13)                       \
    X(TypeMismatch, 14)                       \
    X(Overflow, 15)                           \
    X(InvalidLength, 16)                      \
    X(ProtocolError, 17)                      \
    X(IllegalOperation, 20)                   \
    X(InvalidBSON, 22)                        \
    X(NamespaceNotFound, 26)                  \
    X(IndexNotFound, 27)                      \
    X(PathNotViable, 28)                      \
    X(ConflictingUpdateOperators, 40)         \
    X(CursorNotFound, 43)                     \
    X(NamespaceExists, 48)                    \
    X(WriteConcernFailed, 64)                 \
    X(ShutdownInProgress, 91)                 \
    X(PrimarySteppedDown, 189)                \
    X(NotWritablePrimary, 10107)              \
    X(NotPrimaryNoSecondaryOk, 13435)         \
    X(DollarPrefixedFieldName, 52)            \
    X(InvalidIdField, 53)                     \
    X(NotSingleValueField, 54)                \
    X(CommandNotFound, 59)                    \
    X(ImmutableField, 66)                     \
    X(CannotCreateIndex, 67)                  \
    X(IndexAlreadyExists, 68)                 \
    X(InvalidOptions, 72)                     \
    X(InvalidNamespace, 73)                   \
    X(IndexOptionsConflict, 85)               \
    X(IndexKeySpecsConflict, 86)              \
    X(ExceededMemoryLimit, 146)               \
    X(TooManyFilesOpen, 264)                  \
    X(IllegalOpMsgFlag, 223)                  \
    X(TransactionTooOld, 225)                 \
    X(NotImplemented, 238)                    \
    X(TooManyLogicalSessions, 261)            \
    X(QueryExceededMemoryLimitNoDiskUseAllowed, 292) \
    X(OutOfDiskSpace, 14031)                  \
    X(BSONObjectTooLarge, 10334)              \
    X(Location31250, 31250) /* projection path collision */ \
    X(Location31253, 31253) /* inclusion in an exclusion projection */ \
    X(Location31254, 31254) /* exclusion in an inclusion projection */ \
    X(DuplicateKey, 11000)

enum doc_code {
#define DOC_CODE_ENUM(name, code) DOC_##name = code,
    DOC_ERRORS(DOC_CODE_ENUM)
#undef DOC_CODE_ENUM
};

struct doc_err {
    int code;                   /* enum doc_code; 0 = no error */
    char msg[512];              /* errmsg, NUL-terminated */
};

/* Fill `e` (printf-style message) and return -1, so that callers can
 * write `return doc_errf(e, DOC_BadValue, "...")`. */
int doc_errf(struct doc_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The codeName of a code ("BadValue"); "Location<code>" for one not in
 * the table, as MongoDB names its unnamed codes. The string is static, or
 * lives in a thread-local buffer until the next call for an unknown code. */
const char *doc_code_name(int code);

#ifdef __cplusplus
}
#endif

#endif
