/* offsets.c: integer outputs derived from a layout: cu_seqlens (TE and NPU forms), TE's
 * cu_seqlens_padded, per-segment lengths, per-token position and segment ids, the indices of the
 * real tokens and of each segment's last token.
 *
 * Every function validates the output (shape, dtype, stride extent) and the value range of the
 * chosen integer type before it writes anything, so a failing call leaves the buffer untouched. */
#include "fill.h"

/* Rejects int32 output when `value` (the largest value the output will hold) does not fit. `what`
 * names the value in the message; `index` is the first element that would hold it. */
static maskpack_status check_fits(const maskpack_tensor *out, int64_t value, int64_t index, const char *what,
                                  maskpack_error *err) {
    if (out->dtype == MASKPACK_I32 && (value > INT32_MAX || value < INT32_MIN))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "out", index, -1,
                       "out[%lld]: %s %lld does not fit int32 (max %d); use an int64 output", (long long)index, what,
                       (long long)value, INT32_MAX);
    return MASKPACK_OK;
}

/* Validates a 1-D int32/int64 output of n elements. */
static maskpack_status check_vector(const maskpack_tensor *out, int64_t n, maskpack_error *err) {
    int64_t shape[1] = {n};
    maskpack_status s = mp_check_output(out, "out", MP_DT_INDEX, 1, shape, err);
    if (s) return s;
    return mpd_check_extent(out, "out", err);
}

static inline void put(const maskpack_tensor *out, int64_t i, int64_t v) {
    if (out->dtype == MASKPACK_I64)
        ((int64_t *)out->data)[i * out->strides[0]] = v;
    else
        ((int32_t *)out->data)[i * out->strides[0]] = (int32_t)v;
}

maskpack_status maskpack_cu_seqlens(const maskpack_layout *L, maskpack_cu_form form, int kv, maskpack_tensor *out,
                                    maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    if (form != MASKPACK_CU_TE && form != MASKPACK_CU_NPU)
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "form", -1, -1,
                       "form: expected MASKPACK_CU_TE (0) or MASKPACK_CU_NPU (1), found %d", (int)form);
    int64_t lead = form == MASKPACK_CU_TE ? 1 : 0, n = (int64_t)L->n_segments;
    maskpack_status s = check_vector(out, n + lead, err);
    if (s) return s;
    /* Query sums cannot overflow int64 and are bounded by the grid: queries are disjoint inside an
     * n_rows x q_width grid whose cell count was checked when the layout was built. Key sums are
     * bounded the same way unless explicit-position pieces share keys, so they are summed with
     * checks. Only int32 needs a range check, and only the total matters (the sums never fall). */
    int64_t grid = kv ? -1 : L->n_rows * L->q_width, limit = out->dtype == MASKPACK_I32 ? INT32_MAX : INT64_MAX;
    if (grid < 0 || grid > limit) {
        int64_t total = 0;
        for (size_t k = 0; k < L->n_segments; k++) {
            int64_t next;
            if (mp_add_overflow(total, kv ? L->segs[k].kv_len : L->segs[k].q_len, &next))
                return mp_fail(err, MASKPACK_ERR_OVERFLOW, "out", (int64_t)k + lead, -1,
                               "out[%lld]: cumulative key length overflows int64", (long long)k + lead);
            total = next;
            if ((s = check_fits(out, total, (int64_t)k + lead, "cumulative length", err))) return s;
        }
    }
    const maskpack_segment *g = L->segs;
    int64_t st = out->strides[0], acc = 0;
    if (out->dtype == MASKPACK_I64) {
        int64_t *p = (int64_t *)out->data;
        if (lead) p[0] = 0;
        for (int64_t k = 0; k < n; k++) {
            acc += kv ? g[k].kv_len : g[k].q_len;
            p[(k + lead) * st] = acc;
        }
    } else {
        int32_t *p = (int32_t *)out->data;
        if (lead) p[0] = 0;
        for (int64_t k = 0; k < n; k++) {
            acc += kv ? g[k].kv_len : g[k].q_len;
            p[(k + lead) * st] = (int32_t)acc;
        }
    }
    return mp_ok(err);
}

