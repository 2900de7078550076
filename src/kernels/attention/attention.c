/* attention.c: the public attention entry points: argument validation (everything is checked
 * before anything is written), kernel selection, the work decomposition shared by every kernel,
 * the threads, and the zeroing of padding. The kernels live in attn_ref.c, the vector frameworks
 * attn_fwd_kernel.inc / attn_bwd_kernel.inc compiled per ISA (attn_avx512.c, attn_avx512_bwd.c,
 * attn_avx2.c, attn_avx2_bwd.c, attn_avx512bf16.c) and attn_amx.c. */
#include "attn_internal.h"
#include "cpu_features.h"
#include "isa.h"
#include "../kernel_table.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the kernel table ------------------------------------------------------------------------ */

/* One attention kernel: its ISA, dtypes and micro-kernels. Forward threads per dtype; the backward
 * (bf16 widened to f32) with its per-thread workspace, its tail partials and their reductions
 * (NULL for the reference, which neither splits units nor keeps a tail). */
typedef struct attn_kernel {
    mp_kernel_desc desc;
    size_t (*fwd_ws)(const attn_problem *P);
    attn_thread_fn fwd_f32, fwd_bf16;
    int32_t bq_bf16; /* query rows per block of the bf16 forward (f32: ATTN_BQ) */
    size_t (*bwd_ws)(const attn_problem *P, int64_t max_width);
    size_t (*bwd_tail_bytes)(const attn_problem *P, int64_t max_width, int64_t n_tail);
    attn_thread_fn bwd, bwd_tail_reduce;
    void (*bwd_reduce)(const attn_bwd_job *job, int64_t u);
} attn_kernel;

/* the reference's backward workspace does not depend on the group width */
static size_t ref_bwd_ws(const attn_problem *P, int64_t max_width) {
    (void)max_width;
    return attn_ref_bwd_ws(P);
}

#define ATTN_DTYPES (MP_DT(MASKPACK_F32) | MP_DT(MASKPACK_BF16))
#define ATTN_AVX512_BWD                                                                                                \
    attn_avx512_bwd_ws, attn_avx512_bwd_tail_bytes, attn_avx512_bwd_thread, attn_avx512_bwd_tail_reduce,               \
        attn_avx512_bwd_reduce

/* Reference first. AVX512-BF16 and AMX have no f32 arithmetic: their f32 forwards and every
 * backward are the AVX-512 kernel's. AUTO takes amx for bf16 only and never avx512_bf16 by name:
 * the avx512 entry runs bf16 forwards on its dot products where the CPU has them (attn_fwd_fn). */
static const attn_kernel ATTN_KERNELS[] = {
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_REF, "attention/ref", ATTN_DTYPES, ATTN_DTYPES},
     attn_ref_fwd_ws,
     attn_ref_fwd_thread,
     attn_ref_fwd_thread,
     ATTN_BQ,
     ref_bwd_ws,
     NULL,
     attn_ref_bwd_thread,
     NULL,
     NULL},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AVX2, "attention/avx2", ATTN_DTYPES, ATTN_DTYPES},
     attn_avx2_fwd_ws,
     attn_avx2_fwd_thread,
     attn_avx2_fwd_thread,
     ATTN_BQ,
     attn_avx2_bwd_ws,
     attn_avx2_bwd_tail_bytes,
     attn_avx2_bwd_thread,
     attn_avx2_bwd_tail_reduce,
     attn_avx2_bwd_reduce},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AVX512, "attention/avx512", ATTN_DTYPES, ATTN_DTYPES},
     attn_avx512_fwd_ws,
     attn_avx512_fwd_thread,
     attn_avx512_fwd_thread,
     ATTN_BQ,
     ATTN_AVX512_BWD},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AVX512_BF16, "attention/avx512_bf16", ATTN_DTYPES, 0},
     attn_avx512bf16_fwd_ws,
     attn_avx512_fwd_thread,
     attn_avx512bf16_fwd_thread,
     ATTN_BQ,
     ATTN_AVX512_BWD},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AMX, "attention/amx", ATTN_DTYPES, MP_DT(MASKPACK_BF16)},
     attn_amx_fwd_ws,
     attn_avx512_fwd_thread,
     attn_amx_fwd_thread,
     ATTN_AMX_BQ,
     ATTN_AVX512_BWD},
};
enum { N_ATTN_KERNELS = sizeof ATTN_KERNELS / sizeof ATTN_KERNELS[0] };

const mp_kernel_desc *attn_kernel_desc(size_t i) { return i < N_ATTN_KERNELS ? &ATTN_KERNELS[i].desc : NULL; }

static const attn_kernel *attn_entry(maskpack_isa isa) {
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        if (ATTN_KERNELS[i].desc.isa == isa) return &ATTN_KERNELS[i];
    return &ATTN_KERNELS[0];
}

/* The forward's entry: the chosen ISA's, except that avx512 runs bf16 on the AVX512-BF16 entry
 * where the CPU has it. */
static const attn_kernel *attn_fwd_entry(const attn_problem *P) {
    if (P->isa == MASKPACK_ISA_AVX512 && P->bf16 && mp_cpu_has_avx512bf16())
        return attn_entry(MASKPACK_ISA_AVX512_BF16);
    return attn_entry(P->isa);
}

/* ---- running shares on a team ------------------------------------------------------------------ */

/* The kernels' thread functions take a share index s in [0, n): per-share workspace, and in the
 * backward's split mode and tail reduction a fixed part of the work. The shares are the run layer's
 * items (mp_run_for): every share runs exactly once, on some participant, and the results depend
 * only on n (never on the team or on which participant ran what). */
typedef struct {
    attn_thread_fn fn;
    void *ctx;
} attn_shares;

static maskpack_status run_share(void *p, int64_t s, int participant) {
    (void)participant;
    const attn_shares *S = p;
    S->fn(S->ctx, (int)s);
    return MASKPACK_OK;
}

/* Runs fn(ctx, s) once for every share s in [0, n) (at least one) on the run's team. */
static void run_shares(const mp_run *run, int n, attn_thread_fn fn, void *ctx) {
    attn_shares S = {fn, ctx};
    mp_run_for(run, n > 1 ? n : 1, run_share, &S);
}
/* ---- the rule of a query block -------------------------------------------------------------- */

void attn_block_rows(const maskpack_layout *L, size_t k, int64_t i0, int32_t n, attn_rows *r) {
    int64_t pre = L->prefix ? L->prefix[k] : 0;
    size_t sb = L->span_begin[k], se = L->span_begin[k + 1];
    r->n = n;
    int32_t kmin = INT32_MAX, kmax = 0;
    for (int32_t x = 0; x < ATTN_MAX_BQ; x++) {
        r->lo[x] = r->hi[x] = r->slo[x] = r->shi[x] = r->pre[x] = 0;
        if (x >= n) continue;
        int64_t i = i0 + x, lo, hi;
        mp_base_key_range(L, k, i, &lo, &hi);
        r->lo[x] = (int32_t)lo;
        r->hi[x] = (int32_t)hi;
        r->pre[x] = (int32_t)pre;
        if (se > sb) {
            int64_t p = mp_span_pos(L, k, i);
            for (size_t t = sb; t < se; t++) {
                const maskpack_span *sp = &L->spans[t];
                if (p >= sp->start && p < sp->end) {
                    r->slo[x] = (int32_t)sp->start;
                    r->shi[x] = (int32_t)sp->end;
                    break;
                }
            }
        }
        /* hull of this row's keys */
        int32_t a = INT32_MAX, b = 0;
        if (r->lo[x] < r->hi[x]) {
            a = r->lo[x];
            b = r->hi[x];
        }
        if (r->pre[x] > 0) {
            a = 0;
            if (r->pre[x] > b) b = r->pre[x];
        }
        if (r->slo[x] < r->shi[x]) {
            if (r->slo[x] < a) a = r->slo[x];
            if (r->shi[x] > b) b = r->shi[x];
        }
        if (a < b) {
            if (a < kmin) kmin = a;
            if (b > kmax) kmax = b;
        }
    }
    if (kmin == INT32_MAX) kmin = kmax = 0;
    r->kmin = kmin;
    r->kmax = kmax;
    r->simple = 1;
    r->any_empty = 0;
    r->lo_max = INT32_MIN;
    r->hi_min = INT32_MAX;
    for (int32_t x = 0; x < n; x++) {
        if (r->pre[x] > 0 || r->slo[x] < r->shi[x]) r->simple = 0;
        if (r->lo[x] >= r->hi[x]) r->any_empty = 1;
        if (r->lo[x] > r->lo_max) r->lo_max = r->lo[x];
        if (r->hi[x] < r->hi_min) r->hi_min = r->hi[x];
    }
}

