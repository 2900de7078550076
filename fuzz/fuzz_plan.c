/* fuzz_plan.c: `maskpack plan`'s input parsing (text lines, JSON lines with a length, a token list or
 * an object, or a 1-D integer .npy) from memory, then a small plan of what it read. Invariants: a
 * parsed file has at most one length per input byte (plus one); a plan of the lengths, when it
 * builds, places every sequence once and keeps its rows within the capacity. */
#include "fuzz_common.h"

#include "plan_cmd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t *v = NULL;
    size_t n = 0;
    const char *kind = NULL;
    int rc = mp_cli_plan_parse_lengths("fuzz-input", data, size, &v, &n, &kind);
    FUZZ_ASSERT(rc == 0 || rc == 1, "parse status %d", rc);
    if (rc != 0) {
        FUZZ_ASSERT(v == NULL && n == 0, "a failed parse returned lengths");
        return 0;
    }
    FUZZ_ASSERT(kind != NULL, "no kind");
    FUZZ_ASSERT(n <= size + 1, "%zu lengths from %zu bytes", n, size);
    if (n > 0 && n <= 4096) {
        int64_t cap = 1;
        for (size_t i = 0; i < n; i++)
            if (v[i] > cap) cap = v[i];
        if (cap > (1 << 20)) cap = 1 << 20;
        maskpack_plan_options o = maskpack_plan_options_default(cap);
        o.dp = 1 + (int64_t)(n % 3);
        o.micro_batches = 1 + (int64_t)(n % 2);
        /* split only when the pieces stay few: a length of 10^18 into rows of 2^20 is 10^12 pieces */
        uint64_t pieces = 0;
        for (size_t i = 0; i < n; i++) pieces += v[i] > 0 ? (uint64_t)(v[i] / cap) + 1 : 1;
        o.allow_split = pieces <= 65536;
        maskpack_plan *p = NULL;
        maskpack_error e;
        maskpack_status s = maskpack_plan_create(v, n, &o, &p, &e);
        fuzz_check_error(s, &e);
        if (s == MASKPACK_OK) {
            FUZZ_ASSERT(maskpack_plan_n_sequences(p) == (int64_t)n, "plan lost sequences");
            for (int64_t r = 0; r < maskpack_plan_n_rows(p); r++)
                FUZZ_ASSERT(maskpack_plan_row_used(p, r) <= cap, "row %lld over capacity", (long long)r);
            maskpack_plan_free(p);
        }
    }
    free(v);
    return 0;
}
