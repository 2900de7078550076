/*
 * ext_common.h: what every sibling extension module of the maskpack package shares (header-only,
 * each module gets its own static copy): turning a failed status into maskpack.Error, and reading
 * the (data_ptr, dtype_code, shape, strides) tensor descriptors and layout addresses the Python
 * layer passes. _maskpack.c keeps its own error path (it owns the Error type registration).
 */
#ifndef MASKPACK_EXT_COMMON_H
#define MASKPACK_EXT_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <string.h>

#include "maskpack.h"

/* Raises maskpack.Error(message, status_name, code, argument, index) for a failed call. */
static inline PyObject *mpx_raise_status(maskpack_status status, const maskpack_error *err) {
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

/* A sequence of at most `cap` ints -> out[0..n). */
static inline int mpx_parse_i64_seq(PyObject *obj, const char *name, int64_t *out, Py_ssize_t cap, Py_ssize_t *n_out) {
    PyObject *seq = PySequence_Fast(obj, "expected a sequence");
    if (!seq) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tuple of ints", name);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > cap) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: at most %zd entries are supported, found %zd", name, cap, n);
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

/* A shape or strides tuple (at most MASKPACK_MAX_DIMS entries). */
static inline int mpx_parse_dims(PyObject *obj, const char *name, int64_t *out, Py_ssize_t *n_out) {
    /* more dimensions than any maskpack tensor has: a shape error (maskpack.Error), as the library's */
    Py_ssize_t len = PyTuple_Check(obj) || PyList_Check(obj) ? PySequence_Size(obj) : -1;
    if (len > MASKPACK_MAX_DIMS) {
        maskpack_error e;
        memset(&e, 0, sizeof e);
        e.status = MASKPACK_ERR_SHAPE;
        for (int i = 0; i < 4; i++) e.index[i] = -1;
        snprintf(e.argument, sizeof e.argument, "%s", name);
        snprintf(e.message, sizeof e.message, "%s: expected at most %d dimensions, found %zd", name, MASKPACK_MAX_DIMS,
                 len);
        mpx_raise_status(MASKPACK_ERR_SHAPE, &e);
        return -1;
    }
    return mpx_parse_i64_seq(obj, name, out, MASKPACK_MAX_DIMS, n_out);
}

/* Descriptor -> tensor; None -> *present = 0. */
static inline int mpx_parse_tensor(PyObject *desc, const char *name, maskpack_tensor *t, int *present) {
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
    if (mpx_parse_dims(PyTuple_GET_ITEM(desc, 2), name, t->shape, &nd) < 0) return -1;
    if (mpx_parse_dims(PyTuple_GET_ITEM(desc, 3), name, t->strides, &ns) < 0) return -1;
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

static inline int mpx_parse_layout(PyObject *addr, const maskpack_layout **L) {
    void *p = PyLong_AsVoidPtr(addr);
    if (!p) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "layout: NULL address");
        return -1;
    }
    *L = (const maskpack_layout *)p;
    return 0;
}

#endif
