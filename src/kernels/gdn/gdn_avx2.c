/* gdn_avx2.c: the AVX2 + FMA build of the gated delta rule, for CPUs without AVX-512 (AMD Zen 1-3,
 * Intel client cores). The same primitives as gdn_avx512.c at half the vector width: the chunk
 * products run on a 6 x 16 register-blocked FMA micro-kernel (12 ymm accumulators + 2 B vectors +
 * 1 broadcast = 15 of the 16 ymm registers), exp is a range-reduced polynomial with the power of
 * two built in the exponent bits (AVX2 has no scalef), transposes go 8 x 8 through registers.
 * Compiled for "avx2,fma" by a target pragma (the rest of the library stays portable); only
 * called after the run-time CPU check in gdn_api.c. */
#include "gdn_internal.h"

#include <math.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GDN_HAVE_AVX2_BUILD 1
#endif

#ifdef GDN_HAVE_AVX2_BUILD

#include "../isa/target_avx2.h"

#include <immintrin.h>
#include <string.h>

#include "../isa/avx2_math.h"

#define GDN_MR2 6

/* mask of the first n (0..8) lanes, for maskload/maskstore and blends */
static inline __m256i avx2_lanes(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Row i of a tile: C[i][0..16) = alpha acc (+ cs Cin[i][..] with acc). */
static inline __attribute__((always_inline)) void uk2_out(__m256 x0, __m256 x1, __m256 va, __m256 vcs, float *c,
                                                          const float *ci, int acc) {
    x0 = _mm256_mul_ps(x0, va);
    x1 = _mm256_mul_ps(x1, va);
    if (acc) { /* exactly ci + x when cs = 1 */
        x0 = _mm256_fmadd_ps(_mm256_loadu_ps(ci), vcs, x0);
        x1 = _mm256_fmadd_ps(_mm256_loadu_ps(ci + 8), vcs, x1);
    }
    _mm256_storeu_ps(c, x0);
    _mm256_storeu_ps(c + 8, x1);
}

/* One MR x 16 tile of C: rows i0.., columns j0..j0+15, inner range [k0, k1). A(i, k) sits at
 * A[i*ars + k*aks]. mr is a compile-time constant in each uk2_MR below, so the unused rows fold
 * away. The 2*mr accumulators are named variables, not an array: in a function of its own the
 * compiler may keep an array on the stack (a store and a reload every iteration), while named
 * vectors stay in registers. */
static inline __attribute__((always_inline)) void uk2(const int mr, int64_t k0, int64_t k1, float alpha, const float *A,
                                                      int64_t ars, int64_t aks, const float *B, int64_t ldb, float *C,
                                                      int64_t ldc, int acc, const float *Cin, float cs) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *b = B + k0 * ldb;
    const float *a = A + k0 * aks;
    for (int64_t k = k0; k < k1; k++, b += ldb, a += aks) {
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#define UK2_ROW(I_)                                                                                                    \
    if (mr > I_) {                                                                                                     \
        const __m256 ai = _mm256_broadcast_ss(a + I_ * ars);                                                           \
        c##I_##0 = _mm256_fmadd_ps(ai, b0, c##I_##0);                                                                  \
        c##I_##1 = _mm256_fmadd_ps(ai, b1, c##I_##1);                                                                  \
    }
        UK2_ROW(0)
        UK2_ROW(1)
        UK2_ROW(2)
        UK2_ROW(3)
        UK2_ROW(4)
        UK2_ROW(5)
#undef UK2_ROW
    }
    const __m256 va = _mm256_set1_ps(alpha), vcs = _mm256_set1_ps(cs);
    uk2_out(c00, c01, va, vcs, C, Cin, acc);
    if (mr > 1) uk2_out(c10, c11, va, vcs, C + ldc, Cin + ldc, acc);
    if (mr > 2) uk2_out(c20, c21, va, vcs, C + 2 * ldc, Cin + 2 * ldc, acc);
    if (mr > 3) uk2_out(c30, c31, va, vcs, C + 3 * ldc, Cin + 3 * ldc, acc);
    if (mr > 4) uk2_out(c40, c41, va, vcs, C + 4 * ldc, Cin + 4 * ldc, acc);
    if (mr > 5) uk2_out(c50, c51, va, vcs, C + 5 * ldc, Cin + 5 * ldc, acc);
}

