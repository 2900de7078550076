/* magi.c: MagiAttention slices (q_range, k_range, type) derived from a layout.
 *
 * A slice covers the pairs of a q range x k range: FULL covers all of them, CAUSAL (bottom-right
 * aligned) covers query t (0-based in the slice) x key u iff u <= t + kn - qn. Every slice we emit
 * is either FULL or CAUSAL with qn <= kn, so each of its query rows sees at least one key and the
 * meaning does not depend on how a consumer treats rows that see nothing.
 *
 * Decomposition of one segment (m queries, n keys, local row i, local key j, prefix p, 0 if none;
 * d = the diagonal key of row 0: n - m for BOTTOM_RIGHT, 0 for TOP_LEFT, q_pos for a segment with an
 * explicit position). Without spans, row i sees keys [0, clamp(max(p, i + d + 1), 0, n)), and the
 * rows split into three consecutive groups:
 *   rows [0, ia)   with ia = max(0, p - d):    i + d < p, they see the prefix [0, p)      -> FULL
 *   rows [ia, ib)  with ib = min(m, n - d):    they see [0, i + d]                        -> CAUSAL
 *                  over keys [0, ib + d) (bottom-right: query t = i - ia sees u <= i + d)
 *   rows [ib, m):                              i + d >= n, they see every key             -> FULL
 * A bidirectional segment is one FULL slice. Spans are in key coordinates: row i is in span [s, e)
 * when its span position (i, or q_pos + i) is; such a row sees [0, max(e, p)) (its causal part
 * [0, i + d] reaches into the span, so the two touch) -> one FULL slice per span; the rows between
 * spans are split as above. Windows cannot be written with these slice types: NOT_REPRESENTABLE.
 * The groups are disjoint row ranges, so no pair is covered twice (segments sharing keys have
 * disjoint queries). */
#include "internal.h"

typedef struct slice_sink {
    int32_t *q, *k, *t;
    size_t capacity, count;
} slice_sink;

/* Records one slice of segment-local rows [r0, r1) x keys [c0, c1); empty ones are dropped. With a
 * NULL sink array only the count grows (the sizing pass). */
static void add(slice_sink *s, int64_t qbase, int64_t kbase, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int type) {
    if (r1 <= r0 || c1 <= c0) return;
    if (s->q && s->count < s->capacity) {
        size_t n = s->count;
        s->q[2 * n] = (int32_t)(qbase + r0);
        s->q[2 * n + 1] = (int32_t)(qbase + r1);
        s->k[2 * n] = (int32_t)(kbase + c0);
        s->k[2 * n + 1] = (int32_t)(kbase + c1);
        s->t[n] = type;
    }
    s->count++;
}

/* The causal (+ prefix) rows [r0, r1) of a segment with m queries, n keys, offset d, prefix p. */
static void causal_rows(slice_sink *s, int64_t qb, int64_t kb, int64_t r0, int64_t r1, int64_t m, int64_t n, int64_t d,
                        int64_t p) {
    int64_t ia = p - d > 0 ? p - d : 0, ib = n - d < m ? n - d : m;
    if (ia > r1) ia = r1;
    if (ia < r0) ia = r0;
    if (ib > r1) ib = r1;
    if (ib < ia) ib = ia;
    add(s, qb, kb, r0, ia, 0, p, MASKPACK_MAGI_FULL);
    add(s, qb, kb, ia, ib, 0, ib + d, MASKPACK_MAGI_CAUSAL);
    add(s, qb, kb, ib, r1, 0, n, MASKPACK_MAGI_FULL);
}

static void segment_slices(const maskpack_layout *L, size_t k, slice_sink *s) {
    const maskpack_segment *g = &L->segs[k];
    int64_t m = g->q_len, n = g->kv_len;
    if (m == 0 || n == 0) return;
    int64_t qb = g->row * L->q_width + g->q_start, kb = g->row * L->kv_width + g->kv_start;
    if (!L->causal) {
        add(s, qb, kb, 0, m, 0, n, MASKPACK_MAGI_FULL);
        return;
    }
    int64_t d = mp_query_pos(L, k, 0), ds = mp_span_pos(L, k, 0);
    int64_t p = L->prefix ? L->prefix[k] : 0;
    int64_t row = 0;
    for (size_t t = L->span_begin[k]; t < L->span_begin[k + 1]; t++) {
        const maskpack_span *sp = &L->spans[t];
        /* the span's rows: those whose span position lies in [start, end) */
        int64_t rs = sp->start - ds, re = sp->end - ds;
        if (rs < 0) rs = 0;
        if (re > m) re = m;
        if (re <= rs) continue;
        causal_rows(s, qb, kb, row, rs, m, n, d, p);
        add(s, qb, kb, rs, re, 0, sp->end > p ? sp->end : p, MASKPACK_MAGI_FULL);
        row = re;
    }
    causal_rows(s, qb, kb, row, m, m, n, d, p);
}

maskpack_status maskpack_magi_slices(const maskpack_layout *L, int32_t *q_ranges, int32_t *k_ranges, int32_t *types,
                                     size_t capacity, size_t *count, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, count, "count");
    if (capacity > 0) {
        MP_CHECK_NULL(err, q_ranges, "q_ranges");
        MP_CHECK_NULL(err, k_ranges, "k_ranges");
        MP_CHECK_NULL(err, types, "types");
    }
    /* a right window is inert under causality; any other window is a band these types cannot express */
    if (L->window_left >= 0 || (!L->causal && L->window_right >= 0))
        return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "layout", -1, -1,
                       "layout: a sliding window (left %lld, right %lld) has no exact MagiAttention slice form here; "
                       "only FULL and CAUSAL slices are emitted",
                       (long long)L->window_left, (long long)L->window_right);
    /* flattened ranges are int32: every end must fit */
    for (size_t k = 0; k < L->n_segments; k++) {
        const maskpack_segment *g = &L->segs[k];
        if (g->q_len == 0 || g->kv_len == 0) continue;
        int64_t qe = g->row * L->q_width + g->q_start + g->q_len, ke = g->row * L->kv_width + g->kv_start + g->kv_len;
        if (qe > INT32_MAX || ke > INT32_MAX)
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, "layout", (int64_t)k, -1,
                           "segments[%zu]: flattened range end %lld does not fit int32 (max %d)", k,
                           (long long)(qe > INT32_MAX ? qe : ke), INT32_MAX);
    }
    slice_sink sizing = {NULL, NULL, NULL, 0, 0};
    for (size_t k = 0; k < L->n_segments; k++) segment_slices(L, k, &sizing);
    *count = sizing.count;
    if (capacity < sizing.count)
        return mp_fail(err, MASKPACK_ERR_BUFFER_TOO_SMALL, "capacity", -1, -1,
                       "capacity: expected >= %zu slices, found %zu", sizing.count, capacity);
    slice_sink out = {q_ranges, k_ranges, types, capacity, 0};
    for (size_t k = 0; k < L->n_segments; k++) segment_slices(L, k, &out);
    return mp_ok(err);
}
