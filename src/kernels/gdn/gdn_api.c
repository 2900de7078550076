/* gdn_api.c: the public Gated DeltaNet rule calls: validation (fully, before any write), token
 * views through the layout, the kernel table and its dispatch, workspace and the per-call thread team over
 * (segment, head) tasks. The algorithms are in gdn_kernel.inc. */
#include "gdn_common.h"
#include "../kernel_table.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

maskpack_gdn_options maskpack_gdn_options_default(void) {
    maskpack_gdn_options o;
    memset(&o, 0, sizeof o);
    o.scale = 0.0;
    o.chunked = 1;
    o.l2norm = 1;
    o.n_threads = 1;
    o.isa = MASKPACK_GDN_ISA_AUTO;
    return o;
}

/* ---- the kernel table ------------------------------------------------------------------------ */

/* The rule's kernels: one per ISA, each the framework of gdn_kernel.inc over its micro-kernels
 * (GEMMs, exp, transpose, the chunk inverse). The rule has no AVX512-BF16 or AMX kernel: a request
 * for them runs the AVX-512 entry (mp_kernel_pick takes the best entry below). */
#define GDN_ENTRY(ISA, sfx, transpose, expv)                                                                   \
    {{MASKPACK_KERNEL_GDN, ISA, "gdn/" #sfx, GDN_FLOAT_DTYPES, GDN_FLOAT_DTYPES}, gdn_ws_floats_fwd,             \
     gdn_ws_floats_bwd, gdn_fwd_chunk_##sfx, gdn_fwd_recurrent_##sfx, gdn_bwd_chunk_##sfx, gdn_gemm_##sfx,       \
     gdn_gemm_x_##sfx, gdn_inv_lower_##sfx, transpose, expv}
static const gdn_kernel GDN_KERNELS[] = {
    GDN_ENTRY(MASKPACK_ISA_REF, ref, NULL, NULL),
    GDN_ENTRY(MASKPACK_ISA_AVX2, avx2, gdn_transpose_avx2, gdn_expv_avx2),
    GDN_ENTRY(MASKPACK_ISA_AVX512, avx512, gdn_transpose_avx512, gdn_expv_avx512),
};
enum { N_GDN_KERNELS = sizeof GDN_KERNELS / sizeof GDN_KERNELS[0] };

const gdn_kernel *gdn_kernels(size_t *n) {
    *n = N_GDN_KERNELS;
    return GDN_KERNELS;
}

const mp_kernel_desc *gdn_kernel_desc(size_t i) { return i < N_GDN_KERNELS ? &GDN_KERNELS[i].desc : NULL; }

maskpack_status maskpack_gdn_resolve_isa(maskpack_gdn_isa requested, maskpack_gdn_isa *resolved,
                                         maskpack_error *err) {
    MP_CHECK_NULL(err, resolved, "resolved");
    return maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, requested, resolved, err);
}

/* ---- validation ------------------------------------------------------------------------------ */

static maskpack_status check_options(const maskpack_gdn_options *in, maskpack_gdn_options *o, const gdn_kernel **kern,
                                     maskpack_error *err) {
    *o = in ? *in : maskpack_gdn_options_default();
    if (!(o->scale == o->scale) || o->scale > 1e30 || o->scale < -1e30)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "opts.scale", -1, -1,
                       "opts.scale: expected a finite number (0 = 1/sqrt(K)), found %g", o->scale);
    if (o->chunked != 0 && o->chunked != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "opts.chunked", -1, -1,
                       "opts.chunked: expected 0 or 1, found %d", o->chunked);
    if (o->l2norm != 0 && o->l2norm != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "opts.l2norm", -1, -1,
                       "opts.l2norm: expected 0 or 1, found %d", o->l2norm);
    if (o->n_threads < 1 || o->n_threads > GDN_MAX_THREADS)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "opts.n_threads", -1, -1,
                       "opts.n_threads: expected in [1, %d], found %d", GDN_MAX_THREADS, o->n_threads);
    size_t i;
    maskpack_status s = mp_kernel_pick(MASKPACK_KERNEL_GDN, MASKPACK_F32, o->isa, &i, err);
    if (s) return s;
    *kern = &GDN_KERNELS[i];
    return MASKPACK_OK;
}

