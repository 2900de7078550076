/* labels.c: next-token labels shifted inside each sequence and loss weights that make the loss of a
 * padded, a packed and a CP-sharded batch the same number. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static maskpack_status refuse_shards(const maskpack_layout *L, const char *what, maskpack_error *err) {
    for (size_t k = 0; k < L->n_segments; k++)
        if (L->segs[k].flags & MASKPACK_SEGMENT_EXPLICIT_POS)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", (int64_t)k, -1,
                           "layout: segment %zu is a CP shard piece; %s on the unsharded layout, then shard the "
                           "result (a shard does not hold the next token of its last piece)",
                           k, what);
    return MASKPACK_OK;
}

/* strided element offset of token (row, col) of a per-token tensor */
static inline int64_t tok_off(const maskpack_tensor *t, int64_t row, int64_t col) {
    return t->ndim == 1 ? col * t->strides[0] : row * t->strides[0] + col * t->strides[1];
}

maskpack_status maskpack_shift_labels(const maskpack_layout *L, const maskpack_tensor *labels, int64_t ignore_index,
                                      maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, labels, "labels");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = refuse_shards(L, "shift labels", err);
    if (s) return s;
    if ((s = mp_check_per_token_input(L, labels, "labels", MP_DT_INDEX, err))) return s;
    if ((s = mp_check_per_token_output(L, out, "out", MP_DT(labels->dtype), err))) return s;
    if (labels->dtype == MASKPACK_I32 && (ignore_index < INT32_MIN || ignore_index > INT32_MAX))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "ignore_index", -1, -1,
                       "ignore_index: %lld does not fit int32 labels", (long long)ignore_index);
    if (labels->data == out->data && mp_numel(out) > 0)
        return mp_fail(err, MASKPACK_ERR_OVERLAP, "out", -1, -1,
                       "out: must not alias labels (the shift reads a token after writing its predecessor)");
    if (mp_numel(out) == 0) return mp_ok(err); /* no token: no loop over the rows of a [2^50, 0] grid */
    for (int64_t r = 0; r < L->n_rows; r++) {
        int64_t col = 0;
        for (size_t k = mp_row_begin(L, r); k <= mp_row_begin(L, r + 1); k++) {
            int64_t next = k < mp_row_begin(L, r + 1) ? L->segs[k].q_start : L->q_width;
            for (; col < next; col++) mp_write_i64(out->dtype, out->data, tok_off(out, r, col), ignore_index);
            if (k == mp_row_begin(L, r + 1)) break;
            const maskpack_segment *g = &L->segs[k];
            int64_t ls = labels->strides[labels->ndim - 1], os = out->strides[out->ndim - 1];
            if (labels->dtype == MASKPACK_I64) { /* the common case, with the dtype switch out of the loop */
                const int64_t *src = (const int64_t *)labels->data + tok_off(labels, r, g->q_start + 1);
                int64_t *dst = (int64_t *)out->data + tok_off(out, r, g->q_start);
                if (ls == 1 && os == 1 && g->q_len > 1) /* contiguous (the usual): one copy */
                    memcpy(dst, src, (size_t)(g->q_len - 1) * sizeof *dst);
                else
                    for (int64_t i = 0; i + 1 < g->q_len; i++) dst[i * os] = src[i * ls];
            } else if (labels->dtype == MASKPACK_I32) {
                const int32_t *src = (const int32_t *)labels->data + tok_off(labels, r, g->q_start + 1);
                int32_t *dst = (int32_t *)out->data + tok_off(out, r, g->q_start);
                for (int64_t i = 0; i + 1 < g->q_len; i++) dst[i * os] = src[i * ls];
            } else {
                for (int64_t i = 0; i + 1 < g->q_len; i++) {
                    int64_t v = mp_read_i64(labels->dtype, labels->data, tok_off(labels, r, g->q_start + i + 1));
                    mp_write_i64(out->dtype, out->data, tok_off(out, r, g->q_start + i), v);
                }
            }
            if (g->q_len > 0)
                mp_write_i64(out->dtype, out->data, tok_off(out, r, g->q_start + g->q_len - 1), ignore_index);
            col = g->q_start + g->q_len;
        }
    }
    return mp_ok(err);
}

/* Contiguous int64 labels, the usual case: branch-free loops the compiler vectorizes (a 64-bit
 * compare: MP_CLONES). */
MP_CLONES static int64_t count_labelled_i64(const int64_t *l, int64_t n, int64_t ignore_index) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += l[i] != ignore_index;
    return c;
}

MP_CLONES static void weigh_i64_f32(const int64_t *l, int64_t n, int64_t ignore_index, float w, float *o) {
    for (int64_t i = 0; i < n; i++) o[i] = l[i] != ignore_index ? w : 0.0f;
}

