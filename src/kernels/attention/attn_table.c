/* attn_table.c: the attention kernels, one entry per ISA (XNNPACK's micro-kernel list per family),
 * and what is read off the whole list: the entry a call runs, and the workspace that serves every
 * entry this CPU runs. */
#include "attn_plan.h"
#include "cpu_features.h"
#include "isa.h"

/* the reference's backward workspace does not depend on the group width */
static size_t ref_bwd_ws(const attn_problem *P, int64_t max_width) {
    (void)max_width;
    return attn_ref_bwd_ws(P);
}

#define ATTN_REF_BWD                                                                                                   \
    { ref_bwd_ws, NULL, attn_ref_bwd_thread, NULL, NULL }
#define ATTN_AVX2_BWD                                                                                                  \
    {                                                                                                                  \
        attn_avx2_bwd_ws, attn_avx2_bwd_tail_bytes, attn_avx2_bwd_thread, attn_avx2_bwd_tail_reduce,                   \
            attn_avx2_bwd_reduce                                                                                       \
    }
#define ATTN_AVX512_BWD                                                                                                \
    {                                                                                                                  \
        attn_avx512_bwd_ws, attn_avx512_bwd_tail_bytes, attn_avx512_bwd_thread, attn_avx512_bwd_tail_reduce,           \
            attn_avx512_bwd_reduce                                                                                     \
    }
#define ATTN_AMX_BWD                                                                                                   \
    { attn_amx_bwd_ws, attn_amx_bwd_tail_bytes, attn_amx_bwd_thread, attn_amx_bwd_tail_reduce, attn_amx_bwd_reduce }
#define ATTN_AVX512BF16_BWD                                                                                            \
    {                                                                                                                  \
        attn_avx512bf16_bwd_ws, attn_avx512bf16_bwd_tail_bytes, attn_avx512bf16_bwd_thread,                            \
            attn_avx512bf16_bwd_tail_reduce, attn_avx512bf16_bwd_reduce                                                \
    }

/* Reference first. AVX512-BF16 and AMX have no f32 arithmetic: their f32 forwards and backwards are
 * the AVX-512 kernel's. AUTO takes amx for bf16 only (forward and backward on tiles; the backward's
 * speed is not measured yet: no AMX host was at hand, its tile products run at 8x the f32 FMA rate's
 * multiply-adds on Sapphire Rapids) and never avx512_bf16 by name: the avx512 entry
 * runs bf16 forwards on the AVX512-BF16 dot products where they pay (attn_fwd_entry), widened to f32
 * elsewhere. The AVX512-BF16 backward (bf16 pairs for all five products) runs only when asked for by
 * name: on the Xeon it was measured on its dot products run at half the f32 FMA rate (see
 * mp_cpu_bf16_dots_fast), and no CPU where they pay was at hand to measure it against the widened
 * backward AUTO keeps. */
static const attn_kernel ATTN_KERNELS[] = {
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_REF, "attention/ref", ATTN_DTYPES, ATTN_DTYPES},
     attn_ref_fwd_ws,
     attn_ref_fwd_thread,
     attn_ref_fwd_thread,
     ATTN_BQ,
     ATTN_REF_BWD,
     ATTN_REF_BWD},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AVX2, "attention/avx2", ATTN_DTYPES, ATTN_DTYPES},
     attn_avx2_fwd_ws,
     attn_avx2_fwd_thread,
     attn_avx2_fwd_thread,
     ATTN_BQ,
     ATTN_AVX2_BWD,
     ATTN_AVX2_BWD},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AVX512, "attention/avx512", ATTN_DTYPES, ATTN_DTYPES},
     attn_avx512_fwd_ws,
     attn_avx512_fwd_thread,
     attn_avx512_fwd_thread,
     ATTN_BQ,
     ATTN_AVX512_BWD,
     ATTN_AVX512_BWD},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AVX512_BF16, "attention/avx512_bf16", ATTN_DTYPES, 0},
     attn_avx512bf16_fwd_ws,
     attn_avx512_fwd_thread,
     attn_avx512bf16_fwd_thread,
     ATTN_BQ,
     ATTN_AVX512_BWD,
     ATTN_AVX512BF16_BWD},
    {{MASKPACK_KERNEL_ATTENTION, MASKPACK_ISA_AMX, "attention/amx", ATTN_DTYPES, MP_DT(MASKPACK_BF16)},
     attn_amx_fwd_ws,
     attn_avx512_fwd_thread,
     attn_amx_fwd_thread,
     ATTN_AMX_BQ,
     ATTN_AVX512_BWD,
     ATTN_AMX_BWD},
};
enum { N_ATTN_KERNELS = sizeof ATTN_KERNELS / sizeof ATTN_KERNELS[0] };

