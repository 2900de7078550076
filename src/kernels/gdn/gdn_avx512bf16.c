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
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,fma,avx2,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,fma,avx2,f16c")
#endif
#include <immintrin.h>
#endif
#include <string.h>

#define BF_MR 8

static inline int64_t bf_r16(int64_t x) { return (x + 15) & ~(int64_t)15; }

/* Which entries of A the product may treat as zero (GDN_GEMM_TRI_LO / _UP): they are packed as
 * zeros, so a pair that straddles the end of a tile's inner range adds exact zeros. */
enum { BF_TRI_NONE = 0, BF_TRI_LO = 1, BF_TRI_UP = 2 };

/* Word t of the result: bf16(lo[t]) in its low half, bf16(hi[t]) in its high half (the VNNI pair
 * of two consecutive reduction indices). VCVTNE2PS2BF16 puts lo's 16 values in the low 256 bits
 * and hi's in the high ones; the word permute interleaves them. */
static inline __m512i bf_pairs(__m512 lo, __m512 hi) {
    static const uint16_t IDX[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    return _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)IDX), w);
}

/* Rows [0, kd) x columns [0, cols) of S (row stride lds) -> D[p][c] = (S[2p][c], S[2p+1][c]) for
 * p < ceil(kd / 2) (row kd read as 0), D's rows ldd words apart (ldd >= round16(cols)); columns
 * [cols, round16(cols)) are 0. tri (column c against row k): BF_TRI_LO zeroes k > c, BF_TRI_UP k < c
 * (S is a transposed A: S[k][c] = A(c, k)). */
static void bf_pack_rows(const float *S, int64_t lds, int64_t kd, int64_t cols, int tri, uint32_t *D, int64_t ldd) {
    const int64_t kp = (kd + 1) / 2;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t p = 0; p < kp; p++) {
        const int64_t k0 = 2 * p, k1 = 2 * p + 1;
        const float *r0 = S + k0 * lds, *r1 = S + k1 * lds;
        for (int64_t c = 0; c < cols; c += 16) {
            __mmask16 m = cols - c >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << (cols - c)) - 1u);
            __mmask16 m0 = m, m1 = k1 < kd ? m : (__mmask16)0;
            if (tri) {
                /* lanes c + l against the rows k0, k1 */
                const __m512i col = _mm512_add_epi32(lane, _mm512_set1_epi32((int)c));
                if (tri == BF_TRI_LO) { /* keep k <= c */
                    m0 &= (__mmask16)~_mm512_cmplt_epi32_mask(col, _mm512_set1_epi32((int)k0));
                    m1 &= (__mmask16)~_mm512_cmplt_epi32_mask(col, _mm512_set1_epi32((int)k1));
                } else { /* keep k >= c */
                    m0 &= (__mmask16)~_mm512_cmplt_epi32_mask(_mm512_set1_epi32((int)k0), col);
                    m1 &= (__mmask16)~_mm512_cmplt_epi32_mask(_mm512_set1_epi32((int)k1), col);
                }
            }
            const __m512 x0 = _mm512_maskz_loadu_ps(m0, r0 + c);
            const __m512 x1 = m1 ? _mm512_maskz_loadu_ps(m1, r1 + c) : _mm512_setzero_ps();
            _mm512_storeu_si512((void *)(D + p * ldd + c), bf_pairs(x0, x1));
        }
    }
}

