/* test_io.c: the file readers and writers (src/io): .npy, .npz (zip), .safetensors and the PNG
 * renderer. Round trips for every dtype, files written by numpy (tests/data, made by
 * tools/make_test_data.py), and one test per way a file can lie, each expecting MASKPACK_ERR_FORMAT
 * (or the documented other code) with a message that says what is wrong. */
#include "check.h"
#include "io.h"

#include <dirent.h>
#include <errno.h>
#include <png.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#ifndef MASKPACK_SOURCE_ROOT
#define MASKPACK_SOURCE_ROOT "."
#endif

/* 1 iff the bytes contain the string (memmem is a GNU extension). */
static int contains(const uint8_t *b, size_t len, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(b + i, s, n) == 0) return 1;
    return 0;
}

static const char *data_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", MASKPACK_SOURCE_ROOT, rel);
    return buf;
}

/* ---- byte builders ------------------------------------------------------------------------------ */

/* An .npy file with the given header text (version 1 or 2) followed by nbytes of data (0x11 filler). */
static uint8_t *make_npy(int version, const char *header, size_t nbytes, size_t *len) {
    size_t h = strlen(header), pre = version == 1 ? 10 : 12;
    *len = pre + h + nbytes;
    uint8_t *b = malloc(*len);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (uint8_t)version;
    b[7] = 0;
    if (version == 1) {
        b[8] = (uint8_t)h;
        b[9] = (uint8_t)(h >> 8);
    } else {
        for (int i = 0; i < 4; i++) b[8 + i] = (uint8_t)(h >> (8 * i));
    }
    memcpy(b + pre, header, h);
    memset(b + pre + h, 0x11, nbytes);
    return b;
}

/* A .safetensors file: header JSON as given, then nbytes of data. */
static uint8_t *make_st(const char *json, size_t nbytes, size_t *len) {
    size_t h = strlen(json);
    *len = 8 + h + nbytes;
    uint8_t *b = calloc(*len, 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, json, h);
    for (size_t i = 0; i < nbytes; i++) b[8 + h + i] = (uint8_t)i;
    return b;
}

static void expect_npy_error(const uint8_t *b, size_t len, maskpack_status want, const char *fragment) {
    mpio_array a;
    maskpack_error e;
    CHECK_STATUS(mpio_npy_parse(b, len, &a, &e), want, e);
    CHECK_MSG(e, fragment);
    CHECK(a.data == NULL);
}

/* ---- .npy ----------------------------------------------------------------------------------------- */

static void test_npy_round_trip_all_dtypes(void) {
    uint8_t raw[6 * 8];
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)(i * 37 + 1);
    int64_t shape[2] = {2, 3};
    for (int d = 0; d < MASKPACK_DTYPE_COUNT_; d++) {
        maskpack_dtype dt = (maskpack_dtype)d;
        if (dt == MASKPACK_BOOL) /* bool payload must be 0/1 */
            for (size_t i = 0; i < 6; i++) raw[i] = (uint8_t)(i & 1);
        maskpack_tensor t = maskpack_tensor_contiguous(raw, dt, 2, shape);
        uint8_t *buf = NULL;
        size_t len = 0;
        maskpack_error e;
        if (dt == MASKPACK_BF16) {
            CHECK_STATUS(mpio_npy_encode(&t, &buf, &len, &e), MASKPACK_ERR_UNSUPPORTED, e);
            CHECK_MSG(e, "bfloat16 has no .npy equivalent");
            continue;
        }
        CHECK_OK(mpio_npy_encode(&t, &buf, &len, &e), e);
        CHECK_EQ((len - 6 * maskpack_dtype_size(dt)) % 64, 0); /* data starts 64-byte aligned, as numpy writes */
        mpio_array a;
        CHECK_OK(mpio_npy_parse(buf, len, &a, &e), e);
        CHECK_EQ(a.dtype, dt);
        CHECK_EQ(a.ndim, 2);
        CHECK_EQ(a.shape[0], 2);
        CHECK_EQ(a.shape[1], 3);
        CHECK_EQ(a.fortran_order, 0);
        CHECK_EQ(a.nbytes, 6 * maskpack_dtype_size(dt));
        CHECK(memcmp(a.data, raw, a.nbytes) == 0);
        CHECK(a.name == NULL);
        mpio_array_free(&a);
        CHECK(a.data == NULL);
        free(buf);
    }
}

