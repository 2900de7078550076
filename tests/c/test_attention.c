/* test_attention.c: fused attention over layouts. Every kernel (ref, avx2, avx512, amx when the CPU
 * has them) is checked against a dense double-precision reference whose mask is written here from
 * the header's rule formula (not maskpack_allowed, which shares code with the kernels), forward and
 * backward, bf16 outputs in units in the last place (and maskpack_allowed against that mask at
 * every point), on random and adversarial layouts: padded, packed, packed rows, left padding, cross attention in both
 * alignments (rows that see nothing), windows, spans, prefixes, CP shards; GQA/MQA; head dims 16..256; lengths around
 * the block sizes; softcap; strided views; f32 and bf16. Then: packed == padded bitwise (f32), shard == unsharded
 * bitwise, NaN in padding and in keys no query may see never reaches an output, and bad input fails with outputs
 * untouched. */
#include "check.h"
#include "cpu_features.h"

#include <math.h>
#include <stdlib.h>

static test_rng rng = {0x2545f4914f6cdd1dull};
static int64_t rnd_in(int64_t lo, int64_t hi) { return test_rng_in(&rng, lo, hi); }
static float rnd_f(void) { return (float)test_rng_signed(&rng); }

/* The kernels this machine runs, "ref" first (set by test_isa_selection): isas[1 .. n_isas) are
 * the vector kernels, which the tests of their schedules (long sequences, tails) loop over. */
static const char *isas[6] = {"ref"};
static int n_isas = 1;
/* per isas entry: its bf16 forward rounds the softmax weights P to bf16 (AVX512-BF16, AMX); its bf16
 * backward rounds P and dS to bf16 for the dQ, dK, dV products (AVX512-BF16) */
static int p_rounded[6], pair_bwd[6];
/* kernels this CPU lacks, named in the summary line */
static int not_run = 0;
static char not_run_names[128] = "NOT RUN (this CPU lacks them):";

/* The ISA the calls below run, chosen per call (maskpack_kernel_options.isa); the tests of
 * MASKPACK_ISA itself set the variable and run AUTO. */
static maskpack_isa call_isa = MASKPACK_ISA_AUTO;
static void use_isa(const char *name) {
    call_isa = MASKPACK_ISA_AUTO;
    for (int i = 0; i < MASKPACK_ISA_COUNT_; i++)
        if (strcmp(name, maskpack_isa_name((maskpack_isa)i)) == 0) call_isa = (maskpack_isa)i;
}
#define attn_fwd(L, q, k, v, scale, cap, out, lse, threads, ws, bytes, err)                                            \
    maskpack_attention_forward(L, q, k, v, scale, cap, out, lse, OPTS_ISA(threads, call_isa), ws, bytes, err)
#define attn_bwd(L, dout, q, k, v, out, lse, scale, cap, dq, dk, dv, threads, ws, bytes, err)                          \
    maskpack_attention_backward(L, dout, q, k, v, out, lse, scale, cap, dq, dk, dv, OPTS_ISA(threads, call_isa), ws,   \
                                bytes, err)
/* (dtype) -> *isa the calls above run with call_isa */
static maskpack_status select_cur(maskpack_dtype dt, maskpack_isa *isa, maskpack_error *e) {
    return maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, dt, call_isa, isa, e);
}

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* A problem: contiguous grid tensors [B][W][H][D] in f32 (values exactly representable in bf16
 * when the problem is bf16, so the reference sees what the kernel sees). */
typedef struct {
    const maskpack_layout *L;
    int64_t B, S, Skv, Hq, Hkv, D;
    int packed, bf16;
    float *q, *k, *v, *dout;
} prob;

static int64_t nq_el(const prob *p) { return p->B * p->S * p->Hq * p->D; }
static int64_t nk_el(const prob *p) { return p->B * p->Skv * p->Hkv * p->D; }

static void fill_random(float *x, int64_t n, int bf16) {
    for (int64_t i = 0; i < n; i++) {
        float f = rnd_f() * 1.5f;
        x[i] = bf16 ? from_bf16(to_bf16(f)) : f;
    }
}

static prob make_prob(const maskpack_layout *L, int64_t Hq, int64_t Hkv, int64_t D, int bf16) {
    prob p;
    memset(&p, 0, sizeof p);
    p.L = L;
    p.B = maskpack_layout_n_rows(L);
    p.S = maskpack_layout_q_width(L);
    p.Skv = maskpack_layout_kv_width(L);
    p.Hq = Hq;
    p.Hkv = Hkv;
    p.D = D;
    p.packed = maskpack_layout_is_packed(L);
    p.bf16 = bf16;
    p.q = malloc((size_t)(nq_el(&p) + 1) * sizeof(float));
    p.dout = malloc((size_t)(nq_el(&p) + 1) * sizeof(float));
    p.k = malloc((size_t)(nk_el(&p) + 1) * sizeof(float));
    p.v = malloc((size_t)(nk_el(&p) + 1) * sizeof(float));
    fill_random(p.q, nq_el(&p), bf16);
    fill_random(p.dout, nq_el(&p), bf16);
    fill_random(p.k, nk_el(&p), bf16);
    fill_random(p.v, nk_el(&p), bf16);
    return p;
}

static void free_prob(prob *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->dout);
}

/* Tensor view of a grid buffer: [T,H,D] for packed layouts, [B,W,H,D] otherwise. */
static maskpack_tensor view_of(void *data, maskpack_dtype dt, const prob *p, int kv, int64_t H) {
    int64_t W = kv ? p->Skv : p->S;
    if (p->packed) {
        int64_t shape[3] = {W, H, p->D};
        return maskpack_tensor_contiguous(data, dt, 3, shape);
    }
    int64_t shape[4] = {p->B, W, H, p->D};
    return maskpack_tensor_contiguous(data, dt, 4, shape);
}

static maskpack_tensor lse_view(float *data, const prob *p) {
    if (p->packed) {
        int64_t shape[2] = {p->Hq, p->S};
        return maskpack_tensor_contiguous(data, MASKPACK_F32, 2, shape);
    }
    int64_t shape[3] = {p->B, p->Hq, p->S};
    return maskpack_tensor_contiguous(data, MASKPACK_F32, 3, shape);
}

static int64_t lse_index(const prob *p, int64_t b, int64_t h, int64_t i) { return (b * p->Hq + h) * p->S + i; }

/* Buffers in the problem's dtype. */
static void *as_dtype(const float *x, int64_t n, int bf16) {
    if (!bf16) {
        float *o = malloc((size_t)(n + 1) * sizeof(float));
        memcpy(o, x, (size_t)n * sizeof(float));
        return o;
    }
    uint16_t *o = malloc((size_t)(n + 1) * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++) o[i] = to_bf16(x[i]);
    return o;
}

static void to_f32(float *dst, const void *src, int64_t n, int bf16) {
    if (!bf16)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else
        for (int64_t i = 0; i < n; i++) dst[i] = from_bf16(((const uint16_t *)src)[i]);
}

/* ---- the dense double reference (the test's own predicate) ------------------------------------------- */

typedef struct {
    double *out, *lse; /* [B][S][Hq][D], [B][Hq][S] */
    double *absout;    /* [B][S][Hq][D]: sum_j P_j |v_j| (the size of the terms of out) */
    double *dq, *dk, *dv;
    /* the sizes of the gradients' terms: sum_j scale |dS_ij| |k_j|, sum_i scale |dS_ij| |q_i|, sum_i P_ij |dO_i| */
    double *absdq, *absdk, *absdv;
} dense;

/* The allowed keys of query (b, i), written from the layout's segment list and rule here (the
 * header's formula), not through maskpack_allowed, which shares its key range code with the
 * kernels: a wrong window edge or alignment in the library cannot cancel out of the comparison. */
static void allowed_row(const maskpack_layout *L, int64_t b, int64_t i, int64_t Skv, unsigned char *keep) {
    memset(keep, 0, (size_t)Skv);
    size_t n = maskpack_layout_n_segments(L);
    maskpack_rule r = maskpack_layout_rule(L);
    for (size_t k = 0; k < n; k++) {
        maskpack_segment g;
        maskpack_error e;
        if (maskpack_layout_segment(L, k, &g, &e) != MASKPACK_OK) return;
        if (g.row != b || i < g.q_start || i >= g.q_start + g.q_len) continue;
        int64_t qi = i - g.q_start;
        /* the diagonal key: explicit position, or the alignment's offset */
        int64_t c = (g.flags & MASKPACK_SEGMENT_EXPLICIT_POS)    ? g.q_pos + qi
                    : r.alignment == MASKPACK_ALIGN_BOTTOM_RIGHT ? qi + g.kv_len - g.q_len
                                                                 : qi;
        /* the span holding the query, if any ([s0, s1) in key coordinates) */
        int64_t sp = (g.flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? g.q_pos + qi : qi, s0 = 0, s1 = 0;
        for (size_t t = 0; t < r.n_spans; t++)
            if ((size_t)r.spans[t].segment == k && sp >= r.spans[t].start && sp < r.spans[t].end) {
                s0 = r.spans[t].start;
                s1 = r.spans[t].end;
            }
        int64_t pre = r.prefix && k < r.n_prefix ? r.prefix[k] : 0;
        for (int64_t kj = 0; kj < g.kv_len; kj++) {
            int base = (!r.causal || kj <= c) && (r.window_left < 0 || kj >= c - r.window_left) &&
                       (r.window_right < 0 || kj <= c + r.window_right);
            if (g.kv_start + kj < Skv)
                keep[g.kv_start + kj] = (unsigned char)(base || (kj >= s0 && kj < s1) || kj < pre);
        }
        return;
    }
}

static double ref_logit(const prob *p, int64_t b, int64_t i, int64_t h, int64_t j, double scale, double cap,
                        double *t) {
    int64_t kh = h / (p->Hq / p->Hkv), D = p->D;
    const float *q = p->q + ((b * p->S + i) * p->Hq + h) * D, *k = p->k + ((b * p->Skv + j) * p->Hkv + kh) * D;
    double s = 0;
    for (int64_t d = 0; d < D; d++) s += (double)q[d] * k[d];
    s *= scale;
    *t = 0;
    if (cap > 0) {
        *t = tanh(s / cap);
        s = cap * *t;
    }
    return s;
}

/* The gradients given the forward's out and lse (those of the reference, or those a kernel wrote:
 * the backward is a function of them, and a bf16 out carries its rounding into delta). */
static void dense_grads(const prob *p, double scale, double cap, const double *out, const double *lse_in, dense *r) {
    int64_t D = p->D, G = p->Hq / p->Hkv;
    memset(r->dq, 0, (size_t)nq_el(p) * sizeof(double));
    memset(r->dk, 0, (size_t)nk_el(p) * sizeof(double));
    memset(r->dv, 0, (size_t)nk_el(p) * sizeof(double));
    memset(r->absdq, 0, (size_t)nq_el(p) * sizeof(double));
    memset(r->absdk, 0, (size_t)nk_el(p) * sizeof(double));
    memset(r->absdv, 0, (size_t)nk_el(p) * sizeof(double));
    unsigned char *keep = malloc((size_t)p->Skv + 1);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t i = 0; i < p->S; i++) {
            allowed_row(p->L, b, i, p->Skv, keep);
            for (int64_t h = 0; h < p->Hq; h++) {
                int64_t kh = h / G;
                double lse = lse_in[lse_index(p, b, h, i)];
                if (!(lse > -INFINITY)) continue;
                const double *o = out + ((b * p->S + i) * p->Hq + h) * D;
                const float *dO = p->dout + ((b * p->S + i) * p->Hq + h) * D;
                const float *q = p->q + ((b * p->S + i) * p->Hq + h) * D;
                double delta = 0;
                for (int64_t d = 0; d < D; d++) delta += dO[d] * o[d];
                double *dq = r->dq + ((b * p->S + i) * p->Hq + h) * D;
                double *adq = r->absdq + ((b * p->S + i) * p->Hq + h) * D;
                for (int64_t j = 0; j < p->Skv; j++) {
                    if (!keep[j]) continue;
                    double th;
                    double P = exp(ref_logit(p, b, i, h, j, scale, cap, &th) - lse);
                    const float *v = p->v + ((b * p->Skv + j) * p->Hkv + kh) * D;
                    const float *k = p->k + ((b * p->Skv + j) * p->Hkv + kh) * D;
                    double dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += (double)dO[d] * v[d];
                    double ds = P * (dp - delta);
                    if (cap > 0) ds *= 1 - th * th;
                    double *dk = r->dk + ((b * p->Skv + j) * p->Hkv + kh) * D;
                    double *dv = r->dv + ((b * p->Skv + j) * p->Hkv + kh) * D;
                    double *adk = r->absdk + ((b * p->Skv + j) * p->Hkv + kh) * D;
                    double *adv = r->absdv + ((b * p->Skv + j) * p->Hkv + kh) * D;
                    for (int64_t d = 0; d < D; d++) {
                        dq[d] += scale * ds * k[d];
                        dk[d] += scale * ds * q[d];
                        dv[d] += P * dO[d];
                        adq[d] += fabs(scale * ds) * fabs((double)k[d]);
                        adk[d] += fabs(scale * ds) * fabs((double)q[d]);
                        adv[d] += P * fabs((double)dO[d]);
                    }
                }
            }
        }
    free(keep);
}

