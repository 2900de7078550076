/* attn_avx2.c: AVX2 + FMA f32 attention forward: attn_avx512.c compiled a second time for AVX2
 * through attn_avx2_shim.h (same per-lane arithmetic, so the AVX-512 kernel's results bit for bit),
 * entry points attn_avx2_fwd_ws / attn_avx2_fwd_thread. Chosen at run time for CPUs with AVX2 +
 * FMA but no AVX-512, or forced with MASKPACK_ISA=avx2. */
#define ATTN_AVX2_BUILD 1
#include "attn_avx512.c"
