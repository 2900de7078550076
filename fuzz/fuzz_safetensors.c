/* fuzz_safetensors.c: the .safetensors reader. Any status is fine for arbitrary bytes; parsed tensors
 * must be self-consistent and survive a write/read round trip. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    maskpack_error e;
    mpio_arrayset set;
    maskpack_status s = mpio_safetensors_parse(data, size, &set, &e);
    fuzz_check_error(s, &e);
    if (s) {
        FUZZ_ASSERT(set.n == 0 && set.arrays == NULL, "failed parse left arrays behind");
        return 0;
    }
    size_t m = set.n < 64 ? set.n : 64;
    mpio_named_tensor items[64];
    memset(items, 0, sizeof items); /* .text NULL: the arrays read back are tensors, not text items */
    for (size_t i = 0; i < m; i++) {
        const mpio_array *a = &set.arrays[i];
        FUZZ_ASSERT(a->name && strcmp(a->name, "__metadata__") != 0, "tensor %zu name", i);
        FUZZ_ASSERT((uint64_t)mpio_array_numel(a) * maskpack_dtype_size(a->dtype) == a->nbytes, "'%s' size", a->name);
        FUZZ_ASSERT(!a->fortran_order, "safetensors has no Fortran order");
        for (size_t j = 0; j < i; j++) FUZZ_ASSERT(strcmp(set.arrays[j].name, a->name) != 0, "duplicate '%s'", a->name);
        volatile uint8_t sink = 0;
        for (size_t b = 0; b < a->nbytes; b++) sink ^= ((const uint8_t *)a->data)[b];
        (void)sink;
        items[i].name = a->name;
        items[i].tensor = mpio_array_view(a);
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    s = mpio_safetensors_encode(items, m, &buf, &len, &e);
    if (s == MASKPACK_OK) {
        mpio_arrayset back;
        s = mpio_safetensors_parse(buf, len, &back, &e);
        FUZZ_ASSERT(s == MASKPACK_OK, "re-parsing our own file failed: %s", e.message);
        FUZZ_ASSERT(back.n == m, "%zu tensors became %zu", m, back.n);
        for (size_t i = 0; i < m; i++) {
            const mpio_array *a = &set.arrays[i], *b = &back.arrays[i];
            FUZZ_ASSERT(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim &&
                            a->nbytes == b->nbytes,
                        "'%s' changed in the round trip", a->name);
            for (int32_t d = 0; d < a->ndim; d++)
                FUZZ_ASSERT(a->shape[d] == b->shape[d], "'%s' dim %d", a->name, (int)d);
            FUZZ_ASSERT(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0, "'%s' data changed", a->name);
        }
        mpio_arrayset_free(&back);
        free(buf);
    } else {
        FUZZ_ASSERT(s == MASKPACK_ERR_INVALID_ARGUMENT || s == MASKPACK_ERR_OUT_OF_MEMORY ||
                        s == MASKPACK_ERR_UNSUPPORTED,
                    "writing parsed tensors failed with %s: %s", maskpack_status_name(s), e.message);
    }
    mpio_arrayset_free(&set);
    return 0;
}
