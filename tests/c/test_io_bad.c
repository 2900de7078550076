/* test_io_bad.c: the readers' guards against hostile files, each reached by a file crafted here:
 * .safetensors data_offsets that are malformed or lie outside the data section, more dimensions
 * than supported, a header that is not an object, and the writer's name checks; zip archives
 * assembled by hand (so each field can lie on its own) with a zip64 locator pointing outside the
 * archive or at no zip64 record or at another volume, a member on another volume, an extra field
 * that overruns its area, a member whose data runs past the central directory, overlapping and
 * duplicate members, a deflate stream that is truncated or ends before its compressed size, a
 * member that is not a .npy; and standard input larger than the reader's first 64 KiB buffer. Each
 * case checks the status and the message. */
#include "check.h"
#include "io.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

/* ---- .safetensors --------------------------------------------------------------------------------- */

static uint8_t *make_st(const char *json, size_t nbytes, size_t *len) {
    size_t h = strlen(json);
    *len = 8 + h + nbytes;
    uint8_t *b = calloc(*len, 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, json, h);
    return b;
}

static void expect_st(const char *json, size_t nbytes, maskpack_status want, const char *fragment) {
    size_t len;
    uint8_t *b = make_st(json, nbytes, &len);
    mpio_arrayset s;
    maskpack_error e;
    CHECK_STATUS(mpio_safetensors_parse(b, len, &s, &e), want, e);
    CHECK_MSG(e, fragment);
    CHECK(s.n == 0 && s.arrays == NULL);
    free(b);
}

