/* gdn_api.c: the public Gated DeltaNet rule calls: validation (fully, before any write), token
 * views through the layout, the kernel table and its dispatch, the workspace (per-thread areas and
 * the (segment, head) work list, carved from one block) and the run of the tasks on a worker team;
 * and the operator object, which plans all of that once per layout. The algorithms are in
 * gdn_kernel.inc. */
#include "gdn_common.h"
#include "../kernel_table.h"

#include <stdlib.h>
#include <string.h>

maskpack_gdn_options maskpack_gdn_options_default(void) {
    maskpack_gdn_options o;
    memset(&o, 0, sizeof o);
    o.scale = 0.0;
    o.chunked = 1;
    o.l2norm = 1;
    o.n_threads = 1;
    o.isa = MASKPACK_ISA_AUTO;
    o.skip_gate_check = 0;
    return o;
}

/* ---- the kernel table ------------------------------------------------------------------------ */

/* The rule's kernels: one per ISA, each the framework of gdn_kernel.inc over its micro-kernels
 * (GEMMs, exp, transpose, the chunk inverse). The AVX512-BF16 and AMX entries' kernels are for bf16
 * inputs (their chunk products round the operands to bf16 and multiply them with VDPBF16PS, or on
 * the AMX tiles with TDPBF16PS; the same packed pairs, summed in the same order: gdn_bf16_gemm.h);
 * f32 (or mixed) inputs asking for either run the AVX-512 entry's kernels (kern_for: rounding f32
 * operands would lose what the caller gave), as attention's AVX512-BF16 entry runs f32 on AVX-512.
 * AUTO takes the AMX entry for bf16 inputs (auto_dtypes bf16): a TDPBF16PS does 16 x 16 x 32
 * multiply-adds and Sapphire Rapids issues one per 16 cycles, 512 a cycle against the 32 of two
 * f32 FMAs (peak rates; the packing and the epilogue stay vector code, and the kernel's speed has
 * not been measured on an AMX CPU yet: its tests ran on the emulated tiles), so the products, most
 * of the chunked work, should run several times faster; AUTO runs f32 inputs on the AVX-512 entry
 * (auto_dtypes leaves f32 out). AUTO does not pick the AVX512-BF16 entry (auto_dtypes 0): on the
 * Xeon it was measured on (family 6 model 207), VDPBF16PS retires one instruction per 2 cycles, 16
 * multiply-adds a cycle against the 32 of two f32 FMAs, and the kernel ran at about 0.6x the f32
 * kernel's speed (docs/kernels.md); so on a CPU with AVX512-BF16 but no AMX, AUTO runs bf16 inputs
 * on the AVX-512 entry, converted to f32 on load, and the AVX512-BF16 kernel is asked for by name
 * (isa or MASKPACK_ISA=avx512_bf16; mp_kernel_pick takes an entry AUTO skips only by its own name,
 * and an amx request on such a CPU is refused as any forced ISA the CPU lacks). A CPU whose
 * VDPBF16PS retires one per cycle would make it the faster one there: then AUTO should take it for
 * bf16 (auto_dtypes MP_DT(MASKPACK_BF16)), once measured. Their recurrent forward is the AVX-512
 * one (no products to take in bf16). */