static dense dense_ref(const prob *p, double scale, double cap, int grads) {
    dense r;
    int64_t D = p->D, G = p->Hq / p->Hkv;
    r.out = calloc((size_t)nq_el(p) + 1, sizeof(double));
    r.absout = calloc((size_t)nq_el(p) + 1, sizeof(double));
    r.lse = calloc((size_t)(p->B * p->Hq * p->S) + 1, sizeof(double));
    r.dq = calloc((size_t)nq_el(p) + 1, sizeof(double));
    r.dk = calloc((size_t)nk_el(p) + 1, sizeof(double));
    r.dv = calloc((size_t)nk_el(p) + 1, sizeof(double));
    r.absdq = calloc((size_t)nq_el(p) + 1, sizeof(double));
    r.absdk = calloc((size_t)nk_el(p) + 1, sizeof(double));
    r.absdv = calloc((size_t)nk_el(p) + 1, sizeof(double));
    double *pr = malloc((size_t)(p->Skv + 1) * sizeof(double)), *th = malloc((size_t)(p->Skv + 1) * sizeof(double));
    unsigned char *keep = malloc((size_t)p->Skv + 1);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t i = 0; i < p->S; i++) {
            allowed_row(p->L, b, i, p->Skv, keep);
            /* the library's reference predicate agrees with the test's at every point */
            int64_t differ = 0;
            for (int64_t j = 0; j < p->Skv; j++) differ += !maskpack_allowed(p->L, b, 0, i, j) != !keep[j];
            CHECK_EQ(differ, 0);
            for (int64_t h = 0; h < p->Hq; h++) {
                int64_t kh = h / G;
                double m = -INFINITY;
                for (int64_t j = 0; j < p->Skv; j++) {
                    pr[j] = -INFINITY;
                    if (!keep[j]) continue;
                    pr[j] = ref_logit(p, b, i, h, j, scale, cap, &th[j]);
                    if (pr[j] > m) m = pr[j];
                }
                double *o = r.out + ((b * p->S + i) * p->Hq + h) * D, *ao = r.absout + ((b * p->S + i) * p->Hq + h) * D;
                double l = 0;
                if (m > -INFINITY)
                    for (int64_t j = 0; j < p->Skv; j++) {
                        if (pr[j] == -INFINITY) continue;
                        double w = exp(pr[j] - m);
                        l += w;
                        const float *v = p->v + ((b * p->Skv + j) * p->Hkv + kh) * D;
                        for (int64_t d = 0; d < D; d++) {
                            o[d] += w * v[d];
                            ao[d] += w * fabs((double)v[d]);
                        }
                    }
                for (int64_t d = 0; d < D; d++) {
                    o[d] = l > 0 ? o[d] / l : 0;
                    ao[d] = l > 0 ? ao[d] / l : 0;
                }
                r.lse[lse_index(p, b, h, i)] = l > 0 ? m + log(l) : -INFINITY;
            }
        }
    free(pr);
    free(th);
    free(keep);
    if (grads) dense_grads(p, scale, cap, r.out, r.lse, &r);
    return r;
}

static void free_dense(dense *r) {
    free(r->out);
    free(r->absout);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->absdq);
    free(r->absdk);
    free(r->absdv);
}

/* Elementwise closeness of n f32 values: max over i of |a_i - b_i| / (|b_i| + rms(b)). An element
 * is held to its own size, with the root mean square of the whole output as the floor for values
 * that cancel to near zero (dividing by the largest value instead let small elements be wrong by
 * many times their size). NaN is infinitely wrong. */
static double rel_err(const float *a, const double *b, int64_t n) {
    double ss = 0, e = 0;
    for (int64_t i = 0; i < n; i++) ss += b[i] * b[i];
    double floor_ = n ? sqrt(ss / (double)n) : 0;
    if (floor_ < 1e-30) floor_ = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]) / (fabs(b[i]) + floor_);
        if (isnan(a[i])) x = INFINITY;
        if (x > e) e = x;
    }
    return e;
}

/* One unit in the last place of bf16 (8 significant bits) at |x|. */
static double bf16_ulp(double x) {
    int ex;
    frexp(fabs(x), &ex); /* |x| in [2^(ex-1), 2^ex) */
    return ldexp(1.0, ex - 8);
}

/* Distance of bf16 outputs from the exact values in bf16 units in the last place: max over i of
 * |a_i - b_i| / ulp(max(|b_i|, floor)), floor = rms(b) / 64 (values that cancel below it are held
 * to the ulp of the floor: the f32 sums before the rounding are only that exact). A kernel that
 * computes in f32 and rounds to nearest is within about 0.5 ulp, a truncating one up to 1, a wrong
 * value many. */
static double bf16_ulps(const float *a, const double *b, int64_t n) {
    double ss = 0, e = 0;
    for (int64_t i = 0; i < n; i++) ss += b[i] * b[i];
    double floor_ = n ? sqrt(ss / (double)n) / 64 : 0;
    if (floor_ < 1e-30) floor_ = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]) / bf16_ulp(fmax(fabs(b[i]), floor_));
        if (isnan(a[i])) x = INFINITY;
        if (x > e) e = x;
    }
    return e;
}

/* ---- running the kernels ------------------------------------------------------------------------- */

typedef struct {
    float *out, *lse, *dq, *dk, *dv; /* f32 copies of the outputs */
} result;

static void free_result(result *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

static maskpack_status run(const prob *p, const char *isa, double scale, double cap, int threads, int grads,
                           result *res, maskpack_error *e) {
    use_isa(isa);
    maskpack_dtype dt = p->bf16 ? MASKPACK_BF16 : MASKPACK_F32;
    void *q = as_dtype(p->q, nq_el(p), p->bf16), *k = as_dtype(p->k, nk_el(p), p->bf16),
         *v = as_dtype(p->v, nk_el(p), p->bf16), *dout = as_dtype(p->dout, nq_el(p), p->bf16);
    size_t es = p->bf16 ? 2 : 4;
    void *out = malloc((size_t)nq_el(p) * es + 4), *dq = malloc((size_t)nq_el(p) * es + 4),
         *dk = malloc((size_t)nk_el(p) * es + 4), *dv = malloc((size_t)nk_el(p) * es + 4);
    float *lse = malloc((size_t)(p->B * p->Hq * p->S + 1) * sizeof(float));
    /* garbage in the outputs: every element must be written */
    memset(out, 0x7f, (size_t)nq_el(p) * es);
    memset(dq, 0x7f, (size_t)nq_el(p) * es);
    memset(dk, 0x7f, (size_t)nk_el(p) * es);
    memset(dv, 0x7f, (size_t)nk_el(p) * es);
    memset(lse, 0x7f, (size_t)(p->B * p->Hq * p->S) * sizeof(float));
    maskpack_tensor tq = view_of(q, dt, p, 0, p->Hq), tk = view_of(k, dt, p, 1, p->Hkv),
                    tv = view_of(v, dt, p, 1, p->Hkv);
    maskpack_tensor to = view_of(out, dt, p, 0, p->Hq), tl = lse_view(lse, p), tdo = view_of(dout, dt, p, 0, p->Hq);
    maskpack_tensor tdq = view_of(dq, dt, p, 0, p->Hq), tdk = view_of(dk, dt, p, 1, p->Hkv),
                    tdv = view_of(dv, dt, p, 1, p->Hkv);
    size_t need = 0;
    maskpack_status s = maskpack_attention_forward_workspace(p->L, &tq, &tk, &tv, OPTS_NT(threads), &need, e);
    void *ws = NULL;
    if (!s) {
        ws = malloc(need);
        s = attn_fwd(p->L, &tq, &tk, &tv, scale, cap, &to, &tl, threads, ws, need, e);
    }
    if (!s && grads) {
        free(ws);
        ws = NULL;
        s = maskpack_attention_backward_workspace(p->L, &tq, &tk, &tv, OPTS_NT(threads), &need, e);
        if (!s) {
            ws = malloc(need);
            s = attn_bwd(p->L, &tdo, &tq, &tk, &tv, &to, &tl, scale, cap, &tdq, &tdk, &tdv, threads, ws, need, e);
        }
    }
    free(ws);
    memset(res, 0, sizeof *res);
    res->out = malloc((size_t)(nq_el(p) + 1) * sizeof(float));
    res->dq = malloc((size_t)(nq_el(p) + 1) * sizeof(float));
    res->dk = malloc((size_t)(nk_el(p) + 1) * sizeof(float));
    res->dv = malloc((size_t)(nk_el(p) + 1) * sizeof(float));
    to_f32(res->out, out, nq_el(p), p->bf16);
    to_f32(res->dq, dq, nq_el(p), p->bf16);
    to_f32(res->dk, dk, nk_el(p), p->bf16);
    to_f32(res->dv, dv, nk_el(p), p->bf16);
    res->lse = lse;
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    return s;
}

static int verbose_fail = 0;

/* The tolerances, from the errors measured on the ref, AVX2, AVX-512 and AVX512-BF16 kernels of a
 * Zen 4 (MASKPACK_TEST_MEASURE=1 prints the worst per kernel and dtype):
 *  - f32: elementwise relative error (rel_err) of out and lse, and of the gradients;
 *  - bf16 forwards that compute in f32 and round once (ref, AVX2, AVX-512 widened): out within
 *    ULPS_BF16_OUT bf16 ulps of the exact value (measured 0.54: the rounding itself; below 1 so that
 *    a truncating conversion, up to 1 ulp off, fails);
 *  - bf16 forwards that round P to bf16 for the P V product (AVX512-BF16, AMX): each element within
 *    one ulp plus P_ROUNDED_TOL * 2^-8 * sum_j P_j |v_j| (the rounding of every P_j), measured 0.69,
 *    and lse within 2e-3 (measured 1.0e-3);
 *  - bf16 gradients in bf16 ulps against the reference backward fed the out and lse the kernel's
 *    forward wrote (which the backward reads: a bf16 out carries its rounding into delta), measured
 *    0.53 (dq, dk, dv): 0.5 of it is the final rounding, so the bound 0.75 is about twice the rest
 *    and under the 1 ulp of a truncating store. */
#define TOL_F32           3e-5
#define TOL_F32_GRAD      1.2e-4
#define TOL_LSE_F32       1e-6
#define TOL_LSE_P_ROUNDED 2e-3
#define ULPS_BF16_OUT     0.75
#define P_ROUNDED_TOL     1.5
#define ULPS_BF16_GRAD    0.75
/* bf16 backwards that round P and dS to bf16 as operands of dQ = dS K, dK = dS^T Q, dV = P^T dO
 * (AVX512-BF16, AMX): every term of a gradient moves by at most 2^-9 of its size (one rounding to
 * nearest, 8 significant bits; q, k, dO are bf16 already), so a gradient within one bf16 ulp (its
 * own final rounding and the f32 sums) plus PAIR_GRAD_TOL * 2^-8 * sum |terms|: 0.5 is that bound
 * exactly, 1.0 twice it */
#define PAIR_GRAD_TOL 1.5

/* worst measured error per kernel (isas index), dtype and output (out, lse, dq, dk, dv) */
static double measured[6][2][5];
static int cur_isa = 0;

/* The error of a pair-rounding backward's bf16 gradient in units of 2^-8 sum |terms| after one ulp,
 * both taken at no less than bf16_ulps' floor (the rms / 64): an element far below its tensor's
 * scale carries the f32 cancellation of dS = P (dP - delta) that every kernel has (a row whose P is
 * one key: its dS are differences of nearly equal dP and delta), not the rounding bounded here. */
static double pair_grad_err(const float *a, const double *want, const double *abs_terms, int64_t n) {
    double ss = 0, e = 0;
    for (int64_t i = 0; i < n; i++) ss += want[i] * want[i];
    double floor_ = n ? sqrt(ss / (double)n) / 64 : 0;
    if (floor_ < 1e-30) floor_ = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - want[i]) - bf16_ulp(fmax(fabs(want[i]), floor_));
        x = x <= 0 ? 0 : x / ldexp(fmax(abs_terms[i], floor_), -8);
        if (isnan(a[i])) x = INFINITY;
        if (x > e) e = x;
    }
    return e;
}

