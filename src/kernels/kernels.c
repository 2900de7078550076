/* kernels.c: the one choice of a kernel from a family's table (mp_kernel_pick), and the public
 * listing of every family's kernels. */
#include "kernel_table.h"
#include "isa.h"

static const mp_kernel_desc *family_desc(maskpack_kernel_family family, size_t i) {
    switch (family) {
    case MASKPACK_KERNEL_ATTENTION: return attn_kernel_desc(i);
    case MASKPACK_KERNEL_GDN: return gdn_kernel_desc(i);
    case MASKPACK_KERNEL_CONV: return conv_kernel_desc(i);
    default: return NULL;
    }
}

maskpack_status mp_kernel_pick(maskpack_kernel_family family, maskpack_dtype dtype, maskpack_isa requested,
                               size_t *index, maskpack_error *err) {
    uint32_t all = 0;
    for (size_t i = 0; family_desc(family, i); i++) all |= family_desc(family, i)->dtypes;
    if ((unsigned)dtype >= MASKPACK_DTYPE_COUNT_ || !(all & MP_DT(dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, "dtype", -1, -1, "dtype: expected float32 or bfloat16, found %s",
                       maskpack_dtype_name(dtype));
    maskpack_isa want;
    maskpack_status s = mp_isa_request(requested, &want, err);
    if (s) return s;
    /* the highest-ranked entry at or below the request (AUTO: any this CPU runs and AUTO may take) */
    const int cap = want == MASKPACK_ISA_AUTO ? 1 << 30 : mp_isa_rank(want);
    int best = -1;
    size_t best_i = 0;
    for (size_t i = 0; family_desc(family, i); i++) {
        const mp_kernel_desc *d = family_desc(family, i);
        const int r = mp_isa_rank(d->isa);
        /* an entry AUTO does not take for a dtype is taken for it only when asked for by its own name:
         * a request above it (amx for the rule, which has no AMX kernel) falls to what AUTO would run */
        const uint32_t ok = want == MASKPACK_ISA_AUTO ? d->auto_dtypes : d->isa == want ? d->dtypes : d->auto_dtypes;
        if (r > cap || r <= best || !(ok & MP_DT(dtype)) || mp_isa_missing(d->isa)) continue;
        best = r;
        best_i = i;
    }
    if (best < 0) /* every table has a reference entry taking every dtype of the family */
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "isa", -1, -1, "isa: no %s kernel runs %s here",
                       maskpack_kernel_family_name(family), maskpack_dtype_name(dtype));
    *index = best_i;
    return MASKPACK_OK;
}

maskpack_kernel_options maskpack_kernel_options_default(void) {
    maskpack_kernel_options o;
    o.n_threads = 1;
    o.isa = MASKPACK_ISA_AUTO;
    return o;
}

maskpack_status maskpack_isa_resolve(maskpack_kernel_family family, maskpack_dtype dtype, maskpack_isa requested,
                                     maskpack_isa *resolved, maskpack_error *err) {
    MP_CHECK_NULL(err, resolved, "resolved");
    if ((unsigned)family >= MASKPACK_KERNEL_FAMILY_COUNT_)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "family", -1, -1,
                       "family: expected ATTENTION (0), GDN (1) or CONV (2), found %d", (int)family);
    size_t i;
    maskpack_status s = mp_kernel_pick(family, dtype, requested, &i, err);
    if (s) return s;
    *resolved = family_desc(family, i)->isa;
    return mp_ok(err);
}

maskpack_status maskpack_kernel_list(maskpack_kernel_info *out, size_t cap, size_t *n, maskpack_error *err) {
    MP_CHECK_NULL(err, n, "n");
    if (cap && !out) return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "out", -1, -1, "out: NULL with cap %zu", cap);
    size_t k = 0;
    for (int f = 0; f < MASKPACK_KERNEL_FAMILY_COUNT_; f++)
        for (size_t i = 0; family_desc((maskpack_kernel_family)f, i); i++, k++) {
            if (k >= cap) continue;
            const mp_kernel_desc *d = family_desc((maskpack_kernel_family)f, i);
            out[k] = (maskpack_kernel_info){
                d->family, d->isa, d->name, d->dtypes, mp_isa_cpu_features(d->isa), mp_isa_missing(d->isa) == NULL};
        }
    *n = k;
    return mp_ok(err);
}
