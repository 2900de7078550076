/*
 * _maskpack.c: the CPython extension behind the `maskpack` package (the module's entry point; the
 * planner and kernel bindings are its submodules plan, gdn and attention, built from _plan.c, _gdn.c
 * and _attention.c into this same module, sharing ext_common.c).
 *
 * Deliberately thin: a `Layout` handle type (a maskpack_layout* freed in dealloc, ext_common.c) and
 * the C API function by function. Tensors cross as themselves (torch CPU tensors through DLPack,
 * numpy arrays through the buffer protocol), read by the module's one reader (ext_common.c) without
 * copying; outputs are allocated on the Python side and passed the same way, so this file never
 * owns array memory and never needs numpy's or torch's C API. Every non-OK status raises the Python-level
 * maskpack.Error (registered by the package at import through _set_error_type) carrying the
 * status name, code, argument and index from maskpack_error.
 *
 * The GIL is released around every call that may touch a whole mask (constructors and derived
 * outputs): the layout is immutable, and the Python layer keeps every described object alive for
 * the duration of the call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#if defined(__linux__) || defined(__FreeBSD__)
#define MPX_HAVE_PHDR 1 /* dl_iterate_phdr: the loaded objects, to find an OpenMP runtime */
#include <dlfcn.h>
#include <link.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "maskpack.h"
#include "ext_common.h"

/* Py_NewRef appeared in 3.10; the package supports 3.9. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *mp_newref(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#define Py_NewRef(o) mp_newref((PyObject *)(o))
#endif

/* ---- the Layout handle ---------------------------------------------------------------------- */

/* The type and its constructor are shared with the other files of the module (ext_common.c); the
 * short names below are this file's. */
#define LayoutType mpx_LayoutType
static PyObject *wrap_layout(maskpack_layout *L) { return mpx_wrap_layout(L); }
static const maskpack_layout *handle(PyObject *obj) { return mpx_layout(obj); }

/* ---- errors --------------------------------------------------------------------------------- */

/* Raises maskpack.Error for a failed call: the module's one path (ext_common.c). */
static PyObject *raise_status(PyObject *module, maskpack_status status, const maskpack_error *err) {
    (void)module;
    return mpx_raise_status(status, err);
}

/* ---- argument conversion -------------------------------------------------------------------- */

/* item i of argument `arg` -> *out; a value past int64 is maskpack.Error (OVERFLOW, naming the
 * argument and the index) instead of Python's bare "int too big to convert". Returns 0 or -1. */
static int item_i64(PyObject *module, PyObject *item, const char *arg, Py_ssize_t i, int64_t *out) {
    long long x = PyLong_AsLongLong(item);
    if (x == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        maskpack_error e;
        memset(&e, 0, sizeof e);
        e.status = MASKPACK_ERR_OVERFLOW;
        snprintf(e.argument, sizeof e.argument, "%s", arg);
        e.index[0] = (int64_t)i;
        e.index[1] = e.index[2] = e.index[3] = -1;
        PyObject *r = PyObject_Repr(item);
        const char *txt = r ? PyUnicode_AsUTF8(r) : NULL;
        if (!txt) PyErr_Clear();
        snprintf(e.message, sizeof e.message, "%s[%zd]: expected a value that fits int64, found %.80s", arg, i,
                 txt ? txt : "a larger integer");
        Py_XDECREF(r);
        raise_status(module, MASKPACK_ERR_OVERFLOW, &e);
        return -1;
    }
    *out = (int64_t)x;
    return 0;
}

/* A tensor argument (torch tensor or numpy array; the one reader, ext_common.c) -> maskpack_tensor
 * (None is refused here). */
static int parse_tensor(PyObject *obj, maskpack_tensor *t, const char *name) {
    int present = 0;
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tensor or array, found None", name);
        return -1;
    }
    return mpx_parse_tensor(obj, name, t, &present);
}

/* An optional tensor argument: None -> *present = 0. */
static int parse_opt_tensor(PyObject *desc, maskpack_tensor *t, int *present, const char *name) {
    return mpx_parse_tensor(desc, name, t, present);
}

/* The rule crosses as a tuple read by mpx_parse_rule (ext_common.c). */
typedef mpx_rule_buf rule_buf;
static int parse_rule(PyObject *obj, rule_buf *rb) { return mpx_parse_rule(obj, rb); }
static void rule_buf_free(rule_buf *rb) { mpx_rule_buf_free(rb); }

static PyObject *i64_list(const int64_t *v, int64_t n) {
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l) return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong((long long)v[i]);
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, x);
    }
    return l;
}

/* ---- version, status names, window converters ------------------------------------------------ */

static PyObject *py_version(PyObject *m, PyObject *noargs) {
    (void)m;
    (void)noargs;
    return PyUnicode_FromString(maskpack_version_string());
}

static PyObject *py_version_number(PyObject *m, PyObject *noargs) {
    (void)m;
    (void)noargs;
    return PyLong_FromUnsignedLong(maskpack_version_number());
}

/* () -> list of status names indexed by code. */
static PyObject *py_status_names(PyObject *m, PyObject *noargs) {
    (void)m;
    (void)noargs;
    PyObject *l = PyList_New(MASKPACK_STATUS_COUNT_);
    if (!l) return NULL;
    for (int s = 0; s < MASKPACK_STATUS_COUNT_; s++) {
        PyObject *x = PyUnicode_FromString(maskpack_status_name((maskpack_status)s));
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, s, x);
    }
    return l;
}

static PyObject *py_status_message(PyObject *m, PyObject *arg) {
    (void)m;
    long s = PyLong_AsLong(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(maskpack_status_message((maskpack_status)s));
}

static PyObject *py_set_error_type(PyObject *m, PyObject *type) {
    (void)m;
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "expected an exception type");
        return NULL;
    }
    mpx_set_error_type(type);
    Py_RETURN_NONE;
}

