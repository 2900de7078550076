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

#include <math.h>
#include <stdlib.h>

typedef struct part {
    double sum;
    uint64_t tie; /* smallest tie key of its items: a total order between parts of equal sum */
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
    static const size_t gaps[] = {13090572, 5818032, 2585792, 1149241, 510774, 227011, 100894, 44842, 19930, 8858,
                                  3937,     1750,    701,     301,     132,    57,     23,     10,    4,     1};
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

/* Binary max-heap of ids by a caller-supplied key: largest key on top, equal keys by smaller id (a
 * total order, so the pop order is fixed). Serves balanced Karmarkar-Karp (partial partitions by
 * spread) and mp_plan_spread (closed groups by their largest free space). */
typedef struct heap {
    int32_t *ids;
    size_t n;
    const double *key;
} heap;

static inline int heap_before(const heap *h, int32_t a, int32_t b) {
    if (h->key[a] != h->key[b]) return h->key[a] > h->key[b];
    return a < b;
}

static inline void heap_push(heap *h, int32_t id) {
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

static inline int32_t heap_pop(heap *h) {
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

/* ==== sequences over groups (rank x micro-batch), each group with the same number of rows ==========
 *
 * Rows are the wrong unit to balance: when the row count is not a multiple of the rank count, some
 * ranks carry one more full row than others however the rows are dealt. Sequences are the right one:
 * mp_plan_spread deals the sequences themselves over the groups (largest first, each to the group
 * with the least cost so far: LPT), packing each group's rows first-fit as it goes, so every group
 * keeps exactly T rows; mp_plan_improve then moves or swaps single sequences between the heaviest
 * group and the lightest ones while that lowers the heavier of the two. */

/* Per group, an 8-ary max tree over its rows' free space: level 0 holds the rows (padded to a
 * multiple of 8 with -1, which nothing fits), each level above the maxima of 8 entries below, up to a
 * level of at most 8. "First row with room for s" walks down one block of 8 per level: 4 levels for
 * 1500 rows, each a contiguous scan, where a binary tree needs 11 dependent loads. */
#define SPREAD_B          8
#define SPREAD_MAX_LEVELS 16

typedef struct ftree {
    size_t n_levels, len[SPREAD_MAX_LEVELS], off[SPREAD_MAX_LEVELS], width; /* width: entries per group */
} ftree;

static inline size_t first_fit_in(const int64_t *v, size_t n, int64_t s) {
    size_t i = 0;
    while (i < n && v[i] < s) i++;
    return i;
}

static inline int64_t max_of(const int64_t *v, size_t n) {
    int64_t m = v[0];
    for (size_t i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* Winner tree over groups: node x holds the group of least (cost, id) below it among the open ones
 * (-1: none). Choosing the lightest group is a read of node 1; a cost change replays one leaf-to-root
 * path of sibling comparisons, which costs less than a heap's sift-down with its unpredictable swaps. */
typedef struct wtree {
    int32_t *win;
    size_t P;
    const double *cost;
    const uint8_t *closed;
} wtree;

static inline int32_t wt_better(const wtree *w, int32_t a, int32_t b) {
    if (a < 0 || w->closed[a]) return b < 0 || w->closed[b] ? -1 : b;
    if (b < 0 || w->closed[b]) return a;
    return w->cost[b] < w->cost[a] || (w->cost[b] == w->cost[a] && b < a) ? b : a;
}

static void wt_update(wtree *w, size_t g) {
    for (size_t x = (w->P + g) / 2; x >= 1; x /= 2) w->win[x] = wt_better(w, w->win[2 * x], w->win[2 * x + 1]);
}

int mp_plan_spread(const int64_t *size, const double *cost, size_t n, int64_t cap, size_t G, size_t T, int32_t *row) {
    if (G == 0 || T == 0) return n == 0;
    ftree f = {0};
    for (size_t len = T;;) {
        len = (len + SPREAD_B - 1) / SPREAD_B * SPREAD_B;
        f.len[f.n_levels] = len;
        f.off[f.n_levels] = f.width;
        f.width += len;
        f.n_levels++;
        if (len <= SPREAD_B) break;
        len /= SPREAD_B;
    }
    const size_t top = f.n_levels - 1;
    int64_t *tree = mp_alloc_array(G, f.width * sizeof *tree);
    double *gcost = calloc(G, sizeof *gcost);
    double *groot = mp_alloc_array(G, sizeof *groot);
    int32_t *ids = mp_alloc_array(G, sizeof *ids);
    uint8_t *closed = calloc(G, 1);
    size_t P = 2; /* at least one level above the leaves: node 1 is never a leaf */
    while (P < G) P <<= 1;
    int32_t *win = mp_alloc_array(P, 2 * sizeof *win); /* a tournament tree of 2P nodes */
    if (!tree || !gcost || !groot || !ids || !closed || !win) {
        free(tree);
        free(gcost);
        free(groot);
        free(ids);
        free(closed);
        free(win);
        return -1;
    }
    for (size_t g = 0; g < G; g++) {
        int64_t *t = tree + g * f.width;
        for (size_t x = 0; x < f.len[0]; x++) t[x] = x < T ? cap : -1;
        for (size_t k = 1; k < f.n_levels; k++)
            for (size_t x = 0; x < f.len[k]; x++)
                t[f.off[k] + x] = x < f.len[k - 1] / SPREAD_B ? max_of(t + f.off[k - 1] + x * SPREAD_B, SPREAD_B) : -1;
        groot[g] = (double)max_of(t + f.off[top], f.len[top]);
    }
    /* open groups (may take the current item) in the winner tree, lightest first; closed ones (their
     * largest free space was too small for an earlier, so larger or equal, item) in a heap by free
     * space, reopened once the items get small enough. A group closes at most once per item it took. */
    wtree w = {win, P, gcost, closed};
    for (size_t x = 0; x < P; x++) win[P + x] = x < G ? (int32_t)x : -1;
    for (size_t x = P - 1; x >= 1; x--) win[x] = wt_better(&w, win[2 * x], win[2 * x + 1]);
    heap blocked = {ids, 0, groot}; /* closed groups, the most free space on top */
    int ok = 1;
    for (size_t j = 0; j < n; j++) {
        const int64_t s = size[j];
        while (blocked.n && groot[blocked.ids[0]] >= (double)s) {
            int32_t c = heap_pop(&blocked);
            closed[c] = 0;
            wt_update(&w, (size_t)c);
        }
        int32_t g;
        while ((g = win[1]) >= 0 && groot[g] < (double)s) {
            closed[g] = 1;
            wt_update(&w, (size_t)g);
            heap_push(&blocked, g);
        }
        if (g < 0) { /* no row of any group has room: the caller falls back to the packed rows */
            ok = 0;
            break;
        }
        int64_t *t = tree + (size_t)g * f.width;
        /* down: the first entry >= s at the top, then inside its block of 8 on every level below */
        size_t x = first_fit_in(t + f.off[top], f.len[top], s);
        for (size_t k = top; k-- > 0;) x = x * SPREAD_B + first_fit_in(t + f.off[k] + x * SPREAD_B, SPREAD_B, s);
        row[j] = (int32_t)((size_t)g * T + x);
        t[x] -= s;
        /* up: a parent changes only while its block's maximum does */
        for (size_t k = 1; k < f.n_levels; k++) {
            size_t p = x / SPREAD_B;
            int64_t v = max_of(t + f.off[k - 1] + p * SPREAD_B, SPREAD_B);
            if (t[f.off[k] + p] == v) break;
            t[f.off[k] + p] = v;
            x = p;
        }
        groot[g] = (double)max_of(t + f.off[top], f.len[top]);
        gcost[g] += cost[j];
        wt_update(&w, (size_t)g);
    }
    free(tree);
    free(gcost);
    free(groot);
    free(ids);
    free(closed);
    free(win);
    return ok;
}

typedef struct cand {
    double cost;
    int32_t pos;
} cand;

static int cmp_cand(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost < b->cost ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

/* Finds the best single move (x from h into a row of l) or swap (x of h with y of l): the cost moved
 * d in (0, gap) closest to gap / 2, which lowers max(C_h, C_l) the most. Returns 1 and applies it. */
static int improve_pair(const int64_t *size, const double *cost, size_t T, int32_t *row, int64_t *rfree, double *gcost,
                        size_t *gcnt, int32_t *head, int32_t *nxt, int32_t *prv, int32_t h, int32_t l, cand *lc) {
    const double gap = gcost[h] - gcost[l], target = gap / 2;
    if (!(gap > 0)) return 0;
    /* l's rows: the largest free space (moves) */
    int64_t lmax = -1;
    for (size_t t = 0; t < T; t++) {
        int64_t f = rfree[(size_t)l * T + t];
        if (f > lmax) lmax = f;
    }
    size_t nl = 0;
    for (int32_t y = head[l]; y >= 0; y = nxt[y]) lc[nl++] = (cand){cost[y], y};
    qsort(lc, nl, sizeof *lc, cmp_cand);
    double best = target; /* only d in (0, gap) qualifies: |d - gap/2| < gap/2 */
    int32_t bx = -1, by = -1;
    for (int32_t x = head[h]; x >= 0; x = nxt[x]) {
        const double cx = cost[x];
        if (!(cx > 0)) continue;
        if (cx < gap && size[x] <= lmax && fabs(cx - target) < best) {
            best = fabs(cx - target);
            bx = x;
            by = -1;
        }
        if (!nl) continue;
        /* swap partners: c_y near cx - target; probe a few on each side of the insertion point */
        double want = cx - target;
        size_t lo = 0, hi = nl;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (lc[mid].cost < want)
                lo = mid + 1;
            else
                hi = mid;
        }
        const int64_t fx = rfree[row[x]];
        for (int side = 0; side < 2; side++) {
            for (size_t k = 0; k < 6; k++) {
                size_t q;
                if (side == 0) {
                    if (lo + k >= nl) break;
                    q = lo + k;
                } else {
                    if (k + 1 > lo) break;
                    q = lo - 1 - k;
                }
                int32_t y = lc[q].pos;
                double d = cx - lc[q].cost;
                if (!(d > 0 && d < gap)) continue;
                double sc = fabs(d - target);
                if (sc >= best) continue;
                if (fx + size[x] < size[y] || rfree[row[y]] + size[y] < size[x]) continue;
                best = sc;
                bx = x;
                by = y;
            }
        }
        if (best == 0) break;
    }
    if (bx < 0) return 0;
    /* unlink x from h (and y from l), relink across */
    int32_t xs[2] = {bx, by}, from[2] = {h, l}, to[2] = {l, h};
    int32_t dest_row[2];
    if (by < 0) { /* move: best-fit row of l */
        int64_t bf = INT64_MAX;
        dest_row[0] = -1;
        for (size_t t = 0; t < T; t++) {
            int64_t f = rfree[(size_t)l * T + t];
            if (f >= size[bx] && f < bf) {
                bf = f;
                dest_row[0] = (int32_t)((size_t)l * T + t);
            }
        }
    } else {
        dest_row[0] = row[by];
        dest_row[1] = row[bx];
    }
    for (int k = 0; k < 2; k++) {
        int32_t v = xs[k];
        if (v < 0) continue;
        if (prv[v] >= 0)
            nxt[prv[v]] = nxt[v];
        else
            head[from[k]] = nxt[v];
        if (nxt[v] >= 0) prv[nxt[v]] = prv[v];
        rfree[row[v]] += size[v];
        gcost[from[k]] -= cost[v];
        gcnt[from[k]]--;
    }
    for (int k = 0; k < 2; k++) {
        int32_t v = xs[k];
        if (v < 0) continue;
        row[v] = dest_row[k];
        rfree[row[v]] -= size[v];
        gcost[to[k]] += cost[v];
        gcnt[to[k]]++;
        prv[v] = -1;
        nxt[v] = head[to[k]];
        if (head[to[k]] >= 0) prv[head[to[k]]] = v;
        head[to[k]] = v;
    }
    return 1;
}

int mp_plan_improve(const int64_t *size, const double *cost, size_t n, int64_t cap, size_t G, size_t T, int32_t *row,
                    double tolerance) {
    if (G < 2 || n == 0) return 1;
    const size_t R = G * T;
    int64_t *rfree = mp_alloc_array(R, sizeof *rfree);
    double *gcost = calloc(G, sizeof *gcost);
    size_t *gcnt = calloc(G, sizeof *gcnt);
    int32_t *head = mp_alloc_array(G, sizeof *head), *nxt = mp_alloc_array(n, sizeof *nxt),
            *prv = mp_alloc_array(n, sizeof *prv);
    cand *lc = mp_alloc_array(n, sizeof *lc);
    enum { LIGHT = 4 };
    if (!rfree || !gcost || !gcnt || !head || !nxt || !prv || !lc) {
        free(rfree);
        free(gcost);
        free(gcnt);
        free(head);
        free(nxt);
        free(prv);
        free(lc);
        return -1;
    }
    for (size_t r = 0; r < R; r++) rfree[r] = cap;
    for (size_t g = 0; g < G; g++) head[g] = -1;
    double total = 0;
    for (size_t j = n; j-- > 0;) {
        size_t g = (size_t)row[j] / T;
        rfree[row[j]] -= size[j];
        gcost[g] += cost[j];
        gcnt[g]++;
        total += cost[j];
        prv[j] = -1;
        nxt[j] = head[g];
        if (head[g] >= 0) prv[head[g]] = (int32_t)j;
        head[g] = (int32_t)j;
    }
    const double mean = total / (double)G;
    /* Each step moves cost d in (0, gap) from a heavier group to a lighter one, which strictly lowers
     * the sum of squared group costs: no cycles. The budget bounds the work on huge group counts. */
    size_t budget = 8 * G + 64;
    if (budget * G > ((size_t)1 << 26)) budget = ((size_t)1 << 26) / G + 1;
    /* items looked at over all pair tries: bounded by a few passes over the input, so a hard instance
     * costs milliseconds, not seconds */
    const size_t work_limit = 24 * n + ((size_t)1 << 16);
    size_t work = 0;
    for (size_t it = 0; it < budget && work < work_limit; it++) {
        int32_t h = 0;
        for (size_t g = 1; g < G; g++)
            if (gcost[g] > gcost[h]) h = (int32_t)g;
        if (!(mean > 0) || gcost[h] <= mean * (1 + tolerance)) break;
        /* partners lightest first: the LIGHT lightest, then (when none of them helps) every group lighter
         * than h, in index order */
        int32_t light[LIGHT];
        size_t nlight = 0;
        for (size_t g = 0; g < G; g++) {
            size_t k = nlight < LIGHT ? nlight++ : LIGHT;
            if (k == LIGHT && gcost[g] >= gcost[light[LIGHT - 1]]) continue;
            if (k == LIGHT) k = LIGHT - 1;
            while (k > 0 && gcost[light[k - 1]] > gcost[g]) {
                light[k] = light[k - 1];
                k--;
            }
            light[k] = (int32_t)g;
        }
        int moved = 0;
        for (size_t k = 0; k < nlight && !moved; k++)
            if (light[k] != h) {
                work += gcnt[h] + gcnt[light[k]];
                moved = improve_pair(size, cost, T, row, rfree, gcost, gcnt, head, nxt, prv, h, light[k], lc);
            }
        for (size_t g = 0; g < G && !moved && nlight == LIGHT && work < work_limit; g++) {
            int is_light = 0;
            for (size_t k = 0; k < nlight; k++) is_light |= light[k] == (int32_t)g;
            if ((int32_t)g != h && !is_light && gcost[g] < gcost[h]) {
                work += gcnt[h] + gcnt[g];
                moved = improve_pair(size, cost, T, row, rfree, gcost, gcnt, head, nxt, prv, h, (int32_t)g, lc);
            }
        }
        if (!moved) break;
    }
    free(rfree);
    free(gcost);
    free(gcnt);
    free(head);
    free(nxt);
    free(prv);
    free(lc);
    return 1;
}
