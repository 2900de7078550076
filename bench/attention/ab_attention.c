/* ab_attention.c: an attention call before and after a change, paired in one process: two builds of
 * the library are dlopen'ed side by side (each resolving its own symbols: RTLD_LOCAL, neither linked)
 * and their calls interleaved iteration by iteration on the same inputs, which goes first
 * alternating, so that a busy moment of a shared machine hits both alike. BEFORE runs the plain
 * maskpack_attention_forward / _backward with n_threads; AFTER runs the operator
 * (maskpack_attention_op_*) on a team of that many threads created once ("op"), or the same plain
 * calls ("plain": the kernels themselves, for a check that no kernel got slower).
 *
 * Usage: ab_attention BEFORE.so AFTER.so [op|plain (op)] [threads (2)] [iterations (200)]
 *        [documents tokens H D (4 64 8 128)] [causal (1)]
 * -> the medians of both and of the per-iteration ratio before / after, forward and backward (f32,
 * packed, Hkv = H). Exit status 0 whatever the numbers (it measures). A build from before
 * maskpack_kernel_options (its calls took int n_threads, its op_create isa and n_threads) is called
 * through those signatures: it has no maskpack_kernel_options_default. */
#define _GNU_SOURCE
#include "maskpack.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double med(double *x, int n) {
    qsort(x, n, sizeof *x, cmp);
    return x[n / 2];
}
static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}
/* A C-order tensor (the library's own helper is not linked: both builds are dlopen'ed). */
static maskpack_tensor contiguous(void *data, int32_t ndim, const int64_t *shape) {
    maskpack_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = MASKPACK_F32;
    t.ndim = ndim;
    int64_t st = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) t.shape[d] = shape[d], t.strides[d] = st, st *= shape[d];
    return t;
}
#define SYM(h, name) ((__typeof__(&name))dlsym(h, #name))
/* The calls of a build before maskpack_kernel_options. */
typedef maskpack_status (*old_fwd_fn)(const maskpack_layout *, const maskpack_tensor *, const maskpack_tensor *,
                                      const maskpack_tensor *, double, double, maskpack_tensor *, maskpack_tensor *,
                                      int, void *, size_t, maskpack_error *);
typedef maskpack_status (*old_bwd_fn)(const maskpack_layout *, const maskpack_tensor *, const maskpack_tensor *,
                                      const maskpack_tensor *, const maskpack_tensor *, const maskpack_tensor *,
                                      const maskpack_tensor *, double, double, maskpack_tensor *, maskpack_tensor *,
                                      maskpack_tensor *, int, void *, size_t, maskpack_error *);
typedef maskpack_status (*old_op_create_fn)(const maskpack_layout *, int64_t, int64_t, int64_t, maskpack_dtype,
                                            maskpack_isa, int, maskpack_attention_op **, maskpack_error *);
