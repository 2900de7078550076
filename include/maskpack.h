/*
 * maskpack.h: the one public header of libmaskpack.
 *
 * maskpack describes a variable-length training batch once, as a list of segments plus an
 * attention rule (a "layout"), and derives every consumer's input from it: 2D keep masks, 4D
 * masks in each convention, cu_seqlens in the TensorEngine/flash-attn and Ascend NPU forms,
 * position ids, FlexAttention block masks, MagiAttention slices and npu_fusion_attention
 * arguments. Two consumers of one layout can therefore never disagree.
 *
 * Conventions used everywhere in this header (section numbers refer to docs/conventions.md):
 *   - Shapes are written [dim0, dim1, ...], row-major; strides are counted in ELEMENTS.
 *   - Token grid: a layout has n_rows rows of q_width query columns (and kv_width key columns).
 *     A padded batch [B,S] has n_rows = B, q_width = S. A packed (THD) batch of T tokens has
 *     n_rows = 1, q_width = T and is flagged packed, so per-token outputs are [T] instead of [1,T].
 *   - A segment is one sequence: its real query tokens are columns [q_start, q_start+q_len) of its
 *     row, its keys are columns [kv_start, kv_start+kv_len) of the same row of the key grid. For
 *     self-attention (every constructor except the *_qk ones) kv == q.
 *   - Columns that belong to no segment are padding: never attended, never attending.
 *   - Masks: KEEP (1/true = attend or valid), MASKED (1/true = excluded), ADDITIVE (0 = attend,
 *     -inf or the dtype's minimum = excluded), DOC_ID (1-based document id, 0 = pad). An
 *     unannotated 0/1 mask is never accepted: every mask argument carries its convention.
 *   - cu_seqlens: TE form [0, e1, ..., eN] (N+1 entries), NPU form [e1, ..., eN] (N entries).
 *   - Sliding windows use flash-attn's (left, right) convention, -1 = unbounded (section 4).
 *   - Causal alignment is explicit: TOP_LEFT (key j visible iff j <= i) or BOTTOM_RIGHT
 *     (j <= i + kv_len - q_len); they agree when q_len == kv_len (section 3). A rule may say
 *     UNSTATED only where the two agree: a layout with a segment of q_len != kv_len under a causal
 *     rule or a window is then refused (MASKPACK_ERR_CONVENTION naming rule.alignment).
 *
 * Errors: every fallible call returns a maskpack_status. When the caller passes a non-NULL
 * maskpack_error, it receives the code, the offending argument, the first offending element and a
 * message naming expected and found values. On failure no output buffer is written. The library
 * holds no global mutable state; a layout is immutable after construction and may be shared
 * between threads.
 */
#ifndef MASKPACK_H
#define MASKPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(MASKPACK_BUILDING_SHARED)
#define MASKPACK_API __declspec(dllexport)
#elif defined(__GNUC__)
#define MASKPACK_API __attribute__((visibility("default")))
#else
#define MASKPACK_API
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version                                                                                    */
/* ------------------------------------------------------------------------------------------ */

#define MASKPACK_VERSION_MAJOR  0
#define MASKPACK_VERSION_MINOR  1
#define MASKPACK_VERSION_PATCH  0
#define MASKPACK_VERSION_NUMBER (MASKPACK_VERSION_MAJOR * 10000 + MASKPACK_VERSION_MINOR * 100 + MASKPACK_VERSION_PATCH)
#define MASKPACK_VERSION_STRING "0.1.0"

/* () -> MAJOR*10000 + MINOR*100 + PATCH of the library actually linked. */
MASKPACK_API unsigned maskpack_version_number(void);
/* () -> "MAJOR.MINOR.PATCH" of the library actually linked (static storage). */
MASKPACK_API const char *maskpack_version_string(void);

/* ------------------------------------------------------------------------------------------ */
/* Status codes and errors                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef enum maskpack_status {
    MASKPACK_OK = 0,
    MASKPACK_ERR_NULL_ARGUMENT = 1,     /* a required pointer is NULL */
    MASKPACK_ERR_INVALID_ARGUMENT = 2,  /* a scalar argument is out of its range */
    MASKPACK_ERR_SHAPE = 3,             /* a tensor's rank or shape is wrong or disagrees */
    MASKPACK_ERR_DTYPE = 4,             /* a tensor's dtype is not accepted here */
    MASKPACK_ERR_VALUE = 5,             /* an element has a forbidden value (mask not 0/1, negative length) */
    MASKPACK_ERR_UNSORTED = 6,          /* cu_seqlens decrease, or offsets out of order */
    MASKPACK_ERR_HOLE = 7,              /* a padding mask row has a hole (pad inside tokens) */
    MASKPACK_ERR_OVERFLOW = 8,          /* a size or offset overflows its type */
    MASKPACK_ERR_NOT_REPRESENTABLE = 9, /* the input has no layout (or the layout no output) of that kind */
    MASKPACK_ERR_BUFFER_TOO_SMALL = 10, /* an output buffer cannot hold the result */
    MASKPACK_ERR_OUT_OF_MEMORY = 11,
    MASKPACK_ERR_CONVENTION = 12,   /* a mask convention, cu_seqlens form or alignment is missing or unknown */
    MASKPACK_ERR_RULE = 13,         /* the attention rule is invalid (window, span, prefix) */
    MASKPACK_ERR_FORMAT = 14,       /* a file is malformed or lies about its sizes */
    MASKPACK_ERR_IO = 15,           /* the operating system refused a read or write */
    MASKPACK_ERR_UNSUPPORTED = 16,  /* valid input this version does not handle */
    MASKPACK_ERR_NPU_CONTRACT = 17, /* npu_fusion_attention arguments break the operator's contract */
    MASKPACK_ERR_OVERLAP = 18,      /* input and output buffers overlap */
    MASKPACK_ERR_NOT_FOUND = 19,    /* a named entry (file member, tensor) is absent */
    MASKPACK_ERR_COMM = 20,         /* a communicator callback failed (another rank died, a transport error) */
    MASKPACK_STATUS_COUNT_ = 21
} maskpack_status;

/* status -> "MASKPACK_ERR_SHAPE"-style name (static storage; "MASKPACK_ERR_UNKNOWN" if out of range). */
MASKPACK_API const char *maskpack_status_name(maskpack_status status);
/* status -> one-sentence generic description (static storage). */
MASKPACK_API const char *maskpack_status_message(maskpack_status status);

#define MASKPACK_ERROR_MESSAGE_SIZE  320
#define MASKPACK_ERROR_ARGUMENT_SIZE 48

/* Filled by a failing call when the caller passes one; zeroed (status OK) by a successful call. */
typedef struct maskpack_error {
    maskpack_status status;
    int64_t index[4];                            /* first offending element (row, col, ...); -1 = n/a */
    char argument[MASKPACK_ERROR_ARGUMENT_SIZE]; /* the argument's name, e.g. "cu_seqlens" */
    char message[MASKPACK_ERROR_MESSAGE_SIZE];   /* "cu_seqlens[3]: expected >= 17 (non-decreasing), found 12" */
} maskpack_error;

/* ------------------------------------------------------------------------------------------ */
/* Tensors crossing the API (caller-owned memory, never copied unless a function says so)     */
/* ------------------------------------------------------------------------------------------ */

typedef enum maskpack_dtype {
    MASKPACK_BOOL = 0, /* 1 byte, 0 or 1 */
    MASKPACK_U8 = 1,
    MASKPACK_I8 = 2,
    MASKPACK_I16 = 3,
    MASKPACK_I32 = 4,
    MASKPACK_I64 = 5,
    MASKPACK_F16 = 6,  /* IEEE binary16 */
    MASKPACK_BF16 = 7, /* bfloat16 */
    MASKPACK_F32 = 8,
    MASKPACK_F64 = 9,
    MASKPACK_DTYPE_COUNT_ = 10
} maskpack_dtype;

/* dtype -> its size in bytes (0 if unknown). */
MASKPACK_API size_t maskpack_dtype_size(maskpack_dtype dtype);
/* dtype -> "int32"-style name as numpy/torch spell it (static storage). */
MASKPACK_API const char *maskpack_dtype_name(maskpack_dtype dtype);

#define MASKPACK_MAX_DIMS 8

/* A strided view of caller memory. strides are in elements; a NULL-data tensor with numel 0 is legal. */
typedef struct maskpack_tensor {
    void *data;
    maskpack_dtype dtype;
    int32_t ndim;
    int64_t shape[MASKPACK_MAX_DIMS];
    int64_t strides[MASKPACK_MAX_DIMS];
} maskpack_tensor;

/* (data, dtype, ndim, shape) -> a C-contiguous tensor view (strides filled row-major). */
MASKPACK_API maskpack_tensor maskpack_tensor_contiguous(void *data, maskpack_dtype dtype, int32_t ndim,
                                                        const int64_t *shape);

/* ------------------------------------------------------------------------------------------ */
/* The attention rule                                                                         */
/* ------------------------------------------------------------------------------------------ */

typedef enum maskpack_alignment {
    MASKPACK_ALIGN_TOP_LEFT = 0,     /* row i sees keys j <= i (torch SDPA is_causal, NPU mode 2) */
    MASKPACK_ALIGN_BOTTOM_RIGHT = 1, /* row i sees keys j <= i + kv_len - q_len (flash-attn >= 2.1, NPU mode 3) */
    /* not stated: accepted where the alignment cannot matter (every segment has q_len == kv_len or
     * a CP position, or the rule is neither causal nor windowed), stored as BOTTOM_RIGHT; refused
     * elsewhere with MASKPACK_ERR_CONVENTION naming rule.alignment and the segment (index 0) */
    MASKPACK_ALIGN_UNSTATED = 2
} maskpack_alignment;

/* A bidirectional span inside one segment (segment-local, half-open [start, end)): every pair of
 * tokens inside the span may attend each other, on top of the causal rule (HF's blockwise overlay,
 * e.g. the image tokens of a VLM). Only meaningful for self-attention segments. */
typedef struct maskpack_span {
    int64_t segment;
    int64_t start;
    int64_t end;
} maskpack_span;

/*
 * The rule applied inside every segment (local coordinates i = query, j = key, d = kv_len - q_len
 * for BOTTOM_RIGHT, 0 for TOP_LEFT):
 *   base(i,j)   = (!causal || j <= i + d)
 *                 && (window_left  < 0 || j >= i + d - window_left)
 *                 && (window_right < 0 || j <= i + d + window_right)
 *   allowed(i,j)= base(i,j) || (i and j in one span of the segment) || j < prefix[segment]
 * Tokens of different segments never see each other; padding sees nothing and is never seen.
 * For a segment with an explicit position (MASKPACK_SEGMENT_EXPLICIT_POS) read i + d as q_pos + i
 * everywhere above, and "i in a span" as "q_pos + i in the span".
 */
typedef struct maskpack_rule {
    int causal;                   /* 1 = causal, 0 = bidirectional */
    maskpack_alignment alignment; /* only matters where q_len != kv_len */
    int64_t window_left;          /* flash-attn convention; -1 = unbounded */
    int64_t window_right;         /* flash-attn convention; -1 = unbounded */
    const maskpack_span *spans;   /* sorted by (segment, start), non-overlapping; may be NULL */
    size_t n_spans;
    const int64_t *prefix; /* per-segment prefix-LM length (n_prefix == n_segments) or NULL */
    size_t n_prefix;
} maskpack_rule;

/* () -> causal, bottom-right, no window, no spans, no prefix. */
MASKPACK_API maskpack_rule maskpack_rule_default(void);

/* HF sliding_window w (keys j > i - w, w keys including self) -> flash-attn (w-1, w-1). w >= 1. */
MASKPACK_API maskpack_status maskpack_window_from_hf(int64_t w, int64_t *left, int64_t *right, maskpack_error *err);
/* attention-gym window w (i - j <= w, w+1 keys) -> flash-attn (w, w). w >= 0. */
MASKPACK_API maskpack_status maskpack_window_from_gym(int64_t w, int64_t *left, int64_t *right, maskpack_error *err);

/* ------------------------------------------------------------------------------------------ */
/* Layouts                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct maskpack_layout maskpack_layout; /* opaque, immutable once built */

/* One sequence of the batch (see the conventions at the top). */
typedef struct maskpack_segment {
    int64_t row;
    int64_t q_start, q_len;
    int64_t kv_start, kv_len;
    /* With MASKPACK_SEGMENT_EXPLICIT_POS in flags, query i of this segment sits at position q_pos + i
     * of the segment's key sequence and the rule is evaluated there (the diagonal is q_pos + i,
     * spans and prefix are in key coordinates); alignment is then irrelevant. This is how a
     * context-parallel shard keeps the global positions of its chunks. Zero-initialised = off. */
    uint32_t flags;
    int64_t q_pos;
    /* With MASKPACK_SEGMENT_EXPLICIT_POS: the index of the sequence this piece belongs to in the
     * unsharded layout (pieces of one sequence share it). Tensors move between layouts by
     * (sequence, position): sequence = origin for pieces, the segment index otherwise. */
    int64_t origin;
    /* With MASKPACK_SEGMENT_KEY_BLOCK in flags (together with EXPLICIT_POS): the keys are a block of
     * the sequence starting at position kv_pos (key j sits at kv_pos + j), as ring attention sees
     * another rank's chunk. The rule compares positions, so the diagonal of query i is key
     * q_pos + i - kv_pos, which may lie outside [0, kv_len); q_pos need not lie within the keys. The
     * rule may have no spans or prefix on such a segment, and tensors do not move through such a
     * layout (relayout refuses it). Without the flag kv_pos must be 0. */
    int64_t kv_pos;
} maskpack_segment;

