/* test_coverage_paths.c: branches no other C test reached. Half-precision conversion over every
 * f16 value (subnormals included) against a decoding written here, and f32 -> f16 rounding of
 * subnormal results against round-to-nearest-even in double; the Gated DeltaNet argument guards
 * (options out of range, zero heads or head dims, value heads not a multiple of key heads, head
 * dims whose workspace overflows), each with its status and message; the NPU validator's check of a
 * sparse_mode 5 full mask against bottom-right causal + prefix (a matching mask passes, one flipped
 * entry is reported with its position) and every atten_mask shape form against the full-mask modes;
 * the empty inner range of the triangular GEMM of each build
 * this CPU runs. */
#include "check.h"
#include "cpu_features.h"
#include "internal.h"

#include "../../src/kernels/gdn/gdn_internal.h"

#include <math.h>
#include <stdlib.h>

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
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1].flags: expected 0 or MASKPACK_SEGMENT_EXPLICIT_POS");
    s[1].flags = MASKPACK_SEGMENT_EXPLICIT_POS;
    s[1].q_pos = 1; /* 1 + 2 queries > 2 keys */
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1].q_pos: expected 0 <= q_pos");
    s[1].q_pos = 0;
    s[1].origin = -2;
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_VALUE, "segments[1].origin: expected >= 0");
    s[1] = ok[1];
    s[1].kv_start = 2; /* keys overlap the previous segment's, without explicit positions */
    expect_segments(s, 2, 1, 6, 6, NULL, MASKPACK_ERR_UNSORTED, "segments[1].kv_start: expected >= 3 (end of segment 0)");
    /* the rule: spans without a pointer, a prefix count without a pointer, a span of a missing segment */
    maskpack_rule r = maskpack_rule_default();
    r.n_spans = 2;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_NULL_ARGUMENT, "rule.spans: 2 spans declared but the pointer is NULL");
    r = maskpack_rule_default();
    r.n_prefix = 2;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_NULL_ARGUMENT, "rule.prefix: 2 entries declared but the pointer is NULL");
    const maskpack_span sp = {5, 0, 1};
    r = maskpack_rule_default();
    r.spans = &sp;
    r.n_spans = 1;
    expect_segments(ok, 2, 1, 6, 6, &r, MASKPACK_ERR_RULE, "rule.spans[0].segment: expected in [0, 2), found 5");

    /* each field of a segment out of its range in turn (the checks before the key columns' one) */
    expect_segments(ok, 2, 1, -6, 6, NULL, MASKPACK_ERR_INVALID_ARGUMENT, "grid: expected n_rows, q_width, kv_width >= 0");
    expect_segments(ok, 2, 1, 6, -6, NULL, MASKPACK_ERR_INVALID_ARGUMENT, "grid: expected n_rows, q_width, kv_width >= 0");
    const struct {
        int field;
        int64_t value;
        const char *fragment;
    } bad[] = {{0, 1, "segments[1].row"},        {0, -1, "segments[1].row"},      {1, -1, "segments[1]"},
               {2, -1, "segments[1]"},           {2, 4, "segments[1]"},          {1, INT64_MAX, "segments[1]"},
               {3, -1, "segments[1]"},           {4, -1, "segments[1]"},          {3, INT64_MAX, "segments[1]"}};
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

/* ---- planner and CP argument checks ------------------------------------------------------------------ */

