/* attn_avx512bf16_target.h: opens the AVX512-BF16 target region of the bf16 dot-product attention
 * kernels (attn_avx512bf16.c forward, attn_avx512bf16_bwd.c backward) and the constants they share.
 * In the emulated test build (MASKPACK_EMULATE_AMX) there is no target region: simde_amx.h carries
 * the AVX-512, AVX512-BF16 and AMX intrinsics out in C. Included once per file, first of the
 * intrinsics; the file closes the region with its own pop at the end (none when emulated). */
#if defined(MASKPACK_EMULATE_AMX)
#include "../isa/simde_amx.h"
#else
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))),             \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#endif
#endif

#define BQ    ATTN_BQ
#define BK    ATTN_BK
#define LOG2E 1.4426950408889634
