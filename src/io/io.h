/*
 * io.h: internal file readers and writers (not installed). Used by the maskpack CLI, the fuzz targets
 * and the tests.
 *
 * Every reader parses from a memory buffer (so a fuzzer can call it) and has a path wrapper that reads
 * the file and prefixes error messages with the path. Readers never trust a size written in a file:
 * every length is checked against the bytes actually present, every product for overflow, and no
 * allocation exceeds MPIO_MAX_BYTES or what the input can legitimately expand to. Errors use the
 * library's status codes:
 *   MASKPACK_ERR_FORMAT       the bytes are malformed or lie about their sizes (message says which)
 *   MASKPACK_ERR_UNSUPPORTED  well-formed, but a feature this reader does not handle (e.g. uint32)
 *   MASKPACK_ERR_NOT_FOUND    a requested member or tensor is absent
 *   MASKPACK_ERR_IO           the operating system refused a read or write
 *   MASKPACK_ERR_OUT_OF_MEMORY
 *
 * Names use the prefix mpio_ (internal I/O); nothing here is part of the public API.
 */
#ifndef MASKPACK_IO_H
#define MASKPACK_IO_H

#include "maskpack.h"

#include <stddef.h>
#include <stdint.h>

/* Largest array (or file) any reader accepts: keeps hostile inputs and fuzzers from exhausting memory. */
#define MPIO_MAX_BYTES ((uint64_t)8 << 30)

/* ---- arrays ------------------------------------------------------------------------------------ */

/* An array loaded from a file. It owns its memory (data is malloc'd, so suitably aligned for every
 * dtype even when the file stored it at an odd offset). */
typedef struct mpio_array {
    char *name; /* member / tensor name (malloc'd), NULL for a bare .npy */
    maskpack_dtype dtype;
    int32_t ndim; /* 0 = scalar (one element) */
    int64_t shape[MASKPACK_MAX_DIMS];
    int fortran_order; /* 1: stored column-major; the view's strides say so */
    void *data;        /* NULL when nbytes == 0 */
    size_t nbytes;     /* numel * dtype size */
} mpio_array;

/* Releases the array's memory and zeroes it; NULL is a no-op. */
void mpio_array_free(mpio_array *a);
/* (array) -> numel (1 for a scalar). */
int64_t mpio_array_numel(const mpio_array *a);
/* (array) -> a strided tensor view of its data (column-major strides for Fortran order). The view
 * lives as long as the array. */
maskpack_tensor mpio_array_view(const mpio_array *a);

/* Several named arrays (the members of an .npz or the tensors of a .safetensors file, in file order). */
typedef struct mpio_arrayset {
    size_t n;
    mpio_array *arrays;
} mpio_arrayset;

/* Releases every array and the list, and zeroes the set; NULL is a no-op. */
void mpio_arrayset_free(mpio_arrayset *s);
/* (set, name) -> the array with that name, or NULL. */
const mpio_array *mpio_arrayset_find(const mpio_arrayset *s, const char *name);

/* A named tensor view handed to the writers (the tensor may be strided; it is written C-ordered).
 * With `text` set the item is a short printable-ASCII value instead (a name such as an NPU
 * input_layout, where a numeric code would have to be looked up): a 0-d numpy string ('<Un') in
 * .npy/.npz, an entry of `__metadata__` in .safetensors (which has no string tensors); `tensor` is
 * then not read. */
typedef struct mpio_named_tensor {
    const char *name;
    maskpack_tensor tensor;
    const char *text;
} mpio_named_tensor;

#define MPIO_MAX_TEXT 256 /* characters of a text item */

/* ---- files ------------------------------------------------------------------------------------- */

/* (path or "-" for standard input, max_bytes) -> *buf (malloc'd, caller frees), *len. Files larger
 * than max_bytes are refused with MASKPACK_ERR_UNSUPPORTED; OS errors are MASKPACK_ERR_IO naming the path and errno
 * text. */
maskpack_status mpio_read_file(const char *path, uint64_t max_bytes, uint8_t **buf, size_t *len, maskpack_error *err);
/* (path, bytes) -> writes the file. A regular file (or a new one) is written to a temporary file beside
 * it and renamed over it only on success, so a failed write leaves the old content as it was; a
 * link is followed (the link stays); a device, fifo or socket is written in place and never removed.
 * MASKPACK_ERR_IO on failure. */
maskpack_status mpio_write_file(const char *path, const void *buf, size_t len, maskpack_error *err);

/* What a file holds, from its first bytes. */
typedef enum mpio_kind { MPIO_KIND_UNKNOWN = 0, MPIO_KIND_NPY, MPIO_KIND_NPZ, MPIO_KIND_SAFETENSORS } mpio_kind;
/* (bytes) -> the container kind recognised from the magic bytes. */
mpio_kind mpio_detect(const void *buf, size_t len);

/* (path) -> all arrays of an .npy (one array, name NULL), .npz or .safetensors file, detected from the
 * content. MASKPACK_ERR_FORMAT when the content is none of them. */
