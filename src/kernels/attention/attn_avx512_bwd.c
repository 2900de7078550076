/* attn_avx512_bwd.c: AVX-512 f32 attention backward (flash-attention 2: the tiles are recomputed
 * from q, k and the forward's log-sum-exp; dQ, dK, dV accumulate in f32). Query rows run along the
 * vector lanes as in the forward (attn_avx512.c), whose tile kernels it shares (attn_avx512_tiles.h):
 *   dV[j][:]  += sum_i P^T[j][i] * dO[i][:]         (broadcast P^T, vector loads of dO rows)
 *   dK[j][:]  += sum_i dS^T[j][i] * Q[i][:]
 *   dQ^T[d][i] += sum_j K[j][d] * dS^T[j][i]
 * Compiled for AVX-512 with a target pragma; chosen at run time only when the CPU has it. */
#include "attn_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(ATTN_AVX2_BUILD) /* the entry points of the AVX2 build (see below) */
#define attn_avx512_bwd_ws attn_avx2_bwd_ws
#define attn_avx512_bwd_thread attn_avx2_bwd_thread
#define attn_avx512_bwd_reduce attn_avx2_bwd_reduce
#define attn_avx512_bwd_tail_bytes attn_avx2_bwd_tail_bytes
#define attn_avx512_bwd_tail_reduce attn_avx2_bwd_tail_reduce
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_f32_target.h" /* the AVX-512 or (ATTN_AVX2_BUILD) AVX2 target region, BQ, BK */

#include "attn_avx512_common.h"
#include "attn_avx512_tiles.h"


/* ---- backward ----------------------------------------------------------------------------------- */

/* Loop order. A unit's keys (up to the whole sequence) do not fit in L2 in the five forms the
 * backward touches per key (K twice packed, V packed, the dK and dV accumulators: 2.5 KB per key at
 * D = 128), so sweeping every key for each query block streamed them all from L3. Instead the query
 * blocks of one (segment, head) are taken in chunks of up to BWD_QCH blocks, each block's Q and dO
 * packed once into the chunk's slots, and the keys are walked in super-blocks of BWD_KB keys
 * (segment-local, a multiple of the tile width): every block of the chunk runs its tiles inside
 * the super-block while that slice of K, V, dK, dV stays in L2, then the next super-block.
 * This only regroups the same tile steps: each block still meets its tiles in increasing order
 * (dQ sums in the same order) and each key still receives its dK/dV terms in the order (segment,
 * head, block), because one key lies in exactly one super-block of a segment. So the results are
 * bitwise those of the plain block-by-block sweep, whatever the chunk and super-block sizes.
 * The chunk is one pair of blocks (what bwd_tiles takes at once): a pair's Q, dO (both forms) and dQ
 * (250 KB at D = 128) then stay in L2 while the keys stream past in their packed, sequential forms,
 * whereas a chunk of 16 blocks (2 MB of them) plus a super-block's keys overflowed the 2 MB L2 and
 * came back from L3 for every super-block. Measured at S = 2048, D = 128, 2 threads, 16 to 20
 * alternated pairs each against 16 blocks per chunk (shared, busy machine): 1.7-4.4% faster with
 * no mask, 1.8% causal, 1.9% on 16 packed causal documents; 4 blocks per chunk was in between and
 * 32 was 5% slower. */
#ifndef BWD_KB /* (overridable when tuning) */
#define BWD_KB 256 /* keys per super-block: 640 KB of K/V/dK/dV at D = 128 */
#endif
#ifndef BWD_QCH
#define BWD_QCH 2 /* query blocks per chunk */
#endif

/* Row stride of the row-major Q, dO and the dK, dV accumulators: 16 floats past Dp, so that rows
 * Dp = 128 apart (512 bytes) do not all fall into the same few L1 sets (the dK/dV kernel walks 6 rows
 * of each at once). */
static inline int64_t bwd_rs(int64_t Dp) { return Dp + 16; }

/* Per-thread buffers: dK, dV accumulators [W][Rs] of the unit's key range; the unit's packed keys
 * (K in both forms, V in KP form); per chunk slot: the block's Q and dO in both forms, its dQ
 * accumulator, D_i, lse and rows; the tile buffers. */
