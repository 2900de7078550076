/* attn_amx_bwd.c: bf16 attention backward on AMX tiles (TDPBF16PS: 16 x 16 f32 accumulators, each
 * product a sum over 32 bf16 pairs of the reduction dimension), for CPUs with AMX-TILE and AMX-BF16.
 * The backward framework (attn_bwd_kernel.inc: the loop order, the claims, the recomputed softmax
 * and dS in f32, the reductions) with its five products on tiles, a block of BQ = 48 query rows
 * (3 column tiles of queries) against a tile of BK = 64 keys (4 row tiles of keys):
 *   S^T [keys][queries]  = K Q^T       A: K rows (32 head dims)   B: Q paired by head dims
 *   dP^T [keys][queries] = V dO^T      A: V rows                   B: dO paired by head dims
 *   dQ^T [d][queries]   += K^T dS^T    A: K^T rows (32 keys)       B: dS paired by keys
 *   dV [keys][d]        += P^T dO      A: P^T rows (32 queries)    B: dO paired by query rows
 *   dK [keys][d]        += dS^T Q      A: dS^T rows                B: Q paired by query rows
 * The numbers are those of the AVX512-BF16 backward (attn_avx512bf16_bwd.c): q, k, v, dO are bf16
 * already, so S and dP are exact products summed in f32; P and dS are computed in f32 and rounded
 * to bf16 (nearest even) only as operands of the last three products, as flash-attention's bf16
 * backward does on GPUs; dQ, dK, dV accumulate in f32 across every key tile and are rounded once
 * when stored. The sums run in another order (a tile's dK/dV terms are summed in a C tile, then
 * added to the accumulator), so the bits are this kernel's own (pinned by test_kernel_digest in
 * the emulated AMX build); tests/c/test_attention.c holds both to the same bound.
 *
 * Tiles: C tiles 0..3 are a 2 x 2 block of the result, A tiles 4, 5 its rows' operands, B tiles 6,
 * 7 its columns' operands: each loaded tile feeds two products. The operands are laid out so that
 * every tile is a strided 16-row load; the reduction dimension is zero-padded to whole K-steps of
 * 32 (head dims past D, query rows past the block's 48, keys past the tile), so padding adds exact
 * zeros. A tile's keys start at any packed key (tiles start at the segment's first key, like every
 * kernel here), which A tiles of K and V rows (and of K^T columns) read from any row or column;
 * rows of K^T past the tile's keys meet dS = 0 (finite keys, or the zeros past the group).
 * Only bf16 inputs run here: f32 runs the AVX-512 f32 backward. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_amx_target.h" /* the AMX target region, amx_tiles_on */

#define BQ    ATTN_BQ /* 48 query rows: 3 column tiles of S^T, dP^T and dQ^T */
#define BK    ATTN_BK /* 64 keys: 4 row tiles of S^T, dP^T, dK and dV */
#define LOG2E 1.4426950408889634
#define QP    32 /* query-row pairs per block in the dK/dV operands: 24 of data, 8 of zeros (2 K-steps) */
#define QC    64 /* query columns per block in the P^T, dS^T operands: 48 of data, 16 of zeros */

#include "attn_avx512_common.h"
#include "attn_avx512_uk.h"
#include "attn_bf16_pairs.h" /* pair_rows */

/* Layouts of the products' operands (bf16, or 32-bit words holding a bf16 pair, low half first):
 *   Kr, Vr [W + 64][D32] bf16        K, V rows (A of S^T, dP^T); rows past W are zeros
 *   KT [D16][KTs] bf16               K^T (A of dQ^T); KTs = round32(W) + 64, zeros past W and D
 *   QT, dOT [C][D32/2][BQ] words     (Y[i][2p], Y[i][2p+1]) per query row i (B of S^T, dP^T)
 *   Qp, dOp [C][QP][Dp] words        (Y[2p][d], Y[2p+1][d]) per column d (B of dK, dV)
 *   dSp [32][BQ] words               (dS[2t][i], dS[2t+1][i]) per query row (B of dQ^T)
 *   Ph, dSh [2][BK][QC] bf16         a tile's P^T and dS^T per key row (A of dV, dK)
 *   Ct [4][16][16] f32               a block of dK or dV before it is added to the accumulator */
