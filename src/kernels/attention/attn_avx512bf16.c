/* attn_avx512bf16.c: bf16 attention forward with AVX512-BF16 dot products (VDPBF16PS), the
 * fallback for CPUs that have AVX512-BF16 but no AMX: the forward framework (attn_fwd_kernel.inc:
 * query rows along the lanes, 48-row blocks, 64-key tiles starting at the segment's first key,
 * online softmax in f32) over this file's micro-kernels, whose products take pairs of bf16 per lane:
 *   S^T[j][i]  += Q[i][2p] K[j][2p] + Q[i][2p+1] K[j][2p+1]      (pairs of head dims)
 *   O^T[d][i]  += P[j][i] V[j][d] + P[j+1][i] V[j+1][d]           (pairs of keys, P rounded to bf16)
 * with f32 accumulation: twice the multiply-adds of an f32 FMA per instruction. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_avx512bf16_target.h" /* the AVX512-BF16 target region, BQ, BK, LOG2E */

#include "attn_avx512_common.h" /* with the row-vector vocabulary of attn_fwd_kernel.inc */
#include "attn_bf16_pairs.h"

/* Layouts (32-bit words = bf16 pairs, low half first):
 *   QT [Dh][BQ]              (Q[i][2p], Q[i][2p+1]) for row i      Dh = ceil(D/2)
 *   KP [n8/8][Dh][8]         (K[j][2p], K[j][2p+1]) for the 8 keys j of a group
 *   VP [n64/64][D8/8][32][8] (V[2t][d], V[2t+1][d]) for the key pairs t of a 64-key tile
 *   PP [BK/2][BQ]            (P[2t][i], P[2t+1][i]) */
typedef struct {
    uint32_t *QT, *KP, *VP, *PP;
    float *OT, *ST, *Yr, *tmp;
    int64_t seg, kh;
    float smul; /* the scores' scale (uk_pack_q's mul), applied as ST is stored */
} fwd_bufs;

static size_t uk_fwd_layout(const attn_problem *P, char *base, fwd_bufs *b) {
    int64_t D = P->d, Dh = (D + 1) / 2, D8 = round8(D), Dp = round16(D);
    int64_t n8 = round8(P->L->max_kv > 0 ? P->L->max_kv : 1), n64 = round64(n8);
    size_t off = 0;
#define TAKE(field, type, count)                                                                                       \
    do {                                                                                                               \
        if (b) b->field = (type *)(base + off);                                                                        \
        off += ((size_t)(count) * sizeof(type) + 63) & ~(size_t)63;                                                    \
    } while (0)
    TAKE(QT, uint32_t, Dh * BQ);
    TAKE(KP, uint32_t, n8 * Dh);
    TAKE(VP, uint32_t, n64 / 2 * D8);
    TAKE(PP, uint32_t, (BK / 2 + 8) * BQ);
    TAKE(OT, float, Dp *BQ);
    TAKE(ST, float, (BK + 16) * BQ);
    TAKE(Yr, float, BQ *Dp);
    TAKE(tmp, float, 2 * (Dp + 16));
#undef TAKE
    if (b) b->ST += 8 * BQ;
    return off;
}

static inline uint32_t bits16(float f) { /* f is a bf16 value widened: its top half is exact */
    uint32_t u;
    memcpy(&u, &f, 4);
    return u >> 16;
}

/* Packs keys [0, kv_len) of segment k, head kh (zeros outside [lo, hi) and in the padding). */
static void uk_pack_kv(const attn_problem *P, size_t k, int64_t kh, int64_t lo, int64_t hi, fwd_bufs *B) {
    const maskpack_segment *g = &P->L->segs[k];
    int64_t D = P->d, Dh = (D + 1) / 2, D8 = round8(D), n = g->kv_len, n8 = round8(n), n64 = round64(n);
    uint16_t *row = (uint16_t *)B->tmp;
    for (int64_t j = 0; j < n64; j++) {
        memset(row, 0, (size_t)(D8 + 2) * 2);
        if (j >= lo && j < hi && j < n) memcpy(row, attn_ptr(&P->k, g->row, g->kv_start + j, kh, 2), (size_t)D * 2);
        if (j < n8) {
            uint32_t *dst = B->KP + (j / 8) * Dh * 8 + (j % 8);
            for (int64_t p = 0; p < Dh; p++) dst[p * 8] = (uint32_t)row[2 * p] | ((uint32_t)row[2 * p + 1] << 16);
        }
        memset(row, 0, (size_t)(D8 + 2) * 2);
        if (j >= lo && j < hi && j < n) memcpy(row, attn_ptr(&P->v, g->row, g->kv_start + j, kh, 2), (size_t)D * 2);
        uint16_t *vp = (uint16_t *)(B->VP + (j / 64) * (D8 / 8) * 256 + ((j % 64) / 2) * 8) + (j & 1);
        for (int64_t d = 0; d < D8; d++) vp[((d / 8) * 256 + (d % 8)) * 2] = row[d];
    }
}

