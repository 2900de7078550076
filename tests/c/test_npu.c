/* test_npu.c: npu_fusion_attention arguments (mode decisions, compressed and full masks, TND items
 * with pad items), the golden outer-split cases of sparse modes 7/8, the contract checker (one test
 * per finding code) and a random round trip emitter -> checker; the checker on a sparse_mode 5 full
 * mask against bottom-right causal + prefix (a matching mask passes, one flipped entry is reported
 * with its position), every atten_mask shape form against the full-mask modes, pre/next against a
 * full mask, and TND without its actual_seq lists. */
#include "check.h"
#include "internal.h"

#include "../../src/npu/npu_internal.h"

#include <math.h>
#include <stdlib.h>

#define INF MP_NPU_INF

static uint8_t comp_mask[2048 * 2048];  /* triu(ones(2048, 2048), 1) */
static uint8_t comp6_mask[3072 * 2048]; /* the sparse_mode 6 mask */
static maskpack_tensor comp_t, comp6_t;

/* ---- helpers -------------------------------------------------------------------------------------- */

/* packed layout from (q_start, q_len, kv_start, kv_len) rows */
static maskpack_layout *packed(const int64_t (*s)[4], size_t n, int64_t qw, int64_t kw, const maskpack_rule *r) {
    maskpack_segment seg[64];
    memset(seg, 0, sizeof seg);
    for (size_t k = 0; k < n; k++) {
        seg[k].row = 0;
        seg[k].q_start = s[k][0];
        seg[k].q_len = s[k][1];
        seg[k].kv_start = s[k][2];
        seg[k].kv_len = s[k][3];
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(seg, n, 1, qw, kw, 1, r, &L, &e), e);
    return L;
}

/* contiguous self-attention packed layout of the given lengths */
static maskpack_layout *packed_lengths(const int64_t *len, size_t n, const maskpack_rule *r) {
    int64_t s[64][4];
    int64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        s[k][0] = s[k][2] = off;
        s[k][1] = s[k][3] = len[k];
        off += len[k];
    }
    return packed((const int64_t(*)[4])s, n, off, off, r);
}

/* one segment per row covering [0,S) x [0,Skv) */
static maskpack_layout *full_rows(int64_t B, int64_t S, int64_t Skv, const maskpack_rule *r) {
    maskpack_segment seg[64];
    memset(seg, 0, sizeof seg);
    for (int64_t b = 0; b < B; b++) {
        seg[b].row = b;
        seg[b].q_start = seg[b].kv_start = 0;
        seg[b].q_len = S;
        seg[b].kv_len = Skv;
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(seg, (size_t)B, B, S, Skv, 0, r, &L, &e), e);
    return L;
}

static maskpack_rule rule(int causal, maskpack_alignment al, int64_t left, int64_t right) {
    maskpack_rule r = maskpack_rule_default();
    r.causal = causal;
    r.alignment = al;
    r.window_left = left;
    r.window_right = right;
    return r;
}

static int emit(const maskpack_layout *L, maskpack_npu_layout il, maskpack_npu_argset *a) {
    maskpack_error e;
    memset(a, 0, sizeof *a);
    maskpack_status s = maskpack_npu_args(L, il, 0, 64, a, &e);
    CHECK_OK(s, e);
    return s == MASKPACK_OK;
}

static void check_list(const int64_t *got, const int64_t *want, int64_t n) {
    for (int64_t k = 0; k < n; k++) CHECK_EQ(got[k], want[k]);
}

static int has_code(const maskpack_npu_report *r, int32_t code) {
    for (int32_t k = 0; k < r->n_findings; k++)
        if (r->findings[k].code == code) return 1;
    return 0;
}

static void dump(const maskpack_npu_report *r) {
    for (int32_t k = 0; k < r->n_findings; k++)
        fprintf(stderr, "  finding %d: %s\n", r->findings[k].code, r->findings[k].message);
}

static void build_compressed(void) {
    int64_t s2[2] = {2048, 2048}, s6[2] = {3072, 2048};
    comp_t = maskpack_tensor_contiguous(comp_mask, MASKPACK_BOOL, 2, s2);
    comp6_t = maskpack_tensor_contiguous(comp6_mask, MASKPACK_BOOL, 2, s6);
    maskpack_npu_argset a;
    memset(&a, 0, sizeof a);
    a.mask_kind = MASKPACK_NPU_MASK_COMPRESSED;
    a.mask_ndim = 2;
    a.mask_shape[0] = a.mask_shape[1] = 2048;
    maskpack_layout *L = full_rows(1, 4, 4, NULL);
    maskpack_error e;
    CHECK_OK(maskpack_npu_atten_mask(L, &a, &comp_t, &e), e);
    a.mask_kind = MASKPACK_NPU_MASK_PREFIX_COMPRESSED;
    a.mask_shape[0] = 3072;
    CHECK_OK(maskpack_npu_atten_mask(L, &a, &comp6_t, &e), e);
    maskpack_layout_free(L);
}

/* ---- the emitter ---------------------------------------------------------------------------------- */

static void test_scale(void) {
    int64_t len[1] = {4};
    maskpack_layout *L = packed_lengths(len, 1, NULL);
    if (!L) return;
    maskpack_npu_argset a;
    maskpack_error e;
    memset(&a, 0, sizeof a);
    CHECK_OK(maskpack_npu_args(L, MASKPACK_NPU_TND, 0.5, 0, &a, &e), e);
    CHECK(a.scale == 0.5);
    maskpack_npu_argset_release(&a);
    CHECK_OK(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), e);
    CHECK(a.scale == 0.125);
    maskpack_npu_argset_release(&a);
    CHECK_OK(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 128, &a, &e), e);
    CHECK(fabs(a.scale - 1.0 / sqrt(128.0)) < 1e-15);
    maskpack_npu_argset_release(&a);
    /* failures leave the output untouched */
    a.sparse_mode = 77;
    CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "scale");
    CHECK_EQ(a.sparse_mode, 77);
    CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, -1.0, 64, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, NAN, 64, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, INFINITY, 64, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, -3, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 1024, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
    CHECK_MSG(e, "768");
    CHECK_STATUS(maskpack_npu_args(L, (maskpack_npu_layout)9, 0, 64, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_npu_args(NULL, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_EQ(a.sparse_mode, 77);
    maskpack_layout_free(L);
}

static void test_tnd_causal(void) {
    int64_t len[3] = {3, 5, 2};
    maskpack_rule br = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, -1, -1), tl = rule(1, MASKPACK_ALIGN_TOP_LEFT, -1, -1);
    maskpack_layout *L = packed_lengths(len, 3, &br);
    maskpack_npu_argset a;
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.input_layout, MASKPACK_NPU_TND);
        CHECK_EQ(a.sparse_mode, 3);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_COMPRESSED);
        CHECK_EQ(a.mask_ndim, 2);
        CHECK_EQ(a.mask_shape[0], 2048);
        CHECK_EQ(a.mask_shape[1], 2048);
        CHECK_EQ(a.pre_tokens, 2147483647);
        CHECK_EQ(a.next_tokens, 0);
        CHECK(a.scale == 0.125);
        CHECK_EQ(a.n_items, 3);
        int64_t want[3] = {3, 8, 10};
        check_list(a.actual_seq_qlen, want, 3);
        check_list(a.actual_seq_kvlen, want, 3);
        for (int k = 0; k < 3; k++) CHECK_EQ(a.pad_items[k], 0);
        CHECK(a.prefix == NULL);
        CHECK_EQ(a.n_prefix, 0);
        CHECK_EQ(a.fully_masked_rows, 0);
        CHECK_EQ(a.inner_precise, 0);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* top-left with q == kv everywhere: the alignments agree, the canonical choice is mode 3 */
    L = packed_lengths(len, 3, &tl);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 3);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* cross segments (2 x 4, 3 x 3): the alignment decides */
    int64_t cross[2][4] = {{0, 2, 0, 4}, {2, 3, 4, 3}};
    L = packed((const int64_t(*)[4])cross, 2, 5, 7, &tl);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 2);
        int64_t wq[2] = {2, 5}, wk[2] = {4, 7};
        check_list(a.actual_seq_qlen, wq, 2);
        check_list(a.actual_seq_kvlen, wk, 2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    L = packed((const int64_t(*)[4])cross, 2, 5, 7, &br);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 3);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* bottom-right with more queries than keys: the first rows see nothing -> reported, inner_precise 2 */
    int64_t tall[1][4] = {{0, 4, 0, 2}};
    L = packed((const int64_t(*)[4])tall, 1, 4, 2, &br);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 3);
        CHECK_EQ(a.fully_masked_rows, 2);
        CHECK_EQ(a.inner_precise, 2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* top-left: every row sees key 0 */
    L = packed((const int64_t(*)[4])tall, 1, 4, 2, &tl);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 2);
        CHECK_EQ(a.fully_masked_rows, 0);
        CHECK_EQ(a.inner_precise, 0);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
}

