/* attn_plan.c: how an attention call's work is cut and run: the forward's work items (a block of
 * query rows of one segment and head) with their units and claims, the backward's key groups, the
 * workspace layouts, the zeroing of padding rows, and the runs of the kernels' shares on a team.
 * Called by the API (attn_api.c) after validation; calls the kernels through the table. */
#include "attn_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- running shares on a team ------------------------------------------------------------------ */

/* The kernels' thread functions take a share index s in [0, n): per-share workspace, and in the
 * backward's split mode and tail reduction a fixed part of the work. The shares are the run layer's
 * items (mp_run_for): every share runs exactly once, on some participant, and the results depend
 * only on n (never on the team or on which participant ran what). */
typedef struct {
    attn_thread_fn fn;
    void *ctx;
} attn_shares;

static maskpack_status run_share(void *p, int64_t s, int participant) {
    (void)participant;
    const attn_shares *S = p;
    S->fn(S->ctx, (int)s);
    return MASKPACK_OK;
}

/* Runs fn(ctx, s) once for every share s in [0, n) (at least one) on the run's team. */
static void run_shares(const mp_run *run, int n, attn_thread_fn fn, void *ctx) {
    attn_shares S = {fn, ctx};
    mp_run_for(run, n > 1 ? n : 1, run_share, &S);
}

/* ---- work decomposition ------------------------------------------------------------------------ */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Number of (segment, head, block) items at block size bq. */
static int64_t count_items(const attn_problem *P, int32_t bq) {
    const maskpack_layout *L = P->L;
    int64_t n = 0;
    for (size_t k = 0; k < L->n_segments; k++) n += ceil_div(L->segs[k].q_len, bq);
    return n * P->hq;
}

int64_t attn_max_items(const attn_problem *P) { return count_items(P, ATTN_AMX_BQ < ATTN_BQ ? ATTN_AMX_BQ : ATTN_BQ); }

int attn_fwd_claim(attn_fwd_job *job, size_t *b, size_t *e) {
    int64_t i;
    if (!mp_claim_take(job->claim, &i)) return 0;
    size_t x = (size_t)i;
    if (job->by_unit) {
        if (x < job->n_whole) {
            *b = job->unit_begin[x];
            *e = job->unit_begin[x + 1];
            return 1;
        }
        x = job->unit_begin[job->n_whole] + (x - job->n_whole); /* the tail, item by item */
    }
    *b = x;
    *e = x + 1;
    return 1;
}

/* Items ordered segment by segment and head by head (the query heads of one key head are
 * consecutive: a unit), the costliest (last) block first, so the dynamic schedule ends on short
 * items. unit_begin gets n_segments * hkv + 1 entries. */
static size_t fill_items(const attn_problem *P, int32_t bq, attn_item *items, size_t *unit_begin) {
    const maskpack_layout *L = P->L;
    size_t n = 0, u = 0;
    for (size_t k = 0; k < L->n_segments; k++) {
        int64_t ql = L->segs[k].q_len, nb = ceil_div(ql, bq);
        for (int32_t h = 0; h < P->hq; h++) {
            if (h % P->group == 0) unit_begin[u++] = n;
            for (int64_t b = nb - 1; b >= 0; b--) {
                int64_t i0 = b * bq;
                items[n++] = (attn_item){(int64_t)k, h, (int32_t)i0, (int32_t)(ql - i0 < bq ? ql - i0 : bq)};
            }
        }
    }
    unit_begin[u] = n;
    return n;
}

/* Key groups: per row, segments whose key ranges overlap (CP pieces of one sequence share theirs)
 * are one group; perm lists each group's segments. Returns the group count; *max_width is the
 * widest group key range. */
