/* attn_avx512.c: AVX-512 f32 attention, forward (the backward is attn_avx512_bwd.c) (flash-attention 2 tiling with an
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
#include "attn_avx512_tiles.h"


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
#endif
