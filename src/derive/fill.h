/* fill.h: run writers and output-view helpers shared by the derive sources (private to src/derive).
 * Every derived output is written as runs of one value (masks, ids) or arithmetic progressions
 * (position ids, token indices); writing whole runs with memset or a tight typed loop is what
 * lets the compiler vectorise and makes the outputs as fast as a memcpy of the same bytes. */
#ifndef MASKPACK_DERIVE_FILL_H
#define MASKPACK_DERIVE_FILL_H

#include "internal.h"

#include <string.h>

/* Bit pattern of the value 1 (or 1.0) in dtype d, in its low maskpack_dtype_size(d) bytes. */
static inline uint64_t mpd_one_bits(maskpack_dtype d) {
    switch (d) {
    case MASKPACK_F16: return 0x3c00u;
    case MASKPACK_BF16: return 0x3f80u;
    case MASKPACK_F32: return 0x3f800000u;
    case MASKPACK_F64: return 0x3ff0000000000000ull;
    default: return 1u;
    }
}

/* Bit pattern of the integer v in an integer dtype (two's complement, truncated to the size). */
static inline uint64_t mpd_int_bits(int64_t v) { return (uint64_t)v; }

/* 1 when every byte of the esize-byte pattern is equal (so memset can write it). */
static inline int mpd_bytes_equal(uint64_t pat, size_t esize) {
    uint8_t b0 = (uint8_t)(pat & 0xffu);
    for (size_t i = 1; i < esize; i++)
        if ((uint8_t)((pat >> (8 * i)) & 0xffu) != b0) return 0;
    return 1;
}

/* Writes n copies of the esize-byte pattern `pat` at element offsets off, off+stride, ... of base. */
static inline void mpd_fill(void *base, int64_t off, int64_t stride, int64_t n, size_t esize, uint64_t pat) {
    if (n <= 0) return;
    if (stride == 1) {
        if (mpd_bytes_equal(pat, esize)) {
            memset((char *)base + off * (int64_t)esize, (int)(pat & 0xffu), (size_t)n * esize);
            return;
        }
        switch (esize) {
        case 2: {
            uint16_t *p = (uint16_t *)base + off, v = (uint16_t)pat;
            for (int64_t j = 0; j < n; j++) p[j] = v;
            return;
        }
        case 4: {
            uint32_t *p = (uint32_t *)base + off, v = (uint32_t)pat;
            for (int64_t j = 0; j < n; j++) p[j] = v;
            return;
        }
        default: {
            uint64_t *p = (uint64_t *)base + off;
            for (int64_t j = 0; j < n; j++) p[j] = pat;
            return;
        }
        }
    }
    switch (esize) {
    case 1: {
        uint8_t *p = (uint8_t *)base + off, v = (uint8_t)pat;
        for (int64_t j = 0; j < n; j++) p[j * stride] = v;
        return;
    }
    case 2: {
        uint16_t *p = (uint16_t *)base + off, v = (uint16_t)pat;
        for (int64_t j = 0; j < n; j++) p[j * stride] = v;
        return;
    }
    case 4: {
        uint32_t *p = (uint32_t *)base + off, v = (uint32_t)pat;
        for (int64_t j = 0; j < n; j++) p[j * stride] = v;
        return;
    }
    default: {
        uint64_t *p = (uint64_t *)base + off;
        for (int64_t j = 0; j < n; j++) p[j * stride] = pat;
        return;
    }
    }
}

/* Writes start, start+1, ..., start+n-1 into an int32 (esize 4) or int64 (esize 8) run. The caller
 * has checked that the values fit. */
static inline void mpd_iota(void *base, int64_t off, int64_t stride, int64_t n, size_t esize, int64_t start) {
    if (n <= 0) return;
    if (esize == 8) {
        int64_t *p = (int64_t *)base + off;
        if (stride == 1)
            for (int64_t j = 0; j < n; j++) p[j] = start + j;
        else
            for (int64_t j = 0; j < n; j++) p[j * stride] = start + j;
    } else {
        int32_t *p = (int32_t *)base + off;
        uint32_t v = (uint32_t)start; /* unsigned: the increment after the last value cannot overflow */
        if (stride == 1)
            for (int64_t j = 0; j < n; j++) p[j] = (int32_t)(v + (uint32_t)j);
        else
            for (int64_t j = 0; j < n; j++) p[j * stride] = (int32_t)(start + j);
    }
}

