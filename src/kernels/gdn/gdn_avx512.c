/* gdn_avx512.c: the AVX-512 build of the gated delta rule. The chunk products run as small GEMMs
 * on an 8 x 32 register-blocked FMA micro-kernel (16 zmm accumulators; B rows streamed, A
 * broadcast), exp is a vectorised range-reduced polynomial, transposes go 16 x 16 through
 * registers. Compiled for AVX-512F by a target pragma (the rest of the library stays portable);
 * only called after the run-time CPU check in gdn_api.c. */
#include "gdn_internal.h"

#include <math.h>

#if defined(MASKPACK_EMULATE_AVX512)
/* a test build: this file's code on any CPU, every intrinsic carried out by SIMDe's portable
 * AVX-512 (../isa/simde_avx512.h); the library itself never defines this */
#define GDN_HAVE_AVX512_BUILD 1
#define GDN_AVX512_EMULATED   1
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GDN_HAVE_AVX512_BUILD 1
#endif

#ifdef GDN_HAVE_AVX512_BUILD

#ifdef GDN_AVX512_EMULATED
#include "../isa/simde_avx512.h"
#else
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma,avx2,f16c"))),              \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,fma,avx2,f16c")
#endif
#include <immintrin.h>
#endif
#include <math.h>
#include <string.h>

#define GDN_MR 8

/* One MR x (16*NV) tile of C: rows i0.., columns j0.., inner range [k0, k1). A(i, k) sits at
 * A[i*ars + k*aks]. MR_ and NV are compile-time constants at every call site (see the switch
 * below), so the loops unroll and the accumulators live in registers. */
static inline __attribute__((always_inline)) void uk(const int mr, const int nv, int64_t k0, int64_t k1, float alpha,
                                                     const float *A, int64_t ars, int64_t aks, const float *B,
                                                     int64_t ldb, float *C, int64_t ldc, int acc, const float *Cin,
                                                     float cs) {
    __m512 c0[GDN_MR], c1[GDN_MR];
    for (int i = 0; i < mr; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    const float *b = B + k0 * ldb;
    const float *a = A + k0 * aks;
    for (int64_t k = k0; k < k1; k++, b += ldb, a += aks) {
        const __m512 b0 = _mm512_loadu_ps(b);
        const __m512 b1 = nv == 2 ? _mm512_loadu_ps(b + 16) : b0;
        for (int i = 0; i < mr; i++) {
            const __m512 ai = _mm512_set1_ps(a[i * ars]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            if (nv == 2) c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vcs = _mm512_set1_ps(cs);
    for (int i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        const float *ci = Cin + i * ldc;
        __m512 x0 = _mm512_mul_ps(c0[i], va);
        if (acc) x0 = _mm512_fmadd_ps(_mm512_loadu_ps(ci), vcs, x0); /* exactly ci + x0 when cs = 1 */
        _mm512_storeu_ps(c, x0);
        if (nv == 2) {
            __m512 x1 = _mm512_mul_ps(c1[i], va);
            if (acc) x1 = _mm512_fmadd_ps(_mm512_loadu_ps(ci + 16), vcs, x1);
            _mm512_storeu_ps(c + 16, x1);
        }
    }
}

#define UK_CASE(MR_)                                                                                                   \
    case MR_:                                                                                                          \
        if (nv == 2)                                                                                                   \
            uk(MR_, 2, k0, k1, alpha, a, ars, aks, B + j0, ldb, C + i0 * ldc + j0, ldc, acc, Cin + i0 * ldc + j0, cs); \
        else                                                                                                           \
            uk(MR_, 1, k0, k1, alpha, a, ars, aks, B + j0, ldb, C + i0 * ldc + j0, ldc, acc, Cin + i0 * ldc + j0, cs); \
        break;
/* the micro-kernel for a tile of MR_ rows (1..GDN_MR), its row count a compile-time constant */
#define UK_TILE(MR_)                                                                                                   \
    do {                                                                                                               \
        switch (MR_) {                                                                                                 \
            UK_CASE(8)                                                                                                 \
            UK_CASE(7)                                                                                                 \
            UK_CASE(6)                                                                                                 \
            UK_CASE(5)                                                                                                 \
            UK_CASE(4)                                                                                                 \
            UK_CASE(3)                                                                                                 \
            UK_CASE(2)                                                                                                 \
            UK_CASE(1)                                                                                                 \
        default: break;                                                                                                \
        }                                                                                                              \
    } while (0)

/* dst[i] = src[i] * mul (dst 4-byte aligned), the whole 64-byte lines inside the row with
 * non-temporal stores; the partial lines at its ends (which may be shared with a neighbouring
 * row another thread writes) with ordinary masked stores. */
static inline void avx_stream_row(float *dst, const float *src, int64_t n, float mul) {
    const __m512 m = _mm512_set1_ps(mul);
    int64_t i = 0;
    const int64_t head = (int64_t)((64 - ((uintptr_t)dst & 63)) & 63) / 4;
    if (head > 0) {
        const int64_t h = head < n ? head : n;
        const __mmask16 k = (__mmask16)((1u << h) - 1u);
        _mm512_mask_storeu_ps(dst, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src), m));
        i = h;
    }
    for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_mul_ps(_mm512_loadu_ps(src + i), m));
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + i), m));
    }
}