#define MASKPACK_SEGMENT_EXPLICIT_POS 1u
#define MASKPACK_SEGMENT_KEY_BLOCK    2u /* with EXPLICIT_POS: keys are a block at kv_pos (see kv_pos) */

typedef enum maskpack_placement {
    MASKPACK_PLACE_RIGHT = 0, /* [B, S]: one sequence per row, padding after it */
    MASKPACK_PLACE_LEFT = 1,  /* [B, S]: one sequence per row, padding before it */
    MASKPACK_PLACE_PACKED = 2 /* capacity 0: one THD row of all tokens; else rows of `capacity`, in order */
} maskpack_placement;

typedef enum maskpack_mask2d_convention {
    MASKPACK_MASK2D_KEEP = 0,  /* 1 = token, 0 = pad (HF attention_mask) */
    MASKPACK_MASK2D_DOC_ID = 1 /* 1-based document id, 0 = pad (LlamaFactory/NeMo "indexed") */
} maskpack_mask2d_convention;

typedef enum maskpack_mask_convention {
    MASKPACK_MASK_KEEP = 0,    /* true/1 = may attend */
    MASKPACK_MASK_MASKED = 1,  /* true/1 = excluded (Megatron, TE, Ascend) */
    MASKPACK_MASK_ADDITIVE = 2 /* 0 = attend, negative (-inf, dtype min, -10000) = excluded */
} maskpack_mask_convention;

typedef enum maskpack_cu_form {
    MASKPACK_CU_TE = 0, /* [0, e1, ..., eN] */
    MASKPACK_CU_NPU = 1 /* [e1, ..., eN] */
} maskpack_cu_form;

typedef enum maskpack_boundary_rule {
    MASKPACK_BOUNDARY_RESET = 0, /* a new sequence starts where position_ids equals the row minimum (HF flash path) */
    MASKPACK_BOUNDARY_STEP = 1   /* a new sequence starts at any step other than +1 (HF mask builders) */
} maskpack_boundary_rule;

/* (segments[n], grid n_rows x q_width / kv_width, packed, rule) -> layout. Segments must be sorted by
 * (row, q_start), inside the grid and non-overlapping on both sides. The rule is copied. */
MASKPACK_API maskpack_status maskpack_layout_from_segments(const maskpack_segment *segments, size_t n, int64_t n_rows,
                                                           int64_t q_width, int64_t kv_width, int packed,
                                                           const maskpack_rule *rule, maskpack_layout **out,
                                                           maskpack_error *err);

/* (lengths[n] >= 0, placement, capacity) -> layout. RIGHT/LEFT: [n, max(lengths, capacity)];
 * PACKED with capacity 0: one packed row of sum(lengths); PACKED with capacity > 0: rows of
 * `capacity` columns filled in order (next-fit), padded at the row end; a length > capacity is an error. */
MASKPACK_API maskpack_status maskpack_layout_from_lengths(const int64_t *lengths, size_t n,
                                                          maskpack_placement placement, int64_t capacity,
                                                          const maskpack_rule *rule, maskpack_layout **out,
                                                          maskpack_error *err);

/* (mask [B,S] bool/int, convention) -> layout [B,S]. KEEP: each row is pad* token+ pad* (left,
 * right or both-side padding); a row with a hole is an error naming row and column. DOC_ID: each
 * document id forms one contiguous run per row; ids may repeat across rows. */
MASKPACK_API maskpack_status maskpack_layout_from_mask2d(const maskpack_tensor *mask,
                                                         maskpack_mask2d_convention convention,
                                                         const maskpack_rule *rule, maskpack_layout **out,
                                                         maskpack_error *err);

/* (cu [N+1] TE or [N] NPU int32/int64, total >= last end or 0 = last end, cu_padded [N+1] TE form or
 * NULL) -> packed layout of `total` tokens. With cu_padded, segment k holds tokens
 * [cu_padded[k], cu_padded[k] + len_k) and filler up to cu_padded[k+1]. Equal entries = empty segments. */
MASKPACK_API maskpack_status maskpack_layout_from_cu_seqlens(const maskpack_tensor *cu, maskpack_cu_form form,
                                                             int64_t total, const maskpack_tensor *cu_padded,
                                                             const maskpack_rule *rule, maskpack_layout **out,
                                                             maskpack_error *err);

/* (cu_q, cu_kv, both in `form`) -> packed cross layout: segment k has q_len = cu_q diff and kv_len =
 * cu_kv diff (q_len != kv_len is where the rule's alignment matters). */
MASKPACK_API maskpack_status maskpack_layout_from_cu_seqlens_qk(const maskpack_tensor *cu_q,
                                                                const maskpack_tensor *cu_kv, maskpack_cu_form form,
                                                                const maskpack_rule *rule, maskpack_layout **out,
                                                                maskpack_error *err);

/* (position_ids [T] (packed), [B,S] or [3,B,S] M-RoPE (text row 0 decides), boundary rule) -> layout.
 * Tail padding written as position 0 becomes padding, not a run of length-1 sequences: a trailing
 * run of two or more zeros at the end of a row (or of the packed stream) is padding (bug class 8). */
MASKPACK_API maskpack_status maskpack_layout_from_position_ids(const maskpack_tensor *position_ids,
                                                               maskpack_boundary_rule boundary,
                                                               const maskpack_rule *rule, maskpack_layout **out,
                                                               maskpack_error *err);

/* (mask [B,1,S,S] or [B,H,S,S], convention) -> layout with the recovered rule (padding, causal,
 * window, documents, spans, prefix). Rows of pad queries are ignored (both ms-swift's "pad rows see
 * valid keys" and verl's "pad rows see nothing" are accepted). When no layout reproduces the mask the
 * error says why and names the first (batch, head, query, key) that cannot be matched. */
MASKPACK_API maskpack_status maskpack_layout_from_mask4d(const maskpack_tensor *mask,
                                                         maskpack_mask_convention convention, maskpack_layout **out,
                                                         maskpack_error *err);

/* (mask [B,1,S,S]/[B,H,S,S]/[B,1,1,S]/[B,S], convention) -> out [B,S] keep mask: token s is valid iff
 * its key column is not fully masked (some query, any head, attends to it). out: bool/u8/int32/int64. */
MASKPACK_API maskpack_status maskpack_mask2d_from_mask4d(const maskpack_tensor *mask,
                                                         maskpack_mask_convention convention, maskpack_tensor *out,
                                                         maskpack_error *err);

/* (layout, new rule) -> a new layout with the same segments under another rule. */
MASKPACK_API maskpack_status maskpack_layout_with_rule(const maskpack_layout *layout, const maskpack_rule *rule,
                                                       maskpack_layout **out, maskpack_error *err);

/* (layout) -> an independent copy. */
MASKPACK_API maskpack_status maskpack_layout_clone(const maskpack_layout *layout, maskpack_layout **out,
                                                   maskpack_error *err);

/* Releases a layout; NULL is a no-op. */
MASKPACK_API void maskpack_layout_free(maskpack_layout *layout);

/* Accessors (layout must be non-NULL). */
MASKPACK_API int64_t maskpack_layout_n_rows(const maskpack_layout *layout);
MASKPACK_API int64_t maskpack_layout_q_width(const maskpack_layout *layout);
MASKPACK_API int64_t maskpack_layout_kv_width(const maskpack_layout *layout);
MASKPACK_API int maskpack_layout_is_packed(const maskpack_layout *layout);
/* 1 iff every segment has kv == q (self-attention). */
MASKPACK_API int maskpack_layout_is_self(const maskpack_layout *layout);
MASKPACK_API size_t maskpack_layout_n_segments(const maskpack_layout *layout);
/* Sum of q_len over segments (the real query tokens). */
MASKPACK_API int64_t maskpack_layout_n_tokens(const maskpack_layout *layout);
/* max q_len over segments (0 for none); kv: max kv_len. */
MASKPACK_API int64_t maskpack_layout_max_seqlen(const maskpack_layout *layout);
MASKPACK_API int64_t maskpack_layout_max_seqlen_kv(const maskpack_layout *layout);
/* (layout, i < n_segments) -> copies segment i into *out. */
MASKPACK_API maskpack_status maskpack_layout_segment(const maskpack_layout *layout, size_t i, maskpack_segment *out,
                                                     maskpack_error *err);
/* (layout) -> the rule; its span and prefix pointers live as long as the layout. */
MASKPACK_API maskpack_rule maskpack_layout_rule(const maskpack_layout *layout);

/* The reference predicate: 1 iff query column i of row b may attend key column j of row b (head h
 * is accepted for symmetry with 4D masks; the rule does not depend on it). Out-of-grid -> 0. */
MASKPACK_API int maskpack_allowed(const maskpack_layout *layout, int64_t b, int64_t h, int64_t i, int64_t j);

/* (layout, b, i) -> index of the segment owning query column i of row b, or -1 for padding. */
MASKPACK_API int64_t maskpack_segment_of_query(const maskpack_layout *layout, int64_t b, int64_t i);

/* ------------------------------------------------------------------------------------------ */
/* Context parallelism (docs/conventions.md section 8)                                               */
/* ------------------------------------------------------------------------------------------ */

typedef enum maskpack_cp_scheme {
    MASKPACK_CP_ZIGZAG = 0,    /* 2*cp chunks per slot; rank r holds chunks r and 2cp-1-r (Megatron, TE THD) */
    MASKPACK_CP_CONTIGUOUS = 1 /* cp equal pieces of each row (padded) or of the token stream (packed) */
    /* at cp = 1 both schemes are the identity: the one rank holds every token, nothing must divide */
} maskpack_cp_scheme;

typedef enum maskpack_cp_align {
    MASKPACK_CP_ALIGN_VERL = 0,   /* multiple = tp * cp * 2 (verl PR 6206) */
    MASKPACK_CP_ALIGN_MINIMAL = 1 /* multiple = cp * lcm(2, tp): the smallest that zigzag + sequence parallel need */
} maskpack_cp_align;

/* (cp >= 1, tp >= 1, align) -> *multiple each slot length must divide by. Never lcm(tp, 2cp). At cp = 1
 * there is no zigzag split and the multiple is tp for either align (sequence parallelism splits the
 * tokens tp ways); prepare_batch and the planner pad by this one rule. */
MASKPACK_API maskpack_status maskpack_cp_multiple(int64_t cp, int64_t tp, maskpack_cp_align align, int64_t *multiple,
                                                  maskpack_error *err);

/* (layout, multiple >= 1) -> a layout with the same sequences whose slots are padded explicitly up to
 * a multiple: packed layouts get each slot (cu_seqlens_padded difference) rounded up (the stream
 * grows, filler after each sequence), padded layouts get the row width rounded up (filler at the
 * row end). Nothing is ever truncated. */
MASKPACK_API maskpack_status maskpack_layout_pad_to_multiple(const maskpack_layout *layout, int64_t multiple,
                                                             maskpack_layout **out, maskpack_error *err);

/* (layout, cp, rank, scheme) -> the rank's layout. Its queries are the rank's tokens (grid [B, S/cp],
 * or [T/cp] when packed), its keys the whole original grid (what ring attention reads); every piece of
 * a sequence the rank holds is a segment with an explicit position, so its predicate is the original
 * one restricted to the rank's queries. Zigzag needs each slot (packed) or S (padded) divisible by
 * 2*cp, contiguous needs T or S divisible by cp: otherwise MASKPACK_ERR_INVALID_ARGUMENT naming the
 * slot (pad first with maskpack_layout_pad_to_multiple; nothing is truncated). Self-attention only. */
MASKPACK_API maskpack_status maskpack_layout_cp_shard(const maskpack_layout *layout, int64_t cp, int64_t rank,
                                                      maskpack_cp_scheme scheme, maskpack_layout **out,
                                                      maskpack_error *err);

/* (layout, cp, rank, scheme) -> out int32/int64 [B*S/cp]: flattened index in the original grid of each
 * of the rank's local tokens, in local order (TE's thd_get_partitioned_indices for packed layouts). */
MASKPACK_API maskpack_status maskpack_cp_shard_indices(const maskpack_layout *layout, int64_t cp, int64_t rank,
                                                       maskpack_cp_scheme scheme, maskpack_tensor *out,
                                                       maskpack_error *err);

/* ------------------------------------------------------------------------------------------ */
/* Moving per-token tensors between layouts                                                   */
/* ------------------------------------------------------------------------------------------ */

/* (layout) -> the packed layout of the same sequences, in order, without gaps (the flash-attn unpad
 * target; T = n_tokens). The rule is kept. Shards are refused (UNSUPPORTED). */
MASKPACK_API maskpack_status maskpack_layout_packed_of(const maskpack_layout *layout, maskpack_layout **out,
                                                       maskpack_error *err);
/* (layout, RIGHT or LEFT, width >= max_seqlen or 0 for max_seqlen) -> one sequence per row, padded. */
MASKPACK_API maskpack_status maskpack_layout_padded_of(const maskpack_layout *layout, maskpack_placement placement,
                                                       int64_t width, maskpack_layout **out, maskpack_error *err);

typedef struct maskpack_relayout_plan maskpack_relayout_plan; /* opaque, immutable, reusable */

/* (sources[n_src], dst) -> a copy plan. A token is identified by (sequence, position): sequence = the
 * segment index, or `origin` for shard pieces; position = its index in the sequence (q_pos + i for
 * pieces). Every real token of dst must have exactly one source among the sources; sources' tokens
 * that dst does not hold are skipped (that is how a shard is cut). Two unsharded layouts must have
 * the same number of sequences and equal lengths (SHAPE error naming the first that differs). */
