/*
 * ext_common.c: the definitions every file of maskpack._maskpack shares (see ext_common.h): the
 * Layout handle type, the one maskpack_error -> maskpack.Error path, the one tensor reader (torch
 * tensors through DLPack, numpy arrays through the buffer protocol) and the rule reader.
 */
#include "ext_common.h"

#include <stdarg.h>
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

/* ---- the other handles ------------------------------------------------------------------------ */

PyObject *mpx_new_handle(PyTypeObject *type, void *ptr, void *host) {
    mpx_HandleObject *o = PyObject_New(mpx_HandleObject, type);
    if (!o) return NULL;
    o->ptr = ptr;
    o->host = host;
    return (PyObject *)o;
}

void *mpx_handle_ptr(PyObject *obj, PyTypeObject *type, const char *name) {
    if (!PyObject_TypeCheck(obj, type)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a %s, found %.100s", name, type->tp_name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((mpx_HandleObject *)obj)->ptr;
}

int mpx_parse_team(PyObject *obj, maskpack_workers **team) {
    *team = NULL;
    if (obj == Py_None) return 0;
    *team = mpx_handle_ptr(obj, &mpx_TeamType, "team");
    return *team ? 0 : -1;
}

/* ---- errors ---------------------------------------------------------------------------------- */

/* maskpack.Error, registered by the package at import (maskpack/__init__.py); a strong reference held
 * for the life of the process, as the type objects of the module are. */
static PyObject *error_type, *argument_error_type;

void mpx_set_error_type(PyObject *type, PyObject *argument_type) {
    Py_INCREF(type);
    Py_XSETREF(error_type, type);
    Py_XINCREF(argument_type);
    Py_XSETREF(argument_error_type, argument_type);
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

/* ---- integers -------------------------------------------------------------------------------- */

int mpx_item_i64(PyObject *item, const char *arg, Py_ssize_t i, int64_t *out) {
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
        mpx_raise_status(MASKPACK_ERR_OVERFLOW, &e);
        return -1;
    }
    *out = (int64_t)x;
    return 0;
}

PyObject *mpx_i64_list(const int64_t *v, int64_t n) {
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

/* ---- tensors --------------------------------------------------------------------------------- */

/* The tensor reader's refusal of an argument, the one per failure: maskpack.Error's argument subclass (a
 * maskpack.Error with status and argument that is also a TypeError), or a TypeError before the package
 * registered it. Always -1. */
static int refuse(maskpack_status status, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!msg) return -1;
    PyObject *type = argument_error_type;
    if (!type) {
        PyErr_SetObject(PyExc_TypeError, msg);
        Py_DECREF(msg);
        return -1;
    }
    Py_INCREF(type);
    PyObject *exc = PyObject_CallFunction(type, "Osis()", msg, maskpack_status_name(status), (int)status, name);
    if (exc) {
        PyErr_SetObject(type, exc);
        Py_DECREF(exc);
    }
    Py_DECREF(type);
    Py_DECREF(msg);
    return -1;
}

/* str(getattr(x, attr)), or "?" (no exception left) */
static PyObject *attr_str(PyObject *x, const char *attr) {
    PyObject *a = PyObject_GetAttrString(x, attr), *s = a ? PyObject_Str(a) : NULL;
    Py_XDECREF(a);
    if (!s) {
        PyErr_Clear();
        s = PyUnicode_FromString("?");
    }
    return s;
}

#define DTYPES_EXPECTED "expected one of bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64"

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

/* torch.Tensor and torch.utils.dlpack.to_dlpack, registered by the package when torch is first used
 * (the module never imports torch itself); strong references for the life of the process, as the
 * error type's. to_dlpack, unlike Tensor.__dlpack__, also exports tensors that require grad, which
 * the autograd functions hand to the kernels. */
static PyObject *torch_tensor_type, *torch_to_dlpack, *s_is_neg;

int mpx_register_torch(PyObject *tensor_type, PyObject *to_dlpack) {
    if (!PyType_Check(tensor_type) || !PyCallable_Check(to_dlpack)) {
        PyErr_SetString(PyExc_TypeError, "register_torch: expected (torch.Tensor, torch.utils.dlpack.to_dlpack)");
        return -1;
    }
    if (!s_is_neg && !(s_is_neg = PyUnicode_InternFromString("is_neg"))) return -1;
    Py_INCREF(tensor_type);
    Py_XSETREF(torch_tensor_type, tensor_type);
    Py_INCREF(to_dlpack);
    Py_XSETREF(torch_to_dlpack, to_dlpack);
    return 0;
}

/* The DLPack exchange structs (the published ABI of dmlc/dlpack, unversioned form), declared here so
 * that one call to to_dlpack describes a tensor: it costs about half of the five attribute reads
 * (is_cpu, dtype, shape, stride(), data_ptr()) it replaces. */
typedef struct {
    int32_t device_type; /* 1: CPU */
    int32_t device_id;
} dlpack_device;
typedef struct {
    uint8_t code; /* 0 int, 1 uint, 2 float, 4 bfloat, 6 bool */
    uint8_t bits;
    uint16_t lanes;
} dlpack_dtype;
typedef struct {
    void *data;
    dlpack_device device;
    int32_t ndim;
    dlpack_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} dlpack_tensor;
typedef struct dlpack_managed {
    dlpack_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dlpack_managed *);
} dlpack_managed;

