/* attn_amx.c: bf16 attention forward on AMX tiles (fp32 accumulation), for CPUs with AMX-TILE and
 * AMX-BF16 (Sapphire Rapids and later). Work item = 32 query rows of one segment and head:
 *   S (32 x 64 keys)  = Q (32 x D) . K^T          two 16-row A tiles of Q x VNNI-packed K tiles
 *   online softmax on S in AVX-512 (rows along vectors: keys are contiguous in S), P -> bf16
 *   O (32 x D)        = O * alpha + P . V          P as A tiles x VNNI-packed V tiles
 * K and V of the item's (segment, key head) are packed once into the thread's workspace in the
 * VNNI layouts the tiles read (padded with zeros to whole tiles); the thread keeps them while its
 * next items use the same (segment, key head). Tiles start at the segment's first query and key,
 * like every kernel here, so the result of a token does not depend on the grid it sits in. */
#include "attn_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma")
#endif

#define BQ ATTN_AMX_BQ /* 32 rows = 2 row tiles */
#define BK ATTN_AMX_BK /* 64 keys = 2 halves of 32 (one A tile of P each) */
#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453

/* exp2_ps, tanh_ps and segment_hull (at this file's BQ) are shared with the AVX-512 kernels */
#include "attn_avx512_common.h"

static int64_t r32(int64_t x) { return (x + 31) & ~(int64_t)31; }

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Every tile is 16 rows x 64 bytes: C tiles 16 x 16 f32, A tiles 16 x 32 bf16, B tiles 16 pairs x 16 x 2. */
static void tiles_on(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

/* 2^x for P, which is rounded to bf16 (8 significant bits) right after: a degree-4 fit (relative
 * error 3e-6) is exact enough and two FMAs cheaper. x = -inf gives 0. */
static inline __m512 exp2_p(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-200.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(9.56051020648151e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5917039174868725e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4024981109537302e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931219676960609e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999991908565833e-1f));
    return _mm512_scalef_ps(p, n);
}

/* Per-thread workspace. */
typedef struct {
    uint16_t *KP;   /* [kv16/16][D32/32] B tiles of K^T: tile (kb, dc) row p = pairs of d, 16 keys x 2 */
    uint16_t *VP;   /* [kv32/32][D32/16 + 1] B tiles of V: tile (kc, db) row p = key pair, 16 cols x 2;
                     * the last block of each key chunk is all ones, so P.V also yields the row sums */
    uint16_t *Q;    /* [BQ][D32] */
    float *S[2];    /* [BQ][BK], two: the next tile's scores are computed while this one's softmax runs */
    uint16_t *P;    /* [BQ][BK] bf16 */
    float *O;       /* [BQ][D32 + 16]: the last 16 columns accumulate the row sum l */
    float *T;       /* 4 C tiles [4][16][16] */
    float *tmp;     /* [D32] */
    int64_t cur_seg, cur_kh; /* what KP/VP hold (-1: nothing) */
} amx_bufs;

static size_t amx_layout(const attn_problem *P, char *base, amx_bufs *b) {
    int64_t D32 = r32(P->d), kv = r32(P->L->max_kv > 0 ? P->L->max_kv : 1);
    size_t off = 0;
#define TAKE(field, type, count)                                 \
    do {                                                         \
        if (b) b->field = (type *)(base + off);                  \
        off += ((size_t)(count) * sizeof(type) + 63) & ~(size_t)63; \
    } while (0)
    TAKE(KP, uint16_t, kv * D32);
    TAKE(VP, uint16_t, kv * (D32 + 16));
    TAKE(Q, uint16_t, BQ * D32);
    TAKE(S[0], float, BQ * BK);
    TAKE(S[1], float, BQ * BK);
    TAKE(P, uint16_t, BQ * BK);
    TAKE(O, float, BQ * (D32 + 16));
    TAKE(T, float, 4 * 256);
    TAKE(tmp, float, D32 + 16);
#undef TAKE
    return off;
}

size_t attn_amx_fwd_ws(const attn_problem *P) { return amx_layout(P, NULL, NULL) + 64; }


/* Packs the keys and values of segment k, key head kh, into the VNNI tile layouts (bf16 inputs:
 * this kernel only runs for them). Keys outside [lo, hi) (no query of the segment sees them) and
 * the padding are zeros, never read from the tensors. */
