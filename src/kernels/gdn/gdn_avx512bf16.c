/* gdn_avx512bf16.c: the AVX512-BF16 build of the gated delta rule, for bf16 inputs. The algorithm
 * is gdn_kernel.inc's, over the AVX-512 build's primitives (exp, transpose, the chunk inverse, the
 * decay rows, row loads and stores: gdn_avx512.c's, called as functions), except for the chunk
 * products: every product of the chunked forward and of the backward (K K^T, Q K^T, the WY
 * products A [beta V | beta E K] and A Y, the state products [Q; K] S and W S, P Dv, the state
 * update K^T Dv, and the backward's products of the same operands and their gradients) takes its
 * two operands rounded to bf16 (to nearest even) and accumulates in f32 with VDPBF16PS, which
 * multiplies pairs along the reduction dimension: twice the multiply-adds of an f32 FMA per
 * instruction. What the algorithm keeps is f32, as flash-linear-attention does on GPUs: the
 * recurrent state S and its gradient (only their copies feeding a product are rounded, once per
 * product), the triangular inverse, the gates and decays, every elementwise step and every sum.
 * The packing into bf16 pairs and the product's driver (blocking, triangular cuts, epilogue) are
 * shared with the AMX build (gdn_amx.c) through gdn_bf16_gemm.h; this file supplies the register
 * micro-kernel (blocks of 8 rows x 32 columns, one VDPBF16PS per row, pair and 16 columns).
 * Compiled for AVX-512 + AVX512-BF16 by a target pragma; only selected after the run-time check
 * (mp_kernel_pick: the CPU must have avx512_bf16). */
#include "gdn_internal.h"

#include <math.h>
#include <stdlib.h>

#if defined(MASKPACK_EMULATE_AVX512)
/* a test build: the AVX-512 intrinsics carried out by SIMDe, the AVX512-BF16 ones (VCVTNE2PS2BF16,
 * VDPBF16PS) by ../isa/simde_amx.h with the instruction set reference's semantics; selected only in
 * the build whose CPU check reports AVX512-BF16 (MASKPACK_EMULATE_AMX) */
#define GDN_BF16_BUILD    1
#define GDN_BF16_EMULATED 1
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GDN_BF16_BUILD 1
#endif

#ifdef GDN_BF16_BUILD

#ifdef GDN_BF16_EMULATED
#include "../isa/simde_amx.h"
#else
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,fma,avx2,f16c"))),   \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,fma,avx2,f16c")
#endif
#include <immintrin.h>
#endif
#include <string.h>

#define BF_TILES 0
#include "gdn_bf16_gemm.h"

/* One MR x (16*NV) tile of C from the packed operands: pairs [p0, p1), A's pair (i, p) at
 * Ap[i*ars + p*aks], B's at Bp[p*ldb + j]. MR_ and NV are compile-time constants at every call
 * site (bf_block), so the loops unroll and the accumulators live in registers. The epilogue is the
 * f32 build's: C = alpha acc, or cs Cin + alpha acc. */
static inline __attribute__((always_inline)) void ukb(const int mr, const int nv, int64_t p0, int64_t p1, float alpha,
                                                      const uint32_t *Ap, int64_t ars, int64_t aks, const uint32_t *Bp,
                                                      int64_t ldb, float *C, int64_t ldc, int acc, const float *Cin,
                                                      float cs) {
    __m512 c0[BF_MB], c1[BF_MB];
    for (int i = 0; i < mr; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    const uint32_t *b = Bp + p0 * ldb, *a = Ap + p0 * aks;
    for (int64_t p = p0; p < p1; p++, b += ldb, a += aks) {
        const __m512i b0 = _mm512_loadu_si512((const void *)b);
        const __m512i b1 = nv == 2 ? _mm512_loadu_si512((const void *)(b + 16)) : b0;
        for (int i = 0; i < mr; i++) {
            const __m512i ai = _mm512_set1_epi32((int)a[i * ars]);
            c0[i] = _mm512_dpbf16_ps(c0[i], (__m512bh)b0, (__m512bh)ai);
            if (nv == 2) c1[i] = _mm512_dpbf16_ps(c1[i], (__m512bh)b1, (__m512bh)ai);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vcs = _mm512_set1_ps(cs);
    for (int i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        const float *ci = Cin + i * ldc;
        _mm512_storeu_ps(c, bf_out(c0[i], ci, va, vcs, acc));
        if (nv == 2) _mm512_storeu_ps(c + 16, bf_out(c1[i], ci + 16, va, vcs, acc));
    }
}

#define BF_CASE(MR_)                                                                                                   \
    case MR_:                                                                                                          \
        if (nv == 2)                                                                                                   \
            ukb(MR_, 2, p0, p1, alpha, a, ars, aks, Bp, ldb, C, ldc, acc, Cin, cs);                                    \
        else                                                                                                           \
            ukb(MR_, 1, p0, p1, alpha, a, ars, aks, Bp, ldb, C, ldc, acc, Cin, cs);                                    \
        break;

/* The driver's block (gdn_bf16_gemm.h): mr <= BF_MB = 8 rows by the register kernel, mr a
 * compile-time constant in each case so its loops unroll; half is implied by nv here (mr <= 8). */
static inline __attribute__((always_inline)) void bf_block(int mr, int nv, int half, int64_t p0, int64_t p1,
                                                           float alpha, const uint32_t *a, int64_t ars, int64_t aks,
                                                           const uint32_t *Bp, int64_t ldb, float *C, int64_t ldc,
                                                           int acc, const float *Cin, float cs) {
    (void)half;
    switch (mr) {
        BF_CASE(8)
        BF_CASE(7)
        BF_CASE(6)
        BF_CASE(5)
        BF_CASE(4)
        BF_CASE(3)
        BF_CASE(2)
        BF_CASE(1)
    default: break;
    }
}
#undef BF_CASE

void gdn_gemm_x_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                           int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs) {
    bf_gemm_x(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, pf, Cin, cs);
}

void gdn_gemm_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, unsigned flags) {
    gdn_gemm_x_avx512bf16(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, NULL, C, 1.0f);
}

#define K_HAVE_LOAD_L2    1
#define k_load_l2_f32     gdn_load_l2_f32_avx512
#define K_HAVE_DECAY_ROWS 1
#define k_decay_rows      gdn_decay_rows_avx512
#define GDN_SUFFIX(name)  name##_avx512bf16
#define GDN_DEFINE_SIZES  1
#define GDN_SIZES(name)   name##_bf16
#define K_PACK_WORDS(P)   bf_pack_words(P)
#define k_gemm            gdn_gemm_avx512bf16
#define k_gemm_x          gdn_gemm_x_avx512bf16
#define k_pf_flush(pf)    gdn_pf_drain_avx512((pf), 1 << 30, INT64_MAX)
#define K_CAN_STREAM      1
#define k_stream_row      gdn_stream_row_avx512
#define k_stream_fence()  _mm_sfence()
#define k_expv            gdn_expv_avx512
#define k_transpose       gdn_transpose_avx512
#define k_copy            bf_copy
#define k_inv_lower       gdn_inv_lower_avx512
#include "gdn_kernel.inc"

#ifndef GDN_BF16_EMULATED
#include "../isa/target_pop.h"
#endif

#else /* no AVX512-BF16 build on this compiler/architecture: the dispatcher never selects it */

GDN_BF16_REF_FALLBACKS(avx512bf16, bf16)
#endif
