/* cp_sim.c: `maskpack cp-sim`, context parallelism on paper. For a token budget of documents drawn
 * from a length mix, each rank's causal attention work (allowed query-key pairs), its tokens (the
 * Gated DeltaNet work of a sequence-split layer: linear in tokens) and the bytes it sends per ring
 * step, under three assignments: zigzag (Megatron / TransformerEngine THD), contiguous (the packed
 * stream cut in cp equal pieces) and area-balanced (documents cut into chunks whose causal areas are
 * dealt largest first to the least loaded rank, as MagiAttention's dispatcher balances area). Only
 * closed forms and one pass over the documents: a million tokens over 256 ranks take milliseconds. */
#include "cli.h"
#include "internal.h"

#include <math.h>
#include <png.h>
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

/* A picture of the per-rank attention work at the largest cp: one band per scheme, one bar per rank,
 * heights relative to the heaviest rank of all schemes, the mean as a black line. */
static int write_png(const char *path, const rank_load *load, int64_t cp) {
    const int bar = cp <= 64 ? 8 : cp <= 128 ? 4 : 2, band_h = 120, gap = 14;
    const int W = (int)(cp * bar) + 20, H = SCHEMES * (band_h + gap) + gap, row = W * 3; /* cp <= 65536 */
    uint8_t *img = mp_alloc_array((size_t)row, (size_t)H);
    if (!img) return 1;
    memset(img, 255, (size_t)W * (size_t)H * 3);
    static const uint8_t colour[SCHEMES][3] = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44}};
    double top = 0;
    for (int64_t i = 0; i < SCHEMES * cp; i++) top = load[i].work > top ? load[i].work : top;
    for (int s = 0; s < SCHEMES; s++) {
        int y0 = gap + s * (band_h + gap); /* band top */
        double mx, mean;
        stats(load + s * cp, cp, 0, &mx, &mean);
        for (int64_t r = 0; r < cp; r++) {
            int h = top > 0 ? (int)(band_h * load[s * cp + r].work / top + 0.5) : 0;
            for (int y = y0 + band_h - h; y < y0 + band_h; y++)
                for (int x = 10 + (int)r * bar; x < 10 + (int)(r + 1) * bar - (bar > 2); x++)
                    memcpy(img + ((size_t)y * W + (size_t)x) * 3, colour[s], 3);
        }
        int ym = y0 + band_h - (top > 0 ? (int)(band_h * mean / top + 0.5) : 0);
        for (int x = 10; x < W - 10; x++) memset(img + ((size_t)ym * W + (size_t)x) * 3, 0, 3);
    }
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)W;
    im.height = (png_uint_32)H;
    im.format = PNG_FORMAT_RGB;
    int ok = png_image_write_to_file(&im, path, 0, img, W * 3, NULL);
    free(img);
    return ok ? 0 : 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: maskpack cp-sim [--tokens N] [--mix lognormal|chat|uniform] [--ranks 8,16,...]\n"
               "                       [--chunk N] [--kv-heads N] [--head-dim N] [--dtype-bytes N] [--seed N]\n"
               "                       [--png FILE]\n"
               "  Per-rank causal attention work (allowed query-key pairs), tokens (a sequence-split GDN\n"
               "  layer's work) and ring bytes per step under zigzag, contiguous and area-balanced\n"
               "  assignments. Defaults: 1000000 tokens, lognormal, ranks 8,16,32,64,128,256, area chunks of\n"
               "  512, 8 KV heads of 128, 2-byte K/V; --png draws the per-rank work at the largest rank count.\n");
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
            if (strcmp(a, "--tokens") == 0) o.tokens = x;
            else if (strcmp(a, "--chunk") == 0) o.chunk = x;
            else if (strcmp(a, "--kv-heads") == 0) o.kv_heads = x;
            else if (strcmp(a, "--head-dim") == 0) o.head_dim = x;
            else if (strcmp(a, "--dtype-bytes") == 0) o.dtype_bytes = x;
            else o.seed = (uint64_t)x;
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
                    return cli_usage_error("cp-sim", "--ranks: expected up to %d counts in [1, 65536] separated by "
                                                     "commas, found '%s'", MAX_RANKS_LIST, v);
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
        simulate(len, n, cp_max, o.chunk, load, heap);
        if (write_png(o.png, load, cp_max)) {
            fprintf(stderr, "maskpack cp-sim: cannot write %s\n", o.png);
            rc = CLI_EXIT_PROBLEMS;
        } else {
            printf("wrote %s: per-rank attention work at %lld ranks (bands: zigzag, contiguous, area-balanced; "
                   "black line: the mean)\n",
                   o.png, (long long)cp_max);
        }
    }
    free(len);
    free(load);
    free(heap);
    return rc;
}