/* Issues up to `count` of the pending prefetches and up to `rows` of the pending row stores. */
static inline void pf_drain(gdn_pf *pf, int count, int64_t rows) {
    if (!pf) return;
    for (int i = 0; i < count && pf->next < pf->n; i++) {
        const uintptr_t a = (uintptr_t)pf->line[pf->next++];
        if (a & 1u)
            _mm_prefetch((const char *)(a & ~(uintptr_t)1u), _MM_HINT_ET1);
        else
            _mm_prefetch((const char *)a, _MM_HINT_T1);
    }
    for (int64_t i = 0; i < rows && pf->st_next < pf->st_n; i++, pf->st_next++)
        avx_stream_row(pf->st_dst + pf->st_next * pf->st_ldd, pf->st_src + pf->st_next * pf->st_lds, pf->st_len,
                       pf->st_mul);
}

void gdn_gemm_avx512(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float *C, int64_t ldc, unsigned flags) {
    gdn_gemm_x_avx512(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, NULL, C, 1.0f);
}

void gdn_gemm_x_avx512(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                       int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs) {
    const int at = (flags & GDN_GEMM_AT) != 0, acc = (flags & GDN_GEMM_ACC) != 0;
    const int64_t ars = at ? 1 : lda, aks = at ? lda : 1;
    if (flags == 0 && m >= 64) {
        /* a plain product with many row blocks (the chunk's [Q; K] S): row blocks outermost, so
         * the block's 8 rows of A (8 lines per 16 k) stay in L1 across all column panels. The
         * other order would keep a kd x 32 panel of B in L1 instead, but B's V-wide rows are 512
         * bytes apart and such a panel maps onto a sixth of L1's sets, so it does not stay there.
         * The order of tiles changes no result. */
        for (int64_t i0 = 0; i0 < m; i0 += GDN_MR) {
            const int mr = (int)(m - i0 < GDN_MR ? m - i0 : GDN_MR);
            const float *a = A + i0 * ars;
            const int64_t k0 = 0, k1 = kd;
            for (int64_t j0 = 0; j0 < n; j0 += 32) {
                const int nv = n - j0 >= 32 ? 2 : 1;
                pf_drain(pf, 12, 1);
                UK_TILE(mr);
            }
        }
        return;
    }
    /* column panels outermost: a 32-column panel of B (kd x 32) stays in L1 across row blocks */
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int nv0 = n - j0 >= 32 ? 2 : 1;
        for (int64_t i0 = 0; i0 < m; i0 += GDN_MR) {
            const int mr = (int)(m - i0 < GDN_MR ? m - i0 : GDN_MR);
            if ((flags & GDN_GEMM_TRI_OUT) && j0 > i0 + mr - 1) continue;
            /* triangular output: the panel's second 16 columns lie wholly right of the tile's
             * diagonal for the upper row blocks; skip them (a 16-column block holding any needed
             * entry is still computed whole) */
            const int nv = (flags & GDN_GEMM_TRI_OUT) && j0 + 16 > i0 + mr - 1 ? 1 : nv0;
            int64_t k0 = 0, k1 = kd;
            if (flags & GDN_GEMM_TRI_LO) k1 = i0 + mr < kd ? i0 + mr : kd;
            if (flags & GDN_GEMM_TRI_UP) k0 = i0 < kd ? i0 : kd;
            const float *a = A + i0 * ars;
            if (k0 >= k1) {
                /* empty inner range: C = 0 (or cs * Cin) */
                for (int i = 0; i < mr; i++) {
                    float *c = C + (i0 + i) * ldc + j0;
                    const float *ci = Cin + (i0 + i) * ldc + j0;
                    for (int j = 0; j < 16 * nv; j++) c[j] = acc ? cs * ci[j] : 0.0f;
                }
                continue;
            }
            /* a tile is a few thousand cycles of FMAs: enough to hide a handful of line fetches */
            pf_drain(pf, 12, 1);
            UK_TILE(mr);
        }
    }
}

