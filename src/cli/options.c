/* options.c: option parsing for `maskpack inspect`. Conventions are never guessed: each one that an
 * input needs must be given as a flag (the analysis says which is missing). Accepts "--flag value"
 * and "--flag=value". */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const cli_emit_names[EMIT_COUNT_] = {
    "mask2d",       "mask4d",      "cu_seqlens",    "cu_seqlens_npu",   "cu_seqlens_padded", "seqlens",
    "position_ids", "segment_ids", "valid_indices", "last_token_index", "block_mask",        "npu",
};

void cli_print_inspect_usage(FILE *f) {
    fprintf(
        f,
        "usage: maskpack inspect [FILE] [options]\n"
        "\n"
        "Reads a batch (.npz or .safetensors with members attention_mask, position_ids, cu_seqlens,\n"
        "cu_seqlens_padded, input_ids, labels - any subset - or one .npy with --as), builds the layout\n"
        "each input describes, reports the segments and every disagreement between the inputs.\n"
        "Without FILE the embedded sample batch is used (3 rows x 16 tokens); FILE '-' is standard input.\n"
        "\n"
        "conventions (required when the input needs them; never guessed):\n"
        "  --as attention_mask|position_ids|cu_seqlens|mask4d   what a bare .npy holds\n"
        "  --mask-convention keep|doc_id       2D attention_mask (1 = token | 1-based document id)\n"
        "  --mask-convention keep|masked|additive   4D attention_mask [B,1,S,S] / [B,H,S,S] / [B,1,1,S]\n"
        "  --cu-form te|npu                    cu_seqlens [0, e1, ..., eN] | [e1, ..., eN]\n"
        "  --position-rule reset|step          position_ids: new sequence at the minimum | at any step != +1\n"
        "  --total T                           tokens in the packed stream of cu_seqlens (default: grid or last end)\n"
        "rule (default: causal, bottom_right, no window; a 4D mask brings its own):\n"
        "  --causal | --bidirectional\n"
        "  --window L,R                        flash-attn (left, right), -1 = unbounded\n"
        "  --alignment top_left|bottom_right\n"
        "output:\n"
        "  --json                              machine-readable report on stdout\n"
        "  --png FILE                          draw the allowed matrix of each row with its title, numbers,\n"
        "                                      legend and problems marked: PNG, or SVG when FILE ends in .svg\n"
        "  --svg FILE                          the same picture as SVG (text kept as text)\n"
        "  --png-rows 0,2  --png-zoom N        rows to draw (default: the first 64), pixels per cell (1..32)\n"
        "  --png-block N                       tokens per cell side (default: 1, or blocks when a row has more\n"
        "                                      than 512 tokens)\n"
        "  --emit a,b,...  --out FILE.npz|FILE.safetensors   write derived outputs:\n"
        "      mask2d mask4d cu_seqlens cu_seqlens_npu cu_seqlens_padded seqlens position_ids segment_ids\n"
        "      valid_indices last_token_index block_mask npu   (or 'all')\n"
        "  --emit-convention keep|masked|additive   mask4d polarity (default keep)\n"
        "  --emit-dtype bool|uint8|int32|float16|bfloat16|float32|float64   mask4d dtype\n"
        "  --emit-fill neg_inf|dtype_min       additive fill (default dtype_min)\n"
        "  --index-dtype int32|int64           index outputs (default: int32 for cu_seqlens*, else int64)\n"
        "  --block N                           block_mask block size (default 128)\n"
        "  --npu-layout TND|BSND|BNSD|BSH|SBH  npu args (default TND when packed, else BSND)\n"
        "  --head-dim D | --scale X            npu scale: X, or 1/sqrt(D) (default D = 128)\n"
        "  --deflate                           compress .npz members\n"
        "limits:\n"
        "  --max-bytes N                       memory budget: larger files, members and token grids are\n"
        "                                      refused (default 4 GiB)\n"
        "exit status: 0 no problems, 1 problems found or a file unreadable, 2 bad usage\n");
}

int cli_usage_error(const char *command, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "maskpack %s: ", command);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'maskpack %s --help')\n", command);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