/* The tile kernel per row count, each its own (never inlined) function: the loop needs 15 of the
 * 16 vector registers, and inlined into the GEMM's constant-propagated copies it competes with
 * their values, so an accumulator may land on the stack (a store and a reload in its FMA chain
 * every iteration: half speed for Q K^T, 0.7x for A Y in the forward). On its own the loop gets
 * its registers; the call costs a few cycles per tile of hundreds. */
#define UK2_FN(MR_)                                                                                                    \
    static __attribute__((noinline)) void uk2_##MR_(int64_t k0, int64_t k1, float alpha, const float *A, int64_t ars,  \
                                                    int64_t aks, const float *B, int64_t ldb, float *C, int64_t ldc,   \
                                                    int acc, const float *Cin, float cs) {                             \
        uk2(MR_, k0, k1, alpha, A, ars, aks, B, ldb, C, ldc, acc, Cin, cs);                                            \
    }
UK2_FN(1)
UK2_FN(2)
UK2_FN(3)
UK2_FN(4)
UK2_FN(5)
UK2_FN(6)
#undef UK2_FN

#define UK2_CASE(MR_)                                                                                                  \
    case MR_:                                                                                                          \
        uk2_##MR_(k0, k1, alpha, a, ars, aks, B + j0, ldb, C + i0 * ldc + j0, ldc, acc, Cin + i0 * ldc + j0, cs);      \
        break;
/* the micro-kernel for a tile of MR_ rows (1..GDN_MR2) */
#define UK2_TILE(MR_)                                                                                                  \
    do {                                                                                                               \
        switch (MR_) {                                                                                                 \
            UK2_CASE(6)                                                                                                \
            UK2_CASE(5)                                                                                                \
            UK2_CASE(4)                                                                                                \
            UK2_CASE(3)                                                                                                \
            UK2_CASE(2)                                                                                                \
            UK2_CASE(1)                                                                                                \
        default: break;                                                                                                \
        }                                                                                                              \
    } while (0)

/* dst[i] = src[i] * mul (dst 4-byte aligned): the whole 64-byte lines inside the row with
 * non-temporal stores (two 32-byte halves fill one write-combining buffer); the partial lines at
 * its ends (which may be shared with a neighbouring row another thread writes) with ordinary
 * masked stores. */
static inline void avx2_stream_row(float *dst, const float *src, int64_t n, float mul) {
    const __m256 m = _mm256_set1_ps(mul);
    int64_t i = 0;
    const int64_t head = (int64_t)((64 - ((uintptr_t)dst & 63)) & 63) / 4;
    const int64_t h = head < n ? head : n;
    for (; i < h; i += 8) {
        const __m256i k = avx2_lanes(h - i);
        _mm256_maskstore_ps(dst + i, k, _mm256_mul_ps(_mm256_maskload_ps(src + i, k), m));
    }
    i = h;
    for (; i + 16 <= n; i += 16) {
        _mm256_stream_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), m));
        _mm256_stream_ps(dst + i + 8, _mm256_mul_ps(_mm256_loadu_ps(src + i + 8), m));
    }
    for (; i < n; i += 8) {
        const __m256i k = avx2_lanes(n - i);
        _mm256_maskstore_ps(dst + i, k, _mm256_mul_ps(_mm256_maskload_ps(src + i, k), m));
    }
}

/* Issues up to `count` of the pending prefetches and up to `rows` of the pending row stores. Lines
 * to be written are fetched like the others (PREFETCHW is not part of AVX2). */
static inline void pf_drain2(gdn_pf *pf, int count, int64_t rows) {
    if (!pf) return;
    for (int i = 0; i < count && pf->next < pf->n; i++) {
        const uintptr_t a = (uintptr_t)pf->line[pf->next++];
        _mm_prefetch((const char *)(a & ~(uintptr_t)1u), _MM_HINT_T1);
    }
    for (int64_t i = 0; i < rows && pf->st_next < pf->st_n; i++, pf->st_next++)
        avx2_stream_row(pf->st_dst + pf->st_next * pf->st_ldd, pf->st_src + pf->st_next * pf->st_lds, pf->st_len,
                        pf->st_mul);
}

void gdn_gemm_avx2(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc, unsigned flags) {
    gdn_gemm_x_avx2(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, NULL, C, 1.0f);
}

