/* fuzz_npz.c: the zip reader and the .npz layer. Any status is fine for arbitrary bytes; an opened
 * archive must list members that extract to their declared sizes (or fail cleanly), and a parsed
 * .npz must survive a write/read round trip with identical names, dtypes, shapes and data. */
#include "fuzz_common.h"

static void check_same(const mpio_array *a, const mpio_array *b) {
    FUZZ_ASSERT(strcmp(a->name, b->name) == 0, "name '%s' became '%s'", a->name, b->name);
    FUZZ_ASSERT(a->dtype == b->dtype && a->ndim == b->ndim, "'%s': header changed", a->name);
    for (int32_t d = 0; d < a->ndim; d++) FUZZ_ASSERT(a->shape[d] == b->shape[d], "'%s': dim %d", a->name, (int)d);
    uint8_t *c_order = malloc(a->nbytes ? a->nbytes : 1);
    if (!c_order) return;
    maskpack_tensor v = mpio_array_view(a);
    mpio_copy_contiguous(&v, c_order);
    FUZZ_ASSERT(a->nbytes == b->nbytes && (a->nbytes == 0 || memcmp(c_order, b->data, a->nbytes) == 0),
                "'%s': data changed", a->name);
    free(c_order);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    maskpack_error e;
    mpio_zip *z = NULL;
    maskpack_status s = mpio_zip_open(data, size, &z, &e);
    fuzz_check_error(s, &e);
    if (s == MASKPACK_OK) {
        size_t n = mpio_zip_count(z);
        FUZZ_ASSERT(n <= size / 46 + 1, "%zu members in %zu bytes", n, size);
        for (size_t i = 0; i < n; i++) {
            const char *name = mpio_zip_name(z, i);
            FUZZ_ASSERT(name && name[0], "member %zu has no name", i);
            size_t idx = 0;
            FUZZ_ASSERT(mpio_zip_find(z, name, &idx, &e) == MASKPACK_OK && idx == i, "find('%s') != %zu", name, i);
            uint8_t *bytes = NULL;
            size_t len = 0;
            s = mpio_zip_extract(z, i, &bytes, &len, &e);
            fuzz_check_error(s, &e);
            if (s == MASKPACK_OK) free(bytes);
        }
        size_t idx;
        FUZZ_ASSERT(mpio_zip_find(z, "\x01no such member", &idx, &e) == MASKPACK_ERR_NOT_FOUND,
                    "find invented a member");
        mpio_zip_close(z);
    }
    mpio_arrayset set;
    s = mpio_npz_parse(data, size, &set, &e);
    fuzz_check_error(s, &e);
    if (s) {
        FUZZ_ASSERT(set.n == 0 && set.arrays == NULL, "failed parse left arrays behind");
        return 0;
    }
    mpio_named_tensor items[64];
    memset(items, 0, sizeof items); /* .text NULL: the arrays read back are tensors, not text items */
    size_t m = set.n < 64 ? set.n : 64;
    for (size_t i = 0; i < m; i++) {
        FUZZ_ASSERT(set.arrays[i].name != NULL, "member %zu without a name", i);
        items[i].name = set.arrays[i].name;
        items[i].tensor = mpio_array_view(&set.arrays[i]);
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    s = mpio_npz_encode(items, m, size ? data[0] & 1 : 0, &buf, &len, &e);
    /* names may legitimately be unwritable (duplicates after stripping ".npy", very long) */
    if (s == MASKPACK_OK) {
        mpio_arrayset back;
        s = mpio_npz_parse(buf, len, &back, &e);
        FUZZ_ASSERT(s == MASKPACK_OK, "re-parsing our own archive failed: %s", e.message);
        FUZZ_ASSERT(back.n == m, "%zu members became %zu", m, back.n);
        for (size_t i = 0; i < m; i++) check_same(&set.arrays[i], &back.arrays[i]);
        mpio_arrayset_free(&back);
        free(buf);
    } else {
        FUZZ_ASSERT(s == MASKPACK_ERR_INVALID_ARGUMENT || s == MASKPACK_ERR_UNSUPPORTED ||
                        s == MASKPACK_ERR_OUT_OF_MEMORY,
                    "writing parsed arrays failed with %s: %s", maskpack_status_name(s), e.message);
    }
    mpio_arrayset_free(&set);
    return 0;
}
