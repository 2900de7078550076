/* attn_cpu.c: run-time CPU feature checks for the attention kernels (cpuid + the OS's XSAVE
 * state), and the one-time Linux permission request AMX tile data needs. */
#define _GNU_SOURCE /* syscall() */
#include "attn_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <pthread.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static uint64_t xgetbv0(void) {
    uint32_t a, d;
    __asm__ volatile("xgetbv" : "=a"(a), "=d"(d) : "c"(0));
    return ((uint64_t)d << 32) | a;
}

static int os_saves(uint64_t bits) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 27))) return 0; /* OSXSAVE */
    return (xgetbv0() & bits) == bits;
}

int attn_cpu_has_avx512(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 12))) return 0; /* FMA */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31); /* F, DQ, BW, VL */
    if ((b & need) != need) return 0;
    return os_saves(0xe6); /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM state */
}

/* AVX2 + FMA with the OS saving YMM state: the vector path of CPUs without AVX-512. */
int attn_cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 12))) return 0; /* FMA */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 5))) return 0; /* AVX2 */
    return os_saves(0x6); /* SSE, AVX state */
}

int attn_cpu_has_avx512bf16(void) {
    unsigned a, b, c, d;
    if (!attn_cpu_has_avx512()) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1u;
}

/* Linux enables AMX tile data per process on request (arch_prctl ARCH_REQ_XCOMP_PERM): done once,
 * thread-safely; the permission is process state the OS keeps, not library state. */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok = 0;

static void amx_request(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return; /* AMX-BF16, AMX-TILE */
    if (!os_saves(0x60000)) return;                     /* XTILECFG, XTILEDATA */
#if defined(__linux__) && defined(SYS_arch_prctl)
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) return;
    amx_ok = 1;
#endif
}

int attn_cpu_has_amx(void) {
    pthread_once(&amx_once, amx_request);
    return amx_ok;
}

#else

int attn_cpu_has_avx512(void) { return 0; }
int attn_cpu_has_avx2(void) { return 0; }
int attn_cpu_has_avx512bf16(void) { return 0; }
int attn_cpu_has_amx(void) { return 0; }

#endif
