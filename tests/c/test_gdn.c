/* test_gdn.c: Gated DeltaNet over layouts: the GEMM/exp/transpose primitives, the rule against an
 * independent double-precision recurrence written here, recurrent vs chunked, reference vs
 * AVX-512 and AVX2 (each build this CPU runs), padded vs packed (bitwise), NaN/Inf planted in padding and in other
 * segments, zero-length and short segments, chunk-boundary lengths, continuation with state and conv
 * prefix, gradients against finite differences of the double recurrence, bf16, the conv1d,
 * L2 norm and gates with their backward, bad input leaving outputs untouched, and the empty inner
 * range of the triangular GEMM of each build this CPU runs. */
#include "check.h"
#include "cpu_features.h"
#include "internal.h"

#include "../../src/kernels/gdn/gdn_internal.h"

#include <math.h>
#include <stdlib.h>

/* ---- deterministic data -------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* uniform in [-1, 1), a pure function of (tensor, sequence, position, element, salt) */
static double uval(int tensor, int64_t seq, int64_t pos, int64_t j, uint64_t salt) {
    uint64_t h = mix(mix(mix(mix((uint64_t)tensor * 1000003u + salt) ^ (uint64_t)seq) ^ (uint64_t)pos) ^ (uint64_t)j);
    return (double)(h >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

enum { T_Q = 1, T_K, T_V, T_G, T_B, T_H0, T_DO, T_DHT, T_X, T_W, T_PRE, T_DY, T_DST };

/* value of tensor `tensor` for (seq, pos, j), in the ranges the layer produces */
static double gen(int tensor, int64_t seq, int64_t pos, int64_t j, uint64_t salt) {
    double u = uval(tensor, seq, pos, j, salt);
    switch (tensor) {
    case T_G: return -0.02 - 0.3 * (u + 1.0); /* log decay in [-0.62, -0.02] */
    case T_B: return 0.5 + 0.45 * u;          /* beta in (0.05, 0.95) */
    case T_H0: return 0.3 * u;
    default: return u;
    }
}

static float nanv(int64_t i) { return (i & 1) ? NAN : INFINITY; }

/* A per-token f32 tensor over the layout's grid ([B,S,d...] or [T,d...]) filled from gen for real
 * tokens and NaN/Inf for padding. */
typedef struct ttensor {
    float *data;
    maskpack_tensor t;
    int64_t per_token;
} ttensor;

static ttensor tok_alloc(const maskpack_layout *L, int nd, const int64_t *dims) {
    ttensor r;
    int64_t shape[6], n = 0;
    int32_t ndim = 0;
    if (maskpack_layout_is_packed(L)) {
        shape[ndim++] = maskpack_layout_q_width(L);
    } else {
        shape[ndim++] = maskpack_layout_n_rows(L);
        shape[ndim++] = maskpack_layout_q_width(L);
    }
    r.per_token = 1;
    for (int i = 0; i < nd; i++) {
        shape[ndim++] = dims[i];
        r.per_token *= dims[i];
    }
    n = maskpack_layout_n_rows(L) * maskpack_layout_q_width(L) * r.per_token;
    r.data = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) r.data[i] = nanv(i);
    r.t = maskpack_tensor_contiguous(r.data, MASKPACK_F32, ndim, shape);
    return r;
}

static void tok_fill(const maskpack_layout *L, ttensor *x, int tensor, uint64_t salt) {
    int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            int64_t seg = maskpack_segment_of_query(L, b, s);
            float *p = x->data + (b * S + s) * x->per_token;
            if (seg < 0) {
                for (int64_t j = 0; j < x->per_token; j++) p[j] = nanv(b + s + j);
                continue;
            }
            maskpack_segment g;
            maskpack_layout_segment(L, (size_t)seg, &g, NULL);
            for (int64_t j = 0; j < x->per_token; j++) p[j] = (float)gen(tensor, seg, s - g.q_start, j, salt);
        }
}

static float *tok_at(const maskpack_layout *L, const ttensor *x, size_t seg, int64_t pos) {
    maskpack_segment g;
    maskpack_layout_segment(L, seg, &g, NULL);
    return x->data + (g.row * maskpack_layout_q_width(L) + g.q_start + pos) * x->per_token;
}

/* A [N, d0, d1, d2] f32 tensor (states) or [N, d0, d1] (conv states) filled from gen. */
typedef struct stensor {
    float *data;
    maskpack_tensor t;
    int64_t per;
} stensor;

static stensor st_alloc(int64_t N, int nd, const int64_t *dims, int tensor, uint64_t salt) {
    stensor r;
    int64_t shape[4] = {N, 0, 0, 0};
    r.per = 1;
    for (int i = 0; i < nd; i++) {
        shape[1 + i] = dims[i];
        r.per *= dims[i];
    }
    r.data = malloc((size_t)(N * r.per + 1) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < r.per; j++)
            r.data[n * r.per + j] = tensor ? (float)gen(tensor, n, 0, j, salt) : nanv(j);
    r.t = maskpack_tensor_contiguous(r.data, MASKPACK_F32, 1 + nd, shape);
    return r;
}

static maskpack_layout *lay_lengths(const int64_t *lens, size_t n, maskpack_placement pl, int64_t cap) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(lens, n, pl, cap, NULL, &L, &e), e);
    return L;
}

/* ---- the independent reference: the recurrence in double, one segment ------------------------ */

typedef struct dims {
    int64_t H, HV, K, V;
} dims;

/* q, k [len][H][K], v [len][HV][V], g, beta [len][HV], h0 [HV][K][V] or NULL -> o [len][HV][V],
 * ht [HV][K][V]. */
static void naive_rule(const dims *d, int64_t len, const double *q, const double *k, const double *v, const double *g,
                       const double *beta, const double *h0, double scale, int l2, double *o, double *ht) {
    const int64_t H = d->H, HV = d->HV, K = d->K, V = d->V, G = HV / H;
    double *S = malloc((size_t)(K * V) * sizeof(double)), *qq = malloc((size_t)K * sizeof(double)),
           *kk = malloc((size_t)K * sizeof(double)), *dl = malloc((size_t)V * sizeof(double));
    for (int64_t h = 0; h < HV; h++) {
        for (int64_t i = 0; i < K * V; i++) S[i] = h0 ? h0[h * K * V + i] : 0.0;
        const int64_t kh = h / G;
        for (int64_t t = 0; t < len; t++) {
            double nq = 0, nk = 0;
            for (int64_t a = 0; a < K; a++) {
                qq[a] = q[(t * H + kh) * K + a];
                kk[a] = k[(t * H + kh) * K + a];
                nq += qq[a] * qq[a];
                nk += kk[a] * kk[a];
            }
            if (l2) {
                for (int64_t a = 0; a < K; a++) {
                    qq[a] /= sqrt(nq + 1e-6);
                    kk[a] /= sqrt(nk + 1e-6);
                }
            }
            const double eg = exp(g[t * HV + h]), b = beta[t * HV + h];
            for (int64_t i = 0; i < K * V; i++) S[i] *= eg;
            for (int64_t c = 0; c < V; c++) {
                double m = 0;
                for (int64_t a = 0; a < K; a++) m += S[a * V + c] * kk[a];
                dl[c] = b * (v[(t * HV + h) * V + c] - m);
            }
            for (int64_t a = 0; a < K; a++)
                for (int64_t c = 0; c < V; c++) S[a * V + c] += kk[a] * dl[c];
            for (int64_t c = 0; c < V; c++) {
                double m = 0;
                for (int64_t a = 0; a < K; a++) m += S[a * V + c] * qq[a];
                o[(t * HV + h) * V + c] = scale * m;
            }
        }
        for (int64_t i = 0; i < K * V; i++) ht[h * K * V + i] = S[i];
    }
    free(S);
    free(qq);
    free(kk);
    free(dl);
}

/* ---- a problem instance over a layout ----------------------------------------------------- */

typedef struct gcase {
    maskpack_layout *L;
    dims d;
    uint64_t salt;
    ttensor q, k, v, g, beta, o;
    stensor h0, ht;
    int with_h0;
} gcase;

static gcase case_make(maskpack_layout *L, dims d, uint64_t salt, int with_h0) {
    gcase c;
    memset(&c, 0, sizeof c);
    c.L = L;
    c.d = d;
    c.salt = salt;
    int64_t qd[2] = {d.H, d.K}, vd[2] = {d.HV, d.V}, hd[1] = {d.HV}, sd[3] = {d.HV, d.K, d.V};
    c.q = tok_alloc(L, 2, qd);
    c.k = tok_alloc(L, 2, qd);
    c.v = tok_alloc(L, 2, vd);
    c.g = tok_alloc(L, 1, hd);
    c.beta = tok_alloc(L, 1, hd);
    c.o = tok_alloc(L, 2, vd);
    tok_fill(L, &c.q, T_Q, salt);
    tok_fill(L, &c.k, T_K, salt);
    tok_fill(L, &c.v, T_V, salt);
    tok_fill(L, &c.g, T_G, salt);
    tok_fill(L, &c.beta, T_B, salt);
    size_t N = maskpack_layout_n_segments(L);
    c.with_h0 = with_h0;
    c.h0 = st_alloc((int64_t)N, 3, sd, T_H0, salt);
    c.ht = st_alloc((int64_t)N, 3, sd, 0, salt);
    return c;
}

static void case_free(gcase *c) {
    free(c->q.data);
    free(c->k.data);
    free(c->v.data);
    free(c->g.data);
    free(c->beta.data);
    free(c->o.data);
    free(c->h0.data);
    free(c->ht.data);
}

static maskpack_gdn_inputs case_inputs(const gcase *c) {
    maskpack_gdn_inputs in;
    in.q = &c->q.t;
    in.k = &c->k.t;
    in.v = &c->v.t;
    in.g = &c->g.t;
    in.beta = &c->beta.t;
    in.initial_state = c->with_h0 ? &c->h0.t : NULL;
    return in;
}

static maskpack_gdn_options opts_of(maskpack_isa isa, int chunked, int threads) {
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.isa = isa;
    o.chunked = chunked;
    o.n_threads = threads;
    return o;
}

static maskpack_status case_forward(gcase *c, maskpack_isa isa, int chunked, int threads) {
    maskpack_gdn_inputs in = case_inputs(c);
    maskpack_gdn_options o = opts_of(isa, chunked, threads);
    maskpack_error e;
    maskpack_status s = maskpack_gdn_forward(c->L, &in, &o, &c->o.t, &c->ht.t, NULL, 0, &e);
    if (s) fprintf(stderr, "forward: %s\n", e.message);
    return s;
}

/* max |a - b| / max |b| over the real tokens' outputs and the final states */
static double case_rel_err(const gcase *a, const gcase *b) {
    double num = 0, den = 0;
    size_t N = maskpack_layout_n_segments(a->L);
    for (size_t s = 0; s < N; s++) {
        maskpack_segment g;
        maskpack_layout_segment(a->L, s, &g, NULL);
        for (int64_t p = 0; p < g.q_len; p++) {
            const float *x = tok_at(a->L, &a->o, s, p), *y = tok_at(b->L, &b->o, s, p);
            for (int64_t j = 0; j < a->o.per_token; j++) {
                num = fmax(num, fabs((double)x[j] - y[j]));
                den = fmax(den, fabs((double)y[j]));
            }
        }
    }
    for (int64_t i = 0; i < (int64_t)N * a->ht.per; i++) {
        num = fmax(num, fabs((double)a->ht.data[i] - b->ht.data[i]));
        den = fmax(den, fabs((double)b->ht.data[i]));
    }
    return den > 0 ? num / den : num;
}

/* bitwise equality of outputs and states by (segment, position) */
static int case_same_bits(const gcase *a, const gcase *b) {
    size_t N = maskpack_layout_n_segments(a->L);
    for (size_t s = 0; s < N; s++) {
        maskpack_segment g;
        maskpack_layout_segment(a->L, s, &g, NULL);
        for (int64_t p = 0; p < g.q_len; p++)
            if (memcmp(tok_at(a->L, &a->o, s, p), tok_at(b->L, &b->o, s, p), (size_t)a->o.per_token * 4)) return 0;
    }
    return memcmp(a->ht.data, b->ht.data, (size_t)((int64_t)N * a->ht.per) * 4) == 0;
}

/* every padding element of a per-token output is exactly +0 */
static int pads_zero(const maskpack_layout *L, const ttensor *x) {
    int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            if (maskpack_segment_of_query(L, b, s) < 0)
                for (int64_t j = 0; j < x->per_token; j++) {
                    float v = x->data[(b * S + s) * x->per_token + j];
                    uint32_t bits;
                    memcpy(&bits, &v, 4);
                    if (bits != 0) return 0;
                }
    return 1;
}

/* the double recurrence on each segment of the case; returns max rel err of the case's output */
static double case_vs_naive(const gcase *c) {
    const dims *d = &c->d;
    size_t N = maskpack_layout_n_segments(c->L);
    double num = 0, den = 0;
    for (size_t s = 0; s < N; s++) {
        maskpack_segment g;
        maskpack_layout_segment(c->L, s, &g, NULL);
        int64_t n = g.q_len > 0 ? g.q_len : 1;
        double *q = malloc((size_t)(n * d->H * d->K) * 8), *k = malloc((size_t)(n * d->H * d->K) * 8),
               *v = malloc((size_t)(n * d->HV * d->V) * 8), *gg = malloc((size_t)(n * d->HV) * 8),
               *bb = malloc((size_t)(n * d->HV) * 8), *o = malloc((size_t)(n * d->HV * d->V) * 8),
               *h0 = malloc((size_t)(d->HV * d->K * d->V) * 8), *ht = malloc((size_t)(d->HV * d->K * d->V) * 8);
        for (int64_t p = 0; p < g.q_len; p++) {
            for (int64_t j = 0; j < d->H * d->K; j++) {
                q[p * d->H * d->K + j] = tok_at(c->L, &c->q, s, p)[j];
                k[p * d->H * d->K + j] = tok_at(c->L, &c->k, s, p)[j];
            }
            for (int64_t j = 0; j < d->HV * d->V; j++) v[p * d->HV * d->V + j] = tok_at(c->L, &c->v, s, p)[j];
            for (int64_t j = 0; j < d->HV; j++) {
                gg[p * d->HV + j] = tok_at(c->L, &c->g, s, p)[j];
                bb[p * d->HV + j] = tok_at(c->L, &c->beta, s, p)[j];
            }
        }
        for (int64_t j = 0; j < d->HV * d->K * d->V; j++) h0[j] = c->h0.data[(int64_t)s * c->h0.per + j];
        naive_rule(d, g.q_len, q, k, v, gg, bb, c->with_h0 ? h0 : NULL, 1.0 / sqrt((double)d->K), 1, o, ht);
        for (int64_t p = 0; p < g.q_len; p++)
            for (int64_t j = 0; j < d->HV * d->V; j++) {
                num = fmax(num, fabs(o[p * d->HV * d->V + j] - tok_at(c->L, &c->o, s, p)[j]));
                den = fmax(den, fabs(o[p * d->HV * d->V + j]));
            }
        for (int64_t j = 0; j < d->HV * d->K * d->V; j++) {
            num = fmax(num, fabs(ht[j] - c->ht.data[(int64_t)s * c->ht.per + j]));
            den = fmax(den, fabs(ht[j]));
        }
        free(q);
        free(k);
        free(v);
        free(gg);
        free(bb);
        free(o);
        free(h0);
        free(ht);
    }
    return den > 0 ? num / den : num;
}

