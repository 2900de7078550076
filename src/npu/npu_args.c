/* npu_args.c: the arguments of Ascend's npu_fusion_attention for a layout (docs/conventions.md section 6):
 * which sparse_mode, which atten_mask (none, the compressed 2048x2048 / 3072x2048 masks that never
 * depend on S, or a full M-mask), pre/next tokens, the explicit scale, and in TND the NPU-form
 * actual_seq lists with declared pad items.
 *
 * Decisions (documented here once, tested in tests/c/test_npu.c):
 *   - The scale is always emitted: the operator defaults to 1.0, not 1/sqrt(D).
 *   - Each segment's causal diagonal sits at an offset from the bottom-right one (0 under
 *     BOTTOM_RIGHT, -(kv_len - q_len) under TOP_LEFT, q_pos - (kv_len - q_len) for shard pieces).
 *     Plain causal maps to sparse_mode 3 when every offset is 0 (also when q_len == kv_len
 *     everywhere, where the alignments agree: equivalent layouts give identical args), else to 2
 *     when every diagonal is top-left, else to band mode 4 when the offsets are equal, else (TND) to
 *     the outer-split modes 7/8 when one odd item sits last/first (a sequence split across cards).
 *   - Windows map to band mode 4 (origin bottom-right, pre/next shifted by the common offset);
 *     differing offsets have no band equivalent (TND: NOT_REPRESENTABLE; B*S: full mask).
 *   - Prefix-LM maps to mode 6 (bottom-right causal or j < prefix) when every offset is 0.
 *   - B*S layouts whose rows are not one whole-row segment each (padding, several documents,
 *     shard pieces) get sparse_mode 1 with a full [B,1,S,Skv] mask; so do spans.
 *   - Pad items (TND filler) and pad rows (B*S padding) compute garbage that nobody reads; they never
 *     see real tokens or are seen by them. fully_masked_rows counts rows of real tokens and
 *     fully_masked_pad_rows the rest: the pad rows of a mode-1 full mask (B*S - n_tokens of them)
 *     and the empty rows of pad items; either makes inner_precise = 2. */
#include "npu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared semantics ------------------------------------------------------------------------ */

static int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (mp_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static int64_t sat_sub(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r)) return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

int64_t mp_npu_band_item(int32_t mode, const int64_t *sq, const int64_t *skv, int64_t n) {
    if (mode == 7) {
        for (int64_t k = n - 1; k >= 0; k--)
            if (sq[k] > 0 && skv[k] > 0) return k;
    } else if (mode == 8) {
        for (int64_t k = 0; k < n; k++)
            if (sq[k] > 0 && skv[k] > 0) return k;
    }
    return -1;
}

