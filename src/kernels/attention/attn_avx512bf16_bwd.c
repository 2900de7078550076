/* attn_avx512bf16_bwd.c: bf16 attention backward with AVX512-BF16 dot products (VDPBF16PS): the
 * backward framework (attn_bwd_kernel.inc: the loop order, the claims, the recomputed softmax and
 * dS in f32, the reductions) with its five products on pairs of bf16 and f32 accumulation, twice
 * the multiply-adds of an f32 FMA per instruction:
 *   S^T[j][i]   = sum_p Q[i][2p] K[j][2p] + Q[i][2p+1] K[j][2p+1]        pairs of head dims
 *   dP^T[j][i]  = sum_p dO[i][2p] V[j][2p] + dO[i][2p+1] V[j][2p+1]      pairs of head dims
 *   dQ^T[d][i] += sum_t dS[2t][i] K[2t][d] + dS[2t+1][i] K[2t+1][d]      pairs of keys
 *   dV[j][d]   += sum_p P[j][2p] dO[2p][d] + P[j][2p+1] dO[2p+1][d]      pairs of query rows
 *   dK[j][d]   += sum_p dS[j][2p] Q[2p][d] + dS[j][2p+1] Q[2p+1][d]      pairs of query rows
 * q, k, v and dO are bf16 already, so S and dP are exact products summed in f32 (as the f32 kernel
 * computes them). P and dS are computed in f32 from them and rounded to bf16 (nearest even) only as
 * operands of the last three products, as flash-attention's bf16 backward does on GPUs: the error
 * this adds to a gradient is at most 2^-8 of the sum of the magnitudes of its terms (what
 * tests/c/test_attention.c bounds). dQ, dK, dV accumulate in f32 across every key block and are
 * rounded once when stored. Only bf16 inputs run here: f32 runs the AVX-512 f32 backward. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_avx512bf16_target.h" /* the AVX512-BF16 target region, BQ, BK, LOG2E */

#include "attn_avx512_common.h"
#include "attn_avx512_uk.h"
#include "attn_bf16_pairs.h"

/* Layouts of the products' operands (32-bit words = bf16 pairs, low half first):
 *   KPk, KPv [W8/8][Dh][8]       (K[j][2p], K[j][2p+1]) per group of 8 keys j    Dh = ceil(D/2)
 *   VPk [W64/64][D8/8][32][8]    (K[2t][d], K[2t+1][d]) per 64-key tile and 8 columns d
 *   QT, dOT [C][Dh][BQ]          (Q[i][2p], Q[i][2p+1]) per query row i
 *   Qp, dOp [C][BQ/2][Dp]        (Q[2p][d], Q[2p+1][d]) per column d
 *   Ph, dSh [2][BK][BQ] bf16     a tile's P and dS per key row (pairs of query rows adjacent)
 *   dSp [BK/2 + 1][BQ]           (dS[2t][i], dS[2t+1][i]) per query row i */
typedef struct {
    uint32_t *KPk, *KPv, *VPk, *QT, *dOT, *Qp, *dOp, *dSp;
    uint16_t *Ph, *dSh;
} bwd_ext;

#define ATTN_FN(name)         attn_avx512bf16_##name
#define ATTN_F32_NO_FORWARD   1
#define ATTN_BWD_OWN_PRODUCTS 1
#include "attn_f32_kernel.inc"
#include "attn_bwd_kernel.inc"

static inline int64_t dh_of(const attn_problem *P) { return (P->d + 1) / 2; }

static size_t bwd_uk_layout(const attn_problem *P, int64_t W, int64_t C, float *base, bwd_bufs *b) {
    int64_t Dh = dh_of(P), D8 = round8(P->d), Dp = round16(P->d), W8 = round8(W > 0 ? W : 1), W64 = round64(W8);
    size_t off = 0; /* in 4-byte words */
#define TAKE(field, type, words)                                                                                       \
    do {                                                                                                               \
        if (b) b->ext.field = (type *)(base + off);                                                                    \
        off += (size_t)round16((int64_t)(words));                                                                      \
    } while (0)
    TAKE(KPk, uint32_t, W8 * Dh);
    TAKE(KPv, uint32_t, W8 * Dh);
    TAKE(VPk, uint32_t, W64 / 2 * D8);
    TAKE(QT, uint32_t, C * Dh * BQ);
    TAKE(dOT, uint32_t, C * Dh * BQ);
    TAKE(Qp, uint32_t, C * (BQ / 2) * Dp);
    TAKE(dOp, uint32_t, C * (BQ / 2) * Dp);
    TAKE(dSp, uint32_t, (BK / 2 + 1) * BQ);
    TAKE(Ph, uint16_t, 2 * BK * BQ / 2);
    TAKE(dSh, uint16_t, 2 * BK * BQ / 2);
#undef TAKE
    return off;
}

/* Keys [0, W) of the group (key r = token kv_start + r), K in both pair forms and V paired by head
 * dims; the padding to whole groups and tiles is zeros. */
