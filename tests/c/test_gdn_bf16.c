/* test_gdn_bf16.c: the rule's bf16 kernels, AVX512-BF16 (src/kernels/gdn/gdn_avx512bf16.c) and AMX
 * (src/kernels/gdn/gdn_amx.c), whose chunk products take bf16 operands with f32 accumulation (on
 * VDPBF16PS, or on the AMX tiles with TDPBF16PS; the packing and the driver are shared,
 * gdn_bf16_gemm.h), each where the CPU (or the emulated build) runs it:
 *  - its product primitive against exact products of the bf16-rounded operands (every flag);
 *  - forward and backward (o, final state, dq, dk, dv, dg, dbeta, d initial state) against the f32
 *    reference kernel on the same bf16 inputs, within bounds derived from the operand rounding;
 *  - padded == packed == packed rows, 1 thread == 3, the operator == the plain call, bitwise;
 *  - the AMX kernel == the AVX512-BF16 kernel bitwise, products and rule (the same pairs summed
 *    from 0 in the same order, pair by pair, even product first: gdn_bf16_gemm.h; what the
 *    emulation, src/kernels/isa/simde_amx.h, carries out for both instructions): asserted in the
 *    emulated build, reported on hardware (AMX_EQ_BF16_ASSERTED);
 *  - dispatch: asked for by name (isa or MASKPACK_ISA) each runs bf16 inputs where the CPU has its
 *    features, f32 or mixed inputs on the f32 kernel; AUTO runs bf16 inputs on the AMX kernel where
 *    the CPU has AMX, else on the f32 kernel (converted on load: the AVX512-BF16 kernel is the
 *    slower one where measured, see gdn_api.c), never on the AVX512-BF16 one, and the query says
 *    which; without AVX512-BF16 a forced avx512_bf16 (argument or MASKPACK_ISA) is an error naming
 *    the missing feature, and without AMX a forced amx.
 * Built plainly, and against the emulated libraries of tests/c/meson.build (AVX-512 by SIMDe with
 * AVX512-BF16 and AMX reported absent; and with AVX512-BF16 and AMX carried out by
 * src/kernels/isa/simde_amx.h). */
#include "check.h"
#include "cpu_features.h"
#include "internal.h"

#include "../../src/kernels/gdn/gdn_internal.h"

#include <math.h>
#include <stdlib.h>

/* ---- data ------------------------------------------------------------------------------------ */

static uint64_t rs = 0x1234567;
static double urand(void) { /* [-1, 1) */
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) / 4503599627370496.0 - 1.0;
}

static float bfr(float x) { return mp_bf16_to_f32(mp_f32_to_bf16(x)); }

/* ---- the product primitive ------------------------------------------------------------------- */

/* C op= alpha A B with A, B rounded to bf16, against the same product in double of the rounded
 * operands. Each product of two bf16 is exact in f32, so the kernel's only error is the f32
 * accumulation of kd + 1 terms (and the epilogue's alpha, cs Cin): bounded by
 * (kd + 3) 2^-24 (|alpha| sum |a b| + |cs Cin|), the standard bound of a sum of kd + 3 terms. */
/* Whether the AMX kernel must equal the AVX512-BF16 one bit for bit: in the emulated build
 * (GDN_BF16_EMULATED_AMX, tests/c/meson.build), where simde_amx.h carries out TDPBF16PS and VDPBF16PS
 * with the same per-pair order and roundings, it must. On hardware the two instructions' internal
 * accumulation (the instruction set reference leaves the order within a pair and intermediate
 * precision to the implementation) may round the last bit otherwise, and no AMX CPU has run this
 * yet: there the comparison is reported, not asserted; both stay held to the bounds. */
#ifdef GDN_BF16_EMULATED_AMX
#define AMX_EQ_BF16_ASSERTED 1
#else
#define AMX_EQ_BF16_ASSERTED 0
#endif

typedef void (*gemm_x_fn)(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                          int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);

/* whether asking for isa runs bf16 inputs on that bf16 kernel here */
static int has_kernel(maskpack_isa isa) {
    maskpack_isa r = MASKPACK_ISA_REF;
    maskpack_error e;
    return maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, isa, &r, &e) == MASKPACK_OK && r == isa;
}

/* (m, n, kd, flags, alpha, cs) -> the case's C from gemm (the AVX512-BF16 or AMX product) checked as
 * above; *out (when not NULL) gets C (m rows of ldc = n + 16), for the bitwise comparison of the
 * two products. */
