/* plan.c: the packing planner's public API: validate, cut into pieces, pack rows, balance rows across
 * ranks and micro-batches, and answer questions about the result (rows, layouts, report). */
#include "plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

maskpack_plan_options maskpack_plan_options_default(int64_t capacity) {
    maskpack_plan_options o;
    memset(&o, 0, sizeof o);
    o.capacity = capacity;
    o.dp = o.micro_batches = o.cp = o.tp = 1;
    o.align = MASKPACK_CP_ALIGN_VERL;
    o.multiple = 0;
    o.objective = MASKPACK_PLAN_TOKENS;
    o.attention_a = 0.0;
    o.algorithm = MASKPACK_PLAN_BFD;
    o.seed = 0;
    o.allow_split = 0;
    o.row_width = MASKPACK_PLAN_WIDTH_CAPACITY;
    o.progress = NULL;
    o.progress_ctx = NULL;
    o.hidden = 0;
    return o;
}

maskpack_status maskpack_plan_attention_coefficient(int64_t hidden, int64_t intermediate, int64_t q_dim, int64_t kv_dim,
                                                    int gated_mlp, int causal, double *a, maskpack_error *err) {
    MP_CHECK_NULL(err, a, "a");
    const int64_t lim = (int64_t)1 << 30;
    if (hidden < 1 || hidden > lim)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "hidden", -1, -1,
                       "hidden: expected in [1, 2^30], found %lld", (long long)hidden);
    if (intermediate < 0 || intermediate > lim)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "intermediate", -1, -1,
                       "intermediate: expected in [0, 2^30] (0 = 4*hidden), found %lld", (long long)intermediate);
    if (q_dim < 0 || q_dim > lim)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "q_dim", -1, -1,
                       "q_dim: expected in [0, 2^30] (0 = hidden), found %lld", (long long)q_dim);
    if (kv_dim < 0 || kv_dim > lim)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "kv_dim", -1, -1,
                       "kv_dim: expected in [0, 2^30] (0 = q_dim), found %lld", (long long)kv_dim);
    if (gated_mlp != 0 && gated_mlp != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "gated_mlp", -1, -1, "gated_mlp: expected 0 or 1, found %d",
                       gated_mlp);
    if (causal != 0 && causal != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "causal", -1, -1, "causal: expected 0 or 1, found %d",
                       causal);
    double h = (double)hidden;
    double I = intermediate ? (double)intermediate : 4.0 * h;
    double q = q_dim ? (double)q_dim : h;
    double kv = kv_dim ? (double)kv_dim : q;
    /* weights of one layer: q, k, v projections, the output projection, the MLP matrices */
    double W = h * (q + 2.0 * kv) + q * h + (gated_mlp ? 3.0 : 2.0) * h * I;
    /* linear: 2*W*L flops; attention scores + weighted sum: 4*q*L^2 (full square), half when causal */
    *a = causal ? W / q : W / (2.0 * q);
    return mp_ok(err);
}

/* ---- creation ---------------------------------------------------------------------------------- */

/* length rounded up to the multiple (the caller has checked it does not overflow) */
static inline int64_t slot_of(int64_t L, int64_t m) { return m == 1 || L % m == 0 ? L : L + (m - L % m); }

static double slot_cost(maskpack_plan_objective obj, double a, int64_t slot) {
    double L = (double)slot;
    return obj == MASKPACK_PLAN_ATTENTION ? a * L + L * L : L;
}

static maskpack_status validate_options(const maskpack_plan_options *o, int64_t *multiple, maskpack_error *err) {
    if (o->capacity < 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "capacity", -1, -1, "capacity: expected >= 1, found %lld",
                       (long long)o->capacity);
    const int64_t lim = (int64_t)1 << 24;
    if (o->dp < 1 || o->dp > lim)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "dp", -1, -1, "dp: expected in [1, 2^24], found %lld",
                       (long long)o->dp);
    if (o->micro_batches < 1 || o->micro_batches > lim)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "micro_batches", -1, -1,
                       "micro_batches: expected in [1, 2^24], found %lld", (long long)o->micro_batches);
    if (o->dp * o->micro_batches > ((int64_t)1 << 28))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "micro_batches", -1, -1,
                       "dp %lld and micro_batches %lld: every rank and micro-batch needs its own rows, and dp * "
                       "micro_batches = %lld groups exceeds the limit 2^28",
                       (long long)o->dp, (long long)o->micro_batches, (long long)(o->dp * o->micro_batches));
    int64_t m;
    maskpack_status s = maskpack_cp_multiple(o->cp, o->tp, o->align, &m, err); /* validates cp, tp, align */
    if (s) return s;
    if (o->multiple < 0 || o->multiple > ((int64_t)1 << 40))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "multiple", -1, -1,
                       "multiple: expected 0 (derive from cp, tp, align) or in [1, 2^40], found %lld",
                       (long long)o->multiple);
    if (o->multiple > 0)
        m = o->multiple;
    else if (o->cp == 1 && o->tp == 1)
        m = 1; /* nothing is sharded: no sequence needs padding */
    if (o->objective != MASKPACK_PLAN_TOKENS && o->objective != MASKPACK_PLAN_ATTENTION)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "objective", -1, -1,
                       "objective: expected TOKENS (0) or ATTENTION (1), found %d", (int)o->objective);
    if (!(o->attention_a >= 0.0) || !isfinite(o->attention_a))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "attention_a", -1, -1,
                       "attention_a: expected a finite value >= 0 (0 = %g), found %g",
                       MASKPACK_PLAN_DEFAULT_ATTENTION_A, o->attention_a);
    if (o->hidden < 0 || o->hidden > ((int64_t)1 << 30))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "hidden", -1, -1,
                       "hidden: expected 0 (not given) or in [1, 2^30], found %lld", (long long)o->hidden);
    if (o->algorithm != MASKPACK_PLAN_BFD && o->algorithm != MASKPACK_PLAN_FFD && o->algorithm != MASKPACK_PLAN_NEXTFIT)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "algorithm", -1, -1,
                       "algorithm: expected BFD (0), FFD (1) or NEXTFIT (2), found %d", (int)o->algorithm);
    if (o->allow_split != 0 && o->allow_split != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "allow_split", -1, -1,
                       "allow_split: expected 0 or 1, found %d", o->allow_split);
    if (o->row_width != MASKPACK_PLAN_WIDTH_CAPACITY && o->row_width != MASKPACK_PLAN_WIDTH_USED)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "row_width", -1, -1,
                       "row_width: expected CAPACITY (0) or USED (1), found %d", (int)o->row_width);
    if (o->capacity < m)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "capacity", -1, -1,
                       "capacity: expected >= the alignment multiple %lld (no slot would fit), found %lld",
                       (long long)m, (long long)o->capacity);
    if (o->row_width == MASKPACK_PLAN_WIDTH_CAPACITY && o->capacity % m != 0)
        return mp_fail(
            err, MASKPACK_ERR_INVALID_ARGUMENT, "capacity", -1, -1,
            "capacity: expected a multiple of the alignment multiple %lld (the last slot of a full-width row "
            "runs to its end and must divide too), found %lld; use %lld, or rows of the used width",
            (long long)m, (long long)o->capacity, (long long)(o->capacity - o->capacity % m));
    *multiple = m;
    return MASKPACK_OK;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Ascending; rows are short, so insertion sort unless one is long. */
