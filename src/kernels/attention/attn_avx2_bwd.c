/* attn_avx2_bwd.c: AVX2 + FMA f32 attention backward: the backward framework (attn_bwd_kernel.inc)
 * over the f32 tile loops (attn_f32_kernel.inc) and this ISA's primitives (attn_avx2_uk.h). Same
 * contracts, workspace layout, summation order and results (bit for bit) as attn_avx512_bwd.c. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "../isa/target_avx2.h"

#include "attn_avx2_uk.h"

#define ATTN_FN(name)       attn_avx2_##name
#define ATTN_F32_NO_FORWARD 1
#include "attn_f32_kernel.inc"
#include "attn_bwd_kernel.inc"

#include "../isa/target_pop.h"

#else /* no x86-64: never selected (mp_cpu_has_avx2() is 0) */

ATTN_BWD_NEVER_SELECTED(attn_avx2)

#endif