#define GDN_ENTRY(ISA, sfx, transpose, expv)                                                                           \
    {                                                                                                                  \
        {MASKPACK_KERNEL_GDN, ISA, "gdn/" #sfx, GDN_FLOAT_DTYPES, GDN_FLOAT_DTYPES}, gdn_ws_floats_fwd,                \
            gdn_ws_floats_bwd, gdn_fwd_chunk_##sfx, gdn_fwd_recurrent_##sfx, gdn_bwd_chunk_##sfx, gdn_gemm_##sfx,      \
            gdn_gemm_x_##sfx, gdn_inv_lower_##sfx, transpose, expv                                                     \
    }
static const gdn_kernel GDN_KERNELS[] = {
    GDN_ENTRY(MASKPACK_ISA_REF, ref, NULL, NULL),
    GDN_ENTRY(MASKPACK_ISA_AVX2, avx2, gdn_transpose_avx2, gdn_expv_avx2),
    GDN_ENTRY(MASKPACK_ISA_AVX512, avx512, gdn_transpose_avx512, gdn_expv_avx512),
    {{MASKPACK_KERNEL_GDN, MASKPACK_ISA_AVX512_BF16, "gdn/avx512_bf16", GDN_FLOAT_DTYPES, 0},
     gdn_ws_floats_fwd_bf16,
     gdn_ws_floats_bwd_bf16,
     gdn_fwd_chunk_avx512bf16,
     gdn_fwd_recurrent_avx512,
     gdn_bwd_chunk_avx512bf16,
     /* the table's GEMMs are the f32 ones: what f32 inputs run here, and what the context-parallel
      * correction (src/distributed/cp_gdn.c) multiplies its f32 pieces with; the kernels' bf16
      * products are compiled into their own tasks (gdn_gemm_x_avx512bf16, test_gdn_bf16.c) */
     gdn_gemm_avx512,
     gdn_gemm_x_avx512,
     gdn_inv_lower_avx512,
     gdn_transpose_avx512,
     gdn_expv_avx512},
    {{MASKPACK_KERNEL_GDN, MASKPACK_ISA_AMX, "gdn/amx", GDN_FLOAT_DTYPES, MP_DT(MASKPACK_BF16)},
     gdn_ws_floats_fwd_amx,
     gdn_ws_floats_bwd_amx,
     gdn_fwd_chunk_amx,
     gdn_fwd_recurrent_avx512,
     gdn_bwd_chunk_amx,
     /* the f32 GEMMs, as on the AVX512-BF16 entry (its tile products: gdn_gemm_x_amx) */
     gdn_gemm_avx512,
     gdn_gemm_x_avx512,
     gdn_inv_lower_avx512,
     gdn_transpose_avx512,
     gdn_expv_avx512},
};
enum { N_GDN_KERNELS = sizeof GDN_KERNELS / sizeof GDN_KERNELS[0] };

const gdn_kernel *gdn_kernels(size_t *n) {
    *n = N_GDN_KERNELS;
    return GDN_KERNELS;
}

const mp_kernel_desc *gdn_kernel_desc(size_t i) { return i < N_GDN_KERNELS ? &GDN_KERNELS[i].desc : NULL; }

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
    if (o->skip_gate_check != 0 && o->skip_gate_check != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "opts.skip_gate_check", -1, -1,
                       "opts.skip_gate_check: expected 0 or 1, found %d", o->skip_gate_check);
    maskpack_status s = mp_check_threads(o->n_threads, "opts.n_threads", err);
    if (s) return s;
    size_t i;
    s = mp_kernel_pick(MASKPACK_KERNEL_GDN, MASKPACK_F32, o->isa, &i, err);
    if (s) return s;
    *kern = &GDN_KERNELS[i];
    return MASKPACK_OK;
}

/* The dtype that chooses the kernel: bf16 when q, k and v (the operands of the chunk products) all
 * are, else f32 (a bf16 kernel would round f32 operands). */
static maskpack_dtype kernel_dtype(const gdn_problem *P) {
    return P->q.dt == MASKPACK_BF16 && P->k.dt == MASKPACK_BF16 && P->v.dt == MASKPACK_BF16 ? MASKPACK_BF16
                                                                                          : MASKPACK_F32;
}

/* (picked entry, dtype of the inputs) -> the entry whose kernels run them: the AVX-512 entry's for
 * f32 inputs on the AVX512-BF16 or AMX entry (whose own kernels are for bf16), else the entry itself. */
static const gdn_kernel *kern_for(const gdn_kernel *k, maskpack_dtype dt) {
    const int bf16_entry = k->desc.isa == MASKPACK_ISA_AVX512_BF16 || k->desc.isa == MASKPACK_ISA_AMX;
    if (!bf16_entry || dt == MASKPACK_BF16) return k;
    for (size_t i = 0; i < N_GDN_KERNELS; i++)
        if (GDN_KERNELS[i].desc.isa == MASKPACK_ISA_AVX512) return &GDN_KERNELS[i];
    return k;
}

/* (validated options, problem with its input views) -> *kern: the kernels for the inputs' dtype.
 * check_options has picked with f32 already, so the request is known good: the pick cannot fail
 * (both dtypes have the same entries). */
static maskpack_status pick_for_inputs(const maskpack_gdn_options *o, const gdn_problem *P, const gdn_kernel **kern,
                                       maskpack_error *err) {
    size_t i;
    const maskpack_dtype dt = kernel_dtype(P);
    maskpack_status s = mp_kernel_pick(MASKPACK_KERNEL_GDN, dt, o->isa, &i, err);
    if (s) return s;
    *kern = kern_for(&GDN_KERNELS[i], dt);
    return MASKPACK_OK;
}

/* Fills the problem's derived dims (G, Kp, Vp) from H, K, HV, V (each >= 1, HV a multiple of H)
 * and refuses head dims whose internal products overflow. */
static maskpack_status check_dims(gdn_problem *P, maskpack_error *err) {
    P->G = P->HV / P->H;
    P->Kp = (P->K + 15) & ~(int64_t)15;
    P->Vp = (P->V + 15) & ~(int64_t)15;
    int64_t t;
    if (mp_mul_overflow(P->Kp + P->Vp, P->Kp + P->Vp, &t) || mp_mul_overflow(t, 64 * (P->G + 4), &t))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "q", -1, -1, "q, v: head dims K = %lld, V = %lld are too large",
                       (long long)P->K, (long long)P->V);
    return MASKPACK_OK;
}

