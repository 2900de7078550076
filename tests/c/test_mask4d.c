/* test_mask4d.c: maskpack_mask2d_from_mask4d and maskpack_layout_from_mask4d on hand-built 4D masks
 * (ms-swift and verl padding forms, packed documents, bidirectional, windows, prefix-LM, VLM spans,
 * every convention and dtype, heads, strides, errors) and a round-trip property over random layouts;
 * the shape, convention and value checks of both readers. */
#include "check.h"
#include "internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------------------------- */

/* Writes one element of any dtype (integers get v as an integer). */
static void put(void *data, maskpack_dtype dt, int64_t off, double v) {
    switch (dt) {
    case MASKPACK_BOOL:
    case MASKPACK_U8: ((uint8_t *)data)[off] = (uint8_t)v; break;
    case MASKPACK_I8: ((int8_t *)data)[off] = (int8_t)v; break;
    case MASKPACK_I16: ((int16_t *)data)[off] = (int16_t)v; break;
    case MASKPACK_I32: ((int32_t *)data)[off] = (int32_t)v; break;
    case MASKPACK_I64: ((int64_t *)data)[off] = (int64_t)v; break;
    case MASKPACK_F16: ((uint16_t *)data)[off] = mp_f32_to_f16((float)v); break;
    case MASKPACK_BF16: ((uint16_t *)data)[off] = mp_f32_to_bf16((float)v); break;
    case MASKPACK_F32: ((float *)data)[off] = (float)v; break;
    case MASKPACK_F64: ((double *)data)[off] = v; break;
    default: break;
    }
}

/* att[b][i][j] (1 = attend) -> a freshly allocated [B,H,S,S] tensor in `conv` and `dt`; additive
 * masks use `neg` for excluded pairs. Every head gets the same pattern. */
static maskpack_tensor encode(const uint8_t *att, int64_t B, int64_t H, int64_t S, maskpack_mask_convention conv,
                              maskpack_dtype dt, double neg) {
    int64_t shape[4] = {B, H, S, S};
    size_t n = (size_t)(B * H * S * S);
    void *data = calloc(n > 0 ? n : 1, maskpack_dtype_size(dt));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++)
                for (int64_t j = 0; j < S; j++) {
                    int a = att[(b * S + i) * S + j];
                    double v = conv == MASKPACK_MASK_KEEP ? a : conv == MASKPACK_MASK_MASKED ? !a : (a ? 0.0 : neg);
                    put(data, dt, ((b * H + h) * S + i) * S + j, v);
                }
    return maskpack_tensor_contiguous(data, dt, 4, shape);
}

/* The reference predicate of a layout as att[b][i][j]. */
static uint8_t *att_of_layout(const maskpack_layout *L, int64_t B, int64_t S) {
    uint8_t *att = calloc((size_t)(B * S * S > 0 ? B * S * S : 1), 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) att[(b * S + i) * S + j] = (uint8_t)maskpack_allowed(L, b, 0, i, j);
    return att;
}

/* Number of (b,i,j) where the two layouts' predicates differ (prints the first). */
static int64_t pred_diff(const maskpack_layout *x, const maskpack_layout *y, int64_t B, int64_t S) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++)
                if (maskpack_allowed(x, b, 0, i, j) != maskpack_allowed(y, b, 0, i, j)) {
                    if (n == 0)
                        fprintf(stderr, "  predicates differ at (b=%lld, i=%lld, j=%lld): %d vs %d\n", (long long)b,
                                (long long)i, (long long)j, maskpack_allowed(x, b, 0, i, j),
                                maskpack_allowed(y, b, 0, i, j));
                    n++;
                }
    return n;
}

/* 1 iff both layouts have the same segments. */
static int same_segments(const maskpack_layout *x, const maskpack_layout *y) {
    if (maskpack_layout_n_segments(x) != maskpack_layout_n_segments(y)) return 0;
    for (size_t k = 0; k < maskpack_layout_n_segments(x); k++) {
        maskpack_segment a, b;
        maskpack_layout_segment(x, k, &a, NULL);
        maskpack_layout_segment(y, k, &b, NULL);
        /* field by field: memcmp would also compare the struct's padding after flags, which the
         * compiler need not copy (a clang -O2 build failed here with equal segments) */
        if (a.row != b.row || a.q_start != b.q_start || a.q_len != b.q_len || a.kv_start != b.kv_start ||
            a.kv_len != b.kv_len || a.flags != b.flags || a.q_pos != b.q_pos || a.origin != b.origin)
            return 0;
    }
    return 1;
}

static maskpack_layout *layout_of(const maskpack_segment *s, size_t n, int64_t B, int64_t S, const maskpack_rule *r) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, n, B, S, S, 0, r, &L, &e), e);
    return L;
}

/* Parses t back and checks the recovered layout against the original: same predicate everywhere,
 * and (when want_segs) the same segments. Returns the recovered layout (caller frees) or NULL. */
static maskpack_layout *parse_and_match(const maskpack_tensor *t, maskpack_mask_convention conv,
                                        const maskpack_layout *orig, int want_segs) {
    maskpack_layout *R = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_mask4d(t, conv, &R, &e), e);
    if (!R) return NULL;
    CHECK_EQ(maskpack_layout_n_rows(R), maskpack_layout_n_rows(orig));
    CHECK_EQ(maskpack_layout_q_width(R), maskpack_layout_q_width(orig));
    CHECK_EQ(pred_diff(R, orig, maskpack_layout_n_rows(orig), maskpack_layout_q_width(orig)), 0);
    if (want_segs) CHECK(same_segments(R, orig));
    return R;
}

/* Runs mask2d_from_mask4d into a u8 [B,S] buffer and compares with the layout's real tokens. */
static void check_mask2d(const maskpack_tensor *t, maskpack_mask_convention conv, const maskpack_layout *L) {
    int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L);
    uint8_t *out = malloc((size_t)(B * S > 0 ? B * S : 1));
    int64_t shape[2] = {B, S};
    maskpack_tensor o = maskpack_tensor_contiguous(out, MASKPACK_U8, 2, shape);
    maskpack_error e;
    CHECK_OK(maskpack_mask2d_from_mask4d(t, conv, &o, &e), e);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) CHECK_EQ(out[b * S + s], maskpack_segment_of_query(L, b, s) >= 0);
    free(out);
}

/* ---- padding: ms-swift vs verl forms ------------------------------------------------------- */

/* Row 0 right padding, row 1 left padding, row 2 padding on both sides; causal. ms-swift's
 * mask only masks keys (pad query rows still see the valid keys j <= i), verl's masks pad rows
 * entirely. Both must give the same 2D mask and the same layout. */
