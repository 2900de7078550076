/* fuzz_position_ids.c: maskpack_layout_from_position_ids for [T], [B,S] and [3,B,S] (M-RoPE), both
 * boundary rules.
 *
 * Input: [flags][B][S] then values. Structured mode builds rows from runs 0,1,2,... of random lengths
 * (plus an optional zero tail, left-pad style repeats or a continued count), raw mode takes bytes.
 * On success, per row: the uncovered columns are exactly the trailing zeros when there are two or
 * more of them; under STEP consecutive tokens of a segment step by +1 and adjacent segments do not;
 * under RESET a segment other than a row's first starts at the real tokens' minimum and no later
 * token of a segment equals it; a [3,B,S] input gives the layout of its text row. */
#include "fuzz_common.h"

#define MAX_B 3
#define MAX_S 24

static void check_rows(const maskpack_layout *L, const int64_t *pos, int64_t B, int64_t S, maskpack_boundary_rule rule,
                       int packed_input) {
    for (int64_t b = 0; b < B; b++) {
        const int64_t *p = pos + b * S;
        int64_t row = packed_input ? 0 : b;
        int64_t zeros = 0;
        while (zeros < S && p[S - 1 - zeros] == 0) zeros++;
        int64_t real = zeros >= 2 ? S - zeros : S;
        int64_t mn = INT64_MAX;
        for (int64_t s = 0; s < real; s++) mn = p[s] < mn ? p[s] : mn;
        for (int64_t s = 0; s < S; s++) {
            int64_t k = maskpack_segment_of_query(L, row, s);
            FUZZ_ASSERT((k >= 0) == (s < real), "row %lld col %lld: segment %lld, %lld real columns", (long long)b,
                        (long long)s, (long long)k, (long long)real);
            if (s == 0 || s >= real) continue;
            int64_t pk = maskpack_segment_of_query(L, row, s - 1);
            int boundary = pk != k;
            if (rule == MASKPACK_BOUNDARY_STEP)
                FUZZ_ASSERT(boundary == (p[s] - 1 != p[s - 1]), "step rule: row %lld col %lld (%lld after %lld)",
                            (long long)b, (long long)s, (long long)p[s], (long long)p[s - 1]);
            else
                FUZZ_ASSERT(boundary == (p[s] == mn), "reset rule: row %lld col %lld (%lld, minimum %lld)",
                            (long long)b, (long long)s, (long long)p[s], (long long)mn);
        }
    }
}

static int same_segments(const maskpack_layout *a, const maskpack_layout *b) {
    if (maskpack_layout_n_segments(a) != maskpack_layout_n_segments(b)) return 0;
    for (size_t k = 0; k < maskpack_layout_n_segments(a); k++) {
        maskpack_segment x, y;
        maskpack_layout_segment(a, k, &x, NULL);
        maskpack_layout_segment(b, k, &y, NULL);
        if (x.row != y.row || x.q_start != y.q_start || x.q_len != y.q_len) return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader in = {data, size};
    uint8_t flags = fz_u8(&in);
    int rank = 1 + (flags & 3) % 3;
    maskpack_boundary_rule rule = (flags >> 2) & 1 ? MASKPACK_BOUNDARY_STEP : MASKPACK_BOUNDARY_RESET;
    maskpack_dtype dt = (flags >> 3) & 1 ? MASKPACK_I32 : MASKPACK_I64;
    if ((flags >> 4) & 1) dt = (maskpack_dtype)(fz_u8(&in) % MASKPACK_DTYPE_COUNT_);
    int structured = !((flags >> 5) & 1);
    int64_t B = rank == 1 ? 1 : 1 + fz_u8(&in) % MAX_B, S = 1 + fz_u8(&in) % MAX_S;
    int64_t pos[MAX_B * MAX_S];
    for (int64_t b = 0; b < B; b++) {
        int64_t *p = pos + b * S;
        if (structured) {
            int64_t s = 0;
            uint8_t lead = fz_u8(&in);
            if (lead & 1) /* left padding HF style: pads hold 1 */
                for (int64_t k = lead % 5; k > 0 && s < S; k--) p[s++] = 1;
            while (s < S) {
                uint8_t c = fz_u8(&in);
                if (c >= 224) { /* zero tail */
                    while (s < S) p[s++] = 0;
                    break;
                }
                int64_t len = 1 + c % 9, start = (c >> 4) == 13 ? fz_u8(&in) % 5 : 0; /* sometimes a continued count */
                for (int64_t k = 0; k < len && s < S; k++) p[s++] = fz_maybe_weird(&in, start + k);
            }
        } else {
            for (int64_t s = 0; s < S; s++) p[s] = fz_maybe_weird(&in, fz_u8(&in) % 6);
        }
    }
    /* the tensor; [3,B,S] repeats the text row with other rows perturbed (only row 0 may matter) */
    int64_t planes = rank == 3 ? 3 : 1;
    uint8_t raw[3 * MAX_B * MAX_S * 8];
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t t = 0; t < B * S; t++)
            fuzz_put_i64(dt, raw, pl * B * S + t,
                         pl == 0 || pos[t] > INT64_MAX - 3 ? pos[t] : pos[t] + (int64_t)(fz_u8(&in) % 3));
    int64_t shape[3];
    int32_t nd = rank;
    if (rank == 1)
        shape[0] = S;
    else if (rank == 2)
        shape[0] = B, shape[1] = S;
    else
        shape[0] = 3, shape[1] = B, shape[2] = S;
    maskpack_tensor t = maskpack_tensor_contiguous(raw, dt, nd, shape);
    int integral = dt == MASKPACK_I32 || dt == MASKPACK_I64;
    for (int64_t i = 0; integral && i < B * S; i++) { /* what the library sees */
        int64_t idx[3] = {0, i / S, i % S};
        int64_t one[1] = {i};
        pos[i] = rank == 1 ? fuzz_at_i64(&t, one) : rank == 2 ? fuzz_at_i64(&t, idx + 1) : fuzz_at_i64(&t, idx);
    }
    maskpack_rule r = maskpack_rule_default();
    r.causal = (flags >> 6) & 1;
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_status s = maskpack_layout_from_position_ids(&t, rule, &r, &L, &e);
    fuzz_check_error(s, &e);
    if (s != MASKPACK_OK) return 0;
    fuzz_check_layout(L);
    if (rank == 1)
        FUZZ_ASSERT(maskpack_layout_is_packed(L) && maskpack_layout_n_rows(L) == 1 && maskpack_layout_q_width(L) == S,
                    "[T] input must give a packed [T] layout");
    else
        FUZZ_ASSERT(maskpack_layout_n_rows(L) == B && maskpack_layout_q_width(L) == S, "[B,S] grid changed");
    if (integral) {
        for (int64_t i = 0; i < B * S; i++)
            FUZZ_ASSERT(pos[i] >= 0, "negative position %lld accepted", (long long)pos[i]);
        check_rows(L, pos, B, S, rule, rank == 1);
    }
    if (rank == 3) {
        /* M-RoPE: the text row alone decides */
        int64_t s2[2] = {B, S};
        maskpack_tensor text = maskpack_tensor_contiguous(raw, dt, 2, s2);
        maskpack_layout *T = NULL;
        s = maskpack_layout_from_position_ids(&text, rule, &r, &T, &e);
        FUZZ_ASSERT(s == MASKPACK_OK, "text row alone failed: %s", e.message);
        FUZZ_ASSERT(same_segments(L, T), "[3,B,S] and its text row give different layouts");
        maskpack_layout_free(T);
    }
    maskpack_layout_free(L);
    return 0;
}
