/* cp_sim.c: `maskpack cp-sim`, context parallelism on paper. For a token budget of documents drawn
 * from a length mix, each rank's causal attention work (allowed query-key pairs), its tokens (the
 * Gated DeltaNet work of a sequence-split layer: linear in tokens) and the bytes it sends per ring
 * step, under three assignments: zigzag (Megatron / TransformerEngine THD), contiguous (the packed
 * stream cut in cp equal pieces) and area-balanced (documents cut into chunks whose causal areas are
 * dealt largest first to the least loaded rank, as MagiAttention's dispatcher balances area). Only
 * closed forms and one pass over the documents: a million tokens over 256 ranks take milliseconds. */
#include "cli.h"
#include "draw.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SCHEMES = 3, MAX_RANKS_LIST = 16 };
static const char *const scheme_names[SCHEMES] = {"zigzag", "contiguous", "area-balanced"};

typedef struct sim_options {
    int64_t tokens, chunk, kv_heads, head_dim, dtype_bytes;
    int64_t ranks[MAX_RANKS_LIST];
    int n_ranks;
    const char *mix, *png;
    uint64_t seed;
} sim_options;

/* splitmix64: a small, well-mixed, seedable generator (the same mix for the same seed everywhere) */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) / 9007199254740992.0; }

static double normal(uint64_t *s) { /* Box-Muller */
    return sqrt(-2.0 * log(uniform01(s))) * cos(6.283185307179586 * uniform01(s));
}

/* One document length of the mix: lognormal (median ~1.1k), chat (short turns with a long tail) or
 * uniform [64, 32k]; clipped to [16, 131072]. */
static int64_t draw_length(const char *mix, uint64_t *s) {
    double x;
    if (strcmp(mix, "uniform") == 0)
        x = 64 + uniform01(s) * (32768 - 64);
    else if (strcmp(mix, "chat") == 0)
        x = uniform01(s) < 0.8 ? exp(6.0 + 0.8 * normal(s)) : exp(9.0 + 1.0 * normal(s));
    else
        x = exp(7.0 + 1.0 * normal(s));
    int64_t n = (int64_t)x;
    return n < 16 ? 16 : n > 131072 ? 131072 : n;
}

/* causal pairs of queries [a, b) of a document of L real tokens: sum over p < L of (p + 1) */
static double area(int64_t a, int64_t b, int64_t L) {
    a = a < L ? a : L;
    b = b < L ? b : L;
    return ((double)b * (double)(b + 1) - (double)a * (double)(a + 1)) / 2.0;
}

/* (area, tokens) pairs by area, largest first */
static int cmp_desc(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a < b) - (a > b);
}

typedef struct rank_load {
    double work, tokens;
} rank_load;

/* The three assignments of the documents over cp ranks: load[scheme * cp + r]. */
static void simulate(const int64_t *len, size_t n_docs, int64_t cp, int64_t chunk, rank_load *load, double *heap) {
    memset(load, 0, sizeof *load * (size_t)(SCHEMES * cp));
    rank_load *zz = load, *ct = load + cp, *ab = load + 2 * cp;
    /* zigzag: each document padded to a multiple of 2cp, chunks r and 2cp-1-r to rank r */
    for (size_t d = 0; d < n_docs; d++) {
        int64_t L = len[d], m = 2 * cp, Lp = (L + m - 1) / m * m, c = Lp / m;
        for (int64_t r = 0; r < cp; r++) {
            int64_t k2 = m - 1 - r;
            zz[r].work += area(r * c, (r + 1) * c, L) + area(k2 * c, (k2 + 1) * c, L);
            zz[r].tokens += (double)(2 * c);
        }
    }
    /* contiguous: the packed stream (total padded to a multiple of cp) cut in cp equal pieces */
    int64_t total = 0;
    for (size_t d = 0; d < n_docs; d++) total += len[d];
    int64_t piece = (total + cp - 1) / cp, at = 0;
    for (size_t d = 0; d < n_docs; d++) {
        int64_t L = len[d];
        for (int64_t p = 0; p < L;) { /* the document's part on each rank it touches */
            int64_t r = (at + p) / piece, end = (r + 1) * piece - at;
            end = end < L ? end : L;
            ct[r].work += area(p, end, L);
            ct[r].tokens += (double)(end - p);
            p = end;
        }
        at += L;
    }
    for (int64_t r = 0; r < cp; r++) ct[r].tokens = (double)piece; /* every rank holds a piece (pads included) */
    /* area-balanced: chunks of `chunk` tokens, largest area first to the least loaded rank (LPT); the
     * chunks of a document are dealt from its end (the largest areas) to its start */
    size_t n_chunks = 0;
    for (size_t d = 0; d < n_docs; d++) n_chunks += (size_t)((len[d] + chunk - 1) / chunk);
    double *areas = heap, *toks = heap + n_chunks;
    size_t k = 0;
    for (size_t d = 0; d < n_docs; d++)
        for (int64_t a = 0; a < len[d]; a += chunk) {
            int64_t b = a + chunk < len[d] ? a + chunk : len[d];
            areas[k] = area(a, b, len[d]);
            toks[k++] = (double)(b - a);
        }
    /* descending areas: a simple O(n log n) sort of (area, tokens) pairs packed in one array */
    double *pairs = heap + 2 * n_chunks;
    for (size_t i = 0; i < n_chunks; i++) {
        pairs[2 * i] = areas[i];
        pairs[2 * i + 1] = toks[i];
    }
    qsort(pairs, n_chunks, 2 * sizeof(double), cmp_desc);
    for (size_t i = 0; i < n_chunks; i++) {
        int64_t best = 0;
        for (int64_t r = 1; r < cp; r++)
            if (ab[r].work < ab[best].work) best = r;
        ab[best].work += pairs[2 * i];
        ab[best].tokens += pairs[2 * i + 1];
    }
}

