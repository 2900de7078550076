/* attn_avx512_bwd.c: AVX-512 f32 attention backward: the backward framework (attn_bwd_kernel.inc)
 * over the f32 tile loops (attn_f32_kernel.inc) and this ISA's primitives (attn_avx512_uk.h).
 * Compiled for AVX-512 with a target pragma; chosen at run time only when the CPU has it. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_avx512_target.h" /* the AVX-512 target region, BQ, BK */

#include "attn_avx512_common.h"
#include "attn_avx512_uk.h"

#define ATTN_FN(name)       attn_avx512_##name
#define ATTN_F32_NO_FORWARD 1
#include "attn_f32_kernel.inc"
#include "attn_bwd_kernel.inc"

#ifndef ATTN_F32_EMULATED
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected (mp_cpu_has_avx512() is 0) */

ATTN_BWD_NEVER_SELECTED(attn_avx512)

#endif
