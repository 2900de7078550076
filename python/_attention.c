/*
 * _attention.c: the fused CPU attention bindings, the submodule maskpack._maskpack.attention (use
 * maskpack.attention). Thin like the rest of the module: tensors cross as themselves (torch tensors,
 * numpy arrays), read by the module's one reader (ext_common.c) without copying (outputs are
 * allocated by maskpack/attention.py), the layout as its
 * Layout handle (checked by type; the caller keeps the handle and every tensor alive for the call).
 * The GIL is released around the computation. The plain calls get their workspace from the
 * library per call; the operator (op_*) keeps its own between runs and runs on a worker team. Failures raise
 * maskpack.Error with the C library's status, argument, index and message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "maskpack.h"
#include "ext_common.h"

/* (layout, q, k, v, scale, softcap, out, lse | None, n_threads, isa) -> None */
static PyObject *py_forward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *dq, *dk, *dv, *dout, *dlse;
    double scale, softcap;
    int threads, isa;
    if (!PyArg_ParseTuple(args, "OOOOddOOii", &layout, &dq, &dk, &dv, &scale, &softcap, &dout, &dlse, &threads, &isa))
        return NULL;
    const maskpack_layout *L;
    maskpack_tensor q, k, v, out, lse;
    int pq, pk, pv, po, pl;
    if (mpx_parse_layout(layout, &L) < 0 || mpx_parse_tensor(dq, "q", &q, &pq) < 0 ||
        mpx_parse_tensor(dk, "k", &k, &pk) < 0 || mpx_parse_tensor(dv, "v", &v, &pv) < 0 ||
        mpx_parse_out_tensor(dout, "out", &out, &po) < 0 || mpx_parse_out_tensor(dlse, "lse", &lse, &pl) < 0)
        return NULL;
    maskpack_error err;
    maskpack_status s;
    const maskpack_kernel_options ko = {threads, (maskpack_isa)isa};
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_attention_forward(L, pq ? &q : NULL, pk ? &k : NULL, pv ? &v : NULL, scale, softcap, po ? &out : NULL,
                                   pl ? &lse : NULL, &ko, NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (layout, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, n_threads, isa) -> None */
static PyObject *py_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *d[10];
    double scale, softcap;
    int threads, isa;
    if (!PyArg_ParseTuple(args, "OOOOOOOddOOOii", &layout, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &scale, &softcap,
                          &d[6], &d[7], &d[8], &threads, &isa))
        return NULL;
    static const char *names[9] = {"dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv"};
    const maskpack_layout *L;
    maskpack_tensor t[9];
    int present[9];
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    for (int i = 0; i < 9; i++)
        if ((i >= 6 ? mpx_parse_out_tensor : mpx_parse_tensor)(d[i], names[i], &t[i], &present[i]) < 0) return NULL;
    maskpack_tensor *p[9];
    for (int i = 0; i < 9; i++) p[i] = present[i] ? &t[i] : NULL;
    maskpack_error err;
    maskpack_status s;
    const maskpack_kernel_options ko = {threads, (maskpack_isa)isa};
    Py_BEGIN_ALLOW_THREADS s = maskpack_attention_backward(L, p[0], p[1], p[2], p[3], p[4], p[5], scale, softcap, p[6],
                                                           p[7], p[8], &ko, NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* ---- the operator object (one per layout and shapes, kept by maskpack/attention.py) ------------- */

static void Op_dealloc(mpx_HandleObject *self) {
    maskpack_attention_op_free(self->ptr);
    self->ptr = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The op handle: a maskpack_attention_op owned by a Python object of this type. */
static MPX_HANDLE_TYPE(OpType, "AttentionOp", "Opaque handle to a maskpack_attention_op (made by op_create).",
                       Op_dealloc);


/* op_create(layout, hq, hkv, d, dtype_code, n_threads, isa) -> op handle (the kernel: isa; AUTO reads
 * MASKPACK_ISA now). The handle holds no reference to the layout: the caller keeps the op in the layout's
 * own cache, so the op never outlives it. */
static PyObject *py_op_create(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout;
    long long hq, hkv, d;
    int dtype, threads, isa;
    if (!PyArg_ParseTuple(args, "OLLLiii", &layout, &hq, &hkv, &d, &dtype, &threads, &isa)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    maskpack_attention_op *op = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_attention_op_create(
        L, hq, hkv, d, (maskpack_dtype)dtype, &(const maskpack_kernel_options){threads, (maskpack_isa)isa}, &op, &err);
    if (s) return mpx_raise_status(s, &err);
    PyObject *h = mpx_new_handle(&OpType, op, NULL);
    if (!h) maskpack_attention_op_free(op);
    return h;
}

/* op_forward(op, team or None, q, k, v, scale, softcap, out, lse | None) -> None */
static PyObject *py_op_forward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *cap, *team_obj, *d[5];
    double scale, softcap;
    if (!PyArg_ParseTuple(args, "OOOOOddOO", &cap, &team_obj, &d[0], &d[1], &d[2], &scale, &softcap, &d[3], &d[4]))
        return NULL;
    maskpack_attention_op *op = mpx_handle_ptr(cap, &OpType, "op");
    maskpack_workers *team;
    if (!op || mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *names[5] = {"q", "k", "v", "out", "lse"};
    maskpack_tensor t[5], *p[5];
    int present[5];
    for (int i = 0; i < 5; i++) {
        if ((i >= 3 ? mpx_parse_out_tensor : mpx_parse_tensor)(d[i], names[i], &t[i], &present[i]) < 0) return NULL;
        p[i] = present[i] ? &t[i] : NULL;
    }
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_attention_op_forward(op, p[0], p[1], p[2], scale, softcap, p[3], p[4], team, NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* op_backward(op, team or None, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv) -> None */
static PyObject *py_op_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *cap, *team_obj, *d[9];
    double scale, softcap;
    if (!PyArg_ParseTuple(args, "OOOOOOOOddOOO", &cap, &team_obj, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &scale,
                          &softcap, &d[6], &d[7], &d[8]))
        return NULL;
    maskpack_attention_op *op = mpx_handle_ptr(cap, &OpType, "op");
    maskpack_workers *team;
    if (!op || mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *names[9] = {"dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv"};
    maskpack_tensor t[9], *p[9];
    int present[9];
    for (int i = 0; i < 9; i++) {
        if ((i >= 6 ? mpx_parse_out_tensor : mpx_parse_tensor)(d[i], names[i], &t[i], &present[i]) < 0) return NULL;
        p[i] = present[i] ? &t[i] : NULL;
    }
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_attention_op_backward(op, p[0], p[1], p[2], p[3], p[4], p[5], scale, softcap,
                                                              p[6], p[7], p[8], team, NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* ---- ring attention over a Python communicator (mpx_comm, see ext_common.h) ------------------- */

/* (comm_obj, rank, size, layout, scheme, q, k, v, scale, softcap, out, lse, team or None) -> None */
static PyObject *py_cp_forward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *obj, *layout, *d[5], *team_obj;
    int rank, size, scheme;
    double scale, softcap;
    if (!PyArg_ParseTuple(args, "OiiOiOOOddOOO", &obj, &rank, &size, &layout, &scheme, &d[0], &d[1], &d[2], &scale,
                          &softcap, &d[3], &d[4], &team_obj))
        return NULL;
    maskpack_workers *team;
    if (mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *names[5] = {"q", "k", "v", "out", "lse"};
    const maskpack_layout *L;
    maskpack_tensor t[5];
    int present[5];
    mpx_comm pc;
    maskpack_comm comm;
    if (mpx_parse_comm(obj, rank, size, &pc, &comm) < 0 || mpx_parse_layout(layout, &L) < 0) return NULL;
    for (int i = 0; i < 5; i++)
        if ((i >= 3 ? mpx_parse_out_tensor : mpx_parse_tensor)(d[i], names[i], &t[i], &present[i]) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_cp_attention_forward_on(&comm, L, (maskpack_cp_scheme)scheme, present[0] ? &t[0] : NULL,
                                         present[1] ? &t[1] : NULL, present[2] ? &t[2] : NULL, scale, softcap,
                                         present[3] ? &t[3] : NULL, present[4] ? &t[4] : NULL, NULL, team, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (comm_obj, rank, size, layout, scheme, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, team or None)
 * -> None */
static PyObject *py_cp_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *obj, *layout, *d[9], *team_obj;
    int rank, size, scheme;
    double scale, softcap;
    if (!PyArg_ParseTuple(args, "OiiOiOOOOOOddOOOO", &obj, &rank, &size, &layout, &scheme, &d[0], &d[1], &d[2], &d[3],
                          &d[4], &d[5], &scale, &softcap, &d[6], &d[7], &d[8], &team_obj))
        return NULL;
    maskpack_workers *team;
    if (mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *names[9] = {"dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv"};
    const maskpack_layout *L;
    maskpack_tensor t[9];
    int present[9];
    mpx_comm pc;
    maskpack_comm comm;
    if (mpx_parse_comm(obj, rank, size, &pc, &comm) < 0 || mpx_parse_layout(layout, &L) < 0) return NULL;
    for (int i = 0; i < 9; i++)
        if ((i >= 6 ? mpx_parse_out_tensor : mpx_parse_tensor)(d[i], names[i], &t[i], &present[i]) < 0) return NULL;
    maskpack_tensor *p[9];
    for (int i = 0; i < 9; i++) p[i] = present[i] ? &t[i] : NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_cp_attention_backward_on(&comm, L, (maskpack_cp_scheme)scheme, p[0], p[1], p[2], p[3], p[4], p[5],
                                          scale, softcap, p[6], p[7], p[8], NULL, team, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (dtype_code) -> "ref" | "avx2" | "avx512" | "amx": the kernel the next call uses (MASKPACK_ISA honoured). */
static PyObject *py_isa(PyObject *m, PyObject *arg) {
    (void)m;
    long dt = PyLong_AsLong(arg);
    if (dt == -1 && PyErr_Occurred()) return NULL;
    maskpack_isa isa;
    maskpack_error err;
    maskpack_status s =
        maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, (maskpack_dtype)dt, MASKPACK_ISA_AUTO, &isa, &err);
    if (s) return mpx_raise_status(s, &err);
    return PyUnicode_FromString(maskpack_isa_name(isa));
}

static PyMethodDef methods[] = {
    {"forward", py_forward, METH_VARARGS, "(layout, q, k, v, scale, softcap, out, lse, n_threads) -> None"},
    {"backward", py_backward, METH_VARARGS,
     "(layout, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, n_threads) -> None"},
    {"op_create", py_op_create, METH_VARARGS, "(layout, hq, hkv, d, dtype_code, n_threads) -> attention operator"},
    {"op_forward", py_op_forward, METH_VARARGS,
     "(op, team or None, q, k, v, scale, softcap, out, lse) -> None: the forward through an operator"},
    {"op_backward", py_op_backward, METH_VARARGS,
     "(op, team or None, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv) -> None"},
    {"isa", py_isa, METH_O, "(dtype_code) -> name of the kernel the next call uses"},
    {"cp_forward", py_cp_forward, METH_VARARGS,
     "(comm, rank, size, layout, scheme, q, k, v, scale, softcap, out, lse, n_threads) -> None: ring attention"},
    {"cp_backward", py_cp_backward, METH_VARARGS,
     "(comm, rank, size, layout, scheme, dout, q, k, v, out, lse, scale, softcap, dq, dk, dv, n_threads) -> "
     "None"},
    {NULL, NULL, 0, NULL},
};

/* The functions above as the submodule maskpack._maskpack.attention. */
int mpx_init_attention(PyObject *sub) {
    if (PyType_Ready(&OpType) < 0) return -1;
    Py_INCREF(&OpType);
    if (PyModule_AddObject(sub, "Op", (PyObject *)&OpType) < 0) {
        Py_DECREF(&OpType);
        return -1;
    }
    return PyModule_AddFunctions(sub, methods);
}
