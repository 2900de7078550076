/* attn_f32_target.h: opens the target region of the f32 vector attention kernels (attn_avx512.c,
 * attn_avx512_bwd.c) and the constants they share. With ATTN_AVX2_BUILD (set by attn_avx2*.c,
 * which include those files) the same kernel is compiled for AVX2 + FMA, the AVX-512 intrinsics
 * provided by attn_avx2_shim.h; without it, for AVX-512 (or, in the emulated test build,
 * MASKPACK_EMULATE_AVX512, for none: SIMDe carries the intrinsics out and ATTN_F32_EMULATED says
 * so). Included once per file, first of the intrinsics; the file closes the region with its own
 * pop at the end (none when ATTN_F32_EMULATED). */
#if defined(MASKPACK_EMULATE_AVX512) && !defined(ATTN_AVX2_BUILD)
#define ATTN_F32_EMULATED 1
#include "../isa/simde_avx512.h"
#else
#include <immintrin.h>
#endif

#if defined(ATTN_AVX2_BUILD)
#include "../isa/target_avx2.h"
#include "attn_avx2_shim.h"
#elif defined(ATTN_F32_EMULATED)
/* a test build: no target region, the intrinsics are SIMDe's (simde_avx512.h above) */
#else
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#endif
#endif

#define BQ ATTN_BQ
#define BK ATTN_BK
#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453
