/* emit.c: `maskpack inspect --emit ... --out FILE`: derived outputs of the merged layout, computed by the
 * library's derive functions and written as .npz (or .safetensors when the name ends so). Nothing is
 * written when the batch has problems or any output fails. */
#include "cli.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ITEMS 40

typedef struct emit_ctx {
    const cli_options *o;
    cli_report *r;
    size_t n;
    mpio_named_tensor items[MAX_ITEMS];
    void *buffers[MAX_ITEMS];
} emit_ctx;

/* Allocates a zeroed C-contiguous tensor and registers it under `name`; NULL when out of memory or
 * the size overflows. */
static maskpack_tensor *new_item(emit_ctx *c, const char *name, maskpack_dtype dt, int32_t ndim, const int64_t *shape) {
    if (c->n >= MAX_ITEMS) return NULL;
    int64_t numel = 1;
    for (int32_t d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(numel, shape[d], &numel)) return NULL;
    }
    size_t bytes;
    /* outputs count against the memory budget too (--max-bytes) */
    if (mp_mul_size((size_t)numel, maskpack_dtype_size(dt), &bytes) || bytes > MPIO_MAX_BYTES ||
        bytes > c->o->max_bytes)
        return NULL;
    void *buf = mp_calloc_array(bytes, 1);
    if (!buf) return NULL;
    c->buffers[c->n] = buf;
    c->items[c->n].name = name;
    c->items[c->n].tensor = maskpack_tensor_contiguous(buf, dt, ndim, shape);
    return &c->items[c->n++].tensor;
}

/* Drops the most recently added item (after its derive call failed). */
static void drop_last(emit_ctx *c) {
    c->n--;
    free(c->buffers[c->n]);
}

static int fail(emit_ctx *c, const char *what, const maskpack_error *e) {
    cli_problem(c->r, "emit %s: %s: %s", what, maskpack_status_name(e->status), e->message);
    return CLI_EXIT_PROBLEMS;
}

static int oom(emit_ctx *c, const char *what) {
    cli_problem(c->r,
                "emit %s: cannot allocate the output (larger than the memory budget of %llu bytes "
                "(--max-bytes), or out of memory)",
                what, (unsigned long long)c->o->max_bytes);
    return CLI_EXIT_PROBLEMS;
}

/* Per-token shape of the layout: [T] when packed, [B,S] otherwise. */
/* Registers a text item (a name a consumer passes as a string, such as the NPU input_layout). */
static int add_text(emit_ctx *c, const char *name, const char *text) {
    if (c->n >= MAX_ITEMS) return oom(c, name);
    c->buffers[c->n] = NULL;
    memset(&c->items[c->n], 0, sizeof c->items[c->n]);
    c->items[c->n].name = name;
    c->items[c->n].text = text;
    c->n++;
    return 0;
}

static int32_t per_token_shape(const cli_report *r, int64_t *shape) {
    if (maskpack_layout_is_packed(r->layout)) {
        shape[0] = maskpack_layout_q_width(r->layout);
        return 1;
    }
    shape[0] = maskpack_layout_n_rows(r->layout);
    shape[1] = maskpack_layout_q_width(r->layout);
    return 2;
}

static maskpack_dtype index_dtype(const cli_options *o, maskpack_dtype dflt) {
    return o->index_dtype >= 0 ? (maskpack_dtype)o->index_dtype : dflt;
}

typedef maskpack_status (*per_token_fn)(const maskpack_layout *, maskpack_tensor *, maskpack_error *);

static int emit_per_token(emit_ctx *c, const char *name, maskpack_dtype dt, per_token_fn fn) {
    int64_t shape[2];
    int32_t nd = per_token_shape(c->r, shape);
    maskpack_tensor *t = new_item(c, name, dt, nd, shape);
    if (!t) return oom(c, name);
    maskpack_error e;
    if (fn(c->r->layout, t, &e)) {
        drop_last(c);
        return fail(c, name, &e);
    }
    return 0;
}

