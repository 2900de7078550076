/* from_mask2d.c: a [B,S] layout from a 2D mask, either a keep mask (HF attention_mask: one
 * contiguous run of tokens per row) or a document-id mask (LlamaFactory/NeMo "indexed": one
 * contiguous run per nonzero id, 0 = pad). */
#include "internal.h"

#include <stdlib.h>

/* A self-attention segment (kv == q); the remaining fields (flags, q_pos, origin) stay zero. */
static maskpack_segment self_seg(int64_t row, int64_t start, int64_t len) {
    return (maskpack_segment){.row = row, .q_start = start, .q_len = len, .kv_start = start, .kv_len = len};
}

/* One run of equal nonzero ids inside a row (DOC_ID scan). */
typedef struct doc_run {
    int64_t id, start, len;
} doc_run;

static int64_t mask_at(const maskpack_tensor *m, int64_t b, int64_t s) {
    return mp_read_i64(m->dtype, m->data, b * m->strides[0] + s * m->strides[1]);
}

/* KEEP row scan: checks values and shape pad* token+ pad*; start and len receive the run (len 0 for an
 * all-pad row). */
static maskpack_status keep_row(const maskpack_tensor *m, int64_t b, int64_t *start, int64_t *len,
                                maskpack_error *err) {
    int64_t S = m->shape[1];
    int64_t first = -1, last = -1, first_gap = -1; /* first_gap: first 0 after tokens began */
    for (int64_t s = 0; s < S; s++) {
        int64_t v = mask_at(m, b, s);
        if (v != 0 && v != 1)
            return mp_fail(err, MASKPACK_ERR_VALUE, "mask", b, s,
                           "mask[%lld, %lld]: expected 0 or 1 (KEEP convention), found %lld", (long long)b,
                           (long long)s, (long long)v);
        if (v == 1) {
            if (first_gap >= 0)
                return mp_fail(err, MASKPACK_ERR_HOLE, "mask", b, first_gap,
                               "mask[%lld, %lld]: expected tokens in one contiguous run per row (pad* token+ pad*), "
                               "found padding at column %lld between tokens of row %lld",
                               (long long)b, (long long)first_gap, (long long)first_gap, (long long)b);
            if (first < 0) first = s;
            last = s;
        } else if (first >= 0 && first_gap < 0) {
            first_gap = s;
        }
    }
    *start = first < 0 ? 0 : first;
    *len = first < 0 ? 0 : last - first + 1;
    return MASKPACK_OK;
}

/* Contiguous rows of the common dtypes: one branch-free pass counts the ones and notes any value other
 * than 0 and 1, then the run's ends are found from both sides (a cost of the padding only). The row is
 * well formed when the ones fill [first, last] exactly; anything else goes to keep_row for the error. */
#define KEEP_COUNT(NAME, T)                                                                                            \
    MP_CLONES static uint64_t NAME(const T *p, int64_t S, int *bad) {                                                  \
        uint64_t ones = 0, other = 0;                                                                                  \
        for (int64_t s = 0; s < S; s++) {                                                                              \
            ones += (uint64_t)(p[s] == 1);                                                                             \
            other |= (uint64_t)(p[s] != 0 && p[s] != 1);                                                               \
        }                                                                                                              \
        *bad = other != 0;                                                                                             \
        return ones;                                                                                                   \
    }
KEEP_COUNT(keep_count_u8, uint8_t)
KEEP_COUNT(keep_count_i32, int32_t)
KEEP_COUNT(keep_count_i64, int64_t)

/* keep_row for a contiguous bool/uint8/int8/int32/int64 row: 1 when it read the row (start, len set),
 * 0 when the row has another dtype or stride or is not well formed (keep_row then decides). */
static int keep_row_fast(const maskpack_tensor *m, int64_t b, int64_t *start, int64_t *len) {
    int64_t S = m->shape[1];
    if (m->strides[1] != 1) return 0;
    const char *row = (const char *)m->data + (size_t)(b * m->strides[0]) * maskpack_dtype_size(m->dtype);
    int bad = 0;
    uint64_t ones;
    switch (m->dtype) {
    case MASKPACK_BOOL:
    case MASKPACK_U8:
    case MASKPACK_I8: ones = keep_count_u8((const uint8_t *)row, S, &bad); break;
    case MASKPACK_I32: ones = keep_count_i32((const int32_t *)row, S, &bad); break;
    case MASKPACK_I64: ones = keep_count_i64((const int64_t *)row, S, &bad); break;
    default: return 0;
    }
    if (bad) return 0;
    if (ones == 0) {
        *start = *len = 0;
        return 1;
    }
    int64_t first = 0, last = S - 1;
    while (mp_read_i64(m->dtype, row, first) == 0) first++;
    while (mp_read_i64(m->dtype, row, last) == 0) last--;
    if ((uint64_t)(last - first + 1) != ones) return 0;
    *start = first;
    *len = ones;
    return 1;
}

