/* report.c: the human-readable and the JSON report of `maskpack inspect`. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LISTED_SEGMENTS 40

static const char *const npu_layout_names[] = {"BSND", "BNSD", "BSH", "SBH", "TND"};

const char *cli_npu_layout_name(maskpack_npu_layout l) {
    return (unsigned)l < sizeof npu_layout_names / sizeof *npu_layout_names ? npu_layout_names[l] : "?";
}
static const char *const npu_mask_names[] = {"none", "compressed", "prefix_compressed", "full"};

static void shape_text(char *buf, size_t cap, const mpio_array *a) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int32_t d = 0; d < a->ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld", (long long)a->shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

void cli_rule_text(char *buf, size_t cap, const maskpack_layout *L) {
    maskpack_rule rule = maskpack_layout_rule(L);
    size_t used = (size_t)snprintf(buf, cap, "%s, %s alignment", rule.causal ? "causal" : "bidirectional",
                                   rule.alignment == MASKPACK_ALIGN_TOP_LEFT ? "top_left" : "bottom_right");
    if (rule.window_left < 0 && rule.window_right < 0)
        used += (size_t)snprintf(buf + used, cap - used, ", no window");
    else
        used += (size_t)snprintf(buf + used, cap - used, ", window (%lld, %lld)", (long long)rule.window_left,
                                 (long long)rule.window_right);
    if (rule.n_spans && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, ", %zu bidirectional spans", rule.n_spans);
    if (rule.prefix && used < cap) snprintf(buf + used, cap - used, ", prefix-LM prefixes");
}

static double pad_fraction(const cli_report *r) {
    int64_t cells = r->B * r->S;
    return cells ? 1.0 - (double)maskpack_layout_n_tokens(r->layout) / (double)cells : 0.0;
}

/* Prints s with control characters escaped (\n, \t, \xNN; the C1 controls U+0080..U+009F too):
 * member names and the messages that quote them come from the file, and a crafted name must not
 * move the cursor, clear the screen or fake report lines on the user's terminal. */
static void put_escaped(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)(s ? s : "?");
    for (; *p; p++) {
        if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p == '\r')
            fputs("\\r", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            fprintf(f, "\\u%04x", (unsigned)*++p);
        else
            fputc(*p, f);
    }
}

static void print_source_line(FILE *f, const char *name, const mpio_array *a, const char *how, const char *result) {
    char shape[160];
    shape_text(shape, sizeof shape, a);
    fprintf(f, "  %-18s %-8s %-14s %-30s %s\n", name, maskpack_dtype_name(a->dtype), shape, how, result);
}


/* What a source can say, in words (for the reconciliation). */
static const char *real_tokens_why(const cli_source *s) {
    if (strcmp(s->name, "cu_seqlens") == 0)
        return "its offsets say where each sequence ends; tokens past them are padding";
    if (strcmp(s->name, "position_ids") == 0)
        return "no other input says which tokens are real, so a tail of zeros in position_ids is read as padding";
    if (strstr(s->how, "doc-id")) return "it gives every real token its document id and every pad token 0";
    if (strstr(s->how, "4D")) return "a 4D mask says which tokens attend at all";
    return "it marks every real token 1 and every pad token 0";
}

static const char *boundary_why(const cli_source *s) {
    if (strcmp(s->name, "cu_seqlens") == 0) return "each offset starts a sequence";
    if (strcmp(s->name, "position_ids") == 0)
        return strstr(s->how, "step") ? "a step other than +1 starts a sequence"
                                      : "a position that drops back to its minimum (0) starts a sequence";
    if (strstr(s->how, "doc-id")) return "a change of document id starts a sequence";
    return "tokens that never see each other are different sequences";
}

/* The merged layout's sequence of grid token (b, s), -1 = padding. */
static int64_t merged_seg(const cli_report *r, int64_t b, int64_t s) {
    return maskpack_segment_of_query(r->layout, r->packed ? 0 : b, r->packed ? b * r->S + s : s);
}

/* How each input was read alone, why its count differs from the result, and which input decided what:
 * the answer to "why does attention_mask say 3, position_ids 5 and the result 4?". */
