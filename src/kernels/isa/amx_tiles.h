/* amx_tiles.h: the AMX tile configuration every tile kernel uses (attention forward and backward,
 * the gated delta rule's products). Included inside a target region that has AMX-TILE (or, in the
 * emulated test build, after simde_amx.h). */
#ifndef MASKPACK_AMX_TILES_H
#define MASKPACK_AMX_TILES_H

#include <stdint.h>
#include <string.h>

/* LDTILECFG's 64-byte operand (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

/* () -> this thread's tiles configured, all zero: every tile 16 rows x 64 bytes (C tiles 16 x 16 f32,
 * A tiles 16 rows x 32 bf16, B tiles 16 pairs x 16 columns x 2 bf16). LDTILECFG is not cheap and
 * zeroes the tiles: a kernel loads it once per thread's (or task's) work and ends that work with
 * _tile_release(). */
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

#endif