/* dst[0..n) = src[0..n) * r with r = 1/sqrt(sum src^2 + eps) when `on` (else r = 1), zeros on to
 * column np (a multiple of 16); returns r. One read of the caller's row: copied while the squares
 * are summed (16 lanes, lane l taking the elements i = l mod 16 in order, then the fixed tree of
 * _mm512_reduce_add_ps), then scaled in place in L1. */
static float avx_load_l2_f32(float *dst, const float *src, int64_t n, int64_t np, int on) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(src + i);
        acc = _mm512_fmadd_ps(x, x, acc);
        _mm512_storeu_ps(dst + i, x);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
        acc = _mm512_fmadd_ps(x, x, acc);
        _mm512_storeu_ps(dst + i, x); /* zeros past n: dst is np >= round16(n) wide */
        i += 16;
    }
    for (; i < np; i += 16) _mm512_storeu_ps(dst + i, _mm512_setzero_ps());
    if (!on) return 1.0f;
    const float r = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) + (float)MASKPACK_GDN_L2_EPS);
    const __m512 vr = _mm512_set1_ps(r);
    for (int64_t j = 0; j < n; j += 16) _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_loadu_ps(dst + j), vr));
    return r;
}

/* exp(x): x = n ln2 + r, |r| <= ln2/2, exp(r) by its degree-7 Taylor polynomial (error below
 * 1e-8 relative), then 2^n by scalef. Arguments below -87 (results under FLT_MIN: the masked
 * upper triangles get -inf) give exactly 0 by a mask rather than through a denormal scalef, whose
 * underflow would cost a microcode assist per lane. */
static inline __m512 exp512(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.7228394f), lo = _mm512_set1_ps(-87.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ); /* false for NaN too: restored by the caller */
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

void gdn_expv_avx512(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        _mm512_storeu_ps(x + i, _mm512_mask_mov_ps(exp512(v), nan, v));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mask_mov_ps(exp512(v), nan, v));
    }
}

/* 16 x 16 block: dst[c][r] = src[r][c]. Three stages: 32-bit interleave of row pairs, 64-bit
 * interleave of pair pairs, then 128-bit lane gathers across the four groups of four rows. */
static inline void tr16(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int q = 0; q < 16; q += 4) {
        r[q + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[q]), _mm512_castps_pd(t[q + 2])));
        r[q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[q]), _mm512_castps_pd(t[q + 2])));
        r[q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[q + 1]), _mm512_castps_pd(t[q + 3])));
        r[q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[q + 1]), _mm512_castps_pd(t[q + 3])));
    }
    /* r[4q + s], lane L = rows 4q..4q+3 at column 4L + s */
    for (int s = 0; s < 4; s++) {
        const __m512 v0 = _mm512_shuffle_f32x4(r[s], r[4 + s], 0x88), w0 = _mm512_shuffle_f32x4(r[s], r[4 + s], 0xdd);
        const __m512 v1 = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0x88),
                     w1 = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0xdd);
        _mm512_storeu_ps(dst + (0 + s) * ldd, _mm512_shuffle_f32x4(v0, v1, 0x88));
        _mm512_storeu_ps(dst + (8 + s) * ldd, _mm512_shuffle_f32x4(v0, v1, 0xdd));
        _mm512_storeu_ps(dst + (4 + s) * ldd, _mm512_shuffle_f32x4(w0, w1, 0x88));
        _mm512_storeu_ps(dst + (12 + s) * ldd, _mm512_shuffle_f32x4(w0, w1, 0xdd));
    }
}

