/* attn_avx512.c: AVX-512 f32 attention, forward and backward (flash-attention 2 tiling with an
 * online softmax). Layout of the work: query rows run along the vector lanes (a block of 48 rows
 * is 3 zmm vectors), so every per-row quantity (running max, sum, mask, D_i, lse) is a vertical
 * operation and no horizontal reduction is ever needed; each row's sums over keys run in the same
 * order whichever grid its sequence sits in.
 *   S^T[j][i]  = sum_d K[j][d] * QT[d][i]           (broadcast K, 3 vector loads of QT per d)
 *   O^T[d][i] += sum_j V[j][d] * P^T[j][i]          (broadcast V, 3 vector loads of P^T per key)
 *   dV[j][:]  += sum_i P^T[j][i] * dO[i][:]         (broadcast P^T, vector loads of dO rows)
 * bf16 inputs are widened to f32 when a tile is loaded. Compiled for AVX-512 with a target pragma;
 * chosen at run time only when the CPU has it. */
#include "attn_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif

#define BQ ATTN_BQ
#define BK ATTN_BK
#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453

#include "attn_avx512_common.h"

/* ---- the three matrix kernels ------------------------------------------------------------------ */

/* Keys are packed once per (segment or key group, key head) into two layouts:
 *   KP [n8/8][D][8]: the 8 keys of a group side by side for each d (what S^T = K Q^T broadcasts)
 *   VP [n64/64][D8/8][64][8]: per tile of 64 keys, one slab per group of 8 columns holding those
 *                     columns of each key side by side (what O^T += V^T P^T broadcasts)
 * so both kernels stream one contiguous run per tile (short strided runs defeat the prefetchers and
 * halve the speed when the keys come from L2); n8, n64 and D8 round up with zeros. */

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

/* ST rows 0 .. j1-j0 for packed keys [j0, j1). Whole groups are computed, so rows before 0 (up to
 * 7) and after j1-j0 (up to 7) are written too: ST must have that room; they are never used. */
static void st_packed(const float *YT, int64_t D, const float *KP, int32_t j0, int32_t j1, float *ST) {
    for (int32_t g = j0 & ~7; g < j1; g += 8) st_group(YT, D, KP + (int64_t)g * D, ST + (int64_t)(g - j0) * BQ);
}

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

/* OT [D8][BQ] = OT * alpha + V^T A over packed keys [j0, j0 + nk) (exactly those: a key outside
 * the range is never read here). A range crossing a 64-key tile of the pack runs in pieces, alpha
 * applied by the first. */
