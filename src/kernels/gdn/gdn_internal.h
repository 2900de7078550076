/* gdn_internal.h: shared definitions of the Gated DeltaNet kernels (never installed).
 *
 * The API layer (gdn_api.c) validates tensors, turns them into token views and runs tasks on
 * threads; the rule's algorithms live once in gdn_kernel.inc, compiled twice: portable C
 * (gdn_ref.c) and AVX-512 (gdn_avx512.c), each supplying its own GEMM, exp and transpose
 * primitives. */
#ifndef MASKPACK_GDN_INTERNAL_H
#define MASKPACK_GDN_INTERNAL_H

#include "internal.h"
#include "../kernel_table.h"

#include <stddef.h>
#include <stdint.h>

#define GDN_C MASKPACK_GDN_CHUNK

/* A per-token tensor seen through the layout: element (b, s, h, d) of a padded tensor, or
 * (s, h, d) of a packed one (b = 0, s_row unused), sits at b*s_row + s*s_col + h*s_h + d*s_d. */
typedef mp_token_view gdn_view; /* the kernels' one token view (internal.h) */

/* A per-segment state tensor [N, HV, K, V] (or [N, C, W-1] for the conv: s_h = channel). */
typedef struct gdn_sview {
    char *base; /* NULL = absent */
    maskpack_dtype dt;
    int64_t s_n, s_h, s_k, s_v;
} gdn_sview;

typedef struct gdn_problem {
    const maskpack_layout *L;
    int64_t H, HV, G, K, V; /* G = HV / H value heads per key head */
    int64_t Kp, Vp;         /* K and V rounded up to 16 (internal row lengths) */
    float scale;
    int l2norm;
    gdn_view q, k, v, g, beta, o;       /* forward */
    gdn_view dO, dq, dk, dv, dg, dbeta; /* backward */
    gdn_sview h0, ht, dht, dh0;
    int64_t bwd_slots; /* backward: state buffers per value head (GDN_BWD_SLOTS unless a test asks) */
} gdn_problem;

/* The backward keeps the chunk-start states it needs with binomial ("revolve") checkpointing in a
 * fixed number of state buffers per value head, whatever the segment length: GDN_BWD_SLOTS - 1
 * checkpoints plus one buffer the last one advances into. A segment of up to GDN_BWD_SLOTS chunks
 * keeps every state (each computed once); a longer one recomputes states, each chunk at most r
 * times with r the smallest such that binom(GDN_BWD_SLOTS - 1 + r, r) >= its chunk count (r = 3
 * up to 816 chunks, 4 up to 3876). Tests may ask for 2..GDN_BWD_MAX_SLOTS buffers. */
#define GDN_BWD_SLOTS     16
#define GDN_BWD_MAX_SLOTS 64

/* GEMM flags: C (m x n) op= alpha * A (m x kd) * B (kd x n), row-major, n a multiple of 16. */
enum {
    GDN_GEMM_ACC = 1u,     /* C += ...; otherwise C = ... */
    GDN_GEMM_AT = 2u,      /* A is stored transposed (kd x m, row stride lda) */
    GDN_GEMM_TRI_OUT = 4u, /* only entries j <= i are needed (others may be left unwritten) */
    GDN_GEMM_TRI_LO = 8u,  /* A(i, k) = 0 for k > i: the inner loop may stop at i */
    GDN_GEMM_TRI_UP = 16u  /* A(i, k) = 0 for k < i: the inner loop may start at i */
};

/* Cache lines to prefetch (the next chunk's rows), drained a few at a time between GEMM tiles so
 * that the fetches overlap this chunk's arithmetic: the token-major inputs put every (token, head)
 * row on its own page, which the hardware prefetchers do not follow, and one burst of a whole
 * chunk's lines would stall on the fill buffers. An entry with bit 0 set is prefetched for writing. */
typedef struct gdn_pf {
    const char **line;
    int64_t n, next, cap;
    /* Rows waiting to be stored the same way (streaming stores, drained between tiles so that
     * they overlap arithmetic too): row r < st_n goes from st_src + r * st_lds to st_dst + r *
     * st_ldd, st_len floats times st_mul. Only the AVX-512 and AVX2 builds queue rows. */
    float *st_dst;
    const float *st_src;
    int64_t st_n, st_next, st_len, st_ldd, st_lds;
    float st_mul;
    /* The bf16 builds' packing area (gdn_avx512bf16.c, gdn_amx.c): the two operands of one product as
     * bf16 pairs, pk_words 32-bit words carved from the thread's workspace; NULL in the f32 builds. */
    uint32_t *pk;
    int64_t pk_words;
} gdn_pf;

/* Floats of per-thread workspace: forward (chunked or recurrent) and backward; the _bf16 and _amx
 * ones add the bf16 builds' packing area. */
