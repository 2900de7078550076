/* test_parse.c: layout constructors from lengths, 2D masks, cu_seqlens (TE and NPU forms, padded
 * slots, q/kv lists) and position ids (RESET and STEP rules, M-RoPE, tail padding). Every failure
 * case also checks that the `out` pointer was left untouched. */
#include "check.h"
#include "internal.h"

#include <stdlib.h>

/* A value no constructor can produce: failures must leave it in place. */
static char sentinel_storage;
#define SENTINEL ((maskpack_layout *)(void *)&sentinel_storage)

/* Runs `call` (which writes through &out) expecting status `st` and an untouched out. */
#define EXPECT_FAIL(call, st)                                                                                          \
    do {                                                                                                               \
        out = SENTINEL;                                                                                                \
        CHECK_STATUS(call, st, e);                                                                                     \
        CHECK(out == SENTINEL);                                                                                        \
        CHECK_EQ(e.status, st);                                                                                        \
    } while (0)

/* Checks segment i of L: row, q_start, q_len, and kv == q (self-attention). */
#define CHECK_SEG(L, i, row_, start_, len_)                                                                            \
    do {                                                                                                               \
        maskpack_segment g_;                                                                                           \
        maskpack_error ge_;                                                                                            \
        CHECK_OK(maskpack_layout_segment((L), (i), &g_, &ge_), ge_);                                                   \
        CHECK_EQ(g_.row, (row_));                                                                                      \
        CHECK_EQ(g_.q_start, (start_));                                                                                \
        CHECK_EQ(g_.q_len, (len_));                                                                                    \
        CHECK_EQ(g_.kv_start, (start_));                                                                               \
        CHECK_EQ(g_.kv_len, (len_));                                                                                   \
    } while (0)

/* Writes vals[0..n) into buf as dtype dt and returns a contiguous view of shape `shape`. */
static maskpack_tensor typed(void *buf, maskpack_dtype dt, const int64_t *vals, size_t n, int32_t ndim,
                             const int64_t *shape) {
    for (size_t i = 0; i < n; i++) mp_write_i64(dt, buf, (int64_t)i, vals[i]);
    return maskpack_tensor_contiguous(buf, dt, ndim, shape);
}

/* Two layouts have the same grid and segments. */
static int same_segments(const maskpack_layout *a, const maskpack_layout *b) {
    if (maskpack_layout_n_rows(a) != maskpack_layout_n_rows(b) ||
        maskpack_layout_q_width(a) != maskpack_layout_q_width(b) ||
        maskpack_layout_kv_width(a) != maskpack_layout_kv_width(b) ||
        maskpack_layout_is_packed(a) != maskpack_layout_is_packed(b) ||
        maskpack_layout_n_segments(a) != maskpack_layout_n_segments(b))
        return 0;
    for (size_t i = 0; i < maskpack_layout_n_segments(a); i++) {
        maskpack_segment x, y;
        if (maskpack_layout_segment(a, i, &x, NULL) || maskpack_layout_segment(b, i, &y, NULL)) return 0;
        if (x.row != y.row || x.q_start != y.q_start || x.q_len != y.q_len || x.kv_start != y.kv_start ||
            x.kv_len != y.kv_len || x.flags != y.flags)
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* from_lengths                                                                             */
/* ---------------------------------------------------------------------------------------- */

static void test_lengths_padded(void) {
    maskpack_error e;
    maskpack_layout *out = NULL;
    const int64_t len[3] = {3, 0, 5};

    CHECK_OK(maskpack_layout_from_lengths(len, 3, MASKPACK_PLACE_RIGHT, 0, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_rows(out), 3);
        CHECK_EQ(maskpack_layout_q_width(out), 5);
        CHECK_EQ(maskpack_layout_kv_width(out), 5);
        CHECK(!maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_n_segments(out), 3);
        CHECK_EQ(maskpack_layout_n_tokens(out), 8);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 1, 0, 0); /* an empty row keeps its (empty) segment */
        CHECK_SEG(out, 2, 2, 0, 5);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 1), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 1, 2), 0); /* default rule is causal */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 3, 0), 0); /* pad query */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 3), 0); /* pad key */
        CHECK_EQ(maskpack_segment_of_query(out, 1, 0), -1);
        CHECK_EQ(maskpack_segment_of_query(out, 2, 4), 2);
        maskpack_layout_free(out);
    }

    /* capacity widens the rows; a capacity below the longest length does not narrow them */
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(len, 3, MASKPACK_PLACE_RIGHT, 8, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_q_width(out), 8);
        CHECK_SEG(out, 2, 2, 0, 5);
        CHECK_EQ(maskpack_segment_of_query(out, 2, 5), -1);
        maskpack_layout_free(out);
    }
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(len, 3, MASKPACK_PLACE_RIGHT, 2, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_q_width(out), 5);
        maskpack_layout_free(out);
    }

    /* LEFT: tokens at the row end */
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(len, 3, MASKPACK_PLACE_LEFT, 6, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_rows(out), 3);
        CHECK_EQ(maskpack_layout_q_width(out), 6);
        CHECK_SEG(out, 0, 0, 3, 3);
        CHECK_SEG(out, 1, 1, 6, 0);
        CHECK_SEG(out, 2, 2, 1, 5);
        CHECK_EQ(maskpack_segment_of_query(out, 0, 2), -1);
        CHECK_EQ(maskpack_segment_of_query(out, 0, 3), 0);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 5, 3), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 5, 2), 0);
        maskpack_layout_free(out);
    }
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(len, 3, MASKPACK_PLACE_LEFT, 0, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_q_width(out), 5);
        CHECK_SEG(out, 0, 0, 2, 3);
        CHECK_SEG(out, 2, 2, 0, 5);
        maskpack_layout_free(out);
    }

    /* no sequences at all */
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(NULL, 0, MASKPACK_PLACE_RIGHT, 4, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_rows(out), 0);
        CHECK_EQ(maskpack_layout_n_segments(out), 0);
        maskpack_layout_free(out);
    }
}

static void test_lengths_packed(void) {
    maskpack_error e;
    maskpack_layout *out = NULL;

    /* capacity 0: one THD row */
    const int64_t len[3] = {3, 0, 2};
    CHECK_OK(maskpack_layout_from_lengths(len, 3, MASKPACK_PLACE_PACKED, 0, NULL, &out, &e), e);
    if (out) {
        CHECK(maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_n_rows(out), 1);
        CHECK_EQ(maskpack_layout_q_width(out), 5);
        CHECK_EQ(maskpack_layout_n_segments(out), 3);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 3, 0); /* empty segment at the current offset */
        CHECK_SEG(out, 2, 0, 3, 2);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 3), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 3, 2), 0); /* documents never see each other */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 0), 1);
        maskpack_layout_free(out);
    }
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(NULL, 0, MASKPACK_PLACE_PACKED, 0, NULL, &out, &e), e);
    if (out) {
        CHECK(maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_q_width(out), 0);
        CHECK_EQ(maskpack_layout_n_segments(out), 0);
        maskpack_layout_free(out);
    }

    /* capacity > 0: packed rows by next-fit, in input order */
    const int64_t rows[6] = {3, 1, 2, 0, 4, 0};
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(rows, 6, MASKPACK_PLACE_PACKED, 4, NULL, &out, &e), e);
    if (out) {
        CHECK(!maskpack_layout_is_packed(out)); /* a [B,S] packed-row layout, not THD */
        CHECK_EQ(maskpack_layout_n_rows(out), 3);
        CHECK_EQ(maskpack_layout_q_width(out), 4);
        CHECK_EQ(maskpack_layout_n_segments(out), 6);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 3, 1);
        CHECK_SEG(out, 2, 1, 0, 2);
        CHECK_SEG(out, 3, 1, 2, 0);
        CHECK_SEG(out, 4, 2, 0, 4);
        CHECK_SEG(out, 5, 2, 4, 0);                         /* empty segment at the full row's end */
        CHECK_EQ(maskpack_segment_of_query(out, 1, 3), -1); /* row 1 padded after 2 tokens */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 3, 2), 0);
        CHECK_EQ(maskpack_allowed(out, 2, 0, 3, 0), 1);
        maskpack_layout_free(out);
    }
    /* next-fit never goes back to an earlier row (first-fit would put the 1 in row 0) */
    const int64_t nf[3] = {3, 2, 1};
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(nf, 3, MASKPACK_PLACE_PACKED, 4, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_rows(out), 2);
        CHECK_SEG(out, 2, 1, 2, 1);
        maskpack_layout_free(out);
    }
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(NULL, 0, MASKPACK_PLACE_PACKED, 4, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_rows(out), 0);
        maskpack_layout_free(out);
    }
}

