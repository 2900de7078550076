/* attn_amx.c: bf16 attention forward on AMX tiles (fp32 accumulation), for CPUs with AMX-TILE and
 * AMX-BF16 (Sapphire Rapids and later): AMX's part of the forward framework (attn_fwd_kernel.inc,
 * which claims the items, keeps the packed keys, plans the chunks and ends the rows). Work item =
 * 64 query rows (4 row tiles) of one segment and head; keys go in chunks of up to KC non-empty
 * 64-key tiles:
 *   S (64 x chunk)  = Q (64 x D) . K^T        2 x 2 blocks: two 16-row A tiles of Q x two K tiles
 *   softmax on S in AVX-512 (row max per chunk, running max across chunks), P -> bf16
 *   O (64 x D)     += P . V                   2 x 2 blocks of O stay in tile registers per chunk
 * The tile work runs in small steps interleaved with the vector softmax of the neighbouring chunks
 * (the next chunk's scores, which the framework's chunk call hands over as its hook, and the
 * previous chunk's P V), so that the tile unit and the vector units
 * can work at the same time; each K or V tile is used by both pairs of row tiles back to back (the
 * second use reads it from L1). After the first chunk of a block, a chunk without masking skips
 * its row max pass ("lazy max", see uk_chunk). On the machine this was tuned on, tile loads, tile
 * products and tile stores cost the same whether or not they can overlap (about 11, 18 and 10 ns),
 * so the count of tile operations per product (one load per product in the 2 x 2 blocks, the
 * minimum with 8 tiles) and per chunk (the S stores, the O round trip) is what the layout keeps low.
 * K and V of the item's (segment, key head) are packed once into the thread's workspace in the
 * VNNI layouts the tiles read (padded with zeros to whole tiles); the thread keeps them while its
 * next items use the same (segment, key head). Tiles start at the segment's first query and key,
 * like every kernel here, so the result of a token does not depend on the grid it sits in. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_amx_target.h" /* the AMX target region, amx_tiles_on */

#define BQ    ATTN_AMX_BQ /* 64 rows = 4 row tiles, 2 pairs of them */
#define NRP   (BQ / 32)   /* pairs of row tiles */
#define BK    ATTN_AMX_BK /* 64 keys = 2 halves of 32 (one A tile of P each) */
#define LOG2E 1.4426950408889634

/* exp2_ps, tanh_ps and tr16 are shared with the AVX-512 kernels */
#include "attn_avx512_common.h"

static int64_t r32(int64_t x) { return (x + 31) & ~(int64_t)31; }

/* Key tiles (of BK keys) per chunk: the scores of a chunk are computed, soft-maxed and multiplied
 * by V as a whole, so the O accumulators make one trip through the tile registers per chunk
 * instead of one per tile, and the row max of a chunk replaces per-tile rescaling (4 measured
 * faster than 2; 8 no faster). */
#define KC 4
#define SW (KC * BK) /* columns of the S and P buffers */
/* Their row strides (in elements) are one cache line more than a row: a tile stores or loads 16
 * rows at once, and at a stride of 1 KiB (512 bytes) those would fall into 4 (8) of the 64 sets
 * of the L1 cache and evict each other. */
#define SS (SW + 16)
#define PS (SW + 32)

/* 2^x for P, which is rounded to bf16 (8 significant bits) right after: a degree-3 fit of 2^f on
 * [-1/2, 1/2] (relative error 7.5e-5, far below the rounding to bf16) is exact enough. The
 * integer part n comes from adding 1.5 * 2^23 (the float unit rounds x to an integer in the low
 * mantissa bits) and 2^n is added to the exponent field as an integer, so no instruction is
 * limited to one vector port (rounding and scalef are). x is clamped at -125 so every result is
 * a normal float (denormals cost microcode assists); x < -125 (and -inf) give exactly 0. */
