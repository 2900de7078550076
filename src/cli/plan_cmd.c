/* plan_cmd.c: `maskpack plan LENGTHS_FILE --capacity N [...]`: pack sequences into rows, balance the
 * rows across data-parallel ranks and micro-batches, print the report, optionally write the plan as
 * JSON and draw it as a PNG.
 *
 * Lengths come from a text file (one integer per line; blank lines and '#' comments skipped), an .npy
 * file (a 1-D integer array, or [N,1]) or JSON lines (each line a length, a list of tokens, or an
 * object with "length", "input_ids" or "tokens"). The format is recognised from the content: the
 * .npy magic; otherwise each line is JSON when it starts with '[' or '{', else an integer. */
#include "plan_cmd.h"

#include "cli.h"

#include "internal.h"
#include "io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { EXIT_OK_ = 0, EXIT_PROBLEM_ = 1, EXIT_USAGE_ = 2 };

/* Inputs at least this long get a progress bar when stderr is a terminal. */
#define PROGRESS_MIN_SEQUENCES 200000
#define PROGRESS_MIN_BYTES     ((size_t)8 << 20)

static void usage(FILE *f) {
    fprintf(f, "usage: maskpack plan LENGTHS_FILE --capacity N [options]\n"
               "\n"
               "Packs sequences into rows of N tokens and balances the rows across data-parallel ranks and\n"
               "micro-batches (equal row counts; empty rows are added when needed and reported).\n"
               "LENGTHS_FILE: text (one length per line), .npy (1-D integers) or JSON lines (a length, a token\n"
               "list, or an object with \"length\" / \"input_ids\" / \"tokens\" per line); '-' is standard input.\n"
               "\n"
               "  --capacity N            tokens per row (required)\n"
               "  --dp N                  data-parallel ranks (default 1)\n"
               "  --micro-batches N       micro-batches per rank (default 1)\n"
               "  --cp N --tp N           context / tensor parallel sizes (default 1): each sequence is padded to\n"
               "  --align verl|minimal    the CP multiple: verl tp*cp*2 (default), minimal cp*lcm(2,tp); none when\n"
               "                          cp = tp = 1\n"
               "  --multiple M            pad every sequence to a multiple of M instead\n"
               "  --objective tokens|attention   balance tokens, or a*L + L^2 per sequence (default tokens)\n"
               "  --attention-a A         a of a*L + L^2: the length at which a sequence's attention work equals\n"
               "                          its linear-layer work (wins over --model and --hidden)\n"
               "  --model H[,I[,Q[,KV[,GATED[,CAUSAL]]]]]   derive a from a model shape: hidden, intermediate\n"
               "                          (0 = 4H), q dim, kv dim (0 = H), gated MLP 0/1, causal 0/1\n"
               "  --hidden H              the model's hidden size: a = 6*H (default without any: 24576, verl's)\n"
               "  --algorithm bfd|ffd|nextfit   best-fit-decreasing (default), first-fit-decreasing, next-fit\n"
               "  --seed N                break ties with a seeded hash instead of the index (default 0)\n"
               "  --allow-split           cut sequences longer than a row into pieces instead of failing\n"
               "  --row-width capacity|used   rows of the full capacity (default) or of their used width\n"
               "  --json-out FILE         write the plan (ranks, micro-batches, rows, pieces, report) as JSON\n"
               "  --png FILE              draw the plan: ranks, micro-batches and rows against a token axis,\n"
               "                          the capacity line, each rank's cost and the mean, a legend, fill and\n"
               "                          imbalance (PNG, or SVG when FILE ends in .svg; --png-rows N: at most N\n"
               "                          rows per rank)\n"
               "  --json                  print the report as JSON instead of text\n"
               "  --progress | --no-progress   force the progress bar on stderr on or off (default: on for\n"
               "                          large inputs when stderr is a terminal)\n"
               "  -q, --quiet             print nothing but errors\n"
               "exit status: 0 ok, 1 unreadable input or a sequence that does not fit, 2 bad usage\n");
}


static int parse_i64(const char *v, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return 0;
    *out = x;
    return 1;
}

static int parse_u64(const char *v, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (*v == '-') return 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end) return 0;
    *out = x;
    return 1;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* ---- progress bar ------------------------------------------------------------------------------ */

typedef struct progress {
    int on;
    int last_percent; /* redraw only when the shown value changes... */
    double last_draw; /* ...and at most every 100 ms, except at a stage's start and end */
    const char *last_stage;
    double start;
} progress;