static void test_lengths_errors(void) {
    maskpack_error e;
    maskpack_layout *out;
    const int64_t neg[3] = {2, 1, -4};
    EXPECT_FAIL(maskpack_layout_from_lengths(neg, 3, MASKPACK_PLACE_RIGHT, 0, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 2);
    CHECK_MSG(e, "lengths[2]: expected >= 0, found -4");
    CHECK(strcmp(e.argument, "lengths") == 0);
    EXPECT_FAIL(maskpack_layout_from_lengths(neg, 3, MASKPACK_PLACE_PACKED, 0, NULL, &out, &e), MASKPACK_ERR_VALUE);

    const int64_t big[3] = {2, 5, 1};
    EXPECT_FAIL(maskpack_layout_from_lengths(big, 3, MASKPACK_PLACE_PACKED, 4, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 1);
    CHECK_MSG(e, "lengths[1]");
    CHECK_MSG(e, "capacity 4");
    CHECK_MSG(e, "found 5");

    const int64_t ok[2] = {3, 2};
    EXPECT_FAIL(maskpack_layout_from_lengths(ok, 2, MASKPACK_PLACE_RIGHT, -1, NULL, &out, &e),
                MASKPACK_ERR_INVALID_ARGUMENT);
    CHECK_MSG(e, "capacity");
    EXPECT_FAIL(maskpack_layout_from_lengths(ok, 2, (maskpack_placement)7, 0, NULL, &out, &e),
                MASKPACK_ERR_INVALID_ARGUMENT);
    CHECK_MSG(e, "placement");
    EXPECT_FAIL(maskpack_layout_from_lengths(NULL, 2, MASKPACK_PLACE_RIGHT, 0, NULL, &out, &e),
                MASKPACK_ERR_NULL_ARGUMENT);
    CHECK_STATUS(maskpack_layout_from_lengths(ok, 2, MASKPACK_PLACE_RIGHT, 0, NULL, NULL, &e),
                 MASKPACK_ERR_NULL_ARGUMENT, e);

    const int64_t huge[2] = {INT64_MAX, 1};
    EXPECT_FAIL(maskpack_layout_from_lengths(huge, 2, MASKPACK_PLACE_PACKED, 0, NULL, &out, &e), MASKPACK_ERR_OVERFLOW);
    EXPECT_FAIL(maskpack_layout_from_lengths(huge, 2, MASKPACK_PLACE_RIGHT, 0, NULL, &out, &e), MASKPACK_ERR_OVERFLOW);

    /* the rule is checked against the segments the lengths produce */
    maskpack_rule r = maskpack_rule_default();
    int64_t prefix[2] = {2, 0};
    r.prefix = prefix;
    r.n_prefix = 1; /* wrong count */
    EXPECT_FAIL(maskpack_layout_from_lengths(ok, 2, MASKPACK_PLACE_PACKED, 0, &r, &out, &e), MASKPACK_ERR_RULE);
    r.n_prefix = 2;
    prefix[1] = 3; /* longer than segment 1 */
    EXPECT_FAIL(maskpack_layout_from_lengths(ok, 2, MASKPACK_PLACE_PACKED, 0, &r, &out, &e), MASKPACK_ERR_RULE);
    CHECK_EQ(e.index[0], 1);
    prefix[1] = 0;
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(ok, 2, MASKPACK_PLACE_PACKED, 0, &r, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 1), 1); /* inside the prefix */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 2), 0); /* beyond prefix, causal */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 3, 4), 0); /* segment 1 has no prefix */
        maskpack_layout_free(out);
    }
    r = maskpack_rule_default();
    r.causal = 0;
    out = NULL;
    CHECK_OK(maskpack_layout_from_lengths(ok, 2, MASKPACK_PLACE_RIGHT, 0, &r, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 2), 1);
        maskpack_layout_free(out);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* from_mask2d                                                                              */
/* ---------------------------------------------------------------------------------------- */

static const int64_t keep_vals[4 * 6] = {
    1, 1, 1, 0, 0, 0, /* right padding */
    0, 0, 1, 1, 1, 1, /* left padding */
    0, 1, 1, 1, 0, 0, /* both sides */
    0, 0, 0, 0, 0, 0, /* no tokens */
};

static void check_keep_layout(const maskpack_layout *L) {
    CHECK_EQ(maskpack_layout_n_rows(L), 4);
    CHECK_EQ(maskpack_layout_q_width(L), 6);
    CHECK(!maskpack_layout_is_packed(L));
    CHECK_EQ(maskpack_layout_n_segments(L), 3);
    CHECK_SEG(L, 0, 0, 0, 3);
    CHECK_SEG(L, 1, 1, 2, 4);
    CHECK_SEG(L, 2, 2, 1, 3);
    for (int64_t s = 0; s < 6; s++) CHECK_EQ(maskpack_segment_of_query(L, 3, s), -1);
    CHECK_EQ(maskpack_segment_of_query(L, 2, 0), -1);
    CHECK_EQ(maskpack_segment_of_query(L, 2, 4), -1);
    CHECK_EQ(maskpack_allowed(L, 2, 0, 3, 1), 1);
    CHECK_EQ(maskpack_allowed(L, 1, 0, 5, 2), 1);
    CHECK_EQ(maskpack_allowed(L, 1, 0, 5, 1), 0);
}

