/* draw.c: the pictures' canvas (draw.h): a display list replayed by cairo into a PNG, or written as SVG.
 * Built with MASKPACK_HAVE_CAIRO when meson finds cairo; without it every picture is refused with a
 * message saying so. */
#include "draw.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(MASKPACK_HAVE_CAIRO)
#include <cairo.h>
#include <cairo-svg.h>
#if defined(MASKPACK_HAVE_FONTCONFIG)
#include <fontconfig/fontconfig.h>
#endif
#endif

#define DW_FONT "DejaVu Sans"
/* cairo image surfaces are at most 32767 pixels a side; the PNG is refused above 64 Mpixel too (256 MB
 * of pixels while it is drawn) */
#define DW_MAX_SIDE   32767.0
#define DW_MAX_PIXELS 64e6

typedef enum op_kind { OP_RECT, OP_LINE, OP_PATH, OP_TEXT, OP_IMAGE, OP_GROUP, OP_GROUP_END } op_kind;

typedef struct op {
    op_kind kind;
    double x, y, w, h; /* rect/image: box; line: x,y -> w,h (end point); text: anchor point */
    uint32_t fill, stroke;
    double line_width, size;
    int flag_a, flag_b, flag_c; /* line: dashed; text: anchor, bold, vertical; path: closed */
    int iw, ih;
    char *text, *text2; /* text; group: class, title */
    double *xy;         /* path points */
    size_t n;
    uint8_t *rgb; /* image pixels */
} op;

struct dw {
    double width, height;
    op *ops;
    size_t n, cap;
    int failed;
};

int dw_available(void) {
#if defined(MASKPACK_HAVE_CAIRO)
    return 1;
#else
    return 0;
#endif
}

const char *dw_unavailable_reason(void) {
#if defined(MASKPACK_HAVE_CAIRO)
    return NULL;
#else
    return "pictures were not built in: this maskpack was built without cairo (install libcairo2-dev on "
           "Debian, or cairo's development files elsewhere, then rebuild: meson setup --reconfigure build)";
#endif
}

int dw_path_is_svg(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n >= 4 && strcasecmp(path + n - 4, ".svg") == 0;
}

dw *dw_new(double width, double height) {
    dw *d = calloc(1, sizeof *d);
    if (d) d->width = width, d->height = height;
    return d;
}

void dw_set_size(dw *d, double width, double height) {
    d->width = width;
    d->height = height;
}

int dw_failed(const dw *d) { return d->failed; }

void dw_free(dw *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n; i++) {
        free(d->ops[i].text);
        free(d->ops[i].text2);
        free(d->ops[i].xy);
        free(d->ops[i].rgb);
    }
    free(d->ops);
    free(d);
}

static op *push(dw *d, op_kind kind) {
    if (d->failed) return NULL;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 256;
        size_t bytes;
        op *o = __builtin_mul_overflow(cap, sizeof *o, &bytes) ? NULL : realloc(d->ops, bytes);
        if (!o) {
            d->failed = 1;
            return NULL;
        }
        d->ops = o;
        d->cap = cap;
    }
    op *o = &d->ops[d->n++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->fill = o->stroke = DW_NONE;
    return o;
}

static char *dup_text(dw *d, const char *s) {
    char *t = strdup(s ? s : "");
    if (!t) d->failed = 1;
    return t;
}

void dw_rect(dw *d, double x, double y, double w, double h, uint32_t fill, uint32_t stroke, double line_width) {
    op *o = push(d, OP_RECT);
    if (!o) return;
    o->x = x, o->y = y, o->w = w, o->h = h;
    o->fill = fill, o->stroke = stroke, o->line_width = line_width;
}

void dw_line(dw *d, double x0, double y0, double x1, double y1, uint32_t colour, double line_width, int dashed) {
    op *o = push(d, OP_LINE);
    if (!o) return;
    o->x = x0, o->y = y0, o->w = x1, o->h = y1;
    o->stroke = colour, o->line_width = line_width, o->flag_a = dashed;
}

void dw_path(dw *d, const double *xy, size_t n, int closed, uint32_t fill, uint32_t stroke, double line_width) {
    if (n == 0) return;
    op *o = push(d, OP_PATH);
    if (!o) return;
    size_t bytes;
    o->xy = __builtin_mul_overflow(n, sizeof(double[2]), &bytes) ? NULL : malloc(bytes);
    if (!o->xy) {
        d->failed = 1;
        return;
    }
    memcpy(o->xy, xy, bytes);
    o->n = n;
    o->flag_a = closed;
    o->fill = fill, o->stroke = stroke, o->line_width = line_width;
}