/* Labelled tokens of segment g: labels != ignore_index, or (no labels) every token but its last. */
static int64_t labelled_in(const maskpack_tensor *labels, const maskpack_segment *g, int64_t ignore_index) {
    if (!labels) return g->q_len > 0 ? g->q_len - 1 : 0;
    int64_t c = 0, ls = labels->strides[labels->ndim - 1];
    if (labels->dtype == MASKPACK_I64) {
        const int64_t *l = (const int64_t *)labels->data + tok_off(labels, g->row, g->q_start);
        if (ls == 1) return count_labelled_i64(l, g->q_len, ignore_index);
        for (int64_t i = 0; i < g->q_len; i++) c += l[i * ls] != ignore_index;
    } else if (labels->dtype == MASKPACK_I32) {
        const int32_t *l = (const int32_t *)labels->data + tok_off(labels, g->row, g->q_start);
        for (int64_t i = 0; i < g->q_len; i++) c += l[i * ls] != ignore_index;
    } else {
        for (int64_t i = 0; i < g->q_len; i++)
            c += mp_read_i64(labels->dtype, labels->data, tok_off(labels, g->row, g->q_start + i)) != ignore_index;
    }
    return c;
}

maskpack_status maskpack_loss_weights(const maskpack_layout *L, const maskpack_tensor *labels, int64_t ignore_index,
                                      maskpack_loss_mode mode, maskpack_tensor *out, double *denominator,
                                      maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    MP_CHECK_NULL(err, denominator, "denominator");
    maskpack_status s = refuse_shards(L, "compute loss weights", err);
    if (s) return s;
    if (mode != MASKPACK_LOSS_TOKEN && mode != MASKPACK_LOSS_SEQUENCE)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "mode", -1, -1,
                       "mode: expected MASKPACK_LOSS_TOKEN (0) or MASKPACK_LOSS_SEQUENCE (1), found %d", (int)mode);
    if (labels && (s = mp_check_per_token_input(L, labels, "labels", MP_DT_INDEX, err))) return s;
    if ((s = mp_check_per_token_output(L, out, "out", MP_DT(MASKPACK_F32) | MP_DT(MASKPACK_F64), err))) return s;
    /* pass 1: labelled tokens per sequence and the denominator */
    int64_t tokens = 0, sequences = 0;
    for (size_t k = 0; k < L->n_segments; k++) {
        int64_t c = labelled_in(labels, &L->segs[k], ignore_index);
        tokens += c;
        sequences += c > 0;
    }
    double denom = mode == MASKPACK_LOSS_TOKEN ? (double)tokens : (double)sequences;
    /* pass 2: pads 0, labelled tokens 1/denom (token) or 1/(count * denom) (sequence) */
    int64_t os = out->strides[out->ndim - 1], es = (int64_t)maskpack_dtype_size(out->dtype);
    for (int64_t r = 0; L->q_width && r < L->n_rows; r++) { /* an empty grid: no loop over its rows */
        if (os == 1)                                        /* a row of zero bytes is 0.0 in both float dtypes */
            memset((char *)out->data + tok_off(out, r, 0) * es, 0, (size_t)(L->q_width * es));
        else
            for (int64_t col = 0; col < L->q_width; col++)
                mp_write_f64(out->dtype, out->data, tok_off(out, r, col), 0.0);
    }
    for (size_t k = 0; k < L->n_segments && denom > 0; k++) {
        const maskpack_segment *g = &L->segs[k];
        int64_t c = labelled_in(labels, g, ignore_index);
        if (c == 0) continue;
        double w = mode == MASKPACK_LOSS_TOKEN ? 1.0 / denom : 1.0 / ((double)c * denom);
        if (!labels && out->dtype == MASKPACK_F32) { /* every token but the last: a plain fill */
            float *o = (float *)out->data + tok_off(out, g->row, g->q_start);
            for (int64_t i = 0; i + 1 < g->q_len; i++) o[i * os] = (float)w;
            continue;
        }
        if (labels && labels->dtype == MASKPACK_I64 && out->dtype == MASKPACK_F32) {
            const int64_t *l = (const int64_t *)labels->data + tok_off(labels, g->row, g->q_start);
            int64_t ls = labels->strides[labels->ndim - 1];
            float *o = (float *)out->data + tok_off(out, g->row, g->q_start);
            if (ls == 1 && os == 1)
                weigh_i64_f32(l, g->q_len, ignore_index, (float)w, o);
            else
                for (int64_t i = 0; i < g->q_len; i++)
                    if (l[i * ls] != ignore_index) o[i * os] = (float)w;
            continue;
        }
        for (int64_t i = 0; i < g->q_len; i++) {
            int lab = labels ? mp_read_i64(labels->dtype, labels->data, tok_off(labels, g->row, g->q_start + i)) !=
                                   ignore_index
                             : i + 1 < g->q_len;
            if (lab) mp_write_f64(out->dtype, out->data, tok_off(out, g->row, g->q_start + i), w);
        }
    }
    *denominator = denom;
    return mp_ok(err);
}