static void test_safetensors_bad(void) {
    /* the control: a valid one-tensor file parses */
    size_t len;
    uint8_t *b = make_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &len);
    mpio_arrayset s;
    maskpack_error e;
    CHECK_OK(mpio_safetensors_parse(b, len, &s, &e), e);
    CHECK_EQ(s.n, 1);
    mpio_arrayset_free(&s);
    free(b);
    /* data_offsets: one number, a negative one, three numbers */
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[8]}}", 8, MASKPACK_ERR_FORMAT,
              "data_offsets must be two non-negative integers");
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[-1,7]}}", 8, MASKPACK_ERR_FORMAT,
              "data_offsets must be two non-negative integers");
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8, MASKPACK_ERR_FORMAT,
              "data_offsets must be two non-negative integers");
    /* begin after end, and an end past the data section: the out-of-bounds read guard */
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, MASKPACK_ERR_FORMAT,
              "data_offsets [8, 0] lie outside the 8-byte data section");
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8, MASKPACK_ERR_FORMAT,
              "data_offsets [4, 12] lie outside the 8-byte data section");
    /* more dimensions than MASKPACK_MAX_DIMS; a header that is JSON but not an object */
    expect_st("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
              MASKPACK_ERR_UNSUPPORTED, "dimensions, more than");
    expect_st("[1, 2]", 0, MASKPACK_ERR_FORMAT, "safetensors");

    /* UTF-8 sequences cut by the end of the header (a 2-, 3- and 4-byte lead as the last byte) */
    expect_st("{\"x\":1}\xc3", 0, MASKPACK_ERR_FORMAT, "header is not valid UTF-8");
    expect_st("{\"x\":1} \xe2\x82", 0, MASKPACK_ERR_FORMAT, "header is not valid UTF-8");
    expect_st("{\"x\":1}  \xf0", 0, MASKPACK_ERR_FORMAT, "header is not valid UTF-8");
    /* a tab and a CR/LF may pad the object; anything else after it may not */
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, MASKPACK_ERR_FORMAT,
              "unexpected bytes after the header's JSON object");
    b = make_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}\t\r\n", 8, &len);
    CHECK_OK(mpio_safetensors_parse(b, len, &s, &e), e);
    mpio_arrayset_free(&s);
    free(b);
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8, MASKPACK_ERR_FORMAT,
              "data_offsets must be two non-negative integers");
    /* a tensor entry that is not an object */
    expect_st("{\"x\":5}", 0, MASKPACK_ERR_FORMAT, "x");
    /* __metadata__ that is a string or a number; offsets that are not numbers */
    expect_st("{\"__metadata__\":\"v1\"}", 0, MASKPACK_ERR_FORMAT, "__metadata__ must be an object, found a string");
    expect_st("{\"__metadata__\":7}", 0, MASKPACK_ERR_FORMAT, "__metadata__ must be an object, found a scalar");
    expect_st("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[\"0\",8]}}", 8, MASKPACK_ERR_FORMAT,
              "data_offsets must be two non-negative integers");
    /* two tensors on the same first byte (one of them empty) are read; two overlapping ones are not */
    b = make_st("{\"a\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                8, &len);
    CHECK_OK(mpio_safetensors_parse(b, len, &s, &e), e);
    CHECK_EQ(s.n, 2);
    mpio_arrayset_free(&s);
    free(b);
    expect_st("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
              4, MASKPACK_ERR_FORMAT, "overlap");

    /* the writer refuses a reserved or duplicated name */
    int32_t v[2] = {1, 2};
    int64_t two = 2;
    mpio_named_tensor it[2] = {{"__metadata__", maskpack_tensor_contiguous(v, MASKPACK_I32, 1, &two)},
                               {"a", maskpack_tensor_contiguous(v, MASKPACK_I32, 1, &two)}};
    uint8_t *out = NULL;
    size_t olen = 0;
    CHECK_STATUS(mpio_safetensors_encode(it, 1, &out, &olen, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "items[0].name: expected a non-empty name other than __metadata__");
    CHECK(e.index[0] == 0 && strcmp(e.argument, "items") == 0);
    it[0].name = "a";
    CHECK_STATUS(mpio_safetensors_encode(it, 2, &out, &olen, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "a");
    CHECK(out == NULL);
}

/* ---- zip archives by hand --------------------------------------------------------------------------- */

typedef struct zbuf {
    uint8_t *p;
    size_t n, cap;
} zbuf;

static void put(zbuf *z, const void *src, size_t n) {
    if (z->n + n > z->cap) {
        z->cap = (z->n + n) * 2 + 64;
        z->p = realloc(z->p, z->cap);
    }
    memcpy(z->p + z->n, src, n);
    z->n += n;
}
static void put16(zbuf *z, uint32_t v) {
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(z, b, 2);
}
static void put32(zbuf *z, uint32_t v) {
    put16(z, v & 0xffffu);
    put16(z, v >> 16);
}
static void put64(zbuf *z, uint64_t v) {
    put32(z, (uint32_t)v);
    put32(z, (uint32_t)(v >> 32));
}

/* One member as written: its stored bytes (raw deflate when method 8), the size it inflates to, and
 * what the headers claim. comp_extra adds to the compressed size both headers declare (the bytes
 * after the stream are `pad` zero bytes written after it). */
typedef struct zmember {
    const char *name;
    const uint8_t *data; /* bytes written as the member's data */
    size_t data_len;
    uint32_t method, size, crc;
    size_t pad;            /* zero bytes written after the data, counted in its compressed size */
    int64_t comp_adjust;   /* added to the compressed size both headers declare */
    uint16_t disk;         /* the central entry's disk number */
    const uint8_t *cextra; /* the central entry's extra field */
    size_t cextra_len;
} zmember;

/* The archive; *cd_at gets the central directory's offset. tail: bytes written between the central
 * directory and the end record (a zip64 locator, say), with the end record's directory fields
 * unchanged. */
static uint8_t *zip_build(const zmember *m, size_t n, const uint8_t *tail, size_t tail_len, size_t *len,
                          size_t *cd_at) {
    zbuf z = {0};
    size_t off[8];
    for (size_t i = 0; i < n; i++) {
        off[i] = z.n;
        const uint32_t comp = (uint32_t)((int64_t)(m[i].data_len + m[i].pad) + m[i].comp_adjust);
        put32(&z, 0x04034b50u);
        put16(&z, 20);
        put16(&z, 0);
        put16(&z, m[i].method);
        put32(&z, 0);
        put32(&z, m[i].crc);
        put32(&z, comp);
        put32(&z, m[i].size);
        put16(&z, (uint32_t)strlen(m[i].name));
        put16(&z, 0);
        put(&z, m[i].name, strlen(m[i].name));
        put(&z, m[i].data, m[i].data_len);
        for (size_t k = 0; k < m[i].pad; k++) put(&z, "", 1);
    }
    const size_t cd = z.n;
    for (size_t i = 0; i < n; i++) {
        const uint32_t comp = (uint32_t)((int64_t)(m[i].data_len + m[i].pad) + m[i].comp_adjust);
        put32(&z, 0x02014b50u);
        put16(&z, 20);
        put16(&z, 20);
        put16(&z, 0);
        put16(&z, m[i].method);
        put32(&z, 0);
        put32(&z, m[i].crc);
        put32(&z, comp);
        put32(&z, m[i].size);
        put16(&z, (uint32_t)strlen(m[i].name));
        put16(&z, (uint32_t)m[i].cextra_len);
        put16(&z, 0);
        put16(&z, m[i].disk);
        put16(&z, 0);
        put32(&z, 0);
        put32(&z, (uint32_t)off[i]);
        put(&z, m[i].name, strlen(m[i].name));
        if (m[i].cextra_len) put(&z, m[i].cextra, m[i].cextra_len);
    }
    const size_t cd_size = z.n - cd;
    if (tail_len) put(&z, tail, tail_len);
    put32(&z, 0x06054b50u);
    put16(&z, 0);
    put16(&z, 0);
    put16(&z, (uint32_t)n);
    put16(&z, (uint32_t)n);
    put32(&z, (uint32_t)cd_size);
    put32(&z, (uint32_t)cd);
    put16(&z, 0);
    *len = z.n;
    if (cd_at) *cd_at = cd;
    return z.p;
}

/* a .npy of four int32 values (the member payload of the cases) */
static uint8_t *npy4(size_t *len) {
    int32_t v[4] = {7, -1, 3, 9};
    int64_t four = 4;
    maskpack_tensor t = maskpack_tensor_contiguous(v, MASKPACK_I32, 1, &four);
    uint8_t *b = NULL;
    maskpack_error e;
    CHECK_OK(mpio_npy_encode(&t, &b, len, &e), e);
    return b;
}

static zmember stored(const char *name, const uint8_t *d, size_t n) {
    zmember m = {name, d, n, 0, (uint32_t)n, (uint32_t)crc32(0, d, (uInt)n), 0, 0, 0, NULL, 0};
    return m;
}

static void expect_zip(const uint8_t *b, size_t len, maskpack_status want, const char *fragment) {
    mpio_arrayset s;
    maskpack_error e;
    CHECK_STATUS(mpio_npz_parse(b, len, &s, &e), want, e);
    CHECK_MSG(e, fragment);
    CHECK(s.n == 0 && s.arrays == NULL);
}

static void test_zip_directory(void) {
    size_t nlen, len, cd;
    uint8_t *npy = npy4(&nlen);
    zmember two[2] = {stored("a.npy", npy, nlen), stored("b.npy", npy, nlen)};

    /* the control: the hand-built archive reads back */
    uint8_t *b = zip_build(two, 2, NULL, 0, &len, &cd);
    mpio_arrayset s;
    maskpack_error e;
    CHECK_OK(mpio_npz_parse(b, len, &s, &e), e);
    CHECK_EQ(s.n, 2);
    const mpio_array *a = mpio_arrayset_find(&s, "b");
    CHECK(a && a->dtype == MASKPACK_I32 && mpio_array_numel(a) == 4 && ((const int32_t *)a->data)[3] == 9);
    mpio_arrayset_free(&s);
    /* a member index past the end */
    mpio_zip *zip = NULL;
    CHECK_OK(mpio_zip_open(b, len, &zip, &e), e);
    uint8_t *data = NULL;
    size_t dlen = 0;
    CHECK_STATUS(mpio_zip_extract(zip, 2, &data, &dlen, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "member index in [0, 2)");
    CHECK(data == NULL);
    mpio_zip_close(zip);
    free(b);

    /* the same name twice */
    zmember dup[2] = {stored("a.npy", npy, nlen), stored("a.npy", npy, nlen)};
    b = zip_build(dup, 2, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "member name 'a.npy' appears twice");
    free(b);

    /* the first member claims 20 bytes more: they are the second's local header (overlap) */
    zmember over[2] = {stored("a.npy", npy, nlen), stored("b.npy", npy, nlen)};
    over[0].comp_adjust = 20;
    over[0].size += 20;
    b = zip_build(over, 2, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "members 'a.npy' and 'b.npy' overlap");
    free(b);

    /* the last member's data claims to run into the central directory */
    zmember past[1] = {stored("a.npy", npy, nlen)};
    past[0].comp_adjust = 10;
    past[0].size += 10;
    b = zip_build(past, 1, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "run past the central directory");
    free(b);

    /* a member on volume 3 */
    zmember vol[1] = {stored("a.npy", npy, nlen)};
    vol[0].disk = 3;
    b = zip_build(vol, 1, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_UNSUPPORTED, "lives on volume 3");
    free(b);

    /* a central extra field whose declared size overruns the extra area */
    const uint8_t extra[8] = {0x99, 0x99, 100, 0, 0, 0, 0, 0};
    zmember ext[1] = {stored("a.npy", npy, nlen)};
    ext[0].cextra = extra;
    ext[0].cextra_len = sizeof extra;
    b = zip_build(ext, 1, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "extra field of 100 bytes overruns its 4-byte area");
    free(b);

    /* a member that is not a .npy: the message names the member */
    const uint8_t junk[16] = "not an npy file";
    zmember bad[1] = {stored("j.npy", junk, sizeof junk)};
    b = zip_build(bad, 1, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "member 'j.npy': ");
    free(b);
    free(npy);
}

/* zip64 locators (20 bytes before the end record): its disk fields, then where it points */
static void test_zip64_locator(void) {
    size_t nlen, len, cd;
    uint8_t *npy = npy4(&nlen);
    zmember one[1] = {stored("a.npy", npy, nlen)};
    zbuf t = {0};
    /* on another volume */
    put32(&t, 0x07064b50u);
    put32(&t, 1); /* disk with the zip64 end record */
    put64(&t, 0);
    put32(&t, 1);
    uint8_t *b = zip_build(one, 1, t.p, t.n, &len, &cd);
    expect_zip(b, len, MASKPACK_ERR_UNSUPPORTED, "multi-volume zip64");
    free(b);
    /* pointing past the archive */
    t.n = 0;
    put32(&t, 0x07064b50u);
    put32(&t, 0);
    put64(&t, 1u << 20);
    put32(&t, 1);
    b = zip_build(one, 1, t.p, t.n, &len, &cd);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "zip64 locator points at offset 1048576, outside the archive");
    free(b);
    /* pointing inside the archive, at bytes that are not a zip64 end record (the first member) */
    t.n = 0;
    put32(&t, 0x07064b50u);
    put32(&t, 0);
    put64(&t, 0);
    put32(&t, 1);
    b = zip_build(one, 1, t.p, t.n, &len, &cd);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "no zip64 end-of-central-directory record at offset 0");
    free(b);
    free(t.p);
    free(npy);
}

/* raw deflate of src (level 6) into a malloc'd buffer */
static uint8_t *deflate_raw(const uint8_t *src, size_t n, size_t *out_len) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    CHECK(deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    uint8_t *out = malloc(deflateBound(&zs, (uLong)n));
    zs.next_in = (Bytef *)(uintptr_t)src;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)deflateBound(&zs, (uLong)n);
    CHECK(deflate(&zs, Z_FINISH) == Z_STREAM_END);
    *out_len = zs.total_out;
    deflateEnd(&zs);
    return out;
}

