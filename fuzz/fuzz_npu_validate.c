/* fuzz_npu_validate.c: maskpack_validate_npu_args on fuzzed npu_fusion_attention calls.
 *
 * Two kinds of input, chosen by the first byte:
 *   hand-built: every field of the call from the bytes, small atten_mask / actual_seq / prefix
 *     tensors (sometimes the 2048x2048 compressed mask, sometimes an intended layout). Any status is
 *     fine; the report must be well formed: OK <=> no findings, NPU_CONTRACT <=> at least one, codes
 *     known, messages non-empty.
 *   round trip: a layout from lengths (padded or packed, causal or not, maybe a window), the
 *     arguments maskpack_npu_args derives for it, and the atten_mask maskpack_npu_atten_mask builds:
 *     the call they make, checked against that same layout, must have no finding. */
#include "fuzz_common.h"

#define MAX_ITEMS 8
#define MAX_SIDE  12

static void check_report(maskpack_status s, const maskpack_npu_report *rep, const maskpack_error *e) {
    fuzz_check_error(s, e);
    if (s == MASKPACK_OK) {
        FUZZ_ASSERT(rep->n_findings == 0 && rep->n_total == 0, "OK with %d findings", (int)rep->n_total);
    } else if (s == MASKPACK_ERR_NPU_CONTRACT) {
        FUZZ_ASSERT(rep->n_findings >= 1 && rep->n_findings <= MASKPACK_NPU_MAX_FINDINGS &&
                        rep->n_findings <= rep->n_total,
                    "NPU_CONTRACT with n_findings %d, n_total %d", (int)rep->n_findings, (int)rep->n_total);
        for (int32_t i = 0; i < rep->n_findings; i++) {
            const maskpack_npu_finding *f = &rep->findings[i];
            FUZZ_ASSERT(f->code >= MASKPACK_NPU_BAD_LAYOUT && f->code <= MASKPACK_NPU_MASK_MISMATCH, "finding code %d",
                        (int)f->code);
            FUZZ_ASSERT(memchr(f->message, 0, sizeof f->message) && f->message[0], "finding %d message", (int)i);
        }
    }
}

/* A bool/u8 tensor of the given shape; `compressed` fills triu(ones, 1) (the operator's M-mask). */
static uint8_t *make_mask(fuzz_reader *in, maskpack_tensor *t, int compressed) {
    int64_t shape[4];
    int32_t nd;
    if (compressed) {
        nd = 2;
        shape[0] = shape[1] = 2048;
    } else {
        nd = fz_u8(in) & 1 ? 4 : 2;
        for (int32_t d = 0; d < nd; d++) shape[d] = fz_u8(in) % (MAX_SIDE + 1);
    }
    int64_t n = 1;
    for (int32_t d = 0; d < nd; d++) n *= shape[d];
    uint8_t *buf = malloc((size_t)(n ? n : 1));
    if (!buf) return NULL;
    if (compressed) {
        for (int64_t i = 0; i < 2048; i++)
            for (int64_t j = 0; j < 2048; j++) buf[i * 2048 + j] = j > i;
        if (fz_u8(in) < 32) buf[fz_range(in, 0, n - 1)] ^= 1; /* a stale or damaged cached mask */
    } else {
        for (int64_t i = 0; i < n; i++) buf[i] = fz_u8(in) & 1;
    }
    maskpack_dtype dt = fz_u8(in) < 240 ? MASKPACK_BOOL : (maskpack_dtype)(fz_u8(in) % MASKPACK_DTYPE_COUNT_);
    if (maskpack_dtype_size(dt) != 1) dt = MASKPACK_U8;
    *t = maskpack_tensor_contiguous(buf, dt, nd, shape);
    return buf;
}