void attn_segment_hull(const maskpack_layout *L, size_t k, int32_t bq, int64_t *lo, int64_t *hi) {
    const maskpack_segment *g = &L->segs[k];
    int64_t a = INT64_MAX, b = 0;
    attn_rows rows;
    for (int64_t i0 = 0; i0 < g->q_len; i0 += bq) {
        attn_block_rows(L, k, i0, (int32_t)(g->q_len - i0 < bq ? g->q_len - i0 : bq), &rows);
        if (rows.kmin < rows.kmax) {
            if (rows.kmin < a) a = rows.kmin;
            if (rows.kmax > b) b = rows.kmax;
        }
    }
    *lo = a == INT64_MAX ? 0 : a;
    *hi = a == INT64_MAX ? 0 : b;
}

/* Does row x see all of [j0, j1)? The union of at most three intervals, walked from j0. */
static int row_covers(const attn_rows *r, int x, int32_t j0, int32_t j1) {
    int32_t pos = j0;
    for (int guard = 0; guard < 4 && pos < j1; guard++) {
        int32_t next = pos;
        if (r->lo[x] <= pos && pos < r->hi[x] && r->hi[x] > next) next = r->hi[x];
        if (pos < r->pre[x] && r->pre[x] > next) next = r->pre[x];
        if (r->slo[x] <= pos && pos < r->shi[x] && r->shi[x] > next) next = r->shi[x];
        if (next == pos) return 0;
        pos = next;
    }
    return pos >= j1;
}

/* Keys of [j0, j1) row x sees: their hull as [*a, *b) (empty when *a >= *b). */
static void row_hull(const attn_rows *r, int x, int32_t j0, int32_t j1, int32_t *a, int32_t *b) {
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    int32_t s[3] = {r->lo[x], 0, r->slo[x]}, e[3] = {r->hi[x], r->pre[x], r->shi[x]};
    for (int t = 0; t < 3; t++) {
        int32_t u = s[t] > j0 ? s[t] : j0, w = e[t] < j1 ? e[t] : j1;
        if (u < w) {
            if (u < lo) lo = u;
            if (w > hi) hi = w;
        }
    }
    *a = lo;
    *b = hi;
}

int attn_classify(const attn_rows *r, int32_t j0, int32_t j1, int32_t *ja, int32_t *jb) {
    if (r->kmin >= r->kmax || j1 <= r->kmin || j0 >= r->kmax) return ATTN_TILE_EMPTY;
    if (r->simple) { /* O(1): see attn_rows */
        if (!r->any_empty && r->lo_max <= j0 && r->hi_min >= j1) {
            *ja = j0;
            *jb = j1;
            return ATTN_TILE_FULL;
        }
        *ja = r->kmin > j0 ? r->kmin : j0;
        *jb = r->kmax < j1 ? r->kmax : j1;
        return ATTN_TILE_PARTIAL;
    }
    int all = 1;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (int x = 0; x < r->n; x++) {
        int32_t a, b;
        row_hull(r, x, j0, j1, &a, &b);
        if (a < b) {
            if (a < lo) lo = a;
            if (b > hi) hi = b;
        }
        if (all && !row_covers(r, x, j0, j1)) all = 0;
    }
    if (lo >= hi) return ATTN_TILE_EMPTY;
    if (all) {
        *ja = j0;
        *jb = j1;
        return ATTN_TILE_FULL;
    }
    *ja = lo;
    *jb = hi;
    return ATTN_TILE_PARTIAL;
}

/* ---- row helpers shared by the kernels ---------------------------------------------------------- */

void attn_store_row(void *dst, int bf16, const float *src, int64_t n, float mul) {
    if (bf16) {
        uint16_t *o = dst;
        for (int64_t x = 0; x < n; x++) o[x] = mp_f32_to_bf16(src[x] * mul);
    } else {
        float *o = dst;
        for (int64_t x = 0; x < n; x++) o[x] = src[x] * mul;
    }
}

void attn_load_row(float *dst, const void *src, int bf16, int64_t n) {
    if (bf16) {
        const uint16_t *s = src;
        for (int64_t x = 0; x < n; x++) dst[x] = mp_bf16_to_f32(s[x]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* ---- validation ---------------------------------------------------------------------------- */

/* A per-token head tensor of the query grid (kv = 0) or key grid (kv = 1): [B,W,H,D] for padded
 * layouts, [W,H,D] or [1,W,H,D] for packed. Fills the view, heads and head dim. */
static maskpack_status check_heads_tensor(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int kv,
                                          attn_view *view, int64_t *heads, int64_t *d, maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 3, 4, err);
    if (s) return s;
    if (!(ATTN_DTYPES & MP_DT(t->dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected float32 or bfloat16, found %s", name,
                       maskpack_dtype_name(t->dtype));
    int64_t width = kv ? L->kv_width : L->q_width;
    const char *grid = kv ? "key" : "query";
    if (L->packed) {
        int lead = t->ndim == 4;
        if (lead && t->shape[0] != 1)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, 0, -1,
                           "%s: a packed layout takes [T,H,D] or [1,T,H,D], found %lld in dimension 0", name,
                           (long long)t->shape[0]);
        if (t->shape[lead] != width)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, lead, -1,
                           "%s: expected %lld tokens (the layout's %s grid) in dimension %d, found %lld", name,
                           (long long)width, grid, lead, (long long)t->shape[lead]);
    } else {
        if (t->ndim != 4)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                           "%s: a padded layout takes [B,S,H,D], found %d dimensions", name, (int)t->ndim);
        if (t->shape[0] != L->n_rows)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, 0, -1,
                           "%s: expected %lld rows (B) in dimension 0, found %lld", name, (long long)L->n_rows,
                           (long long)t->shape[0]);
        if (t->shape[1] != width)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, 1, -1,
                           "%s: expected %lld columns (the layout's %s grid) in dimension 1, found %lld", name,
                           (long long)width, grid, (long long)t->shape[1]);
    }
    *heads = t->shape[t->ndim - 2];
    *d = t->shape[t->ndim - 1];
    if (*d > 1 && t->strides[t->ndim - 1] != 1)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, name, t->ndim - 1, -1,
                       "%s: the head dimension (D) must be contiguous (stride 1), found stride %lld", name,
                       (long long)t->strides[t->ndim - 1]);
    mp_token_view_fill(t, L->packed && t->ndim == 3 ? 1 : 2, L->packed, view);
    return MASKPACK_OK;
}

