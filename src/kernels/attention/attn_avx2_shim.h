/* attn_avx2_shim.h: the subset of AVX-512 intrinsics the f32 attention kernels use (attn_avx512.c,
 * attn_avx512_bwd.c, attn_avx512_tiles.h, attn_avx512_common.h), implemented on AVX2 + FMA, so the
 * same kernel sources compile a second time for CPUs without AVX-512 (attn_avx2.c, attn_avx2_bwd.c).
 * A 16-lane vector is two __m256 halves (lanes 0-7, 8-15) and every operation works lane by lane
 * exactly as its AVX-512 original (same IEEE operation per lane, same rounding, same NaN rules of
 * max), so the AVX2 kernels give the AVX-512 kernels' bits. __mmask16 stays an integer bit mask
 * (the sources combine masks with & and |); compares go to it through movemask and blends come
 * back from it through a lane-bit test, which only the partial (masked) tiles pay.
 * Included inside the AVX2 target region (after immintrin.h), before the kernel headers; the
 * names it defines are macros that shadow the AVX-512 intrinsics for the rest of that file only. */
#ifndef MASKPACK_ATTN_AVX2_SHIM_H
#define MASKPACK_ATTN_AVX2_SHIM_H

#include <stdint.h>

#define MP2_INL static inline __attribute__((always_inline))

typedef struct {
    __m256 lo, hi;
} mp2_ps;
typedef struct {
    __m256i lo, hi;
} mp2_si;
typedef struct {
    __m256d lo, hi;
} mp2_pd;

#define __m512 mp2_ps
#define __m512i mp2_si
#define __m512d mp2_pd

/* ---- masks: bit i of a __mmask16 <-> all-ones lane i ----------------------------------------- */

MP2_INL __m256i mp2_bits_to_vec(unsigned k8) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i b = _mm256_and_si256(_mm256_set1_epi32((int)k8), bit);
    return _mm256_cmpeq_epi32(b, bit);
}
MP2_INL __mmask16 mp2_mask_of(__m256 lo, __m256 hi) {
    return (__mmask16)((unsigned)_mm256_movemask_ps(lo) | ((unsigned)_mm256_movemask_ps(hi) << 8));
}
MP2_INL __mmask16 mp2_mask_of_i(__m256i lo, __m256i hi) {
    return mp2_mask_of(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi));
}

/* ---- construction, loads, stores --------------------------------------------------------------- */

