/*
 * ext_common.c: the definitions every file of maskpack._maskpack shares (see ext_common.h): the
 * Layout handle type, the one maskpack_error -> maskpack.Error path, the tensor descriptor and rule
 * readers.
 */
#include "ext_common.h"

#include <stdio.h>
#include <string.h>

/* ---- the Layout handle ---------------------------------------------------------------------- */

static void Layout_dealloc(mpx_LayoutObject *self) {
    maskpack_layout_free(self->layout);
    self->layout = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject mpx_LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "maskpack._maskpack.Layout",
    .tp_basicsize = sizeof(mpx_LayoutObject),
    .tp_itemsize = 0,
    .tp_dealloc = (destructor)Layout_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Opaque handle to an immutable maskpack_layout (use maskpack.Layout instead).",
    /* tp_new stays NULL: handles are only made by the module's constructors. */
};

PyObject *mpx_wrap_layout(maskpack_layout *L) {
    mpx_LayoutObject *o = PyObject_New(mpx_LayoutObject, &mpx_LayoutType);
    if (!o) {
        maskpack_layout_free(L);
        return NULL;
    }
    o->layout = L;
    return (PyObject *)o;
}

int mpx_parse_layout(PyObject *obj, const maskpack_layout **L) {
    if (!PyObject_TypeCheck(obj, &mpx_LayoutType)) {
        PyErr_Format(PyExc_TypeError, "layout: expected a maskpack layout handle, found %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    *L = mpx_layout(obj);
    return 0;
}

/* ---- errors ---------------------------------------------------------------------------------- */

/* maskpack.Error, registered by the package at import (maskpack/__init__.py); a strong reference held
 * for the life of the process, as the type objects of the module are. */
static PyObject *error_type;

void mpx_set_error_type(PyObject *type) {
    Py_INCREF(type);
    Py_XSETREF(error_type, type);
}

PyObject *mpx_raise_status(maskpack_status status, const maskpack_error *err) {
    const char *msg = (err && err->message[0]) ? err->message : maskpack_status_message(status);
    const char *arg = (err && err->argument[0]) ? err->argument : NULL;
    /* index: the meaningful leading entries (trailing -1 = n/a are dropped) */
    int n_idx = 0;
    if (err)
        for (int i = 0; i < 4; i++)
            if (err->index[i] != -1) n_idx = i + 1;
    PyObject *type = error_type;
    if (!type) { /* before the package registered it (the module imported on its own): ValueError */
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    }
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
    Py_INCREF(type); /* the call below may run Python code that re-registers the type */
    PyObject *exc = PyObject_CallFunction(type, "ssizO", msg, maskpack_status_name(status), (int)status, arg, idx);
    Py_DECREF(idx);
    if (exc) {
        PyErr_SetObject(type, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(type);
    return NULL;
}

/* ---- tensors --------------------------------------------------------------------------------- */

int mpx_parse_i64_seq(PyObject *obj, const char *name, int64_t *out, Py_ssize_t cap, Py_ssize_t *n_out) {
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

int mpx_parse_dims(PyObject *obj, const char *name, int64_t *out, Py_ssize_t *n_out) {
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

int mpx_parse_tensor(PyObject *desc, const char *name, maskpack_tensor *t, int *present) {
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

/* ---- the rule -------------------------------------------------------------------------------- */

void mpx_rule_buf_free(mpx_rule_buf *rb) {
    PyMem_Free(rb->spans);
    PyMem_Free(rb->prefix);
    rb->spans = NULL;
    rb->prefix = NULL;
}

int mpx_parse_rule(PyObject *obj, mpx_rule_buf *rb) {
    memset(rb, 0, sizeof *rb);
    rb->rule = maskpack_rule_default();
    if (obj == Py_None) return 0;
    long causal, align;
    long long wl, wr;
    PyObject *spans, *prefix;
    if (!PyTuple_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "rule: expected a tuple (causal, alignment, left, right, spans, prefix)");
        return -1;
    }
    if (!PyArg_ParseTuple(obj, "llLLOO;rule: expected (causal, alignment, left, right, spans, prefix)", &causal,
                          &align, &wl, &wr, &spans, &prefix))
        return -1;
    rb->rule.causal = (int)causal;
    rb->rule.alignment = (maskpack_alignment)align;
    rb->rule.window_left = (int64_t)wl;
    rb->rule.window_right = (int64_t)wr;
    if (spans != Py_None) {
        PyObject *seq = PySequence_Fast(spans, "rule.spans: expected a sequence of (segment, start, end)");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        rb->spans = PyMem_Calloc(n ? (size_t)n : 1, sizeof *rb->spans);
        if (!rb->spans) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t v[3];
            Py_ssize_t got = 0;
            PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
            if (mpx_parse_i64_seq(item, "rule.spans[i]", v, 3, &got) < 0 || got != 3) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_TypeError, "rule.spans[%zd]: expected (segment, start, end)", i);
                Py_DECREF(seq);
                mpx_rule_buf_free(rb);
                return -1;
            }
            rb->spans[i].segment = v[0];
            rb->spans[i].start = v[1];
            rb->spans[i].end = v[2];
        }
        Py_DECREF(seq);
        rb->rule.spans = rb->spans;
        rb->rule.n_spans = (size_t)n;
    }
    if (prefix != Py_None) {
        PyObject *seq = PySequence_Fast(prefix, "rule.prefix: expected a sequence of ints");
        if (!seq) {
            mpx_rule_buf_free(rb);
            return -1;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        rb->prefix = PyMem_Calloc(n ? (size_t)n : 1, sizeof *rb->prefix);
        if (!rb->prefix) {
            Py_DECREF(seq);
            mpx_rule_buf_free(rb);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                mpx_rule_buf_free(rb);
                return -1;
            }
            rb->prefix[i] = (int64_t)v;
        }
        Py_DECREF(seq);
        rb->rule.prefix = rb->prefix;
        rb->rule.n_prefix = (size_t)n;
    }
    return 0;
}

/* ---- a maskpack_comm over a Python object (see ext_common.h) ---------------------------------- */

static int py_comm_call(PyObject *obj, PyObject *res) {
    if (res) {
        Py_DECREF(res);
        return 0;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && PyObject_SetAttrString(obj, "error", value) < 0) PyErr_Clear();
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return 1;
}

static PyObject *view_of(void *p, size_t n) {
    if (!p || n == 0) Py_RETURN_NONE;
    return PyMemoryView_FromMemory((char *)p, (Py_ssize_t)n, PyBUF_WRITE);
}

static int pyc_collective(void *ctx, const char *method, const void *send, size_t sbytes, void *recv, size_t rbytes) {
    mpx_comm *c = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *sv = view_of((void *)send, sbytes), *rv = view_of(recv, rbytes);
    int rc = 1;
    if (sv && rv) rc = py_comm_call(c->obj, PyObject_CallMethod(c->obj, method, "OO", sv, rv));
    else py_comm_call(c->obj, NULL);
    Py_XDECREF(sv);
    Py_XDECREF(rv);
    PyGILState_Release(g);
    return rc;
}

static int pyc_all_gather(void *ctx, const void *send, void *recv, size_t bytes) {
    return pyc_collective(ctx, "all_gather", send, bytes, recv, bytes * (size_t)((mpx_comm *)ctx)->size);
}

static int pyc_all_to_all(void *ctx, const void *send, void *recv, size_t bytes) {
    size_t n = bytes * (size_t)((mpx_comm *)ctx)->size;
    return pyc_collective(ctx, "all_to_all", send, n, recv, n);
}

static int pyc_sendrecv_start(void *ctx, const void *send, size_t send_bytes, int to, void *recv, size_t recv_bytes,
                              int from, int tag, void **request) {
    mpx_comm *c = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *sv = view_of((void *)send, send_bytes), *rv = view_of(recv, recv_bytes), *h = NULL;
    if (sv && rv) h = PyObject_CallMethod(c->obj, "sendrecv_start", "OiOii", sv, to, rv, from, tag);
    Py_XDECREF(sv);
    Py_XDECREF(rv);
    int rc = 0;
    if (h)
        *request = h; /* the handle (a new reference) keeps the transfer's tensors alive until wait */
    else
        rc = py_comm_call(c->obj, NULL);
    PyGILState_Release(g);
    return rc;
}

static int pyc_wait(void *ctx, void *request) {
    mpx_comm *c = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *h = request;
    int rc = py_comm_call(c->obj, PyObject_CallMethod(c->obj, "wait", "O", h));
    Py_DECREF(h);
    PyGILState_Release(g);
    return rc;
}

int mpx_parse_comm(PyObject *obj, int rank, int size, mpx_comm *pc, maskpack_comm *c) {
    if (size < 1 || rank < 0 || rank >= size) {
        PyErr_Format(PyExc_ValueError, "comm: expected 0 <= rank < size, found rank %d of size %d", rank, size);
        return -1;
    }
    pc->obj = obj;
    pc->size = size;
    *c = (maskpack_comm){pc, rank, size, pyc_all_gather, pyc_all_to_all, pyc_sendrecv_start, pyc_wait};
    return 0;
}