/* DLPack (code, bits) -> maskpack dtype, or -1. */
static int dlpack_dtype_code(dlpack_dtype d) {
    if (d.lanes != 1) return -1;
    switch (d.code) {
    case 0:
        return d.bits == 8    ? MASKPACK_I8
               : d.bits == 16 ? MASKPACK_I16
               : d.bits == 32 ? MASKPACK_I32
               : d.bits == 64 ? MASKPACK_I64
                              : -1;
    case 1: return d.bits == 8 ? MASKPACK_U8 : -1;
    case 2: return d.bits == 16 ? MASKPACK_F16 : d.bits == 32 ? MASKPACK_F32 : d.bits == 64 ? MASKPACK_F64 : -1;
    case 4: return d.bits == 16 ? MASKPACK_BF16 : -1;
    case 6: return d.bits == 8 ? MASKPACK_BOOL : -1;
    default: return -1;
    }
}

/* More dimensions than any maskpack tensor has: a shape error (maskpack.Error), as the library's. */
static int too_many_dims(const char *name, Py_ssize_t nd) {
    maskpack_error e;
    memset(&e, 0, sizeof e);
    e.status = MASKPACK_ERR_SHAPE;
    for (int i = 0; i < 4; i++) e.index[i] = -1;
    snprintf(e.argument, sizeof e.argument, "%s", name);
    snprintf(e.message, sizeof e.message, "%s: expected at most %d dimensions, found %zd", name, MASKPACK_MAX_DIMS, nd);
    mpx_raise_status(MASKPACK_ERR_SHAPE, &e);
    return -1;
}

/* The pending exception replaced by the refusal "name: what (its message)"; -1. */
static int refuse_from(maskpack_status status, const char *name, const char *what) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *msg = ev ? PyObject_Str(ev) : NULL;
    if (!msg) PyErr_Clear();
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    refuse(status, name, "%s: %s (%S)", name, what, msg ? msg : Py_None);
    Py_XDECREF(msg);
    return -1;
}

/* A torch tensor's refusal for its device: "maskpack reads host memory; found a tensor on <device>". */
static int refuse_device(PyObject *x, const char *name) {
    PyObject *dev = attr_str(x, "device");
    refuse(MASKPACK_ERR_UNSUPPORTED, name, "%s: maskpack reads host memory; found a tensor on %U (call .cpu() first)",
           name, dev);
    Py_DECREF(dev);
    return -1;
}

/* x.is_cpu (1 when it cannot be read: the refusal then names torch's reason) */
static int is_cpu(PyObject *x) {
    PyObject *c = PyObject_GetAttrString(x, "is_cpu");
    if (!c) {
        PyErr_Clear();
        return 1;
    }
    int r = c != Py_False;
    Py_DECREF(c);
    return r;
}

/* A torch tensor -> *t. The storage stays alive while the caller holds x; the capsule only borrows it
 * and is released before returning. */
