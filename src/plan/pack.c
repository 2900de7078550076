/* pack.c: sequences (items of a size in units of the alignment multiple) into rows (bins of `cap`
 * units): best-fit-decreasing, first-fit-decreasing and order-preserving next-fit, each O(n log n) or
 * better so 10^5 items pack in a few milliseconds. */
#include "plan_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- ordering ------------------------------------------------------------------------------- */

typedef struct sort_item {
    int64_t size;
    uint64_t tie;
    uint32_t index;
} sort_item;

static int cmp_size_desc(const void *pa, const void *pb) {
    const sort_item *a = pa, *b = pb;
    if (a->size != b->size) return a->size > b->size ? -1 : 1;
    if (a->tie != b->tie) return a->tie < b->tie ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

static int cmp_tie(const void *pa, const void *pb) {
    const sort_item *a = pa, *b = pb;
    if (a->tie != b->tie) return a->tie < b->tie ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

maskpack_status mp_plan_order_decreasing(const int64_t *size, const uint64_t *tie, size_t n, int64_t cap,
                                         uint32_t *order, int64_t *sorted_size, maskpack_error *err) {
    if (n == 0) return MASKPACK_OK;
    /* no tie keys (or keys in index order) means the identity pre-order; anything else is sorted first */
    int identity = 1;
    for (size_t i = 0; tie && i < n && identity; i++) identity = tie[i] == (uint64_t)i;
    if (cap <= MP_PLAN_BUCKET_LIMIT) {
        /* counting sort by size (descending), stable over the tie pre-order: O(n + cap) */
        size_t *count = calloc((size_t)cap + 2, sizeof *count);
        uint32_t *pre = identity ? NULL : mp_alloc_array(n, sizeof *pre);
        if (!count || (!identity && !pre)) {
            free(count);
            free(pre);
            return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "lengths", -1, -1, "out of memory");
        }
        if (!identity) {
            sort_item *tmp = mp_alloc_array(n, sizeof *tmp);
            if (!tmp) {
                free(count);
                free(pre);
                return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "lengths", -1, -1, "out of memory");
            }
            for (size_t i = 0; i < n; i++) tmp[i] = (sort_item){size[i], tie[i], (uint32_t)i};
            qsort(tmp, n, sizeof *tmp, cmp_tie);
            for (size_t i = 0; i < n; i++) pre[i] = tmp[i].index;
            free(tmp);
        }
        /* bucket b = cap - size, so larger sizes come first */
        for (size_t i = 0; i < n; i++) count[(size_t)(cap - size[i]) + 1]++;
        for (size_t b = 1; b <= (size_t)cap + 1; b++) count[b] += count[b - 1];
        for (size_t j = 0; j < n; j++) {
            uint32_t i = identity ? (uint32_t)j : pre[j];
            order[count[(size_t)(cap - size[i])]++] = i;
        }
        /* bucket b now ends at count[b]: its items all have size cap - b */
        for (size_t b = 0, j = 0; b <= (size_t)cap; b++)
            for (; j < count[b]; j++) sorted_size[j] = cap - (int64_t)b;
        free(count);
        free(pre);
        return MASKPACK_OK;
    }
    sort_item *tmp = mp_alloc_array(n, sizeof *tmp);
    if (!tmp) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "lengths", -1, -1, "out of memory");
    for (size_t i = 0; i < n; i++) tmp[i] = (sort_item){size[i], tie ? tie[i] : i, (uint32_t)i};
    qsort(tmp, n, sizeof *tmp, cmp_size_desc);
    for (size_t j = 0; j < n; j++) {
        order[j] = tmp[j].index;
        sorted_size[j] = tmp[j].size;
    }
    free(tmp);
    return MASKPACK_OK;
}

/* ---- best fit, bucketed index ------------------------------------------------------------------
 * Rows are kept in one stack per free amount f in [0, cap]; a hierarchy of 64-bit words marks the
 * non-empty stacks, so "smallest f >= s with a row" costs a few word scans (<= 4 levels for
 * cap <= 2^22). Among rows with the same free space the most recently updated one is chosen (the
 * stack top); the treap below follows the same rule so both give identical plans. */