static void test_padding_forms(void) {
    const int64_t B = 3, S = 7;
    maskpack_segment segs[3] = {{0, 0, 5, 0, 5}, {1, 3, 4, 3, 4}, {2, 1, 4, 1, 4}};
    maskpack_layout *L = layout_of(segs, 3, B, S, NULL);
    if (!L) return;
    uint8_t swift[3 * 7 * 7], verl[3 * 7 * 7];
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) {
                int vi = maskpack_segment_of_query(L, b, i) >= 0, vj = maskpack_segment_of_query(L, b, j) >= 0;
                swift[(b * S + i) * S + j] = (uint8_t)(vj && j <= i);
                verl[(b * S + i) * S + j] = (uint8_t)(vi && vj && j <= i);
            }
    /* the forms really differ on pad rows: row 0's pad query 6 sees key 0 in ms-swift's form only */
    CHECK_EQ(swift[(0 * S + 6) * S + 0], 1);
    CHECK_EQ(verl[(0 * S + 6) * S + 0], 0);

    maskpack_tensor ts = encode(swift, B, 1, S, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0);
    maskpack_tensor tv = encode(verl, B, 1, S, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0);
    check_mask2d(&ts, MASKPACK_MASK_MASKED, L);
    check_mask2d(&tv, MASKPACK_MASK_MASKED, L);

    /* int64 output, compared element by element between the two forms */
    int64_t o1[21], o2[21];
    int64_t shape[2] = {B, S};
    maskpack_tensor t1 = maskpack_tensor_contiguous(o1, MASKPACK_I64, 2, shape);
    maskpack_tensor t2 = maskpack_tensor_contiguous(o2, MASKPACK_I64, 2, shape);
    maskpack_error e;
    CHECK_OK(maskpack_mask2d_from_mask4d(&ts, MASKPACK_MASK_MASKED, &t1, &e), e);
    CHECK_OK(maskpack_mask2d_from_mask4d(&tv, MASKPACK_MASK_MASKED, &t2, &e), e);
    CHECK(memcmp(o1, o2, sizeof o1) == 0);
    CHECK_EQ(o1[0 * S + 4], 1);
    CHECK_EQ(o1[0 * S + 5], 0);
    CHECK_EQ(o1[1 * S + 2], 0);
    CHECK_EQ(o1[1 * S + 3], 1);
    CHECK_EQ(o1[2 * S + 0], 0);
    CHECK_EQ(o1[2 * S + 4], 1);
    CHECK_EQ(o1[2 * S + 5], 0);

    maskpack_layout *Rs = parse_and_match(&ts, MASKPACK_MASK_MASKED, L, 1);
    maskpack_layout *Rv = parse_and_match(&tv, MASKPACK_MASK_MASKED, L, 1);
    if (Rs && Rv) {
        CHECK(same_segments(Rs, Rv));
        CHECK_EQ(pred_diff(Rs, Rv, B, S), 0);
        maskpack_rule r = maskpack_layout_rule(Rs);
        CHECK_EQ(r.causal, 1);
        CHECK_EQ(r.window_left, -1);
        CHECK_EQ(r.n_spans, 0);
        CHECK(r.prefix == NULL);
    }
    maskpack_layout_free(Rs);
    maskpack_layout_free(Rv);
    free(ts.data);
    free(tv.data);
    maskpack_layout_free(L);
}

/* ---- structures ---------------------------------------------------------------------------- */

/* Two rows of packed documents (row 0 ends with 2 pad columns). */
static const maskpack_segment packed_segs[5] = {
    {0, 0, 3, 0, 3}, {0, 3, 4, 3, 4}, {0, 7, 3, 7, 3}, {1, 0, 5, 0, 5}, {1, 5, 7, 5, 7}};

static maskpack_layout *roundtrip(const maskpack_segment *segs, size_t n, int64_t B, int64_t S,
                                  const maskpack_rule *rule, maskpack_mask_convention conv, maskpack_dtype dt,
                                  double neg, int want_segs) {
    maskpack_layout *L = layout_of(segs, n, B, S, rule);
    if (!L) return NULL;
    uint8_t *att = att_of_layout(L, B, S);
    maskpack_tensor t = encode(att, B, 1, S, conv, dt, neg);
    check_mask2d(&t, conv, L);
    maskpack_layout *R = parse_and_match(&t, conv, L, want_segs);
    free(t.data);
    free(att);
    maskpack_layout_free(L);
    return R;
}

static void test_packed_documents(void) {
    maskpack_layout *R = roundtrip(packed_segs, 5, 2, 12, NULL, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0, 1);
    if (!R) return;
    CHECK_EQ(maskpack_layout_n_segments(R), 5);
    maskpack_rule r = maskpack_layout_rule(R);
    CHECK_EQ(r.causal, 1);
    CHECK_EQ(r.window_left, -1);
    CHECK_EQ(r.n_spans, 0);
    CHECK(r.prefix == NULL);
    maskpack_layout_free(R);
}

static void test_bidirectional(void) {
    maskpack_rule rule = maskpack_rule_default();
    rule.causal = 0;
    maskpack_layout *R = roundtrip(packed_segs, 5, 2, 12, &rule, MASKPACK_MASK_MASKED, MASKPACK_U8, 0, 1);
    if (!R) return;
    maskpack_rule r = maskpack_layout_rule(R);
    CHECK_EQ(r.causal, 0);
    CHECK_EQ(r.window_left, -1);
    CHECK_EQ(r.window_right, -1);
    CHECK_EQ(r.n_spans, 0);
    CHECK(r.prefix == NULL);
    maskpack_layout_free(R);
}

static void test_sliding_window(void) {
    maskpack_segment segs[2] = {{0, 0, 10, 0, 10}, {1, 2, 3, 2, 3}};
    maskpack_rule rule = maskpack_rule_default();
    rule.window_left = 2;
    maskpack_layout *R = roundtrip(segs, 2, 2, 12, &rule, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0, 1);
    if (R) {
        maskpack_rule r = maskpack_layout_rule(R);
        CHECK_EQ(r.causal, 1);
        CHECK_EQ(r.window_left, 2);
        CHECK_EQ(r.n_spans, 0);
        CHECK(r.prefix == NULL);
        maskpack_layout_free(R);
    }
    /* a bidirectional band (left 2, right 1) */
    rule.causal = 0;
    rule.window_left = 2;
    rule.window_right = 1;
    R = roundtrip(segs, 2, 2, 12, &rule, MASKPACK_MASK_ADDITIVE, MASKPACK_F32, -INFINITY, 1);
    if (R) {
        maskpack_rule r = maskpack_layout_rule(R);
        CHECK_EQ(r.causal, 0);
        CHECK_EQ(r.window_left, 2);
        CHECK_EQ(r.window_right, 1);
        maskpack_layout_free(R);
    }
}

static void test_prefix_lm(void) {
    maskpack_segment segs[2] = {{0, 0, 8, 0, 8}, {0, 8, 4, 8, 4}};
    int64_t prefix[2] = {3, 0};
    maskpack_rule rule = maskpack_rule_default();
    rule.prefix = prefix;
    rule.n_prefix = 2;
    maskpack_layout *R = roundtrip(segs, 2, 1, 13, &rule, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0, 1);
    if (!R) return;
    maskpack_rule r = maskpack_layout_rule(R);
    CHECK_EQ(r.causal, 1);
    CHECK_EQ(r.window_left, -1);
    CHECK_EQ(r.n_spans, 0);
    CHECK(r.prefix != NULL && r.n_prefix == 2);
    if (r.prefix && r.n_prefix == 2) {
        CHECK_EQ(r.prefix[0], 3);
        CHECK_EQ(r.prefix[1], 0);
    }
    maskpack_layout_free(R);
}

static void test_vlm_span(void) {
    /* image tokens 3..6 of a 12-token causal sequence see each other */
    maskpack_segment seg = {0, 0, 12, 0, 12};
    maskpack_span sp = {0, 3, 7};
    maskpack_rule rule = maskpack_rule_default();
    rule.spans = &sp;
    rule.n_spans = 1;
    maskpack_layout *R = roundtrip(&seg, 1, 1, 12, &rule, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0, 1);
    if (R) {
        maskpack_rule r = maskpack_layout_rule(R);
        CHECK_EQ(r.causal, 1);
        CHECK_EQ(r.n_spans, 1);
        if (r.n_spans == 1) {
            CHECK_EQ(r.spans[0].segment, 0);
            CHECK_EQ(r.spans[0].start, 3);
            CHECK_EQ(r.spans[0].end, 7);
        }
        CHECK(r.prefix == NULL);
        maskpack_layout_free(R);
    }
    /* a causal document next to a fully bidirectional one: the second becomes one span */
    maskpack_segment two[2] = {{0, 0, 4, 0, 4}, {0, 4, 5, 4, 5}};
    maskpack_span whole = {1, 0, 5};
    rule.spans = &whole;
    R = roundtrip(two, 2, 1, 10, &rule, MASKPACK_MASK_MASKED, MASKPACK_I32, 0, 1);
    if (R) {
        maskpack_rule r = maskpack_layout_rule(R);
        CHECK_EQ(r.causal, 1);
        CHECK_EQ(r.n_spans, 1);
        if (r.n_spans == 1) {
            CHECK_EQ(r.spans[0].segment, 1);
            CHECK_EQ(r.spans[0].start, 0);
            CHECK_EQ(r.spans[0].end, 5);
        }
        maskpack_layout_free(R);
    }
}

