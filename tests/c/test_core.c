/* test_core.c: version, status table, tensor helpers, layout validation and the reference predicate;
 * half-precision conversion over every f16 value (subnormals included) against a decoding written
 * here, f32 -> f16 rounding of subnormal results against round-to-nearest-even in double, the element
 * readers and writers, and the segment and rule checks of maskpack_layout_from_segments. */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdatomic.h>
#include <time.h>
#include <stdlib.h>

static void test_version_and_status(void) {
    CHECK_EQ(maskpack_version_number(), MASKPACK_VERSION_NUMBER);
    CHECK(strcmp(maskpack_version_string(), MASKPACK_VERSION_STRING) == 0);
    for (int s = 0; s < MASKPACK_STATUS_COUNT_; s++) {
        CHECK(strncmp(maskpack_status_name((maskpack_status)s), "MASKPACK_", 9) == 0);
        CHECK(strlen(maskpack_status_message((maskpack_status)s)) > 5);
    }
    CHECK(strcmp(maskpack_status_name((maskpack_status)999), "MASKPACK_ERR_UNKNOWN") == 0);
    CHECK(strcmp(maskpack_status_name(MASKPACK_ERR_HOLE), "MASKPACK_ERR_HOLE") == 0);
    CHECK_EQ(maskpack_dtype_size(MASKPACK_BF16), 2);
    CHECK_EQ(maskpack_dtype_size(MASKPACK_I64), 8);
    CHECK_EQ(maskpack_dtype_size((maskpack_dtype)77), 0);
    CHECK(strcmp(maskpack_dtype_name(MASKPACK_I32), "int32") == 0);
}

