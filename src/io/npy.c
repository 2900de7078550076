/* npy.c: the .npy reader and writer.
 *
 * File layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.x, u32 LE for 2.x/3.x), the
 * header (a Python dict literal: {'descr': '<i4', 'fortran_order': False, 'shape': (3, 4), }) and the
 * raw data. The header is parsed by a small recursive-descent reader that only accepts what numpy
 * writes for plain arrays; structured and object dtypes are refused. */
#include "io.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPY_ARG "npy"

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int accept(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted string without escapes (numpy never writes any in the keys or plain descrs). */
static int read_string(cursor *c, char *dst, size_t cap) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap) return 0;
        dst[n++] = *c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    dst[n] = 0;
    return 1;
}

static int read_word(cursor *c, const char *w) {
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

/* Describes what sits at the cursor, for messages ("found 'x'"). */
static char peek(cursor *c) {
    skip_ws(c);
    return c->p < c->end ? *c->p : '?';
}

/* descr -> dtype. Returns OK, FORMAT (big-endian, object, garbage) or UNSUPPORTED (a valid numpy
 * dtype maskpack has no use for). */
static maskpack_status parse_descr(const char *s, maskpack_dtype *dt, maskpack_error *err) {
    char order = '|';
    const char *k = s;
    if (*k == '<' || *k == '>' || *k == '|' || *k == '=') order = *k++;
    char kind = *k;
    if (kind == 'O')
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy header: descr '%s' is an object array (pickled Python objects); only plain numeric "
                       "arrays can be read",
                       s);
    if (kind == 0 || k[1] < '0' || k[1] > '9')
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: descr '%s' is not a numpy type string",
                       s);
    char *endp = NULL;
    long size = strtol(k + 1, &endp, 10);
    if (*endp != 0 || size <= 0 || size > 64)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: descr '%s' has a bad item size", s);
    if (order == '>' && size > 1)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy header: descr '%s' is big-endian; only little-endian data is read (save with "
                       "arr.astype(arr.dtype.newbyteorder('<')))",
                       s);
    if (order == '=' && size > 1)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy header: descr '%s' uses native byte order, which a file cannot state; expected '<'", s);
    int found = 1;
    switch (kind) {
    case 'b':
        found = size == 1;
        *dt = MASKPACK_BOOL;
        break;
    case 'u':
        found = size == 1;
        *dt = MASKPACK_U8;
        break;
    case 'i':
        if (size == 1)
            *dt = MASKPACK_I8;
        else if (size == 2)
            *dt = MASKPACK_I16;
        else if (size == 4)
            *dt = MASKPACK_I32;
        else if (size == 8)
            *dt = MASKPACK_I64;
        else
            found = 0;
        break;
    case 'f':
        if (size == 2)
            *dt = MASKPACK_F16;
        else if (size == 4)
            *dt = MASKPACK_F32;
        else if (size == 8)
            *dt = MASKPACK_F64;
        else
            found = 0;
        break;
    case 'c':
    case 'S':
    case 'U':
    case 'V':
    case 'M':
    case 'm': found = 0; break;
    default:
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: descr '%s' has unknown kind '%c'", s,
                       kind);
    }
    if (!found)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, NPY_ARG, -1, -1,
                       "npy header: dtype '%s' is not supported (expected one of b1 u1 i1 i2 i4 i8 f2 f4 f8)", s);
    return MASKPACK_OK;
}

/* "(3, 4)" / "(5,)" / "()" -> shape. Dimensions beyond MASKPACK_MAX_DIMS are UNSUPPORTED; values
 * above INT64_MAX are FORMAT. */
static maskpack_status parse_shape(cursor *c, int32_t *ndim, int64_t *shape, maskpack_error *err) {
    if (!accept(c, '('))
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: 'shape' expected a tuple, found '%c'",
                       peek(c));
    int32_t n = 0;
    for (;;) {
        skip_ws(c);
        if (accept(c, ')')) break;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                           "npy header: 'shape' expected a non-negative integer, found '%c'", peek(c));
        uint64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            unsigned digit = (unsigned)(*c->p++ - '0');
            if (v > ((uint64_t)INT64_MAX - digit) / 10)
                return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, n, -1,
                               "npy header: shape dimension %d does not fit in int64", (int)n);
            v = v * 10 + digit;
        }
        if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 long literal */
        if (n >= MASKPACK_MAX_DIMS)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, NPY_ARG, -1, -1,
                           "npy header: more than %d dimensions are not supported", MASKPACK_MAX_DIMS);
        shape[n++] = (int64_t)v;
        if (accept(c, ',')) continue;
        if (accept(c, ')')) break;
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: 'shape' expected ',' or ')', found '%c'",
                       peek(c));
    }
    *ndim = n;
    return MASKPACK_OK;
}

