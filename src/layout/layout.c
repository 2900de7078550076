/* layout.c: the layout object: validation of segments and rule, accessors and the reference
 * predicate every derived output is tested against. */
#include "internal.h"

#define MP_POS_MAX ((int64_t)1 << 62) /* positions stay far from overflow in q_pos - kv_pos + i */

#include <stdlib.h>
#include <string.h>

maskpack_rule maskpack_rule_default(void) {
    maskpack_rule r;
    memset(&r, 0, sizeof r);
    r.causal = 1;
    r.alignment = MASKPACK_ALIGN_BOTTOM_RIGHT;
    r.window_left = -1;
    r.window_right = -1;
    return r;
}

maskpack_status maskpack_window_from_hf(int64_t w, int64_t *left, int64_t *right, maskpack_error *err) {
    MP_CHECK_NULL(err, left, "left");
    MP_CHECK_NULL(err, right, "right");
    if (w < 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "sliding_window", -1, -1,
                       "sliding_window: expected >= 1 (keys j > i - w, w keys including self), found %lld",
                       (long long)w);
    *left = w - 1;
    *right = w - 1;
    return mp_ok(err);
}

maskpack_status maskpack_window_from_gym(int64_t w, int64_t *left, int64_t *right, maskpack_error *err) {
    MP_CHECK_NULL(err, left, "left");
    MP_CHECK_NULL(err, right, "right");
    if (w < 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "window", -1, -1,
                       "window: expected >= 0 (i - j <= w), found %lld", (long long)w);
    *left = w;
    *right = w;
    return mp_ok(err);
}

void maskpack_layout_free(maskpack_layout *L) {
    if (!L) return;
    free(L->segs);
    free(L->row_begin);
    free(L->spans);
    free(L->span_begin);
    free(L->prefix);
    free(L);
}

static maskpack_status validate_segments(const maskpack_segment *s, size_t n, int64_t n_rows, int64_t q_width,
                                         int64_t kv_width, int packed, maskpack_error *err) {
    if (n_rows < 0 || q_width < 0 || kv_width < 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "grid", -1, -1,
                       "grid: expected n_rows, q_width, kv_width >= 0, found %lld, %lld, %lld", (long long)n_rows,
                       (long long)q_width, (long long)kv_width);
    int64_t cells;
    if (mp_mul_overflow(n_rows, q_width > kv_width ? q_width : kv_width, &cells))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "grid", -1, -1, "grid: n_rows * width overflows int64");
    if (packed && n_rows != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "packed", -1, -1,
                       "packed: a packed layout has exactly 1 row, found %lld", (long long)n_rows);
    for (size_t k = 0; k < n; k++) {
        const maskpack_segment *g = &s[k];
        int64_t qe, ke;
        if (g->row < 0 || g->row >= n_rows)
            return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                           "segments[%zu].row: expected in [0, %lld), found %lld", k, (long long)n_rows,
                           (long long)g->row);
        if (g->q_start < 0 || g->q_len < 0 || mp_add_overflow(g->q_start, g->q_len, &qe) || qe > q_width)
            return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                           "segments[%zu]: query columns [%lld, %lld + %lld) must lie in [0, %lld)", k,
                           (long long)g->q_start, (long long)g->q_start, (long long)g->q_len, (long long)q_width);
        if (g->kv_start < 0 || g->kv_len < 0 || mp_add_overflow(g->kv_start, g->kv_len, &ke) || ke > kv_width)
            return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                           "segments[%zu]: key columns [%lld, %lld + %lld) must lie in [0, %lld)", k,
                           (long long)g->kv_start, (long long)g->kv_start, (long long)g->kv_len, (long long)kv_width);
        if ((g->flags & ~(MASKPACK_SEGMENT_EXPLICIT_POS | MASKPACK_SEGMENT_KEY_BLOCK)) ||
            g->flags == MASKPACK_SEGMENT_KEY_BLOCK)
            return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                           "segments[%zu].flags: expected 0 or MASKPACK_SEGMENT_EXPLICIT_POS (optionally with "
                           "MASKPACK_SEGMENT_KEY_BLOCK), found %u",
                           k, (unsigned)g->flags);
        if (g->flags & MASKPACK_SEGMENT_KEY_BLOCK) {
            /* a block of another chunk's keys: both positions are real sequence positions */
            if (g->kv_pos < 0 || g->kv_pos > MP_POS_MAX || g->q_pos < 0 || g->q_pos > MP_POS_MAX)
                return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                               "segments[%zu]: a key block needs 0 <= q_pos, kv_pos <= 2^62, found q_pos %lld, "
                               "kv_pos %lld",
                               k, (long long)g->q_pos, (long long)g->kv_pos);
        } else if (g->kv_pos != 0) {
            return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                           "segments[%zu].kv_pos: expected 0 without MASKPACK_SEGMENT_KEY_BLOCK, found %lld", k,
                           (long long)g->kv_pos);
        } else if ((g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) &&
                   (g->q_pos < 0 || g->q_pos > g->kv_len || g->q_len > g->kv_len - g->q_pos)) {
            return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                           "segments[%zu].q_pos: expected 0 <= q_pos and q_pos + q_len <= kv_len (%lld), found "
                           "q_pos %lld with q_len %lld",
                           k, (long long)g->kv_len, (long long)g->q_pos, (long long)g->q_len);
        }
        if ((g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) && g->origin < 0)
            return mp_fail(err, MASKPACK_ERR_VALUE, "segments", (int64_t)k, -1,
                           "segments[%zu].origin: expected >= 0 (index of the unsharded sequence), found %lld", k,
                           (long long)g->origin);
        if (k > 0) {
            const maskpack_segment *p = &s[k - 1];
            /* chunks with explicit positions (CP shards) may share their keys; others may not */
            int shared_keys_ok = ((p->flags | g->flags) & MASKPACK_SEGMENT_EXPLICIT_POS) != 0;
            if (p->row > g->row)
                return mp_fail(err, MASKPACK_ERR_UNSORTED, "segments", (int64_t)k, -1,
                               "segments[%zu].row: expected >= %lld (sorted by row), found %lld", k, (long long)p->row,
                               (long long)g->row);
            if (p->row == g->row) {
                if (p->q_start + p->q_len > g->q_start)
                    return mp_fail(err, MASKPACK_ERR_UNSORTED, "segments", (int64_t)k, -1,
                                   "segments[%zu].q_start: expected >= %lld (end of segment %zu), found %lld", k,
                                   (long long)(p->q_start + p->q_len), k - 1, (long long)g->q_start);
                if (!shared_keys_ok && p->kv_start + p->kv_len > g->kv_start)
                    return mp_fail(err, MASKPACK_ERR_UNSORTED, "segments", (int64_t)k, -1,
                                   "segments[%zu].kv_start: expected >= %lld (end of segment %zu), found %lld", k,
                                   (long long)(p->kv_start + p->kv_len), k - 1, (long long)g->kv_start);
            }
        }
    }
    return MASKPACK_OK;
}

