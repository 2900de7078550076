/* fuzz_npy.c: the .npy reader. Any status is fine for arbitrary bytes; on success the array must be
 * self-consistent, its view readable, and writing it back and reading again must give the same
 * values. */
#include "fuzz_common.h"

static void check_array(const mpio_array *a) {
    FUZZ_ASSERT(a->ndim >= 0 && a->ndim <= MASKPACK_MAX_DIMS, "ndim %d", (int)a->ndim);
    FUZZ_ASSERT((int)a->dtype >= 0 && a->dtype < MASKPACK_DTYPE_COUNT_ && a->dtype != MASKPACK_BF16, "dtype %d",
                (int)a->dtype);
    int64_t numel = mpio_array_numel(a);
    FUZZ_ASSERT((uint64_t)numel * maskpack_dtype_size(a->dtype) == a->nbytes, "nbytes %zu for %lld elements", a->nbytes,
                (long long)numel);
    FUZZ_ASSERT((a->nbytes == 0) == (a->data == NULL), "data pointer vs %zu bytes", a->nbytes);
    /* touch every byte: the sanitizers catch a short allocation */
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < a->nbytes; i++) sink ^= ((const uint8_t *)a->data)[i];
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mpio_array a;
    maskpack_error e;
    maskpack_status s = mpio_npy_parse(data, size, &a, &e);
    fuzz_check_error(s, &e);
    if (s) {
        FUZZ_ASSERT(a.data == NULL && a.nbytes == 0, "failed parse left data behind");
        return 0;
    }
    check_array(&a);
    /* round trip through the writer: same dtype, shape and C-order bytes */
    maskpack_tensor view = mpio_array_view(&a);
    uint8_t *buf = NULL;
    size_t len = 0;
    s = mpio_npy_encode(&view, &buf, &len, &e);
    FUZZ_ASSERT(s == MASKPACK_OK, "re-encoding a parsed array failed: %s", e.message);
    mpio_array b;
    s = mpio_npy_parse(buf, len, &b, &e);
    FUZZ_ASSERT(s == MASKPACK_OK, "re-parsing our own output failed: %s", e.message);
    FUZZ_ASSERT(b.dtype == a.dtype && b.ndim == a.ndim && !b.fortran_order, "round trip changed the header");
    for (int32_t d = 0; d < a.ndim; d++) FUZZ_ASSERT(b.shape[d] == a.shape[d], "round trip changed dim %d", (int)d);
    uint8_t *c_order = malloc(a.nbytes ? a.nbytes : 1);
    if (c_order) {
        mpio_copy_contiguous(&view, c_order);
        FUZZ_ASSERT(b.nbytes == a.nbytes && (a.nbytes == 0 || memcmp(c_order, b.data, a.nbytes) == 0),
                    "round trip changed the data");
        free(c_order);
    }
    free(buf);
    mpio_array_free(&b);
    mpio_array_free(&a);
    return 0;
}
