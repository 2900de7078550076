/* ab_gdn_small.c: the small call of the gated delta rule (4 documents of 64 tokens, H = HV = 8,
 * K = V = 128, f32, packed), before and after a change, paired in one process: two builds of the
 * library are dlopen'ed side by side (each resolving its own symbols: RTLD_LOCAL, neither linked)
 * and their calls interleaved iteration by iteration on the same inputs, which goes first
 * alternating, so that a busy moment of a shared machine hits both alike. BEFORE runs the plain
 * per-call maskpack_gdn_forward / _backward with opts.n_threads; AFTER runs the operator
 * (maskpack_gdn_op_*) on a team of that many threads created once.
 *
 * Usage: ab_gdn_small BEFORE.so AFTER.so [threads (2)] [iterations (200)] [documents tokens H HV K V]
 * -> the medians of both and of the per-iteration ratio before / after (the trailing six give
 * another shape, e.g. 8 512 16 32 128 128 for bench_gdn's). Exit status 0 whatever the numbers (it measures). */
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
#define SYM(h, name) ((__typeof__(&name))dlsym(h, #name))
typedef struct lib {
    maskpack_layout *L;
    __typeof__(&maskpack_gdn_forward) fwd;
    __typeof__(&maskpack_gdn_backward) bwd;
    __typeof__(&maskpack_gdn_op_forward) op_fwd;
    __typeof__(&maskpack_gdn_op_backward) op_bwd;
    maskpack_gdn_op *op;
    maskpack_workers *team;
} lib;
int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BEFORE.so AFTER.so [threads] [iterations]\n", argv[0]);
        return 2;
    }
    int threads = argc > 3 ? atoi(argv[3]) : 2, iters = argc > 4 ? atoi(argv[4]) : 200;
    if (threads < 1 || iters < 1) return 2;
    /* the shape: the small call unless given (documents, tokens each, H, HV, K, V) */
    int64_t shape[6] = {4, 64, 8, 8, 128, 128};
    for (int i = 0; i < 6 && 5 + i < argc; i++) shape[i] = atoll(argv[5 + i]);
    const int64_t N = shape[0], T = shape[0] * shape[1], H = shape[2], HV = shape[3], K = shape[4], V = shape[5];
    if (N < 1 || N > 64 || shape[1] < 1 || H < 1 || HV % H || K < 1 || V < 1) return 2;
    int64_t lens[64];
    for (int64_t i = 0; i < N; i++) lens[i] = shape[1];
    lib libs[2];
    maskpack_error e;
    maskpack_gdn_options opt;
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            puts(dlerror());
            return 1;
        }
        lib *l = &libs[i];
        memset(l, 0, sizeof *l);
        maskpack_rule r = SYM(h, maskpack_rule_default)();
        if (SYM(h, maskpack_layout_from_lengths)(lens, (size_t)N, MASKPACK_PLACE_PACKED, 0, &r, &l->L, &e)) return 1;
        l->fwd = SYM(h, maskpack_gdn_forward);
        l->bwd = SYM(h, maskpack_gdn_backward);
        opt = SYM(h, maskpack_gdn_options_default)();
        opt.n_threads = threads;
        if (i == 1) {
            l->op_fwd = SYM(h, maskpack_gdn_op_forward);
            l->op_bwd = SYM(h, maskpack_gdn_op_backward);
            if (!l->op_fwd || !l->op_bwd) {
                fprintf(stderr, "%s: no maskpack_gdn_op_forward / _backward\n", argv[2]);
                return 1;
            }
            if (SYM(h, maskpack_gdn_op_create)(l->L, H, HV, K, V, &opt, &l->op, &e)) {
                puts(e.message);
                return 1;
            }
            if (threads > 1 && SYM(h, maskpack_workers_create)(threads, &l->team, &e)) return 1;
        }
    }
    unsigned sd = 1;
    float *q = malloc(T * H * K * 4), *k = malloc(T * H * K * 4), *v = malloc(T * HV * V * 4), *g = malloc(T * HV * 4),
          *b = malloc(T * HV * 4);
    float *o = malloc(T * HV * V * 4), *ht = malloc(N * HV * K * V * 4), *dO = malloc(T * HV * V * 4);
    float *dq = malloc(T * H * K * 4), *dk = malloc(T * H * K * 4), *dv = malloc(T * HV * V * 4),
          *dg = malloc(T * HV * 4), *db = malloc(T * HV * 4);
    for (int64_t i = 0; i < T * H * K; i++) q[i] = frand(&sd), k[i] = frand(&sd);
    for (int64_t i = 0; i < T * HV * V; i++) v[i] = frand(&sd), dO[i] = frand(&sd);
    for (int64_t i = 0; i < T * HV; i++) g[i] = -0.1f + 0.1f * frand(&sd), b[i] = 0.5f + frand(&sd);
    int64_t sq[3] = {T, H, K}, sv[3] = {T, HV, V}, sg[2] = {T, HV}, ss[4] = {N, HV, K, V};
