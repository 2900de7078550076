/*
 * _layout.c: the layout part of maskpack._maskpack: window conversions, the constructors (segments,
 * lengths, masks, cu_seqlens, position_ids), the queries, the derived outputs (masks, cu_seqlens,
 * positions, block masks, MAGI slices, NPU arguments and their check) and the derived layouts
 * (packed, padded, CP shards). Every function takes and returns Layout handles (ext_common.c); the GIL is
 * released around every call that may touch a whole mask (the layout is immutable, and the package keeps
 * every tensor alive for the call).
 */
#include "ext_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static PyObject *window_conv(PyObject *arg, int hf) {
    long long w = PyLong_AsLongLong(arg);
    if (w == -1 && PyErr_Occurred()) return NULL;
    int64_t l = 0, r = 0;
    maskpack_error err;
    maskpack_status s = hf ? maskpack_window_from_hf(w, &l, &r, &err) : maskpack_window_from_gym(w, &l, &r, &err);
    if (s) return mpx_raise_status(s, &err);
    return Py_BuildValue("(LL)", (long long)l, (long long)r);
}

static PyObject *py_window_from_hf(PyObject *Py_UNUSED(m), PyObject *arg) { return window_conv(arg, 1); }
static PyObject *py_window_from_gym(PyObject *Py_UNUSED(m), PyObject *arg) { return window_conv(arg, 0); }

/* ---- constructors ------------------------------------------------------------------------------ */

/* (segments: seq of (row, q_start, q_len, kv_start, kv_len[, q_pos|None]), n_rows, q_width, kv_width,
 *  packed, rule) -> handle */
static PyObject *py_from_segments(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *segs_obj, *rule_obj;
    long long n_rows, qw, kw;
    int packed;
    if (!PyArg_ParseTuple(args, "OLLLpO", &segs_obj, &n_rows, &qw, &kw, &packed, &rule_obj)) return NULL;
    PyObject *seq = PySequence_Fast(segs_obj, "segments: expected a sequence of tuples");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    maskpack_segment *segs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *segs);
    if (!segs) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i), "segment: expected a tuple");
        if (!it) goto fail;
        Py_ssize_t k = PySequence_Fast_GET_SIZE(it);
        if (k != 5 && k != 6) {
            Py_DECREF(it);
            PyErr_Format(PyExc_TypeError,
                         "segments[%zd]: expected (row, q_start, q_len, kv_start, kv_len[, q_pos]), found %zd fields",
                         i, k);
            goto fail;
        }
        int64_t v[5];
        for (int f = 0; f < 5; f++) {
            long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(it, f));
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(it);
                goto fail;
            }
            v[f] = (int64_t)x;
        }
        segs[i].row = v[0];
        segs[i].q_start = v[1];
        segs[i].q_len = v[2];
        segs[i].kv_start = v[3];
        segs[i].kv_len = v[4];
        if (k == 6 && PySequence_Fast_GET_ITEM(it, 5) != Py_None) {
            long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(it, 5));
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(it);
                goto fail;
            }
            segs[i].flags = MASKPACK_SEGMENT_EXPLICIT_POS;
            segs[i].q_pos = (int64_t)x;
        }
        Py_DECREF(it);
    }
    Py_DECREF(seq);
    seq = NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) {
        PyMem_Free(segs);
        return NULL;
    }
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_layout_from_segments(segs, (size_t)n, n_rows, qw, kw, packed, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS PyMem_Free(segs);
    mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
fail:
    Py_XDECREF(seq);
    PyMem_Free(segs);
    return NULL;
}

