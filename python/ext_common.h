/*
 * ext_common.h: what the C files of the one extension module maskpack._maskpack share.
 *
 * The module is built from several files, one per concern (listed in _maskpack.c, its entry point; this
 * header's definitions are ext_common.c). They share one Layout handle type, so a layout crosses between
 * them as that Python object, checked by type (never as an integer address); one shape for every other
 * handle (one extension type per kind: team, relayout plan, kernel ops; the team type defined once); one
 * path from maskpack_error to maskpack.Error; one reader of tensor arguments (the torch tensors and numpy
 * arrays themselves: no descriptors cross); and one reader of the rule tuple.
 */
#ifndef MASKPACK_EXT_COMMON_H
#define MASKPACK_EXT_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "maskpack.h"

/* Py_NewRef appeared in 3.10; the package supports 3.9. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *mpx_newref(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#define Py_NewRef(o) mpx_newref((PyObject *)(o))
#endif

/* ---- the Layout handle ---------------------------------------------------------------------- */

/* An immutable maskpack_layout owned by a Python object (freed in dealloc). */
typedef struct {
    PyObject_HEAD maskpack_layout *layout;
} mpx_LayoutObject;

extern PyTypeObject mpx_LayoutType;

/* (freshly built layout) -> new handle owning it; on failure the layout is freed and NULL returned. */
PyObject *mpx_wrap_layout(maskpack_layout *L);

/* (handle object) -> its layout in *L: 0, or -1 with a TypeError when obj is not a Layout handle. */
int mpx_parse_layout(PyObject *obj, const maskpack_layout **L);

/* (handle object known to be a Layout handle) -> its layout. */
static inline const maskpack_layout *mpx_layout(PyObject *obj) { return ((mpx_LayoutObject *)obj)->layout; }

/* ---- the other handles: one extension type per kind -------------------------------------------- */

/* A C object owned by a Python object of its kind's type (freed by the type's dealloc); host: what a
 * team hosted by an OpenMP pool needs (PyMem_RawFree'd with it; NULL otherwise). No type has tp_new:
 * handles are only made by the module's constructors. */
typedef struct {
    PyObject_HEAD void *ptr;
    void *host;
} mpx_HandleObject;

#define MPX_HANDLE_TYPE(var, name, doc, dealloc)                                                                       \
    PyTypeObject var = {                                                                                               \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "maskpack._maskpack." name,                                           \
        .tp_basicsize = sizeof(mpx_HandleObject),                                                                      \
        .tp_itemsize = 0,                                                                                              \
        .tp_dealloc = (destructor)(dealloc),                                                                           \
        .tp_flags = Py_TPFLAGS_DEFAULT,                                                                                \
        .tp_doc = doc,                                                                                                 \
    }

/* (type, pointer) -> a new handle owning ptr; NULL with an exception set (ptr not freed: the caller's). */
PyObject *mpx_new_handle(PyTypeObject *type, void *ptr, void *host);

/* (object, its expected type, the argument's name) -> the pointer it owns, or NULL with a TypeError
 * "name: expected a <type name>, found <type>". */
void *mpx_handle_ptr(PyObject *obj, PyTypeObject *type, const char *name);

/* The worker team (_teams.c): the one type every binding that runs on a team takes. */
extern PyTypeObject mpx_TeamType;

/* (team handle or None) -> *team (NULL for None: the calling thread alone): 0, or -1 with a TypeError. */
int mpx_parse_team(PyObject *obj, maskpack_workers **team);

/* ---- errors ---------------------------------------------------------------------------------- */

/* (exception type, its subclass for refused tensor arguments or NULL) -> the types raised from now on
 * (maskpack.Error and its argument subclass, also a TypeError: set by the package). */
void mpx_set_error_type(PyObject *type, PyObject *argument_type);

/* (status, error or NULL) -> NULL with maskpack.Error(message, status_name, code, argument, index) set. */
PyObject *mpx_raise_status(maskpack_status status, const maskpack_error *err);

/* ---- integers -------------------------------------------------------------------------------- */

/* item i of argument `arg` -> *out; a value past int64 is maskpack.Error (OVERFLOW, naming the
 * argument and the index) instead of Python's bare "int too big to convert". Returns 0 or -1. */
int mpx_item_i64(PyObject *item, const char *arg, Py_ssize_t i, int64_t *out);

/* (n int64 values) -> a new list of Python ints, or NULL. */
PyObject *mpx_i64_list(const int64_t *v, int64_t n);

/* ---- tensors --------------------------------------------------------------------------------- */