static void sort_u32(uint32_t *v, size_t n) {
    if (n > 24) {
        qsort(v, n, sizeof *v, cmp_u32);
        return;
    }
    for (size_t j = 1; j < n; j++) {
        uint32_t x = v[j];
        size_t k = j;
        while (k > 0 && v[k - 1] > x) {
            v[k] = v[k - 1];
            k--;
        }
        v[k] = x;
    }
}

/* Working arrays of one creation, freed together. */
typedef struct work {
    int64_t *size;     /* items' slots in units of the multiple (NULL: the caller's lengths are the sizes) */
    uint64_t *tie;     /* items' tie keys (NULL: index order) */
    uint32_t *order;   /* processing order of the decreasing packers: item of position j */
    int64_t *sorted;   /* sizes in that order (its memory later holds the row -> item map) */
    int32_t *bin;      /* processing position -> packer row */
    int64_t *bin_used; /* packer row -> units in use */
    double *row_cost;  /* packer row -> cost */
    uint64_t *row_tie; /* NULL: index order */
    int32_t *rank;     /* packer row -> rank */
    int32_t *by_rank;  /* packer rows grouped by rank, packer order inside */
    int32_t *final_of; /* packer row -> final row */
    double *sub_cost;
    uint64_t *sub_tie;
    int32_t *sub_part;
    size_t *cursor;
    double *icost;          /* processing position -> cost (sequence-level balancing) */
    int32_t *spread_row;    /* processing position -> final row of the sequences-dealt candidate */
    double *rank_tokens;    /* rank -> tokens (the report) */
    double *rank_attention; /* rank -> attention cost (the report) */
} work;

static void work_free(work *w) {
    free(w->size);
    free(w->tie);
    free(w->order);
    free(w->sorted);
    free(w->bin);
    free(w->bin_used);
    free(w->row_cost);
    free(w->row_tie);
    free(w->rank);
    free(w->by_rank);
    free(w->final_of);
    free(w->sub_cost);
    free(w->sub_tie);
    free(w->sub_part);
    free(w->cursor);
    free(w->icost);
    free(w->spread_row);
    free(w->rank_tokens);
    free(w->rank_attention);
}

void maskpack_plan_free(maskpack_plan *p) {
    if (!p) return;
    free(p->item_seq);
    free(p->item_offset);
    free(p->item_length);
    free(p->pos_item);
    free(p->row_begin);
    free(p->row_used);
    free(p->row_cost);
    free(p->rank_cost);
    free(p->microbatch_cost);
    free(p);
}

/* The heaviest group never exceeds the mean by more than this before improvement stops (1e-5 = 0.001%). */
#define PLAN_TOLERANCE 1e-5
/* Up to this many pieces both candidates (sequences dealt, rows dealt) are built and the better kept. */
#define PLAN_BOTH_LIMIT 16384

/* Candidate B: the packer's rows dealt whole. (bin[j] packer row of position j, n_bins packed rows,
 * R = dp * micro_batches * per_mb rows) -> w->final_of[packer row] = final row: rows across ranks by
 * balanced Karmarkar-Karp (equal row counts; empty rows cost 0), then each rank's rows across its
 * micro-batches the same way; inside a micro-batch packer order. */
static maskpack_status deal_rows(work *w, const maskpack_plan_options *o, const int64_t *seq_size, size_t n_items,
                                 size_t n_bins, double a, int64_t m, size_t R, size_t per_rank, int64_t per_mb,
                                 const mp_plan_progress *progress, maskpack_error *err) {
    if (o->objective == MASKPACK_PLAN_TOKENS) {
        for (size_t j = 0; j < n_items; j++) w->bin_used[w->bin[j]] += seq_size[j];
        for (size_t r = 0; r < n_bins; r++) w->row_cost[r] = (double)(w->bin_used[r] * m);
    } else {
        for (size_t j = 0; j < n_items; j++) {
            w->bin_used[w->bin[j]] += seq_size[j];
            w->row_cost[w->bin[j]] += slot_cost(o->objective, a, seq_size[j] * m);
        }
    }
    if (o->dp > 1) {
        if (!w->row_tie) {
            w->row_tie = mp_alloc_array(R, sizeof *w->row_tie);
            if (!w->row_tie) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
        }
        for (size_t r = 0; r < R; r++) w->row_tie[r] = mp_plan_tie(o->seed, 2, r);
        maskpack_status s = mp_plan_kk(w->row_cost, w->row_tie, R, (size_t)o->dp, w->rank, err);
        if (s) return s;
    } else {
        memset(w->rank, 0, R * sizeof *w->rank);
    }
    if (progress->fn) progress->fn(progress->ctx, "balance", 0.5);
    /* rows of each rank in packer order (counting sort by rank) */
    memset(w->cursor, 0, (R + 1) * sizeof *w->cursor);
    for (size_t r = 0; r < R; r++) w->cursor[w->rank[r] + 1]++;
    for (int64_t q = 0; q < o->dp; q++) w->cursor[q + 1] += w->cursor[q];
    for (size_t r = 0; r < R; r++) w->by_rank[w->cursor[w->rank[r]]++] = (int32_t)r;
    /* next free slot of each micro-batch of the current rank (one pass over its rows; a scan of the
     * rows per micro-batch was O(rows x micro-batches): minutes at 1e5 micro-batches) */
    size_t *mb_next = o->micro_batches > 1 ? mp_alloc_array((size_t)o->micro_batches, sizeof *mb_next) : NULL;
    if (o->micro_batches > 1 && !mb_next)
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
    for (int64_t q = 0; q < o->dp; q++) {
        const int32_t *rows = w->by_rank + (size_t)q * per_rank;
        const size_t base = (size_t)q * per_rank; /* final rows of rank q start here */
        if (o->micro_batches == 1) {
            for (size_t t = 0; t < per_rank; t++) w->final_of[rows[t]] = (int32_t)(base + t);
            continue;
        }
        for (size_t t = 0; t < per_rank; t++) {
            w->sub_cost[t] = w->row_cost[rows[t]];
            w->sub_tie[t] = mp_plan_tie(o->seed, 3, (uint64_t)rows[t]);
        }
        maskpack_status s = mp_plan_kk(w->sub_cost, w->sub_tie, per_rank, (size_t)o->micro_batches, w->sub_part, err);
        if (s) {
            free(mb_next);
            return s;
        }
        /* final position: micro-batch, then packer order inside the micro-batch */
        memset(mb_next, 0, (size_t)o->micro_batches * sizeof *mb_next);
        for (size_t t = 0; t < per_rank; t++) {
            size_t j = (size_t)w->sub_part[t];
            w->final_of[rows[t]] = (int32_t)(base + j * (size_t)per_mb + mb_next[j]++);
        }
        if (progress->fn && (q + 1) % 64 == 0)
            progress->fn(progress->ctx, "balance", 0.5 + 0.5 * (double)(q + 1) / (double)o->dp);
    }
    free(mb_next);
    return MASKPACK_OK;
}