/* (lengths: seq of int, placement, capacity, rule) -> handle */
static PyObject *py_from_lengths(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *lens_obj, *rule_obj;
    int placement;
    long long capacity;
    if (!PyArg_ParseTuple(args, "OiLO", &lens_obj, &placement, &capacity, &rule_obj)) return NULL;
    PyObject *seq = PySequence_Fast(lens_obj, "lengths: expected a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *lens = PyMem_Calloc(n ? (size_t)n : 1, sizeof *lens);
    if (!lens) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (mpx_item_i64(PySequence_Fast_GET_ITEM(seq, i), "lengths", i, &lens[i]) < 0) {
            Py_DECREF(seq);
            PyMem_Free(lens);
            return NULL;
        }
    }
    Py_DECREF(seq);
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) {
        PyMem_Free(lens);
        return NULL;
    }
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_layout_from_lengths(lens, (size_t)n, (maskpack_placement)placement, capacity, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS PyMem_Free(lens);
    mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (mask desc, convention, rule) -> handle */
static PyObject *py_from_mask2d(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *desc, *rule_obj;
    int conv;
    if (!PyArg_ParseTuple(args, "OiO", &desc, &conv, &rule_obj)) return NULL;
    maskpack_tensor t;
    if (mpx_parse_given_tensor(desc, "mask", &t) < 0) return NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_layout_from_mask2d(&t, (maskpack_mask2d_convention)conv, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (cu desc, form, total, cu_padded desc|None, rule) -> handle */
static PyObject *py_from_cu_seqlens(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *desc, *pdesc, *rule_obj;
    int form;
    long long total;
    if (!PyArg_ParseTuple(args, "OiLOO", &desc, &form, &total, &pdesc, &rule_obj)) return NULL;
    maskpack_tensor cu, cp;
    int has_p;
    if (mpx_parse_given_tensor(desc, "cu_seqlens", &cu) < 0) return NULL;
    if (mpx_parse_tensor(pdesc, "cu_seqlens_padded", &cp, &has_p) < 0) return NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_layout_from_cu_seqlens(&cu, (maskpack_cu_form)form, total, has_p ? &cp : NULL, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (cu_q desc, cu_kv desc, form, rule) -> handle */
static PyObject *py_from_cu_seqlens_qk(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *dq, *dk, *rule_obj;
    int form;
    if (!PyArg_ParseTuple(args, "OOiO", &dq, &dk, &form, &rule_obj)) return NULL;
    maskpack_tensor q, k;
    if (mpx_parse_given_tensor(dq, "cu_seqlens_q", &q) < 0) return NULL;
    if (mpx_parse_given_tensor(dk, "cu_seqlens_kv", &k) < 0) return NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_layout_from_cu_seqlens_qk(&q, &k, (maskpack_cu_form)form, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (position_ids desc, boundary, rule) -> handle */
static PyObject *py_from_position_ids(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *desc, *rule_obj;
    int boundary;
    if (!PyArg_ParseTuple(args, "OiO", &desc, &boundary, &rule_obj)) return NULL;
    maskpack_tensor t;
    if (mpx_parse_given_tensor(desc, "position_ids", &t) < 0) return NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_layout_from_position_ids(&t, (maskpack_boundary_rule)boundary, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (mask desc, convention) -> handle */
static PyObject *py_from_mask4d(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *desc;
    int conv;
    if (!PyArg_ParseTuple(args, "Oi", &desc, &conv)) return NULL;
    maskpack_tensor t;
    if (mpx_parse_given_tensor(desc, "mask", &t) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_layout_from_mask4d(&t, (maskpack_mask_convention)conv, &L, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (mask desc, convention, out desc) -> None */
static PyObject *py_mask2d_from_mask4d(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *desc, *odesc;
    int conv;
    if (!PyArg_ParseTuple(args, "OiO", &desc, &conv, &odesc)) return NULL;
    maskpack_tensor t, o;
    if (mpx_parse_given_tensor(desc, "mask", &t) < 0) return NULL;
    if (mpx_parse_given_out_tensor(odesc, "out", &o) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_mask2d_from_mask4d(&t, (maskpack_mask_convention)conv, &o, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (handle, rule) -> handle */
static PyObject *py_with_rule(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *rule_obj;
    if (!PyArg_ParseTuple(args, "O!O", &mpx_LayoutType, &h, &rule_obj)) return NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_layout_with_rule(mpx_layout(h), &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* ---- accessors -------------------------------------------------------------------------------- */

/* (handle) -> (n_rows, q_width, kv_width, packed, is_self, n_segments, n_tokens, max_q, max_kv) */
static PyObject *py_info(PyObject *m, PyObject *h) {
    (void)m;
    if (!PyObject_TypeCheck(h, &mpx_LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    const maskpack_layout *L = mpx_layout(h);
    return Py_BuildValue("(LLLNNnLLL)", (long long)maskpack_layout_n_rows(L), (long long)maskpack_layout_q_width(L),
                         (long long)maskpack_layout_kv_width(L), PyBool_FromLong(maskpack_layout_is_packed(L)),
                         PyBool_FromLong(maskpack_layout_is_self(L)), (Py_ssize_t)maskpack_layout_n_segments(L),
                         (long long)maskpack_layout_n_tokens(L), (long long)maskpack_layout_max_seqlen(L),
                         (long long)maskpack_layout_max_seqlen_kv(L));
}

/* (handle) -> list of (row, q_start, q_len, kv_start, kv_len, q_pos | None) */
static PyObject *py_segments(PyObject *Py_UNUSED(m), PyObject *h) {
    if (!PyObject_TypeCheck(h, &mpx_LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    const maskpack_layout *L = mpx_layout(h);
    size_t n = maskpack_layout_n_segments(L);
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l) return NULL;
    for (size_t i = 0; i < n; i++) {
        maskpack_segment g;
        maskpack_error err;
        maskpack_status s = maskpack_layout_segment(L, i, &g, &err);
        if (s) {
            Py_DECREF(l);
            return mpx_raise_status(s, &err);
        }
        PyObject *qpos;
        if (g.flags & MASKPACK_SEGMENT_EXPLICIT_POS)
            qpos = PyLong_FromLongLong((long long)g.q_pos);
        else
            qpos = Py_NewRef(Py_None);
        PyObject *t = Py_BuildValue("(LLLLLN)", (long long)g.row, (long long)g.q_start, (long long)g.q_len,
                                    (long long)g.kv_start, (long long)g.kv_len, qpos);
        if (!t) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    return l;
}

/* (handle) -> (causal, alignment, left, right, [(seg, start, end)], prefix list | None) */
static PyObject *py_rule(PyObject *m, PyObject *h) {
    (void)m;
    if (!PyObject_TypeCheck(h, &mpx_LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    const maskpack_layout *L = mpx_layout(h);
    maskpack_rule r = maskpack_layout_rule(L);
    PyObject *spans = PyList_New((Py_ssize_t)r.n_spans);
    if (!spans) return NULL;
    for (size_t i = 0; i < r.n_spans; i++) {
        PyObject *t = Py_BuildValue("(LLL)", (long long)r.spans[i].segment, (long long)r.spans[i].start,
                                    (long long)r.spans[i].end);
        if (!t) {
            Py_DECREF(spans);
            return NULL;
        }
        PyList_SET_ITEM(spans, (Py_ssize_t)i, t);
    }
    PyObject *prefix;
    if (r.prefix) {
        prefix = mpx_i64_list(r.prefix, (int64_t)r.n_prefix);
        if (!prefix) {
            Py_DECREF(spans);
            return NULL;
        }
    } else {
        prefix = Py_NewRef(Py_None);
    }
    return Py_BuildValue("(NiLLNN)", PyBool_FromLong(r.causal), (int)r.alignment, (long long)r.window_left,
                         (long long)r.window_right, spans, prefix);
}

static PyObject *py_allowed(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *h;
    long long b, hd, i, j;
    if (!PyArg_ParseTuple(args, "O!LLLL", &mpx_LayoutType, &h, &b, &hd, &i, &j)) return NULL;
    return PyBool_FromLong(maskpack_allowed(mpx_layout(h), b, hd, i, j));
}

static PyObject *py_segment_of_query(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *h;
    long long b, i;
    if (!PyArg_ParseTuple(args, "O!LL", &mpx_LayoutType, &h, &b, &i)) return NULL;
    return PyLong_FromLongLong((long long)maskpack_segment_of_query(mpx_layout(h), b, i));
}

/* ---- derived outputs ------------------------------------------------------------------------- */

typedef maskpack_status (*out_fn)(const maskpack_layout *, maskpack_tensor *, maskpack_error *);

static PyObject *simple_out(PyObject *args, out_fn fn) {
    PyObject *h, *desc;
    if (!PyArg_ParseTuple(args, "O!O", &mpx_LayoutType, &h, &desc)) return NULL;
    maskpack_tensor o;
    if (mpx_parse_given_out_tensor(desc, "out", &o) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = fn(mpx_layout(h), &o, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

static PyObject *py_mask2d(PyObject *Py_UNUSED(m), PyObject *a) { return simple_out(a, maskpack_mask2d); }
static PyObject *py_cu_seqlens_padded(PyObject *Py_UNUSED(m), PyObject *a) {
    return simple_out(a, maskpack_cu_seqlens_padded);
}
static PyObject *py_position_ids(PyObject *Py_UNUSED(m), PyObject *a) { return simple_out(a, maskpack_position_ids); }
static PyObject *py_segment_ids(PyObject *Py_UNUSED(m), PyObject *a) { return simple_out(a, maskpack_segment_ids); }
static PyObject *py_valid_indices(PyObject *Py_UNUSED(m), PyObject *a) { return simple_out(a, maskpack_valid_indices); }
static PyObject *py_last_token_index(PyObject *Py_UNUSED(m), PyObject *a) {
    return simple_out(a, maskpack_last_token_index);
}

/* (handle, convention, fill, out) */
static PyObject *py_mask4d(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *desc;
    int conv, fill;
    if (!PyArg_ParseTuple(args, "O!iiO", &mpx_LayoutType, &h, &conv, &fill, &desc)) return NULL;
    maskpack_tensor o;
    if (mpx_parse_given_out_tensor(desc, "out", &o) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_mask4d(mpx_layout(h), (maskpack_mask_convention)conv, (maskpack_fill)fill, &o, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (handle, form, kv, out) */
static PyObject *py_cu_seqlens(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *desc;
    int form, kv;
    if (!PyArg_ParseTuple(args, "O!ipO", &mpx_LayoutType, &h, &form, &kv, &desc)) return NULL;
    maskpack_tensor o;
    if (mpx_parse_given_out_tensor(desc, "out", &o) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_cu_seqlens(mpx_layout(h), (maskpack_cu_form)form, kv, &o, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (handle, kv, out) */
static PyObject *py_seqlens(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *desc;
    int kv;
    if (!PyArg_ParseTuple(args, "O!pO", &mpx_LayoutType, &h, &kv, &desc)) return NULL;
    maskpack_tensor o;
    if (mpx_parse_given_out_tensor(desc, "out", &o) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_seqlens(mpx_layout(h), kv, &o, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (handle, block_q, block_k) -> (Qb, Kb) */
static PyObject *py_block_mask_dims(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h;
    long long bq, bk;
    if (!PyArg_ParseTuple(args, "O!LL", &mpx_LayoutType, &h, &bq, &bk)) return NULL;
    int64_t qb = 0, kb = 0;
    maskpack_error err;
    maskpack_status s = maskpack_block_mask_dims(mpx_layout(h), bq, bk, &qb, &kb, &err);
    if (s) return mpx_raise_status(s, &err);
    return Py_BuildValue("(LL)", (long long)qb, (long long)kb);
}

/* An int32 C-contiguous buffer of exactly `numel` elements -> its pointer. The
 * C API takes raw int32 pointers here, so shape and contiguity are checked before handing them on. */
static int contiguous_i32(PyObject *desc, int64_t numel, const char *name, int32_t **out) {
    *out = NULL;
    if (desc == Py_None) return 0;
    maskpack_tensor t;
    if (mpx_parse_given_out_tensor(desc, name, &t) < 0) return -1;
    if (t.dtype != MASKPACK_I32) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int32 buffer", name);
        return -1;
    }
    int64_t n = 1, expect = 1;
    for (int32_t d = 0; d < t.ndim; d++) n *= t.shape[d];
    for (int32_t d = t.ndim - 1; d >= 0 && n > 0; d--) { /* an empty buffer has no layout to check */
        if (t.shape[d] != 1 && t.strides[d] != expect) {
            PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous buffer", name);
            return -1;
        }
        expect *= t.shape[d];
    }
    if (n != numel) {
        PyErr_Format(PyExc_ValueError, "%s: expected %lld elements, found %lld", name, (long long)numel, (long long)n);
        return -1;
    }
    if (numel > 0 && !t.data) {
        PyErr_Format(PyExc_ValueError, "%s: NULL data", name);
        return -1;
    }
    *out = (int32_t *)t.data;
    return 0;
}

/* (handle, block_q, block_k, (kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num,
 *  full_q_idx) arrays or None) -> None */
static PyObject *py_block_mask(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *outs;
    long long bq, bk;
    if (!PyArg_ParseTuple(args, "O!LLO!", &mpx_LayoutType, &h, &bq, &bk, &PyTuple_Type, &outs)) return NULL;
    if (PyTuple_GET_SIZE(outs) != 8) {
        PyErr_SetString(PyExc_TypeError, "block_mask: expected 8 output arrays");
        return NULL;
    }
    const maskpack_layout *L = mpx_layout(h);
    int64_t qb = 0, kb = 0;
    maskpack_error err;
    maskpack_status s = maskpack_block_mask_dims(L, bq, bk, &qb, &kb, &err);
    if (s) return mpx_raise_status(s, &err);
    int64_t B = maskpack_layout_n_rows(L);
    int64_t sizes[8];
    sizes[0] = sizes[2] = B * qb;
    sizes[1] = sizes[3] = B * qb * kb;
    sizes[4] = sizes[6] = B * kb;
    sizes[5] = sizes[7] = B * kb * qb;
    static const char *const names[8] = {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                                         "q_num_blocks",  "q_indices",  "full_q_num_blocks",  "full_q_indices"};
    int32_t *p[8];
    for (int i = 0; i < 8; i++)
        if (contiguous_i32(PyTuple_GET_ITEM(outs, i), sizes[i], names[i], &p[i]) < 0) return NULL;
    maskpack_block_mask_arrays a = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]};
    Py_BEGIN_ALLOW_THREADS s = maskpack_block_mask(L, bq, bk, &a, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (handle, q_ranges desc|None, k_ranges desc|None, types desc|None, capacity) -> count */
static PyObject *py_magi_slices(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *dq, *dk, *dt;
    Py_ssize_t cap;
    if (!PyArg_ParseTuple(args, "O!OOOn", &mpx_LayoutType, &h, &dq, &dk, &dt, &cap)) return NULL;
    if (cap < 0) {
        PyErr_SetString(PyExc_ValueError, "capacity must be >= 0");
        return NULL;
    }
    int32_t *q = NULL, *k = NULL, *t = NULL;
    if (cap > 0) {
        if (contiguous_i32(dq, 2 * (int64_t)cap, "q_ranges", &q) < 0) return NULL;
        if (contiguous_i32(dk, 2 * (int64_t)cap, "k_ranges", &k) < 0) return NULL;
        if (contiguous_i32(dt, (int64_t)cap, "types", &t) < 0) return NULL;
        if (!q || !k || !t) {
            PyErr_SetString(PyExc_TypeError, "magi_slices: all three buffers are needed when capacity > 0");
            return NULL;
        }
    }
    size_t count = 0;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_magi_slices(mpx_layout(h), q, k, t, (size_t)cap, &count, &err);
    Py_END_ALLOW_THREADS
        /* sizing call: a too-small buffer still reports the count needed */
        if (s == MASKPACK_ERR_BUFFER_TOO_SMALL && cap == 0) s = MASKPACK_OK;
    if (s) return mpx_raise_status(s, &err);
    return PyLong_FromSize_t(count);
}

/* ---- npu --------------------------------------------------------------------------------------- */

/* (handle, input_layout, scale, head_dim, factory) -> (input_layout, sparse_mode, pre, next, scale,
 * inner_precise, mask_kind, atten_mask | None, actual_seq_qlen | None, actual_seq_kvlen | None,
 * prefix | None, pad_items | None, fully_masked_rows, fully_masked_pad_rows). factory(shape) -> (object, the object to
 * fill) allocates the atten_mask; the argset never outlives this call. */
static PyObject *py_npu_args(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *factory;
    int il;
    double scale;
    long long head_dim;
    if (!PyArg_ParseTuple(args, "O!idLO", &mpx_LayoutType, &h, &il, &scale, &head_dim, &factory)) return NULL;
    const maskpack_layout *L = mpx_layout(h);
    maskpack_npu_argset a;
    memset(&a, 0, sizeof a);
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_npu_args(L, (maskpack_npu_layout)il, scale, head_dim, &a, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);

    PyObject *mask_obj = NULL, *ql = NULL, *kl = NULL, *pf = NULL, *pad = NULL, *res = NULL;
    if (a.mask_kind != MASKPACK_NPU_MASK_NONE) {
        int nd = a.mask_ndim < 0 ? 0 : (a.mask_ndim > 4 ? 4 : a.mask_ndim);
        PyObject *shape = PyTuple_New(nd);
        if (!shape) goto done;
        for (int d = 0; d < nd; d++) {
            PyObject *v = PyLong_FromLongLong((long long)a.mask_shape[d]);
            if (!v) {
                Py_DECREF(shape);
                goto done;
            }
            PyTuple_SET_ITEM(shape, d, v);
        }
        /* factory(shape, mask kind) -> (object, the object to fill) or (object, None): a mask the
         * caller already holds (the compressed masks are the same for every layout: built once) */
        PyObject *kind = PyLong_FromLong((long)a.mask_kind);
        PyObject *pair = kind ? PyObject_CallFunctionObjArgs(factory, shape, kind, NULL) : NULL;
        Py_DECREF(shape);
        Py_XDECREF(kind);
        if (!pair) goto done;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_TypeError, "npu_args: factory must return (object, object to fill or None)");
            goto done;
        }
        int fill = PyTuple_GET_ITEM(pair, 1) != Py_None;
        maskpack_tensor o;
        if (fill && mpx_parse_given_out_tensor(PyTuple_GET_ITEM(pair, 1), "atten_mask", &o) < 0) {
            Py_DECREF(pair);
            goto done;
        }
        mask_obj = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        Py_DECREF(pair);
        if (fill) {
            Py_BEGIN_ALLOW_THREADS s = maskpack_npu_atten_mask(L, &a, &o, &err);
            Py_END_ALLOW_THREADS if (s) {
                mpx_raise_status(s, &err);
                goto done;
            }
        }
    } else {
        mask_obj = Py_NewRef(Py_None);
    }
    if (a.actual_seq_qlen) {
        if (!(ql = mpx_i64_list(a.actual_seq_qlen, a.n_items))) goto done;
    } else
        ql = Py_NewRef(Py_None);
    if (a.actual_seq_kvlen) {
        if (!(kl = mpx_i64_list(a.actual_seq_kvlen, a.n_items))) goto done;
    } else
        kl = Py_NewRef(Py_None);
    if (a.prefix) {
        if (!(pf = mpx_i64_list(a.prefix, a.n_prefix))) goto done;
    } else
        pf = Py_NewRef(Py_None);
    if (a.pad_items) {
        pad = PyList_New((Py_ssize_t)a.n_items);
        if (!pad) goto done;
        for (int64_t i = 0; i < a.n_items; i++) PyList_SET_ITEM(pad, (Py_ssize_t)i, PyBool_FromLong(a.pad_items[i]));
    } else
        pad = Py_NewRef(Py_None);
    res = Py_BuildValue("(iiLLdiiOOOOOLL)", (int)a.input_layout, (int)a.sparse_mode, (long long)a.pre_tokens,
                        (long long)a.next_tokens, a.scale, (int)a.inner_precise, (int)a.mask_kind, mask_obj, ql, kl, pf,
                        pad, (long long)a.fully_masked_rows, (long long)a.fully_masked_pad_rows);
done:
    Py_XDECREF(mask_obj);
    Py_XDECREF(ql);
    Py_XDECREF(kl);
    Py_XDECREF(pf);
    Py_XDECREF(pad);
    maskpack_npu_argset_release(&a);
    return res;
}

/* keyword call description -> (status_code, [(code, message)], n_total). Raises only when the
 * description itself is unusable (a status other than OK and NPU_CONTRACT). */
static PyObject *py_validate_npu_args(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"input_layout", "batch",       "q_len",         "kv_len",          "total_q",
                             "total_kv",     "heads_q",     "heads_kv",      "head_dim",        "sparse_mode",
                             "pre_tokens",   "next_tokens", "atten_mask",    "actual_seq_qlen", "actual_seq_kvlen",
                             "prefix",       "scale",       "inner_precise", "intended",        NULL};
    maskpack_npu_call c;
    memset(&c, 0, sizeof c);
    int il = 0, sm = 0, ip = 0;
    long long batch = 0, ql = 0, kl = 0, tq = 0, tk = 0, hq = 0, hk = 0, hd = 0, pre = 0, nxt = 0;
    double scale = NAN;
    PyObject *dmask = Py_None, *dq = Py_None, *dk = Py_None, *dp = Py_None, *intended = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|LLLLLLLLiLLOOOOdiO", kwlist, &il, &batch, &ql, &kl, &tq, &tk, &hq,
                                     &hk, &hd, &sm, &pre, &nxt, &dmask, &dq, &dk, &dp, &scale, &ip, &intended))
        return NULL;
    maskpack_tensor tm, tq_, tk_, tp;
    int has_m, has_q, has_k, has_p;
    if (mpx_parse_tensor(dmask, "atten_mask", &tm, &has_m) < 0) return NULL;
    if (mpx_parse_tensor(dq, "actual_seq_qlen", &tq_, &has_q) < 0) return NULL;
    if (mpx_parse_tensor(dk, "actual_seq_kvlen", &tk_, &has_k) < 0) return NULL;
    if (mpx_parse_tensor(dp, "prefix", &tp, &has_p) < 0) return NULL;
    if (intended != Py_None && !PyObject_TypeCheck(intended, &mpx_LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "intended: expected a layout handle or None");
        return NULL;
    }
    c.input_layout = (maskpack_npu_layout)il;
    c.batch = batch;
    c.q_len = ql;
    c.kv_len = kl;
    c.total_q = tq;
    c.total_kv = tk;
    c.heads_q = hq;
    c.heads_kv = hk;
    c.head_dim = hd;
    c.sparse_mode = sm;
    c.pre_tokens = pre;
    c.next_tokens = nxt;
    c.atten_mask = has_m ? &tm : NULL;
    c.actual_seq_qlen = has_q ? &tq_ : NULL;
    c.actual_seq_kvlen = has_k ? &tk_ : NULL;
    c.prefix = has_p ? &tp : NULL;
    c.scale = scale;
    c.inner_precise = ip;
    c.intended = intended == Py_None ? NULL : mpx_layout(intended);
    maskpack_npu_report *rep = PyMem_Calloc(1, sizeof *rep);
    if (!rep) return PyErr_NoMemory();
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_validate_npu_args(&c, rep, &err);
    Py_END_ALLOW_THREADS if (s != MASKPACK_OK && s != MASKPACK_ERR_NPU_CONTRACT) {
        PyMem_Free(rep);
        return mpx_raise_status(s, &err);
    }
    int nf = rep->n_findings;
    if (nf < 0) nf = 0;
    if (nf > MASKPACK_NPU_MAX_FINDINGS) nf = MASKPACK_NPU_MAX_FINDINGS;
    PyObject *l = PyList_New(nf);
    if (!l) {
        PyMem_Free(rep);
        return NULL;
    }
    for (int i = 0; i < nf; i++) {
        rep->findings[i].message[MASKPACK_ERROR_MESSAGE_SIZE - 1] = '\0';
        PyObject *t = Py_BuildValue("(is)", (int)rep->findings[i].code, rep->findings[i].message);
        if (!t) {
            Py_DECREF(l);
            PyMem_Free(rep);
            return NULL;
        }
        PyList_SET_ITEM(l, i, t);
    }
    int total = rep->n_total;
    PyMem_Free(rep);
    return Py_BuildValue("(iNi)", (int)s, l, total);
}
/* ---- module ------------------------------------------------------------------------------------- */

/* ---- context parallelism, relayout, labels ------------------------------------------------------ */

static PyObject *py_packed_of(PyObject *Py_UNUSED(m), PyObject *h) {
    if (!PyObject_TypeCheck(h, &mpx_LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_layout_packed_of(mpx_layout(h), &L, &err);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (handle, placement, width) */
static PyObject *py_padded_of(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h;
    int placement;
    long long width;
    if (!PyArg_ParseTuple(args, "O!iL", &mpx_LayoutType, &h, &placement, &width)) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s =
        maskpack_layout_padded_of(mpx_layout(h), (maskpack_placement)placement, (int64_t)width, &L, &err);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (handle, multiple) */
static PyObject *py_pad_to_multiple(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h;
    long long mult;
    if (!PyArg_ParseTuple(args, "O!L", &mpx_LayoutType, &h, &mult)) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_layout_pad_to_multiple(mpx_layout(h), (int64_t)mult, &L, &err);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (cp, tp, align) -> multiple */
static PyObject *py_cp_multiple(PyObject *Py_UNUSED(m), PyObject *args) {
    long long cp, tp;
    int align;
    if (!PyArg_ParseTuple(args, "LLi", &cp, &tp, &align)) return NULL;
    int64_t mult = 0;
    maskpack_error err;
    maskpack_status s = maskpack_cp_multiple((int64_t)cp, (int64_t)tp, (maskpack_cp_align)align, &mult, &err);
    if (s) return mpx_raise_status(s, &err);
    return PyLong_FromLongLong((long long)mult);
}

/* (handle, cp, rank, scheme) -> shard handle */
static PyObject *py_cp_shard(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h;
    long long cp, rank;
    int scheme;
    if (!PyArg_ParseTuple(args, "O!LLi", &mpx_LayoutType, &h, &cp, &rank, &scheme)) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_layout_cp_shard(mpx_layout(h), (int64_t)cp, (int64_t)rank, (maskpack_cp_scheme)scheme, &L, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (handle, cp, rank, scheme, out) */
static PyObject *py_cp_shard_indices(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *desc;
    long long cp, rank;
    int scheme;
    if (!PyArg_ParseTuple(args, "O!LLiO", &mpx_LayoutType, &h, &cp, &rank, &scheme, &desc)) return NULL;
    maskpack_tensor o;
    if (mpx_parse_given_out_tensor(desc, "out", &o) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_cp_shard_indices(mpx_layout(h), (int64_t)cp, (int64_t)rank, (maskpack_cp_scheme)scheme, &o, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (handle, cp, scheme, rank_out, local_out) */
static PyObject *py_cp_last_token(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *d1, *d2;
    long long cp;
    int scheme;
    if (!PyArg_ParseTuple(args, "O!LiOO", &mpx_LayoutType, &h, &cp, &scheme, &d1, &d2)) return NULL;
    maskpack_tensor r, l;
    if (mpx_parse_given_out_tensor(d1, "rank", &r) < 0 || mpx_parse_given_out_tensor(d2, "local", &l) < 0) return NULL;
    maskpack_error err;
    maskpack_status s = maskpack_cp_last_token(mpx_layout(h), (int64_t)cp, (maskpack_cp_scheme)scheme, &r, &l, &err);
    if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"packed_of", py_packed_of, METH_O, "(handle) -> packed handle of the same sequences"},
    {"padded_of", py_padded_of, METH_VARARGS, "(handle, placement, width) -> padded handle"},
    {"pad_to_multiple", py_pad_to_multiple, METH_VARARGS, "(handle, multiple) -> handle"},
    {"cp_multiple", py_cp_multiple, METH_VARARGS, "(cp, tp, align) -> multiple"},
    {"cp_shard", py_cp_shard, METH_VARARGS, "(handle, cp, rank, scheme) -> shard handle"},
    {"cp_shard_indices", py_cp_shard_indices, METH_VARARGS, "(handle, cp, rank, scheme, out)"},
    {"cp_last_token", py_cp_last_token, METH_VARARGS, "(handle, cp, scheme, rank_out, local_out)"},
    {"window_from_hf", py_window_from_hf, METH_O, "(w) -> (left, right)"},
    {"window_from_gym", py_window_from_gym, METH_O, "(w) -> (left, right)"},
    {"from_segments", py_from_segments, METH_VARARGS, "(segments, n_rows, q_width, kv_width, packed, rule)"},
    {"from_lengths", py_from_lengths, METH_VARARGS, "(lengths, placement, capacity, rule)"},
    {"from_mask2d", py_from_mask2d, METH_VARARGS, "(mask, convention, rule)"},
    {"from_cu_seqlens", py_from_cu_seqlens, METH_VARARGS, "(cu, form, total, cu_padded, rule)"},
    {"from_cu_seqlens_qk", py_from_cu_seqlens_qk, METH_VARARGS, "(cu_q, cu_kv, form, rule)"},
    {"from_position_ids", py_from_position_ids, METH_VARARGS, "(position_ids, boundary, rule)"},
    {"from_mask4d", py_from_mask4d, METH_VARARGS, "(mask, convention)"},
    {"mask2d_from_mask4d", py_mask2d_from_mask4d, METH_VARARGS, "(mask, convention, out)"},
    {"with_rule", py_with_rule, METH_VARARGS, "(handle, rule)"},
    {"info", py_info, METH_O, "(handle) -> sizes"},
    {"segments", py_segments, METH_O, "(handle) -> segment tuples"},
    {"rule", py_rule, METH_O, "(handle) -> rule tuple"},
    {"allowed", py_allowed, METH_VARARGS, "(handle, b, h, i, j) -> bool"},
    {"segment_of_query", py_segment_of_query, METH_VARARGS, "(handle, b, i) -> segment index or -1"},
    {"mask2d", py_mask2d, METH_VARARGS, "(handle, out)"},
    {"mask4d", py_mask4d, METH_VARARGS, "(handle, convention, fill, out)"},
    {"cu_seqlens", py_cu_seqlens, METH_VARARGS, "(handle, form, kv, out)"},
    {"cu_seqlens_padded", py_cu_seqlens_padded, METH_VARARGS, "(handle, out)"},
    {"seqlens", py_seqlens, METH_VARARGS, "(handle, kv, out)"},
    {"position_ids", py_position_ids, METH_VARARGS, "(handle, out)"},
    {"segment_ids", py_segment_ids, METH_VARARGS, "(handle, out)"},
    {"valid_indices", py_valid_indices, METH_VARARGS, "(handle, out)"},
    {"last_token_index", py_last_token_index, METH_VARARGS, "(handle, out)"},
    {"block_mask_dims", py_block_mask_dims, METH_VARARGS, "(handle, block_q, block_k) -> (Qb, Kb)"},
    {"block_mask", py_block_mask, METH_VARARGS, "(handle, block_q, block_k, outs)"},
    {"magi_slices", py_magi_slices, METH_VARARGS, "(handle, q, k, types, capacity) -> count"},
    {"npu_args", py_npu_args, METH_VARARGS, "(handle, input_layout, scale, head_dim, factory) -> tuple"},
    {"validate_npu_args", (PyCFunction)(void (*)(void))py_validate_npu_args, METH_VARARGS | METH_KEYWORDS,
     "(input_layout, ...) -> (status, findings, n_total)"},
    {NULL, NULL, 0, NULL},
};

int mpx_init_layout(PyObject *m) { return PyModule_AddFunctions(m, methods); }
