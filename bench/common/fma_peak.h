/* fma_peak.h: the machine's fp32 FMA peak, measured by the benchmark programs themselves (one copy
 * for every benchmark that quotes a fraction of peak).
 *
 * 24 independent AVX-512 accumulator chains (more than FMA latency x FMA ports) held in registers:
 * the empty asm makes every chain "used" each iteration, so the compiler can neither fold nor spill
 * them (an array of vectors indexed in a loop stayed in memory and measured half the peak). All
 * threads run each burst between two barriers; the best burst's wall time gives the rate, because
 * on a shared machine the best of several short bursts is the uncontended one. CPUs without
 * AVX-512 run the same loop on AVX2 + FMA (12 ymm chains: 16 registers, and 12 covers latency 4 x
 * 2 ports, AMD Zen's and Intel's client cores'); with neither the peak is 0 (the callers then print
 * no fraction). The peak is the widest FMA this CPU has, which is what the kernels chosen on it use. */
#ifndef MASKPACK_BENCH_FMA_PEAK_H
#define MASKPACK_BENCH_FMA_PEAK_H

#include <pthread.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BENCH_HAVE_AVX512_PEAK 1
/* One register-resident loop of 24 zmm chains: STEP(a) advances chain a (with the constants DECLS
 * declares, ';'-separated), the empty asm keeps every chain live each iteration, the chains' sum is
 * returned so none is dead. TARGET is the ISA the loop's instruction needs. */
