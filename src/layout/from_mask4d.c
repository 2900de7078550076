/* src/layout/from_mask4d.c: reading dense 4D attention masks back into a 2D keep mask or a layout.
 *
 * Both functions first read the whole mask once: every element must be a legal value of its
 * convention, and a key column is valid iff some query (any head, any row) attends it. That column
 * rule is the only one that gives the same answer for ms-swift's masks (pad query rows still see
 * the valid keys) and verl's (pad rows see nothing); a row rule is wrong (docs/conventions.md section 7).
 *
 * maskpack_layout_from_mask4d then proposes a layout (segments + rule) from per-row summaries and
 * VERIFIES it against every valid query row before returning it: a heuristic may guess, but the
 * layout handed back always reproduces the mask exactly on the valid rows. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reading the mask ------------------------------------------------------------------------ */

/* The mask seen as [B, H, Q, S] whatever its rank: a [B,S] input is [B,1,1,S] with zero strides. */
typedef struct mview {
    const void *data;
    maskpack_dtype dt;
    maskpack_mask_convention conv;
    int orig_ndim;
    int64_t B, H, Q, S;
    int64_t st[4];
} mview;

static inline int64_t mv_off(const mview *v, int64_t b, int64_t h, int64_t i, int64_t j) {
    return b * v->st[0] + h * v->st[1] + i * v->st[2] + j * v->st[3];
}

/* Index of an element in the caller's own coordinates (for error reports). */
static void mv_index(const mview *v, int64_t b, int64_t h, int64_t i, int64_t j, int64_t idx[4]) {
    if (v->orig_ndim == 2) {
        idx[0] = b;
        idx[1] = j;
        idx[2] = -1;
        idx[3] = -1;
    } else {
        idx[0] = b;
        idx[1] = h;
        idx[2] = i;
        idx[3] = j;
    }
}

/* 1 = the pair attends, 0 = excluded, -1 = a value the convention forbids. Integer masks are
 * compared with 0 and 1 (never negated bitwise: ~1 == -2 would read as "true"). */
static inline int classify(const mview *v, int64_t off) {
    if (v->conv == MASKPACK_MASK_ADDITIVE) {
        double x = mp_read_f64(v->dt, v->data, off);
        if (x == 0.0) return 1; /* also -0.0 */
        if (x < 0.0) return 0;  /* -inf, finfo.min, -10000, ... */
        return -1;              /* positive or NaN: not a bias any framework writes */
    }
    int bit;
    if (mp_dtype_is_integer(v->dt)) {
        int64_t x = mp_read_i64(v->dt, v->data, off);
        if (x != 0 && x != 1) return -1;
        bit = x == 1;
    } else {
        double x = mp_read_f64(v->dt, v->data, off);
        if (x != 0.0 && x != 1.0) return -1;
        bit = x == 1.0;
    }
    return v->conv == MASKPACK_MASK_KEEP ? bit : !bit;
}

static int dtype_is_float(maskpack_dtype d) {
    return d == MASKPACK_F16 || d == MASKPACK_BF16 || d == MASKPACK_F32 || d == MASKPACK_F64;
}

/* Checks that every element address (offset = sum idx*stride) fits int64, whatever the strides'
 * signs, so strided reads cannot overflow. */
static maskpack_status check_extent(const maskpack_tensor *t, const char *name, maskpack_error *err) {
    int64_t lo = 0, hi = 0;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return MASKPACK_OK; /* nothing is ever read */
        int64_t span;
        if (mp_mul_overflow(t->shape[d] - 1, t->strides[d], &span) ||
            (span > 0 ? mp_add_overflow(hi, span, &hi) : mp_add_overflow(lo, span, &lo)))
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, d, -1,
                           "%s: shape and strides address elements beyond the int64 range (dimension %d)", name,
                           (int)d);
    }
    int64_t bytes;
    if (mp_mul_overflow(hi, (int64_t)maskpack_dtype_size(t->dtype), &bytes) ||
        mp_mul_overflow(lo, (int64_t)maskpack_dtype_size(t->dtype), &bytes))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, -1, -1, "%s: byte offsets overflow int64", name);
    return MASKPACK_OK;
}

static const char *conv_name(maskpack_mask_convention c) {
    switch (c) {
    case MASKPACK_MASK_KEEP: return "KEEP";
    case MASKPACK_MASK_MASKED: return "MASKED";
    default: return "ADDITIVE";
    }
}

/* Common argument checks. `square` demands a 4D [B,H,S,S] mask (layout recovery); otherwise the
 * [B,1,1,S] and [B,S] padding forms are accepted as well. */