static int read_torch(PyObject *x, const char *name, maskpack_tensor *t) {
    /* DLPack exports a lazily negated view (x.is_neg(), e.g. conj().imag) as its raw memory, which
     * holds -x: refused (the package passes x.resolve_neg() for inputs and refuses such outputs) */
    PyObject *self_arg[1] = {x};
    PyObject *neg = PyObject_VectorcallMethod(s_is_neg, self_arg, 1, NULL);
    if (!neg) return -1;
    int is_neg = neg != Py_False;
    Py_DECREF(neg);
    if (is_neg)
        return refuse(MASKPACK_ERR_UNSUPPORTED, name, "%s: a tensor with the negative bit set (pass %s.resolve_neg())",
                      name, name);
    PyObject *cap = PyObject_CallOneArg(torch_to_dlpack, x);
    if (!cap) { /* on another device (meta...), sparse, conjugated...: named, with torch's reason */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (!is_cpu(x)) {
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            return refuse_device(x, name);
        }
        PyErr_Restore(et, ev, tb);
        return refuse_from(MASKPACK_ERR_UNSUPPORTED, name, "this tensor cannot be read as a strided host tensor");
    }
    int rc = -1;
    const dlpack_managed *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (!mt) goto done;
    const dlpack_tensor *d = &mt->dl_tensor;
    int dt = dlpack_dtype_code(d->dtype);
    if (d->device.device_type != 1) {
        refuse_device(x, name);
        goto done;
    }
    if (dt < 0) {
        PyObject *dts = attr_str(x, "dtype");
        refuse(MASKPACK_ERR_DTYPE, name, "%s: dtype %U is not supported (" DTYPES_EXPECTED ")", name, dts);
        Py_DECREF(dts);
        goto done;
    }
    if (d->ndim > MASKPACK_MAX_DIMS) {
        too_many_dims(name, d->ndim);
        goto done;
    }
    memset(t, 0, sizeof *t);
    int64_t compact = 1;
    for (int i = d->ndim - 1; i >= 0; i--) {
        t->shape[i] = d->shape[i];
        t->strides[i] = d->strides ? d->strides[i] : compact;
        compact *= d->shape[i];
    }
    t->data = (char *)d->data + d->byte_offset;
    t->dtype = (maskpack_dtype)dt;
    t->ndim = d->ndim;
    rc = 0;
done:
    Py_DECREF(cap); /* its destructor calls the producer's deleter: the capsule was not consumed */
    return rc;
}

/* A native-endian buffer of a supported element type (numpy arrays) -> *t. The view is released at
 * once: the memory stays valid while the caller holds x (a numpy array referenced elsewhere cannot
 * be resized), and holding it would pin the array until the call returns for nothing. */