/* Validates the rule's inputs and fills the problem's dimensions and input views. */
static maskpack_status check_inputs(const maskpack_layout *L, const maskpack_gdn_inputs *in, const maskpack_gdn_options *o,
                                    gdn_problem *P, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, in, "inputs");
    MP_CHECK_NULL(err, in->q, "q");
    MP_CHECK_NULL(err, in->k, "k");
    MP_CHECK_NULL(err, in->v, "v");
    MP_CHECK_NULL(err, in->g, "g");
    MP_CHECK_NULL(err, in->beta, "beta");
    memset(P, 0, sizeof *P);
    P->L = L;
    const uint32_t fl = GDN_FLOAT_DTYPES;
    int64_t qd[2] = {-1, -1}, vd[2] = {-1, -1}, hd[1];
    maskpack_status s = gdn_token_view(L, in->q, "q", 2, qd, fl, &P->q, err);
    if (s) return s;
    if (qd[0] < 1 || qd[1] < 1)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "q", -1, -1,
                       "q: expected at least one head and a head dim >= 1 ([.., H, K]), found H = %lld, K = %lld",
                       (long long)qd[0], (long long)qd[1]);
    int64_t kd[2] = {qd[0], qd[1]};
    if ((s = gdn_token_view(L, in->k, "k", 2, kd, fl, &P->k, err))) return s;
    if ((s = gdn_token_view(L, in->v, "v", 2, vd, fl, &P->v, err))) return s;
    if (vd[0] < 1 || vd[1] < 1)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1,
                       "v: expected at least one head and a head dim >= 1 ([.., HV, V]), found HV = %lld, V = %lld",
                       (long long)vd[0], (long long)vd[1]);
    if (vd[0] % qd[0] != 0)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1,
                       "v: expected the value heads HV to be a multiple of the key heads H = %lld, found HV = %lld",
                       (long long)qd[0], (long long)vd[0]);
    hd[0] = vd[0];
    if ((s = gdn_token_view(L, in->g, "g", 1, hd, fl, &P->g, err))) return s;
    if ((s = gdn_token_view(L, in->beta, "beta", 1, hd, fl, &P->beta, err))) return s;
    P->H = qd[0];
    P->K = qd[1];
    P->HV = vd[0];
    P->V = vd[1];
    P->G = P->HV / P->H;
    P->Kp = (P->K + 15) & ~(int64_t)15;
    P->Vp = (P->V + 15) & ~(int64_t)15;
    int64_t t;
    if (mp_mul_overflow(P->Kp + P->Vp, P->Kp + P->Vp, &t) || mp_mul_overflow(t, 64 * (P->G + 4), &t))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "q", -1, -1, "q, v: head dims K = %lld, V = %lld are too large",
                       (long long)P->K, (long long)P->V);
    if (in->initial_state &&
        (s = gdn_state_view(L, in->initial_state, "initial_state", P->HV, P->K, P->V, &P->h0, err)))
        return s;
    /* the largest workspace (backward: GDN_BWD_MAX_SLOTS + 2 states per value head of a group, per
     * thread, whatever the segment lengths) must be addressable: refuse absurd sizes before any
     * size_t arithmetic can wrap */
    {
        const double est = (double)GDN_MAX_THREADS * 4.0 *
                           ((double)P->G * (GDN_BWD_MAX_SLOTS + 4.0) * (double)P->K * (double)P->Vp +
                            64.0 * (double)GDN_C * (double)(P->Kp + P->Vp + GDN_C));
        if (est > 9.0e18)
            return mp_fail(err, MASKPACK_ERR_OVERFLOW, "q", -1, -1,
                           "q, v: workspace for K = %lld, V = %lld and %lld value heads per key head overflows",
                           (long long)P->K, (long long)P->V, (long long)P->G);
    }
    P->scale = o->scale != 0.0 ? (float)o->scale : (float)(1.0 / sqrt((double)P->K));
    P->l2norm = o->l2norm;
    P->bwd_slots = GDN_BWD_SLOTS;
    return MASKPACK_OK;
}

static size_t ws_bytes_per_thread(const gdn_kernel *kern, const gdn_problem *P, int backward, int chunked) {
    size_t f = backward ? kern->ws_floats_bwd(P) : kern->ws_floats_fwd(P, chunked);
    return f * sizeof(float);
}

static maskpack_status total_ws(const gdn_kernel *kern, const gdn_problem *P, int backward, int chunked,
                                int n_threads, size_t *bytes, maskpack_error *err) {
    size_t per = ws_bytes_per_thread(kern, P, backward, chunked);
    if (per > SIZE_MAX / (size_t)n_threads - 128)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    *bytes = per * (size_t)n_threads + 64; /* + alignment slack */
    return MASKPACK_OK;
}