MASKPACK_API maskpack_status maskpack_relayout_plan_create(const maskpack_layout *const *sources, size_t n_src,
                                                           const maskpack_layout *dst, maskpack_relayout_plan **out,
                                                           maskpack_error *err);
MASKPACK_API void maskpack_relayout_plan_free(maskpack_relayout_plan *plan);
/* (plan, source < n_src) -> the adjoint plan of source `source`: one source, dst's grid, into that source's
 * grid. Each token the plan copied from that source receives the dst token it was copied to; every other
 * token of the source's grid (its padding, and tokens dst does not hold, as in a CP shard) is a fill
 * (pad_value at execution; zero bytes for a gradient). Executing it on the gradient of dst is the exact
 * transpose of the move (the move is injective), and an adjoint is itself a plan, so its adjoint is the
 * move again up to the fills. The reverse of a gather is n_src adjoint plans, one per part. */
MASKPACK_API maskpack_status maskpack_relayout_plan_adjoint(const maskpack_relayout_plan *plan, size_t source,
                                                            maskpack_relayout_plan **out, maskpack_error *err);
/* (plan) -> the number of copy runs (contiguous token ranges) it executes. */
MASKPACK_API size_t maskpack_relayout_plan_runs(const maskpack_relayout_plan *plan);

/* (plan, x[n_src] per-token tensors [B,S,...] or [T,...] of the source layouts, out per-token tensor of
 * dst, pad_value: one element of the dtype (NULL = zero bytes), n_threads >= 1) -> out. Trailing dims
 * (any number, any dtype) must agree between inputs and out and be contiguous within a token; the
 * token dims may be strided. Padding columns of out get pad_value. Overlapping input and output
 * memory is MASKPACK_ERR_OVERLAP. One pass, no intermediate buffer; threads split the bytes. */
MASKPACK_API maskpack_status maskpack_relayout_execute(const maskpack_relayout_plan *plan,
                                                       const maskpack_tensor *const *x, maskpack_tensor *out,
                                                       const void *pad_value, int n_threads, maskpack_error *err);

/* A team of worker threads the caller owns, reused across calls: starting a thread costs as much as
 * copying a few hundred KB, so moves of L2-sized tensors only gain from a second core through a team
 * that already runs. Idle workers spin politely (yielding the core) for 0.1 ms, then sleep. One caller at a time uses
 * a team; a concurrent second caller runs its work alone (no waiting). A child process after fork() gets no
 * workers from the parent's team: calls there run on the caller, and free() only releases memory. */
typedef struct maskpack_workers maskpack_workers; /* opaque */

/* The most threads any call takes: every n_threads argument (copies, kernels) and a team's size are
 * in [1, MASKPACK_MAX_THREADS]; a count above it is MASKPACK_ERR_INVALID_ARGUMENT, never clamped. */
#define MASKPACK_MAX_THREADS 256

/* (n_threads >= 1, the caller included) -> a team of n_threads - 1 started worker threads. */
MASKPACK_API maskpack_status maskpack_workers_create(int n_threads, maskpack_workers **out, maskpack_error *err);
/* A team that runs on a thread pool the caller already has (OpenMP's, TBB's, a framework's), so that
 * maskpack's work and the host's never compete for the cores: a pool whose idle threads spin after
 * each of its own parallel regions (OpenMP's do, for milliseconds) would otherwise keep half of every
 * core from a team of maskpack's own threads.
 *
 * parallel(host, task, ctx, n) is the host's parallel region: it runs task(ctx, t) for t = 0 .. n-1,
 * each t on its own thread, concurrently as far as it has threads, and returns when every one has
 * returned. It may leave out indices it has no thread for, except t = 0 (maskpack's work is shared
 * dynamically, so any one participant finishes it); one index never runs twice at once. With OpenMP:
 *     static void omp_host(void *host, maskpack_task_fn task, void *ctx, int n) {
 *         (void)host;
 *         #pragma omp parallel num_threads(n)
 *         task(ctx, omp_get_thread_num());
 *     }
 * The caller's thread should take part as one of them (OpenMP's master does). Work runs on the caller
 * alone after fork() (in a child process), as with maskpack_workers_create. */
typedef void (*maskpack_task_fn)(void *ctx, int t);
typedef void (*maskpack_parallel_fn)(void *host, maskpack_task_fn task, void *ctx, int n_threads);
/* (n_threads in [1, MASKPACK_MAX_THREADS], parallel, host) -> a team of n_threads participants that
 * runs every share of work through parallel(host, ...); it starts no thread of its own. */
MASKPACK_API maskpack_status maskpack_workers_create_hosted(int n_threads, maskpack_parallel_fn parallel, void *host,
                                                            maskpack_workers **out, maskpack_error *err);
/* Stops and joins the workers (NULL is a no-op). */
MASKPACK_API void maskpack_workers_free(maskpack_workers *workers);
/* (team) -> its participant count (1 for NULL). */
MASKPACK_API int maskpack_workers_threads(const maskpack_workers *workers);

/* As maskpack_relayout_execute, with the bytes split in chunks taken dynamically by the caller and the
 * team's workers (NULL team: the caller alone). Small moves (< 64 KiB) run on the caller. */
MASKPACK_API maskpack_status maskpack_relayout_execute_on(const maskpack_relayout_plan *plan,
                                                          const maskpack_tensor *const *x, maskpack_tensor *out,
                                                          const void *pad_value, maskpack_workers *workers,
                                                          maskpack_error *err);

/* One-source convenience: plan, execute, free. */
MASKPACK_API maskpack_status maskpack_relayout(const maskpack_layout *src, const maskpack_layout *dst,
                                               const maskpack_tensor *x, maskpack_tensor *out, const void *pad_value,
                                               int n_threads, maskpack_error *err);

/* ------------------------------------------------------------------------------------------ */
/* Context parallelism across processes                                                       */
/* ------------------------------------------------------------------------------------------ */

/* A communicator the library does not own: the caller's transport (MPI through maskpack_mpi.h, or
 * its own) as a table of callbacks. maskpack never starts, joins or tears down processes. Each
 * callback is collective over the group (every rank calls it with the same byte counts) and returns
 * 0 on success, anything else on failure (the calling function then returns MASKPACK_ERR_COMM). */
typedef struct maskpack_comm {
    void *ctx;      /* the caller's state, handed to every callback */
    int rank, size; /* this process's rank in [0, size) */
    /* (send: `bytes` bytes) -> recv: size * bytes, rank r's bytes at r * bytes */
    int (*all_gather)(void *ctx, const void *send, void *recv, size_t bytes);
    /* (send: size blocks of `bytes`, block r for rank r) -> recv: size blocks, block r from rank r */
    int (*all_to_all)(void *ctx, const void *send, void *recv, size_t bytes);
    /* Point to point, for ring attention (NULL: the ring calls refuse with MASKPACK_ERR_NULL_ARGUMENT).
     * Starts sending send_bytes of `send` to rank `to` and receiving recv_bytes into `recv` from rank
     * `from`, both with message tag `tag` (to or from = -1: that half is absent) and returns at once
     * with *request set; `wait` completes both halves. Not collective: the two ranks of a pair start
     * matching halves (same tag and size). The library leaves both buffers alone until wait returns;
     * up to four requests are outstanding at a time, on tags 0 (keys and values) and 1 (their
     * gradients). */
    int (*sendrecv_start)(void *ctx, const void *send, size_t send_bytes, int to, void *recv, size_t recv_bytes,
                          int from, int tag, void **request);
    int (*wait)(void *ctx, void *request);
} maskpack_comm;

/* (comm, layout, scheme) -> OK on every rank when all ranks hold the same layout (segments, grid,
 * rule) and scheme; otherwise the same MASKPACK_ERR_INVALID_ARGUMENT on every rank, naming the first
 * rank that differs from rank 0, what differs and both values. One all-gather of a 224-byte record:
 * cheap enough to run before every CP step, so that mismatched shards fail loudly instead of mixing.
 *
 * Every collective call below (cp_all_gather, the ring attention's two directions, sequence-parallel
 * GDN and conv) starts with the same all-gather of the same fixed-size record of its call: which
 * collective, the layout and scheme, whether the rank's own argument checks passed, and the settings
 * every rank must share (dtypes and per-token shapes of the tensors that travel, payload bytes, scale,
 * softcap, l2norm, activation). Ranks in different collectives, or in one with other settings, fail
 * there with the same MASKPACK_ERR_INVALID_ARGUMENT on every rank (argument: "comm" for another call,
 * else the setting's argument; index[0]: the first rank that differs from rank 0; the message names
 * the setting and both values), before any payload moves: never a hang, never a transport's abort. A
 * rank whose own checks fail (a NULL or mis-shaped argument, outputs included) returns its own error
 * and every other rank "rank r refused its arguments"; a failure after the agreement (a kernel's
 * refusal inside the GDN) travels in the next exchange, so every rank fails with it. */
MASKPACK_API maskpack_status maskpack_cp_check(const maskpack_comm *comm, const maskpack_layout *layout,
                                               maskpack_cp_scheme scheme, maskpack_error *err);

/* (comm, layout of the whole batch (aligned: every slot divides as maskpack_layout_cp_shard needs),
 * scheme, part: this rank's shard [T_local, ...] contiguous, whole: per-token tensor of layout, pad_value
 * (NULL = zero bytes)) -> whole on every rank: the parts all-gathered and moved into the layout (ranks
 * = comm->size, each rank's shard as maskpack_layout_cp_shard(layout, size, rank, scheme) cuts it).
 * The layouts are checked first (as maskpack_cp_check) together with every rank's own arguments, so
 * ranks that disagree, or one rank's wrong part, make every rank fail alike, never wait in a collective
 * another rank left. */
MASKPACK_API maskpack_status maskpack_cp_all_gather(const maskpack_comm *comm, const maskpack_layout *layout,
                                                    maskpack_cp_scheme scheme, const maskpack_tensor *part,
                                                    maskpack_tensor *whole, const void *pad_value, maskpack_error *err);

/* ------------------------------------------------------------------------------------------ */
/* Labels, losses and last tokens                                                             */
/* ------------------------------------------------------------------------------------------ */

/* (unsharded layout, labels per-token int32/int64 [B,S] or [T], ignore_index) -> out (same shape and
 * dtype): out[t] = labels[t+1] when t+1 is the next token of t's sequence, else ignore_index (each
 * sequence's last token and every pad). Never crosses a sequence boundary. Shift before sharding:
 * a shard does not hold its neighbours' tokens (UNSUPPORTED). out may not overlap labels. */
MASKPACK_API maskpack_status maskpack_shift_labels(const maskpack_layout *layout, const maskpack_tensor *labels,
                                                   int64_t ignore_index, maskpack_tensor *out, maskpack_error *err);

typedef enum maskpack_loss_mode {
    MASKPACK_LOSS_TOKEN = 0,   /* every labelled token weighs the same: mean over tokens */
    MASKPACK_LOSS_SEQUENCE = 1 /* every sequence with a label weighs the same: mean of per-sequence means */
} maskpack_loss_mode;

/* (unsharded layout, shifted labels per-token int32/int64 or NULL = every real token but each
 * sequence's last is labelled, ignore_index, mode) -> out per-token f32/f64 weights such that
 * sum(loss * out) over all tokens is the mean loss, and *denominator = the count it divides by
 * (tokens, or sequences). Weights of unlabelled tokens and pads are 0. Shard the weights with the
 * other per-token tensors: the sum of per-rank sums is then the exact global mean. */
MASKPACK_API maskpack_status maskpack_loss_weights(const maskpack_layout *layout, const maskpack_tensor *labels,
                                                   int64_t ignore_index, maskpack_loss_mode mode, maskpack_tensor *out,
                                                   double *denominator, maskpack_error *err);

/* (unsharded layout, cp, scheme) -> for each sequence: rank[N] (int32/int64) holding its last real
 * token and local[N] its flattened index in that rank's local grid; -1 for empty sequences. */
MASKPACK_API maskpack_status maskpack_cp_last_token(const maskpack_layout *layout, int64_t cp,
                                                    maskpack_cp_scheme scheme, maskpack_tensor *rank,
                                                    maskpack_tensor *local, maskpack_error *err);

/* ------------------------------------------------------------------------------------------ */
/* Derived outputs. Shapes below: B = n_rows, S = q_width, Skv = kv_width, N = n_segments,      */
/* V = n_tokens. "per-token [B,S]" means [T] (1-D) for a packed layout; [1,T] is accepted too. */
/* ------------------------------------------------------------------------------------------ */

/* (layout) -> out per-token [B,S] keep mask (1 = real token). dtype bool/u8/i8/i32/i64/f32. */
MASKPACK_API maskpack_status maskpack_mask2d(const maskpack_layout *layout, maskpack_tensor *out, maskpack_error *err);

typedef enum maskpack_fill {
    MASKPACK_FILL_NEG_INF = 0,  /* additive: -inf */
    MASKPACK_FILL_DTYPE_MIN = 1 /* additive: the dtype's most negative finite value (HF eager) */
} maskpack_fill;

/* (layout, convention, fill) -> out [B,1,S,Skv] or [B,H,S,Skv] dense mask. KEEP/MASKED: bool, u8, i32
 * or f32 (1/0); ADDITIVE: f32/f16/bf16/f64 with 0 and the fill. Pad query rows see nothing. */
MASKPACK_API maskpack_status maskpack_mask4d(const maskpack_layout *layout, maskpack_mask_convention convention,
                                             maskpack_fill fill, maskpack_tensor *out, maskpack_error *err);

/* (layout, form, kv side?) -> out int32/int64: TE [N+1] or NPU [N] cumulative real lengths. */
MASKPACK_API maskpack_status maskpack_cu_seqlens(const maskpack_layout *layout, maskpack_cu_form form, int kv,
                                                 maskpack_tensor *out, maskpack_error *err);