void mp_npu_key_range(int32_t mode, int64_t pre, int64_t next, int64_t sq, int64_t skv, int64_t prefix, int band,
                      int64_t i, int64_t *lo, int64_t *hi) {
    int64_t a = 0, b = skv;
    int64_t d = sat_sub(skv, sq);
    int64_t c = sat_add(i, d); /* the bottom-right diagonal key of row i */
    if ((mode == 7 || mode == 8) && band) mode = 4;
    switch (mode) {
    case 0: { /* top-left origin: the doc leaves the origin for Sq != Skv open (section 6) */
        int64_t x = sat_sub(i, pre), y = sat_add(sat_add(i, next), 1);
        if (x > a) a = x;
        if (y < b) b = y;
        break;
    }
    case 2:
    case 8:
        if (i + 1 < b) b = i + 1;
        break;
    case 3:
    case 7: {
        int64_t y = sat_add(c, 1);
        if (y < b) b = y;
        break;
    }
    case 4: {
        int64_t x = sat_sub(c, pre), y = sat_add(sat_add(c, next), 1);
        if (x > a) a = x;
        if (y < b) b = y;
        break;
    }
    case 6: {
        int64_t y = sat_add(c, 1);
        if (prefix > y) y = prefix;
        if (y < b) b = y;
        break;
    }
    default: /* 1, 5: the full mask decides */ break;
    }
    if (a > skv) a = skv;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

void mp_npu_items_free(mp_npu_items *it) {
    if (!it) return;
    free(it->q_len);
    free(it->kv_len);
    free(it->segment);
    memset(it, 0, sizeof *it);
}

maskpack_status mp_npu_tnd_items(const maskpack_layout *L, mp_npu_items *out, maskpack_error *err) {
    mp_npu_items it;
    memset(&it, 0, sizeof it);
    size_t cap = 2 * L->n_segments + 1; /* a gap before every segment and one after the last */
    it.q_len = mp_alloc_array(cap, sizeof *it.q_len);
    it.kv_len = mp_alloc_array(cap, sizeof *it.kv_len);
    it.segment = mp_alloc_array(cap, sizeof *it.segment);
    if (!it.q_len || !it.kv_len || !it.segment) {
        mp_npu_items_free(&it);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
    }
    int64_t cq = 0, ck = 0;
    for (size_t k = 0; k <= L->n_segments; k++) {
        int64_t qs = k < L->n_segments ? L->segs[k].q_start : L->q_width;
        int64_t ks = k < L->n_segments ? L->segs[k].kv_start : L->kv_width;
        if (qs > cq || ks > ck) { /* filler on either side: one coalesced pad item */
            it.q_len[it.n] = qs - cq;
            it.kv_len[it.n] = ks - ck;
            it.segment[it.n] = -1;
            it.n++;
        }
        if (k == L->n_segments) break;
        const maskpack_segment *g = &L->segs[k];
        if (ks < ck) { /* shard pieces may share keys; TND items own consecutive disjoint key ranges */
            mp_npu_items_free(&it);
            return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "layout", (int64_t)k, -1,
                           "layout: segment %zu's keys start at %lld, before the end %lld of the previous "
                           "segment's keys (pieces of one sequence sharing keys, e.g. a zigzag CP shard): TND "
                           "items need disjoint consecutive key ranges; use a B*S layout (full mask)",
                           k, (long long)ks, (long long)ck);
        }
        it.q_len[it.n] = g->q_len;
        it.kv_len[it.n] = g->kv_len;
        it.segment[it.n] = (int64_t)k;
        it.n++;
        cq = g->q_start + g->q_len;
        ck = g->kv_start + g->kv_len;
    }
    *out = it;
    return MASKPACK_OK;
}

/* ---- the emitter ----------------------------------------------------------------------------- */

/* Offset of segment k's causal diagonal from the bottom-right one: the diagonal key of query i is
 * i + (kv_len - q_len) + offset. 0 under BOTTOM_RIGHT, -(kv_len - q_len) under TOP_LEFT, and
 * q_pos - (kv_len - q_len) for explicit-position segments (CP shard pieces). */
static int64_t seg_offset(const maskpack_layout *L, size_t k) {
    const maskpack_segment *g = &L->segs[k];
    return mp_query_pos(L, k, 0) - (g->kv_len - g->q_len);
}

/* Segments whose offset matters: both sides non-empty (other segments compute nothing). */
static int effective(const maskpack_segment *g) { return g->q_len > 0 && g->kv_len > 0; }

static int64_t clamp_inf(int64_t v) { return v > MP_NPU_INF ? MP_NPU_INF : v; }

/* What the layout's rule needs, after dropping parts that change nothing. */
typedef struct rule_class {
    int bidir_all; /* bidirectional without window: every pair of a segment, spans/prefix add nothing */
    int spans;     /* a span of two or more tokens (a one-token span only adds the diagonal, always kept) */
    int prefix;
    int window;  /* a bound that the causal rule does not already imply */
    int all_br;  /* every effective segment has the bottom-right diagonal (mode 3's) */
    int all_tl;  /* every effective segment has the top-left diagonal (mode 2's) */
    int uniform; /* every effective segment has the same offset `o`: one band (mode 4) fits all */
    int64_t o;
} rule_class;