static maskpack_status check_slots(int slots, gdn_problem *P, maskpack_error *err) {
    if (slots != 0 && (slots < 2 || slots > GDN_BWD_MAX_SLOTS))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "slots", -1, -1,
                       "slots: expected 0 or in [2, %d], found %d", GDN_BWD_MAX_SLOTS, slots);
    P->bwd_slots = slots ? slots : GDN_BWD_SLOTS;
    return MASKPACK_OK;
}

maskpack_status gdn_workspace_size_slots(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                         const maskpack_gdn_options *opts, int backward, int slots, size_t *bytes,
                                         maskpack_error *err) {
    MP_CHECK_NULL(err, bytes, "bytes");
    maskpack_gdn_options o;
    const gdn_kernel *kern = NULL;
    gdn_problem P;
    maskpack_status s = check_options(opts, &o, &kern, err);
    if (s) return s;
    if ((s = check_inputs(layout, in, &o, &P, err))) return s;
    if ((s = check_slots(slots, &P, err))) return s;
    size_t b = 0;
    if ((s = total_ws(kern, &P, backward != 0, o.chunked, o.n_threads, &b, err))) return s;
    *bytes = b;
    return mp_ok(err);
}

maskpack_status maskpack_gdn_workspace_size(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                            const maskpack_gdn_options *opts, int backward, size_t *bytes,
                                            maskpack_error *err) {
    return gdn_workspace_size_slots(layout, in, opts, backward, 0, bytes, err);
}

/* ---- the thread team ------------------------------------------------------------------------- */

typedef struct task {
    int64_t len;
    size_t seg;
    int64_t head;
} task;

static int task_cmp(const void *a, const void *b) {
    const task *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first: better balance */
    if (x->seg != y->seg) return x->seg < y->seg ? -1 : 1;
    return x->head < y->head ? -1 : (x->head > y->head);
}

typedef struct team {
    const gdn_problem *P;
    gdn_task_fn fn;
    const task *tasks;
    size_t n_tasks;
    atomic_size_t next;
    char *ws;
    size_t ws_stride;
} team;

typedef struct member {
    team *T;
    int id;
} member;

static void *member_main(void *arg) {
    member *m = arg;
    team *T = m->T;
    float *ws = (float *)(T->ws + (size_t)m->id * T->ws_stride);
    for (;;) {
        size_t i = atomic_fetch_add(&T->next, 1);
        if (i >= T->n_tasks) break;
        T->fn(T->P, T->tasks[i].seg, T->tasks[i].head, ws);
    }
    return NULL;
}

/* The (segment, head < n_heads) tasks, longest segment first. Allocated before any output is
 * written so that running them cannot fail.
 *
 * Within a run of equally long tasks (in segment, head order: memory order of their outputs) the
 * run is cut into n_threads contiguous parts and dealt out part by part: part 0's first task, part
 * 1's first, ..., part 0's second, ... The team takes tasks in list order, so while the threads
 * keep pace each works through its own part of the outputs: their first writes fault in
 * different pages (fresh output buffers: the kernel clears each page, 2 MiB with huge pages, on its
 * first touch) instead of two threads faulting, and clearing, the same page at the same moment.
 * Which thread runs a task never changes its results. */
static maskpack_status make_tasks(const gdn_problem *P, int64_t n_heads, int n_threads, task **out, size_t *n_out,
                                  maskpack_error *err) {
    const maskpack_layout *L = P->L;
    size_t n = L->n_segments * (size_t)n_heads;
    *out = NULL;
    *n_out = n;
    if (n == 0) return MASKPACK_OK;
    task *tasks = mp_alloc_array(n, sizeof *tasks);
    task *tmp = n_threads > 1 ? mp_alloc_array(n, sizeof *tmp) : NULL;
    if (!tasks || (n_threads > 1 && !tmp)) {
        free(tasks);
        free(tmp);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "tasks", -1, -1, "out of memory for %zu tasks", n);
    }
    size_t i = 0;
    for (size_t s = 0; s < L->n_segments; s++)
        for (int64_t h = 0; h < n_heads; h++) tasks[i++] = (task){L->segs[s].q_len, s, h};
    qsort(tasks, n, sizeof *tasks, task_cmp);
    if (tmp) {
        for (size_t r0 = 0; r0 < n;) {
            size_t r1 = r0 + 1;
            while (r1 < n && tasks[r1].len == tasks[r0].len) r1++;
            /* run [r0, r1): part p is [r0 + p * len / nt, r0 + (p + 1) * len / nt) */
            const size_t len = r1 - r0, nt = (size_t)n_threads;
            size_t w = r0;
            for (size_t j = 0; w < r1; j++)
                for (size_t p = 0; p < nt && w < r1; p++) {
                    const size_t lo = r0 + p * len / nt, hi = r0 + (p + 1) * len / nt;
                    if (lo + j < hi) tmp[w++] = tasks[lo + j];
                }
            r0 = r1;
        }
        memcpy(tasks, tmp, n * sizeof *tasks);
        free(tmp);
    }
    *out = tasks;
    return MASKPACK_OK;
}

