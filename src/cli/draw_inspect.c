/* draw_inspect.c: `maskpack inspect --png FILE` (or an .svg): the allowed matrix of each drawn batch row,
 * with a title (the file, the rule, the conventions), row and column numbers, every sequence labelled
 * along both axes, a legend of the colours and every problem of the report marked where it occurs.
 *
 * A row of more than CLI_PICTURE_MAX_CELLS tokens (or --png-block N) is drawn at block resolution:
 * each cell is a block of f x f tokens, classified exactly from the library's block mask (FULL,
 * PARTIAL or empty) of a one-row layout holding that row's sequences. */
#include "cli.h"
#include "draw.h"

#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* one colour per sequence: distinct, fairly saturated, none of them grey or red (red marks problems) */
static const uint32_t palette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0x9467bd, 0x8c564b, 0xe377c2,
                                   0x17becf, 0xbcbd22, 0x005a3c, 0x7846c8, 0xc85a00, 0x3b7dd8};
#define N_PALETTE (sizeof palette / sizeof palette[0])
#define C_MASKED  0xFFFFFF /* same sequence, hidden by the rule */
#define C_OTHER   0xDDDDDD /* another sequence */
#define C_PAD     0x6E6E6E /* padding */
#define C_PROBLEM 0xD62728
#define C_TEXT    0x222222
#define C_FAINT   0x666666
#define C_GRID    0xB0B0B0

#define MARGIN 20.0
#define FONT   11.0

static uint32_t seq_colour(int64_t k) { return palette[(size_t)k % N_PALETTE]; }

/* halfway to white: a block where only some pairs are allowed */
static uint32_t tint(uint32_t c) {
    uint32_t r = (c >> 16) & 255, g = (c >> 8) & 255, b = c & 255;
    r = (r + 2 * 255) / 3, g = (g + 2 * 255) / 3, b = (b + 2 * 255) / 3;
    return r << 16 | g << 8 | b;
}

static void put_rgb(uint8_t *px, uint32_t c) {
    px[0] = (uint8_t)(c >> 16);
    px[1] = (uint8_t)(c >> 8);
    px[2] = (uint8_t)c;
}

/* ---- one batch row's cells ----------------------------------------------------------------------- */

typedef struct row_cells {
    int64_t n_local;       /* sequences of the row */
    int64_t *global;       /* [n_local] their index in the layout */
    maskpack_segment *seg; /* [n_local] (row 0 of the one-row layout) */
    uint8_t *rgb;          /* [Sd * Kd * 3] */
} row_cells;

static void row_cells_free(row_cells *c) {
    free(c->global);
    free(c->seg);
    free(c->rgb);
    memset(c, 0, sizeof *c);
}

/* the lowest and highest sequence present in each block of f tokens ([-1, -1]: padding only) */
static void block_ranges(const int64_t *owner, int64_t n, int64_t f, int64_t nb, int64_t *lo, int64_t *hi) {
    for (int64_t q = 0; q < nb; q++) lo[q] = hi[q] = -1;
    for (int64_t t = 0; t < n; t++) {
        int64_t k = owner[t], q = t / f;
        if (k < 0) continue;
        if (lo[q] < 0 || k < lo[q]) lo[q] = k;
        if (k > hi[q]) hi[q] = k;
    }
}