/* Micro-batches inside each rank. row[j] = q*mb*T + t with t in [0, mb*T) on entry, (q*mb + micro)*T + t'
 * on exit; the rank of every item is kept, so the ranks' balance is untouched. With `spread` the rank's
 * sequences are dealt afresh over its micro-batches (largest first, mp_plan_spread); when they do not
 * fit that way, or without `spread`, the rank's rows are dealt whole by balanced Karmarkar-Karp (T per
 * micro-batch). Either way single moves and swaps then polish the micro-batches. Returns 0, or -1 out
 * of memory. */
static int split_microbatches(const int64_t *seq_size, const double *icost, size_t n, int64_t cap, size_t dp, size_t mb,
                              size_t T, uint64_t seed, int spread, int32_t *row) {
    const size_t RT = mb * T; /* rows per rank */
    uint32_t *idx = mp_alloc_array(n ? n : 1, sizeof *idx);
    size_t *start = calloc(dp + 1, sizeof *start);
    int64_t *ssize = mp_alloc_array(n ? n : 1, sizeof *ssize);
    double *scost = mp_alloc_array(n ? n : 1, sizeof *scost);
    int32_t *srow = mp_alloc_array(n ? n : 1, sizeof *srow);
    double *rcost = mp_alloc_array(RT, sizeof *rcost);
    uint64_t *rtie = mp_alloc_array(RT, sizeof *rtie);
    int32_t *rpart = mp_alloc_array(RT, sizeof *rpart), *rmap = mp_alloc_array(RT, sizeof *rmap);
    size_t *next = mp_alloc_array(mb, sizeof *next);
    int rc = 0;
    if (!idx || !start || !ssize || !scost || !srow || !rcost || !rtie || !rpart || !rmap || !next) {
        rc = -1;
        goto done;
    }
    /* positions grouped by rank, in position (size-decreasing) order */
    for (size_t j = 0; j < n; j++) start[(size_t)row[j] / RT + 1]++;
    for (size_t q = 0; q < dp; q++) start[q + 1] += start[q];
    for (size_t j = 0; j < n; j++) idx[start[(size_t)row[j] / RT]++] = (uint32_t)j;
    for (size_t q = dp; q > 0; q--) start[q] = start[q - 1];
    start[0] = 0;
    for (size_t q = 0; q < dp; q++) {
        const size_t b = start[q], k = start[q + 1] - b, base = q * RT;
        for (size_t i = 0; i < k; i++) {
            uint32_t j = idx[b + i];
            ssize[i] = seq_size[j];
            scost[i] = icost[j];
        }
        int ok = spread ? mp_plan_spread(ssize, scost, k, cap, mb, T, srow) : 0;
        if (ok < 0) {
            rc = -1;
            goto done;
        }
        if (!ok) { /* the rank's rows dealt whole over its micro-batches */
            for (size_t t = 0; t < RT; t++) {
                rcost[t] = 0;
                rtie[t] = mp_plan_tie(seed, 3, (uint64_t)(base + t));
            }
            for (size_t i = 0; i < k; i++) rcost[(size_t)row[idx[b + i]] - base] += scost[i];
            maskpack_error e;
            if (mp_plan_kk(rcost, rtie, RT, mb, rpart, &e)) {
                rc = -1;
                goto done;
            }
            memset(next, 0, mb * sizeof *next);
            for (size_t t = 0; t < RT; t++) rmap[t] = (int32_t)((size_t)rpart[t] * T + next[rpart[t]]++);
            for (size_t i = 0; i < k; i++) srow[i] = rmap[(size_t)row[idx[b + i]] - base];
        }
        if (mp_plan_improve(ssize, scost, k, cap, mb, T, srow, PLAN_TOLERANCE) < 0) {
            rc = -1;
            goto done;
        }
        for (size_t i = 0; i < k; i++) row[idx[b + i]] = (int32_t)(base + (size_t)srow[i]);
    }
done:
    free(idx);
    free(start);
    free(ssize);
    free(scost);
    free(srow);
    free(rcost);
    free(rtie);
    free(rpart);
    free(rmap);
    free(next);
    return rc;
}

/* (v[k]) -> min, mean, max and the imbalance max / mean - 1 (0 when the mean is 0). */
static double spread(const double *v, size_t k, double *mn, double *mean, double *mx) {
    double sum = 0, hi = -INFINITY, lo = INFINITY;
    for (size_t i = 0; i < k; i++) {
        sum += v[i];
        if (v[i] > hi) hi = v[i];
        if (v[i] < lo) lo = v[i];
    }
    *mn = lo;
    *mx = hi;
    *mean = sum / (double)k;
    return *mean > 0 ? hi / *mean - 1.0 : 0.0;
}

/* A placement's quality for choosing between candidates: the largest rank cost, then (far below it)
 * the largest micro-batch cost. (row[n] final rows, G = dp * mb groups of T rows) */
static double placement_cost(const int32_t *row, const double *icost, size_t n, size_t T, size_t G, size_t mb) {
    double *gs = calloc(G, sizeof *gs);
    if (!gs) return INFINITY;
    for (size_t j = 0; j < n; j++) gs[(size_t)row[j] / T] += icost[j];
    double rank_max = 0, group_max = 0;
    for (size_t g = 0; g < G; g += mb) { /* rank g / mb runs groups g .. g + mb - 1 */
        double r = 0;
        for (size_t k = g; k < g + mb; k++) {
            r += gs[k];
            if (gs[k] > group_max) group_max = gs[k];
        }
        if (r > rank_max) rank_max = r;
    }
    free(gs);
    return rank_max + 1e-9 * group_max;
}