static inline __m512 exp2_p(__m512 x) {
    const __m512 magic = _mm512_set1_ps(12582912.0f); /* 1.5 * 2^23 */
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-125.0f));
    __m512 t = _mm512_add_ps(x, magic);
    __m512 f = _mm512_sub_ps(x, _mm512_sub_ps(t, magic));
    __m512 p = _mm512_set1_ps(0.05517132207751274f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24261054396629333f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932609677314758f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999281167984009f));
    /* the low bits of t hold n (two's complement, |n| < 256): shifted into the exponent field */
    __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
    return _mm512_castsi512_ps(_mm512_maskz_add_epi32(keep, _mm512_castps_si512(p), e));
}

/* Lazy max (see uk_chunk): the largest exponent (log2) taken against a stale row max. */
#define LAZY_MAX 8.0f

/* Per-thread workspace. */
typedef struct {
    uint16_t *KP;    /* [kv32/16][D32/32] B tiles of K^T: tile (kb, dc) row p = pairs of d, 16 keys x 2 */
    uint16_t *VP;    /* [kv32/32][D32/16] B tiles of V: tile (kc, db) row p = key pair, 16 cols x 2 */
    uint16_t *Q;     /* [BQ][D32] */
    float *S[2];     /* [BQ][SS], two: the next chunk's scores are computed while this one's softmax runs */
    uint16_t *P[2];  /* [BQ][PS] bf16, two: P V of a chunk runs while the next chunk's P is written */
    float *O;        /* [BQ][D32 + 16] (16 columns of padding) */
    uint16_t *zero;  /* D32 + 32 zero bf16 (the row of a key or query that is not read) */
    int64_t seg, kh; /* what KP/VP hold (-1: nothing; the framework keeps them) */
} fwd_bufs;

static size_t uk_fwd_layout(const attn_problem *P, char *base, fwd_bufs *b) {
    int64_t D32 = r32(P->d), kv = r32(P->L->max_kv > 0 ? P->L->max_kv : 1);
    size_t off = 0;
#define TAKE(field, type, count)                                                                                       \
    do {                                                                                                               \
        if (b) b->field = (type *)(base + off);                                                                        \
        off += ((size_t)(count) * sizeof(type) + 63) & ~(size_t)63;                                                    \
    } while (0)
    TAKE(KP, uint16_t, kv * D32);
    TAKE(VP, uint16_t, kv * (D32 + 16));
    TAKE(Q, uint16_t, BQ * D32);
    TAKE(S[0], float, BQ *SS);
    TAKE(S[1], float, BQ *SS);
    TAKE(P[0], uint16_t, BQ * PS);
    TAKE(P[1], uint16_t, BQ * PS);
    TAKE(O, float, BQ *(D32 + 16));
    TAKE(zero, uint16_t, D32 + 32);
#undef TAKE
    return off;
}

/* Words [0, D) of a bf16 row in 32-word chunks (zeros past D). */
static inline __mmask32 dmask(int64_t D, int64_t c) {
    int64_t r = D - c;
    return r >= 32 ? (__mmask32)0xffffffffu : r <= 0 ? 0 : (__mmask32)((1u << r) - 1u);
}

/* Packs the keys and values of segment k, key head kh, into the VNNI tile layouts (bf16 inputs:
 * this kernel only runs for them), 16 keys at a time through 16 x 16 transposes of 32-bit words
 * (K) and word interleaves (V). Keys outside [lo, hi) (no query of the segment sees them) and the
 * padding are zeros, never read from the tensors. */
