/* block_mask.c: FlexAttention-compatible block masks (one head), computed from the segments.
 *
 * A cell (i, j) can only be allowed when j is a key of the segment owning query i, so for a q block
 * only the segments whose queries lie in it matter, and for each of them only the kv blocks
 * overlapping the keys those queries can see. Each candidate (segment, kv block) pair is classified
 * from the segment geometry:
 *   - causal or bidirectional rules without window, span or prefix: in closed form (O(1));
 *   - otherwise: one interval computation per query row of the block (never per cell).
 * A block is FULL when it is a whole block (not cut short by the end of the grid: torch's
 * create_block_mask pads to whole blocks with False), its query rows are all real tokens and every
 * segment owning them sees every key of the block; it is PARTIAL when some segment sees some key.
 * Segments with explicit positions (context-parallel pieces) may share keys, so several segments can make one block
 * FULL together. The work is proportional to the candidate blocks plus B * (Qb + Kb), never S * Skv. */
#include "fill.h"

#include <stdlib.h>
#include <string.h>

enum { BLK_EMPTY = 0, BLK_PARTIAL = 1, BLK_FULL = 2 };
enum { SUB_NONE = 0, SUB_SOME = 1, SUB_ALL = 2 };

static maskpack_status block_dims(const maskpack_layout *L, int64_t bq, int64_t bk, int64_t *qb, int64_t *kb,
                                  maskpack_error *err) {
    if (bq < 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "block_q", -1, -1, "block_q: expected >= 1, found %lld",
                       (long long)bq);
    if (bk < 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "block_k", -1, -1, "block_k: expected >= 1, found %lld",
                       (long long)bk);
    *qb = L->q_width == 0 ? 0 : (L->q_width - 1) / bq + 1;
    *kb = L->kv_width == 0 ? 0 : (L->kv_width - 1) / bk + 1;
    return MASKPACK_OK;
}

maskpack_status maskpack_block_mask_dims(const maskpack_layout *L, int64_t block_q, int64_t block_k, int64_t *q_blocks,
                                         int64_t *kv_blocks, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, q_blocks, "q_blocks");
    MP_CHECK_NULL(err, kv_blocks, "kv_blocks");
    int64_t qb = 0, kb = 0;
    maskpack_status s = block_dims(L, block_q, block_k, &qb, &kb, err);
    if (s) return s;
    *q_blocks = qb;
    *kv_blocks = kb;
    return mp_ok(err);
}

/* Keys (local to segment k) that the local query rows [a, b) may see, as a hull [*lo, *hi): every
 * allowed key of those rows lies inside it. The base interval's ends never decrease with the row,
 * so the rows' base intervals lie inside [lo(a), hi(b-1)). */
static void candidate_keys(const maskpack_layout *L, int analytic, size_t k, int64_t a, int64_t b, int64_t *lo,
                           int64_t *hi) {
    const maskpack_segment *g = &L->segs[k];
    if (analytic && !L->causal) {
        *lo = 0;
        *hi = g->kv_len;
        return;
    }
    int64_t l0, h0, l1, h1;
    mp_base_key_range(L, k, a, &l0, &h0);
    mp_base_key_range(L, k, b - 1, &l1, &h1);
    /* an empty row's interval may sit past the keys (lo = hi > kv_len): clip the hull to the
     * segment, so that every candidate block holds some of its keys */
    int64_t x = l0, y = h1 > l0 ? h1 : l0; /* empty when every row's base interval is empty */
    if (y > g->kv_len) y = g->kv_len;
    if (analytic) {
        *lo = x;
        *hi = y;
        return;
    }
    if (L->prefix && L->prefix[k] > 0) {
        if (x >= y) y = 0;
        x = 0;
        if (L->prefix[k] > y) y = L->prefix[k];
    }
    int64_t pa = mp_span_pos(L, k, a), pb = mp_span_pos(L, k, b - 1) + 1; /* span positions of the rows */
    for (size_t t = mpd_span_cursor(L, k, pa); t < L->span_begin[k + 1] && L->spans[t].start < pb; t++) {
        if (x >= y) {
            x = L->spans[t].start;
            y = L->spans[t].end;
            continue;
        }
        if (L->spans[t].start < x) x = L->spans[t].start;
        if (L->spans[t].end > y) y = L->spans[t].end;
    }
    *lo = x;
    *hi = y;
}

/* Status of the cells (local rows [a, b)) x (absolute key columns [c, e)) of segment k, with
 * [c, e) inside the segment's keys; both ranges non-empty. */
