/* attn_avx2_uk.h: the AVX2 + FMA micro-kernels of the f32 attention kernels (attn_avx2.c forward,
 * attn_avx2_bwd.c backward), what attn_f32_kernel.inc, attn_fwd_kernel.inc and attn_bwd_kernel.inc
 * are written over: the row-vector vocabulary (one ymm = 8 query rows, 6 per block of BQ = 48),
 * the QK^T and PV tile kernels on 8 packed keys (or 8 columns), the packing of query rows and keys
 * (8 x 8 register transposes), the output stores, D_i and the dK/dV product. Every primitive does
 * per lane what its AVX-512 twin (attn_avx512_uk.h) does, in the same order (same products, sums
 * from the same start in the same order, the same polynomial and power-of-two scaling in exp2), so
 * the AVX2 kernels give the AVX-512 kernels' bits; only the register blocking differs.
 * Included inside the AVX2 target region (attn_avx2.c, attn_avx2_bwd.c); every function is static. */
#ifndef MASKPACK_ATTN_AVX2_UK_H
#define MASKPACK_ATTN_AVX2_UK_H

#include <stdint.h>

#define BQ    ATTN_BQ
#define BK    ATTN_BK
#define LOG2E 1.4426950408889634

static inline int64_t round8(int64_t x) { return (x + 7) & ~(int64_t)7; }
static inline int64_t round16(int64_t x) { return (x + 15) & ~(int64_t)15; }
static inline int64_t round64(int64_t x) { return (x + 63) & ~(int64_t)63; }

/* ---- the row-vector vocabulary (see attn_f32_kernel.inc) ---------------------------------------- */

typedef __m256 vrow; /* RV query rows of one score or accumulator column */
#define RV  8
#define NRV 6            /* BQ / RV */
typedef __m256i vr_mask; /* all-ones lanes where allowed */
typedef __m256i vr_jvec;
/* A block's rows (attn_rows) as lane vectors: base [lo, hi), span [slo, shi), prefix [0, pre). */
typedef struct {
    __m256i lo[NRV], hi[NRV], slo[NRV], shi[NRV], pre[NRV];
} vr_rule;

#define VR_INL static inline __attribute__((always_inline))
VR_INL vrow vr_zero(void) { return _mm256_setzero_ps(); }
VR_INL vrow vr_set1(float x) { return _mm256_set1_ps(x); }
VR_INL vrow vr_load(const float *p) { return _mm256_load_ps(p); }
VR_INL vrow vr_loadu(const float *p) { return _mm256_loadu_ps(p); }
VR_INL void vr_store(float *p, vrow x) { _mm256_store_ps(p, x); }
VR_INL void vr_storeu(float *p, vrow x) { _mm256_storeu_ps(p, x); }
VR_INL vrow vr_max(vrow a, vrow b) { return _mm256_max_ps(a, b); } /* b where either is NaN */
VR_INL vrow vr_add(vrow a, vrow b) { return _mm256_add_ps(a, b); }
VR_INL vrow vr_sub(vrow a, vrow b) { return _mm256_sub_ps(a, b); }
VR_INL vrow vr_mul(vrow a, vrow b) { return _mm256_mul_ps(a, b); }
VR_INL vrow vr_fmadd(vrow a, vrow b, vrow c) { return _mm256_fmadd_ps(a, b, c); }
VR_INL vrow vr_fnmadd(vrow a, vrow b, vrow c) { return _mm256_fnmadd_ps(a, b, c); }

/* 2^x for x <= 0 (x = -inf gives 0): 2^round(x) * p(x - round(x)), p the degree-6 fit of
 * attn_avx512_common.h's exp2_ps. AVX2 has no scalef: p * 2^n is built as two exact power-of-two
 * products (2^a * 2^b, a = n >> 1, b = n - a, each a normal float for n in [-125, 256]; larger n
 * are clamped to 256, which overflows to inf as scalef does for any n past 128 when |p| >= 1/2),
 * and lanes below -125 are zeroed as scalef's zeroing mask does there: the same bits. */
VR_INL vrow vr_exp2(vrow x) {
    const __m256 lo = _mm256_set1_ps(-125.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5337576831145398e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3399860363060092e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.61851953435526e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503289975177984e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.40226466087139e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472056005104e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000000005920204f));
    __m256i i = _mm256_cvtps_epi32(_mm256_min_ps(n, _mm256_set1_ps(256.0f)));
    __m256i a = _mm256_srai_epi32(i, 1), b = _mm256_sub_epi32(i, a), bias = _mm256_set1_epi32(127);
    __m256 sa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
    __m256 sb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, sa), sb), keep);
}

