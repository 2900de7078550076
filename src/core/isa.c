/* isa.c: ISA names, what each ISA needs of the CPU, and the one rule that turns a request (or
 * MASKPACK_ISA) into an ISA. No target pragmas here (see cpu_features.c). */
#include "isa.h"
#include "cpu_features.h"

#include <stdlib.h>
#include <string.h>

static const char *const NAMES[MASKPACK_ISA_COUNT_] = {"auto", "ref", "avx512", "avx2", "avx512_bf16", "amx"};

const char *maskpack_isa_name(maskpack_isa isa) { return (unsigned)isa < MASKPACK_ISA_COUNT_ ? NAMES[isa] : "unknown"; }

const char *maskpack_kernel_family_name(maskpack_kernel_family family) {
    switch (family) {
    case MASKPACK_KERNEL_ATTENTION: return "attention";
    case MASKPACK_KERNEL_GDN: return "gdn";
    case MASKPACK_KERNEL_CONV: return "conv";
    default: return "unknown";
    }
}

int mp_isa_rank(maskpack_isa isa) {
    switch (isa) {
    case MASKPACK_ISA_REF: return 0;
    case MASKPACK_ISA_AVX2: return 1;
    case MASKPACK_ISA_AVX512: return 2;
    case MASKPACK_ISA_AVX512_BF16: return 3;
    case MASKPACK_ISA_AMX: return 4;
    default: return -1;
    }
}

#define FEAT_AVX2   "AVX2 + FMA"
#define FEAT_AVX512 "AVX-512F/DQ/BW/VL + FMA"
#define FEAT_BF16   "AVX512-BF16"
#define FEAT_AMX    "AMX-TILE/AMX-BF16 (with the OS's tile state permission)"

const char *mp_isa_cpu_features(maskpack_isa isa) {
    switch (isa) {
    case MASKPACK_ISA_REF: return "";
    case MASKPACK_ISA_AVX2: return FEAT_AVX2;
    case MASKPACK_ISA_AVX512: return FEAT_AVX512;
    case MASKPACK_ISA_AVX512_BF16: return FEAT_AVX512 ", " FEAT_BF16;
    case MASKPACK_ISA_AMX: return FEAT_AVX512 ", " FEAT_AMX;
    default: return NULL;
    }
}

const char *mp_isa_missing(maskpack_isa isa) {
    const unsigned f = mp_cpu_features();
    const int has512 = (f & MP_CPU_AVX512) != 0;
    switch (isa) {
    case MASKPACK_ISA_REF: return NULL;
    case MASKPACK_ISA_AVX2: return (f & MP_CPU_AVX2) ? NULL : FEAT_AVX2;
    case MASKPACK_ISA_AVX512: return has512 ? NULL : FEAT_AVX512;
    case MASKPACK_ISA_AVX512_BF16:
        if (!has512) return FEAT_AVX512 ", " FEAT_BF16;
        return (f & MP_CPU_AVX512BF16) ? NULL : FEAT_BF16;
    case MASKPACK_ISA_AMX: {
        /* the AMX permission is asked only where the tiles could be used at all */
        const int amx = mp_cpu_has_amx();
        if (!has512) return amx ? FEAT_AVX512 : FEAT_AVX512 ", " FEAT_AMX;
        return amx ? NULL : FEAT_AMX;
    }
    default: return "an ISA this build does not know";
    }
}

/* MASKPACK_ISA -> *isa (AUTO for unset, empty or "auto"). */
static maskpack_status isa_from_env(maskpack_isa *isa, maskpack_error *err) {
    /* read-only look at the environment: the process-wide override of benchmarks and tests */
    const char *env = getenv("MASKPACK_ISA");
    *isa = MASKPACK_ISA_AUTO;
    if (!env || !*env) return MASKPACK_OK;
    for (int i = 0; i < MASKPACK_ISA_COUNT_; i++)
        if (strcmp(env, NAMES[i]) == 0) {
            *isa = (maskpack_isa)i;
            return MASKPACK_OK;
        }
    return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "MASKPACK_ISA", -1, -1,
                   "MASKPACK_ISA: expected \"ref\", \"avx2\", \"avx512\", \"avx512_bf16\", \"amx\" or \"auto\", "
                   "found \"%.40s\"",
                   env);
}

maskpack_status mp_isa_request(maskpack_isa requested, maskpack_isa *out, maskpack_error *err) {
    if ((unsigned)requested >= MASKPACK_ISA_COUNT_)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "isa", -1, -1,
                       "isa: expected AUTO (0), REF (1), AVX512 (2) or AVX2 (3), or AVX512_BF16 (4) or AMX (5), "
                       "found %d",
                       (int)requested);
    const char *source = "isa";
    maskpack_isa want = requested;
    if (want == MASKPACK_ISA_AUTO) {
        maskpack_status s = isa_from_env(&want, err);
        if (s) return s;
        source = "MASKPACK_ISA";
    }
    if (want != MASKPACK_ISA_AUTO) {
        /* a forced ISA the CPU lacks is an error, never a silent fallback */
        const char *missing = mp_isa_missing(want);
        if (missing)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, source, -1, -1,
                           "%s: %s requested but this CPU (or build, or OS) lacks %s", source, NAMES[want], missing);
    }
    *out = want;
    return MASKPACK_OK;
}
