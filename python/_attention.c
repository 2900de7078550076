/*
 * _attention.c: the CPython extension behind maskpack.attention (fused CPU attention over a
 * layout). Thin like its siblings: tensors cross as descriptors
 *     (data_ptr: int, dtype_code: int, shape: tuple, strides_in_elements: tuple)
 * built by maskpack/attention.py without copying (outputs are allocated there), the layout as the
 * address of its maskpack_layout (Layout._ptr; the Python side keeps the Layout and every tensor
 * alive for the call). The GIL is released around the computation; the workspace is allocated by
 * the library for the call. Failures raise maskpack.Error with the C library's status, argument,
 * index and message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "maskpack.h"

static PyObject *raise_status(maskpack_status status, const maskpack_error *err) {
    const char *msg = err->message[0] ? err->message : maskpack_status_message(status);
    const char *arg = err->argument[0] ? err->argument : NULL;
    int n_idx = 0;
    for (int i = 0; i < 4; i++)
        if (err->index[i] != -1) n_idx = i + 1;
    PyObject *idx = PyTuple_New(n_idx);
    if (!idx) return NULL;
    for (int i = 0; i < n_idx; i++) {
        PyObject *v = PyLong_FromLongLong((long long)err->index[i]);
        if (!v) {
            Py_DECREF(idx);
            return NULL;
        }
        PyTuple_SET_ITEM(idx, i, v);
    }
    PyObject *mod = PyImport_ImportModule("maskpack._errors");
    PyObject *type = mod ? PyObject_GetAttrString(mod, "Error") : NULL;
    Py_XDECREF(mod);
    if (!type) {
        Py_DECREF(idx);
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    }
    PyObject *exc = PyObject_CallFunction(type, "ssizO", msg, maskpack_status_name(status), (int)status, arg, idx);
    Py_DECREF(idx);
    if (exc) {
        PyErr_SetObject(type, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(type);
    return NULL;
}

static int parse_dims(PyObject *obj, const char *name, int64_t *out, Py_ssize_t *n_out) {
    PyObject *seq = PySequence_Fast(obj, "expected a sequence");
    if (!seq) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tuple of ints", name);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MASKPACK_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: at most %d dimensions are supported, found %zd", name, MASKPACK_MAX_DIMS, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        out[i] = (int64_t)v;
    }
    Py_DECREF(seq);
    *n_out = n;
    return 0;
}

/* Descriptor -> tensor; None -> *present = 0. */
static int parse_tensor(PyObject *desc, const char *name, maskpack_tensor *t, int *present) {
    memset(t, 0, sizeof *t);
    *present = 0;
    if (desc == Py_None) return 0;
    if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 4) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tensor descriptor (data_ptr, dtype, shape, strides)", name);
        return -1;
    }
    void *data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(desc, 0));
    if (!data && PyErr_Occurred()) return -1;
    long dt = PyLong_AsLong(PyTuple_GET_ITEM(desc, 1));
    if (dt == -1 && PyErr_Occurred()) return -1;
    if (dt < 0 || dt >= MASKPACK_DTYPE_COUNT_) {
        PyErr_Format(PyExc_ValueError, "%s: unknown dtype code %ld", name, dt);
        return -1;
    }
    Py_ssize_t nd = 0, ns = 0;
    if (parse_dims(PyTuple_GET_ITEM(desc, 2), name, t->shape, &nd) < 0) return -1;
    if (parse_dims(PyTuple_GET_ITEM(desc, 3), name, t->strides, &ns) < 0) return -1;
    if (nd != ns) {
        PyErr_Format(PyExc_ValueError, "%s: shape has %zd entries but strides %zd", name, nd, ns);
        return -1;
    }
    t->data = data;
    t->dtype = (maskpack_dtype)dt;
    t->ndim = (int32_t)nd;
    *present = 1;
    return 0;
}

static int parse_layout(PyObject *addr, const maskpack_layout **L) {
    void *p = PyLong_AsVoidPtr(addr);
    if (!p) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "layout: NULL address");
        return -1;
    }
    *L = (const maskpack_layout *)p;
    return 0;
}

/* (layout_ptr, q, k, v, scale, softcap, out, lse | None, n_threads) -> None */
static PyObject *py_forward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *addr, *dq, *dk, *dv, *dout, *dlse;
    double scale, softcap;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOddOOi", &addr, &dq, &dk, &dv, &scale, &softcap, &dout, &dlse, &threads))
        return NULL;
    const maskpack_layout *L;
    maskpack_tensor q, k, v, out, lse;
    int pq, pk, pv, po, pl;
    if (parse_layout(addr, &L) < 0 || parse_tensor(dq, "q", &q, &pq) < 0 || parse_tensor(dk, "k", &k, &pk) < 0 ||
        parse_tensor(dv, "v", &v, &pv) < 0 || parse_tensor(dout, "out", &out, &po) < 0 ||
        parse_tensor(dlse, "lse", &lse, &pl) < 0)
        return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_attention_forward(L, pq ? &q : NULL, pk ? &k : NULL, pv ? &v : NULL, scale, softcap,
                                   po ? &out : NULL, pl ? &lse : NULL, threads, NULL, 0, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (layout_ptr, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, n_threads) -> None */
static PyObject *py_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *addr, *d[10];
    double scale, softcap;
    int threads;
    if (!PyArg_ParseTuple(args, "OOOOOOOddOOOi", &addr, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &scale, &softcap,
                          &d[6], &d[7], &d[8], &threads))
        return NULL;
    static const char *names[9] = {"dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv"};
    const maskpack_layout *L;
    maskpack_tensor t[9];
    int present[9];
    if (parse_layout(addr, &L) < 0) return NULL;
    for (int i = 0; i < 9; i++)
        if (parse_tensor(d[i], names[i], &t[i], &present[i]) < 0) return NULL;
    maskpack_tensor *p[9];
    for (int i = 0; i < 9; i++) p[i] = present[i] ? &t[i] : NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS
    s = maskpack_attention_backward(L, p[0], p[1], p[2], p[3], p[4], p[5], scale, softcap, p[6], p[7], p[8], threads,
                                    NULL, 0, &err);
    Py_END_ALLOW_THREADS
    if (s) return raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (dtype_code) -> "ref" | "avx512" | "amx": the kernel the next call uses (MASKPACK_ISA honoured). */
static PyObject *py_isa(PyObject *m, PyObject *arg) {
    (void)m;
    long dt = PyLong_AsLong(arg);
    if (dt == -1 && PyErr_Occurred()) return NULL;
    maskpack_attention_isa isa;
    maskpack_error err;
    maskpack_status s = maskpack_attention_select_isa((maskpack_dtype)dt, &isa, &err);
    if (s) return raise_status(s, &err);
    return PyUnicode_FromString(maskpack_attention_isa_name(isa));
}

static PyMethodDef methods[] = {
    {"forward", py_forward, METH_VARARGS, "(layout_ptr, q, k, v, scale, softcap, out, lse, n_threads) -> None"},
    {"backward", py_backward, METH_VARARGS,
     "(layout_ptr, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, n_threads) -> None"},
    {"isa", py_isa, METH_O, "(dtype_code) -> name of the kernel the next call uses"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_attention", "Fused CPU attention over a layout (use maskpack.attention).", -1, methods,
    NULL,                  NULL,         NULL,                                                         NULL,
};

PyMODINIT_FUNC PyInit__attention(void) { return PyModule_Create(&moduledef); }
