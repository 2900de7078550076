/* test_cpu_features.c: the one run-time CPU check (src/core/cpu_features.c) against the compiler
 * runtime's independent one (__builtin_cpu_supports: libgcc / compiler-rt read cpuid and XCR0
 * themselves), its answers across calls and threads, and both kernel families dispatching on it
 * the same way (auto choice, MASKPACK_ISA forcing, UNSUPPORTED for what the CPU lacks). */
#include "check.h"
#include "cpu_features.h"

#include <pthread.h>
#include <stdlib.h>

/* The compiler runtime's view of each MP_CPU_* bit (it also requires the OS to save the state). */
static unsigned builtin_features(void) {
    unsigned f = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    const int fma = __builtin_cpu_supports("fma") != 0;
    if (fma && __builtin_cpu_supports("avx2")) f |= MP_CPU_AVX2;
    if (fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
        f |= MP_CPU_AVX512;
        if (__builtin_cpu_supports("avx512bf16")) f |= MP_CPU_AVX512BF16;
    }
#endif
    return f;
}

typedef struct {
    unsigned features;
    int amx;
} thread_view;

static void *ask(void *p) {
    thread_view *v = p;
    v->amx = mp_cpu_has_amx(); /* the first calls race into the pthread_once */
    v->features = mp_cpu_features();
    return NULL;
}

static void test_agrees_with_builtin(void) {
    const unsigned f = mp_cpu_features(), b = builtin_features();
    printf("  cpu features: avx2 %d, avx512 %d, avx512bf16 %d, amx %d (compiler runtime: %d %d %d)\n",
           !!(f & MP_CPU_AVX2), !!(f & MP_CPU_AVX512), !!(f & MP_CPU_AVX512BF16), mp_cpu_has_amx(),
           !!(b & MP_CPU_AVX2), !!(b & MP_CPU_AVX512), !!(b & MP_CPU_AVX512BF16));
    CHECK_EQ(f & MP_CPU_AVX2, b & MP_CPU_AVX2);
    CHECK_EQ(f & MP_CPU_AVX512, b & MP_CPU_AVX512);
    CHECK_EQ(f & MP_CPU_AVX512BF16, b & MP_CPU_AVX512BF16);
    CHECK_EQ(f & ~(unsigned)(MP_CPU_AVX2 | MP_CPU_AVX512 | MP_CPU_AVX512BF16), 0);
    /* the single-question forms answer from the same bits */
    CHECK_EQ(mp_cpu_has_avx2(), !!(f & MP_CPU_AVX2));
    CHECK_EQ(mp_cpu_has_avx512(), !!(f & MP_CPU_AVX512));
    CHECK_EQ(mp_cpu_has_avx512bf16(), !!(f & MP_CPU_AVX512BF16));
    if (f & MP_CPU_AVX512BF16) CHECK(f & MP_CPU_AVX512);
#if !defined(__x86_64__)
    CHECK_EQ(f, 0);
    CHECK_EQ(mp_cpu_has_amx(), 0);
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    /* clang 14's __builtin_cpu_supports has no AMX names; GCC's has (it ignores the Linux permission,
     * so only one direction holds) */
    if (mp_cpu_has_amx()) CHECK(__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16"));
#endif
}

static void test_threads_agree(void) {
    enum { NT = 4 };
    pthread_t th[NT];
    thread_view v[NT];
    for (int i = 0; i < NT; i++) CHECK_EQ(pthread_create(&th[i], NULL, ask, &v[i]), 0);
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    const unsigned f = mp_cpu_features();
    const int amx = mp_cpu_has_amx();
    for (int i = 0; i < NT; i++) {
        CHECK_EQ(v[i].features, f);
        CHECK_EQ(v[i].amx, amx);
    }
}

/* Both families choose from the same bits: auto picks the widest the CPU runs, a forced kernel the
 * CPU lacks is UNSUPPORTED, never a silent fallback. */
static void test_dispatch(void) {
    const unsigned f = mp_cpu_features();
    const int amx = mp_cpu_has_amx();
    maskpack_error e;
    maskpack_attention_isa a;
    maskpack_gdn_isa g;
    unsetenv("MASKPACK_ISA");
    CHECK_OK(maskpack_attention_select_isa(MASKPACK_F32, &a, &e), e);
    CHECK_EQ(a, (f & MP_CPU_AVX512) ? MASKPACK_ATTN_ISA_AVX512
                : (f & MP_CPU_AVX2) ? MASKPACK_ATTN_ISA_AVX2
                                    : MASKPACK_ATTN_ISA_REF);
    CHECK_OK(maskpack_attention_select_isa(MASKPACK_BF16, &a, &e), e);
    CHECK_EQ(a, (f & MP_CPU_AVX512) ? (amx ? MASKPACK_ATTN_ISA_AMX : MASKPACK_ATTN_ISA_AVX512)
                : (f & MP_CPU_AVX2) ? MASKPACK_ATTN_ISA_AVX2
                                    : MASKPACK_ATTN_ISA_REF);
    CHECK_OK(maskpack_gdn_resolve_isa(MASKPACK_GDN_ISA_AUTO, &g, &e), e);
    CHECK_EQ(g, (f & MP_CPU_AVX512) ? MASKPACK_GDN_ISA_AVX512
                : (f & MP_CPU_AVX2) ? MASKPACK_GDN_ISA_AVX2
                                    : MASKPACK_GDN_ISA_REF);

    setenv("MASKPACK_ISA", "avx512", 1);
    CHECK_STATUS(maskpack_attention_select_isa(MASKPACK_F32, &a, &e),
                 (f & MP_CPU_AVX512) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_STATUS(maskpack_gdn_resolve_isa(MASKPACK_GDN_ISA_AUTO, &g, &e),
                 (f & MP_CPU_AVX512) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    setenv("MASKPACK_ISA", "avx2", 1);
    CHECK_STATUS(maskpack_attention_select_isa(MASKPACK_F32, &a, &e),
                 (f & MP_CPU_AVX2) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    if (f & MP_CPU_AVX2) CHECK_EQ(a, MASKPACK_ATTN_ISA_AVX2);
    CHECK_STATUS(maskpack_gdn_resolve_isa(MASKPACK_GDN_ISA_AUTO, &g, &e),
                 (f & MP_CPU_AVX2) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    if (f & MP_CPU_AVX2) CHECK_EQ(g, MASKPACK_GDN_ISA_AVX2);
    setenv("MASKPACK_ISA", "amx", 1);
    CHECK_STATUS(maskpack_attention_select_isa(MASKPACK_BF16, &a, &e),
                 ((f & MP_CPU_AVX512) && amx) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    setenv("MASKPACK_ISA", "ref", 1);
    CHECK_OK(maskpack_attention_select_isa(MASKPACK_F32, &a, &e), e);
    CHECK_EQ(a, MASKPACK_ATTN_ISA_REF);
    unsetenv("MASKPACK_ISA");
}

int main(void) {
    test_agrees_with_builtin();
    test_threads_agree();
    test_dispatch();
    return check_report("test_cpu_features");
}