static void print_reconciliation(const cli_report *r, FILE *f) {
    if (!r->layout || r->auth < 0 || !r->have_grid) return;
    const cli_source *auth = &r->sources[r->auth];
    int64_t cells = r->B * r->S;
    size_t n_bounds = 0;
    for (size_t k = 0; k < r->n_sources; k++) n_bounds += r->sources[k].seg && r->sources[k].boundaries;
    fprintf(f, "how the inputs were reconciled:\n");
    fprintf(f, "  which tokens are real: %s decides (%s).\n", auth->name, real_tokens_why(auth));
    if (n_bounds == 0) {
        fprintf(f, "  where sequences start: no input marks where two sequences meet, so each run of real tokens is "
                   "one sequence.\n");
    } else {
        fprintf(f, "  where sequences start:");
        size_t i = 0;
        for (size_t k = 0; k < r->n_sources; k++) {
            const cli_source *s = &r->sources[k];
            if (!s->seg || !s->boundaries) continue;
            fprintf(f, "%s %s (%s)", i++ ? ";" : "", s->name, boundary_why(s));
        }
        fprintf(f, "%s.\n", n_bounds > 1 ? " (they must agree)" : "");
    }
    for (size_t k = 0; k < r->n_sources && cells; k++) {
        const cli_source *s = &r->sources[k];
        if (!s->seg || !s->layout) continue;
        size_t n_src = maskpack_layout_n_segments(s->layout);
        int64_t pad_read = 0, pad_b = -1, pad_c0 = -1, pad_c1 = -1, joined = 0, join_b = -1, join_c = -1, lost = 0;
        /* sequences of this input made only of tokens the result calls padding */
        uint8_t *has_real = calloc(n_src ? n_src : 1, 1);
        uint8_t *seen = calloc(n_src ? n_src : 1, 1);
        for (int64_t b = 0; b < r->B; b++)
            for (int64_t c = 0; c < r->S; c++) {
                int64_t t = b * r->S + c, x = s->seg[t], m = merged_seg(r, b, c);
                if (x >= 0 && (size_t)x < n_src && seen) seen[x] = 1;
                if (x >= 0 && m >= 0 && (size_t)x < n_src && has_real) has_real[x] = 1;
                if (x >= 0 && m < 0) {
                    if (pad_read == 0) pad_b = b, pad_c0 = c;
                    if (b == pad_b && c == pad_c1 + 1) pad_c1 = c;
                    if (pad_read == 0) pad_c1 = c;
                    pad_read++;
                }
                if (x < 0 && m >= 0) lost++;
                if (c > 0 && m >= 0 && x >= 0) {
                    int64_t mp = merged_seg(r, b, c - 1);
                    if (mp >= 0 && mp != m && s->seg[t - 1] == x) {
                        if (joined == 0) join_b = b, join_c = c;
                        joined++;
                    }
                }
            }
        int64_t pad_only = 0;
        for (size_t i = 0; has_real && seen && i < n_src; i++) pad_only += seen[i] && !has_real[i];
        free(has_real);
        free(seen);
        fprintf(f, "  %s (%s) read alone: %zu sequence%s, %lld tokens", s->name, s->how, n_src, n_src == 1 ? "" : "s",
                (long long)maskpack_layout_n_tokens(s->layout));
        if (!pad_read && !joined && !lost) {
            fprintf(f, ": the same as the result.\n");
            continue;
        }
        fprintf(f, ". It differs from the result because");
        int more = 0;
        if (joined)
            fprintf(f,
                    "%s it cannot mark where two sequences packed in one row meet: it reads %lld pair%s of "
                    "neighbouring sequences as one (first: row %lld, column %lld, where %s)",
                    more++ ? ";" : "", (long long)joined, joined == 1 ? "" : "s", (long long)join_b, (long long)join_c,
                    n_bounds ? "another input starts a sequence" : "?");
        if (pad_read) {
            char cols[64];
            if (pad_c1 > pad_c0)
                snprintf(cols, sizeof cols, "columns %lld-%lld", (long long)pad_c0, (long long)pad_c1);
            else
                snprintf(cols, sizeof cols, "column %lld", (long long)pad_c0);
            fprintf(f, "%s it cannot mark %s padding: %lld pad token%s (first: row %lld, %s) read as tokens",
                    more++ ? ";" : "", pad_c0 == 0 ? "left" : "this", (long long)pad_read, pad_read == 1 ? "" : "s",
                    (long long)pad_b, cols);
        }
        if (pad_only)
            fprintf(f, ", which make %lld extra sequence%s of padding only", (long long)pad_only,
                    pad_only == 1 ? "" : "s");
        if (lost)
            fprintf(f, "%s it reads %lld real token%s as padding (see the problems)", more++ ? ";" : "",
                    (long long)lost, lost == 1 ? "" : "s");
        fprintf(f, ".\n");
    }
    size_t n = maskpack_layout_n_segments(r->layout);
    fprintf(f, "  result: %zu sequence%s over %lld real tokens: the real tokens %s says, split where %s.\n", n,
            n == 1 ? "" : "s", (long long)maskpack_layout_n_tokens(r->layout), auth->name,
            n_bounds ? "any input starts a sequence" : "a run of real tokens ends");
}