typedef struct {
    uint16_t *Kr, *Vr, *KT, *Ph, *dSh;
    uint32_t *QT, *dOT, *Qp, *dOp, *dSp;
    float *Ct;
    int64_t KTs;
} bwd_ext;

#define ATTN_FN(name)         attn_amx_##name
#define ATTN_F32_NO_FORWARD   1
#define ATTN_BWD_OWN_PRODUCTS 1
#include "attn_f32_kernel.inc"
#include "attn_bwd_kernel.inc"

static inline int64_t r32(int64_t x) { return (x + 31) & ~(int64_t)31; }
static inline int64_t kt_stride(int64_t W) { return r32(W > 0 ? W : 1) + 64; }

static size_t bwd_uk_layout(const attn_problem *P, int64_t W, int64_t C, float *base, bwd_bufs *b) {
    int64_t D32 = r32(P->d), D16 = round16(P->d), Dp = round16(P->d), Wr = (W > 0 ? W : 1) + 64, KTs = kt_stride(W);
    size_t off = 0; /* in 4-byte words */
#define TAKE(field, type, words)                                                                                       \
    do {                                                                                                               \
        if (b) b->ext.field = (type *)(base + off);                                                                    \
        off += (size_t)round16((int64_t)(words));                                                                      \
    } while (0)
    TAKE(Kr, uint16_t, Wr * D32 / 2);
    TAKE(Vr, uint16_t, Wr * D32 / 2);
    TAKE(KT, uint16_t, D16 * KTs / 2);
    TAKE(QT, uint32_t, C * (D32 / 2) * BQ);
    TAKE(dOT, uint32_t, C * (D32 / 2) * BQ);
    TAKE(Qp, uint32_t, C * QP * Dp);
    TAKE(dOp, uint32_t, C * QP * Dp);
    TAKE(dSp, uint32_t, 32 * BQ);
    TAKE(Ph, uint16_t, 2 * BK * QC / 2);
    TAKE(dSh, uint16_t, 2 * BK * QC / 2);
    TAKE(Ct, float, 4 * 256);
#undef TAKE
    if (b) b->ext.KTs = KTs;
    return off;
}

/* Keys [0, W) of the group (key r = token kv_start + r) as K and V rows and as K^T; the padding
 * (rows past W, head dims past D, columns of K^T past W) is zeros. */
static void bwd_uk_pack_keys(const attn_problem *P, const attn_kgroup *G, int32_t kh, int64_t W, bwd_bufs *B) {
    const bwd_ext *X = &B->ext;
    int64_t D = P->d, D32 = r32(D), D16 = round16(D), Wr = (W > 0 ? W : 1) + 64, KTs = X->KTs;
    memset(X->Kr, 0, (size_t)(Wr * D32) * 2);
    memset(X->Vr, 0, (size_t)(Wr * D32) * 2);
    memset(X->KT, 0, (size_t)(D16 * KTs) * 2);
    for (int64_t j = 0; j < W; j++) {
        const uint16_t *k = (const uint16_t *)attn_ptr(&P->k, G->row, G->kv_start + j, kh, 2);
        memcpy(X->Kr + j * D32, k, (size_t)D * 2);
        memcpy(X->Vr + j * D32, attn_ptr(&P->v, G->row, G->kv_start + j, kh, 2), (size_t)D * 2);
        for (int64_t d = 0; d < D; d++) X->KT[d * KTs + j] = k[d];
    }
}

/* Rows [BQ][Rs] -> YT [D32/2][BQ] and Yp [QP][Dp] (pair_rows: pairs of head dims per row, pairs of
 * rows per column; the pairs past BQ / 2 are zeros). */
