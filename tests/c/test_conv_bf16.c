/* test_conv_bf16.c: the causal conv1d's bf16 tensors on the vector rows (conv/avx2, which AVX-512
 * requests run too). A bf16 row is widened to f32 on load and the f32 result rounded to bf16 on
 * store around the f32 rows, so the claims checked here are:
 *   - bitwise: the bf16 call equals the same kernel run on the widened (f32) inputs with its f32
 *     outputs rounded by mp_f32_to_bf16 (y, conv_state, dx, d_prefix), dweight (f32) equal, for
 *     f32 and bf16 weights, with and without silu and prefix, W = 1..4, channel counts with and
 *     without a tail of the 8-lane groups and of the 64-channel blocks, special values (ties, NaN,
 *     infinities, overflow to infinity, subnormals);
 *   - against a double reference (both the vector rows and the portable loops), within the bf16
 *     rounding of the outputs plus a float32 term (bounds below);
 *   - padded == packed bit for bit, any thread count bit for bit, AUTO and a forced avx512 run
 *     these rows for bf16 (the table serves bf16 natively), pads of y and dx zero;
 *   - an ISA the CPU lacks forced is MASKPACK_ERR_UNSUPPORTED for bf16 as for f32;
 *   - the context-parallel conv (2 ranks as threads, zigzag shards; it takes f32 tensors, so the
 *     shards are the widened bf16 values): y and the state rounded are the single-process bf16
 *     call's bits, dx and d_prefix within one bf16 ulp, the dweight shares summing to its. */
#include "check.h"
#include "cpu_features.h"
#include "internal.h"
#include "local_comm.h"

#include <math.h>
#include <stdlib.h>

enum { W_MAX = MASKPACK_GDN_MAX_CONV };

/* (seed, coordinates) -> a value in [-1, 1): a hash, so a token's value is the same wherever the
 * layout puts it (packed and padded share their inputs) */
static double hval(uint64_t seed, int64_t a, int64_t b, int64_t c) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t)a * 0xbf58476d1ce4e5b9ull +
                 (uint64_t)b * 0x94d049bb133111ebull + (uint64_t)c * 0x2545f4914f6cdd1dull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float f_of(uint16_t h) { return mp_bf16_to_f32(h); }

/* One problem: a layout, C channels, kernel W, and its bf16 inputs in that layout's form (the f32
 * copies are the same values widened). */
typedef struct prob {
    maskpack_layout *L;
    int packed;
    int64_t T, N, C, W, qw; /* T: tokens of the grid (rows x width) */
    int silu, with_prefix, wbf16, specials;
    uint16_t *x, *dy, *pre, *dst, *wb; /* bf16 [T][C], [T][C], [N][C][W-1] x2, weight [C][W] */
    float *xf, *dyf, *pref, *dstf, *wf;
} prob;

/* (layout, segment, token) -> the token's index in the grid */
static int64_t tok_index(const prob *P, size_t s, int64_t t) {
    maskpack_segment g;
    maskpack_error e;
    maskpack_layout_segment(P->L, s, &g, &e);
    return (P->packed ? 0 : g.row) * P->qw + g.q_start + t;
}

/* A value the specials case puts in x: ties of the rounding (with the weight 1 + 2^-8), NaN,
 * infinities, values whose product overflows bf16, subnormals, then random ones. */
static float special_x(int64_t i, double r) {
    static const float sp[] = {1.0f,           1.0078125f, -1.0f,   3.0f,           0.0f,     -0.0f, 3.3895314e38f,
                               -3.3895314e38f, 1e-39f,     -2e-39f, 1.1754944e-38f, 65536.0f, 0.5f};
    const int n = (int)(sizeof sp / sizeof sp[0]);
    if (i % 17 == 5) return NAN;
    if (i % 19 == 7) return INFINITY;
    if (i % 23 == 3) return -INFINITY;
    if (i % 3 == 0) return sp[(i / 3) % n];
    return (float)(r * 4.0);
}

/* (prob with L, packed, C, W, flags set, seed) -> its inputs filled: segment tokens by hash, pads
 * with a value that would show if read (the conv never reads pads) */
