/* from_lengths.c: a layout from a list of sequence lengths and a placement (padded rows, one packed
 * THD row, or packed rows of a fixed capacity). */
#include "internal.h"

#include <stdlib.h>

/* A self-attention segment (kv == q); the remaining fields (flags, q_pos, origin) stay zero. */
static maskpack_segment self_seg(int64_t row, int64_t start, int64_t len) {
    return (maskpack_segment){.row = row, .q_start = start, .q_len = len, .kv_start = start, .kv_len = len};
}

maskpack_status maskpack_layout_from_lengths(const int64_t *lengths, size_t n, maskpack_placement placement,
                                             int64_t capacity, const maskpack_rule *rule, maskpack_layout **out,
                                             maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    if (n > 0) MP_CHECK_NULL(err, lengths, "lengths");
    if (placement != MASKPACK_PLACE_RIGHT && placement != MASKPACK_PLACE_LEFT && placement != MASKPACK_PLACE_PACKED)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "placement", -1, -1,
                       "placement: expected RIGHT (0), LEFT (1) or PACKED (2), found %d", (int)placement);
    if (capacity < 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "capacity", -1, -1,
                       "capacity: expected >= 0 (0 = no fixed row width), found %lld", (long long)capacity);
    /* n becomes a row count (RIGHT/LEFT) and an allocation size: both must fit */
    if ((uint64_t)n > (uint64_t)INT64_MAX || n > SIZE_MAX / sizeof(maskpack_segment))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "lengths", -1, -1, "lengths: %zu entries is too many", n);

    /* Validation pass: every length, the grid it implies, and (packed rows) the capacity. Nothing is
     * allocated until the whole input is known to be good. */
    int64_t max_len = 0, sum = 0;
    for (size_t k = 0; k < n; k++) {
        int64_t len = lengths[k];
        if (len < 0)
            return mp_fail(err, MASKPACK_ERR_VALUE, "lengths", (int64_t)k, -1,
                           "lengths[%zu]: expected >= 0, found %lld", k, (long long)len);
        if (placement == MASKPACK_PLACE_PACKED && capacity > 0 && len > capacity)
            return mp_fail(err, MASKPACK_ERR_VALUE, "lengths", (int64_t)k, -1,
                           "lengths[%zu]: expected <= capacity %lld (a sequence cannot span two packed rows), found "
                           "%lld",
                           k, (long long)capacity, (long long)len);
        if (len > max_len) max_len = len;
        if (mp_add_overflow(sum, len, &sum))
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, "lengths", (int64_t)k, -1,
                           "lengths: the sum of lengths overflows int64 at index %zu", k);
    }

    maskpack_segment *segs = mp_alloc_array(n, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "lengths", -1, -1, "out of memory");

    int64_t n_rows, width;
    int packed = 0;
    if (placement == MASKPACK_PLACE_PACKED && capacity == 0) {
        /* one THD stream: segments back to back */
        int64_t off = 0;
        for (size_t k = 0; k < n; k++) {
            segs[k] = self_seg(0, off, lengths[k]);
            off += lengths[k];
        }
        n_rows = 1;
        width = sum;
        packed = 1;
    } else if (placement == MASKPACK_PLACE_PACKED) {
        /* next-fit: keep filling the current row; open a new one when the next sequence does not fit.
         * An empty sequence always fits, so it stays at the current offset (possibly the row's end). */
        int64_t row = 0, off = 0;
        for (size_t k = 0; k < n; k++) {
            int64_t len = lengths[k];
            if (off + len > capacity) { /* off <= capacity and len <= capacity: no overflow */
                row++;
                off = 0;
            }
            segs[k] = self_seg(row, off, len);
            off += len;
        }
        n_rows = n ? row + 1 : 0;
        width = capacity;
    } else {
        /* one sequence per row; the row width is the longest sequence or the requested capacity */
        width = capacity > max_len ? capacity : max_len;
        for (size_t k = 0; k < n; k++) {
            int64_t len = lengths[k];
            int64_t start = placement == MASKPACK_PLACE_LEFT ? width - len : 0;
            segs[k] = self_seg((int64_t)k, start, len);
        }
        n_rows = (int64_t)n;
    }
    return mp_layout_build(segs, n, n_rows, width, width, packed, rule, out, err);
}