/* The same predicate in every convention and several dtypes gives the same layout. */
/* A bidirectional sliding window with bidirectional spans on top (a span row i sees
 * [min(i - wl, s), max(i + wr, e - 1)]): both sides of the window and the spans must be read at once. */
static void test_window_span(void) {
    /* the smallest case: 3 tokens, window (0, 1), span [0, 2): row 1 sees key 0 only through the span */
    maskpack_segment seg = {0, 0, 3, 0, 3};
    maskpack_span sp = {0, 0, 2};
    maskpack_rule rule = maskpack_rule_default();
    rule.causal = 0;
    rule.window_left = 0;
    rule.window_right = 1;
    rule.spans = &sp;
    rule.n_spans = 1;
    maskpack_layout *R = roundtrip(&seg, 1, 1, 3, &rule, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0, 1);
    if (R) {
        maskpack_rule r = maskpack_layout_rule(R);
        CHECK_EQ(r.causal, 0);
        CHECK_EQ(r.window_left, 0);
        CHECK_EQ(r.window_right, 1);
        CHECK_EQ(r.n_spans, 1);
        if (r.n_spans == 1) {
            CHECK_EQ(r.spans[0].start, 0);
            CHECK_EQ(r.spans[0].end, 2);
        }
        CHECK(r.prefix == NULL);
        maskpack_layout_free(R);
    }
    /* two rows: band (2, 1) with two spans in the first document, one in the second, a prefix of 2
     * in the third; every piece of the rule is visible in the mask, so it comes back as written */
    maskpack_segment segs[3] = {{0, 0, 14, 0, 14}, {1, 1, 9, 1, 9}, {1, 10, 6, 10, 6}};
    maskpack_span spans[3] = {{0, 2, 6}, {0, 8, 13}, {1, 4, 9}};
    int64_t prefix[3] = {0, 0, 2};
    rule.window_left = 2;
    rule.window_right = 1;
    rule.spans = spans;
    rule.n_spans = 3;
    rule.prefix = prefix;
    rule.n_prefix = 3;
    R = roundtrip(segs, 3, 2, 16, &rule, MASKPACK_MASK_ADDITIVE, MASKPACK_F32, -INFINITY, 1);
    if (R) {
        maskpack_rule r = maskpack_layout_rule(R);
        CHECK_EQ(r.causal, 0);
        CHECK_EQ(r.window_left, 2);
        CHECK_EQ(r.window_right, 1);
        CHECK_EQ(r.n_spans, 3);
        for (size_t k = 0; k < 3 && k < r.n_spans; k++) {
            CHECK_EQ(r.spans[k].segment, spans[k].segment);
            CHECK_EQ(r.spans[k].start, spans[k].start);
            CHECK_EQ(r.spans[k].end, spans[k].end);
        }
        CHECK(r.prefix != NULL && r.n_prefix == 3);
        if (r.prefix && r.n_prefix == 3) {
            CHECK_EQ(r.prefix[0], 0);
            CHECK_EQ(r.prefix[1], 0);
            CHECK_EQ(r.prefix[2], 2);
        }
        maskpack_layout_free(R);
    }
    /* a causal window with a span is still read as causal (window_right 0 is the causal rule) */
    rule.causal = 1;
    rule.window_left = 1;
    rule.window_right = -1;
    rule.prefix = NULL;
    rule.n_prefix = 0;
    R = roundtrip(segs, 3, 2, 16, &rule, MASKPACK_MASK_KEEP, MASKPACK_U8, 0, 1);
    if (R) {
        maskpack_rule r = maskpack_layout_rule(R);
        CHECK_EQ(r.causal, 1);
        CHECK_EQ(r.window_left, 1);
        CHECK_EQ(r.n_spans, 3);
        maskpack_layout_free(R);
    }
}

static void test_conventions(void) {
    maskpack_segment segs[3] = {{0, 1, 6, 1, 6}, {1, 0, 4, 0, 4}, {1, 4, 3, 4, 3}};
    maskpack_span sp = {0, 1, 4};
    int64_t prefix[3] = {0, 2, 0};
    maskpack_rule rule = maskpack_rule_default();
    rule.spans = &sp;
    rule.n_spans = 1;
    rule.prefix = prefix;
    rule.n_prefix = 3;
    maskpack_layout *L = layout_of(segs, 3, 2, 8, &rule);
    if (!L) return;
    uint8_t *att = att_of_layout(L, 2, 8);
    struct {
        maskpack_mask_convention conv;
        maskpack_dtype dt;
        double neg;
    } forms[] = {
        {MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0},
        {MASKPACK_MASK_MASKED, MASKPACK_I32, 0},
        {MASKPACK_MASK_KEEP, MASKPACK_U8, 0},
        {MASKPACK_MASK_KEEP, MASKPACK_I64, 0},
        {MASKPACK_MASK_KEEP, MASKPACK_F32, 0},
        {MASKPACK_MASK_MASKED, MASKPACK_F16, 0},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F32, -INFINITY},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F32, -10000.0},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F32, -FLT_MAX},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F16, -65504.0},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_BF16, -INFINITY},
        {MASKPACK_MASK_ADDITIVE, MASKPACK_F64, -DBL_MAX},
    };
    maskpack_layout *first = NULL;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        maskpack_tensor t = encode(att, 2, 1, 8, forms[f].conv, forms[f].dt, forms[f].neg);
        check_mask2d(&t, forms[f].conv, L);
        maskpack_layout *R = parse_and_match(&t, forms[f].conv, L, 1);
        if (R) {
            maskpack_rule r = maskpack_layout_rule(R);
            CHECK_EQ(r.n_spans, 1);
            CHECK(r.prefix != NULL);
            if (r.prefix) CHECK_EQ(r.prefix[1], 2);
            if (!first) {
                first = R;
            } else {
                CHECK(same_segments(first, R));
                CHECK_EQ(pred_diff(first, R, 2, 8), 0);
                maskpack_layout_free(R);
            }
        }
        free(t.data);
    }
    /* bf16's own most negative finite value, written as raw bits */
    maskpack_tensor t = encode(att, 2, 1, 8, MASKPACK_MASK_ADDITIVE, MASKPACK_BF16, -1.0);
    uint16_t *bits = t.data;
    for (int64_t k = 0; k < 2 * 8 * 8; k++)
        if (bits[k] != 0) bits[k] = 0xff7fu;
    maskpack_layout *R = parse_and_match(&t, MASKPACK_MASK_ADDITIVE, L, 1);
    maskpack_layout_free(R);
    free(t.data);
    maskpack_layout_free(first);
    free(att);
    maskpack_layout_free(L);
}

/* ---- heads and strides ----------------------------------------------------------------------- */

