/* token_view.c: the one per-token tensor view of the kernels (attention, the gated delta rule, the
 * causal conv): how a [B, S, ...] / [T, ...] / [1, T, ...] tensor is addressed over a layout's token
 * grid, and the check of such a tensor against the grid that the GDN and conv calls word their
 * messages with (the attention calls check their head tensors in their own words, then fill the
 * same view). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

void mp_format_want_shape(char *buf, size_t cap, int32_t nd, const int64_t *shape) {
    size_t u = (size_t)snprintf(buf, cap, "[");
    for (int32_t d = 0; d < nd && u < cap; d++) {
        if (shape[d] < 0)
            u += (size_t)snprintf(buf + u, cap - u, d ? ", *" : "*");
        else
            u += (size_t)snprintf(buf + u, cap - u, d ? ", %lld" : "%lld", (long long)shape[d]);
    }
    if (u < cap) snprintf(buf + u, cap - u, "]");
}

void mp_token_view_fill(const maskpack_tensor *t, int lead, int packed, mp_token_view *v) {
    memset(v, 0, sizeof *v);
    v->base = (char *)t->data;
    v->dt = t->dtype;
    v->s_row = packed ? 0 : t->strides[0];
    v->s_col = t->strides[lead - 1];
    v->s_h = t->ndim > lead ? t->strides[lead] : 0;
    v->s_d = t->ndim > lead + 1 ? t->strides[lead + 1] : 0;
}

maskpack_status mp_token_view_check(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int n_extra,
                                    int64_t *extra, uint32_t dtypes, mp_token_view *out, maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 1, MASKPACK_MAX_DIMS, err);
    if (s) return s;
    if (!(dtypes & MP_DT(t->dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected float32 or bfloat16, found %s", name,
                       maskpack_dtype_name(t->dtype));
    int64_t want[MASKPACK_MAX_DIMS];
    int32_t nd;
    int lead;
    if (L->packed) {
        lead = (t->ndim == 2 + n_extra && t->shape[0] == 1) ? 2 : 1;
        nd = lead + n_extra;
        if (lead == 2) want[0] = 1;
        want[lead - 1] = L->q_width;
    } else {
        lead = 2;
        nd = 2 + n_extra;
        want[0] = L->n_rows;
        want[1] = L->q_width;
    }
    for (int i = 0; i < n_extra; i++) want[lead + i] = extra[i];
    int ok = t->ndim == nd;
    for (int32_t d = 0; ok && d < nd; d++) ok = want[d] < 0 || t->shape[d] == want[d];
    if (!ok) {
        char w[160], f[160];
        mp_format_want_shape(w, sizeof w, nd, want);
        mp_format_want_shape(f, sizeof f, t->ndim, t->shape);
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                       "%s: expected shape %s (the layout's %s token grid, heads second-to-last), found %s", name, w,
                       L->packed ? "packed [T]" : "padded [B, S]", f);
    }
    for (int i = 0; i < n_extra; i++) extra[i] = t->shape[lead + i];
    mp_token_view_fill(t, lead, L->packed, out);
    return MASKPACK_OK;
}
