/* bench_gdn.c: throughput of the chunked gated delta rule against the machine's own fp32 FMA peak.
 *
 * 1. Peak: each of n_threads threads runs a long chain of independent AVX-512 FMAs (24
 *    accumulators, enough to cover latency x ports); peak = 2 * 16 * FMAs / second, best of 5,
 *    measured before and after the runs and briefly before each timed run; the highest value
 *    seen is the peak (the machine is shared: a busy moment must not flatter the fraction).
 * 2. The rule: T = 4096 tokens in 8 packed segments of 512, H = 16 key heads, HV = 32 value heads,
 *    K = V = 128 (bench/shapes.json's table "gdn", built into bench_shapes.h; bench_gdn_torch.py
 *    measures the same table), f32, chunked forward on n_threads threads (median of runs). The matrix work is
 *    counted from the products the kernel computes per chunk (triangular ones at their triangle,
 *    the shared Q K^T / K K^T once per key head, the unit-lower inverse at n^3/6; Dv as
 *    A diag(beta) (V - diag(E) K S), so A multiplies V-wide rows only).
 *    Target: >= 30% of the measured peak.
 * The headline kernel is the best this CPU runs (AVX-512, else AVX2 + FMA; MASKPACK_ISA may force
 * one), against the peak of the widest FMA the CPU has (bench/common/fma_peak.h: AVX-512, else
 * AVX2 + FMA), which is what that kernel uses.
 * Also reported: the reference (portable) kernel, the recurrent form and the backward.
 * bf16: where the rule has a bf16 kernel (bf16 inputs, bf16 chunk products, f32 state): the AMX one
 * where the CPU has AMX (AUTO's for bf16), else the AVX512-BF16 one (asked for by name: AUTO runs bf16
 * on the f32 kernel there, see src/kernels/gdn/gdn_api.c), its forward
 * and backward on the same data in bf16 against the f32 kernel (the best f32 one, on
 * the f32 inputs), run pair by pair in this process (f32 run, bf16 run, alternating), reported as
 * the median of the per-pair time ratios f32 / bf16 (target >= 1.4x), with the load average; and
 * the f32 kernel on the bf16 inputs (what bf16 ran before: converted on load) in the same pairs.
 *
 * Usage: bench_gdn [n_threads (2)] [runs (7)] [--tokens T] [--segments N] [--heads H] [--value-heads HV]
 *                  [--key-dim K] [--value-dim V]   (T in N equal segments; HV a multiple of H)
 * Exit status 0 whatever the numbers (it measures); 2 for a bad argument. */
#include "maskpack.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_shapes.h" /* generated from bench/shapes.json */
#include "common/bench_args.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- peak (shared with the other benchmarks) ------------------------------------------------------ */

#include "../common/fma_peak.h"

/* reps joint bursts of iters loop iterations on nt threads; the best burst's rate. */
static double measure_peak(int nt, long iters, int reps) { return bench_fma_peak(nt, iters, reps); }

/* ---- the problem --------------------------------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* matrix work of the chunked forward (multiply-adds), per the comment at the top */
static double chunk_macs(int64_t len, int64_t H, int64_t HV, int64_t K, int64_t V) {
    double macs = 0;
    for (int64_t t0 = 0; t0 < len; t0 += MASKPACK_GDN_CHUNK) {
        double n = (double)(len - t0 < MASKPACK_GDN_CHUNK ? len - t0 : MASKPACK_GDN_CHUNK);
        double tri = n * (n + 1) / 2, stri = n * (n - 1) / 2;
        macs += (double)H * (tri * K + stri * K); /* Q K^T, K K^T: once per key head */
        /* no initial state is given: the first chunk starts from S = 0 and has no [Q; K] S */
        macs += (double)HV * (n * n * n / 6.0                /* (I + L)^-1 */
                              + (t0 ? 2.0 * n * K * V : 0.0) /* [Q; K] S */
                              + tri * V                      /* Dv = A diag(beta) (V - diag(E) K S) */
                              + tri * V                      /* P Dv */
                              + n * K * V);                  /* state update */
    }
    return macs;
}