typedef struct lib {
    maskpack_layout *L;
    int old_abi; /* no maskpack_kernel_options: old_fwd / old_bwd */
    old_fwd_fn old_fwd;
    old_bwd_fn old_bwd;
    __typeof__(&maskpack_attention_forward) fwd;
    __typeof__(&maskpack_attention_backward) bwd;
    __typeof__(&maskpack_attention_op_forward) op_fwd;
    __typeof__(&maskpack_attention_op_backward) op_bwd;
    maskpack_attention_op *op;
    maskpack_workers *team;
} lib;
int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BEFORE.so AFTER.so [op|plain] [threads] [iterations] [docs tokens H D] [causal]\n",
                argv[0]);
        return 2;
    }
    const int use_op = argc > 3 ? strcmp(argv[3], "plain") != 0 : 1;
    int threads = argc > 4 ? atoi(argv[4]) : 2, iters = argc > 5 ? atoi(argv[5]) : 200;
    int64_t shape[4] = {4, 64, 8, 128};
    for (int i = 0; i < 4 && 6 + i < argc; i++) shape[i] = atoll(argv[6 + i]);
    const int causal = argc > 10 ? atoi(argv[10]) : 1;
    const int64_t N = shape[0], T = shape[0] * shape[1], H = shape[2], D = shape[3];
    if (threads < 1 || iters < 1 || N < 1 || N > 64 || shape[1] < 1 || H < 1 || D < 1) return 2;
    int64_t lens[64];
    for (int64_t i = 0; i < N; i++) lens[i] = shape[1];
    lib libs[2];
    maskpack_error e;
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            puts(dlerror());
            return 1;
        }
        lib *l = &libs[i];
        memset(l, 0, sizeof *l);
        maskpack_rule r = SYM(h, maskpack_rule_default)();
        r.causal = causal;
        if (SYM(h, maskpack_layout_from_lengths)(lens, (size_t)N, MASKPACK_PLACE_PACKED, 0, &r, &l->L, &e)) {
            puts(e.message);
            return 1;
        }
        l->old_abi = dlsym(h, "maskpack_kernel_options_default") == NULL;
        l->fwd = SYM(h, maskpack_attention_forward);
        l->bwd = SYM(h, maskpack_attention_backward);
        l->old_fwd = (old_fwd_fn)dlsym(h, "maskpack_attention_forward");
        l->old_bwd = (old_bwd_fn)dlsym(h, "maskpack_attention_backward");
        if (i == 1 && use_op) {
            l->op_fwd = SYM(h, maskpack_attention_op_forward);
            l->op_bwd = SYM(h, maskpack_attention_op_backward);
            if (!l->op_fwd || !l->op_bwd) {
                fprintf(stderr, "%s: no maskpack_attention_op_forward / _backward\n", argv[2]);
                return 1;
            }
            const maskpack_kernel_options ko = {threads, MASKPACK_ISA_AUTO};
            if (l->old_abi ? ((old_op_create_fn)dlsym(h, "maskpack_attention_op_create"))(
                                 l->L, H, H, D, MASKPACK_F32, MASKPACK_ISA_AUTO, threads, &l->op, &e)
                           : SYM(h, maskpack_attention_op_create)(l->L, H, H, D, MASKPACK_F32, &ko, &l->op, &e)) {
                puts(e.message);
                return 1;
            }
            if (threads > 1 && SYM(h, maskpack_workers_create)(threads, &l->team, &e)) return 1;
        }
    }
    unsigned sd = 1;
    const size_t n = (size_t)(T * H * D);
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4), *lse = malloc(T * H * 4);
    float *dO = malloc(n * 4), *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4);
    for (size_t i = 0; i < n; i++) q[i] = frand(&sd), k[i] = frand(&sd), v[i] = frand(&sd), dO[i] = frand(&sd);
    int64_t s3[3] = {T, H, D}, s2[2] = {H, T};
    maskpack_tensor tq = contiguous(q, 3, s3);
    maskpack_tensor tk = contiguous(k, 3, s3);
    maskpack_tensor tv = contiguous(v, 3, s3);
    maskpack_tensor to = contiguous(o, 3, s3);
    maskpack_tensor tdo = contiguous(dO, 3, s3);
    maskpack_tensor tdq = contiguous(dq, 3, s3);
    maskpack_tensor tdk = contiguous(dk, 3, s3);
    maskpack_tensor tdv = contiguous(dv, 3, s3);
    maskpack_tensor tl = contiguous(lse, 2, s2);
    const maskpack_kernel_options ko = {threads, MASKPACK_ISA_AUTO};
    double *rf = malloc(iters * 8), *rb = malloc(iters * 8), *bf = malloc(iters * 8), *bb = malloc(iters * 8),
           *af = malloc(iters * 8), *abw = malloc(iters * 8);
    for (int it = -3; it < iters; it++) {
        double tb0 = 0, tb1 = 0, ta0 = 0, ta1 = 0;
        for (int side = 0; side < 2; side++) {
            const int which = (it & 1) ? 1 - side : side; /* alternate who goes first */
            lib *l = &libs[which];
            const int op = which && use_op;
            double t0 = now();
            maskpack_status s1 = op           ? l->op_fwd(l->op, &tq, &tk, &tv, 0, 0, &to, &tl, l->team, NULL, 0, &e)
                                 : l->old_abi ? l->old_fwd(l->L, &tq, &tk, &tv, 0, 0, &to, &tl, threads, NULL, 0, &e)
                                              : l->fwd(l->L, &tq, &tk, &tv, 0, 0, &to, &tl, &ko, NULL, 0, &e);
            double t1 = now();
            maskpack_status s2 =
                op ? l->op_bwd(l->op, &tdo, &tq, &tk, &tv, &to, &tl, 0, 0, &tdq, &tdk, &tdv, l->team, NULL, 0, &e)
                : l->old_abi
                    ? l->old_bwd(l->L, &tdo, &tq, &tk, &tv, &to, &tl, 0, 0, &tdq, &tdk, &tdv, threads, NULL, 0, &e)
                    : l->bwd(l->L, &tdo, &tq, &tk, &tv, &to, &tl, 0, 0, &tdq, &tdk, &tdv, &ko, NULL, 0, &e);
            double t2 = now();
            if (s1 || s2) {
                puts(e.message);
                return 1;
            }
            if (which)
                ta0 = t1 - t0, ta1 = t2 - t1;
            else
                tb0 = t1 - t0, tb1 = t2 - t1;
        }
        if (it >= 0) bf[it] = tb0, bb[it] = tb1, af[it] = ta0, abw[it] = ta1, rf[it] = tb0 / ta0, rb[it] = tb1 / ta1;
    }
    printf("%lld x %lld tokens, H %lld, D %lld, %s, threads %d, after = %s: forward before %.0f us, after %.0f us, "
           "paired ratio before/after %.3f; backward before %.0f us, after %.0f us, ratio %.3f\n",
           (long long)N, (long long)shape[1], (long long)H, (long long)D, causal ? "causal" : "full", threads,
           use_op ? "op on a team" : "plain call", med(bf, iters), med(af, iters), med(rf, iters), med(bb, iters),
           med(abw, iters), med(rb, iters));
    return 0;
}
