/* io_common.c: arrays, array sets, whole-file reads and writes, container detection and the helpers
 * every reader and writer shares. */
#define _XOPEN_SOURCE 700 /* realpath, fchmod */
#include "io.h"

#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

void mpio_array_free(mpio_array *a) {
    if (!a) return;
    free(a->name);
    free(a->data);
    memset(a, 0, sizeof *a);
}

int64_t mpio_array_numel(const mpio_array *a) {
    for (int32_t d = 0; d < a->ndim; d++)
        if (a->shape[d] == 0) return 0; /* empty: the other dimensions may multiply past int64 */
    int64_t n = 1;
    for (int32_t d = 0; d < a->ndim; d++) n *= a->shape[d]; /* the readers checked the product */
    return n;
}

maskpack_tensor mpio_array_view(const mpio_array *a) {
    maskpack_tensor t = maskpack_tensor_contiguous(a->data, a->dtype, a->ndim, a->shape);
    if (a->fortran_order && a->ndim > 1) {
        /* column-major: the first index varies fastest */
        int64_t stride = 1;
        for (int32_t d = 0; d < a->ndim; d++) {
            t.strides[d] = stride;
            stride = mp_stride_step(stride, a->shape[d]);
        }
    }
    return t;
}

void mpio_arrayset_free(mpio_arrayset *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) mpio_array_free(&s->arrays[i]);
    free(s->arrays);
    s->arrays = NULL;
    s->n = 0;
}

const mpio_array *mpio_arrayset_find(const mpio_arrayset *s, const char *name) {
    if (!s || !name) return NULL;
    for (size_t i = 0; i < s->n; i++)
        if (s->arrays[i].name && strcmp(s->arrays[i].name, name) == 0) return &s->arrays[i];
    return NULL;
}

char *mpio_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void mpio_prefix_message(maskpack_error *err, const char *prefix) {
    if (!err || !prefix) return;
    char msg[MASKPACK_ERROR_MESSAGE_SIZE];
    memcpy(msg, err->message, sizeof msg);
    msg[sizeof msg - 1] = 0;
    size_t p = strlen(prefix), m = strlen(msg), cap = sizeof err->message - 1;
    if (p > cap) p = cap;
    memcpy(err->message, prefix, p);
    if (m > cap - p) m = cap - p;
    memcpy(err->message + p, msg, m);
    err->message[p + m] = 0;
}

maskpack_status mpio_prefix_path(maskpack_error *err, maskpack_status status, const char *path) {
    if (err && path && status != MASKPACK_OK) {
        /* keep the end of long paths: the file name is the useful part */
        char prefix[140];
        size_t plen = strlen(path);
        if (plen > 120)
            snprintf(prefix, sizeof prefix, "...%s: ", path + plen - 120);
        else
            snprintf(prefix, sizeof prefix, "%s: ", path);
        mpio_prefix_message(err, prefix);
    }
    return status;
}

/* Closes what mpio_read_file opened; standard input stays open for the rest of the process. */
static void close_input(FILE *f, int is_stdin) {
    if (!is_stdin) fclose(f);
}

maskpack_status mpio_read_file(const char *path, uint64_t max_bytes, uint8_t **buf, size_t *len, maskpack_error *err) {
    MP_CHECK_NULL(err, path, "path");
    MP_CHECK_NULL(err, buf, "buf");
    MP_CHECK_NULL(err, len, "len");
    /* "-" is standard input, as command-line tools spell it (a pipe: read until EOF, no size known) */
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    size_t cap = 1 << 16;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
        if ((uint64_t)st.st_size > max_bytes) {
            close_input(f, is_stdin);
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "path", -1, -1,
                           "%s: file has %lld bytes, more than the memory budget of %llu bytes", path,
                           (long long)st.st_size, (unsigned long long)max_bytes);
        }
        cap = (size_t)st.st_size + 1; /* +1 so EOF is seen without growing */
    } else if ((uint64_t)cap > max_bytes + 1) {
        cap = (size_t)max_bytes + 1; /* a tiny budget: not even the first block past it */
    } else if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        close_input(f, is_stdin);
        return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: is a directory", path);
    }
    /* read in a loop: the size may change under us, and pipes have none */
    uint8_t *data = malloc(cap);
    if (!data) {
        close_input(f, is_stdin);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "path", -1, -1, "%s: out of memory", path);
    }
    size_t used = 0;
    for (;;) {
        if (used == cap) {
            if ((uint64_t)cap > max_bytes) {
                free(data);
                close_input(f, is_stdin);
                return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "path", -1, -1,
                               "%s: more than the memory budget of %llu bytes (the input was read up to it)", path,
                               (unsigned long long)max_bytes);
            }
            /* grow up to one byte past the budget, never beyond: an endless stream (/dev/zero, a
             * pipe) stops there instead of doubling the buffer past it */
            size_t ncap = (uint64_t)cap * 2 > max_bytes + 1 ? (size_t)(max_bytes + 1) : cap * 2;
            uint8_t *n = realloc(data, ncap);
            if (!n) {
                free(data);
                close_input(f, is_stdin);
                return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "path", -1, -1, "%s: out of memory", path);
            }
            data = n;
            cap = ncap;
        }
        size_t got = fread(data + used, 1, cap - used, f);
        used += got;
        if (got == 0) break;
    }
    int failed = ferror(f);
    int saved = errno;
    close_input(f, is_stdin);
    if (failed) {
        free(data);
        return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: read failed: %s", path, strerror(saved));
    }
    if ((uint64_t)used > max_bytes) {
        free(data);
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "path", -1, -1,
                       "%s: more than the memory budget of %llu bytes (the input was read up to it)", path,
                       (unsigned long long)max_bytes);
    }
    *buf = data;
    *len = used;
    return mp_ok(err);
}

