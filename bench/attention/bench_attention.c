/* bench_attention.c: the speed targets of the attention issue, measured in one run.
 *
 * It measures this machine's f32 FMA peak itself (a register-resident FMA loop of the widest vectors
 * the CPU has, AVX-512 or else AVX2, on the same number of threads) and prints for every target our time, GFLOP/s,
 * fraction of peak, the ratio to the baseline and the target next to it. Torch's scaled_dot_product_attention runs in
 * bench_attention_torch.py --serve, a co-process on the same threads that runs one measurement per
 * request: every figure alternates the two sides rep by rep (ours then torch, then torch then ours)
 * and judges the median of the per-pair ratios, so a busy moment of the shared host hits both.
 * Ratios between two of our own kernels (causal vs full, packed vs documents alone, bf16 vs f32)
 * alternate the same way.
 *
 *   ./build/bench/attention/bench_attention [--threads 2] [--reps 5] [--quick] [--no-torch]
 *                                           [--python PATH] [--script PATH] [--only 1,5]
 *                                           [--seq S] [--heads H] [--head-dim D] [--docs L,L,...]
 * The shapes (S tokens of one sequence, H heads of D; item [3]'s documents, packed) default to
 * bench/shapes.json's table "attention", built into bench_shapes.h; the torch co-process is given the
 * same options, so both sides always measure one shape.
 * --only LIST (item numbers 1..7, comma-separated) measures just those items, so one figure can be
 * measured again without the whole run; the others print "skipped". Item [5] also prints the
 * arithmetic bound of its 1.3x target: the fraction of the measured FMA peak we would need. Item [6]
 * runs every kernel of the attention table this CPU runs (maskpack_kernel_list), for information.
 * Read the load average printed at the end. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "maskpack.h"

#include "bench_shapes.h" /* generated from bench/shapes.json */
#include "common/bench_args.h"

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

/* Which loop bench_fma_peak ran: the widest FMA vectors this CPU has. */
static const char *peak_isa_name(void) {
#if defined(BENCH_HAVE_AVX512_PEAK)
    if (__builtin_cpu_supports("avx512f")) return "AVX-512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "AVX2";
#endif
    return "no vector";
}

/* 25 joint bursts of ~10-40 ms each; the best one is the uncontended rate. */
static double measure_peak(int threads) { return bench_fma_peak(threads, 500 * 1000, 25); }

/* The host's speed drifts within minutes, so a peak measured once at the start can be lower than
 * what a later kernel run reached (fractions above 100% were printed). The peak is measured again
 * right after each figure that quotes it, and the highest of all measurements is used: the
 * fraction can then only err low. */
