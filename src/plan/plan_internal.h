/* plan_internal.h: pieces of the packing planner shared between its files and its tests (never
 * installed). Sizes are in units of the alignment multiple; items are indexed by uint32. */
#ifndef MASKPACK_PLAN_INTERNAL_H
#define MASKPACK_PLAN_INTERNAL_H

#include "internal.h"

#include <stdint.h>

/* The plan object (see maskpack.h). Rows are stored in final (rank-major) order. */
struct maskpack_plan {
    int64_t n_sequences;
    int64_t n_rows, dp, micro_batches, rows_per_microbatch;
    int64_t capacity, multiple;
    maskpack_plan_width row_width;
    maskpack_plan_objective objective;
    double attention_a;
    size_t n_pieces;
    /* Items are the pieces in (sequence, offset) order; without splitting item i is sequence i and
     * item_seq / item_offset are NULL. A slot is the length rounded up to the multiple. */
    int64_t *item_seq, *item_offset, *item_length;
    uint32_t *pos_item;      /* [n_pieces]: the rows' items, row after row */
    size_t *row_begin;       /* [n_rows + 1] positions of each row */
    int64_t *row_used;       /* [n_rows] columns in use (sum of slots) */
    double *row_cost;        /* [n_rows] */
    double *rank_cost;       /* [dp] */
    double *microbatch_cost; /* [dp * micro_batches] */
    maskpack_plan_report report;
};

/* Free-space index used by best-fit: 0 = automatic (buckets when the capacity in units is at most
 * MP_PLAN_BUCKET_LIMIT, else a treap), 1 = buckets, 2 = treap. Both give identical plans. */
enum { MP_PLAN_INDEX_AUTO = 0, MP_PLAN_INDEX_BUCKETS = 1, MP_PLAN_INDEX_TREE = 2 };
#define MP_PLAN_BUCKET_LIMIT ((int64_t)1 << 22)

/* Progress hook shared by the stages (may be NULL). */
typedef struct mp_plan_progress {
    void (*fn)(void *ctx, const char *stage, double fraction);
    void *ctx;
} mp_plan_progress;

/* (size[n] in [0, cap], tie[n] unique keys or NULL = index order) -> order[n]: item indices by size
 * descending, ties by tie ascending; sorted_size[j] = size[order[j]]. */
maskpack_status mp_plan_order_decreasing(const int64_t *size, const uint64_t *tie, size_t n, int64_t cap,
                                         uint32_t *order, int64_t *sorted_size, maskpack_error *err);

/* (size[n] in [0, cap] in processing order (sorted for the decreasing packers, input order for
 * next-fit), algorithm, index mode) -> bin[j]: the row of the j-th item processed (rows numbered in
 * opening order), *n_bins. Reading sizes and writing rows in processing order keeps both streams
 * sequential. */
maskpack_status mp_plan_pack(const int64_t *size, size_t n, int64_t cap, maskpack_plan_algorithm algorithm,
                             int index_mode, const mp_plan_progress *progress, int32_t *bin, size_t *n_bins,
                             maskpack_error *err);

/* Balanced Karmarkar-Karp differencing: (cost[n] >= 0, tie[n] unique keys, k >= 1 with n % k == 0) ->
 * part[n] in [0, k), n/k items per part; part 0 has the largest sum, part k-1 the smallest. */
maskpack_status mp_plan_kk(const double *cost, const uint64_t *tie, size_t n, size_t k, int32_t *part,
                           maskpack_error *err);

/* LPT over groups with fixed rows: (size[n] in [0, cap] sorted decreasing, cost[n] >= 0 non-increasing
 * with size, G groups of T rows each) -> row[j] = g*T + t for every item: item j goes to the group of
 * least cost so far that has a row with room for it (ties: lower group), first-fit inside the group.
 * Returns 1 when every item found a row, 0 when one fitted nowhere (row[] then incomplete), -1 out of
 * memory. */
int mp_plan_spread(const int64_t *size, const double *cost, size_t n, int64_t cap, size_t G, size_t T, int32_t *row);

/* Local improvement: (size[n], cost[n], row[n] = g*T + t a valid placement in G groups of T rows of cap)
 * -> row[] with single moves and pairwise swaps between the heaviest group and the lightest ones, each
 * lowering the heavier of the two, until the heaviest group is within (1 + tolerance) of the mean, no
 * step helps, or a work budget runs out. Capacity is kept. Returns 1, or -1 out of memory. */
int mp_plan_improve(const int64_t *size, const double *cost, size_t n, int64_t cap, size_t G, size_t T, int32_t *row,
                    double tolerance);

/* maskpack_plan_create with a chosen best-fit index (tests compare the two indexes). */
maskpack_status mp_plan_create_ex(const int64_t *lengths, size_t n, const maskpack_plan_options *options,
                                  int index_mode, maskpack_plan **out, maskpack_error *err);

/* A bijective 64-bit mix (splitmix64's finalizer): distinct inputs give distinct keys. */
static inline uint64_t mp_plan_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Tie key of element i under a seed: i itself for seed 0, else a seeded permutation of the keys. */
static inline uint64_t mp_plan_tie(uint64_t seed, uint64_t salt, uint64_t i) {
    return seed ? mp_plan_mix(seed ^ mp_plan_mix(salt) ^ i) : i;
}

#endif