static void test_heads(void) {
    const int64_t B = 2, H = 3, S = 6;
    maskpack_segment segs[2] = {{0, 0, 4, 0, 4}, {1, 1, 5, 1, 5}};
    maskpack_layout *L = layout_of(segs, 2, B, S, NULL);
    if (!L) return;
    uint8_t *att = att_of_layout(L, B, S);
    maskpack_tensor t = encode(att, B, H, S, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0);
    uint8_t *d = t.data;
    maskpack_layout *R = parse_and_match(&t, MASKPACK_MASK_MASKED, L, 1);
    maskpack_layout_free(R);

    /* heads may disagree on pad query rows (row 1, query 0 is padding; key 3 is valid anyway) */
    d[((1 * H + 1) * S + 0) * S + 3] = 0;
    R = parse_and_match(&t, MASKPACK_MASK_MASKED, L, 1);
    maskpack_layout_free(R);

    /* but not on a valid row: head 2 of row 1 lets query 4 see key 5 */
    d[((1 * H + 2) * S + 4) * S + 5] = 0;
    maskpack_layout *sentinel = (maskpack_layout *)&t;
    R = sentinel;
    maskpack_error e;
    CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_MASKED, &R, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
    CHECK(R == sentinel); /* nothing written on failure */
    CHECK_EQ(e.index[0], 1);
    CHECK_EQ(e.index[1], 2);
    CHECK_EQ(e.index[2], 4);
    CHECK_EQ(e.index[3], 5);
    CHECK_MSG(e, "head 2");
    /* the 2D mask is still defined (column 5 is valid either way) */
    check_mask2d(&t, MASKPACK_MASK_MASKED, L);
    free(t.data);
    free(att);
    maskpack_layout_free(L);
}

static void test_strides(void) {
    const int64_t B = 2, S = 7;
    maskpack_segment segs[3] = {{0, 0, 3, 0, 3}, {0, 3, 3, 3, 3}, {1, 2, 5, 2, 5}};
    maskpack_rule rule = maskpack_rule_default();
    rule.window_left = 1;
    maskpack_layout *L = layout_of(segs, 3, B, S, &rule);
    if (!L) return;
    uint8_t *att = att_of_layout(L, B, S);
    maskpack_tensor t = encode(att, B, 1, S, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0);

    /* expanded head dimension: [B,4,S,S] with head stride 0 */
    maskpack_tensor x = t;
    x.shape[1] = 4;
    x.strides[1] = 0;
    maskpack_layout *R = parse_and_match(&x, MASKPACK_MASK_KEEP, L, 1);
    if (R) CHECK_EQ(maskpack_layout_rule(R).window_left, 1);
    maskpack_layout_free(R);
    check_mask2d(&x, MASKPACK_MASK_KEEP, L);

    /* a transposed view: memory holds [b][j][i], strides swap the last two dims */
    uint8_t *tr = malloc((size_t)(B * S * S));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) tr[(b * S + j) * S + i] = att[(b * S + i) * S + j];
    int64_t shape[4] = {B, 1, S, S};
    maskpack_tensor y = maskpack_tensor_contiguous(tr, MASKPACK_BOOL, 4, shape);
    y.strides[2] = 1;
    y.strides[3] = S;
    R = parse_and_match(&y, MASKPACK_MASK_KEEP, L, 1);
    maskpack_layout_free(R);
    check_mask2d(&y, MASKPACK_MASK_KEEP, L);

    /* a strided output: every other int32 of a [B, 2S] buffer */
    int32_t out[2 * 14];
    for (int k = 0; k < 28; k++) out[k] = -7;
    int64_t oshape[2] = {B, S};
    maskpack_tensor o = maskpack_tensor_contiguous(out, MASKPACK_I32, 2, oshape);
    o.strides[0] = 2 * S;
    o.strides[1] = 2;
    maskpack_error e;
    CHECK_OK(maskpack_mask2d_from_mask4d(&y, MASKPACK_MASK_KEEP, &o, &e), e);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            CHECK_EQ(out[b * 2 * S + 2 * s], maskpack_segment_of_query(L, b, s) >= 0);
            CHECK_EQ(out[b * 2 * S + 2 * s + 1], -7); /* gaps untouched */
        }
    free(tr);
    free(t.data);
    free(att);
    maskpack_layout_free(L);
}

/* ---- padding-only forms -------------------------------------------------------------------- */