#define BS_MAX_LEVELS 8

typedef struct bitset {
    int n_levels;
    size_t n_words[BS_MAX_LEVELS];
    uint64_t *words[BS_MAX_LEVELS];
} bitset;

static void bs_free(bitset *b) {
    for (int l = 0; l < b->n_levels; l++) free(b->words[l]);
}

static int bs_init(bitset *b, size_t n_bits) {
    memset(b, 0, sizeof *b);
    size_t bits = n_bits ? n_bits : 1;
    for (;;) {
        size_t w = (bits + 63) / 64;
        b->n_words[b->n_levels] = w;
        b->words[b->n_levels] = calloc(w, sizeof(uint64_t));
        if (!b->words[b->n_levels]) {
            bs_free(b);
            return -1;
        }
        b->n_levels++;
        if (w == 1) return 0;
        bits = w;
    }
}

static void bs_set(bitset *b, size_t x) {
    for (int l = 0; l < b->n_levels; l++) {
        uint64_t *w = &b->words[l][x >> 6];
        int was_empty = *w == 0;
        *w |= 1ull << (x & 63);
        if (!was_empty) return;
        x >>= 6;
    }
}

static void bs_clear(bitset *b, size_t x) {
    for (int l = 0; l < b->n_levels; l++) {
        uint64_t *w = &b->words[l][x >> 6];
        *w &= ~(1ull << (x & 63));
        if (*w) return;
        x >>= 6;
    }
}

/* Smallest set bit >= x, or -1. */
static int64_t bs_next(const bitset *b, size_t x) {
    int l = 0;
    size_t pos = x;
    for (;;) {
        size_t w = pos >> 6;
        if (w >= b->n_words[l]) return -1;
        uint64_t word = b->words[l][w] & (~0ull << (pos & 63));
        if (word) {
            pos = (w << 6) | (size_t)__builtin_ctzll(word);
            break;
        }
        if (l + 1 == b->n_levels) return -1;
        pos = w + 1; /* the next word of level l is the next bit of level l+1 */
        l++;
    }
    while (l > 0) {
        l--;
        pos = (pos << 6) | (size_t)__builtin_ctzll(b->words[l][pos]);
    }
    return (int64_t)pos;
}

static void report_progress(const mp_plan_progress *p, size_t done, size_t n) {
    if (p && p->fn && n) p->fn(p->ctx, "pack", (double)done / (double)n);
}

#define PROGRESS_EVERY ((size_t)1 << 16)

static maskpack_status bfd_buckets(const int64_t *size, size_t n, int64_t cap, const mp_plan_progress *progress,
                                   int32_t *bin, size_t *n_bins, maskpack_error *err) {
    int32_t *head = mp_alloc_array((size_t)cap + 1, sizeof *head);
    int32_t *next = mp_alloc_array(n, sizeof *next); /* stack links, per row */
    bitset bs;
    if (!head || !next || bs_init(&bs, (size_t)cap + 1) != 0) {
        free(head);
        free(next);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "lengths", -1, -1, "out of memory");
    }
    memset(head, 0xff, ((size_t)cap + 1) * sizeof *head);
    size_t rows = 0;
    for (size_t j = 0; j < n; j++) {
        int64_t s = size[j];
        int64_t f = bs_next(&bs, (size_t)s);
        int32_t r;
        if (f < 0) {
            r = (int32_t)rows++;
            f = cap;
        } else {
            r = head[f];
            head[f] = next[r];
            if (head[f] < 0) bs_clear(&bs, (size_t)f);
        }
        bin[j] = r;
        int64_t g = f - s;
        if (head[g] < 0) bs_set(&bs, (size_t)g);
        next[r] = head[g];
        head[g] = r;
        if ((j + 1) % PROGRESS_EVERY == 0) report_progress(progress, j + 1, n);
    }
    free(head);
    free(next);
    bs_free(&bs);
    *n_bins = rows;
    return MASKPACK_OK;
}