static void test_mask2d_keep(void) {
    maskpack_error e;
    maskpack_layout *out;
    int64_t buf[24];
    const int64_t shape[2] = {4, 6};
    const maskpack_dtype dts[6] = {MASKPACK_BOOL, MASKPACK_U8, MASKPACK_I8, MASKPACK_I16, MASKPACK_I32, MASKPACK_I64};
    for (int d = 0; d < 6; d++) {
        maskpack_tensor t = typed(buf, dts[d], keep_vals, 24, 2, shape);
        out = NULL;
        CHECK_OK(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), e);
        if (out) {
            check_keep_layout(out);
            maskpack_layout_free(out);
        }
    }

    /* a transposed view: storage is [S,B], the view [B,S] with strides (1, B) */
    int32_t tr[24];
    for (int b = 0; b < 4; b++)
        for (int s = 0; s < 6; s++) tr[s * 4 + b] = (int32_t)keep_vals[b * 6 + s];
    maskpack_tensor tv = maskpack_tensor_contiguous(tr, MASKPACK_I32, 2, shape);
    tv.strides[0] = 1;
    tv.strides[1] = 4;
    out = NULL;
    CHECK_OK(maskpack_layout_from_mask2d(&tv, MASKPACK_MASK2D_KEEP, NULL, &out, &e), e);
    if (out) {
        check_keep_layout(out);
        maskpack_layout_free(out);
    }

    /* a view with a negative column stride reverses each row: right padding becomes left padding */
    int32_t fw[24];
    for (int i = 0; i < 24; i++) fw[i] = (int32_t)keep_vals[i];
    maskpack_tensor rv = maskpack_tensor_contiguous(fw + 5, MASKPACK_I32, 2, shape);
    rv.strides[1] = -1;
    out = NULL;
    CHECK_OK(maskpack_layout_from_mask2d(&rv, MASKPACK_MASK2D_KEEP, NULL, &out, &e), e);
    if (out) {
        CHECK_SEG(out, 0, 0, 3, 3);
        CHECK_SEG(out, 1, 1, 0, 4);
        CHECK_SEG(out, 2, 2, 2, 3);
        maskpack_layout_free(out);
    }

    /* the rule travels: bidirectional lets query 0 see key 2 */
    maskpack_rule r = maskpack_rule_default();
    r.causal = 0;
    maskpack_tensor t = typed(buf, MASKPACK_I64, keep_vals, 24, 2, shape);
    out = NULL;
    CHECK_OK(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, &r, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 2), 1);
        maskpack_layout_free(out);
    }
}

static void test_mask2d_keep_errors(void) {
    maskpack_error e;
    maskpack_layout *out;
    int64_t buf[24];
    const int64_t shape[2] = {3, 6};

    /* hole in row 1 at column 2 */
    const int64_t hole[18] = {1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0};
    maskpack_tensor t = typed(buf, MASKPACK_I32, hole, 18, 2, shape);
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_HOLE);
    CHECK_EQ(e.index[0], 1);
    CHECK_EQ(e.index[1], 2);
    CHECK_MSG(e, "mask[1, 2]");
    CHECK_MSG(e, "row 1");

    /* the hole's first column is reported, not the column of the token after it */
    const int64_t hole2[6] = {0, 1, 0, 0, 1, 1};
    const int64_t s1[2] = {1, 6};
    t = typed(buf, MASKPACK_BOOL, hole2, 6, 2, s1);
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_HOLE);
    CHECK_EQ(e.index[0], 0);
    CHECK_EQ(e.index[1], 2);
    CHECK_MSG(e, "mask[0, 2]");

    /* values other than 0/1 */
    const int64_t two[18] = {1, 1, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
    t = typed(buf, MASKPACK_I64, two, 18, 2, shape);
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 1);
    CHECK_EQ(e.index[1], 1);
    CHECK_MSG(e, "found 2");
    const int64_t m1[18] = {1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, -1, 0};
    t = typed(buf, MASKPACK_I8, m1, 18, 2, shape);
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 2);
    CHECK_EQ(e.index[1], 4);
    CHECK_MSG(e, "found -1");

    /* floats are rejected even when they hold 0/1 */
    float f[24];
    maskpack_tensor tf = typed(f, MASKPACK_F32, keep_vals, 24, 2, (const int64_t[2]){4, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&tf, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_DTYPE);
    CHECK_MSG(e, "float32");
    uint16_t h[24];
    maskpack_tensor th = typed(h, MASKPACK_BF16, keep_vals, 24, 2, (const int64_t[2]){4, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&th, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), MASKPACK_ERR_DTYPE);

    /* rank, convention, NULLs */
    t = typed(buf, MASKPACK_I32, keep_vals, 6, 1, (const int64_t[1]){6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_SHAPE);
    t = typed(buf, MASKPACK_I32, keep_vals, 24, 2, (const int64_t[2]){4, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, (maskpack_mask2d_convention)9, NULL, &out, &e),
                MASKPACK_ERR_CONVENTION);
    EXPECT_FAIL(maskpack_layout_from_mask2d(NULL, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_NULL_ARGUMENT);
    CHECK_STATUS(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    /* a bad rule fails after validation without touching out */
    maskpack_rule r = maskpack_rule_default();
    r.window_left = -3;
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, &r, &out, &e), MASKPACK_ERR_RULE);
    /* an empty mask is legal */
    t = maskpack_tensor_contiguous(NULL, MASKPACK_BOOL, 2, (const int64_t[2]){0, 5});
    out = NULL;
    CHECK_OK(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_rows(out), 0);
        CHECK_EQ(maskpack_layout_q_width(out), 5);
        maskpack_layout_free(out);
    }
}