/* Parses the header dict into dtype / order / shape. */
static maskpack_status parse_header(const char *h, size_t hlen, mpio_array *a, maskpack_error *err) {
    cursor c = {h, h + hlen};
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!accept(&c, '{'))
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: expected a dict '{', found '%c'",
                       peek(&c));
    for (;;) {
        if (accept(&c, '}')) break;
        char key[32];
        if (!read_string(&c, key, sizeof key))
            return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                           "npy header: expected a quoted key or '}', found '%c'", peek(&c));
        if (!accept(&c, ':'))
            return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: expected ':' after '%s'", key);
        if (strcmp(key, "descr") == 0 && !have_descr) {
            char descr[32];
            if (peek(&c) == '[')
                return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                               "npy header: descr is a list (structured dtype); only plain arrays can be read");
            if (!read_string(&c, descr, sizeof descr))
                return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                               "npy header: 'descr' expected a short quoted type string");
            maskpack_status s = parse_descr(descr, &a->dtype, err);
            if (s) return s;
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (read_word(&c, "True"))
                a->fortran_order = 1;
            else if (read_word(&c, "False"))
                a->fortran_order = 0;
            else
                return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                               "npy header: 'fortran_order' expected True or False, found '%c'", peek(&c));
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            maskpack_status s = parse_shape(&c, &a->ndim, a->shape, err);
            if (s) return s;
            have_shape = 1;
        } else {
            return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: unexpected or repeated key '%s'",
                           key);
        }
        if (accept(&c, ',')) continue;
        if (accept(&c, '}')) break;
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: expected ',' or '}', found '%c'",
                       peek(&c));
    }
    skip_ws(&c);
    if (c.p != c.end)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy header: unexpected bytes after the dict (offset %td of %zu)", c.p - h, hlen);
    if (!have_descr || !have_order || !have_shape)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: missing key '%s'",
                       !have_descr   ? "descr"
                       : !have_order ? "fortran_order"
                                     : "shape");
    return MASKPACK_OK;
}

maskpack_status mpio_npy_parse(const void *buf, size_t len, mpio_array *out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    memset(out, 0, sizeof *out);
    if (len) MP_CHECK_NULL(err, buf, "buf");
    const uint8_t *b = buf;
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy: bad magic (expected \\x93NUMPY and a version, found %zu bytes%s)", len,
                       len >= 6 ? " with other leading bytes" : "");
    unsigned major = b[6], minor = b[7];
    size_t hlen, hstart;
    if (major == 1) {
        hlen = (size_t)b[8] | ((size_t)b[9] << 8);
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12)
            return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy: truncated version %u header", major);
        hlen = (size_t)b[8] | ((size_t)b[9] << 8) | ((size_t)b[10] << 16) | ((size_t)b[11] << 24);
        hstart = 12;
    } else {
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy: format version %u.%u is unknown (expected 1.0, 2.0 or 3.0)", major, minor);
    }
    if (minor != 0)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy: format version %u.%u is unknown (expected 1.0, 2.0 or 3.0)", major, minor);
    if (hlen > len - hstart)
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy: header length %zu is larger than the %zu bytes that follow it", hlen, len - hstart);
    const char *h = (const char *)b + hstart;
    /* the header is text: a NUL inside it means the length lies */
    if (memchr(h, 0, hlen))
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: contains a NUL byte");
    maskpack_status s = parse_header(h, hlen, out, err);
    if (s) {
        memset(out, 0, sizeof *out);
        return s;
    }
    /* sizes: numel and byte count, overflow-checked, must equal what the file holds exactly */
    int64_t numel = 1, nbytes;
    int empty = 0; /* a zero dimension: no element, however large the others (no overflow then) */
    for (int32_t d = 0; d < out->ndim; d++) empty |= out->shape[d] == 0;
    for (int32_t d = 0; d < out->ndim && !empty; d++)
        if (mp_mul_overflow(numel, out->shape[d], &numel)) {
            /* the message is formatted before the shape is cleared, so that it shows the real shape */
            char shape[200];
            mp_format_shape(shape, sizeof shape, out->ndim, out->shape);
            maskpack_status st = mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                                         "npy header: shape %s: element count overflows int64 at dimension %d (%lld)",
                                         shape, (int)d, (long long)out->shape[d]);
            memset(out, 0, sizeof *out);
            return st;
        }
    if (empty) numel = 0;
    if (mp_mul_overflow(numel, (int64_t)maskpack_dtype_size(out->dtype), &nbytes)) {
        memset(out, 0, sizeof *out);
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1, "npy header: byte size of %lld elements overflows",
                       (long long)numel);
    }
    size_t have = len - hstart - hlen;
    if ((uint64_t)nbytes != (uint64_t)have) {
        long long want = (long long)nbytes;
        memset(out, 0, sizeof *out);
        return mp_fail(err, MASKPACK_ERR_FORMAT, NPY_ARG, -1, -1,
                       "npy: header promises %lld elements = %lld data bytes, the file holds %zu", (long long)numel,
                       want, have);
    }
    if ((uint64_t)nbytes > MPIO_MAX_BYTES) {
        memset(out, 0, sizeof *out);
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, NPY_ARG, -1, -1,
                       "npy: %lld data bytes exceed the %llu this reader accepts", (long long)nbytes,
                       (unsigned long long)MPIO_MAX_BYTES);
    }
    if (nbytes > 0) {
        /* copied: the file offset may leave the data misaligned for its dtype */
        out->data = malloc((size_t)nbytes);
        if (!out->data) {
            memset(out, 0, sizeof *out);
            return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, NPY_ARG, -1, -1, "npy: out of memory for %lld bytes",
                           (long long)nbytes);
        }
        memcpy(out->data, h + hlen, (size_t)nbytes);
    }
    out->nbytes = (size_t)nbytes;
    return mp_ok(err);
}

