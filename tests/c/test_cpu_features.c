/* test_cpu_features.c: the one run-time CPU check (src/core/cpu_features.c) against the compiler
 * runtime's independent one (__builtin_cpu_supports: libgcc / compiler-rt read cpuid and XCR0
 * themselves), its answers across calls and threads, and every kernel family dispatching on it
 * the same way (auto choice, MASKPACK_ISA and per-call forcing, UNSUPPORTED for what the CPU
 * lacks), and the kernel listing. */
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
           !!(f & MP_CPU_AVX2), !!(f & MP_CPU_AVX512), !!(f & MP_CPU_AVX512BF16), mp_cpu_has_amx(), !!(b & MP_CPU_AVX2),
           !!(b & MP_CPU_AVX512), !!(b & MP_CPU_AVX512BF16));
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
    maskpack_isa a;
    maskpack_isa g;
    unsetenv("MASKPACK_ISA");
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &a, &e), e);
    CHECK_EQ(a, (f & MP_CPU_AVX512) ? MASKPACK_ISA_AVX512 : (f & MP_CPU_AVX2) ? MASKPACK_ISA_AVX2 : MASKPACK_ISA_REF);
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_BF16, MASKPACK_ISA_AUTO, &a, &e), e);
    CHECK_EQ(a, (f & MP_CPU_AVX512) ? (amx ? MASKPACK_ISA_AMX : MASKPACK_ISA_AVX512)
                : (f & MP_CPU_AVX2) ? MASKPACK_ISA_AVX2
                                    : MASKPACK_ISA_REF);
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &g, &e), e);
    CHECK_EQ(g, (f & MP_CPU_AVX512) ? MASKPACK_ISA_AVX512 : (f & MP_CPU_AVX2) ? MASKPACK_ISA_AVX2 : MASKPACK_ISA_REF);

    setenv("MASKPACK_ISA", "avx512", 1);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &a, &e),
                 (f & MP_CPU_AVX512) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &g, &e),
                 (f & MP_CPU_AVX512) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    setenv("MASKPACK_ISA", "avx2", 1);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &a, &e),
                 (f & MP_CPU_AVX2) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    if (f & MP_CPU_AVX2) CHECK_EQ(a, MASKPACK_ISA_AVX2);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, &g, &e),
                 (f & MP_CPU_AVX2) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    if (f & MP_CPU_AVX2) CHECK_EQ(g, MASKPACK_ISA_AVX2);
    setenv("MASKPACK_ISA", "amx", 1);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_BF16, MASKPACK_ISA_AUTO, &a, &e),
                 ((f & MP_CPU_AVX512) && amx) ? MASKPACK_OK : MASKPACK_ERR_UNSUPPORTED, e);
    setenv("MASKPACK_ISA", "ref", 1);
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &a, &e), e);
    CHECK_EQ(a, MASKPACK_ISA_REF);
    unsetenv("MASKPACK_ISA");
}

/* One call of each family on a tiny packed problem (3 tokens, one head) with the given ISA. */
static maskpack_status run_family(maskpack_kernel_family fam, maskpack_isa isa, maskpack_error *e) {
    static float q[48], k[48], v[48], o[48], lse[3], g[3], beta[3], x[24], w[32], y[24];
    const int64_t len[1] = {3};
    maskpack_layout *L = NULL;
    maskpack_rule rule = maskpack_rule_default();
    maskpack_error le;
    if (maskpack_layout_from_lengths(len, 1, MASKPACK_PLACE_PACKED, 0, &rule, &L, &le)) return le.status;
    for (int i = 0; i < 48; i++) q[i] = k[i] = v[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < 32; i++) w[i] = 0.25f;
    for (int i = 0; i < 24; i++) x[i] = (float)i;
    g[0] = g[1] = g[2] = -0.1f;
    beta[0] = beta[1] = beta[2] = 0.5f;
    int64_t s3[3] = {3, 1, 16}, s2[2] = {1, 3}, sg[2] = {3, 1}, sx[2] = {3, 8}, sw[2] = {8, 4};
    maskpack_tensor tq = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, s3),
                    tk = maskpack_tensor_contiguous(k, MASKPACK_F32, 3, s3);
    maskpack_tensor tv = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, s3),
                    to = maskpack_tensor_contiguous(o, MASKPACK_F32, 3, s3);
    maskpack_tensor tl = maskpack_tensor_contiguous(lse, MASKPACK_F32, 2, s2);
    maskpack_tensor tg = maskpack_tensor_contiguous(g, MASKPACK_F32, 2, sg),
                    tb = maskpack_tensor_contiguous(beta, MASKPACK_F32, 2, sg);
    maskpack_tensor tx = maskpack_tensor_contiguous(x, MASKPACK_F32, 2, sx),
                    tw = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, sw);
    maskpack_tensor ty = maskpack_tensor_contiguous(y, MASKPACK_F32, 2, sx);
    maskpack_status st = MASKPACK_ERR_INVALID_ARGUMENT;
    if (fam == MASKPACK_KERNEL_ATTENTION) {
        st = maskpack_attention_forward(L, &tq, &tk, &tv, 0, 0, &to, &tl, OPTS_ISA(1, isa), NULL, 0, e);
    } else if (fam == MASKPACK_KERNEL_GDN) {
        maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, NULL};
        maskpack_gdn_options op = maskpack_gdn_options_default();
        op.isa = isa;
        st = maskpack_gdn_forward(L, &in, &op, &to, NULL, NULL, 0, e);
    } else {
        st = maskpack_causal_conv1d(L, &tx, &tw, NULL, 1, OPTS_ISA(1, isa), &ty, NULL, e);
    }
    maskpack_layout_free(L);
    return st;
}