typedef struct {
    float *dK, *dV;
    float *KPk, *VPk, *KPv; /* [W8 * D], [D8 * W64], [W8 * D] */
    float *QT, *dOT, *dQT;  /* [QCH][Dp][BQ] */
    float *Qr, *dOr;        /* [QCH][BQ][Rs] */
    float *dl, *ls;         /* [QCH][BQ]: D_i and lse (log2 units) */
    attn_rows *rows;        /* [QCH] */
    float *Or;              /* [BQ][Dp] */
    float *PT, *dST;        /* [BK + 16][BQ], 8 spare rows each side (PT2, dST2: the second block's) */
    float *PT2, *dST2;
    float *tmp, *tmp2;      /* [Dp + 16] */
    int64_t packed_unit;    /* the unit whose keys KPk/VPk/KPv hold (-1: none) */
} bwd_bufs;

static int64_t bwd_chunk_blocks(const attn_problem *P) {
    int64_t nb = (P->L->max_q + BQ - 1) / BQ;
    return nb < 1 ? 1 : nb < BWD_QCH ? nb : BWD_QCH;
}

static size_t bwd_layout(const attn_problem *P, int64_t W, float *base, bwd_bufs *b) {
    int64_t D = P->d, Dp = round16(D), D8 = round8(D), W8 = round8(W > 0 ? W : 1), C = bwd_chunk_blocks(P),
            Rs = bwd_rs(Dp);
    size_t off = 0;
#define TAKE(field, count)                        \
    do {                                          \
        if (b) b->field = base + off;             \
        off += (size_t)round16((int64_t)(count)); \
    } while (0)
    TAKE(dK, W * Rs);
    TAKE(dV, W * Rs);
    TAKE(KPk, W8 * D);
    TAKE(VPk, round64(W8) * D8);
    TAKE(KPv, W8 * D);
    TAKE(QT, C * Dp * BQ);
    TAKE(dOT, C * Dp * BQ);
    TAKE(dQT, C * Dp * BQ);
    TAKE(Qr, C * BQ * Rs);
    TAKE(dOr, C * BQ * Rs);
    TAKE(dl, C * BQ);
    TAKE(ls, C * BQ);
    if (b) b->rows = (attn_rows *)(base + off);
    off += (size_t)round16((int64_t)((C * (int64_t)sizeof(attn_rows) + 3) / 4));
    TAKE(Or, BQ * Dp);
    TAKE(PT, (BK + 16) * BQ);
    TAKE(dST, (BK + 16) * BQ);
    TAKE(PT2, (BK + 16) * BQ);
    TAKE(dST2, (BK + 16) * BQ);
    TAKE(tmp, 17 * (Dp + 16));
    TAKE(tmp2, Dp + 16);
#undef TAKE
    if (b) {
        b->PT += 8 * BQ;
        b->dST += 8 * BQ;
        b->PT2 += 8 * BQ;
        b->dST2 += 8 * BQ;
    }
    return off * sizeof(float);
}

size_t attn_avx512_bwd_ws(const attn_problem *P, int64_t max_group_width) {
    return bwd_layout(P, max_group_width, NULL, NULL) + 64;
}

/* attn_store_row with the f32 case in vectors (the same products). */
static void store_row(void *dst, int bf16, const float *src, int64_t n, float mul) {
    if (bf16) {
        attn_store_row(dst, bf16, src, n, mul);
        return;
    }
    float *o = dst;
    __m512 m = _mm512_set1_ps(mul);
    int64_t x = 0;
    for (; x + 16 <= n; x += 16) _mm512_storeu_ps(o + x, _mm512_mul_ps(_mm512_loadu_ps(src + x), m));
    if (x < n) {
        __mmask16 k = (__mmask16)((1u << (n - x)) - 1);
        _mm512_mask_storeu_ps(o + x, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + x), m));
    }
}

/* sum_d a[d] * b[d] in double (the products are exact), 16 lanes wide: the row's D_i. */
static float dot_f64(const float *a, const float *b, int64_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t d = 0; d < n; d += 16) {
        __mmask16 k = n - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - d)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, a + d), y = _mm512_maskz_loadu_ps(k, b + d);
        s0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y)), s0);
        s1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)),
                             s1);
    }
    return (float)_mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* One query block's state in chunk slot c. */
