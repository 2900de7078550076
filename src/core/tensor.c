/* tensor.c: dtype table, element access, fp16/bf16 conversion and output-shape checks. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const size_t dtype_sizes[MASKPACK_DTYPE_COUNT_] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
static const char *const dtype_names[MASKPACK_DTYPE_COUNT_] = {"bool",  "uint8",   "int8",     "int16",   "int32",
                                                               "int64", "float16", "bfloat16", "float32", "float64"};

size_t maskpack_dtype_size(maskpack_dtype d) {
    if ((int)d < 0 || (int)d >= MASKPACK_DTYPE_COUNT_) return 0;
    return dtype_sizes[d];
}

const char *maskpack_dtype_name(maskpack_dtype d) {
    if ((int)d < 0 || (int)d >= MASKPACK_DTYPE_COUNT_) return "unknown";
    return dtype_names[d];
}

int mp_dtype_is_integer(maskpack_dtype d) { return d <= MASKPACK_I64; }

maskpack_tensor maskpack_tensor_contiguous(void *data, maskpack_dtype dtype, int32_t ndim, const int64_t *shape) {
    maskpack_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    if (ndim < 0) ndim = 0;
    if (ndim > MASKPACK_MAX_DIMS) ndim = MASKPACK_MAX_DIMS;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape ? shape[d] : 0;
        t.strides[d] = stride;
        stride = mp_stride_step(stride, t.shape[d]);
    }
    return t;
}

int64_t mp_stride_step(int64_t stride, int64_t dim) {
    int64_t next;
    /* a zero (or invalid) dimension counts as 1. The product can only exceed int64 when another
     * dimension is 0 (an empty tensor: no stride is ever used) or the shape is too large (numel
     * checks reject it): saturate instead of overflowing, which is undefined behaviour in C. */
    if (mp_mul_overflow(stride, dim > 0 ? dim : 1, &next)) return INT64_MAX;
    return next;
}

int64_t mp_numel(const maskpack_tensor *t) {
    int64_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0) n = 0; /* empty: [2^40, 2^40, 0] holds 0 elements, no overflow */
    if (n == 0) {
        for (int32_t d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0) return -1;
        return 0;
    }
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0) return -1;
        if (mp_mul_overflow(n, t->shape[d], &n)) return -1;
    }
    return n;
}

maskpack_status mp_check_tensor(const maskpack_tensor *t, const char *name, int32_t min_ndim, int32_t max_ndim,
                                maskpack_error *err) {
    MP_CHECK_NULL(err, t, name);
    if ((int)t->dtype < 0 || (int)t->dtype >= MASKPACK_DTYPE_COUNT_)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected a known dtype code, found %d", name,
                       (int)t->dtype);
    if (t->ndim < min_ndim || t->ndim > max_ndim) {
        if (min_ndim == max_ndim)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1, "%s: expected %d dimensions, found %d", name,
                           (int)min_ndim, (int)t->ndim);
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1, "%s: expected %d to %d dimensions, found %d", name,
                       (int)min_ndim, (int)max_ndim, (int)t->ndim);
    }
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, d, -1, "%s: dimension %d is negative (%lld)", name, (int)d,
                           (long long)t->shape[d]);
    int64_t n = mp_numel(t);
    if (n < 0) return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, -1, -1, "%s: element count overflows int64", name);
    /* the byte extent must also fit */
    int64_t bytes;
    if (mp_mul_overflow(n, (int64_t)maskpack_dtype_size(t->dtype), &bytes))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, -1, -1, "%s: byte size overflows int64", name);
    if (n > 0 && t->data == NULL)
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, name, -1, -1, "%s: %lld elements but data is NULL", name,
                       (long long)n);
    return MASKPACK_OK;
}

/* IEEE half <-> float, bf16 <-> float, rounding to nearest even. */
uint16_t mp_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;
    if (exp == 0xffu) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
    return (uint16_t)half;
}

float mp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (man == 0) {
            x = sign;
        } else {
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        x = sign | 0x7f800000u | (man << 13);
    } else {
        x = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t mp_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)((x + rounding) >> 16);
}

float mp_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}