static void test_npy_header_text_and_strided_write(void) {
    /* a transposed (strided) view is written in C order of the view */
    int32_t src[6] = {0, 1, 2, 3, 4, 5}; /* [[0,1,2],[3,4,5]] */
    maskpack_tensor t;
    memset(&t, 0, sizeof t);
    t.data = src;
    t.dtype = MASKPACK_I32;
    t.ndim = 2;
    t.shape[0] = 3;
    t.shape[1] = 2;
    t.strides[0] = 1;
    t.strides[1] = 3; /* the transpose: [[0,3],[1,4],[2,5]] */
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_error e;
    CHECK_OK(mpio_npy_encode(&t, &buf, &len, &e), e);
    CHECK(contains(buf, len, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }"));
    mpio_array a;
    CHECK_OK(mpio_npy_parse(buf, len, &a, &e), e);
    const int32_t *v = a.data;
    int32_t want[6] = {0, 3, 1, 4, 2, 5};
    for (int i = 0; i < 6; i++) CHECK_EQ(v[i], want[i]);
    mpio_array_free(&a);
    free(buf);
    /* 1-D and 0-D shapes are written the Python way */
    int64_t n5 = 5;
    int64_t five[5] = {1, 2, 3, 4, 5};
    t = maskpack_tensor_contiguous(five, MASKPACK_I64, 1, &n5);
    CHECK_OK(mpio_npy_encode(&t, &buf, &len, &e), e);
    CHECK(contains(buf, len, "'shape': (5,)"));
    free(buf);
    t = maskpack_tensor_contiguous(five, MASKPACK_I64, 0, NULL);
    CHECK_OK(mpio_npy_encode(&t, &buf, &len, &e), e);
    CHECK(contains(buf, len, "'shape': ()"));
    CHECK_OK(mpio_npy_parse(buf, len, &a, &e), e);
    CHECK_EQ(a.ndim, 0);
    CHECK_EQ(mpio_array_numel(&a), 1);
    CHECK_EQ(*(int64_t *)a.data, 1);
    mpio_array_free(&a);
    free(buf);
}

static void test_npy_versions_and_fortran(void) {
    /* version 2.0 header (4-byte length), built by hand */
    size_t len;
    uint8_t *b = make_npy(2, "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 2), }\n", 8, &len);
    mpio_array a;
    maskpack_error e;
    CHECK_OK(mpio_npy_parse(b, len, &a, &e), e);
    CHECK_EQ(a.dtype, MASKPACK_I16);
    CHECK_EQ(a.shape[0], 2);
    mpio_array_free(&a);
    free(b);
    /* Fortran order by hand: data [0,1,2,3,4,5] column-major of shape (2,3) is [[0,2,4],[1,3,5]] */
    b = make_npy(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }\n", 6, &len);
    for (int i = 0; i < 6; i++) b[len - 6 + i] = (uint8_t)i;
    CHECK_OK(mpio_npy_parse(b, len, &a, &e), e);
    CHECK_EQ(a.fortran_order, 1);
    maskpack_tensor v = mpio_array_view(&a);
    CHECK_EQ(v.strides[0], 1);
    CHECK_EQ(v.strides[1], 2);
    const uint8_t *d = v.data;
    CHECK_EQ(d[1 * v.strides[0] + 0 * v.strides[1]], 1); /* element (1, 0) */
    CHECK_EQ(d[0 * v.strides[0] + 2 * v.strides[1]], 4); /* element (0, 2) */
    CHECK_EQ(d[1 * v.strides[0] + 2 * v.strides[1]], 5);
    mpio_array_free(&a);
    free(b);

    char path[1024];
    /* files written by numpy */
    CHECK_OK(mpio_npy_load(data_path(path, sizeof path, "tests/data/fortran_f32.npy"), &a, &e), e);
    CHECK_EQ(a.dtype, MASKPACK_F32);
    CHECK_EQ(a.fortran_order, 1);
    v = mpio_array_view(&a);
    for (int64_t i = 0; i < 3; i++)
        for (int64_t j = 0; j < 4; j++) {
            const float *f = v.data;
            CHECK(f[i * v.strides[0] + j * v.strides[1]] == (float)(i * 4 + j));
        }
    mpio_array_free(&a);
    CHECK_OK(mpio_npy_load(data_path(path, sizeof path, "tests/data/v2_i16.npy"), &a, &e), e);
    CHECK_EQ(a.dtype, MASKPACK_I16);
    CHECK_EQ(a.shape[0], 6);
    CHECK_EQ(((int16_t *)a.data)[0], -3);
    CHECK_EQ(((int16_t *)a.data)[5], 2);
    mpio_array_free(&a);
    CHECK_OK(mpio_npy_load(data_path(path, sizeof path, "tests/data/v3_u8.npy"), &a, &e), e);
    CHECK_EQ(a.ndim, 2);
    CHECK_EQ(a.shape[0], 7);
    CHECK_EQ(a.shape[1], 1);
    CHECK_EQ(((uint8_t *)a.data)[6], 6);
    mpio_array_free(&a);
}

static void test_npy_corruptions(void) {
    size_t len;
    uint8_t *b;
    /* truncated data: 3 int32 promised, 10 bytes present */
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }\n", 10, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "promises 3 elements = 12 data bytes, the file holds 10");
    /* trailing bytes are a lie too */
    free(b);
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }\n", 13, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "the file holds 13");
    free(b);
    /* shape product not matching the bytes */
    b = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }\n", 40, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "promises 12 elements = 96 data bytes");
    free(b);
    /* header length larger than the file */
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }\n", 0, &len);
    b[8] = 0xff;
    b[9] = 0x7f;
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "header length 32767 is larger than");
    free(b);
    /* bad magic */
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (0,), }\n", 0, &len);
    b[1] = 'X';
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "bad magic");
    b[1] = 'N';
    b[6] = 9;
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "format version 9.0 is unknown");
    free(b);
    /* big-endian and object dtypes */
    b = make_npy(1, "{'descr': '>i4', 'fortran_order': False, 'shape': (1,), }\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "is big-endian");
    free(b);
    b = make_npy(1, "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n", 8, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "object array");
    free(b);
    b = make_npy(1, "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "structured dtype");
    free(b);
    /* a valid dtype maskpack does not read */
    b = make_npy(1, "{'descr': '<u4', 'fortran_order': False, 'shape': (1,), }\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_UNSUPPORTED, "'<u4' is not supported");
    free(b);
    /* huge dimensions: the element count overflows int64, and one dimension beyond int64 */
    b = make_npy(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }\n", 0, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "overflows int64");
    free(b);
    /* the message keeps the shape (it was formatted after the shape was cleared: "dimension 1 = 0") */
    b = make_npy(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }\n", 0, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT,
                     "shape [4294967296, 4294967296, 2]: element count overflows int64 at dimension 1 (4294967296)");
    free(b);
    /* with a zero dimension the array is empty, however large the others: no overflow, no bytes */
    b = make_npy(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 0), }\n", 0, &len);
    mpio_array za;
    maskpack_error ze;
    CHECK_OK(mpio_npy_parse(b, len, &za, &ze), ze);
    CHECK_EQ(za.nbytes, 0);
    mpio_array_free(&za);
    free(b);
    b = make_npy(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1152921504606846976,), }\n", 0, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "byte size of 1152921504606846976 elements overflows");
    free(b);
    b = make_npy(1, "{'descr': '<i1', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 0, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "does not fit in int64");
    free(b);
    /* malformed dicts */
    b = make_npy(1, "{'descr': '<i4', 'shape': (1,), }\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "missing key 'fortran_order'");
    free(b);
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), 'extra': 1}\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "unexpected or repeated key 'extra'");
    free(b);
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': Maybe, 'shape': (1,), }\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "'fortran_order' expected True or False");
    free(b);
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (-1,), }\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "expected a non-negative integer");
    free(b);
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), } junk", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_FORMAT, "unexpected bytes after the dict");
    free(b);
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", 4, &len);
    expect_npy_error(b, len, MASKPACK_ERR_UNSUPPORTED, "more than 8 dimensions");
    free(b);
    expect_npy_error((const uint8_t *)"\x93NUMPY", 6, MASKPACK_ERR_FORMAT, "bad magic");
}

/* ---- zip / .npz ------------------------------------------------------------------------------------- */

static void check_batch(const mpio_arrayset *s) {
    CHECK_EQ(s->n, 2);
    const mpio_array *m = mpio_arrayset_find(s, "attention_mask");
    const mpio_array *c = mpio_arrayset_find(s, "cu_seqlens");
    CHECK(m && c);
    if (!m || !c) return;
    CHECK_EQ(m->dtype, MASKPACK_I64);
    CHECK_EQ(m->shape[0], 2);
    CHECK_EQ(m->shape[1], 4);
    int64_t want[8] = {1, 1, 1, 0, 0, 1, 1, 1};
    for (int i = 0; i < 8; i++) CHECK_EQ(((int64_t *)m->data)[i], want[i]);
    CHECK_EQ(c->dtype, MASKPACK_I32);
    CHECK_EQ(((int32_t *)c->data)[2], 6);
    CHECK(mpio_arrayset_find(s, "attention_mask.npy") == NULL); /* names lose ".npy" */
}

