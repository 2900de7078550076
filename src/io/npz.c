/* npz.c: a minimal zip reader/writer and the .npz format on top of it.
 *
 * Reading trusts nothing: the end-of-central-directory record is located by its signature AND a
 * comment length that reaches exactly the end of the file; zip64 records are read when present
 * (numpy's savez writes every local header in zip64 form); every central entry is checked against
 * its local header (name, method, sizes, CRC unless a data descriptor follows) and every member's
 * bytes must lie inside the archive, before the central directory, without overlapping another
 * member. Inflated sizes are bounded by what deflate can produce from the compressed bytes, so a
 * small file can never request a huge allocation. Members are STORED or DEFLATED; encryption,
 * other methods and multi-volume archives are MASKPACK_ERR_UNSUPPORTED. */
#include "io.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define ZIP_ARG "npz"

#define SIG_LOCAL     0x04034b50u
#define SIG_CENTRAL   0x02014b50u
#define SIG_EOCD      0x06054b50u
#define SIG_EOCD64    0x06064b50u
#define SIG_LOCATOR64 0x07064b50u

/* deflate cannot expand more than ~1032:1; anything claiming more lies */
#define DEFLATE_MAX_RATIO 1032u

typedef struct zip_entry {
    char *name;
    uint16_t flags, method;
    uint32_t crc;
    uint64_t comp_size, size;
    uint64_t local_offset;
    uint64_t data_offset; /* first byte of the member's data */
} zip_entry;

struct mpio_zip {
    const uint8_t *buf;
    size_t len;
    size_t n;
    zip_entry *entries;
};

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }
static void wr16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v) {
    wr16(p, v & 0xffffu);
    wr16(p + 2, v >> 16);
}

void mpio_zip_close(mpio_zip *z) {
    if (!z) return;
    for (size_t i = 0; i < z->n; i++) free(z->entries[i].name);
    free(z->entries);
    free(z);
}

size_t mpio_zip_count(const mpio_zip *z) { return z ? z->n : 0; }
const char *mpio_zip_name(const mpio_zip *z, size_t i) { return z && i < z->n ? z->entries[i].name : NULL; }

/* Reads the zip64 extended-information extra field (id 1): replaces the saturated 32-bit fields in the
 * order size, compressed size, local offset. `what` names the header for messages. */
static maskpack_status read_zip64_extra(const uint8_t *extra, size_t elen, int need_size, int need_comp,
                                        int need_offset, uint64_t *size, uint64_t *comp, uint64_t *offset,
                                        const char *what, const char *name, maskpack_error *err) {
    size_t p = 0;
    while (p + 4 <= elen) {
        uint16_t id = rd16(extra + p), sz = rd16(extra + p + 2);
        if (sz > elen - p - 4)
            return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                           "npz: %s of '%s': extra field of %u bytes overruns its %zu-byte area", what, name, sz,
                           elen - p - 4);
        if (id == 1) {
            const uint8_t *f = extra + p + 4;
            size_t need = 8u * (size_t)(need_size + need_comp + need_offset);
            if (sz < need)
                return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                               "npz: %s of '%s': zip64 field has %u bytes, needs %zu", what, name, sz, need);
            if (need_size) *size = rd64(f), f += 8;
            if (need_comp) *comp = rd64(f), f += 8;
            if (need_offset) *offset = rd64(f);
            return MASKPACK_OK;
        }
        p += 4 + (size_t)sz;
    }
    if (need_size || need_comp || need_offset)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                       "npz: %s of '%s': sizes are 0xFFFFFFFF but there is no zip64 extra field", what, name);
    return MASKPACK_OK;
}