/* The error of a P-rounding kernel's bf16 out in units of 2^-8 sum_j P_j |v_j| after one ulp. */
static double p_rounded_err(const float *a, const dense *ref, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - ref->out[i]) - bf16_ulp(ref->out[i]);
        x = x <= 0 ? 0 : x / (ldexp(ref->absout[i], -8) + 1e-30);
        if (isnan(a[i])) x = INFINITY;
        if (x > e) e = x;
    }
    return e;
}

/* Compares one run against the dense reference; empty rows must be exactly 0 / -inf. With own
 * set, bf16 gradients are compared with a reference backward run on this run's out and lse (scale
 * and cap are the problem's). */
static void check_against_sc(const prob *p, const result *r, const dense *ref, int grads, const char *what,
                             int own_grads, double scale, double cap) {
    int64_t D = p->D;
    int bf = p->bf16, pr = bf && p_rounded[cur_isa];
    double e_out = !bf  ? rel_err(r->out, ref->out, nq_el(p))
                   : pr ? p_rounded_err(r->out, ref, nq_el(p))
                        : bf16_ulps(r->out, ref->out, nq_el(p));
    double tol_out = !bf ? TOL_F32 : pr ? P_ROUNDED_TOL : ULPS_BF16_OUT, tol_grad = bf ? ULPS_BF16_GRAD : TOL_F32_GRAD;
    double tol_lse = pr ? TOL_LSE_P_ROUNDED : TOL_LSE_F32, e_lse = 0;
    int exact_empty = 1;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++)
            for (int64_t i = 0; i < p->S; i++) {
                double want = ref->lse[lse_index(p, b, h, i)];
                float got = r->lse[lse_index(p, b, h, i)];
                if (want == -INFINITY) {
                    if (!(got == -INFINITY)) exact_empty = 0;
                    const float *o = r->out + ((b * p->S + i) * p->Hq + h) * D;
                    for (int64_t d = 0; d < D; d++)
                        if (o[d] != 0.0f || signbit(o[d])) exact_empty = 0;
                    if (grads) {
                        const float *g = r->dq + ((b * p->S + i) * p->Hq + h) * D;
                        for (int64_t d = 0; d < D; d++)
                            if (g[d] != 0.0f) exact_empty = 0;
                    }
                } else {
                    double x = fabs(got - want) / (1 + fabs(want));
                    if (!(x <= e_lse)) e_lse = isnan(x) ? INFINITY : x;
                }
            }
    int lse_ok = e_lse <= tol_lse;
    CHECK(e_out <= tol_out);
    CHECK(exact_empty);
    CHECK(lse_ok);
    double e_dq = 0, e_dk = 0, e_dv = 0;
    if (grads) {
        const dense *g = ref;
        /* the backward's own inputs: the bf16 out and the lse this run's forward wrote; the last
         * one is kept, as runs on 1 and 2 threads write the same (then it is not recomputed) */
        static dense own;
        static float *own_out, *own_lse;
        static const prob *own_p;
        static int64_t own_nq, own_nl;
        int64_t nl = p->B * p->Hq * p->S;
        if (bf && own_grads) {
            int same = own_p == p && own_nq == nq_el(p) && own_nl == nl && own_out &&
                       !memcmp(own_out, r->out, (size_t)nq_el(p) * sizeof(float)) &&
                       !memcmp(own_lse, r->lse, (size_t)nl * sizeof(float));
            if (!same) {
                free(own.dq);
                free(own.dk);
                free(own.dv);
                free(own.absdq);
                free(own.absdk);
                free(own.absdv);
                free(own_out);
                free(own_lse);
                own.dq = calloc((size_t)nq_el(p) + 1, sizeof(double));
                own.absdq = calloc((size_t)nq_el(p) + 1, sizeof(double));
                own.absdk = calloc((size_t)nk_el(p) + 1, sizeof(double));
                own.absdv = calloc((size_t)nk_el(p) + 1, sizeof(double));
                own.dk = calloc((size_t)nk_el(p) + 1, sizeof(double));
                own.dv = calloc((size_t)nk_el(p) + 1, sizeof(double));
                own_out = malloc((size_t)(nq_el(p) + 1) * sizeof(float));
                own_lse = malloc((size_t)(nl + 1) * sizeof(float));
                memcpy(own_out, r->out, (size_t)nq_el(p) * sizeof(float));
                memcpy(own_lse, r->lse, (size_t)nl * sizeof(float));
                own_p = p;
                own_nq = nq_el(p);
                own_nl = nl;
                double *o = malloc((size_t)(nq_el(p) + 1) * sizeof(double));
                double *l = malloc((size_t)(nl + 1) * sizeof(double));
                for (int64_t x = 0; x < nq_el(p); x++) o[x] = r->out[x];
                for (int64_t x = 0; x < nl; x++) l[x] = r->lse[x];
                dense_grads(p, scale, cap, o, l, &own);
                free(o);
                free(l);
            }
            g = &own;
        }
        if (bf && pair_bwd[cur_isa]) {
            tol_grad = PAIR_GRAD_TOL;
            e_dq = pair_grad_err(r->dq, g->dq, g->absdq, nq_el(p));
            e_dk = pair_grad_err(r->dk, g->dk, g->absdk, nk_el(p));
            e_dv = pair_grad_err(r->dv, g->dv, g->absdv, nk_el(p));
        } else {
            e_dq = bf ? bf16_ulps(r->dq, g->dq, nq_el(p)) : rel_err(r->dq, g->dq, nq_el(p));
            e_dk = bf ? bf16_ulps(r->dk, g->dk, nk_el(p)) : rel_err(r->dk, g->dk, nk_el(p));
            e_dv = bf ? bf16_ulps(r->dv, g->dv, nk_el(p)) : rel_err(r->dv, g->dv, nk_el(p));
        }
        CHECK(e_dq <= tol_grad);
        CHECK(e_dk <= tol_grad);
        CHECK(e_dv <= tol_grad);
    }
    double *w = measured[cur_isa][bf], es[5] = {e_out, e_lse, e_dq, e_dk, e_dv};
    for (int x = 0; x < 5; x++) w[x] = fmax(w[x], es[x]);
    if (verbose_fail || e_out > tol_out || !exact_empty || !lse_ok || e_dq > tol_grad || e_dk > tol_grad ||
        e_dv > tol_grad)
        fprintf(stderr, "  %s: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g empty-exact %d (%s)\n", what, e_out, e_lse,
                e_dq, e_dk, e_dv, exact_empty,
                !bf  ? "relative"
                : pr ? (pair_bwd[cur_isa] ? "out: P-rounding units, grads: pair-rounding units"
                                          : "out: P-rounding units, grads: bf16 ulps")
                     : "bf16 ulps");
}

/* f32 problems (and bf16 ones without gradients) */
static void check_against(const prob *p, const result *r, const dense *ref, int grads, const char *what) {
    check_against_sc(p, r, ref, grads, what, 0, 0, 0);
}

static void print_measured(void) {
    if (!getenv("MASKPACK_TEST_MEASURE")) return;
    for (int x = 0; x < n_isas; x++)
        for (int bf = 0; bf < 2; bf++)
            printf("test_attention: worst vs reference, %s %s: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g (%s)\n",
                   isas[x], bf ? "bf16" : "f32", measured[x][bf][0], measured[x][bf][1], measured[x][bf][2],
                   measured[x][bf][3], measured[x][bf][4], bf ? "bf16 ulps" : "relative");
}

/* Every available kernel, forward and backward, against the reference; 1 and 2 threads. */
static void check_all_isas(const maskpack_layout *L, int64_t Hq, int64_t Hkv, int64_t D, double scale, double cap,
                           const char *name) {
    for (int bf = 0; bf < 2; bf++) {
        prob p = make_prob(L, Hq, Hkv, D, bf);
        double sc = scale == 0 ? 1 / sqrt((double)D) : scale;
        dense ref = dense_ref(&p, sc, cap, 1);
        for (int x = 0; x < n_isas; x++)
            for (int threads = 1; threads <= 2; threads++) {
                result r;
                maskpack_error e;
                char what[200];
                snprintf(what, sizeof what, "%s %s %s D=%lld Hq=%lld Hkv=%lld threads=%d", name, isas[x],
                         bf ? "bf16" : "f32", (long long)D, (long long)Hq, (long long)Hkv, threads);
                maskpack_status s = run(&p, isas[x], scale, cap, threads, 1, &r, &e);
                CHECK_OK(s, e);
                cur_isa = x;
                if (s == MASKPACK_OK) check_against_sc(&p, &r, &ref, 1, what, 1, sc, cap);
                free_result(&r);
            }
        free_dense(&ref);
        free_prob(&p);
    }
}