static int sub_status(const maskpack_layout *L, int analytic, size_t k, int64_t a, int64_t b, int64_t c, int64_t e) {
    const maskpack_segment *g = &L->segs[k];
    if (analytic) {
        if (!L->causal) return SUB_ALL;
        /* row i sees local keys [0, i + d] (d: the diagonal of row 0): the first row bounds "all",
         * the last row "any" */
        int64_t d = mp_query_pos(L, k, 0);
        int64_t lc = c - g->kv_start, le = e - g->kv_start;
        if (le - 1 <= a + d) return SUB_ALL;
        if (lc <= b - 1 + d) return SUB_SOME;
        return SUB_NONE;
    }
    int any_in = 0, any_out = 0;
    size_t cursor = mpd_span_cursor(L, k, mp_span_pos(L, k, a));
    for (int64_t i = a; i < b; i++) {
        int64_t iv[3][2];
        int n = mpd_row_intervals(L, k, i, &cursor, iv);
        int64_t cnt = 0;
        for (int t = 0; t < n; t++) {
            int64_t x = iv[t][0] > c ? iv[t][0] : c, y = iv[t][1] < e ? iv[t][1] : e;
            if (y > x) cnt += y - x;
        }
        if (cnt > 0) any_in = 1;
        if (cnt < e - c) any_out = 1;
        if (any_in && any_out) return SUB_SOME;
    }
    return any_in ? SUB_ALL : SUB_NONE;
}

/* Appends classified blocks of one q block to the caller's lists. */
typedef struct emitter {
    const maskpack_block_mask_arrays *o;
    int64_t n_qb, n_kb, b, qb;
    int32_t n_partial, n_full;
    int32_t *qcnt; /* [2 * n_kb]: partial then full counts per kv block, or NULL */
} emitter;

