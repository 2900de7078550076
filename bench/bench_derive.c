/* bench_derive.c: throughput of the derived outputs.
 *
 * The shapes (defaults: bench/shapes.json's table "derive", built into bench_shapes.h; each one an
 * option, e.g. bench_derive --batch 4 --seq 256 --tokens 4096 --segments 10 --dense 512):
 * 1. A padded [64, 32768] batch (--batch, --seq) with random lengths: mask2d (uint8), position_ids
 *    (int64) and cu_seqlens (int32), each compared with a memcpy of the same number of bytes
 *    (target: the derivation writes at >= 0.8x the memcpy rate).
 * 2. A FlexAttention block mask for 131072 tokens (--tokens) packed in 1000 random segments
 *    (--segments), causal, 128x128 blocks, into pre-allocated zeroed arrays (target: < 1 ms).
 * 3. For context: a dense 4D mask of the stream's first 8192 tokens (--dense).
 * Every figure is the median of >= 15 timed samples taken after warm-up runs. */
#include "maskpack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_shapes.h" /* generated from bench/shapes.json */
#include "common/bench_args.h"

#define SAMPLES 21
#define WARMUP  3

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef int (*op_fn)(void *ctx);

/* Median seconds per call of fn over SAMPLES samples of `reps` calls each, after warm-up.
 * Returns a negative value when a call fails. */
static double time_op(op_fn fn, void *ctx, int reps) {
    double t[SAMPLES];
    for (int w = 0; w < WARMUP; w++)
        if (fn(ctx)) return -1;
    for (int s = 0; s < SAMPLES; s++) {
        double t0 = now_s();
        for (int r = 0; r < reps; r++)
            if (fn(ctx)) return -1;
        t[s] = (now_s() - t0) / reps;
    }
    qsort(t, SAMPLES, sizeof t[0], cmp_double);
    return t[SAMPLES / 2];
}