static void uk_pack_kv(const attn_problem *P, size_t k, int64_t kh, int64_t lo, int64_t hi, fwd_bufs *B) {
    const maskpack_segment *g = &P->L->segs[k];
    int64_t D = P->d, D32 = r32(D), kvl = g->kv_len, kv32 = r32(kvl);
    int64_t ndc = D32 / 32, ndb = D32 / 16;
    memset(B->zero, 0, (size_t)(D32 + 32) * 2);
    uint16_t il[32];
    for (int c = 0; c < 16; c++) {
        il[2 * c] = (uint16_t)c;
        il[2 * c + 1] = (uint16_t)(32 + c);
    }
    const __m512i ileave = _mm512_loadu_si512(il); /* word c of x, then word c of y */
    for (int64_t j0 = 0; j0 < kv32; j0 += 16) {
        const uint16_t *kr[16], *vr[16];
        for (int r = 0; r < 16; r++) {
            int64_t j = j0 + r;
            int ok = j >= lo && j < hi && j < kvl;
            kr[r] = ok ? (const uint16_t *)attn_ptr(&P->k, g->row, g->kv_start + j, kh, 2) : B->zero;
            vr[r] = ok ? (const uint16_t *)attn_ptr(&P->v, g->row, g->kv_start + j, kh, 2) : B->zero;
            /* the rows of the next 16 keys are strided far apart (no hardware prefetch): fetch them now */
            j += 16;
            if (j >= lo && j < hi && j < kvl) {
                const char *pk = attn_ptr(&P->k, g->row, g->kv_start + j, kh, 2);
                const char *pv = attn_ptr(&P->v, g->row, g->kv_start + j, kh, 2);
                for (int64_t c = 0; c < 2 * D; c += 64) {
                    _mm_prefetch(pk + c, _MM_HINT_T0);
                    _mm_prefetch(pv + c, _MM_HINT_T0);
                }
            }
        }
        /* K: tile (kb = j0/16, dc): row p = dword p of the chunk for each of the 16 keys */
        uint16_t *kt = B->KP + (j0 / 16) * ndc * 512;
        for (int64_t dc = 0; dc < ndc; dc++) {
            __m512 w[16];
            __mmask32 m = dmask(D, dc * 32);
            for (int r = 0; r < 16; r++) w[r] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, kr[r] + dc * 32));
            tr16(w);
            for (int p = 0; p < 16; p++)
                _mm512_store_si512((void *)(kt + dc * 512 + p * 32), _mm512_castps_si512(w[p]));
        }
        /* V: tile (kc = j0/32, db) row p = (V[2p][c], V[2p+1][c]) for the 16 columns c of block db;
         * these 16 keys fill rows (j0 % 32)/2 .. + 8 */
        uint16_t *vt = B->VP + (j0 / 32) * ndb * 512 + ((j0 % 32) / 2) * 32;
        for (int p = 0; p < 8; p++) {
            const uint16_t *a = vr[2 * p], *b = vr[2 * p + 1];
            for (int64_t dc = 0; dc < ndc; dc++) {
                __mmask32 m = dmask(D, dc * 32);
                __m512i x = _mm512_maskz_loadu_epi16(m, a + dc * 32), y = _mm512_maskz_loadu_epi16(m, b + dc * 32);
                /* columns dc*32 .. +15 and +16 .. +31: two blocks db = 2 dc, 2 dc + 1 */
                __m512i lo16 = _mm512_permutex2var_epi16(x, ileave, y);
                __m512i hi16 = _mm512_permutex2var_epi16(x, _mm512_add_epi16(ileave, _mm512_set1_epi16(16)), y);
                _mm512_store_si512((void *)(vt + (2 * dc) * 512 + p * 32), lo16);
                _mm512_store_si512((void *)(vt + (2 * dc + 1) * 512 + p * 32), hi16);
            }
        }
    }
}

/* AMX's view of a chunk (attn_chunk): per tile, whether it is masked and which of its two 32-key
 * halves some row sees (the tile products compute whole halves), and those halves in key order. */
typedef struct {
    int32_t j0;
    int partial, half_on[2];
} tile_plan;

typedef struct {
    tile_plan t[KC];
    int n;
    int nh;             /* its 32-key halves that some row sees, in key order: */
    int16_t ht[2 * KC]; /* tile */
    int16_t hh[2 * KC]; /* half */
} chunk_plan;