void cli_print_text(const cli_options *o, const cli_report *r, FILE *f) {
    fprintf(f, "maskpack %s inspect: ", maskpack_version_string());
    put_escaped(f, r->origin);
    fputc('\n', f);
    if (!o->file)
        fprintf(f, "  (sample conventions: --mask-convention %s --position-rule %s)\n",
                o->mask_conv == CLI_CONV_DOC_ID ? "doc_id" : "keep",
                o->position_rule == MASKPACK_BOUNDARY_STEP ? "step" : "reset");
    if (r->arrays.n) fprintf(f, "inputs:\n");
    for (size_t k = 0; k < r->n_sources; k++) {
        const cli_source *s = &r->sources[k];
        char result[96];
        if (s->layout)
            snprintf(result, sizeof result, "-> alone: %zu sequence%s, %lld tokens",
                     maskpack_layout_n_segments(s->layout), maskpack_layout_n_segments(s->layout) == 1 ? "" : "s",
                     (long long)maskpack_layout_n_tokens(s->layout));
        else
            snprintf(result, sizeof result, "-> not usable (see problems)");
        print_source_line(f, s->name, s->array, s->how, result);
    }
    if (r->cu_padded) print_source_line(f, "cu_seqlens_padded", r->cu_padded, "slot offsets", "(read with cu_seqlens)");
    if (r->input_ids) print_source_line(f, "input_ids", r->input_ids, "shape checked", "");
    if (r->labels) print_source_line(f, "labels", r->labels, "-100 on padding", r->layout ? "checked" : "not checked");
    if (r->ignored[0]) {
        fputs("  (not read: ", f);
        put_escaped(f, r->ignored);
        fputs(")\n", f);
    }
    if (r->layout) {
        const maskpack_layout *L = r->layout;
        char rule[256];
        cli_rule_text(rule, sizeof rule, L);
        if (r->packed)
            fprintf(f, "shape: [%lld] packed stream (THD)\n", (long long)r->S);
        else
            fprintf(f, "shape: [%lld, %lld] (%lld rows x %lld columns)\n", (long long)r->B, (long long)r->S,
                    (long long)r->B, (long long)r->S);
        fprintf(f, "rule: %s (from %s)\n", rule, r->rule_origin ? r->rule_origin : "default");
        size_t n = maskpack_layout_n_segments(L);
        print_reconciliation(r, f);
        fprintf(f, "sequences: %zu, longest: %lld, tokens: %lld of %lld, pad fraction: %.3f\n", n,
                (long long)maskpack_layout_max_seqlen(L), (long long)maskpack_layout_n_tokens(L),
                (long long)(r->B * r->S), pad_fraction(r));
        fprintf(f, "segments:\n  %5s %7s %7s\n", "row", "start", "length");
        for (size_t k = 0; k < n && k < MAX_LISTED_SEGMENTS; k++) {
            maskpack_segment g;
            maskpack_layout_segment(L, k, &g, NULL);
            fprintf(f, "  %5lld %7lld %7lld\n", (long long)g.row, (long long)g.q_start, (long long)g.q_len);
        }
        if (n > MAX_LISTED_SEGMENTS) fprintf(f, "  ... and %zu more segments\n", n - MAX_LISTED_SEGMENTS);
    }
    if (r->have_npu) {
        const maskpack_npu_argset *a = &r->npu;
        fprintf(f,
                "npu_fusion_attention: input_layout %s, sparse_mode %d, pre_tockens %lld, next_tockens %lld, "
                "scale %g, inner_precise %d, atten_mask %s",
                npu_layout_names[a->input_layout], (int)a->sparse_mode, (long long)a->pre_tokens,
                (long long)a->next_tokens, a->scale, (int)a->inner_precise, npu_mask_names[a->mask_kind]);
        if (a->mask_kind != MASKPACK_NPU_MASK_NONE) {
            fprintf(f, " [");
            for (int32_t d = 0; d < a->mask_ndim; d++) fprintf(f, d ? ", %lld" : "%lld", (long long)a->mask_shape[d]);
            fprintf(f, "]");
        }
        if (a->actual_seq_qlen) {
            fprintf(f, ", actual_seq_qlen [");
            for (int64_t i = 0; i < a->n_items && i < 16; i++)
                fprintf(f, i ? ", %lld" : "%lld", (long long)a->actual_seq_qlen[i]);
            fprintf(f, "%s]", a->n_items > 16 ? ", ..." : "");
        }
        if (a->fully_masked_rows || a->fully_masked_pad_rows)
            fprintf(f, ", query rows that see nothing: %lld of tokens, %lld of padding",
                    (long long)a->fully_masked_rows, (long long)a->fully_masked_pad_rows);
        fprintf(f, "\n");
    }
    if (r->n_emitted) {
        fputs("wrote ", f);
        put_escaped(f, o->out);
        fputs(":\n", f);
        for (size_t i = 0; i < r->n_emitted; i++) fprintf(f, "  %s\n", r->emitted[i]);
    }
    if (r->picture[0]) {
        fputs("picture: ", f);
        put_escaped(f, r->picture);
        fputc('\n', f);
    }
    if (r->n_problems_total == 0) {
        fprintf(f, "problems: none (every input agrees with the others)\n");
        return;
    }
    fprintf(f, "problems (%zu):\n", r->n_problems_total);
    for (size_t i = 0; i < r->n_problems; i++) {
        fputs("  - ", f);
        put_escaped(f, r->problems[i]);
        fputc('\n', f);
    }
    if (r->n_problems_total > r->n_problems) fprintf(f, "  ... and %zu more\n", r->n_problems_total - r->n_problems);
}

