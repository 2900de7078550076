/* attn_avx2_tiles.h: the AVX2 build's own register blocking of the two hot matrix kernels (st_group,
 * ot_group of attn_avx512_tiles.h) and of their partial-tile forms (st_group_cv, ot_group_cv of
 * attn_avx512.c). The AVX-512 kernels hold 8 keys x 3 zmm = 24 accumulators; through the shim
 * those are 48 ymm and spill (AVX2 has 16 registers). Here a pass holds 4 keys (or columns) x 3 ymm
 * = 12 accumulators + 2 row vectors + 1 broadcast (the third row vector is a memory operand, see
 * fmadd_mem), and the 8 x 48 block takes 4 passes. Every output is still one sum over d (st) or
 * over keys (ot) in increasing order from the same start (0, or OT * alpha), with the same fmadd
 * per term, so the results are the AVX-512 kernels' bit for bit; the partial forms skip the same
 * 16-row vectors (2 ymm) the AVX-512 ones skip. Included by attn_avx512_tiles.h and attn_avx512.c
 * in their AVX2 build (ATTN_AVX2_BUILD), inside the AVX2 target region, after attn_avx2_shim.h.
 *
 * Code generation: the accumulators are named variables, not an array: from an array the compiler
 * may store all 12 back to the stack at every step of the loop (dead stores it does not sink out:
 * 12 ymm stores per 24 FMAs against one 256-bit store per cycle), and with a third row vector in a
 * register it spills accumulators into the FMA chains. The whole-group kernels are not inlined:
 * inside fwd_item / bwd_tiles (many other live values) the allocation degrades the same way.
 * Together these make the forward about 1.5x and the backward 1.4x faster than the array form
 * (S = 2048, D = 128, 2 threads). */
#ifndef MASKPACK_ATTN_AVX2_TILES_H
#define MASKPACK_ATTN_AVX2_TILES_H

#define AVX2_AI static inline __attribute__((always_inline))

/* (b, p, acc) -> acc + b * (the 8 floats at p) as one vfmadd231ps with a memory operand: it frees
 * the register of the third row vector; the asm stops the compiler from merging the four identical
 * loads of a step back into a register. Same operation (one rounding of b * y + acc) as
 * _mm256_fmadd_ps(b, y, acc). */
AVX2_AI __m256 fmadd_mem(__m256 b, const float *p, __m256 acc) {
    __asm__("vfmadd231ps %2, %1, %0" : "+x"(acc) : "x"(b), "m"(*(const __m256 *)p));
    return acc;
}

/* alpha's ymm column y (alpha is 3 vectors of 16 rows) */
AVX2_AI __m256 alpha_ymm(const __m512 *alpha, int y) { return (y & 1) ? alpha[y >> 1].hi : alpha[y >> 1].lo; }

/* The 12 accumulators of a pass: a<r><c> for row r < 4 (key or column), ymm column c < 3. */
#define AVX2_ACC12 __m256 a00, a01, a02, a10, a11, a12, a20, a21, a22, a30, a31, a32

/* One step for the enabled ymm columns (m0, m1, m2 constants): a<r><c> += s[r] * v[8c ..]. */
#define AVX2_STEPM(v, s, m0, m1, m2)                                                             \
    do {                                                                                         \
        const float *v_ = (v), *s_ = (s);                                                        \
        __m256 y0_ = _mm256_setzero_ps(), y1_ = _mm256_setzero_ps(), b_;                         \
        if (m0) y0_ = _mm256_load_ps(v_);                                                        \
        if (m1) y1_ = _mm256_load_ps(v_ + 8);                                                    \
        b_ = _mm256_broadcast_ss(s_);                                                            \
        if (m0) a00 = _mm256_fmadd_ps(b_, y0_, a00);                                             \
        if (m1) a01 = _mm256_fmadd_ps(b_, y1_, a01);                                             \
        if (m2) a02 = fmadd_mem(b_, v_ + 16, a02);                                               \
        b_ = _mm256_broadcast_ss(s_ + 1);                                                        \
        if (m0) a10 = _mm256_fmadd_ps(b_, y0_, a10);                                             \
        if (m1) a11 = _mm256_fmadd_ps(b_, y1_, a11);                                             \
        if (m2) a12 = fmadd_mem(b_, v_ + 16, a12);                                               \
        b_ = _mm256_broadcast_ss(s_ + 2);                                                        \
        if (m0) a20 = _mm256_fmadd_ps(b_, y0_, a20);                                             \
        if (m1) a21 = _mm256_fmadd_ps(b_, y1_, a21);                                             \
        if (m2) a22 = fmadd_mem(b_, v_ + 16, a22);                                               \
        b_ = _mm256_broadcast_ss(s_ + 3);                                                        \
        if (m0) a30 = _mm256_fmadd_ps(b_, y0_, a30);                                             \
        if (m1) a31 = _mm256_fmadd_ps(b_, y1_, a31);                                             \
        if (m2) a32 = fmadd_mem(b_, v_ + 16, a32);                                               \
    } while (0)
