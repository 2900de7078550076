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

#if defined(ATTN_AVX2_BUILD) /* the entry points of the AVX2 build (see below) */
#define attn_avx512_fwd_ws attn_avx2_fwd_ws
#define attn_avx512_fwd_thread attn_avx2_fwd_thread
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_f32_target.h" /* the AVX-512 or (ATTN_AVX2_BUILD) AVX2 target region, BQ, BK */

#define ATTN_AVX2_PARTIAL_TILES 1 /* (used by the AVX2 build only) */
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

/* ---- partial tiles: only the row vectors that see some key -------------------------------------
 * In a partial tile a vector of 16 query rows may see none of a run of keys: on the causal
 * diagonal the first rows of the block see none of its last keys, and the rows past a short last
 * block see nothing. Those (key, vector) pairs are skipped: their scores are masked to -inf after
 * st anyway, so their probabilities are exactly 0 and add nothing to O (for finite V). A vector
 * c sees keys only inside vlo[c] .. vhi[c] (the hull of its rows' intervals); the vectors that see
 * a key form a run ca .. ca + nv - 1 since the hulls grow with the rows. */

#if !defined(ATTN_AVX2_BUILD) /* (the AVX2 build's are in attn_avx2_tiles.h) */
/* st_group for vectors ca .. ca + nv - 1 only (the other lanes of ST are left as they were). */
static inline __attribute__((always_inline)) void st_group_cv(const float *YT, int64_t D, const float *G, float *ST,
                                                             const int ca, const int nv) {
    __m512 acc[8][3], y[3];
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        for (int c = 0; c < nv; c++) y[c] = _mm512_load_ps(YT + d * BQ + 16 * (ca + c));
        const float *g = G + d * 8;
        if (!(d & 1)) _mm_prefetch((const char *)(g + 8 * D), _MM_HINT_T0);
        for (int r = 0; r < 8; r++) {
            __m512 b = _mm512_set1_ps(g[r]);
            for (int c = 0; c < nv; c++) acc[r][c] = _mm512_fmadd_ps(b, y[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < nv; c++) _mm512_store_ps(ST + r * BQ + 16 * (ca + c), acc[r][c]);
}

#endif

/* The run of vectors that see some key of [a, b): *ca and the count (0: none). */
static inline int vec_run(const int32_t *vlo, const int32_t *vhi, int32_t a, int32_t b, int *ca) {
    int c0 = 3, c1 = -1;
    for (int c = 0; c < 3; c++)
        if (vlo[c] < b && vhi[c] > a) {
            if (c < c0) c0 = c;
            c1 = c;
        }
    *ca = c0;
    return c1 < c0 ? 0 : c1 - c0 + 1;
}

static void st_packed_cv(const float *YT, int64_t D, const float *KP, int32_t j0, int32_t j1, float *ST,
                         const int32_t *vlo, const int32_t *vhi) {
    for (int32_t g = j0 & ~7; g < j1; g += 8) {
        int ca, nv = vec_run(vlo, vhi, g > j0 ? g : j0, g + 8 < j1 ? g + 8 : j1, &ca);
        const float *G = KP + (int64_t)g * D;
        float *S = ST + (int64_t)(g - j0) * BQ;
        switch (ca * 4 + nv) {
        case 3: st_group_cv(YT, D, G, S, 0, 3); break;
        case 2: st_group_cv(YT, D, G, S, 0, 2); break;
        case 1: st_group_cv(YT, D, G, S, 0, 1); break;
        case 6: st_group_cv(YT, D, G, S, 1, 2); break;
        case 5: st_group_cv(YT, D, G, S, 1, 1); break;
        case 9: st_group_cv(YT, D, G, S, 2, 1); break;
        default: break; /* no vector sees these keys: masked below */
        }
    }
}

#if !defined(ATTN_AVX2_BUILD)
/* Keys [j, e) of ot_group's loop for vectors ca .. ca + nv - 1. */
static inline __attribute__((always_inline)) void ot_run_cv(__m512 acc[8][3], const float *X, const float *A,
                                                           int32_t j, int32_t e, const int ca, const int nv) {
    for (; j < e; j++) {
        __m512 a[3];
        for (int c = 0; c < nv; c++) a[c] = _mm512_load_ps(A + j * BQ + 16 * (ca + c));
        const float *x = X + j * 8;
        for (int r = 0; r < 8; r++) {
            __m512 b = _mm512_set1_ps(x[r]);
            for (int c = 0; c < nv; c++) acc[r][ca + c] = _mm512_fmadd_ps(b, a[c], acc[r][ca + c]);
        }
    }
}

/* ot_group over keys split into runs (run k: keys [cut[k], cut[k+1]) seen by the vectors of
 * code[k] = ca * 4 + nv); alpha is applied to every vector. */
static inline void ot_group_cv(float *OT, const float *X, const float *A, const __m512 *alpha, const int32_t *cut,
                               const int *code, int nrun) {
    __m512 acc[8][3];
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) acc[r][c] = _mm512_mul_ps(_mm512_load_ps(OT + r * BQ + 16 * c), alpha[c]);
    for (int k = 0; k < nrun; k++) {
        int32_t a = cut[k], b = cut[k + 1];
        switch (code[k]) {
        case 3: ot_run_cv(acc, X, A, a, b, 0, 3); break;
        case 2: ot_run_cv(acc, X, A, a, b, 0, 2); break;
        case 1: ot_run_cv(acc, X, A, a, b, 0, 1); break;
        case 6: ot_run_cv(acc, X, A, a, b, 1, 2); break;
        case 5: ot_run_cv(acc, X, A, a, b, 1, 1); break;
        case 9: ot_run_cv(acc, X, A, a, b, 2, 1); break;
        default: break;
        }
    }
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) _mm512_store_ps(OT + r * BQ + 16 * c, acc[r][c]);
}