/* Runs fn over the tasks on n_threads threads (the caller's included). Results do not depend on
 * which thread runs a task; a thread that fails to start leaves its tasks to the others. */
static void run_team(const gdn_problem *P, gdn_task_fn fn, const task *tasks, size_t n, int n_threads, char *ws,
                     size_t ws_stride) {
    if (n == 0) return;
    team T;
    T.P = P;
    T.fn = fn;
    T.tasks = tasks;
    T.n_tasks = n;
    atomic_init(&T.next, 0);
    T.ws = ws;
    T.ws_stride = ws_stride;
    int nt = n_threads;
    if ((size_t)nt > n) nt = (int)n;
    member mem[GDN_MAX_THREADS];
    pthread_t th[GDN_MAX_THREADS];
    int started = 0;
    for (int t = 0; t < nt; t++) mem[t] = (member){&T, t};
    for (int t = 1; t < nt; t++) {
        if (pthread_create(&th[t], NULL, member_main, &mem[t]) != 0) break;
        started = t;
    }
    member_main(&mem[0]);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
}

/* Workspace: the caller's (checked) or our own; returns the 64-byte aligned base. */
static maskpack_status get_ws(const gdn_kernel *kern, const gdn_problem *P, int backward, int chunked, int n_threads,
                              void *workspace, size_t workspace_bytes, void **owned, char **base, size_t *stride,
                              maskpack_error *err) {
    size_t need = 0;
    maskpack_status s = total_ws(kern, P, backward, chunked, n_threads, &need, err);
    if (s) return s;
    *stride = ws_bytes_per_thread(kern, P, backward, chunked);
    void *b;
    if ((s = mp_take_workspace(workspace, workspace_bytes, need, "maskpack_gdn_workspace_size", &b, owned, err)))
        return s;
    *base = (char *)b;
    uintptr_t p = (uintptr_t)*base;
    *base += (64 - (p & 63)) & 63;
    return MASKPACK_OK;
}

/* ---- forward and backward -------------------------------------------------------------------- */

maskpack_status maskpack_gdn_forward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                     const maskpack_gdn_options *opts, maskpack_tensor *o, maskpack_tensor *final_state,
                                     void *workspace, size_t workspace_bytes, maskpack_error *err) {
    maskpack_gdn_options op;
    const gdn_kernel *kern = NULL;
    gdn_problem P;
    maskpack_status s = check_options(opts, &op, &kern, err);
    if (s) return s;
    if ((s = check_inputs(layout, in, &op, &P, err))) return s;
    MP_CHECK_NULL(err, o, "o");
    int64_t od[2] = {P.HV, P.V};
    if ((s = gdn_token_view(layout, o, "o", 2, od, GDN_FLOAT_DTYPES, &P.o, err))) return s;
    if (final_state && (s = gdn_state_view(layout, final_state, "final_state", P.HV, P.K, P.V, &P.ht, err))) return s;
    const maskpack_tensor *ins[6] = {in->q, in->k, in->v, in->g, in->beta, in->initial_state};
    const char *names[2] = {"o", "final_state"};
    maskpack_tensor *outs[2] = {o, final_state};
    if ((s = gdn_check_overlap(ins, 6, outs, names, 2, err))) return s;
    void *owned;
    char *base;
    size_t stride;
    task *tasks;
    size_t n_tasks;
    if ((s = make_tasks(&P, op.chunked ? P.H : P.HV, op.n_threads, &tasks, &n_tasks, err))) return s;
    if ((s = get_ws(kern, &P, 0, op.chunked, op.n_threads, workspace, workspace_bytes, &owned, &base, &stride, err))) {
        free(tasks);
        return s;
    }
    /* validated and allocated: from here on only writes */
    gdn_zero_pads(layout, &P.o, P.HV, P.V);
    run_team(&P, op.chunked ? kern->fwd_chunk : kern->fwd_recurrent, tasks, n_tasks, op.n_threads, base, stride);
    free(tasks);
    free(owned);
    return mp_ok(err);
}