static void pack_kv(const attn_problem *P, size_t k, int64_t kh, int64_t lo, int64_t hi, amx_bufs *B) {
    const maskpack_segment *g = &P->L->segs[k];
    int64_t D = P->d, D32 = r32(D), kvl = g->kv_len, kv32 = r32(kvl);
    int64_t ndc = D32 / 32, ndb = D32 / 16 + 1;
    uint16_t *row = (uint16_t *)B->tmp; /* D32 + 16 bf16 scratch */
    /* K: tile (kb, dc) = 16 keys x 32 dims; row p holds the 32-bit pair (K[n][2p], K[n][2p+1]) for
     * n = 0..15: a 16 x 16 transpose of 32-bit words */
    for (int64_t j = 0; j < kv32; j++) {
        if (j >= lo && j < hi && j < kvl) {
            memcpy(row, attn_ptr(&P->k, g->row, g->kv_start + j, kh, 2), (size_t)D * 2);
            memset(row + D, 0, (size_t)(D32 - D) * 2);
        } else {
            memset(row, 0, (size_t)D32 * 2);
        }
        const uint32_t *w = (const uint32_t *)row;
        uint32_t *dst = (uint32_t *)B->KP + (j / 16) * ndc * 256 + (j % 16);
        for (int64_t dc = 0; dc < ndc; dc++)
            for (int64_t p = 0; p < 16; p++) dst[dc * 256 + p * 16] = w[dc * 16 + p];
    }
    /* V: tile (kc, db) = 32 keys x 16 dims; row p holds (V[2p][c], V[2p+1][c]) for c = 0..15 */
    for (int64_t j = 0; j < kv32; j++) {
        if (j >= lo && j < hi && j < kvl) {
            memcpy(row, attn_ptr(&P->v, g->row, g->kv_start + j, kh, 2), (size_t)D * 2);
            memset(row + D, 0, (size_t)(D32 - D) * 2);
        } else {
            memset(row, 0, (size_t)D32 * 2);
        }
        for (int64_t c = 0; c < 16; c++) row[D32 + c] = 0x3f80; /* 1.0 */
        uint16_t *dst = B->VP + (j / 32) * ndb * 512 + ((j % 32) / 2) * 32 + (j & 1);
        for (int64_t db = 0; db < ndb; db++)
            for (int64_t c = 0; c < 16; c++) dst[db * 512 + 2 * c] = row[db * 16 + c];
    }
    B->cur_seg = (int64_t)k;
    B->cur_kh = kh;
}

/* The tile plan of one query block: the next non-empty 64-key tile at or after j0. */
typedef struct {
    int32_t j0, ja, jb;
    int cls, partial, half_on[2];
} tile_plan;

static int next_tile(const attn_rows *rows, int32_t j0, int32_t kvl, tile_plan *t) {
    for (; j0 < rows->kmax; j0 += BK) {
        int32_t j1 = j0 + BK < kvl ? j0 + BK : kvl;
        t->cls = attn_classify(rows, j0, j1, &t->ja, &t->jb);
        if (t->cls == ATTN_TILE_EMPTY) continue;
        t->j0 = j0;
        /* the tile computes whole 32-key halves: keys past the segment (zero padding) are masked */
        t->partial = t->cls == ATTN_TILE_PARTIAL || j0 + BK > kvl;
        for (int h = 0; h < 2; h++) t->half_on[h] = t->ja < j0 + 32 * (h + 1) && t->jb > j0 + 32 * h;
        return 1;
    }
    return 0;
}

/* S = Q K^T for one tile, one 32-key half at a time: C tiles 0..3 = (row tile r, key block b). */
static void score_tile(const amx_bufs *B, const tile_plan *t, int64_t D32, float *S) {
    int64_t ndc = D32 / 32;
    for (int h = 0; h < 2; h++) {
        if (!t->half_on[h]) continue;
        int64_t kb0 = (t->j0 + 32 * h) / 16;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t dc = 0; dc < ndc; dc++) {
            _tile_loadd(4, B->Q + dc * 32, D32 * 2);
            _tile_loadd(5, B->Q + 16 * D32 + dc * 32, D32 * 2);
            _tile_loadd(6, B->KP + (kb0 * ndc + dc) * 512, 64);
            _tile_loadd(7, B->KP + ((kb0 + 1) * ndc + dc) * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, S + 32 * h, BK * 4);
        _tile_stored(1, S + 32 * h + 16, BK * 4);
        _tile_stored(2, S + 16 * BK + 32 * h, BK * 4);
        _tile_stored(3, S + 16 * BK + 32 * h + 16, BK * 4);
    }
}

