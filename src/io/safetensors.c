/* safetensors.c: the .safetensors reader and writer.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON (an object mapping tensor names
 * to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" object), then
 * the data section; offsets are relative to the data section. The JSON is parsed with cJSON from a
 * NUL-terminated copy, so the parser can never read past the header. */
#include "io.h"

#include "internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_ARG "safetensors"
/* the reference implementation refuses headers above 100 MB; so do we */
#define ST_MAX_HEADER 100000000u

static const struct {
    const char *name;
    maskpack_dtype dtype;
} st_dtypes[] = {
    {"BOOL", MASKPACK_BOOL}, {"U8", MASKPACK_U8},   {"I8", MASKPACK_I8},   {"I16", MASKPACK_I16},
    {"I32", MASKPACK_I32},   {"I64", MASKPACK_I64}, {"F16", MASKPACK_F16}, {"BF16", MASKPACK_BF16},
    {"F32", MASKPACK_F32},   {"F64", MASKPACK_F64},
};
#define N_ST_DTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

/* dtype names the format defines that maskpack does not read */
static const char *const st_other[] = {"U16", "U32",     "U64",     "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                       "F4",  "F6_E2M3", "F6_E3M2", "C64",     "E8M0"};

/* A JSON number that is a non-negative integer exactly representable in a double. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

typedef struct st_range {
    uint64_t begin, end;
    const char *name;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Validates one tensor entry and fills *a (without data) and *r. */
static maskpack_status read_entry(const cJSON *item, uint64_t data_len, mpio_array *a, st_range *r,
                                  maskpack_error *err) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1, "safetensors: entry '%s' is not an object", name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: tensor '%s' needs a string 'dtype' and arrays 'shape' and 'data_offsets'", name);
    size_t k = 0;
    while (k < N_ST_DTYPES && strcmp(st_dtypes[k].name, dt->valuestring) != 0) k++;
    if (k == N_ST_DTYPES) {
        for (size_t o = 0; o < sizeof st_other / sizeof st_other[0]; o++)
            if (strcmp(st_other[o], dt->valuestring) == 0)
                return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ST_ARG, -1, -1,
                               "safetensors: tensor '%s' has dtype %s, which is not supported (expected BOOL U8 I8 "
                               "I16 I32 I64 F16 BF16 F32 F64)",
                               name, dt->valuestring);
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1, "safetensors: tensor '%s' has unknown dtype '%.40s'",
                       name, dt->valuestring);
    }
    a->dtype = st_dtypes[k].dtype;
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > MASKPACK_MAX_DIMS)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ST_ARG, -1, -1,
                       "safetensors: tensor '%s' has %d dimensions, more than %d are not supported", name, ndim,
                       MASKPACK_MAX_DIMS);
    a->ndim = ndim;
    int64_t numel = 1, nbytes;
    int d = 0;
    for (const cJSON *v = shape->child; v; v = v->next, d++) {
        uint64_t dim;
        if (!json_uint(v, &dim))
            return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, d, -1,
                           "safetensors: tensor '%s': shape[%d] is not a non-negative integer below 2^53", name, d);
        a->shape[d] = (int64_t)dim;
    }
    /* a zero dimension means no element however large the others are (as in the .npy reader),
       so the product is only checked for overflow when every dimension is non-zero */
    int empty = 0;
    for (int i = 0; i < ndim; i++) empty |= a->shape[i] == 0;
    for (int i = 0; i < ndim && !empty; i++)
        if (mp_mul_overflow(numel, a->shape[i], &numel))
            return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, i, -1,
                           "safetensors: tensor '%s': shape element count overflows int64 at dimension %d (%lld)", name,
                           i, (long long)a->shape[i]);
    if (empty) numel = 0;
    if (mp_mul_overflow(numel, (int64_t)maskpack_dtype_size(a->dtype), &nbytes))
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: tensor '%s': byte size of %lld elements overflows", name, (long long)numel);
    if (cJSON_GetArraySize(offs) != 2 || !json_uint(offs->child, &r->begin) || !json_uint(offs->child->next, &r->end))
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: tensor '%s': data_offsets must be two non-negative integers [begin, end]", name);
    if (r->begin > r->end || r->end > data_len)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: tensor '%s': data_offsets [%llu, %llu] lie outside the %llu-byte data section",
                       name, (unsigned long long)r->begin, (unsigned long long)r->end, (unsigned long long)data_len);
    if (r->end - r->begin != (uint64_t)nbytes)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: tensor '%s': shape x %s needs %lld bytes, data_offsets span %llu", name,
                       dt->valuestring, (long long)nbytes, (unsigned long long)(r->end - r->begin));
    if ((uint64_t)nbytes > MPIO_MAX_BYTES)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, ST_ARG, -1, -1,
                       "safetensors: tensor '%s' has %lld bytes, more than this reader accepts", name,
                       (long long)nbytes);
    a->nbytes = (size_t)nbytes;
    r->name = name;
    return MASKPACK_OK;
}

