/* fuzz_common.h: helpers shared by the fuzz targets: a byte reader over the fuzz input, an assertion
 * that aborts (so libFuzzer or the standalone driver reports the input), and the invariants every
 * successfully built layout must satisfy. */
#ifndef MASKPACK_FUZZ_COMMON_H
#define MASKPACK_FUZZ_COMMON_H

#include "io.h"
#include "maskpack.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A violated invariant is a bug: print it and abort so the fuzzer keeps the input. */
#define FUZZ_ASSERT(cond, ...)                                                                                         \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: invariant violated: %s\n  ", __FILE__, __LINE__, #cond);                           \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Consumes the fuzz input front to back; reads past the end yield zeros. */
typedef struct fuzz_reader {
    const uint8_t *p;
    size_t n;
} fuzz_reader;

static inline uint8_t fz_u8(fuzz_reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

/* Little-endian; the reads are separate statements so the byte order does not depend on the compiler. */
static inline uint16_t fz_u16(fuzz_reader *r) {
    uint16_t lo = fz_u8(r);
    uint16_t hi = fz_u8(r);
    return (uint16_t)(lo | (hi << 8));
}

static inline uint32_t fz_u32(fuzz_reader *r) {
    uint32_t lo = fz_u16(r);
    uint32_t hi = fz_u16(r);
    return lo | (hi << 16);
}

/* An integer in [lo, hi]. */
static inline int64_t fz_range(fuzz_reader *r, int64_t lo, int64_t hi) {
    uint32_t v = fz_u32(r);
    return lo + (int64_t)(v % (uint64_t)(hi - lo + 1));
}

/* a + b saturated to the int64 range (the harness must not overflow on hostile values either) */
static inline int64_t fz_sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* Rarely (1 in 32) a hostile value, otherwise `usual`: keeps most inputs near the valid space. */
static inline int64_t fz_maybe_weird(fuzz_reader *r, int64_t usual) {
    uint8_t b = fz_u8(r);
    if (b < 248) return usual;
    static const int64_t weird[8] = {-1, -2, 2, 3, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
    return weird[b - 248];
}

/* Status codes are in range and a failure carries a message. */
static inline void fuzz_check_error(maskpack_status s, const maskpack_error *e) {
    FUZZ_ASSERT((int)s >= 0 && (int)s < MASKPACK_STATUS_COUNT_, "status %d out of range", (int)s);
    if (s == MASKPACK_OK) return;
    FUZZ_ASSERT(e->status == s, "err.status %d != returned %d", (int)e->status, (int)s);
    FUZZ_ASSERT(memchr(e->message, 0, sizeof e->message) != NULL, "message not NUL-terminated");
    FUZZ_ASSERT(e->message[0] != 0, "failure %s without a message", maskpack_status_name(s));
}

/* Invariants of any layout: sorted segments inside the grid, cached totals right, segment_of_query
 * consistent with the segments, the predicate never crossing segments or touching padding. The full
 * predicate sweep runs only on small grids. */
static inline void fuzz_check_layout(const maskpack_layout *L) {
    int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L), K = maskpack_layout_kv_width(L);
    FUZZ_ASSERT(B >= 0 && S >= 0 && K >= 0, "grid %lld x %lld / %lld", (long long)B, (long long)S, (long long)K);
    if (maskpack_layout_is_packed(L)) FUZZ_ASSERT(B == 1, "packed layout with %lld rows", (long long)B);
    size_t n = maskpack_layout_n_segments(L);
    int64_t tokens = 0, longest = 0;
    maskpack_segment prev;
    memset(&prev, 0, sizeof prev);
    for (size_t k = 0; k < n; k++) {
        maskpack_segment g;
        maskpack_error e;
        FUZZ_ASSERT(maskpack_layout_segment(L, k, &g, &e) == MASKPACK_OK, "segment %zu unreadable", k);
        FUZZ_ASSERT(g.row >= 0 && g.row < B, "segment %zu row %lld", k, (long long)g.row);
        FUZZ_ASSERT(g.q_start >= 0 && g.q_len >= 0 && g.q_start + g.q_len <= S, "segment %zu queries [%lld,+%lld)", k,
                    (long long)g.q_start, (long long)g.q_len);
        FUZZ_ASSERT(g.kv_start >= 0 && g.kv_len >= 0 && g.kv_start + g.kv_len <= K, "segment %zu keys", k);
        if (k) {
            FUZZ_ASSERT(prev.row < g.row || (prev.row == g.row && prev.q_start + prev.q_len <= g.q_start),
                        "segments %zu and %zu unsorted or overlapping", k - 1, k);
        }
        tokens += g.q_len;
        if (g.q_len > longest) longest = g.q_len;
        /* every token of short segments; the first and last 64 of long ones (lengths may be 2^31) */
        for (int64_t i = g.q_start; i < g.q_start + g.q_len; i++) {
            if (g.q_len > 128 && i == g.q_start + 64) i = g.q_start + g.q_len - 64;
            FUZZ_ASSERT(maskpack_segment_of_query(L, g.row, i) == (int64_t)k, "segment_of_query(%lld, %lld) != %zu",
                        (long long)g.row, (long long)i, k);
        }
        prev = g;
    }
    FUZZ_ASSERT(tokens == maskpack_layout_n_tokens(L), "n_tokens %lld, segments sum to %lld",
                (long long)maskpack_layout_n_tokens(L), (long long)tokens);
    FUZZ_ASSERT(longest == maskpack_layout_max_seqlen(L), "max_seqlen %lld, longest segment %lld",
                (long long)maskpack_layout_max_seqlen(L), (long long)longest);
    FUZZ_ASSERT(maskpack_segment_of_query(L, -1, 0) == -1 && maskpack_segment_of_query(L, B, 0) == -1 &&
                    maskpack_segment_of_query(L, 0, -1) == -1 && maskpack_segment_of_query(L, 0, S) == -1,
                "segment_of_query outside the grid");
    if (S == 0 || K == 0 || B > 40000 / S / K) return; /* sweep small grids only (and never overflow) */
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++) {
            int64_t k = maskpack_segment_of_query(L, b, i);
            maskpack_segment g;
            memset(&g, 0, sizeof g);
            if (k >= 0) maskpack_layout_segment(L, (size_t)k, &g, NULL);
            for (int64_t j = 0; j < K; j++) {
                int a = maskpack_allowed(L, b, 0, i, j);
                FUZZ_ASSERT(a == 0 || a == 1, "allowed returned %d", a);
                if (a)
                    FUZZ_ASSERT(k >= 0 && j >= g.kv_start && j < g.kv_start + g.kv_len,
                                "allowed(%lld, %lld, %lld) outside the query's segment", (long long)b, (long long)i,
                                (long long)j);
            }
        }
}