#endif

/* ot_packed for keys [j0, j0 + nk) inside one 64-key tile of VP (the forward's tiles are VP's). */
static void ot_tile_cv(float *OT, int64_t D8, const float *VP, int32_t j0, int32_t nk, const float *A,
                       const __m512 *alpha, const int32_t *vlo, const int32_t *vhi) {
    /* runs of keys with the same vectors: cut at every hull end inside the range */
    int32_t pts[8], cut[8];
    int code[7], np = 0, nrun = 0;
    pts[np++] = j0;
    for (int c = 0; c < 3; c++) {
        if (vlo[c] > j0 && vlo[c] < j0 + nk) pts[np++] = vlo[c];
        if (vhi[c] > j0 && vhi[c] < j0 + nk) pts[np++] = vhi[c];
    }
    for (int x = 1; x < np; x++) /* insertion sort of at most 7 points */
        for (int y = x; y > 0 && pts[y - 1] > pts[y]; y--) {
            int32_t t = pts[y];
            pts[y] = pts[y - 1];
            pts[y - 1] = t;
        }
    pts[np++] = j0 + nk;
    for (int x = 0; x + 1 < np; x++) {
        if (pts[x + 1] <= pts[x]) continue;
        int ca, nv = vec_run(vlo, vhi, pts[x], pts[x + 1], &ca);
        if (nrun > 0 && code[nrun - 1] == ca * 4 + nv) { /* same vectors: extend */
            cut[nrun] = pts[x + 1] - j0;
            continue;
        }
        cut[nrun] = pts[x] - j0;
        code[nrun] = ca * 4 + nv;
        cut[++nrun] = pts[x + 1] - j0;
    }
    const float *tile = VP + (int64_t)(j0 >> 6) * D8 * 64 + (j0 & 63) * 8;
    for (int64_t d = 0; d < D8; d += 8) ot_group_cv(OT + d * BQ, tile + (d / 8) * 512, A, alpha, cut, code, nrun);
}

/* The f32 output rows (unpack_rows_direct's job, same values: row x of O times inv[x]) through the
 * row-major staging block Or [BQ][Dp], written with streaming stores: with interleaved heads each
 * row sits on its own page, and ordinary stores wait to read every line of it first (one row at a
 * time, the largest fixed cost of a short forward). The partial lines at either end of a row
 * (other heads share them) get ordinary masked stores. */