/* Index of `v` in the NULL-terminated list, or -1. */
static int pick(const char *v, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(v, list[i]) == 0) return i;
    return -1;
}

static int parse_i64(const char *v, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return 0;
    *out = x;
    return 1;
}

static int parse_dtype(const char *v) {
    for (int d = 0; d < MASKPACK_DTYPE_COUNT_; d++)
        if (strcmp(v, maskpack_dtype_name((maskpack_dtype)d)) == 0) return d;
    return -1;
}

static int parse_emit(const char *v, unsigned *bits) {
    char buf[512];
    if (strlen(v) >= sizeof buf) return 0;
    strcpy(buf, v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "all") == 0) {
            *bits |= (1u << EMIT_COUNT_) - 1;
            continue;
        }
        int k = -1;
        for (int i = 0; i < EMIT_COUNT_; i++)
            if (strcmp(tok, cli_emit_names[i]) == 0) k = i;
        if (k < 0) return 0;
        *bits |= 1u << k;
    }
    return *bits != 0;
}

static int parse_rows(const char *v, cli_options *o) {
    char buf[512];
    if (strlen(v) >= sizeof buf) return 0;
    strcpy(buf, v);
    o->n_png_rows = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t r;
        if (!parse_i64(tok, &r) || r < 0 || o->n_png_rows >= CLI_MAX_PNG_ROWS) return 0;
        o->png_rows[o->n_png_rows++] = r;
    }
    return o->n_png_rows > 0;
}

static void defaults(cli_options *o) {
    memset(o, 0, sizeof *o);
    o->mask_conv = CLI_CONV_UNSET;
    o->cu_form = -1;
    o->position_rule = -1;
    o->causal = -1;
    o->window_left = o->window_right = -1;
    o->alignment = -1;
    o->emit_conv = CLI_CONV_KEEP;
    o->emit_dtype = -1;
    o->emit_fill = MASKPACK_FILL_DTYPE_MIN;
    o->index_dtype = -1;
    o->block = 128;
    o->npu_layout = -1;
    o->head_dim = 128;
    o->max_bytes = CLI_DEFAULT_MAX_BYTES;
}