void dw_text(dw *d, double x, double y, const char *text, double size, uint32_t colour, dw_anchor anchor, int bold,
             int vertical) {
    op *o = push(d, OP_TEXT);
    if (!o) return;
    o->x = x, o->y = y, o->size = size, o->fill = colour;
    o->flag_a = (int)anchor, o->flag_b = bold, o->flag_c = vertical;
    o->text = dup_text(d, text);
}

void dw_image(dw *d, double x, double y, double w, double h, int iw, int ih, const uint8_t *rgb) {
    if (iw <= 0 || ih <= 0) return;
    op *o = push(d, OP_IMAGE);
    if (!o) return;
    size_t bytes, px;
    o->rgb = __builtin_mul_overflow((size_t)iw, (size_t)ih, &px) || __builtin_mul_overflow(px, (size_t)3, &bytes)
                 ? NULL
                 : malloc(bytes);
    if (!o->rgb) {
        d->failed = 1;
        return;
    }
    memcpy(o->rgb, rgb, bytes);
    o->x = x, o->y = y, o->w = w, o->h = h, o->iw = iw, o->ih = ih;
}

void dw_group(dw *d, const char *cls, const char *title) {
    op *o = push(d, OP_GROUP);
    if (!o) return;
    o->text = dup_text(d, cls);
    o->text2 = dup_text(d, title);
}

void dw_group_end(dw *d) { push(d, OP_GROUP_END); }

/* ---- text metrics ------------------------------------------------------------------------------ */

#if defined(MASKPACK_HAVE_CAIRO)
static cairo_t *measure;

/* At exit: the measuring context, then cairo's font caches (they hold fontconfig patterns that a leak
 * checker would otherwise report). */
static void release_cairo(void) {
    if (measure) cairo_destroy(measure);
    measure = NULL;
    cairo_debug_reset_static_data();
#if defined(MASKPACK_HAVE_FONTCONFIG)
    FcFini(); /* fontconfig's own caches: nothing of cairo refers to them any more */
#endif
}

static cairo_t *measure_cr(void) {
    if (!measure) {
        cairo_surface_t *s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1);
        measure = cairo_create(s);
        cairo_surface_destroy(s);
        atexit(release_cairo);
    }
    return measure;
}

static void set_font(cairo_t *cr, double size, int bold) {
    cairo_select_font_face(cr, DW_FONT, CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
}
#endif

double dw_text_width(const char *text, double size, int bold) {
#if defined(MASKPACK_HAVE_CAIRO)
    cairo_t *cr = measure_cr();
    set_font(cr, size, bold);
    cairo_text_extents_t e;
    cairo_text_extents(cr, text, &e);
    return e.x_advance;
#else
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) n += (*p & 0xC0) != 0x80;
    return (double)n * size * (bold ? 0.66 : 0.6);
#endif
}

size_t dw_wrap(const char *text, double size, int bold, double width, char **lines, size_t max_lines) {
    size_t n = 0, len = strlen(text);
    const char *p = text;
    char *buf = malloc(len + 1);
    if (!buf) return 0;
    while (*p && n < max_lines) {
        /* the longest prefix ending at a space (or the text's end) that fits; at least one word */
        size_t best = 0, i = 0;
        for (;;) {
            while (p[i] && p[i] != ' ') i++;
            memcpy(buf, p, i);
            buf[i] = 0;
            if (best && dw_text_width(buf, size, bold) > width) break;
            best = i;
            if (!p[i]) break;
            i++;
        }
        if (n + 1 == max_lines && p[best]) { /* the last line allowed: cut with an ellipsis */
            size_t k = best;
            memcpy(buf, p, k);
            strcpy(buf + k, " ...");
            lines[n++] = strdup(buf);
            break;
        }
        memcpy(buf, p, best);
        buf[best] = 0;
        lines[n] = strdup(buf);
        if (!lines[n]) break;
        n++;
        p += best;
        while (*p == ' ') p++;
    }
    free(buf);
    return n;
}