/* Locates the end records and returns the central directory's extent and entry count. */
static maskpack_status find_directory(const uint8_t *b, size_t len, uint64_t *cd_off, uint64_t *cd_size,
                                      uint64_t *count, uint64_t *cd_limit, maskpack_error *err) {
    if (len < 22)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                       "npz: %zu bytes are too few for a zip archive (no end-of-central-directory record)", len);
    size_t eocd = SIZE_MAX;
    size_t lowest = len - 22 > 65535 ? len - 22 - 65535 : 0;
    for (size_t p = len - 22 + 1; p-- > lowest;) {
        /* the comment must reach exactly the end of the file: a signature inside data does not count */
        if (rd32(b + p) == SIG_EOCD && p + 22 + rd16(b + p + 20) == len) {
            eocd = p;
            break;
        }
    }
    if (eocd == SIZE_MAX)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                       "npz: no end-of-central-directory record (not a zip archive, or truncated)");
    const uint8_t *e = b + eocd;
    uint16_t disk = rd16(e + 4), cd_disk = rd16(e + 6);
    uint64_t n_disk = rd16(e + 8), n_total = rd16(e + 10);
    uint64_t size = rd32(e + 12), off = rd32(e + 16);
    *cd_limit = eocd;
    if (eocd >= 20 && rd32(e - 20) == SIG_LOCATOR64) {
        /* zip64: the locator points at the zip64 end record, whose fields replace the classic ones */
        const uint8_t *loc = e - 20;
        uint64_t rec = rd64(loc + 8);
        if (rd32(loc + 4) != 0 || rd32(loc + 16) > 1)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ZIP_ARG, -1, -1,
                           "npz: multi-volume zip64 archives are not supported");
        if (rec > eocd - 20 || eocd - 20 - rec < 56)
            return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                           "npz: zip64 locator points at offset %llu, outside the archive's %zu bytes",
                           (unsigned long long)rec, len);
        const uint8_t *z = b + rec;
        if (rd32(z) != SIG_EOCD64)
            return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                           "npz: no zip64 end-of-central-directory record at offset %llu", (unsigned long long)rec);
        disk = (uint16_t)(rd32(z + 16) ? 1 : 0);
        cd_disk = (uint16_t)(rd32(z + 20) ? 1 : 0);
        n_disk = rd64(z + 24);
        n_total = rd64(z + 32);
        size = rd64(z + 40);
        off = rd64(z + 48);
        *cd_limit = rec;
    } else if (n_total == 0xffffu || size == 0xffffffffu || off == 0xffffffffu) {
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                       "npz: end record has zip64 markers (0xFFFF...) but no zip64 locator precedes it");
    }
    if (disk != 0 || cd_disk != 0 || n_disk != n_total)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ZIP_ARG, -1, -1, "npz: multi-volume archives are not supported");
    if (off > *cd_limit || size > *cd_limit - off)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                       "npz: central directory [%llu, +%llu) lies outside the %llu bytes before the end record",
                       (unsigned long long)off, (unsigned long long)size, (unsigned long long)*cd_limit);
    if (n_total > size / 46)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                       "npz: end record claims %llu entries, a %llu-byte central directory holds at most %llu",
                       (unsigned long long)n_total, (unsigned long long)size, (unsigned long long)(size / 46));
    *cd_off = off;
    *cd_size = size;
    *count = n_total;
    return MASKPACK_OK;
}

/* Parses central entry `k` at b[p..limit) into *e; advances *p. */
static maskpack_status read_central(const uint8_t *b, size_t *p, uint64_t limit, size_t k, zip_entry *e,
                                    maskpack_error *err) {
    if (limit - *p < 46 || rd32(b + *p) != SIG_CENTRAL)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: central directory entry %zu is truncated or lacks its signature", k);
    const uint8_t *c = b + *p;
    e->flags = rd16(c + 8);
    e->method = rd16(c + 10);
    e->crc = rd32(c + 16);
    e->comp_size = rd32(c + 20);
    e->size = rd32(c + 24);
    size_t nlen = rd16(c + 28), elen = rd16(c + 30), clen = rd16(c + 32);
    uint16_t disk = rd16(c + 34);
    e->local_offset = rd32(c + 42);
    if (limit - *p - 46 < nlen + elen + clen)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: central directory entry %zu: name/extra/comment (%zu bytes) overrun the directory", k,
                       nlen + elen + clen);
    const uint8_t *name = c + 46;
    if (nlen == 0 || memchr(name, 0, nlen))
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: central directory entry %zu has an empty name or a NUL in its name", k);
    e->name = malloc(nlen + 1);
    if (!e->name) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    memcpy(e->name, name, nlen);
    e->name[nlen] = 0;
    maskpack_status s = read_zip64_extra(c + 46 + nlen, elen, e->size == 0xffffffffu, e->comp_size == 0xffffffffu,
                                         e->local_offset == 0xffffffffu, &e->size, &e->comp_size, &e->local_offset,
                                         "central entry", e->name, err);
    if (s) return s;
    if (disk != 0 && disk != 0xffffu)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s' lives on volume %u; multi-volume archives are not supported", e->name, disk);
    if (e->flags & 1u)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s' is encrypted; encrypted archives are not supported", e->name);
    if (e->method != 0 && e->method != 8)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s' uses compression method %u; only STORED (0) and DEFLATED (8) are supported",
                       e->name, e->method);
    if (e->method == 0 && e->comp_size != e->size)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: STORED member '%s' has compressed size %llu != size %llu", e->name,
                       (unsigned long long)e->comp_size, (unsigned long long)e->size);
    if (e->method == 8 && e->size > e->comp_size * (uint64_t)DEFLATE_MAX_RATIO + 64)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s' claims %llu bytes from %llu compressed bytes, more than deflate can produce",
                       e->name, (unsigned long long)e->size, (unsigned long long)e->comp_size);
    if (e->size > MPIO_MAX_BYTES)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s' has %llu bytes, more than the %llu this reader accepts", e->name,
                       (unsigned long long)e->size, (unsigned long long)MPIO_MAX_BYTES);
    *p += 46 + nlen + elen + clen;
    return MASKPACK_OK;
}