static void progress_draw(progress *pr, const char *stage, double fraction) {
    if (!pr->on) return;
    if (fraction < 0) fraction = 0;
    if (fraction > 1) fraction = 1;
    int percent = (int)(fraction * 100.0);
    double t = now_ms();
    int new_stage = pr->last_stage == NULL || strcmp(pr->last_stage, stage) != 0;
    if (!new_stage && (percent == pr->last_percent || (percent < 100 && t - pr->last_draw < 100.0))) return;
    if (!new_stage && pr->last_percent == 100) return; /* a finished stage is not redrawn */
    pr->last_stage = stage;
    pr->last_percent = percent;
    pr->last_draw = t;
    enum { W = 30 };
    char bar[W + 1];
    int fill = (int)(fraction * W);
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = 0;
    fprintf(stderr, "\r%-8s [%s] %3d%%  %.1f s", stage, bar, percent, (t - pr->start) / 1e3);
    if (percent == 100) fputc('\n', stderr);
    fflush(stderr);
}

static void progress_cb(void *ctx, const char *stage, double fraction) { progress_draw(ctx, stage, fraction); }

/* ---- reading lengths --------------------------------------------------------------------------- */

typedef struct lengths {
    int64_t *v;
    size_t n, cap;
} lengths;

static int push(lengths *L, int64_t x) {
    if (L->n == L->cap) {
        size_t c = L->cap ? 2 * L->cap : 1024;
        int64_t *v = mp_realloc_array(L->v, c, sizeof *v);
        if (!v) return -1;
        L->v = v;
        L->cap = c;
    }
    L->v[L->n++] = x;
    return 0;
}

/* The file's bytes (already read: standard input cannot be read twice) -> lengths. */
static int load_npy(const char *path, const uint8_t *buf, size_t len, lengths *L, const char **kind) {
    mpio_array a;
    maskpack_error e;
    *kind = "npy";
    if (mpio_npy_parse(buf, len, &a, &e)) {
        fprintf(stderr, "maskpack plan: %s: %s\n", path, e.message);
        return EXIT_PROBLEM_;
    }
    int ok_shape = a.ndim == 1 || (a.ndim == 2 && a.shape[1] == 1);
    int is_float =
        a.dtype == MASKPACK_F16 || a.dtype == MASKPACK_BF16 || a.dtype == MASKPACK_F32 || a.dtype == MASKPACK_F64;
    if (!ok_shape || is_float || a.dtype == MASKPACK_BOOL) {
        fprintf(stderr, "maskpack plan: %s: expected a 1-D integer array of lengths, found %s with %d dimension(s)\n",
                path, maskpack_dtype_name(a.dtype), (int)a.ndim);
        mpio_array_free(&a);
        return EXIT_PROBLEM_;
    }
    int64_t n = a.shape[0];
    maskpack_tensor t = mpio_array_view(&a);
    L->v = mp_alloc_array((size_t)n, sizeof *L->v);
    if (!L->v) {
        mpio_array_free(&a);
        fprintf(stderr, "maskpack plan: out of memory\n");
        return EXIT_PROBLEM_;
    }
    size_t es = maskpack_dtype_size(a.dtype);
    for (int64_t i = 0; i < n; i++) {
        const char *p = (const char *)t.data + (size_t)(i * t.strides[0]) * es;
        int64_t x = 0;
        switch (a.dtype) {
        case MASKPACK_U8: x = *(const uint8_t *)p; break;
        case MASKPACK_I8: x = *(const int8_t *)p; break;
        case MASKPACK_I16: {
            int16_t y;
            memcpy(&y, p, 2);
            x = y;
            break;
        }
        case MASKPACK_I32: {
            int32_t y;
            memcpy(&y, p, 4);
            x = y;
            break;
        }
        default: memcpy(&x, p, 8); break;
        }
        L->v[i] = x;
    }
    L->n = L->cap = (size_t)n;
    mpio_array_free(&a);
    return EXIT_OK_;
}

/* One JSON line -> its length; returns 0 or prints why not. */
static int json_line_length(const char *path, size_t line, const char *s, size_t len, int64_t *out) {
    cJSON *j = cJSON_ParseWithLength(s, len);
    if (!j) {
        fprintf(stderr, "maskpack plan: %s:%zu: not valid JSON\n", path, line);
        return -1;
    }
    int rc = 0;
    const cJSON *v = j;
    if (cJSON_IsObject(j)) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "length");
        if (!x) x = cJSON_GetObjectItemCaseSensitive(j, "input_ids");
        if (!x) x = cJSON_GetObjectItemCaseSensitive(j, "tokens");
        if (!x) {
            fprintf(stderr, "maskpack plan: %s:%zu: an object needs \"length\", \"input_ids\" or \"tokens\"\n", path,
                    line);
            cJSON_Delete(j);
            return -1;
        }
        v = x;
    }
    if (cJSON_IsArray(v)) {
        *out = (int64_t)cJSON_GetArraySize(v);
    } else if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9.0e15) {
        *out = (int64_t)v->valuedouble;
    } else {
        fprintf(stderr, "maskpack plan: %s:%zu: expected a length (integer) or a list of tokens\n", path, line);
        rc = -1;
    }
    cJSON_Delete(j);
    return rc;
}