/* One ISA vocabulary: every family refuses an ISA this CPU lacks alike, per call (argument "isa")
 * and through MASKPACK_ISA (argument "MASKPACK_ISA"), naming the ISA and the missing feature, and
 * runs every ISA it has that the CPU has; an ISA out of range is INVALID_ARGUMENT. */
static void test_one_vocabulary(void) {
    const unsigned f = mp_cpu_features();
    const int amx = mp_cpu_has_amx();
    maskpack_error e;
    unsetenv("MASKPACK_ISA");
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AUTO), "auto") == 0);
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AVX512_BF16), "avx512_bf16") == 0);
    CHECK(strcmp(maskpack_isa_name((maskpack_isa)99), "unknown") == 0);
    const struct {
        maskpack_isa isa;
        int has;
        const char *feature;
    } want[] = {{MASKPACK_ISA_AVX2, !!(f & MP_CPU_AVX2), "AVX2"},
                {MASKPACK_ISA_AVX512, !!(f & MP_CPU_AVX512), "AVX-512"},
                {MASKPACK_ISA_AVX512_BF16, !!(f & MP_CPU_AVX512BF16), (f & MP_CPU_AVX512) ? "AVX512-BF16" : "AVX-512"},
                {MASKPACK_ISA_AMX, (f & MP_CPU_AVX512) && amx, (f & MP_CPU_AVX512) ? "AMX-TILE" : "AVX-512"}};
    int refused = 0;
    for (int fam = 0; fam < MASKPACK_KERNEL_FAMILY_COUNT_; fam++) {
        CHECK_OK(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_REF, &e), e);
        CHECK_OK(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_AUTO, &e), e);
        CHECK_STATUS(run_family((maskpack_kernel_family)fam, (maskpack_isa)6, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
        CHECK(strcmp(e.argument, "isa") == 0);
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const char *name = maskpack_isa_name(want[i].isa);
            if (want[i].has) {
                CHECK_OK(run_family((maskpack_kernel_family)fam, want[i].isa, &e), e);
                setenv("MASKPACK_ISA", name, 1);
                CHECK_OK(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_AUTO, &e), e);
                unsetenv("MASKPACK_ISA");
                continue;
            }
            refused++;
            CHECK_STATUS(run_family((maskpack_kernel_family)fam, want[i].isa, &e), MASKPACK_ERR_UNSUPPORTED, e);
            CHECK(strcmp(e.argument, "isa") == 0);
            CHECK_MSG(e, name);
            CHECK_MSG(e, want[i].feature);
            setenv("MASKPACK_ISA", name, 1);
            CHECK_STATUS(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_AUTO, &e), MASKPACK_ERR_UNSUPPORTED, e);
            CHECK(strcmp(e.argument, "MASKPACK_ISA") == 0);
            CHECK_MSG(e, name);
            CHECK_MSG(e, want[i].feature);
            maskpack_isa r;
            CHECK_STATUS(maskpack_isa_resolve((maskpack_kernel_family)fam, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e),
                         MASKPACK_ERR_UNSUPPORTED, e);
            unsetenv("MASKPACK_ISA");
        }
        /* one rule for MASKPACK_ISA in every family: "auto" and "" are AUTO, a bad name is refused */
        setenv("MASKPACK_ISA", "auto", 1);
        CHECK_OK(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_AUTO, &e), e);
        setenv("MASKPACK_ISA", "", 1);
        CHECK_OK(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_AUTO, &e), e);
        setenv("MASKPACK_ISA", "sse9", 1);
        CHECK_STATUS(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_AUTO, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
        CHECK(strcmp(e.argument, "MASKPACK_ISA") == 0);
        /* an explicit request is never overridden by the variable */
        CHECK_OK(run_family((maskpack_kernel_family)fam, MASKPACK_ISA_REF, &e), e);
        unsetenv("MASKPACK_ISA");
    }
    printf("  ISAs this CPU lacks, refused by every family: %d\n", refused / MASKPACK_KERNEL_FAMILY_COUNT_);
}

