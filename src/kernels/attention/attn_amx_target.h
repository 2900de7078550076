/* attn_amx_target.h: opens the AMX target region of the attention's tile kernels (attn_amx.c
 * forward, attn_amx_bwd.c backward) and the tile configuration they share. In the emulated test
 * build (MASKPACK_EMULATE_AMX, tests/c/meson.build) there is no target region: simde_amx.h carries
 * the AVX-512, AVX512-BF16 and AMX intrinsics out in C. Included once per file, first of the
 * intrinsics; the file closes the region with its own pop at the end (none when emulated). The
 * including file defines its own block sizes (the forward's 64 query rows, the backward's 48). */
#if defined(MASKPACK_EMULATE_AMX)
#include "../isa/simde_amx.h"
#else
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                                          \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,prfchw"))),             \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,prfchw")
#endif
#endif

#include <string.h>

/* LDTILECFG's 64-byte operand (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

/* Every tile is 16 rows x 64 bytes: C tiles 16 x 16 f32, A tiles 16 x 32 bf16, B tiles 16 pairs x
 * 16 x 2 bf16. Loaded once per thread's work (LDTILECFG zeroes the tiles and is not cheap), released
 * with _tile_release() when the thread is done. */
static inline void amx_tiles_on(void) {
    amx_tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}