static void ot_packed(float *OT, int64_t D8, const float *VP, int32_t j0, int32_t nk, const float *A,
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

static void pack_rows(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h, int64_t i0,
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

/* Rows x < n of the accumulator OT [Dp][BQ] to the tensor: row x times inv[x]. Or is [BQ][Dp]. */
static void unpack_rows(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h,
                        int64_t i0, int32_t n, const float *OT, float *Or, int64_t Dp, const float *inv) {
    transpose_scaled(OT, BQ, Or, Dp, Dp, BQ, 1.0f);
    for (int32_t x = 0; x < n; x++)
        attn_store_row(attn_ptr(view, g->row, g->q_start + i0 + x, h, P->esize), P->bf16, Or + x * Dp, P->d, inv[x]);
}


/* f32 tensors with D a multiple of 16: the same two moves as pack_rows (QT only) and unpack_rows,
 * straight between the tensor rows and the transposed block through 16 x 16 register transposes,
 * without the row-major copy in between (same products, so the same values). */
static void pack_rows_direct(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h,
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

static void unpack_rows_direct(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h,
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

/* Packs keys [0, n) of head kh of a key-grid tensor (key r = token col0 + r of row brow) into KP
 * and/or VP form (either may be NULL), 16 keys at a time (KP through 16 x 16 transposes); keys
 * outside [lo, hi) (that no query of the unit may see) and the padding are zeros and are never
 * read from the tensor. tmp holds 17 * (Dp + 16) floats. */
static void pack_keys(const attn_problem *P, const attn_view *view, int64_t brow, int64_t col0, int64_t n, int64_t kh,
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

/* ---- forward ------------------------------------------------------------------------------------ */

typedef struct {
    float *QT, *OT, *ST, *KP, *VP, *Yr, *tmp;
    int64_t seg, kh; /* what KP/VP hold (-1: nothing) */
} fwd_bufs;

/* ST gets 8 spare rows on each side (st_packed writes whole key groups). */
static size_t fwd_layout(const attn_problem *P, float *base, fwd_bufs *b) {
    int64_t D = P->d, D8 = round8(D), Dp = round16(D), n8 = round8(P->L->max_kv > 0 ? P->L->max_kv : 1);
    size_t off = 0;
#define TAKE(field, count)                        \
    do {                                          \
        if (b) b->field = base + off;             \
        off += (size_t)round16((int64_t)(count)); \
    } while (0)
    TAKE(QT, Dp * BQ);
    TAKE(OT, Dp * BQ);
    TAKE(ST, (BK + 16) * BQ);
    TAKE(Yr, BQ * Dp);
    TAKE(KP, n8 * D);
    TAKE(VP, round64(n8) * D8);
    TAKE(tmp, 17 * (Dp + 16));
#undef TAKE
    if (b) b->ST += 8 * BQ;
    return off * sizeof(float);
}

size_t attn_avx512_fwd_ws(const attn_problem *P) { return fwd_layout(P, NULL, NULL) + 64; }

static void fwd_item(const attn_problem *P, const attn_item *it, fwd_bufs *B) {
    const maskpack_layout *L = P->L;
    const maskpack_segment *g = &L->segs[it->seg];
    int64_t D = P->d, D8 = round8(D), kh = it->head / P->group;
    float *QT = B->QT, *OT = B->OT, *ST = B->ST;
    if (B->seg != it->seg || B->kh != kh) {
        int64_t lo, hi;
        segment_hull(L, (size_t)it->seg, &lo, &hi);
        pack_keys(P, &P->k, g->row, g->kv_start, g->kv_len, kh, lo, hi, B->KP, NULL, B->tmp);
        pack_keys(P, &P->v, g->row, g->kv_start, g->kv_len, kh, lo, hi, NULL, B->VP, B->tmp);
        B->seg = it->seg;
        B->kh = kh;
    }
    attn_rows rows;
    attn_block_rows(L, (size_t)it->seg, it->i0, it->n, &rows);
    int cap = P->softcap > 0;
    float qmul = cap ? (float)(P->scale / P->softcap) : (float)(P->scale * LOG2E);
    __m512 capmul = _mm512_set1_ps((float)(P->softcap * LOG2E));
    int direct = !P->bf16 && D % 16 == 0;
    if (direct) {
        memset(B->tmp, 0, (size_t)D * sizeof(float)); /* the zero row for rows past n */
        pack_rows_direct(P, &P->q, g, it->head, it->i0, it->n, qmul, QT, B->tmp, NULL, 0);
    } else {
        pack_rows(P, &P->q, g, it->head, it->i0, it->n, qmul, QT, B->Yr, round16(D), round16(D));
    }
    memset(OT, 0, (size_t)(D8 * BQ) * sizeof(float));
    __m512 m[3], l[3];
    for (int c = 0; c < 3; c++) {
        m[c] = _mm512_set1_ps(-INFINITY);
        l[c] = _mm512_setzero_ps();
    }
    lane_rule R;
    lane_rule_init(&R, &rows);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int32_t j0 = (rows.kmin / BK) * BK; j0 < rows.kmax; j0 += BK) {
        int32_t j1 = j0 + BK < g->kv_len ? j0 + BK : (int32_t)g->kv_len, ja, jb;
        int cls = attn_classify(&rows, j0, j1, &ja, &jb);
        if (cls == ATTN_TILE_EMPTY) continue;
        int32_t nk = jb - ja;
        st_packed(QT, D, B->KP, ja, jb, ST);
        __m512 mt[3] = {ninf, ninf, ninf};
        if (cls == ATTN_TILE_FULL && !cap) {
            for (int32_t j = 0; j < nk; j++)
                for (int c = 0; c < 3; c++) mt[c] = _mm512_max_ps(mt[c], _mm512_load_ps(ST + j * BQ + 16 * c));
        } else {
            for (int32_t j = 0; j < nk; j++) {
                float *s = ST + j * BQ;
                __m512i jv = _mm512_set1_epi32(ja + j);
                for (int c = 0; c < 3; c++) {
                    __m512 x = _mm512_load_ps(s + 16 * c);
                    if (cap) x = _mm512_mul_ps(tanh_ps(x), capmul);
                    if (cls == ATTN_TILE_PARTIAL)
                        x = _mm512_mask_blend_ps(rows.simple ? lane_allowed_simple(&R, c, jv) : lane_allowed(&R, c, ja + j),
                                                 ninf, x);
                    _mm512_store_ps(s + 16 * c, x);
                    mt[c] = _mm512_max_ps(mt[c], x);
                }
            }
        }
        __m512 alpha[3], mu[3], sum[3];
        for (int c = 0; c < 3; c++) {
            __m512 mn = _mm512_max_ps(m[c], mt[c]);
            /* a row that has seen nothing yet keeps m = -inf: exponents are taken against 0 */
            mu[c] = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps());
            alpha[c] = exp2_ps(_mm512_sub_ps(m[c], mu[c]));
            m[c] = mn;
            sum[c] = _mm512_setzero_ps();
        }
        for (int32_t j = 0; j < nk; j++) {
            float *s = ST + j * BQ;
            for (int c = 0; c < 3; c++) {
                __m512 p = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s + 16 * c), mu[c]));
                _mm512_store_ps(s + 16 * c, p);
                sum[c] = _mm512_add_ps(sum[c], p);
            }
        }
        for (int c = 0; c < 3; c++) l[c] = _mm512_fmadd_ps(l[c], alpha[c], sum[c]);
        ot_packed(OT, D8, B->VP, ja, nk, ST, alpha);
    }
    /* normalise and write: out = O / l, lse = ln(2) * (m + log2 l); rows that saw nothing: 0, -inf */
    float inv[BQ], lse[BQ], mm[BQ], ll[BQ];
    for (int c = 0; c < 3; c++) {
        _mm512_storeu_ps(mm + 16 * c, m[c]);
        _mm512_storeu_ps(ll + 16 * c, l[c]);
    }
    for (int32_t x = 0; x < it->n; x++) {
        if (ll[x] > 0) {
            inv[x] = 1.0f / ll[x];
            lse[x] = (float)((mm[x] + log2((double)ll[x])) * LN2);
        } else {
            inv[x] = 0;
            lse[x] = -INFINITY;
        }
    }
    if (direct)
        unpack_rows_direct(P, &P->out, g, it->head, it->i0, it->n, OT, inv);
    else
        unpack_rows(P, &P->out, g, it->head, it->i0, it->n, OT, B->Yr, round16(D), inv);
    if (P->have_lse)
        for (int32_t x = 0; x < it->n; x++)
            *(float *)attn_ptr(&P->lse, g->row, g->q_start + it->i0 + x, it->head, 4) = lse[x];
}