typedef struct {
    float *QT, *dOT, *dQT, *Qr, *dOr, *dl, *ls;
    attn_rows *rows;
} bwd_slot;

static bwd_slot slot_of(const bwd_bufs *B, int64_t Dp, int64_t c) {
    int64_t Rs = bwd_rs(Dp);
    bwd_slot s = {B->QT + c * Dp * BQ, B->dOT + c * Dp * BQ, B->dQT + c * Dp * BQ, B->Qr + c * BQ * Rs,
                  B->dOr + c * BQ * Rs, B->dl + c * BQ, B->ls + c * BQ, B->rows + c};
    return s;
}

/* Packs Q and dO of rows [i0, i0 + n) of segment k, head h, into slot S; D_i = dO_i . O_i and lse in
 * log2 units (+inf for rows outside the block or seeing nothing, so their P is exactly 0); dQ = 0. */
static void bwd_prepare(const attn_problem *P, size_t k, int32_t h, int64_t i0, int32_t n, const bwd_slot *S,
                        bwd_bufs *B) {
    const maskpack_segment *g = &P->L->segs[k];
    int64_t D = P->d, Dp = round16(D), D8 = round8(D);
    attn_block_rows(P->L, k, i0, n, S->rows);
    if (!P->bf16 && D % 16 == 0) {
        memset(B->tmp2, 0, (size_t)D * sizeof(float)); /* the zero row for rows past n */
        pack_rows_direct(P, &P->q, g, h, i0, n, 1.0f, S->QT, B->tmp2, S->Qr, bwd_rs(Dp));
        pack_rows_direct(P, &P->dout, g, h, i0, n, 1.0f, S->dOT, B->tmp2, S->dOr, bwd_rs(Dp));
    } else {
        pack_rows(P, &P->q, g, h, i0, n, 1.0f, S->QT, S->Qr, Dp, bwd_rs(Dp));
        pack_rows(P, &P->dout, g, h, i0, n, 1.0f, S->dOT, S->dOr, Dp, bwd_rs(Dp));
    }
    memset(S->dQT, 0, (size_t)(D8 * BQ) * sizeof(float));
    for (int32_t x = 0; x < BQ; x++) {
        S->dl[x] = 0;
        S->ls[x] = INFINITY;
        if (x >= n) continue;
        float lse = *(const float *)attn_ptr(&P->lse, g->row, g->q_start + i0 + x, h, 4);
        const void *orow = attn_ptr(&P->out, g->row, g->q_start + i0 + x, h, P->esize);
        const float *o = orow;
        if (P->bf16) {
            attn_load_row(B->tmp2, orow, 1, D);
            o = B->tmp2;
        }
        S->dl[x] = dot_f64(S->dOr + x * bwd_rs(Dp), o, D);
        if (lse > -INFINITY) S->ls[x] = (float)(lse * LOG2E);
    }
}

/* C [nk][Dp] += A0 x Y0 (n0 rows) then += A1 x Y1 (n1 rows): c_kernel of two query blocks with
 * the accumulators kept in registers between them (the same sums in the same order as two calls,
 * with half the accumulator traffic). */