/* ---- best fit, treap index (capacities above the bucket limit) ---------------------------------
 * Keyed by (free ascending, stamp descending); stamp increases at every insertion, so the first key
 * with free >= s is exactly the bucket index's choice. Priorities are a hash of the row number:
 * deterministic, expected O(log n) depth. */

typedef struct treap {
    int32_t *left, *right;
    int64_t *free_;
    uint64_t *stamp, *prio;
    int32_t root;
} treap;

static int key_less(const treap *t, int32_t a, int32_t b) {
    if (t->free_[a] != t->free_[b]) return t->free_[a] < t->free_[b];
    return t->stamp[a] > t->stamp[b];
}

/* Splits tree x into (keys < key of node k) and (the rest). Iterative, with hanging pointers. */
static void tr_split(treap *t, int32_t x, int32_t k, int32_t *lo, int32_t *hi) {
    int32_t *l = lo, *h = hi;
    while (x >= 0) {
        if (key_less(t, x, k)) {
            *l = x;
            l = &t->right[x];
            x = t->right[x];
        } else {
            *h = x;
            h = &t->left[x];
            x = t->left[x];
        }
    }
    *l = -1;
    *h = -1;
}

static int32_t tr_merge(treap *t, int32_t a, int32_t b) {
    int32_t root = -1, *slot = &root;
    while (a >= 0 && b >= 0) {
        if (t->prio[a] > t->prio[b]) {
            *slot = a;
            slot = &t->right[a];
            a = t->right[a];
        } else {
            *slot = b;
            slot = &t->left[b];
            b = t->left[b];
        }
    }
    *slot = a >= 0 ? a : b;
    return root;
}

static void tr_insert(treap *t, int32_t k) {
    int32_t lo, hi;
    t->left[k] = t->right[k] = -1;
    tr_split(t, t->root, k, &lo, &hi);
    t->root = tr_merge(t, tr_merge(t, lo, k), hi);
}

static void tr_erase(treap *t, int32_t k) {
    int32_t *slot = &t->root;
    while (*slot != k) slot = key_less(t, k, *slot) ? &t->left[*slot] : &t->right[*slot];
    *slot = tr_merge(t, t->left[k], t->right[k]);
}

/* First node (in key order) with free >= s, or -1. */
static int32_t tr_lower_bound(const treap *t, int64_t s) {
    int32_t x = t->root, best = -1;
    while (x >= 0) {
        if (t->free_[x] >= s) {
            best = x;
            x = t->left[x];
        } else {
            x = t->right[x];
        }
    }
    return best;
}

static maskpack_status bfd_tree(const int64_t *size, size_t n, int64_t cap, const mp_plan_progress *progress,
                                int32_t *bin, size_t *n_bins, maskpack_error *err) {
    size_t m = n ? n : 1;
    treap t = {mp_alloc_array(m, sizeof(int32_t)),  mp_alloc_array(m, sizeof(int32_t)),
               mp_alloc_array(m, sizeof(int64_t)),  mp_alloc_array(m, sizeof(uint64_t)),
               mp_alloc_array(m, sizeof(uint64_t)), -1};
    if (!t.left || !t.right || !t.free_ || !t.stamp || !t.prio) {
        free(t.left);
        free(t.right);
        free(t.free_);
        free(t.stamp);
        free(t.prio);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "lengths", -1, -1, "out of memory");
    }
    size_t rows = 0;
    uint64_t stamp = 0;
    for (size_t j = 0; j < n; j++) {
        int64_t s = size[j];
        int32_t r = tr_lower_bound(&t, s);
        if (r < 0) {
            r = (int32_t)rows++;
            t.prio[r] = mp_plan_mix((uint64_t)r);
            t.free_[r] = cap;
        } else {
            tr_erase(&t, r);
        }
        bin[j] = r;
        t.free_[r] -= s;
        t.stamp[r] = ++stamp;
        tr_insert(&t, r);
        if ((j + 1) % PROGRESS_EVERY == 0) report_progress(progress, j + 1, n);
    }
    free(t.left);
    free(t.right);
    free(t.free_);
    free(t.stamp);
    free(t.prio);
    *n_bins = rows;
    return MASKPACK_OK;
}