static void test_npz_files_from_numpy(void) {
    char path[1024];
    mpio_arrayset s;
    maskpack_error e;
    CHECK_OK(mpio_npz_load(data_path(path, sizeof path, "tests/data/stored.npz"), &s, &e), e);
    check_batch(&s);
    mpio_arrayset_free(&s);
    CHECK_OK(mpio_npz_load(data_path(path, sizeof path, "tests/data/deflated.npz"), &s, &e), e);
    check_batch(&s);
    mpio_arrayset_free(&s);
    /* the sample batch: 4 members, deflated with zip64 local headers */
    CHECK_OK(mpio_load_any(data_path(path, sizeof path, "data/sample_batch.npz"), &s, &e), e);
    CHECK_EQ(s.n, 4);
    const mpio_array *pos = mpio_arrayset_find(&s, "position_ids");
    CHECK(pos != NULL);
    if (pos) {
        CHECK_EQ(((int64_t *)pos->data)[16 + 7], 0);  /* row 1: second document starts at 7 */
        CHECK_EQ(((int64_t *)pos->data)[16 + 12], 5); /* ... and ends at 12 */
    }
    mpio_arrayset_free(&s);
    /* one member by name, with or without ".npy"; a missing one is NOT_FOUND */
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(mpio_read_file(data_path(path, sizeof path, "tests/data/deflated.npz"), 1 << 20, &buf, &len, &e), e);
    mpio_array a;
    CHECK_OK(mpio_npz_parse_member(buf, len, "cu_seqlens", &a, &e), e);
    CHECK(strcmp(a.name, "cu_seqlens") == 0);
    CHECK_EQ(a.shape[0], 3);
    mpio_array_free(&a);
    CHECK_OK(mpio_npz_parse_member(buf, len, "cu_seqlens.npy", &a, &e), e);
    mpio_array_free(&a);
    CHECK_STATUS(mpio_npz_parse_member(buf, len, "labels", &a, &e), MASKPACK_ERR_NOT_FOUND, e);
    CHECK_MSG(e, "no member 'labels' or 'labels.npy'");
    CHECK_EQ(mpio_detect(buf, len), MPIO_KIND_NPZ);
    free(buf);
}