/* t must have exactly ref's shape and the given dtype. */
static maskpack_status check_same(const maskpack_tensor *t, const char *name, const maskpack_tensor *ref,
                                  const char *ref_name, maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 0, MASKPACK_MAX_DIMS, err);
    if (s) return s;
    if (t->dtype != ref->dtype)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected %s's dtype %s, found %s", name, ref_name,
                       maskpack_dtype_name(ref->dtype), maskpack_dtype_name(t->dtype));
    int same = t->ndim == ref->ndim;
    for (int32_t x = 0; same && x < t->ndim; x++) same = t->shape[x] == ref->shape[x];
    if (!same) {
        int32_t x = 0;
        while (x < t->ndim && x < ref->ndim && t->shape[x] == ref->shape[x]) x++;
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, x, -1,
                       "%s: expected the shape of %s (%d dimensions, dimension %d = %lld), found %d dimensions "
                       "(dimension %d = %lld)",
                       name, ref_name, (int)ref->ndim, (int)x, (long long)(x < ref->ndim ? ref->shape[x] : -1),
                       (int)t->ndim, (int)x, (long long)(x < t->ndim ? t->shape[x] : -1));
    }
    if (t->ndim >= 1 && t->shape[t->ndim - 1] > 1 && t->strides[t->ndim - 1] != 1)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, name, t->ndim - 1, -1,
                       "%s: the head dimension (D) must be contiguous (stride 1), found stride %lld", name,
                       (long long)t->strides[t->ndim - 1]);
    return MASKPACK_OK;
}

static maskpack_status check_lse(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int64_t hq,
                                 attn_view *view, maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 2, 3, err);
    if (s) return s;
    if (t->dtype != MASKPACK_F32)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected float32, found %s", name,
                       maskpack_dtype_name(t->dtype));
    int ok;
    if (L->packed && t->ndim == 2) {
        ok = t->shape[0] == hq && t->shape[1] == L->q_width;
        view->s_row = 0;
        view->s_h = t->strides[0];
        view->s_col = t->strides[1];
    } else {
        ok = t->ndim == 3 && t->shape[0] == L->n_rows && t->shape[1] == hq && t->shape[2] == L->q_width;
        view->s_row = t->ndim == 3 ? t->strides[0] : 0;
        view->s_h = t->ndim == 3 ? t->strides[1] : 0;
        view->s_col = t->ndim == 3 ? t->strides[2] : 0;
    }
    if (!ok) {
        if (L->packed)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                           "%s: expected [Hq, T] = [%lld, %lld] (or [1, %lld, %lld])", name, (long long)hq,
                           (long long)L->q_width, (long long)hq, (long long)L->q_width);
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1, "%s: expected [B, Hq, S] = [%lld, %lld, %lld]", name,
                       (long long)L->n_rows, (long long)hq, (long long)L->q_width);
    }
    view->base = t->data;
    return MASKPACK_OK;
}

/* Outputs must not overlap each other or any input. */
static maskpack_status check_overlaps(const maskpack_tensor *const *outs, const char *const *out_names, int n_out,
                                      const maskpack_tensor *const *ins, const char *const *in_names, int n_in,
                                      maskpack_error *err) {
    for (int a = 0; a < n_out; a++) {
        maskpack_status s;
        if (outs[a] && (s = mp_check_no_self_overlap(outs[a], out_names[a], err))) return s;
        for (int b = 0; b < n_in; b++)
            if (mp_tensors_overlap(outs[a], ins[b]))
                return mp_fail(err, MASKPACK_ERR_OVERLAP, out_names[a], -1, -1, "%s: overlaps the input %s",
                               out_names[a], in_names[b]);
        for (int b = a + 1; b < n_out; b++)
            if (mp_tensors_overlap(outs[a], outs[b]))
                return mp_fail(err, MASKPACK_ERR_OVERLAP, out_names[a], -1, -1, "%s: overlaps the output %s",
                               out_names[a], out_names[b]);
    }
    return MASKPACK_OK;
}

/* q, k, v against the layout and each other; fills P's shape fields and views. */
static maskpack_status check_qkv(const maskpack_layout *L, const maskpack_tensor *q, const maskpack_tensor *k,
                                 const maskpack_tensor *v, attn_problem *P, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    int64_t hq = 0, dq = 0, hk = 0, dk = 0, hv = 0, dv = 0;
    maskpack_status s;
    if ((s = check_heads_tensor(L, q, "q", 0, &P->q, &hq, &dq, err))) return s;
    if ((s = check_heads_tensor(L, k, "k", 1, &P->k, &hk, &dk, err))) return s;
    if ((s = check_heads_tensor(L, v, "v", 1, &P->v, &hv, &dv, err))) return s;
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return mp_fail(err, MASKPACK_ERR_DTYPE, k->dtype != q->dtype ? "k" : "v", -1, -1,
                       "%s: expected q's dtype %s, found %s", k->dtype != q->dtype ? "k" : "v",
                       maskpack_dtype_name(q->dtype), maskpack_dtype_name(k->dtype != q->dtype ? k->dtype : v->dtype));
    if (dq < 1 || dq > ATTN_MAX_D)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "q", q->ndim - 1, -1,
                       "q: head dim must be in [1, %d], found %lld", ATTN_MAX_D, (long long)dq);
    if (dk != dq || dv != dq)
        return mp_fail(err, MASKPACK_ERR_SHAPE, dk != dq ? "k" : "v", -1, -1,
                       "%s: expected head dim %lld (q's), found %lld", dk != dq ? "k" : "v", (long long)dq,
                       (long long)(dk != dq ? dk : dv));
    if (hv != hk)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1, "v: expected %lld heads (k's), found %lld", (long long)hk,
                       (long long)hv);
    if (hq < 1 || hk < 1 || hq % hk != 0)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "k", -1, -1,
                       "k: query heads (%lld) must be a positive multiple of key heads (%lld)", (long long)hq,
                       (long long)hk);
    if (L->max_q >= ((int64_t)1 << 30) || L->max_kv >= ((int64_t)1 << 30))
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", -1, -1,
                       "layout: segments longer than 2^30 tokens are not supported by the attention kernels");
    P->L = L;
    P->hq = hq;
    P->hkv = hk;
    P->group = hq / hk;
    P->d = dq;
    P->bf16 = q->dtype == MASKPACK_BF16;
    P->esize = maskpack_dtype_size(q->dtype);
    return MASKPACK_OK;
}

static maskpack_status check_scalars(attn_problem *P, double scale, double softcap, int n_threads,
                                     maskpack_error *err) {
    if (!isfinite(scale))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "scale", -1, -1,
                       "scale: expected a finite value (0 = 1/sqrt(D)), found %g", scale);
    if (!isfinite(softcap) || softcap < 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "softcap", -1, -1,
                       "softcap: expected 0 (none) or a finite value > 0, found %g", softcap);
    maskpack_status s = mp_check_threads(n_threads, "n_threads", err);
    if (s) return s;
    P->scale = scale == 0 ? 1.0 / sqrt((double)P->d) : scale;
    P->softcap = softcap;
    P->n_threads = n_threads;
    return MASKPACK_OK;
}

/* ---- work decomposition ------------------------------------------------------------------------ */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Number of (segment, head, block) items at block size bq. */
static int64_t count_items(const attn_problem *P, int32_t bq) {
    const maskpack_layout *L = P->L;
    int64_t n = 0;
    for (size_t k = 0; k < L->n_segments; k++) n += ceil_div(L->segs[k].q_len, bq);
    return n * P->hq;
}

int attn_fwd_claim(attn_fwd_job *job, size_t *b, size_t *e) {
    int64_t i;
    if (!mp_claim_take(job->claim, &i)) return 0;
    size_t x = (size_t)i;
    if (job->by_unit) {
        if (x < job->n_whole) {
            *b = job->unit_begin[x];
            *e = job->unit_begin[x + 1];
            return 1;
        }
        x = job->unit_begin[job->n_whole] + (x - job->n_whole); /* the tail, item by item */
    }
    *b = x;
    *e = x + 1;
    return 1;
}

/* Items ordered segment by segment and head by head (the query heads of one key head are
 * consecutive: a unit), the costliest (last) block first, so the dynamic schedule ends on short
 * items. unit_begin gets n_segments * hkv + 1 entries. */
