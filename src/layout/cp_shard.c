/* cp_shard.c: context-parallel views of a layout. A rank's shard is itself a layout whose queries are
 * the rank's tokens and whose keys are the whole original grid; each piece of a sequence becomes a
 * segment with an explicit key position, so every derived output of the shard (masks, block masks,
 * position ids, NPU arguments) is the original predicate restricted to the rank's queries. */
#include "cp_internal.h"

#include <stdlib.h>
#include <string.h>

maskpack_status maskpack_cp_multiple(int64_t cp, int64_t tp, maskpack_cp_align align, int64_t *multiple,
                                     maskpack_error *err) {
    MP_CHECK_NULL(err, multiple, "multiple");
    if (cp < 1 || cp > (1 << 20))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "cp", -1, -1, "cp: expected in [1, 2^20], found %lld",
                       (long long)cp);
    if (tp < 1 || tp > (1 << 20))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "tp", -1, -1, "tp: expected in [1, 2^20], found %lld",
                       (long long)tp);
    int64_t m;
    if (align != MASKPACK_CP_ALIGN_VERL && align != MASKPACK_CP_ALIGN_MINIMAL)
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "align", -1, -1,
                       "align: expected MASKPACK_CP_ALIGN_VERL (0) or MASKPACK_CP_ALIGN_MINIMAL (1), found %d",
                       (int)align);
    if (cp == 1) /* no CP: no zigzag halves to make equal; sequence parallelism alone needs tp */
        m = tp;
    else if (align == MASKPACK_CP_ALIGN_VERL)
        m = tp * cp * 2;
    else if (align == MASKPACK_CP_ALIGN_MINIMAL)
        m = cp * (tp % 2 == 0 ? tp : 2 * tp); /* cp * lcm(2, tp) */
    else
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "align", -1, -1,
                       "align: expected MASKPACK_CP_ALIGN_VERL (0) or MASKPACK_CP_ALIGN_MINIMAL (1), found %d",
                       (int)align);
    *multiple = m;
    return mp_ok(err);
}

maskpack_status mp_cp_require_self(const maskpack_layout *L, maskpack_error *err) {
    for (size_t k = 0; k < L->n_segments; k++) {
        const maskpack_segment *g = &L->segs[k];
        if (g->q_start != g->kv_start || g->q_len != g->kv_len || (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) ||
            L->q_width != L->kv_width)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", (int64_t)k, -1,
                           "layout: segment %zu is not a self-attention segment (a shard or a q/k layout); context "
                           "parallelism splits unsharded self-attention layouts",
                           k);
    }
    return MASKPACK_OK;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

maskpack_status maskpack_layout_pad_to_multiple(const maskpack_layout *L, int64_t multiple, maskpack_layout **out,
                                                maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    if (multiple < 1 || multiple > ((int64_t)1 << 40))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "multiple", -1, -1,
                       "multiple: expected in [1, 2^40], found %lld", (long long)multiple);
    maskpack_status s = mp_cp_require_self(L, err);
    if (s) return s;
    maskpack_segment *segs = mp_alloc_array(L->n_segments, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    if (L->n_segments) memcpy(segs, L->segs, L->n_segments * sizeof *segs);
    int64_t width;
    if (L->packed) {
        int64_t pos = 0; /* running start of the new slot */
        if (L->n_segments == 0) pos = round_up(L->q_width, multiple);
        for (size_t k = 0; k < L->n_segments; k++) {
            int64_t a = mp_cp_slot_start(L, k), len = mp_cp_slot_end(L, k) - a;
            segs[k].q_start = segs[k].kv_start = pos + (L->segs[k].q_start - a);
            int64_t grown = round_up(len, multiple);
            if (grown < len || pos > INT64_MAX - grown) {
                free(segs);
                return mp_fail(err, MASKPACK_ERR_OVERFLOW, "multiple", (int64_t)k, -1,
                               "padding slot %zu to a multiple of %lld overflows int64", k, (long long)multiple);
            }
            pos += grown;
        }
        width = pos;
    } else {
        width = round_up(L->q_width, multiple);
        if (width < L->q_width) {
            free(segs);
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, "multiple", -1, -1, "row width overflows int64");
        }
    }
    maskpack_rule r = maskpack_layout_rule(L);
    return mp_layout_build(segs, L->n_segments, L->n_rows, width, width, L->packed, &r, out, err);
}