static void test_padding_mask_forms(void) {
    const int64_t B = 2, S = 5;
    /* TE [B,1,1,S] MASKED: row 0 has tokens 0..2, row 1 tokens 1..4 */
    uint8_t te[10] = {0, 0, 0, 1, 1, 1, 0, 0, 0, 0};
    int64_t s4[4] = {B, 1, 1, S};
    maskpack_tensor t = maskpack_tensor_contiguous(te, MASKPACK_BOOL, 4, s4);
    uint8_t out[10];
    int64_t os[2] = {B, S};
    maskpack_tensor o = maskpack_tensor_contiguous(out, MASKPACK_BOOL, 2, os);
    maskpack_error e;
    CHECK_OK(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_MASKED, &o, &e), e);
    for (int k = 0; k < 10; k++) CHECK_EQ(out[k], !te[k]);

    /* [B,S] KEEP int32 read through a transposed view of an [S,B] buffer */
    int32_t keep_t[10]; /* keep_t[s*B + b] */
    int32_t keep[10] = {1, 1, 1, 0, 0, 0, 1, 1, 1, 1};
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) keep_t[s * B + b] = keep[b * S + s];
    int64_t s2[2] = {B, S};
    maskpack_tensor k2 = maskpack_tensor_contiguous(keep_t, MASKPACK_I32, 2, s2);
    k2.strides[0] = 1;
    k2.strides[1] = B;
    int64_t out64[10];
    maskpack_tensor o64 = maskpack_tensor_contiguous(out64, MASKPACK_I64, 2, os);
    CHECK_OK(maskpack_mask2d_from_mask4d(&k2, MASKPACK_MASK_KEEP, &o64, &e), e);
    for (int k = 0; k < 10; k++) CHECK_EQ(out64[k], keep[k]);

    /* a layout cannot be recovered from a padding-only mask */
    maskpack_layout *R = NULL;
    CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_MASKED, &R, &e), MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_MSG(e, "Sq = 1");
    CHECK(R == NULL);
    CHECK_STATUS(maskpack_layout_from_mask4d(&k2, MASKPACK_MASK_KEEP, &R, &e), MASKPACK_ERR_SHAPE, e);
    /* wrong output shape or dtype */
    int64_t bad[2] = {B, S + 1};
    maskpack_tensor ob = maskpack_tensor_contiguous(out, MASKPACK_BOOL, 2, bad);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_MASKED, &ob, &e), MASKPACK_ERR_SHAPE, e);
    float of[10];
    maskpack_tensor obf = maskpack_tensor_contiguous(of, MASKPACK_F32, 2, os);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_MASKED, &obf, &e), MASKPACK_ERR_DTYPE, e);
    /* [B,1,3,S]: neither square nor a padding row */
    int64_t s43[4] = {1, 1, 3, 5};
    uint8_t z[15] = {0};
    maskpack_tensor t3 = maskpack_tensor_contiguous(z, MASKPACK_BOOL, 4, s43);
    int64_t os1[2] = {1, 5};
    maskpack_tensor o1 = maskpack_tensor_contiguous(out, MASKPACK_BOOL, 2, os1);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t3, MASKPACK_MASK_MASKED, &o1, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_STATUS(maskpack_layout_from_mask4d(&t3, MASKPACK_MASK_MASKED, &R, &e), MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_MSG(e, "Sq = 3, Skv = 5");
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void test_not_representable(void) {
    maskpack_error e;
    maskpack_layout *R = NULL;
    /* a random sparse pattern (every token sees itself, so every column is valid) */
    {
        const int64_t S = 10;
        uint8_t att[100];
        test_rng r = {0x9e3779b97f4a7c15ull};
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) att[i * S + j] = (uint8_t)(i == j || test_rng_below(&r, 3) == 0);
        maskpack_tensor t = encode(att, 1, 1, S, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0);
        CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, &R, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK(R == NULL);
        CHECK_EQ(e.index[0], 0);
        CHECK_EQ(e.index[1], 0);
        CHECK(e.index[2] >= 0 && e.index[2] < S && e.index[3] >= 0 && e.index[3] < S);
        CHECK(strlen(e.message) > 20);
        free(t.data);
    }
    /* a query sees a key of another document: documents [0,3) and [3,7), query 6 sees key 1 */
    {
        maskpack_segment segs[2] = {{0, 0, 3, 0, 3}, {0, 3, 4, 3, 4}};
        maskpack_layout *L = layout_of(segs, 2, 1, 8, NULL);
        uint8_t *att = att_of_layout(L, 1, 8);
        att[6 * 8 + 1] = 1;
        maskpack_tensor t = encode(att, 1, 1, 8, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0);
        CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_MASKED, &R, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "not block-diagonal");
        CHECK_EQ(e.index[0], 0);
        CHECK_EQ(e.index[2], 6);
        CHECK_EQ(e.index[3], 1);
        free(t.data);
        /* same with padding between the documents */
        maskpack_segment segp[2] = {{0, 0, 3, 0, 3}, {0, 4, 4, 4, 4}};
        maskpack_layout *L2 = layout_of(segp, 2, 1, 8, NULL);
        uint8_t *att2 = att_of_layout(L2, 1, 8);
        att2[6 * 8 + 1] = 1;
        t = encode(att2, 1, 1, 8, MASKPACK_MASK_KEEP, MASKPACK_U8, 0);
        CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, &R, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "not block-diagonal");
        CHECK_EQ(e.index[2], 6);
        CHECK_EQ(e.index[3], 1);
        free(t.data);
        free(att2);
        maskpack_layout_free(L2);
        free(att);
        maskpack_layout_free(L);
    }
    /* a causal query that sees one later key */
    {
        maskpack_segment seg = {0, 0, 8, 0, 8};
        maskpack_layout *L = layout_of(&seg, 1, 1, 8, NULL);
        uint8_t *att = att_of_layout(L, 1, 8);
        att[5 * 8 + 7] = 1;
        maskpack_tensor t = encode(att, 1, 1, 8, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0);
        CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, &R, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_EQ(e.index[2], 5);
        CHECK_EQ(e.index[3], 7);
        CHECK_MSG(e, "not a bidirectional span");
        free(t.data);
        /* a window with one row reaching too far */
        maskpack_rule rule = maskpack_rule_default();
        rule.window_left = 1;
        maskpack_layout *W = layout_of(&seg, 1, 1, 8, &rule);
        uint8_t *aw = att_of_layout(W, 1, 8);
        aw[6 * 8 + 3] = 1;
        t = encode(aw, 1, 1, 8, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0);
        CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, &R, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_EQ(e.index[0], 0); /* the majority window is 1: the outlier row is named */
        CHECK_EQ(e.index[2], 6);
        CHECK_EQ(e.index[3], 3);
        free(t.data);
        free(aw);
        maskpack_layout_free(W);
        /* a valid token (later queries see it) whose own row sees nothing */
        uint8_t *a2 = att_of_layout(L, 1, 8);
        memset(a2 + 3 * 8, 0, 8);
        t = encode(a2, 1, 1, 8, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0);
        CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_MASKED, &R, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_EQ(e.index[2], 3);
        CHECK_MSG(e, "attends no key");
        free(t.data);
        free(a2);
        /* while a last token nobody sees is padding: still representable */
        a2 = att_of_layout(L, 1, 8);
        memset(a2 + 7 * 8, 0, 8);
        t = encode(a2, 1, 1, 8, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0);
        CHECK_OK(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_MASKED, &R, &e), e);
        if (R) CHECK_EQ(maskpack_layout_n_tokens(R), 7);
        maskpack_layout_free(R);
        R = NULL;
        free(t.data);
        free(a2);
        free(att);
        maskpack_layout_free(L);
    }
}

static void test_values(void) {
    maskpack_error e;
    maskpack_layout *R = NULL;
    const int64_t B = 2, S = 5;
    maskpack_segment segs[2] = {{0, 0, 5, 0, 5}, {1, 0, 3, 0, 3}};
    maskpack_layout *L = layout_of(segs, 2, B, S, NULL);
    uint8_t *att = att_of_layout(L, B, S);
    uint8_t out[10];
    int64_t os[2] = {B, S};
    maskpack_tensor o = maskpack_tensor_contiguous(out, MASKPACK_U8, 2, os);

    /* 2 in a MASKED int mask */
    maskpack_tensor t = encode(att, B, 1, S, MASKPACK_MASK_MASKED, MASKPACK_I32, 0);
    ((int32_t *)t.data)[(1 * S + 3) * S + 4] = 2;
    memset(out, 0xAB, sizeof out);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_MASKED, &o, &e), MASKPACK_ERR_VALUE, e);
    CHECK_EQ(e.index[0], 1);
    CHECK_EQ(e.index[1], 0);
    CHECK_EQ(e.index[2], 3);
    CHECK_EQ(e.index[3], 4);
    CHECK_MSG(e, "found 2");
    for (int k = 0; k < 10; k++) CHECK_EQ(out[k], 0xAB); /* nothing written */
    CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_MASKED, &R, &e), MASKPACK_ERR_VALUE, e);
    CHECK_EQ(e.index[3], 4);
    CHECK(R == NULL);
    /* -1 (what ~0 gives on an int mask) is rejected too */
    ((int32_t *)t.data)[(1 * S + 3) * S + 4] = -1;
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_MASKED, &o, &e), MASKPACK_ERR_VALUE, e);
    CHECK_MSG(e, "found -1");
    free(t.data);

    /* additive: positive and NaN values are not biases */
    t = encode(att, B, 1, S, MASKPACK_MASK_ADDITIVE, MASKPACK_F32, -INFINITY);
    ((float *)t.data)[(0 * S + 2) * S + 1] = 1.0f;
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_ADDITIVE, &o, &e), MASKPACK_ERR_VALUE, e);
    CHECK_EQ(e.index[2], 2);
    CHECK_EQ(e.index[3], 1);
    ((float *)t.data)[(0 * S + 2) * S + 1] = NAN;
    CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_ADDITIVE, &R, &e), MASKPACK_ERR_VALUE, e);
    /* a 0/1 float mask is not an additive one either, but a KEEP float with 0.5 is a value error */
    free(t.data);
    t = encode(att, B, 1, S, MASKPACK_MASK_KEEP, MASKPACK_F32, 0);
    ((float *)t.data)[3] = 0.5f;
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_KEEP, &o, &e), MASKPACK_ERR_VALUE, e);
    CHECK_EQ(e.index[3], 3);
    free(t.data);

    /* ADDITIVE needs a float dtype; conventions must be known */
    t = encode(att, B, 1, S, MASKPACK_MASK_KEEP, MASKPACK_I32, 0);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_ADDITIVE, &o, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_ADDITIVE, &R, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, (maskpack_mask_convention)7, &o, &e), MASKPACK_ERR_CONVENTION, e);
    CHECK_STATUS(maskpack_layout_from_mask4d(NULL, MASKPACK_MASK_KEEP, &R, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_KEEP, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    free(t.data);

    /* the integer pitfall: int64 / int8 masks of 0 and 1; 1 means exactly what the convention says */
    t = encode(att, B, 1, S, MASKPACK_MASK_MASKED, MASKPACK_I64, 0);
    check_mask2d(&t, MASKPACK_MASK_MASKED, L);
    R = parse_and_match(&t, MASKPACK_MASK_MASKED, L, 1);
    maskpack_layout_free(R);
    /* read with the wrong convention, the same integers are another mask entirely */
    R = NULL;
    maskpack_status s = maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, &R, &e);
    if (s == MASKPACK_OK) CHECK(pred_diff(R, L, B, S) > 0);
    maskpack_layout_free(R);
    /* as a KEEP mask, key 0 is attended by nobody (the causal MASKED value of (i, 0) is 0) */
    CHECK_OK(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_KEEP, &o, &e), e);
    CHECK_EQ(out[0], 0);
    CHECK_OK(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_MASKED, &o, &e), e);
    CHECK_EQ(out[0], 1);
    CHECK_EQ(out[1 * S + 4], 0);
    free(t.data);
    t = encode(att, B, 1, S, MASKPACK_MASK_KEEP, MASKPACK_I8, 0);
    check_mask2d(&t, MASKPACK_MASK_KEEP, L);
    R = parse_and_match(&t, MASKPACK_MASK_KEEP, L, 1);
    maskpack_layout_free(R);
    /* row 1's pad column 4 must read as padding: 1 = attend in KEEP */
    CHECK_OK(maskpack_mask2d_from_mask4d(&t, MASKPACK_MASK_KEEP, &o, &e), e);
    CHECK_EQ(out[1 * S + 4], 0);
    CHECK_EQ(out[1 * S + 2], 1);
    free(t.data);

    /* empty inputs */
    int64_t z4[4] = {0, 1, 0, 0};
    maskpack_tensor tz = maskpack_tensor_contiguous(NULL, MASKPACK_BOOL, 4, z4);
    R = NULL;
    CHECK_OK(maskpack_layout_from_mask4d(&tz, MASKPACK_MASK_KEEP, &R, &e), e);
    if (R) CHECK_EQ(maskpack_layout_n_segments(R), 0);
    maskpack_layout_free(R);
    free(att);
    maskpack_layout_free(L);
}

