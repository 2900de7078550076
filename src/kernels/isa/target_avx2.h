/* target_avx2.h: opens an AVX2 + FMA target region: every function defined after the include is
 * compiled for avx2,fma (the rest of the library stays baseline x86-64, and such functions run only
 * after the run-time check in src/core/cpu_features.c). Include it where the region starts, before
 * immintrin.h users, and close the region with target_pop.h in the same file. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
