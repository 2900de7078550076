/* draw.h: the pictures' canvas: a display list of rectangles, lines, paths, text and raster images,
 * rendered by cairo into a PNG, or written as an SVG with real <text> elements (so a title, a legend
 * entry or an axis label can be searched, selected and read by a screen reader; cairo's own SVG
 * surface turns text into glyph outlines). Text is measured and drawn by cairo with the system's
 * fonts (DejaVu Sans on Debian): no hand-rolled font.
 *
 * Without cairo at build time (meson: dependency('cairo', required : false)) the canvas still
 * records, but dw_available() is 0 and dw_encode() refuses with a message saying pictures were not
 * built in; the CLI checks dw_available() before it draws anything. */
#ifndef MASKPACK_CLI_DRAW_H
#define MASKPACK_CLI_DRAW_H

#include <stddef.h>
#include <stdint.h>

#define DW_NONE 0xFFFFFFFFu /* no fill / no stroke */

typedef enum dw_anchor { DW_LEFT = 0, DW_CENTRE = 1, DW_RIGHT = 2 } dw_anchor;

typedef struct dw dw;

/* 1 iff pictures are built in (cairo found at build time). */
int dw_available(void);
/* Why pictures cannot be drawn (a full sentence), or NULL when they can. */
const char *dw_unavailable_reason(void);
/* 1 iff path names an SVG file (ends in ".svg", any case); anything else is written as PNG. */
int dw_path_is_svg(const char *path);

/* A canvas of width x height pixels (the SVG's user units), white; NULL when out of memory. */
dw *dw_new(double width, double height);
void dw_free(dw *d);
void dw_set_size(dw *d, double width, double height);
/* Records failed allocations: 1 when something was dropped (dw_encode then fails). */
int dw_failed(const dw *d);

/* Colours are 0xRRGGBB; DW_NONE for no fill or no stroke. */
void dw_rect(dw *d, double x, double y, double w, double h, uint32_t fill, uint32_t stroke, double line_width);
void dw_line(dw *d, double x0, double y0, double x1, double y1, uint32_t colour, double line_width, int dashed);
/* A polyline (closed: a polygon) of n points xy[2n]. */
void dw_path(dw *d, const double *xy, size_t n, int closed, uint32_t fill, uint32_t stroke, double line_width);
/* Text whose baseline starts (DW_LEFT), is centred (DW_CENTRE) or ends (DW_RIGHT) at (x, y); vertical
 * text reads bottom to top, rotated about (x, y). */
void dw_text(dw *d, double x, double y, const char *text, double size, uint32_t colour, dw_anchor anchor, int bold,
             int vertical);
/* The advance width of text at this size (cairo's metrics; an estimate without cairo). */
double dw_text_width(const char *text, double size, int bold);
/* Splits text into lines no wider than width at this size (at spaces); returns how many lines were
 * written to lines[max_lines] (each malloc'd, caller frees with free()). */
size_t dw_wrap(const char *text, double size, int bold, double width, char **lines, size_t max_lines);
/* A raster of iw x ih RGB pixels (copied) drawn into the rectangle, each pixel a sharp square. */
void dw_image(dw *d, double x, double y, double w, double h, int iw, int ih, const uint8_t *rgb);
/* A named group: in the SVG a <g class="cls"> with a <title> (a tooltip: the full text); nothing in
 * the PNG. Groups nest. */
void dw_group(dw *d, const char *cls, const char *title);
void dw_group_end(dw *d);

/* (canvas, svg?) -> *buf (malloc'd), *len: the encoded picture. Returns 0, or 1 with why[cap] set
 * (pictures not built in, the image too large for a PNG, out of memory). */
int dw_encode(const dw *d, int svg, uint8_t **buf, size_t *len, char *why, size_t cap);

/* A "nice" step (1, 2 or 5 times a power of ten) at least `least`. */
double dw_nice_step(double least);
/* value as short text: integers as such below 1e6, else 3 significant digits with k/M/G/T/P. */
void dw_short_number(double value, char *buf, size_t cap);

#endif