static void test_tnd_pad_items(void) {
    /* tokens: A A A . . B B C C C . .  plus an empty segment between B and C */
    int64_t s[4][4] = {{0, 3, 0, 3}, {5, 2, 5, 2}, {7, 0, 7, 0}, {7, 3, 7, 3}};
    maskpack_layout *L = packed((const int64_t(*)[4])s, 4, 12, 12, NULL);
    maskpack_npu_argset a;
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.n_items, 6);
        int64_t want[6] = {3, 5, 7, 7, 10, 12};
        uint8_t pads[6] = {0, 1, 0, 0, 0, 1};
        check_list(a.actual_seq_qlen, want, 6);
        check_list(a.actual_seq_kvlen, want, 6);
        for (int k = 0; k < 6; k++) CHECK_EQ(a.pad_items[k], pads[k]);
        CHECK_EQ(a.actual_seq_qlen[a.n_items - 1], 12); /* the ends cover the whole stream */
        CHECK_EQ(a.inner_precise, 0);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* a leading gap, and a kv-only gap (cross layout) coalesced with a q gap into one item */
    int64_t t[2][4] = {{2, 2, 2, 2}, {6, 1, 5, 3}};
    L = packed((const int64_t(*)[4])t, 2, 7, 9, NULL);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.n_items, 5);
        int64_t wq[5] = {2, 4, 6, 7, 7}, wk[5] = {2, 4, 5, 8, 9};
        uint8_t pads[5] = {1, 0, 1, 0, 1};
        check_list(a.actual_seq_qlen, wq, 5);
        check_list(a.actual_seq_kvlen, wk, 5);
        for (int k = 0; k < 5; k++) CHECK_EQ(a.pad_items[k], pads[k]);
        /* the pad item (2 queries, 1 key) under mode 3 has an empty first row: a pad row, not a real one */
        CHECK_EQ(a.sparse_mode, 3);
        CHECK_EQ(a.fully_masked_rows, 0);
        CHECK_EQ(a.fully_masked_pad_rows, 1);
        CHECK_EQ(a.inner_precise, 2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
}

static void test_tnd_windows(void) {
    int64_t len[2] = {6, 4};
    maskpack_npu_argset a;
    struct {
        int causal;
        int64_t left, right;
        int mode;
        int64_t pre, next;
    } cases[] = {
        {1, 2, -1, 4, 2, 0},                             /* causal sliding window */
        {1, 2, 3, 4, 2, 0},                              /* a right bound under causal changes nothing */
        {1, -1, 3, 3, INF, 0},                           /* causal, right window only: plain causal */
        {0, 3, 1, 4, 3, 1},                              /* bidirectional band */
        {0, -1, 2, 4, INF, 2},                           /* unbounded side -> 2147483647 */
        {0, 2, -1, 4, 2, INF}, {0, -1, -1, 0, INF, INF}, /* bidirectional: no mask at all */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        maskpack_rule r = rule(cases[c].causal, MASKPACK_ALIGN_BOTTOM_RIGHT, cases[c].left, cases[c].right);
        maskpack_layout *L = packed_lengths(len, 2, &r);
        if (L && emit(L, MASKPACK_NPU_TND, &a)) {
            CHECK_EQ(a.sparse_mode, cases[c].mode);
            CHECK_EQ(a.pre_tokens, cases[c].pre);
            CHECK_EQ(a.next_tokens, cases[c].next);
            if (cases[c].mode == 0) {
                CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_NONE);
                CHECK_EQ(a.mask_ndim, 0);
            } else {
                CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_COMPRESSED);
            }
            maskpack_npu_argset_release(&a);
        }
        maskpack_layout_free(L);
    }
    /* bidirectional with spans: spans add nothing to full attention */
    maskpack_span sp[1] = {{0, 1, 4}};
    maskpack_rule r = rule(0, MASKPACK_ALIGN_BOTTOM_RIGHT, -1, -1);
    r.spans = sp;
    r.n_spans = 1;
    maskpack_layout *L = packed_lengths(len, 2, &r);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 0);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* causal with spans: NOT_REPRESENTABLE with the reason */
    r.causal = 1;
    L = packed_lengths(len, 2, &r);
    maskpack_error e;
    memset(&a, 0, sizeof a);
    if (L) {
        CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "spans");
        CHECK_MSG(e, "shared");
    }
    maskpack_layout_free(L);
    /* top-left window: fine when q == kv everywhere, impossible with a cross segment */
    maskpack_rule tw = rule(1, MASKPACK_ALIGN_TOP_LEFT, 2, -1);
    L = packed_lengths(len, 2, &tw);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 4);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    int64_t cross[2][4] = {{0, 2, 0, 4}, {2, 3, 4, 3}};
    L = packed((const int64_t(*)[4])cross, 2, 5, 7, &tw);
    if (L) {
        CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "top-left");
    }
    maskpack_layout_free(L);
    int64_t shifted[2][4] = {{0, 2, 0, 4}, {2, 3, 4, 5}}; /* kv_len - q_len = 2 for both */
    L = packed((const int64_t(*)[4])shifted, 2, 5, 9, &tw);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 4);
        CHECK_EQ(a.pre_tokens, 4);
        CHECK_EQ(a.next_tokens, -2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* a window that excludes every key of some rows: bidirectional (0, 0) on 6 queries x 2 keys */
    maskpack_rule w0 = rule(0, MASKPACK_ALIGN_BOTTOM_RIGHT, 0, 0);
    int64_t tall[1][4] = {{0, 6, 0, 2}};
    L = packed((const int64_t(*)[4])tall, 1, 6, 2, &w0);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 4);
        CHECK_EQ(a.pre_tokens, 0);
        CHECK_EQ(a.next_tokens, 0);
        CHECK_EQ(a.fully_masked_rows, 4);
        CHECK_EQ(a.inner_precise, 2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
}

static void test_tnd_prefix(void) {
    int64_t s[2][4] = {{0, 4, 0, 4}, {6, 3, 6, 3}};
    int64_t pf[2] = {2, 1};
    maskpack_rule r = maskpack_rule_default();
    r.prefix = pf;
    r.n_prefix = 2;
    maskpack_layout *L = packed((const int64_t(*)[4])s, 2, 9, 9, &r);
    maskpack_npu_argset a;
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 6);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_PREFIX_COMPRESSED);
        CHECK_EQ(a.mask_shape[0], 3072);
        CHECK_EQ(a.mask_shape[1], 2048);
        CHECK_EQ(a.n_items, 3);
        CHECK_EQ(a.n_prefix, 3);
        int64_t wp[3] = {2, 0, 1}, wq[3] = {4, 6, 9};
        check_list(a.prefix, wp, 3);
        check_list(a.actual_seq_qlen, wq, 3);
        CHECK_EQ(a.pad_items[1], 1);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    maskpack_error e;
    /* prefix + window, top-left prefix with q != kv: not representable */
    r.window_left = 2;
    L = packed((const int64_t(*)[4])s, 2, 9, 9, &r);
    if (L) CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
    maskpack_layout_free(L);
    int64_t cross[2][4] = {{0, 2, 0, 4}, {2, 3, 4, 3}};
    r.window_left = -1;
    r.alignment = MASKPACK_ALIGN_TOP_LEFT;
    L = packed((const int64_t(*)[4])cross, 2, 5, 7, &r);
    if (L) CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
    maskpack_layout_free(L);
}

static void test_tnd_limits(void) {
    int64_t *len = malloc(2049 * sizeof *len);
    int64_t *pf = malloc(2049 * sizeof *pf);
    maskpack_segment *seg = calloc(2049, sizeof *seg);
    if (!len || !pf || !seg) return;
    for (int k = 0; k < 2049; k++) {
        seg[k].row = 0;
        seg[k].q_start = seg[k].kv_start = k;
        seg[k].q_len = seg[k].kv_len = 1;
        pf[k] = 1;
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_npu_argset a;
    memset(&a, 0, sizeof a);
    CHECK_OK(maskpack_layout_from_segments(seg, 2048, 1, 2048, 2048, 1, NULL, &L, &e), e);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.n_items, 2048);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    CHECK_OK(maskpack_layout_from_segments(seg, 2049, 1, 2049, 2049, 1, NULL, &L, &e), e);
    if (L) {
        CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "2049");
    }
    maskpack_layout_free(L);
    /* pad items count: 1024 segments with a gap after each are 2048 items */
    for (int k = 0; k < 1025; k++) seg[k].q_start = seg[k].kv_start = 2 * k;
    CHECK_OK(maskpack_layout_from_segments(seg, 1024, 1, 2048, 2048, 1, NULL, &L, &e), e);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.n_items, 2048);
        CHECK_EQ(a.pad_items[2047], 1);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* with prefix the limit is 1024: 513 segments with gaps are 1026 items */
    maskpack_rule r = maskpack_rule_default();
    r.prefix = pf;
    r.n_prefix = 513;
    CHECK_OK(maskpack_layout_from_segments(seg, 513, 1, 1026, 1026, 1, &r, &L, &e), e);
    if (L) {
        CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "1026");
        CHECK_MSG(e, "prefix");
    }
    maskpack_layout_free(L);
    free(len);
    free(pf);
    free(seg);
    /* wrong grid kinds for the input layout */
    L = full_rows(2, 4, 4, NULL);
    if (L) {
        CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "packed");
    }
    maskpack_layout_free(L);
    int64_t one[1] = {5};
    L = packed_lengths(one, 1, NULL);
    if (L) {
        CHECK_STATUS(maskpack_npu_args(L, MASKPACK_NPU_BSND, 0, 64, &a, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "TND");
    }
    maskpack_layout_free(L);
}