static void test_mask2d_doc_id(void) {
    maskpack_error e;
    maskpack_layout *out;
    int64_t buf[24];
    const int64_t shape[2] = {4, 6};
    const int64_t docs[24] = {
        1, 1, 2, 2, 2, 0, /* two documents back to back, then pad */
        1, 1, 0, 2, 0, 3, /* pads between documents; ids repeat from row 0 */
        0, 0, 0, 0, 0, 0, /* no documents */
        5, 5, 5, 5, 5, 5, /* any positive id */
    };
    const maskpack_dtype dts[3] = {MASKPACK_U8, MASKPACK_I32, MASKPACK_I64};
    for (int d = 0; d < 3; d++) {
        maskpack_tensor t = typed(buf, dts[d], docs, 24, 2, shape);
        out = NULL;
        CHECK_OK(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), e);
        if (!out) continue;
        CHECK(!maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_n_rows(out), 4);
        CHECK_EQ(maskpack_layout_n_segments(out), 6);
        CHECK_SEG(out, 0, 0, 0, 2);
        CHECK_SEG(out, 1, 0, 2, 3);
        CHECK_SEG(out, 2, 1, 0, 2);
        CHECK_SEG(out, 3, 1, 3, 1);
        CHECK_SEG(out, 4, 1, 5, 1);
        CHECK_SEG(out, 5, 3, 0, 6);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 1, 0), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 1), 0); /* id change = boundary */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 2), 1);
        CHECK_EQ(maskpack_allowed(out, 1, 0, 3, 1), 0);
        CHECK_EQ(maskpack_segment_of_query(out, 1, 2), -1);
        CHECK_EQ(maskpack_segment_of_query(out, 0, 5), -1);
        maskpack_layout_free(out);
    }
    /* a bool mask read as doc ids is one document per run of 1s */
    const int64_t two_runs[6] = {1, 1, 0, 0, 0, 0};
    maskpack_tensor tb = typed(buf, MASKPACK_BOOL, two_runs, 6, 2, (const int64_t[2]){1, 6});
    out = NULL;
    CHECK_OK(maskpack_layout_from_mask2d(&tb, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 1);
        CHECK_SEG(out, 0, 0, 0, 2);
        maskpack_layout_free(out);
    }

    /* transposed view of the doc-id mask gives the same layout */
    int64_t tr[24];
    for (int b = 0; b < 4; b++)
        for (int s = 0; s < 6; s++) tr[s * 4 + b] = docs[b * 6 + s];
    maskpack_tensor tv = maskpack_tensor_contiguous(tr, MASKPACK_I64, 2, shape);
    tv.strides[0] = 1;
    tv.strides[1] = 4;
    maskpack_tensor tc = typed(buf, MASKPACK_I64, docs, 24, 2, shape);
    maskpack_layout *a = NULL, *b = NULL;
    CHECK_OK(maskpack_layout_from_mask2d(&tv, MASKPACK_MASK2D_DOC_ID, NULL, &a, &e), e);
    CHECK_OK(maskpack_layout_from_mask2d(&tc, MASKPACK_MASK2D_DOC_ID, NULL, &b, &e), e);
    if (a && b) CHECK(same_segments(a, b));
    maskpack_layout_free(a);
    maskpack_layout_free(b);

    /* an id split by another id */
    const int64_t split[12] = {1, 1, 1, 0, 0, 0, 1, 1, 2, 1, 0, 0};
    maskpack_tensor t = typed(buf, MASKPACK_I32, split, 12, 2, (const int64_t[2]){2, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), MASKPACK_ERR_HOLE);
    CHECK_EQ(e.index[0], 1);
    CHECK_EQ(e.index[1], 3);
    CHECK_MSG(e, "mask[1, 3]");
    CHECK_MSG(e, "id 1");
    /* an id split by padding */
    const int64_t gap[6] = {3, 0, 3, 0, 0, 0};
    t = typed(buf, MASKPACK_I16, gap, 6, 2, (const int64_t[2]){1, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), MASKPACK_ERR_HOLE);
    CHECK_EQ(e.index[1], 2);
    /* two ids coming back: the earliest return is reported (id 1 at column 2, not id 2 at 3) */
    const int64_t both[6] = {2, 1, 1, 2, 0, 0};
    const int64_t both2[6] = {1, 2, 1, 2, 0, 0};
    t = typed(buf, MASKPACK_I32, both, 6, 2, (const int64_t[2]){1, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), MASKPACK_ERR_HOLE);
    CHECK_EQ(e.index[1], 3);
    t = typed(buf, MASKPACK_I32, both2, 6, 2, (const int64_t[2]){1, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), MASKPACK_ERR_HOLE);
    CHECK_EQ(e.index[1], 2);
    /* negative ids */
    const int64_t neg[6] = {1, 1, -2, 0, 0, 0};
    t = typed(buf, MASKPACK_I64, neg, 6, 2, (const int64_t[2]){1, 6});
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_DOC_ID, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 0);
    CHECK_EQ(e.index[1], 2);
    CHECK_MSG(e, "found -2");
    /* the KEEP reading of a doc-id mask is refused (values 2, 3) */
    t = typed(buf, MASKPACK_I64, docs, 24, 2, shape);
    EXPECT_FAIL(maskpack_layout_from_mask2d(&t, MASKPACK_MASK2D_KEEP, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[1], 2);
}

/* ---------------------------------------------------------------------------------------- */
/* from_cu_seqlens                                                                          */
/* ---------------------------------------------------------------------------------------- */

static void test_cu_basic(void) {
    maskpack_error e;
    maskpack_layout *out = NULL;
    int32_t b32[8];
    int64_t b64[8];

    /* TE int32 [0,3,5,9] */
    const int64_t te[4] = {0, 3, 5, 9};
    maskpack_tensor t = typed(b32, MASKPACK_I32, te, 4, 1, (const int64_t[1]){4});
    CHECK_OK(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), e);
    if (out) {
        CHECK(maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_n_rows(out), 1);
        CHECK_EQ(maskpack_layout_q_width(out), 9);
        CHECK_EQ(maskpack_layout_n_segments(out), 3);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 3, 2);
        CHECK_SEG(out, 2, 0, 5, 4);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 3), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 5, 4), 0);
        maskpack_layout_free(out);
    }
    /* total beyond the last end: trailing tokens are padding */
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 12, NULL, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_q_width(out), 12);
        CHECK_EQ(maskpack_layout_n_tokens(out), 9);
        CHECK_EQ(maskpack_segment_of_query(out, 0, 10), -1);
        maskpack_layout_free(out);
    }

    /* NPU lengths [2,2,0,2,2] -> ends [2,4,4,6,8] (int64); same layout as the TE list [0,2,4,4,6,8] */
    const int64_t npu[5] = {2, 4, 4, 6, 8};
    const int64_t te2[6] = {0, 2, 4, 4, 6, 8};
    maskpack_tensor tn = typed(b64, MASKPACK_I64, npu, 5, 1, (const int64_t[1]){5});
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens(&tn, MASKPACK_CU_NPU, 0, NULL, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 5);
        CHECK_EQ(maskpack_layout_q_width(out), 8);
        const int64_t starts[5] = {0, 2, 4, 4, 6}, lens[5] = {2, 2, 0, 2, 2};
        for (size_t k = 0; k < 5; k++) CHECK_SEG(out, k, 0, starts[k], lens[k]);
        maskpack_tensor tt = typed(b32, MASKPACK_I32, te2, 6, 1, (const int64_t[1]){6});
        maskpack_layout *other = NULL;
        CHECK_OK(maskpack_layout_from_cu_seqlens(&tt, MASKPACK_CU_TE, 0, NULL, NULL, &other, &e), e);
        if (other) CHECK(same_segments(out, other));
        maskpack_layout_free(other);
        maskpack_layout_free(out);
    }

    /* NPU form with a leading 0: an empty first item, not an error (docs/conventions.md sections 1 and 6) */
    tn = typed(b64, MASKPACK_I64, te, 4, 1, (const int64_t[1]){4});
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens(&tn, MASKPACK_CU_NPU, 0, NULL, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 4);
        CHECK_SEG(out, 0, 0, 0, 0);
        CHECK_SEG(out, 1, 0, 0, 3);
        CHECK_SEG(out, 2, 0, 3, 2);
        CHECK_SEG(out, 3, 0, 5, 4);
        maskpack_layout_free(out);
    }

    /* degenerate lists: TE [0] and an empty NPU list */
    tn = typed(b64, MASKPACK_I64, te, 1, 1, (const int64_t[1]){1});
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens(&tn, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 0);
        CHECK_EQ(maskpack_layout_q_width(out), 0);
        maskpack_layout_free(out);
    }
    tn = maskpack_tensor_contiguous(NULL, MASKPACK_I32, 1, (const int64_t[1]){0});
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens(&tn, MASKPACK_CU_NPU, 4, NULL, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 0);
        CHECK_EQ(maskpack_layout_q_width(out), 4);
        maskpack_layout_free(out);
    }

    /* a strided view: every other element of a longer buffer */
    int64_t sv[8] = {0, -7, 3, -7, 5, -7, 9, -7};
    maskpack_tensor ts = maskpack_tensor_contiguous(sv, MASKPACK_I64, 1, (const int64_t[1]){4});
    ts.strides[0] = 2;
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens(&ts, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 3);
        CHECK_SEG(out, 2, 0, 5, 4);
        maskpack_layout_free(out);
    }
}