size_t attn_build_groups(const maskpack_layout *L, size_t *perm, attn_kgroup *groups, int64_t *max_width) {
    size_t ng = 0;
    *max_width = 0;
    for (int64_t r = 0; r < L->n_rows; r++) {
        size_t b = mp_row_begin(L, r), e = mp_row_begin(L, r + 1);
        /* insertion sort of this row's segments by kv_start (rows are short or already sorted) */
        for (size_t x = b; x < e; x++) {
            size_t y = x;
            perm[y] = x;
            while (y > b && L->segs[perm[y - 1]].kv_start > L->segs[perm[y]].kv_start) {
                size_t t = perm[y - 1];
                perm[y - 1] = perm[y];
                perm[y] = t;
                y--;
            }
        }
        size_t x = b;
        while (x < e) {
            const maskpack_segment *g = &L->segs[perm[x]];
            attn_kgroup G = {x, x + 1, r, g->kv_start, g->kv_start + g->kv_len, g->q_len};
            x++;
            /* an empty key range inside the group's joins it harmlessly (its queries see nothing) */
            while (x < e && L->segs[perm[x]].kv_start < G.kv_end) {
                const maskpack_segment *h = &L->segs[perm[x]];
                if (h->kv_start + h->kv_len > G.kv_end) G.kv_end = h->kv_start + h->kv_len;
                G.q_rows += h->q_len;
                G.seg_end = ++x;
            }
            if (G.kv_end - G.kv_start > *max_width) *max_width = G.kv_end - G.kv_start;
            groups[ng++] = G;
        }
    }
    return ng;
}

/* The number of groups and the widest one attn_build_groups finds, without its arrays (so a size
 * query allocates nothing). The groups depend only on the order of the key starts, ties in any
 * order: a row whose key starts already rise (every layout the constructors build) is walked in
 * place; any other row in key-start order by repeated selection (quadratic in that row's
 * segments, which only hand-built layouts reach). */
size_t attn_count_groups(const maskpack_layout *L, int64_t *max_width) {
    size_t ng = 0;
    *max_width = 0;
    for (int64_t r = 0; r < L->n_rows; r++) {
        const size_t b = mp_row_begin(L, r), e = mp_row_begin(L, r + 1);
        int sorted = 1;
        for (size_t x = b + 1; x < e && sorted; x++) sorted = L->segs[x - 1].kv_start <= L->segs[x].kv_start;
        int64_t start = 0, end = 0; /* the open group: keys [start, end) */
        int open = 0;
        size_t cur = SIZE_MAX; /* selection: the last segment visited */
        for (size_t step = b; step < e; step++) {
            size_t x = step;
            if (!sorted) { /* the next (kv_start, index) after cur's */
                x = SIZE_MAX;
                for (size_t y = b; y < e; y++) {
                    const int64_t ky = L->segs[y].kv_start;
                    if (cur != SIZE_MAX) {
                        const int64_t kc = L->segs[cur].kv_start;
                        if (ky < kc || (ky == kc && y <= cur)) continue;
                    }
                    if (x == SIZE_MAX || ky < L->segs[x].kv_start) x = y;
                }
                cur = x;
            }
            const maskpack_segment *g = &L->segs[x];
            if (open && g->kv_start < end) {
                if (g->kv_start + g->kv_len > end) end = g->kv_start + g->kv_len;
                continue;
            }
            if (open && end - start > *max_width) *max_width = end - start;
            start = g->kv_start;
            end = g->kv_start + g->kv_len;
            open = 1;
            ng++;
        }
        if (open && end - start > *max_width) *max_width = end - start;
    }
    return ng;
}

/* ---- padding ------------------------------------------------------------------------------------ */

/* Zeroes every row of a [.., W, H, D] tensor view whose column is not covered (mark[col] == 0). */
static void zero_uncovered(const attn_view *v, int64_t n_rows, int64_t width, int64_t heads, int64_t d, size_t esize,
                           const uint8_t *covered /* [n_rows * width] */) {
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t c = 0; c < width; c++) {
            if (covered[r * width + c]) continue;
            for (int64_t h = 0; h < heads; h++) memset(attn_ptr(v, r, c, h, esize), 0, (size_t)d * esize);
        }
}