static inline __attribute__((always_inline)) void c_block2(float *C, int64_t cs, const float *A0, const float *Y0,
                                                           int32_t n0, const float *A1, const float *Y1, int32_t n1,
                                                           int64_t ys, const int JB, const int CW) {
    __m512 acc[8][8];
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < CW; c++) acc[r][c] = _mm512_load_ps(C + r * cs + c * 16);
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < CW; c++) _mm_prefetch((const char *)(C + (JB + r) * cs + c * 16), _MM_HINT_T0);
    for (int half = 0; half < 2; half++) {
        const float *A = half ? A1 : A0, *Y = half ? Y1 : Y0;
        int32_t nr = half ? n1 : n0;
        for (int32_t x = 0; x < nr; x++) {
            __m512 y[8];
            for (int c = 0; c < CW; c++) y[c] = _mm512_load_ps(Y + x * ys + c * 16);
            for (int r = 0; r < JB; r++) {
                __m512 a = _mm512_set1_ps(A[r * BQ + x]);
                for (int c = 0; c < CW; c++) acc[r][c] = _mm512_fmadd_ps(a, y[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < JB; r++)
        for (int c = 0; c < CW; c++) _mm512_store_ps(C + r * cs + c * 16, acc[r][c]);
}

/* Blocks of 6 rows x 4 vectors: 24 accumulators + 4 row vectors of Y stay in registers and the 6
 * values of A are broadcast from memory, 10 loads per 24 FMAs (a wider 3 x 8 block leaves no
 * register for Y and needs 27). */
static void c_kernel2(float *C, int64_t cs, const float *A0, const float *Y0, int32_t n0, const float *A1,
                      const float *Y1, int32_t n1, int64_t ys, int64_t Dp, int32_t nk) {
    int64_t nv = Dp / 16, c = 0;
#define CB2(JB, CW) c_block2(C + j * cs + c * 16, cs, A0 + j * BQ, Y0 + c * 16, n0, A1 + j * BQ, Y1 + c * 16, n1, ys, JB, CW)
#if defined(ATTN_AVX2_BUILD)
    /* AVX2 (16 ymm): blocks of 3 rows x 2 vectors of 16 columns = 12 ymm accumulators + 4 of Y
     * (one folded into the FMAs by the compiler) + the broadcast: 7 loads per 12 FMAs, and A (both
     * blocks' P^T or dS^T, 24 KB) is swept once per 32 columns instead of per 16 (paired A/B at
     * S = 2048, D = 128: backward 1.06x faster than 6 rows x 1 vector); an odd last vector of
     * columns takes 6 rows x 1. The sums per element are the same, in the same order, as the
     * AVX-512 blocking's. */
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
#else
    for (; c + 4 <= nv; c += 4) {
        int32_t j = 0;
        for (; j + 6 <= nk; j += 6) CB2(6, 4);
        switch (nk - j) {
        case 5: CB2(5, 4); break;
        case 4: CB2(4, 4); break;
        case 3: CB2(3, 4); break;
        case 2: CB2(2, 4); break;
        case 1: CB2(1, 4); break;
        default: break;
        }
    }
    for (; c < nv; c++) {
        int32_t j = 0;
        for (; j + 8 <= nk; j += 8) CB2(8, 1);
        for (; j < nk; j++) CB2(1, 1);
    }
#endif
#undef CB2
}

/* C [nk][Dp] += A [nk][BQ] x Y [nr][Dp] (Dp a multiple of 16, rows of C cs and of Y ys apart): one
 * query block, c_kernel2 with an empty second block. */
static void c_kernel(float *C, int64_t cs, const float *A, const float *Y, int64_t ys, int64_t Dp, int32_t nk,
                     int32_t nr) {
    c_kernel2(C, cs, A, Y, nr, A, Y, 0, ys, Dp, nk);
}

/* One query block's per-tile state in bwd_tiles. */
typedef struct {
    const bwd_slot *S;
    int32_t n, start, end;
    __m512 dl[3], ls[3];
    lane_rule R;
    float *PT, *dST;
    int cls;
    int32_t ja, jb;
} bwd_blk;

/* The tiles of one or two query blocks (slots S[0..nb), valid rows n[]) inside segment-local keys
 * [klo, khi) (tile aligned), in increasing order; the segment's keys start koff into the unit's
 * packed range. With two blocks, each tile is done for the first block, then the second (what two
 * calls with one block each would do to every key's dK/dV, and each block's dQ sees its tiles in
 * order); when both see the same keys of a tile their dK/dV products run as one kernel. */
static void bwd_tiles(const attn_problem *P, size_t k, const int32_t *n, int64_t koff, const bwd_slot *S, int nb,
                      int32_t klo, int32_t khi, bwd_bufs *B) {
    const maskpack_segment *g = &P->L->segs[k];
    int64_t D = P->d, Dp = round16(D), D8 = round8(D), Rs = bwd_rs(Dp);
    bwd_blk bl[2];
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (int b = 0; b < nb; b++) {
        bwd_blk *X = &bl[b];
        const attn_rows *rows = S[b].rows;
        X->S = &S[b];
        X->n = n[b];
        X->start = (rows->kmin / BK) * BK;
        X->end = rows->kmax < khi ? rows->kmax : khi;
        if (X->start < klo) X->start = klo;
        for (int c = 0; c < 3; c++) {
            X->dl[c] = _mm512_loadu_ps(S[b].dl + 16 * c);
            X->ls[c] = _mm512_loadu_ps(S[b].ls + 16 * c);
        }
        lane_rule_init(&X->R, rows);
        X->PT = b ? B->PT2 : B->PT;
        X->dST = b ? B->dST2 : B->dST;
        if (X->start < X->end) {
            if (X->start < lo) lo = X->start;
            if (X->end > hi) hi = X->end;
        }
    }
    if (lo >= hi) return;
    int cap = P->softcap > 0;
    const __m512 sc = _mm512_set1_ps((float)(cap ? P->scale / P->softcap : P->scale * LOG2E));
    const __m512 capmul = _mm512_set1_ps((float)(P->softcap * LOG2E));
    const __m512 ones = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    const __m512 one3[3] = {ones, ones, ones};
    for (int32_t j0 = lo; j0 < hi; j0 += BK) {
        int32_t j1 = j0 + BK < g->kv_len ? j0 + BK : (int32_t)g->kv_len;
        for (int b = 0; b < nb; b++) {
            bwd_blk *X = &bl[b];
            const attn_rows *rows = X->S->rows;
            X->cls = ATTN_TILE_EMPTY;
            if (j0 < X->start || j0 >= X->end) continue;
            X->cls = attn_classify(rows, j0, j1, &X->ja, &X->jb);
            if (X->cls == ATTN_TILE_EMPTY) continue;
            int32_t ja = X->ja, nk = X->jb - X->ja, pa = (int32_t)koff + ja;
            st_packed(X->S->QT, D, B->KPk, pa, pa + nk, X->PT);
            st_packed(X->S->dOT, D, B->KPv, pa, pa + nk, X->dST);
            for (int32_t j = 0; j < nk; j++) {
                float *pp = X->PT + j * BQ, *dd = X->dST + j * BQ;
                for (int c = 0; c < 3; c++) {
                    __m512 x = _mm512_mul_ps(_mm512_load_ps(pp + 16 * c), sc), dcap = ones;
                    if (cap) {
                        __m512 t = tanh_ps(x);
                        x = _mm512_mul_ps(t, capmul);
                        dcap = _mm512_fnmadd_ps(t, t, ones); /* d(cap*tanh(s/cap))/ds = 1 - tanh^2 */
                    }
                    __m512 p = exp2_ps(_mm512_sub_ps(x, X->ls[c]));
                    if (X->cls == ATTN_TILE_PARTIAL)
                        p = lane_blend(rows->simple ? lane_allowed_simple(&X->R, c, _mm512_set1_epi32(ja + j))
                                                    : lane_allowed(&X->R, c, ja + j),
                                       zero, p);
                    __m512 ds = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_load_ps(dd + 16 * c), X->dl[c]));
                    if (cap) ds = _mm512_mul_ps(ds, dcap);
                    _mm512_store_ps(pp + 16 * c, p);
                    _mm512_store_ps(dd + 16 * c, ds);
                }
            }
            ot_packed(X->S->dQT, D8, B->VPk, pa, nk, X->dST, one3);
        }
        if (nb == 2 && bl[0].cls != ATTN_TILE_EMPTY && bl[1].cls != ATTN_TILE_EMPTY && bl[0].ja == bl[1].ja &&
            bl[0].jb == bl[1].jb) {
            int32_t nk = bl[0].jb - bl[0].ja, pa = (int32_t)koff + bl[0].ja;
            c_kernel2(B->dV + (int64_t)pa * Rs, Rs, bl[0].PT, bl[0].S->dOr, bl[0].n, bl[1].PT, bl[1].S->dOr, bl[1].n, Rs,
                      Dp, nk);
            c_kernel2(B->dK + (int64_t)pa * Rs, Rs, bl[0].dST, bl[0].S->Qr, bl[0].n, bl[1].dST, bl[1].S->Qr, bl[1].n,
                      Rs, Dp, nk);
        } else {
            for (int b = 0; b < nb; b++) {
                bwd_blk *X = &bl[b];
                if (X->cls == ATTN_TILE_EMPTY) continue;
                int32_t nk = X->jb - X->ja, pa = (int32_t)koff + X->ja;
                c_kernel(B->dV + (int64_t)pa * Rs, Rs, X->PT, X->S->dOr, Rs, Dp, nk, X->n);
                c_kernel(B->dK + (int64_t)pa * Rs, Rs, X->dST, X->S->Qr, Rs, Dp, nk, X->n);
            }
        }
    }
}

/* The number of query blocks of unit u (what bwd_unit counts idx over). */
static int64_t unit_blocks(const attn_bwd_job *job, int64_t u) {
    const attn_problem *P = job->P;
    const attn_kgroup *G = &job->groups[u / P->hkv];
    int64_t nb = 0;
    for (size_t s = G->seg_begin; s < G->seg_end; s++) nb += (P->L->segs[job->perm[s]].q_len + BQ - 1) / BQ;
    return nb * P->group;
}

/* One unit (group, key head): part `part` of `nparts` of its query blocks [blo, bhi) (block number
 * idx, counted over the unit's segments, heads and blocks in that order, goes to part idx % nparts),
 * accumulating dk/dv in B->dK/dV (zeroed first); with write = 1 they are stored to dk/dv at the end.
 * The unit's keys are packed unless B holds them already. */
static void bwd_unit(const attn_bwd_job *job, int64_t u, bwd_bufs *B, int part, int nparts, int64_t blo, int64_t bhi,
                     int write) {
    const attn_problem *P = job->P;
    const maskpack_layout *L = P->L;
    const attn_kgroup *G = &job->groups[u / P->hkv];
    int32_t kh = (int32_t)(u % P->hkv);
    int64_t D = P->d, Dp = round16(D), Rs = bwd_rs(Dp), W = G->kv_end - G->kv_start, C = bwd_chunk_blocks(P);
    memset(B->dK, 0, (size_t)(W * Rs) * sizeof(float));
    memset(B->dV, 0, (size_t)(W * Rs) * sizeof(float));
    if (blo >= bhi) return;
    if (B->packed_unit != u) {
        pack_keys(P, &P->k, G->row, G->kv_start, W, kh, 0, W, B->KPk, B->VPk, B->tmp);
        pack_keys(P, &P->v, G->row, G->kv_start, W, kh, 0, W, B->KPv, NULL, B->tmp);
        B->packed_unit = u;
    }
    int64_t idx = 0;
    float sc_rows[BQ];
    for (int x = 0; x < BQ; x++) sc_rows[x] = (float)P->scale;
    for (size_t s = G->seg_begin; s < G->seg_end; s++) {
        size_t k = job->perm[s];
        const maskpack_segment *g = &L->segs[k];
        int64_t koff = g->kv_start - G->kv_start, nblk = (g->q_len + BQ - 1) / BQ;
        for (int32_t h = kh * (int32_t)P->group; h < (kh + 1) * (int32_t)P->group; h++, idx += nblk)
            for (int64_t b0 = 0; b0 < nblk; b0 += C * nparts) {
                /* this part's blocks of [b0, b0 + C * nparts): at most C (one in nparts), so that a
                 * part of a split unit still pairs its blocks */
                int64_t mine[BWD_QCH], nm = 0;
                for (int64_t b = b0; b < nblk && b < b0 + C * nparts; b++)
                    if ((idx + b) % nparts == part && idx + b >= blo && idx + b < bhi) mine[nm++] = b;
                if (nm == 0) continue;
                for (int64_t c = 0; c < nm; c++) {
                    bwd_slot S = slot_of(B, Dp, c);
                    int64_t i0 = mine[c] * BQ;
                    bwd_prepare(P, k, h, i0, (int32_t)(g->q_len - i0 < BQ ? g->q_len - i0 : BQ), &S, B);
                }
                for (int64_t k0 = 0; k0 < g->kv_len; k0 += BWD_KB)
                    for (int64_t c = 0; c < nm; c += 2) { /* blocks two by two */
                        int nb = c + 1 < nm ? 2 : 1;
                        bwd_slot S[2];
                        int32_t n[2];
                        for (int x = 0; x < nb; x++) {
                            S[x] = slot_of(B, Dp, c + x);
                            int64_t i0 = mine[c + x] * BQ;
                            n[x] = (int32_t)(g->q_len - i0 < BQ ? g->q_len - i0 : BQ);
                        }
                        bwd_tiles(P, k, n, koff, S, nb, (int32_t)k0, (int32_t)(k0 + BWD_KB), B);
                    }
                for (int64_t c = 0; c < nm; c++) {
                    bwd_slot S = slot_of(B, Dp, c);
                    int64_t i0 = mine[c] * BQ;
                    int32_t n = (int32_t)(g->q_len - i0 < BQ ? g->q_len - i0 : BQ);
                    if (!P->bf16 && D % 16 == 0)
                        unpack_rows_direct(P, &P->dq, g, h, i0, n, S.dQT, sc_rows);
                    else
                        unpack_rows(P, &P->dq, g, h, i0, n, S.dQT, B->Or, Dp, sc_rows);
                }
            }
    }
    if (!write) return;
    float scale = (float)P->scale;
    for (int64_t c = 0; c < W; c++) {
        store_row(attn_ptr(&P->dk, G->row, G->kv_start + c, kh, P->esize), P->bf16, B->dK + c * Rs, D, scale);
        store_row(attn_ptr(&P->dv, G->row, G->kv_start + c, kh, P->esize), P->bf16, B->dV + c * Rs, D, 1.0f);
    }
}

static void bufs_of(const attn_bwd_job *job, int tid, bwd_bufs *B) {
    const attn_problem *P = job->P;
    int64_t W = 0;
    for (size_t g = 0; g < job->n_groups; g++)
        if (job->groups[g].kv_end - job->groups[g].kv_start > W) W = job->groups[g].kv_end - job->groups[g].kv_start;
    float *base = (float *)(job->ws + (size_t)tid * job->ws_stride);
    bwd_layout(P, W, base, B);
    B->packed_unit = -1;
}

/* Query blocks [*blo, *bhi) of piece c of tail unit u: pieces of a quarter of its blocks, but at
 * least a chunk's worth (a piece sweeps the unit's keys once per chunk, so a smaller one would
 * add sweeps); later pieces may be empty. */
static void tail_piece(const attn_bwd_job *job, int64_t u, int64_t c, int64_t *blo, int64_t *bhi) {
    int64_t nb = unit_blocks(job, u), per = (nb + ATTN_BWD_TAIL_CHUNKS - 1) / ATTN_BWD_TAIL_CHUNKS;
    if (per < bwd_chunk_blocks(job->P)) per = bwd_chunk_blocks(job->P);
    *blo = c * per < nb ? c * per : nb;
    *bhi = (c + 1) * per < nb ? (c + 1) * per : nb;
}

/* Tail unit t's piece c: its dK partial (the dV partial follows it). */
static float *tail_partial(const attn_bwd_job *job, int64_t t, int64_t c) {
    size_t one = (size_t)(job->max_width * bwd_rs(round16(job->P->d)));
    return job->tail_acc + ((size_t)t * ATTN_BWD_TAIL_CHUNKS + (size_t)c) * 2 * one;
}

size_t attn_avx512_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail) {
    return (size_t)n_tail * ATTN_BWD_TAIL_CHUNKS * 2 * (size_t)(max_width * bwd_rs(round16(P->d))) * sizeof(float);
}