static void test_cu_padded(void) {
    maskpack_error e;
    maskpack_layout *out = NULL;
    int32_t b32[8];
    int64_t b64[8];
    /* tokens `a a a . b b . . c c c c .` */
    const int64_t cu[4] = {0, 3, 5, 9}, pad[4] = {0, 4, 8, 13};
    maskpack_tensor t = typed(b32, MASKPACK_I32, cu, 4, 1, (const int64_t[1]){4});
    maskpack_tensor p = typed(b64, MASKPACK_I64, pad, 4, 1, (const int64_t[1]){4});
    CHECK_OK(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, &p, NULL, &out, &e), e);
    if (out) {
        CHECK(maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_q_width(out), 13);
        CHECK_EQ(maskpack_layout_n_tokens(out), 9);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 4, 2);
        CHECK_SEG(out, 2, 0, 8, 4);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 0), 1);  /* a sees a */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 2), 0);  /* causal */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 2), 0);  /* b does not see a */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 5, 4), 1);  /* b sees b */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 5, 3), 0);  /* filler key */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 3, 3), 0);  /* filler query */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 6, 5), 0);  /* filler query after b */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 11, 8), 1); /* c sees c */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 8, 5), 0);  /* c does not see b */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 12, 12), 0);
        CHECK_EQ(maskpack_segment_of_query(out, 0, 12), -1);
        /* the same with the real lengths in NPU form */
        const int64_t npu[3] = {3, 5, 9};
        int64_t nb[3];
        maskpack_tensor tn = typed(nb, MASKPACK_I64, npu, 3, 1, (const int64_t[1]){3});
        maskpack_layout *other = NULL;
        CHECK_OK(maskpack_layout_from_cu_seqlens(&tn, MASKPACK_CU_NPU, 13, &p, NULL, &other, &e), e);
        if (other) CHECK(same_segments(out, other));
        maskpack_layout_free(other);
        maskpack_layout_free(out);
    }
    /* a total larger than the last slot adds trailing padding */
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 16, &p, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_q_width(out), 16);
        maskpack_layout_free(out);
    }
    /* the last slot must fit in total */
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 12, &p, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK(strcmp(e.argument, "total") == 0);
    CHECK_MSG(e, "expected >= 13");
    /* slot 0 of 2 tokens cannot hold 3 */
    const int64_t small[4] = {0, 2, 8, 13};
    maskpack_tensor ps = typed(b64, MASKPACK_I64, small, 4, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, &ps, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK(strcmp(e.argument, "cu_seqlens_padded") == 0);
    CHECK_EQ(e.index[0], 1);
    CHECK_MSG(e, "cu_seqlens_padded[1]: expected >= cu_seqlens_padded[0] + 3");
    CHECK_MSG(e, "found a slot of 2");
    /* padded list must be TE form with N+1 entries, sorted */
    const int64_t nolead[3] = {4, 8, 13};
    ps = typed(b64, MASKPACK_I64, nolead, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, &ps, NULL, &out, &e), MASKPACK_ERR_CONVENTION);
    CHECK(strcmp(e.argument, "cu_seqlens_padded") == 0);
    const int64_t three[3] = {0, 4, 8};
    ps = typed(b64, MASKPACK_I64, three, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, &ps, NULL, &out, &e), MASKPACK_ERR_SHAPE);
    CHECK_MSG(e, "expected 4 entries");
    const int64_t shifted[4] = {1, 4, 8, 13};
    ps = typed(b64, MASKPACK_I64, shifted, 4, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, &ps, NULL, &out, &e), MASKPACK_ERR_CONVENTION);
    const int64_t unsorted[4] = {0, 4, 3, 13};
    ps = typed(b64, MASKPACK_I64, unsorted, 4, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, &ps, NULL, &out, &e), MASKPACK_ERR_UNSORTED);
    CHECK_EQ(e.index[0], 2);
    float fp[4] = {0, 4, 8, 13};
    ps = maskpack_tensor_contiguous(fp, MASKPACK_F32, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, &ps, NULL, &out, &e), MASKPACK_ERR_DTYPE);
}

static void test_cu_errors(void) {
    maskpack_error e;
    maskpack_layout *out;
    int64_t b64[8];
    int32_t b32[8];

    /* TE list without its leading 0: the error explains the forms */
    const int64_t nolead[3] = {3, 5, 9};
    maskpack_tensor t = typed(b32, MASKPACK_I32, nolead, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), MASKPACK_ERR_CONVENTION);
    CHECK_EQ(e.index[0], 0);
    CHECK_MSG(e, "starts with 0");
    CHECK_MSG(e, "NPU");
    CHECK(strcmp(e.argument, "cu_seqlens") == 0);

    /* decreasing entries */
    const int64_t dec[4] = {0, 3, 2, 9};
    t = typed(b64, MASKPACK_I64, dec, 4, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), MASKPACK_ERR_UNSORTED);
    CHECK_EQ(e.index[0], 2);
    CHECK_MSG(e, "cu_seqlens[2]: expected >= 3 (non-decreasing), found 2");
    const int64_t dec2[3] = {4, 6, 5};
    t = typed(b32, MASKPACK_I32, dec2, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_NPU, 0, NULL, NULL, &out, &e), MASKPACK_ERR_UNSORTED);
    CHECK_EQ(e.index[0], 2);
    CHECK_MSG(e, "found 5");
    /* negative first end */
    const int64_t negs[2] = {-1, 4};
    t = typed(b64, MASKPACK_I64, negs, 2, 1, (const int64_t[1]){2});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_NPU, 0, NULL, NULL, &out, &e), MASKPACK_ERR_VALUE);
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), MASKPACK_ERR_VALUE);

    /* total */
    const int64_t te[4] = {0, 3, 5, 9};
    t = typed(b64, MASKPACK_I64, te, 4, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 8, NULL, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_MSG(e, "total: expected >= 9");
    CHECK_MSG(e, "found 8");
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, -1, NULL, NULL, &out, &e),
                MASKPACK_ERR_INVALID_ARGUMENT);

    /* dtype, rank, form, empty TE */
    int16_t s16[4] = {0, 3, 5, 9};
    maskpack_tensor t16 = maskpack_tensor_contiguous(s16, MASKPACK_I16, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t16, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), MASKPACK_ERR_DTYPE);
    double fd[4] = {0, 3, 5, 9};
    maskpack_tensor tf = maskpack_tensor_contiguous(fd, MASKPACK_F64, 1, (const int64_t[1]){4});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&tf, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), MASKPACK_ERR_DTYPE);
    maskpack_tensor t2 = typed(b64, MASKPACK_I64, te, 4, 2, (const int64_t[2]){2, 2});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t2, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), MASKPACK_ERR_SHAPE);
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, (maskpack_cu_form)3, 0, NULL, NULL, &out, &e),
                MASKPACK_ERR_CONVENTION);
    maskpack_tensor empty = maskpack_tensor_contiguous(NULL, MASKPACK_I32, 1, (const int64_t[1]){0});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&empty, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e), MASKPACK_ERR_SHAPE);
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(NULL, MASKPACK_CU_TE, 0, NULL, NULL, &out, &e),
                MASKPACK_ERR_NULL_ARGUMENT);
    CHECK_STATUS(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, NULL, NULL, NULL, &e),
                 MASKPACK_ERR_NULL_ARGUMENT, e);
    /* a rule the segments cannot carry */
    maskpack_rule r = maskpack_rule_default();
    const int64_t prefix[3] = {1, 5, 0}; /* segment 1 has only 2 tokens */
    r.prefix = prefix;
    r.n_prefix = 3;
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens(&t, MASKPACK_CU_TE, 0, NULL, &r, &out, &e), MASKPACK_ERR_RULE);
    CHECK_EQ(e.index[0], 1);
}