static void test_gemm_case(gemm_x_fn gemm, int64_t m, int64_t n, int64_t kd, unsigned flags, float alpha, float cs,
                           float **out) {
    const int at = (flags & GDN_GEMM_AT) != 0;
    const int64_t lda = (at ? m : kd) + 3, ldb = n + 16, ldc = n + 16;
    float *A = malloc((size_t)((at ? kd : m) * lda) * 4), *B = malloc((size_t)(kd * ldb) * 4);
    float *C = malloc((size_t)(m * ldc) * 4), *C0 = malloc((size_t)(m * ldc) * 4);
    for (int64_t i = 0; i < (at ? kd : m) * lda; i++) A[i] = (float)urand();
    for (int64_t i = 0; i < kd * ldb; i++) B[i] = (float)urand() * 3.0f;
    for (int64_t i = 0; i < m * ldc; i++) C[i] = C0[i] = (float)urand();
    /* the triangular flags promise zeros in A: give them */
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < kd; k++) {
            const int zero = ((flags & GDN_GEMM_TRI_LO) && k > i) || ((flags & GDN_GEMM_TRI_UP) && k < i);
            if (zero) A[at ? k * lda + i : i * lda + k] = 0.0f;
        }
    gdn_pf pf;
    memset(&pf, 0, sizeof pf);
    gemm(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, &pf, C, cs);
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            if ((flags & GDN_GEMM_TRI_OUT) && j > i) continue;
            double s = 0, sa = 0;
            for (int64_t k = 0; k < kd; k++) {
                const double a = bfr(A[at ? k * lda + i : i * lda + k]), b = bfr(B[k * ldb + j]);
                s += a * b;
                sa += fabs(a * b);
            }
            const double cin = (flags & GDN_GEMM_ACC) ? (double)cs * C0[i * ldc + j] : 0.0;
            const double want = alpha * s + cin;
            const double tol = (double)(kd + 3) * ldexp(1.0, -24) * (fabs(alpha) * sa + fabs(cin)) + 1e-30;
            if (fabs(C[i * ldc + j] - want) > tol) bad++;
        }
    CHECK(bad == 0);
    if (bad)
        fprintf(stderr, "test_gdn_bf16: gemm m %lld n %lld kd %lld flags %u: %d entries off\n", (long long)m,
                (long long)n, (long long)kd, flags, bad);
    free(A), free(B), free(C0);
    if (out)
        *out = C;
    else
        free(C);
}

/* Every flag on shapes that end mid-block, mid-tile and mid-pair; the AMX product (where it runs)
 * against the same bound and against the AVX512-BF16 product bitwise (the data draw repeats per
 * product: rs is restored). Only the entries a product must write are compared (TRI_OUT: j <= i). */
static void test_gemm(void) {
    const int64_t shapes[][3] = {{1, 16, 1},    {7, 16, 5},   {8, 32, 64},     {63, 64, 63},
                                 {64, 64, 128}, {65, 48, 33}, {128, 128, 128}, {128, 256, 64},
                                 {24, 80, 17},  {40, 48, 40}, {17, 16, 95},    {33, 96, 31}};
    const int amx = has_kernel(MASKPACK_ISA_AMX);
    const unsigned fl[] = {0,
                           GDN_GEMM_ACC,
                           GDN_GEMM_AT,
                           GDN_GEMM_ACC | GDN_GEMM_AT,
                           GDN_GEMM_TRI_OUT,
                           GDN_GEMM_TRI_LO,
                           GDN_GEMM_ACC | GDN_GEMM_TRI_LO,
                           GDN_GEMM_AT | GDN_GEMM_TRI_UP,
                           GDN_GEMM_ACC | GDN_GEMM_AT | GDN_GEMM_TRI_UP};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t f = 0; f < sizeof fl / sizeof fl[0]; f++) {
            const unsigned tri = fl[f] & (GDN_GEMM_TRI_LO | GDN_GEMM_TRI_UP);
            /* the triangular forms are the chunk's square products: kd = m */
            const int64_t m = shapes[s][0], n = shapes[s][1], kd = tri ? m : shapes[s][2];
            const float alpha = f % 2 ? -1.0f : 0.75f, cs = f % 3 ? 1.0f : 0.5f;
            const uint64_t seed = rs;
            float *c1 = NULL, *c2 = NULL;
            test_gemm_case(gdn_gemm_x_avx512bf16, m, n, kd, fl[f], alpha, cs, &c1);
            if (amx) {
                rs = seed;
                test_gemm_case(gdn_gemm_x_amx, m, n, kd, fl[f], alpha, cs, &c2);
                int diff = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++)
                        if (!((fl[f] & GDN_GEMM_TRI_OUT) && j > i))
                            diff += memcmp(&c1[i * (n + 16) + j], &c2[i * (n + 16) + j], 4) != 0;
                if (AMX_EQ_BF16_ASSERTED) CHECK(diff == 0);
                if (diff)
                    fprintf(stderr, "test_gdn_bf16: amx gemm m %lld n %lld kd %lld flags %u: %d entries differ\n",
                            (long long)m, (long long)n, (long long)kd, fl[f], diff);
            }
            free(c1), free(c2);
        }
    /* the plain wrapper (no packing area: allocated per call) */
    float A[16 * 4], B[4 * 16], C[16 * 16];
    for (int i = 0; i < 64; i++) A[i] = B[i] = (float)(i % 7) - 3.0f; /* bf16-exact: exact result */
    for (int w = 0; w < 1 + amx; w++) {
        (w ? gdn_gemm_amx : gdn_gemm_avx512bf16)(16, 16, 4, 1.0f, A, 4, B, 16, C, 16, 0);
        int bad = 0;
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                float s = 0;
                for (int k = 0; k < 4; k++) s += A[i * 4 + k] * B[k * 16 + j];
                bad += C[i * 16 + j] != s;
            }
        CHECK(bad == 0);
    }
}

/* ---- the rule ---------------------------------------------------------------------------------- */