/* whether the library runs the AVX-512 kernel here: on an AVX-512 CPU, or in the emulated test build */
static int have_avx512(void) {
    maskpack_isa r;
    maskpack_error err;
    return maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AVX512, &r, &err) == MASKPACK_OK;
}
static int have_avx2(void) { return mp_cpu_has_avx2(); }

/* The kernels this CPU runs, the reference first (then AVX-512, AVX2 when present): every
 * per-ISA test runs on each of them. Returns the count (1..3). */
#define N_ISA_MAX 3
static int isa_list(maskpack_isa out[N_ISA_MAX]) {
    int n = 0;
    out[n++] = MASKPACK_ISA_REF;
    if (have_avx512()) out[n++] = MASKPACK_ISA_AVX512;
    if (have_avx2()) out[n++] = MASKPACK_ISA_AVX2;
    return n;
}

/* The fastest kernel here (the one AUTO picks): AVX-512 > AVX2 > REF. */
static maskpack_isa best_isa(void) {
    return have_avx512() ? MASKPACK_ISA_AVX512 : have_avx2() ? MASKPACK_ISA_AVX2 : MASKPACK_ISA_REF;
}

typedef void (*gemm_fn)(int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t, float *,
                        int64_t, unsigned);
typedef void (*transpose_fn)(const float *, int64_t, int64_t, int64_t, float *, int64_t);
typedef void (*expv_fn)(float *, int64_t);

/* ---- primitives --------------------------------------------------------------------------- */

/* One vector build's GEMM, transpose and exp against the plain loops and libm. */
static void test_primitives_of(const char *name, gemm_fn gemm, transpose_fn transpose, expv_fn expv) {
    /* GEMM: every flag combination on odd sizes, the vector build vs the plain loops. m = 1..13
     * gives every row count of a tile (1..8 rows in the AVX-512 build, 1..6 in the AVX2 one) as a
     * whole block and as the remainder after full ones; the triangular flags run with kd = m. */
    const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 64}, ns[] = {16, 32, 48, 80},
                  ks[] = {1, 5, 64, 77, 0}; /* kd = 0: an empty product, C = 0 (or Cin) */
    const unsigned fl[] = {0,
                           GDN_GEMM_ACC,
                           GDN_GEMM_AT,
                           GDN_GEMM_ACC | GDN_GEMM_AT,
                           GDN_GEMM_TRI_OUT,
                           GDN_GEMM_TRI_LO,
                           GDN_GEMM_TRI_UP | GDN_GEMM_AT,
                           GDN_GEMM_TRI_LO | GDN_GEMM_ACC};
    float *A = malloc(100 * 100 * 4), *B = malloc(100 * 100 * 4), *C1 = malloc(100 * 100 * 4),
          *C2 = malloc(100 * 100 * 4);
    float *C0 = malloc(100 * 100 * 4);
    double worst = 0;
    int tri_bad = 0;
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t kk = 0; kk < 5; kk++)
                for (size_t f = 0; f < 8; f++) {
                    unsigned flags = fl[f];
                    const int tri = (flags & (GDN_GEMM_TRI_LO | GDN_GEMM_TRI_UP)) != 0;
                    if (tri && kk > 0) continue; /* square A: one kd, m */
                    int64_t m = ms[a], n = ns[b], kd = tri ? m : ks[kk];
                    for (int i = 0; i < 100 * 100; i++) {
                        A[i] = (float)uval(1, i, 0, 0, f);
                        B[i] = (float)uval(2, i, 0, 0, f);
                        C0[i] = C1[i] = C2[i] = (float)uval(3, i, 0, 0, f);
                    }
                    /* triangular A: zero the other triangle (what the kernels guarantee) */
                    for (int64_t i = 0; i < 100; i++)
                        for (int64_t k = 0; k < 100; k++) {
                            int64_t r = (flags & GDN_GEMM_AT) ? k : i, cidx = (flags & GDN_GEMM_AT) ? i : k;
                            if ((flags & GDN_GEMM_TRI_LO) && cidx > r) A[i * 100 + k] = 0;
                            if ((flags & GDN_GEMM_TRI_UP) && cidx < r) A[i * 100 + k] = 0;
                        }
                    /* TRI_OUT: the full product as well, which the upper triangle may hold */
                    if (flags & GDN_GEMM_TRI_OUT)
                        gdn_gemm_ref(m, n, kd, 0.75f, A, 100, B, 100, C0, 100, flags & ~GDN_GEMM_TRI_OUT);
                    gdn_gemm_ref(m, n, kd, 0.75f, A, 100, B, 100, C1, 100, flags);
                    gemm(m, n, kd, 0.75f, A, 100, B, 100, C2, 100, flags);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            if ((flags & GDN_GEMM_TRI_OUT) && j > i) {
                                /* "may be left unwritten": untouched, or the product itself */
                                float c = C2[i * 100 + j];
                                if (c != (float)uval(3, i * 100 + j, 0, 0, f) &&
                                    !(fabs((double)c - C0[i * 100 + j]) < 1e-4))
                                    tri_bad = 1;
                                continue;
                            }
                            worst = fmax(worst, fabs((double)C1[i * 100 + j] - C2[i * 100 + j]));
                        }
                    /* nothing is written beyond column n or in the rows past m */
                    for (int64_t i = 0; i < 100; i++)
                        for (int64_t j = i < m ? n : 0; j < 100; j++)
                            if (C2[i * 100 + j] != (float)uval(3, i * 100 + j, 0, 0, f)) tri_bad = 1;
                }
    printf("test_gdn: %s GEMM vs plain loops: worst %.2e\n", name, worst);
    CHECK(worst < 1e-4);
    CHECK(!tri_bad);
    /* the state-sized rectangular products ([Q;K] S, the state update: m >= 64, n and kd up to
     * 256, odd edges), plain and accumulating, transposed A or not, against the plain loops, and
     * nothing written past column n */
    {
        /* then: the plain product's row-blocks-outermost order (m >= 64) ending in a block of each row
         * count 1..8, 48 columns wide (a 32- and a 16-column tile per block), and an empty inner
         * dimension (kd = 0) */
        const int64_t big[][3] = {{128, 128, 128}, {130, 144, 128}, {64, 256, 64}, {70, 160, 120}, {65, 48, 8},
                                  {66, 48, 2},     {67, 48, 8},     {68, 48, 9},   {69, 48, 5},    {70, 48, 4},
                                  {71, 48, 3},     {64, 48, 4},     {67, 48, 0}};
        const int64_t ld = 272;
        float *bA = malloc((size_t)(ld * ld) * 4), *bB = malloc((size_t)(ld * ld) * 4);
        float *bC1 = malloc((size_t)(ld * ld) * 4), *bC2 = malloc((size_t)(ld * ld) * 4);
        double bworst = 0;
        for (size_t t = 0; t < sizeof big / sizeof big[0]; t++)
            for (unsigned f = 0; f < 4; f++) { /* 0, ACC, AT, ACC | AT */
                const int64_t m = big[t][0], n = big[t][1], kd = big[t][2];
                const unsigned flags = (f & 1 ? GDN_GEMM_ACC : 0) | (f & 2 ? GDN_GEMM_AT : 0);
                for (int64_t i = 0; i < ld * ld; i++) {
                    bA[i] = (float)uval(4, i, t, 0, f);
                    bB[i] = (float)uval(5, i, t, 0, f);
                    bC1[i] = bC2[i] = (float)uval(6, i, t, 0, f);
                }
                gdn_gemm_ref(m, n, kd, 0.5f, bA, ld, bB, ld, bC1, ld, flags);
                gemm(m, n, kd, 0.5f, bA, ld, bB, ld, bC2, ld, flags);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++)
                        bworst = fmax(bworst, fabs((double)bC1[i * ld + j] - bC2[i * ld + j]));
                /* nothing written past column n */
                for (int64_t i = 0; i < m; i++)
                    if (bC2[i * ld + n] != (float)uval(6, i * ld + n, t, 0, f)) tri_bad = 1;
            }
        printf("test_gdn: %s state-sized GEMM vs plain loops: worst %.2e\n", name, bworst);
        CHECK(bworst < 1e-3);
        CHECK(!tri_bad);
        free(bA);
        free(bB);
        free(bC1);
        free(bC2);
    }
    /* transpose: exact */
    float *T = malloc(100 * 100 * 4);
    int tbad = 0;
    const int64_t dims_[][2] = {{16, 16}, {64, 128}, {37, 21}, {5, 70}, {128, 24}, {8, 8}, {13, 9}};
    for (size_t i = 0; i < sizeof dims_ / sizeof dims_[0]; i++) {
        int64_t r = dims_[i][0], c = dims_[i][1];
        float *src = malloc((size_t)(r * c) * 4), *dst = malloc((size_t)(r * c + 8) * 4);
        for (int64_t j = 0; j < r * c; j++) src[j] = (float)j;
        transpose(src, c, r, c, dst, r);
        for (int64_t a = 0; a < r; a++)
            for (int64_t b = 0; b < c; b++)
                if (dst[b * r + a] != src[a * c + b]) tbad = 1;
        free(src);
        free(dst);
    }
    CHECK(!tbad);
    /* exp: relative error against libm's double exp, and the edge values */
    float xs[1003];
    for (int i = 0; i < 1000; i++) xs[i] = -87.0f + 87.0f * (float)i / 999.0f;
    xs[1000] = -INFINITY;
    xs[1001] = -200.0f;
    xs[1002] = NAN;
    float ys[1003];
    memcpy(ys, xs, sizeof xs);
    expv(ys, 1003);
    double er = 0;
    for (int i = 0; i < 1000; i++) er = fmax(er, fabs(ys[i] - exp((double)xs[i])) / exp((double)xs[i]));
    CHECK(er < 4e-7);
    CHECK(ys[1000] == 0.0f);
    CHECK(ys[1001] == 0.0f);
    CHECK(isnan(ys[1002]));
    /* the top of the range stays finite and accurate (2^128 does not fit a float's exponent: the
     * AVX2 build scales by two halves), and a tail shorter than a vector is handled */
    {
        const float hr[5] = {88.0f, 88.7f, 50.0f, 1.5f, 0.0f};
        float hx[5];
        memcpy(hx, hr, sizeof hx);
        expv(hx, 5);
        for (int i = 0; i < 5; i++) {
            const double want = exp((double)hr[i]);
            CHECK(isfinite(hx[i]) && fabs(hx[i] - want) / want < 4e-7);
        }
    }
    free(A);
    free(B);
    free(C1);
    free(C2);
    free(C0);
    free(T);
}

/* Every vector entry of the rule's kernel table this CPU runs, against plain loops. */
static void test_primitives(void) {
    int any = 0;
    size_t n;
    const gdn_kernel *K = gdn_kernels(&n);
    for (size_t i = 0; i < n; i++) {
        maskpack_isa r;
        maskpack_error e;
        if (!K[i].transpose ||
            maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, K[i].desc.isa, &r, &e) != MASKPACK_OK)
            continue;
        test_primitives_of(maskpack_isa_name(K[i].desc.isa), K[i].gemm, K[i].transpose, K[i].expv);
        any = 1;
    }
    if (!any) printf("test_gdn: no AVX-512 or AVX2 on this CPU: primitive comparison skipped\n");
}

/* ---- forward ---------------------------------------------------------------------------------- */

static const int64_t LENS[] = {0, 1, 63, 64, 65, 127, 128, 129, 3};
#define N_LENS 9

static void test_forward_forms(void) {
    dims d = {2, 4, 32, 24}; /* V = 24: padded internally to 32 */
    maskpack_layout *L = lay_lengths(LENS, N_LENS, MASKPACK_PLACE_PACKED, 0);
    if (!L) return;
    maskpack_isa isas[N_ISA_MAX];
    const int n_isa = isa_list(isas);
    gcase rec[N_ISA_MAX], chk[N_ISA_MAX];
    for (int i = 0; i < N_ISA_MAX; i++) {
        rec[i] = case_make(L, d, 7, 1);
        chk[i] = case_make(L, d, 7, 1);
    }
    for (int i = 0; i < n_isa; i++) {
        CHECK_OK(case_forward(&rec[i], isas[i], 0, 1), (maskpack_error){0});
        CHECK_OK(case_forward(&chk[i], isas[i], 1, 2), (maskpack_error){0});
        double e_rc = case_rel_err(&chk[i], &rec[i]);
        double e_naive_r = case_vs_naive(&rec[i]), e_naive_c = case_vs_naive(&chk[i]);
        printf("test_gdn: isa %d: chunked vs recurrent %.2e, recurrent vs double %.2e, chunked vs double %.2e\n",
               (int)isas[i], e_rc, e_naive_r, e_naive_c);
        CHECK(e_rc < 1e-5);
        CHECK(e_naive_r < 1e-5);
        CHECK(e_naive_c < 1e-5);
        CHECK(pads_zero(L, &chk[i].o));
        /* zero-length segment: final state = initial state, bitwise */
        CHECK(memcmp(chk[i].ht.data, chk[i].h0.data, (size_t)chk[i].h0.per * 4) == 0);
        CHECK(memcmp(rec[i].ht.data, rec[i].h0.data, (size_t)rec[i].h0.per * 4) == 0);
    }
    /* each vector build against the reference */
    for (int i = 1; i < n_isa; i++) {
        CHECK(case_rel_err(&chk[i], &chk[0]) < 1e-5);
        CHECK(case_rel_err(&rec[i], &rec[0]) < 1e-6);
    }
    for (int i = 0; i < N_ISA_MAX; i++) {
        case_free(&rec[i]);
        case_free(&chk[i]);
    }
    /* without initial state, without l2norm, an explicit scale, K not a multiple of 16 */
    {
        dims d2 = {1, 3, 20, 16};
        gcase a = case_make(L, d2, 11, 0), b = case_make(L, d2, 11, 0);
        maskpack_gdn_inputs in = case_inputs(&a);
        maskpack_gdn_options o = opts_of(MASKPACK_ISA_AUTO, 1, 1);
        o.l2norm = 0;
        o.scale = 0.5;
        maskpack_error e;
        /* unnormalised q, k of norm up to ~sqrt(20): keep the state bounded with small beta */
        for (int64_t i = 0; i < maskpack_layout_q_width(L) * 3; i++) {
            a.beta.data[i] *= 0.05f;
            b.beta.data[i] *= 0.05f;
        }
        CHECK_OK(maskpack_gdn_forward(L, &in, &o, &a.o.t, &a.ht.t, NULL, 0, &e), e);
        o.chunked = 0;
        in = case_inputs(&b);
        CHECK_OK(maskpack_gdn_forward(L, &in, &o, &b.o.t, &b.ht.t, NULL, 0, &e), e);
        CHECK(case_rel_err(&a, &b) < 1e-5);
        /* the zero initial state: a zero-length segment's final state is all zeros */
        int zero = 1;
        for (int64_t j = 0; j < a.ht.per; j++) zero &= a.ht.data[j] == 0.0f;
        CHECK(zero);
        case_free(&a);
        case_free(&b);
    }
    /* the L2 norm with K not a multiple of 16 (the AVX-512 kernels load and normalise each q, k row
     * in one pass, the last 16 columns under a mask) and with K = 16: against the double recurrence */
    {
        const dims ds[2] = {{1, 2, 37, 16}, {2, 2, 16, 16}};
        maskpack_isa isas2[N_ISA_MAX];
        const int n2 = isa_list(isas2);
        for (int ii = 0; ii < n2; ii++)
            for (int j = 0; j < 2; j++) {
                gcase c = case_make(L, ds[j], 13 + (uint64_t)j, 1);
                CHECK_OK(case_forward(&c, isas2[ii], 1, 2), (maskpack_error){0});
                CHECK(case_vs_naive(&c) < 1e-5);
                CHECK(pads_zero(L, &c.o));
                case_free(&c);
            }
    }
    maskpack_layout_free(L);
}

