/* attn_internal.h: what the attention kernels see (attn_ref.c; the vector kernels: the forward and
 * backward frameworks attn_fwd_kernel.inc and attn_bwd_kernel.inc over the micro-kernels of
 * attn_avx512.c / attn_avx512_bwd.c, attn_avx2.c / attn_avx2_bwd.c, attn_avx512bf16.c and
 * attn_amx.c): the problem, the rule geometry of a query block (attn_rule.c), the work items and
 * claims (attn_plan.c), the kernels' entry points and row I/O. The driver's own declarations are in
 * attn_plan.h, which no kernel includes. Never installed. */
#ifndef MASKPACK_ATTN_INTERNAL_H
#define MASKPACK_ATTN_INTERNAL_H

#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Query rows per block and keys per tile of the vector kernels. Blocks start at each segment's
 * first query and tiles at its first key, so which rows share a block and which keys share a tile
 * depends only on positions inside the segment: that is what makes packed and padded runs of one
 * kernel bitwise equal. */
#define ATTN_BQ     48 /* AVX-512: 3 vectors of 16 query rows (AVX2: 6 of 8, same blocks) */
#define ATTN_BK     64
#define ATTN_AMX_BQ 64 /* AMX: 4 row tiles of 16 */
#define ATTN_AMX_BK 64
#define ATTN_MAX_D  256
#define ATTN_MAX_BQ 64 /* the larger of the two (attn_rows holds a block) */

/* One tensor's addressing, the kernels' one token view (internal.h): element (row b, token t, head
 * h, d) sits at base + (b*s_row + t*s_col + h*s_h + d) * esize (D contiguous). s_row is 0 for
 * packed tensors. */
typedef mp_token_view attn_view;

typedef struct attn_problem {
    const maskpack_layout *L;
    int64_t hq, hkv, group, d;
    int bf16; /* 1: q/k/v/out/dout/dq/dk/dv are bf16, else f32 */
    size_t esize;
    double scale, softcap;
    attn_view q, k, v, out, lse; /* lse: f32, token stride s_col, head stride s_h, row stride s_row */
    int have_lse;
    /* backward */
    attn_view dout, dq, dk, dv;
    int n_threads;
    maskpack_isa isa;
} attn_problem;

static inline char *attn_ptr(const attn_view *v, int64_t b, int64_t t, int64_t h, size_t esize) {
    return v->base + (b * v->s_row + t * v->s_col + h * v->s_h) * (int64_t)esize;
}

/* The rule of one query block, as per-row key intervals (segment-local): base [lo, hi) from
 * causal + window, span [slo, shi) when the row sits in a span, prefix [0, pre). Rows past the
 * block's valid count have empty intervals. */
typedef struct attn_rows {
    int32_t n; /* valid rows */
    int32_t lo[ATTN_MAX_BQ], hi[ATTN_MAX_BQ];
    int32_t slo[ATTN_MAX_BQ], shi[ATTN_MAX_BQ];
    int32_t pre[ATTN_MAX_BQ];
    int32_t kmin, kmax; /* union hull of every row's keys; kmin >= kmax when the block sees nothing */
    /* base-only blocks (no span or prefix row): every row's keys are one interval and consecutive
     * rows' intervals move by at most one key, so their union is [kmin, kmax) without holes and a
     * tile is FULL iff every row covers it: lo_max <= j0 and hi_min >= j1 with no empty row */
    int simple, any_empty;
    int32_t lo_max, hi_min;
} attn_rows;

/* The end of a row of the forward, for every kernel's online softmax: m is the running max in
 * log2 units, l the running sum of 2^(s - m); out = O * inv, lse = ln(2) (m + log2 l). A row that
 * saw no key (l = 0) gets out 0 and lse -inf. */
static inline void attn_finish_row(float m, float l, float *inv, float *lse) {
    if (l > 0) {
        *inv = 1.0f / l;
        *lse = (float)((m + log2((double)l)) * 0.6931471805599453); /* ln 2 */
    } else {
        *inv = 0;
        *lse = -INFINITY;
    }
}

