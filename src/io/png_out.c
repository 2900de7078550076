/* png_out.c: draws a layout's allowed matrix (query rows x key columns) as an RGB PNG.
 *
 * Each drawn batch row is one panel of q_width x kv_width cells, scaled up by an integer zoom so small
 * masks stay visible, or sampled down (every f-th query and key) when the grid is wider than
 * max_side. Panels are stacked vertically with a black separator line. Cell colours come from the
 * reference predicate maskpack_allowed and maskpack_segment_of_query, so the picture shows exactly
 * what every derived output must reproduce. */
#include "io.h"

#include "internal.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>

#define PNG_ARG        "png"
#define PNG_MAX_PIXELS ((uint64_t)64 << 20)
#define PNG_AUTO_SIDE  1024
#define PNG_MAX_ZOOM   32
#define PNG_SEPARATOR  2

/* Distinct, fairly saturated colours so that neighbouring segments differ. */
static const uint8_t palette[][3] = {
    {31, 119, 180},  {255, 127, 14}, {44, 160, 44},  {214, 39, 40}, {148, 103, 189}, {140, 86, 75},
    {227, 119, 194}, {23, 190, 207}, {188, 189, 34}, {0, 90, 60},   {120, 60, 200},  {200, 90, 0},
};
#define N_PALETTE (sizeof palette / sizeof palette[0])
static const uint8_t c_white[3] = {255, 255, 255};
static const uint8_t c_other[3] = {222, 222, 222}; /* two different segments */
static const uint8_t c_pad[3] = {110, 110, 110};   /* padding query row or key column */
static const uint8_t c_sep[3] = {0, 0, 0};

typedef struct membuf {
    uint8_t *p;
    size_t len, cap;
    int failed;
} membuf;

static void write_cb(png_structp png, png_bytep data, png_size_t n) {
    membuf *m = png_get_io_ptr(png);
    if (m->failed) return;
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 65536;
        while (cap < m->len + n) cap *= 2;
        uint8_t *q = realloc(m->p, cap);
        if (!q) {
            m->failed = 1;
            return;
        }
        m->p = q;
        m->cap = cap;
    }
    memcpy(m->p + m->len, data, n);
    m->len += n;
}

static void flush_cb(png_structp png) { (void)png; }

/* libpng reports errors by longjmp; nothing local is modified after setjmp, so no volatile is needed. */
static int encode_rgb(const uint8_t *img, uint32_t w, uint32_t h, membuf *m) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    if (!png) return 0;
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return 0;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return 0;
    }
    png_set_write_fn(png, m, write_cb, flush_cb);
    png_set_IHDR(png, info, w, h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (uint32_t y = 0; y < h; y++) png_write_row(png, (png_const_bytep)(img + (size_t)y * w * 3));
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    return !m->failed;
}

static void put_block(uint8_t *img, uint32_t w, uint32_t x0, uint32_t y0, uint32_t size, const uint8_t *rgb) {
    for (uint32_t y = 0; y < size; y++) {
        uint8_t *px = img + ((size_t)(y0 + y) * w + x0) * 3;
        for (uint32_t x = 0; x < size; x++, px += 3) memcpy(px, rgb, 3);
    }
}

