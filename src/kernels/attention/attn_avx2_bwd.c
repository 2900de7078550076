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

size_t attn_avx2_bwd_ws(const attn_problem *P, int64_t w) {
    (void)P;
    (void)w;
    return 0;
}
void attn_avx2_bwd_thread(void *job, int tid) { attn_ref_bwd_thread(job, tid); }
void attn_avx2_bwd_reduce(const attn_bwd_job *job, int64_t u) {
    (void)job;
    (void)u;
}
size_t attn_avx2_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail) {
    (void)P;
    (void)max_width;
    (void)n_tail;
    return 0;
}
void attn_avx2_bwd_tail_reduce(void *job, int tid) {
    (void)job;
    (void)tid;
}

#endif