/* Writes all of buf to fd; 0 or an errno value. */
static int write_all(int fd, const uint8_t *buf, size_t len) {
    while (len) {
        ssize_t put = write(fd, buf, len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len);
        if (put < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        buf += put;
        len -= (size_t)put;
    }
    return 0;
}

/* A device, fifo or socket is written in place: it cannot be replaced by a rename, and it must never be
 * removed (as root, removing /dev/full after a failed write would delete the device node). */
static maskpack_status write_in_place(const char *path, const void *buf, size_t len, maskpack_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: cannot open: %s", path, strerror(errno));
    int e = write_all(fd, buf, len);
    if (close(fd) != 0 && !e) e = errno;
    if (e) return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: write failed: %s", path, strerror(e));
    return mp_ok(err);
}

maskpack_status mpio_write_file(const char *path, const void *buf, size_t len, maskpack_error *err) {
    MP_CHECK_NULL(err, path, "path");
    if (len) MP_CHECK_NULL(err, buf, "buf");
    /* where the bytes go: through a link to its target, so the link survives and a link to a device
     * writes the device */
    char *real = realpath(path, NULL);
    const char *target = real ? real : path; /* absent (or a dangling link): created at path */
    struct stat st;
    int exists = stat(target, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) {
        free(real);
        return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: is a directory", path);
    }
    if (exists && !S_ISREG(st.st_mode)) {
        free(real);
        return write_in_place(path, buf, len, err);
    }
    /* a regular file (or none yet): write a temporary file beside it and rename it over the target
     * only once every byte is written and flushed, so a failed write (full disk, quota, signal)
     * leaves what was there as it was */
    const char *slash = strrchr(target, '/');
    size_t dir_len = slash ? (size_t)(slash - target) + 1 : 0;
    const char *base = slash ? slash + 1 : target;
    char *tmp = malloc(dir_len + strlen(base) + 16);
    if (!tmp) {
        free(real);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "path", -1, -1, "%s: out of memory", path);
    }
    memcpy(tmp, target, dir_len);
    sprintf(tmp + dir_len, ".%s.XXXXXX", base);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        free(real);
        return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: cannot create: %s", path, strerror(e));
    }
    /* the permissions a plain create would give (0666 less the umask), or the old file's */
    mode_t mode;
    if (exists) {
        mode = st.st_mode & 07777;
    } else {
        mode_t mask = umask(022);
        umask(mask);
        mode = 0666 & ~mask;
    }
    int e = fchmod(fd, mode) != 0 ? errno : 0;
    if (!e) e = write_all(fd, buf, len);
    if (!e && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, target) != 0) e = errno;
    if (e) unlink(tmp); /* only our own temporary file is ever removed */
    free(tmp);
    free(real);
    if (e) return mp_fail(err, MASKPACK_ERR_IO, "path", -1, -1, "%s: write failed: %s", path, strerror(e));
    return mp_ok(err);
}

mpio_kind mpio_detect(const void *buf, size_t len) {
    const uint8_t *b = buf;
    if (!b) return MPIO_KIND_UNKNOWN;
    if (len >= 6 && memcmp(b, "\x93NUMPY", 6) == 0) return MPIO_KIND_NPY;
    /* a zip starts with a local header, or (empty archive) with the end record */
    if (len >= 4 && b[0] == 'P' && b[1] == 'K' && ((b[2] == 3 && b[3] == 4) || (b[2] == 5 && b[3] == 6)))
        return MPIO_KIND_NPZ;
    /* safetensors: 8-byte little-endian header length, then a JSON object */
    if (len >= 9 && b[8] == '{') return MPIO_KIND_SAFETENSORS;
    return MPIO_KIND_UNKNOWN;
}

