/* bench_attention.c: the speed targets of the attention issue, measured in one run.
 *
 * It measures this machine's f32 FMA peak itself (a register-resident AVX-512 FMA loop on the
 * same number of threads), runs torch's scaled_dot_product_attention through
 * bench_attention_torch.py (same threads, just before our measurements), and prints for every
 * target our time, GFLOP/s, fraction of peak, the ratio to torch and the target next to it.
 *
 *   ./build/bench/attention/bench_attention [--threads 2] [--reps 5] [--quick] [--no-torch]
 *                                           [--python PATH] [--script PATH]
 * Medians of --reps runs; the machine is shared, so read the load average printed at the end. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "maskpack.h"

#ifndef MASKPACK_SOURCE_ROOT
#define MASKPACK_SOURCE_ROOT "."
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the f32 FMA peak (shared with the other benchmarks) ------------------------------------------ */

#include "../common/fma_peak.h"

/* 25 joint bursts of ~10-40 ms each; the best one is the uncontended rate. */
static double measure_peak(int threads) { return bench_fma_peak(threads, 500 * 1000, 25); }

/* ---- problems ----------------------------------------------------------------------------------- */

typedef struct {
    maskpack_layout *L;
    int64_t H, D;
    maskpack_dtype dt;
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
    maskpack_tensor tq, tk, tv, to, tdo, tdq, tdk, tdv, tl;
    void *ws;
    size_t ws_bytes;
} problem;

static uint64_t rng = 88172645463325252ull;
static float rndf(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}

static void *rand_buf(int64_t n, maskpack_dtype dt) {
    if (dt == MASKPACK_F32) {
        float *x = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) x[i] = rndf();
        return x;
    }
    uint16_t *x = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        float f = rndf();
        uint32_t u;
        memcpy(&u, &f, 4);
        x[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return x;
}

/* A packed layout of the given lengths (all heads H, head dim D). */
static int make_problem(problem *p, const int64_t *lens, size_t n, int causal, int64_t H, int64_t D,
                        maskpack_dtype dt, int threads, int grads) {
    memset(p, 0, sizeof *p);
    maskpack_rule r = maskpack_rule_default();
    r.causal = causal;
    maskpack_error e;
    if (maskpack_layout_from_lengths(lens, n, MASKPACK_PLACE_PACKED, 0, &r, &p->L, &e)) {
        fprintf(stderr, "layout: %s\n", e.message);
        return -1;
    }
    int64_t T = maskpack_layout_q_width(p->L), shape[3] = {T, H, D}, ls[2] = {H, T};
    p->H = H;
    p->D = D;
    p->dt = dt;
    int64_t nel = T * H * D;
    size_t es = maskpack_dtype_size(dt);
    p->q = rand_buf(nel, dt);
    p->k = rand_buf(nel, dt);
    p->v = rand_buf(nel, dt);
    p->dout = rand_buf(nel, dt);
    p->out = calloc((size_t)nel, es);
    p->dq = calloc((size_t)nel, es);
    p->dk = calloc((size_t)nel, es);
    p->dv = calloc((size_t)nel, es);
    p->lse = calloc((size_t)(H * T), 4);
    p->tq = maskpack_tensor_contiguous(p->q, dt, 3, shape);
    p->tk = maskpack_tensor_contiguous(p->k, dt, 3, shape);
    p->tv = maskpack_tensor_contiguous(p->v, dt, 3, shape);
    p->to = maskpack_tensor_contiguous(p->out, dt, 3, shape);
    p->tdo = maskpack_tensor_contiguous(p->dout, dt, 3, shape);
    p->tdq = maskpack_tensor_contiguous(p->dq, dt, 3, shape);
    p->tdk = maskpack_tensor_contiguous(p->dk, dt, 3, shape);
    p->tdv = maskpack_tensor_contiguous(p->dv, dt, 3, shape);
    p->tl = maskpack_tensor_contiguous(p->lse, MASKPACK_F32, 2, ls);
    size_t a = 0, b = 0;
    if (maskpack_attention_forward_workspace(p->L, &p->tq, &p->tk, &p->tv, threads, &a, &e) ||
        (grads && maskpack_attention_backward_workspace(p->L, &p->tq, &p->tk, &p->tv, threads, &b, &e))) {
        fprintf(stderr, "workspace: %s\n", e.message);
        return -1;
    }
    p->ws_bytes = a > b ? a : b;
    p->ws = malloc(p->ws_bytes);
    memset(p->ws, 0, p->ws_bytes);
    return 0;
}

static void free_problem(problem *p) {
    maskpack_layout_free(p->L);
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->out);
    free(p->dout);
    free(p->dq);
    free(p->dk);
    free(p->dv);
    free(p->lse);
    free(p->ws);
}

static int fwd(problem *p, int threads) {
    maskpack_error e;
    if (maskpack_attention_forward(p->L, &p->tq, &p->tk, &p->tv, 0, 0, &p->to, &p->tl, threads, p->ws, p->ws_bytes,
                                   &e)) {
        fprintf(stderr, "forward: %s\n", e.message);
        return -1;
    }
    return 0;
}