/* ---- layouts ------------------------------------------------------------------------------------- */

static maskpack_layout *from_lengths(const int64_t *len, size_t n, maskpack_placement pl, int64_t cap,
                                     const maskpack_rule *rule) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(len, n, pl, cap, rule, &L, &e), e);
    return L;
}

static void test_kernels_vs_reference(void) {
    maskpack_rule causal = maskpack_rule_default(), bidir = maskpack_rule_default();
    bidir.causal = 0;
    /* lengths around the block sizes (48 query rows, 64 keys, AMX 64 rows and chunks of 256 keys),
     * an empty one and a 1 */
    int64_t len_a[5] = {49, 0, 1, 64, 33};
    int64_t len_b[3] = {97, 47, 65};
    maskpack_layout *L;

    L = from_lengths(len_a, 5, MASKPACK_PLACE_RIGHT, 0, &causal);
    if (L) check_all_isas(L, 2, 1, 64, 0, 0, "padded causal MQA");
    maskpack_layout_free(L);

    L = from_lengths(len_b, 3, MASKPACK_PLACE_PACKED, 0, &bidir);
    if (L) check_all_isas(L, 4, 2, 128, 0.3, 0, "packed bidirectional GQA");
    /* a negative scale is legal: the row max of the scaled scores is not the scaled max */
    if (L) check_all_isas(L, 4, 2, 128, -0.3, 0, "packed bidirectional GQA, negative scale");
    maskpack_layout_free(L);

    L = from_lengths(len_b, 3, MASKPACK_PLACE_LEFT, 0, &causal);
    if (L) check_all_isas(L, 1, 1, 100, 0, 0, "left padded causal D=100");
    maskpack_layout_free(L);

    int64_t len_c[6] = {20, 31, 5, 40, 17, 9};
    L = from_lengths(len_c, 6, MASKPACK_PLACE_PACKED, 64, &causal);
    if (L) check_all_isas(L, 2, 2, 16, 0, 0, "packed rows D=16");
    maskpack_layout_free(L);

    /* sliding windows, causal and two-sided */
    maskpack_rule win = causal;
    win.window_left = 7;
    win.window_right = 0;
    L = from_lengths(len_b, 3, MASKPACK_PLACE_PACKED, 0, &win);
    if (L) check_all_isas(L, 2, 1, 64, 0, 0, "window (7,0)");
    maskpack_layout_free(L);
    maskpack_rule win2 = bidir;
    win2.window_left = 40;
    win2.window_right = 3;
    L = from_lengths(len_b, 3, MASKPACK_PLACE_RIGHT, 0, &win2);
    if (L) check_all_isas(L, 2, 2, 64, 0, 0, "window (40,3) bidirectional");
    maskpack_layout_free(L);

    /* spans and prefixes on top of causal; softcap */
    int64_t len_d[3] = {90, 12, 70};
    maskpack_span spans[3] = {{0, 10, 60}, {0, 70, 71}, {2, 0, 33}};
    int64_t prefix[3] = {5, 0, 21};
    maskpack_rule sp = causal;
    sp.spans = spans;
    sp.n_spans = 3;
    sp.prefix = prefix;
    sp.n_prefix = 3;
    L = from_lengths(len_d, 3, MASKPACK_PLACE_PACKED, 0, &sp);
    if (L) check_all_isas(L, 2, 1, 64, 0, 0, "spans + prefix");
    if (L) check_all_isas(L, 1, 1, 128, 0, 30.0, "spans + prefix, softcap 30");
    maskpack_layout_free(L);

    /* cross attention, both alignments; q_len > kv_len gives rows that see nothing */
    maskpack_segment xs[3] = {{0, 0, 70, 0, 30}, {0, 70, 20, 30, 90}, {0, 90, 5, 120, 0}};
    for (int al = 0; al < 2; al++) {
        maskpack_rule r = causal;
        r.alignment = al ? MASKPACK_ALIGN_BOTTOM_RIGHT : MASKPACK_ALIGN_TOP_LEFT;
        maskpack_error e;
        L = NULL;
        CHECK_OK(maskpack_layout_from_segments(xs, 3, 1, 95, 120, 1, &r, &L, &e), e);
        if (L) check_all_isas(L, 2, 1, 64, 0, 0, al ? "cross bottom-right" : "cross top-left");
        maskpack_layout_free(L);
    }

    /* longer sequences: several AMX key chunks (the running max moves between chunks) and several
     * query blocks of every kernel, the last one partly full */
    int64_t len_f[2] = {300, 145};
    L = from_lengths(len_f, 2, MASKPACK_PLACE_PACKED, 0, &causal);
    if (L) check_all_isas(L, 2, 1, 64, 0, 0, "long causal");
    maskpack_layout_free(L);
    maskpack_rule win3 = bidir;
    win3.window_left = 100;
    win3.window_right = 60;
    L = from_lengths(len_f, 2, MASKPACK_PLACE_RIGHT, 0, &win3);
    if (L) check_all_isas(L, 1, 1, 128, 0, 0, "long window (100,60)");
    maskpack_layout_free(L);
    /* three AMX key chunks of 256 keys without a mask: the second takes its exponents against
     * the first chunk's max (lazy max), and a large scale makes some rows outgrow it (redone) */
    int64_t len_g[1] = {520};
    L = from_lengths(len_g, 1, MASKPACK_PLACE_PACKED, 0, &bidir);
    if (L) check_all_isas(L, 1, 1, 64, 2.0, 0, "long bidirectional, scale 2");
    maskpack_layout_free(L);

    /* head dim 256, and a larger head dim odd size */
    int64_t len_e[2] = {70, 3};
    L = from_lengths(len_e, 2, MASKPACK_PLACE_PACKED, 0, &causal);
    if (L) check_all_isas(L, 1, 1, 256, 0, 0, "D=256");
    if (L) check_all_isas(L, 2, 1, 37, 0, 0, "D=37");
    maskpack_layout_free(L);

    /* odd head dims up to the largest, under a window and bidirectionally: partial 16-column
     * vectors in every row move and matrix kernel (the AVX2 build's ymm blocks included) */
    int64_t len_h[3] = {50, 97, 2};
    L = from_lengths(len_h, 3, MASKPACK_PLACE_PACKED, 0, &win);
    if (L) check_all_isas(L, 2, 1, 255, 0, 0, "window (7,0) D=255");
    if (L) check_all_isas(L, 2, 2, 129, 0, 0, "window (7,0) D=129");
    maskpack_layout_free(L);
    L = from_lengths(len_h, 3, MASKPACK_PLACE_RIGHT, 0, &bidir);
    if (L) check_all_isas(L, 3, 1, 200, 0, 0, "padded bidirectional D=200");
    if (L) check_all_isas(L, 1, 1, 72, 0, 0, "padded bidirectional D=72");
    maskpack_layout_free(L);
}

/* The AVX2 and AVX-512 f32 kernels are one framework (attn_fwd_kernel.inc, attn_bwd_kernel.inc)
 * over micro-kernels that do the same per-lane arithmetic and keep every output's summation order
 * (attn_avx2_uk.h, attn_avx512_uk.h): on a machine that runs both, f32 forward and
 * backward outputs are bitwise equal, on causal, windowed, span/prefix, cross and softcapped
 * problems, 1 and 2 threads. (bf16 forwards may run on AVX512-BF16 or AMX instead: not compared.) */
static void test_avx2_equals_avx512(void) {
    int has2 = 0, has512 = 0;
    for (int x = 0; x < n_isas; x++) {
        has2 |= !strcmp(isas[x], "avx2");
        has512 |= !strcmp(isas[x], "avx512");
    }
    if (!has2 || !has512) {
        printf("test_attention: avx2 == avx512 bitwise: not run (this machine runs%s%s)\n", has2 ? " avx2" : "",
               has512 ? " avx512" : "");
        return;
    }
    maskpack_rule causal = maskpack_rule_default(), win = maskpack_rule_default(), bidir = maskpack_rule_default();
    win.window_left = 33;
    win.window_right = 4;
    bidir.causal = 0;
    int64_t len[4] = {130, 1, 49, 300};
    const maskpack_rule *rules[3] = {&causal, &win, &bidir};
    const int64_t dims[3] = {64, 128, 93};
    for (int ri = 0; ri < 3; ri++) {
        maskpack_layout *L = from_lengths(len, 4, ri == 2 ? MASKPACK_PLACE_RIGHT : MASKPACK_PLACE_PACKED, 0, rules[ri]);
        if (!L) return;
        prob p = make_prob(L, 4, 2, dims[ri], 0);
        for (int threads = 1; threads <= 2; threads++) {
            double cap = ri == 1 ? 20.0 : 0;
            result a, b;
            maskpack_error e;
            CHECK_OK(run(&p, "avx2", 0, cap, threads, 1, &a, &e), e);
            CHECK_OK(run(&p, "avx512", 0, cap, threads, 1, &b, &e), e);
            int same = !memcmp(a.out, b.out, (size_t)nq_el(&p) * 4) && !memcmp(a.dq, b.dq, (size_t)nq_el(&p) * 4) &&
                       !memcmp(a.dk, b.dk, (size_t)nk_el(&p) * 4) && !memcmp(a.dv, b.dv, (size_t)nk_el(&p) * 4) &&
                       !memcmp(a.lse, b.lse, (size_t)(p.B * p.Hq * p.S) * 4);
            CHECK(same);
            if (!same) fprintf(stderr, "  avx2 vs avx512: rule %d, %d threads: outputs differ\n", ri, threads);
            free_result(&a);
            free_result(&b);
        }
        free_prob(&p);
        maskpack_layout_free(L);
    }
}

/* A random layout: random lengths, placement, rule. */
static void test_random_layouts(void) {
    for (int t = 0; t < 6; t++) {
        int64_t n = rnd_in(1, 5), len[5];
        for (int64_t i = 0; i < n; i++) len[i] = rnd_in(0, 120);
        maskpack_rule r = maskpack_rule_default();
        r.causal = (int)rnd_in(0, 1);
        if (rnd_in(0, 2) == 0) r.window_left = rnd_in(0, 50);
        if (rnd_in(0, 2) == 0) r.window_right = rnd_in(0, 10);
        maskpack_placement pl = (maskpack_placement)rnd_in(0, 2);
        maskpack_layout *L = from_lengths(len, (size_t)n, pl, 0, &r);
        int64_t D = (int64_t[]){16, 64, 100, 128}[rnd_in(0, 3)];
        int64_t hk = rnd_in(1, 2), g = rnd_in(1, 2);
        char name[64];
        snprintf(name, sizeof name, "random #%d", t);
        if (L) check_all_isas(L, hk * g, hk, D, 0, 0, name);
        maskpack_layout_free(L);
    }
}

/* ---- placement independence ---------------------------------------------------------------------- */

/* out/lse of a packed run equal (bitwise, f32) the padded run's valid tokens, for every kernel;
 * and likewise a CP shard's outputs equal the unsharded rows. */
