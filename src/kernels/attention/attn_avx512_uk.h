/* attn_avx512_uk.h: the AVX-512 micro-kernels of the f32 attention kernels (attn_avx512.c forward,
 * attn_avx512_bwd.c backward), what attn_f32_kernel.inc, attn_fwd_kernel.inc and attn_bwd_kernel.inc
 * are written over (with the row-vector vocabulary of attn_avx512_common.h: one zmm = 16 query
 * rows, 3 per block of BQ = 48): the QK^T and PV tile kernels on 8 packed keys (or 8 columns), the
 * packing of query rows and keys, the output stores, D_i and the dK/dV product. Included inside
 * the AVX-512 target region (attn_avx512_target.h) after attn_avx512_common.h; every function is
 * static. */
#ifndef MASKPACK_ATTN_AVX512_UK_H
#define MASKPACK_ATTN_AVX512_UK_H

/* ---- QK^T and PV on packed keys (layouts: attn_f32_kernel.inc) ------------------------------------ */

/* ST[r][0..48) = sum_d G[d][r] * YT[d][0..48) for the 8 keys r of one packed group. */
static inline void st_group(const float *YT, int64_t D, const float *G, float *ST) {
    __m512 acc[8][3];
    for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        const float *y = YT + d * BQ;
        __m512 y0 = _mm512_load_ps(y), y1 = _mm512_load_ps(y + 16), y2 = _mm512_load_ps(y + 32);
        const float *g = G + d * 8;
        /* the next group's keys, one line per two steps: they come from L2 */
        if (!(d & 1)) _mm_prefetch((const char *)(g + 8 * D), _MM_HINT_T0);
        for (int r = 0; r < 8; r++) {
            __m512 b = _mm512_set1_ps(g[r]);
            acc[r][0] = _mm512_fmadd_ps(b, y0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(b, y1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(b, y2, acc[r][2]);
        }
    }
    for (int r = 0; r < 8; r++) {
        _mm512_store_ps(ST + r * BQ, acc[r][0]);
        _mm512_store_ps(ST + r * BQ + 16, acc[r][1]);
        _mm512_store_ps(ST + r * BQ + 32, acc[r][2]);
    }
}

/* st_group for the row groups (zmm) ca .. ca + nv - 1 only (the other lanes of ST are left as they were). */
static inline __attribute__((always_inline)) void st_group_cv(const float *YT, int64_t D, const float *G, float *ST,
                                                              const int ca, const int nv) {
    __m512 acc[8][3], y[3];
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        for (int c = 0; c < nv; c++) y[c] = _mm512_load_ps(YT + d * BQ + 16 * (ca + c));
        const float *g = G + d * 8;
        if (!(d & 1)) _mm_prefetch((const char *)(g + 8 * D), _MM_HINT_T0);
        for (int r = 0; r < 8; r++) {
            __m512 b = _mm512_set1_ps(g[r]);
            for (int c = 0; c < nv; c++) acc[r][c] = _mm512_fmadd_ps(b, y[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < nv; c++) _mm512_store_ps(ST + r * BQ + 16 * (ca + c), acc[r][c]);
}

/* st_group for the 16-row groups of code = ca * 4 + nv (attn_f32_kernel.inc); other codes: nothing */
static inline __attribute__((always_inline)) void st_group_run(const float *YT, int64_t D, const float *G, float *ST,
                                                               int code) {
    switch (code) {
    case 3: st_group_cv(YT, D, G, ST, 0, 3); break;
    case 2: st_group_cv(YT, D, G, ST, 0, 2); break;
    case 1: st_group_cv(YT, D, G, ST, 0, 1); break;
    case 6: st_group_cv(YT, D, G, ST, 1, 2); break;
    case 5: st_group_cv(YT, D, G, ST, 1, 1); break;
    case 9: st_group_cv(YT, D, G, ST, 2, 1); break;
    default: break; /* no group sees these keys: masked later */
    }
}

/* OT[r][0..48) = OT * alpha + sum_j X[j*8 + r] * A[j][0..48) for the 8 columns of one VP slab. */
static inline void ot_group(float *OT, const float *X, const float *A, int32_t nk, const __m512 *alpha) {
    __m512 acc[8][3];
    for (int r = 0; r < 8; r++) {
        acc[r][0] = _mm512_mul_ps(_mm512_load_ps(OT + r * BQ), alpha[0]);
        acc[r][1] = _mm512_mul_ps(_mm512_load_ps(OT + r * BQ + 16), alpha[1]);
        acc[r][2] = _mm512_mul_ps(_mm512_load_ps(OT + r * BQ + 32), alpha[2]);
    }
    for (int32_t j = 0; j < nk; j++) {
        const float *a = A + j * BQ;
        __m512 a0 = _mm512_load_ps(a), a1 = _mm512_load_ps(a + 16), a2 = _mm512_load_ps(a + 32);
        const float *x = X + j * 8;
        for (int r = 0; r < 8; r++) {
            __m512 b = _mm512_set1_ps(x[r]);
            acc[r][0] = _mm512_fmadd_ps(b, a0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(b, a1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(b, a2, acc[r][2]);
        }
    }
    for (int r = 0; r < 8; r++) {
        _mm512_store_ps(OT + r * BQ, acc[r][0]);
        _mm512_store_ps(OT + r * BQ + 16, acc[r][1]);
        _mm512_store_ps(OT + r * BQ + 32, acc[r][2]);
    }
}

/* Keys [j, e) of ot_group's loop for the row groups (zmm) ca .. ca + nv - 1. */
static inline __attribute__((always_inline)) void ot_run_cv(__m512 acc[8][3], const float *X, const float *A, int32_t j,
                                                            int32_t e, const int ca, const int nv) {
    for (; j < e; j++) {
        __m512 a[3];
        for (int c = 0; c < nv; c++) a[c] = _mm512_load_ps(A + j * BQ + 16 * (ca + c));
        const float *x = X + j * 8;
        for (int r = 0; r < 8; r++) {
            __m512 b = _mm512_set1_ps(x[r]);
            for (int c = 0; c < nv; c++) acc[r][ca + c] = _mm512_fmadd_ps(b, a[c], acc[r][ca + c]);
        }
    }
}

/* ot_group over keys split into runs (run k: keys [cut[k], cut[k+1]) seen by the row groups of
 * code[k] = ca * 4 + nv); alpha is applied to every vector. */
static inline void ot_group_runs(float *OT, const float *X, const float *A, const __m512 *alpha, const int32_t *cut,
                                 const int *code, int nrun) {
    __m512 acc[8][3];
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) acc[r][c] = _mm512_mul_ps(_mm512_load_ps(OT + r * BQ + 16 * c), alpha[c]);
    for (int k = 0; k < nrun; k++) {
        int32_t a = cut[k], b = cut[k + 1];
        switch (code[k]) {
        case 3: ot_run_cv(acc, X, A, a, b, 0, 3); break;
        case 2: ot_run_cv(acc, X, A, a, b, 0, 2); break;
        case 1: ot_run_cv(acc, X, A, a, b, 0, 1); break;
        case 6: ot_run_cv(acc, X, A, a, b, 1, 2); break;
        case 5: ot_run_cv(acc, X, A, a, b, 1, 1); break;
        case 9: ot_run_cv(acc, X, A, a, b, 2, 1); break;
        default: break;
        }
    }
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) _mm512_store_ps(OT + r * BQ + 16 * c, acc[r][c]);
}

/* ---- packing and output rows ----------------------------------------------------------------- */

/* The moves' vocabulary (attn_pack.inc): 16 x 16 transposes of zmm. */
#define TW 16
typedef __m512 tvec;
#define tv_load   _mm512_load_ps
#define tv_loadu  _mm512_loadu_ps
#define tv_store  _mm512_store_ps
#define tv_storeu _mm512_storeu_ps
#define tv_stream _mm512_stream_ps
#define tv_mul    _mm512_mul_ps
#define tv_set1   _mm512_set1_ps
#define tv_tr     tr16
static inline void tv_store8(float *dst, __m512 v, int half) {
    _mm256_storeu_ps(dst, half ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v));
}

/* dst[d] = src[d] * m for d in [a, b), the last partial 16 with a masked store. */
static inline void store_masked(float *dst, const float *src, int64_t a, int64_t b, __m512 m) {
    int64_t d = a;
    for (; d + 16 <= b; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(src + d), m));
    if (d < b) {
        __mmask16 k = (__mmask16)((1u << (b - d)) - 1);
        _mm512_mask_storeu_ps(dst + d, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + d), m));
    }
}

