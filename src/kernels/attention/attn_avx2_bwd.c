/* attn_avx2_bwd.c: AVX2 + FMA f32 attention backward: attn_avx512_bwd.c compiled a second time for
 * AVX2 through attn_avx2_shim.h (same per-lane arithmetic and summation order, so the AVX-512
 * kernel's results bit for bit), entry points attn_avx2_bwd_*. */
#define ATTN_AVX2_BUILD 1
#include "attn_avx512_bwd.c"