static int load_lines(const char *path, const uint8_t *buf, size_t len, lengths *L, const char **kind, progress *pr) {
    /* a line starting with '[' or '{' is JSON; any other line is a plain integer (which is also
     * what a JSON line holding a bare length looks like) */
    *kind = "text";
    size_t line = 0, pos = 0, next_report = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && buf[end] != '\n') end++;
        line++;
        const char *s = (const char *)buf + pos;
        size_t n = end - pos;
        pos = end + 1;
        if (pos >= next_report) {
            progress_draw(pr, "reading", (double)(pos < len ? pos : len) / (double)len);
            next_report = pos + len / 200 + 1;
        }
        while (n && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
        while (n && (*s == ' ' || *s == '\t')) {
            s++;
            n--;
        }
        if (n == 0 || *s == '#') continue;
        int64_t x;
        if (*s == '[' || *s == '{') {
            *kind = "json lines";
            if (json_line_length(path, line, s, n, &x)) return EXIT_PROBLEM_;
        } else {
            char tmp[32];
            if (n >= sizeof tmp) {
                /* the line is not NUL-terminated: print at most its own bytes (this read past the buffer) */
                fprintf(stderr, "maskpack plan: %s:%zu: expected an integer length, found '%.*s...'\n", path, line,
                        (int)(n < 40 ? n : 40), s);
                return EXIT_PROBLEM_;
            }
            memcpy(tmp, s, n);
            tmp[n] = 0;
            if (!parse_i64(tmp, &x)) {
                fprintf(stderr, "maskpack plan: %s:%zu: expected an integer length, found '%s'\n", path, line, tmp);
                return EXIT_PROBLEM_;
            }
        }
        if (x < 0) {
            fprintf(stderr, "maskpack plan: %s:%zu: expected a length >= 0, found %lld\n", path, line, (long long)x);
            return EXIT_PROBLEM_;
        }
        if (push(L, x)) {
            fprintf(stderr, "maskpack plan: out of memory\n");
            return EXIT_PROBLEM_;
        }
    }
    progress_draw(pr, "reading", 1.0);
    return EXIT_OK_;
}

int mp_cli_plan_parse_lengths(const char *origin, const uint8_t *buf, size_t len, int64_t **lengths_out, size_t *n,
                              const char **kind) {
    lengths L = {0};
    progress pr = {0, -1, 0.0, NULL, 0.0}; /* off */
    int rc = mpio_detect(buf, len) == MPIO_KIND_NPY ? load_npy(origin, buf, len, &L, kind)
                                                    : load_lines(origin, buf, len, &L, kind, &pr);
    if (rc) {
        free(L.v);
        *lengths_out = NULL;
        *n = 0;
        return rc;
    }
    *lengths_out = L.v;
    *n = L.n;
    return 0;
}

/* ---- options ------------------------------------------------------------------------------------- */

typedef struct plan_args {
    const char *file;
    maskpack_plan_options o;
    int have_capacity;
    const char *json_out, *png;
    int64_t png_rows;
    int json, quiet;
    int progress; /* -1 auto, 0 off, 1 on */
    int have_model;
    int64_t model[6];
} plan_args;

static int pick(const char *v, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(v, list[i]) == 0) return i;
    return -1;
}