/* padded (right and left), packed rows and packed: bitwise equal; NaN/Inf pads change nothing;
 * thread count changes nothing; a caller workspace of the queried size works */
static void test_layout_invariance(void) {
    dims d = {2, 4, 32, 16};
    maskpack_layout *Ls[4] = {
        lay_lengths(LENS, N_LENS, MASKPACK_PLACE_PACKED, 0), lay_lengths(LENS, N_LENS, MASKPACK_PLACE_RIGHT, 0),
        lay_lengths(LENS, N_LENS, MASKPACK_PLACE_LEFT, 0), lay_lengths(LENS, N_LENS, MASKPACK_PLACE_PACKED, 200)};
    for (int i = 0; i < 4; i++)
        if (!Ls[i]) return;
    maskpack_isa isas[N_ISA_MAX];
    const int n_isa = isa_list(isas);
    for (int ii = 0; ii < n_isa; ii++)
        for (int chunked = 0; chunked <= 1; chunked++) {
            gcase base = case_make(Ls[0], d, 3, 1);
            CHECK_OK(case_forward(&base, isas[ii], chunked, 1), (maskpack_error){0});
            for (int l = 1; l < 4; l++) {
                gcase c = case_make(Ls[l], d, 3, 1);
                CHECK_OK(case_forward(&c, isas[ii], chunked, 2), (maskpack_error){0});
                CHECK(case_same_bits(&c, &base));
                CHECK(pads_zero(Ls[l], &c.o));
                case_free(&c);
            }
            /* another segment perturbed (segment 5 gets new values): every other segment's output
             * and state are bitwise unchanged */
            gcase p = case_make(Ls[1], d, 3, 1);
            for (int64_t pos = 0; pos < LENS[5]; pos++) {
                float *x = tok_at(Ls[1], &p.v, 5, pos);
                x[0] = NAN;
                x[1] = INFINITY;
                tok_at(Ls[1], &p.g, 5, pos)[0] = -50.0f;
            }
            CHECK_OK(case_forward(&p, isas[ii], chunked, 2), (maskpack_error){0});
            int same = 1;
            for (size_t s = 0; s < N_LENS; s++) {
                if (s == 5) continue;
                for (int64_t pos = 0; pos < LENS[s]; pos++)
                    same &= memcmp(tok_at(Ls[1], &p.o, s, pos), tok_at(Ls[0], &base.o, s, pos),
                                   (size_t)p.o.per_token * 4) == 0;
                same &= memcmp(p.ht.data + s * p.ht.per, base.ht.data + s * base.ht.per, (size_t)p.ht.per * 4) == 0;
            }
            CHECK(same);
            case_free(&p);
            /* the same run with a caller workspace of exactly the queried size */
            gcase w = case_make(Ls[2], d, 3, 1);
            maskpack_gdn_inputs in = case_inputs(&w);
            maskpack_gdn_options o = opts_of(isas[ii], chunked, 2);
            size_t bytes = 0;
            maskpack_error e;
            CHECK_OK(maskpack_gdn_workspace_size(Ls[2], &in, &o, 0, &bytes, &e), e);
            void *ws = malloc(bytes);
            CHECK_STATUS(maskpack_gdn_forward(Ls[2], &in, &o, &w.o.t, &w.ht.t, ws, bytes - 1, &e),
                         MASKPACK_ERR_BUFFER_TOO_SMALL, e);
            CHECK_OK(maskpack_gdn_forward(Ls[2], &in, &o, &w.o.t, &w.ht.t, ws, bytes, &e), e);
            CHECK(case_same_bits(&w, &base));
            free(ws);
            case_free(&w);
            case_free(&base);
        }
    for (int i = 0; i < 4; i++) maskpack_layout_free(Ls[i]);
}

/* strided (non-contiguous) inputs and a transposed state give the same bits */
static void test_strides(void) {
    dims d = {2, 2, 16, 16};
    const int64_t lens[2] = {70, 5};
    maskpack_layout *L = lay_lengths(lens, 2, MASKPACK_PLACE_PACKED, 0);
    if (!L) return;
    gcase a = case_make(L, d, 5, 1);
    CHECK_OK(case_forward(&a, MASKPACK_ISA_AUTO, 1, 1), (maskpack_error){0});
    /* q and k interleaved in one buffer [T, 2, H, K] -> views with token stride 2*H*K */
    int64_t T = 75, hk = d.H * d.K;
    float *qk = malloc((size_t)(T * 2 * hk) * 4);
    for (int64_t t = 0; t < T; t++) {
        memcpy(qk + t * 2 * hk, a.q.data + t * hk, (size_t)hk * 4);
        memcpy(qk + t * 2 * hk + hk, a.k.data + t * hk, (size_t)hk * 4);
    }
    maskpack_tensor qv = a.q.t, kv = a.k.t;
    qv.data = qk;
    qv.strides[0] = 2 * hk;
    kv.data = qk + hk;
    kv.strides[0] = 2 * hk;
    /* h0 stored as [N, HV, V, K] and viewed transposed */
    int64_t per = d.HV * d.K * d.V;
    float *h0t = malloc((size_t)(2 * per) * 4);
    for (int64_t n = 0; n < 2; n++)
        for (int64_t h = 0; h < d.HV; h++)
            for (int64_t x = 0; x < d.K; x++)
                for (int64_t y = 0; y < d.V; y++)
                    h0t[n * per + h * d.K * d.V + y * d.K + x] = a.h0.data[n * per + h * d.K * d.V + x * d.V + y];
    maskpack_tensor h0v = a.h0.t;
    h0v.data = h0t;
    h0v.strides[2] = 1;
    h0v.strides[3] = d.K;
    gcase b = case_make(L, d, 5, 1);
    maskpack_gdn_inputs in = case_inputs(&b);
    in.q = &qv;
    in.k = &kv;
    in.initial_state = &h0v;
    maskpack_gdn_options o = opts_of(MASKPACK_ISA_AUTO, 1, 1);
    maskpack_error e;
    CHECK_OK(maskpack_gdn_forward(L, &in, &o, &b.o.t, &b.ht.t, NULL, 0, &e), e);
    CHECK(case_same_bits(&a, &b));
    /* [1, T, H, K] is accepted for a packed layout */
    maskpack_tensor q1 = a.q.t;
    q1.ndim = 4;
    q1.shape[0] = 1;
    q1.shape[1] = T;
    q1.shape[2] = d.H;
    q1.shape[3] = d.K;
    q1.strides[0] = T * hk;
    q1.strides[1] = hk;
    q1.strides[2] = d.K;
    q1.strides[3] = 1;
    in = case_inputs(&b);
    in.q = &q1;
    CHECK_OK(maskpack_gdn_forward(L, &in, &o, &b.o.t, &b.ht.t, NULL, 0, &e), e);
    CHECK(case_same_bits(&a, &b));
    free(qk);
    free(h0t);
    case_free(&a);
    case_free(&b);
    maskpack_layout_free(L);
}

/* bf16 inputs on the f32 kernel (AUTO's for them on CPUs without AMX; asked for by name here, as AMX
 * CPUs run bf16 on the tiles: test_gdn_bf16) are their f32 values (exact); bf16 output is the rounding
 * of the f32 output */
static void test_bf16(void) {
    dims d = {1, 2, 16, 16};
    const int64_t lens[2] = {66, 9};
    maskpack_layout *L = lay_lengths(lens, 2, MASKPACK_PLACE_RIGHT, 0);
    if (!L) return;
    gcase a = case_make(L, d, 9, 1);
    ttensor *ts[5] = {&a.q, &a.k, &a.v, &a.g, &a.beta};
    uint16_t *bf[5];
    maskpack_tensor bt[5];
    for (int i = 0; i < 5; i++) {
        int64_t n = mp_numel(&ts[i]->t);
        bf[i] = malloc((size_t)n * 2);
        for (int64_t j = 0; j < n; j++) {
            bf[i][j] = mp_f32_to_bf16(ts[i]->data[j]);
            if (!isnan(ts[i]->data[j]) && !isinf(ts[i]->data[j])) ts[i]->data[j] = mp_bf16_to_f32(bf[i][j]);
        }
        bt[i] = ts[i]->t;
        bt[i].data = bf[i];
        bt[i].dtype = MASKPACK_BF16;
    }
    CHECK_OK(case_forward(&a, MASKPACK_ISA_AUTO, 1, 1), (maskpack_error){0});
    int64_t n_o = mp_numel(&a.o.t);
    uint16_t *ob = malloc((size_t)n_o * 2);
    maskpack_tensor ot = a.o.t;
    ot.data = ob;
    ot.dtype = MASKPACK_BF16;
    maskpack_gdn_inputs in = {&bt[0], &bt[1], &bt[2], &bt[3], &bt[4], &a.h0.t};
    maskpack_error e;
    maskpack_isa f32_isa = MASKPACK_ISA_REF; /* the kernel case_forward's f32 run took */
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &f32_isa, &e), e);
    maskpack_gdn_options o = opts_of(f32_isa, 1, 1);
    float *ht2 = malloc((size_t)(2 * a.ht.per) * 4);
    maskpack_tensor htt = a.ht.t;
    htt.data = ht2;
    CHECK_OK(maskpack_gdn_forward(L, &in, &o, &ot, &htt, NULL, 0, &e), e);
    int same = 1;
    for (int64_t j = 0; j < n_o; j++) same &= ob[j] == mp_f32_to_bf16(a.o.data[j]);
    CHECK(same);
    CHECK(memcmp(ht2, a.ht.data, (size_t)(2 * a.ht.per) * 4) == 0);
    for (int i = 0; i < 5; i++) free(bf[i]);
    free(ob);
    free(ht2);
    case_free(&a);
    maskpack_layout_free(L);
}

/* continuation: a sequence run in two pieces (state passed) equals the whole run; bitwise when the
 * cut is chunk-aligned (chunked) or anywhere (recurrent), to rounding otherwise */
static void test_continuation(void) {
    dims d = {2, 4, 16, 16};
    const int64_t whole[1] = {200};
    maskpack_layout *Lw = lay_lengths(whole, 1, MASKPACK_PLACE_PACKED, 0);
    if (!Lw) return;
    gcase w = case_make(Lw, d, 21, 1);
    const int64_t cuts[3] = {128, 100, 64};
    for (int chunked = 0; chunked <= 1; chunked++) {
        CHECK_OK(case_forward(&w, MASKPACK_ISA_AUTO, chunked, 1), (maskpack_error){0});
        for (int ci = 0; ci < 3; ci++) {
            const int64_t cut = cuts[ci], l1[1] = {cut}, l2[1] = {200 - cut};
            maskpack_layout *L1 = lay_lengths(l1, 1, MASKPACK_PLACE_PACKED, 0),
                            *L2 = lay_lengths(l2, 1, MASKPACK_PLACE_PACKED, 0);
            gcase a = case_make(L1, d, 21, 1), b = case_make(L2, d, 21, 1);
            /* piece 2 holds tokens cut.. of the same sequence */
            ttensor *src[5] = {&w.q, &w.k, &w.v, &w.g, &w.beta}, *dst[5] = {&b.q, &b.k, &b.v, &b.g, &b.beta};
            for (int i = 0; i < 5; i++)
                memcpy(dst[i]->data, src[i]->data + cut * src[i]->per_token,
                       (size_t)((200 - cut) * src[i]->per_token) * 4);
            CHECK_OK(case_forward(&a, MASKPACK_ISA_AUTO, chunked, 1), (maskpack_error){0});
            memcpy(b.h0.data, a.ht.data, (size_t)a.ht.per * 4);
            CHECK_OK(case_forward(&b, MASKPACK_ISA_AUTO, chunked, 1), (maskpack_error){0});
            int bits =
                memcmp(a.o.data, w.o.data, (size_t)(cut * a.o.per_token) * 4) == 0 &&
                memcmp(b.o.data, w.o.data + cut * w.o.per_token, (size_t)((200 - cut) * b.o.per_token) * 4) == 0 &&
                memcmp(b.ht.data, w.ht.data, (size_t)w.ht.per * 4) == 0;
            if (!chunked || cut % GDN_C == 0) {
                CHECK(bits);
            } else {
                double num = 0, den = 0;
                for (int64_t j = 0; j < (200 - cut) * b.o.per_token; j++) {
                    num = fmax(num, fabs(b.o.data[j] - w.o.data[cut * w.o.per_token + j]));
                    den = fmax(den, fabs(w.o.data[cut * w.o.per_token + j]));
                }
                CHECK(num / den < 1e-5);
            }
            case_free(&a);
            case_free(&b);
            maskpack_layout_free(L1);
            maskpack_layout_free(L2);
        }
    }
    case_free(&w);
    maskpack_layout_free(Lw);
}

/* ---- backward ------------------------------------------------------------------------------- */

/* f = sum(o * R) + sum(ht * Rs) in double through the double recurrence, for one segment */
typedef struct seg_data {
    dims d;
    int64_t len;
    double *q, *k, *v, *g, *b, *h0, *R, *Rs;
} seg_data;

static double seg_f(const seg_data *s) {
    const dims *d = &s->d;
    int64_t no = (s->len > 0 ? s->len : 1) * d->HV * d->V, ns = d->HV * d->K * d->V;
    double *o = malloc((size_t)no * 8), *ht = malloc((size_t)ns * 8);
    naive_rule(d, s->len, s->q, s->k, s->v, s->g, s->b, s->h0, 1.0 / sqrt((double)d->K), 1, o, ht);
    double f = 0;
    for (int64_t i = 0; i < s->len * d->HV * d->V; i++) f += o[i] * s->R[i];
    for (int64_t i = 0; i < ns; i++) f += ht[i] * s->Rs[i];
    free(o);
    free(ht);
    return f;
}