static void test_npz_round_trip(void) {
    int64_t mask[6] = {1, 1, 0, 1, 1, 1};
    int32_t cu[3] = {0, 2, 5};
    uint8_t big[5000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i % 7 == 0);
    int64_t s_mask[2] = {2, 3}, s_cu[1] = {3}, s_big[1] = {5000};
    mpio_named_tensor items[3] = {
        {"attention_mask", maskpack_tensor_contiguous(mask, MASKPACK_I64, 2, s_mask)},
        {"cu_seqlens", maskpack_tensor_contiguous(cu, MASKPACK_I32, 1, s_cu)},
        {"big", maskpack_tensor_contiguous(big, MASKPACK_BOOL, 1, s_big)},
    };
    for (int deflate = 0; deflate <= 1; deflate++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        maskpack_error e;
        CHECK_OK(mpio_npz_encode(items, 3, deflate, &buf, &len, &e), e);
        if (deflate)
            CHECK(len < 5000); /* the sparse bool member compresses */
        else
            CHECK(len > 5000);
        mpio_zip *z = NULL;
        CHECK_OK(mpio_zip_open(buf, len, &z, &e), e);
        CHECK_EQ(mpio_zip_count(z), 3);
        CHECK(strcmp(mpio_zip_name(z, 1), "cu_seqlens.npy") == 0);
        mpio_zip_close(z);
        mpio_arrayset s;
        CHECK_OK(mpio_npz_parse(buf, len, &s, &e), e);
        CHECK_EQ(s.n, 3);
        CHECK(strcmp(s.arrays[0].name, "attention_mask") == 0);
        CHECK(memcmp(s.arrays[0].data, mask, sizeof mask) == 0);
        CHECK(memcmp(s.arrays[1].data, cu, sizeof cu) == 0);
        CHECK(memcmp(s.arrays[2].data, big, sizeof big) == 0);
        CHECK_EQ(s.arrays[2].dtype, MASKPACK_BOOL);
        mpio_arrayset_free(&s);
        free(buf);
    }
    /* writer refusals */
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_error e;
    mpio_named_tensor dup[2] = {items[0], items[0]};
    CHECK_STATUS(mpio_npz_encode(dup, 2, 0, &buf, &len, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "repeats items[0]");
    /* the first item that repeats an earlier name is reported, with the earliest one it repeats */
    mpio_named_tensor five[5] = {items[0], items[1], items[2], items[1], items[0]};
    five[2].name = "c";
    CHECK_STATUS(mpio_npz_encode(five, 5, 0, &buf, &len, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "items[3].name: 'cu_seqlens' repeats items[1]");
    CHECK_EQ(e.index[0], 3);
    uint16_t h[2] = {0, 0};
    int64_t two = 2;
    mpio_named_tensor bf = {"w", maskpack_tensor_contiguous(h, MASKPACK_BF16, 1, &two)};
    CHECK_STATUS(mpio_npz_encode(&bf, 1, 0, &buf, &len, &e), MASKPACK_ERR_UNSUPPORTED, e);
    /* an empty archive is valid */
    CHECK_OK(mpio_npz_encode(NULL, 0, 0, &buf, &len, &e), e);
    CHECK_EQ(len, 22);
    mpio_arrayset s;
    CHECK_OK(mpio_npz_parse(buf, len, &s, &e), e);
    CHECK_EQ(s.n, 0);
    mpio_arrayset_free(&s);
    free(buf);
}

/* The zip64 forms, with the threshold lowered so a few KiB exercise them (the real threshold is
 * 0xFFFFFFFF; the reader is the one numpy-written zip64 archives are tested against above). The
 * members are the round-trip test's: 48 + 12 + 5000 bytes of data plus .npy headers. */
typedef struct {
    int64_t mask[6];
    int32_t cu[3];
    uint8_t big[5000];
    mpio_named_tensor items[3];
} zip64_items;

static void zip64_fill(zip64_items *z) {
    static const int64_t s_mask[2] = {2, 3}, s_cu[1] = {3}, s_big[1] = {5000};
    for (int i = 0; i < 6; i++) z->mask[i] = i % 3 != 2;
    for (int i = 0; i < 3; i++) z->cu[i] = (int32_t)(i * i + i);
    for (size_t i = 0; i < sizeof z->big; i++) z->big[i] = (uint8_t)(i % 7 == 0);
    z->items[0] = (mpio_named_tensor){"attention_mask", maskpack_tensor_contiguous(z->mask, MASKPACK_I64, 2, s_mask)};
    z->items[1] = (mpio_named_tensor){"cu_seqlens", maskpack_tensor_contiguous(z->cu, MASKPACK_I32, 1, s_cu)};
    z->items[2] = (mpio_named_tensor){"big", maskpack_tensor_contiguous(z->big, MASKPACK_BOOL, 1, s_big)};
}

static int has_sig(const uint8_t *b, size_t len, uint32_t sig) {
    for (size_t i = 0; i + 4 <= len; i++)
        if (b[i] == (sig & 0xff) && b[i + 1] == ((sig >> 8) & 0xff) && b[i + 2] == ((sig >> 16) & 0xff) &&
            b[i + 3] == sig >> 24)
            return 1;
    return 0;
}

static void test_npz_zip64_writer(void) {
    zip64_items z;
    zip64_fill(&z);
    maskpack_error e;
    /* threshold 200: the first member (offset 0, ~180 bytes) stays classic, the bool member's sizes
     * and the later offsets and the directory's offset take the zip64 forms; threshold 2 also
     * forces the member count into the zip64 end record */
    const uint64_t limits[3] = {0xffffffffu, 200, 2};
    for (int li = 0; li < 3; li++)
        for (int deflate = 0; deflate <= 1; deflate++) {
            uint8_t *buf = NULL;
            size_t len = 0;
            CHECK_OK(mpio_npz_encode_zip64_from(z.items, 3, deflate, limits[li], &buf, &len, &e), e);
            /* classic output is byte-identical to mpio_npz_encode's */
            if (li == 0) {
                uint8_t *ref = NULL;
                size_t rl = 0;
                CHECK_OK(mpio_npz_encode(z.items, 3, deflate, &ref, &rl, &e), e);
                CHECK(rl == len && memcmp(ref, buf, len) == 0);
                free(ref);
            }
            CHECK_EQ(has_sig(buf, len, 0x06064b50u), li > 0); /* zip64 end record */
            CHECK_EQ(has_sig(buf, len, 0x07064b50u), li > 0); /* its locator */
            /* first local header: version 20 unless its own sizes reach the threshold */
            CHECK_EQ(buf[4], li == 2 ? 45 : 20);
            /* the classic end record: count saturated only when the count reaches the threshold */
            const uint8_t *eocd = buf + len - 22;
            CHECK_EQ(eocd[8] | (eocd[9] << 8), li == 2 ? 0xffff : 3);
            CHECK_EQ(eocd[16] == 0xff && eocd[17] == 0xff && eocd[18] == 0xff && eocd[19] == 0xff, li > 0);
            mpio_arrayset s;
            CHECK_OK(mpio_npz_parse(buf, len, &s, &e), e);
            CHECK_EQ(s.n, 3);
            if (s.n == 3) {
                CHECK(strcmp(s.arrays[2].name, "big") == 0);
                CHECK(memcmp(s.arrays[0].data, z.mask, sizeof z.mask) == 0);
                CHECK(memcmp(s.arrays[1].data, z.cu, sizeof z.cu) == 0);
                CHECK(memcmp(s.arrays[2].data, z.big, sizeof z.big) == 0);
            }
            mpio_arrayset_free(&s);
            free(buf);
        }
    /* many members: 70000 (past the classic 16-bit count) at the real threshold */
    enum { MANY = 70000 };
    mpio_named_tensor *many = calloc(MANY, sizeof *many);
    char *names = calloc(MANY, 8);
    uint8_t one = 1;
    int64_t n1 = 1;
    for (int i = 0; i < MANY; i++) {
        snprintf(names + 8 * i, 8, "m%d", i);
        many[i] = (mpio_named_tensor){names + 8 * i, maskpack_tensor_contiguous(&one, MASKPACK_U8, 1, &n1)};
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(mpio_npz_encode(many, MANY, 0, &buf, &len, &e), e);
    CHECK(has_sig(buf, len, 0x06064b50u));
    mpio_zip *zz = NULL;
    CHECK_OK(mpio_zip_open(buf, len, &zz, &e), e);
    CHECK_EQ(mpio_zip_count(zz), MANY);
    if (zz) CHECK(strcmp(mpio_zip_name(zz, MANY - 1), "m69999.npy") == 0);
    mpio_zip_close(zz);
    free(buf);
    free(many);
    free(names);
}

/* test_io --write-zip64 PATH: writes the zip64 test archive (threshold 200, deflated) for the
 * cross-check with Python's zipfile (tests/c/check_zip64.py). */
static int write_zip64(const char *path) {
    zip64_items z;
    zip64_fill(&z);
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_error e;
    if (mpio_npz_encode_zip64_from(z.items, 3, 1, 200, &buf, &len, &e) || mpio_write_file(path, buf, len, &e)) {
        fprintf(stderr, "%s\n", e.message);
        free(buf);
        return 1;
    }
    free(buf);
    return 0;
}

/* A STORED archive with one int32 member, for the corruption tests. Offsets: local header at 0, name
 * "x.npy" at 30, data at 35; the central directory follows. */
static uint8_t *stored_archive(size_t *len, size_t *data_at, size_t *cd_at) {
    int32_t v[4] = {1, 2, 3, 4};
    int64_t four = 4;
    mpio_named_tensor it = {"x", maskpack_tensor_contiguous(v, MASKPACK_I32, 1, &four)};
    uint8_t *buf = NULL;
    maskpack_error e;
    CHECK_OK(mpio_npz_encode(&it, 1, 0, &buf, len, &e), e);
    *data_at = 30 + 5;
    *cd_at = *len - 22 - 46 - 5;
    return buf;
}

static void expect_npz_error(const uint8_t *b, size_t len, maskpack_status want, const char *fragment) {
    mpio_arrayset s;
    maskpack_error e;
    CHECK_STATUS(mpio_npz_parse(b, len, &s, &e), want, e);
    CHECK_MSG(e, fragment);
    CHECK(s.n == 0 && s.arrays == NULL);
}

static void test_npz_corruptions(void) {
    size_t len, data_at, cd_at;
    uint8_t *b = stored_archive(&len, &data_at, &cd_at);
    CHECK_EQ(b[cd_at], 'P');
    CHECK_EQ(b[cd_at + 1], 'K');
    CHECK_EQ(b[cd_at + 2], 1);
    /* bad CRC: one data byte changed (the last element) */
    b[cd_at - 1] ^= 0x40;
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "CRC-32 mismatch");
    b[cd_at - 1] ^= 0x40;
    /* truncated: the end record is gone */
    expect_npz_error(b, len - 5, MASKPACK_ERR_FORMAT, "no end-of-central-directory record");
    expect_npz_error(b, 10, MASKPACK_ERR_FORMAT, "too few for a zip archive");
    /* the local header's size disagrees with the directory */
    b[18] ^= 1;
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "disagrees with the central directory");
    b[18] ^= 1;
    /* the local header names another file */
    b[30] = 'y';
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "names another file");
    b[30] = 'x';
    /* the directory points outside the archive */
    uint8_t *e = b + len - 22;
    e[16] ^= 0x80;
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "central directory");
    e[16] ^= 0x80;
    /* more entries claimed than the directory can hold */
    e[10] = 9;
    e[8] = 9;
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "claims 9 entries");
    e[10] = 1;
    e[8] = 1;
    /* an unsupported method and encryption */
    b[cd_at + 10] = 12;
    b[8] = 12;
    expect_npz_error(b, len, MASKPACK_ERR_UNSUPPORTED, "compression method 12");
    b[cd_at + 10] = 0;
    b[8] = 0;
    b[cd_at + 8] |= 1;
    expect_npz_error(b, len, MASKPACK_ERR_UNSUPPORTED, "encrypted");
    b[cd_at + 8] &= (uint8_t)~1u;
    /* STORED with compressed size != size */
    b[cd_at + 20] ^= 2;
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "STORED member 'x.npy' has compressed size");
    b[cd_at + 20] ^= 2;
    /* the member's .npy itself lies: fixed CRC so only the npy layer objects */
    mpio_arrayset s;
    maskpack_error err;
    CHECK_OK(mpio_npz_parse(b, len, &s, &err), err);
    mpio_arrayset_free(&s);
    free(b);

    /* a DEFLATED member whose declared size is larger than what it inflates to */
    uint8_t zeros[4096] = {0};
    int64_t n = 4096;
    mpio_named_tensor it = {"z", maskpack_tensor_contiguous(zeros, MASKPACK_U8, 1, &n)};
    maskpack_error er;
    CHECK_OK(mpio_npz_encode(&it, 1, 1, &b, &len, &er), er);
    CHECK_EQ(b[8], 8); /* deflated */
    size_t cd = len - 22 - 46 - 5;
    uint32_t size = (uint32_t)b[22] | ((uint32_t)b[23] << 8);
    size += 1;
    b[22] = (uint8_t)size;
    b[23] = (uint8_t)(size >> 8);
    b[cd + 24] = (uint8_t)size;
    b[cd + 25] = (uint8_t)(size >> 8);
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "inflates to");
    /* a size no deflate stream of that length can produce */
    b[25] = 0x7f;
    b[cd + 27] = 0x7f;
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "more than deflate can produce");
    b[25] = 0;
    b[cd + 27] = 0;
    size -= 2;
    b[22] = (uint8_t)size;
    b[23] = (uint8_t)(size >> 8);
    b[cd + 24] = (uint8_t)size;
    b[cd + 25] = (uint8_t)(size >> 8);
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "more than its declared");
    /* corrupt deflate data */
    memset(b + 35, 0xff, 4);
    expect_npz_error(b, len, MASKPACK_ERR_FORMAT, "deflate stream");
    free(b);

    /* a zip64 end record without its locator */
    uint8_t eocd[22] = {'P', 'K', 5, 6, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    expect_npz_error(eocd, 22, MASKPACK_ERR_FORMAT, "zip64 markers");
}