static int parse_args(int argc, char **argv, plan_args *a) {
    static const char *const aligns[] = {"verl", "minimal", NULL};
    static const char *const objectives[] = {"tokens", "attention", NULL};
    static const char *const algorithms[] = {"bfd", "ffd", "nextfit", NULL};
    static const char *const widths[] = {"capacity", "used", NULL};
    memset(a, 0, sizeof *a);
    a->o = maskpack_plan_options_default(0);
    a->progress = -1;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            return -1;
        }
        if (arg[0] != '-' || arg[1] == 0) {
            if (a->file) return cli_usage_error("plan", "one lengths file expected, found '%s' and '%s'", a->file, arg);
            a->file = arg;
            continue;
        }
        /* flags without a value */
        if (!strcmp(arg, "--allow-split")) {
            a->o.allow_split = 1;
            continue;
        }
        if (!strcmp(arg, "--json")) {
            a->json = 1;
            continue;
        }
        if (!strcmp(arg, "--progress")) {
            a->progress = 1;
            continue;
        }
        if (!strcmp(arg, "--no-progress")) {
            a->progress = 0;
            continue;
        }
        if (!strcmp(arg, "-q") || !strcmp(arg, "--quiet")) {
            a->quiet = 1;
            continue;
        }
        /* --flag value or --flag=value */
        const char *val = NULL;
        char name[64];
        const char *eq = strchr(arg, '=');
        if (eq) {
            size_t k = (size_t)(eq - arg);
            if (k >= sizeof name) return cli_usage_error("plan", "unknown option '%s'", arg);
            memcpy(name, arg, k);
            name[k] = 0;
            val = eq + 1;
        } else {
            if (strlen(arg) >= sizeof name) return cli_usage_error("plan", "unknown option '%s'", arg);
            strcpy(name, arg);
            if (i + 1 >= argc) return cli_usage_error("plan", "%s needs a value", arg);
            val = argv[++i];
        }
        int64_t x;
        int k;
        if (!strcmp(name, "--capacity")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--capacity: expected an integer >= 1, found '%s'", val);
            a->o.capacity = x;
            a->have_capacity = 1;
        } else if (!strcmp(name, "--dp")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--dp: expected an integer >= 1, found '%s'", val);
            a->o.dp = x;
        } else if (!strcmp(name, "--micro-batches")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--micro-batches: expected an integer >= 1, found '%s'", val);
            a->o.micro_batches = x;
        } else if (!strcmp(name, "--cp")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--cp: expected an integer >= 1, found '%s'", val);
            a->o.cp = x;
        } else if (!strcmp(name, "--tp")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--tp: expected an integer >= 1, found '%s'", val);
            a->o.tp = x;
        } else if (!strcmp(name, "--multiple")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--multiple: expected an integer >= 1, found '%s'", val);
            a->o.multiple = x;
        } else if (!strcmp(name, "--align")) {
            if ((k = pick(val, aligns)) < 0)
                return cli_usage_error("plan", "--align: expected verl or minimal, found '%s'", val);
            a->o.align = k == 0 ? MASKPACK_CP_ALIGN_VERL : MASKPACK_CP_ALIGN_MINIMAL;
        } else if (!strcmp(name, "--objective")) {
            if ((k = pick(val, objectives)) < 0)
                return cli_usage_error("plan", "--objective: expected tokens or attention, found '%s'", val);
            a->o.objective = (maskpack_plan_objective)k;
        } else if (!strcmp(name, "--attention-a")) {
            char *end = NULL;
            double d = strtod(val, &end);
            if (end == val || *end || !(d > 0) || !isfinite(d))
                return cli_usage_error("plan", "--attention-a: expected a number > 0, found '%s'", val);
            a->o.attention_a = d;
        } else if (!strcmp(name, "--model")) {
            char buf[256];
            if (strlen(val) >= sizeof buf) return cli_usage_error("plan", "--model: value too long");
            strcpy(buf, val);
            int n = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (n >= 6 || !parse_i64(tok, &x) || x < 0)
                    return cli_usage_error("plan",
                                           "--model: expected H[,I[,Q[,KV[,GATED[,CAUSAL]]]]] non-negative integers, "
                                           "found '%s'",
                                           val);
                a->model[n++] = x;
            }
            if (n == 0) return cli_usage_error("plan", "--model: expected at least the hidden size");
            a->have_model = 1;
        } else if (!strcmp(name, "--hidden")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--hidden: expected an integer >= 1, found '%s'", val);
            a->o.hidden = x;
        } else if (!strcmp(name, "--algorithm")) {
            if ((k = pick(val, algorithms)) < 0)
                return cli_usage_error("plan", "--algorithm: expected bfd, ffd or nextfit, found '%s'", val);
            a->o.algorithm = (maskpack_plan_algorithm)k;
        } else if (!strcmp(name, "--seed")) {
            uint64_t u;
            if (!parse_u64(val, &u))
                return cli_usage_error("plan", "--seed: expected an integer >= 0, found '%s'", val);
            a->o.seed = u;
        } else if (!strcmp(name, "--row-width")) {
            if ((k = pick(val, widths)) < 0)
                return cli_usage_error("plan", "--row-width: expected capacity or used, found '%s'", val);
            a->o.row_width = (maskpack_plan_width)k;
        } else if (!strcmp(name, "--json-out")) {
            a->json_out = val;
        } else if (!strcmp(name, "--png")) {
            a->png = val;
        } else if (!strcmp(name, "--png-rows")) {
            if (!parse_i64(val, &x) || x < 1)
                return cli_usage_error("plan", "--png-rows: expected an integer >= 1, found '%s'", val);
            a->png_rows = x;
        } else {
            return cli_usage_error("plan", "unknown option '%s'", name);
        }
    }
    if (!a->file) return cli_usage_error("plan", "a lengths file is required");
    if (!a->have_capacity) return cli_usage_error("plan", "--capacity is required");
    if (a->png_rows && !a->png) return cli_usage_error("plan", "--png-rows applies to a picture: add --png FILE");
    return 0;
}