double dw_nice_step(double least) {
    if (!(least > 0)) return 1;
    double p = pow(10.0, floor(log10(least)));
    for (int k = 0; k < 4; k++) {
        static const double m[] = {1, 2, 5, 10};
        if (m[k] * p >= least * (1 - 1e-9)) return m[k] * p;
    }
    return 10 * p;
}

void dw_short_number(double v, char *buf, size_t cap) {
    double a = fabs(v);
    if (a < 1e6 && v == floor(v)) {
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    static const char suffix[] = {' ', 'k', 'M', 'G', 'T', 'P', 'E'};
    int k = 0;
    while (a >= 1000 && k < 6) a /= 1000, v /= 1000, k++;
    if (k == 0)
        snprintf(buf, cap, "%.3g", v);
    else
        snprintf(buf, cap, "%.3g%c", v, suffix[k]);
}

#if defined(MASKPACK_HAVE_CAIRO)
/* ---- growing buffer ------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}

/* XML text: &, <, >, quotes escaped; control characters (not allowed in XML 1.0) as U+FFFD. */
static void sb_xml(sbuf *b, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '&': sb_put(b, "&amp;", 5); break;
        case '<': sb_put(b, "&lt;", 4); break;
        case '>': sb_put(b, "&gt;", 4); break;
        case '"': sb_put(b, "&quot;", 6); break;
        case '\'': sb_put(b, "&#39;", 5); break;
        default:
            if (*p < 0x20 && *p != '\t' && *p != '\n')
                sb_put(b, "\xEF\xBF\xBD", 3);
            else
                sb_put(b, (const char *)p, 1);
        }
    }
}

static void sb_colour(sbuf *b, const char *attr, uint32_t c) {
    if (c == DW_NONE)
        sb_printf(b, " %s=\"none\"", attr);
    else
        sb_printf(b, " %s=\"#%06x\"", attr, (unsigned)c);
}

static void set_rgb(cairo_t *cr, uint32_t c) {
    cairo_set_source_rgb(cr, ((c >> 16) & 255) / 255.0, ((c >> 8) & 255) / 255.0, (c & 255) / 255.0);
}

/* An RGB raster as a cairo surface (RGB24: one 32-bit word per pixel). */
static cairo_surface_t *raster_surface(const op *o) {
    cairo_surface_t *s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, o->iw, o->ih);
    if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(s);
        return NULL;
    }
    cairo_surface_flush(s);
    unsigned char *data = cairo_image_surface_get_data(s);
    int stride = cairo_image_surface_get_stride(s);
    for (int y = 0; y < o->ih; y++) {
        uint32_t *row = (uint32_t *)(void *)(data + (size_t)y * (size_t)stride);
        const uint8_t *src = o->rgb + (size_t)y * (size_t)o->iw * 3;
        for (int x = 0; x < o->iw; x++)
            row[x] = ((uint32_t)src[3 * x] << 16) | ((uint32_t)src[3 * x + 1] << 8) | src[3 * x + 2];
    }
    cairo_surface_mark_dirty(s);
    return s;
}

static cairo_status_t write_sbuf(void *closure, const unsigned char *data, unsigned int length) {
    sbuf *b = closure;
    sb_put(b, (const char *)data, length);
    return b->failed ? CAIRO_STATUS_NO_MEMORY : CAIRO_STATUS_SUCCESS;
}