/* The problem's shape (defaults: bench/shapes.json's table "gdn"). */
typedef struct gdn_shape {
    int64_t T, NSEG, H, HV, K, V;
} gdn_shape;

#define USAGE                                                                                                          \
    "[n_threads] [runs] [--tokens T] [--segments N] [--heads H] [--value-heads HV] [--key-dim K] "                     \
    "[--value-dim V]"

/* Reads the arguments argv[0..argc) (up to two numbers, then options) into *nt, *runs and *s: 0, or
 * -1 after a one-line message. */
static int parse_args(const char *where, int argc, const char *const *argv, int *nt, int *runs, gdn_shape *s) {
    const bench_int_opt opts[] = {{"--tokens", &s->T, 1, 1 << 20}, {"--segments", &s->NSEG, 1, 4096},
                                  {"--heads", &s->H, 1, 256},      {"--value-heads", &s->HV, 1, 256},
                                  {"--key-dim", &s->K, 1, 1024},   {"--value-dim", &s->V, 1, 1024}};
    int positional = 0;
    for (int i = 0; i < argc; i++) {
        int r = bench_parse_int_opt("bench_gdn", where, opts, sizeof opts / sizeof opts[0], argc, argv, &i);
        if (r < 0) return -1;
        if (r == 1) continue;
        if (argv[i][0] != '-' && positional < 2) {
            *(positional++ ? runs : nt) = atoi(argv[i]);
            continue;
        }
        fprintf(stderr, "bench_gdn: unknown argument '%s'%s (usage: bench_gdn " USAGE ")\n", argv[i], where);
        return -1;
    }
    return 0;
}

static void load_average(double load[3]) {
    load[0] = load[1] = load[2] = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
}

static uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *r = malloc(n * 2 + 2);
    if (!r) return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        r[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* to nearest even (finite data) */
    }
    return r;
}

/* One timed call: forward (chunked) or backward of `in` with op into the given outputs. */
static double timed(const maskpack_layout *L, const maskpack_gdn_inputs *in, const maskpack_gdn_options *op,
                    int backward, maskpack_tensor *o, const maskpack_tensor *dO, maskpack_gdn_grads *gr, void *ws,
                    size_t bytes, int *rc) {
    maskpack_error e;
    const double t0 = now();
    maskpack_status s = backward ? maskpack_gdn_backward(L, in, dO, NULL, op, gr, ws, bytes, &e)
                                 : maskpack_gdn_forward(L, in, op, o, NULL, ws, bytes, &e);
    const double t = now() - t0;
    if (s) {
        fprintf(stderr, "bench_gdn: bf16 rows: %s\n", e.message);
        *rc = 1;
    }
    return t;
}

/* The bf16 rows (see the top): pairs of (f32 kernel on f32 inputs, bf16 inputs on the bf16 kernel,
 * bf16 inputs on the f32 kernel), forward and backward; per-pair ratios, their median. Returns
 * non-zero on a failed call. */