static int read_buffer(PyObject *x, const char *name, int writable, maskpack_tensor *t) {
    Py_buffer view;
    if (PyObject_GetBuffer(x, &view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) < 0) {
        if (writable && PyObject_GetBuffer(x, &view, PyBUF_RECORDS_RO) == 0) { /* readable: read-only */
            PyBuffer_Release(&view);
            PyErr_Clear();
            return refuse(MASKPACK_ERR_INVALID_ARGUMENT, name, "%s: expected a writable array, found a read-only one",
                          name);
        }
        return refuse_from(MASKPACK_ERR_INVALID_ARGUMENT, name, "cannot read this object as a strided buffer");
    }
    const char *f = view.format ? view.format : "B";
    if (*f == '=' || *f == '@' || (*f == '<' && 1 == *(const unsigned char *)&(uint16_t){1})) f++;
    int dt = -1;
    if (f[0] && !f[1]) switch (f[0]) {
        case '?': dt = MASKPACK_BOOL; break;
        case 'B': dt = MASKPACK_U8; break;
        case 'b': dt = MASKPACK_I8; break;
        case 'h': dt = MASKPACK_I16; break;
        case 'i': dt = view.itemsize == 4 ? MASKPACK_I32 : -1; break;
        case 'l':
        case 'q': dt = view.itemsize == 8 ? MASKPACK_I64 : view.itemsize == 4 ? MASKPACK_I32 : -1; break;
        case 'e': dt = MASKPACK_F16; break;
        case 'f': dt = MASKPACK_F32; break;
        case 'd': dt = MASKPACK_F64; break;
        default: break;
        }
    int rc = -1;
    if (dt < 0 || (size_t)view.itemsize != maskpack_dtype_size((maskpack_dtype)dt)) {
        refuse(MASKPACK_ERR_DTYPE, name, "%s: element format '%s' is not supported (" DTYPES_EXPECTED ")", name,
               view.format ? view.format : "B");
        goto done;
    }
    if (view.ndim > MASKPACK_MAX_DIMS) {
        too_many_dims(name, view.ndim);
        goto done;
    }
    memset(t, 0, sizeof *t);
    for (int d = 0; d < view.ndim; d++) {
        if (view.strides[d] % view.itemsize) {
            refuse(MASKPACK_ERR_UNSUPPORTED, name, "%s: a stride that is not a whole number of elements", name);
            goto done;
        }
        t->shape[d] = view.shape[d];
        t->strides[d] = view.strides[d] / view.itemsize;
    }
    t->data = view.buf;
    t->dtype = (maskpack_dtype)dt;
    t->ndim = view.ndim;
    rc = 0;
done:
    PyBuffer_Release(&view);
    return rc;
}

/* how: READ_OUT (the library writes it), READ_TORCH (the kernels: torch tensors only) */
enum { READ_OUT = 1, READ_TORCH = 2 };

static int parse(PyObject *obj, const char *name, int how, maskpack_tensor *t, int *present) {
    memset(t, 0, sizeof *t);
    *present = 0;
    if (obj == Py_None) return 0;
    int rc;
    if (torch_tensor_type && PyObject_TypeCheck(obj, (PyTypeObject *)torch_tensor_type))
        rc = read_torch(obj, name, t);
    else if (how & READ_TORCH)
        rc = refuse(MASKPACK_ERR_INVALID_ARGUMENT, name, "%s: expected a torch tensor, found %.100s", name,
                    Py_TYPE(obj)->tp_name);
    else if (PyObject_CheckBuffer(obj))
        rc = read_buffer(obj, name, how & READ_OUT, t);
    else
        rc = refuse(MASKPACK_ERR_INVALID_ARGUMENT, name, "%s: expected a torch tensor or a numpy array, found %.100s",
                    name, Py_TYPE(obj)->tp_name);
    if (rc == 0) *present = 1;
    return rc;
}

int mpx_parse_tensor(PyObject *obj, const char *name, maskpack_tensor *t, int *present) {
    return parse(obj, name, 0, t, present);
}

int mpx_parse_out_tensor(PyObject *obj, const char *name, maskpack_tensor *t, int *present) {
    return parse(obj, name, READ_OUT, t, present);
}

int mpx_parse_given_out_tensor(PyObject *obj, const char *name, maskpack_tensor *t) {
    int present = 0;
    if (obj == Py_None)
        return refuse(MASKPACK_ERR_NULL_ARGUMENT, name, "%s: expected an array or tensor, found None", name);
    return parse(obj, name, READ_OUT, t, &present);
}

int mpx_parse_torch_tensor(PyObject *obj, const char *name, maskpack_tensor *t, int *present) {
    return parse(obj, name, READ_TORCH, t, present);
}

int mpx_parse_given_tensor(PyObject *obj, const char *name, maskpack_tensor *t) {
    int present = 0;
    if (obj == Py_None)
        return refuse(MASKPACK_ERR_NULL_ARGUMENT, name, "%s: expected an array or tensor, found None", name);
    return mpx_parse_tensor(obj, name, t, &present);
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
    if (!PyArg_ParseTuple(obj, "llLLOO;rule: expected (causal, alignment, left, right, spans, prefix)", &causal, &align,
                          &wl, &wr, &spans, &prefix))
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
    if (sv && rv)
        rc = py_comm_call(c->obj, PyObject_CallMethod(c->obj, method, "OO", sv, rv));
    else
        py_comm_call(c->obj, NULL);
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