/* tanh(x) as attn_avx512_common.h's tanh_ps: odd polynomial near 0, (1 - e)/(1 + e) with
 * e = exp(-2|x|) elsewhere, the sign restored. */
VR_INL vrow vr_tanh(vrow x) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 e = vr_exp2(_mm256_mul_ps(ax, _mm256_set1_ps((float)(-2.0 * LOG2E))));
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-17.0f / 315.0f);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
    p = _mm256_fmadd_ps(p, x2, one);
    __m256 small = _mm256_mul_ps(ax, p);
    __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
    return _mm256_or_ps(r, _mm256_and_ps(x, sign));
}

/* -inf lanes (rows that have seen no key) to 0, the others as they are */
VR_INL vrow vr_unseen0(vrow x) {
    return _mm256_blendv_ps(x, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}

VR_INL void vr_rule_init(vr_rule *R, const attn_rows *rows) {
    for (int c = 0; c < NRV; c++) {
        R->lo[c] = _mm256_loadu_si256((const __m256i *)(rows->lo + RV * c));
        R->hi[c] = _mm256_loadu_si256((const __m256i *)(rows->hi + RV * c));
        R->slo[c] = _mm256_loadu_si256((const __m256i *)(rows->slo + RV * c));
        R->shi[c] = _mm256_loadu_si256((const __m256i *)(rows->shi + RV * c));
        R->pre[c] = _mm256_loadu_si256((const __m256i *)(rows->pre + RV * c));
    }
}
VR_INL vr_jvec vr_jset1(int32_t j) { return _mm256_set1_epi32(j); }
/* lanes with a <= j < b */
VR_INL __m256i vr_in(__m256i a, __m256i j, __m256i b) {
    __m256i a_gt_j = _mm256_cmpgt_epi32(a, j); /* not a <= j */
    return _mm256_andnot_si256(a_gt_j, _mm256_cmpgt_epi32(b, j));
}
/* Base-only rows (attn_rows.simple): one interval per row. */
VR_INL vr_mask vr_allowed_simple(const vr_rule *R, int c, vr_jvec jv) { return vr_in(R->lo[c], jv, R->hi[c]); }
VR_INL vr_mask vr_allowed(const vr_rule *R, int c, int32_t j) {
    __m256i jv = _mm256_set1_epi32(j);
    __m256i base = vr_in(R->lo[c], jv, R->hi[c]), span = vr_in(R->slo[c], jv, R->shi[c]);
    __m256i pre = _mm256_cmpgt_epi32(R->pre[c], jv);
    return _mm256_or_si256(_mm256_or_si256(base, span), pre);
}
/* lane i: x where k allows it, else fill */
VR_INL vrow vr_select(vr_mask k, vrow x, vrow fill) { return _mm256_blendv_ps(fill, x, _mm256_castsi256_ps(k)); }

/* mask of the first n lanes (n <= 0: none, n >= 8: all), for maskload / maskstore */
VR_INL __m256i lanes_below(int64_t n) {
    int k = n < 0 ? 0 : n > 8 ? 8 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---- QK^T and PV on packed keys (layouts: attn_f32_kernel.inc) --------------------------------------
 * The AVX-512 kernels hold 8 keys x 3 zmm = 24 accumulators; AVX2 has 16 registers, so a pass here
 * holds 4 keys (or columns) x 3 ymm = 12 accumulators + 2 row vectors + 1 broadcast (the third row
 * vector is a memory operand, see fmadd_mem), and the 8 x 48 block takes 4 passes. Every output
 * is still one sum over d (st) or over keys (ot) in increasing order from the same start (0, or
 * OT * alpha), with the same fmadd per term, so the results are the AVX-512 kernels' bit for bit;
 * the partial forms skip the same 16-row groups (2 ymm) the AVX-512 ones skip.
 *
 * Code generation: the accumulators are named variables, not an array: from an array the compiler
 * may store all 12 back to the stack at every step of the loop (dead stores it does not sink out:
 * 12 ymm stores per 24 FMAs against one 256-bit store per cycle), and with a third row vector in a
 * register it spills accumulators into the FMA chains. The whole-group kernels are not inlined:
 * inside the item and tile loops (many other live values) the allocation degrades the same way. */

#define AVX2_AI static inline __attribute__((always_inline))

/* (b, p, acc) -> acc + b * (the 8 floats at p) as one vfmadd231ps with a memory operand: it frees
 * the register of the third row vector; the asm stops the compiler from merging the four identical
 * loads of a step back into a register. Same operation (one rounding of b * y + acc) as
 * _mm256_fmadd_ps(b, y, acc). */
AVX2_AI __m256 fmadd_mem(__m256 b, const float *p, __m256 acc) {
    __asm__("vfmadd231ps %2, %1, %0" : "+x"(acc) : "x"(b), "m"(*(const __m256 *)p));
    return acc;
}

/* The 12 accumulators of a pass: a<r><c> for row r < 4 (key or column), ymm column c < 3. */
#define AVX2_ACC12 __m256 a00, a01, a02, a10, a11, a12, a20, a21, a22, a30, a31, a32

/* One step for the enabled ymm columns (m0, m1, m2 constants): a<r><c> += s[r] * v[8c ..]. */
#define AVX2_STEPM(v, s, m0, m1, m2)                                                                                   \
    do {                                                                                                               \
        const float *v_ = (v), *s_ = (s);                                                                              \
        __m256 y0_ = _mm256_setzero_ps(), y1_ = _mm256_setzero_ps(), b_;                                               \
        if (m0) y0_ = _mm256_load_ps(v_);                                                                              \
        if (m1) y1_ = _mm256_load_ps(v_ + 8);                                                                          \
        b_ = _mm256_broadcast_ss(s_);                                                                                  \
        if (m0) a00 = _mm256_fmadd_ps(b_, y0_, a00);                                                                   \
        if (m1) a01 = _mm256_fmadd_ps(b_, y1_, a01);                                                                   \
        if (m2) a02 = fmadd_mem(b_, v_ + 16, a02);                                                                     \
        b_ = _mm256_broadcast_ss(s_ + 1);                                                                              \
        if (m0) a10 = _mm256_fmadd_ps(b_, y0_, a10);                                                                   \
        if (m1) a11 = _mm256_fmadd_ps(b_, y1_, a11);                                                                   \
        if (m2) a12 = fmadd_mem(b_, v_ + 16, a12);                                                                     \
        b_ = _mm256_broadcast_ss(s_ + 2);                                                                              \
        if (m0) a20 = _mm256_fmadd_ps(b_, y0_, a20);                                                                   \
        if (m1) a21 = _mm256_fmadd_ps(b_, y1_, a21);                                                                   \
        if (m2) a22 = fmadd_mem(b_, v_ + 16, a22);                                                                     \
        b_ = _mm256_broadcast_ss(s_ + 3);                                                                              \
        if (m0) a30 = _mm256_fmadd_ps(b_, y0_, a30);                                                                   \
        if (m1) a31 = _mm256_fmadd_ps(b_, y1_, a31);                                                                   \
        if (m2) a32 = fmadd_mem(b_, v_ + 16, a32);                                                                     \
    } while (0)
#define AVX2_STEP12(v, s) AVX2_STEPM(v, s, 1, 1, 1)

/* Stores the enabled ymm columns of the 4 accumulator rows to p (rows BQ apart). */
#define AVX2_STOREM(p, m0, m1, m2)                                                                                     \
    do {                                                                                                               \
        float *p_ = (p);                                                                                               \
        if (m0) _mm256_store_ps(p_, a00), _mm256_store_ps(p_ + BQ, a10);                                               \
        if (m0) _mm256_store_ps(p_ + 2 * BQ, a20), _mm256_store_ps(p_ + 3 * BQ, a30);                                  \
        if (m1) _mm256_store_ps(p_ + 8, a01), _mm256_store_ps(p_ + BQ + 8, a11);                                       \
        if (m1) _mm256_store_ps(p_ + 2 * BQ + 8, a21), _mm256_store_ps(p_ + 3 * BQ + 8, a31);                          \
        if (m2) _mm256_store_ps(p_ + 16, a02), _mm256_store_ps(p_ + BQ + 16, a12);                                     \
        if (m2) _mm256_store_ps(p_ + 2 * BQ + 16, a22), _mm256_store_ps(p_ + 3 * BQ + 16, a32);                        \
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
#define AVX2_LOAD_ALPHA(OT, alpha, k0, y0)                                                                             \
    do {                                                                                                               \
        const float *o_ = (OT) + (k0)*BQ + 8 * (y0);                                                                   \
        const __m256 m0_ = alpha[y0], m1_ = alpha[(y0) + 1], m2_ = alpha[(y0) + 2];                                    \
        a00 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a01 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_);                \
        a02 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                                             \
        o_ += BQ;                                                                                                      \
        a10 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a11 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_);                \
        a12 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                                             \
        o_ += BQ;                                                                                                      \
        a20 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a21 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_);                \
        a22 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                                             \
        o_ += BQ;                                                                                                      \
        a30 = _mm256_mul_ps(_mm256_load_ps(o_), m0_), a31 = _mm256_mul_ps(_mm256_load_ps(o_ + 8), m1_);                \
        a32 = _mm256_mul_ps(_mm256_load_ps(o_ + 16), m2_);                                                             \
    } while (0)