MP2_INL mp2_ps mp2_set1_ps(float x) {
    __m256 v = _mm256_set1_ps(x);
    return (mp2_ps){v, v};
}
MP2_INL mp2_ps mp2_setzero_ps(void) { return (mp2_ps){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
MP2_INL mp2_pd mp2_setzero_pd(void) { return (mp2_pd){_mm256_setzero_pd(), _mm256_setzero_pd()}; }
MP2_INL mp2_si mp2_set1_epi32(int x) {
    __m256i v = _mm256_set1_epi32(x);
    return (mp2_si){v, v};
}
MP2_INL mp2_ps mp2_load_ps(const void *p) {
    const float *f = (const float *)p;
    return (mp2_ps){_mm256_load_ps(f), _mm256_load_ps(f + 8)};
}
MP2_INL mp2_ps mp2_loadu_ps(const void *p) {
    const float *f = (const float *)p;
    return (mp2_ps){_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
}
MP2_INL mp2_si mp2_loadu_si512(const void *p) {
    const __m256i *q = (const __m256i *)p;
    return (mp2_si){_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}
MP2_INL void mp2_store_ps(void *p, mp2_ps v) {
    float *f = (float *)p;
    _mm256_store_ps(f, v.lo);
    _mm256_store_ps(f + 8, v.hi);
}
MP2_INL void mp2_storeu_ps(void *p, mp2_ps v) {
    float *f = (float *)p;
    _mm256_storeu_ps(f, v.lo);
    _mm256_storeu_ps(f + 8, v.hi);
}
MP2_INL void mp2_stream_ps(void *p, mp2_ps v) {
    float *f = (float *)p;
    _mm256_stream_ps(f, v.lo);
    _mm256_stream_ps(f + 8, v.hi);
}
/* masked lanes are neither read nor written (vmaskmov does not fault on them either) */
MP2_INL mp2_ps mp2_maskz_loadu_ps(__mmask16 k, const void *p) {
    const float *f = (const float *)p;
    return (mp2_ps){_mm256_maskload_ps(f, mp2_bits_to_vec(k & 0xffu)), _mm256_maskload_ps(f + 8, mp2_bits_to_vec(k >> 8))};
}
MP2_INL void mp2_mask_storeu_ps(void *p, __mmask16 k, mp2_ps v) {
    float *f = (float *)p;
    _mm256_maskstore_ps(f, mp2_bits_to_vec(k & 0xffu), v.lo);
    _mm256_maskstore_ps(f + 8, mp2_bits_to_vec(k >> 8), v.hi);
}

/* ---- arithmetic ------------------------------------------------------------------------------- */

#define MP2_BIN(name, op)                                                                      \
    MP2_INL mp2_ps mp2_##name(mp2_ps a, mp2_ps b) { return (mp2_ps){op(a.lo, b.lo), op(a.hi, b.hi)}; }
MP2_BIN(add_ps, _mm256_add_ps)
MP2_BIN(sub_ps, _mm256_sub_ps)
MP2_BIN(mul_ps, _mm256_mul_ps)
MP2_BIN(div_ps, _mm256_div_ps)
MP2_BIN(max_ps, _mm256_max_ps) /* same operand order: the second when either is NaN */
#undef MP2_BIN
MP2_INL mp2_ps mp2_fmadd_ps(mp2_ps a, mp2_ps b, mp2_ps c) {
    return (mp2_ps){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
MP2_INL mp2_ps mp2_fnmadd_ps(mp2_ps a, mp2_ps b, mp2_ps c) {
    return (mp2_ps){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
MP2_INL mp2_pd mp2_fmadd_pd(mp2_pd a, mp2_pd b, mp2_pd c) {
    return (mp2_pd){_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
}
MP2_INL mp2_pd mp2_add_pd(mp2_pd a, mp2_pd b) {
    return (mp2_pd){_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)};
}
MP2_INL mp2_ps mp2_abs_ps(mp2_ps a) {
    __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    return (mp2_ps){_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
/* _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC means the same to vroundps */
#define mp2_roundscale_ps(a, imm) mp2_round_ps(a, imm)
#define mp2_round_ps(a, imm) ((mp2_ps){_mm256_round_ps((a).lo, (imm)), _mm256_round_ps((a).hi, (imm))})

/* maskz_scalef_ps(keep, p, n) for the one use in exp2_ps: n integral (rounded, >= -125), so
 * p * 2^n is built as two exact power-of-two products (2^a * 2^b, a = n >> 1, b = n - a, each
 * a normal float for n in [-125, 256]; larger n are clamped to 256, which overflows to inf as
 * scalef does for any n past 128 when |p| >= 1/2) and lanes outside keep are 0. */
MP2_INL __m256 mp2_scalef_half(__m256 p, __m256 n, __m256i keep) {
    __m256i i = _mm256_cvtps_epi32(_mm256_min_ps(n, _mm256_set1_ps(256.0f)));
    __m256i a = _mm256_srai_epi32(i, 1), b = _mm256_sub_epi32(i, a), bias = _mm256_set1_epi32(127);
    __m256 sa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
    __m256 sb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, sa), sb), _mm256_castsi256_ps(keep));
}
MP2_INL mp2_ps mp2_maskz_scalef_ps(__mmask16 keep, mp2_ps p, mp2_ps n) {
    return (mp2_ps){mp2_scalef_half(p.lo, n.lo, mp2_bits_to_vec(keep & 0xffu)),
                    mp2_scalef_half(p.hi, n.hi, mp2_bits_to_vec(keep >> 8))};
}

/* ---- compares and blends ------------------------------------------------------------------------ */

#define mp2_cmp_ps_mask(a, b, pred) mp2_mask_of(_mm256_cmp_ps((a).lo, (b).lo, pred), _mm256_cmp_ps((a).hi, (b).hi, pred))
MP2_INL __mmask16 mp2_cmplt_epi32_mask(mp2_si a, mp2_si b) {
    return mp2_mask_of_i(_mm256_cmpgt_epi32(b.lo, a.lo), _mm256_cmpgt_epi32(b.hi, a.hi));
}
MP2_INL __mmask16 mp2_cmple_epi32_mask(mp2_si a, mp2_si b) {
    return (__mmask16)(~mp2_mask_of_i(_mm256_cmpgt_epi32(a.lo, b.lo), _mm256_cmpgt_epi32(a.hi, b.hi)) & 0xffffu);
}
/* lane i: b where bit i of k is set, else a */
MP2_INL mp2_ps mp2_mask_blend_ps(__mmask16 k, mp2_ps a, mp2_ps b) {
    return (mp2_ps){_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(mp2_bits_to_vec(k & 0xffu))),
                    _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(mp2_bits_to_vec(k >> 8)))};
}

/* ---- bit casts and logic ---------------------------------------------------------------------- */

MP2_INL mp2_si mp2_castps_si512(mp2_ps a) { return (mp2_si){_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
MP2_INL mp2_ps mp2_castsi512_ps(mp2_si a) { return (mp2_ps){_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
MP2_INL mp2_pd mp2_castps_pd(mp2_ps a) { return (mp2_pd){_mm256_castps_pd(a.lo), _mm256_castps_pd(a.hi)}; }
MP2_INL mp2_ps mp2_castpd_ps(mp2_pd a) { return (mp2_ps){_mm256_castpd_ps(a.lo), _mm256_castpd_ps(a.hi)}; }
MP2_INL mp2_si mp2_or_si512(mp2_si a, mp2_si b) {
    return (mp2_si){_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)};
}
MP2_INL mp2_si mp2_and_si512(mp2_si a, mp2_si b) {
    return (mp2_si){_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)};
}

/* ---- halves and widening ------------------------------------------------------------------------ */

MP2_INL __m256 mp2_castps512_ps256(mp2_ps a) { return a.lo; }
#define mp2_extractf32x8_ps(a, i) ((i) ? (a).hi : (a).lo)
/* 8 floats to 8 doubles: lanes 0-3 to the low half, 4-7 to the high half */
MP2_INL mp2_pd mp2_cvtps_pd(__m256 a) {
    return (mp2_pd){_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1))};
}
/* the reduction tree of gcc's and clang's _mm512_reduce_add_pd: halves, then quarters, then pair */
MP2_INL double mp2_reduce_add_pd(mp2_pd a) {
    __m256d t = _mm256_add_pd(a.hi, a.lo);
    __m128d u = _mm_add_pd(_mm256_extractf128_pd(t, 1), _mm256_castpd256_pd128(t));
    return _mm_cvtsd_f64(u) + _mm_cvtsd_f64(_mm_unpackhi_pd(u, u));
}

/* ---- shuffles (all within 128-bit lanes, so per 256-bit half) --------------------------------- */

MP2_INL mp2_ps mp2_unpacklo_ps(mp2_ps a, mp2_ps b) {
    return (mp2_ps){_mm256_unpacklo_ps(a.lo, b.lo), _mm256_unpacklo_ps(a.hi, b.hi)};
}
MP2_INL mp2_ps mp2_unpackhi_ps(mp2_ps a, mp2_ps b) {
    return (mp2_ps){_mm256_unpackhi_ps(a.lo, b.lo), _mm256_unpackhi_ps(a.hi, b.hi)};
}
MP2_INL mp2_pd mp2_unpacklo_pd(mp2_pd a, mp2_pd b) {
    return (mp2_pd){_mm256_unpacklo_pd(a.lo, b.lo), _mm256_unpacklo_pd(a.hi, b.hi)};
}
MP2_INL mp2_pd mp2_unpackhi_pd(mp2_pd a, mp2_pd b) {
    return (mp2_pd){_mm256_unpackhi_pd(a.lo, b.lo), _mm256_unpackhi_pd(a.hi, b.hi)};
}
/* 128-bit lanes: result lanes 0, 1 from a (imm bits 1:0, 3:2), lanes 2, 3 from b (5:4, 7:6);
 * lane k of (x.lo, x.hi) is exactly vperm2f128 selector k of (x.lo, x.hi) */
#define mp2_shuffle_f32x4(a, b, imm)                                                      \
    ((mp2_ps){_mm256_permute2f128_ps((a).lo, (a).hi, ((imm)&3) | ((((imm) >> 2) & 3) << 4)), \
              _mm256_permute2f128_ps((b).lo, (b).hi, (((imm) >> 4) & 3) | ((((imm) >> 6) & 3) << 4))})

/* ---- whole-vector forms for the hot paths (no trip through an integer mask) ----------------- */

/* exp2_ps of attn_avx512_common.h with its keep mask as a vector: the same operations per lane
 * (compare, max, round, the polynomial, the exact power-of-two scaling, zero outside keep), so the
 * same bits, without the movemask / bit-test round trip the __mmask16 form costs per vector. */
MP2_INL __m256 mp2_exp2_half(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-125.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5337576831145398e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3399860363060092e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.61851953435526e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503289975177984e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.40226466087139e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472056005104e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000000005920204f));
    return mp2_scalef_half(p, n, _mm256_castps_si256(keep));
}
MP2_INL mp2_ps mp2_exp2_ps(mp2_ps x) { return (mp2_ps){mp2_exp2_half(x.lo), mp2_exp2_half(x.hi)}; }

/* Lane masks as all-ones lanes (what lane_allowed* return in the AVX2 build). */
MP2_INL mp2_si mp2_and_mask(mp2_si a, mp2_si b) {
    return (mp2_si){_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)};
}
MP2_INL mp2_si mp2_or_mask(mp2_si a, mp2_si b) {
    return (mp2_si){_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)};
}
MP2_INL mp2_si mp2_lt_mask(mp2_si a, mp2_si b) { /* a < b */
    return (mp2_si){_mm256_cmpgt_epi32(b.lo, a.lo), _mm256_cmpgt_epi32(b.hi, a.hi)};
}
MP2_INL mp2_si mp2_le_mask(mp2_si a, mp2_si b) { /* a <= b: not a > b */
    const __m256i ones = _mm256_set1_epi32(-1);
    return (mp2_si){_mm256_xor_si256(_mm256_cmpgt_epi32(a.lo, b.lo), ones),
                    _mm256_xor_si256(_mm256_cmpgt_epi32(a.hi, b.hi), ones)};
}
/* lane i: b where k's lane i is all ones, else a (as _mm512_mask_blend_ps) */
MP2_INL mp2_ps mp2_blend_mask(mp2_si k, mp2_ps a, mp2_ps b) {
    return (mp2_ps){_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(k.lo)),
                    _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(k.hi))};
}