static void fill(prob *P, uint64_t seed) {
    P->T = maskpack_layout_n_rows(P->L) * maskpack_layout_q_width(P->L);
    P->qw = maskpack_layout_q_width(P->L);
    P->N = (int64_t)maskpack_layout_n_segments(P->L);
    const int64_t C = P->C, W = P->W, T = P->T, N = P->N, ns = N * C * (W - 1) + 1;
    P->x = calloc((size_t)(T * C), 2), P->dy = calloc((size_t)(T * C), 2);
    P->pre = calloc((size_t)ns, 2), P->dst = calloc((size_t)ns, 2), P->wb = calloc((size_t)(C * W), 2);
    P->xf = calloc((size_t)(T * C), 4), P->dyf = calloc((size_t)(T * C), 4);
    P->pref = calloc((size_t)ns, 4), P->dstf = calloc((size_t)ns, 4), P->wf = calloc((size_t)(C * W), 4);
    for (int64_t i = 0; i < T * C; i++) P->x[i] = P->dy[i] = mp_f32_to_bf16(1e30f);
    for (size_t s = 0; s < (size_t)N; s++) {
        maskpack_segment g;
        maskpack_error e;
        maskpack_layout_segment(P->L, s, &g, &e);
        for (int64_t t = 0; t < g.q_len; t++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = tok_index(P, s, t) * C + c;
                const double r = hval(seed, (int64_t)s, t, c);
                P->x[o] = mp_f32_to_bf16(P->specials ? special_x(t * C + c, r) : (float)r);
                P->dy[o] = mp_f32_to_bf16((float)hval(seed + 1, (int64_t)s, t, c));
            }
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < W - 1; i++) {
                const int64_t o = ((int64_t)s * C + c) * (W - 1) + i;
                P->pre[o] = mp_f32_to_bf16((float)hval(seed + 2, (int64_t)s, c, i));
                P->dst[o] = mp_f32_to_bf16((float)hval(seed + 3, (int64_t)s, c, i));
            }
    }
    for (int64_t i = 0; i < C * W; i++) {
        P->wb[i] = mp_f32_to_bf16((float)(0.7 * hval(seed + 4, i, 0, 0)));
        /* f32 weights: values bf16 cannot hold (1 + 2^-8 for the specials: half-way products) */
        P->wf[i] = P->specials ? 1.00390625f : (float)(0.7 * hval(seed + 4, i, 0, 0));
    }
    if (P->wbf16)
        for (int64_t i = 0; i < C * W; i++) P->wf[i] = f_of(P->wb[i]);
    for (int64_t i = 0; i < T * C; i++) P->xf[i] = f_of(P->x[i]), P->dyf[i] = f_of(P->dy[i]);
    for (int64_t i = 0; i < ns; i++) P->pref[i] = f_of(P->pre[i]), P->dstf[i] = f_of(P->dst[i]);
}

static void unfill(prob *P) {
    free(P->x), free(P->dy), free(P->pre), free(P->dst), free(P->wb);
    free(P->xf), free(P->dyf), free(P->pref), free(P->dstf), free(P->wf);
}

/* One run's outputs: y, state, dx, d_prefix in the run's dtype (bf16 or f32), dweight f32. */
typedef struct outs {
    int bf16;
    void *y, *state, *dx, *dpre;
    float *dw;
    maskpack_status s;
} outs;

static maskpack_tensor tview(const prob *P, void *buf, maskpack_dtype dt) {
    int64_t sh[3], n = 0;
    if (!P->packed) sh[n++] = maskpack_layout_n_rows(P->L);
    sh[n++] = P->qw;
    sh[n++] = P->C;
    return maskpack_tensor_contiguous(buf, dt, (int32_t)n, sh);
}

/* (prob, bf16 tensors or their f32 widening, isa, threads) -> the forward and backward outputs
 * (o->s: the first status that was not OK) */