int cli_parse_inspect_options(int argc, char **argv, cli_options *o) {
    static const char *const convs[] = {"keep", "doc_id", "masked", "additive", NULL};
    static const char *const forms[] = {"te", "npu", NULL};
    static const char *const rules[] = {"reset", "step", NULL};
    static const char *const aligns[] = {"top_left", "bottom_right", NULL};
    static const char *const fills[] = {"neg_inf", "dtype_min", NULL};
    static const char *const npu_layouts[] = {"BSND", "BNSD", "BSH", "SBH", "TND", NULL};
    static const char *const as_names[] = {"attention_mask", "position_ids", "cu_seqlens", "mask4d", NULL};
    defaults(o);
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || arg[1] == 0) {
            if (o->file) return cli_usage_error("inspect", "more than one FILE given ('%s' and '%s')", o->file, arg);
            o->file = arg;
            continue;
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            cli_print_inspect_usage(stdout);
            return -1; /* handled: exit 0 */
        }
        /* split "--flag=value" */
        char flag[64];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        size_t flen = eq ? (size_t)(eq - arg) : strlen(arg);
        if (flen >= sizeof flag) return cli_usage_error("inspect", "unknown option '%s'", arg);
        memcpy(flag, arg, flen);
        flag[flen] = 0;
        if (eq) value = eq + 1;
        /* flags without a value */
        int is_switch = 1;
        if (strcmp(flag, "--causal") == 0)
            o->causal = 1;
        else if (strcmp(flag, "--bidirectional") == 0)
            o->causal = 0;
        else if (strcmp(flag, "--json") == 0)
            o->json = 1;
        else if (strcmp(flag, "--deflate") == 0)
            o->deflate = 1;
        else
            is_switch = 0;
        if (is_switch) {
            if (value) return cli_usage_error("inspect", "option '%s' takes no value", flag);
            continue;
        }
        static const char *const with_value[] = {"--as",          "--mask-convention",
                                                 "--cu-form",     "--position-rule",
                                                 "--window",      "--alignment",
                                                 "--total",       "--emit",
                                                 "--out",         "--emit-convention",
                                                 "--emit-dtype",  "--emit-fill",
                                                 "--index-dtype", "--block",
                                                 "--npu-layout",  "--head-dim",
                                                 "--scale",       "--png",
                                                 "--svg",         "--png-rows",
                                                 "--png-zoom",    "--png-block",
                                                 "--max-bytes",   NULL};
        if (pick(flag, with_value) < 0) return cli_usage_error("inspect", "unknown option '%s'", arg);
        if (!value) {
            if (i + 1 >= argc) return cli_usage_error("inspect", "option '%s' needs a value", flag);
            value = argv[++i];
        }
        int k;
        int64_t x;
        if (strcmp(flag, "--as") == 0) {
            if (pick(value, as_names) < 0)
                return cli_usage_error(
                    "inspect", "--as: expected attention_mask|position_ids|cu_seqlens|mask4d, found '%s'", value);
            o->as = value;
        } else if (strcmp(flag, "--mask-convention") == 0) {
            if ((k = pick(value, convs)) < 0)
                return cli_usage_error("inspect", "--mask-convention: expected keep|doc_id|masked|additive, found '%s'",
                                       value);
            o->mask_conv = (cli_mask_conv)k;
        } else if (strcmp(flag, "--cu-form") == 0) {
            if ((k = pick(value, forms)) < 0)
                return cli_usage_error("inspect", "--cu-form: expected te|npu, found '%s'", value);
            o->cu_form = k;
        } else if (strcmp(flag, "--position-rule") == 0) {
            if ((k = pick(value, rules)) < 0)
                return cli_usage_error("inspect", "--position-rule: expected reset|step, found '%s'", value);
            o->position_rule = k;
        } else if (strcmp(flag, "--window") == 0) {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", value);
            char *comma = strchr(buf, ',');
            if (!comma)
                return cli_usage_error("inspect", "--window: expected L,R (e.g. 128,0 or -1,-1), found '%s'", value);
            *comma = 0;
            if (!parse_i64(buf, &o->window_left) || !parse_i64(comma + 1, &o->window_right) || o->window_left < -1 ||
                o->window_right < -1)
                return cli_usage_error("inspect", "--window: expected two integers >= -1, found '%s'", value);
            o->have_window = 1;
        } else if (strcmp(flag, "--alignment") == 0) {
            if ((k = pick(value, aligns)) < 0)
                return cli_usage_error("inspect", "--alignment: expected top_left|bottom_right, found '%s'", value);
            o->alignment = k;
        } else if (strcmp(flag, "--total") == 0) {
            if (!parse_i64(value, &o->total) || o->total < 0)
                return cli_usage_error("inspect", "--total: expected an integer >= 0, found '%s'", value);
        } else if (strcmp(flag, "--emit") == 0) {
            if (!parse_emit(value, &o->emit))
                return cli_usage_error("inspect",
                                       "--emit: expected a comma list of mask2d, mask4d, cu_seqlens, cu_seqlens_npu, "
                                       "cu_seqlens_padded, seqlens, position_ids, segment_ids, valid_indices, "
                                       "last_token_index, block_mask, npu or all; found '%s'",
                                       value);
        } else if (strcmp(flag, "--out") == 0) {
            o->out = value;
        } else if (strcmp(flag, "--emit-convention") == 0) {
            if ((k = pick(value, convs)) < 0 || k == CLI_CONV_DOC_ID)
                return cli_usage_error("inspect", "--emit-convention: expected keep|masked|additive, found '%s'",
                                       value);
            o->emit_conv = (cli_mask_conv)k;
        } else if (strcmp(flag, "--emit-dtype") == 0) {
            if ((o->emit_dtype = parse_dtype(value)) < 0)
                return cli_usage_error("inspect",
                                       "--emit-dtype: expected a dtype name (bool, uint8, int32, float32, ...), found "
                                       "'%s'",
                                       value);
        } else if (strcmp(flag, "--emit-fill") == 0) {
            if ((k = pick(value, fills)) < 0)
                return cli_usage_error("inspect", "--emit-fill: expected neg_inf|dtype_min, found '%s'", value);
            o->emit_fill = k == 0 ? MASKPACK_FILL_NEG_INF : MASKPACK_FILL_DTYPE_MIN;
        } else if (strcmp(flag, "--index-dtype") == 0) {
            k = parse_dtype(value);
            if (k != MASKPACK_I32 && k != MASKPACK_I64)
                return cli_usage_error("inspect", "--index-dtype: expected int32|int64, found '%s'", value);
            o->index_dtype = k;
        } else if (strcmp(flag, "--block") == 0) {
            if (!parse_i64(value, &o->block) || o->block < 1)
                return cli_usage_error("inspect", "--block: expected an integer >= 1, found '%s'", value);
        } else if (strcmp(flag, "--npu-layout") == 0) {
            if ((k = pick(value, npu_layouts)) < 0)
                return cli_usage_error("inspect", "--npu-layout: expected TND|BSND|BNSD|BSH|SBH, found '%s'", value);
            o->npu_layout = k;
        } else if (strcmp(flag, "--head-dim") == 0) {
            if (!parse_i64(value, &o->head_dim) || o->head_dim < 1)
                return cli_usage_error("inspect", "--head-dim: expected an integer >= 1, found '%s'", value);
        } else if (strcmp(flag, "--scale") == 0) {
            char *end = NULL;
            o->scale = strtod(value, &end);
            if (end == value || *end || !(o->scale > 0) || !isfinite(o->scale))
                return cli_usage_error("inspect", "--scale: expected a finite number > 0, found '%s'", value);
        } else if (strcmp(flag, "--png") == 0 || strcmp(flag, "--svg") == 0) {
            if (o->png)
                return cli_usage_error("inspect", "one picture per run: --png/--svg given twice ('%s' and '%s')",
                                       o->png, value);
            if (!*value) return cli_usage_error("inspect", "%s: expected a file name", flag);
            o->png = value;
            o->png_svg = strcmp(flag, "--svg") == 0;
        } else if (strcmp(flag, "--png-block") == 0) {
            if (!parse_i64(value, &x) || x < 1 || x > ((int64_t)1 << 40))
                return cli_usage_error("inspect", "--png-block: expected a block of tokens in [1, 2^40], found '%s'",
                                       value);
            o->png_block = x;
        } else if (strcmp(flag, "--png-rows") == 0) {
            if (!parse_rows(value, o))
                return cli_usage_error("inspect",
                                       "--png-rows: expected a comma list of up to 64 row indices, found '%s'", value);
        } else if (strcmp(flag, "--max-bytes") == 0) {
            if (!parse_i64(value, &x) || x < 1)
                return cli_usage_error("inspect", "--max-bytes: expected a byte count >= 1, found '%s'", value);
            o->max_bytes = (uint64_t)x;
        } else if (strcmp(flag, "--png-zoom") == 0) {
            if (!parse_i64(value, &x) || x < 1 || x > 32)
                return cli_usage_error("inspect", "--png-zoom: expected an integer in [1, 32], found '%s'", value);
            o->png_zoom = (int)x;
        }
    }
    if (o->emit && !o->out) return cli_usage_error("inspect", "--emit needs --out FILE.npz");
    if (o->out && !o->emit) return cli_usage_error("inspect", "--out needs --emit a,b,...");
    if (!o->png && (o->n_png_rows || o->png_zoom || o->png_block))
        return cli_usage_error("inspect", "%s applies to a picture: add --png FILE (or --svg FILE)",
                               o->n_png_rows ? "--png-rows"
                               : o->png_zoom ? "--png-zoom"
                                             : "--png-block");
    if (o->emit_dtype >= 0 && !(o->emit & (1u << EMIT_MASK4D)))
        return cli_usage_error("inspect", "--emit-dtype applies to --emit mask4d only");
    return 0;
}