static void plan_chunk(const attn_chunk *a, chunk_plan *c) {
    c->n = a->n;
    c->nh = 0;
    for (int t = 0; t < a->n; t++) {
        const attn_tile *x = &a->t[t];
        tile_plan *p = &c->t[t];
        p->j0 = x->j0;
        /* keys past the segment (zero padding of a short last tile) are masked */
        p->partial = x->cls == ATTN_TILE_PARTIAL || x->j1 - x->j0 < BK;
        for (int h = 0; h < 2; h++) {
            p->half_on[h] = x->ja < x->j0 + 32 * (h + 1) && x->jb > x->j0 + 32 * h;
            if (p->half_on[h]) {
                c->ht[c->nh] = (int16_t)t;
                c->hh[c->nh] = (int16_t)h;
                c->nh++;
            }
        }
    }
}

/* The tile work of a chunk runs in small steps that the softmax loops interleave with their
 * vector work, so the tile unit and the vector units run at the same time (the out-of-order window
 * only overlaps a few hundred instructions: issued as one block, the tile work would mostly run
 * alone). A step is 4 tile loads and 4 tile products. */
typedef struct {
    const fwd_bufs *B;
    const chunk_plan *c;
    float *S;          /* score: the chunk's S buffer */
    const uint16_t *P; /* P V: the chunk's P buffer */
    int64_t D32, ndb, OS;
    int n, done; /* steps in all, steps done */
} tile_job;

/* S = Q K^T: step s = (half k, pair of row tiles rp, d chunk dc); C tiles 0..3 = (row tile r of
 * the pair, key block b). The pairs of a half run back to back, so the second reads the K tiles
 * from L1 (tile loads from L2 halve the speed of the tile products). */