/* Refuses dims whose largest workspace could not be addressed, before any size_t arithmetic on it. */
static maskpack_status check_ws_bound(const gdn_problem *P, maskpack_error *err) {
    /* backward: GDN_BWD_MAX_SLOTS + 2 states per value head of a group, per thread, whatever the
     * segment lengths */
    const double est = (double)MASKPACK_MAX_THREADS * 4.0 *
                       ((double)P->G * (GDN_BWD_MAX_SLOTS + 4.0) * (double)P->K * (double)P->Vp +
                        64.0 * (double)GDN_C * (double)(P->Kp + P->Vp + GDN_C));
    if (est > 9.0e18)
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "q", -1, -1,
                       "q, v: workspace for K = %lld, V = %lld and %lld value heads per key head overflows",
                       (long long)P->K, (long long)P->V, (long long)P->G);
    return MASKPACK_OK;
}

/* Validates the rule's inputs and fills the problem's dimensions and input views. */
static maskpack_status check_inputs(const maskpack_layout *L, const maskpack_gdn_inputs *in,
                                    const maskpack_gdn_options *o, gdn_problem *P, maskpack_error *err) {
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
    maskpack_status s = mp_token_view_check(L, in->q, "q", 2, qd, fl, &P->q, err);
    if (s) return s;
    if (qd[0] < 1 || qd[1] < 1)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "q", -1, -1,
                       "q: expected at least one head and a head dim >= 1 ([.., H, K]), found H = %lld, K = %lld",
                       (long long)qd[0], (long long)qd[1]);
    int64_t kd[2] = {qd[0], qd[1]};
    if ((s = mp_token_view_check(L, in->k, "k", 2, kd, fl, &P->k, err))) return s;
    if ((s = mp_token_view_check(L, in->v, "v", 2, vd, fl, &P->v, err))) return s;
    if (vd[0] < 1 || vd[1] < 1)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1,
                       "v: expected at least one head and a head dim >= 1 ([.., HV, V]), found HV = %lld, V = %lld",
                       (long long)vd[0], (long long)vd[1]);
    if (vd[0] % qd[0] != 0)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1,
                       "v: expected the value heads HV to be a multiple of the key heads H = %lld, found HV = %lld",
                       (long long)qd[0], (long long)vd[0]);
    hd[0] = vd[0];
    if ((s = mp_token_view_check(L, in->g, "g", 1, hd, fl, &P->g, err))) return s;
    if ((s = mp_token_view_check(L, in->beta, "beta", 1, hd, fl, &P->beta, err))) return s;
    P->H = qd[0];
    P->K = qd[1];
    P->HV = vd[0];
    P->V = vd[1];
    if ((s = check_dims(P, err))) return s;
    if (in->initial_state &&
        (s = gdn_state_view(L, in->initial_state, "initial_state", P->HV, P->K, P->V, &P->h0, err)))
        return s;
    if ((s = check_ws_bound(P, err))) return s;
    P->scale = o->scale != 0.0 ? (float)o->scale : (float)(1.0 / sqrt((double)P->K));
    P->l2norm = o->l2norm;
    P->bwd_slots = GDN_BWD_SLOTS;
    return MASKPACK_OK;
}


static maskpack_status check_slots(int slots, gdn_problem *P, maskpack_error *err) {
    if (slots != 0 && (slots < 2 || slots > GDN_BWD_MAX_SLOTS))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "slots", -1, -1, "slots: expected 0 or in [2, %d], found %d",
                       GDN_BWD_MAX_SLOTS, slots);
    P->bwd_slots = slots ? slots : GDN_BWD_SLOTS;
    return MASKPACK_OK;
}

maskpack_status maskpack_gdn_check_gate(const maskpack_layout *layout, const maskpack_tensor *g, maskpack_error *err) {
    MP_CHECK_NULL(err, layout, "layout");
    MP_CHECK_NULL(err, g, "g");
    int64_t hd[1] = {-1};
    gdn_view v;
    maskpack_status s = mp_token_view_check(layout, g, "g", 1, hd, GDN_FLOAT_DTYPES, &v, err);
    if (s || (s = gdn_check_gate_view(layout, &v, hd[0], err))) return s;
    return mp_ok(err);
}

/* ---- work lists and workspace ------------------------------------------------------------------ */

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

/* (layout, heads per segment, threads) -> tasks[0, n_segments * n_heads): the (segment, head)
 * tasks, longest segment first; tmp: as many entries of scratch when n_threads > 1 (else unused).
 * Writes only the memory it is given, so it cannot fail.
 *
 * Within a run of equally long tasks (in segment, head order: memory order of their outputs) the
 * run is cut into n_threads contiguous parts and dealt out part by part: part 0's first task, part
 * 1's first, ..., part 0's second, ... The team takes tasks in list order, so while the threads
 * keep pace each works through its own part of the outputs: their first writes fault in
 * different pages (fresh output buffers: the kernel clears each page, 2 MiB with huge pages, on its
 * first touch) instead of two threads faulting, and clearing, the same page at the same moment.
 * Which thread runs a task never changes its results. */