#include "attn_pack.inc"

/* ---- backward pieces --------------------------------------------------------------------------- */

/* sum_d a[d] * b[d] in double (the products are exact), 16 lanes wide: the row's D_i. */
static __attribute__((unused)) float dot_f64(const float *a, const float *b, int64_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t d = 0; d < n; d += 16) {
        __mmask16 k = n - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - d)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, a + d), y = _mm512_maskz_loadu_ps(k, b + d);
        s0 =
            _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y)), s0);
        s1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)),
                             _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)), s1);
    }
    return (float)_mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* C [nk][Dp] += A0 x Y0 (n0 rows) then += A1 x Y1 (n1 rows): c_kernel of two query blocks with
 * the accumulators kept in registers between them (the same sums in the same order as two calls,
 * with half the accumulator traffic). */
static inline __attribute__((always_inline)) void c_block2(float *C, int64_t cs, const float *A0, const float *Y0,
                                                           int32_t n0, const float *A1, const float *Y1, int32_t n1,
                                                           int64_t ys, const int JB, const int CW) {
    __m512 acc[8][8];
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < CW; c++) acc[r][c] = _mm512_load_ps(C + r * cs + c * 16);
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < CW; c++) _mm_prefetch((const char *)(C + (JB + r) * cs + c * 16), _MM_HINT_T0);
    for (int half = 0; half < 2; half++) {
        const float *A = half ? A1 : A0, *Y = half ? Y1 : Y0;
        int32_t nr = half ? n1 : n0;
        for (int32_t x = 0; x < nr; x++) {
            __m512 y[8];
            for (int c = 0; c < CW; c++) y[c] = _mm512_load_ps(Y + x * ys + c * 16);
            for (int r = 0; r < JB; r++) {
                __m512 a = _mm512_set1_ps(A[r * BQ + x]);
                for (int c = 0; c < CW; c++) acc[r][c] = _mm512_fmadd_ps(a, y[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < CW; c++) _mm512_store_ps(C + r * cs + c * 16, acc[r][c]);
}

/* Blocks of 6 rows x 4 vectors: 24 accumulators + 4 row vectors of Y stay in registers and the 6
 * values of A are broadcast from memory, 10 loads per 24 FMAs (a wider 3 x 8 block leaves no
 * register for Y and needs 27). */
static __attribute__((unused)) void c_kernel2(float *C, int64_t cs, const float *A0, const float *Y0, int32_t n0,
                                              const float *A1, const float *Y1, int32_t n1, int64_t ys, int64_t Dp,
                                              int32_t nk) {
    int64_t nv = Dp / 16, c = 0;
#define CB2(JB, CW)                                                                                                    \
    c_block2(C + j * cs + c * 16, cs, A0 + j * BQ, Y0 + c * 16, n0, A1 + j * BQ, Y1 + c * 16, n1, ys, JB, CW)
    for (; c + 4 <= nv; c += 4) {
        int32_t j = 0;
        for (; j + 6 <= nk; j += 6) CB2(6, 4);
        switch (nk - j) {
        case 5: CB2(5, 4); break;
        case 4: CB2(4, 4); break;
        case 3: CB2(3, 4); break;
        case 2: CB2(2, 4); break;
        case 1: CB2(1, 4); break;
        default: break;
        }
    }
    for (; c < nv; c++) {
        int32_t j = 0;
        for (; j + 8 <= nk; j += 8) CB2(8, 1);
        for (; j < nk; j++) CB2(1, 1);
    }
#undef CB2
}

/* C [nk][Dp] += A [nk][BQ] x Y [nr][Dp] (Dp a multiple of 16, rows of C cs and of Y ys apart): one
 * query block, c_kernel2 with an empty second block. */
static __attribute__((unused)) void c_kernel(float *C, int64_t cs, const float *A, const float *Y, int64_t ys,
                                             int64_t Dp, int32_t nk, int32_t nr) {
    c_kernel2(C, cs, A, Y, nr, A, Y, 0, ys, Dp, nk);
}

#endif