/* Classifies every cell of batch row b at f tokens per cell side. Returns 0 or 1 with why set. */
static int draw_row_cells(const maskpack_layout *L, int64_t b, int64_t f, int64_t Sd, int64_t Kd, row_cells *out,
                          char *why, size_t cap) {
    memset(out, 0, sizeof *out);
    int64_t S = maskpack_layout_q_width(L), K = maskpack_layout_kv_width(L);
    size_t n_all = maskpack_layout_n_segments(L);
    maskpack_rule rule = maskpack_layout_rule(L);
    size_t n = 0;
    for (size_t k = 0; k < n_all; k++) {
        maskpack_segment g;
        maskpack_layout_segment(L, k, &g, NULL);
        n += g.row == b;
    }
    out->global = mp_alloc_array(n ? n : 1, sizeof *out->global);
    out->seg = mp_alloc_array(n ? n : 1, sizeof *out->seg);
    int64_t *prefix = rule.prefix ? mp_alloc_array(n ? n : 1, sizeof *prefix) : NULL;
    maskpack_span *spans = rule.n_spans ? mp_alloc_array(rule.n_spans, sizeof *spans) : NULL;
    int64_t *qown = mp_alloc_array((size_t)S, sizeof *qown), *kown = mp_alloc_array((size_t)K, sizeof *kown);
    int64_t *qlo = mp_alloc_array((size_t)Sd, sizeof *qlo), *qhi = mp_alloc_array((size_t)Sd, sizeof *qhi);
    int64_t *klo = mp_alloc_array((size_t)Kd, sizeof *klo), *khi = mp_alloc_array((size_t)Kd, sizeof *khi);
    uint8_t *status = mp_calloc_array((size_t)Sd, (size_t)Kd);
    out->rgb = mp_alloc_array((size_t)Sd, (size_t)Kd * 3);
    maskpack_layout *one = NULL;
    maskpack_block_mask_arrays bm;
    memset(&bm, 0, sizeof bm);
    int rc = 1;
    if (!out->global || !out->seg || (rule.prefix && !prefix) || (rule.n_spans && !spans) || !qown || !kown || !qlo ||
        !qhi || !klo || !khi || !status || !out->rgb) {
        snprintf(why, cap, "out of memory");
        goto done;
    }
    /* the row's sequences as a one-row layout with the same rule (spans and prefixes renumbered) */
    size_t n_spans = 0;
    for (size_t k = 0; k < n_all; k++) {
        maskpack_segment g;
        maskpack_layout_segment(L, k, &g, NULL);
        if (g.row != b) continue;
        size_t j = (size_t)out->n_local++;
        out->global[j] = (int64_t)k;
        g.row = 0;
        out->seg[j] = g;
        if (prefix) prefix[j] = rule.prefix[k];
        for (size_t s = 0; s < rule.n_spans; s++)
            if (rule.spans[s].segment == (int64_t)k) {
                spans[n_spans] = rule.spans[s];
                spans[n_spans++].segment = (int64_t)j;
            }
    }
    maskpack_rule r1 = rule;
    r1.prefix = prefix;
    r1.n_prefix = prefix ? n : 0;
    r1.spans = spans;
    r1.n_spans = n_spans;
    maskpack_error e;
    if (maskpack_layout_from_segments(out->seg, n, 1, S, K, 0, &r1, &one, &e)) {
        snprintf(why, cap, "row %lld: %s", (long long)b, e.message);
        goto done;
    }
    /* FULL / PARTIAL blocks of the row, exactly (time proportional to the blocks touched) */
    int64_t qb = 0, kb = 0;
    if (maskpack_block_mask_dims(one, f, f, &qb, &kb, &e) || qb != Sd || kb != Kd) {
        snprintf(why, cap, "row %lld: block mask dimensions: %s", (long long)b, e.message);
        goto done;
    }
    size_t cells = (size_t)Sd * (size_t)Kd;
    bm.kv_num_blocks = mp_alloc_array((size_t)Sd, sizeof(int32_t));
    bm.kv_indices = mp_alloc_array(cells, sizeof(int32_t));
    bm.full_kv_num_blocks = mp_alloc_array((size_t)Sd, sizeof(int32_t));
    bm.full_kv_indices = mp_alloc_array(cells, sizeof(int32_t));
    if (!bm.kv_num_blocks || !bm.kv_indices || !bm.full_kv_num_blocks || !bm.full_kv_indices) {
        snprintf(why, cap, "out of memory");
        goto done;
    }
    if (maskpack_block_mask(one, f, f, &bm, &e)) {
        snprintf(why, cap, "row %lld: block mask: %s", (long long)b, e.message);
        goto done;
    }
    for (int64_t q = 0; q < Sd; q++) {
        for (int32_t i = 0; i < bm.kv_num_blocks[q]; i++)
            status[(size_t)q * (size_t)Kd + (size_t)bm.kv_indices[q * Kd + i]] = 1;
        for (int32_t i = 0; i < bm.full_kv_num_blocks[q]; i++)
            status[(size_t)q * (size_t)Kd + (size_t)bm.full_kv_indices[q * Kd + i]] = 2;
    }
    /* which sequence owns each query and key token */
    for (int64_t t = 0; t < S; t++) qown[t] = -1;
    for (int64_t t = 0; t < K; t++) kown[t] = -1;
    for (int64_t j = 0; j < out->n_local; j++) {
        const maskpack_segment *g = &out->seg[j];
        for (int64_t t = g->q_start; t < g->q_start + g->q_len && t < S; t++) qown[t] = j;
        for (int64_t t = g->kv_start; t < g->kv_start + g->kv_len && t < K; t++) kown[t] = j;
    }
    block_ranges(qown, S, f, Sd, qlo, qhi);
    block_ranges(kown, K, f, Kd, klo, khi);
    for (int64_t q = 0; q < Sd; q++)
        for (int64_t k = 0; k < Kd; k++) {
            int st = status[(size_t)q * (size_t)Kd + (size_t)k];
            int64_t c = qlo[q] > klo[k] ? qlo[q] : klo[k], top = qhi[q] < khi[k] ? qhi[q] : khi[k];
            if (qlo[q] < 0 || klo[k] < 0 || c > top) c = -1; /* no sequence in both blocks */
            uint32_t colour;
            if (st && c < 0) c = qlo[q] >= 0 ? qlo[q] : 0;
            if (st == 2)
                colour = seq_colour(out->global[c]);
            else if (st == 1)
                colour = tint(seq_colour(out->global[c]));
            else if (c >= 0)
                colour = C_MASKED;
            else if (qlo[q] >= 0 && klo[k] >= 0)
                colour = C_OTHER;
            else
                colour = C_PAD;
            put_rgb(out->rgb + ((size_t)q * (size_t)Kd + (size_t)k) * 3, colour);
        }
    rc = 0;
done:
    maskpack_layout_free(one);
    free(bm.kv_num_blocks);
    free(bm.kv_indices);
    free(bm.full_kv_num_blocks);
    free(bm.full_kv_indices);
    free(prefix);
    free(spans);
    free(qown);
    free(kown);
    free(qlo);
    free(qhi);
    free(klo);
    free(khi);
    free(status);
    if (rc) row_cells_free(out);
    return rc;
}

