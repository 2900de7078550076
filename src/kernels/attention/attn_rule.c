/* attn_rule.c: the geometry of the attention rule over one query block, which every kernel reads:
 * each row's key intervals (causal, window, spans, prefix), a segment's key hull, and the class of
 * a key tile (empty, partial, full). Depends on the layout alone: no kernel, plan or API. */
#include "attn_internal.h"

#include <stdint.h>

void attn_block_rows(const maskpack_layout *L, size_t k, int64_t i0, int32_t n, attn_rows *r) {
    int64_t pre = L->prefix ? L->prefix[k] : 0;
    size_t sb = L->span_begin[k], se = L->span_begin[k + 1];
    r->n = n;
    int32_t kmin = INT32_MAX, kmax = 0;
    for (int32_t x = 0; x < ATTN_MAX_BQ; x++) {
        r->lo[x] = r->hi[x] = r->slo[x] = r->shi[x] = r->pre[x] = 0;
        if (x >= n) continue;
        int64_t i = i0 + x, lo, hi;
        mp_base_key_range(L, k, i, &lo, &hi);
        r->lo[x] = (int32_t)lo;
        r->hi[x] = (int32_t)hi;
        r->pre[x] = (int32_t)pre;
        if (se > sb) {
            int64_t p = mp_span_pos(L, k, i);
            for (size_t t = sb; t < se; t++) {
                const maskpack_span *sp = &L->spans[t];
                if (p >= sp->start && p < sp->end) {
                    r->slo[x] = (int32_t)sp->start;
                    r->shi[x] = (int32_t)sp->end;
                    break;
                }
            }
        }
        /* hull of this row's keys */
        int32_t a = INT32_MAX, b = 0;
        if (r->lo[x] < r->hi[x]) {
            a = r->lo[x];
            b = r->hi[x];
        }
        if (r->pre[x] > 0) {
            a = 0;
            if (r->pre[x] > b) b = r->pre[x];
        }
        if (r->slo[x] < r->shi[x]) {
            if (r->slo[x] < a) a = r->slo[x];
            if (r->shi[x] > b) b = r->shi[x];
        }
        if (a < b) {
            if (a < kmin) kmin = a;
            if (b > kmax) kmax = b;
        }
    }
    if (kmin == INT32_MAX) kmin = kmax = 0;
    r->kmin = kmin;
    r->kmax = kmax;
    r->simple = 1;
    r->any_empty = 0;
    r->lo_max = INT32_MIN;
    r->hi_min = INT32_MAX;
    for (int32_t x = 0; x < n; x++) {
        if (r->pre[x] > 0 || r->slo[x] < r->shi[x]) r->simple = 0;
        if (r->lo[x] >= r->hi[x]) r->any_empty = 1;
        if (r->lo[x] > r->lo_max) r->lo_max = r->lo[x];
        if (r->hi[x] < r->hi_min) r->hi_min = r->hi[x];
    }
}

void attn_segment_hull(const maskpack_layout *L, size_t k, int32_t bq, int64_t *lo, int64_t *hi) {
    const maskpack_segment *g = &L->segs[k];
    int64_t a = INT64_MAX, b = 0;
    attn_rows rows;
    for (int64_t i0 = 0; i0 < g->q_len; i0 += bq) {
        attn_block_rows(L, k, i0, (int32_t)(g->q_len - i0 < bq ? g->q_len - i0 : bq), &rows);
        if (rows.kmin < rows.kmax) {
            if (rows.kmin < a) a = rows.kmin;
            if (rows.kmax > b) b = rows.kmax;
        }
    }
    *lo = a == INT64_MAX ? 0 : a;
    *hi = a == INT64_MAX ? 0 : b;
}

/* Does row x see all of [j0, j1)? The union of at most three intervals, walked from j0. */
static int row_covers(const attn_rows *r, int x, int32_t j0, int32_t j1) {
    int32_t pos = j0;
    for (int guard = 0; guard < 4 && pos < j1; guard++) {
        int32_t next = pos;
        if (r->lo[x] <= pos && pos < r->hi[x] && r->hi[x] > next) next = r->hi[x];
        if (pos < r->pre[x] && r->pre[x] > next) next = r->pre[x];
        if (r->slo[x] <= pos && pos < r->shi[x] && r->shi[x] > next) next = r->shi[x];
        if (next == pos) return 0;
        pos = next;
    }
    return pos >= j1;
}

/* Keys of [j0, j1) row x sees: their hull as [*a, *b) (empty when *a >= *b). */
static void row_hull(const attn_rows *r, int x, int32_t j0, int32_t j1, int32_t *a, int32_t *b) {
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    int32_t s[3] = {r->lo[x], 0, r->slo[x]}, e[3] = {r->hi[x], r->pre[x], r->shi[x]};
    for (int t = 0; t < 3; t++) {
        int32_t u = s[t] > j0 ? s[t] : j0, w = e[t] < j1 ? e[t] : j1;
        if (u < w) {
            if (u < lo) lo = u;
            if (w > hi) hi = w;
        }
    }
    *a = lo;
    *b = hi;
}

int attn_classify(const attn_rows *r, int32_t j0, int32_t j1, int32_t *ja, int32_t *jb) {
    if (r->kmin >= r->kmax || j1 <= r->kmin || j0 >= r->kmax) return ATTN_TILE_EMPTY;
    if (r->simple) { /* O(1): see attn_rows */
        if (!r->any_empty && r->lo_max <= j0 && r->hi_min >= j1) {
            *ja = j0;
            *jb = j1;
            return ATTN_TILE_FULL;
        }
        *ja = r->kmin > j0 ? r->kmin : j0;
        *jb = r->kmax < j1 ? r->kmax : j1;
        return ATTN_TILE_PARTIAL;
    }
    int all = 1;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (int x = 0; x < r->n; x++) {
        int32_t a, b;
        row_hull(r, x, j0, j1, &a, &b);
        if (a < b) {
            if (a < lo) lo = a;
            if (b > hi) hi = b;
        }
        if (all && !row_covers(r, x, j0, j1)) all = 0;
    }
    if (lo >= hi) return ATTN_TILE_EMPTY;
    if (all) {
        *ja = j0;
        *jb = j1;
        return ATTN_TILE_FULL;
    }
    *ja = lo;
    *jb = hi;
    return ATTN_TILE_PARTIAL;
}
