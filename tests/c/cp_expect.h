/* cp_expect.h: a rank's context-parallel token indices computed by the tests from the schemes'
 * definitions, independently of the library (whose shards and shard indices share one code path). */
#ifndef MASKPACK_TEST_CP_EXPECT_H
#define MASKPACK_TEST_CP_EXPECT_H

#include <maskpack.h>

/* The rank's token indices from the scheme's definition, written here (not through the library's
 * rank ranges): contiguous cuts each row (or the packed stream) into cp chunks and rank r takes chunk
 * r; zigzag cuts each row, or each slot of a packed stream (a sequence and the padding up to the next
 * one, as cu_seqlens_padded: the first starts at 0), into 2 cp chunks and rank r takes chunks r and
 * 2 cp - 1 - r, in that order, slot after slot; at cp = 1 both are the identity. -> number written. */
static inline int64_t expected_indices(const maskpack_layout *L, int64_t cp, int64_t rank, maskpack_cp_scheme scheme,
                                       int64_t *out) {
    int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L), n = 0;
    if (cp == 1) { /* both schemes are the identity at cp = 1 (nothing must divide) */
        for (int64_t t = 0; t < B * S; t++) out[n++] = t;
        return n;
    }
    size_t ns = maskpack_layout_n_segments(L);
    if (maskpack_layout_is_packed(L) && scheme == MASKPACK_CP_ZIGZAG) {
        for (size_t k = 0; k < (ns ? ns : 1); k++) {
            maskpack_segment g, next;
            maskpack_error e;
            int64_t a = 0, z = S;
            if (ns && k > 0 && maskpack_layout_segment(L, k, &g, &e) == MASKPACK_OK) a = g.q_start;
            if (k + 1 < ns && maskpack_layout_segment(L, k + 1, &next, &e) == MASKPACK_OK) z = next.q_start;
            int64_t c = (z - a) / (2 * cp);
            for (int64_t t = 0; t < c; t++) out[n++] = a + rank * c + t;
            for (int64_t t = 0; t < c; t++) out[n++] = a + (2 * cp - 1 - rank) * c + t;
        }
        return n;
    }
    int64_t parts = scheme == MASKPACK_CP_ZIGZAG ? 2 * cp : cp, c = S / parts;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < c; t++) out[n++] = b * S + rank * c + t;
        if (scheme == MASKPACK_CP_ZIGZAG)
            for (int64_t t = 0; t < c; t++) out[n++] = b * S + (2 * cp - 1 - rank) * c + t;
    }
    return n;
}

#endif