static void test_half_conversions(void) {
    float vals[] = {0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, -3.0e38f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        float v = vals[i];
        float bf = mp_bf16_to_f32(mp_f32_to_bf16(v));
        CHECK(fabsf(bf - v) <= fabsf(v) * 0.01f);
    }
    /* bf16 rounds to nearest, ties to even, bit for bit: a truncating conversion (or ties away
     * from zero) is off by one unit in the last place on these. 1 + 2^-8 is halfway between 1 and
     * 1 + 2^-7 (even: down), 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (even: up), and
     * anything above a half goes up. */
    CHECK_EQ(mp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    CHECK_EQ(mp_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    CHECK_EQ(mp_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CHECK_EQ(mp_f32_to_bf16(-(1.0f + 0x1p-8f + 0x1p-20f)), 0xbf81);
    CHECK_EQ(mp_f32_to_bf16(0x1.fffffep127f), 0x7f80); /* rounds up into infinity, as the hardware */
    /* every sign, exponent and a spread of mantissas against an independent reference: the two
     * bf16 neighbours of x (truncated and one up), the nearer in double precision, ties to even */
    int bad = 0;
    test_rng st = {0x9e3779b97f4a7c15ull};
    for (int n = 0; n < 200000; n++) {
        uint32_t x = (uint32_t)test_rng_next(&st);
        if ((x & 0x7f800000u) == 0x7f800000u) continue; /* inf / NaN: checked below */
        float f;
        memcpy(&f, &x, 4);
        uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
        float flo, fhi;
        memcpy(&flo, &lo, 4);
        memcpy(&fhi, &hi, 4);
        if ((hi & 0x7f800000u) == 0x7f800000u) continue; /* rounding into infinity: checked above */
        double dlo = fabs((double)f - flo), dhi = fabs((double)f - fhi);
        uint16_t want = (uint16_t)((dlo < dhi || (dlo == dhi && !((lo >> 16) & 1u))) ? lo >> 16 : hi >> 16);
        if (mp_f32_to_bf16(f) != want && bad++ < 5)
            fprintf(stderr, "  bf16(%a) = %04x, want %04x\n", (double)f, mp_f32_to_bf16(f), want);
    }
    CHECK_EQ(bad, 0);
    CHECK(mp_f16_to_f32(mp_f32_to_f16(65504.0f)) == 65504.0f);
    CHECK(isinf(mp_f16_to_f32(mp_f32_to_f16(1e6f))));
    CHECK(isinf(mp_bf16_to_f32(mp_f32_to_bf16(-INFINITY))));
    CHECK(mp_f16_to_f32(mp_f32_to_f16(-INFINITY)) < 0);
    CHECK(isnan(mp_f16_to_f32(mp_f32_to_f16(NAN))));
    /* bf16 of the most negative finite float rounds to bf16's own minimum, still finite */
    CHECK(isfinite(mp_bf16_to_f32(0xff7fu)));
}

static void test_tensor_checks(void) {
    maskpack_error e;
    int32_t buf[6];
    int64_t shape[2] = {2, 3};
    maskpack_tensor t = maskpack_tensor_contiguous(buf, MASKPACK_I32, 2, shape);
    CHECK_EQ(t.strides[0], 3);
    CHECK_EQ(t.strides[1], 1);
    CHECK_OK(mp_check_tensor(&t, "x", 2, 2, &e), e);
    CHECK_STATUS(mp_check_tensor(&t, "x", 1, 1, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "x: expected 1 dimensions, found 2");
    t.shape[0] = -1;
    CHECK_STATUS(mp_check_tensor(&t, "x", 2, 2, &e), MASKPACK_ERR_SHAPE, e);
    t.shape[0] = INT64_MAX / 2;
    CHECK_STATUS(mp_check_tensor(&t, "x", 2, 2, &e), MASKPACK_ERR_OVERFLOW, e);
    t = maskpack_tensor_contiguous(NULL, MASKPACK_I32, 2, shape);
    CHECK_STATUS(mp_check_tensor(&t, "x", 2, 2, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    t = maskpack_tensor_contiguous(buf, MASKPACK_I32, 2, shape);
    int64_t want[2] = {2, 4};
    CHECK_STATUS(mp_check_output(&t, "out", MP_DT_INDEX, 2, want, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "expected shape [2, 4], found [2, 3]");
    CHECK_STATUS(mp_check_output(&t, "out", MP_DT(MASKPACK_F32), 2, shape, &e), MASKPACK_ERR_DTYPE, e);
    /* an empty shape whose other extents multiply past int64 (a fuzzer's .npy header): the strides
     * saturate instead of overflowing (signed overflow is undefined; UBSan runs this test) */
    int64_t huge[4] = {0, 200000000000000000, 0, 700000000000000};
    t = maskpack_tensor_contiguous(buf, MASKPACK_F32, 4, huge);
    CHECK_EQ(t.strides[3], 1);
    CHECK_EQ(t.strides[2], 700000000000000);
    CHECK_EQ(t.strides[1], 700000000000000);
    CHECK_EQ(t.strides[0], INT64_MAX);
    CHECK_EQ(mp_numel(&t), 0);
    CHECK_EQ(mp_stride_step(3, 0), 3);
    CHECK_EQ(mp_stride_step(3, -5), 3);
    CHECK_EQ(mp_stride_step(INT64_MAX / 2, 3), INT64_MAX);
}

/* Two rows: row 0 holds two documents (3 and 2 tokens) then one pad; row 1 one document of 4
 * after 2 pads (left padding). */
static maskpack_layout *two_row_layout(const maskpack_rule *rule) {
    maskpack_segment s[3] = {{0, 0, 3, 0, 3}, {0, 3, 2, 3, 2}, {1, 2, 4, 2, 4}};
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, 3, 2, 6, 6, 0, rule, &L, &e), e);
    return L;
}

static void test_layout_basics(void) {
    maskpack_layout *L = two_row_layout(NULL);
    if (!L) return;
    CHECK_EQ(maskpack_layout_n_rows(L), 2);
    CHECK_EQ(maskpack_layout_q_width(L), 6);
    CHECK_EQ(maskpack_layout_n_segments(L), 3);
    CHECK_EQ(maskpack_layout_n_tokens(L), 9);
    CHECK_EQ(maskpack_layout_max_seqlen(L), 4);
    CHECK(maskpack_layout_is_self(L));
    CHECK(!maskpack_layout_is_packed(L));
    CHECK_EQ(maskpack_segment_of_query(L, 0, 4), 1);
    CHECK_EQ(maskpack_segment_of_query(L, 0, 5), -1);
    CHECK_EQ(maskpack_segment_of_query(L, 1, 1), -1);
    CHECK_EQ(maskpack_segment_of_query(L, 1, 2), 2);
    /* causal inside documents, nothing across */
    CHECK(maskpack_allowed(L, 0, 0, 2, 0));
    CHECK(!maskpack_allowed(L, 0, 0, 0, 2));
    CHECK(!maskpack_allowed(L, 0, 0, 3, 2)); /* doc 2 does not see doc 1 */
    CHECK(maskpack_allowed(L, 0, 0, 4, 3));
    CHECK(!maskpack_allowed(L, 0, 0, 5, 5)); /* pad sees nothing */
    CHECK(!maskpack_allowed(L, 1, 0, 3, 1)); /* left pad never seen */
    CHECK(maskpack_allowed(L, 1, 0, 5, 2));
    CHECK(!maskpack_allowed(L, 2, 0, 0, 0)); /* out of grid */
    maskpack_segment g;
    maskpack_error e;
    CHECK_OK(maskpack_layout_segment(L, 2, &g, &e), e);
    CHECK_EQ(g.q_start, 2);
    CHECK_STATUS(maskpack_layout_segment(L, 3, &g, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);

    /* the same segments, bidirectional with a window of (1, 0): each token sees itself and one back */
    maskpack_rule r = maskpack_rule_default();
    r.causal = 0;
    r.window_left = 1;
    r.window_right = 0;
    maskpack_layout *W = NULL;
    CHECK_OK(maskpack_layout_with_rule(L, &r, &W, &e), e);
    if (W) {
        CHECK(maskpack_allowed(W, 0, 0, 2, 1));
        CHECK(!maskpack_allowed(W, 0, 0, 2, 0));
        CHECK(!maskpack_allowed(W, 0, 0, 1, 2));
        maskpack_rule back = maskpack_layout_rule(W);
        CHECK_EQ(back.causal, 0);
        CHECK_EQ(back.window_left, 1);
        maskpack_layout *C = NULL;
        CHECK_OK(maskpack_layout_clone(W, &C, &e), e);
        if (C) CHECK(maskpack_allowed(C, 0, 0, 2, 1) && !maskpack_allowed(C, 0, 0, 2, 0));
        maskpack_layout_free(C);
    }
    maskpack_layout_free(W);
    maskpack_layout_free(L);
}

static void test_spans_and_prefix(void) {
    /* one causal segment of 8 with a bidirectional span [2, 5) and another of 4 with prefix 2 */
    maskpack_segment s[2] = {{0, 0, 8, 0, 8}, {0, 8, 4, 8, 4}};
    maskpack_span sp[1] = {{0, 2, 5}};
    int64_t prefix[2] = {0, 2};
    maskpack_rule r = maskpack_rule_default();
    r.spans = sp;
    r.n_spans = 1;
    r.prefix = prefix;
    r.n_prefix = 2;
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, 2, 1, 12, 12, 1, &r, &L, &e), e);
    if (!L) return;
    CHECK(maskpack_allowed(L, 0, 0, 2, 4)); /* inside the span: sees the future */
    CHECK(maskpack_allowed(L, 0, 0, 4, 2));
    CHECK(!maskpack_allowed(L, 0, 0, 1, 2)); /* before the span: causal */
    CHECK(!maskpack_allowed(L, 0, 0, 4, 5)); /* span end is exclusive */
    CHECK(maskpack_allowed(L, 0, 0, 6, 3));  /* after the span: causal, sees span tokens */
    CHECK(maskpack_allowed(L, 0, 0, 8, 9));  /* prefix of segment 1 is bidirectional */
    CHECK(!maskpack_allowed(L, 0, 0, 8, 10));
    CHECK(maskpack_allowed(L, 0, 0, 11, 10));
    maskpack_layout_free(L);

    /* bad spans and prefixes are rule errors naming the element */
    maskpack_span bad[2] = {{0, 2, 5}, {0, 4, 6}};
    r.spans = bad;
    r.n_spans = 2;
    CHECK_STATUS(maskpack_layout_from_segments(s, 2, 1, 12, 12, 1, &r, &L, &e), MASKPACK_ERR_RULE, e);
    CHECK_MSG(e, "rule.spans[1]");
    maskpack_span oob[1] = {{1, 0, 5}};
    r.spans = oob;
    r.n_spans = 1;
    CHECK_STATUS(maskpack_layout_from_segments(s, 2, 1, 12, 12, 1, &r, &L, &e), MASKPACK_ERR_RULE, e);
    CHECK_MSG(e, "<= 4");
    r.spans = NULL;
    r.n_spans = 0;
    int64_t badp[2] = {0, 5};
    r.prefix = badp;
    CHECK_STATUS(maskpack_layout_from_segments(s, 2, 1, 12, 12, 1, &r, &L, &e), MASKPACK_ERR_RULE, e);
    CHECK_MSG(e, "rule.prefix[1]");
    r.n_prefix = 1;
    CHECK_STATUS(maskpack_layout_from_segments(s, 2, 1, 12, 12, 1, &r, &L, &e), MASKPACK_ERR_RULE, e);
    r = maskpack_rule_default();
    r.window_left = -2;
    CHECK_STATUS(maskpack_layout_from_segments(s, 2, 1, 12, 12, 1, &r, &L, &e), MASKPACK_ERR_RULE, e);
    r = maskpack_rule_default();
    r.alignment = (maskpack_alignment)5;
    CHECK_STATUS(maskpack_layout_from_segments(s, 2, 1, 12, 12, 1, &r, &L, &e), MASKPACK_ERR_CONVENTION, e);
}

static void test_alignment(void) {
    /* cross segment: 2 queries over 5 keys */
    maskpack_segment s[1] = {{0, 0, 2, 0, 5}};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *BR = NULL, *TL = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, 1, 1, 2, 5, 1, &r, &BR, &e), e);
    r.alignment = MASKPACK_ALIGN_TOP_LEFT;
    CHECK_OK(maskpack_layout_from_segments(s, 1, 1, 2, 5, 1, &r, &TL, &e), e);
    if (!BR || !TL) return;
    CHECK(!maskpack_layout_is_self(BR));
    /* bottom-right: row 0 sees keys 0..3, row 1 sees 0..4 */
    CHECK(maskpack_allowed(BR, 0, 0, 0, 3));
    CHECK(!maskpack_allowed(BR, 0, 0, 0, 4));
    CHECK(maskpack_allowed(BR, 0, 0, 1, 4));
    /* top-left: row 0 sees key 0 only */
    CHECK(maskpack_allowed(TL, 0, 0, 0, 0));
    CHECK(!maskpack_allowed(TL, 0, 0, 0, 1));
    CHECK(maskpack_allowed(TL, 0, 0, 1, 1));
    CHECK(!maskpack_allowed(TL, 0, 0, 1, 2));
    maskpack_layout_free(BR);
    maskpack_layout_free(TL);

    /* bottom-right with more queries than keys: the first rows see nothing */
    maskpack_segment t[1] = {{0, 0, 4, 0, 2}};
    r = maskpack_rule_default();
    CHECK_OK(maskpack_layout_from_segments(t, 1, 1, 4, 2, 1, &r, &BR, &e), e);
    if (BR) {
        CHECK(!maskpack_allowed(BR, 0, 0, 0, 0));
        CHECK(!maskpack_allowed(BR, 0, 0, 1, 0));
        CHECK(maskpack_allowed(BR, 0, 0, 2, 0));
        CHECK(!maskpack_allowed(BR, 0, 0, 2, 1));
    }
    maskpack_layout_free(BR);

    /* an unstated alignment: refused where it matters (a causal or windowed rule over a segment
     * with q_len != kv_len), naming the argument and the segment; accepted where it cannot matter,
     * with the predicate of either alignment */
    r = maskpack_rule_default();
    r.alignment = MASKPACK_ALIGN_UNSTATED;
    maskpack_layout *U = NULL;
    maskpack_segment c2[2] = {{0, 0, 3, 0, 3}, {0, 3, 2, 3, 5}};
    CHECK_STATUS(maskpack_layout_from_segments(c2, 2, 1, 5, 8, 1, &r, &U, &e), MASKPACK_ERR_CONVENTION, e);
    CHECK(strcmp(e.argument, "rule.alignment") == 0);
    CHECK_EQ(e.index[0], 1);
    CHECK_MSG(e, "q_len 2 != kv_len 5");
    CHECK(U == NULL);
    r.causal = 0;
    r.window_left = 1;
    CHECK_STATUS(maskpack_layout_from_segments(c2, 2, 1, 5, 8, 1, &r, &U, &e), MASKPACK_ERR_CONVENTION, e);
    r.window_left = -1; /* bidirectional, no window: the alignment cannot matter */
    CHECK_OK(maskpack_layout_from_segments(c2, 2, 1, 5, 8, 1, &r, &U, &e), e);
    if (U) {
        CHECK(maskpack_allowed(U, 0, 0, 3, 7));
        CHECK_EQ(maskpack_layout_rule(U).alignment, MASKPACK_ALIGN_BOTTOM_RIGHT);
    }
    maskpack_layout_free(U);
    U = NULL;
    r = maskpack_rule_default();
    r.alignment = MASKPACK_ALIGN_UNSTATED; /* self-attention segments: both alignments agree */
    const int64_t lens[3] = {4, 1, 6};
    CHECK_OK(maskpack_layout_from_lengths(lens, 3, MASKPACK_PLACE_PACKED, 0, &r, &U, &e), e);
    if (U) {
        CHECK(maskpack_allowed(U, 0, 0, 2, 1) && !maskpack_allowed(U, 0, 0, 1, 2));
        /* a stated rule over the unstated layout's segments is the caller's: with_rule checks again */
        maskpack_layout *V = NULL;
        CHECK_OK(maskpack_layout_with_rule(U, &r, &V, &e), e);
        maskpack_layout_free(V);
    }
    maskpack_layout_free(U);
    U = NULL;
    r.alignment = MASKPACK_ALIGN_TOP_LEFT; /* stated: accepted */
    CHECK_OK(maskpack_layout_from_segments(c2, 2, 1, 5, 8, 1, &r, &U, &e), e);
    maskpack_layout_free(U);
    U = NULL;
    /* the rule's own fields are judged first: a malformed window is named, not the alignment */
    r = maskpack_rule_default();
    r.alignment = MASKPACK_ALIGN_UNSTATED;
    r.window_left = -3;
    CHECK_STATUS(maskpack_layout_from_segments(c2, 2, 1, 5, 8, 1, &r, &U, &e), MASKPACK_ERR_RULE, e);
    CHECK(strcmp(e.argument, "rule.window") == 0);
    CHECK(U == NULL);
    /* with_rule applies the same policy to a cross layout built under a stated alignment */
    r = maskpack_rule_default();
    CHECK_OK(maskpack_layout_from_segments(c2, 2, 1, 5, 8, 1, &r, &U, &e), e);
    if (U) {
        maskpack_layout *V = NULL;
        r.alignment = MASKPACK_ALIGN_UNSTATED;
        CHECK_STATUS(maskpack_layout_with_rule(U, &r, &V, &e), MASKPACK_ERR_CONVENTION, e);
        CHECK(strcmp(e.argument, "rule.alignment") == 0);
        CHECK_EQ(e.index[0], 1);
        CHECK(V == NULL);
    }
    maskpack_layout_free(U);
}

static void test_segment_validation(void) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_segment overlap[2] = {{0, 0, 3, 0, 3}, {0, 2, 2, 2, 2}};
    CHECK_STATUS(maskpack_layout_from_segments(overlap, 2, 1, 6, 6, 0, NULL, &L, &e), MASKPACK_ERR_UNSORTED, e);
    CHECK_MSG(e, "segments[1].q_start: expected >= 3");
    CHECK_EQ(e.index[0], 1);
    maskpack_segment outside[1] = {{0, 4, 3, 4, 3}};
    CHECK_STATUS(maskpack_layout_from_segments(outside, 1, 1, 6, 6, 0, NULL, &L, &e), MASKPACK_ERR_VALUE, e);
    maskpack_segment badrow[1] = {{3, 0, 1, 0, 1}};
    CHECK_STATUS(maskpack_layout_from_segments(badrow, 1, 2, 6, 6, 0, NULL, &L, &e), MASKPACK_ERR_VALUE, e);
    CHECK_MSG(e, "segments[0].row: expected in [0, 2), found 3");
    maskpack_segment rows[2] = {{1, 0, 1, 0, 1}, {0, 0, 1, 0, 1}};
    CHECK_STATUS(maskpack_layout_from_segments(rows, 2, 2, 6, 6, 0, NULL, &L, &e), MASKPACK_ERR_UNSORTED, e);
    maskpack_segment ok[1] = {{0, 0, 1, 0, 1}};
    CHECK_STATUS(maskpack_layout_from_segments(ok, 1, 2, 6, 6, 1, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    maskpack_segment huge[1] = {{0, INT64_MAX - 1, 5, 0, 1}};
    CHECK_STATUS(maskpack_layout_from_segments(huge, 1, 1, 6, 6, 0, NULL, &L, &e), MASKPACK_ERR_VALUE, e);
    CHECK_STATUS(maskpack_layout_from_segments(ok, 1, INT64_MAX, INT64_MAX, 6, 0, NULL, &L, &e), MASKPACK_ERR_OVERFLOW,
                 e);
    CHECK_STATUS(maskpack_layout_from_segments(NULL, 1, 1, 6, 6, 0, NULL, &L, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_layout_from_segments(ok, 1, 1, 6, 6, 0, NULL, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(L == NULL); /* nothing was written by the failing calls */
    /* empty segments are legal, also stacked at one column */
    maskpack_segment empties[3] = {{0, 0, 0, 0, 0}, {0, 0, 2, 0, 2}, {0, 2, 0, 2, 0}};
    CHECK_OK(maskpack_layout_from_segments(empties, 3, 1, 2, 2, 1, NULL, &L, &e), e);
    if (L) {
        CHECK_EQ(maskpack_segment_of_query(L, 0, 0), 1);
        CHECK_EQ(maskpack_segment_of_query(L, 0, 1), 1);
        CHECK(maskpack_allowed(L, 0, 0, 1, 0));
    }
    maskpack_layout_free(L);
    maskpack_layout_free(NULL);
}

static void test_windows(void) {
    int64_t l, r;
    maskpack_error e;
    CHECK_OK(maskpack_window_from_hf(4, &l, &r, &e), e);
    CHECK_EQ(l, 3);
    CHECK_EQ(r, 3);
    CHECK_OK(maskpack_window_from_gym(4, &l, &r, &e), e);
    CHECK_EQ(l, 4);
    CHECK_STATUS(maskpack_window_from_hf(0, &l, &r, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "found 0");
    CHECK_STATUS(maskpack_window_from_gym(-1, &l, &r, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    /* HF's window w = 3 under causal: token 5 sees 3, 4, 5 (w keys including self) */
    maskpack_window_from_hf(3, &l, &r, &e);
    maskpack_segment s[1] = {{0, 0, 8, 0, 8}};
    maskpack_rule rule = maskpack_rule_default();
    rule.window_left = l;
    rule.window_right = r;
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_layout_from_segments(s, 1, 1, 8, 8, 1, &rule, &L, &e), e);
    if (L) {
        int seen = 0;
        for (int j = 0; j < 8; j++) seen += maskpack_allowed(L, 0, 0, 5, j);
        CHECK_EQ(seen, 3);
        CHECK(maskpack_allowed(L, 0, 0, 5, 3) && !maskpack_allowed(L, 0, 0, 5, 2));
    }
    maskpack_layout_free(L);
}

/* An output whose elements share memory (a zero stride: an expanded tensor; or interleaved strides)
 * is refused with OVERLAP before anything is written, by every entry point that writes per-token or
 * moved data; inputs may share memory. Before, every token wrote the same bytes (a data race with
 * threads). */
static void test_self_overlapping_outputs(void) {
    maskpack_error e;
    maskpack_layout *padded = NULL, *packed = NULL;
    const int64_t lengths[2] = {3, 5};
    CHECK_OK(maskpack_layout_from_lengths(lengths, 2, MASKPACK_PLACE_RIGHT, 5, NULL, &padded, &e), e);
    CHECK_OK(maskpack_layout_from_lengths(lengths, 2, MASKPACK_PLACE_PACKED, 0, NULL, &packed, &e), e);
    if (!padded || !packed) return;
    int64_t buf[64];
    for (int i = 0; i < 64; i++) buf[i] = -7;
    /* [2, 5] whose rows share memory (stride 0 on rows), as torch.zeros(1, 5).expand(2, 5) */
    const int64_t bs[2] = {2, 5};
    maskpack_tensor ex = maskpack_tensor_contiguous(buf, MASKPACK_I64, 2, bs);
    ex.strides[0] = 0;
    CHECK_STATUS(maskpack_mask2d(padded, &ex, &e), MASKPACK_ERR_OVERLAP, e);
    CHECK_MSG(e, "out: overlaps itself: dimension 0 (extent 2) has stride 0");
    CHECK_EQ(e.status, MASKPACK_ERR_OVERLAP);
    CHECK(strcmp(e.argument, "out") == 0);
    /* interleaved strides: row stride 2 inside a column span of 4 */
    maskpack_tensor il = maskpack_tensor_contiguous(buf, MASKPACK_I64, 2, bs);
    il.strides[0] = 2;
    il.strides[1] = 1;
    CHECK_STATUS(maskpack_mask2d(padded, &il, &e), MASKPACK_ERR_OVERLAP, e);
    CHECK_MSG(e, "dimension 0 (extent 2, stride 2) steps inside");
    /* moves: packing [8] tokens of width 4 into an out whose tokens share their 4 values */
    int64_t src[40];
    for (int i = 0; i < 40; i++) src[i] = i;
    const int64_t xs[3] = {2, 5, 4}, os[2] = {8, 4};
    maskpack_tensor x = maskpack_tensor_contiguous(src, MASKPACK_I64, 3, xs);
    maskpack_tensor o = maskpack_tensor_contiguous(buf, MASKPACK_I64, 2, os);
    o.strides[0] = 0;
    CHECK_STATUS(maskpack_relayout(padded, packed, &x, &o, NULL, 2, &e), MASKPACK_ERR_OVERLAP, e);
    CHECK_MSG(e, "out: overlaps itself");
    int untouched = 1;
    for (int i = 0; i < 64; i++) untouched &= buf[i] == -7;
    CHECK(untouched);
    /* the same call with its own memory per element works, and so does a permuted (transposed) out:
     * distinct elements, strides not in C order */
    o = maskpack_tensor_contiguous(buf, MASKPACK_I64, 2, os);
    CHECK_OK(maskpack_relayout(padded, packed, &x, &o, NULL, 2, &e), e);
    CHECK_EQ(buf[4 * 3], 5 * 4); /* token 3 of the pack is row 1's first token */
    maskpack_tensor tr = maskpack_tensor_contiguous(buf, MASKPACK_I64, 2, bs);
    tr.strides[0] = 1;
    tr.strides[1] = 2;
    CHECK_OK(maskpack_mask2d(padded, &tr, &e), e);
    CHECK_EQ(buf[2 * 4 + 1], 1); /* row 1, column 4: row 1 holds 5 tokens */
    CHECK_EQ(buf[2 * 4 + 0], 0); /* row 0, column 4: pad (3 tokens) */
    /* an input that shares memory is fine: a broadcast row read twice */
    maskpack_tensor bx = maskpack_tensor_contiguous(src, MASKPACK_I64, 3, xs);
    bx.strides[0] = 0;
    o = maskpack_tensor_contiguous(buf, MASKPACK_I64, 2, os);
    CHECK_OK(maskpack_relayout(padded, packed, &bx, &o, NULL, 1, &e), e);
    CHECK_EQ(buf[4 * 3], 0);
    /* an out of zero elements has nothing to share */
    const int64_t zs[2] = {0, 5};
    maskpack_tensor z = maskpack_tensor_contiguous(buf, MASKPACK_I64, 2, zs);
    z.strides[1] = 0;
    CHECK(mp_check_no_self_overlap(&z, "z", &e) == MASKPACK_OK);
    maskpack_layout_free(padded);
    maskpack_layout_free(packed);
}

/* ---- the worker team's wait ------------------------------------------------------------------ */

typedef struct slow_share {
    _Atomic int entered, done;
} slow_share;

/* tid 0 returns as soon as a worker is inside; the worker then works 50 ms (sleeping) */
static void slow_share_fn(void *ctx, int tid) {
    slow_share *S = ctx;
    if (tid != 0) {
        atomic_store(&S->entered, 1);
        struct timespec d = {0, 50 * 1000 * 1000};
        nanosleep(&d, NULL);
        atomic_store(&S->done, 1);
        return;
    }
    for (int i = 0; i < 2000 && !atomic_load(&S->entered); i++) {
        struct timespec d = {0, 1000 * 1000};
        nanosleep(&d, NULL);
    }
}

static double thread_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The caller waits for a worker still inside its share (and sees what it wrote), and a long wait
 * sleeps rather than spins: the caller gives its core to the worker, as a join would. */
static void test_workers_wait(void) {
    maskpack_workers *w = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_workers_create(2, &w, &e), e);
    CHECK_STATUS(maskpack_workers_create(MASKPACK_MAX_THREADS + 1, &w, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "n_threads: expected in [1, 256], found 257");
    for (int rep = 0; rep < 3; rep++) {
        slow_share S;
        atomic_init(&S.entered, 0);
        atomic_init(&S.done, 0);
        mp_workers_run(w, slow_share_fn, &S);
        if (!atomic_load(&S.entered)) {
            printf("test_core: no worker joined within 2 s: the team wait is not checked\n");
            break;
        }
        CHECK(atomic_load(&S.done) == 1);
    }
    /* CPU time of the caller over a run whose worker takes 50 ms after the caller's share ends */
    slow_share S;
    atomic_init(&S.entered, 0);
    atomic_init(&S.done, 0);
    const double c0 = thread_cpu_ms();
    mp_workers_run(w, slow_share_fn, &S);
    const double used = thread_cpu_ms() - c0;
    if (atomic_load(&S.entered)) {
        printf("test_core: the team's caller used %.2f ms of CPU waiting 50 ms for a worker\n", used);
        CHECK(atomic_load(&S.done) == 1);
        CHECK(used < 10.0);
    }
    maskpack_workers_free(w);
}

/* ---- f16 ------------------------------------------------------------------------------------------ */

/* the value of an f16 bit pattern, decoded from the format's definition */
static double f16_value(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0)
        v = ldexp((double)man, -24); /* subnormal: man * 2^-24 */
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexp((double)(1024 + man), exp - 25);
    return sign ? -v : v;
}

static void test_f16_every_value(void) {
    int wrong_decode = 0, wrong_round_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const double want = f16_value((uint16_t)h);
        const float f = mp_f16_to_f32((uint16_t)h);
        if (isnan(want)) {
            if (!isnan(f)) wrong_decode++;
            if ((mp_f32_to_f16(f) & 0x7c00u) != 0x7c00u || !(mp_f32_to_f16(f) & 0x3ffu)) wrong_round_trip++;
            continue;
        }
        if ((double)f != want || !!signbit(f) != (int)(h >> 15)) wrong_decode++;
        if (mp_f32_to_f16(f) != (uint16_t)h) wrong_round_trip++;
    }
    CHECK_EQ(wrong_decode, 0);
    CHECK_EQ(wrong_round_trip, 0);
    /* the subnormals by name: the smallest, the largest, and one in between */
    CHECK(mp_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(mp_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    CHECK(mp_f16_to_f32(0x8200) == -ldexpf(512.0f, -24));
}

/* f32 values in and below f16's subnormal range: rounded to the nearest multiple of 2^-24, ties to
 * even, values below half the smallest subnormal to (signed) zero */
static void test_f16_subnormal_rounding(void) {
    int wrong = 0;
    test_rng r = {0x9e3779b97f4a7c15ull};
    for (int i = 0; i < 200000; i++) {
        const uint64_t x = test_rng_next(&r);
        /* |f| in [2^-30, 2^-14): exponents from below the subnormals to the smallest normal */
        const float f = ldexpf(1.0f + (float)(x & 0x7fffff) / 8388608.0f, -30 + (int)((x >> 23) % 16)) *
                        ((x >> 40) & 1 ? -1.0f : 1.0f);
        const double units = rint(fabs((double)f) * 16777216.0); /* multiples of 2^-24, ties to even */
        const uint16_t want = (uint16_t)((f < 0 ? 0x8000u : 0u) | (uint32_t)units); /* 1024 units = 0x0400 */
        if (mp_f32_to_f16(f) != want) {
            if (wrong < 5) fprintf(stderr, "f32 %a -> f16 %04x, expected %04x\n", (double)f, mp_f32_to_f16(f), want);
            wrong++;
        }
    }
    CHECK_EQ(wrong, 0);
    /* exact ties: 0.5 and 1.5 units round to 0 and 2, 2^-25 (half the smallest) to zero */
    CHECK_EQ(mp_f32_to_f16(ldexpf(1.0f, -25)), 0);
    CHECK_EQ(mp_f32_to_f16(ldexpf(3.0f, -25)), 2);
    CHECK_EQ(mp_f32_to_f16(ldexpf(5.0f, -25)), 2);
    CHECK_EQ(mp_f32_to_f16(-ldexpf(1.0f, -40)), 0x8000);
}

/* the element readers and writers across integer and float dtypes (saturating float -> int64) */
static void test_element_conversions(void) {
    const float f[4] = {3.75f, 1e30f, -1e30f, NAN};
    CHECK_EQ(mp_read_i64(MASKPACK_F32, f, 0), 3);
    CHECK(mp_read_i64(MASKPACK_F32, f, 1) == INT64_MAX);
    CHECK(mp_read_i64(MASKPACK_F32, f, 2) == INT64_MIN);
    CHECK(mp_read_i64(MASKPACK_F32, f, 3) == INT64_MIN);
    const int16_t h[2] = {-5, 300};
    CHECK(mp_read_f64(MASKPACK_I16, h, 0) == -5.0 && mp_read_f64(MASKPACK_I16, h, 1) == 300.0);
    float out[2] = {0, 0};
    mp_write_i64(MASKPACK_F32, out, 1, 7);
    CHECK(out[1] == 7.0f);
    int32_t io[2] = {0, 0};
    mp_write_f64(MASKPACK_I32, io, 0, -2.9);
    CHECK_EQ(io[0], -2);
    uint16_t bf = 0;
    mp_write_i64(MASKPACK_BF16, &bf, 0, 3);
    CHECK(mp_read_f64(MASKPACK_BF16, &bf, 0) == 3.0);
    /* the tensor checks: an unknown dtype code, a byte size past int64 */
    maskpack_error e;
    int64_t shape[2] = {(int64_t)1 << 31, (int64_t)1 << 31};
    maskpack_tensor t = maskpack_tensor_contiguous(io, MASKPACK_I32, 2, shape);
    CHECK_STATUS(mp_check_tensor(&t, "x", 1, 4, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK_MSG(e, "x: byte size overflows int64");
    t.dtype = (maskpack_dtype)99;
    CHECK_STATUS(mp_check_tensor(&t, "x", 1, 4, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_MSG(e, "x: expected a known dtype code, found 99");
}

/* ---- layout_from_segments: the segment and rule checks --------------------------------------------- */

static void expect_segments(const maskpack_segment *segs, size_t n, int64_t rows, int64_t qw, int64_t kw,
                            const maskpack_rule *rule, maskpack_status want, const char *fragment) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_STATUS(maskpack_layout_from_segments(segs, n, rows, qw, kw, 0, rule, &L, &e), want, e);
    CHECK_MSG(e, fragment);
    CHECK(L == NULL);
}

static void test_segment_checks(void) {
    const maskpack_segment ok[2] = {{0, 0, 3, 0, 3, 0, 0, 0}, {0, 3, 2, 3, 2, 0, 0, 0}};
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(ok, 2, 1, 6, 6, 0, NULL, &L, &e), e); /* the control */
    maskpack_layout_free(L);
    expect_segments(ok, 2, -1, 6, 6, NULL, MASKPACK_ERR_INVALID_ARGUMENT,
                    "grid: expected n_rows, q_width, kv_width >= 0, found -1, 6, 6");
    maskpack_segment s[2] = {ok[0], ok[1]};
    s[1].kv_len = 9; /* keys [3, 12) past the 6 key columns */
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1]: key columns [3, 3 + 9) must lie in [0, 6)");
    s[1] = ok[1];
    s[1].flags = 0x80;
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE,
                    "segments[1].flags: expected 0 or MASKPACK_SEGMENT_EXPLICIT_POS");
    s[1].flags = MASKPACK_SEGMENT_EXPLICIT_POS;
    s[1].q_pos = 1; /* 1 + 2 queries > 2 keys */
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1].q_pos: expected 0 <= q_pos");
    s[1].q_pos = 0;
    s[1].origin = -2;
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1].origin: expected >= 0");
    s[1] = ok[1];
    s[1].kv_start = 2; /* keys overlap the previous segment's, without explicit positions */
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_UNSORTED,
                    "segments[1].kv_start: expected >= 3 (end of segment 0)");
    /* the rule: spans without a pointer, a prefix count without a pointer, a span of a missing segment */
    maskpack_rule r = maskpack_rule_default();
    r.n_spans = 2;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_NULL_ARGUMENT,
                    "rule.spans: 2 spans declared but the pointer is NULL");
    r = maskpack_rule_default();
    r.n_prefix = 2;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_NULL_ARGUMENT,
                    "rule.prefix: 2 entries declared but the pointer is NULL");
    const maskpack_span sp = {5, 0, 1};
    r = maskpack_rule_default();
    r.spans = &sp;
    r.n_spans = 1;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_RULE, "rule.spans[0].segment: expected in [0, 2), found 5");

    /* each field of a segment out of its range in turn (the checks before the key columns' one) */
    expect_segments(ok, 2, 1, -6, 6, NULL, MASKPACK_ERR_INVALID_ARGUMENT,
                    "grid: expected n_rows, q_width, kv_width >= 0");
    expect_segments(ok, 2, 1, 6, -6, NULL, MASKPACK_ERR_INVALID_ARGUMENT,
                    "grid: expected n_rows, q_width, kv_width >= 0");
    const struct {
        int field;
        int64_t value;
        const char *fragment;
    } bad[] = {{0, 1, "segments[1].row"}, {0, -1, "segments[1].row"}, {1, -1, "segments[1]"},
               {2, -1, "segments[1]"},    {2, 4, "segments[1]"},      {1, INT64_MAX, "segments[1]"},
               {3, -1, "segments[1]"},    {4, -1, "segments[1]"},     {3, INT64_MAX, "segments[1]"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        s[1] = ok[1];
        int64_t *f[5] = {&s[1].row, &s[1].q_start, &s[1].q_len, &s[1].kv_start, &s[1].kv_len};
        *f[bad[k].field] = bad[k].value;
        expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, bad[k].fragment);
    }
    /* explicit positions: q_pos negative, or past the keys */
    s[1] = ok[1];
    s[1].flags = MASKPACK_SEGMENT_EXPLICIT_POS;
    s[1].q_pos = -1;
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1].q_pos: expected 0 <= q_pos");
    s[1].q_pos = 3;
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1].q_pos: expected 0 <= q_pos");
    /* the rule: a window below -1 on either side, spans outside their segment, overlapping or out of
     * order, prefixes outside [0, kv_len] */
    r = maskpack_rule_default();
    r.window_left = -2;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_RULE, "rule.window");
    r = maskpack_rule_default();
    r.window_right = -3;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_RULE, "rule.window");
    const maskpack_span spans_bad[][2] = {{{-1, 0, 1}, {0, 0, 0}}, {{0, -1, 1}, {0, 0, 0}}, {{0, 2, 2}, {0, 0, 0}},
                                          {{0, 1, 4}, {0, 0, 0}},  {{0, 0, 2}, {0, 1, 3}},  {{1, 0, 1}, {0, 0, 1}}};
    const size_t n_sp[] = {1, 1, 1, 1, 2, 2};
    for (size_t k = 0; k < sizeof n_sp / sizeof n_sp[0]; k++) {
        r = maskpack_rule_default();
        r.spans = spans_bad[k];
        r.n_spans = n_sp[k];
        expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_RULE, "rule.spans[");
    }
    const int64_t pf_bad[2][2] = {{-1, 0}, {0, 3}};
    for (int k = 0; k < 2; k++) {
        r = maskpack_rule_default();
        r.prefix = pf_bad[k];
        r.n_prefix = 2;
        expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_RULE, "rule.prefix[");
    }
    r = maskpack_rule_default();
    r.prefix = pf_bad[0];
    r.n_prefix = 3;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_RULE, "rule.prefix");
}

int main(void) {
    test_version_and_status();
    test_workers_wait();
    test_half_conversions();
    test_tensor_checks();
    test_f16_every_value();
    test_f16_subnormal_rounding();
    test_element_conversions();
    test_layout_basics();
    test_spans_and_prefix();
    test_alignment();
    test_segment_validation();
    test_segment_checks();
    test_windows();
    test_self_overlapping_outputs();
    return check_report("test_core");
}