static maskpack_status copy_rule(maskpack_layout *L, const maskpack_rule *r, maskpack_error *err) {
    if (r->causal != 0 && r->causal != 1)
        return mp_fail(err, MASKPACK_ERR_RULE, "rule.causal", -1, -1, "rule.causal: expected 0 or 1, found %d",
                       r->causal);
    if (r->alignment != MASKPACK_ALIGN_TOP_LEFT && r->alignment != MASKPACK_ALIGN_BOTTOM_RIGHT &&
        r->alignment != MASKPACK_ALIGN_UNSTATED)
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "rule.alignment", -1, -1,
                       "rule.alignment: expected TOP_LEFT (0) or BOTTOM_RIGHT (1) (or UNSTATED (2)), found %d",
                       (int)r->alignment);
    if (r->window_left < -1 || r->window_right < -1)
        return mp_fail(err, MASKPACK_ERR_RULE, "rule.window", -1, -1,
                       "rule.window: expected (left, right) >= -1 (-1 = unbounded), found (%lld, %lld)",
                       (long long)r->window_left, (long long)r->window_right);
    if (r->n_spans > 0 && r->spans == NULL)
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "rule.spans", -1, -1,
                       "rule.spans: %zu spans declared but the pointer is NULL", r->n_spans);
    if (r->prefix != NULL && r->n_prefix != L->n_segments)
        return mp_fail(err, MASKPACK_ERR_RULE, "rule.prefix", -1, -1,
                       "rule.prefix: expected one entry per segment (%zu), found %zu", L->n_segments, r->n_prefix);
    if (r->prefix == NULL && r->n_prefix != 0)
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "rule.prefix", -1, -1,
                       "rule.prefix: %zu entries declared but the pointer is NULL", r->n_prefix);
    for (size_t t = 0; t < r->n_spans; t++) {
        const maskpack_span *sp = &r->spans[t];
        if (sp->segment < 0 || (size_t)sp->segment >= L->n_segments)
            return mp_fail(err, MASKPACK_ERR_RULE, "rule.spans", (int64_t)t, -1,
                           "rule.spans[%zu].segment: expected in [0, %zu), found %lld", t, L->n_segments,
                           (long long)sp->segment);
        const maskpack_segment *g = &L->segs[sp->segment];
        int explicit_pos = (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) != 0;
        if (!explicit_pos && g->q_len != g->kv_len)
            return mp_fail(err, MASKPACK_ERR_RULE, "rule.spans", (int64_t)t, -1,
                           "rule.spans[%zu]: spans need a self-attention segment, segment %lld has q_len %lld != "
                           "kv_len %lld",
                           t, (long long)sp->segment, (long long)g->q_len, (long long)g->kv_len);
        if (g->kv_pos != 0)
            return mp_fail(err, MASKPACK_ERR_RULE, "rule.spans", (int64_t)t, -1,
                           "rule.spans[%zu]: segment %lld holds a key block at kv_pos %lld; spans need the keys from "
                           "the sequence start (kv_pos 0)",
                           t, (long long)sp->segment, (long long)g->kv_pos);
        if (sp->start < 0 || sp->end <= sp->start || sp->end > g->kv_len)
            return mp_fail(err, MASKPACK_ERR_RULE, "rule.spans", (int64_t)t, -1,
                           "rule.spans[%zu]: expected 0 <= start < end <= %lld (segment length), found [%lld, %lld)", t,
                           (long long)g->kv_len, (long long)sp->start, (long long)sp->end);
        if (t > 0) {
            const maskpack_span *p = &r->spans[t - 1];
            if (p->segment > sp->segment || (p->segment == sp->segment && p->end > sp->start))
                return mp_fail(err, MASKPACK_ERR_RULE, "rule.spans", (int64_t)t, -1,
                               "rule.spans[%zu]: expected sorted by (segment, start) and non-overlapping, found "
                               "(%lld, [%lld, %lld)) after (%lld, [%lld, %lld))",
                               t, (long long)sp->segment, (long long)sp->start, (long long)sp->end,
                               (long long)p->segment, (long long)p->start, (long long)p->end);
        }
    }
    if (r->prefix)
        for (size_t k = 0; k < L->n_segments; k++) {
            if (r->prefix[k] != 0 && L->segs[k].kv_pos != 0)
                return mp_fail(err, MASKPACK_ERR_RULE, "rule.prefix", (int64_t)k, -1,
                               "rule.prefix[%zu]: segment %zu holds a key block at kv_pos %lld; a prefix needs the "
                               "keys from the sequence start (kv_pos 0)",
                               k, k, (long long)L->segs[k].kv_pos);
            else if (r->prefix[k] < 0 || r->prefix[k] > L->segs[k].kv_len)
                return mp_fail(err, MASKPACK_ERR_RULE, "rule.prefix", (int64_t)k, -1,
                               "rule.prefix[%zu]: expected in [0, %lld] (segment key length), found %lld", k,
                               (long long)L->segs[k].kv_len, (long long)r->prefix[k]);
        }

    /* docs/conventions.md section 3: where q_len != kv_len the causal alignment must be stated,
     * never assumed; the predicate depends on it only under a causal rule or a window. Judged after
     * the rule's own fields, so a malformed window or prefix is named first whatever the alignment. */
    if (r->alignment == MASKPACK_ALIGN_UNSTATED && (r->causal || r->window_left >= 0 || r->window_right >= 0))
        for (size_t k = 0; k < L->n_segments; k++) {
            const maskpack_segment *g = &L->segs[k];
            if (!(g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) && g->q_len != g->kv_len)
                return mp_fail(err, MASKPACK_ERR_CONVENTION, "rule.alignment", (int64_t)k, -1,
                               "rule.alignment: segment %zu has q_len %lld != kv_len %lld; state BOTTOM_RIGHT "
                               "(flash-attn >= 2.1, NPU mode 3) or TOP_LEFT (torch SDPA is_causal, NPU mode 2)",
                               k, (long long)g->q_len, (long long)g->kv_len);
        }

    L->causal = r->causal;
    L->alignment = r->alignment == MASKPACK_ALIGN_UNSTATED ? MASKPACK_ALIGN_BOTTOM_RIGHT : r->alignment;
    L->window_left = r->window_left;
    L->window_right = r->window_right;
    L->span_begin = calloc(L->n_segments + 1, sizeof *L->span_begin);
    if (!L->span_begin) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "rule", -1, -1, "out of memory");
    if (r->n_spans) {
        L->spans = mp_alloc_array(r->n_spans, sizeof *L->spans);
        if (!L->spans) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "rule", -1, -1, "out of memory");
        memcpy(L->spans, r->spans, r->n_spans * sizeof *L->spans);
        L->n_spans = r->n_spans;
    }
    for (size_t t = 0; t < L->n_spans; t++) L->span_begin[L->spans[t].segment + 1]++;
    for (size_t k = 0; k < L->n_segments; k++) L->span_begin[k + 1] += L->span_begin[k];
    if (r->prefix) {
        int any = 0;
        for (size_t k = 0; k < L->n_segments; k++) any |= r->prefix[k] != 0;
        if (any) { /* an all-zero prefix is no prefix: keep one canonical form */
            L->prefix = mp_alloc_array(L->n_segments, sizeof *L->prefix);
            if (!L->prefix) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "rule", -1, -1, "out of memory");
            memcpy(L->prefix, r->prefix, L->n_segments * sizeof *L->prefix);
        }
    }
    return MASKPACK_OK;
}

