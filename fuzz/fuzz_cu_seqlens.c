/* fuzz_cu_seqlens.c: maskpack_layout_from_cu_seqlens, TE and NPU forms, with and without
 * cu_seqlens_padded.
 *
 * Input: [flags][N][total mode] then per-entry bytes. Entries are built as running sums of small
 * deltas (so most lists are sorted), with rare hostile values; cu_padded adds filler after each
 * sequence. On success: a packed single-row layout with one segment per entry whose lengths are the
 * differences, placed at cu (or cu_padded) offsets, and the derived cu_seqlens round-trip. */
#include "fuzz_common.h"

#define MAX_N 24

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader in = {data, size};
    uint8_t flags = fz_u8(&in);
    maskpack_cu_form form = (flags & 1) ? MASKPACK_CU_NPU : MASKPACK_CU_TE;
    maskpack_dtype dt = (flags & 2) ? MASKPACK_I64 : MASKPACK_I32;
    int with_padded = (flags >> 2) & 1;
    if ((flags >> 3) & 1) dt = (maskpack_dtype)(fz_u8(&in) % MASKPACK_DTYPE_COUNT_); /* sometimes a wrong dtype */
    int64_t N = fz_u8(&in) % (MAX_N + 1);                                            /* sequences */
    uint8_t total_mode = fz_u8(&in);
    int64_t cu[MAX_N + 1], pad[MAX_N + 1];
    cu[0] = fz_maybe_weird(&in, 0);
    pad[0] = fz_maybe_weird(&in, 0);
    for (int64_t k = 1; k <= N; k++) {
        int64_t len = fz_u8(&in) % 8, fill = fz_u8(&in) % 4;
        cu[k] = fz_maybe_weird(&in, fz_sat_add(cu[k - 1], len));
        pad[k] = fz_maybe_weird(&in, fz_sat_add(pad[k - 1], len + fill));
    }
    /* TE: [cu0, ..., cuN] (N+1 entries); NPU: [cu1, ..., cuN] (N entries, the leading 0 implied) */
    int64_t n_entries = form == MASKPACK_CU_TE ? N + 1 : N;
    const int64_t *entries = form == MASKPACK_CU_TE ? cu : cu + 1;
    int64_t buf64[MAX_N + 1], pbuf64[MAX_N + 1];
    for (int64_t k = 0; k < n_entries; k++) buf64[k] = entries[k];
    for (int64_t k = 0; k <= N; k++) pbuf64[k] = pad[k];
    uint8_t raw[(MAX_N + 1) * 8], praw[(MAX_N + 1) * 8];
    for (int64_t k = 0; k < n_entries; k++) fuzz_put_i64(dt, raw, k, buf64[k]);
    for (int64_t k = 0; k <= N; k++) fuzz_put_i64(MASKPACK_I64, praw, k, pbuf64[k]);
    maskpack_tensor t = maskpack_tensor_contiguous(raw, dt, 1, &n_entries);
    int64_t np1 = N + 1;
    maskpack_tensor pt = maskpack_tensor_contiguous(praw, MASKPACK_I64, 1, &np1);
    /* the values the library sees (a narrow dtype wraps) */
    int integral = dt == MASKPACK_I32 || dt == MASKPACK_I64;
    for (int64_t k = 0; integral && k < n_entries; k++) {
        int64_t v = fuzz_at_i64(&t, &k);
        if (form == MASKPACK_CU_TE)
            cu[k] = v;
        else
            cu[k + 1] = v;
    }
    if (form == MASKPACK_CU_NPU) cu[0] = 0;
    int64_t last = N ? cu[N] : 0, plast = pad[N];
    int64_t end = with_padded ? plast : last;
    int64_t total = total_mode < 128   ? 0
                    : total_mode < 200 ? (end <= INT64_MAX - 8 ? end + (total_mode & 7) : end)
                                       : fz_maybe_weird(&in, (int64_t)(total_mode & 15));
    maskpack_rule rule = maskpack_rule_default();
    rule.causal = (flags >> 4) & 1;
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_status s = maskpack_layout_from_cu_seqlens(&t, form, total, with_padded ? &pt : NULL, &rule, &L, &e);
    fuzz_check_error(s, &e);
    if (s != MASKPACK_OK) return 0;
    fuzz_check_layout(L);
    if (!integral) {
        maskpack_layout_free(L);
        return 0;
    }
    FUZZ_ASSERT(maskpack_layout_is_packed(L) && maskpack_layout_n_rows(L) == 1, "not a packed layout");
    FUZZ_ASSERT((int64_t)maskpack_layout_n_segments(L) == N, "%zu segments from %lld sequences",
                maskpack_layout_n_segments(L), (long long)N);
    int64_t W = maskpack_layout_q_width(L);
    if (total > 0) FUZZ_ASSERT(W == total, "width %lld, total %lld", (long long)W, (long long)total);
    int zero_based = form == MASKPACK_CU_NPU || cu[0] == 0;
    for (int64_t k = 0; k < N; k++) {
        maskpack_segment g;
        maskpack_layout_segment(L, (size_t)k, &g, NULL);
        int64_t prev = form == MASKPACK_CU_NPU && k == 0 ? 0 : cu[k];
        FUZZ_ASSERT(g.q_len == cu[k + 1] - prev, "segment %lld length %lld, cu difference %lld", (long long)k,
                    (long long)g.q_len, (long long)(cu[k + 1] - prev));
        if (with_padded)
            FUZZ_ASSERT(g.q_start == pad[k], "segment %lld starts at %lld, cu_padded says %lld", (long long)k,
                        (long long)g.q_start, (long long)pad[k]);
        else if (zero_based)
            FUZZ_ASSERT(g.q_start == prev, "segment %lld starts at %lld, cu says %lld", (long long)k,
                        (long long)g.q_start, (long long)prev);
    }
    if (!with_padded && zero_based) {
        /* the derived list in the same form is the input */
        int64_t back[MAX_N + 1];
        maskpack_tensor bt = maskpack_tensor_contiguous(back, MASKPACK_I64, 1, &n_entries);
        s = maskpack_cu_seqlens(L, form, 0, &bt, &e);
        FUZZ_ASSERT(s == MASKPACK_OK, "cu_seqlens of a layout built from cu_seqlens failed: %s", e.message);
        for (int64_t k = 0; k < n_entries; k++)
            FUZZ_ASSERT(back[k] == entries[k], "cu_seqlens[%lld] = %lld, input %lld", (long long)k, (long long)back[k],
                        (long long)entries[k]);
    }
    maskpack_layout_free(L);
    return 0;
}