/* Rejects an output view whose farthest element (in bytes, from the data pointer, with arbitrary
 * strides) does not fit int64: offsets are computed in int64 and must not wrap. */
static inline maskpack_status mpd_check_extent(const maskpack_tensor *t, const char *name, maskpack_error *err) {
    int64_t reach = 0;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return MASKPACK_OK; /* nothing is ever written */
        int64_t s = t->strides[d], a, step;
        if (s == INT64_MIN || mp_mul_overflow(t->shape[d] - 1, s < 0 ? -s : s, &step) ||
            mp_add_overflow(reach, step, &a))
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, d, -1,
                           "%s: stride %lld of dimension %d reaches beyond the int64 offset range", name, (long long)s,
                           (int)d);
        reach = a;
    }
    int64_t bytes;
    if (mp_mul_overflow(reach, (int64_t)maskpack_dtype_size(t->dtype), &bytes))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, -1, -1, "%s: byte extent overflows int64", name);
    return MASKPACK_OK;
}

/* A per-token output ([T] or [B,S]) seen as rows: element (r, c) sits at r*rs + c*cs. */
typedef struct mpd_rows {
    void *data;
    size_t esize;
    int64_t rs, cs;
} mpd_rows;

static inline mpd_rows mpd_token_rows(const maskpack_tensor *t) {
    mpd_rows v;
    v.data = t->data;
    v.esize = maskpack_dtype_size(t->dtype);
    if (t->ndim == 1) {
        v.rs = 0; /* a packed layout has one row */
        v.cs = t->strides[0];
    } else {
        v.rs = t->strides[0];
        v.cs = t->strides[1];
    }
    return v;
}

/* First span of segment k (index into L->spans) whose end is after span position `pos` (key
 * coordinates, see mp_span_pos), or the segment's span end: the starting cursor of
 * mpd_row_intervals for rows at positions >= pos. */
static inline size_t mpd_span_cursor(const maskpack_layout *L, size_t k, int64_t pos) {
    size_t lo = L->span_begin[k], hi = L->span_begin[k + 1];
    while (lo < hi) {
        size_t m = lo + (hi - lo) / 2;
        if (L->spans[m].end <= pos)
            lo = m + 1;
        else
            hi = m;
    }
    return lo;
}

/* Sorted, merged allowed key intervals (absolute key columns) of local query row i of segment k.
 * *span_cursor walks the segment's spans as i increases (spans are matched by the row's span
 * position, q_pos + i for explicit-position segments). Returns the interval count (<= 3). */
static inline int mpd_row_intervals(const maskpack_layout *L, size_t k, int64_t i, size_t *span_cursor,
                                    int64_t iv[3][2]) {
    int64_t tmp[3][2];
    int n = 0;
    int64_t lo, hi;
    mp_base_key_range(L, k, i, &lo, &hi);
    if (lo < hi) {
        tmp[n][0] = lo;
        tmp[n++][1] = hi;
    }
    if (L->prefix && L->prefix[k] > 0) {
        tmp[n][0] = 0;
        tmp[n++][1] = L->prefix[k];
    }
    size_t t = *span_cursor, tend = L->span_begin[k + 1];
    if (t < tend) {
        int64_t pos = mp_span_pos(L, k, i);
        while (t < tend && L->spans[t].end <= pos) t++;
        *span_cursor = t;
    }
    if (t < tend && L->spans[t].start <= mp_span_pos(L, k, i)) {
        tmp[n][0] = L->spans[t].start;
        tmp[n++][1] = L->spans[t].end;
    }
    /* insertion sort by start, then merge overlapping or touching intervals */
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && tmp[b][0] < tmp[b - 1][0]; b--) {
            int64_t x0 = tmp[b][0], x1 = tmp[b][1];
            tmp[b][0] = tmp[b - 1][0];
            tmp[b][1] = tmp[b - 1][1];
            tmp[b - 1][0] = x0;
            tmp[b - 1][1] = x1;
        }
    int m = 0;
    int64_t base = L->segs[k].kv_start;
    for (int a = 0; a < n; a++) {
        if (m > 0 && tmp[a][0] <= iv[m - 1][1] - base) {
            if (tmp[a][1] + base > iv[m - 1][1]) iv[m - 1][1] = tmp[a][1] + base;
        } else {
            iv[m][0] = tmp[a][0] + base;
            iv[m++][1] = tmp[a][1] + base;
        }
    }
    return m;
}

#endif
