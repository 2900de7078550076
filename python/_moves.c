/*
 * _moves.c: the moves part of maskpack._maskpack: relayout plans (one extension type, RelayoutPlan: a plan
 * is immutable and cached on the source layout by the package), their execution on a worker team
 * (_teams.c), and the label functions (shift_labels, loss_weights). The GIL is released for every copy;
 * the package keeps the tensors alive for the call.
 */
#include "ext_common.h"

#include <stdio.h>
#include <string.h>

/* ---- the relayout plan handle ------------------------------------------------------------------ */

static void RelayoutPlan_dealloc(mpx_HandleObject *self) {
    maskpack_relayout_plan_free(self->ptr);
    self->ptr = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static MPX_HANDLE_TYPE(RelayoutPlanType, "RelayoutPlan", "Opaque handle to an immutable maskpack_relayout_plan.",
                       RelayoutPlan_dealloc);

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

/* (sources: tuple of handles, dst handle) -> relayout plan handle */
static PyObject *py_plan_create(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *srcs, *dst;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &srcs, &mpx_LayoutType, &dst)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(srcs);
    if (n < 1 || n > 4096) {
        PyErr_SetString(PyExc_ValueError, "relayout: expected 1 to 4096 source layouts");
        return NULL;
    }
    const maskpack_layout **L = PyMem_Calloc((size_t)n, sizeof *L);
    if (!L) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *hi = PyTuple_GET_ITEM(srcs, i);
        if (!PyObject_TypeCheck(hi, &mpx_LayoutType)) {
            PyMem_Free(L);
            PyErr_SetString(PyExc_TypeError, "relayout: sources must be layout handles");
            return NULL;
        }
        L[i] = mpx_layout(hi);
    }
    maskpack_relayout_plan *P = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_relayout_plan_create(L, (size_t)n, mpx_layout(dst), &P, &err);
    Py_END_ALLOW_THREADS PyMem_Free(L);
    if (s) return mpx_raise_status(s, &err);
    PyObject *h = mpx_new_handle(&RelayoutPlanType, P, NULL);
    if (!h) maskpack_relayout_plan_free(P);
    return h;
}

/* (plan handle, source index) -> the adjoint plan handle (dst -> that source's grid, fills elsewhere) */
static PyObject *py_plan_adjoint(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *plan;
    Py_ssize_t src;
    if (!PyArg_ParseTuple(args, "On", &plan, &src)) return NULL;
    maskpack_relayout_plan *P = mpx_handle_ptr(plan, &RelayoutPlanType, "plan");
    if (!P) return NULL;
    if (src < 0) {
        PyErr_SetString(PyExc_ValueError, "plan_adjoint: source must be >= 0");
        return NULL;
    }
    maskpack_relayout_plan *A = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_relayout_plan_adjoint(P, (size_t)src, &A, &err);
    if (s) return mpx_raise_status(s, &err);
    PyObject *h = mpx_new_handle(&RelayoutPlanType, A, NULL);
    if (!h) maskpack_relayout_plan_free(A);
    return h;
}

/* (plan handle, xs: tuple of tensors, out, pad: bytes | None, team handle | None)
 * -> None. The GIL is released for the copy; the caller keeps the tensors alive. */