/* A deflated member written with zlib directly, in a zip assembled by hand: checks the reader against
 * an independent deflate producer (level 9, a different stream than the writer's level 6). */
static void test_npz_hand_deflated(void) {
    int32_t v[64];
    for (int i = 0; i < 64; i++) v[i] = i / 8;
    int64_t n = 64;
    maskpack_tensor t = maskpack_tensor_contiguous(v, MASKPACK_I32, 1, &n);
    uint8_t *npy = NULL;
    size_t npy_len = 0;
    maskpack_error e;
    CHECK_OK(mpio_npy_encode(&t, &npy, &npy_len, &e), e);
    uint8_t comp[1024];
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    CHECK(deflateInit2(&zs, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY) == Z_OK);
    zs.next_in = npy;
    zs.avail_in = (uInt)npy_len;
    zs.next_out = comp;
    zs.avail_out = sizeof comp;
    CHECK(deflate(&zs, Z_FINISH) == Z_STREAM_END);
    uint32_t clen = (uint32_t)zs.total_out;
    deflateEnd(&zs);
    uint32_t crc = (uint32_t)crc32(0, npy, (uInt)npy_len);
    const char *name = "attention_mask.npy";
    uint32_t nlen = (uint32_t)strlen(name);
    uint8_t zip[2048];
    size_t p = 0;
#define PUT16(v) (zip[p++] = (uint8_t)(v), zip[p++] = (uint8_t)((v) >> 8))
#define PUT32(v) (PUT16((v)&0xffff), PUT16((uint32_t)(v) >> 16))
    PUT32(0x04034b50u);
    PUT16(20);
    PUT16(0);
    PUT16(8);
    PUT16(0);
    PUT16(0x21);
    PUT32(crc);
    PUT32(clen);
    PUT32((uint32_t)npy_len);
    PUT16(nlen);
    PUT16(0);
    memcpy(zip + p, name, nlen);
    p += nlen;
    memcpy(zip + p, comp, clen);
    p += clen;
    size_t cd = p;
    PUT32(0x02014b50u);
    PUT16(20);
    PUT16(20);
    PUT16(0);
    PUT16(8);
    PUT16(0);
    PUT16(0x21);
    PUT32(crc);
    PUT32(clen);
    PUT32((uint32_t)npy_len);
    PUT16(nlen);
    PUT16(0);
    PUT16(0);
    PUT16(0);
    PUT16(0);
    PUT32(0);
    PUT32(0);
    memcpy(zip + p, name, nlen);
    p += nlen;
    size_t cd_size = p - cd;
    PUT32(0x06054b50u);
    PUT16(0);
    PUT16(0);
    PUT16(1);
    PUT16(1);
    PUT32((uint32_t)cd_size);
    PUT32((uint32_t)cd);
    PUT16(3);
    memcpy(zip + p, "hi!", 3);
    p += 3; /* an archive comment */
#undef PUT16
#undef PUT32
    mpio_array a;
    CHECK_OK(mpio_npz_parse_member(zip, p, "attention_mask", &a, &e), e);
    CHECK_EQ(a.shape[0], 64);
    CHECK(memcmp(a.data, v, sizeof v) == 0);
    mpio_array_free(&a);
    /* a comment that does not reach the end of the file hides the end record */
    expect_npz_error(zip, p - 1, MASKPACK_ERR_FORMAT, "no end-of-central-directory record");
    free(npy);
}

/* ---- .safetensors -------------------------------------------------------------------------------- */

static void expect_st_error(const char *json, size_t nbytes, maskpack_status want, const char *fragment) {
    size_t len;
    uint8_t *b = make_st(json, nbytes, &len);
    mpio_arrayset s;
    maskpack_error e;
    CHECK_STATUS(mpio_safetensors_parse(b, len, &s, &e), want, e);
    CHECK_MSG(e, fragment);
    CHECK(s.n == 0);
    free(b);
}