static void run(const prob *P, int bf16, maskpack_isa isa, int threads, outs *o) {
    const int64_t C = P->C, W = P->W, T = P->T, N = P->N, ns = N * C * (W - 1) + 1;
    const maskpack_dtype dt = bf16 ? MASKPACK_BF16 : MASKPACK_F32;
    const size_t es = bf16 ? 2 : 4;
    memset(o, 0, sizeof *o);
    o->bf16 = bf16;
    o->y = calloc((size_t)(T * C), es), o->dx = calloc((size_t)(T * C), es);
    o->state = calloc((size_t)ns, es), o->dpre = calloc((size_t)ns, es);
    o->dw = calloc((size_t)(C * W), 4);
    /* nonzero pads in the outputs: the call must zero them */
    memset(o->y, 0x3f, (size_t)(T * C) * es), memset(o->dx, 0x3f, (size_t)(T * C) * es);
    maskpack_tensor tx = tview(P, bf16 ? (void *)P->x : (void *)P->xf, dt);
    maskpack_tensor tdy = tview(P, bf16 ? (void *)P->dy : (void *)P->dyf, dt);
    maskpack_tensor ty = tview(P, o->y, dt), tdx = tview(P, o->dx, dt);
    int64_t ws[2] = {C, W}, ps[3] = {N, C, W - 1};
    maskpack_tensor tw = P->wbf16 ? maskpack_tensor_contiguous(P->wb, MASKPACK_BF16, 2, ws)
                                  : maskpack_tensor_contiguous(P->wf, MASKPACK_F32, 2, ws);
    maskpack_tensor tp = maskpack_tensor_contiguous(bf16 ? (void *)P->pre : (void *)P->pref, dt, 3, ps);
    maskpack_tensor tds = maskpack_tensor_contiguous(bf16 ? (void *)P->dst : (void *)P->dstf, dt, 3, ps);
    maskpack_tensor tst = maskpack_tensor_contiguous(o->state, dt, 3, ps);
    maskpack_tensor tdp = maskpack_tensor_contiguous(o->dpre, dt, 3, ps);
    maskpack_tensor tdw = maskpack_tensor_contiguous(o->dw, MASKPACK_F32, 2, ws);
    const int st = W > 1, pre = st && P->with_prefix;
    maskpack_error e;
    o->s = maskpack_causal_conv1d(P->L, &tx, &tw, pre ? &tp : NULL, P->silu, OPTS_ISA(threads, isa), &ty,
                                  st ? &tst : NULL, &e);
    if (o->s) return;
    o->s = maskpack_causal_conv1d_backward(P->L, &tx, &tw, pre ? &tp : NULL, P->silu, &tdy, st ? &tds : NULL,
                                           OPTS_ISA(threads, isa), &tdx, &tdw, pre ? &tdp : NULL, &e);
    if (o->s) fprintf(stderr, "backward: %s\n", e.message);
}

static void unrun(outs *o) { free(o->y), free(o->state), free(o->dx), free(o->dpre), free(o->dw); }

/* an output element as bf16 bits: itself for a bf16 run, rounded by mp_f32_to_bf16 for an f32 run */
static uint16_t bits_at(const outs *o, const void *buf, int64_t i) {
    return o->bf16 ? ((const uint16_t *)buf)[i] : mp_f32_to_bf16(((const float *)buf)[i]);
}

/* (bf16 run a, run b of the same problem in the same layout) -> 1 iff b's outputs rounded to bf16
 * are a's bits and the dweights are equal bit for bit; every grid token compared (pads too) */
static int same_bits(const prob *P, const outs *a, const outs *b) {
    const int64_t C = P->C, W = P->W, ns = P->N * C * (W - 1);
    int64_t bad = 0;
    for (int64_t i = 0; i < P->T * C; i++)
        bad += bits_at(a, a->y, i) != bits_at(b, b->y, i) || bits_at(a, a->dx, i) != bits_at(b, b->dx, i);
    for (int64_t i = 0; i < ns; i++)
        bad += bits_at(a, a->state, i) != bits_at(b, b->state, i) || bits_at(a, a->dpre, i) != bits_at(b, b->dpre, i);
    bad += memcmp(a->dw, b->dw, (size_t)(C * W) * 4) != 0;
    if (bad) fprintf(stderr, "same_bits: %lld elements differ\n", (long long)bad);
    return bad == 0;
}

/* (packed prob + run, padded prob + run) -> 1 iff every segment token's y and dx, the states and
 * d_prefix, and dweight are the same bits, and the padded run's pads of y and dx are zero */
