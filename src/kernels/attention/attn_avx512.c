/* attn_avx512.c: AVX-512 f32 attention forward (the backward is attn_avx512_bwd.c): the forward
 * framework (attn_fwd_kernel.inc) over the f32 micro-kernels (attn_f32_kernel.inc) built on this
 * ISA's primitives (attn_avx512_uk.h: one zmm holds 16 query rows, 3 per block):
 *   S^T[j][i]  = sum_d K[j][d] * QT[d][i]           (broadcast K, 3 vector loads of QT per d)
 *   O^T[d][i] += sum_j V[j][d] * P^T[j][i]          (broadcast V, 3 vector loads of P^T per key)
 * bf16 inputs are widened to f32 when a tile is loaded. Compiled for AVX-512 with a target pragma;
 * chosen at run time only when the CPU has it. */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "attn_avx512_target.h" /* the AVX-512 target region, BQ, BK */

#include "attn_avx512_common.h"
#include "attn_avx512_uk.h"

#define ATTN_FN(name) attn_avx512_##name
#include "attn_f32_kernel.inc"
#include "attn_fwd_vec.inc"
#include "attn_fwd_kernel.inc"

#ifndef ATTN_F32_EMULATED
#include "../isa/target_pop.h"
#endif

#else /* no x86-64: never selected (mp_cpu_has_avx512() is 0) */

size_t attn_avx512_fwd_ws(const attn_problem *P) {
    (void)P;
    return 0;
}
void attn_avx512_fwd_thread(void *job, int tid) { attn_ref_fwd_thread(job, tid); }
#endif
