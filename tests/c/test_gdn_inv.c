/* test_gdn_inv.c: the Gated DeltaNet chunk's triangular inverse A = (I + L)^-1 of every build this
 * CPU runs (portable, AVX-512, AVX2), on its own and against exact answers: bidiagonal L with a
 * power-of-two entry, whose inverse is exact in float (A[r][c] = (-x)^(r-c)), for every chunk length
 * 1..64; dense random L against forward substitution in double; the columns past the diagonal up to
 * the 16-column block exactly zero and those past it untouched. A wrong inverse (GCC 12.2 once
 * applied a block's tail row twice in the AVX-512 code of a coverage build: row 1 came out as
 * -2 L[1][0]) shows here as a wrong entry, in whatever build it happens. */
#include "check.h"
#include "cpu_features.h"

#include "../../src/kernels/gdn/gdn_internal.h"

#include <math.h>
#include <stdlib.h>

#define LD 80 /* a row stride wider than the 64 columns written, so the untouched tail is seen */

typedef void (*inv_fn)(const float *Lm, float *A, int64_t n, int64_t cn, int64_t ld);

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static double rnd(void) {
    return (double)(test_lcg_next(&rng_state) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
} /* [-1, 1) */

/* Runs fn on Lm for n rows; checks the untouched columns [cn, LD) of rows < n and every row >= n,
 * and returns the worst |A - want| over columns [0, cn) of rows < n (want: [64][64] doubles). */
static double run_one(inv_fn fn, const float *Lm, int64_t n, const double *want) {
    static float A[64 * LD];
    const float sentinel = -7.5f;
    for (int i = 0; i < 64 * LD; i++) A[i] = sentinel;
    const int64_t cn = (n + 15) / 16 * 16;
    fn(Lm, A, n, cn, LD);
    double worst = 0.0;
    int untouched = 1;
    for (int64_t r = 0; r < 64; r++)
        for (int64_t c = 0; c < LD; c++) {
            const float a = A[r * LD + c];
            if (r >= n || c >= cn) {
                if (a != sentinel) untouched = 0;
                continue;
            }
            const double d = fabs((double)a - want[r * 64 + c]);
            if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
        }
    CHECK(untouched);
    return worst;
}

/* forward substitution in double: the reference inverse of the first n rows (zero past the diagonal) */
static void inverse_double(const float *Lm, int64_t n, double *want) {
    for (int64_t r = 0; r < 64; r++)
        for (int64_t c = 0; c < 64; c++) want[r * 64 + c] = 0.0;
    for (int64_t r = 0; r < n; r++) {
        want[r * 64 + r] = 1.0;
        for (int64_t j = 0; j < r; j++)
            for (int64_t c = 0; c <= j; c++) want[r * 64 + c] -= (double)Lm[r * LD + j] * want[j * 64 + c];
    }
}

static void check_build(const char *name, inv_fn fn) {
    static float Lm[64 * LD];
    static double want[64 * 64];
    /* bidiagonal: L[r][r-1] = x, so A[r][c] = (-x)^(r-c) for c <= r, exact in float for x = +-1/2, 1 */
    const float xs[] = {0.5f, -0.5f, 1.0f, -1.0f};
    double worst_exact = 0.0;
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        for (int i = 0; i < 64 * LD; i++) Lm[i] = 0.0f;
        for (int r = 1; r < 64; r++) Lm[r * LD + r - 1] = xs[k];
        inverse_double(Lm, 64, want);
        for (int64_t n = 1; n <= 64; n++) {
            const double w = run_one(fn, Lm, n, want);
            if (w != 0.0)
                fprintf(stderr, "%s: bidiagonal x = %g, n = %lld: worst error %g\n", name, (double)xs[k], (long long)n,
                        w);
            CHECK(w == 0.0);
            if (w > worst_exact) worst_exact = w;
        }
    }
    /* dense, strictly lower, small entries (the decays times beta times K K^T the layer produces) */
    double worst_dense = 0.0;
    for (int trial = 0; trial < 3; trial++) {
        for (int i = 0; i < 64 * LD; i++) Lm[i] = 0.0f;
        for (int r = 0; r < 64; r++)
            for (int j = 0; j < r; j++) Lm[r * LD + j] = (float)(0.08 * rnd());
        inverse_double(Lm, 64, want);
        for (int64_t n = 1; n <= 64; n++) {
            const double w = run_one(fn, Lm, n, want);
            CHECK(w < 1e-5);
            if (w > worst_dense) worst_dense = w;
        }
    }
    printf("test_gdn_inv: %s: bidiagonal worst %g (exact), dense worst %.3g\n", name, worst_exact, worst_dense);
}

/* whether the library runs the AVX-512 kernel here: on an AVX-512 CPU, or in the emulated test build */
static int have_avx512(void) {
    maskpack_isa r;
    maskpack_error err;
    return maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AVX512, &r, &err) == MASKPACK_OK;
}

int main(void) {
    /* every entry of the rule's kernel table this CPU (or the emulated build) runs */
    size_t n, ran = 0;
    const gdn_kernel *K = gdn_kernels(&n);
    for (size_t i = 0; i < n; i++) {
        maskpack_isa r;
        maskpack_error e;
        if (maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, K[i].desc.isa, &r, &e) != MASKPACK_OK ||
            r != K[i].desc.isa)
            continue;
        check_build(maskpack_isa_name(K[i].desc.isa), K[i].inv_lower);
        ran++;
    }
    CHECK(ran >= 1 + (size_t)have_avx512() + (size_t)(mp_cpu_has_avx2() != 0));
    return check_report("test_gdn_inv");
}