void attn_avx512_bwd_thread(void *vjob, int tid) {
    attn_bwd_job *job = vjob;
    bwd_bufs B;
    bufs_of(job, tid, &B);
    if (job->split) {
        bwd_unit(job, job->unit, &B, tid, job->n_threads, 0, INT64_MAX, 0);
        return;
    }
    _Atomic int64_t *next = job->next;
    float *own_dK = B.dK, *own_dV = B.dV;
    for (;;) {
        int64_t x = atomic_fetch_add(next, 1);
        if (x < job->n_whole) {
            B.dK = own_dK;
            B.dV = own_dV;
            bwd_unit(job, x, &B, 0, 1, 0, INT64_MAX, 1);
            continue;
        }
        /* the tail: piece c of unit u into its own partial */
        int64_t t = (x - job->n_whole) / ATTN_BWD_TAIL_CHUNKS, c = (x - job->n_whole) % ATTN_BWD_TAIL_CHUNKS;
        int64_t u = job->n_whole + t;
        if (u >= job->n_units) break;
        int64_t blo, bhi;
        tail_piece(job, u, c, &blo, &bhi);
        if (blo >= bhi && c > 0) continue; /* an empty piece: left out of the sum (piece 0 is zeroed) */
        B.dK = tail_partial(job, t, c);
        B.dV = B.dK + job->max_width * bwd_rs(round16(job->P->d));
        bwd_unit(job, u, &B, 0, 1, blo, bhi, 0);
    }
}