/* ---- the picture ------------------------------------------------------------------------------------ */

typedef struct geometry {
    int64_t S, K, f, Sd, Kd;
    double z;         /* pixels per cell */
    double left, top; /* gutters inside a panel */
    double pw, ph;    /* panel size */
    double tick_w;    /* widest tick label */
} geometry;

#define BAND 15.0 /* the coloured band naming the sequences along each axis */
#define HEAD 34.0 /* the panel's heading: two lines */

/* tick labels every `step` tokens so that labels never overlap */
static int64_t tick_step(const geometry *g, double label_px) {
    double px_per_token = g->z / (double)g->f;
    double least = (label_px + 6.0) / px_per_token;
    int64_t step = (int64_t)dw_nice_step(least < 1 ? 1 : least);
    return step < 1 ? 1 : step;
}

static void draw_band(dw *d, const row_cells *c, int64_t n_tokens, const geometry *g, double x0, double y0,
                      int vertical, int kv) {
    /* padding first, then each sequence over it */
    double len = (double)n_tokens / (double)g->f * g->z;
    if (vertical)
        dw_rect(d, x0, y0, BAND, len, C_PAD, DW_NONE, 0);
    else
        dw_rect(d, x0, y0, len, BAND, C_PAD, DW_NONE, 0);
    for (int64_t j = 0; j < c->n_local; j++) {
        const maskpack_segment *s = &c->seg[j];
        int64_t a = kv ? s->kv_start : s->q_start, n = kv ? s->kv_len : s->q_len;
        double p0 = (double)a / (double)g->f * g->z, p1 = (double)(a + n) / (double)g->f * g->z;
        if (p1 - p0 < 1) p1 = p0 + 1;
        uint32_t col = seq_colour(c->global[j]);
        char label[48], shortl[24];
        snprintf(label, sizeof label, "seq %lld", (long long)c->global[j]);
        snprintf(shortl, sizeof shortl, "%lld", (long long)c->global[j]);
        const char *text = dw_text_width(label, 10, 1) + 4 <= p1 - p0    ? label
                           : dw_text_width(shortl, 10, 1) + 2 <= p1 - p0 ? shortl
                                                                         : NULL;
        char title[96];
        snprintf(title, sizeof title, "sequence %lld: %s tokens %lld to %lld", (long long)c->global[j],
                 kv ? "key" : "query", (long long)a, (long long)(a + n - 1));
        dw_group(d, "sequence-label", title);
        if (vertical) {
            dw_rect(d, x0, y0 + p0, BAND, p1 - p0, col, 0xFFFFFF, 0.8);
            if (text) dw_text(d, x0 + BAND - 4, y0 + (p0 + p1) / 2, text, 10, 0xFFFFFF, DW_CENTRE, 1, 1);
        } else {
            dw_rect(d, x0 + p0, y0, p1 - p0, BAND, col, 0xFFFFFF, 0.8);
            if (text) dw_text(d, x0 + (p0 + p1) / 2, y0 + BAND - 4, text, 10, 0xFFFFFF, DW_CENTRE, 1, 0);
        }
        dw_group_end(d);
    }
}