maskpack_status mp_layout_build(maskpack_segment *segs, size_t n, int64_t n_rows, int64_t q_width, int64_t kv_width,
                                int packed, const maskpack_rule *rule, maskpack_layout **out, maskpack_error *err) {
    maskpack_rule def = maskpack_rule_default();
    if (!rule) rule = &def;
    if (!out) {
        free(segs);
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "out", -1, -1, "out: expected a non-NULL pointer, found NULL");
    }
    maskpack_status s = validate_segments(segs, n, n_rows, q_width, kv_width, packed, err);
    if (s) {
        free(segs);
        return s;
    }
    maskpack_layout *L = calloc(1, sizeof *L);
    if (!L) {
        free(segs);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    }
    L->segs = segs;
    L->n_segments = n;
    L->n_rows = n_rows;
    L->q_width = q_width;
    L->kv_width = kv_width;
    L->packed = packed != 0;
    L->self = 1;
    /* no segments: every row is empty and the index would be all zeros; keeping none makes a layout of
     * many empty rows (a [2^50, 0] mask) cost nothing, and mp_row_begin reads it as zeros */
    L->row_begin = n ? mp_calloc_array((size_t)n_rows + 1, sizeof *L->row_begin) : NULL;
    if (n && !L->row_begin) {
        maskpack_layout_free(L);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    }
    for (size_t k = 0; k < n; k++) {
        const maskpack_segment *g = &segs[k];
        L->row_begin[g->row + 1]++;
        L->n_tokens += g->q_len;
        if (g->q_len > L->max_q) L->max_q = g->q_len;
        if (g->kv_len > L->max_kv) L->max_kv = g->kv_len;
        if (g->q_start != g->kv_start || g->q_len != g->kv_len || (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS))
            L->self = 0;
    }
    if (q_width != kv_width) L->self = 0;
    if (n)
        for (int64_t r = 0; r < n_rows; r++) L->row_begin[r + 1] += L->row_begin[r];
    s = copy_rule(L, rule, err);
    if (s) {
        maskpack_layout_free(L);
        return s;
    }
    *out = L;
    return mp_ok(err);
}