#define AVX2_STEP12(v, s) AVX2_STEPM(v, s, 1, 1, 1)

/* Stores the enabled ymm columns of the 4 accumulator rows to p (rows BQ apart). */
#define AVX2_STOREM(p, m0, m1, m2)                                                               \
    do {                                                                                         \
        float *p_ = (p);                                                                         \
        if (m0) _mm256_store_ps(p_, a00), _mm256_store_ps(p_ + BQ, a10);                         \
        if (m0) _mm256_store_ps(p_ + 2 * BQ, a20), _mm256_store_ps(p_ + 3 * BQ, a30);            \
        if (m1) _mm256_store_ps(p_ + 8, a01), _mm256_store_ps(p_ + BQ + 8, a11);                 \
        if (m1) _mm256_store_ps(p_ + 2 * BQ + 8, a21), _mm256_store_ps(p_ + 3 * BQ + 8, a31);    \
        if (m2) _mm256_store_ps(p_ + 16, a02), _mm256_store_ps(p_ + BQ + 16, a12);               \
        if (m2) _mm256_store_ps(p_ + 2 * BQ + 16, a22), _mm256_store_ps(p_ + 3 * BQ + 16, a32);  \
    } while (0)

/* ST[k0 + r][8*y0 + 8*c ..] for keys r < 4 of a packed group, ymm columns c < ny (1 to 3, a
 * constant after inlining) from ymm y0: the sum over d of G[d][k0 + r] * YT[d][...]. */
AVX2_AI void st4(const float *YT, int64_t D, const float *G, float *ST, const int k0, const int y0, const int ny) {
    AVX2_ACC12;
    a00 = a01 = a02 = a10 = a11 = a12 = a20 = a21 = a22 = a30 = a31 = a32 = _mm256_setzero_ps();
    const float *yt = YT + 8 * y0, *g = G + k0;
    int64_t d = 0;
    /* two steps per iteration (the loop's own instructions are a fifth of its body otherwise) */
    for (; d + 2 <= D; d += 2, yt += 2 * BQ, g += 16) {
        /* the next group's keys, one line per two steps: they come from L2 */
        _mm_prefetch((const char *)(g + 8 * D), _MM_HINT_T0);
        AVX2_STEPM(yt, g, 1, ny >= 2, ny >= 3);
        AVX2_STEPM(yt + BQ, g + 8, 1, ny >= 2, ny >= 3);
    }
    if (d < D) AVX2_STEPM(yt, g, 1, ny >= 2, ny >= 3);
    AVX2_STOREM(ST + k0 * BQ + 8 * y0, 1, ny >= 2, ny >= 3);
}

/* Loads the 4 x 3 accumulators of the pass (k0, y0) from OT times alpha. */
#define AVX2_LOAD_ALPHA(OT, alpha, k0, y0)                                                       \
    do {                                                                                         \
        const float *o_ = (OT) + (k0) * BQ + 8 * (y0);                                           \
        const __m256 m0_ = alpha_ymm(alpha, y0), m1_ = alpha_ymm(alpha, (y0) + 1),               \
                     m2_ = alpha_ymm(alpha, (y0) + 2);                                           \
        a00 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a01 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_); \
        a02 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                       \
        o_ += BQ;                                                                                \
        a10 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a11 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_); \
        a12 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                       \
        o_ += BQ;                                                                                \
        a20 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a21 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_); \
        a22 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                       \
        o_ += BQ;                                                                                \
        a30 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a31 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_); \
        a32 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                       \
    } while (0)