static maskpack_status make_view(const maskpack_tensor *mask, maskpack_mask_convention conv, int square, mview *v,
                                 maskpack_error *err) {
    MP_CHECK_NULL(err, mask, "mask");
    if (square && mask->ndim != 4)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "mask", -1, -1,
                       "mask: layout recovery needs a [B,1,S,S] or [B,H,S,S] mask, found %d dimensions",
                       (int)mask->ndim);
    maskpack_status s = mp_check_tensor(mask, "mask", square ? 4 : 2, 4, err);
    if (s) return s;
    if (conv != MASKPACK_MASK_KEEP && conv != MASKPACK_MASK_MASKED && conv != MASKPACK_MASK_ADDITIVE)
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "convention", -1, -1,
                       "convention: expected KEEP (0), MASKED (1) or ADDITIVE (2), found %d", (int)conv);
    if (conv == MASKPACK_MASK_ADDITIVE && !dtype_is_float(mask->dtype))
        return mp_fail(err, MASKPACK_ERR_DTYPE, "mask", -1, -1,
                       "mask: an ADDITIVE mask needs a float dtype (float16/bfloat16/float32/float64), found %s",
                       maskpack_dtype_name(mask->dtype));
    if (mask->ndim == 3)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "mask", -1, -1,
                       "mask: expected [B,1,S,S], [B,H,S,S], [B,1,1,S] or [B,S], found 3 dimensions");
    s = check_extent(mask, "mask", err);
    if (s) return s;
    memset(v, 0, sizeof *v);
    v->data = mask->data;
    v->dt = mask->dtype;
    v->conv = conv;
    v->orig_ndim = mask->ndim;
    if (mask->ndim == 2) {
        v->B = mask->shape[0];
        v->H = 1;
        v->Q = 1;
        v->S = mask->shape[1];
        v->st[0] = mask->strides[0];
        v->st[3] = mask->strides[1];
        return MASKPACK_OK;
    }
    v->B = mask->shape[0];
    v->H = mask->shape[1];
    v->Q = mask->shape[2];
    v->S = mask->shape[3];
    for (int d = 0; d < 4; d++) v->st[d] = mask->strides[d];
    if (v->H == 0 && v->B > 0 && v->S > 0)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "mask", 1, -1,
                       "mask: expected at least one head (dimension 1), found 0");
    if (square) {
        if (v->Q != v->S)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "mask", 2, 3,
                           "mask: layout recovery needs self-attention masks with as many query rows as key "
                           "columns, found Sq = %lld, Skv = %lld",
                           (long long)v->Q, (long long)v->S);
    } else if (v->Q != v->S && v->Q != 1) {
        return mp_fail(err, MASKPACK_ERR_SHAPE, "mask", 2, 3,
                       "mask: expected [B,H,S,S] or [B,1,1,S] (query dimension S or 1), found Sq = %lld with "
                       "Skv = %lld",
                       (long long)v->Q, (long long)v->S);
    }
    return MASKPACK_OK;
}

/* Reads every element once: rejects forbidden values (naming the first) and marks valid key
 * columns: valid[b*S + j] = 1 iff some (h, i) attends (b, j). */
static maskpack_status scan_valid(const mview *v, uint8_t *valid, maskpack_error *err) {
    for (int64_t b = 0; b < v->B; b++)
        for (int64_t h = 0; h < v->H; h++)
            for (int64_t i = 0; i < v->Q; i++)
                for (int64_t j = 0; j < v->S; j++) {
                    int64_t off = mv_off(v, b, h, i, j);
                    int c = classify(v, off);
                    if (c < 0) {
                        int64_t idx[4];
                        mv_index(v, b, h, i, j, idx);
                        char where[96];
                        if (v->orig_ndim == 2)
                            snprintf(where, sizeof where, "mask[%lld, %lld]", (long long)b, (long long)j);
                        else
                            snprintf(where, sizeof where, "mask[%lld, %lld, %lld, %lld]", (long long)b, (long long)h,
                                     (long long)i, (long long)j);
                        if (v->conv == MASKPACK_MASK_ADDITIVE)
                            return mp_fail4(err, MASKPACK_ERR_VALUE, "mask", idx,
                                            "%s: expected 0 (attend) or a negative value (excluded) in an ADDITIVE "
                                            "mask, found %g",
                                            where, mp_read_f64(v->dt, v->data, off));
                        if (mp_dtype_is_integer(v->dt))
                            return mp_fail4(err, MASKPACK_ERR_VALUE, "mask", idx,
                                            "%s: expected 0 or 1 in a %s mask (%s), found %lld", where,
                                            conv_name(v->conv),
                                            v->conv == MASKPACK_MASK_KEEP ? "1 = attend" : "1 = excluded",
                                            (long long)mp_read_i64(v->dt, v->data, off));
                        return mp_fail4(err, MASKPACK_ERR_VALUE, "mask", idx,
                                        "%s: expected exactly 0 or 1 in a %s mask of dtype %s, found %g", where,
                                        conv_name(v->conv), maskpack_dtype_name(v->dt),
                                        mp_read_f64(v->dt, v->data, off));
                    }
                    if (c) valid[b * v->S + j] = 1;
                }
    return MASKPACK_OK;
}

/* One query row as 0/1 bytes (values already validated). */
static void load_row(const mview *v, int64_t b, int64_t h, int64_t i, uint8_t *row) {
    for (int64_t j = 0; j < v->S; j++) row[j] = (uint8_t)classify(v, mv_off(v, b, h, i, j));
}

/* ---- maskpack_mask2d_from_mask4d ------------------------------------------------------------- */

maskpack_status maskpack_mask2d_from_mask4d(const maskpack_tensor *mask, maskpack_mask_convention convention,
                                            maskpack_tensor *out, maskpack_error *err) {
    MP_CHECK_NULL(err, mask, "mask");
    MP_CHECK_NULL(err, out, "out");
    mview v;
    maskpack_status s = make_view(mask, convention, 0, &v, err);
    if (s) return s;
    int64_t shape[2] = {v.B, v.S};
    s = mp_check_output(out, "out",
                        MP_DT(MASKPACK_BOOL) | MP_DT(MASKPACK_U8) | MP_DT(MASKPACK_I32) | MP_DT(MASKPACK_I64), 2, shape,
                        err);
    if (s) return s;
    s = check_extent(out, "out", err);
    if (s) return s;
    int64_t n; /* fits: mp_check_tensor bounded B*S via the input's numel (H, Q >= 1) or it is 0 */
    if (mp_mul_overflow(v.B, v.S, &n))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "mask", -1, -1, "mask: B * S overflows int64");
    if (n == 0) return mp_ok(err); /* out holds no element: no loop over the rows of a [2^50, 1, 0, 0] mask */
    /* computed into a private buffer first: nothing is written unless the whole mask is legal, and
     * an out that aliases the mask cannot corrupt the reading */
    uint8_t *valid = calloc((size_t)(n ? n : 1), 1);
    if (!valid) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
    s = scan_valid(&v, valid, err);
    if (s) {
        free(valid);
        return s;
    }
    for (int64_t b = 0; b < v.B; b++)
        for (int64_t j = 0; j < v.S; j++)
            mp_write_i64(out->dtype, out->data, b * out->strides[0] + j * out->strides[1], valid[b * v.S + j]);
    free(valid);
    return mp_ok(err);
}

