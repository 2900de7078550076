/* attn_ref.c: the scalar reference attention kernels. Deliberately simple: each query row (or,
 * for dk/dv, each key column) is computed on its own in double precision straight from the
 * layout's predicate, so the vector kernels can be checked against something that shares none of
 * their tiling. Portable C: it runs wherever the library builds. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

size_t attn_ref_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}

size_t attn_ref_bwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}

static void load_d(double *dst, const char *src, int bf16, int64_t n) {
    if (bf16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t x = 0; x < n; x++) dst[x] = mp_bf16_to_f32(s[x]);
    } else {
        const float *s = (const float *)src;
        for (int64_t x = 0; x < n; x++) dst[x] = s[x];
    }
}

static void store_d(char *dst, int bf16, const double *src, int64_t n, double mul) {
    if (bf16) {
        uint16_t *o = (uint16_t *)dst;
        for (int64_t x = 0; x < n; x++) o[x] = mp_f32_to_bf16((float)(src[x] * mul));
    } else {
        float *o = (float *)dst;
        for (int64_t x = 0; x < n; x++) o[x] = (float)(src[x] * mul);
    }
}

static double dot_d(const double *a, const char *b, int bf16, int64_t n) {
    double s = 0;
    if (bf16) {
        const uint16_t *x = (const uint16_t *)b;
        for (int64_t d = 0; d < n; d++) s += a[d] * mp_bf16_to_f32(x[d]);
    } else {
        const float *x = (const float *)b;
        for (int64_t d = 0; d < n; d++) s += a[d] * x[d];
    }
    return s;
}

static void axpy_d(double *acc, double w, const char *b, int bf16, int64_t n) {
    if (bf16) {
        const uint16_t *x = (const uint16_t *)b;
        for (int64_t d = 0; d < n; d++) acc[d] += w * mp_bf16_to_f32(x[d]);
    } else {
        const float *x = (const float *)b;
        for (int64_t d = 0; d < n; d++) acc[d] += w * x[d];
    }
}

/* The logit of (q row, key row): scale * q.k, capped when softcap > 0. *t receives tanh(.) for
 * the backward's chain rule (0 without a cap). */
static double logit(const attn_problem *P, const double *q, const char *krow, double *t) {
    double s = P->scale * dot_d(q, krow, P->bf16, P->d);
    if (P->softcap > 0) {
        double th = tanh(s / P->softcap);
        if (t) *t = th;
        return P->softcap * th;
    }
    if (t) *t = 0;
    return s;
}

static void ref_fwd_row(const attn_problem *P, size_t k, int32_t h, int64_t i) {
    const maskpack_layout *L = P->L;
    const maskpack_segment *g = &L->segs[k];
    int64_t kh = h / P->group, D = P->d;
    double q[ATTN_MAX_D], acc[ATTN_MAX_D];
    load_d(q, attn_ptr(&P->q, g->row, g->q_start + i, h, P->esize), P->bf16, D);
    double m = -INFINITY;
    for (int64_t j = 0; j < g->kv_len; j++) {
        if (!mp_allowed_local(L, k, i, j)) continue;
        double s = logit(P, q, attn_ptr(&P->k, g->row, g->kv_start + j, kh, P->esize), NULL);
        if (s > m) m = s;
    }
    memset(acc, 0, sizeof acc);
    double l = 0;
    if (m > -INFINITY) {
        for (int64_t j = 0; j < g->kv_len; j++) {
            if (!mp_allowed_local(L, k, i, j)) continue;
            double w = exp(logit(P, q, attn_ptr(&P->k, g->row, g->kv_start + j, kh, P->esize), NULL) - m);
            l += w;
            axpy_d(acc, w, attn_ptr(&P->v, g->row, g->kv_start + j, kh, P->esize), P->bf16, D);
        }
    }
    /* a row that sees nothing: exact 0 and -inf (docs/conventions.md section 5) */
    store_d(attn_ptr(&P->out, g->row, g->q_start + i, h, P->esize), P->bf16, acc, D, l > 0 ? 1.0 / l : 0.0);
    if (P->have_lse)
        *(float *)attn_ptr(&P->lse, g->row, g->q_start + i, h, sizeof(float)) = l > 0 ? (float)(m + log(l)) : -INFINITY;
}

void attn_ref_fwd_thread(void *vjob, int tid) {
    (void)tid;
    attn_fwd_job *job = vjob;
    size_t b, e;
    while (attn_fwd_claim(job, &b, &e))
        for (size_t it = b; it < e; it++) {
            const attn_item *x = &job->items[it];
            for (int32_t r = 0; r < x->n; r++) ref_fwd_row(job->P, (size_t)x->seg, x->head, x->i0 + r);
        }
}

/* Row quantities of the backward: D_i = dout_i . out_i and the row's lse. */
static double row_delta(const attn_problem *P, const maskpack_segment *g, int32_t h, int64_t i) {
    double a[ATTN_MAX_D];
    load_d(a, attn_ptr(&P->dout, g->row, g->q_start + i, h, P->esize), P->bf16, P->d);
    return dot_d(a, attn_ptr(&P->out, g->row, g->q_start + i, h, P->esize), P->bf16, P->d);
}