static void unpack_rows_nt(const attn_problem *P, const attn_view *view, const maskpack_segment *g, int32_t h,
                           int64_t i0, int32_t n, const float *OT, float *Or, int64_t Dp, const float *inv) {
    int64_t D = P->d;
    transpose_scaled(OT, BQ, Or, Dp, Dp, BQ, 1.0f);
    for (int32_t x = 0; x < n; x++) {
        float *dst = (float *)attn_ptr(view, g->row, g->q_start + i0 + x, h, 4);
        const float *src = Or + x * Dp;
        __m512 m = _mm512_set1_ps(inv[x]);
        uintptr_t a = (uintptr_t)dst, e = a + (uintptr_t)D * 4, f = (a + 63) & ~(uintptr_t)63, l = e & ~(uintptr_t)63;
        if ((a & 3) || f >= l) { /* no whole line inside the row */
            for (int64_t d = 0; d < D; d += 16) {
                __mmask16 k = D - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (D - d)) - 1);
                _mm512_mask_storeu_ps(dst + d, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + d), m));
            }
            continue;
        }
        int64_t h0 = (int64_t)(f - a) / 4, t0 = (int64_t)(l - a) / 4;
        if (h0 > 0) {
            __mmask16 k = (__mmask16)((1u << h0) - 1);
            _mm512_mask_storeu_ps(dst, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src), m));
        }
        for (int64_t d = h0; d < t0; d += 16) _mm512_stream_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(src + d), m));
        if (t0 < D) {
            __mmask16 k = (__mmask16)((1u << (D - t0)) - 1);
            _mm512_mask_storeu_ps(dst + t0, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + t0), m));
        }
    }
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible like the others */
}

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
    /* per vector of 16 rows, the hull of its rows' keys (see st_packed_cv); a block with rows
     * outside the base rule keeps every vector on every key */
    int32_t vlo[3], vhi[3];
    for (int c = 0; c < 3; c++) {
        vlo[c] = rows.simple ? INT32_MAX : rows.kmin;
        vhi[c] = rows.simple ? INT32_MIN : rows.kmax;
        for (int x = 16 * c; rows.simple && x < 16 * c + 16 && x < it->n; x++)
            if (rows.lo[x] < rows.hi[x]) {
                if (rows.lo[x] < vlo[c]) vlo[c] = rows.lo[x];
                if (rows.hi[x] > vhi[c]) vhi[c] = rows.hi[x];
            }
    }
    for (int32_t j0 = (rows.kmin / BK) * BK; j0 < rows.kmax; j0 += BK) {
        int32_t j1 = j0 + BK < g->kv_len ? j0 + BK : (int32_t)g->kv_len, ja, jb;
        int cls = attn_classify(&rows, j0, j1, &ja, &jb);
        if (cls == ATTN_TILE_EMPTY) continue;
        /* a short block's missing rows are a vector that sees nothing: masked, it is skipped */
        if (cls == ATTN_TILE_FULL && it->n <= 2 * 16) cls = ATTN_TILE_PARTIAL;
        int32_t nk = jb - ja;
        if (cls == ATTN_TILE_PARTIAL)
            st_packed_cv(QT, D, B->KP, ja, jb, ST, vlo, vhi);
        else
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
                        x = lane_blend(rows.simple ? lane_allowed_simple(&R, c, jv) : lane_allowed(&R, c, ja + j), ninf,
                                       x);
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
        if (cls == ATTN_TILE_PARTIAL)
            ot_tile_cv(OT, D8, B->VP, ja, nk, ST, alpha, vlo, vhi);
        else
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
        unpack_rows_nt(P, &P->out, g, it->head, it->i0, it->n, OT, B->Yr, round16(D), inv);
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

#ifndef ATTN_F32_EMULATED
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected (mp_cpu_has_avx512() is 0) */

size_t attn_avx512_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}
void attn_avx512_fwd_thread(void *job, int tid) {
    attn_ref_fwd_thread(job, tid);
}
#endif
