/* masks.c: dense masks derived from a layout: the per-token 2D keep mask and the 4D mask in the
 * KEEP / MASKED / ADDITIVE conventions.
 *
 * Both are written run by run. For the 4D mask every query row's allowed keys are a union of at
 * most three intervals (the base causal/window interval, the prefix, the row's span), so a row is
 * at most seven runs of constant value: the cost is one memset-like pass over the output instead
 * of one predicate call per cell. */
#include "fill.h"

#include <string.h>

#define MASK2D_DTYPES                                                                                                  \
    (MP_DT(MASKPACK_BOOL) | MP_DT(MASKPACK_U8) | MP_DT(MASKPACK_I8) | MP_DT(MASKPACK_I32) | MP_DT(MASKPACK_I64) |      \
     MP_DT(MASKPACK_F32))

maskpack_status maskpack_mask2d(const maskpack_layout *L, maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = mp_check_per_token_output(L, out, "out", MASK2D_DTYPES, err);
    if (s) return s;
    if ((s = mpd_check_extent(out, "out", err))) return s;
    if (mp_numel(out) == 0) return mp_ok(err); /* no element: no loop over the rows of a [2^50, 0] grid */

    mpd_rows v = mpd_token_rows(out);
    uint64_t one = mpd_one_bits(out->dtype);
    for (int64_t r = 0; r < L->n_rows; r++) {
        int64_t row = r * v.rs, col = 0;
        for (size_t k = mp_row_begin(L, r); k < mp_row_begin(L, r + 1); k++) {
            const maskpack_segment *g = &L->segs[k];
            mpd_fill(v.data, row + col * v.cs, v.cs, g->q_start - col, v.esize, 0);
            mpd_fill(v.data, row + g->q_start * v.cs, v.cs, g->q_len, v.esize, one);
            col = g->q_start + g->q_len;
        }
        mpd_fill(v.data, row + col * v.cs, v.cs, L->q_width - col, v.esize, 0);
    }
    return mp_ok(err);
}

/* Bit pattern of the additive "excluded" value for dtype d. */
static uint64_t additive_fill_bits(maskpack_dtype d, maskpack_fill fill) {
    int neg_inf = fill == MASKPACK_FILL_NEG_INF;
    switch (d) {
    case MASKPACK_F16: return neg_inf ? 0xfc00u : 0xfbffu;                   /* -inf : -65504 */
    case MASKPACK_BF16: return neg_inf ? 0xff80u : 0xff7fu;                  /* -inf : -3.3895e38 */
    case MASKPACK_F32: return neg_inf ? 0xff800000u : 0xff7fffffu;           /* -inf : -FLT_MAX */
    default: return neg_inf ? 0xfff0000000000000ull : 0xffefffffffffffffull; /* f64: -inf : -DBL_MAX */
    }
}

/* Writes one query row of Skv keys: `deny` everywhere except the intervals, which get `allow`. */
static void write_row(void *data, int64_t off, int64_t cs, int64_t skv, size_t es, uint64_t allow, uint64_t deny,
                      int64_t iv[3][2], int n) {
    int64_t col = 0;
    for (int a = 0; a < n; a++) {
        mpd_fill(data, off + col * cs, cs, iv[a][0] - col, es, deny);
        mpd_fill(data, off + iv[a][0] * cs, cs, iv[a][1] - iv[a][0], es, allow);
        col = iv[a][1];
    }
    mpd_fill(data, off + col * cs, cs, skv - col, es, deny);
}

/* Writes the [S, Skv] plane of row b at element offset `plane`. */
static void write_plane(const maskpack_layout *L, int64_t b, void *data, int64_t plane, int64_t s2, int64_t s3,
                        size_t es, uint64_t allow, uint64_t deny) {
    int64_t skv = L->kv_width, i = 0;
    int64_t none[3][2];
    for (size_t k = mp_row_begin(L, b); k < mp_row_begin(L, b + 1); k++) {
        const maskpack_segment *g = &L->segs[k];
        for (; i < g->q_start; i++) write_row(data, plane + i * s2, s3, skv, es, allow, deny, none, 0);
        size_t cursor = L->span_begin[k];
        for (int64_t li = 0; li < g->q_len; li++, i++) {
            int64_t iv[3][2];
            int n = mpd_row_intervals(L, k, li, &cursor, iv);
            write_row(data, plane + i * s2, s3, skv, es, allow, deny, iv, n);
        }
    }
    for (; i < L->q_width; i++) write_row(data, plane + i * s2, s3, skv, es, allow, deny, none, 0);
}

maskpack_status maskpack_mask4d(const maskpack_layout *L, maskpack_mask_convention convention, maskpack_fill fill,
                                maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    uint32_t allowed;
    switch (convention) {
    case MASKPACK_MASK_KEEP:
    case MASKPACK_MASK_MASKED:
        allowed = MP_DT(MASKPACK_BOOL) | MP_DT(MASKPACK_U8) | MP_DT(MASKPACK_I32) | MP_DT(MASKPACK_F32);
        break;
    case MASKPACK_MASK_ADDITIVE:
        allowed = MP_DT(MASKPACK_F32) | MP_DT(MASKPACK_F16) | MP_DT(MASKPACK_BF16) | MP_DT(MASKPACK_F64);
        break;
    default:
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "convention", -1, -1,
                       "convention: expected KEEP (0), MASKED (1) or ADDITIVE (2), found %d", (int)convention);
    }
    if (fill != MASKPACK_FILL_NEG_INF && fill != MASKPACK_FILL_DTYPE_MIN)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "fill", -1, -1,
                       "fill: expected NEG_INF (0) or DTYPE_MIN (1), found %d", (int)fill);
    /* the head dimension is free (>= 1); everything else is fixed by the layout */
    int64_t heads = out->ndim == 4 && out->shape[1] >= 1 ? out->shape[1] : 1;
    int64_t shape[4] = {L->n_rows, heads, L->q_width, L->kv_width};
    maskpack_status s = mp_check_output(out, "out", allowed, 4, shape, err);
    if (s) return s;
    if ((s = mpd_check_extent(out, "out", err))) return s;
    if (mp_numel(out) == 0) return mp_ok(err); /* no element: no loop over the rows of a [2^50, 0] grid */

    uint64_t allow, deny;
    if (convention == MASKPACK_MASK_KEEP) {
        allow = mpd_one_bits(out->dtype);
        deny = 0;
    } else if (convention == MASKPACK_MASK_MASKED) {
        allow = 0;
        deny = mpd_one_bits(out->dtype);
    } else {
        allow = 0; /* +0.0 in every float format */
        deny = additive_fill_bits(out->dtype, fill);
    }
    size_t es = maskpack_dtype_size(out->dtype);
    const int64_t *st = out->strides;
    /* a plane is one block of memory when rows are packed back to back: later heads are copies */
    int plane_contig = st[3] == 1 && st[2] == L->kv_width;
    size_t plane_bytes = (size_t)(L->q_width * L->kv_width) * es;
    for (int64_t b = 0; b < L->n_rows; b++) {
        int64_t p0 = b * st[0];
        write_plane(L, b, out->data, p0, st[2], st[3], es, allow, deny);
        for (int64_t h = 1; h < heads; h++) {
            int64_t ph = p0 + h * st[1];
            if (plane_contig) {
                if (ph != p0) /* a broadcast (stride 0) head dimension already holds the plane */
                    memmove((char *)out->data + ph * (int64_t)es, (char *)out->data + p0 * (int64_t)es, plane_bytes);
            } else {
                write_plane(L, b, out->data, ph, st[2], st[3], es, allow, deny);
            }
        }
    }
    return mp_ok(err);
}