void attn_avx512_fwd_thread(void *vjob, int tid) {
    attn_fwd_job *job = vjob;
    fwd_bufs B;
    fwd_layout(job->P, (float *)(job->ws + (size_t)tid * job->ws_stride), &B);
    B.seg = B.kh = -1;
    size_t b, e;
    while (attn_fwd_claim(job, &b, &e))
        for (size_t it = b; it < e; it++) {
            fwd_item(job->P, &job->items[it], &B);
        }
}

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
 * (Measured at S = 2048, D = 128, 2 threads: about as fast as the plain sweep on a quiet machine,
 * much faster when other work shares the L3.) */
#ifndef BWD_KB /* (overridable when tuning) */
#define BWD_KB 256 /* keys per super-block: 640 KB of K/V/dK/dV at D = 128 */
#endif
#ifndef BWD_QCH
#define BWD_QCH 16 /* query blocks per chunk */
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
                        p = _mm512_mask_blend_ps(rows->simple
                                                     ? lane_allowed_simple(&X->R, c, _mm512_set1_epi32(ja + j))
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
            for (int64_t b0 = 0; b0 < nblk; b0 += C) {
                /* this part's blocks of the chunk [b0, b0 + C) */
                int64_t mine[BWD_QCH], nm = 0;
                for (int64_t b = b0; b < nblk && b < b0 + C; b++)
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

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else /* no x86-64: never selected (attn_cpu_has_avx512() is 0) */

size_t attn_avx512_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}
void attn_avx512_fwd_thread(void *job, int tid) {
    attn_ref_fwd_thread(job, tid);
}
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