static void stats(const rank_load *l, int64_t cp, int tokens, double *mx, double *mean) {
    double m = 0, s = 0;
    for (int64_t r = 0; r < cp; r++) {
        double v = tokens ? l[r].tokens : l[r].work;
        s += v;
        m = v > m ? v : m;
    }
    *mx = m;
    *mean = s / (double)cp;
}

/* A picture of the per-rank attention work at the largest cp: one band per scheme (named, with its
 * imbalance), one bar per rank on a rank axis, every band on one work scale (the heaviest rank of all
 * schemes), the mean as a labelled dashed line, a title and a legend. PNG, or SVG by the name. Returns 0,
 * or 1 with why set. */
static int write_picture(const char *path, const rank_load *load, int64_t cp, const sim_options *o, size_t n_docs,
                         char *why, size_t cap) {
    static const uint32_t colour[SCHEMES] = {0x1f77b4, 0xd62728, 0x2ca02c};
    const double margin = 20, left = 190, band_h = 130, gap = 46;
    double plot_w = (double)cp * 8;
    if (plot_w < 640) plot_w = 640;
    if (plot_w > 1200) plot_w = 1200;
    double width = margin + left + plot_w + 110 + margin;
    dw *d = dw_new(width, 100);
    if (!d) {
        snprintf(why, cap, "out of memory");
        return 1;
    }
    char line[512], num[48];
    snprintf(line, sizeof line, "cp-sim: causal attention work per rank at cp = %lld, three ways to cut the batch",
             (long long)cp);
    dw_group(d, "title", line);
    dw_text(d, margin, margin + 16, line, 16, 0x000000, DW_LEFT, 1, 0);
    dw_group_end(d);
    snprintf(line, sizeof line,
             "%lld tokens in %zu documents (%s mix); work = allowed query-key pairs; every band "
             "on one scale (0 to the heaviest rank of all schemes)",
             (long long)o->tokens, n_docs, o->mix);
    dw_text(d, margin, margin + 36, line, 12, 0x222222, DW_LEFT, 0, 0);
    double top = 0;
    for (int64_t i = 0; i < SCHEMES * cp; i++) top = load[i].work > top ? load[i].work : top;
    double y = margin + 60, x0 = margin + left;
    double bar = plot_w / (double)cp;
    char widest[32];
    snprintf(widest, sizeof widest, "%lld", (long long)(cp - 1));
    double rstep = dw_nice_step((dw_text_width(widest, 10, 0) + 12) / bar);
    for (int s = 0; s < SCHEMES; s++) {
        double mx, mean;
        stats(load + s * cp, cp, 0, &mx, &mean);
        double y0 = y, yb = y + band_h; /* band top and baseline */
        dw_group(d, "scheme", scheme_names[s]);
        dw_text(d, margin, y0 + 16, scheme_names[s], 14, colour[s], DW_LEFT, 1, 0);
        snprintf(line, sizeof line, "max / mean = %.3f", mean > 0 ? mx / mean : 1.0);
        dw_text(d, margin, y0 + 34, line, 11.5, 0x222222, DW_LEFT, 0, 0);
        dw_short_number(mx, num, sizeof num);
        snprintf(line, sizeof line, "heaviest rank: %s", num);
        dw_text(d, margin, y0 + 50, line, 11.5, 0x222222, DW_LEFT, 0, 0);
        /* work axis */
        dw_line(d, x0, y0, x0, yb, 0x000000, 1, 0);
        for (int k = 0; k <= 2; k++) {
            double v = top * k / 2, py = yb - band_h * k / 2;
            dw_short_number(v, num, sizeof num);
            dw_line(d, x0 - 4, py, x0, py, 0x000000, 1, 0);
            dw_text(d, x0 - 6, py + 3.5, num, 9.5, 0x666666, DW_RIGHT, 0, 0);
        }
        dw_text(d, x0 - 52, (y0 + yb) / 2, "work", 10, 0x666666, DW_CENTRE, 0, 1);
        /* the bars: separate below 65 ranks, one outline above */
        if (cp <= 64) {
            for (int64_t r = 0; r < cp; r++) {
                double h = top > 0 ? band_h * load[s * cp + r].work / top : 0;
                dw_rect(d, x0 + (double)r * bar + 0.5, yb - h, bar - 1.5, h, colour[s], DW_NONE, 0);
            }
        } else {
            size_t n_points = (size_t)cp * 2 + 2; /* cp <= 65536 */
            double *xy = mp_alloc_array(n_points, sizeof(double[2]));
            if (!xy) {
                dw_free(d);
                snprintf(why, cap, "out of memory");
                return 1;
            }
            size_t n = 0;
            xy[2 * n] = x0, xy[2 * n + 1] = yb, n++;
            for (int64_t r = 0; r < cp; r++) {
                double h = top > 0 ? band_h * load[s * cp + r].work / top : 0;
                xy[2 * n] = x0 + (double)r * bar, xy[2 * n + 1] = yb - h, n++;
                xy[2 * n] = x0 + (double)(r + 1) * bar, xy[2 * n + 1] = yb - h, n++;
            }
            xy[2 * n] = x0 + plot_w, xy[2 * n + 1] = yb, n++;
            dw_path(d, xy, n, 1, colour[s], DW_NONE, 0);
            free(xy);
        }
        /* rank axis */
        dw_line(d, x0, yb, x0 + plot_w, yb, 0x000000, 1, 0);
        for (double r = 0; r < (double)cp; r += rstep) {
            double px = x0 + (r + 0.5) * bar;
            snprintf(num, sizeof num, "%.0f", r);
            dw_line(d, px, yb, px, yb + 4, 0x000000, 1, 0);
            dw_text(d, px, yb + 15, num, 9.5, 0x666666, DW_CENTRE, 0, 0);
        }
        dw_text(d, x0 + plot_w + 8, yb + 15, "rank", 10, 0x666666, DW_LEFT, 0, 0);
        /* the mean */
        double ym = yb - (top > 0 ? band_h * mean / top : 0);
        dw_group(d, "mean-line", "mean over ranks");
        dw_line(d, x0, ym, x0 + plot_w + 4, ym, 0x000000, 1.4, 1);
        dw_short_number(mean, num, sizeof num);
        snprintf(line, sizeof line, "mean %s", num);
        dw_text(d, x0 + plot_w + 8, ym + 4, line, 10.5, 0x000000, DW_LEFT, 1, 0);
        dw_group_end(d);
        dw_group_end(d);
        y = yb + gap;
    }
    snprintf(line, sizeof line, "rank (0 to %lld): one bar per rank", (long long)(cp - 1));
    dw_text(d, x0 + plot_w / 2, y - gap + 32, line, 11.5, 0x222222, DW_CENTRE, 1, 0);
    y += 4;
    dw_group(d, "legend", "legend");
    dw_text(d, margin, y + 12, "Legend", 13, 0x000000, DW_LEFT, 1, 0);
    y += 22;
    for (int s = 0; s < SCHEMES; s++) dw_rect(d, margin + 6.0 * s, y, 6, 12, colour[s], DW_NONE, 0);
    dw_text(d, margin + 24, y + 10,
            "a bar: one rank's causal attention work (allowed query-key pairs) under the band's scheme", 11, 0x222222,
            DW_LEFT, 0, 0);
    y += 18;
    dw_line(d, margin, y + 6, margin + 18, y + 6, 0x000000, 1.4, 1);
    dw_text(d, margin + 24, y + 10,
            "mean: the mean work over ranks; a balanced scheme's bars all end there (max / mean = 1)", 11, 0x222222,
            DW_LEFT, 0, 0);
    y += 18;
    dw_text(d, margin, y + 10,
            "zigzag: chunks r and 2cp-1-r of every document to rank r; contiguous: the packed stream cut in cp equal "
            "pieces; area-balanced: chunks dealt largest area first",
            11, 0x222222, DW_LEFT, 0, 0);
    dw_group_end(d);
    y += 18 + margin;
    dw_set_size(d, ceil(width), ceil(y));
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = dw_encode(d, dw_path_is_svg(path), &buf, &len, why, cap);
    dw_free(d);
    if (!rc) {
        maskpack_error e;
        if (mpio_write_file(path, buf, len, &e)) {
            snprintf(why, cap, "%s", e.message);
            rc = 1;
        }
    }
    free(buf);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f, "usage: maskpack cp-sim [--tokens N] [--mix lognormal|chat|uniform] [--ranks 8,16,...]\n"
               "                       [--chunk N] [--kv-heads N] [--head-dim N] [--dtype-bytes N] [--seed N]\n"
               "                       [--png FILE]\n"
               "  Per-rank causal attention work (allowed query-key pairs), tokens (a sequence-split GDN\n"
               "  layer's work) and ring bytes per step under zigzag, contiguous and area-balanced\n"
               "  assignments. Defaults: 1000000 tokens, lognormal, ranks 8,16,32,64,128,256, area chunks of\n"
               "  512, 8 KV heads of 128, 2-byte K/V; --png draws the per-rank work at the largest rank count\n"
               "  (PNG, or SVG when FILE ends in .svg).\n");
}