/* The lanes l < 16 with lo <= base + l < hi, as a mask. */
static inline __mmask16 bf_range(int64_t lo, int64_t hi, int64_t base) {
    const int64_t a = lo - base < 0 ? 0 : lo - base > 16 ? 16 : lo - base;
    const int64_t b = hi - base < 0 ? 0 : hi - base > 16 ? 16 : hi - base;
    return (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
}

/* Rows [0, m) of A (row stride lda), columns [0, kd) -> D[i][p] = (A[i][2p], A[i][2p+1]), D's rows
 * ldd >= round16(ceil(kd / 2)) words apart, column kd and on 0. tri: BF_TRI_LO zeroes k > i,
 * BF_TRI_UP k < i. Consecutive floats of a row are the pairs already: one conversion of 32. */
static void bf_pack_cols(const float *A, int64_t lda, int64_t m, int64_t kd, int tri, uint32_t *D, int64_t ldd) {
    for (int64_t i = 0; i < m; i++) {
        const float *a = A + i * lda;
        /* the row's kept columns [lo, hi) */
        const int64_t lo = tri == BF_TRI_UP ? (i < kd ? i : kd) : 0;
        const int64_t hi = tri == BF_TRI_LO ? (i + 1 < kd ? i + 1 : kd) : kd;
        for (int64_t k = 0; k < kd; k += 32) {
            const __mmask16 mlo = bf_range(lo, hi, k), mhi = bf_range(lo, hi, k + 16);
            const __m512 x0 = _mm512_maskz_loadu_ps(mlo, a + k), x1 = _mm512_maskz_loadu_ps(mhi, a + k + 16);
            _mm512_storeu_si512((void *)(D + i * ldd + k / 2), (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
        }
    }
}

/* One MR x (16*NV) tile of C from the packed operands: pairs [p0, p1), A's pair (i, p) at
 * Ap[i*ars + p*aks], B's at Bp[p*ldb + j]. MR_ and NV are compile-time constants at every call
 * site (BF_TILE), so the loops unroll and the accumulators live in registers. The epilogue is the
 * f32 build's: C = alpha acc, or cs Cin + alpha acc. */
static inline __attribute__((always_inline)) void ukb(const int mr, const int nv, int64_t p0, int64_t p1, float alpha,
                                                      const uint32_t *Ap, int64_t ars, int64_t aks, const uint32_t *Bp,
                                                      int64_t ldb, float *C, int64_t ldc, int acc, const float *Cin,
                                                      float cs) {
    __m512 c0[BF_MR], c1[BF_MR];
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
        __m512 x0 = _mm512_mul_ps(c0[i], va);
        if (acc) x0 = _mm512_fmadd_ps(_mm512_loadu_ps(ci), vcs, x0);
        _mm512_storeu_ps(c, x0);
        if (nv == 2) {
            __m512 x1 = _mm512_mul_ps(c1[i], va);
            if (acc) x1 = _mm512_fmadd_ps(_mm512_loadu_ps(ci + 16), vcs, x1);
            _mm512_storeu_ps(c + 16, x1);
        }
    }
}

#define BF_CASE(MR_)                                                                                                   \
    case MR_:                                                                                                          \
        if (nv == 2)                                                                                                   \
            ukb(MR_, 2, p0, p1, alpha, a, ars, aks, Bp + j0, n, C + i0 * ldc + j0, ldc, acc, Cin + i0 * ldc + j0, cs); \
        else                                                                                                           \
            ukb(MR_, 1, p0, p1, alpha, a, ars, aks, Bp + j0, n, C + i0 * ldc + j0, ldc, acc, Cin + i0 * ldc + j0, cs); \
        break;
#define BF_TILE(MR_)                                                                                                   \
    do {                                                                                                               \
        switch (MR_) {                                                                                                 \
            BF_CASE(8)                                                                                                 \
            BF_CASE(7)                                                                                                 \
            BF_CASE(6)                                                                                                 \
            BF_CASE(5)                                                                                                 \
            BF_CASE(4)                                                                                                 \
            BF_CASE(3)                                                                                                 \
            BF_CASE(2)                                                                                                 \
            BF_CASE(1)                                                                                                 \
        default: break;                                                                                                \
        }                                                                                                              \
    } while (0)

/* (m, n, kd, at) -> words of packing one product takes: A's pairs (m rows of round16(kp) words,
 * or kp rows of round16(m) when A is stored transposed) and B's (kp rows of n words). */
static int64_t bf_words(int64_t m, int64_t n, int64_t kd, int at) {
    const int64_t kp = (kd + 1) / 2;
    return (at ? kp * bf_r16(m) : m * bf_r16(kp)) + kp * n;
}

/* What the framework's products can need (gdn_kernel.inc: m, n and kd are each at most 2C or
 * Vp + Kp): Dm x (Dm/2 + 16) for A plus Dm/2 x Dm for B. */
static int64_t bf_pack_words(const gdn_problem *P) {
    const int64_t vk = P->Vp + P->Kp, dm = vk > 2 * GDN_C ? vk : 2 * GDN_C;
    return dm * (dm + 16);
}

void gdn_gemm_x_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf,
                           const float *Cin, float cs) {
    if (m <= 0 || n <= 0) return;
    const int at = (flags & GDN_GEMM_AT) != 0, acc = (flags & GDN_GEMM_ACC) != 0;
    const int tri = (flags & GDN_GEMM_TRI_LO) ? BF_TRI_LO : (flags & GDN_GEMM_TRI_UP) ? BF_TRI_UP : BF_TRI_NONE;
    const int64_t kp = (kd + 1) / 2, need = bf_words(m, n, kd, at);
    uint32_t *own = NULL, *Ap = pf && pf->pk && need <= pf->pk_words ? pf->pk : NULL;
    if (!Ap) { /* the tests' direct calls (no workspace); the framework's always fit (bf_pack_words), so
                * no library call allocates here, and none can reach the abort */
        own = mp_alloc_array((size_t)(need > 0 ? need : 1), sizeof(uint32_t));
        if (!own) abort();
        Ap = own;
    }
    /* A's pair (i, p) at Ap[i * ars + p * aks]; B's (p, j) at Bp[p * n + j] */
    int64_t ars, aks;
    uint32_t *Bp;
    if (at) {
        ars = 1, aks = bf_r16(m);
        bf_pack_rows(A, lda, kd, m, tri, Ap, aks);
        Bp = Ap + kp * aks;
    } else {
        ars = bf_r16(kp), aks = 1;
        bf_pack_cols(A, lda, m, kd, tri, Ap, ars);
        Bp = Ap + m * ars;
    }
    bf_pack_rows(B, ldb, kd, n, BF_TRI_NONE, Bp, n);
    if (flags == 0 && m >= 64) {
        /* many row blocks (the chunk's [Q; K] S): row blocks outermost, as in the f32 build */
        for (int64_t i0 = 0; i0 < m; i0 += BF_MR) {
            const int mr = (int)(m - i0 < BF_MR ? m - i0 : BF_MR);
            const uint32_t *a = Ap + i0 * ars;
            const int64_t p0 = 0, p1 = kp;
            for (int64_t j0 = 0; j0 < n; j0 += 32) {
                const int nv = n - j0 >= 32 ? 2 : 1;
                gdn_pf_drain_avx512(pf, 12, 1);
                BF_TILE(mr);
            }
        }
        free(own);
        return;
    }
    /* column panels outermost, tiles skipped and inner ranges cut as in the f32 build (the inner
     * range in pairs: a pair holding any needed index is taken whole, its other entry an exact 0) */
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int nv0 = n - j0 >= 32 ? 2 : 1;
        for (int64_t i0 = 0; i0 < m; i0 += BF_MR) {
            const int mr = (int)(m - i0 < BF_MR ? m - i0 : BF_MR);
            if ((flags & GDN_GEMM_TRI_OUT) && j0 > i0 + mr - 1) continue;
            const int nv = (flags & GDN_GEMM_TRI_OUT) && j0 + 16 > i0 + mr - 1 ? 1 : nv0;
            int64_t k0 = 0, k1 = kd;
            if (flags & GDN_GEMM_TRI_LO) k1 = i0 + mr < kd ? i0 + mr : kd;
            if (flags & GDN_GEMM_TRI_UP) k0 = i0 < kd ? i0 : kd;
            const uint32_t *a = Ap + i0 * ars;
            if (k0 >= k1) {
                for (int i = 0; i < mr; i++) {
                    float *c = C + (i0 + i) * ldc + j0;
                    const float *ci = Cin + (i0 + i) * ldc + j0;
                    for (int j = 0; j < 16 * nv; j++) c[j] = acc ? cs * ci[j] : 0.0f;
                }
                continue;
            }
            const int64_t p0 = k0 / 2, p1 = (k1 + 1) / 2;
            gdn_pf_drain_avx512(pf, 12, 1);
            BF_TILE(mr);
        }
    }
    free(own);
}

void gdn_gemm_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, unsigned flags) {
    gdn_gemm_x_avx512bf16(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, NULL, C, 1.0f);
}

static inline void bf_copy(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
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

void gdn_fwd_chunk_avx512bf16(const gdn_problem *P, size_t seg, int64_t kh, float *ws) {
    gdn_fwd_chunk_ref(P, seg, kh, ws);
}
void gdn_bwd_chunk_avx512bf16(const gdn_problem *P, size_t seg, int64_t kh, float *ws) {
    gdn_bwd_chunk_ref(P, seg, kh, ws);
}
void gdn_gemm_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, unsigned flags) {
    gdn_gemm_ref(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags);
}
void gdn_gemm_x_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf,
                           const float *Cin, float cs) {
    gdn_gemm_x_ref(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, pf, Cin, cs);
}
size_t gdn_ws_floats_fwd_bf16(const gdn_problem *P, int chunked) { return gdn_ws_floats_fwd(P, chunked); }
size_t gdn_ws_floats_bwd_bf16(const gdn_problem *P) { return gdn_ws_floats_bwd(P); }
#endif