static rule_class classify(const maskpack_layout *L) {
    rule_class rc;
    memset(&rc, 0, sizeof rc);
    rc.bidir_all = !L->causal && L->window_left < 0 && L->window_right < 0;
    for (size_t t = 0; t < L->n_spans; t++)
        if (L->spans[t].end - L->spans[t].start >= 2) rc.spans = 1;
    rc.prefix = L->prefix != NULL;
    rc.window = L->window_left >= 0 || (!L->causal && L->window_right >= 0);
    rc.all_br = rc.all_tl = rc.uniform = 1;
    int first = 1;
    for (size_t k = 0; k < L->n_segments; k++) {
        if (!effective(&L->segs[k])) continue;
        int64_t o = seg_offset(L, k);
        if (o != 0) rc.all_br = 0;
        if (mp_query_pos(L, k, 0) != 0) rc.all_tl = 0;
        if (first)
            rc.o = o;
        else if (o != rc.o)
            rc.uniform = 0;
        first = 0;
    }
    if (rc.bidir_all) rc.spans = rc.prefix = 0;
    return rc;
}

/* Band mode 4 parameters of a window / causal rule whose segments share the diagonal offset o:
 * -pre <= (j - i) - (Skv - Sq) <= next with the diagonal at (j - i) - (Skv - Sq) = o. */
static void band_params(const maskpack_layout *L, int64_t o, int64_t *pre, int64_t *next) {
    *pre = L->window_left < 0 ? MP_NPU_INF : clamp_inf(L->window_left - o);
    if (L->causal)
        *next = clamp_inf(o);
    else
        *next = L->window_right < 0 ? MP_NPU_INF : clamp_inf(L->window_right + o);
}

int mp_npu_layout_band(const maskpack_layout *L, int64_t *pre, int64_t *next) {
    rule_class rc = classify(L);
    if (rc.spans || rc.prefix || !rc.uniform) return 0;
    band_params(L, rc.o, pre, next);
    return 1;
}

/* 1 iff query i of segment k sees at least one key under the layout's own predicate. */
static int row_sees_something(const maskpack_layout *L, size_t k, int64_t i) {
    if (L->segs[k].kv_len == 0) return 0;
    int64_t lo, hi;
    mp_base_key_range(L, k, i, &lo, &hi);
    if (lo < hi) return 1;
    if (L->prefix && L->prefix[k] > 0) return 1;
    int64_t p = mp_span_pos(L, k, i);
    for (size_t t = L->span_begin[k]; t < L->span_begin[k + 1]; t++)
        if (p >= L->spans[t].start && p < L->spans[t].end) return 1; /* (i, p) lies in the span */
    return 0;
}

static void set_mask_none(maskpack_npu_argset *a) {
    a->mask_kind = MASKPACK_NPU_MASK_NONE;
    a->mask_ndim = 0;
}

static void set_mask_compressed(maskpack_npu_argset *a, int prefix) {
    a->mask_kind = prefix ? MASKPACK_NPU_MASK_PREFIX_COMPRESSED : MASKPACK_NPU_MASK_COMPRESSED;
    a->mask_ndim = 2;
    a->mask_shape[0] = prefix ? MP_NPU_COMPRESSED + MP_NPU_PREFIX_ROWS : MP_NPU_COMPRESSED;
    a->mask_shape[1] = MP_NPU_COMPRESSED;
}