static int packed_eq_padded(const prob *Pk, const outs *a, const prob *Pd, const outs *b) {
    const int64_t C = Pk->C;
    int64_t bad = 0;
    char *seen = calloc((size_t)Pd->T, 1);
    for (size_t s = 0; s < (size_t)Pk->N; s++) {
        maskpack_segment g;
        maskpack_error e;
        maskpack_layout_segment(Pk->L, s, &g, &e);
        for (int64_t t = 0; t < g.q_len; t++) {
            const int64_t ia = tok_index(Pk, s, t) * C, ib = tok_index(Pd, s, t) * C;
            seen[ib / C] = 1;
            bad += memcmp((const uint16_t *)a->y + ia, (const uint16_t *)b->y + ib, (size_t)C * 2) != 0;
            bad += memcmp((const uint16_t *)a->dx + ia, (const uint16_t *)b->dx + ib, (size_t)C * 2) != 0;
        }
    }
    for (int64_t i = 0; i < Pd->T; i++)
        if (!seen[i])
            for (int64_t c = 0; c < C; c++)
                bad += ((const uint16_t *)b->y)[i * C + c] != 0 || ((const uint16_t *)b->dx)[i * C + c] != 0;
    const size_t ns = (size_t)(Pk->N * C * (Pk->W - 1)) * 2;
    bad += memcmp(a->state, b->state, ns) != 0 || memcmp(a->dpre, b->dpre, ns) != 0;
    bad += memcmp(a->dw, b->dw, (size_t)(C * Pk->W) * 4) != 0;
    free(seen);
    if (bad) fprintf(stderr, "packed_eq_padded: %lld rows differ\n", (long long)bad);
    return bad == 0;
}

/* The bounds of a bf16 output o against the double reference r whose terms have magnitude sum S:
 * the kernel's f32 value is within E = 2^-20 (S + 1) of r (at most W + 1 <= 5 roundings of 2^-24
 * relative each on a sum bounded by S, and the vector exp's few ulps inside silu: 2^-20 leaves a
 * margin of 3 and more), then rounding to bf16 moves it by at most half an ulp, 2^-8 of its
 * magnitude (8 significant bits): |o - r| <= 2^-8 (|r| + E) + E. dweight is f32 (no bf16 rounding):
 * |o - r| <= 2^-18 (S + 1), dpre's f32 error (the silu derivative's few ulps) summed over tokens. */
static int within(double o, double r, double S, int bf16_out, double *worst) {
    double lim;
    if (bf16_out) {
        const double E = ldexp(S + 1.0, -20);
        lim = ldexp(fabs(r) + E, -8) + E;
    } else {
        lim = ldexp(S + 1.0, -18);
    }
    const double d = fabs(o - r);
    if (d / lim > *worst) *worst = d / lim;
    return d <= lim;
}

static double out_at(const outs *o, const void *buf, int64_t i) {
    return o->bf16 ? (double)f_of(((const uint16_t *)buf)[i]) : (double)((const float *)buf)[i];
}

/* (prob without specials, a run of it) -> 1 iff the outputs agree with the double conv and its
 * backward within `within`'s bounds; *worst gets the largest |error| / bound seen */
