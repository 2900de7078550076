/* simde_amx.h: test builds only (MASKPACK_EMULATE_AMX, tests/c/meson.build). The AVX512-BF16 and AMX
 * intrinsics of the bf16 attention kernels (attn_avx512bf16.c, attn_amx.c), carried out in portable
 * C on any x86-64 CPU, beside the AVX-512 ones SIMDe carries out (simde_avx512.h), so the code of
 * those kernels is tested against the reference kernel on machines without AMX or AVX512-BF16 (CI's
 * among them). Semantics as the instruction set reference gives them: VCVTNE(2)PS2BF16 rounds to
 * nearest even and quiets NaNs; VDPBF16PS and TDPBF16PS add the products of bf16 pairs (exact in
 * f32) to f32 accumulators, the even element's product first; a tile is 16 rows of 64 bytes whose
 * configured rows and bytes per row are read and written, the rest zeroed, per thread (each thread
 * loads its own configuration, as on the hardware). The rounding of the hardware's accumulation may
 * differ in the last bit; the tests that run this build compare with the reference within their
 * tolerances, never bitwise. Never part of the library. */
#ifndef MASKPACK_SIMDE_AMX_H
#define MASKPACK_SIMDE_AMX_H

#include "simde_avx512.h"

#include <stdint.h>
#include <string.h>

static inline float mp_emu_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t mp_emu_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- AVX-512 intrinsics this SIMDe release lacks, used by the bf16 kernels only ------------------ */

typedef simde__mmask32 __mmask32;

#ifndef _mm512_maskz_loadu_epi16
/* 32 words, those of clear mask bits 0 and never read (the hardware's fault suppression) */
static inline simde__m512i mp_emu_maskz_loadu_epi16(simde__mmask32 k, const void *p) {
    simde__m512i_private r;
    const uint16_t *w = (const uint16_t *)p;
    for (int i = 0; i < 32; i++) r.u16[i] = (k >> i) & 1 ? w[i] : 0;
    return simde__m512i_from_private(r);
}
#define _mm512_maskz_loadu_epi16(k, p) mp_emu_maskz_loadu_epi16((k), (p))
#endif

#ifndef _mm512_reduce_max_ps
static inline float mp_emu_reduce_max_ps(simde__m512 v) {
    const simde__m512_private a = simde__m512_to_private(v);
    float m = a.f32[0];
    for (int i = 1; i < 16; i++) m = a.f32[i] > m ? a.f32[i] : m;
    return m;
}
#define _mm512_reduce_max_ps(v) mp_emu_reduce_max_ps(v)
#endif

#ifndef _mm512_cvtepu16_epi32
/* 16 uint16 -> 16 int32, zero-extended */
static inline simde__m512i mp_emu_cvtepu16_epi32(simde__m256i a) {
    uint16_t x[16];
    memcpy(x, &a, sizeof x);
    simde__m512i_private r;
    for (int i = 0; i < 16; i++) r.i32[i] = (int32_t)x[i];
    return simde__m512i_from_private(r);
}
#define _mm512_cvtepu16_epi32(a) mp_emu_cvtepu16_epi32(a)
#endif

/* ---- AVX512-BF16 --------------------------------------------------------------------------- */

/* 16 floats -> 16 bf16 */
static inline simde__m256bh mp_emu_cvtneps_pbh(simde__m512 a) {
    const simde__m512_private x = simde__m512_to_private(a);
    uint16_t r[16];
    for (int i = 0; i < 16; i++) r[i] = mp_emu_f32_to_bf16(x.f32[i]);
    simde__m256bh out;
    memcpy(&out, r, sizeof out);
    return out;
}
#undef _mm512_cvtneps_pbh
#define _mm512_cvtneps_pbh(a) mp_emu_cvtneps_pbh(a)

/* (a, b) -> 32 bf16: b's 16 in the low half, a's in the high half */
static inline simde__m512bh mp_emu_cvtne2ps_pbh(simde__m512 a, simde__m512 b) {
    const simde__m512_private x = simde__m512_to_private(a), y = simde__m512_to_private(b);
    uint16_t r[32];
    for (int i = 0; i < 16; i++) {
        r[i] = mp_emu_f32_to_bf16(y.f32[i]);
        r[16 + i] = mp_emu_f32_to_bf16(x.f32[i]);
    }
    simde__m512bh out;
    memcpy(&out, r, sizeof out);
    return out;
}
#undef _mm512_cvtne2ps_pbh
#define _mm512_cvtne2ps_pbh(a, b) mp_emu_cvtne2ps_pbh((a), (b))

