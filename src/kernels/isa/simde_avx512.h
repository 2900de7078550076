/* simde_avx512.h: test builds only (MASKPACK_EMULATE_AVX512, tests/c/meson.build). The AVX-512
 * intrinsics the f32 kernels (Gated DeltaNet, attention) use, carried out by SIMDe's portable implementations
 * (Debian's libsimde-dev) on any x86-64 CPU, so its code is tested on machines without AVX-512.
 * The ones this SIMDe release lacks are written out below with the hardware's semantics: masked
 * lanes are never touched in memory, and the horizontal sum adds in the order GCC's
 * _mm512_reduce_add_ps does (halves, then quarters, then pairs). So is scalef, which SIMDe forms
 * as a * 2^b through a float 2^b: that overflows for b = 128 where the instruction (and ldexp)
 * gives the representable a * 2^128 of a < 1. And so are the FMAs: without FMA in the target,
 * SIMDe multiplies and adds with two roundings, while the instruction rounds once; here each lane
 * is fmaf / fma (one rounding, as the hardware), so results match real AVX-512 bit for bit and
 * the AVX2 == AVX-512 comparisons hold under emulation too. Never part of the library. */
#ifndef MASKPACK_SIMDE_AVX512_H
#define MASKPACK_SIMDE_AVX512_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/sse.h>

#include <math.h>
#include <stdint.h>

/* names this SIMDe release defines under its own prefix only */
typedef simde__mmask16 __mmask16;
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#ifndef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4((a), (b), (imm8))
#endif

#ifndef _mm512_maskz_loadu_ps
static inline simde__m512 mp_emu_maskz_loadu_ps(simde__mmask16 k, const void *p) {
    simde__m512_private r;
    const float *f = (const float *)p;
    for (int i = 0; i < 16; i++) r.f32[i] = (k >> i) & 1 ? f[i] : 0.0f;
    return simde__m512_from_private(r);
}
#define _mm512_maskz_loadu_ps(k, p) mp_emu_maskz_loadu_ps((k), (p))
#endif

#ifndef _mm512_mask_storeu_ps
static inline void mp_emu_mask_storeu_ps(void *p, simde__mmask16 k, simde__m512 v) {
    const simde__m512_private a = simde__m512_to_private(v);
    float *f = (float *)p;
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) f[i] = a.f32[i];
}
#define _mm512_mask_storeu_ps(p, k, v) mp_emu_mask_storeu_ps((p), (k), (v))
#endif

/* VSCALEFPS for finite b: a * 2^floor(b), rounded once (ldexpf); other b as SIMDe has it */
static inline simde__m512 mp_emu_maskz_scalef_ps(simde__mmask16 k, simde__m512 a, simde__m512 b) {
    const simde__m512_private x = simde__m512_to_private(a), y = simde__m512_to_private(b);
    const simde__m512_private fallback = simde__m512_to_private(simde_mm512_scalef_ps(a, b));
    simde__m512_private r;
    for (int i = 0; i < 16; i++) {
        if (!((k >> i) & 1))
            r.f32[i] = 0.0f;
        else if (isfinite(y.f32[i]) && fabsf(y.f32[i]) < 1024.0f)
            r.f32[i] = ldexpf(x.f32[i], (int)floorf(y.f32[i]));
        else
            r.f32[i] = fallback.f32[i];
    }
    return simde__m512_from_private(r);
}
#undef _mm512_maskz_scalef_ps
#define _mm512_maskz_scalef_ps(k, a, b) mp_emu_maskz_scalef_ps((k), (a), (b))

#ifndef _mm512_stream_ps
#define _mm512_stream_ps(p, v) simde_mm512_storeu_ps((p), (v))
#endif

#ifndef _mm512_reduce_add_ps
static inline float mp_emu_reduce_add_ps(simde__m512 v) {
    const simde__m512_private a = simde__m512_to_private(v);
    float h[8], q[4];
    for (int i = 0; i < 8; i++) h[i] = a.f32[i + 8] + a.f32[i];
    for (int i = 0; i < 4; i++) q[i] = h[i + 4] + h[i];
    const float p0 = q[0] + q[2], p1 = q[1] + q[3];
    return p0 + p1;
}
#define _mm512_reduce_add_ps(v) mp_emu_reduce_add_ps(v)
#endif

#ifndef _mm512_extractf32x8_ps
static inline simde__m256 mp_emu_extractf32x8_ps(simde__m512 v, int half) {
    const simde__m512_private a = simde__m512_to_private(v);
    simde__m256_private r;
    for (int i = 0; i < 8; i++) r.f32[i] = a.f32[8 * (half & 1) + i];
    return simde__m256_from_private(r);
}
#define _mm512_extractf32x8_ps(v, imm) mp_emu_extractf32x8_ps((v), (imm))
#endif

#ifndef _mm512_cvtps_pd
static inline simde__m512d mp_emu_cvtps_pd(simde__m256 v) {
    const simde__m256_private a = simde__m256_to_private(v);
    simde__m512d_private r;
    for (int i = 0; i < 8; i++) r.f64[i] = (double)a.f32[i];
    return simde__m512d_from_private(r);
}
#define _mm512_cvtps_pd(v) mp_emu_cvtps_pd(v)
#endif

#ifndef _mm512_reduce_add_pd
static inline double mp_emu_reduce_add_pd(simde__m512d v) {
    const simde__m512d_private a = simde__m512d_to_private(v);
    double h[4];
    for (int i = 0; i < 4; i++) h[i] = a.f64[i + 4] + a.f64[i];
    const double q0 = h[2] + h[0], q1 = h[3] + h[1];
    return q0 + q1;
}
#define _mm512_reduce_add_pd(v) mp_emu_reduce_add_pd(v)
#endif

#ifndef _mm512_cmplt_epi32_mask
#define _mm512_cmplt_epi32_mask(a, b) simde_mm512_cmpgt_epi32_mask((b), (a))
#endif

/* fused multiply-adds, one rounding per lane as the instructions */
static inline simde__m512 mp_emu_fmadd_ps(simde__m512 a, simde__m512 b, simde__m512 c, int negate) {
    const simde__m512_private x = simde__m512_to_private(a), y = simde__m512_to_private(b),
                              z = simde__m512_to_private(c);
    simde__m512_private r;
    for (int i = 0; i < 16; i++) r.f32[i] = fmaf(negate ? -x.f32[i] : x.f32[i], y.f32[i], z.f32[i]);
    return simde__m512_from_private(r);
}
static inline simde__m512d mp_emu_fmadd_pd(simde__m512d a, simde__m512d b, simde__m512d c) {
    const simde__m512d_private x = simde__m512d_to_private(a), y = simde__m512d_to_private(b),
                               z = simde__m512d_to_private(c);
    simde__m512d_private r;
    for (int i = 0; i < 8; i++) r.f64[i] = fma(x.f64[i], y.f64[i], z.f64[i]);
    return simde__m512d_from_private(r);
}
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps(a, b, c) mp_emu_fmadd_ps((a), (b), (c), 0)
#undef _mm512_fnmadd_ps
#define _mm512_fnmadd_ps(a, b, c) mp_emu_fmadd_ps((a), (b), (c), 1)
#undef _mm512_fmadd_pd
#define _mm512_fmadd_pd(a, b, c) mp_emu_fmadd_pd((a), (b), (c))

#endif
