/* attn_api.c: the public attention entry points (include/maskpack.h): argument validation
 * (everything is checked before anything is written), the plain and _on calls, and the op, which
 * keeps a plan between runs. The work itself is planned and run by attn_plan.c over the kernels of
 * attn_table.c. */
#include "attn_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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


/* opts or the defaults (NULL). */
static maskpack_kernel_options opts_or_default(const maskpack_kernel_options *opts) {
    return opts ? *opts : maskpack_kernel_options_default();
}

/* The workspace queries: (layout, q, k, v, opts) checked as a call checks them, then the direction's
 * size (attn_fwd_ws_size or attn_bwd_ws_size). */
static maskpack_status ws_query(const maskpack_layout *layout, const maskpack_tensor *q, const maskpack_tensor *k,
                                const maskpack_tensor *v, const maskpack_kernel_options *opts, size_t *bytes,
                                maskpack_status (*size)(const attn_problem *, size_t *, maskpack_error *),
                                maskpack_error *err) {
    MP_CHECK_NULL(err, bytes, "bytes");
    attn_problem P;
    memset(&P, 0, sizeof P);
    maskpack_status s = check_qkv(layout, q, k, v, &P, err);
    if (s) return s;
    if ((s = check_scalars(&P, 0, 0, opts_or_default(opts).n_threads, err))) return s;
    if ((s = size(&P, bytes, err))) return s;
    return mp_ok(err);
}

maskpack_status maskpack_attention_forward_workspace(const maskpack_layout *layout, const maskpack_tensor *q,
                                                     const maskpack_tensor *k, const maskpack_tensor *v,
                                                     const maskpack_kernel_options *opts, size_t *bytes,
                                                     maskpack_error *err) {
    return ws_query(layout, q, k, v, opts, bytes, attn_fwd_ws_size, err);
}


maskpack_status maskpack_attention_forward(const maskpack_layout *layout, const maskpack_tensor *q,
                                           const maskpack_tensor *k, const maskpack_tensor *v, double scale,
                                           double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                           const maskpack_kernel_options *opts, void *workspace, size_t workspace_bytes,
                                           maskpack_error *err) {
    const maskpack_kernel_options o = opts_or_default(opts);
    attn_problem P;
    maskpack_status s = check_fwd(layout, q, k, v, scale, softcap, out, lse, o.n_threads, &P, err);
    if (s || (s = attn_pick_isa(&P, o.isa, q->dtype, err))) return s;
    return attn_fwd_call(&P, NULL, 1, workspace, workspace_bytes, err);
}

maskpack_status maskpack_attention_forward_on(const maskpack_layout *layout, const maskpack_tensor *q,
                                              const maskpack_tensor *k, const maskpack_tensor *v, double scale,
                                              double softcap, maskpack_tensor *out, maskpack_tensor *lse,
                                              const maskpack_kernel_options *opts, maskpack_workers *team,
                                              void *workspace, size_t workspace_bytes, maskpack_error *err) {
    const maskpack_kernel_options o = opts_or_default(opts);
    attn_problem P;
    maskpack_status s = check_fwd(layout, q, k, v, scale, softcap, out, lse, maskpack_workers_threads(team), &P, err);
    if (s || (s = attn_pick_isa(&P, o.isa, q->dtype, err))) return s;
    return attn_fwd_call(&P, team, 0, workspace, workspace_bytes, err);
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


maskpack_status maskpack_attention_backward_workspace(const maskpack_layout *layout, const maskpack_tensor *q,
                                                      const maskpack_tensor *k, const maskpack_tensor *v,
                                                      const maskpack_kernel_options *opts, size_t *bytes,
                                                      maskpack_error *err) {
    return ws_query(layout, q, k, v, opts, bytes, attn_bwd_ws_size, err);
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
    if (s || (s = attn_pick_isa(&P, o.isa, q->dtype, err))) return s;
    return attn_bwd_call(&P, NULL, 1, workspace, workspace_bytes, err);
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
    if (s || (s = attn_pick_isa(&P, o.isa, q->dtype, err))) return s;
    return attn_bwd_call(&P, team, 0, workspace, workspace_bytes, err);
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
    attn_fwd_plan F;
    attn_bwd_plan B;
    void *plans;           /* one allocation: items, unit_begin, perm, groups, covered */
    size_t fwd_ws, bwd_ws; /* bytes of the runs' workspace (op_ws_layout) */
    mp_op_ws ws;           /* kept for the runs that bring no workspace */
};

/* A run's workspace: per-share areas (forward) or the tail partials then the per-share areas
 * (backward), from the block's first 64-byte boundary. */
static maskpack_status op_ws_sizes(maskpack_attention_op *o, maskpack_error *err) {
    const attn_problem *P = &o->dims;
    size_t fper = attn_fwd_thread_ws(P), bper = o->B.per,
           tail = attn_align_up(attn_bwd_tail_bytes(P, o->B.max_width, o->B.n_tail));
    size_t nt = (size_t)P->n_threads;
    if (fper > (SIZE_MAX - ATTN_WS_ALIGN) / nt || bper > (SIZE_MAX - ATTN_WS_ALIGN - tail) / nt)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    o->fwd_ws = ATTN_WS_ALIGN + fper * nt;
    o->bwd_ws = ATTN_WS_ALIGN + tail + bper * nt;
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
    if (s || (s = attn_pick_isa(&P, ko.isa, dtype, err))) return s;
    const maskpack_layout *L = layout;
    size_t n_items = (size_t)attn_max_items(&P);
    size_t n_units = attn_units(&P) + 1, n = L->n_segments ? L->n_segments : 1;
    size_t a_items = attn_align_up(n_items * sizeof(attn_item)), a_units = attn_align_up(n_units * sizeof(size_t));
    size_t a_perm = attn_align_up(n * sizeof(size_t)), a_groups = attn_align_up(n * sizeof(attn_kgroup));
    size_t total = a_items + a_units + a_perm + a_groups + attn_align_up(attn_covered_bytes(L));
    maskpack_attention_op *o = calloc(1, sizeof *o);
    char *mem = o ? aligned_alloc(ATTN_WS_ALIGN, total ? total : ATTN_WS_ALIGN) : NULL;
    if (!mem) {
        free(o);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "op", -1, -1, "out of memory for the op's %zu bytes of plans",
                       total);
    }
    o->L = layout;
    o->dims = P;
    o->dtype = dtype;
    o->plans = mem;
    attn_plan_fwd(&o->dims, (attn_item *)mem, (size_t *)(mem + a_items), &o->F);
    char *b = mem + a_items + a_units;
    attn_plan_bwd(&o->dims, (size_t *)b, (attn_kgroup *)(b + a_perm), (uint8_t *)(b + a_perm + a_groups), &o->B);
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
        char *ws = (char *)(((uintptr_t)block + ATTN_WS_ALIGN - 1) & ~(uintptr_t)(ATTN_WS_ALIGN - 1));
        mp_run run;
        mp_run_begin(&run, team, 1, 0); /* the caller's team, or the caller alone */
        if (!backward) {
            attn_exec_fwd(P, &op->F, &run, ws);
        } else {
            char *thr = ws + attn_align_up(attn_bwd_tail_bytes(P, op->B.max_width, op->B.n_tail));
            attn_exec_bwd(P, &op->B, &run, (float *)ws, thr);
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
