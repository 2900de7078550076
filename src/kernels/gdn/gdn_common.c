/* gdn_common.c: tensor-against-layout validation, the gate check, overlap checks and pad zeroing
 * for the Gated DeltaNet calls. */
#include "gdn_common.h"

#include <float.h>
#include <stdio.h>
#include <string.h>

static maskpack_status state_like(const maskpack_layout *L, const maskpack_tensor *t, const char *name,
                                  const int64_t *want, uint32_t dtypes, const char *what, gdn_sview *out,
                                  maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 0, MASKPACK_MAX_DIMS, err);
    if (s) return s;
    (void)L;
    if (!(dtypes & MP_DT(t->dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected %s, found %s", name,
                       dtypes == MP_DT(MASKPACK_F32) ? "float32" : "float32 or bfloat16",
                       maskpack_dtype_name(t->dtype));
    int ok = t->ndim == 3 + (want[3] >= 0);
    int32_t nd = want[3] >= 0 ? 4 : 3;
    for (int32_t d = 0; ok && d < nd; d++) ok = t->shape[d] == want[d];
    if (!ok) {
        char w[160], f[160];
        mp_format_want_shape(w, sizeof w, nd, want);
        mp_format_want_shape(f, sizeof f, t->ndim, t->shape);
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1, "%s: expected shape %s (%s), found %s", name, w, what, f);
    }
    memset(out, 0, sizeof *out);
    out->base = (char *)t->data;
    out->dt = t->dtype;
    out->s_n = t->strides[0];
    out->s_h = t->strides[1];
    out->s_k = t->strides[2];
    out->s_v = nd == 4 ? t->strides[3] : 0;
    return MASKPACK_OK;
}

maskpack_status gdn_state_view(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int64_t HV,
                               int64_t K, int64_t V, gdn_sview *out, maskpack_error *err) {
    int64_t want[4] = {(int64_t)L->n_segments, HV, K, V};
    return state_like(L, t, name, want, MP_DT(MASKPACK_F32), "[segments, HV, K, V]", out, err);
}

maskpack_status gdn_conv_state_view(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int64_t C,
                                    int64_t W, gdn_sview *out, maskpack_error *err) {
    int64_t want[4] = {(int64_t)L->n_segments, C, W - 1, -1};
    return state_like(L, t, name, want, GDN_FLOAT_DTYPES, "[segments, channels, kernel - 1]", out, err);
}

/* One pass over the real tokens of g (pads are never read), in token order: the first (row, col,
 * head) whose value is not a finite number <= 0. The scan of a token's heads has no branch per
 * element (an accumulated flag); only a token that holds a bad value is scanned again to name it. */
maskpack_status gdn_check_gate_view(const maskpack_layout *L, const gdn_view *g, int64_t HV, maskpack_error *err) {
    for (size_t k = 0; k < L->n_segments; k++) { /* sorted by (row, q_start): token order */
        const int64_t r = L->segs[k].row, c0 = L->segs[k].q_start, c1 = c0 + L->segs[k].q_len;
        for (int64_t col = c0; col < c1; col++) {
            const int64_t off = r * g->s_row + col * g->s_col;
            int bad = 0;
            if (g->dt == MASKPACK_F32) {
                const float *p = (const float *)g->base + off;
                /* !(x <= 0): x > 0 or NaN; x < -FLT_MAX: -inf */
                for (int64_t h = 0; h < HV; h++) bad |= !(p[h * g->s_h] <= 0.0f) | (p[h * g->s_h] < -FLT_MAX);
            } else { /* bf16 bits: fine are +0 and a set sign bit with an exponent short of all ones */
                const uint16_t *p = (const uint16_t *)g->base + off;
                for (int64_t h = 0; h < HV; h++) {
                    const unsigned b = p[h * g->s_h];
                    bad |= (b != 0) & ((b < 0x8000u) | ((b & 0x7f80u) == 0x7f80u));
                }
            }
            if (!bad) continue;
            for (int64_t h = 0; h < HV; h++) {
                const float x = gdn_get(g->dt, g->base, off + h * g->s_h);
                if (x <= 0.0f && x >= -FLT_MAX) continue;
                const char *why = x != x     ? "NaN"
                                  : x > 0.0f ? "a gate > 0 grows the state, and the chunked and recurrent forms "
                                               "part ways"
                                             : "-inf breaks the chunked form";
                char at[96];
                const int64_t idx[4] = {L->packed ? col : r, L->packed ? h : col, L->packed ? -1 : h, -1};
                if (L->packed)
                    snprintf(at, sizeof at, "g[%lld, %lld] (token %lld, head %lld)", (long long)col, (long long)h,
                             (long long)col, (long long)h);
                else
                    snprintf(at, sizeof at, "g[%lld, %lld, %lld] (row %lld, token %lld, head %lld)", (long long)r,
                             (long long)col, (long long)h, (long long)r, (long long)col, (long long)h);
                return mp_fail4(err, MASKPACK_ERR_VALUE, "g", idx,
                                "%s: expected a finite log decay <= 0, found %g (%s); opts.skip_gate_check = 1 "
                                "(Python: check_gate=False) runs it unchecked",
                                at, (double)x, why);
            }
        }
    }
    return MASKPACK_OK;
}

maskpack_status gdn_check_overlap(const maskpack_tensor *const *ins, int n_in, maskpack_tensor *const *outs,
                                  const char *const *out_names, int n_out, maskpack_error *err) {
    for (int o = 0; o < n_out; o++) {
        if (!outs[o]) continue;
        maskpack_status s = mp_check_no_self_overlap(outs[o], out_names[o], err);
        if (s) return s;
        for (int i = 0; i < n_in; i++)
            if (mp_tensors_overlap(outs[o], ins[i]))
                return mp_fail(err, MASKPACK_ERR_OVERLAP, out_names[o], o, i,
                               "%s: its memory overlaps input %d; outputs must not alias inputs", out_names[o], i);
        for (int p = 0; p < o; p++)
            if (mp_tensors_overlap(outs[o], outs[p]))
                return mp_fail(err, MASKPACK_ERR_OVERLAP, out_names[o], o, p, "%s: its memory overlaps output %s",
                               out_names[o], out_names[p]);
    }
    return MASKPACK_OK;
}

static void zero_col(const gdn_view *v, int64_t row, int64_t col, int64_t nh, int64_t nd) {
    const int64_t off = row * v->s_row + col * v->s_col;
    for (int64_t h = 0; h < nh; h++)
        for (int64_t d = 0; d < nd; d++) gdn_put(v->dt, v->base, off + h * v->s_h + d * v->s_d, 0.0f);
}

void gdn_zero_pads(const maskpack_layout *L, const gdn_view *v, int64_t nh, int64_t nd) {
    for (int64_t r = 0; r < L->n_rows; r++) {
        int64_t col = 0;
        for (size_t k = mp_row_begin(L, r); k < mp_row_begin(L, r + 1); k++) {
            for (; col < L->segs[k].q_start; col++) zero_col(v, r, col, nh, nd);
            if (L->segs[k].q_start + L->segs[k].q_len > col) col = L->segs[k].q_start + L->segs[k].q_len;
        }
        for (; col < L->q_width; col++) zero_col(v, r, col, nh, nd);
    }
}