size_t gdn_ws_floats_fwd(const gdn_problem *P, int chunked);
size_t gdn_ws_floats_bwd(const gdn_problem *P);
size_t gdn_ws_floats_fwd_bf16(const gdn_problem *P, int chunked);
size_t gdn_ws_floats_bwd_bf16(const gdn_problem *P);
size_t gdn_ws_floats_fwd_amx(const gdn_problem *P, int chunked);
size_t gdn_ws_floats_bwd_amx(const gdn_problem *P);

/* Tasks. Chunked forward and backward: one segment and one key head (its G value heads);
 * recurrent forward: one segment and one value head. ws: aligned per-thread workspace. */
typedef void (*gdn_task_fn)(const gdn_problem *P, size_t seg, int64_t head, float *ws);

void gdn_fwd_chunk_ref(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
void gdn_fwd_recurrent_ref(const gdn_problem *P, size_t seg, int64_t hv, float *ws);
void gdn_bwd_chunk_ref(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
void gdn_fwd_chunk_avx512(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
void gdn_fwd_recurrent_avx512(const gdn_problem *P, size_t seg, int64_t hv, float *ws);
void gdn_bwd_chunk_avx512(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
void gdn_fwd_chunk_avx2(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
void gdn_fwd_recurrent_avx2(const gdn_problem *P, size_t seg, int64_t hv, float *ws);
void gdn_bwd_chunk_avx2(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
/* The AVX512-BF16 build (gdn_avx512bf16.c): the chunked forms with bf16 chunk products; its
 * recurrent forward is the AVX-512 one (no products to take in bf16). */
void gdn_fwd_chunk_avx512bf16(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
void gdn_bwd_chunk_avx512bf16(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
/* The AMX build (gdn_amx.c): the same chunked forms with the same bf16 products on the tiles
 * (TDPBF16PS); its recurrent forward is the AVX-512 one too. */
void gdn_fwd_chunk_amx(const gdn_problem *P, size_t seg, int64_t kh, float *ws);
void gdn_bwd_chunk_amx(const gdn_problem *P, size_t seg, int64_t kh, float *ws);

/* Primitive tests hook (used by tests/c/test_gdn.c through the static library). */
void gdn_gemm_ref(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float *C, int64_t ldc, unsigned flags);
void gdn_gemm_avx512(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float *C, int64_t ldc, unsigned flags);
/* The GEMMs the kernels call: like gdn_gemm_*, but with GDN_GEMM_ACC the result is
 * C = cs * Cin + alpha * A * B (Cin has C's row stride and may be C itself), and pf (may be NULL)
 * is drained between tiles. */
void gdn_gemm_x_ref(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);
void gdn_gemm_x_avx512(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                       int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);
void gdn_transpose_avx512(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd);
void gdn_expv_avx512(float *x, int64_t n);
/* A = (I + Lm)^-1 of one chunk as each build computes it (k_inv_lower of gdn_kernel.inc): Lm strictly
 * lower [n, ld] (n <= cn <= GDN_C, cn a multiple of 16), A [n, ld] written in columns [0, cn). */
void gdn_inv_lower_ref(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld);
void gdn_inv_lower_avx512(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld);
void gdn_inv_lower_avx2(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld);
/* The AVX512-BF16 build's products: gdn_gemm_x_avx512 with every operand rounded to bf16 (to
 * nearest even) and f32 accumulation (VDPBF16PS over pairs along kd). Without pf->pk (pf NULL: the
 * tests) the packing area is allocated per call. */
void gdn_gemm_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, unsigned flags);
void gdn_gemm_x_avx512bf16(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf,
                           const float *Cin, float cs);
/* The AMX build's products: the same contract and the same bf16 operands, multiplied on the tiles
 * (TDPBF16PS, f32 accumulation); a call outside the build's tasks configures the tiles itself. */
void gdn_gemm_amx(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float *C, int64_t ldc, unsigned flags);
void gdn_gemm_x_amx(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);
/* The AVX-512 build's row primitives, exported for the AVX512-BF16 build, which shares them (see
 * gdn_avx512.c: pf_drain, avx_stream_row, avx_load_l2_f32, avx_decay_rows). */
void gdn_pf_drain_avx512(gdn_pf *pf, int count, int64_t rows);
void gdn_stream_row_avx512(float *dst, const float *src, int64_t n, float mul);
float gdn_load_l2_f32_avx512(float *dst, const float *src, int64_t n, int64_t np, int on);
void gdn_decay_rows_avx512(const float *Gc, const float *bv, const float *KK, const float *QK, float *D, float *Lm,
                           float *Pm, int64_t n, int64_t cn, int64_t ld);
/* The same primitives of the AVX2 + FMA build (gdn_avx2.c). */
void gdn_gemm_avx2(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc, unsigned flags);
void gdn_gemm_x_avx2(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);
void gdn_transpose_avx2(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd);
void gdn_expv_avx2(float *x, int64_t n);

/* One entry of the rule's kernel table (gdn_api.c): its ISA and dtypes, workspace functions, the
 * tasks of the framework (gdn_kernel.inc) compiled for it, and the micro-kernels the tests check
 * against the reference entry's. */
typedef struct gdn_kernel {
    struct mp_kernel_desc desc;
    size_t (*ws_floats_fwd)(const gdn_problem *P, int chunked);
    size_t (*ws_floats_bwd)(const gdn_problem *P);
    gdn_task_fn fwd_chunk, fwd_recurrent, bwd_chunk;
    void (*gemm)(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                 int64_t ldb, float *C, int64_t ldc, unsigned flags);
    void (*gemm_x)(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);
    void (*inv_lower)(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld);
    /* the vector entries' own transpose and exp (the reference's are plain loops: NULL) */
    void (*transpose)(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd);
    void (*expv)(float *x, int64_t n);
} gdn_kernel;

/* () -> the rule's kernel table (reference first) and *n its entries. */
const gdn_kernel *gdn_kernels(size_t *n);

/* maskpack_gdn_backward and maskpack_gdn_workspace_size with `slots` state buffers per value head
 * in the backward (0 = GDN_BWD_SLOTS, else 2..GDN_BWD_MAX_SLOTS): the test hook that forces deep
 * recomputation on short segments (results must not depend on it). */
maskpack_status gdn_backward_slots(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                   const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                   const maskpack_gdn_options *opts, maskpack_gdn_grads *grads, void *workspace,
                                   size_t workspace_bytes, int slots, maskpack_error *err);
maskpack_status gdn_workspace_size_slots(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                         const maskpack_gdn_options *opts, int backward, int slots, size_t *bytes,
                                         maskpack_error *err);

/* Where a vector build cannot be compiled (not x86-64 GCC/clang) its entry points still have to
 * link: GDN_REF_FALLBACKS(sfx) defines them as the portable build's (the dispatcher never selects
 * them there: mp_cpu_features() of src/core/cpu_features.h, which the dispatcher asks, is 0 off
 * x86-64 GCC/clang, the same condition that leaves the vector builds out). */
#define GDN_REF_FALLBACKS(sfx)                                                                                         \
    GDN_REF_FALLBACK_PRODUCTS(sfx)                                                                                     \
    void gdn_fwd_recurrent_##sfx(const gdn_problem *P, size_t seg, int64_t hv, float *ws) {                            \
        gdn_fwd_recurrent_ref(P, seg, hv, ws);                                                                         \
    }                                                                                                                  \
    void gdn_transpose_##sfx(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {     \
        for (int64_t r = 0; r < rows; r++)                                                                             \
            for (int64_t c = 0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];                                    \
    }                                                                                                                  \
    void gdn_expv_##sfx(float *x, int64_t n) {                                                                         \
        for (int64_t i = 0; i < n; i++) x[i] = expf(x[i]);                                                             \
    }                                                                                                                  \
    void gdn_inv_lower_##sfx(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld) {                           \
        gdn_inv_lower_ref(Lm, A, n, cn, ld);                                                                           \
    }

/* The chunked forward and backward and the two GEMMs of GDN_REF_FALLBACKS: what a bf16 build (which
 * borrows the rest from the AVX-512 build) defines; GDN_BF16_REF_FALLBACKS adds its workspace sizes
 * (name##_sizes: the f32 framework's, the packing area included in both). */
#define GDN_BF16_REF_FALLBACKS(sfx, sizes)                                                                             \
    GDN_REF_FALLBACK_PRODUCTS(sfx)                                                                                     \
    size_t gdn_ws_floats_fwd_##sizes(const gdn_problem *P, int chunked) { return gdn_ws_floats_fwd(P, chunked); }     \
    size_t gdn_ws_floats_bwd_##sizes(const gdn_problem *P) { return gdn_ws_floats_bwd(P); }
#define GDN_REF_FALLBACK_PRODUCTS(sfx)                                                                                 \
    void gdn_fwd_chunk_##sfx(const gdn_problem *P, size_t seg, int64_t kh, float *ws) {                                \
        gdn_fwd_chunk_ref(P, seg, kh, ws);                                                                             \
    }                                                                                                                  \
    void gdn_bwd_chunk_##sfx(const gdn_problem *P, size_t seg, int64_t kh, float *ws) {                                \
        gdn_bwd_chunk_ref(P, seg, kh, ws);                                                                             \
    }                                                                                                                  \
    void gdn_gemm_##sfx(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,    \
                        int64_t ldb, float *C, int64_t ldc, unsigned flags) {                                          \
        gdn_gemm_ref(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags);                                                  \
    }                                                                                                                  \
    void gdn_gemm_x_##sfx(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,  \
                          int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin,            \
                          float cs) {                                                                                  \
        gdn_gemm_x_ref(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags, pf, Cin, cs);                                   \
    }

#endif