static void test_cu_qk(void) {
    maskpack_error e;
    maskpack_layout *out = NULL;
    int32_t bq[4];
    int64_t bk[4];
    const int64_t q[3] = {0, 2, 5}, kv[3] = {0, 4, 9};
    maskpack_tensor tq = typed(bq, MASKPACK_I32, q, 3, 1, (const int64_t[1]){3});
    maskpack_tensor tk = typed(bk, MASKPACK_I64, kv, 3, 1, (const int64_t[1]){3});
    CHECK_OK(maskpack_layout_from_cu_seqlens_qk(&tq, &tk, MASKPACK_CU_TE, NULL, &out, &e), e);
    if (out) {
        CHECK(maskpack_layout_is_packed(out));
        CHECK(!maskpack_layout_is_self(out));
        CHECK_EQ(maskpack_layout_q_width(out), 5);
        CHECK_EQ(maskpack_layout_kv_width(out), 9);
        CHECK_EQ(maskpack_layout_n_segments(out), 2);
        maskpack_segment g;
        CHECK_OK(maskpack_layout_segment(out, 1, &g, &e), e);
        CHECK_EQ(g.q_start, 2);
        CHECK_EQ(g.q_len, 3);
        CHECK_EQ(g.kv_start, 4);
        CHECK_EQ(g.kv_len, 5);
        /* default rule: bottom-right causal, offset kv_len - q_len = 2 per segment */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 2), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 3), 0);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 1, 3), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 6), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 7), 0);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 2, 3), 0); /* segment 0's key */
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 8), 1);
        /* the same in NPU form */
        const int64_t qn[2] = {2, 5}, kn[2] = {4, 9};
        int64_t b1[2], b2[2];
        maskpack_tensor nq = typed(b1, MASKPACK_I64, qn, 2, 1, (const int64_t[1]){2});
        maskpack_tensor nk = typed(b2, MASKPACK_I64, kn, 2, 1, (const int64_t[1]){2});
        maskpack_layout *other = NULL;
        CHECK_OK(maskpack_layout_from_cu_seqlens_qk(&nq, &nk, MASKPACK_CU_NPU, NULL, &other, &e), e);
        if (other) CHECK(same_segments(out, other));
        maskpack_layout_free(other);
        maskpack_layout_free(out);
    }
    /* top-left alignment changes what query 0 sees */
    maskpack_rule r = maskpack_rule_default();
    r.alignment = MASKPACK_ALIGN_TOP_LEFT;
    out = NULL;
    CHECK_OK(maskpack_layout_from_cu_seqlens_qk(&tq, &tk, MASKPACK_CU_TE, &r, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 0), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 1), 0);
        maskpack_layout_free(out);
    }
    /* errors */
    maskpack_tensor short_kv = maskpack_tensor_contiguous(bk, MASKPACK_I64, 1, (const int64_t[1]){2});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens_qk(&tq, &short_kv, MASKPACK_CU_TE, NULL, &out, &e), MASKPACK_ERR_SHAPE);
    const int64_t kbad[3] = {0, 4, 3};
    int64_t bkb[3];
    maskpack_tensor tkb = typed(bkb, MASKPACK_I64, kbad, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens_qk(&tq, &tkb, MASKPACK_CU_TE, NULL, &out, &e), MASKPACK_ERR_UNSORTED);
    CHECK(strcmp(e.argument, "cu_seqlens_kv") == 0);
    CHECK_EQ(e.index[0], 2);
    const int64_t qbad[3] = {1, 2, 5};
    int32_t bqb[3];
    maskpack_tensor tqb = typed(bqb, MASKPACK_I32, qbad, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens_qk(&tqb, &tk, MASKPACK_CU_TE, NULL, &out, &e), MASKPACK_ERR_CONVENTION);
    CHECK(strcmp(e.argument, "cu_seqlens_q") == 0);
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens_qk(&tq, NULL, MASKPACK_CU_TE, NULL, &out, &e),
                MASKPACK_ERR_NULL_ARGUMENT);
    /* spans need q_len == kv_len: the rule check sees the cross segments */
    maskpack_span sp = {0, 0, 2};
    r = maskpack_rule_default();
    r.spans = &sp;
    r.n_spans = 1;
    EXPECT_FAIL(maskpack_layout_from_cu_seqlens_qk(&tq, &tk, MASKPACK_CU_TE, &r, &out, &e), MASKPACK_ERR_RULE);
}

/* ---------------------------------------------------------------------------------------- */
/* from_position_ids                                                                        */
/* ---------------------------------------------------------------------------------------- */

static void test_pos_packed(void) {
    maskpack_error e;
    maskpack_layout *out;
    int64_t buf[16];

    /* [0,1,2,0,1,0,0,0]: sequences of 3 and 2, then 3 pad tokens (not three length-1 sequences) */
    const int64_t tail[8] = {0, 1, 2, 0, 1, 0, 0, 0};
    maskpack_tensor t = typed(buf, MASKPACK_I64, tail, 8, 1, (const int64_t[1]){8});
    for (int rule = 0; rule < 2; rule++) {
        out = NULL;
        CHECK_OK(maskpack_layout_from_position_ids(&t, (maskpack_boundary_rule)rule, NULL, &out, &e), e);
        if (!out) continue;
        CHECK(maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_n_rows(out), 1);
        CHECK_EQ(maskpack_layout_q_width(out), 8);
        CHECK_EQ(maskpack_layout_n_segments(out), 2);
        CHECK_EQ(maskpack_layout_n_tokens(out), 5);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 3, 2);
        for (int64_t c = 5; c < 8; c++) CHECK_EQ(maskpack_segment_of_query(out, 0, c), -1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 3), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 3, 2), 0);
        maskpack_layout_free(out);
    }

    /* [0,1,2,5,6]: one sequence under RESET, two under STEP */
    const int64_t jump[5] = {0, 1, 2, 5, 6};
    t = typed(buf, MASKPACK_I32, jump, 5, 1, (const int64_t[1]){5});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_RESET, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 1);
        CHECK_SEG(out, 0, 0, 0, 5);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 0), 1);
        maskpack_layout_free(out);
    }
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 2);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 3, 2);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 4, 0), 0);
        maskpack_layout_free(out);
    }

    /* a single trailing 0 is a one-token sequence */
    const int64_t one[4] = {0, 1, 2, 0};
    t = typed(buf, MASKPACK_U8, one, 4, 1, (const int64_t[1]){4});
    for (int rule = 0; rule < 2; rule++) {
        out = NULL;
        CHECK_OK(maskpack_layout_from_position_ids(&t, (maskpack_boundary_rule)rule, NULL, &out, &e), e);
        if (!out) continue;
        CHECK_EQ(maskpack_layout_n_segments(out), 2);
        CHECK_SEG(out, 1, 0, 3, 1);
        maskpack_layout_free(out);
    }

    /* all zeros: padding only; a lone 0 is one token */
    const int64_t zeros[3] = {0, 0, 0};
    t = typed(buf, MASKPACK_I16, zeros, 3, 1, (const int64_t[1]){3});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_RESET, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 0);
        CHECK_EQ(maskpack_layout_q_width(out), 3);
        maskpack_layout_free(out);
    }
    t = typed(buf, MASKPACK_I16, zeros, 1, 1, (const int64_t[1]){1});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 1);
        CHECK_SEG(out, 0, 0, 0, 1);
        maskpack_layout_free(out);
    }

    /* RESET takes the minimum of the real tokens (RoBERTa-like ids start at 2), and STEP splits
     * where the count does not continue */
    const int64_t rob[8] = {2, 3, 4, 2, 3, 2, 0, 0};
    t = typed(buf, MASKPACK_I64, rob, 8, 1, (const int64_t[1]){8});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_RESET, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 3);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 3, 2);
        CHECK_SEG(out, 2, 0, 5, 1);
        maskpack_layout_free(out);
    }
    /* column 0 always starts a sequence, even above the minimum */
    const int64_t mid[6] = {3, 4, 5, 0, 1, 2};
    t = typed(buf, MASKPACK_I64, mid, 6, 1, (const int64_t[1]){6});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_RESET, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 2);
        CHECK_SEG(out, 0, 0, 0, 3);
        CHECK_SEG(out, 1, 0, 3, 3);
        maskpack_layout_free(out);
    }
    /* an empty stream */
    t = maskpack_tensor_contiguous(NULL, MASKPACK_I64, 1, (const int64_t[1]){0});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 0);
        maskpack_layout_free(out);
    }
}