static maskpack_status tnd_args(const maskpack_layout *L, const rule_class *rc, maskpack_npu_argset *a,
                                maskpack_error *err) {
    if (!L->packed)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "layout", -1, -1,
                       "layout: input_layout TND needs a packed (THD) layout, found a padded grid of %lld rows x "
                       "%lld columns (use BSND/BNSD/BSH/SBH for it)",
                       (long long)L->n_rows, (long long)L->q_width);
    if (rc->spans)
        return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "rule.spans", -1, -1,
                       "rule.spans: bidirectional spans cannot be expressed in TND: the compressed sparse modes "
                       "have no spans and a TND full mask is one [maxSq, maxSkv] matrix shared by every "
                       "sequence; use a B*S input_layout (full mask, sparse_mode 1)");
    if (rc->prefix && rc->window)
        return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "rule.prefix", -1, -1,
                       "rule.prefix: a prefix together with a window has no TND sparse mode (mode 6 is prefix + "
                       "plain bottom-right causal)");
    if (rc->prefix && !rc->all_br)
        return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "rule.alignment", -1, -1,
                       "rule.alignment: prefix mode 6 is bottom-right causal; segments with another diagonal "
                       "(top-left with q_len != kv_len, or shard pieces) have no TND equivalent");
    if (rc->window && !rc->uniform)
        return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "rule.alignment", -1, -1,
                       "rule.alignment: band mode 4 takes one pre/next for all items, aligned bottom-right; these "
                       "segments' diagonals sit at different offsets from it (a top-left window with differing "
                       "kv_len - q_len, or shard pieces), so no TND call expresses the window");

    mp_npu_items it;
    maskpack_status s = mp_npu_tnd_items(L, &it, err);
    if (s) return s;
    int64_t band = -1;
    if (rc->bidir_all) {
        a->sparse_mode = 0;
        a->pre_tokens = a->next_tokens = MP_NPU_INF;
        set_mask_none(a);
    } else if (rc->prefix) {
        a->sparse_mode = 6;
        a->pre_tokens = MP_NPU_INF;
        a->next_tokens = 0;
        set_mask_compressed(a, 1);
    } else if (rc->window || (!rc->all_br && !rc->all_tl && rc->uniform)) {
        a->sparse_mode = 4;
        band_params(L, rc->o, &a->pre_tokens, &a->next_tokens);
        set_mask_compressed(a, 0);
    } else if (rc->all_br || rc->all_tl) {
        /* plain causal: 3 whenever it fits (also when both fit: q_len == kv_len everywhere) */
        a->sparse_mode = rc->all_br ? 3 : 2;
        a->pre_tokens = MP_NPU_INF;
        a->next_tokens = 0;
        set_mask_compressed(a, 0);
    } else {
        /* Diagonals differ: the outer-split modes cover one odd item, the last non-empty one under
         * mode 7 (the others bottom-right, Sq <= Skv) or the first under mode 8 (the others
         * top-left). That is the shape of a sequence split across cards (docs/conventions.md section 6). */
        for (int32_t mode = 7; mode <= 8 && band < 0; mode++) {
            int64_t cand = mp_npu_band_item(mode, it.q_len, it.kv_len, it.n);
            int ok = cand >= 0 && it.segment[cand] >= 0;
            for (int64_t k = 0; ok && k < it.n; k++) {
                if (k == cand) continue;
                if (mode == 7 && it.q_len[k] > it.kv_len[k]) ok = 0;
                int64_t g = it.segment[k];
                if (g < 0 || !effective(&L->segs[g])) continue;
                if (mode == 7 ? seg_offset(L, (size_t)g) != 0 : mp_query_pos(L, (size_t)g, 0) != 0) ok = 0;
            }
            if (ok) {
                band = cand;
                a->sparse_mode = mode;
            }
        }
        if (band < 0) {
            mp_npu_items_free(&it);
            return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "layout", -1, -1,
                           "layout: the segments' causal diagonals differ (shard pieces or mixed alignment) and "
                           "not as one odd last item after bottom-right ones (mode 7) or one odd first item "
                           "before top-left ones (mode 8): no TND sparse mode expresses it; use a B*S layout");
        }
        a->pre_tokens = MP_NPU_INF; /* >= the band item's Skv, as both modes require */
        a->next_tokens = seg_offset(L, (size_t)it.segment[band]);
        set_mask_compressed(a, 0);
    }
    int64_t limit = a->sparse_mode == 6 ? MP_NPU_MAX_ITEMS_PREFIX : MASKPACK_NPU_MAX_ITEMS;
    if (it.n == 0 || it.n > limit) {
        int64_t n = it.n;
        mp_npu_items_free(&it);
        if (n == 0)
            return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "layout", -1, -1,
                           "layout: no tokens and no segments: npu_fusion_attention needs at least one item");
        return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "layout", n, -1,
                       "layout: %lld TND items (segments plus declared pad items) exceed the operator's limit of "
                       "%lld%s",
                       (long long)n, (long long)limit,
                       limit == MP_NPU_MAX_ITEMS_PREFIX ? " when prefix is passed" : "");
    }
    a->n_items = it.n;
    a->actual_seq_qlen = mp_alloc_array((size_t)it.n, sizeof(int64_t));
    a->actual_seq_kvlen = mp_alloc_array((size_t)it.n, sizeof(int64_t));
    a->pad_items = malloc((size_t)it.n);
    if (a->sparse_mode == 6) {
        a->prefix = mp_alloc_array((size_t)it.n, sizeof(int64_t));
        a->n_prefix = it.n;
    }
    if (!a->actual_seq_qlen || !a->actual_seq_kvlen || !a->pad_items || (a->sparse_mode == 6 && !a->prefix)) {
        mp_npu_items_free(&it);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "out", -1, -1, "out of memory");
    }
    int64_t eq = 0, ek = 0, empty_rows = 0;
    for (int64_t k = 0; k < it.n; k++) {
        eq += it.q_len[k];
        ek += it.kv_len[k];
        a->actual_seq_qlen[k] = eq;
        a->actual_seq_kvlen[k] = ek;
        a->pad_items[k] = it.segment[k] < 0;
        int64_t pf = it.segment[k] >= 0 && L->prefix ? L->prefix[it.segment[k]] : 0;
        if (a->prefix) a->prefix[k] = pf;
        /* rows this item computes with an empty key set (pad items included) */
        for (int64_t i = 0; i < it.q_len[k]; i++) {
            int64_t lo, hi;
            if (a->mask_kind == MASKPACK_NPU_MASK_NONE) {
                lo = 0;
                hi = it.kv_len[k];
            } else {
                mp_npu_key_range(a->sparse_mode, a->pre_tokens, a->next_tokens, it.q_len[k], it.kv_len[k], pf,
                                 k == band, i, &lo, &hi);
            }
            if (lo < hi) continue;
            empty_rows++;
            if (it.segment[k] >= 0)
                a->fully_masked_rows++;
            else
                a->fully_masked_pad_rows++;
        }
    }
    a->inner_precise = empty_rows ? 2 : 0;
    mp_npu_items_free(&it);
    return MASKPACK_OK;
}

