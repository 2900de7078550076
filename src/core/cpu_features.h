/* cpu_features.h: the run-time CPU feature checks every kernel family dispatches on (internal,
 * never installed). One implementation (cpu_features.c: cpuid + the OS's XSAVE state from xgetbv),
 * so the attention and the gated delta rule can never disagree about what a CPU can run. */
#ifndef MASKPACK_CPU_FEATURES_H
#define MASKPACK_CPU_FEATURES_H

/* Bits of mp_cpu_features(). Each one includes the OS saving the registers the kernels use. */
enum {
    MP_CPU_AVX2 = 1u << 0,       /* AVX2 + FMA, YMM state saved */
    MP_CPU_AVX512 = 1u << 1,     /* AVX-512 F/DQ/BW/VL + FMA, opmask and ZMM state saved */
    MP_CPU_AVX512BF16 = 1u << 2, /* MP_CPU_AVX512 and AVX512_BF16 */
};

/* () -> the MP_CPU_* bits this CPU and OS support; 0 off x86-64 or without GCC/clang. Detected on the
 * first call (cpuid traps to the hypervisor on a VM: ~14 us) and remembered for the process. */
unsigned mp_cpu_features(void);

/* () -> 1 iff mp_cpu_features() has MP_CPU_AVX2, else 0. */
int mp_cpu_has_avx2(void);
/* () -> 1 iff mp_cpu_features() has MP_CPU_AVX512, else 0. */
int mp_cpu_has_avx512(void);
/* () -> 1 iff mp_cpu_features() has MP_CPU_AVX512BF16, else 0. */
int mp_cpu_has_avx512bf16(void);
/* () -> 1 iff the CPU has AVX512-BF16 and its dot products (VDPBF16PS: 32 bf16 multiply-adds) outrun
 * two f32 FMAs (2 x 16), so that bf16 products pay on them: AMD's (Zen 4 and later). Intel's do not:
 * on a Xeon (family 6, model 207) one VDPBF16PS issues every 2 cycles against two FMAs per cycle,
 * half the multiply-adds (measured, and the bf16 attention forward on them ran at half the f32
 * kernel's speed); there bf16 runs the f32 kernels, widened, or AMX. A fact about the CPU model, so a
 * given machine always runs the same kernel (and gets the same bits). */
int mp_cpu_bf16_dots_fast(void);
/* () -> 1 iff the CPU has AMX-TILE + AMX-BF16, the OS saves tile state and Linux granted this
 * process the XTILEDATA permission (requested once, thread-safely, on the first call), else 0. */
int mp_cpu_has_amx(void);

#endif