static void test_deflate_streams(void) {
    size_t nlen, clen, len;
    uint8_t *npy = npy4(&nlen);
    uint8_t *comp = deflate_raw(npy, nlen, &clen);
    zmember m = {"d.npy", comp, clen, 8, (uint32_t)nlen, (uint32_t)crc32(0, npy, (uInt)nlen), 0, 0, 0, NULL, 0};
    /* the control */
    uint8_t *b = zip_build(&m, 1, NULL, 0, &len, NULL);
    mpio_arrayset s;
    maskpack_error e;
    CHECK_OK(mpio_npz_parse(b, len, &s, &e), e);
    CHECK(s.n == 1 && ((const int32_t *)s.arrays[0].data)[0] == 7);
    mpio_arrayset_free(&s);
    free(b);
    /* truncated: the directory declares (and the archive holds) only the first half of the stream */
    zmember cut = m;
    cut.data_len = clen / 2;
    b = zip_build(&cut, 1, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "deflate stream is truncated");
    free(b);
    /* the stream ends before the declared compressed size: 6 bytes of something else follow it */
    zmember longer = m;
    longer.pad = 6;
    b = zip_build(&longer, 1, NULL, 0, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "deflate stream ends after");
    free(b);
    free(comp);
    free(npy);
}

/* ---- more of the zip reader and writer -------------------------------------------------------------- */

