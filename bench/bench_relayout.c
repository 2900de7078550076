/* bench_relayout.c: pack, unpack and CP shard through the copy-plan engine against memcpy of the same
 * bytes, for an L2-sized and a DRAM-sized per-token tensor, in one run. Prints medians and ratios.
 *
 *   bench_relayout [threads (1)] [--cases LABEL:BxSxC[,LABEL:BxSxC...]]
 * The cases (a padded [B x S] x C bf16 tensor each) default to bench/shapes.json's table "relayout",
 * built into bench_shapes.h; bench_relayout_torch.py measures the same table. */
#include <maskpack.h>

#include <stdint.h>
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

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define REPS 21

typedef struct ctx {
    maskpack_relayout_plan *plan;
    const maskpack_tensor *x;
    maskpack_tensor *out;
    int threads;
    maskpack_workers *team; /* non-NULL: execute_on the team instead of per-call threads */
} ctx;

static double median(double *t) {
    qsort(t, REPS, sizeof *t, cmp_d);
    return t[REPS / 2];
}

static double time_memcpy(void *dst, const void *src, size_t bytes, int reps) {
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double a = now();
        for (int i = 0; i < reps; i++) memcpy(dst, src, bytes);
        t[r] = (now() - a) / reps;
    }
    return median(t);
}

static double time_relayout(ctx *c, int reps) {
    double t[REPS];
    maskpack_error e;
    const maskpack_tensor *xs[1] = {c->x};
    for (int r = 0; r < REPS; r++) {
        double a = now();
        for (int i = 0; i < reps; i++)
            if (c->team ? maskpack_relayout_execute_on(c->plan, xs, c->out, NULL, c->team, &e)
                        : maskpack_relayout_execute(c->plan, xs, c->out, NULL, c->threads, &e)) {
                fprintf(stderr, "relayout failed: %s\n", e.message);
                exit(1);
            }
        t[r] = (now() - a) / reps;
    }
    return median(t);
}

static uint64_t rng = 88172645463325252ull;
static int64_t rnd_in(int64_t lo, int64_t hi) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (int64_t)(rng % (uint64_t)(hi - lo + 1));
}

/* Calls per timed sample: enough that a sample moves about 512 MiB of padded tensor (a small move
 * lasts microseconds, below what one reading of the clock resolves), at most 200 (the L2-sized case's
 * 200 and the DRAM-sized one's 2, as before the shapes moved to shapes.json). */
static int reps_for(int64_t B, int64_t S, int64_t C) {
    double padded = (double)B * (double)S * (double)C * sizeof(uint16_t);
    double r = (double)(1 << 29) / padded;
    return r >= 200 ? 200 : r < 1 ? 1 : (int)r;
}