maskpack_status mpio_npy_load(const char *path, mpio_array *out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    memset(out, 0, sizeof *out);
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_status s = mpio_read_file(path, MPIO_MAX_BYTES + (1u << 20), &buf, &len, err);
    if (s) return s;
    s = mpio_npy_parse(buf, len, out, err);
    free(buf);
    return mpio_prefix_path(err, s, path);
}

/* (descr, shape text, nbytes of data) -> *buf (malloc'd: version 1.0 header padded so the data starts
 * on a 64-byte boundary, as numpy writes it; the data left for the caller), *len, *data_at. */
static maskpack_status npy_begin(const char *descr, const char *shape, size_t nbytes, uint8_t **buf, size_t *len,
                                 size_t *data_at, maskpack_error *err) {
    char dict[MASKPACK_MAX_DIMS * 22 + 100];
    int dlen = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    size_t pre = 10, total_header = pre + (size_t)dlen + 1;
    total_header = (total_header + 63) / 64 * 64;
    size_t hlen = total_header - pre;
    if (hlen > 65535) return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "tensor", -1, -1, "tensor: header too long");
    if (nbytes > SIZE_MAX - total_header || (uint64_t)nbytes > MPIO_MAX_BYTES)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "tensor", -1, -1,
                       "tensor: %zu bytes exceed the %llu this writer accepts", nbytes,
                       (unsigned long long)MPIO_MAX_BYTES);
    uint8_t *out = malloc(total_header + nbytes);
    if (!out) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "tensor", -1, -1, "out of memory");
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)(hlen & 0xff);
    out[9] = (uint8_t)(hlen >> 8);
    memcpy(out + pre, dict, (size_t)dlen);
    memset(out + pre + dlen, ' ', hlen - (size_t)dlen - 1);
    out[total_header - 1] = '\n';
    *buf = out;
    *len = total_header + nbytes;
    *data_at = total_header;
    return mp_ok(err);
}

maskpack_status mpio_npy_encode(const maskpack_tensor *t, uint8_t **buf, size_t *len, maskpack_error *err) {
    MP_CHECK_NULL(err, buf, "buf");
    MP_CHECK_NULL(err, len, "len");
    maskpack_status s = mp_check_tensor(t, "tensor", 0, MASKPACK_MAX_DIMS, err);
    if (s) return s;
    const char *descr = mpio_npy_descr(t->dtype);
    if (!descr)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "tensor", -1, -1,
                       "tensor: dtype %s has no .npy equivalent (convert to float32 first)",
                       maskpack_dtype_name(t->dtype));
    char shape[MASKPACK_MAX_DIMS * 22 + 4];
    size_t used = 0;
    used += (size_t)snprintf(shape + used, sizeof shape - used, "(");
    for (int32_t d = 0; d < t->ndim; d++)
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%lld,%s", (long long)t->shape[d],
                                 d + 1 < t->ndim ? " " : "");
    if (t->ndim > 1) used--; /* numpy writes (3, 4) but (5,) */
    snprintf(shape + used, sizeof shape - used, ")");
    size_t nbytes = (size_t)mp_numel(t) * maskpack_dtype_size(t->dtype); /* mp_check_tensor bounded it */
    size_t at;
    s = npy_begin(descr, shape, nbytes, buf, len, &at, err);
    if (s) return s;
    mpio_copy_contiguous(t, *buf + at);
    return mp_ok(err);
}

maskpack_status mpio_npy_encode_text(const char *text, uint8_t **buf, size_t *len, maskpack_error *err) {
    MP_CHECK_NULL(err, text, "text");
    MP_CHECK_NULL(err, buf, "buf");
    MP_CHECK_NULL(err, len, "len");
    maskpack_status s = mpio_check_text(text, "text", err);
    if (s) return s;
    size_t n = strlen(text);
    char descr[32];
    snprintf(descr, sizeof descr, "<U%zu", n);
    size_t at;
    s = npy_begin(descr, "()", 4 * n, buf, len, &at, err);
    if (s) return s;
    for (size_t i = 0; i < n; i++) { /* UCS-4, little-endian: the code point, then three zero bytes */
        (*buf)[at + 4 * i] = (uint8_t)text[i];
        memset(*buf + at + 4 * i + 1, 0, 3);
    }
    return mp_ok(err);
}

maskpack_status mpio_npy_save(const char *path, const maskpack_tensor *t, maskpack_error *err) {
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_status s = mpio_npy_encode(t, &buf, &len, err);
    if (s) return s;
    s = mpio_write_file(path, buf, len, err);
    free(buf);
    return s;
}