/* ---- output ------------------------------------------------------------------------------------- */

static const char *algorithm_name(maskpack_plan_algorithm a) {
    return a == MASKPACK_PLAN_BFD ? "bfd" : a == MASKPACK_PLAN_FFD ? "ffd" : "nextfit";
}

static cJSON *report_json(const maskpack_plan_report *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "n_sequences", (double)r->n_sequences);
    cJSON_AddNumberToObject(o, "n_pieces", (double)r->n_pieces);
    cJSON_AddNumberToObject(o, "n_split", (double)r->n_split);
    cJSON_AddNumberToObject(o, "n_rows", (double)r->n_rows);
    cJSON_AddNumberToObject(o, "n_packed_rows", (double)r->n_packed_rows);
    cJSON_AddNumberToObject(o, "n_empty_rows", (double)r->n_empty_rows);
    cJSON_AddNumberToObject(o, "rows_per_rank", (double)r->rows_per_rank);
    cJSON_AddNumberToObject(o, "rows_per_microbatch", (double)r->rows_per_microbatch);
    cJSON_AddNumberToObject(o, "capacity", (double)r->capacity);
    cJSON_AddNumberToObject(o, "multiple", (double)r->multiple);
    cJSON_AddNumberToObject(o, "real_tokens", (double)r->real_tokens);
    cJSON_AddNumberToObject(o, "alignment_padding", (double)r->alignment_padding);
    cJSON_AddNumberToObject(o, "tail_padding", (double)r->tail_padding);
    cJSON_AddNumberToObject(o, "fill", r->fill);
    cJSON_AddNumberToObject(o, "fill_all_rows", r->fill_all_rows);
    cJSON_AddNumberToObject(o, "attention_a", r->attention_a);
    cJSON_AddNumberToObject(o, "rank_cost_min", r->rank_cost_min);
    cJSON_AddNumberToObject(o, "rank_cost_mean", r->rank_cost_mean);
    cJSON_AddNumberToObject(o, "rank_cost_max", r->rank_cost_max);
    cJSON_AddNumberToObject(o, "imbalance", r->imbalance);
    cJSON_AddNumberToObject(o, "microbatch_cost_max", r->microbatch_cost_max);
    cJSON_AddNumberToObject(o, "microbatch_cost_mean", r->microbatch_cost_mean);
    cJSON_AddNumberToObject(o, "microbatch_imbalance", r->microbatch_imbalance);
    cJSON_AddNumberToObject(o, "fill_nonempty_rows", r->fill_nonempty_rows);
    cJSON_AddNumberToObject(o, "rank_tokens_min", r->rank_tokens_min);
    cJSON_AddNumberToObject(o, "rank_tokens_mean", r->rank_tokens_mean);
    cJSON_AddNumberToObject(o, "rank_tokens_max", r->rank_tokens_max);
    cJSON_AddNumberToObject(o, "token_imbalance", r->token_imbalance);
    cJSON_AddNumberToObject(o, "rank_attention_mean", r->rank_attention_mean);
    cJSON_AddNumberToObject(o, "rank_attention_max", r->rank_attention_max);
    cJSON_AddNumberToObject(o, "attention_imbalance", r->attention_imbalance);
    return o;
}

