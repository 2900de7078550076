/* fuzz_mask4d.c: maskpack_layout_from_mask4d and maskpack_mask2d_from_mask4d on small masks.
 *
 * Input: [flags][dtype][fill][B][H][S] then bytes. Structured mode draws a layout (documents, padding,
 * causal or not, sometimes a window) and writes its mask in the chosen convention (pad query rows
 * either see nothing or, like ms-swift, the row's valid keys), then maybe disturbs a few cells; raw
 * mode takes the cells from the bytes. On success the recovered layout's predicate equals the mask
 * on every real query row, head and key; mask2d_from_mask4d marks exactly the keys some query
 * attends. A mask written from a layout without window or spans must always be recovered. */
#include "fuzz_common.h"

#define MAX_B 2
#define MAX_H 2
#define MAX_S 10

/* 1 attend, 0 excluded, -1 neither (a value the convention does not define) */
static int attends(maskpack_mask_convention conv, double v) {
    if (isnan(v)) return -1;
    if (conv == MASKPACK_MASK_ADDITIVE) return v == 0 ? 1 : v < 0 ? 0 : -1;
    if (v != 0 && v != 1) return -1;
    return conv == MASKPACK_MASK_KEEP ? v == 1 : v == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader in = {data, size};
    uint8_t flags = fz_u8(&in);
    maskpack_mask_convention conv = (maskpack_mask_convention)((flags & 3) % 3);
    maskpack_dtype dt = (maskpack_dtype)(fz_u8(&in) % MASKPACK_DTYPE_COUNT_);
    int fill_kind = fz_u8(&in) % 3;
    int64_t B = 1 + fz_u8(&in) % MAX_B, H = 1 + fz_u8(&in) % MAX_H, S = 1 + fz_u8(&in) % MAX_S;
    int structured = !((flags >> 2) & 1);
    int64_t cells = B * H * S * S;
    double *vals = calloc((size_t)cells, sizeof *vals);
    uint8_t *buf = calloc((size_t)cells, 8);
    if (!vals || !buf) {
        free(vals);
        free(buf);
        return 0;
    }
    double fills[3] = {-INFINITY, -10000.0, dt == MASKPACK_F16 ? -65504.0 : -3.0e38};
    double fill = fills[fill_kind];
    int must_recover = 0, flips = 0;
    if (structured) {
        /* a reference layout: per row a left pad, documents, a right pad */
        maskpack_segment segs[MAX_B * MAX_S];
        size_t n = 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t s = fz_u8(&in) % 3 == 0 ? fz_u8(&in) % S : 0;
            while (s < S) {
                uint8_t c = fz_u8(&in);
                if (c >= 200) break; /* right pad from here */
                int64_t len = 1 + c % (S - s);
                memset(&segs[n], 0, sizeof segs[n]);
                segs[n].row = b;
                segs[n].q_start = segs[n].kv_start = s;
                segs[n].q_len = segs[n].kv_len = len;
                n++;
                s += len;
            }
        }
        maskpack_rule rule = maskpack_rule_default();
        rule.causal = (flags >> 5) & 1;
        int windowed = (flags >> 6) & 1;
        if (windowed) {
            rule.window_left = fz_u8(&in) % 4;
            rule.window_right = rule.causal ? 0 : fz_u8(&in) % 4;
        }
        maskpack_layout *ref = NULL;
        maskpack_error e;
        if (maskpack_layout_from_segments(segs, n, B, S, S, 0, &rule, &ref, &e) != MASKPACK_OK) {
            free(vals);
            free(buf);
            return 0;
        }
        int pad_rows_see = (flags >> 7) & 1;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < S; i++)
                    for (int64_t j = 0; j < S; j++) {
                        int a = maskpack_allowed(ref, b, h, i, j);
                        if (pad_rows_see && maskpack_segment_of_query(ref, b, i) < 0)
                            a = maskpack_segment_of_query(ref, b, j) >= 0;
                        double v = conv == MASKPACK_MASK_KEEP     ? a
                                   : conv == MASKPACK_MASK_MASKED ? !a
                                                                  : (a ? 0.0 : fill);
                        vals[((b * H + h) * S + i) * S + j] = v;
                    }
        maskpack_layout_free(ref);
        flips = fz_u8(&in) % 4 == 0 ? 1 + fz_u8(&in) % 2 : 0;
        for (int k = 0; k < flips; k++) {
            int64_t at = fz_range(&in, 0, cells - 1);
            vals[at] = conv == MASKPACK_MASK_ADDITIVE ? (vals[at] == 0 ? fill : 0.0) : 1.0 - vals[at];
        }
        must_recover = !windowed && flips == 0;
    } else {
        for (int64_t t = 0; t < cells; t++) {
            int bit = fz_u8(&in) & 1;
            vals[t] = conv == MASKPACK_MASK_ADDITIVE ? (bit ? 0.0 : fill) : bit;
            if (fz_u8(&in) == 255) vals[t] = (double)fz_maybe_weird(&in, 2); /* a stray value */
        }
    }
    for (int64_t t = 0; t < cells; t++) fuzz_put(dt, buf, t, vals[t]);
    int64_t shape4[4] = {B, (flags >> 4) & 1 ? 1 : H, S, S};
    if (shape4[1] == 1 && H > 1) {
        /* [B,1,S,S]: keep only head 0's cells */
        for (int64_t b = 0; b < B; b++)
            memmove(buf + (size_t)(b * S * S) * maskpack_dtype_size(dt),
                    buf + (size_t)(b * H * S * S) * maskpack_dtype_size(dt), (size_t)(S * S) * maskpack_dtype_size(dt));
        H = 1;
    }
    maskpack_tensor mask = maskpack_tensor_contiguous(buf, dt, 4, shape4);
    int clean = 1;
    for (int64_t t = 0; t < B * H * S * S; t++) {
        int64_t idx[4] = {t / (H * S * S), (t / (S * S)) % H, (t / S) % S, t % S};
        if (attends(conv, fuzz_at_f64(&mask, idx)) < 0) clean = 0;
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_status s = maskpack_layout_from_mask4d(&mask, conv, &L, &e);
    fuzz_check_error(s, &e);
    int dtype_ok = conv == MASKPACK_MASK_ADDITIVE
                       ? (dt == MASKPACK_F16 || dt == MASKPACK_BF16 || dt == MASKPACK_F32 || dt == MASKPACK_F64)
                       : (dt == MASKPACK_BOOL || dt == MASKPACK_U8);
    if (must_recover && clean && dtype_ok)
        FUZZ_ASSERT(s == MASKPACK_OK, "a mask written from a layout was not recovered: %s: %s", maskpack_status_name(s),
                    e.message);
    if (s == MASKPACK_OK) {
        fuzz_check_layout(L);
        FUZZ_ASSERT(maskpack_layout_n_rows(L) == B && maskpack_layout_q_width(L) == S, "grid changed");
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < S; i++) {
                if (maskpack_segment_of_query(L, b, i) < 0) continue; /* pad query rows are ignored */
                for (int64_t h = 0; h < H; h++)
                    for (int64_t j = 0; j < S; j++) {
                        int64_t idx[4] = {b, h, i, j};
                        int a = attends(conv, fuzz_at_f64(&mask, idx));
                        if (a < 0) continue;
                        FUZZ_ASSERT(maskpack_allowed(L, b, h, i, j) == a, "allowed(%lld,%lld,%lld,%lld) != mask %d",
                                    (long long)b, (long long)h, (long long)i, (long long)j, a);
                    }
            }
        maskpack_layout_free(L);
    }
    /* the 2D keep mask of the 4D mask */
    uint8_t out[MAX_B * MAX_S];
    int64_t s2[2] = {B, S};
    maskpack_tensor o = maskpack_tensor_contiguous(out, MASKPACK_U8, 2, s2);
    s = maskpack_mask2d_from_mask4d(&mask, conv, &o, &e);
    fuzz_check_error(s, &e);
    if (s == MASKPACK_OK && clean)
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < S; j++) {
                int any = 0;
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < S; i++) {
                        int64_t idx[4] = {b, h, i, j};
                        any |= attends(conv, fuzz_at_f64(&mask, idx)) == 1;
                    }
                FUZZ_ASSERT(out[b * S + j] == any, "mask2d_from_mask4d[%lld][%lld] = %d, some query attends: %d",
                            (long long)b, (long long)j, out[b * S + j], any);
            }
    free(vals);
    free(buf);
    return 0;
}