/* OT[k0 + r][8*y0 .. 8*y0 + 24) for columns r < 4 of a VP slab: OT * alpha, plus
 * X[j*8 + k0 + r] * A[j][...] for keys j = 0 .. nk - 1 in order. */
AVX2_AI void ot4(float *OT, const float *X, const float *A, int32_t nk, const vrow *alpha, const int k0, const int y0) {
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
static __attribute__((noinline, unused)) void st_group(const float *YT, int64_t D, const float *G, float *ST) {
    /* both key halves over one half of YT's columns before the other half: 12 KB of YT (D = 128)
     * stays in L1 between the two passes that read it */
    st4(YT, D, G, ST, 0, 0, 3);
    st4(YT, D, G, ST, 4, 0, 3);
    st4(YT, D, G, ST, 0, 3, 3);
    st4(YT, D, G, ST, 4, 3, 3);
}

/* OT[r][0..48) = OT * alpha + sum_j X[j*8 + r] * A[j][0..48) for the 8 columns of one VP slab. */
static __attribute__((noinline, unused)) void ot_group(float *OT, const float *X, const float *A, int32_t nk,
                                                       const vrow *alpha) {
    for (int y0 = 0; y0 < 6; y0 += 3) /* (the half of A two passes read stays in L1 between them) */
        for (int k0 = 0; k0 < 8; k0 += 4) ot4(OT, X, A, nk, alpha, k0, y0);
}

/* st_group for the 16-row groups ca .. ca + nv - 1 only (ymm columns 2ca .. 2(ca + nv)); the
 * other lanes of ST are left as they were. */
static __attribute__((noinline, unused)) void st_group_cv(const float *YT, int64_t D, const float *G, float *ST,
                                                          const int ca, const int nv) {
    switch (ca * 4 + nv) {
#define ST_CV(code, a, b)                                                                                              \
    case code:                                                                                                         \
        st4_range(YT, D, G, ST, 0, a, b);                                                                              \
        st4_range(YT, D, G, ST, 4, a, b);                                                                              \
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

/* One pass (columns k0 .. k0 + 3, ymm columns y0 .. y0 + 2) of ot_group_runs: each run adds its keys
 * to the ymm columns of its row groups inside the pass (code = ca * 4 + nv, attn_f32_kernel.inc). */
AVX2_AI void ot_pass_cv(float *OT, const float *X, const float *A, const vrow *alpha, const int32_t *cut,
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
#define OT_RUN(m0, m1, m2)                                                                                             \
    for (int32_t j = 0; j < n; j++, a += BQ, x += 8) AVX2_STEPM(a, x, m0, m1, m2)
        /* a pass covers ymm columns y0 .. y0 + 2 (y0 = 0 or 3) and a group two of them from an
         * even column, so [la, lb) is one of [0, 1), [0, 2), [0, 3), [1, 3), [2, 3) */
        switch (la * 4 + lb) {
        case 3: OT_RUN(1, 1, 1); break;
        case 2: OT_RUN(1, 1, 0); break;
        case 1: OT_RUN(1, 0, 0); break;
        case 7: OT_RUN(0, 1, 1); break;
        case 11: OT_RUN(0, 0, 1); break;
        default: break;
        }
#undef OT_RUN
    }
    AVX2_STOREM(OT + k0 * BQ + 8 * y0, 1, 1, 1);
}

/* ot_group over keys split into runs (run k: keys [cut[k], cut[k+1]) seen by the row groups of
 * code[k] = ca * 4 + nv); alpha is applied to every column. */
static __attribute__((noinline, unused)) void ot_group_runs(float *OT, const float *X, const float *A,
                                                            const vrow *alpha, const int32_t *cut, const int *code,
                                                            int nrun) {
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 0, 0);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 4, 0);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 0, 3);
    ot_pass_cv(OT, X, A, alpha, cut, code, nrun, 4, 3);
}