/* ---- maskpack_layout_from_mask4d ------------------------------------------------------------- */

/* Growable arrays (segments and spans of a candidate). */
typedef struct {
    maskpack_segment *a;
    size_t n, cap;
} segvec;
typedef struct {
    maskpack_span *a;
    size_t n, cap;
} spanvec;

static int segvec_push(segvec *v, maskpack_segment g) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 16;
        maskpack_segment *p = mp_realloc_array(v->a, cap, sizeof *p);
        if (!p) return -1;
        v->a = p;
        v->cap = cap;
    }
    v->a[v->n++] = g;
    return 0;
}

static int spanvec_push(spanvec *v, maskpack_span sp) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 16;
        maskpack_span *p = mp_realloc_array(v->a, cap, sizeof *p);
        if (!p) return -1;
        v->a = p;
        v->cap = cap;
    }
    v->a[v->n++] = sp;
    return 0;
}

/* Everything the recovery keeps about one mask; per-token arrays are [B*S], indexed b*S + col. */
typedef struct rctx {
    mview v;
    int64_t B, S;
    uint8_t *valid; /* key column attended by someone */
    uint8_t *row;   /* [S] scratch: one query row of head 0 */
    uint8_t *row2;  /* [S] scratch: the same row of another head */
    int64_t *minj;  /* smallest / largest attended key column of a valid row, -1 if none */
    int64_t *maxj;
    uint8_t *seen_later; /* column j attended by some valid row i > j */
    /* per-segment statistics of the current segmentation (segment-local columns) */
    int64_t *first0; /* first key of the segment the row does NOT attend (n if none) */
    int64_t *second; /* first attended key after first0 (-1 if none) */
    int64_t *last;   /* last attended key of the segment (-1 if none) */
} rctx;

/* The first cell where a candidate layout and the mask disagree. */
typedef struct mismatch {
    int found;
    int64_t b, i, j;
    int mask_attends;
} mismatch;

/* Row b's segments under one of two segmentations:
 *  - SPEC (the one a layout is recovered from): boundary t-1|t is cut iff no attended pair of a
 *    valid row crosses it, and every invalid column is padding;
 *  - WEAK (diagnosis only): cut where column t-1 is seen by no later row and row t-1 sees no later
 *    column. It separates documents that a stray pair glued together, so the error can name that
 *    pair. When the mask is representable both segmentations coincide. */
enum { SEG_SPEC = 0, SEG_WEAK = 1 };

static maskpack_status segment_rows(rctx *c, int mode, segvec *out, int64_t *cover, maskpack_error *err) {
    const int64_t S = c->S;
    for (int64_t b = 0; b < c->B; b++) {
        const uint8_t *valid = c->valid + b * S;
        const int64_t *mn = c->minj + b * S, *mx = c->maxj + b * S;
        const uint8_t *later = c->seen_later + b * S;
        /* cover[t] > 0: boundary between t-1 and t is crossed (t in [1, S)) */
        for (int64_t t = 0; t <= S; t++) cover[t] = 0;
        if (mode == SEG_SPEC) {
            for (int64_t i = 0; i < S; i++) {
                if (!valid[i] || mx[i] < 0) continue;
                /* pairs (i, j) cross every boundary t with min(i, j) < t <= max(i, j) */
                int64_t lo = mn[i] < i ? mn[i] : i, hi = mx[i] > i ? mx[i] : i;
                if (hi > lo) {
                    cover[lo + 1]++;
                    cover[hi + 1]--;
                }
            }
            for (int64_t t = 1; t <= S; t++) cover[t] += cover[t - 1];
        } else {
            for (int64_t t = 1; t < S; t++) cover[t] = later[t - 1] || (valid[t - 1] && mx[t - 1] > t - 1);
        }
        int64_t start = -1;
        for (int64_t t = 0; t <= S; t++) {
            int cut = t == S || !valid[t] || (t > 0 && cover[t] == 0);
            if (cut && start >= 0) {
                maskpack_segment g = {b, start, t - start, start, t - start};
                if (segvec_push(out, g))
                    return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
                start = -1;
            }
            if (t < S && valid[t] && start < 0) start = t;
        }
    }
    return MASKPACK_OK;
}

/* Per-row statistics inside each segment, and the largest prefix every row of a segment sees. */
static void segment_stats(rctx *c, const segvec *segs, int64_t *pmax) {
    for (size_t k = 0; k < segs->n; k++) {
        const maskpack_segment *g = &segs->a[k];
        int64_t n = g->q_len, q0 = g->q_start, p = n;
        for (int64_t il = 0; il < n; il++) {
            int64_t tok = g->row * c->S + q0 + il;
            load_row(&c->v, g->row, 0, q0 + il, c->row);
            const uint8_t *r = c->row + q0;
            int64_t f = 0;
            while (f < n && r[f]) f++;
            int64_t sec = -1, last = -1;
            for (int64_t j = f + 1; j < n; j++)
                if (r[j]) {
                    sec = j;
                    break;
                }
            for (int64_t j = n - 1; j >= 0; j--)
                if (r[j]) {
                    last = j;
                    break;
                }
            c->first0[tok] = f;
            c->second[tok] = sec;
            c->last[tok] = last;
            if (f < p) p = f;
        }
        pmax[k] = p;
    }
}

/* Attended keys of row il (segment-local) outside the prefix [0, p): the interval [*a, *cend], or
 * 0 when there are none. The allowed set always contains [0, p) (p <= first0), so its first key at
 * or after p is p itself unless the row's first gap starts exactly at p. */
static int beyond_prefix(const rctx *c, int64_t tok, int64_t p, int64_t *a, int64_t *cend) {
    int64_t last = c->last[tok];
    if (last < p) return 0;
    *a = p < c->first0[tok] ? p : c->second[tok];
    *cend = last;
    return *a >= 0;
}