/* "seq 1 to 2: 13 tokens + 3 padding" for batch row b */
static void row_summary(const maskpack_layout *L, int64_t b, char *buf, size_t cap) {
    size_t n_all = maskpack_layout_n_segments(L);
    int64_t first = -1, last = -1, real = 0, S = maskpack_layout_q_width(L);
    for (size_t k = 0; k < n_all; k++) {
        maskpack_segment g;
        maskpack_layout_segment(L, k, &g, NULL);
        if (g.row != b) continue;
        if (first < 0) first = (int64_t)k;
        last = (int64_t)k;
        real += g.q_len;
    }
    if (first < 0)
        snprintf(buf, cap, "padding only (%lld tokens)", (long long)S);
    else if (first == last)
        snprintf(buf, cap, "seq %lld: %lld tokens + %lld padding", (long long)first, (long long)real,
                 (long long)(S - real));
    else
        snprintf(buf, cap, "seq %lld to %lld: %lld tokens + %lld padding", (long long)first, (long long)last,
                 (long long)real, (long long)(S - real));
}

static void draw_panel(dw *d, const cli_report *r, const row_cells *c, int64_t b, const geometry *g, double x,
                       double y) {
    double mx = x + g->left, my = y + g->top; /* the matrix's corner */
    double mw = (double)g->Kd * g->z, mh = (double)g->Sd * g->z;
    /* heading: the row, then what it holds */
    char head[160];
    snprintf(head, sizeof head, "batch row %lld", (long long)b);
    dw_text(d, x, y + 13, head, 12.5, C_TEXT, DW_LEFT, 1, 0);
    row_summary(r->layout, b, head, sizeof head);
    dw_text(d, x, y + 28, head, 11, C_TEXT, DW_LEFT, 0, 0);
    /* axis titles */
    dw_text(d, mx + mw / 2, y + HEAD + 12, g->f > 1 ? "key tokens (columns, by block)" : "key token (column)", FONT,
            C_FAINT, DW_CENTRE, 0, 0);
    dw_text(d, x + 12, my + mh / 2, g->f > 1 ? "query tokens (rows, by block)" : "query token (row)", FONT, C_FAINT,
            DW_CENTRE, 0, 1);
    /* sequence bands */
    draw_band(d, c, g->K, g, mx, my - BAND - 2, 0, 1);
    draw_band(d, c, g->S, g, mx - BAND - 2, my, 1, 0);
    /* the cells */
    dw_image(d, mx, my, mw, mh, (int)g->Kd, (int)g->Sd, c->rgb);
    if (g->z >= 10) { /* cell borders when cells are large enough to count */
        for (int64_t k = 0; k <= g->Kd; k++)
            dw_line(d, mx + (double)k * g->z, my, mx + (double)k * g->z, my + mh, C_GRID, 0.5, 0);
        for (int64_t q = 0; q <= g->Sd; q++)
            dw_line(d, mx, my + (double)q * g->z, mx + mw, my + (double)q * g->z, C_GRID, 0.5, 0);
    }
    dw_rect(d, mx, my, mw, mh, DW_NONE, 0x000000, 1);
    /* tick numbers: tokens (cell centres), or the first token of a block (block edges) */
    int64_t step = tick_step(g, g->tick_w);
    char num[32];
    for (int64_t t = 0; t < g->K; t += step) {
        double px = g->f > 1 ? (double)t / (double)g->f * g->z : ((double)t + 0.5) * g->z;
        snprintf(num, sizeof num, "%lld", (long long)t);
        dw_line(d, mx + px, my - BAND - 2, mx + px, my - BAND - 6, C_FAINT, 0.8, 0);
        dw_text(d, mx + px, my - BAND - 8, num, 9.5, C_FAINT, DW_CENTRE, 0, 0);
    }
    int64_t vstep = tick_step(g, 10);
    for (int64_t t = 0; t < g->S; t += vstep) {
        double py = g->f > 1 ? (double)t / (double)g->f * g->z : ((double)t + 0.5) * g->z;
        snprintf(num, sizeof num, "%lld", (long long)t);
        dw_line(d, mx - BAND - 2, my + py, mx - BAND - 6, my + py, C_FAINT, 0.8, 0);
        dw_text(d, mx - BAND - 8, my + py + 3.5, num, 9.5, C_FAINT, DW_RIGHT, 0, 0);
    }
    /* the problems of this row, where they occur: the token's cell on the diagonal, its column and row */
    for (size_t i = 0; i < r->n_problems; i++) {
        if (r->problem_row[i] != b || r->problem_col[i] < 0) continue;
        size_t before = 0; /* earlier markers at the same column: this badge goes beside them */
        for (size_t k = 0; k < i; k++) before += r->problem_row[k] == b && r->problem_col[k] == r->problem_col[i];
        int64_t col = r->problem_col[i];
        if (col >= g->S && col >= g->K) continue;
        char title[1100], badge[24];
        snprintf(title, sizeof title, "problem %zu: %s", i + 1, r->problems[i]);
        snprintf(badge, sizeof badge, "%zu", i + 1);
        double cx = (double)(col / g->f) * g->z, cw = g->z < 6 ? 6 : g->z;
        double off = (cw - g->z) / 2;
        dw_group(d, "problem-marker", title);
        dw_rect(d, mx + cx - off, my + cx - off, cw, cw, DW_NONE, C_PROBLEM, 2.2);
        dw_line(d, mx + cx + g->z / 2, my, mx + cx + g->z / 2, my + mh, C_PROBLEM, 1, 1);
        dw_line(d, mx, my + cx + g->z / 2, mx + mw, my + cx + g->z / 2, C_PROBLEM, 1, 1);
        double bx = mx + cx + g->z / 2, by = my + mh + 11;
        double tri[6] = {bx, my + mh + 1, bx - 5, by - 2, bx + 5, by - 2};
        dw_path(d, tri, 3, 1, C_PROBLEM, DW_NONE, 0);
        double bw = dw_text_width(badge, 10, 1) + 8;
        by += (double)before * 16; /* beneath the earlier ones */
        dw_rect(d, bx - bw / 2, by - 2, bw, 14, C_PROBLEM, DW_NONE, 0);
        dw_text(d, bx, by + 8.5, badge, 10, 0xFFFFFF, DW_CENTRE, 1, 0);
        dw_group_end(d);
    }
}