/* ---- the AVX-512 names, from here on the ones above -------------------------------------------- */

#undef _mm512_set1_ps
#define _mm512_set1_ps mp2_set1_ps
#undef _mm512_setzero_ps
#define _mm512_setzero_ps mp2_setzero_ps
#undef _mm512_setzero_pd
#define _mm512_setzero_pd mp2_setzero_pd
#undef _mm512_set1_epi32
#define _mm512_set1_epi32 mp2_set1_epi32
#undef _mm512_load_ps
#define _mm512_load_ps mp2_load_ps
#undef _mm512_loadu_ps
#define _mm512_loadu_ps mp2_loadu_ps
#undef _mm512_loadu_si512
#define _mm512_loadu_si512 mp2_loadu_si512
#undef _mm512_store_ps
#define _mm512_store_ps mp2_store_ps
#undef _mm512_storeu_ps
#define _mm512_storeu_ps mp2_storeu_ps
#undef _mm512_stream_ps
#define _mm512_stream_ps mp2_stream_ps
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps mp2_maskz_loadu_ps
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps mp2_mask_storeu_ps
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps mp2_fmadd_ps
#undef _mm512_fnmadd_ps
#define _mm512_fnmadd_ps mp2_fnmadd_ps
#undef _mm512_fmadd_pd
#define _mm512_fmadd_pd mp2_fmadd_pd
#undef _mm512_add_pd
#define _mm512_add_pd mp2_add_pd
#undef _mm512_abs_ps
#define _mm512_abs_ps mp2_abs_ps
#undef _mm512_maskz_scalef_ps
#define _mm512_maskz_scalef_ps mp2_maskz_scalef_ps
#undef _mm512_cmplt_epi32_mask
#define _mm512_cmplt_epi32_mask mp2_cmplt_epi32_mask
#undef _mm512_cmple_epi32_mask
#define _mm512_cmple_epi32_mask mp2_cmple_epi32_mask
#undef _mm512_mask_blend_ps
#define _mm512_mask_blend_ps mp2_mask_blend_ps
#undef _mm512_castps_si512
#define _mm512_castps_si512 mp2_castps_si512
#undef _mm512_castsi512_ps
#define _mm512_castsi512_ps mp2_castsi512_ps
#undef _mm512_castps_pd
#define _mm512_castps_pd mp2_castps_pd
#undef _mm512_castpd_ps
#define _mm512_castpd_ps mp2_castpd_ps
#undef _mm512_or_si512
#define _mm512_or_si512 mp2_or_si512
#undef _mm512_and_si512
#define _mm512_and_si512 mp2_and_si512
#undef _mm512_castps512_ps256
#define _mm512_castps512_ps256 mp2_castps512_ps256
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd mp2_cvtps_pd
#undef _mm512_reduce_add_pd
#define _mm512_reduce_add_pd mp2_reduce_add_pd
#undef _mm512_unpacklo_ps
#define _mm512_unpacklo_ps mp2_unpacklo_ps
#undef _mm512_unpackhi_ps
#define _mm512_unpackhi_ps mp2_unpackhi_ps
#undef _mm512_unpacklo_pd
#define _mm512_unpacklo_pd mp2_unpacklo_pd
#undef _mm512_unpackhi_pd
#define _mm512_unpackhi_pd mp2_unpackhi_pd
#undef _mm512_add_ps
#define _mm512_add_ps mp2_add_ps
#undef _mm512_sub_ps
#define _mm512_sub_ps mp2_sub_ps
#undef _mm512_mul_ps
#define _mm512_mul_ps mp2_mul_ps
#undef _mm512_div_ps
#define _mm512_div_ps mp2_div_ps
#undef _mm512_max_ps
#define _mm512_max_ps mp2_max_ps
#undef _mm512_roundscale_ps
#define _mm512_roundscale_ps mp2_roundscale_ps
#undef _mm512_cmp_ps_mask
#define _mm512_cmp_ps_mask mp2_cmp_ps_mask
#undef _mm512_extractf32x8_ps
#define _mm512_extractf32x8_ps mp2_extractf32x8_ps
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4 mp2_shuffle_f32x4

#endif