/* A candidate rule: one global causal/window setting, per-segment prefix and spans. */
typedef struct cand {
    int causal;
    int64_t wl, wr;
    spanvec spans;      /* global segment indices */
    int64_t *prefix;    /* [n_segments] */
    maskpack_layout *L; /* built candidate, or NULL */
    mismatch mm;
} cand;

static void cand_free(cand *cd) {
    free(cd->spans.a);
    free(cd->prefix);
    maskpack_layout_free(cd->L);
    memset(cd, 0, sizeof *cd);
}

/* Smallest prefix that, with the chosen base rule and spans, still covers every key below pmax
 * (all of which every row attends): keeps the recovered rule free of redundant prefixes. */
static int64_t needed_prefix(const cand *cd, int64_t n, int64_t pmax, const int64_t *sp_s, const int64_t *sp_e) {
    int64_t need = 0;
    if (pmax == 0) return 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t lo = cd->wl < 0 ? 0 : (i - cd->wl > 0 ? i - cd->wl : 0);
        int64_t hi = cd->causal ? i : (cd->wr < 0 ? n - 1 : (i + cd->wr < n - 1 ? i + cd->wr : n - 1));
        if (sp_s && sp_s[i] >= 0) { /* base and span are intervals through i: their union is one */
            if (sp_s[i] < lo) lo = sp_s[i];
            if (sp_e[i] - 1 > hi) hi = sp_e[i] - 1;
        }
        int64_t miss = -1; /* largest key below pmax the row would not see without a prefix */
        if (hi < pmax - 1)
            miss = pmax - 1;
        else if (lo > 0)
            miss = lo - 1 < pmax - 1 ? lo - 1 : pmax - 1;
        if (miss + 1 > need) need = miss + 1;
    }
    return need;
}

/* The window most rows fix exactly (the largest on a tie). On a representable mask every row fixes
 * the same value; on a broken one the majority is the intent, so the error names the outlier row. */
static int64_t most_voted(const int64_t *votes, int64_t S) {
    int64_t best = 0;
    for (int64_t w = 1; w <= S; w++)
        if (votes[w] > 0 && votes[w] >= votes[best]) best = w;
    return best;
}

/* Completes a candidate whose window and spans are chosen (seg_span0[k]: first span of segment k):
 * the smallest prefix each segment still needs, then the layout itself. sp_s/sp_e are [S] scratch. */
static maskpack_status finish_candidate(rctx *c, const segvec *segs, const int64_t *pmax, const int64_t *seg_span0,
                                        int64_t *sp_s, int64_t *sp_e, cand *cd, maskpack_error *err) {
    int any_prefix = 0;
    for (size_t k = 0; k < segs->n; k++) {
        int64_t n = segs->a[k].q_len;
        for (int64_t i = 0; i < n; i++) sp_s[i] = sp_e[i] = -1;
        for (int64_t t = seg_span0[k]; t < seg_span0[k + 1]; t++)
            for (int64_t i = cd->spans.a[t].start; i < cd->spans.a[t].end; i++) {
                sp_s[i] = cd->spans.a[t].start;
                sp_e[i] = cd->spans.a[t].end;
            }
        cd->prefix[k] = needed_prefix(cd, n, pmax[k], sp_s, sp_e);
        any_prefix |= cd->prefix[k] != 0;
    }
    maskpack_rule rule = maskpack_rule_default();
    rule.causal = cd->causal;
    rule.window_left = cd->wl;
    rule.window_right = cd->wr;
    rule.spans = cd->spans.a;
    rule.n_spans = cd->spans.n;
    rule.prefix = any_prefix ? cd->prefix : NULL;
    rule.n_prefix = any_prefix ? segs->n : 0;
    maskpack_segment *copy = mp_alloc_array(segs->n, sizeof *copy);
    if (!copy) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
    if (segs->n) memcpy(copy, segs->a, segs->n * sizeof *copy);
    return mp_layout_build(copy, segs->n, c->B, c->S, c->S, 0, &rule, &cd->L, err);
}

/* Proposes the causal (causal = 1) or bidirectional candidate for a segmentation. p is the largest
 * prefix every row of the segment sees (a model with the true prefix also holds with this one).
 * Causal: spans are runs of rows whose last visible key c lies after them and is shared (HF's
 * blockwise overlay: rows s..c-1 see exactly up to c, so the span is [s, c+1)); the left window
 * follows from each row's first key a at or after p:
 *   plain row i:  a = max(p, i - wl)          -> wl = i - a exactly when a > p
 *   span row i:   a = max(p, min(i - wl, s))  -> exact when p < a < s, wl <= i - s when a == s
 * Bidirectional: no spans; wl as above, wr from each row's last key c = min(n-1, i + wr) when it
 * lies at or after p (exact when c < n-1), else i + wr < p bounds it from above. These are all the
 * constraints a row puts on the window, so a representable mask always gets a fitting window;
 * verification catches the rest. */