void mp_format_shape(char *buf, size_t cap, int32_t ndim, const int64_t *shape) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, cap - used, "[");
    for (int32_t d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static uint64_t abs_u64(int64_t v) { return v < 0 ? 0 - (uint64_t)v : (uint64_t)v; }

void mp_tensor_extent(const maskpack_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    int64_t n = mp_numel(t);
    if (n <= 0 || !t->data) {
        *lo = *hi = 0;
        return;
    }
    int64_t es = (int64_t)maskpack_dtype_size(t->dtype), a = 0, b = 0;
    for (int32_t x = 0; x < t->ndim; x++) {
        int64_t span = (t->shape[x] - 1) * t->strides[x] * es;
        if (span < 0)
            a += span;
        else
            b += span;
    }
    *lo = (uintptr_t)t->data + (uintptr_t)(intptr_t)a;
    *hi = (uintptr_t)t->data + (uintptr_t)b + (uintptr_t)es;
}

int mp_tensors_overlap(const maskpack_tensor *a, const maskpack_tensor *b) {
    if (!a || !b) return 0;
    uintptr_t a0, a1, b0, b1;
    mp_tensor_extent(a, &a0, &a1);
    mp_tensor_extent(b, &b0, &b1);
    return mp_extents_meet(a0, a1, b0, b1);
}

maskpack_status mp_check_no_self_overlap(const maskpack_tensor *t, const char *name, maskpack_error *err) {
    /* Dimensions of extent > 1 in increasing |stride|: each stride must step past everything the
     * smaller ones reach, which proves distinct indices reach distinct elements (the test PyTorch
     * and NumPy use for "non-overlapping"). A zero stride (an expanded or broadcast tensor) always
     * fails it; strides so interleaved that they fail it without sharing memory are refused too. */
    int32_t order[MASKPACK_MAX_DIMS], n = 0;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return MASKPACK_OK; /* no element */
        if (t->shape[d] > 1) order[n++] = d;
    }
    /* offsets past int64 are the callers' OVERFLOW error (their extent checks), not an overlap */
    int64_t total = 0, part;
    for (int32_t i = 0; i < n; i++) {
        uint64_t ust = abs_u64(t->strides[order[i]]);
        if (ust > INT64_MAX || mp_mul_overflow((int64_t)ust, t->shape[order[i]] - 1, &part) ||
            mp_add_overflow(total, part, &total))
            return MASKPACK_OK;
    }
    for (int32_t i = 1; i < n; i++) { /* insertion sort by |stride|: at most 8 entries */
        int32_t d = order[i], j = i;
        while (j > 0 && abs_u64(t->strides[order[j - 1]]) > abs_u64(t->strides[d])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = d;
    }
    int64_t reach = 0; /* largest element offset the dimensions so far reach */
    for (int32_t i = 0; i < n; i++) {
        int32_t d = order[i];
        int64_t st = (int64_t)abs_u64(t->strides[d]), span; /* fits: checked above */
        if (st <= reach || st == 0) {
            if (st == 0)
                return mp_fail(err, MASKPACK_ERR_OVERLAP, name, -1, -1,
                               "%s: overlaps itself: dimension %d (extent %lld) has stride 0, so its %lld elements "
                               "share memory (an expanded or broadcast tensor); pass one with its own memory for "
                               "each element",
                               name, (int)d, (long long)t->shape[d], (long long)t->shape[d]);
            return mp_fail(err, MASKPACK_ERR_OVERLAP, name, -1, -1,
                           "%s: overlaps itself: dimension %d (extent %lld, stride %lld) steps inside the %lld "
                           "elements the smaller strides span, so elements may share memory; pass one with its own "
                           "memory for each element",
                           name, (int)d, (long long)t->shape[d], (long long)t->strides[d], (long long)reach + 1);
        }
        span = st * (t->shape[d] - 1); /* <= total: no overflow */
        reach += span;
    }
    return MASKPACK_OK;
}

static maskpack_status check_dtype_and_shape(const maskpack_tensor *t, const char *name, uint32_t allowed, int32_t ndim,
                                             const int64_t *shape, maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 0, MASKPACK_MAX_DIMS, err);
    if (s) return s;
    if (!(allowed & MP_DT(t->dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: dtype %s is not accepted for this output", name,
                       maskpack_dtype_name(t->dtype));
    int same = t->ndim == ndim;
    for (int32_t d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char want[160], got[160];
        mp_format_shape(want, sizeof want, ndim, shape);
        mp_format_shape(got, sizeof got, t->ndim, t->shape);
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1, "%s: expected shape %s, found %s", name, want, got);
    }
    return MASKPACK_OK;
}

maskpack_status mp_check_output(const maskpack_tensor *t, const char *name, uint32_t allowed, int32_t ndim,
                                const int64_t *shape, maskpack_error *err) {
    maskpack_status s = check_dtype_and_shape(t, name, allowed, ndim, shape, err);
    return s ? s : mp_check_no_self_overlap(t, name, err);
}

maskpack_status mp_check_per_token_output(const maskpack_layout *L, const maskpack_tensor *t, const char *name,
                                          uint32_t allowed, maskpack_error *err) {
    if (L->packed && t && t->ndim == 1) {
        int64_t shape[1] = {L->q_width};
        return mp_check_output(t, name, allowed, 1, shape, err);
    }
    int64_t shape[2] = {L->n_rows, L->q_width};
    return mp_check_output(t, name, allowed, 2, shape, err);
}

maskpack_status mp_check_per_token_input(const maskpack_layout *L, const maskpack_tensor *t, const char *name,
                                         uint32_t allowed, maskpack_error *err) {
    if (L->packed && t && t->ndim == 1) {
        int64_t shape[1] = {L->q_width};
        return check_dtype_and_shape(t, name, allowed, 1, shape, err);
    }
    int64_t shape[2] = {L->n_rows, L->q_width};
    return check_dtype_and_shape(t, name, allowed, 2, shape, err);
}
