/* isa.h: the one reading of an ISA request (a maskpack_isa argument, or MASKPACK_ISA for AUTO)
 * and what each ISA needs of the CPU (internal, never installed). Every kernel family asks here,
 * so attention, the gated delta rule and the conv accept, refuse and name ISAs alike. */
#ifndef MASKPACK_ISA_H
#define MASKPACK_ISA_H

#include "internal.h"

/* isa -> its place in the order ref < avx2 < avx512 < avx512_bf16 < amx (each implies the ones
 * before it, AVX2 aside: an AVX-512 CPU has it); -1 for AUTO or out of range. */
int mp_isa_rank(maskpack_isa isa);

/* isa -> the CPU features it needs, as text ("" for ref, NULL out of range). */
const char *mp_isa_cpu_features(maskpack_isa isa);

/* isa -> NULL when this CPU, build and OS run it, else the features it lacks, as text. */
const char *mp_isa_missing(maskpack_isa isa);

/* (requested) -> *out: requested itself when explicit, else (AUTO) MASKPACK_ISA's ISA, else AUTO
 * (the caller picks the best). Out of range: MASKPACK_ERR_INVALID_ARGUMENT "isa"; an unknown
 * MASKPACK_ISA: MASKPACK_ERR_INVALID_ARGUMENT "MASKPACK_ISA"; an ISA the CPU lacks:
 * MASKPACK_ERR_UNSUPPORTED naming it and the missing features ("isa" or "MASKPACK_ISA"). */
maskpack_status mp_isa_request(maskpack_isa requested, maskpack_isa *out, maskpack_error *err);

#endif