typedef struct problem {
    maskpack_layout *L;
    int64_t H, HV, K, V, T, N;
    uint16_t *q, *k, *v, *g, *beta, *dO; /* bf16, token-major over the layout's grid */
    float *h0, *dht;                     /* f32 [N, HV, K, V] */
} problem;

/* [B,S,heads,dim] or [T,heads,dim] (dim 0: none) over buf */
static maskpack_tensor tok(const maskpack_layout *L, void *buf, maskpack_dtype dt, int64_t heads, int64_t dim) {
    int64_t s[4], n = 0;
    if (!maskpack_layout_is_packed(L)) s[n++] = maskpack_layout_n_rows(L);
    s[n++] = maskpack_layout_q_width(L);
    s[n++] = heads;
    if (dim) s[n++] = dim;
    return maskpack_tensor_contiguous(buf, dt, (int32_t)n, s);
}

/* value of tensor `which` for (segment, position, j): the same for every layout of the lengths */
static float val(int which, int64_t seg, int64_t pos, int64_t j) {
    uint64_t x = (uint64_t)which * 0x9e3779b97f4a7c15ull ^ (uint64_t)seg * 0xbf58476d1ce4e5b9ull ^
                 (uint64_t)pos * 0x94d049bb133111ebull ^ (uint64_t)j * 0x2545f4914f6cdd1dull;
    x ^= x >> 31;
    x *= 0xd6e8feb86e2aa9c5ull;
    x ^= x >> 29;
    const double u = (double)(x >> 11) / 9007199254740992.0; /* [0, 1) */
    switch (which) {
    case 3: return (float)(-0.02 - 0.2 * u);   /* g: log decays in (-0.22, -0.02] */
    case 4: return (float)(0.2 + 0.7 * u);     /* beta */
    default: return (float)(2.0 * u - 1.0);    /* q, k, v, dO */
    }
}

static uint16_t *fill(const maskpack_layout *L, int which, int64_t per) {
    const int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L);
    uint16_t *p = malloc((size_t)(B * S * per + 1) * 2);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            const int64_t seg = maskpack_segment_of_query(L, b, s);
            uint16_t *r = p + (b * S + s) * per;
            if (seg < 0) {
                for (int64_t j = 0; j < per; j++) r[j] = (j & 1) ? 0x7fc0 : 0x7f80; /* NaN, Inf pads */
                continue;
            }
            maskpack_segment g;
            maskpack_layout_segment(L, (size_t)seg, &g, NULL);
            for (int64_t j = 0; j < per; j++) r[j] = mp_f32_to_bf16(val(which, seg, s - g.q_start, j));
        }
    return p;
}

static problem make(const int64_t *lens, size_t nl, maskpack_placement pl, int64_t cap, int64_t H, int64_t HV,
                    int64_t K, int64_t V) {
    problem P;
    memset(&P, 0, sizeof P);
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(lens, nl, pl, cap, NULL, &P.L, &e), e);
    P.H = H, P.HV = HV, P.K = K, P.V = V;
    P.T = maskpack_layout_n_rows(P.L) * maskpack_layout_q_width(P.L);
    P.N = (int64_t)maskpack_layout_n_segments(P.L);
    P.q = fill(P.L, 0, H * K);
    P.k = fill(P.L, 1, H * K);
    P.v = fill(P.L, 2, HV * V);
    P.g = fill(P.L, 3, HV);
    P.beta = fill(P.L, 4, HV);
    P.dO = fill(P.L, 5, HV * V);
    const int64_t ns = P.N * HV * K * V;
    P.h0 = malloc((size_t)ns * 4);
    P.dht = malloc((size_t)ns * 4);
    for (int64_t i = 0; i < ns; i++) {
        P.h0[i] = 0.3f * val(6, i / (HV * K * V), 0, i % (HV * K * V));
        P.dht[i] = 0.3f * val(7, i / (HV * K * V), 0, i % (HV * K * V));
    }
    return P;
}

static void unmake(problem *P) {
    free(P->q), free(P->k), free(P->v), free(P->g), free(P->beta), free(P->dO), free(P->h0), free(P->dht);
    maskpack_layout_free(P->L);
}

/* one run's outputs: o, dq, dk, dv, dg, dbeta token-major (f32 or bf16), ht, dh0 f32 */
enum { O_O, O_DQ, O_DK, O_DV, O_DG, O_DB, O_HT, O_DH0, N_OUT };
typedef struct outs {
    void *x[N_OUT];
    int64_t per[N_OUT]; /* per token (states: per segment) */
    maskpack_dtype dt;
} outs;

static const char *const ONAME[N_OUT] = {"o", "dq", "dk", "dv", "dg", "dbeta", "ht", "dh0"};

/* Forward (chunked) and backward of P with `isa` and `threads`; token outputs in dtype dt. op:
 * through the operator object instead of the plain calls. Returns the status of the first failure. */