static void test_packed_equals_padded(void) {
    int64_t len[4] = {130, 1, 49, 96};
    maskpack_rule rules[3] = {maskpack_rule_default(), maskpack_rule_default(), maskpack_rule_default()};
    rules[1].causal = 0;
    rules[2].window_left = 20;
    for (int ri = 0; ri < 3; ri++) {
        maskpack_layout *Lp = from_lengths(len, 4, MASKPACK_PLACE_PACKED, 0, &rules[ri]);
        maskpack_layout *Ld = from_lengths(len, 4, MASKPACK_PLACE_RIGHT, 160, &rules[ri]);
        if (!Lp || !Ld) return;
        int64_t H = 2, D = 64;
        prob pp = make_prob(Lp, H, 1, D, 0), pd = make_prob(Ld, H, 1, D, 0);
        /* same tokens in both: copy the packed values into the padded rows; NaN in the padding */
        for (int64_t i = 0; i < nq_el(&pd); i++) pd.q[i] = pd.dout[i] = NAN;
        for (int64_t i = 0; i < nk_el(&pd); i++) pd.k[i] = pd.v[i] = NAN;
        int64_t t = 0;
        for (int64_t s = 0; s < 4; s++)
            for (int64_t i = 0; i < len[s]; i++, t++) {
                memcpy(pd.q + (s * 160 + i) * H * D, pp.q + t * H * D, (size_t)(H * D) * sizeof(float));
                memcpy(pd.dout + (s * 160 + i) * H * D, pp.dout + t * H * D, (size_t)(H * D) * sizeof(float));
                memcpy(pd.k + (s * 160 + i) * D, pp.k + t * D, (size_t)D * sizeof(float));
                memcpy(pd.v + (s * 160 + i) * D, pp.v + t * D, (size_t)D * sizeof(float));
            }
        for (int x = 0; x < n_isas; x++) {
            result rp, rd;
            maskpack_error e;
            CHECK_OK(run(&pp, isas[x], 0, 0, 2, 1, &rp, &e), e);
            CHECK_OK(run(&pd, isas[x], 0, 0, 2, 1, &rd, &e), e);
            int same = 1, finite = 1;
            t = 0;
            for (int64_t s = 0; s < 4; s++)
                for (int64_t i = 0; i < len[s]; i++, t++) {
                    if (memcmp(rd.out + (s * 160 + i) * H * D, rp.out + t * H * D, (size_t)(H * D) * 4)) same = 0;
                    if (memcmp(rd.dq + (s * 160 + i) * H * D, rp.dq + t * H * D, (size_t)(H * D) * 4)) same = 0;
                    if (memcmp(rd.dk + (s * 160 + i) * D, rp.dk + t * D, (size_t)D * 4)) same = 0;
                    if (memcmp(rd.dv + (s * 160 + i) * D, rp.dv + t * D, (size_t)D * 4)) same = 0;
                    for (int64_t h = 0; h < H; h++)
                        if (memcmp(&rd.lse[(s * H + h) * 160 + i], &rp.lse[h * pp.S + t], 4)) same = 0;
                    for (int64_t d = 0; d < H * D; d++) finite &= isfinite(rd.out[(s * 160 + i) * H * D + d]) != 0;
                }
            /* padding rows and columns of the padded run: exactly 0 (NaN never leaks) */
            int pad_zero = 1;
            for (int64_t s = 0; s < 4; s++)
                for (int64_t i = len[s]; i < 160; i++) {
                    for (int64_t d = 0; d < H * D; d++) {
                        pad_zero &= rd.out[(s * 160 + i) * H * D + d] == 0 && rd.dq[(s * 160 + i) * H * D + d] == 0;
                    }
                    for (int64_t d = 0; d < D; d++)
                        pad_zero &= rd.dk[(s * 160 + i) * D + d] == 0 && rd.dv[(s * 160 + i) * D + d] == 0;
                }
            CHECK(same);
            CHECK(finite);
            CHECK(pad_zero);
            if (!same || !finite || !pad_zero)
                fprintf(stderr, "  packed vs padded, rule %d, isa %s: same %d finite %d pad_zero %d\n", ri, isas[x],
                        same, finite, pad_zero);
            free_result(&rp);
            free_result(&rd);
        }
        free_prob(&pp);
        free_prob(&pd);
        maskpack_layout_free(Lp);
        maskpack_layout_free(Ld);
    }
}

/* A zigzag CP shard (pieces with explicit positions sharing their keys): outputs of the shard's
 * tokens equal the unsharded run's (bitwise, f32), and its gradients match the reference. */
static void test_cp_shard(void) {
    int64_t len[2] = {192, 96};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = from_lengths(len, 2, MASKPACK_PLACE_PACKED, 0, &r);
    if (!L) return;
    int64_t H = 2, D = 64, T = 288;
    prob full = make_prob(L, H, 1, D, 0);
    for (int64_t rank = 0; rank < 2; rank++) {
        maskpack_layout *S = NULL;
        maskpack_error e;
        CHECK_OK(maskpack_layout_cp_shard(L, 2, rank, MASKPACK_CP_ZIGZAG, &S, &e), e);
        if (!S) continue;
        int64_t idx[144], n = 144;
        maskpack_tensor ti = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &n);
        CHECK_OK(maskpack_cp_shard_indices(L, 2, rank, MASKPACK_CP_ZIGZAG, &ti, &e), e);
        prob sh = make_prob(S, H, 1, D, 0);
        CHECK_EQ(sh.S, 144);
        CHECK_EQ(sh.Skv, T);
        memcpy(sh.k, full.k, (size_t)nk_el(&full) * sizeof(float));
        memcpy(sh.v, full.v, (size_t)nk_el(&full) * sizeof(float));
        for (int64_t t = 0; t < 144; t++) {
            memcpy(sh.q + t * H * D, full.q + idx[t] * H * D, (size_t)(H * D) * sizeof(float));
            memcpy(sh.dout + t * H * D, full.dout + idx[t] * H * D, (size_t)(H * D) * sizeof(float));
        }
        for (int x = 0; x < n_isas; x++) {
            result rf, rs;
            CHECK_OK(run(&full, isas[x], 0, 0, 2, 0, &rf, &e), e);
            CHECK_OK(run(&sh, isas[x], 0, 0, 2, 1, &rs, &e), e);
            int same = 1;
            for (int64_t t = 0; t < 144; t++) {
                if (memcmp(rs.out + t * H * D, rf.out + idx[t] * H * D, (size_t)(H * D) * 4)) same = 0;
                for (int64_t h = 0; h < H; h++)
                    if (memcmp(&rs.lse[h * 144 + t], &rf.lse[h * T + idx[t]], 4)) same = 0;
            }
            CHECK(same);
            if (!same)
                fprintf(stderr, "  cp shard rank %lld isa %s: outputs differ from the unsharded run\n", (long long)rank,
                        isas[x]);
            free_result(&rf);
            free_result(&rs);
        }
        /* the shard's own gradients (keys shared by its two pieces) against the reference */
        dense ref = dense_ref(&sh, 1 / sqrt((double)D), 0, 1);
        for (int x = 0; x < n_isas; x++) {
            result rs;
            CHECK_OK(run(&sh, isas[x], 0, 0, 2, 1, &rs, &e), e);
            check_against(&sh, &rs, &ref, 1, "cp shard");
            free_result(&rs);
        }
        free_dense(&ref);
        free_prob(&sh);
        maskpack_layout_free(S);
    }
    free_prob(&full);
    maskpack_layout_free(L);
}

/* Keys no query may see are never read: top-left causal cross attention with kv_len > q_len
 * never looks past key q_len - 1; NaN planted there stays out of every output. */
static void test_excluded_keys_untouched(void) {
    maskpack_segment s[1] = {{0, 0, 100, 0, 300}};
    maskpack_rule r = maskpack_rule_default();
    r.alignment = MASKPACK_ALIGN_TOP_LEFT;
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, 1, 1, 100, 300, 1, &r, &L, &e), e);
    if (!L) return;
    prob p = make_prob(L, 1, 1, 64, 0);
    dense ref = dense_ref(&p, 0.125, 0, 1);
    for (int64_t j = 128; j < 300; j++)
        for (int64_t d = 0; d < 64; d++) p.k[j * 64 + d] = p.v[j * 64 + d] = NAN;
    for (int x = 0; x < n_isas; x++) {
        result res;
        CHECK_OK(run(&p, isas[x], 0, 0, 1, 1, &res, &e), e);
        check_against(&p, &res, &ref, 0, "excluded keys");
        int finite = 1;
        for (int64_t i = 0; i < nq_el(&p); i++) finite &= isfinite(res.out[i]) && isfinite(res.dq[i]);
        for (int64_t i = 0; i < 128 * 64; i++) finite &= isfinite(res.dk[i]) && isfinite(res.dv[i]);
        CHECK(finite);
        free_result(&res);
    }
    free_dense(&ref);
    free_prob(&p);
    maskpack_layout_free(L);
}

/* Strided views (q, k, v interleaved in one [T, 3, H, D] buffer) give the contiguous answer. */
static void test_strided(void) {
    int64_t len[2] = {50, 70};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = from_lengths(len, 2, MASKPACK_PLACE_PACKED, 0, &r);
    if (!L) return;
    int64_t T = 120, H = 2, D = 32;
    prob p = make_prob(L, H, H, D, 0);
    float *qkv = malloc((size_t)(T * 3 * H * D) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        memcpy(qkv + (t * 3 + 0) * H * D, p.q + t * H * D, (size_t)(H * D) * 4);
        memcpy(qkv + (t * 3 + 1) * H * D, p.k + t * H * D, (size_t)(H * D) * 4);
        memcpy(qkv + (t * 3 + 2) * H * D, p.v + t * H * D, (size_t)(H * D) * 4);
    }
    /* out with a padded head stride as well */
    float *out = malloc((size_t)(T * H * 40) * sizeof(float));
    for (int x = 0; x < n_isas; x++) {
        use_isa(isas[x]);
        maskpack_tensor tq, tk, tv, to;
        memset(&tq, 0, sizeof tq);
        tq.dtype = MASKPACK_F32;
        tq.ndim = 3;
        tq.shape[0] = T;
        tq.shape[1] = H;
        tq.shape[2] = D;
        tq.strides[0] = 3 * H * D;
        tq.strides[1] = D;
        tq.strides[2] = 1;
        tk = tv = tq;
        tq.data = qkv;
        tk.data = qkv + H * D;
        tv.data = qkv + 2 * H * D;
        to = tq;
        to.data = out;
        to.strides[0] = H * 40;
        to.strides[1] = 40;
        float lse[240];
        int64_t ls[2] = {H, T};
        maskpack_tensor tl = maskpack_tensor_contiguous(lse, MASKPACK_F32, 2, ls);
        maskpack_error e;
        CHECK_OK(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tl, 2, NULL, 0, &e), e);
        result ref;
        CHECK_OK(run(&p, isas[x], 0, 0, 2, 0, &ref, &e), e);
        int same = 1;
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                if (memcmp(out + (t * H + h) * 40, ref.out + (t * H + h) * D, (size_t)D * 4)) same = 0;
        CHECK(same);
        free_result(&ref);
    }
    free(out);
    free(qkv);
    free_prob(&p);
    maskpack_layout_free(L);
}

/* ---- bad input --------------------------------------------------------------------------------- */