#define TC(p, n, s) ((maskpack_tensor){p, MASKPACK_F32, n, {s[0], s[1], n > 2 ? s[2] : 0, n > 3 ? s[3] : 0}, {0}})
    maskpack_tensor tq = TC(q, 3, sq), tk = TC(k, 3, sq), tv = TC(v, 3, sv), tg = TC(g, 2, sg), tb = TC(b, 2, sg);
    maskpack_tensor to = TC(o, 3, sv), tht = TC(ht, 4, ss), tdo = TC(dO, 3, sv), tdq = TC(dq, 3, sq),
                    tdk = TC(dk, 3, sq);
    maskpack_tensor tdv = TC(dv, 3, sv), tdg = TC(dg, 2, sg), tdb = TC(db, 2, sg);
    maskpack_tensor *all[] = {&tq, &tk, &tv, &tg, &tb, &to, &tht, &tdo, &tdq, &tdk, &tdv, &tdg, &tdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) { /* C-order strides */
        maskpack_tensor *t = all[i];
        int64_t st = 1;
        for (int d = t->ndim - 1; d >= 0; d--) t->strides[d] = st, st *= t->shape[d];
    }
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, NULL};
    maskpack_gdn_grads gr = {&tdq, &tdk, &tdv, &tdg, &tdb, NULL};
    double *rf = malloc(iters * 8), *rb = malloc(iters * 8), *bf = malloc(iters * 8), *bb = malloc(iters * 8),
           *af = malloc(iters * 8), *abw = malloc(iters * 8);
    for (int it = -5; it < iters; it++) {
        double tb0 = 0, tb1 = 0, ta0 = 0, ta1 = 0;
        for (int side = 0; side < 2; side++) {
            const int which = (it & 1) ? 1 - side : side; /* alternate who goes first */
            lib *l = &libs[which];
            double t0 = now();
            maskpack_status s1 = which ? l->op_fwd(l->op, &in, &to, &tht, l->team, NULL, 0, &e)
                                       : l->fwd(l->L, &in, &opt, &to, &tht, NULL, 0, &e);
            double t1 = now();
            maskpack_status s2 = which ? l->op_bwd(l->op, &in, &tdo, NULL, &gr, l->team, NULL, 0, &e)
                                       : l->bwd(l->L, &in, &tdo, NULL, &opt, &gr, NULL, 0, &e);
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
    printf("%lld x %lld tokens, H %lld, HV %lld, K %lld, V %lld, ", (long long)N, (long long)shape[1], (long long)H,
           (long long)HV, (long long)K, (long long)V);
    printf("threads %d: forward before %.0f us, after (op) %.0f us, paired ratio before/after %.3f; "
           "backward before %.0f us, after %.0f us, ratio %.3f\n",
           threads, med(bf, iters), med(af, iters), med(rf, iters), med(bb, iters), med(abw, iters), med(rb, iters));
    return 0;
}