/* (layout) -> out int32/int64 [N+1]: TE cu_seqlens_padded, slot offsets in the flattened token grid
 * (slot k runs from segment k's first column to the next segment's first column, or its row's end;
 * the first slot of a row starts at the row's first column). */
MASKPACK_API maskpack_status maskpack_cu_seqlens_padded(const maskpack_layout *layout, maskpack_tensor *out,
                                                        maskpack_error *err);

/* (layout, kv side?) -> out int32/int64 [N]: real lengths. */
MASKPACK_API maskpack_status maskpack_seqlens(const maskpack_layout *layout, int kv, maskpack_tensor *out,
                                              maskpack_error *err);

/* (layout) -> out per-token [B,S] int32/int64: 0,1,2,... restarting at each segment; pads get 0. A CP
 * piece continues from its explicit position q_pos (global positions, as RoPE needs). */
MASKPACK_API maskpack_status maskpack_position_ids(const maskpack_layout *layout, maskpack_tensor *out,
                                                   maskpack_error *err);

/* (layout) -> out per-token [B,S] int32/int64: 1-based segment id (global order), 0 = pad. CP pieces
 * carry their unsharded sequence's id (origin + 1). */
MASKPACK_API maskpack_status maskpack_segment_ids(const maskpack_layout *layout, maskpack_tensor *out,
                                                  maskpack_error *err);

/* (layout) -> out int32/int64 [V]: flattened row-major indices (b*S + s) of the real tokens, in order
 * (flash-attn unpad_input's `indices`). */
MASKPACK_API maskpack_status maskpack_valid_indices(const maskpack_layout *layout, maskpack_tensor *out,
                                                    maskpack_error *err);

/* (layout) -> out int32/int64 [N]: flattened index of each segment's last real token, -1 if empty. */
MASKPACK_API maskpack_status maskpack_last_token_index(const maskpack_layout *layout, maskpack_tensor *out,
                                                       maskpack_error *err);

/* FlexAttention-compatible block mask for one head (H = 1, broadcast), Qb = ceil(S/block_q),
 * Kb = ceil(Skv/block_k). A block is FULL when it is a whole block_q x block_k block and every (i,j) in
 * it is allowed, PARTIAL when some but not all are; a block cut short by the end of the grid is at most
 * PARTIAL, as torch's create_block_mask classifies it (it pads to whole blocks with False). kv_num_blocks [B,Qb]
 * counts partial blocks, kv_indices [B,Qb,Kb] lists them ascending in its first kv_num_blocks entries (later entries
 * are left untouched: FlexAttention ignores them); full_kv_* likewise for full blocks; q_* / full_q_* are the
 * transposes ([B,Kb], [B,Kb,Qb]). Any pointer may be NULL to skip that output. All arrays int32, C-contiguous. */
typedef struct maskpack_block_mask_arrays {
    int32_t *kv_num_blocks, *kv_indices;
    int32_t *full_kv_num_blocks, *full_kv_indices;
    int32_t *q_num_blocks, *q_indices;
    int32_t *full_q_num_blocks, *full_q_indices;
} maskpack_block_mask_arrays;

/* (layout, block_q, block_k) -> *q_blocks = Qb, *kv_blocks = Kb (sizes for the arrays above). */
MASKPACK_API maskpack_status maskpack_block_mask_dims(const maskpack_layout *layout, int64_t block_q, int64_t block_k,
                                                      int64_t *q_blocks, int64_t *kv_blocks, maskpack_error *err);
/* (layout, block_q, block_k) -> fills *out. Time proportional to the blocks touched, never S*Skv. */
MASKPACK_API maskpack_status maskpack_block_mask(const maskpack_layout *layout, int64_t block_q, int64_t block_k,
                                                 maskpack_block_mask_arrays *out, maskpack_error *err);

/* MagiAttention slice types. */
typedef enum maskpack_magi_type {
    MASKPACK_MAGI_FULL = 0,
    MASKPACK_MAGI_CAUSAL = 1,    /* bottom-right */
    MASKPACK_MAGI_INVCAUSAL = 2, /* top-left inverse */
    MASKPACK_MAGI_BICAUSAL = 3
} maskpack_magi_type;

/* (layout) -> up to `capacity` slices: q_ranges [n,2], k_ranges [n,2] half-open in flattened token
 * indices, types [n]; *count = slices needed (call with capacity 0 to size). Windows are
 * NOT_REPRESENTABLE; spans and prefixes are decomposed into FULL and CAUSAL slices. The union of
 * the slices' allowed pairs equals the predicate. */
MASKPACK_API maskpack_status maskpack_magi_slices(const maskpack_layout *layout, int32_t *q_ranges, int32_t *k_ranges,
                                                  int32_t *types, size_t capacity, size_t *count, maskpack_error *err);

/* ------------------------------------------------------------------------------------------ */
/* Ascend npu_fusion_attention arguments (docs/conventions.md section 6)                              */
/* ------------------------------------------------------------------------------------------ */

typedef enum maskpack_npu_layout {
    MASKPACK_NPU_BSND = 0,
    MASKPACK_NPU_BNSD = 1,
    MASKPACK_NPU_BSH = 2,
    MASKPACK_NPU_SBH = 3,
    MASKPACK_NPU_TND = 4
} maskpack_npu_layout;

typedef enum maskpack_npu_mask_kind {
    MASKPACK_NPU_MASK_NONE = 0,              /* atten_mask=None */
    MASKPACK_NPU_MASK_COMPRESSED = 1,        /* [2048, 2048] triu(ones, 1), bool M-mask */
    MASKPACK_NPU_MASK_PREFIX_COMPRESSED = 2, /* [3072, 2048] for sparse_mode 6 */
    MASKPACK_NPU_MASK_FULL = 3               /* [B,1,S,Skv] M-mask (or [maxSq,maxSkv] in TND) */
} maskpack_npu_mask_kind;

#define MASKPACK_NPU_MAX_ITEMS 2048

/* What to pass to npu_fusion_attention for a layout. The arrays are allocated by maskpack_npu_args
 * and released by maskpack_npu_argset_release. */
typedef struct maskpack_npu_argset {
    maskpack_npu_layout input_layout;
    int32_t sparse_mode;
    int64_t pre_tokens;  /* the operator's pre_tockens: torch_npu's spelling, which the CLI's */
    int64_t next_tokens; /* reports and the Python dict use; C keeps plain field names */
    double scale;
    int32_t inner_precise; /* 0, or 2 when fully masked query rows exist */
    maskpack_npu_mask_kind mask_kind;
    int32_t mask_ndim;
    int64_t mask_shape[4];    /* shape of atten_mask (bool, MASKED convention) */
    int64_t n_items;          /* TND: items in actual_seq_* (pad items included) */
    int64_t *actual_seq_qlen; /* TND: NPU-form cumulative ends, n_items entries; else NULL */
    int64_t *actual_seq_kvlen;
    int64_t *prefix; /* modes 5/6: per batch item / sequence; else NULL */
    int64_t n_prefix;
    uint8_t *pad_items;            /* TND: 1 where an item is a declared pad item (filler tokens) */
    int64_t fully_masked_rows;     /* query rows of real tokens that see nothing */
    int64_t fully_masked_pad_rows; /* query rows of padding (B*S pad slots of a full mask, TND pad
                                          items) that see nothing: their output is never read, but
                                          they too need inner_precise = 2 */
} maskpack_npu_argset;

/* (layout, input_layout, scale (> 0 finite) or 0 with head_dim > 0 for 1/sqrt(head_dim)) -> args.
 * TND requires a packed layout; B*S layouts require padded or packed-row layouts. Rules the operator
 * cannot express (spans in TND, windows whose diagonal offset kv_len - q_len differs between
 * segments, zigzag CP pieces sharing keys in TND, ...) are NOT_REPRESENTABLE with the reason. On success release with
 * maskpack_npu_argset_release. */
MASKPACK_API maskpack_status maskpack_npu_args(const maskpack_layout *layout, maskpack_npu_layout input_layout,
                                               double scale, int64_t head_dim, maskpack_npu_argset *out,
                                               maskpack_error *err);
/* Releases the arrays of an argset filled by maskpack_npu_args and zeroes it; NULL is a no-op. */
MASKPACK_API void maskpack_npu_argset_release(maskpack_npu_argset *args);

/* (layout, args from maskpack_npu_args) -> out bool/u8 with args->mask_shape: the atten_mask to pass. */
MASKPACK_API maskpack_status maskpack_npu_atten_mask(const maskpack_layout *layout, const maskpack_npu_argset *args,
                                                     maskpack_tensor *out, maskpack_error *err);

/* An argument set a user built by hand, to be checked against the operator's contract. */
typedef struct maskpack_npu_call {
    maskpack_npu_layout input_layout;
    int64_t batch;             /* B (ignored for TND) */
    int64_t q_len, kv_len;     /* S, Skv (ignored for TND) */
    int64_t total_q, total_kv; /* TND: T of query and key (0 = unknown) */
    int64_t heads_q, heads_kv, head_dim;
    int32_t sparse_mode;
    int64_t pre_tokens, next_tokens;
    const maskpack_tensor *atten_mask;      /* NULL = None */
    const maskpack_tensor *actual_seq_qlen; /* NULL = not passed */
    const maskpack_tensor *actual_seq_kvlen;
    const maskpack_tensor *prefix;
    double scale; /* NAN = not passed (the operator then uses 1.0) */
    int32_t inner_precise;
    const maskpack_layout *intended; /* optional: the layout the call is meant to compute */
} maskpack_npu_call;

#define MASKPACK_NPU_MAX_FINDINGS 32

typedef struct maskpack_npu_finding {
    int32_t code; /* MASKPACK_NPU_* finding code below */
    char message[MASKPACK_ERROR_MESSAGE_SIZE];
} maskpack_npu_finding;

enum {
    MASKPACK_NPU_BAD_LAYOUT = 1,           /* input_layout unknown, or TND without both actual_seq lists */
    MASKPACK_NPU_BAD_MASK_SHAPE = 2,       /* atten_mask shape not one of the accepted forms (error 561103) */
    MASKPACK_NPU_BAD_MASK_DTYPE = 3,       /* atten_mask not bool/uint8 */
    MASKPACK_NPU_CAUSAL_WITHOUT_MASK = 4,  /* a sparse mode that needs a mask, with None: silently bidirectional */
    MASKPACK_NPU_DENSE_FOR_COMPRESSED = 5, /* a full mask passed to a compressed mode (or the reverse) */
    MASKPACK_NPU_LEADING_ZERO = 6,         /* actual_seq_* starts with 0: TE form given where NPU form is needed */
    MASKPACK_NPU_NOT_CUMULATIVE = 7,       /* actual_seq_* decreasing or not ending at T */
    MASKPACK_NPU_TOO_MANY_ITEMS = 8,       /* > 2048 items (> 1024 with prefix), or B > 32 in prefix modes */
    MASKPACK_NPU_FULLY_MASKED_ROW = 9,     /* TND full mask with a fully masked row, or rows without inner_precise 2 */
    MASKPACK_NPU_PRE_NEXT_MISMATCH = 10,   /* pre/next disagree with the mask or intended rule */
    MASKPACK_NPU_BAD_HEADS = 11,           /* Nq % Nkv != 0 or D > 768 */
    MASKPACK_NPU_SCALE_DEFAULT = 12,       /* scale not passed: the operator uses 1.0, not 1/sqrt(D) */
    MASKPACK_NPU_BAD_SPARSE_MODE = 13,     /* mode outside 0..8 or not allowed with this layout */
    MASKPACK_NPU_MASK_MISMATCH = 14        /* the call computes another predicate than the intended layout */
};

typedef struct maskpack_npu_report {
    int32_t n_findings; /* findings stored (<= MASKPACK_NPU_MAX_FINDINGS) */
    int32_t n_total;    /* findings seen (may exceed the stored count) */
    maskpack_npu_finding findings[MASKPACK_NPU_MAX_FINDINGS];
} maskpack_npu_report;

/* (call) -> report of every contract violation; returns OK when there are none, NPU_CONTRACT when
 * there are, another code when the call description itself is unusable. */
MASKPACK_API maskpack_status maskpack_validate_npu_args(const maskpack_npu_call *call, maskpack_npu_report *report,
                                                        maskpack_error *err);

/* ==== Kernel ISAs (every kernel family: attention, gated delta rule, causal conv1d) ========== */
/*
 * Every kernel family has a portable reference kernel and vector kernels, and every call takes
 * the ISA to run (maskpack_isa) in its options (maskpack_kernel_options, maskpack_gdn_options).
 * MASKPACK_ISA_AUTO reads the environment variable MASKPACK_ISA, one rule for every family: "ref",
 * "avx2", "avx512", "avx512_bf16" or "amx" forces that ISA; unset, empty or "auto" = the best this
 * CPU runs. An explicit request is never overridden by the variable. Requesting (per call or
 * through the variable) an ISA this CPU, build or OS lacks is MASKPACK_ERR_UNSUPPORTED naming the
 * ISA and the missing CPU feature, never a silent fallback; an unknown name is
 * MASKPACK_ERR_INVALID_ARGUMENT naming MASKPACK_ISA. A family without a kernel of the requested ISA
 * runs its best kernel below it (the gated delta rule has no AMX or AVX512-BF16 kernel, so those run
 * its AVX-512 one; the conv has only AVX2 rows). maskpack_kernel_list says which kernels each family
 * has and which this CPU runs.
 */