/* The vector kernels' row groups: a block of ATTN_BQ rows is ATTN_NRG groups of ATTN_RG rows, and a
 * partial tile skips the groups that see none of a run of its keys (attn_f32_kernel.inc). lo[c],
 * hi[c]: the hull of group c's keys (for blocks outside the base rule, every group sees every key
 * of the block's hull). */
#define ATTN_RG  16
#define ATTN_NRG (ATTN_BQ / ATTN_RG)
typedef struct attn_group_hull {
    int32_t lo[ATTN_NRG], hi[ATTN_NRG];
} attn_group_hull;

enum { ATTN_TILE_EMPTY = 0, ATTN_TILE_PARTIAL = 1, ATTN_TILE_FULL = 2 };

/* Fills rows for query rows [i0, i0 + n) of segment k (n <= ATTN_MAX_BQ). */
void attn_block_rows(const maskpack_layout *L, size_t k, int64_t i0, int32_t n, attn_rows *rows);
/* (layout, segment k, block height bq) -> [lo, hi): the keys any query of segment k may see, the
 * union hull of its blocks' rows (what a kernel packs; the rest stays zero). */
void attn_segment_hull(const maskpack_layout *L, size_t k, int32_t bq, int64_t *lo, int64_t *hi);
/* Classifies keys [j0, j1) against the block: EMPTY, PARTIAL or FULL; for a non-empty tile,
 * [ja, jb) is the sub-range some row may see (keys outside it are excluded for every row). */
int attn_classify(const attn_rows *rows, int32_t j0, int32_t j1, int32_t *ja, int32_t *jb);

/* A chunk: up to ATTN_MAX_KC non-empty key tiles of one query block, in key order, the forward
 * framework's unit (attn_fwd_kernel.inc). Tile t covers keys [j0, j1) (j0 a multiple of the tile
 * width from the segment's first key, j1 cut at the segment's end), of class cls with [ja, jb)
 * the keys some row sees (attn_classify). */
#define ATTN_MAX_KC 4
typedef struct attn_tile {
    int32_t j0, j1, ja, jb;
    int cls;
} attn_tile;
typedef struct attn_chunk {
    attn_tile t[ATTN_MAX_KC];
    int n;        /* tiles (0: no key left) */
    int32_t next; /* where the next chunk's search starts */
} attn_chunk;

/* (block rows, first key j0, the segment's keys kvl, tile width bk, at most kc tiles) -> the next
 * non-empty tiles from j0 on into c; returns their count. */
static inline int attn_next_chunk(const attn_rows *rows, int32_t j0, int32_t kvl, int32_t bk, int kc, attn_chunk *c) {
    c->n = 0;
    for (; c->n < kc && j0 < rows->kmax; j0 += bk) {
        attn_tile *t = &c->t[c->n];
        t->j0 = j0;
        t->j1 = j0 + bk < kvl ? j0 + bk : kvl;
        t->cls = attn_classify(rows, j0, t->j1, &t->ja, &t->jb);
        if (t->cls != ATTN_TILE_EMPTY) c->n++;
    }
    c->next = j0;
    return c->n;
}

/* Query blocks: one work item = (segment, query head, block). */
typedef struct attn_item {
    int64_t seg;
    int32_t head;
    int32_t i0, n;
} attn_item;

/* A kernel's share: fn(ctx, s) runs once for every share s in [0, n), each on whichever participant
 * of the team claims it first (the run layer's items: see attn_plan.c). */
typedef void (*attn_thread_fn)(void *ctx, int tid);

/* Backward work units: a key group (segments of one row whose key ranges overlap, e.g. the
 * pieces of one sequence in a CP shard) for one key head. */
typedef struct attn_kgroup {
    size_t seg_begin, seg_end;     /* segments [seg_begin, seg_end) */
    int64_t row, kv_start, kv_end; /* union of their key ranges */
    int64_t q_rows;                /* sum of their q_len */
} attn_kgroup;

/* (layout) -> the backward's key groups: per row, segments whose key ranges overlap share one
 * (perm lists each row's segments by key start, groups index it), and *max_width the widest;
 * perm and groups have n_segments entries. attn_count_groups gives the count and width alone,
 * with no memory. */
size_t attn_build_groups(const maskpack_layout *L, size_t *perm, attn_kgroup *groups, int64_t *max_width);
size_t attn_count_groups(const maskpack_layout *L, int64_t *max_width);

