/* gdn_amx.c: the AMX build of the gated delta rule, for bf16 inputs. The algorithm is
 * gdn_kernel.inc's over the AVX-512 build's primitives, as in gdn_avx512bf16.c, whose chunk products
 * (every product of the chunked forward and of the backward) it shares: the same bf16 rounding of both
 * operands (to nearest even), the same packing into bf16 pairs and the same driver
 * (gdn_bf16_gemm.h), with the products on the AMX tiles instead of VDPBF16PS: blocks of 2 x 2 C tiles
 * of 16 x 16 f32 (zeroed, then K-steps of 16 pairs = 32 reduction indices in increasing order, each
 * loaded A and B tile feeding two TDPBF16PS), stored and finished by the same f32 epilogue in vector
 * code. What the algorithm keeps is f32, as in the AVX512-BF16 build: the state S and its gradient,
 * the triangular inverse, gates, decays, every elementwise step and every sum.
 * Tiles: palette 1, all 8 tiles 16 rows x 64 bytes (C 0..3, A 4..5, B 6..7), configured once per
 * chunked task (K_TASK_BEGIN: ldtilecfg is costly and zeroes the tiles) and released when the task
 * ends; a direct call of the product (the tests') configures and releases them itself. The OS's
 * permission for the tile state is asked by the CPU check (src/core/cpu_features.c), which the
 * dispatcher consults before selecting this build (mp_kernel_pick: the CPU must have AMX-TILE and
 * AMX-BF16 and the permission). Compiled for AVX-512 + AVX512-BF16 + AMX by a target pragma. */
#include "gdn_internal.h"

#include <math.h>
#include <stdlib.h>

#if defined(MASKPACK_EMULATE_AVX512)
/* a test build: the AVX-512 intrinsics carried out by SIMDe, the AVX512-BF16 and AMX ones by
 * ../isa/simde_amx.h with the instruction set reference's semantics (no target region); selected
 * only in the build whose CPU check reports AMX (MASKPACK_EMULATE_AMX) */
#define GDN_AMX_BUILD    1
#define GDN_AMX_EMULATED 1
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GDN_AMX_BUILD 1
#endif

#ifdef GDN_AMX_BUILD

#ifdef GDN_AMX_EMULATED
#include "../isa/simde_amx.h"
#else
#include "../isa/target_amx.h"
#include <immintrin.h>
#endif
#include <string.h>

#define BF_TILES 1
#include "gdn_bf16_gemm.h"

#include "../isa/amx_tiles.h" /* amx_tiles_on */

/* The driver's block (gdn_bf16_gemm.h) on the tiles: C rows [0, mr) (mr <= 32: one or two row
 * tiles) x columns [0, 16 nv) from pairs [p0, p1) (whole K-steps: p0 and p1 multiples of 16, the
 * packs padded with zeros to whole tiles, so the rows of a row tile past mr read zeros or other rows
 * and are not stored). A's rows are ars words apart (aks is 1 here), B's ldb. Each K-step loads up to
 * two A and two B tiles and each feeds two products; half skips the product of row tile 0 x column
 * tile 1 (not needed above the diagonal). The tiles go through a 32 x 32 f32 buffer to the epilogue. */
static inline void bf_block(int mr, int nv, int half, int64_t p0, int64_t p1, float alpha, const uint32_t *a,
                            int64_t ars, int64_t aks, const uint32_t *Bp, int64_t ldb, float *C, int64_t ldc, int acc,
                            const float *Cin, float cs) {
    (void)aks;
    const int two_r = mr > 16, two_c = nv == 2, c01 = two_c && !half;
    const long sa = (long)(ars * 4), sb = (long)(ldb * 4);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t p = p0; p < p1; p += 16) {
        const uint32_t *b = Bp + p * ldb;
        _tile_loadd(4, a + p, sa);
        _tile_loadd(6, b, sb);
        if (two_c) _tile_loadd(7, b + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        if (c01) _tile_dpbf16ps(1, 4, 7);
        if (two_r) {
            _tile_loadd(5, a + 16 * ars + p, sa);
            _tile_dpbf16ps(2, 5, 6);
            if (two_c) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _Alignas(64) float acc_buf[32][32];
    _tile_stored(0, &acc_buf[0][0], 128);
    if (c01) _tile_stored(1, &acc_buf[0][16], 128);
    if (two_r) {
        _tile_stored(2, &acc_buf[16][0], 128);
        if (two_c) _tile_stored(3, &acc_buf[16][16], 128);
    }
    const __m512 va = _mm512_set1_ps(alpha), vcs = _mm512_set1_ps(cs);
    for (int i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        const float *ci = Cin + i * ldc;
        _mm512_storeu_ps(c, bf_out(_mm512_load_ps(acc_buf[i]), ci, va, vcs, acc));
        if (two_c && (i >= 16 || c01))
            _mm512_storeu_ps(c + 16, bf_out(_mm512_load_ps(acc_buf[i] + 16), ci + 16, va, vcs, acc));
    }
}

/* gdn_gemm_x_avx512bf16's contract, on the tiles. The framework's calls (a packing area in pf) run
 * inside a task that configured the tiles (K_TASK_BEGIN below); any other call configures them
 * for itself and releases them after. */
void gdn_gemm_x_amx(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs) {
    const int own_tiles = !(pf && pf->pk);
    if (own_tiles) amx_tiles_on();
    bf_gemm_x(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, pf, Cin, cs);
    if (own_tiles) _tile_release();
}

/* gdn_gemm_avx512bf16's contract (C op= alpha A B, no workspace: the tests' plain call), on the tiles. */
void gdn_gemm_amx(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float *C, int64_t ldc, unsigned flags) {
    gdn_gemm_x_amx(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, NULL, C, 1.0f);
}

#define K_HAVE_LOAD_L2    1
#define k_load_l2_f32     gdn_load_l2_f32_avx512
#define K_HAVE_DECAY_ROWS 1
#define k_decay_rows      gdn_decay_rows_avx512
#define GDN_SUFFIX(name)  name##_amx
#define GDN_DEFINE_SIZES  1
#define GDN_SIZES(name)   name##_amx
#define K_PACK_WORDS(P)   bf_pack_words(P)
#define K_TASK_BEGIN()    amx_tiles_on()
#define K_TASK_END()      _tile_release()
#define k_gemm            gdn_gemm_amx
#define k_gemm_x          gdn_gemm_x_amx
#define k_pf_flush(pf)    gdn_pf_drain_avx512((pf), 1 << 30, INT64_MAX)
#define K_CAN_STREAM      1
#define k_stream_row      gdn_stream_row_avx512
#define k_stream_fence()  _mm_sfence()
#define k_expv            gdn_expv_avx512
#define k_transpose       gdn_transpose_avx512
#define k_copy            bf_copy
#define k_inv_lower       gdn_inv_lower_avx512
#include "gdn_kernel.inc"

#ifndef GDN_AMX_EMULATED
#include "../isa/target_pop.h"
#endif

#else /* no AMX build on this compiler/architecture: the dispatcher never selects it */

GDN_BF16_REF_FALLBACKS(amx, amx)
#endif