/* Index of the first byte of p[0..n) that is not part of well-formed UTF-8 (no overlong forms, no
 * surrogates, nothing past U+10FFFF), or n. JSON text is UTF-8: names that are not would reach the
 * report and the arrays' names as arbitrary bytes. */
static size_t utf8_invalid_at(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (n - i <= k) return i;
        for (size_t t = 1; t <= k; t++) {
            if ((p[i + t] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (p[i + t] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += k + 1;
    }
    return n;
}

static maskpack_status parse_json(const uint8_t *b, size_t len, uint64_t *data_start, cJSON **root,
                                  maskpack_error *err) {
    if (len < 8)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: %zu bytes are too few for the 8-byte header length", len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    if (n > len - 8)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: header length %llu is larger than the file (%zu bytes follow)",
                       (unsigned long long)n, len - 8);
    if (n > ST_MAX_HEADER)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: header length %llu exceeds the format's 100 MB limit", (unsigned long long)n);
    if (n < 2 || b[8] != '{')
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: header must be a JSON object starting with '{'");
    if (memchr(b + 8, 0, (size_t)n))
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1, "safetensors: header contains a NUL byte");
    size_t bad = utf8_invalid_at(b + 8, (size_t)n);
    if (bad < (size_t)n)
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: header is not valid UTF-8 (byte %zu of the header, 0x%02x)", bad, b[8 + bad]);
    char *text = malloc((size_t)n + 1);
    if (!text) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
    memcpy(text, b + 8, (size_t)n);
    text[n] = 0;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 0);
    if (!j) {
        size_t at = end ? (size_t)(end - text) : 0;
        free(text);
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: header is not valid JSON (near byte %zu)", at);
    }
    /* only padding (spaces) may follow the object */
    for (const char *p = end; *p; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            size_t at = (size_t)(p - text);
            free(text);
            cJSON_Delete(j);
            return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                           "safetensors: unexpected bytes after the header's JSON object (at byte %zu)", at);
        }
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1, "safetensors: header is not a JSON object");
    }
    /* __metadata__, when present, is an object (the format's map; what it holds is not read) */
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "__metadata__");
    if (meta && !cJSON_IsObject(meta)) {
        cJSON_Delete(j);
        return mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                       "safetensors: __metadata__ must be an object, found %s",
                       cJSON_IsArray(meta)    ? "an array"
                       : cJSON_IsString(meta) ? "a string"
                                              : "a scalar");
    }
    *root = j;
    *data_start = 8 + n;
    return MASKPACK_OK;
}