static void test_plan_and_cp_arguments(void) {
    double a = -1.0;
    maskpack_error e;
    CHECK_STATUS(maskpack_plan_attention_coefficient(1024, 0, -1, 0, 0, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "q_dim: expected in [0, 2^30] (0 = hidden), found -1");
    CHECK_STATUS(maskpack_plan_attention_coefficient(1024, 0, 0, -5, 0, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "kv_dim: expected in [0, 2^30] (0 = q_dim), found -5");
    CHECK_STATUS(maskpack_plan_attention_coefficient(1024, 0, 0, 0, 0, 2, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "causal: expected 0 or 1, found 2");
    CHECK(a == -1.0); /* untouched on error */

    const int64_t lens[3] = {5, 9, 3};
    maskpack_plan *p = NULL;
    maskpack_plan_options o = maskpack_plan_options_default(16);
    o.dp = 1 << 20;
    o.micro_batches = 1 << 10;
    CHECK_STATUS(maskpack_plan_create(lens, 3, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "dp 1048576 and micro_batches 1024");
    CHECK_MSG(e, "dp * micro_batches = 1073741824 groups exceeds the limit 2^28");
    o = maskpack_plan_options_default(16);
    o.multiple = -2;
    CHECK_STATUS(maskpack_plan_create(lens, 3, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "multiple: expected 0 (derive from cp, tp, align) or in [1, 2^40], found -2");
    o = maskpack_plan_options_default(16);
    o.row_width = (maskpack_plan_width)7;
    CHECK_STATUS(maskpack_plan_create(lens, 3, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "row_width: expected CAPACITY (0) or USED (1), found 7");
    CHECK(p == NULL);

    maskpack_layout *L = NULL, *S = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens, 3, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    CHECK_STATUS(maskpack_layout_cp_shard(L, 0, 0, MASKPACK_CP_ZIGZAG, &S, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "cp: expected in [1, 2^20], found 0");
    CHECK_STATUS(maskpack_layout_cp_shard(L, 2, 0, (maskpack_cp_scheme)5, &S, &e), MASKPACK_ERR_CONVENTION, e);
    CHECK_MSG(e, "scheme: expected MASKPACK_CP_ZIGZAG (0) or MASKPACK_CP_CONTIGUOUS (1), found 5");
    CHECK(S == NULL);
    maskpack_layout_free(L);
}

/* ---- Gated DeltaNet guards ------------------------------------------------------------------------ */

typedef struct gdn_case {
    maskpack_tensor q, k, v, g, beta;
    maskpack_gdn_inputs in;
} gdn_case;

/* [T = 4, H, K] q/k, [T, HV, V] v, [T, HV] g/beta over a packed layout of one 4-token sequence. Data
 * points at a small buffer: the guards refuse before anything is read. */
static void gdn_shapes(gdn_case *c, int64_t H, int64_t K, int64_t HV, int64_t V) {
    static float data[64];
    int64_t qs[3] = {4, H, K}, vs[3] = {4, HV, V}, gs[2] = {4, HV};
    c->q = maskpack_tensor_contiguous(data, MASKPACK_F32, 3, qs);
    c->k = c->q;
    c->v = maskpack_tensor_contiguous(data, MASKPACK_F32, 3, vs);
    c->g = maskpack_tensor_contiguous(data, MASKPACK_F32, 2, gs);
    c->beta = c->g;
    c->in = (maskpack_gdn_inputs){&c->q, &c->k, &c->v, &c->g, &c->beta, NULL};
}

static void expect_ws(const maskpack_layout *L, const gdn_case *c, const maskpack_gdn_options *o, maskpack_status want,
                      const char *fragment) {
    size_t bytes = 12345;
    maskpack_error e;
    CHECK_STATUS(maskpack_gdn_workspace_size(L, &c->in, o, 0, &bytes, &e), want, e);
    CHECK_MSG(e, fragment);
}

static void test_gdn_guards(void) {
    const int64_t len = 4;
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(&len, 1, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    gdn_case c;
    gdn_shapes(&c, 1, 4, 2, 4);
    size_t bytes = 0;
    CHECK_OK(maskpack_gdn_workspace_size(L, &c.in, NULL, 0, &bytes, &e), e); /* the control */
    CHECK(bytes > 0);

    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.chunked = 2;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "opts.chunked: expected 0 or 1, found 2");
    o = maskpack_gdn_options_default();
    o.l2norm = -1;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "opts.l2norm: expected 0 or 1, found -1");
    o = maskpack_gdn_options_default();
    o.scale = NAN;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "opts.scale: expected a finite number");
    o = maskpack_gdn_options_default();
    o.isa = (maskpack_gdn_isa)9;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "isa: expected AUTO (0), REF (1), AVX512 (2) or AVX2 (3)");

    /* zero key heads, a zero key head dim, zero value heads, a zero value head dim */
    gdn_shapes(&c, 0, 4, 2, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "q: expected at least one head and a head dim >= 1");
    gdn_shapes(&c, 1, 0, 2, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "found H = 1, K = 0");
    gdn_shapes(&c, 1, 4, 0, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "v: expected at least one head and a head dim >= 1");
    gdn_shapes(&c, 1, 4, 2, 0);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "found HV = 2, V = 0");
    /* 3 value heads over 2 key heads */
    gdn_shapes(&c, 2, 4, 3, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "multiple of the key heads H = 2, found HV = 3");
    /* head dims whose per-chunk buffers overflow int64, and ones whose workspace would */
    gdn_shapes(&c, 1, (int64_t)1 << 40, 1, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_OVERFLOW, "are too large");
    gdn_shapes(&c, 1, (int64_t)1 << 24, 1, (int64_t)1 << 24);
    expect_ws(L, &c, NULL, MASKPACK_ERR_OVERFLOW, "workspace for K = 16777216, V = 16777216");
    maskpack_layout_free(L);
}

/* ---- NPU sparse_mode 5 with a full mask ------------------------------------------------------------- */

/* Validates c; returns the number of findings (printed when it is not `expected`). */
static int npu_findings(const maskpack_npu_call *c, maskpack_npu_report *rep, maskpack_status *st, int expected) {
    maskpack_error e;
    *st = maskpack_validate_npu_args(c, rep, &e);
    if (rep->n_total != expected)
        for (int i = 0; i < rep->n_findings; i++)
            fprintf(stderr, "  finding %d: %s\n", (int)rep->findings[i].code, rep->findings[i].message);
    return rep->n_total;
}

static void test_npu_mode5_full_mask(void) {
    /* B = 2, S = Skv = 4, prefixes 2 and 0: masked (1) where neither j <= i nor j < prefix */
    static uint8_t m[2 * 4 * 4];
    const int64_t pf[2] = {2, 0};
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) m[b * 16 + i * 4 + j] = !(j <= i || j < pf[b]);
    int64_t shape[4] = {2, 1, 4, 4}, two = 2;
    maskpack_tensor mt = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 4, shape);
    maskpack_tensor pt = maskpack_tensor_contiguous((void *)pf, MASKPACK_I64, 1, &two);
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    c.input_layout = MASKPACK_NPU_BSND;
    c.batch = 2;
    c.q_len = c.kv_len = 4;
    c.heads_q = c.heads_kv = 2;
    c.head_dim = 64;
    c.sparse_mode = 5;
    c.pre_tokens = c.next_tokens = 2147483647;
    c.atten_mask = &mt;
    c.prefix = &pt;
    c.scale = 0.125;
    c.inner_precise = 0;
    maskpack_npu_report rep;
    maskpack_status st;
    CHECK_EQ(npu_findings(&c, &rep, &st, 0), 0);
    CHECK_EQ(st, MASKPACK_OK);
    /* batch 1, row 0, column 1: the rule says masked (no prefix there); the mask says visible */
    m[16 + 1] = 0;
    CHECK_EQ(npu_findings(&c, &rep, &st, 1), 1);
    CHECK_EQ(st, MASKPACK_ERR_NPU_CONTRACT);
    CHECK(rep.n_findings == 1 && rep.findings[0].code == MASKPACK_NPU_MASK_MISMATCH);
    CHECK(strstr(rep.findings[0].message, "sparse_mode 5: atten_mask (b 1, head 0, i 0, j 1) is 0") != NULL);
    m[16 + 1] = 1;
    /* batch 0, row 0, column 1 is inside the prefix 2: masking it disagrees too */
    m[1] = 1;
    CHECK_EQ(npu_findings(&c, &rep, &st, 1), 1);
    CHECK(rep.n_findings == 1 && strstr(rep.findings[0].message, "(b 0, head 0, i 0, j 1) is 1") != NULL);
    m[1] = 0;
    CHECK_EQ(npu_findings(&c, &rep, &st, 0), 0);
    /* the prefix list: missing, one entry too many, a negative entry */
    c.prefix = NULL;
    CHECK_EQ(npu_findings(&c, &rep, &st, 1), 1);
    CHECK(strstr(rep.findings[0].message, "sparse_mode 5 needs prefix (one length per batch), none passed") != NULL);
    const int64_t pf3[3] = {2, 0, 1}, pfneg[2] = {2, -1};
    int64_t three = 3;
    maskpack_tensor p3 = maskpack_tensor_contiguous((void *)pf3, MASKPACK_I64, 1, &three);
    c.prefix = &p3;
    CHECK(npu_findings(&c, &rep, &st, 1) >= 1);
    CHECK(strstr(rep.findings[0].message, "prefix has 3 entries, expected 2 (one per batch)") != NULL);
    maskpack_tensor pn = maskpack_tensor_contiguous((void *)pfneg, MASKPACK_I64, 1, &two);
    c.prefix = &pn;
    CHECK(npu_findings(&c, &rep, &st, 1) >= 1);
    CHECK(strstr(rep.findings[0].message, "prefix[1]: expected >= 0, found -1") != NULL);
    /* mode 5 does not exist for TND */
    c.prefix = &pt;
    c.input_layout = MASKPACK_NPU_TND;
    maskpack_error e;
    st = maskpack_validate_npu_args(&c, &rep, &e);
    int seen = 0;
    for (int i = 0; i < rep.n_findings; i++)
        seen |= strstr(rep.findings[i].message, "sparse_mode 5 (prefix with a full mask) is not supported with TND") != NULL;
    CHECK(seen);
    CHECK_EQ(st, MASKPACK_ERR_NPU_CONTRACT);
}

/* Every atten_mask shape form against sparse_modes 0, 1 (full masks: [B,N,S,S], [B,1,S,S], [1,1,S,S]
 * and [S,S] accepted) and 5 (BNSS / B1SS only); the padding-shaped ones get the hint to expand them. */
static void test_npu_mask_shapes(void) {
    static uint8_t m[2 * 3 * 4 * 4]; /* all 0: nothing masked */
    const int64_t shapes[][5] = {{4, 2, 1, 4, 4}, {4, 2, 2, 4, 4}, {4, 1, 1, 4, 4}, {2, 4, 4, 0, 0}, {4, 2, 3, 4, 4},
                                 {2, 2, 4, 0, 0}, {4, 2, 1, 1, 4}, {2, 1, 4, 0, 0}, {3, 2, 4, 4, 0}};
    /* 0 accepted, 1 refused, 2 refused with the padding hint, 3 refused: mode 5 needs BNSS/B1SS, 4 accepted
     * but the content is not causal + prefix */
    const int want[3][9] = {{0, 0, 0, 0, 1, 2, 2, 2, 1}, {0, 0, 0, 0, 1, 2, 2, 2, 1}, {4, 4, 3, 3, 1, 2, 2, 2, 1}};
    const int modes[3] = {0, 1, 5};
    const int64_t pf[2] = {1, 0};
    int64_t two = 2;
    maskpack_tensor pt = maskpack_tensor_contiguous((void *)pf, MASKPACK_I64, 1, &two);
    for (int mi = 0; mi < 3; mi++)
        for (int k = 0; k < 9; k++) {
            maskpack_tensor mt = maskpack_tensor_contiguous(m, MASKPACK_BOOL, (int32_t)shapes[k][0], shapes[k] + 1);
            maskpack_npu_call c;
            memset(&c, 0, sizeof c);
            c.input_layout = MASKPACK_NPU_BSND;
            c.batch = 2;
            c.q_len = c.kv_len = 4;
            c.heads_q = c.heads_kv = 2;
            c.head_dim = 64;
            c.sparse_mode = modes[mi];
            c.pre_tokens = c.next_tokens = 2147483647;
            c.atten_mask = &mt;
            c.scale = 0.125;
            if (modes[mi] == 5) c.prefix = &pt;
            maskpack_npu_report rep;
            maskpack_status st;
            const int w = want[mi][k];
            const int n = npu_findings(&c, &rep, &st, w == 0 ? 0 : 1);
            CHECK_EQ(n, w == 0 ? 0 : 1);
            CHECK_EQ(st, w == 0 ? MASKPACK_OK : MASKPACK_ERR_NPU_CONTRACT);
            if (w == 0 || rep.n_findings < 1) continue;
            const char *msg = rep.findings[0].message;
            CHECK_EQ(rep.findings[0].code, w == 4 ? MASKPACK_NPU_MASK_MISMATCH : MASKPACK_NPU_BAD_MASK_SHAPE);
            if (w == 1 || w == 2) CHECK(strstr(msg, "is not accepted (error 561103") != NULL);
            CHECK((w == 2) == (strstr(msg, "padding mask must be expanded to [B,1,Sq,Skv]") != NULL));
            if (w == 3) CHECK(strstr(msg, "sparse_mode 5 needs a BNSS or B1SS mask") != NULL);
        }
}

/* pre/next against a full mask (sparse_mode 0): an empty band, a band dropping pairs the mask allows,
 * clipping values with Sq != Skv; inner_precise 2 (rows that see nothing are then fine in BSND) */
static void test_npu_pre_next(void) {
    static uint8_t m[2 * 1 * 4 * 4]; /* all 0: every pair allowed */
    int64_t shape[4] = {2, 1, 4, 4};
    maskpack_tensor mt = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 4, shape);
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    c.input_layout = MASKPACK_NPU_BSND;
    c.batch = 2;
    c.q_len = c.kv_len = 4;
    c.heads_q = c.heads_kv = 2;
    c.head_dim = 64;
    c.sparse_mode = 0;
    c.pre_tokens = c.next_tokens = 2147483647;
    c.atten_mask = &mt;
    c.scale = 0.125;
    maskpack_npu_report rep;
    maskpack_status st;
    CHECK_EQ(npu_findings(&c, &rep, &st, 0), 0);
    /* next_tokens 0 drops (i 0, j 1), which the mask allows */
    c.next_tokens = 0;
    CHECK_EQ(npu_findings(&c, &rep, &st, 1), 1);
    CHECK(rep.findings[0].code == MASKPACK_NPU_PRE_NEXT_MISMATCH &&
          strstr(rep.findings[0].message, "atten_mask allows (b 0, head 0, i 0, j 1) but pre_tokens 2147483647 / "
                                          "next_tokens 0 drop it") != NULL);
    /* an empty band: every row fully masked (the pair check and the fully-masked-row check report too) */
    c.pre_tokens = -3;
    c.next_tokens = 1;
    CHECK_EQ(npu_findings(&c, &rep, &st, 3), 3);
    CHECK(strstr(rep.findings[0].message, "pre_tokens -3 + next_tokens 1 < 0: the band is empty") != NULL);
    /* Sq 2 != Skv 4 with clipping values: the origin is undocumented */
    int64_t shape2[4] = {2, 1, 2, 4};
    maskpack_tensor m2 = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 4, shape2);
    c.atten_mask = &m2;
    c.q_len = 2;
    c.pre_tokens = 0;
    c.next_tokens = 2147483647;
    CHECK_EQ(npu_findings(&c, &rep, &st, 2), 2); /* and the pair (i 1, j 0) dropped by pre_tokens 0 */
    CHECK(strstr(rep.findings[0].message, "sparse_mode 0 with Sq 2 != Skv 4 (batch 0) and a clipping pre/next (0, "
                                          "2147483647)") != NULL);
    /* a fully masked first row: a finding without inner_precise 2, none with it */
    c.atten_mask = &mt;
    c.q_len = 4;
    c.pre_tokens = c.next_tokens = 2147483647;
    for (int j = 0; j < 4; j++) m[j] = 1;
    CHECK(npu_findings(&c, &rep, &st, 1) >= 1);
    CHECK(rep.findings[0].code == MASKPACK_NPU_FULLY_MASKED_ROW);
    c.inner_precise = 2;
    CHECK_EQ(npu_findings(&c, &rep, &st, 0), 0);
    CHECK_EQ(st, MASKPACK_OK);
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
    expect_m4(&t3, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_SHAPE, "layout recovery needs a [B,1,S,S] or [B,H,S,S] mask, found 3");
    expect_m4(&t3, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_SHAPE, "expected [B,1,S,S], [B,H,S,S], [B,1,1,S] or [B,S], found 3");
    maskpack_tensor t4 = maskpack_tensor_contiguous(mi, MASKPACK_I32, 4, s4);
    expect_m4(&t4, (maskpack_mask_convention)7, 1, MASKPACK_ERR_CONVENTION, "convention: expected KEEP (0), MASKED (1) or ADDITIVE (2), found 7");
    expect_m4(&t4, MASKPACK_MASK_ADDITIVE, 0, MASKPACK_ERR_DTYPE, "an ADDITIVE mask needs a float dtype");
    maskpack_tensor th = maskpack_tensor_contiguous(mi, MASKPACK_I32, 4, h0);
    expect_m4(&th, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_SHAPE, "expected at least one head (dimension 1), found 0");
    maskpack_tensor tq = maskpack_tensor_contiguous(mi, MASKPACK_I32, 4, q2);
    expect_m4(&tq, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_UNSUPPORTED, "found Sq = 2, Skv = 4");
    expect_m4(&tq, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_SHAPE, "query dimension S or 1), found Sq = 2 with Skv = 4");
    /* values: each convention names what it accepts and the element that is not */
    for (int i = 0; i < 16; i++) mi[i] = 0, mf[i] = 0.0f;
    mi[1] = 2;
    expect_m4(&t4, MASKPACK_MASK_MASKED, 1, MASKPACK_ERR_VALUE, "mask[0, 0, 0, 1]: expected 0 or 1 in a MASKED mask (1 = excluded), found 2");
    expect_m4(&t4, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_VALUE, "expected 0 or 1 in a KEEP mask (1 = attend), found 2");
    maskpack_tensor t2 = maskpack_tensor_contiguous(mi, MASKPACK_I32, 2, s2);
    expect_m4(&t2, MASKPACK_MASK_KEEP, 0, MASKPACK_ERR_VALUE, "mask[0, 1]: expected 0 or 1 in a KEEP mask");
    mf[2] = 0.5f;
    maskpack_tensor f4 = maskpack_tensor_contiguous(mf, MASKPACK_F32, 4, s4);
    expect_m4(&f4, MASKPACK_MASK_KEEP, 1, MASKPACK_ERR_VALUE, "expected exactly 0 or 1 in a KEEP mask of dtype float32, found 0.5");
    mf[2] = 1.0f;
    expect_m4(&f4, MASKPACK_MASK_ADDITIVE, 1, MASKPACK_ERR_VALUE, "expected 0 (attend) or a negative value (excluded) in an ADDITIVE mask, found 1");
}

