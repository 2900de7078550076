/* test_hosted_team.c: a worker team hosted by the caller's own thread pool
 * (maskpack_workers_create_hosted) gives every kernel family and the relayout the bits of a team of
 * maskpack's own threads, whichever way the host runs the participants: on threads of its own (a
 * pthread host, and OpenMP where the compiler has it), one after another on the caller, or only the
 * first (a host with no thread to spare). The host is asked for a region on every run of a team of
 * more than one participant; never in a child process after fork(); and bad arguments are refused. */
#define _GNU_SOURCE
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

/* ---- hosts ----------------------------------------------------------------------------------------- */

typedef struct {
    _Atomic int regions;     /* parallel regions asked for */
    _Atomic int runs;        /* participants run */
    _Atomic int overlap_bad; /* one index running twice at once */
    _Atomic int busy[MASKPACK_MAX_THREADS];
} host_stats;

static void note_run(host_stats *h, int t, int enter) {
    if (enter) {
        if (atomic_fetch_add(&h->busy[t], 1) != 0) atomic_store(&h->overlap_bad, 1);
        atomic_fetch_add(&h->runs, 1);
    } else {
        atomic_fetch_sub(&h->busy[t], 1);
    }
}

typedef struct {
    host_stats *h;
    maskpack_task_fn task;
    void *ctx;
    int t;
} thread_arg;

static void *host_thread(void *p) {
    thread_arg *a = p;
    note_run(a->h, a->t, 1);
    a->task(a->ctx, a->t);
    note_run(a->h, a->t, 0);
    return NULL;
}

/* participants 1 .. n-1 on threads started for the region, 0 on the caller */
static void pthread_host(void *host, maskpack_task_fn task, void *ctx, int n) {
    host_stats *h = host;
    atomic_fetch_add(&h->regions, 1);
    pthread_t th[MASKPACK_MAX_THREADS];
    thread_arg args[MASKPACK_MAX_THREADS];
    int started[MASKPACK_MAX_THREADS] = {0};
    for (int t = 1; t < n; t++) {
        args[t] = (thread_arg){h, task, ctx, t};
        started[t] = pthread_create(&th[t], NULL, host_thread, &args[t]) == 0;
    }
    args[0] = (thread_arg){h, task, ctx, 0};
    host_thread(&args[0]);
    for (int t = 1; t < n; t++)
        if (started[t])
            pthread_join(th[t], NULL);
        else
            host_thread(&args[t]);
}

/* every participant on the caller, the last first */
static void serial_host(void *host, maskpack_task_fn task, void *ctx, int n) {
    host_stats *h = host;
    atomic_fetch_add(&h->regions, 1);
    for (int t = n - 1; t >= 0; t--) {
        note_run(h, t, 1);
        task(ctx, t);
        note_run(h, t, 0);
    }
}

/* only participant 0: a host with no thread to spare */
static void lone_host(void *host, maskpack_task_fn task, void *ctx, int n) {
    host_stats *h = host;
    (void)n;
    atomic_fetch_add(&h->regions, 1);
    note_run(h, 0, 1);
    task(ctx, 0);
    note_run(h, 0, 0);
}

#if defined(_OPENMP)
static void omp_host(void *host, maskpack_task_fn task, void *ctx, int n) {
    host_stats *h = host;
    atomic_fetch_add(&h->regions, 1);
#pragma omp parallel num_threads(n)
    {
        int t = omp_get_thread_num();
        note_run(h, t, 1);
        task(ctx, t);
        note_run(h, t, 0);
    }
}
#endif

typedef struct {
    const char *name;
    maskpack_parallel_fn fn;
} host_kind;

static const host_kind HOSTS[] = {
    {"pthread", pthread_host},
    {"serial", serial_host},
    {"lone", lone_host},
#if defined(_OPENMP)
    {"openmp", omp_host},
#endif
};
enum { N_HOSTS = sizeof HOSTS / sizeof *HOSTS };

/* ---- data -------------------------------------------------------------------------------------------- */

