/* attn_avx512_tiles.h: the f32 tile kernels and packing moves shared by the AVX-512 forward
 * (attn_avx512.c) and backward (attn_avx512_bwd.c): S^T = K Q^T over packed keys, O^T += V^T P^T,
 * query rows to and from the transposed block, keys to the packed forms. Included inside each file's
 * AVX-512 target region after attn_avx512_common.h; every function is static inline. */
#ifndef MASKPACK_ATTN_AVX512_TILES_H
#define MASKPACK_ATTN_AVX512_TILES_H

/* ---- the three matrix kernels ------------------------------------------------------------------ */

/* Keys are packed once per (segment or key group, key head) into two layouts:
 *   KP [n8/8][D][8]: the 8 keys of a group side by side for each d (what S^T = K Q^T broadcasts)
 *   VP [n64/64][D8/8][64][8]: per tile of 64 keys, one slab per group of 8 columns holding those
 *                     columns of each key side by side (what O^T += V^T P^T broadcasts)
 * so both kernels stream one contiguous run per tile (short strided runs defeat the prefetchers and
 * halve the speed when the keys come from L2); n8, n64 and D8 round up with zeros. */

#if defined(ATTN_AVX2_BUILD) /* its own register blocking of st_group and ot_group */
#include "attn_avx2_tiles.h"
#else

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

#endif

/* ST rows 0 .. j1-j0 for packed keys [j0, j1). Whole groups are computed, so rows before 0 (up to
 * 7) and after j1-j0 (up to 7) are written too: ST must have that room; they are never used. */
static inline void st_packed(const float *YT, int64_t D, const float *KP, int32_t j0, int32_t j1, float *ST) {
    for (int32_t g = j0 & ~7; g < j1; g += 8) st_group(YT, D, KP + (int64_t)g * D, ST + (int64_t)(g - j0) * BQ);
}

#if !defined(ATTN_AVX2_BUILD)
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

#endif

/* OT [D8][BQ] = OT * alpha + V^T A over packed keys [j0, j0 + nk) (exactly those: a key outside
 * the range is never read here). A range crossing a 64-key tile of the pack runs in pieces, alpha
 * applied by the first. */
static inline void ot_packed(float *OT, int64_t D8, const float *VP, int32_t j0, int32_t nk, const float *A,
                      const __m512 *alpha) {
    const __m512 ones[3] = {_mm512_set1_ps(1.0f), _mm512_set1_ps(1.0f), _mm512_set1_ps(1.0f)};
    for (int32_t j = j0; j < j0 + nk;) {
        int32_t end = ((j >> 6) + 1) << 6;
        if (end > j0 + nk) end = j0 + nk;
        const float *tile = VP + (int64_t)(j >> 6) * D8 * 64 + (j & 63) * 8;
        for (int64_t d = 0; d < D8; d += 8)
            ot_group(OT + d * BQ, tile + (d / 8) * 512, A + (int64_t)(j - j0) * BQ, end - j, j == j0 ? alpha : ones);
        j = end;
    }
}

/* ---- shared pieces ------------------------------------------------------------------------------- */

static inline void pack_rows(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h, int64_t i0,
                      int32_t n, float mul, float *YT, float *Yr, int64_t Dp, int64_t ys) {
    int64_t D = P->d;
    for (int32_t x = 0; x < BQ; x++) {
        float *y = Yr + x * ys;
        if (x < n) {
            attn_load_row(y, attn_ptr(view, g->row, g->q_start + i0 + x, h, P->esize), P->bf16, D);
            for (int64_t d = D; d < Dp; d++) y[d] = 0;
        } else {
            memset(y, 0, (size_t)Dp * sizeof(float));
        }
    }
    transpose_scaled(Yr, ys, YT, BQ, BQ, Dp, mul);
}

/* f32 tensors with D a multiple of 16: the same two moves as pack_rows (QT only) and unpack_rows,
 * straight between the tensor rows and the transposed block through 16 x 16 register transposes,
 * without the row-major copy in between (same products, so the same values). */
static inline void pack_rows_direct(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h,
                             int64_t i0, int32_t n, float mul, float *YT, const float *zero, float *Yr, int64_t ys) {
    int64_t D = P->d;
    __m512 m = _mm512_set1_ps(mul), r[16];
    for (int32_t x0 = 0; x0 < BQ; x0 += 16) {
        const float *row[16];
        for (int t = 0; t < 16; t++)
            row[t] = x0 + t < n ? (const float *)attn_ptr(view, g->row, g->q_start + i0 + x0 + t, h, 4) : zero;
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
            for (int t = 0; t < 16; t++) r[t] = _mm512_loadu_ps(row[t] + d0);
            if (Yr) /* the row-major copy too (Yr [BQ][ys]) */
                for (int t = 0; t < 16; t++) _mm512_store_ps(Yr + (x0 + t) * ys + d0, r[t]);
            tr16(r);
            for (int t = 0; t < 16; t++) _mm512_store_ps(YT + (d0 + t) * BQ + x0, _mm512_mul_ps(r[t], m));
        }
    }
}