/* Padding query rows: out (or dq) 0 and lse -inf. */
static void zero_query_padding(const attn_problem *P, const attn_view *o, int with_lse) {
    const maskpack_layout *L = P->L;
    for (int64_t r = 0; r < L->n_rows; r++) {
        int64_t col = 0;
        for (size_t x = mp_row_begin(L, r); x <= mp_row_begin(L, r + 1); x++) {
            int64_t end = x < mp_row_begin(L, r + 1) ? L->segs[x].q_start : L->q_width;
            for (; col < end; col++)
                for (int64_t h = 0; h < P->hq; h++) {
                    memset(attn_ptr(o, r, col, h, P->esize), 0, (size_t)P->d * P->esize);
                    if (with_lse) *(float *)attn_ptr(&P->lse, r, col, h, sizeof(float)) = -INFINITY;
                }
            if (x < mp_row_begin(L, r + 1)) col = L->segs[x].q_start + L->segs[x].q_len;
        }
    }
}

size_t attn_units(const attn_problem *P) { return P->L->n_segments * (size_t)P->hkv; }

/* ---- workspace --------------------------------------------------------------------------------- */


static size_t fwd_items_bytes(const attn_problem *P) {
    int64_t n = attn_max_items(P);
    size_t units = P->L->n_segments * (size_t)P->hkv + 1;
    return attn_align_up((size_t)n * sizeof(attn_item)) + attn_align_up(units * sizeof(size_t));
}

maskpack_status attn_fwd_ws_size(const attn_problem *P, size_t *bytes, maskpack_error *err) {
    size_t per = attn_fwd_thread_ws(P), items = fwd_items_bytes(P);
    size_t total = ATTN_WS_ALIGN + items;
    if (per > (SIZE_MAX - total) / (size_t)P->n_threads)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    *bytes = total + per * (size_t)P->n_threads;
    return MASKPACK_OK;
}

/* Tail units of the backward's dynamic mode (see attn_bwd_job), when there are enough units for
 * that mode and more than one thread: n_threads - 1 of them, the most the whole units can leave
 * the threads apart by (one unit each), so on a quiet machine the tail fills that gap and only one
 * pack and reduction per tail unit is added. */
static int64_t bwd_tail_units(const attn_problem *P, int64_t n_units) {
    return P->n_threads > 1 && n_units >= 2 * (int64_t)P->n_threads ? P->n_threads - 1 : 0;
}


maskpack_status attn_bwd_ws_size(const attn_problem *P, size_t *bytes, maskpack_error *err) {
    const maskpack_layout *L = P->L;
    size_t n = L->n_segments ? L->n_segments : 1;
    int64_t w; /* the exact widest group (the per-thread workspace grows with it) */
    size_t ng = attn_count_groups(L, &w);
    size_t per = attn_bwd_thread_ws(P, w);
    size_t total = ATTN_WS_ALIGN + attn_align_up(n * sizeof(size_t)) + attn_align_up(n * sizeof(attn_kgroup)) +
                   attn_align_up((size_t)(L->n_rows * (L->q_width > L->kv_width ? L->q_width : L->kv_width))) +
                   attn_align_up(attn_bwd_tail_bytes(P, w, bwd_tail_units(P, (int64_t)ng * P->hkv)));
    if (per > (SIZE_MAX - total) / (size_t)P->n_threads)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    *bytes = total + per * (size_t)P->n_threads;
    return MASKPACK_OK;
}

/* ---- forward ------------------------------------------------------------------------------------- */

/* items / unit_begin: fwd_items_bytes' arrays (attn_max_items, units + 1). */
void attn_plan_fwd(const attn_problem *P, attn_item *items, size_t *unit_begin, attn_fwd_plan *F) {
    F->kern = attn_fwd_entry(P);
    F->n_items = fill_items(P, P->bf16 ? F->kern->bq_bf16 : ATTN_BQ, items, unit_begin);
    F->items = items;
    F->unit_begin = unit_begin;
    F->n_units = attn_units(P);
    int nt = P->n_threads;
    if ((size_t)nt > F->n_items) nt = F->n_items ? (int)F->n_items : 1;
    F->nt = nt;
    /* whole units per share when there are enough of them to keep every share busy */
    F->by_unit = F->n_units >= 4 * (size_t)nt;
    /* the last nt - 1 units item by item: on a quiet machine the whole units leave the threads at
     * most one unit apart, which that tail fills without a second thread packing its keys */
    F->n_whole = F->by_unit ? F->n_units - (size_t)(nt - 1) : 0;
}