maskpack_status mp_layout_empty(int64_t n_rows, int64_t width, int packed, const maskpack_rule *rule,
                                maskpack_layout **out, maskpack_error *err) {
    maskpack_segment *none = mp_alloc_array(0, sizeof *none);
    if (!none) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    return mp_layout_build(none, 0, n_rows, width, width, packed, rule, out, err);
}

maskpack_status maskpack_layout_from_segments(const maskpack_segment *segments, size_t n, int64_t n_rows,
                                              int64_t q_width, int64_t kv_width, int packed, const maskpack_rule *rule,
                                              maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    if (n > 0) MP_CHECK_NULL(err, segments, "segments");
    maskpack_segment *copy = mp_alloc_array(n, sizeof *copy);
    if (!copy) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "segments", -1, -1, "out of memory");
    if (n) memcpy(copy, segments, n * sizeof *copy);
    return mp_layout_build(copy, n, n_rows, q_width, kv_width, packed, rule, out, err);
}

maskpack_status maskpack_layout_with_rule(const maskpack_layout *L, const maskpack_rule *rule, maskpack_layout **out,
                                          maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    return maskpack_layout_from_segments(L->segs, L->n_segments, L->n_rows, L->q_width, L->kv_width, L->packed, rule,
                                         out, err);
}