/* Packs keys [0, n) of head kh of a key-grid tensor (key r = token col0 + r of row brow) into KP
 * and/or VP form (either may be NULL), 16 keys at a time (KP through 16 x 16 transposes); keys
 * outside [lo, hi) (that no query of the unit may see) and the padding are zeros and are never
 * read from the tensor. tmp holds 17 * (Dp + 16) floats. */
static inline void pack_keys(const attn_problem *P, const attn_view *view, int64_t brow, int64_t col0, int64_t n, int64_t kh,
                      int64_t lo, int64_t hi, float *KP, float *VP, float *tmp) {
    int64_t D = P->d, D8 = round8(D), Dp = round16(D), n8 = round8(n), nv = VP ? round64(n) : n8, rs = Dp + 16;
    float *zero = tmp + 16 * rs;
    memset(zero, 0, (size_t)rs * sizeof(float));
    int64_t row_bytes = D * (int64_t)P->esize;
    for (int64_t j0 = 0; j0 < nv; j0 += 16) {
        /* the next 16 rows: with interleaved heads each sits in its own page, where the hardware
         * prefetchers do not follow */
        for (int64_t j = j0 + 16; j < j0 + 32 && j < hi && j < n; j++)
            if (j >= lo)
                for (int64_t b = 0; b < row_bytes; b += 64)
                    _mm_prefetch(attn_ptr(view, brow, col0 + j, kh, P->esize) + b, _MM_HINT_T0);
        const float *row[16];
        for (int r = 0; r < 16; r++) {
            int64_t j = j0 + r;
            if (j >= lo && j < hi && j < n) {
                const void *src = attn_ptr(view, brow, col0 + j, kh, P->esize);
                if (!P->bf16 && D == Dp) {
                    row[r] = (const float *)src; /* read in place */
                } else {
                    attn_load_row(tmp + r * rs, src, P->bf16, D);
                    for (int64_t d = D; d < Dp; d++) tmp[r * rs + d] = 0;
                    row[r] = tmp + r * rs;
                }
            } else {
                row[r] = zero;
            }
        }
        if (KP && j0 < n8) {
            __m512 v[16];
            int hi_half = j0 + 8 < n8;
            for (int64_t c = 0; c < Dp; c += 16) {
                for (int r = 0; r < 16; r++) v[r] = _mm512_loadu_ps(row[r] + c);
                tr16(v); /* v[t] = column c + t of the 16 keys */
                for (int t = 0; t < 16 && c + t < D; t++) {
                    _mm256_storeu_ps(KP + j0 * D + (c + t) * 8, _mm512_castps512_ps256(v[t]));
                    if (hi_half) _mm256_storeu_ps(KP + (j0 + 8) * D + (c + t) * 8, _mm512_extractf32x8_ps(v[t], 1));
                }
            }
        }
        if (VP)
            for (int r = 0; r < 16 && j0 + r < nv; r++) {
                int64_t j = j0 + r;
                float *dst = VP + (j >> 6) * D8 * 64 + (j & 63) * 8;
                for (int64_t d = 0; d < D8; d += 8)
                    _mm256_storeu_ps(dst + (d / 8) * 512, _mm256_loadu_ps(row[r] + d));
            }
    }
}

/* Rows x < n of the accumulator OT [Dp][BQ] to the tensor: row x times inv[x]. Or is [BQ][Dp]. */
static inline void unpack_rows(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h,
                        int64_t i0, int32_t n, const float *OT, float *Or, int64_t Dp, const float *inv) {
    transpose_scaled(OT, BQ, Or, Dp, Dp, BQ, 1.0f);
    for (int32_t x = 0; x < n; x++)
        attn_store_row(attn_ptr(view, g->row, g->q_start + i0 + x, h, P->esize), P->bf16, Or + x * Dp, P->d, inv[x]);
}


static inline void unpack_rows_direct(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h,
                               int64_t i0, int32_t n, const float *OT, const float *inv) {
    int64_t D = P->d;
    __m512 r[16];
    for (int32_t x0 = 0; x0 < n; x0 += 16)
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
            for (int t = 0; t < 16; t++) r[t] = _mm512_load_ps(OT + (d0 + t) * BQ + x0);
            tr16(r); /* r[t] = row x0 + t, columns d0 .. d0 + 15 */
            for (int t = 0; t < 16 && x0 + t < n; t++)
                _mm512_storeu_ps((float *)attn_ptr(view, g->row, g->q_start + i0 + x0 + t, h, 4) + d0,
                                 _mm512_mul_ps(r[t], _mm512_set1_ps(inv[x0 + t])));
        }
}

#endif