maskpack_status maskpack_plan_create(const int64_t *lengths, size_t n, const maskpack_plan_options *o,
                                     maskpack_plan **out, maskpack_error *err) {
    return mp_plan_create_ex(lengths, n, o, MP_PLAN_INDEX_AUTO, out, err);
}

/* One creation's state, passed from phase to phase: the caller's inputs, what the phases derive from
 * them, the working arrays and the plan being filled. */
typedef struct creation {
    const int64_t *lengths;
    size_t n;
    const maskpack_plan_options *o;
    int index_mode;
    /* the options settled */
    int64_t m;         /* the alignment multiple */
    int64_t cap_units; /* the capacity in units of the multiple */
    int64_t piece_max; /* the longest slot a row can hold */
    double a;          /* the attention coefficient */
    mp_plan_progress progress;
    /* items: pieces in (sequence, offset) order */
    int64_t total;      /* real tokens */
    size_t n_items, ni; /* ni: n_items, at least 1 (allocation sizes) */
    int64_t n_split;
    int split, decreasing;
    const int64_t *size;     /* items' slots in units (the caller's lengths when they are the sizes) */
    const int64_t *seq_size; /* the same in processing order */
    size_t n_bins;           /* rows the packer filled */
    /* the row grid: dp ranks x mb micro-batches (G groups) x T rows */
    int64_t per_mb, n_rows;
    size_t R, per_rank, G, T, mb, dp;
    int by_sequence; /* sequence-level balancing */
    /* the placement */
    int have_spread;
    int32_t *pos_row; /* processing position -> final row */
    size_t n_nonempty;
    work w;
    maskpack_plan *p;
} creation;

static maskpack_status creation_oom(maskpack_error *err) {
    return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
}

/* The arguments and options: the multiple, the attention coefficient (a given a wins; else the
 * model's hidden size: 6 * hidden, MHA, 4*hidden MLP; else verl's constant), the progress callback. */
static maskpack_status check_arguments(creation *c, maskpack_plan **out, maskpack_error *err) {
    const maskpack_plan_options *o = c->o;
    MP_CHECK_NULL(err, out, "out");
    MP_CHECK_NULL(err, o, "options");
    if (c->n > 0) MP_CHECK_NULL(err, c->lengths, "lengths");
    if (c->n > (size_t)INT32_MAX - 1)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "lengths", -1, -1,
                       "lengths: %zu sequences is too many (limit 2^31-2)", c->n);
    maskpack_status s = validate_options(o, &c->m, err);
    if (s) return s;
    c->cap_units = o->capacity / c->m;
    c->piece_max = c->cap_units * c->m;
    c->a = MASKPACK_PLAN_DEFAULT_ATTENTION_A;
    if (o->attention_a > 0)
        c->a = o->attention_a;
    else if (o->hidden > 0) {
        s = maskpack_plan_attention_coefficient(o->hidden, 0, 0, 0, 0, 0, &c->a, err);
        if (s) return s;
    }
    c->progress = (mp_plan_progress){o->progress, o->progress_ctx};
    return MASKPACK_OK;
}

/* Validation pass: lengths, their slots, pieces (-> total, n_items). Nothing is allocated before it
 * succeeds. */
static maskpack_status count_pieces(creation *c, maskpack_error *err) {
    const maskpack_plan_options *o = c->o;
    const int64_t m = c->m;
    int64_t total = 0;
    size_t n_items = 0;
    for (size_t k = 0; k < c->n; k++) {
        int64_t L = c->lengths[k];
        if (L < 0)
            return mp_fail(err, MASKPACK_ERR_VALUE, "lengths", (int64_t)k, -1,
                           "lengths[%zu]: expected >= 0, found %lld", k, (long long)L);
        if (mp_add_overflow(total, L, &total))
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, "lengths", (int64_t)k, -1,
                           "lengths: the sum of lengths overflows int64 at index %zu", k);
        if (m > 1 && L % m && L > INT64_MAX - (m - L % m))
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, "lengths", (int64_t)k, -1,
                           "lengths[%zu]: rounding %lld up to a multiple of %lld overflows int64", k, (long long)L,
                           (long long)m);
        int64_t slot = slot_of(L, m);
        size_t pieces = 1;
        if (slot > o->capacity) {
            if (!o->allow_split) {
                if (m > 1)
                    return mp_fail(err, MASKPACK_ERR_VALUE, "lengths", (int64_t)k, -1,
                                   "lengths[%zu]: sequence %zu needs a slot of %lld tokens (length %lld rounded up to "
                                   "the alignment multiple %lld), more than the capacity %lld; allow splitting to cut "
                                   "it into pieces",
                                   k, k, (long long)slot, (long long)L, (long long)m, (long long)o->capacity);
                return mp_fail(err, MASKPACK_ERR_VALUE, "lengths", (int64_t)k, -1,
                               "lengths[%zu]: sequence %zu has %lld tokens, more than the capacity %lld; allow "
                               "splitting to cut it into pieces",
                               k, k, (long long)L, (long long)o->capacity);
            }
            pieces = (size_t)((L - 1) / c->piece_max + 1);
        }
        if (pieces > (size_t)INT32_MAX - 1 - n_items)
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, "lengths", (int64_t)k, -1,
                           "lengths: more than 2^31-2 pieces at sequence %zu", k);
        n_items += pieces;
    }
    c->total = total;
    c->n_items = n_items;
    c->ni = n_items ? n_items : 1;
    c->split = n_items != c->n;
    c->decreasing = c->o->algorithm != MASKPACK_PLAN_NEXTFIT;
    return MASKPACK_OK;
}

/* The plan and the per-item arrays. Without splitting item i is sequence i (item_seq and item_offset
 * stay NULL); sizes in units only when they differ from the lengths, tie keys only with a seed. */