/* Validated, planned and with its workspace (thr: P->n_threads areas of attn_fwd_thread_ws bytes):
 * from here on only writes. */
void attn_exec_fwd(const attn_problem *P, const attn_fwd_plan *F, const mp_run *run, char *thr) {
    /* claims: whole units [0, n_whole), then the rest item by item (attn_fwd_claim) */
    mp_claim claim;
    mp_claim_init(&claim,
                  F->by_unit ? (int64_t)(F->n_whole + F->n_items - F->unit_begin[F->n_whole]) : (int64_t)F->n_items);
    attn_fwd_job job = {P,          F->items,   F->n_items, &claim, thr, attn_fwd_thread_ws(P), F->unit_begin,
                        F->n_units, F->by_unit, F->n_whole};
    zero_query_padding(P, &P->out, P->have_lse);
    if (F->n_items) run_shares(run, F->nt, P->bf16 ? F->kern->fwd_bf16 : F->kern->fwd_f32, &job);
}

/* The plain and _on calls: the work list carved from the workspace (attn_fwd_ws_size's layout). start:
 * no team given, start one of the plan's threads for this call (one that cannot start leaves the
 * work to the caller, with the same results). */
maskpack_status attn_fwd_call(attn_problem *P, maskpack_workers *team, int start, void *workspace,
                              size_t workspace_bytes, maskpack_error *err) {
    size_t need = 0;
    maskpack_status s = attn_fwd_ws_size(P, &need, err);
    if (s) return s;
    void *owned = NULL;
    if ((s = mp_take_workspace(workspace, workspace_bytes, need, "maskpack_attention_forward_workspace", &workspace,
                               &owned, err)))
        return s;
    char *ws = (char *)(((uintptr_t)workspace + ATTN_WS_ALIGN - 1) & ~(uintptr_t)(ATTN_WS_ALIGN - 1));
    size_t *unit_begin = (size_t *)(ws + attn_align_up((size_t)attn_max_items(P) * sizeof(attn_item)));
    attn_fwd_plan F;
    attn_plan_fwd(P, (attn_item *)ws, unit_begin, &F);
    mp_run run;
    mp_run_begin(&run, team, start ? F.nt : 1, F.nt);
    attn_exec_fwd(P, &F, &run, ws + fwd_items_bytes(P));
    mp_run_end(&run);
    free(owned);
    return mp_ok(err);
}


/* ---- backward ------------------------------------------------------------------------------------ */

size_t attn_covered_bytes(const maskpack_layout *L) { return (size_t)(L->n_rows * L->kv_width); }

void attn_plan_bwd(const attn_problem *P, size_t *perm, attn_kgroup *groups, uint8_t *covered, attn_bwd_plan *B) {
    const maskpack_layout *L = P->L;
    B->kern = attn_bwd_entry(P);
    B->ng = attn_build_groups(L, perm, groups, &B->max_width);
    B->perm = perm;
    B->groups = groups;
    B->covered = covered;
    B->per = attn_bwd_thread_ws(P, B->max_width);
    B->n_tail = bwd_tail_units(P, (int64_t)B->ng * P->hkv);
    memset(covered, 0, attn_covered_bytes(L));
    for (size_t g = 0; g < B->ng; g++)
        if (groups[g].kv_end > groups[g].kv_start)
            memset(covered + groups[g].row * L->kv_width + groups[g].kv_start, 1,
                   (size_t)(groups[g].kv_end - groups[g].kv_start));
}

/* Validated, planned and with its workspace (tail_acc: attn_bwd_tail_bytes; thr: P->n_threads areas of
 * B->per bytes): from here on only writes. */