/* Options as JSON (so a plan file says how it was made). */
static void add_options(cJSON *root, const plan_args *a, const maskpack_plan *p) {
    cJSON *o = cJSON_AddObjectToObject(root, "options");
    if (!o) return;
    cJSON_AddNumberToObject(o, "capacity", (double)a->o.capacity);
    cJSON_AddNumberToObject(o, "dp", (double)a->o.dp);
    cJSON_AddNumberToObject(o, "micro_batches", (double)a->o.micro_batches);
    cJSON_AddNumberToObject(o, "cp", (double)a->o.cp);
    cJSON_AddNumberToObject(o, "tp", (double)a->o.tp);
    cJSON_AddStringToObject(o, "align", a->o.align == MASKPACK_CP_ALIGN_VERL ? "verl" : "minimal");
    cJSON_AddNumberToObject(o, "multiple", (double)maskpack_plan_multiple(p));
    cJSON_AddStringToObject(o, "objective", a->o.objective == MASKPACK_PLAN_TOKENS ? "tokens" : "attention");
    cJSON_AddStringToObject(o, "algorithm", algorithm_name(a->o.algorithm));
    cJSON_AddNumberToObject(o, "seed", (double)a->o.seed);
    cJSON_AddBoolToObject(o, "allow_split", a->o.allow_split);
    cJSON_AddStringToObject(o, "row_width", a->o.row_width == MASKPACK_PLAN_WIDTH_CAPACITY ? "capacity" : "used");
    cJSON_AddNumberToObject(o, "hidden", (double)a->o.hidden);
}

/* The whole plan as JSON: ranks -> micro-batches -> row indices, and every row's pieces. */
static cJSON *plan_json(const plan_args *a, const maskpack_plan *p, const char *source, progress *pr) {
    maskpack_plan_report rep;
    maskpack_error e;
    maskpack_plan_get_report(p, &rep, &e);
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "maskpack_version", maskpack_version_string());
    cJSON_AddStringToObject(root, "source", source);
    add_options(root, a, p);
    cJSON_AddItemToObject(root, "report", report_json(&rep));
    cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
    int64_t dp = a->o.dp, mb = a->o.micro_batches;
    for (int64_t q = 0; ranks && q < dp; q++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddItemToArray(ranks, r);
        cJSON_AddNumberToObject(r, "rank", (double)q);
        cJSON_AddNumberToObject(r, "cost", maskpack_plan_rank_cost(p, q));
        cJSON *mbs = cJSON_AddArrayToObject(r, "micro_batches");
        for (int64_t j = 0; mbs && j < mb; j++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddItemToArray(mbs, m);
            cJSON_AddNumberToObject(m, "micro_batch", (double)j);
            cJSON_AddNumberToObject(m, "cost", maskpack_plan_microbatch_cost(p, q, j));
            cJSON *rows = cJSON_AddArrayToObject(m, "rows");
            int64_t first = (q * mb + j) * rep.rows_per_microbatch;
            for (int64_t t = 0; rows && t < rep.rows_per_microbatch; t++)
                cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)(first + t)));
        }
    }
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    maskpack_plan_piece *pc = NULL;
    size_t cap = 0;
    for (int64_t r = 0; rows && r < rep.n_rows; r++) {
        if (r % 4096 == 0) progress_draw(pr, "json", (double)r / (double)rep.n_rows);
        size_t cnt = (size_t)maskpack_plan_row_count(p, r);
        if (cnt > cap) {
            maskpack_plan_piece *g = mp_realloc_array(pc, cnt, sizeof *pc);
            if (!g) break;
            pc = g;
            cap = cnt;
        }
        if (maskpack_plan_row(p, r, pc, cap, &cnt, &e)) break;
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToArray(rows, row);
        cJSON_AddNumberToObject(row, "row", (double)r);
        cJSON_AddNumberToObject(row, "rank", (double)maskpack_plan_rank_of_row(p, r));
        cJSON_AddNumberToObject(row, "micro_batch", (double)maskpack_plan_microbatch_of_row(p, r));
        cJSON_AddNumberToObject(row, "used", (double)maskpack_plan_row_used(p, r));
        cJSON_AddNumberToObject(row, "cost", maskpack_plan_row_cost(p, r));
        int64_t tok = 0;
        cJSON *seqs = cJSON_AddArrayToObject(row, "sequences");
        cJSON *pieces = cJSON_AddArrayToObject(row, "pieces");
        for (size_t i = 0; i < cnt; i++) {
            tok += pc[i].length;
            /* a split sequence appears once per piece in "sequences"; "pieces" says which part */
            cJSON_AddItemToArray(seqs, cJSON_CreateNumber((double)pc[i].sequence));
            cJSON *piece = cJSON_CreateArray();
            cJSON_AddItemToArray(piece, cJSON_CreateNumber((double)pc[i].sequence));
            cJSON_AddItemToArray(piece, cJSON_CreateNumber((double)pc[i].offset));
            cJSON_AddItemToArray(piece, cJSON_CreateNumber((double)pc[i].length));
            cJSON_AddItemToArray(piece, cJSON_CreateNumber((double)pc[i].slot));
            cJSON_AddItemToArray(pieces, piece);
        }
        cJSON_AddNumberToObject(row, "tokens", (double)tok);
    }
    free(pc);
    progress_draw(pr, "json", 1.0);
    return root;
}