/* st_group for the 16-row groups of code = ca * 4 + nv (attn_f32_kernel.inc); other codes: nothing */
static inline void st_group_run(const float *YT, int64_t D, const float *G, float *ST, int code) {
    if (code & 3) st_group_cv(YT, D, G, ST, code >> 2, code & 3);
}

/* ---- packing and output rows -------------------------------------------------------------------- */

/* In-register transpose of an 8 x 8 f32 block (r[i] = row i -> r[j] = column j). */
static inline void tr8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* dst[j][i] = src[i][j] * mul for a rows x cols block (both multiples of 8). */
static inline void transpose_scaled(const float *src, int64_t ss, float *dst, int64_t ds, int64_t rows, int64_t cols,
                                    float mul) {
    __m256 m = _mm256_set1_ps(mul), r[8];
    for (int64_t i = 0; i < rows; i += 8)
        for (int64_t j = 0; j < cols; j += 8) {
            for (int t = 0; t < 8; t++) r[t] = _mm256_loadu_ps(src + (i + t) * ss + j);
            tr8(r);
            for (int t = 0; t < 8; t++) _mm256_storeu_ps(dst + (j + t) * ds + i, _mm256_mul_ps(r[t], m));
        }
}

/* dst[d] = src[d] * m for d in [a, b), the last partial 8 with a masked store (neither reads nor
 * writes past b; masked stores are slow, so whole vectors take plain ones). */
