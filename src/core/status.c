/* status.c: version, status names and messages, error reporting. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned maskpack_version_number(void) { return MASKPACK_VERSION_NUMBER; }
const char *maskpack_version_string(void) { return MASKPACK_VERSION_STRING; }

static const struct {
    const char *name;
    const char *message;
} status_table[MASKPACK_STATUS_COUNT_] = {
    {"MASKPACK_OK", "success"},
    {"MASKPACK_ERR_NULL_ARGUMENT", "a required pointer argument is NULL"},
    {"MASKPACK_ERR_INVALID_ARGUMENT", "a scalar argument is outside its valid range"},
    {"MASKPACK_ERR_SHAPE", "a tensor has the wrong rank or shape, or shapes disagree"},
    {"MASKPACK_ERR_DTYPE", "a tensor's data type is not accepted here"},
    {"MASKPACK_ERR_VALUE", "an element has a forbidden value"},
    {"MASKPACK_ERR_UNSORTED", "offsets are not in non-decreasing order"},
    {"MASKPACK_ERR_HOLE", "a padding mask row has padding between tokens"},
    {"MASKPACK_ERR_OVERFLOW", "a size or offset overflows its type"},
    {"MASKPACK_ERR_NOT_REPRESENTABLE", "the input cannot be represented in the requested form"},
    {"MASKPACK_ERR_BUFFER_TOO_SMALL", "an output buffer is too small for the result"},
    {"MASKPACK_ERR_OUT_OF_MEMORY", "memory allocation failed"},
    {"MASKPACK_ERR_CONVENTION", "a convention, form or alignment is missing or unknown"},
    {"MASKPACK_ERR_RULE", "the attention rule is invalid"},
    {"MASKPACK_ERR_FORMAT", "a file is malformed or inconsistent with its declared sizes"},
    {"MASKPACK_ERR_IO", "an input/output operation failed"},
    {"MASKPACK_ERR_UNSUPPORTED", "the input is valid but not supported by this version"},
    {"MASKPACK_ERR_NPU_CONTRACT", "the npu_fusion_attention arguments violate the operator's contract"},
    {"MASKPACK_ERR_OVERLAP", "input and output buffers overlap"},
    {"MASKPACK_ERR_NOT_FOUND", "a named entry is absent"},
    {"MASKPACK_ERR_COMM", "a communicator callback failed"},
};

const char *maskpack_status_name(maskpack_status s) {
    if ((int)s < 0 || (int)s >= MASKPACK_STATUS_COUNT_) return "MASKPACK_ERR_UNKNOWN";
    return status_table[s].name;
}

const char *maskpack_status_message(maskpack_status s) {
    if ((int)s < 0 || (int)s >= MASKPACK_STATUS_COUNT_) return "unknown status code";
    return status_table[s].message;
}

static maskpack_status vfail(maskpack_error *err, maskpack_status status, const char *argument, const int64_t idx[4],
                             const char *fmt, va_list ap) {
    if (err) {
        memset(err, 0, sizeof *err);
        err->status = status;
        for (int i = 0; i < 4; i++) err->index[i] = idx[i];
        if (argument) snprintf(err->argument, sizeof err->argument, "%s", argument);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
    }
    return status;
}

maskpack_status mp_fail(maskpack_error *err, maskpack_status status, const char *argument, int64_t index0,
                        int64_t index1, const char *fmt, ...) {
    int64_t idx[4] = {index0, index1, -1, -1};
    va_list ap;
    va_start(ap, fmt);
    maskpack_status r = vfail(err, status, argument, idx, fmt, ap);
    va_end(ap);
    return r;
}

maskpack_status mp_fail4(maskpack_error *err, maskpack_status status, const char *argument, const int64_t idx[4],
                         const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    maskpack_status r = vfail(err, status, argument, idx, fmt, ap);
    va_end(ap);
    return r;
}

maskpack_status mp_ok(maskpack_error *err) {
    if (err) {
        memset(err, 0, sizeof *err);
        for (int i = 0; i < 4; i++) err->index[i] = -1;
    }
    return MASKPACK_OK;
}

/* ---- checked allocation ---------------------------------------------------------------------- */

void *mp_alloc_array(size_t n, size_t size) {
    size_t bytes;
    if (mp_mul_size(n ? n : 1, size ? size : 1, &bytes)) return NULL;
    return malloc(bytes);
}

void *mp_calloc_array(size_t n, size_t size) {
    /* calloc checks n * size itself; only the empty case needs care */
    return calloc(n ? n : 1, size ? size : 1);
}

void *mp_realloc_array(void *p, size_t n, size_t size) {
    size_t bytes;
    if (mp_mul_size(n ? n : 1, size ? size : 1, &bytes)) return NULL;
    return realloc(p, bytes);
}

maskpack_status mp_take_workspace(void *workspace, size_t workspace_bytes, size_t need, const char *query, void **base,
                                  void **owned, maskpack_error *err) {
    *owned = NULL;
    *base = workspace;
    if (workspace == NULL && workspace_bytes == 0) {
        *owned = *base = malloc(need ? need : 1);
        if (!*owned)
            return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "workspace", -1, -1, "workspace: cannot allocate %zu bytes",
                           need);
        return MASKPACK_OK;
    }
    if (!workspace)
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "workspace", -1, -1,
                       "workspace: NULL with %zu bytes (pass NULL and 0 to let the call allocate)", workspace_bytes);
    if (workspace_bytes < need)
        return mp_fail(err, MASKPACK_ERR_BUFFER_TOO_SMALL, "workspace", -1, -1,
                       "workspace: expected at least %zu bytes (%s), found %zu", need, query, workspace_bytes);
    return MASKPACK_OK;
}

maskpack_status mp_check_threads(int n_threads, const char *name, maskpack_error *err) {
    if (n_threads < 1 || n_threads > MASKPACK_MAX_THREADS)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, name, -1, -1, "%s: expected in [1, %d], found %d", name,
                       MASKPACK_MAX_THREADS, n_threads);
    return MASKPACK_OK;
}