/* acc[i] += a.bf16[2i] b.bf16[2i] + a.bf16[2i+1] b.bf16[2i+1] */
static inline simde__m512 mp_emu_dpbf16_ps(simde__m512 acc, simde__m512bh a, simde__m512bh b) {
    simde__m512_private r = simde__m512_to_private(acc);
    uint16_t x[32], y[32];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    for (int i = 0; i < 16; i++) {
        r.f32[i] += mp_emu_bf16_to_f32(x[2 * i]) * mp_emu_bf16_to_f32(y[2 * i]);
        r.f32[i] += mp_emu_bf16_to_f32(x[2 * i + 1]) * mp_emu_bf16_to_f32(y[2 * i + 1]);
    }
    return simde__m512_from_private(r);
}
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps(acc, a, b) mp_emu_dpbf16_ps((acc), (a), (b))

/* ---- AMX-TILE and AMX-BF16 ------------------------------------------------------------------ */

typedef struct {
    uint8_t rows[8];
    uint16_t colsb[8];
    _Alignas(64) unsigned char data[8][16][64];
} mp_emu_tiles;

static _Thread_local mp_emu_tiles mp_emu_tile_state;

/* The 64-byte configuration of palette 1: colsb[16] at byte 16, rows[16] at byte 48. */
static inline void mp_emu_tile_loadconfig(const void *cfg) {
    const unsigned char *c = cfg;
    for (int t = 0; t < 8; t++) {
        uint16_t cb;
        memcpy(&cb, c + 16 + 2 * t, sizeof cb);
        mp_emu_tile_state.colsb[t] = cb > 64 ? 64 : cb;
        mp_emu_tile_state.rows[t] = c[48 + t] > 16 ? 16 : c[48 + t];
    }
    memset(mp_emu_tile_state.data, 0, sizeof mp_emu_tile_state.data);
}

static inline void mp_emu_tile_release(void) { memset(&mp_emu_tile_state, 0, sizeof mp_emu_tile_state); }

static inline void mp_emu_tile_loadd(int t, const void *base, long stride) {
    memset(mp_emu_tile_state.data[t], 0, sizeof mp_emu_tile_state.data[t]);
    for (int r = 0; r < mp_emu_tile_state.rows[t]; r++)
        memcpy(mp_emu_tile_state.data[t][r], (const char *)base + (long)r * stride, mp_emu_tile_state.colsb[t]);
}

static inline void mp_emu_tile_stored(int t, void *base, long stride) {
    for (int r = 0; r < mp_emu_tile_state.rows[t]; r++)
        memcpy((char *)base + (long)r * stride, mp_emu_tile_state.data[t][r], mp_emu_tile_state.colsb[t]);
}

static inline void mp_emu_tile_zero(int t) { memset(mp_emu_tile_state.data[t], 0, sizeof mp_emu_tile_state.data[t]); }

/* C[m][n] += sum_k A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1] (C: f32, A and B: bf16 pairs) */
static inline void mp_emu_tile_dpbf16ps(int c, int a, int b) {
    mp_emu_tiles *s = &mp_emu_tile_state;
    const int M = s->rows[c], N = s->colsb[c] / 4, K = s->colsb[a] / 4;
    for (int m = 0; m < M; m++) {
        float acc[16];
        memcpy(acc, s->data[c][m], sizeof acc);
        for (int k = 0; k < K; k++) {
            uint16_t av[2], bv[32];
            memcpy(av, s->data[a][m] + 4 * k, sizeof av);
            memcpy(bv, s->data[b][k], sizeof bv);
            for (int n = 0; n < N; n++) {
                acc[n] += mp_emu_bf16_to_f32(av[0]) * mp_emu_bf16_to_f32(bv[2 * n]);
                acc[n] += mp_emu_bf16_to_f32(av[1]) * mp_emu_bf16_to_f32(bv[2 * n + 1]);
            }
        }
        memcpy(s->data[c][m], acc, 4 * (size_t)N);
    }
}

#define _tile_loadconfig(cfg)               mp_emu_tile_loadconfig(cfg)
#define _tile_release()                     mp_emu_tile_release()
#define _tile_loadd(t, base, stride)        mp_emu_tile_loadd((t), (base), (long)(stride))
#define _tile_stream_loadd(t, base, stride) mp_emu_tile_loadd((t), (base), (long)(stride))
#define _tile_stored(t, base, stride)       mp_emu_tile_stored((t), (base), (long)(stride))
#define _tile_zero(t)                       mp_emu_tile_zero(t)
#define _tile_dpbf16ps(c, a, b)             mp_emu_tile_dpbf16ps((c), (a), (b))

#endif