static void test_bad_input(void) {
    int64_t len[2] = {5, 3};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = from_lengths(len, 2, MASKPACK_PLACE_RIGHT, 0, &r);
    if (!L) return;
    enum { B = 2, S = 5, H = 2, D = 8 };
    static float q[B * S * H * D], k[B * S * H * D], v[B * S * H * D], out[B * S * H * D], lse[B * H * S];
    static float dq[B * S * H * D], dk[B * S * H * D], dv[B * S * H * D];
    fill_random(q, B * S * H * D, 0);
    fill_random(k, B * S * H * D, 0);
    fill_random(v, B * S * H * D, 0);
    int64_t sh[4] = {B, S, H, D}, shl[3] = {B, H, S};
    maskpack_tensor tq = maskpack_tensor_contiguous(q, MASKPACK_F32, 4, sh),
                    tk = maskpack_tensor_contiguous(k, MASKPACK_F32, 4, sh),
                    tv = maskpack_tensor_contiguous(v, MASKPACK_F32, 4, sh),
                    to = maskpack_tensor_contiguous(out, MASKPACK_F32, 4, sh),
                    tl = maskpack_tensor_contiguous(lse, MASKPACK_F32, 3, shl);
    maskpack_tensor tdq = maskpack_tensor_contiguous(dq, MASKPACK_F32, 4, sh),
                    tdk = maskpack_tensor_contiguous(dk, MASKPACK_F32, 4, sh),
                    tdv = maskpack_tensor_contiguous(dv, MASKPACK_F32, 4, sh);
    maskpack_error e;
    use_isa("ref");
#define UNTOUCHED()                                                                                                    \
    do {                                                                                                               \
        int ok_ = 1;                                                                                                   \
        for (int i_ = 0; i_ < B * S * H * D; i_++)                                                                     \
            ok_ &= out[i_] == 7.0f && dq[i_] == 7.0f && dk[i_] == 7.0f && dv[i_] == 7.0f;                              \
        for (int i_ = 0; i_ < B * H * S; i_++) ok_ &= lse[i_] == 7.0f;                                                 \
        CHECK(ok_);                                                                                                    \
    } while (0)
#define RESET()                                                                                                        \
    do {                                                                                                               \
        for (int i_ = 0; i_ < B * S * H * D; i_++) out[i_] = dq[i_] = dk[i_] = dv[i_] = 7.0f;                          \
        for (int i_ = 0; i_ < B * H * S; i_++) lse[i_] = 7.0f;                                                         \
    } while (0)
    RESET();
    /* non-finite scale, bad softcap, bad threads */
    CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, NAN, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "scale");
    CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, INFINITY, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, -1, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "softcap");
    CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tl, 0, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    /* mismatched heads: Hq = 2, Hkv = 3 is not a divisor */
    {
        int64_t s3[4] = {B, S, 3, D};
        static float k3[B * S * 3 * D];
        maskpack_tensor t3 = maskpack_tensor_contiguous(k3, MASKPACK_F32, 4, s3);
        CHECK_STATUS(attn_fwd(L, &tq, &t3, &t3, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "multiple of key heads");
    }
    /* mismatched head dims */
    {
        int64_t s4[4] = {B, S, H, 4};
        maskpack_tensor t4 = maskpack_tensor_contiguous(k, MASKPACK_F32, 4, s4);
        CHECK_STATUS(attn_fwd(L, &tq, &t4, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "head dim");
    }
    /* dtypes: k in bf16 with q in f32; lse in bf16; f64 inputs */
    {
        maskpack_tensor tb = tk;
        tb.dtype = MASKPACK_BF16;
        CHECK_STATUS(attn_fwd(L, &tq, &tb, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_DTYPE, e);
        maskpack_tensor tlb = tl;
        tlb.dtype = MASKPACK_BF16;
        CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tlb, 1, NULL, 0, &e), MASKPACK_ERR_DTYPE, e);
        maskpack_tensor tob = to;
        tob.dtype = MASKPACK_BF16;
        CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &tob, &tl, 1, NULL, 0, &e), MASKPACK_ERR_DTYPE, e);
        maskpack_tensor t64 = tq;
        t64.dtype = MASKPACK_F64;
        CHECK_STATUS(attn_fwd(L, &t64, &tk, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_DTYPE, e);
    }
    /* strides: a non-contiguous head dim */
    {
        maskpack_tensor ts = tq;
        ts.shape[3] = 4;
        ts.strides[3] = 2;
        maskpack_tensor tks = tk, tvs = tv, tos = to;
        tks.shape[3] = tvs.shape[3] = tos.shape[3] = 4;
        CHECK_STATUS(attn_fwd(L, &ts, &tks, &tvs, 0, 0, &tos, &tl, 1, NULL, 0, &e), MASKPACK_ERR_UNSUPPORTED, e);
        CHECK_MSG(e, "contiguous");
    }
    /* layouts that do not cover the tensors: a layout of width 6, a packed layout */
    {
        int64_t len6[2] = {6, 3};
        maskpack_layout *L6 = from_lengths(len6, 2, MASKPACK_PLACE_RIGHT, 0, &r);
        CHECK_STATUS(attn_fwd(L6, &tq, &tk, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "expected 6 columns");
        maskpack_layout_free(L6);
        maskpack_layout *Lp = from_lengths(len, 2, MASKPACK_PLACE_PACKED, 0, &r);
        CHECK_STATUS(attn_fwd(Lp, &tq, &tk, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
        maskpack_layout_free(Lp);
        CHECK_STATUS(attn_fwd(NULL, &tq, &tk, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    }
    /* lse of the wrong shape; out of the wrong shape */
    {
        int64_t bad[3] = {B, S, H};
        maskpack_tensor tlx = maskpack_tensor_contiguous(lse, MASKPACK_F32, 3, bad);
        CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tlx, 1, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "[B, Hq, S]");
        int64_t s1[4] = {B, S, 1, D};
        maskpack_tensor tox = maskpack_tensor_contiguous(out, MASKPACK_F32, 4, s1);
        CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &tox, &tl, 1, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
    }
    /* overlap: out aliasing q */
    {
        /* q (also the output here) keeps its values bit for bit, and lse is not written either */
        static float q_before[B * S * H * D];
        memcpy(q_before, q, sizeof q_before);
        for (int i = 0; i < B * H * S; i++) lse[i] = 7.0f;
        maskpack_tensor tox = tq;
        CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &tox, &tl, 1, NULL, 0, &e), MASKPACK_ERR_OVERLAP, e);
        CHECK(memcmp(q, q_before, sizeof q_before) == 0);
        int lse_kept = 1;
        for (int i = 0; i < B * H * S; i++) lse_kept &= lse[i] == 7.0f;
        CHECK(lse_kept);
    }
    /* workspace too small, or NULL with a size */
    {
        size_t need = 0;
        CHECK_OK(maskpack_attention_forward_workspace(L, &tq, &tk, &tv, OPTS_NT(2), &need, &e), e);
        CHECK(need > 0);
        char *ws = malloc(need);
        CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tl, 2, ws, need - 1, &e), MASKPACK_ERR_BUFFER_TOO_SMALL, e);
        CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tl, 2, NULL, 16, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
        free(ws);
    }
    /* an unknown ISA in MASKPACK_ISA (read by AUTO), and one out of range per call */
    setenv("MASKPACK_ISA", "sse9", 1);
    call_isa = MASKPACK_ISA_AUTO;
    CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "MASKPACK_ISA");
    maskpack_isa isa;
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &isa, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    unsetenv("MASKPACK_ISA");
    call_isa = (maskpack_isa)17;
    CHECK_STATUS(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "isa") == 0);
    use_isa("ref");
    /* backward: mismatches */
    CHECK_STATUS(attn_bwd(L, &to, &tq, &tk, &tv, &to, &tl, NAN, 0, &tdq, &tdk, &tdv, 1, NULL, 0, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    {
        maskpack_tensor tdqb = tdq;
        tdqb.dtype = MASKPACK_BF16;
        CHECK_STATUS(attn_bwd(L, &to, &tq, &tk, &tv, &to, &tl, 0, 0, &tdqb, &tdk, &tdv, 1, NULL, 0, &e),
                     MASKPACK_ERR_DTYPE, e);
        CHECK_STATUS(attn_bwd(L, &to, &tq, &tk, &tv, &to, &tl, 0, 0, &tdq, &tdq, &tdv, 1, NULL, 0, &e),
                     MASKPACK_ERR_OVERLAP, e);
        CHECK_STATUS(attn_bwd(L, &to, &tq, &tk, &tv, &to, NULL, 0, 0, &tdq, &tdk, &tdv, 1, NULL, 0, &e),
                     MASKPACK_ERR_NULL_ARGUMENT, e);
        int64_t s4[4] = {B, S, H, 4};
        maskpack_tensor t4 = maskpack_tensor_contiguous(dv, MASKPACK_F32, 4, s4);
        CHECK_STATUS(attn_bwd(L, &to, &tq, &tk, &tv, &to, &tl, 0, 0, &tdq, &tdk, &t4, 1, NULL, 0, &e),
                     MASKPACK_ERR_SHAPE, e);
    }
    UNTOUCHED();
    /* a valid call now writes */
    CHECK_OK(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, &tl, 1, NULL, 0, &e), e);
    CHECK(out[0] != 7.0f);
    CHECK(lse[0] != 7.0f);
#undef UNTOUCHED
#undef RESET
    maskpack_layout_free(L);
}

/* Packed run rp and right-padded run rd (rows W wide) of the same tokens agree bitwise. */
static int packed_padded_same(const prob *pp, const result *rp, const result *rd, const int64_t *len, int64_t n,
                              int64_t W) {
    int64_t Hq = pp->Hq, Hkv = pp->Hkv, D = pp->D, t = 0;
    int same = 1;
    for (int64_t s = 0; s < n; s++)
        for (int64_t i = 0; i < len[s]; i++, t++) {
            if (memcmp(rd->out + (s * W + i) * Hq * D, rp->out + t * Hq * D, (size_t)(Hq * D) * 4)) same = 0;
            if (memcmp(rd->dq + (s * W + i) * Hq * D, rp->dq + t * Hq * D, (size_t)(Hq * D) * 4)) same = 0;
            if (memcmp(rd->dk + (s * W + i) * Hkv * D, rp->dk + t * Hkv * D, (size_t)(Hkv * D) * 4)) same = 0;
            if (memcmp(rd->dv + (s * W + i) * Hkv * D, rp->dv + t * Hkv * D, (size_t)(Hkv * D) * 4)) same = 0;
            for (int64_t h = 0; h < Hq; h++)
                if (memcmp(&rd->lse[(s * Hq + h) * W + i], &rp->lse[h * pp->S + t], 4)) same = 0;
        }
    return same;
}

/* Fills the right-padded problem pd (rows W wide) with the tokens of the packed problem pp
 * (sequences of lengths len[0..n)): pads 0, each token at (sequence, position). */
