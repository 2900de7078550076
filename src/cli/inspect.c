/* inspect.c: `maskpack inspect`: load a batch, build the layout each input describes with the library's
 * constructors, cross-check the inputs against each other and build one merged layout.
 *
 * What each input can state:
 *   attention_mask 2D keep      which tokens are real (not where packed documents split)
 *   attention_mask 2D doc_id    real tokens and documents
 *   attention_mask 4D           real tokens, documents and the rule ([B,1,1,S]: real tokens only)
 *   cu_seqlens (+ _padded)      real tokens and documents of the flattened grid
 *   position_ids                documents; padding only as a tail of zeros (left padding is invisible)
 * Disagreements are reported only about what both inputs can state, so a keep mask plus position_ids
 * (the usual packed-with-padding batch) is consistent, while position_ids and cu_seqlens that split
 * a row differently are a problem. */
#include "cli.h"

#include "draw.h"
#include "internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void add_problem(cli_report *r, int64_t row, int64_t col, const char *fmt, va_list ap) {
    r->n_problems_total++;
    if (r->n_problems >= CLI_MAX_PROBLEMS) return;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    r->problems[r->n_problems] = mpio_strdup(buf);
    r->problem_row[r->n_problems] = row;
    r->problem_col[r->n_problems] = col;
    if (r->problems[r->n_problems]) r->n_problems++;
}

void cli_problem(cli_report *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    add_problem(r, -1, -1, fmt, ap);
    va_end(ap);
}

void cli_problem_at(cli_report *r, int64_t row, int64_t col, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    add_problem(r, row, col, fmt, ap);
    va_end(ap);
}

void cli_report_free(cli_report *r) {
    for (size_t i = 0; i < r->n_sources; i++) {
        maskpack_layout_free(r->sources[i].layout);
        free(r->sources[i].seg);
    }
    for (size_t i = 0; i < r->n_problems; i++) free(r->problems[i]);
    maskpack_layout_free(r->layout);
    if (r->have_npu) maskpack_npu_argset_release(&r->npu);
    mpio_arrayset_free(&r->arrays);
    memset(r, 0, sizeof *r);
}

static void problem_from_error(cli_report *r, const char *what, const maskpack_error *e) {
    cli_problem(r, "%s: %s: %s", what, maskpack_status_name(e->status), e->message);
}

/* Element (b, s) of a per-token tensor [B,S] or [T] (b = 0), as int64. */
static int64_t token_i64(const mpio_array *a, int64_t b, int64_t s) {
    maskpack_tensor t = mpio_array_view(a);
    int64_t off = a->ndim == 1 ? s * t.strides[0] : b * t.strides[0] + s * t.strides[1];
    return mp_read_i64(t.dtype, t.data, off);
}

static void fmt_shape(char *buf, size_t cap, const mpio_array *a) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int32_t d = 0; d < a->ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld", (long long)a->shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* ---- loading ------------------------------------------------------------------------------------ */

static int load_arrays(const cli_options *o, cli_report *r) {
    maskpack_error e;
    maskpack_status s;
    if (o->data) {
        r->origin = o->file ? o->file : "memory";
        s = o->data_len > o->max_bytes
                ? mp_fail(&e, MASKPACK_ERR_UNSUPPORTED, "file", -1, -1, "more than the memory budget of %llu bytes",
                          (unsigned long long)o->max_bytes)
                : mpio_parse_any_budget(o->data, o->data_len, o->max_bytes, &r->arrays, &e);
    } else if (o->file) {
        r->origin = o->file;
        s = mpio_load_any_budget(o->file, o->max_bytes, &r->arrays, &e);
    } else {
        r->origin = "sample batch (embedded)";
        s = mpio_parse_any(mp_cli_sample_npz, mp_cli_sample_npz_len, &r->arrays, &e);
    }
    if (s) {
        problem_from_error(r, "load", &e);
        return CLI_EXIT_PROBLEMS;
    }
    int bare = r->arrays.n == 1 && r->arrays.arrays[0].name == NULL;
    if (bare) {
        if (!o->as) {
            fprintf(stderr,
                    "maskpack inspect: %s is a bare .npy; say what it holds with --as "
                    "attention_mask|position_ids|cu_seqlens|mask4d\n",
                    r->origin);
            r->fatal = 1;
            return CLI_EXIT_USAGE;
        }
        const char *name = strcmp(o->as, "mask4d") == 0 ? "attention_mask" : o->as;
        r->arrays.arrays[0].name = mpio_strdup(name);
        if (strcmp(o->as, "mask4d") == 0 && r->arrays.arrays[0].ndim != 4) {
            fprintf(stderr, "maskpack inspect: --as mask4d, but %s has %d dimensions\n", r->origin,
                    (int)r->arrays.arrays[0].ndim);
            r->fatal = 1;
            return CLI_EXIT_USAGE;
        }
    } else if (o->as) {
        fprintf(stderr, "maskpack inspect: --as applies to a bare .npy; %s names its arrays\n", r->origin);
        r->fatal = 1;
        return CLI_EXIT_USAGE;
    }
    return 0;
}

