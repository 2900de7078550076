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
} pos_view;

/* Row r as contiguous int64: in place for contiguous int64 ids, else converted into buf [width] (one
 * pass with the dtype switch hoisted), so that the scans below are plain loops the compiler
 * vectorizes (a 32k-token row is scanned three times in about the time torch takes for one
 * nonzero). */
static const int64_t *load_row(const pos_view *v, int64_t r, int64_t *buf) {
    if (v->t->dtype == MASKPACK_I64 && v->cstride == 1) return (const int64_t *)v->t->data + r * v->rstride;
    if (v->t->dtype == MASKPACK_I32) {
        const int32_t *p = (const int32_t *)v->t->data + r * v->rstride;
        for (int64_t c = 0; c < v->width; c++) buf[c] = p[c * v->cstride];
    } else {
        for (int64_t c = 0; c < v->width; c++)
            buf[c] = mp_read_i64(v->t->dtype, v->t->data, r * v->rstride + c * v->cstride);
    }
    return buf;
}

/* The smallest of p[0..n), n >= 1: branch-free, one vectorized pass (a 64-bit integer minimum needs
 * AVX2 or AVX-512: MP_CLONES). */
MP_CLONES static int64_t min_of(const int64_t *p, int64_t n) {
    int64_t mn = p[0];
    for (int64_t c = 1; c < n; c++) mn = p[c] < mn ? p[c] : mn;
    return mn;
}

/* Length of the non-padding prefix of a row: a trailing run of two or more zeros is padding. A single
 * trailing zero stays a (length-1) sequence: it is what a one-token document looks like. */
static int64_t real_width(const int64_t *p, int64_t width) {
    int64_t e = width;
    while (e > 0 && p[e - 1] == 0) e--;
    return width - e >= 2 ? e : width;
}

/* Whether column c (>= 1) starts a sequence: RESET at the row's minimum, STEP at any step other
 * than +1 (x >= 0 was checked, so x - 1 cannot overflow where prev + 1 could). */
static inline int starts_at(const int64_t *p, int64_t c, maskpack_boundary_rule rule, int64_t mn) {
    return rule == MASKPACK_BOUNDARY_RESET ? p[c] == mn : p[c] - 1 != p[c - 1];
}

/* Appends the sequences of a row of E real tokens (E >= 1) to *segs (n used of *cap, grown by
 * doubling): one pass, since boundaries are few and the branch is predicted. Column 0 always starts a
 * sequence: the first token of a row belongs to something even when its id is not the minimum
 * (RESET) or the row starts mid-count. Returns 0, or -1 when out of memory. */
static int row_sequences(const int64_t *p, int64_t E, int64_t r, maskpack_boundary_rule rule, int64_t mn,
                         maskpack_segment **segs, size_t *n, size_t *cap) {
    int64_t start = 0;
    for (int64_t c = 1; c <= E; c++) {
        if (c < E && !starts_at(p, c, rule, mn)) continue;
        if (*n == *cap) { /* *cap <= numel, so doubling it stays far below SIZE_MAX / sizeof */
            size_t grown = *cap ? 2 * *cap : 64;
            maskpack_segment *g = mp_realloc_array(*segs, grown, sizeof **segs);
            if (!g) return -1;
            *segs = g;
            *cap = grown;
        }
        (*segs)[(*n)++] = self_seg(r, start, c - start);
        start = c;
    }
    return 0;
}

/* The first negative id of row p (which has one), as an error naming its index. */
static maskpack_status negative_id(const maskpack_tensor *t, const int64_t *p, int64_t width, int64_t r,
                                   maskpack_error *err) {
    const char *name = "position_ids";
    int64_t c = 0;
    while (c < width && p[c] >= 0) c++;
    int64_t x = p[c];
    if (t->ndim == 1)
        return mp_fail(err, MASKPACK_ERR_VALUE, name, c, -1, "%s[%lld]: expected >= 0, found %lld", name, (long long)c,
                       (long long)x);
    if (t->ndim == 2)
        return mp_fail(err, MASKPACK_ERR_VALUE, name, r, c, "%s[%lld, %lld]: expected >= 0, found %lld", name,
                       (long long)r, (long long)c, (long long)x);
    const int64_t idx[4] = {0, r, c, -1};
    return mp_fail4(err, MASKPACK_ERR_VALUE, name, idx, "%s[0, %lld, %lld]: expected >= 0, found %lld", name,
                    (long long)r, (long long)c, (long long)x);
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

    pos_view v = {t, 1, t->shape[0], 0, t->strides[0]};
    if (t->ndim == 2) v = (pos_view){t, t->shape[0], t->shape[1], t->strides[0], t->strides[1]};
    /* M-RoPE: the temporal/height/width rows 1 and 2 of image tokens do not count up per token; the
     * text row (index 0) is the one that describes the documents (HF's 3x-too-long cu_seqlens bug) */
    if (t->ndim == 3) v = (pos_view){t, t->shape[1], t->shape[2], t->strides[1], t->strides[2]};
    /* nothing to read: no loop over the rows of a [2^50, 0] or [3, 2^50, 0] tensor */
    if (v.n_rows == 0 || v.width == 0) return mp_layout_empty(v.n_rows, v.width, t->ndim == 1, rule, out, err);

    /* one row of int64 scratch (rows of contiguous int64 ids are read in place) */
    int64_t *buf = NULL;
    if (!(t->dtype == MASKPACK_I64 && v.cstride == 1) && !(buf = mp_alloc_array((size_t)v.width, sizeof *buf)))
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, name, -1, -1, "out of memory");
    /* per row: the minimum of every id (any negative one is an error), then one pass writing the
     * sequences */
    maskpack_segment *segs = NULL;
    size_t n = 0, cap = 0;
    for (int64_t r = 0; r < v.n_rows; r++) {
        const int64_t *p = load_row(&v, r, buf);
        int64_t mn = min_of(p, v.width);
        if (mn < 0) {
            s = negative_id(t, p, v.width, r, err);
            free(buf);
            free(segs);
            return s;
        }
        int64_t E = real_width(p, v.width);
        if (!E) continue;
        /* the minimum of the real tokens only: the tail pad is 0 and would hide a row that counts from
         * padding_idx + 1 (RoBERTa-like) */
        if (E < v.width && boundary == MASKPACK_BOUNDARY_RESET) mn = min_of(p, E);
        if (row_sequences(p, E, r, boundary, mn, &segs, &n, &cap)) {
            free(buf);
            free(segs);
            return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, name, -1, -1, "out of memory");
        }
    }
    free(buf);
    int packed = t->ndim == 1;
    return mp_layout_build(segs, n, v.n_rows, v.width, v.width, packed, rule, out, err);
}