maskpack_status maskpack_layout_clone(const maskpack_layout *L, maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    maskpack_rule r = maskpack_layout_rule(L);
    return maskpack_layout_with_rule(L, &r, out, err);
}

int64_t maskpack_layout_n_rows(const maskpack_layout *L) { return L->n_rows; }
int64_t maskpack_layout_q_width(const maskpack_layout *L) { return L->q_width; }
int64_t maskpack_layout_kv_width(const maskpack_layout *L) { return L->kv_width; }
int maskpack_layout_is_packed(const maskpack_layout *L) { return L->packed; }
int maskpack_layout_is_self(const maskpack_layout *L) { return L->self; }
size_t maskpack_layout_n_segments(const maskpack_layout *L) { return L->n_segments; }
int64_t maskpack_layout_n_tokens(const maskpack_layout *L) { return L->n_tokens; }
int64_t maskpack_layout_max_seqlen(const maskpack_layout *L) { return L->max_q; }
int64_t maskpack_layout_max_seqlen_kv(const maskpack_layout *L) { return L->max_kv; }

maskpack_status maskpack_layout_segment(const maskpack_layout *L, size_t i, maskpack_segment *out,
                                        maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    if (i >= L->n_segments)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "i", (int64_t)i, -1,
                       "i: expected a segment index in [0, %zu), found %zu", L->n_segments, i);
    *out = L->segs[i];
    return mp_ok(err);
}

maskpack_rule maskpack_layout_rule(const maskpack_layout *L) {
    maskpack_rule r = maskpack_rule_default();
    r.causal = L->causal;
    r.alignment = L->alignment;
    r.window_left = L->window_left;
    r.window_right = L->window_right;
    r.spans = L->spans;
    r.n_spans = L->n_spans;
    r.prefix = L->prefix;
    r.n_prefix = L->prefix ? L->n_segments : 0;
    return r;
}

void mp_base_key_range(const maskpack_layout *L, size_t k, int64_t i, int64_t *lo, int64_t *hi) {
    const maskpack_segment *g = &L->segs[k];
    int64_t a = 0, b = g->kv_len;      /* [a, b) */
    int64_t c = mp_query_pos(L, k, i); /* the diagonal key */
    if (L->causal && c + 1 < b) b = c + 1;
    if (L->window_left >= 0 && c - L->window_left > a) a = c - L->window_left;
    if (L->window_right >= 0 && c + L->window_right + 1 < b) b = c + L->window_right + 1;
    if (a > g->kv_len) a = g->kv_len; /* a key block wholly before the window (kv_pos != 0) */
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

int mp_allowed_local(const maskpack_layout *L, size_t k, int64_t i, int64_t j) {
    int64_t lo, hi;
    mp_base_key_range(L, k, i, &lo, &hi);
    if (j >= lo && j < hi) return 1;
    if (L->prefix && j < L->prefix[k]) return 1;
    if (L->span_begin[k] == L->span_begin[k + 1]) return 0;
    int64_t p = mp_span_pos(L, k, i);
    for (size_t t = L->span_begin[k]; t < L->span_begin[k + 1]; t++) {
        const maskpack_span *sp = &L->spans[t];
        if (p >= sp->start && p < sp->end) return j >= sp->start && j < sp->end;
    }
    return 0;
}

int64_t maskpack_segment_of_query(const maskpack_layout *L, int64_t b, int64_t i) {
    if (!L || b < 0 || b >= L->n_rows || i < 0 || i >= L->q_width) return -1;
    size_t lo = mp_row_begin(L, b), hi = mp_row_begin(L, b + 1); /* last segment with q_start <= i */
    if (lo == hi) return -1;
    size_t a = lo, z = hi;
    while (z - a > 1) {
        size_t m = a + (z - a) / 2;
        if (L->segs[m].q_start <= i)
            a = m;
        else
            z = m;
    }
    const maskpack_segment *g = &L->segs[a];
    if (g->q_start <= i && i < g->q_start + g->q_len) return (int64_t)a;
    return -1;
}

int maskpack_allowed(const maskpack_layout *L, int64_t b, int64_t h, int64_t i, int64_t j) {
    (void)h;
    int64_t k = maskpack_segment_of_query(L, b, i);
    if (k < 0 || j < 0 || j >= L->kv_width) return 0;
    const maskpack_segment *g = &L->segs[k];
    if (j < g->kv_start || j >= g->kv_start + g->kv_len) return 0;
    return mp_allowed_local(L, (size_t)k, i - g->q_start, j - g->kv_start);
}