static cJSON *shape_json(const int64_t *shape, int32_t ndim) {
    cJSON *a = cJSON_CreateArray();
    for (int32_t d = 0; a && d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
    return a;
}

static void add_input(cJSON *inputs, const char *name, const mpio_array *a, const char *how, const cli_source *s) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "dtype", maskpack_dtype_name(a->dtype));
    cJSON_AddItemToObject(o, "shape", shape_json(a->shape, a->ndim));
    cJSON_AddStringToObject(o, "read_as", how);
    if (s) {
        cJSON_AddBoolToObject(o, "ok", s->layout != NULL);
        if (s->layout) {
            cJSON_AddNumberToObject(o, "n_sequences", (double)maskpack_layout_n_segments(s->layout));
            cJSON_AddNumberToObject(o, "n_tokens", (double)maskpack_layout_n_tokens(s->layout));
        } else if (s->err.status) {
            cJSON_AddStringToObject(o, "status", maskpack_status_name(s->err.status));
            cJSON_AddStringToObject(o, "message", s->err.message);
        }
    }
    cJSON_AddItemToArray(inputs, o);
}

int cli_print_json(const cli_options *o, const cli_report *r, FILE *f) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return 1;
    cJSON_AddStringToObject(root, "maskpack_version", maskpack_version_string());
    cJSON_AddStringToObject(root, "source", r->origin ? r->origin : "");
    cJSON_AddBoolToObject(root, "sample", o->file == NULL);
    cJSON *inputs = cJSON_AddArrayToObject(root, "inputs");
    for (size_t k = 0; inputs && k < r->n_sources; k++)
        add_input(inputs, r->sources[k].name, r->sources[k].array, r->sources[k].how, &r->sources[k]);
    if (inputs && r->cu_padded) add_input(inputs, "cu_seqlens_padded", r->cu_padded, "slot offsets", NULL);
    if (inputs && r->input_ids) add_input(inputs, "input_ids", r->input_ids, "shape checked", NULL);
    if (inputs && r->labels) add_input(inputs, "labels", r->labels, "-100 on padding", NULL);
    cJSON *ignored = cJSON_AddArrayToObject(root, "ignored");
    for (size_t i = 0; ignored && i < r->arrays.n; i++)
        if (r->arrays.arrays[i].name && !cli_is_known_member(r->arrays.arrays[i].name))
            cJSON_AddItemToArray(ignored, cJSON_CreateString(r->arrays.arrays[i].name));
    if (r->layout) {
        const maskpack_layout *L = r->layout;
        int64_t shape[2] = {r->B, r->S};
        cJSON_AddItemToObject(root, "shape", r->packed ? shape_json(&r->S, 1) : shape_json(shape, 2));
        cJSON_AddBoolToObject(root, "packed", r->packed);
        maskpack_rule rule = maskpack_layout_rule(L);
        cJSON *jr = cJSON_AddObjectToObject(root, "rule");
        if (jr) {
            cJSON_AddBoolToObject(jr, "causal", rule.causal);
            cJSON_AddStringToObject(jr, "alignment",
                                    rule.alignment == MASKPACK_ALIGN_TOP_LEFT ? "top_left" : "bottom_right");
            int64_t win[2] = {rule.window_left, rule.window_right};
            cJSON_AddItemToObject(jr, "window", shape_json(win, 2));
            cJSON_AddNumberToObject(jr, "n_spans", (double)rule.n_spans);
            cJSON_AddBoolToObject(jr, "prefix", rule.prefix != NULL);
            cJSON_AddStringToObject(jr, "from", r->rule_origin ? r->rule_origin : "default");
        }
        size_t n = maskpack_layout_n_segments(L);
        cJSON_AddNumberToObject(root, "n_sequences", (double)n);
        cJSON_AddNumberToObject(root, "n_tokens", (double)maskpack_layout_n_tokens(L));
        cJSON_AddNumberToObject(root, "longest", (double)maskpack_layout_max_seqlen(L));
        cJSON_AddNumberToObject(root, "pad_fraction", pad_fraction(r));
        cJSON *segs = cJSON_AddArrayToObject(root, "segments");
        for (size_t k = 0; segs && k < n; k++) {
            maskpack_segment g;
            maskpack_layout_segment(L, k, &g, NULL);
            cJSON *s = cJSON_CreateObject();
            if (!s) break;
            cJSON_AddNumberToObject(s, "row", (double)g.row);
            cJSON_AddNumberToObject(s, "start", (double)g.q_start);
            cJSON_AddNumberToObject(s, "length", (double)g.q_len);
            cJSON_AddItemToArray(segs, s);
        }
    } else {
        cJSON_AddNullToObject(root, "shape");
    }
    if (r->have_npu) {
        const maskpack_npu_argset *a = &r->npu;
        cJSON *j = cJSON_AddObjectToObject(root, "npu");
        if (j) {
            cJSON_AddStringToObject(j, "input_layout", npu_layout_names[a->input_layout]);
            cJSON_AddNumberToObject(j, "sparse_mode", a->sparse_mode);
            cJSON_AddNumberToObject(j, "pre_tockens", (double)a->pre_tokens);
            cJSON_AddNumberToObject(j, "next_tockens", (double)a->next_tokens);
            cJSON_AddNumberToObject(j, "scale", a->scale);
            cJSON_AddNumberToObject(j, "inner_precise", a->inner_precise);
            cJSON_AddStringToObject(j, "atten_mask", npu_mask_names[a->mask_kind]);
            if (a->mask_kind != MASKPACK_NPU_MASK_NONE)
                cJSON_AddItemToObject(j, "atten_mask_shape", shape_json(a->mask_shape, a->mask_ndim));
            if (a->actual_seq_qlen) {
                cJSON_AddItemToObject(j, "actual_seq_qlen", shape_json(a->actual_seq_qlen, (int32_t)a->n_items));
                cJSON_AddItemToObject(j, "actual_seq_kvlen", shape_json(a->actual_seq_kvlen, (int32_t)a->n_items));
            }
            cJSON_AddNumberToObject(j, "fully_masked_rows", (double)a->fully_masked_rows);
            cJSON_AddNumberToObject(j, "fully_masked_pad_rows", (double)a->fully_masked_pad_rows);
        }
    }
    if (r->picture[0]) cJSON_AddStringToObject(root, "picture", o->png);
    cJSON *em = cJSON_AddArrayToObject(root, "emitted");
    for (size_t i = 0; em && i < r->n_emitted; i++) cJSON_AddItemToArray(em, cJSON_CreateString(r->emitted[i]));
    if (o->out && r->n_emitted) cJSON_AddStringToObject(root, "out", o->out);
    cJSON *pr = cJSON_AddArrayToObject(root, "problems");
    for (size_t i = 0; pr && i < r->n_problems; i++) cJSON_AddItemToArray(pr, cJSON_CreateString(r->problems[i]));
    cJSON_AddNumberToObject(root, "n_problems", (double)r->n_problems_total);
    cJSON_AddBoolToObject(root, "ok", r->n_problems_total == 0 && r->layout != NULL);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return 1;
    fprintf(f, "%s\n", text);
    free(text);
    return 0;
}