static void test_safetensors(void) {
    char path[1024];
    mpio_arrayset s;
    maskpack_error e;
    uint8_t *b = NULL;
    size_t len = 0;
    /* written per the specification by tools/make_test_data.py; header order a, b, m; data m, a, b */
    CHECK_OK(mpio_safetensors_load(data_path(path, sizeof path, "tests/data/multi.safetensors"), &s, &e), e);
    CHECK_EQ(s.n, 3);
    const mpio_array *a = mpio_arrayset_find(&s, "a"), *fb = mpio_arrayset_find(&s, "b"),
                     *m = mpio_arrayset_find(&s, "m");
    CHECK(a && fb && m);
    if (a && fb && m) {
        CHECK_EQ(a->dtype, MASKPACK_I64);
        CHECK_EQ(a->shape[1], 3);
        CHECK_EQ(((int64_t *)a->data)[5], 5);
        CHECK_EQ(fb->dtype, MASKPACK_F32);
        CHECK(((float *)fb->data)[0] == 0.5f && ((float *)fb->data)[3] == 8.0f);
        CHECK_EQ(m->dtype, MASKPACK_BOOL);
        CHECK_EQ(((uint8_t *)m->data)[1], 0);
        CHECK_EQ(((uint8_t *)m->data)[2], 1);
    }
    CHECK(mpio_arrayset_find(&s, "__metadata__") == NULL);
    mpio_arrayset_free(&s);

    /* round trip through the writer, bfloat16 included (safetensors has it) */
    uint16_t w[4] = {0x3f80, 0x4000, 0xbf80, 0};
    int32_t cu[3] = {0, 4, 9};
    int64_t s_w[2] = {2, 2}, s_cu[1] = {3}, s_e[2] = {0, 5};
    mpio_named_tensor items[3] = {{"w", maskpack_tensor_contiguous(w, MASKPACK_BF16, 2, s_w)},
                                  {"cu_seqlens", maskpack_tensor_contiguous(cu, MASKPACK_I32, 1, s_cu)},
                                  {"empty", maskpack_tensor_contiguous(NULL, MASKPACK_F32, 2, s_e)}};
    uint8_t *buf = NULL;
    CHECK_OK(mpio_safetensors_encode(items, 3, &buf, &len, &e), e);
    CHECK_EQ((buf[0] | (buf[1] << 8)) % 8, 0); /* header padded to 8 */
    CHECK_EQ(mpio_detect(buf, len), MPIO_KIND_SAFETENSORS);
    CHECK_OK(mpio_safetensors_parse(buf, len, &s, &e), e);
    CHECK_EQ(s.n, 3);
    CHECK_EQ(s.arrays[0].dtype, MASKPACK_BF16);
    CHECK(memcmp(s.arrays[0].data, w, sizeof w) == 0);
    CHECK(memcmp(s.arrays[1].data, cu, sizeof cu) == 0);
    CHECK_EQ(s.arrays[2].nbytes, 0);
    CHECK_EQ(s.arrays[2].shape[1], 5);
    mpio_arrayset_free(&s);
    /* header length larger than the file */
    buf[0] = 0xff;
    buf[1] = 0xff;
    CHECK_STATUS(mpio_safetensors_parse(buf, len, &s, &e), MASKPACK_ERR_FORMAT, e);
    CHECK_MSG(e, "is larger than the file");
    free(buf);

    /* a key that is not UTF-8, and overlong or surrogate encodings, are refused (were accepted) */
    expect_st_error("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, MASKPACK_ERR_FORMAT,
                    "header is not valid UTF-8 (byte 3 of the header, 0xff)");
    expect_st_error("{\"\xc0\xaf"
                    "a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                    4, MASKPACK_ERR_FORMAT, "not valid UTF-8");
    expect_st_error("{\"\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                    MASKPACK_ERR_FORMAT, "not valid UTF-8");
    /* __metadata__ is an object (a list or a number was accepted) */
    expect_st_error("{\"__metadata__\":[1],\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                    MASKPACK_ERR_FORMAT, "__metadata__ must be an object, found an array");
    expect_st_error("{\"__metadata__\":7,\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                    MASKPACK_ERR_FORMAT, "__metadata__ must be an object, found a scalar");
    {
        /* valid multi-byte UTF-8 names and string metadata load */
        size_t ulen;
        uint8_t *ub =
            make_st("{\"__metadata__\":{\"k\":\"v\"},\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":{\"dtype\":\"U8\","
                    "\"shape\":[4],\"data_offsets\":[0,4]}}",
                    4, &ulen);
        mpio_arrayset us;
        maskpack_error ue;
        CHECK_OK(mpio_safetensors_parse(ub, ulen, &us, &ue), ue);
        CHECK_EQ(us.n, 1);
        mpio_arrayset_free(&us);
        free(ub);
    }
    expect_st_error("{\"a\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12, MASKPACK_ERR_FORMAT,
                    "shape x I32 needs 16 bytes, data_offsets span 12");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                    6, MASKPACK_ERR_FORMAT, "overlap");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 6, MASKPACK_ERR_FORMAT,
                    "lie outside the 6-byte data section");
    expect_st_error("{\"a\":{\"dtype\":\"I64\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0,
                    MASKPACK_ERR_FORMAT, "below 2^53");
    expect_st_error("{\"a\":{\"dtype\":\"I64\",\"shape\":[4503599627370496,4503599627370496],\"data_offsets\":[0,0]}}",
                    0, MASKPACK_ERR_FORMAT, "element count overflows int64 at dimension 1 (4503599627370496)");
    { /* a zero dimension after huge ones: no element, no overflow (as the .npy reader decides) */
        size_t zl;
        uint8_t *zb = make_st("{\"a\":{\"dtype\":\"I64\",\"shape\":[4294967296,4294967296,0],"
                              "\"data_offsets\":[0,0]}}",
                              0, &zl);
        mpio_arrayset zs;
        maskpack_error ze;
        CHECK_OK(mpio_safetensors_parse(zb, zl, &zs, &ze), ze);
        CHECK(zs.n == 1 && zs.arrays[0].ndim == 3 && zs.arrays[0].shape[0] == 4294967296LL &&
              zs.arrays[0].shape[2] == 0);
        mpio_arrayset_free(&zs);
        free(zb);
        /* and the writer keeps every digit of such an extent (printed as a double it lost the last) */
        int64_t big[3] = {429, 7649962429496729LL, 0};
        mpio_named_tensor it = {"m", maskpack_tensor_contiguous(NULL, MASKPACK_I64, 3, big), NULL};
        uint8_t *wb = NULL;
        size_t wl = 0;
        CHECK_OK(mpio_safetensors_encode(&it, 1, &wb, &wl, &ze), ze);
        CHECK_OK(mpio_safetensors_parse(wb, wl, &zs, &ze), ze);
        CHECK(zs.n == 1 && zs.arrays[0].shape[1] == 7649962429496729LL && zs.arrays[0].shape[2] == 0);
        mpio_arrayset_free(&zs);
        free(wb);
    }
    expect_st_error("{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, MASKPACK_ERR_FORMAT,
                    "unknown dtype 'Q7'");
    expect_st_error("{\"a\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, MASKPACK_ERR_UNSUPPORTED,
                    "dtype U32, which is not supported");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                    2, MASKPACK_ERR_FORMAT, "appears twice");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 1, MASKPACK_ERR_FORMAT,
                    "not valid JSON");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} x", 1, MASKPACK_ERR_FORMAT,
                    "unexpected bytes after");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, MASKPACK_ERR_FORMAT,
                    "shape[0] is not a non-negative integer");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1, MASKPACK_ERR_FORMAT,
                    "lie outside");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, MASKPACK_ERR_FORMAT, "needs a string 'dtype'");
    /* metadata is ignored, whatever it holds; empty tensors may sit anywhere */
    b = make_st("{\"__metadata__\":{\"k\":[1,2]},\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[1,1]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                2, &len);
    CHECK_OK(mpio_safetensors_parse(b, len, &s, &e), e);
    CHECK_EQ(s.n, 2);
    CHECK(strcmp(s.arrays[0].name, "e") == 0 && strcmp(s.arrays[1].name, "a") == 0);
    CHECK_EQ(((uint8_t *)s.arrays[1].data)[1], 1);
    mpio_arrayset_free(&s);
    free(b);
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    CHECK_STATUS(mpio_safetensors_parse(tiny, 5, &s, &e), MASKPACK_ERR_FORMAT, e);
    CHECK_MSG(e, "too few");
}