static int vs_reference(const prob *P, const outs *o, double *worst) {
    const int64_t C = P->C, W = P->W, N = P->N;
    int64_t bad = 0;
    double *dw = calloc((size_t)(C * W), sizeof(double)), *dwS = calloc((size_t)(C * W), sizeof(double));
    for (size_t s = 0; s < (size_t)N; s++) {
        maskpack_segment g;
        maskpack_error e;
        maskpack_layout_segment(P->L, s, &g, &e);
        const int64_t len = g.q_len, n = len + W - 1;
        double *xx = calloc((size_t)n, sizeof(double)), *pre = calloc((size_t)len + 1, sizeof(double));
        double *dp = calloc((size_t)len + 1, sizeof(double));
        for (int64_t c = 0; c < C; c++) {
            const float *w = P->wf + c * W;
            for (int64_t i = 0; i < W - 1; i++)
                xx[i] = P->with_prefix ? P->pref[((int64_t)s * C + c) * (W - 1) + i] : 0.0;
            for (int64_t t = 0; t < len; t++) xx[W - 1 + t] = P->xf[tok_index(P, s, t) * C + c];
            for (int64_t t = 0; t < len; t++) {
                double a = 0, S = 0;
                for (int64_t k = 0; k < W; k++) a += (double)w[k] * xx[t + k], S += fabs((double)w[k] * xx[t + k]);
                pre[t] = a;
                const double sg = 1.0 / (1.0 + exp(-a)), y = P->silu ? a * sg : a;
                const int64_t i = tok_index(P, s, t) * C + c;
                bad += !within(out_at(o, o->y, i), y, S, 1, worst);
                const double dyv = P->dyf[i];
                dp[t] = P->silu ? dyv * sg * (1.0 + a * (1.0 - sg)) : dyv;
                for (int64_t k = 0; k < W; k++)
                    dw[c * W + k] += dp[t] * xx[t + k], dwS[c * W + k] += fabs(dp[t] * xx[t + k]);
            }
            for (int64_t i = 0; i < n; i++) {
                double d = 0, S = 0;
                for (int64_t k = 0; k < W; k++)
                    if (i - k >= 0 && i - k < len) d += (double)w[k] * dp[i - k], S += fabs((double)w[k] * dp[i - k]);
                if (i >= len) {
                    const double ds = P->dstf[((int64_t)s * C + c) * (W - 1) + (i - len)];
                    d += ds, S += fabs(ds);
                    /* the final state: the last W - 1 entries of xx, exact */
                    const int64_t so = ((int64_t)s * C + c) * (W - 1) + (i - len);
                    bad += out_at(o, o->state, so) != xx[i];
                }
                if (i < W - 1) {
                    if (P->with_prefix)
                        bad += !within(out_at(o, o->dpre, ((int64_t)s * C + c) * (W - 1) + i), d, S, 1, worst);
                } else {
                    bad += !within(out_at(o, o->dx, tok_index(P, s, i - (W - 1)) * C + c), d, S, 1, worst);
                }
            }
        }
        free(xx), free(pre), free(dp);
    }
    for (int64_t i = 0; i < C * W; i++) bad += !within(o->dw[i], dw[i], dwS[i], 0, worst);
    free(dw), free(dwS);
    if (bad) fprintf(stderr, "vs_reference: %lld elements outside the bounds\n", (long long)bad);
    return bad == 0;
}

static maskpack_layout *layout_of(const int64_t *lens, size_t n, maskpack_placement pl) {
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(lens, n, pl, 0, &r, &L, &e), e);
    return L;
}

static double worst_vec = 0, worst_ref = 0;
static int n_cases = 0;

/* One configuration: every claim of the file header on it. */
static void one_case(int64_t C, int64_t W, int silu, int with_prefix, int wbf16, int specials, uint64_t seed) {
    static const int64_t lens[] = {1, 70, 0, 5, 130, 2};
    const size_t nl = sizeof lens / sizeof lens[0];
    prob pk = {
        .packed = 1, .C = C, .W = W, .silu = silu, .with_prefix = with_prefix, .wbf16 = wbf16, .specials = specials};
    prob pd = pk;
    pd.packed = 0;
    pk.L = layout_of(lens, nl, MASKPACK_PLACE_PACKED);
    pd.L = layout_of(lens, nl, MASKPACK_PLACE_RIGHT);
    if (!pk.L || !pd.L) return;
    fill(&pk, seed);
    fill(&pd, seed);
    const int avx2 = mp_cpu_has_avx2();
    const maskpack_isa vec = avx2 ? MASKPACK_ISA_AVX2 : MASKPACK_ISA_REF;
    outs a, f, p, t3, au, ref;
    run(&pk, 1, vec, 1, &a);
    run(&pk, 0, vec, 1, &f);
    run(&pd, 1, vec, 2, &p);
    run(&pk, 1, vec, 3, &t3);
    run(&pk, 1, MASKPACK_ISA_AUTO, 2, &au);
    run(&pk, 1, MASKPACK_ISA_REF, 1, &ref);
    CHECK(!a.s && !f.s && !p.s && !t3.s && !au.s && !ref.s);
    if (!a.s && !f.s && !p.s && !t3.s && !au.s && !ref.s) {
        /* the claim: bf16 = the f32 kernel on the widened inputs, rounded, bit for bit */
        CHECK(same_bits(&pk, &a, &f));
        CHECK(packed_eq_padded(&pk, &a, &pd, &p));
        CHECK(same_bits(&pk, &a, &t3));
        CHECK(same_bits(&pk, &a, &au)); /* AUTO runs the vector rows for bf16 */
        if (mp_cpu_has_avx512()) {
            outs x5;
            run(&pk, 1, MASKPACK_ISA_AVX512, 2, &x5);
            CHECK(!x5.s && same_bits(&pk, &a, &x5));
            unrun(&x5);
        }
        /* the portable loops' bf16 bits stay their own: the same claims for them */
        outs rf, rp;
        run(&pk, 0, MASKPACK_ISA_REF, 1, &rf);
        run(&pd, 1, MASKPACK_ISA_REF, 3, &rp);
        CHECK(!rf.s && same_bits(&pk, &ref, &rf));
        CHECK(!rp.s && packed_eq_padded(&pk, &ref, &pd, &rp));
        unrun(&rf), unrun(&rp);
        if (!specials) {
            CHECK(vs_reference(&pk, &a, &worst_vec));
            CHECK(vs_reference(&pk, &ref, &worst_ref));
        }
    }
    unrun(&a), unrun(&f), unrun(&p), unrun(&t3), unrun(&au), unrun(&ref);
    unfill(&pk), unfill(&pd);
    maskpack_layout_free(pk.L), maskpack_layout_free(pd.L);
    n_cases++;
}