static void pair_rows_tiles(const float *Yr, int64_t Rs, int64_t D, int64_t Dp, uint32_t *YT, uint32_t *Yp) {
    pair_rows(Yr, Rs, D, r32(D) / 2, Dp, YT, Yp);
    memset(Yp + (BQ / 2) * Dp, 0, (size_t)((QP - BQ / 2) * Dp) * 4);
}

static void bwd_uk_prepare(const attn_problem *P, const bwd_slot *S, bwd_bufs *B) {
    const bwd_ext *X = &B->ext;
    int64_t D = P->d, Dh = r32(D) / 2, Dp = round16(D), Rs = bwd_rs(Dp);
    pair_rows_tiles(S->Qr, Rs, D, Dp, X->QT + S->c * Dh * BQ, X->Qp + S->c * QP * Dp);
    pair_rows_tiles(S->dOr, Rs, D, Dp, X->dOT + S->c * Dh * BQ, X->dOp + S->c * QP * Dp);
    /* every row of dQ^T the tiles load (the framework zeroes the first D8) */
    memset(S->dQT, 0, (size_t)(Dp * BQ) * sizeof(float));
}

/* ---- the tile block: C tiles 0..3 = (row r, column c) at 2 r + c, rows r < nr, columns c < nc ---- */

static inline void blk_zero(void) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

/* C tile (r, c) from / to c0 + r * rstep + c * cstep bytes, rows cs bytes apart. */
static inline void blk_load(int nr, int nc, const char *c0, int64_t cs, int64_t rstep, int64_t cstep) {
    _tile_loadd(0, c0, cs);
    if (nc == 2) _tile_loadd(1, c0 + cstep, cs);
    if (nr == 2) _tile_loadd(2, c0 + rstep, cs);
    if (nr == 2 && nc == 2) _tile_loadd(3, c0 + rstep + cstep, cs);
}

static inline void blk_store(int nr, int nc, char *c0, int64_t cs, int64_t rstep, int64_t cstep) {
    _tile_stored(0, c0, cs);
    if (nc == 2) _tile_stored(1, c0 + cstep, cs);
    if (nr == 2) _tile_stored(2, c0 + rstep, cs);
    if (nr == 2 && nc == 2) _tile_stored(3, c0 + rstep + cstep, cs);
}

/* C (r, c) += sum over K-steps k < nk of A_r(k) B_c(k): A_r(k) at a0 + r * ar + k * ak, rows as
 * bytes apart; B_c(k) at b0 + c * bc + k * bk, rows bs bytes apart (all in bytes). */
static inline void blk_steps(int nr, int nc, int nks, const char *a0, int64_t as, int64_t ar, int64_t ak,
                             const char *b0, int64_t bs, int64_t bc, int64_t bk) {
    for (int k = 0; k < nks; k++) {
        _tile_loadd(4, a0 + k * ak, as);
        if (nr == 2) _tile_loadd(5, a0 + ar + k * ak, as);
        _tile_loadd(6, b0 + k * bk, bs);
        if (nc == 2) _tile_loadd(7, b0 + bc + k * bk, bs);
        _tile_dpbf16ps(0, 4, 6);
        if (nc == 2) _tile_dpbf16ps(1, 4, 7);
        if (nr == 2) _tile_dpbf16ps(2, 5, 6);
        if (nr == 2 && nc == 2) _tile_dpbf16ps(3, 5, 7);
    }
}

/* ST [16 nkt][BQ] (rows BQ floats apart) = Y rows (A: rows of 32 head dims, D32 bf16 apart, from
 * key pa) x YT (B: [D32/2][BQ] pairs), over nkt row tiles of keys. */