/* Checks the local header of entry k against its central entry and sets data_offset. */
static maskpack_status check_local(const uint8_t *b, uint64_t cd_off, size_t k, zip_entry *e, maskpack_error *err) {
    if (e->local_offset > cd_off || cd_off - e->local_offset < 30 || rd32(b + e->local_offset) != SIG_LOCAL)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s': no local header at offset %llu", e->name,
                       (unsigned long long)e->local_offset);
    const uint8_t *l = b + e->local_offset;
    uint16_t flags = rd16(l + 6), method = rd16(l + 8);
    uint32_t crc = rd32(l + 14);
    uint64_t comp = rd32(l + 18), size = rd32(l + 22), dummy = 0;
    size_t nlen = rd16(l + 26), elen = rd16(l + 28);
    uint64_t room = cd_off - e->local_offset - 30;
    if (room < nlen + elen)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s': local header name/extra overrun the archive", e->name);
    if (nlen != strlen(e->name) || memcmp(l + 30, e->name, nlen) != 0)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s': the local header names another file", e->name);
    if (method != e->method)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s': local header method %u != central directory method %u", e->name, method,
                       e->method);
    if ((flags & 8u) == 0) {
        /* sizes and CRC are in the local header (possibly zip64): they must agree with the directory */
        maskpack_status s = read_zip64_extra(l + 30 + nlen, elen, size == 0xffffffffu, comp == 0xffffffffu, 0, &size,
                                             &comp, &dummy, "local header", e->name, err);
        if (s) return s;
        if (crc != e->crc || comp != e->comp_size || size != e->size)
            return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                           "npz: member '%s': local header (crc %08x, %llu/%llu bytes) disagrees with the central "
                           "directory (crc %08x, %llu/%llu bytes)",
                           e->name, crc, (unsigned long long)comp, (unsigned long long)size, e->crc,
                           (unsigned long long)e->comp_size, (unsigned long long)e->size);
    }
    e->data_offset = e->local_offset + 30 + nlen + elen;
    if (e->comp_size > cd_off - e->data_offset)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)k, -1,
                       "npz: member '%s': %llu compressed bytes at offset %llu run past the central directory at %llu",
                       e->name, (unsigned long long)e->comp_size, (unsigned long long)e->data_offset,
                       (unsigned long long)cd_off);
    return MASKPACK_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const zip_entry *x = *(const zip_entry *const *)a, *y = *(const zip_entry *const *)b;
    return x->local_offset < y->local_offset ? -1 : x->local_offset > y->local_offset;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp((*(const zip_entry *const *)a)->name, (*(const zip_entry *const *)b)->name);
}

maskpack_status mpio_zip_open(const void *buf, size_t len, mpio_zip **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    *out = NULL;
    if (len) MP_CHECK_NULL(err, buf, "buf");
    const uint8_t *b = buf;
    uint64_t cd_off = 0, cd_size = 0, count = 0, cd_limit = 0;
    maskpack_status s = find_directory(b, len, &cd_off, &cd_size, &count, &cd_limit, err);
    if (s) return s;
    mpio_zip *z = calloc(1, sizeof *z);
    if (!z) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    z->buf = b;
    z->len = len;
    z->entries = calloc(count ? (size_t)count : 1, sizeof *z->entries);
    zip_entry **order = mp_alloc_array((size_t)count, sizeof *order);
    if (!z->entries || !order) {
        free(order);
        mpio_zip_close(z);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    }
    size_t p = (size_t)cd_off;
    for (size_t k = 0; k < count && !s; k++) {
        s = read_central(b, &p, cd_off + cd_size, k, &z->entries[k], err);
        z->n = k + 1; /* the name may already be allocated */
        if (!s) s = check_local(b, cd_off, k, &z->entries[k], err);
        order[k] = &z->entries[k];
    }
    if (!s && count > 1) {
        /* members must not share bytes: overlapping members are how zip bombs multiply their output */
        qsort(order, (size_t)count, sizeof *order, cmp_by_offset);
        for (size_t k = 1; k < count && !s; k++)
            if (order[k]->local_offset < order[k - 1]->data_offset + order[k - 1]->comp_size)
                s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1, "npz: members '%s' and '%s' overlap",
                            order[k - 1]->name, order[k]->name);
        if (!s) {
            qsort(order, (size_t)count, sizeof *order, cmp_names);
            for (size_t k = 1; k < count && !s; k++)
                if (strcmp(order[k]->name, order[k - 1]->name) == 0)
                    s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1, "npz: member name '%s' appears twice",
                                order[k]->name);
        }
    }
    free(order);
    if (s) {
        mpio_zip_close(z);
        return s;
    }
    *out = z;
    return mp_ok(err);
}