static void test_bsnd(void) {
    maskpack_npu_argset a;
    maskpack_rule br = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, -1, -1), tl = rule(1, MASKPACK_ALIGN_TOP_LEFT, -1, -1);
    maskpack_layout *L = full_rows(2, 4, 4, &br);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 3);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_COMPRESSED);
        CHECK_EQ(a.n_items, 0);
        CHECK(a.actual_seq_qlen == NULL && a.pad_items == NULL && a.prefix == NULL);
        CHECK_EQ(a.inner_precise, 0);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    L = full_rows(2, 3, 5, &tl);
    if (L && emit(L, MASKPACK_NPU_BSH, &a)) {
        CHECK_EQ(a.sparse_mode, 2);
        CHECK_EQ(a.input_layout, MASKPACK_NPU_BSH);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    L = full_rows(2, 5, 3, &br);
    if (L && emit(L, MASKPACK_NPU_BNSD, &a)) {
        CHECK_EQ(a.sparse_mode, 3);
        CHECK_EQ(a.fully_masked_rows, 4); /* 2 rows per batch before the diagonal enters */
        CHECK_EQ(a.inner_precise, 2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    maskpack_rule bi = rule(0, MASKPACK_ALIGN_BOTTOM_RIGHT, -1, -1);
    L = full_rows(2, 4, 4, &bi);
    if (L && emit(L, MASKPACK_NPU_SBH, &a)) {
        CHECK_EQ(a.sparse_mode, 0);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_NONE);
        CHECK_EQ(a.pre_tokens, INF);
        CHECK_EQ(a.next_tokens, INF);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    maskpack_rule w = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, 3, -1);
    L = full_rows(2, 8, 8, &w);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 4);
        CHECK_EQ(a.pre_tokens, 3);
        CHECK_EQ(a.next_tokens, 0);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_COMPRESSED);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* top-left window with Sq != Skv: every row's diagonal sits 2 keys left of the bottom-right one,
     * so the band shifts: keys [i - 3, i] are -(3 + 2) <= (j - i) - 2 <= -2 */
    maskpack_rule tw = rule(1, MASKPACK_ALIGN_TOP_LEFT, 3, -1);
    L = full_rows(2, 4, 6, &tw);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 4);
        CHECK_EQ(a.pre_tokens, 5);
        CHECK_EQ(a.next_tokens, -2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* rows whose diagonals differ (shard pieces at different positions): no single band -> full mask */
    maskpack_segment pieces[2] = {{0, 0, 2, 0, 6, MASKPACK_SEGMENT_EXPLICIT_POS, 1, 0},
                                  {1, 0, 2, 0, 6, MASKPACK_SEGMENT_EXPLICIT_POS, 3, 1}};
    maskpack_error e0;
    CHECK_OK(maskpack_layout_from_segments(pieces, 2, 2, 2, 6, 0, &br, &L, &e0), e0);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 1);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_FULL);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* prefix with full rows: mode 6 with one prefix per batch; more than 32 batches: full mask */
    int64_t pf[40];
    for (int k = 0; k < 40; k++) pf[k] = k % 5;
    maskpack_rule pr = maskpack_rule_default();
    pr.prefix = pf;
    pr.n_prefix = 3;
    L = full_rows(3, 6, 6, &pr);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 6);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_PREFIX_COMPRESSED);
        CHECK_EQ(a.n_prefix, 3);
        check_list(a.prefix, pf, 3);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    pr.n_prefix = 33;
    L = full_rows(33, 6, 6, &pr);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 1);
        CHECK(a.prefix == NULL);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* padding: full mask, unbounded pre/next, inner_precise 2 for the pad rows */
    maskpack_segment pad[2] = {{0, 0, 3, 0, 3}, {1, 2, 4, 2, 4}};
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(pad, 2, 2, 6, 6, 0, &br, &L, &e), e);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 1);
        CHECK_EQ(a.mask_kind, MASKPACK_NPU_MASK_FULL);
        CHECK_EQ(a.mask_ndim, 4);
        CHECK_EQ(a.mask_shape[0], 2);
        CHECK_EQ(a.mask_shape[1], 1);
        CHECK_EQ(a.mask_shape[2], 6);
        CHECK_EQ(a.mask_shape[3], 6);
        CHECK_EQ(a.pre_tokens, INF);
        CHECK_EQ(a.next_tokens, INF);
        CHECK_EQ(a.fully_masked_rows, 0);     /* pad rows are not real rows... */
        CHECK_EQ(a.fully_masked_pad_rows, 5); /* ...and are counted apart: 2 x 6 slots, 7 tokens */
        CHECK_EQ(a.inner_precise, 2);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* bidirectional but padded: still a full mask */
    CHECK_OK(maskpack_layout_from_segments(pad, 2, 2, 6, 6, 0, &bi, &L, &e), e);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 1);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* two documents in one row, no padding: full mask, no empty rows */
    maskpack_segment two[2] = {{0, 0, 3, 0, 3}, {0, 3, 3, 3, 3}};
    CHECK_OK(maskpack_layout_from_segments(two, 2, 1, 6, 6, 0, &br, &L, &e), e);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 1);
        CHECK_EQ(a.inner_precise, 0);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
    /* spans on full rows: full mask */
    maskpack_span sp[1] = {{0, 1, 3}};
    maskpack_rule rs = maskpack_rule_default();
    rs.spans = sp;
    rs.n_spans = 1;
    L = full_rows(1, 5, 5, &rs);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 1);
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
}

/* ---- atten_mask ------------------------------------------------------------------------------------ */