static void st_tiles(const uint16_t *Yr, int64_t D32, int32_t pa, int nkt, const uint32_t *YT, float *ST) {
    const int nks = (int)(D32 / 32);
    for (int kt = 0; kt < nkt; kt += 2) {
        const int nr = nkt - kt < 2 ? 1 : 2;
        for (int qt = 0; qt < BQ / 16; qt += 2) {
            const int nc = BQ / 16 - qt < 2 ? 1 : 2;
            blk_zero();
            blk_steps(nr, nc, nks, (const char *)(Yr + ((int64_t)pa + 16 * kt) * D32), D32 * 2, 16 * D32 * 2, 64,
                      (const char *)(YT + 16 * qt), BQ * 4, 64, 16 * BQ * 4);
            blk_store(nr, nc, (char *)(ST + (int64_t)16 * kt * BQ + 16 * qt), BQ * 4, 16 * BQ * 4, 64);
        }
    }
}

static void bwd_uk_scores(const attn_problem *P, const bwd_slot *S, bwd_bufs *B, int32_t pa, int32_t nk, float *PT,
                          float *dST) {
    const bwd_ext *X = &B->ext;
    int64_t D32 = r32(P->d), Dh = D32 / 2;
    const int nkt = (nk + 15) / 16;
    st_tiles(X->Kr, D32, pa, nkt, X->QT + S->c * Dh * BQ, PT);
    st_tiles(X->Vr, D32, pa, nkt, X->dOT + S->c * Dh * BQ, dST);
}

/* 16 f32 -> 16 bf16 (nearest even) widened into the low halves of 16 words. */
static inline __m512i bf16_words(__m512 x) { return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)); }

static void bwd_uk_dq(const attn_problem *P, const bwd_slot *S, bwd_bufs *B, int32_t pa, int32_t nk, const float *dST) {
    const bwd_ext *X = &B->ext;
    const int64_t D16 = round16(P->d), KTs = X->KTs;
    /* dS paired by keys of the tile: pair t holds keys pa + 2t, pa + 2t + 1; keys past nk up to the
     * K-steps' end get dS = 0 */
    const int nks = (nk + 31) / 32;
    const __m512 zero = _mm512_setzero_ps();
    for (int32_t t = 0; t < 16 * nks; t++) {
        int32_t je = 2 * t, jo = je + 1;
        for (int c = 0; c < BQ / 16; c++) {
            __m512 e = je < nk ? _mm512_load_ps(dST + (int64_t)je * BQ + 16 * c) : zero;
            __m512 o = jo < nk ? _mm512_load_ps(dST + (int64_t)jo * BQ + 16 * c) : zero;
            _mm512_storeu_si512((void *)(X->dSp + (int64_t)t * BQ + 16 * c),
                                _mm512_or_si512(bf16_words(e), _mm512_slli_epi32(bf16_words(o), 16)));
        }
    }
    for (int64_t dt = 0; dt < D16 / 16; dt += 2) {
        const int nr = D16 / 16 - dt < 2 ? 1 : 2;
        for (int qt = 0; qt < BQ / 16; qt += 2) {
            const int nc = BQ / 16 - qt < 2 ? 1 : 2;
            char *c0 = (char *)(S->dQT + 16 * dt * BQ + 16 * qt);
            blk_load(nr, nc, c0, BQ * 4, 16 * BQ * 4, 64);
            blk_steps(nr, nc, nks, (const char *)(X->KT + 16 * dt * KTs + pa), KTs * 2, 16 * KTs * 2, 64,
                      (const char *)(X->dSp + 16 * qt), BQ * 4, 64, 16 * BQ * 4);
            blk_store(nr, nc, c0, BQ * 4, 16 * BQ * 4, 64);
        }
    }
}

/* A tile's f32 rows [nk][BQ] -> bf16 [16 nkt][QC] (nearest even): columns past BQ and rows past nk
 * are zeros. */
static void to_bf16_rows(const float *src, int32_t nk, int nkt, uint16_t *dst) {
    for (int32_t j = 0; j < 16 * nkt; j++) {
        uint16_t *d = dst + (int64_t)j * QC;
        for (int c = 0; c < BQ / 16; c++) {
            __m256i v = j < nk ? (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(src + (int64_t)j * BQ + 16 * c))
                               : _mm256_setzero_si256();
            _mm256_storeu_si256((__m256i *)(d + 16 * c), v);
        }
        for (int c = BQ / 16; c < QC / 16; c++) _mm256_storeu_si256((__m256i *)(d + 16 * c), _mm256_setzero_si256());
    }
}