static void run_case(const char *label, int64_t B, int64_t S, int64_t C, int reps, int threads) {
    maskpack_error e;
    int64_t *lens = malloc(sizeof(int64_t) * (size_t)B);
    for (int64_t b = 0; b < B; b++) lens[b] = rnd_in(S / 2, S); /* about 25% padding */
    maskpack_layout *Pd = NULL, *Pk = NULL, *G = NULL, *Sh = NULL;
    maskpack_layout_from_lengths(lens, (size_t)B, MASKPACK_PLACE_RIGHT, S, NULL, &Pd, &e);
    maskpack_layout_packed_of(Pd, &Pk, &e);
    maskpack_layout_pad_to_multiple(Pk, 4, &G, &e);
    maskpack_layout_cp_shard(G, 2, 0, MASKPACK_CP_ZIGZAG, &Sh, &e);
    int64_t T = maskpack_layout_q_width(Pk), TG = maskpack_layout_q_width(G), TL = TG / 2;
    size_t tokbytes = (size_t)C * sizeof(uint16_t);
    uint16_t *padded = malloc((size_t)(B * S) * tokbytes), *packed = malloc((size_t)TG * tokbytes);
    uint16_t *shard = malloc((size_t)TL * tokbytes), *scratch = malloc((size_t)(B * S) * tokbytes);
    memset(padded, 1, (size_t)(B * S) * tokbytes);
    memset(packed, 2, (size_t)TG * tokbytes);
    memset(scratch, 3, (size_t)(B * S) * tokbytes);
    memset(shard, 4, (size_t)TL * tokbytes);
    int64_t ps[3] = {B, S, C}, ks[2] = {T, C}, ls[2] = {TL, C};
    maskpack_tensor pt = maskpack_tensor_contiguous(padded, MASKPACK_BF16, 3, ps);
    maskpack_tensor kt = maskpack_tensor_contiguous(packed, MASKPACK_BF16, 2, ks);
    maskpack_tensor lt = maskpack_tensor_contiguous(shard, MASKPACK_BF16, 2, ls);
    maskpack_tensor st = maskpack_tensor_contiguous(scratch, MASKPACK_BF16, 3, ps);

    struct {
        const char *name;
        const maskpack_layout *src, *dst;
        const maskpack_tensor *x;
        maskpack_tensor *out;
        size_t bytes; /* bytes written */
    } ops[3] = {
        {"pack   (padded -> packed)", Pd, Pk, &pt, &kt, (size_t)T * tokbytes},
        {"unpack (packed -> padded)", Pk, Pd, &kt, &st, (size_t)(B * S) * tokbytes},
        {"shard  (padded -> CP rank 0 of 2, zigzag)", Pd, Sh, &pt, &lt, (size_t)TL * tokbytes},
    };
    printf("%s: [%lld x %lld] x %lld bf16 (%.1f MB padded, %lld real tokens), %d thread(s)\n", label, (long long)B,
           (long long)S, (long long)C, (double)(B * S) * (double)tokbytes / 1e6, (long long)T, threads);
    maskpack_workers *team = NULL;
    if (threads > 1 && maskpack_workers_create(threads, &team, &e)) {
        fprintf(stderr, "workers failed: %s\n", e.message);
        exit(1);
    }
    for (int o = 0; o < 3; o++) {
        ctx c = {NULL, ops[o].x, ops[o].out, threads, NULL};
        const maskpack_layout *srcs[1] = {ops[o].src};
        if (maskpack_relayout_plan_create(srcs, 1, ops[o].dst, &c.plan, &e)) {
            fprintf(stderr, "plan failed: %s\n", e.message);
            exit(1);
        }
        time_relayout(&c, 1); /* warm-up */
        double tm = time_memcpy(scratch, padded, ops[o].bytes, reps);
        double tr = time_relayout(&c, reps);
        printf("  %-44s %7.2f GB/s   memcpy %7.2f GB/s   ratio %.2fx (target >= 0.8x)\n", ops[o].name,
               (double)ops[o].bytes / tr / 1e9, (double)ops[o].bytes / tm / 1e9, tm / tr);
        if (team) { /* the same move on a running worker team (what the Python package uses) */
            c.team = team;
            time_relayout(&c, 1);
            double tt = time_relayout(&c, reps);
            printf("  %-44s %7.2f GB/s   memcpy %7.2f GB/s   ratio %.2fx (on a %d-thread worker team)\n",
                   "  same, worker team", (double)ops[o].bytes / tt / 1e9, (double)ops[o].bytes / tm / 1e9, tm / tt,
                   threads);
        }
        maskpack_relayout_plan_free(c.plan);
    }
    maskpack_workers_free(team);
    free(lens);
    free(padded);
    free(packed);
    free(shard);
    free(scratch);
    maskpack_layout_free(Pd);
    maskpack_layout_free(Pk);
    maskpack_layout_free(G);
    maskpack_layout_free(Sh);
}

/* ---- the cases ------------------------------------------------------------------------------ */

#define MAX_CASES 16
typedef struct relayout_case {
    char label[32];
    int64_t B, S, C;
} relayout_case;

