/* avx2_math.h: vector math shared by the AVX2 + FMA code of the Gated DeltaNet kernels
 * (gdn/gdn_avx2.c, conv/conv.c). Include only inside a region that a target pragma compiles
 * for "avx2,fma" (x86-64 gcc/clang): the functions carry no target attribute of their own. */
#ifndef MASKPACK_ISA_AVX2_MATH_H
#define MASKPACK_ISA_AVX2_MATH_H

#include <immintrin.h>

/* exp(x): x = n ln2 + r, |r| <= ln2/2, exp(r) by its degree-7 Taylor polynomial (error below 1e-8
 * relative), then times 2^n, built in the exponent bits as 2^(n/2) 2^(n - n/2) so that n = 128 (x
 * near the top of the range) stays finite. Arguments below -87 give exactly 0 by a mask (2^n is then
 * still a normal number, so nothing runs through denormals); NaN is restored by the callers. */
static inline __attribute__((always_inline)) __m256 exp256(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.7228394f), lo = _mm256_set1_ps(-87.0f);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ); /* false for NaN too */
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n); /* exact: n is an integer in [-126, 128] */
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, s1), s2), keep);
}

#endif