static int run_bf16(const maskpack_layout *L, const maskpack_gdn_inputs *in32, maskpack_isa f32_isa, int nt, int runs,
                    int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, const float *q, const float *k,
                    const float *v, const float *g, const float *b, const float *dO, double gflop) {
    maskpack_isa bf = MASKPACK_ISA_REF;
    maskpack_error e;
    maskpack_isa au = MASKPACK_ISA_REF;
    if (maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, MASKPACK_ISA_AUTO, &au, &e)) return 1;
    /* the bf16 kernel to measure: AMX's where the CPU has it, else AVX512-BF16's */
    maskpack_isa want16 = MASKPACK_ISA_AMX;
    if (maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, want16, &bf, &e) || bf != want16) {
        want16 = MASKPACK_ISA_AVX512_BF16;
        if (maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_BF16, want16, &bf, &e) || bf != want16) {
            printf("bf16: no AMX or AVX512-BF16 kernel here: bf16 inputs run the %s kernel (converted on load)\n",
                   maskpack_isa_name(au));
            return 0;
        }
    }
    printf("bf16: AUTO runs bf16 inputs on the %s kernel; the rows below ask for %s by name\n", maskpack_isa_name(au),
           maskpack_isa_name(want16));
    /* the peak of the unit the bf16 kernel's products run on, measured here as the f32 one is */
    const int tiles = want16 == MASKPACK_ISA_AMX;
    const double peak16 = tiles ? bench_amx_peak(nt, 200 * 1000, 25) : bench_bf16dot_peak(nt, 500 * 1000, 25);
    const char *unit = tiles ? "AMX tile (TDPBF16PS loop)" : "bf16 dot-product (VDPBF16PS loop)";
    printf("bf16: %s peak on %d threads: %.1f GFLOP/s\n", unit, nt, peak16);
    const size_t nq = (size_t)(T * H * K), nv = (size_t)(T * HV * V), nh = (size_t)(T * HV);
    uint16_t *bq = to_bf16(q, nq), *bk = to_bf16(k, nq), *bv = to_bf16(v, nv), *bg = to_bf16(g, nh);
    uint16_t *bb = to_bf16(b, nh), *bdo = to_bf16(dO, nv);
    float *o32 = malloc(nv * 4), *dq32 = malloc(nq * 4), *dk32 = malloc(nq * 4), *dv32 = malloc(nv * 4);
    float *dg32 = malloc(nh * 4), *db32 = malloc(nh * 4);
    uint16_t *o16 = malloc(nv * 2), *dq16 = malloc(nq * 2), *dk16 = malloc(nq * 2), *dv16 = malloc(nv * 2);
    uint16_t *dg16 = malloc(nh * 2), *db16 = malloc(nh * 2);
    int rc = 0;
    if (!bq || !bk || !bv || !bg || !bb || !bdo || !o32 || !dq32 || !dk32 || !dv32 || !dg32 || !db32 || !o16 || !dq16 ||
        !dk16 || !dv16 || !dg16 || !db16) {
        fprintf(stderr, "bench_gdn: out of memory for the bf16 rows\n");
        rc = 1;
        goto done;
    }
    {
        int64_t sq[3] = {T, H, K}, sv[3] = {T, HV, V}, sg[2] = {T, HV};
        const maskpack_dtype B16 = MASKPACK_BF16, F32 = MASKPACK_F32;
        maskpack_tensor tq = maskpack_tensor_contiguous(bq, B16, 3, sq),
                        tk = maskpack_tensor_contiguous(bk, B16, 3, sq);
        maskpack_tensor tv = maskpack_tensor_contiguous(bv, B16, 3, sv),
                        tg = maskpack_tensor_contiguous(bg, B16, 2, sg);
        maskpack_tensor tb = maskpack_tensor_contiguous(bb, B16, 2, sg);
        maskpack_tensor tdo16 = maskpack_tensor_contiguous(bdo, B16, 3, sv);
        maskpack_tensor tdo32 = maskpack_tensor_contiguous((void *)dO, F32, 3, sv);
        maskpack_gdn_inputs in16 = {&tq, &tk, &tv, &tg, &tb, NULL};
        maskpack_tensor to32 = maskpack_tensor_contiguous(o32, F32, 3, sv),
                        to16 = maskpack_tensor_contiguous(o16, B16, 3, sv);
        maskpack_tensor a32[5] = {
            maskpack_tensor_contiguous(dq32, F32, 3, sq), maskpack_tensor_contiguous(dk32, F32, 3, sq),
            maskpack_tensor_contiguous(dv32, F32, 3, sv), maskpack_tensor_contiguous(dg32, F32, 2, sg),
            maskpack_tensor_contiguous(db32, F32, 2, sg)};
        maskpack_tensor a16[5] = {
            maskpack_tensor_contiguous(dq16, B16, 3, sq), maskpack_tensor_contiguous(dk16, B16, 3, sq),
            maskpack_tensor_contiguous(dv16, B16, 3, sv), maskpack_tensor_contiguous(dg16, B16, 2, sg),
            maskpack_tensor_contiguous(db16, B16, 2, sg)};
        maskpack_gdn_grads g32 = {&a32[0], &a32[1], &a32[2], &a32[3], &a32[4], NULL};
        maskpack_gdn_grads g16 = {&a16[0], &a16[1], &a16[2], &a16[3], &a16[4], NULL};
        maskpack_gdn_options o32op = maskpack_gdn_options_default(), o16op = maskpack_gdn_options_default();
        maskpack_gdn_options ocv = maskpack_gdn_options_default();
        o32op.isa = f32_isa, o16op.isa = want16, ocv.isa = f32_isa;
        o32op.n_threads = o16op.n_threads = ocv.n_threads = nt;
        for (int bw = 0; bw < 2 && !rc; bw++) {
            size_t b32 = 0, b16 = 0, bcv = 0;
            maskpack_gdn_workspace_size(L, in32, &o32op, bw, &b32, NULL);
            maskpack_gdn_workspace_size(L, &in16, &o16op, bw, &b16, NULL);
            maskpack_gdn_workspace_size(L, &in16, &ocv, bw, &bcv, NULL);
            size_t bytes = b32 > b16 ? b32 : b16;
            if (bcv > bytes) bytes = bcv;
            void *ws = malloc(bytes);
            const int n = bw ? (runs > 5 ? 5 : runs) : runs;
            double t32[64], t16[64], tcv[64], r16[64], rcv[64];
            double la[3];
            load_average(la);
            for (int r = 0; r < n && r < 64; r++) {
                t32[r] = timed(L, in32, &o32op, bw, &to32, &tdo32, &g32, ws, bytes, &rc);
                t16[r] = timed(L, &in16, &o16op, bw, &to16, &tdo16, &g16, ws, bytes, &rc);
                tcv[r] = timed(L, &in16, &ocv, bw, &to16, &tdo16, &g16, ws, bytes, &rc);
                r16[r] = t32[r] / t16[r];
                rcv[r] = tcv[r] / t16[r];
            }
            const int m = n < 64 ? n : 64;
            qsort(t32, (size_t)m, sizeof t32[0], cmp_d);
            qsort(t16, (size_t)m, sizeof t16[0], cmp_d);
            qsort(tcv, (size_t)m, sizeof tcv[0], cmp_d);
            qsort(r16, (size_t)m, sizeof r16[0], cmp_d);
            qsort(rcv, (size_t)m, sizeof rcv[0], cmp_d);
            double lb[3];
            load_average(lb);
            const char *what = bw ? "backward" : "forward chunked";
            printf("bf16 %-15s %s: median %8.2f ms; f32 kernel (%s) on f32 inputs %8.2f ms, on bf16 inputs "
                   "(converted) %8.2f ms\n",
                   what, maskpack_isa_name(bf), t16[m / 2] * 1e3, maskpack_isa_name(f32_isa), t32[m / 2] * 1e3,
                   tcv[m / 2] * 1e3);
            if (!bw && peak16 > 0) /* the forward's matrix work (the f32 rows' count) against the unit's peak */
                printf("bf16 forward chunked matrix work: %.1f GFLOP/s = %.1f%% of the %s peak\n", gflop / t16[m / 2],
                       100.0 * gflop / t16[m / 2] / peak16, tiles ? "AMX tile" : "VDPBF16PS");
            printf("RESULT bf16 %s: %d pairs, median of per-pair ratios %.2fx vs the f32 kernel on f32 inputs "
                   "(min %.2fx, max %.2fx; target >= 1.4x: %s), %.2fx vs it on bf16 inputs; load average %.2f %.2f "
                   "%.2f before, %.2f %.2f %.2f after\n",
                   what, m, r16[m / 2], r16[0], r16[m - 1], r16[m / 2] >= 1.4 ? "met" : "NOT met", rcv[m / 2], la[0],
                   la[1], la[2], lb[0], lb[1], lb[2]);
            free(ws);
        }
    }