void attn_avx512_bwd_tail_reduce(void *vjob, int tid) {
    const attn_bwd_job *job = vjob;
    const attn_problem *P = job->P;
    int64_t D = P->d, Rs = bwd_rs(round16(D)), one = job->max_width * Rs;
    float scale = (float)P->scale;
    for (int64_t u = job->n_whole; u < job->n_units; u++) {
        const attn_kgroup *G = &job->groups[u / P->hkv];
        int32_t kh = (int32_t)(u % P->hkv);
        int64_t W = G->kv_end - G->kv_start, c0 = W * tid / job->n_threads, c1 = W * (tid + 1) / job->n_threads;
        float *p0 = tail_partial(job, u - job->n_whole, 0);
        int64_t np = 1, blo, bhi; /* the non-empty pieces are a prefix; piece 0 always counts (it may
                                   * be empty when the unit has no blocks: then it holds zeros) */
        while (np < ATTN_BWD_TAIL_CHUNKS && (tail_piece(job, u, np, &blo, &bhi), blo < bhi)) np++;
        for (int64_t c = c0; c < c1; c++) {
            float *k0 = p0 + c * Rs, *v0 = p0 + one + c * Rs;
            for (int64_t q = 1; q < np; q++) { /* piece order: deterministic */
                const float *kq = tail_partial(job, u - job->n_whole, q) + c * Rs, *vq = kq + one;
                for (int64_t d = 0; d < D; d++) {
                    k0[d] += kq[d];
                    v0[d] += vq[d];
                }
            }
            store_row(attn_ptr(&P->dk, G->row, G->kv_start + c, kh, P->esize), P->bf16, k0, D, scale);
            store_row(attn_ptr(&P->dv, G->row, G->kv_start + c, kh, P->esize), P->bf16, v0, D, 1.0f);
        }
    }
}