/* (sequence of at most cap ints) -> out[0..*n_out): 0, or -1 with an exception set. */
int mpx_parse_i64_seq(PyObject *obj, const char *name, int64_t *out, Py_ssize_t cap, Py_ssize_t *n_out);


/* (torch.Tensor, torch.utils.dlpack.to_dlpack) -> 0, or -1 with a TypeError: lets the reader below
 * take torch tensors (the module never imports torch itself). */
int mpx_register_torch(PyObject *tensor_type, PyObject *to_dlpack);

/* The one reader of a tensor argument, and the package's one gate for them: (a torch CPU strided tensor,
 * read through DLPack; a numpy array or other native-endian buffer, through the buffer protocol; or None)
 * -> *t, *present = 0 for None. The caller keeps obj referenced for as long as it uses t. Anything else,
 * another device, a dtype maskpack lacks or a lazily negated torch view: one refusal per failure, a
 * maskpack.Error naming the argument (status INVALID_ARGUMENT, UNSUPPORTED or DTYPE) of the argument
 * subclass, which is also a TypeError; more than MASKPACK_MAX_DIMS dimensions: maskpack.Error (SHAPE). */
int mpx_parse_tensor(PyObject *obj, const char *name, maskpack_tensor *t, int *present);
/* As mpx_parse_tensor, for an argument the library writes: a read-only buffer (a numpy array with
 * writeable=False) is a TypeError. (The package checks its outputs before they get here; this is for
 * objects the user hands straight to the extension, as moves into a given out do.) */
int mpx_parse_out_tensor(PyObject *obj, const char *name, maskpack_tensor *t, int *present);
/* As mpx_parse_tensor for an argument that must be given: None is a TypeError naming it. */
int mpx_parse_given_tensor(PyObject *obj, const char *name, maskpack_tensor *t);
/* As mpx_parse_out_tensor for an output that must be given. */
int mpx_parse_given_out_tensor(PyObject *obj, const char *name, maskpack_tensor *t);
/* As mpx_parse_tensor for the kernels, which take torch tensors only (anything else: INVALID_ARGUMENT). */
int mpx_parse_torch_tensor(PyObject *obj, const char *name, maskpack_tensor *t, int *present);

/* ---- the rule -------------------------------------------------------------------------------- */

/* The rule crosses as (causal, alignment, window_left, window_right, spans | None, prefix | None)
 * with spans a sequence of (segment, start, end). Arrays live in the buffer until mpx_rule_buf_free. */
typedef struct {
    maskpack_rule rule;
    maskpack_span *spans;
    int64_t *prefix;
} mpx_rule_buf;

/* (rule tuple or None = maskpack_rule_default) -> rb: 0, or -1 with an exception set (rb freed). */
int mpx_parse_rule(PyObject *obj, mpx_rule_buf *rb);
void mpx_rule_buf_free(mpx_rule_buf *rb);

/* ---- the parts of the module ----------------------------------------------------------------- */

/* Each kernel/planner file adds its functions (and types) to a submodule of maskpack._maskpack:
 * (submodule) -> 0, or -1 with an exception set. */
/* ---- a communicator over a Python object ------------------------------------------------------
 * The library's CP algorithms (ring attention, sequence-parallel GDN) run with the GIL released; their
 * maskpack_comm callbacks take the GIL back and call methods of a Python object (maskpack.distributed's
 * adapter over a torch.distributed group): all_gather(send, recv), all_to_all(send, recv),
 * sendrecv_start(send | None, to, recv | None, from, tag) -> handle, wait(handle), over writable
 * memoryviews of the library's buffers. A Python exception in a callback is kept on the object as
 * `error` and the callback fails, so the C call returns MASKPACK_ERR_COMM and the binding re-raises
 * with that cause. */
typedef struct mpx_comm {
    PyObject *obj;
    int size;
} mpx_comm;

/* (object, rank, size) -> *c, a comm over the object (pc holds its state: keep it alive for the call). */
int mpx_parse_comm(PyObject *obj, int rank, int size, mpx_comm *pc, maskpack_comm *c);

/* The module's own parts (functions added to the module itself): errors, enum tables and the tensor
 * reader's registration (_boundary.c), layouts (_layout.c), relayout plans and moves (_moves.c), worker
 * teams (_teams.c). */
int mpx_init_boundary(PyObject *m);
int mpx_init_layout(PyObject *m);
int mpx_init_moves(PyObject *m);
int mpx_init_teams(PyObject *m);

int mpx_init_plan(PyObject *sub);
int mpx_init_gdn(PyObject *sub);
int mpx_init_attention(PyObject *sub);

#endif