static void bwd_uk_pack_keys(const attn_problem *P, const attn_kgroup *G, int32_t kh, int64_t W, bwd_bufs *B) {
    const bwd_ext *X = &B->ext;
    int64_t D = P->d, Dh = dh_of(P), D8 = round8(D), W8 = round8(W), W64 = round64(W8);
    uint16_t *row = (uint16_t *)B->tmp; /* D8 + 2 bf16 */
    for (int64_t j = 0; j < W64; j++) {
        memset(row, 0, (size_t)(D8 + 2) * 2);
        if (j < W) memcpy(row, attn_ptr(&P->k, G->row, G->kv_start + j, kh, 2), (size_t)D * 2);
        if (j < W8) {
            uint32_t *dst = X->KPk + (j / 8) * Dh * 8 + (j % 8);
            for (int64_t p = 0; p < Dh; p++) dst[p * 8] = (uint32_t)row[2 * p] | ((uint32_t)row[2 * p + 1] << 16);
        }
        uint16_t *vp = (uint16_t *)(X->VPk + (j / 64) * (D8 / 8) * 256 + ((j % 64) / 2) * 8) + (j & 1);
        for (int64_t d = 0; d < D8; d++) vp[((d / 8) * 256 + (d % 8)) * 2] = row[d];
        if (j < W8) {
            memset(row, 0, (size_t)(D8 + 2) * 2);
            if (j < W) memcpy(row, attn_ptr(&P->v, G->row, G->kv_start + j, kh, 2), (size_t)D * 2);
            uint32_t *dst = X->KPv + (j / 8) * Dh * 8 + (j % 8);
            for (int64_t p = 0; p < Dh; p++) dst[p * 8] = (uint32_t)row[2 * p] | ((uint32_t)row[2 * p + 1] << 16);
        }
    }
}

static void bwd_uk_prepare(const attn_problem *P, const bwd_slot *S, bwd_bufs *B) {
    const bwd_ext *X = &B->ext;
    int64_t Dh = dh_of(P), Dp = round16(P->d), Rs = bwd_rs(Dp);
    pair_rows(S->Qr, Rs, P->d, Dh, Dp, X->QT + S->c * Dh * BQ, X->Qp + S->c * (BQ / 2) * Dp);
    pair_rows(S->dOr, Rs, P->d, Dh, Dp, X->dOT + S->c * Dh * BQ, X->dOp + S->c * (BQ / 2) * Dp);
}

static void bwd_uk_scores(const attn_problem *P, const bwd_slot *S, bwd_bufs *B, int32_t pa, int32_t nk, float *PT,
                          float *dST) {
    const bwd_ext *X = &B->ext;
    int64_t Dh = dh_of(P);
    st_pairs(X->QT + S->c * Dh * BQ, Dh, X->KPk, pa, pa + nk, PT, 1.0f);
    st_pairs(X->dOT + S->c * Dh * BQ, Dh, X->KPv, pa, pa + nk, dST, 1.0f);
}

/* 16 f32 -> 16 bf16 (nearest even) widened into the low halves of 16 words. */
static inline __m512i bf16_words(__m512 x) { return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)); }

static void bwd_uk_dq(const attn_problem *P, const bwd_slot *S, bwd_bufs *B, int32_t pa, int32_t nk, const float *dST) {
    const bwd_ext *X = &B->ext;
    int64_t D8 = round8(P->d);
    /* dS paired by keys of the packed range: pair t holds keys 2t, 2t + 1; a key of the pair outside
     * [pa, pa + nk) gets dS = 0 (it adds 0 times its K, which is finite or a zero of the padding) */
    const int32_t t0 = pa >> 1, t1 = (pa + nk + 1) >> 1;
    const __m512 zero = _mm512_setzero_ps();
    for (int32_t t = t0; t < t1; t++) {
        int32_t je = 2 * t - pa, jo = je + 1;
        for (int c = 0; c < 3; c++) {
            __m512 e = je >= 0 ? _mm512_load_ps(dST + (int64_t)je * BQ + 16 * c) : zero;
            __m512 o = jo < nk ? _mm512_load_ps(dST + (int64_t)jo * BQ + 16 * c) : zero;
            _mm512_store_si512((void *)(X->dSp + (int64_t)(t - t0) * BQ + 16 * c),
                               _mm512_or_si512(bf16_words(e), _mm512_slli_epi32(bf16_words(o), 16)));
        }
    }
    const __m512 one[3] = {_mm512_set1_ps(1.0f), _mm512_set1_ps(1.0f), _mm512_set1_ps(1.0f)};
    ot_pairs(S->dQT, D8, X->VPk, t0, t1, X->dSp, one);
}

/* C rows [R][16 V columns from d0] += sum over the sources b < nb of A_b [R][np_b] x Y_b [np_b][Dp]
 * (A: bf16 pairs of query rows, one row of BQ / 2 words per key; Y: pairs of rows per column), the
 * sources in order and each source's pairs in order. R and V are constants where this is inlined,
 * so the R x V accumulators stay in registers. */
