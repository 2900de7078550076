/* attn_avx512_target.h: opens the AVX-512 target region of the f32 attention kernels
 * (attn_avx512.c, attn_avx512_bwd.c) and the constants they share. In the emulated test build
 * (MASKPACK_EMULATE_AVX512) there is no target region: SIMDe carries the intrinsics out and
 * ATTN_F32_EMULATED says so. Included once per file, first of the intrinsics; the file closes the
 * region with its own pop at the end (none when ATTN_F32_EMULATED). */
#if defined(MASKPACK_EMULATE_AVX512)
#define ATTN_F32_EMULATED 1
#include "../isa/simde_avx512.h"
#else
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif
#endif

#define BQ    ATTN_BQ
#define BK    ATTN_BK
#define LOG2E 1.4426950408889634