static void print_text(const plan_args *a, const maskpack_plan *p, const char *kind, double read_ms, double plan_ms) {
    maskpack_plan_report r;
    maskpack_error e;
    maskpack_plan_get_report(p, &r, &e);
    printf("maskpack plan: %lld sequences from %s (%s), %lld tokens\n", (long long)r.n_sequences, a->file, kind,
           (long long)r.real_tokens);
    printf("  capacity %lld, multiple %lld (cp %lld, tp %lld, %s), algorithm %s, objective %s", (long long)r.capacity,
           (long long)r.multiple, (long long)a->o.cp, (long long)a->o.tp,
           a->o.multiple                          ? "explicit"
           : a->o.align == MASKPACK_CP_ALIGN_VERL ? "verl"
                                                  : "minimal",
           algorithm_name(a->o.algorithm), a->o.objective == MASKPACK_PLAN_TOKENS ? "tokens" : "attention");
    if (a->o.objective == MASKPACK_PLAN_ATTENTION) printf(" (%.6g*L + L^2)", r.attention_a);
    printf(", seed %llu\n", (unsigned long long)a->o.seed);
    printf("  rows: %lld packed", (long long)r.n_packed_rows);
    if (r.n_empty_rows)
        printf(" + %lld empty (added so every rank and micro-batch gets %lld rows)", (long long)r.n_empty_rows,
               (long long)r.rows_per_microbatch);
    printf(" = %lld = dp %lld x %lld micro-batch(es) x %lld rows\n", (long long)r.n_rows, (long long)a->o.dp,
           (long long)a->o.micro_batches, (long long)r.rows_per_microbatch);
    long long lower = r.capacity ? (long long)((r.real_tokens + r.alignment_padding + r.capacity - 1) / r.capacity) : 0;
    printf("  fill over every row every rank runs: %.4f%% (%lld rows per rank, empty rows included)\n",
           100.0 * r.fill_all_rows, (long long)r.rows_per_rank);
    printf("  fill of non-empty rows: %.4f%% (lower bound %lld rows)\n", 100.0 * r.fill, lower);
    printf("  padding: %lld alignment, %lld at row ends, %lld in empty rows\n", (long long)r.alignment_padding,
           (long long)r.tail_padding, (long long)(r.n_empty_rows * r.capacity));
    if (r.n_split)
        printf("  split: %lld sequence(s) into %lld pieces in all\n", (long long)r.n_split, (long long)r.n_pieces);
    printf("  rank cost (%s): min %.6g, mean %.6g, max %.6g; imbalance max/mean-1 = %.4f%%\n",
           a->o.objective == MASKPACK_PLAN_TOKENS ? "tokens" : "attention", r.rank_cost_min, r.rank_cost_mean,
           r.rank_cost_max, 100.0 * r.imbalance);
    printf("  rank imbalance max/mean-1: tokens %.4f%% (max %.6g, mean %.6g), attention %.4f%% (a = %.6g)\n",
           100.0 * r.token_imbalance, r.rank_tokens_max, r.rank_tokens_mean, 100.0 * r.attention_imbalance,
           r.attention_a);
    if (a->o.micro_batches > 1)
        printf("  micro-batch cost: mean %.6g, max %.6g; imbalance %.4f%%\n", r.microbatch_cost_mean,
               r.microbatch_cost_max, 100.0 * r.microbatch_imbalance);
    if (a->o.dp <= 16 && a->o.dp > 1) {
        printf("  per rank:");
        for (int64_t q = 0; q < a->o.dp; q++) printf(" %.6g", maskpack_plan_rank_cost(p, q));
        printf("\n");
    }
    printf("  time: read %.1f ms, plan %.2f ms\n", read_ms, plan_ms);
}

static int write_json_file(const char *path, cJSON *root) {
    char *text = cJSON_PrintUnformatted(root);
    if (!text) {
        fprintf(stderr, "maskpack plan: out of memory while writing JSON\n");
        return EXIT_PROBLEM_;
    }
    maskpack_error e;
    size_t len = strlen(text);
    text[len] = '\n'; /* replace the terminator: the file ends with a newline */
    maskpack_status s = mpio_write_file(path, text, len + 1, &e);
    free(text);
    if (s) {
        fprintf(stderr, "maskpack plan: %s\n", e.message);
        return EXIT_PROBLEM_;
    }
    return EXIT_OK_;
}