/* ---- the token grid --------------------------------------------------------------------------- */

/* Grid [B,S] a per-token array implies; returns 0 when its rank is not a per-token rank. */
static int grid_of(const mpio_array *a, int64_t *B, int64_t *S, int *packed) {
    const char *n = a->name;
    *packed = 0;
    if (strcmp(n, "attention_mask") == 0) {
        if (a->ndim == 2)
            *B = a->shape[0], *S = a->shape[1];
        else if (a->ndim == 4)
            *B = a->shape[0], *S = a->shape[3];
        else
            return 0;
        return 1;
    }
    if (strcmp(n, "position_ids") == 0 && a->ndim == 3) {
        *B = a->shape[1], *S = a->shape[2];
        return 1;
    }
    if (a->ndim == 1) {
        *B = 1, *S = a->shape[0], *packed = 1;
        return 1;
    }
    if (a->ndim == 2) {
        *B = a->shape[0], *S = a->shape[1];
        return 1;
    }
    return 0;
}

/* Sets the grid from the per-token arrays; arrays that disagree are reported and dropped (*usable=0). */
static void find_grid(cli_report *r, const mpio_array **per_token, size_t n, int *usable) {
    const mpio_array *first = NULL;
    for (size_t i = 0; i < n; i++) {
        usable[i] = 0;
        const mpio_array *a = per_token[i];
        if (!a) continue;
        int64_t B, S;
        int packed;
        char shape[160];
        fmt_shape(shape, sizeof shape, a);
        if (!grid_of(a, &B, &S, &packed)) {
            cli_problem(r, "%s: %s %s has no per-token shape (expected [B,S] or [T]%s)", a->name,
                        maskpack_dtype_name(a->dtype), shape,
                        strcmp(a->name, "attention_mask") == 0 ? ", or a 4D mask"
                        : strcmp(a->name, "position_ids") == 0 ? ", or [3,B,S]"
                                                               : "");
            continue;
        }
        if (!first) {
            first = a;
            r->B = B, r->S = S, r->packed = packed, r->have_grid = 1;
            usable[i] = 1;
            continue;
        }
        if (B != r->B || S != r->S) {
            char fshape[160];
            fmt_shape(fshape, sizeof fshape, first);
            cli_problem(r, "shape: %s %s implies a [%lld, %lld] token grid, %s %s implies [%lld, %lld]", a->name, shape,
                        (long long)B, (long long)S, first->name, fshape, (long long)r->B, (long long)r->S);
            continue;
        }
        if (!packed) r->packed = 0; /* a [B,S] tensor says this is a padded grid even when B = 1 */
        usable[i] = 1;
    }
}

/* ---- sources ------------------------------------------------------------------------------------ */

/* Without --alignment the alignment is UNSTATED: the library then refuses a causal or windowed rule
 * over a segment whose query and key lengths differ, as it does for every binding, instead of
 * assuming bottom-right. */
static maskpack_rule rule_from_flags(const cli_options *o) {
    maskpack_rule rule = maskpack_rule_default();
    rule.alignment = MASKPACK_ALIGN_UNSTATED;
    if (o->causal >= 0) rule.causal = o->causal;
    if (o->have_window) rule.window_left = o->window_left, rule.window_right = o->window_right;
    if (o->alignment >= 0) rule.alignment = (maskpack_alignment)o->alignment;
    return rule;
}

static int rule_flags_given(const cli_options *o) { return o->causal >= 0 || o->have_window || o->alignment >= 0; }

