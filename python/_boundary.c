/*
 * _boundary.c: what the boundary itself exposes, beside the library's functions: the version, the status
 * names and the exception raised for them (mpx_raise_status, ext_common.c), the C enum tables in the
 * package's words (enums()), the limits (MAX_THREADS, MAX_DIMS, the NPU operator's), the ISA and dtype
 * names in code order, and the tensor reader's registration of torch and its probe (tensor_info).
 */
#include "ext_common.h"

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

/* (maskpack.Error[, its subclass for refused tensor arguments]) -> None */
static PyObject *py_set_error_type(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *type, *arg_type = NULL;
    if (!PyArg_ParseTuple(args, "O|O", &type, &arg_type)) return NULL;
    for (int i = 0; i < 2; i++) {
        PyObject *t = i ? arg_type : type;
        if (t && (!PyType_Check(t) || !PyType_IsSubtype((PyTypeObject *)t, (PyTypeObject *)PyExc_Exception))) {
            PyErr_SetString(PyExc_TypeError, "expected an exception type");
            return NULL;
        }
    }
    mpx_set_error_type(type, arg_type);
    Py_RETURN_NONE;
}

/* (torch.Tensor, torch.utils.dlpack.to_dlpack) -> None: the one tensor reader (ext_common.c) takes
 * torch tensors from now on. */
static PyObject *py_register_torch(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *tensor, *to_dlpack;
    if (!PyArg_ParseTuple(args, "OO", &tensor, &to_dlpack)) return NULL;
    if (mpx_register_torch(tensor, to_dlpack) < 0) return NULL;
    Py_RETURN_NONE;
}

/* (tensor or array[, name]) -> (dtype code, shape, strides in elements, address): what the one tensor reader
 * makes of an argument (its refusal naming the argument `name`), so that the package asks the reader for a
 * dtype it does not know and tests check the reader's dtype tables against maskpack.h. */