static int parse_count(const char *v, int64_t *out) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < 1) return 0;
    *out = x;
    return 1;
}

int maskpack_cli_cp_sim(int argc, char **argv) {
    sim_options o = {1000000, 512, 8, 128, 2, {8, 16, 32, 64, 128, 256}, 6, "lognormal", NULL, 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return CLI_EXIT_OK;
        }
        if (i + 1 >= argc) return cli_usage_error("cp-sim", "%s needs a value (or is unknown)", a);
        const char *v = argv[++i];
        int64_t x;
        if (strcmp(a, "--tokens") == 0 || strcmp(a, "--chunk") == 0 || strcmp(a, "--kv-heads") == 0 ||
            strcmp(a, "--head-dim") == 0 || strcmp(a, "--dtype-bytes") == 0 || strcmp(a, "--seed") == 0) {
            if (!parse_count(v, &x) || x > ((int64_t)1 << 40))
                return cli_usage_error("cp-sim", "%s: expected an integer in [1, 2^40], found '%s'", a, v);
            if (strcmp(a, "--tokens") == 0)
                o.tokens = x;
            else if (strcmp(a, "--chunk") == 0)
                o.chunk = x;
            else if (strcmp(a, "--kv-heads") == 0)
                o.kv_heads = x;
            else if (strcmp(a, "--head-dim") == 0)
                o.head_dim = x;
            else if (strcmp(a, "--dtype-bytes") == 0)
                o.dtype_bytes = x;
            else
                o.seed = (uint64_t)x;
        } else if (strcmp(a, "--mix") == 0) {
            if (strcmp(v, "lognormal") && strcmp(v, "chat") && strcmp(v, "uniform"))
                return cli_usage_error("cp-sim", "--mix: expected lognormal, chat or uniform, found '%s'", v);
            o.mix = v;
        } else if (strcmp(a, "--png") == 0) {
            o.png = v;
        } else if (strcmp(a, "--ranks") == 0) {
            o.n_ranks = 0;
            for (const char *p = v; *p;) {
                char *end;
                long long r = strtoll(p, &end, 10);
                if (end == p || r < 1 || r > 65536 || o.n_ranks == MAX_RANKS_LIST || (*end && *end != ','))
                    return cli_usage_error("cp-sim",
                                           "--ranks: expected up to %d counts in [1, 65536] separated by "
                                           "commas, found '%s'",
                                           MAX_RANKS_LIST, v);
                o.ranks[o.n_ranks++] = r;
                p = *end ? end + 1 : end;
            }
            if (!o.n_ranks) return cli_usage_error("cp-sim", "--ranks: expected at least one count");
        } else {
            return cli_usage_error("cp-sim", "unknown option '%s'", a);
        }
    }
    /* the documents: drawn until the budget is reached, the last one cut to fit */
    size_t cap = 1024, n = 0;
    int64_t *len = mp_alloc_array(cap, sizeof *len), got = 0;
    uint64_t rng = o.seed;
    while (len && got < o.tokens) {
        if (n == cap) {
            size_t grown;
            int64_t *g = mp_mul_size(cap, 2, &grown) ? NULL : mp_realloc_array(len, grown, sizeof *len);
            if (!g) break;
            len = g;
            cap *= 2;
        }
        int64_t L = draw_length(o.mix, &rng);
        L = L < o.tokens - got ? L : o.tokens - got;
        len[n++] = L;
        got += L;
    }
    int64_t cp_max = 1;
    for (int i = 0; i < o.n_ranks; i++) cp_max = o.ranks[i] > cp_max ? o.ranks[i] : cp_max;
    size_t n_chunks = 0;
    for (size_t d = 0; len && d < n; d++) n_chunks += (size_t)((len[d] + o.chunk - 1) / o.chunk);
    rank_load *load = mp_alloc_array((size_t)cp_max, SCHEMES * sizeof *load);
    double *heap = mp_alloc_array(n_chunks ? n_chunks : 1, 4 * sizeof *heap); /* areas, tokens, pairs */
    if (!len || got < o.tokens || !load || !heap) {
        free(len);
        free(load);
        free(heap);
        fprintf(stderr, "maskpack cp-sim: out of memory\n");
        return CLI_EXIT_PROBLEMS;
    }
    int64_t longest = 0;
    for (size_t d = 0; d < n; d++) longest = len[d] > longest ? len[d] : longest;
    printf("maskpack %s cp-sim: %lld tokens in %zu documents (%s mix, longest %lld), causal; ring K/V of %lld "
           "heads x %lld x %lld bytes per token\n",
           maskpack_version_string(), (long long)o.tokens, n, o.mix, (long long)longest, (long long)o.kv_heads,
           (long long)o.head_dim, (long long)o.dtype_bytes);
    printf("  imbalance = max / mean over ranks; work = allowed query-key pairs; GDN (sequence-split) work\n"
           "  follows tokens; head-parallel GDN is balanced by construction; bytes = K and V one rank sends\n"
           "  per ring step (the largest rank)\n");
    printf("  %5s  %-14s %12s %10s %12s %10s %14s\n", "ranks", "scheme", "work max", "work imb", "tokens max",
           "token imb", "bytes/step");
    for (int i = 0; i < o.n_ranks; i++) {
        int64_t cp = o.ranks[i];
        simulate(len, n, cp, o.chunk, load, heap);
        for (int s = 0; s < SCHEMES; s++) {
            double wmax, wmean, tmax, tmean;
            stats(load + s * cp, cp, 0, &wmax, &wmean);
            stats(load + s * cp, cp, 1, &tmax, &tmean);
            double bytes = tmax * 2.0 * (double)o.kv_heads * (double)o.head_dim * (double)o.dtype_bytes;
            printf("  %5lld  %-14s %12.4g %10.3f %12.0f %10.3f %14.4g\n", (long long)cp, scheme_names[s], wmax,
                   wmean > 0 ? wmax / wmean : 1.0, tmax, tmean > 0 ? tmax / tmean : 1.0, bytes);
        }
    }
    int rc = CLI_EXIT_OK;
    if (o.png) {
        char why[512];
        simulate(len, n, cp_max, o.chunk, load, heap);
        if (write_picture(o.png, load, cp_max, &o, n, why, sizeof why)) {
            fprintf(stderr, "maskpack cp-sim: nothing written to %s: %s\n", o.png, why);
            rc = CLI_EXIT_PROBLEMS;
        } else {
            printf("wrote %s: per-rank attention work at %lld ranks (bands: zigzag, contiguous, area-balanced; "
                   "dashed line: the mean)\n",
                   o.png, (long long)cp_max);
        }
    }
    free(len);
    free(load);
    free(heap);
    return rc;
}