static double row_lse(const attn_problem *P, const maskpack_segment *g, int32_t h, int64_t i) {
    return *(const float *)attn_ptr(&P->lse, g->row, g->q_start + i, h, sizeof(float));
}

/* dP_ij * P_ij terms of one allowed pair: *p = P_ij, *ds = dS_ij (before the scale). */
static void pair_grad(const attn_problem *P, const maskpack_segment *g, int32_t h, int64_t j, const double *q,
                      const double *dout, double delta, double lse, double *p, double *ds) {
    int64_t kh = h / P->group;
    double t;
    double s = logit(P, q, attn_ptr(&P->k, g->row, g->kv_start + j, kh, P->esize), &t);
    *p = exp(s - lse);
    double dp = dot_d(dout, attn_ptr(&P->v, g->row, g->kv_start + j, kh, P->esize), P->bf16, P->d);
    *ds = *p * (dp - delta);
    if (P->softcap > 0) *ds *= 1.0 - t * t;
}

static void ref_bwd_unit(const attn_bwd_job *job, int64_t u) {
    const attn_problem *P = job->P;
    const maskpack_layout *L = P->L;
    const attn_kgroup *G = &job->groups[u / P->hkv];
    int32_t kh = (int32_t)(u % P->hkv);
    int64_t D = P->d;
    double q[ATTN_MAX_D], dout[ATTN_MAX_D], acc[ATTN_MAX_D], acc2[ATTN_MAX_D];
    /* dq: row by row */
    for (size_t s = G->seg_begin; s < G->seg_end; s++) {
        size_t k = job->perm[s];
        const maskpack_segment *g = &L->segs[k];
        for (int32_t h = kh * (int32_t)P->group; h < (kh + 1) * (int32_t)P->group; h++)
            for (int64_t i = 0; i < g->q_len; i++) {
                memset(acc, 0, sizeof acc);
                double lse = row_lse(P, g, h, i);
                if (lse > -INFINITY) {
                    load_d(q, attn_ptr(&P->q, g->row, g->q_start + i, h, P->esize), P->bf16, D);
                    load_d(dout, attn_ptr(&P->dout, g->row, g->q_start + i, h, P->esize), P->bf16, D);
                    double delta = row_delta(P, g, h, i);
                    for (int64_t j = 0; j < g->kv_len; j++) {
                        if (!mp_allowed_local(L, k, i, j)) continue;
                        double p, ds;
                        pair_grad(P, g, h, j, q, dout, delta, lse, &p, &ds);
                        axpy_d(acc, ds, attn_ptr(&P->k, g->row, g->kv_start + j, kh, P->esize), P->bf16, D);
                    }
                }
                store_d(attn_ptr(&P->dq, g->row, g->q_start + i, h, P->esize), P->bf16, acc, D, P->scale);
            }
    }
    /* dk, dv: key column by key column, summing every segment of the group that holds it */
    for (int64_t c = G->kv_start; c < G->kv_end; c++) {
        memset(acc, 0, sizeof acc);   /* dk */
        memset(acc2, 0, sizeof acc2); /* dv */
        for (size_t s = G->seg_begin; s < G->seg_end; s++) {
            size_t k = job->perm[s];
            const maskpack_segment *g = &L->segs[k];
            int64_t j = c - g->kv_start;
            if (j < 0 || j >= g->kv_len) continue;
            for (int32_t h = kh * (int32_t)P->group; h < (kh + 1) * (int32_t)P->group; h++)
                for (int64_t i = 0; i < g->q_len; i++) {
                    if (!mp_allowed_local(L, k, i, j)) continue;
                    double lse = row_lse(P, g, h, i);
                    if (!(lse > -INFINITY)) continue;
                    load_d(q, attn_ptr(&P->q, g->row, g->q_start + i, h, P->esize), P->bf16, D);
                    load_d(dout, attn_ptr(&P->dout, g->row, g->q_start + i, h, P->esize), P->bf16, D);
                    double p, ds;
                    pair_grad(P, g, h, j, q, dout, row_delta(P, g, h, i), lse, &p, &ds);
                    for (int64_t d = 0; d < D; d++) {
                        acc[d] += ds * q[d];
                        acc2[d] += p * dout[d];
                    }
                }
        }
        store_d(attn_ptr(&P->dk, G->row, c, kh, P->esize), P->bf16, acc, D, P->scale);
        store_d(attn_ptr(&P->dv, G->row, c, kh, P->esize), P->bf16, acc2, D, 1.0);
    }
}

void attn_ref_bwd_thread(void *vjob, int tid) {
    (void)tid;
    attn_bwd_job *job = vjob;
    int64_t u; /* the reference keeps no tail: its claims are the units */
    while (mp_claim_take(job->claim, &u)) ref_bwd_unit(job, u);
}