static void make_tasks(const maskpack_layout *L, int64_t n_heads, int n_threads, task *tasks, task *tmp) {
    const size_t n = L->n_segments * (size_t)n_heads;
    if (n == 0) return;
    size_t i = 0;
    for (size_t s = 0; s < L->n_segments; s++)
        for (int64_t h = 0; h < n_heads; h++) tasks[i++] = (task){L->segs[s].q_len, s, h};
    qsort(tasks, n, sizeof *tasks, task_cmp);
    if (n_threads < 2) return;
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
}

/* The carving of one call's workspace (the size query runs the same carving over a counter):
 * n_threads per-thread areas of `per` bytes (64-byte multiples, so each starts 64-byte aligned),
 * then, unless the call has its work list already (an operator's), the task list and the scratch
 * make_tasks deals it out with. */
typedef struct gdn_ws {
    char *thr;
    task *tasks, *tmp;
} gdn_ws;

static void carve_ws(mp_carve *c, size_t per, int n_threads, size_t n_tasks, gdn_ws *w) {
    w->thr = mp_carve_take(c, (size_t)n_threads, per, 64);
    w->tasks = w->tmp = NULL;
    if (n_tasks == 0) return;
    w->tasks = mp_carve_take(c, n_tasks, sizeof(task), _Alignof(task));
    if (n_threads > 1) w->tmp = mp_carve_take(c, n_tasks, sizeof(task), _Alignof(task));
}

static size_t per_thread_bytes(const gdn_kernel *kern, const gdn_problem *P, int backward, int chunked) {
    size_t f = backward ? kern->ws_floats_bwd(P) : kern->ws_floats_fwd(P, chunked);
    return f * sizeof(float);
}

/* (problem dims, kernel, form, threads, tasks the workspace must hold) -> *bytes. */
static maskpack_status ws_size(const gdn_kernel *kern, const gdn_problem *P, int backward, int chunked, int n_threads,
                               size_t n_tasks, size_t *bytes, maskpack_error *err) {
    mp_carve c = mp_carve_counter();
    gdn_ws w;
    carve_ws(&c, per_thread_bytes(kern, P, backward, chunked), n_threads, n_tasks, &w);
    if (c.overflow) return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    *bytes = mp_carve_size(&c);
    return MASKPACK_OK;
}

/* Tasks per segment: key heads for the chunked forms and the backward, value heads for the
 * recurrent forward. */
static int64_t task_heads(const gdn_problem *P, int backward, int chunked) {
    return backward || chunked ? P->H : P->HV;
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
    if ((s = pick_for_inputs(&o, &P, &kern, err))) return s;
    const int bw = backward != 0;
    size_t b = 0, n_tasks;
    if (mp_mul_size(layout->n_segments, (size_t)task_heads(&P, bw, o.chunked), &n_tasks))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    if ((s = ws_size(kern, &P, bw, o.chunked, o.n_threads, n_tasks, &b, err))) return s;
    *bytes = b;
    return mp_ok(err);
}

maskpack_status maskpack_gdn_workspace_size(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                            const maskpack_gdn_options *opts, int backward, size_t *bytes,
                                            maskpack_error *err) {
    return gdn_workspace_size_slots(layout, in, opts, backward, 0, bytes, err);
}

/* ---- running the tasks ----------------------------------------------------------------------- */

typedef struct gdn_run {
    const gdn_problem *P;
    gdn_task_fn fn;
    const task *tasks;
    char *ws;
    size_t ws_stride;
} gdn_run;

/* Task i in the list's order, in the workspace area of the participant running it (participants
 * are below the threads the workspace was carved for). */
static maskpack_status run_task(void *ctx, int64_t i, int participant) {
    const gdn_run *R = ctx;
    R->fn(R->P, R->tasks[i].seg, R->tasks[i].head, (float *)(R->ws + (size_t)participant * R->ws_stride));
    return MASKPACK_OK;
}

/* How one validated call runs. */
typedef struct gdn_exec {
    const gdn_kernel *kern;
    int backward, chunked;
    int n_threads;          /* workspace areas (every participant's tid is below it) */
    const task *tasks;      /* an operator's work list, or NULL: made here in the workspace */
    size_t n_tasks;         /* its length (with tasks) */
    maskpack_workers *team; /* NULL: the caller, or a team started for the call (start_team) */
    int start_team;         /* 1: no team given; start one of n_threads for this call */
    const char *query;      /* the size query the messages name */
    size_t need_min;        /* an operator's run: the workspace it asks for whatever the dtype (else 0) */
} gdn_exec;

/* Writes 0 to the pad rows of the call's outputs. */
static void zero_outputs(const gdn_problem *P, int backward) {
    const maskpack_layout *L = P->L;
    if (!backward) {
        gdn_zero_pads(L, &P->o, P->HV, P->V);
        return;
    }
    if (P->dq.base) gdn_zero_pads(L, &P->dq, P->H, P->K);
    if (P->dk.base) gdn_zero_pads(L, &P->dk, P->H, P->K);
    if (P->dv.base) gdn_zero_pads(L, &P->dv, P->HV, P->V);
    if (P->dg.base) gdn_zero_pads(L, &P->dg, P->HV, 1);
    if (P->dbeta.base) gdn_zero_pads(L, &P->dbeta, P->HV, 1);
}