static int bwd(problem *p, int threads) {
    maskpack_error e;
    if (maskpack_attention_backward(p->L, &p->tdo, &p->tq, &p->tk, &p->tv, &p->to, &p->tl, 0, 0, &p->tdq, &p->tdk,
                                    &p->tdv, threads, p->ws, p->ws_bytes, &e)) {
        fprintf(stderr, "backward: %s\n", e.message);
        return -1;
    }
    return 0;
}

/* median seconds of reps runs of fwd (and bwd when both) after one warm-up */
static double time_it(problem *p, int threads, int reps, int do_fwd, int do_bwd) {
    double ts[64];
    if (reps > 64) reps = 64;
    if (do_fwd || do_bwd) fwd(p, threads);
    if (do_bwd) bwd(p, threads);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (do_fwd) fwd(p, threads);
        if (do_bwd) bwd(p, threads);
        ts[r] = now() - t0;
    }
    qsort(ts, (size_t)reps, sizeof(double), cmp_d);
    return ts[reps / 2];
}

/* ---- torch baselines ----------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    double seconds;
} baseline;

static baseline torch_b[] = {{"sdpa_fwd_nomask", NAN},      {"sdpa_fwd_causal", NAN},
                             {"sdpa_fwd_nomask_bf16", NAN}, {"sdpa_fwd_bwd_nomask", NAN},
                             {"sdpa_fwd_packed16_dense_mask", NAN}};
#define N_TORCH (sizeof torch_b / sizeof torch_b[0])

static double torch_time(const char *name) {
    for (size_t i = 0; i < N_TORCH; i++)
        if (strcmp(torch_b[i].name, name) == 0) return torch_b[i].seconds;
    return NAN;
}

static void run_torch(const char *python, const char *script, int threads, int reps, int quick) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s --threads %d --reps %d%s", python, script, threads, reps, quick ? " --quick" : "");
    printf("torch baselines: %s\n", cmd);
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    if (!f) {
        printf("  (could not start the torch script)\n");
        return;
    }
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char name[128];
        double t;
        if (sscanf(line, "%127s %lf", name, &t) == 2)
            for (size_t i = 0; i < N_TORCH; i++)
                if (strcmp(torch_b[i].name, name) == 0) torch_b[i].seconds = t;
    }
    int rc = pclose(f);
    if (rc != 0) printf("  (the torch script exited with status %d)\n", rc);
}

/* ---- report ------------------------------------------------------------------------------------- */

static int n_targets = 0, n_met = 0;

static void verdict(int met) {
    n_targets++;
    n_met += met;
    printf("  -> %s\n", met ? "MET" : "MISSED");
}

