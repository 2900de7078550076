/* attn_bf16_pairs.h: the two products of the bf16 dot-product kernels (VDPBF16PS: per f32 lane, the
 * sum of a pair of bf16 products), shared by the forward (attn_avx512bf16.c) and the backward
 * (attn_avx512bf16_bwd.c), and the pairing of a block's rows both bf16 backwards read (also
 * attn_amx_bwd.c's tiles). Query rows run along the lanes (a block of BQ = 48 rows is 3 vectors);
 * 32-bit words hold bf16 pairs, low half first. Included inside the AVX512-BF16 target region. */
#ifndef MASKPACK_ATTN_BF16_PAIRS_H
#define MASKPACK_ATTN_BF16_PAIRS_H

/* ST rows for packed keys [j0, j1) = mul * sum over head-dim pairs p of YT[p][i] . KP(key, p), where
 * YT is [Dh][BQ] (a row's pair p per lane) and KP [n8/8][Dh][8] (per group of 8 keys, pair p of each).
 * Whole groups of 8 keys are computed, so up to 7 rows before 0 and after j1 - j0 are written too
 * (st_packed's contract in attn_f32_kernel.inc). */
static inline void st_pairs(const uint32_t *YT, int64_t Dh, const uint32_t *KP, int32_t j0, int32_t j1, float *ST,
                            float mul) {
    const __m512 sc = _mm512_set1_ps(mul);
    for (int32_t g0 = j0 & ~7; g0 < j1; g0 += 8) {
        const uint32_t *G = KP + (int64_t)g0 * Dh;
        float *S = ST + (int64_t)(g0 - j0) * BQ;
        __m512 acc[8][3];
        for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
        for (int64_t p = 0; p < Dh; p++) {
            const uint32_t *q = YT + p * BQ;
            __m512i q0 = _mm512_load_si512(q), q1 = _mm512_load_si512(q + 16), q2 = _mm512_load_si512(q + 32);
            for (int r = 0; r < 8; r++) {
                __m512i b = _mm512_set1_epi32((int)G[p * 8 + r]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)q0, (__m512bh)b);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)q1, (__m512bh)b);
                acc[r][2] = _mm512_dpbf16_ps(acc[r][2], (__m512bh)q2, (__m512bh)b);
            }
        }
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 3; c++) _mm512_store_ps(S + r * BQ + 16 * c, _mm512_mul_ps(acc[r][c], sc));
    }
}

/* OT [D8][BQ] = OT * alpha + sum over the key pairs t in [t0, t1) of A[t - t0][i] . VP(pair t, d), where
 * A is [t1 - t0][BQ] (a row's pair of weights per lane) and VP [n64/64][D8/8][32][8] (per 64-key tile
 * and 8 columns, the pair of each column). */
static inline void ot_pairs(float *OT, int64_t D8, const uint32_t *VP, int32_t t0, int32_t t1, const uint32_t *A,
                            const __m512 *alpha) {
    for (int64_t dg = 0; dg < D8 / 8; dg++) {
        float *O = OT + dg * 8 * BQ;
        __m512 acc[8][3];
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 3; c++) acc[r][c] = _mm512_mul_ps(_mm512_load_ps(O + r * BQ + 16 * c), alpha[c]);
        for (int32_t t = t0; t < t1; t++) {
            const uint32_t *a = A + (int64_t)(t - t0) * BQ;
            const uint32_t *X = VP + (int64_t)(t / 32) * (D8 / 8) * 256 + dg * 256 + (t % 32) * 8;
            __m512i a0 = _mm512_load_si512(a), a1 = _mm512_load_si512(a + 16), a2 = _mm512_load_si512(a + 32);
            for (int r = 0; r < 8; r++) {
                __m512i b = _mm512_set1_epi32((int)X[r]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)a0, (__m512bh)b);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)a1, (__m512bh)b);
                acc[r][2] = _mm512_dpbf16_ps(acc[r][2], (__m512bh)a2, (__m512bh)b);
            }
        }
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 3; c++) _mm512_store_ps(O + r * BQ + 16 * c, acc[r][c]);
    }
}

/* The top half of an f32 that holds a bf16 value (exact). */
static inline uint32_t bf16_hi(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u >> 16;
}

/* A block's rows [BQ][Rs] (bf16 values widened; zeros past its rows and from D to Dp) -> YT [Dh][BQ]:
 * (Y[i][2p], Y[i][2p+1]) per row i, head dims from D on read as 0 (Dh >= ceil(D / 2)); and
 * Yp [BQ/2][Dp]: (Y[2p][d], Y[2p+1][d]) per column d. */
static inline void pair_rows(const float *Yr, int64_t Rs, int64_t D, int64_t Dh, int64_t Dp, uint32_t *YT,
                             uint32_t *Yp) {
    for (int32_t x = 0; x < BQ; x++)
        for (int64_t p = 0; p < Dh; p++) {
            const uint32_t lo = 2 * p < D ? bf16_hi(Yr[x * Rs + 2 * p]) : 0;
            const uint32_t hi = 2 * p + 1 < D ? bf16_hi(Yr[x * Rs + 2 * p + 1]) : 0;
            YT[p * BQ + x] = lo | (hi << 16);
        }
    const __m512i lo_mask = _mm512_set1_epi32(0xffff);
    for (int32_t p = 0; p < BQ / 2; p++)
        for (int64_t d = 0; d < Dp; d += 16) {
            __m512i a = _mm512_castps_si512(_mm512_loadu_ps(Yr + (2 * p) * Rs + d));
            __m512i b = _mm512_castps_si512(_mm512_loadu_ps(Yr + (2 * p + 1) * Rs + d));
            __m512i w =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a, 16), lo_mask), _mm512_andnot_si512(lo_mask, b));
            _mm512_storeu_si512((void *)(Yp + p * Dp + d), w);
        }
}

#endif