static void test_zip_more(void) {
    size_t nlen, len;
    uint8_t *npy = npy4(&nlen);
    maskpack_error e;
    /* the directory accessors on NULL and past the end */
    CHECK_EQ(mpio_zip_count(NULL), 0);
    CHECK(mpio_zip_name(NULL, 0) == NULL);
    zmember one[1] = {stored("a.npy", npy, nlen)};
    uint8_t *b = zip_build(one, 1, NULL, 0, &len, NULL);
    mpio_zip *zip = NULL;
    CHECK_OK(mpio_zip_open(b, len, &zip, &e), e);
    CHECK_EQ(mpio_zip_count(zip), 1);
    CHECK(mpio_zip_name(zip, 1) == NULL && strcmp(mpio_zip_name(zip, 0), "a.npy") == 0);
    mpio_zip_close(zip);
    /* one member read by name, with and without ".npy"; a name that is not there */
    mpio_array a;
    CHECK_OK(mpio_npz_parse_member(b, len, "a", &a, &e), e);
    CHECK(a.dtype == MASKPACK_I32 && ((const int32_t *)a.data)[1] == -1);
    mpio_array_free(&a);
    CHECK_OK(mpio_npz_parse_member(b, len, "a.npy", &a, &e), e);
    mpio_array_free(&a);
    CHECK_STATUS(mpio_npz_parse_member(b, len, "zz", &a, &e), MASKPACK_ERR_NOT_FOUND, e);
    CHECK_MSG(e, "npz: no member 'zz' or 'zz.npy'");
    free(b);
    /* 'x' and 'x.npy' load as the same array: refused; short names without ".npy" are kept whole */
    zmember same[3] = {stored("x", npy, nlen), stored("ab", npy, nlen), stored("x.npy", npy, nlen)};
    b = zip_build(same, 3, NULL, 0, &len, NULL);
    mpio_arrayset set;
    CHECK_STATUS(mpio_npz_parse(b, len, &set, &e), MASKPACK_ERR_FORMAT, e);
    CHECK_MSG(e, "x");
    free(b);
    zmember shorts[2] = {stored("ab", npy, nlen), stored("abc", npy, nlen)};
    b = zip_build(shorts, 2, NULL, 0, &len, NULL);
    CHECK_OK(mpio_npz_parse(b, len, &set, &e), e);
    CHECK(set.n == 2 && mpio_arrayset_find(&set, "ab") && mpio_arrayset_find(&set, "abc"));
    mpio_arrayset_free(&set);
    free(b);
    /* a zip64 locator on volume 0 of an archive that says it spans 2 volumes; a locator that points
     * less than a zip64 record's 56 bytes before itself */
    zbuf t = {0};
    put32(&t, 0x07064b50u);
    put32(&t, 0);
    put64(&t, 0);
    put32(&t, 2);
    b = zip_build(one, 1, t.p, t.n, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_UNSUPPORTED, "multi-volume zip64");
    free(b);
    size_t cd = 0;
    b = zip_build(one, 1, NULL, 0, &len, &cd);
    free(b);
    t.n = 0;
    put32(&t, 0x07064b50u);
    put32(&t, 0);
    put64(&t, len - 22 - 10); /* 10 bytes before where the locator will sit */
    put32(&t, 1);
    b = zip_build(one, 1, t.p, t.n, &len, NULL);
    expect_zip(b, len, MASKPACK_ERR_FORMAT, "outside the archive");
    free(b);
    free(t.p);

    /* closing nothing; a member lookup in bytes that are no archive; a name too long to try with .npy */
    mpio_zip_close(NULL);
    CHECK_STATUS(mpio_npz_parse_member("not a zip", 9, "a", &a, &e), MASKPACK_ERR_FORMAT, e);
    char longname[600];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    b = zip_build(one, 1, NULL, 0, &len, NULL);
    CHECK_STATUS(mpio_npz_parse_member(b, len, longname, &a, &e), MASKPACK_ERR_NOT_FOUND, e);
    CHECK_MSG(e, "npz: no member 'nnn");
    /* an end record with zip64 markers (0xFFFF entries) but no zip64 locator before it */
    b[len - 22 + 10] = 0xff;
    b[len - 22 + 11] = 0xff;
    expect_zip(b, len, MASKPACK_ERR_FORMAT,
               "end record has zip64 markers (0xFFFF...) but no zip64 locator precedes it");
    free(b);
    /* a zip64 archive (the writer's) whose zip64 end record names another disk */
    int32_t w4[4] = {1, 2, 3, 4};
    int64_t four = 4;
    const mpio_named_tensor z64item = {"w", maskpack_tensor_contiguous(w4, MASKPACK_I32, 1, &four)};
    uint8_t *z64 = NULL;
    size_t z64len = 0;
    CHECK_OK(mpio_npz_encode_zip64_from(&z64item, 1, 0, 0, &z64, &z64len, &e), e);
    CHECK_OK(mpio_npz_parse(z64, z64len, &set, &e), e);
    CHECK(set.n == 1 && ((const int32_t *)set.arrays[0].data)[3] == 4);
    mpio_arrayset_free(&set);
    size_t rec = SIZE_MAX;
    for (size_t i = 0; i + 4 <= z64len; i++)
        if (z64[i] == 0x50 && z64[i + 1] == 0x4b && z64[i + 2] == 6 && z64[i + 3] == 6) rec = i;
    CHECK(rec != SIZE_MAX);
    if (rec != SIZE_MAX) {
        z64[rec + 16] = 1; /* number of this disk */
        expect_zip(z64, z64len, MASKPACK_ERR_UNSUPPORTED, "npz: multi-volume archives are not supported");
        z64[rec + 16] = 0;
        z64[rec + 20] = 2; /* disk where the central directory starts */
        expect_zip(z64, z64len, MASKPACK_ERR_UNSUPPORTED, "npz: multi-volume archives are not supported");
    }
    free(z64);

    /* the writer: names refused, a UTF-8 name, and data deflate cannot shrink (stored instead) */
    static int32_t v[1 << 18]; /* 1 MiB of xorshift32: deflate's per-block overhead outgrows what the header saves */
    uint32_t x = 12345;
    for (int i = 0; i < (1 << 18); i++) v[i] = (int32_t)test_rng_next32(&x);
    int64_t n64 = 1 << 18;
    mpio_named_tensor it[2] = {{"", maskpack_tensor_contiguous(v, MASKPACK_I32, 1, &n64)},
                               {"b", maskpack_tensor_contiguous(v, MASKPACK_I32, 1, &n64)}};
    uint8_t *out = NULL;
    size_t olen = 0;
    CHECK_STATUS(mpio_npz_encode(it, 1, 1, &out, &olen, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(e.index[0] == 0 && out == NULL);
    it[0].name = "b";
    CHECK_STATUS(mpio_npz_encode(it, 2, 1, &out, &olen, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "items[1].name: 'b' repeats items[0]");
    it[0].name = "gr\xc3\xb6\xc3\x9f"
                 "e";
    CHECK_OK(mpio_npz_encode(it, 2, 1, &out, &olen, &e), e);
    CHECK_OK(mpio_npz_parse(out, olen, &set, &e), e);
    const mpio_array *g = mpio_arrayset_find(&set, "gr\xc3\xb6\xc3\x9f"
                                                   "e");
    CHECK(g && mpio_array_numel(g) == (1 << 18) && memcmp(g->data, v, sizeof v) == 0);
    mpio_arrayset_free(&set);
    /* the central entry of the UTF-8 name has general-purpose flag bit 11 set */
    const uint8_t *c = NULL;
    for (size_t i = 0; i + 4 <= olen; i++)
        if (out[i] == 0x50 && out[i + 1] == 0x4b && out[i + 2] == 1 && out[i + 3] == 2) {
            c = out + i;
            break;
        }
    CHECK(c && (c[8] | c[9] << 8) == 1u << 11);
    CHECK(c && c[10] == 0); /* stored: deflate did not shrink it */
    free(out);
    free(npy);
}

/* ---- .npy headers -------------------------------------------------------------------------------- */

/* a .npy of the given version with header text h (padded to a multiple of 64 with spaces and '\n')
 * followed by payload[0..n) */
static uint8_t *make_npy(int major, const char *h, const void *payload, size_t n, size_t *len) {
    const size_t pre = major == 1 ? 10 : 12, hl = strlen(h);
    size_t total_h = hl + 1;
    total_h += (64 - (pre + total_h) % 64) % 64;
    *len = pre + total_h + n;
    uint8_t *b = calloc(*len, 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (uint8_t)major;
    b[7] = 0;
    if (major == 1) {
        b[8] = (uint8_t)total_h;
        b[9] = (uint8_t)(total_h >> 8);
    } else {
        for (int i = 0; i < 4; i++) b[8 + i] = (uint8_t)(total_h >> (8 * i));
    }
    memcpy(b + pre, h, hl);
    memset(b + pre + hl, ' ', total_h - hl - 1);
    b[pre + total_h - 1] = '\n';
    if (n) memcpy(b + pre + total_h, payload, n);
    return b;
}

static void expect_npy(int major, const char *h, size_t n, maskpack_status want, const char *fragment) {
    static const uint8_t zeros[64];
    size_t len;
    uint8_t *b = make_npy(major, h, zeros, n, &len);
    mpio_array a;
    maskpack_error e;
    CHECK_STATUS(mpio_npy_parse(b, len, &a, &e), want, e);
    CHECK_MSG(e, fragment);
    free(b);
}

static void test_npy_headers(void) {
    /* tabs, carriage returns and newlines between the items; Python 2 long literals; a version-2 header */
    const int64_t v64[2] = {-5, 1LL << 40};
    size_t len;
    mpio_array a;
    maskpack_error e;
    uint8_t *b = make_npy(2, "{'descr':\t'<i8',\r\n'fortran_order': False,\t'shape': (2L,), }", v64, sizeof v64, &len);
    CHECK_OK(mpio_npy_parse(b, len, &a, &e), e);
    CHECK(a.dtype == MASKPACK_I64 && a.ndim == 1 && a.shape[0] == 2 && ((const int64_t *)a.data)[1] == 1LL << 40);
    mpio_array_free(&a);
    free(b);
    const double d1 = 2.5;
    b = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", &d1, 8, &len);
    CHECK_OK(mpio_npy_parse(b, len, &a, &e), e);
    CHECK(a.dtype == MASKPACK_F64 && ((const double *)a.data)[0] == 2.5);
    mpio_array_free(&a);
    free(b);
    /* Fortran order: the 2 x 3 array stored column by column; its view walks it by (row, column) */
    const int32_t col[6] = {1, 2, 3, 4, 5, 6};
    b = make_npy(1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }", col, sizeof col, &len);
    CHECK_OK(mpio_npy_parse(b, len, &a, &e), e);
    const maskpack_tensor t = mpio_array_view(&a);
    CHECK(a.dtype == MASKPACK_I32 && t.ndim == 2 && t.strides[0] == 1 && t.strides[1] == 2);
    const int32_t *x = a.data;
    CHECK(x[1 * t.strides[0] + 2 * t.strides[1]] == 6 && x[0 * t.strides[0] + 1 * t.strides[1]] == 3);
    mpio_array_free(&a);
    free(b);
    /* a string that never ends; descr strings that are not numpy types; missing keys */
    expect_npy(1, "{'descr': '<i4", 0, MASKPACK_ERR_FORMAT, "npy header");
    expect_npy(1, "{'descr': '<', 'fortran_order': False, 'shape': (1,), }", 4, MASKPACK_ERR_FORMAT,
               "descr '<' is not a numpy type string");
    expect_npy(1, "{'descr': '<ix', 'fortran_order': False, 'shape': (1,), }", 4, MASKPACK_ERR_FORMAT,
               "is not a numpy type string");
    expect_npy(1, "{'descr': '<i4', 'shape': (1,), }", 4, MASKPACK_ERR_FORMAT,
               "npy header: missing key 'fortran_order'");
    expect_npy(1, "{'descr': '<i4', 'fortran_order': False, }", 4, MASKPACK_ERR_FORMAT,
               "npy header: missing key 'shape'");
    expect_npy(1, "{'fortran_order': False, 'shape': (1,), }", 4, MASKPACK_ERR_FORMAT,
               "npy header: missing key 'descr'");
    /* descr strings: each kind with an item size it does not have, the kinds never read, an unknown
     * kind, a size that is no size, byte orders a file cannot use */
    const struct {
        const char *descr;
        maskpack_status want;
        const char *fragment;
    } descrs[] = {{"<i3", MASKPACK_ERR_UNSUPPORTED, "dtype '<i3' is not supported"},
                  {"<f16", MASKPACK_ERR_UNSUPPORTED, "dtype '<f16' is not supported"},
                  {"<u2", MASKPACK_ERR_UNSUPPORTED, "dtype '<u2' is not supported"},
                  {"|b2", MASKPACK_ERR_UNSUPPORTED, "dtype '|b2' is not supported"},
                  {"<c8", MASKPACK_ERR_UNSUPPORTED, "dtype '<c8' is not supported"},
                  {"<U4", MASKPACK_ERR_UNSUPPORTED, "dtype '<U4' is not supported"},
                  {"<q8", MASKPACK_ERR_FORMAT, "has unknown kind 'q'"},
                  {"<i0", MASKPACK_ERR_FORMAT, "has a bad item size"},
                  {"<i4x", MASKPACK_ERR_FORMAT, "has a bad item size"},
                  {">i4", MASKPACK_ERR_FORMAT, "is big-endian"},
                  {"=i4", MASKPACK_ERR_FORMAT, "uses native byte order"},
                  {"|O8", MASKPACK_ERR_FORMAT, "is an object array"}};
    for (size_t k = 0; k < sizeof descrs / sizeof descrs[0]; k++) {
        char h[128];
        snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (1,), }", descrs[k].descr);
        expect_npy(1, h, 16, descrs[k].want, descrs[k].fragment);
    }
    /* a version-2 file cut before its 4-byte header length */
    const uint8_t cut[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0};
    CHECK_STATUS(mpio_npy_parse(cut, sizeof cut, &a, &e), MASKPACK_ERR_FORMAT, e);
    CHECK_MSG(e, "npy: truncated version 2 header");
}

/* ---- file reads and writes: directories, devices, relative names, message prefixes ---------------- */

static void test_files(void) {
    maskpack_error e;
    uint8_t *got = NULL;
    size_t n = 0;
    char dir[] = "/tmp/maskpack_io_bad_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    /* a directory is refused by name; so is it with a budget below the first read block */
    CHECK_STATUS(mpio_read_file(dir, MPIO_MAX_BYTES, &got, &n, &e), MASKPACK_ERR_IO, e);
    CHECK_MSG(e, ": is a directory");
    CHECK_STATUS(mpio_read_file(dir, 10, &got, &n, &e), MASKPACK_ERR_IO, e);
    CHECK(got == NULL);
    /* a character device with a 10-byte budget: read to its end (nothing), the buffer sized by the budget */
    CHECK_OK(mpio_read_file("/dev/null", 10, &got, &n, &e), e);
    CHECK(n == 0);
    free(got);
    /* writes to devices go in place (no temporary file beside them); a full device reports the failure */
    CHECK_OK(mpio_write_file("/dev/null", "abc", 3, &e), e);
    if (access("/dev/full", W_OK) == 0) {
        CHECK_STATUS(mpio_write_file("/dev/full", "abc", 3, &e), MASKPACK_ERR_IO, e);
        CHECK_MSG(e, "/dev/full: write failed");
    }
    /* a name without a directory part, relative to the working directory */
    char cwd[4096];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(dir) == 0);
    CHECK_OK(mpio_write_file("plain.bin", "xyz", 3, &e), e);
    CHECK_OK(mpio_read_file("plain.bin", 16, &got, &n, &e), e);
    CHECK(n == 3 && memcmp(got, "xyz", 3) == 0);
    free(got);
    CHECK(unlink("plain.bin") == 0);
    CHECK(chdir(cwd) == 0);
    CHECK(rmdir(dir) == 0);
    /* the array-set helpers take NULL */
    mpio_array_free(NULL);
    mpio_arrayset_free(NULL);
    mpio_arrayset empty = {0};
    CHECK(mpio_arrayset_find(NULL, "x") == NULL && mpio_arrayset_find(&empty, NULL) == NULL);
    CHECK(mpio_strdup(NULL) == NULL);
    /* a path prefix keeps the last 120 characters of a long path; OK, no path or no error: untouched */
    char longp[200];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    longp[190] = 'Z';
    maskpack_error pe;
    memset(&pe, 0, sizeof pe);
    strcpy(pe.message, "bad");
    CHECK_EQ(mpio_prefix_path(&pe, MASKPACK_ERR_FORMAT, longp), MASKPACK_ERR_FORMAT);
    CHECK(strncmp(pe.message, "...", 3) == 0 && strstr(pe.message, "Z") != NULL && strstr(pe.message, ": bad") != NULL);
    CHECK(strlen(pe.message) == 3 + 120 + 2 + 3);
    strcpy(pe.message, "bad");
    CHECK_EQ(mpio_prefix_path(&pe, MASKPACK_OK, "f"), MASKPACK_OK);
    CHECK_EQ(mpio_prefix_path(&pe, MASKPACK_ERR_FORMAT, NULL), MASKPACK_ERR_FORMAT);
    CHECK_EQ(mpio_prefix_path(NULL, MASKPACK_ERR_FORMAT, "f"), MASKPACK_ERR_FORMAT);
    mpio_prefix_message(NULL, "x");
    mpio_prefix_message(&pe, NULL);
    CHECK(strcmp(pe.message, "bad") == 0);
}

/* ---- standard input ---------------------------------------------------------------------------------- */

/* Feeds n bytes (byte i = i * 7 mod 251) to this process's standard input from a child process, then
 * reads "-" with the given limit. Returns the status; *got / *got_len the bytes read. */
static maskpack_status read_stdin_of(size_t n, uint64_t max_bytes, uint8_t **got, size_t *got_len, maskpack_error *e) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        uint8_t chunk[4096];
        size_t sent = 0;
        while (sent < n) {
            size_t k = n - sent < sizeof chunk ? n - sent : sizeof chunk;
            for (size_t i = 0; i < k; i++) chunk[i] = (uint8_t)((sent + i) * 7 % 251);
            ssize_t w = write(fds[1], chunk, k);
            if (w <= 0) _exit(1); /* the reader stopped early (the limit case) */
            sent += (size_t)w;
        }
        _exit(0);
    }
    close(fds[1]);
    if (fds[0] != 0) { /* fd 0 is free after an earlier call: pipe() may have handed it out */
        CHECK(dup2(fds[0], 0) == 0);
        close(fds[0]);
    }
    clearerr(stdin);
    *got = NULL;
    *got_len = 0;
    maskpack_status s = mpio_read_file("-", max_bytes, got, got_len, e);
    close(0); /* the child sees EPIPE if the reader stopped early */
    int status;
    waitpid(pid, &status, 0);
    return s;
}