/* A legend entry: a swatch and a description wrapped to width. Returns the new y. */
static double legend_item(dw *d, double x, double y, double width, uint32_t swatch, uint32_t border, const char *what,
                          const char *cls) {
    char *lines[6];
    size_t n = dw_wrap(what, FONT, 0, width - 28, lines, 6);
    dw_group(d, cls, what);
    dw_rect(d, x, y, 16, 14, swatch, border, 1);
    for (size_t i = 0; i < n; i++) {
        dw_text(d, x + 24, y + 11 + 14 * (double)i, lines[i], FONT, C_TEXT, DW_LEFT, 0, 0);
        free(lines[i]);
    }
    dw_group_end(d);
    return y + 14 * (double)(n ? n : 1) + 6;
}

static double paragraph(dw *d, double x, double y, double width, const char *text, double size, uint32_t colour,
                        int bold) {
    char *lines[12];
    size_t n = dw_wrap(text, size, bold, width, lines, 12);
    for (size_t i = 0; i < n; i++) {
        dw_text(d, x, y + size + (size + 4) * (double)i, lines[i], size, colour, DW_LEFT, bold, 0);
        free(lines[i]);
    }
    return y + (size + 4) * (double)n;
}

int cli_draw_inspect(const cli_options *o, const cli_report *r, const int64_t *rows, size_t n_rows, char *why,
                     size_t cap) {
    const maskpack_layout *L = r->layout;
    if (!dw_available()) {
        snprintf(why, cap, "%s", dw_unavailable_reason());
        return 1;
    }
    geometry g;
    memset(&g, 0, sizeof g);
    g.S = maskpack_layout_q_width(L);
    g.K = maskpack_layout_kv_width(L);
    int64_t B = maskpack_layout_n_rows(L);
    for (size_t i = 0; i < n_rows; i++)
        if (rows[i] < 0 || rows[i] >= B) {
            snprintf(why, cap, "--png-rows: row %lld is not a row of this batch (it has rows 0 to %lld)",
                     (long long)rows[i], (long long)B - 1);
            return 1;
        }
    if (n_rows == 0 || g.S == 0 || g.K == 0) {
        snprintf(why, cap, "nothing to draw: the batch has %lld rows of %lld tokens", (long long)B, (long long)g.S);
        return 1;
    }
    int64_t side = g.S > g.K ? g.S : g.K;
    if (o->png_block > 0) {
        g.f = o->png_block;
    } else {
        g.f = 1;
        while ((side + g.f - 1) / g.f > CLI_PICTURE_MAX_CELLS) g.f *= 2;
    }
    g.Sd = (g.S + g.f - 1) / g.f;
    g.Kd = (g.K + g.f - 1) / g.f;
    if (g.Sd > 4 * CLI_PICTURE_MAX_CELLS || g.Kd > 4 * CLI_PICTURE_MAX_CELLS) {
        snprintf(why, cap,
                 "--png-block %lld leaves %lld x %lld cells per row, more than %d a side; use a block of at "
                 "least %lld tokens",
                 (long long)g.f, (long long)g.Sd, (long long)g.Kd, 4 * CLI_PICTURE_MAX_CELLS,
                 (long long)((side + 4 * CLI_PICTURE_MAX_CELLS - 1) / (4 * CLI_PICTURE_MAX_CELLS)));
        return 1;
    }
    int64_t cells = g.Sd > g.Kd ? g.Sd : g.Kd;
    g.z = o->png_zoom > 0 ? o->png_zoom : floor(400.0 / (double)cells);
    if (g.z < 1) g.z = 1;
    if (g.z > 32) g.z = 32;
    char widest[32];
    snprintf(widest, sizeof widest, "%lld", (long long)(side - 1));
    g.tick_w = dw_text_width(widest, 9.5, 0);
    g.left = 18 + g.tick_w + 10 + BAND + 2;
    g.top = HEAD + 16 + 14 + BAND + 4;
    g.pw = g.left + (double)g.Kd * g.z + 24;
    for (size_t i = 0; i < n_rows; i++) { /* wide enough for every heading */
        char head[160];
        row_summary(L, rows[i], head, sizeof head);
        double w = dw_text_width(head, 11, 0) + 20;
        if (w > g.pw) g.pw = w;
    }
    size_t stack = 1; /* the most problem badges under one column */
    for (size_t i = 0; i < r->n_problems; i++) {
        size_t same = 0;
        for (size_t k = 0; k < r->n_problems; k++)
            same += r->problem_col[i] >= 0 && r->problem_row[k] == r->problem_row[i] &&
                    r->problem_col[k] == r->problem_col[i];
        if (same > stack) stack = same;
    }
    g.ph = g.top + (double)g.Sd * g.z + 14 + 16 * (double)stack;
    size_t ncols = (size_t)floor(1500.0 / g.pw);
    if (ncols < 1) ncols = 1;
    if (ncols > n_rows) ncols = n_rows;
    size_t nlines = (n_rows + ncols - 1) / ncols;

    dw *d = dw_new(100, 100);
    if (!d) {
        snprintf(why, cap, "out of memory");
        return 1;
    }
    double width = MARGIN * 2 + g.pw * (double)ncols;
    if (width < 880) width = 880;
    double text_w = width - 2 * MARGIN;
    /* title: what is drawn, from which file, under which rule and conventions */
    char line[1200];
    snprintf(line, sizeof line, "Which keys each query attends to: %s", r->origin ? r->origin : "?");
    double y = MARGIN;
    dw_group(d, "title", line);
    y = paragraph(d, MARGIN, y, text_w, line, 17, 0x000000, 1);
    dw_group_end(d);
    char rule[256];
    cli_rule_text(rule, sizeof rule, L);
    size_t used = (size_t)snprintf(line, sizeof line, "rule: %s (from %s); read as:", rule,
                                   r->rule_origin ? r->rule_origin : "default");
    for (size_t k = 0; k < r->n_sources && used < sizeof line; k++)
        used += (size_t)snprintf(line + used, sizeof line - used, "%s %s (%s)", k ? "," : "", r->sources[k].name,
                                 r->sources[k].how);
    y = paragraph(d, MARGIN, y + 4, text_w, line, 12, C_TEXT, 0);
    int64_t n_tokens = maskpack_layout_n_tokens(L);
    size_t n_seq = maskpack_layout_n_segments(L);
    if (r->packed)
        used = (size_t)snprintf(line, sizeof line, "one packed row of %lld tokens", (long long)g.S);
    else
        used = (size_t)snprintf(line, sizeof line, "%lld row%s x %lld tokens", (long long)B, B == 1 ? "" : "s",
                                (long long)g.S);
    used += (size_t)snprintf(line + used, sizeof line - used, "; %zu sequence%s, %lld real tokens, %lld padding; ",
                             n_seq, n_seq == 1 ? "" : "s", (long long)n_tokens, (long long)(B * g.S - n_tokens));
    if (g.f > 1)
        snprintf(line + used, sizeof line - used,
                 "each cell is a block of %lld x %lld tokens (%lld query tokens down, %lld key tokens across)",
                 (long long)g.f, (long long)g.f, (long long)g.f, (long long)g.f);
    else
        snprintf(line + used, sizeof line - used, "each cell is one query token (row) and one key token (column)");
    y = paragraph(d, MARGIN, y, text_w, line, 12, C_TEXT, 0);
    if ((int64_t)n_rows < B) {
        snprintf(line, sizeof line, "drawn: %zu of the %lld batch rows (--png-rows chooses which)", n_rows,
                 (long long)B);
        y = paragraph(d, MARGIN, y, text_w, line, 12, C_TEXT, 0);
    }
    y += 10;

    /* the panels */
    int rc = 0;
    for (size_t i = 0; i < n_rows && !rc; i++) {
        row_cells c;
        if (draw_row_cells(L, rows[i], g.f, g.Sd, g.Kd, &c, why, cap)) {
            rc = 1;
            break;
        }
        double px = MARGIN + g.pw * (double)(i % ncols), py = y + g.ph * (double)(i / ncols);
        char title[64];
        snprintf(title, sizeof title, "batch row %lld", (long long)rows[i]);
        dw_group(d, "panel", title);
        draw_panel(d, r, &c, rows[i], &g, px, py);
        dw_group_end(d);
        row_cells_free(&c);
    }
    y += g.ph * (double)nlines + 4;

    /* legend */
    double lx = MARGIN;
    dw_text(d, lx, y + 13, "Legend", 13, 0x000000, DW_LEFT, 1, 0);
    y += 22;
    dw_group(d, "legend", "legend");
    /* the first swatch shows the sequence colours side by side */
    for (int k = 0; k < 4; k++) dw_rect(d, lx + 4.0 * k, y, 4, 14, palette[k], DW_NONE, 0);
    y = legend_item(d, lx, y, text_w, DW_NONE, 0x000000,
                    g.f > 1
                        ? "allowed: every query of the block attends to every key of the block (one colour per "
                          "sequence, as in the bands along the axes)"
                        : "allowed: the query (row) attends to the key (column); one colour per sequence, as in the "
                          "bands along the axes",
                    "legend-allowed");
    if (g.f > 1)
        y = legend_item(d, lx, y, text_w, tint(palette[0]), DW_NONE,
                        "partly allowed: the block holds allowed pairs and pairs that are not", "legend-partly");
    y = legend_item(d, lx, y, text_w, C_MASKED, 0x000000,
                    "masked by the rule: same sequence, but the rule hides the key (a later token under a causal "
                    "rule, or outside the window)",
                    "legend-masked");
    y = legend_item(d, lx, y, text_w, C_OTHER, DW_NONE,
                    "another sequence: query and key belong to different sequences packed in the same row; never "
                    "attended",
                    "legend-other");
    y = legend_item(d, lx, y, text_w, C_PAD, DW_NONE,
                    "padding: the query or the key is a pad token (in no sequence): never attends, never attended",
                    "legend-padding");
    y = legend_item(d, lx, y, text_w, DW_NONE, C_PROBLEM,
                    "red: a problem of the report, at the token where it occurs (its cell on the diagonal, with its "
                    "row and column dashed), numbered as in the list below",
                    "legend-problem");
    if (g.f > 1) {
        snprintf(line, sizeof line,
                 "block size: %lld tokens (more than %d tokens a side are drawn in blocks; --png-block N chooses N)",
                 (long long)g.f, CLI_PICTURE_MAX_CELLS);
        y = paragraph(d, lx, y, text_w, line, FONT, C_TEXT, 0);
    }
    dw_group_end(d);

    /* problems, numbered as the markers */
    y += 8;
    if (r->n_problems_total == 0) {
        y = paragraph(d, lx, y, text_w, "Problems: none (every input agrees with the others)", 13, 0x000000, 1);
    } else {
        snprintf(line, sizeof line, "Problems (%zu), numbered as their markers:", r->n_problems_total);
        y = paragraph(d, lx, y, text_w, line, 13, C_PROBLEM, 1);
        for (size_t i = 0; i < r->n_problems; i++) {
            int64_t pr = r->problem_row[i];
            int drawn = 0;
            for (size_t k = 0; k < n_rows; k++) drawn |= rows[k] == pr;
            const char *where = pr < 0                  ? " (not tied to a token: not marked)"
                                : !drawn                ? " (its row is not drawn)"
                                : r->problem_col[i] < 0 ? " (row not marked)"
                                                        : "";
            char title[32];
            snprintf(title, sizeof title, "problem %zu", i + 1);
            dw_group(d, "problem", title);
            snprintf(line, sizeof line, "%zu. %s%s", i + 1, r->problems[i], where);
            y = paragraph(d, lx + 8, y + 2, text_w - 8, line, FONT, C_TEXT, 0);
            dw_group_end(d);
        }
        if (r->n_problems_total > r->n_problems) {
            snprintf(line, sizeof line, "... and %zu more (not listed)", r->n_problems_total - r->n_problems);
            y = paragraph(d, lx + 8, y + 2, text_w - 8, line, FONT, C_TEXT, 0);
        }
    }
    y += MARGIN;
    dw_set_size(d, ceil(width), ceil(y));

    uint8_t *buf = NULL;
    size_t len = 0;
    if (!rc) rc = dw_encode(d, o->png_svg || dw_path_is_svg(o->png), &buf, &len, why, cap);
    dw_free(d);
    if (!rc) {
        maskpack_error e;
        if (mpio_write_file(o->png, buf, len, &e)) {
            snprintf(why, cap, "%s", e.message);
            rc = 1;
        }
    }
    free(buf);
    return rc;
}