void attn_avx512_bwd_reduce(const attn_bwd_job *job, int64_t u) {
    const attn_problem *P = job->P;
    const attn_kgroup *G = &job->groups[u / P->hkv];
    int32_t kh = (int32_t)(u % P->hkv);
    int64_t D = P->d, Rs = bwd_rs(round16(D)), W = G->kv_end - G->kv_start;
    bwd_bufs B0, Bt;
    bufs_of(job, 0, &B0);
    float scale = (float)P->scale;
    for (int64_t c = 0; c < W; c++) {
        float *k0 = B0.dK + c * Rs, *v0 = B0.dV + c * Rs;
        for (int t = 1; t < job->n_threads; t++) {
            bufs_of(job, t, &Bt);
            const float *kt = Bt.dK + c * Rs, *vt = Bt.dV + c * Rs;
            for (int64_t d = 0; d < D; d++) {
                k0[d] += kt[d];
                v0[d] += vt[d];
            }
        }
        store_row(attn_ptr(&P->dk, G->row, G->kv_start + c, kh, P->esize), P->bf16, k0, D, scale);
        store_row(attn_ptr(&P->dv, G->row, G->kv_start + c, kh, P->esize), P->bf16, v0, D, 1.0f);
    }
}

#ifndef ATTN_F32_EMULATED
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected (mp_cpu_has_avx512() is 0) */

size_t attn_avx512_bwd_ws(const attn_problem *P, int64_t w) {
    (void)P;
    (void)w;
    return 0;
}
void attn_avx512_bwd_thread(void *job, int tid) {
    attn_ref_bwd_thread(job, tid);
}
void attn_avx512_bwd_reduce(const attn_bwd_job *job, int64_t u) {
    (void)job;
    (void)u;
}
size_t attn_avx512_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail) {
    (void)P;
    (void)max_width;
    (void)n_tail;
    return 0;
}
void attn_avx512_bwd_tail_reduce(void *job, int tid) {
    (void)job;
    (void)tid;
}

#endif