static maskpack_status run(const problem *P, maskpack_isa isa, int threads, maskpack_dtype dt, int op, outs *R,
                           maskpack_error *e) {
    const int64_t per[N_OUT] = {P->HV * P->V, P->H * P->K, P->H * P->K, P->HV * P->V,
                                P->HV,        P->HV,       P->HV * P->K * P->V, P->HV * P->K * P->V};
    memset(R, 0, sizeof *R);
    R->dt = dt;
    for (int i = 0; i < N_OUT; i++) {
        R->per[i] = per[i];
        const int64_t rows = i >= O_HT ? P->N : P->T;
        R->x[i] = calloc((size_t)(rows * per[i] + 1), i >= O_HT || dt == MASKPACK_F32 ? 4 : 2);
    }
    const maskpack_layout *L = P->L;
    maskpack_tensor tq = tok(L, P->q, MASKPACK_BF16, P->H, P->K), tk = tok(L, P->k, MASKPACK_BF16, P->H, P->K);
    maskpack_tensor tv = tok(L, P->v, MASKPACK_BF16, P->HV, P->V), tg = tok(L, P->g, MASKPACK_BF16, P->HV, 0);
    maskpack_tensor tb = tok(L, P->beta, MASKPACK_BF16, P->HV, 0), tdo = tok(L, P->dO, MASKPACK_BF16, P->HV, P->V);
    int64_t ss[4] = {P->N, P->HV, P->K, P->V};
    maskpack_tensor th0 = maskpack_tensor_contiguous(P->h0, MASKPACK_F32, 4, ss);
    maskpack_tensor tdht = maskpack_tensor_contiguous(P->dht, MASKPACK_F32, 4, ss);
    maskpack_tensor to = tok(L, R->x[O_O], dt, P->HV, P->V), tdq = tok(L, R->x[O_DQ], dt, P->H, P->K);
    maskpack_tensor tdk = tok(L, R->x[O_DK], dt, P->H, P->K), tdv = tok(L, R->x[O_DV], dt, P->HV, P->V);
    maskpack_tensor tdg = tok(L, R->x[O_DG], dt, P->HV, 0), tdb = tok(L, R->x[O_DB], dt, P->HV, 0);
    maskpack_tensor tht = maskpack_tensor_contiguous(R->x[O_HT], MASKPACK_F32, 4, ss);
    maskpack_tensor tdh0 = maskpack_tensor_contiguous(R->x[O_DH0], MASKPACK_F32, 4, ss);
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, &th0};
    maskpack_gdn_grads gr = {&tdq, &tdk, &tdv, &tdg, &tdb, &tdh0};
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.isa = isa;
    o.n_threads = threads;
    maskpack_status s;
    if (!op) {
        if ((s = maskpack_gdn_forward(L, &in, &o, &to, &tht, NULL, 0, e))) return s;
        return maskpack_gdn_backward(L, &in, &tdo, &tdht, &o, &gr, NULL, 0, e);
    }
    maskpack_gdn_op *g = NULL;
    if ((s = maskpack_gdn_op_create(L, P->H, P->HV, P->K, P->V, &o, &g, e))) return s;
    s = maskpack_gdn_op_forward(g, &in, &to, &tht, NULL, NULL, 0, e);
    if (!s) s = maskpack_gdn_op_backward(g, &in, &tdo, &tdht, &gr, NULL, NULL, 0, e);
    maskpack_gdn_op_free(g);
    return s;
}

static void unrun(outs *R) {
    for (int i = 0; i < N_OUT; i++) free(R->x[i]);
}

static double at(const outs *R, int i, int64_t idx) {
    if (i >= O_HT || R->dt == MASKPACK_F32) return ((const float *)R->x[i])[idx];
    return mp_bf16_to_f32(((const uint16_t *)R->x[i])[idx]);
}

/* Output i of token (seg, pos) starts at this element index. */
static int64_t tok_index(const problem *P, const outs *R, int i, size_t seg, int64_t pos) {
    maskpack_segment g;
    maskpack_layout_segment(P->L, seg, &g, NULL);
    return (g.row * maskpack_layout_q_width(P->L) + g.q_start + pos) * R->per[i];
}

/* Output i of A and B (each over its own problem's layout, the same lengths), real tokens only:
 * *rel = rms(A - B) / rms(B), *mx = max |A - B| / rms(B); returns whether every bit is equal. */
static int compare(const problem *PA, const outs *A, const problem *PB, const outs *B, int i, double *rel,
                   double *mx) {
    double se = 0, sr = 0, worst = 0;
    int64_t cnt = 0;
    int same = 1;
    if (i >= O_HT) {
        const int64_t n = PA->N * A->per[i];
        for (int64_t j = 0; j < n; j++) {
            const double a = at(A, i, j), b = at(B, i, j);
            same &= memcmp((const float *)A->x[i] + j, (const float *)B->x[i] + j, 4) == 0;
            se += (a - b) * (a - b), sr += b * b, cnt++;
            worst = fmax(worst, fabs(a - b));
        }
    } else {
        for (size_t s = 0; s < (size_t)PA->N; s++) {
            maskpack_segment g;
            maskpack_layout_segment(PA->L, s, &g, NULL);
            for (int64_t p = 0; p < g.q_len; p++) {
                const int64_t ia = tok_index(PA, A, i, s, p), ib = tok_index(PB, B, i, s, p);
                const size_t es = A->dt == MASKPACK_F32 ? 4 : 2;
                same &= memcmp((const char *)A->x[i] + (size_t)ia * es, (const char *)B->x[i] + (size_t)ib * es,
                               (size_t)A->per[i] * es) == 0;
                for (int64_t j = 0; j < A->per[i]; j++) {
                    const double a = at(A, i, ia + j), b = at(B, i, ib + j);
                    se += (a - b) * (a - b), sr += b * b, cnt++;
                    worst = fmax(worst, fabs(a - b));
                }
            }
        }
    }
    const double rms = cnt ? sqrt(sr / (double)cnt) : 0;
    *rel = rms > 0 ? sqrt(se / (double)cnt) / rms : sqrt(se);
    *mx = rms > 0 ? worst / rms : worst;
    return same;
}