static void replay_cairo(const dw *d, cairo_t *cr) {
    set_rgb(cr, 0xFFFFFF);
    cairo_paint(cr);
    for (size_t i = 0; i < d->n; i++) {
        const op *o = &d->ops[i];
        switch (o->kind) {
        case OP_RECT:
            cairo_rectangle(cr, o->x, o->y, o->w, o->h);
            if (o->fill != DW_NONE) {
                set_rgb(cr, o->fill);
                if (o->stroke != DW_NONE)
                    cairo_fill_preserve(cr);
                else
                    cairo_fill(cr);
            }
            if (o->stroke != DW_NONE) {
                set_rgb(cr, o->stroke);
                cairo_set_line_width(cr, o->line_width);
                cairo_set_dash(cr, NULL, 0, 0);
                cairo_stroke(cr);
            }
            cairo_new_path(cr);
            break;
        case OP_LINE: {
            double dash[2] = {4, 3};
            cairo_set_dash(cr, dash, o->flag_a ? 2 : 0, 0);
            set_rgb(cr, o->stroke);
            cairo_set_line_width(cr, o->line_width);
            cairo_move_to(cr, o->x, o->y);
            cairo_line_to(cr, o->w, o->h);
            cairo_stroke(cr);
            cairo_set_dash(cr, NULL, 0, 0);
            break;
        }
        case OP_PATH:
            cairo_move_to(cr, o->xy[0], o->xy[1]);
            for (size_t k = 1; k < o->n; k++) cairo_line_to(cr, o->xy[2 * k], o->xy[2 * k + 1]);
            if (o->flag_a) cairo_close_path(cr);
            if (o->fill != DW_NONE) {
                set_rgb(cr, o->fill);
                cairo_fill_preserve(cr);
            }
            if (o->stroke != DW_NONE) {
                set_rgb(cr, o->stroke);
                cairo_set_line_width(cr, o->line_width);
                cairo_stroke_preserve(cr);
            }
            cairo_new_path(cr);
            break;
        case OP_TEXT: {
            set_font(cr, o->size, o->flag_b);
            cairo_text_extents_t e;
            cairo_text_extents(cr, o->text, &e);
            double dx = o->flag_a == DW_CENTRE ? -e.x_advance / 2 : o->flag_a == DW_RIGHT ? -e.x_advance : 0;
            cairo_save(cr);
            cairo_translate(cr, o->x, o->y);
            if (o->flag_c) cairo_rotate(cr, -1.5707963267948966);
            cairo_move_to(cr, dx, 0);
            set_rgb(cr, o->fill);
            cairo_show_text(cr, o->text);
            cairo_restore(cr);
            cairo_new_path(cr);
            break;
        }
        case OP_IMAGE: {
            cairo_surface_t *s = raster_surface(o);
            if (!s) break;
            cairo_save(cr);
            cairo_rectangle(cr, o->x, o->y, o->w, o->h);
            cairo_clip(cr);
            cairo_translate(cr, o->x, o->y);
            cairo_scale(cr, o->w / o->iw, o->h / o->ih);
            cairo_set_source_surface(cr, s, 0, 0);
            cairo_pattern_set_filter(cairo_get_source(cr), CAIRO_FILTER_NEAREST);
            cairo_paint(cr);
            cairo_restore(cr);
            cairo_surface_destroy(s);
            break;
        }
        case OP_GROUP:
        case OP_GROUP_END: break;
        }
    }
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void sb_base64(sbuf *b, const unsigned char *p, size_t n) {
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        q[0] = b64[(v >> 18) & 63];
        q[1] = b64[(v >> 12) & 63];
        q[2] = i + 1 < n ? b64[(v >> 6) & 63] : '=';
        q[3] = i + 2 < n ? b64[v & 63] : '=';
        sb_put(b, q, 4);
    }
}

