/* attn_avx2.c: AVX2 + FMA f32 attention forward, for CPUs with AVX2 + FMA but no AVX-512 (or forced
 * with MASKPACK_ISA=avx2): the forward framework (attn_fwd_kernel.inc) over the f32 micro-kernels
 * (attn_f32_kernel.inc) built on this ISA's primitives (attn_avx2_uk.h: one ymm holds 8 query rows,
 * 6 per block). Same contracts, workspace layout and results (bit for bit) as attn_avx512.c. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "../isa/target_avx2.h"

#include "attn_avx2_uk.h"

#define ATTN_FN(name) attn_avx2_##name
#include "attn_f32_kernel.inc"
#include "attn_fwd_vec.inc"
#include "attn_fwd_kernel.inc"

#include "../isa/target_pop.h"

#else /* no x86-64: never selected (mp_cpu_has_avx2() is 0) */

size_t attn_avx2_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}
void attn_avx2_fwd_thread(void *job, int tid) { attn_ref_fwd_thread(job, tid); }
#endif