/* every pad element of the token outputs is +0 */
static int pads_zero(const problem *P, const outs *R) {
    const int64_t B = maskpack_layout_n_rows(P->L), S = maskpack_layout_q_width(P->L);
    const size_t es = R->dt == MASKPACK_F32 ? 4 : 2;
    for (int i = 0; i < O_HT; i++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                if (maskpack_segment_of_query(P->L, b, s) < 0) {
                    const unsigned char *p = (const unsigned char *)R->x[i] + (size_t)((b * S + s) * R->per[i]) * es;
                    for (size_t j = 0; j < (size_t)R->per[i] * es; j++)
                        if (p[j]) return 0;
                }
    return 1;
}

/* whether asking for avx512_bf16 runs bf16 inputs on the bf16 kernel here */
static int has_bf16_kernel(void) { return has_kernel(MASKPACK_ISA_AVX512_BF16); }

/* the f32 kernel AUTO runs (and runs bf16 inputs on, converted, where there is no AMX) */
static maskpack_isa auto_f32(void) {
    maskpack_isa r = MASKPACK_ISA_REF;
    maskpack_error e;
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e), e);
    return r;
}

/* the kernel AUTO should run bf16 inputs on: the AMX one where the CPU has AMX (the tiles' rate),
 * else the f32 one AUTO runs f32 inputs on (never the AVX512-BF16 one: slower where measured) */
static maskpack_isa auto_bf16_expected(void) {
    return mp_cpu_has_avx512() && mp_cpu_has_amx() ? MASKPACK_ISA_AMX : auto_f32();
}

/* Tolerances against the f32 reference, as rms(error) / rms(reference) per output.
 *
 * The kernel's only departures from the f32 one are the roundings of the products' operands to
 * bf16 (relative error at most u = 2^-9 each, to nearest even; the f32 accumulation is as in the
 * f32 kernel). A product of two rounded operands perturbs each of its terms a_k b_k by a factor
 * (1 + d1)(1 + d2), |d1|, |d2| <= u, i.e. by at most 2u relative; with independent roundings
 * of either sign the rms perturbation of a term is sqrt(2/3) u (d uniform on [-u, u]) and a
 * sum of such terms over mixed signs keeps that relative rms. An output is the end of a chain of
 * at most D such products: forward D = 4 (K S -> Y, A Y = Dv, P Dv and Q S -> o; the state
 * update K^T Dv -> S'), backward D = 8 (its products run through dDv, dBm, dL, dQK/dKK
 * and through dS', each of the forward's on the way). Independent perturbations over D levels
 * add in quadrature: sqrt(D) sqrt(2/3) u. The state carries a chunk's error into the next chunks,
 * each chunk adding its own while the gates decay the older ones by at least exp(C g_max) with
 * g_max = -0.02 (the data's): at most 1 / (1 - exp(-0.02 * 64)) = 1.39 times one chunk's. And the
 * triangular inverse (I + L)^-1 amplifies a relative perturbation of L by at most its condition,
 * here (unit-norm keys, beta < 0.9, decays < 1) bounded by a factor 2. So the rms bound is
 *   2 * 1.39 * sqrt(D) * sqrt(2/3) u    (D = 4: 8.9e-3; D = 8: 1.25e-2)
 * for the f32 outputs; bf16 outputs add their own rounding (u / sqrt(3) rms: 1.1e-3), included
 * in the bound for them. */
static double bound(int i, int bf16_out) {
    const double u = ldexp(1.0, -9), base = 2.0 * 1.39 * sqrt(2.0 / 3.0) * u;
    const int fwd = i == O_O || i == O_HT;
    double b = base * sqrt(fwd ? 4.0 : 8.0);
    if (bf16_out && i < O_HT) b += u / sqrt(3.0);
    return b;
}

/* The bf16 kernel isa (AVX512-BF16 or AMX) on the rule, forward (chunked) and backward; for AMX also
 * against the AVX512-BF16 kernel, bitwise (the same bf16 pairs summed in the same order). */