maskpack_status mpio_zip_find(const mpio_zip *z, const char *name, size_t *index, maskpack_error *err) {
    MP_CHECK_NULL(err, z, "zip");
    MP_CHECK_NULL(err, name, "name");
    MP_CHECK_NULL(err, index, "index");
    for (size_t i = 0; i < z->n; i++)
        if (strcmp(z->entries[i].name, name) == 0) {
            *index = i;
            return mp_ok(err);
        }
    return mp_fail(err, MASKPACK_ERR_NOT_FOUND, "name", -1, -1, "npz: no member named '%s' (%zu members)", name, z->n);
}

/* Inflates a raw deflate stream of exactly comp bytes into exactly size bytes. */
static maskpack_status inflate_exact(const zip_entry *e, const uint8_t *src, uint8_t *dst, maskpack_error *err) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -15) != Z_OK)
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "npz: inflateInit2 failed");
    uint64_t in_left = e->comp_size, out_left = e->size;
    const uint8_t *in = src;
    uint8_t *outp = dst;
    uint8_t spill[64];
    int rc = Z_OK;
    maskpack_status s = MASKPACK_OK;
    /* zlib counts in 32-bit uInt: feed both sides in chunks */
    for (;;) {
        if (zs.avail_in == 0 && in_left) {
            uInt chunk = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
            zs.next_in = (Bytef *)(uintptr_t)in;
            zs.avail_in = chunk;
            in += chunk;
            in_left -= chunk;
        }
        int spilling = 0;
        if (zs.avail_out == 0) {
            if (out_left) {
                uInt chunk = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left;
                zs.next_out = outp;
                zs.avail_out = chunk;
                outp += chunk;
                out_left -= chunk;
            } else {
                /* output full: any further byte means the member is larger than declared */
                zs.next_out = spill;
                zs.avail_out = sizeof spill;
                spilling = 1;
            }
        }
        uInt before_in = zs.avail_in, before_out = zs.avail_out;
        rc = inflate(&zs, Z_NO_FLUSH);
        if (spilling && zs.avail_out != sizeof spill) {
            s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                        "npz: member '%s' inflates to more than its declared %llu bytes", e->name,
                        (unsigned long long)e->size);
            break;
        }
        if (rc == Z_STREAM_END) break;
        if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR) {
            s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1, "npz: member '%s': corrupt deflate stream (%s)",
                        e->name, zs.msg ? zs.msg : "invalid data");
            break;
        }
        if (rc == Z_MEM_ERROR) {
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "npz: out of memory while inflating");
            break;
        }
        if (zs.avail_in == 0 && in_left == 0 && before_in == zs.avail_in && before_out == zs.avail_out) {
            s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                        "npz: member '%s': deflate stream is truncated (ends before its final block)", e->name);
            break;
        }
    }
    if (!s && (uint64_t)zs.total_out != e->size)
        s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                    "npz: member '%s' inflates to %llu bytes, the directory declares %llu", e->name,
                    (unsigned long long)zs.total_out, (unsigned long long)e->size);
    if (!s && (uint64_t)zs.total_in != e->comp_size)
        s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, -1, -1,
                    "npz: member '%s': deflate stream ends after %llu of its %llu compressed bytes", e->name,
                    (unsigned long long)zs.total_in, (unsigned long long)e->comp_size);
    inflateEnd(&zs);
    return s;
}

maskpack_status mpio_zip_extract(const mpio_zip *z, size_t i, uint8_t **data, size_t *len, maskpack_error *err) {
    MP_CHECK_NULL(err, z, "zip");
    MP_CHECK_NULL(err, data, "data");
    MP_CHECK_NULL(err, len, "len");
    if (i >= z->n)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "i", (int64_t)i, -1,
                       "i: expected a member index in [0, %zu), found %zu", z->n, i);
    const zip_entry *e = &z->entries[i];
    uint8_t *dst = malloc(e->size ? (size_t)e->size : 1);
    if (!dst)
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "npz: out of memory for %llu bytes",
                       (unsigned long long)e->size);
    const uint8_t *src = z->buf + e->data_offset;
    if (e->method == 0) {
        if (e->size) memcpy(dst, src, (size_t)e->size);
    } else {
        maskpack_status s = inflate_exact(e, src, dst, err);
        if (s) {
            free(dst);
            return s;
        }
    }
    uLong crc = crc32_z(0L, Z_NULL, 0);
    crc = crc32_z(crc, dst, (z_size_t)e->size);
    if ((uint32_t)crc != e->crc) {
        free(dst);
        return mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)i, -1,
                       "npz: member '%s': CRC-32 mismatch (directory says %08x, data has %08x)", e->name, e->crc,
                       (unsigned)crc);
    }
    *data = dst;
    *len = (size_t)e->size;
    return mp_ok(err);
}