int maskpack_cli_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) return EXIT_OK_; /* --help */
    if (rc) return rc;
    progress pr = {0, -1, 0.0, NULL, now_ms()};
    maskpack_error e;
    if (a.have_model && !(a.o.attention_a > 0)) { /* a given --attention-a takes precedence */
        int64_t *m = a.model;
        if (maskpack_plan_attention_coefficient(m[0], m[1], m[2], m[3], (int)(m[4] != 0), (int)(m[5] != 0),
                                                &a.o.attention_a, &e))
            return cli_usage_error("plan", "--model: %s", e.message);
    }

    /* read */
    double t0 = now_ms();
    uint8_t *buf = NULL;
    size_t len = 0;
    if (mpio_read_file(a.file, MPIO_MAX_BYTES, &buf, &len, &e)) {
        fprintf(stderr, "maskpack plan: %s\n", e.message);
        return EXIT_PROBLEM_;
    }
    pr.on = a.progress == 1 || (a.progress == -1 && isatty(2) && len >= PROGRESS_MIN_BYTES);
    lengths L = {0};
    const char *kind = "text";
    if (mpio_detect(buf, len) == MPIO_KIND_NPY)
        rc = load_npy(a.file, buf, len, &L, &kind);
    else
        rc = load_lines(a.file, buf, len, &L, &kind, &pr);
    free(buf);
    if (rc) {
        free(L.v);
        return rc;
    }
    double read_ms = now_ms() - t0;
    if (a.progress == -1 && isatty(2) && L.n >= PROGRESS_MIN_SEQUENCES) pr.on = 1;

    /* plan */
    if (pr.on) {
        a.o.progress = progress_cb;
        a.o.progress_ctx = &pr;
    }
    maskpack_plan *p = NULL;
    double t1 = now_ms();
    maskpack_status s = maskpack_plan_create(L.v, L.n, &a.o, &p, &e);
    double plan_ms = now_ms() - t1;
    free(L.v);
    if (s) {
        if (pr.on) fputc('\n', stderr);
        fprintf(stderr, "maskpack plan: %s [%s]\n", e.message, maskpack_status_name(s));
        return s == MASKPACK_ERR_INVALID_ARGUMENT || s == MASKPACK_ERR_CONVENTION ? EXIT_USAGE_ : EXIT_PROBLEM_;
    }

    rc = EXIT_OK_;
    if (a.json_out) {
        cJSON *root = plan_json(&a, p, a.file, &pr);
        if (!root) {
            fprintf(stderr, "maskpack plan: out of memory while building JSON\n");
            rc = EXIT_PROBLEM_;
        } else {
            rc = write_json_file(a.json_out, root);
            cJSON_Delete(root);
        }
    }
    int64_t drawn = 0;
    if (!rc && a.png) {
        if (mp_cli_plan_png(a.png, p, a.file, a.o.objective == MASKPACK_PLAN_TOKENS ? "tokens" : "attention, a*L + L^2",
                            a.png_rows, &drawn, &e)) {
            fprintf(stderr, "maskpack plan: %s\n", e.message);
            rc = EXIT_PROBLEM_;
        }
    }
    if (!a.quiet) {
        if (a.json) {
            maskpack_plan_report r;
            maskpack_plan_get_report(p, &r, &e);
            cJSON *root = cJSON_CreateObject();
            cJSON_AddStringToObject(root, "source", a.file);
            cJSON_AddStringToObject(root, "format", kind);
            add_options(root, &a, p);
            cJSON_AddItemToObject(root, "report", report_json(&r));
            cJSON *costs = cJSON_AddArrayToObject(root, "rank_costs");
            for (int64_t q = 0; costs && q < a.o.dp; q++)
                cJSON_AddItemToArray(costs, cJSON_CreateNumber(maskpack_plan_rank_cost(p, q)));
            char *text = cJSON_Print(root);
            if (text) printf("%s\n", text);
            free(text);
            cJSON_Delete(root);
        } else {
            print_text(&a, p, kind, read_ms, plan_ms);
            if (a.json_out && !rc) printf("  plan written to %s\n", a.json_out);
            if (a.png && !rc) {
                maskpack_plan_report r;
                maskpack_plan_get_report(p, &r, &e);
                printf("  picture written to %s", a.png);
                if (drawn < r.rows_per_rank)
                    printf(" (first %lld of %lld rows per rank)", (long long)drawn, (long long)r.rows_per_rank);
                printf("\n");
            }
        }
    }
    maskpack_plan_free(p);
    return rc;
}