void gdn_gemm_x_avx2(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs) {
    const int at = (flags & GDN_GEMM_AT) != 0, acc = (flags & GDN_GEMM_ACC) != 0;
    const int64_t ars = at ? 1 : lda, aks = at ? lda : 1;
    if ((flags & ~(unsigned)(GDN_GEMM_ACC | GDN_GEMM_AT)) == 0 && m >= 64) {
        /* a rectangular product with many row blocks (the chunk's [Q; K] S, the state update and
         * the backward's state products): row blocks outermost, so the block's 6 rows (or, with
         * AT, columns) of A stay in L1 across all column panels. The other order would keep a kd
         * x 16 panel of B there instead, but B's rows are a power of two apart (V-wide), so such a
         * panel maps onto few L1 sets and does not stay (measured here: the state update went from
         * ~78% to ~85% of the FMA peak). The order of tiles changes no result. */
        for (int64_t i0 = 0; i0 < m; i0 += GDN_MR2) {
            const int mr = (int)(m - i0 < GDN_MR2 ? m - i0 : GDN_MR2);
            const float *a = A + i0 * ars;
            const int64_t k0 = 0, k1 = kd;
            for (int64_t j0 = 0; j0 < n; j0 += 16) {
                if ((j0 & 31) == 0) pf_drain2(pf, 6, 1);
                UK2_TILE(mr);
            }
        }
        return;
    }
    /* column panels outermost: a 16-column panel of B (kd x 16) stays in L1 across row blocks */
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        for (int64_t i0 = 0; i0 < m; i0 += GDN_MR2) {
            const int mr = (int)(m - i0 < GDN_MR2 ? m - i0 : GDN_MR2);
            /* triangular output: a panel wholly right of the tile's diagonal is not needed */
            if ((flags & GDN_GEMM_TRI_OUT) && j0 > i0 + mr - 1) continue;
            int64_t k0 = 0, k1 = kd;
            if (flags & GDN_GEMM_TRI_LO) k1 = i0 + mr < kd ? i0 + mr : kd;
            if (flags & GDN_GEMM_TRI_UP) k0 = i0 < kd ? i0 : kd;
            const float *a = A + i0 * ars;
            if (k0 >= k1) {
                /* empty inner range: C = 0 (or cs * Cin) */
                for (int i = 0; i < mr; i++) {
                    float *c = C + (i0 + i) * ldc + j0;
                    const float *ci = Cin + (i0 + i) * ldc + j0;
                    for (int j = 0; j < 16; j++) c[j] = acc ? cs * ci[j] : 0.0f;
                }
                continue;
            }
            /* a tile is up to a couple of thousand cycles of FMAs: enough to hide a few line fetches */
            pf_drain2(pf, 6, 1);
            UK2_TILE(mr);
        }
    }
}

/* horizontal sum of 8 lanes in a fixed tree (deterministic: the same on every call) */
static inline float avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* dst[0..n) = src[0..n) * r with r = 1/sqrt(sum src^2 + eps) when `on` (else r = 1), zeros on to
 * column np (a multiple of 16); returns r. One read of the caller's row: copied while the squares
 * are summed (two 8-lane accumulators for the even and odd vectors, then a fixed tree), then
 * scaled in place in L1. */
static float avx2_load_l2_f32(float *dst, const float *src, int64_t n, int64_t np, int on) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(src + i), x1 = _mm256_loadu_ps(src + i + 8);
        acc0 = _mm256_fmadd_ps(x0, x0, acc0);
        acc1 = _mm256_fmadd_ps(x1, x1, acc1);
        _mm256_storeu_ps(dst + i, x0);
        _mm256_storeu_ps(dst + i + 8, x1);
    }
    for (; i < n; i += 8) {
        const __m256 x = _mm256_maskload_ps(src + i, avx2_lanes(n - i));
        acc0 = _mm256_fmadd_ps(x, x, acc0);
        _mm256_storeu_ps(dst + i, x); /* zeros past n: dst is np >= round16(n) wide */
    }
    for (; i < np; i += 8) _mm256_storeu_ps(dst + i, _mm256_setzero_ps());
    if (!on) return 1.0f;
    const float r = 1.0f / sqrtf(avx2_hsum(_mm256_add_ps(acc0, acc1)) + (float)MASKPACK_GDN_L2_EPS);
    const __m256 vr = _mm256_set1_ps(r);
    for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(dst + j, _mm256_mul_ps(_mm256_loadu_ps(dst + j), vr));
    return r;
}