static void emit(emitter *m, int64_t kb, int st) {
    if (st == BLK_EMPTY) return;
    const maskpack_block_mask_arrays *o = m->o;
    int64_t kv_row = (m->b * m->n_qb + m->qb) * m->n_kb; /* start of kv_indices[b, qb, :] */
    int64_t q_row = (m->b * m->n_kb + kb) * m->n_qb;     /* start of q_indices[b, kb, :] */
    if (st == BLK_FULL) {
        if (o->full_kv_indices) o->full_kv_indices[kv_row + m->n_full] = (int32_t)kb;
        m->n_full++;
        if (m->qcnt) {
            int32_t c = m->qcnt[m->n_kb + kb]++;
            if (o->full_q_indices) o->full_q_indices[q_row + c] = (int32_t)m->qb;
        }
    } else {
        if (o->kv_indices) o->kv_indices[kv_row + m->n_partial] = (int32_t)kb;
        m->n_partial++;
        if (m->qcnt) {
            int32_t c = m->qcnt[kb]++;
            if (o->q_indices) o->q_indices[q_row + c] = (int32_t)m->qb;
        }
    }
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* Per-kv-block scratch of one q block: which blocks some segment reaches (touched, in visiting
 * order), and how many of the q block's segments see all of each. */
typedef struct scratch {
    uint8_t *mark;  /* [Kb] 1 while the block is in `touched` */
    int32_t *nfull; /* [Kb] segments of the q block seeing every cell of their rows in the block */
    int32_t *touched;
    int64_t n_touched;
} scratch;

maskpack_status maskpack_block_mask(const maskpack_layout *L, int64_t block_q, int64_t block_k,
                                    maskpack_block_mask_arrays *out, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, out, "out");
    int64_t n_qb = 0, n_kb = 0, cells;
    maskpack_status s = block_dims(L, block_q, block_k, &n_qb, &n_kb, err);
    if (s) return s;
    /* indices and counts are int32; the largest index array has B * Qb * Kb entries */
    if (n_qb > INT32_MAX || n_kb > INT32_MAX)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, n_qb > INT32_MAX ? "block_q" : "block_k", -1, -1,
                       "block counts (%lld q blocks, %lld kv blocks) exceed int32 indices; use larger blocks",
                       (long long)n_qb, (long long)n_kb);
    if (mp_mul_overflow(L->n_rows, n_qb, &cells) || mp_mul_overflow(cells, n_kb, &cells) ||
        (uint64_t)cells > SIZE_MAX / sizeof(int32_t))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "out", -1, -1,
                       "out: B * Qb * Kb = %lld * %lld * %lld index entries overflow the address space",
                       (long long)L->n_rows, (long long)n_qb, (long long)n_kb);
    const maskpack_block_mask_arrays o = *out;
    int want_q = o.q_num_blocks || o.q_indices || o.full_q_num_blocks || o.full_q_indices;
    /* all scratch is allocated before anything is written, so running out of memory writes nothing */
    size_t nk = (size_t)n_kb;
    int32_t *qcnt = want_q ? mp_alloc_array(nk, 2 * sizeof *qcnt) : NULL;
    scratch sc = {calloc(nk ? nk : 1, 1), mp_alloc_array(nk, sizeof(int32_t)), mp_alloc_array(nk, sizeof(int32_t)), 0};
    if ((want_q && !qcnt) || !sc.mark || !sc.nfull || !sc.touched) {
        free(qcnt);
        free(sc.mark);
        free(sc.nfull);
        free(sc.touched);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "out", -1, -1, "out of memory");
    }
    /* causal with only a right window is plain causal: the right bound never binds */
    int analytic = L->window_left < 0 && (L->window_right < 0 || L->causal) && L->n_spans == 0 && L->prefix == NULL;
    int64_t S = L->q_width, Skv = L->kv_width;

    /* no block on either axis: every output is empty, so no loop over the rows of a [2^50, 0] grid */
    for (int64_t b = 0; (n_qb || n_kb) && b < L->n_rows; b++) {
        if (qcnt) memset(qcnt, 0, nk * 2 * sizeof *qcnt);
        emitter m = {&o, n_qb, n_kb, b, 0, 0, 0, qcnt};
        size_t ks = mp_row_begin(L, b), kend = mp_row_begin(L, b + 1);
        for (int64_t qb = 0; qb < n_qb; qb++) {
            int64_t q0 = qb * block_q, q1 = S - q0 > block_q ? q0 + block_q : S;
            while (ks < kend && L->segs[ks].q_start + L->segs[ks].q_len <= q0) ks++;
            m.qb = qb;
            m.n_partial = m.n_full = 0;
            int32_t n_segs = 0;    /* segments owning query rows of this block */
            int64_t real_rows = 0; /* query rows of this block that are real tokens */
            int sorted = 1;
            sc.n_touched = 0;
            for (size_t k = ks; k < kend && L->segs[k].q_start < q1; k++) {
                const maskpack_segment *g = &L->segs[k];
                if (g->q_len == 0) continue;
                int64_t qs = g->q_start, qe = qs + g->q_len, kvs = g->kv_start, kve = kvs + g->kv_len;
                int64_t a = (q0 > qs ? q0 : qs) - qs, bb = (q1 < qe ? q1 : qe) - qs;
                n_segs++;
                real_rows += bb - a;
                if (g->kv_len == 0) continue;
                int64_t clo, chi;
                candidate_keys(L, analytic, k, a, bb, &clo, &chi);
                if (clo >= chi) continue;
                for (int64_t kb = (kvs + clo) / block_k, kb_end = (kvs + chi - 1) / block_k; kb <= kb_end; kb++) {
                    int64_t k0 = kb * block_k, k1 = Skv - k0 > block_k ? k0 + block_k : Skv;
                    int64_t c = k0 > kvs ? k0 : kvs, e = k1 < kve ? k1 : kve;
                    int st = sub_status(L, analytic, k, a, bb, c, e);
                    if (st == SUB_NONE) continue;
                    if (!sc.mark[kb]) {
                        sc.mark[kb] = 1;
                        sc.nfull[kb] = 0;
                        if (sc.n_touched > 0 && sc.touched[sc.n_touched - 1] > kb) sorted = 0;
                        sc.touched[sc.n_touched++] = (int32_t)kb;
                    }
                    /* this segment's rows see the whole block only if its keys span the block */
                    if (st == SUB_ALL && kvs <= k0 && kve >= k1) sc.nfull[kb]++;
                }
            }
            /* segments sharing keys (explicit positions) can visit blocks out of order */
            if (!sorted) qsort(sc.touched, (size_t)sc.n_touched, sizeof *sc.touched, cmp_i32);
            /* a block cut short by the grid's end is never FULL: torch's create_block_mask pads the
             * predicate to whole blocks with False, so such a block is partial there too */
            int rows_real = real_rows == q1 - q0 && q1 - q0 == block_q;
            for (int64_t t = 0; t < sc.n_touched; t++) {
                int32_t kb = sc.touched[t];
                sc.mark[kb] = 0;
                int whole_kv = Skv - (int64_t)kb * block_k >= block_k;
                emit(&m, kb, rows_real && whole_kv && sc.nfull[kb] == n_segs ? BLK_FULL : BLK_PARTIAL);
            }
            if (o.kv_num_blocks) o.kv_num_blocks[b * n_qb + qb] = m.n_partial;
            if (o.full_kv_num_blocks) o.full_kv_num_blocks[b * n_qb + qb] = m.n_full;
        }
        for (int64_t kb = 0; qcnt && kb < n_kb; kb++) {
            if (o.q_num_blocks) o.q_num_blocks[b * n_kb + kb] = qcnt[kb];
            if (o.full_q_num_blocks) o.full_q_num_blocks[b * n_kb + kb] = qcnt[n_kb + kb];
        }
    }
    free(qcnt);
    free(sc.mark);
    free(sc.nfull);
    free(sc.touched);
    return mp_ok(err);
}