/* Acc rows [nk][Rs] (from the tile's first key) += sum over the blocks b < nb of A_b^T Y_b: A_b the
 * bf16 rows [16 nkt][QC] of a key's query weights, Y_b [QP][Dp] pairs of query rows; K-steps of 32
 * rows, only those holding some of the block's n[b] rows. Each 2 x 2 block of C tiles is summed
 * from zero over every block's K-steps, then added to the accumulator's rows below nk. */
static void kd_tiles(float *Acc, int64_t Rs, int32_t nk, int nkt, int64_t Dp, int nb, const uint16_t *const *A,
                     const uint32_t *const *Y, const int32_t *n, float *Ct) {
    for (int kt = 0; kt < nkt; kt += 2) {
        const int nr = nkt - kt < 2 ? 1 : 2;
        for (int64_t dt = 0; dt < Dp / 16; dt += 2) {
            const int nc = Dp / 16 - dt < 2 ? 1 : 2;
            blk_zero();
            for (int b = 0; b < nb; b++)
                blk_steps(nr, nc, (n[b] + 31) / 32, (const char *)(A[b] + (int64_t)16 * kt * QC), QC * 2, 16 * QC * 2,
                          64, (const char *)(Y[b] + 16 * dt), Dp * 4, 64, 16 * Dp * 4);
            /* Ct holds tile (r, c) at (2 r + c) * 256 floats, rows 16 floats apart */
            blk_store(nr, nc, (char *)Ct, 64, 2 * 256 * 4, 256 * 4);
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++) {
                    const float *t = Ct + (2 * r + c) * 256;
                    int32_t j0 = 16 * (kt + r), rows = nk - j0 < 16 ? nk - j0 : 16;
                    for (int32_t x = 0; x < rows; x++) {
                        float *a = Acc + (int64_t)(j0 + x) * Rs + 16 * (dt + c);
                        _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(t + 16 * x)));
                    }
                }
        }
    }
}

static void bwd_uk_dkdv(const attn_problem *P, bwd_bufs *B, int32_t pa, int32_t nk, int nb, float *const *PT,
                        float *const *dST, const bwd_slot *const *S, const int32_t *n) {
    const bwd_ext *X = &B->ext;
    int64_t Dp = round16(P->d), Rs = bwd_rs(Dp);
    const int nkt = (nk + 15) / 16;
    const uint16_t *Ap[2], *As[2];
    const uint32_t *Yo[2], *Yq[2];
    for (int b = 0; b < nb; b++) {
        uint16_t *ph = X->Ph + (int64_t)b * BK * QC, *dsh = X->dSh + (int64_t)b * BK * QC;
        to_bf16_rows(PT[b], nk, nkt, ph);
        to_bf16_rows(dST[b], nk, nkt, dsh);
        Ap[b] = ph;
        As[b] = dsh;
        Yo[b] = X->dOp + S[b]->c * QP * Dp;
        Yq[b] = X->Qp + S[b]->c * QP * Dp;
    }
    kd_tiles(B->dV + (int64_t)pa * Rs, Rs, nk, nkt, Dp, nb, Ap, Yo, n, X->Ct);
    kd_tiles(B->dK + (int64_t)pa * Rs, Rs, nk, nkt, Dp, nb, As, Yq, n, X->Ct);
}

/* the tiles' configuration, for a thread's share of the work */
static void bwd_uk_thread_begin(void) { amx_tiles_on(); }
static void bwd_uk_thread_end(void) { _tile_release(); }

#ifndef MASKPACK_EMULATE_AMX
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected */

ATTN_BWD_NEVER_SELECTED(attn_amx)

#endif