static void test_rule_isa(maskpack_isa isa) {
    const char *name = isa == MASKPACK_ISA_AMX ? "amx" : "avx512_bf16";
    if (!has_kernel(isa)) {
        printf("test_gdn_bf16: no %s kernel here: its kernel checks skipped (dispatch checked)\n", name);
        return;
    }
    const int64_t lens[] = {1, 63, 64, 65, 130, 200, 0, 7};
    const size_t nl = sizeof lens / sizeof lens[0];
    const struct { int64_t H, HV, K, V; } D[] = {{2, 4, 32, 48}, {1, 2, 128, 128}, {1, 1, 24, 16}};
    for (size_t d = 0; d < sizeof D / sizeof D[0]; d++) {
        problem pk = make(lens, nl, MASKPACK_PLACE_PACKED, 0, D[d].H, D[d].HV, D[d].K, D[d].V);
        problem pd = make(lens, nl, MASKPACK_PLACE_RIGHT, 0, D[d].H, D[d].HV, D[d].K, D[d].V);
        problem pr = make(lens, nl, MASKPACK_PLACE_PACKED, 256, D[d].H, D[d].HV, D[d].K, D[d].V);
        maskpack_error e;
        outs ref, bf, bfb, pad, rows, thr, opr, pad1, aut, cvt;
        CHECK_OK(run(&pk, MASKPACK_ISA_REF, 1, MASKPACK_F32, 0, &ref, &e), e);
        CHECK_OK(run(&pk, isa, 1, MASKPACK_F32, 0, &bf, &e), e);
        CHECK_OK(run(&pk, isa, 1, MASKPACK_BF16, 0, &bfb, &e), e);
        for (int i = 0; i < N_OUT; i++) {
            double rel, mx, relb, mxb;
            compare(&pk, &bf, &pk, &ref, i, &rel, &mx);
            compare(&pk, &bfb, &pk, &ref, i, &relb, &mxb);
            CHECK(rel <= bound(i, 0));
            CHECK(relb <= bound(i, 1));
            printf("test_gdn_bf16: %s H %lld HV %lld K %lld V %lld %-5s rms err %.2e (bf16 out %.2e), bound %.2e; "
                   "max %.2e\n",
                   name, (long long)D[d].H, (long long)D[d].HV, (long long)D[d].K, (long long)D[d].V, ONAME[i], rel,
                   relb, bound(i, 0), mx);
        }
        /* padded (NaN/Inf pads), packed rows, 3 threads, the operator: bitwise, f32 and bf16 outputs */
        CHECK_OK(run(&pd, isa, 1, MASKPACK_BF16, 0, &pad, &e), e);
        CHECK_OK(run(&pr, isa, 2, MASKPACK_BF16, 0, &rows, &e), e);
        CHECK_OK(run(&pk, isa, 3, MASKPACK_BF16, 0, &thr, &e), e);
        CHECK_OK(run(&pk, isa, 2, MASKPACK_BF16, 1, &opr, &e), e);
        CHECK_OK(run(&pd, isa, 1, MASKPACK_F32, 0, &pad1, &e), e);
        CHECK_OK(run(&pk, MASKPACK_ISA_AUTO, 1, MASKPACK_BF16, 0, &aut, &e), e);
        CHECK_OK(run(&pk, auto_bf16_expected(), 1, MASKPACK_BF16, 0, &cvt, &e), e);
        /* the AMX kernel against the AVX512-BF16 one, f32 and bf16 outputs */
        const int vs = isa == MASKPACK_ISA_AMX && has_bf16_kernel();
        outs vb, vb32;
        if (vs) {
            CHECK_OK(run(&pk, MASKPACK_ISA_AVX512_BF16, 1, MASKPACK_BF16, 0, &vb, &e), e);
            CHECK_OK(run(&pk, MASKPACK_ISA_AVX512_BF16, 1, MASKPACK_F32, 0, &vb32, &e), e);
        }
        for (int i = 0; i < N_OUT; i++) {
            double r, m;
            CHECK(compare(&pd, &pad, &pk, &bfb, i, &r, &m));
            CHECK(compare(&pr, &rows, &pk, &bfb, i, &r, &m));
            CHECK(compare(&pk, &thr, &pk, &bfb, i, &r, &m));
            CHECK(compare(&pk, &opr, &pk, &bfb, i, &r, &m));
            CHECK(compare(&pd, &pad1, &pk, &bf, i, &r, &m));
            CHECK(compare(&pk, &aut, &pk, &cvt, i, &r, &m)); /* AUTO runs the AMX or the f32 kernel */
            if (vs) {
                const int same = compare(&pk, &bfb, &pk, &vb, i, &r, &m) && compare(&pk, &bf, &pk, &vb32, i, &r, &m);
                if (AMX_EQ_BF16_ASSERTED) CHECK(same);
                if (!same) fprintf(stderr, "test_gdn_bf16: amx != avx512_bf16 on %s (rms %.2e)\n", ONAME[i], r);
            }
        }
        if (vs) unrun(&vb), unrun(&vb32);
        CHECK(pads_zero(&pd, &pad));
        CHECK(pads_zero(&pd, &pad1));
        CHECK(pads_zero(&pr, &rows));
        unrun(&ref), unrun(&bf), unrun(&bfb), unrun(&pad), unrun(&rows), unrun(&thr), unrun(&opr), unrun(&pad1);
        unrun(&aut), unrun(&cvt);
        unmake(&pk), unmake(&pd), unmake(&pr);
    }
}

static void test_rule(void) {
    test_rule_isa(MASKPACK_ISA_AVX512_BF16);
    test_rule_isa(MASKPACK_ISA_AMX);
}