static void check_pos_rows(const maskpack_layout *L) {
    /* rows: [0,1,2,3,0,1], [0,1,0,0,0,0], [0,0,0,0,0,0], [0,1,2,0,1,0] */
    CHECK(!maskpack_layout_is_packed(L));
    CHECK_EQ(maskpack_layout_n_rows(L), 4);
    CHECK_EQ(maskpack_layout_q_width(L), 6);
    CHECK_EQ(maskpack_layout_n_segments(L), 6);
    CHECK_SEG(L, 0, 0, 0, 4);
    CHECK_SEG(L, 1, 0, 4, 2);
    CHECK_SEG(L, 2, 1, 0, 2);
    CHECK_SEG(L, 3, 3, 0, 3);
    CHECK_SEG(L, 4, 3, 3, 2);
    CHECK_SEG(L, 5, 3, 5, 1);
    CHECK_EQ(maskpack_segment_of_query(L, 1, 3), -1);
    CHECK_EQ(maskpack_segment_of_query(L, 2, 0), -1);
}

static const int64_t pos_rows[24] = {0, 1, 2, 3, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 1, 0};

static void test_pos_rows(void) {
    maskpack_error e;
    maskpack_layout *out;
    int64_t buf[80];
    const int64_t shape[2] = {4, 6};
    maskpack_tensor t = typed(buf, MASKPACK_I32, pos_rows, 24, 2, shape);
    for (int rule = 0; rule < 2; rule++) {
        out = NULL;
        CHECK_OK(maskpack_layout_from_position_ids(&t, (maskpack_boundary_rule)rule, NULL, &out, &e), e);
        if (!out) continue;
        check_pos_rows(out);
        maskpack_layout_free(out);
    }

    /* the minimum is per row under RESET: row 1 counts from 5 */
    const int64_t permin[8] = {0, 1, 0, 1, 5, 6, 5, 6};
    t = typed(buf, MASKPACK_I64, permin, 8, 2, (const int64_t[2]){2, 4});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_RESET, NULL, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_layout_n_segments(out), 4);
        CHECK_SEG(out, 2, 1, 0, 2);
        CHECK_SEG(out, 3, 1, 2, 2);
        maskpack_layout_free(out);
    }

    /* a transposed view */
    int64_t tr[24];
    for (int b = 0; b < 4; b++)
        for (int s = 0; s < 6; s++) tr[s * 4 + b] = pos_rows[b * 6 + s];
    maskpack_tensor tv = maskpack_tensor_contiguous(tr, MASKPACK_I64, 2, shape);
    tv.strides[0] = 1;
    tv.strides[1] = 4;
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&tv, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), e);
    if (out) {
        check_pos_rows(out);
        maskpack_layout_free(out);
    }

    /* M-RoPE [3,B,S]: only the text row decides; rows 1 and 2 (even negative values) are ignored */
    int64_t m[72];
    for (int i = 0; i < 24; i++) {
        m[i] = pos_rows[i];
        m[24 + i] = 7;              /* constant: under STEP would split at every token */
        m[48 + i] = i % 2 ? -1 : 3; /* negative: would be a value error */
    }
    for (int rule = 0; rule < 2; rule++) {
        maskpack_tensor t3 = typed(buf, MASKPACK_I64, m, 72, 3, (const int64_t[3]){3, 4, 6});
        out = NULL;
        CHECK_OK(maskpack_layout_from_position_ids(&t3, (maskpack_boundary_rule)rule, NULL, &out, &e), e);
        if (!out) continue;
        check_pos_rows(out);
        maskpack_layout_free(out);
    }
    /* an M-RoPE text row that differs from rows 1/2 in the boundary it implies */
    const int64_t mr[18] = {0, 1, 2, 3, 0, 1, /* text: 4 + 2 */
                            0, 1, 2, 3, 4, 5, /* would be one sequence */
                            0, 0, 1, 1, 2, 2};
    maskpack_tensor t3 = typed(buf, MASKPACK_I32, mr, 18, 3, (const int64_t[3]){3, 1, 6});
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t3, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), e);
    if (out) {
        CHECK(!maskpack_layout_is_packed(out));
        CHECK_EQ(maskpack_layout_n_segments(out), 2);
        CHECK_SEG(out, 0, 0, 0, 4);
        CHECK_SEG(out, 1, 0, 4, 2);
        maskpack_layout_free(out);
    }
}

static void test_pos_errors(void) {
    maskpack_error e;
    maskpack_layout *out;
    int64_t buf[24];
    const int64_t neg1[3] = {0, 1, -1};
    maskpack_tensor t = typed(buf, MASKPACK_I64, neg1, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_RESET, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 2);
    CHECK_MSG(e, "position_ids[2]: expected >= 0, found -1");

    const int64_t neg2[6] = {0, 1, 2, 0, -5, 1};
    t = typed(buf, MASKPACK_I8, neg2, 6, 2, (const int64_t[2]){2, 3});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 1);
    CHECK_EQ(e.index[1], 1);
    CHECK_MSG(e, "position_ids[1, 1]");

    const int64_t neg3[6] = {0, -2, 2, 0, 1, -3}; /* [0, 0, 1] is in the text row; [2, 0, 1] is ignored */
    t = typed(buf, MASKPACK_I32, neg3, 6, 3, (const int64_t[3]){3, 1, 2});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), MASKPACK_ERR_VALUE);
    CHECK_EQ(e.index[0], 0);
    CHECK_EQ(e.index[1], 0);
    CHECK_EQ(e.index[2], 1);
    CHECK_MSG(e, "position_ids[0, 0, 1]");

    /* shapes and dtypes */
    const int64_t ok[6] = {0, 1, 2, 0, 1, 2};
    t = typed(buf, MASKPACK_I32, ok, 6, 3, (const int64_t[3]){2, 1, 3});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), MASKPACK_ERR_SHAPE);
    CHECK_MSG(e, "[3, B, S]");
    t = typed(buf, MASKPACK_I32, ok, 6, 4, (const int64_t[4]){1, 1, 2, 3});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), MASKPACK_ERR_SHAPE);
    float f[6];
    t = typed(f, MASKPACK_F32, ok, 6, 1, (const int64_t[1]){6});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), MASKPACK_ERR_DTYPE);
    t = typed(buf, MASKPACK_BOOL, ok, 3, 1, (const int64_t[1]){3});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, &out, &e), MASKPACK_ERR_DTYPE);
    t = typed(buf, MASKPACK_I32, ok, 6, 1, (const int64_t[1]){6});
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, (maskpack_boundary_rule)4, NULL, &out, &e),
                MASKPACK_ERR_CONVENTION);
    EXPECT_FAIL(maskpack_layout_from_position_ids(NULL, MASKPACK_BOUNDARY_STEP, NULL, &out, &e),
                MASKPACK_ERR_NULL_ARGUMENT);
    CHECK_STATUS(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, NULL, NULL, &e),
                 MASKPACK_ERR_NULL_ARGUMENT, e);
    maskpack_rule r = maskpack_rule_default();
    r.causal = 2;
    EXPECT_FAIL(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, &r, &out, &e), MASKPACK_ERR_RULE);
    /* a rule that fits: prefix per detected sequence */
    const int64_t prefix[2] = {3, 1};
    r = maskpack_rule_default();
    r.prefix = prefix;
    r.n_prefix = 2;
    out = NULL;
    CHECK_OK(maskpack_layout_from_position_ids(&t, MASKPACK_BOUNDARY_STEP, &r, &out, &e), e);
    if (out) {
        CHECK_EQ(maskpack_allowed(out, 0, 0, 0, 2), 1);
        CHECK_EQ(maskpack_allowed(out, 0, 0, 3, 4), 0);
        maskpack_layout_free(out);
    }
}