/* ---- .npz ------------------------------------------------------------------------------------------ */

static maskpack_status member_to_array(const mpio_zip *z, size_t i, mpio_array *a, maskpack_error *err) {
    uint8_t *data = NULL;
    size_t len = 0;
    maskpack_status s = mpio_zip_extract(z, i, &data, &len, err);
    if (s) return s;
    s = mpio_npy_parse(data, len, a, err);
    free(data);
    const char *name = mpio_zip_name(z, i);
    if (s) {
        /* say which member failed */
        char prefix[300];
        snprintf(prefix, sizeof prefix, "member '%.200s': ", name);
        mpio_prefix_message(err, prefix);
        return s;
    }
    size_t n = strlen(name);
    a->name = malloc(n + 1);
    if (!a->name) {
        mpio_array_free(a);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    }
    memcpy(a->name, name, n + 1);
    if (n > 4 && strcmp(a->name + n - 4, ".npy") == 0) a->name[n - 4] = 0;
    return MASKPACK_OK;
}

/* A member's array name: its name without a trailing ".npy". */
typedef struct {
    const char *p;
    size_t len, index;
} array_name;

static int cmp_array_name(const void *a, const void *b) {
    const array_name *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Two members that load as the same array ('x' and 'x.npy') are refused: which one wins would be an
 * accident of their order in the archive. Sorted, as archives may hold very many members. */
static maskpack_status check_array_names(const mpio_zip *z, maskpack_error *err) {
    if (z->n < 2) return MASKPACK_OK;
    array_name *v = mp_alloc_array(z->n, sizeof *v);
    if (!v) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    for (size_t i = 0; i < z->n; i++) {
        const char *name = z->entries[i].name;
        size_t n = strlen(name);
        v[i] = (array_name){name, n > 4 && strcmp(name + n - 4, ".npy") == 0 ? n - 4 : n, i};
    }
    qsort(v, z->n, sizeof *v, cmp_array_name);
    maskpack_status s = MASKPACK_OK;
    for (size_t i = 1; i < z->n && !s; i++)
        if (v[i].len == v[i - 1].len && memcmp(v[i].p, v[i - 1].p, v[i].len) == 0)
            s = mp_fail(err, MASKPACK_ERR_FORMAT, ZIP_ARG, (int64_t)v[i].index, -1,
                        "npz: members '%.200s' and '%.200s' both hold the array '%.*s'",
                        z->entries[v[i - 1].index].name, z->entries[v[i].index].name,
                        (int)(v[i].len > 200 ? 200 : v[i].len), v[i].p);
    free(v);
    return s;
}

maskpack_status mpio_npz_parse(const void *buf, size_t len, mpio_arrayset *out, maskpack_error *err) {
    return mpio_npz_parse_budget(buf, len, MPIO_MAX_BYTES, out, err);
}

maskpack_status mpio_npz_parse_budget(const void *buf, size_t len, uint64_t max_bytes, mpio_arrayset *out,
                                      maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    memset(out, 0, sizeof *out);
    mpio_zip *z = NULL;
    maskpack_status s = mpio_zip_open(buf, len, &z, err);
    if (s) return s;
    /* the members' claimed sizes against the budget before anything is inflated: a 2 MB archive of
     * deflated zeros claims gigabytes (each claim is already bounded by deflate's ratio) */
    uint64_t claimed = 0;
    for (size_t i = 0; i < z->n; i++) {
        claimed += z->entries[i].size; /* each <= MPIO_MAX_BYTES, count < 2^32: no overflow */
        if (claimed > max_bytes) {
            s = mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ZIP_ARG, (int64_t)i, -1,
                        "npz: member '%.200s' claims %llu bytes (%llu with the members before it), more than the "
                        "memory budget of %llu bytes (--max-bytes)",
                        z->entries[i].name, (unsigned long long)z->entries[i].size, (unsigned long long)claimed,
                        (unsigned long long)max_bytes);
            mpio_zip_close(z);
            return s;
        }
    }
    if ((s = check_array_names(z, err))) {
        mpio_zip_close(z);
        return s;
    }
    mpio_arrayset set = {0, calloc(z->n ? z->n : 1, sizeof(mpio_array))};
    if (!set.arrays) {
        mpio_zip_close(z);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    }
    for (size_t i = 0; i < z->n && !s; i++) {
        s = member_to_array(z, i, &set.arrays[i], err);
        if (!s) set.n = i + 1;
    }
    mpio_zip_close(z);
    if (s) {
        mpio_arrayset_free(&set);
        return s;
    }
    *out = set;
    return mp_ok(err);
}