/* After validation: the workspace (the caller's, checked, or allocated here: mp_take_workspace),
 * the work list, then only writes. */
static maskpack_status exec_call(const gdn_problem *P, const gdn_exec *X, void *workspace, size_t workspace_bytes,
                                 maskpack_error *err) {
    const size_t per = per_thread_bytes(X->kern, P, X->backward, X->chunked);
    size_t n_tasks = X->n_tasks;
    if (!X->tasks && mp_mul_size(P->L->n_segments, (size_t)task_heads(P, X->backward, X->chunked), &n_tasks))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "workspace", -1, -1, "workspace: size overflows size_t");
    const size_t own_tasks = X->tasks ? 0 : n_tasks;
    size_t need = 0;
    maskpack_status s = ws_size(X->kern, P, X->backward, X->chunked, X->n_threads, own_tasks, &need, err);
    if (s) return s;
    if (need < X->need_min) need = X->need_min;
    void *block, *owned;
    if ((s = mp_take_workspace(workspace, workspace_bytes, need, X->query, &block, &owned, err))) return s;
    mp_carve c = mp_carve_over(block);
    gdn_ws w;
    carve_ws(&c, per, X->n_threads, own_tasks, &w);
    const task *tasks = X->tasks;
    if (!tasks) {
        make_tasks(P->L, task_heads(P, X->backward, X->chunked), X->n_threads, w.tasks, w.tmp);
        tasks = w.tasks;
    }
    /* validated and allocated: from here on only writes */
    zero_outputs(P, X->backward);
    gdn_run R;
    R.P = P;
    R.fn = X->backward ? X->kern->bwd_chunk : X->chunked ? X->kern->fwd_chunk : X->kern->fwd_recurrent;
    R.tasks = tasks;
    R.ws = w.thr;
    R.ws_stride = per;
    /* the tasks in list order, on the team, or (the n_threads entry points) on one of at most
     * n_threads started for the call */
    mp_parallel_for(X->team, X->start_team ? X->n_threads : 1, (int64_t)n_tasks, run_task, &R);
    free(owned);
    return mp_ok(err);
}

/* ---- validation of the calls' tensors ------------------------------------------------------------ */

static maskpack_status check_forward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                     const maskpack_gdn_options *op, maskpack_tensor *o, maskpack_tensor *final_state,
                                     gdn_problem *P, maskpack_error *err) {
    maskpack_status s = check_inputs(layout, in, op, P, err);
    if (s) return s;
    MP_CHECK_NULL(err, o, "o");
    int64_t od[2] = {P->HV, P->V};
    if ((s = mp_token_view_check(layout, o, "o", 2, od, GDN_FLOAT_DTYPES, &P->o, err))) return s;
    if (final_state && (s = gdn_state_view(layout, final_state, "final_state", P->HV, P->K, P->V, &P->ht, err)))
        return s;
    const maskpack_tensor *ins[6] = {in->q, in->k, in->v, in->g, in->beta, in->initial_state};
    const char *names[2] = {"o", "final_state"};
    maskpack_tensor *outs[2] = {o, final_state};
    if ((s = gdn_check_overlap(ins, 6, outs, names, 2, err))) return s;
    /* the values last, once every shape, dtype and overlap is known good */
    return op->skip_gate_check ? MASKPACK_OK : gdn_check_gate_view(layout, &P->g, P->HV, err);
}