/* TND without one or both actual_seq lists: BAD_LAYOUT naming what is missing */
static void test_npu_tnd_lists(void) {
    const int64_t ends[2] = {3, 7};
    int64_t two = 2;
    maskpack_tensor lst = maskpack_tensor_contiguous((void *)ends, MASKPACK_I64, 1, &two);
    const char *want[3] = {"neither was passed", "actual_seq_qlen is missing", "actual_seq_kvlen is missing"};
    for (int k = 0; k < 3; k++) {
        maskpack_npu_call c;
        memset(&c, 0, sizeof c);
        c.input_layout = MASKPACK_NPU_TND;
        c.total_q = c.total_kv = 7;
        c.heads_q = c.heads_kv = 2;
        c.head_dim = 64;
        c.sparse_mode = 0;
        c.pre_tokens = c.next_tokens = 2147483647;
        c.scale = 0.125;
        c.actual_seq_qlen = k == 2 ? &lst : NULL;
        c.actual_seq_kvlen = k == 1 ? &lst : NULL;
        maskpack_npu_report rep;
        maskpack_error e;
        CHECK_EQ(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT);
        int seen = 0;
        for (int i = 0; i < rep.n_findings; i++)
            seen |= rep.findings[i].code == MASKPACK_NPU_BAD_LAYOUT && strstr(rep.findings[i].message, want[k]) != NULL;
        CHECK(seen);
    }
}