/* exp with NaN lanes passed through unchanged (exp(NaN) = NaN, like libm) */
static inline __m256 exp256_nan(__m256 v) {
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_ps(exp256(v), v, nan);
}

void gdn_expv_avx2(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp256_nan(_mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i m = avx2_lanes(n - i);
        _mm256_maskstore_ps(x + i, m, exp256_nan(_mm256_maskload_ps(x + i, m)));
    }
}

/* 8 x 8 block: dst[c][r] = src[r][c]. Three stages: 32-bit interleave of row pairs, 64-bit
 * interleave of pair pairs (as shuffles), then 128-bit lane swaps across the two groups of four. */
static inline void tr8(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int q = 0; q < 8; q += 4) {
        r[q + 0] = _mm256_shuffle_ps(t[q], t[q + 2], 0x44);
        r[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], 0xee);
        r[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0x44);
        r[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0xee);
    }
    /* r[4h + s], 128-bit half L = rows 4h..4h+3 at column 4L + s */
    for (int s = 0; s < 4; s++) {
        _mm256_storeu_ps(dst + s * ldd, _mm256_permute2f128_ps(r[s], r[4 + s], 0x20));
        _mm256_storeu_ps(dst + (4 + s) * ldd, _mm256_permute2f128_ps(r[s], r[4 + s], 0x31));
    }
}

