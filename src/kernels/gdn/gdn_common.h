/* gdn_common.h: validation and layout helpers shared by the Gated DeltaNet API files. */
#ifndef MASKPACK_GDN_COMMON_H
#define MASKPACK_GDN_COMMON_H

#include "gdn_internal.h"

#include <math.h>

#define GDN_FLOAT_DTYPES (MP_DT(MASKPACK_F32) | MP_DT(MASKPACK_BF16))

/* The per-token tensors: mp_token_view_check (internal.h), shared with the conv. */

/* Checks an f32 state tensor [N, HV, K, V] (N = segments). */
maskpack_status gdn_state_view(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int64_t HV,
                               int64_t K, int64_t V, gdn_sview *out, maskpack_error *err);

/* Checks a [N, C, W-1] conv prefix / state tensor (f32 or bf16). */
maskpack_status gdn_conv_state_view(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int64_t C,
                                    int64_t W, gdn_sview *out, maskpack_error *err);

/* MASKPACK_ERR_VALUE naming g and its first real token and head (row, col, head; packed: token,
 * head) whose log decay is not a finite number <= 0 (g > 0 grows the state without bound, NaN and
 * -inf break the chunked form); pads are not read. g: a view of [.., HV]. */
maskpack_status gdn_check_gate_view(const maskpack_layout *L, const gdn_view *g, int64_t HV, maskpack_error *err);

/* MASKPACK_ERR_OVERLAP when an output's memory range meets an input's or another output's
 * (NULL entries are skipped). */
maskpack_status gdn_check_overlap(const maskpack_tensor *const *ins, int n_in, maskpack_tensor *const *outs,
                                  const char *const *out_names, int n_out, maskpack_error *err);

/* Writes 0 to every (head < nh, d < nd) element of every column that belongs to no segment. */
void gdn_zero_pads(const maskpack_layout *L, const gdn_view *v, int64_t nh, int64_t nd);

/* Element I/O of views (f32 or bf16). */
static inline float gdn_get(maskpack_dtype dt, const char *base, int64_t off) {
    return dt == MASKPACK_F32 ? ((const float *)base)[off] : mp_bf16_to_f32(((const uint16_t *)base)[off]);
}
static inline void gdn_put(maskpack_dtype dt, char *base, int64_t off, float x) {
    if (dt == MASKPACK_F32)
        ((float *)base)[off] = x;
    else
        ((uint16_t *)base)[off] = mp_f32_to_bf16(x);
}

#endif
