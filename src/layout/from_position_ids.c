/* from_position_ids.c: a layout from position ids, the way packed batches are described when no
 * cu_seqlens travel with them (docs/conventions.md section 7). Two boundary rules exist in the wild (HF's
 * flash path resets at the minimum, its mask builders at any step other than +1); the caller picks
 * one. A tail of zeros is padding, not a run of length-1 sequences (bug class 8). */
#include "internal.h"

#include <stdlib.h>

/* A self-attention segment (kv == q); the remaining fields (flags, q_pos, origin) stay zero. */
static maskpack_segment self_seg(int64_t row, int64_t start, int64_t len) {
    return (maskpack_segment){.row = row, .q_start = start, .q_len = len, .kv_start = start, .kv_len = len};
}

/* The position-id rows to scan: n_rows rows of `width` elements, element (r, c) at
 * base + r*rstride + c*cstride (elements). For [3,B,S] only the text row (index 0) is seen. */
typedef struct pos_view {
    const maskpack_tensor *t;
    int64_t n_rows, width, rstride, cstride;
    const int64_t *row;  /* when set: row `row_index` as contiguous int64 (read in place or converted once) */
    int64_t row_index;
} pos_view;

static inline int64_t pos_at(const pos_view *v, int64_t r, int64_t c) {
    if (v->row && r == v->row_index) return v->row[c];
    return mp_read_i64(v->t->dtype, v->t->data, r * v->rstride + c * v->cstride);
}

/* Points v->row at row r as contiguous int64: in place for contiguous int64 ids, else converted into
 * buf [width] (one pass with the dtype switch hoisted; the scans then read plain int64s). */
static void load_row(pos_view *v, int64_t r, int64_t *buf) {
    v->row_index = r;
    if (v->t->dtype == MASKPACK_I64 && v->cstride == 1) {
        v->row = (const int64_t *)v->t->data + r * v->rstride;
        return;
    }
    v->row = NULL;
    if (!buf) return;
    if (v->t->dtype == MASKPACK_I32) {
        const int32_t *p = (const int32_t *)v->t->data + r * v->rstride;
        for (int64_t c = 0; c < v->width; c++) buf[c] = p[c * v->cstride];
    } else {
        for (int64_t c = 0; c < v->width; c++) buf[c] = pos_at(v, r, c);
    }
    v->row = buf;
}

/* Length of the non-padding prefix of row r: a trailing run of two or more zeros is padding. A single
 * trailing zero stays a (length-1) sequence: it is what a one-token document looks like. */
static int64_t real_width(const pos_view *v, int64_t r) {
    int64_t e = v->width;
    while (e > 0 && pos_at(v, r, e - 1) == 0) e--;
    return v->width - e >= 2 ? e : v->width;
}

/* Counts the sequences of row r (within its non-padding prefix); with `segs` non-NULL also writes
 * them there. Column 0 always starts a sequence: the first token of a
 * row belongs to something even when its id is not the minimum (RESET) or the row starts mid-count. */
static size_t row_sequences(const pos_view *v, int64_t r, maskpack_boundary_rule rule, maskpack_segment *segs) {
    int64_t E = real_width(v, r);
    if (E == 0) return 0;
    int64_t mn = 0;
    if (rule == MASKPACK_BOUNDARY_RESET) {
        /* the minimum of the real tokens only: the tail pad is 0 and would hide a row that counts from
         * padding_idx + 1 (RoBERTa-like) */
        mn = pos_at(v, r, 0);
        for (int64_t c = 1; c < E; c++) {
            int64_t x = pos_at(v, r, c);
            if (x < mn) mn = x;
        }
    }
    size_t n = 0;
    int64_t start = 0, prev = pos_at(v, r, 0);
    for (int64_t c = 1; c < E; c++) {
        int64_t x = pos_at(v, r, c);
        /* x >= 0 was checked, so x - 1 cannot overflow where prev + 1 could */
        int boundary = rule == MASKPACK_BOUNDARY_RESET ? x == mn : x - 1 != prev;
        if (boundary) {
            if (segs) segs[n] = self_seg(r, start, c - start);
            n++;
            start = c;
        }
        prev = x;
    }
    if (segs) segs[n] = self_seg(r, start, E - start);
    return n + 1;
}