maskpack_status mpio_load_any(const char *path, mpio_arrayset *out, maskpack_error *err);
/* (bytes) -> same as mpio_load_any for an in-memory file. */
maskpack_status mpio_parse_any(const void *buf, size_t len, mpio_arrayset *out, maskpack_error *err);
/* Same under a memory budget of max_bytes for what is loaded (an .npz's inflated members; an .npy or
 * .safetensors holds no more than its own bytes). */
maskpack_status mpio_parse_any_budget(const void *buf, size_t len, uint64_t max_bytes, mpio_arrayset *out,
                                      maskpack_error *err);
/* (path, budget) -> mpio_load_any reading at most max_bytes (a file, a pipe or an endless stream stops
 * there: memory stays within the budget) and parsing under the same budget. */
maskpack_status mpio_load_any_budget(const char *path, uint64_t max_bytes, mpio_arrayset *out, maskpack_error *err);

/* ---- .npy ------------------------------------------------------------------------------------------ */

/* (bytes of an .npy file) -> *out. Header versions 1.0, 2.0 and 3.0; dtypes b1 u1 i1 i2 i4 i8 f2 f4 f8,
 * little-endian; C or Fortran order. The data must be exactly numel * itemsize bytes. */
maskpack_status mpio_npy_parse(const void *buf, size_t len, mpio_array *out, maskpack_error *err);
/* (path) -> *out (mpio_npy_parse of the file; messages are prefixed with the path). */
maskpack_status mpio_npy_load(const char *path, mpio_array *out, maskpack_error *err);
/* (tensor) -> buf, len: an .npy file (version 1.0 header padded to 64 bytes), C order. bfloat16
 * has no .npy dtype and is refused (MASKPACK_ERR_UNSUPPORTED). */
maskpack_status mpio_npy_encode(const maskpack_tensor *t, uint8_t **buf, size_t *len, maskpack_error *err);
/* (text, name for messages) -> OK when text is 1 to MPIO_MAX_TEXT printable ASCII characters. */
maskpack_status mpio_check_text(const char *text, const char *name, maskpack_error *err);
/* (printable ASCII text of at most MPIO_MAX_TEXT chars) -> a .npy of a 0-d numpy string '<Un' (UCS-4). */
maskpack_status mpio_npy_encode_text(const char *text, uint8_t **buf, size_t *len, maskpack_error *err);
/* (path, tensor) -> writes mpio_npy_encode's bytes to path. */
maskpack_status mpio_npy_save(const char *path, const maskpack_tensor *t, maskpack_error *err);

/* ---- zip / .npz ------------------------------------------------------------------------------------ */

typedef struct mpio_zip mpio_zip; /* an opened archive: validated directory over a borrowed buffer */

/* (bytes) -> *out. Parses the end-of-central-directory record (zip64 records included), the central
 * directory and every local header, and checks they agree: sizes, names, methods (STORED or DEFLATED),
 * data inside the archive, entries not overlapping, no duplicate names. The buffer is borrowed: it
 * must outlive the archive. */
maskpack_status mpio_zip_open(const void *buf, size_t len, mpio_zip **out, maskpack_error *err);
/* Releases an archive; NULL is a no-op. */
void mpio_zip_close(mpio_zip *z);
/* (archive) -> number of members. */
size_t mpio_zip_count(const mpio_zip *z);
/* (archive, i < count) -> member name (NUL-terminated, lives as long as the archive). */
const char *mpio_zip_name(const mpio_zip *z, size_t i);
/* (archive, name) -> *index of the member with exactly that name; MASKPACK_ERR_NOT_FOUND if absent. */
maskpack_status mpio_zip_find(const mpio_zip *z, const char *name, size_t *index, maskpack_error *err);
/* (archive, i) -> *data (malloc'd, caller frees) / *len: the member's bytes, inflated if DEFLATED,
 * with size and CRC-32 verified. */
maskpack_status mpio_zip_extract(const mpio_zip *z, size_t i, uint8_t **data, size_t *len, maskpack_error *err);

/* (bytes of an .npz) -> every member as an array named without its ".npy" suffix, in archive order. */
maskpack_status mpio_npz_parse(const void *buf, size_t len, mpio_arrayset *out, maskpack_error *err);
/* Same under a memory budget: the members' claimed (inflated) sizes together must not exceed
 * max_bytes, checked before anything is inflated; the error names the member, its claim and the
 * budget (MASKPACK_ERR_UNSUPPORTED). */
maskpack_status mpio_npz_parse_budget(const void *buf, size_t len, uint64_t max_bytes, mpio_arrayset *out,
                                      maskpack_error *err);
/* (bytes of an .npz, name with or without ".npy") -> that member; MASKPACK_ERR_NOT_FOUND if absent. */
maskpack_status mpio_npz_parse_member(const void *buf, size_t len, const char *name, mpio_array *out,
                                      maskpack_error *err);
