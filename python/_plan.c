/*
 * _plan.c: the packing planner bindings, the submodule maskpack._maskpack.plan (use maskpack.plan).
 *
 * Thin, like _maskpack.c: a `Plan` handle type owning a maskpack_plan*, and one function per question
 * asked of it. Lengths arrive as a C-contiguous int64 buffer (the Python layer converts); bulk
 * results leave as bytes objects the Python layer views with numpy, so this file needs neither
 * numpy's C API nor per-element Python objects. A row's or micro-batch's layout is built by the
 * library (maskpack_plan_row_layout) and returned as the module's Layout handle. Failures raise
 * maskpack.Error with the status name, code, argument and index of maskpack_error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "maskpack.h"
#include "ext_common.h"

/* the pieces buffer below relies on this layout */
_Static_assert(sizeof(maskpack_plan_piece) == 4 * sizeof(int64_t), "maskpack_plan_piece is four int64");

/* ---- the Plan handle --------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD maskpack_plan *plan;
} PlanObject;

static void Plan_dealloc(PlanObject *self) {
    maskpack_plan_free(self->plan);
    self->plan = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "maskpack._maskpack.PlanHandle",
    .tp_basicsize = sizeof(PlanObject),
    .tp_itemsize = 0,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Opaque handle to an immutable maskpack_plan (use maskpack.plan instead).",
};

static const maskpack_plan *handle(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "expected a plan handle");
        return NULL;
    }
    return ((PlanObject *)obj)->plan;
}

/* ---- creation -------------------------------------------------------------------------------------- */

/* (lengths: int64 C-contiguous buffer, capacity, dp, micro_batches, cp, tp, align, multiple, objective,
 *  attention_a, algorithm, seed, allow_split, row_width, hidden) -> handle */
static PyObject *py_create(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *lens_obj;
    long long capacity, dp, mb, cp, tp, multiple, hidden;
    int align, objective, algorithm, allow_split, row_width;
    double a;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OLLLLLiLidiKpiL", &lens_obj, &capacity, &dp, &mb, &cp, &tp, &align, &multiple,
                          &objective, &a, &algorithm, &seed, &allow_split, &row_width, &hidden))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(lens_obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    const char *fmt = view.format ? view.format : "";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++;
    if (view.itemsize != 8 || view.ndim > 1 || (strcmp(fmt, "l") != 0 && strcmp(fmt, "q") != 0)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "lengths: expected a 1-D int64 buffer");
        return NULL;
    }
    maskpack_plan_options o = maskpack_plan_options_default(capacity);
    o.dp = dp;
    o.micro_batches = mb;
    o.cp = cp;
    o.tp = tp;
    o.align = (maskpack_cp_align)align;
    o.multiple = multiple;
    o.objective = (maskpack_plan_objective)objective;
    o.attention_a = a;
    o.algorithm = (maskpack_plan_algorithm)algorithm;
    o.seed = (uint64_t)seed;
    o.allow_split = allow_split;
    o.row_width = (maskpack_plan_width)row_width;
    o.hidden = hidden;
    maskpack_plan *p = NULL;
    maskpack_error err;
    maskpack_status s;
    size_t n = (size_t)(view.len / 8);
    Py_BEGIN_ALLOW_THREADS s = maskpack_plan_create((const int64_t *)view.buf, n, &o, &p, &err);
    Py_END_ALLOW_THREADS PyBuffer_Release(&view);
    if (s) return mpx_raise_status(s, &err);
    PlanObject *obj = PyObject_New(PlanObject, &PlanType);
    if (!obj) {
        maskpack_plan_free(p);
        return NULL;
    }
    obj->plan = p;
    return (PyObject *)obj;
}

/* (hidden, intermediate, q_dim, kv_dim, gated, causal) -> a */
static PyObject *py_attention_coefficient(PyObject *m, PyObject *args) {
    (void)m;
    long long h, inter, q, kv;
    int gated, causal;
    if (!PyArg_ParseTuple(args, "LLLLpp", &h, &inter, &q, &kv, &gated, &causal)) return NULL;
    double a = 0;
    maskpack_error err;
    maskpack_status s = maskpack_plan_attention_coefficient(h, inter, q, kv, gated, causal, &a, &err);
    if (s) return mpx_raise_status(s, &err);
    return PyFloat_FromDouble(a);
}

/* ---- bulk results -------------------------------------------------------------------------------- */

/* (plan) -> (pieces: bytes of int64 [n_pieces, 4] = (sequence, offset, length, slot) in row order,
 *            row_begin: bytes of int64 [n_rows + 1]) */