/* ---- kernels ------------------------------------------------------------------------------ */

/* Forward job: items claimed from a shared counter; one workspace slice per thread. */
typedef struct attn_fwd_job {
    const attn_problem *P;
    const attn_item *items;
    size_t n_items;
    mp_claim *claim; /* the shared claims of units, then items (attn_fwd_claim) */
    char *ws;        /* per-thread slices of ws_stride bytes, 64-aligned */
    size_t ws_stride;
    /* units = (segment, key head): items [unit_begin[u], unit_begin[u+1]). With enough units
     * each thread takes whole units (a unit's keys are packed once, by one thread); otherwise
     * single items, so both cores work on one sequence of one head. */
    const size_t *unit_begin;
    size_t n_units;
    int by_unit;
    /* by_unit mode: units [0, n_whole) are claimed whole, the items of the rest one by one, so
     * the threads finish within one item of each other instead of one unit (a busy core on a
     * shared machine otherwise leaves the other idle for up to a whole unit); a thread that
     * meets a new unit there packs its keys itself (one more pack per thread and tail unit) */
    size_t n_whole;
} attn_fwd_job;

/* Claims the next run of items [*b, *e) for a thread; 0 when there is none left. */
int attn_fwd_claim(attn_fwd_job *job, size_t *b, size_t *e);

/* Backward unit job: unit u is key group u / hkv for key head u % hkv. */
typedef struct attn_bwd_job {
    const attn_problem *P;
    const attn_kgroup *groups;
    const size_t *perm; /* group G's segments are perm[G.seg_begin .. G.seg_end) */
    size_t n_groups;
    int64_t n_units; /* n_groups * hkv */
    mp_claim *claim; /* dynamic mode: whole units [0, n_whole), then the tail units' pieces
                              * (n_whole + (n_units - n_whole) * ATTN_BWD_TAIL_CHUNKS claims) */
    int split;       /* 1: one unit at a time, its items split over threads */
    int64_t unit;    /* split mode: the current unit */
    char *ws;
    size_t ws_stride;
    int n_threads;
    /* Dynamic mode, vector kernels (AVX-512, AVX2): units [0, n_whole) are claimed whole; each
     * later (tail) unit is claimed as up to ATTN_BWD_TAIL_CHUNKS pieces of consecutive query blocks
     * (counted as bwd_unit does; see tail_piece in attn_bwd_kernel.inc), each accumulating its own
     * dK/dV partial in tail_acc; the kernel's bwd_tail_reduce (attn_avx512_, attn_avx2_) then sums each key's
     * partials in piece order. So the threads finish within one piece of each other, and which
     * thread ran a piece never changes a bit (n_whole = n_units: no tail). */
    int64_t n_whole;
    float *tail_acc; /* [n_units - n_whole][ATTN_BWD_TAIL_CHUNKS][2][max width][row stride] */
    int64_t max_width;
} attn_bwd_job;

#define ATTN_BWD_TAIL_CHUNKS 4

size_t attn_ref_fwd_ws(const attn_problem *P);
void attn_ref_fwd_thread(void *job, int tid);
size_t attn_ref_bwd_ws(const attn_problem *P);
void attn_ref_bwd_thread(void *job, int tid);

/* The CPU checks that choose among these kernels: src/core/cpu_features.h (shared with the gated
 * delta rule). */

size_t attn_avx512_fwd_ws(const attn_problem *P);
void attn_avx512_fwd_thread(void *job, int tid);
size_t attn_avx512_bwd_ws(const attn_problem *P, int64_t max_group_width);
void attn_avx512_bwd_thread(void *job, int tid);

/* AVX2 + FMA (attn_avx2.c, attn_avx2_bwd.c): the same frameworks over AVX2 micro-kernels; same
 * contracts, workspace layouts and results as the attn_avx512_* ones. */
size_t attn_avx2_fwd_ws(const attn_problem *P);
void attn_avx2_fwd_thread(void *job, int tid);
size_t attn_avx2_bwd_ws(const attn_problem *P, int64_t max_group_width);
void attn_avx2_bwd_thread(void *job, int tid);
void attn_avx2_bwd_reduce(const attn_bwd_job *job, int64_t u);
size_t attn_avx2_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail);
void attn_avx2_bwd_tail_reduce(void *job, int tid);

