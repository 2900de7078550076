/* target_amx.h: opens the AMX target region of the tile kernels (attention forward and backward, the
 * gated delta rule's bf16 products): every function defined after the include is compiled for
 * AVX-512 (F, DQ, VL, BW), AVX512-BF16, AMX-TILE and AMX-BF16 (with FMA, AVX2, F16C, PREFETCHW), and
 * runs only after the run-time check in src/core/cpu_features.c (which also asks the OS for the tile
 * state). Include it where the region starts, before immintrin.h, and close the region with
 * target_pop.h in the same file. */
#if defined(__clang__)
#pragma clang attribute push(                                                                                          \
    __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,amx-tile,amx-bf16,fma,avx2,f16c,prfchw"))),   \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,amx-tile,amx-bf16,fma,avx2,f16c,prfchw")
#endif