#define BENCH_ZMM_LOOP(NAME, TARGET, DECLS, STEP)                                                                      \
    __attribute__((target(TARGET))) static float NAME(long iters) {                                                    \
        __m512 a0 = _mm512_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,         \
               a9 = a0, a10 = a0, a11 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0,    \
               b8 = a0, b9 = a0, b10 = a0, b11 = a0;                                                                   \
        DECLS;                                                                                                         \
        for (long it = 0; it < iters; it++) {                                                                          \
            STEP(a0)                                                                                                   \
            STEP(a1) STEP(a2) STEP(a3) STEP(a4) STEP(a5) STEP(a6) STEP(a7) STEP(a8) STEP(a9) STEP(a10) STEP(a11)       \
                STEP(b0) STEP(b1) STEP(b2) STEP(b3) STEP(b4) STEP(b5) STEP(b6) STEP(b7) STEP(b8) STEP(b9) STEP(b10)    \
                    STEP(b11) __asm__ volatile(""                                                                      \
                                               : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), \
                                                 "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));                  \
            __asm__ volatile(""                                                                                        \
                             : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3), "+v"(b4), "+v"(b5), "+v"(b6), "+v"(b7),         \
                               "+v"(b8), "+v"(b9), "+v"(b10), "+v"(b11));                                              \
        }                                                                                                              \
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),                          \
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));                         \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));                           \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));                             \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(b4, b5), _mm512_add_ps(b6, b7)));                             \
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(b8, b9), _mm512_add_ps(b10, b11)));                           \
        return _mm512_reduce_add_ps(s);                                                                                \
    }

#define BENCH_FMA_(a) a = _mm512_fmadd_ps(a, m, c);
BENCH_ZMM_LOOP(bench_fma_loop, "avx512f", const __m512 m = _mm512_set1_ps(0.999999f);
               const __m512 c = _mm512_set1_ps(1e-7f), BENCH_FMA_)
#undef BENCH_FMA_
#define BENCH_FLOP_PER_ITER (24.0 * 16.0 * 2.0)

__attribute__((target("avx2,fma"))) static float bench_fma_loop_avx2(long iters) {
    __m256 a0 = _mm256_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
           a10 = a0, a11 = a0;
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (long it = 0; it < iters; it++) {
#define BENCH_FMA_(a) a = _mm256_fmadd_ps(a, m, c);
        BENCH_FMA_(a0)
        BENCH_FMA_(a1)
        BENCH_FMA_(a2)
        BENCH_FMA_(a3) BENCH_FMA_(a4) BENCH_FMA_(a5) BENCH_FMA_(a6) BENCH_FMA_(a7) BENCH_FMA_(a8) BENCH_FMA_(a9)
            BENCH_FMA_(a10) BENCH_FMA_(a11)
#undef BENCH_FMA_
                __asm__ volatile(""
                                 : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                                   "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#define BENCH_FLOP_PER_ITER_AVX2 (12.0 * 8.0 * 2.0)

/* The bf16 dot-product peak: the same 24 chains of VDPBF16PS (32 bf16 multiply-adds into 16 f32
 * lanes each), what the bf16 kernels on AVX512-BF16 are measured against. */
#define BENCH_DOT_(a) a = _mm512_dpbf16_ps(a, m, c);
BENCH_ZMM_LOOP(bench_bf16dot_loop, "avx512f,avx512bf16", const __m512bh m = (__m512bh)_mm512_set1_epi16(0x3f80);
               const __m512bh c = (__m512bh)_mm512_set1_epi16(0x3380) /* 1, 6e-8 */, BENCH_DOT_)
#undef BENCH_DOT_
#define BENCH_FLOP_PER_ITER_BF16 (24.0 * 32.0 * 2.0)

/* The AMX tile peak: TDPBF16PS into four accumulator tiles from two A and two B tiles that stay in
 * the tile registers (16 x 16 x 32 multiply-adds each), four independent chains, more than the
 * product's latency over its issue interval. The tiles hold zeros: the unit's speed does not depend
 * on the values. Only called where maskpack runs AMX (the CPU has it and the OS granted the tile
 * state to the process, which maskpack's CPU check asks for). */
__attribute__((target("amx-tile,amx-bf16"), noinline)) static float bench_amx_loop(long iters) {
    struct {
        unsigned char palette, start_row, reserved[14];
        unsigned short colsb[16];
        unsigned char rows[16];
    } cfg = {0};
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (long it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float out[256];
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#define BENCH_FLOP_PER_ITER_AMX (4.0 * 16.0 * 16.0 * 32.0 * 2.0)
#endif

enum { BENCH_PEAK_MAX_THREADS = 64, BENCH_PEAK_MAX_BURSTS = 64 };

typedef struct {
    long iters;
    int bursts, tid, avx2; /* avx2: 1 runs the AVX2 loop (no AVX-512), 2 the bf16 dot-product loop, 3 AMX's */
    float sink;
    pthread_barrier_t *bar;
    double *t_start, *t_end; /* per burst, written by thread 0 */
} bench_peak_arg;

static double bench_peak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *bench_peak_thread(void *p) {
    bench_peak_arg *a = p;
    for (int b = 0; b < a->bursts; b++) {
        pthread_barrier_wait(a->bar);
        if (a->tid == 0) a->t_start[b] = bench_peak_now();
#ifdef BENCH_HAVE_AVX512_PEAK
        a->sink += a->avx2 == 3   ? bench_amx_loop(a->iters)
                   : a->avx2 == 2 ? bench_bf16dot_loop(a->iters)
                   : a->avx2      ? bench_fma_loop_avx2(a->iters)
                                  : bench_fma_loop(a->iters);
#endif
        pthread_barrier_wait(a->bar);
        if (a->tid == 0) a->t_end[b] = bench_peak_now();
    }
    return NULL;
}

/* (threads, iters, bursts, kind: 0 AVX-512 FMA, 1 AVX2 FMA, 2 VDPBF16PS, 3 AMX tiles) -> the best burst's GFLOP/s over
 * all threads. */
static double bench_peak_run(int threads, long iters, int bursts, int kind) {
    if (threads < 1) threads = 1;
    if (threads > BENCH_PEAK_MAX_THREADS) threads = BENCH_PEAK_MAX_THREADS;
    if (bursts < 1) bursts = 1;
    if (bursts > BENCH_PEAK_MAX_BURSTS) bursts = BENCH_PEAK_MAX_BURSTS;
    pthread_t th[BENCH_PEAK_MAX_THREADS];
    bench_peak_arg args[BENCH_PEAK_MAX_THREADS];
    double t0[BENCH_PEAK_MAX_BURSTS], t1[BENCH_PEAK_MAX_BURSTS];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        args[t] = (bench_peak_arg){iters, bursts, t, kind, 0.0f, &bar, t0, t1};
        if (t) pthread_create(&th[t], NULL, bench_peak_thread, &args[t]);
    }
    bench_peak_thread(&args[0]);
    for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    double best = 0;
#ifdef BENCH_HAVE_AVX512_PEAK
    const double per = kind == 3   ? BENCH_FLOP_PER_ITER_AMX
                       : kind == 2 ? BENCH_FLOP_PER_ITER_BF16
                       : kind == 1 ? BENCH_FLOP_PER_ITER_AVX2
                                   : BENCH_FLOP_PER_ITER;
    for (int b = 0; b < bursts; b++) {
        double gf = per * (double)iters * threads / (t1[b] - t0[b]) / 1e9;
        if (gf > best) best = gf;
    }
#endif
    return best;
}

/* (threads, loop iterations per burst, bursts) -> the best burst's fp32 GFLOP/s over all threads,
 * on AVX-512 or else AVX2 + FMA; 0 without either. */
static double bench_fma_peak(int threads, long iters, int bursts) {
#ifdef BENCH_HAVE_AVX512_PEAK
    __builtin_cpu_init();
    const int avx2 = !__builtin_cpu_supports("avx512f");
    if (avx2 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0.0;
    return bench_peak_run(threads, iters, bursts, avx2);
#else
    (void)threads;
    (void)iters;
    (void)bursts;
    return 0.0;
#endif
}

/* (threads, loop iterations per burst, bursts) -> the best burst's bf16 dot-product GFLOP/s
 * (VDPBF16PS) over all threads; 0 on a CPU without AVX512-BF16. */
static __attribute__((unused)) double bench_bf16dot_peak(int threads, long iters, int bursts) {
#ifdef BENCH_HAVE_AVX512_PEAK
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return 0.0;
    return bench_peak_run(threads, iters, bursts, 2);
#else
    (void)threads;
    (void)iters;
    (void)bursts;
    return 0.0;
#endif
}

/* (threads, loop iterations per burst, bursts) -> the best burst's bf16 GFLOP/s of the AMX tiles
 * (TDPBF16PS) over all threads. The caller checks that maskpack runs AMX here (maskpack_isa_resolve
 * for MASKPACK_ISA_AMX): without the tile state granted the first tile instruction faults. */
static __attribute__((unused)) double bench_amx_peak(int threads, long iters, int bursts) {
#ifdef BENCH_HAVE_AVX512_PEAK
    return bench_peak_run(threads, iters, bursts, 3);
#else
    (void)threads;
    (void)iters;
    (void)bursts;
    return 0.0;
#endif
}

#endif