static void test_backward(void) {
    /* G = 2 value heads per key head, lengths around the chunk size, one zero-length segment,
     * a long one (9 chunks + a partial one; test_backward_revolve runs longer segments and forces
     * the recomputing checkpoint schedules on it) */
    dims d = {2, 4, 16, 16};
    const int64_t lens[5] = {65, 0, 600, 1, 64};
    maskpack_layout *L = lay_lengths(lens, 5, MASKPACK_PLACE_RIGHT, 0);
    if (!L) return;
    gcase c = case_make(L, d, 31, 1);
    /* the long segment decays slowly (g in [-0.019, -0.0006]: a chunk keeps about half the state),
     * so the state entering its last chunks carries every earlier chunk and a wrong replayed state
     * would show in the gradients */
    for (int64_t p = 0; p < lens[2]; p++)
        for (int64_t j = 0; j < d.HV; j++) tok_at(L, &c.g, 2, p)[j] *= 0.03f;
    int64_t qd[2] = {d.H, d.K}, vd[2] = {d.HV, d.V}, hd[1] = {d.HV}, sd[3] = {d.HV, d.K, d.V};
    ttensor dO = tok_alloc(L, 2, vd);
    tok_fill(L, &dO, T_DO, 31);
    stensor dht = st_alloc(5, 3, sd, T_DHT, 31);
    maskpack_gdn_inputs in = case_inputs(&c);
    maskpack_isa isas[N_ISA_MAX];
    const int n_isa = isa_list(isas);
    ttensor gq[N_ISA_MAX], gk[N_ISA_MAX], gv[N_ISA_MAX], gg[N_ISA_MAX], gb[N_ISA_MAX];
    stensor gh[N_ISA_MAX];
    for (int ii = 0; ii < n_isa; ii++) {
        gq[ii] = tok_alloc(L, 2, qd);
        gk[ii] = tok_alloc(L, 2, qd);
        gv[ii] = tok_alloc(L, 2, vd);
        gg[ii] = tok_alloc(L, 1, hd);
        gb[ii] = tok_alloc(L, 1, hd);
        gh[ii] = st_alloc(5, 3, sd, 0, 0);
        maskpack_gdn_grads gr = {&gq[ii].t, &gk[ii].t, &gv[ii].t, &gg[ii].t, &gb[ii].t, &gh[ii].t};
        maskpack_gdn_options o = opts_of(isas[ii], 1, 2);
        maskpack_error e;
        CHECK_OK(maskpack_gdn_backward(L, &in, &dO.t, &dht.t, &o, &gr, NULL, 0, &e), e);
        CHECK(pads_zero(L, &gq[ii]) && pads_zero(L, &gk[ii]) && pads_zero(L, &gv[ii]) && pads_zero(L, &gg[ii]) &&
              pads_zero(L, &gb[ii]));
        /* zero-length segment 1: d initial state = d final state */
        CHECK(memcmp(gh[ii].data + gh[ii].per, dht.data + dht.per, (size_t)dht.per * 4) == 0);
    }
    /* finite differences of the double recurrence along random directions, per input and segment */
    double worst = 0;
    for (size_t s = 0; s < 5; s++) {
        if (lens[s] == 0) continue;
        seg_data sd_;
        sd_.d = d;
        sd_.len = lens[s];
        int64_t n = lens[s], nq = n * d.H * d.K, nv = n * d.HV * d.V, nh = n * d.HV, ns = d.HV * d.K * d.V;
        sd_.q = malloc((size_t)nq * 8);
        sd_.k = malloc((size_t)nq * 8);
        sd_.v = malloc((size_t)nv * 8);
        sd_.g = malloc((size_t)nh * 8);
        sd_.b = malloc((size_t)nh * 8);
        sd_.h0 = malloc((size_t)ns * 8);
        sd_.R = malloc((size_t)nv * 8);
        sd_.Rs = malloc((size_t)ns * 8);
        for (int64_t p = 0; p < n; p++) {
            for (int64_t j = 0; j < d.H * d.K; j++) {
                sd_.q[p * d.H * d.K + j] = tok_at(L, &c.q, s, p)[j];
                sd_.k[p * d.H * d.K + j] = tok_at(L, &c.k, s, p)[j];
            }
            for (int64_t j = 0; j < d.HV * d.V; j++) {
                sd_.v[p * d.HV * d.V + j] = tok_at(L, &c.v, s, p)[j];
                sd_.R[p * d.HV * d.V + j] = tok_at(L, &dO, s, p)[j];
            }
            for (int64_t j = 0; j < d.HV; j++) {
                sd_.g[p * d.HV + j] = tok_at(L, &c.g, s, p)[j];
                sd_.b[p * d.HV + j] = tok_at(L, &c.beta, s, p)[j];
            }
        }
        for (int64_t j = 0; j < ns; j++) {
            sd_.h0[j] = c.h0.data[(int64_t)s * ns + j];
            sd_.Rs[j] = dht.data[(int64_t)s * ns + j];
        }
        double *arrs[6] = {sd_.q, sd_.k, sd_.v, sd_.g, sd_.b, sd_.h0};
        int64_t cnt[6] = {nq, nq, nv, nh, nh, ns};
        for (int which = 0; which < 6; which++) {
            for (int ii = 0; ii < n_isa; ii++) {
                /* directional derivative from our gradient */
                double dd = 0, nrm = 0;
                for (int64_t j = 0; j < cnt[which]; j++) {
                    double dir = uval(40 + which, (int64_t)s, j, 0, 1);
                    double gval;
                    int64_t p = which == 5 ? 0 : j / (cnt[which] / n), jj = which == 5 ? j : j % (cnt[which] / n);
                    switch (which) {
                    case 0: gval = tok_at(L, &gq[ii], s, p)[jj]; break;
                    case 1: gval = tok_at(L, &gk[ii], s, p)[jj]; break;
                    case 2: gval = tok_at(L, &gv[ii], s, p)[jj]; break;
                    case 3: gval = tok_at(L, &gg[ii], s, p)[jj]; break;
                    case 4: gval = tok_at(L, &gb[ii], s, p)[jj]; break;
                    default: gval = gh[ii].data[(int64_t)s * ns + j]; break;
                    }
                    dd += gval * dir;
                    nrm += fabs(gval * dir);
                }
                if (ii == 0) {
                    /* central difference in double (only once per input: it does not depend on the ISA) */
                    const double eps = 1e-5;
                    double *x = arrs[which];
                    for (int64_t j = 0; j < cnt[which]; j++) x[j] += eps * uval(40 + which, (int64_t)s, j, 0, 1);
                    double fp = seg_f(&sd_);
                    for (int64_t j = 0; j < cnt[which]; j++) x[j] -= 2 * eps * uval(40 + which, (int64_t)s, j, 0, 1);
                    double fm = seg_f(&sd_);
                    for (int64_t j = 0; j < cnt[which]; j++) x[j] += eps * uval(40 + which, (int64_t)s, j, 0, 1);
                    double fd = (fp - fm) / (2 * eps);
                    double rel = fabs(fd - dd) / fmax(nrm, 1e-12);
                    worst = fmax(worst, rel);
                    if (rel > 1e-4)
                        fprintf(stderr, "test_gdn: gradient %d of segment %zu: ours %.8g, finite difference %.8g\n",
                                which, s, dd, fd);
                    CHECK(rel < 1e-4);
                }
            }
        }
        free(sd_.q);
        free(sd_.k);
        free(sd_.v);
        free(sd_.g);
        free(sd_.b);
        free(sd_.h0);
        free(sd_.R);
        free(sd_.Rs);
    }
    printf("test_gdn: backward vs finite differences of the double recurrence: worst %.2e\n", worst);
    for (int vi = 1; vi < n_isa; vi++) {
        /* each vector build agrees with the reference */
        ttensor *a0[5] = {&gq[0], &gk[0], &gv[0], &gg[0], &gb[0]},
                *a1[5] = {&gq[vi], &gk[vi], &gv[vi], &gg[vi], &gb[vi]};
        for (int i = 0; i < 5; i++) {
            double num = 0, den = 0;
            int64_t nn = mp_numel(&a0[i]->t);
            for (int64_t j = 0; j < nn; j++) {
                if (isnan(a0[i]->data[j])) continue;
                num = fmax(num, fabs(a0[i]->data[j] - a1[i]->data[j]));
                den = fmax(den, fabs(a0[i]->data[j]));
            }
            if (!(num / den < 1e-4))
                fprintf(stderr, "test_gdn: backward isa %d grad %d vs ref: %.2e\n", (int)isas[vi], i, num / den);
            CHECK(num / den < 1e-4);
        }
        /* and threads / padded vs packed are bitwise for a fixed ISA */
        maskpack_layout *Lp = lay_lengths(lens, 5, MASKPACK_PLACE_PACKED, 0);
        gcase cp = case_make(Lp, d, 31, 1);
        for (int64_t p = 0; p < lens[2]; p++)
            for (int64_t j = 0; j < d.HV; j++) tok_at(Lp, &cp.g, 2, p)[j] *= 0.03f;
        ttensor dOp = tok_alloc(Lp, 2, vd), gqp = tok_alloc(Lp, 2, qd), gkp = tok_alloc(Lp, 2, qd),
                gvp = tok_alloc(Lp, 2, vd), ggp = tok_alloc(Lp, 1, hd), gbp = tok_alloc(Lp, 1, hd);
        stensor ghp = st_alloc(5, 3, sd, 0, 0);
        tok_fill(Lp, &dOp, T_DO, 31);
        maskpack_gdn_inputs inp = case_inputs(&cp);
        maskpack_gdn_grads gr = {&gqp.t, &gkp.t, &gvp.t, &ggp.t, &gbp.t, &ghp.t};
        maskpack_gdn_options o = opts_of(isas[vi], 1, 1);
        maskpack_error e;
        CHECK_OK(maskpack_gdn_backward(Lp, &inp, &dOp.t, &dht.t, &o, &gr, NULL, 0, &e), e);
        int same = memcmp(ghp.data, gh[vi].data, (size_t)(5 * ghp.per) * 4) == 0;
        for (size_t s = 0; s < 5; s++)
            for (int64_t p = 0; p < lens[s]; p++) {
                same &= memcmp(tok_at(Lp, &gqp, s, p), tok_at(L, &gq[vi], s, p), (size_t)gqp.per_token * 4) == 0;
                same &= memcmp(tok_at(Lp, &gkp, s, p), tok_at(L, &gk[vi], s, p), (size_t)gkp.per_token * 4) == 0;
                same &= memcmp(tok_at(Lp, &gvp, s, p), tok_at(L, &gv[vi], s, p), (size_t)gvp.per_token * 4) == 0;
                same &= memcmp(tok_at(Lp, &ggp, s, p), tok_at(L, &gg[vi], s, p), (size_t)ggp.per_token * 4) == 0;
                same &= memcmp(tok_at(Lp, &gbp, s, p), tok_at(L, &gb[vi], s, p), (size_t)gbp.per_token * 4) == 0;
            }
        CHECK(same);
        /* workspace sized by the query */
        size_t bytes = 0;
        CHECK_OK(maskpack_gdn_workspace_size(Lp, &inp, &o, 1, &bytes, &e), e);
        void *ws = malloc(bytes);
        CHECK_OK(maskpack_gdn_backward(Lp, &inp, &dOp.t, &dht.t, &o, &gr, ws, bytes, &e), e);
        CHECK(memcmp(ghp.data, gh[vi].data, (size_t)(5 * ghp.per) * 4) == 0);
        free(ws);
        free(dOp.data);
        free(gqp.data);
        free(gkp.data);
        free(gvp.data);
        free(ggp.data);
        free(gbp.data);
        free(ghp.data);
        case_free(&cp);
        maskpack_layout_free(Lp);
    }
    for (int ii = 0; ii < n_isa; ii++) {
        free(gq[ii].data);
        free(gk[ii].data);
        free(gv[ii].data);
        free(gg[ii].data);
        free(gb[ii].data);
        free(gh[ii].data);
    }
    free(dO.data);
    free(dht.data);
    case_free(&c);
    maskpack_layout_free(L);
}

/* ---- backward checkpointing: a constant number of states, results independent of it ---------- */

typedef struct grads_set {
    ttensor q, k, v, g, b;
    stensor h;
} grads_set;

static grads_set grads_alloc(const maskpack_layout *L, dims d) {
    int64_t qd[2] = {d.H, d.K}, vd[2] = {d.HV, d.V}, hd[1] = {d.HV}, sd[3] = {d.HV, d.K, d.V};
    grads_set r;
    r.q = tok_alloc(L, 2, qd);
    r.k = tok_alloc(L, 2, qd);
    r.v = tok_alloc(L, 2, vd);
    r.g = tok_alloc(L, 1, hd);
    r.b = tok_alloc(L, 1, hd);
    r.h = st_alloc((int64_t)maskpack_layout_n_segments(L), 3, sd, 0, 0);
    return r;
}

static void grads_free(grads_set *g) {
    free(g->q.data);
    free(g->k.data);
    free(g->v.data);
    free(g->g.data);
    free(g->b.data);
    free(g->h.data);
}

/* n floats equal: bit for bit, or as values (then a zero's sign does not count) */
static int floats_match(const float *x, const float *y, int64_t n, int by_value) {
    if (!by_value) return memcmp(x, y, (size_t)n * sizeof(float)) == 0;
    int same = 1;
    for (int64_t j = 0; j < n; j++) same &= x[j] == y[j];
    return same;
}

/* Every gradient of a and b matches (see floats_match); d(initial state) only when with_h. */
static int grads_match(const grads_set *a, const grads_set *b, int by_value, int with_h) {
    const ttensor *x[5] = {&a->q, &a->k, &a->v, &a->g, &a->b}, *y[5] = {&b->q, &b->k, &b->v, &b->g, &b->b};
    int same = !with_h || floats_match(a->h.data, b->h.data, mp_numel(&a->h.t), by_value);
    for (int i = 0; i < 5; i++) same &= floats_match(x[i]->data, y[i]->data, mp_numel(&x[i]->t), by_value);
    return same;
}

/* Backward of case c with `slots` state buffers per value head (0 = the default). */
static void run_bwd_slots(gcase *c, const ttensor *dO, const stensor *dht, maskpack_isa isa, int threads, int slots,
                          grads_set *g, int own_ws) {
    maskpack_gdn_inputs in = case_inputs(c);
    maskpack_gdn_grads gr = {&g->q.t, &g->k.t, &g->v.t, &g->g.t, &g->b.t, &g->h.t};
    maskpack_gdn_options o = opts_of(isa, 1, threads);
    maskpack_error e;
    void *ws = NULL;
    size_t bytes = 0;
    if (own_ws) {
        CHECK_OK(gdn_workspace_size_slots(c->L, &in, &o, 1, slots, &bytes, &e), e);
        ws = malloc(bytes);
    }
    CHECK_OK(gdn_backward_slots(c->L, &in, &dO->t, &dht->t, &o, &gr, ws, bytes, slots, &e), e);
    free(ws);
}