typedef enum maskpack_isa {
    MASKPACK_ISA_AUTO = 0,        /* MASKPACK_ISA, else the best this CPU runs */
    MASKPACK_ISA_REF = 1,         /* portable C (the reference of every family) */
    MASKPACK_ISA_AVX512 = 2,      /* AVX-512 F/DQ/BW/VL + FMA */
    MASKPACK_ISA_AVX2 = 3,        /* AVX2 + FMA (CPUs without AVX-512: AMD Zen 1-3, ...) */
    MASKPACK_ISA_AVX512_BF16 = 4, /* AVX-512 and AVX512-BF16 dot products */
    MASKPACK_ISA_AMX = 5,         /* AVX-512 and AMX-TILE/AMX-BF16 tiles */
    MASKPACK_ISA_COUNT_ = 6
} maskpack_isa;

typedef enum maskpack_kernel_family {
    MASKPACK_KERNEL_ATTENTION = 0, /* maskpack_attention_forward / _backward */
    MASKPACK_KERNEL_GDN = 1,       /* maskpack_gdn_forward / _backward */
    MASKPACK_KERNEL_CONV = 2,      /* maskpack_causal_conv1d / _backward */
    MASKPACK_KERNEL_FAMILY_COUNT_ = 3
} maskpack_kernel_family;

/* isa -> "auto" / "ref" / "avx2" / "avx512" / "avx512_bf16" / "amx" (static storage; "unknown" if out of range). */
MASKPACK_API const char *maskpack_isa_name(maskpack_isa isa);
/* family -> "attention" / "gdn" / "conv" (static storage; "unknown" if out of range). */
MASKPACK_API const char *maskpack_kernel_family_name(maskpack_kernel_family family);

/* (family, input dtype f32/bf16, requested isa) -> *resolved: the ISA a call of that family with
 * this request runs (AUTO resolved through MASKPACK_ISA and the CPU; a family without a kernel of
 * the requested ISA: its best below). Errors as the calls themselves give them (see above). */
MASKPACK_API maskpack_status maskpack_isa_resolve(maskpack_kernel_family family, maskpack_dtype dtype,
                                                  maskpack_isa requested, maskpack_isa *resolved, maskpack_error *err);

/* One kernel of one family, as its table lists it. */
typedef struct maskpack_kernel_info {
    maskpack_kernel_family family;
    maskpack_isa isa;
    const char *name;         /* "attention/avx512" (static storage) */
    uint32_t dtypes;          /* bit (1u << dtype) for each input dtype it takes */
    const char *cpu_features; /* what the CPU must have, e.g. "AVX-512F/DQ/BW/VL + FMA"; "" for ref */
    int available;            /* 1 iff this build and this CPU (and OS) run it */
} maskpack_kernel_info;

/* (out[cap] or NULL with cap 0) -> *n = the number of kernels of every family this build has, and
 * the first min(cap, *n) written to out, family by family, reference first. */
MASKPACK_API maskpack_status maskpack_kernel_list(maskpack_kernel_info *out, size_t cap, size_t *n,
                                                  maskpack_error *err);

/* Every kernel family has one call shape: the plain calls take their options by pointer (NULL = the
 * defaults) and start their threads per call, the _on calls run on a team the caller keeps (its
 * participant count in place of n_threads; the options' isa still chooses the kernel), and
 * (attention, gated delta rule) an operator created once runs many times; the context-parallel
 * calls (maskpack_cp_*) take the same options, plain and _on. The attention and the
 * causal conv1d take the options below, one struct for both since they take the same two (their
 * numeric arguments, scale, softcap and silu, stay arguments); the gated delta rule takes
 * maskpack_gdn_options, which carries the same isa and n_threads besides its own. A bad n_threads
 * is MASKPACK_ERR_INVALID_ARGUMENT naming "n_threads", a bad isa as Kernel ISAs above names "isa". */
typedef struct maskpack_kernel_options {
    int n_threads;    /* in [1, MASKPACK_MAX_THREADS] (default 1); threads are started per call (see _on) */
    maskpack_isa isa; /* default AUTO */
} maskpack_kernel_options;

/* () -> 1 thread, AUTO: what NULL options mean. */
MASKPACK_API maskpack_kernel_options maskpack_kernel_options_default(void);

/* ==== Attention kernels (fused CPU attention over a layout) ================================= */

/*
 * Fused CPU attention that takes the layout itself, so a padded batch, a packed batch and a CP shard
 * of it give the same answer (docs/conventions.md sections 3-5). Shapes (B = n_rows, S = q_width,
 * Skv = kv_width; for a packed layout T = q_width, Tkv = kv_width; [1,T,...] is accepted as well):
 *   q, out, dout, dq   [B,S,Hq,D] (padded and packed-row layouts) or [T,Hq,D] (packed)
 *   k, v, dk, dv       [B,Skv,Hkv,D] or [Tkv,Hkv,D]
 *   lse                f32 [B,Hq,S] or [Hq,T]: natural-log log-sum-exp of the scaled (capped)
 *                      logits of each query row, flash-attn's softmax_lse convention
 * Hq % Hkv == 0 (GQA/MQA: query head h reads key head h / (Hq / Hkv)); 1 <= D <= 256 (64 and 128
 * are the fast ones). The D dimension must be contiguous; every other dimension may have any
 * stride. dtypes: all f32, or bf16 for q, k, v, out, dout, dq, dk, dv (fp32 accumulation; lse stays
 * f32). scale: 0 = 1/sqrt(D), otherwise any finite value. softcap: 0 = none, else finite > 0 and
 * logits become softcap * tanh(scale * q.k / softcap) (Gemma-2 style).
 * The rule is the layout's (segments, causal with its alignment or explicit CP positions,
 * window, spans, prefix). A query row that may see no key gets out 0 and lse -inf; padding rows
 * get out 0, lse -inf (dq 0); padding key columns get dk = dv = 0. Tiles the rule fully excludes
 * are never read; fully allowed tiles never evaluate it. Tiles start at each segment's own first
 * query and key, so the result of a token does not depend on where its sequence sits: packed and
 * padded runs of one kernel are bitwise equal in f32.
 * Kernels: a scalar reference (double accumulation), AVX-512 f32, and for bf16 forwards AMX tiles,
 * or AVX512-BF16 dot products on CPUs without AMX (plain AVX-512 widening to f32 without either);
 * bf16 backwards widen to f32. CPUs with AVX2 + FMA but no AVX-512 (e.g. AMD Zen 1-3) run an AVX2
 * f32 kernel (bf16 widened to f32), which gives the AVX-512 f32 kernel's results bit for bit.
 * ISA (see Kernel ISAs above): opts.isa of every call (maskpack_kernel_options); AUTO (the default)
 * runs amx (bf16) > avx512 > avx2 > ref.
 * avx512 runs bf16 forwards on AVX512-BF16 dot products where the CPU has them; avx512_bf16 and
 * amx run f32 inputs and backwards on the AVX-512 kernels (neither has f32 arithmetic).
 * Threads: opts.n_threads in [1, MASKPACK_MAX_THREADS]; the plain calls start a team for the call,
 * the _on calls and the operator (below) run on a team the caller keeps. Work is split over
 * (segment, head, query block), so both cores work even for one sequence of one head.
 * Workspace: pass a buffer of at least the queried size (any alignment), or NULL with 0 bytes to
 * let the call allocate it; a smaller buffer is MASKPACK_ERR_BUFFER_TOO_SMALL. The size only
 * depends on the layout, head counts, head dim, dtype and opts.n_threads, never on S*Skv, and serves
 * every ISA this CPU runs; the size queries allocate nothing.
 * On any error no output is written.
 */
/* (layout, q, k, v as for the forward, opts or NULL) -> *bytes of workspace maskpack_attention_forward needs. */
MASKPACK_API maskpack_status maskpack_attention_forward_workspace(const maskpack_layout *layout,
                                                                  const maskpack_tensor *q, const maskpack_tensor *k,
                                                                  const maskpack_tensor *v,
                                                                  const maskpack_kernel_options *opts, size_t *bytes,
                                                                  maskpack_error *err);

/* (layout, q [B,S,Hq,D]|[T,Hq,D], k, v [B,Skv,Hkv,D]|[Tkv,Hkv,D], scale, softcap, opts (isa, n_threads)
 * or NULL = 1 thread, AUTO) -> out (q's shape and dtype), lse f32 [B,Hq,S]|[Hq,T] (NULL to skip). */
MASKPACK_API maskpack_status maskpack_attention_forward(const maskpack_layout *layout, const maskpack_tensor *q,
                                                        const maskpack_tensor *k, const maskpack_tensor *v,
                                                        double scale, double softcap, maskpack_tensor *out,
                                                        maskpack_tensor *lse, const maskpack_kernel_options *opts,
                                                        void *workspace, size_t workspace_bytes, maskpack_error *err);

/* (layout, q, k, v as for the backward, opts or NULL) -> *bytes of workspace maskpack_attention_backward needs. */
MASKPACK_API maskpack_status maskpack_attention_backward_workspace(const maskpack_layout *layout,
                                                                   const maskpack_tensor *q, const maskpack_tensor *k,
                                                                   const maskpack_tensor *v,
                                                                   const maskpack_kernel_options *opts, size_t *bytes,
                                                                   maskpack_error *err);

/* (layout, dout and out like q, q, k, v, lse f32 from the forward, scale, softcap, opts or NULL) -> dq
 * (q's shape), dk, dv (k's shape), all of q's dtype. Tiles are recomputed (flash-attention 2): no
 * S*Skv memory. */
MASKPACK_API maskpack_status maskpack_attention_backward(const maskpack_layout *layout, const maskpack_tensor *dout,
                                                         const maskpack_tensor *q, const maskpack_tensor *k,
                                                         const maskpack_tensor *v, const maskpack_tensor *out,
                                                         const maskpack_tensor *lse, double scale, double softcap,
                                                         maskpack_tensor *dq, maskpack_tensor *dk, maskpack_tensor *dv,
                                                         const maskpack_kernel_options *opts, void *workspace,
                                                         size_t workspace_bytes, maskpack_error *err);

/* The attention on a worker team the caller owns (maskpack_workers_create; NULL = the caller's thread
 * alone), so that no thread starts per call: as maskpack_attention_forward with the team's
 * participant count in place of opts.n_threads (opts or NULL: its isa; the workspace is
 * maskpack_attention_forward_workspace's with n_threads = maskpack_workers_threads(team)); results
 * are the plain call's at that n_threads bit for bit. */
MASKPACK_API maskpack_status maskpack_attention_forward_on(const maskpack_layout *layout, const maskpack_tensor *q,
                                                           const maskpack_tensor *k, const maskpack_tensor *v,
                                                           double scale, double softcap, maskpack_tensor *out,
                                                           maskpack_tensor *lse, const maskpack_kernel_options *opts,
                                                           maskpack_workers *team, void *workspace,
                                                           size_t workspace_bytes, maskpack_error *err);
/* (as maskpack_attention_backward, team or NULL in place of opts.n_threads) -> dq, dk, dv. */
MASKPACK_API maskpack_status maskpack_attention_backward_on(
    const maskpack_layout *layout, const maskpack_tensor *dout, const maskpack_tensor *q, const maskpack_tensor *k,
    const maskpack_tensor *v, const maskpack_tensor *out, const maskpack_tensor *lse, double scale, double softcap,
    maskpack_tensor *dq, maskpack_tensor *dk, maskpack_tensor *dv, const maskpack_kernel_options *opts,
    maskpack_workers *team, void *workspace, size_t workspace_bytes, maskpack_error *err);

/* An attention operator for one layout, head counts, head dim, dtype and options: created once, run
 * many times. Creation does what every call would otherwise repeat: picks the kernel (opts.isa, and
 * MASKPACK_ISA for AUTO, read now; an ISA this CPU lacks is MASKPACK_ERR_UNSUPPORTED), lists and
 * orders the forward's (segment, head, query block) work items and builds the backward's key groups.
 * A run validates its tensors (their heads, head dim and dtype must be the op's; scale and softcap
 * are per run) and runs on a team of at most opts.n_threads participants, with the results of the
 * plain calls at opts.n_threads bit for bit. Workspace: a buffer of maskpack_attention_op_workspace_size bytes,
 * or NULL and 0 for the op's own, allocated at the first run that needs it and kept until
 * maskpack_attention_op_free (a run concurrent with another on the same op allocates its own); a
 * smaller buffer is MASKPACK_ERR_BUFFER_TOO_SMALL naming the size needed, nothing written. The
 * layout is the caller's and must outlive the op. */
typedef struct maskpack_attention_op maskpack_attention_op; /* opaque */

/* (layout, query heads hq, key heads hkv (hq % hkv == 0), head dim 1 <= d <= 256, dtype f32/bf16,
 * opts (isa, n_threads in [1, MASKPACK_MAX_THREADS]) or NULL = 1 thread, AUTO) -> *out. */
MASKPACK_API maskpack_status maskpack_attention_op_create(const maskpack_layout *layout, int64_t hq, int64_t hkv,
                                                          int64_t d, maskpack_dtype dtype,
                                                          const maskpack_kernel_options *opts,
                                                          maskpack_attention_op **out, maskpack_error *err);
/* Frees the op and its workspace (NULL is a no-op). */
MASKPACK_API void maskpack_attention_op_free(maskpack_attention_op *op);
/* (op, backward?) -> *bytes of workspace one run needs (the work lists are the op's); allocates nothing. */
MASKPACK_API maskpack_status maskpack_attention_op_workspace_size(const maskpack_attention_op *op, int backward,
                                                                  size_t *bytes, maskpack_error *err);