static int emit_mask4d(emit_ctx *c) {
    const cli_options *o = c->o;
    const maskpack_layout *L = c->r->layout;
    maskpack_mask_convention conv = o->emit_conv == CLI_CONV_MASKED     ? MASKPACK_MASK_MASKED
                                    : o->emit_conv == CLI_CONV_ADDITIVE ? MASKPACK_MASK_ADDITIVE
                                                                        : MASKPACK_MASK_KEEP;
    maskpack_dtype dt = o->emit_dtype >= 0               ? (maskpack_dtype)o->emit_dtype
                        : conv == MASKPACK_MASK_ADDITIVE ? MASKPACK_F32
                                                         : MASKPACK_BOOL;
    int64_t shape[4] = {maskpack_layout_n_rows(L), 1, maskpack_layout_q_width(L), maskpack_layout_kv_width(L)};
    maskpack_tensor *t = new_item(c, "mask4d", dt, 4, shape);
    if (!t) return oom(c, "mask4d");
    maskpack_error e;
    if (maskpack_mask4d(L, conv, (maskpack_fill)o->emit_fill, t, &e)) {
        drop_last(c);
        return fail(c, "mask4d", &e);
    }
    return 0;
}

static int emit_cu(emit_ctx *c, int which) {
    const maskpack_layout *L = c->r->layout;
    int64_t n = (int64_t)maskpack_layout_n_segments(L);
    static const char *const names[] = {"cu_seqlens", "cu_seqlens_npu", "cu_seqlens_padded", "seqlens"};
    int64_t len = which == 1 || which == 3 ? n : n + 1;
    maskpack_tensor *t = new_item(c, names[which], index_dtype(c->o, MASKPACK_I32), 1, &len);
    if (!t) return oom(c, names[which]);
    maskpack_error e;
    maskpack_status s = which == 0   ? maskpack_cu_seqlens(L, MASKPACK_CU_TE, 0, t, &e)
                        : which == 1 ? maskpack_cu_seqlens(L, MASKPACK_CU_NPU, 0, t, &e)
                        : which == 2 ? maskpack_cu_seqlens_padded(L, t, &e)
                                     : maskpack_seqlens(L, 0, t, &e);
    if (s) {
        drop_last(c);
        return fail(c, names[which], &e);
    }
    return 0;
}

static int emit_indices(emit_ctx *c, int last) {
    const maskpack_layout *L = c->r->layout;
    const char *name = last ? "last_token_index" : "valid_indices";
    int64_t len = last ? (int64_t)maskpack_layout_n_segments(L) : maskpack_layout_n_tokens(L);
    maskpack_tensor *t = new_item(c, name, index_dtype(c->o, MASKPACK_I64), 1, &len);
    if (!t) return oom(c, name);
    maskpack_error e;
    maskpack_status s = last ? maskpack_last_token_index(L, t, &e) : maskpack_valid_indices(L, t, &e);
    if (s) {
        drop_last(c);
        return fail(c, name, &e);
    }
    return 0;
}

static int emit_block_mask(emit_ctx *c) {
    const maskpack_layout *L = c->r->layout;
    maskpack_error e;
    int64_t qb, kb, B = maskpack_layout_n_rows(L), blk = c->o->block;
    if (maskpack_block_mask_dims(L, blk, blk, &qb, &kb, &e)) return fail(c, "block_mask", &e);
    int64_t s_q[2] = {B, qb}, s_qk[3] = {B, qb, kb}, s_k[2] = {B, kb}, s_kq[3] = {B, kb, qb};
    static const char *const names[8] = {"block_mask_kv_num_blocks",      "block_mask_kv_indices",
                                         "block_mask_full_kv_num_blocks", "block_mask_full_kv_indices",
                                         "block_mask_q_num_blocks",       "block_mask_q_indices",
                                         "block_mask_full_q_num_blocks",  "block_mask_full_q_indices"};
    const int64_t *shapes[8] = {s_q, s_qk, s_q, s_qk, s_k, s_kq, s_k, s_kq};
    int32_t *ptr[8];
    for (int i = 0; i < 8; i++) {
        maskpack_tensor *t = new_item(c, names[i], MASKPACK_I32, i % 2 ? 3 : 2, shapes[i]);
        if (!t) {
            while (i-- > 0) drop_last(c);
            return oom(c, "block_mask");
        }
        ptr[i] = t->data;
    }
    maskpack_block_mask_arrays a = {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], ptr[5], ptr[6], ptr[7]};
    if (maskpack_block_mask(L, blk, blk, &a, &e)) {
        for (int i = 0; i < 8; i++) drop_last(c);
        return fail(c, "block_mask", &e);
    }
    return 0;
}