static void test_cases(void) {
    static const int64_t Cs[] = {8, 24, 70, 131};
    uint64_t seed = 1;
    for (size_t ci = 0; ci < 4; ci++)
        for (int64_t W = 1; W <= W_MAX; W++)
            for (int silu = 0; silu < 2; silu++)
                for (int pre = 0; pre < 2; pre++)
                    for (int wb = 0; wb < 2; wb++) one_case(Cs[ci], W, silu, pre, wb, 0, seed++);
    /* special values: W = 1 with the weight 1 + 2^-8 (ties, overflow), and W = 3 */
    for (int silu = 0; silu < 2; silu++) {
        one_case(37, 1, silu, 0, 0, 1, 900 + (uint64_t)silu);
        one_case(70, 3, silu, 1, 0, 1, 910 + (uint64_t)silu);
    }
    printf("test_conv_bf16: %d cases; worst |error| / bound vs the double conv: vector rows %.3f, portable loops "
           "%.3f\n",
           n_cases, worst_vec, worst_ref);
}

/* What the table says and what is refused. */
static void test_dispatch(void) {
    maskpack_error e;
    unsetenv("MASKPACK_ISA");
    /* the conv's vector entry lists bf16, and AUTO resolves bf16 as f32 (the vector rows) */
    size_t n = 0;
    CHECK_OK(maskpack_kernel_list(NULL, 0, &n, &e), e);
    maskpack_kernel_info *info = calloc(n, sizeof *info);
    CHECK_OK(maskpack_kernel_list(info, n, &n, &e), e);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        if (info[i].family == MASKPACK_KERNEL_CONV && info[i].isa == MASKPACK_ISA_AVX2) {
            found = 1;
            CHECK(info[i].dtypes & (1u << MASKPACK_BF16));
            CHECK(info[i].dtypes & (1u << MASKPACK_F32));
        }
    CHECK(found);
    free(info);
    maskpack_isa rb = MASKPACK_ISA_REF, rf = MASKPACK_ISA_REF;
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_CONV, MASKPACK_BF16, MASKPACK_ISA_AUTO, &rb, &e), e);
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_CONV, MASKPACK_F32, MASKPACK_ISA_AUTO, &rf, &e), e);
    CHECK(rb == rf);
    if (mp_cpu_has_avx2()) CHECK(rb == MASKPACK_ISA_AVX2);
    /* an ISA this CPU lacks, forced: refused for bf16 as for f32, never run on something else */
    static const int64_t lens[] = {9, 3};
    prob P = {.packed = 1, .C = 16, .W = 4, .silu = 1, .with_prefix = 1};
    P.L = layout_of(lens, 2, MASKPACK_PLACE_PACKED);
    fill(&P, 77);
    const struct {
        maskpack_isa isa;
        int has;
    } forced[] = {{MASKPACK_ISA_AVX2, mp_cpu_has_avx2()},
                  {MASKPACK_ISA_AVX512, mp_cpu_has_avx512()},
                  {MASKPACK_ISA_AVX512_BF16, mp_cpu_has_avx512() && mp_cpu_has_avx512bf16()},
                  {MASKPACK_ISA_AMX, mp_cpu_has_amx()}};
    int refused = 0;
    for (int i = 0; i < 4; i++)
        for (int bf = 0; bf < 2; bf++) {
            outs o;
            run(&P, bf, forced[i].isa, 1, &o);
            CHECK_EQ(o.s, forced[i].has ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED);
            refused += !forced[i].has;
            unrun(&o);
        }
    /* and through MASKPACK_ISA */
    if (!mp_cpu_has_amx()) {
        setenv("MASKPACK_ISA", "amx", 1);
        outs o;
        run(&P, 1, MASKPACK_ISA_AUTO, 1, &o);
        CHECK_EQ(o.s, MASKPACK_ERR_UNSUPPORTED);
        unrun(&o);
        unsetenv("MASKPACK_ISA");
    }
    printf("test_conv_bf16: AUTO resolves bf16 to %s; %d forced (ISA, dtype) runs refused on this CPU\n",
           maskpack_isa_name(rb), refused);
    unfill(&P);
    maskpack_layout_free(P.L);
}