maskpack_status mpio_parse_any(const void *buf, size_t len, mpio_arrayset *out, maskpack_error *err) {
    return mpio_parse_any_budget(buf, len, MPIO_MAX_BYTES, out, err);
}

maskpack_status mpio_parse_any_budget(const void *buf, size_t len, uint64_t budget, mpio_arrayset *out,
                                      maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    memset(out, 0, sizeof *out);
    switch (mpio_detect(buf, len)) {
    case MPIO_KIND_NPY: {
        mpio_array *a = calloc(1, sizeof *a);
        if (!a) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "file", -1, -1, "out of memory");
        maskpack_status s = mpio_npy_parse(buf, len, a, err);
        if (s) {
            free(a);
            return s;
        }
        out->arrays = a;
        out->n = 1;
        return MASKPACK_OK;
    }
    case MPIO_KIND_NPZ: return mpio_npz_parse_budget(buf, len, budget, out, err);
    case MPIO_KIND_SAFETENSORS: return mpio_safetensors_parse(buf, len, out, err);
    default:
        return mp_fail(err, MASKPACK_ERR_FORMAT, "file", -1, -1,
                       "not an .npy (\\x93NUMPY), .npz (PK zip) or .safetensors (length + '{') file (%zu bytes)", len);
    }
}

/* Reads path (at most max_bytes) and parses it with `parse`, or, when that is NULL, with
 * mpio_parse_any_budget under the same budget; messages are prefixed with the path. */
static maskpack_status load_and_parse(const char *path, uint64_t max_bytes, mpio_set_parser parse, mpio_arrayset *out,
                                      maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    memset(out, 0, sizeof *out);
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_status s = mpio_read_file(path, max_bytes, &buf, &len, err);
    if (s) return s;
    s = parse ? parse(buf, len, out, err) : mpio_parse_any_budget(buf, len, max_bytes, out, err);
    free(buf);
    return mpio_prefix_path(err, s, path);
}

maskpack_status mpio_load_set(const char *path, mpio_set_parser parse, mpio_arrayset *out, maskpack_error *err) {
    /* an archive may hold several arrays of up to MPIO_MAX_BYTES each, but the file itself is capped */
    return load_and_parse(path, MPIO_MAX_BYTES, parse, out, err);
}

maskpack_status mpio_load_any(const char *path, mpio_arrayset *out, maskpack_error *err) {
    return mpio_load_set(path, mpio_parse_any, out, err);
}

maskpack_status mpio_load_any_budget(const char *path, uint64_t max_bytes, mpio_arrayset *out, maskpack_error *err) {
    return load_and_parse(path, max_bytes, NULL, out, err);
}

const char *mpio_npy_descr(maskpack_dtype d) {
    switch (d) {
    case MASKPACK_BOOL: return "|b1";
    case MASKPACK_U8: return "|u1";
    case MASKPACK_I8: return "|i1";
    case MASKPACK_I16: return "<i2";
    case MASKPACK_I32: return "<i4";
    case MASKPACK_I64: return "<i8";
    case MASKPACK_F16: return "<f2";
    case MASKPACK_F32: return "<f4";
    case MASKPACK_F64: return "<f8";
    default: return NULL; /* bfloat16 has no numpy dtype */
    }
}

void mpio_copy_contiguous(const maskpack_tensor *t, void *dst) {
    size_t es = maskpack_dtype_size(t->dtype);
    int64_t n = mp_numel(t);
    if (n <= 0) return;
    int64_t idx[MASKPACK_MAX_DIMS] = {0};
    uint8_t *out = dst;
    for (int64_t e = 0; e < n; e++) {
        memcpy(out + (size_t)e * es, mp_elem_ptr(t, idx), es);
        /* odometer increment, last dimension fastest (C order) */
        for (int32_t d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

maskpack_status mpio_check_text(const char *text, const char *name, maskpack_error *err) {
    MP_CHECK_NULL(err, text, name);
    size_t n = strlen(text);
    if (n == 0 || n > MPIO_MAX_TEXT)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, name, -1, -1, "%s: expected 1 to %d characters, found %zu",
                       name, MPIO_MAX_TEXT, n);
    for (size_t i = 0; i < n; i++)
        if (text[i] < 0x20 || text[i] > 0x7e)
            return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, name, (int64_t)i, -1,
                           "%s[%zu]: expected printable ASCII, found byte 0x%02x", name, i, (unsigned)(uint8_t)text[i]);
    return mp_ok(err);
}