/* (op, q, k, v, scale, softcap as for maskpack_attention_forward, team or NULL, workspace) -> out, lse or NULL. */
MASKPACK_API maskpack_status maskpack_attention_op_forward(maskpack_attention_op *op, const maskpack_tensor *q,
                                                           const maskpack_tensor *k, const maskpack_tensor *v,
                                                           double scale, double softcap, maskpack_tensor *out,
                                                           maskpack_tensor *lse, maskpack_workers *team,
                                                           void *workspace, size_t workspace_bytes,
                                                           maskpack_error *err);
/* (op, dout, q, k, v, out, lse, scale, softcap as for maskpack_attention_backward, team or NULL,
 * workspace) -> dq, dk, dv. */
MASKPACK_API maskpack_status maskpack_attention_op_backward(
    maskpack_attention_op *op, const maskpack_tensor *dout, const maskpack_tensor *q, const maskpack_tensor *k,
    const maskpack_tensor *v, const maskpack_tensor *out, const maskpack_tensor *lse, double scale, double softcap,
    maskpack_tensor *dq, maskpack_tensor *dk, maskpack_tensor *dv, maskpack_workers *team, void *workspace,
    size_t workspace_bytes, maskpack_error *err);

/* Ring attention across the ranks of a comm (context parallelism). Each rank holds its CP shard of q,
 * k, v as maskpack_layout_cp_shard(layout, comm->size, comm->rank, scheme) cuts it. Keys and values
 * travel: at step s rank r computes its queries against rank (r - s) mod size's block while the next
 * step's block is in flight, and partial outputs merge by their log-sum-exp. A block none of whose
 * query-key pairs the rule allows for a rank is neither sent to it nor computed (under a causal rule
 * most of a packed batch's pairs of ranks skip half their work). Rules: causal or not, windows, GQA,
 * softcap; spans and prefixes are MASKPACK_ERR_UNSUPPORTED (use the all-gather form). f32 only (the
 * merge keeps f32 partial outputs; bf16 is MASKPACK_ERR_DTYPE). Collective: every rank calls with the
 * same layout and scheme (checked first, as maskpack_cp_check, together with each rank's own
 * arguments, so a wrong argument on one rank fails every rank). Buffers: two blocks of k and v in
 * flight plus one output's worth, allocated per call. The result equals the single-process kernel on
 * the whole batch up to the rounding of the merge. */

/* (comm, layout of the whole batch (aligned for cp_shard), scheme, this rank's q [T_l,Hq,D] |
 * [B,S/cp,Hq,D], k, v [.., Hkv, D], all f32 contiguous, scale, softcap, opts (isa, n_threads) or
 * NULL = 1 thread, AUTO) -> out (q's shape, contiguous), lse f32 [Hq,T_l] | [B,Hq,S/cp] (NULL to
 * skip). Every kernel call of the ring runs opts.isa, checked on each rank before the ranks agree
 * (an ISA this CPU lacks fails every rank, with the local call's error on the rank that lacks it). */
MASKPACK_API maskpack_status maskpack_cp_attention_forward(const maskpack_comm *comm, const maskpack_layout *layout,
                                                           maskpack_cp_scheme scheme, const maskpack_tensor *q,
                                                           const maskpack_tensor *k, const maskpack_tensor *v,
                                                           double scale, double softcap, maskpack_tensor *out,
                                                           maskpack_tensor *lse, const maskpack_kernel_options *opts,
                                                           maskpack_error *err);

/* (comm, layout, scheme, dout, q, k, v, out and lse of the forward, scale, softcap, opts or NULL) -> dq
 * (q's shape), dk, dv (k's shape) of this rank's shard, all f32 contiguous: the blocks travel again
 * and each block's key and value gradients return to their owner (tag 1) while the next step computes. */
MASKPACK_API maskpack_status maskpack_cp_attention_backward(
    const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme, const maskpack_tensor *dout,
    const maskpack_tensor *q, const maskpack_tensor *k, const maskpack_tensor *v, const maskpack_tensor *out,
    const maskpack_tensor *lse, double scale, double softcap, maskpack_tensor *dq, maskpack_tensor *dk,
    maskpack_tensor *dv, const maskpack_kernel_options *opts, maskpack_error *err);
/* The ring on a worker team the caller owns (maskpack_workers_create or _create_hosted; NULL = the
 * caller's thread alone): every kernel call of the ring runs on it, so no thread starts per step;
 * the team's participant count in place of opts.n_threads (opts or NULL: its isa), and the same
 * bits as that n_threads. */
MASKPACK_API maskpack_status maskpack_cp_attention_forward_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                                              maskpack_cp_scheme scheme, const maskpack_tensor *q,
                                                              const maskpack_tensor *k, const maskpack_tensor *v,
                                                              double scale, double softcap, maskpack_tensor *out,
                                                              maskpack_tensor *lse, const maskpack_kernel_options *opts,
                                                              maskpack_workers *team, maskpack_error *err);
MASKPACK_API maskpack_status maskpack_cp_attention_backward_on(
    const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme, const maskpack_tensor *dout,
    const maskpack_tensor *q, const maskpack_tensor *k, const maskpack_tensor *v, const maskpack_tensor *out,
    const maskpack_tensor *lse, double scale, double softcap, maskpack_tensor *dq, maskpack_tensor *dk,
    maskpack_tensor *dv, const maskpack_kernel_options *opts, maskpack_workers *team, maskpack_error *err);
/* ==== end of Attention kernels ============================================================== */

/* ==== Gated DeltaNet (causal conv1d and the gated delta rule over a layout) ================= */
/*
 * The linear-attention layer of Qwen3-Next / Qwen3.5 (docs/conventions.md section 9), computed per
 * segment of a layout so that padded and packed batches agree bitwise and nothing crosses a
 * segment boundary. Conventions of this section:
 *   - A segment's tokens are its query columns [q_start, q_start + q_len) of its row (key columns
 *     are ignored, so CP shards work: each piece is a segment; pass states between pieces).
 *   - Per-token tensors are in the layout's token order: [B, S, ...] for a padded layout, [T, ...]
 *     (or [1, T, ...]) for a packed one, with heads as the second-to-last dim: q, k [.., H, K],
 *     v, o [.., HV, V], g, beta [.., HV]; conv input [.., C].
 *   - Value head h uses key head h / (HV / H); HV must be a multiple of H.
 *   - Inputs may be f32 or bf16 (each tensor independently); arithmetic and states are f32.
 *   - Padded positions are never read (NaN there changes nothing) and padded output rows are 0.
 *   - States: [N, HV, K, V] f32 per segment (flash-linear-attention's layout). A zero-length
 *     segment's final state is its initial state. Conv prefix/state: [N, C, W-1], most recent last.
 *   - Threads split (segment, head) pairs (rule) or channel ranges (conv); results do not depend
 *     on the thread count.
 */

/* Which kernel runs the rule: opts.isa (see Kernel ISAs; AUTO = MASKPACK_ISA, else AVX512 > AVX2 >
 * REF; amx and avx512_bf16 run the AVX-512 kernel, the rule having no kernel of theirs;
 * maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, isa) says which). The causal conv1d
 * takes its ISA per call through its maskpack_kernel_options: portable loops for REF, AVX2 + FMA
 * rows otherwise (f32 or bf16 tensors with contiguous channels; bf16 rows widened on load and
 * rounded to nearest even on store, so bf16 gives the f32 rows' result rounded, bit for bit). */

#define MASKPACK_GDN_CHUNK    64   /* chunk length of the chunked form (chunks start at each segment start) */
#define MASKPACK_GDN_MAX_CONV 4    /* largest conv kernel */
#define MASKPACK_GDN_L2_EPS   1e-6 /* q, k are normalised as x / sqrt(sum x^2 + eps) */

typedef struct maskpack_gdn_options {
    double scale;        /* output scale; 0 = 1/sqrt(K) */
    int chunked;         /* forward form: 1 = chunked (default), 0 = token-by-token recurrence */
    int l2norm;          /* 1 = L2-normalise q and k inside the rule (default), 0 = use them as given */
    int n_threads;       /* in [1, MASKPACK_MAX_THREADS] (default 1); threads are started per call (see _on) */
    maskpack_isa isa;    /* default AUTO */
    int skip_gate_check; /* 0 (default) = refuse a real token's g that is not a finite value <= 0 (g > 0
                           * grows the state; NaN, -inf); 1 = run g as given, unchecked */
} maskpack_gdn_options;

/* () -> scale 0 (1/sqrt(K)), chunked, l2norm, 1 thread, AUTO, gate checked. */
MASKPACK_API maskpack_gdn_options maskpack_gdn_options_default(void);

/* The inputs of the rule (see the conventions above for shapes). */
typedef struct maskpack_gdn_inputs {
    const maskpack_tensor *q;             /* [B,S,H,K] / [T,H,K] */
    const maskpack_tensor *k;             /* same shape as q */
    const maskpack_tensor *v;             /* [B,S,HV,V] / [T,HV,V] */
    const maskpack_tensor *g;             /* [B,S,HV] / [T,HV]: log decay per token, finite and <= 0 */
    const maskpack_tensor *beta;          /* [B,S,HV] / [T,HV]: write strength */
    const maskpack_tensor *initial_state; /* [N,HV,K,V] f32, or NULL for zeros */
} maskpack_gdn_inputs;

/* (layout, g [B,S,HV] / [T,HV] f32/bf16) -> MASKPACK_OK, or MASKPACK_ERR_VALUE naming g and the first
 * real token and head ((row, col, head); packed: (token, head)) whose log decay is not a finite value
 * <= 0: the check the forward and backward run after their shape checks unless opts.skip_gate_check
 * (one pass over the real tokens; pads are not read), for a collective caller to run before its ranks
 * agree. */
MASKPACK_API maskpack_status maskpack_gdn_check_gate(const maskpack_layout *layout, const maskpack_tensor *g,
                                                     maskpack_error *err);

/* (layout, inputs, opts, backward?) -> *bytes of workspace one call needs (all threads). Per thread:
 * forward O(chunk^2 + chunk*(K+V) + G*K*V) (G = HV/H value heads of one key head); backward adds
 * a fixed 16 states of K*V floats per value head of the group plus the state gradient, whatever
 * the segment lengths (binomial checkpointing: a segment of up to 16 chunks keeps every chunk
 * state; a longer one recomputes them, each chunk at most r times with binom(15 + r, r) >= its
 * chunk count: 3 up to 816 chunks, 4 up to 3876); never O(T) or O(T^2). Besides: the call's work list,
 * 24 bytes per (segment, head) task on 64-bit targets (twice that with more than one thread, for dealing it out), and
 * 64 bytes of alignment slack. The query allocates nothing, and with a workspace of this size the call
 * allocates nothing either (on one thread, or on a team through maskpack_gdn_forward_on). */
MASKPACK_API maskpack_status maskpack_gdn_workspace_size(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                                         const maskpack_gdn_options *opts, int backward, size_t *bytes,
                                                         maskpack_error *err);

/* (layout, inputs, opts, workspace of workspace_bytes (NULL and 0 = allocated here, as for the attention;
 * NULL with a size is MASKPACK_ERR_NULL_ARGUMENT)) -> o [B,S,HV,V] / [T,HV,V]
 * f32/bf16 (pad rows 0), final_state [N,HV,K,V] f32 or NULL. Per token of each segment:
 * S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = scale S^T q. */
MASKPACK_API maskpack_status maskpack_gdn_forward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                                  const maskpack_gdn_options *opts, maskpack_tensor *o,
                                                  maskpack_tensor *final_state, void *workspace, size_t workspace_bytes,
                                                  maskpack_error *err);

/* Gradient outputs of the rule; any pointer may be NULL to skip that output. */
typedef struct maskpack_gdn_grads {
    maskpack_tensor *dq, *dk;         /* like q, f32/bf16 (through the L2 norm when opts.l2norm) */
    maskpack_tensor *dv;              /* like v */
    maskpack_tensor *dg, *dbeta;      /* like g */
    maskpack_tensor *d_initial_state; /* [N,HV,K,V] f32 */
} maskpack_gdn_grads;

/* (layout, inputs, d_o like o (f32/bf16), d_final_state [N,HV,K,V] f32 or NULL = 0, opts, workspace)
 * -> grads (pad rows 0). Differentiates the chunked form (whatever opts.chunked says) by recomputing
 * chunk states from checkpoints; tasks are (segment, key head) pairs. */
MASKPACK_API maskpack_status maskpack_gdn_backward(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                                   const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                                   const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                                   void *workspace, size_t workspace_bytes, maskpack_error *err);

/* Sequence-parallel Gated DeltaNet across the ranks of a comm (context parallelism): each rank holds
 * its CP shard of a packed batch (maskpack_layout_cp_shard(layout, comm->size, comm->rank, scheme)),
 * any head counts. The rule is affine in the state: each rank runs its pieces from zero states and
 * through an identity state (each piece's transition S -> P S + B, P [K,K] and B [K,V] per value
 * head) at once, the transitions are all-gathered and composed in sequence order, and each rank runs
 * its pieces again from their true incoming states: no rank waits for the piece before its own.
 * Equal to maskpack_gdn_forward on the whole batch up to the rounding of composing transitions.
 * Contiguous float32 tensors; collective (checked first as maskpack_cp_check, with every rank's own
 * arguments); buffers allocated per call. Cost per rank: three passes of the kernel over its tokens
 * and the K x K compositions. */

/* (comm, whole packed layout (aligned for cp_shard), scheme, this rank's inputs (initial_state: the
 * whole batch's [N,HV,K,V] or NULL), opts) -> o [T_local,HV,V], final_state [N,HV,K,V] (NULL to skip),
 * the same on every rank. */
