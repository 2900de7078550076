/* plan_png.c: `maskpack plan --png FILE` (or an .svg): a picture of a packing plan a person reads without
 * the source: a title, every rank and micro-batch named on the left, a token axis under the rows, the
 * capacity line, each rank's cost beside its rows with the mean line, a legend, and the fill and
 * imbalance figures in the caption. Drawn on the canvas of draw.h (cairo). */
#include "plan_cmd.h"
#include "draw.h"
#include "internal.h"
#include "io.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAR_W      900   /* pixels for `capacity` tokens */
#define COST_W     220   /* the cost bars */
#define LEFT       150.0 /* rank / micro-batch labels */
#define MARGIN     20.0
#define MAX_PLOT_H 6000.0

#define C_UNUSED   0xE4E4E4
#define C_TEXT     0x222222
#define C_FAINT    0x666666
#define C_CAPACITY 0xD62728
#define C_COST     0x3C5AA0
#define C_MEAN     0x000000

/* 16 well separated colours; neighbouring sequences never share one */
static const uint32_t palette[16] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f,
                                     0xbcbd22, 0x17becf, 0x393b79, 0x637939, 0x8c6d31, 0x843c39, 0x7b4173, 0x5254a3};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static maskpack_status
fail(maskpack_error *err, maskpack_status status, const char *fmt, ...) {
    if (err) {
        memset(err, 0, sizeof *err);
        err->status = status;
        for (int i = 0; i < 4; i++) err->index[i] = -1;
        snprintf(err->argument, sizeof err->argument, "png");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

static uint32_t hash_seq(int64_t s) {
    uint64_t x = (uint64_t)s * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 40);
}

static uint32_t lighter(uint32_t c) {
    uint32_t r = (c >> 16) & 255, g = (c >> 8) & 255, b = c & 255;
    return ((r + 2 * 255) / 3) << 16 | ((g + 2 * 255) / 3) << 8 | ((b + 2 * 255) / 3);
}

/* One plan row as BAR_W pixels: each pixel takes the slot covering its centre (sequence colour, its
 * alignment filler lighter, unused columns grey). */
static void row_pixels(const maskpack_plan *p, int64_t row, int64_t capacity, uint8_t *px) {
    size_t cnt = 0;
    maskpack_error e;
    uint32_t *col = mp_alloc_array(BAR_W, sizeof *col);
    if (!col) return;
    for (int x = 0; x < BAR_W; x++) col[x] = C_UNUSED;
    maskpack_plan_piece *pc = NULL;
    if (!maskpack_plan_row(p, row, NULL, 0, &cnt, &e) && cnt > 0 && (pc = mp_alloc_array(cnt, sizeof *pc)) &&
        !maskpack_plan_row(p, row, pc, cnt, &cnt, &e)) {
        int64_t at = 0;
        int prev = -1;
        double scale = (double)BAR_W / (double)capacity;
        for (size_t i = 0; i < cnt; i++) {
            int k = (int)(hash_seq(pc[i].sequence) % 16);
            if (k == prev) k = (k + 1) % 16;
            prev = k;
            uint32_t c = palette[k], pad = lighter(palette[k]);
            int x0 = (int)((double)at * scale + 0.5), x1 = (int)((double)(at + pc[i].slot) * scale + 0.5);
            int xr = (int)((double)(at + pc[i].length) * scale + 0.5);
            if (x1 == x0 && pc[i].slot > 0 && x0 < BAR_W) x1 = x0 + 1; /* tiny sequences stay visible */
            for (int x = x0; x < x1 && x < BAR_W; x++) col[x] = x < xr ? c : pad;
            at += pc[i].slot;
        }
    }
    free(pc);
    for (int x = 0; x < BAR_W; x++) {
        px[3 * x] = (uint8_t)(col[x] >> 16);
        px[3 * x + 1] = (uint8_t)(col[x] >> 8);
        px[3 * x + 2] = (uint8_t)col[x];
    }
    free(col);
}

/* Each piece's sequence number inside its bar, where it fits. */
static void label_row(dw *d, const maskpack_plan *p, int64_t row, int64_t capacity, double x0, double y, double h) {
    size_t cnt = 0;
    maskpack_error e;
    if (maskpack_plan_row(p, row, NULL, 0, &cnt, &e) || cnt == 0 || cnt > BAR_W / 8) return;
    maskpack_plan_piece *pc = mp_alloc_array(cnt, sizeof *pc);
    if (!pc || maskpack_plan_row(p, row, pc, cnt, &cnt, &e)) {
        free(pc);
        return;
    }
    double scale = (double)BAR_W / (double)capacity, at = 0;
    for (size_t i = 0; i < cnt; i++) {
        char t[48];
        double w = (double)pc[i].length * scale;
        snprintf(t, sizeof t, pc[i].offset > 0 ? "seq %lld (rest)" : "seq %lld", (long long)pc[i].sequence);
        if (dw_text_width(t, 9, 0) + 6 > w) snprintf(t, sizeof t, "%lld", (long long)pc[i].sequence);
        if (dw_text_width(t, 9, 0) + 4 <= w)
            dw_text(d, x0 + (at + w / 2), y + h / 2 + 3.2, t, 9, 0xFFFFFF, DW_CENTRE, 0, 0);
        at += (double)pc[i].slot * scale;
    }
    free(pc);
}

static double paragraph(dw *d, double x, double y, double width, const char *text, double size, uint32_t colour,
                        int bold) {
    char *lines[8];
    size_t n = dw_wrap(text, size, bold, width, lines, 8);
    for (size_t i = 0; i < n; i++) {
        dw_text(d, x, y + size + (size + 4) * (double)i, lines[i], size, colour, DW_LEFT, bold, 0);
        free(lines[i]);
    }
    return y + (size + 4) * (double)n;
}

static void swatch(dw *d, double x, double y, uint32_t fill, uint32_t stroke, const char *text, const char *cls) {
    dw_group(d, cls, text);
    dw_rect(d, x, y, 16, 12, fill, stroke, 1);
    dw_text(d, x + 22, y + 10, text, 11, C_TEXT, DW_LEFT, 0, 0);
    dw_group_end(d);
}

maskpack_status mp_cli_plan_png(const char *path, const maskpack_plan *p, const char *source, const char *objective,
                                int64_t max_rows, int64_t *drawn_rows, maskpack_error *err) {
    if (!dw_available())
        return fail(err, MASKPACK_ERR_UNSUPPORTED, "png: nothing written to %s: %s", path, dw_unavailable_reason());
    maskpack_plan_report rep;
    maskpack_status s = maskpack_plan_get_report(p, &rep, err);
    if (s) return s;
    int64_t dp = rep.n_rows / rep.rows_per_rank, mb = rep.rows_per_rank / rep.rows_per_microbatch;
    if (dp > 4096)
        return fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "png: %lld ranks are too many to draw (at most 4096)",
                    (long long)dp);
    /* rows drawn per rank: as many as fit the plot at >= 1 pixel each */
    int64_t per_rank = rep.rows_per_rank;
    if (max_rows > 0 && per_rank > max_rows) per_rank = max_rows;
    int64_t budget = (int64_t)(MAX_PLOT_H / (double)dp) - 3;
    if (budget < 1) budget = 1;
    if (per_rank > budget) per_rank = budget;
    double row_h = floor((MAX_PLOT_H / 3) / (double)(dp * per_rank));
    if (row_h > 16) row_h = 16;
    if (row_h < 1) row_h = 1;
    double rank_gap = dp > 64 ? 1 : 6;

    dw *d = dw_new(100, 100);
    uint8_t *img = mp_alloc_array((size_t)per_rank, BAR_W * 3);
    if (!d || !img) {
        dw_free(d);
        free(img);
        return fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "png: out of memory");
    }
    double width = MARGIN + LEFT + BAR_W + 40 + COST_W + 30 + MARGIN, text_w = width - 2 * MARGIN;
    char line[1024];
    /* title and caption: what was packed, how well it is filled and balanced */
    snprintf(line, sizeof line,
             "Packing plan: %lld sequences into %lld rows of %lld tokens, %lld rank%s x %lld micro-batch%s",
             (long long)rep.n_sequences, (long long)rep.n_rows, (long long)rep.capacity, (long long)dp,
             dp == 1 ? "" : "s", (long long)mb, mb == 1 ? "" : "es");
    double y = MARGIN;
    dw_group(d, "title", line);
    y = paragraph(d, MARGIN, y, text_w, line, 16, 0x000000, 1);
    dw_group_end(d);
    snprintf(line, sizeof line, "from %s; %lld real tokens; rows per rank %lld (%lld per micro-batch)",
             source ? source : "?", (long long)rep.real_tokens, (long long)rep.rows_per_rank,
             (long long)rep.rows_per_microbatch);
    y = paragraph(d, MARGIN, y + 2, text_w, line, 12, C_TEXT, 0);
    snprintf(line, sizeof line,
             "fill: %.2f%% of every row every rank runs is real tokens (%.2f%% of the packed rows; %lld empty row%s "
             "added); imbalance: the heaviest rank's cost is %.4f x the mean (%+.2f%%), cost = %s",
             100.0 * rep.fill_all_rows, 100.0 * rep.fill, (long long)rep.n_empty_rows, rep.n_empty_rows == 1 ? "" : "s",
             1.0 + rep.imbalance, 100.0 * rep.imbalance, objective ? objective : "tokens");
    dw_group(d, "caption", line);
    y = paragraph(d, MARGIN, y, text_w, line, 12, C_TEXT, 1);
    dw_group_end(d);
    if (per_rank < rep.rows_per_rank) {
        snprintf(line, sizeof line, "drawn: the first %lld of the %lld rows of each rank (--png-rows N)",
                 (long long)per_rank, (long long)rep.rows_per_rank);
        y = paragraph(d, MARGIN, y, text_w, line, 12, C_TEXT, 0);
    }
    y += 26;

    /* the plot: rank blocks stacked top to bottom, the cost bars to the right */
    double x0 = MARGIN + LEFT, cx0 = x0 + BAR_W + 40, plot_top = y;
    double max_cost = 0;
    for (int64_t q = 0; q < dp; q++) {
        double c = maskpack_plan_rank_cost(p, q);
        if (c > max_cost) max_cost = c;
    }
    char num[48];
    snprintf(num, sizeof num, "capacity %lld", (long long)rep.capacity);
    dw_text(d, x0 + BAR_W, plot_top - 8, num, 11, C_CAPACITY, DW_RIGHT, 1, 0);
    for (int64_t q = 0; q < dp; q++) {
        double ry = y, rh = (double)per_rank * row_h;
        for (int64_t t = 0; t < per_rank; t++)
            row_pixels(p, q * rep.rows_per_rank + t, rep.capacity, img + (size_t)t * BAR_W * 3);
        char title[64];
        snprintf(title, sizeof title, "rank %lld", (long long)q);
        dw_group(d, "rank", title);
        dw_image(d, x0, ry, BAR_W, rh, BAR_W, (int)per_rank, img);
        if (row_h >= 12)
            for (int64_t t = 0; t < per_rank; t++)
                label_row(d, p, q * rep.rows_per_rank + t, rep.capacity, x0, ry + row_h * (double)t, row_h - 1);
        if (row_h >= 5)
            for (int64_t t = 1; t < per_rank; t++)
                dw_line(d, x0, ry + row_h * (double)t, x0 + BAR_W, ry + row_h * (double)t, 0xFFFFFF, 1, 0);
        /* micro-batch boundaries and names */
        for (int64_t m = 0; m < mb; m++) {
            int64_t first = m * rep.rows_per_microbatch;
            if (first >= per_rank) break;
            int64_t last = first + rep.rows_per_microbatch < per_rank ? first + rep.rows_per_microbatch : per_rank;
            double my0 = ry + row_h * (double)first, my1 = ry + row_h * (double)last;
            if (m > 0) dw_line(d, x0 - 60, my0, x0 + BAR_W, my0, 0x888888, 1.2, 0);
            if (mb > 1 && my1 - my0 >= 11) {
                snprintf(num, sizeof num, "micro-batch %lld", (long long)m);
                dw_text(d, x0 - 6, (my0 + my1) / 2 + 4, num, 10, C_FAINT, DW_RIGHT, 0, 0);
            }
        }
        if (rh >= 11) {
            dw_text(d, x0 - (mb > 1 ? 96 : 6), ry + rh / 2 + 4, title, 11.5, C_TEXT, DW_RIGHT, 1, 0);
        } else if (dp <= 64 || q % (dp / 16) == 0) {
            dw_text(d, x0 - 6, ry + rh / 2 + 3, title, 8, C_TEXT, DW_RIGHT, 0, 0);
        }
        dw_rect(d, x0, ry, BAR_W, rh, DW_NONE, 0x000000, 0.8);
        /* the rank's cost */
        double c = maskpack_plan_rank_cost(p, q), w = max_cost > 0 ? COST_W * c / max_cost : 0;
        dw_rect(d, cx0, ry, w, rh, C_COST, DW_NONE, 0);
        dw_group_end(d);
        y += rh + rank_gap;
    }
    double plot_bottom = y - rank_gap;
    /* capacity line: the end of every row */
    dw_line(d, x0 + BAR_W, plot_top - 4, x0 + BAR_W, plot_bottom + 4, C_CAPACITY, 2, 1);
    /* the mean cost */
    double mean_x = max_cost > 0 ? cx0 + COST_W * rep.rank_cost_mean / max_cost : cx0;
    dw_line(d, mean_x, plot_top - 4, mean_x, plot_bottom + 4, C_MEAN, 1.2, 1);
    dw_short_number(rep.rank_cost_mean, num, sizeof num);
    char label[80];
    snprintf(label, sizeof label, "mean %s", num);
    dw_text(d, mean_x, plot_top - 8, label, 10, C_MEAN, mean_x > cx0 + COST_W / 2 ? DW_RIGHT : DW_LEFT, 1, 0);
    /* the token axis */
    double ay = plot_bottom + 4;
    dw_line(d, x0, ay, x0 + BAR_W, ay, 0x000000, 1, 0);
    char widest[48];
    dw_short_number((double)rep.capacity, widest, sizeof widest);
    double step = dw_nice_step((dw_text_width(widest, 10, 0) + 16) * (double)rep.capacity / BAR_W);
    for (double t = 0; t <= (double)rep.capacity + 1e-9; t += step) {
        double px = x0 + BAR_W * t / (double)rep.capacity;
        if (px > x0 + BAR_W - dw_text_width(widest, 10, 0) && t > 0 && t < (double)rep.capacity) continue;
        dw_line(d, px, ay, px, ay + 4, 0x000000, 1, 0);
        dw_short_number(t, num, sizeof num);
        dw_text(d, px, ay + 15, num, 10, C_FAINT, DW_CENTRE, 0, 0);
    }
    snprintf(line, sizeof line, "tokens in the row (capacity %lld)", (long long)rep.capacity);
    dw_text(d, x0 + BAR_W / 2, ay + 30, line, 11.5, C_TEXT, DW_CENTRE, 1, 0);
    dw_text(d, MARGIN + 4, (plot_top + plot_bottom) / 2, mb > 1 ? "rank / micro-batch / row" : "rank / row", 11.5,
            C_TEXT, DW_CENTRE, 1, 1);
    /* the cost axis */
    dw_line(d, cx0, ay, cx0 + COST_W, ay, 0x000000, 1, 0);
    dw_text(d, cx0, ay + 15, "0", 10, C_FAINT, DW_CENTRE, 0, 0);
    dw_short_number(max_cost, num, sizeof num);
    dw_text(d, cx0 + COST_W, ay + 15, num, 10, C_FAINT, DW_RIGHT, 0, 0);
    snprintf(line, sizeof line, "rank cost (%s)", objective ? objective : "tokens");
    dw_text(d, cx0 + COST_W / 2, ay + 30, line, 11.5, C_TEXT, DW_CENTRE, 1, 0);
    y = ay + 48;

    /* legend */
    dw_text(d, MARGIN, y + 12, "Legend", 13, 0x000000, DW_LEFT, 1, 0);
    y += 20;
    dw_group(d, "legend", "legend");
    for (int k = 0; k < 4; k++) dw_rect(d, MARGIN + 4.0 * k, y, 4, 12, palette[k], DW_NONE, 0);
    swatch(d, MARGIN, y, DW_NONE, 0x000000, "a sequence's tokens (one colour per sequence; neighbours always differ)",
           "legend-sequence");
    swatch(d, MARGIN + 520, y, lighter(palette[0]), DW_NONE,
           "alignment padding: a sequence padded up to the CP/TP multiple", "legend-alignment");
    y += 20;
    swatch(d, MARGIN, y, C_UNUSED, DW_NONE, "unused: the rest of the row's capacity (empty rows are all unused)",
           "legend-unused");
    dw_group(d, "legend-capacity", "capacity line");
    dw_line(d, MARGIN + 520, y + 6, MARGIN + 536, y + 6, C_CAPACITY, 2, 1);
    dw_text(d, MARGIN + 542, y + 10, "capacity line: where every row ends", 11, C_TEXT, DW_LEFT, 0, 0);
    dw_group_end(d);
    y += 20;
    swatch(d, MARGIN, y, C_COST, DW_NONE, "a rank's cost, relative to the heaviest rank", "legend-cost");
    dw_group(d, "legend-mean", "mean line");
    dw_line(d, MARGIN + 520, y + 6, MARGIN + 536, y + 6, C_MEAN, 1.2, 1);
    dw_text(d, MARGIN + 542, y + 10, "mean: the mean cost over ranks (balanced: every bar ends there)", 11, C_TEXT,
            DW_LEFT, 0, 0);
    dw_group_end(d);
    dw_group_end(d);
    y += 20 + MARGIN;
    dw_set_size(d, ceil(width), ceil(y));
    free(img);

    uint8_t *buf = NULL;
    size_t len = 0;
    char why[512];
    if (dw_encode(d, dw_path_is_svg(path), &buf, &len, why, sizeof why)) {
        dw_free(d);
        return fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "png: nothing written to %s: %s", path, why);
    }
    dw_free(d);
    maskpack_status ws = mpio_write_file(path, buf, len, err);
    free(buf);
    if (ws) return ws;
    if (drawn_rows) *drawn_rows = per_rank;
    if (err) {
        memset(err, 0, sizeof *err);
        for (int i = 0; i < 4; i++) err->index[i] = -1;
    }
    return MASKPACK_OK;
}