static int run_cmp(const void *a, const void *b) {
    const doc_run *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

/* DOC_ID row scan: splits row b into runs of equal nonzero ids (written to runs, *n_runs entries), then
 * checks no id occurs in two runs. `sorted` is scratch of the same capacity. */
static maskpack_status doc_row(const maskpack_tensor *m, int64_t b, doc_run *runs, doc_run *sorted, size_t *n_runs,
                               maskpack_error *err) {
    int64_t S = m->shape[1];
    size_t n = 0;
    int64_t prev = 0;
    for (int64_t s = 0; s < S; s++) {
        int64_t v = mask_at(m, b, s);
        if (v < 0)
            return mp_fail(err, MASKPACK_ERR_VALUE, "mask", b, s,
                           "mask[%lld, %lld]: expected a document id >= 0 (DOC_ID convention, 0 = pad), found %lld",
                           (long long)b, (long long)s, (long long)v);
        if (v != 0) {
            if (v == prev)
                runs[n - 1].len++;
            else
                runs[n++] = (doc_run){v, s, 1}; /* a direct change of id is a boundary too */
        }
        prev = v;
    }
    *n_runs = n;
    if (n < 2) return MASKPACK_OK;
    /* an id seen in two runs of one row is a document split by padding or by another document;
     * report the earliest column where an id comes back */
    for (size_t i = 0; i < n; i++) sorted[i] = runs[i];
    qsort(sorted, n, sizeof *sorted, run_cmp);
    int64_t bad_col = -1, bad_id = 0, bad_first = 0;
    for (size_t i = 1; i < n; i++)
        if (sorted[i].id == sorted[i - 1].id && (bad_col < 0 || sorted[i].start < bad_col)) {
            bad_col = sorted[i].start;
            bad_id = sorted[i].id;
            bad_first = sorted[i - 1].start;
        }
    if (bad_col >= 0)
        return mp_fail(err, MASKPACK_ERR_HOLE, "mask", b, bad_col,
                       "mask[%lld, %lld]: expected each document id in one contiguous run per row, found id %lld "
                       "again at column %lld after its run at column %lld",
                       (long long)b, (long long)bad_col, (long long)bad_id, (long long)bad_col, (long long)bad_first);
    return MASKPACK_OK;
}

maskpack_status maskpack_layout_from_mask2d(const maskpack_tensor *mask, maskpack_mask2d_convention convention,
                                            const maskpack_rule *rule, maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = mp_check_tensor(mask, "mask", 2, 2, err);
    if (s) return s;
    if (convention != MASKPACK_MASK2D_KEEP && convention != MASKPACK_MASK2D_DOC_ID)
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "convention", -1, -1,
                       "convention: expected KEEP (0) or DOC_ID (1), found %d", (int)convention);
    /* 0/1 floats are what an additive or probability mask looks like too; a 2D keep or doc-id mask
     * must arrive as bool or an integer type so that no float is ever guessed to be one */
    if (!mp_dtype_is_integer(mask->dtype))
        return mp_fail(err, MASKPACK_ERR_DTYPE, "mask", -1, -1,
                       "mask: expected a bool or integer dtype for a 2D %s mask, found %s (a float mask is not read "
                       "as a 2D mask)",
                       convention == MASKPACK_MASK2D_KEEP ? "KEEP" : "DOC_ID", maskpack_dtype_name(mask->dtype));
    int64_t B = mask->shape[0], S = mask->shape[1];
    if ((uint64_t)B > SIZE_MAX / sizeof(maskpack_segment) || (uint64_t)S > SIZE_MAX / (2 * sizeof(doc_run)))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "mask", -1, -1, "mask: shape [%lld, %lld] is too large",
                       (long long)B, (long long)S);
    /* nothing to read: no loop over the rows of a [2^50, 0] mask */
    if (B == 0 || S == 0) return mp_layout_empty(B, S, 0, rule, out, err);

    if (convention == MASKPACK_MASK2D_KEEP) {
        /* at most one segment per row (none for an all-pad row): one pass reads and validates */
        maskpack_segment *segs = mp_alloc_array((size_t)B, sizeof *segs);
        if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
        size_t n = 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t st = 0, len = 0;
            if (!keep_row_fast(mask, b, &st, &len) && (s = keep_row(mask, b, &st, &len, err)) != MASKPACK_OK) {
                free(segs);
                return s;
            }
            if (len > 0) segs[n++] = self_seg(b, st, len);
        }
        return mp_layout_build(segs, n, B, S, S, 0, rule, out, err);
    }

    /* DOC_ID: per-row scratch for the runs, first pass validates and counts, second fills */
    doc_run *runs = mp_alloc_array((size_t)S, 2 * sizeof *runs);
    if (!runs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
    doc_run *sorted = runs + (S ? S : 1);
    size_t total = 0;
    for (int64_t b = 0; b < B; b++) {
        size_t nr;
        s = doc_row(mask, b, runs, sorted, &nr, err);
        if (s) {
            free(runs);
            return s;
        }
        total += nr; /* <= B*S, which mp_check_tensor proved fits */
    }
    if (total > SIZE_MAX / sizeof(maskpack_segment)) {
        free(runs);
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "mask", -1, -1, "mask: too many documents (%zu)", total);
    }
    maskpack_segment *segs = mp_alloc_array(total, sizeof *segs);
    if (!segs) {
        free(runs);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "mask", -1, -1, "out of memory");
    }
    size_t n = 0;
    for (int64_t b = 0; b < B; b++) {
        size_t nr;
        doc_row(mask, b, runs, sorted, &nr, NULL);
        for (size_t i = 0; i < nr; i++) segs[n++] = self_seg(b, runs[i].start, runs[i].len);
    }
    free(runs);
    return mp_layout_build(segs, n, B, S, S, 0, rule, out, err);
}