static void test_atten_masks(void) {
    /* compressed: exactly triu(ones, 1) */
    int64_t ones = 0, wrong = 0;
    for (int64_t i = 0; i < 2048; i++)
        for (int64_t j = 0; j < 2048; j++) {
            ones += comp_mask[i * 2048 + j];
            wrong += comp_mask[i * 2048 + j] != (j > i);
        }
    CHECK_EQ(ones, 2048LL * 2047 / 2);
    CHECK_EQ(wrong, 0);
    CHECK_EQ(comp_mask[0], 0);
    CHECK_EQ(comp_mask[1], 1);
    CHECK_EQ(comp_mask[2047 * 2048 + 2047], 0);
    /* prefix-compressed: the causal block over [1024, 2048] rows of 0 (left half) and 1 (right half) */
    wrong = 0;
    for (int64_t i = 0; i < 3072; i++)
        for (int64_t j = 0; j < 2048; j++) {
            int want = i < 2048 ? j > i : j >= 1024;
            wrong += comp6_mask[i * 2048 + j] != want;
        }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(comp6_mask[2048 * 2048 + 1023], 0);
    CHECK_EQ(comp6_mask[2048 * 2048 + 1024], 1);
    CHECK_EQ(comp6_mask[3071 * 2048 + 0], 0);

    /* uint8, column-major strides */
    uint8_t *buf = malloc(2048 * 2048);
    maskpack_layout *L = full_rows(1, 4, 4, NULL);
    maskpack_npu_argset a;
    maskpack_error e;
    if (buf && L && emit(L, MASKPACK_NPU_BSND, &a)) {
        maskpack_tensor t;
        memset(&t, 0, sizeof t);
        t.data = buf;
        t.dtype = MASKPACK_U8;
        t.ndim = 2;
        t.shape[0] = t.shape[1] = 2048;
        t.strides[0] = 1;
        t.strides[1] = 2048;
        CHECK_OK(maskpack_npu_atten_mask(L, &a, &t, &e), e);
        CHECK_EQ(buf[5 * 2048 + 3], 1); /* element (3, 5): above the diagonal */
        CHECK_EQ(buf[3 * 2048 + 5], 0); /* element (5, 3) */
        /* errors: nothing written */
        memset(buf, 7, 16);
        t.shape[0] = 1024;
        CHECK_STATUS(maskpack_npu_atten_mask(L, &a, &t, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "[2048, 2048]");
        t.shape[0] = 2048;
        t.dtype = MASKPACK_I32;
        CHECK_STATUS(maskpack_npu_atten_mask(L, &a, &t, &e), MASKPACK_ERR_DTYPE, e);
        CHECK_EQ(buf[0], 7);
        maskpack_npu_argset_release(&a);
        a.mask_kind = MASKPACK_NPU_MASK_NONE;
        t.dtype = MASKPACK_U8;
        CHECK_STATUS(maskpack_npu_atten_mask(L, &a, &t, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
        CHECK_STATUS(maskpack_npu_atten_mask(L, NULL, &t, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    }
    free(buf);
    maskpack_layout_free(L);

    /* full mask of a padded batch with two documents in a row: the predicate inverted, strided */
    maskpack_segment seg[3] = {{0, 0, 3, 0, 3}, {0, 3, 2, 3, 2}, {1, 2, 4, 2, 4}};
    maskpack_rule w = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, 1, -1);
    CHECK_OK(maskpack_layout_from_segments(seg, 3, 2, 6, 6, 0, &w, &L, &e), e);
    if (L && emit(L, MASKPACK_NPU_BSND, &a)) {
        CHECK_EQ(a.sparse_mode, 1);
        uint8_t full[2 * 6 * 8];
        memset(full, 9, sizeof full);
        maskpack_tensor t;
        memset(&t, 0, sizeof t);
        t.data = full;
        t.dtype = MASKPACK_BOOL;
        t.ndim = 4;
        t.shape[0] = 2;
        t.shape[1] = 1;
        t.shape[2] = 6;
        t.shape[3] = 6;
        t.strides[0] = 48;
        t.strides[1] = 48;
        t.strides[2] = 8; /* rows padded to 8 elements */
        t.strides[3] = 1;
        CHECK_OK(maskpack_npu_atten_mask(L, &a, &t, &e), e);
        int64_t bad = 0, allowed = 0;
        for (int64_t b = 0; b < 2; b++)
            for (int64_t i = 0; i < 6; i++) {
                for (int64_t j = 0; j < 6; j++) {
                    int m = full[b * 48 + i * 8 + j];
                    bad += m != !maskpack_allowed(L, b, 0, i, j);
                    allowed += m == 0;
                }
                CHECK_EQ(full[b * 48 + i * 8 + 6], 9); /* the row padding is untouched */
            }
        CHECK_EQ(bad, 0);
        CHECK_EQ(allowed, 5 + 3 + 7); /* window 1: docs of 3, 2, 4 tokens keep 2n-1 pairs */
        /* args of another layout are refused */
        maskpack_npu_argset other = a;
        other.mask_shape[2] = 5;
        CHECK_STATUS(maskpack_npu_atten_mask(L, &other, &t, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "args.mask_shape");
        maskpack_npu_argset_release(&a);
    }
    maskpack_layout_free(L);
}

static void test_release(void) {
    maskpack_npu_argset a;
    memset(&a, 0, sizeof a);
    maskpack_npu_argset_release(&a);
    maskpack_npu_argset_release(NULL);
    int64_t len[2] = {2, 2};
    maskpack_layout *L = packed_lengths(len, 2, NULL);
    if (L && emit(L, MASKPACK_NPU_TND, &a)) {
        CHECK(a.actual_seq_qlen != NULL);
        maskpack_npu_argset_release(&a);
        CHECK(a.actual_seq_qlen == NULL && a.actual_seq_kvlen == NULL && a.pad_items == NULL);
        CHECK_EQ(a.n_items, 0);
        CHECK_EQ(a.sparse_mode, 0);
        maskpack_npu_argset_release(&a); /* twice is fine */
    }
    maskpack_layout_free(L);
}

/* ---- golden outer-split cases (sparse modes 7 and 8) ------------------------------------------------ */

/* One card's TND call and, for each of its items, which item of the unsplit batch it holds and from
 * which row of that item its queries start. */
typedef struct card {
    int32_t mode;
    int64_t pre, next;
    int n;
    int64_t qcum[4], kvcum[4];
    int full_item[4];
    int64_t row_off[4];
} card;

static void tnd_call(maskpack_npu_call *c, const card *cd, maskpack_tensor *tq, maskpack_tensor *tk) {
    memset(c, 0, sizeof *c);
    int64_t n = cd->n;
    *tq = maskpack_tensor_contiguous((void *)cd->qcum, MASKPACK_I64, 1, &n);
    *tk = maskpack_tensor_contiguous((void *)cd->kvcum, MASKPACK_I64, 1, &n);
    c->input_layout = MASKPACK_NPU_TND;
    c->total_q = cd->qcum[n - 1];
    c->total_kv = cd->kvcum[n - 1];
    c->heads_q = c->heads_kv = 8;
    c->head_dim = 128;
    c->sparse_mode = cd->mode;
    c->pre_tokens = cd->pre;
    c->next_tokens = cd->next;
    c->atten_mask = &comp_t;
    c->actual_seq_qlen = tq;
    c->actual_seq_kvlen = tk;
    c->scale = 1.0 / sqrt(128.0);
}

/* Every card item's predicate (mp_npu_key_range, as the checker computes it) must equal the unsplit
 * causal predicate on the rows it holds, and the cards together must hold every row exactly once. */
static void check_stitch(const card *cards, int ncards, const int64_t *fq, const int64_t *fkv, int nfull,
                         maskpack_alignment al) {
    int64_t s[8][4], oq = 0, ok = 0;
    for (int k = 0; k < nfull; k++) {
        s[k][0] = oq;
        s[k][1] = fq[k];
        s[k][2] = ok;
        s[k][3] = fkv[k];
        oq += fq[k];
        ok += fkv[k];
    }
    maskpack_rule r = rule(1, al, -1, -1);
    maskpack_layout *full = packed((const int64_t(*)[4])s, (size_t)nfull, oq, ok, &r);
    if (!full) return;
    int64_t covered[8] = {0};
    int64_t mismatches = 0, pairs = 0;
    for (int c = 0; c < ncards; c++) {
        const card *cd = &cards[c];
        int64_t sq[4], skv[4];
        for (int k = 0; k < cd->n; k++) {
            sq[k] = cd->qcum[k] - (k ? cd->qcum[k - 1] : 0);
            skv[k] = cd->kvcum[k] - (k ? cd->kvcum[k - 1] : 0);
        }
        int64_t band = mp_npu_band_item(cd->mode, sq, skv, cd->n);
        for (int k = 0; k < cd->n; k++) {
            int f = cd->full_item[k];
            CHECK_EQ(skv[k], fkv[f]); /* keys are never split */
            CHECK_EQ(covered[f], cd->row_off[k]);
            covered[f] += sq[k];
            for (int64_t i = 0; i < sq[k]; i++) {
                int64_t lo, hi;
                mp_npu_key_range(cd->mode, cd->pre, cd->next, sq[k], skv[k], 0, k == band, i, &lo, &hi);
                for (int64_t j = 0; j < skv[k]; j++) {
                    int got = j >= lo && j < hi;
                    int want = maskpack_allowed(full, 0, 0, s[f][0] + cd->row_off[k] + i, s[f][2] + j);
                    mismatches += got != want;
                    pairs += want;
                }
            }
        }
    }
    for (int k = 0; k < nfull; k++) CHECK_EQ(covered[k], fq[k]);
    CHECK_EQ(mismatches, 0);
    CHECK(pairs > 0);
    maskpack_layout_free(full);
}

static void validate_clean(const maskpack_npu_call *c) {
    maskpack_npu_report rep;
    maskpack_error e;
    CHECK_OK(maskpack_validate_npu_args(c, &rep, &e), e);
    CHECK_EQ(rep.n_total, 0);
    if (rep.n_total) dump(&rep);
}

static void test_golden_outer_split(void) {
    /* mode 7 (doc): the unsplit batch is 4 items under mode 3 (bottom-right): (3x3), (4x6), (5x5), (4x4).
     * The 4x6 item's queries are split 2 + 2: card 1 holds item 0 and the first 2 rows of item 1 (its last
     * non-empty item, a band pre=6 next=-2); card 2 holds the last 2 rows of item 1 and items 2, 3. */
    card m7[2] = {
        {7, 6, -2, 2, {3, 5}, {3, 9}, {0, 1}, {0, 0}},
        {3, INF, 0, 3, {2, 7, 11}, {6, 11, 15}, {1, 2, 3}, {2, 0, 0}},
    };
    int64_t fq7[4] = {3, 4, 5, 4}, fk7[4] = {3, 6, 5, 4};
    check_stitch(m7, 2, fq7, fk7, 4, MASKPACK_ALIGN_BOTTOM_RIGHT);
    /* mode 8 (doc): unsplit under mode 2 (top-left): (3x3), (5x4), (5x5), (4x4); item 1's 5 query rows are
     * split 2 + 3: card 1 (mode 2) holds item 0 and rows 0-1 of item 1, card 2 (mode 8) holds rows 2-4 of
     * item 1 (its first non-empty item, a band pre=4 next=1) and items 2, 3. */
    card m8[2] = {
        {2, INF, 0, 2, {3, 5}, {3, 7}, {0, 1}, {0, 0}},
        {8, 4, 1, 3, {3, 8, 12}, {4, 9, 13}, {1, 2, 3}, {2, 0, 0}},
    };
    int64_t fq8[4] = {3, 5, 5, 4}, fk8[4] = {3, 4, 5, 4};
    check_stitch(m8, 2, fq8, fk8, 4, MASKPACK_ALIGN_TOP_LEFT);

    /* the doc's parameters satisfy every contract check */
    maskpack_npu_call c;
    maskpack_tensor tq, tk;
    for (int k = 0; k < 2; k++) {
        tnd_call(&c, &m7[k], &tq, &tk);
        validate_clean(&c);
        tnd_call(&c, &m8[k], &tq, &tk);
        validate_clean(&c);
    }
    /* the cards whose rows form a plain layout also pass the `intended` comparison */
    int64_t s2[3][4] = {{0, 2, 0, 6}, {2, 5, 6, 5}, {7, 4, 11, 4}};
    maskpack_rule br = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, -1, -1), tl = rule(1, MASKPACK_ALIGN_TOP_LEFT, -1, -1);
    maskpack_layout *L = packed((const int64_t(*)[4])s2, 3, 11, 15, &br);
    tnd_call(&c, &m7[1], &tq, &tk);
    c.intended = L;
    if (L) validate_clean(&c);
    maskpack_layout_free(L);
    int64_t s1[2][4] = {{0, 3, 0, 3}, {3, 2, 3, 4}};
    L = packed((const int64_t(*)[4])s1, 2, 5, 7, &tl);
    tnd_call(&c, &m8[0], &tq, &tk);
    c.intended = L;
    if (L) validate_clean(&c);
    maskpack_layout_free(L);
    /* and the mode 7/8 band constraints are enforced */
    maskpack_npu_report rep;
    maskpack_error e;
    card bad = m7[0];
    bad.pre = 5; /* < last Skv 6 */
    tnd_call(&c, &bad, &tq, &tk);
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK(has_code(&rep, MASKPACK_NPU_PRE_NEXT_MISMATCH));
    bad = m7[0];
    bad.next = 1; /* > 0 */
    tnd_call(&c, &bad, &tq, &tk);
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK(has_code(&rep, MASKPACK_NPU_PRE_NEXT_MISMATCH));
    bad = m8[1];
    bad.next = -2; /* < first Sq - first Skv = -1 */
    tnd_call(&c, &bad, &tq, &tk);
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK(has_code(&rep, MASKPACK_NPU_PRE_NEXT_MISMATCH));
}

/* ---- the checker ----------------------------------------------------------------------------------- */

/* A clean TND call: lengths 3, 5 causal, compressed mask, explicit scale. */
static int64_t clean_q[2] = {3, 8};
static maskpack_tensor clean_tq, clean_tk;

static maskpack_npu_call clean_tnd(void) {
    int64_t n = 2;
    clean_tq = maskpack_tensor_contiguous(clean_q, MASKPACK_I64, 1, &n);
    clean_tk = clean_tq;
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    c.input_layout = MASKPACK_NPU_TND;
    c.total_q = c.total_kv = 8;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.head_dim = 64;
    c.sparse_mode = 3;
    c.pre_tokens = INF;
    c.next_tokens = 0;
    c.atten_mask = &comp_t;
    c.actual_seq_qlen = &clean_tq;
    c.actual_seq_kvlen = &clean_tk;
    c.scale = 0.125;
    return c;
}

/* A clean BSND call: B=2, S=4, a full causal M-mask with a padded second row (inner_precise 2). */
static uint8_t bsnd_mask[2 * 4 * 4];
static maskpack_tensor bsnd_t;

static maskpack_npu_call clean_bsnd(void) {
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) bsnd_mask[b * 16 + i * 4 + j] = !(j <= i && (b == 0 || (i < 2 && j < 2)));
    int64_t shape[4] = {2, 1, 4, 4};
    bsnd_t = maskpack_tensor_contiguous(bsnd_mask, MASKPACK_BOOL, 4, shape);
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    c.input_layout = MASKPACK_NPU_BSND;
    c.batch = 2;
    c.q_len = c.kv_len = 4;
    c.heads_q = c.heads_kv = 4;
    c.head_dim = 128;
    c.sparse_mode = 1;
    c.pre_tokens = c.next_tokens = INF;
    c.atten_mask = &bsnd_t;
    c.scale = 1.0 / sqrt(128.0);
    c.inner_precise = 2;
    return c;
}

/* Validates and expects exactly one finding, of `code`. */
static void expect_only(const maskpack_npu_call *c, int32_t code, const char *fragment, int line) {
    maskpack_npu_report rep;
    maskpack_error e;
    maskpack_status s = maskpack_validate_npu_args(c, &rep, &e);
    check_count++;
    if (s != MASKPACK_ERR_NPU_CONTRACT || rep.n_total != 1 || rep.findings[0].code != code ||
        (fragment && !strstr(rep.findings[0].message, fragment))) {
        check_failures++;
        fprintf(stderr, "%s:%d: expected exactly finding %d (\"%s\"), got status %s, %d findings\n", __FILE__, line,
                code, fragment ? fragment : "", maskpack_status_name(s), rep.n_total);
        if (s == MASKPACK_ERR_NPU_CONTRACT || s == MASKPACK_OK) dump(&rep);
    } else {
        CHECK(strcmp(e.message, rep.findings[0].message) == 0); /* err carries the first finding */
    }
}
#define EXPECT_ONLY(c, code, frag) expect_only(&(c), (code), (frag), __LINE__)

static void test_validate_clean(void) {
    maskpack_npu_call c = clean_tnd();
    validate_clean(&c);
    c = clean_bsnd();
    validate_clean(&c);
    /* unusable descriptions are errors, and leave the report alone */
    maskpack_npu_report rep;
    maskpack_error e;
    rep.n_total = 1234;
    CHECK_STATUS(maskpack_validate_npu_args(NULL, &rep, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_validate_npu_args(&c, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    c = clean_tnd();
    float fl[2] = {3, 8};
    int64_t n = 2;
    maskpack_tensor ft = maskpack_tensor_contiguous(fl, MASKPACK_F32, 1, &n);
    c.actual_seq_qlen = &ft;
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_MSG(e, "actual_seq_qlen");
    CHECK_EQ(rep.n_total, 1234);
    c = clean_bsnd();
    c.batch = 0;
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
}

static void test_finding_layout(void) {
    maskpack_npu_call c = clean_tnd();
    c.input_layout = (maskpack_npu_layout)7;
    maskpack_npu_report rep;
    maskpack_error e;
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK(has_code(&rep, MASKPACK_NPU_BAD_LAYOUT));
    c = clean_tnd();
    c.actual_seq_kvlen = NULL;
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_LAYOUT, "actual_seq_kvlen is missing");
}

static void test_finding_mask_shape(void) {
    maskpack_npu_call c = clean_bsnd();
    uint8_t m[2 * 4];
    memset(m, 0, sizeof m);
    int64_t bs[2] = {2, 4}, b114[4] = {2, 1, 1, 4}, one_s[2] = {1, 4};
    maskpack_tensor t = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 2, bs);
    c.atten_mask = &t;
    c.inner_precise = 0;
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_MASK_SHAPE, "561103");
    t = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 4, b114);
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_MASK_SHAPE, "[2, 1, 1, 4]");
    t = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 2, one_s);
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_MASK_SHAPE, "561103");
    /* the accepted broadcast forms pass: [1,1,S,S] and [S,S] */
    uint8_t causal[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) causal[i * 4 + j] = j > i;
    int64_t s11[4] = {1, 1, 4, 4}, ss[2] = {4, 4}, bn[4] = {2, 4, 4, 4};
    t = maskpack_tensor_contiguous(causal, MASKPACK_BOOL, 4, s11);
    validate_clean(&c);
    t = maskpack_tensor_contiguous(causal, MASKPACK_BOOL, 2, ss);
    validate_clean(&c);
    /* [B,N,S,S] (strides 0 over b and n: one causal matrix broadcast) */
    t = maskpack_tensor_contiguous(causal, MASKPACK_BOOL, 4, bn);
    t.strides[0] = t.strides[1] = 0;
    validate_clean(&c);
    /* mode 6 needs [3072, 2048]; the 2048 one is a shape error there */
    c.sparse_mode = 6;
    c.atten_mask = &comp_t;
    int64_t pf[2] = {1, 1}, n2 = 2;
    maskpack_tensor pt = maskpack_tensor_contiguous(pf, MASKPACK_I64, 1, &n2);
    c.prefix = &pt;
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_MASK_SHAPE, "[3072, 2048]");
    c.atten_mask = &comp6_t;
    validate_clean(&c);
}