maskpack_status mpio_npz_parse_member(const void *buf, size_t len, const char *name, mpio_array *out,
                                      maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    MP_CHECK_NULL(err, name, "name");
    memset(out, 0, sizeof *out);
    mpio_zip *z = NULL;
    maskpack_status s = mpio_zip_open(buf, len, &z, err);
    if (s) return s;
    size_t idx = 0;
    s = mpio_zip_find(z, name, &idx, err);
    if (s == MASKPACK_ERR_NOT_FOUND) {
        char withext[512];
        if ((size_t)snprintf(withext, sizeof withext, "%s.npy", name) < sizeof withext)
            s = mpio_zip_find(z, withext, &idx, err);
        if (s == MASKPACK_ERR_NOT_FOUND)
            s = mp_fail(err, MASKPACK_ERR_NOT_FOUND, "name", -1, -1, "npz: no member '%s' or '%s.npy'", name, name);
    }
    if (!s) s = member_to_array(z, idx, out, err);
    mpio_zip_close(z);
    return s ? s : mp_ok(err);
}

maskpack_status mpio_npz_load(const char *path, mpio_arrayset *out, maskpack_error *err) {
    return mpio_load_set(path, mpio_npz_parse, out, err);
}

/* ---- writer ---------------------------------------------------------------------------------------- */

typedef struct growbuf {
    uint8_t *p;
    size_t len, cap;
} growbuf;

static int gb_put(growbuf *g, const void *src, size_t n) {
    if (n > SIZE_MAX - g->len) return 0;
    if (g->len + n > g->cap) {
        size_t cap = g->cap ? g->cap : 4096;
        while (cap < g->len + n) {
            if (cap > SIZE_MAX / 2) return 0;
            cap *= 2;
        }
        uint8_t *q = realloc(g->p, cap);
        if (!q) return 0;
        g->p = q;
        g->cap = cap;
    }
    if (n) memcpy(g->p + g->len, src, n);
    g->len += n;
    return 1;
}

typedef struct written_member {
    uint32_t crc;
    uint64_t comp, size, offset;
    uint16_t method, flags;
} written_member;

static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Deflates src into a fresh buffer; returns 0 (store instead) when it does not shrink. zlib counts
 * its input and output windows in 32-bit uInt, so members over 4 GiB are fed in 1 GiB pieces. */
static maskpack_status deflate_member(const uint8_t *src, size_t n, uint8_t **dst, size_t *dlen, maskpack_error *err) {
    *dst = NULL;
    *dlen = 0;
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "npz: deflateInit2 failed");
    /* no point keeping more than n bytes: a result that large is stored instead */
    size_t cap = n + 64;
    uint8_t *out = malloc(cap);
    if (!out) {
        deflateEnd(&zs);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    }
    const size_t piece = (size_t)1 << 30;
    size_t in_done = 0, out_done = 0;
    int rc = Z_OK;
    while (rc == Z_OK) {
        size_t in_left = n - in_done, out_left = cap - out_done;
        if (out_left == 0) break; /* does not shrink enough: store */
        zs.next_in = (Bytef *)(uintptr_t)(src + in_done);
        zs.avail_in = (uInt)(in_left < piece ? in_left : piece);
        zs.next_out = out + out_done;
        zs.avail_out = (uInt)(out_left < piece ? out_left : piece);
        uInt in0 = zs.avail_in, out0 = zs.avail_out;
        rc = deflate(&zs, in_left <= piece ? Z_FINISH : Z_NO_FLUSH);
        in_done += in0 - zs.avail_in;
        out_done += out0 - zs.avail_out;
    }
    deflateEnd(&zs);
    /* Z_OK or Z_BUF_ERROR here: the output window filled before the end, so it does not shrink */
    if (rc != Z_STREAM_END && rc != Z_OK && rc != Z_BUF_ERROR) {
        free(out);
        return mp_fail(err, MASKPACK_ERR_IO, ZIP_ARG, -1, -1, "npz: deflate failed (%d)", rc);
    }
    if (rc != Z_STREAM_END || out_done >= n) {
        free(out);
        return MASKPACK_OK;
    }
    *dst = out;
    *dlen = out_done;
    return MASKPACK_OK;
}

typedef struct name_at {
    const char *name;
    size_t index;
} name_at;