static maskpack_status check_backward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                      const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                      const maskpack_gdn_options *op, maskpack_gdn_grads *grads, int slots,
                                      gdn_problem *P, maskpack_error *err) {
    maskpack_status s = check_inputs(layout, in, op, P, err);
    if (s) return s;
    if ((s = check_slots(slots, P, err))) return s;
    MP_CHECK_NULL(err, d_o, "d_o");
    MP_CHECK_NULL(err, grads, "grads");
    int64_t vd[2] = {P->HV, P->V}, qd[2] = {P->H, P->K}, hd[1] = {P->HV};
    if ((s = mp_token_view_check(layout, d_o, "d_o", 2, vd, GDN_FLOAT_DTYPES, &P->dO, err))) return s;
    if (d_final_state && (s = gdn_state_view(layout, d_final_state, "d_final_state", P->HV, P->K, P->V, &P->dht, err)))
        return s;
    if (grads->dq && (s = mp_token_view_check(layout, grads->dq, "dq", 2, qd, GDN_FLOAT_DTYPES, &P->dq, err))) return s;
    if (grads->dk && (s = mp_token_view_check(layout, grads->dk, "dk", 2, qd, GDN_FLOAT_DTYPES, &P->dk, err))) return s;
    if (grads->dv && (s = mp_token_view_check(layout, grads->dv, "dv", 2, vd, GDN_FLOAT_DTYPES, &P->dv, err))) return s;
    if (grads->dg && (s = mp_token_view_check(layout, grads->dg, "dg", 1, hd, GDN_FLOAT_DTYPES, &P->dg, err))) return s;
    if (grads->dbeta &&
        (s = mp_token_view_check(layout, grads->dbeta, "dbeta", 1, hd, GDN_FLOAT_DTYPES, &P->dbeta, err)))
        return s;
    if (grads->d_initial_state &&
        (s = gdn_state_view(layout, grads->d_initial_state, "d_initial_state", P->HV, P->K, P->V, &P->dh0, err)))
        return s;
    const maskpack_tensor *ins[8] = {in->q, in->k, in->v, in->g, in->beta, in->initial_state, d_o, d_final_state};
    const char *names[6] = {"dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
    maskpack_tensor *outs[6] = {grads->dq, grads->dk, grads->dv, grads->dg, grads->dbeta, grads->d_initial_state};
    if ((s = gdn_check_overlap(ins, 8, outs, names, 6, err))) return s;
    return op->skip_gate_check ? MASKPACK_OK : gdn_check_gate_view(layout, &P->g, P->HV, err);
}

/* ---- forward and backward -------------------------------------------------------------------- */

/* The options a call runs with: opts (or the defaults), and with a team its participant count as
 * the thread count (the workspace has one area per participant). */
static maskpack_status call_options(const maskpack_gdn_options *opts, maskpack_workers *team, int on_team,
                                    maskpack_gdn_options *op, const gdn_kernel **kern, maskpack_error *err) {
    maskpack_gdn_options o = opts ? *opts : maskpack_gdn_options_default();
    if (on_team) o.n_threads = maskpack_workers_threads(team);
    return check_options(&o, op, kern, err);
}

static maskpack_status forward_call(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                    const maskpack_gdn_options *opts, maskpack_tensor *o, maskpack_tensor *final_state,
                                    maskpack_workers *team, int on_team, void *workspace, size_t workspace_bytes,
                                    maskpack_error *err) {
    maskpack_gdn_options op;
    const gdn_kernel *kern = NULL;
    gdn_problem P;
    maskpack_status s = call_options(opts, team, on_team, &op, &kern, err);
    if (s) return s;
    if ((s = check_forward(layout, in, &op, o, final_state, &P, err))) return s;
    if ((s = pick_for_inputs(&op, &P, &kern, err))) return s;
    gdn_exec X = {kern, 0, op.chunked, op.n_threads, NULL, 0, team, !on_team, "maskpack_gdn_workspace_size", 0};
    return exec_call(&P, &X, workspace, workspace_bytes, err);
}

maskpack_status maskpack_gdn_forward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                     const maskpack_gdn_options *opts, maskpack_tensor *o, maskpack_tensor *final_state,
                                     void *workspace, size_t workspace_bytes, maskpack_error *err) {
    return forward_call(layout, in, opts, o, final_state, NULL, 0, workspace, workspace_bytes, err);
}

maskpack_status maskpack_gdn_forward_on(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                        const maskpack_gdn_options *opts, maskpack_tensor *o,
                                        maskpack_tensor *final_state, maskpack_workers *team, void *workspace,
                                        size_t workspace_bytes, maskpack_error *err) {
    return forward_call(layout, in, opts, o, final_state, team, 1, workspace, workspace_bytes, err);
}

static maskpack_status backward_call(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                     const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                     const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                     maskpack_workers *team, int on_team, void *workspace, size_t workspace_bytes,
                                     int slots, maskpack_error *err) {
    maskpack_gdn_options op;
    const gdn_kernel *kern = NULL;
    gdn_problem P;
    maskpack_status s = call_options(opts, team, on_team, &op, &kern, err);
    if (s) return s;
    if ((s = check_backward(layout, in, d_o, d_final_state, &op, grads, slots, &P, err))) return s;
    if ((s = pick_for_inputs(&op, &P, &kern, err))) return s;
    gdn_exec X = {kern, 1, 1, op.n_threads, NULL, 0, team, !on_team, "maskpack_gdn_workspace_size", 0};
    return exec_call(&P, &X, workspace, workspace_bytes, err);
}

maskpack_status gdn_backward_slots(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                   const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                   const maskpack_gdn_options *opts, maskpack_gdn_grads *grads, void *workspace,
                                   size_t workspace_bytes, int slots, maskpack_error *err) {
    return backward_call(layout, in, d_o, d_final_state, opts, grads, NULL, 0, workspace, workspace_bytes, slots, err);
}

maskpack_status maskpack_gdn_backward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                      const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                      const maskpack_gdn_options *opts, maskpack_gdn_grads *grads, void *workspace,
                                      size_t workspace_bytes, maskpack_error *err) {
    return backward_call(layout, in, d_o, d_final_state, opts, grads, NULL, 0, workspace, workspace_bytes, 0, err);
}