static maskpack_status bsnd_args(const maskpack_layout *L, const rule_class *rc, maskpack_npu_argset *a,
                                 maskpack_error *err) {
    if (L->packed)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "layout", -1, -1,
                       "layout: this input_layout needs a padded or packed-row [B,S] layout, found a packed (THD) "
                       "layout of %lld tokens: use input_layout TND",
                       (long long)L->q_width);
    int64_t B = L->n_rows, S = L->q_width, Skv = L->kv_width;
    if (B < 1 || S < 1 || Skv < 1)
        return mp_fail(err, MASKPACK_ERR_NOT_REPRESENTABLE, "layout", -1, -1,
                       "layout: npu_fusion_attention needs B, Sq, Skv >= 1, found B=%lld Sq=%lld Skv=%lld",
                       (long long)B, (long long)S, (long long)Skv);
    /* Compressed masks describe one rectangle per batch: only rows holding exactly one segment that
     * covers the whole row (no padding, no second document) can use them. */
    int full_rows = 1;
    for (int64_t b = 0; b < B && full_rows; b++) {
        if (mp_row_begin(L, b + 1) - mp_row_begin(L, b) != 1) {
            full_rows = 0;
            break;
        }
        const maskpack_segment *g = &L->segs[mp_row_begin(L, b)];
        full_rows = g->q_start == 0 && g->q_len == S && g->kv_start == 0 && g->kv_len == Skv;
    }
    int mode = 1; /* the fallback: a full [B,1,S,Skv] M-mask expresses any predicate */
    if (full_rows) {
        if (rc->bidir_all)
            mode = 0;
        else if (rc->spans)
            mode = 1;
        else if (rc->prefix)
            mode = (rc->window || !rc->all_br || B > MP_NPU_MAX_PREFIX_BATCH) ? 1 : 6;
        else if (!rc->window && (rc->all_br || rc->all_tl))
            mode = rc->all_br ? 3 : 2;
        else
            mode = rc->uniform ? 4 : 1;
    }
    a->sparse_mode = mode;
    switch (mode) {
    case 0:
        a->pre_tokens = a->next_tokens = MP_NPU_INF;
        set_mask_none(a);
        break;
    case 1:
        /* pre/next stay unbounded: with a full mask they would only clip what the mask allows */
        a->pre_tokens = a->next_tokens = MP_NPU_INF;
        a->mask_kind = MASKPACK_NPU_MASK_FULL;
        a->mask_ndim = 4;
        a->mask_shape[0] = B;
        a->mask_shape[1] = 1;
        a->mask_shape[2] = S;
        a->mask_shape[3] = Skv;
        break;
    case 4:
        band_params(L, rc->o, &a->pre_tokens, &a->next_tokens);
        set_mask_compressed(a, 0);
        break;
    default: /* 2, 3, 6 */
        a->pre_tokens = MP_NPU_INF;
        a->next_tokens = 0;
        set_mask_compressed(a, mode == 6);
        break;
    }
    if (mode == 6) {
        a->prefix = mp_alloc_array((size_t)B, sizeof(int64_t));
        if (!a->prefix) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "out", -1, -1, "out of memory");
        a->n_prefix = B;
        for (int64_t b = 0; b < B; b++) a->prefix[b] = L->prefix[mp_row_begin(L, b)];
    }
    for (size_t k = 0; k < L->n_segments; k++)
        for (int64_t i = 0; i < L->segs[k].q_len; i++)
            if (!row_sees_something(L, k, i)) a->fully_masked_rows++;
    /* B*S cannot overflow: the layout validated the grid. Pad slots see nothing only in a full mask
       (mode 1, which every padded B*S layout gets); the other modes' masks do not know the padding */
    if (mode == 1) a->fully_masked_pad_rows = B * S - L->n_tokens;
    a->inner_precise = (a->fully_masked_rows > 0 || a->fully_masked_pad_rows > 0) ? 2 : 0;
    return MASKPACK_OK;
}