/* ---- files, detection -------------------------------------------------------------------------------- */

static void test_files(void) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, "/tmp/maskpack_test_io_%ld.npz", (long)getpid());
    int64_t v[3] = {5, 6, 7};
    int64_t three = 3;
    mpio_named_tensor it = {"position_ids", maskpack_tensor_contiguous(v, MASKPACK_I64, 1, &three)};
    maskpack_error e;
    CHECK_OK(mpio_npz_save(tmp, &it, 1, 1, &e), e);
    mpio_arrayset s;
    CHECK_OK(mpio_load_any(tmp, &s, &e), e);
    CHECK_EQ(s.n, 1);
    CHECK_EQ(((int64_t *)s.arrays[0].data)[2], 7);
    mpio_arrayset_free(&s);
    CHECK_OK(mpio_npy_save(tmp, &it.tensor, &e), e);
    CHECK_OK(mpio_load_any(tmp, &s, &e), e);
    CHECK_EQ(s.n, 1);
    CHECK(s.arrays[0].name == NULL); /* a bare .npy has no name */
    mpio_arrayset_free(&s);
    /* a file that is none of the formats: FORMAT with the path in the message */
    CHECK_OK(mpio_write_file(tmp, "hello world", 11, &e), e);
    CHECK_STATUS(mpio_load_any(tmp, &s, &e), MASKPACK_ERR_FORMAT, e);
    CHECK_MSG(e, tmp);
    CHECK_MSG(e, "not an .npy");
    /* a truncated .npy through the path wrapper */
    CHECK_OK(mpio_write_file(tmp, "\x93NUMPY\x01\x00\x40\x00{", 11, &e), e);
    mpio_array a;
    CHECK_STATUS(mpio_npy_load(tmp, &a, &e), MASKPACK_ERR_FORMAT, e);
    CHECK_MSG(e, "header length 64 is larger than the 1 bytes");
    remove(tmp);
    /* OS errors */
    CHECK_STATUS(mpio_load_any("/nonexistent/dir/batch.npz", &s, &e), MASKPACK_ERR_IO, e);
    CHECK_MSG(e, "cannot open");
    CHECK_STATUS(mpio_npz_save("/nonexistent/dir/out.npz", &it, 1, 0, &e), MASKPACK_ERR_IO, e);
    CHECK_STATUS(mpio_load_any("/tmp", &s, &e), MASKPACK_ERR_IO, e);
    uint8_t *buf;
    size_t len;
    CHECK_OK(mpio_write_file(tmp, "0123456789", 10, &e), e);
    CHECK_STATUS(mpio_read_file(tmp, 4, &buf, &len, &e), MASKPACK_ERR_UNSUPPORTED, e);
    remove(tmp);
    CHECK_EQ(mpio_detect("\x93NUMPY", 6), MPIO_KIND_NPY);
    CHECK_EQ(mpio_detect("PK\x05\x06", 4), MPIO_KIND_NPZ);
    CHECK_EQ(mpio_detect("abc", 3), MPIO_KIND_UNKNOWN);
}

/* ---- PNG ------------------------------------------------------------------------------------------- */

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void test_png(void) {
    /* row 0: two documents [0,3) and [3,5), pad at 5; row 1: left pad 2, one document of 4 */
    maskpack_segment segs[3];
    memset(segs, 0, sizeof segs);
    segs[0].row = 0, segs[0].q_start = segs[0].kv_start = 0, segs[0].q_len = segs[0].kv_len = 3;
    segs[1].row = 0, segs[1].q_start = segs[1].kv_start = 3, segs[1].q_len = segs[1].kv_len = 2;
    segs[2].row = 1, segs[2].q_start = segs[2].kv_start = 2, segs[2].q_len = segs[2].kv_len = 4;
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(segs, 3, 2, 6, 6, 0, NULL, &L, &e), e);
    if (!L) return;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint32_t w = 0, h = 0;
    mpio_png_options opt = {4, 0}; /* 4 pixels per cell */
    CHECK_OK(mpio_png_encode_layout(L, NULL, 0, &opt, &buf, &len, &w, &h, &e), e);
    CHECK_EQ(w, 24);
    CHECK_EQ(h, 2 * 24 + 2); /* two panels and a 2-pixel separator */
    CHECK(len > 33 && memcmp(buf, "\x89PNG\r\n\x1a\n", 8) == 0);
    CHECK(memcmp(buf + 12, "IHDR", 4) == 0);
    CHECK_EQ(be32(buf + 16), 24);
    CHECK_EQ(be32(buf + 20), 50);
    CHECK_EQ(buf[24], 8); /* bit depth */
    CHECK_EQ(buf[25], 2); /* RGB */
    /* decode and look at the cells: allowed = segment colour, above the diagonal white, across
     * documents light grey, padding dark grey, separator black */
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    CHECK(png_image_begin_read_from_memory(&img, buf, len));
    img.format = PNG_FORMAT_RGB;
    uint8_t *px = malloc(PNG_IMAGE_SIZE(img));
    CHECK(png_image_finish_read(&img, NULL, px, 0, NULL));
#define PX(x, y)      (px + ((size_t)(y)*24 + (size_t)(x)) * 3)
#define CELL(b, i, j) PX((j)*4 + 1, (b)*26 + (i)*4 + 1)
    const uint8_t *c00 = CELL(0, 0, 0), *c33 = CELL(0, 3, 3), *c22r1 = CELL(1, 2, 2);
    CHECK(memcmp(c00, c33, 3) != 0); /* two documents, two colours */
    CHECK(memcmp(c00, CELL(0, 2, 1), 3) == 0);
    CHECK(memcmp(c22r1, CELL(1, 5, 3), 3) == 0);
    uint8_t white[3] = {255, 255, 255}, other[3] = {222, 222, 222}, pad[3] = {110, 110, 110}, sep[3] = {0, 0, 0};
    CHECK(memcmp(CELL(0, 0, 1), white, 3) == 0); /* causal: key after the query */
    CHECK(memcmp(CELL(0, 3, 1), other, 3) == 0); /* document 2 looking at document 1 */
    CHECK(memcmp(CELL(0, 5, 0), pad, 3) == 0);   /* pad query row */
    CHECK(memcmp(CELL(0, 1, 5), pad, 3) == 0);   /* pad key column */
    CHECK(memcmp(CELL(1, 0, 0), pad, 3) == 0);   /* left padding */
    CHECK(memcmp(PX(5, 24), sep, 3) == 0);
    CHECK(memcmp(PX(5, 25), sep, 3) == 0);