static void write_svg(const dw *d, sbuf *b) {
    sb_printf(b,
              "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
              "<svg xmlns=\"http://www.w3.org/2000/svg\" xmlns:xlink=\"http://www.w3.org/1999/xlink\" "
              "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"%s, sans-serif\">\n"
              "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n",
              d->width, d->height, d->width, d->height, DW_FONT, d->width, d->height);
    for (size_t i = 0; i < d->n && !b->failed; i++) {
        const op *o = &d->ops[i];
        switch (o->kind) {
        case OP_RECT:
            sb_printf(b, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"", o->x, o->y, o->w, o->h);
            sb_colour(b, "fill", o->fill);
            if (o->stroke != DW_NONE) {
                sb_colour(b, "stroke", o->stroke);
                sb_printf(b, " stroke-width=\"%.2f\"", o->line_width);
            }
            sb_put(b, "/>\n", 3);
            break;
        case OP_LINE:
            sb_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"", o->x, o->y, o->w, o->h);
            sb_colour(b, "stroke", o->stroke);
            sb_printf(b, " stroke-width=\"%.2f\"%s/>\n", o->line_width, o->flag_a ? " stroke-dasharray=\"4 3\"" : "");
            break;
        case OP_PATH:
            sb_put(b, "<path d=\"", 9);
            for (size_t k = 0; k < o->n; k++)
                sb_printf(b, "%s%.2f %.2f", k ? " L" : "M", o->xy[2 * k], o->xy[2 * k + 1]);
            if (o->flag_a) sb_put(b, " Z", 2);
            sb_put(b, "\"", 1);
            sb_colour(b, "fill", o->fill);
            if (o->stroke != DW_NONE) {
                sb_colour(b, "stroke", o->stroke);
                sb_printf(b, " stroke-width=\"%.2f\"", o->line_width);
            }
            sb_put(b, "/>\n", 3);
            break;
        case OP_TEXT: {
            static const char *const anchors[] = {"start", "middle", "end"};
            sb_printf(b, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.1f\"", o->x, o->y, o->size);
            if (o->flag_a != DW_LEFT) sb_printf(b, " text-anchor=\"%s\"", anchors[o->flag_a]);
            if (o->flag_b) sb_put(b, " font-weight=\"bold\"", 19);
            if (o->flag_c) sb_printf(b, " transform=\"rotate(-90 %.2f %.2f)\"", o->x, o->y);
            sb_colour(b, "fill", o->fill);
            sb_put(b, ">", 1);
            sb_xml(b, o->text);
            sb_put(b, "</text>\n", 8);
            break;
        }
        case OP_IMAGE: {
            cairo_surface_t *s = raster_surface(o);
            sbuf png = {0};
            if (!s || cairo_surface_write_to_png_stream(s, write_sbuf, &png) != CAIRO_STATUS_SUCCESS || png.failed)
                b->failed = 1;
            if (s) cairo_surface_destroy(s);
            if (!b->failed) {
                sb_printf(b,
                          "<image x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" preserveAspectRatio=\"none\" "
                          "image-rendering=\"optimizeSpeed\" style=\"image-rendering:pixelated\" "
                          "xlink:href=\"data:image/png;base64,",
                          o->x, o->y, o->w, o->h);
                sb_base64(b, (const unsigned char *)png.p, png.len);
                sb_put(b, "\"/>\n", 4);
            }
            free(png.p);
            break;
        }
        case OP_GROUP:
            sb_put(b, "<g class=\"", 10);
            sb_xml(b, o->text);
            sb_put(b, "\"><title>", 9);
            sb_xml(b, o->text2);
            sb_put(b, "</title>\n", 9);
            break;
        case OP_GROUP_END: sb_put(b, "</g>\n", 5); break;
        }
    }
    sb_put(b, "</svg>\n", 7);
}
#endif

int dw_encode(const dw *d, int svg, uint8_t **buf, size_t *len, char *why, size_t cap) {
    *buf = NULL;
    *len = 0;
    if (!dw_available()) {
        snprintf(why, cap, "%s", dw_unavailable_reason());
        return 1;
    }
    if (d->failed) {
        snprintf(why, cap, "out of memory while drawing");
        return 1;
    }
#if defined(MASKPACK_HAVE_CAIRO)
    sbuf b = {0};
    if (svg) {
        write_svg(d, &b);
    } else {
        double w = ceil(d->width), h = ceil(d->height);
        if (w < 1 || h < 1 || w > DW_MAX_SIDE || h > DW_MAX_SIDE || w * h > DW_MAX_PIXELS) {
            snprintf(why, cap,
                     "the picture would be %.0f x %.0f pixels, more than a PNG here holds (%.0f a side, %.0f Mpixel); "
                     "draw fewer rows, or write an .svg",
                     w, h, DW_MAX_SIDE, DW_MAX_PIXELS / 1e6);
            return 1;
        }
        cairo_surface_t *s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, (int)w, (int)h);
        if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
            cairo_surface_destroy(s);
            snprintf(why, cap, "out of memory for a %.0f x %.0f picture", w, h);
            return 1;
        }
        cairo_t *cr = cairo_create(s);
        replay_cairo(d, cr);
        cairo_status_t st = cairo_status(cr);
        cairo_destroy(cr);
        cairo_surface_flush(s);
        if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png_stream(s, write_sbuf, &b);
        cairo_surface_destroy(s);
        if (st != CAIRO_STATUS_SUCCESS && !b.failed) {
            free(b.p);
            snprintf(why, cap, "cairo could not draw the picture: %s", cairo_status_to_string(st));
            return 1;
        }
    }
    if (b.failed) {
        free(b.p);
        snprintf(why, cap, "out of memory while encoding the picture");
        return 1;
    }
    *buf = (uint8_t *)b.p;
    *len = b.len;
    return 0;
#else
    (void)svg;
    return 1;
#endif
}