/* (path) -> mpio_npz_parse of the file. */
maskpack_status mpio_npz_load(const char *path, mpio_arrayset *out, maskpack_error *err);
/* (items[n], deflate?) -> an .npz archive: each item becomes member "<name>.npy", STORED, or DEFLATED
 * when deflate is set (stored anyway when deflating would not shrink it). Members, offsets or
 * directories past 4 GiB and 65535 or more members use the zip64 forms, only where needed. */
maskpack_status mpio_npz_encode(const mpio_named_tensor *items, size_t n, int deflate, uint8_t **buf, size_t *len,
                                maskpack_error *err);
/* mpio_npz_encode with the zip64 threshold lowered to zip64_from bytes (members and counts at or
 * above it take the zip64 forms): lets tests check those forms without writing 4 GiB. */
maskpack_status mpio_npz_encode_zip64_from(const mpio_named_tensor *items, size_t n, int deflate, uint64_t zip64_from,
                                           uint8_t **buf, size_t *len, maskpack_error *err);
/* (path, items[n], deflate?) -> writes mpio_npz_encode's bytes to path. */
maskpack_status mpio_npz_save(const char *path, const mpio_named_tensor *items, size_t n, int deflate,
                              maskpack_error *err);

/* ---- .safetensors ---------------------------------------------------------------------------------- */

/* (bytes) -> every tensor in header order ("__metadata__" ignored). dtypes BOOL U8 I8 I16 I32 I64 F16
 * BF16 F32 F64; data_offsets must lie inside the data section, match shape * dtype size and not
 * overlap. */
maskpack_status mpio_safetensors_parse(const void *buf, size_t len, mpio_arrayset *out, maskpack_error *err);
/* (path) -> mpio_safetensors_parse of the file. */
maskpack_status mpio_safetensors_load(const char *path, mpio_arrayset *out, maskpack_error *err);
/* (items[n]) -> a .safetensors file, tensors packed in the given order, header padded to 8 bytes. */
maskpack_status mpio_safetensors_encode(const mpio_named_tensor *items, size_t n, uint8_t **buf, size_t *len,
                                        maskpack_error *err);
/* (path, items[n]) -> writes mpio_safetensors_encode's bytes to path. */
maskpack_status mpio_safetensors_save(const char *path, const mpio_named_tensor *items, size_t n, maskpack_error *err);

/* ---- PNG rendering of a layout's allowed matrix ----------------------------------------------------- */

/* Colours: allowed cells take their segment's palette colour, disallowed cells inside the query's own
 * segment are white, cells between two different segments light grey, cells in a padding row or
 * column dark grey; rows of the batch are stacked vertically, separated by a black line. */
typedef struct mpio_png_options {
    int zoom;         /* pixels per cell; 0 = automatic (largest integer keeping the side <= 1024) */
    int64_t max_side; /* larger grids are sampled down to at most this many pixels; 0 = 2048 */
} mpio_png_options;

/* (layout, rows[n_rows] (batch rows to draw; NULL with n_rows 0 = every row), options or NULL) ->
 * buf, len: a PNG file (RGB, 8 bit); width, height: its size (either may be NULL). Refuses images
 * above 64 Mpixel (MASKPACK_ERR_INVALID_ARGUMENT: draw fewer rows). */
maskpack_status mpio_png_encode_layout(const maskpack_layout *layout, const int64_t *rows, size_t n_rows,
                                       const mpio_png_options *options, uint8_t **buf, size_t *len, uint32_t *width,
                                       uint32_t *height, maskpack_error *err);
/* (path, ...) -> writes mpio_png_encode_layout's bytes to path. */
maskpack_status mpio_png_write_layout(const char *path, const maskpack_layout *layout, const int64_t *rows,
                                      size_t n_rows, const mpio_png_options *options, maskpack_error *err);

/* ---- helpers shared by the readers (io_common.c) ---------------------------------------------------- */

/* A parser of a whole in-memory file into an array set (mpio_parse_any, mpio_npz_parse, ...). */
typedef maskpack_status (*mpio_set_parser)(const void *buf, size_t len, mpio_arrayset *out, maskpack_error *err);
/* (path, parser) -> *out: the file read (at most MPIO_MAX_BYTES) and parsed, messages prefixed with
 * the path; *out is zeroed first, so it is empty on failure. */
maskpack_status mpio_load_set(const char *path, mpio_set_parser parse, mpio_arrayset *out, maskpack_error *err);
/* Prefixes err->message with "<path>: " after a failed parse of a file (keeps the status). */
maskpack_status mpio_prefix_path(maskpack_error *err, maskpack_status status, const char *path);
/* Prefixes err->message (if err) with `prefix`, truncating the result to the message size. */
void mpio_prefix_message(maskpack_error *err, const char *prefix);
/* (dtype) -> numpy descr ("<i4", "|b1", ...) or NULL for bfloat16. */
const char *mpio_npy_descr(maskpack_dtype dtype);
/* Copies a strided tensor into C-contiguous bytes at dst (numel * dtype size bytes). */
void mpio_copy_contiguous(const maskpack_tensor *t, void *dst);
/* Duplicates a string (malloc'd) or returns NULL. */
char *mpio_strdup(const char *s);

#endif