static inline void score_step(tile_job *J) {
    const fwd_bufs *B = J->B;
    const chunk_plan *c = J->c;
    int64_t ndc = J->D32 / 32, D32 = J->D32;
    int dc = J->done % (int)ndc, rp = (J->done / (int)ndc) % NRP, k = J->done / (int)ndc / NRP;
    int t = c->ht[k], h = c->hh[k];
    int64_t kb0 = (c->t[t].j0 + 32 * h) / 16;
    const uint16_t *q = B->Q + 32 * rp * D32;
    if (dc == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    /* the four loads, then the four products (measured faster than interleaving them) */
    _tile_loadd(4, q + dc * 32, D32 * 2);
    _tile_loadd(5, q + 16 * D32 + dc * 32, D32 * 2);
    _tile_loadd(6, B->KP + (kb0 * ndc + dc) * 512, 64);
    _tile_loadd(7, B->KP + ((kb0 + 1) * ndc + dc) * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    if (dc == ndc - 1) {
        float *s = J->S + 32 * rp * SS + t * BK + 32 * h;
        _tile_stored(0, s, SS * 4);
        _tile_stored(1, s + 16, SS * 4);
        _tile_stored(2, s + 16 * SS, SS * 4);
        _tile_stored(3, s + 16 * SS + 16, SS * 4);
    }
    J->done++;
}

/* O += P V: step s = (pair of 16-column blocks db, db + 1; pair of row tiles rp; half k); C tiles
 * 0..3 = (row tile r of the pair, block) stay in the tile registers over every key of the chunk,
 * and the second row pair reads the V tiles from L1. */
static inline void pv_step(tile_job *J) {
    const fwd_bufs *B = J->B;
    const chunk_plan *c = J->c;
    int64_t OS = J->OS, ndb = J->ndb;
    int k = J->done % c->nh, rp = (J->done / c->nh) % NRP;
    int64_t db = 2 * (int64_t)(J->done / c->nh / NRP);
    int two = db + 1 < ndb;
    float *o = B->O + 32 * rp * OS + db * 16;
    const uint16_t *pp = J->P + 32 * rp * PS;
    if (k == 0) {
        _tile_loadd(0, o, OS * 4);
        _tile_loadd(1, o + 16 * OS, OS * 4);
        if (two) {
            _tile_loadd(2, o + 16, OS * 4);
            _tile_loadd(3, o + 16 * OS + 16, OS * 4);
        }
    }
    int t = c->ht[k], h = c->hh[k];
    const uint16_t *vt = B->VP + (((c->t[t].j0 + 32 * h) / 32) * ndb + db) * 512;
    _tile_loadd(4, pp + t * BK + 32 * h, PS * 2);
    _tile_loadd(5, pp + 16 * PS + t * BK + 32 * h, PS * 2);
    _tile_loadd(6, vt, 64);
    if (two) _tile_loadd(7, vt + 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if (two) {
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (k == c->nh - 1) {
        _tile_stored(0, o, OS * 4);
        _tile_stored(1, o + 16 * OS, OS * 4);
        if (two) {
            _tile_stored(2, o + 16, OS * 4);
            _tile_stored(3, o + 16 * OS + 16, OS * 4);
        }
    }
    J->done++;
}

static void score_job(tile_job *J, const fwd_bufs *B, const chunk_plan *c, float *S, int64_t D32) {
    J->B = B;
    J->c = c;
    J->S = S;
    J->D32 = D32;
    J->n = c ? c->nh * (int)(D32 / 32) * NRP : 0;
    J->done = 0;
}

static void pv_job(tile_job *J, const fwd_bufs *B, const chunk_plan *c, const uint16_t *P, int64_t ndb, int64_t OS) {
    J->B = B;
    J->c = c;
    J->P = P;
    J->ndb = ndb;
    J->OS = OS;
    J->n = c ? c->nh * (int)((ndb + 1) / 2) * NRP : 0;
    J->done = 0;
}

/* Share (in 64ths) of a chunk's score steps run during the row max pass; the rest, after all of
 * the previous chunk's P V, run during the exponent pass, which has most of the vector work.
 * Both jobs keep partial sums in tiles 0..3 across steps, so one job's run of steps (a score
 * block of ndc steps, a P V block of nh steps) is never interrupted by the other's. */
#define SCORE_IN_MAX 16
/* Pass 1: runs the score steps due after row x of BQ (the first SCORE_IN_MAX 64ths of them). */
static inline void score_until(tile_job *J, int x) {
    int due = (int)(((int64_t)J->n * SCORE_IN_MAX * (x + 1)) / (64 * BQ));
    while (J->done < due) score_step(J);
}
/* Pass 2: the P V steps, then the remaining score steps, spread evenly over the rows; base is
 * the score steps done before the pass. */
static inline void both_until(tile_job *pv, tile_job *sj, int base, int x) {
    int due = (int)(((int64_t)(pv->n + sj->n - base) * (x + 1)) / BQ);
    while (pv->done + sj->done - base < due) {
        if (pv->done < pv->n)
            pv_step(pv);
        else
            score_step(sj);
    }
}

/* An item's running softmax and its tile work in flight: chunk i is planned in cp[i % 3], scored
 * into S[i % 2] and its P written to P[i % 2]; while its softmax runs, the next chunk's scores
 * (both passes) and the previous chunk's P V (pass 2) run in the tile unit, a few steps after each
 * row, so that both units work at once. O and l are rescaled to chunk i's running max once the
 * previous P V is complete (after pass 2). */
typedef struct fwd_state {
    float m[BQ],
        l[BQ]; /* m: the running max (log2 units), l: the running sum of P as rounded to bf16 (what P V uses) */
    chunk_plan cp[3];
    tile_job pv, sj; /* the P V and score jobs in flight */
} fwd_state;

/* the tiles' configuration, for a thread's items */
static void uk_thread_begin(fwd_bufs *B) {
    (void)B;
    amx_tiles_on();
}
static void uk_thread_end(fwd_bufs *B) {
    (void)B;
    _tile_release();
}

static void uk_item_begin(const attn_problem *P, const maskpack_segment *g, const attn_item *it, const attn_rows *rows,
                          fwd_bufs *B, fwd_state *S) {
    (void)rows;
    int64_t D = P->d, D32 = r32(D), ndb = D32 / 16, OS = D32 + 16;
    /* Q rows (bf16, unscaled: the scale is applied to S in f32) */
    for (int32_t x = 0; x < BQ; x++) {
        const uint16_t *src =
            x < it->n ? (const uint16_t *)attn_ptr(&P->q, g->row, g->q_start + it->i0 + x, it->head, 2) : B->zero;
        for (int64_t c = 0; c < D32; c += 32)
            _mm512_store_si512((void *)(B->Q + x * D32 + c), _mm512_maskz_loadu_epi16(dmask(D, c), src + c));
    }
    memset(B->O, 0, (size_t)(BQ * OS) * sizeof(float));
    for (int x = 0; x < BQ; x++) {
        S->m[x] = -INFINITY;
        S->l[x] = 0;
    }
    pv_job(&S->pv, B, NULL, NULL, ndb, OS);
}

/* The first chunk's scores, before its softmax (nothing to overlap them with yet). */
static void uk_chunk_first(const attn_problem *P, fwd_bufs *B, fwd_state *S, const attn_chunk *c) {
    plan_chunk(c, &S->cp[0]);
    score_job(&S->sj, B, &S->cp[0], B->S[0], r32(P->d));
    while (S->sj.done < S->sj.n) score_step(&S->sj);
}

/* Chunk i: its softmax in two vector passes over the rows, with the next chunk's scores and this
 * chunk's predecessor's P V interleaved (the framework's hook: next is the chunk after, NULL for
 * the last); this chunk's P V is left in S->pv for the next call or uk_item_end. */
static void uk_chunk(const attn_problem *P, const maskpack_segment *g, const attn_item *it, const attn_rows *rows,
                     fwd_bufs *B, fwd_state *S, const attn_chunk *c, const attn_chunk *next, int i) {
    (void)c; /* planned into S->cp[i % 3] by the call before (or uk_chunk_first) */
    const int64_t D = P->d, D32 = r32(D), ndb = D32 / 16, OS = D32 + 16;
    const __m512bh one_bh = (__m512bh)_mm512_set1_epi16(0x3f80); /* bf16 1.0 pairs */
    const int cap = P->softcap > 0;
    const float scf = (float)(cap ? P->scale / P->softcap : P->scale * LOG2E);
    const __m512 sc = _mm512_set1_ps(scf);
    const int scale_pos = scf > 0;
    const __m512 capmul = _mm512_set1_ps((float)(P->softcap * LOG2E));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const int32_t kvl = (int32_t)g->kv_len;
    const chunk_plan *cur = &S->cp[i % 3];
    float *Sb = B->S[i % 2];
    const int more = next != NULL;
    if (more) plan_chunk(next, &S->cp[(i + 1) % 3]);
    score_job(&S->sj, B, more ? &S->cp[(i + 1) % 3] : NULL, B->S[(i + 1) % 2], D32);
    /* a tile is "fast" when no scaling, capping or masking has to be written back: its row max
     * is taken on the raw scores (the scale is positive) and P = 2^(s * scale - m) */
    int fast[KC], all_fast = 1;
    for (int t = 0; t < cur->n; t++) all_fast &= fast[t] = !cap && scale_pos && !cur->t[t].partial;
    /* lazy: a chunk of fast tiles after every row has a finite max skips pass 1 and takes its
     * exponents against the current max; P may then exceed 1, up to 2^LAZY_MAX (harmless in
     * bf16 and f32 alike). A row whose scores go beyond that takes its exact max and is redone
     * (see pass 2). This is exact softmax all the same: O and l use one reference per row. */
    int lazy = i > 0 && all_fast;
    for (int c = 0; lazy && c < BQ / 16; c++)
        lazy = !_mm512_cmp_ps_mask(_mm512_loadu_ps(S->m + 16 * c), ninf, _CMP_EQ_OQ);
    /* pass 1: each row's max over the chunk */
    float mx[BQ];
    for (int x = 0; x < BQ && !lazy; x++) {
        float *s = Sb + x * SS;
        __m512 mf = ninf, ms = ninf;
        for (int t = 0; t < cur->n; t++) {
            const tile_plan *tp = &cur->t[t];
            float *st = s + t * BK;
            if (fast[t]) {
                mf = _mm512_max_ps(mf, _mm512_max_ps(_mm512_max_ps(_mm512_load_ps(st), _mm512_load_ps(st + 16)),
                                                     _mm512_max_ps(_mm512_load_ps(st + 32), _mm512_load_ps(st + 48))));
                continue;
            }
            for (int c = 0; c < 4; c++) {
                if (!tp->half_on[c / 2]) continue;
                __m512 y = _mm512_mul_ps(_mm512_load_ps(st + 16 * c), sc);
                if (cap) y = _mm512_mul_ps(tanh_ps(y), capmul);
                if (tp->partial) y = _mm512_mask_blend_ps(keys_allowed(rows, x, tp->j0 + 16 * c, kvl), ninf, y);
                _mm512_store_ps(st + 16 * c, y);
                ms = _mm512_max_ps(ms, y);
            }
        }
        /* fast tiles exist only with a positive scale (else -inf * scale would be +inf) */
        float a = scale_pos ? _mm512_reduce_max_ps(mf) * scf : -INFINITY, b = _mm512_reduce_max_ps(ms);
        mx[x] = a > b ? a : b;
        score_until(&S->sj, x);
    }
    /* a score block in progress is finished before P V may use the tiles */
    while (S->sj.done % (int)(D32 / 32)) score_step(&S->sj);
    int sbase = S->sj.done;
    /* the running max: rows whose max grew rescale their O and l by 2^(m_old - m_new), after
     * pass 2 (the previous chunk's P V still adds to O at the old max) */
    float mu[BQ], al[BQ];
    uint64_t resc = 0;
    if (lazy) memcpy(mu, S->m, sizeof mu);
    for (int c = 0; c < BQ / 16 && !lazy; c++) {
        __m512 mo = _mm512_loadu_ps(S->m + 16 * c), t = _mm512_loadu_ps(mx + 16 * c);
        __mmask16 grow = _mm512_cmp_ps_mask(t, mo, _CMP_GT_OQ);
        __mmask16 rescale = grow & _mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ);
        __m512 mn = _mm512_mask_mov_ps(mo, grow, t);
        _mm512_storeu_ps(S->m + 16 * c, mn);
        /* a row that has seen nothing yet keeps m = -inf: exponents are taken against 0 */
        _mm512_storeu_ps(mu + 16 * c,
                         _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps()));
        if (rescale) _mm512_storeu_ps(al + 16 * c, exp2_ps(_mm512_sub_ps(mo, mn)));
        resc |= (uint64_t)rescale << (16 * c);
    }
    /* pass 2: P in bf16 */
    uint16_t *Pb = B->P[i % 2];
    float rsum[BQ];
    for (int x = 0; x < BQ; x++) {
        const float *s = Sb + x * SS;
        uint16_t *pr = Pb + x * PS;
        __m512 muv = _mm512_set1_ps(mu[x]), rs, top;
    redo:
        rs = _mm512_setzero_ps();
        top = ninf; /* lazy: the largest exponent */
        for (int t = 0; t < cur->n; t++) {
            const tile_plan *tp = &cur->t[t];
            const float *st = s + t * BK;
            __m512 p[4];
            if (fast[t]) {
                for (int c = 0; c < 4; c++) {
                    __m512 e = _mm512_fmsub_ps(_mm512_load_ps(st + 16 * c), sc, muv);
                    if (lazy) top = _mm512_max_ps(top, e);
                    p[c] = exp2_p(e);
                }
            } else {
                for (int c = 0; c < 4; c++)
                    p[c] = tp->half_on[c / 2] ? exp2_p(_mm512_sub_ps(_mm512_load_ps(st + 16 * c), muv))
                                              : _mm512_setzero_ps();
            }
            __m512bh b0 = _mm512_cvtne2ps_pbh(p[1], p[0]), b1 = _mm512_cvtne2ps_pbh(p[3], p[2]);
            _mm512_store_si512((void *)(pr + t * BK), (__m512i)b0);
            _mm512_store_si512((void *)(pr + t * BK + 32), (__m512i)b1);
            /* the row sum of the rounded P: pairs of bf16 values times 1.0 summed in f32 */
            rs = _mm512_dpbf16_ps(_mm512_dpbf16_ps(rs, b0, one_bh), b1, one_bh);
        }
        if (lazy && _mm512_cmp_ps_mask(top, _mm512_set1_ps(LAZY_MAX), _CMP_GT_OQ)) {
            /* the row's scores outgrew its max: take the exact max of the chunk and redo the
             * row; O and l are rescaled after pass 2, like a grown max of pass 1 */
            __m512 mf = ninf;
            for (int t = 0; t < cur->n; t++)
                for (int c = 0; c < 4; c++) mf = _mm512_max_ps(mf, _mm512_load_ps(s + t * BK + 16 * c));
            float mn = _mm512_reduce_max_ps(mf) * scf;
            al[x] = (float)exp2((double)S->m[x] - (double)mn);
            resc |= (uint64_t)1 << x;
            S->m[x] = mu[x] = mn;
            muv = _mm512_set1_ps(mn);
            goto redo;
        }
        rsum[x] = _mm512_reduce_add_ps(rs);
        /* during the last chunk: the Q row of the block before (the driver orders a head's
         * blocks last first, so it is most often this thread's next item) into L2, as its rows
         * are strided far apart (no hardware prefetch) */
        if (!more && it->i0 >= BQ) {
            const char *nq = attn_ptr(&P->q, g->row, g->q_start + it->i0 - BQ + x, it->head, 2);
            for (int64_t c = 0; c < 2 * D; c += 64) _mm_prefetch(nq + c, _MM_HINT_T1);
        }
        /* and this block's output row, for writing (it is written right after this chunk) */
        if (!more && x < it->n) {
            char *od = attn_ptr(&P->out, g->row, g->q_start + it->i0 + x, it->head, 2);
            for (int64_t c = 0; c < 2 * D; c += 64) __builtin_prefetch(od + c, 1, 3);
        }
        both_until(&S->pv, &S->sj, sbase, x);
    }
    /* the previous chunk's P V is complete: O and l move to the new max, then take this chunk */
    while (resc) {
        int x = __builtin_ctzll(resc);
        resc &= resc - 1;
        __m512 av = _mm512_set1_ps(al[x]);
        S->l[x] *= al[x];
        float *o = B->O + x * OS;
        for (int64_t d = 0; d < OS; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), av));
    }
    for (int x = 0; x < BQ; x++) S->l[x] += rsum[x];
    pv_job(&S->pv, B, cur, Pb, ndb, OS);
}