static void test_finding_mask_dtype(void) {
    maskpack_npu_call c = clean_bsnd();
    float m[2 * 16];
    for (int k = 0; k < 32; k++) m[k] = bsnd_mask[k];
    int64_t shape[4] = {2, 1, 4, 4};
    maskpack_tensor t = maskpack_tensor_contiguous(m, MASKPACK_F32, 4, shape);
    c.atten_mask = &t;
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_MASK_DTYPE, "float32");
    /* uint8 is accepted */
    uint8_t u[32];
    memcpy(u, bsnd_mask, 32);
    maskpack_tensor tu = maskpack_tensor_contiguous(u, MASKPACK_U8, 4, shape);
    c.atten_mask = &tu;
    validate_clean(&c);
}

static void test_finding_causal_without_mask(void) {
    /* MindSpeed's stale config.sparse_mode = 2 reaching a call whose mask was dropped (None) */
    maskpack_npu_call c = clean_bsnd();
    c.sparse_mode = 2;
    c.atten_mask = NULL;
    c.inner_precise = 0;
    c.pre_tokens = 65536;
    c.next_tokens = 0;
    EXPECT_ONLY(c, MASKPACK_NPU_CAUSAL_WITHOUT_MASK, "silently");
    c = clean_tnd();
    c.atten_mask = NULL;
    EXPECT_ONLY(c, MASKPACK_NPU_CAUSAL_WITHOUT_MASK, "bidirectional");
    /* mode 0 with causal pre/next but no mask: pre/next are ignored */
    c.sparse_mode = 0;
    EXPECT_ONLY(c, MASKPACK_NPU_CAUSAL_WITHOUT_MASK, "ignores pre/next");
    c.next_tokens = INF;
    validate_clean(&c);
}

static void test_finding_dense_for_compressed(void) {
    maskpack_npu_call c = clean_bsnd();
    c.sparse_mode = 3;
    c.inner_precise = 0;
    EXPECT_ONLY(c, MASKPACK_NPU_DENSE_FOR_COMPRESSED, "compressed");
    c = clean_bsnd();
    c.atten_mask = &comp_t; /* compressed mask given to mode 1 with S = 4 */
    EXPECT_ONLY(c, MASKPACK_NPU_DENSE_FOR_COMPRESSED, "full mask");
}

static void test_finding_leading_zero(void) {
    /* the TE form [0, 3, 8] passed as actual_seq_*: flagged on both lists */
    maskpack_npu_call c = clean_tnd();
    int64_t te[3] = {0, 3, 8}, n = 3;
    maskpack_tensor t = maskpack_tensor_contiguous(te, MASKPACK_I64, 1, &n);
    c.actual_seq_qlen = c.actual_seq_kvlen = &t;
    maskpack_npu_report rep;
    maskpack_error e;
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK_EQ(rep.n_total, 2);
    CHECK_EQ(rep.findings[0].code, MASKPACK_NPU_LEADING_ZERO);
    CHECK_EQ(rep.findings[1].code, MASKPACK_NPU_LEADING_ZERO);
    CHECK_MSG(e, "TE");
    CHECK_MSG(e, "actual_seq_qlen[0]");
    /* with `intended` saying the first segment really is empty, it is not flagged */
    int64_t s[3][4] = {{0, 0, 0, 0}, {0, 3, 0, 3}, {3, 5, 3, 5}};
    maskpack_layout *L = packed((const int64_t(*)[4])s, 3, 8, 8, NULL);
    c.intended = L;
    if (L) validate_clean(&c);
    maskpack_layout_free(L);
}

static void test_finding_not_cumulative(void) {
    maskpack_npu_call c = clean_tnd();
    int64_t lens[2] = {3, 5}, n = 2; /* lengths, not cumulative ends: 5 is also != T */
    maskpack_tensor t = maskpack_tensor_contiguous(lens, MASKPACK_I64, 1, &n);
    c.actual_seq_kvlen = &t;
    EXPECT_ONLY(c, MASKPACK_NPU_NOT_CUMULATIVE, "actual_seq_kvlen: expected the last cumulative end to be T = 8");
    int64_t dec[3] = {3, 8, 6};
    n = 3;
    t = maskpack_tensor_contiguous(dec, MASKPACK_I64, 1, &n);
    c = clean_tnd();
    c.total_q = c.total_kv = 0; /* unknown totals: only the order is checked */
    c.actual_seq_qlen = c.actual_seq_kvlen = &t;
    maskpack_npu_report rep;
    maskpack_error e;
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK_EQ(rep.n_total, 2);
    CHECK(has_code(&rep, MASKPACK_NPU_NOT_CUMULATIVE));
    CHECK_MSG(e, "actual_seq_qlen[2]: expected >= 8");
    /* CANN 9.0: trailing tokens of no sequence declared with a final 0 */
    int64_t term[3] = {3, 8, 0};
    t = maskpack_tensor_contiguous(term, MASKPACK_I64, 1, &n);
    c = clean_tnd();
    c.total_q = c.total_kv = 10;
    c.actual_seq_qlen = c.actual_seq_kvlen = &t;
    validate_clean(&c);
    /* without it, 8 of 10 tokens is a finding */
    c = clean_tnd();
    c.total_q = 10;
    EXPECT_ONLY(c, MASKPACK_NPU_NOT_CUMULATIVE, "trailing tokens");
    /* a negative end, even the first (where no earlier end shows the list going down) or -1 */
    for (int64_t bad = -1; bad >= -2; bad--) {
        int64_t neg[3] = {bad, 3, 8};
        t = maskpack_tensor_contiguous(neg, MASKPACK_I64, 1, &n);
        c = clean_tnd();
        c.actual_seq_qlen = &t;
        EXPECT_ONLY(c, MASKPACK_NPU_NOT_CUMULATIVE, "actual_seq_qlen[0]: expected a cumulative end >= 0");
    }
}