#undef CELL
#undef PX
    free(px);
    png_image_free(&img);
    free(buf);
    /* selected rows; bad rows are rejected */
    int64_t rows[1] = {1};
    CHECK_OK(mpio_png_encode_layout(L, rows, 1, NULL, &buf, &len, &w, &h, &e), e);
    CHECK_EQ(w, 6 * 32); /* automatic zoom: 1024 / 6 = 170, capped at 32 */
    CHECK_EQ(h, 6 * 32);
    free(buf);
    rows[0] = 2;
    CHECK_STATUS(mpio_png_encode_layout(L, rows, 1, NULL, &buf, &len, &w, &h, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "expected a batch row in [0, 2), found 2");
    maskpack_layout_free(L);
    /* a large packed stream is sampled down to max_side */
    int64_t lens[2] = {3000, 2000};
    CHECK_OK(maskpack_layout_from_lengths(lens, 2, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    if (!L) return;
    mpio_png_options small = {0, 500};
    CHECK_OK(mpio_png_encode_layout(L, NULL, 0, &small, &buf, &len, &w, &h, &e), e);
    CHECK_EQ(w, 500);
    CHECK_EQ(h, 500);
    free(buf);
    maskpack_layout_free(L);
}

/* Reads a whole small file into buf (NUL-terminated); returns its length or -1. */
static long slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (long)n;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *x; (x = readdir(d));)
        if (strcmp(x->d_name, ".") && strcmp(x->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* mpio_write_file never destroys what was at the path: a failed write leaves the old file as it was
 * (it used to truncate it, then remove it), a device is written in place and never removed (a failed
 * write to a link to /dev/full removed the link; as root, --out /dev/full removed the device). */
static void test_write_never_destroys(void) {
    char dir[] = "/tmp/maskpack_write_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char target[256], link_full[256], link_reg[256], got[4096];
    snprintf(target, sizeof target, "%s/out.npz", dir);
    snprintf(link_full, sizeof link_full, "%s/full", dir);
    snprintf(link_reg, sizeof link_reg, "%s/link.npz", dir);
    maskpack_error e;
    CHECK_OK(mpio_write_file(target, "old content", 11, &e), e);
    CHECK(chmod(target, 0640) == 0);

    /* a write that fails half way (file size limit: EFBIG, also as root) keeps the old file */
    static char big[4096];
    memset(big, 'x', sizeof big);
    struct rlimit old_lim, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old_lim;
    lim.rlim_cur = 1024;
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    CHECK_STATUS(mpio_write_file(target, big, sizeof big, &e), MASKPACK_ERR_IO, e);
    CHECK_MSG(e, "write failed");
    CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    signal(SIGXFSZ, old_handler);
    CHECK_EQ(slurp(target, got, sizeof got), 11);
    CHECK(strcmp(got, "old content") == 0);
    CHECK_EQ(count_entries(dir), 1); /* the temporary file is gone too */

    /* a successful rewrite replaces the content and keeps the permissions */
    CHECK_OK(mpio_write_file(target, "new", 3, &e), e);
    CHECK_EQ(slurp(target, got, sizeof got), 3);
    struct stat st;
    CHECK(stat(target, &st) == 0 && (st.st_mode & 07777) == 0640);

    /* through a link to a regular file: the file is rewritten, the link stays a link */
    CHECK(symlink("out.npz", link_reg) == 0);
    CHECK_OK(mpio_write_file(link_reg, "via link", 8, &e), e);
    CHECK(lstat(link_reg, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK_EQ(slurp(target, got, sizeof got), 8);

    /* a link to a full device: an error naming the cause; the link and the device are still there */
    CHECK(symlink("/dev/full", link_full) == 0);
    CHECK_STATUS(mpio_write_file(link_full, "data", 4, &e), MASKPACK_ERR_IO, e);
    CHECK_MSG(e, link_full);
    CHECK_MSG(e, strerror(ENOSPC));
    CHECK(lstat(link_full, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode));
    /* a directory is refused, not replaced */
    CHECK_STATUS(mpio_write_file(dir, "data", 4, &e), MASKPACK_ERR_IO, e);
    CHECK_MSG(e, "is a directory");
    CHECK_EQ(count_entries(dir), 3);

    unlink(link_full);
    unlink(link_reg);
    unlink(target);
    CHECK(rmdir(dir) == 0);
}

/* Text items: a 0-d numpy string in .npy/.npz, an entry of __metadata__ in .safetensors. */
static void test_text_items(void) {
    maskpack_error e;
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(mpio_npy_encode_text("TND", &buf, &len, &e), e);
    CHECK(contains(buf, len, "'descr': '<U3'") && contains(buf, len, "'shape': ()"));
    CHECK_EQ(len % 64, 12 % 64); /* the 64-byte header, then 3 UCS-4 code points */
    CHECK(len >= 12 && memcmp(buf + len - 12, "T\0\0\0N\0\0\0D\0\0\0", 12) == 0);
    free(buf);
    buf = NULL;
    CHECK_STATUS(mpio_npy_encode_text("", &buf, &len, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "text: expected 1 to 256 characters, found 0");
    CHECK_STATUS(mpio_npy_encode_text("a\nb", &buf, &len, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "text[1]: expected printable ASCII, found byte 0x0a");
    CHECK(buf == NULL);
    char longer[300];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    CHECK_STATUS(mpio_npy_encode_text(longer, &buf, &len, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);

    int32_t mode = 3;
    mpio_named_tensor items[2] = {
        {"npu_sparse_mode", maskpack_tensor_contiguous(&mode, MASKPACK_I32, 0, NULL), NULL},
        {"npu_input_layout", {0}, "TND"},
    };
    CHECK_OK(mpio_npz_encode(items, 2, 1, &buf, &len, &e), e);
    mpio_zip *z = NULL;
    CHECK_OK(mpio_zip_open(buf, len, &z, &e), e);
    size_t k;
    CHECK_OK(mpio_zip_find(z, "npu_input_layout.npy", &k, &e), e);
    uint8_t *member = NULL;
    size_t mlen = 0;
    CHECK_OK(mpio_zip_extract(z, k, &member, &mlen, &e), e);
    CHECK(contains(member, mlen, "'descr': '<U3'"));
    free(member);
    mpio_zip_close(z);
    free(buf);
    buf = NULL;

    CHECK_OK(mpio_safetensors_encode(items, 2, &buf, &len, &e), e);
    CHECK(contains(buf, len, "\"__metadata__\":{\"npu_input_layout\":\"TND\"}"));
    mpio_arrayset set;
    CHECK_OK(mpio_safetensors_parse(buf, len, &set, &e), e);
    CHECK(set.n == 1 && strcmp(set.arrays[0].name, "npu_sparse_mode") == 0); /* the text is metadata */
    mpio_arrayset_free(&set);
    free(buf);
    buf = NULL;
    items[1].text = "T\tD";
    CHECK_STATUS(mpio_safetensors_encode(items, 2, &buf, &len, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "npu_input_layout[1]: expected printable ASCII, found byte 0x09");
    CHECK_STATUS(mpio_npz_encode(items, 2, 0, &buf, &len, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(buf == NULL);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-zip64") == 0) return write_zip64(argv[2]);
    test_npy_round_trip_all_dtypes();
    test_npy_header_text_and_strided_write();
    test_npy_versions_and_fortran();
    test_npy_corruptions();
    test_npz_files_from_numpy();
    test_npz_round_trip();
    test_npz_zip64_writer();
    test_npz_corruptions();
    test_npz_hand_deflated();
    test_safetensors();
    test_text_items();
    test_files();
    test_write_never_destroys();
    test_png();
    return check_report("test_io");
}