/* The last chunk's P V, then the rows' ends. */
static void uk_item_end(const attn_problem *P, fwd_bufs *B, fwd_state *S, int32_t n, float *inv, float *lse) {
    (void)P;
    (void)B;
    while (S->pv.done < S->pv.n) pv_step(&S->pv);
    for (int32_t x = 0; x < n; x++) attn_finish_row(S->m[x], S->l[x], &inv[x], &lse[x]);
}

/* Rows x < n of O times inv[x], rounded to bf16, to the output tensor. */
static void uk_store_out(const attn_problem *P, const maskpack_segment *g, const attn_item *it, fwd_bufs *B,
                         const float *inv) {
    const int64_t D = P->d, OS = r32(D) + 16;
    for (int32_t x = 0; x < it->n; x++) {
        uint16_t *dst = (uint16_t *)attn_ptr(&P->out, g->row, g->q_start + it->i0 + x, it->head, 2);
        const float *o = B->O + x * OS;
        __m512 iv = _mm512_set1_ps(inv[x]);
        int64_t d = 0;
        for (; d + 16 <= D; d += 16)
            _mm256_storeu_si256((__m256i *)(dst + d),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o + d), iv)));
        for (; d < D; d++) dst[d] = mp_f32_to_bf16(o[d] * inv[x]);
    }
}

#define ATTN_FN(name) attn_amx_##name
#include "attn_fwd_kernel.inc"


#ifndef MASKPACK_EMULATE_AMX
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected */

size_t attn_amx_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}
void attn_amx_fwd_thread(void *job, int tid) { attn_ref_fwd_thread(job, tid); }

#endif