/* Which kernel runs what, and what is refused. */
static void test_dispatch(void) {
    const int cpu_bf16 = mp_cpu_has_avx512bf16() && mp_cpu_has_avx512();
    maskpack_isa r = MASKPACK_ISA_REF;
    maskpack_error e;
    unsetenv("MASKPACK_ISA");
    const int cpu_amx = mp_cpu_has_amx() && mp_cpu_has_avx512();
    /* AUTO: bf16 inputs on the AMX kernel where the CPU has AMX, else on the f32 kernel f32 inputs
     * run; never on the AVX512-BF16 kernel; f32 inputs never on a bf16 kernel (the query says so) */
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, MASKPACK_ISA_AUTO, &r, &e), e);
    CHECK(r == (cpu_amx ? MASKPACK_ISA_AMX : auto_f32()));
    CHECK(r != MASKPACK_ISA_AVX512_BF16);
    CHECK(auto_f32() != MASKPACK_ISA_AMX && auto_f32() != MASKPACK_ISA_AVX512_BF16);
    /* by name: each bf16 kernel exactly where the CPU has its features */
    CHECK(has_bf16_kernel() == cpu_bf16);
    CHECK(has_kernel(MASKPACK_ISA_AMX) == cpu_amx);
    const int64_t lens[] = {70, 5};
    problem P = make(lens, 2, MASKPACK_PLACE_PACKED, 0, 1, 2, 16, 32);
    if (cpu_bf16) {
        /* f32 inputs asking for it run the AVX-512 kernels (test_mixed: bitwise) */
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AVX512_BF16, &r, &e), e);
        CHECK(r == MASKPACK_ISA_AVX512_BF16);
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, MASKPACK_ISA_AVX512_BF16, &r, &e), e);
        CHECK(r == MASKPACK_ISA_AVX512_BF16);
        /* an amx request runs the AMX kernel, never this one: only its own name takes it (on a CPU
         * without AMX the request itself is refused, naming AMX) */
        if (maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, MASKPACK_ISA_AMX, &r, &e) == MASKPACK_OK) {
            CHECK(cpu_amx);
            CHECK(r == MASKPACK_ISA_AMX);
        } else {
            CHECK(!cpu_amx);
            CHECK_EQ(e.status, MASKPACK_ERR_UNSUPPORTED);
            CHECK_MSG(e, "AMX");
        }
        /* MASKPACK_ISA forcing it: the same bits as asking by name, and the query says so */
        outs a, b;
        CHECK_OK(run(&P, MASKPACK_ISA_AVX512_BF16, 1, MASKPACK_BF16, 0, &a, &e), e);
        setenv("MASKPACK_ISA", "avx512_bf16", 1);
        CHECK_OK(run(&P, MASKPACK_ISA_AUTO, 1, MASKPACK_BF16, 0, &b, &e), e);
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, MASKPACK_ISA_AUTO, &r, &e), e);
        CHECK(r == MASKPACK_ISA_AVX512_BF16);
        unsetenv("MASKPACK_ISA");
        for (int i = 0; i < N_OUT; i++) {
            double rr, mm;
            CHECK(compare(&P, &a, &P, &b, i, &rr, &mm));
        }
        unrun(&a), unrun(&b);
    } else {
        /* without AVX512-BF16: bf16 inputs run the f32 kernel (converted once), the query says so */
        maskpack_isa f = MASKPACK_ISA_REF;
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &f, &e), e);
        CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, MASKPACK_ISA_AUTO, &r, &e), e);
        CHECK(r == f);
        outs a, b;
        CHECK_OK(run(&P, MASKPACK_ISA_AUTO, 1, MASKPACK_BF16, 0, &a, &e), e);
        CHECK_OK(run(&P, f, 1, MASKPACK_BF16, 0, &b, &e), e);
        for (int i = 0; i < N_OUT; i++) {
            double rr, mm;
            CHECK(compare(&P, &a, &P, &b, i, &rr, &mm));
        }
        unrun(&a), unrun(&b);
        /* forcing it is an error naming what is missing, by argument and by MASKPACK_ISA */
        CHECK_STATUS(run(&P, MASKPACK_ISA_AVX512_BF16, 1, MASKPACK_BF16, 0, &a, &e), MASKPACK_ERR_UNSUPPORTED, e);
        CHECK_MSG(e, "AVX512-BF16");
        unrun(&a);
        setenv("MASKPACK_ISA", "avx512_bf16", 1);
        CHECK_STATUS(run(&P, MASKPACK_ISA_AUTO, 1, MASKPACK_BF16, 0, &a, &e), MASKPACK_ERR_UNSUPPORTED, e);
        CHECK_MSG(e, "AVX512-BF16");
        CHECK_MSG(e, "MASKPACK_ISA");
        CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, MASKPACK_ISA_AUTO, &r, &e),
                     MASKPACK_ERR_UNSUPPORTED, e);
        unsetenv("MASKPACK_ISA");
        unrun(&a);
    }
    unmake(&P);
}

/* Mixed dtypes (q, k bf16, v f32) and f32 inputs asking for it run the f32 (AVX-512) kernels,
 * bitwise: the bf16 ones would round what the caller gave in f32. */