/* All-pad rows and a fully masked batch are fine. */
static void test_empty_rows(void) {
    maskpack_segment seg = {1, 2, 3, 2, 3};
    maskpack_rule rule = maskpack_rule_default();
    rule.causal = 0;
    maskpack_layout *R = roundtrip(&seg, 1, 3, 6, &rule, MASKPACK_MASK_MASKED, MASKPACK_BOOL, 0, 1);
    if (R) CHECK_EQ(maskpack_layout_n_segments(R), 1);
    maskpack_layout_free(R);
    R = roundtrip(NULL, 0, 2, 4, NULL, MASKPACK_MASK_ADDITIVE, MASKPACK_F32, -INFINITY, 1);
    if (R) CHECK_EQ(maskpack_layout_n_tokens(R), 0);
    maskpack_layout_free(R);
}

/* ---- round-trip property ------------------------------------------------------------------- */

static void test_roundtrip_property(void) {
    test_rng r = {0x243f6a8885a308d3ull};
    int failures = 0;
    for (int iter = 0; iter < 200; iter++) {
        int64_t B = 1 + test_rng_below(&r, 3), S = 1 + test_rng_below(&r, 24);
        maskpack_segment segs[128];
        size_t n = 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t col = 0;
            while (col < S && n < 120) {
                if (test_rng_below(&r, 4) == 0) col += 1 + test_rng_below(&r, 2); /* padding */
                if (col > S) col = S;
                int64_t room = S - col;
                int64_t len = test_rng_below(&r, 3) == 0 ? test_rng_below(&r, 2)
                                                         : test_rng_below(&r, room + 1); /* often 0 or 1 */
                if (len > room) len = room;
                maskpack_segment g = {b, col, len, col, len};
                segs[n++] = g;
                col += len;
                if (len == 0 && test_rng_below(&r, 2)) col++; /* avoid endless empty segments */
            }
        }
        maskpack_rule rule = maskpack_rule_default();
        rule.causal = (int)test_rng_below(&r, 3) != 0;
        if (test_rng_below(&r, 3) == 0) rule.window_left = test_rng_below(&r, 5);
        if (!rule.causal && test_rng_below(&r, 2)) rule.window_right = test_rng_below(&r, 5);
        int64_t prefix[128];
        if (test_rng_below(&r, 3) == 0) {
            for (size_t k = 0; k < n; k++) prefix[k] = test_rng_below(&r, segs[k].q_len + 1);
            rule.prefix = prefix;
            rule.n_prefix = n;
        }
        /* spans on every rule: HF's overlay on a causal one, and on top of a bidirectional window */
        maskpack_span spans[256];
        size_t ns = 0;
        if (test_rng_below(&r, 2)) {
            for (size_t k = 0; k < n; k++) {
                int64_t at = 0, len = segs[k].q_len;
                while (at < len && ns < 250) {
                    at += test_rng_below(&r, 4);
                    if (at >= len) break;
                    int64_t end = at + 1 + test_rng_below(&r, len - at);
                    if (test_rng_below(&r, 2)) {
                        maskpack_span sp = {(int64_t)k, at, end};
                        spans[ns++] = sp;
                    }
                    at = end;
                }
            }
            rule.spans = spans;
            rule.n_spans = ns;
        }
        maskpack_layout *L = NULL;
        maskpack_error e;
        CHECK_OK(maskpack_layout_from_segments(segs, n, B, S, S, 0, &rule, &L, &e), e);
        if (!L) continue;

        uint8_t *att = att_of_layout(L, B, S);
        int form = (int)test_rng_below(&r, 3);
        maskpack_mask_convention conv = form == 0   ? MASKPACK_MASK_KEEP
                                        : form == 1 ? MASKPACK_MASK_MASKED
                                                    : MASKPACK_MASK_ADDITIVE;
        maskpack_dtype dt = form == 0 ? MASKPACK_BOOL : form == 1 ? MASKPACK_U8 : MASKPACK_F32;
        maskpack_tensor t = encode(att, B, 1, S, conv, dt, -INFINITY);
        if (test_rng_below(&r, 2)) { /* broadcast heads */
            t.shape[1] = 1 + test_rng_below(&r, 3);
            t.strides[1] = 0;
        }
        maskpack_layout *R = NULL;
        maskpack_status s = maskpack_layout_from_mask4d(&t, conv, &R, &e);
        CHECK_OK(s, e);
        if (R) {
            int64_t d = pred_diff(R, L, B, S);
            CHECK_EQ(d, 0);
            CHECK_EQ(maskpack_layout_n_tokens(R), maskpack_layout_n_tokens(L));
            if (d) s = MASKPACK_ERR_NOT_REPRESENTABLE;
        }
        check_mask2d(&t, conv, L);
        if (s != MASKPACK_OK && failures++ < 3) {
            maskpack_rule q = maskpack_layout_rule(L);
            fprintf(stderr, "  iter %d: B=%lld S=%lld causal=%d window=(%lld,%lld) spans=%zu prefix=%s\n", iter,
                    (long long)B, (long long)S, q.causal, (long long)q.window_left, (long long)q.window_right,
                    q.n_spans, q.prefix ? "yes" : "no");
            for (size_t k = 0; k < n; k++)
                fprintf(stderr, "    seg %zu: row %lld [%lld, +%lld) prefix %lld\n", k, (long long)segs[k].row,
                        (long long)segs[k].q_start, (long long)segs[k].q_len, (long long)(q.prefix ? q.prefix[k] : 0));
            for (size_t k = 0; k < q.n_spans; k++)
                fprintf(stderr, "    span seg %lld [%lld, %lld)\n", (long long)q.spans[k].segment,
                        (long long)q.spans[k].start, (long long)q.spans[k].end);
        }
        maskpack_layout_free(R);
        free(t.data);
        free(att);
        maskpack_layout_free(L);
    }
}

