/* cpu_features.c: the run-time CPU feature checks of every kernel family (cpuid for what the CPU
 * has, xgetbv for which register state the OS saves on a context switch), and the one-time Linux
 * permission request AMX tile data needs.
 *
 * This file must stay free of target pragmas and target attributes: it runs before anything knows
 * what the CPU supports, so the compiler may only emit baseline x86-64 code here (a helper compiled
 * inside a target region may receive that ISA's instructions, which fault on a CPU without it). */
#define _GNU_SOURCE /* syscall() */
#include "cpu_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* XCR0 bits: which register state the OS saves. */
#define XCR0_AVX    0x6ull     /* SSE, AVX (YMM upper halves) */
#define XCR0_AVX512 0xe6ull    /* the above, opmask, ZMM_Hi256, Hi16_ZMM */
#define XCR0_AMX    0x60000ull /* XTILECFG, XTILEDATA */

/* The caller has checked CPUID.1:ECX.OSXSAVE (xgetbv faults without it). */
static uint64_t xgetbv0(void) {
    uint32_t a, d;
    __asm__ volatile("xgetbv" : "=a"(a), "=d"(d) : "c"(0));
    return ((uint64_t)d << 32) | a;
}

/* XCR0, or 0 when the OS has not enabled XSAVE (then no AVX state is saved at all). */
static uint64_t os_saved_state(unsigned leaf1_ecx) { return (leaf1_ecx & (1u << 27)) ? xgetbv0() : 0; /* OSXSAVE */ }

/* Each cpuid traps to the hypervisor on a VM (5-9 us each, measured), so this asks each leaf once:
 * leaf 0 (the highest leaf, since leaf 7 is garbage where it does not exist), 1, 7.0 and, only when
 * AVX-512 is there, 7.1. */
static int vendor_amd = 0; /* written once, inside features_once, with the features */

static unsigned detect_features(void) {
    unsigned a, b, c, d;
    __cpuid(0, a, b, c, d); /* the highest leaf and the vendor, in one trap */
    const unsigned max_leaf = a;
    vendor_amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "Auth" "enti" "cAMD" */
    if (max_leaf < 7) return 0;
    __cpuid_count(1, 0, a, b, c, d);
    if (!(c & (1u << 12))) return 0; /* FMA: both vector paths need it */
    const uint64_t xcr0 = os_saved_state(c);
    unsigned b7, max_sub7;
    __cpuid_count(7, 0, max_sub7, b7, c, d);
    unsigned f = 0;
    if ((b7 & (1u << 5)) && (xcr0 & XCR0_AVX) == XCR0_AVX) f |= MP_CPU_AVX2;
    const unsigned need512 = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31); /* F, DQ, BW, VL */
    if ((b7 & need512) == need512 && (xcr0 & XCR0_AVX512) == XCR0_AVX512) {
        f |= MP_CPU_AVX512;
        if (max_sub7 >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            if (a & (1u << 5)) f |= MP_CPU_AVX512BF16;
        }
    }
    return f;
}

/* The answer is a fact about the machine the process runs on, computed once (thread-safely) and
 * then only read: a per-call check cost ~14 us, as much as a decode-sized kernel call. */
static pthread_once_t features_once = PTHREAD_ONCE_INIT;
static unsigned features = 0;

static void features_init(void) { features = detect_features(); }

unsigned mp_cpu_features(void) {
    pthread_once(&features_once, features_init);
#if defined(MASKPACK_EMULATE_AMX)
    /* a test build only (tests/c/meson.build): every kernel runs on any CPU, the AVX-512 intrinsics
     * carried out by SIMDe and the AVX512-BF16 and AMX ones by simde_amx.h */
    return features | MP_CPU_AVX512 | MP_CPU_AVX512BF16;
#elif defined(MASKPACK_EMULATE_AVX512)
    /* a test build only (tests/c/meson.build): the AVX-512 f32 kernels run on any CPU, their
     * intrinsics carried out by SIMDe; the bf16 and AMX kernels only in the build that emulates them
     * too (MASKPACK_EMULATE_AMX), so never reported here */
    return (features | MP_CPU_AVX512) & ~(unsigned)MP_CPU_AVX512BF16;
#else
    return features;
#endif
}

/* Linux enables AMX tile data per process on request (arch_prctl ARCH_REQ_XCOMP_PERM): done once,
 * thread-safely; the permission is process state the OS keeps, not library state (amx_ok only
 * records the answer, written once inside the pthread_once). */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok = 0;

static void amx_request(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, 0) < 7) return;
    __cpuid_count(1, 0, a, b, c, d);
    const uint64_t xcr0 = os_saved_state(c);
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return; /* AMX-BF16, AMX-TILE */
    if ((xcr0 & XCR0_AMX) != XCR0_AMX) return;
#if defined(__linux__) && defined(SYS_arch_prctl)
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) return;
    amx_ok = 1;
#endif
}

int mp_cpu_bf16_dots_fast(void) {
    const unsigned f = mp_cpu_features(); /* runs features_once, which sets vendor_amd */
    return (f & MP_CPU_AVX512BF16) && vendor_amd;
}

int mp_cpu_has_amx(void) {
    pthread_once(&amx_once, amx_request);
#if defined(MASKPACK_EMULATE_AMX)
    return 1; /* see mp_cpu_features: no tile data to ask the OS for */
#elif defined(MASKPACK_EMULATE_AVX512)
    return 0; /* see mp_cpu_features */
#else
    return amx_ok;
#endif
}

#else /* not x86-64 GCC/clang: no vector kernel is built, none is ever selected */

unsigned mp_cpu_features(void) { return 0; }
int mp_cpu_has_amx(void) { return 0; }
int mp_cpu_bf16_dots_fast(void) { return 0; }

#endif

int mp_cpu_has_avx2(void) { return (mp_cpu_features() & MP_CPU_AVX2) != 0; }
int mp_cpu_has_avx512(void) { return (mp_cpu_features() & MP_CPU_AVX512) != 0; }
int mp_cpu_has_avx512bf16(void) { return (mp_cpu_features() & MP_CPU_AVX512BF16) != 0; }