static void hand_built(fuzz_reader *in) {
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    c.input_layout = (maskpack_npu_layout)(fz_u8(in) % 6);
    c.batch = fz_maybe_weird(in, 1 + fz_u8(in) % 3);
    c.q_len = fz_maybe_weird(in, 1 + fz_u8(in) % MAX_SIDE);
    c.kv_len = fz_maybe_weird(in, 1 + fz_u8(in) % MAX_SIDE);
    c.total_q = fz_u8(in) % 20;
    c.total_kv = fz_u8(in) % 20;
    c.heads_q = fz_maybe_weird(in, 1 + fz_u8(in) % 8);
    c.heads_kv = fz_maybe_weird(in, 1 + fz_u8(in) % 8);
    c.head_dim = fz_maybe_weird(in, 64 << (fz_u8(in) % 5));
    c.sparse_mode = (int32_t)(fz_u8(in) % 11) - 1;
    c.pre_tokens = fz_maybe_weird(in, (int64_t)(fz_u8(in) % 8) - 1);
    c.next_tokens = fz_maybe_weird(in, (int64_t)(fz_u8(in) % 8) - 1);
    uint8_t opt = fz_u8(in);
    c.scale = opt & 1 ? NAN : (opt & 2 ? 0.125 : 1.0);
    c.inner_precise = opt & 4 ? 2 : 0;
    maskpack_tensor mask, q, kv, pf;
    uint8_t *mask_buf = NULL;
    int64_t qv[MAX_ITEMS], kvv[MAX_ITEMS], pfv[MAX_ITEMS];
    if (opt & 8) {
        mask_buf = make_mask(in, &mask, (opt & 16) && fz_u8(in) < 64);
        if (mask_buf) c.atten_mask = &mask;
    }
    int64_t n_items = fz_u8(in) % (MAX_ITEMS + 1);
    int64_t aq = 0, ak = 0;
    for (int64_t i = 0; i < n_items; i++) {
        aq = fz_maybe_weird(in, fz_sat_add(aq, fz_u8(in) % 6));
        ak = fz_maybe_weird(in, fz_sat_add(ak, fz_u8(in) % 6));
        qv[i] = aq;
        kvv[i] = ak;
        pfv[i] = fz_maybe_weird(in, fz_u8(in) % 4);
        if (fz_u8(in) < 8) aq = ak = 0; /* reset: a TE-form style leading zero or a trailing 0 */
    }
    if (opt & 32) {
        q = maskpack_tensor_contiguous(qv, MASKPACK_I64, 1, &n_items);
        c.actual_seq_qlen = &q;
    }
    if (opt & 64) {
        kv = maskpack_tensor_contiguous(kvv, MASKPACK_I64, 1, &n_items);
        c.actual_seq_kvlen = &kv;
    }
    if (opt & 128) {
        pf = maskpack_tensor_contiguous(pfv, MASKPACK_I64, 1, &n_items);
        c.prefix = &pf;
    }
    maskpack_layout *intended = NULL;
    if (fz_u8(in) & 1) {
        int64_t lens[MAX_ITEMS];
        size_t n = 1 + fz_u8(in) % 4;
        for (size_t i = 0; i < n; i++) lens[i] = fz_u8(in) % 6;
        maskpack_rule rule = maskpack_rule_default();
        rule.causal = fz_u8(in) & 1;
        maskpack_error e;
        maskpack_layout_from_lengths(lens, n, (maskpack_placement)(fz_u8(in) % 3), 0, &rule, &intended, &e);
        c.intended = intended;
    }
    maskpack_npu_report rep;
    memset(&rep, 0, sizeof rep);
    maskpack_error e;
    maskpack_status s = maskpack_validate_npu_args(&c, &rep, &e);
    check_report(s, &rep, &e);
    maskpack_layout_free(intended);
    free(mask_buf);
}

