/* from_cu_seqlens.c: packed (THD) layouts from cumulative sequence lengths, in the TE/flash-attn
 * form [0, e1, ..., eN] or the Ascend NPU form [e1, ..., eN] (docs/conventions.md sections 1 and 6), with
 * optional TE cu_seqlens_padded slot offsets, and the cross-attention variant with separate q and kv
 * lists. */
#include "internal.h"

#include <stdlib.h>

/* A self-attention segment (kv == q); the remaining fields (flags, q_pos, origin) stay zero. */
static maskpack_segment self_seg(int64_t row, int64_t start, int64_t len) {
    return (maskpack_segment){.row = row, .q_start = start, .q_len = len, .kv_start = start, .kv_len = len};
}

/* A validated cumulative list seen as boundaries b[0..n]: b[0] = 0 and b[k+1] = end of item k. */
typedef struct cu_view {
    const maskpack_tensor *t;
    int leading; /* 1 when the tensor holds b[0] (TE form), 0 when b[0] is implied (NPU form) */
    int64_t n;   /* number of items */
} cu_view;

static int64_t cu_raw(const maskpack_tensor *t, int64_t i) { return mp_read_i64(t->dtype, t->data, i * t->strides[0]); }

static int64_t cu_bound(const cu_view *v, int64_t k) {
    if (!v->leading) return k == 0 ? 0 : cu_raw(v->t, k - 1);
    return cu_raw(v->t, k);
}

/* Checks a cumulative list in `form` and fills *v. Accepted: int32/int64 1-D; TE: at least [0],
 * starts at 0; NPU: entries >= 0 (a leading 0 there is an empty first item, not an error). Both:
 * non-decreasing. */
static maskpack_status cu_check(const maskpack_tensor *t, const char *name, maskpack_cu_form form, cu_view *v,
                                maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 1, 1, err);
    if (s) return s;
    if (t->dtype != MASKPACK_I32 && t->dtype != MASKPACK_I64)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected int32 or int64, found %s", name,
                       maskpack_dtype_name(t->dtype));
    int64_t len = t->shape[0];
    v->t = t;
    if (form == MASKPACK_CU_TE) {
        if (len < 1)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                           "%s: expected N+1 >= 1 entries in TE form [0, e1, ..., eN], found 0", name);
        int64_t first = cu_raw(t, 0);
        if (first < 0)
            return mp_fail(err, MASKPACK_ERR_VALUE, name, 0, -1, "%s[0]: expected 0, found %lld", name,
                           (long long)first);
        if (first != 0)
            return mp_fail(err, MASKPACK_ERR_CONVENTION, name, 0, -1,
                           "%s[0]: expected 0, found %lld: a TE-form list [0, e1, ..., eN] starts with 0; a list of "
                           "cumulative ends without the leading 0 is the NPU form (pass MASKPACK_CU_NPU)",
                           name, (long long)first);
        v->leading = 1;
        v->n = len - 1;
    } else if (form == MASKPACK_CU_NPU) {
        if (len > 0 && cu_raw(t, 0) < 0)
            return mp_fail(err, MASKPACK_ERR_VALUE, name, 0, -1, "%s[0]: expected >= 0, found %lld", name,
                           (long long)cu_raw(t, 0));
        v->leading = 0;
        v->n = len;
    } else {
        return mp_fail(err, MASKPACK_ERR_CONVENTION, "form", -1, -1, "form: expected TE (0) or NPU (1), found %d",
                       (int)form);
    }
    for (int64_t i = 1; i < len; i++) {
        int64_t prev = cu_raw(t, i - 1), cur = cu_raw(t, i);
        if (cur < prev)
            return mp_fail(err, MASKPACK_ERR_UNSORTED, name, i, -1,
                           "%s[%lld]: expected >= %lld (non-decreasing), found %lld", name, (long long)i,
                           (long long)prev, (long long)cur);
    }
    if ((uint64_t)v->n > SIZE_MAX / sizeof(maskpack_segment))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, name, -1, -1, "%s: too many entries", name);
    return MASKPACK_OK;
}