MASKPACK_API maskpack_status maskpack_cp_gdn_forward(const maskpack_comm *comm, const maskpack_layout *layout,
                                                     maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                                     const maskpack_gdn_options *opts, maskpack_tensor *o,
                                                     maskpack_tensor *final_state, maskpack_error *err);

/* (comm, layout, scheme, inputs, d_o like o, d_final_state [N,HV,K,V] or NULL, opts) -> grads of this
 * rank's shard (dq, dk, dv, dg, dbeta required; d_initial_state [N,HV,K,V] this rank's share: sum it
 * over the group). The adjoint of the three passes and of the composition; the gradients of each
 * rank's transitions return to it through one all-to-all. */
MASKPACK_API maskpack_status maskpack_cp_gdn_backward(const maskpack_comm *comm, const maskpack_layout *layout,
                                                      maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                                      const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                                      const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                                      maskpack_error *err);
/* Both on a worker team the caller owns (NULL = the caller's thread alone): the team's participant
 * count in place of opts.n_threads, the same bits as that count. */
MASKPACK_API maskpack_status maskpack_cp_gdn_forward_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                                        maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                                        const maskpack_gdn_options *opts, maskpack_tensor *o,
                                                        maskpack_tensor *final_state, maskpack_workers *team,
                                                        maskpack_error *err);
MASKPACK_API maskpack_status maskpack_cp_gdn_backward_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                                         maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                                         const maskpack_tensor *d_o,
                                                         const maskpack_tensor *d_final_state,
                                                         const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                                         maskpack_workers *team, maskpack_error *err);

/* (comm, whole packed layout, scheme, x: this rank's shard [T_local, C], weight [C, W], prefix [N, C, W-1]
 * or NULL, silu, opts (isa, n_threads) or NULL = 1 thread, AUTO) -> y [T_local, C], conv_state
 * [N, C, W-1] (NULL to skip) the same on every rank: the sequence-parallel causal conv1d. Each piece
 * that continues a sequence takes the last W-1 inputs before it from the all-gathered tails of the
 * pieces (contiguous float32; collective, checked first as maskpack_cp_check, opts.isa with each
 * rank's own arguments); bitwise the single-process result of the same ISA. */
MASKPACK_API maskpack_status maskpack_cp_causal_conv1d(const maskpack_comm *comm, const maskpack_layout *layout,
                                                       maskpack_cp_scheme scheme, const maskpack_tensor *x,
                                                       const maskpack_tensor *weight, const maskpack_tensor *prefix,
                                                       int silu, const maskpack_kernel_options *opts,
                                                       maskpack_tensor *y, maskpack_tensor *conv_state,
                                                       maskpack_error *err);

/* (comm, layout, scheme, x, weight, prefix, silu, dy, d_conv_state or NULL, opts or NULL) -> dx (required),
 * dweight [C, W] and d_prefix [N, C, W-1] this rank's shares (sum them over the group), NULL to skip:
 * the tails' gradients return to their owners through one all-to-all. */
MASKPACK_API maskpack_status maskpack_cp_causal_conv1d_backward(
    const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme, const maskpack_tensor *x,
    const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu, const maskpack_tensor *dy,
    const maskpack_tensor *d_conv_state, const maskpack_kernel_options *opts, maskpack_tensor *dx,
    maskpack_tensor *dweight, maskpack_tensor *d_prefix, maskpack_error *err);
/* Both on a worker team the caller owns (NULL = the caller's thread alone): the team's participant
 * count in place of opts.n_threads (opts or NULL: its isa), the same bits as that count. */
MASKPACK_API maskpack_status maskpack_cp_causal_conv1d_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                                          maskpack_cp_scheme scheme, const maskpack_tensor *x,
                                                          const maskpack_tensor *weight, const maskpack_tensor *prefix,
                                                          int silu, const maskpack_kernel_options *opts,
                                                          maskpack_workers *team, maskpack_tensor *y,
                                                          maskpack_tensor *conv_state, maskpack_error *err);
MASKPACK_API maskpack_status maskpack_cp_causal_conv1d_backward_on(
    const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme, const maskpack_tensor *x,
    const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu, const maskpack_tensor *dy,
    const maskpack_tensor *d_conv_state, const maskpack_kernel_options *opts, maskpack_workers *team,
    maskpack_tensor *dx, maskpack_tensor *dweight, maskpack_tensor *d_prefix, maskpack_error *err);

/* The rule on a worker team the caller owns (maskpack_workers_create; NULL = the caller's thread
 * alone), so that no thread starts per call: as maskpack_gdn_forward / _backward, with the team's
 * participant count in place of opts.n_threads (the workspace is maskpack_gdn_workspace_size's with
 * opts.n_threads = maskpack_workers_threads(team)). Results do not depend on the team. */
MASKPACK_API maskpack_status maskpack_gdn_forward_on(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                                     const maskpack_gdn_options *opts, maskpack_tensor *o,
                                                     maskpack_tensor *final_state, maskpack_workers *team,
                                                     void *workspace, size_t workspace_bytes, maskpack_error *err);
/* (as maskpack_gdn_backward, team or NULL) -> grads. */
MASKPACK_API maskpack_status maskpack_gdn_backward_on(const maskpack_layout *layout, const maskpack_gdn_inputs *in,
                                                      const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                                      const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                                      maskpack_workers *team, void *workspace, size_t workspace_bytes,
                                                      maskpack_error *err);

/* An operator of the rule for one layout and one set of shapes and options: created once, run many
 * times. Creation does what every call would otherwise repeat: picks the kernel (opts.isa, and
 * MASKPACK_ISA for AUTO, read now), sorts and deals out the (segment, head) work lists of the forward
 * and the backward for opts.n_threads threads. A run validates its tensors (their dims must be the
 * op's; each may be f32 or bf16 as for the plain calls) and runs on a team of at most
 * opts.n_threads participants, with the plain calls' results bit for bit. Workspace: a buffer of
 * maskpack_gdn_op_workspace_size bytes, or NULL and 0 for the op's own, allocated at the first run
 * that needs it and kept until maskpack_gdn_op_free (a run concurrent with another on the same op
 * allocates its own for the call). The layout is the caller's and must outlive the op. */
typedef struct maskpack_gdn_op maskpack_gdn_op; /* opaque */

/* (layout, key heads H >= 1, value heads HV (a multiple of H), head dims K, V >= 1, opts) -> *out. */
MASKPACK_API maskpack_status maskpack_gdn_op_create(const maskpack_layout *layout, int64_t H, int64_t HV, int64_t K,
                                                    int64_t V, const maskpack_gdn_options *opts, maskpack_gdn_op **out,
                                                    maskpack_error *err);
/* Frees the op and its workspace (NULL is a no-op). */
MASKPACK_API void maskpack_gdn_op_free(maskpack_gdn_op *op);
/* (op, backward?) -> *bytes of workspace one run needs (the work lists are the op's); allocates nothing. */
MASKPACK_API maskpack_status maskpack_gdn_op_workspace_size(const maskpack_gdn_op *op, int backward, size_t *bytes,
                                                            maskpack_error *err);
/* (op, inputs as for maskpack_gdn_forward, team or NULL, workspace) -> o, final_state or NULL. */
MASKPACK_API maskpack_status maskpack_gdn_op_forward(maskpack_gdn_op *op, const maskpack_gdn_inputs *in,
                                                     maskpack_tensor *o, maskpack_tensor *final_state,
                                                     maskpack_workers *team, void *workspace, size_t workspace_bytes,
                                                     maskpack_error *err);
/* (op, inputs, d_o, d_final_state or NULL as for maskpack_gdn_backward, team or NULL, workspace) -> grads. */
MASKPACK_API maskpack_status maskpack_gdn_op_backward(maskpack_gdn_op *op, const maskpack_gdn_inputs *in,
                                                      const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                                      maskpack_gdn_grads *grads, maskpack_workers *team,
                                                      void *workspace, size_t workspace_bytes, maskpack_error *err);

/* (layout, x [B,S,C] / [T,C] f32/bf16, weight [C,W] f32/bf16 with 1 <= W <= 4, prefix [N,C,W-1]
 * f32/bf16 or NULL = zeros, silu, opts (isa, n_threads) or NULL = 1 thread, AUTO) -> y like x
 * f32/bf16 (pad rows 0) with
 * y[t] = act(sum_w weight[w] x[t - (W-1) + w]) inside each segment (earlier positions come from
 * the prefix), conv_state [N,C,W-1] f32/bf16 or NULL = the segment's last W-1 inputs (prefix
 * included when the segment is shorter). */
MASKPACK_API maskpack_status maskpack_causal_conv1d(const maskpack_layout *layout, const maskpack_tensor *x,
                                                    const maskpack_tensor *weight, const maskpack_tensor *prefix,
                                                    int silu, const maskpack_kernel_options *opts, maskpack_tensor *y,
                                                    maskpack_tensor *conv_state, maskpack_error *err);

/* (layout, x, weight, prefix or NULL, silu, dy like x, d_conv_state [N,C,W-1] or NULL, opts or NULL)
 * -> dx like x (pad rows 0), dweight [C,W] f32 (sum over all tokens), d_prefix [N,C,W-1] f32/bf16;
 * each output may be NULL to skip it. */
MASKPACK_API maskpack_status maskpack_causal_conv1d_backward(
    const maskpack_layout *layout, const maskpack_tensor *x, const maskpack_tensor *weight,
    const maskpack_tensor *prefix, int silu, const maskpack_tensor *dy, const maskpack_tensor *d_conv_state,
    const maskpack_kernel_options *opts, maskpack_tensor *dx, maskpack_tensor *dweight, maskpack_tensor *d_prefix,
    maskpack_error *err);

/* (layout, x, weight as for the conv, backward?) -> *bytes of workspace the conv's _on calls need: 0
 * for the forward, the backward's dweight sums ([C, W] f32 and alignment slack) otherwise (a
 * backward without dweight needs none). Allocates nothing. */
MASKPACK_API maskpack_status maskpack_causal_conv1d_workspace_size(const maskpack_layout *layout,
                                                                   const maskpack_tensor *x,
                                                                   const maskpack_tensor *weight, int backward,
                                                                   size_t *bytes, maskpack_error *err);
/* maskpack_causal_conv1d on a worker team (NULL = the caller's thread alone; the channels are split
 * for the team's participant count, in place of opts.n_threads; opts or NULL: its isa) with a
 * workspace as every kernel takes it (NULL and 0 = allocated here when the call needs one; NULL
 * with a size is MASKPACK_ERR_NULL_ARGUMENT). */
MASKPACK_API maskpack_status maskpack_causal_conv1d_on(const maskpack_layout *layout, const maskpack_tensor *x,
                                                       const maskpack_tensor *weight, const maskpack_tensor *prefix,
                                                       int silu, const maskpack_kernel_options *opts,
                                                       maskpack_workers *team, maskpack_tensor *y,
                                                       maskpack_tensor *conv_state, void *workspace,
                                                       size_t workspace_bytes, maskpack_error *err);
/* maskpack_causal_conv1d_backward on a worker team (NULL = the caller alone) with a workspace of
 * maskpack_causal_conv1d_workspace_size(backward = 1) bytes (NULL and 0 = allocated here). */
MASKPACK_API maskpack_status maskpack_causal_conv1d_backward_on(
    const maskpack_layout *layout, const maskpack_tensor *x, const maskpack_tensor *weight,
    const maskpack_tensor *prefix, int silu, const maskpack_tensor *dy, const maskpack_tensor *d_conv_state,
    const maskpack_kernel_options *opts, maskpack_workers *team, maskpack_tensor *dx, maskpack_tensor *dweight,
    maskpack_tensor *d_prefix, void *workspace, size_t workspace_bytes, maskpack_error *err);

/* (layout, x [B,S,H,D] / [T,H,D] f32/bf16, eps > 0 (MASKPACK_GDN_L2_EPS)) -> y like x f32/bf16:
 * x / sqrt(sum x^2 + eps) over the last dim (pad rows 0). */
MASKPACK_API maskpack_status maskpack_gdn_l2norm(const maskpack_layout *layout, const maskpack_tensor *x, double eps,
                                                 maskpack_tensor *y, maskpack_error *err);
/* (layout, x, dy like x, eps) -> dx like x: the gradient of maskpack_gdn_l2norm (pad rows 0). */
MASKPACK_API maskpack_status maskpack_gdn_l2norm_backward(const maskpack_layout *layout, const maskpack_tensor *x,
                                                          const maskpack_tensor *dy, double eps, maskpack_tensor *dx,
                                                          maskpack_error *err);

/* (layout, a, b [B,S,HV] / [T,HV] f32/bf16, A_log [HV], dt_bias [HV] f32/bf16) -> g, beta like a
 * f32/bf16 or NULL: g = -exp(A_log) * softplus(a + dt_bias) (softplus(x) = x above 20, as torch),
 * beta = sigmoid(b); pad rows 0. */
MASKPACK_API maskpack_status maskpack_gdn_gates(const maskpack_layout *layout, const maskpack_tensor *a,
                                                const maskpack_tensor *b, const maskpack_tensor *A_log,
                                                const maskpack_tensor *dt_bias, maskpack_tensor *g,
                                                maskpack_tensor *beta, maskpack_error *err);
/* (layout, a, b, A_log, dt_bias, dg, dbeta like a (NULL = 0)) -> da, db like a, dA_log, ddt_bias [HV]
 * f32 (sums over real tokens); any output may be NULL. */
MASKPACK_API maskpack_status maskpack_gdn_gates_backward(const maskpack_layout *layout, const maskpack_tensor *a,
                                                         const maskpack_tensor *b, const maskpack_tensor *A_log,
                                                         const maskpack_tensor *dt_bias, const maskpack_tensor *dg,
                                                         const maskpack_tensor *dbeta, maskpack_tensor *da,
                                                         maskpack_tensor *db, maskpack_tensor *dA_log,
                                                         maskpack_tensor *ddt_bias, maskpack_error *err);