void attn_exec_bwd(const attn_problem *P0, const attn_bwd_plan *B, const mp_run *run, float *tail_acc, char *thr) {
    attn_problem P = *P0;
    const maskpack_layout *L = P.L;
    /* padding: dq rows of pad queries, dk/dv rows of keys no segment owns */
    zero_query_padding(&P, &P.dq, 0);
    zero_uncovered(&P.dk, L->n_rows, L->kv_width, P.hkv, P.d, P.esize, B->covered);
    zero_uncovered(&P.dv, L->n_rows, L->kv_width, P.hkv, P.d, P.esize, B->covered);

    /* groups list their segments through perm (seg_begin / seg_end index perm) */
    attn_bwd_job job;
    memset(&job, 0, sizeof job);
    mp_claim claim;
    job.P = &P;
    job.groups = B->groups;
    job.n_groups = B->ng;
    job.n_units = (int64_t)B->ng * P.hkv;
    job.claim = &claim;
    job.ws = thr;
    job.ws_stride = B->per;
    /* the reference kernel has no reductions: it neither splits units nor keeps a tail */
    const attn_thread_fn fn = B->kern->run, tail_reduce = B->kern->tail_reduce;
    void (*const reduce)(const attn_bwd_job *, int64_t) = B->kern->reduce;
    const int vector = reduce != NULL;
    job.unit = -1;
    /* units: dynamic over the shares when there are enough of them, else one at a time with their
     * query blocks split over the shares (each share accumulates dk/dv privately, then they are
     * summed in share order: deterministic) */
    int nt = P.n_threads;
    if (job.n_units == 0) nt = 1;
    job.split = nt > 1 && job.n_units < 2 * (int64_t)nt && vector;
    P.n_threads = nt;
    job.n_threads = nt;
    job.perm = B->perm;
    /* the tail pieces (n_tail is 0 unless the dynamic mode runs on several shares) */
    job.n_whole = vector && !job.split ? job.n_units - B->n_tail : job.n_units;
    job.tail_acc = tail_acc;
    job.max_width = B->max_width;
    /* claims of the dynamic mode: whole units [0, n_whole), then each tail unit's pieces */
    mp_claim_init(&claim, job.n_whole + (job.n_units - job.n_whole) * ATTN_BWD_TAIL_CHUNKS);
    if (job.n_units > 0) {
        if (!job.split) {
            run_shares(run, nt, fn, &job);
            if (job.n_whole < job.n_units) run_shares(run, nt, tail_reduce, &job);
        } else {
            for (int64_t u = 0; u < job.n_units; u++) {
                job.unit = u;
                run_shares(run, nt, fn, &job);
                reduce(&job, u);
            }
        }
    }
}

/* The plain and _on calls: groups, covered and the rest carved from the workspace (attn_bwd_ws_size's
 * layout); start as for attn_fwd_call. */
maskpack_status attn_bwd_call(attn_problem *P, maskpack_workers *team, int start, void *workspace,
                              size_t workspace_bytes, maskpack_error *err) {
    size_t need = 0;
    maskpack_status s = attn_bwd_ws_size(P, &need, err);
    if (s) return s;
    void *owned = NULL;
    if ((s = mp_take_workspace(workspace, workspace_bytes, need, "maskpack_attention_backward_workspace", &workspace,
                               &owned, err)))
        return s;
    const maskpack_layout *L = P->L;
    char *ws = (char *)(((uintptr_t)workspace + ATTN_WS_ALIGN - 1) & ~(uintptr_t)(ATTN_WS_ALIGN - 1));
    size_t n = L->n_segments ? L->n_segments : 1;
    size_t *perm = (size_t *)ws;
    ws += attn_align_up(n * sizeof(size_t));
    attn_kgroup *groups = (attn_kgroup *)ws;
    ws += attn_align_up(n * sizeof(attn_kgroup));
    uint8_t *covered = (uint8_t *)ws;
    int64_t wmax_grid = L->q_width > L->kv_width ? L->q_width : L->kv_width;
    ws += attn_align_up((size_t)(L->n_rows * wmax_grid));
    attn_bwd_plan B;
    attn_plan_bwd(P, perm, groups, covered, &B);
    float *tail_acc = (float *)ws;
    ws += attn_align_up(attn_bwd_tail_bytes(P, B.max_width, B.n_tail));
    const int64_t n_units = (int64_t)B.ng * P->hkv;
    mp_run run;
    mp_run_begin(&run, team, start ? P->n_threads : 1, n_units > 0 ? P->n_threads : 0);
    attn_exec_bwd(P, &B, &run, tail_acc, ws);
    mp_run_end(&run);
    free(owned);
    return mp_ok(err);
}