static void copy_packed_to_padded(const prob *pp, prob *pd, const int64_t *len, int64_t n, int64_t W) {
    int64_t Hq = pp->Hq, Hkv = pp->Hkv, D = pp->D, t = 0;
    for (int64_t i = 0; i < nq_el(pd); i++) pd->q[i] = pd->dout[i] = 0;
    for (int64_t i = 0; i < nk_el(pd); i++) pd->k[i] = pd->v[i] = 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t i = 0; i < len[s]; i++, t++) {
            memcpy(pd->q + (s * W + i) * Hq * D, pp->q + t * Hq * D, (size_t)(Hq * D) * sizeof(float));
            memcpy(pd->dout + (s * W + i) * Hq * D, pp->dout + t * Hq * D, (size_t)(Hq * D) * sizeof(float));
            memcpy(pd->k + (s * W + i) * Hkv * D, pp->k + t * Hkv * D, (size_t)(Hkv * D) * sizeof(float));
            memcpy(pd->v + (s * W + i) * Hkv * D, pp->v + t * Hkv * D, (size_t)(Hkv * D) * sizeof(float));
        }
}

/* Sequences longer than the AVX-512 backward's chunks: it runs up to 16 query blocks of one segment
 * and head together (two by two) over super-blocks of 256 keys. Lengths past both (several chunks
 * and super-blocks, a partial last one, an odd block left alone) under every rule: packed and
 * padded runs stay bitwise equal and match the reference; 1 thread (forward by whole units), 2
 * threads (forward by single blocks), and one sequence of one head (the backward's split over
 * threads). */
static void long_sequences(const char *isa) {
    int64_t len[3] = {1100, 70, 820}, W = 1100;

    maskpack_rule rules[3] = {maskpack_rule_default(), maskpack_rule_default(), maskpack_rule_default()};
    rules[1].causal = 0;
    rules[2].window_left = 300;
    for (int ri = 0; ri < 3; ri++) {
        maskpack_layout *Lp = from_lengths(len, 3, MASKPACK_PLACE_PACKED, 0, &rules[ri]);
        maskpack_layout *Ld = from_lengths(len, 3, MASKPACK_PLACE_RIGHT, W, &rules[ri]);
        if (!Lp || !Ld) return;
        int64_t Hq = 4, Hkv = 2, D = 32;
        prob pp = make_prob(Lp, Hq, Hkv, D, 0), pd = make_prob(Ld, Hq, Hkv, D, 0);
        copy_packed_to_padded(&pp, &pd, len, 3, W);
        dense ref = dense_ref(&pp, 1 / sqrt((double)D), 0, 1);
        for (int threads = 1; threads <= 2; threads++) {
            result rp, rd;
            maskpack_error e;
            char what[100];
            snprintf(what, sizeof what, "long sequences, %s, rule %d, %d threads", isa, ri, threads);
            CHECK_OK(run(&pp, isa, 0, 0, threads, 1, &rp, &e), e);
            CHECK_OK(run(&pd, isa, 0, 0, threads, 1, &rd, &e), e);
            check_against(&pp, &rp, &ref, 1, what);
            int same = packed_padded_same(&pp, &rp, &rd, len, 3, W);
            CHECK(same);
            if (!same) fprintf(stderr, "  %s: packed and padded differ\n", what);
            free_result(&rp);
            free_result(&rd);
        }
        free_dense(&ref);
        free_prob(&pp);
        free_prob(&pd);
        maskpack_layout_free(Lp);
        maskpack_layout_free(Ld);
    }
    /* one long causal sequence of one head on 2 threads: the backward splits its blocks */
    int64_t one[1] = {1000};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = from_lengths(one, 1, MASKPACK_PLACE_PACKED, 0, &r);
    if (!L) return;
    prob p = make_prob(L, 1, 1, 48, 0);
    dense ref = dense_ref(&p, 0.2, 0, 1);
    result a, b;
    maskpack_error e;
    CHECK_OK(run(&p, isa, 0.2, 0, 2, 1, &a, &e), e);
    CHECK_OK(run(&p, isa, 0.2, 0, 2, 1, &b, &e), e);
    check_against(&p, &a, &ref, 1, "one long sequence, 2 threads");
    CHECK(memcmp(a.dk, b.dk, (size_t)nk_el(&p) * 4) == 0);
    CHECK(memcmp(a.dq, b.dq, (size_t)nq_el(&p) * 4) == 0);
    free_result(&a);
    free_result(&b);
    free_dense(&ref);
    free_prob(&p);
    maskpack_layout_free(L);
}

static void test_long_sequences(void) {
    for (int x = 1; x < n_isas; x++) long_sequences(isas[x]);
}

/* Scores that jump by more than 2^128 (in the exponent) from one chunk of key tiles to the next:
 * a kernel that takes a chunk's exponents against a stale running max (the AMX forward's "lazy
 * max", which must redo a row whose scores outgrew it) overflows P to inf there, while a small
 * jump only costs bits and is invisible to a tolerance. Queries are all ones; the first 256 keys
 * (the AMX kernel's first chunk) score about 0 and the rest about 768 (138 in log2 units at the
 * scale 1/8), flat after that, so the second chunk outgrows the max and the later ones do not.
 * Forward only: with scores near 768 the f32 dot products themselves carry ~4e-4 absolute error
 * (about 5e-5 relative in P), so out is held to 5e-4 of sum_j P_j |v_j| in f32 and 1e-2 in bf16
 * (P and the output rounded to 8 bits), and lse to 1e-6 relative (TOL_LSE_P_ROUNDED for the kernels
 * that sum a bf16 P); every value must be finite. */
static void test_steep_score_jump(void) {
    int64_t len[1] = {1024};
    maskpack_rule bidir = maskpack_rule_default();
    bidir.causal = 0;
    maskpack_layout *L = from_lengths(len, 1, MASKPACK_PLACE_PACKED, 0, &bidir);
    if (!L) return;
    for (int bf = 0; bf < 2; bf++) {
        prob p = make_prob(L, 1, 1, 64, bf);
        for (int64_t j = 0; j < p.Skv; j++)
            for (int64_t c = 0; c < p.D; c++) {
                float kv = (j < 256 ? 0.0f : 12.0f) + 0.25f * p.k[j * p.D + c];
                p.k[j * p.D + c] = bf ? from_bf16(to_bf16(kv)) : kv;
            }
        for (int64_t i = 0; i < nq_el(&p); i++) p.q[i] = 1.0f;
        dense ref = dense_ref(&p, 0.125, 0, 0);
        for (int x = 0; x < n_isas; x++) {
            result r;
            maskpack_error e;
            CHECK_OK(run(&p, isas[x], 0.125, 0, 2, 0, &r, &e), e);
            double e_out = 0, e_lse = 0;
            for (int64_t i = 0; i < nq_el(&p); i++) {
                double d = fabs((double)r.out[i] - ref.out[i]) / (ref.absout[i] + 1e-30);
                if (!(d <= e_out)) e_out = isnan(d) ? INFINITY : d;
            }
            for (int64_t i = 0; i < p.S; i++) {
                double d = fabs((double)r.lse[i] - ref.lse[i]) / (1 + fabs(ref.lse[i]));
                if (!(d <= e_lse)) e_lse = isnan(d) ? INFINITY : d;
            }
            /* lse: 1e-6 relative, except for the bf16 kernels that sum P rounded to bf16 (their
             * bound, TOL_LSE_P_ROUNDED: l moves by up to 2^-9 of itself) */
            const double tol_lse = bf && p_rounded[x] ? TOL_LSE_P_ROUNDED : 1e-6;
            CHECK(e_out <= (bf ? 1e-2 : 5e-4));
            CHECK(e_lse <= tol_lse);
            if (!(e_out <= (bf ? 1e-2 : 5e-4)) || !(e_lse <= tol_lse))
                fprintf(stderr, "  steep score jump, %s, %s: out %.3g lse %.3g\n", bf ? "bf16" : "f32", isas[x], e_out,
                        e_lse);
            free_result(&r);
        }
        free_dense(&ref);
        free_prob(&p);
    }
    maskpack_layout_free(L);
}

/* Two runs with the same threads are bitwise equal (deterministic reductions); 1 vs 2 threads
 * agree to rounding. One sequence of one head: the split path of the backward. */
static void test_threads_deterministic(void) {
    int64_t len[1] = {300};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = from_lengths(len, 1, MASKPACK_PLACE_PACKED, 0, &r);
    if (!L) return;
    prob p = make_prob(L, 1, 1, 64, 0);
    dense ref = dense_ref(&p, 0.125, 0, 1);
    for (int x = 0; x < n_isas; x++) {
        result a, b, c;
        maskpack_error e;
        CHECK_OK(run(&p, isas[x], 0, 0, 2, 1, &a, &e), e);
        CHECK_OK(run(&p, isas[x], 0, 0, 2, 1, &b, &e), e);
        CHECK_OK(run(&p, isas[x], 0, 0, 1, 1, &c, &e), e);
        CHECK(memcmp(a.out, b.out, (size_t)nq_el(&p) * 4) == 0);
        CHECK(memcmp(a.dk, b.dk, (size_t)nk_el(&p) * 4) == 0);
        CHECK(memcmp(a.dq, b.dq, (size_t)nq_el(&p) * 4) == 0);
        CHECK(memcmp(a.out, c.out, (size_t)nq_el(&p) * 4) == 0);
        check_against(&p, &a, &ref, 1, "one sequence, 2 threads");
        check_against(&p, &c, &ref, 1, "one sequence, 1 thread");
        free_result(&a);
        free_result(&b);
        free_result(&c);
    }
    free_dense(&ref);
    free_prob(&p);
    maskpack_layout_free(L);
}