/* Inputs with no bytes and a huge dimension ([2^50, 0], [3, 2^50, 0], [2^50, 1, 0, 0]): each
 * constructor returns the empty layout at once. Before, every row was visited though there was
 * nothing to read (2^50 iterations: the test timed out), or the row index took 8 bytes a row. */
static void check_empty_layout(maskpack_layout *L, int64_t rows, int64_t width) {
    CHECK(L != NULL);
    if (!L) return;
    CHECK_EQ(maskpack_layout_n_rows(L), rows);
    CHECK_EQ(maskpack_layout_q_width(L), width);
    CHECK_EQ(maskpack_layout_n_segments(L), 0);
    CHECK_EQ(maskpack_layout_n_tokens(L), 0);
    CHECK_EQ(maskpack_segment_of_query(L, rows - 1, 0), -1);
    maskpack_layout_free(L);
}

static void test_zero_size_dims(void) {
    maskpack_error e;
    maskpack_layout *out;
    const int64_t big = (int64_t)1 << 50;
    uint8_t byte = 0;
    int64_t word = 0;
    const int64_t s2[2] = {big, 0}, s2t[2] = {0, big}, s3[3] = {3, big, 0}, s4[4] = {big, 1, 0, 0};
    for (int conv = 0; conv < 2; conv++) {
        maskpack_tensor m = maskpack_tensor_contiguous(&byte, MASKPACK_I8, 2, s2);
        out = NULL;
        CHECK_OK(maskpack_layout_from_mask2d(&m, (maskpack_mask2d_convention)conv, NULL, &out, &e), e);
        check_empty_layout(out, big, 0);
        m = maskpack_tensor_contiguous(&byte, MASKPACK_I8, 2, s2t); /* no row, wide */
        out = NULL;
        CHECK_OK(maskpack_layout_from_mask2d(&m, (maskpack_mask2d_convention)conv, NULL, &out, &e), e);
        if (out) {
            CHECK_EQ(maskpack_layout_n_rows(out), 0);
            CHECK_EQ(maskpack_layout_q_width(out), big);
            maskpack_layout_free(out);
        }
    }
    for (int rule = 0; rule < 2; rule++) {
        maskpack_tensor p = maskpack_tensor_contiguous(&word, MASKPACK_I64, 2, s2);
        out = NULL;
        CHECK_OK(maskpack_layout_from_position_ids(&p, (maskpack_boundary_rule)rule, NULL, &out, &e), e);
        check_empty_layout(out, big, 0);
        p = maskpack_tensor_contiguous(&word, MASKPACK_I64, 3, s3); /* M-RoPE */
        out = NULL;
        CHECK_OK(maskpack_layout_from_position_ids(&p, (maskpack_boundary_rule)rule, NULL, &out, &e), e);
        check_empty_layout(out, big, 0);
    }
    /* derivations of such a layout return at once too (they looped over every row) */
    {
        maskpack_tensor m = maskpack_tensor_contiguous(&byte, MASKPACK_I8, 2, s2);
        maskpack_layout *L = NULL;
        CHECK_OK(maskpack_layout_from_mask2d(&m, MASKPACK_MASK2D_KEEP, NULL, &L, &e), e);
        if (L) {
            maskpack_tensor o64 = maskpack_tensor_contiguous(&word, MASKPACK_I64, 2, s2);
            CHECK_OK(maskpack_mask2d(L, &o64, &e), e);
            CHECK_OK(maskpack_position_ids(L, &o64, &e), e);
            CHECK_OK(maskpack_segment_ids(L, &o64, &e), e);
            const int64_t s4o[4] = {big, 1, 0, 0};
            maskpack_tensor o4 = maskpack_tensor_contiguous(&byte, MASKPACK_BOOL, 4, s4o);
            CHECK_OK(maskpack_mask4d(L, MASKPACK_MASK_KEEP, MASKPACK_FILL_DTYPE_MIN, &o4, &e), e);
            maskpack_tensor lab = maskpack_tensor_contiguous(&word, MASKPACK_I64, 2, s2);
            int64_t shifted = 0;
            maskpack_tensor so = maskpack_tensor_contiguous(&shifted, MASKPACK_I64, 2, s2);
            CHECK_OK(maskpack_shift_labels(L, &lab, -100, &so, &e), e);
            double wbuf = 0, denom = -1;
            maskpack_tensor wo = maskpack_tensor_contiguous(&wbuf, MASKPACK_F64, 2, s2);
            CHECK_OK(maskpack_loss_weights(L, &lab, -100, MASKPACK_LOSS_TOKEN, &wo, &denom, &e), e);
            CHECK(denom == 0);
            maskpack_layout_free(L);
        }
    }
    maskpack_tensor m4 = maskpack_tensor_contiguous(&byte, MASKPACK_BOOL, 4, s4);
    out = NULL;
    CHECK_OK(maskpack_layout_from_mask4d(&m4, MASKPACK_MASK_KEEP, &out, &e), e);
    if (out) {
        maskpack_rule r = maskpack_layout_rule(out);
        CHECK_EQ(r.causal, 1); /* nothing to infer a rule from: the default */
    }
    check_empty_layout(out, big, 0);
    maskpack_tensor k = maskpack_tensor_contiguous(&byte, MASKPACK_U8, 2, s2);
    CHECK_OK(maskpack_mask2d_from_mask4d(&m4, MASKPACK_MASK_KEEP, &k, &e), e);
    /* the output is still checked: a wrong shape is refused, not skipped */
    const int64_t wrong[2] = {big, 1};
    k = maskpack_tensor_contiguous(&byte, MASKPACK_U8, 2, wrong);
    CHECK_STATUS(maskpack_mask2d_from_mask4d(&m4, MASKPACK_MASK_KEEP, &k, &e), MASKPACK_ERR_SHAPE, e);
}

int main(void) {
    test_lengths_padded();
    test_lengths_packed();
    test_lengths_errors();
    test_mask2d_keep();
    test_mask2d_keep_errors();
    test_mask2d_doc_id();
    test_cu_basic();
    test_cu_padded();
    test_cu_errors();
    test_cu_qk();
    test_pos_packed();
    test_pos_rows();
    test_pos_errors();
    test_zero_size_dims();
    return check_report("test_parse");
}