static PyObject *py_plan_execute(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *plan, *xs, *odesc, *pad, *team;
    if (!PyArg_ParseTuple(args, "OO!OOO", &plan, &PyTuple_Type, &xs, &odesc, &pad, &team)) return NULL;
    maskpack_relayout_plan *P = mpx_handle_ptr(plan, &RelayoutPlanType, "plan");
    if (!P) return NULL;
    maskpack_workers *w = NULL;
    if (mpx_parse_team(team, &w) < 0) return NULL;
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
        char name[32] = "x"; /* x[i] of several sources */
        if (n > 1) snprintf(name, sizeof name, "x[%zd]", i);
        if (mpx_parse_given_tensor(PyTuple_GET_ITEM(xs, i), name, &X[i]) < 0) goto done;
        XP[i] = &X[i];
    }
    if (mpx_parse_given_out_tensor(odesc, "out", &o) < 0) goto done;
    if (check_pad(pad, o.dtype) < 0) goto done;
    {
        maskpack_error err;
        maskpack_status s;
        Py_BEGIN_ALLOW_THREADS s = maskpack_relayout_execute_on(P, XP, &o, pad_ptr, w, &err);
        Py_END_ALLOW_THREADS if (s) {
            mpx_raise_status(s, &err);
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

/* The one-tensor move into a given out: (plan, x, out, pad bytes | None, team | None) -> True when done,
 * False when the reader does not take x or out as they are (a list or DLPack producer the package
 * converts, a lazily negated input it resolves, or a refusal: the package's path then reads them again,
 * converted, and the reader's refusal, the one message for that failure, names the argument). It saves
 * that path's allocation and tuple, not a check: the package checks no tensor itself. */
static PyObject *py_move(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "move: expected 5 arguments, found %zd", nargs);
    PyObject *plan = args[0], *x = args[1], *out = args[2], *pad = args[3], *team = args[4];
    maskpack_relayout_plan *P = mpx_handle_ptr(plan, &RelayoutPlanType, "plan");
    if (!P) return NULL;
    maskpack_workers *w = NULL;
    if (mpx_parse_team(team, &w) < 0) return NULL;
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
    Py_BEGIN_ALLOW_THREADS s = maskpack_relayout_execute_on(P, xp, &ot, pad_ptr, w, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_TRUE;
}

/* (handle, labels, ignore_index, out) */
static PyObject *py_shift_labels(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *ld, *od;
    long long ignore;
    if (!PyArg_ParseTuple(args, "O!OLO", &mpx_LayoutType, &h, &ld, &ignore, &od)) return NULL;
    maskpack_tensor l, o;
    if (mpx_parse_given_tensor(ld, "labels", &l) < 0 || mpx_parse_given_out_tensor(od, "out", &o) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_shift_labels(mpx_layout(h), &l, (int64_t)ignore, &o, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* (handle, labels | None, ignore_index, mode, out) -> denominator */
static PyObject *py_loss_weights(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *h, *ld, *od;
    long long ignore;
    int mode;
    if (!PyArg_ParseTuple(args, "O!OLiO", &mpx_LayoutType, &h, &ld, &ignore, &mode, &od)) return NULL;
    maskpack_tensor l, o;
    int has_labels = 0;
    if (mpx_parse_tensor(ld, "labels", &l, &has_labels) < 0 || mpx_parse_given_out_tensor(od, "out", &o) < 0)
        return NULL;
    maskpack_error err;
    maskpack_status s;
    double denom = 0;
    Py_BEGIN_ALLOW_THREADS s = maskpack_loss_weights(mpx_layout(h), has_labels ? &l : NULL, (int64_t)ignore,
                                                     (maskpack_loss_mode)mode, &o, &denom, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    return PyFloat_FromDouble(denom);
}

static PyMethodDef methods[] = {
    {"plan_create", py_plan_create, METH_VARARGS, "(sources, dst) -> relayout plan handle"},
    {"plan_execute", py_plan_execute, METH_VARARGS, "(plan, xs, out, pad, team | None)"},
    {"plan_adjoint", py_plan_adjoint, METH_VARARGS, "(plan, source) -> the adjoint plan handle"},
    {"move", (PyCFunction)(void (*)(void))py_move, METH_FASTCALL,
     "(plan, x, out, pad, team) -> True, or False when x/out need the package's checks"},
    {"shift_labels", py_shift_labels, METH_VARARGS, "(handle, labels, ignore_index, out)"},
    {"loss_weights", py_loss_weights, METH_VARARGS, "(handle, labels, ignore_index, mode, out) -> denominator"},
    {NULL, NULL, 0, NULL},
};

int mpx_init_moves(PyObject *m) {
    if (PyType_Ready(&RelayoutPlanType) < 0) return -1;
    Py_INCREF(&RelayoutPlanType);
    if (PyModule_AddObject(m, "RelayoutPlan", (PyObject *)&RelayoutPlanType) < 0) {
        Py_DECREF(&RelayoutPlanType);
        return -1;
    }
    return PyModule_AddFunctions(m, methods);
}