static inline __attribute__((always_inline)) void c_pairs_block(float *C, int64_t cs, int R, int V, int64_t d0,
                                                                int64_t Dp, int nb, const uint32_t *const *A,
                                                                const uint32_t *const *Y, const int32_t *np) {
    __m512 acc[6][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_loadu_ps(C + r * cs + d0 + 16 * v);
    for (int b = 0; b < nb; b++)
        for (int32_t p = 0; p < np[b]; p++) {
            __m512i y[4];
            for (int v = 0; v < V; v++) y[v] = _mm512_loadu_si512((const void *)(Y[b] + p * Dp + d0 + 16 * v));
            for (int r = 0; r < R; r++) {
                __m512i a = _mm512_set1_epi32((int)A[b][r * (BQ / 2) + p]);
                for (int v = 0; v < V; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)y[v], (__m512bh)a);
            }
        }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) _mm512_storeu_ps(C + r * cs + d0 + 16 * v, acc[r][v]);
}

#define C_PAIRS_V(R, V)                                                                                                \
    case V:                                                                                                            \
        c_pairs_block(Cb, cs, R, V, d0, Dp, nb, A, Y, np);                                                             \
        break
#define C_PAIRS_R(R)                                                                                                   \
    case R:                                                                                                            \
        switch (V) {                                                                                                   \
            C_PAIRS_V(R, 1);                                                                                           \
            C_PAIRS_V(R, 2);                                                                                           \
            C_PAIRS_V(R, 3);                                                                                           \
        default: c_pairs_block(Cb, cs, R, 4, d0, Dp, nb, A, Y, np); break;                                             \
        }                                                                                                              \
        break

/* C [nk][Dp] (rows cs apart) += sum_b A_b [nk][BQ/2 words] x Y_b: blocks of 6 rows x 4 vectors. */
static void c_pairs(float *C, int64_t cs, int32_t nk, int64_t Dp, int nb, const uint32_t *const *A0,
                    const uint32_t *const *Y, const int32_t *np) {
    for (int32_t j0 = 0; j0 < nk; j0 += 6) {
        const int R = nk - j0 < 6 ? nk - j0 : 6;
        const uint32_t *A[2];
        for (int b = 0; b < nb; b++) A[b] = A0[b] + (int64_t)j0 * (BQ / 2);
        for (int64_t d0 = 0; d0 < Dp; d0 += 64) {
            const int V = Dp - d0 < 64 ? (int)((Dp - d0) / 16) : 4;
            float *Cb = C + (int64_t)j0 * cs; /* the block's first row */
            switch (R) {
                C_PAIRS_R(1);
                C_PAIRS_R(2);
                C_PAIRS_R(3);
                C_PAIRS_R(4);
                C_PAIRS_R(5);
            default:
                switch (V) {
                    C_PAIRS_V(6, 1);
                    C_PAIRS_V(6, 2);
                    C_PAIRS_V(6, 3);
                default: c_pairs_block(Cb, cs, 6, 4, d0, Dp, nb, A, Y, np); break;
                }
            }
        }
    }
}

/* A tile's f32 rows [nk][BQ] -> bf16 [nk][BQ] (nearest even). */
static void to_bf16_rows(const float *src, int32_t nk, uint16_t *dst) {
    for (int32_t j = 0; j < nk; j++)
        for (int c = 0; c < 3; c++)
            _mm256_store_si256((__m256i *)(dst + (int64_t)j * BQ + 16 * c),
                               (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(src + (int64_t)j * BQ + 16 * c)));
}

static void bwd_uk_dkdv(const attn_problem *P, bwd_bufs *B, int32_t pa, int32_t nk, int nb, float *const *PT,
                        float *const *dST, const bwd_slot *const *S, const int32_t *n) {
    const bwd_ext *X = &B->ext;
    int64_t Dp = round16(P->d), Rs = bwd_rs(Dp);
    const uint32_t *Ap[2], *As[2], *Yo[2], *Yq[2];
    int32_t np[2];
    for (int b = 0; b < nb; b++) {
        uint16_t *ph = X->Ph + (int64_t)b * BK * BQ, *dsh = X->dSh + (int64_t)b * BK * BQ;
        to_bf16_rows(PT[b], nk, ph);
        to_bf16_rows(dST[b], nk, dsh);
        Ap[b] = (const uint32_t *)ph;
        As[b] = (const uint32_t *)dsh;
        Yo[b] = X->dOp + S[b]->c * (BQ / 2) * Dp;
        Yq[b] = X->Qp + S[b]->c * (BQ / 2) * Dp;
        np[b] = (n[b] + 1) / 2; /* the rows past n are zeros (and their P, dS are 0) */
    }
    c_pairs(B->dV + (int64_t)pa * Rs, Rs, nk, Dp, nb, Ap, Yo, np);
    c_pairs(B->dK + (int64_t)pa * Rs, Rs, nk, Dp, nb, As, Yq, np);
}

/* no state to set up around a thread's work */
static void bwd_uk_thread_begin(void) {}
static void bwd_uk_thread_end(void) {}

#ifndef MASKPACK_EMULATE_AMX
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected */

ATTN_BWD_NEVER_SELECTED(attn_avx512bf16)

#endif
