/* fuzz_mask2d.c: maskpack_layout_from_mask2d under both conventions.
 *
 * Input: [dtype][B][S][mode] then cell bytes. In "structured" mode (mode bit 0) each row is built
 * from two bytes as pad* token+ pad* (keep) or runs of document ids (doc_id), then a few cells are
 * disturbed, so most inputs are valid or almost valid; otherwise the cell bytes are the mask. On
 * success: one segment per keep-mask row covering exactly its ones, doc-id segments = maximal runs of
 * one id, mask2d reproduces the mask, and the predicate matches the rule exactly. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader in = {data, size};
    maskpack_dtype dt = (maskpack_dtype)(fz_u8(&in) % MASKPACK_DTYPE_COUNT_);
    int64_t B = fz_u8(&in) % 5, S = fz_u8(&in) % 33;
    uint8_t mode = fz_u8(&in);
    int doc = mode & 2, causal = (mode >> 2) & 1;
    int64_t shape[2] = {B, S};
    int64_t cells = B * S;
    double *vals = calloc((size_t)(cells ? cells : 1), sizeof *vals);
    void *buf = calloc((size_t)(cells ? cells : 1), 8);
    if (!vals || !buf) {
        free(vals);
        free(buf);
        return 0;
    }
    if (mode & 1) {
        int64_t next_id = 1;
        for (int64_t b = 0; b < B; b++) {
            int64_t left = fz_u8(&in) % (S + 1), len = fz_u8(&in) % (S - left + 1);
            for (int64_t s = left; s < left + len; s++) {
                if (doc && s > left && fz_u8(&in) % 4 == 0) next_id++; /* a new document */
                vals[b * S + s] = doc ? (double)next_id : 1.0;
            }
            next_id += 1 + (fz_u8(&in) & 1); /* ids may repeat across rows: sometimes reuse */
            if (doc && (fz_u8(&in) & 1)) next_id = 1;
        }
        for (int k = fz_u8(&in) % 3; k > 0 && cells; k--) {
            int64_t at = fz_range(&in, 0, cells - 1);
            vals[at] = (double)fz_maybe_weird(&in, fz_u8(&in) % 3);
        }
    } else {
        for (int64_t t = 0; t < cells; t++) vals[t] = (double)fz_maybe_weird(&in, fz_u8(&in) % (doc ? 4 : 2));
    }
    for (int64_t t = 0; t < cells; t++) fuzz_put(dt, buf, t, vals[t]);
    /* what the cells hold after the dtype conversion */
    maskpack_tensor mask = maskpack_tensor_contiguous(buf, dt, 2, shape);
    maskpack_rule rule = maskpack_rule_default();
    rule.causal = causal;
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_status s =
        maskpack_layout_from_mask2d(&mask, doc ? MASKPACK_MASK2D_DOC_ID : MASKPACK_MASK2D_KEEP, &rule, &L, &e);
    fuzz_check_error(s, &e);
    if (s == MASKPACK_OK) {
        fuzz_check_layout(L);
        FUZZ_ASSERT(maskpack_layout_n_rows(L) == B && maskpack_layout_q_width(L) == S, "grid changed");
        int64_t ones = 0;
        for (int64_t b = 0; b < B; b++) {
            for (int64_t s2 = 0; s2 < S; s2++) {
                int64_t idx[2] = {b, s2};
                double v = fuzz_at_f64(&mask, idx);
                int real = v != 0;
                ones += real;
                int64_t k = maskpack_segment_of_query(L, b, s2);
                FUZZ_ASSERT((k >= 0) == real, "cell (%lld, %lld) = %g but segment %lld", (long long)b, (long long)s2, v,
                            (long long)k);
                if (s2 > 0 && real) {
                    int64_t pidx[2] = {b, s2 - 1};
                    double pv = fuzz_at_f64(&mask, pidx);
                    int64_t pk = maskpack_segment_of_query(L, b, s2 - 1);
                    if (pv != 0) {
                        /* keep: one run per row; doc_id: a new segment exactly where the id changes */
                        int same = doc ? pv == v : 1;
                        FUZZ_ASSERT((pk == k) == same, "row %lld col %lld: ids %g/%g, segments %lld/%lld", (long long)b,
                                    (long long)s2, pv, v, (long long)pk, (long long)k);
                    }
                }
            }
            if (!doc) {
                /* keep masks: at most one sequence per row */
                int64_t first = -1;
                for (int64_t s2 = 0; s2 < S; s2++) {
                    int64_t k = maskpack_segment_of_query(L, b, s2);
                    if (k < 0) continue;
                    if (first < 0) first = k;
                    FUZZ_ASSERT(k == first, "keep-mask row %lld has several segments", (long long)b);
                }
            }
        }
        FUZZ_ASSERT(ones == maskpack_layout_n_tokens(L), "%lld nonzero cells, %lld tokens", (long long)ones,
                    (long long)maskpack_layout_n_tokens(L));
        /* the predicate is exactly "same segment (and j <= i when causal)" */
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < S; i++) {
                int64_t ki = maskpack_segment_of_query(L, b, i);
                for (int64_t j = 0; j < S; j++) {
                    int want = ki >= 0 && ki == maskpack_segment_of_query(L, b, j) && (!causal || j <= i);
                    FUZZ_ASSERT(maskpack_allowed(L, b, 0, i, j) == want, "allowed(%lld, %lld, %lld) != %d",
                                (long long)b, (long long)i, (long long)j, want);
                }
            }
        /* the derived 2D keep mask reproduces the input's nonzero cells */
        uint8_t *out = malloc((size_t)(cells ? cells : 1));
        if (out) {
            maskpack_tensor o = maskpack_tensor_contiguous(out, MASKPACK_U8, 2, shape);
            if (maskpack_layout_is_packed(L)) o = maskpack_tensor_contiguous(out, MASKPACK_U8, 1, &shape[1]);
            s = maskpack_mask2d(L, &o, &e);
            FUZZ_ASSERT(s == MASKPACK_OK, "mask2d failed: %s", e.message);
            for (int64_t t = 0; t < cells; t++) {
                int64_t idx[2] = {t / S, t % S};
                FUZZ_ASSERT(out[t] == (fuzz_at_f64(&mask, idx) != 0), "mask2d cell %lld", (long long)t);
            }
            free(out);
        }
        maskpack_layout_free(L);
    }
    free(vals);
    free(buf);
    return 0;
}
