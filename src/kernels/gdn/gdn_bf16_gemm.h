/* gdn_bf16_gemm.h: what the rule's two bf16 builds share of their chunk products (never installed;
 * included once by gdn_avx512bf16.c and once by gdn_amx.c, inside their target regions, after
 * <immintrin.h> or ../isa/simde_amx.h): the packers that round f32 operands to bf16 pairs (a 32-bit
 * word per pair of consecutive reduction indices, the even index in the low half), the packing-area
 * sizes, the epilogue, and the GEMM's driver (packing, blocking, the triangular cuts). The including
 * file sets, before the inclusion:
 *   BF_TILES 0: blocks of BF_MB = 8 rows x 32 columns, the inner range cut to single pairs; a
 *               transposed A packed as pairs of its rows (the register kernel broadcasts one pair of
 *               either layout);
 *            1: blocks of 32 x 32 (2 x 2 AMX tiles of 16 x 16), the inner range cut to whole K-steps
 *               of 16 pairs (32 reduction indices); A always packed in rows of pairs (A tiles: 16 rows
 *               x 16 pairs), every operand zero-padded to whole tiles (16 rows, 16 pairs);
 * and defines, after the inclusion, the micro-kernel the driver calls per block:
 *   static inline void bf_block(int mr, int nv, int half, int64_t p0, int64_t p1, float alpha,
 *                               const uint32_t *a, int64_t ars, int64_t aks, const uint32_t *Bp,
 *                               int64_t ldb, float *C, int64_t ldc, int acc, const float *Cin, float cs)
 *   C rows [0, mr) x columns [0, 16 nv) = epilogue(sum over pairs [p0, p1) of A's pair (i, p) at
 *   a[i ars + p aks] times B's (p, j) at Bp[p ldb + j]); half: only the first 16 rows' first 16
 *   columns are needed of the second column tile's (the triangular output's diagonal block; the
 *   register kernel never sees it set with nv = 2, the tile one may skip that tile).
 * Whatever the block shape, every output entry is the f32 sum, from 0, of the products of its
 * pairs in increasing pair order, each pair's even product first (VDPBF16PS and TDPBF16PS by the
 * instruction set reference); the ranges differ only by pairs whose A entries are packed zeros,
 * which add exact zeros (a sum from +0 never becomes -0). */
#ifndef MASKPACK_GDN_BF16_GEMM_H
#define MASKPACK_GDN_BF16_GEMM_H

#if !defined(BF_TILES)
#error "gdn_bf16_gemm.h: define BF_TILES (0 or 1) before including it"
#endif

#include <stdlib.h>
#include <string.h>

#if BF_TILES
#define BF_MB    32 /* rows of C per block: two row tiles */
#define BF_KSTEP 16 /* pairs per tile product */
#else
#define BF_MB    8
#define BF_KSTEP 1
#endif

static inline int64_t bf_r16(int64_t x) { return (x + 15) & ~(int64_t)15; }

/* x rounded up to whole K-steps of BF_KSTEP pairs */
static inline int64_t bf_rk(int64_t x) { return (x + BF_KSTEP - 1) / BF_KSTEP * BF_KSTEP; }

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

/* Pair p of rows [0, kd) of S (row stride lds), columns [c, c + 16) of [0, cols): 16 words
 * (S[2p][c + l], S[2p + 1][c + l]), rows kd and on and columns cols and on read as 0. tri (column
 * c + l against row k): BF_TRI_LO zeroes k > c + l, BF_TRI_UP k < c + l (S is a transposed A). */
static inline __m512i bf_pair_row(const float *S, int64_t lds, int64_t kd, int64_t cols, int tri, int64_t p,
                                  int64_t c) {
    const int64_t k0 = 2 * p, k1 = 2 * p + 1;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __mmask16 m = cols - c >= 16 ? (__mmask16)0xffffu : cols > c ? (__mmask16)((1u << (cols - c)) - 1u) : 0;
    __mmask16 m0 = k0 < kd ? m : (__mmask16)0, m1 = k1 < kd ? m : (__mmask16)0;
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
    /* rows past kd are not addressed at all (the tiles' pair padding asks for them) */
    const __m512 x0 = m0 ? _mm512_maskz_loadu_ps(m0, S + k0 * lds + c) : _mm512_setzero_ps();
    const __m512 x1 = m1 ? _mm512_maskz_loadu_ps(m1, S + k1 * lds + c) : _mm512_setzero_ps();
    return bf_pairs(x0, x1);
}