static maskpack_status propose(rctx *c, const segvec *segs, const int64_t *pmax, int causal, cand *cd,
                               maskpack_error *err) {
    memset(cd, 0, sizeof *cd);
    cd->causal = causal;
    cd->wl = cd->wr = -1;
    cd->prefix = calloc(segs->n ? segs->n : 1, sizeof *cd->prefix);
    int64_t *sp_s = mp_alloc_array((size_t)c->S, sizeof *sp_s);
    int64_t *sp_e = mp_alloc_array((size_t)c->S, sizeof *sp_e);
    int64_t *seg_span0 = calloc(segs->n + 1, sizeof *seg_span0);  /* first span of each segment */
    int64_t *votes_l = calloc((size_t)c->S + 1, sizeof *votes_l); /* rows fixing wl (wr) at each value */
    int64_t *votes_r = calloc((size_t)c->S + 1, sizeof *votes_r);
    if (!cd->prefix || !sp_s || !sp_e || !seg_span0 || !votes_l || !votes_r) goto oom;

    int have_exact_l = 0, have_upper_l = 0, have_exact_r = 0, have_upper_r = 0;
    int64_t upper_l = INT64_MAX, upper_r = INT64_MAX;
    for (size_t k = 0; k < segs->n; k++) {
        const maskpack_segment *g = &segs->a[k];
        int64_t n = g->q_len, p = pmax[k], base = g->row * c->S + g->q_start;
        seg_span0[k] = (int64_t)cd->spans.n;
        for (int64_t i = 0; i < n; i++) sp_s[i] = sp_e[i] = -1;
        if (causal && p == n && n >= 2) {
            /* every row sees the whole segment: say "one bidirectional span", not "prefix n" */
            maskpack_span sp = {(int64_t)k, 0, n};
            if (spanvec_push(&cd->spans, sp)) goto oom;
        } else if (causal) {
            for (int64_t i = 0; i < n;) {
                int64_t a, ce;
                if (!beyond_prefix(c, base + i, p, &a, &ce) || ce <= i) {
                    i++;
                    continue;
                }
                /* rows i..ce-1 should all end at ce; any that does not is caught by verification */
                maskpack_span sp = {(int64_t)k, i, ce + 1};
                if (spanvec_push(&cd->spans, sp)) goto oom;
                for (int64_t t = i; t <= ce; t++) {
                    sp_s[t] = i;
                    sp_e[t] = ce + 1;
                }
                i = ce + 1; /* spans never overlap */
            }
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t a, ce;
            if (!beyond_prefix(c, base + i, p, &a, &ce)) {
                /* a row inside the prefix that sees nothing past it: its right reach i + wr < p */
                if (!causal && i < p && p < n) {
                    have_upper_r = 1;
                    if (p - 1 - i < upper_r) upper_r = p - 1 - i;
                }
                continue;
            }
            if (a > p && a <= i) {
                if (sp_s[i] < 0 || a < sp_s[i]) {
                    have_exact_l = 1;
                    votes_l[i - a]++;
                } else if (a == sp_s[i]) {
                    have_upper_l = 1;
                    if (i - a < upper_l) upper_l = i - a;
                }
            }
            if (!causal && ce < n - 1 && ce >= i) {
                have_exact_r = 1;
                votes_r[ce - i]++;
            }
        }
    }
    seg_span0[segs->n] = (int64_t)cd->spans.n;
    cd->wl = have_exact_l ? most_voted(votes_l, c->S) : (have_upper_l ? upper_l : -1);
    cd->wr = causal ? -1 : (have_exact_r ? most_voted(votes_r, c->S) : (have_upper_r ? upper_r : -1));
    if (!causal && cd->wr == 0) { /* bidirectional (wl, 0) is the causal rule: say so */
        cd->causal = causal = 1;
        cd->wr = -1;
    }

    maskpack_status s = finish_candidate(c, segs, pmax, seg_span0, sp_s, sp_e, cd, err);
    free(sp_s);
    free(sp_e);
    free(seg_span0);
    free(votes_l);
    free(votes_r);
    return s;
oom:
    free(sp_s);
    free(sp_e);
    free(seg_span0);
    free(votes_l);
    free(votes_r);
    return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
}

/* Proposes the general candidate, tried when neither proposal above fits: one window (causal when
 * its right side is 0) with spans wherever rows reach beyond it. The proposals above read spans
 * only on a causal base; a bidirectional window with spans needs both sides of a row at once (a
 * row i of span [s, e) sees [min(i - wl, s), max(i + wr, e - 1)], clipped to the segment).
 * Window: a span only widens a row, so each row's reach beyond the prefix p bounds the window from
 * above, and rows outside spans meet their bound exactly:
 *   left:  a row whose first key a beyond the prefix lies above p reaches i - a >= wl;
 *   right: a row whose last key c lies before n - 1 reaches c - i >= wr; a row of the prefix that
 *          sees nothing past it has i + wr < p, i.e. wr <= p - 1 - i.
 * The smallest bound is the window. When it is larger than the true window, no row outside a span
 * tells the two apart (otherwise it would show a tighter bound) and span rows reach their span's
 * ends anyway, so the larger window reproduces the same rows.
 * Spans: against that window, a row whose last key c passes its window's end lies in a span ending
 * at c + 1, which therefore holds rows [i, c]; a row whose first key a lies before its window's start
 * lies in a span starting at a (at or below a when a == p: keys under p are seen anyway), holding
 * rows [a, i]. The row ranges of one span overlap each other (they all contain its first or its
 * last row, and the rows reaching past the window's end come before those reaching before its
 * start), different spans are disjoint, so the spans are the unions of overlapping row ranges.
 * Verification decides whether the result fits. */