static void test_f32_inputs_isa(maskpack_isa isa) {
    if (!has_kernel(isa)) return;
    const int64_t lens[] = {70, 5};
    problem P = make(lens, 2, MASKPACK_PLACE_PACKED, 0, 1, 2, 16, 32);
    const maskpack_layout *L = P.L;
    const int64_t nqk = P.T * P.H * P.K, nv = P.T * P.HV * P.V, nh = P.T * P.HV;
    float *q32 = malloc((size_t)nqk * 4), *k32 = malloc((size_t)nqk * 4), *v32 = malloc((size_t)nv * 4);
    float *g32 = malloc((size_t)nh * 4), *b32 = malloc((size_t)nh * 4);
    for (int64_t i = 0; i < nqk; i++) q32[i] = mp_bf16_to_f32(P.q[i]), k32[i] = mp_bf16_to_f32(P.k[i]);
    for (int64_t i = 0; i < nv; i++) v32[i] = mp_bf16_to_f32(P.v[i]);
    for (int64_t i = 0; i < nh; i++) g32[i] = mp_bf16_to_f32(P.g[i]), b32[i] = mp_bf16_to_f32(P.beta[i]);
    for (int all = 0; all < 2; all++) {
        const maskpack_dtype dq = all ? MASKPACK_F32 : MASKPACK_BF16;
        maskpack_tensor tq = tok(L, all ? (void *)q32 : (void *)P.q, dq, P.H, P.K);
        maskpack_tensor tk = tok(L, all ? (void *)k32 : (void *)P.k, dq, P.H, P.K);
        maskpack_tensor tv = tok(L, v32, MASKPACK_F32, P.HV, P.V);
        maskpack_tensor tg = tok(L, all ? (void *)g32 : (void *)P.g, dq, P.HV, 0);
        maskpack_tensor tb = tok(L, all ? (void *)b32 : (void *)P.beta, dq, P.HV, 0);
        maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, NULL};
        float *o1 = calloc((size_t)nv, 4), *o2 = calloc((size_t)nv, 4);
        maskpack_tensor t1 = tok(L, o1, MASKPACK_F32, P.HV, P.V), t2 = tok(L, o2, MASKPACK_F32, P.HV, P.V);
        maskpack_gdn_options o = maskpack_gdn_options_default();
        maskpack_error e;
        o.isa = isa;
        CHECK_OK(maskpack_gdn_forward(L, &in, &o, &t1, NULL, NULL, 0, &e), e);
        o.isa = MASKPACK_ISA_AVX512;
        CHECK_OK(maskpack_gdn_forward(L, &in, &o, &t2, NULL, NULL, 0, &e), e);
        CHECK(memcmp(o1, o2, (size_t)nv * 4) == 0);
        free(o1), free(o2);
    }
    free(q32), free(k32), free(v32), free(g32), free(b32);
    unmake(&P);
}

static void test_f32_inputs(void) {
    test_f32_inputs_isa(MASKPACK_ISA_AVX512_BF16);
    test_f32_inputs_isa(MASKPACK_ISA_AMX);
}

/* The operator's workspace query covers both kernels (it cannot know the run's dtype): a bf16 run
 * takes a workspace of that size and refuses one byte less, as an f32 run does. */
static void test_op_workspace_isa(maskpack_isa isa) {
    const int64_t lens[] = {70, 5};
    problem P = make(lens, 2, MASKPACK_PLACE_PACKED, 0, 1, 2, 16, 32);
    maskpack_gdn_options o = maskpack_gdn_options_default();
    if (has_kernel(isa)) o.isa = isa;
    maskpack_gdn_op *g = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_gdn_op_create(P.L, P.H, P.HV, P.K, P.V, &o, &g, &e), e);
    size_t need = 0;
    CHECK_OK(maskpack_gdn_op_workspace_size(g, 0, &need, &e), e);
    maskpack_tensor tq = tok(P.L, P.q, MASKPACK_BF16, P.H, P.K), tk = tok(P.L, P.k, MASKPACK_BF16, P.H, P.K);
    maskpack_tensor tv = tok(P.L, P.v, MASKPACK_BF16, P.HV, P.V), tg = tok(P.L, P.g, MASKPACK_BF16, P.HV, 0);
    maskpack_tensor tb = tok(P.L, P.beta, MASKPACK_BF16, P.HV, 0);
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, NULL};
    uint16_t *ob = calloc((size_t)(P.T * P.HV * P.V), 2);
    maskpack_tensor to = tok(P.L, ob, MASKPACK_BF16, P.HV, P.V);
    void *ws = malloc(need);
    CHECK_OK(maskpack_gdn_op_forward(g, &in, &to, NULL, NULL, ws, need, &e), e);
    CHECK_STATUS(maskpack_gdn_op_forward(g, &in, &to, NULL, NULL, ws, need - 1, &e), MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    CHECK_MSG(e, "maskpack_gdn_op_workspace_size");
    free(ws), free(ob);
    maskpack_gdn_op_free(g);
    unmake(&P);
}

static void test_op_workspace(void) {
    test_op_workspace_isa(MASKPACK_ISA_AVX512_BF16);
    test_op_workspace_isa(MASKPACK_ISA_AMX);
}

int main(void) {
    unsetenv("MASKPACK_ISA");
    if (has_bf16_kernel()) test_gemm();
    test_rule();
    test_dispatch();
    test_f32_inputs();
    test_op_workspace();
    return check_report("test_gdn_bf16");
}