/* Q: rows widened to f32 (exact), then paired per lane, unscaled (mul goes to the scores). */
static void uk_pack_q(const attn_problem *P, const maskpack_segment *g, const attn_item *it, float mul, fwd_bufs *B) {
    int64_t D = P->d, Dh = (D + 1) / 2, Dp = round16(D);
    for (int32_t x = 0; x < BQ; x++) {
        float *y = B->Yr + x * Dp;
        memset(y, 0, (size_t)Dp * sizeof(float));
        if (x < it->n) attn_load_row(y, attn_ptr(&P->q, g->row, g->q_start + it->i0 + x, it->head, 2), 1, D);
        for (int64_t p = 0; p < Dh; p++) B->QT[p * BQ + x] = bits16(y[2 * p]) | (bits16(y[2 * p + 1]) << 16);
    }
    B->smul = mul;
}

/* ST rows for packed keys [j0, j1) times smul (whole groups of 8 computed, see st_packed in
 * attn_f32_kernel.inc). */
static void uk_qk_tile(const attn_problem *P, fwd_bufs *B, int32_t j0, int32_t j1, const attn_group_hull *H) {
    (void)H;
    st_pairs(B->QT, (P->d + 1) / 2, B->KP, j0, j1, B->ST, B->smul);
}

/* P = 2^(S - mu) rounded to bf16 and paired by keys into PP; the sum takes the rounded P, the
 * very values P.V multiplies (nk is even: the tiles are whole pairs). */
static inline void uk_exp_tile(fwd_bufs *B, int32_t nk, const vrow *mu, vrow *sum) {
    for (int32_t t = 0; t < nk / 2; t++) {
        const float *s = B->ST + 2 * t * BQ;
        for (int c = 0; c < 3; c++) {
            __m512 p0 = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s + 16 * c), mu[c]));
            __m512 p1 = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s + BQ + 16 * c), mu[c]));
            __m512i b0 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p0));
            __m512i b1 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p1));
            sum[c] = _mm512_add_ps(sum[c], _mm512_castsi512_ps(_mm512_slli_epi32(b0, 16)));
            sum[c] = _mm512_add_ps(sum[c], _mm512_castsi512_ps(_mm512_slli_epi32(b1, 16)));
            _mm512_store_si512(B->PP + (int64_t)t * BQ + 16 * c, _mm512_or_si512(b0, _mm512_slli_epi32(b1, 16)));
        }
    }
}

/* OT [D8][BQ] = OT * alpha + sum over the key pairs of [ja, ja + nk) (one 64-key tile of VP). */
static void uk_pv_tile(const attn_problem *P, fwd_bufs *B, int32_t ja, int32_t nk, const vrow *alpha,
                       const attn_group_hull *H) {
    (void)H;
    ot_pairs(B->OT, round8(P->d), B->VP, ja / 2, ja / 2 + nk / 2, B->PP, alpha);
}

/* Rows x < n of O times inv[x] to the (bf16) output rows. */
static void uk_store_out(const attn_problem *P, const maskpack_segment *g, const attn_item *it, fwd_bufs *B,
                         const float *inv) {
    int64_t Dp = round16(P->d);
    transpose_scaled(B->OT, BQ, B->Yr, Dp, Dp, BQ, 1.0f);
    for (int32_t x = 0; x < it->n; x++)
        attn_store_row(attn_ptr(&P->out, g->row, g->q_start + it->i0 + x, it->head, 2), 1, B->Yr + x * Dp, P->d,
                       inv[x]);
}

#define ATTN_FN(name)      attn_avx512bf16_##name
#define ATTN_FWD_KEY_PAIRS 1 /* the dot products take keys two by two */
#include "attn_fwd_vec.inc"
#include "attn_fwd_kernel.inc"

#ifndef MASKPACK_EMULATE_AMX
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected */

size_t attn_avx512bf16_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}
void attn_avx512bf16_fwd_thread(void *job, int tid) { attn_ref_fwd_thread(job, tid); }

#endif