static maskpack_status propose_general(rctx *c, const segvec *segs, const int64_t *pmax, cand *cd,
                                       maskpack_error *err) {
    memset(cd, 0, sizeof *cd);
    size_t ns = (size_t)(c->S ? c->S : 1);
    cd->prefix = calloc(segs->n ? segs->n : 1, sizeof *cd->prefix);
    int64_t *sp_s = mp_alloc_array(ns, sizeof *sp_s);
    int64_t *sp_e = mp_alloc_array(ns, sizeof *sp_e);
    int64_t *inside = mp_alloc_array(ns + 1, sizeof *inside); /* > 0: boundary t-1|t lies inside a span */
    int64_t *seg_span0 = calloc(segs->n + 1, sizeof *seg_span0);
    maskpack_status s;
    if (!cd->prefix || !sp_s || !sp_e || !inside || !seg_span0) goto oom;

    int64_t wl = INT64_MAX, wr = INT64_MAX;
    for (size_t k = 0; k < segs->n; k++) {
        const maskpack_segment *g = &segs->a[k];
        int64_t n = g->q_len, p = pmax[k], base = g->row * c->S + g->q_start;
        for (int64_t i = 0; i < n; i++) {
            int64_t a, ce;
            if (!beyond_prefix(c, base + i, p, &a, &ce)) {
                if (i < p && p < n && p - 1 - i < wr) wr = p - 1 - i;
                continue;
            }
            if (a > p && a <= i && i - a < wl) wl = i - a;
            if (ce < n - 1 && ce >= i && ce - i < wr) wr = ce - i;
        }
    }
    cd->causal = 0;
    cd->wl = wl == INT64_MAX ? -1 : wl;
    cd->wr = wr == INT64_MAX ? -1 : wr;
    if (cd->wr == 0) { /* (wl, 0) is the causal rule: say so */
        cd->causal = 1;
        cd->wr = -1;
    }

    for (size_t k = 0; k < segs->n; k++) {
        const maskpack_segment *g = &segs->a[k];
        int64_t n = g->q_len, p = pmax[k], base = g->row * c->S + g->q_start;
        seg_span0[k] = (int64_t)cd->spans.n;
        for (int64_t t = 0; t <= n; t++) inside[t] = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t a, ce;
            if (!beyond_prefix(c, base + i, p, &a, &ce)) continue;
            int64_t lo = cd->wl < 0 || i - cd->wl < 0 ? 0 : i - cd->wl;
            int64_t hi = cd->causal ? i : (cd->wr < 0 || i + cd->wr > n - 1 ? n - 1 : i + cd->wr);
            int64_t r0 = a < lo && a < i ? a : i, r1 = ce > hi ? ce : i; /* rows of i's span */
            if (r1 > r0) {
                inside[r0 + 1]++;
                inside[r1 + 1]--;
            }
        }
        for (int64_t t = 1; t <= n; t++) inside[t] += inside[t - 1];
        for (int64_t t = 1; t < n;) {
            if (inside[t] <= 0) {
                t++;
                continue;
            }
            int64_t start = t - 1;
            while (t < n && inside[t] > 0) t++;
            maskpack_span sp = {(int64_t)k, start, t};
            if (spanvec_push(&cd->spans, sp)) goto oom;
        }
    }
    seg_span0[segs->n] = (int64_t)cd->spans.n;
    s = finish_candidate(c, segs, pmax, seg_span0, sp_s, sp_e, cd, err);
    free(sp_s);
    free(sp_e);
    free(inside);
    free(seg_span0);
    return s;
oom:
    free(sp_s);
    free(sp_e);
    free(inside);
    free(seg_span0);
    return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
}

/* Compares the candidate's predicate with the mask on every valid query row (all key columns).
 * The candidate's row is assembled from the layout's own pieces (mp_base_key_range, prefix, the
 * span holding the row), exactly as mp_allowed_local combines them, so the check costs O(S) per
 * row instead of a span scan per cell. */
static void verify(rctx *c, const maskpack_layout *L, mismatch *mm) {
    memset(mm, 0, sizeof *mm);
    const int64_t S = c->S;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < S; i++) {
            if (!c->valid[b * S + i]) continue;
            load_row(&c->v, b, 0, i, c->row);
            int64_t k = maskpack_segment_of_query(L, b, i);
            int64_t ks = -1, ke = -1, lo = 0, hi = 0, pre = 0, ss = -1, se = -1;
            if (k >= 0) {
                const maskpack_segment *g = &L->segs[k];
                int64_t il = i - g->q_start;
                ks = g->kv_start;
                ke = g->kv_start + g->kv_len;
                mp_base_key_range(L, (size_t)k, il, &lo, &hi);
                pre = L->prefix ? L->prefix[k] : 0;
                int64_t sp = mp_span_pos(L, (size_t)k, il);
                for (size_t t = L->span_begin[k]; t < L->span_begin[k + 1]; t++)
                    if (sp >= L->spans[t].start && sp < L->spans[t].end) {
                        ss = L->spans[t].start;
                        se = L->spans[t].end;
                        break;
                    }
            }
            for (int64_t j = 0; j < S; j++) {
                int want = 0;
                if (j >= ks && j < ke) {
                    int64_t jl = j - ks;
                    want = (jl >= lo && jl < hi) || jl < pre || (jl >= ss && jl < se);
                }
                if (want != c->row[j]) {
                    mm->found = 1;
                    mm->b = b;
                    mm->i = i;
                    mm->j = j;
                    mm->mask_attends = c->row[j];
                    return;
                }
            }
        }
}

static int mismatch_later(const mismatch *x, const mismatch *y) {
    if (x->b != y->b) return x->b > y->b;
    if (x->i != y->i) return x->i > y->i;
    return x->j > y->j;
}

static void describe_rule(const cand *cd, int64_t k, char *buf, size_t cap) {
    char wl[32] = "unbounded", wr[32] = "unbounded";
    if (cd->wl >= 0) snprintf(wl, sizeof wl, "%lld", (long long)cd->wl);
    if (cd->wr >= 0) snprintf(wr, sizeof wr, "%lld", (long long)cd->wr);
    if (cd->causal)
        snprintf(buf, cap, "causal, window_left %s, prefix %lld", wl, (long long)(k >= 0 ? cd->prefix[k] : 0));
    else
        snprintf(buf, cap, "bidirectional, window (%s, %s), prefix %lld", wl, wr,
                 (long long)(k >= 0 ? cd->prefix[k] : 0));
}