static void test_finding_too_many_items(void) {
    int64_t *v = malloc(2049 * sizeof *v);
    if (!v) return;
    for (int k = 0; k < 2049; k++) v[k] = k + 1;
    int64_t n = 2049;
    maskpack_tensor t = maskpack_tensor_contiguous(v, MASKPACK_I64, 1, &n);
    maskpack_npu_call c = clean_tnd();
    c.total_q = c.total_kv = 2049;
    c.actual_seq_qlen = c.actual_seq_kvlen = &t;
    EXPECT_ONLY(c, MASKPACK_NPU_TOO_MANY_ITEMS, "2049");
    n = 2048;
    t = maskpack_tensor_contiguous(v, MASKPACK_I64, 1, &n);
    c.total_q = c.total_kv = 2048;
    validate_clean(&c);
    free(v);
    /* prefix mode with B = 33 */
    maskpack_npu_call b = clean_bsnd();
    b.sparse_mode = 6;
    b.batch = 33;
    b.atten_mask = &comp6_t;
    b.inner_precise = 0;
    int64_t pf[33] = {0}, n33 = 33;
    maskpack_tensor pt = maskpack_tensor_contiguous(pf, MASKPACK_I64, 1, &n33);
    b.prefix = &pt;
    EXPECT_ONLY(b, MASKPACK_NPU_TOO_MANY_ITEMS, "32");
}

static void test_finding_fully_masked_row(void) {
    /* the clean padded BSND call without inner_precise 2 */
    maskpack_npu_call c = clean_bsnd();
    c.inner_precise = 0;
    EXPECT_ONLY(c, MASKPACK_NPU_FULLY_MASKED_ROW, "b 1, head 0, i 2");
    /* TND full mask [maxSq, maxSkv] with a fully masked row: forbidden whatever inner_precise says */
    uint8_t m[5 * 5];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) m[i * 5 + j] = j > i || i == 4;
    int64_t shape[2] = {5, 5};
    maskpack_tensor t = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 2, shape);
    c = clean_tnd();
    c.sparse_mode = 1;
    c.atten_mask = &t;
    c.inner_precise = 2;
    EXPECT_ONLY(c, MASKPACK_NPU_FULLY_MASKED_ROW, "row 4 of item 1");
    m[4 * 5 + 0] = 0;
    validate_clean(&c);
}

static void test_finding_pre_next(void) {
    /* MindSpeed default pre_tokens 65536 with a 70000-token band: keys beyond 65536 are dropped */
    int64_t v[1] = {70000}, n = 1;
    maskpack_tensor t = maskpack_tensor_contiguous(v, MASKPACK_I64, 1, &n);
    maskpack_npu_call c = clean_tnd();
    c.actual_seq_qlen = c.actual_seq_kvlen = &t;
    c.total_q = c.total_kv = 70000;
    c.sparse_mode = 4;
    c.pre_tokens = 65536;
    c.next_tokens = 0;
    EXPECT_ONLY(c, MASKPACK_NPU_PRE_NEXT_MISMATCH, "65536");
    c.pre_tokens = INF;
    validate_clean(&c);
    /* mode 0 with a bidirectional full mask but next_tokens 0: pre/next drop what the mask allows */
    uint8_t m[16];
    memset(m, 0, sizeof m);
    int64_t ss[2] = {4, 4};
    maskpack_tensor mt = maskpack_tensor_contiguous(m, MASKPACK_BOOL, 2, ss);
    maskpack_npu_call b = clean_bsnd();
    b.sparse_mode = 0;
    b.atten_mask = &mt;
    b.inner_precise = 0;
    b.pre_tokens = 65536;
    b.next_tokens = 0;
    EXPECT_ONLY(b, MASKPACK_NPU_PRE_NEXT_MISMATCH, "disagree");
    /* a causal full mask with next 0 is consistent */
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) m[i * 4 + j] = j > i;
    validate_clean(&b);
    /* an empty band */
    c = clean_tnd();
    c.sparse_mode = 4;
    c.pre_tokens = 1;
    c.next_tokens = -3;
    maskpack_npu_report rep;
    maskpack_error e;
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK(has_code(&rep, MASKPACK_NPU_PRE_NEXT_MISMATCH));
    CHECK_MSG(e, "empty");
    /* band pre/next against the intended window (left 2): pre 3 is wrong */
    int64_t len[2] = {3, 5};
    maskpack_rule w = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, 2, -1);
    maskpack_layout *L = packed_lengths(len, 2, &w);
    c = clean_tnd();
    c.sparse_mode = 4;
    c.pre_tokens = 3;
    c.next_tokens = 0;
    c.intended = L;
    if (L) {
        CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
        CHECK(has_code(&rep, MASKPACK_NPU_MASK_MISMATCH));
        CHECK(has_code(&rep, MASKPACK_NPU_PRE_NEXT_MISMATCH));
        CHECK(strstr(rep.findings[rep.n_findings - 1].message, "needs pre_tokens 2 and next_tokens 0") != NULL);
        c.pre_tokens = 2;
        validate_clean(&c);
    }
    maskpack_layout_free(L);
}

static void test_finding_heads_scale_mode(void) {
    maskpack_npu_call c = clean_tnd();
    c.heads_kv = 3;
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_HEADS, "multiple");
    c = clean_tnd();
    c.head_dim = 1024;
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_HEADS, "768");
    c = clean_tnd();
    c.scale = NAN;
    EXPECT_ONLY(c, MASKPACK_NPU_SCALE_DEFAULT, "1.0");
    c = clean_tnd();
    c.sparse_mode = 9;
    EXPECT_ONLY(c, MASKPACK_NPU_BAD_SPARSE_MODE, "0..8");
    maskpack_npu_call b = clean_bsnd();
    b.sparse_mode = 7;
    b.atten_mask = &comp_t;
    b.inner_precise = 0;
    EXPECT_ONLY(b, MASKPACK_NPU_BAD_SPARSE_MODE, "varlen");
}

static void test_finding_mask_mismatch(void) {
    /* mode 2 (top-left) for a bottom-right cross layout */
    int64_t cross[2][4] = {{0, 2, 0, 4}, {2, 3, 4, 3}};
    maskpack_rule br = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, -1, -1);
    maskpack_layout *L = packed((const int64_t(*)[4])cross, 2, 5, 7, &br);
    int64_t q[2] = {2, 5}, k[2] = {4, 7}, n = 2;
    maskpack_tensor tq = maskpack_tensor_contiguous(q, MASKPACK_I64, 1, &n);
    maskpack_tensor tk = maskpack_tensor_contiguous(k, MASKPACK_I64, 1, &n);
    maskpack_npu_call c = clean_tnd();
    c.actual_seq_qlen = &tq;
    c.actual_seq_kvlen = &tk;
    c.total_q = 5;
    c.total_kv = 7;
    c.intended = L;
    c.sparse_mode = 2;
    EXPECT_ONLY(c, MASKPACK_NPU_MASK_MISMATCH, "(b 0, head 0, i 0, j 1)");
    c.sparse_mode = 3;
    if (L) validate_clean(&c);
    maskpack_layout_free(L);
    /* a keep-polarity compressed mask: ~triu is tril */
    uint8_t *inv = malloc(2048 * 2048);
    if (!inv) return;
    for (int64_t x = 0; x < 2048 * 2048; x++) inv[x] = !comp_mask[x];
    int64_t s2[2] = {2048, 2048};
    maskpack_tensor it = maskpack_tensor_contiguous(inv, MASKPACK_BOOL, 2, s2);
    c = clean_tnd();
    c.atten_mask = &it;
    EXPECT_ONLY(c, MASKPACK_NPU_MASK_MISMATCH, "polarity");
    free(inv);
}