static PyObject *py_pieces(PyObject *m, PyObject *arg) {
    (void)m;
    const maskpack_plan *p = handle(arg);
    if (!p) return NULL;
    int64_t R = maskpack_plan_n_rows(p);
    maskpack_plan_report rep;
    maskpack_error err;
    maskpack_status s = maskpack_plan_get_report(p, &rep, &err);
    if (s) return mpx_raise_status(s, &err);
    PyObject *pb = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)rep.n_pieces * 4 * 8);
    PyObject *rb = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(R + 1) * 8);
    if (!pb || !rb) {
        Py_XDECREF(pb);
        Py_XDECREF(rb);
        return NULL;
    }
    /* maskpack_plan_piece is four int64 fields: rows are copied straight into the bytes object */
    maskpack_plan_piece *pv = (maskpack_plan_piece *)PyBytes_AS_STRING(pb);
    int64_t *rv = (int64_t *)PyBytes_AS_STRING(rb);
    size_t k = 0;
    rv[0] = 0;
    for (int64_t r = 0; r < R; r++) {
        size_t cnt = 0;
        s = maskpack_plan_row(p, r, pv + k, (size_t)rep.n_pieces - k, &cnt, &err);
        if (s) {
            Py_DECREF(pb);
            Py_DECREF(rb);
            return mpx_raise_status(s, &err);
        }
        k += cnt;
        rv[r + 1] = (int64_t)k;
    }
    return Py_BuildValue("NN", pb, rb);
}

/* (plan) -> (row_costs: bytes f64 [n_rows], row_used: bytes int64 [n_rows], rank_costs: bytes f64 [dp],
 *            microbatch_costs: bytes f64 [dp * micro_batches]) */
static PyObject *py_costs(PyObject *m, PyObject *arg) {
    (void)m;
    const maskpack_plan *p = handle(arg);
    if (!p) return NULL;
    maskpack_plan_report rep;
    maskpack_error err;
    maskpack_status s = maskpack_plan_get_report(p, &rep, &err);
    if (s) return mpx_raise_status(s, &err);
    int64_t R = rep.n_rows, dp = R / rep.rows_per_rank, mb = rep.rows_per_rank / rep.rows_per_microbatch;
    PyObject *rc = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)R * 8);
    PyObject *ru = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)R * 8);
    PyObject *kc = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)dp * 8);
    PyObject *mc = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(dp * mb) * 8);
    if (!rc || !ru || !kc || !mc) {
        Py_XDECREF(rc);
        Py_XDECREF(ru);
        Py_XDECREF(kc);
        Py_XDECREF(mc);
        return NULL;
    }
    double *a = (double *)PyBytes_AS_STRING(rc), *b = (double *)PyBytes_AS_STRING(kc),
           *c = (double *)PyBytes_AS_STRING(mc);
    int64_t *u = (int64_t *)PyBytes_AS_STRING(ru);
    for (int64_t r = 0; r < R; r++) {
        a[r] = maskpack_plan_row_cost(p, r);
        u[r] = maskpack_plan_row_used(p, r);
    }
    for (int64_t q = 0; q < dp; q++) {
        b[q] = maskpack_plan_rank_cost(p, q);
        for (int64_t j = 0; j < mb; j++) c[q * mb + j] = maskpack_plan_microbatch_cost(p, q, j);
    }
    return Py_BuildValue("NNNN", rc, ru, kc, mc);
}

#define ADD_I(d, name, v)                                                                                              \
    do {                                                                                                               \
        PyObject *x_ = PyLong_FromLongLong((long long)(v));                                                            \
        if (!x_ || PyDict_SetItemString((d), (name), x_) < 0) goto fail;                                               \
        Py_DECREF(x_);                                                                                                 \
    } while (0)
#define ADD_F(d, name, v)                                                                                              \
    do {                                                                                                               \
        PyObject *x_ = PyFloat_FromDouble((double)(v));                                                                \
        if (!x_ || PyDict_SetItemString((d), (name), x_) < 0) goto fail;                                               \
        Py_DECREF(x_);                                                                                                 \
    } while (0)