/* ---- the triangular GEMM's empty inner range ---------------------------------------------------------- */

typedef void (*gemm_x_fn)(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                          int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);

/* C [20 x 32] = cs Cin + alpha A B with A upper triangular (A(i, k) = 0 for k < i, GDN_GEMM_TRI_UP)
 * and kd = 8: the row blocks at or below row 8 have an empty inner range, and must come out as
 * exactly 0 (or cs Cin when accumulating); the others match the product in double. */
static void check_tri_up(const char *name, gemm_x_fn fn) {
    enum { M = 20, N = 32, KD = 8 };
    static float A[M * KD], B[KD * N], C[M * N], Cin[M * N];
    for (int i = 0; i < M; i++)
        for (int k = 0; k < KD; k++) A[i * KD + k] = k < i ? 0.0f : (float)((i * 7 + k * 3) % 11) / 8.0f - 0.6f;
    for (int k = 0; k < KD; k++)
        for (int j = 0; j < N; j++) B[k * N + j] = (float)((k * 5 + j * 13) % 17) / 16.0f - 0.5f;
    for (int i = 0; i < M * N; i++) Cin[i] = (float)(i % 23) - 11.0f;
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        const float alpha = 0.75f, cs = 0.5f;
        for (int i = 0; i < M * N; i++) C[i] = NAN; /* every entry must be written */
        const unsigned flags = GDN_GEMM_TRI_UP | (accumulate ? GDN_GEMM_ACC : 0u);
        fn(M, N, KD, alpha, A, KD, B, N, C, N, flags, NULL, Cin, cs);
        double worst = 0.0;
        int empty_rows_exact = 1;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double want = accumulate ? (double)cs * Cin[i * N + j] : 0.0;
                for (int k = 0; k < KD; k++) want += (double)alpha * A[i * KD + k] * B[k * N + j];
                const double d = fabs(C[i * N + j] - want);
                if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
                if (i >= KD && C[i * N + j] != (accumulate ? cs * Cin[i * N + j] : 0.0f)) empty_rows_exact = 0;
            }
        if (worst >= 1e-5 || !empty_rows_exact)
            fprintf(stderr, "%s: TRI_UP gemm (acc %d): worst %g, empty rows exact %d\n", name, accumulate, worst,
                    empty_rows_exact);
        CHECK(worst < 1e-5);
        CHECK(empty_rows_exact);
    }
}

static void test_gemm_empty_inner_range(void) {
    check_tri_up("ref", gdn_gemm_x_ref);
    maskpack_gdn_isa r;
    maskpack_error e;
    if (maskpack_gdn_resolve_isa(MASKPACK_GDN_ISA_AVX512, &r, &e) == MASKPACK_OK) check_tri_up("avx512", gdn_gemm_x_avx512);
    if (mp_cpu_has_avx2()) check_tri_up("avx2", gdn_gemm_x_avx2);
}

int main(void) {
    test_f16_every_value();
    test_f16_subnormal_rounding();
    test_element_conversions();
    test_segment_checks();
    test_plan_and_cp_arguments();
    test_gdn_guards();
    test_npu_mode5_full_mask();
    test_npu_mask_shapes();
    test_npu_pre_next();
    test_mask4d_checks();
    test_npu_tnd_lists();
    test_gemm_empty_inner_range();
    return check_report("test_coverage_paths");
}