maskpack_status mpio_png_encode_layout(const maskpack_layout *L, const int64_t *rows, size_t n_rows,
                                       const mpio_png_options *options, uint8_t **buf, size_t *len, uint32_t *width,
                                       uint32_t *height, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, buf, "buf");
    MP_CHECK_NULL(err, len, "len");
    if (n_rows) MP_CHECK_NULL(err, rows, "rows");
    int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L), K = maskpack_layout_kv_width(L);
    size_t n_draw = n_rows ? n_rows : (size_t)B;
    for (size_t r = 0; r < n_rows; r++)
        if (rows[r] < 0 || rows[r] >= B)
            return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "rows", (int64_t)r, -1,
                           "rows[%zu]: expected a batch row in [0, %lld), found %lld", r, (long long)B,
                           (long long)rows[r]);
    if (n_draw == 0 || S == 0 || K == 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "layout", -1, -1,
                       "layout: nothing to draw (%lld rows of %lld x %lld cells)", (long long)B, (long long)S,
                       (long long)K);
    int64_t max_side = options && options->max_side > 0 ? options->max_side : 2048;
    int64_t side = S > K ? S : K;
    int64_t f = (side + max_side - 1) / max_side; /* sampling step: every f-th query and key */
    int64_t Sd = (S + f - 1) / f, Kd = (K + f - 1) / f;
    /* sampled grids are drawn one pixel per sample; small ones are enlarged to about PNG_AUTO_SIDE */
    int64_t zoom = options && options->zoom > 0 ? options->zoom : f > 1 ? 1 : PNG_AUTO_SIDE / (Sd > Kd ? Sd : Kd);
    if (zoom < 1) zoom = 1;
    if (zoom > PNG_MAX_ZOOM) zoom = PNG_MAX_ZOOM;
    uint64_t w = (uint64_t)(Kd * zoom), panel = (uint64_t)(Sd * zoom);
    uint64_t h = panel * n_draw + (uint64_t)PNG_SEPARATOR * (n_draw - 1);
    if (n_draw > PNG_MAX_PIXELS || (h && w > PNG_MAX_PIXELS / h) || h > 1000000) /* libpng's default height limit */
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "rows", -1, -1,
                       "rows: the image would have %llu x %llu pixels, more than %llu; draw fewer rows",
                       (unsigned long long)w, (unsigned long long)h, (unsigned long long)PNG_MAX_PIXELS);
    uint8_t *img = mp_alloc_array((size_t)w, (size_t)h * 3); /* w * h <= PNG_MAX_PIXELS, h <= 1e6 */
    int64_t *owner = mp_alloc_array((size_t)Kd, sizeof *owner);
    if (!img || !owner) {
        free(img);
        free(owner);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, PNG_ARG, -1, -1, "png: out of memory");
    }
    size_t n_seg = maskpack_layout_n_segments(L);
    for (size_t r = 0; r < n_draw; r++) {
        int64_t b = n_rows ? rows[r] : (int64_t)r;
        uint32_t y0 = (uint32_t)(r * (panel + PNG_SEPARATOR));
        /* which segment owns each drawn key column (keys of a row belong to at most one segment) */
        for (int64_t jd = 0; jd < Kd; jd++) owner[jd] = -1;
        for (size_t k = 0; k < n_seg; k++) {
            maskpack_segment g;
            maskpack_layout_segment(L, k, &g, NULL);
            if (g.row != b) continue;
            for (int64_t jd = (g.kv_start + f - 1) / f; jd * f < g.kv_start + g.kv_len; jd++) owner[jd] = (int64_t)k;
        }
        for (int64_t id = 0; id < Sd; id++) {
            int64_t i = id * f;
            int64_t k = maskpack_segment_of_query(L, b, i);
            for (int64_t jd = 0; jd < Kd; jd++) {
                int64_t j = jd * f;
                const uint8_t *c;
                if (k < 0 || owner[jd] < 0)
                    c = c_pad;
                else if (maskpack_allowed(L, b, 0, i, j))
                    c = palette[(size_t)k % N_PALETTE];
                else if (owner[jd] == k)
                    c = c_white;
                else
                    c = c_other;
                put_block(img, (uint32_t)w, (uint32_t)(jd * zoom), y0 + (uint32_t)(id * zoom), (uint32_t)zoom, c);
            }
        }
        if (r + 1 < n_draw)
            for (uint32_t y = 0; y < PNG_SEPARATOR; y++)
                for (uint64_t x = 0; x < w; x++) memcpy(img + ((size_t)(y0 + panel + y) * w + x) * 3, c_sep, 3);
    }
    free(owner);
    membuf m = {0};
    int ok = encode_rgb(img, (uint32_t)w, (uint32_t)h, &m);
    free(img);
    if (!ok) {
        free(m.p);
        return mp_fail(err, MASKPACK_ERR_IO, PNG_ARG, -1, -1, "png: libpng failed to encode the image");
    }
    *buf = m.p;
    *len = m.len;
    if (width) *width = (uint32_t)w;
    if (height) *height = (uint32_t)h;
    return mp_ok(err);
}

maskpack_status mpio_png_write_layout(const char *path, const maskpack_layout *L, const int64_t *rows, size_t n_rows,
                                      const mpio_png_options *options, maskpack_error *err) {
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_status s = mpio_png_encode_layout(L, rows, n_rows, options, &buf, &len, NULL, NULL, err);
    if (s) return s;
    s = mpio_write_file(path, buf, len, err);
    free(buf);
    return s;
}