static inline void store_masked(float *dst, const float *src, int64_t a, int64_t b, __m256 m) {
    int64_t d = a;
    for (; d + 8 <= b; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), m));
    if (d < b) {
        __m256i k = lanes_below(b - d);
        _mm256_maskstore_ps(dst + d, k, _mm256_mul_ps(_mm256_maskload_ps(src + d, k), m));
    }
}

/* The moves' vocabulary (attn_pack.inc): 8 x 8 transposes of ymm. */
#define TW 8
typedef __m256 tvec;
#define tv_load   _mm256_load_ps
#define tv_loadu  _mm256_loadu_ps
#define tv_store  _mm256_store_ps
#define tv_storeu _mm256_storeu_ps
#define tv_stream _mm256_stream_ps
#define tv_mul    _mm256_mul_ps
#define tv_set1   _mm256_set1_ps
#define tv_tr     tr8
static inline void tv_store8(float *dst, __m256 v, int half) {
    (void)half; /* one group of 8 keys per ymm */
    _mm256_storeu_ps(dst, v);
}

#include "attn_pack.inc"

/* ---- backward pieces ------------------------------------------------------------------------------ */

/* sum_d a[d] * b[d] in double (the products are exact): the row's D_i, in attn_avx512_uk.h's
 * order: per 16 columns, lanes 0-7 into one 8-double sum and 8-15 into another (here each as two
 * halves of 4), then those two added and reduced as _mm512_reduce_add_pd does (halves, then
 * quarters, then the pair). */
static __attribute__((unused)) float dot_f64(const float *a, const float *b, int64_t n) {
    __m256d s0a = _mm256_setzero_pd(), s0b = _mm256_setzero_pd(), s1a = _mm256_setzero_pd(), s1b = _mm256_setzero_pd();
    for (int64_t d = 0; d < n; d += 16) {
        __m256i k0 = lanes_below(n - d), k1 = lanes_below(n - d - 8);
        __m256 x0 = _mm256_maskload_ps(a + d, k0), y0 = _mm256_maskload_ps(b + d, k0);
        __m256 x1 = _mm256_maskload_ps(a + d + 8, k1), y1 = _mm256_maskload_ps(b + d + 8, k1);
        s0a = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x0)), _mm256_cvtps_pd(_mm256_castps256_ps128(y0)),
                              s0a);
        s0b = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1)),
                              _mm256_cvtps_pd(_mm256_extractf128_ps(y0, 1)), s0b);
        s1a = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x1)), _mm256_cvtps_pd(_mm256_castps256_ps128(y1)),
                              s1a);
        s1b = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1)),
                              _mm256_cvtps_pd(_mm256_extractf128_ps(y1, 1)), s1b);
    }
    __m256d lo = _mm256_add_pd(s0a, s1a), hi = _mm256_add_pd(s0b, s1b);
    __m256d t = _mm256_add_pd(hi, lo);
    __m128d u = _mm_add_pd(_mm256_extractf128_pd(t, 1), _mm256_castpd256_pd128(t));
    return (float)(_mm_cvtsd_f64(u) + _mm_cvtsd_f64(_mm_unpackhi_pd(u, u)));
}