maskpack_status maskpack_npu_args(const maskpack_layout *L, maskpack_npu_layout input_layout, double scale,
                                  int64_t head_dim, maskpack_npu_argset *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    if ((int)input_layout < MASKPACK_NPU_BSND || (int)input_layout > MASKPACK_NPU_TND)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "input_layout", -1, -1,
                       "input_layout: expected BSND (0), BNSD (1), BSH (2), SBH (3) or TND (4), found %d",
                       (int)input_layout);
    if (head_dim < 0 || head_dim > MP_NPU_MAX_HEAD_DIM)
        return mp_fail(err, head_dim < 0 ? MASKPACK_ERR_INVALID_ARGUMENT : MASKPACK_ERR_NOT_REPRESENTABLE, "head_dim",
                       -1, -1, "head_dim: expected 0 (unknown) to %d (the operator's limit), found %lld",
                       MP_NPU_MAX_HEAD_DIM, (long long)head_dim);
    double sc;
    if (isfinite(scale) && scale > 0)
        sc = scale;
    else if (scale == 0 && head_dim > 0)
        sc = 1.0 / sqrt((double)head_dim);
    else
        /* the operator's own default (1.0) is wrong for almost every model: never fall back to it */
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "scale", -1, -1,
                       "scale: expected a finite value > 0, or 0 with head_dim > 0 for 1/sqrt(head_dim); found "
                       "scale %g with head_dim %lld",
                       scale, (long long)head_dim);

    maskpack_npu_argset a;
    memset(&a, 0, sizeof a);
    a.input_layout = input_layout;
    a.scale = sc;
    rule_class rc = classify(L);
    maskpack_status s = input_layout == MASKPACK_NPU_TND ? tnd_args(L, &rc, &a, err) : bsnd_args(L, &rc, &a, err);
    if (s) {
        maskpack_npu_argset_release(&a);
        return s;
    }
    *out = a;
    return mp_ok(err);
}

void maskpack_npu_argset_release(maskpack_npu_argset *args) {
    if (!args) return;
    free(args->actual_seq_qlen);
    free(args->actual_seq_kvlen);
    free(args->prefix);
    free(args->pad_items);
    memset(args, 0, sizeof *args);
}

/* ---- atten_mask ------------------------------------------------------------------------------- */