static maskpack_status allocate_items(creation *c, maskpack_error *err) {
    work *w = &c->w;
    const size_t ni = c->ni;
    maskpack_plan *p = c->p = calloc(1, sizeof *p);
    if (!p) return creation_oom(err);
    p->item_length = mp_alloc_array(ni, sizeof *p->item_length);
    w->bin = mp_alloc_array(ni, sizeof *w->bin);
    /* the decreasing packers need an order; next-fit does not, but the buffer becomes pos_item later */
    w->order = mp_alloc_array(ni, sizeof *w->order);
    if (c->split) {
        p->item_seq = mp_alloc_array(ni, sizeof *p->item_seq);
        p->item_offset = mp_alloc_array(ni, sizeof *p->item_offset);
    }
    if (c->decreasing) w->sorted = mp_alloc_array(ni, sizeof *w->sorted);
    if (c->split || c->m > 1) w->size = mp_alloc_array(ni, sizeof *w->size);
    if (c->o->seed) w->tie = mp_alloc_array(ni, sizeof *w->tie);
    if (!p->item_length || !w->bin || !w->order || (c->decreasing && !w->sorted) ||
        (c->split && (!p->item_seq || !p->item_offset)) || ((c->split || c->m > 1) && !w->size) ||
        (c->o->seed && !w->tie))
        return creation_oom(err);
    return MASKPACK_OK;
}

/* Items are pieces in (sequence, offset) order, so item index order is the input order next-fit
 * keeps: each item's length, slot in units, sequence and offset (when splitting), tie key (seed). */
static void cut_items(creation *c) {
    const int64_t *lengths = c->lengths, m = c->m, piece_max = c->piece_max;
    const size_t n = c->n;
    maskpack_plan *p = c->p;
    work *w = &c->w;
    if (!c->split) {
        if (n) memcpy(p->item_length, lengths, n * sizeof *lengths);
        if (m > 1)
            for (size_t k = 0; k < n; k++) w->size[k] = slot_of(lengths[k], m) / m;
    } else {
        size_t it = 0;
        for (size_t k = 0; k < n; k++) {
            int64_t L = lengths[k];
            int64_t slot = slot_of(L, m);
            if (slot <= c->o->capacity) {
                p->item_seq[it] = (int64_t)k;
                p->item_offset[it] = 0;
                p->item_length[it] = L;
                w->size[it] = slot / m;
                it++;
                continue;
            }
            c->n_split++;
            for (int64_t off = 0; off < L; off += piece_max) {
                int64_t len = L - off < piece_max ? L - off : piece_max;
                p->item_seq[it] = (int64_t)k;
                p->item_offset[it] = off;
                p->item_length[it] = len;
                w->size[it] = (len + m - 1) / m; /* len <= piece_max: no overflow */
                it++;
            }
        }
    }
    c->size = w->size ? w->size : lengths; /* multiple 1, no splitting: the lengths are the sizes */
    const uint64_t seed = c->o->seed;
    if (seed)
        for (size_t i = 0, n_items = c->n_items; i < n_items; i++) w->tie[i] = mp_plan_tie(seed, 1, i);
}

/* The packers see sizes in processing order (decreasing for the decreasing packers, input order for
 * next-fit) and give the packer row of each position (w.bin, n_bins rows). */
static maskpack_status pack_items(creation *c, maskpack_error *err) {
    work *w = &c->w;
    if (c->decreasing) {
        maskpack_status s =
            mp_plan_order_decreasing(c->size, w->tie, c->n_items, c->cap_units, w->order, w->sorted, err);
        if (s) return s;
    }
    c->seq_size = c->decreasing ? w->sorted : c->size;
    return mp_plan_pack(c->seq_size, c->n_items, c->cap_units, c->o->algorithm, c->index_mode, &c->progress, w->bin,
                        &c->n_bins, err);
}

/* Rows per rank and micro-batch: as many rows per micro-batch as the packed rows need, every
 * micro-batch of every rank at least one (empty) row; then the per-row arrays of the balancing and of
 * the plan. */
static maskpack_status allocate_rows(creation *c, maskpack_error *err) {
    const maskpack_plan_options *o = c->o;
    work *w = &c->w;
    maskpack_plan *p = c->p;
    const int64_t groups = o->dp * o->micro_batches;
    int64_t per_mb = ((int64_t)c->n_bins + groups - 1) / groups;
    if (per_mb < 1) per_mb = 1;
    int64_t n_rows;
    if (mp_mul_overflow(per_mb, groups, &n_rows) || n_rows > INT32_MAX)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "dp", -1, -1,
                       "dp %lld and micro_batches %lld cannot get equal row counts: %lld rows per micro-batch "
                       "times dp * micro_batches = %lld exceeds 2^31-1 rows",
                       (long long)o->dp, (long long)o->micro_batches, (long long)per_mb, (long long)groups);
    const size_t R = (size_t)n_rows, ni = c->ni;
    c->per_mb = per_mb;
    c->n_rows = n_rows;
    c->R = R;
    c->per_rank = R / (size_t)o->dp;
    c->G = (size_t)groups;
    c->T = (size_t)per_mb;
    c->mb = (size_t)o->micro_batches;
    c->dp = (size_t)o->dp;
    /* Sequence-level balancing (the decreasing packers over more than one group): the packed row count
     * only fixes T; the sequences are then dealt over the groups (mp_plan_spread) and improved by
     * single moves and swaps. Next-fit keeps its input-order runs, so its rows are dealt whole. */
    c->by_sequence = c->decreasing && c->G > 1;
    w->bin_used = calloc(R, sizeof *w->bin_used);
    w->row_cost = calloc(R, sizeof *w->row_cost);
    w->rank = mp_alloc_array(R, sizeof *w->rank);
    w->by_rank = mp_alloc_array(R, sizeof *w->by_rank);
    w->final_of = mp_alloc_array(R, sizeof *w->final_of);
    w->cursor = mp_alloc_array(R + 1, sizeof *w->cursor);
    if (o->seed) w->row_tie = mp_alloc_array(R, sizeof *w->row_tie);
    if (o->micro_batches > 1) {
        w->sub_cost = mp_alloc_array(c->per_rank, sizeof *w->sub_cost);
        w->sub_tie = mp_alloc_array(c->per_rank, sizeof *w->sub_tie);
        w->sub_part = mp_alloc_array(c->per_rank, sizeof *w->sub_part);
    }
    if (c->by_sequence) {
        w->icost = mp_alloc_array(ni, sizeof *w->icost);
        w->spread_row = mp_alloc_array(ni, sizeof *w->spread_row);
    }
    p->row_begin = calloc(R + 1, sizeof *p->row_begin);
    p->row_used = calloc(R, sizeof *p->row_used);
    p->row_cost = calloc(R, sizeof *p->row_cost);
    p->rank_cost = calloc((size_t)o->dp, sizeof *p->rank_cost);
    p->microbatch_cost = calloc((size_t)groups, sizeof *p->microbatch_cost);
    if (!w->bin_used || !w->row_cost || !w->rank || !w->by_rank || !w->final_of || !w->cursor ||
        (o->seed && !w->row_tie) || (o->micro_batches > 1 && (!w->sub_cost || !w->sub_tie || !w->sub_part)) ||
        (c->by_sequence && (!w->icost || !w->spread_row)) || !p->row_begin || !p->row_used || !p->row_cost ||
        !p->rank_cost || !p->microbatch_cost)
        return creation_oom(err);
    if (c->by_sequence)
        for (size_t j = 0; j < c->n_items; j++) w->icost[j] = slot_cost(o->objective, c->a, c->seq_size[j] * c->m);
    return MASKPACK_OK;
}