static test_rng rng = {88172645463325252ull};
static float rnd(void) { return (float)((test_rng_next(&rng) >> 11) & 0xffffff) / 16777216.0f - 0.5f; }
static float *rand_floats(int64_t n, float scale, float offset) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = rnd() * scale + offset;
    return p;
}
static maskpack_tensor tens(float *p, int32_t nd, int64_t a, int64_t b, int64_t c) {
    int64_t s[3] = {a, b, c};
    return maskpack_tensor_contiguous(p, MASKPACK_F32, nd, s);
}
static int same_floats(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

static maskpack_layout *packed_layout(void) {
    /* lengths across block edges: several query blocks, short documents, a long one */
    const int64_t len[6] = {131, 17, 64, 1, 260, 47};
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_rule r = maskpack_rule_default();
    CHECK_OK(maskpack_layout_from_lengths(len, 6, MASKPACK_PLACE_PACKED, 0, &r, &L, &e), e);
    return L;
}

/* ---- the families, each: a team's result into the given buffers --------------------------------------- */

enum { HQ = 4, HKV = 2, D = 32, H = 2, HV = 4, KD = 16, VD = 24, C = 40, W = 4 };

typedef struct {
    int64_t T, N;
    float *q, *k, *v, *dout;             /* attention */
    float *gq, *gk, *gv, *gg, *gb, *gdo; /* GDN */
    float *x, *w, *dy;                   /* conv */
} inputs;

static inputs make_inputs(const maskpack_layout *L) {
    inputs in;
    in.T = maskpack_layout_q_width(L);
    in.N = (int64_t)maskpack_layout_n_segments(L);
    in.q = rand_floats(in.T * HQ * D, 2, 0);
    in.k = rand_floats(in.T * HKV * D, 2, 0);
    in.v = rand_floats(in.T * HKV * D, 2, 0);
    in.dout = rand_floats(in.T * HQ * D, 2, 0);
    in.gq = rand_floats(in.T * H * KD, 2, 0);
    in.gk = rand_floats(in.T * H * KD, 2, 0);
    in.gv = rand_floats(in.T * HV * VD, 2, 0);
    in.gg = rand_floats(in.T * HV, 0.5f, -0.3f);
    in.gb = rand_floats(in.T * HV, 0.5f, 0.5f);
    in.gdo = rand_floats(in.T * HV * VD, 2, 0);
    in.x = rand_floats(in.T * C, 2, 0);
    in.w = rand_floats(C * W, 1, 0);
    in.dy = rand_floats(in.T * C, 2, 0);
    return in;
}

static void free_inputs(inputs *in) {
    float *all[] = {in->q,  in->k,  in->v,   in->dout, in->gq, in->gk, in->gv,
                    in->gg, in->gb, in->gdo, in->x,    in->w,  in->dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* every output of every family, concatenated, for one team */
typedef struct {
    float *buf;
    int64_t n;
} result;

static result run_all(const maskpack_layout *L, const inputs *in, maskpack_workers *team) {
    const int64_t T = in->T, N = in->N;
    const int64_t n_attn = T * HQ * D * 2 + HQ * T + T * HKV * D * 2;
    const int64_t n_gdn = T * HV * VD + N * HV * KD * VD + T * H * KD * 2 + T * HV * VD + T * HV * 2 + N * HV * KD * VD;
    const int64_t n_conv = T * C + N * C * (W - 1) + T * C + C * W;
    maskpack_layout *P = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_padded_of(L, MASKPACK_PLACE_RIGHT, 0, &P, &e), e);
    const int64_t B = maskpack_layout_n_rows(P), S = maskpack_layout_q_width(P);
    const int64_t n_pad = B * S * C;
    result r;
    r.n = n_attn + n_gdn + n_conv + n_pad;
    r.buf = calloc((size_t)r.n, sizeof(float));
    float *o = r.buf;
    /* attention forward and backward (GQA, causal) */
    {
        maskpack_tensor q = tens(in->q, 3, T, HQ, D), k = tens(in->k, 3, T, HKV, D), v = tens(in->v, 3, T, HKV, D);
        maskpack_tensor dout = tens(in->dout, 3, T, HQ, D);
        maskpack_tensor out = tens(o, 3, T, HQ, D), dq = tens(o + T * HQ * D, 3, T, HQ, D);
        int64_t ls[2] = {HQ, T};
        maskpack_tensor lse = maskpack_tensor_contiguous(o + 2 * T * HQ * D, MASKPACK_F32, 2, ls);
        maskpack_tensor dk = tens(o + 2 * T * HQ * D + HQ * T, 3, T, HKV, D);
        maskpack_tensor dv = tens(o + 2 * T * HQ * D + HQ * T + T * HKV * D, 3, T, HKV, D);
        CHECK_OK(maskpack_attention_forward_on(L, &q, &k, &v, 0, 0, &out, &lse, NULL, team, NULL, 0, &e), e);
        CHECK_OK(maskpack_attention_backward_on(L, &dout, &q, &k, &v, &out, &lse, 0, 0, &dq, &dk, &dv, NULL, team, NULL,
                                                0, &e),
                 e);
        o += n_attn;
    }
    /* the gated delta rule forward (chunked) and backward */
    {
        maskpack_tensor q = tens(in->gq, 3, T, H, KD), k = tens(in->gk, 3, T, H, KD), v = tens(in->gv, 3, T, HV, VD);
        int64_t gs[2] = {T, HV}, ss[4] = {N, HV, KD, VD};
        maskpack_tensor g = maskpack_tensor_contiguous(in->gg, MASKPACK_F32, 2, gs);
        maskpack_tensor beta = maskpack_tensor_contiguous(in->gb, MASKPACK_F32, 2, gs);
        maskpack_gdn_inputs gi = {&q, &k, &v, &g, &beta, NULL};
        maskpack_gdn_options opts = maskpack_gdn_options_default();
        maskpack_tensor out = tens(o, 3, T, HV, VD);
        maskpack_tensor fin = maskpack_tensor_contiguous(o + T * HV * VD, MASKPACK_F32, 4, ss);
        CHECK_OK(maskpack_gdn_forward_on(L, &gi, &opts, &out, &fin, team, NULL, 0, &e), e);
        float *b = o + T * HV * VD + N * HV * KD * VD;
        maskpack_tensor dq = tens(b, 3, T, H, KD), dk = tens(b + T * H * KD, 3, T, H, KD);
        maskpack_tensor dv = tens(b + 2 * T * H * KD, 3, T, HV, VD);
        maskpack_tensor dg = maskpack_tensor_contiguous(b + 2 * T * H * KD + T * HV * VD, MASKPACK_F32, 2, gs);
        maskpack_tensor db = maskpack_tensor_contiguous(b + 2 * T * H * KD + T * HV * VD + T * HV, MASKPACK_F32, 2, gs);
        maskpack_tensor dh0 =
            maskpack_tensor_contiguous(b + 2 * T * H * KD + T * HV * VD + 2 * T * HV, MASKPACK_F32, 4, ss);
        maskpack_tensor d_o = tens(in->gdo, 3, T, HV, VD);
        maskpack_gdn_grads gr = {&dq, &dk, &dv, &dg, &db, &dh0};
        CHECK_OK(maskpack_gdn_backward_on(L, &gi, &d_o, NULL, &opts, &gr, team, NULL, 0, &e), e);
        o += n_gdn;
    }
    /* the causal conv1d forward (SiLU) and backward */
    {
        int64_t xs[2] = {T, C}, ws[2] = {C, W}, ss[3] = {N, C, W - 1};
        maskpack_tensor x = maskpack_tensor_contiguous(in->x, MASKPACK_F32, 2, xs);
        maskpack_tensor w = maskpack_tensor_contiguous(in->w, MASKPACK_F32, 2, ws);
        maskpack_tensor y = maskpack_tensor_contiguous(o, MASKPACK_F32, 2, xs);
        maskpack_tensor st = maskpack_tensor_contiguous(o + T * C, MASKPACK_F32, 3, ss);
        maskpack_tensor dy = maskpack_tensor_contiguous(in->dy, MASKPACK_F32, 2, xs);
        maskpack_tensor dx = maskpack_tensor_contiguous(o + T * C + N * C * (W - 1), MASKPACK_F32, 2, xs);
        maskpack_tensor dw = maskpack_tensor_contiguous(o + 2 * T * C + N * C * (W - 1), MASKPACK_F32, 2, ws);
        CHECK_OK(maskpack_causal_conv1d_on(L, &x, &w, NULL, 1, NULL, team, &y, &st, NULL, 0, &e), e);
        CHECK_OK(
            maskpack_causal_conv1d_backward_on(L, &x, &w, NULL, 1, &dy, NULL, NULL, team, &dx, &dw, NULL, NULL, 0, &e),
            e);
        o += n_conv;
    }
    /* the move to padded rows (the conv's input: a pad value, strided chunks for the team) */
    {
        maskpack_relayout_plan *plan = NULL;
        const maskpack_layout *src[1] = {L};
        CHECK_OK(maskpack_relayout_plan_create(src, 1, P, &plan, &e), e);
        int64_t xs[2] = {T, C}, ps[3] = {B, S, C};
        maskpack_tensor x = maskpack_tensor_contiguous(in->x, MASKPACK_F32, 2, xs);
        maskpack_tensor out = maskpack_tensor_contiguous(o, MASKPACK_F32, 3, ps);
        const maskpack_tensor *xv[1] = {&x};
        float pad = -1.5f;
        CHECK_OK(maskpack_relayout_execute_on(plan, xv, &out, &pad, team, &e), e);
        maskpack_relayout_plan_free(plan);
    }
    maskpack_layout_free(P);
    return r;
}

/* ---- tests ------------------------------------------------------------------------------------------- */

static void test_every_host_gives_the_same_bits(void) {
    maskpack_layout *L = packed_layout();
    if (!L) return;
    inputs in = make_inputs(L);
    maskpack_error e;
    for (int n = 1; n <= 4; n++) {
        maskpack_workers *own = NULL;
        CHECK_OK(maskpack_workers_create(n, &own, &e), e);
        result want = run_all(L, &in, own);
        for (int hk = 0; hk < N_HOSTS; hk++) {
            host_stats *hs = calloc(1, sizeof *hs);
            maskpack_workers *team = NULL;
            CHECK_OK(maskpack_workers_create_hosted(n, HOSTS[hk].fn, hs, &team, &e), e);
            CHECK_EQ(maskpack_workers_threads(team), n);
            for (int rep = 0; rep < 2; rep++) {
                result got = run_all(L, &in, team);
                CHECK(got.n == want.n && same_floats(got.buf, want.buf, want.n));
                if (!same_floats(got.buf, want.buf, want.n))
                    fprintf(stderr, "  differs: host %s, %d participants, run %d\n", HOSTS[hk].name, n, rep);
                free(got.buf);
            }
            /* a team of one runs on the caller; a larger one asks the host for its regions */
            if (n == 1)
                CHECK_EQ(atomic_load(&hs->regions), 0);
            else
                CHECK(atomic_load(&hs->regions) > 0);
            /* every region asks for all n participants (the lone host runs the first only) */
            CHECK_EQ(atomic_load(&hs->runs), atomic_load(&hs->regions) * (HOSTS[hk].fn == lone_host ? 1 : n));
            CHECK_EQ(atomic_load(&hs->overlap_bad), 0);
            maskpack_workers_free(team);
            free(hs);
        }
        free(want.buf);
        maskpack_workers_free(own);
    }
    free_inputs(&in);
    maskpack_layout_free(L);
}

/* In a child process after fork() the host's threads may not exist (OpenMP's do not): the work runs
 * on the caller and the host is never asked. */
static void test_fork_child_runs_alone(void) {
    maskpack_layout *L = packed_layout();
    if (!L) return;
    inputs in = make_inputs(L);
    maskpack_error e;
    host_stats *hs = calloc(1, sizeof *hs);
    maskpack_workers *team = NULL;
    CHECK_OK(maskpack_workers_create_hosted(3, pthread_host, hs, &team, &e), e);
    result want = run_all(L, &in, NULL);
    int regions_before = atomic_load(&hs->regions);
    pid_t pid = fork();
    if (pid == 0) {
        result got = run_all(L, &in, team);
        int ok =
            got.n == want.n && same_floats(got.buf, want.buf, want.n) && atomic_load(&hs->regions) == regions_before;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* and the parent's team still asks its host */
    result got = run_all(L, &in, team);
    CHECK(same_floats(got.buf, want.buf, want.n));
    CHECK(atomic_load(&hs->regions) > regions_before);
    free(got.buf);
    free(want.buf);
    maskpack_workers_free(team);
    free(hs);
    free_inputs(&in);
    maskpack_layout_free(L);
}

static void test_refusals(void) {
    maskpack_error e;
    maskpack_workers *team = NULL;
    host_stats hs;
    memset(&hs, 0, sizeof hs);
    CHECK_STATUS(maskpack_workers_create_hosted(2, NULL, &hs, &team, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_MSG(e, "parallel");
    CHECK_STATUS(maskpack_workers_create_hosted(2, serial_host, &hs, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_workers_create_hosted(0, serial_host, &hs, &team, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "n_threads: expected in [1, 256], found 0");
    CHECK_STATUS(maskpack_workers_create_hosted(MASKPACK_MAX_THREADS + 1, serial_host, &hs, &team, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(team == NULL);
}

/* A move below the team threshold (64 MiB, src/relayout/relayout.c) stays on the caller's thread: the host is
 * asked for no region, since on a pool whose region waits for every thread one thread the scheduler has
 * not run yet costs a time slice (bench/bench_small_moves.py). From the threshold up it splits. */
static void test_small_moves_stay_on_the_caller(void) {
    maskpack_error e;
    host_stats *hs = calloc(1, sizeof *hs);
    maskpack_workers *team = NULL;
    CHECK_OK(maskpack_workers_create_hosted(2, pthread_host, hs, &team, &e), e);
    const int64_t C = 128, widths[2] = {1024, (int64_t)1 << 16}; /* 1 MiB and 64 MiB of float32 */
    for (int big = 0; big < 2; big++) {
        const int64_t W = widths[big];
        maskpack_segment segs[2] = {{0, 0, W, 0, W}, {1, 0, W, 0, W}};
        maskpack_layout *L = NULL, *P = NULL;
        CHECK_OK(maskpack_layout_from_segments(segs, 2, 2, W, W, 0, NULL, &L, &e), e);
        CHECK_OK(maskpack_layout_packed_of(L, &P, &e), e);
        maskpack_relayout_plan *plan = NULL;
        const maskpack_layout *src[1] = {L};
        CHECK_OK(maskpack_relayout_plan_create(src, 1, P, &plan, &e), e);
        float *x = malloc(sizeof(float) * (size_t)(2 * W * C)), *y = malloc(sizeof(float) * (size_t)(2 * W * C));
        for (int64_t i = 0; i < 2 * W * C; i++) x[i] = (float)i;
        int64_t xs[3] = {2, W, C}, ys[2] = {2 * W, C};
        maskpack_tensor xt = maskpack_tensor_contiguous(x, MASKPACK_F32, 3, xs);
        maskpack_tensor yt = maskpack_tensor_contiguous(y, MASKPACK_F32, 2, ys);
        const maskpack_tensor *xv[1] = {&xt};
        int before = atomic_load(&hs->regions);
        CHECK_OK(maskpack_relayout_execute_on(plan, xv, &yt, NULL, team, &e), e);
        CHECK_EQ(atomic_load(&hs->regions) - before, big);             /* 1 MiB: none; 64 MiB: one region */
        CHECK(memcmp(x, y, sizeof(float) * (size_t)(2 * W * C)) == 0); /* two full rows: the same bytes */
        free(x);
        free(y);
        maskpack_relayout_plan_free(plan);
        maskpack_layout_free(P);
        maskpack_layout_free(L);
    }
    maskpack_workers_free(team);
    free(hs);
}

int main(void) {
    test_refusals();
    test_small_moves_stay_on_the_caller();
    test_every_host_gives_the_same_bits();
    test_fork_child_runs_alone();
    char note[64];
    snprintf(note, sizeof note, "hosts: %d%s", (int)N_HOSTS,
#if defined(_OPENMP)
             " (OpenMP among them)"
#else
             " (no OpenMP in this build)"
#endif
    );
    return check_report_note("test_hosted_team", note);
}
