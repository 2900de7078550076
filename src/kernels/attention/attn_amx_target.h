/* attn_amx_target.h: opens the AMX target region of the attention's tile kernels (attn_amx.c
 * forward, attn_amx_bwd.c backward) and the tile configuration (amx_tiles.h). In the emulated test
 * build (MASKPACK_EMULATE_AMX, tests/c/meson.build) there is no target region: simde_amx.h carries
 * the AVX-512, AVX512-BF16 and AMX intrinsics out in C. Included once per file, first of the
 * intrinsics; the file closes the region with its own pop at the end (none when emulated). The
 * including file defines its own block sizes (the forward's 64 query rows, the backward's 48). */
#if defined(MASKPACK_EMULATE_AMX)
#include "../isa/simde_amx.h"
#else
#include "../isa/target_amx.h"
#include <immintrin.h>
#endif

#include "../isa/amx_tiles.h" /* amx_tiles_on */