/* Perturbed masks: flip a few cells of a rendered layout. Whatever comes back must be exact: either
 * a layout whose predicate equals the mask on every valid query row (valid = key column attended by
 * someone), or NOT_REPRESENTABLE naming a valid query row of the mask. */
static void test_perturbed_property(void) {
    test_rng r = {0x13198a2e03707344ull};
    int ok = 0, refused = 0;
    for (int iter = 0; iter < 300; iter++) {
        int64_t B = 1 + test_rng_below(&r, 2), S = 2 + test_rng_below(&r, 14);
        maskpack_segment segs[64];
        size_t n = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t col = test_rng_below(&r, 2); col < S && n < 60;) {
                int64_t len = 1 + test_rng_below(&r, S - col);
                maskpack_segment g = {b, col, len, col, len};
                segs[n++] = g;
                col += len + test_rng_below(&r, 2);
            }
        maskpack_rule rule = maskpack_rule_default();
        rule.causal = (int)test_rng_below(&r, 3) != 0;
        if (test_rng_below(&r, 3) == 0) rule.window_left = test_rng_below(&r, 4);
        maskpack_layout *L = layout_of(segs, n, B, S, &rule);
        if (!L) continue;
        uint8_t *att = att_of_layout(L, B, S);
        int flips = 1 + (int)test_rng_below(&r, 2);
        for (int f = 0; f < flips; f++) {
            int64_t b = test_rng_below(&r, B), i = test_rng_below(&r, S), j = test_rng_below(&r, S);
            att[(b * S + i) * S + j] ^= 1;
        }
        uint8_t *valid = calloc((size_t)(B * S), 1);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < S; i++)
                for (int64_t j = 0; j < S; j++) valid[b * S + j] |= att[(b * S + i) * S + j];
        maskpack_tensor t = encode(att, B, 1, S, MASKPACK_MASK_KEEP, MASKPACK_BOOL, 0);
        maskpack_layout *R = NULL;
        maskpack_error e;
        maskpack_status s = maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, &R, &e);
        CHECK(s == MASKPACK_OK || s == MASKPACK_ERR_NOT_REPRESENTABLE);
        if (s == MASKPACK_OK && R) {
            ok++;
            int64_t bad = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < S; i++) {
                    CHECK_EQ(maskpack_segment_of_query(R, b, i) >= 0, valid[b * S + i]);
                    if (!valid[b * S + i]) continue;
                    for (int64_t j = 0; j < S; j++) bad += maskpack_allowed(R, b, 0, i, j) != att[(b * S + i) * S + j];
                }
            CHECK_EQ(bad, 0);
        } else if (s == MASKPACK_ERR_NOT_REPRESENTABLE) {
            refused++;
            CHECK(e.index[0] >= 0 && e.index[0] < B && e.index[2] >= 0 && e.index[2] < S);
            if (e.index[0] >= 0 && e.index[0] < B && e.index[2] >= 0 && e.index[2] < S)
                CHECK(valid[e.index[0] * S + e.index[2]]);
            CHECK(e.index[3] >= 0 && e.index[3] < S);
            CHECK(strlen(e.message) > 20);
        }
        maskpack_layout_free(R);
        free(t.data);
        free(valid);
        free(att);
        maskpack_layout_free(L);
    }
    /* both outcomes must actually occur for the property to mean something */
    CHECK(ok > 10);
    CHECK(refused > 10);
}

/* ---- exhaustive small layouts ------------------------------------------------------------- */

/* The contract on every small case: a mask rendered from a layout comes back as a layout with the
 * same predicate on every cell. Packed rows of one or two segments of length 1-6, causal or not,
 * every window -1..3 on each side, no span / every single span / every pair of spans, no prefix /
 * every per-segment prefix. A causal rule only gets window_right -1: under j <= i a right window
 * (>= 0) removes nothing, so the other values would repeat the same masks. To keep the loop a few
 * seconds long, two-segment layouts take the full product of prefixes only without spans; with one
 * span each segment's prefix runs through every value while the other's is 0, and with two spans
 * there is no prefix (one-segment layouts get every combination). */
typedef struct exh_stats {
    int64_t cases, failures;
} exh_stats;

static void exh_one(const int64_t *len, size_t nseg, const maskpack_rule *rule, exh_stats *st) {
    maskpack_segment segs[2];
    int64_t S = 0;
    for (size_t k = 0; k < nseg; k++) {
        maskpack_segment g = {0, S, len[k], S, len[k]};
        segs[k] = g;
        S += len[k];
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_status s = maskpack_layout_from_segments(segs, nseg, 1, S, S, 1, rule, &L, &e);
    CHECK_OK(s, e);
    if (s) return;
    uint8_t att[12 * 12];
    for (int64_t i = 0; i < S; i++)
        for (int64_t j = 0; j < S; j++) att[i * S + j] = (uint8_t)maskpack_allowed(L, 0, 0, i, j);
    int64_t shape[4] = {1, 1, S, S};
    maskpack_tensor t = maskpack_tensor_contiguous(att, MASKPACK_BOOL, 4, shape);
    maskpack_layout *R = NULL;
    s = maskpack_layout_from_mask4d(&t, MASKPACK_MASK_KEEP, &R, &e);
    int64_t bad = 0, bi = -1, bj = -1;
    if (s == MASKPACK_OK)
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++)
                if (maskpack_allowed(R, 0, 0, i, j) != att[i * S + j] && bad++ == 0) {
                    bi = i;
                    bj = j;
                }
    st->cases++;
    if (s != MASKPACK_OK || bad) {
        if (st->failures++ < 5) {
            fprintf(stderr, "  exhaustive: lengths");
            for (size_t k = 0; k < nseg; k++) fprintf(stderr, " %lld", (long long)len[k]);
            fprintf(stderr, " causal=%d window=(%lld,%lld) spans", rule->causal, (long long)rule->window_left,
                    (long long)rule->window_right);
            for (size_t k = 0; k < rule->n_spans; k++)
                fprintf(stderr, " (%lld,%lld,%lld)", (long long)rule->spans[k].segment, (long long)rule->spans[k].start,
                        (long long)rule->spans[k].end);
            fprintf(stderr, " prefix");
            for (size_t k = 0; k < rule->n_prefix; k++) fprintf(stderr, " %lld", (long long)rule->prefix[k]);
            if (s != MASKPACK_OK)
                fprintf(stderr, ": %s: %s\n", maskpack_status_name(s), e.message);
            else
                fprintf(stderr, ": recovered predicate differs at (%lld, %lld) (%lld cells)\n", (long long)bi,
                        (long long)bj, (long long)bad);
        }
    }
    maskpack_layout_free(R);
    maskpack_layout_free(L);
}

enum { EXH_NO_PREFIX = 0, EXH_EACH_PREFIX = 1, EXH_ALL_PREFIXES = 2 };

/* Runs the prefix choices over one rule and span list: none, then (EXH_ALL_PREFIXES) every
 * per-segment vector, or (EXH_EACH_PREFIX) every value of one segment's prefix, the others 0. */
