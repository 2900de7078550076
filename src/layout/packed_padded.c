/* packed_padded.c: the layouts of the same sequences in another grid: one packed row
 * (maskpack_layout_packed_of) or one padded row per sequence (maskpack_layout_padded_of), under
 * the same rule. The copy plans between such layouts are src/relayout's. */
#include "internal.h"

static maskpack_status refuse_pieces(const maskpack_layout *L, const char *what, maskpack_error *err) {
    for (size_t k = 0; k < L->n_segments; k++)
        if (L->segs[k].flags & MASKPACK_SEGMENT_EXPLICIT_POS)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", (int64_t)k, -1,
                           "layout: segment %zu is a CP shard piece; %s needs an unsharded layout", k, what);
    return MASKPACK_OK;
}

maskpack_status maskpack_layout_packed_of(const maskpack_layout *L, maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = refuse_pieces(L, "packed_of", err);
    if (s) return s;
    maskpack_segment *segs = mp_alloc_array(L->n_segments, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    int64_t q = 0, kv = 0;
    for (size_t k = 0; k < L->n_segments; k++) {
        segs[k] = (maskpack_segment){0, q, L->segs[k].q_len, kv, L->segs[k].kv_len};
        q += L->segs[k].q_len;
        kv += L->segs[k].kv_len;
    }
    maskpack_rule r = maskpack_layout_rule(L);
    return mp_layout_build(segs, L->n_segments, 1, q, L->self ? q : kv, 1, &r, out, err);
}

maskpack_status maskpack_layout_padded_of(const maskpack_layout *L, maskpack_placement placement, int64_t width,
                                          maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = refuse_pieces(L, "padded_of", err);
    if (s) return s;
    if (placement != MASKPACK_PLACE_RIGHT && placement != MASKPACK_PLACE_LEFT)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "placement", -1, -1,
                       "placement: expected RIGHT (0) or LEFT (1), found %d", (int)placement);
    int64_t need = L->max_q;
    if (width == 0) width = need;
    if (width < need)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "width", -1, -1,
                       "width: expected 0 or >= %lld (the longest sequence), found %lld", (long long)need,
                       (long long)width);
    int64_t kv_width = L->self ? width : L->max_kv;
    maskpack_segment *segs = mp_alloc_array(L->n_segments, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    for (size_t k = 0; k < L->n_segments; k++) {
        const maskpack_segment *g = &L->segs[k];
        int left = placement == MASKPACK_PLACE_LEFT;
        segs[k] = (maskpack_segment){(int64_t)k, left ? width - g->q_len : 0, g->q_len, left ? kv_width - g->kv_len : 0,
                                     g->kv_len};
    }
    maskpack_rule r = maskpack_layout_rule(L);
    return mp_layout_build(segs, L->n_segments, (int64_t)L->n_segments, width, kv_width, 0, &r, out, err);
}