static void test_backward_revolve(void) {
    /* lengths around chunk boundaries, 8 chunks, and 17 chunks + 3 tokens (18 chunks: more than the
     * default 16 buffers keep, so the default recomputes; with 4 buffers each chunk is advanced up to
     * 3 times, with 3 up to 5 times, with 2 the quadratic schedule). 64 buffers keep every state:
     * the all-states result every other schedule must reproduce bit for bit (a state is always
     * computed by the same arithmetic, whichever checkpoint it is replayed from). */
    dims d = {1, 2, 16, 20};
    const int64_t lens[10] = {1, 63, 64, 65, 127, 128, 129, 8 * 64, 17 * 64 + 3, 0};
    maskpack_layout *L = lay_lengths(lens, 10, MASKPACK_PLACE_PACKED, 0);
    if (!L) return;
    gcase c = case_make(L, d, 57, 1);
    /* slow decay: each chunk keeps most of the state, so a wrong replayed state would show */
    for (size_t s = 0; s < 10; s++)
        for (int64_t p = 0; p < lens[s]; p++)
            for (int64_t j = 0; j < d.HV; j++) tok_at(L, &c.g, s, p)[j] *= 0.03f;
    int64_t vd[2] = {d.HV, d.V}, sd[3] = {d.HV, d.K, d.V};
    ttensor dO = tok_alloc(L, 2, vd);
    tok_fill(L, &dO, T_DO, 57);
    stensor dht = st_alloc(10, 3, sd, T_DHT, 57);
    maskpack_isa isas[N_ISA_MAX];
    const int n_isa = isa_list(isas);
    const int slots[6] = {0, 2, 3, 4, 5, 17};
    for (int ii = 0; ii < n_isa; ii++) {
        grads_set all = grads_alloc(L, d);
        run_bwd_slots(&c, &dO, &dht, isas[ii], 1, GDN_BWD_MAX_SLOTS, &all, 0);
        for (int si = 0; si < 6; si++) {
            grads_set g = grads_alloc(L, d);
            run_bwd_slots(&c, &dO, &dht, isas[ii], 2, slots[si], &g, si & 1);
            const int same = grads_match(&g, &all, 0, 1);
            if (!same) fprintf(stderr, "test_gdn: backward with %d state buffers differs (isa %d)\n", slots[si], ii);
            CHECK(same);
            grads_free(&g);
        }
        grads_free(&all);
    }
    /* bad slot counts are refused */
    {
        grads_set g = grads_alloc(L, d);
        maskpack_gdn_inputs in = case_inputs(&c);
        maskpack_gdn_grads gr = {&g.q.t, &g.k.t, &g.v.t, &g.g.t, &g.b.t, &g.h.t};
        maskpack_gdn_options o = opts_of(MASKPACK_ISA_REF, 1, 1);
        maskpack_error e;
        CHECK_STATUS(gdn_backward_slots(L, &in, &dO.t, &dht.t, &o, &gr, NULL, 0, 1, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                     e);
        CHECK_STATUS(gdn_backward_slots(L, &in, &dO.t, &dht.t, &o, &gr, NULL, 0, GDN_BWD_MAX_SLOTS + 1, &e),
                     MASKPACK_ERR_INVALID_ARGUMENT, e);
        grads_free(&g);
    }
    free(dO.data);
    free(dht.data);
    case_free(&c);
    maskpack_layout_free(L);

    /* a long segment (32768 + 5 tokens, 513 chunks): the default 16 buffers advance each chunk up
     * to 3 times, 64 buffers up to twice; both give the same bits */
    {
        dims dl = {1, 1, 16, 16};
        const int64_t ll[1] = {32768 + 5};
        maskpack_layout *Ll = lay_lengths(ll, 1, MASKPACK_PLACE_PACKED, 0);
        if (!Ll) return;
        gcase cl = case_make(Ll, dl, 58, 1);
        int64_t vl[2] = {dl.HV, dl.V}, sl[3] = {dl.HV, dl.K, dl.V};
        ttensor dOl = tok_alloc(Ll, 2, vl);
        tok_fill(Ll, &dOl, T_DO, 58);
        stensor dhtl = st_alloc(1, 3, sl, T_DHT, 58);
        const maskpack_isa isa = best_isa();
        grads_set a = grads_alloc(Ll, dl), b2 = grads_alloc(Ll, dl);
        run_bwd_slots(&cl, &dOl, &dhtl, isa, 1, 0, &a, 1);
        run_bwd_slots(&cl, &dOl, &dhtl, isa, 1, GDN_BWD_MAX_SLOTS, &b2, 0);
        CHECK(grads_match(&a, &b2, 0, 1));
        /* and the gradients are finite numbers */
        int finite = 1;
        for (int64_t i = 0; i < mp_numel(&a.q.t); i++) finite &= isfinite(a.q.data[i]) != 0;
        for (int64_t i = 0; i < mp_numel(&a.h.t); i++) finite &= isfinite(a.h.data[i]) != 0;
        CHECK(finite);
        grads_free(&a);
        grads_free(&b2);
        free(dOl.data);
        free(dhtl.data);
        case_free(&cl);
        maskpack_layout_free(Ll);
    }
}

/* Without an initial state the first chunk's state is zero and the backward skips its products
 * with S (and, when d(initial state) is not asked for, that gradient). Gradients of every input,
 * d(initial state) included, must equal those of an explicit all-zero initial state (the skipped
 * products are exact zeros; compared as values, so a zero's sign does not count), per ISA, with
 * d(initial state) asked for and not. */
static void test_backward_zero_initial_state(void) {
    dims d = {1, 2, 16, 20};
    const int64_t lens[5] = {1, 64, 65, 200, 0};
    maskpack_layout *L = lay_lengths(lens, 5, MASKPACK_PLACE_PACKED, 0);
    if (!L) return;
    gcase c = case_make(L, d, 61, 1);
    memset(c.h0.data, 0, (size_t)(5 * c.h0.per) * sizeof(float));
    int64_t vd[2] = {d.HV, d.V}, sd[3] = {d.HV, d.K, d.V};
    ttensor dO = tok_alloc(L, 2, vd);
    tok_fill(L, &dO, T_DO, 61);
    stensor dht = st_alloc(5, 3, sd, T_DHT, 61);
    maskpack_isa isas[N_ISA_MAX];
    const int n_isa = isa_list(isas);
    for (int ii = 0; ii < n_isa; ii++)
        for (int want_dh = 0; want_dh < 2; want_dh++) {
            grads_set zero = grads_alloc(L, d), none = grads_alloc(L, d);
            grads_set *gs[2] = {&zero, &none};
            for (int w = 0; w < 2; w++) {
                c.with_h0 = w == 0; /* an all-zero initial state, then none */
                maskpack_gdn_inputs in = case_inputs(&c);
                maskpack_gdn_grads gr = {&gs[w]->q.t, &gs[w]->k.t, &gs[w]->v.t,
                                         &gs[w]->g.t, &gs[w]->b.t, want_dh ? &gs[w]->h.t : NULL};
                maskpack_gdn_options o = opts_of(isas[ii], 1, 2);
                maskpack_error e;
                CHECK_OK(maskpack_gdn_backward(L, &in, &dO.t, &dht.t, &o, &gr, NULL, 0, &e), e);
            }
            c.with_h0 = 1;
            const int same = grads_match(&zero, &none, 1, want_dh);
            if (!same)
                fprintf(stderr, "test_gdn: backward without initial state differs from a zero one (isa %d, dh0 %d)\n",
                        ii, want_dh);
            CHECK(same);
            grads_free(&zero);
            grads_free(&none);
        }
    free(dO.data);
    free(dht.data);
    case_free(&c);
    maskpack_layout_free(L);
}

/* The backward's workspace does not grow with the segment length: one segment of 512, 32768 or
 * 131072 tokens (Qwen3-Next sizes: H = 16, HV = 32, K = V = 128) needs the same bytes. Only the
 * sizes are queried (no data is read), so the tensors view a small dummy buffer. */
static void test_workspace_constant(void) {
    static float dummy[64];
    const int64_t H = 16, HV = 32, K = 128, V = 128;
    const int64_t lens[3] = {512, 32768, 131072};
    size_t bytes[3][2] = {{0}}, fwd[3] = {0};
    for (int li = 0; li < 3; li++) {
        maskpack_layout *L = lay_lengths(&lens[li], 1, MASKPACK_PLACE_PACKED, 0);
        if (!L) return;
        const int64_t T = lens[li];
        int64_t qs[3] = {T, H, K}, vs[3] = {T, HV, V}, gs[2] = {T, HV};
        maskpack_tensor q = maskpack_tensor_contiguous(dummy, MASKPACK_F32, 3, qs);
        maskpack_tensor k = maskpack_tensor_contiguous(dummy, MASKPACK_F32, 3, qs);
        maskpack_tensor v = maskpack_tensor_contiguous(dummy, MASKPACK_F32, 3, vs);
        maskpack_tensor g = maskpack_tensor_contiguous(dummy, MASKPACK_F32, 2, gs);
        maskpack_tensor b = maskpack_tensor_contiguous(dummy, MASKPACK_F32, 2, gs);
        maskpack_gdn_inputs in = {&q, &k, &v, &g, &b, NULL};
        maskpack_error e;
        for (int t = 0; t < 2; t++) {
            maskpack_gdn_options o = opts_of(MASKPACK_ISA_REF, 1, t + 1);
            CHECK_OK(maskpack_gdn_workspace_size(L, &in, &o, 1, &bytes[li][t], &e), e);
        }
        maskpack_gdn_options o = opts_of(MASKPACK_ISA_REF, 1, 1);
        CHECK_OK(maskpack_gdn_workspace_size(L, &in, &o, 0, &fwd[li], &e), e);
        maskpack_layout_free(L);
    }
    printf("test_gdn: backward workspace per thread (H 16, HV 32, K = V = 128): %zu bytes at 512, 32768 and "
           "131072 tokens\n",
           bytes[0][0]);
    for (int li = 1; li < 3; li++) {
        CHECK_EQ(bytes[li][0], bytes[0][0]);
        CHECK_EQ(bytes[li][1], bytes[0][1]);
        CHECK_EQ(fwd[li], fwd[0]);
    }
    /* per thread: the G = 2 heads' GDN_BWD_SLOTS checkpoint states and two gradient states, plus
     * chunk scratch well under 2 MiB */
    const size_t state = (size_t)(K * V) * 4;
    CHECK(bytes[0][0] >= 2 * (GDN_BWD_SLOTS + 2) * state);
    CHECK(bytes[0][0] <= 2 * (GDN_BWD_SLOTS + 2) * state + ((size_t)2 << 20));
    CHECK(bytes[0][1] - 64 == 2 * (bytes[0][0] - 64));
}

/* The operator object and the team entry points give the plain calls' bits: every ISA this CPU
 * runs, both forward forms and the backward, on a team of 3 (the op dealt for 3 threads), on the
 * caller alone, in the op's own workspace (twice: the kept one) and in a caller's of the queried
 * size; a run whose tensors do not match the op, or a team larger than the op's thread count, is
 * refused before anything is written. */
static void test_op_and_team(void) {
    dims d = {2, 4, 32, 24};
    maskpack_layout *L = lay_lengths(LENS, N_LENS, MASKPACK_PLACE_RIGHT, 0);
    if (!L) return;
    maskpack_workers *team = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_workers_create(3, &team, &e), e);
    const size_t N = maskpack_layout_n_segments(L);
    int64_t vd[2] = {d.HV, d.V}, sd[3] = {d.HV, d.K, d.V};
    ttensor dO = tok_alloc(L, 2, vd);
    tok_fill(L, &dO, T_DO, 5);
    stensor dht = st_alloc((int64_t)N, 3, sd, T_DHT, 5);
    maskpack_isa isas[N_ISA_MAX];
    const int n_isa = isa_list(isas);
    for (int ii = 0; ii < n_isa; ii++)
        for (int chunked = 0; chunked < 2; chunked++) {
            gcase base = case_make(L, d, 21, 1);
            CHECK_OK(case_forward(&base, isas[ii], chunked, 1), e);
            maskpack_gdn_options o = opts_of(isas[ii], chunked, 3);
            maskpack_gdn_op *op = NULL;
            CHECK_OK(maskpack_gdn_op_create(L, d.H, d.HV, d.K, d.V, &o, &op, &e), e);
            size_t bytes = 0;
            CHECK_OK(maskpack_gdn_op_workspace_size(op, 0, &bytes, &e), e);
            void *ws = malloc(bytes);
            for (int run = 0; run < 4; run++) {
                gcase c = case_make(L, d, 21, 1);
                maskpack_gdn_inputs in = case_inputs(&c);
                maskpack_workers *t = run == 2 ? NULL : team;
                if (run < 3)
                    CHECK_OK(maskpack_gdn_op_forward(op, &in, &c.o.t, &c.ht.t, t, run == 2 ? ws : NULL,
                                                     run == 2 ? bytes : 0, &e),
                             e);
                else
                    CHECK_OK(maskpack_gdn_forward_on(L, &in, &o, &c.o.t, &c.ht.t, team, NULL, 0, &e), e);
                CHECK(case_same_bits(&c, &base));
                case_free(&c);
            }
            free(ws);
            /* the backward (the chunked form whatever opts.chunked says) */
            grads_set gb = grads_alloc(L, d), g1 = grads_alloc(L, d), g2 = grads_alloc(L, d);
            maskpack_gdn_inputs in = case_inputs(&base);
            maskpack_gdn_grads gr0 = {&gb.q.t, &gb.k.t, &gb.v.t, &gb.g.t, &gb.b.t, &gb.h.t};
            maskpack_gdn_grads gr1 = {&g1.q.t, &g1.k.t, &g1.v.t, &g1.g.t, &g1.b.t, &g1.h.t};
            maskpack_gdn_grads gr2 = {&g2.q.t, &g2.k.t, &g2.v.t, &g2.g.t, &g2.b.t, &g2.h.t};
            maskpack_gdn_options o1 = opts_of(isas[ii], chunked, 1);
            CHECK_OK(maskpack_gdn_backward(L, &in, &dO.t, &dht.t, &o1, &gr0, NULL, 0, &e), e);
            CHECK_OK(maskpack_gdn_op_backward(op, &in, &dO.t, &dht.t, &gr1, team, NULL, 0, &e), e);
            CHECK(grads_match(&g1, &gb, 0, 1));
            CHECK_OK(maskpack_gdn_backward_on(L, &in, &dO.t, &dht.t, &o, &gr2, team, NULL, 0, &e), e);
            CHECK(grads_match(&g2, &gb, 0, 1));
            grads_free(&gb);
            grads_free(&g1);
            grads_free(&g2);
            /* a team larger than the op's threads, tensors of other dims: refused, nothing written */
            maskpack_workers *big = NULL;
            CHECK_OK(maskpack_workers_create(4, &big, &e), e);
            gcase c = case_make(L, d, 21, 1);
            memset(c.o.data, 0x7f, (size_t)mp_numel(&c.o.t) * 4);
            in = case_inputs(&c);
            CHECK_STATUS(maskpack_gdn_op_forward(op, &in, &c.o.t, &c.ht.t, big, NULL, 0, &e),
                         MASKPACK_ERR_INVALID_ARGUMENT, e);
            CHECK(strcmp(e.argument, "team") == 0);
            maskpack_workers_free(big);
            dims d2 = {2, 4, 16, 24};
            gcase c2 = case_make(L, d2, 21, 0);
            maskpack_gdn_inputs in2 = case_inputs(&c2);
            in2.v = in.v, in2.g = in.g, in2.beta = in.beta;
            CHECK_STATUS(maskpack_gdn_op_forward(op, &in2, &c.o.t, NULL, team, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
            CHECK(strcmp(e.argument, "q") == 0);
            CHECK_MSG(e, "the op's H = 2, K = 32");
            int untouched_o = 1;
            for (int64_t i = 0; i < mp_numel(&c.o.t); i++) untouched_o &= ((uint32_t *)c.o.data)[i] == 0x7f7f7f7fu;
            CHECK(untouched_o);
            case_free(&c);
            case_free(&c2);
            maskpack_gdn_op_free(op);
            case_free(&base);
        }
    /* creation refuses what a call would */
    maskpack_gdn_options o = maskpack_gdn_options_default();
    maskpack_gdn_op *op = (maskpack_gdn_op *)&o;
    CHECK_STATUS(maskpack_gdn_op_create(L, 2, 3, 16, 16, &o, &op, &e), MASKPACK_ERR_SHAPE, e);
    CHECK(op == NULL);
    CHECK_STATUS(maskpack_gdn_op_create(L, 2, 4, 0, 16, &o, &op, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_STATUS(maskpack_gdn_op_create(NULL, 2, 4, 16, 16, &o, &op, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    o.n_threads = MASKPACK_MAX_THREADS + 1;
    CHECK_STATUS(maskpack_gdn_op_create(L, 2, 4, 16, 16, &o, &op, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "opts.n_threads: expected in [1, 256], found 257");
    maskpack_gdn_op_free(NULL);
    free(dO.data);
    free(dht.data);
    maskpack_workers_free(team);
    maskpack_layout_free(L);
}

/* The conv on a team (split for its 3 participants) and on the caller alone gives the per-call
 * threads' bits, forward and backward. */
static void test_conv_team(void) {
    maskpack_layout *L = lay_lengths(LENS, N_LENS, MASKPACK_PLACE_PACKED, 0);
    if (!L) return;
    maskpack_workers *team = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_workers_create(3, &team, &e), e);
    const int64_t C = 70, W = 4, N = (int64_t)maskpack_layout_n_segments(L);
    int64_t cd[1] = {C}, sd[2] = {C, W - 1};
    ttensor x = tok_alloc(L, 1, cd), dy = tok_alloc(L, 1, cd);
    tok_fill(L, &x, T_X, 3);
    tok_fill(L, &dy, T_DY, 3);
    float *w = malloc((size_t)(C * W) * 4);
    for (int64_t i = 0; i < C * W; i++) w[i] = (float)gen(T_W, 0, 0, i, 3);
    int64_t ws_[2] = {C, W};
    maskpack_tensor tw = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, ws_);
    stensor pre = st_alloc(N, 2, sd, T_PRE, 3);
    for (int k = 0; k < 3; k++) {
        ttensor y = tok_alloc(L, 1, cd), dx = tok_alloc(L, 1, cd);
        stensor st = st_alloc(N, 2, sd, 0, 0), dpre = st_alloc(N, 2, sd, 0, 0);
        float *dw = calloc((size_t)(C * W), 4);
        maskpack_tensor tdw = maskpack_tensor_contiguous(dw, MASKPACK_F32, 2, ws_);
        if (k == 0) {
            CHECK_OK(maskpack_causal_conv1d(L, &x.t, &tw, &pre.t, 1, NULL, &y.t, &st.t, &e), e);
            CHECK_OK(
                maskpack_causal_conv1d_backward(L, &x.t, &tw, &pre.t, 1, &dy.t, &st.t, NULL, &dx.t, &tdw, &dpre.t, &e),
                e);
        } else {
            maskpack_workers *t = k == 1 ? team : NULL;
            CHECK_OK(maskpack_causal_conv1d_on(L, &x.t, &tw, &pre.t, 1, NULL, t, &y.t, &st.t, NULL, 0, &e), e);
            CHECK_OK(maskpack_causal_conv1d_backward_on(L, &x.t, &tw, &pre.t, 1, &dy.t, &st.t, NULL, t, &dx.t, &tdw,
                                                        &dpre.t, NULL, 0, &e),
                     e);
        }
        static float *ref[5];
        float *got[5] = {y.data, dx.data, st.data, dpre.data, dw};
        const int64_t n[5] = {mp_numel(&y.t), mp_numel(&dx.t), mp_numel(&st.t), mp_numel(&dpre.t), C * W};
        for (int i = 0; i < 5; i++) {
            if (k == 0) {
                ref[i] = got[i];
                continue;
            }
            CHECK(memcmp(ref[i], got[i], (size_t)n[i] * 4) == 0);
            free(got[i]);
        }
        if (k == 2)
            for (int i = 0; i < 5; i++) free(ref[i]);
    }
    free(w);
    free(x.data);
    free(dy.data);
    free(pre.data);
    maskpack_workers_free(team);
    maskpack_layout_free(L);
}

/* Runs of equally long tasks are dealt out to the threads part by part (gdn_api.c make_tasks):
 * every task still runs exactly once, so any thread count gives the same bits (7 equal segments
 * and 3 key heads: 21 equal tasks in parts of 10/11, 7 and 5/5/5/6, plus a longer and a shorter segment). */
static void test_task_order(void) {
    dims d = {3, 3, 16, 16};
    const int64_t lens[9] = {64, 64, 64, 64, 100, 64, 64, 64, 5};
    maskpack_layout *L = lay_lengths(lens, 9, MASKPACK_PLACE_PACKED, 0);
    if (!L) return;
    const maskpack_isa isa = best_isa();
    gcase base = case_make(L, d, 77, 1);
    CHECK_OK(case_forward(&base, isa, 1, 1), (maskpack_error){0});
    const int threads[3] = {2, 3, 4};
    for (int t = 0; t < 3; t++) {
        gcase c = case_make(L, d, 77, 1);
        CHECK_OK(case_forward(&c, isa, 1, threads[t]), (maskpack_error){0});
        CHECK(case_same_bits(&c, &base));
        CHECK(pads_zero(L, &c.o));
        case_free(&c);
    }
    case_free(&base);
    maskpack_layout_free(L);
}

/* ---- conv1d ----------------------------------------------------------------------------------- */

/* y[t] = act(sum_w w[w] xx[t + w]) with xx = prefix ++ x; state = last W-1 of xx */
static void naive_conv(int64_t len, int64_t C, int64_t W, const double *x, const double *w, const double *pre, int silu,
                       double *y, double *state) {
    for (int64_t c = 0; c < C; c++) {
        for (int64_t t = 0; t < len; t++) {
            double acc = 0;
            for (int64_t k = 0; k < W; k++) {
                int64_t i = t + k - (W - 1); /* x index; negative = prefix */
                double xv = i >= 0 ? x[i * C + c] : (pre ? pre[c * (W - 1) + (W - 1) + i] : 0.0);
                acc += w[c * W + k] * xv;
            }
            y[t * C + c] = silu ? acc / (1 + exp(-acc)) : acc;
        }
        for (int64_t j = 0; j < W - 1; j++) {
            int64_t i = len - (W - 1) + j;
            state[c * (W - 1) + j] = i >= 0 ? x[i * C + c] : (pre ? pre[c * (W - 1) + (W - 1) + i] : 0.0);
        }
    }
}

/* C = 37: one channel block ending mid-vector; C = 150: three blocks, the last partial. */
static void test_conv_c(int64_t C) {
    const int64_t lens[6] = {0, 1, 2, 3, 70, 5};
    maskpack_layout *Lp = lay_lengths(lens, 6, MASKPACK_PLACE_PACKED, 0),
                    *Lr = lay_lengths(lens, 6, MASKPACK_PLACE_LEFT, 0);
    if (!Lp || !Lr) return;
    for (int64_t W = 1; W <= 4; W++)
        for (int silu = 0; silu <= 1; silu++)
            for (int with_pre = 0; with_pre <= 1; with_pre++) {
                int64_t cd[1] = {C}, pd[2] = {C, W - 1};
                ttensor x = tok_alloc(Lr, 1, cd), y = tok_alloc(Lr, 1, cd), xp = tok_alloc(Lp, 1, cd),
                        yp = tok_alloc(Lp, 1, cd);
                tok_fill(Lr, &x, T_X, (uint64_t)W);
                tok_fill(Lp, &xp, T_X, (uint64_t)W);
                float *wd = malloc((size_t)(C * W) * 4);
                double *wdd = malloc((size_t)(C * W) * 8);
                for (int64_t i = 0; i < C * W; i++) wdd[i] = wd[i] = (float)uval(T_W, i, W, 0, 0);
                int64_t wsh[2] = {C, W};
                maskpack_tensor wt = maskpack_tensor_contiguous(wd, MASKPACK_F32, 2, wsh);
                stensor pre = st_alloc(6, 2, pd, T_PRE, (uint64_t)W), st = st_alloc(6, 2, pd, 0, 0),
                        st2 = st_alloc(6, 2, pd, 0, 0);
                maskpack_error e;
                CHECK_OK(
                    maskpack_causal_conv1d(Lr, &x.t, &wt, with_pre ? &pre.t : NULL, silu, OPTS_NT(2), &y.t, &st.t, &e),
                    e);
                CHECK_OK(
                    maskpack_causal_conv1d(Lp, &xp.t, &wt, with_pre ? &pre.t : NULL, silu, NULL, &yp.t, &st2.t, &e), e);
                CHECK(pads_zero(Lr, &y));
                CHECK(memcmp(st.data, st2.data, (size_t)(6 * st.per) * 4) == 0);
                double worst = 0;
                int same = 1;
                for (size_t s = 0; s < 6; s++) {
                    int64_t n = lens[s] > 0 ? lens[s] : 1;
                    double *xs = malloc((size_t)(n * C) * 8), *ys = malloc((size_t)(n * C) * 8),
                           *ps = malloc((size_t)(C * W) * 8), *ss = malloc((size_t)(C * W) * 8);
                    for (int64_t p = 0; p < lens[s]; p++)
                        for (int64_t c = 0; c < C; c++) xs[p * C + c] = tok_at(Lr, &x, s, p)[c];
                    for (int64_t i = 0; i < C * (W - 1); i++) ps[i] = pre.data[(int64_t)s * pre.per + i];
                    naive_conv(lens[s], C, W, xs, wdd, with_pre ? ps : NULL, silu, ys, ss);
                    for (int64_t p = 0; p < lens[s]; p++) {
                        same &= memcmp(tok_at(Lr, &y, s, p), tok_at(Lp, &yp, s, p), (size_t)C * 4) == 0;
                        for (int64_t c = 0; c < C; c++)
                            worst = fmax(worst, fabs(ys[p * C + c] - tok_at(Lr, &y, s, p)[c]));
                    }
                    for (int64_t i = 0; i < C * (W - 1); i++)
                        worst = fmax(worst, fabs(ss[i] - st.data[(int64_t)s * st.per + i]));
                    free(xs);
                    free(ys);
                    free(ps);
                    free(ss);
                }
                CHECK(same);
                CHECK(worst < 1e-5);
                /* backward: f = sum(y * R) + sum(state * Rs); directional derivatives by finite
                 * differences of the double conv */
                ttensor dy = tok_alloc(Lr, 1, cd), dx = tok_alloc(Lr, 1, cd);
                tok_fill(Lr, &dy, T_DY, (uint64_t)W);
                stensor dst = st_alloc(6, 2, pd, T_DST, (uint64_t)W), dpre = st_alloc(6, 2, pd, 0, 0);
                float *dwd = malloc((size_t)(C * W) * 4);
                maskpack_tensor dwt = maskpack_tensor_contiguous(dwd, MASKPACK_F32, 2, wsh);
                CHECK_OK(maskpack_causal_conv1d_backward(Lr, &x.t, &wt, with_pre ? &pre.t : NULL, silu, &dy.t, &dst.t,
                                                         OPTS_NT(2), &dx.t, &dwt, &dpre.t, &e),
                         e);
                CHECK(pads_zero(Lr, &dx));
                double dw_fd_acc = 0, dw_ours = 0, dw_nrm = 0;
                for (size_t s = 0; s < 6; s++) {
                    int64_t n = lens[s];
                    int64_t nn = n > 0 ? n : 1;
                    double *xs = malloc((size_t)(nn * C) * 8), *ys = malloc((size_t)(nn * C) * 8),
                           *ps = malloc((size_t)(C * W) * 8), *ss = malloc((size_t)(C * W) * 8);
                    for (int64_t p = 0; p < n; p++)
                        for (int64_t c = 0; c < C; c++) xs[p * C + c] = tok_at(Lr, &x, s, p)[c];
                    for (int64_t i = 0; i < C * (W - 1); i++)
                        ps[i] = with_pre ? pre.data[(int64_t)s * pre.per + i] : 0.0;
                        /* f for this segment (prefix given explicitly: zero prefix = no prefix) */
#define SEG_F(res)                                                                                                     \
    do {                                                                                                               \
        naive_conv(n, C, W, xs, wdd, ps, silu, ys, ss);                                                                \
        res = 0;                                                                                                       \
        for (int64_t p_ = 0; p_ < n; p_++)                                                                             \
            for (int64_t c_ = 0; c_ < C; c_++) res += ys[p_ * C + c_] * tok_at(Lr, &dy, s, p_)[c_];                    \
        for (int64_t i_ = 0; i_ < C * (W - 1); i_++) res += ss[i_] * dst.data[(int64_t)s * dst.per + i_];              \
    } while (0)
                    const double eps = 1e-6;
                    double fp, fm, ours = 0, nrm = 0;
                    /* x */
                    for (int64_t i = 0; i < n * C; i++) {
                        double dir = uval(60, (int64_t)s, i, W, 0);
                        xs[i] += eps * dir;
                        double g = tok_at(Lr, &dx, s, i / C)[i % C];
                        ours += g * dir;
                        nrm += fabs(g * dir);
                    }
                    SEG_F(fp);
                    for (int64_t i = 0; i < n * C; i++) xs[i] -= 2 * eps * uval(60, (int64_t)s, i, W, 0);
                    SEG_F(fm);
                    for (int64_t i = 0; i < n * C; i++) xs[i] += eps * uval(60, (int64_t)s, i, W, 0);
                    if (n > 0) CHECK(fabs((fp - fm) / (2 * eps) - ours) <= 1e-5 * fmax(nrm, 1.0));
                    /* prefix */
                    ours = nrm = 0;
                    for (int64_t i = 0; i < C * (W - 1); i++) {
                        double dir = uval(61, (int64_t)s, i, W, 0);
                        ps[i] += eps * dir;
                        ours += dpre.data[(int64_t)s * dpre.per + i] * dir;
                        nrm += fabs(dpre.data[(int64_t)s * dpre.per + i] * dir);
                    }
                    SEG_F(fp);
                    for (int64_t i = 0; i < C * (W - 1); i++) ps[i] -= 2 * eps * uval(61, (int64_t)s, i, W, 0);
                    SEG_F(fm);
                    for (int64_t i = 0; i < C * (W - 1); i++) ps[i] += eps * uval(61, (int64_t)s, i, W, 0);
                    CHECK(fabs((fp - fm) / (2 * eps) - ours) <= 1e-5 * fmax(nrm, 1.0));
                    /* weight: accumulate the finite difference over segments */
                    for (int64_t i = 0; i < C * W; i++) wdd[i] += eps * uval(62, i, W, 0, 0);
                    SEG_F(fp);
                    for (int64_t i = 0; i < C * W; i++) wdd[i] -= 2 * eps * uval(62, i, W, 0, 0);
                    SEG_F(fm);
                    for (int64_t i = 0; i < C * W; i++) wdd[i] += eps * uval(62, i, W, 0, 0);
                    dw_fd_acc += (fp - fm) / (2 * eps);
#undef SEG_F
                    free(xs);
                    free(ys);
                    free(ps);
                    free(ss);
                }
                for (int64_t i = 0; i < C * W; i++) {
                    dw_ours += dwd[i] * uval(62, i, W, 0, 0);
                    dw_nrm += fabs(dwd[i] * uval(62, i, W, 0, 0));
                }
                CHECK(fabs(dw_fd_acc - dw_ours) <= 1e-5 * fmax(dw_nrm, 1.0));
                free(x.data);
                free(y.data);
                free(xp.data);
                free(yp.data);
                free(dy.data);
                free(dx.data);
                free(wd);
                free(wdd);
                free(dwd);
                free(pre.data);
                free(st.data);
                free(st2.data);
                free(dst.data);
                free(dpre.data);
            }
    /* continuation: the conv of a sequence in two pieces (state of piece 1 as prefix of piece 2)
     * equals the whole, bitwise, also when piece 1 is shorter than the kernel */
    {
        const int64_t W = 4, whole[1] = {50};
        int64_t cd[1] = {C}, pd[2] = {C, W - 1}, wsh[2] = {C, W};
        float *wd = malloc((size_t)(C * W) * 4);
        for (int64_t i = 0; i < C * W; i++) wd[i] = (float)uval(T_W, i, 9, 0, 0);
        maskpack_tensor wt = maskpack_tensor_contiguous(wd, MASKPACK_F32, 2, wsh);
        maskpack_layout *Lw = lay_lengths(whole, 1, MASKPACK_PLACE_PACKED, 0);
        ttensor x = tok_alloc(Lw, 1, cd), y = tok_alloc(Lw, 1, cd);
        tok_fill(Lw, &x, T_X, 77);
        stensor stw = st_alloc(1, 2, pd, 0, 0);
        maskpack_error e;
        CHECK_OK(maskpack_causal_conv1d(Lw, &x.t, &wt, NULL, 1, NULL, &y.t, &stw.t, &e), e);
        const int64_t cuts[3] = {2, 1, 30};
        for (int ci = 0; ci < 3; ci++) {
            int64_t cut = cuts[ci], l1[1] = {cut}, l2[1] = {50 - cut};
            maskpack_layout *L1 = lay_lengths(l1, 1, MASKPACK_PLACE_PACKED, 0),
                            *L2 = lay_lengths(l2, 1, MASKPACK_PLACE_PACKED, 0);
            ttensor x1 = tok_alloc(L1, 1, cd), y1 = tok_alloc(L1, 1, cd), x2 = tok_alloc(L2, 1, cd),
                    y2 = tok_alloc(L2, 1, cd);
            memcpy(x1.data, x.data, (size_t)(cut * C) * 4);
            memcpy(x2.data, x.data + cut * C, (size_t)((50 - cut) * C) * 4);
            stensor s1 = st_alloc(1, 2, pd, 0, 0), s2 = st_alloc(1, 2, pd, 0, 0);
            CHECK_OK(maskpack_causal_conv1d(L1, &x1.t, &wt, NULL, 1, NULL, &y1.t, &s1.t, &e), e);
            CHECK_OK(maskpack_causal_conv1d(L2, &x2.t, &wt, &s1.t, 1, OPTS_NT(2), &y2.t, &s2.t, &e), e);
            CHECK(memcmp(y1.data, y.data, (size_t)(cut * C) * 4) == 0);
            CHECK(memcmp(y2.data, y.data + cut * C, (size_t)((50 - cut) * C) * 4) == 0);
            CHECK(memcmp(s2.data, stw.data, (size_t)(C * (W - 1)) * 4) == 0);
            free(x1.data);
            free(y1.data);
            free(x2.data);
            free(y2.data);
            free(s1.data);
            free(s2.data);
            maskpack_layout_free(L1);
            maskpack_layout_free(L2);
        }
        free(x.data);
        free(y.data);
        free(stw.data);
        free(wd);
        maskpack_layout_free(Lw);
    }
    maskpack_layout_free(Lp);
    maskpack_layout_free(Lr);
}

/* The conv's vector rows (AVX2) against its portable loops on one problem with several channel
 * blocks, long segments, a prefix and a state gradient: forward, state (bitwise: copies) and all
 * gradients within float rounding. Skipped on a CPU without AVX2. */
static void test_conv_isa_agree(void) {
    if (!have_avx2()) {
        printf("test_gdn: no AVX2 on this CPU: conv vector rows not compared\n");
        return;
    }
    const int64_t lens[3] = {300, 64, 7}, C = 200, W = 4;
    maskpack_layout *L = lay_lengths(lens, 3, MASKPACK_PLACE_RIGHT, 0);
    if (!L) return;
    int64_t cd[1] = {C}, pd[2] = {C, W - 1}, wsh[2] = {C, W};
    float *wd = malloc((size_t)(C * W) * 4);
    for (int64_t i = 0; i < C * W; i++) wd[i] = (float)uval(T_W, i, W, 0, 0);
    maskpack_tensor wt = maskpack_tensor_contiguous(wd, MASKPACK_F32, 2, wsh);
    ttensor x = tok_alloc(L, 1, cd), dy = tok_alloc(L, 1, cd);
    tok_fill(L, &x, T_X, 91);
    tok_fill(L, &dy, T_DY, 91);
    stensor pre = st_alloc(3, 2, pd, T_PRE, 91), dst = st_alloc(3, 2, pd, T_DST, 91);
    ttensor y[2], dx[2];
    stensor st[2], dpre[2];
    float *dw[2];
    for (int r = 0; r < 2; r++) {
        /* r = 0: the portable loops (MASKPACK_ISA=ref), r = 1: the default (vector rows here) */
        if (r == 0)
            setenv("MASKPACK_ISA", "ref", 1);
        else
            unsetenv("MASKPACK_ISA");
        y[r] = tok_alloc(L, 1, cd);
        dx[r] = tok_alloc(L, 1, cd);
        st[r] = st_alloc(3, 2, pd, 0, 0);
        dpre[r] = st_alloc(3, 2, pd, 0, 0);
        dw[r] = malloc((size_t)(C * W) * 4);
        maskpack_tensor dwt = maskpack_tensor_contiguous(dw[r], MASKPACK_F32, 2, wsh);
        maskpack_error e;
        CHECK_OK(maskpack_causal_conv1d(L, &x.t, &wt, &pre.t, 1, OPTS_NT(2), &y[r].t, &st[r].t, &e), e);
        CHECK_OK(maskpack_causal_conv1d_backward(L, &x.t, &wt, &pre.t, 1, &dy.t, &dst.t, OPTS_NT(2), &dx[r].t, &dwt,
                                                 &dpre[r].t, &e),
                 e);
        CHECK(pads_zero(L, &y[r]) && pads_zero(L, &dx[r]));
    }
    CHECK(memcmp(st[0].data, st[1].data, (size_t)(3 * st[0].per) * 4) == 0);
    double ey = 0, my = 0, ex = 0, mx = 0, ep = 0, mp = 0, ew = 0, mw = 0;
    const int64_t n = mp_numel(&y[0].t);
    for (int64_t i = 0; i < n; i++) {
        ey = fmax(ey, fabs((double)y[0].data[i] - y[1].data[i]));
        my = fmax(my, fabs((double)y[0].data[i]));
        ex = fmax(ex, fabs((double)dx[0].data[i] - dx[1].data[i]));
        mx = fmax(mx, fabs((double)dx[0].data[i]));
    }
    for (int64_t i = 0; i < 3 * dpre[0].per; i++) {
        ep = fmax(ep, fabs((double)dpre[0].data[i] - dpre[1].data[i]));
        mp = fmax(mp, fabs((double)dpre[0].data[i]));
    }
    for (int64_t i = 0; i < C * W; i++) {
        ew = fmax(ew, fabs((double)dw[0][i] - dw[1][i]));
        mw = fmax(mw, fabs((double)dw[0][i]));
    }
    printf("test_gdn: conv vector rows vs portable loops: y %.1e, dx %.1e, d_prefix %.1e, dweight %.1e (relative)\n",
           ey / my, ex / mx, ep / mp, ew / mw);
    CHECK(my > 0 && ey / my < 1e-5);
    CHECK(mx > 0 && ex / mx < 1e-5);
    CHECK(mp > 0 && ep / mp < 1e-5);
    CHECK(mw > 0 && ew / mw < 1e-5);
    for (int r = 0; r < 2; r++) {
        free(y[r].data);
        free(dx[r].data);
        free(st[r].data);
        free(dpre[r].data);
        free(dw[r]);
    }
    free(x.data);
    free(dy.data);
    free(pre.data);
    free(dst.data);
    free(wd);
    maskpack_layout_free(L);
}

/* ---- l2norm and gates -------------------------------------------------------------------------- */

static void test_l2norm_gates(void) {
    const int64_t lens[3] = {5, 0, 9};
    maskpack_layout *L = lay_lengths(lens, 3, MASKPACK_PLACE_RIGHT, 0);
    if (!L) return;
    int64_t xd[2] = {3, 10}, hd[1] = {4};
    ttensor x = tok_alloc(L, 2, xd), y = tok_alloc(L, 2, xd), dy = tok_alloc(L, 2, xd), dx = tok_alloc(L, 2, xd);
    tok_fill(L, &x, T_Q, 1);
    tok_fill(L, &dy, T_DY, 1);
    maskpack_error e;
    CHECK_OK(maskpack_gdn_l2norm(L, &x.t, 1e-6, &y.t, &e), e);
    CHECK_OK(maskpack_gdn_l2norm_backward(L, &x.t, &dy.t, 1e-6, &dx.t, &e), e);
    CHECK(pads_zero(L, &y) && pads_zero(L, &dx));
    double worst = 0, gworst = 0;
    for (size_t s = 0; s < 3; s++)
        for (int64_t p = 0; p < lens[s]; p++)
            for (int64_t h = 0; h < 3; h++) {
                const float *xv = tok_at(L, &x, s, p) + h * 10, *yv = tok_at(L, &y, s, p) + h * 10;
                const float *gy = tok_at(L, &dy, s, p) + h * 10, *gx = tok_at(L, &dx, s, p) + h * 10;
                double ss = 0;
                for (int i = 0; i < 10; i++) ss += (double)xv[i] * xv[i];
                double r = 1 / sqrt(ss + 1e-6), dot = 0;
                for (int i = 0; i < 10; i++) {
                    worst = fmax(worst, fabs(xv[i] * r - yv[i]));
                    dot += xv[i] * r * gy[i];
                }
                for (int i = 0; i < 10; i++) gworst = fmax(gworst, fabs(r * (gy[i] - xv[i] * r * dot) - gx[i]));
            }
    CHECK(worst < 1e-6);
    CHECK(gworst < 1e-5);
    /* gates */
    ttensor a = tok_alloc(L, 1, hd), b = tok_alloc(L, 1, hd), g = tok_alloc(L, 1, hd), bt = tok_alloc(L, 1, hd);
    ttensor dg = tok_alloc(L, 1, hd), db_in = tok_alloc(L, 1, hd), da = tok_alloc(L, 1, hd), db = tok_alloc(L, 1, hd);
    tok_fill(L, &a, T_X, 2);
    tok_fill(L, &b, T_W, 2);
    tok_fill(L, &dg, T_DO, 2);
    tok_fill(L, &db_in, T_DY, 2);
    for (size_t i = 0; i < 4; i++) tok_at(L, &a, 0, 0)[i] = 30.0f; /* beyond softplus' threshold */
    float alog[4] = {0.1f, -1.0f, 2.0f, 0.5f}, dtb[4] = {0.2f, -0.3f, 1.0f, 0.0f}, dA[4], ddt[4];
    int64_t one[1] = {4};
    maskpack_tensor At = maskpack_tensor_contiguous(alog, MASKPACK_F32, 1, one),
                    Dt = maskpack_tensor_contiguous(dtb, MASKPACK_F32, 1, one);
    maskpack_tensor dAt = maskpack_tensor_contiguous(dA, MASKPACK_F32, 1, one),
                    dDt = maskpack_tensor_contiguous(ddt, MASKPACK_F32, 1, one);
    CHECK_OK(maskpack_gdn_gates(L, &a.t, &b.t, &At, &Dt, &g.t, &bt.t, &e), e);
    CHECK_OK(maskpack_gdn_gates_backward(L, &a.t, &b.t, &At, &Dt, &dg.t, &db_in.t, &da.t, &db.t, &dAt, &dDt, &e), e);
    CHECK(pads_zero(L, &g) && pads_zero(L, &bt) && pads_zero(L, &da) && pads_zero(L, &db));
    double sumA[4] = {0}, sumD[4] = {0};
    worst = gworst = 0;
    for (size_t s = 0; s < 3; s++)
        for (int64_t p = 0; p < lens[s]; p++)
            for (int h = 0; h < 4; h++) {
                double z = tok_at(L, &a, s, p)[h] + (double)dtb[h];
                double sp = z > 20 ? z : log1p(exp(z)), A = exp((double)alog[h]);
                double gval = -A * sp, bval = 1 / (1 + exp(-(double)tok_at(L, &b, s, p)[h]));
                worst = fmax(worst, fabs(gval - tok_at(L, &g, s, p)[h]) / fmax(1, fabs(gval)));
                worst = fmax(worst, fabs(bval - tok_at(L, &bt, s, p)[h]));
                double gg = tok_at(L, &dg, s, p)[h], gb = tok_at(L, &db_in, s, p)[h];
                double dz = gg * -A * (z > 20 ? 1 : 1 / (1 + exp(-z)));
                gworst = fmax(gworst, fabs(dz - tok_at(L, &da, s, p)[h]) / fmax(1, fabs(dz)));
                gworst = fmax(gworst, fabs(gb * bval * (1 - bval) - tok_at(L, &db, s, p)[h]));
                sumA[h] += gg * gval;
                sumD[h] += dz;
            }
    for (int h = 0; h < 4; h++) {
        gworst = fmax(gworst, fabs(sumA[h] - dA[h]) / fmax(1, fabs(sumA[h])));
        gworst = fmax(gworst, fabs(sumD[h] - ddt[h]) / fmax(1, fabs(sumD[h])));
    }
    CHECK(worst < 1e-6);
    CHECK(gworst < 1e-6);
    ttensor *all[12] = {&x, &y, &dy, &dx, &a, &b, &g, &bt, &dg, &db_in, &da, &db};
    for (int i = 0; i < 12; i++) free(all[i]->data);
    maskpack_layout_free(L);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static int untouched(const float *p, int64_t n, uint32_t sentinel) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &p[i], 4);
        if (b != sentinel) return 0;
    }
    return 1;
}

static void sentinel_fill(float *p, int64_t n, uint32_t sentinel) {
    for (int64_t i = 0; i < n; i++) memcpy(&p[i], &sentinel, 4);
}

static void test_bad_input(void) {
    const uint32_t SENT = 0x7fc12345u;
    dims d = {2, 4, 16, 16};
    const int64_t lens[3] = {10, 0, 7};
    maskpack_layout *L = lay_lengths(lens, 3, MASKPACK_PLACE_PACKED, 0),
                    *Lr = lay_lengths(lens, 3, MASKPACK_PLACE_RIGHT, 0);
    if (!L || !Lr) return;
    gcase c = case_make(L, d, 1, 1);
    int64_t no = mp_numel(&c.o.t), ns = mp_numel(&c.ht.t);
    maskpack_error e;
    maskpack_gdn_options o = opts_of(MASKPACK_ISA_AUTO, 1, 1);
#define EXPECT_FAIL(call, status, frag)                                                                                \
    do {                                                                                                               \
        sentinel_fill(c.o.data, no, SENT);                                                                             \
        sentinel_fill(c.ht.data, ns, SENT);                                                                            \
        CHECK_STATUS(call, status, e);                                                                                 \
        CHECK_MSG(e, frag);                                                                                            \
        CHECK(untouched(c.o.data, no, SENT) && untouched(c.ht.data, ns, SENT));                                        \
    } while (0)
    maskpack_gdn_inputs in = case_inputs(&c);
    /* HV = 4 not a multiple of H = 3: view q as [T, 3, ...] by reshaping K */
    maskpack_tensor q3 = c.q.t, k3 = c.k.t;
    q3.shape[1] = 3;
    q3.shape[2] = 10;
    q3.strides[1] = 10;
    k3 = q3;
    k3.data = c.k.data;
    in.q = &q3;
    in.k = &k3;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_SHAPE,
                "multiple of the key heads H = 3");
    CHECK(strcmp(e.argument, "v") == 0);
    in = case_inputs(&c);
    /* k with another head dim */
    maskpack_tensor k8 = c.k.t;
    k8.shape[2] = 8;
    in.k = &k8;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_SHAPE,
                "k: expected shape [17, 2, 16]");
    in = case_inputs(&c);
    /* the layout does not cover the tensors: 16 tokens instead of 17 */
    maskpack_tensor vs = c.v.t;
    vs.shape[0] = 16;
    in.v = &vs;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_SHAPE,
                "v: expected shape [17, *, *]");
    in = case_inputs(&c);
    /* a packed tensor for a padded layout */
    EXPECT_FAIL(maskpack_gdn_forward(Lr, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_SHAPE, "padded [B, S]");
    /* g with the wrong head count */
    maskpack_tensor g3 = c.g.t;
    g3.shape[1] = 3;
    in.g = &g3;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_SHAPE,
                "g: expected shape [17, 4]");
    in = case_inputs(&c);
    /* wrong dtypes */
    maskpack_tensor bi = c.beta.t;
    bi.dtype = MASKPACK_I32;
    in.beta = &bi;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_DTYPE,
                "beta: expected float32 or bfloat16, found int32");
    in = case_inputs(&c);
    maskpack_tensor h0b = c.h0.t;
    h0b.dtype = MASKPACK_BF16;
    in.initial_state = &h0b;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_DTYPE,
                "initial_state: expected float32");
    in = case_inputs(&c);
    /* state shape: segments count */
    maskpack_tensor h0s = c.h0.t;
    h0s.shape[0] = 2;
    in.initial_state = &h0s;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_SHAPE,
                "initial_state: expected shape [3, 4, 16, 16]");
    in = case_inputs(&c);
    /* NULLs, options */
    in.v = NULL;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_NULL_ARGUMENT,
                "v: expected a non-NULL");
    in = case_inputs(&c);
    maskpack_gdn_options bad = o;
    bad.n_threads = 0;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &bad, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                "opts.n_threads");
    bad = o;
    bad.scale = NAN;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &bad, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                "opts.scale");
    bad = o;
    bad.isa = (maskpack_isa)7;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &bad, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, "isa");
    setenv("MASKPACK_ISA", "sse9", 1);
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                "MASKPACK_ISA");
    setenv("MASKPACK_ISA", "ref", 1);
    maskpack_isa r;
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e), e);
    CHECK_EQ(r, MASKPACK_ISA_REF);
    /* "amx" takes the amx entry where the CPU has AMX (its f32 inputs run the AVX-512 kernel, its bf16
     * ones the tile kernel: test_gdn_bf16); a CPU without AMX refuses it, naming it, as every kernel
     * family does */
    setenv("MASKPACK_ISA", "amx", 1);
    if (have_avx512() && mp_cpu_has_amx()) {
        r = MASKPACK_ISA_REF;
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e), e);
        CHECK_EQ(r, MASKPACK_ISA_AMX);
        CHECK_OK(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), e);
    } else {
        EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_UNSUPPORTED, "amx");
        CHECK_MSG(e, have_avx512() ? "AMX-TILE" : "AVX-512");
    }
    /* "avx2" forces the AVX2 kernel: UNSUPPORTED on a CPU without AVX2 + FMA, never a fallback */
    setenv("MASKPACK_ISA", "avx2", 1);
    if (have_avx2()) {
        r = MASKPACK_ISA_REF;
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e), e);
        CHECK_EQ(r, MASKPACK_ISA_AVX2);
        CHECK_OK(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), e);
    } else {
        EXPECT_FAIL(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e),
                    MASKPACK_ERR_UNSUPPORTED, "AVX2");
    }
    /* an explicit request is not overridden by the environment */
    setenv("MASKPACK_ISA", "avx2", 1);
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_REF, &r, &e), e);
    CHECK_EQ(r, MASKPACK_ISA_REF);
    unsetenv("MASKPACK_ISA");
    /* AUTO: AVX-512 > AVX2 > REF */
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e), e);
    CHECK_EQ(r, best_isa());
    if (!have_avx512()) {
        bad = o;
        bad.isa = MASKPACK_ISA_AVX512;
        EXPECT_FAIL(maskpack_gdn_forward(L, &in, &bad, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_UNSUPPORTED,
                    "AVX-512");
    }
    bad = o;
    bad.isa = MASKPACK_ISA_AVX2;
    if (have_avx2()) {
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AVX2, &r, &e), e);
        CHECK_EQ(r, MASKPACK_ISA_AVX2);
    } else {
        EXPECT_FAIL(maskpack_gdn_forward(L, &in, &bad, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_UNSUPPORTED, "AVX2");
    }
    /* output aliasing an input */
    maskpack_tensor oq = c.o.t;
    oq.data = c.v.data;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &oq, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_OVERLAP,
                "o: its memory overlaps");
    /* output of the wrong shape or dtype */
    maskpack_tensor o2 = c.o.t;
    o2.shape[2] = 8;
    EXPECT_FAIL(maskpack_gdn_forward(L, &in, &o, &o2, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_SHAPE,
                "o: expected shape [17, 4, 16]");
    /* backward: dq of the wrong shape, grads untouched */
    {
        int64_t qd[2] = {d.H, d.K}, hd[1] = {4};
        ttensor dq = tok_alloc(L, 2, qd), dg = tok_alloc(L, 1, hd);
        sentinel_fill(dq.data, mp_numel(&dq.t), SENT);
        sentinel_fill(dg.data, mp_numel(&dg.t), SENT);
        maskpack_tensor dqb = dq.t;
        dqb.shape[1] = 1;
        maskpack_gdn_grads gr = {&dqb, NULL, NULL, &dg.t, NULL, NULL};
        CHECK_STATUS(maskpack_gdn_backward(L, &in, &c.o.t, NULL, &o, &gr, NULL, 0, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "dq: expected shape [17, 2, 16]");
        CHECK(untouched(dq.data, mp_numel(&dq.t), SENT) && untouched(dg.data, mp_numel(&dg.t), SENT));
        free(dq.data);
        free(dg.data);
    }
    /* conv: kernel size out of range, channel mismatch, prefix shape */
    {
        const int64_t C = 8;
        int64_t cd[1] = {C};
        ttensor x = tok_alloc(L, 1, cd), y = tok_alloc(L, 1, cd);
        tok_fill(L, &x, T_X, 1);
        float w[40];
        for (int i = 0; i < 40; i++) w[i] = 0.1f;
        int64_t w5[2] = {C, 5}, w0[2] = {C, 0}, w4[2] = {C, 4}, wc[2] = {7, 4};
        maskpack_tensor t5 = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, w5),
                        t0 = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, w0);
        maskpack_tensor t4 = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, w4),
                        tc = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, wc);
        int64_t ny = mp_numel(&y.t);
        sentinel_fill(y.data, ny, SENT);
        CHECK_STATUS(maskpack_causal_conv1d(L, &x.t, &t5, NULL, 1, NULL, &y.t, NULL, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                     e);
        CHECK_MSG(e, "kernel size W in [1, 4], found 5");
        CHECK_STATUS(maskpack_causal_conv1d(L, &x.t, &t0, NULL, 1, NULL, &y.t, NULL, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                     e);
        CHECK_STATUS(maskpack_causal_conv1d(L, &x.t, &tc, NULL, 1, NULL, &y.t, NULL, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "C = 8");
        int64_t pd[2] = {C, 2};
        stensor pre = st_alloc(3, 2, pd, T_PRE, 1);
        CHECK_STATUS(maskpack_causal_conv1d(L, &x.t, &t4, &pre.t, 1, NULL, &y.t, NULL, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "prefix: expected shape [3, 8, 3]");
        CHECK_STATUS(maskpack_causal_conv1d(L, &x.t, &t4, NULL, 2, NULL, &y.t, NULL, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                     e);
        CHECK(untouched(y.data, ny, SENT));
        free(x.data);
        free(y.data);
        free(pre.data);
    }
#undef EXPECT_FAIL
    case_free(&c);
    maskpack_layout_free(L);
    maskpack_layout_free(Lr);
}

/* The gate: a real token's g that is not a finite value <= 0 (g > 0 grows the state, NaN, -inf) is
 * refused by name with its first (row, col, head) or (token, head), nothing written, by the forward,
 * the backward, an operator's runs and maskpack_gdn_check_gate; pads are never read (they hold NaN
 * and Inf here); opts.skip_gate_check = 1 runs g as given. */
static void test_gate_check(void) {
    const uint32_t SENT = 0x7fc12345u;
    dims d = {2, 4, 16, 16};
    const int64_t lens[3] = {10, 0, 7};
    maskpack_layout *Ls[2] = {lay_lengths(lens, 3, MASKPACK_PLACE_PACKED, 0),
                              lay_lengths(lens, 3, MASKPACK_PLACE_RIGHT, 12)};
    if (!Ls[0] || !Ls[1]) return;
    const float bad[4] = {0.5f, NAN, -INFINITY, 1e-30f};
    maskpack_error e;
    for (int li = 0; li < 2; li++) {
        maskpack_layout *L = Ls[li];
        const int packed = li == 0;
        gcase c = case_make(L, d, 5, 1);
        int64_t no = mp_numel(&c.o.t), ns = mp_numel(&c.ht.t);
        maskpack_gdn_inputs in = case_inputs(&c);
        for (int chunked = 0; chunked <= 1; chunked++) {
            maskpack_gdn_options o = opts_of(MASKPACK_ISA_AUTO, chunked, 2);
            CHECK_OK(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), e); /* NaN/Inf pads: fine */
            CHECK_OK(maskpack_gdn_check_gate(L, &c.g.t, &e), e);
            for (int b = 0; b < 4; b++) {
                /* segment 2 (row 2 when padded), its token 3, head 1; a later bad token too */
                float *x = tok_at(L, &c.g, 2, 3), *y = tok_at(L, &c.g, 2, 5);
                const float keep_x = x[1], keep_y = y[0];
                x[1] = bad[b];
                y[0] = bad[b];
                sentinel_fill(c.o.data, no, SENT);
                sentinel_fill(c.ht.data, ns, SENT);
                CHECK_STATUS(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_VALUE, e);
                CHECK(strcmp(e.argument, "g") == 0);
                if (packed) {
                    CHECK(e.index[0] == 13 && e.index[1] == 1 && e.index[2] == -1);
                    CHECK_MSG(e, "token 13, head 1");
                } else {
                    CHECK(e.index[0] == 2 && e.index[1] == 3 && e.index[2] == 1);
                    CHECK_MSG(e, "row 2, token 3, head 1");
                }
                CHECK(untouched(c.o.data, no, SENT) && untouched(c.ht.data, ns, SENT));
                CHECK_STATUS(maskpack_gdn_check_gate(L, &c.g.t, &e), MASKPACK_ERR_VALUE, e);
                CHECK(e.index[packed ? 0 : 1] == (packed ? 13 : 3));
                /* the backward: gradients untouched */
                int64_t qd[2] = {d.H, d.K};
                ttensor dq = tok_alloc(L, 2, qd);
                sentinel_fill(dq.data, mp_numel(&dq.t), SENT);
                maskpack_gdn_grads gr = {&dq.t, NULL, NULL, NULL, NULL, NULL};
                CHECK_STATUS(maskpack_gdn_backward(L, &in, &c.o.t, NULL, &o, &gr, NULL, 0, &e), MASKPACK_ERR_VALUE, e);
                CHECK(strcmp(e.argument, "g") == 0 && untouched(dq.data, mp_numel(&dq.t), SENT));
                free(dq.data);
                /* an operator's run */
                maskpack_gdn_op *op = NULL;
                CHECK_OK(maskpack_gdn_op_create(L, d.H, d.HV, d.K, d.V, &o, &op, &e), e);
                CHECK_STATUS(maskpack_gdn_op_forward(op, &in, &c.o.t, &c.ht.t, NULL, NULL, 0, &e), MASKPACK_ERR_VALUE,
                             e);
                CHECK(untouched(c.o.data, no, SENT));
                maskpack_gdn_op_free(op);
                /* asked not to check: it runs */
                maskpack_gdn_options un = o;
                un.skip_gate_check = 1;
                CHECK_OK(maskpack_gdn_forward(L, &in, &un, &c.o.t, &c.ht.t, NULL, 0, &e), e);
                CHECK_OK(maskpack_gdn_op_create(L, d.H, d.HV, d.K, d.V, &un, &op, &e), e);
                CHECK_OK(maskpack_gdn_op_forward(op, &in, &c.o.t, &c.ht.t, NULL, NULL, 0, &e), e);
                maskpack_gdn_op_free(op);
                x[1] = keep_x;
                y[0] = keep_y;
            }
            /* g = 0 (no decay) and -0 are allowed */
            float *z = tok_at(L, &c.g, 0, 0);
            z[0] = 0.0f;
            z[1] = -0.0f;
            CHECK_OK(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), e);
        }
        maskpack_gdn_options o = opts_of(MASKPACK_ISA_AUTO, 1, 1);
        o.skip_gate_check = 2;
        CHECK_STATUS(maskpack_gdn_forward(L, &in, &o, &c.o.t, &c.ht.t, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
        CHECK_MSG(e, "opts.skip_gate_check");
        CHECK_STATUS(maskpack_gdn_check_gate(L, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
        case_free(&c);
    }
    maskpack_layout_free(Ls[0]);
    maskpack_layout_free(Ls[1]);
}

/* ---- the triangular GEMM's empty inner range ---------------------------------------------------------- */

typedef void (*gemm_x_fn)(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                          int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);

/* C [20 x 32] = cs Cin + alpha A B with A upper triangular (A(i, k) = 0 for k < i, GDN_GEMM_TRI_UP)
 * and kd = 8: the row blocks at or below row 8 have an empty inner range, and must come out as
 * exactly 0 (or cs Cin when accumulating); the others match the product in double. */
static void check_tri_up(const char *name, gemm_x_fn fn) {
    enum { M = 20, N = 32, KD = 8 };
    static float A[M * KD], B[KD * N], C[M * N], Cin[M * N];
    for (int i = 0; i < M; i++)
        for (int k = 0; k < KD; k++) A[i * KD + k] = k < i ? 0.0f : (float)((i * 7 + k * 3) % 11) / 8.0f - 0.6f;
    for (int k = 0; k < KD; k++)
        for (int j = 0; j < N; j++) B[k * N + j] = (float)((k * 5 + j * 13) % 17) / 16.0f - 0.5f;
    for (int i = 0; i < M * N; i++) Cin[i] = (float)(i % 23) - 11.0f;
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        const float alpha = 0.75f, cs = 0.5f;
        for (int i = 0; i < M * N; i++) C[i] = NAN; /* every entry must be written */
        const unsigned flags = GDN_GEMM_TRI_UP | (accumulate ? GDN_GEMM_ACC : 0u);
        fn(M, N, KD, alpha, A, KD, B, N, C, N, flags, NULL, Cin, cs);
        double worst = 0.0;
        int empty_rows_exact = 1;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double want = accumulate ? (double)cs * Cin[i * N + j] : 0.0;
                for (int k = 0; k < KD; k++) want += (double)alpha * A[i * KD + k] * B[k * N + j];
                const double d = fabs(C[i * N + j] - want);
                if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
                if (i >= KD && C[i * N + j] != (accumulate ? cs * Cin[i * N + j] : 0.0f)) empty_rows_exact = 0;
            }
        if (worst >= 1e-5 || !empty_rows_exact)
            fprintf(stderr, "%s: TRI_UP gemm (acc %d): worst %g, empty rows exact %d\n", name, accumulate, worst,
                    empty_rows_exact);
        CHECK(worst < 1e-5);
        CHECK(empty_rows_exact);
    }
}

static void test_gemm_empty_inner_range(void) {
    check_tri_up("ref", gdn_gemm_x_ref);
    maskpack_isa r;
    maskpack_error e;
    if (maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AVX512, &r, &e) == MASKPACK_OK)
        check_tri_up("avx512", gdn_gemm_x_avx512);
    if (mp_cpu_has_avx2()) check_tri_up("avx2", gdn_gemm_x_avx2);
}

int main(void) {
    unsetenv("MASKPACK_ISA");
    test_primitives();
    test_gemm_empty_inner_range();
    test_forward_forms();
    test_layout_invariance();
    test_strides();
    test_bf16();
    test_continuation();
    test_backward();
    test_backward_revolve();
    test_backward_zero_initial_state();
    test_workspace_constant();
    test_task_order();
    test_op_and_team();
    test_conv_team();
    /* the conv under the vector rows (AUTO on an AVX2 CPU) and under the portable loops */
    test_conv_c(37);
    test_conv_c(150);
    setenv("MASKPACK_ISA", "ref", 1);
    test_conv_c(37);
    test_conv_c(150);
    unsetenv("MASKPACK_ISA");
    test_conv_isa_agree();
    test_l2norm_gates();
    test_bad_input();
    test_gate_check();
    /* the kernels this CPU lacks are named in the summary line: a pass that checked fewer says so */
    char note[96] = "";
    if (!have_avx512() || !have_avx2())
        snprintf(note, sizeof note, "NOT RUN (this CPU lacks them):%s%s", have_avx512() ? "" : " avx512",
                 have_avx2() ? "" : " avx2");
    return check_report_note("test_gdn", note);
}