static void put(const maskpack_tensor *t, int64_t off, int v) { ((uint8_t *)t->data)[off] = (uint8_t)(v != 0); }

maskpack_status maskpack_npu_atten_mask(const maskpack_layout *L, const maskpack_npu_argset *args, maskpack_tensor *out,
                                        maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, args, "args");
    MP_CHECK_NULL(err, out, "out");
    int64_t want[4] = {0, 0, 0, 0};
    int32_t ndim = 2;
    switch (args->mask_kind) {
    case MASKPACK_NPU_MASK_NONE:
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "args.mask_kind", -1, -1,
                       "args.mask_kind: NONE, pass atten_mask=None; there is no mask to fill");
    case MASKPACK_NPU_MASK_COMPRESSED:
    case MASKPACK_NPU_MASK_PREFIX_COMPRESSED:
        want[0] = args->mask_kind == MASKPACK_NPU_MASK_COMPRESSED ? MP_NPU_COMPRESSED
                                                                  : MP_NPU_COMPRESSED + MP_NPU_PREFIX_ROWS;
        want[1] = MP_NPU_COMPRESSED;
        break;
    case MASKPACK_NPU_MASK_FULL:
        if (args->input_layout == MASKPACK_NPU_TND)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "args.mask_kind", -1, -1,
                           "args.mask_kind: a TND full mask is never emitted by maskpack_npu_args");
        ndim = 4;
        want[0] = L->n_rows;
        want[1] = 1;
        want[2] = L->q_width;
        want[3] = L->kv_width;
        break;
    default:
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "args.mask_kind", -1, -1,
                       "args.mask_kind: expected NONE, COMPRESSED, PREFIX_COMPRESSED or FULL, found %d",
                       (int)args->mask_kind);
    }
    /* the argset must describe the mask we are about to write (and, for FULL, this layout) */
    int same = args->mask_ndim == ndim;
    for (int32_t d = 0; same && d < ndim; d++) same = args->mask_shape[d] == want[d];
    if (!same)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "args.mask_shape", -1, -1,
                       "args.mask_shape: expected %d dims [%lld, %lld, %lld, %lld] for this mask kind and layout, "
                       "found %d dims [%lld, %lld, %lld, %lld] (args from another layout?)",
                       (int)ndim, (long long)want[0], (long long)want[1], (long long)want[2], (long long)want[3],
                       (int)args->mask_ndim, (long long)args->mask_shape[0], (long long)args->mask_shape[1],
                       (long long)args->mask_shape[2], (long long)args->mask_shape[3]);
    maskpack_status s = mp_check_output(out, "out", MP_DT(MASKPACK_BOOL) | MP_DT(MASKPACK_U8), ndim, want, err);
    if (s) return s;

    if (args->mask_kind != MASKPACK_NPU_MASK_FULL) {
        /* M-mask: 1 strictly above the diagonal; mode 6 appends 1024 rows with the right half 1 */
        for (int64_t i = 0; i < want[0]; i++)
            for (int64_t j = 0; j < want[1]; j++) {
                int v = i < MP_NPU_COMPRESSED ? j > i : j >= MP_NPU_COMPRESSED / 2;
                put(out, i * out->strides[0] + j * out->strides[1], v);
            }
        return mp_ok(err);
    }
    /* full [B,1,S,Skv] M-mask: the layout's predicate inverted; pad rows and columns are excluded */
    for (int64_t b = 0; b < L->n_rows; b++)
        for (int64_t i = 0; i < L->q_width; i++) {
            int64_t row = b * out->strides[0] + i * out->strides[2];
            for (int64_t j = 0; j < L->kv_width; j++) put(out, row + j * out->strides[3], 1);
            int64_t k = maskpack_segment_of_query(L, b, i);
            if (k < 0) continue;
            const maskpack_segment *g = &L->segs[k];
            for (int64_t j = 0; j < g->kv_len; j++)
                if (mp_allowed_local(L, (size_t)k, i - g->q_start, j))
                    put(out, row + (g->kv_start + j) * out->strides[3], 0);
        }
    return mp_ok(err);
}
