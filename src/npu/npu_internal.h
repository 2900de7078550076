/* npu_internal.h: what the npu_fusion_attention emitter (npu_args.c) and the contract checker
 * (npu_validate.c) share, so that the two can never disagree about what a sparse_mode computes or
 * how a packed layout is cut into TND items. Never installed; the C tests include it directly. */
#ifndef MASKPACK_NPU_INTERNAL_H
#define MASKPACK_NPU_INTERNAL_H

#include "internal.h"

/* The operator's "unbounded" pre_tokens / next_tokens (its own default). */
#define MP_NPU_INF INT64_C(2147483647)
/* Side of the compressed masks (sparse modes 2/3/4/6/7/8); mode 6 adds MP_NPU_PREFIX_ROWS rows. */
#define MP_NPU_COMPRESSED  2048
#define MP_NPU_PREFIX_ROWS 1024
/* Item limits of the varlen (TND) path: 2048 items, 1024 when prefix is passed; prefix modes
 * with B*S layouts take at most 32 batches; head_dim at most 768. */
#define MP_NPU_MAX_ITEMS_PREFIX 1024
#define MP_NPU_MAX_PREFIX_BATCH 32
#define MP_NPU_MAX_HEAD_DIM     768

/* Index of the item that sparse_mode 7 (last item with sq > 0 and skv > 0) or 8 (first such item)
 * computes as a band; -1 for other modes or when every item is empty. */
int64_t mp_npu_band_item(int32_t mode, const int64_t *sq, const int64_t *skv, int64_t n);

/* The keys [*lo, *hi) (clipped to [0, skv)) that local query row i of one item (sq x skv) may see
 * under a sparse mode's geometric rule, ignoring any full atten_mask (i = query row, j = key):
 *   0: top-left band -pre <= j - i <= next (the caller applies the mask; without a mask the
 *      operator ignores pre/next and the caller uses [0, skv) instead)
 *   1, 5: every key (the full mask decides)
 *   2: j <= i                       3: j <= i + skv - sq
 *   4: -pre <= (j - i) - (skv - sq) <= next
 *   6: mode 3, or j < prefix        7: mode 3, or mode 4 when band != 0
 *   8: mode 2, or mode 4 when band != 0
 * Every one of them is a single interval. pre/next are saturated, never overflow. */
void mp_npu_key_range(int32_t mode, int64_t pre, int64_t next, int64_t sq, int64_t skv, int64_t prefix, int band,
                      int64_t i, int64_t *lo, int64_t *hi);

/* A packed layout cut into TND items: every segment is one item (empty segments are zero-length
 * items) and every run of filler columns between segments, before the first or after the last one
 * becomes one declared pad item (q side and kv side of a gap coalesced into one item), so that the
 * cumulative ends cover the whole token stream. */
typedef struct mp_npu_items {
    int64_t n;
    int64_t *q_len, *kv_len; /* [n] */
    int64_t *segment;        /* [n] segment index of the item, -1 for a pad item */
} mp_npu_items;

/* (packed layout) -> items (allocated; release with mp_npu_items_free). */
maskpack_status mp_npu_tnd_items(const maskpack_layout *L, mp_npu_items *out, maskpack_error *err);
void mp_npu_items_free(mp_npu_items *it);

/* (layout) -> 1 and the band mode 4 pre/next that express its rule when no spans or prefix are
 * involved and every segment's diagonal sits at the same offset from the bottom-right one; else 0. */
int mp_npu_layout_band(const maskpack_layout *L, int64_t *pre, int64_t *next);

#endif