void gdn_transpose_avx2(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {
    const int64_t r8 = rows & ~(int64_t)7, c8 = cols & ~(int64_t)7;
    for (int64_t r = 0; r < r8; r += 8)
        for (int64_t c = 0; c < c8; c += 8) tr8(src + r * lds + c, lds, dst + c * ldd + r, ldd);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t cstart = r < r8 ? c8 : 0;
        for (int64_t c = cstart; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
    }
}

static inline void avx2_copy(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
    if (i < n) {
        const __m256i m = avx2_lanes(n - i);
        _mm256_maskstore_ps(dst + i, m, _mm256_maskload_ps(src + i, m));
    }
}

/* acc[u][v] += -Lm[r][j] A[j][8 v ..] for j in [j0, j1), v < nv, u = (j - j0) mod ns: rows j of an
 * 8-row block have nonzeros in their first nv = block + 1 vectors only, so nv is a constant per
 * block. ns accumulator sets (2 while nv <= 4, else 1: 2 nv registers must fit beside a load and
 * a broadcast) split the FMA latency chain. */
static inline __attribute__((always_inline)) void inv_rows2(const int nv, const int ns, const float *l, const float *A,
                                                            int64_t ld, int64_t j0, int64_t j1, __m256 acc[2][8]) {
    int64_t j = j0;
    if (ns == 2)
        for (; j + 2 <= j1; j += 2)
            for (int u = 0; u < 2; u++) {
                const __m256 lu = _mm256_set1_ps(-l[j + u]);
                const float *p = A + (j + u) * ld;
                for (int v = 0; v < nv; v++) acc[u][v] = _mm256_fmadd_ps(lu, _mm256_loadu_ps(p + 8 * v), acc[u][v]);
            }
    for (; j < j1; j++) {
        const __m256 lu = _mm256_set1_ps(-l[j]);
        const float *p = A + j * ld;
        for (int v = 0; v < nv; v++) acc[0][v] = _mm256_fmadd_ps(lu, _mm256_loadu_ps(p + 8 * v), acc[0][v]);
    }
}

/* A = (I + Lm)^-1 (unit lower, n <= cn <= 64): row r = e_r - sum_{j<r} Lm[r][j] A[j], the row held
 * in registers. Row r needs every earlier row, so the rows form one dependency chain; within a row
 * the accumulator sets are summed in a fixed order. */
static void avx2_inv_lower(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld) {
    const __m256 z = _mm256_setzero_ps();
    for (int64_t r = 0; r < n; r++) {
        __m256 acc[2][8];
        for (int u = 0; u < 2; u++)
            for (int v = 0; v < 8; v++) acc[u][v] = z;
        const float *l = Lm + r * ld;
        for (int64_t jb = 0; jb * 8 < r; jb++) {
            const int64_t j0 = jb * 8, j1 = j0 + 8 < r ? j0 + 8 : r;
            switch (jb) {
            case 0: inv_rows2(1, 2, l, A, ld, j0, j1, acc); break;
            case 1: inv_rows2(2, 2, l, A, ld, j0, j1, acc); break;
            case 2: inv_rows2(3, 2, l, A, ld, j0, j1, acc); break;
            case 3: inv_rows2(4, 2, l, A, ld, j0, j1, acc); break;
            case 4: inv_rows2(5, 1, l, A, ld, j0, j1, acc); break;
            case 5: inv_rows2(6, 1, l, A, ld, j0, j1, acc); break;
            case 6: inv_rows2(7, 1, l, A, ld, j0, j1, acc); break;
            default: inv_rows2(8, 1, l, A, ld, j0, j1, acc); break;
            }
        }
        float *ar = A + r * ld;
        for (int v = 0; v < 8 && 8 * v < cn; v++) _mm256_storeu_ps(ar + 8 * v, _mm256_add_ps(acc[0][v], acc[1][v]));
        /* the diagonal: rows j < r are zero in column r, so the sum there is 0 and the entry is
         * exactly the identity's 1 */
        ar[r] = 1.0f;
    }
}

/* The decay rows in one pass per 8-column block (see k_decay_rows in gdn_kernel.inc): the
 * differences, their exp (NaN kept as NaN, like gdn_expv_avx2), L and P, with the same products in
 * the same order as the portable version. Entries past the diagonal are zeroed by masks (never by
 * multiplying: the products' unneeded entries may hold anything); blocks wholly right of the
 * diagonal only get zeros. D is written on to the row's 16-column block (-inf -> 0 past it). */
static void avx2_decay_rows(const float *Gc, const float *bv, const float *KK, const float *QK, float *D, float *Lm,
                            float *Pm, int64_t n, int64_t cn, int64_t ld) {
    const __m256 z = _mm256_setzero_ps();
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t r = 0; r < n; r++) {
        const __m256 gr = _mm256_set1_ps(Gc[r]), br = _mm256_set1_ps(bv[r]);
        float *d = D + r * ld, *l = Lm + r * ld, *p = QK ? Pm + r * ld : NULL;
        const float *kk = KK + r * ld, *qk = QK ? QK + r * ld : NULL;
        const int64_t dw = (r + 16) & ~(int64_t)15; /* D's written width: the row's 16-column block */
        for (int64_t jb = 0; jb < cn; jb += 8) {
            if (jb > r) {
                if (jb < dw) _mm256_storeu_ps(d + jb, z);
                _mm256_storeu_ps(l + jb, z);
                if (p) _mm256_storeu_ps(p + jb, z);
                continue;
            }
            /* lanes j <= r (le) and j < r (lt) */
            const __m256 mle = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(r - jb + 1)), iota));
            const __m256 mlt = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(r - jb)), iota));
            /* Gc past n may be garbage: only the lanes j <= r < n are read from it */
            const __m256 gj = _mm256_maskload_ps(Gc + jb, _mm256_castps_si256(mle));
            const __m256 x = _mm256_sub_ps(gr, gj);
            const __m256 dv = _mm256_and_ps(exp256_nan(x), mle);
            _mm256_storeu_ps(d + jb, dv);
            _mm256_storeu_ps(l + jb,
                             _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(br, _mm256_loadu_ps(kk + jb)), dv), mlt));
            if (p) _mm256_storeu_ps(p + jb, _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(qk + jb), dv), mle));
        }
    }
}

#define K_HAVE_LOAD_L2    1
#define k_load_l2_f32     avx2_load_l2_f32
#define K_HAVE_DECAY_ROWS 1
#define k_decay_rows      avx2_decay_rows
#define GDN_SUFFIX(name)  name##_avx2
#define k_gemm            gdn_gemm_avx2
#define k_gemm_x          gdn_gemm_x_avx2
#define k_pf_flush(pf)    pf_drain2((pf), 1 << 30, INT64_MAX)
#define K_CAN_STREAM      1
#define k_stream_row      avx2_stream_row
#define k_stream_fence()  _mm_sfence()
#define k_expv            gdn_expv_avx2
#define k_transpose       gdn_transpose_avx2
#define k_copy            avx2_copy
#define k_inv_lower       avx2_inv_lower
#define K_SU_FROM_KT      1
#include "gdn_kernel.inc"

#include "../isa/target_pop.h"

#else /* no AVX2 build on this compiler/architecture: the dispatcher never selects it */

GDN_REF_FALLBACKS(avx2)
#endif