/*
 * cu_seqlens_padded, precisely. Entry 0 is 0 and entry N is n_rows * q_width (the whole flattened
 * grid). For 0 < k < N, entry k is where segment k's slot starts:
 *     row_k * q_width + q_start_k   if segment k-1 lies in the same row,
 *     row_k * q_width               if segment k is the first segment of its row.
 * Slot k is [entry k, entry k+1). Hence:
 *   - the list is non-decreasing, starts at 0 and ends at B*S;
 *   - slot k contains segment k's tokens (row_k*S + [q_start_k, q_start_k + q_len_k));
 *   - filler after a segment (up to the next segment or the row end) belongs to its slot, a row's
 *     leading filler to the slot of its first segment, and rows with no segment (and the grid's
 *     leading empty rows) to the preceding slot (slot 0 for the leading ones).
 * With no segments the output is just [0]. TE reads a segment's tokens at the start of its slot,
 * so a layout whose rows start with filler (left padding) does not round-trip through TE's form.
 */
maskpack_status maskpack_cu_seqlens_padded(const maskpack_layout *L, maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    int64_t n = (int64_t)L->n_segments;
    maskpack_status s = check_vector(out, n + 1, err);
    if (s) return s;
    int64_t end = n > 0 ? L->n_rows * L->q_width : 0; /* fits: checked at layout build */
    if ((s = check_fits(out, end, n, "grid size", err))) return s;
    put(out, 0, 0);
    for (size_t k = 1; k < L->n_segments; k++) {
        const maskpack_segment *g = &L->segs[k];
        int first_of_row = L->segs[k - 1].row != g->row;
        put(out, (int64_t)k, g->row * L->q_width + (first_of_row ? 0 : g->q_start));
    }
    if (n > 0) put(out, n, end);
    return mp_ok(err);
}

maskpack_status maskpack_seqlens(const maskpack_layout *L, int kv, maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = check_vector(out, (int64_t)L->n_segments, err);
    if (s) return s;
    for (size_t k = 0; k < L->n_segments; k++)
        if ((s = check_fits(out, kv ? L->segs[k].kv_len : L->segs[k].q_len, (int64_t)k, "length", err))) return s;
    for (size_t k = 0; k < L->n_segments; k++) put(out, (int64_t)k, kv ? L->segs[k].kv_len : L->segs[k].q_len);
    return mp_ok(err);
}

/* Position id of a segment's first token: 0, or q_pos for an explicit-position piece (a
 * context-parallel chunk keeps the positions it has in its sequence, which is what RoPE needs:
 * "restarting at each segment" means at each sequence, not at each chunk of one). */