static void exh_prefixes(const int64_t *len, size_t nseg, maskpack_rule *rule, int which, exh_stats *st) {
    rule->prefix = NULL;
    rule->n_prefix = 0;
    exh_one(len, nseg, rule, st);
    if (which == EXH_NO_PREFIX) return;
    int64_t pre[2] = {0, 0};
    rule->prefix = pre;
    rule->n_prefix = nseg;
    if (which == EXH_EACH_PREFIX) {
        for (size_t k = 0; k < nseg; k++) {
            for (pre[k] = k == 0 ? 0 : 1; pre[k] <= len[k]; pre[k]++) exh_one(len, nseg, rule, st);
            pre[k] = 0;
        }
    } else {
        for (;;) {
            exh_one(len, nseg, rule, st);
            size_t k = 0; /* next vector, odometer style */
            while (k < nseg && pre[k] == len[k]) pre[k++] = 0;
            if (k == nseg) break;
            pre[k]++;
        }
    }
    rule->prefix = NULL;
    rule->n_prefix = 0;
}

static void test_exhaustive_small(void) {
    exh_stats st = {0, 0};
    for (size_t nseg = 1; nseg <= 2; nseg++)
        for (int64_t l0 = 1; l0 <= 6; l0++)
            for (int64_t l1 = 1; l1 <= (nseg == 2 ? 6 : 1); l1++) {
                int64_t len[2] = {l0, l1};
                int64_t maxlen = nseg == 2 && l1 > l0 ? l1 : l0;
                /* every span of the layout, sorted by (segment, start) */
                maskpack_span all[2 * 21];
                size_t na = 0;
                for (size_t k = 0; k < nseg; k++)
                    for (int64_t a = 0; a < len[k]; a++)
                        for (int64_t b = a + 1; b <= len[k]; b++) {
                            maskpack_span sp = {(int64_t)k, a, b};
                            all[na++] = sp;
                        }
                for (int causal = 0; causal <= 1; causal++)
                    for (int64_t wl = -1; wl <= 3; wl++)
                        for (int64_t wr = -1; wr <= (causal ? -1 : 3); wr++) {
                            /* a window of at least the longest segment's length - 1 draws the same
                             * mask as an unbounded one: that mask is already covered */
                            if ((wl >= 0 && wl >= maxlen - 1) || (wr >= 0 && wr >= maxlen - 1)) continue;
                            maskpack_rule rule = maskpack_rule_default();
                            rule.causal = causal;
                            rule.window_left = wl;
                            rule.window_right = wr;
                            exh_prefixes(len, nseg, &rule, EXH_ALL_PREFIXES, &st);
                            for (size_t x = 0; x < na; x++) {
                                rule.spans = &all[x];
                                rule.n_spans = 1;
                                exh_prefixes(len, nseg, &rule, nseg == 1 ? EXH_ALL_PREFIXES : EXH_EACH_PREFIX, &st);
                                for (size_t y = x + 1; y < na; y++) {
                                    if (all[y].segment == all[x].segment && all[y].start < all[x].end) continue;
                                    maskpack_span two[2] = {all[x], all[y]};
                                    rule.spans = two;
                                    rule.n_spans = 2;
                                    exh_prefixes(len, nseg, &rule, nseg == 1 ? EXH_ALL_PREFIXES : EXH_NO_PREFIX, &st);
                                }
                            }
                        }
            }
    fprintf(stderr, "  exhaustive: %lld layouts, %lld not recovered\n", (long long)st.cases, (long long)st.failures);
    CHECK(st.cases > 300000);
    CHECK_EQ(st.failures, 0);
}

/* ---- 4D masks: the shape, convention and value checks of both readers ---------------------------------- */

static void expect_m4(const maskpack_tensor *t, maskpack_mask_convention conv, int square, maskpack_status want,
                      const char *fragment) {
    maskpack_error e;
    if (square) {
        maskpack_layout *L = NULL;
        CHECK_STATUS(maskpack_layout_from_mask4d(t, conv, &L, &e), want, e);
        CHECK(L == NULL);
    } else {
        static uint8_t keep[64];
        const int64_t ks[2] = {t->shape[0], t->shape[t->ndim - 1]};
        maskpack_tensor k = maskpack_tensor_contiguous(keep, MASKPACK_U8, 2, ks);
        CHECK_STATUS(maskpack_mask2d_from_mask4d(t, conv, &k, &e), want, e);
    }
    CHECK_MSG(e, fragment);
}

static void test_mask4d_checks(void) {
    static int32_t mi[64];
    static float mf[64];
    const int64_t s3[3] = {1, 4, 4}, s4[4] = {1, 1, 4, 4}, h0[4] = {1, 0, 4, 4}, q2[4] = {1, 1, 2, 4}, s2[2] = {1, 4};
    maskpack_tensor t3 = maskpack_tensor_contiguous(mi, MASKPACK_I32, 3, s3);
    expect_m4(&t3, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_SHAPE,
              "layout recovery needs a [B,1,S,S] or [B,H,S,S] mask, found 3");
    expect_m4(&t3, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_SHAPE,
              "expected [B,1,S,S], [B,H,S,S], [B,1,1,S] or [B,S], found 3");
    maskpack_tensor t4 = maskpack_tensor_contiguous(mi, MASKPACK_I32, 4, s4);
    expect_m4(&t4, (maskpack_mask_convention)7, 1, MASKPACK_ERR_CONVENTION,
              "convention: expected KEEP (0), MASKED (1) or ADDITIVE (2), found 7");
    expect_m4(&t4, MASKPACK_MASK_ADDITIVE, 0, MASKPACK_ERR_DTYPE, "an ADDITIVE mask needs a float dtype");
    maskpack_tensor th = maskpack_tensor_contiguous(mi, MASKPACK_I32, 4, h0);
    expect_m4(&th, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_SHAPE, "expected at least one head (dimension 1), found 0");
    maskpack_tensor tq = maskpack_tensor_contiguous(mi, MASKPACK_I32, 4, q2);
    expect_m4(&tq, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_UNSUPPORTED, "found Sq = 2, Skv = 4");
    expect_m4(&tq, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_SHAPE, "query dimension S or 1), found Sq = 2 with Skv = 4");
    /* values: each convention names what it accepts and the element that is not */
    for (int i = 0; i < 16; i++) mi[i] = 0, mf[i] = 0.0f;
    mi[1] = 2;
    expect_m4(&t4, MASKPACK_MASK_MASKED, 1, MASKPACK_ERR_VALUE,
              "mask[0, 0, 0, 1]: expected 0 or 1 in a MASKED mask (1 = excluded), found 2");
    expect_m4(&t4, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_VALUE, "expected 0 or 1 in a KEEP mask (1 = attend), found 2");
    maskpack_tensor t2 = maskpack_tensor_contiguous(mi, MASKPACK_I32, 2, s2);
    expect_m4(&t2, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_VALUE, "mask[0, 1]: expected 0 or 1 in a KEEP mask");
    mf[2] = 0.5f;
    maskpack_tensor f4 = maskpack_tensor_contiguous(mf, MASKPACK_F32, 4, s4);
    expect_m4(&f4, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_VALUE,
              "expected exactly 0 or 1 in a KEEP mask of dtype float32, found 0.5");
    mf[2] = 1.0f;
    expect_m4(&f4, MASKPACK_MASK_ADDITIVE, 1, MASKPACK_ERR_VALUE,
              "expected 0 (attend) or a negative value (excluded) in an ADDITIVE mask, found 1");
}

int main(void) {
    test_padding_forms();
    test_packed_documents();
    test_bidirectional();
    test_sliding_window();
    test_prefix_lm();
    test_vlm_span();
    test_window_span();
    test_conventions();
    test_heads();
    test_strides();
    test_padding_mask_forms();
    test_not_representable();
    test_values();
    test_mask4d_checks();
    test_empty_rows();
    test_roundtrip_property();
    test_perturbed_property();
    test_exhaustive_small();
    return check_report("test_mask4d");
}