/* Checks the conventions every present input needs before building anything (exit 2 when missing). */
static int check_conventions(const cli_options *o, const mpio_array *mask, const mpio_array *pos, const mpio_array *cu,
                             cli_report *r) {
    const char *why = NULL;
    if (mask && mask->ndim == 2 && o->mask_conv != CLI_CONV_KEEP && o->mask_conv != CLI_CONV_DOC_ID)
        why = o->mask_conv == CLI_CONV_UNSET
                  ? "attention_mask is a 2D mask: pass --mask-convention keep (1 = token, HF) or doc_id (1-based "
                    "document ids, 0 = pad)"
                  : "--mask-convention masked|additive describes 4D masks; a 2D attention_mask is keep or doc_id";
    else if (mask && mask->ndim == 4 && (o->mask_conv == CLI_CONV_UNSET || o->mask_conv == CLI_CONV_DOC_ID))
        why = o->mask_conv == CLI_CONV_UNSET
                  ? "attention_mask is a 4D mask: pass --mask-convention keep (1 = attend, torch SDPA), masked (1 = "
                    "excluded, Megatron/TE/Ascend) or additive (0 / -inf)"
                  : "--mask-convention doc_id describes 2D masks; a 4D attention_mask is keep, masked or additive";
    else if (pos && o->position_rule < 0)
        why = "position_ids present: pass --position-rule reset (a sequence starts at the minimum, HF flash path) "
              "or step (at any step other than +1, HF mask builders)";
    else if (cu && o->cu_form < 0)
        why = "cu_seqlens present: pass --cu-form te ([0, e1, ..., eN]) or npu ([e1, ..., eN])";
    if (!why) return 0;
    fprintf(stderr, "maskpack inspect: %s\n", why);
    r->fatal = 1;
    return CLI_EXIT_USAGE;
}

static cli_source *add_source(cli_report *r, const char *name, const char *how, const mpio_array *a) {
    cli_source *s = &r->sources[r->n_sources++];
    memset(s, 0, sizeof *s);
    s->name = name;
    s->how = how;
    s->array = a;
    return s;
}

static void build_mask_source(const cli_options *o, cli_report *r, const mpio_array *a, const maskpack_rule *rule) {
    maskpack_tensor t = mpio_array_view(a);
    if (a->ndim == 2) {
        cli_source *s =
            add_source(r, "attention_mask", o->mask_conv == CLI_CONV_KEEP ? "2D keep mask" : "2D doc-id mask", a);
        s->full_validity = 1;
        s->boundaries = o->mask_conv == CLI_CONV_DOC_ID;
        maskpack_layout_from_mask2d(&t, o->mask_conv == CLI_CONV_KEEP ? MASKPACK_MASK2D_KEEP : MASKPACK_MASK2D_DOC_ID,
                                    rule, &s->layout, &s->err);
        return;
    }
    maskpack_mask_convention conv = o->mask_conv == CLI_CONV_KEEP     ? MASKPACK_MASK_KEEP
                                    : o->mask_conv == CLI_CONV_MASKED ? MASKPACK_MASK_MASKED
                                                                      : MASKPACK_MASK_ADDITIVE;
    static const char *const hows4[] = {"4D keep mask", "4D masked mask", "4D additive mask"};
    static const char *const hows1[] = {"[B,1,1,S] keep padding mask", "[B,1,1,S] masked padding mask",
                                        "[B,1,1,S] additive padding mask"};
    if (a->shape[2] == 1 && a->shape[3] != 1) {
        /* a padding-only mask (TE): reduce it to the 2D keep mask, then read that */
        cli_source *s = add_source(r, "attention_mask", hows1[conv], a);
        s->full_validity = 1;
        int64_t shape[2] = {a->shape[0], a->shape[3]};
        int64_t n = 0;
        if (mp_mul_overflow(shape[0], shape[1], &n) || n > ((int64_t)1 << 32)) {
            mp_fail(&s->err, MASKPACK_ERR_OVERFLOW, "attention_mask", -1, -1, "attention_mask: too many tokens");
            return;
        }
        uint8_t *keep = malloc(n ? (size_t)n : 1);
        if (!keep) {
            mp_fail(&s->err, MASKPACK_ERR_OUT_OF_MEMORY, "attention_mask", -1, -1, "out of memory");
            return;
        }
        maskpack_tensor k = maskpack_tensor_contiguous(keep, MASKPACK_U8, 2, shape);
        if (maskpack_mask2d_from_mask4d(&t, conv, &k, &s->err) == MASKPACK_OK)
            maskpack_layout_from_mask2d(&k, MASKPACK_MASK2D_KEEP, rule, &s->layout, &s->err);
        free(keep);
        return;
    }
    cli_source *s = add_source(r, "attention_mask", hows4[conv], a);
    s->full_validity = 1;
    s->boundaries = 1;
    maskpack_layout_from_mask4d(&t, conv, &s->layout, &s->err);
}

