/* attn_avx2_tiles.h: the AVX2 build's own register blocking of the two hot matrix kernels (st_group,
 * ot_group of attn_avx512_tiles.h) and of their partial-tile forms (st_group_cv, ot_group_cv of
 * attn_avx512.c). The AVX-512 kernels hold 8 keys x 3 zmm = 24 accumulators; through the shim
 * those are 48 ymm and spill (AVX2 has 16 registers). Here a pass holds 4 keys (or columns) x 3 ymm
 * = 12 accumulators + 3 row vectors + 1 broadcast = 16 registers, and the 8 x 48 block takes 4
 * passes. Every output is still one sum over d (st) or over keys (ot) in increasing order from the
 * same start (0, or OT * alpha), with the same fmadd per term, so the results are the AVX-512
 * kernels' bit for bit; the partial forms skip the same 16-row vectors (2 ymm) the AVX-512 ones
 * skip. Included by attn_avx512_tiles.h and attn_avx512.c in their AVX2 build (ATTN_AVX2_BUILD),
 * inside the AVX2 target region, after attn_avx2_shim.h; every function is static inline. */
#ifndef MASKPACK_ATTN_AVX2_TILES_H
#define MASKPACK_ATTN_AVX2_TILES_H

#define AVX2_AI static inline __attribute__((always_inline))

/* ST[r][8*y0 + 8*c ..] for keys r = k0 .. k0 + 3 of a packed group, ymm columns c < ny of rows
 * starting at ymm y0: the sum over d of G[d][r] * YT[d][...] (ny is a constant after inlining). */
AVX2_AI void st4_step(__m256 acc[4][3], const float *yt, const float *g, const int ny) {
    __m256 y[3];
    for (int c = 0; c < ny; c++) y[c] = _mm256_load_ps(yt + 8 * c);
    for (int r = 0; r < 4; r++) {
        __m256 b = _mm256_broadcast_ss(g + r);
        for (int c = 0; c < ny; c++) acc[r][c] = _mm256_fmadd_ps(b, y[c], acc[r][c]);
    }
}

AVX2_AI void st4(const float *YT, int64_t D, const float *G, float *ST, const int k0, const int y0, const int ny) {
    __m256 acc[4][3];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < ny; c++) acc[r][c] = _mm256_setzero_ps();
    const float *yt = YT + 8 * y0, *g = G + k0;
    int64_t d = 0;
    /* two steps per iteration (the loop's own instructions are a fifth of its body otherwise) */
    for (; d + 2 <= D; d += 2, yt += 2 * BQ, g += 16) {
        /* the next group's keys, one line per two steps: they come from L2 */
        _mm_prefetch((const char *)(g + 8 * D), _MM_HINT_T0);
        st4_step(acc, yt, g, ny);
        st4_step(acc, yt + BQ, g + 8, ny);
    }
    if (d < D) st4_step(acc, yt, g, ny);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < ny; c++) _mm256_store_ps(ST + (k0 + r) * BQ + 8 * (y0 + c), acc[r][c]);
}

/* st4 over ymm columns [ya, yb) (any range inside the 6 of a block), 3 at a time. */
AVX2_AI void st4_range(const float *YT, int64_t D, const float *G, float *ST, const int k0, const int ya,
                       const int yb) {
    int y = ya;
    for (; y + 3 <= yb; y += 3) st4(YT, D, G, ST, k0, y, 3);
    if (yb - y == 2) st4(YT, D, G, ST, k0, y, 2);
    if (yb - y == 1) st4(YT, D, G, ST, k0, y, 1);
}

/* ST[r][0..48) = sum_d G[d][r] * YT[d][0..48) for the 8 keys r of one packed group. */
static inline void st_group(const float *YT, int64_t D, const float *G, float *ST) {
    /* both key halves over one half of YT's columns before the other half: 12 KB of YT (D = 128)
     * stays in L1 between the two passes that read it */
    st4(YT, D, G, ST, 0, 0, 3);
    st4(YT, D, G, ST, 4, 0, 3);
    st4(YT, D, G, ST, 0, 3, 3);
    st4(YT, D, G, ST, 4, 3, 3);
}

/* OT[k0 + r][8*y0 ..] for columns r < 4 of a VP slab, ymm columns c < ny from y0: starts from
 * acc (OT * alpha, set by the caller) and adds X[j*8 + k0 + r] * A[j][...] for keys j in [j, e). */
AVX2_AI void ot4_step(__m256 acc[4][3], const float *a, const float *x, const int ny) {
    __m256 av[3];
    for (int c = 0; c < ny; c++) av[c] = _mm256_load_ps(a + 8 * c);
    for (int r = 0; r < 4; r++) {
        __m256 b = _mm256_broadcast_ss(x + r);
        for (int c = 0; c < ny; c++) acc[r][c] = _mm256_fmadd_ps(b, av[c], acc[r][c]);
    }
}

AVX2_AI void ot4_run(__m256 acc[4][3], const float *X, const float *A, int32_t j, int32_t e, const int k0,
                     const int y0, const int ny) {
    const float *a = A + j * BQ + 8 * y0, *x = X + j * 8 + k0;
    for (; j + 2 <= e; j += 2, a += 2 * BQ, x += 16) { /* two keys per iteration, in order */
        ot4_step(acc, a, x, ny);
        ot4_step(acc, a + BQ, x + 8, ny);
    }
    if (j < e) ot4_step(acc, a, x, ny);
}