/* Registers a copy of a small host array as an item. */
static int add_copy(emit_ctx *c, const char *name, maskpack_dtype dt, int32_t ndim, const int64_t *shape,
                    const void *src) {
    maskpack_tensor *t = new_item(c, name, dt, ndim, shape);
    if (!t) return oom(c, name);
    int64_t numel = 1;
    for (int32_t d = 0; d < ndim; d++) numel *= shape[d];
    if (numel) memcpy(t->data, src, (size_t)numel * maskpack_dtype_size(dt));
    return 0;
}

static int emit_npu(emit_ctx *c) {
    cli_report *r = c->r;
    const cli_options *o = c->o;
    const maskpack_layout *L = r->layout;
    maskpack_npu_layout lay = o->npu_layout >= 0             ? (maskpack_npu_layout)o->npu_layout
                              : maskpack_layout_is_packed(L) ? MASKPACK_NPU_TND
                                                             : MASKPACK_NPU_BSND;
    maskpack_error e;
    if (maskpack_npu_args(L, lay, o->scale, o->head_dim, &r->npu, &e)) return fail(c, "npu", &e);
    r->have_npu = 1;
    const maskpack_npu_argset *a = &r->npu;
    int32_t i32[2] = {a->sparse_mode, a->inner_precise};
    int64_t i64[2] = {a->pre_tokens, a->next_tokens};
    int rc = add_copy(c, "npu_sparse_mode", MASKPACK_I32, 0, NULL, &i32[0]);
    if (!rc) rc = add_copy(c, "npu_inner_precise", MASKPACK_I32, 0, NULL, &i32[1]);
    /* the string torch_npu.npu_fusion_attention takes (a 0-d numpy string in .npz, __metadata__ in
       .safetensors), not a numeric code a reader would have to look up */
    if (!rc) rc = add_text(c, "npu_input_layout", cli_npu_layout_name(a->input_layout));
    if (!rc) rc = add_copy(c, "npu_pre_tockens", MASKPACK_I64, 0, NULL, &i64[0]);
    if (!rc) rc = add_copy(c, "npu_next_tockens", MASKPACK_I64, 0, NULL, &i64[1]);
    if (!rc) rc = add_copy(c, "npu_scale", MASKPACK_F64, 0, NULL, &a->scale);
    if (!rc && a->actual_seq_qlen)
        rc = add_copy(c, "npu_actual_seq_qlen", MASKPACK_I64, 1, &a->n_items, a->actual_seq_qlen);
    if (!rc && a->actual_seq_kvlen)
        rc = add_copy(c, "npu_actual_seq_kvlen", MASKPACK_I64, 1, &a->n_items, a->actual_seq_kvlen);
    if (!rc && a->pad_items) rc = add_copy(c, "npu_pad_items", MASKPACK_U8, 1, &a->n_items, a->pad_items);
    if (!rc && a->prefix) rc = add_copy(c, "npu_prefix", MASKPACK_I64, 1, &a->n_prefix, a->prefix);
    if (!rc && a->mask_kind != MASKPACK_NPU_MASK_NONE) {
        maskpack_tensor *t = new_item(c, "npu_atten_mask", MASKPACK_BOOL, a->mask_ndim, a->mask_shape);
        if (!t) return oom(c, "npu_atten_mask");
        if (maskpack_npu_atten_mask(L, a, t, &e)) {
            drop_last(c);
            return fail(c, "npu_atten_mask", &e);
        }
    }
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int cli_emit_outputs(const cli_options *o, cli_report *r) {
    if (!r->layout || r->n_problems_total) return CLI_EXIT_PROBLEMS; /* the caller says why */
    emit_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.r = r;
    int rc = 0;
    for (int k = 0; k < EMIT_COUNT_ && !rc; k++) {
        if (!(o->emit & (1u << k))) continue;
        switch ((cli_emit)k) {
        case EMIT_MASK2D: rc = emit_per_token(&c, "mask2d", MASKPACK_I64, maskpack_mask2d); break;
        case EMIT_MASK4D: rc = emit_mask4d(&c); break;
        case EMIT_CU_SEQLENS: rc = emit_cu(&c, 0); break;
        case EMIT_CU_SEQLENS_NPU: rc = emit_cu(&c, 1); break;
        case EMIT_CU_SEQLENS_PADDED: rc = emit_cu(&c, 2); break;
        case EMIT_SEQLENS: rc = emit_cu(&c, 3); break;
        case EMIT_POSITION_IDS:
            rc = emit_per_token(&c, "position_ids", index_dtype(o, MASKPACK_I64), maskpack_position_ids);
            break;
        case EMIT_SEGMENT_IDS:
            rc = emit_per_token(&c, "segment_ids", index_dtype(o, MASKPACK_I64), maskpack_segment_ids);
            break;
        case EMIT_VALID_INDICES: rc = emit_indices(&c, 0); break;
        case EMIT_LAST_TOKEN_INDEX: rc = emit_indices(&c, 1); break;
        case EMIT_BLOCK_MASK: rc = emit_block_mask(&c); break;
        case EMIT_NPU: rc = emit_npu(&c); break;
        default: break;
        }
    }
    if (!rc && !o->out) { /* in memory: both encoders, nothing kept */
        maskpack_error e;
        uint8_t *buf = NULL;
        size_t len = 0;
        maskpack_status s = mpio_npz_encode(c.items, c.n, o->deflate, &buf, &len, &e);
        free(buf);
        buf = NULL;
        if (!s) s = mpio_safetensors_encode(c.items, c.n, &buf, &len, &e);
        free(buf);
        if (s) {
            cli_problem(r, "emit: encoding: %s: %s", maskpack_status_name(s), e.message);
            rc = CLI_EXIT_PROBLEMS;
        }
    } else if (!rc) {
        maskpack_error e;
        maskpack_status s = ends_with(o->out, ".safetensors") ? mpio_safetensors_save(o->out, c.items, c.n, &e)
                                                              : mpio_npz_save(o->out, c.items, c.n, o->deflate, &e);
        if (s) {
            cli_problem(r, "emit: writing %s: %s: %s", o->out, maskpack_status_name(s), e.message);
            rc = CLI_EXIT_PROBLEMS;
        }
    }
    if (!rc)
        for (size_t i = 0; i < c.n && r->n_emitted < sizeof r->emitted / sizeof r->emitted[0]; i++) {
            const maskpack_tensor *t = &c.items[i].tensor;
            char *line = r->emitted[r->n_emitted++];
            if (c.items[i].text) {
                snprintf(line, sizeof r->emitted[0], "%s text '%s'", c.items[i].name, c.items[i].text);
                continue;
            }
            size_t used =
                (size_t)snprintf(line, sizeof r->emitted[0], "%s %s [", c.items[i].name, maskpack_dtype_name(t->dtype));
            for (int32_t d = 0; d < t->ndim && used < sizeof r->emitted[0]; d++)
                used += (size_t)snprintf(line + used, sizeof r->emitted[0] - used, d ? ", %lld" : "%lld",
                                         (long long)t->shape[d]);
            if (used < sizeof r->emitted[0]) snprintf(line + used, sizeof r->emitted[0] - used, "]");
        }
    for (size_t i = 0; i < c.n; i++) free(c.buffers[i]);
    return rc;
}