/* Fills src->seg over the grid; returns 0 when the source's layout does not cover the grid. */
static int fill_seg(const cli_options *o, cli_report *r, cli_source *src) {
    const maskpack_layout *L = src->layout;
    int64_t B = r->B, S = r->S, cells;
    /* The per-token analysis holds a segment id per grid cell: a grid a few bytes can claim (a
     * cu_seqlens [0, 2^61]) must fit the budget before anything is allocated or visited. */
    size_t bytes;
    if (mp_mul_overflow(B, S, &cells) || mp_mul_size((size_t)cells, sizeof *src->seg, &bytes) || bytes > o->max_bytes) {
        cli_problem(r,
                    "%s: the token grid [%lld, %lld] is too large to analyze token by token: it needs more "
                    "than the memory budget of %llu bytes (--max-bytes)",
                    src->name, (long long)B, (long long)S, (unsigned long long)o->max_bytes);
        return 0;
    }
    if (src->flat) {
        if (maskpack_layout_n_rows(L) != 1 || maskpack_layout_q_width(L) != cells) {
            cli_problem(r, "%s: describes a stream of %lld tokens, the [%lld, %lld] grid holds %lld", src->name,
                        (long long)maskpack_layout_q_width(L), (long long)B, (long long)S, (long long)cells);
            return 0;
        }
    } else if (maskpack_layout_n_rows(L) != B || maskpack_layout_q_width(L) != S) {
        cli_problem(r, "%s: its layout is [%lld, %lld], the token grid [%lld, %lld]", src->name,
                    (long long)maskpack_layout_n_rows(L), (long long)maskpack_layout_q_width(L), (long long)B,
                    (long long)S);
        return 0;
    }
    src->seg = mp_alloc_array((size_t)cells, sizeof *src->seg);
    if (!src->seg) {
        cli_problem(r, "%s: out of memory", src->name);
        return 0;
    }
    for (int64_t b = 0; cells && b < B; b++) /* a [2^33, 0] grid holds nothing: no loop over its rows */
        for (int64_t s = 0; s < S; s++)
            src->seg[b * S + s] =
                src->flat ? maskpack_segment_of_query(L, 0, b * S + s) : maskpack_segment_of_query(L, b, s);
    return 1;
}

/* ---- cross-checks ------------------------------------------------------------------------------ */

static const char *tok_word(int valid) { return valid ? "token" : "pad"; }

static void check_validity(cli_report *r, const cli_source *a, const cli_source *c) {
    for (int64_t b = 0; b < r->B; b++) {
        int64_t na = 0, nc = 0, first = -1;
        for (int64_t s = 0; s < r->S; s++) {
            int64_t t = b * r->S + s;
            int va = a->seg[t] >= 0, vc = c->seg[t] >= 0;
            na += va, nc += vc;
            if (va != vc && first < 0) first = s;
        }
        if (first >= 0) {
            int64_t t = b * r->S + first;
            cli_problem_at(r, b, first,
                           "row %lld: %s and %s disagree on which tokens are real (%lld vs %lld tokens; at column %lld "
                           "%s says %s, %s says %s)",
                           (long long)b, a->name, c->name, (long long)na, (long long)nc, (long long)first, a->name,
                           tok_word(a->seg[t] >= 0), c->name, tok_word(c->seg[t] >= 0));
        }
    }
}