void gdn_transpose_avx512(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {
    const int64_t r16 = rows & ~(int64_t)15, c16 = cols & ~(int64_t)15;
    for (int64_t r = 0; r < r16; r += 16)
        for (int64_t c = 0; c < c16; c += 16) tr16(src + r * lds + c, lds, dst + c * ldd + r, ldd);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t cstart = r < r16 ? c16 : 0;
        for (int64_t c = cstart; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
    }
}

static inline void avx_copy(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
}

/* acc[(j - j0) % 4][v] += -Lm[r][j] * A[j][16 v ..] for j in [j0, j1), v < nv: rows j of a 16-row
 * block have nonzeros in their first nv = block + 1 vectors only, so nv is a constant per block. */
static inline __attribute__((always_inline)) void inv_rows(const int nv, const float *l, const float *A, int64_t ld,
                                                           int64_t j0, int64_t j1, __m512 acc[4][4]) {
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4)
        for (int u = 0; u < 4; u++) {
            const __m512 lu = _mm512_set1_ps(-l[j + u]);
            const float *p = A + (j + u) * ld;
            for (int v = 0; v < nv; v++) acc[u][v] = _mm512_fmadd_ps(lu, _mm512_loadu_ps(p + 16 * v), acc[u][v]);
        }
    /* the last j1 - j < 4 rows (a constant set index each, so acc stays in registers) */
    for (int u = 0; u < 3; u++)
        if (j + u < j1) {
            const __m512 lu = _mm512_set1_ps(-l[j + u]);
            const float *p = A + (j + u) * ld;
            for (int v = 0; v < nv; v++) acc[u][v] = _mm512_fmadd_ps(lu, _mm512_loadu_ps(p + 16 * v), acc[u][v]);
        }
}

/* A = (I + Lm)^-1 (unit lower, n <= 64 = cn at most): row r = e_r - sum_{j<r} Lm[r][j] A[j], the
 * row held in registers. Row r needs every earlier row, so the rows form one dependency chain;
 * within a row, four sets of accumulators (j mod 4 within each 16-row block, summed in a fixed
 * order) quarter the FMA latency chain. */
static void avx_inv_lower(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld) {
    const __m512 z = _mm512_setzero_ps();
    if (n <= 0) return;
    /* Row 0 is e_0, written before the loop, so the loop starts at r = 1 with at least one block.
     * Starting at r = 0 (where the block loop runs no iteration) let GCC 12.2 at -O3 split the row
     * loop at "r > 0" (-fsplit-loops); with atomic profile counters (-fprofile-arcs
     * -fprofile-update=atomic, which --coverage with -pthread implies) the split loop then applied
     * the tail row of a block twice: row 1 became -2 Lm[1][0] instead of -Lm[1][0] (the emulated
     * AVX-512 test build; -fno-split-loops, -fno-ivopts, -fno-tree-ch or -fprofile-update=single
     * each gave the right answer, as did clang). A compiler fault, not this code's: the same source
     * is exact under every other flag set, and reads only rows it has written. */
    for (int v = 0; v < 4 && 16 * v < cn; v++) _mm512_storeu_ps(A + 16 * v, z);
    A[0] = 1.0f;
    for (int64_t r = 1; r < n; r++) {
        __m512 acc[4][4];
        for (int u = 0; u < 4; u++)
            for (int v = 0; v < 4; v++) acc[u][v] = z;
        const float *l = Lm + r * ld;
        for (int64_t jb = 0; jb * 16 < r; jb++) {
            const int64_t j0 = jb * 16, j1 = j0 + 16 < r ? j0 + 16 : r;
            switch (jb) {
            case 0: inv_rows(1, l, A, ld, j0, j1, acc); break;
            case 1: inv_rows(2, l, A, ld, j0, j1, acc); break;
            case 2: inv_rows(3, l, A, ld, j0, j1, acc); break;
            default: inv_rows(4, l, A, ld, j0, j1, acc); break;
            }
        }
        float *ar = A + r * ld;
        for (int v = 0; v < 4 && 16 * v < cn; v++)
            _mm512_storeu_ps(ar + 16 * v,
                             _mm512_add_ps(_mm512_add_ps(acc[0][v], acc[1][v]), _mm512_add_ps(acc[2][v], acc[3][v])));
        /* the diagonal: rows j < r are zero in column r, so the sum there is 0 and the entry is
         * exactly the identity's 1 */
        ar[r] = 1.0f;
    }
}