/* (plan) -> dict of maskpack_plan_report */
static PyObject *py_report(PyObject *m, PyObject *arg) {
    (void)m;
    const maskpack_plan *p = handle(arg);
    if (!p) return NULL;
    maskpack_plan_report r;
    maskpack_error err;
    maskpack_status s = maskpack_plan_get_report(p, &r, &err);
    if (s) return mpx_raise_status(s, &err);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    ADD_I(d, "n_sequences", r.n_sequences);
    ADD_I(d, "n_pieces", r.n_pieces);
    ADD_I(d, "n_split", r.n_split);
    ADD_I(d, "n_rows", r.n_rows);
    ADD_I(d, "n_packed_rows", r.n_packed_rows);
    ADD_I(d, "n_empty_rows", r.n_empty_rows);
    ADD_I(d, "rows_per_rank", r.rows_per_rank);
    ADD_I(d, "rows_per_microbatch", r.rows_per_microbatch);
    ADD_I(d, "capacity", r.capacity);
    ADD_I(d, "multiple", r.multiple);
    ADD_I(d, "real_tokens", r.real_tokens);
    ADD_I(d, "alignment_padding", r.alignment_padding);
    ADD_I(d, "tail_padding", r.tail_padding);
    ADD_F(d, "fill", r.fill);
    ADD_F(d, "fill_all_rows", r.fill_all_rows);
    ADD_F(d, "attention_a", r.attention_a);
    ADD_F(d, "rank_cost_min", r.rank_cost_min);
    ADD_F(d, "rank_cost_mean", r.rank_cost_mean);
    ADD_F(d, "rank_cost_max", r.rank_cost_max);
    ADD_F(d, "imbalance", r.imbalance);
    ADD_F(d, "microbatch_cost_max", r.microbatch_cost_max);
    ADD_F(d, "microbatch_cost_mean", r.microbatch_cost_mean);
    ADD_F(d, "microbatch_imbalance", r.microbatch_imbalance);
    ADD_F(d, "fill_nonempty_rows", r.fill_nonempty_rows);
    ADD_F(d, "rank_tokens_min", r.rank_tokens_min);
    ADD_F(d, "rank_tokens_mean", r.rank_tokens_mean);
    ADD_F(d, "rank_tokens_max", r.rank_tokens_max);
    ADD_F(d, "token_imbalance", r.token_imbalance);
    ADD_F(d, "rank_attention_mean", r.rank_attention_mean);
    ADD_F(d, "rank_attention_max", r.rank_attention_max);
    ADD_F(d, "attention_imbalance", r.attention_imbalance);
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* ---- layouts -------------------------------------------------------------------------------------- */

/* (plan, row, rule tuple | None) -> Layout handle: the row packed as maskpack_plan_row_layout lays it out */
static PyObject *py_row_layout(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *h, *rule_obj;
    long long row;
    if (!PyArg_ParseTuple(args, "OLO", &h, &row, &rule_obj)) return NULL;
    const maskpack_plan *p = handle(h);
    if (!p) return NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_plan_row_layout(p, row, &rb.rule, &L, &err);
    mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

/* (plan, rank, micro_batch, rule tuple | None) -> Layout handle [rows_per_microbatch, width] */
static PyObject *py_microbatch_layout(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *h, *rule_obj;
    long long rank, mb;
    if (!PyArg_ParseTuple(args, "OLLO", &h, &rank, &mb, &rule_obj)) return NULL;
    const maskpack_plan *p = handle(h);
    if (!p) return NULL;
    mpx_rule_buf rb;
    if (mpx_parse_rule(rule_obj, &rb) < 0) return NULL;
    maskpack_layout *L = NULL;
    maskpack_error err;
    maskpack_status s;
    Py_BEGIN_ALLOW_THREADS s = maskpack_plan_microbatch_layout(p, rank, mb, &rb.rule, &L, &err);
    Py_END_ALLOW_THREADS mpx_rule_buf_free(&rb);
    if (s) return mpx_raise_status(s, &err);
    return mpx_wrap_layout(L);
}

static PyMethodDef methods[] = {
    {"row_layout", py_row_layout, METH_VARARGS, "(handle, row, rule) -> Layout handle of the packed row"},
    {"microbatch_layout", py_microbatch_layout, METH_VARARGS,
     "(handle, rank, micro_batch, rule) -> Layout handle of the micro-batch's rows"},
    {"create", py_create, METH_VARARGS,
     "(lengths int64 buffer, capacity, dp, micro_batches, cp, tp, align, multiple, objective, attention_a, "
     "algorithm, seed, allow_split, row_width, hidden) -> handle"},
    {"attention_coefficient", py_attention_coefficient, METH_VARARGS,
     "(hidden, intermediate, q_dim, kv_dim, gated_mlp, causal) -> a"},
    {"pieces", py_pieces, METH_O, "(handle) -> (pieces bytes int64 [P,4], row_begin bytes int64 [R+1])"},
    {"costs", py_costs, METH_O, "(handle) -> (row_costs f64, row_used int64, rank_costs f64, microbatch_costs f64)"},
    {"report", py_report, METH_O, "(handle) -> dict"},
    {NULL, NULL, 0, NULL},
};

/* The functions above and the PlanHandle type as the submodule maskpack._maskpack.plan. */
int mpx_init_plan(PyObject *sub) {
    if (PyType_Ready(&PlanType) < 0 || PyModule_AddFunctions(sub, methods) < 0) return -1;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(sub, "PlanHandle", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        return -1;
    }
    return 0;
}