/* ==== end of Gated DeltaNet ================================================================= */

/* ==== Packing planner (sequences into rows, sequences across ranks) ========================= */
/*
 * A plan packs sequences into rows of a fixed token capacity (docs/conventions.md section 10) and hands the
 * rows to data-parallel ranks and micro-batches so that no rank waits for another:
 *   1. Each sequence's length is rounded up to the alignment multiple (maskpack_cp_multiple(cp, tp,
 *      align); 1 when cp == tp == 1) so the plan's rows are exactly the rows the CP shard will run:
 *      every slot (segment plus its filler, cu_seqlens_padded) divides by the multiple.
 *   2. The rounded lengths are packed into rows: best-fit-decreasing (default; what ms-swift intends,
 *      though its `binpacking` package puts each item into the emptiest row that fits), first-fit-
 *      decreasing (NeMo) or order-preserving next-fit (input order kept). A rounded length above the
 *      capacity is an error naming the sequence unless splitting is allowed: the sequence is then cut
 *      into pieces of floor(capacity / multiple) * multiple tokens (the last piece holds the rest);
 *      each piece is an independent segment of its row (it does not see the other pieces).
 *   3. The packed row count fixes the rows of every (rank, micro-batch): rows_per_microbatch =
 *      max(1, ceil(packed rows / (dp * micro_batches))), equal for all. Then, for the decreasing packers,
 *      the sequences themselves are balanced (whole rows would leave some ranks a row short whenever
 *      the row count is not a multiple of dp): dealt over the ranks largest first, each to the rank of
 *      least cost with room in one of its rows (first fit inside the rank), improved by single moves
 *      and pairwise swaps between the heaviest rank and the lightest ones, then each rank's sequences
 *      over its micro-batches the same way. Where the sequences do not fit that way the packed rows are
 *      dealt whole by balanced Karmarkar-Karp (equal row counts) and improved the same way; up to 16384
 *      pieces both are built and the better kept. Next-fit's rows are dealt whole (input order kept).
 *      A sequence's cost is L (tokens) or a*L + L^2 (attention, L the slot length).
 * Rows are numbered rank-major: row = (rank * micro_batches + micro_batch) * rows_per_microbatch + t;
 * inside a micro-batch the rows holding pieces come first. Inside a row the pieces are sorted by
 * (sequence, offset). Ties (equal lengths, equal costs) are broken by index, or, with a non-zero seed,
 * by a seeded hash of the index: the same seed always gives the same plan, different seeds give
 * different plans of the same quality. Among rows with equal free space best fit takes the one it
 * filled last.
 */

typedef struct maskpack_plan maskpack_plan; /* opaque, immutable once built */

typedef enum maskpack_plan_objective {
    MASKPACK_PLAN_TOKENS = 0,   /* cost of a slot of L tokens = L */
    MASKPACK_PLAN_ATTENTION = 1 /* cost = a*L + L^2 (verl's workload: linear layers + attention) */
} maskpack_plan_objective;

typedef enum maskpack_plan_algorithm {
    MASKPACK_PLAN_BFD = 0,    /* best-fit-decreasing: the fullest row that still fits (O(n log n)) */
    MASKPACK_PLAN_FFD = 1,    /* first-fit-decreasing: the first row that fits (O(n log n)) */
    MASKPACK_PLAN_NEXTFIT = 2 /* input order; a new row when the next sequence does not fit (O(n)) */
} maskpack_plan_algorithm;

typedef enum maskpack_plan_width {
    MASKPACK_PLAN_WIDTH_CAPACITY = 0, /* every row is `capacity` columns (static shapes); the last slot
                                         of a row runs to its end, so capacity must divide by the multiple */
    MASKPACK_PLAN_WIDTH_USED = 1      /* a row is as wide as its slots (varlen / THD streams) */
} maskpack_plan_width;

/* The attention objective's cost of a slot of L tokens is a*L + L^2: proportional to one layer's forward
 * FLOPs when a = (linear-layer FLOPs per token) / (attention FLOPs per token pair) (see
 * maskpack_plan_attention_coefficient). a is the length at which a sequence's attention work equals its
 * linear work: for sequences much shorter than a the objective balances almost by tokens, for much
 * longer ones by sum(L^2). Default (no hidden size, no a given): verl's a = 24576 = 6 * 4096. */
#define MASKPACK_PLAN_DEFAULT_ATTENTION_A 24576.0

typedef struct maskpack_plan_options {
    int64_t capacity;        /* tokens per row, >= 1 */
    int64_t dp;              /* data-parallel ranks, >= 1 */
    int64_t micro_batches;   /* micro-batches per rank, >= 1 */
    int64_t cp, tp;          /* context- and tensor-parallel sizes, >= 1 */
    maskpack_cp_align align; /* rule for the multiple (verl: tp*cp*2; minimal: cp*lcm(2,tp)) */
    int64_t multiple;        /* 0 = derive from cp, tp, align; else this multiple (>= 1) */
    maskpack_plan_objective objective;
    double attention_a; /* a of a*L + L^2 (see below); 0 = from `hidden`, else the default */
    maskpack_plan_algorithm algorithm;
    uint64_t seed;   /* 0 = ties by index */
    int allow_split; /* 1 = cut sequences longer than a row into pieces */
    maskpack_plan_width row_width;
    /* Optional progress report (called from the calling thread, a bounded number of times):
     * stage "pack" or "balance", fraction in [0, 1]. NULL = none. */
    void (*progress)(void *ctx, const char *stage, double fraction);
    void *progress_ctx;
    /* The model's hidden size, 0 = not given. With the attention objective and attention_a == 0, a is
     * taken from it as maskpack_plan_attention_coefficient(hidden, 0, 0, 0, 0, 0) = 6 * hidden (the linear
     * part verl's 24576*L stands for at hidden 4096); a given attention_a always wins. */
    int64_t hidden;
} maskpack_plan_options;

/* (capacity) -> options with dp = micro_batches = cp = tp = 1, verl alignment, derived multiple,
 * tokens objective, best-fit-decreasing, seed 0, no splitting, rows of full capacity, no progress. */
MASKPACK_API maskpack_plan_options maskpack_plan_options_default(int64_t capacity);

/* (model shape: hidden > 0, intermediate >= 0 (0 = 4*hidden), q_dim >= 0 (heads*head_dim, 0 = hidden),
 * kv_dim >= 0 (0 = q_dim), gated_mlp (1: 3 MLP matrices as SwiGLU, 0: 2), causal) -> *a such that a*L + L^2
 * is proportional to one layer's forward FLOPs on a sequence of L tokens. With W = hidden*(q_dim +
 * 2*kv_dim) + q_dim*hidden + (gated ? 3 : 2)*hidden*intermediate weights, linear layers cost 2*W*L and
 * attention 4*q_dim*L^2 (half when causal), so a = W / (2*q_dim) (W / q_dim when causal). The layer
 * count cancels. hidden 4096, MHA, 4*hidden non-gated, full square: a = 6*hidden = 24576 (verl). */
MASKPACK_API maskpack_status maskpack_plan_attention_coefficient(int64_t hidden, int64_t intermediate, int64_t q_dim,
                                                                 int64_t kv_dim, int gated_mlp, int causal, double *a,
                                                                 maskpack_error *err);

/* (lengths[n] >= 0, options) -> plan (see above). A sequence whose rounded length exceeds the capacity
 * is MASKPACK_ERR_VALUE naming lengths[k] (index k) unless options->allow_split; a dp and micro-batch
 * count whose rows cannot be laid out is MASKPACK_ERR_INVALID_ARGUMENT (or OVERFLOW) naming both.
 * Release with maskpack_plan_free. */
MASKPACK_API maskpack_status maskpack_plan_create(const int64_t *lengths, size_t n,
                                                  const maskpack_plan_options *options, maskpack_plan **out,
                                                  maskpack_error *err);
/* Releases a plan; NULL is a no-op. */
MASKPACK_API void maskpack_plan_free(maskpack_plan *plan);

/* One piece of a sequence placed in a row (a whole sequence is one piece with offset 0). */
typedef struct maskpack_plan_piece {
    int64_t sequence; /* index into the lengths the plan was made from */
    int64_t offset;   /* first token of the sequence this piece holds */
    int64_t length;   /* real tokens */
    int64_t slot;     /* length rounded up to the multiple: the columns it occupies in its row */
} maskpack_plan_piece;

/* Accessors (plan must be non-NULL; an index out of range returns -1). */
MASKPACK_API int64_t maskpack_plan_n_rows(const maskpack_plan *plan);
MASKPACK_API int64_t maskpack_plan_n_sequences(const maskpack_plan *plan);
/* (plan) -> the alignment multiple used. */
MASKPACK_API int64_t maskpack_plan_multiple(const maskpack_plan *plan);
MASKPACK_API int64_t maskpack_plan_rank_of_row(const maskpack_plan *plan, int64_t row);
MASKPACK_API int64_t maskpack_plan_microbatch_of_row(const maskpack_plan *plan, int64_t row);
/* (plan, row) -> sum of the row's slot lengths (columns in use). */
MASKPACK_API int64_t maskpack_plan_row_used(const maskpack_plan *plan, int64_t row);
/* (plan, row) -> the row's cost under the plan's objective (-1 out of range). */
MASKPACK_API double maskpack_plan_row_cost(const maskpack_plan *plan, int64_t row);
/* (plan, rank) -> the rank's cost (sum over its rows); (plan, rank, micro_batch) -> that micro-batch's. */
MASKPACK_API double maskpack_plan_rank_cost(const maskpack_plan *plan, int64_t rank);
MASKPACK_API double maskpack_plan_microbatch_cost(const maskpack_plan *plan, int64_t rank, int64_t micro_batch);

/* (plan, row) -> number of pieces in the row (-1 out of range). */
MASKPACK_API int64_t maskpack_plan_row_count(const maskpack_plan *plan, int64_t row);
/* (plan, row, out[capacity]) -> out[0..count) = the row's pieces sorted by (sequence, offset), *count = how
 * many. capacity 0 only sizes (out may be NULL); capacity < count is BUFFER_TOO_SMALL (nothing written). */
MASKPACK_API maskpack_status maskpack_plan_row(const maskpack_plan *plan, int64_t row, maskpack_plan_piece *out,
                                               size_t capacity, size_t *count, maskpack_error *err);

/* (plan, row, rule or NULL = maskpack_rule_default()) -> packed layout [1 row of capacity, or of the
 * used width] of the row's pieces: piece k at the sum of the previous slots, its slot's filler after
 * it (the last slot runs to the row's end), so cu_seqlens_padded gives the slots. */
MASKPACK_API maskpack_status maskpack_plan_row_layout(const maskpack_plan *plan, int64_t row, const maskpack_rule *rule,
                                                      maskpack_layout **out, maskpack_error *err);
/* (plan, rank, micro_batch, rule or NULL) -> layout [rows_per_microbatch, capacity (or the widest row's
 * used width)] (not packed) whose row t is the micro-batch's t-th row laid out as above. */
MASKPACK_API maskpack_status maskpack_plan_microbatch_layout(const maskpack_plan *plan, int64_t rank,
                                                             int64_t micro_batch, const maskpack_rule *rule,
                                                             maskpack_layout **out, maskpack_error *err);

typedef struct maskpack_plan_report {
    int64_t n_sequences, n_pieces;
    int64_t n_split;       /* sequences cut into more than one piece */
    int64_t n_rows;        /* rows in the plan = dp * micro_batches * rows_per_microbatch */
    int64_t n_packed_rows; /* rows the packer filled */
    int64_t n_empty_rows;  /* rows added (empty) so every rank and micro-batch has as many rows */
    int64_t rows_per_rank, rows_per_microbatch;
    int64_t capacity, multiple;
    int64_t real_tokens;       /* sum of lengths */
    int64_t alignment_padding; /* slot columns that are filler: sum(slot - length) */
    int64_t tail_padding;      /* unused columns at the end of the packed rows (capacity - used) */
    double fill;               /* fill of non-empty rows: real_tokens / (capacity * n_packed_rows) (1 for
                                      no rows); flatters a plan whose ranks step through empty rows */
    double fill_all_rows;      /* real_tokens / (capacity * n_rows): over every row every rank runs, empty
                                      rows included (the honest figure) */
    double attention_a;        /* a used by the attention objective */
    double rank_cost_min, rank_cost_mean, rank_cost_max;
    double imbalance; /* rank_cost_max / rank_cost_mean - 1 (0 when the mean is 0) */
    double microbatch_cost_max, microbatch_cost_mean;
    double microbatch_imbalance; /* over every (rank, micro-batch): max / mean - 1 */
    double fill_nonempty_rows;   /* = fill, under the name that says what it counts */
    /* Both objectives per rank, whichever one the plan balanced: tokens = slot columns in use,
     * attention = sum of a*L + L^2 over the rank's slots (a = attention_a). imbalance = max / mean - 1. */
    double rank_tokens_min, rank_tokens_mean, rank_tokens_max, token_imbalance;
    double rank_attention_mean, rank_attention_max, attention_imbalance;
} maskpack_plan_report;

/* (plan) -> *report. */
MASKPACK_API maskpack_status maskpack_plan_get_report(const maskpack_plan *plan, maskpack_plan_report *report,
                                                      maskpack_error *err);

/* ==== end of Packing planner ================================================================ */

#ifdef __cplusplus
}
#endif

#endif /* MASKPACK_H */