static PyObject *py_tensor_info(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *obj;
    const char *name = "x";
    if (!PyArg_ParseTuple(args, "O|s", &obj, &name)) return NULL;
    maskpack_tensor t;
    if (mpx_parse_given_tensor(obj, name, &t) < 0) return NULL;
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


/* ---- the enum tables --------------------------------------------------------------------------
 * The package's vocabulary for each C enum (the names users pass: placement="right", isa="amx"...), with
 * the values of the header's constants themselves: the package reads these dicts (enums()) and keeps no
 * copy of a C value. Dtype and ISA names are the library's own (maskpack_dtype_name, maskpack_isa_name). */

typedef struct {
    const char *name;
    long value;
} enum_entry;

#define END                                                                                                            \
    { NULL, 0 }
#define CONST(c)                                                                                                       \
    { #c, c } /* a table keyed by the constant's own name */

static const enum_entry placement[] = {
    {"right", MASKPACK_PLACE_RIGHT}, {"left", MASKPACK_PLACE_LEFT}, {"packed", MASKPACK_PLACE_PACKED}, END};
static const enum_entry mask2d_convention[] = {{"keep", MASKPACK_MASK2D_KEEP}, {"doc_id", MASKPACK_MASK2D_DOC_ID}, END};
static const enum_entry mask_convention[] = {
    {"keep", MASKPACK_MASK_KEEP}, {"masked", MASKPACK_MASK_MASKED}, {"additive", MASKPACK_MASK_ADDITIVE}, END};
static const enum_entry cu_form[] = {{"te", MASKPACK_CU_TE}, {"npu", MASKPACK_CU_NPU}, END};
static const enum_entry boundary[] = {{"reset", MASKPACK_BOUNDARY_RESET}, {"step", MASKPACK_BOUNDARY_STEP}, END};
static const enum_entry fill[] = {{"-inf", MASKPACK_FILL_NEG_INF}, {"min", MASKPACK_FILL_DTYPE_MIN}, END};
static const enum_entry alignment[] = {{"top_left", MASKPACK_ALIGN_TOP_LEFT},
                                       {"bottom_right", MASKPACK_ALIGN_BOTTOM_RIGHT},
                                       {"unstated", MASKPACK_ALIGN_UNSTATED},
                                       END};
static const enum_entry npu_layout[] = {{"BSND", MASKPACK_NPU_BSND}, {"BNSD", MASKPACK_NPU_BNSD},
                                        {"BSH", MASKPACK_NPU_BSH},   {"SBH", MASKPACK_NPU_SBH},
                                        {"TND", MASKPACK_NPU_TND},   END};
static const enum_entry npu_mask_kind[] = {{"none", MASKPACK_NPU_MASK_NONE},
                                           {"compressed", MASKPACK_NPU_MASK_COMPRESSED},
                                           {"prefix_compressed", MASKPACK_NPU_MASK_PREFIX_COMPRESSED},
                                           {"full", MASKPACK_NPU_MASK_FULL},
                                           END};
static const enum_entry npu_finding[] = {CONST(MASKPACK_NPU_BAD_LAYOUT),
                                         CONST(MASKPACK_NPU_BAD_MASK_SHAPE),
                                         CONST(MASKPACK_NPU_BAD_MASK_DTYPE),
                                         CONST(MASKPACK_NPU_CAUSAL_WITHOUT_MASK),
                                         CONST(MASKPACK_NPU_DENSE_FOR_COMPRESSED),
                                         CONST(MASKPACK_NPU_LEADING_ZERO),
                                         CONST(MASKPACK_NPU_NOT_CUMULATIVE),
                                         CONST(MASKPACK_NPU_TOO_MANY_ITEMS),
                                         CONST(MASKPACK_NPU_FULLY_MASKED_ROW),
                                         CONST(MASKPACK_NPU_PRE_NEXT_MISMATCH),
                                         CONST(MASKPACK_NPU_BAD_HEADS),
                                         CONST(MASKPACK_NPU_SCALE_DEFAULT),
                                         CONST(MASKPACK_NPU_BAD_SPARSE_MODE),
                                         CONST(MASKPACK_NPU_MASK_MISMATCH),
                                         END};
static const enum_entry cp_scheme[] = {{"zigzag", MASKPACK_CP_ZIGZAG}, {"contiguous", MASKPACK_CP_CONTIGUOUS}, END};
static const enum_entry cp_align[] = {{"verl", MASKPACK_CP_ALIGN_VERL}, {"minimal", MASKPACK_CP_ALIGN_MINIMAL}, END};
static const enum_entry loss_mode[] = {{"token", MASKPACK_LOSS_TOKEN}, {"sequence", MASKPACK_LOSS_SEQUENCE}, END};
static const enum_entry plan_objective[] = {
    {"tokens", MASKPACK_PLAN_TOKENS}, {"attention", MASKPACK_PLAN_ATTENTION}, END};
static const enum_entry plan_algorithm[] = {
    {"bfd", MASKPACK_PLAN_BFD}, {"ffd", MASKPACK_PLAN_FFD}, {"nextfit", MASKPACK_PLAN_NEXTFIT}, END};
static const enum_entry plan_row_width[] = {
    {"capacity", MASKPACK_PLAN_WIDTH_CAPACITY}, {"used", MASKPACK_PLAN_WIDTH_USED}, END};

static const struct {
    const char *name;
    const enum_entry *entries;
} TABLES[] = {
    {"placement", placement},
    {"mask2d_convention", mask2d_convention},
    {"mask_convention", mask_convention},
    {"cu_form", cu_form},
    {"boundary", boundary},
    {"fill", fill},
    {"alignment", alignment},
    {"npu_layout", npu_layout},
    {"npu_mask_kind", npu_mask_kind},
    {"npu_finding", npu_finding},
    {"cp_scheme", cp_scheme},
    {"cp_align", cp_align},
    {"loss_mode", loss_mode},
    {"plan_objective", plan_objective},
    {"plan_algorithm", plan_algorithm},
    {"plan_row_width", plan_row_width},
};

/* name -> value of count codes named by fn (the library's own names: dtypes, ISAs) */
static int add_named(PyObject *d, int count, const char *(*fn)(int)) {
    for (int i = 0; i < count; i++) {
        PyObject *v = PyLong_FromLong(i);
        int rc = v ? PyDict_SetItemString(d, fn(i), v) : -1;
        Py_XDECREF(v);
        if (rc < 0) return -1;
    }
    return 0;
}

static const char *dtype_name(int i) { return maskpack_dtype_name((maskpack_dtype)i); }
static const char *isa_name(int i) { return maskpack_isa_name((maskpack_isa)i); }
static const char *status_name(int i) { return maskpack_status_name((maskpack_status)i); }

/* () -> {table: {name: value}}: a new dict of new dicts each call (the package reads it once). */
static PyObject *py_enums(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
    PyObject *all = PyDict_New();
    if (!all) return NULL;
    for (size_t t = 0; t < sizeof TABLES / sizeof TABLES[0] + 3; t++) {
        PyObject *d = PyDict_New();
        int rc = d ? 0 : -1;
        const char *name;
        if (t < sizeof TABLES / sizeof TABLES[0]) {
            name = TABLES[t].name;
            for (const enum_entry *e = TABLES[t].entries; rc == 0 && e->name; e++) {
                PyObject *v = PyLong_FromLong(e->value);
                rc = v ? PyDict_SetItemString(d, e->name, v) : -1;
                Py_XDECREF(v);
            }
        } else {
            size_t k = t - sizeof TABLES / sizeof TABLES[0];
            name = k == 0 ? "dtype" : k == 1 ? "isa" : "status";
            if (rc == 0)
                rc = k == 0   ? add_named(d, MASKPACK_DTYPE_COUNT_, dtype_name)
                     : k == 1 ? add_named(d, MASKPACK_ISA_COUNT_, isa_name)
                              : add_named(d, MASKPACK_STATUS_COUNT_, status_name);
        }
        if (rc == 0) rc = PyDict_SetItemString(all, name, d);
        Py_XDECREF(d);
        if (rc < 0) {
            Py_DECREF(all);
            return NULL;
        }
    }
    return all;
}

static PyMethodDef methods[] = {
    {"enums", py_enums, METH_NOARGS, "() -> {table: {name: C value}}: the header's enums in the package's words"},
    {"version", py_version, METH_NOARGS, "() -> library version string"},
    {"version_number", py_version_number, METH_NOARGS, "() -> MAJOR*10000 + MINOR*100 + PATCH"},
    {"status_names", py_status_names, METH_NOARGS, "() -> status names indexed by code"},
    {"status_message", py_status_message, METH_O, "(code) -> generic description"},
    {"_set_error_type", py_set_error_type, METH_VARARGS,
     "(type[, argument_type]) -> None: the exceptions raised on failures and on refused tensor arguments"},
    {"register_torch", py_register_torch, METH_VARARGS, "(torch.Tensor, torch.utils.dlpack.to_dlpack) -> None"},
    {"tensor_info", py_tensor_info, METH_VARARGS,
     "(tensor or array[, name]) -> (dtype code, shape, strides, address) as read"},
    {NULL, NULL, 0, NULL},
};

/* (names of codes 0..count-1) -> a new tuple */
static PyObject *names_tuple(int count, const char *(*fn)(int)) {
    PyObject *t = PyTuple_New(count);
    if (!t) return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *s = PyUnicode_FromString(fn(i));
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

int mpx_init_boundary(PyObject *m) {
    if (PyModule_AddFunctions(m, methods) < 0 ||
        PyModule_AddIntConstant(m, "NPU_MAX_ITEMS", MASKPACK_NPU_MAX_ITEMS) < 0 ||
        PyModule_AddIntConstant(m, "NPU_MAX_FINDINGS", MASKPACK_NPU_MAX_FINDINGS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DIMS", MASKPACK_MAX_DIMS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_THREADS", MASKPACK_MAX_THREADS) < 0)
        return -1;
    PyObject *isa = names_tuple(MASKPACK_ISA_COUNT_, isa_name);
    if (!isa || PyModule_AddObject(m, "ISA_NAMES", isa) < 0) {
        Py_XDECREF(isa);
        return -1;
    }
    PyObject *dt = names_tuple(MASKPACK_DTYPE_COUNT_, dtype_name);
    if (!dt || PyModule_AddObject(m, "DTYPE_NAMES", dt) < 0) {
        Py_XDECREF(dt);
        return -1;
    }
    return 0;
}