static void amx_item(const attn_problem *P, const attn_item *it, amx_bufs *B) {
    const maskpack_layout *L = P->L;
    const maskpack_segment *g = &L->segs[it->seg];
    int64_t D = P->d, D32 = r32(D), kh = it->head / P->group, ndb = D32 / 16 + 1, OS = D32 + 16;
    if (B->cur_seg != it->seg || B->cur_kh != kh) {
        int64_t lo, hi;
        segment_hull(L, (size_t)it->seg, &lo, &hi);
        pack_kv(P, (size_t)it->seg, kh, lo, hi, B);
    }
    attn_rows rows;
    attn_block_rows(L, (size_t)it->seg, it->i0, it->n, &rows);
    /* Q rows (bf16, unscaled: the scale is applied to S in f32) */
    for (int32_t x = 0; x < BQ; x++) {
        uint16_t *q = B->Q + x * D32;
        if (x < it->n) {
            memcpy(q, attn_ptr(&P->q, g->row, g->q_start + it->i0 + x, it->head, 2), (size_t)D * 2);
            memset(q + D, 0, (size_t)(D32 - D) * 2);
        } else {
            memset(q, 0, (size_t)D32 * 2);
        }
    }
    memset(B->O, 0, (size_t)(BQ * OS) * sizeof(float));
    float m[BQ];
    for (int x = 0; x < BQ; x++) m[x] = -INFINITY;
    int cap = P->softcap > 0;
    const float scf = (float)(cap ? P->scale / P->softcap : P->scale * LOG2E);
    const __m512 sc = _mm512_set1_ps(scf);
    const int scale_pos = scf > 0;
    const __m512 capmul = _mm512_set1_ps((float)(P->softcap * LOG2E));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t kvl = (int32_t)g->kv_len;
    tile_plan cur, nxt;
    int have = next_tile(&rows, (rows.kmin / BK) * BK, kvl, &cur), buf = 0;
    if (have) score_tile(B, &cur, D32, B->S[0]);
    while (have) {
        /* the next tile's scores go to the other buffer first: the tile unit works on them while
         * the vector units run this tile's softmax */
        int more = next_tile(&rows, cur.j0 + BK, kvl, &nxt);
        if (more) score_tile(B, &nxt, D32, B->S[buf ^ 1]);
        const int32_t j0 = cur.j0;
        const int partial = cur.partial;
        const int *half_on = cur.half_on;
        /* Online softmax with a lazily moved reference: a row's reference max m only moves when
         * the tile's max exceeds it by more than 2^8 (or the row sees its first key), so P stays
         * <= 256 and the accumulated O rarely needs a rescale; O then accumulates in the tile
         * unit (load, P.V, store) without a vector pass over it. Pass 1 takes each row's max
         * (scaling, capping and masking S in place when needed); pass 2 writes P in bf16. */
        float mx[BQ], mu[BQ];
        const float *Sb = B->S[buf];
        int fast = !cap && !partial && scale_pos;
        for (int x = 0; x < BQ; x++) {
            float *s = B->S[buf] + x * BK;
            __m512 m4 = ninf;
            if (fast) {
                m4 = _mm512_max_ps(_mm512_max_ps(_mm512_loadu_ps(s), _mm512_loadu_ps(s + 16)),
                                   _mm512_max_ps(_mm512_loadu_ps(s + 32), _mm512_loadu_ps(s + 48)));
                mx[x] = _mm512_reduce_max_ps(m4) * scf;
                continue;
            }
            for (int c = 0; c < 4; c++) {
                __m512 y = ninf;
                if (half_on[c / 2]) {
                    y = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * c), sc);
                    if (cap) y = _mm512_mul_ps(tanh_ps(y), capmul);
                    if (partial) {
                        __m512i j = _mm512_add_epi32(_mm512_set1_epi32(j0 + 16 * c), lane);
                        __mmask16 ok = 0;
                        if (x < rows.n) {
                            ok = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(rows.lo[x])) &
                                 _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(rows.hi[x]));
                            ok |= _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(rows.pre[x]));
                            ok |= _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(rows.slo[x])) &
                                  _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(rows.shi[x]));
                            ok &= _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(kvl));
                        }
                        y = _mm512_mask_blend_ps(ok, ninf, y);
                    }
                }
                _mm512_storeu_ps(s + 16 * c, y);
                m4 = _mm512_max_ps(m4, y);
            }
            mx[x] = _mm512_reduce_max_ps(m4);
        }
        for (int c = 0; c < BQ / 16; c++) {
            __m512 mo = _mm512_loadu_ps(m + 16 * c), t = _mm512_loadu_ps(mx + 16 * c);
            __mmask16 first = _mm512_cmp_ps_mask(mo, ninf, _CMP_EQ_OQ) & _mm512_cmp_ps_mask(t, ninf, _CMP_NEQ_OQ);
            __mmask16 jump = _mm512_cmp_ps_mask(t, _mm512_add_ps(mo, _mm512_set1_ps(8.0f)), _CMP_GT_OQ) &
                             _mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ);
            __m512 mn = _mm512_mask_mov_ps(mo, first | jump, t);
            _mm512_storeu_ps(m + 16 * c, mn);
            _mm512_storeu_ps(mu + 16 * c, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn,
                                                               _mm512_setzero_ps()));
            while (jump) { /* rare: rescale the rows whose reference moved */
                int x = 16 * c + __builtin_ctz(jump);
                jump &= jump - 1;
                __m512 av = _mm512_set1_ps(exp2f(mo[x - 16 * c] - mn[x - 16 * c]));
                for (int64_t d = 0; d < OS; d += 16)
                    _mm512_storeu_ps(B->O + x * OS + d, _mm512_mul_ps(_mm512_loadu_ps(B->O + x * OS + d), av));
            }
        }
        for (int x = 0; x < BQ; x++) {
            const float *s = Sb + x * BK;
            __m512 muv = _mm512_set1_ps(mu[x]), p[4];
            if (fast)
                for (int c = 0; c < 4; c++) p[c] = exp2_p(_mm512_fmsub_ps(_mm512_loadu_ps(s + 16 * c), sc, muv));
            else
                for (int c = 0; c < 4; c++) p[c] = exp2_p(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * c), muv));
            __m512bh lo = _mm512_cvtne2ps_pbh(p[1], p[0]), hi = _mm512_cvtne2ps_pbh(p[3], p[2]);
            _mm512_storeu_si512((void *)(B->P + x * BK), (__m512i)lo);
            _mm512_storeu_si512((void *)(B->P + x * BK + 32), (__m512i)hi);
        }
        /* O += P V: P's four A tiles (row tile r, key half h) are loaded once; per 16-column block
         * the two C tiles come from O and go back to it */
        if (half_on[0]) {
            _tile_loadd(4, B->P, BK * 2);
            _tile_loadd(5, B->P + 16 * BK, BK * 2);
        }
        if (half_on[1]) {
            _tile_loadd(6, B->P + 32, BK * 2);
            _tile_loadd(7, B->P + 16 * BK + 32, BK * 2);
        }
        for (int64_t db = 0; db < ndb; db++) {
            _tile_loadd(0, B->O + db * 16, OS * 4);
            _tile_loadd(1, B->O + 16 * OS + db * 16, OS * 4);
            if (half_on[0]) {
                _tile_loadd(2, B->VP + ((j0 / 32) * ndb + db) * 512, 64);
                _tile_dpbf16ps(0, 4, 2);
                _tile_dpbf16ps(1, 5, 2);
            }
            if (half_on[1]) {
                _tile_loadd(3, B->VP + ((j0 / 32 + 1) * ndb + db) * 512, 64);
                _tile_dpbf16ps(0, 6, 3);
                _tile_dpbf16ps(1, 7, 3);
            }
            _tile_stored(0, B->O + db * 16, OS * 4);
            _tile_stored(1, B->O + 16 * OS + db * 16, OS * 4);
        }
        cur = nxt;
        have = more;
        buf ^= 1;
    }
    for (int32_t x = 0; x < it->n; x++) {
        float l = B->O[x * OS + D32]; /* the ones column: sum of the row's P */
        float inv = l > 0 ? 1.0f / l : 0.0f;
        float lse = l > 0 ? (float)((m[x] + log2((double)l)) * LN2) : -INFINITY;
        uint16_t *dst = (uint16_t *)attn_ptr(&P->out, g->row, g->q_start + it->i0 + x, it->head, 2);
        const float *o = B->O + x * OS;
        __m512 iv = _mm512_set1_ps(inv);
        int64_t d = 0;
        for (; d + 16 <= D; d += 16)
            _mm256_storeu_si256((__m256i *)(dst + d), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o + d), iv)));
        for (; d < D; d++) dst[d] = mp_f32_to_bf16(o[d] * inv);
        if (P->have_lse) *(float *)attn_ptr(&P->lse, g->row, g->q_start + it->i0 + x, it->head, 4) = lse;
    }
}

void attn_amx_fwd_thread(void *vjob, int tid) {
    attn_fwd_job *job = vjob;
    amx_bufs B;
    amx_layout(job->P, job->ws + (size_t)tid * job->ws_stride, &B);
    B.cur_seg = B.cur_kh = -1;
    tiles_on();
    size_t b, e;
    while (attn_fwd_claim(job, &b, &e))
        for (size_t it = b; it < e; it++) {
            amx_item(job->P, &job->items[it], &B);
        }
    _tile_release();
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else /* no x86-64: never selected */

size_t attn_amx_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}
void attn_amx_fwd_thread(void *job, int tid) { attn_ref_fwd_thread(job, tid); }

#endif
