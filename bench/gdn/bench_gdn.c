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
        if (info[i].family != MASKPACK_KERNEL_GDN || !info[i].available || info[i].isa == best) continue;
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