/* Candidate A: the sequences dealt over the ranks (each with mb * T rows), improved, then each rank's
 * sequences over its micro-batches: ranks first, as every rank waits for the slowest. Sets
 * have_spread when the sequences found room that way. */
static maskpack_status deal_sequences(creation *c, maskpack_error *err) {
    work *w = &c->w;
    if (!c->by_sequence) return MASKPACK_OK;
    const size_t n_items = c->n_items, mb = c->mb, T = c->T;
    int r = mp_plan_spread(c->seq_size, w->icost, n_items, c->cap_units, c->dp, mb * T, w->spread_row);
    if (r < 0) return creation_oom(err);
    if (r == 1) {
        if (mp_plan_improve(c->seq_size, w->icost, n_items, c->cap_units, c->dp, mb * T, w->spread_row,
                            PLAN_TOLERANCE) < 0)
            return creation_oom(err);
        if (mb > 1 && split_microbatches(c->seq_size, w->icost, n_items, c->cap_units, c->dp, mb, T, c->o->seed, 1,
                                         w->spread_row) < 0)
            return creation_oom(err);
        c->have_spread = 1;
    }
    if (c->progress.fn) c->progress.fn(c->progress.ctx, "balance", 0.25);
    return MASKPACK_OK;
}

/* Candidate B: the packed rows dealt whole (balanced Karmarkar-Karp over rows, then over each rank's
 * micro-batches); for the decreasing packers improved the same way. Needed when A found no room (a
 * fragmented packing), and tried beside A on small inputs where row-level KK can win. Leaves
 * w.bin[position] = final row. */
static maskpack_status deal_packed_rows(creation *c, maskpack_error *err) {
    work *w = &c->w;
    const size_t n_items = c->n_items, mb = c->mb, T = c->T;
    if (c->have_spread && n_items > PLAN_BOTH_LIMIT) return MASKPACK_OK;
    maskpack_status s = deal_rows(w, c->o, c->seq_size, n_items, c->n_bins, c->a, c->m, c->R, c->per_rank, c->per_mb,
                                  &c->progress, err);
    if (s) return s;
    for (size_t j = 0; j < n_items; j++) w->bin[j] = w->final_of[w->bin[j]]; /* bin[] now: final row */
    if (c->by_sequence) {
        if (mp_plan_improve(c->seq_size, w->icost, n_items, c->cap_units, c->dp, mb * T, w->bin, PLAN_TOLERANCE) < 0)
            return creation_oom(err);
        if (mb > 1 &&
            split_microbatches(c->seq_size, w->icost, n_items, c->cap_units, c->dp, mb, T, c->o->seed, 0, w->bin) < 0)
            return creation_oom(err);
    }
    return MASKPACK_OK;
}

/* The better candidate (A on a tie): c->pos_row. */
static void choose_candidate(creation *c) {
    work *w = &c->w;
    const int try_rows = !c->have_spread || c->n_items <= PLAN_BOTH_LIMIT;
    c->pos_row = w->bin;
    if (c->have_spread && (!try_rows || placement_cost(w->spread_row, w->icost, c->n_items, c->T, c->G, c->mb) <=
                                            placement_cost(w->bin, w->icost, c->n_items, c->T, c->G, c->mb)))
        c->pos_row = w->spread_row;
    if (c->progress.fn) c->progress.fn(c->progress.ctx, "balance", 1.0);
}

/* Inside each micro-batch the rows holding pieces come first, in their order (-> n_nonempty). */
static void put_filled_rows_first(creation *c) {
    work *w = &c->w;
    const size_t R = c->R, G = c->G, T = c->T, n_items = c->n_items;
    int32_t *pos_row = c->pos_row;
    memset(w->cursor, 0, (R + 1) * sizeof *w->cursor);
    for (size_t j = 0; j < n_items; j++) w->cursor[pos_row[j]]++;
    size_t n_nonempty = 0;
    for (size_t g = 0; g < G; g++) {
        size_t t = 0;
        for (size_t r = g * T; r < (g + 1) * T; r++)
            if (w->cursor[r]) w->final_of[r] = (int32_t)(g * T + t++);
        n_nonempty += t;
        for (size_t r = g * T; r < (g + 1) * T; r++)
            if (!w->cursor[r]) w->final_of[r] = (int32_t)(g * T + t++);
    }
    for (size_t j = 0; j < n_items; j++) pos_row[j] = w->final_of[pos_row[j]];
    c->n_nonempty = n_nonempty;
}

/* The plan's settings and rows in final order: where each row's items begin, its units used, its cost. */
static void fill_rows(creation *c) {
    const maskpack_plan_options *o = c->o;
    maskpack_plan *p = c->p;
    const size_t R = c->R, n_items = c->n_items;
    const int64_t m = c->m, *seq_size = c->seq_size;
    const double a = c->a;
    const int32_t *pos_row = c->pos_row;
    p->n_sequences = (int64_t)c->n;
    p->n_rows = c->n_rows;
    p->dp = o->dp;
    p->micro_batches = o->micro_batches;
    p->rows_per_microbatch = c->per_mb;
    p->capacity = o->capacity;
    p->multiple = m;
    p->row_width = o->row_width;
    p->objective = o->objective;
    p->attention_a = a;
    p->n_pieces = n_items;
    for (size_t j = 0; j < n_items; j++) {
        size_t f = (size_t)pos_row[j];
        p->row_begin[f + 1]++;
        p->row_used[f] += seq_size[j];
        if (o->objective == MASKPACK_PLAN_ATTENTION) p->row_cost[f] += slot_cost(o->objective, a, seq_size[j] * m);
    }
    for (size_t r = 0; r < R; r++) {
        p->row_begin[r + 1] += p->row_begin[r];
        p->row_used[r] *= m;
        if (o->objective == MASKPACK_PLAN_TOKENS) p->row_cost[r] = (double)p->row_used[r];
    }
}

/* Both objectives per rank, whatever the plan balanced (the report shows the two side by side):
 * w.rank_tokens, w.rank_attention. Before map_rows_to_items, which reuses the sorted sizes' memory. */