static double update_peak(double *peak, int threads) {
    double p = measure_peak(threads);
    if (p > *peak) *peak = p;
    return *peak;
}

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
    maskpack_isa isa; /* the kernel the calls ask for (AUTO unless item [6] sets one) */
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
static int make_problem(problem *p, const int64_t *lens, size_t n, int causal, int64_t H, int64_t D, maskpack_dtype dt,
                        int threads, int grads) {
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
    const maskpack_kernel_options ko = {threads, MASKPACK_ISA_AUTO};
    if (maskpack_attention_forward_workspace(p->L, &p->tq, &p->tk, &p->tv, &ko, &a, &e) ||
        (grads && maskpack_attention_backward_workspace(p->L, &p->tq, &p->tk, &p->tv, &ko, &b, &e))) {
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
    const maskpack_kernel_options ko = {threads, p->isa};
    if (maskpack_attention_forward(p->L, &p->tq, &p->tk, &p->tv, 0, 0, &p->to, &p->tl, &ko, p->ws, p->ws_bytes, &e)) {
        fprintf(stderr, "forward: %s\n", e.message);
        return -1;
    }
    return 0;
}

static int bwd(problem *p, int threads) {
    maskpack_error e;
    const maskpack_kernel_options ko = {threads, p->isa};
    if (maskpack_attention_backward(p->L, &p->tdo, &p->tq, &p->tk, &p->tv, &p->to, &p->tl, 0, 0, &p->tdq, &p->tdk,
                                    &p->tdv, &ko, p->ws, p->ws_bytes, &e)) {
        fprintf(stderr, "backward: %s\n", e.message);
        return -1;
    }
    return 0;
}

/* ---- pairing: two measured sides alternate rep by rep -----------------------------------------
 *
 * The machine is shared: a busy moment of the host slows whatever runs during it. Running one side's
 * reps and then the other's lets such a moment land on one side only; alternating them rep by rep
 * (A B, then B A, ...) lets it land on both, and the median of the per-pair ratios cancels it. */

typedef struct side side;
struct side {
    double (*run)(side *s); /* one timed run, seconds (NAN when it could not run) */
    problem *p;             /* our problem (ours_* sides) */
    int threads, do_bwd;
    struct torch_proc *tp; /* torch co-process (torch side) */
    const char *name;
};

static double run_ours(side *s) {
    double t0 = now();
    if (fwd(s->p, s->threads)) return NAN;
    if (s->do_bwd && bwd(s->p, s->threads)) return NAN;
    return now() - t0;
}

typedef struct {
    double a, b;  /* medians of each side */
    double ratio; /* median of the per-pair ratios b / a */
} paired_result;

static double median_of(double *x, int n) {
    if (n <= 0) return NAN;
    qsort(x, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static double run_all(side *s, int n) {
    double t = 0;
    for (int i = 0; i < n; i++) t += s[i].run(&s[i]);
    return t;
}

/* Side A is na sides run back to back (their times summed), side B nb sides likewise; one untimed
 * warm-up of each, then reps pairs in alternating order. */
static paired_result paired(side *a, int na, side *b, int nb, int reps) {
    double ta[64], tb[64], r[64];
    if (reps > 64) reps = 64;
    run_all(a, na);
    run_all(b, nb);
    int na_ok = 0, nb_ok = 0, n = 0; /* a side that cannot run (no torch) leaves the other's times */
    for (int i = 0; i < reps; i++) {
        double x, y;
        if (i % 2 == 0) {
            x = run_all(a, na);
            y = run_all(b, nb);
        } else {
            y = run_all(b, nb);
            x = run_all(a, na);
        }
        if (!isnan(x)) ta[na_ok++] = x;
        if (!isnan(y)) tb[nb_ok++] = y;
        if (!isnan(x) && !isnan(y)) r[n++] = y / x;
    }
    paired_result res = {median_of(ta, na_ok), median_of(tb, nb_ok), median_of(r, n)};
    return res;
}

/* ---- torch co-process ---------------------------------------------------------------------------- */

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct torch_proc {
    pid_t pid;
    FILE *to, *from;
} torch_proc;

/* Starts `python script --serve --threads N` and the shape options `shape` (NULL-terminated) with its
 * stdin/stdout on pipes and waits for "ready". Returns 0 on success. */
static int torch_start(torch_proc *tp, const char *python, const char *script, int threads, const char *const *shape) {
    int in[2], out[2];
    memset(tp, 0, sizeof *tp);
    if (pipe(in) || pipe(out)) return -1;
    char nthreads[16];
    snprintf(nthreads, sizeof nthreads, "%d", threads);
    char *args[32] = {(char *)python, (char *)script, "--serve", "--threads", nthreads};
    for (int i = 0; shape[i] && i < 26; i++) args[5 + i] = (char *)shape[i];
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execv(python, args);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    tp->pid = pid;
    tp->to = fdopen(in[1], "w");
    tp->from = fdopen(out[0], "r");
    char line[256];
    if (!tp->to || !tp->from || !fgets(line, sizeof line, tp->from) || strncmp(line, "ready", 5) != 0) {
        printf("  (the torch script did not start: %s %s --serve)\n", python, script);
        if (tp->to) fclose(tp->to);
        if (tp->from) fclose(tp->from);
        waitpid(pid, NULL, 0);
        memset(tp, 0, sizeof *tp);
        return -1;
    }
    return 0;
}

static double run_torch(side *s) {
    torch_proc *tp = s->tp;
    if (!tp || !tp->to) return NAN;
    char line[256], name[128];
    double t;
    fprintf(tp->to, "%s\n", s->name);
    fflush(tp->to);
    if (!fgets(line, sizeof line, tp->from) || sscanf(line, "%127s %lf", name, &t) != 2 || strcmp(name, s->name))
        return NAN;
    return t;
}

static void torch_stop(torch_proc *tp) {
    if (!tp->to) return;
    fclose(tp->to); /* end of input ends the script */
    fclose(tp->from);
    waitpid(tp->pid, NULL, 0);
}

/* ---- report ------------------------------------------------------------------------------------- */

/* "1,5" -> bit i set for each item i in 1..7; 0 for anything else (empty, out of range, junk). */
static unsigned parse_only(const char *list) {
    unsigned m = 0;
    const char *p = list;
    for (;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 7) return 0;
        m |= 1u << v;
        if (*end == 0) return m;
        if (*end != ',') return 0;
        p = end + 1;
    }
}

static void skipped(int item) { printf("\n[%d] skipped (--only)\n", item); }

/* Item [5]'s 1.3x target against arithmetic: our forward + backward does the same 7 products as
 * torch's (2 forward: S = QK^T, O = PV; 5 backward: S again, dP, dV, dK, dQ), so going 1.3x faster
 * than torch needs 1.3x torch's FLOP rate. Printed as fractions of the measured FMA peak (the best
 * of all measurements: if it is low, the fractions err high). An attention kernel also spends
 * cycles on exp, row max and sums, loads and stores that the FMA loop of the peak does not, so
 * above ~90% of peak the target is out of reach in practice, and above 100% impossible. */
static void print_fb_bound(double flops, double torch_s, double peak) {
    printf("  arithmetic bound: fwd+bwd = 7 products x 2*S^2*D*BH = %.1f GFLOP", flops / 1e9);
    if (isnan(torch_s) || !(peak > 0)) {
        printf("; no bound (%s)\n", isnan(torch_s) ? "torch not measured" : "no FMA peak on this CPU");
        return;
    }
    const double torch_frac = flops / torch_s / 1e9 / peak, need = 1.3 * torch_frac;
    printf("; torch reaches %.1f%% of the f32 FMA peak (%.1f GFLOP/s); 1.3x torch needs %.1f%% of peak",
           100 * torch_frac, peak, 100 * need);
    if (need > 1.0)
        printf(": more than the peak itself, so 1.3x torch is impossible on this machine\n");
    else if (need > 0.9)
        printf(": above 90%% of peak, which an attention kernel (exp, max, sums, loads besides the FMAs) cannot "
               "sustain, so 1.3x torch is out of reach on this machine\n");
    else
        printf("\n");
}

static int n_targets = 0, n_met = 0;

/* A figure that could not be measured (no torch, --no-torch) is reported as such, never as met. */
static void verdict(int measured, int met) {
    n_targets++;
    n_met += measured && met;
    printf("  -> %s\n", !measured ? "NOT MEASURED" : met ? "MET" : "MISSED");
}

#define MAX_DOCS 256

/* What the command line sets (the shapes' defaults: bench/shapes.json's table "attention"). */
typedef struct settings {
    int threads, reps, quick, use_torch, only_given;
    unsigned only; /* bits 1..7: the items to measure */
    const char *python, *script;
    int64_t S, H, D, ndoc, docs[MAX_DOCS];
} settings;

/* Reads the arguments argv[0..argc) into *a: 0, or -1 after a one-line message (where: "" on the
 * command line, BENCH_SHAPES_WHERE for the defaults). */
static int parse_args(const char *where, int argc, const char *const *argv, settings *a) {
    const bench_int_opt shape[] = {
        {"--seq", &a->S, 1, 1 << 20}, {"--heads", &a->H, 1, 1024}, {"--head-dim", &a->D, 1, 1024}};
    for (int i = 0; i < argc; i++) {
        int r = bench_parse_int_opt("bench_attention", where, shape, sizeof shape / sizeof shape[0], argc, argv, &i);
        if (r < 0) return -1;
        if (r == 1) continue;
        if (!strcmp(argv[i], "--docs")) {
            size_t n = 0;
            if (bench_arg_ints("bench_attention", "--docs", where, i + 1 < argc ? argv[i + 1] : NULL, 1, 1 << 20,
                               a->docs, MAX_DOCS, &n))
                return -1;
            a->ndoc = (int64_t)n;
            i++;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            a->threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            a->reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            a->quick = 1;
        else if (!strcmp(argv[i], "--no-torch"))
            a->use_torch = 0;
        else if (!strcmp(argv[i], "--python") && i + 1 < argc)
            a->python = argv[++i];
        else if (!strcmp(argv[i], "--script") && i + 1 < argc)
            a->script = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && (a->only = parse_only(argv[i + 1])) != 0) {
            a->only_given = 1;
            i++;
        } else {
            fprintf(stderr,
                    "usage: bench_attention [--threads N] [--reps N] [--quick] [--no-torch] [--python P] [--script S] "
                    "[--only LIST (items 1..7, e.g. 1,5)] [--seq S] [--heads H] [--head-dim D] [--docs L,L,...]%s\n",
                    where);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    static const char *const defaults[] = {BENCH_SHAPES_ATTENTION};
    /* line by line into a pipe too: a reader (the report, a test) sees the shape before the long runs */
    setvbuf(stdout, NULL, _IOLBF, 0);
    settings a = {2,
                  5,
                  0,
                  1,
                  0,
                  0xfe,
                  MASKPACK_SOURCE_ROOT "/.venv/bin/python",
                  MASKPACK_SOURCE_ROOT "/bench/attention/bench_attention_torch.py",
                  0,
                  0,
                  0,
                  0,
                  {0}};
    if (parse_args(BENCH_SHAPES_WHERE, (int)(sizeof defaults / sizeof defaults[0]), defaults, &a) ||
        parse_args("", argc - 1, (const char *const *)argv + 1, &a))
        return 2;
    const char *const prog = "bench_attention";
    if (bench_require(prog, "attention", "--seq", a.S) || bench_require(prog, "attention", "--heads", a.H) ||
        bench_require(prog, "attention", "--head-dim", a.D) || bench_require(prog, "attention", "--docs", a.ndoc))
        return 2;
    int threads = a.threads, reps = a.reps, quick = a.quick, use_torch = a.use_torch, only_given = a.only_given;
    unsigned only = a.only;
    const char *python = a.python, *script = a.script;
    /* the shape, as the options the torch co-process is given (the numbers as parsed here) */
    char shape_text[4][8 * MAX_DOCS + 16];
    snprintf(shape_text[0], sizeof shape_text[0], "%lld", (long long)a.S);
    snprintf(shape_text[1], sizeof shape_text[1], "%lld", (long long)a.H);
    snprintf(shape_text[2], sizeof shape_text[2], "%lld", (long long)a.D);
    shape_text[3][0] = 0;
    for (int64_t i = 0; i < a.ndoc; i++)
        snprintf(shape_text[3] + strlen(shape_text[3]), sizeof shape_text[3] - strlen(shape_text[3]), "%s%lld",
                 i ? "," : "", (long long)a.docs[i]);
    const char *const shape_args[] = {"--seq",       shape_text[0], "--heads",     shape_text[1], "--head-dim",
                                      shape_text[2], "--docs",      shape_text[3], NULL};
    if (quick) reps = reps > 3 ? 3 : reps;
    if (reps < 1) reps = 1;
    if (threads < 1) threads = 1;
    maskpack_isa isa32, isa16;
    maskpack_error e;
    if (maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &isa32, &e) ||
        maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_BF16, MASKPACK_ISA_AUTO, &isa16, &e)) {
        fprintf(stderr, "%s\n", e.message);
        return 1;
    }
    printf("maskpack %s attention benchmark: %d threads, %d alternating pairs per figure (medians; the ratio is "
           "the median of the per-pair ratios); kernels f32 %s, bf16 %s\n",
           maskpack_version_string(), threads, reps, maskpack_isa_name(isa32), maskpack_isa_name(isa16));
    double peak = measure_peak(threads);
    printf("f32 FMA peak (register-resident %s FMA loop on %d threads): %.1f GFLOP/s\n", peak_isa_name(), threads,
           peak);
#define WANT(item) ((only >> (item)) & 1u)
    torch_proc tp = {0};
    /* every item may ask torch except [4] without AMX (ours against ours only) */
    if (use_torch && (WANT(1) || WANT(2) || WANT(3) || WANT(5) || WANT(7) || (WANT(4) && isa16 == MASKPACK_ISA_AMX))) {
        printf("torch baselines: %s %s --serve --threads %d", python, script, threads);
        for (int i = 0; shape_args[i]; i++) printf(" %s", shape_args[i]);
        printf(", one run per request, alternating with ours\n");
        torch_start(&tp, python, script, threads, shape_args);
    }
    side torch_side = {run_torch, NULL, threads, 0, &tp, NULL};

    const int64_t S = a.S, D = a.D, H = a.H;
    const double flops_full = 4.0 * S * S * D * H; /* QK^T and PV, 2 flops per multiply-add */
    problem pn, pc, pb, pp;
    int64_t one[1] = {S};
    if (make_problem(&pn, one, 1, 0, H, D, MASKPACK_F32, threads, 1)) return 1;
    side ours_nomask = {run_ours, &pn, threads, 0, NULL, NULL};

    /* 1. f32 forward, no mask */
    if (!WANT(1)) {
        skipped(1);
    } else {
        torch_side.name = "sdpa_fwd_nomask";
        paired_result r1 = paired(&ours_nomask, 1, &torch_side, 1, reps);
        double gf = flops_full / r1.a / 1e9;
        update_peak(&peak, threads);
        printf("\n[1] f32 forward S=%lld D=%lld batch*heads=%lld, no mask (kernel %s)\n", (long long)S, (long long)D,
               (long long)H, maskpack_isa_name(isa32));
        printf("  ours %.2f ms, %.1f GFLOP/s = %.1f%% of f32 peak (%.1f GFLOP/s, the best measured; target >= 50%%); "
               "torch SDPA %.2f ms -> %.2fx torch "
               "(target >= 1.0x; ratio of the medians %.2fx)\n",
               r1.a * 1e3, gf, 100 * gf / peak, peak, r1.b * 1e3, r1.ratio, r1.b / r1.a);
        verdict(!isnan(r1.ratio), gf >= 0.5 * peak && r1.ratio >= 1.0);
    }

    /* 5. forward + backward vs torch (same problem) */
    if (!WANT(5)) {
        skipped(5);
    } else {
        side ours_fb = {run_ours, &pn, threads, 1, NULL, NULL};
        torch_side.name = "sdpa_fwd_bwd_nomask";
        paired_result r5 = paired(&ours_fb, 1, &torch_side, 1, reps);
        update_peak(&peak, threads);
        printf("\n[5] f32 forward + backward, same shape, no mask\n");
        printf(
            "  ours %.2f ms (%.1f GFLOP/s at 14*S^2*D*BH flops, %.1f%% of peak); torch SDPA fwd+bwd %.2f ms -> %.2fx "
            "faster (target >= 1.3x; ratio of the medians %.2fx)\n",
            r5.a * 1e3, 3.5 * flops_full / r5.a / 1e9, 100 * 3.5 * flops_full / r5.a / 1e9 / peak, r5.b * 1e3, r5.ratio,
            r5.b / r5.a);
        print_fb_bound(3.5 * flops_full, r5.b, peak);
        verdict(!isnan(r5.ratio), r5.ratio >= 1.3);
    }

    /* 2. causal vs non-causal (ours against ours, alternating), then causal vs torch */
    if (!WANT(2)) {
        skipped(2);
    } else {
        if (make_problem(&pc, one, 1, 1, H, D, MASKPACK_F32, threads, 0)) return 1;
        side ours_causal = {run_ours, &pc, threads, 0, NULL, NULL};
        paired_result r2 = paired(&ours_nomask, 1, &ours_causal, 1, reps);
        torch_side.name = "sdpa_fwd_causal";
        paired_result r2t = paired(&ours_causal, 1, &torch_side, 1, reps);
        printf("\n[2] causal f32 forward, same shape\n");
        printf(
            "  ours %.2f ms = %.3fx the non-causal time (%.2f ms; target <= 0.55x); %.1f GFLOP/s on the allowed half; "
            "torch SDPA causal %.2f ms -> %.2fx torch\n",
            r2.b * 1e3, r2.ratio, r2.a * 1e3, flops_full * (S + 1) / (2.0 * S) / r2.b / 1e9, r2t.b * 1e3, r2t.ratio);
        verdict(!isnan(r2.ratio), r2.ratio <= 0.55);
        free_problem(&pc);
    }

    /* 3. the documents (16 of 112..912 tokens in 8192) packed, causal: vs torch's dense mask, and vs the
     * documents alone */
    const int NDOC = (int)a.ndoc;
    if (!WANT(3)) {
        skipped(3);
    } else {
        const int64_t *lens = a.docs;
        int64_t total = 0, shortest = lens[0], longest = lens[0];
        double pairs = 0;
        problem *palone = calloc((size_t)NDOC, sizeof *palone);
        side *alone = calloc((size_t)NDOC, sizeof *alone);
        if (!palone || !alone) return 1;
        for (int i = 0; i < NDOC; i++) {
            total += lens[i];
            shortest = lens[i] < shortest ? lens[i] : shortest;
            longest = lens[i] > longest ? lens[i] : longest;
            pairs += (double)lens[i] * (double)(lens[i] + 1) / 2;
            if (make_problem(&palone[i], &lens[i], 1, 1, H, D, MASKPACK_F32, threads, 0)) return 1;
            alone[i] = (side){run_ours, &palone[i], threads, 0, NULL, NULL};
        }
        if (make_problem(&pp, lens, NDOC, 1, H, D, MASKPACK_F32, threads, 0)) return 1;
        side ours_packed = {run_ours, &pp, threads, 0, NULL, NULL};
        paired_result r3a = paired(&ours_packed, 1, alone, NDOC, reps);
        char packed_name[64]; /* the torch script's name of this measurement, by the number of documents */
        snprintf(packed_name, sizeof packed_name, "sdpa_fwd_packed%d_dense_mask", NDOC);
        torch_side.name = packed_name;
        paired_result r3t =
            paired(&ours_packed, 1, &torch_side, 1, quick ? 1 : (reps + 1) / 2); /* ~2 s per torch run */
        printf("\n[3] %d documents (%lld..%lld tokens) packed into %lld tokens, causal, H=%lld D=%lld, f32 forward\n",
               NDOC, (long long)shortest, (long long)longest, (long long)total, (long long)H, (long long)D);
        printf(
            "  ours %.2f ms (%.1f GFLOP/s on allowed pairs); torch SDPA with the dense block-diagonal mask %.2f ms -> "
            "%.1fx faster (target >= 5x)\n",
            r3t.a * 1e3, 4.0 * pairs * D * H / r3t.a / 1e9, r3t.b * 1e3, r3t.ratio);
        printf("  sum of the %d documents run alone %.2f ms -> packed takes %.3fx that (target <= 1.15x)\n", NDOC,
               r3a.b * 1e3, 1.0 / r3a.ratio);
        verdict(!isnan(r3t.ratio) && !isnan(r3a.ratio), r3t.ratio >= 5 && 1.0 / r3a.ratio <= 1.15);
        free_problem(&pp);
        for (int i = 0; i < NDOC; i++) free_problem(&palone[i]);
        free(palone);
        free(alone);
    }

    /* 4. bf16 forward on AMX vs our f32 forward (alternating), and vs torch bf16. The target is AMX's:
     * on a CPU without AMX it cannot be measured, which is said (the bf16 kernel that does run is
     * still timed, for information, but never judged against the AMX target). */
    if (!WANT(4)) {
        skipped(4);
    } else if (isa16 != MASKPACK_ISA_AMX) {
        printf("\n[4] bf16 forward on AMX: not measurable: this CPU has no AMX (bf16 runs on the %s kernel, "
               "widened to f32)\n",
               maskpack_isa_name(isa16));
        if (make_problem(&pb, one, 1, 0, H, D, MASKPACK_BF16, threads, 0)) return 1;
        side ours_bf16 = {run_ours, &pb, threads, 0, NULL, NULL};
        paired_result r4 = paired(&ours_bf16, 1, &ours_nomask, 1, reps);
        printf("  for information: bf16 on %s %.2f ms = %.2fx our f32 forward (%.2f ms)\n", maskpack_isa_name(isa16),
               r4.a * 1e3, r4.ratio, r4.b * 1e3);
        verdict(0, 0);
        free_problem(&pb);
    } else {
        if (make_problem(&pb, one, 1, 0, H, D, MASKPACK_BF16, threads, 0)) return 1;
        side ours_bf16 = {run_ours, &pb, threads, 0, NULL, NULL};
        paired_result r4 = paired(&ours_bf16, 1, &ours_nomask, 1, reps);
        torch_side.name = "sdpa_fwd_nomask_bf16";
        paired_result r4t = paired(&ours_bf16, 1, &torch_side, 1, reps);
        printf("\n[4] bf16 forward (%s), S=%lld D=%lld batch*heads=%lld, no mask\n", maskpack_isa_name(isa16),
               (long long)S, (long long)D, (long long)H);
        const double peak_amx = bench_amx_peak(threads, 200 * 1000, 25);
        printf("  ours %.2f ms, %.1f GFLOP/s = %.1f%% of the AMX tile peak (%.1f GFLOP/s, TDPBF16PS loop) = %.2fx our "
               "f32 forward (%.2f ms; target >= 3x); torch SDPA bf16 %.2f ms -> %.2fx torch\n",
               r4.a * 1e3, flops_full / r4.a / 1e9, 100 * flops_full / r4.a / 1e9 / peak_amx, peak_amx, r4.ratio,
               r4.b * 1e3, r4t.b * 1e3, r4t.ratio);
        verdict(!isnan(r4.ratio), r4.ratio >= 3);
        free_problem(&pb);
    }
    /* 6. every kernel of the attention table this CPU runs (the table maskpack_kernel_list reads),
     * forward and backward of the f32 and bf16 problems of [1] and [4], each against the automatic
     * choice: for information, no target */
    if (!WANT(6)) {
        skipped(6);
    } else {
        maskpack_kernel_info info[32];
        size_t n_info = 0;
        if (maskpack_kernel_list(info, 32, &n_info, &e)) {
            fprintf(stderr, "%s\n", e.message);
            return 1;
        }
        printf("\n[6] every attention kernel this CPU runs, S=%lld D=%lld batch*heads=%lld, no mask (forward + "
               "backward, each against the automatic choice)\n",
               (long long)S, (long long)D, (long long)H);
        const int reps6 = reps > 3 ? 3 : reps;
        for (int bf = 0; bf < 2; bf++) {
            problem pk, pa;
            const maskpack_dtype dt = bf ? MASKPACK_BF16 : MASKPACK_F32;
            if (make_problem(&pk, one, 1, 0, H, D, dt, threads, 1) ||
                make_problem(&pa, one, 1, 0, H, D, dt, threads, 1))
                return 1;
            side kern = {run_ours, &pk, threads, 1, NULL, NULL}, autos = {run_ours, &pa, threads, 1, NULL, NULL};
            for (size_t i = 0; i < n_info && i < 32; i++) {
                if (info[i].family != MASKPACK_KERNEL_ATTENTION || !info[i].available) continue;
                if (info[i].isa == MASKPACK_ISA_REF) continue; /* minutes at this size */
                pk.isa = info[i].isa;
                paired_result r6 = paired(&kern, 1, &autos, 1, reps6);
                printf("  %-4s %-22s %8.2f ms = %.3fx the automatic choice (%.2f ms)\n", bf ? "bf16" : "f32",
                       info[i].name, r6.a * 1e3, 1.0 / r6.ratio, r6.b * 1e3);
            }
            free_problem(&pk);
            free_problem(&pa);
        }
    }

    /* 7. bf16 training (issue #37): forward + backward in bf16, no mask and causal, the automatic
     * choice against torch's bf16 SDPA forward + backward (alternating), and the AVX512-BF16 kernels by
     * name (bf16 pairs in every product) against the automatic choice where the CPU has them. Targets:
     * >= 1.5x torch with AMX, >= 1.2x with AVX512-BF16 (the better of the two runs). The fraction of
     * peak is of the measured f32 FMA peak for a run that widens bf16 to f32 and of the measured
     * VDPBF16PS peak for the bf16 dot-product kernels. */
    if (!WANT(7)) {
        skipped(7);
    } else {
        maskpack_isa byname;
        const int has_dots = maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_BF16, MASKPACK_ISA_AVX512_BF16,
                                                  &byname, &e) == MASKPACK_OK &&
                             byname == MASKPACK_ISA_AVX512_BF16;
        const double peak16 = has_dots ? bench_bf16dot_peak(threads, 500 * 1000, 25) : 0.0;
        update_peak(&peak, threads);
        printf("\n[7] bf16 forward + backward, S=%lld D=%lld batch*heads=%lld (automatic choice: %s)\n", (long long)S,
               (long long)D, (long long)H, maskpack_isa_name(isa16));
        if (has_dots)
            printf("  bf16 dot-product peak (register-resident VDPBF16PS loop on %d threads): %.1f GFLOP/s = %.2fx the "
                   "f32 FMA peak (%.1f)\n",
                   threads, peak16, peak16 / peak, peak);
        /* with AMX the automatic choice runs forward and backward on tiles: its fraction is of their peak */
        const double peak_amx = isa16 == MASKPACK_ISA_AMX ? bench_amx_peak(threads, 200 * 1000, 25) : 0.0;
        if (isa16 == MASKPACK_ISA_AMX)
            printf("  AMX tile peak (register-resident TDPBF16PS loop on %d threads): %.1f GFLOP/s = %.2fx the f32 FMA "
                   "peak (%.1f)\n",
                   threads, peak_amx, peak_amx / peak, peak);
        for (int causal = 0; causal <= 1; causal++) {
            problem p16, p16n;
            if (make_problem(&p16, one, 1, causal, H, D, MASKPACK_BF16, threads, 1)) return 1;
            side ours16 = {run_ours, &p16, threads, 1, NULL, NULL};
            torch_side.name = causal ? "sdpa_fwd_bwd_causal_bf16" : "sdpa_fwd_bwd_nomask_bf16";
            paired_result r7 = paired(&ours16, 1, &torch_side, 1, reps);
            const double fl = 3.5 * flops_full * (causal ? (S + 1) / (2.0 * S) : 1.0), gf = fl / r7.a / 1e9;
            const int amx = isa16 == MASKPACK_ISA_AMX;
            printf("  %s: ours %.2f ms, %.1f GFLOP/s = %.1f%% of the %s peak; torch SDPA bf16 fwd+bwd %.2f ms -> %.2fx "
                   "torch\n",
                   causal ? "causal " : "no mask", r7.a * 1e3, gf, 100 * gf / (amx ? peak_amx : peak),
                   amx ? "AMX tile" : "f32 FMA", r7.b * 1e3, r7.ratio);
            double best = r7.ratio;
            if (has_dots) {
                if (make_problem(&p16n, one, 1, causal, H, D, MASKPACK_BF16, threads, 1)) return 1;
                p16n.isa = MASKPACK_ISA_AVX512_BF16;
                side byn = {run_ours, &p16n, threads, 1, NULL, NULL};
                paired_result rn = paired(&byn, 1, &ours16, 1, reps);
                const double gfn = fl / rn.a / 1e9;
                printf("           AVX512-BF16 kernels by name: %.2f ms, %.2fx the automatic choice's speed, %.1f "
                       "GFLOP/s = "
                       "%.1f%% of the VDPBF16PS peak -> %.2fx torch (ratio of the medians)\n",
                       rn.a * 1e3, rn.ratio, gfn, 100 * gfn / peak16, r7.b / rn.a);
                if (r7.b / rn.a > best) best = r7.b / rn.a;
                free_problem(&p16n);
            }
            if (amx) {
                printf("  target >= 1.5x torch (AMX)\n");
                verdict(!isnan(r7.ratio), r7.ratio >= 1.5);
            } else if (has_dots) {
                printf("  target >= 1.2x torch (AVX512-BF16): best of the two %.2fx\n", best);
                verdict(!isnan(best), best >= 1.2);
            } else {
                printf("  target not measurable: this CPU has neither AMX nor AVX512-BF16 (bf16 runs widened)\n");
            }
            free_problem(&p16);
        }
    }
    free_problem(&pn);
    torch_stop(&tp);

    FILE *la = fopen("/proc/loadavg", "r");
    char load[128] = "n/a";
    if (la) {
        if (!fgets(load, sizeof load, la)) strcpy(load, "n/a");
        fclose(la);
        load[strcspn(load, "\n")] = 0;
    }
    if (only_given)
        printf("\n%d of %d targets met, %d items skipped (load average at the end: %s)\n", n_met, n_targets,
               7 - __builtin_popcount(only), load);
    else
        printf("\n%d of %d targets met (load average at the end: %s)\n", n_met, n_targets, load);
    return 0;
}