maskpack_status maskpack_layout_from_cu_seqlens(const maskpack_tensor *cu, maskpack_cu_form form, int64_t total,
                                                const maskpack_tensor *cu_padded, const maskpack_rule *rule,
                                                maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    MP_CHECK_NULL(err, cu, "cu_seqlens");
    cu_view v;
    maskpack_status s = cu_check(cu, "cu_seqlens", form, &v, err);
    if (s) return s;
    if (total < 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "total", -1, -1,
                       "total: expected >= 0 (0 = the last end), found %lld", (long long)total);
    int64_t last = cu_bound(&v, v.n);

    cu_view p = {0};
    if (cu_padded) {
        /* slot offsets are always TE form [0, p1, ..., pN], whatever form the real lengths use */
        s = cu_check(cu_padded, "cu_seqlens_padded", MASKPACK_CU_TE, &p, err);
        if (s) return s;
        if (p.n != v.n)
            return mp_fail(err, MASKPACK_ERR_SHAPE, "cu_seqlens_padded", -1, -1,
                           "cu_seqlens_padded: expected %lld entries (N+1 for the %lld sequences of cu_seqlens), "
                           "found %lld",
                           (long long)(v.n + 1), (long long)v.n, (long long)cu_padded->shape[0]);
        for (int64_t k = 0; k < v.n; k++) {
            int64_t len = cu_bound(&v, k + 1) - cu_bound(&v, k);
            int64_t slot = cu_bound(&p, k + 1) - cu_bound(&p, k);
            if (slot < len)
                return mp_fail(err, MASKPACK_ERR_VALUE, "cu_seqlens_padded", k + 1, -1,
                               "cu_seqlens_padded[%lld]: expected >= cu_seqlens_padded[%lld] + %lld (slot %lld must "
                               "hold its %lld real tokens), found a slot of %lld",
                               (long long)(k + 1), (long long)k, (long long)len, (long long)k, (long long)len,
                               (long long)slot);
        }
        /* every slot holds its sequence and slots start at 0, so the last slot end bounds the last real end */
        last = cu_bound(&p, p.n);
    }
    if (total == 0) total = last;
    if (total < last)
        return mp_fail(err, MASKPACK_ERR_VALUE, "total", -1, -1, "total: expected >= %lld (the last %s), found %lld",
                       (long long)last, cu_padded ? "entry of cu_seqlens_padded" : "end in cu_seqlens",
                       (long long)total);

    size_t n = (size_t)v.n;
    maskpack_segment *segs = mp_alloc_array(n, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "cu_seqlens", -1, -1, "out of memory");
    for (int64_t k = 0; k < v.n; k++) {
        int64_t len = cu_bound(&v, k + 1) - cu_bound(&v, k);
        int64_t start = cu_padded ? cu_bound(&p, k) : cu_bound(&v, k);
        segs[k] = self_seg(0, start, len);
    }
    return mp_layout_build(segs, n, 1, total, total, 1, rule, out, err);
}

maskpack_status maskpack_layout_from_cu_seqlens_qk(const maskpack_tensor *cu_q, const maskpack_tensor *cu_kv,
                                                   maskpack_cu_form form, const maskpack_rule *rule,
                                                   maskpack_layout **out, maskpack_error *err) {
    MP_CHECK_NULL(err, out, "out");
    MP_CHECK_NULL(err, cu_q, "cu_seqlens_q");
    MP_CHECK_NULL(err, cu_kv, "cu_seqlens_kv");
    cu_view q, kv;
    maskpack_status s = cu_check(cu_q, "cu_seqlens_q", form, &q, err);
    if (s) return s;
    s = cu_check(cu_kv, "cu_seqlens_kv", form, &kv, err);
    if (s) return s;
    if (q.n != kv.n)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "cu_seqlens_kv", -1, -1,
                       "cu_seqlens_kv: expected %lld entries (as many sequences as cu_seqlens_q), found %lld",
                       (long long)cu_q->shape[0], (long long)cu_kv->shape[0]);
    size_t n = (size_t)q.n;
    maskpack_segment *segs = mp_alloc_array(n, sizeof *segs);
    if (!segs) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "cu_seqlens_q", -1, -1, "out of memory");
    for (int64_t k = 0; k < q.n; k++) {
        int64_t qs = cu_bound(&q, k), ks = cu_bound(&kv, k);
        segs[k] = (maskpack_segment){.row = 0,
                                     .q_start = qs,
                                     .q_len = cu_bound(&q, k + 1) - qs,
                                     .kv_start = ks,
                                     .kv_len = cu_bound(&kv, k + 1) - ks};
    }
    return mp_layout_build(segs, n, 1, cu_bound(&q, q.n), cu_bound(&kv, kv.n), 1, rule, out, err);
}