static size_t fill_items(const attn_problem *P, int32_t bq, attn_item *items, size_t *unit_begin) {
    const maskpack_layout *L = P->L;
    size_t n = 0, u = 0;
    for (size_t k = 0; k < L->n_segments; k++) {
        int64_t ql = L->segs[k].q_len, nb = ceil_div(ql, bq);
        for (int32_t h = 0; h < P->hq; h++) {
            if (h % P->group == 0) unit_begin[u++] = n;
            for (int64_t b = nb - 1; b >= 0; b--) {
                int64_t i0 = b * bq;
                items[n++] = (attn_item){(int64_t)k, h, (int32_t)i0, (int32_t)(ql - i0 < bq ? ql - i0 : bq)};
            }
        }
    }
    unit_begin[u] = n;
    return n;
}

/* Key groups: per row, segments whose key ranges overlap (CP pieces of one sequence share theirs)
 * are one group; perm lists each group's segments. Returns the group count; *max_width is the
 * widest group key range. */
size_t attn_build_groups(const maskpack_layout *L, size_t *perm, attn_kgroup *groups, int64_t *max_width) {
    size_t ng = 0;
    *max_width = 0;
    for (int64_t r = 0; r < L->n_rows; r++) {
        size_t b = mp_row_begin(L, r), e = mp_row_begin(L, r + 1);
        /* insertion sort of this row's segments by kv_start (rows are short or already sorted) */
        for (size_t x = b; x < e; x++) {
            size_t y = x;
            perm[y] = x;
            while (y > b && L->segs[perm[y - 1]].kv_start > L->segs[perm[y]].kv_start) {
                size_t t = perm[y - 1];
                perm[y - 1] = perm[y];
                perm[y] = t;
                y--;
            }
        }
        size_t x = b;
        while (x < e) {
            const maskpack_segment *g = &L->segs[perm[x]];
            attn_kgroup G = {x, x + 1, r, g->kv_start, g->kv_start + g->kv_len, g->q_len};
            x++;
            /* an empty key range inside the group's joins it harmlessly (its queries see nothing) */
            while (x < e && L->segs[perm[x]].kv_start < G.kv_end) {
                const maskpack_segment *h = &L->segs[perm[x]];
                if (h->kv_start + h->kv_len > G.kv_end) G.kv_end = h->kv_start + h->kv_len;
                G.q_rows += h->q_len;
                G.seg_end = ++x;
            }
            if (G.kv_end - G.kv_start > *max_width) *max_width = G.kv_end - G.kv_start;
            groups[ng++] = G;
        }
    }
    return ng;
}

/* The number of groups and the widest one attn_build_groups finds, without its arrays (so a size
 * query allocates nothing). The groups depend only on the order of the key starts, ties in any
 * order: a row whose key starts already rise (every layout the constructors build) is walked in
 * place; any other row in key-start order by repeated selection (quadratic in that row's
 * segments, which only hand-built layouts reach). */
size_t attn_count_groups(const maskpack_layout *L, int64_t *max_width) {
    size_t ng = 0;
    *max_width = 0;
    for (int64_t r = 0; r < L->n_rows; r++) {
        const size_t b = mp_row_begin(L, r), e = mp_row_begin(L, r + 1);
        int sorted = 1;
        for (size_t x = b + 1; x < e && sorted; x++) sorted = L->segs[x - 1].kv_start <= L->segs[x].kv_start;
        int64_t start = 0, end = 0; /* the open group: keys [start, end) */
        int open = 0;
        size_t cur = SIZE_MAX; /* selection: the last segment visited */
        for (size_t step = b; step < e; step++) {
            size_t x = step;
            if (!sorted) { /* the next (kv_start, index) after cur's */
                x = SIZE_MAX;
                for (size_t y = b; y < e; y++) {
                    const int64_t ky = L->segs[y].kv_start;
                    if (cur != SIZE_MAX) {
                        const int64_t kc = L->segs[cur].kv_start;
                        if (ky < kc || (ky == kc && y <= cur)) continue;
                    }
                    if (x == SIZE_MAX || ky < L->segs[x].kv_start) x = y;
                }
                cur = x;
            }
            const maskpack_segment *g = &L->segs[x];
            if (open && g->kv_start < end) {
                if (g->kv_start + g->kv_len > end) end = g->kv_start + g->kv_len;
                continue;
            }
            if (open && end - start > *max_width) *max_width = end - start;
            start = g->kv_start;
            end = g->kv_start + g->kv_len;
            open = 1;
            ng++;
        }
        if (open && end - start > *max_width) *max_width = end - start;
    }
    return ng;
}

/* ---- padding ------------------------------------------------------------------------------------ */

/* Zeroes every row of a [.., W, H, D] tensor view whose column is not covered (mark[col] == 0). */
static void zero_uncovered(const attn_view *v, int64_t n_rows, int64_t width, int64_t heads, int64_t d, size_t esize,
                           const uint8_t *covered /* [n_rows * width] */) {
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t c = 0; c < width; c++) {
            if (covered[r * width + c]) continue;
            for (int64_t h = 0; h < heads; h++) memset(attn_ptr(v, r, c, h, esize), 0, (size_t)d * esize);
        }
}

/* Padding query rows: out (or dq) 0 and lse -inf. */
static void zero_query_padding(const attn_problem *P, const attn_view *o, int with_lse) {
    const maskpack_layout *L = P->L;
    for (int64_t r = 0; r < L->n_rows; r++) {
        int64_t col = 0;
        for (size_t x = mp_row_begin(L, r); x <= mp_row_begin(L, r + 1); x++) {
            int64_t end = x < mp_row_begin(L, r + 1) ? L->segs[x].q_start : L->q_width;
            for (; col < end; col++)
                for (int64_t h = 0; h < P->hq; h++) {
                    memset(attn_ptr(o, r, col, h, P->esize), 0, (size_t)P->d * P->esize);
                    if (with_lse) *(float *)attn_ptr(&P->lse, r, col, h, sizeof(float)) = -INFINITY;
                }
            if (x < mp_row_begin(L, r + 1)) col = L->segs[x].q_start + L->segs[x].q_len;
        }
    }
}

static size_t L_units(const attn_problem *P) { return P->L->n_segments * (size_t)P->hkv; }

/* ---- workspace --------------------------------------------------------------------------------- */

#define WS_ALIGN 64
static size_t align_up(size_t x) { return (x + WS_ALIGN - 1) & ~(size_t)(WS_ALIGN - 1); }

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The workspace serves every kernel of the table this CPU runs (the largest need among them), so
 * a size queried once serves whichever kernel a call selects. Only those kernels' sizing
 * functions are called: each sits inside its kernel's target region, where the compiler may use
 * that ISA's instructions. */
static size_t fwd_thread_ws(const attn_problem *P) {
    size_t m = 0;
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        if (!mp_isa_missing(ATTN_KERNELS[i].desc.isa)) m = max_sz(m, ATTN_KERNELS[i].fwd_ws(P));
    return align_up(m);
}

static size_t fwd_items_bytes(const attn_problem *P) {
    int64_t n = count_items(P, ATTN_AMX_BQ < ATTN_BQ ? ATTN_AMX_BQ : ATTN_BQ);
    size_t units = P->L->n_segments * (size_t)P->hkv + 1;
    return align_up((size_t)n * sizeof(attn_item)) + align_up(units * sizeof(size_t));
}

static maskpack_status fwd_ws_size(const attn_problem *P, size_t *bytes, maskpack_error *err) {
    size_t per = fwd_thread_ws(P), items = fwd_items_bytes(P);
    size_t total = WS_ALIGN + items;
    if (per > (SIZE_MAX - total) / (size_t)P->n_threads)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    *bytes = total + per * (size_t)P->n_threads;
    return MASKPACK_OK;
}

/* Tail units of the backward's dynamic mode (see attn_bwd_job), when there are enough units for
 * that mode and more than one thread: n_threads - 1 of them, the most the whole units can leave
 * the threads apart by (one unit each), so on a quiet machine the tail fills that gap and only one
 * pack and reduction per tail unit is added. */