/* Explains the first mismatch of a failed candidate in the error. */
static maskpack_status report(rctx *c, const cand *cd, maskpack_error *err) {
    const mismatch *m = &cd->mm;
    const maskpack_layout *L = cd->L;
    int64_t idx[4] = {m->b, 0, m->i, m->j};
    long long b = (long long)m->b, i = (long long)m->i, j = (long long)m->j;
    int64_t k = maskpack_segment_of_query(L, m->b, m->i);
    const maskpack_segment *g = &L->segs[k]; /* valid rows always own a segment */
    long long q0 = (long long)g->q_start, q1 = (long long)(g->q_start + g->q_len);
    char rule[160];
    describe_rule(cd, k, rule, sizeof rule);
    const maskpack_status NR = MASKPACK_ERR_NOT_REPRESENTABLE;
    load_row(&c->v, m->b, 0, m->i, c->row);
    if (m->mask_attends) {
        if (m->j < g->kv_start || m->j >= g->kv_start + g->kv_len) {
            int64_t k2 = maskpack_segment_of_query(L, m->b, m->j);
            long long r0 = k2 >= 0 ? (long long)L->segs[k2].q_start : j;
            long long r1 = k2 >= 0 ? (long long)(L->segs[k2].q_start + L->segs[k2].q_len) : j + 1;
            return mp_fail4(err, NR, "mask", idx,
                            "row %lld: mask is not block-diagonal: query %lld (segment [%lld, %lld)) attends key %lld "
                            "(segment [%lld, %lld))",
                            b, i, q0, q1, j, r0, r1);
        }
        if (m->j > m->i) {
            if (cd->causal)
                return mp_fail4(err, NR, "mask", idx,
                                "row %lld: query %lld attends key %lld which lies after it, but the rows of its "
                                "segment [%lld, %lld) are not a bidirectional span (rule recovered: %s)",
                                b, i, j, q0, q1, rule);
            return mp_fail4(err, NR, "mask", idx,
                            "row %lld: query %lld attends key %lld, %lld to its right, beyond the window the other "
                            "rows show (rule recovered: %s)",
                            b, i, j, j - i, rule);
        }
        for (int64_t t = m->j + 1; t < m->i; t++)
            if (!c->row[t])
                return mp_fail4(err, NR, "mask", idx,
                                "row %lld: query %lld attends key %lld but not key %lld between them, and key %lld is "
                                "not in a prefix every query of segment [%lld, %lld) sees (rule recovered: %s)",
                                b, i, j, (long long)t, j, q0, q1, rule);
        return mp_fail4(err, NR, "mask", idx,
                        "row %lld: query %lld attends key %lld, %lld to its left, beyond the window the other rows "
                        "show (rule recovered: %s)",
                        b, i, j, i - j, rule);
    }
    if (c->maxj[m->b * c->S + m->i] < 0)
        return mp_fail4(err, NR, "mask", idx,
                        "row %lld: query %lld attends no key, yet later queries attend key %lld, so it is a real "
                        "token; in a layout every real token attends at least itself",
                        b, i, i);
    int64_t il = mp_span_pos(L, (size_t)k, m->i - g->q_start), jl = m->j - g->kv_start;
    for (size_t t = L->span_begin[k]; t < L->span_begin[k + 1]; t++) {
        const maskpack_span *sp = &L->spans[t];
        if (il >= sp->start && il < sp->end && jl >= sp->start && jl < sp->end)
            return mp_fail4(err, NR, "mask", idx,
                            "row %lld: queries from %lld attend later keys up to %lld, but the rows of columns "
                            "[%lld, %lld) are not a bidirectional span: query %lld does not attend key %lld",
                            b, (long long)(g->q_start + sp->start), (long long)(g->q_start + sp->end - 1),
                            (long long)(g->q_start + sp->start), (long long)(g->q_start + sp->end), i, j);
    }
    return mp_fail4(err, NR, "mask", idx,
                    "row %lld: query %lld does not attend key %lld although the rule the other rows of segment "
                    "[%lld, %lld) show allows it (rule recovered: %s)",
                    b, i, j, q0, q1, rule);
}

/* Heads must agree on valid query rows (a layout has one predicate for every head); also collects
 * the per-row key extents used by the segmentations. */
static maskpack_status scan_rows(rctx *c, maskpack_error *err) {
    const int64_t S = c->S;
    for (int64_t b = 0; b < c->B; b++) {
        uint8_t *later = c->seen_later + b * S;
        for (int64_t i = 0; i < S; i++) {
            int64_t tok = b * S + i;
            c->minj[tok] = c->maxj[tok] = -1;
            if (!c->valid[tok]) continue;
            load_row(&c->v, b, 0, i, c->row);
            for (int64_t h = 1; h < c->v.H; h++) {
                load_row(&c->v, b, h, i, c->row2);
                for (int64_t j = 0; j < S; j++)
                    if (c->row2[j] != c->row[j]) {
                        int64_t idx[4] = {b, h, i, j};
                        return mp_fail4(err, MASKPACK_ERR_NOT_REPRESENTABLE, "mask", idx,
                                        "row %lld: head %lld %s key %lld from query %lld but head 0 %s: a layout has "
                                        "one predicate for all heads",
                                        (long long)b, (long long)h, c->row2[j] ? "attends" : "excludes", (long long)j,
                                        (long long)i, c->row[j] ? "attends it" : "excludes it");
                    }
            }
            for (int64_t j = 0; j < S; j++) {
                if (!c->row[j]) continue;
                if (c->minj[tok] < 0) c->minj[tok] = j;
                c->maxj[tok] = j;
                if (j < i) later[j] = 1;
            }
        }
    }
    return MASKPACK_OK;
}

static void rctx_free(rctx *c) {
    free(c->valid);
    free(c->row);
    free(c->row2);
    free(c->minj);
    free(c->maxj);
    free(c->seen_later);
    free(c->first0);
    free(c->second);
    free(c->last);
}

/* How much per-segment structure (spans, prefixes) a candidate needs: the simpler rule wins. */
static size_t extras(const cand *cd, size_t n_segments) {
    size_t x = cd->spans.n;
    for (size_t k = 0; k < n_segments; k++) x += cd->prefix[k] != 0;
    return x;
}

/* Builds both candidates of one segmentation and verifies them; when neither fits, also the general
 * candidate (*gen_tried says so). */
