/* internal.h: helpers shared by every part of libmaskpack (never installed). */
#ifndef MASKPACK_INTERNAL_H
#define MASKPACK_INTERNAL_H

#include "maskpack.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The layout object. Segments are sorted by (row, q_start); rows index them through row_begin. */
struct maskpack_layout {
    int64_t n_rows, q_width, kv_width;
    int packed; /* per-token outputs are [T] rather than [B,S] */
    int self;   /* every segment has kv == q */
    size_t n_segments;
    maskpack_segment *segs;
    size_t *row_begin; /* [n_rows + 1]: segments of row r are [row_begin[r], row_begin[r+1]); NULL when
                            * there are no segments (all zero, so a layout of 2^50 empty rows costs
                            * nothing): read it through mp_row_begin */
    /* rule (owned copies) */
    int causal;
    maskpack_alignment alignment;
    int64_t window_left, window_right;
    maskpack_span *spans; /* sorted by (segment, start) */
    size_t n_spans;
    size_t *span_begin; /* [n_segments + 1]: spans of segment k are [span_begin[k], span_begin[k+1]) */
    int64_t *prefix;    /* [n_segments] or NULL */
    /* cached totals */
    int64_t n_tokens, max_q, max_kv;
};

/* ---- errors ---------------------------------------------------------------------------- */