const mp_kernel_desc *attn_kernel_desc(size_t i) { return i < N_ATTN_KERNELS ? &ATTN_KERNELS[i].desc : NULL; }

const attn_kernel *attn_entry(maskpack_isa isa) {
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        if (ATTN_KERNELS[i].desc.isa == isa) return &ATTN_KERNELS[i];
    return &ATTN_KERNELS[0];
}

const attn_kernel *attn_fwd_entry(const attn_problem *P) {
    if (P->isa == MASKPACK_ISA_AVX512 && P->bf16 && mp_cpu_bf16_dots_fast())
        return attn_entry(MASKPACK_ISA_AVX512_BF16);
    return attn_entry(P->isa);
}

const attn_bwd_kernel *attn_bwd_entry(const attn_problem *P) {
    return P->bf16 ? &attn_entry(P->isa)->bwd_bf16 : &attn_entry(P->isa)->bwd_f32;
}

/* (requested isa, q's dtype) -> P->isa: the table entry the call runs. */
maskpack_status attn_pick_isa(attn_problem *P, maskpack_isa isa, maskpack_dtype dtype, maskpack_error *err) {
    size_t i;
    maskpack_status s = mp_kernel_pick(MASKPACK_KERNEL_ATTENTION, dtype, isa, &i, err);
    if (s) return s;
    P->isa = ATTN_KERNELS[i].desc.isa;
    return MASKPACK_OK;
}

/* ---- workspace sizes: the largest need of the entries this CPU runs ------------------------ */

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The workspace serves every kernel of the table this CPU runs (the largest need among them), so
 * a size queried once serves whichever kernel a call selects. Only those kernels' sizing
 * functions are called: each sits inside its kernel's target region, where the compiler may use
 * that ISA's instructions. */
size_t attn_fwd_thread_ws(const attn_problem *P) {
    size_t m = 0;
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        if (!mp_isa_missing(ATTN_KERNELS[i].desc.isa)) m = max_sz(m, ATTN_KERNELS[i].fwd_ws(P));
    return attn_align_up(m);
}

/* Bytes of the backward's tail partials and per-thread workspace: the largest among the kernels
 * this CPU runs, as for the forward. */
size_t attn_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail) {
    size_t m = 0;
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        for (int dt = 0; dt < 2; dt++) {
            const attn_bwd_kernel *b = dt ? &ATTN_KERNELS[i].bwd_bf16 : &ATTN_KERNELS[i].bwd_f32;
            if (b->tail_bytes && !mp_isa_missing(ATTN_KERNELS[i].desc.isa))
                m = max_sz(m, b->tail_bytes(P, max_width, n_tail));
        }
    return m;
}

size_t attn_bwd_thread_ws(const attn_problem *P, int64_t max_width) {
    size_t m = 0;
    for (size_t i = 0; i < N_ATTN_KERNELS; i++)
        if (!mp_isa_missing(ATTN_KERNELS[i].desc.isa)) {
            m = max_sz(m, ATTN_KERNELS[i].bwd_f32.ws(P, max_width));
            m = max_sz(m, ATTN_KERNELS[i].bwd_bf16.ws(P, max_width));
        }
    return attn_align_up(m);
}