static maskpack_status tally_rank_objectives(creation *c, maskpack_error *err) {
    work *w = &c->w;
    const double a = c->a;
    const size_t n_items = c->n_items, per_rank = c->per_rank;
    const int64_t m = c->m, *seq_size = c->seq_size;
    const int32_t *pos_row = c->pos_row;
    w->rank_tokens = calloc(c->dp, sizeof *w->rank_tokens);
    w->rank_attention = calloc(c->dp, sizeof *w->rank_attention);
    if (!w->rank_tokens || !w->rank_attention) return creation_oom(err);
    for (size_t j = 0; j < n_items; j++) {
        size_t q = (size_t)pos_row[j] / per_rank;
        double L = (double)(seq_size[j] * m);
        w->rank_tokens[q] += L;
        w->rank_attention[q] += a * L + L * L;
    }
    return MASKPACK_OK;
}

/* The row -> item map (pos_item), items in index = (sequence, offset) order inside a row. It reuses
 * memory already touched (fresh pages cost more than the copies): next-fit's unused order buffer, or
 * the sorted sizes' buffer of the decreasing packers, which then sort each row's items back into
 * index order (seq_size is gone after this). */
static void map_rows_to_items(creation *c) {
    work *w = &c->w;
    maskpack_plan *p = c->p;
    const size_t R = c->R, n_items = c->n_items;
    const int32_t *pos_row = c->pos_row;
    memcpy(w->cursor, p->row_begin, R * sizeof *w->cursor);
    if (!c->decreasing) {
        p->pos_item = w->order;
        w->order = NULL;
        for (size_t j = 0; j < n_items; j++) p->pos_item[w->cursor[pos_row[j]]++] = (uint32_t)j;
    } else {
        uint32_t *pos = (uint32_t *)(void *)w->sorted;
        for (size_t j = 0; j < n_items; j++) pos[w->cursor[pos_row[j]]++] = w->order[j];
        for (size_t r = 0; r < R; r++) sort_u32(pos + p->row_begin[r], p->row_begin[r + 1] - p->row_begin[r]);
        uint32_t *shrunk = mp_realloc_array(pos, c->ni, sizeof *pos);
        p->pos_item = shrunk ? shrunk : pos;
        w->sorted = NULL;
        c->seq_size = NULL;
    }
}

/* Each micro-batch's and each rank's cost: the sums of their rows' costs. */
static void sum_group_costs(creation *c) {
    maskpack_plan *p = c->p;
    const size_t R = c->R, T = c->T, mb = c->mb;
    for (size_t f = 0; f < R; f++) {
        size_t g = f / T;
        p->microbatch_cost[g] += p->row_cost[f];
        p->rank_cost[g / mb] += p->row_cost[f];
    }
}

/* The report: counts, padding, fill, and the balance of ranks and micro-batches. */
static void fill_report(creation *c) {
    const maskpack_plan_options *o = c->o;
    const work *w = &c->w;
    maskpack_plan *p = c->p;
    const size_t R = c->R;
    const int64_t n_rows = c->n_rows, total = c->total, m = c->m;
    maskpack_plan_report *rep = &p->report;
    int64_t alignment_padding = 0;
    if (m > 1)
        for (size_t i = 0, n_items = c->n_items; i < n_items; i++)
            alignment_padding += c->size[i] * m - p->item_length[i];
    rep->n_sequences = (int64_t)c->n;
    rep->n_pieces = (int64_t)c->n_items;
    rep->n_split = c->n_split;
    rep->n_rows = n_rows;
    rep->n_packed_rows = (int64_t)c->n_nonempty;
    rep->n_empty_rows = n_rows - (int64_t)c->n_nonempty;
    rep->rows_per_rank = (int64_t)c->per_rank;
    rep->rows_per_microbatch = c->per_mb;
    rep->capacity = o->capacity;
    rep->multiple = m;
    rep->real_tokens = total;
    rep->alignment_padding = alignment_padding;
    rep->tail_padding = 0;
    for (size_t r = 0; r < R; r++)
        if (p->row_begin[r + 1] > p->row_begin[r]) rep->tail_padding += o->capacity - p->row_used[r];
    rep->fill = c->n_nonempty ? (double)total / ((double)o->capacity * (double)c->n_nonempty) : 1.0;
    rep->fill_nonempty_rows = rep->fill;
    rep->fill_all_rows = (double)total / ((double)o->capacity * (double)n_rows);
    rep->attention_a = c->a;
    rep->imbalance = spread(p->rank_cost, c->dp, &rep->rank_cost_min, &rep->rank_cost_mean, &rep->rank_cost_max);
    double unused;
    rep->microbatch_imbalance =
        spread(p->microbatch_cost, c->G, &unused, &rep->microbatch_cost_mean, &rep->microbatch_cost_max);
    rep->token_imbalance =
        spread(w->rank_tokens, c->dp, &rep->rank_tokens_min, &rep->rank_tokens_mean, &rep->rank_tokens_max);
    rep->attention_imbalance =
        spread(w->rank_attention, c->dp, &unused, &rep->rank_attention_mean, &rep->rank_attention_max);
}

/* Memory note: first touches of fresh pages dominate a plan's cost at 10^5 sequences, so the
 * common case (no splitting, multiple 1, seed 0) packs the caller's lengths in place and keeps per
 * sequence only its length and, per row position, a 4-byte index. */
maskpack_status mp_plan_create_ex(const int64_t *lengths, size_t n, const maskpack_plan_options *o, int index_mode,
                                  maskpack_plan **out, maskpack_error *err) {
    creation c;
    memset(&c, 0, sizeof c);
    c.lengths = lengths;
    c.n = n;
    c.o = o;
    c.index_mode = index_mode;
    maskpack_status s;
    if ((s = check_arguments(&c, out, err)) || (s = count_pieces(&c, err))) return s;
    if ((s = allocate_items(&c, err))) goto fail;
    cut_items(&c);
    if ((s = pack_items(&c, err)) || (s = allocate_rows(&c, err))) goto fail;
    if ((s = deal_sequences(&c, err)) || (s = deal_packed_rows(&c, err))) goto fail;
    choose_candidate(&c);
    put_filled_rows_first(&c);
    fill_rows(&c);
    if ((s = tally_rank_objectives(&c, err))) goto fail;
    map_rows_to_items(&c);
    sum_group_costs(&c);
    fill_report(&c);
    work_free(&c.w);
    *out = c.p;
    return mp_ok(err);
fail:
    work_free(&c.w);
    maskpack_plan_free(c.p);
    return s;
}

/* ---- accessors ----------------------------------------------------------------------------------- */