maskpack_status gdn_backward_slots(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                   const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                   const maskpack_gdn_options *opts, maskpack_gdn_grads *grads, void *workspace,
                                   size_t workspace_bytes, int slots, maskpack_error *err) {
    maskpack_gdn_options op;
    const gdn_kernel *kern = NULL;
    gdn_problem P;
    maskpack_status s = check_options(opts, &op, &kern, err);
    if (s) return s;
    if ((s = check_inputs(layout, in, &op, &P, err))) return s;
    if ((s = check_slots(slots, &P, err))) return s;
    MP_CHECK_NULL(err, d_o, "d_o");
    MP_CHECK_NULL(err, grads, "grads");
    int64_t vd[2] = {P.HV, P.V}, qd[2] = {P.H, P.K}, hd[1] = {P.HV};
    if ((s = gdn_token_view(layout, d_o, "d_o", 2, vd, GDN_FLOAT_DTYPES, &P.dO, err))) return s;
    if (d_final_state &&
        (s = gdn_state_view(layout, d_final_state, "d_final_state", P.HV, P.K, P.V, &P.dht, err)))
        return s;
    if (grads->dq && (s = gdn_token_view(layout, grads->dq, "dq", 2, qd, GDN_FLOAT_DTYPES, &P.dq, err))) return s;
    if (grads->dk && (s = gdn_token_view(layout, grads->dk, "dk", 2, qd, GDN_FLOAT_DTYPES, &P.dk, err))) return s;
    if (grads->dv && (s = gdn_token_view(layout, grads->dv, "dv", 2, vd, GDN_FLOAT_DTYPES, &P.dv, err))) return s;
    if (grads->dg && (s = gdn_token_view(layout, grads->dg, "dg", 1, hd, GDN_FLOAT_DTYPES, &P.dg, err))) return s;
    if (grads->dbeta && (s = gdn_token_view(layout, grads->dbeta, "dbeta", 1, hd, GDN_FLOAT_DTYPES, &P.dbeta, err)))
        return s;
    if (grads->d_initial_state && (s = gdn_state_view(layout, grads->d_initial_state, "d_initial_state", P.HV, P.K,
                                                      P.V, &P.dh0, err)))
        return s;
    const maskpack_tensor *ins[8] = {in->q, in->k, in->v, in->g, in->beta, in->initial_state, d_o, d_final_state};
    const char *names[6] = {"dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
    maskpack_tensor *outs[6] = {grads->dq, grads->dk, grads->dv, grads->dg, grads->dbeta, grads->d_initial_state};
    if ((s = gdn_check_overlap(ins, 8, outs, names, 6, err))) return s;
    void *owned;
    char *base;
    size_t stride;
    task *tasks;
    size_t n_tasks;
    if ((s = make_tasks(&P, P.H, op.n_threads, &tasks, &n_tasks, err))) return s;
    if ((s = get_ws(kern, &P, 1, 1, op.n_threads, workspace, workspace_bytes, &owned, &base, &stride, err))) {
        free(tasks);
        return s;
    }
    if (P.dq.base) gdn_zero_pads(layout, &P.dq, P.H, P.K);
    if (P.dk.base) gdn_zero_pads(layout, &P.dk, P.H, P.K);
    if (P.dv.base) gdn_zero_pads(layout, &P.dv, P.HV, P.V);
    if (P.dg.base) gdn_zero_pads(layout, &P.dg, P.HV, 1);
    if (P.dbeta.base) gdn_zero_pads(layout, &P.dbeta, P.HV, 1);
    run_team(&P, kern->bwd_chunk, tasks, n_tasks, op.n_threads, base, stride);
    free(tasks);
    free(owned);
    return mp_ok(err);
}

maskpack_status maskpack_gdn_backward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                      const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                      const maskpack_gdn_options *opts, maskpack_gdn_grads *grads, void *workspace,
                                      size_t workspace_bytes, maskpack_error *err) {
    return gdn_backward_slots(layout, in, d_o, d_final_state, opts, grads, workspace, workspace_bytes, 0, err);
}