static int64_t bwd_tail_units(const attn_problem *P, int64_t n_units) {
    return P->n_threads > 1 && n_units >= 2 * (int64_t)P->n_threads ? P->n_threads - 1 : 0;
}

/* Bytes of the backward's tail partials and per-thread workspace: the largest among the kernels
 * this CPU runs, as for the forward. */
static size_t bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail) {
    size_t m = 0;
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        if (ATTN_KERNELS[i].bwd_tail_bytes && !mp_isa_missing(ATTN_KERNELS[i].desc.isa))
            m = max_sz(m, ATTN_KERNELS[i].bwd_tail_bytes(P, max_width, n_tail));
    return m;
}

static size_t bwd_thread_ws(const attn_problem *P, int64_t max_width) {
    size_t m = 0;
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        if (!mp_isa_missing(ATTN_KERNELS[i].desc.isa)) m = max_sz(m, ATTN_KERNELS[i].bwd_ws(P, max_width));
    return align_up(m);
}

static maskpack_status bwd_ws_size(const attn_problem *P, size_t *bytes, maskpack_error *err) {
    const maskpack_layout *L = P->L;
    size_t n = L->n_segments ? L->n_segments : 1;
    int64_t w; /* the exact widest group (the per-thread workspace grows with it) */
    size_t ng = attn_count_groups(L, &w);
    size_t per = bwd_thread_ws(P, w);
    size_t total = WS_ALIGN + align_up(n * sizeof(size_t)) + align_up(n * sizeof(attn_kgroup)) +
                   align_up((size_t)(L->n_rows * (L->q_width > L->kv_width ? L->q_width : L->kv_width))) +
                   align_up(bwd_tail_bytes(P, w, bwd_tail_units(P, (int64_t)ng * P->hkv)));
    if (per > (SIZE_MAX - total) / (size_t)P->n_threads)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    *bytes = total + per * (size_t)P->n_threads;
    return MASKPACK_OK;
}

/* ---- forward ------------------------------------------------------------------------------------- */

/* The (isa, n_threads) a run needs besides its tensors: the plain calls' n_threads, a team's
 * participant count (the _on calls) or the op's. */
static maskpack_status check_fwd(const maskpack_layout *layout, const maskpack_tensor *q, const maskpack_tensor *k,
                                 const maskpack_tensor *v, double scale, double softcap, maskpack_tensor *out,
                                 maskpack_tensor *lse, int n_threads, attn_problem *P, maskpack_error *err) {
    memset(P, 0, sizeof *P);
    maskpack_status s = check_qkv(layout, q, k, v, P, err);
    if (s) return s;
    MP_CHECK_NULL(err, out, "out");
    if ((s = check_same(out, "out", q, "q", err))) return s;
    if ((s = check_heads_tensor(layout, out, "out", 0, &P->out, &(int64_t){0}, &(int64_t){0}, err))) return s;
    if (lse) {
        if ((s = check_lse(layout, lse, "lse", P->hq, &P->lse, err))) return s;
        P->have_lse = 1;
    }
    if ((s = check_scalars(P, scale, softcap, n_threads, err))) return s;
    const maskpack_tensor *outs[2] = {out, lse};
    const char *on[2] = {"out", "lse"};
    const maskpack_tensor *ins[3] = {q, k, v};
    const char *in[3] = {"q", "k", "v"};
    return check_overlaps(outs, on, 2, ins, in, 3, err);
}

/* A forward planned: its kernel, work list and how the shares deal it out. */
typedef struct fwd_plan {
    const attn_kernel *kern;
    const attn_item *items;
    const size_t *unit_begin;
    size_t n_items, n_units, n_whole;
    int nt, by_unit;
} fwd_plan;

/* items / unit_begin: fwd_items_bytes' arrays (count_items at the smallest block, units + 1). */
static void plan_fwd(const attn_problem *P, attn_item *items, size_t *unit_begin, fwd_plan *F) {
    F->kern = attn_fwd_entry(P);
    F->n_items = fill_items(P, P->bf16 ? F->kern->bq_bf16 : ATTN_BQ, items, unit_begin);
    F->items = items;
    F->unit_begin = unit_begin;
    F->n_units = L_units(P);
    int nt = P->n_threads;
    if ((size_t)nt > F->n_items) nt = F->n_items ? (int)F->n_items : 1;
    F->nt = nt;
    /* whole units per share when there are enough of them to keep every share busy */
    F->by_unit = F->n_units >= 4 * (size_t)nt;
    /* the last nt - 1 units item by item: on a quiet machine the whole units leave the threads at
     * most one unit apart, which that tail fills without a second thread packing its keys */
    F->n_whole = F->by_unit ? F->n_units - (size_t)(nt - 1) : 0;
}

/* Validated, planned and with its workspace (thr: P->n_threads areas of fwd_thread_ws bytes):
 * from here on only writes. */
static void exec_fwd(const attn_problem *P, const fwd_plan *F, const mp_run *run, char *thr) {
    /* claims: whole units [0, n_whole), then the rest item by item (attn_fwd_claim) */
    mp_claim claim;
    mp_claim_init(&claim,
                  F->by_unit ? (int64_t)(F->n_whole + F->n_items - F->unit_begin[F->n_whole]) : (int64_t)F->n_items);
    attn_fwd_job job = {P,          F->items,   F->n_items, &claim, thr, fwd_thread_ws(P), F->unit_begin,
                        F->n_units, F->by_unit, F->n_whole};
    zero_query_padding(P, &P->out, P->have_lse);
    if (F->n_items) run_shares(run, F->nt, P->bf16 ? F->kern->fwd_bf16 : F->kern->fwd_f32, &job);
}

/* The plain and _on calls: the work list carved from the workspace (fwd_ws_size's layout). start:
 * no team given, start one of the plan's threads for this call (one that cannot start leaves the
 * work to the caller, with the same results). */
static maskpack_status fwd_call(attn_problem *P, maskpack_workers *team, int start, void *workspace,
                                size_t workspace_bytes, maskpack_error *err) {
    size_t need = 0;
    maskpack_status s = fwd_ws_size(P, &need, err);
    if (s) return s;
    void *owned = NULL;
    if ((s = mp_take_workspace(workspace, workspace_bytes, need, "maskpack_attention_forward_workspace", &workspace,
                               &owned, err)))
        return s;
    char *ws = (char *)(((uintptr_t)workspace + WS_ALIGN - 1) & ~(uintptr_t)(WS_ALIGN - 1));
    size_t *unit_begin =
        (size_t *)(ws +
                   align_up((size_t)count_items(P, ATTN_AMX_BQ < ATTN_BQ ? ATTN_AMX_BQ : ATTN_BQ) * sizeof(attn_item)));
    fwd_plan F;
    plan_fwd(P, (attn_item *)ws, unit_begin, &F);
    mp_run run;
    mp_run_begin(&run, team, start ? F.nt : 1, F.nt);
    exec_fwd(P, &F, &run, ws + fwd_items_bytes(P));
    mp_run_end(&run);
    free(owned);
    return mp_ok(err);
}

/* opts or the defaults (NULL). */
static maskpack_kernel_options opts_or_default(const maskpack_kernel_options *opts) {
    return opts ? *opts : maskpack_kernel_options_default();
}

maskpack_status maskpack_attention_forward_workspace(const maskpack_layout *layout, const maskpack_tensor *q,
                                                     const maskpack_tensor *k, const maskpack_tensor *v,
                                                     const maskpack_kernel_options *opts, size_t *bytes,
                                                     maskpack_error *err) {
    MP_CHECK_NULL(err, bytes, "bytes");
    attn_problem P;
    memset(&P, 0, sizeof P);
    maskpack_status s = check_qkv(layout, q, k, v, &P, err);
    if (s) return s;
    if ((s = check_scalars(&P, 0, 0, opts_or_default(opts).n_threads, err))) return s;
    if ((s = fwd_ws_size(&P, bytes, err))) return s;
    return mp_ok(err);
}

