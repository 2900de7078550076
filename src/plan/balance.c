/* balance.c: balanced Karmarkar-Karp differencing (the "differencing method" for balanced multiway
 * partitioning): n items into k parts of exactly n/k items, minimising the largest part sum.
 *
 * Items sorted by cost (descending) are cut into n/k consecutive groups of k; each group is a partial
 * partition with one item per part. Repeatedly the two partial partitions with the largest spread
 * (largest minus smallest part sum) are merged, the heaviest part of one joined with the lightest of
 * the other, which cancels as much of both spreads as possible and keeps every part's item count
 * equal. Known worst cases (Michiels et al., balanced number partitioning): exact for 1 or 2 items
 * per part, ratio 4/3 for 3, 19/12 for 4, 103/60 for 5, at most 2 - 1/k in general. */
#include "plan_internal.h"

#include <stdlib.h>

typedef struct part {
    double sum;
    uint64_t tie;   /* smallest tie key of its items: a total order between parts of equal sum */
    int32_t head, tail;
} part;

typedef struct item_key {
    double cost;
    uint64_t tie;
    int32_t index;
} item_key;

/* item order: cost descending, then tie ascending (a total order: ties are unique) */
static inline int item_before(const item_key *a, const item_key *b) {
    if (a->cost != b->cost) return a->cost > b->cost;
    return a->tie < b->tie;
}

static inline int part_before(const part *a, const part *b) {
    if (a->sum != b->sum) return a->sum > b->sum;
    return a->tie < b->tie;
}

/* Bottom-up merge sort of items with the comparison inlined (qsort's callback costs more than the
 * sort itself at these sizes). tmp holds n items. Returns the sorted array (v or tmp). */
static item_key *sort_items(item_key *v, item_key *tmp, size_t n) {
    /* runs of 16 by insertion sort, then merges of doubling width */
    const size_t run = 16;
    for (size_t lo = 0; lo < n; lo += run) {
        size_t hi = lo + run < n ? lo + run : n;
        for (size_t j = lo + 1; j < hi; j++) {
            item_key x = v[j];
            size_t k = j;
            while (k > lo && item_before(&x, &v[k - 1])) {
                v[k] = v[k - 1];
                k--;
            }
            v[k] = x;
        }
    }
    item_key *src = v, *dst = tmp;
    for (size_t width = run; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi) dst[o++] = item_before(&src[b], &src[a]) ? src[b++] : src[a++];
            while (a < mid) dst[o++] = src[a++];
            while (b < hi) dst[o++] = src[b++];
        }
        item_key *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

/* Parts into part order: insertion sort for small k, shell sort (no allocation) above. */
static void sort_parts(part *v, size_t k) {
    /* Ciura's gaps, extended by a factor 2.25 for very many ranks */
    static const size_t gaps[] = {13090572, 5818032, 2585792, 1149241, 510774, 227011, 100894, 44842, 19930,
                                  8858, 3937, 1750, 701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        size_t gap = gaps[g];
        if (gap >= k) continue;
        for (size_t j = gap; j < k; j++) {
            part x = v[j];
            size_t i = j;
            while (i >= gap && part_before(&x, &v[i - gap])) {
                v[i] = v[i - gap];
                i -= gap;
            }
            v[i] = x;
        }
    }
}

/* Max-heap of states by (spread descending, state id ascending). */
typedef struct heap {
    int32_t *ids;
    size_t n;
    const double *spread;
} heap;

static int heap_before(const heap *h, int32_t a, int32_t b) {
    if (h->spread[a] != h->spread[b]) return h->spread[a] > h->spread[b];
    return a < b;
}

static void heap_push(heap *h, int32_t id) {
    size_t x = h->n++;
    h->ids[x] = id;
    while (x > 0) {
        size_t p = (x - 1) / 2;
        if (!heap_before(h, h->ids[x], h->ids[p])) break;
        int32_t t = h->ids[x];
        h->ids[x] = h->ids[p];
        h->ids[p] = t;
        x = p;
    }
}