static void test_stdin_large(void) {
    uint8_t *got;
    size_t n;
    maskpack_error e;
    /* 200 KiB: the 64 KiB first buffer doubles twice */
    const size_t want = 200 * 1024;
    CHECK_OK(read_stdin_of(want, MPIO_MAX_BYTES, &got, &n, &e), e);
    CHECK_EQ(n, want);
    int same = got != NULL;
    for (size_t i = 0; same && i < n; i++) same = got[i] == (uint8_t)(i * 7 % 251);
    CHECK(same);
    free(got);
    /* more than the limit: refused once the buffer would pass it */
    CHECK_STATUS(read_stdin_of(want, 100 * 1024, &got, &n, &e), MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_MSG(e, "more than the memory budget of 102400 bytes");
    CHECK(got == NULL);
}

/* standard input that is a directory, or a regular file over the budget (refused by its size, unread) */
static void test_stdin_kinds(void) {
    maskpack_error e;
    uint8_t *got = NULL;
    size_t n = 0;
    char dir[] = "/tmp/maskpack_stdin_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    int fd = open(dir, O_RDONLY); /* may be 0 itself: an earlier case closed it */
    CHECK(fd >= 0 && dup2(fd, 0) == 0);
    if (fd != 0) close(fd);
    clearerr(stdin);
    CHECK_STATUS(mpio_read_file("-", MPIO_MAX_BYTES, &got, &n, &e), MASKPACK_ERR_IO, e);
    CHECK_MSG(e, "-: is a directory");
    char path[64];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    uint8_t bytes[100];
    for (int i = 0; i < 100; i++) bytes[i] = (uint8_t)i;
    CHECK_OK(mpio_write_file(path, bytes, sizeof bytes, &e), e);
    close(0);
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && dup2(fd, 0) == 0);
    if (fd != 0) close(fd);
    clearerr(stdin);
    CHECK_STATUS(mpio_read_file("-", 50, &got, &n, &e), MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_MSG(e, "-: file has 100 bytes, more than the memory budget of 50 bytes");
    CHECK(got == NULL);
    close(0);
    CHECK(unlink(path) == 0 && rmdir(dir) == 0);
}

int main(void) {
    test_safetensors_bad();
    test_zip_directory();
    test_zip64_locator();
    test_deflate_streams();
    test_zip_more();
    test_npy_headers();
    test_files();
    test_stdin_large();
    test_stdin_kinds();
    return check_report("test_io_bad");
}