/* (requested isa, q's dtype) -> P->isa: the table entry the call runs. */
static maskpack_status pick_isa(attn_problem *P, maskpack_isa isa, maskpack_dtype dtype, maskpack_error *err) {
    size_t i;
    maskpack_status s = mp_kernel_pick(MASKPACK_KERNEL_ATTENTION, dtype, isa, &i, err);
    if (s) return s;
    P->isa = ATTN_KERNELS[i].desc.isa;
    return MASKPACK_OK;
}

maskpack_status maskpack_attention_forward(const maskpack_layout *layout, const maskpack_tensor *q,
                                           const maskpack_tensor *k, const maskpack_tensor *v, double scale,
                                           double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                           const maskpack_kernel_options *opts, void *workspace, size_t workspace_bytes,
                                           maskpack_error *err) {
    const maskpack_kernel_options o = opts_or_default(opts);
    attn_problem P;
    maskpack_status s = check_fwd(layout, q, k, v, scale, softcap, out, lse, o.n_threads, &P, err);
    if (s || (s = pick_isa(&P, o.isa, q->dtype, err))) return s;
    return fwd_call(&P, NULL, 1, workspace, workspace_bytes, err);
}

maskpack_status maskpack_attention_forward_on(const maskpack_layout *layout, const maskpack_tensor *q,
                                              const maskpack_tensor *k, const maskpack_tensor *v, double scale,
                                              double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                              const maskpack_kernel_options *opts, maskpack_workers *team,
                                              void *workspace, size_t workspace_bytes, maskpack_error *err) {
    const maskpack_kernel_options o = opts_or_default(opts);
    attn_problem P;
    maskpack_status s = check_fwd(layout, q, k, v, scale, softcap, out, lse, maskpack_workers_threads(team), &P, err);
    if (s || (s = pick_isa(&P, o.isa, q->dtype, err))) return s;
    return fwd_call(&P, team, 0, workspace, workspace_bytes, err);
}

/* ---- backward ------------------------------------------------------------------------------------ */

static maskpack_status check_bwd(const maskpack_layout *layout, const maskpack_tensor *dout, const maskpack_tensor *q,
                                 const maskpack_tensor *k, const maskpack_tensor *v, const maskpack_tensor *out,
                                 const maskpack_tensor *lse, double scale, double softcap, maskpack_tensor *dq,
                                 maskpack_tensor *dk, maskpack_tensor *dv, int n_threads, attn_problem *P,
                                 maskpack_error *err) {
    memset(P, 0, sizeof *P);
    maskpack_status s = check_qkv(layout, q, k, v, P, err);
    if (s) return s;
    int64_t scratch_h, scratch_d;
    MP_CHECK_NULL(err, out, "out");
    MP_CHECK_NULL(err, dout, "dout");
    MP_CHECK_NULL(err, lse, "lse");
    MP_CHECK_NULL(err, dq, "dq");
    MP_CHECK_NULL(err, dk, "dk");
    MP_CHECK_NULL(err, dv, "dv");
    if ((s = check_same(out, "out", q, "q", err))) return s;
    if ((s = check_heads_tensor(layout, out, "out", 0, &P->out, &scratch_h, &scratch_d, err))) return s;
    if ((s = check_same(dout, "dout", q, "q", err))) return s;
    if ((s = check_heads_tensor(layout, dout, "dout", 0, &P->dout, &scratch_h, &scratch_d, err))) return s;
    if ((s = check_lse(layout, lse, "lse", P->hq, &P->lse, err))) return s;
    P->have_lse = 1;
    if ((s = check_same(dq, "dq", q, "q", err))) return s;
    if ((s = check_heads_tensor(layout, dq, "dq", 0, &P->dq, &scratch_h, &scratch_d, err))) return s;
    if ((s = check_same(dk, "dk", k, "k", err))) return s;
    if ((s = check_heads_tensor(layout, dk, "dk", 1, &P->dk, &scratch_h, &scratch_d, err))) return s;
    if ((s = check_same(dv, "dv", v, "v", err))) return s;
    if ((s = check_heads_tensor(layout, dv, "dv", 1, &P->dv, &scratch_h, &scratch_d, err))) return s;
    if ((s = check_scalars(P, scale, softcap, n_threads, err))) return s;
    const maskpack_tensor *outs[3] = {dq, dk, dv};
    const char *on[3] = {"dq", "dk", "dv"};
    const maskpack_tensor *ins[6] = {dout, q, k, v, out, lse};
    const char *in[6] = {"dout", "q", "k", "v", "out", "lse"};
    return check_overlaps(outs, on, 3, ins, in, 6, err);
}

/* A backward planned: its kernel, key groups (through perm), the key columns some group owns
 * (covered, [n_rows * kv_width]: the others get dk = dv = 0) and the per-share workspace. */
typedef struct bwd_plan {
    const attn_kernel *kern;
    const size_t *perm;
    const attn_kgroup *groups;
    const uint8_t *covered;
    size_t ng, per;
    int64_t max_width, n_tail;
} bwd_plan;

static size_t covered_bytes(const maskpack_layout *L) { return (size_t)(L->n_rows * L->kv_width); }

static void plan_bwd(const attn_problem *P, size_t *perm, attn_kgroup *groups, uint8_t *covered, bwd_plan *B) {
    const maskpack_layout *L = P->L;
    B->kern = attn_entry(P->isa);
    B->ng = attn_build_groups(L, perm, groups, &B->max_width);
    B->perm = perm;
    B->groups = groups;
    B->covered = covered;
    B->per = bwd_thread_ws(P, B->max_width);
    B->n_tail = bwd_tail_units(P, (int64_t)B->ng * P->hkv);
    memset(covered, 0, covered_bytes(L));
    for (size_t g = 0; g < B->ng; g++)
        if (groups[g].kv_end > groups[g].kv_start)
            memset(covered + groups[g].row * L->kv_width + groups[g].kv_start, 1,
                   (size_t)(groups[g].kv_end - groups[g].kv_start));
}

/* Validated, planned and with its workspace (tail_acc: bwd_tail_bytes; thr: P->n_threads areas of
 * B->per bytes): from here on only writes. */
static void exec_bwd(const attn_problem *P0, const bwd_plan *B, const mp_run *run, float *tail_acc, char *thr) {
    attn_problem P = *P0;
    const maskpack_layout *L = P.L;
    /* padding: dq rows of pad queries, dk/dv rows of keys no segment owns */
    zero_query_padding(&P, &P.dq, 0);
    zero_uncovered(&P.dk, L->n_rows, L->kv_width, P.hkv, P.d, P.esize, B->covered);
    zero_uncovered(&P.dv, L->n_rows, L->kv_width, P.hkv, P.d, P.esize, B->covered);

    /* groups list their segments through perm (seg_begin / seg_end index perm) */
    attn_bwd_job job;
    memset(&job, 0, sizeof job);
    mp_claim claim;
    job.P = &P;
    job.groups = B->groups;
    job.n_groups = B->ng;
    job.n_units = (int64_t)B->ng * P.hkv;
    job.claim = &claim;
    job.ws = thr;
    job.ws_stride = B->per;
    /* the reference kernel has no reductions: it neither splits units nor keeps a tail */
    const attn_thread_fn fn = B->kern->bwd, tail_reduce = B->kern->bwd_tail_reduce;
    void (*const reduce)(const attn_bwd_job *, int64_t) = B->kern->bwd_reduce;
    const int vector = reduce != NULL;
    job.unit = -1;
    /* units: dynamic over the shares when there are enough of them, else one at a time with their
     * query blocks split over the shares (each share accumulates dk/dv privately, then they are
     * summed in share order: deterministic) */
    int nt = P.n_threads;
    if (job.n_units == 0) nt = 1;
    job.split = nt > 1 && job.n_units < 2 * (int64_t)nt && vector;
    P.n_threads = nt;
    job.n_threads = nt;
    job.perm = B->perm;
    /* the tail pieces (n_tail is 0 unless the dynamic mode runs on several shares) */
    job.n_whole = vector && !job.split ? job.n_units - B->n_tail : job.n_units;
    job.tail_acc = tail_acc;
    job.max_width = B->max_width;
    /* claims of the dynamic mode: whole units [0, n_whole), then each tail unit's pieces */
    mp_claim_init(&claim, job.n_whole + (job.n_units - job.n_whole) * ATTN_BWD_TAIL_CHUNKS);
    if (job.n_units > 0) {
        if (!job.split) {
            run_shares(run, nt, fn, &job);
            if (job.n_whole < job.n_units) run_shares(run, nt, tail_reduce, &job);
        } else {
            for (int64_t u = 0; u < job.n_units; u++) {
                job.unit = u;
                run_shares(run, nt, fn, &job);
                reduce(&job, u);
            }
        }
    }
}