static int64_t first_position(const maskpack_segment *g) {
    return (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? g->q_pos : 0;
}

maskpack_status maskpack_position_ids(const maskpack_layout *L, maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = mp_check_per_token_output(L, out, "out", MP_DT_INDEX, err);
    if (s) return s;
    if ((s = mpd_check_extent(out, "out", err))) return s;
    if (mp_numel(out) == 0) return mp_ok(err); /* no element: no loop over the rows of a [2^50, 0] grid */
    if (out->dtype == MASKPACK_I32 && (L->max_q - 1 > INT32_MAX || L->max_kv - 1 > INT32_MAX))
        for (size_t k = 0; k < L->n_segments; k++) {
            const maskpack_segment *g = &L->segs[k];
            int64_t first = first_position(g);
            if (g->q_len > 0 && first + g->q_len - 1 > INT32_MAX) {
                int64_t skip = first > INT32_MAX ? 0 : (int64_t)INT32_MAX + 1 - first;
                return check_fits(out, first + skip, g->row * L->q_width + g->q_start + skip, "position id", err);
            }
        }

    mpd_rows v = mpd_token_rows(out);
    for (int64_t r = 0; r < L->n_rows; r++) {
        int64_t row = r * v.rs, col = 0;
        for (size_t k = mp_row_begin(L, r); k < mp_row_begin(L, r + 1); k++) {
            const maskpack_segment *g = &L->segs[k];
            mpd_fill(v.data, row + col * v.cs, v.cs, g->q_start - col, v.esize, 0);
            mpd_iota(v.data, row + g->q_start * v.cs, v.cs, g->q_len, v.esize, first_position(g));
            col = g->q_start + g->q_len;
        }
        mpd_fill(v.data, row + col * v.cs, v.cs, L->q_width - col, v.esize, 0);
    }
    return mp_ok(err);
}

/* 1-based id of the sequence segment k belongs to: a CP piece keeps its unsharded sequence's id, so
 * one document has one id on every rank. */
static int64_t seq_id(const maskpack_layout *L, size_t k) {
    const maskpack_segment *g = &L->segs[k];
    return ((g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? g->origin : (int64_t)k) + 1;
}

maskpack_status maskpack_segment_ids(const maskpack_layout *L, maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = mp_check_per_token_output(L, out, "out", MP_DT_INDEX, err);
    if (s) return s;
    if ((s = mpd_check_extent(out, "out", err))) return s;
    if (mp_numel(out) == 0) return mp_ok(err); /* no element: no loop over the rows of a [2^50, 0] grid */
    /* ids must fit the dtype: check the largest before writing anything */
    for (size_t k = 0; k < L->n_segments; k++)
        if (L->segs[k].q_len > 0 &&
            (s = check_fits(out, seq_id(L, k), L->segs[k].row * L->q_width + L->segs[k].q_start, "segment id", err)))
            return s;

    mpd_rows v = mpd_token_rows(out);
    for (int64_t r = 0; r < L->n_rows; r++) {
        int64_t row = r * v.rs, col = 0;
        for (size_t k = mp_row_begin(L, r); k < mp_row_begin(L, r + 1); k++) {
            const maskpack_segment *g = &L->segs[k];
            mpd_fill(v.data, row + col * v.cs, v.cs, g->q_start - col, v.esize, 0);
            mpd_fill(v.data, row + g->q_start * v.cs, v.cs, g->q_len, v.esize, mpd_int_bits(seq_id(L, k)));
            col = g->q_start + g->q_len;
        }
        mpd_fill(v.data, row + col * v.cs, v.cs, L->q_width - col, v.esize, 0);
    }
    return mp_ok(err);
}

/* Flattened index (row * q_width + column) of segment k's last real token; -1 when it is empty. */
static int64_t last_token(const maskpack_layout *L, size_t k) {
    const maskpack_segment *g = &L->segs[k];
    return g->q_len > 0 ? g->row * L->q_width + g->q_start + g->q_len - 1 : -1;
}

maskpack_status maskpack_valid_indices(const maskpack_layout *L, maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = check_vector(out, L->n_tokens, err);
    if (s) return s;
    /* indices increase, so only the last real token can be the first not to fit */
    for (size_t k = L->n_segments; k-- > 0;)
        if (L->segs[k].q_len > 0) {
            int64_t last = last_token(L, k);
            if (out->dtype == MASKPACK_I32 && last > INT32_MAX) {
                /* name the first element that does not fit */
                int64_t pos = 0;
                for (size_t j = 0; j < L->n_segments; j++) {
                    const maskpack_segment *g = &L->segs[j];
                    int64_t first = g->row * L->q_width + g->q_start;
                    if (g->q_len > 0 && first + g->q_len - 1 > INT32_MAX) {
                        int64_t skip = first > INT32_MAX ? 0 : (int64_t)INT32_MAX + 1 - first;
                        return check_fits(out, first + skip, pos + skip, "token index", err);
                    }
                    pos += g->q_len;
                }
            }
            break;
        }
    int64_t pos = 0, cs = out->strides[0];
    size_t es = maskpack_dtype_size(out->dtype);
    for (size_t k = 0; k < L->n_segments; k++) {
        const maskpack_segment *g = &L->segs[k];
        mpd_iota(out->data, pos * cs, cs, g->q_len, es, g->row * L->q_width + g->q_start);
        pos += g->q_len;
    }
    return mp_ok(err);
}

maskpack_status maskpack_last_token_index(const maskpack_layout *L, maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = check_vector(out, (int64_t)L->n_segments, err);
    if (s) return s;
    for (size_t k = 0; k < L->n_segments; k++)
        if ((s = check_fits(out, last_token(L, k), (int64_t)k, "token index", err))) return s;
    for (size_t k = 0; k < L->n_segments; k++) put(out, (int64_t)k, last_token(L, k));
    return mp_ok(err);
}