static void test_several_findings(void) {
    maskpack_npu_call c = clean_tnd();
    int64_t te[3] = {0, 3, 8}, n = 3;
    maskpack_tensor t = maskpack_tensor_contiguous(te, MASKPACK_I64, 1, &n);
    c.actual_seq_qlen = &t;
    c.actual_seq_kvlen = &t;
    c.scale = NAN;
    c.heads_kv = 3;
    c.sparse_mode = 2;
    c.atten_mask = NULL;
    maskpack_npu_report rep;
    maskpack_error e;
    CHECK_STATUS(maskpack_validate_npu_args(&c, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
    CHECK_EQ(rep.n_total, 5);
    CHECK_EQ(rep.n_findings, 5);
    CHECK(has_code(&rep, MASKPACK_NPU_LEADING_ZERO));
    CHECK(has_code(&rep, MASKPACK_NPU_SCALE_DEFAULT));
    CHECK(has_code(&rep, MASKPACK_NPU_BAD_HEADS));
    CHECK(has_code(&rep, MASKPACK_NPU_CAUSAL_WITHOUT_MASK));
    CHECK(strcmp(e.message, rep.findings[0].message) == 0);
}

/* ---- round trip: emitter -> checker ----------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static int64_t rnd(int64_t n) { return (int64_t)((test_lcg_next(&rng_state) >> 33) % (uint64_t)n); } /* [0, n) */

static maskpack_rule random_rule(int64_t *pf, size_t n_seg, const int64_t *kv_len, int allow_prefix) {
    maskpack_rule r = maskpack_rule_default();
    r.alignment = rnd(2) ? MASKPACK_ALIGN_BOTTOM_RIGHT : MASKPACK_ALIGN_TOP_LEFT;
    switch (rnd(allow_prefix ? 5 : 4)) {
    case 0: break; /* plain causal */
    case 1: r.window_left = rnd(5); break;
    case 2:
        r.causal = 0;
        r.window_left = rnd(5) - 1;
        r.window_right = rnd(5) - 1;
        break;
    case 3: r.causal = 0; break;
    default:
        for (size_t k = 0; k < n_seg; k++) pf[k] = rnd(kv_len[k] + 1);
        r.prefix = pf;
        r.n_prefix = n_seg;
        break;
    }
    return r;
}

static int seen_modes[2][9]; /* [TND?][sparse_mode] of the calls the round trip checked */

static int round_trip_one(maskpack_layout *L, maskpack_npu_layout il, int64_t heads_q) {
    maskpack_npu_argset a;
    maskpack_error e;
    maskpack_status s = maskpack_npu_args(L, il, 0, 128, &a, &e);
    if (s == MASKPACK_ERR_NOT_REPRESENTABLE) return 0;
    CHECK_OK(s, e);
    if (s) return 0;
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    c.input_layout = il;
    c.batch = maskpack_layout_n_rows(L);
    c.q_len = maskpack_layout_q_width(L);
    c.kv_len = maskpack_layout_kv_width(L);
    c.heads_q = heads_q;
    c.heads_kv = 2;
    c.head_dim = 128;
    c.sparse_mode = a.sparse_mode;
    c.pre_tokens = a.pre_tokens;
    c.next_tokens = a.next_tokens;
    c.scale = a.scale;
    c.inner_precise = a.inner_precise;
    c.intended = L;
    maskpack_tensor tq, tk, tp, tm;
    uint8_t *full = NULL;
    if (il == MASKPACK_NPU_TND) {
        c.total_q = c.q_len;
        c.total_kv = c.kv_len;
        tq = maskpack_tensor_contiguous(a.actual_seq_qlen, MASKPACK_I64, 1, &a.n_items);
        tk = maskpack_tensor_contiguous(a.actual_seq_kvlen, MASKPACK_I64, 1, &a.n_items);
        c.actual_seq_qlen = &tq;
        c.actual_seq_kvlen = &tk;
    }
    if (a.prefix) {
        tp = maskpack_tensor_contiguous(a.prefix, MASKPACK_I64, 1, &a.n_prefix);
        c.prefix = &tp;
    }
    if (a.mask_kind == MASKPACK_NPU_MASK_COMPRESSED) c.atten_mask = &comp_t;
    if (a.mask_kind == MASKPACK_NPU_MASK_PREFIX_COMPRESSED) c.atten_mask = &comp6_t;
    if (a.mask_kind == MASKPACK_NPU_MASK_FULL) {
        full = malloc((size_t)(a.mask_shape[0] * a.mask_shape[2] * a.mask_shape[3]));
        if (!full) return 0;
        tm = maskpack_tensor_contiguous(full, rnd(2) ? MASKPACK_BOOL : MASKPACK_U8, 4, a.mask_shape);
        CHECK_OK(maskpack_npu_atten_mask(L, &a, &tm, &e), e);
        c.atten_mask = &tm;
    }
    maskpack_npu_report rep;
    s = maskpack_validate_npu_args(&c, &rep, &e);
    CHECK_OK(s, e);
    if (a.sparse_mode >= 0 && a.sparse_mode <= 8) seen_modes[il == MASKPACK_NPU_TND][a.sparse_mode]++;
    if (s) {
        fprintf(stderr, "  round trip: input_layout %d, sparse_mode %d, %lld items\n", (int)il, (int)a.sparse_mode,
                (long long)a.n_items);
        dump(&rep);
    }
    free(full);
    maskpack_npu_argset_release(&a);
    return s == MASKPACK_OK;
}


/* The doc's outer-split cards as maskpack shard pieces (explicit positions): the emitter finds the
 * doc's sparse modes and lists by itself, and the doc's exact calls compute the pieces' predicate. */
static void test_golden_from_pieces(void) {
    const uint32_t X = MASKPACK_SEGMENT_EXPLICIT_POS;
    maskpack_rule br = rule(1, MASKPACK_ALIGN_BOTTOM_RIGHT, -1, -1), tl = rule(1, MASKPACK_ALIGN_TOP_LEFT, -1, -1);
    /* mode 7: unsplit (3x3), (4x6), (5x5), (4x4) bottom-right; item 1's rows 0-1 sit at key positions
     * 2-3 (diagonal i + 6 - 4), rows 2-3 at 4-5 */
    maskpack_segment c1[2] = {{0, 0, 3, 0, 3, 0, 0, 0}, {0, 3, 2, 3, 6, X, 2, 1}};
    maskpack_segment c2[3] = {{0, 0, 2, 0, 6, X, 4, 1}, {0, 2, 5, 6, 5, 0, 0, 0}, {0, 7, 4, 11, 4, 0, 0, 0}};
    /* mode 8: unsplit (3x3), (5x4), (5x5), (4x4) top-left; item 1's rows 0-1 sit at key positions 0-1.
     * Its rows 2-4 (card 2) sit at positions 2-4 of 4 keys: a query past the last key has no explicit
     * position in maskpack (q_pos + q_len <= kv_len), so card 2 of mode 8 is covered by the stitching
     * test only. */
    maskpack_segment d1[2] = {{0, 0, 3, 0, 3, 0, 0, 0}, {0, 3, 2, 3, 4, X, 0, 1}};
    struct {
        const maskpack_segment *seg;
        size_t n;
        int64_t qw, kw;
        const maskpack_rule *r;
        int32_t mode, doc_mode;
        int64_t next, doc_pre, doc_next;
        int64_t q[3], kv[3];
    } cards[3] = {
        {c1, 2, 5, 9, &br, 7, 7, -2, 6, -2, {3, 5}, {3, 9}},
        {c2, 3, 11, 15, &br, 3, 3, 0, INF, 0, {2, 7, 11}, {6, 11, 15}},
        {d1, 2, 5, 7, &tl, 2, 2, 0, INF, 0, {3, 5}, {3, 7}},
    };
    for (int c = 0; c < 3; c++) {
        maskpack_layout *L = NULL;
        maskpack_error e;
        CHECK_OK(
            maskpack_layout_from_segments(cards[c].seg, cards[c].n, 1, cards[c].qw, cards[c].kw, 1, cards[c].r, &L, &e),
            e);
        if (!L) continue;
        maskpack_npu_argset a;
        if (emit(L, MASKPACK_NPU_TND, &a)) {
            CHECK_EQ(a.sparse_mode, cards[c].mode);
            CHECK_EQ(a.next_tokens, cards[c].next);
            CHECK_EQ(a.n_items, (int64_t)cards[c].n);
            check_list(a.actual_seq_qlen, cards[c].q, (int64_t)cards[c].n);
            check_list(a.actual_seq_kvlen, cards[c].kv, (int64_t)cards[c].n);
            maskpack_npu_argset_release(&a);
        }
        CHECK(round_trip_one(L, MASKPACK_NPU_TND, 8));
        /* the doc's own call (pre 6 / 4 instead of our unbounded pre) computes the same pieces */
        maskpack_npu_call call;
        memset(&call, 0, sizeof call);
        int64_t n = (int64_t)cards[c].n;
        maskpack_tensor tq = maskpack_tensor_contiguous(cards[c].q, MASKPACK_I64, 1, &n);
        maskpack_tensor tk = maskpack_tensor_contiguous(cards[c].kv, MASKPACK_I64, 1, &n);
        call.input_layout = MASKPACK_NPU_TND;
        call.total_q = cards[c].qw;
        call.total_kv = cards[c].kw;
        call.heads_q = call.heads_kv = 8;
        call.head_dim = 128;
        call.sparse_mode = cards[c].doc_mode;
        call.pre_tokens = cards[c].doc_pre;
        call.next_tokens = cards[c].doc_next;
        call.atten_mask = &comp_t;
        call.actual_seq_qlen = &tq;
        call.actual_seq_kvlen = &tk;
        call.scale = 0.1;
        call.intended = L;
        validate_clean(&call);
        /* and a wrong next_tokens on the band card is caught against the pieces */
        if (cards[c].doc_mode >= 7) {
            maskpack_npu_report rep;
            call.next_tokens = cards[c].doc_next - 1;
            CHECK_STATUS(maskpack_validate_npu_args(&call, &rep, &e), MASKPACK_ERR_NPU_CONTRACT, e);
            CHECK(has_code(&rep, MASKPACK_NPU_MASK_MISMATCH));
        }
        maskpack_layout_free(L);
    }
}

/* Context-parallel shards built by the library: what the NPU can take and what it cannot. */
static void test_cp_shards(void) {
    maskpack_error e;
    maskpack_layout *L = NULL, *R = NULL;
    maskpack_npu_argset a;
    /* packed {6, 10}, cp 2 contiguous: rank 0 = A whole + head of B (both top-left: mode 2), rank 1 =
     * rest of B (bottom-right: mode 3) */
    int64_t s[2][4] = {{0, 6, 0, 6}, {6, 10, 6, 10}};
    L = packed((const int64_t(*)[4])s, 2, 16, 16, NULL);
    if (!L) return;
    CHECK_OK(maskpack_layout_cp_shard(L, 2, 0, MASKPACK_CP_CONTIGUOUS, &R, &e), e);
    if (R && emit(R, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 2);
        CHECK_EQ(a.n_items, 2);
        maskpack_npu_argset_release(&a);
        CHECK(round_trip_one(R, MASKPACK_NPU_TND, 8));
    }
    maskpack_layout_free(R);
    R = NULL;
    CHECK_OK(maskpack_layout_cp_shard(L, 2, 1, MASKPACK_CP_CONTIGUOUS, &R, &e), e);
    if (R && emit(R, MASKPACK_NPU_TND, &a)) {
        CHECK_EQ(a.sparse_mode, 3);
        CHECK_EQ(a.n_items, 2); /* a key-only pad item for A's keys, then B */
        CHECK_EQ(a.pad_items[0], 1);
        CHECK_EQ(a.actual_seq_qlen[0], 0);
        CHECK_EQ(a.actual_seq_kvlen[0], 6);
        maskpack_npu_argset_release(&a);
        CHECK(round_trip_one(R, MASKPACK_NPU_TND, 8));
    }
    maskpack_layout_free(R);
    R = NULL;
    /* zigzag: the two chunks of a sequence share its keys: no TND items for that */
    int64_t z[2][4] = {{0, 8, 0, 8}, {8, 8, 8, 8}};
    maskpack_layout_free(L);
    L = packed((const int64_t(*)[4])z, 2, 16, 16, NULL);
    if (!L) return;
    CHECK_OK(maskpack_layout_cp_shard(L, 2, 0, MASKPACK_CP_ZIGZAG, &R, &e), e);
    if (R) {
        CHECK_STATUS(maskpack_npu_args(R, MASKPACK_NPU_TND, 0, 64, &a, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "sharing keys");
    }
    maskpack_layout_free(R);
    maskpack_layout_free(L);
    R = NULL;
    /* padded [2, 8]: zigzag rows hold two pieces (full mask); contiguous rows one piece each (band) */
    L = full_rows(2, 8, 8, NULL);
    if (!L) return;
    struct {
        maskpack_cp_scheme scheme;
        int64_t cp, rank;
        int32_t mode;
        int64_t next;
    } cases[] = {
        {MASKPACK_CP_ZIGZAG, 2, 0, 1, INF},    {MASKPACK_CP_ZIGZAG, 2, 1, 1, INF},
        {MASKPACK_CP_CONTIGUOUS, 2, 0, 2, 0},  {MASKPACK_CP_CONTIGUOUS, 2, 1, 3, 0},
        {MASKPACK_CP_CONTIGUOUS, 4, 1, 4, -4}, /* rows at key positions 2-3 of 8: diagonal 4 left */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        R = NULL;
        CHECK_OK(maskpack_layout_cp_shard(L, cases[c].cp, cases[c].rank, cases[c].scheme, &R, &e), e);
        if (R && emit(R, MASKPACK_NPU_BSND, &a)) {
            CHECK_EQ(a.sparse_mode, cases[c].mode);
            CHECK_EQ(a.next_tokens, cases[c].next);
            maskpack_npu_argset_release(&a);
            CHECK(round_trip_one(R, MASKPACK_NPU_BSND, 8));
        }
        maskpack_layout_free(R);
    }
    maskpack_layout_free(L);
}

static void test_round_trip(void) {
    int passed_tnd = 0, passed_bsnd = 0;
    for (int iter = 0; iter < 120; iter++) {
        /* TND: random segments with gaps, some empty, some cross (q_len != kv_len) */
        size_t n = (size_t)rnd(6) + 1;
        maskpack_segment seg[8];
        int64_t kvl[8], pf[8];
        memset(seg, 0, sizeof seg);
        int cross = rnd(3) == 0;
        int64_t cq = 0, ck = 0;
        for (size_t k = 0; k < n; k++) {
            int64_t gap = rnd(3) == 0 ? rnd(3) + 1 : 0;
            int64_t kgap = cross ? (rnd(3) == 0 ? rnd(3) : 0) : gap;
            int64_t ql = rnd(8) == 0 ? 0 : rnd(9) + 1;
            int64_t kl = cross ? rnd(10) : ql;
            seg[k].row = 0;
            seg[k].q_start = cq + gap;
            seg[k].q_len = ql;
            seg[k].kv_start = ck + kgap;
            seg[k].kv_len = kl;
            kvl[k] = kl;
            cq = seg[k].q_start + ql;
            ck = seg[k].kv_start + kl;
        }
        int64_t tail = rnd(3);
        maskpack_rule r = random_rule(pf, n, kvl, 1);
        maskpack_layout *L = NULL;
        maskpack_error e;
        CHECK_OK(maskpack_layout_from_segments(seg, n, 1, cq + tail, ck + (cross ? rnd(3) : tail), 1, &r, &L, &e), e);
        if (L) passed_tnd += round_trip_one(L, MASKPACK_NPU_TND, 8);
        maskpack_layout_free(L);

        /* B*S: full rows (possibly cross) or padded rows */
        int64_t B = rnd(3) + 1, S = rnd(7) + 1, Skv = rnd(3) == 0 ? rnd(7) + 1 : S;
        int padded = rnd(2);
        for (int64_t b = 0; b < B; b++) {
            seg[b].row = b;
            seg[b].q_start = seg[b].kv_start = 0;
            seg[b].q_len = S;
            seg[b].kv_len = Skv;
            if (padded) {
                int64_t len = rnd(S + 1);
                seg[b].q_len = seg[b].kv_len = len;
                if (rnd(2)) seg[b].q_start = seg[b].kv_start = S - len; /* left padding */
            }
            kvl[b] = seg[b].kv_len;
        }
        r = random_rule(pf, (size_t)B, kvl, 1);
        CHECK_OK(maskpack_layout_from_segments(seg, (size_t)B, B, S, padded ? S : Skv, 0, &r, &L, &e), e);
        if (L) passed_bsnd += round_trip_one(L, (maskpack_npu_layout)rnd(4), rnd(2) ? 4 : 8);
        maskpack_layout_free(L);
    }
    /* context-parallel shards of random layouts (explicit positions): whatever the emitter accepts,
     * the checker must find exact */
    int passed_shard = 0;
    for (int iter = 0; iter < 60; iter++) {
        int packed_src = rnd(2);
        int64_t cp = rnd(2) + 2, B = rnd(2) + 1, n = rnd(3) + 1;
        maskpack_cp_scheme scheme = rnd(2) ? MASKPACK_CP_ZIGZAG : MASKPACK_CP_CONTIGUOUS;
        maskpack_segment seg[8];
        int64_t kvl[8], pf[8];
        memset(seg, 0, sizeof seg);
        int64_t off = 0, S = 2 * cp * (rnd(3) + 1);
        size_t ns = packed_src ? (size_t)n : (size_t)B;
        for (size_t k = 0; k < ns; k++) {
            int64_t len = packed_src ? 2 * cp * (rnd(3) + 1) : S - (rnd(2) ? rnd(S) : 0);
            seg[k].row = packed_src ? 0 : (int64_t)k;
            seg[k].q_start = seg[k].kv_start = packed_src ? off : 0;
            seg[k].q_len = seg[k].kv_len = len;
            kvl[k] = len;
            off += len;
        }
        maskpack_rule r = random_rule(pf, ns, kvl, 1);
        maskpack_layout *L = NULL, *R = NULL;
        maskpack_error e;
        if (packed_src)
            CHECK_OK(maskpack_layout_from_segments(seg, ns, 1, off, off, 1, &r, &L, &e), e);
        else
            CHECK_OK(maskpack_layout_from_segments(seg, ns, B, S, S, 0, &r, &L, &e), e);
        if (!L) continue;
        if (maskpack_layout_cp_shard(L, cp, rnd(cp), scheme, &R, &e) == MASKPACK_OK) {
            passed_shard += round_trip_one(R, packed_src ? MASKPACK_NPU_TND : MASKPACK_NPU_BSND, 8);
        }
        maskpack_layout_free(R);
        maskpack_layout_free(L);
    }
    CHECK(passed_shard >= 25);
    /* every mode the emitter produces was exercised on both sides */
    int tnd_modes[5] = {0, 2, 3, 4, 6}, bsnd_modes[6] = {0, 1, 2, 3, 4, 6};
    for (int k = 0; k < 5; k++) CHECK(seen_modes[1][tnd_modes[k]] > 0);
    for (int k = 0; k < 6; k++) CHECK(seen_modes[0][bsnd_modes[k]] > 0);
    printf("round trip modes TND:");
    for (int k = 0; k < 9; k++) printf(" %d", seen_modes[1][k]);
    printf("; B*S:");
    for (int k = 0; k < 9; k++) printf(" %d", seen_modes[0][k]);
    printf("\n");
    /* most random layouts are representable: the round trip really ran */
    CHECK(passed_tnd >= 80);
    CHECK(passed_bsnd >= 100);
    printf("round trip: %d TND, %d B*S and %d CP-shard layouts agreed\n", passed_tnd, passed_bsnd, passed_shard);
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
        seen |= strstr(rep.findings[i].message, "sparse_mode 5 (prefix with a full mask) is not supported with TND") !=
                NULL;
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

int main(void) {
    build_compressed();
    test_scale();
    test_tnd_causal();
    test_tnd_pad_items();
    test_tnd_windows();
    test_tnd_prefix();
    test_tnd_limits();
    test_bsnd();
    test_atten_masks();
    test_release();
    test_golden_outer_split();
    test_validate_clean();
    test_finding_layout();
    test_finding_mask_shape();
    test_finding_mask_dtype();
    test_finding_causal_without_mask();
    test_finding_dense_for_compressed();
    test_finding_leading_zero();
    test_finding_not_cumulative();
    test_finding_too_many_items();
    test_finding_fully_masked_row();
    test_finding_pre_next();
    test_finding_heads_scale_mode();
    test_finding_mask_mismatch();
    test_several_findings();
    test_golden_from_pieces();
    test_cp_shards();
    test_round_trip();
    test_npu_mode5_full_mask();
    test_npu_mask_shapes();
    test_npu_pre_next();
    test_npu_tnd_lists();
    return check_report("test_npu");
}
