/* cp_internal.h: what the context-parallel shard (cp_shard.c) shares with the CP outputs of
 * src/derive/cp_outputs.c (internal, never installed): which columns each rank holds. */
#ifndef MASKPACK_CP_INTERNAL_H
#define MASKPACK_CP_INTERNAL_H

#include "internal.h"

/* Slot k of a packed layout: from its segment's first column (column 0 for the first segment) to the
 * next segment's first column (the stream end for the last). Matches maskpack_cu_seqlens_padded. */
static inline int64_t mp_cp_slot_start(const maskpack_layout *L, size_t k) { return k == 0 ? 0 : L->segs[k].q_start; }
static inline int64_t mp_cp_slot_end(const maskpack_layout *L, size_t k) {
    return k + 1 < L->n_segments ? L->segs[k + 1].q_start : L->q_width;
}

/* One column range of one row that a rank holds, in the rank's local order. */
typedef struct mp_cp_range {
    int64_t row, start, len;
} mp_cp_range;

/* (layout, cp, rank, *scheme) -> *out[*n_out] the ranges rank holds (caller frees *out). Checks that
 * the layout is unsharded self-attention (mp_cp_require_self), validates cp, rank, scheme and the
 * divisibility of every slot (packed zigzag) or row; one rank is the identity, so *scheme becomes
 * CONTIGUOUS for cp = 1 (the scheme the caller then uses). */
maskpack_status mp_cp_rank_ranges(const maskpack_layout *L, int64_t cp, int64_t rank, maskpack_cp_scheme *scheme,
                                  mp_cp_range **out, size_t *n_out, maskpack_error *err);

/* (layout) -> OK iff every segment is an unsharded self-attention segment (what CP splits), else
 * MASKPACK_ERR_UNSUPPORTED naming the first that is not. */
maskpack_status mp_cp_require_self(const maskpack_layout *L, maskpack_error *err);

#endif