static int cmp_name_at(const void *a, const void *b) {
    const name_at *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* Duplicate member names, found by sorting (archives may hold many thousands of members). Reports
 * the first item whose name repeats an earlier one, and the earliest item it repeats. */
static maskpack_status check_unique_names(const mpio_named_tensor *items, size_t n, maskpack_error *err) {
    if (n < 2) return MASKPACK_OK;
    name_at *v = mp_alloc_array(n, sizeof *v);
    if (!v) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    for (size_t i = 0; i < n; i++) v[i] = (name_at){items[i].name, i};
    qsort(v, n, sizeof *v, cmp_name_at);
    size_t bad = SIZE_MAX, first = 0, group = 0;
    for (size_t i = 1; i < n; i++) {
        if (strcmp(v[i].name, v[group].name) != 0) {
            group = i;
        } else if (i == group + 1 && v[i].index < bad) { /* the group's second item is its first repeat */
            bad = v[i].index;
            first = v[group].index;
        }
    }
    free(v);
    if (bad == SIZE_MAX) return MASKPACK_OK;
    return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "items", (int64_t)bad, -1,
                   "items[%zu].name: '%s' repeats items[%zu]", bad, items[bad].name, first);
}

/* The writer uses the zip64 forms only where a value does not fit its classic field: a member's
 * sizes or offset at or above zip64_from (0xFFFFFFFF in real use: that value itself is the marker),
 * or 0xFFFF members or more. So every archive a classic reader can hold is written classically. */
