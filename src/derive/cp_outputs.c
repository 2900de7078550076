/* cp_outputs.c: the index outputs of context parallelism over a layout: which grid tokens a rank
 * holds (maskpack_cp_shard_indices) and where each sequence's last token lands
 * (maskpack_cp_last_token). The ranks' ranges are the shard's own (src/layout/cp_shard.c). */
#include "../layout/cp_internal.h"

#include <stdlib.h>

maskpack_status maskpack_cp_shard_indices(const maskpack_layout *L, int64_t cp, int64_t rank, maskpack_cp_scheme scheme,
                                          maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    mp_cp_range *R;
    size_t n;
    maskpack_status s = mp_cp_rank_ranges(L, cp, rank, &scheme, &R, &n, err);
    if (s) return s;
    int64_t total = L->n_rows * L->q_width / cp;
    int64_t shape[1] = {total};
    s = mp_check_output(out, "out", MP_DT_INDEX, 1, shape, err);
    if (!s && out->dtype == MASKPACK_I32 && L->n_rows * L->q_width > INT32_MAX)
        s = mp_fail(err, MASKPACK_ERR_OVERFLOW, "out", -1, -1, "out: indices up to %lld do not fit int32",
                    (long long)(L->n_rows * L->q_width));
    if (s) {
        free(R);
        return s;
    }
    int64_t o = 0;
    for (size_t t = 0; t < n; t++)
        for (int64_t c = 0; c < R[t].len; c++, o++)
            mp_write_i64(out->dtype, out->data, o * out->strides[0], R[t].row * L->q_width + R[t].start + c);
    free(R);
    return mp_ok(err);
}

maskpack_status maskpack_cp_last_token(const maskpack_layout *L, int64_t cp, maskpack_cp_scheme scheme,
                                       maskpack_tensor *rank_out, maskpack_tensor *local_out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, rank_out, "rank");
    MP_CHECK_NULL(err, local_out, "local");
    mp_cp_range *R;
    size_t n;
    maskpack_status s = mp_cp_rank_ranges(L, cp, 0, &scheme, &R, &n, err); /* validates cp, scheme, divisibility */
    if (s) return s;
    free(R);
    int64_t shape[1] = {(int64_t)L->n_segments};
    if ((s = mp_check_output(rank_out, "rank", MP_DT_INDEX, 1, shape, err))) return s;
    if ((s = mp_check_output(local_out, "local", MP_DT_INDEX, 1, shape, err))) return s;
    int64_t lw = L->q_width / cp; /* local grid width */
    int64_t before = 0;           /* packed zigzag: tokens each rank holds from earlier slots */
    for (size_t k = 0; k < L->n_segments; k++) {
        const maskpack_segment *g = &L->segs[k];
        int64_t r = -1, loc = -1;
        if (L->packed && scheme == MASKPACK_CP_ZIGZAG) {
            int64_t a = mp_cp_slot_start(L, k), c = (mp_cp_slot_end(L, k) - a) / (2 * cp);
            if (g->q_len > 0) {
                int64_t off = g->q_start + g->q_len - 1 - a, chunk = off / c;
                r = chunk < cp ? chunk : 2 * cp - 1 - chunk;
                loc = before + (chunk < cp ? 0 : c) + off % c;
            }
            before += 2 * c;
        } else if (g->q_len > 0) {
            int64_t col = g->q_start + g->q_len - 1;
            if (scheme == MASKPACK_CP_ZIGZAG) {
                int64_t c = L->q_width / (2 * cp), chunk = col / c;
                r = chunk < cp ? chunk : 2 * cp - 1 - chunk;
                loc = g->row * lw + (chunk < cp ? 0 : c) + col % c;
            } else {
                r = col / lw;
                loc = g->row * lw + col % lw;
            }
        }
        mp_write_i64(rank_out->dtype, rank_out->data, (int64_t)k * rank_out->strides[0], r);
        mp_write_i64(local_out->dtype, local_out->data, (int64_t)k * local_out->strides[0], loc);
    }
    return mp_ok(err);
}