maskpack_status mpio_safetensors_parse(const void *buf, size_t len, mpio_arrayset *out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    memset(out, 0, sizeof *out);
    if (len) MP_CHECK_NULL(err, buf, "buf");
    const uint8_t *b = buf;
    cJSON *root = NULL;
    uint64_t data_start = 0;
    maskpack_status s = parse_json(b, len, &data_start, &root, err);
    if (s) return s;
    uint64_t data_len = len - data_start;
    size_t count = 0;
    for (const cJSON *it = root->child; it; it = it->next)
        if (strcmp(it->string, "__metadata__") != 0) count++;
    mpio_arrayset set = {0, calloc(count ? count : 1, sizeof(mpio_array))};
    st_range *ranges = calloc(count ? count : 1, sizeof *ranges);
    if (!set.arrays || !ranges) {
        free(set.arrays);
        free(ranges);
        cJSON_Delete(root);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
    }
    size_t k = 0;
    for (const cJSON *it = root->child; it && !s; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        s = read_entry(it, data_len, &set.arrays[k], &ranges[k], err);
        if (!s) {
            set.arrays[k].name = mpio_strdup(it->string);
            set.n = ++k;
            if (!set.arrays[k - 1].name) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
        }
    }
    if (!s && count > 1) {
        /* names are unique (sorted copy: headers may hold very many entries) */
        const char **names = mp_alloc_array(count, sizeof *names);
        if (!names) {
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
        } else {
            for (size_t i = 0; i < count; i++) names[i] = set.arrays[i].name;
            qsort(names, count, sizeof *names, cmp_name);
            for (size_t i = 1; i < count && !s; i++)
                if (strcmp(names[i], names[i - 1]) == 0)
                    s = mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1, "safetensors: tensor name '%s' appears twice",
                                names[i]);
            free(names);
        }
    }
    if (!s && count > 1) {
        /* two tensors may not share bytes (empty tensors occupy none) */
        st_range *sorted = mp_alloc_array(count, sizeof *sorted);
        if (!sorted) {
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
        } else {
            memcpy(sorted, ranges, count * sizeof *sorted);
            qsort(sorted, count, sizeof *sorted, cmp_range);
            const st_range *prev = NULL;
            for (size_t i = 0; i < count && !s; i++) {
                if (sorted[i].begin == sorted[i].end) continue;
                if (prev && sorted[i].begin < prev->end)
                    s = mp_fail(err, MASKPACK_ERR_FORMAT, ST_ARG, -1, -1,
                                "safetensors: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", prev->name,
                                (unsigned long long)prev->begin, (unsigned long long)prev->end, sorted[i].name,
                                (unsigned long long)sorted[i].begin, (unsigned long long)sorted[i].end);
                prev = &sorted[i];
            }
            free(sorted);
        }
    }
    for (size_t i = 0; i < set.n && !s; i++) {
        mpio_array *a = &set.arrays[i];
        if (!a->nbytes) continue;
        a->data = malloc(a->nbytes); /* aligned copy: offsets need not respect the dtype's alignment */
        if (!a->data) {
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "safetensors: out of memory for '%s'",
                        a->name);
            break;
        }
        memcpy(a->data, b + data_start + ranges[i].begin, a->nbytes);
    }
    free(ranges);
    cJSON_Delete(root);
    if (s) {
        mpio_arrayset_free(&set);
        return s;
    }
    *out = set;
    return mp_ok(err);
}

maskpack_status mpio_safetensors_load(const char *path, mpio_arrayset *out, maskpack_error *err) {
    return mpio_load_set(path, mpio_safetensors_parse, out, err);
}

static const char *st_name(maskpack_dtype d) {
    for (size_t k = 0; k < N_ST_DTYPES; k++)
        if (st_dtypes[k].dtype == d) return st_dtypes[k].name;
    return NULL;
}

/* An integer as JSON, digit for digit: cJSON prints numbers as doubles with 15 significant digits
 * when they round-trip within a relative epsilon, which turns 7649962429496729 into ...730 (a zero
 * dimension lets such extents through, and the reader accepts integers up to 2^53). */
static cJSON *json_int(uint64_t v) {
    char digits[24];
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(digits);
}

