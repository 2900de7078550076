/* plan_png.c: a picture of a packing plan, so its fill and balance can be seen at a glance. */
#include "plan_cmd.h"
#include "internal.h"
#include "io.h"

#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BAR_W = 1000, GAP_W = 12, COST_W = 220, IMG_W = BAR_W + GAP_W + COST_W, MAX_H = 8192 };

typedef struct rgb {
    uint8_t r, g, b;
} rgb;

/* 16 well separated colours (qualitative palette by our own choice). */
static const rgb palette[16] = {
    {31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},  {148, 103, 189}, {140, 86, 75},
    {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}, {57, 59, 121},  {99, 121, 57},
    {140, 109, 49},  {132, 60, 57},  {123, 65, 115},  {82, 84, 163},
};

static const rgb white = {255, 255, 255}, unused = {228, 228, 228}, black = {0, 0, 0}, mb_line = {170, 170, 170},
                 cost_bar = {60, 90, 160}, mean_tick = {0, 0, 0};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static maskpack_status fail(maskpack_error *err, maskpack_status status, const char *fmt, ...) {
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

static rgb lighter(rgb c) { return (rgb){(uint8_t)((c.r + 2 * 255) / 3), (uint8_t)((c.g + 2 * 255) / 3), (uint8_t)((c.b + 2 * 255) / 3)}; }

static void put(uint8_t *img, int64_t y, int64_t x, rgb c) {
    uint8_t *p = img + ((size_t)y * IMG_W + (size_t)x) * 3;
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
}

static void hline(uint8_t *img, int64_t y, int64_t x0, int64_t x1, rgb c) {
    for (int64_t x = x0; x < x1; x++) put(img, y, x, c);
}

/* Colours of one plan row as BAR_W pixels: each pixel takes the slot covering its centre. */
static void row_pixels(const maskpack_plan *p, int64_t row, int64_t capacity, rgb *px) {
    size_t cnt = 0;
    maskpack_error e;
    for (int x = 0; x < BAR_W; x++) px[x] = unused;
    if (maskpack_plan_row(p, row, NULL, 0, &cnt, &e) || cnt == 0) return;
    maskpack_plan_piece *pc = mp_alloc_array(cnt, sizeof *pc);
    if (!pc || maskpack_plan_row(p, row, pc, cnt, &cnt, &e)) {
        free(pc);
        return;
    }
    int64_t col = 0;
    int prev = -1;
    for (size_t i = 0; i < cnt; i++) {
        int k = (int)(hash_seq(pc[i].sequence) % 16);
        if (k == prev) k = (k + 1) % 16; /* neighbours never share a colour */
        prev = k;
        rgb c = palette[k], pad = lighter(palette[k]);
        /* pixels whose centre (x + 0.5) * capacity / BAR_W falls in [col, col + slot) */
        double scale = (double)BAR_W / (double)capacity;
        int x0 = (int)((double)col * scale + 0.5), x1 = (int)((double)(col + pc[i].slot) * scale + 0.5);
        int xr = (int)((double)(col + pc[i].length) * scale + 0.5);
        if (x1 == x0 && pc[i].slot > 0 && x0 < BAR_W) x1 = x0 + 1; /* keep tiny sequences visible */
        for (int x = x0; x < x1 && x < BAR_W; x++) px[x] = x < xr ? c : pad;
        col += pc[i].slot;
    }
    free(pc);
}

maskpack_status mp_cli_plan_png(const char *path, const maskpack_plan *p, int64_t max_rows, int64_t *drawn_rows,
                                maskpack_error *err) {
    maskpack_plan_report rep;
    maskpack_status s = maskpack_plan_get_report(p, &rep, err);
    if (s) return s;
    int64_t dp = rep.n_rows / rep.rows_per_rank, mb = rep.rows_per_rank / rep.rows_per_microbatch;
    /* rows drawn per rank: as many as fit MAX_H pixel rows at >= 1 pixel each */
    int64_t budget = (MAX_H - 4 * dp) / dp;
    if (budget < 1) budget = 1;
    int64_t per_rank = rep.rows_per_rank;
    if (max_rows > 0 && per_rank > max_rows) per_rank = max_rows;
    if (per_rank > budget) per_rank = budget;
    int64_t row_h = (MAX_H / 2) / (dp * per_rank);
    if (row_h > 14) row_h = 14;
    if (row_h < 1) row_h = 1;
    int64_t gap = row_h >= 5 ? 1 : 0;  /* a white line between rows when there is room */
    int64_t sep = 2;                   /* black rank separator */
    int64_t height = sep;
    for (int64_t q = 0; q < dp; q++) height += per_rank * row_h + sep;
    if (dp > MAX_H / 2)
        return fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "png: %lld ranks are too many to draw (at most %d)",
                    (long long)dp, MAX_H / 2);
    uint8_t *img = mp_alloc_array((size_t)height, IMG_W * 3);
    rgb *px = mp_alloc_array(BAR_W, sizeof *px);
    if (!img || !px) {
        free(img);
        free(px);
        return fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "png: out of memory for a %d x %lld image", IMG_W,
                    (long long)height);
    }
    memset(img, 255, (size_t)height * IMG_W * 3);
    double max_cost = 0, mean_cost = rep.rank_cost_mean;
    for (int64_t q = 0; q < dp; q++) {
        double c = maskpack_plan_rank_cost(p, q);
        if (c > max_cost) max_cost = c;
    }
    int64_t y = 0;
    for (int64_t t = 0; t < sep; t++, y++) hline(img, y, 0, IMG_W, black);
    for (int64_t q = 0; q < dp; q++) {
        int64_t y_rank = y;
        for (int64_t t = 0; t < per_rank; t++) {
            int64_t row = q * rep.rows_per_rank + t;
            row_pixels(p, row, rep.capacity, px);
            for (int64_t h = 0; h < row_h; h++, y++) {
                if (gap && h == row_h - 1) {
                    /* the last line of a row: a micro-batch boundary is drawn grey, others white */
                    int boundary = mb > 1 && (t + 1) % rep.rows_per_microbatch == 0 && t + 1 < per_rank;
                    hline(img, y, 0, BAR_W, boundary ? mb_line : white);
                    continue;
                }
                for (int x = 0; x < BAR_W; x++) put(img, y, x, px[x]);
            }
            if (!gap && mb > 1 && (t + 1) % rep.rows_per_microbatch == 0 && t + 1 < per_rank)
                hline(img, y - 1, 0, BAR_W, mb_line);
        }
        /* the rank's cost bar, over the rank's full height */
        double c = maskpack_plan_rank_cost(p, q);
        int64_t w = max_cost > 0 ? (int64_t)((double)COST_W * c / max_cost + 0.5) : 0;
        int64_t mean_x = max_cost > 0 ? (int64_t)((double)COST_W * mean_cost / max_cost) : 0;
        if (mean_x >= COST_W) mean_x = COST_W - 1;
        for (int64_t yy = y_rank; yy < y; yy++) {
            hline(img, yy, BAR_W + GAP_W, BAR_W + GAP_W + w, cost_bar);
            put(img, yy, BAR_W + GAP_W + mean_x, mean_tick);
        }
        for (int64_t t = 0; t < sep; t++, y++) hline(img, y, 0, IMG_W, black);
    }
    free(px);

    /* encoded into memory, then written by mpio_write_file: a failed write never destroys what was at path */
    char *encoded = NULL;
    size_t encoded_len = 0;
    FILE *f = open_memstream(&encoded, &encoded_len);
    if (!f) {
        free(img);
        return fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "png: out of memory for a %d x %lld image", IMG_W,
                    (long long)height);
    }
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_bytep *volatile rows = NULL;
    if (!png || !info || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, info ? &info : NULL);
        fclose(f);
        free(encoded);
        free(img);
        free(rows);
        return fail(err, MASKPACK_ERR_IO, "%s: libpng failed to write the image", path);
    }
    rows = mp_alloc_array((size_t)height, sizeof *rows);
    if (!rows) png_error(png, "out of memory");
    for (int64_t r = 0; r < height; r++) rows[r] = img + (size_t)r * IMG_W * 3;
    png_init_io(png, f);
    png_set_IHDR(png, info, IMG_W, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    int close_failed = fclose(f) != 0;
    free(rows);
    free(img);
    if (close_failed) {
        free(encoded);
        return fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "png: out of memory encoding the image");
    }
    maskpack_status ws = mpio_write_file(path, encoded, encoded_len, err);
    free(encoded);
    if (ws) return ws;
    if (drawn_rows) *drawn_rows = per_rank;
    if (err) {
        memset(err, 0, sizeof *err);
        for (int i = 0; i < 4; i++) err->index[i] = -1;
    }
    return MASKPACK_OK;
}