maskpack_status maskpack_gdn_backward_on(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                         const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                         const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                         maskpack_workers *team, void *workspace, size_t workspace_bytes,
                                         maskpack_error *err) {
    return backward_call(layout, in, d_o, d_final_state, opts, grads, team, 1, workspace, workspace_bytes, 0, err);
}

/* ---- the operator object ----------------------------------------------------------------------- */

/* What a call would plan anew every time, planned once per (layout, shapes, options): the kernel
 * (MASKPACK_ISA read at creation), the sorted and dealt-out work lists of the forward and the
 * backward, the per-thread workspace sizes; and, for runs given no workspace, a workspace kept
 * between runs (a fresh allocation of a few MiB would fault in its pages on every call). */
struct maskpack_gdn_op {
    const maskpack_layout *L; /* the caller's; it outlives the op */
    gdn_problem dims;         /* H, HV, G, K, V, Kp, Vp, bwd_slots (no views) */
    maskpack_gdn_options opts;
    const gdn_kernel *kern, *kern_bf16; /* f32 inputs' and bf16 inputs' (see kernel_dtype) */
    task *fwd, *bwd;                    /* one allocation; bwd == fwd when both forms take key heads */
    size_t n_fwd, n_bwd;
    mp_op_ws ws; /* kept for the runs that bring no workspace */
};

maskpack_status maskpack_gdn_op_create(const maskpack_layout *layout, int64_t H, int64_t HV, int64_t K, int64_t V,
                                       const maskpack_gdn_options *opts, maskpack_gdn_op **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    *out = NULL;
    MP_CHECK_NULL(err, layout, "layout");
    maskpack_gdn_options op;
    const gdn_kernel *kern = NULL;
    maskpack_status s = check_options(opts, &op, &kern, err);
    if (s) return s;
    size_t ib; /* bf16 inputs' entry, from the same (valid) request: see pick_for_inputs */
    if ((s = mp_kernel_pick(MASKPACK_KERNEL_GDN, MASKPACK_BF16, op.isa, &ib, err))) return s;
    if (H < 1 || K < 1)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "q", -1, -1,
                       "q: expected at least one head and a head dim >= 1 ([.., H, K]), found H = %lld, K = %lld",
                       (long long)H, (long long)K);
    if (HV < 1 || V < 1)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1,
                       "v: expected at least one head and a head dim >= 1 ([.., HV, V]), found HV = %lld, V = %lld",
                       (long long)HV, (long long)V);
    if (HV % H != 0)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1,
                       "v: expected the value heads HV to be a multiple of the key heads H = %lld, found HV = %lld",
                       (long long)H, (long long)HV);
    gdn_problem P;
    memset(&P, 0, sizeof P);
    P.L = layout;
    P.H = H, P.HV = HV, P.K = K, P.V = V;
    if ((s = check_dims(&P, err)) || (s = check_ws_bound(&P, err))) return s;
    P.bwd_slots = GDN_BWD_SLOTS;
    size_t n_fwd, n_bwd, n_all;
    const int shared = op.chunked; /* the chunked forward and the backward both take key heads */
    if (mp_mul_size(layout->n_segments, (size_t)task_heads(&P, 0, op.chunked), &n_fwd) ||
        mp_mul_size(layout->n_segments, (size_t)H, &n_bwd) || __builtin_add_overflow(n_fwd, shared ? 0 : n_bwd, &n_all))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "layout", -1, -1, "layout: %zu segments make too many tasks",
                       layout->n_segments);
    size_t n_tmp = op.n_threads > 1 ? (n_fwd > n_bwd ? n_fwd : n_bwd) : 0;
    maskpack_gdn_op *o = calloc(1, sizeof *o);
    task *mem = o ? mp_alloc_array(n_all, sizeof(task)) : NULL;
    task *tmp = mem && n_tmp ? mp_alloc_array(n_tmp, sizeof(task)) : NULL;
    if (!o || !mem || (n_tmp && !tmp)) {
        free(tmp);
        free(mem);
        free(o);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "op", -1, -1, "out of memory for %zu tasks", n_all);
    }
    o->L = layout;
    o->dims = P;
    o->opts = op;
    o->kern = kern_for(kern, MASKPACK_F32);
    o->kern_bf16 = &GDN_KERNELS[ib];
    o->fwd = mem;
    o->n_fwd = n_fwd;
    o->bwd = shared ? mem : mem + n_fwd;
    o->n_bwd = n_bwd;
    make_tasks(layout, task_heads(&P, 0, op.chunked), op.n_threads, o->fwd, tmp);
    if (!shared) make_tasks(layout, H, op.n_threads, o->bwd, tmp);
    free(tmp);
    mp_op_ws_init(&o->ws);
    *out = o;
    return mp_ok(err);
}

void maskpack_gdn_op_free(maskpack_gdn_op *op) {
    if (!op) return;
    mp_op_ws_free(&op->ws);
    free(op->fwd);
    free(op);
}