/* alpha's ymm column y (alpha is 3 vectors of 16 rows) */
AVX2_AI __m256 alpha_ymm(const __m512 *alpha, int y) { return (y & 1) ? alpha[y >> 1].hi : alpha[y >> 1].lo; }

AVX2_AI void ot4_load(__m256 acc[4][3], const float *OT, const __m512 *alpha, const int k0, const int y0, const int ny) {
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < ny; c++)
            acc[r][c] = _mm256_mul_ps(_mm256_load_ps(OT + (k0 + r) * BQ + 8 * (y0 + c)), alpha_ymm(alpha, y0 + c));
}

AVX2_AI void ot4_store(__m256 acc[4][3], float *OT, const int k0, const int y0, const int ny) {
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < ny; c++) _mm256_store_ps(OT + (k0 + r) * BQ + 8 * (y0 + c), acc[r][c]);
}

/* OT[r][0..48) = OT * alpha + sum_j X[j*8 + r] * A[j][0..48) for the 8 columns of one VP slab. */
static inline void ot_group(float *OT, const float *X, const float *A, int32_t nk, const __m512 *alpha) {
    for (int y0 = 0; y0 < 6; y0 += 3) /* (the half of A two passes read stays in L1 between them) */
        for (int k0 = 0; k0 < 8; k0 += 4) {
            __m256 acc[4][3];
            ot4_load(acc, OT, alpha, k0, y0, 3);
            ot4_run(acc, X, A, 0, nk, k0, y0, 3);
            ot4_store(acc, OT, k0, y0, 3);
        }
}

#if defined(ATTN_AVX2_PARTIAL_TILES) /* attn_avx512.c's partial-tile kernels */

/* st_group for the 16-row vectors ca .. ca + nv - 1 only (ymm columns 2ca .. 2(ca + nv)); the
 * other lanes of ST are left as they were. */
AVX2_AI void st_group_cv(const float *YT, int64_t D, const float *G, float *ST, const int ca, const int nv) {
    switch (ca * 4 + nv) {
#define ST_CV(code, a, b)                     \
    case code:                                \
        st4_range(YT, D, G, ST, 0, a, b);     \
        st4_range(YT, D, G, ST, 4, a, b);     \
        break;
        ST_CV(3, 0, 6)
        ST_CV(2, 0, 4)
        ST_CV(1, 0, 2)
        ST_CV(6, 2, 6)
        ST_CV(5, 2, 4)
        ST_CV(9, 4, 6)
#undef ST_CV
    default: break;
    }
}

/* One pass (columns k0 .. k0 + 3, ymm columns y0 .. y0 + 2) of ot_group_cv: each run adds its keys
 * to the ymm columns of its vectors inside the pass (code = ca * 4 + nv as in attn_avx512.c). */
AVX2_AI void ot_pass_cv(float *OT, const float *X, const float *A, const __m512 *alpha, const int32_t *cut,
                        const int *code, int nrun, const int k0, const int y0) {
    __m256 acc[4][3];
    ot4_load(acc, OT, alpha, k0, y0, 3);
    for (int k = 0; k < nrun; k++) {
        int ca = code[k] >> 2, nv = code[k] & 3;
        int la = 2 * ca - y0, lb = 2 * (ca + nv) - y0;
        if (la < 0) la = 0;
        if (lb > 3) lb = 3;
        if (la >= lb) continue;
        int32_t a = cut[k], b = cut[k + 1];
        /* acc columns la .. lb - 1 (the loads and FMAs address acc[r][c] with c from la) */
        switch (la * 4 + lb) {
        case 3: ot4_run(acc, X, A, a, b, k0, y0, 3); break;
        case 2: ot4_run(acc, X, A, a, b, k0, y0, 2); break;
        case 1: ot4_run(acc, X, A, a, b, k0, y0, 1); break;
        case 7: { /* columns 1, 2 */
            __m256 t[4][3];
            for (int r = 0; r < 4; r++) t[r][0] = acc[r][1], t[r][1] = acc[r][2];
            ot4_run(t, X, A, a, b, k0, y0 + 1, 2);
            for (int r = 0; r < 4; r++) acc[r][1] = t[r][0], acc[r][2] = t[r][1];
            break;
        }
        case 6: { /* column 1 */
            __m256 t[4][3];
            for (int r = 0; r < 4; r++) t[r][0] = acc[r][1];
            ot4_run(t, X, A, a, b, k0, y0 + 1, 1);
            for (int r = 0; r < 4; r++) acc[r][1] = t[r][0];
            break;
        }
        case 11: { /* column 2 */
            __m256 t[4][3];
            for (int r = 0; r < 4; r++) t[r][0] = acc[r][2];
            ot4_run(t, X, A, a, b, k0, y0 + 2, 1);
            for (int r = 0; r < 4; r++) acc[r][2] = t[r][0];
            break;
        }
        default: break;
        }
    }
    ot4_store(acc, OT, k0, y0, 3);
}

/* ot_group over keys split into runs (run k: keys [cut[k], cut[k+1]) seen by the vectors of
 * code[k] = ca * 4 + nv); alpha is applied to every vector. */
static inline void ot_group_cv(float *OT, const float *X, const float *A, const __m512 *alpha, const int32_t *cut,
                               const int *code, int nrun) {
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 0, 0);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 4, 0);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 0, 3);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 4, 3);
}

#endif

#endif