maskpack_status mpio_npz_encode_zip64_from(const mpio_named_tensor *items, size_t n, int deflate, uint64_t zip64_from,
                                           uint8_t **buf, size_t *len, maskpack_error *err) {
    MP_CHECK_NULL(err, buf, "buf");
    MP_CHECK_NULL(err, len, "len");
    if (n) MP_CHECK_NULL(err, items, "items");
    if (zip64_from > 0xffffffffu) zip64_from = 0xffffffffu;
    /* names: non-empty, no NUL (implicit), short enough for the 16-bit length field, no duplicates */
    for (size_t i = 0; i < n; i++) {
        if (!items[i].name || !items[i].name[0] || strlen(items[i].name) > 4096)
            return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "items", (int64_t)i, -1,
                           "items[%zu].name: expected 1 to 4096 characters", i);
    }
    maskpack_status dup = check_unique_names(items, n, err);
    if (dup) return dup;
    for (size_t i = 0; i < n; i++) {
        if (items[i].text) continue; /* checked by its encoder */
        maskpack_status s = mp_check_tensor(&items[i].tensor, items[i].name, 0, MASKPACK_MAX_DIMS, err);
        if (s) return s;
        if (!mpio_npy_descr(items[i].tensor.dtype))
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "items", (int64_t)i, -1,
                           "%s: dtype %s has no .npy equivalent (convert to float32 first)", items[i].name,
                           maskpack_dtype_name(items[i].tensor.dtype));
    }
    written_member *wm = calloc(n ? n : 1, sizeof *wm);
    if (!wm) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    growbuf g = {0};
    maskpack_status s = MASKPACK_OK;
    char fname[4112];
    for (size_t i = 0; i < n && !s; i++) {
        uint8_t *npy = NULL, *packed = NULL;
        size_t npy_len = 0, packed_len = 0;
        s = items[i].text ? mpio_npy_encode_text(items[i].text, &npy, &npy_len, err)
                          : mpio_npy_encode(&items[i].tensor, &npy, &npy_len, err);
        if (s) break;
        if (deflate) s = deflate_member(npy, npy_len, &packed, &packed_len, err);
        if (!s) {
            const uint8_t *body = packed ? packed : npy;
            size_t body_len = packed ? packed_len : npy_len;
            size_t nlen = (size_t)snprintf(fname, sizeof fname, "%s.npy", items[i].name);
            written_member *m = &wm[i];
            m->crc = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), npy, (z_size_t)npy_len);
            m->size = npy_len;
            m->comp = body_len;
            m->offset = g.len;
            m->method = packed ? 8 : 0;
            m->flags = 0;
            for (size_t c = 0; c < nlen; c++)
                if ((unsigned char)fname[c] >= 0x80) m->flags = 1u << 11; /* UTF-8 name */
            /* a local header's zip64 field, when present, holds both sizes (APPNOTE 4.5.3) */
            int big = m->size >= zip64_from || m->comp >= zip64_from;
            uint8_t h[30 + 20];
            wr32(h, SIG_LOCAL);
            wr16(h + 4, big ? 45 : 20);
            wr16(h + 6, m->flags);
            wr16(h + 8, m->method);
            wr16(h + 10, 0);    /* time 00:00:00 */
            wr16(h + 12, 0x21); /* date 1980-01-01: fixed, so output is reproducible */
            wr32(h + 14, m->crc);
            wr32(h + 18, big ? 0xffffffffu : (uint32_t)m->comp);
            wr32(h + 22, big ? 0xffffffffu : (uint32_t)m->size);
            wr16(h + 26, (uint32_t)nlen);
            wr16(h + 28, big ? 20 : 0);
            uint8_t *x = h + 30;
            if (big) {
                wr16(x, 1);
                wr16(x + 2, 16);
                wr64(x + 4, m->size);
                wr64(x + 12, m->comp);
            }
            if (!gb_put(&g, h, 30) || !gb_put(&g, fname, nlen) || !gb_put(&g, x, big ? 20 : 0) ||
                !gb_put(&g, body, body_len))
                s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
        }
        free(npy);
        free(packed);
    }
    uint64_t cd_start = g.len;
    for (size_t i = 0; i < n && !s; i++) {
        const written_member *m = &wm[i];
        size_t nlen = (size_t)snprintf(fname, sizeof fname, "%s.npy", items[i].name);
        /* the central zip64 field holds only the saturated values, in this order */
        int zs = m->size >= zip64_from, zc = m->comp >= zip64_from, zo = m->offset >= zip64_from;
        uint8_t c[46], x[28];
        size_t xl = 0;
        if (zs || zc || zo) {
            xl = 4;
            const uint64_t vals[3] = {m->size, m->comp, m->offset};
            const int saturated[3] = {zs, zc, zo};
            for (int f = 0; f < 3; f++)
                if (saturated[f]) {
                    wr64(x + xl, vals[f]);
                    xl += 8;
                }
            wr16(x, 1);
            wr16(x + 2, (uint32_t)(xl - 4));
        }
        wr32(c, SIG_CENTRAL);
        wr16(c + 4, xl ? 45 : 20);
        wr16(c + 6, xl ? 45 : 20);
        wr16(c + 8, m->flags);
        wr16(c + 10, m->method);
        wr16(c + 12, 0);
        wr16(c + 14, 0x21);
        wr32(c + 16, m->crc);
        wr32(c + 20, zc ? 0xffffffffu : (uint32_t)m->comp);
        wr32(c + 24, zs ? 0xffffffffu : (uint32_t)m->size);
        wr16(c + 28, (uint32_t)nlen);
        wr16(c + 30, (uint32_t)xl);
        wr16(c + 32, 0);
        wr16(c + 34, 0);
        wr16(c + 36, 0);
        wr32(c + 38, 0100644u << 16); /* regular file, rw-r--r-- */
        wr32(c + 42, zo ? 0xffffffffu : (uint32_t)m->offset);
        if (!gb_put(&g, c, 46) || !gb_put(&g, fname, nlen) || !gb_put(&g, x, xl))
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    }
    uint64_t cd_size = g.len - cd_start, eocd64_at = g.len;
    uint64_t count_limit = zip64_from < 0xffffu ? zip64_from : 0xffffu;
    int z64 = n >= count_limit || cd_size >= zip64_from || cd_start >= zip64_from;
    if (!s && z64) {
        /* zip64 end record (56 bytes, no extensible data) and its locator, then the classic record
         * with every field that did not fit saturated */
        uint8_t r[56 + 20];
        wr32(r, SIG_EOCD64);
        wr64(r + 4, 56 - 12);
        wr16(r + 12, 45);
        wr16(r + 14, 45);
        wr32(r + 16, 0);
        wr32(r + 20, 0);
        wr64(r + 24, n);
        wr64(r + 32, n);
        wr64(r + 40, cd_size);
        wr64(r + 48, cd_start);
        wr32(r + 56, SIG_LOCATOR64);
        wr32(r + 60, 0);
        wr64(r + 64, eocd64_at);
        wr32(r + 72, 1);
        if (!gb_put(&g, r, sizeof r)) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    }
    if (!s) {
        uint8_t e[22];
        wr32(e, SIG_EOCD);
        wr16(e + 4, 0);
        wr16(e + 6, 0);
        wr16(e + 8, n >= count_limit ? 0xffffu : (uint32_t)n);
        wr16(e + 10, n >= count_limit ? 0xffffu : (uint32_t)n);
        wr32(e + 12, cd_size >= zip64_from ? 0xffffffffu : (uint32_t)cd_size);
        wr32(e + 16, cd_start >= zip64_from ? 0xffffffffu : (uint32_t)cd_start);
        wr16(e + 20, 0);
        if (!gb_put(&g, e, 22)) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ZIP_ARG, -1, -1, "out of memory");
    }
    free(wm);
    if (s) {
        free(g.p);
        return s;
    }
    *buf = g.p;
    *len = g.len;
    return mp_ok(err);
}

maskpack_status mpio_npz_encode(const mpio_named_tensor *items, size_t n, int deflate, uint8_t **buf, size_t *len,
                                maskpack_error *err) {
    return mpio_npz_encode_zip64_from(items, n, deflate, 0xffffffffu, buf, len, err);
}

maskpack_status mpio_npz_save(const char *path, const mpio_named_tensor *items, size_t n, int deflate,
                              maskpack_error *err) {
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_status s = mpio_npz_encode(items, n, deflate, &buf, &len, err);
    if (s) return s;
    s = mpio_write_file(path, buf, len, err);
    free(buf);
    return s;
}