/* The decay rows in one pass per 16-column block (see k_decay_rows in gdn_kernel.inc): the
 * differences, their exp (NaN kept as NaN, like gdn_expv_avx512), L and P, with the same products
 * in the same order as the portable version. Blocks wholly right of the diagonal only get zeros. */
static void avx_decay_rows(const float *Gc, const float *bv, const float *KK, const float *QK, float *D, float *Lm,
                           float *Pm, int64_t n, int64_t cn, int64_t ld) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), z = _mm512_setzero_ps();
    for (int64_t r = 0; r < n; r++) {
        const __m512 gr = _mm512_set1_ps(Gc[r]), br = _mm512_set1_ps(bv[r]);
        float *d = D + r * ld, *l = Lm + r * ld, *p = QK ? Pm + r * ld : NULL;
        const float *kk = KK + r * ld, *qk = QK ? QK + r * ld : NULL;
        for (int64_t jb = 0; jb < cn; jb += 16) {
            if (jb > r) {
                _mm512_storeu_ps(l + jb, z);
                if (p) _mm512_storeu_ps(p + jb, z);
                continue;
            }
            const int64_t le = r - jb + 1 < 16 ? r - jb + 1 : 16, lt = r - jb < 16 ? r - jb : 16;
            const __mmask16 mle = (__mmask16)((1u << le) - 1u), mlt = (__mmask16)((1u << lt) - 1u);
            __m512 x = _mm512_mask_sub_ps(ninf, mle, gr, _mm512_maskz_loadu_ps(mle, Gc + jb));
            const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            const __m512 dv = _mm512_mask_mov_ps(exp512(x), nan, x);
            _mm512_storeu_ps(d + jb, dv);
            _mm512_storeu_ps(l + jb, _mm512_maskz_mul_ps(mlt, _mm512_mul_ps(br, _mm512_loadu_ps(kk + jb)), dv));
            if (p) _mm512_storeu_ps(p + jb, _mm512_maskz_mul_ps(mle, _mm512_loadu_ps(qk + jb), dv));
        }
    }
}

/* the row primitives the AVX512-BF16 build (gdn_avx512bf16.c) shares, as functions */
void gdn_pf_drain_avx512(gdn_pf *pf, int count, int64_t rows) { pf_drain(pf, count, rows); }
void gdn_stream_row_avx512(float *dst, const float *src, int64_t n, float mul) { avx_stream_row(dst, src, n, mul); }
float gdn_load_l2_f32_avx512(float *dst, const float *src, int64_t n, int64_t np, int on) {
    return avx_load_l2_f32(dst, src, n, np, on);
}
void gdn_decay_rows_avx512(const float *Gc, const float *bv, const float *KK, const float *QK, float *D, float *Lm,
                           float *Pm, int64_t n, int64_t cn, int64_t ld) {
    avx_decay_rows(Gc, bv, KK, QK, D, Lm, Pm, n, cn, ld);
}

#define K_HAVE_LOAD_L2    1
#define k_load_l2_f32     avx_load_l2_f32
#define K_HAVE_DECAY_ROWS 1
#define k_decay_rows      avx_decay_rows
#define GDN_SUFFIX(name)  name##_avx512
#define k_gemm            gdn_gemm_avx512
#define k_gemm_x          gdn_gemm_x_avx512
#define k_pf_flush(pf)    pf_drain((pf), 1 << 30, INT64_MAX)
#define K_CAN_STREAM      1
#define k_stream_row      avx_stream_row
#define k_stream_fence()  _mm_sfence()
#define k_expv            gdn_expv_avx512
#define k_transpose       gdn_transpose_avx512
#define k_copy            avx_copy
#define k_inv_lower       avx_inv_lower
#include "gdn_kernel.inc"

#ifndef GDN_AVX512_EMULATED
#include "../isa/target_pop.h"
#endif

#else /* no AVX-512 build on this compiler/architecture: the dispatcher never selects it */

GDN_REF_FALLBACKS(avx512)
#endif
