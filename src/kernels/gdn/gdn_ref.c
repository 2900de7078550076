/* gdn_ref.c: the portable (reference) build of the gated delta rule: plain loops for the GEMM,
 * libm expf and a plain transpose, plugged into the shared algorithms of gdn_kernel.inc. */
#include "gdn_internal.h"

#include <math.h>
#include <string.h>

/* C op= alpha * A * B, row by row; only the entries and inner ranges the flags ask for. */
void gdn_gemm_ref(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float *C, int64_t ldc, unsigned flags) {
    const int at = (flags & GDN_GEMM_AT) != 0;
    for (int64_t i = 0; i < m; i++) {
        float *c = C + i * ldc;
        const int64_t jmax = (flags & GDN_GEMM_TRI_OUT) ? (i + 1 < n ? i + 1 : n) : n;
        const int64_t k0 = (flags & GDN_GEMM_TRI_UP) ? (i < kd ? i : kd) : 0;
        const int64_t k1 = (flags & GDN_GEMM_TRI_LO) ? (i + 1 < kd ? i + 1 : kd) : kd;
        if (!(flags & GDN_GEMM_ACC))
            for (int64_t j = 0; j < jmax; j++) c[j] = 0.0f;
        for (int64_t k = k0; k < k1; k++) {
            const float a = alpha * (at ? A[k * lda + i] : A[i * lda + k]);
            const float *b = B + k * ldb;
            for (int64_t j = 0; j < jmax; j++) c[j] += a * b[j];
        }
    }
}

static void ref_expv(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = expf(x[i]);
}

static void ref_transpose(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

static void ref_copy(float *dst, const float *src, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

/* A = (I + Lm)^-1 by forward substitution: row r = e_r - sum_{j<r} Lm[r][j] A[j] (A[j] is zero past
 * column j, so each update touches the columns up to j only). Columns up to cn are written. */
static void ref_inv_lower(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld) {
    for (int64_t r = 0; r < n; r++) {
        float *ar = A + r * ld;
        for (int64_t j = 0; j < cn; j++) ar[j] = 0.0f;
        ar[r] = 1.0f;
        const float *l = Lm + r * ld;
        for (int64_t j = 0; j < r; j++) {
            const float lj = l[j];
            const float *aj = A + j * ld;
            for (int64_t c = 0; c <= j; c++) ar[c] -= lj * aj[c];
        }
    }
}

/* The kernels' GEMM: C = cs Cin first when accumulating into another array or with a scale, then
 * the plain accumulation (the portable build issues no prefetches). */
void gdn_gemm_x_ref(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs) {
    (void)pf;
    if ((flags & GDN_GEMM_ACC) && (Cin != C || cs != 1.0f)) {
        for (int64_t i = 0; i < m; i++) {
            const int64_t jmax = (flags & GDN_GEMM_TRI_OUT) ? (i + 1 < n ? i + 1 : n) : n;
            for (int64_t j = 0; j < jmax; j++) C[i * ldc + j] = cs * Cin[i * ldc + j];
        }
    }
    gdn_gemm_ref(m, n, kd, alpha, A, lda, B, ldb, C, ldc, flags);
}

#define GDN_SUFFIX(name)               name##_ref
#define GDN_DEFINE_SIZES               1
#define k_gemm                         gdn_gemm_ref
#define k_gemm_x                       gdn_gemm_x_ref
#define k_pf_flush(pf)                 ((void)(pf))
#define K_CAN_STREAM                   0
#define k_stream_row(dst, src, n, mul) ((void)0)
#define k_stream_fence()               ((void)0)
#define k_expv                         ref_expv
#define k_transpose                    ref_transpose
#define k_copy                         ref_copy
#define k_inv_lower                    ref_inv_lower
#include "gdn_kernel.inc"