/* Fills *err (if non-NULL) and returns status. index0/1: first offending element, -1 = n/a. */
maskpack_status mp_fail(maskpack_error *err, maskpack_status status, const char *argument, int64_t index0,
                        int64_t index1, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
/* Same with four index slots (batch, head, query, key). */
maskpack_status mp_fail4(maskpack_error *err, maskpack_status status, const char *argument, const int64_t idx[4],
                         const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
/* Marks *err as success (if non-NULL) and returns MASKPACK_OK. */
maskpack_status mp_ok(maskpack_error *err);

#define MP_CHECK_NULL(err, ptr, name)                                                                                  \
    do {                                                                                                               \
        if ((ptr) == NULL)                                                                                             \
            return mp_fail((err), MASKPACK_ERR_NULL_ARGUMENT, (name), -1, -1,                                          \
                           "%s: expected a non-NULL pointer, found NULL", (name));                                     \
    } while (0)

/* ---- worker team (workers.c) ---------------------------------------------------------------- */

/* Parallel work shared dynamically: fn takes work items from a counter in ctx until none are left,
 * and must be correct however many participants run it (tid identifies the participant). The
 * kernels and moves do not call it directly: they run through the run layer below (mp_run_for). */
typedef maskpack_task_fn mp_work_fn; /* (ctx, participant index) */
/* Runs fn on the caller (tid 0) and on every worker of w that joins before the caller's fn returns
 * (w NULL: the caller alone); returns when every participant has left fn, with their writes
 * visible. Never waits for a worker that has not started. */
void mp_workers_run(maskpack_workers *w, mp_work_fn fn, void *ctx);

/* ---- the run layer (run.c) ------------------------------------------------------------------ */

/* The one claim of the library: items [0, n) taken one at a time from a shared counter by whichever
 * participants run, each exactly once (mp_run_for's, and the attention kernels' item loops inside a
 * share, which map the claimed index to their work: whole units, then tail items or pieces). */
typedef struct mp_claim {
    _Atomic int64_t next;
    int64_t n;
} mp_claim;
static inline void mp_claim_init(mp_claim *c, int64_t n) {
    atomic_init(&c->next, 0);
    c->n = n;
}
/* (claim) -> 1 with *i the next index not yet taken, 0 when none is left */
static inline int mp_claim_take(mp_claim *c, int64_t *i) {
    *i = atomic_fetch_add(&c->next, 1);
    return *i < c->n;
}
/* every later take finds none left */
static inline void mp_claim_stop(mp_claim *c) { atomic_store(&c->next, c->n); }

/* An item: (ctx, claimed index in [0, n_items), participant in [0, the team's threads)) -> its
 * status. The participant indexes per-thread scratch: no two participants run at once under one
 * index. The function maps the index to the work (heaviest first, groups, shares). */
typedef maskpack_status (*mp_item_fn)(void *ctx, int64_t item, int participant);

/* The team a call's items run on: the caller's, one started for the call, or NULL (the caller). */
typedef struct mp_run {
    maskpack_workers *team;
    maskpack_workers *started; /* the team started for this call, freed by mp_run_end */
} mp_run;

/* Begins a call: on team when given; else, with n_threads > 1 and max_items > 1, on a team of
 * min(n_threads, max_items) threads started for the call (the one per-call team start of the
 * kernels and moves; one the system cannot start leaves every item to the caller, with the same
 * results); else the caller alone. Not an error whatever happens. */
void mp_run_begin(mp_run *r, maskpack_workers *team, int n_threads, int64_t max_items);
/* The checked form, for calls that hold one team across many runs (the context-parallel entry
 * points without a team): n_threads outside [1, MASKPACK_MAX_THREADS] is MASKPACK_ERR_INVALID_ARGUMENT
 * naming "n_threads"; 1 runs on the caller; else a team of n_threads, whose allocation failing is
 * MASKPACK_ERR_OUT_OF_MEMORY (then nothing is held). */
maskpack_status mp_run_begin_checked(mp_run *r, int n_threads, maskpack_error *err);
/* Frees the team started for the call, if any. */
void mp_run_end(mp_run *r);
/* Runs fn once for every item in [0, n_items), claimed one at a time in index order; returns when
 * every participant is done, with their writes visible. With one item, no team or a team of one,
 * the caller runs them in order. An item's failure stops the claims (items already claimed finish)
 * and is returned: the status of the lowest failing index; MASKPACK_OK when none failed. */
maskpack_status mp_run_for(const mp_run *r, int64_t n_items, mp_item_fn fn, void *ctx);
/* Same, with guided claims (n_items < 2^32): the caller (participant 0) takes from the front and the
 * workers from the back, each take 1/threads of what is left, so a steady team runs the same items
 * on the same cores call after call (the moves: each core finds its bytes still in its own L2).
 * After a failure nothing more is taken; the status returned is the lowest failing index's of those
 * that ran. */
maskpack_status mp_run_for_guided(const mp_run *r, int64_t n_items, mp_item_fn fn, void *ctx);
/* mp_run_begin(team, n_threads, n_items), mp_run_for, mp_run_end: a call of one parallel loop. */
maskpack_status mp_parallel_for(maskpack_workers *team, int n_threads, int64_t n_items, mp_item_fn fn, void *ctx);

/* An op's workspace, kept between its runs for the calls that bring none. */
typedef struct mp_op_ws {
    pthread_mutex_t mu; /* held by the run using mem; a concurrent run allocates its own */
    void *mem;
    size_t bytes;
} mp_op_ws;
void mp_op_ws_init(mp_op_ws *k);
void mp_op_ws_free(mp_op_ws *k);
/* (kept workspace, bytes a run keeps, the call's workspace and its bytes) -> 1 when the call brings
 * none (NULL and 0) and no other run holds the kept one: it is now the call's (grown to keep bytes
 * when smaller, the old block freed; an allocation that fails leaves none, and the call then
 * allocates its own, and fails, as any other) in *workspace / *workspace_bytes, to give back with
 * mp_op_ws_release after the run. Else 0, the arguments untouched. */
int mp_op_ws_take(mp_op_ws *k, size_t keep, void **workspace, size_t *workspace_bytes);
void mp_op_ws_release(mp_op_ws *k);

/* (n_threads, the argument's name) -> OK when in [1, MASKPACK_MAX_THREADS], else
 * MASKPACK_ERR_INVALID_ARGUMENT naming the argument: the one thread limit of every call. */
maskpack_status mp_check_threads(int n_threads, const char *name, maskpack_error *err);

/* ---- checked arithmetic ------------------------------------------------------------------ */

static inline bool mp_add_overflow(int64_t a, int64_t b, int64_t *r) { return __builtin_add_overflow(a, b, r); }
static inline bool mp_mul_overflow(int64_t a, int64_t b, int64_t *r) { return __builtin_mul_overflow(a, b, r); }

/* The one checked multiply for allocation sizes: (a, b) -> true when a * b does not fit size_t
 * (then *r = SIZE_MAX, which no allocator grants), else false with *r = a * b. Every `count * size`
 * handed to an allocator in src/ goes through it, directly or through the helpers below
 * (tools/check_alloc_sizes.py, run by the test suite, refuses an unchecked `*` in an allocation). */
static inline bool mp_mul_size(size_t a, size_t b, size_t *r) {
    if (__builtin_mul_overflow(a, b, r)) {
        *r = SIZE_MAX;
        return true;
    }
    return false;
}
/* malloc of n elements of `size` bytes: NULL when n * size overflows (as when memory runs out);
 * n == 0 allocates one byte, so an empty array is a valid pointer, never a NULL read as failure. */
void *mp_alloc_array(size_t n, size_t size);

/* For a short branch-free scan over 64-bit integers (a minimum, a count) that baseline x86-64 cannot
 * vectorize (no 64-bit compare before SSE4.2/AVX2): compiled for AVX-512, AVX2 and the baseline, the
 * loader picking one for this CPU (GCC/Clang function multiversioning). Not under AddressSanitizer,
 * whose instrumentation and ifunc resolvers do not mix on every toolchain. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute) && defined(__linux__)
#if __has_attribute(target_clones) && !defined(__SANITIZE_ADDRESS__)
#define MP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef MP_CLONES
#define MP_CLONES
#endif
/* calloc of n elements of `size` bytes (zeroed), n == 0 as one element; NULL on overflow. */
void *mp_calloc_array(size_t n, size_t size);
/* realloc of p to n elements of `size` bytes; NULL (p untouched) on overflow or exhaustion. */
void *mp_realloc_array(void *p, size_t n, size_t size);

/* The one workspace convention of the kernels: (caller's workspace of workspace_bytes, bytes the
 * call needs, the size query's name for messages) -> *base = the caller's workspace, or with NULL
 * and 0 a fresh allocation of need bytes, also returned in *owned for the caller to free (else
 * *owned = NULL). NULL with a size: MASKPACK_ERR_NULL_ARGUMENT; fewer bytes than needed:
 * MASKPACK_ERR_BUFFER_TOO_SMALL naming the size needed. Called after every other check, so a
 * failed call writes nothing. */
maskpack_status mp_take_workspace(void *workspace, size_t workspace_bytes, size_t need, const char *query, void **base,
                                  void **owned, maskpack_error *err);

/* Carving a workspace: every buffer a call needs (per-thread scratch, work lists) is cut from the
 * one caller-owned block in an order the code fixes, so the size query and the call agree by
 * construction: the query runs the same carving over mp_carve_counter() (no memory, nothing
 * allocated) and reports mp_carve_size(). Offsets are relative to the block's first 64-byte
 * boundary, which mp_carve_size's slack guarantees inside any block of that size. */
typedef struct mp_carve {
    char *base;   /* 64-byte aligned start, NULL while only counting */
    size_t used;  /* bytes carved so far */
    int overflow; /* a size did not fit size_t: the query reports MASKPACK_ERR_OVERFLOW */
} mp_carve;
#define MP_CARVE_SLACK 64
static inline mp_carve mp_carve_counter(void) {
    mp_carve c = {NULL, 0, 0};
    return c;
}
/* (block of at least mp_carve_size bytes, any alignment) -> its carving. */
static inline mp_carve mp_carve_over(void *block) {
    uintptr_t p = (uintptr_t)block;
    mp_carve c = {(char *)block + ((MP_CARVE_SLACK - (p & (MP_CARVE_SLACK - 1))) & (MP_CARVE_SLACK - 1)), 0, 0};
    return c;
}
/* (carving, n elements of `size` bytes, alignment: a power of two <= 64) -> their memory (NULL while
 * counting or after an overflow). */
static inline void *mp_carve_take(mp_carve *c, size_t n, size_t size, size_t align) {
    size_t bytes, at = (c->used + align - 1) & ~(align - 1);
    if (at < c->used || mp_mul_size(n, size, &bytes) || bytes > SIZE_MAX - MP_CARVE_SLACK - at) {
        c->overflow = 1;
        c->used = SIZE_MAX - MP_CARVE_SLACK;
        return NULL;
    }
    c->used = at + bytes;
    return c->base && !c->overflow ? c->base + at : NULL;
}
/* (carving) -> the bytes a block must have for it: what was carved plus the alignment slack. */
static inline size_t mp_carve_size(const mp_carve *c) { return c->used + MP_CARVE_SLACK; }

/* ---- tensors ----------------------------------------------------------------------------- */

/* numel of t, or -1 when a dimension is negative or the product overflows int64. */
int64_t mp_numel(const maskpack_tensor *t);
/* (stride of dimension d + 1, extent of d + 1) -> stride of dimension d for a C-order tensor: the
 * product, a non-positive extent counting as 1, saturated at INT64_MAX (empty or oversized shapes,
 * which never index memory or are rejected by mp_numel). */
int64_t mp_stride_step(int64_t stride, int64_t dim);

/* Validates rank and dtype class of t: ndim in [min_ndim, max_ndim], shape >= 0, numel fits,
 * data non-NULL when numel > 0. `name` is used in the message. */
maskpack_status mp_check_tensor(const maskpack_tensor *t, const char *name, int32_t min_ndim, int32_t max_ndim,
                                maskpack_error *err);

/* (ndim, shape) -> "[d0, d1, ...]" in buf (truncated to cap bytes), for messages. */
void mp_format_shape(char *buf, size_t cap, int32_t ndim, const int64_t *shape);

/* 1 for integer/bool dtypes, 0 for floats. */
int mp_dtype_is_integer(maskpack_dtype d);

/* Element address for a multi-index (idx has t->ndim entries). */
static inline void *mp_elem_ptr(const maskpack_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int32_t d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
    return (char *)t->data + off * (int64_t)maskpack_dtype_size(t->dtype);
}

/* Reads one element at linear element offset `off` (already multiplied by strides) as int64 / double.
 * Floats read as int64 are truncated; callers that need 0/1 checks use mp_read_f64. */
/* Writes v at linear element offset `off` converted to dtype d (floats: exact for small ints).
 * Inline: per-token loops call them with a loop-invariant dtype, which the compiler then hoists. */

/* fp16 / bf16 conversions (round to nearest even). */
uint16_t mp_f32_to_f16(float f);
float mp_f16_to_f32(uint16_t h);
uint16_t mp_f32_to_bf16(float f);
float mp_bf16_to_f32(uint16_t h);

static inline double mp_read_f64(maskpack_dtype d, const void *base, int64_t off);
static inline void mp_write_f64(maskpack_dtype d, void *base, int64_t off, double v);

static inline int64_t mp_read_i64(maskpack_dtype d, const void *base, int64_t off) {
    switch (d) {
    case MASKPACK_BOOL:
    case MASKPACK_U8: return ((const uint8_t *)base)[off];
    case MASKPACK_I8: return ((const int8_t *)base)[off];
    case MASKPACK_I16: return ((const int16_t *)base)[off];
    case MASKPACK_I32: return ((const int32_t *)base)[off];
    case MASKPACK_I64: return ((const int64_t *)base)[off];
    default: {
        double v = mp_read_f64(d, base, off);
        if (!(v >= -9.2e18 && v <= 9.2e18)) return v > 0 ? INT64_MAX : INT64_MIN; /* NaN -> INT64_MIN */
        return (int64_t)v;
    }
    }
}

static inline double mp_read_f64(maskpack_dtype d, const void *base, int64_t off) {
    switch (d) {
    case MASKPACK_F16: return mp_f16_to_f32(((const uint16_t *)base)[off]);
    case MASKPACK_BF16: return mp_bf16_to_f32(((const uint16_t *)base)[off]);
    case MASKPACK_F32: return ((const float *)base)[off];
    case MASKPACK_F64: return ((const double *)base)[off];
    default: return (double)mp_read_i64(d, base, off);
    }
}

static inline void mp_write_i64(maskpack_dtype d, void *base, int64_t off, int64_t v) {
    switch (d) {
    case MASKPACK_BOOL: ((uint8_t *)base)[off] = v != 0; break;
    case MASKPACK_U8: ((uint8_t *)base)[off] = (uint8_t)v; break;
    case MASKPACK_I8: ((int8_t *)base)[off] = (int8_t)v; break;
    case MASKPACK_I16: ((int16_t *)base)[off] = (int16_t)v; break;
    case MASKPACK_I32: ((int32_t *)base)[off] = (int32_t)v; break;
    case MASKPACK_I64: ((int64_t *)base)[off] = v; break;
    default: mp_write_f64(d, base, off, (double)v); break;
    }
}

static inline void mp_write_f64(maskpack_dtype d, void *base, int64_t off, double v) {
    switch (d) {
    case MASKPACK_F16: ((uint16_t *)base)[off] = mp_f32_to_f16((float)v); break;
    case MASKPACK_BF16: ((uint16_t *)base)[off] = mp_f32_to_bf16((float)v); break;
    case MASKPACK_F32: ((float *)base)[off] = (float)v; break;
    case MASKPACK_F64: ((double *)base)[off] = v; break;
    default: mp_write_i64(d, base, off, (int64_t)v); break;
    }
}


/* MASKPACK_ERR_OVERLAP when two elements of t may share memory (a zero stride, as in an expanded
 * tensor, or strides interleaved so that one dimension steps inside another's span): an output
 * like that has every thread write the same bytes. */
maskpack_status mp_check_no_self_overlap(const maskpack_tensor *t, const char *name, maskpack_error *err);

/* Byte extent [lo, hi) of t's elements, strides of either sign; lo == hi == 0 for a tensor without
 * elements or data. */
void mp_tensor_extent(const maskpack_tensor *t, uintptr_t *lo, uintptr_t *hi);
/* 1 when the byte extents of a and b (NULL: none) meet: the one overlap test of outputs against
 * inputs and other outputs (each caller words its own MASKPACK_ERR_OVERLAP). */
int mp_tensors_overlap(const maskpack_tensor *a, const maskpack_tensor *b);
/* The test itself, on extents already at hand: both non-empty and meeting. */
static inline int mp_extents_meet(uintptr_t a0, uintptr_t a1, uintptr_t b0, uintptr_t b1) {
    return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

/* Checks an output tensor: dtype in `allowed` (bitmask of 1u << dtype), exact shape (ndim, shape),
 * no element sharing memory with another (mp_check_no_self_overlap). `name` is used in messages. */
maskpack_status mp_check_output(const maskpack_tensor *t, const char *name, uint32_t allowed_dtypes, int32_t ndim,
                                const int64_t *shape, maskpack_error *err);

/* Per-token output shape of a layout: [T] for packed layouts, [B,S] otherwise. An out tensor of
 * shape [1,T] is also accepted for packed layouts. Returns OK or a SHAPE/DTYPE error. */
maskpack_status mp_check_per_token_output(const maskpack_layout *L, const maskpack_tensor *t, const char *name,
                                          uint32_t allowed_dtypes, maskpack_error *err);
/* Same checks of dtype and shape for a per-token input, which may share memory between elements. */
maskpack_status mp_check_per_token_input(const maskpack_layout *L, const maskpack_tensor *t, const char *name,
                                         uint32_t allowed_dtypes, maskpack_error *err);

#define MP_DT(x)    (1u << (x))
#define MP_DT_INDEX (MP_DT(MASKPACK_I32) | MP_DT(MASKPACK_I64))

/* ---- the token view (token_view.c) --------------------------------------------------------- */

/* A per-token tensor over a layout's token grid, the one view of the kernels (attention, the gated
 * delta rule, the causal conv): element (row, col, head h, d) of [B, S, H, D] / [T, H, D] /
 * [1, T, H, D] (fewer trailing dims: their strides 0) at base + (row * s_row + col * s_col + h * s_h
 * + d * s_d) elements of dt; s_row is 0 on a packed grid (every segment in row 0). base NULL: absent. */
typedef struct mp_token_view {
    char *base;
    maskpack_dtype dt;
    int64_t s_row, s_col, s_h, s_d;
} mp_token_view;
/* (tensor already checked against the grid, its token dims lead: 2 for [B, S, ...] or [1, T, ...],
 * 1 for [T, ...]; packed grid?) -> its view. */
void mp_token_view_fill(const maskpack_tensor *t, int lead, int packed, mp_token_view *v);
/* Checks a per-token tensor against L's query grid: [B, S, e...] for a padded layout, [T, e...] or
 * [1, T, e...] for a packed one, with n_extra trailing dims; extra[i] >= 0 must match, extra[i] = -1
 * accepts any size and receives it; dtype in dtypes (float32 / bfloat16 named). Fills the view. */
maskpack_status mp_token_view_check(const maskpack_layout *L, const maskpack_tensor *t, const char *name, int n_extra,
                                    int64_t *extra, uint32_t dtypes, mp_token_view *out, maskpack_error *err);
/* (ndim, shape) -> "[d0, *, ...]" in buf (cap bytes): mp_format_shape with a negative extent (any
 * size accepted) written as "*". */
void mp_format_want_shape(char *buf, size_t cap, int32_t nd, const int64_t *shape);

/* ---- layout internals ---------------------------------------------------------------------- */

/* Builds a layout taking ownership of `segs` (malloc'd, n entries) after validating it. On failure
 * `segs` is freed. The rule is copied (validated against the segments). */
maskpack_status mp_layout_build(maskpack_segment *segs, size_t n, int64_t n_rows, int64_t q_width, int64_t kv_width,
                                int packed, const maskpack_rule *rule, maskpack_layout **out, maskpack_error *err);

/* First segment of row r (r in [0, n_rows]): the index of the row's segments, 0 for a layout without
 * segments (which keeps no index). */
static inline size_t mp_row_begin(const maskpack_layout *L, int64_t r) { return L->row_begin ? L->row_begin[r] : 0; }

/* Builds the layout of an input with no tokens ([B, 0], [0, S], [B, 1, 0, 0]...): n_rows rows of
 * width `width`, no segments. Costs nothing whatever n_rows is: constructors call it instead of
 * visiting rows that hold nothing to read. */
maskpack_status mp_layout_empty(int64_t n_rows, int64_t width, int packed, const maskpack_rule *rule,
                                maskpack_layout **out, maskpack_error *err);

/* Position of query i of segment k on its key axis, i.e. the diagonal key of the causal rule:
 * q_pos - kv_pos + i for explicit-position segments (CP chunks; outside [0, kv_len) for a key block
 * of another chunk), i + kv_len - q_len under bottom-right
 * alignment, i under top-left. */
static inline int64_t mp_query_pos(const maskpack_layout *L, size_t k, int64_t i) {
    const maskpack_segment *g = &L->segs[k];
    if (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) return g->q_pos - g->kv_pos + i;
    return L->alignment == MASKPACK_ALIGN_BOTTOM_RIGHT ? i + g->kv_len - g->q_len : i;
}

/* Position of query i of segment k in the coordinates spans use (key coordinates): q_pos + i for
 * explicit-position segments, i otherwise (spans only exist on self-attention segments). */
static inline int64_t mp_span_pos(const maskpack_layout *L, size_t k, int64_t i) {
    const maskpack_segment *g = &L->segs[k];
    return (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? g->q_pos + i : i;
}

/* Whether t's elements lie C-ordered without gaps (extents of 1 may have any stride): tensors the
 * context-parallel calls send as the bytes lie. */
static inline int mp_is_contiguous(const maskpack_tensor *t) {
    maskpack_tensor c = maskpack_tensor_contiguous(t->data, t->dtype, t->ndim, t->shape);
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->strides[d] != c.strides[d]) return 0;
    return 1;
}

/* 1 when a segment of L holds a key block (MASKPACK_SEGMENT_KEY_BLOCK: one ring step's view). */
static inline int mp_has_key_blocks(const maskpack_layout *L) {
    for (size_t k = 0; k < L->n_segments; k++)
        if (L->segs[k].flags & MASKPACK_SEGMENT_KEY_BLOCK) return 1;
    return 0;
}

/* (comm, p2p) -> OK when rank and size are consistent and the callbacks are set (sendrecv_start and
 * wait too when p2p): the first check of every CP call (src/distributed/cp_comm.c). */
maskpack_status mp_cp_check_comm(const maskpack_comm *comm, int p2p, maskpack_error *err);

/* The agreement every collective CP call starts with (src/distributed/cp_comm.c): one all-gather of
 * each rank's layout fingerprint and of its own argument checks' status `local` (with *err filled when
 * not OK), so every rank returns the same verdict and none waits in a collective another left. */
maskpack_status mp_cp_agree(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                            maskpack_status local, maskpack_error *err);

/* Segment-local predicate (i, j local to segment k of L). */
int mp_allowed_local(const maskpack_layout *L, size_t k, int64_t i, int64_t j);

/* Interval of keys [*lo, *hi) (segment-local) that query i of segment k sees through the base rule
 * (causal + window only), clipped to [0, kv_len). Empty when *lo >= *hi. */
void mp_base_key_range(const maskpack_layout *L, size_t k, int64_t i, int64_t *lo, int64_t *hi);

#endif