/* C [nk][Dp] += A0 x Y0 (n0 rows) then += A1 x Y1 (n1 rows) for JB rows of C and CW vectors of 16
 * columns (2 CW ymm): attn_avx512_uk.h's c_block2 (the same sums per element, in the same order)
 * with the accumulators in ymm. */
static inline __attribute__((always_inline)) void c_block2(float *C, int64_t cs, const float *A0, const float *Y0,
                                                           int32_t n0, const float *A1, const float *Y1, int32_t n1,
                                                           int64_t ys, const int JB, const int CW) {
    __m256 acc[6][4];
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < 2 * CW; c++) acc[r][c] = _mm256_load_ps(C + r * cs + c * 8);
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < CW; c++) _mm_prefetch((const char *)(C + (JB + r) * cs + c * 16), _MM_HINT_T0);
    for (int half = 0; half < 2; half++) {
        const float *A = half ? A1 : A0, *Y = half ? Y1 : Y0;
        int32_t nr = half ? n1 : n0;
        for (int32_t x = 0; x < nr; x++) {
            __m256 y[4];
            for (int c = 0; c < 2 * CW; c++) y[c] = _mm256_load_ps(Y + x * ys + c * 8);
            for (int r = 0; r < JB; r++) {
                __m256 a = _mm256_broadcast_ss(A + r * BQ + x);
                for (int c = 0; c < 2 * CW; c++) acc[r][c] = _mm256_fmadd_ps(a, y[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < 2 * CW; c++) _mm256_store_ps(C + r * cs + c * 8, acc[r][c]);
}

/* C [nk][Dp] += A0 x Y0 then A1 x Y1 (c_block2 over the whole of C). Blocks of 3 rows x 2 vectors
 * of 16 columns = 12 ymm accumulators + 4 of Y (one folded into the FMAs by the compiler) + the
 * broadcast: 7 loads per 12 FMAs, and A (both blocks' P^T or dS^T, 24 KB) is swept once per 32
 * columns instead of per 16 (paired A/B at S = 2048, D = 128: backward 1.06x faster than 6 rows x
 * 1 vector); an odd last vector of columns takes 6 rows x 1. */
static __attribute__((unused)) void c_kernel2(float *C, int64_t cs, const float *A0, const float *Y0, int32_t n0,
                                              const float *A1, const float *Y1, int32_t n1, int64_t ys, int64_t Dp,
                                              int32_t nk) {
    int64_t nv = Dp / 16, c = 0;
#define CB2(JB, CW)                                                                                                    \
    c_block2(C + j * cs + c * 16, cs, A0 + j * BQ, Y0 + c * 16, n0, A1 + j * BQ, Y1 + c * 16, n1, ys, JB, CW)
    for (; c + 2 <= nv; c += 2) {
        int32_t j = 0;
        for (; j + 3 <= nk; j += 3) CB2(3, 2);
        switch (nk - j) {
        case 2: CB2(2, 2); break;
        case 1: CB2(1, 2); break;
        default: break;
        }
    }
    for (; c < nv; c++) {
        int32_t j = 0;
        for (; j + 6 <= nk; j += 6) CB2(6, 1);
        switch (nk - j) {
        case 5: CB2(5, 1); break;
        case 4: CB2(4, 1); break;
        case 3: CB2(3, 1); break;
        case 2: CB2(2, 1); break;
        case 1: CB2(1, 1); break;
        default: break;
        }
    }
#undef CB2
}

/* C [nk][Dp] += A [nk][BQ] x Y [nr][Dp]: one query block, c_kernel2 with an empty second block. */
static __attribute__((unused)) void c_kernel(float *C, int64_t cs, const float *A, const float *Y, int64_t ys,
                                             int64_t Dp, int32_t nk, int32_t nr) {
    c_kernel2(C, cs, A, Y, nr, A, Y, 0, ys, Dp, nk);
}

#endif