static int32_t heap_pop(heap *h) {
    int32_t top = h->ids[0];
    h->ids[0] = h->ids[--h->n];
    size_t x = 0;
    for (;;) {
        size_t l = 2 * x + 1, r = l + 1, best = x;
        if (l < h->n && heap_before(h, h->ids[l], h->ids[best])) best = l;
        if (r < h->n && heap_before(h, h->ids[r], h->ids[best])) best = r;
        if (best == x) break;
        int32_t t = h->ids[x];
        h->ids[x] = h->ids[best];
        h->ids[best] = t;
        x = best;
    }
    return top;
}

maskpack_status mp_plan_kk(const double *cost, const uint64_t *tie, size_t n, size_t k, int32_t *part_of,
                           maskpack_error *err) {
    if (k == 0 || n % k != 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "k", -1, -1,
                       "k: expected >= 1 and dividing the %zu items, found %zu", n, k);
    if (n == 0) return MASKPACK_OK;
    if (k == 1) { /* one part holds everything */
        for (size_t i = 0; i < n; i++) part_of[i] = 0;
        return MASKPACK_OK;
    }
    if (n > (size_t)INT32_MAX)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "rows", -1, -1, "rows: %zu is too many to balance", n);
    size_t groups = n / k;
    item_key *items = mp_alloc_array(n, sizeof *items), *items_tmp = mp_alloc_array(n, sizeof *items_tmp);
    part *parts = mp_alloc_array(n, sizeof *parts); /* groups states of k parts each */
    int32_t *next = mp_alloc_array(n, sizeof *next);
    double *spread = mp_alloc_array(groups, sizeof *spread);
    int32_t *heap_ids = mp_alloc_array(groups, sizeof *heap_ids);
    part *merged = mp_alloc_array(k, sizeof *merged);
    if (!items || !items_tmp || !parts || !next || !spread || !heap_ids || !merged) {
        free(items);
        free(items_tmp);
        free(parts);
        free(next);
        free(spread);
        free(heap_ids);
        free(merged);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "rows", -1, -1, "out of memory");
    }
    for (size_t i = 0; i < n; i++) items[i] = (item_key){cost[i], tie[i], (int32_t)i};
    const item_key *sorted = sort_items(items, items_tmp, n);
    heap h = {heap_ids, 0, spread};
    for (size_t g = 0; g < groups; g++) {
        part *P = &parts[g * k];
        for (size_t j = 0; j < k; j++) {
            const item_key *it = &sorted[g * k + j];
            P[j] = (part){it->cost, it->tie, it->index, it->index};
            next[it->index] = -1;
        }
        /* already in part order: items were sorted by the same key */
        spread[g] = P[0].sum - P[k - 1].sum;
        heap_push(&h, (int32_t)g);
    }
    while (h.n > 1) {
        int32_t a = heap_pop(&h), b = heap_pop(&h);
        part *A = &parts[(size_t)a * k], *B = &parts[(size_t)b * k];
        /* heaviest of A with lightest of B: both are kept sorted heaviest first */
        for (size_t j = 0; j < k; j++) {
            const part *x = &A[j], *y = &B[k - 1 - j];
            merged[j].sum = x->sum + y->sum;
            merged[j].tie = x->tie < y->tie ? x->tie : y->tie;
            merged[j].head = x->head;
            merged[j].tail = y->tail;
            next[x->tail] = y->head;
        }
        sort_parts(merged, k);
        for (size_t j = 0; j < k; j++) A[j] = merged[j];
        spread[a] = A[0].sum - A[k - 1].sum;
        heap_push(&h, a);
    }
    const part *F = &parts[(size_t)h.ids[0] * k];
    for (size_t j = 0; j < k; j++)
        for (int32_t x = F[j].head; x >= 0; x = next[x]) part_of[x] = (int32_t)j;
    free(items);
    free(items_tmp);
    free(parts);
    free(next);
    free(spread);
    free(heap_ids);
    free(merged);
    return MASKPACK_OK;
}