static void test_isa_selection(void) {
    maskpack_error e;
    maskpack_isa isa;
    unsetenv("MASKPACK_ISA");
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &isa, &e), e);
    maskpack_isa auto_f32 = isa;
    CHECK(isa == MASKPACK_ISA_REF || isa == MASKPACK_ISA_AVX2 || isa == MASKPACK_ISA_AVX512);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F64, MASKPACK_ISA_AUTO, &isa, &e),
                 MASKPACK_ERR_DTYPE, e);
    use_isa("ref");
    CHECK_OK(select_cur(MASKPACK_BF16, &isa, &e), e);
    CHECK(isa == MASKPACK_ISA_REF);
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AMX), "amx") == 0);
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AVX2), "avx2") == 0);
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AVX512), "avx512") == 0);
    /* which kernels this machine has decides isas; a forced one it lacks is an error */
    int has_avx2 = 0, has_avx512 = 0;
    use_isa("avx2");
    if (select_cur(MASKPACK_F32, &isa, &e) == MASKPACK_OK) {
        CHECK(isa == MASKPACK_ISA_AVX2);
        CHECK_OK(select_cur(MASKPACK_BF16, &isa, &e), e);
        CHECK(isa == MASKPACK_ISA_AVX2); /* bf16 too (widened) */
        isas[n_isas++] = "avx2";
        has_avx2 = 1;
    } else {
        CHECK_EQ(e.status, MASKPACK_ERR_UNSUPPORTED);
        CHECK_MSG(e, "avx2");
    }
    use_isa("avx512");
    if (select_cur(MASKPACK_F32, &isa, &e) == MASKPACK_OK) {
        isas[n_isas++] = "avx512";
        has_avx512 = 1;
        use_isa("amx");
        maskpack_status s = select_cur(MASKPACK_BF16, &isa, &e);
        if (s == MASKPACK_OK) {
            isas[n_isas++] = "amx";
            CHECK(isa == MASKPACK_ISA_AMX);
        } else {
            CHECK_EQ(s, MASKPACK_ERR_UNSUPPORTED);
            CHECK_MSG(e, "amx"); /* names the ISA and what the CPU lacks */
            CHECK_MSG(e, "AMX-TILE");
        }
    } else {
        CHECK_EQ(e.status, MASKPACK_ERR_UNSUPPORTED);
    }
    /* automatic order: avx512 > avx2 > ref for f32 */
    CHECK(auto_f32 == (has_avx512 ? MASKPACK_ISA_AVX512 : has_avx2 ? MASKPACK_ISA_AVX2 : MASKPACK_ISA_REF));
    printf("test_attention: kernels on this machine:");
    for (int x = 0; x < n_isas; x++) printf(" %s", isas[x]);
    printf("\n");
    /* the kernels this CPU cannot run are named, so a run that checked fewer says so */
    const char *all[3] = {"avx2", "avx512", "amx"};
    int missing = 0;
    for (int a = 0; a < 3; a++) {
        int found = 0;
        for (int x = 0; x < n_isas; x++) found |= !strcmp(isas[x], all[a]);
        if (!found) {
            printf("%s %s", missing++ ? "," : "test_attention: NOT RUN on this CPU (no ISA):", all[a]);
            snprintf(not_run_names + strlen(not_run_names), sizeof not_run_names - strlen(not_run_names), "%s %s",
                     not_run++ ? "," : "", all[a]);
        }
    }
    /* whether the library runs AVX512-BF16 (its own answer: the emulated test build reports it on
     * any CPU) */
    int lib_bf16 = 0;
    {
        maskpack_kernel_info info[64];
        size_t n = 0;
        CHECK_OK(maskpack_kernel_list(info, 64, &n, &e), e);
        for (size_t i = 0; i < n && i < 64; i++)
            lib_bf16 |= info[i].isa == MASKPACK_ISA_AVX512_BF16 && info[i].available;
    }
    if (has_avx512 && !lib_bf16) {
        printf("%s avx512bf16 (bf16 forward)", missing++ ? "," : "test_attention: NOT RUN on this CPU (no ISA):");
        snprintf(not_run_names + strlen(not_run_names), sizeof not_run_names - strlen(not_run_names), "%s avx512bf16",
                 not_run++ ? "," : "");
    }
    /* the AVX512-BF16 kernels by name, where the library runs them */
    if (lib_bf16) isas[n_isas++] = "avx512_bf16";
    /* bf16 forwards that round P to bf16 before the P V product (AVX512-BF16 by name, or through the
     * avx512 ISA where its dot products pay, AMX) and backwards that round P and dS (AVX512-BF16 by
     * name): held to their own bounds in check_against */
    const int dots = lib_bf16 && mp_cpu_bf16_dots_fast();
    for (int x = 0; x < n_isas; x++) {
        p_rounded[x] =
            !strcmp(isas[x], "amx") || !strcmp(isas[x], "avx512_bf16") || (!strcmp(isas[x], "avx512") && dots);
        /* AVX512-BF16 by name only; AMX also under AUTO on CPUs with AMX (attn_table.c) */
        pair_bwd[x] = !strcmp(isas[x], "avx512_bf16") || !strcmp(isas[x], "amx");
    }
    if (missing) printf("\n");
}


/* The schedule's tails on 2 threads with many units (segments x key heads >= 4 x threads): the
 * forward claims whole units, then the last units block by block; the backward claims whole units,
 * then splits the last one into pieces of its query blocks with their own dK/dV partials, summed in
 * piece order. Tail units with many blocks (pieces across heads) and with fewer blocks than pieces
 * (empty pieces); packed and padded runs stay bitwise equal, repeated runs are bitwise equal, and
 * 1 and 2 threads match the reference. */
static void schedule_tails(int x, int bf) {
    const char *isa = isas[x];
    int64_t lens[2][5] = {{300, 150, 220, 90, 40}, {40, 90, 220, 150, 300}}, W = 300;
    for (int li = 0; li < 2; li++)
        for (int causal = 0; causal <= 1; causal++) {
            maskpack_rule r = maskpack_rule_default();
            r.causal = causal;
            const int64_t *len = lens[li];
            maskpack_layout *Lp = from_lengths(len, 5, MASKPACK_PLACE_PACKED, 0, &r);
            maskpack_layout *Ld = from_lengths(len, 5, MASKPACK_PLACE_RIGHT, W, &r);
            if (!Lp || !Ld) return;
            int64_t Hq = 4, Hkv = 2, D = 64;
            prob pp = make_prob(Lp, Hq, Hkv, D, bf), pd = make_prob(Ld, Hq, Hkv, D, bf);
            copy_packed_to_padded(&pp, &pd, len, 5, W);
            dense ref = dense_ref(&pp, 1 / sqrt((double)D), 0, 1);
            result rp, rp2, rd, r1;
            maskpack_error e;
            char what[100];
            snprintf(what, sizeof what, "schedule tails, %s %s, lengths %d, causal %d", isa, bf ? "bf16" : "f32", li,
                     causal);
            CHECK_OK(run(&pp, isa, 0, 0, 2, 1, &rp, &e), e);
            CHECK_OK(run(&pp, isa, 0, 0, 2, 1, &rp2, &e), e);
            CHECK_OK(run(&pd, isa, 0, 0, 2, 1, &rd, &e), e);
            CHECK_OK(run(&pp, isa, 0, 0, 1, 1, &r1, &e), e);
            cur_isa = x;
            check_against_sc(&pp, &rp, &ref, 1, what, bf, 1 / sqrt((double)D), 0);
            check_against_sc(&pp, &r1, &ref, 1, what, bf, 1 / sqrt((double)D), 0);
            int same = packed_padded_same(&pp, &rp, &rd, len, 5, W);
            CHECK(same);
            if (!same) fprintf(stderr, "  %s: packed and padded differ\n", what);
            CHECK(memcmp(rp.out, rp2.out, (size_t)nq_el(&pp) * 4) == 0);
            CHECK(memcmp(rp.dq, rp2.dq, (size_t)nq_el(&pp) * 4) == 0);
            CHECK(memcmp(rp.dk, rp2.dk, (size_t)nk_el(&pp) * 4) == 0);
            CHECK(memcmp(rp.dv, rp2.dv, (size_t)nk_el(&pp) * 4) == 0);
            /* the forward's blocks do not depend on the schedule: 1 and 2 threads agree bitwise */
            CHECK(memcmp(rp.out, r1.out, (size_t)nq_el(&pp) * 4) == 0);
            free_result(&rp);
            free_result(&rp2);
            free_result(&rd);
            free_result(&r1);
            free_dense(&ref);
            free_prob(&pp);
            free_prob(&pd);
            maskpack_layout_free(Lp);
            maskpack_layout_free(Ld);
        }
}

static void test_schedule_tails(void) {
    /* f32 for every vector kernel; bf16 too for the backwards with their own bf16 products (the others
     * widen bf16 to the f32 code these runs cover) */
    for (int x = 1; x < n_isas; x++) {
        schedule_tails(x, 0);
        if (pair_bwd[x]) schedule_tails(x, 1);
    }
}

/* The f32 forward writes its output rows with streaming stores for the whole 64-byte lines inside
 * a row and ordinary masked stores for the partial lines at its ends: whatever the alignment of
 * the output, the values are those of an aligned run, bitwise, and no element outside the output
 * view is touched (the floats around each row and after the tensor keep their sentinel). */
static void test_output_alignment(void) {
    int64_t len[3] = {131, 40, 17}; /* several blocks, a short last block, a block of one vector */
    maskpack_rule rules[2] = {maskpack_rule_default(), maskpack_rule_default()};
    rules[1].window_left = 29;
    for (int ri = 0; ri < 2; ri++) {
        maskpack_layout *L = from_lengths(len, 3, MASKPACK_PLACE_PACKED, 0, &rules[ri]);
        if (!L) return;
        int64_t T = 188, H = 2, D = 64, RS = D + 20; /* out rows RS floats apart: gaps to check */
        prob p = make_prob(L, H, H, D, 0);
        int64_t shape[3] = {T, H, D};
        maskpack_tensor tq = maskpack_tensor_contiguous(p.q, MASKPACK_F32, 3, shape);
        maskpack_tensor tk = maskpack_tensor_contiguous(p.k, MASKPACK_F32, 3, shape);
        maskpack_tensor tv = maskpack_tensor_contiguous(p.v, MASKPACK_F32, 3, shape);
        size_t n = (size_t)(T * H * RS + 64);
        float *buf = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64), *first = NULL;
        for (int x = 0; x < n_isas && buf; x++) {
            use_isa(isas[x]);
            free(first); /* each kernel against its own aligned run */
            first = NULL;
            for (int off = 0; off < 16; off++) {
                for (size_t i = 0; i < n; i++) buf[i] = -7.5f;
                maskpack_tensor to = tq;
                to.data = buf + off;
                to.strides[0] = H * RS;
                to.strides[1] = RS;
                maskpack_error e;
                CHECK_OK(attn_fwd(L, &tq, &tk, &tv, 0, 0, &to, NULL, 2, NULL, 0, &e), e);
                if (!first) {
                    first = malloc((size_t)(T * H * D) * sizeof(float));
                    if (!first) break;
                    for (int64_t r = 0; r < T * H; r++) memcpy(first + r * D, buf + off + r * RS, (size_t)D * 4);
                    /* against the reference, once */
                    dense ref = dense_ref(&p, 1 / sqrt((double)D), 0, 0);
                    double worst = 0;
                    for (int64_t i = 0; i < T * H * D; i++) {
                        double d = fabs((double)first[i] - ref.out[i]);
                        if (d > worst) worst = d;
                    }
                    CHECK(worst < 2e-5);
                    free_dense(&ref);
                }
                int same = 1, untouched = 1;
                for (int64_t r = 0; r < T * H; r++) {
                    if (memcmp(first + r * D, buf + off + r * RS, (size_t)D * 4)) same = 0;
                    for (int64_t c = D; c < RS; c++)
                        if (buf[off + r * RS + c] != -7.5f) untouched = 0;
                }
                for (int i = 0; i < off; i++)
                    if (buf[i] != -7.5f) untouched = 0;
                for (size_t i = (size_t)(off + T * H * RS); i < n; i++)
                    if (buf[i] != -7.5f) untouched = 0;
                CHECK(same);
                CHECK(untouched);
                if (!same || !untouched)
                    fprintf(stderr, "  output alignment: %s, rule %d, offset %d: %s\n", isas[x], ri, off,
                            same ? "wrote outside the output" : "values differ from the aligned run");
            }
        }
        free(first);
        free(buf);
        free_prob(&p);
        maskpack_layout_free(L);
    }
}

int main(void) {
    verbose_fail = getenv("ATTN_TEST_VERBOSE") != NULL;
    test_isa_selection();
    test_bad_input();
    test_kernels_vs_reference();
    test_avx2_equals_avx512();
    test_random_layouts();
    test_packed_equals_padded();
    test_cp_shard();
    test_excluded_keys_untouched();
    test_strided();
    test_output_alignment();
    test_threads_deterministic();
    test_long_sequences();
    test_steep_score_jump();
    test_schedule_tails();
    unsetenv("MASKPACK_ISA");
    print_measured();
    return check_report_note("test_attention", not_run ? not_run_names : "");
}
