/* attn_plan.h: the attention driver's inside, shared by its three files: the kernel table
 * (attn_table.c), the plan (attn_plan.c: work items, key groups, claims, workspace, padding, runs)
 * and the API (attn_api.c: validation, entry points, the op). Kernels never include it: what they
 * see is attn_internal.h (the problem, the rule geometry, the claims). Never installed. */
#ifndef MASKPACK_ATTN_PLAN_H
#define MASKPACK_ATTN_PLAN_H

#include "attn_internal.h"
#include "../kernel_table.h"

#define ATTN_DTYPES (MP_DT(MASKPACK_F32) | MP_DT(MASKPACK_BF16))

/* One backward: its per-thread workspace, its tail partials and their reductions (NULL for the
 * reference, which neither splits units nor keeps a tail). */
typedef struct attn_bwd_kernel {
    size_t (*ws)(const attn_problem *P, int64_t max_width);
    size_t (*tail_bytes)(const attn_problem *P, int64_t max_width, int64_t n_tail);
    attn_thread_fn run, tail_reduce;
    void (*reduce)(const attn_bwd_job *job, int64_t u);
} attn_bwd_kernel;

/* One attention kernel: its ISA, dtypes and micro-kernels, a forward and a backward per dtype. */
typedef struct attn_kernel {
    mp_kernel_desc desc;
    size_t (*fwd_ws)(const attn_problem *P);
    attn_thread_fn fwd_f32, fwd_bf16;
    int32_t bq_bf16; /* query rows per block of the bf16 forward (f32: ATTN_BQ) */
    attn_bwd_kernel bwd_f32, bwd_bf16;
} attn_kernel;

/* ---- the table (attn_table.c) ------------------------------------------------------------------ */

/* (isa) -> its entry (the reference for one not in the table). */
const attn_kernel *attn_entry(maskpack_isa isa);
/* (problem) -> the forward's entry: P->isa's, except that avx512 runs bf16 on the AVX512-BF16 entry
 * where its dot products pay (mp_cpu_bf16_dots_fast). */
const attn_kernel *attn_fwd_entry(const attn_problem *P);
/* (problem) -> the backward P's dtype runs: P->isa's entry's for that dtype. */
const attn_bwd_kernel *attn_bwd_entry(const attn_problem *P);
/* (requested isa, q's dtype) -> P->isa: the table entry the call runs, or the pick's error. */
maskpack_status attn_pick_isa(attn_problem *P, maskpack_isa isa, maskpack_dtype dtype, maskpack_error *err);
/* Bytes per share of the forward / backward, and of the backward's tail partials: the largest among
 * the entries this CPU runs, so one size serves whichever entry a call selects. */
size_t attn_fwd_thread_ws(const attn_problem *P);
size_t attn_bwd_thread_ws(const attn_problem *P, int64_t max_width);
size_t attn_bwd_tail_bytes(const attn_problem *P, int64_t max_width, int64_t n_tail);

/* ---- the plan (attn_plan.c) -------------------------------------------------------------------- */

#define ATTN_WS_ALIGN 64
static inline size_t attn_align_up(size_t x) { return (x + ATTN_WS_ALIGN - 1) & ~(size_t)(ATTN_WS_ALIGN - 1); }

/* A forward planned: its kernel, work list and how the shares deal it out. */
typedef struct attn_fwd_plan {
    const attn_kernel *kern;
    const attn_item *items;
    const size_t *unit_begin;
    size_t n_items, n_units, n_whole;
    int nt, by_unit;
} attn_fwd_plan;

/* A backward planned: its kernel, key groups (through perm), the key columns some group owns
 * (covered, [n_rows * kv_width]: the others get dk = dv = 0) and the per-share workspace. */
typedef struct attn_bwd_plan {
    const attn_bwd_kernel *kern;
    const size_t *perm;
    const attn_kgroup *groups;
    const uint8_t *covered;
    size_t ng, per;
    int64_t max_width, n_tail;
} attn_bwd_plan;

/* (problem) -> the most forward work items (segment, head, block) any entry's block height gives:
 * what the work list's array holds. */
int64_t attn_max_items(const attn_problem *P);
/* (problem) -> (segment, key head) units: n_segments * hkv. */
size_t attn_units(const attn_problem *P);
/* (layout) -> bytes of the backward's covered-key map [n_rows * kv_width]. */
size_t attn_covered_bytes(const maskpack_layout *L);
/* Bytes of the plain and _on calls' workspace (the work list or groups, then the shares' areas). */
maskpack_status attn_fwd_ws_size(const attn_problem *P, size_t *bytes, maskpack_error *err);
maskpack_status attn_bwd_ws_size(const attn_problem *P, size_t *bytes, maskpack_error *err);
/* Plans into the caller's arrays; executes a plan on a run (validated: only writes from here on). */
void attn_plan_fwd(const attn_problem *P, attn_item *items, size_t *unit_begin, attn_fwd_plan *F);
void attn_exec_fwd(const attn_problem *P, const attn_fwd_plan *F, const mp_run *run, char *thr);
void attn_plan_bwd(const attn_problem *P, size_t *perm, attn_kgroup *groups, uint8_t *covered, attn_bwd_plan *B);
void attn_exec_bwd(const attn_problem *P0, const attn_bwd_plan *B, const mp_run *run, float *tail_acc, char *thr);
/* The plain (start: a per-call team) and _on (team) calls: plan, workspace, run. */
maskpack_status attn_fwd_call(attn_problem *P, maskpack_workers *team, int start, void *workspace,
                              size_t workspace_bytes, maskpack_error *err);
maskpack_status attn_bwd_call(attn_problem *P, maskpack_workers *team, int start, void *workspace,
                              size_t workspace_bytes, maskpack_error *err);

#endif