/* ---- first fit: a max segment tree over rows (unopened rows hold the full capacity) ------------ */

static maskpack_status ffd(const int64_t *size, size_t n, int64_t cap, const mp_plan_progress *progress, int32_t *bin,
                           size_t *n_bins, maskpack_error *err) {
    /* An item opens a row only when it fits no open row, so no two rows are at most half full:
     * rows <= 2 * sum / cap + 1. Sizing the tree by that bound (not by n) keeps it in cache. */
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += (uint64_t)size[i]; /* sizes <= cap, n < 2^31: fits */
    uint64_t bound = 2 * (sum / (uint64_t)cap + 1) + 1;
    size_t limit = bound < (uint64_t)n ? (size_t)bound : n;
    size_t p = 1;
    while (p < limit) p <<= 1;
    int64_t *tree = mp_alloc_array(p, 2 * sizeof *tree);
    if (!tree) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "lengths", -1, -1, "out of memory");
    for (size_t x = 1; x < 2 * p; x++) tree[x] = cap;
    size_t rows = 0;
    for (size_t j = 0; j < n; j++) {
        int64_t s = size[j];
        /* s <= cap and at most `limit` rows are ever opened, so a fitting leaf always exists */
        size_t x = 1;
        while (x < p) x = tree[2 * x] >= s ? 2 * x : 2 * x + 1;
        size_t r = x - p;
        if (r >= rows) rows = r + 1;
        bin[j] = (int32_t)r;
        tree[x] -= s;
        for (x >>= 1; x >= 1; x >>= 1) {
            int64_t v = tree[2 * x] > tree[2 * x + 1] ? tree[2 * x] : tree[2 * x + 1];
            if (tree[x] == v) break;
            tree[x] = v;
        }
        if ((j + 1) % PROGRESS_EVERY == 0) report_progress(progress, j + 1, n);
    }
    free(tree);
    *n_bins = rows;
    return MASKPACK_OK;
}

/* ---- next fit (input order) ------------------------------------------------------------------- */

static void nextfit(const int64_t *size, size_t n, int64_t cap, int32_t *bin, size_t *n_bins) {
    size_t rows = 0;
    int64_t free_ = -1; /* no row open yet */
    for (size_t i = 0; i < n; i++) {
        if (free_ < size[i]) {
            rows++;
            free_ = cap;
        }
        bin[i] = (int32_t)(rows - 1);
        free_ -= size[i];
    }
    *n_bins = rows;
}

maskpack_status mp_plan_pack(const int64_t *size, size_t n, int64_t cap, maskpack_plan_algorithm algorithm,
                             int index_mode, const mp_plan_progress *progress, int32_t *bin, size_t *n_bins,
                             maskpack_error *err) {
    maskpack_status s = MASKPACK_OK;
    switch (algorithm) {
    case MASKPACK_PLAN_BFD:
        if (index_mode == MP_PLAN_INDEX_TREE || (index_mode == MP_PLAN_INDEX_AUTO && cap > MP_PLAN_BUCKET_LIMIT))
            s = bfd_tree(size, n, cap, progress, bin, n_bins, err);
        else
            s = bfd_buckets(size, n, cap, progress, bin, n_bins, err);
        break;
    case MASKPACK_PLAN_FFD: s = ffd(size, n, cap, progress, bin, n_bins, err); break;
    case MASKPACK_PLAN_NEXTFIT: nextfit(size, n, cap, bin, n_bins); break;
    default:
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "algorithm", -1, -1,
                       "algorithm: expected BFD (0), FFD (1) or NEXTFIT (2), found %d", (int)algorithm);
    }
    if (!s) report_progress(progress, n, n);
    return s;
}