/* The plain and _on calls: groups, covered and the rest carved from the workspace (bwd_ws_size's
 * layout); start as for fwd_call. */
static maskpack_status bwd_call(attn_problem *P, maskpack_workers *team, int start, void *workspace,
                                size_t workspace_bytes, maskpack_error *err) {
    size_t need = 0;
    maskpack_status s = bwd_ws_size(P, &need, err);
    if (s) return s;
    void *owned = NULL;
    if ((s = mp_take_workspace(workspace, workspace_bytes, need, "maskpack_attention_backward_workspace", &workspace,
                               &owned, err)))
        return s;
    const maskpack_layout *L = P->L;
    char *ws = (char *)(((uintptr_t)workspace + WS_ALIGN - 1) & ~(uintptr_t)(WS_ALIGN - 1));
    size_t n = L->n_segments ? L->n_segments : 1;
    size_t *perm = (size_t *)ws;
    ws += align_up(n * sizeof(size_t));
    attn_kgroup *groups = (attn_kgroup *)ws;
    ws += align_up(n * sizeof(attn_kgroup));
    uint8_t *covered = (uint8_t *)ws;
    int64_t wmax_grid = L->q_width > L->kv_width ? L->q_width : L->kv_width;
    ws += align_up((size_t)(L->n_rows * wmax_grid));
    bwd_plan B;
    plan_bwd(P, perm, groups, covered, &B);
    float *tail_acc = (float *)ws;
    ws += align_up(bwd_tail_bytes(P, B.max_width, B.n_tail));
    const int64_t n_units = (int64_t)B.ng * P->hkv;
    mp_run run;
    mp_run_begin(&run, team, start ? P->n_threads : 1, n_units > 0 ? P->n_threads : 0);
    exec_bwd(P, &B, &run, tail_acc, ws);
    mp_run_end(&run);
    free(owned);
    return mp_ok(err);
}

maskpack_status maskpack_attention_backward_workspace(const maskpack_layout *layout, const maskpack_tensor *q,
                                                      const maskpack_tensor *k, const maskpack_tensor *v,
                                                      const maskpack_kernel_options *opts, size_t *bytes,
                                                      maskpack_error *err) {
    MP_CHECK_NULL(err, bytes, "bytes");
    attn_problem P;
    memset(&P, 0, sizeof P);
    maskpack_status s = check_qkv(layout, q, k, v, &P, err);
    if (s) return s;
    if ((s = check_scalars(&P, 0, 0, opts_or_default(opts).n_threads, err))) return s;
    if ((s = bwd_ws_size(&P, bytes, err))) return s;
    return mp_ok(err);
}

maskpack_status maskpack_attention_backward(const maskpack_layout *layout, const maskpack_tensor *dout,
                                            const maskpack_tensor *q, const maskpack_tensor *k,
                                            const maskpack_tensor *v, const maskpack_tensor *out,
                                            const maskpack_tensor *lse, double scale, double softcap,
                                            maskpack_tensor *dq, maskpack_tensor *dk, maskpack_tensor *dv,
                                            const maskpack_kernel_options *opts, void *workspace,
                                            size_t workspace_bytes, maskpack_error *err) {
    const maskpack_kernel_options o = opts_or_default(opts);
    attn_problem P;
    maskpack_status s = check_bwd(layout, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, o.n_threads, &P, err);
    if (s || (s = pick_isa(&P, o.isa, q->dtype, err))) return s;
    return bwd_call(&P, NULL, 1, workspace, workspace_bytes, err);
}

maskpack_status maskpack_attention_backward_on(const maskpack_layout *layout, const maskpack_tensor *dout,
                                               const maskpack_tensor *q, const maskpack_tensor *k,
                                               const maskpack_tensor *v, const maskpack_tensor *out,
                                               const maskpack_tensor *lse, double scale, double softcap,
                                               maskpack_tensor *dq, maskpack_tensor *dk, maskpack_tensor *dv,
                                               const maskpack_kernel_options *opts, maskpack_workers *team,
                                               void *workspace, size_t workspace_bytes, maskpack_error *err) {
    const maskpack_kernel_options o = opts_or_default(opts);
    attn_problem P;
    maskpack_status s =
        check_bwd(layout, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, maskpack_workers_threads(team), &P, err);
    if (s || (s = pick_isa(&P, o.isa, q->dtype, err))) return s;
    return bwd_call(&P, team, 0, workspace, workspace_bytes, err);
}

/* ---- the operator object ----------------------------------------------------------------------- */

/* What every call would plan anew, planned once per (layout, heads, head dim, dtype, ISA, threads):
 * the kernel (MASKPACK_ISA read at creation for AUTO), the forward's work list with its units, the
 * backward's key groups and covered key columns; and, for runs given no workspace, a workspace kept
 * between runs. A run validates its tensors and writes, nothing more. */
struct maskpack_attention_op {
    const maskpack_layout *L; /* the caller's; it outlives the op */
    attn_problem dims;        /* L, hq, hkv, group, d, bf16, esize, n_threads, isa (no views) */
    maskpack_dtype dtype;
    fwd_plan F;
    bwd_plan B;
    void *plans;           /* one allocation: items, unit_begin, perm, groups, covered */
    size_t fwd_ws, bwd_ws; /* bytes of the runs' workspace (op_ws_layout) */
    mp_op_ws ws;           /* kept for the runs that bring no workspace */
};

/* A run's workspace: per-share areas (forward) or the tail partials then the per-share areas
 * (backward), from the block's first 64-byte boundary. */
static maskpack_status op_ws_sizes(maskpack_attention_op *o, maskpack_error *err) {
    const attn_problem *P = &o->dims;
    size_t fper = fwd_thread_ws(P), bper = o->B.per, tail = align_up(bwd_tail_bytes(P, o->B.max_width, o->B.n_tail));
    size_t nt = (size_t)P->n_threads;
    if (fper > (SIZE_MAX - WS_ALIGN) / nt || bper > (SIZE_MAX - WS_ALIGN - tail) / nt)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    o->fwd_ws = WS_ALIGN + fper * nt;
    o->bwd_ws = WS_ALIGN + tail + bper * nt;
    return MASKPACK_OK;
}