done:
    free(bq), free(bk), free(bv), free(bg), free(bb), free(bdo);
    free(o32), free(dq32), free(dk32), free(dv32), free(dg32), free(db32);
    free(o16), free(dq16), free(dk16), free(dv16), free(dg16), free(db16);
    return rc;
}

int main(int argc, char **argv) {
    static const char *const defaults[] = {BENCH_SHAPES_GDN};
    /* line by line into a pipe too: a reader (the report, a test) sees the shape before the long runs */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int nt = 2, runs = 7;
    gdn_shape sh = {0};
    if (parse_args(BENCH_SHAPES_WHERE, (int)(sizeof defaults / sizeof defaults[0]), defaults, &nt, &runs, &sh) ||
        parse_args("", argc - 1, (const char *const *)argv + 1, &nt, &runs, &sh))
        return 2;
    const char *const prog = "bench_gdn";
    if (bench_require(prog, "gdn", "--tokens", sh.T) || bench_require(prog, "gdn", "--segments", sh.NSEG) ||
        bench_require(prog, "gdn", "--heads", sh.H) || bench_require(prog, "gdn", "--value-heads", sh.HV) ||
        bench_require(prog, "gdn", "--key-dim", sh.K) || bench_require(prog, "gdn", "--value-dim", sh.V))
        return 2;
    /* equal segments (bench_gdn_torch.py runs them as a batch), and whole groups of value heads */
    if (sh.T % sh.NSEG) {
        fprintf(stderr, "bench_gdn: --segments: %lld tokens do not split into %lld equal segments\n", (long long)sh.T,
                (long long)sh.NSEG);
        return 2;
    }
    if (sh.HV % sh.H) {
        fprintf(stderr, "bench_gdn: --value-heads: %lld is not a multiple of --heads %lld\n", (long long)sh.HV,
                (long long)sh.H);
        return 2;
    }
    if (nt < 1) nt = 1;
    if (runs < 1) runs = 1;
    const int64_t T = sh.T, NSEG = sh.NSEG, H = sh.H, HV = sh.HV, K = sh.K, V = sh.V;
    double load[3] = {0, 0, 0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    printf("bench_gdn: threads %d, runs %d, load average %.2f %.2f %.2f\n", nt, runs, load[0], load[1], load[2]);
    double peak = measure_peak(nt, 20000000, 5);
    __builtin_cpu_init();
    printf("fp32 FMA peak (%s, %d threads, measured): %.1f GFLOP/s\n",
           __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2 + FMA", nt, peak);

    int64_t *lens = malloc((size_t)NSEG * sizeof *lens);
    if (!lens) return 1;
    for (int64_t i = 0; i < NSEG; i++) lens[i] = T / NSEG;
    maskpack_layout *L = NULL;
    maskpack_error e;
    if (maskpack_layout_from_lengths(lens, (size_t)NSEG, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e)) {
        fprintf(stderr, "layout: %s\n", e.message);
        return 1;
    }
    size_t nq = (size_t)(T * H * K), nv = (size_t)(T * HV * V), nh = (size_t)(T * HV);
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc(nh * 4), *b = malloc(nh * 4);
    float *o = malloc(nv * 4), *dO = malloc(nv * 4), *dq = malloc(nq * 4), *dk = malloc(nq * 4), *dv = malloc(nv * 4);
    float *dg = malloc(nh * 4), *db = malloc(nh * 4);
    if (!q || !k || !v || !g || !b || !o || !dO || !dq || !dk || !dv || !dg || !db) {
        fprintf(stderr, "bench_gdn: out of memory for this shape\n");
        return 1;
    }
    for (size_t i = 0; i < nq; i++) {
        q[i] = frand() - 0.5f;
        k[i] = frand() - 0.5f;
    }
    for (size_t i = 0; i < nv; i++) {
        v[i] = frand() - 0.5f;
        dO[i] = frand() - 0.5f;
    }
    for (size_t i = 0; i < nh; i++) {
        g[i] = -0.05f - 0.3f * frand();
        b[i] = frand();
    }
    int64_t sq[3] = {T, H, K}, sv[3] = {T, HV, V}, sg[2] = {T, HV}, ss[4] = {NSEG, HV, K, V};
    float *ht = malloc((size_t)(NSEG * HV * K * V) * 4);
    if (!ht) {
        fprintf(stderr, "bench_gdn: out of memory for this shape\n");
        return 1;
    }
    maskpack_tensor tq = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, sq),
                    tk = maskpack_tensor_contiguous(k, MASKPACK_F32, 3, sq);
    maskpack_tensor tv = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, sv),
                    tg = maskpack_tensor_contiguous(g, MASKPACK_F32, 2, sg);
    maskpack_tensor tb = maskpack_tensor_contiguous(b, MASKPACK_F32, 2, sg),
                    to = maskpack_tensor_contiguous(o, MASKPACK_F32, 3, sv);
    maskpack_tensor tdo = maskpack_tensor_contiguous(dO, MASKPACK_F32, 3, sv),
                    tht = maskpack_tensor_contiguous(ht, MASKPACK_F32, 4, ss);
    maskpack_tensor tdq = maskpack_tensor_contiguous(dq, MASKPACK_F32, 3, sq),
                    tdk = maskpack_tensor_contiguous(dk, MASKPACK_F32, 3, sq);
    maskpack_tensor tdv = maskpack_tensor_contiguous(dv, MASKPACK_F32, 3, sv),
                    tdg = maskpack_tensor_contiguous(dg, MASKPACK_F32, 2, sg);
    maskpack_tensor tdb = maskpack_tensor_contiguous(db, MASKPACK_F32, 2, sg);
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, NULL};
    double macs = 0;
    for (int64_t i = 0; i < NSEG; i++) macs += chunk_macs(lens[i], H, HV, K, V);
    const double gflop = 2.0 * macs * 1e-9;
    printf("problem: T %lld in %lld segments, H %lld, HV %lld, K %lld, V %lld; chunked matrix work %.2f GFLOP\n",
           (long long)T, (long long)NSEG, (long long)H, (long long)HV, (long long)K, (long long)V, gflop);

    /* the kernel AUTO runs here (MASKPACK_ISA respected) */
    maskpack_isa best = MASKPACK_ISA_REF;
    if (maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &best, &e)) {
        fprintf(stderr, "isa: %s\n", e.message);
        return 1;
    }
    const char *bn = maskpack_isa_name(best);
    char names[16][64];
    typedef struct {
        const char *name;
        maskpack_isa isa;
        int chunked;
        int backward;
        int runs;
    } bench_cfg;
    bench_cfg cfg[16];
    size_t n_cfg = 0;
    snprintf(names[n_cfg], sizeof names[0], "forward chunked %-6s", bn);
    cfg[n_cfg] = (bench_cfg){names[n_cfg], best, 1, 0, runs};
    n_cfg++;
    /* every other kernel of the rule's table this CPU runs (the listing reads the same table) */
    maskpack_kernel_info info[32];
    size_t n_info = 0;
    if (maskpack_kernel_list(info, 32, &n_info, &e)) {
        fprintf(stderr, "kernel list: %s\n", e.message);
        return 1;
    }
    for (size_t i = 0; i < n_info && i < 32 && n_cfg < 14; i++) {
        /* (avx512_bf16 and amx run f32 inputs on the AVX-512 kernels: their own rows, in bf16, are below) */
        if (info[i].family != MASKPACK_KERNEL_GDN || !info[i].available || info[i].isa == best ||
            info[i].isa == MASKPACK_ISA_AVX512_BF16 || info[i].isa == MASKPACK_ISA_AMX)
            continue;
        snprintf(names[n_cfg], sizeof names[0], "forward chunked %-6s", maskpack_isa_name(info[i].isa));
        cfg[n_cfg] = (bench_cfg){names[n_cfg], info[i].isa, 1, 0, 1};
        n_cfg++;
    }
    cfg[n_cfg++] = (bench_cfg){"forward recurrent     ", best, 0, 0, 1};
    snprintf(names[n_cfg], sizeof names[0], "backward %-13s", bn);
    cfg[n_cfg] = (bench_cfg){names[n_cfg], best, 1, 1, runs > 3 ? 3 : runs};
    n_cfg++;
    int rc = 0;
    double fwd_median = 0, ratio_median = 0;
    for (size_t c = 0; c < n_cfg; c++) {
        maskpack_gdn_options op = maskpack_gdn_options_default();
        op.isa = cfg[c].isa;
        op.chunked = cfg[c].chunked;
        op.n_threads = nt;
        size_t bytes = 0;
        maskpack_gdn_workspace_size(L, &in, &op, cfg[c].backward, &bytes, NULL);
        void *ws = malloc(bytes);
        double times[64];
        int n = cfg[c].runs < 64 ? cfg[c].runs : 64;
        double ratios[64];
        for (int r = 0; r < n; r++) {
            /* for the headline kernel, a short peak measurement right before each run: the ratio of
             * the two is taken under the same load */
            double pk = c == 0 ? measure_peak(nt, 4000000, 1) : 0.0;
            if (pk > peak) peak = pk;
            double t0 = now();
            maskpack_status s;
            if (cfg[c].backward) {
                maskpack_gdn_grads gr = {&tdq, &tdk, &tdv, &tdg, &tdb, NULL};
                s = maskpack_gdn_backward(L, &in, &tdo, NULL, &op, &gr, ws, bytes, &e);
            } else {
                s = maskpack_gdn_forward(L, &in, &op, &to, &tht, ws, bytes, &e);
            }
            times[r] = now() - t0;
            ratios[r] = pk > 0 ? gflop / times[r] / pk : 0.0;
            if (s) {
                fprintf(stderr, "%s: %s\n", cfg[c].name, e.message);
                rc = 1;
                break;
            }
        }
        qsort(times, (size_t)n, sizeof times[0], cmp_d);
        qsort(ratios, (size_t)n, sizeof ratios[0], cmp_d);
        double med = times[n / 2];
        if (c == 0) {
            fwd_median = med;
            ratio_median = ratios[n / 2];
        }
        if (!cfg[c].backward && cfg[c].chunked)
            printf("%s: median %8.2f ms  %7.1f GFLOP/s  (workspace %.1f MiB)\n", cfg[c].name, med * 1e3, gflop / med,
                   (double)bytes / 1048576.0);
        else
            printf("%s: median %8.2f ms  (workspace %.1f MiB)\n", cfg[c].name, med * 1e3, (double)bytes / 1048576.0);
        free(ws);
    }
    if (run_bf16(L, &in, best, nt, runs, T, H, HV, K, V, q, k, v, g, b, dO, gflop)) rc = 1;
    /* the machine is shared: measure the peak again after the runs and keep the higher one, so
     * a busy moment during the first measurement cannot flatter the fraction */
    double peak_after = measure_peak(nt, 20000000, 5);
    printf("fp32 FMA peak measured again after the runs: %.1f GFLOP/s\n", peak_after);
    if (peak_after > peak) peak = peak_after;
    double chk = 0;
    for (size_t i = 0; i < nv; i++) chk += fabs((double)o[i]);
    if (!(chk == chk)) rc = 1;
    if (fwd_median > 0 && peak > 0) {
        double frac = gflop / fwd_median / peak;
        printf("per run, against a peak measured just before it: median %.1f%%\n", 100.0 * ratio_median);
        printf("RESULT chunked forward matrix work: median %.1f GFLOP/s = %.1f%% of the highest peak measured "
               "(%.1f GFLOP/s) (target >= 30%%: %s)\n",
               gflop / fwd_median, 100.0 * frac, peak, frac >= 0.30 ? "met" : "NOT met");
    }
    free(q);
    free(k);
    free(v);
    free(g);
    free(b);
    free(o);
    free(dO);
    free(dq);
    free(dk);
    free(dv);
    free(dg);
    free(db);
    free(ht);
    free(lens);
    maskpack_layout_free(L);
    return rc;
}