/* position_ids can only say "pad" through a zero tail: that tail must be padding for the authority too. */
static void check_partial_validity(cli_report *r, const cli_source *auth, const cli_source *p) {
    for (int64_t b = 0; b < r->B; b++) {
        int64_t n = 0, first = -1;
        for (int64_t s = 0; s < r->S; s++) {
            int64_t t = b * r->S + s;
            if (p->seg[t] < 0 && auth->seg[t] >= 0) {
                n++;
                if (first < 0) first = s;
            }
        }
        if (n)
            cli_problem_at(r, b, first,
                           "row %lld: %s end in a run of zeros read as padding from column %lld, but %s marks %lld of "
                           "those tokens as real",
                           (long long)b, p->name, (long long)first, auth->name, (long long)n);
    }
}

/* Does source x start a sequence at token t (of row b, column s) among the merged real tokens? */
static int starts_at(const cli_report *r, const uint8_t *valid, const cli_source *x, int64_t b, int64_t s) {
    int64_t t = b * r->S + s;
    if (!valid[t]) return 0;
    if (s == 0 || !valid[t - 1]) return 1;
    return x->seg[t] != x->seg[t - 1];
}

static void check_boundaries(cli_report *r, const uint8_t *valid, const cli_source *x, const cli_source *y) {
    for (int64_t b = 0; b < r->B; b++) {
        int64_t nx = 0, ny = 0, first = -1;
        for (int64_t s = 0; s < r->S; s++) {
            int sx = starts_at(r, valid, x, b, s), sy = starts_at(r, valid, y, b, s);
            nx += sx, ny += sy;
            if (sx != sy && first < 0) first = s;
        }
        if (first >= 0)
            cli_problem_at(
                r, b, first, "row %lld: %s says %lld sequence%s, %s says %lld (they split differently at column %lld)",
                (long long)b, x->name, (long long)nx, nx == 1 ? "" : "s", y->name, (long long)ny, (long long)first);
    }
}

/* A packed stream laid over a [B,S] grid: no sequence may run from one row into the next. */
static void check_row_crossing(cli_report *r, const cli_source *f) {
    if (r->B <= 1) return;
    size_t n = maskpack_layout_n_segments(f->layout);
    for (size_t k = 0; k < n; k++) {
        maskpack_segment g;
        maskpack_layout_segment(f->layout, k, &g, NULL);
        if (g.q_len > 0 && g.q_start / r->S != (g.q_start + g.q_len - 1) / r->S)
            cli_problem_at(
                r, g.q_start / r->S, r->S - 1,
                "%s: sequence %zu (tokens [%lld, %lld)) runs from row %lld into row %lld of the [%lld, %lld] grid",
                f->name, k, (long long)g.q_start, (long long)(g.q_start + g.q_len), (long long)(g.q_start / r->S),
                (long long)((g.q_start + g.q_len - 1) / r->S), (long long)r->B, (long long)r->S);
    }
}

static void check_labels(cli_report *r) {
    const mpio_array *lab = r->labels;
    if (!lab || !r->layout) return;
    if (!mp_dtype_is_integer(lab->dtype)) {
        cli_problem(r, "labels: expected an integer dtype, found %s", maskpack_dtype_name(lab->dtype));
        return;
    }
    for (int64_t b = 0; r->S && b < r->B; b++) { /* an empty grid: no loop over its rows */
        int64_t n = 0, first = -1, value = 0;
        for (int64_t s = 0; s < r->S; s++) {
            if (maskpack_segment_of_query(r->layout, r->packed ? 0 : b, r->packed ? b * r->S + s : s) >= 0) continue;
            int64_t v = token_i64(lab, b, s);
            if (v != -100) {
                if (first < 0) first = s, value = v;
                n++;
            }
        }
        if (n)
            cli_problem_at(r, b, first,
                           "row %lld: labels are not -100 on %lld pad token%s (first at column %lld: %lld); the loss "
                           "would train on padding",
                           (long long)b, (long long)n, n == 1 ? "" : "s", (long long)first, (long long)value);
    }
}

/* Compares the rule a 4D mask encodes with the one given by flags. */
static void check_rule(const cli_options *o, cli_report *r, const maskpack_rule *got) {
    if (!rule_flags_given(o)) return;
    maskpack_rule want = rule_from_flags(o);
    if (got->causal != want.causal)
        cli_problem(r, "rule: attention_mask encodes a %s rule, the flags say %s",
                    got->causal ? "causal" : "bidirectional", want.causal ? "--causal" : "--bidirectional");
    if (got->window_left != want.window_left || got->window_right != want.window_right)
        cli_problem(r, "rule: attention_mask encodes window (%lld, %lld), the flags say (%lld, %lld)",
                    (long long)got->window_left, (long long)got->window_right, (long long)want.window_left,
                    (long long)want.window_right);
}