int main(int argc, char **argv) {
    int threads = 2, reps = 5, quick = 0, use_torch = 1;
    const char *python = MASKPACK_SOURCE_ROOT "/.venv/bin/python";
    const char *script = MASKPACK_SOURCE_ROOT "/bench/attention/bench_attention_torch.py";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--no-torch"))
            use_torch = 0;
        else if (!strcmp(argv[i], "--python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--script") && i + 1 < argc)
            script = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps N] [--quick] [--no-torch] [--python P] [--script S]\n",
                    argv[0]);
            return 2;
        }
    }
    if (quick) reps = reps > 3 ? 3 : reps;
    if (threads < 1) threads = 1;
    maskpack_attention_isa isa32, isa16;
    maskpack_error e;
    if (maskpack_attention_select_isa(MASKPACK_F32, &isa32, &e) ||
        maskpack_attention_select_isa(MASKPACK_BF16, &isa16, &e)) {
        fprintf(stderr, "%s\n", e.message);
        return 1;
    }
    printf("maskpack %s attention benchmark: %d threads, median of %d runs; kernels f32 %s, bf16 %s\n",
           maskpack_version_string(), threads, reps, maskpack_attention_isa_name(isa32),
           maskpack_attention_isa_name(isa16));
    double peak = measure_peak(threads);
    printf("f32 FMA peak (register-resident AVX-512 FMA loop on %d threads): %.1f GFLOP/s\n", threads, peak);
    if (use_torch) run_torch(python, script, threads, reps, quick);

    const int64_t S = 2048, D = 128, H = 8;
    const double flops_full = 4.0 * S * S * D * H; /* QK^T and PV, 2 flops per multiply-add */
    problem p;

    /* 1. f32 forward, no mask */
    int64_t one[1] = {S};
    if (make_problem(&p, one, 1, 0, H, D, MASKPACK_F32, threads, 1)) return 1;
    double t_nomask = time_it(&p, threads, reps, 1, 0);
    double gf = flops_full / t_nomask / 1e9, tt = torch_time("sdpa_fwd_nomask");
    printf("\n[1] f32 forward S=%lld D=%lld batch*heads=%lld, no mask\n", (long long)S, (long long)D, (long long)H);
    printf("  ours %.2f ms, %.1f GFLOP/s = %.1f%% of f32 peak (target >= 50%%); torch SDPA %.2f ms -> %.2fx torch "
           "(target >= 1.0x)\n",
           t_nomask * 1e3, gf, 100 * gf / peak, tt * 1e3, tt / t_nomask);
    verdict(gf >= 0.5 * peak && tt / t_nomask >= 1.0);

    /* 5. forward + backward vs torch (same problem) */
    double t_fb = time_it(&p, threads, reps, 1, 1);
    double tfb = torch_time("sdpa_fwd_bwd_nomask");
    printf("\n[5] f32 forward + backward, same shape, no mask\n");
    printf("  ours %.2f ms (%.1f GFLOP/s at 14*S^2*D*BH flops, %.1f%% of peak); torch SDPA fwd+bwd %.2f ms -> %.2fx "
           "faster (target >= 1.3x)\n",
           t_fb * 1e3, 3.5 * flops_full / t_fb / 1e9, 100 * 3.5 * flops_full / t_fb / 1e9 / peak, tfb * 1e3,
           tfb / t_fb);
    verdict(tfb / t_fb >= 1.3);
    free_problem(&p);

    /* 2. causal vs non-causal */
    if (make_problem(&p, one, 1, 1, H, D, MASKPACK_F32, threads, 0)) return 1;
    double t_causal = time_it(&p, threads, reps, 1, 0);
    double tc = torch_time("sdpa_fwd_causal");
    printf("\n[2] causal f32 forward, same shape\n");
    printf("  ours %.2f ms = %.3fx the non-causal time (target <= 0.55x); %.1f GFLOP/s on the allowed half; torch "
           "SDPA causal %.2f ms -> %.2fx torch\n",
           t_causal * 1e3, t_causal / t_nomask, flops_full * (S + 1) / (2.0 * S) / t_causal / 1e9, tc * 1e3,
           tc / t_causal);
    verdict(t_causal / t_nomask <= 0.55);
    free_problem(&p);

    /* 3. 16 documents packed into 8192 tokens, causal */
    enum { NDOC = 16 };
    const int deltas[NDOC] = {-300, 300, -200, 200, -100, 100, 250, -250, 0, 0, 400, -400, -150, 150, 50, -50};
    int64_t lens[NDOC];
    double pairs = 0;
    for (int i = 0; i < NDOC; i++) {
        lens[i] = 512 + deltas[i];
        pairs += (double)lens[i] * (double)(lens[i] + 1) / 2;
    }
    if (make_problem(&p, lens, NDOC, 1, H, D, MASKPACK_F32, threads, 0)) return 1;
    double t_packed = time_it(&p, threads, reps, 1, 0);
    free_problem(&p);
    double t_alone = 0;
    for (int i = 0; i < NDOC; i++) {
        if (make_problem(&p, &lens[i], 1, 1, H, D, MASKPACK_F32, threads, 0)) return 1;
        t_alone += time_it(&p, threads, reps, 1, 0);
        free_problem(&p);
    }
    double tpk = torch_time("sdpa_fwd_packed16_dense_mask");
    printf("\n[3] 16 documents (112..912 tokens) packed into 8192 tokens, causal, H=%lld D=%lld, f32 forward\n",
           (long long)H, (long long)D);
    printf("  ours %.2f ms (%.1f GFLOP/s on allowed pairs); torch SDPA with the dense block-diagonal mask %.2f ms -> "
           "%.1fx faster (target >= 5x)\n",
           t_packed * 1e3, 4.0 * pairs * D * H / t_packed / 1e9, tpk * 1e3, tpk / t_packed);
    printf("  sum of the 16 documents run alone %.2f ms -> packed takes %.3fx that (target <= 1.15x)\n",
           t_alone * 1e3, t_packed / t_alone);
    verdict(tpk / t_packed >= 5 && t_packed / t_alone <= 1.15);

    /* 4. bf16 forward on AMX vs our f32 forward */
    if (make_problem(&p, one, 1, 0, H, D, MASKPACK_BF16, threads, 0)) return 1;
    double t_bf16 = time_it(&p, threads, reps, 1, 0);
    double tb = torch_time("sdpa_fwd_nomask_bf16");
    printf("\n[4] bf16 forward (%s), S=%lld D=%lld batch*heads=%lld, no mask\n", maskpack_attention_isa_name(isa16),
           (long long)S, (long long)D, (long long)H);
    printf("  ours %.2f ms, %.1f GFLOP/s = %.2fx our f32 forward (target >= 3x); torch SDPA bf16 %.2f ms -> %.2fx "
           "torch\n",
           t_bf16 * 1e3, flops_full / t_bf16 / 1e9, t_nomask / t_bf16, tb * 1e3, tb / t_bf16);
    verdict(t_nomask / t_bf16 >= 3);
    free_problem(&p);

    FILE *la = fopen("/proc/loadavg", "r");
    char load[128] = "n/a";
    if (la) {
        if (!fgets(load, sizeof load, la)) strcpy(load, "n/a");
        fclose(la);
        load[strcspn(load, "\n")] = 0;
    }
    printf("\n%d of %d targets met (load average at the end: %s)\n", n_met, n_targets, load);
    return 0;
}