static void round_trip(fuzz_reader *in) {
    int64_t lens[MAX_ITEMS];
    size_t n = 1 + fz_u8(in) % 5;
    for (size_t i = 0; i < n; i++) lens[i] = fz_u8(in) % 9;
    uint8_t opt = fz_u8(in);
    maskpack_placement place = (maskpack_placement)((opt & 3) % 3);
    maskpack_rule rule = maskpack_rule_default();
    rule.causal = (opt >> 2) & 1;
    if ((opt >> 3) & 1) {
        rule.window_left = fz_u8(in) % 4;
        rule.window_right = rule.causal ? 0 : fz_u8(in) % 4;
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    if (maskpack_layout_from_lengths(lens, n, place, 0, &rule, &L, &e) != MASKPACK_OK) return;
    maskpack_npu_layout lay = place == MASKPACK_PLACE_PACKED ? MASKPACK_NPU_TND
                              : (opt >> 4) & 1               ? MASKPACK_NPU_BNSD
                                                             : MASKPACK_NPU_BSND;
    maskpack_npu_argset a;
    memset(&a, 0, sizeof a);
    maskpack_status s = maskpack_npu_args(L, lay, 0, 64, &a, &e);
    fuzz_check_error(s, &e);
    if (s != MASKPACK_OK) {
        maskpack_layout_free(L);
        return;
    }
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    c.input_layout = a.input_layout;
    c.batch = maskpack_layout_n_rows(L);
    c.q_len = maskpack_layout_q_width(L);
    c.kv_len = maskpack_layout_kv_width(L);
    if (lay == MASKPACK_NPU_TND) c.total_q = c.total_kv = maskpack_layout_q_width(L);
    c.heads_q = c.heads_kv = 1;
    c.head_dim = 64;
    c.sparse_mode = a.sparse_mode;
    c.pre_tokens = a.pre_tokens;
    c.next_tokens = a.next_tokens;
    c.scale = a.scale;
    c.inner_precise = a.inner_precise;
    c.intended = L;
    maskpack_tensor mask, q, kv, pf;
    uint8_t *mask_buf = NULL;
    if (a.mask_kind != MASKPACK_NPU_MASK_NONE) {
        int64_t cells = 1;
        for (int32_t d = 0; d < a.mask_ndim; d++) cells *= a.mask_shape[d];
        mask_buf = malloc((size_t)(cells ? cells : 1));
        FUZZ_ASSERT(mask_buf != NULL, "out of memory for a %lld-cell mask", (long long)cells);
        mask = maskpack_tensor_contiguous(mask_buf, MASKPACK_BOOL, a.mask_ndim, a.mask_shape);
        s = maskpack_npu_atten_mask(L, &a, &mask, &e);
        FUZZ_ASSERT(s == MASKPACK_OK, "npu_atten_mask failed for args npu_args made: %s", e.message);
        c.atten_mask = &mask;
    }
    if (a.actual_seq_qlen) {
        q = maskpack_tensor_contiguous(a.actual_seq_qlen, MASKPACK_I64, 1, &a.n_items);
        kv = maskpack_tensor_contiguous(a.actual_seq_kvlen, MASKPACK_I64, 1, &a.n_items);
        c.actual_seq_qlen = &q;
        c.actual_seq_kvlen = &kv;
    }
    if (a.prefix) {
        pf = maskpack_tensor_contiguous(a.prefix, MASKPACK_I64, 1, &a.n_prefix);
        c.prefix = &pf;
    }
    maskpack_npu_report rep;
    memset(&rep, 0, sizeof rep);
    s = maskpack_validate_npu_args(&c, &rep, &e);
    check_report(s, &rep, &e);
    FUZZ_ASSERT(s == MASKPACK_OK, "maskpack_npu_args' own call fails validation (mode %d, layout %d): %s",
                (int)a.sparse_mode, (int)lay, rep.n_findings ? rep.findings[0].message : e.message);
    free(mask_buf);
    maskpack_npu_argset_release(&a);
    maskpack_layout_free(L);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader in = {data, size};
    if (fz_u8(&in) & 1)
        round_trip(&in);
    else
        hand_built(&in);
    return 0;
}