int64_t maskpack_plan_n_rows(const maskpack_plan *p) { return p->n_rows; }
int64_t maskpack_plan_n_sequences(const maskpack_plan *p) { return p->n_sequences; }
int64_t maskpack_plan_multiple(const maskpack_plan *p) { return p->multiple; }

int64_t maskpack_plan_rank_of_row(const maskpack_plan *p, int64_t row) {
    if (row < 0 || row >= p->n_rows) return -1;
    return row / p->rows_per_microbatch / p->micro_batches;
}

int64_t maskpack_plan_microbatch_of_row(const maskpack_plan *p, int64_t row) {
    if (row < 0 || row >= p->n_rows) return -1;
    return row / p->rows_per_microbatch % p->micro_batches;
}

int64_t maskpack_plan_row_used(const maskpack_plan *p, int64_t row) {
    if (row < 0 || row >= p->n_rows) return -1;
    return p->row_used[row];
}

double maskpack_plan_row_cost(const maskpack_plan *p, int64_t row) {
    if (row < 0 || row >= p->n_rows) return -1;
    return p->row_cost[row];
}

double maskpack_plan_rank_cost(const maskpack_plan *p, int64_t rank) {
    if (rank < 0 || rank >= p->dp) return -1;
    return p->rank_cost[rank];
}

double maskpack_plan_microbatch_cost(const maskpack_plan *p, int64_t rank, int64_t micro_batch) {
    if (rank < 0 || rank >= p->dp || micro_batch < 0 || micro_batch >= p->micro_batches) return -1;
    return p->microbatch_cost[rank * p->micro_batches + micro_batch];
}

static maskpack_status check_row(const maskpack_plan *p, int64_t row, maskpack_error *err) {
    if (row < 0 || row >= p->n_rows)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "row", row, -1, "row: expected in [0, %lld), found %lld",
                       (long long)p->n_rows, (long long)row);
    return MASKPACK_OK;
}

int64_t maskpack_plan_row_count(const maskpack_plan *p, int64_t row) {
    if (row < 0 || row >= p->n_rows) return -1;
    return (int64_t)(p->row_begin[row + 1] - p->row_begin[row]);
}

/* The piece at position q of the plan (rows one after the other). */
static maskpack_plan_piece piece_at(const maskpack_plan *p, size_t q) {
    uint32_t i = p->pos_item[q];
    int64_t len = p->item_length[i];
    return (maskpack_plan_piece){p->item_seq ? p->item_seq[i] : (int64_t)i, p->item_offset ? p->item_offset[i] : 0, len,
                                 slot_of(len, p->multiple)};
}

maskpack_status maskpack_plan_row(const maskpack_plan *p, int64_t row, maskpack_plan_piece *out, size_t capacity,
                                  size_t *count, maskpack_error *err) {
    MP_CHECK_NULL(err, p, "plan");
    MP_CHECK_NULL(err, count, "count");
    maskpack_status s = check_row(p, row, err);
    if (s) return s;
    size_t b = p->row_begin[row], n = p->row_begin[row + 1] - b;
    *count = n;
    if (capacity == 0) return mp_ok(err);
    MP_CHECK_NULL(err, out, "out");
    if (capacity < n)
        return mp_fail(err, MASKPACK_ERR_BUFFER_TOO_SMALL, "out", row, -1,
                       "out: row %lld has %zu pieces, the buffer holds %zu", (long long)row, n, capacity);
    for (size_t k = 0; k < n; k++) out[k] = piece_at(p, b + k);
    return mp_ok(err);
}

/* Appends the segments of plan row `row` as grid row `grid_row` to segs[*n...]. */
static void row_segments(const maskpack_plan *p, int64_t row, int64_t grid_row, maskpack_segment *segs, size_t *n) {
    int64_t col = 0;
    for (size_t q = p->row_begin[row]; q < p->row_begin[row + 1]; q++) {
        maskpack_plan_piece pc = piece_at(p, q);
        segs[(*n)++] = (maskpack_segment){
            .row = grid_row, .q_start = col, .q_len = pc.length, .kv_start = col, .kv_len = pc.length};
        col += pc.slot;
    }
}

maskpack_status maskpack_plan_row_layout(const maskpack_plan *p, int64_t row, const maskpack_rule *rule,
                                         maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, p, "plan");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status s = check_row(p, row, err);
    if (s) return s;
    size_t cnt = p->row_begin[row + 1] - p->row_begin[row];
    maskpack_segment *segs = mp_alloc_array(cnt, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
    size_t n = 0;
    row_segments(p, row, 0, segs, &n);
    int64_t width = p->row_width == MASKPACK_PLAN_WIDTH_CAPACITY ? p->capacity : p->row_used[row];
    maskpack_rule def = maskpack_rule_default();
    return mp_layout_build(segs, n, 1, width, width, 1, rule ? rule : &def, out, err);
}

maskpack_status maskpack_plan_microbatch_layout(const maskpack_plan *p, int64_t rank, int64_t micro_batch,
                                                const maskpack_rule *rule, maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, p, "plan");
    MP_CHECK_NULL(err, out, "out");
    if (rank < 0 || rank >= p->dp)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "rank", rank, -1, "rank: expected in [0, %lld), found %lld",
                       (long long)p->dp, (long long)rank);
    if (micro_batch < 0 || micro_batch >= p->micro_batches)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "micro_batch", micro_batch, -1,
                       "micro_batch: expected in [0, %lld), found %lld", (long long)p->micro_batches,
                       (long long)micro_batch);
    int64_t first = (rank * p->micro_batches + micro_batch) * p->rows_per_microbatch;
    int64_t last = first + p->rows_per_microbatch;
    size_t cnt = p->row_begin[last] - p->row_begin[first];
    maskpack_segment *segs = mp_alloc_array(cnt, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
    size_t n = 0;
    int64_t width = 0;
    for (int64_t r = first; r < last; r++) {
        row_segments(p, r, r - first, segs, &n);
        if (p->row_used[r] > width) width = p->row_used[r];
    }
    if (p->row_width == MASKPACK_PLAN_WIDTH_CAPACITY) width = p->capacity;
    maskpack_rule def = maskpack_rule_default();
    return mp_layout_build(segs, n, p->rows_per_microbatch, width, width, 0, rule ? rule : &def, out, err);
}

maskpack_status maskpack_plan_get_report(const maskpack_plan *p, maskpack_plan_report *report, maskpack_error *err) {
    MP_CHECK_NULL(err, p, "plan");
    MP_CHECK_NULL(err, report, "report");
    *report = p->report;
    return mp_ok(err);
}
