/*
 * _maskpack.c: the entry point of the CPython extension behind the `maskpack` package. The module is built
 * by concern, each file adding its functions and types to it:
 *
 *   ext_common.c   what the files share: the Layout handle type and the other handles' one shape, the one
 *                  maskpack_error -> maskpack.Error path, the one tensor reader (torch tensors through
 *                  DLPack, numpy arrays through the buffer protocol), the rule reader, the communicator
 *   _boundary.c    version, status names, the error type, the enum tables, the limits and ISA names
 *   _layout.c      layouts: constructors, queries, derived outputs and derived layouts
 *   _moves.c       relayout plans and their execution, labels
 *   _teams.c       worker teams (maskpack's own threads, or hosted by the process's OpenMP pool)
 *   _plan.c, _gdn.c, _attention.c   the planner and kernel bindings, as the submodules plan, gdn, attention
 *
 * Deliberately thin: every handle is an extension type owning its C object (freed in dealloc), and tensors
 * cross as themselves, read without copying; outputs are allocated on the Python side, so the module never
 * owns array memory and never needs numpy's or torch's C API. Every non-OK status raises maskpack.Error
 * (registered by the package at import through _set_error_type) with the status name, code, argument and
 * index from maskpack_error.
 */
#include "ext_common.h"

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, .m_name = "_maskpack",
    .m_doc = "Low-level binding of libmaskpack (use the maskpack package).",
    .m_size = 0, /* no per-module state: the registered torch and error types live in ext_common.c */
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
    if (PyType_Ready(&mpx_LayoutType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&mpx_LayoutType);
    if (PyModule_AddObject(m, "Layout", (PyObject *)&mpx_LayoutType) < 0) {
        Py_DECREF(&mpx_LayoutType);
        Py_DECREF(m);
        return NULL;
    }
    if (mpx_init_boundary(m) < 0 || mpx_init_layout(m) < 0 || mpx_init_moves(m) < 0 || mpx_init_teams(m) < 0 ||
        add_part(m, "plan", "Packing planner bindings (use maskpack.plan).", mpx_init_plan) < 0 ||
        add_part(m, "gdn", "Gated DeltaNet bindings (use maskpack.gdn).", mpx_init_gdn) < 0 ||
        add_part(m, "attention", "Fused CPU attention over a layout (use maskpack.attention).", mpx_init_attention) <
            0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