/* ---- context parallelism --------------------------------------------------------------------- */

typedef struct cp_rank_job {
    const prob *P;
    local_hub *hub;
    int rank, n;
    float *y, *dx, *state, *dw, *dpre; /* this rank's rows; dweight, d_prefix: its shares */
    int64_t tl, *idx;
    int64_t bad;
} cp_rank_job;

/* One rank: its zigzag shard of the widened x and dy, the CP conv forward and backward on them
 * (the CP conv takes f32 tensors: a bf16 model widens its shard for it). */
static void *cp_rank(void *arg) {
    cp_rank_job *R = arg;
    const prob *P = R->P;
    const int64_t C = P->C, W = P->W, N = P->N, tl = P->T / R->n;
    local_rank lr = {R->hub, R->rank};
    maskpack_comm comm = local_comm(&lr);
    maskpack_error e;
    R->tl = tl;
    R->idx = malloc((size_t)tl * sizeof(int64_t));
    maskpack_tensor ti = maskpack_tensor_contiguous(R->idx, MASKPACK_I64, 1, &tl);
    R->bad += maskpack_cp_shard_indices(P->L, R->n, R->rank, MASKPACK_CP_ZIGZAG, &ti, &e) != MASKPACK_OK;
    float *x = malloc((size_t)(tl * C) * 4), *dy = malloc((size_t)(tl * C) * 4);
    for (int64_t i = 0; i < tl; i++) {
        memcpy(x + i * C, P->xf + R->idx[i] * C, (size_t)C * 4);
        memcpy(dy + i * C, P->dyf + R->idx[i] * C, (size_t)C * 4);
    }
    R->y = calloc((size_t)(tl * C), 4), R->dx = calloc((size_t)(tl * C), 4);
    R->state = calloc((size_t)(N * C * (W - 1)), 4);
    R->dw = calloc((size_t)(C * W), 4), R->dpre = calloc((size_t)(N * C * (W - 1)), 4);
    int64_t sx[2] = {tl, C}, sw[2] = {C, W}, sp[3] = {N, C, W - 1};
    maskpack_tensor ux = maskpack_tensor_contiguous(x, MASKPACK_F32, 2, sx),
                    udy = maskpack_tensor_contiguous(dy, MASKPACK_F32, 2, sx);
    maskpack_tensor uw = maskpack_tensor_contiguous(P->wf, MASKPACK_F32, 2, sw);
    maskpack_tensor up = maskpack_tensor_contiguous(P->pref, MASKPACK_F32, 3, sp),
                    uds = maskpack_tensor_contiguous(P->dstf, MASKPACK_F32, 3, sp);
    maskpack_tensor y = maskpack_tensor_contiguous(R->y, MASKPACK_F32, 2, sx),
                    dx = maskpack_tensor_contiguous(R->dx, MASKPACK_F32, 2, sx);
    maskpack_tensor st = maskpack_tensor_contiguous(R->state, MASKPACK_F32, 3, sp),
                    dw = maskpack_tensor_contiguous(R->dw, MASKPACK_F32, 2, sw),
                    dp = maskpack_tensor_contiguous(R->dpre, MASKPACK_F32, 3, sp);
    const maskpack_isa isa = mp_cpu_has_avx2() ? MASKPACK_ISA_AVX2 : MASKPACK_ISA_REF;
    R->bad += maskpack_cp_causal_conv1d(&comm, P->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, P->silu, OPTS_ISA(1, isa), &y,
                                        &st, &e) != MASKPACK_OK;
    R->bad += maskpack_cp_causal_conv1d_backward(&comm, P->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, P->silu, &udy, &uds,
                                                 OPTS_ISA(1, isa), &dx, &dw, &dp, &e) != MASKPACK_OK;
    free(x), free(dy);
    return NULL;
}