maskpack_status mp_cp_rank_ranges(const maskpack_layout *L, int64_t cp, int64_t rank, maskpack_cp_scheme *scheme_io,
                                  mp_cp_range **out, size_t *n_out, maskpack_error *err) {
    maskpack_status st = mp_cp_require_self(L, err);
    if (st) return st;
    if (cp == 1 && *scheme_io == MASKPACK_CP_ZIGZAG) *scheme_io = MASKPACK_CP_CONTIGUOUS; /* one rank: the identity */
    const maskpack_cp_scheme scheme = *scheme_io;
    if (cp < 1 || cp > (1 << 20))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "cp", -1, -1, "cp: expected in [1, 2^20], found %lld",
                       (long long)cp);
    if (rank < 0 || rank >= cp)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "rank", -1, -1,
                       "rank: expected in [0, %lld) (cp size), found %lld", (long long)cp, (long long)rank);
    if (scheme != MASKPACK_CP_ZIGZAG && scheme != MASKPACK_CP_CONTIGUOUS)
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "scheme", -1, -1,
                       "scheme: expected MASKPACK_CP_ZIGZAG (0) or MASKPACK_CP_CONTIGUOUS (1), found %d", (int)scheme);
    size_t cap;
    if (L->packed && scheme == MASKPACK_CP_ZIGZAG)
        cap = 2 * (L->n_segments ? L->n_segments : 1);
    else
        cap = (size_t)L->n_rows * 2 + 1;
    mp_cp_range *R = mp_alloc_array(cap, sizeof *R);
    if (!R) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "ranges", -1, -1, "out of memory");
    size_t n = 0;
    if (L->packed && scheme == MASKPACK_CP_ZIGZAG) {
        size_t nslots = L->n_segments ? L->n_segments : 1;
        for (size_t k = 0; k < nslots; k++) {
            int64_t a = L->n_segments ? mp_cp_slot_start(L, k) : 0;
            int64_t len = (L->n_segments ? mp_cp_slot_end(L, k) : L->q_width) - a;
            if (len % (2 * cp)) {
                free(R);
                return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "layout", (int64_t)k, -1,
                               "slot %zu (columns [%lld, %lld)) has length %lld, not divisible by 2*cp = %lld; pad it "
                               "explicitly (maskpack_layout_pad_to_multiple), nothing is truncated",
                               k, (long long)a, (long long)(a + len), (long long)len, (long long)(2 * cp));
            }
            int64_t c = len / (2 * cp);
            R[n++] = (mp_cp_range){0, a + rank * c, c};
            R[n++] = (mp_cp_range){0, a + (2 * cp - 1 - rank) * c, c};
        }
    } else {
        int64_t parts = scheme == MASKPACK_CP_ZIGZAG ? 2 * cp : cp;
        if (L->q_width % parts) {
            free(R);
            return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "layout", -1, -1,
                           "%s width %lld is not divisible by %s = %lld; pad it explicitly "
                           "(maskpack_layout_pad_to_multiple), nothing is truncated",
                           L->packed ? "token stream" : "row", (long long)L->q_width,
                           scheme == MASKPACK_CP_ZIGZAG ? "2*cp" : "cp", (long long)parts);
        }
        int64_t c = L->q_width / parts;
        for (int64_t b = 0; b < L->n_rows; b++) {
            R[n++] = (mp_cp_range){b, rank * c, c};
            if (scheme == MASKPACK_CP_ZIGZAG) R[n++] = (mp_cp_range){b, (2 * cp - 1 - rank) * c, c};
        }
    }
    *out = R;
    *n_out = n;
    return MASKPACK_OK;
}