/* ---- the merged layout ------------------------------------------------------------------------- */

static void build_merged(const cli_options *o, cli_report *r, const uint8_t *valid) {
    int64_t cells = r->B * r->S;
    maskpack_segment *segs = mp_alloc_array((size_t)cells, sizeof *segs);
    if (!segs) {
        cli_problem(r, "layout: out of memory");
        return;
    }
    size_t n = 0;
    for (int64_t b = 0; cells && b < r->B; b++) /* an empty grid: no loop over its rows */
        for (int64_t s = 0; s < r->S; s++) {
            int64_t t = b * r->S + s;
            if (!valid[t]) continue;
            int start = s == 0 || !valid[t - 1];
            for (size_t k = 0; k < r->n_sources && !start; k++) {
                const cli_source *x = &r->sources[k];
                if (x->seg && x->boundaries) start = x->seg[t] != x->seg[t - 1];
            }
            if (start) {
                memset(&segs[n], 0, sizeof segs[n]);
                segs[n].row = b;
                segs[n].q_start = segs[n].kv_start = s;
                n++;
            }
            segs[n - 1].q_len++;
            segs[n - 1].kv_len++;
        }
    /* a 4D mask brings its own rule (with spans and prefixes); keep its layout when the segments agree */
    const cli_source *m4 = NULL;
    for (size_t k = 0; k < r->n_sources; k++)
        if (r->sources[k].layout && r->sources[k].boundaries && r->sources[k].array->ndim == 4) m4 = &r->sources[k];
    maskpack_rule rule = rule_from_flags(o);
    r->rule_origin = rule_flags_given(o) ? "flags" : "default";
    maskpack_error e;
    if (m4) {
        maskpack_rule got = maskpack_layout_rule(m4->layout);
        check_rule(o, r, &got);
        int same = maskpack_layout_n_segments(m4->layout) == n;
        for (size_t k = 0; same && k < n; k++) {
            maskpack_segment g;
            maskpack_layout_segment(m4->layout, k, &g, NULL);
            same = g.row == segs[k].row && g.q_start == segs[k].q_start && g.q_len == segs[k].q_len;
        }
        if (same) {
            free(segs);
            r->rule_origin = "attention_mask (4D)";
            if (maskpack_layout_clone(m4->layout, &r->layout, &e)) problem_from_error(r, "layout", &e);
            return;
        }
        rule.causal = got.causal;
        rule.alignment = got.alignment;
        rule.window_left = got.window_left;
        rule.window_right = got.window_right;
        r->rule_origin = "attention_mask (4D), without its spans and prefixes";
    }
    if (maskpack_layout_from_segments(segs, n, r->B, r->S, r->S, r->packed, &rule, &r->layout, &e))
        problem_from_error(r, "layout", &e);
    free(segs);
}

/* ---- driver ------------------------------------------------------------------------------------ */

int cli_is_known_member(const char *name) {
    static const char *const known[] = {"attention_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded",
                                        "input_ids",      "labels",       NULL};
    for (int k = 0; known[k]; k++)
        if (strcmp(known[k], name) == 0) return 1;
    return 0;
}

