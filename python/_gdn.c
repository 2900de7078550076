/*
 * _gdn.c: the Gated DeltaNet bindings, the submodule maskpack._maskpack.gdn (use maskpack.gdn).
 *
 * Thin like the rest of the module: torch tensors cross as themselves, read by the module's one
 * reader (ext_common.c) without copying (outputs are allocated by maskpack/gdn.py), and
 * the layout as its Layout handle (checked by type; the caller's reference keeps it alive for the
 * call). The GIL is released around every computation. Failures raise maskpack.Error with the C
 * library's status, argument, index and message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "maskpack.h"
#include "ext_common.h"

/* Reads the n tensors of the tuple `descs` into ts[i] (NULL pointer in ptrs[i] when None). */
static int parse_many(PyObject *descs, const char *const *names, int n, maskpack_tensor *ts, maskpack_tensor **ptrs) {
    if (!PyTuple_Check(descs) || PyTuple_GET_SIZE(descs) != n) {
        PyErr_Format(PyExc_TypeError, "expected a tuple of %d tensors (or None)", n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int present;
        if (mpx_parse_torch_tensor(PyTuple_GET_ITEM(descs, i), names[i], &ts[i], &present) < 0) return -1;
        ptrs[i] = present ? &ts[i] : NULL;
    }
    return 0;
}

/* ---- the rule ------------------------------------------------------------------------------- */

/* forward(layout, (q, k, v, g, beta, h0, o, ht), scale, chunked, l2norm, n_threads, isa[, check_gate = True]) */
static PyObject *py_forward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    double scale;
    int chunked, l2norm, threads, isa, check_gate = 1;
    if (!PyArg_ParseTuple(args, "OO!dppii|p", &layout, &PyTuple_Type, &descs, &scale, &chunked, &l2norm, &threads, &isa,
                          &check_gate))
        return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[8] = {"q", "k", "v", "g", "beta", "initial_state", "o", "final_state"};
    maskpack_tensor ts[8], *p[8];
    if (parse_many(descs, names, 8, ts, p) < 0) return NULL;
    maskpack_gdn_inputs in = {p[0], p[1], p[2], p[3], p[4], p[5]};
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.scale = scale;
    o.chunked = chunked;
    o.l2norm = l2norm;
    o.n_threads = threads;
    o.isa = (maskpack_isa)isa;
    o.skip_gate_check = !check_gate;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_forward(L, &in, &o, p[6], p[7], NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* backward(layout, (q, k, v, g, beta, h0, do, dht, dq, dk, dv, dg, dbeta, dh0), scale, l2norm, n_threads, isa[,
 * check_gate = True]) */
static PyObject *py_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    double scale;
    int l2norm, threads, isa, check_gate = 1;
    if (!PyArg_ParseTuple(args, "OO!dpii|p", &layout, &PyTuple_Type, &descs, &scale, &l2norm, &threads, &isa,
                          &check_gate))
        return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[14] = {"q",  "k",  "v",  "g",  "beta",  "initial_state",  "d_o", "d_final_state",
                                          "dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
    maskpack_tensor ts[14], *p[14];
    if (parse_many(descs, names, 14, ts, p) < 0) return NULL;
    maskpack_gdn_inputs in = {p[0], p[1], p[2], p[3], p[4], p[5]};
    maskpack_gdn_grads gr = {p[8], p[9], p[10], p[11], p[12], p[13]};
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.scale = scale;
    o.l2norm = l2norm;
    o.n_threads = threads;
    o.isa = (maskpack_isa)isa;
    o.skip_gate_check = !check_gate;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_backward(L, &in, p[6], p[7], &o, &gr, NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* ---- sequence-parallel context parallelism over a Python communicator (mpx_comm) ------------- */

/* cp_forward(comm, rank, size, layout, scheme, (q, k, v, g, beta, h0, o, ht), scale, chunked, l2norm, team or
 * None) */
static PyObject *py_cp_forward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *obj, *layout, *descs, *team_obj;
    int rank, size, scheme, chunked, l2norm;
    double scale;
    maskpack_workers *team;
    if (!PyArg_ParseTuple(args, "OiiOiO!dppO", &obj, &rank, &size, &layout, &scheme, &PyTuple_Type, &descs, &scale,
                          &chunked, &l2norm, &team_obj) ||
        mpx_parse_team(team_obj, &team) < 0)
        return NULL;
    const maskpack_layout *L;
    mpx_comm pc;
    maskpack_comm comm;
    if (mpx_parse_comm(obj, rank, size, &pc, &comm) < 0 || mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[8] = {"q", "k", "v", "g", "beta", "initial_state", "o", "final_state"};
    maskpack_tensor ts[8], *p[8];
    if (parse_many(descs, names, 8, ts, p) < 0) return NULL;
    maskpack_gdn_inputs in = {p[0], p[1], p[2], p[3], p[4], p[5]};
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.scale = scale;
    o.chunked = chunked;
    o.l2norm = l2norm;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_cp_gdn_forward_on(&comm, L, (maskpack_cp_scheme)scheme, &in, &o, p[6], p[7], team, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* cp_backward(comm, rank, size, layout, scheme, (q, k, v, g, beta, h0, do, dht, dq, dk, dv, dg, dbeta, dh0), scale,
 * l2norm, team or None) */
static PyObject *py_cp_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *obj, *layout, *descs, *team_obj;
    int rank, size, scheme, l2norm;
    double scale;
    maskpack_workers *team;
    if (!PyArg_ParseTuple(args, "OiiOiO!dpO", &obj, &rank, &size, &layout, &scheme, &PyTuple_Type, &descs, &scale,
                          &l2norm, &team_obj) ||
        mpx_parse_team(team_obj, &team) < 0)
        return NULL;
    const maskpack_layout *L;
    mpx_comm pc;
    maskpack_comm comm;
    if (mpx_parse_comm(obj, rank, size, &pc, &comm) < 0 || mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[14] = {"q",  "k",  "v",  "g",  "beta",  "initial_state",  "d_o", "d_final_state",
                                          "dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
    maskpack_tensor ts[14], *p[14];
    if (parse_many(descs, names, 14, ts, p) < 0) return NULL;
    maskpack_gdn_inputs in = {p[0], p[1], p[2], p[3], p[4], p[5]};
    maskpack_gdn_grads gr = {p[8], p[9], p[10], p[11], p[12], p[13]};
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.scale = scale;
    o.l2norm = l2norm;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_cp_gdn_backward_on(&comm, L, (maskpack_cp_scheme)scheme, &in, p[6], p[7], &o, &gr, team, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* cp_conv1d(comm, rank, size, layout, scheme, (x, weight, prefix, y, state), silu, team or None) */
static PyObject *py_cp_conv1d(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *obj, *layout, *descs, *team_obj;
    int rank, size, scheme, silu;
    maskpack_workers *team;
    if (!PyArg_ParseTuple(args, "OiiOiO!pO", &obj, &rank, &size, &layout, &scheme, &PyTuple_Type, &descs, &silu,
                          &team_obj) ||
        mpx_parse_team(team_obj, &team) < 0)
        return NULL;
    const maskpack_layout *L;
    mpx_comm pc;
    maskpack_comm comm;
    if (mpx_parse_comm(obj, rank, size, &pc, &comm) < 0 || mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[5] = {"x", "weight", "prefix", "y", "conv_state"};
    maskpack_tensor ts[5], *p[5];
    if (parse_many(descs, names, 5, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_cp_causal_conv1d_on(&comm, L, (maskpack_cp_scheme)scheme, p[0], p[1], p[2],
                                                            silu, NULL, team, p[3], p[4], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* cp_conv1d_backward(comm, rank, size, layout, scheme, (x, weight, prefix, dy, dstate, dx, dweight, dprefix), silu,
 * team or None) */
static PyObject *py_cp_conv1d_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *obj, *layout, *descs, *team_obj;
    int rank, size, scheme, silu;
    maskpack_workers *team;
    if (!PyArg_ParseTuple(args, "OiiOiO!pO", &obj, &rank, &size, &layout, &scheme, &PyTuple_Type, &descs, &silu,
                          &team_obj) ||
        mpx_parse_team(team_obj, &team) < 0)
        return NULL;
    const maskpack_layout *L;
    mpx_comm pc;
    maskpack_comm comm;
    if (mpx_parse_comm(obj, rank, size, &pc, &comm) < 0 || mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[8] = {"x", "weight", "prefix", "dy", "d_conv_state", "dx", "dweight", "d_prefix"};
    maskpack_tensor ts[8], *p[8];
    if (parse_many(descs, names, 8, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_cp_causal_conv1d_backward_on(
        &comm, L, (maskpack_cp_scheme)scheme, p[0], p[1], p[2], silu, p[3], p[4], NULL, team, p[5], p[6], p[7], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* workspace_size(layout, (q, k, v, g, beta, h0), chunked, backward, n_threads) -> bytes */
static PyObject *py_workspace_size(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    int chunked, backward, threads;
    if (!PyArg_ParseTuple(args, "OO!ppi", &layout, &PyTuple_Type, &descs, &chunked, &backward, &threads)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[6] = {"q", "k", "v", "g", "beta", "initial_state"};
    maskpack_tensor ts[6], *p[6];
    if (parse_many(descs, names, 6, ts, p) < 0) return NULL;
    maskpack_gdn_inputs in = {p[0], p[1], p[2], p[3], p[4], p[5]};
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.chunked = chunked;
    o.n_threads = threads;
    size_t bytes = 0;
    maskpack_error err;
    maskpack_status s = maskpack_gdn_workspace_size(L, &in, &o, backward, &bytes, &err);
    if (s) return mpx_raise_status(s, &err);
    return PyLong_FromSize_t(bytes);
}

/* ---- the operator object (one per layout and shapes, kept by maskpack/gdn.py) ------------------ */

static void Op_dealloc(mpx_HandleObject *self) {
    maskpack_gdn_op_free(self->ptr);
    self->ptr = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The op handle: a maskpack_gdn_op owned by a Python object of this type. */
static MPX_HANDLE_TYPE(OpType, "GdnOp", "Opaque handle to a maskpack_gdn_op (made by op_create).", Op_dealloc);


/* op_create(layout, H, HV, K, V, scale, chunked, l2norm, n_threads, isa[, check_gate = True]) -> op handle.
 * The handle holds no reference to the layout: the caller keeps the op in the layout's own cache, so
 * the op never outlives it. */
static PyObject *py_op_create(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *addr;
    long long H, HV, K, V;
    double scale;
    int chunked, l2norm, threads, isa, check_gate = 1;
    if (!PyArg_ParseTuple(args, "OLLLLdppii|p", &addr, &H, &HV, &K, &V, &scale, &chunked, &l2norm, &threads, &isa,
                          &check_gate))
        return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(addr, &L) < 0) return NULL;
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.scale = scale;
    o.chunked = chunked;
    o.l2norm = l2norm;
    o.n_threads = threads;
    o.isa = (maskpack_isa)isa;
    o.skip_gate_check = !check_gate;
    maskpack_gdn_op *op = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_gdn_op_create(L, H, HV, K, V, &o, &op, &err);
    if (s) return mpx_raise_status(s, &err);
    PyObject *h = mpx_new_handle(&OpType, op, NULL);
    if (!h) maskpack_gdn_op_free(op);
    return h;
}

/* op_forward(op, team or None, (q, k, v, g, beta, h0, o, ht)) */
static PyObject *py_op_forward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *cap, *team_obj, *descs;
    if (!PyArg_ParseTuple(args, "OOO!", &cap, &team_obj, &PyTuple_Type, &descs)) return NULL;
    maskpack_gdn_op *op = mpx_handle_ptr(cap, &OpType, "op");
    maskpack_workers *team;
    if (!op || mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *const names[8] = {"q", "k", "v", "g", "beta", "initial_state", "o", "final_state"};
    maskpack_tensor ts[8], *p[8];
    if (parse_many(descs, names, 8, ts, p) < 0) return NULL;
    maskpack_gdn_inputs in = {p[0], p[1], p[2], p[3], p[4], p[5]};
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_op_forward(op, &in, p[6], p[7], team, NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* op_backward(op, team or None, (q, k, v, g, beta, h0, do, dht, dq, dk, dv, dg, dbeta, dh0)) */
static PyObject *py_op_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *cap, *team_obj, *descs;
    if (!PyArg_ParseTuple(args, "OOO!", &cap, &team_obj, &PyTuple_Type, &descs)) return NULL;
    maskpack_gdn_op *op = mpx_handle_ptr(cap, &OpType, "op");
    maskpack_workers *team;
    if (!op || mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *const names[14] = {"q",  "k",  "v",  "g",  "beta",  "initial_state",  "d_o", "d_final_state",
                                          "dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
    maskpack_tensor ts[14], *p[14];
    if (parse_many(descs, names, 14, ts, p) < 0) return NULL;
    maskpack_gdn_inputs in = {p[0], p[1], p[2], p[3], p[4], p[5]};
    maskpack_gdn_grads gr = {p[8], p[9], p[10], p[11], p[12], p[13]};
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_op_backward(op, &in, p[6], p[7], &gr, team, NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* ---- conv, l2norm, gates --------------------------------------------------------------------- */

/* conv1d(layout, (x, weight, prefix, y, state), silu, n_threads) */
static PyObject *py_conv1d(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    int silu, threads;
    if (!PyArg_ParseTuple(args, "OO!pi", &layout, &PyTuple_Type, &descs, &silu, &threads)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[5] = {"x", "weight", "prefix", "y", "conv_state"};
    maskpack_tensor ts[5], *p[5];
    if (parse_many(descs, names, 5, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    const maskpack_kernel_options ko = {threads, MASKPACK_ISA_AUTO};
    Py_BEGIN_ALLOW_THREADS s = maskpack_causal_conv1d(L, p[0], p[1], p[2], silu, &ko, p[3], p[4], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* conv1d_backward(layout, (x, weight, prefix, dy, dstate, dx, dweight, dprefix), silu, n_threads) */
static PyObject *py_conv1d_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    int silu, threads;
    if (!PyArg_ParseTuple(args, "OO!pi", &layout, &PyTuple_Type, &descs, &silu, &threads)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[8] = {"x", "weight", "prefix", "dy", "d_conv_state", "dx", "dweight", "d_prefix"};
    maskpack_tensor ts[8], *p[8];
    if (parse_many(descs, names, 8, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    const maskpack_kernel_options ko = {threads, MASKPACK_ISA_AUTO};
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_causal_conv1d_backward(L, p[0], p[1], p[2], silu, p[3], p[4], &ko, p[5], p[6], p[7], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* conv1d_on(layout, (x, weight, prefix, y, state), silu, team or None, isa): on the process's team */
static PyObject *py_conv1d_on(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *addr, *descs, *team_obj;
    int silu, isa;
    if (!PyArg_ParseTuple(args, "OO!pOi", &addr, &PyTuple_Type, &descs, &silu, &team_obj, &isa)) return NULL;
    const maskpack_layout *L;
    maskpack_workers *team;
    if (mpx_parse_layout(addr, &L) < 0 || mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *const names[5] = {"x", "weight", "prefix", "y", "conv_state"};
    maskpack_tensor ts[5], *p[5];
    if (parse_many(descs, names, 5, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    const maskpack_kernel_options ko = {1, (maskpack_isa)isa};
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_causal_conv1d_on(L, p[0], p[1], p[2], silu, &ko, team, p[3], p[4], NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* conv1d_backward_on(layout, (x, weight, prefix, dy, dstate, dx, dweight, dprefix), silu, team or None, isa) */
static PyObject *py_conv1d_backward_on(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *addr, *descs, *team_obj;
    int silu, isa;
    if (!PyArg_ParseTuple(args, "OO!pOi", &addr, &PyTuple_Type, &descs, &silu, &team_obj, &isa)) return NULL;
    const maskpack_layout *L;
    maskpack_workers *team;
    if (mpx_parse_layout(addr, &L) < 0 || mpx_parse_team(team_obj, &team) < 0) return NULL;
    static const char *const names[8] = {"x", "weight", "prefix", "dy", "d_conv_state", "dx", "dweight", "d_prefix"};
    maskpack_tensor ts[8], *p[8];
    if (parse_many(descs, names, 8, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    const maskpack_kernel_options ko = {1, (maskpack_isa)isa};
    Py_BEGIN_ALLOW_THREADS s = maskpack_causal_conv1d_backward_on(L, p[0], p[1], p[2], silu, p[3], p[4], &ko, team,
                                                                  p[5], p[6], p[7], NULL, 0, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* l2norm(layout, (x, y), eps) */
static PyObject *py_l2norm(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    double eps;
    if (!PyArg_ParseTuple(args, "OO!d", &layout, &PyTuple_Type, &descs, &eps)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[2] = {"x", "y"};
    maskpack_tensor ts[2], *p[2];
    if (parse_many(descs, names, 2, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_l2norm(L, p[0], eps, p[1], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* l2norm_backward(layout, (x, dy, dx), eps) */
static PyObject *py_l2norm_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    double eps;
    if (!PyArg_ParseTuple(args, "OO!d", &layout, &PyTuple_Type, &descs, &eps)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[3] = {"x", "dy", "dx"};
    maskpack_tensor ts[3], *p[3];
    if (parse_many(descs, names, 3, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_l2norm_backward(L, p[0], p[1], eps, p[2], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* gates(layout, (a, b, A_log, dt_bias, g, beta)) */
static PyObject *py_gates(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    if (!PyArg_ParseTuple(args, "OO!", &layout, &PyTuple_Type, &descs)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[6] = {"a", "b", "A_log", "dt_bias", "g", "beta"};
    maskpack_tensor ts[6], *p[6];
    if (parse_many(descs, names, 6, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_gates(L, p[0], p[1], p[2], p[3], p[4], p[5], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* gates_backward(layout, (a, b, A_log, dt_bias, dg, dbeta, da, db, dA_log, ddt_bias)) */
static PyObject *py_gates_backward(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *descs;
    if (!PyArg_ParseTuple(args, "OO!", &layout, &PyTuple_Type, &descs)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    static const char *const names[10] = {"a",     "b",  "A_log", "dt_bias", "dg",
                                          "dbeta", "da", "db",    "dA_log",  "ddt_bias"};
    maskpack_tensor ts[10], *p[10];
    if (parse_many(descs, names, 10, ts, p) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s =
        maskpack_gdn_gates_backward(L, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

/* resolve_isa([dtype_code]) -> "ref" | "avx2" | "avx512" | ...: the kernel AUTO (and MASKPACK_ISA) selects for that input dtype (default float32) */
/* check_gate(layout, g): maskpack_gdn_check_gate (for callers that check before a collective) */
static PyObject *py_check_gate(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *layout, *gobj;
    if (!PyArg_ParseTuple(args, "OO", &layout, &gobj)) return NULL;
    const maskpack_layout *L;
    if (mpx_parse_layout(layout, &L) < 0) return NULL;
    maskpack_tensor g;
    int present;
    if (mpx_parse_torch_tensor(gobj, "g", &g, &present) < 0) return NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_gdn_check_gate(L, present ? &g : NULL, &err);
    Py_END_ALLOW_THREADS if (s) return mpx_raise_status(s, &err);
    Py_RETURN_NONE;
}

static PyObject *py_resolve_isa(PyObject *m, PyObject *args) {
    (void)m;
    long dt = MASKPACK_F32;
    if (!PyArg_ParseTuple(args, "|l", &dt)) return NULL;
    maskpack_isa isa;
    maskpack_error err;
    maskpack_status s = maskpack_isa_resolve(MASKPACK_KERNEL_GDN, (maskpack_dtype)dt, MASKPACK_ISA_AUTO, &isa, &err);
    if (s) return mpx_raise_status(s, &err);
    return PyUnicode_FromString(maskpack_isa_name(isa));
}

static PyMethodDef methods[] = {
    {"forward", py_forward, METH_VARARGS, "gated delta rule forward (use maskpack.gated_delta_rule)"},
    {"backward", py_backward, METH_VARARGS, "gated delta rule backward"},
    {"cp_forward", py_cp_forward, METH_VARARGS, "sequence-parallel gated delta rule forward (maskpack_cp_gdn_forward)"},
    {"cp_backward", py_cp_backward, METH_VARARGS, "sequence-parallel gated delta rule backward"},
    {"cp_conv1d", py_cp_conv1d, METH_VARARGS, "sequence-parallel causal conv1d (maskpack_cp_causal_conv1d)"},
    {"cp_conv1d_backward", py_cp_conv1d_backward, METH_VARARGS, "sequence-parallel causal conv1d backward"},
    {"workspace_size", py_workspace_size, METH_VARARGS, "bytes of workspace a call needs"},
    {"op_create", py_op_create, METH_VARARGS,
     "(layout, H, HV, K, V, scale, chunked, l2norm, threads, isa[, check_gate]) -> rule operator"},
    {"check_gate", py_check_gate, METH_VARARGS, "(layout, g): refuses a real token's g that is not finite and <= 0"},
    {"op_forward", py_op_forward, METH_VARARGS, "(op, team or None, tensors): the rule forward through an operator"},
    {"op_backward", py_op_backward, METH_VARARGS, "(op, team or None, tensors): the rule backward"},
    {"conv1d", py_conv1d, METH_VARARGS, "causal depthwise conv1d over a layout (use maskpack.causal_conv1d)"},
    {"conv1d_backward", py_conv1d_backward, METH_VARARGS, "causal conv1d backward"},
    {"conv1d_on", py_conv1d_on, METH_VARARGS, "causal conv1d on a worker team (or None: the caller)"},
    {"conv1d_backward_on", py_conv1d_backward_on, METH_VARARGS, "causal conv1d backward on a worker team"},
    {"l2norm", py_l2norm, METH_VARARGS, "L2 normalisation over the last dim"},
    {"l2norm_backward", py_l2norm_backward, METH_VARARGS, "L2 normalisation backward"},
    {"gates", py_gates, METH_VARARGS, "g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)"},
    {"gates_backward", py_gates_backward, METH_VARARGS, "gates backward"},
    {"resolve_isa", py_resolve_isa, METH_VARARGS, "([dtype_code]) -> the kernel the rule runs for that dtype"},
    {NULL, NULL, 0, NULL},
};

/* The functions above as the submodule maskpack._maskpack.gdn. */
int mpx_init_gdn(PyObject *sub) {
    if (PyType_Ready(&OpType) < 0) return -1;
    Py_INCREF(&OpType);
    if (PyModule_AddObject(sub, "Op", (PyObject *)&OpType) < 0) {
        Py_DECREF(&OpType);
        return -1;
    }
    return PyModule_AddFunctions(sub, methods);
}