maskpack_status maskpack_layout_cp_shard(const maskpack_layout *L, int64_t cp, int64_t rank, maskpack_cp_scheme scheme,
                                         maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    mp_cp_range *R;
    size_t n;
    maskpack_status s = mp_cp_rank_ranges(L, cp, rank, &scheme, &R, &n, err);
    if (s) return s;
    /* Each range cuts at most (segments it overlaps) pieces; a piece per (range, segment) pair. */
    size_t cap = n + L->n_segments * 2 + 1;
    maskpack_segment *segs = mp_alloc_array(cap, sizeof *segs);
    size_t *origin = mp_alloc_array(cap, sizeof *origin);
    if (!segs || !origin) {
        free(R);
        free(segs);
        free(origin);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "shard", -1, -1, "out of memory");
    }
    size_t m = 0;
    int64_t local_col = 0, cur_row = -1;
    for (size_t t = 0; t < n; t++) {
        if (R[t].row != cur_row) {
            cur_row = R[t].row;
            local_col = 0;
        }
        int64_t a = R[t].start, e = R[t].start + R[t].len;
        for (size_t k = mp_row_begin(L, cur_row); k < mp_row_begin(L, cur_row + 1); k++) {
            const maskpack_segment *g = &L->segs[k];
            int64_t lo = g->q_start > a ? g->q_start : a;
            int64_t hi = g->q_start + g->q_len < e ? g->q_start + g->q_len : e;
            if (hi <= lo) continue;
            if (m == cap) { /* cannot happen with the bound above; kept as a guard against a logic slip */
                free(R);
                free(segs);
                free(origin);
                return mp_fail(err, MASKPACK_ERR_OVERFLOW, "shard", -1, -1, "internal piece bound exceeded");
            }
            segs[m] = (maskpack_segment){cur_row,
                                         local_col + (lo - a),
                                         hi - lo,
                                         g->kv_start,
                                         g->kv_len,
                                         MASKPACK_SEGMENT_EXPLICIT_POS,
                                         mp_query_pos(L, k, lo - g->q_start),
                                         (int64_t)k};
            origin[m++] = k;
        }
        local_col += R[t].len;
    }
    free(R);
    /* carry the rule over: spans and prefixes follow their original segment into each piece */
    maskpack_rule r = maskpack_layout_rule(L);
    maskpack_span *spans = NULL;
    int64_t *prefix = NULL;
    size_t n_spans = 0;
    for (size_t p = 0; p < m; p++) n_spans += L->span_begin[origin[p] + 1] - L->span_begin[origin[p]];
    if (n_spans) spans = mp_alloc_array(n_spans, sizeof *spans);
    if (L->prefix) prefix = mp_alloc_array(m, sizeof *prefix);
    if ((n_spans && !spans) || (L->prefix && !prefix)) {
        free(segs);
        free(origin);
        free(spans);
        free(prefix);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "shard", -1, -1, "out of memory");
    }
    size_t q = 0;
    for (size_t p = 0; p < m; p++) {
        for (size_t t = L->span_begin[origin[p]]; t < L->span_begin[origin[p] + 1]; t++)
            spans[q++] = (maskpack_span){(int64_t)p, L->spans[t].start, L->spans[t].end};
        if (prefix) prefix[p] = L->prefix[origin[p]];
    }
    free(origin);
    r.spans = spans;
    r.n_spans = n_spans;
    r.prefix = prefix;
    r.n_prefix = prefix ? m : 0;
    s = mp_layout_build(segs, m, L->n_rows, L->q_width / cp, L->kv_width, L->packed, &r, out, err);
    free(spans);
    free(prefix);
    return s;
}