/* The listing: every family's table, reference first, each entry available iff the CPU has its
 * ISA, and the kernel a call resolves to is one of its family's available entries. */
static void test_kernel_list(void) {
    maskpack_error e;
    size_t n = 0;
    CHECK_OK(maskpack_kernel_list(NULL, 0, &n, &e), e);
    CHECK(n >= 3 && n <= 32);
    maskpack_kernel_info info[32];
    size_t n2 = 0;
    CHECK_OK(maskpack_kernel_list(info, 32, &n2, &e), e);
    CHECK_EQ(n2, n);
    CHECK_STATUS(maskpack_kernel_list(NULL, 4, &n2, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    const unsigned f = mp_cpu_features();
    const int amx = mp_cpu_has_amx();
    int refs[MASKPACK_KERNEL_FAMILY_COUNT_] = {0};
    printf("  kernels:");
    for (size_t i = 0; i < n && i < 32; i++) {
        const maskpack_kernel_info *k = &info[i];
        printf(" %s%s", k->name, k->available ? "" : "(not here)");
        CHECK((unsigned)k->family < MASKPACK_KERNEL_FAMILY_COUNT_);
        CHECK(strncmp(k->name, maskpack_kernel_family_name(k->family),
                      strlen(maskpack_kernel_family_name(k->family))) == 0);
        CHECK(strstr(k->name, maskpack_isa_name(k->isa)) != NULL);
        CHECK(k->dtypes & (1u << MASKPACK_F32));
        int has = k->isa == MASKPACK_ISA_REF           ? 1
                  : k->isa == MASKPACK_ISA_AVX2        ? !!(f & MP_CPU_AVX2)
                  : k->isa == MASKPACK_ISA_AVX512      ? !!(f & MP_CPU_AVX512)
                  : k->isa == MASKPACK_ISA_AVX512_BF16 ? !!(f & MP_CPU_AVX512BF16)
                                                       : (f & MP_CPU_AVX512) && amx;
        CHECK_EQ(k->available, has);
        CHECK(k->isa == MASKPACK_ISA_REF ? strcmp(k->cpu_features, "") == 0 : strlen(k->cpu_features) > 0);
        if (k->isa == MASKPACK_ISA_REF) {
            CHECK(i == 0 || info[i - 1].family != k->family); /* the reference first */
            refs[k->family]++;
        }
        for (size_t j = 0; j < i; j++) CHECK(strcmp(info[j].name, k->name) != 0);
        /* an available entry runs when asked for by name, and resolves to itself */
        if (k->available) {
            maskpack_isa r;
            CHECK_OK(maskpack_isa_resolve(k->family, MASKPACK_F32, k->isa, &r, &e), e);
            CHECK_EQ(r, k->isa);
            CHECK_OK(run_family(k->family, k->isa, &e), e);
        }
    }
    printf("\n");
    for (int fam = 0; fam < MASKPACK_KERNEL_FAMILY_COUNT_; fam++) {
        CHECK_EQ(refs[fam], 1);
        maskpack_isa r;
        CHECK_OK(maskpack_isa_resolve((maskpack_kernel_family)fam, MASKPACK_BF16, MASKPACK_ISA_AUTO, &r, &e), e);
        int found = 0;
        for (size_t i = 0; i < n && i < 32; i++)
            found |= (int)info[i].family == fam && info[i].isa == r && info[i].available;
        CHECK(found);
    }
    maskpack_isa r;
    CHECK_STATUS(maskpack_isa_resolve((maskpack_kernel_family)3, MASKPACK_F32, MASKPACK_ISA_AUTO, &r, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_I32, MASKPACK_ISA_AUTO, &r, &e), MASKPACK_ERR_DTYPE,
                 e);
}

int main(void) {
    test_agrees_with_builtin();
    test_threads_agree();
    test_dispatch();
    test_one_vocabulary();
    test_kernel_list();
    return check_report("test_cpu_features");
}