/* OT[k0 + r][8*y0 .. 8*y0 + 24) for columns r < 4 of a VP slab: OT * alpha, plus
 * X[j*8 + k0 + r] * A[j][...] for keys j = 0 .. nk - 1 in order. */
AVX2_AI void ot4(float *OT, const float *X, const float *A, int32_t nk, const __m512 *alpha, const int k0,
                 const int y0) {
    AVX2_ACC12;
    AVX2_LOAD_ALPHA(OT, alpha, k0, y0);
    const float *a = A + 8 * y0, *x = X + k0;
    int32_t j = 0;
    for (; j + 2 <= nk; j += 2, a += 2 * BQ, x += 16) { /* two keys per iteration, in order */
        AVX2_STEP12(a, x);
        AVX2_STEP12(a + BQ, x + 8);
    }
    if (j < nk) AVX2_STEP12(a, x);
    AVX2_STOREM(OT + k0 * BQ + 8 * y0, 1, 1, 1);
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
static __attribute__((noinline)) void st_group(const float *YT, int64_t D, const float *G, float *ST) {
    /* both key halves over one half of YT's columns before the other half: 12 KB of YT (D = 128)
     * stays in L1 between the two passes that read it */
    st4(YT, D, G, ST, 0, 0, 3);
    st4(YT, D, G, ST, 4, 0, 3);
    st4(YT, D, G, ST, 0, 3, 3);
    st4(YT, D, G, ST, 4, 3, 3);
}

/* OT[r][0..48) = OT * alpha + sum_j X[j*8 + r] * A[j][0..48) for the 8 columns of one VP slab. */
static __attribute__((noinline)) void ot_group(float *OT, const float *X, const float *A, int32_t nk,
                                               const __m512 *alpha) {
    for (int y0 = 0; y0 < 6; y0 += 3) /* (the half of A two passes read stays in L1 between them) */
        for (int k0 = 0; k0 < 8; k0 += 4) ot4(OT, X, A, nk, alpha, k0, y0);
}

#if defined(ATTN_AVX2_PARTIAL_TILES) /* attn_avx512.c's partial-tile kernels */

/* st_group for the 16-row vectors ca .. ca + nv - 1 only (ymm columns 2ca .. 2(ca + nv)); the
 * other lanes of ST are left as they were. */
static __attribute__((noinline)) void st_group_cv(const float *YT, int64_t D, const float *G, float *ST,
                                                  const int ca, const int nv) {
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
    AVX2_ACC12;
    AVX2_LOAD_ALPHA(OT, alpha, k0, y0);
    for (int k = 0; k < nrun; k++) {
        int ca = code[k] >> 2, nv = code[k] & 3;
        int la = 2 * ca - y0, lb = 2 * (ca + nv) - y0;
        if (la < 0) la = 0;
        if (lb > 3) lb = 3;
        if (la >= lb) continue;
        /* keys [cut[k], cut[k+1]) in order, into the pass's ymm columns la .. lb - 1 */
        const float *a = A + cut[k] * BQ + 8 * y0, *x = X + cut[k] * 8 + k0;
        int32_t n = cut[k + 1] - cut[k];
#define OT_RUN(m0, m1, m2) \
    for (int32_t j = 0; j < n; j++, a += BQ, x += 8) AVX2_STEPM(a, x, m0, m1, m2)
        switch (la * 4 + lb) {
        case 3: OT_RUN(1, 1, 1); break;
        case 2: OT_RUN(1, 1, 0); break;
        case 1: OT_RUN(1, 0, 0); break;
        case 7: OT_RUN(0, 1, 1); break;
        case 6: OT_RUN(0, 1, 0); break;
        case 11: OT_RUN(0, 0, 1); break;
        default: break;
        }
#undef OT_RUN
    }
    AVX2_STOREM(OT + k0 * BQ + 8 * y0, 1, 1, 1);
}

/* ot_group over keys split into runs (run k: keys [cut[k], cut[k+1]) seen by the vectors of
 * code[k] = ca * 4 + nv); alpha is applied to every vector. */
static __attribute__((noinline)) void ot_group_cv(float *OT, const float *X, const float *A, const __m512 *alpha,
                                                  const int32_t *cut, const int *code, int nrun) {
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 0, 0);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 4, 0);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 0, 3);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 4, 3);
}

#endif

#endif
