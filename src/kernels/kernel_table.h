/* kernel_table.h: what every kernel family's table shares (internal, never installed).
 *
 * Each family (attention/attn_table.c, gdn/gdn_api.c, conv/conv.c) keeps one table of its kernels, one
 * entry per ISA, whose first member is an mp_kernel_desc; the rest of the entry (workspace
 * functions, micro-kernels) is the family's own. Dispatch (mp_kernel_pick), workspace sizing, the
 * listing of maskpack_kernel_list and, through it, the tests and benchmarks all read the same
 * tables: adding an ISA to a family is one entry plus its micro-kernels. */
#ifndef MASKPACK_KERNEL_TABLE_H
#define MASKPACK_KERNEL_TABLE_H

#include "internal.h"

typedef struct mp_kernel_desc {
    maskpack_kernel_family family;
    maskpack_isa isa;
    const char *name;     /* "attention/avx512" */
    uint32_t dtypes;      /* MP_DT bits of the input dtypes it takes */
    uint32_t auto_dtypes; /* the dtypes AUTO may pick it for (a subset of dtypes) */
} mp_kernel_desc;

/* i -> the i-th entry's descriptor of the family's table, NULL past its end. */
const mp_kernel_desc *attn_kernel_desc(size_t i);
const mp_kernel_desc *gdn_kernel_desc(size_t i);
const mp_kernel_desc *conv_kernel_desc(size_t i);

/* (family, input dtype, requested ISA) -> *index of the family's entry that runs: the explicit
 * (or MASKPACK_ISA's) ISA's entry, or the family's best entry below it whose auto_dtypes has dtype
 * (an entry AUTO skips for a dtype runs it only when asked for by name); for AUTO the best entry
 * this CPU runs whose auto_dtypes has dtype. Errors: those of mp_isa_request, and
 * MASKPACK_ERR_DTYPE ("dtype") for a dtype the family does not take. */
maskpack_status mp_kernel_pick(maskpack_kernel_family family, maskpack_dtype dtype, maskpack_isa requested,
                               size_t *index, maskpack_error *err);

#endif