/* Rows [0, kd) x columns [0, cols) of S (row stride lds) -> D[p][c] = (S[2p][c], S[2p+1][c]) for
 * p < np (np >= ceil(kd / 2); pairs past the rows are 0), D's rows ldd words apart (ldd >=
 * round16(cols)); columns [cols, round16(cols)) are 0. tri as bf_pair_row's. */
static void bf_pack_rows(const float *S, int64_t lds, int64_t kd, int64_t cols, int tri, uint32_t *D, int64_t ldd,
                         int64_t np) {
    for (int64_t p = 0; p < np; p++)
        for (int64_t c = 0; c < cols; c += 16)
            _mm512_storeu_si512((void *)(D + p * ldd + c), bf_pair_row(S, lds, kd, cols, tri, p, c));
}

/* The lanes l < 16 with lo <= base + l < hi, as a mask. */
static inline __mmask16 bf_range(int64_t lo, int64_t hi, int64_t base) {
    const int64_t a = lo - base < 0 ? 0 : lo - base > 16 ? 16 : lo - base;
    const int64_t b = hi - base < 0 ? 0 : hi - base > 16 ? 16 : hi - base;
    return (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
}

/* Rows [0, m) of A (row stride lda), columns [0, kd) -> D[i][p] = (A[i][2p], A[i][2p+1]), D's rows
 * ldd >= round16(ceil(kd / 2)) words apart, column kd and on 0 (to a whole 16 pairs). tri:
 * BF_TRI_LO zeroes k > i, BF_TRI_UP k < i. Consecutive floats of a row are the pairs already: one
 * conversion of 32. */
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

#if BF_TILES
/* A stored transposed (S = A^T: kd rows of m, row stride lds) -> A's rows of pairs as
 * bf_pack_cols gives them: D[i][p] = (S[2p][i], S[2p+1][i]) for i < round16(m), p < round16(kp)
 * (kp = ceil(kd / 2); rows past m and pairs past kp are 0), D's rows ldd >= round16(kp) words apart.
 * Blocks of 16 pairs x 16 rows: the pairs of 16 columns of S, 16 words at a time (bf_pair_row),
 * transposed through a 16 x 16 word buffer (the tile's A layout has the pairs of one row contiguous). */
static void bf_pack_cols_t(const float *S, int64_t lds, int64_t m, int64_t kd, int tri, uint32_t *D, int64_t ldd) {
    const int64_t kq = bf_r16((kd + 1) / 2);
    _Alignas(64) uint32_t t[16][16];
    for (int64_t i0 = 0; i0 < m; i0 += 16)
        for (int64_t p0 = 0; p0 < kq; p0 += 16) {
            for (int q = 0; q < 16; q++) _mm512_store_si512((void *)t[q], bf_pair_row(S, lds, kd, m, tri, p0 + q, i0));
            for (int l = 0; l < 16; l++)
                for (int q = 0; q < 16; q++) D[(i0 + l) * ldd + p0 + q] = t[q][l];
        }
}
#endif

/* (m, n, kd, at) -> words of packing one product takes. Registers: A's pairs (m rows of
 * round16(kp) words, or kp rows of round16(m) when A is stored transposed) and B's (kp rows of n
 * words). Tiles: A's round16(m) rows of round16(kp) words either way, B's round16(kp) rows of n. */
static int64_t bf_words(int64_t m, int64_t n, int64_t kd, int at) {
    const int64_t kp = (kd + 1) / 2;
#if BF_TILES
    (void)at;
    return bf_r16(m) * bf_r16(kp) + bf_r16(kp) * n;
#else
    return (at ? kp * bf_r16(m) : m * bf_r16(kp)) + kp * n;
#endif
}

/* What the framework's products can need (gdn_kernel.inc: m, n and kd are each at most dm = 2C or
 * Vp + Kp, multiples of 16): Dm x (Dm/2 + 16) for A plus Dm/2 x Dm for B; with tiles round16(m) <=
 * dm and round16(kp) <= dm/2 + 8, so dm (dm/2 + 8) twice, which is dm (dm + 16) as well. */
static int64_t bf_pack_words(const gdn_problem *P) {
    const int64_t vk = P->Vp + P->Kp, dm = vk > 2 * GDN_C ? vk : 2 * GDN_C;
    return dm * (dm + 16);
}

/* One output row's 16 columns from their accumulators: c = alpha x, or cs ci + alpha x with acc. */
static inline __m512 bf_out(__m512 x, const float *ci, __m512 va, __m512 vcs, int acc) {
    x = _mm512_mul_ps(x, va);
    if (acc) x = _mm512_fmadd_ps(_mm512_loadu_ps(ci), vcs, x);
    return x;
}

static inline void bf_block(int mr, int nv, int half, int64_t p0, int64_t p1, float alpha, const uint32_t *a,
                            int64_t ars, int64_t aks, const uint32_t *Bp, int64_t ldb, float *C, int64_t ldc, int acc,
                            const float *Cin, float cs);

/* The product gdn_gemm_x_* (gdn_internal.h) with bf16 operands: packs A and B into pf->pk (or
 * an area of its own when that is missing or short: only the tests' direct calls), then runs the
 * blocks. */
static void bf_gemm_x(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                      int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs) {
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
#if BF_TILES
    /* whole tiles: rows to round16(m), pairs to round16(kp), the padding zero (a tile load reads it,
     * and B's padding meets A's zero pairs: it must be finite) */
    ars = bf_r16(kp), aks = 1;
    if (at)
        bf_pack_cols_t(A, lda, m, kd, tri, Ap, ars);
    else {
        bf_pack_cols(A, lda, m, kd, tri, Ap, ars);
        memset(Ap + m * ars, 0, (size_t)((bf_r16(m) - m) * ars) * sizeof(uint32_t));
    }
    Bp = Ap + bf_r16(m) * ars;
    bf_pack_rows(B, ldb, kd, n, BF_TRI_NONE, Bp, n, bf_r16(kp));
#else
    if (at) {
        ars = 1, aks = bf_r16(m);
        bf_pack_rows(A, lda, kd, m, tri, Ap, aks, kp);
        Bp = Ap + kp * aks;
    } else {
        ars = bf_r16(kp), aks = 1;
        bf_pack_cols(A, lda, m, kd, tri, Ap, ars);
        Bp = Ap + m * ars;
    }
    bf_pack_rows(B, ldb, kd, n, BF_TRI_NONE, Bp, n, kp);
#endif
    if (flags == 0 && m >= 64) {
        /* many row blocks (the chunk's [Q; K] S): row blocks outermost, as in the f32 build */
        for (int64_t i0 = 0; i0 < m; i0 += BF_MB) {
            const int mr = (int)(m - i0 < BF_MB ? m - i0 : BF_MB);
            const uint32_t *a = Ap + i0 * ars;
            for (int64_t j0 = 0; j0 < n; j0 += 32) {
                const int nv = n - j0 >= 32 ? 2 : 1;
                gdn_pf_drain_avx512(pf, 12 * (BF_MB / 8), BF_MB / 8);
                bf_block(mr, nv, 0, 0, bf_rk(kp), alpha, a, ars, aks, Bp + j0, n, C + i0 * ldc + j0, ldc, acc,
                         Cin + i0 * ldc + j0, cs);
            }
        }
        free(own);
        return;
    }
    /* column panels outermost, tiles skipped and inner ranges cut as in the f32 build (the inner
     * range in pairs, or whole K-steps: a pair or step holding any needed index is taken whole, its
     * other entries exact zeros) */
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int nv0 = n - j0 >= 32 ? 2 : 1;
        for (int64_t i0 = 0; i0 < m; i0 += BF_MB) {
            const int mr = (int)(m - i0 < BF_MB ? m - i0 : BF_MB);
            const int tro = (flags & GDN_GEMM_TRI_OUT) != 0;
            if (tro && j0 > i0 + mr - 1) continue;
            const int nv = tro && j0 + 16 > i0 + mr - 1 ? 1 : nv0;
            const int half = tro && nv == 2 && j0 + 16 > i0 + 15;
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
            const int64_t p0 = k0 / 2 / BF_KSTEP * BF_KSTEP, p1 = bf_rk((k1 + 1) / 2);
            gdn_pf_drain_avx512(pf, 12 * (BF_MB / 8), BF_MB / 8);
            bf_block(mr, nv, half, p0, p1, alpha, a, ars, aks, Bp + j0, n, C + i0 * ldc + j0, ldc, acc,
                     Cin + i0 * ldc + j0, cs);
        }
    }
    free(own);
}

/* dst[i] = src[i] for i < n (k_copy: a float row, the tail masked). */
static inline void bf_copy(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
}

#endif