maskpack_status maskpack_layout_from_position_ids(const maskpack_tensor *position_ids, maskpack_boundary_rule boundary,
                                                  const maskpack_rule *rule, maskpack_layout **out,
                                                  maskpack_error *err) {
    const char *name = "position_ids";
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = mp_check_tensor(position_ids, name, 1, 3, err);
    if (s) return s;
    const maskpack_tensor *t = position_ids;
    if (boundary != MASKPACK_BOUNDARY_RESET && boundary != MASKPACK_BOUNDARY_STEP)
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "boundary", -1, -1,
                       "boundary: expected RESET (0) or STEP (1), found %d", (int)boundary);
    /* positions are counts: bool and floats are not position ids */
    if (!mp_dtype_is_integer(t->dtype) || t->dtype == MASKPACK_BOOL)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1,
                       "%s: expected an integer dtype (uint8, int8, int16, int32, int64), found %s", name,
                       maskpack_dtype_name(t->dtype));
    if (t->ndim == 3 && t->shape[0] != 3)
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                       "%s: expected [3, B, S] (M-RoPE) for 3 dimensions, found a first dimension of %lld", name,
                       (long long)t->shape[0]);

    pos_view v = {t, 1, t->shape[0], 0, t->strides[0], NULL, -1};
    if (t->ndim == 2) v = (pos_view){t, t->shape[0], t->shape[1], t->strides[0], t->strides[1], NULL, -1};
    /* M-RoPE: the temporal/height/width rows 1 and 2 of image tokens do not count up per token; the
     * text row (index 0) is the one that describes the documents (HF's 3x-too-long cu_seqlens bug) */
    if (t->ndim == 3) v = (pos_view){t, t->shape[1], t->shape[2], t->strides[1], t->strides[2], NULL, -1};
    /* nothing to read: no loop over the rows of a [2^50, 0] or [3, 2^50, 0] tensor */
    if (v.n_rows == 0 || v.width == 0) return mp_layout_empty(v.n_rows, v.width, t->ndim == 1, rule, out, err);

    /* one row of int64 scratch (rows of int64 ids are read in place); without it the scans read
     * element by element, which is only slower */
    int64_t *buf = (t->dtype == MASKPACK_I64 && v.cstride == 1) ? NULL : mp_alloc_array((size_t)v.width, sizeof *buf);
    for (int64_t r = 0; r < v.n_rows; r++) {
        load_row(&v, r, buf);
        for (int64_t c = 0; c < v.width; c++) {
            int64_t x = pos_at(&v, r, c);
            if (x >= 0) continue;
            free(buf);
            if (t->ndim == 1)
                return mp_fail(err, MASKPACK_ERR_VALUE, name, c, -1, "%s[%lld]: expected >= 0, found %lld", name,
                               (long long)c, (long long)x);
            if (t->ndim == 2)
                return mp_fail(err, MASKPACK_ERR_VALUE, name, r, c, "%s[%lld, %lld]: expected >= 0, found %lld", name,
                               (long long)r, (long long)c, (long long)x);
            const int64_t idx[4] = {0, r, c, -1};
            return mp_fail4(err, MASKPACK_ERR_VALUE, name, idx, "%s[0, %lld, %lld]: expected >= 0, found %lld", name,
                            (long long)r, (long long)c, (long long)x);
        }
    }

    size_t n = 0;
    for (int64_t r = 0; r < v.n_rows; r++) {
        load_row(&v, r, buf);
        n += row_sequences(&v, r, boundary, NULL); /* <= numel, fits */
    }
    if (n > SIZE_MAX / sizeof(maskpack_segment)) {
        free(buf);
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, -1, -1, "%s: too many sequences (%zu)", name, n);
    }
    maskpack_segment *segs = mp_alloc_array(n, sizeof *segs);
    if (!segs) {
        free(buf);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, name, -1, -1, "out of memory");
    }
    size_t k = 0;
    for (int64_t r = 0; r < v.n_rows; r++) {
        load_row(&v, r, buf);
        k += row_sequences(&v, r, boundary, segs + k);
    }
    free(buf);
    int packed = t->ndim == 1;
    return mp_layout_build(segs, n, v.n_rows, v.width, v.width, packed, rule, out, err);
}