static PyObject *window_conv(PyObject *m, PyObject *arg, int hf) {
    long long w = PyLong_AsLongLong(arg);
    if (w == -1 && PyErr_Occurred()) return NULL;
    int64_t l = 0, r = 0;
    maskpack_error err;
    maskpack_status s = hf ? maskpack_window_from_hf(w, &l, &r, &err) : maskpack_window_from_gym(w, &l, &r, &err);
    if (s) return raise_status(m, s, &err);
    return Py_BuildValue("(LL)", (long long)l, (long long)r);
}

static PyObject *py_window_from_hf(PyObject *m, PyObject *arg) { return window_conv(m, arg, 1); }
static PyObject *py_window_from_gym(PyObject *m, PyObject *arg) { return window_conv(m, arg, 0); }

/* ---- constructors ------------------------------------------------------------------------------ */

/* (segments: seq of (row, q_start, q_len, kv_start, kv_len[, q_pos|None]), n_rows, q_width, kv_width,
 *  packed, rule) -> handle */
static PyObject *py_from_segments(PyObject *m, PyObject *args) {
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
    rule_buf rb;
    if (parse_rule(rule_obj, &rb) < 0) {
        PyMem_Free(segs);
        return NULL;
    }
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_from_segments(segs, (size_t)n, n_rows, qw, kw, packed, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(segs);
    rule_buf_free(&rb);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
fail:
    Py_XDECREF(seq);
    PyMem_Free(segs);
    return NULL;
}

/* (lengths: seq of int, placement, capacity, rule) -> handle */
static PyObject *py_from_lengths(PyObject *m, PyObject *args) {
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
        if (item_i64(m, PySequence_Fast_GET_ITEM(seq, i), "lengths", i, &lens[i]) < 0) {
            Py_DECREF(seq);
            PyMem_Free(lens);
            return NULL;
        }
    }
    Py_DECREF(seq);
    rule_buf rb;
    if (parse_rule(rule_obj, &rb) < 0) {
        PyMem_Free(lens);
        return NULL;
    }
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_from_lengths(lens, (size_t)n, (maskpack_placement)placement, capacity, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(lens);
    rule_buf_free(&rb);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (mask desc, convention, rule) -> handle */
static PyObject *py_from_mask2d(PyObject *m, PyObject *args) {
    PyObject *desc, *rule_obj;
    int conv;
    if (!PyArg_ParseTuple(args, "OiO", &desc, &conv, &rule_obj)) return NULL;
    maskpack_tensor t;
    if (parse_tensor(desc, &t, "mask") < 0) return NULL;
    rule_buf rb;
    if (parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_from_mask2d(&t, (maskpack_mask2d_convention)conv, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS
    rule_buf_free(&rb);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (cu desc, form, total, cu_padded desc|None, rule) -> handle */
static PyObject *py_from_cu_seqlens(PyObject *m, PyObject *args) {
    PyObject *desc, *pdesc, *rule_obj;
    int form;
    long long total;
    if (!PyArg_ParseTuple(args, "OiLOO", &desc, &form, &total, &pdesc, &rule_obj)) return NULL;
    maskpack_tensor cu, cp;
    int has_p;
    if (parse_tensor(desc, &cu, "cu_seqlens") < 0) return NULL;
    if (parse_opt_tensor(pdesc, &cp, &has_p, "cu_seqlens_padded") < 0) return NULL;
    rule_buf rb;
    if (parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_from_cu_seqlens(&cu, (maskpack_cu_form)form, total, has_p ? &cp : NULL, &rb.rule, &L,
                                        &err);
    Py_END_ALLOW_THREADS
    rule_buf_free(&rb);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (cu_q desc, cu_kv desc, form, rule) -> handle */
static PyObject *py_from_cu_seqlens_qk(PyObject *m, PyObject *args) {
    PyObject *dq, *dk, *rule_obj;
    int form;
    if (!PyArg_ParseTuple(args, "OOiO", &dq, &dk, &form, &rule_obj)) return NULL;
    maskpack_tensor q, k;
    if (parse_tensor(dq, &q, "cu_seqlens_q") < 0) return NULL;
    if (parse_tensor(dk, &k, "cu_seqlens_kv") < 0) return NULL;
    rule_buf rb;
    if (parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_from_cu_seqlens_qk(&q, &k, (maskpack_cu_form)form, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS
    rule_buf_free(&rb);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (position_ids desc, boundary, rule) -> handle */
static PyObject *py_from_position_ids(PyObject *m, PyObject *args) {
    PyObject *desc, *rule_obj;
    int boundary;
    if (!PyArg_ParseTuple(args, "OiO", &desc, &boundary, &rule_obj)) return NULL;
    maskpack_tensor t;
    if (parse_tensor(desc, &t, "position_ids") < 0) return NULL;
    rule_buf rb;
    if (parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_from_position_ids(&t, (maskpack_boundary_rule)boundary, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS
    rule_buf_free(&rb);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (mask desc, convention) -> handle */
static PyObject *py_from_mask4d(PyObject *m, PyObject *args) {
    PyObject *desc;
    int conv;
    if (!PyArg_ParseTuple(args, "Oi", &desc, &conv)) return NULL;
    maskpack_tensor t;
    if (parse_tensor(desc, &t, "mask") < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_from_mask4d(&t, (maskpack_mask_convention)conv, &L, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (mask desc, convention, out desc) -> None */
static PyObject *py_mask2d_from_mask4d(PyObject *m, PyObject *args) {
    PyObject *desc, *odesc;
    int conv;
    if (!PyArg_ParseTuple(args, "OiO", &desc, &conv, &odesc)) return NULL;
    maskpack_tensor t, o;
    if (parse_tensor(desc, &t, "mask") < 0) return NULL;
    if (parse_tensor(odesc, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_mask2d_from_mask4d(&t, (maskpack_mask_convention)conv, &o, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* (handle, rule) -> handle */
static PyObject *py_with_rule(PyObject *m, PyObject *args) {
    PyObject *h, *rule_obj;
    if (!PyArg_ParseTuple(args, "O!O", &LayoutType, &h, &rule_obj)) return NULL;
    rule_buf rb;
    if (parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_with_rule(handle(h), &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS
    rule_buf_free(&rb);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* ---- accessors -------------------------------------------------------------------------------- */

/* (handle) -> (n_rows, q_width, kv_width, packed, is_self, n_segments, n_tokens, max_q, max_kv) */
static PyObject *py_info(PyObject *m, PyObject *h) {
    (void)m;
    if (!PyObject_TypeCheck(h, &LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    const maskpack_layout *L = handle(h);
    return Py_BuildValue("(LLLNNnLLL)", (long long)maskpack_layout_n_rows(L), (long long)maskpack_layout_q_width(L),
                         (long long)maskpack_layout_kv_width(L), PyBool_FromLong(maskpack_layout_is_packed(L)),
                         PyBool_FromLong(maskpack_layout_is_self(L)), (Py_ssize_t)maskpack_layout_n_segments(L),
                         (long long)maskpack_layout_n_tokens(L), (long long)maskpack_layout_max_seqlen(L),
                         (long long)maskpack_layout_max_seqlen_kv(L));
}

/* (handle) -> list of (row, q_start, q_len, kv_start, kv_len, q_pos | None) */
static PyObject *py_segments(PyObject *m, PyObject *h) {
    if (!PyObject_TypeCheck(h, &LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    const maskpack_layout *L = handle(h);
    size_t n = maskpack_layout_n_segments(L);
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l) return NULL;
    for (size_t i = 0; i < n; i++) {
        maskpack_segment g;
        maskpack_error err;
        maskpack_status s = maskpack_layout_segment(L, i, &g, &err);
        if (s) {
            Py_DECREF(l);
            return raise_status(m, s, &err);
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
    if (!PyObject_TypeCheck(h, &LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    const maskpack_layout *L = handle(h);
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
        prefix = i64_list(r.prefix, (int64_t)r.n_prefix);
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
    if (!PyArg_ParseTuple(args, "O!LLLL", &LayoutType, &h, &b, &hd, &i, &j)) return NULL;
    return PyBool_FromLong(maskpack_allowed(handle(h), b, hd, i, j));
}

static PyObject *py_segment_of_query(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *h;
    long long b, i;
    if (!PyArg_ParseTuple(args, "O!LL", &LayoutType, &h, &b, &i)) return NULL;
    return PyLong_FromLongLong((long long)maskpack_segment_of_query(handle(h), b, i));
}

/* ---- derived outputs ------------------------------------------------------------------------- */

typedef maskpack_status (*out_fn)(const maskpack_layout *, maskpack_tensor *, maskpack_error *);

static PyObject *simple_out(PyObject *m, PyObject *args, out_fn fn) {
    PyObject *h, *desc;
    if (!PyArg_ParseTuple(args, "O!O", &LayoutType, &h, &desc)) return NULL;
    maskpack_tensor o;
    if (parse_tensor(desc, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = fn(handle(h), &o, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

static PyObject *py_mask2d(PyObject *m, PyObject *a) { return simple_out(m, a, maskpack_mask2d); }
static PyObject *py_cu_seqlens_padded(PyObject *m, PyObject *a) { return simple_out(m, a, maskpack_cu_seqlens_padded); }
static PyObject *py_position_ids(PyObject *m, PyObject *a) { return simple_out(m, a, maskpack_position_ids); }
static PyObject *py_segment_ids(PyObject *m, PyObject *a) { return simple_out(m, a, maskpack_segment_ids); }
static PyObject *py_valid_indices(PyObject *m, PyObject *a) { return simple_out(m, a, maskpack_valid_indices); }
static PyObject *py_last_token_index(PyObject *m, PyObject *a) { return simple_out(m, a, maskpack_last_token_index); }

/* (handle, convention, fill, out) */
static PyObject *py_mask4d(PyObject *m, PyObject *args) {
    PyObject *h, *desc;
    int conv, fill;
    if (!PyArg_ParseTuple(args, "O!iiO", &LayoutType, &h, &conv, &fill, &desc)) return NULL;
    maskpack_tensor o;
    if (parse_tensor(desc, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_mask4d(handle(h), (maskpack_mask_convention)conv, (maskpack_fill)fill, &o, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* (handle, form, kv, out) */
static PyObject *py_cu_seqlens(PyObject *m, PyObject *args) {
    PyObject *h, *desc;
    int form, kv;
    if (!PyArg_ParseTuple(args, "O!ipO", &LayoutType, &h, &form, &kv, &desc)) return NULL;
    maskpack_tensor o;
    if (parse_tensor(desc, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_cu_seqlens(handle(h), (maskpack_cu_form)form, kv, &o, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* (handle, kv, out) */
static PyObject *py_seqlens(PyObject *m, PyObject *args) {
    PyObject *h, *desc;
    int kv;
    if (!PyArg_ParseTuple(args, "O!pO", &LayoutType, &h, &kv, &desc)) return NULL;
    maskpack_tensor o;
    if (parse_tensor(desc, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_seqlens(handle(h), kv, &o, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* (handle, block_q, block_k) -> (Qb, Kb) */
static PyObject *py_block_mask_dims(PyObject *m, PyObject *args) {
    PyObject *h;
    long long bq, bk;
    if (!PyArg_ParseTuple(args, "O!LL", &LayoutType, &h, &bq, &bk)) return NULL;
    int64_t qb = 0, kb = 0;
    maskpack_error err;
    maskpack_status s = maskpack_block_mask_dims(handle(h), bq, bk, &qb, &kb, &err);
    if (s) return raise_status(m, s, &err);
    return Py_BuildValue("(LL)", (long long)qb, (long long)kb);
}

/* An int32 C-contiguous buffer of exactly `numel` elements -> its pointer. The
 * C API takes raw int32 pointers here, so shape and contiguity are checked before handing them on. */
static int contiguous_i32(PyObject *desc, int64_t numel, const char *name, int32_t **out) {
    *out = NULL;
    if (desc == Py_None) return 0;
    maskpack_tensor t;
    if (parse_tensor(desc, &t, name) < 0) return -1;
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
static PyObject *py_block_mask(PyObject *m, PyObject *args) {
    PyObject *h, *outs;
    long long bq, bk;
    if (!PyArg_ParseTuple(args, "O!LLO!", &LayoutType, &h, &bq, &bk, &PyTuple_Type, &outs)) return NULL;
    if (PyTuple_GET_SIZE(outs) != 8) {
        PyErr_SetString(PyExc_TypeError, "block_mask: expected 8 output arrays");
        return NULL;
    }
    const maskpack_layout *L = handle(h);
    int64_t qb = 0, kb = 0;
    maskpack_error err;
    maskpack_status s = maskpack_block_mask_dims(L, bq, bk, &qb, &kb, &err);
    if (s) return raise_status(m, s, &err);
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
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_block_mask(L, bq, bk, &a, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* (handle, q_ranges desc|None, k_ranges desc|None, types desc|None, capacity) -> count */
static PyObject *py_magi_slices(PyObject *m, PyObject *args) {
    PyObject *h, *dq, *dk, *dt;
    Py_ssize_t cap;
    if (!PyArg_ParseTuple(args, "O!OOOn", &LayoutType, &h, &dq, &dk, &dt, &cap)) return NULL;
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
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_magi_slices(handle(h), q, k, t, (size_t)cap, &count, &err);
    Py_END_ALLOW_THREADS
    /* sizing call: a too-small buffer still reports the count needed */
    if (s == MASKPACK_ERR_BUFFER_TOO_SMALL && cap == 0) s = MASKPACK_OK;
    if (s) return raise_status(m, s, &err);
    return PyLong_FromSize_t(count);
}

/* ---- npu --------------------------------------------------------------------------------------- */

/* (handle, input_layout, scale, head_dim, factory) -> (input_layout, sparse_mode, pre, next, scale,
 * inner_precise, mask_kind, atten_mask | None, actual_seq_qlen | None, actual_seq_kvlen | None,
 * prefix | None, pad_items | None, fully_masked_rows, fully_masked_pad_rows). factory(shape) -> (object, the object to fill) allocates
 * the atten_mask; the argset never outlives this call. */
static PyObject *py_npu_args(PyObject *m, PyObject *args) {
    PyObject *h, *factory;
    int il;
    double scale;
    long long head_dim;
    if (!PyArg_ParseTuple(args, "O!idLO", &LayoutType, &h, &il, &scale, &head_dim, &factory)) return NULL;
    const maskpack_layout *L = handle(h);
    maskpack_npu_argset a;
    memset(&a, 0, sizeof a);
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_npu_args(L, (maskpack_npu_layout)il, scale, head_dim, &a, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);

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
        if (fill && parse_tensor(PyTuple_GET_ITEM(pair, 1), &o, "atten_mask") < 0) {
            Py_DECREF(pair);
            goto done;
        }
        mask_obj = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        Py_DECREF(pair);
        if (fill) {
            Py_BEGIN_ALLOW_THREADS
            s = maskpack_npu_atten_mask(L, &a, &o, &err);
            Py_END_ALLOW_THREADS
            if (s) {
                raise_status(m, s, &err);
                goto done;
            }
        }
    } else {
        mask_obj = Py_NewRef(Py_None);
    }
    if (a.actual_seq_qlen) {
        if (!(ql = i64_list(a.actual_seq_qlen, a.n_items))) goto done;
    } else
        ql = Py_NewRef(Py_None);
    if (a.actual_seq_kvlen) {
        if (!(kl = i64_list(a.actual_seq_kvlen, a.n_items))) goto done;
    } else
        kl = Py_NewRef(Py_None);
    if (a.prefix) {
        if (!(pf = i64_list(a.prefix, a.n_prefix))) goto done;
    } else
        pf = Py_NewRef(Py_None);
    if (a.pad_items) {
        pad = PyList_New((Py_ssize_t)a.n_items);
        if (!pad) goto done;
        for (int64_t i = 0; i < a.n_items; i++) PyList_SET_ITEM(pad, (Py_ssize_t)i, PyBool_FromLong(a.pad_items[i]));
    } else
        pad = Py_NewRef(Py_None);
    res = Py_BuildValue("(iiLLdiiOOOOOLL)", (int)a.input_layout, (int)a.sparse_mode, (long long)a.pre_tokens,
                        (long long)a.next_tokens, a.scale, (int)a.inner_precise, (int)a.mask_kind, mask_obj, ql, kl,
                        pf, pad, (long long)a.fully_masked_rows, (long long)a.fully_masked_pad_rows);
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
static PyObject *py_validate_npu_args(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"input_layout", "batch",      "q_len",        "kv_len",          "total_q",
                             "total_kv",     "heads_q",    "heads_kv",     "head_dim",        "sparse_mode",
                             "pre_tokens",   "next_tokens", "atten_mask",  "actual_seq_qlen", "actual_seq_kvlen",
                             "prefix",       "scale",      "inner_precise", "intended",       NULL};
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
    if (parse_opt_tensor(dmask, &tm, &has_m, "atten_mask") < 0) return NULL;
    if (parse_opt_tensor(dq, &tq_, &has_q, "actual_seq_qlen") < 0) return NULL;
    if (parse_opt_tensor(dk, &tk_, &has_k, "actual_seq_kvlen") < 0) return NULL;
    if (parse_opt_tensor(dp, &tp, &has_p, "prefix") < 0) return NULL;
    if (intended != Py_None && !PyObject_TypeCheck(intended, &LayoutType)) {
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
    c.intended = intended == Py_None ? NULL : handle(intended);
    maskpack_npu_report *rep = PyMem_Calloc(1, sizeof *rep);
    if (!rep) return PyErr_NoMemory();
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_validate_npu_args(&c, rep, &err);
    Py_END_ALLOW_THREADS
    if (s != MASKPACK_OK && s != MASKPACK_ERR_NPU_CONTRACT) {
        PyMem_Free(rep);
        return raise_status(m, s, &err);
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

static PyObject *py_packed_of(PyObject *m, PyObject *h) {
    if (!PyObject_TypeCheck(h, &LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "expected a layout handle");
        return NULL;
    }
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_layout_packed_of(handle(h), &L, &err);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (handle, placement, width) */
static PyObject *py_padded_of(PyObject *m, PyObject *args) {
    PyObject *h;
    int placement;
    long long width;
    if (!PyArg_ParseTuple(args, "O!iL", &LayoutType, &h, &placement, &width)) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_layout_padded_of(handle(h), (maskpack_placement)placement, (int64_t)width, &L, &err);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (handle, multiple) */
static PyObject *py_pad_to_multiple(PyObject *m, PyObject *args) {
    PyObject *h;
    long long mult;
    if (!PyArg_ParseTuple(args, "O!L", &LayoutType, &h, &mult)) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_layout_pad_to_multiple(handle(h), (int64_t)mult, &L, &err);
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (cp, tp, align) -> multiple */
static PyObject *py_cp_multiple(PyObject *m, PyObject *args) {
    long long cp, tp;
    int align;
    if (!PyArg_ParseTuple(args, "LLi", &cp, &tp, &align)) return NULL;
    int64_t mult = 0;
    maskpack_error err;
    maskpack_status s = maskpack_cp_multiple((int64_t)cp, (int64_t)tp, (maskpack_cp_align)align, &mult, &err);
    if (s) return raise_status(m, s, &err);
    return PyLong_FromLongLong((long long)mult);
}

/* (handle, cp, rank, scheme) -> shard handle */
static PyObject *py_cp_shard(PyObject *m, PyObject *args) {
    PyObject *h;
    long long cp, rank;
    int scheme;
    if (!PyArg_ParseTuple(args, "O!LLi", &LayoutType, &h, &cp, &rank, &scheme)) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_layout_cp_shard(handle(h), (int64_t)cp, (int64_t)rank, (maskpack_cp_scheme)scheme, &L, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    return wrap_layout(L);
}

/* (handle, cp, rank, scheme, out) */
static PyObject *py_cp_shard_indices(PyObject *m, PyObject *args) {
    PyObject *h, *desc;
    long long cp, rank;
    int scheme;
    if (!PyArg_ParseTuple(args, "O!LLiO", &LayoutType, &h, &cp, &rank, &scheme, &desc)) return NULL;
    maskpack_tensor o;
    if (parse_tensor(desc, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_cp_shard_indices(handle(h), (int64_t)cp, (int64_t)rank, (maskpack_cp_scheme)scheme, &o, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* (handle, cp, scheme, rank_out, local_out) */
static PyObject *py_cp_last_token(PyObject *m, PyObject *args) {
    PyObject *h, *d1, *d2;
    long long cp;
    int scheme;
    if (!PyArg_ParseTuple(args, "O!LiOO", &LayoutType, &h, &cp, &scheme, &d1, &d2)) return NULL;
    maskpack_tensor r, l;
    if (parse_tensor(d1, &r, "rank") < 0 || parse_tensor(d2, &l, "local") < 0) return NULL;
    maskpack_error err;
    maskpack_status s = maskpack_cp_last_token(handle(h), (int64_t)cp, (maskpack_cp_scheme)scheme, &r, &l, &err);
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* ---- relayout plans and worker teams ------------------------------------------------------------
 * Both cross to Python as capsules: a plan is immutable and cached on the source layout, a team is
 * kept per process by the package so consecutive moves reuse running threads. */

#define PLAN_CAPSULE "maskpack.relayout_plan"
#define TEAM_CAPSULE "maskpack.workers"

static void plan_capsule_free(PyObject *cap) {
    maskpack_relayout_plan_free(PyCapsule_GetPointer(cap, PLAN_CAPSULE));
}

/* A team capsule's context: what a hosted team's host needs (NULL for a team of maskpack's own). */
static void team_capsule_free(PyObject *cap) {
    maskpack_workers_free(PyCapsule_GetPointer(cap, TEAM_CAPSULE));
    PyMem_RawFree(PyCapsule_GetContext(cap));
}

/* pad: bytes holding one element, or None (zero bytes) -> *ptr (NULL for None). */
static int parse_pad(PyObject *pad, const void **ptr) {
    *ptr = NULL;
    if (pad == Py_None) return 0;
    if (!PyBytes_Check(pad)) {
        PyErr_SetString(PyExc_TypeError, "relayout: pad must be bytes (one element) or None");
        return -1;
    }
    *ptr = PyBytes_AS_STRING(pad);
    return 0;
}

/* A pad given as bytes must be exactly one element of out's dtype. */
static int check_pad(PyObject *pad, maskpack_dtype dtype) {
    if (pad != Py_None && (size_t)PyBytes_GET_SIZE(pad) != maskpack_dtype_size(dtype)) {
        PyErr_SetString(PyExc_ValueError, "relayout: pad must hold exactly one element of out's dtype");
        return -1;
    }
    return 0;
}

/* (n_threads) -> team capsule */
static PyObject *py_workers_create(PyObject *m, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    maskpack_workers *w = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_workers_create(n, &w, &err);
    if (s) return raise_status(m, s, &err);
    PyObject *cap = PyCapsule_New(w, TEAM_CAPSULE, team_capsule_free);
    if (!cap) maskpack_workers_free(w);
    return cap;
}

/* ---- a team on the OpenMP pool already in the process (torch's) ----------------------------------

   torch runs its CPU operators on an OpenMP pool whose idle threads spin for milliseconds after each
   region. A team of maskpack's own threads started right after a torch operator then shares every
   core with a spinning thread and runs at half speed; a team hosted by that pool runs on those very
   threads, which take the work at once. The pool is reached through the runtime's own entry points
   (GOMP_parallel: GNU's libgomp, and LLVM's and Intel's runtimes, which export it too), found in the
   runtime library the process has already loaded: the extension links no OpenMP of its own. */

#if defined(MPX_HAVE_PHDR)
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
typedef int (*omp_thread_num_fn)(void);
typedef struct {
    gomp_parallel_fn parallel;
    omp_thread_num_fn thread_num;
} omp_pool;
typedef struct {
    const omp_pool *pool;
    maskpack_task_fn task;
    void *ctx;
} omp_region;

static void omp_region_body(void *p) {
    omp_region *r = p;
    r->task(r->ctx, r->pool->thread_num());
}

static void omp_pool_parallel(void *host, maskpack_task_fn task, void *ctx, int n) {
    omp_region r = {host, task, ctx};
    ((omp_pool *)host)->parallel(omp_region_body, &r, (unsigned)n, 0);
}

typedef struct {
    const char *dir; /* only runtimes loaded from this folder (NULL: any) */
    omp_pool pool;
    int found;
} omp_search;

static int omp_search_object(struct dl_phdr_info *info, size_t size, void *p) {
    (void)size;
    omp_search *S = p;
    const char *name = info->dlpi_name;
    if (S->found || !name || !*name) return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (!strstr(base, "gomp") && !strstr(base, "omp5") && strncmp(base, "libomp", 6) != 0) return 0;
    if (S->dir) { /* the folder as the caller resolved it: compare real paths */
        char real[PATH_MAX];
        if (!realpath(name, real) || strncmp(real, S->dir, strlen(S->dir)) != 0) return 0;
    }
    void *h = dlopen(name, RTLD_NOW | RTLD_NOLOAD); /* already loaded: a reference, never a new copy */
    if (!h) return 0;
    void *par = dlsym(h, "GOMP_parallel"), *num = dlsym(h, "omp_get_thread_num");
    if (par && num) {
        /* function pointers through a data pointer (dlsym's contract on POSIX) */
        memcpy(&S->pool.parallel, &par, sizeof par);
        memcpy(&S->pool.thread_num, &num, sizeof num);
        S->found = 1; /* the reference stays: the runtime outlives every team made on it */
        return 1;
    }
    dlclose(h);
    return 0;
}

#endif

/* (n_threads, folder or None) -> team capsule on the OpenMP runtime loaded from that folder (None:
   the first loaded), or None when the process has no such runtime */
static PyObject *py_workers_create_openmp(PyObject *m, PyObject *args) {
    int n;
    const char *dir = NULL;
    if (!PyArg_ParseTuple(args, "iz", &n, &dir)) return NULL;
#if !defined(MPX_HAVE_PHDR)
    (void)m;
    (void)n;
    (void)dir;
    Py_RETURN_NONE; /* no way to list the loaded objects here: maskpack's own threads */
#else
    omp_search S;
    memset(&S, 0, sizeof S);
    S.dir = dir;
    dl_iterate_phdr(omp_search_object, &S);
    if (!S.found) Py_RETURN_NONE;
    omp_pool *pool = PyMem_RawMalloc(sizeof *pool);
    if (!pool) return PyErr_NoMemory();
    *pool = S.pool;
    maskpack_workers *w = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_workers_create_hosted(n, omp_pool_parallel, pool, &w, &err);
    if (s) {
        PyMem_RawFree(pool);
        return raise_status(m, s, &err);
    }
    PyObject *cap = PyCapsule_New(w, TEAM_CAPSULE, team_capsule_free);
    if (!cap || PyCapsule_SetContext(cap, pool) != 0) {
        if (cap) Py_DECREF(cap); /* its destructor frees the team; the pool is not yet its context */
        else maskpack_workers_free(w);
        PyMem_RawFree(pool);
        return NULL;
    }
    return cap;
#endif
}

/* (team capsule) -> "openmp" (hosted by the OpenMP pool) or "own" (maskpack's threads) */
static PyObject *py_workers_pool(PyObject *m, PyObject *cap) {
    (void)m;
    if (!PyCapsule_IsValid(cap, TEAM_CAPSULE)) {
        PyErr_SetString(PyExc_TypeError, "workers_pool: expected a worker team capsule");
        return NULL;
    }
    return PyUnicode_FromString(PyCapsule_GetContext(cap) ? "openmp" : "own");
}

/* (sources: tuple of handles, dst handle) -> plan capsule */
static PyObject *py_plan_create(PyObject *m, PyObject *args) {
    PyObject *srcs, *dst;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &srcs, &LayoutType, &dst)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(srcs);
    if (n < 1 || n > 4096) {
        PyErr_SetString(PyExc_ValueError, "relayout: expected 1 to 4096 source layouts");
        return NULL;
    }
    const maskpack_layout **L = PyMem_Calloc((size_t)n, sizeof *L);
    if (!L) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *hi = PyTuple_GET_ITEM(srcs, i);
        if (!PyObject_TypeCheck(hi, &LayoutType)) {
            PyMem_Free(L);
            PyErr_SetString(PyExc_TypeError, "relayout: sources must be layout handles");
            return NULL;
        }
        L[i] = handle(hi);
    }
    maskpack_relayout_plan *P = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_relayout_plan_create(L, (size_t)n, handle(dst), &P, &err);
    Py_END_ALLOW_THREADS
    PyMem_Free(L);
    if (s) return raise_status(m, s, &err);
    PyObject *cap = PyCapsule_New(P, PLAN_CAPSULE, plan_capsule_free);
    if (!cap) maskpack_relayout_plan_free(P);
    return cap;
}

/* (plan capsule, source index) -> the adjoint plan capsule (dst -> that source's grid, fills elsewhere) */
static PyObject *py_plan_adjoint(PyObject *m, PyObject *args) {
    PyObject *plan;
    Py_ssize_t src;
    if (!PyArg_ParseTuple(args, "On", &plan, &src)) return NULL;
    maskpack_relayout_plan *P = PyCapsule_GetPointer(plan, PLAN_CAPSULE);
    if (!P) return NULL;
    if (src < 0) {
        PyErr_SetString(PyExc_ValueError, "plan_adjoint: source must be >= 0");
        return NULL;
    }
    maskpack_relayout_plan *A = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_relayout_plan_adjoint(P, (size_t)src, &A, &err);
    if (s) return raise_status(m, s, &err);
    PyObject *cap = PyCapsule_New(A, PLAN_CAPSULE, plan_capsule_free);
    if (!cap) maskpack_relayout_plan_free(A);
    return cap;
}

/* (plan capsule, xs: tuple of tensors, out, pad: bytes | None, team capsule | None)
 * -> None. The GIL is released for the copy; the caller keeps the tensors alive. */
static PyObject *py_plan_execute(PyObject *m, PyObject *args) {
    PyObject *plan, *xs, *odesc, *pad, *team;
    if (!PyArg_ParseTuple(args, "OO!OOO", &plan, &PyTuple_Type, &xs, &odesc, &pad, &team)) return NULL;
    maskpack_relayout_plan *P = PyCapsule_GetPointer(plan, PLAN_CAPSULE);
    if (!P) return NULL;
    maskpack_workers *w = NULL;
    if (team != Py_None && !(w = PyCapsule_GetPointer(team, TEAM_CAPSULE))) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(xs);
    if (n < 1 || n > 4096) {
        PyErr_SetString(PyExc_ValueError, "relayout: expected as many tensors as source layouts (1 to 4096)");
        return NULL;
    }
    const void *pad_ptr = NULL;
    if (parse_pad(pad, &pad_ptr) < 0) return NULL;
    /* one tensor is the common case: no heap allocation for it */
    maskpack_tensor x1, *X = &x1;
    const maskpack_tensor *xp1, **XP = &xp1;
    if (n > 1) {
        X = PyMem_Calloc((size_t)n, sizeof *X);
        XP = PyMem_Calloc((size_t)n, sizeof *XP);
        if (!X || !XP) {
            PyMem_Free(X);
            PyMem_Free(XP);
            return PyErr_NoMemory();
        }
    }
    PyObject *ret = NULL;
    maskpack_tensor o;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parse_tensor(PyTuple_GET_ITEM(xs, i), &X[i], "x") < 0) goto done;
        XP[i] = &X[i];
    }
    if (parse_tensor(odesc, &o, "out") < 0) goto done;
    if (check_pad(pad, o.dtype) < 0) goto done;
    {
        maskpack_error err;
        maskpack_status s;
        Py_BEGIN_ALLOW_THREADS
        s = maskpack_relayout_execute_on(P, XP, &o, pad_ptr, w, &err);
        Py_END_ALLOW_THREADS
        if (s) {
            raise_status(m, s, &err);
            goto done;
        }
    }
    ret = Py_NewRef(Py_None);
done:
    if (n > 1) {
        PyMem_Free(X);
        PyMem_Free(XP);
    }
    return ret;
}

/* ---- the fast path of a move: the package's checks skipped for a cached plan ----------------------
 * A relayout of an L2-sized tensor copies in ~10 us; the package's argument checks cost half as much
 * again, so a move into a given out tries the tensors as they are first. */

/* (torch.Tensor, torch.utils.dlpack.to_dlpack) -> None: the one tensor reader (ext_common.c) takes
 * torch tensors from now on. */
static PyObject *py_register_torch(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *tensor, *to_dlpack;
    if (!PyArg_ParseTuple(args, "OO", &tensor, &to_dlpack)) return NULL;
    if (mpx_register_torch(tensor, to_dlpack) < 0) return NULL;
    Py_RETURN_NONE;
}

/* (tensor or array) -> (dtype code, shape, strides in elements, address): what the one tensor reader
 * makes of an argument, so that tests check its dtype tables against maskpack.h. */
static PyObject *py_tensor_info(PyObject *m, PyObject *obj) {
    (void)m;
    maskpack_tensor t;
    if (parse_tensor(obj, &t, "x") < 0) return NULL;
    PyObject *shape = PyTuple_New(t.ndim), *strides = PyTuple_New(t.ndim);
    if (!shape || !strides) goto fail;
    for (int32_t i = 0; i < t.ndim; i++) {
        PyObject *a = PyLong_FromLongLong((long long)t.shape[i]), *b = PyLong_FromLongLong((long long)t.strides[i]);
        if (!a || !b) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto fail;
        }
        PyTuple_SET_ITEM(shape, i, a);
        PyTuple_SET_ITEM(strides, i, b);
    }
    return Py_BuildValue("iNNN", (int)t.dtype, shape, strides, PyLong_FromVoidPtr(t.data));
fail:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return NULL;
}

/* (plan, x, out, pad bytes | None, team | None) -> True when done, False when x or out is not
 * readable by the one tensor reader (another device, a tensor that requires grad...: the package then
 * takes its full path, which names the problem). */
static PyObject *py_move(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "move: expected 5 arguments, found %zd", nargs);
    PyObject *plan = args[0], *x = args[1], *out = args[2], *pad = args[3], *team = args[4];
    maskpack_relayout_plan *P = PyCapsule_GetPointer(plan, PLAN_CAPSULE);
    if (!P) return NULL;
    maskpack_workers *w = NULL;
    if (team != Py_None && !(w = PyCapsule_GetPointer(team, TEAM_CAPSULE))) return NULL;
    const void *pad_ptr = NULL;
    if (parse_pad(pad, &pad_ptr) < 0) return NULL;
    maskpack_tensor xt, ot;
    int px = 0, po = 0;
    if (mpx_parse_tensor(x, "x", &xt, &px) < 0 || mpx_parse_out_tensor(out, "out", &ot, &po) < 0 || !px || !po) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    if (check_pad(pad, ot.dtype) < 0) return NULL;
    const maskpack_tensor *xp[1] = {&xt};
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_relayout_execute_on(P, xp, &ot, pad_ptr, w, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_TRUE;
}

/* (handle, labels, ignore_index, out) */
static PyObject *py_shift_labels(PyObject *m, PyObject *args) {
    PyObject *h, *ld, *od;
    long long ignore;
    if (!PyArg_ParseTuple(args, "O!OLO", &LayoutType, &h, &ld, &ignore, &od)) return NULL;
    maskpack_tensor l, o;
    if (parse_tensor(ld, &l, "labels") < 0 || parse_tensor(od, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_shift_labels(handle(h), &l, (int64_t)ignore, &o, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    Py_RETURN_NONE;
}

/* (handle, labels | None, ignore_index, mode, out) -> denominator */
static PyObject *py_loss_weights(PyObject *m, PyObject *args) {
    PyObject *h, *ld, *od;
    long long ignore;
    int mode;
    if (!PyArg_ParseTuple(args, "O!OLiO", &LayoutType, &h, &ld, &ignore, &mode, &od)) return NULL;
    maskpack_tensor l, o;
    int has_labels = 0;
    if (parse_opt_tensor(ld, &l, &has_labels, "labels") < 0 || parse_tensor(od, &o, "out") < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    double denom = 0;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_loss_weights(handle(h), has_labels ? &l : NULL, (int64_t)ignore, (maskpack_loss_mode)mode, &o,
                              &denom, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(m, s, &err);
    return PyFloat_FromDouble(denom);
}

static PyMethodDef methods[] = {
    {"packed_of", py_packed_of, METH_O, "(handle) -> packed handle of the same sequences"},
    {"padded_of", py_padded_of, METH_VARARGS, "(handle, placement, width) -> padded handle"},
    {"pad_to_multiple", py_pad_to_multiple, METH_VARARGS, "(handle, multiple) -> handle"},
    {"cp_multiple", py_cp_multiple, METH_VARARGS, "(cp, tp, align) -> multiple"},
    {"cp_shard", py_cp_shard, METH_VARARGS, "(handle, cp, rank, scheme) -> shard handle"},
    {"cp_shard_indices", py_cp_shard_indices, METH_VARARGS, "(handle, cp, rank, scheme, out)"},
    {"cp_last_token", py_cp_last_token, METH_VARARGS, "(handle, cp, scheme, rank_out, local_out)"},
    {"workers_create", py_workers_create, METH_VARARGS, "(n_threads) -> worker team capsule"},
    {"workers_create_openmp", py_workers_create_openmp, METH_VARARGS,
     "(n_threads, folder or None) -> team capsule on the loaded OpenMP runtime, or None"},
    {"workers_pool", py_workers_pool, METH_O, "(team capsule) -> 'openmp' or 'own'"},
    {"plan_create", py_plan_create, METH_VARARGS, "(sources, dst) -> relayout plan capsule"},
    {"plan_execute", py_plan_execute, METH_VARARGS, "(plan, xs, out, pad, team | None)"},
    {"plan_adjoint", py_plan_adjoint, METH_VARARGS, "(plan, source) -> the adjoint plan capsule"},
    {"register_torch", py_register_torch, METH_VARARGS, "(torch.Tensor, torch.utils.dlpack.to_dlpack) -> None"},
    {"tensor_info", py_tensor_info, METH_O, "(tensor or array) -> (dtype code, shape, strides, address) as read"},
    {"move", (PyCFunction)(void (*)(void))py_move, METH_FASTCALL, "(plan, x, out, pad, team) -> True, or False when x/out need the package's checks"},
    {"shift_labels", py_shift_labels, METH_VARARGS, "(handle, labels, ignore_index, out)"},
    {"loss_weights", py_loss_weights, METH_VARARGS, "(handle, labels, ignore_index, mode, out) -> denominator"},

    {"version", py_version, METH_NOARGS, "() -> library version string"},
    {"version_number", py_version_number, METH_NOARGS, "() -> MAJOR*10000 + MINOR*100 + PATCH"},
    {"status_names", py_status_names, METH_NOARGS, "() -> status names indexed by code"},
    {"status_message", py_status_message, METH_O, "(code) -> generic description"},
    {"_set_error_type", py_set_error_type, METH_O, "(type) -> None: the exception raised on failures"},
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

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_maskpack",
    .m_doc = "Low-level binding of libmaskpack (use the maskpack package).",
    .m_size = 0, /* no per-module state: the registered torch and error types live in ext_common.c */
    .m_methods = methods,
};

/* One part of the module (planner, a kernel family) as the attribute `name`: a module object whose
 * functions come from that part's file; they take Layout handles of this module's type. */
static int add_part(PyObject *m, const char *name, const char *doc, int (*init)(PyObject *)) {
    PyObject *full = PyUnicode_FromFormat("maskpack._maskpack.%s", name);
    if (!full) return -1;
    PyObject *sub = PyModule_NewObject(full);
    Py_DECREF(full);
    if (!sub) return -1;
    if (PyModule_SetDocString(sub, doc) < 0 || init(sub) < 0 || PyModule_AddObject(m, name, sub) < 0) {
        Py_DECREF(sub);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__maskpack(void) {
    if (PyType_Ready(&LayoutType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&LayoutType);
    if (PyModule_AddObject(m, "Layout", (PyObject *)&LayoutType) < 0) {
        Py_DECREF(&LayoutType);
        Py_DECREF(m);
        return NULL;
    }
    if (add_part(m, "plan", "Packing planner bindings (use maskpack.plan).", mpx_init_plan) < 0 ||
        add_part(m, "gdn", "Gated DeltaNet bindings (use maskpack.gdn).", mpx_init_gdn) < 0 ||
        add_part(m, "attention", "Fused CPU attention over a layout (use maskpack.attention).", mpx_init_attention) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "NPU_MAX_ITEMS", MASKPACK_NPU_MAX_ITEMS) < 0 ||
        PyModule_AddIntConstant(m, "NPU_MAX_FINDINGS", MASKPACK_NPU_MAX_FINDINGS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DIMS", MASKPACK_MAX_DIMS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