/* A tensor's elements read as int64 / double, honouring strides (rank <= 4). */
static inline int64_t fuzz_at_i64(const maskpack_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int32_t d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
    const uint8_t *p = (const uint8_t *)t->data + off * (int64_t)maskpack_dtype_size(t->dtype);
    switch (t->dtype) {
    case MASKPACK_BOOL:
    case MASKPACK_U8: return *p;
    case MASKPACK_I8: return (int8_t)*p;
    case MASKPACK_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case MASKPACK_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case MASKPACK_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    default: return INT64_MIN; /* floats: callers use fuzz_at_f64 */
    }
}

static inline double fuzz_half_to_double(uint16_t h, int bf16) {
    if (bf16) {
        uint32_t x = (uint32_t)h << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

static inline double fuzz_at_f64(const maskpack_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int32_t d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
    const uint8_t *p = (const uint8_t *)t->data + off * (int64_t)maskpack_dtype_size(t->dtype);
    switch (t->dtype) {
    case MASKPACK_F16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return fuzz_half_to_double(v, 0);
    }
    case MASKPACK_BF16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return fuzz_half_to_double(v, 1);
    }
    case MASKPACK_F32: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case MASKPACK_F64: {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    default: return (double)fuzz_at_i64(t, idx);
    }
}

/* Writes the integer v as dtype at C-order element e (wrapping like a C cast for narrow integers). */
static inline void fuzz_put_i64(maskpack_dtype dt, void *base, int64_t e, int64_t v) {
    uint8_t *p = (uint8_t *)base + e * (int64_t)maskpack_dtype_size(dt);
    switch (dt) {
    case MASKPACK_BOOL:
    case MASKPACK_U8:
    case MASKPACK_I8: *p = (uint8_t)v; break;
    case MASKPACK_I16: {
        uint16_t x = (uint16_t)v;
        memcpy(p, &x, 2);
        break;
    }
    case MASKPACK_I32: {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case MASKPACK_I64: memcpy(p, &v, 8); break;
    default: break;
    }
    if (!(dt <= MASKPACK_I64)) {
        double d = (double)v;
        /* floats: 0, +-1 and -inf are written exactly; others approximately */
        if (dt == MASKPACK_F32) {
            float x = (float)d;
            memcpy(p, &x, 4);
        } else if (dt == MASKPACK_F64)
            memcpy(p, &d, 8);
        else {
            uint16_t h = v == 0   ? 0
                         : v == 1 ? (dt == MASKPACK_F16 ? 0x3c00 : 0x3f80)
                         : v < 0  ? (dt == MASKPACK_F16 ? 0xbc00 : 0xbf80)
                                  : (dt == MASKPACK_F16 ? 0x7bff : 0x7f7f);
            memcpy(p, &h, 2);
        }
    }
}

/* Writes v (a small integer, or -inf / a large negative for additive masks) as dtype at C-order
 * element e. Integer dtypes receive (int64_t)v; callers keep |v| small there. */
static inline void fuzz_put(maskpack_dtype dt, void *base, int64_t e, double v) {
    uint8_t *p = (uint8_t *)base + e * (int64_t)maskpack_dtype_size(dt);
    if (dt <= MASKPACK_I64) {
        fuzz_put_i64(dt, base, e, isfinite(v) && fabs(v) < 9e18 ? (int64_t)v : (v < 0 ? INT64_MIN : INT64_MAX));
        return;
    }
    switch (dt) {
    case MASKPACK_BOOL:
    case MASKPACK_U8: *p = (uint8_t)(int64_t)v; break;
    case MASKPACK_I8: *p = (uint8_t)(int8_t)(int64_t)v; break;
    case MASKPACK_I16: {
        int16_t x = (int16_t)(int64_t)v;
        memcpy(p, &x, 2);
        break;
    }
    case MASKPACK_I32: {
        int32_t x = (int32_t)(int64_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case MASKPACK_I64: {
        int64_t x = (int64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    case MASKPACK_F32: {
        float x = (float)v;
        memcpy(p, &x, 4);
        break;
    }
    case MASKPACK_F64: memcpy(p, &v, 8); break;
    case MASKPACK_F16: {
        /* only 0, 1, -1, -inf and -65504 are ever written */
        uint16_t x = v == 0 ? 0 : v == 1 ? 0x3c00 : v == -1 ? 0xbc00 : isinf(v) ? 0xfc00 : 0xfbff;
        memcpy(p, &x, 2);
        break;
    }
    case MASKPACK_BF16: {
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, 4);
        uint16_t h = (uint16_t)(x >> 16);
        memcpy(p, &h, 2);
        break;
    }
    default: break;
    }
}

#endif