static int analyze_sources(const cli_options *o, cli_report *r) {
    const mpio_array *mask = mpio_arrayset_find(&r->arrays, "attention_mask");
    const mpio_array *pos = mpio_arrayset_find(&r->arrays, "position_ids");
    const mpio_array *cu = mpio_arrayset_find(&r->arrays, "cu_seqlens");
    r->cu_padded = mpio_arrayset_find(&r->arrays, "cu_seqlens_padded");
    r->input_ids = mpio_arrayset_find(&r->arrays, "input_ids");
    r->labels = mpio_arrayset_find(&r->arrays, "labels");
    for (size_t i = 0; i < r->arrays.n; i++) {
        const char *nm = r->arrays.arrays[i].name;
        if (!cli_is_known_member(nm)) {
            size_t used = strlen(r->ignored);
            snprintf(r->ignored + used, sizeof r->ignored - used, "%s%s", used ? ", " : "", nm);
        }
    }
    int rc = check_conventions(o, mask, pos, cu, r);
    if (rc) return rc;
    if (r->cu_padded && !cu) cli_problem(r, "cu_seqlens_padded: present without cu_seqlens; ignored");

    const mpio_array *per_token[4] = {mask, pos, r->input_ids, r->labels};
    int usable[4];
    find_grid(r, per_token, 4, usable);
    if (!usable[0]) mask = NULL;
    if (!usable[1]) pos = NULL;
    if (!usable[2]) r->input_ids = NULL;
    if (!usable[3]) r->labels = NULL;
    if (!mask && !pos && !cu) {
        cli_problem(r, "no input describes the sequences (expected attention_mask, position_ids or cu_seqlens)");
        return CLI_EXIT_PROBLEMS;
    }

    maskpack_rule rule = rule_from_flags(o);
    if (mask) build_mask_source(o, r, mask, &rule);
    if (cu) {
        cli_source *s =
            add_source(r, "cu_seqlens",
                       o->cu_form == MASKPACK_CU_TE ? (r->cu_padded ? "TE form + cu_seqlens_padded" : "TE form")
                                                    : (r->cu_padded ? "NPU form + cu_seqlens_padded" : "NPU form"),
                       cu);
        s->full_validity = 1;
        s->boundaries = 1;
        s->flat = 1;
        int64_t total = o->total;
        if (r->have_grid) {
            if (total && total != r->B * r->S)
                cli_problem(r, "cu_seqlens: --total %lld, but the token grid [%lld, %lld] holds %lld tokens",
                            (long long)total, (long long)r->B, (long long)r->S, (long long)(r->B * r->S));
            total = r->B * r->S;
        }
        maskpack_tensor ct = mpio_array_view(cu), pt;
        if (r->cu_padded) pt = mpio_array_view(r->cu_padded);
        maskpack_layout_from_cu_seqlens(&ct, (maskpack_cu_form)o->cu_form, total, r->cu_padded ? &pt : NULL, &rule,
                                        &s->layout, &s->err);
        if (!r->have_grid && s->layout) {
            r->B = 1;
            r->S = maskpack_layout_q_width(s->layout);
            r->packed = 1;
            r->have_grid = 1;
        }
    }
    if (pos) {
        cli_source *s = add_source(r, "position_ids",
                                   o->position_rule == MASKPACK_BOUNDARY_RESET ? "reset rule" : "step rule", pos);
        s->boundaries = 1;
        maskpack_tensor t = mpio_array_view(pos);
        maskpack_layout_from_position_ids(&t, (maskpack_boundary_rule)o->position_rule, &rule, &s->layout, &s->err);
    }
    /* constructor failures are problems; the rest of the analysis uses the inputs that did build */
    for (size_t k = 0; k < r->n_sources; k++) {
        cli_source *s = &r->sources[k];
        if (!s->layout) {
            /* a [B,S] input's error names the first offending token: the picture marks it */
            if (s->array->ndim == 2 && s->err.index[0] >= 0 && s->err.index[1] >= 0)
                cli_problem_at(r, s->err.index[0], s->err.index[1], "%s: %s: %s", s->name,
                               maskpack_status_name(s->err.status), s->err.message);
            else
                problem_from_error(r, s->name, &s->err);
            continue;
        }
        if (!fill_seg(o, r, s)) {
            maskpack_layout_free(s->layout);
            s->layout = NULL;
        }
    }
    return 0;
}