maskpack_status maskpack_attention_op_create(const maskpack_layout *layout, int64_t hq, int64_t hkv, int64_t d,
                                             maskpack_dtype dtype, const maskpack_kernel_options *opts,
                                             maskpack_attention_op **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    *out = NULL;
    MP_CHECK_NULL(err, layout, "layout");
    if (!(ATTN_DTYPES & MP_DT(dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, "dtype", -1, -1, "dtype: expected float32 or bfloat16, found %s",
                       maskpack_dtype_name(dtype));
    if (d < 1 || d > ATTN_MAX_D)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "d", -1, -1, "d: head dim must be in [1, %d], found %lld",
                       ATTN_MAX_D, (long long)d);
    if (hq < 1 || hkv < 1 || hq % hkv != 0 || hq > INT32_MAX)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "hkv", -1, -1,
                       "hkv: query heads (%lld) must be a positive multiple of key heads (%lld)", (long long)hq,
                       (long long)hkv);
    if (layout->max_q >= ((int64_t)1 << 30) || layout->max_kv >= ((int64_t)1 << 30))
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", -1, -1,
                       "layout: segments longer than 2^30 tokens are not supported by the attention kernels");
    attn_problem P;
    memset(&P, 0, sizeof P);
    P.L = layout;
    P.hq = hq;
    P.hkv = hkv;
    P.group = hq / hkv;
    P.d = d;
    P.bf16 = dtype == MASKPACK_BF16;
    P.esize = maskpack_dtype_size(dtype);
    const maskpack_kernel_options ko = opts_or_default(opts);
    maskpack_status s = check_scalars(&P, 0, 0, ko.n_threads, err);
    if (s || (s = pick_isa(&P, ko.isa, dtype, err))) return s;
    const maskpack_layout *L = layout;
    size_t n_items = (size_t)count_items(&P, ATTN_AMX_BQ < ATTN_BQ ? ATTN_AMX_BQ : ATTN_BQ);
    size_t n_units = L_units(&P) + 1, n = L->n_segments ? L->n_segments : 1;
    size_t a_items = align_up(n_items * sizeof(attn_item)), a_units = align_up(n_units * sizeof(size_t));
    size_t a_perm = align_up(n * sizeof(size_t)), a_groups = align_up(n * sizeof(attn_kgroup));
    size_t total = a_items + a_units + a_perm + a_groups + align_up(covered_bytes(L));
    maskpack_attention_op *o = calloc(1, sizeof *o);
    char *mem = o ? aligned_alloc(WS_ALIGN, total ? total : WS_ALIGN) : NULL;
    if (!mem) {
        free(o);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "op", -1, -1, "out of memory for the op's %zu bytes of plans",
                       total);
    }
    o->L = layout;
    o->dims = P;
    o->dtype = dtype;
    o->plans = mem;
    plan_fwd(&o->dims, (attn_item *)mem, (size_t *)(mem + a_items), &o->F);
    char *b = mem + a_items + a_units;
    plan_bwd(&o->dims, (size_t *)b, (attn_kgroup *)(b + a_perm), (uint8_t *)(b + a_perm + a_groups), &o->B);
    if ((s = op_ws_sizes(o, err))) {
        free(mem);
        free(o);
        return s;
    }
    mp_op_ws_init(&o->ws);
    *out = o;
    return mp_ok(err);
}

void maskpack_attention_op_free(maskpack_attention_op *op) {
    if (!op) return;
    mp_op_ws_free(&op->ws);
    free(op->plans);
    free(op);
}

maskpack_status maskpack_attention_op_workspace_size(const maskpack_attention_op *op, int backward, size_t *bytes,
                                                     maskpack_error *err) {
    MP_CHECK_NULL(err, op, "op");
    MP_CHECK_NULL(err, bytes, "bytes");
    *bytes = backward ? op->bwd_ws : op->fwd_ws;
    return mp_ok(err);
}

/* A run's tensors against the op: q's heads, head dim and dtype, k's heads must be the op's. */
static maskpack_status check_op_dims(const maskpack_attention_op *op, const attn_problem *P, maskpack_dtype dtype,
                                     maskpack_error *err) {
    const attn_problem *D = &op->dims;
    if (P->hq != D->hq || P->d != D->d)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "q", -1, -1,
                       "q: expected the op's Hq = %lld, D = %lld ([.., Hq, D]), found Hq = %lld, D = %lld",
                       (long long)D->hq, (long long)D->d, (long long)P->hq, (long long)P->d);
    if (P->hkv != D->hkv)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "k", -1, -1, "k: expected the op's Hkv = %lld heads, found %lld",
                       (long long)D->hkv, (long long)P->hkv);
    if (dtype != op->dtype)
        return mp_fail(err, MASKPACK_ERR_DTYPE, "q", -1, -1, "q: expected the op's dtype %s, found %s",
                       maskpack_dtype_name(op->dtype), maskpack_dtype_name(dtype));
    return MASKPACK_OK;
}

/* The op's run after its tensors: the team (at most the op's threads), the workspace (the caller's,
 * or NULL and 0: the op's own, kept; NULL with a size is MASKPACK_ERR_NULL_ARGUMENT), then writes. */
static maskpack_status op_exec(maskpack_attention_op *op, attn_problem *P, int backward, maskpack_workers *team,
                               void *workspace, size_t workspace_bytes, maskpack_error *err) {
    const int nt = maskpack_workers_threads(team);
    if (nt > op->dims.n_threads)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "team", -1, -1,
                       "team: expected at most the op's %d threads (n_threads), found %d", op->dims.n_threads, nt);
    P->n_threads = op->dims.n_threads;
    P->isa = op->dims.isa;
    const size_t need = backward ? op->bwd_ws : op->fwd_ws;
    void *owned = NULL, *block = NULL;
    maskpack_status s;
    /* without a workspace: the op's own, kept, at the larger of the two directions' sizes: which
     * direction needs more depends on the CPU (the forward's per-share area is the largest among the
     * kernels the CPU runs, so an AMX host's forward outgrows the backward), and a workspace sized by
     * the first run would be reallocated by the other direction's first run */
    const int kept =
        mp_op_ws_take(&op->ws, op->fwd_ws > op->bwd_ws ? op->fwd_ws : op->bwd_ws, &workspace, &workspace_bytes);
    s = mp_take_workspace(workspace, workspace_bytes, need, "maskpack_attention_op_workspace_size", &block, &owned,
                          err);
    if (!s) {
        char *ws = (char *)(((uintptr_t)block + WS_ALIGN - 1) & ~(uintptr_t)(WS_ALIGN - 1));
        mp_run run;
        mp_run_begin(&run, team, 1, 0); /* the caller's team, or the caller alone */
        if (!backward) {
            exec_fwd(P, &op->F, &run, ws);
        } else {
            char *thr = ws + align_up(bwd_tail_bytes(P, op->B.max_width, op->B.n_tail));
            exec_bwd(P, &op->B, &run, (float *)ws, thr);
        }
        free(owned);
        s = mp_ok(err);
    }
    if (kept) mp_op_ws_release(&op->ws);
    return s;
}

maskpack_status maskpack_attention_op_forward(maskpack_attention_op *op, const maskpack_tensor *q,
                                              const maskpack_tensor *k, const maskpack_tensor *v, double scale,
                                              double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                              maskpack_workers *team, void *workspace, size_t workspace_bytes,
                                              maskpack_error *err) {
    MP_CHECK_NULL(err, op, "op");
    attn_problem P;
    maskpack_status s = check_fwd(op->L, q, k, v, scale, softcap, out, lse, 1, &P, err);
    if (s || (s = check_op_dims(op, &P, q->dtype, err))) return s;
    return op_exec(op, &P, 0, team, workspace, workspace_bytes, err);
}

maskpack_status maskpack_attention_op_backward(maskpack_attention_op *op, const maskpack_tensor *dout,
                                               const maskpack_tensor *q, const maskpack_tensor *k,
                                               const maskpack_tensor *v, const maskpack_tensor *out,
                                               const maskpack_tensor *lse, double scale, double softcap,
                                               maskpack_tensor *dq, maskpack_tensor *dk, maskpack_tensor *dv,
                                               maskpack_workers *team, void *workspace, size_t workspace_bytes,
                                               maskpack_error *err) {
    MP_CHECK_NULL(err, op, "op");
    attn_problem P;
    maskpack_status s = check_bwd(op->L, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, 1, &P, err);
    if (s || (s = check_op_dims(op, &P, q->dtype, err))) return s;
    return op_exec(op, &P, 1, team, workspace, workspace_bytes, err);
}