/* Repetitions so that one sample lasts about 2 ms (small outputs are timed in batches). */
static int reps_for(op_fn fn, void *ctx) {
    double t0 = now_s();
    int n = 0;
    while (now_s() - t0 < 2e-3 && n < 1000000) {
        if (fn(ctx)) return 1;
        n++;
    }
    return n > 0 ? n : 1;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rng_next(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* ---- operations ---------------------------------------------------------------------------- */

typedef struct copy_ctx {
    void *dst;
    const void *src;
    size_t bytes;
} copy_ctx;

static int op_memcpy(void *p) {
    copy_ctx *c = p;
    memcpy(c->dst, c->src, c->bytes);
    /* keep the compiler from eliding the copy */
    __asm__ __volatile__("" : : "r"(c->dst) : "memory");
    return 0;
}

typedef struct derive_ctx {
    const maskpack_layout *L;
    maskpack_tensor out;
    maskpack_error err;
} derive_ctx;

static int op_mask2d(void *p) {
    derive_ctx *c = p;
    return maskpack_mask2d(c->L, &c->out, &c->err) != MASKPACK_OK;
}

static int op_position_ids(void *p) {
    derive_ctx *c = p;
    return maskpack_position_ids(c->L, &c->out, &c->err) != MASKPACK_OK;
}

static int op_cu_seqlens(void *p) {
    derive_ctx *c = p;
    return maskpack_cu_seqlens(c->L, MASKPACK_CU_TE, 0, &c->out, &c->err) != MASKPACK_OK;
}

static int op_mask4d(void *p) {
    derive_ctx *c = p;
    return maskpack_mask4d(c->L, MASKPACK_MASK_KEEP, MASKPACK_FILL_NEG_INF, &c->out, &c->err) != MASKPACK_OK;
}

typedef struct block_ctx {
    const maskpack_layout *L;
    maskpack_block_mask_arrays a;
    maskpack_error err;
} block_ctx;

static int op_block_mask(void *p) {
    block_ctx *c = p;
    return maskpack_block_mask(c->L, 128, 128, &c->a, &c->err) != MASKPACK_OK;
}

/* Times fn against a memcpy of `bytes`; prints one line; returns derive seconds via *t_out. */
static int compare_with_memcpy(const char *label, op_fn fn, derive_ctx *ctx, size_t bytes, double *t_derive,
                               double *t_copy) {
    void *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    copy_ctx cc = {dst, src, bytes};
    int rc = reps_for(op_memcpy, &cc), rd = reps_for(fn, ctx);
    double tc = time_op(op_memcpy, &cc, rc);
    double td = time_op(fn, ctx, rd);
    free(src);
    free(dst);
    if (td < 0) {
        fprintf(stderr, "%s failed: %s\n", label, ctx->err.message);
        return 1;
    }
    double gd = (double)bytes / td / 1e9, gc = (double)bytes / tc / 1e9;
    printf("%-34s %10zu bytes  %7.2f GB/s  memcpy %7.2f GB/s  ratio %.2fx (target >= 0.8x)\n", label, bytes, gd, gc,
           gd / gc);
    *t_derive = td;
    *t_copy = tc;
    return 0;
}

/* ---- shapes ------------------------------------------------------------------------------------ */

/* The shapes of the three parts (defaults: bench/shapes.json's table "derive", via bench_shapes.h). */
typedef struct shapes {
    int64_t batch, seq;       /* 1. the padded batch [batch, seq] */
    int64_t tokens, segments; /* 2. the block mask's packed stream */
    int64_t dense;            /* 3. the dense 4D mask of the stream's first `dense` tokens */
} shapes;

#define USAGE "[--batch N] [--seq N] [--tokens N] [--segments N] [--dense N]"

/* Reads the options argv[0..argc) into *s: 0, or -1 after a one-line message. */
static int parse_shapes(const char *prog, const char *where, int argc, const char *const *argv, shapes *s) {
    const bench_int_opt opts[] = {{"--batch", &s->batch, 1, 65536},
                                  {"--seq", &s->seq, 1, 1 << 24},
                                  {"--tokens", &s->tokens, 2, 1 << 28},
                                  {"--segments", &s->segments, 1, 1 << 24},
                                  {"--dense", &s->dense, 1, 32768}};
    for (int i = 0; i < argc; i++) {
        int r = bench_parse_int_opt(prog, where, opts, sizeof opts / sizeof opts[0], argc, argv, &i);
        if (r < 0) return -1;
        if (r == 0) {
            fprintf(stderr, "%s: unknown option '%s'%s (usage: %s " USAGE ")\n", prog, argv[i], where, prog);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    maskpack_error err;
    const char *prog = "bench_derive";
    /* line by line into a pipe too: a reader (the report, a test) sees the shape before the long runs */
    setvbuf(stdout, NULL, _IOLBF, 0);
    static const char *const defaults[] = {BENCH_SHAPES_DERIVE};
    shapes sh = {0};
    if (parse_shapes(prog, BENCH_SHAPES_WHERE, (int)(sizeof defaults / sizeof defaults[0]), defaults, &sh) ||
        parse_shapes(prog, "", argc - 1, (const char *const *)argv + 1, &sh))
        return 2;
    if (bench_require(prog, "derive", "--batch", sh.batch) || bench_require(prog, "derive", "--seq", sh.seq) ||
        bench_require(prog, "derive", "--tokens", sh.tokens) ||
        bench_require(prog, "derive", "--segments", sh.segments) || bench_require(prog, "derive", "--dense", sh.dense))
        return 2;
    /* what the parts need of each other: distinct cut points, a prefix of the stream, and position
     * ids of the padded batch addressable in memory */
    if (sh.segments > sh.tokens) {
        fprintf(stderr, "%s: --segments: %lld segments do not fit in --tokens %lld\n", prog, (long long)sh.segments,
                (long long)sh.tokens);
        return 2;
    }
    if (sh.dense > sh.tokens) {
        fprintf(stderr, "%s: --dense: %lld is more than --tokens %lld\n", prog, (long long)sh.dense,
                (long long)sh.tokens);
        return 2;
    }
    if (sh.batch * sh.seq > ((int64_t)1 << 30)) {
        fprintf(stderr, "%s: --batch x --seq: %lld x %lld tokens is more than 2^30\n", prog, (long long)sh.batch,
                (long long)sh.seq);
        return 2;
    }
    /* ---- 1. padded batch [B, S] ------------------------------------------------------------ */
    const int64_t B = sh.batch, S = sh.seq;
    int64_t *lengths = malloc((size_t)B * sizeof *lengths);
    if (!lengths) return 1;
    for (int64_t b = 0; b < B; b++) lengths[b] = 1 + (int64_t)(rng_next() % (uint64_t)S);
    maskpack_layout *L = NULL;
    if (maskpack_layout_from_lengths(lengths, (size_t)B, MASKPACK_PLACE_RIGHT, S, NULL, &L, &err)) {
        fprintf(stderr, "layout: %s\n", err.message);
        return 1;
    }
    free(lengths);
    printf("padded batch [%lld x %lld], %lld real tokens (median of %d samples after %d warm-up runs)\n", (long long)B,
           (long long)S, (long long)maskpack_layout_n_tokens(L), SAMPLES, WARMUP);
    int64_t shape2[2] = {B, S}, ncu = B + 1;
    uint8_t *m2 = malloc((size_t)(B * S));
    int64_t *pos = malloc((size_t)(B * S) * sizeof *pos);
    int32_t *cu = malloc((size_t)ncu * sizeof *cu);
    if (!m2 || !pos || !cu) return 1;
    derive_ctx c_m2 = {L, maskpack_tensor_contiguous(m2, MASKPACK_U8, 2, shape2), {0}};
    derive_ctx c_pos = {L, maskpack_tensor_contiguous(pos, MASKPACK_I64, 2, shape2), {0}};
    derive_ctx c_cu = {L, maskpack_tensor_contiguous(cu, MASKPACK_I32, 1, &ncu), {0}};
    double td[3], tc[3];
    size_t bytes[3] = {(size_t)(B * S), (size_t)(B * S) * sizeof *pos, (size_t)ncu * sizeof *cu};
    char lm2[64], lpos[64], lcu[64];
    snprintf(lm2, sizeof lm2, "mask2d [%lldx%lld] u8:", (long long)B, (long long)S);
    snprintf(lpos, sizeof lpos, "position_ids [%lldx%lld] i64:", (long long)B, (long long)S);
    snprintf(lcu, sizeof lcu, "cu_seqlens [%lld] i32:", (long long)ncu);
    if (compare_with_memcpy(lm2, op_mask2d, &c_m2, bytes[0], &td[0], &tc[0]) ||
        compare_with_memcpy(lpos, op_position_ids, &c_pos, bytes[1], &td[1], &tc[1]) ||
        compare_with_memcpy(lcu, op_cu_seqlens, &c_cu, bytes[2], &td[2], &tc[2]))
        return 1;
    double sum_d = td[0] + td[1] + td[2], sum_c = tc[0] + tc[1] + tc[2];
    size_t sum_b = bytes[0] + bytes[1] + bytes[2];
    printf("%-34s %10zu bytes  %7.2f GB/s  memcpy %7.2f GB/s  ratio %.2fx (target >= 0.8x)\n",
           "all three together:", sum_b, (double)sum_b / sum_d / 1e9, (double)sum_b / sum_c / 1e9, sum_c / sum_d);
    if (td[2] > 0)
        printf("  (cu_seqlens writes %zu bytes: latency-bound, %.0f ns per call vs %.0f ns for the memcpy)\n", bytes[2],
               td[2] * 1e9, tc[2] * 1e9);
    free(m2);
    free(pos);
    free(cu);
    maskpack_layout_free(L);

    /* ---- 2. block mask: T tokens packed in NSEG random segments ------------------------------ */
    const int64_t T = sh.tokens, NSEG = sh.segments;
    int64_t *seglen = malloc((size_t)NSEG * sizeof *seglen);
    if (!seglen) return 1;
    {
        /* random cut points: NSEG - 1 distinct positions in (0, T) */
        uint8_t *cut = calloc((size_t)T, 1);
        if (!cut) return 1;
        int64_t placed = 0;
        while (placed < NSEG - 1) {
            int64_t x = 1 + (int64_t)(rng_next() % (uint64_t)(T - 1));
            if (!cut[x]) {
                cut[x] = 1;
                placed++;
            }
        }
        int64_t last = 0, k = 0;
        for (int64_t x = 1; x <= T; x++)
            if (x == T || cut[x]) {
                seglen[k++] = x - last;
                last = x;
            }
        free(cut);
    }
    if (maskpack_layout_from_lengths(seglen, (size_t)NSEG, MASKPACK_PLACE_PACKED, 0, NULL, &L, &err)) {
        fprintf(stderr, "layout: %s\n", err.message);
        return 1;
    }
    int64_t qb = 0, kb = 0;
    if (maskpack_block_mask_dims(L, 128, 128, &qb, &kb, &err)) return 1;
    size_t nq = (size_t)qb, nk = (size_t)kb;
    int32_t *arr[8];
    size_t lens[8] = {nq, nq * nk, nq, nq * nk, nk, nk * nq, nk, nk * nq};
    for (int i = 0; i < 8; i++)
        if (!(arr[i] = calloc(lens[i], sizeof(int32_t)))) return 1;
    block_ctx bc = {L, {arr[0], arr[1], arr[2], arr[3], arr[4], arr[5], arr[6], arr[7]}, {0}};
    double tb = time_op(op_block_mask, &bc, 1);
    if (tb < 0) {
        fprintf(stderr, "block mask failed: %s\n", bc.err.message);
        return 1;
    }
    long long n_partial = 0, n_full = 0;
    for (size_t i = 0; i < nq; i++) {
        n_partial += arr[0][i];
        n_full += arr[2][i];
    }
    printf("block_mask [%lld tokens, %lld segments, causal, 128x128, %lldx%lld blocks, all 8 arrays]: %.3f ms "
           "(target < 1 ms); %lld partial + %lld full blocks\n",
           (long long)T, (long long)NSEG, (long long)qb, (long long)kb, tb * 1e3, n_partial, n_full);
    for (int i = 0; i < 8; i++) free(arr[i]);

    /* ---- 3. context: the dense 4D mask of the first SD tokens of the same stream ------------- */
    {
        const int64_t SD = sh.dense;
        int64_t acc = 0, n = 0, *part = malloc((size_t)NSEG * sizeof *part);
        if (!part) return 1;
        while (n < NSEG && acc + seglen[n] <= SD) acc += part[n] = seglen[n], n++;
        if (acc < SD && n < NSEG) part[n++] = SD - acc;
        maskpack_layout *D = NULL;
        if (maskpack_layout_from_lengths(part, (size_t)n, MASKPACK_PLACE_PACKED, 0, NULL, &D, &err)) return 1;
        free(part);
        int64_t shape4[4] = {1, 1, SD, SD};
        uint8_t *dense = malloc((size_t)(SD * SD));
        if (!dense) return 1;
        derive_ctx dc = {D, maskpack_tensor_contiguous(dense, MASKPACK_BOOL, 4, shape4), {0}};
        double t4 = time_op(op_mask4d, &dc, 1);
        if (t4 < 0) {
            fprintf(stderr, "mask4d failed: %s\n", dc.err.message);
            return 1;
        }
        int64_t bq = 0, bk = 0;
        maskpack_block_mask_dims(D, 128, 128, &bq, &bk, &err);
        printf("dense baseline: mask4d [1,1,%lld,%lld] bool (%lld segments): %.3f ms, %.2f GB/s "
               "(the block mask of the same tokens has %lldx%lld entries)\n",
               (long long)SD, (long long)SD, (long long)n, t4 * 1e3, (double)(SD * SD) / t4 / 1e9, (long long)bq,
               (long long)bk);
        free(dense);
        maskpack_layout_free(D);
    }
    free(seglen);
    maskpack_layout_free(L);
    return 0;
}