/* The CP conv (2 ranks as threads, zigzag shards) on the widened inputs against the single-process
 * bf16 call: y and the state are bit for bit its (rounded), dx within one bf16 ulp (a rank adds the
 * halo's terms in another order), the dweight and d_prefix shares sum to its. */
static void test_cp(void) {
    static const int64_t lens[] = {8, 40, 24, 4};
    for (int wb = 0; wb < 2; wb++) {
        prob P = {.packed = 1, .C = 70, .W = 4, .silu = 1, .with_prefix = 1, .wbf16 = wb};
        P.L = layout_of(lens, 4, MASKPACK_PLACE_PACKED);
        if (!P.L) return;
        fill(&P, 300 + (uint64_t)wb);
        outs full;
        run(&P, 1, mp_cpu_has_avx2() ? MASKPACK_ISA_AVX2 : MASKPACK_ISA_REF, 1, &full);
        CHECK(!full.s);
        enum { NR = 2 };
        local_hub hub;
        local_hub_init(&hub, NR);
        cp_rank_job R[NR];
        pthread_t th[NR];
        for (int r = 0; r < NR; r++) {
            R[r] = (cp_rank_job){.P = &P, .hub = &hub, .rank = r, .n = NR};
            pthread_create(&th[r], NULL, cp_rank, &R[r]);
        }
        for (int r = 0; r < NR; r++) pthread_join(th[r], NULL);
        local_hub_destroy(&hub);
        const int64_t C = P.C, W = P.W, ns = P.N * C * (W - 1);
        int64_t y_diff = 0, dx_far = 0, st_diff = 0, dp_far = 0;
        double dw_err = 0, dw_max = 0;
        for (int r = 0; r < NR; r++) {
            CHECK_EQ(R[r].bad, 0);
            for (int64_t i = 0; i < R[r].tl; i++)
                for (int64_t c = 0; c < C; c++) {
                    const int64_t g = R[r].idx[i] * C + c;
                    y_diff += mp_f32_to_bf16(R[r].y[i * C + c]) != ((const uint16_t *)full.y)[g];
                    /* one bf16 ulp: 2^-7 of the magnitude (8 significant bits) */
                    const double a = f_of(mp_f32_to_bf16(R[r].dx[i * C + c]));
                    const double b = f_of(((const uint16_t *)full.dx)[g]);
                    dx_far += fabs(a - b) > ldexp(fabs(b), -7);
                }
            for (int64_t i = 0; i < ns; i++)
                st_diff += mp_f32_to_bf16(R[r].state[i]) != ((const uint16_t *)full.state)[i];
        }
        for (int64_t i = 0; i < C * W; i++) {
            const double sum = (double)R[0].dw[i] + (double)R[1].dw[i];
            dw_err = fmax(dw_err, fabs(sum - full.dw[i])), dw_max = fmax(dw_max, fabs(full.dw[i]));
        }
        for (int64_t i = 0; i < ns; i++) {
            const double a = f_of(mp_f32_to_bf16(R[0].dpre[i] + R[1].dpre[i])),
                         b = f_of(((const uint16_t *)full.dpre)[i]);
            dp_far += fabs(a - b) > ldexp(fabs(b), -7);
        }
        CHECK_EQ(y_diff, 0);
        CHECK_EQ(st_diff, 0);
        CHECK_EQ(dx_far, 0);
        CHECK_EQ(dp_far, 0);
        CHECK(dw_err <= 1e-5 * (dw_max + 1));
        printf("test_conv_bf16: CP conv (2 ranks, %s weights) on the widened shards: y, state = the bf16 call's "
               "rounded bits; dx, d_prefix within 1 bf16 ulp; dweight shares sum %.1e off\n",
               wb ? "bf16" : "f32", dw_err);
        for (int r = 0; r < NR; r++)
            free(R[r].y), free(R[r].dx), free(R[r].state), free(R[r].dw), free(R[r].dpre), free(R[r].idx);
        unrun(&full);
        unfill(&P);
        maskpack_layout_free(P.L);
    }
}

int main(void) {
    test_cases();
    test_dispatch();
    test_cp();
    return check_report("test_conv_bf16");
}