size_t attn_avx512bf16_fwd_ws(const attn_problem *P);
void attn_avx512bf16_fwd_thread(void *job, int tid);
/* AVX512-BF16 bf16 backward (attn_avx512bf16_bwd.c): the backward framework over bf16-pair
 * products; same contracts as the attn_avx512_bwd_* ones, bf16 problems only. */
size_t attn_avx512bf16_bwd_ws(const attn_problem *P, int64_t max_group_width);
void attn_avx512bf16_bwd_thread(void *job, int tid);
void attn_avx512bf16_bwd_reduce(const attn_bwd_job *job, int64_t u);
size_t attn_avx512bf16_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail);
void attn_avx512bf16_bwd_tail_reduce(void *job, int tid);

size_t attn_amx_fwd_ws(const attn_problem *P);
void attn_amx_fwd_thread(void *job, int tid);
/* A backward kernel file's entry points where its ISA cannot exist (not x86-64, or a compiler without
 * the intrinsics): never selected there (its CPU check is 0), defined so that the table links: no
 * workspace, the reference's thread, nothing to reduce. */
#define ATTN_BWD_NEVER_SELECTED(prefix)                                                                                \
    size_t prefix##_bwd_ws(const attn_problem *P, int64_t w) {                                                         \
        (void)P;                                                                                                       \
        (void)w;                                                                                                       \
        return 0;                                                                                                      \
    }                                                                                                                  \
    void prefix##_bwd_thread(void *job, int tid) { attn_ref_bwd_thread(job, tid); }                                    \
    void prefix##_bwd_reduce(const attn_bwd_job *job, int64_t u) {                                                     \
        (void)job;                                                                                                     \
        (void)u;                                                                                                       \
    }                                                                                                                  \
    size_t prefix##_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail) {                         \
        (void)P;                                                                                                       \
        (void)max_width;                                                                                               \
        (void)n_tail;                                                                                                  \
        return 0;                                                                                                      \
    }                                                                                                                  \
    void prefix##_bwd_tail_reduce(void *job, int tid) {                                                                \
        (void)job;                                                                                                     \
        (void)tid;                                                                                                     \
    }

/* AMX bf16 backward (attn_amx_bwd.c): the backward framework over tile products; same contracts as
 * the attn_avx512_bwd_* ones, bf16 problems only. */
size_t attn_amx_bwd_ws(const attn_problem *P, int64_t max_group_width);
void attn_amx_bwd_thread(void *job, int tid);
void attn_amx_bwd_reduce(const attn_bwd_job *job, int64_t u);
size_t attn_amx_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail);
void attn_amx_bwd_tail_reduce(void *job, int tid);

/* Split mode: sums the threads' private dk/dv accumulators of unit u into dk/dv. */
void attn_avx512_bwd_reduce(const attn_bwd_job *job, int64_t u);
/* Bytes of tail_acc for n_tail tail units of width up to max_width. */
size_t attn_avx512_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail);
/* After the dynamic phase: thread tid of n sums and stores its share of the tail units' keys. */
void attn_avx512_bwd_tail_reduce(void *job, int tid);

/* The kernels' row I/O. (n f32 values times mul) -> a tensor row of dtype f32 / bf16 (rounded to
 * nearest even, as mp_f32_to_bf16). */
static inline void attn_store_row(void *dst, int bf16, const float *src, int64_t n, float mul) {
    if (bf16) {
        uint16_t *o = dst;
        for (int64_t x = 0; x < n; x++) o[x] = mp_f32_to_bf16(src[x] * mul);
    } else {
        float *o = dst;
        for (int64_t x = 0; x < n; x++) o[x] = src[x] * mul;
    }
}

/* (a tensor row of n values, f32 / bf16) -> n f32 values. */
static inline void attn_load_row(float *dst, const void *src, int bf16, int64_t n) {
    if (bf16) {
        const uint16_t *s = src;
        for (int64_t x = 0; x < n; x++) dst[x] = mp_bf16_to_f32(s[x]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

#endif