maskpack_status mpio_safetensors_encode(const mpio_named_tensor *items, size_t n, uint8_t **buf, size_t *len,
                                        maskpack_error *err) {
    MP_CHECK_NULL(err, buf, "buf");
    MP_CHECK_NULL(err, len, "len");
    if (n) MP_CHECK_NULL(err, items, "items");
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!items[i].name || !items[i].name[0] || strcmp(items[i].name, "__metadata__") == 0)
            return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "items", (int64_t)i, -1,
                           "items[%zu].name: expected a non-empty name other than __metadata__", i);
        for (size_t j = 0; j < i; j++)
            if (strcmp(items[i].name, items[j].name) == 0)
                return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "items", (int64_t)i, -1,
                               "items[%zu].name: '%s' repeats items[%zu]", i, items[i].name, j);
        if (items[i].text) { /* a text item goes to __metadata__ (safetensors has no string tensors) */
            maskpack_status s = mpio_check_text(items[i].text, items[i].name, err);
            if (s) return s;
            continue;
        }
        maskpack_status s = mp_check_tensor(&items[i].tensor, items[i].name, 0, MASKPACK_MAX_DIMS, err);
        if (s) return s;
        total += (uint64_t)mp_numel(&items[i].tensor) * maskpack_dtype_size(items[i].tensor.dtype);
        if (total > MPIO_MAX_BYTES)
            return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "items", (int64_t)i, -1,
                           "items: more than %llu bytes of tensors", (unsigned long long)MPIO_MAX_BYTES);
    }
    cJSON *root = cJSON_CreateObject();
    maskpack_status s = MASKPACK_OK;
    uint64_t off = 0;
    cJSON *meta = NULL;
    for (size_t i = 0; i < n && root && !s; i++) {
        if (!items[i].text) continue;
        if (!meta) meta = cJSON_AddObjectToObject(root, "__metadata__");
        if (!meta || !cJSON_AddStringToObject(meta, items[i].name, items[i].text))
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
    }
    for (size_t i = 0; i < n && root && !s; i++) {
        if (items[i].text) continue;
        const maskpack_tensor *t = &items[i].tensor;
        uint64_t nb = (uint64_t)mp_numel(t) * maskpack_dtype_size(t->dtype);
        cJSON *e = cJSON_AddObjectToObject(root, items[i].name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        if (!e || !shape || !offs || !cJSON_AddStringToObject(e, "dtype", st_name(t->dtype))) {
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
            break;
        }
        for (int32_t d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, json_int((uint64_t)t->shape[d]));
        cJSON_AddItemToArray(offs, json_int(off));
        cJSON_AddItemToArray(offs, json_int(off + nb));
        off += nb;
    }
    char *text = root && !s ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return s ? s : mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
    size_t tlen = strlen(text), hlen = (tlen + 7) / 8 * 8; /* pad with spaces: data starts 8-aligned */
    uint8_t *out = malloc(8 + hlen + (size_t)off);
    if (!out) {
        free(text);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, ST_ARG, -1, -1, "out of memory");
    }
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(out + 8, text, tlen);
    memset(out + 8 + tlen, ' ', hlen - tlen);
    free(text);
    size_t pos = 8 + hlen;
    for (size_t i = 0; i < n; i++) {
        if (items[i].text) continue;
        const maskpack_tensor *t = &items[i].tensor;
        mpio_copy_contiguous(t, out + pos);
        pos += (size_t)mp_numel(t) * maskpack_dtype_size(t->dtype);
    }
    *buf = out;
    *len = pos;
    return mp_ok(err);
}

maskpack_status mpio_safetensors_save(const char *path, const mpio_named_tensor *items, size_t n, maskpack_error *err) {
    uint8_t *buf = NULL;
    size_t len = 0;
    maskpack_status s = mpio_safetensors_encode(items, n, &buf, &len, err);
    if (s) return s;
    s = mpio_write_file(path, buf, len, err);
    free(buf);
    return s;
}