static maskpack_status try_segmentation(rctx *c, int mode, int64_t *cover, cand *cc, cand *cb, int *bidir_tried,
                                        cand *cg, int *gen_tried, maskpack_error *err) {
    segvec segs = {0};
    int64_t *pmax = NULL;
    *bidir_tried = 0;
    *gen_tried = 0;
    maskpack_status s = segment_rows(c, mode, &segs, cover, err);
    if (s) goto done;
    pmax = mp_alloc_array(segs.n, sizeof *pmax);
    if (!pmax) {
        s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
        goto done;
    }
    segment_stats(c, &segs, pmax);
    s = propose(c, &segs, pmax, 1, cc, err);
    if (s) goto done;
    verify(c, cc->L, &cc->mm);
    /* a causal fit that needs spans or prefixes may be a plain bidirectional mask */
    if (cc->mm.found || extras(cc, segs.n) > 0) {
        *bidir_tried = 1;
        s = propose(c, &segs, pmax, 0, cb, err);
        if (s) goto done;
        verify(c, cb->L, &cb->mm);
    }
    /* a window on both sides with spans on top (kept last: the two readings above are simpler) */
    if (cc->mm.found && (!*bidir_tried || cb->mm.found)) {
        *gen_tried = 1;
        s = propose_general(c, &segs, pmax, cg, err);
        if (s == MASKPACK_ERR_OUT_OF_MEMORY) goto done;
        if (s || !cg->L) { /* a rule the layout builder refuses cannot be the answer: no fit */
            s = MASKPACK_OK;
            cg->mm.found = 1;
        } else {
            verify(c, cg->L, &cg->mm);
        }
    }
done:
    free(segs.a);
    free(pmax);
    return s;
}

maskpack_status maskpack_layout_from_mask4d(const maskpack_tensor *mask, maskpack_mask_convention convention,
                                            maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, mask, "mask");
    MP_CHECK_NULL(err, out, "out");
    rctx c;
    memset(&c, 0, sizeof c);
    maskpack_status s = make_view(mask, convention, 1, &c.v, err);
    if (s) return s;
    c.B = c.v.B;
    c.S = c.v.S;
    int64_t n;
    if (mp_mul_overflow(c.B, c.S, &n))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "mask", -1, -1, "mask: B * S overflows int64");
    /* no token: the default rule (nothing to infer one from), and no loop over the rows of a
     * [2^50, 1, 0, 0] mask */
    if (n == 0) return mp_layout_empty(c.B, c.S, 0, NULL, out, err);
    size_t nt = (size_t)(n ? n : 1), ns = (size_t)(c.S ? c.S : 1);
    c.valid = calloc(nt, 1);
    c.seen_later = calloc(nt, 1);
    c.row = malloc(ns);
    c.row2 = malloc(ns);
    c.minj = mp_alloc_array(nt, sizeof(int64_t));
    c.maxj = mp_alloc_array(nt, sizeof(int64_t));
    c.first0 = mp_alloc_array(nt, sizeof(int64_t));
    c.second = mp_alloc_array(nt, sizeof(int64_t));
    c.last = mp_alloc_array(nt, sizeof(int64_t));
    int64_t *cover = mp_alloc_array(ns + 1, sizeof *cover);
    cand cc, cb, cg, wc, wb, wg;
    memset(&cg, 0, sizeof cg);
    memset(&wg, 0, sizeof wg);
    memset(&cc, 0, sizeof cc);
    memset(&cb, 0, sizeof cb);
    memset(&wc, 0, sizeof wc);
    memset(&wb, 0, sizeof wb);
    if (!c.valid || !c.seen_later || !c.row || !c.row2 || !c.minj || !c.maxj || !c.first0 || !c.second || !c.last ||
        !cover) {
        s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
        goto done;
    }
    s = scan_valid(&c.v, c.valid, err);
    if (s) goto done;
    s = scan_rows(&c, err);
    if (s) goto done;

    int bidir_tried = 0, gen_tried = 0;
    s = try_segmentation(&c, SEG_SPEC, cover, &cc, &cb, &bidir_tried, &cg, &gen_tried, err);
    if (s) goto done;
    {
        /* both fit: the bidirectional rule wins only when it needs fewer spans and prefixes
         * (a fully bidirectional batch); a tie keeps the causal reading */
        cand *fit = NULL;
        if (!cc.mm.found) fit = &cc;
        if (bidir_tried && !cb.mm.found && (!fit || extras(&cb, cb.L->n_segments) < extras(&cc, cc.L->n_segments)))
            fit = &cb;
        if (!fit && gen_tried && !cg.mm.found) fit = &cg;
        if (fit) {
            *out = fit->L;
            fit->L = NULL;
            s = mp_ok(err);
            goto done;
        }
    }

    /* Not representable. Explain with the candidate that matched the mask the longest, including the
     * weak segmentation's, whose first mismatch is a stray pair between two documents. */
    {
        int wb_tried = 0, wg_tried = 0;
        s = try_segmentation(&c, SEG_WEAK, cover, &wc, &wb, &wb_tried, &wg, &wg_tried, err);
        if (s) goto done;
        /* both segmentations coincide on representable masks, so this is a safety net only */
        cand *fit = !wc.mm.found ? &wc : (wb_tried && !wb.mm.found ? &wb : (wg_tried && !wg.mm.found ? &wg : NULL));
        if (fit) {
            *out = fit->L;
            fit->L = NULL;
            s = mp_ok(err);
            goto done;
        }
        const cand *best = &cc;
        if (bidir_tried && mismatch_later(&cb.mm, &best->mm)) best = &cb;
        if (mismatch_later(&wc.mm, &best->mm)) best = &wc;
        if (wb_tried && wb.mm.found && mismatch_later(&wb.mm, &best->mm)) best = &wb;
        s = report(&c, best, err);
    }
done:
    cand_free(&cc);
    cand_free(&cb);
    cand_free(&cg);
    cand_free(&wg);
    cand_free(&wc);
    cand_free(&wb);
    free(cover);
    rctx_free(&c);
    return s;
}