/* Parses "LABEL:BxSxC[,LABEL:BxSxC...]" into cs[0..*n): 0, or -1 after a one-line message. */
static int parse_cases(const char *prog, const char *where, const char *text, relayout_case *cs, int *n) {
    *n = 0;
    const char *p = text;
    if (!p) goto bad;
    for (;;) {
        const char *end = strchr(p, ','), *colon = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[96], dims[3][32];
        long long v[3];
        int used = 0;
        if (*n == MAX_CASES || len >= sizeof item) goto bad;
        memcpy(item, p, len);
        item[len] = 0;
        if (!colon || colon - p >= (ptrdiff_t)sizeof cs->label || colon - p == 0 || (end && colon > end)) goto bad;
        if (sscanf(item + (colon - p) + 1, "%31[0-9]x%31[0-9]x%31[0-9]%n", dims[0], dims[1], dims[2], &used) != 3 ||
            item[(colon - p) + 1 + used])
            goto bad;
        for (int d = 0; d < 3; d++) {
            v[d] = strtoll(dims[d], NULL, 10);
            if (v[d] < 1 || v[d] > (d == 2 ? 65536 : 1 << 24)) goto bad;
        }
        if ((double)v[0] * (double)v[1] * (double)v[2] > (double)(1ll << 31)) goto bad; /* at most 4 GiB padded */
        memcpy(cs[*n].label, p, (size_t)(colon - p));
        cs[*n].label[colon - p] = 0;
        cs[*n].B = v[0];
        cs[*n].S = v[1];
        cs[*n].C = v[2];
        (*n)++;
        if (!end) return 0;
        p = end + 1; /* an empty item after a comma is malformed, as any other */
    }
bad:
    fprintf(stderr,
            "%s: --cases%s: expected LABEL:BxSxC[,LABEL:BxSxC...] (at most %d cases, B and S in [1, 2^24], "
            "C in [1, 65536], B*S*C at most 2^31), got '%s'\n",
            prog, where, MAX_CASES, text ? text : "(nothing)");
    return -1;
}

/* Reads the arguments argv[0..argc) (the threads, then --cases) into *threads and cs: 0, or -1 after a
 * one-line message. */
static int parse_args(const char *prog, const char *where, int argc, const char *const *argv, int *threads,
                      relayout_case *cs, int *n) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--cases")) {
            if (parse_cases(prog, where, i + 1 < argc ? argv[i + 1] : NULL, cs, n)) return -1;
            i++;
        } else if (argv[i][0] != '-' && i == 0) {
            *threads = atoi(argv[i]);
        } else {
            fprintf(stderr, "%s: unknown argument '%s'%s (usage: %s [threads] [--cases LABEL:BxSxC,...])\n", prog,
                    argv[i], where, prog);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    static const char *const defaults[] = {BENCH_SHAPES_RELAYOUT};
    /* line by line into a pipe too: a reader (the report, a test) sees the shape before the long runs */
    setvbuf(stdout, NULL, _IOLBF, 0);
    relayout_case cs[MAX_CASES];
    int threads = 1, n = 0;
    if (parse_args("bench_relayout", BENCH_SHAPES_WHERE, (int)(sizeof defaults / sizeof defaults[0]), defaults,
                   &threads, cs, &n) ||
        parse_args("bench_relayout", "", argc - 1, (const char *const *)argv + 1, &threads, cs, &n) ||
        bench_require("bench_relayout", "relayout", "--cases", n))
        return 2;
    printf("maskpack %s relayout benchmark (median of %d runs; memcpy of the same bytes measured in this run)\n",
           maskpack_version_string(), REPS);
    for (int c = 0; c < n; c++)
        run_case(cs[c].label, cs[c].B, cs[c].S, cs[c].C, reps_for(cs[c].B, cs[c].S, cs[c].C), threads);
    return 0;
}