int cli_analyze(const cli_options *o, cli_report *r) {
    r->auth = -1;
    int rc = load_arrays(o, r);
    if (rc) return rc;
    rc = analyze_sources(o, r);
    if (rc) return rc;
    if (!r->have_grid) return CLI_EXIT_PROBLEMS;

    /* which tokens are real: the first input that says so exactly; position_ids only as a last resort */
    const cli_source *auth = NULL, *partial = NULL;
    for (size_t k = 0; k < r->n_sources; k++) {
        const cli_source *s = &r->sources[k];
        if (!s->seg) continue;
        if (s->full_validity && !auth) auth = s;
        if (!s->full_validity && !partial) partial = s;
    }
    if (!auth) auth = partial;
    if (!auth) return CLI_EXIT_PROBLEMS; /* every constructor failed: already reported */
    r->auth = (int)(auth - r->sources);
    int64_t cells = r->B * r->S; /* fits: fill_seg checked it for auth */
    uint8_t *valid = mp_alloc_array((size_t)cells, 1);
    if (!valid) {
        cli_problem(r, "out of memory");
        return CLI_EXIT_PROBLEMS;
    }
    for (int64_t t = 0; t < cells; t++) valid[t] = auth->seg[t] >= 0;

    /* the cross-checks walk the grid row by row: an empty grid ([2^33, 0]) has nothing to compare */
    for (size_t k = 0; cells && k < r->n_sources; k++) {
        const cli_source *s = &r->sources[k];
        if (!s->seg || s == auth) continue;
        if (s->full_validity)
            check_validity(r, auth, s);
        else if (auth->full_validity)
            check_partial_validity(r, auth, s);
    }
    for (size_t x = 0; cells && x < r->n_sources; x++)
        for (size_t y = x + 1; y < r->n_sources; y++)
            if (r->sources[x].seg && r->sources[y].seg && r->sources[x].boundaries && r->sources[y].boundaries)
                check_boundaries(r, valid, &r->sources[x], &r->sources[y]);
    for (size_t k = 0; cells && k < r->n_sources; k++)
        if (r->sources[k].seg && r->sources[k].flat) check_row_crossing(r, &r->sources[k]);

    build_merged(o, r, valid);
    free(valid);
    check_labels(r);
    return r->n_problems_total ? CLI_EXIT_PROBLEMS : 0;
}

int cli_inspect(int argc, char **argv) {
    cli_options o;
    int rc = cli_parse_inspect_options(argc, argv, &o);
    if (rc < 0) return CLI_EXIT_OK; /* --help */
    if (rc) return rc;
    if (!o.file) {
        /* the embedded sample's conventions are known: HF keep mask, flash-path reset rule */
        if (o.mask_conv == CLI_CONV_UNSET) o.mask_conv = CLI_CONV_KEEP;
        if (o.position_rule < 0) o.position_rule = MASKPACK_BOUNDARY_RESET;
    }
    cli_report r;
    memset(&r, 0, sizeof r);
    rc = cli_analyze(&o, &r);
    if (r.fatal) {
        cli_report_free(&r);
        return CLI_EXIT_USAGE;
    }
    if (o.png) { /* drawn even when there are problems: the picture helps find them */
        size_t n_rows = o.n_png_rows;
        int64_t rows[CLI_MAX_PNG_ROWS];
        memcpy(rows, o.png_rows, sizeof rows);
        if (!n_rows) /* default: every row, up to the first CLI_MAX_PNG_ROWS */
            for (int64_t b = 0; b < r.B && n_rows < CLI_MAX_PNG_ROWS; b++) rows[n_rows++] = b;
        char why[512];
        if (!dw_available()) {
            cli_problem(&r, "png: nothing written to %s: %s", o.png, dw_unavailable_reason());
            rc = CLI_EXIT_PROBLEMS;
        } else if (!r.layout) {
            cli_problem(&r,
                        "png: nothing written to %s: no layout could be built from the inputs (see the problems "
                        "above)",
                        o.png);
            rc = CLI_EXIT_PROBLEMS;
        } else if (cli_draw_inspect(&o, &r, rows, n_rows, why, sizeof why)) {
            cli_problem(&r, "png: nothing written to %s: %s", o.png, why);
            rc = CLI_EXIT_PROBLEMS;
        } else {
            snprintf(r.picture, sizeof r.picture, "%s (%s, %zu of %lld rows)", o.png,
                     o.png_svg || dw_path_is_svg(o.png) ? "SVG" : "PNG", n_rows, (long long)r.B);
        }
    }
    if (o.emit) {
        if (!rc && !r.n_problems_total)
            rc = cli_emit_outputs(&o, &r);
        else
            cli_problem(&r, "emit: nothing written to %s: the batch has problems (fix them first)", o.out);
    }
    if (o.json) {
        if (cli_print_json(&o, &r, stdout)) rc = CLI_EXIT_PROBLEMS;
    } else {
        cli_print_text(&o, &r, stdout);
    }
    if (rc == 0 && r.n_problems_total) rc = CLI_EXIT_PROBLEMS;
    cli_report_free(&r);
    return rc;
}