/* (op, problem dims, form) -> *bytes an operator's run takes: enough for the f32 inputs' kernel
 * and the bf16 inputs' (the size query does not know the run's dtype), whatever the run's dtype,
 * so that a workspace sized by the query serves every run and a smaller one fails every run. */
static maskpack_status op_ws_size(const maskpack_gdn_op *op, const gdn_problem *P, int backward, size_t *bytes,
                                  maskpack_error *err) {
    const int chunked = backward ? 1 : op->opts.chunked;
    size_t b32 = 0, b16 = 0;
    maskpack_status s = ws_size(op->kern, P, backward, chunked, op->opts.n_threads, 0, &b32, err);
    if (!s) s = ws_size(op->kern_bf16, P, backward, chunked, op->opts.n_threads, 0, &b16, err);
    if (s) return s;
    *bytes = b32 > b16 ? b32 : b16;
    return MASKPACK_OK;
}

maskpack_status maskpack_gdn_op_workspace_size(const maskpack_gdn_op *op, int backward, size_t *bytes,
                                               maskpack_error *err) {
    MP_CHECK_NULL(err, op, "op");
    MP_CHECK_NULL(err, bytes, "bytes");
    maskpack_status s = op_ws_size(op, &op->dims, backward != 0, bytes, err);
    return s ? s : mp_ok(err);
}

/* A run's tensors against the op: the dims the inputs give must be the op's. */
static maskpack_status check_op_dims(const maskpack_gdn_op *op, const gdn_problem *P, maskpack_error *err) {
    const gdn_problem *D = &op->dims;
    if (P->H != D->H || P->K != D->K)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "q", -1, -1,
                       "q: expected the op's H = %lld, K = %lld ([.., H, K]), found H = %lld, K = %lld",
                       (long long)D->H, (long long)D->K, (long long)P->H, (long long)P->K);
    if (P->HV != D->HV || P->V != D->V)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "v", -1, -1,
                       "v: expected the op's HV = %lld, V = %lld ([.., HV, V]), found HV = %lld, V = %lld",
                       (long long)D->HV, (long long)D->V, (long long)P->HV, (long long)P->V);
    return MASKPACK_OK;
}

/* A validated run of the op: its work list, the caller's workspace or (NULL and 0) the op's own. */
static maskpack_status op_exec(maskpack_gdn_op *op, const gdn_problem *P, int backward, maskpack_workers *team,
                               void *workspace, size_t workspace_bytes, maskpack_error *err) {
    const int nt = maskpack_workers_threads(team);
    if (nt > op->opts.n_threads)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "team", -1, -1,
                       "team: expected at most the op's %d threads (opts.n_threads), found %d", op->opts.n_threads, nt);
    const gdn_kernel *kern = kernel_dtype(P) == MASKPACK_BF16 ? op->kern_bf16 : op->kern;
    gdn_exec X = {kern,
                  backward,
                  backward ? 1 : op->opts.chunked,
                  op->opts.n_threads,
                  backward ? op->bwd : op->fwd,
                  backward ? op->n_bwd : op->n_fwd,
                  team,
                  0,
                  "maskpack_gdn_op_workspace_size",
                  0};
    /* the op's size whatever the dtype; without a workspace: the op's own, grown to the largest run
     * so far and kept */
    size_t need = 0;
    maskpack_status s = op_ws_size(op, P, backward, &need, err);
    if (s) return s;
    X.need_min = need;
    if (workspace || workspace_bytes) need = 0;
    const int kept = mp_op_ws_take(&op->ws, need, &workspace, &workspace_bytes);
    s = exec_call(P, &X, workspace, workspace_bytes, err);
    if (kept) mp_op_ws_release(&op->ws);
    return s;
}

maskpack_status maskpack_gdn_op_forward(maskpack_gdn_op *op, const maskpack_gdn_inputs *in, maskpack_tensor *o,
                                        maskpack_tensor *final_state, maskpack_workers *team, void *workspace,
                                        size_t workspace_bytes, maskpack_error *err) {
    MP_CHECK_NULL(err, op, "op");
    gdn_problem P;
    maskpack_status s = check_forward(op->L, in, &op->opts, o, final_state, &P, err);
    if (s || (s = check_op_dims(op, &P, err))) return s;
    return op_exec(op, &P, 0, team, workspace, workspace_bytes, err);
}

maskpack_status maskpack_gdn_op_backward(maskpack_gdn_op *op, const maskpack_gdn_inputs *in, const maskpack_tensor *d_o,
                                         const maskpack_tensor *d_final_state, maskpack_gdn_grads *grads,
                                         maskpack_workers *team, void *workspace, size_t workspace_bytes,
                                         maskpack_error *err) {
    MP_CHECK_NULL(err, op, "op");
    gdn_problem P;
    maskpack_status s = check_backward(op->L, in, d_o, d_final_state, &op->opts, grads, 0, &P, err);
    if (s || (s = check_op_dims(op, &P, err))) return s;
    return op_exec(op, &P, 1, team, workspace, workspace_bytes, err);
}
